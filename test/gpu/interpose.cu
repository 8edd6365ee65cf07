/* SPDX-License-Identifier: MIT */
/* interpose.cu: the real CUDA runtime (libcudart, linked shared or static: the Makefile builds
 * both) allocating, copying, setting and launching, so that scripts/check-gpu can run it under
 * the shim and see from the shim's statistics that every allocation and launch went through it.
 * The runtime reaches the driver through cuGetProcAddress_v2; with --blas, cuBLAS (whose
 * cuBLASLt asks dlsym on the libcuda handle) runs one SGEMM too.
 *
 * Prints PASS/FAIL lines for its own results, then "issued: allocations A launches L" (what it
 * asked for; the shim must count at least that many). Exit 0 when every result is right, 1 when
 * one is wrong, 3 on a CUDA error, 77 without a device. */
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.cuh"

#ifdef GK_WITH_CUBLAS
#include <cublas_v2.h>
#endif

static const char *const prog = "interpose";

enum { NBUF = 6, WORDS = 1 << 20 };

int main(int argc, char **argv) {
    int blas = argc > 1 && strcmp(argv[1], "--blas") == 0;
    if (gk_no_device(prog))
        return GK_SKIP;
    printf("shim: %s\n", dlsym(RTLD_DEFAULT, "ooc_mark_iteration") ? "loaded" : "not loaded");
    unsigned allocs = 0, launches = 0;
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    uint32_t *buf[NBUF + 1];
    for (int k = 0; k < NBUF; k++, allocs++)
        CK(cudaMalloc(&buf[k], WORDS * sizeof(uint32_t)));
    CK(cudaMallocAsync(&buf[NBUF], WORDS * sizeof(uint32_t), s));
    allocs++;
    unsigned long long *sums;
    CK(cudaMalloc(&sums, (NBUF + 1) * sizeof *sums));
    allocs++;
    CK(cudaMemsetAsync(sums, 0, (NBUF + 1) * sizeof *sums, s));
    for (int k = 0; k <= NBUF; k++, launches++)
        gk_fill<<<256, 256, 0, s>>>(buf[k], WORDS, 100U + (uint32_t)k);
    CK(cudaGetLastError());
    /* buf[1] := buf[0] (device to device); buf[2]'s words := 0x5a5a5a5a (a set) */
    CK(cudaMemcpyAsync(buf[1], buf[0], WORDS * sizeof(uint32_t), cudaMemcpyDeviceToDevice, s));
    CK(cudaMemsetAsync(buf[2], 0x5a, WORDS * sizeof(uint32_t), s));
    for (int k = 0; k <= NBUF; k++, launches++)
        gk_sum<<<128, 256, 0, s>>>(buf[k], WORDS, &sums[k]);
    CK(cudaGetLastError());
    unsigned long long got[NBUF + 1];
    CK(cudaMemcpyAsync(got, sums, sizeof got, cudaMemcpyDeviceToHost, s));
    CK(cudaStreamSynchronize(s));
    int ok = 1;
    for (int k = 0; k <= NBUF; k++) {
        uint64_t want;
        if (k == 1) {
            want = gk_expected_sum(WORDS, 100U);
        } else if (k == 2) {
            want = 0;
            for (uint64_t i = 0; i < WORDS; i++)
                want += gk_term(i, 0x5a5a5a5aU);
        } else {
            want = gk_expected_sum(WORDS, 100U + (uint32_t)k);
        }
        if (got[k] != want) {
            char d[96];
            snprintf(d, sizeof d, "buffer %d: sum %016llx, expected %016llx", k, got[k],
                     (unsigned long long)want);
            gk_report(prog, 0, "kernels, copy and set give the expected bytes", d);
            ok = 0;
        }
    }
    if (ok)
        gk_report(prog, 1, "kernels, copy and set give the expected bytes", NULL);
#ifdef GK_WITH_CUBLAS
    if (blas) {
        enum { N = 256 };
        float *a, *c;
        CK(cudaMalloc(&a, N * N * sizeof(float)));
        CK(cudaMalloc(&c, N * N * sizeof(float)));
        allocs += 2;
        float *h = (float *)malloc(N * N * sizeof(float));
        for (int i = 0; i < N * N; i++)
            h[i] = (float)(i % 7) - 3.0f;
        CK(cudaMemcpy(a, h, N * N * sizeof(float), cudaMemcpyHostToDevice));
        cublasHandle_t hb;
        if (cublasCreate(&hb) != CUBLAS_STATUS_SUCCESS) {
            printf("ERROR %s: cublasCreate failed\n", prog);
            return 3;
        }
        cublasSetStream(hb, s);
        const float one = 1.0f, zero = 0.0f;
        cublasStatus_t st =
            cublasSgemm(hb, CUBLAS_OP_N, CUBLAS_OP_T, N, N, N, &one, a, N, a, N, &zero, c, N);
        launches++;
        CK(cudaStreamSynchronize(s));
        float *hc = (float *)malloc(N * N * sizeof(float));
        CK(cudaMemcpy(hc, c, N * N * sizeof(float), cudaMemcpyDeviceToHost));
        /* c = a a^T: small integers, exact in float. */
        int bad = st != CUBLAS_STATUS_SUCCESS;
        for (int i = 0; i < N && !bad; i += 17)
            for (int j = 0; j < N && !bad; j += 13) {
                double r = 0;
                for (int k = 0; k < N; k++)
                    r += (double)h[k * N + i] * h[k * N + j];
                bad = hc[j * N + i] != (float)r;
            }
        gk_report(prog, !bad, "cuBLAS SGEMM gives the exact product", NULL);
        cublasDestroy(hb);
        free(h);
        free(hc);
        CK(cudaFree(a));
        CK(cudaFree(c));
    }
#else
    if (blas)
        printf("SKIP %s: built without cuBLAS (cublas_v2.h was not found)\n", prog);
#endif
    for (int k = 0; k < NBUF; k++)
        CK(cudaFree(buf[k]));
    CK(cudaFreeAsync(buf[NBUF], s));
    CK(cudaFree(sums));
    CK(cudaStreamSynchronize(s));
    CK(cudaStreamDestroy(s));
    printf("issued: allocations %u launches %u\n", allocs, launches);
    return gk_failures ? 1 : 0;
}
