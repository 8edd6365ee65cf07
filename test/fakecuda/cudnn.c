/* SPDX-License-Identifier: MIT */
/* cudnn.c: a small simulated cuDNN 9 (libcudnn.so.9) that computes on the simulated device.
 *
 * It exports, with the exact prototypes of cudnn.h, the legacy calls the test workloads and the
 * shim's cuDNN hooks use: handles, streams, 4-d tensor/filter/2-d convolution descriptors,
 * convolution forward/backward-data/backward-filter and spatial or per-activation batch norm
 * (training forward and backward). Only float NCHW fully packed tensors are supported; anything
 * else is CUDNN_STATUS_NOT_SUPPORTED. No call needs a workspace (every size query answers 0)
 * and no call allocates device memory. The backend (graph) API for a convolution forward is in
 * cudnn_backend.c, which shares the handle and the driver table (cudnn_internal.h).
 *
 * Every computing call is exactly one kernel launch (module "cudnn", kernels_cudnn.c) on the
 * handle's stream, so a caller can count it as one op. The library reaches the driver as the
 * real one does: dlopen("libcuda.so.1"), dlsym "cuGetProcAddress_v2", and every entry point
 * through it with an explicit ABI version; it never links -lcuda. The driver table is built once
 * (pthread_once); a handle, like a real cuDNN handle, must not be used by two threads at once.
 * cudnnCreate needs a current context, where it loads the module. */
#include "cudnn_internal.h"

#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>

static const char *const kernel_names[K_COUNT] = {
    "conv_fwd_f32",     "conv_bwd_data_f32", "conv_bwd_filter_f32",
    "bn_fwd_train_f32", "bn_bwd_f32",        "conv_fwd_table_f32",
};

struct cudnnTensorStruct {
    int set;
    cudnnDataType_t type;
    int n, c, h, w;
    int ns, cs, hs, ws;
};

struct cudnnFilterStruct {
    int set;
    cudnnDataType_t type;
    cudnnTensorFormat_t format;
    int k, c, h, w;
};

struct cudnnConvolutionStruct {
    int set;
    int pad_h, pad_w, u, v, dil_h, dil_w;
    cudnnConvolutionMode_t mode;
    cudnnDataType_t compute;
};

dnn_driver_t dnn_drv = {.once = PTHREAD_ONCE_INIT};

static int resolve(PFN_cuGetProcAddress_v12000 gpa, const char *name, int version, void **out) {
    CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    *out = NULL;
    return gpa(name, out, version, CU_GET_PROC_ADDRESS_DEFAULT, &st) == CUDA_SUCCESS &&
                   st == CU_GET_PROC_ADDRESS_SUCCESS && *out
               ? 0
               : -1;
}

/* Opens the driver and resolves the table; the handle stays open for the process's life, as
 * real libraries keep it. */
void dnn_driver_init(void) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!lib)
        return;
    PFN_cuGetProcAddress_v12000 gpa;
    *(void **)&gpa = dlsym(lib, "cuGetProcAddress_v2");
    if (!gpa)
        return;
    if (resolve(gpa, "cuCtxGetCurrent", 4000, (void **)&dnn_drv.ctx_get_current) ||
        resolve(gpa, "cuModuleLoadData", 2000, (void **)&dnn_drv.module_load_data) ||
        resolve(gpa, "cuModuleGetFunction", 2000, (void **)&dnn_drv.module_get_function) ||
        resolve(gpa, "cuModuleUnload", 2000, (void **)&dnn_drv.module_unload) ||
        resolve(gpa, "cuLaunchKernel", 4000, (void **)&dnn_drv.launch_kernel) ||
        resolve(gpa, "cuMemcpyHtoDAsync", 3020, (void **)&dnn_drv.memcpy_htod_async) ||
        resolve(gpa, "cuMemGetAddressRange", 3020, (void **)&dnn_drv.mem_get_address_range))
        return;
    dnn_drv.ok = 1;
}

DNN_API size_t cudnnGetVersion(void) {
    return CUDNN_VERSION;
}

