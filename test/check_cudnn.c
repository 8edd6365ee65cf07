/* SPDX-License-Identifier: MIT */
/* check_cudnn.c: the simulated libcudnn.so.9 computes what cuDNN defines, on small shapes.
 *
 * Each test runs in Check's forked child: it makes device 0's primary context current on the
 * simulated driver the runner is linked with, dlopens the simulated cuDNN from the build
 * directory (which finds that same libcuda.so.1 by its soname), runs one call on a stream and
 * compares the result with a plain double-precision host reference. Inputs are fixed
 * pseudo-random values, so these tests need no seed. */
#include <check.h>
#include <cuda.h>
#include <cudnn.h>
#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fakecuda.h"
#include "testutil.h"

static struct {
    __typeof__(&cudnnCreate) Create;
    __typeof__(&cudnnDestroy) Destroy;
    __typeof__(&cudnnSetStream) SetStream;
    __typeof__(&cudnnGetVersion) GetVersion;
    __typeof__(&cudnnCreateTensorDescriptor) CreateTensor;
    __typeof__(&cudnnSetTensor4dDescriptor) SetTensor4d;
    __typeof__(&cudnnSetTensor4dDescriptorEx) SetTensor4dEx;
    __typeof__(&cudnnDestroyTensorDescriptor) DestroyTensor;
    __typeof__(&cudnnCreateFilterDescriptor) CreateFilter;
    __typeof__(&cudnnSetFilter4dDescriptor) SetFilter4d;
    __typeof__(&cudnnDestroyFilterDescriptor) DestroyFilter;
    __typeof__(&cudnnCreateConvolutionDescriptor) CreateConv;
    __typeof__(&cudnnSetConvolution2dDescriptor) SetConv2d;
    __typeof__(&cudnnDestroyConvolutionDescriptor) DestroyConv;
    __typeof__(&cudnnGetConvolution2dForwardOutputDim) OutputDim;
    __typeof__(&cudnnGetConvolutionForwardWorkspaceSize) FwdWorkspace;
    __typeof__(&cudnnConvolutionForward) ConvFwd;
    __typeof__(&cudnnConvolutionBackwardData) ConvBwdData;
    __typeof__(&cudnnConvolutionBackwardFilter) ConvBwdFilter;
    __typeof__(&cudnnDeriveBNTensorDescriptor) DeriveBN;
    __typeof__(&cudnnBatchNormalizationForwardTraining) BNFwd;
    __typeof__(&cudnnBatchNormalizationBackward) BNBwd;
    __typeof__(&cudnnBackendCreateDescriptor) BCreate;
    __typeof__(&cudnnBackendDestroyDescriptor) BDestroy;
    __typeof__(&cudnnBackendSetAttribute) BSet;
    __typeof__(&cudnnBackendGetAttribute) BGet;
    __typeof__(&cudnnBackendFinalize) BFinalize;
    __typeof__(&cudnnBackendExecute) BExecute;
} dnn;

static CUcontext ctx;
static CUstream stream;
static cudnnHandle_t handle;

