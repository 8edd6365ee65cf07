/* SPDX-License-Identifier: MIT */
/* cnn.c: a small residual CNN trained through cuDNN on the (simulated) CUDA device.
 *
 * Input 3x16x16, 10 classes. stem: conv3x3(3->16)+BN+ReLU; N identity blocks in sequence (N =
 * --blocks, 1..16, default 1), each two conv3x3(16->16)+BN with an identity skip and its own
 * weights and BN state; a strided block: conv3x3 stride 2 (16->32)+BN+ReLU, conv3x3(32->32)+BN,
 * and a projection shortcut conv1x1 stride 2 (16->32)+BN computed on a side stream (events and
 * cuStreamWaitEvent order it, forward and backward); global average pooling; a linear layer;
 * softmax cross-entropy; SGD with momentum. ReLUs run in place. Convolutions and batch norms
 * are cuDNN calls (the simulated libcudnn.so.9, opened by name); weight gradients are zeroed
 * with cuMemsetD32Async and accumulated (beta = 1); each identity skip's gradient is a
 * device-to-device copy that conv backward-data then accumulates into. Activations are
 * allocated during the forward pass and freed after their last use in the backward pass.
 *
 * Every identity block adds 24 ops per iteration and 562176 bytes of peak footprint at the
 * default batch (four live activations and its parameters) while the largest single op (a batch
 * norm backward at 16 channels) stays the same, so more blocks make each op a smaller share of
 * the footprint: ops_per_iteration is 57 + 24 * N and peak_device_bytes 1041148 + 562176 * N.
 * With --blocks 1 the program issues exactly the ops, allocations and frees it did before the
 * option existed.
 *
 * --backend runs every convolution forward through the cuDNN backend (graph) API instead of
 * cudnnConvolutionForward, as frameworks do: an execution plan per layer and batch size, built at
 * start-up and kept; a variant pack per call; the plan's workspace allocated with cuMemAlloc for
 * the call and freed after it. The results, and so the checksum, are those of the legacy path;
 * each convolution forward is then two ops (the library's copy of its operand table into the
 * workspace, and its kernel). */
#include "wl.h"
#include "wl_dnn.h"
#include "wl_dp.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { IN_C = 3, IN_HW = 16, CLASSES = 10, C1 = 16, C2 = 32, MAX_BLOCKS = 16 };

/* Batch sizes one run can have: the batch, the changed batch, the last batch. */
enum { MAX_PLANS = 3 };

/* Gradient buffers of one iteration: 3 for each conv+BN pair (weights, scale, bias), 4 such pairs
 * outside the identity blocks (stem, strided block, shortcut) and 2 in each block, and the
 * linear layer's 2. */
enum { MAX_GRADS = 3 * (4 + 2 * MAX_BLOCKS) + 2 };

/* Batch-norm running statistics: a mean and a variance for each batch norm. */
enum { MAX_STATES = 2 * (4 + 2 * MAX_BLOCKS) };

/* The largest --shards. */
enum { MAX_SHARDS = 64 };

static const float LR = 0.05f, MOMENTUM = 0.9f, WD = 1e-4f;
static const double BN_EPS = 1e-5, BN_FACTOR = 0.1;
static const float ONE = 1.0f, ZERO = 0.0f;

typedef struct tensor {
    CUdeviceptr p;
    int n, c, h, w;
    cudnnTensorDescriptor_t d;
} tensor_t;

typedef struct conv {
    int cin, cout, ksize, stride, pad;
    wl_param_t *w;
    cudnnFilterDescriptor_t fd;
    cudnnConvolutionDescriptor_t cd;
    int nplans; /* --backend: one plan per batch size */
    wl_dnn_conv_plan_t plans[MAX_PLANS];
} conv_t;

typedef struct bn {
    wl_param_t *scale, *bias;
    CUdeviceptr rmean, rvar; /* running statistics: model state, not trained by SGD */
    int c;
} bn_t;

/* Saved batch statistics of one BN forward, for its backward. */
typedef struct bn_saved {
    CUdeviceptr mean, inv_std;
    int async; /* allocated with cuMemAllocAsync on the main stream */
} bn_saved_t;

/* An identity block at C1 channels: relu(bn3(conv3(relu(bn2(conv2(x))))) + x). */
typedef struct block {
    conv_t c2, c3;
    bn_t n2, n3;
} block_t;

/* The stem is c1/n1; the strided block c4/n4, c5/n5 with the shortcut c6/n6. */
typedef struct net {
    conv_t c1, c4, c5, c6;
    bn_t n1, n4, n5, n6;
    int nblocks;
    block_t blk[MAX_BLOCKS];
    wl_param_t *fc_w, *fc_b; /* C2 x CLASSES, CLASSES */
} net_t;

/* One identity block's activations and saved BN statistics, from its forward to its backward.
 * h3 is the block's output (after the skip and the ReLU), the next block's input. */
typedef struct block_act {
    tensor_t a2, h2, a3, h3;
    bn_saved_t s2, s3;
} block_act_t;