DNN_API const char *cudnnGetErrorString(cudnnStatus_t status) {
    switch (status) {
    case CUDNN_STATUS_SUCCESS:
        return "CUDNN_STATUS_SUCCESS";
    case CUDNN_STATUS_NOT_INITIALIZED:
        return "CUDNN_STATUS_NOT_INITIALIZED";
    case CUDNN_STATUS_BAD_PARAM:
        return "CUDNN_STATUS_BAD_PARAM";
    case CUDNN_STATUS_BAD_PARAM_NULL_POINTER:
        return "CUDNN_STATUS_BAD_PARAM_NULL_POINTER";
    case CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH:
        return "CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH";
    case CUDNN_STATUS_NOT_SUPPORTED:
        return "CUDNN_STATUS_NOT_SUPPORTED";
    case CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE:
        return "CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE";
    case CUDNN_STATUS_NOT_SUPPORTED_LAYOUT:
        return "CUDNN_STATUS_NOT_SUPPORTED_LAYOUT";
    case CUDNN_STATUS_INTERNAL_ERROR:
        return "CUDNN_STATUS_INTERNAL_ERROR";
    case CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED:
        return "CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED";
    case CUDNN_STATUS_EXECUTION_FAILED:
        return "CUDNN_STATUS_EXECUTION_FAILED";
    case CUDNN_STATUS_EXECUTION_FAILED_CUDA_DRIVER:
        return "CUDNN_STATUS_EXECUTION_FAILED_CUDA_DRIVER";
    default:
        return "CUDNN_STATUS_UNKNOWN";
    }
}

/* Creates a handle on the current context's null stream and loads the kernels there. Returns
 * NOT_INITIALIZED without a driver or a current context. The caller owns the handle
 * (cudnnDestroy). */
DNN_API cudnnStatus_t cudnnCreate(cudnnHandle_t *handle) {
    if (!handle)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    pthread_once(&dnn_drv.once, dnn_driver_init);
    if (!dnn_drv.ok)
        return CUDNN_STATUS_NOT_INITIALIZED;
    CUcontext ctx = NULL;
    if (dnn_drv.ctx_get_current(&ctx) != CUDA_SUCCESS || !ctx)
        return CUDNN_STATUS_NOT_INITIALIZED;
    struct cudnnContext *h = calloc(1, sizeof *h);
    if (!h)
        return CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED;
    if (dnn_drv.module_load_data(&h->module, FC_CUDNN_MODULE) != CUDA_SUCCESS) {
        free(h);
        return CUDNN_STATUS_NOT_INITIALIZED;
    }
    for (int i = 0; i < K_COUNT; i++) {
        if (dnn_drv.module_get_function(&h->fn[i], h->module, kernel_names[i]) != CUDA_SUCCESS) {
            dnn_drv.module_unload(h->module);
            free(h);
            return CUDNN_STATUS_NOT_INITIALIZED;
        }
    }
    *handle = h;
    return CUDNN_STATUS_SUCCESS;
}

DNN_API cudnnStatus_t cudnnDestroy(cudnnHandle_t handle) {
    if (!handle)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    cudnnStatus_t st = dnn_drv.module_unload(handle->module) == CUDA_SUCCESS
                           ? CUDNN_STATUS_SUCCESS
                           : CUDNN_STATUS_EXECUTION_FAILED_CUDA_DRIVER;
    free(handle);
    return st;
}

DNN_API cudnnStatus_t cudnnSetStream(cudnnHandle_t handle, cudaStream_t streamId) {
    if (!handle)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    handle->stream = (CUstream)streamId;
    return CUDNN_STATUS_SUCCESS;
}

DNN_API cudnnStatus_t cudnnGetStream(cudnnHandle_t handle, cudaStream_t *streamId) {
    if (!handle || !streamId)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    *streamId = (cudaStream_t)handle->stream;
    return CUDNN_STATUS_SUCCESS;
}

/* ---- descriptors --------------------------------------------------------------------------- */

DNN_API cudnnStatus_t cudnnCreateTensorDescriptor(cudnnTensorDescriptor_t *tensorDesc) {
    if (!tensorDesc)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    *tensorDesc = calloc(1, sizeof **tensorDesc);
    return *tensorDesc ? CUDNN_STATUS_SUCCESS : CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED;
}

