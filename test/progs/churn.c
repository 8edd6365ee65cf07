/* SPDX-License-Identifier: MIT */
/* churn.c: allocates, fills, checks and frees the same buffers every iteration, as a framework
 * without its caching allocator does (PyTorch with PYTORCH_NO_CUDA_MEMORY_CACHING=1), and
 * counts the driver's cuMemMap calls in each iteration.
 *
 * Each iteration allocates K buffers of several chunks each (chunk = 64 KiB: run with
 * FAKECUDA_GRANULARITY=64K and OOC_CHUNK=64K), fills each with a kernel, reads every buffer
 * back and checks every word, then frees them all. With --vary the buffers' sizes change from
 * one iteration to the next (buffer j of iteration i has (i + j) % 4 + 1 chunks; without it,
 * j % 4 + 1), so that a freed buffer's run of chunks does not fit the next one of its place.
 *
 * --overlap instead checks that memory freed while queued work still reads it is not written by
 * the next buffer's work before that: on stream A a buffer X is filled, then A waits for a
 * host flag, then sums X; X is freed on A (cuMemFreeAsync) and Y of the same size allocated
 * (cuMemAllocAsync on B) and filled on B at once; the host sets the flag 50 ms later. The sum
 * must be X's, and Y must hold its fill. Run it with FAKECUDA_SCHED=threaded (the wait needs
 * another thread to end it). --overlap-grow: the same with Y one chunk larger than X and a
 * one-chunk buffer allocated right after X, so that X's run of chunks does not fit Y whole and
 * Y cannot have X's addresses: under a budget of about 5 chunks Y's memory comes from X's given
 * back while A's sum may still read it (handed on early, not waited for on the host).
 *
 * --short B makes each buffer B bytes short of its whole chunks (default 64; a multiple of 4 below
 * the chunk): its last chunk holds 64 KiB - B bytes of it.
 *
 * Options: --iters N (default 6), --bufs K (1..16, default 6), --vary, --short B, --overlap,
 * --overlap-grow.
 * Output: one line per iteration, "iter I: maps M addrs H" (cuMemMap calls during the
 * iteration, the shim's included; H a hash of the addresses the iteration's buffers got), then
 * "churn: ok"; with --overlap, "overlap: sum S" and "churn: ok". Exit
 * status: 0 when every word is right; 1 when one is wrong (named on stderr); 2 when a driver call
 * failed; 64 on a bad option. Linked with -lcuda (the simulated driver, whose fakecuda.h gives the
 * kernel and the call counts). */
#include <time.h>

#include "userprog.h" /* cuda.h, fakecuda.h, UP_CHECK, up_init_context */

#define CHUNK    ((size_t)64 << 10)
#define MAX_BUFS 16

/* fill(uint32_t *dst, uint32_t v, int n): dst[i] = v + i * 7 */
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

/* sum(uint64_t *out, const uint32_t *src, int n): out[0] = the sum of src */
static int k_sum(fakecuda_launch_t *l) {
    CUdeviceptr od = FAKECUDA_ARG(l, 0, CUdeviceptr), sd = FAKECUDA_ARG(l, 1, CUdeviceptr);
    int n = FAKECUDA_ARG(l, 2, int);
    uint64_t *out = fakecuda_access(l, od, 8, 1);
    const uint32_t *src = fakecuda_access(l, sd, (size_t)n * 4, 0);
    if (!out || !src)
        return -1;
    uint64_t t = 0;
    for (int i = 0; i < n; i++)
        t += src[i];
    *out = t;
    return 0;
}

static const fakecuda_kernel_t kernels[] = {
    {"churnprog", "fill", 3, {8, 4, 4}, k_fill},
    {"churnprog", "sum", 3, {8, 8, 4}, k_sum},
};

static CUfunction f_fill, f_sum;

static void fill(CUdeviceptr d, uint32_t v, size_t words, CUstream s) {
    int n = (int)words;
    void *args[] = {&d, &v, &n};
    UP_CHECK(cuLaunchKernel(f_fill, 1, 1, 1, 32, 1, 1, 0, s, args, NULL));
}

