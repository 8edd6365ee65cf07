/* SPDX-License-Identifier: MIT */
/* large.c: a deep, wide perceptron whose footprint is several times the simulated capacity.
 *
 * 1024 -> 12 x (1024 -> 1024, ReLU in place) -> 16 classes, softmax cross-entropy, SGD with
 * momentum. Weights (48 MiB) and momentum (48 MiB) persist; the weight gradients (48 MiB) are
 * allocated during the backward pass and kept until the optimizer step, so the program's peak is
 * about 145 MiB at the default batch: 4.5x the capacity it is sized against,
 * FAKECUDA_MEM_BYTES=32 MiB, where it runs out of memory without an out-of-core shim. Per
 * iteration it copies its batch in, allocates activations with cuMemAlloc_v2 and activation
 * gradients with cuMemAllocAsync, frees each after its last use, and reads the loss back. */
#include "wl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

enum { LAYERS = 13, WIDTH = 1024, CLASSES = 16 };
static const int dims[LAYERS + 1] = {WIDTH, WIDTH, WIDTH, WIDTH, WIDTH, WIDTH, WIDTH,
                                     WIDTH, WIDTH, WIDTH, WIDTH, WIDTH, WIDTH, CLASSES};

static const float LR = 0.002f, MOMENTUM = 0.9f, WD = 1e-4f;

typedef struct layer {
    wl_param_t *w, *b; /* w: dims[l] x dims[l+1], row-major; b: dims[l+1] */
} layer_t;

/* The extra work of a first, "autotuning" iteration: try the first layer's GEMM a few times
 * into scratch memory. Changes nothing the training reads; not counted as steady-state ops. */
static void autotune(CUstream s, const layer_t *L, CUdeviceptr x, int batch) {
    wl_ops_pause(1);
    CUdeviceptr scratch = wl_alloc((size_t)batch * dims[1] * sizeof(float));
    for (int trial = 0; trial < 3; trial++)
        wl_gemm(s, 0, 0, batch, dims[1], dims[0], 1.0f, x, dims[0], L[0].w->w, dims[1], 0.0f,
                scratch, dims[1]);
    wl_memset32(scratch, 0, (size_t)batch * dims[1], s);
    wl_sync(s);
    wl_free(scratch);
    wl_ops_pause(0);
}