DNN_API cudnnStatus_t cudnnSetTensor4dDescriptorEx(cudnnTensorDescriptor_t tensorDesc,
                                                   cudnnDataType_t dataType, int n, int c, int h,
                                                   int w, int nStride, int cStride, int hStride,
                                                   int wStride) {
    if (!tensorDesc)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    if (n <= 0 || c <= 0 || h <= 0 || w <= 0 || nStride <= 0 || cStride <= 0 || hStride <= 0 ||
        wStride <= 0)
        return CUDNN_STATUS_BAD_PARAM;
    *tensorDesc =
        (struct cudnnTensorStruct){1, dataType, n, c, h, w, nStride, cStride, hStride, wStride};
    return CUDNN_STATUS_SUCCESS;
}

DNN_API cudnnStatus_t cudnnSetTensor4dDescriptor(cudnnTensorDescriptor_t tensorDesc,
                                                 cudnnTensorFormat_t format,
                                                 cudnnDataType_t dataType, int n, int c, int h,
                                                 int w) {
    if (format == CUDNN_TENSOR_NCHW)
        return cudnnSetTensor4dDescriptorEx(tensorDesc, dataType, n, c, h, w, c * h * w, h * w, w,
                                            1);
    if (format == CUDNN_TENSOR_NHWC)
        return cudnnSetTensor4dDescriptorEx(tensorDesc, dataType, n, c, h, w, c * h * w, 1, w * c,
                                            c);
    return CUDNN_STATUS_BAD_PARAM;
}

DNN_API cudnnStatus_t cudnnGetTensor4dDescriptor(const cudnnTensorDescriptor_t tensorDesc,
                                                 cudnnDataType_t *dataType, int *n, int *c, int *h,
                                                 int *w, int *nStride, int *cStride, int *hStride,
                                                 int *wStride) {
    if (!tensorDesc || !dataType || !n || !c || !h || !w || !nStride || !cStride || !hStride ||
        !wStride)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    const struct cudnnTensorStruct *t = tensorDesc;
    *dataType = t->type;
    *n = t->n, *c = t->c, *h = t->h, *w = t->w;
    *nStride = t->ns, *cStride = t->cs, *hStride = t->hs, *wStride = t->ws;
    return CUDNN_STATUS_SUCCESS;
}

DNN_API cudnnStatus_t cudnnDestroyTensorDescriptor(cudnnTensorDescriptor_t tensorDesc) {
    free(tensorDesc);
    return CUDNN_STATUS_SUCCESS;
}

DNN_API cudnnStatus_t cudnnCreateFilterDescriptor(cudnnFilterDescriptor_t *filterDesc) {
    if (!filterDesc)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    *filterDesc = calloc(1, sizeof **filterDesc);
    return *filterDesc ? CUDNN_STATUS_SUCCESS : CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED;
}

DNN_API cudnnStatus_t cudnnSetFilter4dDescriptor(cudnnFilterDescriptor_t filterDesc,
                                                 cudnnDataType_t dataType,
                                                 cudnnTensorFormat_t format, int k, int c, int h,
                                                 int w) {
    if (!filterDesc)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    if (k <= 0 || c <= 0 || h <= 0 || w <= 0)
        return CUDNN_STATUS_BAD_PARAM;
    *filterDesc = (struct cudnnFilterStruct){1, dataType, format, k, c, h, w};
    return CUDNN_STATUS_SUCCESS;
}

DNN_API cudnnStatus_t cudnnGetFilter4dDescriptor(const cudnnFilterDescriptor_t filterDesc,
                                                 cudnnDataType_t *dataType,
                                                 cudnnTensorFormat_t *format, int *k, int *c,
                                                 int *h, int *w) {
    if (!filterDesc || !dataType || !format || !k || !c || !h || !w)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    *dataType = filterDesc->type;
    *format = filterDesc->format;
    *k = filterDesc->k, *c = filterDesc->c, *h = filterDesc->h, *w = filterDesc->w;
    return CUDNN_STATUS_SUCCESS;
}

