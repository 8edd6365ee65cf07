/* SPDX-License-Identifier: MIT */
/* fastpath.c: the residency lock (mem_lock), the writer sections that hold the lock-free fast path
 * back, and the fast path itself: an op whose chunks are all hot is issued without the lock. Every
 * wait of the memory layer (for the lock, on a condition variable, for the device) goes through
 * here too, timed as the program's blocked time.
 *
 * Locking: every taking of mem_lock goes through mem_lock_take, every release of mem_lock goes
 * through mem_unlock or mem_wait, which leave the writer section this hold may have entered
 * (quiesce). Readers (ooc_mem_fast_begin/end) take no lock: they count themselves in a reader slot
 * and read only atomics (the chunk table, each chunk's hot flag, users, extent and touched flag,
 * the safe-mode stream serials, fc_dirty). Code under the lock that changes what they rely on calls
 * cool() or quiesce() first. Callers: the hooks (launch.c, hooks.c) for the fast path; every other
 * memory file for the lock and sections. */
#include "mem_int.h"

#include <sched.h>
#include <stdlib.h>
#include <time.h>

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

_Atomic int fp_on; /* the fast path may be used (the reservation's table exists) */

static _Atomic unsigned fp_next_slot;

static _Thread_local int fp_slot = -1;

static _Thread_local int fp_stream = -1; /* the op's index in M.streams (safe mode) */

/* Enters a writer section (idempotent within one hold of mem_lock): returns once no fast-path op
 * is between its check of the writer flag and its end, and none can start one until mem_lock is
 * released. Caller holds mem_lock. */
void quiesce(void) {
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
        chunk_free(M.grave[i]);
    M.ngrave = 0;
}

/* Frees a deleted chunk (chunk_delete), once no reader can see it. */
void chunk_free(chunk_t *c) {
    free(c->gone);
    free(c);
}

/* Leaves the writer section, if this hold entered one. Caller holds mem_lock. */
static void quiesce_end(void) {
    if (M.quiesced) {
        M.quiesced = 0;
        atomic_store(&fp_writer, 0);
    }
}

/* ---- the program's threads, blocked --------------------------------------------------------
 *
 * Every wait of a program thread inside the shim (for mem_lock while another thread holds it, on
 * a condition variable, for device work) is timed into OOC_STAT_blocked_ns (replay.c takes its
 * share per replayed iteration): on a GPU that is time the framework's thread does not run
 * ahead, and the device may idle. The worker's waits are its job: not counted. */

static _Thread_local int on_worker;

/* Marks the calling thread as the worker, whose waits are not counted. */
void mem_on_worker(void) {
    on_worker = 1;
}

int mem_is_worker(void) {
    return on_worker;
}

uint64_t mem_clock_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Starts timing a wait of the calling thread: pass the result to wait_end when it is over. */
uint64_t wait_begin(void) {
    return on_worker ? 0 : mem_clock_ns();
}

/* What the calling thread's waits are for now (wait_for), for OOC_STATS's rows by cause. */
static _Thread_local unsigned char wait_why;

static const ooc_stat_t why_stat[] = {
    [WAIT_LOCK] = OOC_STAT_blocked_lock_ns,
    [WAIT_QUEUED] = OOC_STAT_blocked_queued_ns,
    [WAIT_OUT] = OOC_STAT_blocked_out_ns,
    [WAIT_STREAMS] = OOC_STAT_blocked_streams_ns,
};

unsigned wait_for(unsigned why) {
    unsigned old = wait_why;
    wait_why = (unsigned char)why;
    return old;
}

/* Has a stream the program issued work on some of it still queued (0 when not known)? Then the
 * device had the program's work all through a wait that ends now (a stream runs in order; this
 * thread queued nothing while it waited): on a GPU such a wait costs nothing, the framework's
 * thread was ahead anyway. A wait that ends with every such stream empty may have starved the
 * device, for all of it or a part (OOC_STATS "with the program's streams empty", an upper bound).
 * Lock-free: the stream table's entries are only added. */
static int program_busy(void) {
    /* During a stream capture a query could invalidate the program's capture: not asked. */
    if (!ooc_real.cuStreamQuery || atomic_load_explicit(&ooc_graph_captures, memory_order_relaxed))
        return 0;
    unsigned n = atomic_load_explicit(&M.nstreams, memory_order_acquire);
    for (unsigned i = 0; i < n; i++)
        if (ooc_real.cuStreamQuery(M.streams[i].s) == CUDA_ERROR_NOT_READY)
            return 1;
    return 0;
}

