/* SPDX-License-Identifier: MIT */
/* check_cublas.c: the simulated libcublas.so.13 computes what cuBLAS defines, strictly.
 *
 * Each test runs in Check's forked child: it makes device 0's primary context current on the
 * simulated driver the runner is linked with, dlopens the simulated cuBLAS from the build
 * directory (which finds that same libcuda.so.1 by its soname) and runs GEMMs on a stream. Every
 * form (Sgemm, GemmEx, the strided-batched and the pointer-array batched ones, with N and T
 * operands, leading dimensions larger than the rows, beta 0 and not, batch counts 1 and 3) is
 * compared with a double-precision host reference, and the padding between columns must come
 * back untouched. Bad arguments give the documented statuses and launch nothing; each computing
 * call is one launch on the handle's stream; the pointer arrays are read from device memory.
 * Inputs are fixed pseudo-random values, so these tests need no seed. */
#include <check.h>
#include <cuda.h>
#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fakecuda.h"
#include "fc_cublas_api.h"
#include "testutil.h"

static struct {
    __typeof__(&cublasCreate_v2) Create;
    __typeof__(&cublasDestroy_v2) Destroy;
    __typeof__(&cublasSetStream_v2) SetStream;
    __typeof__(&cublasGetStream_v2) GetStream;
    __typeof__(&cublasGetVersion_v2) GetVersion;
    __typeof__(&cublasSetPointerMode_v2) SetPointerMode;
    __typeof__(&cublasGetPointerMode_v2) GetPointerMode;
    __typeof__(&cublasGetStatusString) GetStatusString;
    __typeof__(&cublasGetStatusName) GetStatusName;
    __typeof__(&cublasSgemm_v2) Sgemm;
    __typeof__(&cublasGemmEx) GemmEx;
    __typeof__(&cublasSgemmStridedBatched) SgemmStrided;
    __typeof__(&cublasGemmStridedBatchedEx) GemmStridedEx;
    __typeof__(&cublasSgemmBatched) SgemmBatched;
    __typeof__(&cublasGemmBatchedEx) GemmBatchedEx;
} blas;

static CUcontext ctx;
static CUstream stream;
static cublasHandle_t handle;

