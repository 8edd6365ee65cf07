/* SPDX-License-Identifier: MIT */
/* wl.h: the code shared by the training workloads that run on the (simulated) CUDA device.
 *
 * A workload is a single-threaded program that trains a small network deterministically through
 * the driver API, reached as the CUDA runtime reaches it (wl_cuda.c), with kernels from module
 * "nn" (wl_nn.c), optionally cuDNN (wl_dnn.c), and common options and output (wl_run.c). Any
 * driver or cuDNN error prints `error: <function>: <error name> (<code>)` to stderr and exits
 * with status 2. Every helper that enqueues a kernel launch, memcpy or memset counts it as one
 * op (see wl_ops_pause), so each program can print its ops per iteration. */
#ifndef WL_H
#define WL_H

#include <cuda.h>
#include <cudaTypedefs.h>
#include <stddef.h>
#include <stdint.h>

/* ---- wl_cuda.c: the driver ------------------------------------------------------------------ */

/* Driver entry points. Most come from cuGetProcAddress_v2 with the ABI version in the type's
 * name; LaunchKernel and MemcpyHtoDAsync come from dlsym on the libcuda handle, as cuBLASLt
 * gets them. */
typedef struct wl_cu {
    PFN_cuInit_v2000 Init;
    PFN_cuGetErrorName_v6000 GetErrorName;
    PFN_cuDeviceGet_v2000 DeviceGet;
    PFN_cuDevicePrimaryCtxRetain_v7000 DevicePrimaryCtxRetain;
    PFN_cuDevicePrimaryCtxRelease_v11000 DevicePrimaryCtxRelease;
    PFN_cuCtxSetCurrent_v4000 CtxSetCurrent;
    PFN_cuCtxSynchronize_v2000 CtxSynchronize;
    PFN_cuModuleLoadData_v2000 ModuleLoadData;
    PFN_cuModuleGetFunction_v2000 ModuleGetFunction;
    PFN_cuModuleUnload_v2000 ModuleUnload;
    PFN_cuMemAlloc_v3020 MemAlloc;
    PFN_cuMemFree_v3020 MemFree;
    PFN_cuMemAllocAsync_v11020 MemAllocAsync;
    PFN_cuMemFreeAsync_v11020 MemFreeAsync;
    PFN_cuMemcpyDtoHAsync_v3020 MemcpyDtoHAsync;
    PFN_cuMemcpyDtoH_v3020 MemcpyDtoH;
    PFN_cuMemcpyHtoD_v3020 MemcpyHtoD;
    PFN_cuMemcpyDtoDAsync_v3020 MemcpyDtoDAsync;
    PFN_cuMemsetD32Async_v3020 MemsetD32Async;
    PFN_cuMemsetD8Async_v3020 MemsetD8Async;
    PFN_cuStreamCreate_v2000 StreamCreate;
    PFN_cuStreamDestroy_v4000 StreamDestroy;
    PFN_cuStreamSynchronize_v2000 StreamSynchronize;
    PFN_cuStreamWaitEvent_v3020 StreamWaitEvent;
    PFN_cuEventCreate_v2000 EventCreate;
    PFN_cuEventRecord_v2000 EventRecord;
    PFN_cuEventDestroy_v4000 EventDestroy;
    PFN_cuLaunchKernel_v4000 LaunchKernel;       /* dlsym "cuLaunchKernel" */
    PFN_cuMemcpyHtoDAsync_v3020 MemcpyHtoDAsync; /* dlsym "cuMemcpyHtoDAsync_v2" */
} wl_cu_t;

extern wl_cu_t wl_cu;

/* Opens libcuda.so.1, resolves wl_cu, initialises the driver and makes device 0's primary
 * context current. Exits 2 on failure. */
void wl_cuda_init(void);

/* Releases the primary context and checks that every wl_alloc'd buffer was freed (a leak is a
 * bug in the workload: message and exit 2). */
void wl_cuda_fini(void);

/* Exits 2 with `error: <fn>: <name> (<code>)` unless r is CUDA_SUCCESS. */
void wl_check(CUresult r, const char *fn);

