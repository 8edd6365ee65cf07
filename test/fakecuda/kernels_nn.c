/* SPDX-License-Identifier: MIT */
/* kernels_nn.c: the neural-network kernels of module "nn" that the test workloads launch.
 *
 * Every kernel computes its whole grid as plain loops on the calling (stream worker) thread, in a
 * fixed order with float arithmetic, so that results are bit-identical across runs, schedulers
 * and jitter seeds. Grid and block dimensions are ignored: element counts come as parameters.
 * Matrices are row-major; a leading dimension is the distance in elements between two rows.
 * Each kernel obtains its device ranges through fakecuda_access before touching them, returns -1
 * when one is refused, and declares its cost with fakecuda_work. The kernels keep no state. */
#include "fc_ktab.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define P_PTR sizeof(CUdeviceptr)
#define P_INT sizeof(int)
#define P_F32 sizeof(float)
#define P_U64 sizeof(uint64_t)

/* Host view of n floats at device address p, or NULL when the access is illegal. */
static float *fview(fakecuda_launch_t *l, CUdeviceptr p, uint64_t n, int write) {
    return fakecuda_access(l, p, (size_t)n * sizeof(float), write);
}

/* A counter-based hash (splitmix64 finaliser) so that element i's value does not depend on the
 * order in which elements are produced. */
static uint64_t mix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* fill_uniform_f32(y, n, seed, scale): y[i] = scale * u, u uniform in [-1, 1) from
 * hash(seed, i). */
static int k_fill_uniform(fakecuda_launch_t *l) {
    CUdeviceptr yp = FAKECUDA_ARG(l, 0, CUdeviceptr);
    uint64_t n = FAKECUDA_ARG(l, 1, uint64_t);
    uint64_t seed = FAKECUDA_ARG(l, 2, uint64_t);
    float scale = FAKECUDA_ARG(l, 3, float);
    if (n == 0)
        return 0;
    float *y = fview(l, yp, n, 1);
    if (!y)
        return -1;
    uint64_t base = mix64(seed);
    for (uint64_t i = 0; i < n; i++) {
        uint64_t h = mix64(base ^ (i * 0xd1b54a32d192ed03ull));
        float u = (float)(h >> 40) * (1.0f / 16777216.0f); /* [0, 1) */
        y[i] = scale * (2.0f * u - 1.0f);
    }
    fakecuda_work(l, 4.0 * (double)n, 4.0 * (double)n);
    return 0;
}

/* fill_f32(y, n, value): y[i] = value. */
static int k_fill(fakecuda_launch_t *l) {
    CUdeviceptr yp = FAKECUDA_ARG(l, 0, CUdeviceptr);
    uint64_t n = FAKECUDA_ARG(l, 1, uint64_t);
    float v = FAKECUDA_ARG(l, 2, float);
    if (n == 0)
        return 0;
    float *y = fview(l, yp, n, 1);
    if (!y)
        return -1;
    for (uint64_t i = 0; i < n; i++)
        y[i] = v;
    fakecuda_work(l, 0, 4.0 * (double)n);
    return 0;
}

/* Number of elements a row-major rows x cols matrix with leading dimension ld spans. */
static uint64_t extent(int rows, int cols, int ld) {
    return rows == 0 || cols == 0 ? 0 : (uint64_t)(rows - 1) * (uint64_t)ld + (uint64_t)cols;
}

/* Four floats at once (GCC's vector extension: one SSE operation). Each lane is
 * its own IEEE multiply or add, the same as the scalar loop's for that element: the GEMMs below
 * vectorise across output elements, never across the terms of one sum, so every element is
 * computed with the same operations in the same order as the plain loops would, and the bits do
 * not change (the project compiles as ISO C: no contraction into fused multiply-adds). */
typedef float v4f __attribute__((vector_size(16)));

static v4f ld4(const float *p) {
    v4f v;
    memcpy(&v, p, sizeof v);
    return v;
}

static void st4(float *p, v4f v) {
    memcpy(p, &v, sizeof v);
}

