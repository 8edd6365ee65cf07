/* SPDX-License-Identifier: MIT */
/* kernels.cuh: the kernels of the GPU checks (test/gpu). extern "C", so that the PTX built from
 * kernels.cu names them plainly for the driver-API programs (cuModuleGetFunction), and the
 * runtime programs include this file and launch them with <<<>>>. All integer; see gk.h. */
#ifndef KERNELS_CUH
#define KERNELS_CUH

#include "gk.h"

#define GK_FOR(i, n)                                                                               \
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;         \
         i < (n); i += (unsigned long long)gridDim.x * blockDim.x)

/* p[i] = gk_word(i, seed). */
extern "C" __global__ void gk_fill(uint32_t *p, unsigned long long n, uint32_t seed) {
    GK_FOR(i, n) p[i] = gk_word(i, seed);
}

/* *out += sum of gk_term(i, p[i]) (an integer sum: the order does not matter). */
extern "C" __global__ void gk_sum(const uint32_t *p, unsigned long long n,
                                  unsigned long long *out) {
    unsigned long long s = 0;
    GK_FOR(i, n) s += gk_term(i, p[i]);
    atomicAdd(out, s);
}

/* gk_sum of the buffer whose address is table[k]: the kernel's parameters do not name it. */
extern "C" __global__ void gk_sum_indirect(uint32_t *const *table, int k, unsigned long long n,
                                           unsigned long long *out) {
    const uint32_t *p = table[k];
    unsigned long long s = 0;
    GK_FOR(i, n) s += gk_term(i, p[i]);
    atomicAdd(out, s);
}

/* gk_fill of the buffer whose address is table[k]. */
extern "C" __global__ void gk_fill_indirect(uint32_t *const *table, int k, unsigned long long n,
                                            uint32_t seed) {
    uint32_t *p = table[k];
    GK_FOR(i, n) p[i] = gk_word(i, seed);
}

/* A "layer": out[i] = mix(in[i] + w[i] * golden) ^ in[(7i + 3) mod n]. */
extern "C" __global__ void gk_layer(const uint32_t *in, const uint32_t *w, uint32_t *out,
                                    unsigned long long n) {
    GK_FOR(i, n) out[i] = gk_mix(in[i] + w[i] * 0x9e3779b9U) ^ in[(7 * i + 3) % n];
}

/* Its "backward": gprev[i] = mix(g[i] ^ act[i]). */
extern "C" __global__ void gk_back(const uint32_t *g, const uint32_t *act, uint32_t *gprev,
                                   unsigned long long n) {
    GK_FOR(i, n) gprev[i] = gk_mix(g[i] ^ act[i]);
}

/* The "optimizer step": w[i] += mix(g[i]). */
extern "C" __global__ void gk_update(uint32_t *w, const uint32_t *g, unsigned long long n) {
    GK_FOR(i, n) w[i] += gk_mix(g[i]);
}

#endif
