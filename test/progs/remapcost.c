/* SPDX-License-Identifier: MIT */
/* remapcost.c: what a remap costs the simulated device's host, without its timing model: the
 * shim maps a physical chunk at a new address and copies into it over and over, and under a
 * hypervisor that shadows page tables the first touch of a fresh translation costs the host far
 * more than the copy (scripts/bench-replay prints this beside its figures).
 *
 * Cycles through 8 physical chunks of B bytes and 64 addresses: map a chunk at the next
 * address, set access, copy B bytes from pinned host memory into it (the first copy), copy them
 * again (the second), unmap. Run it as the replay runs (FAKECUDA_SCHED=threaded: the copies on
 * the device's copy thread), without FAKECUDA_TIMING (the host's own cost, not the model's).
 *
 * Options: --bytes B (a multiple of the granularity, default 2M; suffixes K and M), --rounds N
 * (default 200). Output, one line: "remapcost: bytes B rounds N map_unmap_us M first_copy_us F
 * second_copy_us S" (medians over the rounds, microseconds of wall time on the calling thread,
 * each copy waited for). Exit status 0; 2 when a driver call failed; 64 on a bad option. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "userprog.h" /* cuda.h, UP_CHECK */

#define NPHYS  8
#define NADDR  64
#define MAX_RD 10000

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* B bytes from "2M", "64K" or "65536"; 0 when it does not parse. */
static size_t parse_bytes(const char *s) {
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (end == s)
        return 0;
    if (*end == 'K' || *end == 'k')
        v <<= 10, end++;
    else if (*end == 'M' || *end == 'm')
        v <<= 20, end++;
    return *end ? 0 : (size_t)v;
}

int main(int argc, char **argv) {
    size_t bytes = 2u << 20;
    int rounds = 200;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--bytes") && i + 1 < argc) {
            bytes = parse_bytes(argv[++i]);
        } else if (!strcmp(argv[i], "--rounds") && i + 1 < argc) {
            rounds = atoi(argv[++i]);
        } else {
            fprintf(stderr, "remapcost: unknown option %s (use --bytes B, --rounds N)\n", argv[i]);
            return 64;
        }
    }
    if (bytes == 0 || rounds < 1 || rounds > MAX_RD) {
        fprintf(stderr,
                "remapcost: --bytes must be a positive size (e.g. 2M, 64K) and --rounds "
                "1..%d\n",
                MAX_RD);
        return 64;
    }
    CUdevice dev;
    CUcontext ctx;
    UP_CHECK(cuInit(0));
    UP_CHECK(cuDeviceGet(&dev, 0));
    UP_CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    UP_CHECK(cuCtxSetCurrent(ctx));
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    size_t gran = 0;
    UP_CHECK(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    if (bytes % gran) {
        fprintf(stderr, "remapcost: --bytes %zu is not a multiple of the granularity %zu\n", bytes,
                gran);
        return 64;
    }
    CUmemGenericAllocationHandle h[NPHYS];
    for (int i = 0; i < NPHYS; i++)
        UP_CHECK(cuMemCreate(&h[i], bytes, &prop, 0));
    CUdeviceptr va;
    UP_CHECK(cuMemAddressReserve(&va, bytes * NADDR, 0, 0, 0));
    void *host;
    UP_CHECK(cuMemHostAlloc(&host, bytes, 0));
    memset(host, 0x5a, bytes);
    CUmemAccessDesc acc = {.location = prop.location, .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    CUstream s;
    UP_CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    static double mu[MAX_RD], first[MAX_RD], second[MAX_RD];
    for (int k = 0; k < rounds; k++) {
        CUdeviceptr at = va + (CUdeviceptr)(k % NADDR) * bytes;
        double t0 = now_us();
        UP_CHECK(cuMemMap(at, bytes, 0, h[k % NPHYS], 0));
        UP_CHECK(cuMemSetAccess(at, bytes, &acc, 1));
        double t1 = now_us();
        UP_CHECK(cuMemcpyHtoDAsync(at, host, bytes, s));
        UP_CHECK(cuStreamSynchronize(s));
        double t2 = now_us();
        UP_CHECK(cuMemcpyHtoDAsync(at, host, bytes, s));
        UP_CHECK(cuStreamSynchronize(s));
        double t3 = now_us();
        UP_CHECK(cuMemUnmap(at, bytes));
        mu[k] = t1 - t0 + now_us() - t3;
        first[k] = t2 - t1;
        second[k] = t3 - t2;
    }
    printf("remapcost: bytes %zu rounds %d map_unmap_us %.1f first_copy_us %.1f second_copy_us "
           "%.1f\n",
           bytes, rounds, median(mu, rounds), median(first, rounds), median(second, rounds));
    UP_CHECK(cuStreamDestroy(s));
    UP_CHECK(cuMemFreeHost(host));
    UP_CHECK(cuMemAddressFree(va, bytes * NADDR));
    for (int i = 0; i < NPHYS; i++)
        UP_CHECK(cuMemRelease(h[i]));
    return 0;
}
