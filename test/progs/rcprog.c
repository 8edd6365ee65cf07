/* SPDX-License-Identifier: MIT */
/* rcprog.c: producers that recompute verification must refuse, beside one it must accept.
 *
 * Each of ITERS iterations allocates four buffers of N floats, written first by (module
 * "rctest", test/fakecuda/kernels_ooc.c): A by copy_f32 from a persistent input X (a
 * deterministic producer), B by noisy_fill_f32 (a different result at every launch), C by
 * accumulate_f32 (it reads its output), then reads all three into D with copy_f32 and
 * accumulate_f32, reads D back, and frees them. Prints `checksum: H` (FNV-1a of every D read
 * back). With --addrs, also prints each iteration's four addresses as offsets from X's (`addrs I:
 * A B C D`): recording must not move the program's buffers. Exit status 0, or 2 on a driver
 * error. Linked with -lcuda (the simulated driver). */
#include <cuda.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N     (64 * 1024)
#define ITERS 8

#define CHECK(x)                                                                                   \
    do {                                                                                           \
        CUresult r_ = (x);                                                                         \
        if (r_ != CUDA_SUCCESS) {                                                                  \
            fprintf(stderr, "error: %s: %d\n", #x, (int)r_);                                       \
            exit(2);                                                                               \
        }                                                                                          \
    } while (0)

static CUfunction f_copy, f_noisy, f_acc;

static void launch(CUfunction f, CUstream s, void **args) {
    CHECK(cuLaunchKernel(f, 64, 1, 1, 256, 1, 1, 0, s, args, NULL));
}

static void copy(CUstream s, CUdeviceptr x, CUdeviceptr y) {
    uint64_t n = N;
    void *a[] = {&x, &y, &n};
    launch(f_copy, s, a);
}

static void accumulate(CUstream s, CUdeviceptr x, CUdeviceptr y) {
    uint64_t n = N;
    void *a[] = {&x, &y, &n};
    launch(f_acc, s, a);
}

int main(int argc, char **argv) {
    int addrs = argc > 1 && strcmp(argv[1], "--addrs") == 0;
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUstream s;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuModuleLoadData(&mod, "FAKECUDA-MODULE:rctest"));
    CHECK(cuModuleGetFunction(&f_copy, mod, "copy_f32"));
    CHECK(cuModuleGetFunction(&f_noisy, mod, "noisy_fill_f32"));
    CHECK(cuModuleGetFunction(&f_acc, mod, "accumulate_f32"));
    CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    static float host[N];
    for (int i = 0; i < N; i++)
        host[i] = (float)(i % 97) * 0.5f;
    CUdeviceptr x;
    CHECK(cuMemAlloc(&x, N * sizeof(float)));
    CHECK(cuMemcpyHtoD(x, host, N * sizeof(float)));
    uint64_t h = 1469598103934665603ull;
    for (int it = 0; it < ITERS; it++) {
        CUdeviceptr a, b, c, d;
        CHECK(cuMemAlloc(&a, N * sizeof(float)));
        CHECK(cuMemAlloc(&b, N * sizeof(float)));
        CHECK(cuMemAlloc(&c, N * sizeof(float)));
        CHECK(cuMemAlloc(&d, N * sizeof(float)));
        if (addrs)
            printf("addrs %d: %lld %lld %lld %lld\n", it, (long long)(a - x), (long long)(b - x),
                   (long long)(c - x), (long long)(d - x));
        copy(s, x, a);
        uint64_t n = N;
        void *na[] = {&b, &n};
        launch(f_noisy, s, na);
        accumulate(s, x, c); /* reads C before anything wrote it */
        copy(s, a, d);
        accumulate(s, b, d);
        accumulate(s, c, d);
        CHECK(cuMemcpyDtoHAsync(host, d, N * sizeof(float), s));
        CHECK(cuStreamSynchronize(s));
        const unsigned char *p = (const unsigned char *)host;
        for (size_t i = 0; i < N * sizeof(float); i++)
            h = (h ^ p[i]) * 1099511628211ull;
        CHECK(cuMemFree(a));
        CHECK(cuMemFree(b));
        CHECK(cuMemFree(c));
        CHECK(cuMemFree(d));
        CHECK(cuMemcpyHtoD(x, host, 16)); /* the input changes a little every iteration */
    }
    CHECK(cuMemFree(x));
    CHECK(cuStreamDestroy(s));
    printf("checksum: %016llx\n", (unsigned long long)h);
    return 0;
}
