/* SPDX-License-Identifier: MIT */
/* wl_cuda.c: how the workloads reach the driver, and their accounting of memory and ops.
 *
 * The driver is opened the way libcudart opens it: dlopen("libcuda.so.1"), dlsym of
 * cuGetProcAddress_v2, then each entry point through it with an explicit ABI version (flags 0);
 * cuLaunchKernel and cuMemcpyHtoDAsync_v2 come from dlsym on the handle, as cuBLASLt does. The
 * program's own allocations are tracked in a small table (live and peak bytes in program order,
 * counting stream-ordered allocations when they are issued). Single-threaded. */
#include "wl.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

wl_cu_t wl_cu;

static void *libcuda;
static CUcontext ctx;
static CUdevice dev;

typedef struct alloc {
    CUdeviceptr p;
    size_t bytes;
} alloc_t;

static alloc_t *allocs;
static size_t nallocs, cap_allocs;
static uint64_t live_bytes, peak_bytes;
static uint64_t ops;
static int ops_paused;

static void die(const char *fn, const char *what) {
    fprintf(stderr, "error: %s: %s\n", fn, what);
    exit(2);
}

void wl_check(CUresult r, const char *fn) {
    if (r == CUDA_SUCCESS)
        return;
    const char *name = NULL;
    if (!wl_cu.GetErrorName || wl_cu.GetErrorName(r, &name) != CUDA_SUCCESS || !name)
        name = "CUDA_ERROR_UNKNOWN";
    fprintf(stderr, "error: %s: %s (%d)\n", fn, name, (int)r);
    exit(2);
}

/* Resolves one entry point through cuGetProcAddress_v2 at ABI `version`. */
static void *proc(PFN_cuGetProcAddress_v12000 gpa, const char *name, int version) {
    void *fn = NULL;
    CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    CUresult r = gpa(name, &fn, version, CU_GET_PROC_ADDRESS_DEFAULT, &st);
    if (r != CUDA_SUCCESS)
        wl_check(r, "cuGetProcAddress_v2");
    if (st != CU_GET_PROC_ADDRESS_SUCCESS || !fn)
        die("cuGetProcAddress_v2", name);
    return fn;
}

void wl_cuda_init(void) {
    libcuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!libcuda)
        die("dlopen", dlerror());
    PFN_cuGetProcAddress_v12000 gpa;
    *(void **)&gpa = dlsym(libcuda, "cuGetProcAddress_v2");
    if (!gpa)
        die("dlsym", "cuGetProcAddress_v2");