static void setup(void) {
    CUdevice dev;
    ck_assert_int_eq(cuInit(0), CUDA_SUCCESS);
    ck_assert_int_eq(cuDeviceGet(&dev, 0), CUDA_SUCCESS);
    ck_assert_int_eq(cuDevicePrimaryCtxRetain(&ctx, dev), CUDA_SUCCESS);
    ck_assert_int_eq(cuCtxSetCurrent(ctx), CUDA_SUCCESS);
    ck_assert_int_eq(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    void *lib = dlopen(tu_build_path("fakecuda/libcudnn.so.9"), RTLD_NOW | RTLD_LOCAL);
    ck_assert_msg(lib != NULL, "dlopen: %s", dlerror());
#define R(field, name)                                                                             \
    do {                                                                                           \
        *(void **)&dnn.field = dlsym(lib, name);                                                   \
        ck_assert_msg(dnn.field != NULL, "%s missing", name);                                      \
    } while (0)
    R(Create, "cudnnCreate");
    R(Destroy, "cudnnDestroy");
    R(SetStream, "cudnnSetStream");
    R(GetVersion, "cudnnGetVersion");
    R(CreateTensor, "cudnnCreateTensorDescriptor");
    R(SetTensor4d, "cudnnSetTensor4dDescriptor");
    R(SetTensor4dEx, "cudnnSetTensor4dDescriptorEx");
    R(DestroyTensor, "cudnnDestroyTensorDescriptor");
    R(CreateFilter, "cudnnCreateFilterDescriptor");
    R(SetFilter4d, "cudnnSetFilter4dDescriptor");
    R(DestroyFilter, "cudnnDestroyFilterDescriptor");
    R(CreateConv, "cudnnCreateConvolutionDescriptor");
    R(SetConv2d, "cudnnSetConvolution2dDescriptor");
    R(DestroyConv, "cudnnDestroyConvolutionDescriptor");
    R(OutputDim, "cudnnGetConvolution2dForwardOutputDim");
    R(FwdWorkspace, "cudnnGetConvolutionForwardWorkspaceSize");
    R(ConvFwd, "cudnnConvolutionForward");
    R(ConvBwdData, "cudnnConvolutionBackwardData");
    R(ConvBwdFilter, "cudnnConvolutionBackwardFilter");
    R(DeriveBN, "cudnnDeriveBNTensorDescriptor");
    R(BNFwd, "cudnnBatchNormalizationForwardTraining");
    R(BNBwd, "cudnnBatchNormalizationBackward");
    R(BCreate, "cudnnBackendCreateDescriptor");
    R(BDestroy, "cudnnBackendDestroyDescriptor");
    R(BSet, "cudnnBackendSetAttribute");
    R(BGet, "cudnnBackendGetAttribute");
    R(BFinalize, "cudnnBackendFinalize");
    R(BExecute, "cudnnBackendExecute");
#undef R
    ck_assert_int_eq(dnn.Create(&handle), CUDNN_STATUS_SUCCESS);
    ck_assert_int_eq(dnn.SetStream(handle, (cudaStream_t)stream), CUDNN_STATUS_SUCCESS);
}

static void teardown(void) {
    ck_assert_int_eq(dnn.Destroy(handle), CUDNN_STATUS_SUCCESS);
    ck_assert_int_eq(cuStreamDestroy(stream), CUDA_SUCCESS);
    ck_assert_int_eq(cuDevicePrimaryCtxRelease(0), CUDA_SUCCESS);
}

/* ---- host helpers -------------------------------------------------------------------------- */

/* n fixed pseudo-random values in [-1, 1) from `salt`. */
static float *host_rand(size_t n, uint32_t salt) {
    float *v = malloc(n * sizeof *v);
    uint32_t s = 2463534242u ^ (salt * 2654435761u);
    for (size_t i = 0; i < n; i++) {
        s ^= s << 13, s ^= s >> 17, s ^= s << 5;
        v[i] = (float)(s >> 8) / 8388608.0f - 1.0f;
    }
    return v;
}

static CUdeviceptr dev_from(const float *h, size_t n) {
    CUdeviceptr d;
    ck_assert_int_eq(cuMemAlloc(&d, n * sizeof(float)), CUDA_SUCCESS);
    ck_assert_int_eq(cuMemcpyHtoD(d, h, n * sizeof(float)), CUDA_SUCCESS);
    return d;
}

static float *host_from(CUdeviceptr d, size_t n) {
    float *h = malloc(n * sizeof *h);
    ck_assert_int_eq(cuStreamSynchronize(stream), CUDA_SUCCESS);
    ck_assert_int_eq(cuMemcpyDtoH(h, d, n * sizeof(float)), CUDA_SUCCESS);
    return h;
}

static void expect_close(const char *what, const float *got, const double *want, size_t n) {
    for (size_t i = 0; i < n; i++) {
        double tol = 1e-4 * (1.0 + fabs(want[i]));
        ck_assert_msg(fabs(got[i] - want[i]) <= tol, "%s[%zu]: got %.7g, want %.7g", what, i,
                      (double)got[i], want[i]);
    }
}

static cudnnTensorDescriptor_t tensor(int n, int c, int h, int w) {
    cudnnTensorDescriptor_t t;
    ck_assert_int_eq(dnn.CreateTensor(&t), CUDNN_STATUS_SUCCESS);
    ck_assert_int_eq(dnn.SetTensor4d(t, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, n, c, h, w),
                     CUDNN_STATUS_SUCCESS);
    return t;
}

/* ---- convolution --------------------------------------------------------------------------- */

typedef struct shape {
    int n, c, h, w, k, r, s, pad_h, pad_w, str_h, str_w, dil_h, dil_w;
    cudnnConvolutionMode_t mode;
} shape_t;

static const shape_t shapes[] = {
    {2, 3, 7, 6, 4, 3, 2, 1, 0, 2, 1, 1, 2, CUDNN_CROSS_CORRELATION},
    {1, 2, 5, 5, 3, 3, 3, 1, 1, 1, 1, 1, 1, CUDNN_CONVOLUTION},
    {3, 4, 6, 8, 2, 1, 1, 0, 0, 2, 2, 1, 1, CUDNN_CROSS_CORRELATION},
    {2, 2, 9, 7, 3, 3, 3, 2, 1, 2, 3, 2, 1, CUDNN_CONVOLUTION},
};
#define NSHAPES ((int)(sizeof shapes / sizeof shapes[0]))

typedef struct conv_case {
    shape_t g;
    int p, q;
    size_t nx, nw, ny;
    cudnnTensorDescriptor_t xd, yd;
    cudnnFilterDescriptor_t wd;
    cudnnConvolutionDescriptor_t cd;
} conv_case_t;

static void conv_case_init(conv_case_t *cc, const shape_t *g) {
    cc->g = *g;
    int span_h = (g->r - 1) * g->dil_h + 1, span_w = (g->s - 1) * g->dil_w + 1;
    cc->p = (g->h + 2 * g->pad_h - span_h) / g->str_h + 1;
    cc->q = (g->w + 2 * g->pad_w - span_w) / g->str_w + 1;
    cc->nx = (size_t)g->n * g->c * g->h * g->w;
    cc->nw = (size_t)g->k * g->c * g->r * g->s;
    cc->ny = (size_t)g->n * g->k * cc->p * cc->q;
    cc->xd = tensor(g->n, g->c, g->h, g->w);
    cc->yd = tensor(g->n, g->k, cc->p, cc->q);
    ck_assert_int_eq(dnn.CreateFilter(&cc->wd), CUDNN_STATUS_SUCCESS);
    ck_assert_int_eq(
        dnn.SetFilter4d(cc->wd, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, g->k, g->c, g->r, g->s),
        CUDNN_STATUS_SUCCESS);
    ck_assert_int_eq(dnn.CreateConv(&cc->cd), CUDNN_STATUS_SUCCESS);
    ck_assert_int_eq(dnn.SetConv2d(cc->cd, g->pad_h, g->pad_w, g->str_h, g->str_w, g->dil_h,
                                   g->dil_w, g->mode, CUDNN_DATA_FLOAT),
                     CUDNN_STATUS_SUCCESS);
    int n, c, h, w;
    ck_assert_int_eq(dnn.OutputDim(cc->cd, cc->xd, cc->wd, &n, &c, &h, &w), CUDNN_STATUS_SUCCESS);
    ck_assert_int_eq(n, g->n);
    ck_assert_int_eq(c, g->k);
    ck_assert_int_eq(h, cc->p);
    ck_assert_int_eq(w, cc->q);
}

static void conv_case_fini(conv_case_t *cc) {
    dnn.DestroyTensor(cc->xd);
    dnn.DestroyTensor(cc->yd);
    dnn.DestroyFilter(cc->wd);
    dnn.DestroyConv(cc->cd);
}

/* Calls fn(x_index, w_index, y_index) for every multiply of the convolution, in the geometry's
 * own definition (the filter flipped for CUDNN_CONVOLUTION). */
typedef void (*tap_fn)(size_t xi, size_t wi, size_t yi, void *ctx);

static void for_each_tap(const conv_case_t *cc, tap_fn fn, void *arg) {
    const shape_t *g = &cc->g;
    for (int n = 0; n < g->n; n++)
        for (int k = 0; k < g->k; k++)
            for (int p = 0; p < cc->p; p++)
                for (int q = 0; q < cc->q; q++)
                    for (int c = 0; c < g->c; c++)
                        for (int r = 0; r < g->r; r++)
                            for (int s = 0; s < g->s; s++) {
                                int ih = p * g->str_h - g->pad_h + r * g->dil_h;
                                int iw = q * g->str_w - g->pad_w + s * g->dil_w;
                                if (ih < 0 || ih >= g->h || iw < 0 || iw >= g->w)
                                    continue;
                                int rr = g->mode == CUDNN_CONVOLUTION ? g->r - 1 - r : r;
                                int ss = g->mode == CUDNN_CONVOLUTION ? g->s - 1 - s : s;
                                size_t xi = (((size_t)n * g->c + c) * g->h + ih) * g->w + iw;
                                size_t wi = (((size_t)k * g->c + c) * g->r + rr) * g->s + ss;
                                size_t yi = (((size_t)n * g->k + k) * cc->p + p) * cc->q + q;
                                fn(xi, wi, yi, arg);
                            }
}

typedef struct ref {
    const float *x, *w, *y;
    double *out;
} ref_t;

static void tap_fwd(size_t xi, size_t wi, size_t yi, void *a) {
    ref_t *r = a;
    r->out[yi] += (double)r->x[xi] * r->w[wi];
}
static void tap_bwd_data(size_t xi, size_t wi, size_t yi, void *a) {
    ref_t *r = a;
    r->out[xi] += (double)r->y[yi] * r->w[wi];
}
static void tap_bwd_filter(size_t xi, size_t wi, size_t yi, void *a) {
    ref_t *r = a;
    r->out[wi] += (double)r->y[yi] * r->x[xi];
}

/* Blended alpha/beta pairs every call is checked with: plain, scaled, and accumulate. */
static const float alphas[] = {1.0f, 0.5f, 1.0f}, betas[] = {0.0f, 0.0f, 1.0f};

START_TEST(test_conv_forward_matches_reference) {
    conv_case_t cc;
    conv_case_init(&cc, &shapes[_i]);
    float *x = host_rand(cc.nx, 1), *w = host_rand(cc.nw, 2), *y0 = host_rand(cc.ny, 3);
    double *want = calloc(cc.ny, sizeof *want);
    ref_t r = {x, w, NULL, want};
    for_each_tap(&cc, tap_fwd, &r);
    CUdeviceptr dx = dev_from(x, cc.nx), dw = dev_from(w, cc.nw);
    for (int b = 0; b < 3; b++) {
        CUdeviceptr dy = dev_from(y0, cc.ny);
        size_t ws = 1;
        ck_assert_int_eq(dnn.FwdWorkspace(handle, cc.xd, cc.wd, cc.cd, cc.yd,
                                          CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, &ws),
                         CUDNN_STATUS_SUCCESS);
        ck_assert_uint_eq(ws, 0);
        ck_assert_int_eq(dnn.ConvFwd(handle, &alphas[b], cc.xd, (void *)dx, cc.wd, (void *)dw,
                                     cc.cd, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, NULL, 0,
                                     &betas[b], cc.yd, (void *)dy),
                         CUDNN_STATUS_SUCCESS);
        float *got = host_from(dy, cc.ny);
        double *blended = malloc(cc.ny * sizeof *blended);
        for (size_t i = 0; i < cc.ny; i++)
            blended[i] = alphas[b] * want[i] + betas[b] * y0[i];
        expect_close("y", got, blended, cc.ny);
        free(got);
        free(blended);
        cuMemFree(dy);
    }
    cuMemFree(dx);
    cuMemFree(dw);
    free(x), free(w), free(y0), free(want);
    conv_case_fini(&cc);
}
END_TEST

START_TEST(test_conv_backward_data_matches_reference) {
    conv_case_t cc;
    conv_case_init(&cc, &shapes[_i]);
    float *w = host_rand(cc.nw, 4), *dy = host_rand(cc.ny, 5), *dx0 = host_rand(cc.nx, 6);
    double *want = calloc(cc.nx, sizeof *want);
    ref_t r = {NULL, w, dy, want};
    for_each_tap(&cc, tap_bwd_data, &r);
    CUdeviceptr dw = dev_from(w, cc.nw), ddy = dev_from(dy, cc.ny);
    for (int b = 0; b < 3; b++) {
        CUdeviceptr ddx = dev_from(dx0, cc.nx);
        ck_assert_int_eq(dnn.ConvBwdData(handle, &alphas[b], cc.wd, (void *)dw, cc.yd, (void *)ddy,
                                         cc.cd, CUDNN_CONVOLUTION_BWD_DATA_ALGO_1, NULL, 0,
                                         &betas[b], cc.xd, (void *)ddx),
                         CUDNN_STATUS_SUCCESS);
        float *got = host_from(ddx, cc.nx);
        double *blended = malloc(cc.nx * sizeof *blended);
        for (size_t i = 0; i < cc.nx; i++)
            blended[i] = alphas[b] * want[i] + betas[b] * dx0[i];
        expect_close("dx", got, blended, cc.nx);
        free(got);
        free(blended);
        cuMemFree(ddx);
    }
    cuMemFree(dw);
    cuMemFree(ddy);
    free(w), free(dy), free(dx0), free(want);
    conv_case_fini(&cc);
}
END_TEST

START_TEST(test_conv_backward_filter_matches_reference) {
    conv_case_t cc;
    conv_case_init(&cc, &shapes[_i]);
    float *x = host_rand(cc.nx, 7), *dy = host_rand(cc.ny, 8), *dw0 = host_rand(cc.nw, 9);
    double *want = calloc(cc.nw, sizeof *want);
    ref_t r = {x, NULL, dy, want};
    for_each_tap(&cc, tap_bwd_filter, &r);
    CUdeviceptr dx = dev_from(x, cc.nx), ddy = dev_from(dy, cc.ny);
    for (int b = 0; b < 3; b++) {
        CUdeviceptr ddw = dev_from(dw0, cc.nw);
        ck_assert_int_eq(dnn.ConvBwdFilter(handle, &alphas[b], cc.xd, (void *)dx, cc.yd,
                                           (void *)ddy, cc.cd, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0,
                                           NULL, 0, &betas[b], cc.wd, (void *)ddw),
                         CUDNN_STATUS_SUCCESS);
        float *got = host_from(ddw, cc.nw);
        double *blended = malloc(cc.nw * sizeof *blended);
        for (size_t i = 0; i < cc.nw; i++)
            blended[i] = alphas[b] * want[i] + betas[b] * dw0[i];
        expect_close("dw", got, blended, cc.nw);
        free(got);
        free(blended);
        cuMemFree(ddw);
    }
    cuMemFree(dx);
    cuMemFree(ddy);
    free(x), free(dy), free(dw0), free(want);
    conv_case_fini(&cc);
}
END_TEST

START_TEST(test_conv_rejects_bad_shapes_and_types) {
    conv_case_t cc;
    conv_case_init(&cc, &shapes[0]);
    cudnnTensorDescriptor_t wrong = tensor(cc.g.n, cc.g.k, cc.p + 1, cc.q);
    float one = 1.0f, zero = 0.0f;
    ck_assert_int_eq(dnn.ConvFwd(handle, &one, cc.xd, (void *)1, cc.wd, (void *)1, cc.cd,
                                 CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, NULL, 0, &zero, wrong,
                                 (void *)1),
                     CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH);
    ck_assert_int_eq(
        dnn.SetTensor4d(wrong, CUDNN_TENSOR_NCHW, CUDNN_DATA_HALF, cc.g.n, cc.g.k, cc.p, cc.q),
        CUDNN_STATUS_SUCCESS);
    ck_assert_int_eq(dnn.ConvFwd(handle, &one, cc.xd, (void *)1, cc.wd, (void *)1, cc.cd,
                                 CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, NULL, 0, &zero, wrong,
                                 (void *)1),
                     CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE);
    ck_assert_int_eq(dnn.SetTensor4dEx(wrong, CUDNN_DATA_FLOAT, cc.g.n, cc.g.k, cc.p, cc.q,
                                       2 * cc.g.k * cc.p * cc.q, cc.p * cc.q, cc.q, 1),
                     CUDNN_STATUS_SUCCESS);
    ck_assert_int_eq(dnn.ConvFwd(handle, &one, cc.xd, (void *)1, cc.wd, (void *)1, cc.cd,
                                 CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, NULL, 0, &zero, wrong,
                                 (void *)1),
                     CUDNN_STATUS_NOT_SUPPORTED_LAYOUT);
    ck_assert_uint_ge(dnn.GetVersion(), 90000);
    dnn.DestroyTensor(wrong);
    conv_case_fini(&cc);
}
END_TEST

/* ---- batch norm ---------------------------------------------------------------------------- */

enum { BN_N = 3, BN_C = 4, BN_H = 3, BN_W = 5 };
#define BN_M     (BN_N * BN_H * BN_W)
#define BN_TOTAL ((size_t)BN_N * BN_C * BN_H * BN_W)

static size_t bn_idx(int n, int c, int i) {
    return ((size_t)n * BN_C + c) * (BN_H * BN_W) + i;
}

/* Mean and biased variance of channel c, in double. */
static void bn_stats(const float *x, int c, double *mean, double *var) {
    double s = 0, q = 0;
    for (int n = 0; n < BN_N; n++)
        for (int i = 0; i < BN_H * BN_W; i++)
            s += x[bn_idx(n, c, i)];
    *mean = s / BN_M;
    for (int n = 0; n < BN_N; n++)
        for (int i = 0; i < BN_H * BN_W; i++)
            q += (x[bn_idx(n, c, i)] - *mean) * (x[bn_idx(n, c, i)] - *mean);
    *var = q / BN_M;
}

START_TEST(test_bn_forward_training_matches_reference) {
    const double eps = 1e-3, factor = 0.25;
    cudnnTensorDescriptor_t xd = tensor(BN_N, BN_C, BN_H, BN_W), pd;
    ck_assert_int_eq(dnn.CreateTensor(&pd), CUDNN_STATUS_SUCCESS);
    ck_assert_int_eq(dnn.DeriveBN(pd, xd, CUDNN_BATCHNORM_SPATIAL), CUDNN_STATUS_SUCCESS);
    float *x = host_rand(BN_TOTAL, 10), *scale = host_rand(BN_C, 11), *bias = host_rand(BN_C, 12);
    float *rm = host_rand(BN_C, 13), *rv = host_rand(BN_C, 14);
    for (int c = 0; c < BN_C; c++)
        rv[c] = 1.0f + rv[c] * 0.5f;
    CUdeviceptr dx = dev_from(x, BN_TOTAL), dy = dev_from(x, BN_TOTAL);
    CUdeviceptr ds = dev_from(scale, BN_C), db = dev_from(bias, BN_C);
    CUdeviceptr drm = dev_from(rm, BN_C), drv = dev_from(rv, BN_C);
    CUdeviceptr dsm = dev_from(rm, BN_C), dsi = dev_from(rv, BN_C);
    float one = 1.0f, zero = 0.0f;
    ck_assert_int_eq(dnn.BNFwd(handle, CUDNN_BATCHNORM_SPATIAL, &one, &zero, xd, (void *)dx, xd,
                               (void *)dy, pd, (void *)ds, (void *)db, factor, (void *)drm,
                               (void *)drv, eps, (void *)dsm, (void *)dsi),
                     CUDNN_STATUS_SUCCESS);
    float *y = host_from(dy, BN_TOTAL), *grm = host_from(drm, BN_C), *grv = host_from(drv, BN_C);
    float *gsm = host_from(dsm, BN_C), *gsi = host_from(dsi, BN_C);
    double want_y[BN_TOTAL], want_rm[BN_C], want_rv[BN_C], want_sm[BN_C], want_si[BN_C];
    for (int c = 0; c < BN_C; c++) {
        double mean, var;
        bn_stats(x, c, &mean, &var);
        double inv = 1.0 / sqrt(var + eps);
        for (int n = 0; n < BN_N; n++)
            for (int i = 0; i < BN_H * BN_W; i++)
                want_y[bn_idx(n, c, i)] = scale[c] * (x[bn_idx(n, c, i)] - mean) * inv + bias[c];
        want_rm[c] = factor * mean + (1 - factor) * rm[c];
        want_rv[c] = factor * var * BN_M / (BN_M - 1) + (1 - factor) * rv[c];
        want_sm[c] = mean;
        want_si[c] = inv;
    }
    expect_close("y", y, want_y, BN_TOTAL);
    expect_close("running_mean", grm, want_rm, BN_C);
    expect_close("running_var", grv, want_rv, BN_C);
    expect_close("save_mean", gsm, want_sm, BN_C);
    expect_close("save_inv_var", gsi, want_si, BN_C);
    free(x), free(scale), free(bias), free(rm), free(rv);
    free(y), free(grm), free(grv), free(gsm), free(gsi);
    CUdeviceptr all[] = {dx, dy, ds, db, drm, drv, dsm, dsi};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        cuMemFree(all[i]);
    dnn.DestroyTensor(xd);
    dnn.DestroyTensor(pd);
}
END_TEST

/* _i == 0: with the saved statistics of the forward pass; _i == 1: without (recomputed). */
START_TEST(test_bn_backward_matches_reference) {
    const double eps = 1e-3;
    cudnnTensorDescriptor_t xd = tensor(BN_N, BN_C, BN_H, BN_W), pd;
    ck_assert_int_eq(dnn.CreateTensor(&pd), CUDNN_STATUS_SUCCESS);
    ck_assert_int_eq(dnn.DeriveBN(pd, xd, CUDNN_BATCHNORM_SPATIAL), CUDNN_STATUS_SUCCESS);
    float *x = host_rand(BN_TOTAL, 20), *dyv = host_rand(BN_TOTAL, 21);
    float *scale = host_rand(BN_C, 22);
    float sm[BN_C], si[BN_C];
    double want_dx[BN_TOTAL], want_ds[BN_C], want_db[BN_C];
    for (int c = 0; c < BN_C; c++) {
        double mean, var;
        bn_stats(x, c, &mean, &var);
        double inv = 1.0 / sqrt(var + eps), sdy = 0, sdyx = 0;
        sm[c] = (float)mean;
        si[c] = (float)inv;
        for (int n = 0; n < BN_N; n++)
            for (int i = 0; i < BN_H * BN_W; i++) {
                size_t k = bn_idx(n, c, i);
                sdy += dyv[k];
                sdyx += dyv[k] * (x[k] - mean) * inv;
            }
        for (int n = 0; n < BN_N; n++)
            for (int i = 0; i < BN_H * BN_W; i++) {
                size_t k = bn_idx(n, c, i);
                double xhat = (x[k] - mean) * inv;
                want_dx[k] = scale[c] * inv / BN_M * (BN_M * dyv[k] - sdy - xhat * sdyx);
            }
        want_ds[c] = sdyx;
        want_db[c] = sdy;
    }
    CUdeviceptr dx = dev_from(x, BN_TOTAL), ddy = dev_from(dyv, BN_TOTAL);
    CUdeviceptr ddx = dev_from(dyv, BN_TOTAL), ds = dev_from(scale, BN_C);
    CUdeviceptr dds = dev_from(scale, BN_C), ddb = dev_from(scale, BN_C);
    CUdeviceptr dsm = dev_from(sm, BN_C), dsi = dev_from(si, BN_C);
    float one = 1.0f, zero = 0.0f;
    int saved = _i == 0;
    ck_assert_int_eq(dnn.BNBwd(handle, CUDNN_BATCHNORM_SPATIAL, &one, &zero, &one, &zero, xd,
                               (void *)dx, xd, (void *)ddy, xd, (void *)ddx, pd, (void *)ds,
                               (void *)dds, (void *)ddb, eps, saved ? (void *)dsm : NULL,
                               saved ? (void *)dsi : NULL),
                     CUDNN_STATUS_SUCCESS);
    float *gdx = host_from(ddx, BN_TOTAL), *gds = host_from(dds, BN_C);
    float *gdb = host_from(ddb, BN_C);
    expect_close("dx", gdx, want_dx, BN_TOTAL);
    expect_close("dscale", gds, want_ds, BN_C);
    expect_close("dbias", gdb, want_db, BN_C);
    free(x), free(dyv), free(scale), free(gdx), free(gds), free(gdb);
    CUdeviceptr all[] = {dx, ddy, ddx, ds, dds, ddb, dsm, dsi};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        cuMemFree(all[i]);
    dnn.DestroyTensor(xd);
    dnn.DestroyTensor(pd);
}
END_TEST

/* ---- backend API ----------------------------------------------------------------------------- */

enum { UID_X = 10, UID_W = 11, UID_Y = 12 };

static cudnnBackendDescriptor_t bk_new(cudnnBackendDescriptorType_t type) {
    cudnnBackendDescriptor_t d = NULL;
    ck_assert_int_eq(dnn.BCreate(type, &d), CUDNN_STATUS_SUCCESS);
    return d;
}

static void bk_set(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                   cudnnBackendAttributeType_t type, int64_t n, const void *v) {
    ck_assert_int_eq(dnn.BSet(d, name, type, n, v), CUDNN_STATUS_SUCCESS);
}

static void bk_set_desc(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                        cudnnBackendDescriptor_t v) {
    bk_set(d, name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &v);
}

/* A tensor descriptor with every attribute but unique id set (n, c, h, w packed NCHW floats). */
static cudnnBackendDescriptor_t bk_tensor_unfinished(int64_t n, int64_t c, int64_t h, int64_t w) {
    cudnnBackendDescriptor_t t = bk_new(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    int64_t dims[4] = {n, c, h, w}, strides[4] = {c * h * w, h * w, w, 1}, align = 16;
    cudnnDataType_t f = CUDNN_DATA_FLOAT;
    bk_set(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f);
    bk_set(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims);
    bk_set(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides);
    bk_set(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align);
    return t;
}

static cudnnBackendDescriptor_t bk_tensor(int64_t uid, int64_t n, int64_t c, int64_t h, int64_t w) {
    cudnnBackendDescriptor_t t = bk_tensor_unfinished(n, c, h, w);
    bk_set(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
    ck_assert_int_eq(dnn.BFinalize(t), CUDNN_STATUS_SUCCESS);
    return t;
}

/* A convolution descriptor for g, not finalized (post paddings as given). */
static cudnnBackendDescriptor_t bk_conv(const shape_t *g, int64_t post_h, int64_t spatial) {
    cudnnBackendDescriptor_t d = bk_new(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR);
    int64_t dil[2] = {g->dil_h, g->dil_w}, str[2] = {g->str_h, g->str_w};
    int64_t pre[2] = {g->pad_h, g->pad_w}, post[2] = {post_h, g->pad_w};
    cudnnDataType_t f = CUDNN_DATA_FLOAT;
    cudnnConvolutionMode_t mode = g->mode;
    bk_set(d, CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f);
    bk_set(d, CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode);
    bk_set(d, CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &spatial);
    bk_set(d, CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, 2, dil);
    bk_set(d, CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, 2, str);
    bk_set(d, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, 2, pre);
    bk_set(d, CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, 2, post);
    return d;
}

/* A finalized execution plan for the convolution of cc on the fixture's handle, built as a
 * framework builds one: operation, graph, engine 0, its config, the plan. */
static cudnnBackendDescriptor_t bk_plan(const conv_case_t *cc, float alpha, float beta) {
    const shape_t *g = &cc->g;
    cudnnBackendDescriptor_t x = bk_tensor(UID_X, g->n, g->c, g->h, g->w);
    cudnnBackendDescriptor_t w = bk_tensor(UID_W, g->k, g->c, g->r, g->s);
    cudnnBackendDescriptor_t y = bk_tensor(UID_Y, g->n, g->k, cc->p, cc->q);
    cudnnBackendDescriptor_t cv = bk_conv(g, g->pad_h, 2);
    ck_assert_int_eq(dnn.BFinalize(cv), CUDNN_STATUS_SUCCESS);
    cudnnBackendDescriptor_t op = bk_new(CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR);
    bk_set_desc(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, x);
    bk_set_desc(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, w);
    bk_set_desc(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, y);
    bk_set_desc(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC, cv);
    bk_set(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA, CUDNN_TYPE_FLOAT, 1, &alpha);
    bk_set(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA, CUDNN_TYPE_FLOAT, 1, &beta);
    ck_assert_int_eq(dnn.BFinalize(op), CUDNN_STATUS_SUCCESS);
    cudnnBackendDescriptor_t graph = bk_new(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    bk_set_desc(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, op);
    bk_set(graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
    ck_assert_int_eq(dnn.BFinalize(graph), CUDNN_STATUS_SUCCESS);
    cudnnBackendDescriptor_t engine = bk_new(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
    int64_t index = 0;
    bk_set_desc(engine, CUDNN_ATTR_ENGINE_OPERATION_GRAPH, graph);
    bk_set(engine, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &index);
    ck_assert_int_eq(dnn.BFinalize(engine), CUDNN_STATUS_SUCCESS);
    cudnnBackendDescriptor_t cfg = bk_new(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    bk_set_desc(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, engine);
    ck_assert_int_eq(dnn.BFinalize(cfg), CUDNN_STATUS_SUCCESS);
    cudnnBackendDescriptor_t plan = bk_new(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
    bk_set_desc(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, cfg);
    bk_set(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
    ck_assert_int_eq(dnn.BFinalize(plan), CUDNN_STATUS_SUCCESS);
    /* Every descriptor set into another was copied there. */
    cudnnBackendDescriptor_t done[] = {x, w, y, cv, op, graph, engine, cfg};
    for (size_t i = 0; i < sizeof done / sizeof done[0]; i++)
        ck_assert_int_eq(dnn.BDestroy(done[i]), CUDNN_STATUS_SUCCESS);
    return plan;
}

/* A variant pack for x, w, y (unique ids UID_X, UID_W, UID_Y) and the workspace; finalized. */
static cudnnBackendDescriptor_t bk_pack(CUdeviceptr x, CUdeviceptr w, CUdeviceptr y,
                                        CUdeviceptr ws) {
    cudnnBackendDescriptor_t d = bk_new(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
    int64_t ids[3] = {UID_Y, UID_X, UID_W};
    void *ptrs[3] = {(void *)y, (void *)x, (void *)w}, *work = (void *)ws;
    bk_set(d, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, 3, ids);
    bk_set(d, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, 3, ptrs);
    bk_set(d, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &work);
    ck_assert_int_eq(dnn.BFinalize(d), CUDNN_STATUS_SUCCESS);
    return d;
}

static int64_t plan_workspace(cudnnBackendDescriptor_t plan) {
    int64_t ws = 0, n = 0;
    ck_assert_int_eq(
        dnn.BGet(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n, &ws),
        CUDNN_STATUS_SUCCESS);
    ck_assert_int_eq(n, 1);
    return ws;
}

/* The backend API's convolution forward writes, bit for bit, what cudnnConvolutionForward
 * writes (and so the host reference's values), for each alpha/beta pair; the plan asks for a
 * workspace and the execution is one copy and one launch. */
START_TEST(test_backend_conv_forward_matches_legacy) {
    conv_case_t cc;
    conv_case_init(&cc, &shapes[_i]);
    float *x = host_rand(cc.nx, 1), *w = host_rand(cc.nw, 2), *y0 = host_rand(cc.ny, 3);
    double *want = calloc(cc.ny, sizeof *want);
    ref_t r = {x, w, NULL, want};
    for_each_tap(&cc, tap_fwd, &r);
    CUdeviceptr dx = dev_from(x, cc.nx), dw = dev_from(w, cc.nw);
    for (int b = 0; b < 3; b++) {
        CUdeviceptr dy_legacy = dev_from(y0, cc.ny), dy = dev_from(y0, cc.ny), ws;
        ck_assert_int_eq(dnn.ConvFwd(handle, &alphas[b], cc.xd, (void *)dx, cc.wd, (void *)dw,
                                     cc.cd, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, NULL, 0,
                                     &betas[b], cc.yd, (void *)dy_legacy),
                         CUDNN_STATUS_SUCCESS);
        cudnnBackendDescriptor_t plan = bk_plan(&cc, alphas[b], betas[b]);
        int64_t wsb = plan_workspace(plan);
        ck_assert_int_ge(wsb, 64);
        ck_assert_int_eq(cuMemAlloc(&ws, (size_t)wsb), CUDA_SUCCESS);
        cudnnBackendDescriptor_t pack = bk_pack(dx, dw, dy, ws);
        uint64_t launches = fakecuda_call_count("cuLaunchKernel");
        uint64_t copies = fakecuda_call_count("cuMemcpyHtoDAsync");
        ck_assert_int_eq(dnn.BExecute(handle, plan, pack), CUDNN_STATUS_SUCCESS);
        ck_assert_uint_eq(fakecuda_call_count("cuLaunchKernel"), launches + 1);
        ck_assert_uint_eq(fakecuda_call_count("cuMemcpyHtoDAsync"), copies + 1);
        float *got = host_from(dy, cc.ny), *legacy = host_from(dy_legacy, cc.ny);
        ck_assert_msg(memcmp(got, legacy, cc.ny * sizeof(float)) == 0,
                      "backend and legacy forward differ (alpha %g, beta %g)", alphas[b], betas[b]);
        double *blended = malloc(cc.ny * sizeof *blended);
        for (size_t i = 0; i < cc.ny; i++)
            blended[i] = alphas[b] * want[i] + betas[b] * y0[i];
        expect_close("y", got, blended, cc.ny);
        ck_assert_int_eq(dnn.BDestroy(pack), CUDNN_STATUS_SUCCESS);
        ck_assert_int_eq(dnn.BDestroy(plan), CUDNN_STATUS_SUCCESS);
        free(got), free(legacy), free(blended);
        cuMemFree(dy), cuMemFree(dy_legacy), cuMemFree(ws);
    }
    cuMemFree(dx);
    cuMemFree(dw);
    free(x), free(w), free(y0), free(want);
    conv_case_fini(&cc);
}
END_TEST

static int category(cudnnStatus_t st) {
    return CUDNN_STATUS_CATEGORY(st);
}

/* Wrong attribute types, counts and names are BAD_PARAM; unsupported problems NOT_SUPPORTED;
 * reading or executing an unfinalized descriptor, or setting a finalized one, NOT_INITIALIZED. */
START_TEST(test_backend_rejects_bad_attributes_and_unfinalized_use) {
    cudnnBackendDescriptor_t d = NULL;
    ck_assert_int_eq(category(dnn.BCreate(CUDNN_BACKEND_POINTWISE_DESCRIPTOR, &d)),
                     CUDNN_STATUS_NOT_SUPPORTED);
    cudnnBackendDescriptor_t t = bk_tensor_unfinished(2, 3, 4, 5);
    int64_t dims[4] = {2, 3, 4, 5}, uid = 7, got = 0, n = 0;
    int32_t dims32[4] = {2, 3, 4, 5};
    cudnnDataType_t f = CUDNN_DATA_FLOAT;
    ck_assert_int_eq(dnn.BSet(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT32, 4, dims32),
                     CUDNN_STATUS_BAD_PARAM);
    ck_assert_int_eq(dnn.BSet(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 0, dims),
                     CUDNN_STATUS_BAD_PARAM);
    ck_assert_int_eq(dnn.BSet(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 2, dims),
                     CUDNN_STATUS_BAD_PARAM);
    ck_assert_int_eq(dnn.BSet(t, CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f),
                     CUDNN_STATUS_BAD_PARAM);
    ck_assert_int_eq(dnn.BFinalize(t), CUDNN_STATUS_BAD_PARAM); /* no unique id */
    ck_assert_int_eq(dnn.BGet(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, &n, dims),
                     CUDNN_STATUS_NOT_INITIALIZED);
    bk_set(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
    ck_assert_int_eq(dnn.BFinalize(t), CUDNN_STATUS_SUCCESS);
    ck_assert_int_eq(dnn.BSet(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid),
                     CUDNN_STATUS_NOT_INITIALIZED);
    ck_assert_int_eq(dnn.BGet(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &n, &got),
                     CUDNN_STATUS_SUCCESS);
    ck_assert_int_eq(got, uid);
    ck_assert_int_eq(dnn.BGet(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_FLOAT, 1, &n, &got),
                     CUDNN_STATUS_BAD_PARAM);
    dnn.BDestroy(t);

    /* Half precision and NHWC strides are valid tensors no engine here runs. */
    cudnnBackendDescriptor_t h = bk_tensor_unfinished(2, 3, 4, 5);
    cudnnDataType_t half = CUDNN_DATA_HALF;
    bk_set(h, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &half);
    bk_set(h, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
    ck_assert_int_eq(category(dnn.BFinalize(h)), CUDNN_STATUS_NOT_SUPPORTED);
    dnn.BDestroy(h);
    cudnnBackendDescriptor_t nhwc = bk_tensor_unfinished(2, 3, 4, 5);
    int64_t strides[4] = {60, 1, 15, 3};
    bk_set(nhwc, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides);
    bk_set(nhwc, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
    ck_assert_int_eq(category(dnn.BFinalize(nhwc)), CUDNN_STATUS_NOT_SUPPORTED);
    dnn.BDestroy(nhwc);

    /* Asymmetric padding and 3 spatial dimensions are not supported. */
    cudnnBackendDescriptor_t cv = bk_conv(&shapes[0], shapes[0].pad_h + 1, 2);
    ck_assert_int_eq(category(dnn.BFinalize(cv)), CUDNN_STATUS_NOT_SUPPORTED);
    dnn.BDestroy(cv);
    cv = bk_conv(&shapes[0], shapes[0].pad_h, 3);
    ck_assert_int_eq(category(dnn.BFinalize(cv)), CUDNN_STATUS_NOT_SUPPORTED);
    dnn.BDestroy(cv);

    /* An operation takes finalized descriptors of the right type, and shapes that agree. */
    cudnnBackendDescriptor_t op = bk_new(CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR);
    cudnnBackendDescriptor_t raw = bk_tensor_unfinished(1, 1, 3, 3);
    cudnnBackendDescriptor_t x = bk_tensor(UID_X, 1, 1, 3, 3), w = bk_tensor(UID_W, 1, 1, 3, 3);
    cudnnBackendDescriptor_t y = bk_tensor(UID_Y, 1, 1, 2, 2);
    ck_assert_int_eq(dnn.BSet(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X,
                              CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &raw),
                     CUDNN_STATUS_BAD_PARAM);
    cv = bk_conv(&shapes[1], shapes[1].pad_h, 2); /* 3x3, pad 1, stride 1: y would be 3x3 */
    ck_assert_int_eq(dnn.BFinalize(cv), CUDNN_STATUS_SUCCESS);
    ck_assert_int_eq(dnn.BSet(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X,
                              CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cv),
                     CUDNN_STATUS_BAD_PARAM);
    bk_set_desc(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, x);
    bk_set_desc(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, w);
    bk_set_desc(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, y);
    ck_assert_int_eq(dnn.BFinalize(op), CUDNN_STATUS_BAD_PARAM); /* no convolution */
    bk_set_desc(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC, cv);
    ck_assert_int_eq(category(dnn.BFinalize(op)), CUDNN_STATUS_BAD_PARAM);
    cudnnBackendDescriptor_t all[] = {op, raw, x, w, y, cv};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        dnn.BDestroy(all[i]);

    /* Executing an unfinalized plan or pack. */
    conv_case_t cc;
    conv_case_init(&cc, &shapes[0]);
    cudnnBackendDescriptor_t plan = bk_plan(&cc, 1.0f, 0.0f);
    cudnnBackendDescriptor_t bare = bk_new(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
    cudnnBackendDescriptor_t pack = bk_new(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
    ck_assert_int_eq(dnn.BExecute(handle, plan, pack), CUDNN_STATUS_NOT_INITIALIZED);
    ck_assert_int_eq(dnn.BFinalize(pack), CUDNN_STATUS_SUCCESS);
    ck_assert_int_eq(dnn.BExecute(handle, bare, pack), CUDNN_STATUS_NOT_INITIALIZED);
    ck_assert_int_eq(dnn.BFinalize(bare), CUDNN_STATUS_BAD_PARAM); /* no engine config */
    ck_assert_int_eq(dnn.BExecute(handle, plan, pack), CUDNN_STATUS_BAD_PARAM); /* no operands */
    dnn.BDestroy(plan), dnn.BDestroy(bare), dnn.BDestroy(pack);
    conv_case_fini(&cc);
}
END_TEST

/* Without a workspace, with one smaller than the plan asks for, or without an operand, the
 * execution is BAD_PARAM and leaves y alone; with them it runs. */
START_TEST(test_backend_execute_needs_workspace) {
    conv_case_t cc;
    conv_case_init(&cc, &shapes[0]);
    float *x = host_rand(cc.nx, 1), *w = host_rand(cc.nw, 2), *y0 = host_rand(cc.ny, 3);
    CUdeviceptr dx = dev_from(x, cc.nx), dw = dev_from(w, cc.nw), dy = dev_from(y0, cc.ny);
    cudnnBackendDescriptor_t plan = bk_plan(&cc, 1.0f, 0.0f);
    CUdeviceptr small, ws;
    ck_assert_int_eq(cuMemAlloc(&small, 16), CUDA_SUCCESS);
    ck_assert_int_eq(cuMemAlloc(&ws, (size_t)plan_workspace(plan)), CUDA_SUCCESS);
    cudnnBackendDescriptor_t packs[] = {bk_pack(dx, dw, dy, 0), bk_pack(dx, dw, dy, small),
                                        bk_pack(dx, dw, dy, ws + 8), bk_pack(dx, 0, dy, ws)};
    for (size_t i = 0; i < sizeof packs / sizeof packs[0]; i++) {
        ck_assert_msg(dnn.BExecute(handle, plan, packs[i]) == CUDNN_STATUS_BAD_PARAM, "pack %zu",
                      i);
        dnn.BDestroy(packs[i]);
    }
    float *got = host_from(dy, cc.ny);
    ck_assert(memcmp(got, y0, cc.ny * sizeof(float)) == 0);
    free(got);
    cudnnBackendDescriptor_t pack = bk_pack(dx, dw, dy, ws);
    ck_assert_int_eq(dnn.BExecute(handle, plan, pack), CUDNN_STATUS_SUCCESS);
    got = host_from(dy, cc.ny);
    ck_assert(memcmp(got, y0, cc.ny * sizeof(float)) != 0);
    free(got);
    dnn.BDestroy(pack), dnn.BDestroy(plan);
    cuMemFree(dx), cuMemFree(dw), cuMemFree(dy), cuMemFree(small), cuMemFree(ws);
    free(x), free(w), free(y0);
    conv_case_fini(&cc);
}
END_TEST

/* A variant pack cannot be read back, as on the real cuDNN 9.19: the counts alone (NULL array),
 * the ids, pointers and workspace are all NOT_SUPPORTED, so a hook must keep what was set. The
 * plan gives back its configuration into a descriptor the caller created. */
START_TEST(test_backend_variant_pack_is_write_only) {
    CUdeviceptr x = 0x1000, w = 0x2000, y = 0x3000, ws = 0x4000;
    cudnnBackendDescriptor_t pack = bk_pack(x, w, y, ws);
    int64_t n = 0, ids[4] = {0};
    void *ptrs[4] = {NULL}, *work = NULL;
    ck_assert_int_eq(
        dnn.BGet(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, 0, &n, NULL),
        CUDNN_STATUS_NOT_SUPPORTED);
    ck_assert_int_eq(
        dnn.BGet(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, 4, &n, ids),
        CUDNN_STATUS_NOT_SUPPORTED);
    ck_assert_int_eq(
        dnn.BGet(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, 2, &n, ptrs),
        CUDNN_STATUS_NOT_SUPPORTED);
    ck_assert_int_eq(
        dnn.BGet(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &n, &work),
        CUDNN_STATUS_NOT_SUPPORTED);
    ck_assert(ptrs[0] == NULL && work == NULL && n == 0);
    dnn.BDestroy(pack);

    conv_case_t cc;
    conv_case_init(&cc, &shapes[0]);
    cudnnBackendDescriptor_t plan = bk_plan(&cc, 1.0f, 0.0f);
    cudnnBackendDescriptor_t cfg = bk_new(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    ck_assert_int_eq(dnn.BGet(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
                              CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &cfg),
                     CUDNN_STATUS_SUCCESS);
    cudnnBackendDescriptor_t engine = bk_new(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
    ck_assert_int_eq(
        dnn.BGet(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &engine),
        CUDNN_STATUS_SUCCESS);
    int64_t index = -1;
    ck_assert_int_eq(
        dnn.BGet(engine, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &n, &index),
        CUDNN_STATUS_SUCCESS);
    ck_assert_int_eq(index, 0);
    dnn.BDestroy(engine), dnn.BDestroy(cfg), dnn.BDestroy(plan);
    conv_case_fini(&cc);
}
END_TEST

Suite *suite_cudnn(void);
Suite *suite_cudnn(void) {
    Suite *s = suite_create("cudnn");
    TCase *tc = tcase_create("conv");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 30);
    tcase_add_loop_test(tc, test_conv_forward_matches_reference, 0, NSHAPES);
    tcase_add_loop_test(tc, test_conv_backward_data_matches_reference, 0, NSHAPES);
    tcase_add_loop_test(tc, test_conv_backward_filter_matches_reference, 0, NSHAPES);
    tcase_add_test(tc, test_conv_rejects_bad_shapes_and_types);
    suite_add_tcase(s, tc);
    tc = tcase_create("batchnorm");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, test_bn_forward_training_matches_reference);
    tcase_add_loop_test(tc, test_bn_backward_matches_reference, 0, 2);
    suite_add_tcase(s, tc);
    tc = tcase_create("backend");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 30);
    tcase_add_loop_test(tc, test_backend_conv_forward_matches_legacy, 0, NSHAPES);
    tcase_add_test(tc, test_backend_rejects_bad_attributes_and_unfinalized_use);
    tcase_add_test(tc, test_backend_execute_needs_workspace);
    tcase_add_test(tc, test_backend_variant_pack_is_write_only);
    suite_add_tcase(s, tc);
    return s;
}
