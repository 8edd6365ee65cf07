/* SPDX-License-Identifier: MIT */
/* tmap.cu: where a TMA descriptor (CUtensorMap, 128 bytes) keeps its global address, on the real
 * driver (scripts/gpu-first-contact, probe tensormap). The shim finds a kernel's buffers by
 * looking up every aligned 8-byte word of its parameters; a descriptor passed by value is found
 * that way only if the address sits in it as a plain word, which cuda.h does not promise.
 *
 * Part 1, a known pointer: cuTensorMapEncodeTiled for a 2-D float tensor at address P, again at
 * P + 4096, and cuTensorMapReplaceAddress of the first to P + 4096. Prints
 *   tensormap: plain-word K|none shifted-word S|none changed-words LIST delta-of-first D
 *              replace-equals-encode yes|no|ERROR
 * K: the index of the word equal to P; S: of the word equal to P >> 4; LIST: the words that
 * differ between the two encodes; D: the difference of the first of them (4096 for a plain word).
 *
 * Part 2 (built with cuBLAS): a 4096^3 bf16 GEMM through cuBLAS, the phase "cublas-gemm-bf16"
 * for the spy (libgpuspy.so), which reports the descriptors cuBLAS encodes and the 128-byte
 * parameters its kernels receive. One element of the result is checked exactly.
 *
 * Exit 0 when both parts ran, 1 when a check failed, 3 on a CUDA error, 77 without a device. */
#include <cuda.h>
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

#include "gk.h"

#ifdef GK_WITH_CUBLAS
#include <cublas_v2.h>
#include <cuda_bf16.h>
#endif

static const char *const prog = "tmap";

