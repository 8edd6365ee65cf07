/* SPDX-License-Identifier: MIT */
/* modprog.c: a program that unloads its modules and loads others, as JIT-compiling frameworks
 * do: every iteration loads module A, runs its kernel, unloads it, then loads module B, whose
 * kernel takes the same kind of arguments in another order, runs it and unloads it. The
 * simulated driver hands out function handles that were freed before, so B's function has the
 * handle value A's had: whatever the shim remembers per function (its parameter layout, what
 * verification found, what the plan expects) must be forgotten when a module is unloaded.
 * First, though, both modules stay loaded for --iters iterations (a plan is made and replayed
 * in auto mode) and are then unloaded and loaded again in the other order, so that A's and B's
 * functions swap handle values, for --iters more.
 *
 * Device work (64 KiB buffers, run with FAKECUDA_GRANULARITY=64K and OOC_CHUNK=64K): NB
 * buffers; A's mix(dst, src, k, n) mixes buffer b with buffer b + 1, B's xim(n, k, src, dst)
 * mixes buffer b with buffer b + 3 (userprog.h's host model for both). Then the per-iteration
 * cycle is repeated with cuLibraryLoadData/cuLibraryUnload and cuLibraryGetKernel/
 * cuKernelGetFunction.
 *
 * Options: --iters N (default 8). Output: "checksum: H" (FNV-1a 64 of every buffer),
 * "handles reused: yes|no" and "handles swapped: yes|no". Exit status: 0 when every byte is right;
 * 1 when one is wrong; 2 when a driver call failed ("error: <call>: <name> (<code>)"). Linked with
 * -lcuda. */
#include <cuda.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "userprog.h"

#define WORDS 16384 /* 64 KiB */
#define NB    16

/* xim(int n, uint32_t k, const uint32_t *src, uint32_t *dst): mix with its arguments reversed. */
static int k_xim(fakecuda_launch_t *l) {
    int n = FAKECUDA_ARG(l, 0, int);
    uint32_t k = FAKECUDA_ARG(l, 1, uint32_t);
    CUdeviceptr sd = FAKECUDA_ARG(l, 2, CUdeviceptr), dd = FAKECUDA_ARG(l, 3, CUdeviceptr);
    uint32_t *dst = fakecuda_access(l, dd, (size_t)n * 4, 1);
    const uint32_t *src = fakecuda_access(l, sd, (size_t)n * 4, 0);
    if (!dst || !src)
        return -1;
    for (int i = 0; i < n; i++)
        dst[i] = dst[i] * 3u + src[i] + k;
    return 0;
}

static const fakecuda_kernel_t kernels[] = {
    UP_MIX_KERNEL("modprog_a"),
    {"modprog_b", "xim", 4, {4, 4, 8, 8}, k_xim},
};

static CUdeviceptr bufs[NB];
static uint32_t *model[NB];

static void run_a(CUfunction f, int it) {
    for (int b = 0; b < NB; b++) {
        uint32_t k = (uint32_t)(it * 1000 + b);
        UP_CHECK(up_mix(f, bufs[b], bufs[(b + 1) % NB], k, WORDS, NULL));
        up_model_mix(model[b], model[(b + 1) % NB], k, WORDS);
    }
}

static void run_b(CUfunction f, int it) {
    for (int b = 0; b < NB; b++) {
        uint32_t k = (uint32_t)(it * 1000 + 500 + b);
        int n = WORDS;
        CUdeviceptr src = bufs[(b + 3) % NB], dst = bufs[b];
        void *args[] = {&n, &k, &src, &dst};
        UP_CHECK(cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, NULL, args, NULL));
        up_model_mix(model[b], model[(b + 3) % NB], k, WORDS);
    }
}

