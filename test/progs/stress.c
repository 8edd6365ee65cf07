/* SPDX-License-Identifier: MIT */
/* stress.c: several threads, each with its own stream, launch kernels, copies and sets on shared
 * and private buffers while a churn thread allocates, fills, checks and frees buffers of its own
 * that do not fit the budget with the others; every byte is checked against a host model.
 *
 * Under the shim with a budget below the footprint, ops on the fast path (no lock) run beside
 * evictions, frees and swap-ins on the locked path: this is the fast path's race test. Run it
 * with FAKECUDA_SCHED=threaded, FAKECUDA_JITTER_US and strict mode (the simulated driver's
 * default), with safe mode on and off.
 *
 * Buffers (chunk = 64 KiB, run with FAKECUDA_GRANULARITY=64K and OOC_CHUNK=64K): IN, shared
 * input of 2 chunks, written once by the main thread and then only read; OUT, a shared output
 * of 3 chunks of which worker t owns slice t (its kernels get a pointer into the middle of the
 * buffer); per worker, PRIV private buffers of random sizes (small ones share slab chunks, large
 * ones span up to 3 chunks), reallocated at random. Worker 0 issues on the per-thread default
 * stream, the others on streams of their own. Kernels compute in 32-bit integers, so the model
 * is exact: mix(dst, src, k, n): dst[i] = dst[i] * 3 + src[i] + k; fill(dst, v, n):
 * dst[i] = v + i * 7.
 *
 * Options: --threads T (workers, default 4), --iters N (ops per worker, default 400), --seed S.
 * Output: "stress: ok", "checksum: H" (FNV-1a 64 of every worker's final buffers and OUT, which
 * depends on the seed only). Exit status: 0 when every byte is right; 1 when one is wrong (named
 * on stderr); 2 when a driver call failed ("error: <call>: <name> (<code>)"); 64 on a bad
 * option. Linked with -lcuda (the simulated driver, whose fakecuda.h gives the kernels). */
#include <cuda.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fakecuda.h"

#define CHUNK      ((size_t)64 << 10)
#define PRIV       6
#define MAX_T      8
#define IN_BYTES   (2 * CHUNK)
#define OUT_BYTES  (3 * CHUNK)
#define CHURN_LIVE 5