DNN_API cudnnStatus_t cudnnDestroyFilterDescriptor(cudnnFilterDescriptor_t filterDesc) {
    free(filterDesc);
    return CUDNN_STATUS_SUCCESS;
}

DNN_API cudnnStatus_t cudnnCreateConvolutionDescriptor(cudnnConvolutionDescriptor_t *convDesc) {
    if (!convDesc)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    *convDesc = calloc(1, sizeof **convDesc);
    return *convDesc ? CUDNN_STATUS_SUCCESS : CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED;
}

DNN_API cudnnStatus_t cudnnSetConvolution2dDescriptor(cudnnConvolutionDescriptor_t convDesc,
                                                      int pad_h, int pad_w, int u, int v,
                                                      int dilation_h, int dilation_w,
                                                      cudnnConvolutionMode_t mode,
                                                      cudnnDataType_t computeType) {
    if (!convDesc)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    if (pad_h < 0 || pad_w < 0 || u <= 0 || v <= 0 || dilation_h <= 0 || dilation_w <= 0 ||
        (mode != CUDNN_CONVOLUTION && mode != CUDNN_CROSS_CORRELATION))
        return CUDNN_STATUS_BAD_PARAM;
    *convDesc = (struct cudnnConvolutionStruct){1,          pad_h,      pad_w, u,          v,
                                                dilation_h, dilation_w, mode,  computeType};
    return CUDNN_STATUS_SUCCESS;
}

DNN_API cudnnStatus_t cudnnGetConvolution2dDescriptor(const cudnnConvolutionDescriptor_t convDesc,
                                                      int *pad_h, int *pad_w, int *u, int *v,
                                                      int *dilation_h, int *dilation_w,
                                                      cudnnConvolutionMode_t *mode,
                                                      cudnnDataType_t *computeType) {
    if (!convDesc || !pad_h || !pad_w || !u || !v || !dilation_h || !dilation_w || !mode ||
        !computeType)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    *pad_h = convDesc->pad_h, *pad_w = convDesc->pad_w, *u = convDesc->u, *v = convDesc->v;
    *dilation_h = convDesc->dil_h, *dilation_w = convDesc->dil_w;
    *mode = convDesc->mode;
    *computeType = convDesc->compute;
    return CUDNN_STATUS_SUCCESS;
}

DNN_API cudnnStatus_t cudnnDestroyConvolutionDescriptor(cudnnConvolutionDescriptor_t convDesc) {
    free(convDesc);
    return CUDNN_STATUS_SUCCESS;
}

/* ---- shape checks -------------------------------------------------------------------------- */

/* 0 when t is a set float tensor with packed NCHW strides, else the status to return. */
static cudnnStatus_t check_tensor(const struct cudnnTensorStruct *t) {
    if (!t || !t->set)
        return CUDNN_STATUS_BAD_PARAM;
    if (t->type != CUDNN_DATA_FLOAT)
        return CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE;
    if (t->ws != 1 || t->hs != t->w || t->cs != t->h * t->w || t->ns != t->c * t->h * t->w)
        return CUDNN_STATUS_NOT_SUPPORTED_LAYOUT;
    return CUDNN_STATUS_SUCCESS;
}

static cudnnStatus_t check_filter(const struct cudnnFilterStruct *f) {
    if (!f || !f->set)
        return CUDNN_STATUS_BAD_PARAM;
    if (f->type != CUDNN_DATA_FLOAT)
        return CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE;
    if (f->format != CUDNN_TENSOR_NCHW)
        return CUDNN_STATUS_NOT_SUPPORTED_LAYOUT;
    return CUDNN_STATUS_SUCCESS;
}

/* Output extent of one spatial dimension, or <= 0 when the filter does not fit. */
int dnn_out_dim(int in, int pad, int filt, int dil, int stride) {
    int span = (filt - 1) * dil + 1;
    return in + 2 * pad < span ? 0 : 1 + (in + 2 * pad - span) / stride;
}