/* s + a4[0] * b[0][j..j+3] + ... for the nt <= 4 terms, in that order, four lanes at once. */
static inline v4f add_terms(v4f s, const v4f *a4, const float *const *b, int nt, int j) {
    if (nt == 4)
        return (((s + a4[0] * ld4(b[0] + j)) + a4[1] * ld4(b[1] + j)) + a4[2] * ld4(b[2] + j)) +
               a4[3] * ld4(b[3] + j);
    for (int t = 0; t < nt; t++)
        s = s + a4[t] * ld4(b[t] + j);
    return s;
}

/* c[j] = (((c0[j] + a[0] * b[0][j]) + a[1] * b[1][j]) + ...) for the nt <= 4 terms and j < n,
 * where c0[j] is c[j] (first == 0), or beta * c[j], or 0 when beta is 0 (first == 1: the first
 * term of the sum). The same operations, in the same order, as nt passes adding one term each,
 * but C is read and written once for up to four terms: the GEMMs below are bound by those loads
 * and stores. */
static void axpy_terms(float *c, const float *a, const float *const *b, int nt, int n, int first,
                       float beta) {
    v4f z = {0}, be = z + beta, a4[4] = {z, z, z, z};
    for (int t = 0; t < nt; t++)
        a4[t] = z + a[t];
    int mode = !first ? 0 : beta == 0.0f ? 1 : 2, j = 0;
    for (; j + 4 <= n; j += 4) {
        v4f s = mode == 0 ? ld4(c + j) : mode == 1 ? z : be * ld4(c + j);
        st4(c + j, add_terms(s, a4, b, nt, j));
    }
    for (; j < n; j++) {
        float s = mode == 0 ? c[j] : mode == 1 ? 0.0f : beta * c[j];
        for (int t = 0; t < nt; t++)
            s = s + a[t] * b[t][j];
        c[j] = s;
    }
}

/* Rows of C computed together, so that B streams through the cache once per block of rows
 * rather than once per row: about 128 KiB of C. */
#define GEMM_ROWS 32

/* op(B)(p, j) = B[p][j]: each row of C accumulates rows of B scaled by op(A)(i, p), p in order
 * (the first term fused with the start value: beta * C, or 0). */
static void gemm_rows_of_b(int ta, int m, int n, int k, float alpha, const float *A, size_t lda,
                           const float *B, size_t ldb, float beta, float *C, size_t ldc) {
    int rows = n >= 4096 ? 8 : GEMM_ROWS;
    for (int i0 = 0; i0 < m; i0 += rows) {
        int i1 = i0 + rows < m ? i0 + rows : m;
        if (k == 0)
            for (int i = i0; i < i1; i++) {
                float *c = C + (size_t)i * ldc;
                for (int j = 0; j < n; j++)
                    c[j] = beta == 0.0f ? 0.0f : beta * c[j];
            }
        for (int p0 = 0; p0 < k; p0 += 4) {
            int nt = k - p0 < 4 ? k - p0 : 4;
            const float *b[4];
            for (int t = 0; t < nt; t++)
                b[t] = B + (size_t)(p0 + t) * ldb;
            for (int i = i0; i < i1; i++) {
                float a[4];
                for (int t = 0; t < nt; t++) {
                    size_t p = (size_t)(p0 + t);
                    a[t] = alpha * (ta ? A[p * lda + (size_t)i] : A[(size_t)i * lda + p]);
                }
                axpy_terms(C + (size_t)i * ldc, a, b, nt, n, p0 == 0, beta);
            }
        }
    }
}

/* The dot products of eight rows of op(A), laid out p-major (at[p][r]: rows beyond the matrix
 * are zeros), with rows j0 and j0 + 1 of B (the second only when two): sums[t][r]. Four
 * independent accumulators, each summing its terms with p in order. */
static void dots8(const float *at, int k, const float *b0, const float *b1, float sums[2][8]) {
    v4f z = {0}, s00 = z, s01 = z, s10 = z, s11 = z;
    for (int p = 0; p < k; p++) {
        v4f lo = ld4(at + 8 * (size_t)p), hi = ld4(at + 8 * (size_t)p + 4);
        s00 += lo * b0[p];
        s01 += hi * b0[p];
        s10 += lo * b1[p];
        s11 += hi * b1[p];
    }
    memcpy(&sums[0][0], &s00, sizeof s00);
    memcpy(&sums[0][4], &s01, sizeof s01);
    memcpy(&sums[1][0], &s10, sizeof s10);
    memcpy(&sums[1][4], &s11, sizeof s11);
}

