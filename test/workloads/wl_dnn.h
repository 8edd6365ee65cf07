/* SPDX-License-Identifier: MIT */
/* wl_dnn.h: the workloads' access to cuDNN, opened at run time as frameworks open it.
 *
 * wl_dnn_init dlopens "libcudnn.so.9" (the simulated one under scripts/with-fakecuda) and
 * resolves the legacy calls and the backend (graph) API with dlsym, typed from cudnn.h.
 * wl_dnn_check turns a failed call into `error: <function>: <status name> (<code>)` and exit
 * status 2. wl_dnn_conv_plan_* run a convolution forward through the backend API as frameworks
 * do: an execution plan built once per layer and input shape and kept, a variant pack per
 * call. */
#ifndef WL_DNN_H
#define WL_DNN_H

#include <cuda.h>
#include <cudnn.h>
#include <stddef.h>

typedef struct wl_dnn {
    __typeof__(&cudnnGetVersion) GetVersion;
    __typeof__(&cudnnGetErrorString) GetErrorString;
    __typeof__(&cudnnCreate) Create;
    __typeof__(&cudnnDestroy) Destroy;
    __typeof__(&cudnnSetStream) SetStream;
    __typeof__(&cudnnCreateTensorDescriptor) CreateTensorDescriptor;
    __typeof__(&cudnnSetTensor4dDescriptor) SetTensor4dDescriptor;
    __typeof__(&cudnnDestroyTensorDescriptor) DestroyTensorDescriptor;
    __typeof__(&cudnnCreateFilterDescriptor) CreateFilterDescriptor;
    __typeof__(&cudnnSetFilter4dDescriptor) SetFilter4dDescriptor;
    __typeof__(&cudnnDestroyFilterDescriptor) DestroyFilterDescriptor;
    __typeof__(&cudnnCreateConvolutionDescriptor) CreateConvolutionDescriptor;
    __typeof__(&cudnnSetConvolution2dDescriptor) SetConvolution2dDescriptor;
    __typeof__(&cudnnDestroyConvolutionDescriptor) DestroyConvolutionDescriptor;
    __typeof__(&cudnnGetConvolution2dForwardOutputDim) GetConvolution2dForwardOutputDim;
    __typeof__(&cudnnGetConvolutionForwardWorkspaceSize) GetConvolutionForwardWorkspaceSize;
    __typeof__(&cudnnGetConvolutionBackwardDataWorkspaceSize)
        GetConvolutionBackwardDataWorkspaceSize;
    __typeof__(&cudnnGetConvolutionBackwardFilterWorkspaceSize)
        GetConvolutionBackwardFilterWorkspaceSize;
    __typeof__(&cudnnConvolutionForward) ConvolutionForward;
    __typeof__(&cudnnConvolutionBackwardData) ConvolutionBackwardData;
    __typeof__(&cudnnConvolutionBackwardFilter) ConvolutionBackwardFilter;
    __typeof__(&cudnnDeriveBNTensorDescriptor) DeriveBNTensorDescriptor;
    __typeof__(&cudnnBatchNormalizationForwardTraining) BatchNormalizationForwardTraining;
    __typeof__(&cudnnBatchNormalizationBackward) BatchNormalizationBackward;
    __typeof__(&cudnnBackendCreateDescriptor) BackendCreateDescriptor;
    __typeof__(&cudnnBackendDestroyDescriptor) BackendDestroyDescriptor;
    __typeof__(&cudnnBackendSetAttribute) BackendSetAttribute;
    __typeof__(&cudnnBackendGetAttribute) BackendGetAttribute;
    __typeof__(&cudnnBackendFinalize) BackendFinalize;
    __typeof__(&cudnnBackendExecute) BackendExecute;
} wl_dnn_t;

/* A finalized execution plan for one convolution forward (float, NCHW, cross-correlation,
 * square padding and stride, no dilation) on one input shape, and the workspace it asks for. */
typedef struct wl_dnn_conv_plan {
    cudnnBackendDescriptor_t plan;
    size_t workspace_bytes;
    int n, c, h, w; /* the input shape it runs */
} wl_dnn_conv_plan_t;

extern wl_dnn_t wl_dnn;

/* Opens libcudnn.so.9 and resolves wl_dnn; exits 2 when either fails. */
void wl_dnn_init(void);

/* Exits 2 with the status's name unless st is CUDNN_STATUS_SUCCESS. */
void wl_dnn_check(cudnnStatus_t st, const char *fn);

/* Builds the plan of y = conv(x, w) on handle h: x is n x c x hh x ww, the filter k x c x r x r,
 * y n x k x p x q. The caller owns the plan (wl_dnn_conv_plan_free). Exits 2 on a failure. */
void wl_dnn_conv_plan_build(wl_dnn_conv_plan_t *cp, cudnnHandle_t h, int n, int c, int hh, int ww,
                            int k, int r, int pad, int stride, int p, int q);

/* Runs the plan on h's stream with a variant pack made for this call (alpha 1, beta 0):
 * x, w, y and a workspace of at least cp->workspace_bytes, which must stay allocated until the
 * work has run. Two driver ops: the library's table copy and its kernel. */
void wl_dnn_conv_plan_run(const wl_dnn_conv_plan_t *cp, cudnnHandle_t h, CUdeviceptr x,
                          CUdeviceptr w, CUdeviceptr y, CUdeviceptr workspace);

void wl_dnn_conv_plan_free(wl_dnn_conv_plan_t *cp);

#endif
