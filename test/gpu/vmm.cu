/* SPDX-License-Identifier: MIT */
/* vmm.cu: the driver's virtual memory management as the shim uses it, checked on the real
 * driver without the shim: a physical chunk mapped, unmapped and mapped again at the same
 * address keeps its bytes (a swap-in maps a pooled chunk where the buffer always lived), another
 * chunk mapped at that address in between reads as itself, and one chunk at two addresses reads
 * the same through both; kernels do the reading (gk_sum). Then host-located VMM memory
 * (CU_MEM_LOCATION_TYPE_HOST_NUMA, what the shim's safe mode needs): whether the device says it
 * supports it, whether cuMemCreate gives one, and, when it does, whether a kernel writes and
 * reads it at a device address.
 *
 * Prints PASS/FAIL lines and "host_vmm: 1|0 (...)". Exit 0 when every check passed, 1 when one
 * failed, 3 on an unexpected driver error, 77 without a device. Linked with -lcuda. */
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.cuh"

static const char *const prog = "vmm";

static unsigned long long *d_sum;

/* gk_sum of n words at address p, read back. */
static unsigned long long sum_at(CUdeviceptr p, unsigned long long n) {
    unsigned long long z = 0, got = 0;
    CKD(cuMemcpyHtoD(reinterpret_cast<CUdeviceptr>(d_sum), &z, sizeof z));
    gk_sum<<<128, 256>>>(reinterpret_cast<const uint32_t *>(p), n, d_sum);
    if (cudaGetLastError() != cudaSuccess) {
        printf("ERROR %s: gk_sum launch failed\n", prog);
        exit(3);
    }
    CKD(cuMemcpyDtoH(&got, reinterpret_cast<CUdeviceptr>(d_sum), sizeof got));
    return got;
}

static void fill_at(CUdeviceptr p, unsigned long long n, uint32_t seed) {
    gk_fill<<<256, 256>>>(reinterpret_cast<uint32_t *>(p), n, seed);
    if (cudaGetLastError() != cudaSuccess || cudaDeviceSynchronize() != cudaSuccess) {
        printf("ERROR %s: gk_fill failed\n", prog);
        exit(3);
    }
}

static void map_rw(CUdeviceptr va, size_t bytes, CUmemGenericAllocationHandle h, int dev) {
    CKD(cuMemMap(va, bytes, 0, h, 0));
    CUmemAccessDesc acc;
    memset(&acc, 0, sizeof acc);
    acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    acc.location.id = dev;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    CKD(cuMemSetAccess(va, bytes, &acc, 1));
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
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    size_t g = 0;
    CKD(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    printf("granularity: %zu bytes\n", g);
    const unsigned long long n = g / sizeof(uint32_t);
    CUdeviceptr va;
    CKD(cuMemAddressReserve(&va, 3 * g, 0, 0, 0));
    CUmemGenericAllocationHandle ha, hb;
    CKD(cuMemCreate(&ha, g, &prop, 0));
    CKD(cuMemCreate(&hb, g, &prop, 0));
    const uint64_t want_a = gk_expected_sum(n, 1), want_b = gk_expected_sum(n, 2);

    map_rw(va, g, ha, dev);
    fill_at(va, n, 1);
    gk_report(prog, sum_at(va, n) == want_a, "a mapped chunk: a kernel reads what a kernel wrote",
              NULL);
    CKD(cuMemUnmap(va, g));
    map_rw(va, g, hb, dev);
    fill_at(va, n, 2);
    gk_report(prog, sum_at(va, n) == want_b,
              "another chunk mapped at the same address reads as itself", NULL);
    CKD(cuMemUnmap(va, g));
    map_rw(va, g, ha, dev);
    gk_report(prog, sum_at(va, n) == want_a,
              "the first chunk mapped again there kept its bytes across the unmap", NULL);
    map_rw(va + g, g, ha, dev);
    gk_report(prog, sum_at(va + g, n) == want_a, "one chunk mapped at two addresses reads the same",
              NULL);
    /* a copy into a remapped chunk (what a swap-in does) */
    map_rw(va + 2 * g, g, hb, dev);
    CKD(cuMemcpyDtoD(va + 2 * g, va, g));
    CKD(cuCtxSynchronize());
    gk_report(prog, sum_at(va + 2 * g, n) == want_a, "a device copy into a remapped chunk", NULL);
    CKD(cuMemUnmap(va, 3 * g));
    CKD(cuMemRelease(ha));
    CKD(cuMemRelease(hb));
    CKD(cuMemAddressFree(va, 3 * g));

    /* host-located VMM memory */
    int attr = 0, numa = -1;
    CKD(cuDeviceGetAttribute(
        &attr, CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev));
    CKD(cuDeviceGetAttribute(&numa, CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, dev));
    CUmemAllocationProp hp;
    memset(&hp, 0, sizeof hp);
    hp.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    hp.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
    hp.location.id = numa < 0 ? 0 : numa;
    size_t hg = 0;
    CUresult rg = cuMemGetAllocationGranularity(&hg, &hp, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    CUmemGenericAllocationHandle hh;
    CUresult rc = rg == CUDA_SUCCESS ? cuMemCreate(&hh, hg, &hp, 0) : rg;
    const char *cname = "?";
    cuGetErrorName(rc, &cname);
    printf("host_vmm: %d (attribute %d, host NUMA id %d, cuMemCreate HOST_NUMA: %s)\n",
           rc == CUDA_SUCCESS, attr, numa, cname);
    if ((attr != 0) != (rc == CUDA_SUCCESS))
        printf("INFO %s: the attribute says %d but cuMemCreate of host-located memory gives %s "
               "(the shim probes with cuMemCreate too)\n",
               prog, attr, cname);
    if (rc == CUDA_SUCCESS) {
        const unsigned long long hn = hg / sizeof(uint32_t);
        CUdeviceptr hva;
        CKD(cuMemAddressReserve(&hva, hg, 0, 0, 0));
        map_rw(hva, hg, hh, dev);
        fill_at(hva, hn, 3);
        gk_report(prog, sum_at(hva, hn) == gk_expected_sum(hn, 3),
                  "a kernel writes and reads host-located memory at a device address", NULL);
        CKD(cuMemUnmap(hva, hg));
        CKD(cuMemRelease(hh));
        CKD(cuMemAddressFree(hva, hg));
    }
    cudaFree(d_sum);
    return gk_failures ? 1 : 0;
}
