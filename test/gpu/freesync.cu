/* SPDX-License-Identifier: MIT */
/* freesync.cu: does a free wait for work already running on the device? (scripts/
 * gpu-first-contact, probe freesync). A kernel spins for --ms milliseconds (by the device's
 * global timer); while it runs, an unrelated buffer is freed, and the host time of the free call
 * is measured. Three frees, each behind its own spinning kernel:
 *
 *   cudaFree      a cudaMalloc'd buffer through the runtime;
 *   cuMemFree     a cuMemAlloc'd buffer through the driver (this program is linked with -lcuda);
 *   cudaFree-idle a cudaMalloc'd buffer with the device idle (the call's own cost).
 *
 * Run without the shim, the first two say whether the runtime or the driver waits. Run under the
 * shim, whose cuMemFree_v2 does not synchronise, a cudaFree that still takes the kernel's time
 * shows that the runtime synchronises before it reaches cuMemFree_v2.
 *
 * Prints "free: NAME ms T kernel-running-before yes|no" per free (whether an event recorded
 * after the kernel was still pending just before the call), and "spin: ms S" (the kernel's time
 * when nothing waits). Exit 0, 3 on a CUDA error, 77 without a device, 2 on a usage error. */
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gk.h"

static const char *const prog = "freesync";

/* Spins one thread until ns nanoseconds of the global timer have passed; writes a word. */
__global__ void spin(unsigned long long ns, unsigned *flag) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while (t - t0 < ns);
    *flag = 1;
}

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static unsigned *flag;
static cudaEvent_t after;

/* Starts the spinning kernel on the legacy stream and an event behind it. */
static void start_spin(double ms) {
    spin<<<1, 1>>>((unsigned long long)(ms * 1e6), flag);
    CK(cudaGetLastError());
    CK(cudaEventRecord(after, 0));
}

static const char *pending(void) {
    cudaError_t q = cudaEventQuery(after);
    return q == cudaErrorNotReady ? "yes" : q == cudaSuccess ? "no" : "error";
}

int main(int argc, char **argv) {
    double ms = 300;
    if (argc == 3 && strcmp(argv[1], "--ms") == 0) {
        ms = atof(argv[2]);
    } else if (argc != 1) {
        fprintf(stderr, "usage: %s [--ms MILLISECONDS]\n", argv[0]);
        return 2;
    }
    if (ms < 10 || ms > 5000) {
        fprintf(stderr, "%s: --ms 10..5000\n", prog);
        return 2;
    }
    if (gk_no_device(prog))
        return GK_SKIP;
    CK(cudaMalloc(&flag, sizeof *flag));
    CK(cudaEventCreate(&after));
    /* the kernel alone, nothing waiting but the synchronisation */
    start_spin(ms);
    double t0 = now_ms();
    CK(cudaDeviceSynchronize());
    printf("spin: ms %.1f\n", now_ms() - t0);

    void *a;
    CK(cudaMalloc(&a, 64 << 20));
    start_spin(ms);
    const char *run = pending();
    t0 = now_ms();
    CK(cudaFree(a));
    printf("free: cudaFree ms %.3f kernel-running-before %s\n", now_ms() - t0, run);
    CK(cudaDeviceSynchronize());

    CUdeviceptr d;
    CKD(cuMemAlloc(&d, 64 << 20));
    start_spin(ms);
    run = pending();
    t0 = now_ms();
    CKD(cuMemFree(d));
    printf("free: cuMemFree ms %.3f kernel-running-before %s\n", now_ms() - t0, run);
    CK(cudaDeviceSynchronize());

    CK(cudaMalloc(&a, 64 << 20));
    run = pending();
    t0 = now_ms();
    CK(cudaFree(a));
    printf("free: cudaFree-idle ms %.3f kernel-running-before %s\n", now_ms() - t0, run);
    CK(cudaFree(flag));
    CK(cudaEventDestroy(after));
    return 0;
}