static void train_step(CUstream s, const layer_t *L, int it, int batch, float *hx, int32_t *hy) {
    CUdeviceptr act[LAYERS + 1], dact[LAYERS + 1], gw[LAYERS], gb[LAYERS];
    wl_batch(it, batch, dims[0], CLASSES, hx, hy);
    act[0] = wl_alloc((size_t)batch * dims[0] * sizeof(float));
    CUdeviceptr labels = wl_alloc((size_t)batch * sizeof(int32_t));
    wl_h2d(act[0], hx, (size_t)batch * dims[0] * sizeof(float), s);
    wl_h2d(labels, hy, (size_t)batch * sizeof(int32_t), s);
    if (it == 0 && wl_opts()->warmup_differs)
        autotune(s, L, act[0], batch);

    /* Forward: z = act W + b, then ReLU in place except on the logits. */
    for (int l = 0; l < LAYERS; l++) {
        int in = dims[l], out = dims[l + 1];
        act[l + 1] = wl_alloc((size_t)batch * out * sizeof(float));
        wl_gemm(s, 0, 0, batch, out, in, 1.0f, act[l], in, L[l].w->w, out, 0.0f, act[l + 1], out);
        wl_bias_add(s, act[l + 1], L[l].b->w, batch, out, 1);
        if (l + 1 < LAYERS)
            wl_relu(s, act[l + 1], act[l + 1], (uint64_t)batch * out);
    }
    CUdeviceptr loss = wl_alloc_async(sizeof(float), s);
    dact[LAYERS] = wl_alloc_async((size_t)batch * CLASSES * sizeof(float), s);
    wl_softmax_xent(s, act[LAYERS], labels, loss, dact[LAYERS], batch, CLASSES);
    wl_free(act[LAYERS]);
    wl_free(labels);

    /* Backward: the gradient w.r.t. a ReLU output becomes, in place, the gradient w.r.t. the
     * pre-activation (relu_bwd reads the in-place output). */
    for (int l = LAYERS - 1; l >= 0; l--) {
        int in = dims[l], out = dims[l + 1];
        CUdeviceptr dz = dact[l + 1];
        if (l + 1 < LAYERS) {
            wl_relu_bwd(s, act[l + 1], dz, dz, (uint64_t)batch * out);
            wl_free(act[l + 1]);
        }
        gw[l] = wl_alloc((size_t)in * out * sizeof(float));
        gb[l] = wl_alloc((size_t)out * sizeof(float));
        wl_gemm(s, 1, 0, in, out, batch, 1.0f, act[l], in, dz, out, 0.0f, gw[l], out);
        wl_bias_grad(s, dz, gb[l], batch, out, 1);
        if (l > 0) {
            dact[l] = wl_alloc_async((size_t)batch * in * sizeof(float), s);
            wl_gemm(s, 0, 1, batch, in, out, 1.0f, dz, out, L[l].w->w, out, 0.0f, dact[l], in);
        }
        wl_free_async(dz, s);
    }
    wl_free(act[0]);

    for (int l = 0; l < LAYERS; l++) {
        wl_sgd(s, L[l].w->w, gw[l], L[l].w->v, L[l].w->n, LR, MOMENTUM, WD);
        wl_sgd(s, L[l].b->w, gb[l], L[l].b->v, L[l].b->n, LR, MOMENTUM, WD);
    }
    wl_iter_end(it, s, loss);
    for (int l = 0; l < LAYERS; l++) {
        wl_free(gw[l]);
        wl_free(gb[l]);
    }
    wl_free_async(loss, s);
}

int main(int argc, char **argv) {
    static const wl_program_t prog = {
        "large",
        "Trains a deep perceptron (1024 inputs, 12 hidden layers of 1024 with ReLU, 16 classes;\n"
        "softmax cross-entropy; SGD with momentum) on synthetic data, through the CUDA driver\n"
        "API. Weights, momentum and gradients take 48 MiB each: the peak of live device\n"
        "allocations is about 145 MiB at the default batch.\n\n"
        "Default capacity: FAKECUDA_MEM_BYTES=33554432 (32 MiB), the simulated device this\n"
        "workload is sized against (footprint 4.5x the capacity). Without an out-of-core shim it\n"
        "fails there with `error: cuMemAlloc_v2: CUDA_ERROR_OUT_OF_MEMORY (2) ...` and exit\n"
        "status 2; it succeeds on a device of at least 160 MiB.",
        3, 4};
    wl_opts_t o;
    wl_parse_args(&prog, argc, argv, &o);
    wl_cuda_init();
    wl_nn_init();
    CUstream s = wl_stream_create();

    wl_ops_pause(1);
    layer_t L[LAYERS];
    for (int l = 0; l < LAYERS; l++) {
        float bound = sqrtf(6.0f / (float)dims[l]); /* He-uniform */
        L[l].w = wl_param_new(s, (uint64_t)dims[l] * dims[l + 1], bound, 0.0f);
        L[l].b = wl_param_new(s, (uint64_t)dims[l + 1], 0.0f, 0.0f);
    }
    wl_ops_pause(0);

    float *hx = malloc((size_t)o.batch * dims[0] * sizeof(float));
    int32_t *hy = malloc((size_t)o.batch * sizeof(int32_t));
    if (!hx || !hy) {
        fprintf(stderr, "error: large: out of host memory\n");
        return 2;
    }
    for (int it = 0; it < o.iters; it++) {
        wl_iter_begin(it);
        train_step(s, L, it, wl_batch_size(it), hx, hy);
    }

    wl_ops_pause(1);
    uint64_t sum = wl_checksum(s);
    wl_params_free();
    wl_stream_destroy(s);
    wl_nn_fini();
    wl_cuda_fini();
    free(hx);
    free(hy);
    wl_report(sum);
    return 0;
}