static CUstream sm, ss;          /* main and side streams */
static cudnnHandle_t hm, hs;     /* cuDNN handles bound to them */
static CUevent ev_fork, ev_join; /* main -> side, side -> main */
static int use_backend;          /* --backend */
static int world = 1;            /* WORLD_SIZE: ranks of a data-parallel run */
static int shards = 1;           /* --shards: the single-process oracle of `shards` ranks */

static struct {
    wl_param_t *p;
    CUdeviceptr g;
} grads[MAX_GRADS];
static int ngrads;

/* The BN running statistics, in registration order (the order of wl_state_register). */
static struct {
    CUdeviceptr p;
    uint64_t n;
} states[MAX_STATES];
static int nstates;

/* The parts the global batch is split into: WORLD_SIZE ranks or --shards shards (one of the two
 * is 1). */
static int parts(void) {
    return world > 1 ? world : shards;
}

/* Samples per shard (per rank) in iteration it. */
static int local_batch(int it) {
    return wl_batch_size(it) / parts();
}

/* A gradient buffer for p, zeroed on stream s when `zero` (it is then accumulated into). */
static CUdeviceptr grad_for(wl_param_t *p, CUstream s, int zero) {
    CUdeviceptr g = wl_alloc(p->n * sizeof(float));
    if (zero)
        wl_memset32(g, 0, p->n, s);
    grads[ngrads].p = p;
    grads[ngrads].g = g;
    ngrads++;
    return g;
}

static tensor_t t_new(int n, int c, int h, int w) {
    tensor_t t = {0, n, c, h, w, NULL};
    t.p = wl_alloc((size_t)n * c * h * w * sizeof(float));
    wl_dnn_check(wl_dnn.CreateTensorDescriptor(&t.d), "cudnnCreateTensorDescriptor");
    wl_dnn_check(wl_dnn.SetTensor4dDescriptor(t.d, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, n, c, h, w),
                 "cudnnSetTensor4dDescriptor");
    return t;
}

static tensor_t t_like(const tensor_t *o) {
    return t_new(o->n, o->c, o->h, o->w);
}

static void t_free(tensor_t *t) {
    wl_free(t->p);
    wl_dnn_check(wl_dnn.DestroyTensorDescriptor(t->d), "cudnnDestroyTensorDescriptor");
    t->p = 0;
    t->d = NULL;
}

static uint64_t t_elems(const tensor_t *t) {
    return (uint64_t)t->n * t->c * t->h * t->w;
}

