/* SPDX-License-Identifier: MIT */
/* warm.c: freed buffers' memory kept mapped at its addresses and handed to the next allocations,
 * stream-ordered (OOC_REUSE, on by default).
 *
 * Why: on the real driver a mapping costs about the same whatever its size, and the cost is per
 * mapping, not per call (measured on an H200, driver 580, per 2 MiB chunk: cuMemMap 1 us,
 * cuMemSetAccess 27-29 us, cuMemUnmap 17-19 us; profiles/gpu/h200/first-contact). A framework
 * without its caching allocator (PyTorch with PYTORCH_NO_CUDA_MEMORY_CACHING=1, which the shim
 * sets) frees and allocates the same sizes every iteration: mapping each chunk at first use and
 * unmapping it at death cost ResNet-50 about half a second per iteration with nothing to swap.
 * And the framework's thread runs ahead of the GPU: memory freed a moment ago is still in use by
 * queued work, so waiting for it before reuse would make the thread wait for the GPU.
 *
 * A warm run is the chunk run of a large buffer all of whose chunks were resident when it was
 * freed (warm_free). Its physical chunks stay mapped at its addresses, its addresses stay taken,
 * and its chunk objects go at once: each chunk of the run keeps a reference to an event after
 * the work of every stream that may have used the buffer (its users, the free's stream, in safe
 * mode every stream that issued since it was mapped). The next allocation whose stable address
 * (buffer.c) falls on a run takes the warm chunks there (warm_take_at; what lies outside stays a
 * run in its place); with no stable addresses (a reservation too small to split), the next
 * allocation of at most as many chunks takes the smallest run that fits (warm_take). Either way
 * with no driver call: its chunks are resident from the start, with that event as the copy they
 * wait for (in_ev), so every op that uses them waits for it on its own stream, on the GPU, and
 * the program's thread never does. Runs next to each other in the address space are joined.
 * need_phys gives the oldest runs back (waiting for their events, then unmapping; addresses to
 * the quarantine, or, for a stable address, to nobody: its buffer's free gave it back) before
 * it evicts anything live.
 *
 * Trade-off: a freed buffer's address keeps working memory until its run is reused or given back,
 * so a use after free reads stale bytes instead of faulting (as under a caching allocator).
 * OOC_REUSE=0 keeps the strict behaviour: every freed chunk is unmapped.
 *
 * Invariants: a warm chunk has no chunk object; M.warm_chunks counts the physical chunks held by
 * runs, M.resident those of chunk objects, both in the resident-bytes gauge, and
 * M.resident + M.warm_chunks <= M.phys_made. M.warm is in age order, oldest first. Locking:
 * caller holds mem_lock. Callers: buffer.c (warm_free, warm_take), resident.c and worker.c
 * (warm_ready, warm_release), mem.c (warm_shutdown). */
#include "mem_int.h"

#include <stdlib.h>
#include <string.h>

static warm_t *run_new(uint64_t first, uint64_t n) {
    warm_t *w = calloc(1, sizeof *w + n * sizeof w->c[0]);
    if (w) {
        w->first = first;
        w->n = n;
    }
    return w;
}

static void warm_remove(const warm_t *w) {
    for (size_t i = 0; i < M.nwarm; i++) {
        if (M.warm[i] == w) {
            memmove(&M.warm[i], &M.warm[i + 1], (M.nwarm - i - 1) * sizeof *M.warm);
            M.nwarm--;
            return;
        }
    }
}

/* The run's last chunk c, whose work (c->ev) may still run, hands its memory on now
 * (give_back_last): the event that whatever reaches the memory next must wait for (a reference
 * for the caller: c's work, and an older hand-over's still pending), or NULL when it cannot (then
 * the caller waits on the host). In safe mode every op from here waits for it (fill_join). */
static evref_t *hand_on_early(wchunk_t *c) {
    evref_t *older = phys_pending(c->phys);
    if (grow(&M.wlate, &M.cap_wlate, M.nwlate + 1, sizeof *M.wlate) != 0)
        return NULL;
    evref_t *v = older ? ev_join(older, c->ev) : c->ev;
    if (v == c->ev)
        v->refs++;
    if (v && M.safe && fill_join(FILL_HANDOVER, v) != CUDA_SUCCESS) {
        ev_drop(v);
        v = NULL;
    }
    return v;
}

