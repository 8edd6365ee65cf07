/* SPDX-License-Identifier: MIT */
/* remapgate.cu: can the host remap an address behind the device? (scripts/gpu-first-contact,
 * probe remapgate; the question of docs/replay.md's "Remapping behind the device"). Without the
 * shim.
 *
 * A stream S waits on a word of pinned host memory (cuStreamWaitValue32, GEQ); behind the wait, a
 * kernel sums range A and a copy moves A to B, which a second kernel sums. While S waits, the
 * host unmaps A (mapped to handle P1, filled with seed 1) and maps handle P2 there (filled with
 * seed 2 through another address), then writes the word. What is asked:
 *   - does cuMemUnmap/cuMemMap/cuMemSetAccess return while S waits (or does one of them wait for
 *     the device: a watchdog thread writes the word after WATCHDOG_MS, so a call that waits for
 *     the device returns after it, instead of hanging);
 *   - do the kernel and the copy queued before the remap read the new mapping (seed 2), the old
 *     one (seed 1), or fail;
 *   - how long S takes from the word's write to its end.
 * Prints, for each of ROUNDS rounds (the first may pay for first use),
 *   remap: round R wait-value E unmap_us U map_us M access_us X before-release yes|no
 *          kernel-read SEED copy-read SEED stream E2 release-to-done_us T
 * (SEED: 1, 2, or "other"; E, E2: what cuStreamWaitValue32 and cuStreamSynchronize answered), and
 *   remapgate: rounds N new-mapping K old-mapping O other F before-release B unmap_us U map_us M
 *              access_us X release-to-done_us T
 * with the medians of the rounds after the first. Exit 0 when every call answered (whatever the
 * answer), 3 on a CUDA error outside the calls probed, 77 without a device. */
#include <cuda.h>
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kernels.cuh"

static const char *const prog = "remapgate";

enum { ROUNDS = 6, WATCHDOG_MS = 3000 };

static const char *errname(CUresult r) {
    const char *n = "?";
    cuGetErrorName(r, &n);
    return n;
}

/* The host word S waits for, and the watchdog that writes it if the main thread cannot. */
static volatile uint32_t *word;
static pthread_mutex_t wd_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wd_cv = PTHREAD_COND_INITIALIZER;
static uint32_t wd_armed; /* the value to write at the deadline; 0: disarmed */
static int wd_stop;

static void *watchdog(void *arg) {
    (void)arg;
    pthread_mutex_lock(&wd_lock);
    while (!wd_stop) {
        if (!wd_armed) {
            pthread_cond_wait(&wd_cv, &wd_lock);
            continue;
        }
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += WATCHDOG_MS / 1000;
        uint32_t v = wd_armed;
        int r = 0;
        while (wd_armed == v && !wd_stop && r == 0)
            r = pthread_cond_timedwait(&wd_cv, &wd_lock, &until);
        if (wd_armed == v && !wd_stop) {
            __atomic_store_n(word, v, __ATOMIC_RELEASE);
            wd_armed = 0;
        }
    }
    pthread_mutex_unlock(&wd_lock);
    return NULL;
}

static void arm(uint32_t v) {
    pthread_mutex_lock(&wd_lock);
    wd_armed = v;
    pthread_cond_signal(&wd_cv);
    pthread_mutex_unlock(&wd_lock);
}

/* Writes the word now unless the watchdog did; 1 when the watchdog had already written it. */
static int release(uint32_t v) {
    pthread_mutex_lock(&wd_lock);
    int late = wd_armed != v;
    wd_armed = 0;
    pthread_cond_signal(&wd_cv);
    pthread_mutex_unlock(&wd_lock);
    if (!late)
        __atomic_store_n(word, v, __ATOMIC_RELEASE);
    return late;
}

static const char *seed_of(unsigned long long got, unsigned long long n) {
    if (got == gk_expected_sum(n, 2))
        return "2";
    if (got == gk_expected_sum(n, 1))
        return "1";
    return "other";
}

