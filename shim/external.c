/* SPDX-License-Identifier: MIT */
/* external.c: device memory the program makes itself with the VMM API (cuMemCreate, as
 * NCCL does): counted against the budget, the shim's pool shrunk to make room.
 *
 * Invariants: external_bytes plus the pool (budget_chunks chunks) never exceeds budget_bytes.
 * Locking: the public functions take mem_lock. Callers: the cuMemCreate/cuMemRelease hooks. */
#include "mem_int.h"

#include <stdlib.h>

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
            phys_release(p);
            M.phys_made--;
        }
    }
    return CUDA_SUCCESS;
}

CUresult ooc_mem_external_create(CUmemGenericAllocationHandle *h, size_t size,
                                 const CUmemAllocationProp *prop, unsigned long long flags) {
    mem_lock_take();
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
    mem_lock_take();
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
