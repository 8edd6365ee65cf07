/* SPDX-License-Identifier: MIT */
/* wl_dnn.h: the workloads' access to cuDNN, opened at run time as frameworks open it.
 *
 * wl_dnn_init dlopens "libcudnn.so.9" (the simulated one under scripts/with-fakecuda) and
 * resolves the legacy calls with dlsym, typed from cudnn.h. wl_dnn_check turns a failed call
 * into `error: <function>: <status name> (<code>)` and exit status 2. */
#ifndef WL_DNN_H
#define WL_DNN_H

#include <cudnn.h>

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
} wl_dnn_t;

extern wl_dnn_t wl_dnn;

/* Opens libcudnn.so.9 and resolves wl_dnn; exits 2 when either fails. */
void wl_dnn_init(void);

/* Exits 2 with the status's name unless st is CUDNN_STATUS_SUCCESS. */
void wl_dnn_check(cudnnStatus_t st, const char *fn);

#endif
