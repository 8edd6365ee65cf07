/* SPDX-License-Identifier: MIT */
/* stray.c: kernels that reach a buffer through a pointer stored in device memory, which the
 * shim cannot see, after that buffer was swapped out. Tests safe mode.
 *
 * Needs a budget of 4 chunks of 64 KiB (FAKECUDA_GRANULARITY=65536, OOC_CHUNK=64K,
 * OOC_BUDGET=256K). Buffer A (one chunk) is filled with 0x5a, its address is stored in a small
 * table T, and four other chunks are written so that A is evicted. Then a kernel given only T
 * writes 0x33 over A's first half, and another copies A (through T) into D. Exit status: 0 when
 * D and A, read back, hold the expected bytes; 3 when an operation failed (the device reported
 * an illegal address: what happens without safe mode); 1 when the bytes are wrong (corruption);
 * 2 on a usage or set-up error. Linked with -lcuda (the simulated driver). */
#include <cuda.h>
#include <stdio.h>
#include <string.h>

#include "fakecuda.h"

#define CHUNK ((size_t)64 << 10)

/* write_indirect(table, value, bytes): *(table[0])[0 .. bytes) = value. */
static int k_write_indirect(fakecuda_launch_t *l) {
    CUdeviceptr t = FAKECUDA_ARG(l, 0, CUdeviceptr);
    unsigned value = FAKECUDA_ARG(l, 1, unsigned);
    size_t bytes = FAKECUDA_ARG(l, 2, size_t);
    const CUdeviceptr *tab = fakecuda_access(l, t, sizeof *tab, 0);
    if (!tab)
        return -1;
    unsigned char *dst = fakecuda_access(l, tab[0], bytes, 1);
    if (!dst)
        return -1;
    memset(dst, (int)value, bytes);
    return 0;
}

/* copy_indirect(table, dst, bytes): dst[0 .. bytes) = (table[0])[0 .. bytes). */
static int k_copy_indirect(fakecuda_launch_t *l) {
    CUdeviceptr t = FAKECUDA_ARG(l, 0, CUdeviceptr);
    CUdeviceptr d = FAKECUDA_ARG(l, 1, CUdeviceptr);
    size_t bytes = FAKECUDA_ARG(l, 2, size_t);
    const CUdeviceptr *tab = fakecuda_access(l, t, sizeof *tab, 0);
    if (!tab)
        return -1;
    const unsigned char *src = fakecuda_access(l, tab[0], bytes, 0);
    unsigned char *dst = fakecuda_access(l, d, bytes, 1);
    if (!src || !dst)
        return -1;
    memcpy(dst, src, bytes);
    return 0;
}

static const fakecuda_kernel_t kernels[] = {
    {"stray", "write_indirect", 3, {8, 4, 8}, k_write_indirect},
    {"stray", "copy_indirect", 3, {8, 8, 8}, k_copy_indirect},
};

#define CHECK(x)                                                                                   \
    do {                                                                                           \
        CUresult r_ = (x);                                                                         \
        if (r_ != CUDA_SUCCESS) {                                                                  \
            const char *n_ = "?";                                                                  \
            cuGetErrorName(r_, &n_);                                                               \
            fprintf(stderr, "stray: %s failed: %s\n", #x, n_);                                     \
            return 3;                                                                              \
        }                                                                                          \
    } while (0)

static int expect(const unsigned char *p, size_t n, unsigned char v, const char *what) {
    for (size_t i = 0; i < n; i++) {
        if (p[i] != v) {
            fprintf(stderr, "stray: %s: byte %zu is %#x, expected %#x\n", what, i, p[i], v);
            return 1;
        }
    }
    return 0;
}

int main(void) {
    static unsigned char host[CHUNK];
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUfunction fw, fc;
    if (fakecuda_register_kernels(kernels, sizeof kernels / sizeof kernels[0]) != 0)
        return 2;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuModuleLoadData(&mod, FAKECUDA_IMAGE_PREFIX "stray"));
    CHECK(cuModuleGetFunction(&fw, mod, "write_indirect"));
    CHECK(cuModuleGetFunction(&fc, mod, "copy_indirect"));

    CUdeviceptr a, t, d, other[4];
    CHECK(cuMemAlloc(&a, CHUNK));
    CHECK(cuMemAlloc(&t, 256));
    CHECK(cuMemsetD8(a, 0x5a, CHUNK));
    CHECK(cuMemcpyHtoD(t, &a, sizeof a));
    for (int i = 0; i < 4; i++) {
        CHECK(cuMemAlloc(&other[i], CHUNK));
        CHECK(cuMemsetD8(other[i], (unsigned char)i, CHUNK));
    }
    CHECK(cuMemAlloc(&d, CHUNK));
    CHECK(cuMemsetD8(d, 0, CHUNK));

    unsigned value = 0x33;
    size_t half = CHUNK / 2, whole = CHUNK;
    void *wargs[] = {&t, &value, &half};
    CHECK(cuLaunchKernel(fw, 1, 1, 1, 1, 1, 1, 0, NULL, wargs, NULL));
    void *cargs[] = {&t, &d, &whole};
    CHECK(cuLaunchKernel(fc, 1, 1, 1, 1, 1, 1, 0, NULL, cargs, NULL));
    CHECK(cuMemcpyDtoH(host, d, CHUNK));
    if (expect(host, half, 0x33, "D's first half") || expect(host + half, half, 0x5a, "D's rest"))
        return 1;
    CHECK(cuMemcpyDtoH(host, a, CHUNK));
    if (expect(host, half, 0x33, "A's first half") || expect(host + half, half, 0x5a, "A's rest"))
        return 1;
    for (int i = 0; i < 4; i++) {
        CHECK(cuMemcpyDtoH(host, other[i], CHUNK));
        if (expect(host, CHUNK, (unsigned char)i, "another buffer"))
            return 1;
    }
    CHECK(cuMemFree(a));
    CHECK(cuMemFree(t));
    CHECK(cuMemFree(d));
    for (int i = 0; i < 4; i++)
        CHECK(cuMemFree(other[i]));
    CHECK(cuModuleUnload(mod));
    printf("stray: ok\n");
    return 0;
}
