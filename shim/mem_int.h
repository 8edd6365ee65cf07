/* SPDX-License-Identifier: MIT */
/* mem_int.h: the memory layer's private header: the chunk and buffer types, the one state M under
 * mem_lock, and the functions the memory files share. Only shim/ files of the memory layer
 * include it; the rest of the shim sees shim.h's ooc_mem_* functions.
 *
 * The rooms, lowest first (a file calls only into files above it in this list; scripts/check-arch
 * checks it): memcheck.c (the invariants, in OOC_CHECKS builds), fastpath.c (the lock, writer
 * sections, the lock-free path), pool.c (events, host slots), streams.c (a chunk's users, waiting
 * for them), lru.c (the LRU list, the eviction walk; no driver), vmm.c (VA runs, chunk table,
 * mapping), warm.c (freed runs kept mapped), retire.c (retiring and dying chunks), buffer.c
 * (buffers, slabs, lookup), resident.c (demand residency, eviction, the op's chunks), transfer.c
 * (the plan's transfers), worker.c (the replay worker), external.c (the program's own VMM memory),
 * bandwidth.c (the recorder's bandwidth probe), mem.c (state, start-up, shutdown, queries). */
#ifndef OOC_MEM_INT_H
#define OOC_MEM_INT_H

#include "grow.h"
#include "lru.h"
#include "shim.h"
#include "slab.h"
#include "vaspace.h"

#include <stdlib.h>
#include <string.h>

/* The uthash tables of the memory layer report an allocation failure here (under mem_lock). */
extern int oom_flag OOC_INTERNAL;
#define uthash_nonfatal_oom(obj) (oom_flag = 1)
#include <uthash.h>

enum { C_EMPTY, C_RESIDENT, C_SWAPPED };

/* Safe mode's copy streams whose copies in every op waits for (M.fill, streams.c's fill_set). */
enum { FILL_WORKER, FILL_DEMAND, FILL_GATE, FILL_HANDOVER, FILL_N };

#define MAX_USERS   4
#define MAX_STREAMS 16
#define SLAB_ALIGN  256

/* A pooled event with a reference count: chunks and host slots waiting on the same copy share
 * one. Returned to the pool when the last reference is dropped (a later record does not disturb
 * waits already enqueued: cuStreamWaitEvent captures the record it sees). */
typedef struct evref {
    CUevent e;
    unsigned refs;
    int done; /* seen completed (ev_done): not asked again until it is taken again */
    struct evref *next;
} evref_t;

typedef struct phys {
    CUmemGenericAllocationHandle h;
    /* Safe mode behind a gate (retire.c's retire_behind_gate): an event after the remap that
     * takes the memory off its last owner's address; whatever reaches it through another address
     * waits for it on the device (phys_ordered). NULL: none pending. */
    struct evref *after;
    struct phys *next;
} phys_t;

/* A warm run (warm.c): the chunk run [first, first + n) of a freed large buffer whose physical
 * chunks stay mapped there for the next buffers; each chunk holds a reference to an event after
 * the work that may still use it (NULL: none). */
typedef struct wchunk {
    phys_t *phys;
    struct evref *ev;
} wchunk_t;

/* A warm chunk whose memory was handed on while work that may use it still ran (warm.c's
 * give_back_last): its address stays mapped to that memory until `ev` is done, then is unmapped
 * and goes to the quarantine (warm_late_reap). Holds a reference to ev. */
typedef struct wlate {
    uint64_t idx;
    struct evref *ev;
} wlate_t;

typedef struct warm {
    uint64_t first, n;
    wchunk_t c[];
} warm_t;

typedef struct buf {
    uintptr_t addr;
    size_t size;
    uint64_t id;     /* serial number, never reused */
    uint64_t opmark; /* op serial that listed it in op_bufs */
    int small;
    int own;      /* the shim's own (ooc_mem_alloc_own): its small ones use M.slab_own */
    int64_t home; /* the first chunk of its range in M.pva, or -1 (buffer.c, "Stable addresses") */
    UT_hash_handle hh;
} buf_t;

