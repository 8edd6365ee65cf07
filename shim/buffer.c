/* SPDX-License-Identifier: MIT */
/* buffer.c: the program's buffers: allocation and free at stable addresses, large buffers
 * owning whole chunks and small ones sharing slab chunks, and address lookup.
 *
 * Invariants: a buffer of more than chunk/8 bytes owns whole chunks (waste below one chunk);
 * smaller ones are bump-allocated, SLAB_ALIGN-aligned, in the current slab chunk, whose sorted
 * buffer list serves lookups. A chunk is released (retire.c) when no live buffer uses it.
 * Locking: the public functions take mem_lock; the helpers expect it held. Callers: the hooks
 * (allocation, free, parameter noting), resident.c and transfer.c (lookup). */
#include "mem_int.h"

#include <stdlib.h>
#include <string.h>

/* The range check's memory, per thread: buffers found live while free_gen had the value `gen`.
 * Every free advances free_gen (under mem_lock, after the buffer left the table), so an entry is
 * trusted only while no buffer at all has been freed since: a memset or copy loop over live
 * buffers takes no lock, and a freed buffer is never taken for live. */
static _Atomic uint64_t free_gen = 1;

#define RANGE_MEMO 4

static _Thread_local struct {
    uintptr_t base;
    size_t size;
    uint64_t gen;
} range_memo[RANGE_MEMO];

static _Thread_local unsigned range_memo_next;

/* ---- buffers --------------------------------------------------------------------------------- */

