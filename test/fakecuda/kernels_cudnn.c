/* SPDX-License-Identifier: MIT */
/* kernels_cudnn.c: the convolution and batch-norm kernels (module "cudnn") that the simulated
 * libcudnn.so.9 launches.
 *
 * Direct loops over NCHW float tensors, one output element at a time in a fixed order, so that
 * results are bit-identical across runs and schedulers. Reductions accumulate in double (still
 * deterministic: the order is fixed). Parameter layouts are in fc_cudnn.h; cudnn.c is the only
 * launcher. The kernels keep no state. */
#include "fc_ktab.h"
#include "fc_cudnn.h"

#include <math.h>
#include <stdint.h>

#define P_PTR  sizeof(CUdeviceptr)
#define P_INT  sizeof(int)
#define P_F32  sizeof(float)
#define P_F64  sizeof(double)
#define P_GEOM sizeof(fc_conv_geom_t)

static float *fview(fakecuda_launch_t *l, CUdeviceptr p, uint64_t n, int write) {
    return fakecuda_access(l, p, (size_t)n * sizeof(float), write);
}

static float blend(float alpha, double acc, float beta, float old) {
    return beta == 0.0f ? alpha * (float)acc : alpha * (float)acc + beta * old;
}

static uint64_t x_elems(const fc_conv_geom_t *g) {
    return (uint64_t)g->n * (uint64_t)g->c * (uint64_t)g->h * (uint64_t)g->w;
}
static uint64_t w_elems(const fc_conv_geom_t *g) {
    return (uint64_t)g->k * (uint64_t)g->c * (uint64_t)g->r * (uint64_t)g->s;
}
static uint64_t y_elems(const fc_conv_geom_t *g) {
    return (uint64_t)g->n * (uint64_t)g->k * (uint64_t)g->p * (uint64_t)g->q;
}

/* Index into the filter for tap (r, s): flipped for true convolution. */
static size_t widx(const fc_conv_geom_t *g, int k, int c, int r, int s) {
    int rr = g->cross ? r : g->r - 1 - r, ss = g->cross ? s : g->s - 1 - s;
    return (((size_t)k * (size_t)g->c + (size_t)c) * (size_t)g->r + (size_t)rr) * (size_t)g->s +
           (size_t)ss;
}

static double conv_flops(const fc_conv_geom_t *g) {
    return 2.0 * (double)y_elems(g) * (double)g->c * g->r * g->s;
}

static double conv_bytes(const fc_conv_geom_t *g) {
    return 4.0 * (double)(x_elems(g) + w_elems(g) + y_elems(g));
}

/* y[n,k,p,q] = alpha * sum_{c,r,s} x[n,c,ih,iw] * w[k,c,r,s] + beta * y, for both forward
 * kernels (one arithmetic, so the two entry points agree bit for bit). */
static int conv_fwd(fakecuda_launch_t *l, CUdeviceptr xp, CUdeviceptr wp, CUdeviceptr yp,
                    const fc_conv_geom_t *g, float alpha, float beta) {
    if (y_elems(g) == 0)
        return 0;
    const float *x = fview(l, xp, x_elems(g), 0), *w = fview(l, wp, w_elems(g), 0);
    float *y = fview(l, yp, y_elems(g), 1);
    if (!x || !w || !y)
        return -1;
    size_t yi = 0;
    for (int n = 0; n < g->n; n++)
        for (int k = 0; k < g->k; k++)
            for (int p = 0; p < g->p; p++)
                for (int q = 0; q < g->q; q++, yi++) {
                    double acc = 0.0;
                    for (int c = 0; c < g->c; c++) {
                        const float *xc =
                            x + ((size_t)n * (size_t)g->c + (size_t)c) * (size_t)g->h * g->w;
                        for (int r = 0; r < g->r; r++) {
                            int ih = p * g->str_h - g->pad_h + r * g->dil_h;
                            if (ih < 0 || ih >= g->h)
                                continue;
                            for (int s = 0; s < g->s; s++) {
                                int iw = q * g->str_w - g->pad_w + s * g->dil_w;
                                if (iw < 0 || iw >= g->w)
                                    continue;
                                acc += (double)(xc[(size_t)ih * (size_t)g->w + (size_t)iw] *
                                                w[widx(g, k, c, r, s)]);
                            }
                        }
                    }
                    y[yi] = blend(alpha, acc, beta, y[yi]);
                }
    fakecuda_work(l, conv_flops(g), conv_bytes(g));
    return 0;
}