/* mix(uint32_t *dst, const uint32_t *src, uint32_t k, int n) */
static int k_mix(fakecuda_launch_t *l) {
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

/* fill(uint32_t *dst, uint32_t v, int n) */
static int k_fill(fakecuda_launch_t *l) {
    CUdeviceptr dd = FAKECUDA_ARG(l, 0, CUdeviceptr);
    uint32_t v = FAKECUDA_ARG(l, 1, uint32_t);
    int n = FAKECUDA_ARG(l, 2, int);
    uint32_t *dst = fakecuda_access(l, dd, (size_t)n * 4, 1);
    if (!dst)
        return -1;
    for (int i = 0; i < n; i++)
        dst[i] = v + (uint32_t)i * 7u;
    return 0;
}

static const fakecuda_kernel_t kernels[] = {
    {"stressprog", "mix", 4, {8, 8, 4, 4}, k_mix},
    {"stressprog", "fill", 3, {8, 4, 4}, k_fill},
};

static void die(const char *call, CUresult r) {
    const char *name = "?";
    cuGetErrorName(r, &name);
    fprintf(stderr, "error: %s: %s (%d)\n", call, name, (int)r);
    exit(2);
}

#define CHECK(x)                                                                                   \
    do {                                                                                           \
        CUresult r_ = (x);                                                                         \
        if (r_ != CUDA_SUCCESS)                                                                    \
            die(#x, r_);                                                                           \
    } while (0)

static CUcontext ctx;
static CUfunction f_mix, f_fill;
static CUdeviceptr in_d, out_d;
static uint32_t in_h[IN_BYTES / 4];
static int nthreads = 4, iters = 400;
static uint64_t seed = 1;
static pthread_mutex_t say_lock = PTHREAD_MUTEX_INITIALIZER;

/* A device buffer and its model. */
typedef struct dbuf {
    CUdeviceptr d;
    size_t n; /* 32-bit words */
    uint32_t *m;
} dbuf_t;

typedef struct worker {
    int id;
    CUstream s;
    uint64_t rng;
    dbuf_t priv[PRIV];
    uint32_t *slice_m; /* model of this worker's slice of OUT */
    size_t slice_n;
    uint32_t *tmp; /* host staging */
    int bad;
    uint64_t ops;
} worker_t;

static uint64_t next_rand(uint64_t *s) {
    uint64_t x = *s += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static size_t pick(uint64_t *s, size_t n) {
    return (size_t)(next_rand(s) % n);
}

static void mix(CUdeviceptr dst, CUdeviceptr src, uint32_t k, size_t n, CUstream s) {
    int ni = (int)n;
    void *args[] = {&dst, &src, &k, &ni};
    CHECK(cuLaunchKernel(f_mix, 1, 1, 1, 32, 1, 1, 0, s, args, NULL));
}

static void fill(CUdeviceptr dst, uint32_t v, size_t n, CUstream s) {
    int ni = (int)n;
    void *args[] = {&dst, &v, &ni};
    CHECK(cuLaunchKernel(f_fill, 1, 1, 1, 32, 1, 1, 0, s, args, NULL));
}

static void model_mix(uint32_t *dst, const uint32_t *src, uint32_t k, size_t n) {
    for (size_t i = 0; i < n; i++)
        dst[i] = dst[i] * 3u + src[i] + k;
}

static void model_fill(uint32_t *dst, uint32_t v, size_t n) {
    for (size_t i = 0; i < n; i++)
        dst[i] = v + (uint32_t)i * 7u;
}

/* A size for a private buffer: a small one (a slab chunk's), one of about a chunk, or up to
 * three chunks. */
static size_t rand_words(uint64_t *s) {
    switch (pick(s, 3)) {
    case 0:
        return 64 + pick(s, 1024);
    case 1:
        return CHUNK / 4 - pick(s, 512);
    default:
        return CHUNK / 4 + pick(s, 2 * CHUNK / 4);
    }
}

static void buf_alloc(dbuf_t *b, size_t n, uint32_t v, CUstream s) {
    CHECK(cuMemAlloc(&b->d, n * 4));
    b->n = n;
    b->m = malloc(n * 4);
    if (!b->m) {
        fprintf(stderr, "stress: out of host memory\n");
        exit(2);
    }
    fill(b->d, v, n, s);
    model_fill(b->m, v, n);
}

static void buf_free(dbuf_t *b, CUstream s) {
    CHECK(cuMemFreeAsync(b->d, s));
    free(b->m);
    b->m = NULL;
}

/* Compares the device bytes at d with the model (after the stream's work). */
static int check(worker_t *w, CUdeviceptr d, const uint32_t *m, size_t n, const char *what,
                 int async) {
    if (async) {
        CHECK(cuMemcpyDtoHAsync(w->tmp, d, n * 4, w->s));
        CHECK(cuStreamSynchronize(w->s));
    } else {
        CHECK(cuStreamSynchronize(w->s));
        CHECK(cuMemcpyDtoH(w->tmp, d, n * 4));
    }
    if (memcmp(w->tmp, m, n * 4) == 0)
        return 1;
    for (size_t i = 0; i < n; i++) {
        if (w->tmp[i] != m[i]) {
            pthread_mutex_lock(&say_lock);
            fprintf(stderr, "stress: worker %d: %s: word %zu of %zu is %08x, expected %08x\n",
                    w->id, what, i, n, w->tmp[i], m[i]);
            pthread_mutex_unlock(&say_lock);
            break;
        }
    }
    w->bad = 1;
    return 0;
}

static void *worker_main(void *arg) {
    worker_t *w = arg;
    CHECK(cuCtxSetCurrent(ctx));
    if (w->id == 0)
        w->s = CU_STREAM_PER_THREAD;
    else
        CHECK(cuStreamCreate(&w->s, CU_STREAM_NON_BLOCKING));
    for (int i = 0; i < PRIV; i++)
        buf_alloc(&w->priv[i], rand_words(&w->rng), (uint32_t)(w->id * 1000 + i), w->s);
    CUdeviceptr slice = out_d + (CUdeviceptr)(w->id * w->slice_n * 4);
    for (int it = 0; it < iters && !w->bad; it++, w->ops++) {
        dbuf_t *a = &w->priv[pick(&w->rng, PRIV)], *b = &w->priv[pick(&w->rng, PRIV)];
        uint32_t k = (uint32_t)next_rand(&w->rng);
        switch (pick(&w->rng, 10)) {
        case 0:
        case 1:
        case 2: { /* private from private */
            if (a == b)
                break;
            size_t n = a->n < b->n ? a->n : b->n;
            mix(a->d, b->d, k, n, w->s);
            model_mix(a->m, b->m, k, n);
            break;
        }
        case 3:
        case 4: { /* private from the shared input */
            size_t n = a->n < IN_BYTES / 4 ? a->n : IN_BYTES / 4;
            mix(a->d, in_d, k, n, w->s);
            model_mix(a->m, in_h, k, n);
            break;
        }
        case 5: { /* this worker's slice of the shared output, from a private buffer */
            size_t n = a->n < w->slice_n ? a->n : w->slice_n;
            mix(slice, a->d, k, n, w->s);
            model_mix(w->slice_m, a->m, k, n);
            break;
        }
        case 6: { /* set and copy */
            size_t n = 1 + pick(&w->rng, a->n);
            CHECK(cuMemsetD32Async(a->d, k, n, w->s));
            for (size_t i = 0; i < n; i++)
                a->m[i] = k;
            if (a != b) {
                size_t c = a->n < b->n ? a->n : b->n;
                CHECK(cuMemcpyDtoDAsync(b->d, a->d, c * 4, w->s));
                memcpy(b->m, a->m, c * 4);
            }
            break;
        }
        case 7: /* reallocate */
            buf_free(a, w->s);
            buf_alloc(a, rand_words(&w->rng), k, w->s);
            break;
        case 8:
            check(w, a->d, a->m, a->n, "private buffer", (int)(k & 1));
            break;
        default:
            check(w, slice, w->slice_m, w->slice_n, "slice of OUT", (int)(k & 1));
            break;
        }
    }
    for (int i = 0; i < PRIV && !w->bad; i++)
        check(w, w->priv[i].d, w->priv[i].m, w->priv[i].n, "private buffer at the end", 1);
    CHECK(cuStreamSynchronize(w->s));
    return NULL;
}

/* Allocates, fills, checks and frees buffers of up to four chunks, CHURN_LIVE at a time: with
 * the workers' buffers they exceed the budget, so chunks are evicted under the workers' ops. */
static void *churn_main(void *arg) {
    worker_t *w = arg;
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuStreamCreate(&w->s, CU_STREAM_NON_BLOCKING));
    dbuf_t live[CHURN_LIVE];
    memset(live, 0, sizeof live);
    for (int it = 0; it < iters && !w->bad; it++, w->ops++) {
        dbuf_t *b = &live[pick(&w->rng, CHURN_LIVE)];
        uint32_t k = (uint32_t)next_rand(&w->rng);
        if (!b->m) {
            buf_alloc(b, CHUNK / 4 * (1 + pick(&w->rng, 4)) - pick(&w->rng, 100), k, w->s);
        } else if (k % 3 == 0) {
            check(w, b->d, b->m, b->n, "churn buffer", (int)(k & 4));
            buf_free(b, w->s);
        } else {
            size_t n = b->n < IN_BYTES / 4 ? b->n : IN_BYTES / 4;
            mix(b->d, in_d, k, n, w->s);
            model_mix(b->m, in_h, k, n);
        }
    }
    for (int i = 0; i < CHURN_LIVE; i++)
        if (live[i].m)
            buf_free(&live[i], w->s);
    CHECK(cuStreamSynchronize(w->s));
    CHECK(cuStreamDestroy(w->s));
    return NULL;
}

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc)
            nthreads = atoi(argv[++i]);
        else if (strcmp(argv[i], "--iters") == 0 && i + 1 < argc)
            iters = atoi(argv[++i]);
        else if (strcmp(argv[i], "--seed") == 0 && i + 1 < argc)
            seed = strtoull(argv[++i], NULL, 10);
        else {
            fprintf(stderr, "usage: stress [--threads T] [--iters N] [--seed S]\n");
            return 64;
        }
    }
    if (nthreads < 1 || nthreads > MAX_T || iters < 1) {
        fprintf(stderr, "stress: bad option value\n");
        return 64;
    }
    if (fakecuda_register_kernels(kernels, sizeof kernels / sizeof kernels[0]) != 0)
        return 2;
    CUdevice dev;
    CUmodule mod;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuModuleLoadData(&mod, FAKECUDA_IMAGE_PREFIX "stressprog"));
    CHECK(cuModuleGetFunction(&f_mix, mod, "mix"));
    CHECK(cuModuleGetFunction(&f_fill, mod, "fill"));

    CHECK(cuMemAlloc(&in_d, IN_BYTES));
    CHECK(cuMemAlloc(&out_d, OUT_BYTES));
    uint64_t r = seed;
    for (size_t i = 0; i < IN_BYTES / 4; i++)
        in_h[i] = (uint32_t)next_rand(&r);
    CHECK(cuMemcpyHtoD(in_d, in_h, IN_BYTES));
    CHECK(cuMemsetD32(out_d, 0, OUT_BYTES / 4));
    CHECK(cuCtxSynchronize());

    worker_t w[MAX_T + 1];
    pthread_t th[MAX_T + 1];
    memset(w, 0, sizeof w);
    size_t slice_n = OUT_BYTES / 4 / (size_t)nthreads;
    for (int t = 0; t <= nthreads; t++) {
        w[t].id = t;
        w[t].rng = seed * 1000003u + (uint64_t)t;
        w[t].slice_n = slice_n;
        w[t].slice_m = calloc(slice_n, 4);
        w[t].tmp = malloc(4 * CHUNK);
        if (!w[t].slice_m || !w[t].tmp)
            return 2;
    }
    for (int t = 0; t <= nthreads; t++)
        if (pthread_create(&th[t], NULL, t < nthreads ? worker_main : churn_main, &w[t]) != 0)
            return 2;
    int bad = 0;
    uint64_t ops = 0;
    for (int t = 0; t <= nthreads; t++) {
        pthread_join(th[t], NULL);
        bad |= w[t].bad;
        ops += w[t].ops;
    }
    CHECK(cuCtxSynchronize());
    /* The shared buffers: IN unchanged, OUT's slices as their workers' models say. */
    uint64_t sum = 1469598103934665603ull;
    uint32_t *host = malloc(OUT_BYTES > IN_BYTES ? OUT_BYTES : IN_BYTES);
    if (!host)
        return 2;
    CHECK(cuMemcpyDtoH(host, in_d, IN_BYTES));
    if (memcmp(host, in_h, IN_BYTES) != 0) {
        fprintf(stderr, "stress: the shared input changed\n");
        bad = 1;
    }
    CHECK(cuMemcpyDtoH(host, out_d, OUT_BYTES));
    for (int t = 0; t < nthreads; t++) {
        if (memcmp(host + (size_t)t * slice_n, w[t].slice_m, slice_n * 4) != 0) {
            fprintf(stderr, "stress: worker %d's slice of the shared output is wrong\n", t);
            bad = 1;
        }
        sum = fnv(sum, w[t].slice_m, slice_n * 4);
    }
    for (int t = 0; t < nthreads; t++) {
        for (int i = 0; i < PRIV; i++) {
            if (w[t].priv[i].m) {
                sum = fnv(sum, w[t].priv[i].m, w[t].priv[i].n * 4);
                buf_free(&w[t].priv[i], NULL);
            }
        }
        if (t > 0)
            CHECK(cuStreamDestroy(w[t].s));
    }
    for (int t = 0; t <= nthreads; t++) {
        free(w[t].slice_m);
        free(w[t].tmp);
    }
    free(host);
    CHECK(cuMemFree(in_d));
    CHECK(cuMemFree(out_d));
    CHECK(cuCtxSynchronize());
    CHECK(cuModuleUnload(mod));
    CHECK(cuDevicePrimaryCtxRelease(dev));
    if (bad)
        return 1;
    printf("stress: ok\nops: %llu\nchecksum: %016llx\n", (unsigned long long)ops,
           (unsigned long long)sum);
    return 0;
}