static CUresult alloc_small(buf_t *b, size_t size) {
    size_t need = (size + SLAB_ALIGN - 1) & ~(size_t)(SLAB_ALIGN - 1);
    chunk_t **cur = b->own ? &M.slab_own : &M.slab_cur;
    chunk_t *c = *cur;
    if (!c || c->slab->offset + need > M.chunk) {
        uint64_t idx;
        if (va_take(1, &idx) != 0)
            return CUDA_ERROR_OUT_OF_MEMORY;
        c = chunk_new(idx, idx, 1);
        slab_t *s = calloc(1, sizeof *s);
        _Atomic uint64_t *gone = calloc((M.chunk / SLAB_ALIGN + 63) / 64, sizeof *gone);
        if (!c || !s || !gone) {
            free(s);
            free(gone);
            if (c)
                chunk_delete(c);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        c->slab = s;
        c->gone = gone;
        atomic_store_explicit(&c->stamp, ++M.next_stamp, memory_order_relaxed);
        chunk_t *full = *cur;
        *cur = c;
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

/* Whether nothing is mapped, or still to be unmapped, at chunks [first, first + n) but warm
 * chunks: no chunk object (a dying one of a freed buffer) and no address whose memory went on
 * early. What is done already is reaped first when something is there. */
static int home_free(uint64_t first, uint64_t n) {
    for (int reaped = 0;; reaped = 1) {
        uint64_t i = 0;
        while (i < n && !chunk_find(first + i) && !warm_late_at(first + i))
            i++;
        if (i == n)
            return 1;
        if (reaped)
            return 0;
        (void)reap_dying(0);
        (void)warm_late_reap(0);
    }
}

/* Stable addresses (OOC_REUSE): a program's large buffer gets its range from M.pva, which sees
 * the program's allocations and frees and nothing else (best fit, a freed range free at once),
 * so the same allocation of every iteration gets the same address, whatever was resident when:
 * a stale pointer in a kernel's parameters (a word the kernel does not read) then meets the same
 * buffer every iteration, and the iteration is found. The warm chunks in the range (the memory
 * of a buffer freed there, kept mapped) are taken: the new buffer is resident from the start,
 * with no driver call, and its ops wait on their streams for the work that may still use the old
 * one (each chunk's in_ev). Where a freed buffer's chunk is still dying there (its memory goes
 * once its users are done), the buffer lives elsewhere this time (M.va), its range still taken in
 * M.pva (b->home) so that what the next allocations get does not change. Without OOC_REUSE (or
 * for the shim's own buffers) the range comes from M.va, after a quarantine. */
static CUresult alloc_large(buf_t *b, size_t size) {
    uint64_t count = (size + M.chunk - 1) >> M.shift, first = 0, home;
    warm_t *w = NULL;
    int at_home = 0;
    if (M.pva.chunks && !b->own && pva_take(count, &home) == 0) {
        b->home = (int64_t)home;
        at_home = home_free(home, count);
        if (at_home && warm_take_at(home, count, &w) != 0) {
            pva_give(home, count);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        first = home;
        ooc_stats_add(at_home ? OOC_STAT_stable_addrs : OOC_STAT_stable_moved, 1);
    }
    if (!at_home && !M.pva.chunks && (w = warm_take(count)) != NULL) {
        first = w->first;
    } else if (!at_home && va_take(count, &first) != 0) {
        if (b->home >= 0)
            pva_give((uint64_t)b->home, count);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    uint64_t adopted = 0;
    for (uint64_t i = 0; i < count; i++) {
        chunk_t *c = chunk_new(first + i, first, count);
        if (!c) {
            for (uint64_t j = 0; j < i; j++) {
                chunk_t *d = chunk_find(first + j);
                if (w && d->phys) { /* its physical chunk goes back to the run, still mapped */
                    lru_remove(d);
                    w->c[j] = (wchunk_t){d->phys, d->in_ev};
                    d->in_ev = NULL;
                    d->phys = NULL;
                    d->state = C_EMPTY;
                    M.resident--;
                    M.warm_chunks++;
                }
                chunk_delete(d);
            }
            if (w)
                warm_untake(w);
            else
                va_give(first, count); /* ignored at home */
            if (b->home >= 0)
                pva_give((uint64_t)b->home, count);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        c->owner = b;
        c->nbufs = 1;
        if (w && w->c[i].phys) {
            c->phys = w->c[i].phys;
            c->in_ev = w->c[i].ev;
            w->c[i] = (wchunk_t){NULL, NULL};
            c->state = C_RESIDENT;
            c->since = M.serial;
            M.warm_chunks--;
            M.resident++;
            lru_push(c);
            adopted++;
        }
    }
    if (w) {
        ooc_stats_add(OOC_STAT_warm_reuses, adopted);
        free(w);
    }
    b->addr = idx_addr(first);
    return CUDA_SUCCESS;
}

static CUresult mem_alloc(CUdeviceptr *out, size_t size, uint64_t *id, int own) {
    if (!out || size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    mem_lock_take();
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
        b->own = own;
        b->home = -1;
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
    if (!own)
        ooc_stats_alloc(size, mapped);
    *out = (CUdeviceptr)b->addr;
    b->id = ++M.next_id;
    if (!b->small) { /* for the fast path (published when a chunk turns hot) */
        uint64_t first = (b->addr - M.va_base) >> M.shift, count = mapped >> M.shift;
        for (uint64_t i = 0; i < count; i++) {
            chunk_t *c = chunk_find(first + i);
            atomic_store_explicit(&c->own_id, b->id, memory_order_relaxed);
            atomic_store_explicit(&c->own_bytes, size, memory_order_relaxed);
        }
    }
    if (id)
        *id = b->id;
    if (!own)
        OOC_LOG_D("allocation %llu: %zu bytes at %#llx%s", (unsigned long long)b->id, size,
                  (unsigned long long)b->addr,
                  b->home < 0                              ? ""
                  : b->addr == idx_addr((uint64_t)b->home) ? " (its stable address)"
                                                           : " (away from its stable address)");
    mem_unlock();
    return CUDA_SUCCESS;
}

CUresult ooc_mem_alloc(CUdeviceptr *out, size_t size, uint64_t *id) {
    return mem_alloc(out, size, id, 0);
}

/* The shim's own small buffers (recompute.c's checksums and scratch) share slab chunks with each
 * other only: interleaved with the program's, they would spread its small buffers over more
 * chunks while recording than in demand mode, and an op touching many of them (PyTorch's
 * foreach optimizer step) could then need more chunks than the budget holds. Not counted in the
 * program's allocation statistics. */
CUresult ooc_mem_alloc_own(CUdeviceptr *out, size_t size) {
    return mem_alloc(out, size, NULL, 1);
}

CUresult ooc_mem_free(CUdeviceptr p, CUstream stream, uint64_t *id) {
    mem_lock_take();
    uintptr_t a = (uintptr_t)p;
    buf_t *b;
    HASH_FIND(hh, M.bufs, &a, sizeof a, b);
    if (!b) {
        mem_unlock();
        return CUDA_ERROR_INVALID_VALUE;
    }
    HASH_DEL(M.bufs, b);
    atomic_fetch_add_explicit(&free_gen, 1, memory_order_release);
    if (id)
        *id = b->id;
    uint64_t first = (b->addr - M.va_base) >> M.shift;
    if (b->small) {
        chunk_t *c = chunk_find(first);
        slab_remove(c->slab, b);
        uint64_t slot = (b->addr - chunk_addr(c)) / SLAB_ALIGN; /* gone, for the fast path */
        atomic_fetch_or_explicit(&c->gone[slot / 64], 1ull << (slot % 64), memory_order_relaxed);
        if (stream)
            chunk_add_user(c, stream);
        if (--c->nbufs == 0 && c != M.slab_cur && c != M.slab_own)
            chunk_release(c, stream);
        if (!b->own)
            ooc_stats_free(b->size, (b->size + SLAB_ALIGN - 1) & ~(uint64_t)(SLAB_ALIGN - 1));
    } else {
        uint64_t count = (b->size + M.chunk - 1) >> M.shift;
        if (b->home >= 0)
            pva_give((uint64_t)b->home, count); /* the next allocation may take it at once */
        /* Every chunk resident and settled: kept mapped as a warm run for the next buffers
         * (warm.c); else each chunk is released, its memory back once its users are done. A
         * buffer that lived away from its stable address is released. */
        int whole = !M.pva.chunks || first == (uint64_t)b->home;
        for (uint64_t i = 0; i < count && whole; i++) {
            chunk_t *c = chunk_find(first + i);
            whole = c->state == C_RESIDENT && !c->aliased && !c->out_ev && !c->queued &&
                    !c->dying && c != M.slab_cur;
        }
        if (!whole || warm_free(first, count, stream) != 0) {
            for (uint64_t i = 0; i < count; i++) {
                chunk_t *c = chunk_find(first + i);
                c->owner = NULL;
                c->nbufs = 0;
                chunk_release(c, stream);
            }
        }
        if (!b->own)
            ooc_stats_free(b->size, count << M.shift);
    }
    free(b);
    mem_unlock();
    return CUDA_SUCCESS;
}

/* Caller holds mem_lock. */
buf_t *lookup(uintptr_t p) {
    if (!ooc_mem_owns(p))
        return NULL;
    chunk_t *c = chunk_find((p - M.va_base) >> M.shift);
    if (!c)
        return NULL;
    if (c->owner)
        return p < c->owner->addr + c->owner->size ? c->owner : NULL;
    return c->slab ? slab_find(c->slab, p) : NULL;
}

/* The live buffer that ends exactly at p (p is one past its last byte), or NULL. Caller holds
 * mem_lock. */
static buf_t *lookup_end(uintptr_t p) {
    buf_t *b = p ? lookup(p - 1) : NULL;
    return b && b->addr + b->size == p ? b : NULL;
}

buf_t *query_next(query_walk_t *w) {
    const ooc_query_t *q = w->q;
    if (q->hi > q->lo) {
        buf_t *b = w->at < q->hi ? lookup(w->at) : NULL;
        if (b)
            w->at = b->addr + b->size;
        return b;
    }
    if (w->step++ > 0)
        return NULL;
    buf_t *b = lookup(q->lo);
    return b ? b : lookup_end(q->lo);
}

unsigned ooc_mem_lookup_word(uintptr_t p, uintptr_t base[2], size_t size[2]) {
    ooc_query_t q = {.lo = p, .hi = p, .use = OOC_USE_RW};
    query_walk_t w = QUERY_WALK(&q);
    unsigned n = 0;
    buf_t *b;
    mem_lock_take();
    while ((b = query_next(&w)) != NULL) {
        base[n] = b->addr;
        size[n++] = b->size;
    }
    mem_unlock();
    return n;
}

CUresult ooc_mem_check_range(const char *call, uintptr_t p, size_t n) {
    if (n == 0 || (!ooc_mem_owns(p) && !ooc_mem_owns(p + n - 1)))
        return CUDA_SUCCESS; /* not ours: the driver checks it */
    uint64_t g = atomic_load_explicit(&free_gen, memory_order_acquire);
    for (unsigned i = 0; i < RANGE_MEMO; i++)
        if (range_memo[i].gen == g && p >= range_memo[i].base && p + n - 1 >= p &&
            p + n - 1 - range_memo[i].base < range_memo[i].size)
            return CUDA_SUCCESS;
    mem_lock_take();
    buf_t *b = p + n - 1 >= p ? lookup(p) : NULL;
    uintptr_t base = b ? b->addr : 0;
    size_t size = b ? b->size : 0;
    g = atomic_load_explicit(&free_gen, memory_order_relaxed);
    mem_unlock();
    if (b && p + n - 1 < base + size) {
        unsigned k = range_memo_next++ % RANGE_MEMO;
        range_memo[k].base = base;
        range_memo[k].size = size;
        range_memo[k].gen = g;
        return CUDA_SUCCESS;
    }
    if (b)
        OOC_LOG_W("%s: the %zu bytes at 0x%llx run past the end of the buffer at 0x%llx (%zu "
                  "bytes): CUDA_ERROR_INVALID_VALUE, nothing done",
                  call, n, (unsigned long long)p, (unsigned long long)base, size);
    else
        OOC_LOG_W("%s: 0x%llx (%zu bytes) is not in a live allocation (freed, or never "
                  "allocated): CUDA_ERROR_INVALID_VALUE, nothing done",
                  call, (unsigned long long)p, n);
    return CUDA_ERROR_INVALID_VALUE;
}

int ooc_mem_bufinfo(uintptr_t p, ooc_bufinfo_t *out) {
    mem_lock_take();
    buf_t *b = lookup(p);
    if (b)
        *out = (ooc_bufinfo_t){b->addr, b->size, b->id, M.ctx, M.dev};
    mem_unlock();
    return b ? 0 : -1;
}

int ooc_mem_lookup(uintptr_t p, uintptr_t *base, size_t *size) {
    mem_lock_take();
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
static void note(ooc_access_t *a, uintptr_t p, size_t n, unsigned use, uint32_t word) {
    for (unsigned i = 0; i < a->n; i++) {
        if (a->refs[i].lo == p && a->refs[i].hi == p + n) {
            unsigned old = a->refs[i].use; /* weak only while every word noting it is */
            a->refs[i].use = ((old | use) & ~OOC_USE_WEAK) | (old & use & OOC_USE_WEAK);
            if (!a->refs[i].word || !(use & OOC_USE_WEAK))
                a->refs[i].word = word ? word : a->refs[i].word;
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
    a->refs[a->n].word = word;
    a->n++;
}

void ooc_mem_note(ooc_access_t *a, uintptr_t p) {
    if (ooc_mem_owns(p) || (p && ooc_mem_owns(p - 1))) /* the latter: an end pointer */
        note(a, p, 0, OOC_USE_RW, 0);
}

void ooc_mem_note_word(ooc_access_t *a, uintptr_t p, uint32_t word, int weak) {
    if (ooc_mem_owns(p) || (p && ooc_mem_owns(p - 1)))
        note(a, p, 0, OOC_USE_RW | (weak ? OOC_USE_WEAK : 0u), word);
}

void ooc_mem_note_range(ooc_access_t *a, uintptr_t p, size_t n, unsigned use) {
    if (ooc_mem_owns(p) && n)
        note(a, p, n, use, 0);
}

/* The indices of the first and last chunk b lies in. */
void buf_span(const buf_t *b, uint64_t *c0, uint64_t *c1) {
    *c0 = (b->addr - M.va_base) >> M.shift;
    *c1 = (b->addr + b->size - 1 - M.va_base) >> M.shift;
}
