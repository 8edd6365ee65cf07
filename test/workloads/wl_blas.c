/* SPDX-License-Identifier: MIT */
/* wl_blas.c: opens cuBLAS at run time (dlopen "libcublas.so.13") and resolves its calls with
 * dlsym; runs the workloads' GEMMs through it (wl_blas_gemm).
 *
 * The library handle stays open for the life of the process, as frameworks keep it. Only mlp
 * with --cublas or --cublas-batched calls wl_blas_init; the others never load cuBLAS. The
 * batched modes allocate their three pointer arrays per call and free them after it, as a
 * framework's temporaries (cuMemFree waits for the GEMM). Single-threaded. */
#include "wl_blas.h"

#include "fc_cublas_api.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

static struct {
    __typeof__(&cublasGetStatusName) GetStatusName;
    __typeof__(&cublasCreate_v2) Create;
    __typeof__(&cublasDestroy_v2) Destroy;
    __typeof__(&cublasSetStream_v2) SetStream;
    __typeof__(&cublasGemmEx) GemmEx;
    __typeof__(&cublasGemmBatchedEx) GemmBatchedEx;
} fn;

static wl_blas_mode_t blas_mode;
static cublasHandle_t handle;
static CUstream blas_stream;

static void check(cublasStatus_t st, const char *what) {
    if (st == CUBLAS_STATUS_SUCCESS)
        return;
    fprintf(stderr, "error: %s: %s (%d)\n", what,
            fn.GetStatusName ? fn.GetStatusName(st) : "CUBLAS_STATUS_UNKNOWN", (int)st);
    exit(2);
}

void wl_blas_init(wl_blas_mode_t mode, CUstream s) {
    void *lib = dlopen("libcublas.so.13", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "error: dlopen: %s\n", dlerror());
        exit(2);
    }
#define R(field, name)                                                                             \
    do {                                                                                           \
        *(void **)&fn.field = dlsym(lib, name);                                                    \
        if (!fn.field) {                                                                           \
            fprintf(stderr, "error: dlsym: %s not in libcublas.so.13\n", name);                    \
            exit(2);                                                                               \
        }                                                                                          \
    } while (0)
    R(GetStatusName, "cublasGetStatusName");
    R(Create, "cublasCreate_v2");
    R(Destroy, "cublasDestroy_v2");
    R(SetStream, "cublasSetStream_v2");
    R(GemmEx, "cublasGemmEx");
    R(GemmBatchedEx, "cublasGemmBatchedEx");
#undef R
    blas_mode = mode;
    blas_stream = s;
    check(fn.Create(&handle), "cublasCreate_v2");
    check(fn.SetStream(handle, (cudaStream_t)s), "cublasSetStream_v2");
}

void wl_blas_fini(void) {
    check(fn.Destroy(handle), "cublasDestroy_v2");
    handle = NULL;
}

/* A one-element pointer array in device memory holding p (an allocation and counted copies): in
 * WL_BLAS_STAGED and WL_BLAS_OPAQUE modes it first holds `decoy`, then p copied on the device
 * from a staging array (read by a kernel first in WL_BLAS_OPAQUE mode). */
static CUdeviceptr ptr_array(CUdeviceptr p, CUdeviceptr decoy) {
    CUdeviceptr arr = wl_alloc(sizeof p);
    if (blas_mode == WL_BLAS_BATCHED) {
        wl_h2d_sync(arr, &p, sizeof p);
        return arr;
    }
    wl_h2d_sync(arr, &decoy, sizeof decoy);
    CUdeviceptr staging = wl_alloc(sizeof p);
    wl_h2d_sync(staging, &p, sizeof p);
    if (blas_mode == WL_BLAS_OPAQUE) {
        CUdeviceptr scratch = wl_alloc(sizeof p);
        wl_relu(blas_stream, staging, scratch, sizeof p / sizeof(float));
        wl_free(scratch);
    }
    wl_d2d(arr, staging, sizeof p, blas_stream);
    wl_free(staging);
    return arr;
}

void wl_blas_gemm(int ta, int tb, int m, int n, int k, float alpha, CUdeviceptr a, int lda,
                  CUdeviceptr b, int ldb, float beta, CUdeviceptr c, int ldc) {
    /* Row-major C (m x n) is column-major C^T (n x m) = op(B)^T (n x k) * op(A)^T (k x m): B's
     * row-major storage is op(B)^T's column-major storage when tb is 0, likewise for A. */
    cublasOperation_t opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N, opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    if (blas_mode == WL_BLAS_EX) {
        check(fn.GemmEx(handle, opb, opa, n, m, k, &alpha, (const void *)b, CUDA_R_32F, ldb,
                        (const void *)a, CUDA_R_32F, lda, &beta, (void *)c, CUDA_R_32F, ldc,
                        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
              "cublasGemmEx");
        wl_ops_add(1);
        return;
    }
    CUdeviceptr arr_b = ptr_array(b, c), arr_a = ptr_array(a, c), arr_c = ptr_array(c, a);
    check(fn.GemmBatchedEx(handle, opb, opa, n, m, k, &alpha, (const void *const *)arr_b,
                           CUDA_R_32F, ldb, (const void *const *)arr_a, CUDA_R_32F, lda, &beta,
                           (void *const *)arr_c, CUDA_R_32F, ldc, 1, CUBLAS_COMPUTE_32F,
                           CUBLAS_GEMM_DEFAULT),
          "cublasGemmBatchedEx");
    wl_ops_add(1);
    wl_free(arr_b);
    wl_free(arr_a);
    wl_free(arr_c);
}