/* --overlap, --overlap-grow (`grow`): see the header. */
static int overlap(int grow) {
    CUstream a, b;
    UP_CHECK(cuStreamCreate(&a, CU_STREAM_NON_BLOCKING));
    UP_CHECK(cuStreamCreate(&b, CU_STREAM_NON_BLOCKING));
    volatile uint32_t *flag;
    UP_CHECK(cuMemHostAlloc((void **)&flag, 64, CU_MEMHOSTALLOC_DEVICEMAP));
    *flag = 0;
    CUdeviceptr out, x, y, g = 0;
    size_t words = (3 * CHUNK - 64) / 4, ywords = words + (grow ? CHUNK / 4 : 0);
    UP_CHECK(cuMemAlloc(&out, 8));
    UP_CHECK(cuMemAllocAsync(&x, words * 4, a));
    if (grow) /* a neighbour: the shim cannot give y x's addresses and one more chunk */
        UP_CHECK(cuMemAlloc(&g, CHUNK));
    fill(x, 5, words, a);
    UP_CHECK(cuStreamWaitValue32(a, (CUdeviceptr)(uintptr_t)flag, 1, CU_STREAM_WAIT_VALUE_EQ));
    int n = (int)words;
    void *args[] = {&out, &x, &n};
    UP_CHECK(cuLaunchKernel(f_sum, 1, 1, 1, 32, 1, 1, 0, a, args, NULL));
    UP_CHECK(cuMemFreeAsync(x, a));
    UP_CHECK(cuMemAllocAsync(&y, ywords * 4, b));
    fill(y, 9, ywords, b);
    struct timespec ts = {0, 50 * 1000 * 1000};
    nanosleep(&ts, NULL); /* B's fill has run by now, unless it waits for A's sum */
    *flag = 1;
    UP_CHECK(cuStreamSynchronize(a));
    UP_CHECK(cuStreamSynchronize(b));
    uint64_t sum = 0, want = 0;
    UP_CHECK(cuMemcpyDtoH(&sum, out, 8));
    for (size_t i = 0; i < words; i++)
        want += 5u + (uint32_t)i * 7u;
    uint32_t *host = malloc(ywords * 4);
    if (!host)
        return 2;
    UP_CHECK(cuMemcpyDtoH(host, y, ywords * 4));
    int bad = sum != want;
    for (size_t i = 0; i < ywords && !bad; i++)
        bad = host[i] != 9u + (uint32_t)i * 7u;
    free(host);
    printf("overlap: sum %llu\n", (unsigned long long)sum);
    if (bad) {
        fprintf(stderr,
                "churn: the sum is %llu, expected %llu (or the new buffer lost its fill): "
                "freed memory was written before the work reading it had run\n",
                (unsigned long long)sum, (unsigned long long)want);
        return 1;
    }
    UP_CHECK(cuMemFreeAsync(y, b));
    UP_CHECK(cuMemFree(out));
    if (g)
        UP_CHECK(cuMemFree(g));
    UP_CHECK(cuStreamSynchronize(b));
    UP_CHECK(cuMemFreeHost((void *)flag));
    UP_CHECK(cuStreamDestroy(a));
    UP_CHECK(cuStreamDestroy(b));
    printf("churn: ok\n");
    return 0;
}

int main(int argc, char **argv) {
    int iters = 6, nbufs = 6, vary = 0, ovl = 0;
    long shortfall = 64;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--iters") == 0 && i + 1 < argc)
            iters = atoi(argv[++i]);
        else if (strcmp(argv[i], "--bufs") == 0 && i + 1 < argc)
            nbufs = atoi(argv[++i]);
        else if (strcmp(argv[i], "--vary") == 0)
            vary = 1;
        else if (strcmp(argv[i], "--overlap") == 0)
            ovl = 1;
        else if (strcmp(argv[i], "--overlap-grow") == 0)
            ovl = 2;
        else if (strcmp(argv[i], "--short") == 0 && i + 1 < argc)
            shortfall = atol(argv[++i]);
        else {
            fprintf(stderr, "usage: churn [--iters N] [--bufs K] [--vary] [--short B] [--overlap] "
                            "[--overlap-grow]\n");
            return 64;
        }
    }
    if (iters < 1 || nbufs < 1 || nbufs > MAX_BUFS || shortfall < 0 || shortfall % 4 ||
        shortfall >= (long)CHUNK) {
        fprintf(stderr, "churn: bad option value\n");
        return 64;
    }
    if (fakecuda_register_kernels(kernels, sizeof kernels / sizeof kernels[0]) != 0)
        return 2;
    CUmodule mod;
    up_init_context();
    UP_CHECK(cuModuleLoadData(&mod, FAKECUDA_IMAGE_PREFIX "churnprog"));
    UP_CHECK(cuModuleGetFunction(&f_fill, mod, "fill"));
    UP_CHECK(cuModuleGetFunction(&f_sum, mod, "sum"));
    if (ovl) {
        int rc = overlap(ovl == 2);
        UP_CHECK(cuModuleUnload(mod));
        return rc;
    }
    uint32_t *host = malloc(4 * CHUNK);
    if (!host)
        return 2;
    int bad = 0;
    for (int it = 0; it < iters; it++) {
        uint64_t maps0 = fakecuda_call_count("cuMemMap");
        CUdeviceptr d[MAX_BUFS];
        size_t words[MAX_BUFS];
        for (int j = 0; j < nbufs; j++) {
            size_t chunks = (size_t)((vary ? it + j : j) % 4 + 1);
            words[j] = (chunks * CHUNK - (size_t)shortfall) / 4; /* less than whole chunks */
            UP_CHECK(cuMemAlloc(&d[j], words[j] * 4));
            fill(d[j], (uint32_t)(it * 131 + j * 17), words[j], NULL);
        }
        for (int j = 0; j < nbufs; j++) {
            UP_CHECK(cuMemcpyDtoH(host, d[j], words[j] * 4));
            uint32_t v = (uint32_t)(it * 131 + j * 17);
            for (size_t i = 0; i < words[j]; i++) {
                if (host[i] != v + (uint32_t)i * 7u) {
                    fprintf(stderr, "churn: iteration %d, buffer %d, word %zu: %u, expected %u\n",
                            it, j, i, host[i], v + (uint32_t)i * 7u);
                    bad = 1;
                    break;
                }
            }
        }
        uint64_t addrs = up_fnv(UP_FNV_SEED, d, nbufs * sizeof d[0]);
        for (int j = 0; j < nbufs; j++)
            UP_CHECK(cuMemFree(d[j]));
        UP_CHECK(cuCtxSynchronize());
        printf("iter %d: maps %llu addrs %016llx\n", it,
               (unsigned long long)(fakecuda_call_count("cuMemMap") - maps0),
               (unsigned long long)addrs);
    }
    free(host);
    UP_CHECK(cuModuleUnload(mod));
    if (bad)
        return 1;
    printf("churn: ok\n");
    return 0;
}
