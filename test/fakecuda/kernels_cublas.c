/* SPDX-License-Identifier: MIT */
/* kernels_cublas.c: the GEMM kernels (module "cublas") that the simulated libcublas.so.13
 * launches.
 *
 * Column-major float GEMMs, one output element at a time in a fixed order (batch member, column,
 * row), each a float dot product over k in order, so that results are bit-identical across runs
 * and schedulers and equal to module nn's gemm_f32 for alpha 1 and beta 0 (fc_cublas.h). The
 * pointer-array kernel reads its operands' addresses from device memory through
 * fakecuda_access, like any other access. Parameter layouts are in fc_cublas.h; cublas.c is the
 * only launcher. The kernels keep no state. */
#include "fc_ktab.h"
#include "fc_cublas.h"

#include <stdint.h>

#define P_PTR  sizeof(CUdeviceptr)
#define P_GEOM sizeof(fc_gemm_geom_t)

/* Elements spanned by a column-major rows x cols matrix with leading dimension ld. */
static uint64_t span(int rows, int cols, int ld) {
    return rows <= 0 || cols <= 0 ? 0 : (uint64_t)(cols - 1) * (uint64_t)ld + (uint64_t)rows;
}

static const float *in_view(fakecuda_launch_t *l, CUdeviceptr p, uint64_t n) {
    return n == 0 ? (const float *)"" : fakecuda_access(l, p, (size_t)n * sizeof(float), 0);
}

/* One batch member: C = alpha * op(A) * op(B) + beta * C. Returns -1 after a refused access. */
static int gemm_one(fakecuda_launch_t *l, const fc_gemm_geom_t *g, CUdeviceptr ap, CUdeviceptr bp,
                    CUdeviceptr cp) {
    const float *A = in_view(l, ap, g->ta ? span(g->k, g->m, g->lda) : span(g->m, g->k, g->lda));
    const float *B = in_view(l, bp, g->tb ? span(g->n, g->k, g->ldb) : span(g->k, g->n, g->ldb));
    float *C = fakecuda_access(l, cp, (size_t)span(g->m, g->n, g->ldc) * sizeof(float), 1);
    if (!A || !B || !C)
        return -1;
    size_t lda = (size_t)g->lda, ldb = (size_t)g->ldb, ldc = (size_t)g->ldc;
    for (int j = 0; j < g->n; j++) {
        for (int i = 0; i < g->m; i++) {
            float acc = 0.0f;
            for (int p = 0; p < g->k; p++) {
                float a = g->ta ? A[(size_t)p + (size_t)i * lda] : A[(size_t)i + (size_t)p * lda];
                float b = g->tb ? B[(size_t)j + (size_t)p * ldb] : B[(size_t)p + (size_t)j * ldb];
                acc += a * b;
            }
            float *c = &C[(size_t)i + (size_t)j * ldc];
            *c = g->beta == 0.0f ? g->alpha * acc : g->alpha * acc + g->beta * *c;
        }
    }
    return 0;
}

static void gemm_work(fakecuda_launch_t *l, const fc_gemm_geom_t *g) {
    double m = g->m, n = g->n, k = g->k, b = g->batch;
    fakecuda_work(l, 2.0 * m * n * k * b, 4.0 * b * (m * k + k * n + 2.0 * m * n));
}

/* gemm_f32(A, B, C, geom): the plain and strided-batched GEMMs; member i's operands are at
 * A + i * stride_a (floats), and likewise for B and C. */
static int k_gemm(fakecuda_launch_t *l) {
    CUdeviceptr a = FAKECUDA_ARG(l, 0, CUdeviceptr), b = FAKECUDA_ARG(l, 1, CUdeviceptr);
    CUdeviceptr c = FAKECUDA_ARG(l, 2, CUdeviceptr);
    fc_gemm_geom_t g = FAKECUDA_ARG(l, 3, fc_gemm_geom_t);
    for (int i = 0; i < g.batch; i++) {
        uint64_t bi = (uint64_t)i;
        if (gemm_one(l, &g, a + bi * (uint64_t)g.stride_a * sizeof(float),
                     b + bi * (uint64_t)g.stride_b * sizeof(float),
                     c + bi * (uint64_t)g.stride_c * sizeof(float)))
            return -1;
    }
    gemm_work(l, &g);
    return 0;
}

/* gemm_batched_f32(Aarray, Barray, Carray, geom): member i's operands are the device addresses
 * Aarray[i], Barray[i], Carray[i], read from device memory. An array or an operand that is not
 * device memory faults the kernel. */
static int k_gemm_batched(fakecuda_launch_t *l) {
    fc_gemm_geom_t g = FAKECUDA_ARG(l, 3, fc_gemm_geom_t);
    size_t bytes = (size_t)g.batch * sizeof(CUdeviceptr);
    const CUdeviceptr *arr[3];
    for (int t = 0; t < 3; t++)
        if (!(arr[t] = fakecuda_access(l, FAKECUDA_ARG(l, t, CUdeviceptr), bytes, 0)))
            return -1;
    for (int i = 0; i < g.batch; i++)
        if (gemm_one(l, &g, arr[0][i], arr[1][i], arr[2][i]))
            return -1;
    gemm_work(l, &g);
    return 0;
}

static const fakecuda_kernel_t cublas_kernels[] = {
    {"cublas", "gemm_f32", 4, {P_PTR, P_PTR, P_PTR, P_GEOM}, k_gemm},
    {"cublas", "gemm_batched_f32", 4, {P_PTR, P_PTR, P_PTR, P_GEOM}, k_gemm_batched},
};
FC_KERNEL_TABLE(cublas_kernels);