static CUresult encode(CUtensorMap *m, void *addr) {
    const cuuint64_t dim[2] = {1024, 1024};
    const cuuint64_t stride[1] = {1024 * sizeof(float)};
    const cuuint32_t box[2] = {64, 64};
    const cuuint32_t es[2] = {1, 1};
    return cuTensorMapEncodeTiled(m, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, addr, dim, stride, box, es,
                                  CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                                  CU_TENSOR_MAP_L2_PROMOTION_NONE,
                                  CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
}

static int known_pointer(void) {
    char *p;
    CK(cudaMalloc(&p, 16 << 20));
    CUtensorMap m1, m2, m3;
    memset(&m1, 0, sizeof m1);
    memset(&m2, 0, sizeof m2);
    CUresult r1 = encode(&m1, p), r2 = encode(&m2, p + 4096);
    if (r1 != CUDA_SUCCESS || r2 != CUDA_SUCCESS) {
        const char *n = "?";
        cuGetErrorName(r1 != CUDA_SUCCESS ? r1 : r2, &n);
        printf("ERROR %s: cuTensorMapEncodeTiled: %s\n", prog, n);
        return 3;
    }
    uint64_t w1[16], w2[16];
    memcpy(w1, &m1, sizeof w1);
    memcpy(w2, &m2, sizeof w2);
    const uint64_t a = (uint64_t)(uintptr_t)p;
    int plain = -1, shifted = -1;
    for (int k = 0; k < 16; k++) {
        if (plain < 0 && w1[k] == a)
            plain = k;
        if (shifted < 0 && w1[k] == a >> 4)
            shifted = k;
    }
    char changed[128] = "";
    long long delta = 0;
    int first = -1;
    for (int k = 0; k < 16; k++)
        if (w1[k] != w2[k]) {
            snprintf(changed + strlen(changed), sizeof changed - strlen(changed), "%s%d",
                     first < 0 ? "" : ",", k);
            if (first < 0) {
                first = k;
                delta = (long long)(w2[k] - w1[k]);
            }
        }
    m3 = m1;
    CUresult rr = cuTensorMapReplaceAddress(&m3, p + 4096);
    const char *rep = rr != CUDA_SUCCESS                 ? "ERROR"
                      : memcmp(&m3, &m2, sizeof m3) == 0 ? "yes"
                                                         : "no";
    char ps[16] = "none", ss[16] = "none";
    if (plain >= 0)
        snprintf(ps, sizeof ps, "%d", plain);
    if (shifted >= 0)
        snprintf(ss, sizeof ss, "%d", shifted);
    printf("tensormap: plain-word %s shifted-word %s changed-words %s delta-of-first %lld "
           "replace-equals-encode %s\n",
           ps, ss, changed[0] ? changed : "none", delta, rep);
    printf("descriptor words at P:");
    for (int k = 0; k < 16; k++)
        printf(" %016llx", (unsigned long long)w1[k]);
    printf("\nP = %016llx\n", (unsigned long long)a);
    fflush(stdout);
    CK(cudaFree(p));
    return 0;
}

int main(void) {
    if (gk_no_device(prog))
        return GK_SKIP;
    CK(cudaFree(0));
    void (*phase_fn)(const char *) = NULL;
    void *sp = dlsym(RTLD_DEFAULT, "gpuspy_phase");
    memcpy(&phase_fn, &sp, sizeof sp);
    printf("spy: %s\n", phase_fn ? "loaded" : "not loaded");
    if (phase_fn)
        phase_fn("known-pointer");
    int rc = known_pointer();
    if (rc)
        return rc;
#ifdef GK_WITH_CUBLAS
    if (phase_fn)
        phase_fn("cublas-gemm-bf16");
    enum { N = 4096 };
    __nv_bfloat16 *a, *c;
    CK(cudaMalloc(&a, (size_t)N * N * sizeof *a));
    CK(cudaMalloc(&c, (size_t)N * N * sizeof *c));
    __nv_bfloat16 *h = (__nv_bfloat16 *)malloc((size_t)N * N * sizeof *h);
    float col0 = 0;
    for (size_t i = 0; i < (size_t)N * N; i++) {
        float v = (float)((i * 7) % 3) - 1.0f; /* -1, 0, 1: exact products and sums */
        h[i] = __float2bfloat16(v);
        if (i < N) /* a's first column (column-major) */
            col0 += v * v;
    }
    CK(cudaMemcpy(a, h, (size_t)N * N * sizeof *a, cudaMemcpyHostToDevice));
    cublasHandle_t hb;
    if (cublasCreate(&hb) != CUBLAS_STATUS_SUCCESS) {
        printf("ERROR %s: cublasCreate failed\n", prog);
        return 3;
    }
    const float one = 1.0f, zero = 0.0f;
    /* c = a^T a (column-major): c[0] is the dot product of a's first column with itself. */
    cublasStatus_t st =
        cublasGemmEx(hb, CUBLAS_OP_T, CUBLAS_OP_N, N, N, N, &one, a, CUDA_R_16BF, N, a, CUDA_R_16BF,
                     N, &zero, c, CUDA_R_16BF, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    CK(cudaDeviceSynchronize());
    __nv_bfloat16 c0;
    CK(cudaMemcpy(&c0, c, sizeof c0, cudaMemcpyDeviceToHost));
    /* col0 (about 2730) is exact in the fp32 accumulator; the bf16 output rounds it, so the
     * expected value is rounded to bf16 too. */
    float got = __bfloat162float(c0), want = __bfloat162float(__float2bfloat16(col0));
    char d[96];
    snprintf(d, sizeof d, "c[0] %g, expected %g, status %d", got, want, (int)st);
    gk_report(prog, st == CUBLAS_STATUS_SUCCESS && got == want,
              "cuBLAS bf16 GEMM 4096^3 ran (one element checked)", d);
    if (phase_fn)
        phase_fn("end");
    cublasDestroy(hb);
    free(h);
    CK(cudaFree(a));
    CK(cudaFree(c));
#else
    printf("SKIP %s: built without cuBLAS: no bf16 GEMM\n", prog);
#endif
    return gk_failures ? 1 : 0;
}
