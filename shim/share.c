/* SPDX-License-Identifier: MIT */
/* share.c: the shim's memory is never shared outside it: CUDA IPC, allocation handles and
 * multicast binding of a buffer the shim manages are refused.
 *
 * Each of these gives someone else (another process, a multicast object, the program holding a
 * physical handle) the buffer's physical pages, and the shim moves a buffer's pages to the host
 * and back whenever its plan says. So for a pointer into a live buffer of ours:
 *   cuIpcGetMemHandle            CUDA_ERROR_NOT_SUPPORTED (what the driver answers for memory
 *                                that is not IPC-capable, as VMM memory without a handle type)
 *   cuMemRetainAllocationHandle  CUDA_ERROR_NOT_SUPPORTED (no handle the program could export,
 *                                map elsewhere or release)
 *   cuMulticastBindAddr          CUDA_ERROR_NOT_SUPPORTED (NVLS: NCCL_NVLS_ENABLE=0 keeps NCCL
 *                                from asking for the user's buffers)
 * with one error logged per entry point naming the pointer and why, once the arguments are
 * otherwise right (a NULL result pointer or a zero size gets the driver's own answer). The
 * pointer attributes say the same (ptrattr.c: IPC-capable 0, no handle types). Pointers that are
 * not ours go to the driver. */
#include "shim.h"

#include <stdatomic.h>

/* Is p in a live buffer of ours? Logs the refusal once per entry point. */
static int refused(const char *fn, CUdeviceptr p, _Atomic int *logged) {
    ooc_bufinfo_t bi;
    if (!ooc_mem_owns((uintptr_t)p) || ooc_mem_bufinfo((uintptr_t)p, &bi) != 0)
        return 0;
    if (!atomic_exchange(logged, 1))
        OOC_LOG_E("%s(0x%llx): refused with CUDA_ERROR_NOT_SUPPORTED: the pointer is in memory "
                  "ooc-shim moves between the GPU and the host, which cannot be shared with "
                  "another process or device (allocate shared memory with cuMemCreate, which "
                  "the shim leaves alone)",
                  fn, (unsigned long long)p);
    return 1;
}

CUresult ooc_hook_cuIpcGetMemHandle(CUipcMemHandle *handle, CUdeviceptr p) {
    static _Atomic int logged;
    if (handle && refused("cuIpcGetMemHandle", p, &logged))
        return CUDA_ERROR_NOT_SUPPORTED;
    OOC_NEED_REAL(cuIpcGetMemHandle);
    return ooc_real.cuIpcGetMemHandle(handle, p);
}
OOC_EXPORT_HOOK(cuIpcGetMemHandle, PFN_cuIpcGetMemHandle_v4010);

CUresult ooc_hook_cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr) {
    static _Atomic int logged;
    if (handle && refused("cuMemRetainAllocationHandle", (CUdeviceptr)(uintptr_t)addr, &logged))
        return CUDA_ERROR_NOT_SUPPORTED;
    OOC_NEED_REAL(cuMemRetainAllocationHandle);
    return ooc_real.cuMemRetainAllocationHandle(handle, addr);
}
OOC_EXPORT_HOOK(cuMemRetainAllocationHandle, PFN_cuMemRetainAllocationHandle_v11000);

CUresult ooc_hook_cuMulticastBindAddr(CUmemGenericAllocationHandle mc, size_t mc_offset,
                                      CUdeviceptr p, size_t size, unsigned long long flags) {
    static _Atomic int logged;
    if (size && refused("cuMulticastBindAddr", p, &logged))
        return CUDA_ERROR_NOT_SUPPORTED;
    OOC_NEED_REAL(cuMulticastBindAddr);
    return ooc_real.cuMulticastBindAddr(mc, mc_offset, p, size, flags);
}
OOC_EXPORT_HOOK(cuMulticastBindAddr, PFN_cuMulticastBindAddr_v12010);