/* A pinned host slot of one chunk. In safe mode it is host-located VMM memory (handle h),
 * mapped at `va` in a staging reservation, and mapped again at a swapped chunk's own address. */
typedef struct hslot {
    void *p;        /* host address (pinned mode) */
    CUdeviceptr va; /* staging address (safe mode) */
    CUmemGenericAllocationHandle h;
    struct hslot *next;
} hslot_t;

typedef struct chunk {
    uint64_t idx;
    UT_hash_handle hh;
    /* Read by the fast path without the lock (see "The fast path" below); written under it. */
    _Atomic int hot;            /* the fast path may issue ops that use it: see set_hot */
    _Atomic int touched;        /* used by the fast path since it was last placed in the LRU */
    _Atomic uint64_t ext_first; /* the chunks of its buffer (a slab chunk: itself); */
    _Atomic uint64_t ext_n;     /* ext_n = 0 once no live buffer owns it */
    int state;
    phys_t *phys;
    hslot_t *host;
    int aliased;               /* safe mode: the host slot is mapped at the chunk's address */
    uint64_t since;            /* op serial when it was last mapped (to a device or host chunk) */
    struct chunk *prev, *next; /* LRU of resident live chunks, most recent at head */
    _Atomic(CUstream) users[MAX_USERS]; /* only grows while it is hot (chunk_add_user) */
    _Atomic unsigned nusers;
    _Atomic int users_unknown; /* a user we cannot wait for precisely: synchronise the context */
    unsigned nbufs;
    buf_t *owner;
    slab_t *slab;
    uint64_t pin;  /* op serial that pinned it */
    unsigned hold; /* library calls in flight that use it (ooc_mem_op_hold): never a victim */
    int dying;
    /* Replay (planned, asynchronous transfers): */
    evref_t *in_ev;  /* a planned swap-in's copy: ops using the chunk wait for it on their stream */
    evref_t *out_ev; /* retiring: a planned swap-out's copy was issued; unmapped once it is done */
    /* A planned swap-in is queued for the worker: the job that queued it (job_t.seq), 0 when none.
     * Only that job serves it: the ring may still hold an older job of the same buffer (its
     * chunks brought in and swapped out again since), whose place in the plan's order is not
     * this swap-in's. */
    uint32_t queued;
    /* Retiring, its physical chunk taken by a planned swap-in issued at once (transfer.c's
     * swapin_now): still mapped here until its copy out is done, but no longer its memory
     * (phys is NULL, and it is not counted resident). */
    int stolen;
    int discard; /* recompute: evicted without a copy (replay rebuilds its bytes) */
    /* Safe mode: a planned swap-in staged beside the host alias (stage.c): its physical chunk
     * (counted resident), mapped at spare address index stage_idx, and the copy's event. */
    phys_t *stage;
    uint64_t stage_idx;
    evref_t *stage_ev;
    int stage_ro; /* its alias was made read-only meanwhile: a write there faults, not lost */
    /* Dying: events after the work of every stream that may still use it (fenced = 1), so its
     * memory can be taken back when they are done, without waiting for anything later. */
    evref_t *fence[MAX_USERS];
    unsigned nfence;
    int fenced;
    uint64_t when; /* the op serial when it began to die or retire */
    /* Read by the replay's fast path (fastpath.c); last, so that the fields the demand fast
     * path reads stay on as few cache lines as before. A large buffer's chunk: the buffer's
     * serial number and size in bytes, set once the buffer is made (before the chunk can be
     * hot) and never changed (a freed buffer's chunks are deleted); 0 for a slab chunk. */
    _Atomic uint64_t own_id;
    _Atomic uint64_t own_bytes;
    /* A slab chunk: a number never given to another chunk (0 for a large buffer's), and one
     * bit per SLAB_ALIGN bytes, set at the first byte of each buffer freed in it. A buffer
     * listed with this stamp (ooc_opbuf_t.stamp) whose bit is clear is live: slab space is
     * never handed out twice. Freed with the chunk (chunk_free). */
    _Atomic uint64_t stamp;
    _Atomic uint64_t *gone;
} chunk_t;

