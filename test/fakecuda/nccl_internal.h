/* SPDX-License-Identifier: MIT */
/* nccl_internal.h: what the files of the simulated NCCL (nccl.c, nccl_mem.c, nccl_enqueue.c)
 * share: the driver table, the options, the error path and the communicator.
 *
 * Everything here is hidden (the library is built -fvisibility=hidden); only the nccl* entry
 * points, marked NCCL_API, are exported. */
#ifndef NCCL_INTERNAL_H
#define NCCL_INTERNAL_H

#include "fc_nccl.h"

#include <cudaTypedefs.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#define NCCL_API __attribute__((visibility("default")))

/* Work items in a comm's ring, so also the most calls one group may hold. */
#define FC_NCCL_RING_ITEMS 1024

/* The driver entry points, resolved once; ok is set when all of them were found. */
typedef struct fcn_drv {
    pthread_once_t once;
    int ok;
    PFN_cuCtxGetCurrent_v4000 ctx_get_current;
    PFN_cuCtxGetDevice_v2000 ctx_get_device;
    PFN_cuCtxSynchronize_v2000 ctx_synchronize;
    PFN_cuModuleLoadData_v2000 module_load_data;
    PFN_cuModuleGetFunction_v2000 module_get_function;
    PFN_cuModuleUnload_v2000 module_unload;
    PFN_cuLaunchKernel_v4000 launch_kernel;
    PFN_cuMemAlloc_v3020 mem_alloc;
    PFN_cuMemFree_v3020 mem_free;
    PFN_cuMemcpyHtoDAsync_v3020 htod_async;
    PFN_cuStreamQuery_v2000 stream_query;
    PFN_cuPointerGetAttribute_v4000 pointer_get_attribute;
    PFN_cuMemGetAllocationGranularity_v10020 granularity;
    PFN_cuMemCreate_v10020 mem_create;
    PFN_cuMemRelease_v10020 mem_release;
    PFN_cuMemAddressReserve_v10020 address_reserve;
    PFN_cuMemAddressFree_v10020 address_free;
    PFN_cuMemMap_v10020 mem_map;
    PFN_cuMemUnmap_v10020 mem_unmap;
    PFN_cuMemSetAccess_v10020 set_access;
} fcn_drv_t;

extern fcn_drv_t fcn_drv;

/* FAKENCCL_TIMEOUT_S, read with the driver table. */
extern unsigned fcn_timeout_s;

/* Resolves the driver table and reads the options once (thread-safe); 1 when the driver is
 * usable. */
int fcn_driver_ready(void);

/* Writes "fakenccl: <message>" to stderr in one write, keeps it for ncclGetLastError (per
 * thread) and returns r. */
__attribute__((format(printf, 2, 3))) ncclResult_t fcn_fail(ncclResult_t r, const char *fmt, ...);

/* CLOCK_MONOTONIC in seconds. */
double fcn_now_s(void);

typedef struct reg {
    struct reg *next;
    CUdeviceptr base;
    size_t bytes;
} reg_t;

struct ncclComm {
    fc_nccl_kstate_t ks; /* first: the kernel's token points here */
    size_t shm_bytes;
    int dev;
    int finalized;
    CUmodule module;
    CUfunction fn;
    CUdeviceptr ring;
    uint64_t ring_pos; /* next free item, counted from the start (wrap skips included) */
    uint64_t launches; /* the last launch_seq issued */
    uint64_t ends[FC_NCCL_RING_ITEMS + 1]; /* ring_pos after launch s at [s % (ITEMS + 1)] */
    reg_t *regs;
};

#endif
