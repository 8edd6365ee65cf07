/* SPDX-License-Identifier: MIT */
/* fc_internal.h: what the files of the simulated driver share (configuration, memory ranges,
 * streams and operations, error helpers).
 *
 * The driver is compiled with __CUDA_API_VERSION_INTERNAL so that cuda.h leaves every versioned
 * name (cuMemAlloc_v2, cuLaunchKernel_ptsz, ...) unrenamed; each export is declared from its
 * cudaTypedefs.h PFN type (FC_EXPORT), so the compiler checks every prototype.
 *
 * Locking: g_fc.mem_lock (rwlock) guards the range and reservation tables; g_fc.lock (mutex)
 * with g_fc.cv guards every stream, op queue and event. Neither is held while a kernel or copy
 * body runs, nor across a call back into user code. g_fc.vm_lock (mutex, taken before mem_lock)
 * serialises the calls that change host mappings of VMM memory (cuMemMap, cuMemUnmap,
 * cuMemRelease, cuMemAddressFree) and guards the handles' parked mappings: their system calls
 * run under it, outside mem_lock, so that a kernel, a copy or cuMemSetAccess never waits for
 * them. */
#ifndef FC_INTERNAL_H
#define FC_INTERNAL_H

#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>
#include <cudaTypedefs.h>

