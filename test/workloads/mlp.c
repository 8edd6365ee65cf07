/* SPDX-License-Identifier: MIT */
/* mlp.c: a multi-layer perceptron trained on synthetic data on the (simulated) CUDA device.
 *
 * 256 -> 256 -> 256 -> 10 with ReLU (in place), softmax cross-entropy and SGD with momentum.
 * Weights and momentum persist; each iteration copies its batch in, allocates activations with
 * cuMemAlloc_v2 and activation gradients with cuMemAllocAsync, frees each after its last use,
 * keeps the weight gradients until the optimizer step, and reads the loss back. --cublas and
 * --cublas-batched send every GEMM through cuBLAS (libcublas.so.13, opened at run time). */
#include "wl_mlp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    wl_mlp_spec_t spec = {.lr = 0.05f};
    int layers = 3;
    static const wl_program_t prog = {
        "mlp",
        "Trains a multi-layer perceptron (256-256-256-10, ReLU, softmax cross-entropy, SGD with\n"
        "momentum) on synthetic data, through the CUDA driver API. Footprint about 1.6 MiB at the\n"
        "default batch; any device capacity of a few MiB suffices.\n"
        "--layers N (1..64, default 3) sets the depth: 256-wide hidden layers, 10 outputs. A\n"
        "deeper net keeps each operation small against the footprint (--layers 12: about 9 MiB).\n"
        "--cublas sends every GEMM through cuBLAS (libcublas.so.13, opened with dlopen) as\n"
        "cublasGemmEx: one launch each, the same checksum and op count as the default.\n"
        "--cublas-batched issues each GEMM as cublasGemmBatchedEx with batchCount 1 instead: its\n"
        "three pointer arrays are cuMemAlloc'd per call, filled with cuMemcpyHtoD and freed after\n"
        "it (3 more ops per GEMM); the operands' addresses are then only in device memory. The\n"
        "same checksum. --cublas-batched=staged first fills each array with a decoy address (an\n"
        "other operand) from the host, then copies the real one into it on the device from a\n"
        "staging array filled from the host; --cublas-batched=opaque also has a kernel read\n"
        "each staging array before the copy. Same checksum.",
        3, 32};
    /* --layers, --cublas and --cublas-batched are this program's own options; the shared
     * parser sees the rest. */
    static const struct {
        const char *opt;
        wl_blas_mode_t mode;
    } blas_opts[] = {{"--cublas", WL_BLAS_EX},
                     {"--cublas-batched", WL_BLAS_BATCHED},
                     {"--cublas-batched=staged", WL_BLAS_STAGED},
                     {"--cublas-batched=opaque", WL_BLAS_OPAQUE}};
    for (int i = 1; i < argc; i++) {
        size_t o = 0;
        while (o < sizeof blas_opts / sizeof blas_opts[0] && strcmp(argv[i], blas_opts[o].opt) != 0)
            o++;
        if (o < sizeof blas_opts / sizeof blas_opts[0]) {
            spec.blas = blas_opts[o].mode;
            memmove(&argv[i], &argv[i + 1], (size_t)(argc - i) * sizeof *argv);
            argc--;
            i--;
        }
    }
    for (int i = 1; i + 1 < argc; i++) {
        if (strcmp(argv[i], "--layers") == 0) {
            char *end;
            long n = strtol(argv[i + 1], &end, 10);
            if (*end != '\0' || n < 1 || n > WL_MLP_MAX_LAYERS) {
                fprintf(stderr, "error: mlp: --layers %s: expected an integer from 1 to %d\n",
                        argv[i + 1], WL_MLP_MAX_LAYERS);
                return 2;
            }
            layers = (int)n;
            memmove(&argv[i], &argv[i + 2], (size_t)(argc - i - 1) * sizeof *argv);
            argc -= 2;
            break;
        }
    }
    spec.layers = layers;
    for (int l = 0; l < layers; l++)
        spec.dims[l] = 256;
    spec.dims[layers] = 10;
    return wl_mlp_main(&prog, &spec, argc, argv);
}
