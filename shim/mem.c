/* SPDX-License-Identifier: MIT */
/* mem.c: the shim's device memory: buffers at stable virtual addresses, physical chunks pooled
 * under the budget, and residency on demand.
 *
 * One VA reservation holds every buffer. It is cut into chunks of OOC_CHUNK bytes, the unit of
 * residency: a chunk is EMPTY (never backed; contents undefined, as cuMemAlloc's are), RESIDENT
 * (mapped to a physical chunk from the pool) or SWAPPED (its bytes in a pinned host slot). A
 * buffer of more than chunk/8 bytes owns whole chunks (waste below one chunk); smaller buffers
 * share slab chunks, 256-byte aligned. Physical chunks are created lazily up to budget/chunk and
 * never released before exit; host slots come from a pinned pool.
 *
 * Invariants: a RESIDENT chunk is mapped read-write at its address; it is unmapped only after
 * the work of every stream that used it since it was mapped has completed (events recorded on
 * those streams, or a context synchronisation when they are unknown); freed VA goes through a
 * quarantine before reuse, so a use after free faults.
 *
 * Locking: one mutex (mem_lock) guards everything here. ooc_mem_begin takes it and
 * ooc_mem_end releases it, so no eviction can slip between the residency check of an op and
 * its submission. The exception is the fast path (ooc_mem_fast_begin/end, "The fast path"
 * below): an op whose chunks are all hot (resident and stable, with the op's stream among their
 * users) is issued without the lock, inside a reader section; code under the lock that would
 * change what such an op relies on first enters a writer section (quiesce), which waits for the
 * readers in flight and keeps new ones out until mem_lock is released. The chunk table, each
 * chunk's hot flag, users, extent and touched flag, the safe-mode stream serials and fc_dirty
 * are what readers see; they are atomics. Chunk objects are freed only in a writer section. */
#include "shim.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#define uthash_nonfatal_oom(obj) (oom_flag = 1)
static int oom_flag;
#include <uthash.h>

enum { C_EMPTY, C_RESIDENT, C_SWAPPED };

#define MAX_USERS       4
#define MAX_STREAMS     16
#define SLAB_ALIGN      256
#define QUARANTINE_RUNS 64

/* A pooled event with a reference count: chunks and host slots waiting on the same copy share
 * one. Returned to the pool when the last reference is dropped (a later record does not disturb
 * waits already enqueued: cuStreamWaitEvent captures the record it sees). */
typedef struct evref {
    CUevent e;
    unsigned refs;
    struct evref *next;
} evref_t;

typedef struct phys {
    CUmemGenericAllocationHandle h;
    struct phys *next;
} phys_t;

typedef struct buf {
    uintptr_t addr;
    size_t size;
    uint64_t id;     /* serial number, never reused */
    uint64_t opmark; /* op serial that listed it in op_bufs */
    int small;
    UT_hash_handle hh;
} buf_t;

typedef struct slab {
    size_t offset; /* bump pointer */
    size_t n, cap;
    buf_t **bufs; /* sorted by address */
} slab_t;

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
    uint64_t pin; /* op serial that pinned it */
    int dying;
    /* Replay (planned, asynchronous transfers): */
    evref_t *in_ev;  /* a planned swap-in's copy: ops using the chunk wait for it on their stream */
    evref_t *out_ev; /* retiring: a planned swap-out's copy was issued; unmapped once it is done */
    int queued;      /* a planned swap-in is queued for the worker */
    int discard;     /* recompute: evicted without a copy (replay rebuilds its bytes) */
    /* Dying: events after the work of every stream that may still use it (fenced = 1), so its
     * memory can be taken back when they are done, without waiting for anything later. */
    evref_t *fence[MAX_USERS];
    unsigned nfence;
    int fenced;
    uint64_t when; /* the op serial when it began to die or retire */
} chunk_t;

/* A host slot that a copy still writes or reads: back to the pool once `ev` has completed. */
typedef struct limbo {
    hslot_t *slot;
    evref_t *ev;
} limbo_t;

/* A planned swap-in for the worker: the buffer at addr, if it is still serial `id`. */
typedef struct job {
    uintptr_t addr;
    uint64_t id;
    evref_t *gate; /* start once it has completed (may be NULL) */
} job_t;

/* A physical allocation the program made itself with the VMM API (NCCL does). */
typedef struct ext {
    CUmemGenericAllocationHandle h;
    size_t size;
    UT_hash_handle hh;
} ext_t;

typedef struct run {
    uint64_t first, count;
} run_t;

static pthread_mutex_t mem_lock = PTHREAD_MUTEX_INITIALIZER;

static struct {
    int ready;
    uint64_t chunk;
    unsigned shift;
    uintptr_t va_base;
    size_t va_size;
    uint64_t va_chunks, va_next;
    uint64_t budget_chunks, phys_made, resident;
    uint64_t budget_bytes;   /* OOC_BUDGET, less what the device turned out not to have */
    uint64_t external_bytes; /* device memory the program made with cuMemCreate itself */
    ext_t *external;
    phys_t *phys_free;
    chunk_t *chunks;
    buf_t *bufs;
    chunk_t lru;
    chunk_t *slab_cur;
    run_t quarantine[QUARANTINE_RUNS];
    unsigned q_head, q_len;
    run_t *free_runs;
    size_t nfree_runs, cap_free_runs;
    chunk_t **dying;
    size_t ndying, cap_dying;
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
    pthread_t worker;
    int worker_on, worker_stop;
    pthread_cond_t work_cv;
    pthread_cond_t done_cv; /* the worker finished with a chunk (queued went to 0) */
} M;

static uintptr_t chunk_addr(const chunk_t *c) {
    return M.va_base + ((uintptr_t)c->idx << M.shift);
}

/* ---- readers and writers: the fast path's grace periods ---------------------------------------
 *
 * A thread on the fast path is a reader: it counts itself in its reader slot (seq_cst), then
 * reads the writer flag (seq_cst) and gives up if it is set. Code under mem_lock that is about to
 * make a hot chunk not hot, free a chunk object, or (safe mode) gather the streams that issued
 * work, first enters a writer section (quiesce): it sets the flag (seq_cst), then waits until
 * every slot reads 0. This is Dekker's pattern: of a reader's increment and a writer's store,
 * whichever comes first in the single total order of seq_cst operations is seen by the other's
 * load, so either the reader sees the flag and issues nothing, or the writer sees the reader and
 * waits until it has issued its op and noted what it must (its decrement releases those writes
 * to the writer's acquiring load). From then on until the writer leaves the section no reader
 * passes the flag, so the writer may change anything the fast path reads. The section is left
 * when mem_lock is released (mem_unlock, mem_wait): it cannot be forgotten, and a whole locked
 * op that entered it is one step to the fast path. */

#define FP_SLOTS 16

static struct { _Alignas(64) _Atomic unsigned long n; } fp_readers[FP_SLOTS];
static _Atomic int fp_writer; /* a writer section is open */
static _Atomic int fp_on;     /* the fast path may be used (the reservation's table exists) */
static _Atomic unsigned fp_next_slot;
static _Thread_local int fp_slot = -1;
static _Thread_local int fp_stream = -1; /* the op's index in M.streams (safe mode) */

/* Enters a writer section (idempotent within one hold of mem_lock): returns once no fast-path op
 * is between its check of the writer flag and its end, and none can start one until mem_lock is
 * released. Caller holds mem_lock. */
static void quiesce(void) {
    if (M.quiesced)
        return;
    M.quiesced = 1;
    atomic_store(&fp_writer, 1);
    for (unsigned i = 0; i < FP_SLOTS; i++)
        for (unsigned spin = 0; atomic_load(&fp_readers[i].n) != 0; spin++)
            if (spin > 64)
                sched_yield();
    /* The chunks deleted before: no reader that could have read their pointers is left. */
    for (size_t i = 0; i < M.ngrave; i++)
        free(M.grave[i]);
    M.ngrave = 0;
}

/* Leaves the writer section, if this hold entered one. Caller holds mem_lock. */
static void quiesce_end(void) {
    if (M.quiesced) {
        M.quiesced = 0;
        atomic_store(&fp_writer, 0);
    }
}

/* Every release of mem_lock goes through one of these two. */
static void mem_unlock(void) {
    quiesce_end();
    pthread_mutex_unlock(&mem_lock);
}

static void mem_wait(pthread_cond_t *cv) {
    quiesce_end();
    pthread_cond_wait(cv, &mem_lock);
}

/* Makes c not hot, inside a writer section. Every change to a chunk that the fast path's
 * conditions depend on (set_hot) is preceded by this. A chunk that is not hot needs no section:
 * hot only goes from 1 to 0 here, so no fast-path op that saw it hot is still running. Caller
 * holds mem_lock. */
static void cool(chunk_t *c) {
    if (atomic_load_explicit(&c->hot, memory_order_relaxed)) {
        quiesce();
        atomic_store_explicit(&c->hot, 0, memory_order_relaxed);
    }
}

/* ---- LRU ------------------------------------------------------------------------------------- */

/* The list is ordered by the locked path; the fast path only sets a chunk's `touched` flag, and
 * eviction gives a touched chunk a second chance (need_phys), as CLOCK does. */
static void lru_remove(chunk_t *c) {
    if (!c->prev)
        return;
    c->prev->next = c->next;
    c->next->prev = c->prev;
    c->prev = c->next = NULL;
}

static void lru_push(chunk_t *c) {
    lru_remove(c);
    atomic_store_explicit(&c->touched, 0, memory_order_relaxed);
    c->next = M.lru.next;
    c->prev = &M.lru;
    M.lru.next->prev = c;
    M.lru.next = c;
}

/* ---- growing arrays and pooled events ------------------------------------------------------ */

/* Makes room for `need` elements of `elem` bytes in *p; 0 or -1 when out of memory. */
static int grow(void *p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap)
        return 0;
    size_t nc = *cap ? *cap * 2 : 64;
    while (nc < need)
        nc *= 2;
    void *n = realloc(*(void **)p, nc * elem);
    if (!n)
        return -1;
    *(void **)p = n;
    *cap = nc;
    return 0;
}

/* An event from the pool with one reference; NULL when none can be made. Caller holds mem_lock
 * (or is the only thread, at shutdown). */