#include "fakecuda.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define FC_EXPORT(sym, pfn, impl)                                                                  \
    _Static_assert(__builtin_types_compatible_p(__typeof__(&impl), pfn), #sym " prototype");       \
    extern __typeof__(*(pfn)0) sym __attribute__((alias(#impl), visibility("default")))

#define FC_HIDDEN __attribute__((visibility("hidden")))

/* ---- configuration (FAKECUDA_* variables, read once) ---------------------------------------- */
typedef struct fc_config {
    uint64_t mem_bytes;   /* device capacity */
    uint64_t granularity; /* VMM granularity */
    int threaded;         /* 1: a worker thread per stream; 0: inline execution */
    unsigned jitter_us;   /* max random delay before each op (threaded only) */
    uint64_t seed;
    int strict; /* 1: abort on unmap/free under queued work; 0: count it */
    /* 1: an unmap under work queued but not started is not a violation when that work waits for
     * the host (behind a wait on memory that does not hold yet, fc_stream.c's host_gated): it
     * reads the memory mapped when it runs. What scripts/gpu-first-contact's probe remapgate asks
     * of the real driver. 0 (the default): any queued work that references the range is.
     * 2 (`wait`): the unmap waits until no work references the range (fc_unmap_wait), as a
     * driver might that synchronises; work that waits for the host then never ends. */
    int remap_queued;
    /* FAKECUDA_QUEUE_DEPTH, threaded scheduler: ops a stream holds queued or running before the
     * host's next submission to it blocks until one completes, as the real driver's launch
     * queue does (about 1000 a stream); 0: unbounded. */
    unsigned queue_depth;
    int poison;    /* fill new device memory with 0xff bytes */
    int host_vmm;  /* host-located cuMemCreate supported */
    int timing;    /* timing model on */
    double gflops; /* compute rate of the timing model */
    double hbm_gbps;
    double h2d_gbps, d2h_gbps;
    double launch_us;
    /* FAKECUDA_VMM_US, timing model: host time per mapping of cuMemMap, cuMemSetAccess,
     * cuMemUnmap, per cuMemCreate, then the same three for host-located memory (VMM_*). */
    double vmm_us[7];
    const char *stats_path; /* FAKECUDA_STATS */
    const char *trace_path; /* FAKECUDA_TRACE */
    const char *fail_spec;  /* FAKECUDA_FAIL */
    char device_name[128];
} fc_config_t;

/* ---- memory ranges ------------------------------------------------------------------------- */
typedef enum { FC_R_ALLOC = 1, FC_R_MAP = 2, FC_R_HOST = 3 } fc_rkind_t;

#define FC_ACC_NONE 0
#define FC_ACC_READ 1
#define FC_ACC_RW   3

typedef struct fc_handle {
    uint32_t magic;
    int fd;
    size_t size;
    CUmemAllocationProp prop;
    int user_refs; /* cuMemCreate + cuMemRetainAllocationHandle - cuMemRelease */
    int maps;      /* live mappings */
    /* Host mappings of it that cuMemUnmap moved aside, page tables kept, for a later cuMemMap of
     * the same part to move back (fc_mem.c); guarded by g_fc.vm_lock. Thirty-two: the shim keeps
     * a physical chunk mapped at up to five addresses at once outside the remapping gate (its
     * memory handed on while copies out still read it; with room for two, 39% of a replay's maps
     * were made afresh), and at up to sixteen with OOC_REMAP_GATE=1 and OOC_SAFE_STAGE=1 (spare
     * addresses and old ones whose unmaps wait in the mapping thread's queue; with room for
     * eight, 111 of a replay's 247 fresh maps of device memory were made again and again). */
    struct {
        uintptr_t addr;
        size_t offset, size;
    } park[32];
    int npark;
} fc_handle_t;

typedef struct fc_range {
    uintptr_t base;
    size_t size;
    fc_rkind_t kind;
    int access;        /* FC_ACC_* (host ranges are always RW) */
    int host_owned;    /* FC_R_HOST: 1 if we mmapped it (not cuMemHostRegister) */
    uint64_t id;       /* buffer id, for CU_POINTER_ATTRIBUTE_BUFFER_ID */
    CUcontext ctx;     /* the context current when it was made: CU_POINTER_ATTRIBUTE_CONTEXT */
    size_t acct_bytes; /* bytes counted against capacity (FC_R_ALLOC) */
    fc_handle_t *h;    /* FC_R_MAP */
    size_t map_offset; /* FC_R_MAP */
    int async_pending; /* FC_R_ALLOC: a cuMemFreeAsync is queued */
    int poison_due;    /* FC_R_ALLOC: 1 until its first access fills it with poison (fc_mem.c) */
} fc_range_t;

/* ---- streams, events and operations --------------------------------------------------------- */
typedef struct CUstream_st fc_stream_t;
typedef struct fc_op fc_op_t;

typedef enum { FC_ENG_NONE, FC_ENG_COMPUTE, FC_ENG_H2D, FC_ENG_D2H } fc_engine_t;

enum { FC_MODEL_RING = 1024 };

typedef struct fc_dep {
    fc_stream_t *s;
    uint64_t seq;
} fc_dep_t;

typedef struct fc_ref {
    uintptr_t lo, hi;
    int write; /* the op may write the range (a kernel's ranges are all taken to be written) */
} fc_ref_t;

/* A reference's part in a VMM mapping, as physical memory: handle h's bytes [lo, hi), reached at
 * address va (strict mode's check of one physical chunk used through two addresses). */
typedef struct fc_pref {
    const struct fc_handle *h;
    uint64_t lo, hi;
    uintptr_t va;
    int write;
} fc_pref_t;

struct fc_op {
    fc_op_t *next;
    uint64_t seq;
    const char *what; /* for messages: "kernel gemm", "memcpy HtoD" */
    fc_dep_t *deps;
    unsigned ndeps, cap_deps;
    fc_ref_t *refs;
    unsigned nrefs, cap_refs;
    /* Threaded: the physical parts of refs, found when the op starts, and whether it is running
     * (set and cleared under g_fc.lock). */
    fc_pref_t *prefs;
    unsigned nprefs;
    int running;
    fc_engine_t engine;
    double model_ns;    /* timing model: time the op occupies its engine */
    uint64_t waited_ns; /* its body waited off the CPU (fakecuda_waited) */
    /* A wait on memory that had to wait: when its body saw the value (fc_now_ns), less the
     * lateness with which the host learned of what it replied to (fc_host_late_ns); 0 when it held
     * at once. On a device the wait ends no sooner. */
    uint64_t seen_ns;
    int instant; /* timing model: takes no device time (an event record: the body is the
                  * simulator's bookkeeping, and its thread descheduled there is not the device) */
    uint64_t queued_ns, ready_ns; /* timing model and FAKECUDA_TRACE: when it was queued; (trace
                                   * only) when its stream's thread found it first in line with its
                                   * dependencies done */
    /* Timing model: when a device would start the op (queued, its stream's previous op and the
     * ops it waits for done, by their modelled ends) and end it (fc_stream.c, "the modelled
     * clock"). */
    uint64_t model_start_ns, model_end_ns;
    /* FAKECUDA_REMAP_QUEUED=1, timing model: called as the op starts (no lock held, before it
     * takes an engine) to take its engine, modelled time and bytes again from where its memory
     * is located then (an address remapped while it was queued). May be NULL. */
    void (*relocate)(fc_op_t *op);
    /* Executes the op; returns 0 or a CUresult to make sticky. Runs without locks held. */
    CUresult (*run)(fc_op_t *op);
    void (*dispose)(fc_op_t *op); /* frees the payload; may be NULL */
    /* Called under g_fc.lock once op->seq is assigned; may be NULL. */
    void (*on_submit)(fc_op_t *op, fc_stream_t *s);
    void *payload;
    /* A wait on memory (fc_memop.c): 1 while the word does not hold its condition, so that the
     * op, and everything ordered after it, waits for something the host has still to do (strict
     * mode's FAKECUDA_REMAP_QUEUED rule, fc_strict_check). NULL for other ops. */
    int (*closed)(const fc_op_t *op);
    unsigned visit; /* fc_stream.c's host_gated walk */
    /* Stream capture: fills dst (a new op with this op's kind, timing and statistics) with its own
     * copy of the payload and its strict-mode references, for one execution of a captured op; the
     * captured op itself stays in its graph as a template and never runs. Returns 0 or -1 (out of
     * memory). NULL: the op cannot be captured (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED). */
    int (*clone)(fc_op_t *dst, const fc_op_t *src);
    /* Statistics, counted when the op is queued to run (a captured op counts at each launch of
     * its graph, not at capture). */
    uint32_t n_kernels, n_memcpys, n_memsets;
    uint64_t b_h2d, b_d2h, b_d2d;
};

/* The ops captured from one stream, in order: the body of a graph. Immutable once the capture
 * ended; shared by the graph and its executable graphs (refs, under g_fc.lock). */
typedef struct fc_oplist {
    fc_op_t **ops;
    size_t n, cap;
    int refs;
} fc_oplist_t;

/* A stream capture in progress (fc_stream_t.capture, guarded by g_fc.lock). */
typedef struct fc_capture {
    CUstreamCaptureMode mode;
    pthread_t thread; /* the thread that began it */
    uint64_t id;
    int invalidated; /* a rule of stream capture was broken: cuStreamEndCapture fails */
    fc_oplist_t *list;
    /* cuStreamBeginCaptureToGraph: the graph the ops are added to, and the nodes the first of
     * them depends on (owned); NULL for a capture into a new graph. */
    struct CUgraph_st *target;
    struct CUgraphNode_st **target_deps;
    size_t ntarget_deps;
} fc_capture_t;

struct CUstream_st {
    uint32_t magic;
    unsigned flags;
    int priority;
    int legacy;            /* the NULL / CU_STREAM_LEGACY stream */
    int per_thread;        /* a thread's CU_STREAM_PER_THREAD stream */
    int closing;           /* destroyed by the user; worker exits once drained */
    fc_capture_t *capture; /* non-NULL while the stream is capturing (guarded by g_fc.lock) */
    uint64_t submitted, completed;
    uint64_t model_done_ns; /* timing model: the modelled end of its last completed op */
    /* timing model: model_done_ns as it was when the op numbered seq completed, at
     * [seq % FC_MODEL_RING], for the last FC_MODEL_RING ops (what an op waiting for that one
     * waits for, however far the stream has gone since) */
    uint64_t model_done_at[FC_MODEL_RING];
    /* timing model: when (fc_now_ns) the op numbered seq completed, at [seq % FC_MODEL_RING] (how
     * late the simulator's thread got there: fc_host_late_ns) */
    uint64_t done_wall_at[FC_MODEL_RING];
    fc_op_t *head, *tail;
    pthread_t thread;
    int has_thread;
    pthread_cond_t cv; /* threaded: its worker waits here, for work or for another stream */
    int blocked;       /* its worker waits for an op of another stream (its head's deps) */
    struct CUstream_st *all_next; /* every stream ever created (freed at shutdown) */
};

struct CUevent_st {
    uint32_t magic;
    unsigned flags;
    fc_stream_t *stream; /* of the last record; NULL when never recorded */
    uint64_t seq;
    uint64_t t_ns; /* completion time of the last record */
    int refs;      /* user + queued record ops */
    int destroyed;
};

#define FC_MAGIC_STREAM 0x5354524du
#define FC_MAGIC_EVENT  0x45564e54u
#define FC_MAGIC_HANDLE 0x484e444cu
#define FC_MAGIC_FUNC   0x46554e43u
#define FC_MAGIC_MODULE 0x4d4f444cu
#define FC_MAGIC_CTX    0x43545854u
#define FC_MAGIC_KERNEL 0x4b45524eu

/* ---- global state --------------------------------------------------------------------------- */
typedef struct fc_global {
    fc_config_t cfg;
    atomic_int inited;         /* cuInit succeeded */
    _Atomic CUresult sticky;   /* sticky error, 0 when none */
    pthread_mutex_t lock;      /* streams, queues, events */
    pthread_cond_t cv;         /* any op completed or queued */
    pthread_rwlock_t mem_lock; /* ranges, reservations */
    pthread_mutex_t vm_lock;   /* host mappings of VMM memory being changed; parked mappings */
    fc_range_t *ranges;        /* sorted by base */
    size_t nranges, cap_ranges;
    fc_range_t *resv; /* reservations, sorted by base (kind unused) */
    size_t nresv, cap_resv;
    uint64_t next_buffer_id;
    fc_stream_t *legacy;
    fc_stream_t *all_streams;
    pthread_mutex_t engine[4];  /* timing model: one op per engine at a time */
    uint64_t engine_free_ns[4]; /* the modelled end of each engine's last op (under engine[]) */
    atomic_int captures;        /* stream captures in progress (a cheap test for the rules) */
    fakecuda_stats_t st;        /* guarded by stats_lock */
    pthread_mutex_t stats_lock;
    FILE *trace; /* FAKECUDA_TRACE: one line per timed op; guarded by trace_lock */
    pthread_mutex_t trace_lock;
    uint64_t trace_t0; /* fc_now_ns() when the trace was opened */
    /* Timing model: how late the last blocking host wait (fc_wait_seq) learned of the completion
     * it waited for, past that op's modelled end, through the simulator's threads, and when it
     * returned (fc_host_late_ns). Guarded by lock. */
    uint64_t host_late_ns, host_late_at;
} fc_global_t;

extern fc_global_t g_fc FC_HIDDEN;

/* ---- fc_core.c --------------------------------------------------------------------------------
 */
typedef struct fc_api_slot fc_api_slot_t;
FC_HIDDEN fc_api_slot_t *fc_api_slot(const char *base);
/* Counts a call and applies fault injection; returns the error to inject, or 0. Also enforces
 * initialisation (need_init) and the sticky error (check_sticky). */
/* The factor FAKECUDA_SLOW puts on the modelled time of the op the calling thread's last entry
 * point queues (1 when no rule hit it); reset to 1 by the call. */
FC_HIDDEN double fc_slow_take(void);
FC_HIDDEN CUresult fc_enter(fc_api_slot_t *slot, int need_init, int check_sticky);
FC_HIDDEN void fc_config_load(void);
FC_HIDDEN void fc_fatal(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
FC_HIDDEN void fc_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
FC_HIDDEN uint64_t fc_now_ns(void);
/* Sleeps `ns` nanoseconds (the calling thread's timer slack added), through signals. */
FC_HIDDEN void fc_sleep_ns(uint64_t ns);
/* The timing model's host cost of a driver call that started at t0 (fc_now_ns()): the calling
 * thread is held until t0 + `us` microseconds, asleep with no timer slack, less what its earlier
 * calls overran their model by, at most FC_HOST_EXCESS_MAX_NS (fc_core.c). No-op without the
 * timing model. */
#define FC_HOST_EXCESS_MAX_NS 100000ull
enum {
    VMM_MAP,
    VMM_ACCESS,
    VMM_UNMAP,
    VMM_CREATE,
    VMM_HOST_ACCESS,
    VMM_HOST_UNMAP,
    VMM_HOST_CREATE
};
FC_HIDDEN void fc_host_cost(uint64_t t0, double us);
/* The cost of VMM call `kind` (VMM_*) on one mapping or handle of `size` bytes: FAKECUDA_VMM_US's
 * figure, which is for 2 MiB, plus a share per MiB beyond that (fc_mem.c). */
FC_HIDDEN double fc_vmm_cost(int kind, size_t size);
FC_HIDDEN CUresult fc_require_ctx(void);
/* The calling thread's current context (NULL when none). */
FC_HIDDEN CUcontext fc_ctx_current(void);
/* Is c a live context (of the one simulated device)? */
FC_HIDDEN int fc_ctx_valid(CUcontext c);
FC_HIDDEN void fc_set_sticky(CUresult e);
FC_HIDDEN void fc_stat_add(size_t offset, int64_t delta);
#define FC_STAT(field, delta) fc_stat_add(offsetof(fakecuda_stats_t, field), (int64_t)(delta))

/* Entry macros: each public function starts with one of these. */
#define FC_ENTER_(base, need_init, sticky)                                                         \
    do {                                                                                           \
        static fc_api_slot_t *_Atomic slot_;                                                       \
        fc_api_slot_t *s_ = atomic_load_explicit(&slot_, memory_order_acquire);                    \
        if (!s_) {                                                                                 \
            s_ = fc_api_slot(base);                                                                \
            atomic_store_explicit(&slot_, s_, memory_order_release);                               \
        }                                                                                          \
        CUresult e_ = fc_enter(s_, need_init, sticky);                                             \
        if (e_ != CUDA_SUCCESS)                                                                    \
            return e_;                                                                             \
    } while (0)
/* Needs cuInit and a current context; fails with a sticky error. */
#define FC_ENTER(base)                                                                             \
    do {                                                                                           \
        FC_ENTER_(base, 1, 1);                                                                     \
        CUresult c_ = fc_require_ctx();                                                            \
        if (c_ != CUDA_SUCCESS)                                                                    \
            return c_;                                                                             \
    } while (0)
/* Needs cuInit only. */
#define FC_ENTER_INIT(base) FC_ENTER_(base, 1, 1)
/* Callable at any time (error names, versions, cuInit itself). */
#define FC_ENTER_ANY(base) FC_ENTER_(base, 0, 0)

/* ---- fc_mem.c ---------------------------------------------------------------------------------
 */
/* Checks [p, p + n) is device-accessible with `access`; returns 0 or -1. Takes mem_lock. */
FC_HIDDEN int fc_mem_check(uintptr_t p, size_t n, int access);
/* fc_mem_check that also says (when it returns 0) whether any part of the range is a mapping of
 * host-located physical memory. */
FC_HIDDEN int fc_mem_check_loc(uintptr_t p, size_t n, int access, int *host_located);
/* Is p inside a VMM mapping of host-located physical memory (CU_MEM_LOCATION_TYPE_HOST*)? */
FC_HIDDEN int fc_mem_is_host_located(uintptr_t p);
/* Is p inside a device-side range (alloc or mapping) / a pinned host range? */
FC_HIDDEN int fc_mem_is_device(uintptr_t p);
FC_HIDDEN int fc_mem_is_pinned_host(uintptr_t p);
/* The extent of the allocation or single mapping containing p: [*lo, *hi); -1 if none. */
FC_HIDDEN int fc_mem_extent(uintptr_t p, uintptr_t *lo, uintptr_t *hi);

/* ---- fc_stream.c ------------------------------------------------------------------------------
 */
/* Resolves a user stream handle (NULL, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD) for an API whose
 * per-thread variant is `ptds`. Returns NULL for an invalid handle. */
FC_HIDDEN fc_stream_t *fc_stream_resolve(CUstream h, int ptds);
FC_HIDDEN fc_op_t *fc_op_new(const char *what, CUresult (*run)(fc_op_t *), void *payload,
                             void (*dispose)(fc_op_t *));
FC_HIDDEN void fc_op_ref(fc_op_t *op, uintptr_t lo, uintptr_t hi, int write);
FC_HIDDEN unsigned fc_mem_phys(const fc_ref_t *r, fc_pref_t **out, unsigned *n, unsigned *cap);
FC_HIDDEN void fc_op_free(fc_op_t *op);
/* Makes op wait until stream s has completed sequence number seq. Returns 0 or -1 (no memory). */
FC_HIDDEN int fc_op_after(fc_op_t *op, fc_stream_t *s, uint64_t seq);
/* Issues op on s: queues it (or runs it at once in inline mode), or, while s is capturing, adds
 * it to the capture (ops without a clone function cannot be captured). Enforces the rules of
 * stream capture (no work on the legacy stream while a blocking stream captures). On success
 * *seq (may be NULL) is the op's sequence number on s, 0 when captured; on failure the op is
 * freed. Returns CUDA_SUCCESS or the error for the caller. */
FC_HIDDEN CUresult fc_submit(fc_stream_t *s, fc_op_t *op, uint64_t *seq);
/* Fails an operation that a capturing stream cannot take (a synchronous wait, pageable memory):
 * when s is capturing, invalidates the capture and returns CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
 * (CUDA_ERROR_STREAM_CAPTURE_INVALIDATED when it already was); otherwise CUDA_SUCCESS. */
FC_HIDDEN CUresult fc_capture_refuse(fc_stream_t *s, const char *what);
/* The rule for "potentially unsafe" calls (cuMemAlloc, cuMemFree, cuCtxSynchronize): refused,
 * invalidating the captures concerned, while a capture in CU_STREAM_CAPTURE_MODE_GLOBAL is in
 * progress on any thread, or one in THREAD_LOCAL mode on this thread. Returns CUDA_SUCCESS or
 * CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED. */
FC_HIDDEN CUresult fc_capture_unsafe(const char *what);
/* Is the stream of handle h capturing? (0 for an invalid handle.) Takes g_fc.lock. */
FC_HIDDEN int fc_capturing(CUstream h, int ptds);
/* Frees a capture's op list reference (the ops go with the last reference). */
FC_HIDDEN void fc_oplist_put(fc_oplist_t *l);

/* ---- fc_graph.c -------------------------------------------------------------------------------
 */
/* Marks s's capture invalidated (cuStreamEndCapture then fails) and says why, once. Caller holds
 * g_fc.lock; s->capture is not NULL. */
FC_HIDDEN void fc_capture_invalidate(fc_stream_t *s, const char *why);
/* Waits until s has completed sequence number seq; returns the sticky error or 0. */
FC_HIDDEN CUresult fc_wait_seq(fc_stream_t *s, uint64_t seq);
/* Timing model: how much earlier than `now` a word the host writes now would have been written on
 * a device: the lateness of the host's latest blocking wait, when it returned at most
 * FC_HOST_LATE_WINDOW_NS before (fc_stream.c, "the host's replies"). */
FC_HIDDEN uint64_t fc_host_late_ns(uint64_t now);
FC_HIDDEN CUresult fc_sync_all(void);
/* Strict mode: reports (and in strict mode aborts) when queued or running work references
 * [lo, hi). `what` names the operation ("cuMemUnmap"). Returns the number of conflicts. */
FC_HIDDEN int fc_strict_check(uintptr_t lo, uintptr_t hi, const char *what);
FC_HIDDEN void fc_unmap_wait(uintptr_t lo, uintptr_t hi, const char *what);
/* Strict mode, threaded: a kernel of op accesses [p, p + bytes) while an unordered copy or memset
 * touches the same physical bytes (see fc_stream.c). */
FC_HIDDEN void fc_strict_access(const fc_op_t *op, uintptr_t p, size_t bytes, int write);
FC_HIDDEN void fc_streams_shutdown(void);
FC_HIDDEN int fc_stream_valid(CUstream h);

/* ---- fc_copy.c --------------------------------------------------------------------------------
 */
/* Builds, without issuing, the op of a CUDA_MEMCPY3D for a graph's memcpy node (its device
 * ranges are checked when the graph runs; pageable host memory is refused). *out is NULL for an
 * empty copy. Returns CUDA_SUCCESS or the driver's error. */
FC_HIDDEN CUresult fc_copy3d_op(const CUDA_MEMCPY3D *c, fc_op_t **out);
/* Builds, without issuing, the op of a graph's memset node (CUDA_MEMSET_NODE_PARAMS: element size
 * 1, 2 or 4, a value that fits it, non-empty). */
FC_HIDDEN CUresult fc_memset_op(const CUDA_MEMSET_NODE_PARAMS *m, fc_op_t **out);

/* ---- fc_kernel.c ------------------------------------------------------------------------------
 */
FC_HIDDEN void fc_kernels_init(void);
/* Builds, without issuing, the op of a kernel launch (a function, or a CUkernel cast to one): the
 * checks and parameter copy of cuLaunchKernel. Returns CUDA_SUCCESS (*out is the op) or the
 * launch's error. */
FC_HIDDEN CUresult fc_launch_op(CUfunction func, const unsigned grid[3], const unsigned block[3],
                                unsigned shared, void **kparams, void **extra, fc_op_t **out);
FC_HIDDEN void fc_kernels_shutdown(void);

#endif
