/* SPDX-License-Identifier: MIT */
/* mlp.c: a multi-layer perceptron trained on synthetic data on the (simulated) CUDA device.
 *
 * 256 -> 256 -> 256 -> 10 with ReLU (in place), softmax cross-entropy and SGD with momentum.
 * Weights and momentum persist; each iteration copies its batch in, allocates activations with
 * cuMemAlloc_v2 and activation gradients with cuMemAllocAsync, frees each after its last use,
 * keeps the weight gradients until the optimizer step, and reads the loss back. */
#include "wl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MAX_LAYERS = 64, CLASSES = 10 };
/* The depth (--layers, default 3) and the widths: 256 everywhere, CLASSES at the output. */
static int LAYERS = 3;
static int dims[MAX_LAYERS + 1];

static const float LR = 0.05f, MOMENTUM = 0.9f, WD = 1e-4f;

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
    CUdeviceptr act[MAX_LAYERS + 1], dact[MAX_LAYERS + 1], gw[MAX_LAYERS], gb[MAX_LAYERS];
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
        "mlp",
        "Trains a multi-layer perceptron (256-256-256-10, ReLU, softmax cross-entropy, SGD with\n"
        "momentum) on synthetic data, through the CUDA driver API. Footprint about 1.6 MiB at the\n"
        "default batch; any device capacity of a few MiB suffices.\n"
        "--layers N (1..64, default 3) sets the depth: 256-wide hidden layers, 10 outputs. A\n"
        "deeper net keeps each operation small against the footprint (--layers 12: about 9 MiB).",
        3, 32};
    /* --layers is this program's own option; the shared parser sees the rest. */
    for (int i = 1; i + 1 < argc; i++) {
        if (strcmp(argv[i], "--layers") == 0) {
            char *end;
            long n = strtol(argv[i + 1], &end, 10);
            if (*end != '\0' || n < 1 || n > MAX_LAYERS) {
                fprintf(stderr, "error: mlp: --layers %s: expected an integer from 1 to %d\n",
                        argv[i + 1], MAX_LAYERS);
                return 2;
            }
            LAYERS = (int)n;
            memmove(&argv[i], &argv[i + 2], (size_t)(argc - i - 1) * sizeof *argv);
            argc -= 2;
            break;
        }
    }
    for (int l = 0; l < LAYERS; l++)
        dims[l] = 256;
    dims[LAYERS] = CLASSES;
    wl_opts_t o;
    wl_parse_args(&prog, argc, argv, &o);
    wl_cuda_init();
    wl_nn_init();
    CUstream s = wl_stream_create();

    wl_ops_pause(1);
    layer_t L[MAX_LAYERS];
    for (int l = 0; l < LAYERS; l++) {
        float bound = sqrtf(6.0f / (float)dims[l]); /* He-uniform */
        L[l].w = wl_param_new(s, (uint64_t)dims[l] * dims[l + 1], bound, 0.0f);
        L[l].b = wl_param_new(s, (uint64_t)dims[l + 1], 0.0f, 0.0f);
    }
    wl_ops_pause(0);

    float *hx = malloc((size_t)o.batch * dims[0] * sizeof(float));
    int32_t *hy = malloc((size_t)o.batch * sizeof(int32_t));
    if (!hx || !hy) {
        fprintf(stderr, "error: mlp: out of host memory\n");
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