DNN_API cudnnStatus_t cudnnGetConvolution2dForwardOutputDim(
    const cudnnConvolutionDescriptor_t convDesc, const cudnnTensorDescriptor_t inputTensorDesc,
    const cudnnFilterDescriptor_t filterDesc, int *n, int *c, int *h, int *w) {
    if (!convDesc || !inputTensorDesc || !filterDesc || !n || !c || !h || !w)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    if (!convDesc->set || !inputTensorDesc->set || !filterDesc->set ||
        inputTensorDesc->c != filterDesc->c)
        return CUDNN_STATUS_BAD_PARAM;
    int p = dnn_out_dim(inputTensorDesc->h, convDesc->pad_h, filterDesc->h, convDesc->dil_h,
                        convDesc->u);
    int q = dnn_out_dim(inputTensorDesc->w, convDesc->pad_w, filterDesc->w, convDesc->dil_w,
                        convDesc->v);
    if (p <= 0 || q <= 0)
        return CUDNN_STATUS_BAD_PARAM;
    *n = inputTensorDesc->n, *c = filterDesc->k, *h = p, *w = q;
    return CUDNN_STATUS_SUCCESS;
}

/* Builds the kernel geometry for x (*) w = y and checks that the three agree. */
static cudnnStatus_t conv_geom(const struct cudnnTensorStruct *x, const struct cudnnFilterStruct *w,
                               const struct cudnnConvolutionStruct *cv,
                               const struct cudnnTensorStruct *y, fc_conv_geom_t *g) {
    cudnnStatus_t st;
    if ((st = check_tensor(x)) || (st = check_tensor(y)) || (st = check_filter(w)))
        return st;
    if (!cv || !cv->set)
        return CUDNN_STATUS_BAD_PARAM;
    int p = dnn_out_dim(x->h, cv->pad_h, w->h, cv->dil_h, cv->u);
    int q = dnn_out_dim(x->w, cv->pad_w, w->w, cv->dil_w, cv->v);
    if (x->c != w->c || y->n != x->n || y->c != w->k || y->h != p || y->w != q)
        return CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH;
    *g = (fc_conv_geom_t){.n = x->n,
                          .c = x->c,
                          .h = x->h,
                          .w = x->w,
                          .k = w->k,
                          .r = w->h,
                          .s = w->w,
                          .p = p,
                          .q = q,
                          .pad_h = cv->pad_h,
                          .pad_w = cv->pad_w,
                          .str_h = cv->u,
                          .str_w = cv->v,
                          .dil_h = cv->dil_h,
                          .dil_w = cv->dil_w,
                          .cross = cv->mode == CUDNN_CROSS_CORRELATION};
    return CUDNN_STATUS_SUCCESS;
}

DNN_API cudnnStatus_t cudnnGetConvolutionForwardWorkspaceSize(
    cudnnHandle_t handle, const cudnnTensorDescriptor_t xDesc, const cudnnFilterDescriptor_t wDesc,
    const cudnnConvolutionDescriptor_t convDesc, const cudnnTensorDescriptor_t yDesc,
    cudnnConvolutionFwdAlgo_t algo, size_t *sizeInBytes) {
    fc_conv_geom_t g;
    (void)algo;
    if (!handle || !sizeInBytes)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    cudnnStatus_t st = conv_geom(xDesc, wDesc, convDesc, yDesc, &g);
    if (st == CUDNN_STATUS_SUCCESS)
        *sizeInBytes = 0;
    return st;
}

DNN_API cudnnStatus_t cudnnGetConvolutionBackwardDataWorkspaceSize(
    cudnnHandle_t handle, const cudnnFilterDescriptor_t wDesc, const cudnnTensorDescriptor_t dyDesc,
    const cudnnConvolutionDescriptor_t convDesc, const cudnnTensorDescriptor_t dxDesc,
    cudnnConvolutionBwdDataAlgo_t algo, size_t *sizeInBytes) {
    fc_conv_geom_t g;
    (void)algo;
    if (!handle || !sizeInBytes)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    cudnnStatus_t st = conv_geom(dxDesc, wDesc, convDesc, dyDesc, &g);
    if (st == CUDNN_STATUS_SUCCESS)
        *sizeInBytes = 0;
    return st;
}