#define P(field, name, ver) *(void **)&wl_cu.field = proc(gpa, name, ver)
    P(GetErrorName, "cuGetErrorName", 6000);
    P(Init, "cuInit", 2000);
    P(DeviceGet, "cuDeviceGet", 2000);
    P(DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", 7000);
    P(DevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease", 11000);
    P(CtxSetCurrent, "cuCtxSetCurrent", 4000);
    P(CtxSynchronize, "cuCtxSynchronize", 2000);
    P(ModuleLoadData, "cuModuleLoadData", 2000);
    P(ModuleGetFunction, "cuModuleGetFunction", 2000);
    P(ModuleUnload, "cuModuleUnload", 2000);
    P(MemAlloc, "cuMemAlloc", 3020);
    P(MemFree, "cuMemFree", 3020);
    P(MemAllocAsync, "cuMemAllocAsync", 11020);
    P(MemFreeAsync, "cuMemFreeAsync", 11020);
    P(MemcpyDtoHAsync, "cuMemcpyDtoHAsync", 3020);
    P(MemcpyDtoH, "cuMemcpyDtoH", 3020);
    P(MemcpyHtoD, "cuMemcpyHtoD", 3020);
    P(MemcpyDtoDAsync, "cuMemcpyDtoDAsync", 3020);
    P(MemsetD32Async, "cuMemsetD32Async", 3020);
    P(MemsetD8Async, "cuMemsetD8Async", 3020);
    P(StreamCreate, "cuStreamCreate", 2000);
    P(StreamDestroy, "cuStreamDestroy", 4000);
    P(StreamSynchronize, "cuStreamSynchronize", 2000);
    P(StreamWaitEvent, "cuStreamWaitEvent", 3020);
    P(EventCreate, "cuEventCreate", 2000);
    P(EventRecord, "cuEventRecord", 2000);
    P(EventDestroy, "cuEventDestroy", 4000);
#undef P
    *(void **)&wl_cu.LaunchKernel = dlsym(libcuda, "cuLaunchKernel");
    *(void **)&wl_cu.MemcpyHtoDAsync = dlsym(libcuda, "cuMemcpyHtoDAsync_v2");
    if (!wl_cu.LaunchKernel || !wl_cu.MemcpyHtoDAsync)
        die("dlsym", "cuLaunchKernel or cuMemcpyHtoDAsync_v2");
    wl_check(wl_cu.Init(0), "cuInit");
    wl_check(wl_cu.DeviceGet(&dev, 0), "cuDeviceGet");
    wl_check(wl_cu.DevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");
    wl_check(wl_cu.CtxSetCurrent(ctx), "cuCtxSetCurrent");
}

void wl_cuda_fini(void) {
    wl_check(wl_cu.CtxSynchronize(), "cuCtxSynchronize");
    if (nallocs != 0) {
        fprintf(stderr, "error: workload: %zu device buffers (%llu bytes) still allocated\n",
                nallocs, (unsigned long long)live_bytes);
        exit(2);
    }
    free(allocs);
    allocs = NULL;
    cap_allocs = 0;
    wl_check(wl_cu.CtxSetCurrent(NULL), "cuCtxSetCurrent");
    wl_check(wl_cu.DevicePrimaryCtxRelease(dev), "cuDevicePrimaryCtxRelease_v2");
}

/* WL_ALLOC_LOG=path: every allocation and free, with the ops counted so far, for tests that
 * check what a recorder saw ("alloc OPS BYTES PTR", "free OPS PTR", "iter I OPS"). */
static FILE *alloc_log_file(void) {
    static int opened;
    static FILE *f;
    if (!opened) {
        opened = 1;
        const char *path = getenv("WL_ALLOC_LOG");
        if (path && *path && !(f = fopen(path, "w")))
            die("WL_ALLOC_LOG", "cannot open the file");
    }
    return f;
}

void wl_alloc_log_iter(int it) {
    FILE *f = alloc_log_file();
    if (f)
        fprintf(f, "iter\t%d\t%llu\n", it, (unsigned long long)ops);
}

static void track(CUdeviceptr p, size_t bytes) {
    FILE *f = alloc_log_file();
    if (f)
        fprintf(f, "alloc\t%llu\t%zu\t%llx\n", (unsigned long long)ops, bytes,
                (unsigned long long)p);
    if (nallocs == cap_allocs) {
        cap_allocs = cap_allocs ? 2 * cap_allocs : 64;
        allocs = realloc(allocs, cap_allocs * sizeof *allocs);
        if (!allocs)
            die("workload", "out of host memory");
    }
    allocs[nallocs++] = (alloc_t){p, bytes};
    live_bytes += bytes;
    if (live_bytes > peak_bytes)
        peak_bytes = live_bytes;
}

static void untrack(CUdeviceptr p, const char *fn) {
    FILE *f = alloc_log_file();
    if (f)
        fprintf(f, "free\t%llu\t%llx\n", (unsigned long long)ops, (unsigned long long)p);
    for (size_t i = nallocs; i-- > 0;) {
        if (allocs[i].p == p) {
            live_bytes -= allocs[i].bytes;
            allocs[i] = allocs[--nallocs];
            return;
        }
    }
    die(fn, "freeing a pointer the workload did not allocate");
}

static void check_alloc(CUresult r, const char *fn, size_t bytes) {
    if (r == CUDA_SUCCESS)
        return;
    const char *name = NULL;
    if (wl_cu.GetErrorName(r, &name) != CUDA_SUCCESS || !name)
        name = "CUDA_ERROR_UNKNOWN";
    fprintf(stderr, "error: %s: %s (%d) allocating %zu bytes (%llu bytes live)\n", fn, name, (int)r,
            bytes, (unsigned long long)live_bytes);
    exit(2);
}

CUdeviceptr wl_alloc(size_t bytes) {
    CUdeviceptr p = 0;
    check_alloc(wl_cu.MemAlloc(&p, bytes), "cuMemAlloc_v2", bytes);
    track(p, bytes);
    return p;
}

void wl_free(CUdeviceptr p) {
    untrack(p, "cuMemFree_v2");
    wl_check(wl_cu.MemFree(p), "cuMemFree_v2");
}

CUdeviceptr wl_alloc_async(size_t bytes, CUstream s) {
    CUdeviceptr p = 0;
    check_alloc(wl_cu.MemAllocAsync(&p, bytes, s), "cuMemAllocAsync", bytes);
    track(p, bytes);
    return p;
}

void wl_free_async(CUdeviceptr p, CUstream s) {
    untrack(p, "cuMemFreeAsync");
    wl_check(wl_cu.MemFreeAsync(p, s), "cuMemFreeAsync");
}

uint64_t wl_peak_bytes(void) {
    return peak_bytes;
}

void wl_ops_add(uint64_t n) {
    if (!ops_paused)
        ops += n;
}

void wl_ops_pause(int paused) {
    ops_paused = paused;
}

uint64_t wl_ops(void) {
    return ops;
}

void wl_h2d(CUdeviceptr dst, const void *src, size_t bytes, CUstream s) {
    wl_check(wl_cu.MemcpyHtoDAsync(dst, src, bytes, s), "cuMemcpyHtoDAsync_v2");
    wl_ops_add(1);
}

void wl_h2d_sync(CUdeviceptr dst, const void *src, size_t bytes) {
    wl_check(wl_cu.MemcpyHtoD(dst, src, bytes), "cuMemcpyHtoD_v2");
    wl_ops_add(1);
}

void wl_d2h_async(void *dst, CUdeviceptr src, size_t bytes, CUstream s) {
    wl_check(wl_cu.MemcpyDtoHAsync(dst, src, bytes, s), "cuMemcpyDtoHAsync_v2");
    wl_ops_add(1);
}

void wl_d2d(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream s) {
    wl_check(wl_cu.MemcpyDtoDAsync(dst, src, bytes, s), "cuMemcpyDtoDAsync_v2");
    wl_ops_add(1);
}

void wl_memset32(CUdeviceptr dst, uint32_t value, size_t count, CUstream s) {
    wl_check(wl_cu.MemsetD32Async(dst, value, count, s), "cuMemsetD32Async");
    wl_ops_add(1);
}

void wl_memset8(CUdeviceptr dst, uint8_t value, size_t bytes, CUstream s) {
    wl_check(wl_cu.MemsetD8Async(dst, value, bytes, s), "cuMemsetD8Async");
    wl_ops_add(1);
}

/* Launches f with a grid of 256-thread blocks covering elems, as a real elementwise kernel
 * would be configured (the simulated kernels compute their whole range either way). */
void wl_launch(CUfunction f, uint64_t elems, void **args, CUstream s) {
    uint64_t blocks = (elems + 255) / 256;
    unsigned grid = blocks == 0 ? 1 : blocks > 65535 ? 65535 : (unsigned)blocks;
    wl_check(wl_cu.LaunchKernel(f, grid, 1, 1, 256, 1, 1, 0, s, args, NULL), "cuLaunchKernel");
    wl_ops_add(1);
}

CUstream wl_stream_create(void) {
    CUstream s = NULL;
    wl_check(wl_cu.StreamCreate(&s, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
    return s;
}

void wl_stream_destroy(CUstream s) {
    wl_check(wl_cu.StreamDestroy(s), "cuStreamDestroy_v2");
}

void wl_sync(CUstream s) {
    wl_check(wl_cu.StreamSynchronize(s), "cuStreamSynchronize");
}

CUevent wl_event_create(void) {
    CUevent e = NULL;
    wl_check(wl_cu.EventCreate(&e, CU_EVENT_DISABLE_TIMING), "cuEventCreate");
    return e;
}

void wl_event_destroy(CUevent e) {
    wl_check(wl_cu.EventDestroy(e), "cuEventDestroy_v2");
}

void wl_record(CUevent e, CUstream s) {
    wl_check(wl_cu.EventRecord(e, s), "cuEventRecord");
}

void wl_wait(CUstream s, CUevent e) {
    wl_check(wl_cu.StreamWaitEvent(s, e, 0), "cuStreamWaitEvent");
}