/* conv_fwd_f32(x, w, y, geom, alpha, beta). */
static int k_conv_fwd(fakecuda_launch_t *l) {
    return conv_fwd(l, FAKECUDA_ARG(l, 0, CUdeviceptr), FAKECUDA_ARG(l, 1, CUdeviceptr),
                    FAKECUDA_ARG(l, 2, CUdeviceptr), &FAKECUDA_ARG(l, 3, fc_conv_geom_t),
                    FAKECUDA_ARG(l, 4, float), FAKECUDA_ARG(l, 5, float));
}

/* A geometry read from memory, not from the launcher: every extent and step positive, padding
 * non-negative. The loops skip taps outside the input, so the three views bound every access. */
static int geom_ok(const fc_conv_geom_t *g) {
    return g->n > 0 && g->c > 0 && g->h > 0 && g->w > 0 && g->k > 0 && g->r > 0 && g->s > 0 &&
           g->p > 0 && g->q > 0 && g->pad_h >= 0 && g->pad_w >= 0 && g->str_h > 0 && g->str_w > 0 &&
           g->dil_h > 0 && g->dil_w > 0;
}

/* conv_fwd_table_f32(workspace): the backend API's convolution forward. Its one parameter is the
 * workspace, where the library copied an fc_conv_table_t on the same stream; the operands'
 * addresses and the geometry are read from there, through the same access checks as the
 * operands themselves. A table that is not device memory, or not a sane geometry, faults. */
static int k_conv_fwd_table(fakecuda_launch_t *l) {
    const fc_conv_table_t *tp =
        fakecuda_access(l, FAKECUDA_ARG(l, 0, CUdeviceptr), sizeof(fc_conv_table_t), 0);
    if (!tp)
        return -1;
    fc_conv_table_t t = *tp;
    if (!geom_ok(&t.geom))
        return -1;
    return conv_fwd(l, (CUdeviceptr)t.x, (CUdeviceptr)t.w, (CUdeviceptr)t.y, &t.geom, t.alpha,
                    t.beta);
}

/* conv_bwd_data_f32: dx[n,c,ih,iw] = alpha * sum over the (k, r, s) taps that read (ih, iw) of
 * dy[n,k,p,q] * w[k,c,r,s] + beta * dx. */
static int k_conv_bwd_data(fakecuda_launch_t *l) {
    CUdeviceptr wp = FAKECUDA_ARG(l, 0, CUdeviceptr), dyp = FAKECUDA_ARG(l, 1, CUdeviceptr);
    CUdeviceptr dxp = FAKECUDA_ARG(l, 2, CUdeviceptr);
    const fc_conv_geom_t *g = &FAKECUDA_ARG(l, 3, fc_conv_geom_t);
    float alpha = FAKECUDA_ARG(l, 4, float), beta = FAKECUDA_ARG(l, 5, float);
    if (x_elems(g) == 0)
        return 0;
    const float *w = fview(l, wp, w_elems(g), 0), *dy = fview(l, dyp, y_elems(g), 0);
    float *dx = fview(l, dxp, x_elems(g), 1);
    if (!w || !dy || !dx)
        return -1;
    size_t xi = 0;
    for (int n = 0; n < g->n; n++)
        for (int c = 0; c < g->c; c++)
            for (int ih = 0; ih < g->h; ih++)
                for (int iw = 0; iw < g->w; iw++, xi++) {
                    double acc = 0.0;
                    for (int k = 0; k < g->k; k++) {
                        const float *dyk =
                            dy + ((size_t)n * (size_t)g->k + (size_t)k) * (size_t)g->p * g->q;
                        for (int r = 0; r < g->r; r++) {
                            int ph = ih + g->pad_h - r * g->dil_h;
                            if (ph < 0 || ph % g->str_h != 0 || ph / g->str_h >= g->p)
                                continue;
                            int p = ph / g->str_h;
                            for (int s = 0; s < g->s; s++) {
                                int qw = iw + g->pad_w - s * g->dil_w;
                                if (qw < 0 || qw % g->str_w != 0 || qw / g->str_w >= g->q)
                                    continue;
                                int q = qw / g->str_w;
                                acc += (double)(dyk[(size_t)p * (size_t)g->q + (size_t)q] *
                                                w[widx(g, k, c, r, s)]);
                            }
                        }
                    }
                    dx[xi] = blend(alpha, acc, beta, dx[xi]);
                }
    fakecuda_work(l, conv_flops(g), conv_bytes(g));
    return 0;
}

