/* SPDX-License-Identifier: MIT */
/* warm.c: freed buffers' memory kept mapped at its addresses for the next allocation of the same
 * number of chunks (OOC_REUSE, on by default).
 *
 * Why: on the real driver a mapping costs about the same whatever its size, and the cost is per
 * mapping, not per call (measured on an H200, driver 580, per 2 MiB chunk: cuMemMap 1 us,
 * cuMemSetAccess 27-29 us, cuMemUnmap 17-19 us; profiles/gpu/h200/first-contact). A framework
 * without its caching allocator (PyTorch with PYTORCH_NO_CUDA_MEMORY_CACHING=1, which the shim
 * sets) frees and allocates the same sizes every iteration: mapping each chunk at first use and
 * unmapping it at death cost ResNet-50 about half a second per iteration with nothing to swap.
 *
 * A warm run is the chunk run of a large buffer all of whose chunks were resident when it was
 * freed. Its chunks die as any others (retire.c); when one is buried, its physical chunk stays
 * mapped at its address and is held by the run (warm_keep), and the run's addresses stay taken.
 * Once all are buried the run is ready: ooc_mem_alloc hands it to the next buffer of the same
 * chunk count (warm_take), resident from the start, with no driver call. need_phys gives the
 * oldest ready runs back (unmap, addresses to the quarantine) before it evicts anything live.
 *
 * Trade-off: a freed buffer's address keeps working memory until its run is reused or given back,
 * so a use after free reads stale bytes instead of faulting (as under a caching allocator).
 * OOC_REUSE=0 keeps the strict behaviour: every freed chunk is unmapped.
 *
 * Invariants: a warm chunk has no chunk object; M.warm_chunks counts the physical chunks held by
 * runs (pending or ready), M.resident those of chunk objects, and both are in the resident-bytes
 * gauge; M.resident + M.warm_chunks <= M.phys_made. Locking: caller holds mem_lock. Callers:
 * buffer.c (warm_begin at free, warm_take at allocation), retire.c (warm_keep), resident.c and
 * worker.c (warm_ready, warm_release), mem.c (warm_shutdown). */
#include "mem_int.h"

#include <stdlib.h>
#include <string.h>

/* A pending run for the large buffer at chunks [first, first + n), or NULL (no room, or
 * OOC_REUSE=0): its chunks are then buried as usual. */