/* For four rows of op(A) or fewer (a small batch), where eight would compute as many sums of
 * zeros as sums that count: the dot products of four rows of op(A), laid out p-major four to a p
 * (at[p][r]), with rows j0 .. j0 + 3 of B (b[t]; rows beyond B repeat the last): sums[t][r]. Four
 * independent accumulators, as dots8 has, each summing its terms with p in order. */
static void dots4(const float *at, int k, const float *const *b, float sums[4][8]) {
    v4f z = {0}, s0 = z, s1 = z, s2 = z, s3 = z;
    for (int p = 0; p < k; p++) {
        v4f x = ld4(at + 4 * (size_t)p);
        s0 += x * b[0][p];
        s1 += x * b[1][p];
        s2 += x * b[2][p];
        s3 += x * b[3][p];
    }
    memcpy(&sums[0][0], &s0, sizeof s0);
    memcpy(&sums[1][0], &s1, sizeof s1);
    memcpy(&sums[2][0], &s2, sizeof s2);
    memcpy(&sums[3][0], &s3, sizeof s3);
}

/* op(B)(p, j) = B[j][p]: each C element is a dot product over p, in order, of a row of op(A) and
 * a row of B, computed eight rows of op(A) (four where no more are left) and two rows of B at a
 * time. Returns -1 out of host memory. */
static int gemm_dots(int ta, int m, int n, int k, float alpha, const float *A, size_t lda,
                     const float *B, size_t ldb, float beta, float *C, size_t ldc) {
    float *at = malloc((size_t)(k ? k : 1) * 8 * sizeof *at);
    if (!at)
        return -1;
    for (int i0 = 0; i0 < m; i0 += 8) {
        int nr = m - i0 < 8 ? m - i0 : 8, w = nr <= 4 ? 4 : 8;
        for (int p = 0; p < k; p++)
            for (int r = 0; r < w; r++) {
                size_t i = (size_t)(i0 + r);
                at[(size_t)p * (size_t)w + (size_t)r] = r >= nr ? 0.0f
                                                        : ta    ? A[(size_t)p * lda + i]
                                                                : A[i * lda + (size_t)p];
            }
        int step = w == 4 ? 4 : 2;
        for (int j = 0; j < n; j += step) {
            int nj = n - j < step ? n - j : step;
            const float *b[4];
            for (int t = 0; t < 4; t++)
                b[t] = B + (size_t)(j + (t < nj ? t : nj - 1)) * ldb;
            float sums[4][8];
            if (w == 4)
                dots4(at, k, b, sums);
            else
                dots8(at, k, b[0], b[1], sums);
            for (int t = 0; t < nj; t++)
                for (int r = 0; r < nr; r++) {
                    float *c = C + (size_t)(i0 + r) * ldc + (size_t)(j + t);
                    *c = beta == 0.0f ? alpha * sums[t][r] : alpha * sums[t][r] + beta * *c;
                }
        }
    }
    free(at);
    return 0;
}

/* gemm_f32(ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc): C = alpha*op(A)*op(B) + beta*C
 * with op(A) m x k and op(B) k x n, row-major. A is stored m x k (ta = 0) or k x m (ta != 0); B
 * is stored k x n (tb = 0) or n x k (tb != 0). As in BLAS, beta == 0 means C is not read (so
 * NaNs in C do not propagate). C must not overlap A or B. */