/* Device allocation that the program accounts for (live and peak bytes). wl_alloc uses
 * cuMemAlloc_v2 and wl_free cuMemFree_v2; the _async pair uses cuMemAllocAsync/cuMemFreeAsync on
 * stream s. Out of memory exits 2, naming the function and the size. */
CUdeviceptr wl_alloc(size_t bytes);
void wl_free(CUdeviceptr p);
CUdeviceptr wl_alloc_async(size_t bytes, CUstream s);
void wl_free_async(CUdeviceptr p, CUstream s);
uint64_t wl_peak_bytes(void);

/* Counted ops (one each). wl_h2d and wl_d2h_async require the host buffer to stay valid and
 * unchanged until the stream is synchronised. */
void wl_h2d(CUdeviceptr dst, const void *src, size_t bytes, CUstream s);
/* cuMemcpyHtoD_v2: synchronous, on no stream of the program's (src may be reused at once). */
void wl_h2d_sync(CUdeviceptr dst, const void *src, size_t bytes);
void wl_d2h_async(void *dst, CUdeviceptr src, size_t bytes, CUstream s);
void wl_d2d(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream s);
void wl_memset32(CUdeviceptr dst, uint32_t value, size_t count, CUstream s);
void wl_memset8(CUdeviceptr dst, uint8_t value, size_t bytes, CUstream s);
void wl_launch(CUfunction f, uint64_t elems, void **args, CUstream s);

/* Adds n ops made on the program's behalf by a library (a simulated cuDNN call is one launch). */
void wl_ops_add(uint64_t n);
/* Ops issued while paused are not counted (the warm-up extras, set-up and tear-down). */
void wl_ops_pause(int paused);
uint64_t wl_ops(void);
/* Writes "iter I OPS" to the WL_ALLOC_LOG file, when there is one (wl_iter_begin calls it). */
void wl_alloc_log_iter(int it);

CUstream wl_stream_create(void);
void wl_stream_destroy(CUstream s);
void wl_sync(CUstream s);

/* Events for cross-stream ordering (not ops). */
CUevent wl_event_create(void);
void wl_event_destroy(CUevent e);
void wl_record(CUevent e, CUstream s);
void wl_wait(CUstream s, CUevent e);

/* ---- wl_nn.c: kernels of module "nn", parameters and the checksum --------------------------- */

/* Loads module "nn" in the current context. */
void wl_nn_init(void);
void wl_nn_fini(void);

/* Row-major C = alpha*op(A)*op(B) + beta*C (see gemm_f32 in test/fakecuda/kernels_nn.c). */
void wl_gemm(CUstream s, int ta, int tb, int m, int n, int k, float alpha, CUdeviceptr a, int lda,
             CUdeviceptr b, int ldb, float beta, CUdeviceptr c, int ldc);
void wl_fill_uniform(CUstream s, CUdeviceptr y, uint64_t n, uint64_t seed, float scale);
void wl_fill(CUstream s, CUdeviceptr y, uint64_t n, float value);
void wl_bias_add(CUstream s, CUdeviceptr y, CUdeviceptr b, int outer, int ch, int inner);
void wl_bias_grad(CUstream s, CUdeviceptr dy, CUdeviceptr db, int outer, int ch, int inner);
void wl_relu(CUstream s, CUdeviceptr x, CUdeviceptr y, uint64_t n);
void wl_relu_bwd(CUstream s, CUdeviceptr y, CUdeviceptr dy, CUdeviceptr dx, uint64_t n);
void wl_add(CUstream s, CUdeviceptr a, CUdeviceptr b, CUdeviceptr c, uint64_t n);
void wl_axpy(CUstream s, uint64_t n, float a, CUdeviceptr x, CUdeviceptr y);
void wl_scale(CUstream s, uint64_t n, float a, CUdeviceptr x);
void wl_gap_fwd(CUstream s, CUdeviceptr x, CUdeviceptr y, int nc, int hw);
void wl_gap_bwd(CUstream s, CUdeviceptr dy, CUdeviceptr dx, int nc, int hw);
void wl_softmax_xent(CUstream s, CUdeviceptr logits, CUdeviceptr labels, CUdeviceptr loss,
                     CUdeviceptr dlogits, int rows, int classes);
