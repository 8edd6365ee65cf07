/* SPDX-License-Identifier: MIT */
/* bench_hooks.c: the cost of the driver calls a training loop makes most often, for measuring
 * the shim's hook overhead (scripts/bench-hooks runs it with and without the shim).
 *
 * Usage: bench_hooks [N] [iter]. Times N kernel launches (a kernel with three pointers into live
 * buffers and two scalars, the shape of an elementwise op), N cuMemAlloc+cuMemFree pairs of
 * 4 KiB (slab-sized) and N/1000 of 4 MiB (chunk-sized), N 4-byte cuMemsetD32Async calls, and
 * prints "name<TAB>ns_per_call" lines. With `iter`, times only N launches in iterations of
 * ITER_OPS launches, each iteration ended by ooc_mark_iteration_if_loaded(), after WARM_ITERS
 * such iterations: under OOC_MODE=auto these are the replayed ops (the shim recorded, planned
 * and replays them), elsewhere the same launches with a marker between iterations. Best of 5
 * rounds per measure, so that a stray scheduling hiccup does not count. Linked with -lcuda;
 * meant for FAKECUDA_SCHED=inline. */
#include <cuda.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fakecuda.h"
#include "../../shim/ooc_shim.h" /* the public header, as a program includes it */

static int k_axpy(fakecuda_launch_t *l) {
    (void)l; /* the work itself is not what is measured */
    return 0;
}

static const fakecuda_kernel_t kernels[] = {
    {"bench", "axpy", 5, {8, 8, 8, 4, 8}, k_axpy},
};

#define CHECK(x)                                                                                   \
    do {                                                                                           \
        CUresult r_ = (x);                                                                         \
        if (r_ != CUDA_SUCCESS) {                                                                  \
            fprintf(stderr, "bench_hooks: %s failed: %d\n", #x, (int)r_);                          \
            exit(2);                                                                               \
        }                                                                                          \
    } while (0)

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static CUfunction fn;
static CUdeviceptr bx, by, bz;
static CUstream st;

static void launches(long n) {
    float a = 2.0f;
    size_t cnt = 1024;
    void *args[] = {&bx, &by, &bz, &a, &cnt};
    for (long i = 0; i < n; i++)
        CHECK(cuLaunchKernel(fn, 4, 1, 1, 256, 1, 1, 0, st, args, NULL));
    CHECK(cuStreamSynchronize(st));
}

static void allocs(long n, size_t bytes) {
    for (long i = 0; i < n; i++) {
        CUdeviceptr p;
        CHECK(cuMemAlloc(&p, bytes));
        CHECK(cuMemFree(p));
    }
}

static void memsets(long n) {
    for (long i = 0; i < n; i++)
        CHECK(cuMemsetD32Async(bx, 0, 1, st));
    CHECK(cuStreamSynchronize(st));
}

enum { ITER_OPS = 100, WARM_ITERS = 20 };

/* n launches (rounded up to whole iterations), each ITER_OPS ended by the iteration marker. */
static void iterations(long n) {
    float a = 2.0f;
    size_t cnt = 1024;
    void *args[] = {&bx, &by, &bz, &a, &cnt};
    for (long i = 0; i < n; i += ITER_OPS) {
        for (int k = 0; k < ITER_OPS; k++)
            CHECK(cuLaunchKernel(fn, 4, 1, 1, 256, 1, 1, 0, st, args, NULL));
        CHECK(cuStreamSynchronize(st));
        ooc_mark_iteration_if_loaded();
    }
}

/* Best-of-5 time per call of f(n). */
static double best(void (*f)(long), long n) {
    double b = 1e300;
    for (int r = 0; r < 5; r++) {
        uint64_t t0 = now_ns();
        f(n);
        double per = (double)(now_ns() - t0) / (double)n;
        if (per < b)
            b = per;
    }
    return b;
}

static void alloc_small(long n) {
    allocs(n, 4096);
}

static void alloc_large(long n) {
    allocs(n, (size_t)4 << 20);
}

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 100000;
    int iter = argc > 2 && strcmp(argv[2], "iter") == 0;
    if (n < 10 || (argc > 2 && !iter)) {
        fprintf(stderr, "usage: bench_hooks [N >= 10] [iter]\n");
        return 2;
    }
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    if (fakecuda_register_kernels(kernels, 1) != 0)
        return 2;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuModuleLoadData(&mod, FAKECUDA_IMAGE_PREFIX "bench"));
    CHECK(cuModuleGetFunction(&fn, mod, "axpy"));
    CHECK(cuStreamCreate(&st, CU_STREAM_NON_BLOCKING));
    CHECK(cuMemAlloc(&bx, 4096));
    CHECK(cuMemAlloc(&by, 4096));
    CHECK(cuMemAlloc(&bz, 4096));
    if (iter) {
        iterations((long)WARM_ITERS * ITER_OPS); /* auto: recorded, planned, replay begins */
        printf("launch_iter\t%.1f\n", best(iterations, n));
        return 0;
    }
    launches(1000); /* warm: the shim learns the kernel's parameter layout once */
    printf("launch\t%.1f\n", best(launches, n));
    printf("memset\t%.1f\n", best(memsets, n));
    printf("alloc_free_4k\t%.1f\n", best(alloc_small, n));
    printf("alloc_free_4m\t%.1f\n", best(alloc_large, n / 1000 > 10 ? n / 1000 : 10));
    CHECK(cuMemFree(bx));
    CHECK(cuMemFree(by));
    CHECK(cuMemFree(bz));
    CHECK(cuStreamDestroy(st));
    CHECK(cuModuleUnload(mod));
    return 0;
}