static int k_gemm(fakecuda_launch_t *l) {
    int ta = FAKECUDA_ARG(l, 0, int), tb = FAKECUDA_ARG(l, 1, int);
    int m = FAKECUDA_ARG(l, 2, int), n = FAKECUDA_ARG(l, 3, int), k = FAKECUDA_ARG(l, 4, int);
    float alpha = FAKECUDA_ARG(l, 5, float);
    CUdeviceptr ap = FAKECUDA_ARG(l, 6, CUdeviceptr);
    int lda = FAKECUDA_ARG(l, 7, int);
    CUdeviceptr bp = FAKECUDA_ARG(l, 8, CUdeviceptr);
    int ldb = FAKECUDA_ARG(l, 9, int);
    float beta = FAKECUDA_ARG(l, 10, float);
    CUdeviceptr cp = FAKECUDA_ARG(l, 11, CUdeviceptr);
    int ldc = FAKECUDA_ARG(l, 12, int);
    if (m <= 0 || n <= 0 || k < 0)
        return 0;
    const float *A = NULL, *B = NULL;
    if (k > 0) {
        A = fview(l, ap, ta ? extent(k, m, lda) : extent(m, k, lda), 0);
        B = fview(l, bp, tb ? extent(n, k, ldb) : extent(k, n, ldb), 0);
        if (!A || !B)
            return -1;
    }
    float *C = fview(l, cp, extent(m, n, ldc), 1);
    if (!C)
        return -1;
    if (tb) {
        if (gemm_dots(ta, m, n, k, alpha, A, (size_t)lda, B, (size_t)ldb, beta, C, (size_t)ldc))
            return -1;
    } else {
        gemm_rows_of_b(ta, m, n, k, alpha, A, (size_t)lda, B, (size_t)ldb, beta, C, (size_t)ldc);
    }
    fakecuda_work(l, 2.0 * m * n * (double)k,
                  4.0 * ((double)m * k + (double)k * n + 2.0 * (double)m * n));
    return 0;
}

/* bias_add_f32(y, b, outer, ch, inner): y[(o*ch + c)*inner + i] += b[c]. Rows of a matrix are
 * (outer = rows, ch = cols, inner = 1); NCHW tensors are (N, C, H*W). */
static int k_bias_add(fakecuda_launch_t *l) {
    CUdeviceptr yp = FAKECUDA_ARG(l, 0, CUdeviceptr), bp = FAKECUDA_ARG(l, 1, CUdeviceptr);
    int outer = FAKECUDA_ARG(l, 2, int), ch = FAKECUDA_ARG(l, 3, int);
    int inner = FAKECUDA_ARG(l, 4, int);
    uint64_t n = (uint64_t)outer * (uint64_t)ch * (uint64_t)inner;
    if (n == 0)
        return 0;
    float *y = fview(l, yp, n, 1);
    const float *b = fview(l, bp, (uint64_t)ch, 0);
    if (!y || !b)
        return -1;
    for (int o = 0; o < outer; o++)
        for (int c = 0; c < ch; c++) {
            float *row = y + ((size_t)o * (size_t)ch + (size_t)c) * (size_t)inner;
            for (int i = 0; i < inner; i++)
                row[i] += b[c];
        }
    fakecuda_work(l, (double)n, 8.0 * (double)n);
    return 0;
}

/* bias_grad_f32(dy, db, outer, ch, inner): db[c] = sum over o, i of dy[(o*ch + c)*inner + i],
 * summed in order o, then i. */
static int k_bias_grad(fakecuda_launch_t *l) {
    CUdeviceptr dyp = FAKECUDA_ARG(l, 0, CUdeviceptr), dbp = FAKECUDA_ARG(l, 1, CUdeviceptr);
    int outer = FAKECUDA_ARG(l, 2, int), ch = FAKECUDA_ARG(l, 3, int);
    int inner = FAKECUDA_ARG(l, 4, int);
    uint64_t n = (uint64_t)outer * (uint64_t)ch * (uint64_t)inner;
    if (ch <= 0)
        return 0;
    float *db = fview(l, dbp, (uint64_t)ch, 1);
    const float *dy = n ? fview(l, dyp, n, 0) : NULL;
    if (!db || (n && !dy))
        return -1;
    for (int c = 0; c < ch; c++) {
        float acc = 0.0f;
        for (int o = 0; o < outer; o++) {
            const float *row = dy + ((size_t)o * (size_t)ch + (size_t)c) * (size_t)inner;
            for (int i = 0; i < inner; i++)
                acc += row[i];
        }
        db[c] = acc;
    }
    fakecuda_work(l, (double)n, 4.0 * (double)n);
    return 0;
}

/* relu_f32(x, y, n): y = max(x, 0); x == y (in place) is allowed. */
static int k_relu(fakecuda_launch_t *l) {
    CUdeviceptr xp = FAKECUDA_ARG(l, 0, CUdeviceptr), yp = FAKECUDA_ARG(l, 1, CUdeviceptr);
    uint64_t n = FAKECUDA_ARG(l, 2, uint64_t);
    if (n == 0)
        return 0;
    const float *x = fview(l, xp, n, 0);
    float *y = fview(l, yp, n, 1);
    if (!x || !y)
        return -1;
    for (uint64_t i = 0; i < n; i++)
        y[i] = x[i] > 0.0f ? x[i] : 0.0f;
    fakecuda_work(l, (double)n, 8.0 * (double)n);
    return 0;
}

