/* SPDX-License-Identifier: MIT */
/* sideprog.c: a producer kernel with a side effect on mapped host memory. Each iteration, for
 * every b, allocates a temporary buffer, fills it with produce (which also counts its launches in
 * a page-locked, device-mapped host counter), mixes it into the persistent buffer b, and frees
 * it. produce is the first to write its buffer and writes all of it the same way each time: a
 * recompute candidate, except that launching it again also counts again. The shim may launch a
 * kernel only as often as the program does when the kernel writes memory it cannot see.
 *
 * Device work (64 KiB buffers, run with FAKECUDA_GRANULARITY=64K and OOC_CHUNK=64K).
 *
 * Options: --iters N (default 8). Output: "launches counted: N" (the host counter) and
 * "checksum: H" (FNV-1a 64 of every persistent buffer). Exit status: 0 when every byte is right;
 * 1 when one is wrong; 2 when a driver call failed ("error: <call>: <name> (<code>)"). Linked
 * with -lcuda. */
#include <cuda.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "userprog.h"

#define WORDS 16384 /* 64 KiB */
#define NB    32

/* produce(uint32_t *dst, int n, uint32_t seed, uint32_t *counter): dst[i] = seed * 2654435761 +
 * i * 40503, and counter[0] += 1 (mapped host memory). */
static int k_produce(fakecuda_launch_t *l) {
    CUdeviceptr dd = FAKECUDA_ARG(l, 0, CUdeviceptr);
    int n = FAKECUDA_ARG(l, 1, int);
    uint32_t seed = FAKECUDA_ARG(l, 2, uint32_t);
    CUdeviceptr cd = FAKECUDA_ARG(l, 3, CUdeviceptr);
    uint32_t *dst = fakecuda_access(l, dd, (size_t)n * 4, 1);
    uint32_t *counter = fakecuda_access(l, cd, 4, 1);
    if (!dst || !counter)
        return -1;
    for (int i = 0; i < n; i++)
        dst[i] = seed * 2654435761u + (uint32_t)i * 40503u;
    counter[0]++;
    return 0;
}

static const fakecuda_kernel_t kernels[] = {
    UP_MIX_KERNEL("sideprog"),
    {"sideprog", "produce", 4, {8, 4, 4, 8}, k_produce},
};

int main(int argc, char **argv) {
    int iters = 8;
    if (up_parse_iters(argc, argv, "sideprog", 1, &iters) != 0)
        return 64;
    if (fakecuda_register_kernels(kernels, sizeof kernels / sizeof kernels[0]) != 0)
        return 2;
    (void)up_init_context();
    CUmodule mod;
    CUfunction f_mix, f_produce;
    UP_CHECK(cuModuleLoadData(&mod, FAKECUDA_IMAGE_PREFIX "sideprog"));
    UP_CHECK(cuModuleGetFunction(&f_mix, mod, "mix"));
    UP_CHECK(cuModuleGetFunction(&f_produce, mod, "produce"));
    uint32_t *counter;
    CUdeviceptr counter_d;
    UP_CHECK(cuMemHostAlloc((void **)&counter, 4096, CU_MEMHOSTALLOC_DEVICEMAP));
    UP_CHECK(cuMemHostGetDevicePointer(&counter_d, counter, 0));
    counter[0] = 0;
    CUdeviceptr acc[NB];
    uint32_t *model[NB], *tmp_m = malloc(WORDS * 4);
    if (!tmp_m)
        return 2;
    for (int b = 0; b < NB; b++) {
        model[b] = calloc(WORDS, 4);
        if (!model[b])
            return 2;
        UP_CHECK(cuMemAlloc(&acc[b], WORDS * 4));
        UP_CHECK(cuMemsetD32(acc[b], 0, WORDS));
    }
    for (int it = 0; it < iters; it++) {
        for (int b = 0; b < NB; b++) {
            CUdeviceptr tmp;
            int n = WORDS;
            uint32_t seed = (uint32_t)b;
            UP_CHECK(cuMemAlloc(&tmp, WORDS * 4));
            void *args[] = {&tmp, &n, &seed, &counter_d};
            UP_CHECK(cuLaunchKernel(f_produce, 1, 1, 1, 32, 1, 1, 0, NULL, args, NULL));
            uint32_t k = (uint32_t)(it * NB + b);
            UP_CHECK(up_mix(f_mix, acc[b], tmp, k, WORDS, NULL));
            for (int i = 0; i < WORDS; i++)
                tmp_m[i] = seed * 2654435761u + (uint32_t)i * 40503u;
            up_model_mix(model[b], tmp_m, k, WORDS);
            UP_CHECK(cuMemFree(tmp));
        }
    }
    UP_CHECK(cuCtxSynchronize());
    int bad = 0;
    uint64_t sum = UP_FNV_SEED;
    for (int b = 0; b < NB; b++) {
        UP_CHECK(cuMemcpyDtoH(tmp_m, acc[b], WORDS * 4));
        if (memcmp(tmp_m, model[b], WORDS * 4) != 0) {
            fprintf(stderr, "sideprog: buffer %d is wrong\n", b);
            bad = 1;
        }
        sum = up_fnv(sum, model[b], WORDS * 4);
        UP_CHECK(cuMemFree(acc[b]));
    }
    printf("launches counted: %u\nchecksum: %016llx\n", counter[0], (unsigned long long)sum);
    UP_CHECK(cuMemFreeHost(counter));
    return bad;
}
