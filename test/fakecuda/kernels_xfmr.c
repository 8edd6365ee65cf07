/* SPDX-License-Identifier: MIT */
/* kernels_xfmr.c: the kernels of module "xfmr" that the framework-like workload (xfmr) launches
 * the way Hopper frameworks do.
 *
 * tma_gemm reaches its operands only through three TMA descriptors taken by value (CUtensorMap,
 * __grid_constant__, 64-byte aligned): no launch parameter is a device address. grouped_gemm
 * reads a table of problems (pointers and shapes) from device memory, as torch._grouped_mm and
 * cuBLAS batched GEMMs do: no launch-time scan can see those pointers. Both compute each product
 * with the same loops in the same order (matmul below), so a problem gives the same bits either
 * way. softmax_rows and softmax_rows_bwd are the attention's row softmax and its gradient. Every
 * kernel reaches device memory through fakecuda_access, returns -1 when it is refused, and is
 * deterministic (fixed loop order, float arithmetic). */
#include "fc_ktab.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#define P_PTR  sizeof(CUdeviceptr)
#define P_INT  sizeof(int)
#define P_F32  sizeof(float)
#define P_TMAP FAKECUDA_PARAM_ALIGNED(128, 64)

/* C = alpha*op(A)*op(B) + beta*C, row-major, op(A) m x k, op(B) k x n (beta == 0: C not read). */
static void matmul(int ta, int tb, int m, int n, int k, float alpha, const float *A, int lda,
                   const float *B, int ldb, float beta, float *C, int ldc) {
    for (int i = 0; i < m; i++) {
        float *c = C + (size_t)i * (size_t)ldc;
        for (int j = 0; j < n; j++) {
            float acc = 0.0f;
            for (int p = 0; p < k; p++) {
                float a = ta ? A[(size_t)p * lda + i] : A[(size_t)i * lda + p];
                float b = tb ? B[(size_t)j * ldb + p] : B[(size_t)p * ldb + j];
                acc += a * b;
            }
            c[j] = beta == 0.0f ? alpha * acc : alpha * acc + beta * c[j];
        }
    }
}

/* Host view of a 2D float32 descriptor's tensor: rows, cols and leading dimension (elements). */
static float *tmap_view(fakecuda_launch_t *l, const void *param, int write, int *rows, int *cols,
                        int *ld) {
    fakecuda_tensor_map_t t;
    if (fakecuda_tensor_map_decode(param, &t) != 0 || t.rank != 2 ||
        t.dtype != CU_TENSOR_MAP_DATA_TYPE_FLOAT32 || t.strides[1] % 4)
        return NULL;
    *cols = (int)t.dims[0];
    *rows = (int)t.dims[1];
    *ld = (int)(t.strides[1] / 4);
    return fakecuda_access(l, t.base, fakecuda_tensor_map_span(&t), write);
}

/* tma_gemm(CUtensorMap A, CUtensorMap B, CUtensorMap C, int ta, int tb, float alpha, float beta):
 * the shapes come from the descriptors (A is m x k, or k x m with ta; B k x n, or n x k with tb;
 * C m x n); mismatched shapes fault. */