/* A host slot that a copy still writes or reads: back to the pool once `ev` has completed. */
typedef struct limbo {
    hslot_t *slot;
    evref_t *ev;
} limbo_t;

/* Planned swap-ins issued ahead of their ops, in stream order (transfer.c, serve_chunk) or by the
 * worker, take memory only while fewer than M.ahead_max of their chunks are still copying:
 * AHEAD_MIN, or the chunks the link moves in AHEAD_NS when that is more, at most AHEAD_CAP. */
#define AHEAD_MIN 4
#define AHEAD_CAP 64
#define AHEAD_NS  500000.0

/* A planned swap-in for the worker: the buffer at addr, if it is still serial `id`. */
typedef struct job {
    uintptr_t addr;
    uint64_t id;
    evref_t *gate; /* start once it has completed (may be NULL) */
    uint32_t seq;  /* never 0: the chunks it queued have queued == seq */
} job_t;

/* A physical allocation the program made itself with the VMM API (NCCL does). */
typedef struct ext {
    CUmemGenericAllocationHandle h;
    size_t size;
    UT_hash_handle hh;
} ext_t;

extern pthread_mutex_t mem_lock OOC_INTERNAL;

/* The state of the memory layer, guarded by mem_lock (the atomics are read without it by the
 * fast path). Defined in mem.c. */
