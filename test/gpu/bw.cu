/* SPDX-License-Identifier: MIT */
/* bw.cu: the host<->device link's bandwidth each way and both ways at once, from pinned host
 * memory (scripts/gpu-first-contact, probe bandwidth). Without the shim.
 *
 * Copies --mib MiB (default 256) host to device on one stream, device to host on another, each
 * alone and then both at once, REPS times each, timed with events (both-at-once: from an event
 * before both to one after both). Prints
 *   bandwidth: h2d A d2h B both-h2d C both-d2h D both-total E (GB/s, 1e9 bytes, medians)
 * Exit 0, 3 on a CUDA error, 77 without a device, 2 on a usage error. */
#include <cuda_runtime.h>
#include <stdlib.h>
#include <string.h>

#include "gk.h"

static const char *const prog = "bw";

enum { REPS = 9 };

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

static float median(float *v) {
    qsort(v, REPS, sizeof *v, cmp_float);
    return v[REPS / 2];
}

int main(int argc, char **argv) {
    long mib = 256;
    if (argc == 3 && strcmp(argv[1], "--mib") == 0) {
        mib = atol(argv[2]);
    } else if (argc != 1) {
        fprintf(stderr, "usage: %s [--mib M]\n", argv[0]);
        return 2;
    }
    if (mib < 1 || mib > 4096) {
        fprintf(stderr, "%s: --mib 1..4096\n", prog);
        return 2;
    }
    if (gk_no_device(prog))
        return GK_SKIP;
    const size_t bytes = (size_t)mib << 20;
    void *h_up, *h_down, *d_up, *d_down;
    CK(cudaMallocHost(&h_up, bytes));
    CK(cudaMallocHost(&h_down, bytes));
    CK(cudaMalloc(&d_up, bytes));
    CK(cudaMalloc(&d_down, bytes));
    memset(h_up, 0x3c, bytes);
    CK(cudaMemset(d_down, 0x5a, bytes));
    cudaStream_t s_up, s_down;
    CK(cudaStreamCreateWithFlags(&s_up, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&s_down, cudaStreamNonBlocking));
    cudaEvent_t a0, a1, b0, b1;
    CK(cudaEventCreate(&a0));
    CK(cudaEventCreate(&a1));
    CK(cudaEventCreate(&b0));
    CK(cudaEventCreate(&b1));
    /* warm-up: one copy each way */
    CK(cudaMemcpyAsync(d_up, h_up, bytes, cudaMemcpyHostToDevice, s_up));
    CK(cudaMemcpyAsync(h_down, d_down, bytes, cudaMemcpyDeviceToHost, s_down));
    CK(cudaDeviceSynchronize());
    float up[REPS], down[REPS], bu[REPS], bd[REPS], both[REPS];
    for (int r = 0; r < REPS; r++) {
        float ms;
        CK(cudaEventRecord(a0, s_up));
        CK(cudaMemcpyAsync(d_up, h_up, bytes, cudaMemcpyHostToDevice, s_up));
        CK(cudaEventRecord(a1, s_up));
        CK(cudaEventSynchronize(a1));
        CK(cudaEventElapsedTime(&ms, a0, a1));
        up[r] = (float)(bytes / (ms * 1e6));
        CK(cudaEventRecord(b0, s_down));
        CK(cudaMemcpyAsync(h_down, d_down, bytes, cudaMemcpyDeviceToHost, s_down));
        CK(cudaEventRecord(b1, s_down));
        CK(cudaEventSynchronize(b1));
        CK(cudaEventElapsedTime(&ms, b0, b1));
        down[r] = (float)(bytes / (ms * 1e6));
    }
    cudaEvent_t start, end;
    CK(cudaEventCreate(&start));
    CK(cudaEventCreate(&end));
    for (int r = 0; r < REPS; r++) {
        float ms, mu, md;
        CK(cudaEventRecord(start, s_up));
        CK(cudaStreamWaitEvent(s_down, start, 0));
        CK(cudaEventRecord(a0, s_up));
        CK(cudaEventRecord(b0, s_down));
        CK(cudaMemcpyAsync(d_up, h_up, bytes, cudaMemcpyHostToDevice, s_up));
        CK(cudaMemcpyAsync(h_down, d_down, bytes, cudaMemcpyDeviceToHost, s_down));
        CK(cudaEventRecord(a1, s_up));
        CK(cudaEventRecord(b1, s_down));
        CK(cudaStreamWaitEvent(s_up, b1, 0));
        CK(cudaEventRecord(end, s_up));
        CK(cudaEventSynchronize(end));
        CK(cudaEventElapsedTime(&ms, start, end));
        CK(cudaEventElapsedTime(&mu, a0, a1));
        CK(cudaEventElapsedTime(&md, b0, b1));
        bu[r] = (float)(bytes / (mu * 1e6));
        bd[r] = (float)(bytes / (md * 1e6));
        both[r] = (float)(2 * bytes / (ms * 1e6));
    }
    printf("bandwidth: h2d %.2f d2h %.2f both-h2d %.2f both-d2h %.2f both-total %.2f (GB/s, %ld "
           "MiB copies, medians of %d)\n",
           median(up), median(down), median(bu), median(bd), median(both), mib, REPS);
    CK(cudaFreeHost(h_up));
    CK(cudaFreeHost(h_down));
    CK(cudaFree(d_up));
    CK(cudaFree(d_down));
    return 0;
}
