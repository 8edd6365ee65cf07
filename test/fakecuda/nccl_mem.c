/* SPDX-License-Identifier: MIT */
/* nccl_mem.c: ncclMemAlloc and ncclMemFree of the simulated NCCL, through the driver's VMM API.
 *
 * As real NCCL does: a physical allocation on the current context's device, rounded up to the
 * recommended granularity, a reserved address range, the mapping and read-write access; freed
 * in reverse. The live allocations are a list under one mutex, so both calls are thread-safe. */
#include "nccl_internal.h"

#include <stdlib.h>

/* ncclMemAlloc's allocations, for ncclMemFree. */
typedef struct vmm {
    struct vmm *next;
    CUdeviceptr va;
    size_t bytes;
    CUmemGenericAllocationHandle h;
} vmm_t;

static pthread_mutex_t vmm_lock = PTHREAD_MUTEX_INITIALIZER;
static vmm_t *vmm_list;

/* Allocates through the VMM API as real NCCL does: a physical allocation on the current device,
 * rounded to the recommended granularity, reserved, mapped and made read-write. */
NCCL_API ncclResult_t ncclMemAlloc(void **ptr, size_t size) {
    if (!ptr)
        return fcn_fail(ncclInvalidArgument, "ncclMemAlloc: ptr is NULL");
    *ptr = NULL;
    if (size == 0)
        return ncclSuccess;
    if (!fcn_driver_ready())
        return fcn_fail(ncclUnhandledCudaError, "ncclMemAlloc: cannot load libcuda.so.1");
    CUdevice dev;
    if (fcn_drv.ctx_get_device(&dev) != CUDA_SUCCESS)
        return fcn_fail(ncclInvalidUsage, "ncclMemAlloc: no current CUDA context");
    CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = dev}};
    size_t gran = 0;
    if (fcn_drv.granularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) != CUDA_SUCCESS ||
        !gran)
        return fcn_fail(ncclUnhandledCudaError,
                        "ncclMemAlloc: cuMemGetAllocationGranularity failed");
    vmm_t *v = calloc(1, sizeof *v);
    if (!v)
        return fcn_fail(ncclSystemError, "ncclMemAlloc: out of host memory");
    v->bytes = (size + gran - 1) / gran * gran;
    CUmemAccessDesc acc = {.location = prop.location, .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    const char *what = "cuMemCreate";
    if (fcn_drv.mem_create(&v->h, v->bytes, &prop, 0) != CUDA_SUCCESS)
        goto err_free;
    what = "cuMemAddressReserve";
    if (fcn_drv.address_reserve(&v->va, v->bytes, gran, 0, 0) != CUDA_SUCCESS)
        goto err_release;
    what = "cuMemMap";
    if (fcn_drv.mem_map(v->va, v->bytes, 0, v->h, 0) != CUDA_SUCCESS)
        goto err_address;
    what = "cuMemSetAccess";
    if (fcn_drv.set_access(v->va, v->bytes, &acc, 1) != CUDA_SUCCESS)
        goto err_unmap;
    pthread_mutex_lock(&vmm_lock);
    v->next = vmm_list;
    vmm_list = v;
    pthread_mutex_unlock(&vmm_lock);
    *ptr = (void *)(uintptr_t)v->va;
    return ncclSuccess;
err_unmap:
    fcn_drv.mem_unmap(v->va, v->bytes);
err_address:
    fcn_drv.address_free(v->va, v->bytes);
err_release:
    fcn_drv.mem_release(v->h);
err_free:
    free(v);
    return fcn_fail(ncclUnhandledCudaError, "ncclMemAlloc: %s failed for %zu bytes", what, size);
}

/* Unmaps, releases and unreserves what ncclMemAlloc returned (NULL is a no-op). */
NCCL_API ncclResult_t ncclMemFree(void *ptr) {
    if (!ptr)
        return ncclSuccess;
    pthread_mutex_lock(&vmm_lock);
    vmm_t **pp = &vmm_list;
    while (*pp && (*pp)->va != (CUdeviceptr)(uintptr_t)ptr)
        pp = &(*pp)->next;
    vmm_t *v = *pp;
    if (v)
        *pp = v->next;
    pthread_mutex_unlock(&vmm_lock);
    if (!v)
        return fcn_fail(ncclInvalidArgument, "ncclMemFree: %p is not from ncclMemAlloc", ptr);
    ncclResult_t r = ncclSuccess;
    if (fcn_drv.mem_unmap(v->va, v->bytes) != CUDA_SUCCESS ||
        fcn_drv.mem_release(v->h) != CUDA_SUCCESS ||
        fcn_drv.address_free(v->va, v->bytes) != CUDA_SUCCESS)
        r = fcn_fail(ncclUnhandledCudaError, "ncclMemFree: releasing %p failed", ptr);
    free(v);
    return r;
}