/* Gives the run's last chunk's physical chunk to the pool and its address to the quarantine; the
 * run shrinks by one. The work that may still use the chunk (its event) is waited for on the
 * host with `wait`; without, when that work still runs, the memory goes on at once in stream
 * order: whatever reaches it through another address waits for the event on the device (p->after:
 * phys_ordered for the shim's copies, map_phys's in_ev for the ops that name the chunk mapped
 * there, fill_join in safe mode for every op), and the old address stays mapped to it until the
 * event is done (M.wlate, warm_late_reap): the framework's thread runs ahead of the device, and
 * waiting here for memory freed a moment ago made it wait for the device. */
static CUresult give_back_last(warm_t *w, int wait) {
    wchunk_t *c = &w->c[w->n - 1];
    uint64_t idx = w->first + w->n - 1;
    evref_t *after = c->ev && !ev_done(c->ev) && !wait ? hand_on_early(c) : NULL;
    if (after) {
        ev_drop(c->phys->after);
        c->phys->after = after;
        M.wlate[M.nwlate++] = (wlate_t){idx, c->ev}; /* takes c's reference */
        ooc_stats_add(OOC_STAT_warm_handed_early, 1);
    } else {
        if (c->ev && !ev_done(c->ev)) {
            CUresult r = sync_event(c->ev->e);
            if (r != CUDA_SUCCESS)
                return r;
        }
        CUresult r = vmm_unmap(idx_addr(idx));
        if (r != CUDA_SUCCESS)
            return r;
        ev_drop(c->ev);
        va_give(idx, 1);
    }
    c->phys->next = M.phys_free;
    M.phys_free = c->phys;
    *c = (wchunk_t){NULL, NULL};
    M.warm_chunks--;
    ooc_stats_gauge_sub(OOC_STAT_resident_bytes, M.chunk);
    w->n--;
    return CUDA_SUCCESS;
}

/* The addresses whose memory went on early (give_back_last) and whose work is done (with
 * `block`, all: waited for) are unmapped and go to the quarantine. CUDA_SUCCESS, or the first
 * failure (that address stays listed). Caller holds mem_lock. */
CUresult warm_late_reap(int block) {
    CUresult first = CUDA_SUCCESS;
    size_t k = 0;
    for (size_t i = 0; i < M.nwlate; i++) {
        wlate_t l = M.wlate[i];
        CUresult r = ev_done(l.ev) ? CUDA_SUCCESS
                     : block       ? sync_event(l.ev->e)
                                   : CUDA_ERROR_NOT_READY;
        if (r == CUDA_SUCCESS)
            r = vmm_unmap(idx_addr(l.idx));
        if (r == CUDA_SUCCESS) {
            va_give(l.idx, 1);
            ev_drop(l.ev);
            continue;
        }
        if (r != CUDA_ERROR_NOT_READY && first == CUDA_SUCCESS)
            first = r;
        M.wlate[k++] = l;
    }
    M.nwlate = k;
    return first;
}

/* Gives back every chunk of a run, and the run; a failure is logged unless `quiet` (at exit,
 * when the driver may already refuse everything). */
static CUresult drop_run(warm_t *w, int quiet) {
    while (w->n) {
        CUresult r = give_back_last(w, 1);
        if (r != CUDA_SUCCESS) {
            if (!quiet)
                OOC_LOG_W("cuMemUnmap of a freed chunk at %#llx failed: %s",
                          (unsigned long long)idx_addr(w->first + w->n - 1), ooc_real_errname(r));
            return r;
        }
    }
    warm_remove(w);
    free(w);
    return CUDA_SUCCESS;
}

/* Joins w with the runs right before and after it in the address space (pieces of one run split
 * by warm_take, freed again), so that a larger buffer finds them whole. The joined run takes
 * w's place in the age order. */
