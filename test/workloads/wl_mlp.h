/* SPDX-License-Identifier: MIT */
/* wl_mlp.h: the perceptron that the mlp and large workloads train (they differ only in shape). */
#ifndef WL_MLP_H
#define WL_MLP_H

#include "wl.h"
#include "wl_blas.h"

#define WL_MLP_MAX_LAYERS 64

typedef struct wl_mlp_spec {
    int layers;                      /* weight layers, 1..WL_MLP_MAX_LAYERS */
    int dims[WL_MLP_MAX_LAYERS + 1]; /* widths: inputs, hidden..., classes */
    float lr;                        /* SGD learning rate (momentum 0.9, weight decay 1e-4) */
    wl_blas_mode_t blas;             /* how the GEMMs run (mlp --cublas, --cublas-batched) */
} wl_mlp_spec_t;

/* Parses the shared options, trains spec's perceptron for --iters iterations on synthetic
 * data (ReLU in place, softmax cross-entropy, SGD with momentum) and prints the report lines.
 * Every GEMM is module nn's kernel, or with spec->blas a cuBLAS call (the same bits).
 * Returns the process exit status. */
int wl_mlp_main(const wl_program_t *prog, const wl_mlp_spec_t *spec, int argc, char **argv);

#endif
