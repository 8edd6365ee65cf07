/* SPDX-License-Identifier: MIT */
/* gk.h: what the GPU checks (test/gpu) share: the bit-mixing function their kernels and their
 * host references both use, the expected checksum of a filled buffer, and the PASS/FAIL/SKIP
 * lines that scripts/check-gpu reads.
 *
 * Every kernel here works on 32-bit words with integer arithmetic, and every reduction is an
 * integer sum (order-independent), so a result is bit-exact whatever the launch shape, the
 * scheduling, or the shim's swapping: a mismatch is a real corruption, never rounding. These
 * programs need a real GPU; without one they print a SKIP line and exit 77. */
#ifndef GK_H
#define GK_H

#include <stdint.h>
#include <stdio.h>

#ifdef __CUDACC__
#define GK_HD __host__ __device__
#else
#define GK_HD
#endif

/* The exit status of a program that found no CUDA device (automake's "skipped"). */
#define GK_SKIP 77

#ifdef __CUDACC__
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

/* CK (a runtime call) and CKD (a driver call): on an error, "ERROR <prog>: <call>: <name>" and
 * exit status 3. The calling file defines `prog`. */
#define CK(call)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            printf("ERROR %s: %s: %s\n", prog, #call, cudaGetErrorName(e_));                       \
            exit(3);                                                                               \
        }                                                                                          \
    } while (0)
#define CKD(call)                                                                                  \
    do {                                                                                           \
        CUresult r_ = (call);                                                                      \
        if (r_ != CUDA_SUCCESS) {                                                                  \
            const char *n_ = "?";                                                                  \
            cuGetErrorName(r_, &n_);                                                               \
            printf("ERROR %s: %s: %s\n", prog, #call, n_);                                         \
            exit(3);                                                                               \
        }                                                                                          \
    } while (0)

/* CLOCK_MONOTONIC in microseconds. */
static inline double gk_now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static inline int gk_cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median of v[0..n) (sorts v). */
static inline double gk_median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, gk_cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* Says "SKIP <prog>: no CUDA device (<why>)" and returns 1 when the runtime finds no device (the
 * program then exits GK_SKIP); returns 0 when there is one. */
static inline int gk_no_device(const char *prog) {
    int ndev = 0;
    cudaError_t e = cudaGetDeviceCount(&ndev);
    if (e == cudaSuccess && ndev > 0)
        return 0;
    printf("SKIP %s: no CUDA device (%s)\n", prog,
           e != cudaSuccess ? cudaGetErrorName(e) : "count 0");
    return 1;
}
#endif

/* lowbias32: a bijective 32-bit mix. */
static GK_HD inline uint32_t gk_mix(uint32_t x) {
    x ^= x >> 16;
    x *= 0x7feb352dU;
    x ^= x >> 15;
    x *= 0x846ca68bU;
    x ^= x >> 16;
    return x;
}

/* The word gk_fill writes at index i for a seed. */
static GK_HD inline uint32_t gk_word(uint64_t i, uint32_t seed) {
    return gk_mix((uint32_t)i * 0x9e3779b9U ^ seed);
}

/* One word's contribution to gk_sum: position-dependent, so swapped words show. */
static GK_HD inline uint64_t gk_term(uint64_t i, uint32_t w) {
    return (uint64_t)gk_mix(w + (uint32_t)i) * ((uint32_t)i | 1U);
}

/* The gk_sum of n words filled by gk_fill with a seed, computed on the host. */
static inline uint64_t gk_expected_sum(uint64_t n, uint32_t seed) {
    uint64_t s = 0;
    for (uint64_t i = 0; i < n; i++)
        s += gk_term(i, gk_word(i, seed));
    return s;
}

static int gk_failures;

/* One result line: "PASS prog: what" or "FAIL prog: what (detail)". Returns ok. */
static inline int gk_report(const char *prog, int ok, const char *what, const char *detail) {
    if (ok) {
        printf("PASS %s: %s\n", prog, what);
    } else {
        printf("FAIL %s: %s%s%s%s\n", prog, what, detail ? " (" : "", detail ? detail : "",
               detail ? ")" : "");
        gk_failures++;
    }
    fflush(stdout);
    return ok;
}

#endif