/* conv_bwd_filter_f32: dw[k,c,r,s] = alpha * sum_{n,p,q} dy[n,k,p,q] * x[n,c,ih,iw] + beta * dw
 * (for true convolution the tap (r, s) is stored flipped, as the forward reads it). */
static int k_conv_bwd_filter(fakecuda_launch_t *l) {
    CUdeviceptr xp = FAKECUDA_ARG(l, 0, CUdeviceptr), dyp = FAKECUDA_ARG(l, 1, CUdeviceptr);
    CUdeviceptr dwp = FAKECUDA_ARG(l, 2, CUdeviceptr);
    const fc_conv_geom_t *g = &FAKECUDA_ARG(l, 3, fc_conv_geom_t);
    float alpha = FAKECUDA_ARG(l, 4, float), beta = FAKECUDA_ARG(l, 5, float);
    if (w_elems(g) == 0)
        return 0;
    const float *x = x_elems(g) ? fview(l, xp, x_elems(g), 0) : NULL;
    const float *dy = y_elems(g) ? fview(l, dyp, y_elems(g), 0) : NULL;
    float *dw = fview(l, dwp, w_elems(g), 1);
    if ((x_elems(g) && !x) || (y_elems(g) && !dy) || !dw)
        return -1;
    for (int k = 0; k < g->k; k++)
        for (int c = 0; c < g->c; c++)
            for (int r = 0; r < g->r; r++)
                for (int s = 0; s < g->s; s++) {
                    double acc = 0.0;
                    for (int n = 0; n < g->n; n++) {
                        const float *dyk =
                            dy + ((size_t)n * (size_t)g->k + (size_t)k) * (size_t)g->p * g->q;
                        const float *xc =
                            x + ((size_t)n * (size_t)g->c + (size_t)c) * (size_t)g->h * g->w;
                        for (int p = 0; p < g->p; p++) {
                            int ih = p * g->str_h - g->pad_h + r * g->dil_h;
                            if (ih < 0 || ih >= g->h)
                                continue;
                            for (int q = 0; q < g->q; q++) {
                                int iw = q * g->str_w - g->pad_w + s * g->dil_w;
                                if (iw < 0 || iw >= g->w)
                                    continue;
                                acc += (double)(dyk[(size_t)p * (size_t)g->q + (size_t)q] *
                                                xc[(size_t)ih * (size_t)g->w + (size_t)iw]);
                            }
                        }
                    }
                    size_t wi = widx(g, k, c, r, s);
                    dw[wi] = blend(alpha, acc, beta, dw[wi]);
                }
    fakecuda_work(l, conv_flops(g), conv_bytes(g));
    return 0;
}

/* The optional per-channel vectors of a batch norm: NULL and success when p is 0. */
static int opt_view(fakecuda_launch_t *l, CUdeviceptr p, int c, int write, float **out) {
    *out = NULL;
    if (p == 0)
        return 0;
    *out = fview(l, p, (uint64_t)c, write);
    return *out ? 0 : -1;
}

/* Mean and biased variance of channel ci over n x hw elements, two-pass, in double. */
static void channel_stats(const float *x, int n, int c, int hw, int ci, double *mean, double *var) {
    double m = (double)n * hw, sum = 0.0, sq = 0.0;
    for (int b = 0; b < n; b++) {
        const float *xb = x + ((size_t)b * (size_t)c + (size_t)ci) * (size_t)hw;
        for (int i = 0; i < hw; i++)
            sum += xb[i];
    }
    *mean = sum / m;
    for (int b = 0; b < n; b++) {
        const float *xb = x + ((size_t)b * (size_t)c + (size_t)ci) * (size_t)hw;
        for (int i = 0; i < hw; i++) {
            double d = xb[i] - *mean;
            sq += d * d;
        }
    }
    *var = sq / m;
}

