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
    return s;
}