int main(int argc, char **argv) {
    int iters = 8;
    if (up_parse_iters(argc, argv, "modprog", 1, &iters) != 0)
        return 64;
    if (fakecuda_register_kernels(kernels, sizeof kernels / sizeof kernels[0]) != 0)
        return 2;
    (void)up_init_context();
    for (int b = 0; b < NB; b++) {
        model[b] = malloc(WORDS * 4);
        if (!model[b])
            return 2;
        for (int i = 0; i < WORDS; i++)
            model[b][i] = (uint32_t)(b * 7919 + i);
        UP_CHECK(cuMemAlloc(&bufs[b], WORDS * 4));
        UP_CHECK(cuMemcpyHtoD(bufs[b], model[b], WORDS * 4));
    }
    int reused = 0, swapped = 0, it0 = 0;
    /* Loaded once: the iterations repeat, and in auto mode a plan is made and replayed. Then B
     * and A are unloaded and loaded again in the other order: each function gets the handle
     * value the other had, with the same grid and buffer sizes. */
    {
        CUmodule ma, mb;
        CUfunction fa, fb, fa2, fb2;
        UP_CHECK(cuModuleLoadData(&ma, FAKECUDA_IMAGE_PREFIX "modprog_a"));
        UP_CHECK(cuModuleGetFunction(&fa, ma, "mix"));
        UP_CHECK(cuModuleLoadData(&mb, FAKECUDA_IMAGE_PREFIX "modprog_b"));
        UP_CHECK(cuModuleGetFunction(&fb, mb, "xim"));
        for (int it = 0; it < iters; it++, it0++) {
            run_a(fa, it0);
            run_b(fb, it0);
        }
        UP_CHECK(cuModuleUnload(mb));
        UP_CHECK(cuModuleUnload(ma));
        UP_CHECK(cuModuleLoadData(&mb, FAKECUDA_IMAGE_PREFIX "modprog_b"));
        UP_CHECK(cuModuleGetFunction(&fb2, mb, "xim"));
        UP_CHECK(cuModuleLoadData(&ma, FAKECUDA_IMAGE_PREFIX "modprog_a"));
        UP_CHECK(cuModuleGetFunction(&fa2, ma, "mix"));
        swapped = fb2 == fa && fa2 == fb;
        for (int it = 0; it < iters; it++, it0++) {
            run_a(fa2, it0);
            run_b(fb2, it0);
        }
        UP_CHECK(cuModuleUnload(ma));
        UP_CHECK(cuModuleUnload(mb));
    }
    /* Unloaded and loaded again in every iteration. */
    for (int it = 0; it < iters; it++, it0++) {
        CUmodule ma, mb;
        CUfunction fa, fb;
        UP_CHECK(cuModuleLoadData(&ma, FAKECUDA_IMAGE_PREFIX "modprog_a"));
        UP_CHECK(cuModuleGetFunction(&fa, ma, "mix"));
        run_a(fa, it0);
        UP_CHECK(cuModuleUnload(ma));
        UP_CHECK(cuModuleLoadData(&mb, FAKECUDA_IMAGE_PREFIX "modprog_b"));
        UP_CHECK(cuModuleGetFunction(&fb, mb, "xim"));
        reused |= fa == fb;
        run_b(fb, it0);
        UP_CHECK(cuModuleUnload(mb));
    }
    for (int it = 0; it < iters; it++, it0++) {
        CUlibrary la, lb;
        CUkernel ka, kb;
        CUfunction fa, fb;
        UP_CHECK(cuLibraryLoadData(&la, FAKECUDA_IMAGE_PREFIX "modprog_a", NULL, NULL, 0, NULL,
                                   NULL, 0));
        UP_CHECK(cuLibraryGetKernel(&ka, la, "mix"));
        UP_CHECK(cuKernelGetFunction(&fa, ka));
        run_a(fa, it0);
        UP_CHECK(cuLibraryUnload(la));
        UP_CHECK(cuLibraryLoadData(&lb, FAKECUDA_IMAGE_PREFIX "modprog_b", NULL, NULL, 0, NULL,
                                   NULL, 0));
        UP_CHECK(cuLibraryGetKernel(&kb, lb, "xim"));
        UP_CHECK(cuKernelGetFunction(&fb, kb));
        run_b(fb, it0);
        UP_CHECK(cuLibraryUnload(lb));
    }
    uint32_t *host = malloc(WORDS * 4);
    if (!host)
        return 2;
    int bad = 0;
    uint64_t sum = UP_FNV_SEED;
    for (int b = 0; b < NB; b++) {
        UP_CHECK(cuMemcpyDtoH(host, bufs[b], WORDS * 4));
        if (memcmp(host, model[b], WORDS * 4) != 0) {
            fprintf(stderr, "modprog: buffer %d is wrong\n", b);
            bad = 1;
        }
        sum = up_fnv(sum, model[b], WORDS * 4);
        UP_CHECK(cuMemFree(bufs[b]));
    }
    printf("checksum: %016llx\nhandles reused: %s\nhandles swapped: %s\n", (unsigned long long)sum,
           reused ? "yes" : "no", swapped ? "yes" : "no");
    return bad;
}