/* Waits shorter than this are counted as with the streams empty without asking the driver. */
#define IDLE_QUERY_NS 20000

static void wait_count(uint64_t t0, unsigned why) {
    uint64_t dt = mem_clock_ns() - t0;
    ooc_stats_add(OOC_STAT_blocked_ns, dt);
    if (why != WAIT_OTHER)
        ooc_stats_add(why_stat[why], dt);
    if (dt < IDLE_QUERY_NS || !program_busy())
        ooc_stats_add(OOC_STAT_blocked_idle_ns, dt);
}

/* Counts the wait that began at t0 (wait_begin) as blocked, unless on the worker, under the
 * cause wait_for set. */
void wait_end(uint64_t t0) {
    if (on_worker)
        return;
    wait_count(t0, wait_why);
}

/* Program threads waiting for mem_lock (mem_lock_take): the worker lets them go first. */
static atomic_int lock_wanted;

/* Takes mem_lock; the time spent waiting for it while another thread holds it counts as
 * blocked (not on the worker). Every taking of mem_lock goes through this. */
void mem_lock_take(void) {
    if (pthread_mutex_trylock(&mem_lock) == 0)
        return;
    uint64_t t0 = wait_begin();
    if (!on_worker)
        atomic_fetch_add(&lock_wanted, 1);
    pthread_mutex_lock(&mem_lock);
    if (!on_worker) {
        atomic_fetch_sub(&lock_wanted, 1);
        wait_count(t0, WAIT_LOCK);
    }
}

/* The worker, holding mem_lock between two steps of its work: when a program thread waits for
 * the lock, hands it over and takes it back after (a program thread that waits is a device that
 * may run dry; the worker's steps are not urgent one by one). 1 when the lock was released:
 * everything must be looked up again. */
int mem_yield(void) {
    if (!atomic_load_explicit(&lock_wanted, memory_order_relaxed))
        return 0;
    mem_unlock();
    /* A mutex is not fair: without this the worker could take it back at once. Bounded, in case
     * the waiter is not scheduled for a while. */
    for (int i = 0; i < 1000 && atomic_load(&lock_wanted); i++)
        sched_yield();
    mem_lock_take();
    return 1;
}

/* Every synchronisation of the memory layer goes through these three, so that the time a
 * program thread spends in them counts as blocked. */

CUresult sync_event(CUevent e) {
    uint64_t t0 = wait_begin();
    CUresult r = ooc_real.cuEventSynchronize(e);
    wait_end(t0);
    return r;
}

CUresult sync_stream(CUstream s) {
    uint64_t t0 = wait_begin();
    CUresult r = ooc_real.cuStreamSynchronize(s);
    wait_end(t0);
    return r;
}

CUresult sync_ctx(void) {
    uint64_t t0 = wait_begin();
    CUresult r = ooc_real.cuCtxSynchronize();
    wait_end(t0);
    return r;
}

/* Every release of mem_lock goes through one of these two. */
void mem_unlock(void) {
    mem_check();
    quiesce_end();
    pthread_mutex_unlock(&mem_lock);
}

void mem_wait(pthread_cond_t *cv) {
    mem_check();
    quiesce_end();
    uint64_t t0 = wait_begin();
    pthread_cond_wait(cv, &mem_lock);
    wait_end(t0);
}

/* Makes c not hot, inside a writer section. Every change to a chunk that the fast path's
 * conditions depend on (set_hot) is preceded by this. A chunk that is not hot needs no section:
 * hot only goes from 1 to 0 here, so no fast-path op that saw it hot is still running. Caller
 * holds mem_lock. */
void cool(chunk_t *c) {
    if (atomic_load_explicit(&c->hot, memory_order_relaxed)) {
        quiesce();
        atomic_store_explicit(&c->hot, 0, memory_order_relaxed);
    }
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
 * live buffer owns that chunk (the locked path ignores such a word too), and, when lo is a
 * chunk's first byte, the extent of the chunk before (lo may be the end pointer of a buffer
 * that ends there, which the locked path takes when no buffer contains lo). An extent covers the
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

