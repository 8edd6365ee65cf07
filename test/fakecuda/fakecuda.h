/* SPDX-License-Identifier: MIT */
/* fakecuda.h: the test-facing API of the simulated CUDA driver (kernels, statistics, faults).
 *
 * The simulated driver is a libcuda.so.1 that implements a subset of the real driver API on
 * host memory (see test/fakecuda/README.md). Programs use it through the ordinary driver API;
 * this header adds what only a simulation can offer: kernels written as C functions, exact
 * statistics of live resources, and fault injection. Kernel code runs on the worker thread of
 * the stream it was launched on (or inline on the launching thread in inline mode). */
#ifndef FAKECUDA_H
#define FAKECUDA_H

#include <cuda.h>
#include <stddef.h>
#include <stdint.h>

#define FAKECUDA_API __attribute__((visibility("default")))

/* A module image accepted by cuModuleLoadData/cuLibraryLoadData is this prefix followed by a
 * module name, NUL-terminated: "FAKECUDA-MODULE:nn". Anything else is CUDA_ERROR_INVALID_IMAGE. */
#define FAKECUDA_IMAGE_PREFIX "FAKECUDA-MODULE:"
#define FAKECUDA_MAX_PARAMS   24

/* One kernel launch as the kernel function sees it. params[i] points at the bytes of parameter
 * i (a private copy made at launch time, so the caller may reuse its arguments at once). */
typedef struct fakecuda_launch {
    unsigned grid[3];
    unsigned block[3];
    unsigned shared_bytes;
    void *const *params;
    void *priv; /* the driver's; kernels leave it alone */
} fakecuda_launch_t;

/* A kernel returns 0, or -1 after fakecuda_access refused an access (the driver then makes
 * CUDA_ERROR_ILLEGAL_ADDRESS sticky, as a faulting kernel does on a GPU). */
typedef int (*fakecuda_kernel_fn)(fakecuda_launch_t *l);

typedef struct fakecuda_kernel {
    const char *module; /* module name, as in FAKECUDA-MODULE:<module> */
    const char *name;   /* function name, as given to cuModuleGetFunction */
    unsigned nparams;
    unsigned param_bytes[FAKECUDA_MAX_PARAMS]; /* size of each parameter; offsets are aligned to
                                                  min(size, 8) as the CUDA ABI does */
    fakecuda_kernel_fn fn;
} fakecuda_kernel_t;

/* A param_bytes entry for a parameter aligned more strictly than min(size, 8): a CUtensorMap
 * taken by value (__grid_constant__) is FAKECUDA_PARAM_ALIGNED(128, 64), as nvcc lays it out. */
#define FAKECUDA_PARAM_ALIGNED(bytes, align) ((unsigned)(bytes) | ((unsigned)(align) << 24))
#define FAKECUDA_PARAM_SIZE(entry)           ((entry)&0xffffffu)
#define FAKECUDA_PARAM_ALIGN(entry)          ((entry) >> 24)

/* Value of parameter i, of the given C type. */
#define FAKECUDA_ARG(l, i, type) (*(const type *)(l)->params[(i)])

/* Checks that [p, p + bytes) lies in device-accessible memory that is mapped with the access
 * the kernel needs (write != 0: read-write) and returns the host address of p; NULL when it
 * does not, after recording the illegal access. Kernels must touch device memory only through
 * addresses this returned. Thread-safe. */
FAKECUDA_API void *fakecuda_access(fakecuda_launch_t *l, CUdeviceptr p, size_t bytes, int write);

/* A TMA descriptor (CUtensorMap) as a kernel sees it once decoded: the global address, data type
 * (CUtensorMapDataType), rank, element size in bits, each dimension's size in elements and stride
 * in bytes (strides[0] is the element size), and for a tiled map the box. */
typedef struct fakecuda_tensor_map {
    CUdeviceptr base;
    unsigned kind; /* 1 tiled, 2 im2col, 3 im2col wide */
    unsigned dtype, rank, elem_bits;
    uint64_t dims[5], strides[5];
    unsigned box[5];
} fakecuda_tensor_map_t;

/* Decodes the 128 bytes of a CUtensorMap made by cuTensorMapEncode* (tmap need not be aligned: a
 * kernel passes its parameter's bytes). Returns 0, or -1 when the bytes are not a descriptor this
 * driver encoded (the kernel then returns -1: a fault). Thread-safe. */
FAKECUDA_API int fakecuda_tensor_map_decode(const void *tmap, fakecuda_tensor_map_t *out);

/* Bytes from the tensor's base address to the end of its last element. */
FAKECUDA_API uint64_t fakecuda_tensor_map_span(const fakecuda_tensor_map_t *t);

