/* SPDX-License-Identifier: MIT */
/* dnnlink.c: a program linked with -lcudnn (and -lcuda), as PyTorch's and XLA's binaries are:
 * its cuDNN calls go through the dynamic linker, not dlsym, so under LD_PRELOAD they reach the
 * shim's exported functions (shim/library.c), which must find the real ones in the loaded
 * libcudnn.so.9.
 *
 * Each of --iters iterations (default 6) runs two 3x3 convolution forwards of a 4x8x16x16 input
 * with 8 filters: into y (beta 0), and accumulated into acc (beta 1). Inputs are small integers
 * in float, so every result is exact. Output: "dnn calls: N", "checksum: H" (FNV-1a 64 of acc's
 * bytes). Exit status 0, or 2 when a call failed ("error: <call>: <status or name> (<code>)"). */
#include <cuda.h>
#include <cudnn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "userprog.h"

#define N 4
#define C 8
#define H 16
#define K 8

static void dnn_check(cudnnStatus_t st, const char *call) {
    if (st == CUDNN_STATUS_SUCCESS)
        return;
    fprintf(stderr, "error: %s: %s (%d)\n", call, cudnnGetErrorString(st), (int)st);
    exit(2);
}
#define DNN(x) dnn_check((x), #x)

int main(int argc, char **argv) {
    int iters = 6;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--iters") == 0 && i + 1 < argc) {
            iters = atoi(argv[++i]);
        } else {
            fprintf(stderr, "usage: dnnlink [--iters N]\n");
            return 2;
        }
    }
    CUdevice dev;
    CUcontext ctx;
    CUstream s;
    UP_CHECK(cuInit(0));
    UP_CHECK(cuDeviceGet(&dev, 0));
    UP_CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    UP_CHECK(cuCtxSetCurrent(ctx));
    UP_CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    cudnnHandle_t h;
    DNN(cudnnCreate(&h));
    DNN(cudnnSetStream(h, (cudaStream_t)s));
    cudnnTensorDescriptor_t xd, yd;
    cudnnFilterDescriptor_t wd;
    cudnnConvolutionDescriptor_t cd;
    DNN(cudnnCreateTensorDescriptor(&xd));
    DNN(cudnnCreateTensorDescriptor(&yd));
    DNN(cudnnCreateFilterDescriptor(&wd));
    DNN(cudnnCreateConvolutionDescriptor(&cd));
    DNN(cudnnSetTensor4dDescriptor(xd, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, N, C, H, H));
    DNN(cudnnSetFilter4dDescriptor(wd, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, K, C, 3, 3));
    DNN(cudnnSetConvolution2dDescriptor(cd, 1, 1, 1, 1, 1, 1, CUDNN_CROSS_CORRELATION,
                                        CUDNN_DATA_FLOAT));
    DNN(cudnnSetTensor4dDescriptor(yd, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, N, K, H, H));
    size_t nx = (size_t)N * C * H * H, nw = (size_t)K * C * 9, ny = (size_t)N * K * H * H;
    float *hx = malloc(nx * 4), *hw = malloc(nw * 4), *hy = malloc(ny * 4);
    if (!hx || !hw || !hy)
        return 2;
    for (size_t i = 0; i < nx; i++)
        hx[i] = (float)((i * 7) % 5) - 2.0f;
    for (size_t i = 0; i < nw; i++)
        hw[i] = (float)((i * 3) % 3) - 1.0f;
    CUdeviceptr x, w, y, acc;
    UP_CHECK(cuMemAlloc(&x, nx * 4));
    UP_CHECK(cuMemAlloc(&w, nw * 4));
    UP_CHECK(cuMemAlloc(&y, ny * 4));
    UP_CHECK(cuMemAlloc(&acc, ny * 4));
    UP_CHECK(cuMemcpyHtoD(x, hx, nx * 4));
    UP_CHECK(cuMemcpyHtoD(w, hw, nw * 4));
    UP_CHECK(cuMemsetD32(acc, 0, ny));
    /* The set runs on the legacy stream, asynchronously to the host, and s is a non-blocking
     * stream, which does not wait for the legacy stream's work: without this the first
     * accumulation into acc races the set (a wrong checksum about one run in twenty). */
    UP_CHECK(cuCtxSynchronize());
    float one = 1.0f, zero = 0.0f;
    int calls = 0;
    for (int it = 0; it < iters; it++) {
        DNN(cudnnConvolutionForward(h, &one, xd, (void *)x, wd, (void *)w, cd,
                                    CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, NULL, 0, &zero, yd,
                                    (void *)y));
        DNN(cudnnConvolutionForward(h, &one, xd, (void *)x, wd, (void *)w, cd,
                                    CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, NULL, 0, &one, yd,
                                    (void *)acc));
        calls += 2;
    }
    UP_CHECK(cuStreamSynchronize(s));
    UP_CHECK(cuMemcpyDtoH(hy, acc, ny * 4));
    uint64_t hsh = 1469598103934665603ull;
    const unsigned char *b = (const unsigned char *)hy;
    for (size_t i = 0; i < ny * 4; i++)
        hsh = (hsh ^ b[i]) * 1099511628211ull;
    printf("dnn calls: %d\nchecksum: %016llx\n", calls, (unsigned long long)hsh);
    DNN(cudnnDestroyTensorDescriptor(xd));
    DNN(cudnnDestroyTensorDescriptor(yd));
    DNN(cudnnDestroyFilterDescriptor(wd));
    DNN(cudnnDestroyConvolutionDescriptor(cd));
    DNN(cudnnDestroy(h));
    free(hx);
    free(hw);
    free(hy);
    return 0;
}
