/* SPDX-License-Identifier: MIT */
/* hostvmm.cu: host-located VMM memory (CU_MEM_LOCATION_TYPE_HOST_NUMA, what the shim's safe mode
 * maps a swapped buffer's address to) on the real driver, and what the VMM calls the shim makes
 * on every swap cost (scripts/gpu-first-contact, probe hostvmm). Without the shim.
 *
 * Prints
 *   hostvmm: attr-host-numa A attr-host H numa-id N create-host-numa R
 *            granularity-device MIN/RECOMMENDED granularity-host MIN/RECOMMENDED
 *   cost: LOC SIZE_MIB MiB handles K create_us C map_us M access_us A unmap_us U
 * A, H: the device attributes HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED and
 * HOST_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED; R: what cuMemCreate of one host-located granule
 * answers. Each cost line is for LOC (device or host) and a range of SIZE_MIB made of K handles:
 * the median over REPS rounds of cuMemMap (all K handles), cuMemSetAccess (the whole range, for
 * the device) and cuMemUnmap (the whole range), host clock around the calls, in microseconds;
 * create_us is cuMemCreate per handle, once. Each mapping is checked once with a kernel that
 * writes and sums it. Exit 0 when every check passed, 1 when one failed, 3 on a CUDA error, 77
 * without a device. */
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels.cuh"

static const char *const prog = "hostvmm";

enum { REPS = 20, MAX_HANDLES = 16 };

static unsigned long long *d_sum;

/* A kernel fills the range and another sums it: right bytes through the mapping. */
static int check_range(CUdeviceptr va, size_t bytes, uint32_t seed) {
    const unsigned long long n = bytes / sizeof(uint32_t);
    unsigned long long z = 0, got = 0;
    CKD(cuMemcpyHtoD((CUdeviceptr)d_sum, &z, sizeof z));
    gk_fill<<<256, 256>>>((uint32_t *)va, n, seed);
    gk_sum<<<128, 256>>>((const uint32_t *)va, n, d_sum);
    if (cudaGetLastError() != cudaSuccess || cudaDeviceSynchronize() != cudaSuccess) {
        printf("ERROR %s: a kernel on the mapping failed\n", prog);
        exit(3);
    }
    CKD(cuMemcpyDtoH(&got, (CUdeviceptr)d_sum, sizeof got));
    return got == gk_expected_sum(n, seed);
}

/* Times map, set-access and unmap of `bytes` made of `k` handles of one location. */
static void cost(const char *loc, const CUmemAllocationProp *prop, size_t bytes, int k, int dev) {
    CUmemGenericAllocationHandle h[MAX_HANDLES];
    const size_t each = bytes / (size_t)k;
    double t0 = gk_now_us();
    for (int i = 0; i < k; i++)
        CKD(cuMemCreate(&h[i], each, prop, 0));
    double create_us = (gk_now_us() - t0) / k;
    CUdeviceptr va;
    CKD(cuMemAddressReserve(&va, bytes, 0, 0, 0));
    CUmemAccessDesc acc;
    memset(&acc, 0, sizeof acc);
    acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    acc.location.id = dev;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    double tm[REPS], ta[REPS], tu[REPS];
    int ok = 1;
    for (int r = 0; r < REPS; r++) {
        t0 = gk_now_us();
        for (int i = 0; i < k; i++)
            CKD(cuMemMap(va + (CUdeviceptr)(i * each), each, 0, h[i], 0));
        double t1 = gk_now_us();
        CKD(cuMemSetAccess(va, bytes, &acc, 1));
        double t2 = gk_now_us();
        if (r == 0)
            ok = check_range(va, bytes, 40U + (uint32_t)k);
        double t3 = gk_now_us();
        CKD(cuMemUnmap(va, bytes));
        double t4 = gk_now_us();
        tm[r] = t1 - t0;
        ta[r] = t2 - t1;
        tu[r] = t4 - t3;
    }
    printf("cost: %s %zu MiB handles %d create_us %.1f map_us %.1f access_us %.1f unmap_us %.1f\n",
           loc, bytes >> 20, k, create_us, gk_median(tm, REPS), gk_median(ta, REPS),
           gk_median(tu, REPS));
    char what[96];
    snprintf(what, sizeof what, "a kernel writes and reads %s memory mapped as %zu MiB in %d", loc,
             bytes >> 20, k);
    gk_report(prog, ok, what, NULL);
    CKD(cuMemAddressFree(va, bytes));
    for (int i = 0; i < k; i++)
        CKD(cuMemRelease(h[i]));
}

int main(void) {
    if (gk_no_device(prog))
        return GK_SKIP;
    if (cudaFree(0) != cudaSuccess || cudaMalloc(&d_sum, sizeof *d_sum) != cudaSuccess) {
        printf("ERROR %s: cannot initialise the runtime\n", prog);
        return 3;
    }
    CUdevice dev;
    CKD(cuCtxGetDevice(&dev));
    int attr_numa = 0, attr_host = 0, numa = -1;
    CKD(cuDeviceGetAttribute(
        &attr_numa, CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev));
    if (cuDeviceGetAttribute(&attr_host,
                             CU_DEVICE_ATTRIBUTE_HOST_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                             dev) != CUDA_SUCCESS)
        attr_host = -1;
    CKD(cuDeviceGetAttribute(&numa, CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, dev));

    CUmemAllocationProp dp, hp;
    memset(&dp, 0, sizeof dp);
    dp.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    dp.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    dp.location.id = dev;
    hp = dp;
    hp.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
    hp.location.id = numa < 0 ? 0 : numa;
    size_t dmin = 0, drec = 0, hmin = 0, hrec = 0;
    CKD(cuMemGetAllocationGranularity(&dmin, &dp, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    CKD(cuMemGetAllocationGranularity(&drec, &dp, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
    CUresult rh = cuMemGetAllocationGranularity(&hmin, &hp, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    if (rh == CUDA_SUCCESS)
        rh = cuMemGetAllocationGranularity(&hrec, &hp, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
    CUmemGenericAllocationHandle probe;
    CUresult rc = rh == CUDA_SUCCESS ? cuMemCreate(&probe, hmin, &hp, 0) : rh;
    const char *cname = "?";
    cuGetErrorName(rc, &cname);
    if (rc == CUDA_SUCCESS)
        CKD(cuMemRelease(probe));
    printf("hostvmm: attr-host-numa %d attr-host %d numa-id %d create-host-numa %s "
           "granularity-device %zu/%zu granularity-host %zu/%zu\n",
           attr_numa, attr_host, numa, cname, dmin, drec, hmin, hrec);
    fflush(stdout);

    const size_t mib2 = 2 << 20, mib32 = 32 << 20;
    if (mib2 % dmin == 0) {
        cost("device", &dp, mib2, 1, dev);
        cost("device", &dp, mib32, 1, dev);
        cost("device", &dp, mib32, 16, dev);
    } else {
        printf("INFO %s: device granularity %zu does not divide 2 MiB: no device costs\n", prog,
               dmin);
    }
    if (rc == CUDA_SUCCESS && mib2 % hmin == 0) {
        cost("host", &hp, mib2, 1, dev);
        cost("host", &hp, mib32, 1, dev);
        cost("host", &hp, mib32, 16, dev);
    } else if (rc == CUDA_SUCCESS) {
        printf("INFO %s: host granularity %zu does not divide 2 MiB: no host costs\n", prog, hmin);
    }
    cudaFree(d_sum);
    return gk_failures ? 1 : 0;
}
