/* SPDX-License-Identifier: MIT */
/* shim.h: what the shim's modules share: the real driver's function table, the device state,
 * and the interfaces of the memory manager and the access finder.
 *
 * Compiled with __CUDA_API_VERSION_INTERNAL so cuda.h leaves versioned names (cuMemAlloc_v2,
 * cuLaunchKernel_ptsz) unrenamed; every hook is checked against its cudaTypedefs.h type.
 * Data flows hooks.c -> launch.c (what an op touches) -> the memory layer (make it resident:
 * buffer.c, resident.c and the files listed in mem_int.h) -> real.c (the only caller of the real
 * driver). */
#ifndef OOC_SHIM_H
#define OOC_SHIM_H

#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>
#include <cudaTypedefs.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "log.h"
#include "ooc.h"
#include "options.h"
#include "ooc_planner.h"
#include "stats.h"

/* ---- real.c: the real driver ------------------------------------------------------------------
 */

/* Driver functions the shim calls for itself, beyond the ones it hooks. */
#define OOC_REAL_EXTRA(X)                                                                          \
    X(cuInit, PFN_cuInit_v2000)                                                                    \
    X(cuCtxGetCurrent, PFN_cuCtxGetCurrent_v4000)                                                  \
    X(cuCtxSetCurrent, PFN_cuCtxSetCurrent_v4000)                                                  \
    X(cuCtxSynchronize, PFN_cuCtxSynchronize_v2000)                                                \
    X(cuCtxGetDevice, PFN_cuCtxGetDevice_v2000)                                                    \
    X(cuDeviceGetName, PFN_cuDeviceGetName_v2000)                                                  \
    X(cuDeviceTotalMem_v2, PFN_cuDeviceTotalMem_v3020)                                             \
    X(cuDeviceGetAttribute, PFN_cuDeviceGetAttribute_v2000)                                        \
    X(cuMemAddressReserve, PFN_cuMemAddressReserve_v10020)                                         \
    X(cuMemAddressFree, PFN_cuMemAddressFree_v10020)                                               \
    X(cuMemMap, PFN_cuMemMap_v10020)                                                               \
    X(cuMemUnmap, PFN_cuMemUnmap_v10020)                                                           \
    X(cuMemSetAccess, PFN_cuMemSetAccess_v10020)                                                   \
    X(cuMemGetAllocationGranularity, PFN_cuMemGetAllocationGranularity_v10020)                     \
    X(cuMemHostAlloc, PFN_cuMemHostAlloc_v2020)                                                    \
    X(cuMemFreeHost, PFN_cuMemFreeHost_v2000)                                                      \
    X(cuMemHostGetDevicePointer_v2, PFN_cuMemHostGetDevicePointer_v3020)                           \
    X(cuStreamCreate, PFN_cuStreamCreate_v2000)                                                    \
    X(cuStreamDestroy_v2, PFN_cuStreamDestroy_v4000)                                               \
    X(cuStreamSynchronize, PFN_cuStreamSynchronize_v2000)                                          \
    X(cuStreamWaitEvent, PFN_cuStreamWaitEvent_v3020)                                              \
    X(cuEventCreate, PFN_cuEventCreate_v2000)                                                      \
    X(cuEventRecord, PFN_cuEventRecord_v2000)                                                      \
    X(cuEventSynchronize, PFN_cuEventSynchronize_v2000)                                            \
    X(cuEventQuery, PFN_cuEventQuery_v2000)                                                        \
    X(cuStreamQuery, PFN_cuStreamQuery_v2000)                                                      \
    X(cuEventDestroy_v2, PFN_cuEventDestroy_v4000)                                                 \
    X(cuFuncGetParamInfo, PFN_cuFuncGetParamInfo_v12040)                                           \
    X(cuKernelGetParamInfo, PFN_cuKernelGetParamInfo_v12040)                                       \
    X(cuFuncLoad, PFN_cuFuncLoad_v12040)                                                           \
    X(cuFuncGetName, PFN_cuFuncGetName_v12030)                                                     \
    X(cuKernelGetName, PFN_cuKernelGetName_v12030)                                                 \
    X(cuEventElapsedTime, PFN_cuEventElapsedTime_v2000)                                            \
    X(cuGetErrorName, PFN_cuGetErrorName_v6000)                                                    \
    X(cuStreamIsCapturing, PFN_cuStreamIsCapturing_v10000)                                         \
    X(cuModuleLoadData, PFN_cuModuleLoadData_v2000)                                                \
    X(cuModuleGetFunction, PFN_cuModuleGetFunction_v2000)

typedef struct ooc_real {
#define HOOK(base, ver, ptds, sym, pfn) pfn sym;
#include "hooks.def"
#undef HOOK
#define OOC_REAL_FIELD(sym, pfn) pfn sym;
    OOC_REAL_EXTRA(OOC_REAL_FIELD)
#undef OOC_REAL_FIELD
} ooc_real_t;

extern ooc_real_t ooc_real OOC_INTERNAL;

/* The real dlsym (never routed to a hook), for the libraries' tables (library.c). */
void *ooc_real_sym(void *handle, const char *name);
/* Registers the router dlsym asks about a name starting with `prefix` (a string that lives
 * forever): given the real answer, our hook for it or NULL (library.c's for cuDNN and blas.c's
 * for cuBLAS, registered when the shim is loaded, from one thread). At most four. */
void ooc_real_route_library(const char *prefix, void *(*router)(void *real, const char *name));

/* Loads the real driver and fills ooc_real, once; returns 0 or OOC_ENOENT when no libcuda.so.1
 * can be opened (then every hook returns CUDA_ERROR_NOT_INITIALIZED). Thread-safe. */
int ooc_real_load(void);

/* Every hook, declared from its driver type so the compiler checks each definition. */
#define HOOK(base, ver, ptds, sym, pfn) extern __typeof__(*(pfn)0) ooc_hook_##sym OOC_INTERNAL;
#include "hooks.def"
#undef HOOK

/* Exports hook ooc_hook_<sym> under the driver's name <sym>, for programs linked with -lcuda.
 * Must follow the hook's definition in the same file. */
/* In a hook: CUDA_ERROR_NOT_INITIALIZED when the real driver, or its entry point `sym`, is
 * missing. */
#define OOC_NEED_REAL(sym)                                                                         \
    do {                                                                                           \
        if (ooc_real_load() != 0 || !ooc_real.sym)                                                 \
            return CUDA_ERROR_NOT_INITIALIZED;                                                     \
    } while (0)