static void conv_init(conv_t *cv, int cin, int cout, int ksize, int stride) {
    *cv = (conv_t){cin, cout, ksize, stride, ksize / 2, NULL, NULL, NULL, 0, {{0}}};
    cv->w = wl_param_new(sm, (uint64_t)cout * cin * ksize * ksize,
                         sqrtf(6.0f / (float)(cin * ksize * ksize)), 0.0f);
    wl_dnn_check(wl_dnn.CreateFilterDescriptor(&cv->fd), "cudnnCreateFilterDescriptor");
    wl_dnn_check(wl_dnn.SetFilter4dDescriptor(cv->fd, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, cout,
                                              cin, ksize, ksize),
                 "cudnnSetFilter4dDescriptor");
    wl_dnn_check(wl_dnn.CreateConvolutionDescriptor(&cv->cd), "cudnnCreateConvolutionDescriptor");
    wl_dnn_check(wl_dnn.SetConvolution2dDescriptor(cv->cd, cv->pad, cv->pad, stride, stride, 1, 1,
                                                   CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
                 "cudnnSetConvolution2dDescriptor");
}

static int out_hw(const conv_t *cv, int in_hw) {
    return (in_hw + 2 * cv->pad - cv->ksize) / cv->stride + 1;
}

/* --backend: builds cv's execution plans, on the handle it runs on, for its input of in_hw x
 * in_hw and each batch size the run will use. */
static void conv_plan(conv_t *cv, cudnnHandle_t h, int in_hw, int iters) {
    for (int it = 0; it < iters; it++) {
        int n = local_batch(it), have = 0;
        for (int i = 0; i < cv->nplans; i++)
            have |= cv->plans[i].n == n;
        if (have || cv->nplans == MAX_PLANS)
            continue;
        int o = out_hw(cv, in_hw);
        wl_dnn_conv_plan_build(&cv->plans[cv->nplans++], h, n, cv->cin, in_hw, in_hw, cv->cout,
                               cv->ksize, cv->pad, cv->stride, o, o);
    }
}

static void conv_fini(conv_t *cv) {
    for (int i = 0; i < cv->nplans; i++)
        wl_dnn_conv_plan_free(&cv->plans[i]);
    wl_dnn_check(wl_dnn.DestroyFilterDescriptor(cv->fd), "cudnnDestroyFilterDescriptor");
    wl_dnn_check(wl_dnn.DestroyConvolutionDescriptor(cv->cd), "cudnnDestroyConvolutionDescriptor");
}

static void bn_init(bn_t *b, int c) {
    b->c = c;
    b->scale = wl_param_new(sm, (uint64_t)c, 0.0f, 1.0f);
    b->bias = wl_param_new(sm, (uint64_t)c, 0.0f, 0.0f);
    b->rmean = wl_alloc((size_t)c * sizeof(float));
    b->rvar = wl_alloc((size_t)c * sizeof(float));
    wl_memset32(b->rmean, 0, (size_t)c, sm);
    wl_fill(sm, b->rvar, (uint64_t)c, 1.0f);
    wl_state_register(b->rmean, (uint64_t)c);
    wl_state_register(b->rvar, (uint64_t)c);
    states[nstates].p = b->rmean;
    states[nstates++].n = (uint64_t)c;
    states[nstates].p = b->rvar;
    states[nstates++].n = (uint64_t)c;
}

static void bn_fini(bn_t *b) {
    wl_free(b->rmean);
    wl_free(b->rvar);
}

/* --backend's y = conv(x): the layer's plan for x's shape, a variant pack for this call and a
 * workspace allocated for it. Two ops. */
static tensor_t conv_fwd_backend(cudnnHandle_t h, const conv_t *cv, const tensor_t *x, tensor_t y) {
    const wl_dnn_conv_plan_t *cp = NULL;
    for (int i = 0; i < cv->nplans; i++)
        if (cv->plans[i].n == x->n && cv->plans[i].h == x->h && cv->plans[i].w == x->w)
            cp = &cv->plans[i];
    if (!cp) {
        fprintf(stderr, "error: cnn: no execution plan for a %dx%dx%dx%d input\n", x->n, x->c, x->h,
                x->w);
        exit(2);
    }
    CUdeviceptr work = wl_alloc(cp->workspace_bytes);
    wl_dnn_conv_plan_run(cp, h, x->p, cv->w->w, y.p, work);
    wl_ops_add(2);
    wl_free(work);
    return y;
}

/* y = conv(x) on handle h (alpha 1, beta 0); allocates y. One op (two with --backend). */
static tensor_t conv_fwd(cudnnHandle_t h, const conv_t *cv, const tensor_t *x) {
    int n, c, hh, ww;
    wl_dnn_check(wl_dnn.GetConvolution2dForwardOutputDim(cv->cd, x->d, cv->fd, &n, &c, &hh, &ww),
                 "cudnnGetConvolution2dForwardOutputDim");
    tensor_t y = t_new(n, c, hh, ww);
    if (use_backend)
        return conv_fwd_backend(h, cv, x, y);
    size_t ws = 0;
    wl_dnn_check(wl_dnn.GetConvolutionForwardWorkspaceSize(
                     h, x->d, cv->fd, cv->cd, y.d, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, &ws),
                 "cudnnGetConvolutionForwardWorkspaceSize");
    CUdeviceptr work = ws ? wl_alloc(ws) : 0;
    wl_dnn_check(wl_dnn.ConvolutionForward(h, &ONE, x->d, (const void *)x->p, cv->fd,
                                           (const void *)cv->w->w, cv->cd,
                                           CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, (void *)work,
                                           ws, &ZERO, y.d, (void *)y.p),
                 "cudnnConvolutionForward");
    wl_ops_add(1);
    if (work)
        wl_free(work);
    return y;
}

/* Weight gradient (accumulated into a zeroed buffer) and, when dx is given, the data gradient
 * blended into dx with beta_dx. One op each. */
static void conv_bwd(cudnnHandle_t h, CUstream s, conv_t *cv, const tensor_t *x, const tensor_t *dy,
                     const tensor_t *dx, const float *beta_dx) {
    size_t ws = 0;
    CUdeviceptr dw = grad_for(cv->w, s, 1);
    wl_dnn_check(wl_dnn.GetConvolutionBackwardFilterWorkspaceSize(
                     h, x->d, dy->d, cv->cd, cv->fd, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0, &ws),
                 "cudnnGetConvolutionBackwardFilterWorkspaceSize");
    wl_dnn_check(wl_dnn.ConvolutionBackwardFilter(
                     h, &ONE, x->d, (const void *)x->p, dy->d, (const void *)dy->p, cv->cd,
                     CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0, NULL, 0, &ONE, cv->fd, (void *)dw),
                 "cudnnConvolutionBackwardFilter");
    wl_ops_add(1);
    if (!dx)
        return;
    wl_dnn_check(wl_dnn.GetConvolutionBackwardDataWorkspaceSize(
                     h, cv->fd, dy->d, cv->cd, dx->d, CUDNN_CONVOLUTION_BWD_DATA_ALGO_1, &ws),
                 "cudnnGetConvolutionBackwardDataWorkspaceSize");
    wl_dnn_check(wl_dnn.ConvolutionBackwardData(
                     h, &ONE, cv->fd, (const void *)cv->w->w, dy->d, (const void *)dy->p, cv->cd,
                     CUDNN_CONVOLUTION_BWD_DATA_ALGO_1, NULL, 0, beta_dx, dx->d, (void *)dx->p),
                 "cudnnConvolutionBackwardData");
    wl_ops_add(1);
}

static cudnnTensorDescriptor_t bn_desc(const tensor_t *x) {
    cudnnTensorDescriptor_t d;
    wl_dnn_check(wl_dnn.CreateTensorDescriptor(&d), "cudnnCreateTensorDescriptor");
    wl_dnn_check(wl_dnn.DeriveBNTensorDescriptor(d, x->d, CUDNN_BATCHNORM_SPATIAL),
                 "cudnnDeriveBNTensorDescriptor");
    return d;
}

/* y = BN(x) in training mode; allocates y and the saved statistics (stream-ordered on the main
 * stream, plain cuMemAlloc_v2 for the side stream's). One op. */
static tensor_t bn_fwd(cudnnHandle_t h, CUstream s, bn_t *b, const tensor_t *x, bn_saved_t *sv) {
    tensor_t y = t_like(x);
    sv->async = s == sm;
    size_t bytes = (size_t)b->c * sizeof(float);
    sv->mean = sv->async ? wl_alloc_async(bytes, s) : wl_alloc(bytes);
    sv->inv_std = sv->async ? wl_alloc_async(bytes, s) : wl_alloc(bytes);
    cudnnTensorDescriptor_t d = bn_desc(x);
    wl_dnn_check(wl_dnn.BatchNormalizationForwardTraining(
                     h, CUDNN_BATCHNORM_SPATIAL, &ONE, &ZERO, x->d, (const void *)x->p, y.d,
                     (void *)y.p, d, (const void *)b->scale->w, (const void *)b->bias->w, BN_FACTOR,
                     (void *)b->rmean, (void *)b->rvar, BN_EPS, (void *)sv->mean,
                     (void *)sv->inv_std),
                 "cudnnBatchNormalizationForwardTraining");
    wl_ops_add(1);
    wl_dnn_check(wl_dnn.DestroyTensorDescriptor(d), "cudnnDestroyTensorDescriptor");
    return y;
}

/* dx = BN backward of dy at x; also the scale and bias gradients. Frees the saved statistics.
 * One op. */
static tensor_t bn_bwd(cudnnHandle_t h, CUstream s, bn_t *b, const tensor_t *x, const tensor_t *dy,
                       bn_saved_t *sv) {
    tensor_t dx = t_like(x);
    CUdeviceptr ds = grad_for(b->scale, s, 0), db = grad_for(b->bias, s, 0);
    cudnnTensorDescriptor_t d = bn_desc(x);
    wl_dnn_check(wl_dnn.BatchNormalizationBackward(
                     h, CUDNN_BATCHNORM_SPATIAL, &ONE, &ZERO, &ONE, &ZERO, x->d, (const void *)x->p,
                     dy->d, (const void *)dy->p, dx.d, (void *)dx.p, d, (const void *)b->scale->w,
                     (void *)ds, (void *)db, BN_EPS, (const void *)sv->mean,
                     (const void *)sv->inv_std),
                 "cudnnBatchNormalizationBackward");
    wl_ops_add(1);
    wl_dnn_check(wl_dnn.DestroyTensorDescriptor(d), "cudnnDestroyTensorDescriptor");
    if (sv->async) {
        wl_free_async(sv->mean, s);
        wl_free_async(sv->inv_std, s);
    } else {
        wl_free(sv->mean);
        wl_free(sv->inv_std);
    }
    return dx;
}

/* The extra work of a first, "autotuning" iteration: run the stem convolution with each
 * candidate algorithm into scratch memory, as cudnnFindConvolutionForwardAlgorithmEx does.
 * Changes nothing the training reads; not counted as steady-state ops. */
static void autotune(const conv_t *cv, const tensor_t *x) {
    wl_ops_pause(1);
    for (int algo = 0; algo < 3; algo++) {
        tensor_t y = conv_fwd(hm, cv, x);
        wl_sync(sm);
        t_free(&y);
    }
    wl_ops_pause(0);
}

/* Forward of identity block b on input x (kept: the backward reads it); fills *ba. */
static void block_fwd(block_t *b, const tensor_t *x, block_act_t *ba) {
    ba->a2 = conv_fwd(hm, &b->c2, x);
    ba->h2 = bn_fwd(hm, sm, &b->n2, &ba->a2, &ba->s2);
    wl_relu(sm, ba->h2.p, ba->h2.p, t_elems(&ba->h2));
    ba->a3 = conv_fwd(hm, &b->c3, &ba->h2);
    ba->h3 = bn_fwd(hm, sm, &b->n3, &ba->a3, &ba->s3);
    wl_add(sm, ba->h3.p, x->p, ba->h3.p, t_elems(&ba->h3)); /* identity skip */
    wl_relu(sm, ba->h3.p, ba->h3.p, t_elems(&ba->h3));
}

/* Backward of identity block b: dh3 is the gradient of its output (before the output ReLU's
 * backward), x its input. Frees dh3 and the block's activations; returns the gradient of x,
 * which the caller owns. */
static tensor_t block_bwd(block_t *b, const tensor_t *x, tensor_t *dh3, block_act_t *ba) {
    wl_relu_bwd(sm, ba->h3.p, dh3->p, dh3->p, t_elems(dh3)); /* dh3: gradient of the sum */
    t_free(&ba->h3);
    tensor_t dx = t_like(x);
    wl_d2d(dx.p, dh3->p, t_elems(&dx) * sizeof(float), sm); /* identity skip */
    tensor_t da3 = bn_bwd(hm, sm, &b->n3, &ba->a3, dh3, &ba->s3);
    t_free(&ba->a3);
    t_free(dh3);
    tensor_t dh2 = t_like(&ba->h2);
    conv_bwd(hm, sm, &b->c3, &ba->h2, &da3, &dh2, &ZERO);
    t_free(&da3);
    wl_relu_bwd(sm, ba->h2.p, dh2.p, dh2.p, t_elems(&dh2));
    t_free(&ba->h2);
    tensor_t da2 = bn_bwd(hm, sm, &b->n2, &ba->a2, &dh2, &ba->s2);
    t_free(&ba->a2);
    t_free(&dh2);
    conv_bwd(hm, sm, &b->c2, x, &da2, &dx, &ONE); /* accumulate onto the skip's gradient */
    t_free(&da2);
    return dx;
}

/* The forward and backward pass of iteration it on the `batch` samples of its global batch that
 * start at sample `first` (all of them: first 0 and the whole batch). Leaves the weight
 * gradients in grads[0..ngrads), which the caller frees, and returns the loss scalar
 * (cuMemAllocAsync'd on the main stream; the caller frees it). */
static CUdeviceptr fwd_bwd(net_t *m, int it, int first, int batch, float *hx, int32_t *hy) {
    bn_saved_t s1, s4, s5, s6;
    block_act_t ba[MAX_BLOCKS];
    int nb = m->nblocks;
    ngrads = 0;
    wl_batch_shard(it, first, batch, IN_C * IN_HW * IN_HW, CLASSES, hx, hy);
    tensor_t x0 = t_new(batch, IN_C, IN_HW, IN_HW);
    CUdeviceptr labels = wl_alloc((size_t)batch * sizeof(int32_t));
    wl_h2d(x0.p, hx, t_elems(&x0) * sizeof(float), sm);
    wl_h2d(labels, hy, (size_t)batch * sizeof(int32_t), sm);
    if (it == 0 && wl_opts()->warmup_differs)
        autotune(&m->c1, &x0);

    /* ---- forward ---- */
    tensor_t a1 = conv_fwd(hm, &m->c1, &x0);
    tensor_t h1 = bn_fwd(hm, sm, &m->n1, &a1, &s1);
    wl_relu(sm, h1.p, h1.p, t_elems(&h1));
    for (int i = 0; i < nb; i++)
        block_fwd(&m->blk[i], i ? &ba[i - 1].h3 : &h1, &ba[i]);
    tensor_t *h3 = &ba[nb - 1].h3; /* the identity blocks' output */

    wl_record(ev_fork, sm); /* the shortcut starts on the side stream */
    wl_wait(ss, ev_fork);
    tensor_t a6 = conv_fwd(hs, &m->c6, h3);
    tensor_t b6 = bn_fwd(hs, ss, &m->n6, &a6, &s6);
    wl_record(ev_join, ss);

    tensor_t a4 = conv_fwd(hm, &m->c4, h3);
    tensor_t h4 = bn_fwd(hm, sm, &m->n4, &a4, &s4);
    wl_relu(sm, h4.p, h4.p, t_elems(&h4));
    tensor_t a5 = conv_fwd(hm, &m->c5, &h4);
    tensor_t h5 = bn_fwd(hm, sm, &m->n5, &a5, &s5);
    wl_wait(sm, ev_join);
    wl_add(sm, h5.p, b6.p, h5.p, t_elems(&h5)); /* projection shortcut */
    wl_relu(sm, h5.p, h5.p, t_elems(&h5));
    t_free(&b6);

    int nc = batch * C2, hw = h5.h * h5.w;
    CUdeviceptr g = wl_alloc((size_t)nc * sizeof(float));
    wl_gap_fwd(sm, h5.p, g, nc, hw);
    CUdeviceptr logits = wl_alloc((size_t)batch * CLASSES * sizeof(float));
    wl_gemm(sm, 0, 0, batch, CLASSES, C2, 1.0f, g, C2, m->fc_w->w, CLASSES, 0.0f, logits, CLASSES);
    wl_bias_add(sm, logits, m->fc_b->w, batch, CLASSES, 1);
    CUdeviceptr loss = wl_alloc_async(sizeof(float), sm);
    CUdeviceptr dlogits = wl_alloc_async((size_t)batch * CLASSES * sizeof(float), sm);
    wl_memset8(loss, 0, sizeof(float), sm);
    wl_softmax_xent(sm, logits, labels, loss, dlogits, batch, CLASSES);
    wl_free(logits);
    wl_free(labels);

    /* ---- backward ---- */
    CUdeviceptr gfw = grad_for(m->fc_w, sm, 0), gfb = grad_for(m->fc_b, sm, 0);
    wl_gemm(sm, 1, 0, C2, CLASSES, batch, 1.0f, g, C2, dlogits, CLASSES, 0.0f, gfw, CLASSES);
    wl_bias_grad(sm, dlogits, gfb, batch, CLASSES, 1);
    CUdeviceptr dg = wl_alloc_async((size_t)nc * sizeof(float), sm);
    wl_gemm(sm, 0, 1, batch, C2, CLASSES, 1.0f, dlogits, CLASSES, m->fc_w->w, CLASSES, 0.0f, dg,
            C2);
    wl_free_async(dlogits, sm);
    wl_free(g);
    tensor_t d5 = t_like(&h5);
    wl_gap_bwd(sm, dg, d5.p, nc, hw);
    wl_free_async(dg, sm);
    wl_relu_bwd(sm, h5.p, d5.p, d5.p, t_elems(&d5)); /* d5: gradient of the block-2 sum */
    t_free(&h5);

    wl_record(ev_fork, sm); /* shortcut backward on the side stream */
    wl_wait(ss, ev_fork);
    tensor_t da6 = bn_bwd(hs, ss, &m->n6, &a6, &d5, &s6);
    tensor_t dh3s = t_like(h3);
    conv_bwd(hs, ss, &m->c6, h3, &da6, &dh3s, &ZERO);
    wl_record(ev_join, ss);

    tensor_t da5 = bn_bwd(hm, sm, &m->n5, &a5, &d5, &s5);
    t_free(&a5);
    tensor_t dh4 = t_like(&h4);
    conv_bwd(hm, sm, &m->c5, &h4, &da5, &dh4, &ZERO);
    t_free(&da5);
    wl_relu_bwd(sm, h4.p, dh4.p, dh4.p, t_elems(&dh4));
    t_free(&h4);
    tensor_t da4 = bn_bwd(hm, sm, &m->n4, &a4, &dh4, &s4);
    t_free(&a4);
    t_free(&dh4);
    tensor_t dh3 = t_like(h3);
    conv_bwd(hm, sm, &m->c4, h3, &da4, &dh3, &ZERO);
    t_free(&da4);
    wl_wait(sm, ev_join);
    wl_add(sm, dh3.p, dh3s.p, dh3.p, t_elems(&dh3));
    t_free(&dh3s);
    t_free(&da6);
    t_free(&a6);
    t_free(&d5);

    for (int i = nb - 1; i >= 0; i--) /* dh3 becomes the gradient of block i's input */
        dh3 = block_bwd(&m->blk[i], i ? &ba[i - 1].h3 : &h1, &dh3, &ba[i]);
    tensor_t dh1 = dh3;
    wl_relu_bwd(sm, h1.p, dh1.p, dh1.p, t_elems(&dh1));
    t_free(&h1);
    tensor_t da1 = bn_bwd(hm, sm, &m->n1, &a1, &dh1, &s1);
    t_free(&a1);
    t_free(&dh1);
    conv_bwd(hm, sm, &m->c1, &x0, &da1, NULL, NULL);
    t_free(&da1);
    t_free(&x0);
    return loss;
}

/* The BN running statistics to or from snapshot buffers snap[] (device-to-device copies on the
 * main stream). */
static void states_copy(CUdeviceptr *snap, int to_snap) {
    for (int i = 0; i < nstates; i++) {
        size_t bytes = states[i].n * sizeof(float);
        if (to_snap)
            wl_d2d(snap[i], states[i].p, bytes, sm);
        else
            wl_d2d(states[i].p, snap[i], bytes, sm);
    }
}

/* The BN running statistics broadcast from rank 0 (DDP's broadcast_buffers), one group. */
static void states_broadcast(void) {
    CUdeviceptr bufs[MAX_STATES];
    uint64_t n[MAX_STATES];
    for (int i = 0; i < nstates; i++) {
        bufs[i] = states[i].p;
        n[i] = states[i].n;
    }
    wl_dp_broadcast(sm, bufs, n, nstates);
}

/* --shards: the forward and backward of shards 1..shards-1 after shard 0's, each shard's
 * gradients added to the running sum in grads[] in shard order (as NCCL sums ranks in rank
 * order); the BN running statistics are those after shard 0 (snap holds them meanwhile). */
static void other_shards(net_t *m, int it, int batch, float *hx, int32_t *hy, CUdeviceptr *snap) {
    CUdeviceptr acc[MAX_GRADS];
    int nacc = ngrads;
    for (int i = 0; i < nacc; i++)
        acc[i] = grads[i].g;
    states_copy(snap, 1);
    for (int r = 1; r < shards; r++) {
        CUdeviceptr loss = fwd_bwd(m, it, r * batch, batch, hx, hy);
        wl_free_async(loss, sm); /* the loss line is shard 0's, as rank 0 prints it */
        for (int i = 0; i < nacc; i++) {
            wl_add(sm, acc[i], grads[i].g, acc[i], grads[i].p->n);
            wl_free(grads[i].g);
            grads[i].g = acc[i];
        }
    }
    states_copy(snap, 0);
}

/* One training iteration. Data-parallel (WORLD_SIZE > 1): BN statistics from rank 0, this
 * rank's shard, the gradients summed across ranks in one group and scaled by 1/WORLD_SIZE.
 * --shards: every shard in turn, the same arithmetic. Then the update (the same on every rank). */
static void train_step(net_t *m, int it, float *hx, int32_t *hy, CUdeviceptr *snap) {
    int batch = local_batch(it), w = parts();
    if (world > 1)
        states_broadcast();
    CUdeviceptr loss = fwd_bwd(m, it, world > 1 ? wl_dp_rank() * batch : 0, batch, hx, hy);
    if (shards > 1)
        other_shards(m, it, batch, hx, hy, snap);
    if (world > 1) {
        CUdeviceptr bufs[MAX_GRADS];
        uint64_t n[MAX_GRADS];
        for (int i = 0; i < ngrads; i++) {
            bufs[i] = grads[i].g;
            n[i] = grads[i].p->n;
        }
        wl_dp_allreduce_sum(sm, bufs, n, ngrads);
    }
    if (w > 1)
        for (int i = 0; i < ngrads; i++)
            wl_scale(sm, grads[i].p->n, 1.0f / (float)w, grads[i].g);

    /* ---- update ---- */
    for (int i = 0; i < ngrads; i++)
        wl_sgd(sm, grads[i].p->w, grads[i].g, grads[i].p->v, grads[i].p->n, LR, MOMENTUM, WD);
    wl_iter_end(it, sm, loss);
    for (int i = 0; i < ngrads; i++)
        wl_free(grads[i].g);
    wl_free_async(loss, sm);
}

int main(int argc, char **argv) {
    int blocks = 1;
    static const wl_program_t prog = {
        "cnn",
        "Trains a small residual CNN (3x16x16 input; conv/batch-norm stem, identity-skip\n"
        "blocks, a strided block whose 1x1 projection shortcut runs on a side stream; global\n"
        "average pooling; linear; softmax cross-entropy; SGD with momentum) on synthetic data.\n"
        "Convolutions and batch norms go through cuDNN (dlopen \"libcudnn.so.9\"); the rest are\n"
        "kernels launched through the CUDA driver API. Footprint about 1.5 MiB at the default\n"
        "batch.\n"
        "--blocks N (1..16, default 1) sets the number of identity blocks (16 channels, each with\n"
        "its own weights). Each adds about 0.54 MiB and 24 ops per iteration while the largest\n"
        "operation stays the same (--blocks 4: about 3.1 MiB, 153 ops per iteration).\n"
        "--backend runs each convolution forward through the cuDNN backend (graph) API: an\n"
        "execution plan per layer built at start-up, a variant pack and a cuMemAlloc'd workspace\n"
        "per call; same checksum, one more op per convolution forward.\n"
        "\n"
        "Data-parallel training, torchrun-style: with WORLD_SIZE > 1 in the environment (and\n"
        "RANK, LOCAL_RANK, MASTER_ADDR, MASTER_PORT, as scripts/ooc-torchrun or torchrun set\n"
        "them) each process is one rank: --batch is the global batch (divisible by WORLD_SIZE),\n"
        "rank R trains on samples R*B/W .. (R+1)*B/W-1 of each iteration's batch, the weight\n"
        "gradients are summed through NCCL (dlopen \"libnccl.so.2\"; one ncclAllReduce per\n"
        "gradient on the main stream, in buckets of up to 32 KiB as DDP does: a bucket of several\n"
        "in one ncclGroupStart/End, a larger gradient alone) and scaled by 1/WORLD_SIZE,\n"
        "and the BN running statistics are broadcast from rank 0 before each iteration's\n"
        "forward and once after the last (DDP's broadcast_buffers). Every rank ends with the\n"
        "same weights and prints the same checksum; the loss line is the rank's own shard's.\n"
        "The rendezvous file is ${TMPDIR:-/tmp}/ooc-rdzv-MASTER_ADDR-MASTER_PORT (rank 0 writes\n"
        "it; the others wait at most 60 s). Each NCCL launch is 2 ops. A bad variable prints\n"
        "`error: cnn: NAME=value: ...` and exits 2.\n"
        "--shards W (1..64, default 1; a single process only) is the oracle of a W-rank run: each\n"
        "iteration runs the W shards' forward and backward one after another, adds each shard's\n"
        "gradients to shard 0's in shard order and scales the sum by 1/W, and keeps the BN\n"
        "statistics of shard 0; its checksum is every rank's checksum of the W-rank run, and its\n"
        "loss line rank 0's. --shards 1 is the plain program.",
        3, 8};
    /* --blocks and --backend are this program's own options; the shared parser sees the rest. */
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--backend") == 0) {
            use_backend = 1;
            memmove(&argv[i], &argv[i + 1], (size_t)(argc - i) * sizeof *argv);
            argc--;
            break;
        }
    }
    for (int i = 1; i + 1 < argc; i++) {
        if (strcmp(argv[i], "--blocks") == 0) {
            char *end;
            long n = strtol(argv[i + 1], &end, 10);
            if (*end != '\0' || n < 1 || n > MAX_BLOCKS) {
                fprintf(stderr, "error: cnn: --blocks %s: expected an integer from 1 to %d\n",
                        argv[i + 1], MAX_BLOCKS);
                return 2;
            }
            blocks = (int)n;
            memmove(&argv[i], &argv[i + 2], (size_t)(argc - i - 1) * sizeof *argv);
            argc -= 2;
            break;
        }
    }
    for (int i = 1; i + 1 < argc; i++) {
        if (strcmp(argv[i], "--shards") == 0) {
            char *end;
            long n = strtol(argv[i + 1], &end, 10);
            if (*end != '\0' || n < 1 || n > MAX_SHARDS) {
                fprintf(stderr, "error: cnn: --shards %s: expected an integer from 1 to %d\n",
                        argv[i + 1], MAX_SHARDS);
                return 2;
            }
            shards = (int)n;
            memmove(&argv[i], &argv[i + 2], (size_t)(argc - i - 1) * sizeof *argv);
            argc -= 2;
            break;
        }
    }
    wl_opts_t o;
    wl_parse_args(&prog, argc, argv, &o);
    world = wl_dp_env("cnn");
    if (world > 1 && shards > 1) {
        fprintf(stderr,
                "error: cnn: --shards %d: only in a single process, not with WORLD_SIZE=%d\n",
                shards, world);
        return 2;
    }
    for (int it = 0; it < o.iters; it++) {
        int b = wl_batch_size(it);
        if (b % parts() == 0)
            continue;
        const char *opt = it == o.iters - 1 && o.last_batch  ? "--last-batch"
                          : o.change_at && it >= o.change_at ? "--batch-from"
                                                             : "--batch";
        fprintf(stderr, "error: cnn: %s: a global batch of %d is not divisible by %s=%d\n", opt, b,
                world > 1 ? "WORLD_SIZE" : "--shards", parts());
        return 2;
    }
    wl_cuda_init();
    wl_dp_init();
    wl_nn_init();
    wl_dnn_init();
    sm = wl_stream_create();
    ss = wl_stream_create();
    ev_fork = wl_event_create();
    ev_join = wl_event_create();
    wl_dnn_check(wl_dnn.Create(&hm), "cudnnCreate");
    wl_dnn_check(wl_dnn.Create(&hs), "cudnnCreate");
    wl_dnn_check(wl_dnn.SetStream(hm, (cudaStream_t)sm), "cudnnSetStream");
    wl_dnn_check(wl_dnn.SetStream(hs, (cudaStream_t)ss), "cudnnSetStream");

    wl_ops_pause(1);
    net_t m;
    conv_init(&m.c1, IN_C, C1, 3, 1);
    bn_init(&m.n1, C1);
    m.nblocks = blocks;
    for (int i = 0; i < blocks; i++) {
        conv_init(&m.blk[i].c2, C1, C1, 3, 1);
        bn_init(&m.blk[i].n2, C1);
        conv_init(&m.blk[i].c3, C1, C1, 3, 1);
        bn_init(&m.blk[i].n3, C1);
    }
    conv_init(&m.c4, C1, C2, 3, 2);
    bn_init(&m.n4, C2);
    conv_init(&m.c5, C2, C2, 3, 1);
    bn_init(&m.n5, C2);
    conv_init(&m.c6, C1, C2, 1, 2);
    bn_init(&m.n6, C2);
    m.fc_w = wl_param_new(sm, (uint64_t)C2 * CLASSES, sqrtf(6.0f / (float)C2), 0.0f);
    m.fc_b = wl_param_new(sm, CLASSES, 0.0f, 0.0f);
    if (use_backend) {
        conv_plan(&m.c1, hm, IN_HW, o.iters);
        for (int i = 0; i < blocks; i++) {
            conv_plan(&m.blk[i].c2, hm, IN_HW, o.iters);
            conv_plan(&m.blk[i].c3, hm, IN_HW, o.iters);
        }
        conv_plan(&m.c4, hm, IN_HW, o.iters);
        conv_plan(&m.c5, hm, out_hw(&m.c4, IN_HW), o.iters);
        conv_plan(&m.c6, hs, IN_HW, o.iters);
    }
    wl_ops_pause(0);

    float *hx = malloc((size_t)o.batch * IN_C * IN_HW * IN_HW * sizeof(float));
    int32_t *hy = malloc((size_t)o.batch * sizeof(int32_t));
    if (!hx || !hy) {
        fprintf(stderr, "error: cnn: out of host memory\n");
        return 2;
    }
    CUdeviceptr snap[MAX_STATES];
    for (int i = 0; shards > 1 && i < nstates; i++)
        snap[i] = wl_alloc(states[i].n * sizeof(float));
    for (int it = 0; it < o.iters; it++) {
        wl_iter_begin(it);
        train_step(&m, it, hx, hy, snap);
    }
    wl_iters_done();

    wl_ops_pause(1);
    if (world > 1)
        states_broadcast(); /* every rank ends with rank 0's statistics */
    uint64_t sum = wl_checksum(sm);
    wl_dp_fini();
    for (int i = 0; shards > 1 && i < nstates; i++)
        wl_free(snap[i]);
    conv_fini(&m.c1);
    bn_fini(&m.n1);
    for (int i = 0; i < blocks; i++) {
        conv_fini(&m.blk[i].c2);
        bn_fini(&m.blk[i].n2);
        conv_fini(&m.blk[i].c3);
        bn_fini(&m.blk[i].n3);
    }
    conv_t *convs[] = {&m.c4, &m.c5, &m.c6};
    bn_t *bns[] = {&m.n4, &m.n5, &m.n6};
    for (int i = 0; i < 3; i++) {
        conv_fini(convs[i]);
        bn_fini(bns[i]);
    }
    wl_params_free();
    wl_dnn_check(wl_dnn.Destroy(hm), "cudnnDestroy");
    wl_dnn_check(wl_dnn.Destroy(hs), "cudnnDestroy");
    wl_event_destroy(ev_fork);
    wl_event_destroy(ev_join);
    wl_stream_destroy(ss);
    wl_stream_destroy(sm);
    wl_nn_fini();
    wl_cuda_fini();
    free(hx);
    free(hy);
    wl_report(sum);
    return 0;
}
