/* SPDX-License-Identifier: MIT */
/* wl_dnn.c: opens cuDNN at run time (dlopen "libcudnn.so.9") and resolves its calls with dlsym.
 *
 * The library handle stays open for the life of the process, as frameworks keep it. Only the
 * cnn workload calls wl_dnn_init; the others never load cuDNN. Single-threaded. */
#include "wl_dnn.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

wl_dnn_t wl_dnn;

void wl_dnn_check(cudnnStatus_t st, const char *fn) {
    if (st == CUDNN_STATUS_SUCCESS)
        return;
    fprintf(stderr, "error: %s: %s (%d)\n", fn,
            wl_dnn.GetErrorString ? wl_dnn.GetErrorString(st) : "CUDNN_STATUS_UNKNOWN", (int)st);
    exit(2);
}

void wl_dnn_init(void) {
    void *lib = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "error: dlopen: %s\n", dlerror());
        exit(2);
    }
#define R(field, name)                                                                             \
    do {                                                                                           \
        *(void **)&wl_dnn.field = dlsym(lib, name);                                                \
        if (!wl_dnn.field) {                                                                       \
            fprintf(stderr, "error: dlsym: %s not in libcudnn.so.9\n", name);                      \
            exit(2);                                                                               \
        }                                                                                          \
    } while (0)
    R(GetVersion, "cudnnGetVersion");
    R(GetErrorString, "cudnnGetErrorString");
    R(Create, "cudnnCreate");
    R(Destroy, "cudnnDestroy");
    R(SetStream, "cudnnSetStream");
    R(CreateTensorDescriptor, "cudnnCreateTensorDescriptor");
    R(SetTensor4dDescriptor, "cudnnSetTensor4dDescriptor");
    R(DestroyTensorDescriptor, "cudnnDestroyTensorDescriptor");
    R(CreateFilterDescriptor, "cudnnCreateFilterDescriptor");
    R(SetFilter4dDescriptor, "cudnnSetFilter4dDescriptor");
    R(DestroyFilterDescriptor, "cudnnDestroyFilterDescriptor");
    R(CreateConvolutionDescriptor, "cudnnCreateConvolutionDescriptor");
    R(SetConvolution2dDescriptor, "cudnnSetConvolution2dDescriptor");
    R(DestroyConvolutionDescriptor, "cudnnDestroyConvolutionDescriptor");
    R(GetConvolution2dForwardOutputDim, "cudnnGetConvolution2dForwardOutputDim");
    R(GetConvolutionForwardWorkspaceSize, "cudnnGetConvolutionForwardWorkspaceSize");
    R(GetConvolutionBackwardDataWorkspaceSize, "cudnnGetConvolutionBackwardDataWorkspaceSize");
    R(GetConvolutionBackwardFilterWorkspaceSize, "cudnnGetConvolutionBackwardFilterWorkspaceSize");
    R(ConvolutionForward, "cudnnConvolutionForward");
    R(ConvolutionBackwardData, "cudnnConvolutionBackwardData");
    R(ConvolutionBackwardFilter, "cudnnConvolutionBackwardFilter");
    R(DeriveBNTensorDescriptor, "cudnnDeriveBNTensorDescriptor");
    R(BatchNormalizationForwardTraining, "cudnnBatchNormalizationForwardTraining");
    R(BatchNormalizationBackward, "cudnnBatchNormalizationBackward");
#undef R
}
