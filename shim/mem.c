/* SPDX-License-Identifier: MIT */
/* mem.c: the memory layer's state and life: start-up (the VA reservation, the fast path's
 * table), shutdown, and small queries. The concepts live in their own files (see mem_int.h).
 *
 * The shim's device memory: buffers at stable virtual addresses, physical chunks pooled under
 * the budget, residency on demand. One VA reservation holds every buffer. It is cut into chunks
 * of OOC_CHUNK bytes, the unit of residency: a chunk is EMPTY (never backed; contents undefined,
 * as cuMemAlloc's are), RESIDENT (mapped to a physical chunk from the pool) or SWAPPED (its
 * bytes in a pinned host slot). Physical chunks are created lazily up to budget/chunk and never
 * released before exit (except to make room for the program's own, external.c); host slots
 * come from a pinned pool (pool.c).
 *
 * Invariants: a RESIDENT chunk is mapped read-write at its address; it is unmapped only after
 * the work of every stream that used it since it was mapped has completed (events recorded on
 * those streams, or a context synchronisation when they are unknown); freed VA goes through a
 * quarantine before reuse, so a use after free faults.
 *
 * Locking: one mutex (mem_lock) guards the state M. ooc_mem_begin takes it and ooc_mem_end
 * releases it. The fast path (fastpath.c) reads atomics without it. Callers: init.c (start-up),
 * the exit path (shutdown), the hooks and record.c (queries). */
#include "mem_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

pthread_mutex_t mem_lock = PTHREAD_MUTEX_INITIALIZER;
struct mem_state M;

/* ---- init ---------------------------------------------------------------------------------- */

void ooc_mem_set_reuse(int on) {
    mem_lock_take();
    M.reuse = on;
    /* With reuse, the first half of the reservation holds the program's large buffers at stable
     * addresses (buffer.c), the rest everything else; set before anything is handed out. */
    if (on && !M.pva.chunks && M.va.next == 0 && M.va.nfree_runs == 0 && M.va.q_len == 0 &&
        M.va.chunks >= 2) {
        M.pva.chunks = M.va.chunks / 2;
        M.pva.direct = 1;
        M.va.next = M.pva.chunks;
    }
    mem_unlock();
}

void ooc_mem_set_remap_gate(int on) {
    mem_lock_take();
    M.remap_gate = on;
    mem_unlock();
}

void ooc_mem_set_stage(int on) {
    mem_lock_take();
    M.stage = on;
    mem_unlock();
}

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
    M.va.chunks = M.va_size >> M.shift;
    /* The fast path's table: one pointer per chunk of the reservation, touched only where
     * buffers are. Without it every op takes the locked path. */
    M.table_bytes = M.va.chunks * sizeof *M.table;
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

_Atomic int mem_closed;

