/* SPDX-License-Identifier: MIT */
/* vmm_external.c: a program that makes device memory with the VMM API itself, as NCCL does,
 * next to ordinary allocations. Under the shim that memory counts against the budget.
 *
 * Run with FAKECUDA_MEM_BYTES = OOC_BUDGET = 8 chunks of 64 KiB (FAKECUDA_GRANULARITY=65536,
 * OOC_CHUNK=64K, OOC_BUDGET=512K). Fills six 64 KiB buffers (each with its own byte), then
 * creates, maps and uses a 256 KiB physical allocation: the device has room for it only if the
 * shim's pool gave chunks back. A second one of 512 KiB must fail with out-of-memory. Then it
 * checks that cuMemGetInfo counted the 256 KiB, that every buffer still holds its byte, and
 * releases everything. Prints "vmm_external: ok" and exits 0; 1 on a wrong result; 3 when a
 * call failed. Linked with -lcuda (the simulated driver). */
#include <cuda.h>
#include <stdio.h>
#include <string.h>

#define CHUNK ((size_t)64 << 10)
#define NBUF  6

#define CHECK(x)                                                                                   \
    do {                                                                                           \
        CUresult r_ = (x);                                                                         \
        if (r_ != CUDA_SUCCESS) {                                                                  \
            const char *n_ = "?";                                                                  \
            cuGetErrorName(r_, &n_);                                                               \
            fprintf(stderr, "vmm_external: %s failed: %s\n", #x, n_);                              \
            return 3;                                                                              \
        }                                                                                          \
    } while (0)

int main(void) {
    static unsigned char host[CHUNK];
    CUdevice dev;
    CUcontext ctx;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    CUdeviceptr b[NBUF];
    for (int i = 0; i < NBUF; i++) {
        CHECK(cuMemAlloc(&b[i], CHUNK));
        CHECK(cuMemsetD8(b[i], (unsigned char)(i + 1), CHUNK));
    }
    size_t free0, total;
    CHECK(cuMemGetInfo(&free0, &total));

    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    CUmemGenericAllocationHandle h, h2;
    CUdeviceptr va;
    size_t size = 4 * CHUNK;
    CHECK(cuMemCreate(&h, size, &prop, 0));
    CHECK(cuMemAddressReserve(&va, size, 0, 0, 0));
    CHECK(cuMemMap(va, size, 0, h, 0));
    CUmemAccessDesc d;
    memset(&d, 0, sizeof d);
    d.location = prop.location;
    d.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    CHECK(cuMemSetAccess(va, size, &d, 1));
    CHECK(cuMemsetD8(va, 0x77, size));
    CUresult r = cuMemCreate(&h2, 8 * CHUNK, &prop, 0);
    if (r != CUDA_ERROR_OUT_OF_MEMORY) {
        fprintf(stderr, "vmm_external: a cuMemCreate beyond the budget returned %d\n", (int)r);
        return 1;
    }
    size_t free1;
    CHECK(cuMemGetInfo(&free1, &total));
    printf("total: %zu\nfree before: %zu\nfree after: %zu\n", total, free0, free1);
    if (free1 > total || total - free1 < size) {
        fprintf(stderr, "vmm_external: cuMemGetInfo did not count the program's cuMemCreate\n");
        return 1;
    }
    for (int i = 0; i < NBUF; i++) {
        CHECK(cuMemcpyDtoH(host, b[i], CHUNK));
        for (size_t k = 0; k < CHUNK; k++) {
            if (host[k] != (unsigned char)(i + 1)) {
                fprintf(stderr, "vmm_external: buffer %d byte %zu is %#x\n", i, k, host[k]);
                return 1;
            }
        }
    }
    CHECK(cuMemcpyDtoH(host, va, CHUNK));
    if (host[0] != 0x77 || host[CHUNK - 1] != 0x77)
        return 1;
    CHECK(cuMemUnmap(va, size));
    CHECK(cuMemRelease(h));
    CHECK(cuMemAddressFree(va, size));
    size_t free2;
    CHECK(cuMemGetInfo(&free2, &total));
    printf("free released: %zu\n", free2);
    for (int i = 0; i < NBUF; i++)
        CHECK(cuMemFree(b[i]));
    printf("vmm_external: ok\n");
    return 0;
}