static evref_t *ev_take(void) {
    evref_t *v = M.ev_free;
    if (v) {
        M.ev_free = v->next;
    } else {
        if (grow(&M.ev_all, &M.cap_ev_all, M.nev_all + 1, sizeof *M.ev_all) != 0)
            return NULL;
        v = calloc(1, sizeof *v);
        if (!v)
            return NULL;
        if (ooc_real.cuEventCreate(&v->e, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) {
            free(v);
            return NULL;
        }
        M.ev_all[M.nev_all++] = v;
    }
    v->refs = 1;
    v->next = NULL;
    return v;
}

static void ev_drop(evref_t *v) {
    if (v && --v->refs == 0) {
        v->next = M.ev_free;
        M.ev_free = v;
    }
}

/* Has the event's work completed? (Non-blocking; an error counts as done: the sticky error
 * surfaces to the program on its own calls.) */
static int ev_done(const evref_t *v) {
    return ooc_real.cuEventQuery(v->e) != CUDA_ERROR_NOT_READY;
}

/* Puts c at the cold end: the first to be evicted. */
static void lru_push_tail(chunk_t *c) {
    lru_remove(c);
    atomic_store_explicit(&c->touched, 0, memory_order_relaxed);
    c->prev = M.lru.prev;
    c->next = &M.lru;
    M.lru.prev->next = c;
    M.lru.prev = c;
}

/* ---- VA runs ------------------------------------------------------------------------------- */

/* Takes `count` contiguous chunk indices: a free run first (best fit), else the bump pointer.
 * Returns 0 and the first index, or -1 when the reservation is exhausted. */
static int va_take(uint64_t count, uint64_t *first) {
    size_t best = SIZE_MAX;
    for (size_t i = 0; i < M.nfree_runs; i++)
        if (M.free_runs[i].count >= count &&
            (best == SIZE_MAX || M.free_runs[i].count < M.free_runs[best].count))
            best = i;
    if (best != SIZE_MAX) {
        run_t *r = &M.free_runs[best];
        *first = r->first;
        r->first += count;
        r->count -= count;
        if (r->count == 0)
            M.free_runs[best] = M.free_runs[--M.nfree_runs];
        return 0;
    }
    if (M.va_next + count > M.va_chunks)
        return -1;
    *first = M.va_next;
    M.va_next += count;
    ooc_stats_gauge_add(OOC_STAT_va_bytes, count * M.chunk);
    return 0;
}

/* Returns a run to the quarantine; the oldest quarantined run becomes reusable. */
static void va_give(uint64_t first, uint64_t count) {
    if (M.q_len == QUARANTINE_RUNS) {
        run_t old = M.quarantine[M.q_head];
        M.q_head = (M.q_head + 1) % QUARANTINE_RUNS;
        M.q_len--;
        /* Coalesced with its free neighbours: a freed buffer's chunks come back one at a time,
         * and only a coalesced run serves a multi-chunk buffer again (else the reservation would
         * grow with every large free, and the search with it). A run that ends where the
         * untouched tail begins joins the tail. */
        for (size_t i = 0; i < M.nfree_runs;) {
            run_t *r = &M.free_runs[i];
            if (r->first + r->count == old.first || old.first + old.count == r->first) {
                if (r->first < old.first)
                    old.first = r->first;
                old.count += r->count;
                M.free_runs[i] = M.free_runs[--M.nfree_runs];
                i = 0; /* the merged run may now touch one already passed */
                continue;
            }
            i++;
        }
        if (old.first + old.count == M.va_next) {
            M.va_next = old.first;
            ooc_stats_gauge_sub(OOC_STAT_va_bytes, old.count * M.chunk);
            old.count = 0;
        }
        if (old.count && M.nfree_runs == M.cap_free_runs) {
            size_t nc = M.cap_free_runs ? M.cap_free_runs * 2 : 64;
            run_t *n = realloc(M.free_runs, nc * sizeof *n);
            if (n) {
                M.free_runs = n;
                M.cap_free_runs = nc;
            }
        }
        if (old.count && M.nfree_runs < M.cap_free_runs)
            M.free_runs[M.nfree_runs++] = old; /* else the range is lost: VA is plentiful */
    }
    M.quarantine[(M.q_head + M.q_len) % QUARANTINE_RUNS] = (run_t){first, count};
    M.q_len++;
}

/* ---- host slots -------------------------------------------------------------------------------
 */

#define HOST_BLOCK_CHUNKS 16

/* Makes the slots of one safe-mode block: a staging reservation with a host-located physical
 * chunk mapped at each slot. Returns CUDA_SUCCESS or the driver's error (nothing is kept). */
static CUresult host_block_safe(hslot_t *slots) {
    CUdeviceptr va;
    CUresult r = ooc_real.cuMemAddressReserve(&va, HOST_BLOCK_CHUNKS * M.chunk, M.chunk, 0, 0);
    if (r != CUDA_SUCCESS)
        return r;
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location = M.host_loc;
    CUmemAccessDesc d;
    memset(&d, 0, sizeof d);
    d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    d.location.id = M.dev;
    d.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    size_t made = 0, mapped = 0;
    for (; made < HOST_BLOCK_CHUNKS; made++) {
        hslot_t *s = &slots[made];
        s->va = va + made * M.chunk;
        if ((r = ooc_real.cuMemCreate(&s->h, M.chunk, &prop, 0)) != CUDA_SUCCESS)
            break;
        if ((r = ooc_real.cuMemMap(s->va, M.chunk, 0, s->h, 0)) != CUDA_SUCCESS) {
            ooc_real.cuMemRelease(s->h);
            break;
        }
        mapped++;
        if ((r = ooc_real.cuMemSetAccess(s->va, M.chunk, &d, 1)) != CUDA_SUCCESS) {
            made++;
            break;
        }
    }
    if (r == CUDA_SUCCESS)
        return CUDA_SUCCESS;
    for (size_t i = 0; i < mapped; i++) {
        ooc_real.cuMemUnmap(slots[i].va, M.chunk);
        ooc_real.cuMemRelease(slots[i].h);
    }
    ooc_real.cuMemAddressFree(va, HOST_BLOCK_CHUNKS * M.chunk);
    return r;
}

/* Takes a host slot from the pool, growing it by a block when empty; NULL when the host (or the
 * driver) has no more pinned memory. Caller holds mem_lock. */
static hslot_t *host_slot(void) {
    if (!M.host_free) {
        hslot_t **nb = realloc(M.host_blocks, (M.nhost_blocks + 1) * sizeof *nb);
        if (!nb)
            return NULL;
        M.host_blocks = nb;
        hslot_t *slots = calloc(HOST_BLOCK_CHUNKS, sizeof *slots);
        if (!slots)
            return NULL;
        if (M.safe) {
            if (host_block_safe(slots) != CUDA_SUCCESS) {
                free(slots);
                return NULL;
            }
        } else {
            void *block = NULL;
            if (ooc_real.cuMemHostAlloc(&block, HOST_BLOCK_CHUNKS * M.chunk, 0) != CUDA_SUCCESS) {
                free(slots);
                return NULL;
            }
            for (size_t i = 0; i < HOST_BLOCK_CHUNKS; i++)
                slots[i].p = (char *)block + i * M.chunk;
        }
        M.host_blocks[M.nhost_blocks++] = slots;
        for (size_t i = 0; i < HOST_BLOCK_CHUNKS; i++) {
            slots[i].next = M.host_free;
            M.host_free = &slots[i];
        }
    }
    hslot_t *s = M.host_free;
    M.host_free = s->next;
    s->next = NULL;
    return s;
}

static void host_slot_put(hslot_t *s) {
    if (s) {
        s->next = M.host_free;
        M.host_free = s;
    }
}

/* Copies a chunk between the device and its host slot on stream st (not waited for). */
static CUresult copy_out(chunk_t *c, CUstream st) {
    if (M.safe)
        return ooc_real.cuMemcpyDtoDAsync_v2(c->host->va, chunk_addr(c), M.chunk, st);
    return ooc_real.cuMemcpyDtoHAsync_v2(c->host->p, chunk_addr(c), M.chunk, st);
}

static CUresult copy_in(chunk_t *c, CUstream st) {
    if (M.safe)
        return ooc_real.cuMemcpyDtoDAsync_v2(chunk_addr(c), c->host->va, M.chunk, st);
    return ooc_real.cuMemcpyHtoDAsync_v2(chunk_addr(c), c->host->p, M.chunk, st);
}

/* Frees every host block; at shutdown, after every alias is unmapped. */
static void host_blocks_free(void) {
    for (size_t b = 0; b < M.nhost_blocks; b++) {
        hslot_t *slots = M.host_blocks[b];
        if (M.safe) {
            for (size_t i = 0; i < HOST_BLOCK_CHUNKS; i++) {
                ooc_real.cuMemUnmap(slots[i].va, M.chunk);
                ooc_real.cuMemRelease(slots[i].h);
            }
            ooc_real.cuMemAddressFree(slots[0].va, HOST_BLOCK_CHUNKS * M.chunk);
        } else {
            ooc_real.cuMemFreeHost(slots[0].p);
        }
        free(slots);
    }
    free(M.host_blocks);
}

/* ---- waiting for a chunk's users --------------------------------------------------------------
 */

/* Waits until the work of every stream in `users` has completed; the context when unknown. */
static CUresult wait_users(CUstream *users, unsigned n, int unknown) {
    if (unknown)
        return ooc_real.cuCtxSynchronize();
    for (unsigned i = 0; i < n; i++) {
        evref_t *v = ev_take();
        CUresult r = v ? ooc_real.cuEventRecord(v->e, users[i]) : CUDA_ERROR_OUT_OF_MEMORY;
        if (r == CUDA_SUCCESS)
            r = ooc_real.cuEventSynchronize(v->e);
        ev_drop(v);
        if (r != CUDA_SUCCESS) /* e.g. the stream was destroyed: wait for everything */
            return ooc_real.cuCtxSynchronize();
    }
    return CUDA_SUCCESS;
}

static void add_user(CUstream *users, unsigned *n, int *unknown, CUstream s) {
    if (s == CU_STREAM_PER_THREAD) {
        *unknown = 1; /* another thread's per-thread stream cannot be named from ours */
        return;
    }
    for (unsigned i = 0; i < *n; i++)
        if (users[i] == s)
            return;
    if (*n == MAX_USERS)
        *unknown = 1;
    else
        users[(*n)++] = s;
}

/* add_user for a chunk's own list, which the fast path reads without the lock: the entry is
 * written before the count that publishes it, and entries are never changed, only appended (the
 * list is emptied only when the chunk is unmapped, which cools it first). */
static void chunk_add_user(chunk_t *c, CUstream s) {
    unsigned n = atomic_load_explicit(&c->nusers, memory_order_relaxed);
    if (s == CU_STREAM_PER_THREAD) {
        c->users_unknown = 1;
        return;
    }
    for (unsigned i = 0; i < n; i++)
        if (atomic_load_explicit(&c->users[i], memory_order_relaxed) == s)
            return;
    if (n == MAX_USERS) {
        c->users_unknown = 1;
        return;
    }
    atomic_store_explicit(&c->users[n], s, memory_order_relaxed);
    atomic_store_explicit(&c->nusers, n + 1, memory_order_release);
}

/* Raises *cell to v (the fast path raises the same cells without the lock). */
static void raise_to(_Atomic uint64_t *cell, uint64_t v) {
    uint64_t old = atomic_load_explicit(cell, memory_order_relaxed);
    while (old < v && !atomic_compare_exchange_weak_explicit(cell, &old, v, memory_order_relaxed,
                                                             memory_order_relaxed)) {
    }
}

/* Notes that an op was issued on s. Caller holds mem_lock. */
static void stream_issued(CUstream s) {
    if (s == CU_STREAM_PER_THREAD) {
        raise_to(&M.streams_lost, M.serial);
        return;
    }
    for (unsigned i = 0; i < M.nstreams; i++) {
        if (M.streams[i].s == s) {
            raise_to(&M.streams[i].last, M.serial);
            return;
        }
    }
    if (M.nstreams == MAX_STREAMS) {
        raise_to(&M.streams_lost, M.serial);
        return;
    }
    M.streams[M.nstreams].s = s;
    M.streams[M.nstreams].last = M.serial;
    atomic_store_explicit(&M.nstreams, M.nstreams + 1, memory_order_release);
}

/* The streams whose work must complete before the chunks can be unmapped (users, at most
 * MAX_USERS + MAX_STREAMS of them): see wait_chunks. Returns 1 when some cannot be named (then
 * only a context synchronisation will do). Caller holds mem_lock. */
static int gather_streams(chunk_t *const *cs, size_t n, CUstream *users, unsigned *nu_out) {
    unsigned nu = 0;
    int unknown = 0;
    uint64_t since = UINT64_MAX;
    /* The chunks are about to be waited for: no fast-path op may add work on them from now on,
     * and in safe mode every fast-path issue so far must be seen in M.streams (a hidden access
     * may come from any of them). */
    if (M.safe)
        quiesce();
    for (size_t i = 0; i < n; i++)
        cool(cs[i]);
    for (size_t i = 0; i < n; i++) {
        unknown |= cs[i]->users_unknown;
        for (unsigned u = 0; u < cs[i]->nusers; u++)
            add_user(users, &nu, &unknown, cs[i]->users[u]);
        if (cs[i]->since < since)
            since = cs[i]->since;
    }
    if (M.safe && n) {
        if (M.streams_lost > since)
            unknown = 1;
        for (unsigned i = 0; i < M.nstreams && !unknown; i++) {
            if (M.streams[i].last <= since)
                continue;
            unsigned k = 0;
            while (k < nu && users[k] != M.streams[i].s)
                k++;
            if (k == nu)
                users[nu++] = M.streams[i].s;
        }
    }
    *nu_out = nu;
    return unknown;
}

/* Waits until the chunks can be unmapped: the work of their known users has completed and, in
 * safe mode, the work of every stream that issued an op since the oldest of them was mapped
 * (an access the shim could not see, through a pointer stored in device memory, may be in
 * flight on any of them). Caller holds mem_lock. */
static CUresult wait_chunks(chunk_t *const *cs, size_t n) {
    CUstream users[MAX_USERS + MAX_STREAMS];
    unsigned nu = 0;
    int unknown = gather_streams(cs, n, users, &nu);
    return wait_users(users, nu, unknown);
}

/* ---- chunk life --------------------------------------------------------------------------------
 */

/* A new chunk at idx, part of the buffer whose chunks are [first, first + n), published to the
 * fast path (which finds it cold). Caller holds mem_lock. */
static chunk_t *chunk_new(uint64_t idx, uint64_t first, uint64_t n) {
    chunk_t *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->idx = idx;
    c->state = C_EMPTY;
    atomic_store_explicit(&c->ext_first, first, memory_order_relaxed); /* published below */
    atomic_store_explicit(&c->ext_n, n, memory_order_relaxed);
    oom_flag = 0;
    HASH_ADD(hh, M.chunks, idx, sizeof c->idx, c);
    if (oom_flag) {
        free(c);
        return NULL;
    }
    if (M.table)
        atomic_store_explicit(&M.table[idx], c, memory_order_release);
    return c;
}

static chunk_t *chunk_find(uint64_t idx) {
    chunk_t *c;
    HASH_FIND(hh, M.chunks, &idx, sizeof idx, c);
    return c;
}

/* Forgets a chunk and frees it after a grace period: a fast-path op may have read its pointer
 * from the table (it then finds the chunk cold: deleted chunks are). Inside a writer section no
 * reader is left, so it is freed at once; otherwise it waits in the graveyard for the next
 * writer section (a free of a chunk no op ever used need not stop the fast path). Caller holds
 * mem_lock. */
static void chunk_delete(chunk_t *c) {
    if (M.table && c->idx < M.va_chunks &&
        atomic_load_explicit(&M.table[c->idx], memory_order_relaxed) == c)
        atomic_store_explicit(&M.table[c->idx], NULL, memory_order_relaxed);
    HASH_DEL(M.chunks, c);
    if (c->slab) {
        free(c->slab->bufs);
        free(c->slab);
        c->slab = NULL;
    }
    if (!M.quiesced && M.ngrave < 256 &&
        grow(&M.grave, &M.cap_grave, M.ngrave + 1, sizeof *M.grave) == 0) {
        M.grave[M.ngrave++] = c;
        return;
    }
    quiesce();
    free(c);
}

/* Unmaps a resident chunk whose users have completed; its physical chunk returns to the pool. */
static CUresult unmap_chunk(chunk_t *c) {
    cool(c);
    if (M.safe)
        quiesce(); /* wait_chunks did already, unless the lock was let go since */
    CUresult r = ooc_real.cuMemUnmap(chunk_addr(c), M.chunk);
    if (r != CUDA_SUCCESS)
        return r;
    c->phys->next = M.phys_free;
    M.phys_free = c->phys;
    c->phys = NULL;
    c->state = C_SWAPPED;
    c->nusers = 0;
    c->users_unknown = 0;
    ev_drop(c->in_ev);
    c->in_ev = NULL;
    M.resident--;
    ooc_stats_gauge_sub(OOC_STAT_resident_bytes, M.chunk);
    return CUDA_SUCCESS;
}

/* Safe mode: maps a swapped chunk's host slot at the chunk's own address, so that an access the
 * shim could not see reaches the host copy, slowly but correctly. A failure is logged and leaves
 * the address unmapped (such an access would then fault); the data is safe either way. */
static void alias_chunk(chunk_t *c) {
    CUresult r = ooc_real.cuMemMap(chunk_addr(c), M.chunk, 0, c->host->h, 0);
    if (r == CUDA_SUCCESS) {
        CUmemAccessDesc d;
        memset(&d, 0, sizeof d);
        d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        d.location.id = M.dev;
        d.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        r = ooc_real.cuMemSetAccess(chunk_addr(c), M.chunk, &d, 1);
        if (r != CUDA_SUCCESS)
            ooc_real.cuMemUnmap(chunk_addr(c), M.chunk);
    }
    if (r != CUDA_SUCCESS) {
        OOC_LOG_W("safe mode: the swapped chunk at %#llx could not be mapped to its host copy "
                  "(%s); an access the shim cannot see would fault there",
                  (unsigned long long)chunk_addr(c), ooc_real_errname(r));
        return;
    }
    c->aliased = 1;
    c->since = M.serial;
    ooc_stats_add(OOC_STAT_host_aliases, 1);
}

/* Removes a chunk's host alias; the caller waited for the streams that may use it. */
static CUresult unalias_chunk(chunk_t *c) {
    if (!c->aliased)
        return CUDA_SUCCESS;
    cool(c);
    quiesce();
    CUresult r = ooc_real.cuMemUnmap(chunk_addr(c), M.chunk);
    if (r == CUDA_SUCCESS)
        c->aliased = 0;
    return r;
}

/* Gives back what a dead chunk holds (its users are done): device or host mapping, host slot,
 * addresses. */
static CUresult chunk_bury(chunk_t *c) {
    CUresult r = c->state == C_RESIDENT ? unmap_chunk(c) : unalias_chunk(c);
    if (r != CUDA_SUCCESS)
        return r;
    for (unsigned i = 0; i < c->nfence; i++)
        ev_drop(c->fence[i]);
    host_slot_put(c->host);
    c->host = NULL;
    va_give(c->idx, 1);
    chunk_delete(c);
    return CUDA_SUCCESS;
}

/* ---- planned transfers: retiring chunks and host slots in flight ------------------------------
 */

/* Keeps slot s out of the pool until ev's copy is done (takes a reference on ev). */
static void limbo_put(hslot_t *s, evref_t *ev) {
    if (!s)
        return;
    if (grow(&M.limbo, &M.cap_limbo, M.nlimbo + 1, sizeof *M.limbo) != 0) {
        ooc_real.cuEventSynchronize(ev->e); /* no room to defer: wait for the copy now */
        host_slot_put(s);
        return;
    }
    ev->refs++;
    M.limbo[M.nlimbo++] = (limbo_t){s, ev};
}

/* Returns to the pool the slots whose copies are done. */
static void limbo_poll(void) {
    size_t k = 0;
    for (size_t i = 0; i < M.nlimbo; i++) {
        if (ev_done(M.limbo[i].ev)) {
            host_slot_put(M.limbo[i].slot);
            ev_drop(M.limbo[i].ev);
        } else {
            M.limbo[k++] = M.limbo[i];
        }
    }
    M.nlimbo = k;
}

static void ret_remove(chunk_t *c) {
    for (size_t i = 0; i < M.nret; i++) {
        if (M.ret[i] == c) {
            memmove(&M.ret[i], &M.ret[i + 1], (M.nret - i - 1) * sizeof *M.ret);
            M.nret--;
            return;
        }
    }
}

/* A retiring chunk is used again before its swap-out was finished: it stays resident (its
 * device bytes are current); its host slot goes back once the copy writing it is done. */
static void retire_cancel(chunk_t *c) {
    ret_remove(c);
    chunk_add_user(c, M.d2h); /* the copy still reads it */
    limbo_put(c->host, c->out_ev);
    c->host = NULL;
    ev_drop(c->out_ev);
    c->out_ev = NULL;
    ooc_stats_add(OOC_STAT_swap_cancels, 1);
}

/* The swap-out copy of c is done: its physical chunk returns to the pool and, in safe mode, its
 * host copy is mapped at its address. Every user of c was waited for by the copy (a later user
 * would have cancelled the swap-out); in safe mode the streams that may reach it unseen are
 * waited for here. */
static CUresult retire_finish(chunk_t *c) {
    CUresult r = M.safe ? wait_chunks(&c, 1) : CUDA_SUCCESS;
    ret_remove(c);
    ev_drop(c->out_ev);
    c->out_ev = NULL;
    if (r == CUDA_SUCCESS)
        r = unmap_chunk(c); /* keeps c->host: the finished copy is now the chunk's bytes */
    if (r != CUDA_SUCCESS) {
        /* Still mapped, bytes current: it stays resident; the finished host copy is dropped. */
        host_slot_put(c->host);
        c->host = NULL;
        lru_push(c);
        return r;
    }
    if (M.safe)
        alias_chunk(c);
    return CUDA_SUCCESS;
}

/* Finishes the retiring chunks whose copies are done, oldest first (the device-to-host stream
 * runs them in order); with `block`, waits for the oldest when none is. Returns how many. */
static unsigned retire_poll(int block) {
    unsigned n = 0;
    while (M.nret) {
        chunk_t *c = M.ret[0];
        if (!ev_done(c->out_ev)) {
            if (!block || n)
                break;
            ooc_real.cuEventSynchronize(c->out_ev->e);
        }
        retire_finish(c); /* leaves the list either way */
        n++;
    }
    return n;
}

/* An event after the work issued so far on s (shared by the chunks freed between two ops). The
 * cache is valid while no op was issued: locked ops advance fc_epoch, fast-path ops set
 * fc_dirty, which is read here inside a writer section (all of them are seen). */
static evref_t *fence_ev(CUstream s) {
    quiesce();
    if (atomic_exchange_explicit(&M.fc_dirty, 0, memory_order_relaxed))
        M.fc_epoch++;
    for (unsigned i = 0; i < 8; i++) {
        if (M.fcache[i].v && M.fcache[i].s == s && M.fcache[i].epoch == M.fc_epoch) {
            M.fcache[i].v->refs++;
            return M.fcache[i].v;
        }
    }
    evref_t *v = ev_take();
    if (!v)
        return NULL;
    if (ooc_real.cuEventRecord(v->e, s) != CUDA_SUCCESS) {
        ev_drop(v);
        return NULL;
    }
    unsigned k = M.fc_next++ % 8;
    ev_drop(M.fcache[k].v);
    M.fcache[k].s = s;
    M.fcache[k].epoch = M.fc_epoch;
    M.fcache[k].v = v;
    v->refs++;
    return v;
}

/* Fences a dying chunk: events after the work of every stream that may use it (no later op may:
 * its buffer is freed). Unfenced when the streams cannot all be named. */
static void fence_chunk(chunk_t *c) {
    CUstream us[MAX_USERS + MAX_STREAMS];
    unsigned nu = 0;
    c->fenced = 0;
    if (gather_streams(&c, 1, us, &nu) || nu > MAX_USERS)
        return;
    if (c->in_ev && nu == MAX_USERS)
        return;
    for (unsigned i = 0; i < nu; i++) {
        evref_t *v = fence_ev(us[i]);
        if (!v)
            return;
        c->fence[c->nfence++] = v;
    }
    if (c->in_ev) { /* the copy that brought it in is not one of its users' streams */
        c->in_ev->refs++;
        c->fence[c->nfence++] = c->in_ev;
    }
    c->fenced = 1;
}

/* Waits for the copy that brought c in, if one may still run (before unmapping c without a
 * fence that covers it). */
static void settle_in(chunk_t *c) {
    if (c->in_ev) {
        ooc_real.cuEventSynchronize(c->in_ev->e);
        ev_drop(c->in_ev);
        c->in_ev = NULL;
    }
}

static int fence_done(const chunk_t *c) {
    if (!c->fenced)
        return 0;
    for (unsigned i = 0; i < c->nfence; i++)
        if (!ev_done(c->fence[i]))
            return 0;
    return 1;
}

/* A chunk that no live buffer uses any more: its memory goes back once its users are done. */
static void chunk_release(chunk_t *c, CUstream free_stream) {
    cool(c);
    /* A parameter word pointing into it no longer references a buffer. (A fast-path op that
     * still reads the old extent finds the chunk cold and takes the locked path.) */
    atomic_store_explicit(&c->ext_n, 0, memory_order_relaxed);
    if (c->out_ev) {
        /* Freed while its swap-out runs: the copy is one more user to wait for. */
        ret_remove(c);
        chunk_add_user(c, M.d2h);
        ev_drop(c->out_ev);
        c->out_ev = NULL;
    }
    c->queued = 0;
    lru_remove(c);
    if (c == M.slab_cur)
        M.slab_cur = NULL;
    if (c->state != C_RESIDENT && !c->aliased) {
        chunk_bury(c); /* nothing mapped: cannot fail */
        return;
    }
    if (free_stream)
        chunk_add_user(c, free_stream);
    if (M.ndying == M.cap_dying) {
        size_t nc = M.cap_dying ? M.cap_dying * 2 : 64;
        chunk_t **n = realloc(M.dying, nc * sizeof *n);
        if (!n) {
            /* No room to defer: wait now rather than unmap under running work. */
            settle_in(c);
            if (wait_chunks(&c, 1) == CUDA_SUCCESS)
                chunk_bury(c);
            return;
        }
        M.dying = n;
        M.cap_dying = nc;
    }
    c->dying = 1;
    c->when = M.serial;
    fence_chunk(c);
    M.dying[M.ndying++] = c;
}

/* Releases the memory of the dying chunks whose fences are done. With `block`, when none is:
 * waits for the oldest one's fence, or, when it has none, for the users of every unfenced one. */
static CUresult reap_dying(int block) {
    size_t k = 0;
    unsigned freed = 0;
    for (size_t i = 0; i < M.ndying; i++) {
        chunk_t *c = M.dying[i];
        if (fence_done(c) && chunk_bury(c) == CUDA_SUCCESS)
            freed++;
        else
            M.dying[k++] = c;
    }
    M.ndying = k;
    if (freed || !block || !M.ndying)
        return CUDA_SUCCESS;
    chunk_t *c = M.dying[0];
    if (c->fenced) {
        for (unsigned i = 0; i < c->nfence; i++)
            ooc_real.cuEventSynchronize(c->fence[i]->e);
        CUresult r = chunk_bury(c);
        if (r == CUDA_SUCCESS)
            memmove(&M.dying[0], &M.dying[1], --M.ndying * sizeof *M.dying);
        return r;
    }
    /* Gather the unfenced at the front, each list keeping its order (a stable partition in
     * place: an unfenced chunk moves down over the fenced ones before it). */
    k = 0;
    for (size_t i = 0; i < M.ndying; i++) {
        if (M.dying[i]->fenced)
            continue;
        chunk_t *u = M.dying[i];
        memmove(&M.dying[k + 1], &M.dying[k], (i - k) * sizeof *M.dying);
        M.dying[k++] = u;
    }
    size_t nun = k;
    CUresult r = wait_chunks(M.dying, nun);
    for (size_t i = 0; i < nun; i++)
        settle_in(M.dying[i]);
    size_t left = 0;
    for (size_t i = 0; i < M.ndying; i++) {
        if (i < nun && r == CUDA_SUCCESS && chunk_bury(M.dying[i]) == CUDA_SUCCESS)
            continue;
        M.dying[left++] = M.dying[i];
    }
    M.ndying = left;
    return r;
}

/* Makes a physical chunk available: a new one while under budget, else a dying chunk's, else
 * by swapping out least recently used chunks (up to `want` at once). */
/* Is some resident chunk's memory given up by the plan (need_phys takes it first)? */
static int any_discard(void) {
    for (chunk_t *c = M.lru.prev; c != &M.lru; c = c->prev)
        if (c->discard && c->pin != M.serial)
            return 1;
    return 0;
}

/* Takes the victims' memory back: waits for their users, copies them out (those whose bytes
 * the plan gave up are not copied), unmaps them. Caller holds mem_lock. */
static CUresult evict(chunk_t **victims, unsigned nv) {
    CUresult r = wait_chunks(victims, nv);
    if (r != CUDA_SUCCESS)
        return r;
    for (unsigned i = 0; i < nv; i++)
        settle_in(victims[i]); /* the copy out must not read what the copy in still writes */
    for (unsigned i = 0; i < nv && r == CUDA_SUCCESS; i++) {
        if (victims[i]->discard)
            continue; /* its bytes will be rebuilt: nothing to keep */
        victims[i]->host = host_slot();
        if (!victims[i]->host)
            r = CUDA_ERROR_OUT_OF_MEMORY;
        else
            r = copy_out(victims[i], M.swap);
    }
    if (r == CUDA_SUCCESS)
        r = ooc_real.cuStreamSynchronize(M.swap);
    if (r != CUDA_SUCCESS) {
        /* The victims stay resident with their data; nothing was unmapped. */
        for (unsigned i = 0; i < nv; i++) {
            host_slot_put(victims[i]->host);
            victims[i]->host = NULL;
        }
        return r;
    }
    for (unsigned i = 0; i < nv; i++) {
        OOC_LOG_D("op %llu: evicts chunk %llu (buffer %llu, last used at op %llu): resident %llu, "
                  "retiring %llu, dying %llu",
                  (unsigned long long)M.serial, (unsigned long long)victims[i]->idx,
                  (unsigned long long)(victims[i]->owner ? victims[i]->owner->id : 0),
                  (unsigned long long)victims[i]->pin, (unsigned long long)M.resident,
                  (unsigned long long)M.nret, (unsigned long long)M.ndying);
        lru_remove(victims[i]);
        r = unmap_chunk(victims[i]);
        if (r != CUDA_SUCCESS)
            return r;
        if (victims[i]->discard) {
            victims[i]->state = C_EMPTY;
            victims[i]->discard = 0;
            ooc_stats_add(OOC_STAT_recompute_evictions, 1);
            continue;
        }
        if (M.safe)
            alias_chunk(victims[i]);
        ooc_stats_add(OOC_STAT_swap_outs, 1);
        ooc_stats_add(OOC_STAT_swap_out_bytes, M.chunk);
        ooc_stats_add(OOC_STAT_lru_evictions, 1);
    }
    return CUDA_SUCCESS;
}

static CUresult need_phys(uint64_t want) {
    if (M.phys_free)
        return CUDA_SUCCESS;
    if (M.phys_made < M.budget_chunks) {
        CUmemAllocationProp prop;
        memset(&prop, 0, sizeof prop);
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = M.dev;
        phys_t *p = calloc(1, sizeof *p);
        if (!p)
            return CUDA_ERROR_OUT_OF_MEMORY;
        CUresult r = ooc_real.cuMemCreate(&p->h, M.chunk, &prop, 0);
        if (r == CUDA_SUCCESS) {
            p->next = M.phys_free;
            M.phys_free = p;
            M.phys_made++;
            return CUDA_SUCCESS;
        }
        free(p);
        if (r != CUDA_ERROR_OUT_OF_MEMORY)
            return r;
        /* The device has less than the budget: live with what we have. */
        OOC_LOG_W("the device ran out of memory at %llu chunks, below the budget of %llu; "
                  "using that as the budget",
                  (unsigned long long)M.phys_made, (unsigned long long)M.budget_chunks);
        M.budget_chunks = M.phys_made;
        M.budget_bytes = M.phys_made * M.chunk + M.external_bytes;
    }
    /* Chunks whose bytes the plan gave up (dropped, to be rebuilt by recompute): the plan counts
     * their memory as free from the drop on, so they go first, without a copy. */
    chunk_t *victims[64];
    unsigned nv = 0;
    if (want > 64)
        want = 64;
    for (chunk_t *c = M.lru.prev; c != &M.lru && nv < want; c = c->prev)
        if (c->discard && c->pin != M.serial)
            victims[nv++] = c;
    if (nv)
        return evict(victims, nv);
    /* Freed buffers and planned swap-outs whose work is done; else wait for the older. */
    if (M.ndying)
        reap_dying(0);
    if (M.nret && !M.phys_free)
        retire_poll(0);
    while (!M.phys_free && (M.ndying || M.nret)) {
        int dying_first =
            M.ndying && (!M.nret || !M.dying[0]->fenced || M.dying[0]->when <= M.ret[0]->when);
        if (dying_first) {
            CUresult r = reap_dying(1);
            if (r != CUDA_SUCCESS)
                return r;
        } else if (!retire_poll(1)) {
            break;
        }
    }
    if (M.phys_free)
        return CUDA_SUCCESS;
    /* Swap out the least recently used chunks that the current op does not need. A chunk the
     * fast path used since it was placed in the list gets a second chance: it goes back to the
     * head (the walk meets it again last, untouched, unless used again meanwhile: bounded). */
    uint64_t steps = 2 * M.resident + 64;
    for (chunk_t *c = M.lru.prev, *prev; c != &M.lru && nv < want && steps; c = prev, steps--) {
        prev = c->prev;
        if (c->pin == M.serial)
            continue;
        if (atomic_load_explicit(&c->touched, memory_order_relaxed)) {
            lru_push(c);
            continue;
        }
        victims[nv++] = c;
    }
    if (nv == 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    return evict(victims, nv);
}

/* Maps a physical chunk at c (taken from the free list) with read-write access. In safe mode no
 * fast-path op may be issued between the mapping and the end of this hold of mem_lock (an op
 * issued meanwhile could reach c unseen, and an error path unmaps c at once). */
static CUresult map_chunk(chunk_t *c) {
    if (M.safe)
        quiesce();
    phys_t *p = M.phys_free;
    CUresult r = ooc_real.cuMemMap(chunk_addr(c), M.chunk, 0, p->h, 0);
    if (r != CUDA_SUCCESS)
        return r;
    CUmemAccessDesc d;
    memset(&d, 0, sizeof d);
    d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    d.location.id = M.dev;
    d.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    r = ooc_real.cuMemSetAccess(chunk_addr(c), M.chunk, &d, 1);
    if (r != CUDA_SUCCESS) {
        ooc_real.cuMemUnmap(chunk_addr(c), M.chunk);
        return r;
    }
    M.phys_free = p->next;
    c->phys = p;
    c->since = M.serial;
    c->discard = 0;
    M.resident++;
    ooc_stats_gauge_add(OOC_STAT_resident_bytes, M.chunk);
    return CUDA_SUCCESS;
}

/* ---- init ---------------------------------------------------------------------------------- */

int ooc_mem_init(uint64_t budget_bytes, uint64_t chunk_bytes, CUdevice dev, CUcontext ctx,
                 const CUmemLocation *safe_loc) {
    M.ctx = ctx;
    M.safe = safe_loc != NULL;
    if (safe_loc)
        M.host_loc = *safe_loc;
    M.chunk = chunk_bytes;
    M.shift = (unsigned)__builtin_ctzll(chunk_bytes);
    M.dev = dev;
    M.budget_chunks = budget_bytes / chunk_bytes;
    M.budget_bytes = budget_bytes;
    M.lru.next = M.lru.prev = &M.lru;
    /* Up to 1 TiB of addresses: reserving costs nothing, and buffers never move. Where the
     * address space is limited (valgrind, ulimit -v), settle for less, down to 4x the budget. */
    CUdeviceptr base;
    CUresult r = CUDA_ERROR_OUT_OF_MEMORY;
    uint64_t floor = 4 * budget_bytes > ((uint64_t)1 << 32) ? 4 * budget_bytes : (uint64_t)1 << 32;
    for (M.va_size = (size_t)1 << 40; M.va_size >= floor; M.va_size /= 2) {
        r = ooc_real.cuMemAddressReserve(&base, M.va_size, chunk_bytes, 0, 0);
        if (r == CUDA_SUCCESS)
            break;
    }
    if (r != CUDA_SUCCESS) {
        OOC_LOG_E("cuMemAddressReserve failed: %s", ooc_real_errname(r));
        return OOC_EDRIVER;
    }
    M.va_base = (uintptr_t)base;
    M.va_chunks = M.va_size >> M.shift;
    /* The fast path's table: one pointer per chunk of the reservation, touched only where
     * buffers are. Without it every op takes the locked path. */
    M.table_bytes = M.va_chunks * sizeof *M.table;
    void *t = mmap(NULL, M.table_bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (t == MAP_FAILED)
        OOC_LOG_I("no lock-free launch path: the chunk table (%zu bytes of addresses) could not "
                  "be mapped; every operation takes the lock",
                  M.table_bytes);
    M.table = t == MAP_FAILED ? NULL : t;
    r = ooc_real.cuStreamCreate(&M.swap, CU_STREAM_NON_BLOCKING);
    if (r != CUDA_SUCCESS) {
        ooc_real.cuMemAddressFree(base, M.va_size);
        if (M.table)
            munmap((void *)M.table, M.table_bytes);
        M.table = NULL;
        OOC_LOG_E("cuStreamCreate failed: %s", ooc_real_errname(r));
        return OOC_EDRIVER;
    }
    __atomic_store_n(&M.ready, 1, __ATOMIC_RELEASE);
    return 0;
}

/* Frees everything the pool holds; called at exit after the program's work is done. */
void ooc_mem_shutdown(void) {
    pthread_mutex_lock(&mem_lock);
    if (!M.ready) {
        mem_unlock();
        return;
    }
    quiesce();
    atomic_store(&fp_on, 0); /* seen by every fast-path op that passes the writer flag later */
    if (M.worker_on) {
        M.worker_stop = 1;
        pthread_cond_signal(&M.work_cv);
        mem_unlock();
        pthread_join(M.worker, NULL);
        pthread_mutex_lock(&mem_lock);
        pthread_cond_destroy(&M.work_cv);
        pthread_cond_destroy(&M.done_cv);
    }
    /* The program may have dropped its context before exit: ours is the one we set up in. */
    CUcontext prev = NULL;
    ooc_real.cuCtxGetCurrent(&prev);
    ooc_real.cuCtxSetCurrent(M.ctx);
    ooc_real.cuCtxSynchronize();
    for (size_t i = 0; i < M.nlimbo; i++) {
        host_slot_put(M.limbo[i].slot);
        ev_drop(M.limbo[i].ev);
    }
    for (unsigned i = 0; i < 8; i++)
        ev_drop(M.fcache[i].v);
    chunk_t *c, *tmp;
    HASH_ITER(hh, M.chunks, c, tmp) {
        ev_drop(c->in_ev);
        ev_drop(c->out_ev);
        c->in_ev = c->out_ev = NULL;
        if (c->state == C_RESIDENT && unmap_chunk(c) != CUDA_SUCCESS) {
            /* After a sticky device error nothing can be unmapped; free our side anyway. */
            ooc_real.cuMemRelease(c->phys->h);
            free(c->phys);
        } else if (c->state != C_RESIDENT) {
            unalias_chunk(c);
        }
        chunk_delete(c);
    }
    buf_t *b, *bt;
    HASH_ITER(hh, M.bufs, b, bt) {
        HASH_DEL(M.bufs, b);
        free(b);
    }
    ext_t *e, *et;
    HASH_ITER(hh, M.external, e, et) {
        HASH_DEL(M.external, e);
        free(e);
    }
    while (M.phys_free) {
        phys_t *p = M.phys_free;
        M.phys_free = p->next;
        ooc_real.cuMemRelease(p->h);
        free(p);
    }
    host_blocks_free();
    ooc_real.cuStreamDestroy_v2(M.swap);
    if (M.h2d)
        ooc_real.cuStreamDestroy_v2(M.h2d);
    if (M.d2h)
        ooc_real.cuStreamDestroy_v2(M.d2h);
    for (size_t i = 0; i < M.nev_all; i++) {
        ooc_real.cuEventDestroy_v2(M.ev_all[i]->e);
        free(M.ev_all[i]);
    }
    free(M.ev_all);
    free(M.ret);
    free(M.limbo);
    free(M.jobs);
    free(M.op_tmp);
    ooc_real.cuMemAddressFree((CUdeviceptr)M.va_base, M.va_size);
    free(M.free_runs);
    free(M.dying);
    free(M.op_chunks);
    free(M.op_bufs);
    ooc_real.cuCtxSetCurrent(prev);
    quiesce(); /* again if the lock was let go above: no reader may see the table go */
    if (M.table)
        munmap((void *)M.table, M.table_bytes);
    free(M.grave);
    memset(&M, 0, sizeof M);
    M.quiesced = 1; /* still in the section entered above: mem_unlock leaves it */
    mem_unlock();
}

int ooc_mem_owns(uintptr_t p) {
    return __atomic_load_n(&M.ready, __ATOMIC_ACQUIRE) && p >= M.va_base &&
           p - M.va_base < M.va_size;
}

void ooc_mem_forget_in_child(void) {
    __atomic_store_n(&M.ready, 0, __ATOMIC_RELEASE);
}

/* ---- buffers --------------------------------------------------------------------------------- */

static int slab_insert(slab_t *s, buf_t *b) {
    if (s->n == s->cap) {
        size_t nc = s->cap ? s->cap * 2 : 16;
        buf_t **n = realloc(s->bufs, nc * sizeof *n);
        if (!n)
            return -1;
        s->bufs = n;
        s->cap = nc;
    }
    s->bufs[s->n++] = b; /* bump allocation: addresses only grow */
    return 0;
}

static buf_t *slab_find(const slab_t *s, uintptr_t p) {
    size_t lo = 0, hi = s->n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        const buf_t *b = s->bufs[mid];
        if (p < b->addr)
            hi = mid;
        else if (p >= b->addr + b->size)
            lo = mid + 1;
        else
            return s->bufs[mid];
    }
    return NULL;
}

static void slab_remove(slab_t *s, const buf_t *b) {
    for (size_t i = 0; i < s->n; i++) {
        if (s->bufs[i] == b) {
            memmove(&s->bufs[i], &s->bufs[i + 1], (s->n - i - 1) * sizeof *s->bufs);
            s->n--;
            return;
        }
    }
}

static CUresult alloc_small(buf_t *b, size_t size) {
    size_t need = (size + SLAB_ALIGN - 1) & ~(size_t)(SLAB_ALIGN - 1);
    chunk_t *c = M.slab_cur;
    if (!c || c->slab->offset + need > M.chunk) {
        uint64_t idx;
        if (va_take(1, &idx) != 0)
            return CUDA_ERROR_OUT_OF_MEMORY;
        c = chunk_new(idx, idx, 1);
        slab_t *s = calloc(1, sizeof *s);
        if (!c || !s) {
            free(s);
            if (c)
                chunk_delete(c);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        c->slab = s;
        chunk_t *full = M.slab_cur;
        M.slab_cur = c;
        /* A full slab chunk whose buffers are all freed already: no later free releases it. */
        if (full && full->nbufs == 0)
            chunk_release(full, NULL);
    }
    if (slab_insert(c->slab, b) != 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    b->addr = chunk_addr(c) + c->slab->offset;
    b->small = 1;
    c->slab->offset += need;
    c->nbufs++;
    return CUDA_SUCCESS;
}

static CUresult alloc_large(buf_t *b, size_t size) {
    uint64_t count = (size + M.chunk - 1) >> M.shift, first;
    if (va_take(count, &first) != 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    for (uint64_t i = 0; i < count; i++) {
        chunk_t *c = chunk_new(first + i, first, count);
        if (!c) {
            for (uint64_t j = 0; j < i; j++)
                chunk_delete(chunk_find(first + j));
            va_give(first, count);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        c->owner = b;
        c->nbufs = 1;
    }
    b->addr = M.va_base + ((uintptr_t)first << M.shift);
    return CUDA_SUCCESS;
}

CUresult ooc_mem_alloc(CUdeviceptr *out, size_t size, uint64_t *id) {
    if (!out || size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mem_lock);
    if (size > M.budget_chunks * M.chunk) {
        mem_unlock();
        OOC_LOG_E("allocation of %zu bytes exceeds the whole budget of %llu bytes: it could "
                  "never be resident",
                  size, (unsigned long long)(M.budget_chunks * M.chunk));
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    buf_t *b = calloc(1, sizeof *b);
    CUresult r = b ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
    if (r == CUDA_SUCCESS) {
        b->size = size;
        r = size <= M.chunk / 8 ? alloc_small(b, size) : alloc_large(b, size);
    }
    if (r == CUDA_SUCCESS) {
        oom_flag = 0;
        HASH_ADD(hh, M.bufs, addr, sizeof b->addr, b);
        if (oom_flag)
            r = CUDA_ERROR_OUT_OF_MEMORY; /* the VA is lost; the buffer is not */
    }
    if (r != CUDA_SUCCESS) {
        free(b);
        mem_unlock();
        return r;
    }
    uint64_t mapped = b->small ? ((size + SLAB_ALIGN - 1) & ~(uint64_t)(SLAB_ALIGN - 1))
                               : (((size + M.chunk - 1) >> M.shift) << M.shift);
    ooc_stats_alloc(size, mapped);
    *out = (CUdeviceptr)b->addr;
    b->id = ++M.next_id;
    if (id)
        *id = b->id;
    mem_unlock();
    return CUDA_SUCCESS;
}

CUresult ooc_mem_free(CUdeviceptr p, CUstream stream, uint64_t *id) {
    pthread_mutex_lock(&mem_lock);
    uintptr_t a = (uintptr_t)p;
    buf_t *b;
    HASH_FIND(hh, M.bufs, &a, sizeof a, b);
    if (!b) {
        mem_unlock();
        return CUDA_ERROR_INVALID_VALUE;
    }
    HASH_DEL(M.bufs, b);
    if (id)
        *id = b->id;
    uint64_t first = (b->addr - M.va_base) >> M.shift;
    if (b->small) {
        chunk_t *c = chunk_find(first);
        slab_remove(c->slab, b);
        if (stream)
            chunk_add_user(c, stream);
        if (--c->nbufs == 0 && c != M.slab_cur)
            chunk_release(c, stream);
        ooc_stats_free(b->size, (b->size + SLAB_ALIGN - 1) & ~(uint64_t)(SLAB_ALIGN - 1));
    } else {
        uint64_t count = (b->size + M.chunk - 1) >> M.shift;
        for (uint64_t i = 0; i < count; i++) {
            chunk_t *c = chunk_find(first + i);
            c->owner = NULL;
            c->nbufs = 0;
            chunk_release(c, stream);
        }
        ooc_stats_free(b->size, count << M.shift);
    }
    free(b);
    mem_unlock();
    return CUDA_SUCCESS;
}

/* Caller holds mem_lock. */
static buf_t *lookup(uintptr_t p) {
    if (!ooc_mem_owns(p))
        return NULL;
    chunk_t *c = chunk_find((p - M.va_base) >> M.shift);
    if (!c)
        return NULL;
    if (c->owner)
        return p < c->owner->addr + c->owner->size ? c->owner : NULL;
    return c->slab ? slab_find(c->slab, p) : NULL;
}

int ooc_mem_lookup(uintptr_t p, uintptr_t *base, size_t *size) {
    pthread_mutex_lock(&mem_lock);
    buf_t *b = lookup(p);
    if (b) {
        *base = b->addr;
        *size = b->size;
    }
    mem_unlock();
    return b ? 0 : -1;
}

/* Appends a query for [p, p + n) (n == 0: the buffer containing p); resolved to buffers by
 * ooc_mem_begin under its lock, so that noting takes no lock. */
static void note(ooc_access_t *a, uintptr_t p, size_t n, unsigned use) {
    for (unsigned i = 0; i < a->n; i++) {
        if (a->refs[i].lo == p && a->refs[i].hi == p + n) {
            a->refs[i].use |= use;
            return;
        }
    }
    if (a->n == OOC_MAX_REFS) {
        a->overflow = 1;
        return;
    }
    a->refs[a->n].lo = p;
    a->refs[a->n].hi = p + n;
    a->refs[a->n].use = use;
    a->n++;
}

void ooc_mem_note(ooc_access_t *a, uintptr_t p) {
    if (ooc_mem_owns(p))
        note(a, p, 0, OOC_USE_RW);
}

void ooc_mem_note_range(ooc_access_t *a, uintptr_t p, size_t n, unsigned use) {
    if (ooc_mem_owns(p) && n)
        note(a, p, n, use);
}

/* Lists b for the current op (once), with how the query [lo, hi) uses it. */
static int opbuf_add(buf_t *b, uintptr_t lo, uintptr_t hi, unsigned use) {
    /* A write that does not cover the whole buffer keeps the rest: read-write for the planner. */
    if (use == OOC_USE_W && (lo > b->addr || hi < b->addr + b->size))
        use = OOC_USE_RW;
    if (b->opmark == M.serial) {
        for (size_t i = 0; i < M.nopb; i++)
            if (M.op_bufs[i].id == b->id)
                M.op_bufs[i].use |= use;
        return 0;
    }
    if (M.nopb == M.cap_opb) {
        size_t nc = M.cap_opb ? M.cap_opb * 2 : 32;
        ooc_opbuf_t *n = realloc(M.op_bufs, nc * sizeof *n);
        if (!n)
            return -1;
        M.op_bufs = n;
        M.cap_opb = nc;
    }
    b->opmark = M.serial;
    M.op_bufs[M.nopb++] = (ooc_opbuf_t){.id = b->id, .addr = b->addr, .bytes = b->size, .use = use};
    return 0;
}

size_t ooc_mem_op_buffers(const ooc_opbuf_t **out) {
    *out = M.op_bufs;
    return M.nopb;
}

/* ---- planned transfers (replay.c calls these with the residency lock held) ------------------ */

/* The buffer (addr, id) if it is still live and owns whole chunks; NULL otherwise (freed, or a
 * small buffer in a shared slab chunk, which is left to demand residency). */
static buf_t *plan_buf(uintptr_t addr, uint64_t id) {
    buf_t *b = lookup(addr);
    return b && b->id == id && b->addr == addr && !b->small ? b : NULL;
}

static chunk_t *plan_chunk(const buf_t *b, uint64_t i) {
    return chunk_find(((b->addr - M.va_base) >> M.shift) + i);
}

static uint64_t buf_chunks(const buf_t *b) {
    return (b->size + M.chunk - 1) >> M.shift;
}

/* Takes b's chunks off the worker's queue: demand residency brings them in when an op needs them
 * (ops wait while a chunk they use is queued, so none may be left queued without a job). */
static void unqueue_buffer(const buf_t *b) {
    for (uint64_t i = 0, n = buf_chunks(b); i < n; i++) {
        chunk_t *c = plan_chunk(b, i);
        if (c)
            c->queued = 0;
    }
}

unsigned ooc_mem_l_swapout(uintptr_t addr, uint64_t id, CUstream s) {
    buf_t *b = plan_buf(addr, id);
    if (!b || !M.worker_on)
        return 0;
    uint64_t n = buf_chunks(b), k = 0;
    if (grow(&M.op_tmp, &M.cap_tmp, n, sizeof *M.op_tmp) != 0)
        return 0;
    for (uint64_t i = 0; i < n; i++) {
        chunk_t *c = plan_chunk(b, i);
        if (c && c->state == C_RESIDENT && !c->dying && !c->out_ev)
            M.op_tmp[k++] = c;
    }
    if (k == 0)
        return 0;
    /* The copy follows the work of every stream that may use the chunks, the op just issued on
     * s included; when some cannot be named, demand residency will evict them later instead. */
    CUstream users[MAX_USERS + MAX_STREAMS + 1];
    unsigned nu = 0;
    if (gather_streams(M.op_tmp, k, users, &nu))
        return 0;
    int unknown = 0;
    add_user(users, &nu, &unknown, s);
    evref_t *out = ev_take();
    if (unknown || !out) {
        ev_drop(out);
        return 0;
    }
    CUresult r = CUDA_SUCCESS;
    for (unsigned u = 0; u < nu && r == CUDA_SUCCESS; u++) {
        evref_t *v = ev_take();
        r = v ? ooc_real.cuEventRecord(v->e, users[u]) : CUDA_ERROR_OUT_OF_MEMORY;
        if (r == CUDA_SUCCESS)
            r = ooc_real.cuStreamWaitEvent(M.d2h, v->e, 0);
        ev_drop(v);
    }
    for (uint64_t i = 0; i < k && r == CUDA_SUCCESS; i++)
        if (M.op_tmp[i]->in_ev)
            r = ooc_real.cuStreamWaitEvent(M.d2h, M.op_tmp[i]->in_ev->e, 0);
    /* The chunks copied out are M.op_tmp[0, done); one whose copy could not be issued stays
     * resident, as do those after it. */
    uint64_t done = 0;
    while (r == CUDA_SUCCESS && done < k) {
        chunk_t *c = M.op_tmp[done];
        if (!(c->host = host_slot()))
            break;
        if ((r = copy_out(c, M.d2h)) != CUDA_SUCCESS) {
            host_slot_put(c->host);
            c->host = NULL;
            break;
        }
        done++;
    }
    if (done && ooc_real.cuEventRecord(out->e, M.d2h) != CUDA_SUCCESS) {
        /* Without the event nothing can tell when the copies end: wait for them; the chunks stay
         * resident and the slots go back. */
        ooc_real.cuStreamSynchronize(M.d2h);
        for (uint64_t i = 0; i < done; i++) {
            host_slot_put(M.op_tmp[i]->host);
            M.op_tmp[i]->host = NULL;
        }
        done = 0;
    }
    if (grow(&M.ret, &M.cap_ret, M.nret + done, sizeof *M.ret) != 0) {
        ooc_real.cuStreamSynchronize(M.d2h);
        for (uint64_t i = 0; i < done; i++) {
            host_slot_put(M.op_tmp[i]->host);
            M.op_tmp[i]->host = NULL;
        }
        done = 0;
    }
    for (uint64_t i = 0; i < done; i++) {
        chunk_t *c = M.op_tmp[i];
        out->refs++;
        c->out_ev = out;
        c->when = M.serial;
        lru_remove(c);
        M.ret[M.nret++] = c;
    }
    ev_drop(out);
    if (done) {
        ooc_stats_add(OOC_STAT_swap_outs, done);
        ooc_stats_add(OOC_STAT_swap_out_bytes, done * M.chunk);
        ooc_stats_add(OOC_STAT_planned_swap_outs, 1);
        pthread_cond_signal(&M.work_cv);
    }
    return (unsigned)done;
}

unsigned ooc_mem_l_prefetch(uintptr_t addr, uint64_t id, CUstream s) {
    buf_t *b = plan_buf(addr, id);
    if (!b || !M.worker_on)
        return 0;
    unsigned q = 0;
    for (uint64_t i = 0, n = buf_chunks(b); i < n; i++) {
        chunk_t *c = plan_chunk(b, i);
        if (!c)
            continue;
        /* A chunk whose swap-out is still under way is queued too: whether its copy is done is
         * decided when the device reaches this point (the worker), not now, when the host,
         * which runs ahead, looks. */
        if ((c->out_ev || c->state == C_SWAPPED) && !c->queued) {
            cool(c); /* it is not hot (not resident, or retiring): this only keeps it so */
            c->queued = 1;
            q++;
        }
    }
    if (!q)
        return 0;
    if (M.job_head && M.job_head + M.njobs == M.cap_jobs) {
        memmove(M.jobs, M.jobs + M.job_head, M.njobs * sizeof *M.jobs);
        M.job_head = 0;
    }
    if (grow(&M.jobs, &M.cap_jobs, M.job_head + M.njobs + 1, sizeof *M.jobs) != 0) {
        unqueue_buffer(b);
        return 0;
    }
    M.jobs[M.job_head + M.njobs++] = (job_t){addr, id, fence_ev(s)};
    pthread_cond_signal(&M.work_cv);
    return q;
}

void ooc_mem_l_drop(uintptr_t addr, uint64_t id) {
    buf_t *b = plan_buf(addr, id);
    if (!b)
        return;
    for (uint64_t i = 0, n = buf_chunks(b); i < n; i++) {
        chunk_t *c = plan_chunk(b, i);
        if (c && c->state == C_RESIDENT && !c->dying && !c->out_ev)
            lru_push_tail(c);
    }
}

int ooc_mem_l_discard(uintptr_t addr, uint64_t id, int on) {
    buf_t *b = plan_buf(addr, id);
    if (!b)
        return 0;
    for (uint64_t i = 0, n = buf_chunks(b); i < n; i++) {
        chunk_t *c = plan_chunk(b, i);
        if (!c)
            continue;
        if (on)
            cool(c); /* a fast-path op must not use bytes that eviction may drop */
        c->discard = on && c->state == C_RESIDENT && !c->dying && !c->out_ev;
        if (c->discard)
            lru_push_tail(c);
    }
    return 1;
}

int ooc_mem_l_lost(uintptr_t addr, uint64_t id) {
    buf_t *b = plan_buf(addr, id);
    if (!b)
        return 1;
    for (uint64_t i = 0, n = buf_chunks(b); i < n; i++) {
        chunk_t *c = plan_chunk(b, i);
        if (!c || c->state == C_EMPTY)
            return 1;
    }
    return 0;
}

/* ---- the current op's chunks (caller holds mem_lock) --------------------------------------- */

/* The indices of the first and last chunk b lies in. */
static void buf_span(const buf_t *b, uint64_t *c0, uint64_t *c1) {
    *c0 = (b->addr - M.va_base) >> M.shift;
    *c1 = (b->addr + b->size - 1 - M.va_base) >> M.shift;
}

/* Adds c to the current op's chunks. 0, or -1 out of host memory. */
static int op_push(chunk_t *c) {
    if (M.nop == M.cap_op) {
        size_t nc = M.cap_op ? M.cap_op * 2 : 64;
        chunk_t **n = realloc(M.op_chunks, nc * sizeof *n);
        if (!n)
            return -1;
        M.op_chunks = n;
        M.cap_op = nc;
    }
    M.op_chunks[M.nop++] = c;
    return 0;
}

/* Pins b's chunks for the current op (M.serial) and adds those not pinned yet to its chunks.
 * 0, or -1 out of host memory. */
static int pin_buffer(const buf_t *b) {
    uint64_t c0, c1;
    buf_span(b, &c0, &c1);
    for (uint64_t idx = c0; idx <= c1; idx++) {
        chunk_t *c = chunk_find(idx);
        if (!c || c->pin == M.serial)
            continue;
        c->pin = M.serial;
        if (op_push(c) != 0)
            return -1;
    }
    return 0;
}

/* Is one of b's chunks queued for the worker? */
static int buf_queued(const buf_t *b) {
    uint64_t c0, c1;
    buf_span(b, &c0, &c1);
    for (uint64_t idx = c0; idx <= c1; idx++) {
        chunk_t *c = chunk_find(idx);
        if (c && c->queued)
            return 1;
    }
    return 0;
}

int ooc_mem_l_include(uintptr_t addr, uint64_t id) {
    buf_t *b = lookup(addr);
    if (!b || b->id != id || b->addr != addr)
        return -1;
    return pin_buffer(b);
}

/* The worker, holding mem_lock: waits without the lock for `v` (may be NULL) and, when `c` is
 * not NULL in safe mode, for the work issued so far on the streams that may reach c unseen, so
 * that the wait_chunks that follows under the lock has little left to wait for. The lock is
 * released meanwhile: c may be gone on return. */
static void worker_wait(evref_t *v, chunk_t *c) {
    CUstream users[MAX_USERS + MAX_STREAMS];
    unsigned nu = 0;
    evref_t *pre[MAX_USERS + MAX_STREAMS];
    unsigned npre = 0;
    if (v)
        v->refs++;
    if (c && M.safe && !gather_streams(&c, 1, users, &nu)) {
        for (unsigned u = 0; u < nu; u++) {
            evref_t *e = ev_take();
            if (e && ooc_real.cuEventRecord(e->e, users[u]) == CUDA_SUCCESS)
                pre[npre++] = e;
            else
                ev_drop(e);
        }
    }
    mem_unlock();
    if (v)
        ooc_real.cuEventSynchronize(v->e);
    for (unsigned i = 0; i < npre; i++)
        ooc_real.cuEventSynchronize(pre[i]->e);
    pthread_mutex_lock(&mem_lock);
    for (unsigned i = 0; i < npre; i++)
        ev_drop(pre[i]);
    ev_drop(v);
}

/* The worker: waits for the oldest swap-out's copy, then finishes what is done. */
static void worker_wait_retiree(void) {
    worker_wait(M.ret[0]->out_ev, M.ret[0]);
    retire_poll(0);
}

/* The worker: the swap-in of one queued buffer, chunk by chunk, each copy on the host-to-device
 * stream followed by its own event (ops that use the chunk wait for it on their streams). A
 * chunk needs a free physical chunk: when there is none it waits for planned swap-outs to
 * finish, and when none is under way it leaves the rest to demand residency rather than evict
 * what the plan keeps. Caller holds mem_lock; it is released while waiting. */
static void worker_swapin(job_t j) {
    uint64_t drained = UINT64_MAX; /* the chunk whose streams were waited for without the lock */
    for (;;) {
        buf_t *b = plan_buf(j.addr, j.id);
        if (!b)
            return;
        uint64_t n = buf_chunks(b), i = 0;
        chunk_t *c = NULL;
        for (; i < n && !c; i++) {
            chunk_t *x = plan_chunk(b, i);
            if (x && x->queued)
                c = x;
        }
        if (!c)
            return;
        if (c->out_ev) {
            /* Its swap-out was under way when the host planned the swap-in. The plan has the
             * copy out end, its memory serve others meanwhile, and the copy in follow, and so
             * does the worker: it waits for the copy out, unmaps the chunk (with the older
             * retirees), and brings it in below. Keeping it mapped instead would hold memory
             * that the plan gives to other buffers until then. */
            if (!ev_done(c->out_ev)) {
                worker_wait(c->out_ev, NULL);
                continue; /* the lock was released: look again */
            }
            retire_poll(0);
        }
        if (c->state != C_SWAPPED) {
            c->queued = 0;
            continue;
        }
        if (!M.phys_free && M.phys_made >= M.budget_chunks && !M.ndying && !any_discard()) {
            if (M.nret) {
                worker_wait_retiree();
                continue;
            }
            unqueue_buffer(b);
            ooc_stats_add(OOC_STAT_prefetch_no_memory, 1);
            if (OOC_LOG_ENABLED(OOC_LOG_DEBUG)) {
                char line[600];
                size_t o = 0;
                unsigned ns = 0;
                for (chunk_t *x = M.lru.next; x != &M.lru && o + 24 < sizeof line; x = x->next) {
                    if (x->slab)
                        ns++;
                    else
                        o += (size_t)snprintf(line + o, sizeof line - o, " %llu",
                                              (unsigned long long)(x->owner ? x->owner->id : 0));
                }
                line[o] = 0;
                OOC_LOG_D("resident: %u slab chunks; chunks of buffers:%s", ns, line);
            }
            OOC_LOG_D("op %llu: no memory coming for the planned swap-in of buffer %llu "
                      "(resident %llu)",
                      (unsigned long long)M.serial, (unsigned long long)j.id,
                      (unsigned long long)M.resident);
            return;
        }
        if (M.safe && c->aliased && drained != c->idx) {
            drained = c->idx;
            worker_wait(NULL, c); /* then look again: the lock was released */
            continue;
        }
        CUresult r = need_phys(1); /* a new physical chunk while under budget */
        if (r == CUDA_SUCCESS && M.safe && c->aliased && (r = wait_chunks(&c, 1)) == CUDA_SUCCESS)
            r = unalias_chunk(c);
        if (r == CUDA_SUCCESS)
            r = map_chunk(c);
        if (r != CUDA_SUCCESS) {
            c->queued = 0;
            continue;
        }
        evref_t *v = ev_take();
        r = copy_in(c, M.h2d);
        if (r == CUDA_SUCCESS && v)
            r = ooc_real.cuEventRecord(v->e, M.h2d);
        else if (r == CUDA_SUCCESS)
            r = ooc_real.cuStreamSynchronize(M.h2d);
        if (r != CUDA_SUCCESS) {
            /* The host copy stays; the physical chunk goes back (the copy may not have run). */
            ooc_real.cuStreamSynchronize(M.h2d);
            ev_drop(v);
            if (ooc_real.cuMemUnmap(chunk_addr(c), M.chunk) == CUDA_SUCCESS) {
                c->phys->next = M.phys_free;
                M.phys_free = c->phys;
                c->phys = NULL;
                M.resident--;
                ooc_stats_gauge_sub(OOC_STAT_resident_bytes, M.chunk);
                if (M.safe)
                    alias_chunk(c);
            } else {
                c->state = C_RESIDENT; /* mapped: demand residency cannot tell; keep the data */
            }
            unqueue_buffer(b); /* the rest of the buffer too: demand residency retries it */
            return;
        }
        c->state = C_RESIDENT;
        c->queued = 0;
        if (v) {
            c->in_ev = v;
            limbo_put(c->host, v);
        } else {
            host_slot_put(c->host);
        }
        c->host = NULL;
        lru_push(c);
        ooc_stats_add(OOC_STAT_swap_ins, 1);
        ooc_stats_add(OOC_STAT_swap_in_bytes, M.chunk);
        ooc_stats_add(OOC_STAT_prefetches, 1);
    }
}

static void *worker_main(void *arg) {
    (void)arg;
    ooc_real.cuCtxSetCurrent(M.ctx);
    pthread_mutex_lock(&mem_lock);
    while (!M.worker_stop) {
        if (M.njobs) {
            job_t j = M.jobs[M.job_head++];
            if (--M.njobs == 0)
                M.job_head = 0;
            if (j.gate) {
                worker_wait(j.gate, NULL); /* the plan's point, in device time */
                ev_drop(j.gate);
            }
            worker_swapin(j);
            pthread_cond_broadcast(&M.done_cv);
            continue;
        }
        if (M.nlimbo)
            limbo_poll();
        if (M.nret) {
            if (!retire_poll(0))
                worker_wait_retiree();
            continue;
        }
        mem_wait(&M.work_cv);
    }
    mem_unlock();
    return NULL;
}

int ooc_mem_replay_init(void) {
    pthread_mutex_lock(&mem_lock);
    int rc = 0;
    if (M.ready && !M.worker_on) {
        CUcontext prev = NULL;
        ooc_real.cuCtxGetCurrent(&prev);
        ooc_real.cuCtxSetCurrent(M.ctx);
        if (ooc_real.cuStreamCreate(&M.h2d, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS ||
            ooc_real.cuStreamCreate(&M.d2h, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) {
            rc = -1;
        } else {
            pthread_cond_init(&M.work_cv, NULL);
            pthread_cond_init(&M.done_cv, NULL);
            if (pthread_create(&M.worker, NULL, worker_main, NULL) != 0) {
                pthread_cond_destroy(&M.work_cv);
                pthread_cond_destroy(&M.done_cv);
                rc = -1;
            }
        }
        if (rc != 0) {
            if (M.h2d)
                ooc_real.cuStreamDestroy_v2(M.h2d);
            if (M.d2h)
                ooc_real.cuStreamDestroy_v2(M.d2h);
            M.h2d = M.d2h = NULL;
        } else {
            M.worker_on = 1;
        }
        ooc_real.cuCtxSetCurrent(prev);
    }
    mem_unlock();
    return rc;
}

/* ---- residency ------------------------------------------------------------------------------ */

static void log_oom(uint64_t need) {
    size_t nbufs = HASH_COUNT(M.bufs);
    OOC_LOG_E("out of memory: an operation needs %llu chunks of %llu bytes resident at once, "
              "the budget holds %llu; %llu are resident, in use by %zu live buffers; nothing "
              "else can be evicted because the operation itself needs every resident chunk",
              (unsigned long long)need, (unsigned long long)M.chunk,
              (unsigned long long)M.budget_chunks, (unsigned long long)M.resident, nbufs);
}

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static CUresult make_resident(uint64_t missing);

/* Is a chunk that op `a` references queued for the worker? Caller holds mem_lock. */
static int any_queued(const ooc_access_t *a) {
    for (unsigned i = 0; i < a->n; i++) {
        uintptr_t p = a->refs[i].lo, end = a->refs[i].hi > p ? a->refs[i].hi : p + 1;
        buf_t *b;
        while (p < end && (b = lookup(p)) != NULL) {
            if (buf_queued(b))
                return 1;
            p = b->addr + b->size;
        }
    }
    return 0;
}

CUresult ooc_mem_begin(const ooc_access_t *a, CUstream stream, int per_thread) {
    CUstream s = (per_thread && stream == NULL) ? CU_STREAM_PER_THREAD : stream;
    pthread_mutex_lock(&mem_lock);
    M.serial++;
    M.nop = 0;
    M.nopb = 0;
    int list = ooc_record_on() || ooc_replay_on();
    if (a->overflow) {
        OOC_LOG_E("an operation references more than %d buffers; the shim cannot make them all "
                  "resident",
                  OOC_MAX_REFS);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    uint64_t missing = 0;
    for (unsigned i = 0; i < a->n; i++) {
        /* A query is [lo, hi), or the buffer containing lo when hi == lo; it may span buffers. */
        uintptr_t p = a->refs[i].lo, end = a->refs[i].hi > p ? a->refs[i].hi : p + 1;
        buf_t *b;
        while (p < end && (b = lookup(p)) != NULL) {
            if (list && opbuf_add(b, a->refs[i].lo, a->refs[i].hi, a->refs[i].use) != 0)
                return CUDA_ERROR_OUT_OF_MEMORY;
            if (pin_buffer(b) != 0)
                return CUDA_ERROR_OUT_OF_MEMORY;
            p = b->addr + b->size;
        }
    }
    if (M.nop > M.budget_chunks) {
        log_oom(M.nop);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    /* Planned swap-ins of this op's chunks that the worker has not done yet: wait for it (the
     * lock is released meanwhile, so everything is looked up again after). */
    if (M.worker_on) {
        size_t nq = 0;
        for (size_t i = 0; i < M.nop; i++)
            nq += M.op_chunks[i]->queued != 0;
        if (nq) {
            ooc_stats_add(OOC_STAT_prefetch_late, nq);
            OOC_LOG_D("op %llu: waits for %zu planned swap-ins (jobs queued %zu)",
                      (unsigned long long)M.serial, nq, (size_t)M.njobs);
            uint64_t t0 = now_ns();
            while (any_queued(a))
                mem_wait(&M.done_cv);
            ooc_stats_add(OOC_STAT_stall_ns, now_ns() - t0);
            mem_unlock();
            return ooc_mem_begin(a, stream, per_thread); /* once: nothing is queued now */
        }
    }
    /* The plan's actions before this op (swap-ins queued for the worker) go first. */
    if (list && ooc_replay_on())
        ooc_replay_op_begin(a, M.op_bufs, M.nopb, s);
    for (size_t i = 0; i < M.nop; i++) {
        chunk_t *c = M.op_chunks[i];
        if (c->out_ev) {
            OOC_LOG_D("op %llu: uses chunk %llu before its swap-out finished",
                      (unsigned long long)M.serial, (unsigned long long)c->idx);
            retire_cancel(c); /* used again before its swap-out finished */
            lru_push(c);
        }
        c->queued = 0; /* queued by this op's own actions: bring it in now */
        c->discard = 0;
        if (c->state != C_RESIDENT)
            missing++;
    }
    CUresult rc = CUDA_SUCCESS;
    if (missing) {
        OOC_LOG_D("op %llu: %llu of its %zu chunks are not resident (resident %llu, free %d, "
                  "retiring %llu, dying %llu)",
                  (unsigned long long)M.serial, (unsigned long long)missing, M.nop,
                  (unsigned long long)M.resident, M.phys_free != NULL, (unsigned long long)M.nret,
                  (unsigned long long)M.ndying);
        ooc_stats_add(OOC_STAT_demand_ops, 1);
        uint64_t t0 = now_ns();
        rc = make_resident(missing);
        ooc_stats_add(OOC_STAT_stall_ns, now_ns() - t0);
    }
    /* Chunks a planned swap-in brought: the op's stream waits for their copies. */
    for (size_t i = 0; i < M.nop && rc == CUDA_SUCCESS; i++) {
        chunk_t *c = M.op_chunks[i];
        if (!c->in_ev)
            continue;
        if (ev_done(c->in_ev)) {
            ev_drop(c->in_ev);
            c->in_ev = NULL;
        } else {
            rc = ooc_real.cuStreamWaitEvent(s, c->in_ev->e, 0);
        }
    }
    return rc;
}

/* Removes the host aliases of the op's swapped chunks (safe mode), after waiting for every
 * stream that may have reached them through an address the shim could not see. */
static CUresult unalias_op_chunks(void) {
    chunk_t **al = NULL;
    size_t nal = 0;
    for (size_t i = 0; i < M.nop; i++) {
        if (!M.op_chunks[i]->aliased)
            continue;
        if (!al && !(al = malloc(M.nop * sizeof *al)))
            return CUDA_ERROR_OUT_OF_MEMORY;
        al[nal++] = M.op_chunks[i];
    }
    CUresult r = nal ? wait_chunks(al, nal) : CUDA_SUCCESS;
    for (size_t i = 0; i < nal && r == CUDA_SUCCESS; i++)
        r = unalias_chunk(al[i]);
    free(al);
    return r;
}

/* The op's chunks swapped in by make_resident (resident, host slot still attached): one event
 * after their copies, which the op's stream waits for (ooc_mem_begin) while the host goes on;
 * their slots go back once it has completed. Without an event, the host waits for the copies. */
static CUresult swapins_issued(void) {
    evref_t *v = ev_take();
    CUresult r = v ? ooc_real.cuEventRecord(v->e, M.swap) : CUDA_ERROR_OUT_OF_MEMORY;
    if (r != CUDA_SUCCESS) {
        ev_drop(v);
        v = NULL;
        if ((r = ooc_real.cuStreamSynchronize(M.swap)) != CUDA_SUCCESS)
            return r;
    }
    for (size_t i = 0; i < M.nop; i++) {
        chunk_t *c = M.op_chunks[i];
        if (c->state != C_RESIDENT || !c->host || c->out_ev)
            continue;
        if (v) {
            limbo_put(c->host, v);
            ev_drop(c->in_ev);
            v->refs++;
            c->in_ev = v;
        } else {
            host_slot_put(c->host);
        }
        c->host = NULL;
    }
    ev_drop(v);
    return CUDA_SUCCESS;
}

/* Maps (and swaps in) the op's chunks that are not resident. Caller holds mem_lock. */
static CUresult make_resident(uint64_t missing) {
    int swapped_in = 0;
    CUresult r = M.safe ? unalias_op_chunks() : CUDA_SUCCESS;
    if (r != CUDA_SUCCESS)
        return r;
    for (size_t i = 0; i < M.nop; i++) {
        chunk_t *c = M.op_chunks[i];
        if (c->state == C_RESIDENT)
            continue;
        r = need_phys(missing);
        if (r == CUDA_ERROR_OUT_OF_MEMORY)
            log_oom(M.nop);
        if (r == CUDA_SUCCESS)
            r = map_chunk(c);
        if (r != CUDA_SUCCESS) {
            if (swapped_in)
                swapins_issued();
            return r;
        }
        if (c->state == C_SWAPPED) {
            r = copy_in(c, M.swap);
            if (r != CUDA_SUCCESS) {
                /* Keep the host copy; give the physical chunk back (nothing used it yet). */
                if (ooc_real.cuMemUnmap(chunk_addr(c), M.chunk) == CUDA_SUCCESS) {
                    c->phys->next = M.phys_free;
                    M.phys_free = c->phys;
                    c->phys = NULL;
                    M.resident--;
                    ooc_stats_gauge_sub(OOC_STAT_resident_bytes, M.chunk);
                    if (M.safe)
                        alias_chunk(c);
                }
                if (swapped_in)
                    swapins_issued();
                return r;
            }
            swapped_in = 1;
            ooc_stats_add(OOC_STAT_swap_ins, 1);
            ooc_stats_add(OOC_STAT_swap_in_bytes, M.chunk);
        }
        c->state = C_RESIDENT;
        lru_push(c);
        missing--;
    }
    return swapped_in ? swapins_issued() : CUDA_SUCCESS;
}

/* Makes c hot when the fast path may issue an op that uses it on any of its users' streams:
 * such an op would find c resident and stable, and the locked path would do nothing to c but
 * note a user it already has and move c to the head of the LRU (the fast path sets `touched`
 * instead). That is: resident; not retiring (out_ev), dying or queued for the worker, each of
 * which a later op must act on; not aliased; no copy in that an op must wait for (in_ev); its
 * bytes not given up to be rebuilt (discard); still owned by a live buffer. Called by the locked
 * path after an op on c was issued. Caller holds mem_lock. */
static void set_hot(chunk_t *c) {
    if (c->in_ev && ev_done(c->in_ev)) { /* the copy that brought it in has completed */
        ev_drop(c->in_ev);
        c->in_ev = NULL;
    }
    if (M.table && c->state == C_RESIDENT && !c->out_ev && !c->dying && !c->queued && !c->aliased &&
        !c->in_ev && !c->discard && c->ext_n)
        atomic_store_explicit(&c->hot, 1, memory_order_release);
}

void ooc_mem_end(const ooc_access_t *a, CUstream stream, int per_thread, int issued) {
    (void)a;
    CUstream s = (per_thread && stream == NULL) ? CU_STREAM_PER_THREAD : stream;
    if (issued) {
        for (size_t i = 0; i < M.nop; i++) {
            chunk_t *c = M.op_chunks[i];
            chunk_add_user(c, s);
            if (!c->dying)
                lru_push(c);
            set_hot(c);
        }
        stream_issued(s);
        M.fc_epoch++;
        if (ooc_replay_on())
            ooc_replay_op_end(s); /* the plan's swap-outs after this op */
    }
    M.nop = 0;
    mem_unlock();
}

/* ---- the fast path -----------------------------------------------------------------------------
 *
 * An op whose chunks are all hot, on a stream they already count among their users, is issued
 * without mem_lock: ooc_mem_fast_begin checks that inside a reader section (see quiesce) and the
 * caller issues the op, then calls ooc_mem_fast_end. What the locked path would have done for it
 * is done here: each chunk's `touched` flag stands for the move to the LRU's head; in safe mode
 * the stream's `last` serial is raised (to one past the serial read after the issue, so that a
 * chunk mapped before the issue counts it: its `since` is at most that serial); fc_dirty makes
 * the next fence_ev record a fresh event. The serial itself is not advanced: it numbers locked
 * ops only. Everything else the locked path does for such an op is a no-op on hot chunks.
 *
 * Which chunks an op uses, without the buffer table: a query [lo, hi) uses every chunk from
 * lo's to (hi-1)'s and, through each chunk's extent, the whole buffer of each; a query with
 * hi == lo (a parameter word) uses the extent of the chunk lo points into, and nothing when no
 * live buffer owns that chunk (the locked path ignores such a word too). An extent covers the
 * whole buffer of a large buffer's chunk and the whole of a slab chunk, which may be more than
 * the locked path would look at (a word past a buffer's end, or at a freed slot of a slab) but
 * never less, so the fast path is taken only when the locked path would find everything the op
 * uses resident and would make nothing else resident. A range over a chunk with no live buffer
 * goes to the locked path.
 *
 * Not on the fast path: recording and replay (ops are logged and matched in order: their
 * transitions to on enter a writer section after the flag is set, so no fast-path op that read
 * them off is still running after), an access set that overflowed, and a stream that safe mode
 * does not follow yet. */

static _Atomic unsigned long *fp_my_slot(void) {
    if (fp_slot < 0)
        fp_slot =
            (int)(atomic_fetch_add_explicit(&fp_next_slot, 1, memory_order_relaxed) % FP_SLOTS);
    return &fp_readers[fp_slot].n;
}

/* Is c hot, with s among its users (an op on s would not add one)? Marks it used. */
static int fast_chunk(chunk_t *c, CUstream s) {
    if (!atomic_load_explicit(&c->hot, memory_order_acquire))
        return 0;
    unsigned n = atomic_load_explicit(&c->nusers, memory_order_acquire);
    unsigned i = 0;
    while (i < n && atomic_load_explicit(&c->users[i], memory_order_relaxed) != s)
        i++;
    if (i == n && !(atomic_load_explicit(&c->users_unknown, memory_order_relaxed) &&
                    (s == CU_STREAM_PER_THREAD || n == MAX_USERS)))
        return 0;
    if (!atomic_load_explicit(&c->touched, memory_order_relaxed))
        atomic_store_explicit(&c->touched, 1, memory_order_relaxed);
    return 1;
}

enum { FX_OK, FX_NONE, FX_COLD };

/* Checks the extent of the chunk at idx; on FX_OK, *next is the index past it. */
static int fast_extent(uint64_t idx, CUstream s, uint64_t *next) {
    chunk_t *c = atomic_load_explicit(&M.table[idx], memory_order_acquire);
    if (!c)
        return FX_NONE;
    uint64_t first = atomic_load_explicit(&c->ext_first, memory_order_relaxed);
    uint64_t n = atomic_load_explicit(&c->ext_n, memory_order_relaxed);
    if (n == 0)
        return FX_NONE;
    for (uint64_t j = first; j < first + n; j++) {
        chunk_t *x = j == idx ? c : atomic_load_explicit(&M.table[j], memory_order_acquire);
        if (!x || !fast_chunk(x, s))
            return FX_COLD;
    }
    *next = first + n;
    return FX_OK;
}

/* Safe mode: the index of s in M.streams, or -1 when the locked path must add it first. */
static int fast_stream(CUstream s) {
    if (s == CU_STREAM_PER_THREAD)
        return MAX_STREAMS; /* counted in streams_lost */
    unsigned n = atomic_load_explicit(&M.nstreams, memory_order_acquire);
    for (unsigned i = 0; i < n; i++)
        if (atomic_load_explicit(&M.streams[i].s, memory_order_relaxed) == s)
            return (int)i;
    return -1;
}

int ooc_mem_fast_begin(const ooc_access_t *a, CUstream stream, int per_thread) {
    if (a->overflow)
        return 0;
    CUstream s = (per_thread && stream == NULL) ? CU_STREAM_PER_THREAD : stream;
    _Atomic unsigned long *slot = fp_my_slot();
    atomic_fetch_add(slot, 1);
    if (atomic_load(&fp_writer) || !atomic_load_explicit(&fp_on, memory_order_relaxed) ||
        ooc_record_on() || ooc_replay_on())
        goto slow;
    if (M.safe && (fp_stream = fast_stream(s)) < 0)
        goto slow;
    for (unsigned i = 0; i < a->n; i++) {
        uintptr_t lo = a->refs[i].lo, hi = a->refs[i].hi;
        uint64_t idx = (lo - M.va_base) >> M.shift, next = 0;
        if (lo - M.va_base >= M.va_size)
            goto slow;
        if (hi == lo) {
            if (fast_extent(idx, s, &next) == FX_COLD)
                goto slow;
            continue;
        }
        if (hi - 1 - M.va_base >= M.va_size)
            goto slow; /* past the reservation: the locked path sorts it out */
        for (uint64_t last = (hi - 1 - M.va_base) >> M.shift; idx <= last; idx = next)
            if (fast_extent(idx, s, &next) != FX_OK)
                goto slow;
    }
    ooc_stats_add(OOC_STAT_fast_ops, 1);
    return 1;
slow:
    atomic_fetch_sub_explicit(slot, 1, memory_order_release);
    return 0;
}

void ooc_mem_fast_end(int issued) {
    if (issued) {
        if (M.safe) {
            uint64_t v = atomic_load(&M.serial) + 1;
            raise_to(fp_stream == MAX_STREAMS ? &M.streams_lost : &M.streams[fp_stream].last, v);
        }
        if (!atomic_load_explicit(&M.fc_dirty, memory_order_relaxed))
            atomic_store_explicit(&M.fc_dirty, 1, memory_order_relaxed);
    }
    atomic_fetch_sub_explicit(fp_my_slot(), 1, memory_order_release);
}

void ooc_mem_fast_enable(void) {
    pthread_mutex_lock(&mem_lock);
    if (M.ready && M.table)
        atomic_store(&fp_on, 1);
    mem_unlock();
}

void ooc_mem_quiesce(void) {
    pthread_mutex_lock(&mem_lock);
    quiesce();
    mem_unlock();
}

void ooc_mem_l_quiesce(void) {
    quiesce();
}

/* Shrinks the pool to budget_chunks: free physical chunks are released, then least recently
 * used chunks are swapped out to free theirs. Caller holds mem_lock. */
static CUresult pool_shrink(void) {
    M.serial++; /* no op is being made resident: nothing is pinned */
    while (M.phys_made > M.budget_chunks) {
        if (!M.phys_free) {
            uint64_t keep = M.budget_chunks;
            M.budget_chunks = M.phys_made; /* need_phys must evict, not create */
            CUresult r = need_phys(M.phys_made - keep);
            M.budget_chunks = keep;
            if (r != CUDA_SUCCESS)
                return r;
        }
        while (M.phys_free && M.phys_made > M.budget_chunks) {
            phys_t *p = M.phys_free;
            M.phys_free = p->next;
            ooc_real.cuMemRelease(p->h);
            free(p);
            M.phys_made--;
        }
    }
    return CUDA_SUCCESS;
}

CUresult ooc_mem_external_create(CUmemGenericAllocationHandle *h, size_t size,
                                 const CUmemAllocationProp *prop, unsigned long long flags) {
    pthread_mutex_lock(&mem_lock);
    if (M.external_bytes + size + M.chunk > M.budget_bytes) {
        mem_unlock();
        OOC_LOG_E("cuMemCreate of %zu bytes by the program: with the %llu bytes it already holds "
                  "that way, less than one chunk of the budget (%llu bytes) would be left for "
                  "the shim's pool",
                  size, (unsigned long long)M.external_bytes, (unsigned long long)M.budget_bytes);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    ext_t *e = calloc(1, sizeof *e);
    if (!e) {
        mem_unlock();
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    /* Make room first, so that the device never holds more than the budget. */
    uint64_t old = M.budget_chunks;
    M.budget_chunks = (M.budget_bytes - M.external_bytes - size) / M.chunk;
    CUresult r = pool_shrink();
    if (r == CUDA_SUCCESS)
        r = ooc_real.cuMemCreate(h, size, prop, flags);
    if (r == CUDA_SUCCESS) {
        e->h = *h;
        e->size = size;
        oom_flag = 0;
        HASH_ADD(hh, M.external, h, sizeof e->h, e);
        if (oom_flag) {
            ooc_real.cuMemRelease(*h);
            r = CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    if (r != CUDA_SUCCESS) {
        free(e);
        M.budget_chunks = old;
    } else {
        M.external_bytes += size;
        ooc_stats_gauge_add(OOC_STAT_external_bytes, size);
    }
    mem_unlock();
    return r;
}

void ooc_mem_external_release(CUmemGenericAllocationHandle h) {
    pthread_mutex_lock(&mem_lock);
    ext_t *e;
    HASH_FIND(hh, M.external, &h, sizeof h, e);
    if (e) {
        HASH_DEL(M.external, e);
        M.external_bytes -= e->size;
        M.budget_chunks = (M.budget_bytes - M.external_bytes) / M.chunk;
        ooc_stats_gauge_sub(OOC_STAT_external_bytes, e->size);
        free(e);
    }
    mem_unlock();
}

void ooc_mem_report_fault(CUresult r) {
    static _Atomic int said;
    if (r != CUDA_ERROR_ILLEGAL_ADDRESS || atomic_exchange(&said, 1))
        return;
    pthread_mutex_lock(&mem_lock);
    char list[512];
    size_t len = 0, n = 0;
    list[0] = 0;
    buf_t *b, *bt;
    HASH_ITER(hh, M.bufs, b, bt) {
        chunk_t *c = chunk_find((b->addr - M.va_base) >> M.shift);
        if (!c || c->state != C_SWAPPED || c->aliased)
            continue;
        if (n++ < 8 && len < sizeof list - 64)
            len += (size_t)snprintf(list + len, sizeof list - len, "%s%#llx (%zu bytes)",
                                    len ? ", " : "", (unsigned long long)b->addr, b->size);
    }
    mem_unlock();
    OOC_LOG_E("the device reported an illegal address. A kernel probably reached a buffer the "
              "shim had swapped out through a pointer it could not see (one stored in device "
              "memory); safe mode %s. %zu buffers were swapped out without a host alias%s%s",
              M.safe ? "is on, so the fault is not one of those" : "is off", n, n ? ": " : "",
              list);
}

void ooc_mem_geometry(uint64_t *chunk_bytes, uint64_t *budget_bytes) {
    pthread_mutex_lock(&mem_lock);
    *chunk_bytes = M.chunk;
    *budget_bytes = M.budget_bytes;
    mem_unlock();
}

/* One timed batch: `reps` copies of `bytes` between slot s and the device chunk at dev, on
 * stream st, host-to-device when h2d. Caller holds mem_lock. */
static CUresult bw_copies(CUstream st, hslot_t *s, CUdeviceptr dev, uint64_t bytes, int reps,
                          int h2d) {
    CUresult r = CUDA_SUCCESS;
    for (int i = 0; i < reps && r == CUDA_SUCCESS; i++) {
        if (M.safe)
            r = h2d ? ooc_real.cuMemcpyDtoDAsync_v2(dev, s->va, bytes, st)
                    : ooc_real.cuMemcpyDtoDAsync_v2(s->va, dev, bytes, st);
        else
            r = h2d ? ooc_real.cuMemcpyHtoDAsync_v2(dev, s->p, bytes, st)
                    : ooc_real.cuMemcpyDtoHAsync_v2(s->p, dev, bytes, st);
    }
    return r;
}

CUresult ooc_mem_measure_bw(uint64_t bytes, double *h2d_bps, double *d2h_bps, double *bidir_bps) {
    pthread_mutex_lock(&mem_lock);
    if (bytes > M.chunk)
        bytes = M.chunk;
    int reps = (int)((8 * M.chunk) / bytes);
    if (reps < 4)
        reps = 4;
    /* On an idle device: copies still queued (the recorded iteration's swaps) would share the
     * engines and make the link look slower than it is. Once per profile. */
    ooc_real.cuCtxSynchronize();
    M.serial++;
    CUresult r = need_phys(1);
    uint64_t idx = 0;
    int have_va = r == CUDA_SUCCESS && va_take(1, &idx) == 0;
    chunk_t scratch;
    memset(&scratch, 0, sizeof scratch);
    scratch.idx = idx;
    if (r == CUDA_SUCCESS && !have_va)
        r = CUDA_ERROR_OUT_OF_MEMORY;
    int mapped = r == CUDA_SUCCESS && (r = map_chunk(&scratch)) == CUDA_SUCCESS;
    hslot_t *s1 = mapped ? host_slot() : NULL, *s2 = s1 ? host_slot() : NULL;
    CUstream st2 = NULL;
    CUevent ev[4] = {NULL, NULL, NULL, NULL};
    if (mapped && (!s1 || !s2))
        r = CUDA_ERROR_OUT_OF_MEMORY;
    if (r == CUDA_SUCCESS)
        r = ooc_real.cuStreamCreate(&st2, CU_STREAM_NON_BLOCKING);
    for (int i = 0; i < 4 && r == CUDA_SUCCESS; i++)
        r = ooc_real.cuEventCreate(&ev[i], CU_EVENT_DEFAULT);
    CUdeviceptr dev = (CUdeviceptr)chunk_addr(&scratch);
    float ms[3] = {0, 0, 0};
    for (int dir = 0; dir < 2 && r == CUDA_SUCCESS; dir++) {
        /* One direction at a time: dir 0 host to device, dir 1 device to host. */
        if ((r = ooc_real.cuEventRecord(ev[0], M.swap)) == CUDA_SUCCESS &&
            (r = bw_copies(M.swap, s1, dev, bytes, reps, dir == 0)) == CUDA_SUCCESS &&
            (r = ooc_real.cuEventRecord(ev[1], M.swap)) == CUDA_SUCCESS &&
            (r = ooc_real.cuEventSynchronize(ev[1])) == CUDA_SUCCESS)
            r = ooc_real.cuEventElapsedTime(&ms[dir], ev[0], ev[1]);
    }
    if (r == CUDA_SUCCESS) {
        /* Both at once: the device-to-host stream starts when the host-to-device one does. */
        float a = 0, b = 0;
        if ((r = ooc_real.cuEventRecord(ev[0], M.swap)) == CUDA_SUCCESS &&
            (r = ooc_real.cuStreamWaitEvent(st2, ev[0], 0)) == CUDA_SUCCESS &&
            (r = bw_copies(M.swap, s1, dev, bytes, reps, 1)) == CUDA_SUCCESS &&
            (r = bw_copies(st2, s2, dev, bytes, reps, 0)) == CUDA_SUCCESS &&
            (r = ooc_real.cuEventRecord(ev[1], M.swap)) == CUDA_SUCCESS &&
            (r = ooc_real.cuEventRecord(ev[2], st2)) == CUDA_SUCCESS &&
            (r = ooc_real.cuEventSynchronize(ev[1])) == CUDA_SUCCESS &&
            (r = ooc_real.cuEventSynchronize(ev[2])) == CUDA_SUCCESS &&
            (r = ooc_real.cuEventElapsedTime(&a, ev[0], ev[1])) == CUDA_SUCCESS &&
            (r = ooc_real.cuEventElapsedTime(&b, ev[0], ev[2])) == CUDA_SUCCESS)
            ms[2] = a > b ? a : b;
    }
    /* Nothing may still run on the scratch chunk when it is unmapped. */
    ooc_real.cuStreamSynchronize(M.swap);
    if (st2) {
        ooc_real.cuStreamSynchronize(st2);
        ooc_real.cuStreamDestroy_v2(st2);
    }
    for (int i = 0; i < 4; i++)
        if (ev[i])
            ooc_real.cuEventDestroy_v2(ev[i]);
    host_slot_put(s1);
    host_slot_put(s2);
    if (mapped)
        unmap_chunk(&scratch);
    if (have_va)
        va_give(idx, 1);
    mem_unlock();
    if (r != CUDA_SUCCESS)
        return r;
    double total = (double)bytes * reps;
    /* A timer that reads 0 (too fast to see) would make an infinite bandwidth: floor at 1 us. */
    *h2d_bps = total / ((ms[0] > 1e-3f ? ms[0] : 1e-3f) * 1e-3);
    *d2h_bps = total / ((ms[1] > 1e-3f ? ms[1] : 1e-3f) * 1e-3);
    *bidir_bps = 2 * total / ((ms[2] > 1e-3f ? ms[2] : 1e-3f) * 1e-3);
    return CUDA_SUCCESS;
}

void ooc_mem_info(uint64_t *budget, uint64_t *resident) {
    pthread_mutex_lock(&mem_lock);
    *budget = M.budget_bytes;
    *resident = M.resident * M.chunk + M.external_bytes;
    mem_unlock();
}

uint64_t ooc_mem_slab_chunks(void) {
    pthread_mutex_lock(&mem_lock);
    uint64_t n = 0;
    for (chunk_t *c = M.chunks; c; c = c->hh.next)
        n += c->slab != NULL;
    mem_unlock();
    return n;
}

void ooc_mem_l_each_buffer(void (*fn)(uint64_t id, uintptr_t addr, uint64_t bytes, void *ctx),
                           void *ctx) {
    for (buf_t *b = M.bufs; b; b = b->hh.next)
        fn(b->id, b->addr, b->size, ctx);
}
