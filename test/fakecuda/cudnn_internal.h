/* SPDX-License-Identifier: MIT */
/* cudnn_internal.h: what the two files of the simulated libcudnn.so.9 share.
 *
 * cudnn.c (the legacy API, handles, the driver table) and cudnn_backend.c (the backend graph
 * API) both launch the kernels of module "cudnn" through the handle and reach the driver only
 * through dnn_drv, resolved once with cuGetProcAddress (dnn_driver_init, under dnn_drv.once).
 * Everything here has hidden visibility: only the cudnn* entry points are exported. */
#ifndef CUDNN_INTERNAL_H
#define CUDNN_INTERNAL_H

#include "fc_cudnn.h"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cudnn.h>
#include <pthread.h>
#include <stdint.h>

#define DNN_API __attribute__((visibility("default")))

/* The kernels a handle loads, in the order of cudnn.c's kernel_names. */
enum {
    K_CONV_FWD,
    K_CONV_BWD_DATA,
    K_CONV_BWD_FILTER,
    K_BN_FWD,
    K_BN_BWD,
    K_CONV_FWD_TABLE,
    K_COUNT
};

struct cudnnContext {
    CUstream stream;
    CUmodule module;
    CUfunction fn[K_COUNT];
};

/* The driver entry points, resolved once; ok is set when all of them were found. */
typedef struct dnn_driver {
    pthread_once_t once;
    int ok;
    PFN_cuCtxGetCurrent_v4000 ctx_get_current;
    PFN_cuModuleLoadData_v2000 module_load_data;
    PFN_cuModuleGetFunction_v2000 module_get_function;
    PFN_cuModuleUnload_v2000 module_unload;
    PFN_cuLaunchKernel_v4000 launch_kernel;
    PFN_cuMemcpyHtoDAsync_v3020 memcpy_htod_async;
    PFN_cuMemGetAddressRange_v3020 mem_get_address_range;
} dnn_driver_t;

extern dnn_driver_t dnn_drv;

/* Opens libcuda.so.1 and fills dnn_drv; run it through pthread_once(&dnn_drv.once, ...). */
void dnn_driver_init(void);

/* Output extent of one spatial dimension, or <= 0 when the filter does not fit. */
int dnn_out_dim(int in, int pad, int filt, int dil, int stride);

/* Launches kernel k of handle h with the argument pointers on the handle's stream, with a grid
 * sized as a real kernel's would be for `elems` outputs. */
cudnnStatus_t dnn_launch(cudnnHandle_t h, int k, uint64_t elems, void **args);

#endif
