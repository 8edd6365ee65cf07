/* SPDX-License-Identifier: MIT */
/* paraminfo.cu: kernels launched the ways a program's own code launches them, for the spy
 * (libgpuspy.so, LD_PRELOAD) to report which handle kinds reach cuLaunchKernel(Ex) and which
 * parameter-layout lookups answer for them (scripts/gpu-first-contact, probe paraminfo). Phases,
 * named to the spy with gpuspy_phase when it is loaded:
 *
 *   cudart-global      our __global__ kernels launched with <<<>>> (cudaLaunchKernel);
 *   cudart-launch-ex   one launched with cudaLaunchKernelEx (cuLaunchKernelEx underneath);
 *   cublas-sgemm       cuBLAS's SGEMM (when built with cuBLAS; cuBLASLt asks dlsym itself).
 *
 * Checks the kernels' results too (bit-exact integer sums), so that a launch the spy watched is
 * known to have run right. Prints PASS/FAIL lines and "spy: loaded|not loaded". Exit 0 when
 * every result is right, 1 when one is wrong, 3 on a CUDA error, 77 without a device. */
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.cuh"

#ifdef GK_WITH_CUBLAS
#include <cublas_v2.h>
#endif

static const char *const prog = "paraminfo";

static void (*phase_fn)(const char *);

static void phase(const char *name) {
    if (phase_fn)
        phase_fn(name);
    printf("phase: %s\n", name);
    fflush(stdout);
}

enum { WORDS = 1 << 20 };

int main(void) {
    if (gk_no_device(prog))
        return GK_SKIP;
    void *p = dlsym(RTLD_DEFAULT, "gpuspy_phase");
    memcpy(&phase_fn, &p, sizeof p);
    printf("spy: %s\n", phase_fn ? "loaded" : "not loaded");

    uint32_t *buf;
    unsigned long long *sum;
    CK(cudaMalloc(&buf, WORDS * sizeof(uint32_t)));
    CK(cudaMalloc(&sum, 2 * sizeof *sum));
    CK(cudaMemset(sum, 0, 2 * sizeof *sum));

    phase("cudart-global");
    gk_fill<<<256, 256>>>(buf, WORDS, 5);
    gk_sum<<<128, 256>>>(buf, WORDS, &sum[0]);
    CK(cudaGetLastError());

    phase("cudart-launch-ex");
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(128);
    cfg.blockDim = dim3(256);
    CK(cudaLaunchKernelEx(&cfg, gk_sum, (const uint32_t *)buf, (unsigned long long)WORDS, &sum[1]));
    CK(cudaDeviceSynchronize());
    unsigned long long got[2];
    CK(cudaMemcpy(got, sum, sizeof got, cudaMemcpyDeviceToHost));
    const uint64_t want = gk_expected_sum(WORDS, 5);
    gk_report(prog, got[0] == want && got[1] == want,
              "kernels launched with <<<>>> and cudaLaunchKernelEx give the expected sums", NULL);

#ifdef GK_WITH_CUBLAS
    phase("cublas-sgemm");
    enum { N = 512 };
    float *a, *c;
    CK(cudaMalloc(&a, N * N * sizeof(float)));
    CK(cudaMalloc(&c, N * N * sizeof(float)));
    float *h = (float *)malloc(N * N * sizeof(float));
    for (int i = 0; i < N * N; i++)
        h[i] = (float)(i % 5) - 2.0f;
    CK(cudaMemcpy(a, h, N * N * sizeof(float), cudaMemcpyHostToDevice));
    cublasHandle_t hb;
    if (cublasCreate(&hb) != CUBLAS_STATUS_SUCCESS) {
        printf("ERROR %s: cublasCreate failed\n", prog);
        return 3;
    }
    const float one = 1.0f, zero = 0.0f;
    cublasStatus_t st =
        cublasSgemm(hb, CUBLAS_OP_N, CUBLAS_OP_T, N, N, N, &one, a, N, a, N, &zero, c, N);
    CK(cudaDeviceSynchronize());
    float c00 = 0;
    CK(cudaMemcpy(&c00, c, sizeof c00, cudaMemcpyDeviceToHost));
    double r = 0;
    for (int k = 0; k < N; k++)
        r += (double)h[k * N] * h[k * N];
    gk_report(prog, st == CUBLAS_STATUS_SUCCESS && c00 == (float)r,
              "cuBLAS SGEMM ran (one element checked exactly)", NULL);
    cublasDestroy(hb);
    free(h);
    CK(cudaFree(a));
    CK(cudaFree(c));
#else
    printf("SKIP %s: built without cuBLAS (cublas_v2.h was not found)\n", prog);
#endif
    phase("end");
    CK(cudaFree(buf));
    CK(cudaFree(sum));
    return gk_failures ? 1 : 0;
}