struct mem_state {
    int ready;
    uint64_t chunk;
    unsigned shift;
    uintptr_t va_base;
    size_t va_size;
    va_space_t va;  /* runs of chunk indices in the reservation, from pva.chunks on */
    va_space_t pva; /* [0, pva.chunks): the program's large buffers' stable addresses (buffer.c) */
    uint64_t budget_chunks, phys_made, resident;
    uint64_t budget_bytes;   /* OOC_BUDGET, less what the device turned out not to have */
    uint64_t external_bytes; /* device memory the program made with cuMemCreate itself */
    ext_t *external;
    phys_t *phys_free;
    chunk_t *chunks;
    buf_t *bufs;
    chunk_t lru;
    chunk_t *slab_cur; /* the slab chunk the program's small buffers are bump-allocated in */
    chunk_t *slab_own; /* the one the shim's own small buffers are */
    chunk_t **dying;
    size_t ndying, cap_dying;
    warm_t **warm; /* warm runs, oldest first */
    size_t nwarm, cap_warm;
    uint64_t warm_chunks; /* physical chunks held mapped by warm runs (not in `resident`) */
    wlate_t *wlate;       /* warm chunks' addresses whose memory went on early (warm.c) */
    size_t nwlate, cap_wlate;
    wlate_t *spares; /* staged chunks' spare addresses unmapped behind a gate (stage.c) */
    size_t nspares, cap_spares;
    int reuse;      /* OOC_REUSE: keep freed buffers' chunks mapped in warm runs */
    int stage;      /* OOC_SAFE_STAGE: stage safe mode's planned swap-ins */
    int remap_gate; /* OOC_REMAP_GATE: remap behind the device (gate.c) */
    CUstream join;  /* warm.c joins several streams' events on it (created when needed) */
    hslot_t *host_free;
    hslot_t **host_blocks; /* arrays of HOST_BLOCK_CHUNKS slots */
    size_t nhost_blocks;
    int safe; /* swapped chunks are aliased to their host copies */
    CUmemLocation host_loc;
    struct {
        _Atomic(CUstream) s;
        _Atomic uint64_t last; /* serial of the last op issued on it (fast path: serial + 1) */
    } streams[MAX_STREAMS];
    _Atomic unsigned nstreams;     /* entries are only added (the fast path reads them) */
    _Atomic uint64_t streams_lost; /* the serial when a stream could not be tracked: wait for all */
    CUstream swap;
    CUdevice dev;
    CUcontext ctx;
    _Atomic uint64_t serial; /* advanced by every locked op; the fast path reads it */
    chunk_t **op_chunks;
    size_t nop, cap_op;
    int op_kind;      /* the op's OOC_OP_* (op_pin) */
    chunk_t **op_tmp; /* scratch for planned swap-outs */
    size_t cap_tmp;
    struct {
        CUstream s;
        uint64_t epoch;
        evref_t *v; /* holds a reference */
    } fcache[8];    /* events after the work issued so far, per stream, this epoch */
    unsigned fc_next;
    uint64_t fc_epoch;    /* advances whenever work is issued on a stream the shim follows */
    _Atomic int fc_dirty; /* the fast path issued work since fc_epoch last advanced */
    /* Safe mode: the last copy in on each copy stream (FILL_WORKER, FILL_DEMAND, FILL_GATE: the
     * worker's, demand residency's, the gate's) into memory just mapped at an address any op may
     * reach unseen, and (FILL_HANDOVER) the work that may still use memory handed on early by
     * warm runs (fill_join); every op's stream waits for them until they have completed, and
     * meanwhile no op takes the fast path (fill_on). */
    evref_t *fill[FILL_N];
    _Atomic int fill_on;
    chunk_t **staged; /* safe mode: staged swap-ins, oldest first (stage.c) */
    /* Staging: one byte per chunk index, 1 when a host-to-device copy stored an address in the
     * buffer there (never staged; sticky: replay keeps addresses); reached_all: all are. */
    unsigned char *reached;
    int reached_all;
    size_t nstaged, cap_staged;
    /* The fast path: the chunk of every index of the reservation (NULL: none), and whether this
     * hold of mem_lock is in a writer section (see quiesce). */
    _Atomic(chunk_t *) *table;
    size_t table_bytes;
    int quiesced;
    chunk_t **grave; /* deleted chunks a fast-path op may still read: freed by quiesce */
    size_t ngrave, cap_grave;
    ooc_opbuf_t *op_bufs;
    size_t nopb, cap_opb;
    uint64_t next_id;
    uint64_t next_stamp; /* the last slab chunk's stamp */
    /* Replay: pooled events, side streams, retiring chunks, host slots in flight, the worker. */
    evref_t *ev_free;
    evref_t **ev_all;
    size_t nev_all, cap_ev_all;
    CUstream h2d, d2h;
    chunk_t **ret; /* retiring chunks, in swap-out order */
    size_t nret, cap_ret;
    limbo_t *limbo;
    size_t nlimbo, cap_limbo;
    job_t *jobs; /* a ring */
    size_t job_head, njobs, cap_jobs;
    job_t job_cur;             /* the job the worker took off the ring, while job_busy */
    uint32_t job_seq;          /* the last job's seq */
    evref_t *ahead[AHEAD_CAP]; /* copies of chunks issued ahead, not seen done, oldest first */
    unsigned nahead, ahead_max;
    int job_busy;
    unsigned op_waiting; /* program threads waiting for a planned swap-in (ooc_mem_op_pin) */
    int worker_blocked;  /* the worker waits for the device, mem_lock released (worker_wait) */
    int op_done;         /* the op of M.serial was issued: its pins protect nothing now */
    pthread_t worker;
    int worker_on, worker_stop;
    pthread_cond_t work_cv;
    pthread_cond_t done_cv; /* the worker finished with a chunk (queued went to 0) */
};
extern struct mem_state M OOC_INTERNAL;

