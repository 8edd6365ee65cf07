/* SPDX-License-Identifier: MIT */
/* wl_mlp.c: the perceptron training shared by the mlp and large workloads.
 *
 * Weights and momentum persist; each iteration copies its batch in, allocates activations with
 * cuMemAlloc_v2 and activation gradients with cuMemAllocAsync, frees each after its last use,
 * keeps the weight gradients until the optimizer step, and reads the loss back. The GEMMs are
 * module nn's kernel or, with spec->blas, cuBLAS calls (wl_blas.c) that compute the same bits. */
#include "wl_mlp.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

enum { MAX_LAYERS = WL_MLP_MAX_LAYERS };
static const float MOMENTUM = 0.9f, WD = 1e-4f;

/* The shape being trained, set once by wl_mlp_main. */
static const wl_mlp_spec_t *spec;

typedef struct layer {
    wl_param_t *w, *b; /* w: spec->dims[l] x spec->dims[l+1], row-major; b: spec->dims[l+1] */
} layer_t;

/* Row-major C = alpha*op(A)*op(B) + beta*C: module nn's kernel, or cuBLAS with spec->blas. */
static void gemm(CUstream s, int ta, int tb, int m, int n, int k, float alpha, CUdeviceptr a,
                 int lda, CUdeviceptr b, int ldb, float beta, CUdeviceptr c, int ldc) {
    if (spec->blas == WL_BLAS_OFF)
        wl_gemm(s, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    else
        wl_blas_gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

/* The extra work of a first, "autotuning" iteration: try the first layer's GEMM a few times
 * into scratch memory. Changes nothing the training reads; not counted as steady-state ops. */
static void autotune(CUstream s, const layer_t *L, CUdeviceptr x, int batch) {
    wl_ops_pause(1);
    CUdeviceptr scratch = wl_alloc((size_t)batch * spec->dims[1] * sizeof(float));
    for (int trial = 0; trial < 3; trial++)
        gemm(s, 0, 0, batch, spec->dims[1], spec->dims[0], 1.0f, x, spec->dims[0], L[0].w->w,
             spec->dims[1], 0.0f, scratch, spec->dims[1]);
    wl_memset32(scratch, 0, (size_t)batch * spec->dims[1], s);
    wl_sync(s);
    wl_free(scratch);
    wl_ops_pause(0);
}

static void train_step(CUstream s, const layer_t *L, int it, int batch, float *hx, int32_t *hy) {
    CUdeviceptr act[MAX_LAYERS + 1], dact[MAX_LAYERS + 1], gw[MAX_LAYERS], gb[MAX_LAYERS];
    CUdeviceptr pre[MAX_LAYERS + 1] = {0}; /* --relu-copy: the pre-activations */
    int copy = wl_opts()->relu_copy;
    wl_batch(it, batch, spec->dims[0], spec->dims[spec->layers], hx, hy);
    act[0] = wl_alloc((size_t)batch * spec->dims[0] * sizeof(float));
    CUdeviceptr labels = wl_alloc((size_t)batch * sizeof(int32_t));
    wl_h2d(act[0], hx, (size_t)batch * spec->dims[0] * sizeof(float), s);
    wl_h2d(labels, hy, (size_t)batch * sizeof(int32_t), s);
    if (it == 0 && wl_opts()->warmup_differs)
        autotune(s, L, act[0], batch);

    /* Forward: z = act W + b, then ReLU (in place, or into a new buffer with --relu-copy)
     * except on the logits. */
    for (int l = 0; l < spec->layers; l++) {
        int in = spec->dims[l], out = spec->dims[l + 1];
        int hidden = l + 1 < spec->layers;
        CUdeviceptr z = wl_alloc((size_t)batch * out * sizeof(float));
        gemm(s, 0, 0, batch, out, in, 1.0f, act[l], in, L[l].w->w, out, 0.0f, z, out);
        wl_bias_add(s, z, L[l].b->w, batch, out, 1);
        if (hidden && copy) {
            pre[l + 1] = z;
            act[l + 1] = wl_alloc((size_t)batch * out * sizeof(float));
            wl_relu(s, z, act[l + 1], (uint64_t)batch * out);
        } else {
            act[l + 1] = z;
            if (hidden)
                wl_relu(s, z, z, (uint64_t)batch * out);
        }
    }
    CUdeviceptr loss = wl_alloc_async(sizeof(float), s);
    dact[spec->layers] =
        wl_alloc_async((size_t)batch * spec->dims[spec->layers] * sizeof(float), s);
    wl_softmax_xent(s, act[spec->layers], labels, loss, dact[spec->layers], batch,
                    spec->dims[spec->layers]);
    wl_free(act[spec->layers]);
    wl_free(labels);

    /* Backward: the gradient w.r.t. a ReLU output becomes, in place, the gradient w.r.t. the
     * pre-activation (relu_bwd reads the in-place output). */
    for (int l = spec->layers - 1; l >= 0; l--) {
        int in = spec->dims[l], out = spec->dims[l + 1];
        CUdeviceptr dz = dact[l + 1];
        if (l + 1 < spec->layers) {
            /* relu(z) > 0 exactly where z > 0: the pre-activation serves as well. */
            wl_relu_bwd(s, copy ? pre[l + 1] : act[l + 1], dz, dz, (uint64_t)batch * out);
            wl_free(act[l + 1]);
            if (copy)
                wl_free(pre[l + 1]);
        }
        gw[l] = wl_alloc((size_t)in * out * sizeof(float));
        gb[l] = wl_alloc((size_t)out * sizeof(float));
        gemm(s, 1, 0, in, out, batch, 1.0f, act[l], in, dz, out, 0.0f, gw[l], out);
        wl_bias_grad(s, dz, gb[l], batch, out, 1);
        if (l > 0) {
            dact[l] = wl_alloc_async((size_t)batch * in * sizeof(float), s);
            gemm(s, 0, 1, batch, in, out, 1.0f, dz, out, L[l].w->w, out, 0.0f, dact[l], in);
        }
        wl_free_async(dz, s);
    }
    wl_free(act[0]);

    for (int l = 0; l < spec->layers; l++) {
        wl_sgd(s, L[l].w->w, gw[l], L[l].w->v, L[l].w->n, spec->lr, MOMENTUM, WD);
        wl_sgd(s, L[l].b->w, gb[l], L[l].b->v, L[l].b->n, spec->lr, MOMENTUM, WD);
    }
    wl_iter_end(it, s, loss);
    for (int l = 0; l < spec->layers; l++) {
        wl_free(gw[l]);
        wl_free(gb[l]);
    }
    wl_free_async(loss, s);
}

int wl_mlp_main(const wl_program_t *prog, const wl_mlp_spec_t *sp, int argc, char **argv) {
    spec = sp;
    wl_opts_t o;
    wl_parse_args(prog, argc, argv, &o);
    wl_cuda_init();
    wl_nn_init();
    CUstream s = wl_stream_create();
    if (spec->blas != WL_BLAS_OFF)
        wl_blas_init(spec->blas, s);

    wl_ops_pause(1);
    layer_t L[MAX_LAYERS];
    for (int l = 0; l < spec->layers; l++) {
        float bound = sqrtf(6.0f / (float)spec->dims[l]); /* He-uniform */
        L[l].w = wl_param_new(s, (uint64_t)spec->dims[l] * spec->dims[l + 1], bound, 0.0f);
        L[l].b = wl_param_new(s, (uint64_t)spec->dims[l + 1], 0.0f, 0.0f);
    }
    wl_ops_pause(0);

    float *hx = malloc((size_t)o.batch * spec->dims[0] * sizeof(float));
    int32_t *hy = malloc((size_t)o.batch * sizeof(int32_t));
    if (!hx || !hy) {
        fprintf(stderr, "error: %s: out of host memory\n", prog->name);
        return 2;
    }
    for (int it = 0; it < o.iters; it++) {
        wl_iter_begin(it);
        train_step(s, L, it, wl_batch_size(it), hx, hy);
    }
    wl_iters_done();

    wl_ops_pause(1);
    uint64_t sum = wl_checksum(s);
    wl_params_free();
    if (spec->blas != WL_BLAS_OFF)
        wl_blas_fini();
    wl_stream_destroy(s);
    wl_nn_fini();
    wl_cuda_fini();
    free(hx);
    free(hy);
    wl_report(sum);
    return 0;
}
