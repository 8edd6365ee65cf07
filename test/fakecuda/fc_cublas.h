/* SPDX-License-Identifier: MIT */
/* fc_cublas.h: the parameter layouts shared by the simulated cuBLAS (cublas.c) and its kernels.
 *
 * The simulated libcublas.so.13 computes on the simulated device by launching the kernels of
 * module "cublas" (kernels_cublas.c) through the driver API, one launch per cuBLAS call. A GEMM's
 * shape, scalars and batch strides travel as one by-value parameter, as real cuBLAS kernels take
 * their problem descriptions; the operands travel as pointer parameters, or, for the
 * pointer-array (*Batched) forms, only the three arrays do. */
#ifndef FC_CUBLAS_H
#define FC_CUBLAS_H

/* Module image for cuModuleLoadData. */
#define FC_CUBLAS_MODULE "FAKECUDA-MODULE:cublas"

#include <stdint.h>

/* One column-major float GEMM, C = alpha * op(A) * op(B) + beta * C, repeated `batch` times:
 * op(A) is m x k (A stored m x k when ta == 0, k x m when ta != 0, leading dimension lda), op(B)
 * k x n (likewise with tb and ldb), C m x n with ldc. The strides (in elements) step from one
 * batch member to the next in the strided form and are 0 otherwise. beta == 0 means C is not
 * read, as in BLAS. */
typedef struct fc_gemm_geom {
    int64_t stride_a, stride_b, stride_c;
    int ta, tb;
    int m, n, k;
    int lda, ldb, ldc;
    int batch;
    float alpha, beta;
} fc_gemm_geom_t;

/* Kernel signatures (parameter order), module "cublas":
 *   gemm_f32(A, B, C, geom)               (plain and strided-batched GEMMs)
 *   gemm_batched_f32(Aarray, Barray, Carray, geom)
 * Pointers are CUdeviceptr. The arrays of gemm_batched_f32 hold geom.batch device addresses each
 * and are read from device memory by the kernel, so the operands' addresses are in no kernel
 * parameter. Each output element is a float dot product over p = 0..k-1 in order, then
 * alpha * acc (+ beta * C): the arithmetic of module nn's gemm_f32 whenever alpha is 1 and beta
 * 0, so the two give the same bits there. */

#endif