DNN_API cudnnStatus_t cudnnGetConvolutionBackwardFilterWorkspaceSize(
    cudnnHandle_t handle, const cudnnTensorDescriptor_t xDesc, const cudnnTensorDescriptor_t dyDesc,
    const cudnnConvolutionDescriptor_t convDesc, const cudnnFilterDescriptor_t gradDesc,
    cudnnConvolutionBwdFilterAlgo_t algo, size_t *sizeInBytes) {
    fc_conv_geom_t g;
    (void)algo;
    if (!handle || !sizeInBytes)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    cudnnStatus_t st = conv_geom(xDesc, gradDesc, convDesc, dyDesc, &g);
    if (st == CUDNN_STATUS_SUCCESS)
        *sizeInBytes = 0;
    return st;
}

/* ---- launches ------------------------------------------------------------------------------ */

static CUdeviceptr dptr(const void *p) {
    return (CUdeviceptr)(uintptr_t)p;
}

/* Launches kernel k of the handle with the given argument pointers on the handle's stream, with
 * a grid sized as a real kernel would be for `elems` outputs. */
cudnnStatus_t dnn_launch(cudnnHandle_t h, int k, uint64_t elems, void **args) {
    uint64_t blocks = (elems + 255) / 256;
    unsigned grid = blocks == 0 ? 1 : blocks > 65535 ? 65535 : (unsigned)blocks;
    CUresult r = dnn_drv.launch_kernel(h->fn[k], grid, 1, 1, 256, 1, 1, 0, h->stream, args, NULL);
    return r == CUDA_SUCCESS ? CUDNN_STATUS_SUCCESS : CUDNN_STATUS_EXECUTION_FAILED_CUDA_DRIVER;
}

/* The three convolution calls share one shape: check, read the float scalars, launch once. */
static cudnnStatus_t conv_call(cudnnHandle_t handle, int kernel, const void *alpha,
                               const void *beta, const void *in0, const void *in1, void *out,
                               const fc_conv_geom_t *g, uint64_t out_elems) {
    if (!handle || !alpha || !beta || !in0 || !in1 || !out)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    float a = *(const float *)alpha, b = *(const float *)beta;
    CUdeviceptr p0 = dptr(in0), p1 = dptr(in1), p2 = dptr(out);
    fc_conv_geom_t geom = *g;
    void *args[] = {&p0, &p1, &p2, &geom, &a, &b};
    return dnn_launch(handle, kernel, out_elems, args);
}

DNN_API cudnnStatus_t cudnnConvolutionForward(cudnnHandle_t handle, const void *alpha,
                                              const cudnnTensorDescriptor_t xDesc, const void *x,
                                              const cudnnFilterDescriptor_t wDesc, const void *w,
                                              const cudnnConvolutionDescriptor_t convDesc,
                                              cudnnConvolutionFwdAlgo_t algo, void *workSpace,
                                              size_t workSpaceSizeInBytes, const void *beta,
                                              const cudnnTensorDescriptor_t yDesc, void *y) {
    fc_conv_geom_t g;
    (void)algo, (void)workSpace, (void)workSpaceSizeInBytes;
    cudnnStatus_t st = conv_geom(xDesc, wDesc, convDesc, yDesc, &g);
    if (st)
        return st;
    return conv_call(handle, K_CONV_FWD, alpha, beta, x, w, y, &g,
                     (uint64_t)g.n * g.k * g.p * (uint64_t)g.q);
}

DNN_API cudnnStatus_t cudnnConvolutionBackwardData(
    cudnnHandle_t handle, const void *alpha, const cudnnFilterDescriptor_t wDesc, const void *w,
    const cudnnTensorDescriptor_t dyDesc, const void *dy,
    const cudnnConvolutionDescriptor_t convDesc, cudnnConvolutionBwdDataAlgo_t algo,
    void *workSpace, size_t workSpaceSizeInBytes, const void *beta,
    const cudnnTensorDescriptor_t dxDesc, void *dx) {
    fc_conv_geom_t g;
    (void)algo, (void)workSpace, (void)workSpaceSizeInBytes;
    cudnnStatus_t st = conv_geom(dxDesc, wDesc, convDesc, dyDesc, &g);
    if (st)
        return st;
    return conv_call(handle, K_CONV_BWD_DATA, alpha, beta, w, dy, dx, &g,
                     (uint64_t)g.n * g.c * g.h * (uint64_t)g.w);
}