static void coalesce(warm_t *w) {
    for (int again = 1; again;) {
        again = 0;
        for (size_t i = 0; i < M.nwarm; i++) {
            warm_t *r = M.warm[i];
            if (r == w || (r->first + r->n != w->first && w->first + w->n != r->first))
                continue;
            warm_t *lo = r->first < w->first ? r : w, *hi = lo == r ? w : r;
            warm_t *j = run_new(lo->first, lo->n + hi->n);
            if (!j)
                return; /* they stay apart */
            memcpy(j->c, lo->c, lo->n * sizeof j->c[0]);
            memcpy(j->c + lo->n, hi->c, hi->n * sizeof j->c[0]);
            for (size_t k = 0; k < M.nwarm; k++)
                if (M.warm[k] == w)
                    M.warm[k] = j;
            warm_remove(r);
            free(r);
            free(w);
            w = j;
            again = 1;
            break;
        }
    }
}

/* An event after the work of `users` and the copies `in` (n of them, NULL entries skipped), or
 * NULL with *none set when there is nothing to wait for. Several are joined on M.join, a stream
 * of the shim's own. NULL without *none: out of events, or a driver error. */
static evref_t *join(const CUstream *users, unsigned nu, chunk_t *const *in, size_t n, int *none) {
    size_t nin = 0;
    for (size_t i = 0; i < n; i++)
        nin += in[i]->in_ev != NULL;
    *none = nu == 0 && nin == 0;
    if (*none)
        return NULL;
    if (nu == 1 && nin == 0)
        return fence_ev(users[0]);
    if (!join_stream())
        return NULL;
    CUresult r = CUDA_SUCCESS;
    for (unsigned u = 0; u < nu && r == CUDA_SUCCESS; u++) {
        evref_t *v = fence_ev(users[u]);
        r = v ? ooc_real.cuStreamWaitEvent(M.join, v->e, 0) : CUDA_ERROR_OUT_OF_MEMORY;
        ev_drop(v);
    }
    for (size_t i = 0; i < n && r == CUDA_SUCCESS; i++)
        if (in[i]->in_ev)
            r = ooc_real.cuStreamWaitEvent(M.join, in[i]->in_ev->e, 0);
    evref_t *v = r == CUDA_SUCCESS ? ev_take() : NULL;
    if (v && ooc_real.cuEventRecord(v->e, M.join) != CUDA_SUCCESS) {
        ev_drop(v);
        v = NULL;
    }
    return v;
}

/* The large buffer at chunks [first, first + n), all resident, not retiring, is freed (on
 * stream fs, or NULL): it becomes a warm run. 0, or -1 when it cannot (OOC_REUSE=0, a user
 * that cannot be named, no memory): the caller then releases its chunks as usual. */
int warm_free(uint64_t first, uint64_t n, CUstream fs) {
    if (!M.reuse || grow(&M.warm, &M.cap_warm, M.nwarm + 1, sizeof *M.warm) != 0)
        return -1;
    chunk_t **cs = malloc(n * sizeof *cs);
    warm_t *w = run_new(first, n);
    if (!cs || !w) {
        free(cs);
        free(w);
        return -1;
    }
    for (uint64_t i = 0; i < n; i++)
        cs[i] = chunk_find(first + i);
    CUstream users[MAX_USERS + MAX_STREAMS + 1];
    unsigned nu = 0;
    int none = 0, unknown = gather_streams(cs, n, users, &nu);
    if (fs)
        add_user(users, &nu, &unknown, fs);
    evref_t *ev = unknown ? NULL : join(users, nu, cs, n, &none);
    if (!ev && !none) {
        free(cs);
        free(w);
        return -1;
    }
    for (uint64_t i = 0; i < n; i++) {
        chunk_t *c = cs[i];
        lru_remove(c);
        atomic_store_explicit(&c->ext_n, 0, memory_order_relaxed);
        ev_drop(c->in_ev); /* the event covers its copy */
        c->in_ev = NULL;
        host_slot_put(c->host);
        c->host = NULL;
        if (ev && i > 0)
            ev->refs++;
        w->c[i] = (wchunk_t){c->phys, ev};
        c->phys = NULL;
        c->state = C_EMPTY;
        M.resident--;
        M.warm_chunks++;
        chunk_delete(c);
    }
    free(cs);
    M.warm[M.nwarm++] = w;
    coalesce(w);
    return 0;
}

/* A run of n chunks, taken out of the list, or NULL: the smallest of at least n chunks (the
 * newest of those), its first n chunks when it has more (the rest stays, a run of its own, in
 * its place). Its physical chunks and event references are still counted in M.warm_chunks: the
 * caller moves them to its new chunks (or calls warm_untake). */
