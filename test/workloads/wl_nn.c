/* SPDX-License-Identifier: MIT */
/* wl_nn.c: the workloads' launchers for module "nn", their parameter registry and checksum.
 *
 * Each wrapper packs its arguments as kernelParams (an array of pointers to each argument, as
 * real CUDA takes them) and launches one counted kernel on the given stream; the layouts are
 * those of test/fakecuda/kernels_nn.c. Parameters (weights and momentum) persist for the whole
 * run and are freed by wl_params_free. Single-threaded. */
#include "wl.h"

#include <stdio.h>
#include <stdlib.h>

static CUmodule nn_module;

enum {
    F_FILL_UNIFORM,
    F_FILL,
    F_GEMM,
    F_BIAS_ADD,
    F_BIAS_GRAD,
    F_RELU,
    F_RELU_BWD,
    F_ADD,
    F_AXPY,
    F_SCALE,
    F_GAP_FWD,
    F_GAP_BWD,
    F_SOFTMAX_XENT,
    F_SGD,
    F_COUNT
};

static const char *const fn_names[F_COUNT] = {
    "fill_uniform_f32", "fill_f32",     "gemm_f32",         "bias_add_f32",     "bias_grad_f32",
    "relu_f32",         "relu_bwd_f32", "add_f32",          "axpy_f32",         "scale_f32",
    "gap_fwd_f32",      "gap_bwd_f32",  "softmax_xent_f32", "sgd_momentum_f32",
};

static CUfunction fns[F_COUNT];

void wl_nn_init(void) {
    wl_check(wl_cu.ModuleLoadData(&nn_module, "FAKECUDA-MODULE:nn"), "cuModuleLoadData");
    for (int i = 0; i < F_COUNT; i++)
        wl_check(wl_cu.ModuleGetFunction(&fns[i], nn_module, fn_names[i]), "cuModuleGetFunction");
}

void wl_nn_fini(void) {
    wl_check(wl_cu.ModuleUnload(nn_module), "cuModuleUnload");
    nn_module = NULL;
}

void wl_gemm(CUstream s, int ta, int tb, int m, int n, int k, float alpha, CUdeviceptr a, int lda,
             CUdeviceptr b, int ldb, float beta, CUdeviceptr c, int ldc) {
    void *args[] = {&ta, &tb, &m, &n, &k, &alpha, &a, &lda, &b, &ldb, &beta, &c, &ldc};
    wl_launch(fns[F_GEMM], (uint64_t)m * (uint64_t)n, args, s);
}

void wl_fill_uniform(CUstream s, CUdeviceptr y, uint64_t n, uint64_t seed, float scale) {
    void *args[] = {&y, &n, &seed, &scale};
    wl_launch(fns[F_FILL_UNIFORM], n, args, s);
}

void wl_fill(CUstream s, CUdeviceptr y, uint64_t n, float value) {
    void *args[] = {&y, &n, &value};
    wl_launch(fns[F_FILL], n, args, s);
}

void wl_bias_add(CUstream s, CUdeviceptr y, CUdeviceptr b, int outer, int ch, int inner) {
    void *args[] = {&y, &b, &outer, &ch, &inner};
    wl_launch(fns[F_BIAS_ADD], (uint64_t)outer * (uint64_t)ch * (uint64_t)inner, args, s);
}

void wl_bias_grad(CUstream s, CUdeviceptr dy, CUdeviceptr db, int outer, int ch, int inner) {
    void *args[] = {&dy, &db, &outer, &ch, &inner};
    wl_launch(fns[F_BIAS_GRAD], (uint64_t)ch, args, s);
}

void wl_relu(CUstream s, CUdeviceptr x, CUdeviceptr y, uint64_t n) {
    void *args[] = {&x, &y, &n};
    wl_launch(fns[F_RELU], n, args, s);
}

void wl_relu_bwd(CUstream s, CUdeviceptr y, CUdeviceptr dy, CUdeviceptr dx, uint64_t n) {
    void *args[] = {&y, &dy, &dx, &n};
    wl_launch(fns[F_RELU_BWD], n, args, s);
}

void wl_add(CUstream s, CUdeviceptr a, CUdeviceptr b, CUdeviceptr c, uint64_t n) {
    void *args[] = {&a, &b, &c, &n};
    wl_launch(fns[F_ADD], n, args, s);
}