/* relu_bwd_f32(y, dy, dx, n): dx = y > 0 ? dy : 0, from the relu's output y (so it also serves
 * an in-place relu, whose input is gone); dx == dy is allowed. */
static int k_relu_bwd(fakecuda_launch_t *l) {
    CUdeviceptr yp = FAKECUDA_ARG(l, 0, CUdeviceptr), dyp = FAKECUDA_ARG(l, 1, CUdeviceptr);
    CUdeviceptr dxp = FAKECUDA_ARG(l, 2, CUdeviceptr);
    uint64_t n = FAKECUDA_ARG(l, 3, uint64_t);
    if (n == 0)
        return 0;
    const float *y = fview(l, yp, n, 0), *dy = fview(l, dyp, n, 0);
    float *dx = fview(l, dxp, n, 1);
    if (!y || !dy || !dx)
        return -1;
    for (uint64_t i = 0; i < n; i++)
        dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
    fakecuda_work(l, (double)n, 12.0 * (double)n);
    return 0;
}

/* add_f32(a, b, c, n): c = a + b (a residual join); c may alias a or b. */
static int k_add(fakecuda_launch_t *l) {
    CUdeviceptr ap = FAKECUDA_ARG(l, 0, CUdeviceptr), bp = FAKECUDA_ARG(l, 1, CUdeviceptr);
    CUdeviceptr cp = FAKECUDA_ARG(l, 2, CUdeviceptr);
    uint64_t n = FAKECUDA_ARG(l, 3, uint64_t);
    if (n == 0)
        return 0;
    const float *a = fview(l, ap, n, 0), *b = fview(l, bp, n, 0);
    float *c = fview(l, cp, n, 1);
    if (!a || !b || !c)
        return -1;
    for (uint64_t i = 0; i < n; i++)
        c[i] = a[i] + b[i];
    fakecuda_work(l, (double)n, 12.0 * (double)n);
    return 0;
}

/* axpy_f32(n, a, x, y): y += a * x. */
static int k_axpy(fakecuda_launch_t *l) {
    uint64_t n = FAKECUDA_ARG(l, 0, uint64_t);
    float a = FAKECUDA_ARG(l, 1, float);
    CUdeviceptr xp = FAKECUDA_ARG(l, 2, CUdeviceptr), yp = FAKECUDA_ARG(l, 3, CUdeviceptr);
    if (n == 0)
        return 0;
    const float *x = fview(l, xp, n, 0);
    float *y = fview(l, yp, n, 1);
    if (!x || !y)
        return -1;
    for (uint64_t i = 0; i < n; i++)
        y[i] += a * x[i];
    fakecuda_work(l, 2.0 * (double)n, 12.0 * (double)n);
    return 0;
}

/* scale_f32(n, a, x): x *= a. */
static int k_scale(fakecuda_launch_t *l) {
    uint64_t n = FAKECUDA_ARG(l, 0, uint64_t);
    float a = FAKECUDA_ARG(l, 1, float);
    CUdeviceptr xp = FAKECUDA_ARG(l, 2, CUdeviceptr);
    if (n == 0)
        return 0;
    float *x = fview(l, xp, n, 1);
    if (!x)
        return -1;
    for (uint64_t i = 0; i < n; i++)
        x[i] *= a;
    fakecuda_work(l, (double)n, 8.0 * (double)n);
    return 0;
}

/* gap_fwd_f32(x, y, nc, hw): y[j] = mean of x[j*hw .. j*hw + hw) (global average pooling). */
static int k_gap_fwd(fakecuda_launch_t *l) {
    CUdeviceptr xp = FAKECUDA_ARG(l, 0, CUdeviceptr), yp = FAKECUDA_ARG(l, 1, CUdeviceptr);
    int nc = FAKECUDA_ARG(l, 2, int), hw = FAKECUDA_ARG(l, 3, int);
    if (nc <= 0 || hw <= 0)
        return 0;
    const float *x = fview(l, xp, (uint64_t)nc * (uint64_t)hw, 0);
    float *y = fview(l, yp, (uint64_t)nc, 1);
    if (!x || !y)
        return -1;
    for (int j = 0; j < nc; j++) {
        float acc = 0.0f;
        for (int i = 0; i < hw; i++)
            acc += x[(size_t)j * (size_t)hw + (size_t)i];
        y[j] = acc / (float)hw;
    }
    fakecuda_work(l, (double)nc * hw, 4.0 * (double)nc * hw);
    return 0;
}