warm_t *warm_take(uint64_t n) {
    size_t best = M.nwarm;
    for (size_t i = M.nwarm; i-- > 0;) {
        const warm_t *w = M.warm[i];
        if (w->n >= n && (best == M.nwarm || w->n < M.warm[best]->n))
            best = i;
    }
    if (best == M.nwarm)
        return NULL;
    warm_t *w = M.warm[best];
    if (w->n > n) {
        warm_t *rest = run_new(w->first + n, w->n - n);
        if (!rest)
            return NULL;
        memcpy(rest->c, w->c + n, rest->n * sizeof rest->c[0]);
        w->n = n;
        M.warm[best] = rest;
        return w;
    }
    memmove(&M.warm[best], &M.warm[best + 1], (M.nwarm - best - 1) * sizeof *M.warm);
    M.nwarm--;
    return w;
}

/* The warm chunks in [first, first + n), taken out of their runs, as *out: a run of n chunks
 * whose entries are the physical chunks and events there, NULL where no warm chunk is (*out is
 * NULL when none is). A run that reaches beyond the range keeps its chunks outside it, in its
 * place in the age order. The taken physical chunks are still counted in M.warm_chunks (as by
 * warm_take). 0, or -1 with nothing changed (no memory). buffer.c's stable addresses. */
int warm_take_at(uint64_t first, uint64_t n, warm_t **out) {
    *out = NULL;
    uint64_t end = first + n;
    size_t nsplit = 0, noverlap = 0;
    for (size_t i = 0; i < M.nwarm; i++) {
        const warm_t *r = M.warm[i];
        if (r->first < end && first < r->first + r->n) {
            noverlap++;
            nsplit += r->first < first && r->first + r->n > end; /* a piece on either side */
        }
    }
    if (!noverlap) /* the common case under pressure: nothing to take, nothing allocated */
        return 0;
    warm_t *w = run_new(first, n);
    warm_t **right = nsplit ? calloc(nsplit, sizeof *right) : NULL;
    int fail = !w || (nsplit && !right) ||
               grow(&M.warm, &M.cap_warm, M.nwarm + nsplit, sizeof *M.warm) != 0;
    for (size_t k = 0, i = 0; !fail && i < M.nwarm; i++) {
        const warm_t *r = M.warm[i];
        if (r->first < first && r->first + r->n > end)
            fail = (right[k++] = run_new(end, r->first + r->n - end)) == NULL;
    }
    if (fail) {
        for (size_t k = 0; right && k < nsplit; k++)
            free(right[k]);
        free(right);
        free(w);
        return -1;
    }
    size_t k = 0;
    for (size_t i = 0; i < M.nwarm;) {
        warm_t *r = M.warm[i];
        uint64_t rend = r->first + r->n;
        if (r->first >= end || rend <= first) {
            i++;
            continue;
        }
        uint64_t lo = r->first > first ? r->first : first, hi = rend < end ? rend : end;
        memcpy(&w->c[lo - first], &r->c[lo - r->first], (hi - lo) * sizeof w->c[0]);
        warm_t *tail = NULL; /* the piece after the range, in r's place after r */
        if (rend > end && r->first < first) {
            tail = right[k++];
        } else if (rend > end) { /* nothing before the range: r becomes that piece */
            memmove(&r->c[0], &r->c[end - r->first], (rend - end) * sizeof r->c[0]);
            r->first = end;
            r->n = rend - end;
            i++;
            continue;
        }
        if (tail)
            memcpy(tail->c, &r->c[end - r->first], tail->n * sizeof tail->c[0]);
        r->n = lo - r->first; /* what stays before the range */
        if (r->n == 0) {
            memmove(&M.warm[i], &M.warm[i + 1], (M.nwarm - i - 1) * sizeof *M.warm);
            M.nwarm--;
            free(r);
            continue;
        }
        if (tail) {
            memmove(&M.warm[i + 2], &M.warm[i + 1], (M.nwarm - i - 1) * sizeof *M.warm);
            M.warm[i + 1] = tail;
            M.nwarm++;
            i += 2;
            continue;
        }
        i++;
    }
    free(right);
    *out = w;
    return 0;
}