/* ---- a replayed op's buffers, without the buffer table -----------------------------------------
 *
 * replay.c matches an op to the plan by the buffers the locked path would list for it
 * (resident.c, ooc_mem_op_pin: each query's buffers in order, weak words left out, each buffer
 * once). On the fast path that list is rebuilt without the lock, exactly or not at all. A large
 * buffer's hot chunk names its buffer (own_id, own_bytes; the buffer starts at ext_first). A
 * slab chunk holds many small buffers, whose list changes under us: an address there is
 * resolved only against candidates, buffers listed before (the plan's, bound earlier in the
 * iteration) in the same slab chunk (its stamp) and not freed since (its `gone` bit). A slab's
 * space is never handed out twice, so such a candidate is still live, and live buffers do not
 * overlap: it is the buffer the lookup would find. Any other address in a slab goes to the
 * locked path. */

/* The buffer that the locked path's lookup(p) finds: 1 with it in *b, 0 for none, -1 when only
 * the locked path can tell. p lies in the reservation. */
static int fast_lookup(uintptr_t p, const ooc_opbuf_t *cand, size_t nc, ooc_opbuf_t *b) {
    chunk_t *c = atomic_load_explicit(&M.table[(p - M.va_base) >> M.shift], memory_order_acquire);
    if (!c || atomic_load_explicit(&c->ext_n, memory_order_relaxed) == 0)
        return 0; /* no live buffer owns it: no owner, no slab */
    if (!atomic_load_explicit(&c->hot, memory_order_acquire))
        return -1; /* a chunk that may change under us */
    uint64_t id = atomic_load_explicit(&c->own_id, memory_order_relaxed);
    if (id == 0) { /* a slab */
        uint64_t stamp = atomic_load_explicit(&c->stamp, memory_order_relaxed);
        for (size_t k = 0; k < nc; k++)
            if (cand[k].stamp == stamp && p >= cand[k].addr && p - cand[k].addr < cand[k].bytes) {
                uint64_t slot = (cand[k].addr - chunk_addr(c)) / SLAB_ALIGN;
                if (atomic_load_explicit(&c->gone[slot / 64], memory_order_relaxed) &
                    (1ull << (slot % 64)))
                    return -1; /* freed since it was listed */
                *b = cand[k];
                return 1;
            }
        return -1;
    }
    uintptr_t base =
        M.va_base +
        ((uintptr_t)atomic_load_explicit(&c->ext_first, memory_order_relaxed) << M.shift);
    uint64_t size = atomic_load_explicit(&c->own_bytes, memory_order_relaxed);
    if (p - base >= size)
        return 0; /* past the end of the buffer, in its last chunk */
    *b = (ooc_opbuf_t){.id = id, .addr = base, .bytes = size};
    return 1;
}

/* Adds b (used as `use` by the query [lo, hi)) to v[*n] unless there already, as opbuf_add
 * does. 0, or -1 when v is full. */
static int fast_add(ooc_opbuf_t *v, size_t cap, size_t *n, ooc_opbuf_t b, uintptr_t lo,
                    uintptr_t hi, unsigned use, uint32_t word) {
    if (use == OOC_USE_W && (lo > b.addr || hi < b.addr + b.bytes))
        use = OOC_USE_RW;
    for (size_t i = 0; i < *n; i++)
        if (v[i].id == b.id) {
            v[i].use |= use;
            return 0;
        }
    if (*n == cap)
        return -1;
    b.use = use;
    b.word = word;
    v[(*n)++] = b;
    return 0;
}

int ooc_mem_fast_list(const ooc_access_t *a, const ooc_opbuf_t *cand, size_t nc, ooc_opbuf_t *v,
                      size_t cap, size_t *n) {
    *n = 0;
    for (unsigned i = 0; i < a->n; i++) {
        const ooc_query_t *q = &a->refs[i];
        if (q->use & OOC_USE_WEAK)
            continue; /* made resident, not listed */
        if (q->lo - M.va_base >= M.va_size)
            return 0;
        ooc_opbuf_t b;
        if (q->hi == q->lo) { /* a word: the buffer containing it, else one ending there */
            int f = fast_lookup(q->lo, cand, nc, &b);
            if (f == 0 && q->lo > M.va_base) {
                f = fast_lookup(q->lo - 1, cand, nc, &b);
                if (f == 1 && b.addr + b.bytes != q->lo)
                    f = 0;
            }
            if (f < 0 || (f == 1 && fast_add(v, cap, n, b, q->lo, q->hi, q->use, q->word) != 0))
                return 0;
            continue;
        }
        /* A range: the buffer containing lo, then the one starting where it ends, and so on. */
        for (uintptr_t at = q->lo; at < q->hi; at = b.addr + b.bytes) {
            int f = fast_lookup(at, cand, nc, &b);
            if (f < 0 || (f == 1 && fast_add(v, cap, n, b, q->lo, q->hi, q->use, q->word) != 0))
                return 0;
            if (f == 0 || b.addr + b.bytes - M.va_base >= M.va_size)
                break;
        }
    }
    return 1;
}