void wl_axpy(CUstream s, uint64_t n, float a, CUdeviceptr x, CUdeviceptr y) {
    void *args[] = {&n, &a, &x, &y};
    wl_launch(fns[F_AXPY], n, args, s);
}

void wl_scale(CUstream s, uint64_t n, float a, CUdeviceptr x) {
    void *args[] = {&n, &a, &x};
    wl_launch(fns[F_SCALE], n, args, s);
}

void wl_gap_fwd(CUstream s, CUdeviceptr x, CUdeviceptr y, int nc, int hw) {
    void *args[] = {&x, &y, &nc, &hw};
    wl_launch(fns[F_GAP_FWD], (uint64_t)nc, args, s);
}

void wl_gap_bwd(CUstream s, CUdeviceptr dy, CUdeviceptr dx, int nc, int hw) {
    void *args[] = {&dy, &dx, &nc, &hw};
    wl_launch(fns[F_GAP_BWD], (uint64_t)nc * (uint64_t)hw, args, s);
}

void wl_softmax_xent(CUstream s, CUdeviceptr logits, CUdeviceptr labels, CUdeviceptr loss,
                     CUdeviceptr dlogits, int rows, int classes) {
    void *args[] = {&logits, &labels, &loss, &dlogits, &rows, &classes};
    wl_launch(fns[F_SOFTMAX_XENT], (uint64_t)rows, args, s);
}

void wl_sgd(CUstream s, CUdeviceptr w, CUdeviceptr g, CUdeviceptr v, uint64_t n, float lr,
            float momentum, float wd) {
    void *args[] = {&w, &g, &v, &n, &lr, &momentum, &wd};
    wl_launch(fns[F_SGD], n, args, s);
}

/* ---- parameters and state -------------------------------------------------------------------- */

#define MAX_PARAMS 256

static wl_param_t params[MAX_PARAMS];
static size_t nparams;
static struct {
    CUdeviceptr p;
    uint64_t n;
} states[MAX_PARAMS];
static size_t nstates;

wl_param_t *wl_param_new(CUstream s, uint64_t n, float scale, float fill) {
    if (nparams == MAX_PARAMS) {
        fprintf(stderr, "error: workload: more than %d parameters\n", MAX_PARAMS);
        exit(2);
    }
    wl_param_t *p = &params[nparams];
    p->n = n;
    p->w = wl_alloc(n * sizeof(float));
    p->v = wl_alloc(n * sizeof(float));
    if (scale != 0.0f)
        wl_fill_uniform(s, p->w, n, wl_opts()->seed * 1000003u + nparams, scale);
    else
        wl_fill(s, p->w, n, fill);
    wl_memset32(p->v, 0, n, s);
    nparams++;
    return p;
}

void wl_state_register(CUdeviceptr p, uint64_t n) {
    if (nstates == MAX_PARAMS) {
        fprintf(stderr, "error: workload: more than %d state buffers\n", MAX_PARAMS);
        exit(2);
    }
    states[nstates].p = p;
    states[nstates].n = n;
    nstates++;
}

static uint64_t fnv1a(uint64_t h, const unsigned char *b, size_t n) {
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

/* Reads n floats at p back into a host buffer and folds them into h. */
static uint64_t fold(uint64_t h, CUstream s, CUdeviceptr p, uint64_t n) {
    float *buf = malloc(n * sizeof(float));
    if (!buf) {
        fprintf(stderr, "error: workload: out of host memory\n");
        exit(2);
    }
    wl_d2h_async(buf, p, n * sizeof(float), s);
    wl_sync(s);
    h = fnv1a(h, (const unsigned char *)buf, n * sizeof(float));
    free(buf);
    return h;
}

uint64_t wl_checksum(CUstream s) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < nparams; i++)
        h = fold(h, s, params[i].w, params[i].n);
    for (size_t i = 0; i < nstates; i++)
        h = fold(h, s, states[i].p, states[i].n);
    return h;
}

void wl_params_free(void) {
    for (size_t i = 0; i < nparams; i++) {
        wl_free(params[i].w);
        wl_free(params[i].v);
    }
    nparams = 0;
    nstates = 0;
}
