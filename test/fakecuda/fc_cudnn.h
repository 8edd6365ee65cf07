/* SPDX-License-Identifier: MIT */
/* fc_cudnn.h: the parameter layouts shared by the simulated cuDNN (cudnn.c) and its kernels.
 *
 * The simulated libcudnn.so.9 computes on the simulated device by launching the kernels of
 * module "cudnn" (kernels_cudnn.c) through the driver API, one launch per cuDNN call. A
 * convolution's geometry travels as one by-value parameter, as real cuDNN kernels take their
 * problem descriptions. */
#ifndef FC_CUDNN_H
#define FC_CUDNN_H

/* Module image for cuModuleLoadData. */
#define FC_CUDNN_MODULE "FAKECUDA-MODULE:cudnn"

#include <stdint.h>

/* One 2-D convolution over NCHW float tensors: input n x c x h x w, filter k x c x r x s
 * (KCRS), output n x k x p x q. cross != 0 is cross-correlation (CUDNN_CROSS_CORRELATION);
 * cross == 0 flips the filter (CUDNN_CONVOLUTION). All tensors are fully packed. */
typedef struct fc_conv_geom {
    int n, c, h, w;
    int k, r, s;
    int p, q;
    int pad_h, pad_w;
    int str_h, str_w;
    int dil_h, dil_w;
    int cross;
} fc_conv_geom_t;

/* The operand table of a backend-API convolution forward (cudnnBackendExecute): the library
 * copies it into the variant pack's workspace on the handle's stream, and the kernel reads it
 * from device memory there, so the operands' addresses are in no kernel parameter. x, w, y are
 * device addresses (CUdeviceptr). */
typedef struct fc_conv_table {
    uint64_t x, w, y;
    fc_conv_geom_t geom;
    float alpha, beta;
} fc_conv_table_t;

/* The workspace an execution plan asks for: room for the table, rounded as allocators round. */
#define FC_CONV_TABLE_BYTES 256

/* Kernel signatures (parameter order), module "cudnn":
 *   conv_fwd_f32(x, w, y, geom, float alpha, float beta)
 *   conv_fwd_table_f32(workspace)   (reads an fc_conv_table_t at workspace)
 *   conv_bwd_data_f32(w, dy, dx, geom, float alpha, float beta)
 *   conv_bwd_filter_f32(x, dy, dw, geom, float alpha, float beta)
 *   bn_fwd_train_f32(x, y, scale, bias, run_mean, run_var, save_mean, save_inv_std,
 *                    int n, int c, int hw, double factor, double eps, float alpha, float beta)
 *   bn_bwd_f32(x, dy, dx, scale, dscale, dbias, save_mean, save_inv_std, int n, int c, int hw,
 *              double eps, float alpha_data, float beta_data, float alpha_param,
 *              float beta_param)
 * Pointers are CUdeviceptr. The optional batch-norm pointers (run_*, save_*) may be 0. Every
 * output is blended as alpha * result + beta * old, and beta == 0 means the old value is not
 * read. */

#endif