/* The fast path may be used (the reservation's table exists): fastpath.c. */
extern _Atomic int fp_on OOC_INTERNAL;
/* Set by ooc_mem_shutdown (mem.c; at the library's unloading, after every exit handler): an op
 * that another thread issues after that is refused by ooc_mem_begin (resident.c). */
extern _Atomic int mem_closed OOC_INTERNAL;

/* The address of chunk index idx in the reserved range. */
static inline uintptr_t idx_addr(uint64_t idx) {
    return M.va_base + ((uintptr_t)idx << M.shift);
}

static inline uintptr_t chunk_addr(const chunk_t *c) {
    return idx_addr(c->idx);
}

/* The device's access to a chunk's mapping: read-write, or read-only (`ro`). Built here, not in
 * vmm.c, for gate.c's mapping thread too (it may not call vmm.c, which waits for it). */
static inline CUmemAccessDesc chunk_access(int ro) {
    CUmemAccessDesc d;
    memset(&d, 0, sizeof d);
    d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    d.location.id = M.dev;
    d.flags = ro ? CU_MEM_ACCESS_FLAGS_PROT_READ : CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    return d;
}

/* The LRU of resident live chunks (lru.c), most recent at the head: c at its hot end. */
static inline void lru_push(chunk_t *c) {
    lru_list_push(&M.lru, c);
}

/* c at the LRU's cold end: the first to be evicted. */
static inline void lru_push_tail(chunk_t *c) {
    lru_list_push_tail(&M.lru, c);
}

/* ---- the memory files' shared functions (growing arrays: grow.h) --------------------------- */

/* Raises *cell to v (the fast path raises the same cells without the lock). */
static inline void raise_to(_Atomic uint64_t *cell, uint64_t v) {
    uint64_t old = atomic_load_explicit(cell, memory_order_relaxed);
    while (old < v && !atomic_compare_exchange_weak_explicit(cell, &old, v, memory_order_relaxed,
                                                             memory_order_relaxed)) {
    }
}

/* memcheck.c: the invariants, checked at every release of mem_lock in OOC_CHECKS builds. */
#ifdef OOC_CHECKS
void chunk_check(const chunk_t *c);
void mem_check(void);
void fast_buffers_check(const ooc_access_t *a); /* fastpath.c */
#else
static inline void chunk_check(const chunk_t *c) {
    (void)c;
}
static inline void mem_check(void) {}
static inline void fast_buffers_check(const ooc_access_t *a) {
    (void)a;
}
#endif
/* fastpath.c */
void quiesce(void);
void chunk_free(chunk_t *c); /* the memory of a deleted chunk */
void mem_unlock(void);
void mem_wait(pthread_cond_t *cv);
void mem_lock_take(void);
int mem_yield(void);
void mem_on_worker(void);
int mem_is_worker(void);     /* on the replay worker's thread */
uint64_t mem_clock_ns(void); /* CLOCK_MONOTONIC, in ns */
uint64_t wait_begin(void);
void wait_end(uint64_t t0);
/* The cause the calling thread's next waits count under (OOC_STATS); returns the one before,
 * to be put back. */
enum { WAIT_OTHER, WAIT_LOCK, WAIT_QUEUED, WAIT_OUT, WAIT_STREAMS };
unsigned wait_for(unsigned why);
CUresult sync_event(CUevent e);
CUresult sync_stream(CUstream s);
CUresult sync_ctx(void);
void cool(chunk_t *c);
/* pool.c */
evref_t *ev_take(void);
void ev_drop(evref_t *v);
int ev_done(evref_t *v);
hslot_t *host_slot(void);
void host_slot_put(hslot_t *s);
/* The bytes of chunk c that a swap moves: up to its buffer's end (rounded up to a page) when one
 * buffer owns it, else the whole chunk (a slab's, or one no buffer owns). The bytes past a
 * buffer's end are nobody's: a swapped-in chunk's tail holds whatever its memory held. */
