/* SPDX-License-Identifier: MIT */
/* ptrattr.c: what the program learns about a pointer into the shim's memory
 * (cuPointerGetAttribute, cuPointerGetAttributes, cuMemGetAddressRange).
 *
 * The real driver knows the shim's memory as chunk-sized VMM mappings, some of them unmapped
 * while swapped out; the program allocated buffers. So every attribute of a pointer into a live
 * buffer of ours is answered here, per allocation, whether the buffer is resident or not, as
 * the driver answers for memory from cuMemAlloc:
 *   CONTEXT, DEVICE_ORDINAL    the shim's context and device
 *   MEMORY_TYPE                CU_MEMORYTYPE_DEVICE
 *   DEVICE_POINTER             the pointer itself
 *   HOST_POINTER               CUDA_ERROR_INVALID_VALUE (device memory has none)
 *   BUFFER_ID, MEMORY_BLOCK_ID the buffer's serial number with bit 62 set (OOC_BUFFER_ID_TAG):
 *                              the same at every byte of one allocation, never shared with
 *                              another, unchanged by swaps, never reused
 *   RANGE_START_ADDR/SIZE,     the allocation's start and size
 *   MAPPING_BASE_ADDR/SIZE
 *   MAPPED                     1; IS_MANAGED, SYNC_MEMOPS 0; ACCESS_FLAGS read-write
 *   IS_LEGACY_CUDA_IPC_CAPABLE, IS_GPU_DIRECT_RDMA_CAPABLE, ALLOWED_HANDLE_TYPES,
 *   IS_HW_DECOMPRESS_CAPABLE   0: the shim's memory cannot be exported (cuIpcGetMemHandle,
 *                              RDMA, handles), since it moves
 *   MEMPOOL_HANDLE             NULL (the shim's own pool stands for every memory pool)
 *   P2P_TOKENS and any other   CUDA_ERROR_INVALID_VALUE
 * A pointer inside the shim's reservation but in no live buffer (freed, or never allocated) is
 * what the driver calls an unknown pointer: cuPointerGetAttribute answers
 * CUDA_ERROR_INVALID_VALUE, cuPointerGetAttributes zeros and CUDA_SUCCESS, cuMemGetAddressRange
 * CUDA_ERROR_NOT_FOUND. Pointers outside the reservation go to the driver unchanged. */
#include "shim.h"

#include <string.h>

#define OOC_BUFFER_ID_TAG (1ull << 62)

/* The size of attribute a's value; 0 for one the shim does not know. */
static size_t attr_size(CUpointer_attribute a) {
    switch (a) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
        return sizeof(CUcontext);
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
        return sizeof(unsigned int);
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
    case CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR:
        return sizeof(CUdeviceptr);
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
        return sizeof(void *);
    case CU_POINTER_ATTRIBUTE_P2P_TOKENS:
        return sizeof(CUDA_POINTER_ATTRIBUTE_P2P_TOKENS);
    case CU_POINTER_ATTRIBUTE_SYNC_MEMOPS:
    case CU_POINTER_ATTRIBUTE_IS_MANAGED:
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
    case CU_POINTER_ATTRIBUTE_MAPPED:
    case CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE:
    case CU_POINTER_ATTRIBUTE_IS_HW_DECOMPRESS_CAPABLE:
        return sizeof(int);
    case CU_POINTER_ATTRIBUTE_ACCESS_FLAGS:
        return sizeof(unsigned long long); /* CUmemAccess_flags, as the driver writes it */
    case CU_POINTER_ATTRIBUTE_BUFFER_ID:
    case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES:
    case CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID:
        return sizeof(unsigned long long);
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
    case CU_POINTER_ATTRIBUTE_MAPPING_SIZE:
        return sizeof(size_t);
    case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE:
        return sizeof(CUmemoryPool);
    default:
        return 0;
    }
}

