/* SPDX-License-Identifier: MIT */
/* wl_blas.h: the workloads' access to cuBLAS, opened at run time as frameworks open it.
 *
 * wl_blas_init dlopens "libcublas.so.13" (the simulated one under scripts/with-fakecuda),
 * resolves the calls it uses with dlsym, typed from cublas_api.h, and creates one handle on the
 * program's stream. wl_blas_gemm is wl_gemm's row-major GEMM sent through cuBLAS (column-major:
 * C^T = op(B)^T op(A)^T), either as cublasGemmEx or as a cublasGemmBatchedEx of one member whose
 * pointer arrays are temporaries in device memory. A failed call prints
 * `error: <function>: <status name> (<code>)` and exits 2. Single-threaded. */
#ifndef WL_BLAS_H
#define WL_BLAS_H

#include "wl.h"

/* How wl_blas_gemm issues a GEMM. */
typedef enum wl_blas_mode {
    WL_BLAS_OFF,     /* not at all: the program uses module nn's gemm_f32 (wl_gemm) */
    WL_BLAS_EX,      /* cublasGemmEx: one launch */
    WL_BLAS_BATCHED, /* cublasGemmBatchedEx, batchCount 1: three cuMemAlloc'd 8-byte arrays,
                        each filled with cuMemcpyHtoD, one launch, three cuMemFree */
    WL_BLAS_STAGED,  /* the same, but each array first gets a decoy address (another operand)
                        from the host, then its real one by a device-to-device copy from a
                        staging array filled from the host */
    WL_BLAS_OPAQUE,  /* as staged, and a kernel reads each staging array (relu into scratch)
                        before the copy: what the array holds is no longer known on the host */
} wl_blas_mode_t;

/* Opens libcublas.so.13, creates the handle and sets its stream to s; a current context is
 * needed. Exits 2 on a failure. */
void wl_blas_init(wl_blas_mode_t mode, CUstream s);
void wl_blas_fini(void);

/* Row-major C = alpha*op(A)*op(B) + beta*C, as wl_gemm, on the handle's stream. Counts the ops
 * it issues: one launch, and the pointer arrays' copies (and kernels) in the batched modes. */
void wl_blas_gemm(int ta, int tb, int m, int n, int k, float alpha, CUdeviceptr a, int lda,
                  CUdeviceptr b, int ldb, float beta, CUdeviceptr c, int ldc);

#endif
