/* SPDX-License-Identifier: MIT */
/* userprog.h: what the small user programs of test/progs share (forkprog, exitprog, ...): the
 * mix kernel and its host model, driver-error reporting and the checksum. Header-only: each
 * program is one .c file built on its own.
 *
 * mix(uint32_t *dst, const uint32_t *src, uint32_t k, int n): dst[i] = dst[i] * 3 + src[i] + k,
 * in 32-bit integers, so the host model gives every byte. */
#ifndef OOC_USERPROG_H
#define OOC_USERPROG_H

#include <cuda.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fakecuda.h"

static inline int up_k_mix(fakecuda_launch_t *l) {
    CUdeviceptr dd = FAKECUDA_ARG(l, 0, CUdeviceptr), sd = FAKECUDA_ARG(l, 1, CUdeviceptr);
    uint32_t k = FAKECUDA_ARG(l, 2, uint32_t);
    int n = FAKECUDA_ARG(l, 3, int);
    uint32_t *dst = fakecuda_access(l, dd, (size_t)n * 4, 1);
    const uint32_t *src = fakecuda_access(l, sd, (size_t)n * 4, 0);
    if (!dst || !src)
        return -1;
    for (int i = 0; i < n; i++)
        dst[i] = dst[i] * 3u + src[i] + k;
    return 0;
}

/* The mix kernel's row for fakecuda_register_kernels, in module `module`. */
#define UP_MIX_KERNEL(module)                                                                      \
    { module, "mix", 4, {8, 8, 4, 4}, up_k_mix }

static inline void up_model_mix(uint32_t *dst, const uint32_t *src, uint32_t k, size_t n) {
    for (size_t i = 0; i < n; i++)
        dst[i] = dst[i] * 3u + src[i] + k;
}

/* Reports a failed driver call ("error: <call>: <name> (<code>)") and exits 2. */
static inline void up_die(const char *call, CUresult r) {
    const char *name = "?";
    cuGetErrorName(r, &name);
    fprintf(stderr, "error: %s: %s (%d)\n", call, name, (int)r);
    exit(2);
}

#define UP_CHECK(x)                                                                                \
    do {                                                                                           \
        CUresult r_ = (x);                                                                         \
        if (r_ != CUDA_SUCCESS)                                                                    \
            up_die(#x, r_);                                                                        \
    } while (0)

/* Launches mix(dst, src, k, n) on stream s. */
static inline CUresult up_mix(CUfunction f, CUdeviceptr dst, CUdeviceptr src, uint32_t k, int n,
                              CUstream s) {
    void *args[] = {&dst, &src, &k, &n};
    return cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, s, args, NULL);
}

/* Reads the programs' one option, `--iters N`, into *iters (left as given when absent), which
 * must be at least min_iters. Returns 0, or 64 after printing the usage or the error. */
static inline int up_parse_iters(int argc, char **argv, const char *prog, int min_iters,
                                 int *iters) {
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--iters") == 0 && i + 1 < argc) {
            *iters = atoi(argv[++i]);
        } else {
            fprintf(stderr, "usage: %s [--iters N]\n", prog);
            return 64;
        }
    }
    if (*iters < min_iters) {
        fprintf(stderr, "%s: --iters must be at least %d\n", prog, min_iters);
        return 64;
    }
    return 0;
}

/* Reads the value of `--pause-ms` (0 to 10000) into *ms. Returns 0, or 64 after naming prog,
 * the value and what is accepted. */
static inline int up_parse_pause(const char *prog, const char *arg, int *ms) {
    char *end;
    long v = strtol(arg, &end, 10);
    if (end == arg || *end || v < 0 || v > 10000) {
        fprintf(stderr, "%s: --pause-ms %s: expected 0 to 10000\n", prog, arg);
        return 64;
    }
    *ms = (int)v;
    return 0;
}

/* Sleeps ms milliseconds on the host (none for 0): the host falls behind the device. */
static inline void up_pause(int ms) {
    struct timespec t = {ms / 1000, (long)(ms % 1000) * 1000000L};
    if (ms)
        nanosleep(&t, NULL);
}

/* cuInit, then device 0's primary context made current; exits 2 on a driver error. */
static inline CUcontext up_init_context(void) {
    CUdevice dev;
    CUcontext ctx;
    UP_CHECK(cuInit(0));
    UP_CHECK(cuDeviceGet(&dev, 0));
    UP_CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    UP_CHECK(cuCtxSetCurrent(ctx));
    return ctx;
}

#define UP_FNV_SEED 1469598103934665603ull

/* FNV-1a 64 of n bytes, continuing from h. */
static inline uint64_t up_fnv(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

#endif