uint64_t chunk_used(const chunk_t *c);
CUresult copy_out(chunk_t *c, CUstream st);
CUresult copy_in(chunk_t *c, CUstream st);
CUresult copy_in_at(chunk_t *c, CUdeviceptr dst, CUstream st);
evref_t *phys_pending(phys_t *p);
CUresult phys_ordered(phys_t *p, CUstream st);
void host_blocks_free(void);
void limbo_put(hslot_t *s, evref_t *ev);
void limbo_poll(void);
/* Counts a planned swap-in of c issued (OOC_STATS); `stolen`: it took memory a swap-out was
 * vacating (transfer.c). */
static inline void count_prefetch(const chunk_t *c, int stolen) {
    ooc_stats_add(OOC_STAT_swap_ins, 1);
    ooc_stats_add(OOC_STAT_swap_in_bytes, chunk_used(c));
    ooc_stats_add(OOC_STAT_prefetches, 1);
    if (stolen)
        ooc_stats_add(OOC_STAT_prefetch_stolen, 1);
}
/* stage.c */
CUresult stage_in(chunk_t *c);
CUresult stage_adopt(chunk_t *c);
void stage_drop(chunk_t *c);
int stage_reclaim(void);
void stage_drop_all(void);
int stage_allowed(const chunk_t *c);
void staged_remove(chunk_t *c);
void gated_in(chunk_t *c, evref_t *v);
size_t stages_ready(chunk_t **out, size_t max);
void stages_push(chunk_t *const *cs, size_t n, uint32_t t, evref_t *after);
void stages_moved(chunk_t *const *cs, size_t n, evref_t *v);
/* stagegate.c */
size_t stage_some(chunk_t *const *cs, size_t n);
size_t stages_behind_gate(chunk_t *const *cs, size_t n, size_t need);
void stage_spares_reap(int block);
/* gate.c */
int gate_on(void);
void gate_set_timeout(unsigned s);
CUstream gate_stream(void);
int gate_start(void);
void gate_stop(void);
void gate_free_word(void);
int gate_reserve(void);
CUresult gate_wait_on(CUstream s, uint32_t *ticket);
void gate_push(uint32_t ticket, evref_t *after, CUdeviceptr va, CUmemGenericAllocationHandle h);
int gate_reserve_n(size_t more);
void gate_push_batch(uint32_t ticket, evref_t *after, CUdeviceptr va,
                     CUmemGenericAllocationHandle h, int last);