/* bn_fwd_train_f32: per channel, normalise over n x hw with the batch statistics, then
 * y = alpha * (scale * xhat + bias) + beta * y. Updates the running statistics with the
 * exponential average factor (running variance unbiased, as cuDNN) and saves the mean and
 * 1/sqrt(var + eps) for the backward pass. */
static int k_bn_fwd_train(fakecuda_launch_t *l) {
    CUdeviceptr xp = FAKECUDA_ARG(l, 0, CUdeviceptr), yp = FAKECUDA_ARG(l, 1, CUdeviceptr);
    CUdeviceptr sp = FAKECUDA_ARG(l, 2, CUdeviceptr), bp = FAKECUDA_ARG(l, 3, CUdeviceptr);
    int n = FAKECUDA_ARG(l, 8, int), c = FAKECUDA_ARG(l, 9, int), hw = FAKECUDA_ARG(l, 10, int);
    double factor = FAKECUDA_ARG(l, 11, double), eps = FAKECUDA_ARG(l, 12, double);
    float alpha = FAKECUDA_ARG(l, 13, float), beta = FAKECUDA_ARG(l, 14, float);
    uint64_t total = (uint64_t)n * (uint64_t)c * (uint64_t)hw;
    if (total == 0)
        return 0;
    const float *x = fview(l, xp, total, 0), *scale = fview(l, sp, (uint64_t)c, 0);
    const float *bias = fview(l, bp, (uint64_t)c, 0);
    float *y = fview(l, yp, total, 1);
    float *rmean, *rvar, *smean, *sinv;
    if (!x || !scale || !bias || !y || opt_view(l, FAKECUDA_ARG(l, 4, CUdeviceptr), c, 1, &rmean) ||
        opt_view(l, FAKECUDA_ARG(l, 5, CUdeviceptr), c, 1, &rvar) ||
        opt_view(l, FAKECUDA_ARG(l, 6, CUdeviceptr), c, 1, &smean) ||
        opt_view(l, FAKECUDA_ARG(l, 7, CUdeviceptr), c, 1, &sinv))
        return -1;
    double m = (double)n * hw;
    for (int ci = 0; ci < c; ci++) {
        double mean, var;
        channel_stats(x, n, c, hw, ci, &mean, &var);
        double inv = 1.0 / sqrt(var + eps);
        for (int b = 0; b < n; b++) {
            size_t off = ((size_t)b * (size_t)c + (size_t)ci) * (size_t)hw;
            for (int i = 0; i < hw; i++) {
                double v = scale[ci] * ((x[off + i] - mean) * inv) + bias[ci];
                y[off + i] = blend(alpha, v, beta, y[off + i]);
            }
        }
        if (rmean)
            rmean[ci] = (float)(factor * mean + (1.0 - factor) * rmean[ci]);
        if (rvar)
            rvar[ci] =
                (float)(factor * (m > 1 ? var * m / (m - 1) : var) + (1.0 - factor) * rvar[ci]);
        if (smean)
            smean[ci] = (float)mean;
        if (sinv)
            sinv[ci] = (float)inv;
    }
    fakecuda_work(l, 8.0 * (double)total, 12.0 * (double)total);
    return 0;
}

/* bn_bwd_f32: per channel, with xhat = (x - mean) * inv_std (the saved statistics when both are
 * given, else recomputed from x with eps) and m = n * hw:
 *   dx = alpha_data * scale * inv_std / m * (m*dy - sum(dy) - xhat * sum(dy*xhat)) + beta_data*dx
 *   dscale = alpha_param * sum(dy*xhat) + beta_param * dscale
 *   dbias = alpha_param * sum(dy) + beta_param * dbias */