warm_t *warm_begin(uint64_t first, uint64_t n) {
    if (!M.reuse || grow(&M.warm, &M.cap_warm, M.nwarm + 1, sizeof *M.warm) != 0)
        return NULL;
    warm_t *w = calloc(1, sizeof *w + n * sizeof w->phys[0]);
    if (!w)
        return NULL;
    w->first = first;
    w->n = n;
    w->left = n;
    M.warm[M.nwarm++] = w;
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

/* Unmaps the run's last held chunk and gives its physical chunk to the pool and its address to
 * the quarantine; the run shrinks by one. */
static CUresult give_back_last(warm_t *w) {
    uint64_t i = w->n - 1;
    if (w->phys[i]) {
        CUresult r = vmm_unmap(M.va_base + ((uintptr_t)(w->first + i) << M.shift));
        if (r != CUDA_SUCCESS)
            return r;
        w->phys[i]->next = M.phys_free;
        M.phys_free = w->phys[i];
        w->phys[i] = NULL;
        M.warm_chunks--;
        ooc_stats_gauge_sub(OOC_STAT_resident_bytes, M.chunk);
        va_give(w->first + i, 1);
    }
    /* A chunk buried the usual way (broken run) gave its own address back. */
    w->n--;
    return CUDA_SUCCESS;
}

/* Gives back every chunk of a run, and the run; a failure is logged unless `quiet` (at exit,
 * when the driver may already refuse everything). */
static CUresult drop_run(warm_t *w, int quiet) {
    while (w->n) {
        CUresult r = give_back_last(w);
        if (r != CUDA_SUCCESS) {
            if (!quiet)
                OOC_LOG_W(
                    "cuMemUnmap of a freed chunk at %#llx failed: %s",
                    (unsigned long long)(M.va_base + ((uintptr_t)(w->first + w->n - 1) << M.shift)),
                    ooc_real_errname(r));
            return r;
        }
    }
    warm_remove(w);
    free(w);
    return CUDA_SUCCESS;
}

/* Joins a run that just became ready with the ready runs right before and after it in the
 * address space (pieces of one run split by warm_take, freed again), so that a larger buffer
 * finds them whole. The joined run takes w's place in the age order. */
static void coalesce(warm_t *w) {
    for (int again = 1; again;) {
        again = 0;
        for (size_t i = 0; i < M.nwarm; i++) {
            warm_t *r = M.warm[i];
            if (r == w || r->left || (r->first + r->n != w->first && w->first + w->n != r->first))
                continue;
            warm_t *lo = r->first < w->first ? r : w, *hi = lo == r ? w : r;
            warm_t *j = malloc(sizeof *j + (lo->n + hi->n) * sizeof j->phys[0]);
            if (!j)
                return; /* they stay apart */
            *j = *lo;
            memcpy(j->phys, lo->phys, lo->n * sizeof j->phys[0]);
            memcpy(j->phys + lo->n, hi->phys, hi->n * sizeof j->phys[0]);
            j->n = lo->n + hi->n;
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

/* A dying chunk of a run is buried: the run keeps its physical chunk, mapped (0; the caller
 * deletes the chunk object and keeps its address), or, when it is not resident, the run is
 * broken (-1: the caller buries it as usual; the run gives its other chunks back once the last
 * is buried). Its users are done. */
int warm_keep(chunk_t *c) {
    warm_t *w = c->run;
    c->run = NULL;
    int keep = !w->broken && c->state == C_RESIDENT && !c->aliased;
    if (keep) {
        cool(c);
        w->phys[c->idx - w->first] = c->phys;
        c->phys = NULL;
        c->state = C_EMPTY;
        M.resident--;
        M.warm_chunks++;
        ev_drop(c->in_ev);
        c->in_ev = NULL;
    } else {
        w->broken = 1;
    }
    if (--w->left == 0 && w->broken)
        (void)drop_run(w, 0);
    else if (w->left == 0)
        coalesce(w);
    return keep ? 0 : -1;
}

/* A ready run of n chunks, taken out of the list, or NULL: the smallest of at least n chunks
 * (the newest of those), its first n chunks when it has more (the rest stays, a run of its own,
 * in its place). Its physical chunks are still counted in M.warm_chunks: the caller moves them to
 * its new chunks (or calls warm_untake). */
warm_t *warm_take(uint64_t n) {
    size_t best = M.nwarm;
    for (size_t i = M.nwarm; i-- > 0;) {
        const warm_t *w = M.warm[i];
        if (w->left == 0 && w->n >= n && (best == M.nwarm || w->n < M.warm[best]->n))
            best = i;
    }
    if (best == M.nwarm)
        return NULL;
    warm_t *w = M.warm[best];
    if (w->n > n) {
        warm_t *rest = malloc(sizeof *rest + (w->n - n) * sizeof rest->phys[0]);
        if (!rest)
            return NULL;
        *rest = *w;
        rest->first = w->first + n;
        rest->n = w->n - n;
        memcpy(rest->phys, w->phys + n, rest->n * sizeof rest->phys[0]);
        w->n = n;
        M.warm[best] = rest;
        return w;
    }
    memmove(&M.warm[best], &M.warm[best + 1], (M.nwarm - best - 1) * sizeof *M.warm);
    M.nwarm--;
    return w;
}

/* Is a run of at least n chunks pending (some of its chunks still dying)? */
int warm_pending(uint64_t n) {
    for (size_t i = M.nwarm; i-- > 0;)
        if (M.warm[i]->left && M.warm[i]->n >= n && !M.warm[i]->broken)
            return 1;
    return 0;
}

/* A taken run that could not be used goes back, as the newest (or, with no room in the list,
 * to the pool). */
void warm_untake(warm_t *w) {
    if (grow(&M.warm, &M.cap_warm, M.nwarm + 1, sizeof *M.warm) == 0)
        M.warm[M.nwarm++] = w;
    else
        (void)drop_run(w, 0);
}

int warm_ready(void) {
    for (size_t i = 0; i < M.nwarm; i++)
        if (M.warm[i]->left == 0)
            return 1;
    return 0;
}

/* Gives the oldest ready run back to the pool. CUDA_SUCCESS when one was (or none is ready). */
CUresult warm_release(void) {
    for (size_t i = 0; i < M.nwarm; i++) {
        warm_t *w = M.warm[i];
        if (w->left == 0) {
            if (M.safe)
                quiesce(); /* no fast-path op is in flight while its memory goes */
            return drop_run(w, 0);
        }
    }
    return CUDA_SUCCESS;
}

/* At shutdown: every held chunk unmapped and back in the pool, every run freed (the chunks of
 * pending runs that are still dying are the caller's). */
void warm_shutdown(void) {
    while (M.nwarm) {
        warm_t *w = M.warm[M.nwarm - 1];
        w->left = 0;
        if (drop_run(w, 1) != CUDA_SUCCESS) {
            /* After a sticky device error nothing can be unmapped: free our side anyway. */
            for (uint64_t i = 0; i < w->n; i++) {
                if (w->phys[i]) {
                    ooc_real.cuMemRelease(w->phys[i]->h);
                    free(w->phys[i]);
                    M.phys_made--;
                    M.warm_chunks--;
                }
            }
            warm_remove(w);
            free(w);
        }
    }
    free(M.warm);
    M.warm = NULL;
    M.cap_warm = 0;
}