void gate_push_unmap(uint32_t ticket, evref_t *after, CUdeviceptr va, int last);
void gate_reap(void);
void gate_settle(CUdeviceptr va);
int gate_map_ro(CUdeviceptr va);
evref_t *gate_after_at(CUdeviceptr va);
/* streams.c */
void add_user(CUstream *users, unsigned *n, int *unknown, CUstream s);
void chunk_add_user(chunk_t *c, CUstream s);
void stream_issued(CUstream s);
int gather_streams(chunk_t *const *cs, size_t n, CUstream *users, unsigned *nu_out);
CUresult wait_chunks(chunk_t *const *cs, size_t n);
uint64_t issue_epoch(void);
void note_waited(uint64_t epoch, const CUstream *users, unsigned n, int all);
evref_t *fence_ev(CUstream s);
void fill_set(unsigned k, evref_t *v);
CUresult fill_join(unsigned k, evref_t *v);
CUstream join_stream(void);
evref_t *ev_join(evref_t *a, evref_t *b);
CUresult fill_wait(CUstream s);
void fill_drop(void);
/* vmm.c */
CUresult vmm_unmap(CUdeviceptr a);
CUresult vmm_unmap_run(CUdeviceptr a, uint64_t n);
CUresult vmm_map_rw(CUdeviceptr a, CUmemGenericAllocationHandle h);
CUresult vmm_protect(CUdeviceptr a, int ro);
int va_take(uint64_t count, uint64_t *first);
void va_give(uint64_t first, uint64_t count); /* ignores stable addresses (below pva.chunks) */
int pva_take(uint64_t count, uint64_t *first);
void pva_give(uint64_t first, uint64_t count);
chunk_t *chunk_new(uint64_t idx, uint64_t first, uint64_t n);
chunk_t *chunk_find(uint64_t idx);
void chunk_delete(chunk_t *c);
CUresult unmap_chunk(chunk_t *c);
CUresult unmap_chunks(chunk_t *const *cs, size_t n);
void alias_chunk(chunk_t *c);
CUresult unmap_failed_copy_in(chunk_t *c);
CUresult unalias_chunk(chunk_t *c);
CUresult map_chunk(chunk_t *c);
CUresult map_phys(chunk_t *c, phys_t *p);
CUresult phys_new(void);
phys_t *phys_pop(void);
void phys_push(phys_t *p);
void phys_release(phys_t *p);
/* warm.c */
int warm_free(uint64_t first, uint64_t n, CUstream fs);
warm_t *warm_take(uint64_t n);
int warm_take_at(uint64_t first, uint64_t n, warm_t **out);
int warm_late_at(uint64_t idx);
void warm_untake(warm_t *w);
int warm_ready(void);
CUresult warm_release(uint64_t want);
CUresult warm_late_reap(int block);
void warm_shutdown(void);
/* retire.c */
void ret_remove(chunk_t *c);
void retire_cancel(chunk_t *c);
void retire_settle(chunk_t *c);
int retire_may_give(const chunk_t *r);
phys_t *retire_steal(chunk_t **from);
phys_t *dying_steal(chunk_t **from);
void retire_unsteal(phys_t *p, chunk_t *from);
unsigned retire_poll(int block);
void retire_done(chunk_t *c);
int retire_free(int block);
int retire_oldest_behind_gate(void);
size_t phys_free_behind_gate(size_t k);
size_t retirees_ready(void);
size_t mem_coming(size_t k, size_t *r);
void retirees_gated(size_t r, evref_t *v);
int swapin_behind_gate(chunk_t *c, int planned);
size_t swapins_behind_gate(chunk_t *const *cs, size_t n, int planned);
int gate_behind(chunk_t *const *as, size_t na, chunk_t *const *bs, size_t nb, evref_t *first,
                evref_t **after, uint32_t *t);
void settle_in(chunk_t *c);
void chunk_release(chunk_t *c, CUstream free_stream);
CUresult reap_dying(int block);
/* buffer.c */
buf_t *lookup(uintptr_t p);
/* Walks the live buffers a query stands for: a range [lo, hi) gives each buffer it overlaps,
 * from lo on, up to the first address no buffer holds; a parameter word (hi == lo) gives the
 * buffer containing it or, when none does, the buffer that ends exactly there (an end pointer:
 * a kernel that walks a buffer backwards may be given only its end). Caller holds mem_lock. */
typedef struct query_walk {
    const ooc_query_t *q;
    uintptr_t at;
    int step;
} query_walk_t;
#define QUERY_WALK(qp) ((query_walk_t){.q = (qp), .at = (qp)->lo, .step = 0})
buf_t *query_next(query_walk_t *w); /* NULL at the end */
void buf_span(const buf_t *b, uint64_t *c0, uint64_t *c1);
/* resident.c */
int any_discard(void);
CUresult need_phys(uint64_t want);
/* transfer.c */
buf_t *plan_buf(uintptr_t addr, uint64_t id);
chunk_t *plan_chunk(const buf_t *b, uint64_t i);
uint64_t buf_chunks(const buf_t *b);
void unqueue_buffer(const buf_t *b);
int job_queued(job_t j);
int ahead_room(void);
void ahead_add(evref_t *v);
long serve_queued(void);
int serve_queued_some(unsigned max);
void serve_op_chunks(void);
int wait_op_swapouts(void);
int host_serves(void);

#endif