void wl_sgd(CUstream s, CUdeviceptr w, CUdeviceptr g, CUdeviceptr v, uint64_t n, float lr,
            float momentum, float wd);

/* A trainable tensor: weights w and momentum v (n floats each), both persistent. */
typedef struct wl_param {
    CUdeviceptr w, v;
    uint64_t n;
} wl_param_t;

/* Allocates a parameter, initialises w uniformly in [-scale, scale) (scale == 0: all `fill`)
 * from the run's seed and the parameter's index, and zeroes v. The registry owns it until
 * wl_params_free. */
wl_param_t *wl_param_new(CUstream s, uint64_t n, float scale, float fill);

/* Registers persistent device state that is not trained by SGD but belongs to the model (batch
 * norm running statistics) so that the checksum covers it; the caller still owns the buffer. */
void wl_state_register(CUdeviceptr p, uint64_t n);

/* FNV-1a 64 of every parameter's weights, then every registered state buffer, in creation
 * order, read back from the device (uncounted). */
uint64_t wl_checksum(CUstream s);
void wl_params_free(void);

/* ---- wl_dnn.c: the (simulated) cuDNN, reached with dlopen("libcudnn.so.9") --------------------
 */

/* ---- wl_run.c: options, data, iterations, output ----------------------------------------------
 */

typedef struct wl_opts {
    int iters;          /* --iters N */
    uint64_t seed;      /* --seed S */
    int batch;          /* --batch B */
    int last_batch;     /* --last-batch B (0: same as batch) */
    int change_at;      /* --batch-from I:B: from iteration I on (0: never) ... */
    int change_batch;   /* ... B samples per iteration */
    int mark;           /* --mark */
    int warmup_differs; /* --warmup-differs */
    int relu_copy;      /* --relu-copy */
    int time;           /* --time */
} wl_opts_t;

/* What a program tells the option parser: its name, a paragraph for --help, defaults. */
typedef struct wl_program {
    const char *name;
    const char *about;
    int default_iters, default_batch;
} wl_program_t;

/* Parses the common options into *o (printing --help and exiting 0, or a usage error and exiting
 * 1). Also sets the seed that wl_param_new and wl_batch use. */
void wl_parse_args(const wl_program_t *prog, int argc, char **argv, wl_opts_t *o);
const wl_opts_t *wl_opts(void);

/* The batch size of iteration it. */
int wl_batch_size(int it);

/* Fills x (batch x dim floats in [-1, 1)) and labels (batch int32 in [0, classes)) for
 * iteration it: inputs hash the seed and the global sample index, labels are the argmax of a
 * fixed random linear teacher, so the task is learnable and independent of scheduling. */
void wl_batch(int it, int batch, int dim, int classes, float *x, int32_t *labels);

/* Fills x and labels with `count` samples of iteration it starting at sample `first` of its
 * batch: the samples wl_batch puts at indices first .. first + count - 1, which is one rank's
 * shard of the global batch in a data-parallel run (wl_batch is the shard 0 .. batch - 1). */
void wl_batch_shard(int it, int first, int count, int dim, int classes, float *x, int32_t *labels);

/* Starts iteration it (resets the op count). With --time it first synchronises the context
 * (cuCtxSynchronize) and closes the wall time of iteration it - 1: an iteration's time runs from
 * the synchronised start of it to the synchronised start of the next, so it holds every op,
 * allocation and free the program issued for it. Without --time it makes no driver call. */
void wl_iter_begin(int it);

/* Ends iteration it: reads the loss scalar back (an op, synchronising stream s), prints the loss
 * line, records the op count and calls ooc_mark_iteration when --mark found it. */
void wl_iter_end(int it, CUstream s, CUdeviceptr loss);

/* Ends the training loop, after the last iteration and before anything else (the checksum):
 * with --time, synchronises the context and closes the last iteration's wall time. */
void wl_iters_done(void);

/* Prints the three closing lines: peak_device_bytes, ops_per_iteration, checksum; then, with
 * --time, the line `time: per-iteration ms: T0 T1 ... (median of iterations K..N-1: M)` on
 * stderr (K = 4 when there are more than 4 iterations, else 0). */
void wl_report(uint64_t checksum);

#endif