#ifdef OOC_CHECKS
/* The fast path's list of the op's buffers is the locked path's, whenever it gives one (with
 * the locked path's own list as the candidates): checked on every listed op of the sanitizer
 * build. Caller holds mem_lock, the op just listed in M.op_bufs. */
void fast_buffers_check(const ooc_access_t *a) {
    ooc_opbuf_t v[OOC_MAX_REFS];
    size_t n = 0;
    if (!M.table || a->overflow || !ooc_mem_fast_list(a, M.op_bufs, M.nopb, v, OOC_MAX_REFS, &n))
        return;
    int same = n == M.nopb;
    for (size_t i = 0; same && i < n; i++)
        same = v[i].id == M.op_bufs[i].id && v[i].addr == M.op_bufs[i].addr &&
               v[i].bytes == M.op_bufs[i].bytes && v[i].use == M.op_bufs[i].use &&
               v[i].word == M.op_bufs[i].word;
    if (!same) {
        OOC_LOG_E("invariant broken: the fast path lists %zu buffers for op %llu (first %llu), "
                  "the locked path %zu (first %llu)",
                  n, (unsigned long long)M.serial, (unsigned long long)(n ? v[0].id : 0), M.nopb,
                  (unsigned long long)(M.nopb ? M.op_bufs[0].id : 0));
        abort();
    }
}
#endif

/* Checks that every chunk the op uses is hot (inside the reader section entered by the caller):
 * 1 when it may be issued on the fast path. */
static int fast_chunks(const ooc_access_t *a, CUstream s);

int ooc_mem_fast_begin(const ooc_access_t *a, CUstream s) {
    if (a->overflow)
        return 0;
    _Atomic unsigned long *slot = fp_my_slot();
    atomic_fetch_add(slot, 1);
    if (atomic_load(&fp_writer) || !atomic_load_explicit(&fp_on, memory_order_relaxed) ||
        ooc_record_on() || ooc_replay_on() || !fast_chunks(a, s))
        goto slow;
    ooc_stats_add(OOC_STAT_fast_ops, 1);
    return 1;
slow:
    atomic_fetch_sub_explicit(slot, 1, memory_order_release);
    return 0;
}

int ooc_mem_fast_enter(const ooc_access_t *a, CUstream s) {
    if (a->overflow)
        return 0;
    _Atomic unsigned long *slot = fp_my_slot();
    atomic_fetch_add(slot, 1);
    if (atomic_load(&fp_writer) || !atomic_load_explicit(&fp_on, memory_order_relaxed) ||
        ooc_record_on() || !fast_chunks(a, s)) {
        atomic_fetch_sub_explicit(slot, 1, memory_order_release);
        return 0;
    }
    return 1;
}

static int fast_chunks(const ooc_access_t *a, CUstream s) {
    if (M.safe && ((fp_stream = fast_stream(s)) < 0 || atomic_load(&M.fill_on)))
        return 0;
    for (unsigned i = 0; i < a->n; i++) {
        uintptr_t lo = a->refs[i].lo, hi = a->refs[i].hi;
        uint64_t idx = (lo - M.va_base) >> M.shift, next = 0;
        if (lo - M.va_base >= M.va_size)
            return 0;
        if (hi == lo) {
            if (fast_extent(idx, s, &next) == FX_COLD)
                return 0;
            /* At a chunk's start, a word may also be the end pointer of a buffer before it. */
            if (idx > 0 && ((lo - M.va_base) & (M.chunk - 1)) == 0 &&
                fast_extent(idx - 1, s, &next) == FX_COLD)
                return 0;
            continue;
        }
        if (hi - 1 - M.va_base >= M.va_size)
            return 0; /* past the reservation: the locked path sorts it out */
        for (uint64_t last = (hi - 1 - M.va_base) >> M.shift; idx <= last; idx = next)
            if (fast_extent(idx, s, &next) != FX_OK)
                return 0;
    }
    return 1;
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
    mem_lock_take();
    if (M.ready && M.table)
        atomic_store(&fp_on, 1);
    mem_unlock();
}

void ooc_mem_quiesce(void) {
    mem_lock_take();
    quiesce();
    mem_unlock();
}

void ooc_mem_l_quiesce(void) {
    quiesce();
}