DNN_API cudnnStatus_t cudnnConvolutionBackwardFilter(
    cudnnHandle_t handle, const void *alpha, const cudnnTensorDescriptor_t xDesc, const void *x,
    const cudnnTensorDescriptor_t dyDesc, const void *dy,
    const cudnnConvolutionDescriptor_t convDesc, cudnnConvolutionBwdFilterAlgo_t algo,
    void *workSpace, size_t workSpaceSizeInBytes, const void *beta,
    const cudnnFilterDescriptor_t dwDesc, void *dw) {
    fc_conv_geom_t g;
    (void)algo, (void)workSpace, (void)workSpaceSizeInBytes;
    cudnnStatus_t st = conv_geom(xDesc, dwDesc, convDesc, dyDesc, &g);
    if (st)
        return st;
    return conv_call(handle, K_CONV_BWD_FILTER, alpha, beta, x, dy, dw, &g,
                     (uint64_t)g.k * g.c * g.r * (uint64_t)g.s);
}

/* ---- batch norm ---------------------------------------------------------------------------- */

DNN_API cudnnStatus_t cudnnDeriveBNTensorDescriptor(cudnnTensorDescriptor_t derivedBnDesc,
                                                    const cudnnTensorDescriptor_t xDesc,
                                                    cudnnBatchNormMode_t mode) {
    if (!derivedBnDesc || !xDesc)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    if (!xDesc->set)
        return CUDNN_STATUS_BAD_PARAM;
    if (mode == CUDNN_BATCHNORM_PER_ACTIVATION)
        return cudnnSetTensor4dDescriptor(derivedBnDesc, CUDNN_TENSOR_NCHW, xDesc->type, 1,
                                          xDesc->c, xDesc->h, xDesc->w);
    if (mode == CUDNN_BATCHNORM_SPATIAL || mode == CUDNN_BATCHNORM_SPATIAL_PERSISTENT)
        return cudnnSetTensor4dDescriptor(derivedBnDesc, CUDNN_TENSOR_NCHW, xDesc->type, 1,
                                          xDesc->c, 1, 1);
    return CUDNN_STATUS_BAD_PARAM;
}

/* Checks x/y (same shape) and the per-channel descriptor for the mode, and gives the kernel's
 * view (n, channels, elements per channel and sample). */
static cudnnStatus_t bn_shape(cudnnBatchNormMode_t mode, const struct cudnnTensorStruct *x,
                              const struct cudnnTensorStruct *y, const struct cudnnTensorStruct *bn,
                              int *n, int *c, int *hw) {
    cudnnStatus_t st;
    if ((st = check_tensor(x)) || (st = check_tensor(y)) || (st = check_tensor(bn)))
        return st;
    if (x->n != y->n || x->c != y->c || x->h != y->h || x->w != y->w)
        return CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH;
    if (mode == CUDNN_BATCHNORM_PER_ACTIVATION) {
        if (bn->n != 1 || bn->c != x->c || bn->h != x->h || bn->w != x->w)
            return CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH;
        *n = x->n, *c = x->c * x->h * x->w, *hw = 1;
    } else if (mode == CUDNN_BATCHNORM_SPATIAL || mode == CUDNN_BATCHNORM_SPATIAL_PERSISTENT) {
        if (bn->n != 1 || bn->c != x->c || bn->h != 1 || bn->w != 1)
            return CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH;
        *n = x->n, *c = x->c, *hw = x->h * x->w;
    } else {
        return CUDNN_STATUS_BAD_PARAM;
    }
    return CUDNN_STATUS_SUCCESS;
}