int main(void) {
    if (gk_no_device(prog))
        return GK_SKIP;
    CKD(cuInit(0));
    cudaFree(0); /* the runtime's primary context, current here */
    CUdevice dev;
    CKD(cuCtxGetDevice(&dev));
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    size_t gran = 0;
    CKD(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
    const size_t bytes = gran > (2u << 20) ? gran : (2u << 20);
    const unsigned long long n = bytes / sizeof(uint32_t);
    CUmemAccessDesc acc;
    memset(&acc, 0, sizeof acc);
    acc.location = prop.location;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;

    CUdeviceptr a, t;
    CKD(cuMemAddressReserve(&a, bytes, 0, 0, 0));
    CKD(cuMemAddressReserve(&t, bytes, 0, 0, 0));
    CUmemGenericAllocationHandle p1, p2;
    CKD(cuMemCreate(&p1, bytes, &prop, 0));
    CKD(cuMemCreate(&p2, bytes, &prop, 0));
    uint32_t *b;
    unsigned long long *sums;
    if (cudaMalloc(&b, bytes) != cudaSuccess ||
        cudaMalloc(&sums, 2 * sizeof *sums) != cudaSuccess) {
        printf("ERROR %s: cudaMalloc failed\n", prog);
        return 3;
    }
    void *hw;
    CKD(cuMemHostAlloc(&hw, 4096, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE));
    word = (volatile uint32_t *)hw;
    *word = 0;
    CUdeviceptr dword;
    CKD(cuMemHostGetDevicePointer(&dword, hw, 0));
    CUstream s;
    CKD(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    pthread_t wd;
    if (pthread_create(&wd, NULL, watchdog, NULL) != 0) {
        printf("ERROR %s: no watchdog thread\n", prog);
        return 3;
    }

    double un[ROUNDS], mp[ROUNDS], ac[ROUNDS], done[ROUNDS];
    int nm = 0, newmap = 0, oldmap = 0, other = 0, before = 0, answered = 1;
    for (uint32_t r = 1; r <= ROUNDS; r++) {
        /* A holds seed 1 (P1), P2 holds seed 2 (filled through T, unmapped again). */
        CKD(cuMemMap(a, bytes, 0, p1, 0));
        CKD(cuMemSetAccess(a, bytes, &acc, 1));
        CKD(cuMemMap(t, bytes, 0, p2, 0));
        CKD(cuMemSetAccess(t, bytes, &acc, 1));
        gk_fill<<<256, 256>>>((uint32_t *)a, n, 1);
        gk_fill<<<256, 256>>>((uint32_t *)t, n, 2);
        CKD(cuMemsetD8((CUdeviceptr)sums, 0, 2 * sizeof *sums));
        if (cudaDeviceSynchronize() != cudaSuccess) {
            printf("ERROR %s: filling failed\n", prog);
            return 3;
        }
        CKD(cuMemUnmap(t, bytes));

        /* S: wait for the word, then read A twice (a kernel; a copy to B, summed). */
        CUresult we = cuStreamWaitValue32(s, dword, r, CU_STREAM_WAIT_VALUE_GEQ);
        gk_sum<<<128, 256, 0, (cudaStream_t)s>>>((const uint32_t *)a, n, &sums[0]);
        CUresult ce = cuMemcpyDtoDAsync((CUdeviceptr)b, a, bytes, s);
        gk_sum<<<128, 256, 0, (cudaStream_t)s>>>(b, n, &sums[1]);
        arm(r);
        usleep(20000); /* S reaches its wait */
        CUresult q = cuStreamQuery(s);

        double t0 = gk_now_us();
        CUresult ue = cuMemUnmap(a, bytes);
        double t1 = gk_now_us();
        CUresult me = ue == CUDA_SUCCESS ? cuMemMap(a, bytes, 0, p2, 0) : ue;
        double t2 = gk_now_us();
        CUresult xe = me == CUDA_SUCCESS ? cuMemSetAccess(a, bytes, &acc, 1) : me;
        double t3 = gk_now_us();
        int late = release(r);
        double t4 = gk_now_us();
        CUresult se = cuStreamSynchronize(s);
        double t5 = gk_now_us();

        unsigned long long got[2] = {0, 0};
        const char *k = "none", *c = "none";
        if (se == CUDA_SUCCESS &&
            cuMemcpyDtoH(got, (CUdeviceptr)sums, sizeof got) == CUDA_SUCCESS) {
            k = seed_of(got[0], n);
            c = seed_of(got[1], n);
        }
        printf("remap: round %u wait-value %s query-while-waiting %s unmap %s map %s access %s "
               "unmap_us %.1f map_us %.1f access_us %.1f before-release %s kernel-read %s "
               "copy-read %s stream %s release-to-done_us %.1f\n",
               r, errname(we), errname(q), errname(ue), errname(me), errname(xe), t1 - t0, t2 - t1,
               t3 - t2, late ? "no" : "yes", k, c, errname(se), t5 - t4);
        fflush(stdout);
        if (we != CUDA_SUCCESS || ce != CUDA_SUCCESS || se != CUDA_SUCCESS) {
            answered = 0; /* a sticky error: nothing after it answers */
            break;
        }
        if (!strcmp(k, "2") && !strcmp(c, "2"))
            newmap++;
        else if (!strcmp(k, "1") && !strcmp(c, "1"))
            oldmap++;
        else
            other++;
        before += !late;
        if (r > 1) {
            un[nm] = t1 - t0;
            mp[nm] = t2 - t1;
            ac[nm] = t3 - t2;
            done[nm] = t5 - t4;
            nm++;
        }
        if (xe == CUDA_SUCCESS)
            CKD(cuMemUnmap(a, bytes));
        else if (me == CUDA_SUCCESS || ue != CUDA_SUCCESS)
            (void)cuMemUnmap(a, bytes);
    }
    pthread_mutex_lock(&wd_lock);
    wd_stop = 1;
    pthread_cond_signal(&wd_cv);
    pthread_mutex_unlock(&wd_lock);
    pthread_join(wd, NULL);
    printf("remapgate: rounds %d new-mapping %d old-mapping %d other %d before-release %d "
           "unmap_us %.1f map_us %.1f access_us %.1f release-to-done_us %.1f\n",
           newmap + oldmap + other, newmap, oldmap, other, before, gk_median(un, nm),
           gk_median(mp, nm), gk_median(ac, nm), gk_median(done, nm));
    return answered ? 0 : 3;
}