/* gap_bwd_f32(dy, dx, nc, hw): dx[j*hw + i] = dy[j] / hw. */
static int k_gap_bwd(fakecuda_launch_t *l) {
    CUdeviceptr dyp = FAKECUDA_ARG(l, 0, CUdeviceptr), dxp = FAKECUDA_ARG(l, 1, CUdeviceptr);
    int nc = FAKECUDA_ARG(l, 2, int), hw = FAKECUDA_ARG(l, 3, int);
    if (nc <= 0 || hw <= 0)
        return 0;
    const float *dy = fview(l, dyp, (uint64_t)nc, 0);
    float *dx = fview(l, dxp, (uint64_t)nc * (uint64_t)hw, 1);
    if (!dy || !dx)
        return -1;
    for (int j = 0; j < nc; j++)
        for (int i = 0; i < hw; i++)
            dx[(size_t)j * (size_t)hw + (size_t)i] = dy[j] / (float)hw;
    fakecuda_work(l, (double)nc * hw, 4.0 * (double)nc * hw);
    return 0;
}

/* softmax_xent_f32(logits, labels, loss, dlogits, rows, classes): loss[0] = mean over rows of
 * -log softmax(logits[r])[labels[r]] (labels are int32 in [0, classes)); when dlogits is not 0,
 * dlogits[r] = (softmax(logits[r]) - onehot(labels[r])) / rows. A label out of range is an
 * illegal access (returns -1), as an out-of-bounds index would be on a GPU. */
static int k_softmax_xent(fakecuda_launch_t *l) {
    CUdeviceptr lp = FAKECUDA_ARG(l, 0, CUdeviceptr), yp = FAKECUDA_ARG(l, 1, CUdeviceptr);
    CUdeviceptr lossp = FAKECUDA_ARG(l, 2, CUdeviceptr), dp = FAKECUDA_ARG(l, 3, CUdeviceptr);
    int rows = FAKECUDA_ARG(l, 4, int), classes = FAKECUDA_ARG(l, 5, int);
    if (rows <= 0 || classes <= 0)
        return 0;
    uint64_t n = (uint64_t)rows * (uint64_t)classes;
    const float *z = fview(l, lp, n, 0);
    const int32_t *y = fakecuda_access(l, yp, (size_t)rows * sizeof(int32_t), 0);
    float *loss = fview(l, lossp, 1, 1);
    float *dz = dp ? fview(l, dp, n, 1) : NULL;
    if (!z || !y || !loss || (dp && !dz))
        return -1;
    double total = 0.0;
    for (int r = 0; r < rows; r++) {
        const float *zr = z + (size_t)r * (size_t)classes;
        int label = y[r];
        if (label < 0 || label >= classes)
            return -1;
        float mx = zr[0];
        for (int c = 1; c < classes; c++)
            mx = zr[c] > mx ? zr[c] : mx;
        float sum = 0.0f;
        for (int c = 0; c < classes; c++)
            sum += expf(zr[c] - mx);
        total += (double)(logf(sum) - (zr[label] - mx));
        if (dz) {
            float *dr = dz + (size_t)r * (size_t)classes;
            for (int c = 0; c < classes; c++) {
                float p = expf(zr[c] - mx) / sum;
                dr[c] = (p - (c == label ? 1.0f : 0.0f)) / (float)rows;
            }
        }
    }
    loss[0] = (float)(total / rows);
    fakecuda_work(l, 10.0 * (double)n, 8.0 * (double)n);
    return 0;
}

/* Whether [a, a + n) and [b, b + n) (floats) share a byte. */
static int floats_overlap(const float *a, const float *b, uint64_t n) {
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b, len = (uintptr_t)n * sizeof(float);
    return x < y + len && y < x + len;
}

