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
#include "wl_mlp.h"

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
    wl_mlp_spec_t spec = {.layers = 13, .lr = 0.002f};
    for (int l = 0; l < 13; l++)
        spec.dims[l] = 1024;
    spec.dims[13] = 16;
    return wl_mlp_main(&prog, &spec, argc, argv);
}