#define OOC_EXPORT_HOOK(sym, pfn)                                                                  \
    extern __typeof__(*(pfn)0) sym __attribute__((alias("ooc_hook_" #sym), visibility("default")))

/* The name of a CUresult, for log lines ("CUDA_ERROR_OUT_OF_MEMORY"). */
const char *ooc_real_errname(CUresult r);

/* ---- init.c: process state ----------------------------------------------------------------------
 */

/* Sets up the device side (VA reservation, pool, swap stream) on the first call that has a
 * current context; prints the start-up line. Returns CUDA_SUCCESS or the error to give the
 * caller. Thread-safe, idempotent. */
CUresult ooc_device_init(void);

/* ---- fnname.c: kernel names ---------------------------------------------------------------- */

/* The name of a kernel (cached; "kernel" when the driver cannot say). Thread-safe. */
const char *ooc_fnname_of(CUfunction f);
/* Every cached name is asked for again (a module was unloaded: a function's handle value may
 * come back as another function); names already returned stay valid. Thread-safe. */
void ooc_fnname_forget(void);

/* ---- mode.c: the mode now ------------------------------------------------------------------- */

/* Reads the configuration once (ooc_real_load calls it first); a bad value stops the program
 * with one line naming the variable, the value and the accepted form. */
void ooc_config_init(void);

/* The configuration in force (after ooc_real_load). */
const ooc_options_t *ooc_opts(void);

/* The shim's mode (OOC_MODE_*); OOC_MODE_OFF until the options are loaded. Cheap: read on every
 * hook. Set when the configuration is loaded. */
extern _Atomic int ooc_mode_now OOC_INTERNAL;
/* The recorder's state, written by record.c. */
enum ooc_rec_state { OOC_REC_OFF, OOC_REC_ON, OOC_REC_DONE };
extern _Atomic int ooc_rec_state OOC_INTERNAL;
/* A plan is being replayed (0 or 1), written by replay.c. */
extern _Atomic int ooc_rp_on OOC_INTERNAL;
/* Is the recorder logging? Is a plan being replayed? (One relaxed atomic load each.) */
int ooc_record_on(void);
int ooc_replay_on(void);

/* ---- the memory layer (mem_int.h lists its files): buffers, chunks and residency ------------- */

/* How an op uses a range (the planner's OOC_ACCESS_* values). */
#define OOC_USE_R  1u
#define OOC_USE_W  2u
#define OOC_USE_RW 3u
/* A query flag: the word the query came from is a kernel parameter word that has held an address
 * in the shim's range with no live buffer there (launch.c). Its buffer is made resident as any
 * other, but is not listed for the op (ooc_mem_op_buffers): a pointer a kernel does not always
 * use, often a stale value, would make the same op look different from one iteration to the
 * next as freed addresses are reused, and no iteration would be found or replayed. */
#define OOC_USE_WEAK 4u

/* What an op may touch, as noted: [lo, hi), or the buffer containing lo when hi == lo. */
typedef struct ooc_query {
    uintptr_t lo, hi;
    unsigned use;  /* OOC_USE_*: a kernel's parameters are RW, a copy's source R */
    uint32_t word; /* 1 + the index of the kernel parameter word it came from; 0: none */
} ooc_query_t;

#define OOC_MAX_REFS 256

/* The kinds of op (the planner's ooc_op_kind_t values). */
enum {
    OOC_OP_KERNEL = 0,
    OOC_OP_MEMCPY = 1,
    OOC_OP_MEMSET = 2,
    OOC_OP_CUDNN = 3,
    OOC_OP_CUBLAS = 4,
    OOC_OP_NCCL = 5
};

/* What one operation is and touches, gathered by launch.c or the copy hooks. */
typedef struct ooc_access {
    ooc_query_t refs[OOC_MAX_REFS];
    unsigned n;
    int overflow; /* more references than fit: all of them could not be made resident */
    /* What the op is, for the recorder. */
    int kind;         /* OOC_OP_* */
    CUfunction fn;    /* kernels */
    const char *name; /* copies and sets: the entry point's name */
    unsigned grid[3], block[3];
    size_t bytes; /* copies and sets */
} ooc_access_t;

/* A buffer the op being issued references (see ooc_mem_op_buffers). */
typedef struct ooc_opbuf {
    uint64_t id; /* the buffer's serial number (never reused) */
    uintptr_t addr;
    uint64_t bytes;
    unsigned use;   /* OOC_USE_*; W only when the op covers the whole buffer */
    uint64_t stamp; /* a small buffer's slab chunk's stamp when listed (fastpath.c); else 0 */
    uint32_t word;  /* the first query's ooc_query_t.word that listed it (0: none) */
} ooc_opbuf_t;

/* Sets up the pool. `safe_loc`, when not NULL, is the host location of host-located VMM memory:
 * swapped chunks are then mapped at their own addresses to their host copies (safe mode). */
int ooc_mem_init(uint64_t budget_bytes, uint64_t chunk_bytes, CUdevice dev, CUcontext ctx,
                 const CUmemLocation *safe_loc);
void ooc_mem_shutdown(void);
/* OOC_REUSE: 1 keeps a freed large buffer's chunks mapped for the next buffer of its size. */
void ooc_mem_set_reuse(int on);
/* OOC_REMAP_GATE: remap behind the device (gate.c). */
void ooc_mem_set_remap_gate(int on);
/* OOC_GATE_TIMEOUT: the gates' watchdog, in seconds (gate.c). */
void ooc_mem_set_gate_timeout(unsigned s);
/* OOC_SAFE_STAGE: safe mode's planned swap-ins staged beside the host alias (stage.c). */
void ooc_mem_set_stage(int on);
/* Safe mode without staging: does a planned swap-in's copy run alone on the device (the work
 * issued before it waited for, every op after it waiting for the copy)? The profile says so to
 * the planner (meta.tsv swapin_exclusive). */
int ooc_mem_swapin_exclusive(void);
/* Safe mode, staged or not: do a swap-out's mapping calls run while nothing computes (mapping the
 * host copy at a chunk's address waits for the device to drain, under the lock)? meta.tsv
 * swapout_exclusive. */
int ooc_mem_swapout_exclusive(void);
/* Safe mode with OOC_REMAP_GATE=1: does a planned swap-in take its memory at the plan's point,
 * behind a gate that every later op waits for (the copies out that free it included)? meta.tsv
 * remap_gate. */
int ooc_mem_remap_gate(void);
/* OOC_SAFE_STAGE: a host-to-device copy of n bytes from src to dst is about to be issued: the
 * buffers of ours whose addresses its words hold (a pointer table) are never staged (stage.c).
 * Copies over OOC_SHADOW_MAX_BYTES are not scanned. Takes mem_lock when a word is ours. */
void ooc_mem_note_stored(uintptr_t dst, const void *src, size_t n);
/* Safe mode: maps the new buffer at p at once (a no-op otherwise). */
void ooc_mem_back_new(uintptr_t p);

/* Allocates `size` bytes at a stable address; on the device only when first used. */
CUresult ooc_mem_alloc(CUdeviceptr *out, size_t size, uint64_t *id);
/* The same for the shim's own buffers: small ones never share a chunk with the program's. */
CUresult ooc_mem_alloc_own(CUdeviceptr *out, size_t size);
/* The chunks the live buffers at addrs[0..n) span together (a slab chunk shared by several counts
 * once; an address in no live buffer counts nothing), and the budget in chunks. 0, or -1 when
 * out of host memory. Takes mem_lock. */
int ooc_mem_span(const uintptr_t *addrs, unsigned n, uint64_t *chunks, uint64_t *budget_chunks);
/* Frees a buffer without synchronising: its memory is reused after its users' work completes.
 * `stream` is the stream of a cuMemFreeAsync, or NULL. Returns CUDA_ERROR_INVALID_VALUE when
 * p is not the start of a live buffer of ours. */
CUresult ooc_mem_free(CUdeviceptr p, CUstream stream, uint64_t *id);
/* Is p inside the shim's reservation? (Cheap; no lock.) */
int ooc_mem_owns(uintptr_t p);
/* In a forked child (init.c's atfork handler): nothing is ours any more (ooc_mem_owns answers
 * 0), so every call passes through to the driver and none takes a lock of ours, which a thread
 * of the parent that does not exist in the child may hold. */
void ooc_mem_forget_in_child(void);
/* The live buffer containing p: its start and size; -1 if none. */
int ooc_mem_lookup(uintptr_t p, uintptr_t *base, size_t *size);
/* Notes, in a, the buffer of every TMA descriptor (tensormap.c) among the 64-byte-aligned
 * 128-byte slices of the n parameter bytes at p, which start at offset `off` of the parameter
 * space. Cheap when no descriptor was encoded. */
void ooc_tmap_scan(const unsigned char *p, size_t n, size_t off, ooc_access_t *a);
/* Graphs built node by node (graph.c): node `node` of graph g added with access set a; a child
 * graph added to g; new parameters of node `node` of its graph (what it touches replaced), or of
 * executable graph e (replacing its earlier update). a NULL: the node touches nothing.
 * CUDA_SUCCESS, or CUDA_ERROR_OUT_OF_MEMORY (logged) when what the node touches could not be
 * kept. */
CUresult ooc_graph_node_added(CUgraph g, CUgraphNode node, const ooc_access_t *a);
CUresult ooc_graph_child_added(CUgraph g, CUgraph child);
CUresult ooc_graph_node_params(CUgraphNode node, const ooc_access_t *a);
CUresult ooc_graph_exec_node_params(CUgraphExec e, CUgraphNode node, const ooc_access_t *a);
/* What the driver would say of the live buffer containing p (pointer attributes). */
typedef struct ooc_bufinfo {
    uintptr_t base;
    size_t size;
    uint64_t id; /* the buffer's serial number, never reused */
    CUcontext ctx;
    CUdevice dev;
} ooc_bufinfo_t;
/* 0 with *out filled, or -1 when no live buffer contains p. */
int ooc_mem_bufinfo(uintptr_t p, ooc_bufinfo_t *out);
/* The live buffer a kernel's parameter word p stands for: the buffer containing p or, when
 * none does, the buffer ending exactly at p (an end pointer). Returns how many (0 or 1; the
 * arrays leave room for a rule that could name two). */
unsigned ooc_mem_lookup_word(uintptr_t p, uintptr_t base[2], size_t size[2]);
/* The driver's rule for a copy's or a set's device range, which the driver itself cannot apply
 * to the shim's memory (adjacent buffers are one mapping to it): [p, p + n) must lie in one live
 * buffer when it touches the shim's reservation. CUDA_SUCCESS, or CUDA_ERROR_INVALID_VALUE
 * (logged as a warning naming `call`). No effect on anything. */
CUresult ooc_mem_check_range(const char *call, uintptr_t p, size_t n);
/* Notes the buffer containing p (if ours) in the access set, used read-write, or the buffer
 * that ends exactly at p (an end pointer); takes no lock. */
void ooc_mem_note(ooc_access_t *a, uintptr_t p);
/* The same for a kernel parameter word: `word` is 1 + its index in the parameter bytes; `weak`
 * adds OOC_USE_WEAK (a query noted by a weak word and a strong one is strong). */
void ooc_mem_note_word(ooc_access_t *a, uintptr_t p, uint32_t word, int weak);
/* What the lone-word queries of this thread's last op (ooc_mem_op_pin) met: per query index, the
 * start of the live buffer the word pointed into, or 0 for none (a dangling word); queries not
 * from a parameter word have base 0 and are ignored (their `word` is 0). NULL when the last op
 * of this thread listed nothing since the previous call (the fast path, or neither recording
 * nor replaying: only listed ops need it); the call consumes it. */
typedef struct ooc_word_hit {
    uintptr_t base;
} ooc_word_hit_t;
const ooc_word_hit_t *ooc_mem_op_word_hits(void);
/* Notes every buffer of ours that [p, p + n) overlaps, used as `use` (OOC_USE_*); no lock. */
void ooc_mem_note_range(ooc_access_t *a, uintptr_t p, size_t n, unsigned use);

/* The buffers the op between ooc_mem_op_pin and ooc_mem_op_release references, each once, in
 * the order of its queries; valid until ooc_mem_op_release. Listed only while the recorder is on
 * (nobody else needs them, and the launch path should not pay for them). */
size_t ooc_mem_op_buffers(const ooc_opbuf_t **out);

/* Residency of one op, in the phases that op.c sequences around the plan's actions (the
 * residency lock is held from the start of op_pin to the end of op_release, whatever the
 * results):
 * - op_pin takes the lock, resolves the access set to buffers (listed for the recorder and the
 *   plan when *listed is set on return), pins their chunks for this op and waits for the planned
 *   swap-ins of them still queued for the worker. CUDA_SUCCESS, CUDA_ERROR_OUT_OF_MEMORY, or
 *   CUDA_ERROR_DEINITIALIZED after ooc_mem_shutdown (the process is exiting: the pool is gone).
 * - op_resident makes the pinned chunks resident on stream s (ooc_stream_of's), evicting others
 *   if it must; the stream waits for the copies
 *   that bring them. CUDA_SUCCESS, CUDA_ERROR_OUT_OF_MEMORY (logged with what was resident) or
 *   the driver's error.
 * - op_issued notes that the op was issued on s (if issued); op_release releases the
 *   lock. */
CUresult ooc_mem_op_pin(const ooc_access_t *a, int *listed);
CUresult ooc_mem_op_resident(CUstream s);
void ooc_mem_op_issued(CUstream s, int issued);
void ooc_mem_op_release(void);
/* A library call (library.c) runs kernels that reach its operands through memory no hook sees,
 * with the residency lock released. Between ooc_mem_op_resident and ooc_mem_op_release, op_hold
 * marks the op's chunks held: no eviction, planned swap-out or drop takes them until op_unhold
 * (under the residency lock again) releases them. *idx (malloc'd, given to op_unhold) names
 * them. CUDA_SUCCESS or CUDA_ERROR_OUT_OF_MEMORY. */
CUresult ooc_mem_op_hold(uint64_t **idx, size_t *n);
void ooc_mem_op_unhold(uint64_t *idx, size_t n);
/* Residency alone, for the shim's own ops (ooc_internal_op: a verification, a rebuild), which are
 * neither recorded nor matched against a plan: ooc_mem_begin is op_pin then op_resident (the
 * lock is held on return, whatever the result, until ooc_mem_end); ooc_mem_end is op_issued
 * then op_release. */
CUresult ooc_mem_begin(const ooc_access_t *a, CUstream s);
void ooc_mem_end(const ooc_access_t *a, CUstream s, int issued);

/* The lock-free fast path (fastpath.c). ooc_mem_fast_begin returns 1 when the op
 * may be issued without the residency lock: every chunk it references is resident and stable
 * (hot) with the op's stream among its users, and neither recording nor replay is on. The
 * caller then issues it and calls ooc_mem_fast_end (issued: the real call succeeded) on the same
 * thread, with nothing in between that could wait for the residency lock. On 0 the caller takes
 * the locked path (ooc_mem_begin). Thread-safe; takes no lock. */
int ooc_mem_fast_begin(const ooc_access_t *a, CUstream s);
/* The same in three steps, for a replayed op that replay.c matches to the plan without the lock:
 * ooc_mem_fast_enter checks the chunks as ooc_mem_fast_begin does, but while replay is on (never
 * while recording) and without counting the op; on 1 the caller is in the fast path's reader
 * section and ends it with ooc_mem_fast_end in any case (issued 0 when the op then takes the
 * locked path). Inside it, ooc_mem_fast_list lists in v[*n] (at most cap) the buffers that
 * ooc_mem_op_buffers would list for the op, from the chunks alone and from cand[nc], buffers
 * listed earlier (with their stamps) that may still be live: 0 when it cannot tell (a slab
 * address in none of them, more than cap). */
int ooc_mem_fast_enter(const ooc_access_t *a, CUstream s);
int ooc_mem_fast_list(const ooc_access_t *a, const ooc_opbuf_t *cand, size_t nc, ooc_opbuf_t *v,
                      size_t cap, size_t *n);
void ooc_mem_fast_end(int issued);
/* Enables the fast path once the device is set up (and recording started, if it is). */
void ooc_mem_fast_enable(void);
/* Waits until no fast-path op that began before the call is still running: called after
 * recording or replay is switched on, so that every later op sees it. ooc_mem_l_quiesce is the
 * same for a caller that holds the residency lock (it lasts until the lock is released). */
void ooc_mem_quiesce(void);
void ooc_mem_l_quiesce(void);

/* The program's own device-located cuMemCreate: counted against the budget (the pool shrinks,
 * swapping out if it must, before the real call); OUT_OF_MEMORY when less than one chunk of the
 * budget would be left. ooc_mem_external_release forgets a handle after its real release (no-op
 * for handles not made that way). Thread-safe. */
CUresult ooc_mem_external_create(CUmemGenericAllocationHandle *h, size_t size,
                                 const CUmemAllocationProp *prop, unsigned long long flags);
void ooc_mem_external_release(CUmemGenericAllocationHandle h);

/* Logs, once, what may explain a CUDA_ERROR_ILLEGAL_ADDRESS (no-op for other results): which
 * buffers were swapped out with no host alias. Thread-safe. */
void ooc_mem_report_fault(CUresult r);

/* For cuMemGetInfo: the budget, and the bytes of it that cannot be made free (the program's own
 * VMM memory). */
void ooc_mem_info(uint64_t *budget, uint64_t *held);

/* Measures the bandwidth of the swap path (pinned or host-located memory to and from device
 * chunks) at copies of `bytes` bytes (at most one chunk), repeated: bytes per second one way each,
 * and in total with both directions at once, each the median of five timed batches. Borrows one
 * physical chunk (swapping one out if the pool is full). Returns CUDA_SUCCESS or the driver's
 * error. Thread-safe. */
CUresult ooc_mem_measure_bw(uint64_t bytes, double *h2d_bps, double *d2h_bps, double *bidir_bps);
/* The host time of the driver's mapping calls per chunk (the mean of 16 cycles on a scratch
 * chunk, those over twice the median cycle left out): *vmm->in_ns for those that bring a swapped
 * chunk back (in safe mode with the unmap of its host alias), *vmm->out_ns for those after a copy
 * out (in safe mode with mapping the alias); of these, *vmm->map_ns for mapping a device chunk and
 * setting its access, *vmm->unmap_ns for unmapping one (what a new buffer's first use and a free
 * cost). In safe mode with staging (OOC_SAFE_STAGE=1), a planned swap-in makes other calls:
 * *vmm->stage_ns for staging a chunk (mapping its memory at a spare address, making the host
 * alias read-only), *vmm->adopt_ns for moving it at its first use (unmapping the alias and the
 * spare address, mapping the memory at the chunk's address); both 0 otherwise. */
typedef struct ooc_vmm_times {
    uint64_t in_ns, out_ns, map_ns, unmap_ns;
    uint64_t stage_ns, adopt_ns;
} ooc_vmm_times_t;
CUresult ooc_mem_measure_vmm(ooc_vmm_times_t *vmm);

/* The chunk size and the budget in force. */
void ooc_mem_geometry(uint64_t *chunk_bytes, uint64_t *budget_bytes);

/* Chunks in use as shared slabs for small buffers (memory a plan cannot place). */
uint64_t ooc_mem_slab_chunks(void);

/* Planned transfers, for replay.c. ooc_mem_replay_init starts the host-to-device and
 * device-to-host streams and the worker thread (0, or -1 when they cannot be made). The
 * ooc_mem_l_* functions are called with the residency lock held, from ooc_replay_op_begin and
 * ooc_replay_op_end; they act on the buffer at addr only while it is still serial `id` and owns
 * whole chunks (small buffers are left to demand residency), and never block:
 * - swapout: after the op just issued on s, copy the buffer's resident chunks to host on the
 *   device-to-host stream; the worker unmaps them when the copy is done. Returns chunks moved.
 * - prefetch: queue the swap-in of its swapped chunks for the worker, which starts it when the
 *   work issued so far on s is done (the plan's point in device time, not the host's, which runs
 *   ahead): mapping, then the copy on the host-to-device stream. An op that uses a queued chunk
 *   waits for the worker, then its stream waits for the copy. A chunk whose swap-out is still
 *   under way simply stays. Returns chunks queued.
 * - drop: the buffer is dead until freed: its chunks are the first to evict. */
int ooc_mem_replay_init(double h2d_bps);
unsigned ooc_mem_l_swapout(uintptr_t addr, uint64_t id, CUstream s);
unsigned ooc_mem_l_prefetch(uintptr_t addr, uint64_t id, CUstream s);
void ooc_mem_l_drop(uintptr_t addr, uint64_t id);
/* Recompute (replay.c; residency lock held, same buffer rules as above):
 * - discard (on = 1): the buffer's bytes will be rebuilt, not needed: its resident chunks are the
 *   first to evict and are evicted without a copy (they become EMPTY); returns 1, or 0 when the
 *   buffer is not one the plan acts on. on = 0 cancels: chunks still resident keep their bytes
 *   and are evicted with a copy again. A chunk an op uses, or that is mapped again, is no longer
 *   discarded.
 * - lost: 1 when some chunk of the buffer lost its bytes to a discarding eviction (or the
 *   buffer is gone), 0 when every byte is still resident or on the host.
 * - include: called from ooc_replay_op_begin only (between ooc_mem_op_pin and
 *   ooc_mem_op_resident): adds the chunks of buffer (addr, id), any size, to the op's, so that
 *   they are resident (an EMPTY chunk mapped without a copy) and used by the op's stream. 0, or
 *   -1 when the buffer is gone or memory ran out. */
int ooc_mem_l_discard(uintptr_t addr, uint64_t id, int on);
int ooc_mem_l_lost(uintptr_t addr, uint64_t id);
int ooc_mem_l_include(uintptr_t addr, uint64_t id);
/* Calls fn for every live buffer (for a new recording). Caller holds the residency lock. */
void ooc_mem_l_each_buffer(void (*fn)(uint64_t id, uintptr_t addr, uint64_t bytes, void *ctx),
                           void *ctx);

/* ---- op.c: the sequence of one operation ----------------------------------------------------- */

/* The stream an op runs on: `stream`, whose NULL means this thread's per-thread stream when the
 * entry point was a per-thread one (_ptsz, _ptds). Every stream below the hooks is this one. */
static inline CUstream ooc_stream_of(CUstream stream, int per_thread) {
    return (per_thread && stream == NULL) ? CU_STREAM_PER_THREAD : stream;
}

/* One operation of the program between ooc_op_begin and ooc_op_end (on the caller's stack). */
typedef struct ooc_live_op {
    const ooc_access_t *a;
    CUstream s;     /* ooc_stream_of(stream, per_thread) */
    int fast;       /* issued on the lock-free path */
    int rec;        /* logged by the recorder */
    int began;      /* made resident: the real call is issued */
    int token;      /* the recorder's */
    int nested;     /* issued inside a library call (ooc_lib_depth): residency only */
    uint64_t *held; /* a library call's held chunks (ooc_mem_op_hold) */
    size_t nheld;
} ooc_live_op_t;

/* Library calls (cuDNN, library.c) this thread is inside: the driver calls a library makes are
 * not operations of the program but parts of the library's (ooc_op_lib_begin), made resident
 * and issued, neither recorded nor matched against a plan. */
extern _Thread_local int ooc_lib_depth OOC_INTERNAL;

/* Before the real call of an op that touches what `a` notes, on `stream` (whose NULL means the
 * per-thread stream when per_thread is set): record, replay and residency in that order (op.c).
 * Returns CUDA_SUCCESS when the caller may issue the call; either way the caller then calls
 * ooc_op_end with the call's result (or this error) and returns what it returns. Thread-safe;
 * the residency lock may be held from one to the other. */
CUresult ooc_op_begin(ooc_live_op_t *op, const ooc_access_t *a, CUstream stream, int per_thread);
CUresult ooc_op_end(ooc_live_op_t *op, CUresult r);
/* The same for a library call (library.c) whose operands `a` notes, on `stream`: one operation of
 * the program, recorded and matched like any other, whose real call runs without the residency
 * lock (the library's own driver calls take it) while its chunks are held (ooc_mem_op_hold).
 * Between the two the caller raises ooc_lib_depth around the real call. Never the fast path. */
CUresult ooc_op_lib_begin(ooc_live_op_t *op, const ooc_access_t *a, CUstream stream);
CUresult ooc_op_lib_end(ooc_live_op_t *op, CUresult r);

/* ---- shadow.c: the host's copy of small ranges the program wrote from the host ----------------
 */

/* The largest copy whose bytes are kept (a pointer array of 8192 addresses). */
#define OOC_SHADOW_MAX_BYTES (64u << 10)
/* Slots held: while 0, ooc_shadow_forget need not be called. */
extern _Atomic unsigned ooc_shadow_held OOC_INTERNAL;
/* What a copy tells shadow.c: OOC_SH_H2D its bytes, OOC_SH_D2D a kept source's bytes,
 * OOC_SH_ANY (cuMemcpy, cuMemcpyAsync) the latter when the source is ours (a host source, or
 * device memory not ours, is not told); OOC_SH_NONE nothing (the op dropped what its destination
 * held, op.c). */
enum { OOC_SH_NONE, OOC_SH_H2D, OOC_SH_D2D, OOC_SH_ANY };
/* Before a copy of n bytes from src to dst is run (no lock held): the buffer of ours [buf[0],
 * buf[1]) that dst lies in, or buf[0] == 0 when there is nothing to keep. */
void ooc_shadow_buffer(int how, uintptr_t dst, uintptr_t src, size_t n, uintptr_t buf[2]);
/* The copy's call, which returned r: when it was issued, what it wrote is kept (not while a graph
 * is captured). Takes no lock of the memory layer (the caller may hold the residency lock).
 * Returns r. */
CUresult ooc_shadow_after(int how, CUresult r, uintptr_t dst, uintptr_t src, size_t n,
                          const uintptr_t buf[2]);
/* Before an op of the program (not a library's own) is issued: drops every slot it may write. */
void ooc_shadow_forget(const ooc_access_t *a);
/* Before an op whose access is not known (an executable graph the shim did not follow): drops
 * every slot. */
void ooc_shadow_forget_all(void);
/* Before the buffer at p is freed: drops its slots. */
void ooc_shadow_freed(uintptr_t p);
/* Copies [p, p + n) to out when one slot holds it all: 1, else 0 (read it from the device). */
int ooc_shadow_read(uintptr_t p, void *out, size_t n);

/* ---- library.c: library calls (cuDNN, and cuBLAS in blas.c) as operations -------------------- */

/* Is a library call now an operation of ours: memory managed, the hooks on (not
 * OOC_TEST_LIB_HOOKS=0), not inside another library call on this thread? */
int ooc_lib_on(void);
/* Notes the buffer holding p (if any) as read (in) or read and written (out). */
void ooc_lib_in(ooc_access_t *a, const void *p);
void ooc_lib_out(ooc_access_t *a, const void *p);
/* Before a library call whose operands (and kind, name) `a` notes, on stream s: OOC_LIB_RUN
 * (made resident and held: make the real call, then ooc_lib_done with its success), OOC_LIB_AS_IS
 * (s captures: the operands went to the capture; make the call, nothing after) or OOC_LIB_FAIL
 * (logged; *err says why: return the library's error without calling). */
enum { OOC_LIB_RUN = 0, OOC_LIB_AS_IS = 1, OOC_LIB_FAIL = 2 };
int ooc_lib_enter(ooc_live_op_t *op, const ooc_access_t *a, CUstream s, CUresult *err);
void ooc_lib_done(ooc_live_op_t *op, int ok);
/* Before the program unloads a module or library (hooks.c; no lock held): every function of it
 * may be gone and its handle value reused. Dropped buffers are rebuilt now, while their
 * producers still exist (replay.c); then, under the residency lock, the plan is given up and the
 * iteration is recorded again (a recording under way starts again); kernel names and
 * verification results are forgotten. Thread-safe. */
void ooc_op_functions_gone(void);
/* The public marker: an iteration ends here (exported; op.c). */
OOC_EXPORT void ooc_mark_iteration(void);

/* ---- record.c: the recorder ----------------------------------------------------------------- */

/* Starts recording (OOC_MODE=record): from now on every op, allocation and free is logged until
 * the profile is written. Called once, at device set-up. */
void ooc_record_start(void);
/* Allocation and free of buffer `id` (ooc_mem_alloc's serial number). Thread-safe. */
void ooc_record_alloc(uint64_t id, uint64_t bytes);
void ooc_record_free(uint64_t id);
/* Around an op's issue, inside ooc_op_begin/ooc_op_end (the residency lock is held, which
 * orders ops): op_begin records the start event on the op's stream and returns a token;
 * op_end logs the op and its buffers, and marks the recording pending once it is complete. */
int ooc_record_op_begin(CUstream s);
void ooc_record_op_end(int token, const ooc_access_t *a, CUstream s, int issued);
/* Has the recorder seen enough iterations? Then the caller calls ooc_record_finish before
 * the next op (outside the residency lock). */
int ooc_record_pending(void);

/* The program's iteration marker, for the recorder (op.c's ooc_mark_iteration calls it). */
void ooc_record_mark(void);

/* Writes the profile (once) and stops recording. In OOC_MODE=auto returns the profile (the
 * caller's from now on: op.c plans and replays it), its directory in dir (OOC_PATH_MAX bytes)
 * and the position in the iteration of the op the program issues next; NULL otherwise. Also
 * called at exit (nothing is planned then): a program that ended before enough iterations gets
 * the profile of what was found, or a line saying why not. */
ooc_profile_t *ooc_record_finish(char *dir, uint32_t *pos);
void ooc_record_finish_at_exit(void);
/* Starts a new recording (OOC_MODE=auto, after repeated divergence): every live buffer is
 * taken as existing before the first op. Caller holds the residency lock. */
void ooc_record_restart_l(void);
/* A module is being unloaded (op.c; residency lock held): what was verified is forgotten. A
 * recording under way, whose ops may name the unloaded functions, starts again, as it does when
 * `plan_dropped` (the plan in force was just given up). */
void ooc_record_functions_gone_l(int plan_dropped);

/* ---- replay_plan.c: where the plan comes from ------------------------------------------------ */

/* Plans the recorded profile p (owned from now on) under the budget with OOC_POLICY and
 * OOC_WINDOW, writes dir/plan.tsv, logs the summary and replays it from op `pos` of the
 * iteration (the next op the program issues). Without a feasible plan the shim stays in demand
 * mode and says why. Called outside the residency lock. */
void ooc_replay_plan(ooc_profile_t *p, const char *dir, uint32_t pos);
/* Replays the saved plan OOC_PLAN (its profile is the directory the file is in). Returns 0, or
 * -1 after logging why the files cannot be used. */
int ooc_replay_load(const char *plan_path);
/* replay_match.c: kernel op o of profile p against the live op a with its n buffers b, whose
 * buffers differ: 1 when they differ only by stale parameter words (the live ones are then
 * marked weak; see replay_match.c), keep[0..o->nref) then holding the live buffer that lines up
 * with each of the plan's (id 0: none); else 0. bound[j]: the id the plan's ref j is bound to
 * in this iteration (0: not yet). Caller holds the replay's lock. */
int ooc_replay_match_stale(const ooc_profile_t *p, const ooc_op_t *o, const uint64_t *bound,
                           const ooc_access_t *a, const ooc_opbuf_t *b, size_t n,
                           ooc_opbuf_t *keep);
/* replay_match.c: writes into why[n] how the live op's nb buffers b differ in number from plan op
 * o of profile p: both lists of sizes (the first 12 of each). Returns 0. */
int ooc_replay_say_sizes(char *why, size_t n, const ooc_opbuf_t *b, size_t nb,
                         const ooc_profile_t *p, const ooc_op_t *o);

/* ---- replay.c: the plan, followed op by op --------------------------------------------------- */

/* Starts the transfer worker, then replays plan pl of profile p (both owned from now on) from op
 * `pos`. Logs and frees them when the worker cannot start. Called outside the residency lock. */
void ooc_replay_go(ooc_profile_t *p, ooc_plan_t *pl, uint32_t pos);
/* Around each op, with the residency lock held: begin matches the op against the plan (its
 * signature and its buffers) and issues the plan's actions before it; end, once the op was
 * issued on s, those after it. begin returns OOC_REPLAY_RERECORD when the program's iteration
 * no longer matches the plan persistently: the replay has stopped and the caller starts a new
 * recording (ooc_record_restart_l, before releasing the residency lock); else 0. */
enum { OOC_REPLAY_RERECORD = 1 };
int ooc_replay_op_begin(const ooc_access_t *a, const ooc_opbuf_t *b, size_t nb, CUstream s);
void ooc_replay_op_end(CUstream s);
/* The lock-free match, inside the fast path's reader section (ooc_mem_fast_enter):
 * ooc_replay_fast_next returns 1 when the plan's next op (*pos) has no action of the plan before
 * or after it, no rebuild is pending, and the plan bound every buffer it references already;
 * those buffers go to cand[*nc] (at most cap) for ooc_mem_fast_list. ooc_replay_fast then
 * returns 1 when the op, with buffers b[nb], is that op: the plan moves on past it and the
 * caller issues it. On 0 from either, the op takes the locked path (ooc_replay_op_begin). */
int ooc_replay_fast_next(ooc_opbuf_t *cand, size_t cap, size_t *nc, uint32_t *pos);
int ooc_replay_fast(const ooc_access_t *a, const ooc_opbuf_t *b, size_t nb, uint32_t pos);
/* After ooc_mem_begin returned r for an op, before the op is issued (residency lock held):
 * issues, on the op's stream, the producers of the dropped buffers that ooc_replay_op_begin
 * queued to be rebuilt before it. Returns r, or the error of a producer's launch (the op is then
 * not issued). When r is an error nothing is launched: the rebuilds wait for a later op.
 * ooc_replay_rebuilds is not 0 while some are queued (one relaxed load on the op path). */
extern _Atomic int ooc_replay_rebuilds OOC_INTERNAL;
CUresult ooc_replay_op_ready(CUresult r, CUstream s);
/* Before the program frees buffer p (not under the residency lock): a dropped buffer whose
 * producers read p is rebuilt, or kept, first. */
void ooc_replay_before_free(CUdeviceptr p, CUstream s);
/* The program's iteration marker. */
void ooc_replay_mark(void);
/* Stops replaying (at exit). */
void ooc_replay_stop(void);
/* Before a module or library is unloaded (op.c; no lock held): every dropped buffer is rebuilt
 * now, while its producers' functions still exist, through ops of the shim's own
 * (OOC_OWN_SETTLE). Thread-safe. */
void ooc_replay_settle_all(void);
/* Then (op.c; residency lock held): the plan in force, if any, is given up. Returns whether one
 * was. Thread-safe. */
int ooc_replay_give_up_l(void);

/* ---- launch.c: what a kernel touches ------------------------------------------------------- */

/* Adds every buffer a launch's parameters point into. */
void ooc_launch_access(CUfunction f, void **params, void **extra, ooc_access_t *a);
/* The parameter layout of f (cached): *n parameters at offsets off[] of sizes size[]. 0, or -1
 * when the driver cannot say. The arrays live as long as the process. Thread-safe. */
int ooc_launch_layout(CUfunction f, unsigned *n, const uint32_t **off, const uint32_t **size);
/* Learns from what a's parameter words met (ooc_mem_op_word_hits) which words of f are stale,
 * and marks them weak: from the next launch on, their queries carry OOC_USE_WEAK. */
void ooc_launch_learn_words(CUfunction f, const ooc_access_t *a, const ooc_word_hit_t *hits);
/* Is query i of launch a a parameter word that can be marked weak (a pointer word within the
 * first bytes that have weak bits, not weak already)? */
int ooc_launch_word_learnable(const ooc_access_t *a, unsigned i);
/* The replay found kernel op a's buffers differing from its plan's op through the parameter
 * words words[0..n) (ooc_query_t.word values: stale bytes of a parameter block, or a pointer the
 * kernel does not always use): marks them weak in a's function, logging each new one with `why`
 * (what the word did). 0, or -1 (nothing marked) when a has no layout or a word has no weak bit.
 * With `why` NULL it only says whether it could mark them all (0) and marks nothing. Thread-safe.
 */
int ooc_launch_weaken(const ooc_access_t *a, const uint32_t *words, size_t n, const char *why);
/* Every cached layout is asked for again before its next use (a module was unloaded: its
 * functions' handle values may come back as other functions). Thread-safe, lock-free. */
void ooc_launch_forget_layouts(void);

/* ---- recompute.c: producers verified by checksum, and re-launched ---------------------------- */

/* Which driver entry point a kernel launch came through (and is issued again through). */
typedef enum ooc_launch_kind {
    OOC_LAUNCH_KERNEL = 0,      /* cuLaunchKernel */
    OOC_LAUNCH_KERNEL_EX = 1,   /* cuLaunchKernelEx (its CUlaunchConfig) */
    OOC_LAUNCH_COOPERATIVE = 2, /* cuLaunchCooperativeKernel */
} ooc_launch_kind_t;

/* A kernel launch as the program issues it (hooks.c), borrowed for the duration of the hook. */
typedef struct ooc_launch {
    CUfunction fn;
    unsigned grid[3], block[3], shared;
    ooc_launch_kind_t kind;
    const CUlaunchConfig *cfg;
    void **params, **extra;
} ooc_launch_t;

/* The launch being issued on this thread, between launch_op's start and end; NULL otherwise
 * (copies, graph launches). replay.c saves it when the op is a producer of the plan. */
extern _Thread_local const ooc_launch_t *ooc_launch_now OOC_INTERNAL;
/* Whose op this thread is issuing: the program's (OOC_OWN_NONE), or the shim's own work through
 * ooc_mem_begin/ooc_mem_end, which replay.c does not match against the plan: a verification
 * (OOC_OWN_VERIFY, recompute.c) or a rebuild (OOC_OWN_REBUILD, replay.c: the recipes it touches
 * are still settled first). */
enum ooc_internal_op {
    OOC_OWN_NONE = 0,
    OOC_OWN_VERIFY = 1,
    OOC_OWN_REBUILD = 2,
    OOC_OWN_SETTLE = 3 /* ooc_replay_settle_all: settles one pending recipe, whatever it touches */
};
extern _Thread_local int ooc_internal_op OOC_INTERNAL;

/* A copy of a launch that can be issued again: its parameter bytes are owned. */
typedef struct ooc_saved_launch {
    CUfunction fn;
    unsigned grid[3], block[3], shared;
    ooc_launch_kind_t kind;
    CUlaunchConfig cfg; /* OOC_LAUNCH_KERNEL_EX, attrs copied below */
    CUlaunchAttribute attrs[8];
    int packed; /* the parameters came packed in `extra` */
    unsigned nparams;
    unsigned char *bytes; /* the parameter bytes */
    size_t nbytes, cap;
    void **ptrs; /* kernelParams into bytes */
    size_t cap_ptrs;
    uint32_t *off, *size; /* per parameter (kernelParams) */
} ooc_saved_launch_t;

/* Copies launch l into s (reusing s's memory). 0, or -1 (out of memory, no layout, or launch
 * attributes that do not fit) with s empty. */
int ooc_launch_save(const ooc_launch_t *l, ooc_saved_launch_t *s);
/* Replaces every aligned 8-byte parameter word in [from, from + bytes) with the same offset
 * from `to`. Returns how many words were replaced. */
unsigned ooc_launch_subst(ooc_saved_launch_t *s, uintptr_t from, uint64_t bytes, uintptr_t to);
/* Issues s on stream st through the real driver. */
CUresult ooc_launch_issue(const ooc_saved_launch_t *s, CUstream st);
void ooc_launch_saved_free(ooc_saved_launch_t *s);

/* Verification while recording, around a kernel launch (launch_op): pre takes what must be seen
 * before the launch (checksums of the buffers it references, once per kind of launch); post, once
 * the launch was issued (r), re-launches it into scratch memory for each buffer it is the first
 * to write, and compares. Between them the recorder calls ooc_verify_note. v lives on the
 * caller's stack. Cheap when the recorder is off. Thread-safe. */
typedef struct ooc_verify {
    int on;
    uint64_t key;
    unsigned n;
    uintptr_t *addr;
    uint64_t *size;
    uint64_t *pre; /* checksums before the launch, NULL when not taken */
} ooc_verify_t;
void ooc_verify_pre(ooc_verify_t *v, const ooc_launch_t *l, const ooc_access_t *a, CUstream s);
void ooc_verify_post(ooc_verify_t *v, const ooc_launch_t *l, CUstream s, CUresult r);
/* The recorder, logging the op being verified on this thread (inside ooc_record_op_end): the
 * key it files the op under (0 when none), and its buffers with, for each, whether this op is
 * the first since its allocation to use it. */
uint64_t ooc_verify_key(void);
void ooc_verify_note(const ooc_opbuf_t *b, size_t nb, const uint8_t *first);
/* What verification found for an op of kind `key` with nref references (build time): acc[r]
 * refined to OOC_USE_R (it never changed the buffer), OOC_USE_W (its re-launch rewrote all of it,
 * whatever was there before, with the same bytes) or left as is; prod[r] 1 when it is a verified
 * producer of reference r. Returns 0, or -1 when nothing is known (acc and prod unchanged). */
int ooc_verify_lookup(uint64_t key, uint32_t nref, uint8_t *acc, uint8_t *prod);
/* Forgets what was verified (a new recording). */
void ooc_verify_reset(void);

/* ---- graph.c: stream capture and graph launches ---------------------------------------------- */

/* Stream captures the shim follows (begun and not seen to end). An op's hook reads it (one
 * relaxed load) and asks ooc_graph_capture_note only when it is not zero. */
extern _Atomic unsigned ooc_graph_captures OOC_INTERNAL;

/* The lock of graph.c's state. The hooks hold it across the real call that begins or ends a
 * capture, instantiates or destroys, and call the functions below marked "locked" inside it. */
void ooc_graph_lock(void);
void ooc_graph_unlock(void);

/* Locked, before a real cuStreamBeginCapture on `stream` (NULL with per_thread: the calling
 * thread's per-thread stream): CUDA_SUCCESS when the capture can be followed, else
 * CUDA_ERROR_OUT_OF_MEMORY (logged; the capture must not begin). Locked, after it succeeded:
 * ooc_graph_capture_started follows the capture from now on; `into` is the graph a
 * cuStreamBeginCaptureToGraph appends to (NULL for a capture into a new graph): what the capture
 * touches is then added to what that graph already touches. */
CUresult ooc_graph_capture_room(CUstream stream, int per_thread);
void ooc_graph_capture_started(CUstream stream, int per_thread, CUgraph into);

/* For an op about to be issued on `stream` with access set `a` (NULL: only asks): when the
 * stream is capturing, notes the op's queries in the capture, sets *capturing and returns
 * CUDA_SUCCESS; the caller then issues the op without making anything resident. *capturing is 0
 * when the stream does not capture. Any other result (logged) is the op's: it is not issued.
 * Takes the lock itself. Thread-safe. */
CUresult ooc_graph_capture_note(const ooc_access_t *a, CUstream stream, int per_thread,
                                int *capturing);

/* Locked, after the real cuStreamEndCapture returned r and *graph: the capture's queries belong
 * to the graph from now on. Returns r, or CUDA_ERROR_OUT_OF_MEMORY (logged) after destroying the
 * graph when they could not be kept. */
CUresult ooc_graph_capture_ended(CUstream stream, int per_thread, CUresult r, CUgraph *graph);

/* Locked, after a real instantiation of `graph` succeeded: `exec` gets a copy of its queries.
 * Returns CUDA_SUCCESS, or CUDA_ERROR_OUT_OF_MEMORY (logged) after destroying exec. */
CUresult ooc_graph_instantiated(CUgraph graph, CUgraphExec exec);

/* Locked, after a real destroy succeeded: forgets the graph's or executable graph's queries. */
void ooc_graph_destroyed(CUgraph graph);
void ooc_graph_exec_destroyed(CUgraphExec exec);

/* cuGraphExecUpdate, both locked around the real call. ooc_graph_update_prepare copies the
 * queries of the source graph `graph` before the driver is asked, so that running out of host
 * memory refuses the update while nothing changed: CUDA_SUCCESS (*u set, NULL for a graph the
 * shim learned nothing of), or CUDA_ERROR_OUT_OF_MEMORY (logged). ooc_graph_update_done, after
 * the real call returned r: when r is CUDA_SUCCESS, exec's queries become that copy (its kernel
 * nodes' own updates are dropped, and a graph learned of nothing leaves exec unlearned);
 * otherwise exec keeps its own. Frees u either way. */
typedef struct ooc_graph_update ooc_graph_update_t;
CUresult ooc_graph_update_prepare(CUgraph graph, ooc_graph_update_t **u);
void ooc_graph_update_done(ooc_graph_update_t *u, CUgraphExec exec, CUresult r);

/* Fills a's queries with the union of what executable graph `exec` touches (merged to fit
 * OOC_MAX_REFS when it must be). Returns CUDA_SUCCESS (no queries, with a warning, for a graph
 * not captured under the shim), or CUDA_ERROR_OUT_OF_MEMORY (logged) when the union does not fit
 * one access set. Takes the lock itself. Thread-safe. */
CUresult ooc_graph_launch_access(CUgraphExec exec, ooc_access_t *a);

#endif
