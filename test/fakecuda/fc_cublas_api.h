/* SPDX-License-Identifier: MIT */
/* fc_cublas_api.h: cublas_api.h, included from C11 under this project's warnings.
 *
 * cublas_api.h pulls in cuda_fp16.h and cuda_bf16.h, which test __cplusplus and _MSC_FULL_VER in
 * #if lines that -Wundef rejects; nothing else in them is excused. The simulated cuBLAS
 * (cublas.c), its tests and the workloads include the API through this header only. */
#ifndef FC_CUBLAS_API_H
#define FC_CUBLAS_API_H

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wundef"
#include <cublas_api.h>
#pragma GCC diagnostic pop

#endif