static int k_bn_bwd(fakecuda_launch_t *l) {
    CUdeviceptr xp = FAKECUDA_ARG(l, 0, CUdeviceptr), dyp = FAKECUDA_ARG(l, 1, CUdeviceptr);
    CUdeviceptr dxp = FAKECUDA_ARG(l, 2, CUdeviceptr), sp = FAKECUDA_ARG(l, 3, CUdeviceptr);
    CUdeviceptr dsp = FAKECUDA_ARG(l, 4, CUdeviceptr), dbp = FAKECUDA_ARG(l, 5, CUdeviceptr);
    int n = FAKECUDA_ARG(l, 8, int), c = FAKECUDA_ARG(l, 9, int), hw = FAKECUDA_ARG(l, 10, int);
    double eps = FAKECUDA_ARG(l, 11, double);
    float ad = FAKECUDA_ARG(l, 12, float), bd = FAKECUDA_ARG(l, 13, float);
    float ap = FAKECUDA_ARG(l, 14, float), bpar = FAKECUDA_ARG(l, 15, float);
    uint64_t total = (uint64_t)n * (uint64_t)c * (uint64_t)hw;
    if (total == 0)
        return 0;
    const float *x = fview(l, xp, total, 0), *dy = fview(l, dyp, total, 0);
    const float *scale = fview(l, sp, (uint64_t)c, 0);
    float *dx = fview(l, dxp, total, 1), *ds = fview(l, dsp, (uint64_t)c, 1);
    float *db = fview(l, dbp, (uint64_t)c, 1);
    float *smean, *sinv;
    if (!x || !dy || !scale || !dx || !ds || !db ||
        opt_view(l, FAKECUDA_ARG(l, 6, CUdeviceptr), c, 0, &smean) ||
        opt_view(l, FAKECUDA_ARG(l, 7, CUdeviceptr), c, 0, &sinv))
        return -1;
    double m = (double)n * hw;
    for (int ci = 0; ci < c; ci++) {
        double mean, inv;
        if (smean && sinv) {
            mean = smean[ci];
            inv = sinv[ci];
        } else {
            double var;
            channel_stats(x, n, c, hw, ci, &mean, &var);
            inv = 1.0 / sqrt(var + eps);
        }
        double sdy = 0.0, sdyx = 0.0;
        for (int b = 0; b < n; b++) {
            size_t off = ((size_t)b * (size_t)c + (size_t)ci) * (size_t)hw;
            for (int i = 0; i < hw; i++) {
                sdy += dy[off + i];
                sdyx += dy[off + i] * ((x[off + i] - mean) * inv);
            }
        }
        double k = scale[ci] * inv / m;
        for (int b = 0; b < n; b++) {
            size_t off = ((size_t)b * (size_t)c + (size_t)ci) * (size_t)hw;
            for (int i = 0; i < hw; i++) {
                double xhat = (x[off + i] - mean) * inv;
                double v = k * (m * dy[off + i] - sdy - xhat * sdyx);
                dx[off + i] = blend(ad, v, bd, dx[off + i]);
            }
        }
        ds[ci] = blend(ap, sdyx, bpar, ds[ci]);
        db[ci] = blend(ap, sdy, bpar, db[ci]);
    }
    fakecuda_work(l, 12.0 * (double)total, 16.0 * (double)total);
    return 0;
}

static const fakecuda_kernel_t cudnn_kernels[] = {
    {"cudnn", "conv_fwd_f32", 6, {P_PTR, P_PTR, P_PTR, P_GEOM, P_F32, P_F32}, k_conv_fwd},
    {"cudnn", "conv_bwd_data_f32", 6, {P_PTR, P_PTR, P_PTR, P_GEOM, P_F32, P_F32}, k_conv_bwd_data},
    {"cudnn",
     "conv_bwd_filter_f32",
     6,
     {P_PTR, P_PTR, P_PTR, P_GEOM, P_F32, P_F32},
     k_conv_bwd_filter},
    {"cudnn",
     "bn_fwd_train_f32",
     15,
     {P_PTR, P_PTR, P_PTR, P_PTR, P_PTR, P_PTR, P_PTR, P_PTR, P_INT, P_INT, P_INT, P_F64, P_F64,
      P_F32, P_F32},
     k_bn_fwd_train},
    {"cudnn",
     "bn_bwd_f32",
     16,
     {P_PTR, P_PTR, P_PTR, P_PTR, P_PTR, P_PTR, P_PTR, P_PTR, P_INT, P_INT, P_INT, P_F64, P_F32,
      P_F32, P_F32, P_F32},
     k_bn_bwd},
    {"cudnn", "conv_fwd_table_f32", 1, {P_PTR}, k_conv_fwd_table},
};
FC_KERNEL_TABLE(cudnn_kernels);