DNN_API cudnnStatus_t cudnnBatchNormalizationForwardTraining(
    cudnnHandle_t handle, cudnnBatchNormMode_t mode, const void *alpha, const void *beta,
    const cudnnTensorDescriptor_t xDesc, const void *x, const cudnnTensorDescriptor_t yDesc,
    void *y, const cudnnTensorDescriptor_t bnScaleBiasMeanVarDesc, const void *bnScale,
    const void *bnBias, double exponentialAverageFactor, void *resultRunningMean,
    void *resultRunningVariance, double epsilon, void *resultSaveMean,
    void *resultSaveInvVariance) {
    int n, c, hw;
    if (!handle || !alpha || !beta || !x || !y || !bnScale || !bnBias)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    cudnnStatus_t st = bn_shape(mode, xDesc, yDesc, bnScaleBiasMeanVarDesc, &n, &c, &hw);
    if (st)
        return st;
    /* cuDNN wants both running (or both saved) pointers, or neither. */
    if (!resultRunningMean != !resultRunningVariance || !resultSaveMean != !resultSaveInvVariance ||
        epsilon < CUDNN_BN_MIN_EPSILON)
        return CUDNN_STATUS_BAD_PARAM;
    float a = *(const float *)alpha, b = *(const float *)beta;
    CUdeviceptr px = dptr(x), py = dptr(y), ps = dptr(bnScale), pb = dptr(bnBias);
    CUdeviceptr prm = dptr(resultRunningMean), prv = dptr(resultRunningVariance);
    CUdeviceptr psm = dptr(resultSaveMean), psi = dptr(resultSaveInvVariance);
    double factor = exponentialAverageFactor, eps = epsilon;
    void *args[] = {&px, &py, &ps, &pb, &prm, &prv, &psm, &psi, &n, &c, &hw, &factor, &eps, &a, &b};
    return dnn_launch(handle, K_BN_FWD, (uint64_t)n * c * (uint64_t)hw, args);
}

DNN_API cudnnStatus_t cudnnBatchNormalizationBackward(
    cudnnHandle_t handle, cudnnBatchNormMode_t mode, const void *alphaDataDiff,
    const void *betaDataDiff, const void *alphaParamDiff, const void *betaParamDiff,
    const cudnnTensorDescriptor_t xDesc, const void *x, const cudnnTensorDescriptor_t dyDesc,
    const void *dy, const cudnnTensorDescriptor_t dxDesc, void *dx,
    const cudnnTensorDescriptor_t dBnScaleBiasDesc, const void *bnScale, void *dBnScaleResult,
    void *dBnBiasResult, double epsilon, const void *savedMean, const void *savedInvVariance) {
    int n, c, hw;
    if (!handle || !alphaDataDiff || !betaDataDiff || !alphaParamDiff || !betaParamDiff || !x ||
        !dy || !dx || !bnScale || !dBnScaleResult || !dBnBiasResult)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    cudnnStatus_t st = bn_shape(mode, xDesc, dxDesc, dBnScaleBiasDesc, &n, &c, &hw);
    if (st)
        return st;
    if ((st = check_tensor(dyDesc)))
        return st;
    if (dyDesc->n != xDesc->n || dyDesc->c != xDesc->c || dyDesc->h != xDesc->h ||
        dyDesc->w != xDesc->w)
        return CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH;
    if (!savedMean != !savedInvVariance || epsilon < CUDNN_BN_MIN_EPSILON)
        return CUDNN_STATUS_BAD_PARAM;
    float ad = *(const float *)alphaDataDiff, bd = *(const float *)betaDataDiff;
    float ap = *(const float *)alphaParamDiff, bp = *(const float *)betaParamDiff;
    CUdeviceptr px = dptr(x), pdy = dptr(dy), pdx = dptr(dx), ps = dptr(bnScale);
    CUdeviceptr pds = dptr(dBnScaleResult), pdb = dptr(dBnBiasResult);
    CUdeviceptr psm = dptr(savedMean), psi = dptr(savedInvVariance);
    double eps = epsilon;
    void *args[] = {&px, &pdy, &pdx, &ps,  &pds, &pdb, &psm, &psi,
                    &n,  &c,   &hw,  &eps, &ad,  &bd,  &ap,  &bp};
    return dnn_launch(handle, K_BN_BWD, (uint64_t)n * c * (uint64_t)hw, args);
}
