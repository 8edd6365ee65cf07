/* SPDX-License-Identifier: MIT */
/* demand.cu: a training-shaped program on a real GPU whose result is bit-exact, for the shim's
 * demand and auto modes at a budget below its footprint. Per iteration: an input batch copied
 * from pinned host memory, a forward chain of --layers "layers" (each allocating its activation
 * with cudaMalloc), a backward chain (gradients with cudaMallocAsync/cudaFreeAsync), each
 * layer's "optimizer step" on its persistent weights, activations freed after their last use;
 * all on one non-blocking stream. Integer kernels (kernels.cuh), so the checksum of the weights
 * at the end must be the same bit for bit with and without the shim, at any budget.
 *
 * Prints "iter I" per iteration, "time: per-iteration ms: ..." (host clock around each
 * iteration, stream synchronised), "peak_device_bytes: N" (its own live allocations) and
 * "checksum: H" (16 hex digits). --mark calls ooc_mark_iteration() after each iteration when the
 * shim is loaded. Exit 0, 3 on a CUDA error, 77 without a device, 2 on a usage error. */
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels.cuh"

static const char *const prog = "demand";

static size_t live, peak;

static void count(long long delta) {
    live += delta;
    if (live > peak)
        peak = live;
}

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

int main(int argc, char **argv) {
    int layers = 12, iters = 8, mark = 0;
    long mib = 32;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--layers") == 0 && i + 1 < argc)
            layers = atoi(argv[++i]);
        else if (strcmp(argv[i], "--mib") == 0 && i + 1 < argc)
            mib = atol(argv[++i]);
        else if (strcmp(argv[i], "--iters") == 0 && i + 1 < argc)
            iters = atoi(argv[++i]);
        else if (strcmp(argv[i], "--mark") == 0)
            mark = 1;
        else {
            fprintf(stderr, "usage: %s [--layers L] [--mib M] [--iters N] [--mark]\n", argv[0]);
            return 2;
        }
    }
    if (layers < 1 || layers > 256 || mib < 1 || mib > 4096 || iters < 1) {
        fprintf(stderr, "%s: --layers 1..256, --mib 1..4096, --iters >= 1\n", prog);
        return 2;
    }
    if (gk_no_device(prog))
        return GK_SKIP;
    void (*mark_fn)(void) = NULL;
    if (mark)
        *(void **)&mark_fn = dlsym(RTLD_DEFAULT, "ooc_mark_iteration");
    const size_t bytes = (size_t)mib << 20;
    const unsigned long long n = bytes / sizeof(uint32_t);
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    uint32_t **w = (uint32_t **)calloc(layers, sizeof *w);
    uint32_t **act = (uint32_t **)calloc(layers + 1, sizeof *act);
    uint32_t *host;
    CK(cudaMallocHost(&host, bytes));
    for (int l = 0; l < layers; l++) {
        CK(cudaMalloc(&w[l], bytes));
        count((long long)bytes);
        gk_fill<<<512, 256, 0, s>>>(w[l], n, 1000U + (uint32_t)l);
    }
    CK(cudaGetLastError());
    double *ms = (double *)calloc(iters, sizeof *ms);
    CK(cudaStreamSynchronize(s));
    for (int it = 0; it < iters; it++) {
        double t0 = now_ms();
        for (unsigned long long i = 0; i < n; i++)
            host[i] = gk_word(i, 77U + (uint32_t)it);
        CK(cudaMalloc(&act[0], bytes));
        count((long long)bytes);
        CK(cudaMemcpyAsync(act[0], host, bytes, cudaMemcpyHostToDevice, s));
        for (int l = 0; l < layers; l++) {
            CK(cudaMalloc(&act[l + 1], bytes));
            count((long long)bytes);
            gk_layer<<<512, 256, 0, s>>>(act[l], w[l], act[l + 1], n);
        }
        uint32_t *g;
        CK(cudaMallocAsync(&g, bytes, s));
        count((long long)bytes);
        gk_back<<<512, 256, 0, s>>>(act[layers], act[layers], g, n);
        CK(cudaStreamSynchronize(s));
        CK(cudaFree(act[layers]));
        count(-(long long)bytes);
        for (int l = layers - 1; l >= 0; l--) {
            uint32_t *gp;
            CK(cudaMallocAsync(&gp, bytes, s));
            count((long long)bytes);
            gk_back<<<512, 256, 0, s>>>(g, act[l], gp, n);
            gk_update<<<512, 256, 0, s>>>(w[l], g, n);
            CK(cudaFreeAsync(g, s));
            count(-(long long)bytes);
            CK(cudaStreamSynchronize(s));
            CK(cudaFree(act[l]));
            count(-(long long)bytes);
            g = gp;
        }
        CK(cudaFreeAsync(g, s));
        count(-(long long)bytes);
        CK(cudaGetLastError());
        CK(cudaStreamSynchronize(s));
        if (mark_fn)
            mark_fn();
        ms[it] = now_ms() - t0;
        printf("iter %d\n", it);
    }
    unsigned long long *d_sum, sum = 0;
    CK(cudaMalloc(&d_sum, sizeof *d_sum));
    CK(cudaMemsetAsync(d_sum, 0, sizeof *d_sum, s));
    for (int l = 0; l < layers; l++)
        gk_sum<<<256, 256, 0, s>>>(w[l], n, d_sum);
    CK(cudaGetLastError());
    CK(cudaMemcpyAsync(&sum, d_sum, sizeof sum, cudaMemcpyDeviceToHost, s));
    CK(cudaStreamSynchronize(s));
    printf("time: per-iteration ms:");
    for (int it = 0; it < iters; it++)
        printf(" %.3f", ms[it]);
    printf("\npeak_device_bytes: %zu\nchecksum: %016llx\n", peak, sum);
    for (int l = 0; l < layers; l++)
        CK(cudaFree(w[l]));
    CK(cudaFree(d_sum));
    CK(cudaFreeHost(host));
    CK(cudaStreamDestroy(s));
    free(w);
    free(act);
    free(ms);
    return 0;
}