static void setup(void) {
    CUdevice dev;
    ck_assert_int_eq(cuInit(0), CUDA_SUCCESS);
    ck_assert_int_eq(cuDeviceGet(&dev, 0), CUDA_SUCCESS);
    ck_assert_int_eq(cuDevicePrimaryCtxRetain(&ctx, dev), CUDA_SUCCESS);
    ck_assert_int_eq(cuCtxSetCurrent(ctx), CUDA_SUCCESS);
    ck_assert_int_eq(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    void *lib = dlopen(tu_build_path("fakecuda/libcublas.so.13"), RTLD_NOW | RTLD_LOCAL);
    ck_assert_msg(lib != NULL, "dlopen: %s", dlerror());
#define R(field, name)                                                                             \
    do {                                                                                           \
        *(void **)&blas.field = dlsym(lib, name);                                                  \
        ck_assert_msg(blas.field != NULL, "%s missing", name);                                     \
    } while (0)
    R(Create, "cublasCreate_v2");
    R(Destroy, "cublasDestroy_v2");
    R(SetStream, "cublasSetStream_v2");
    R(GetStream, "cublasGetStream_v2");
    R(GetVersion, "cublasGetVersion_v2");
    R(SetPointerMode, "cublasSetPointerMode_v2");
    R(GetPointerMode, "cublasGetPointerMode_v2");
    R(GetStatusString, "cublasGetStatusString");
    R(GetStatusName, "cublasGetStatusName");
    R(Sgemm, "cublasSgemm_v2");
    R(GemmEx, "cublasGemmEx");
    R(SgemmStrided, "cublasSgemmStridedBatched");
    R(GemmStridedEx, "cublasGemmStridedBatchedEx");
    R(SgemmBatched, "cublasSgemmBatched");
    R(GemmBatchedEx, "cublasGemmBatchedEx");
#undef R
    ck_assert_int_eq(blas.Create(&handle), CUBLAS_STATUS_SUCCESS);
    ck_assert_int_eq(blas.SetStream(handle, (cudaStream_t)stream), CUBLAS_STATUS_SUCCESS);
}

static void teardown(void) {
    ck_assert_int_eq(blas.Destroy(handle), CUBLAS_STATUS_SUCCESS);
    ck_assert_int_eq(cuStreamDestroy(stream), CUDA_SUCCESS);
    ck_assert_int_eq(cuDevicePrimaryCtxRelease(0), CUDA_SUCCESS);
}

/* n fixed pseudo-random values in [-1, 1) from `salt`. */
static float *host_rand(size_t n, uint32_t salt) {
    float *v = malloc(n * sizeof *v);
    uint32_t s = 2463534242u ^ (salt * 2654435761u);
    for (size_t i = 0; i < n; i++) {
        s ^= s << 13, s ^= s >> 17, s ^= s << 5;
        v[i] = (float)(s >> 8) / 8388608.0f - 1.0f;
    }
    return v;
}

static CUdeviceptr dev_from(const void *h, size_t bytes) {
    CUdeviceptr d;
    ck_assert_int_eq(cuMemAlloc(&d, bytes), CUDA_SUCCESS);
    ck_assert_int_eq(cuMemcpyHtoD(d, h, bytes), CUDA_SUCCESS);
    return d;
}

static void host_from(void *h, CUdeviceptr d, size_t bytes) {
    ck_assert_int_eq(cuStreamSynchronize(stream), CUDA_SUCCESS);
    ck_assert_int_eq(cuMemcpyDtoH(h, d, bytes), CUDA_SUCCESS);
}

/* ---- one GEMM problem, in any of the six forms --------------------------------------------- */

enum { F_SGEMM, F_EX, F_STRIDED, F_STRIDED_EX, F_BATCHED, F_BATCHED_EX };

/* Column-major op(A) m x k, op(B) k x n, C m x n, with leading dimensions larger than the rows
 * and, for batches, members `stride` floats apart in the host arrays. */
typedef struct problem {
    int form, ta, tb, m, n, k, batch;
    int lda, ldb, ldc;
    size_t na, nb, nc; /* floats of one member, padding included */
    float alpha, beta;
    float *a, *b, *c0; /* batch members back to back, na / nb / nc floats apart */
} problem_t;

static void problem_init(problem_t *p, int form, int ta, int tb, int batch, float alpha,
                         float beta) {
    *p = (problem_t){.form = form, .ta = ta, .tb = tb, .m = 5, .n = 4, .k = 6, .batch = batch};
    int rows_a = ta ? p->k : p->m, cols_a = ta ? p->m : p->k;
    int rows_b = tb ? p->n : p->k, cols_b = tb ? p->k : p->n;
    p->lda = rows_a + 2, p->ldb = rows_b + 1, p->ldc = p->m + 3;
    p->na = (size_t)p->lda * cols_a, p->nb = (size_t)p->ldb * cols_b;
    p->nc = (size_t)p->ldc * p->n;
    p->alpha = alpha, p->beta = beta;
    p->a = host_rand(p->na * batch, 1);
    p->b = host_rand(p->nb * batch, 2);
    p->c0 = host_rand(p->nc * batch, 3);
}

static void problem_fini(problem_t *p) {
    free(p->a), free(p->b), free(p->c0);
}

/* The reference of member `mb`: want[i + j * ldc] for the computed elements. */
static double ref(const problem_t *p, int mb, int i, int j) {
    const float *a = p->a + (size_t)mb * p->na, *b = p->b + (size_t)mb * p->nb;
    double acc = 0.0;
    for (int q = 0; q < p->k; q++) {
        double x = p->ta ? a[q + (size_t)i * p->lda] : a[i + (size_t)q * p->lda];
        double y = p->tb ? b[j + (size_t)q * p->ldb] : b[q + (size_t)j * p->ldb];
        acc += x * y;
    }
    double old = p->c0[(size_t)mb * p->nc + i + (size_t)j * p->ldc];
    return p->alpha * acc + (p->beta == 0.0f ? 0.0 : p->beta * old);
}

static cublasOperation_t op(int t) {
    return t ? CUBLAS_OP_T : CUBLAS_OP_N;
}

/* Runs p's call on device copies (the pointer-array forms: one allocation per member and the
 * three arrays in device memory), checks that it was one launch, and gives C back in c. */
static void problem_run(const problem_t *p, float *c) {
    int B = p->batch;
    size_t fa = p->na * sizeof(float), fb = p->nb * sizeof(float), fc = p->nc * sizeof(float);
    CUdeviceptr da = dev_from(p->a, fa * B), db = dev_from(p->b, fb * B);
    CUdeviceptr dc = dev_from(p->c0, fc * B);
    CUdeviceptr pa[3], pb[3], pc[3], arr[3] = {0, 0, 0};
    if (p->form >= F_BATCHED) {
        for (int i = 0; i < B; i++) {
            pa[i] = dev_from(p->a + i * p->na, fa);
            pb[i] = dev_from(p->b + i * p->nb, fb);
            pc[i] = dev_from(p->c0 + i * p->nc, fc);
        }
        arr[0] = dev_from(pa, B * sizeof(CUdeviceptr));
        arr[1] = dev_from(pb, B * sizeof(CUdeviceptr));
        arr[2] = dev_from(pc, B * sizeof(CUdeviceptr));
    }
    const float *A = (const float *)da, *Bm = (const float *)db;
    float *C = (float *)dc;
    long long sa = (long long)p->na, sb = (long long)p->nb, sc = (long long)p->nc;
    const void *const *Aa = (const void *const *)arr[0], *const *Ba = (const void *const *)arr[1];
    void *const *Ca = (void *const *)arr[2];
    cublasOperation_t ta = op(p->ta), tb = op(p->tb);
    const float *al = &p->alpha, *be = &p->beta;
    uint64_t launches = fakecuda_call_count("cuLaunchKernel");
    cublasStatus_t st = CUBLAS_STATUS_INTERNAL_ERROR;
    switch (p->form) {
    case F_SGEMM:
        st = blas.Sgemm(handle, ta, tb, p->m, p->n, p->k, al, A, p->lda, Bm, p->ldb, be, C, p->ldc);
        break;
    case F_EX:
        st =
            blas.GemmEx(handle, ta, tb, p->m, p->n, p->k, al, A, CUDA_R_32F, p->lda, Bm, CUDA_R_32F,
                        p->ldb, be, C, CUDA_R_32F, p->ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        break;
    case F_STRIDED:
        st = blas.SgemmStrided(handle, ta, tb, p->m, p->n, p->k, al, A, p->lda, sa, Bm, p->ldb, sb,
                               be, C, p->ldc, sc, B);
        break;
    case F_STRIDED_EX:
        st = blas.GemmStridedEx(handle, ta, tb, p->m, p->n, p->k, al, A, CUDA_R_32F, p->lda, sa, Bm,
                                CUDA_R_32F, p->ldb, sb, be, C, CUDA_R_32F, p->ldc, sc, B,
                                CUBLAS_COMPUTE_32F_FAST_TF32, CUBLAS_GEMM_DEFAULT_TENSOR_OP);
        break;
    case F_BATCHED:
        st = blas.SgemmBatched(handle, ta, tb, p->m, p->n, p->k, al, (const float *const *)Aa,
                               p->lda, (const float *const *)Ba, p->ldb, be, (float *const *)Ca,
                               p->ldc, B);
        break;
    case F_BATCHED_EX:
        st = blas.GemmBatchedEx(handle, ta, tb, p->m, p->n, p->k, al, Aa, CUDA_R_32F, p->lda, Ba,
                                CUDA_R_32F, p->ldb, be, Ca, CUDA_R_32F, p->ldc, B,
                                CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        break;
    }
    ck_assert_int_eq(st, CUBLAS_STATUS_SUCCESS);
    ck_assert_uint_eq(fakecuda_call_count("cuLaunchKernel"), launches + 1);
    if (p->form >= F_BATCHED) {
        for (int i = 0; i < B; i++) {
            host_from(c + i * p->nc, pc[i], fc);
            cuMemFree(pa[i]), cuMemFree(pb[i]), cuMemFree(pc[i]);
        }
        for (int t = 0; t < 3; t++)
            cuMemFree(arr[t]);
        float *plain = malloc(fc * B);
        host_from(plain, dc, fc * B);
        ck_assert_msg(memcmp(plain, p->c0, fc * B) == 0, "the batched call wrote elsewhere");
        free(plain);
    } else {
        host_from(c, dc, fc * B);
    }
    cuMemFree(da), cuMemFree(db), cuMemFree(dc);
}

/* Every computed element is within float rounding of the reference; every padding element is
 * the old value, bit for bit. */
static void problem_check(const problem_t *p, const float *c) {
    for (int mb = 0; mb < p->batch; mb++)
        for (int j = 0; j < p->n; j++)
            for (int i = 0; i < p->ldc; i++) {
                size_t at = (size_t)mb * p->nc + i + (size_t)j * p->ldc;
                if (i >= p->m) {
                    ck_assert_msg(memcmp(&c[at], &p->c0[at], sizeof(float)) == 0,
                                  "form %d: padding C[%d,%d] of member %d changed", p->form, i, j,
                                  mb);
                    continue;
                }
                double want = ref(p, mb, i, j);
                ck_assert_msg(fabs(c[at] - want) <= 1e-5 * (1.0 + fabs(want)),
                              "form %d ta %d tb %d member %d C[%d,%d]: got %.8g, want %.8g",
                              p->form, p->ta, p->tb, mb, i, j, (double)c[at], want);
            }
}

static const float alphas[] = {1.0f, 0.75f, -1.5f}, betas[] = {0.0f, 0.5f, 1.0f};

/* Runs form (the base form when _i < 4, its Ex form otherwise) with the N/T combination of _i's
 * low bits, for each alpha/beta pair and each batch count. */
static void run_form(int base, int i, int batches) {
    static const int counts[] = {1, 3};
    for (int ab = 0; ab < 3; ab++)
        for (int nb = 0; nb < batches; nb++) {
            problem_t p;
            problem_init(&p, base + (i >> 2), i & 1, (i >> 1) & 1, counts[nb], alphas[ab],
                         betas[ab]);
            float *c = malloc(p.nc * p.batch * sizeof(float));
            problem_run(&p, c);
            problem_check(&p, c);
            free(c);
            problem_fini(&p);
        }
}

START_TEST(test_gemm_matches_reference) {
    run_form(F_SGEMM, _i, 1);
}
END_TEST

START_TEST(test_strided_batched_gemm_matches_reference) {
    run_form(F_STRIDED, _i, 2);
}
END_TEST

START_TEST(test_pointer_array_gemm_matches_reference) {
    run_form(F_BATCHED, _i, 2);
}
END_TEST

/* ---- statuses ------------------------------------------------------------------------------- */

/* Bad arguments give the statuses the cuBLAS reference documents and launch nothing: a NULL
 * handle NOT_INITIALIZED; negative sizes or batch counts, an unknown operation, a leading
 * dimension below max(1, rows), a NULL alpha or beta INVALID_VALUE; other types, compute types
 * or algorithms of the Ex forms, and device pointer mode, NOT_SUPPORTED. */
START_TEST(test_bad_arguments_give_documented_statuses) {
    CUdeviceptr d;
    ck_assert_int_eq(cuMemAlloc(&d, 4096), CUDA_SUCCESS);
    const float *A = (const float *)d, *B = (const float *)d;
    float *C = (float *)d, one = 1.0f, zero = 0.0f;
    const void *const *arr = (const void *const *)d;
    uint64_t launches = fakecuda_call_count("cuLaunchKernel");
    const cublasOperation_t N = CUBLAS_OP_N, T = CUBLAS_OP_T;
    const cublasStatus_t NI = CUBLAS_STATUS_NOT_INITIALIZED, IV = CUBLAS_STATUS_INVALID_VALUE;
    const cublasStatus_t NS = CUBLAS_STATUS_NOT_SUPPORTED;
    ck_assert_int_eq(blas.Sgemm(NULL, N, N, 2, 2, 2, &one, A, 2, B, 2, &zero, C, 2), NI);
    ck_assert_int_eq(blas.Sgemm(handle, N, N, -1, 2, 2, &one, A, 2, B, 2, &zero, C, 2), IV);
    ck_assert_int_eq(blas.Sgemm(handle, N, N, 2, -1, 2, &one, A, 2, B, 2, &zero, C, 2), IV);
    ck_assert_int_eq(blas.Sgemm(handle, N, N, 2, 2, -1, &one, A, 2, B, 2, &zero, C, 2), IV);
    ck_assert_int_eq(blas.Sgemm(handle, CUBLAS_OP_CONJG, N, 2, 2, 2, &one, A, 2, B, 2, &zero, C, 2),
                     IV);
    ck_assert_int_eq(
        blas.Sgemm(handle, N, (cublasOperation_t)7, 2, 2, 2, &one, A, 2, B, 2, &zero, C, 2), IV);
    /* lda >= max(1, m) for N, max(1, k) for T; ldb >= max(1, k) for N, max(1, n) for T. */
    ck_assert_int_eq(blas.Sgemm(handle, N, N, 3, 2, 4, &one, A, 2, B, 4, &zero, C, 3), IV);
    ck_assert_int_eq(blas.Sgemm(handle, T, N, 3, 2, 4, &one, A, 3, B, 4, &zero, C, 3), IV);
    ck_assert_int_eq(blas.Sgemm(handle, N, N, 3, 2, 4, &one, A, 3, B, 3, &zero, C, 3), IV);
    ck_assert_int_eq(blas.Sgemm(handle, N, T, 3, 2, 4, &one, A, 3, B, 1, &zero, C, 3), IV);
    ck_assert_int_eq(blas.Sgemm(handle, N, N, 3, 2, 4, &one, A, 3, B, 4, &zero, C, 2), IV);
    ck_assert_int_eq(blas.Sgemm(handle, N, N, 0, 2, 4, &one, A, 0, B, 4, &zero, C, 1), IV);
    ck_assert_int_eq(blas.Sgemm(handle, N, N, 2, 2, 2, NULL, A, 2, B, 2, &zero, C, 2), IV);
    ck_assert_int_eq(blas.Sgemm(handle, N, N, 2, 2, 2, &one, A, 2, B, 2, NULL, C, 2), IV);
    ck_assert_int_eq(
        blas.SgemmStrided(handle, N, N, 2, 2, 2, &one, A, 2, 4, B, 2, 4, &zero, C, 2, 4, -1), IV);
    ck_assert_int_eq(blas.SgemmBatched(handle, N, N, 2, 2, 2, &one, (const float *const *)arr, 2,
                                       (const float *const *)arr, 2, &zero, (float *const *)arr, 2,
                                       -1),
                     IV);
    ck_assert_int_eq(blas.GemmEx(NULL, N, N, 2, 2, 2, &one, A, CUDA_R_32F, 2, B, CUDA_R_32F, 2,
                                 &zero, C, CUDA_R_32F, 2, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                     NI);
    ck_assert_int_eq(blas.GemmEx(handle, N, N, 2, 2, 2, &one, A, CUDA_R_16F, 2, B, CUDA_R_32F, 2,
                                 &zero, C, CUDA_R_32F, 2, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                     NS);
    ck_assert_int_eq(blas.GemmEx(handle, N, N, 2, 2, 2, &one, A, CUDA_R_32F, 2, B, CUDA_R_32F, 2,
                                 &zero, C, CUDA_R_64F, 2, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                     NS);
    ck_assert_int_eq(blas.GemmEx(handle, N, N, 2, 2, 2, &one, A, CUDA_R_32F, 2, B, CUDA_R_32F, 2,
                                 &zero, C, CUDA_R_32F, 2, CUBLAS_COMPUTE_64F, CUBLAS_GEMM_DEFAULT),
                     NS);
    ck_assert_int_eq(blas.GemmEx(handle, N, N, 2, 2, 2, &one, A, CUDA_R_32F, 2, B, CUDA_R_32F, 2,
                                 &zero, C, CUDA_R_32F, 2, CUBLAS_COMPUTE_32F_FAST_16F,
                                 CUBLAS_GEMM_DEFAULT),
                     NS);
    ck_assert_int_eq(blas.GemmEx(handle, N, N, 2, 2, 2, &one, A, CUDA_R_32F, 2, B, CUDA_R_32F, 2,
                                 &zero, C, CUDA_R_32F, 2, CUBLAS_COMPUTE_32F,
                                 (cublasGemmAlgo_t)1234),
                     NS);
    ck_assert_int_eq(blas.GemmEx(handle, N, N, 2, -2, 2, &one, A, CUDA_R_32F, 2, B, CUDA_R_32F, 2,
                                 &zero, C, CUDA_R_32F, 2, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                     IV);
    ck_assert_int_eq(blas.GemmStridedEx(handle, N, N, 2, 2, 2, &one, A, CUDA_R_32F, 2, 4, B,
                                        CUDA_R_16BF, 2, 4, &zero, C, CUDA_R_32F, 2, 4, 1,
                                        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                     NS);
    ck_assert_int_eq(blas.GemmBatchedEx(handle, N, N, 2, 2, 2, &one, arr, CUDA_R_32F, 2, arr,
                                        CUDA_R_32F, 2, &zero, (void *const *)arr, CUDA_R_32F, 2, 1,
                                        CUBLAS_COMPUTE_32I, CUBLAS_GEMM_DEFAULT),
                     NS);
    ck_assert_uint_eq(fakecuda_call_count("cuLaunchKernel"), launches);

    /* The handle calls. */
    cublasHandle_t none = NULL;
    cudaStream_t s = NULL;
    cublasPointerMode_t mode = CUBLAS_POINTER_MODE_DEVICE;
    int version = 0;
    ck_assert_int_eq(blas.Create(NULL), IV);
    ck_assert_int_eq(blas.Destroy(none), NI);
    ck_assert_int_eq(blas.SetStream(none, NULL), NI);
    ck_assert_int_eq(blas.GetStream(handle, NULL), IV);
    ck_assert_int_eq(blas.GetStream(handle, &s), CUBLAS_STATUS_SUCCESS);
    ck_assert_ptr_eq(s, (cudaStream_t)stream);
    ck_assert_int_eq(blas.GetVersion(handle, &version), CUBLAS_STATUS_SUCCESS);
    ck_assert_int_eq(version, CUBLAS_VERSION);
    ck_assert_int_eq(blas.SetPointerMode(handle, CUBLAS_POINTER_MODE_DEVICE), NS);
    ck_assert_int_eq(blas.SetPointerMode(handle, (cublasPointerMode_t)5), IV);
    ck_assert_int_eq(blas.SetPointerMode(handle, CUBLAS_POINTER_MODE_HOST), CUBLAS_STATUS_SUCCESS);
    ck_assert_int_eq(blas.GetPointerMode(handle, &mode), CUBLAS_STATUS_SUCCESS);
    ck_assert_int_eq(mode, CUBLAS_POINTER_MODE_HOST);
    ck_assert_str_eq(blas.GetStatusName(NS), "CUBLAS_STATUS_NOT_SUPPORTED");
    ck_assert_ptr_nonnull(blas.GetStatusString(IV));
    ck_assert_int_eq(cuMemFree(d), CUDA_SUCCESS);
}
END_TEST

/* ---- launches -------------------------------------------------------------------------------- */

/* Each computing call is exactly one launch, on the handle's stream: captured on that stream it
 * is a graph of one kernel node, and the stream set later is the one used. An empty problem
 * (m or n or the batch count 0) launches nothing; k == 0 still scales C by beta. */
START_TEST(test_each_call_is_one_launch_on_the_handle_stream) {
    float one = 1.0f, half = 0.5f, c0[4] = {2.0f, 4.0f, 6.0f, 8.0f}, c[4];
    CUdeviceptr d = dev_from(c0, sizeof c0), pa;
    ck_assert_int_eq(cuMemAlloc(&pa, 3 * sizeof(CUdeviceptr)), CUDA_SUCCESS);
    CUdeviceptr ptrs[3] = {d, d, d};
    ck_assert_int_eq(cuMemcpyHtoD(pa, ptrs, sizeof ptrs), CUDA_SUCCESS);
    const float *A = (const float *)d;
    float *C = (float *)d;
    const void *const *arr = (const void *const *)pa;
    CUstream other;
    ck_assert_int_eq(cuStreamCreate(&other, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    ck_assert_int_eq(blas.SetStream(handle, (cudaStream_t)other), CUBLAS_STATUS_SUCCESS);
    const cublasOperation_t N = CUBLAS_OP_N;
    for (int form = F_SGEMM; form <= F_BATCHED_EX; form++) {
        ck_assert_int_eq(cuStreamBeginCapture(other, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
        cublasStatus_t st = CUBLAS_STATUS_INTERNAL_ERROR;
        switch (form) {
        case F_SGEMM:
            st = blas.Sgemm(handle, N, N, 1, 1, 1, &one, A, 1, A, 1, &half, C, 1);
            break;
        case F_EX:
            st = blas.GemmEx(handle, N, N, 1, 1, 1, &one, A, CUDA_R_32F, 1, A, CUDA_R_32F, 1, &half,
                             C, CUDA_R_32F, 1, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
            break;
        case F_STRIDED:
            st =
                blas.SgemmStrided(handle, N, N, 1, 1, 1, &one, A, 1, 0, A, 1, 0, &half, C, 1, 1, 3);
            break;
        case F_STRIDED_EX:
            st = blas.GemmStridedEx(handle, N, N, 1, 1, 1, &one, A, CUDA_R_32F, 1, 0, A, CUDA_R_32F,
                                    1, 0, &half, C, CUDA_R_32F, 1, 1, 3, CUBLAS_COMPUTE_32F,
                                    CUBLAS_GEMM_DEFAULT);
            break;
        case F_BATCHED:
            st = blas.SgemmBatched(handle, N, N, 1, 1, 1, &one, (const float *const *)arr, 1,
                                   (const float *const *)arr, 1, &half, (float *const *)arr, 1, 3);
            break;
        case F_BATCHED_EX:
            st = blas.GemmBatchedEx(handle, N, N, 1, 1, 1, &one, arr, CUDA_R_32F, 1, arr,
                                    CUDA_R_32F, 1, &half, (void *const *)arr, CUDA_R_32F, 1, 3,
                                    CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
            break;
        }
        ck_assert_int_eq(st, CUBLAS_STATUS_SUCCESS);
        CUgraph g;
        size_t nodes = 0;
        ck_assert_int_eq(cuStreamEndCapture(other, &g), CUDA_SUCCESS);
        ck_assert_int_eq(cuGraphGetNodes(g, NULL, &nodes), CUDA_SUCCESS);
        ck_assert_msg(nodes == 1, "form %d: %zu nodes captured on the handle's stream", form,
                      nodes);
        CUgraphNode node;
        CUgraphNodeType type;
        nodes = 1;
        ck_assert_int_eq(cuGraphGetNodes(g, &node, &nodes), CUDA_SUCCESS);
        ck_assert_int_eq(cuGraphNodeGetType(node, &type), CUDA_SUCCESS);
        ck_assert_int_eq(type, CU_GRAPH_NODE_TYPE_KERNEL);
        ck_assert_int_eq(cuGraphDestroy(g), CUDA_SUCCESS);
    }
    /* Empty problems launch nothing and leave C alone; k == 0 is C = beta * C, one launch. */
    uint64_t launches = fakecuda_call_count("cuLaunchKernel");
    ck_assert_int_eq(blas.Sgemm(handle, N, N, 0, 4, 1, &one, A, 1, A, 1, &half, C, 1),
                     CUBLAS_STATUS_SUCCESS);
    ck_assert_int_eq(blas.Sgemm(handle, N, N, 4, 0, 1, &one, A, 4, A, 1, &half, C, 4),
                     CUBLAS_STATUS_SUCCESS);
    ck_assert_int_eq(
        blas.SgemmStrided(handle, N, N, 1, 1, 1, &one, A, 1, 0, A, 1, 0, &half, C, 1, 1, 0),
        CUBLAS_STATUS_SUCCESS);
    ck_assert_uint_eq(fakecuda_call_count("cuLaunchKernel"), launches);
    ck_assert_int_eq(blas.Sgemm(handle, N, N, 4, 1, 0, &one, A, 4, A, 1, &half, C, 4),
                     CUBLAS_STATUS_SUCCESS);
    ck_assert_uint_eq(fakecuda_call_count("cuLaunchKernel"), launches + 1);
    ck_assert_int_eq(cuStreamSynchronize(other), CUDA_SUCCESS);
    ck_assert_int_eq(cuMemcpyDtoH(c, d, sizeof c), CUDA_SUCCESS);
    for (int i = 0; i < 4; i++)
        ck_assert_msg(c[i] == 0.5f * c0[i], "k == 0: C[%d] = %g, not beta * C", i, (double)c[i]);
    ck_assert_int_eq(blas.SetStream(handle, (cudaStream_t)stream), CUBLAS_STATUS_SUCCESS);
    ck_assert_int_eq(cuStreamDestroy(other), CUDA_SUCCESS);
    cuMemFree(pa), cuMemFree(d);
}
END_TEST

/* The same call twice gives the same bits (a fixed accumulation order). */
START_TEST(test_results_repeat_bit_for_bit) {
    problem_t p;
    problem_init(&p, F_BATCHED_EX, 1, 0, 3, 0.75f, 0.5f);
    size_t n = p.nc * p.batch;
    float *c1 = malloc(n * sizeof(float)), *c2 = malloc(n * sizeof(float));
    problem_run(&p, c1);
    problem_run(&p, c2);
    ck_assert(memcmp(c1, c2, n * sizeof(float)) == 0);
    free(c1), free(c2);
    problem_fini(&p);
}
END_TEST

/* The pointer arrays are device memory, as cuBLAS defines them: the kernel reads the operands'
 * addresses there. Host arrays are accepted at the call (the library does not read them) and
 * fault the kernel, as on a GPU. */
START_TEST(test_pointer_arrays_are_read_from_device_memory) {
    float one = 1.0f, zero = 0.0f, v = 3.0f;
    CUdeviceptr d = dev_from(&v, sizeof v);
    const void *host[1] = {(const void *)d};
    void *host_c[1] = {(void *)d};
    ck_assert_int_eq(blas.GemmBatchedEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 1, &one, host,
                                        CUDA_R_32F, 1, host, CUDA_R_32F, 1, &zero, host_c,
                                        CUDA_R_32F, 1, 1, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                     CUBLAS_STATUS_SUCCESS);
    ck_assert_int_eq(cuStreamSynchronize(stream), CUDA_ERROR_ILLEGAL_ADDRESS);
    fakecuda_stats_t st;
    fakecuda_get_stats(&st);
    ck_assert_uint_ge(st.illegal_accesses, 1);
}
END_TEST

Suite *suite_cublas(void);
Suite *suite_cublas(void) {
    Suite *s = suite_create("cublas");
    TCase *tc = tcase_create("gemm");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 30);
    tcase_add_loop_test(tc, test_gemm_matches_reference, 0, 8);
    tcase_add_loop_test(tc, test_strided_batched_gemm_matches_reference, 0, 8);
    tcase_add_loop_test(tc, test_pointer_array_gemm_matches_reference, 0, 8);
    tcase_add_test(tc, test_results_repeat_bit_for_bit);
    suite_add_tcase(s, tc);
    tc = tcase_create("strict");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, test_bad_arguments_give_documented_statuses);
    tcase_add_test(tc, test_each_call_is_one_launch_on_the_handle_stream);
    suite_add_tcase(s, tc);
    /* A faulted context cannot be torn down cleanly: no teardown (the child exits). */
    tc = tcase_create("fault");
    tcase_add_checked_fixture(tc, setup, NULL);
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, test_pointer_arrays_are_read_from_device_memory);
    suite_add_tcase(s, tc);
    return s;
}