/* Whether the address of chunk idx went on early (give_back_last) and is still mapped. */
int warm_late_at(uint64_t idx) {
    for (size_t i = 0; i < M.nwlate; i++)
        if (M.wlate[i].idx == idx)
            return 1;
    return 0;
}

/* A taken run that could not be used goes back, as the newest; with entries that have no
 * physical chunk (warm_take_at's), or with no room in the list, its physical chunks go back to
 * the pool instead. */
void warm_untake(warm_t *w) {
    int holes = 0;
    for (uint64_t i = 0; i < w->n; i++)
        holes |= !w->c[i].phys;
    if (!holes && grow(&M.warm, &M.cap_warm, M.nwarm + 1, sizeof *M.warm) == 0) {
        M.warm[M.nwarm++] = w;
        return;
    }
    while (w->n) {
        if (!w->c[w->n - 1].phys) {
            w->n--;
            continue;
        }
        CUresult r = give_back_last(w, 1);
        if (r != CUDA_SUCCESS) {
            OOC_LOG_W("cuMemUnmap of a freed chunk at %#llx failed: %s",
                      (unsigned long long)idx_addr(w->first + w->n - 1), ooc_real_errname(r));
            break;
        }
    }
    free(w);
}

int warm_ready(void) {
    return M.nwarm > 0;
}

/* Gives up to `want` chunks (at least one) back to the pool, from the end of the oldest run: a
 * long run (joined from many freed buffers) is not unmapped whole for one chunk's sake.
 * CUDA_SUCCESS when they were (or there is no run). */
CUresult warm_release(uint64_t want) {
    if (!M.nwarm)
        return CUDA_SUCCESS;
    if (M.safe)
        quiesce(); /* no fast-path op is in flight while its memory goes */
    warm_t *w = M.warm[0];
    (void)warm_late_reap(0);
    for (uint64_t k = 0; w->n && k < (want ? want : 1); k++) {
        CUresult r = give_back_last(w, 0);
        if (r != CUDA_SUCCESS) {
            OOC_LOG_W("cuMemUnmap of a freed chunk at %#llx failed: %s",
                      (unsigned long long)idx_addr(w->first + w->n - 1), ooc_real_errname(r));
            return r;
        }
    }
    if (!w->n) {
        warm_remove(w);
        free(w);
    }
    return CUDA_SUCCESS;
}

/* At shutdown: every held chunk unmapped and back in the pool, every run freed. */
void warm_shutdown(void) {
    CUresult r = warm_late_reap(1);
    /* A framework's runtime may have torn the context down before the shim's exit handler ran
     * (on an H200 with PyTorch every run left 33-407 such chunks): the driver has let go of
     * the mappings itself, so that is no news. Any other failure is. */
    if (r == CUDA_ERROR_DEINITIALIZED || r == CUDA_ERROR_CONTEXT_IS_DESTROYED ||
        r == CUDA_ERROR_INVALID_CONTEXT)
        OOC_LOG_D("%zu freed chunks' addresses not unmapped at exit: %s", M.nwlate,
                  ooc_real_errname(r));
    else if (r != CUDA_SUCCESS)
        OOC_LOG_W("%zu freed chunks' addresses could not be unmapped at exit: %s", M.nwlate,
                  ooc_real_errname(r));
    for (size_t i = 0; i < M.nwlate; i++)
        ev_drop(M.wlate[i].ev);
    free(M.wlate);
    M.wlate = NULL;
    M.nwlate = M.cap_wlate = 0;
    while (M.nwarm) {
        warm_t *w = M.warm[M.nwarm - 1];
        if (drop_run(w, 1) != CUDA_SUCCESS) {
            /* After a sticky device error nothing can be unmapped: free our side anyway. */
            for (uint64_t i = 0; i < w->n; i++) {
                ev_drop(w->c[i].ev);
                phys_release(w->c[i].phys);
                M.phys_made--;
                M.warm_chunks--;
            }
            warm_remove(w);
            free(w);
        }
    }
    free(M.warm);
    M.warm = NULL;
    M.cap_warm = 0;
    if (M.join)
        ooc_real.cuStreamDestroy_v2(M.join);
    M.join = NULL;
}
