/* SPDX-License-Identifier: MIT */
/* wl_dnn.c: opens cuDNN at run time (dlopen "libcudnn.so.9") and resolves its calls with dlsym;
 * builds and runs backend-API convolution plans (wl_dnn_conv_plan_*).
 *
 * The library handle stays open for the life of the process, as frameworks keep it. Only the
 * cnn workload calls wl_dnn_init; the others never load cuDNN. A plan is built from temporary
 * descriptors (tensors, convolution, operation, graph, engine, engine config) that are destroyed
 * once the plan is finalized: the library copies what it needs. Single-threaded. */
#include "wl_dnn.h"

#include <dlfcn.h>
#include <stdint.h>
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
    R(BackendCreateDescriptor, "cudnnBackendCreateDescriptor");
    R(BackendDestroyDescriptor, "cudnnBackendDestroyDescriptor");
    R(BackendSetAttribute, "cudnnBackendSetAttribute");
    R(BackendGetAttribute, "cudnnBackendGetAttribute");
    R(BackendFinalize, "cudnnBackendFinalize");
    R(BackendExecute, "cudnnBackendExecute");
#undef R
}

/* ---- the backend API ------------------------------------------------------------------------ */

enum { UID_X = 1, UID_W = 2, UID_Y = 3 };

static cudnnBackendDescriptor_t bk_new(cudnnBackendDescriptorType_t type) {
    cudnnBackendDescriptor_t d = NULL;
    wl_dnn_check(wl_dnn.BackendCreateDescriptor(type, &d), "cudnnBackendCreateDescriptor");
    return d;
}

static void bk_set(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                   cudnnBackendAttributeType_t type, int64_t n, const void *v) {
    wl_dnn_check(wl_dnn.BackendSetAttribute(d, name, type, n, v), "cudnnBackendSetAttribute");
}

static void bk_set_desc(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                        cudnnBackendDescriptor_t v) {
    bk_set(d, name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &v);
}

static void bk_finalize(cudnnBackendDescriptor_t d) {
    wl_dnn_check(wl_dnn.BackendFinalize(d), "cudnnBackendFinalize");
}

static void bk_destroy(cudnnBackendDescriptor_t d) {
    wl_dnn_check(wl_dnn.BackendDestroyDescriptor(d), "cudnnBackendDestroyDescriptor");
}

/* A finalized packed NCHW float tensor. */
static cudnnBackendDescriptor_t bk_tensor(int64_t uid, int64_t n, int64_t c, int64_t h, int64_t w) {
    cudnnBackendDescriptor_t t = bk_new(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    int64_t dims[4] = {n, c, h, w}, strides[4] = {c * h * w, h * w, w, 1}, align = 16;
    cudnnDataType_t f = CUDNN_DATA_FLOAT;
    bk_set(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f);
    bk_set(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims);
    bk_set(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides);
    bk_set(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
    bk_set(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align);
    bk_finalize(t);
    return t;
}

void wl_dnn_conv_plan_build(wl_dnn_conv_plan_t *cp, cudnnHandle_t h, int n, int c, int hh, int ww,
                            int k, int r, int pad, int stride, int p, int q) {
    cudnnBackendDescriptor_t x = bk_tensor(UID_X, n, c, hh, ww), w = bk_tensor(UID_W, k, c, r, r);
    cudnnBackendDescriptor_t y = bk_tensor(UID_Y, n, k, p, q);
    cudnnBackendDescriptor_t cv = bk_new(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR);
    int64_t two = 2, ones[2] = {1, 1}, pads[2] = {pad, pad}, strides[2] = {stride, stride};
    cudnnDataType_t f = CUDNN_DATA_FLOAT;
    cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
    bk_set(cv, CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f);
    bk_set(cv, CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode);
    bk_set(cv, CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &two);
    bk_set(cv, CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, 2, ones);
    bk_set(cv, CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, 2, strides);
    bk_set(cv, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, 2, pads);
    bk_set(cv, CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, 2, pads);
    bk_finalize(cv);
    float alpha = 1.0f, beta = 0.0f;
    cudnnBackendDescriptor_t op = bk_new(CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR);
    bk_set_desc(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, x);
    bk_set_desc(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, w);
    bk_set_desc(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, y);
    bk_set_desc(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC, cv);
    bk_set(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA, CUDNN_TYPE_FLOAT, 1, &alpha);
    bk_set(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA, CUDNN_TYPE_FLOAT, 1, &beta);
    bk_finalize(op);
    cudnnBackendDescriptor_t graph = bk_new(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    bk_set_desc(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, op);
    bk_set(graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
    bk_finalize(graph);
    cudnnBackendDescriptor_t engine = bk_new(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
    int64_t index = 0;
    bk_set_desc(engine, CUDNN_ATTR_ENGINE_OPERATION_GRAPH, graph);
    bk_set(engine, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &index);
    bk_finalize(engine);
    cudnnBackendDescriptor_t cfg = bk_new(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    bk_set_desc(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, engine);
    bk_finalize(cfg);
    cp->plan = bk_new(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
    bk_set_desc(cp->plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, cfg);
    bk_set(cp->plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
    bk_finalize(cp->plan);
    int64_t ws = 0, count = 0;
    wl_dnn_check(wl_dnn.BackendGetAttribute(cp->plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                            CUDNN_TYPE_INT64, 1, &count, &ws),
                 "cudnnBackendGetAttribute");
    cp->workspace_bytes = (size_t)ws;
    cp->n = n, cp->c = c, cp->h = hh, cp->w = ww;
    cudnnBackendDescriptor_t built[] = {x, w, y, cv, op, graph, engine, cfg};
    for (size_t i = 0; i < sizeof built / sizeof built[0]; i++)
        bk_destroy(built[i]);
}

void wl_dnn_conv_plan_run(const wl_dnn_conv_plan_t *cp, cudnnHandle_t h, CUdeviceptr x,
                          CUdeviceptr w, CUdeviceptr y, CUdeviceptr workspace) {
    cudnnBackendDescriptor_t pack = bk_new(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
    int64_t ids[3] = {UID_X, UID_W, UID_Y};
    void *ptrs[3] = {(void *)x, (void *)w, (void *)y}, *ws = (void *)workspace;
    bk_set(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, 3, ids);
    bk_set(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, 3, ptrs);
    bk_set(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws);
    bk_finalize(pack);
    wl_dnn_check(wl_dnn.BackendExecute(h, cp->plan, pack), "cudnnBackendExecute");
    bk_destroy(pack);
}

void wl_dnn_conv_plan_free(wl_dnn_conv_plan_t *cp) {
    bk_destroy(cp->plan);
    cp->plan = NULL;
}