/* Attribute a of pointer p into the live buffer described by bi, into data. */
static CUresult answer(void *data, CUpointer_attribute a, CUdeviceptr p, const ooc_bufinfo_t *bi) {
    switch (a) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
        *(CUcontext *)data = bi->ctx;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
        *(unsigned int *)data = CU_MEMORYTYPE_DEVICE;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
        *(CUdeviceptr *)data = p;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
        *(int *)data = (int)bi->dev;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_BUFFER_ID:
    case CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID:
        *(unsigned long long *)data = OOC_BUFFER_ID_TAG | bi->id;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
    case CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR:
        *(CUdeviceptr *)data = (CUdeviceptr)bi->base;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
    case CU_POINTER_ATTRIBUTE_MAPPING_SIZE:
        *(size_t *)data = bi->size;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MAPPED:
        *(int *)data = 1;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_SYNC_MEMOPS:
    case CU_POINTER_ATTRIBUTE_IS_MANAGED:
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
    case CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE:
    case CU_POINTER_ATTRIBUTE_IS_HW_DECOMPRESS_CAPABLE:
        *(int *)data = 0;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_ACCESS_FLAGS:
        *(unsigned long long *)data = CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READWRITE;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES:
        *(unsigned long long *)data = CU_MEM_HANDLE_TYPE_NONE;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE:
        *(CUmemoryPool *)data = NULL;
        return CUDA_SUCCESS;
    default: /* the host pointer, P2P tokens, attributes newer than the shim */
        return CUDA_ERROR_INVALID_VALUE;
    }
}

CUresult ooc_hook_cuPointerGetAttribute(void *data, CUpointer_attribute attr, CUdeviceptr p) {
    OOC_NEED_REAL(cuPointerGetAttribute);
    if (!ooc_mem_owns((uintptr_t)p))
        return ooc_real.cuPointerGetAttribute(data, attr, p);
    ooc_bufinfo_t bi;
    if (!data || ooc_mem_bufinfo((uintptr_t)p, &bi) != 0)
        return CUDA_ERROR_INVALID_VALUE;
    return answer(data, attr, p, &bi);
}
OOC_EXPORT_HOOK(cuPointerGetAttribute, PFN_cuPointerGetAttribute_v4000);

/* As the driver documents it: bad arguments (no attributes, a NULL destination, an attribute it
 * does not know) are CUDA_ERROR_INVALID_VALUE with nothing written; otherwise every value is
 * written, as zero (NULL) for an unknown pointer or an attribute that does not apply to it. */
CUresult ooc_hook_cuPointerGetAttributes(unsigned int n, CUpointer_attribute *attrs, void **data,
                                         CUdeviceptr p) {
    OOC_NEED_REAL(cuPointerGetAttributes);
    if (!ooc_mem_owns((uintptr_t)p))
        return ooc_real.cuPointerGetAttributes(n, attrs, data, p);
    if (n == 0 || !attrs || !data)
        return CUDA_ERROR_INVALID_VALUE;
    for (unsigned i = 0; i < n; i++)
        if (!data[i] || attr_size(attrs[i]) == 0)
            return CUDA_ERROR_INVALID_VALUE;
    ooc_bufinfo_t bi;
    int known = ooc_mem_bufinfo((uintptr_t)p, &bi) == 0;
    for (unsigned i = 0; i < n; i++)
        if (!known || answer(data[i], attrs[i], p, &bi) != CUDA_SUCCESS)
            memset(data[i], 0, attr_size(attrs[i]));
    return CUDA_SUCCESS;
}
OOC_EXPORT_HOOK(cuPointerGetAttributes, PFN_cuPointerGetAttributes_v7000);

CUresult ooc_hook_cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr p) {
    OOC_NEED_REAL(cuMemGetAddressRange_v2);
    if (!ooc_mem_owns((uintptr_t)p))
        return ooc_real.cuMemGetAddressRange_v2(base, size, p);
    ooc_bufinfo_t bi;
    if (ooc_mem_bufinfo((uintptr_t)p, &bi) != 0)
        return CUDA_ERROR_NOT_FOUND;
    if (base)
        *base = (CUdeviceptr)bi.base;
    if (size)
        *size = bi.size;
    return CUDA_SUCCESS;
}
OOC_EXPORT_HOOK(cuMemGetAddressRange_v2, PFN_cuMemGetAddressRange_v3020);
