/* SPDX-License-Identifier: MIT */
/* kernels_ooc.c: the shim's own kernel on the simulated device (module "ooc_checksum"), and the
 * kernels of module "rctest" that the recompute tests launch.
 *
 * ooc_checksum64 is shim/checksum.cu written in C: the same name, parameters and result, so that
 * the shim's recompute verification runs here exactly as on a GPU. The rctest kernels are
 * producers the verification must refuse: one whose output differs at every launch (as a kernel
 * that orders floating-point atomics differently would), and one that reads its own output. */
#include "fc_ktab.h"

#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

static uint64_t mix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* ooc_checksum64(p, n, out): *out += sum over the 8-byte words w_i of [p, p + n) (the last one
 * zero-padded) of mix64(w_i ^ i * 0x9e3779b97f4a7c15), modulo 2^64. */
static int k_checksum(fakecuda_launch_t *l) {
    CUdeviceptr p = FAKECUDA_ARG(l, 0, CUdeviceptr);
    uint64_t n = FAKECUDA_ARG(l, 1, uint64_t);
    CUdeviceptr outp = FAKECUDA_ARG(l, 2, CUdeviceptr);
    uint64_t *out = fakecuda_access(l, outp, sizeof *out, 1);
    const unsigned char *b = n ? fakecuda_access(l, p, (size_t)n, 0) : NULL;
    if (!out || (n && !b))
        return -1;
    uint64_t acc = 0;
    for (uint64_t i = 0; 8 * i < n; i++) {
        uint64_t w = 0;
        if (8 * i + 8 <= n) {
            memcpy(&w, b + 8 * i, 8);
        } else {
            for (unsigned k = 0; 8 * i + k < n; k++)
                w |= (uint64_t)b[8 * i + k] << (8 * k);
        }
        acc += mix64(w ^ (i * 0x9e3779b97f4a7c15ull));
    }
    uint64_t prev;
    memcpy(&prev, out, sizeof prev);
    prev += acc;
    memcpy(out, &prev, sizeof prev);
    fakecuda_work(l, (double)n, (double)n);
    return 0;
}

/* noisy_fill_f32(y, n): y[i] = i + k, k a counter that advances at every launch. */
static int k_noisy_fill(fakecuda_launch_t *l) {
    static _Atomic uint32_t launches;
    CUdeviceptr yp = FAKECUDA_ARG(l, 0, CUdeviceptr);
    uint64_t n = FAKECUDA_ARG(l, 1, uint64_t);
    float *y = n ? fakecuda_access(l, yp, (size_t)n * sizeof(float), 1) : NULL;
    if (n && !y)
        return -1;
    uint32_t k = atomic_fetch_add(&launches, 1);
    for (uint64_t i = 0; i < n; i++)
        y[i] = (float)(i % 1024) + (float)(k % 1024);
    fakecuda_work(l, 0, 4.0 * (double)n);
    return 0;
}

/* accumulate_f32(x, y, n): y += x (reads its output). */
static int k_accumulate(fakecuda_launch_t *l) {
    CUdeviceptr xp = FAKECUDA_ARG(l, 0, CUdeviceptr), yp = FAKECUDA_ARG(l, 1, CUdeviceptr);
    uint64_t n = FAKECUDA_ARG(l, 2, uint64_t);
    if (n == 0)
        return 0;
    const float *x = fakecuda_access(l, xp, (size_t)n * sizeof(float), 0);
    float *y = fakecuda_access(l, yp, (size_t)n * sizeof(float), 1);
    if (!x || !y)
        return -1;
    for (uint64_t i = 0; i < n; i++)
        y[i] += x[i];
    fakecuda_work(l, (double)n, 12.0 * (double)n);
    return 0;
}

/* copy_f32(x, y, n): y = x (a deterministic producer). */
static int k_copy(fakecuda_launch_t *l) {
    CUdeviceptr xp = FAKECUDA_ARG(l, 0, CUdeviceptr), yp = FAKECUDA_ARG(l, 1, CUdeviceptr);
    uint64_t n = FAKECUDA_ARG(l, 2, uint64_t);
    if (n == 0)
        return 0;
    const float *x = fakecuda_access(l, xp, (size_t)n * sizeof(float), 0);
    float *y = fakecuda_access(l, yp, (size_t)n * sizeof(float), 1);
    if (!x || !y)
        return -1;
    memcpy(y, x, (size_t)n * sizeof(float));
    fakecuda_work(l, 0, 8.0 * (double)n);
    return 0;
}

#define P_PTR sizeof(CUdeviceptr)
#define P_U64 sizeof(uint64_t)

static const fakecuda_kernel_t ooc_kernels[] = {
    {"ooc_checksum", "ooc_checksum64", 3, {P_PTR, P_U64, P_PTR}, k_checksum},
    {"rctest", "noisy_fill_f32", 2, {P_PTR, P_U64}, k_noisy_fill},
    {"rctest", "accumulate_f32", 3, {P_PTR, P_PTR, P_U64}, k_accumulate},
    {"rctest", "copy_f32", 3, {P_PTR, P_PTR, P_U64}, k_copy},
    /* copy_hint_f32(x, y, n, hint): y = x; `hint` is never read (a pointer parameter a kernel
     * does not always use, as cuDNN's are). */
    {"rctest", "copy_hint_f32", 4, {P_PTR, P_PTR, P_U64, P_PTR}, k_copy},
};
FC_KERNEL_TABLE(ooc_kernels);