/* Frees everything the pool holds; called at exit after the program's work is done. */
void ooc_mem_shutdown(void) {
    mem_lock_take();
    atomic_store(&mem_closed, 1);
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
        mem_lock_take();
        pthread_cond_destroy(&M.work_cv);
        pthread_cond_destroy(&M.done_cv);
    }
    gate_stop(); /* its jobs done: every gate open */
    /* The program may have dropped its context before exit: ours is the one we set up in. */
    CUcontext prev = NULL;
    ooc_real.cuCtxGetCurrent(&prev);
    ooc_real.cuCtxSetCurrent(M.ctx);
    ooc_real.cuCtxSynchronize();
    gate_free_word();
    for (size_t i = 0; i < M.nlimbo; i++) {
        host_slot_put(M.limbo[i].slot);
        ev_drop(M.limbo[i].ev);
    }
    for (unsigned i = 0; i < 8; i++)
        ev_drop(M.fcache[i].v);
    fill_drop();
    stage_spares_reap(1); /* the gates are open (gate_stop) */
    stage_drop_all();
    warm_shutdown();
    chunk_t *c, *tmp;
    HASH_ITER(hh, M.chunks, c, tmp) {
        ev_drop(c->in_ev);
        ev_drop(c->out_ev);
        c->in_ev = c->out_ev = NULL;
        if (c->state == C_RESIDENT && unmap_chunk(c) != CUDA_SUCCESS && c->phys) {
            /* After a sticky device error nothing can be unmapped; free our side anyway. */
            phys_release(c->phys);
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
        phys_release(p);
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
    va_space_free(&M.va);
    va_space_free(&M.pva);
    M.pva.chunks = 0;
    free(M.dying);
    free(M.staged);
    free(M.reached);
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

void ooc_mem_report_fault(CUresult r) {
    static _Atomic int said;
    if (r != CUDA_ERROR_ILLEGAL_ADDRESS || atomic_exchange(&said, 1))
        return;
    mem_lock_take();
    char list[512];
    size_t len = 0, n = 0;
    list[0] = 0;
    buf_t *b, *bt;
    HASH_ITER(hh, M.bufs, b, bt) {
        /* Not resident and not aliased: swapped out, or never used by an op the shim saw (no
         * memory behind it without safe mode). */
        chunk_t *c = chunk_find((b->addr - M.va_base) >> M.shift);
        if (c && (c->state == C_RESIDENT || c->aliased))
            continue;
        if (n++ < 8 && len < sizeof list - 64)
            len += (size_t)snprintf(list + len, sizeof list - len, "%s%#llx (%zu bytes)",
                                    len ? ", " : "", (unsigned long long)b->addr, b->size);
    }
    int staging = M.safe && M.stage;
    mem_unlock();
    OOC_LOG_E("the device reported an illegal address. A kernel probably reached a buffer the "
              "shim had swapped out through a pointer it could not see (one stored in device "
              "memory); safe mode %s. %zu buffers were not resident (swapped out without a host "
              "alias, or never used by an operation the shim saw)%s%s",
              M.safe ? "is on, so the fault is not one of those" : "is off", n, n ? ": " : "",
              list);
    if (staging)
        OOC_LOG_E("safe mode, OOC_SAFE_STAGE=1: a buffer whose planned swap-in has started is "
                  "read-only at its address until the next operation that names it, so that a "
                  "write through such a pointer faults rather than be lost; OOC_SAFE_STAGE=0 "
                  "keeps such writes (its swap-ins no longer overlap the compute)");
}

void ooc_mem_geometry(uint64_t *chunk_bytes, uint64_t *budget_bytes) {
    mem_lock_take();
    *chunk_bytes = M.chunk;
    *budget_bytes = M.budget_bytes;
    mem_unlock();
}

int ooc_mem_swapin_exclusive(void) {
    mem_lock_take();
    int x = M.safe && !M.stage;
    mem_unlock();
    return x;
}

int ooc_mem_swapout_exclusive(void) {
    mem_lock_take();
    int x = M.safe;
    mem_unlock();
    return x;
}

void ooc_mem_set_gate_timeout(unsigned s) {
    gate_set_timeout(s);
}

int ooc_mem_remap_gate(void) {
    mem_lock_take();
    int x = M.safe && M.remap_gate;
    mem_unlock();
    return x;
}

void ooc_mem_info(uint64_t *budget, uint64_t *held) {
    mem_lock_take();
    *budget = M.budget_bytes;
    /* Every chunk of ours can be swapped out; the program's own VMM memory cannot. */
    *held = M.external_bytes;
    mem_unlock();
}

static int span_cmp(const void *a, const void *b) {
    const uint64_t *x = a, *y = b;
    return x[0] < y[0] ? -1 : x[0] > y[0];
}

int ooc_mem_span(const uintptr_t *addrs, unsigned n, uint64_t *chunks, uint64_t *budget_chunks) {
    uint64_t(*sp)[2] = malloc((n ? n : 1) * sizeof *sp);
    if (!sp)
        return -1;
    mem_lock_take();
    unsigned k = 0;
    for (unsigned i = 0; i < n; i++) {
        buf_t *b = lookup(addrs[i]);
        if (b) {
            buf_span(b, &sp[k][0], &sp[k][1]);
            k++;
        }
    }
    *budget_chunks = M.budget_chunks;
    mem_unlock();
    qsort(sp, k, sizeof *sp, span_cmp);
    uint64_t total = 0, end = 0; /* chunks [.., end) counted so far */
    for (unsigned i = 0; i < k; i++) {
        uint64_t lo = sp[i][0] > end ? sp[i][0] : end, hi = sp[i][1] + 1;
        if (hi > lo)
            total += hi - lo;
        if (hi > end)
            end = hi;
    }
    free(sp);
    *chunks = total;
    return 0;
}

uint64_t ooc_mem_slab_chunks(void) {
    mem_lock_take();
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