static int k_tma_gemm(fakecuda_launch_t *l) {
    int ta = FAKECUDA_ARG(l, 3, int), tb = FAKECUDA_ARG(l, 4, int);
    float alpha = FAKECUDA_ARG(l, 5, float), beta = FAKECUDA_ARG(l, 6, float);
    int ar, ac, lda, br, bc, ldb, cr, cc, ldc;
    const float *A = tmap_view(l, l->params[0], 0, &ar, &ac, &lda);
    const float *B = tmap_view(l, l->params[1], 0, &br, &bc, &ldb);
    float *C = tmap_view(l, l->params[2], 1, &cr, &cc, &ldc);
    if (!A || !B || !C)
        return -1;
    int m = ta ? ac : ar, k = ta ? ar : ac, n = tb ? br : bc;
    if ((tb ? bc : br) != k || cr != m || cc != n)
        return -1;
    matmul(ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
    fakecuda_work(l, 2.0 * m * n * (double)k, 4.0 * ((double)m * k + (double)k * n + 2.0 * m * n));
    return 0;
}

/* One problem of grouped_gemm, as stored in device memory (64 bytes). */
typedef struct xf_problem {
    CUdeviceptr a, b, c;
    int32_t m, n, k, lda, ldb, ldc, ta, tb;
    float alpha, beta;
} xf_problem_t;
_Static_assert(sizeof(xf_problem_t) == 64, "xf_problem_t is the workload's table layout");

static uint64_t span(int rows, int cols, int ld) {
    return rows == 0 || cols == 0 ? 0 : ((uint64_t)(rows - 1) * (uint64_t)ld + (uint64_t)cols) * 4;
}

/* grouped_gemm(const xf_problem_t *table, int count): each problem's operands are device pointers
 * read from the table. */
static int k_grouped_gemm(fakecuda_launch_t *l) {
    CUdeviceptr tp = FAKECUDA_ARG(l, 0, CUdeviceptr);
    int count = FAKECUDA_ARG(l, 1, int);
    if (count <= 0)
        return 0;
    const xf_problem_t *t = fakecuda_access(l, tp, (size_t)count * sizeof *t, 0);
    if (!t)
        return -1;
    double flops = 0;
    for (int i = 0; i < count; i++) {
        xf_problem_t p;
        memcpy(&p, &t[i], sizeof p);
        if (p.m <= 0 || p.n <= 0 || p.k <= 0)
            return -1;
        const float *A =
            fakecuda_access(l, p.a, span(p.ta ? p.k : p.m, p.ta ? p.m : p.k, p.lda), 0);
        const float *B =
            fakecuda_access(l, p.b, span(p.tb ? p.n : p.k, p.tb ? p.k : p.n, p.ldb), 0);
        float *C = fakecuda_access(l, p.c, span(p.m, p.n, p.ldc), 1);
        if (!A || !B || !C)
            return -1;
        matmul(p.ta, p.tb, p.m, p.n, p.k, p.alpha, A, p.lda, B, p.ldb, p.beta, C, p.ldc);
        flops += 2.0 * p.m * p.n * (double)p.k;
    }
    fakecuda_work(l, flops, 0);
    return 0;
}

/* softmax_rows_f32(x, y, rows, cols, scale): y[r] = softmax(scale * x[r]) (stable: max first). */
static int k_softmax_rows(fakecuda_launch_t *l) {
    CUdeviceptr xp = FAKECUDA_ARG(l, 0, CUdeviceptr), yp = FAKECUDA_ARG(l, 1, CUdeviceptr);
    int rows = FAKECUDA_ARG(l, 2, int), cols = FAKECUDA_ARG(l, 3, int);
    float scale = FAKECUDA_ARG(l, 4, float);
    size_t n = (size_t)rows * (size_t)cols;
    const float *x = fakecuda_access(l, xp, n * 4, 0);
    float *y = fakecuda_access(l, yp, n * 4, 1);
    if (!x || !y)
        return -1;
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * cols;
        float *yr = y + (size_t)r * cols;
        float mx = scale * xr[0], sum = 0.0f;
        for (int c = 1; c < cols; c++)
            mx = fmaxf(mx, scale * xr[c]);
        for (int c = 0; c < cols; c++) {
            yr[c] = expf(scale * xr[c] - mx);
            sum += yr[c];
        }
        for (int c = 0; c < cols; c++)
            yr[c] /= sum;
    }
    fakecuda_work(l, 5.0 * (double)n, 8.0 * (double)n);
    return 0;
}

/* softmax_rows_bwd_f32(y, dy, dx, rows, cols, scale): dx = scale * y * (dy - sum(dy * y)). */
static int k_softmax_rows_bwd(fakecuda_launch_t *l) {
    CUdeviceptr yp = FAKECUDA_ARG(l, 0, CUdeviceptr), dyp = FAKECUDA_ARG(l, 1, CUdeviceptr);
    CUdeviceptr dxp = FAKECUDA_ARG(l, 2, CUdeviceptr);
    int rows = FAKECUDA_ARG(l, 3, int), cols = FAKECUDA_ARG(l, 4, int);
    float scale = FAKECUDA_ARG(l, 5, float);
    size_t n = (size_t)rows * (size_t)cols;
    const float *y = fakecuda_access(l, yp, n * 4, 0);
    const float *dy = fakecuda_access(l, dyp, n * 4, 0);
    float *dx = fakecuda_access(l, dxp, n * 4, 1);
    if (!y || !dy || !dx)
        return -1;
    for (int r = 0; r < rows; r++) {
        size_t o = (size_t)r * cols;
        float dot = 0.0f;
        for (int c = 0; c < cols; c++)
            dot += dy[o + c] * y[o + c];
        for (int c = 0; c < cols; c++)
            dx[o + c] = scale * y[o + c] * (dy[o + c] - dot);
    }
    fakecuda_work(l, 4.0 * (double)n, 12.0 * (double)n);
    return 0;
}

static const fakecuda_kernel_t xfmr_kernels[] = {
    {"xfmr", "tma_gemm", 7, {P_TMAP, P_TMAP, P_TMAP, P_INT, P_INT, P_F32, P_F32}, k_tma_gemm},
    {"xfmr", "grouped_gemm", 2, {P_PTR, P_INT}, k_grouped_gemm},
    {"xfmr", "softmax_rows_f32", 5, {P_PTR, P_PTR, P_INT, P_INT, P_F32}, k_softmax_rows},
    {"xfmr",
     "softmax_rows_bwd_f32",
     6,
     {P_PTR, P_PTR, P_PTR, P_INT, P_INT, P_F32},
     k_softmax_rows_bwd},
};
FC_KERNEL_TABLE(xfmr_kernels);