/* One momentum SGD step, element by element: v = mom * v + g + wd * w, then w -= lr * v. Four
 * elements at once (each lane the scalar loop's operations, in its order: the same bits) when
 * the three arrays are apart; when any two overlap, the plain loop, whose element-by-element
 * reads and writes are then what a GPU's threads would see. The plain loop was a quarter of the
 * simulated device's CPU time in `large` in core with short kernels. */
static void sgd_step(float *w, float *v, const float *g, uint64_t n, float lr, float mom,
                     float wd) {
    uint64_t i = 0;
    if (!floats_overlap(w, v, n) && !floats_overlap(w, g, n) && !floats_overlap(v, g, n)) {
        v4f z = {0}, lr4 = z + lr, mom4 = z + mom, wd4 = z + wd;
        for (; i + 4 <= n; i += 4) {
            v4f w4 = ld4(w + i), v4 = mom4 * ld4(v + i) + ld4(g + i) + wd4 * w4;
            st4(v + i, v4);
            st4(w + i, w4 - lr4 * v4);
        }
    }
    for (; i < n; i++) {
        v[i] = mom * v[i] + g[i] + wd * w[i];
        w[i] -= lr * v[i];
    }
}

/* sgd_momentum_f32(w, g, v, n, lr, momentum, weight_decay): v = momentum*v + g + wd*w;
 * w -= lr*v. v is the optimizer state, kept across iterations. */
static int k_sgd(fakecuda_launch_t *l) {
    CUdeviceptr wp = FAKECUDA_ARG(l, 0, CUdeviceptr), gp = FAKECUDA_ARG(l, 1, CUdeviceptr);
    CUdeviceptr vp = FAKECUDA_ARG(l, 2, CUdeviceptr);
    uint64_t n = FAKECUDA_ARG(l, 3, uint64_t);
    float lr = FAKECUDA_ARG(l, 4, float), mom = FAKECUDA_ARG(l, 5, float);
    float wd = FAKECUDA_ARG(l, 6, float);
    if (n == 0)
        return 0;
    float *w = fview(l, wp, n, 1), *v = fview(l, vp, n, 1);
    const float *g = fview(l, gp, n, 0);
    if (!w || !v || !g)
        return -1;
    sgd_step(w, v, g, n, lr, mom, wd);
    fakecuda_work(l, 6.0 * (double)n, 20.0 * (double)n);
    return 0;
}

static const fakecuda_kernel_t nn_kernels[] = {
    {"nn", "fill_uniform_f32", 4, {P_PTR, P_U64, P_U64, P_F32}, k_fill_uniform},
    {"nn", "fill_f32", 3, {P_PTR, P_U64, P_F32}, k_fill},
    {"nn",
     "gemm_f32",
     13,
     {P_INT, P_INT, P_INT, P_INT, P_INT, P_F32, P_PTR, P_INT, P_PTR, P_INT, P_F32, P_PTR, P_INT},
     k_gemm},
    {"nn", "bias_add_f32", 5, {P_PTR, P_PTR, P_INT, P_INT, P_INT}, k_bias_add},
    {"nn", "bias_grad_f32", 5, {P_PTR, P_PTR, P_INT, P_INT, P_INT}, k_bias_grad},
    {"nn", "relu_f32", 3, {P_PTR, P_PTR, P_U64}, k_relu},
    {"nn", "relu_bwd_f32", 4, {P_PTR, P_PTR, P_PTR, P_U64}, k_relu_bwd},
    {"nn", "add_f32", 4, {P_PTR, P_PTR, P_PTR, P_U64}, k_add},
    {"nn", "axpy_f32", 4, {P_U64, P_F32, P_PTR, P_PTR}, k_axpy},
    {"nn", "scale_f32", 3, {P_U64, P_F32, P_PTR}, k_scale},
    {"nn", "gap_fwd_f32", 4, {P_PTR, P_PTR, P_INT, P_INT}, k_gap_fwd},
    {"nn", "gap_bwd_f32", 4, {P_PTR, P_PTR, P_INT, P_INT}, k_gap_bwd},
    {"nn", "softmax_xent_f32", 6, {P_PTR, P_PTR, P_PTR, P_PTR, P_INT, P_INT}, k_softmax_xent},
    {"nn", "sgd_momentum_f32", 7, {P_PTR, P_PTR, P_PTR, P_U64, P_F32, P_F32, P_F32}, k_sgd},
};
FC_KERNEL_TABLE(nn_kernels);