/* Declares the work a kernel does, for the timing model: the launch occupies the compute engine
 * for launch_floor + flops / FAKECUDA_GFLOPS + bytes / FAKECUDA_HBM_GBPS. No-op without timing. */
FAKECUDA_API void fakecuda_work(fakecuda_launch_t *l, double flops, double bytes);

/* Declares time the kernel's body waited off the CPU for something outside the device (another
 * rank of a collective): with the timing model the launch holds the compute engine for it, as a
 * GPU kernel spinning on a flag would. The rest of a body counts by the CPU time its thread used,
 * not the time that passed (the simulator's threads share the host's cores). */
FAKECUDA_API void fakecuda_waited(fakecuda_launch_t *l, uint64_t ns);

/* Registers extra kernels (tests use this). The array must outlive the driver. Returns 0, or -1
 * when a (module, name) pair is already registered or the table is full. Thread-safe. */
FAKECUDA_API int fakecuda_register_kernels(const fakecuda_kernel_t *k, size_t n);

/* Exact counts of live resources and totals; all zero "live" fields after a clean teardown. */
typedef struct fakecuda_stats {
    uint64_t device_capacity_bytes; /* FAKECUDA_MEM_BYTES */
    uint64_t device_used_bytes;     /* cuMemAlloc* bytes + device-located cuMemCreate bytes */
    uint64_t device_peak_bytes;
    uint64_t allocs_live, alloc_bytes_live; /* cuMemAlloc*, not yet freed */
    uint64_t vmm_handles_live, vmm_device_bytes_live, vmm_host_bytes_live;
    uint64_t reservations_live, reserved_bytes_live;
    uint64_t mappings_live, mapped_bytes_live;
    uint64_t host_allocs_live, host_alloc_bytes_live; /* cuMemHostAlloc / cuMemAllocHost */
    uint64_t streams_live, events_live, modules_live;
    uint64_t kernels_launched, memcpys, memsets;
    uint64_t bytes_h2d, bytes_d2h, bytes_d2d;
    uint64_t illegal_accesses;  /* accesses refused (sticky CUDA_ERROR_ILLEGAL_ADDRESS) */
    uint64_t strict_violations; /* unmap/free while queued work referenced the range */
    uint64_t injected_faults;
    /* Kernel accesses (fakecuda_access) that reached host-located VMM memory mapped at a device
     * address (a safe-mode alias of a swapped buffer, when the program is run under the shim). */
    uint64_t kernel_host_accesses;
    /* Graphs: captured with cuStreamBeginCapture/cuStreamEndCapture, instantiated, launched. */
    uint64_t graphs_live, graph_execs_live;
    uint64_t graph_launches; /* cuGraphLaunch calls that queued their graph */
    uint64_t ops_captured;   /* kernels, copies, sets and host functions added to captures */
    /* cuMemMap calls that moved back a host mapping cuMemUnmap had moved aside (the simulator's
     * own cost: no fresh page tables; fc_mem.c). */
    uint64_t maps_moved;
    /* With the timing model: the time the mapping calls (cuMemCreate, cuMemMap, cuMemUnmap,
     * cuMemSetAccess) spent in the simulator's own work, before sleeping out the rest of their
     * model (where the work exceeds the model, the call takes the work's time). */
    uint64_t vmm_own_ns;
    /* Threaded: the times a stream's worker thread was woken while waiting for work or for
     * another stream's op (the simulator's own cost: only the stream an event concerns wakes). */
    uint64_t worker_wakeups;
    /* Threaded: submissions that found their stream's launch queue full (FAKECUDA_QUEUE_DEPTH)
     * and held the host until an op completed. */
    uint64_t queue_full_waits;
} fakecuda_stats_t;

FAKECUDA_API void fakecuda_get_stats(fakecuda_stats_t *out);

/* Calls so far of a driver function by base name ("cuMemcpyAsync" counts every version and
 * per-thread variant of it). */
FAKECUDA_API uint64_t fakecuda_call_count(const char *api);

/* Replaces the fault-injection plan and resets call counts. Syntax, as FAKECUDA_FAIL:
 * "name@N[=code][,name@N+[=code]...]": fail the Nth call (from 1) of the base name, or every call
 * from the Nth on with "+", returning code (default CUDA_ERROR_OUT_OF_MEMORY). Returns 0, or -1
 * on a malformed spec (nothing changed). */
FAKECUDA_API int fakecuda_set_faults(const char *spec);

/* Waits for all queued work, stops the stream workers and writes statistics if FAKECUDA_STATS
 * asks for them. Called automatically at exit; tests may call it earlier. */
FAKECUDA_API void fakecuda_shutdown(void);

#endif
