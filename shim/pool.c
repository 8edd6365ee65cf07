/* SPDX-License-Identifier: MIT */
/* pool.c: pooled resources of the residency layer: events with reference counts, pinned host
 * slots (one chunk each, in blocks) and the host slots a copy still uses (limbo).
 *
 * Invariants: an event is back in the pool only when its last reference is dropped; a host slot
 * is in exactly one place: the free list, a chunk (c->host) or limbo (until its copy's event has
 * completed). Nothing is released before shutdown (host_blocks_free). Locking: caller holds
 * mem_lock. Callers: the other memory files. */
#include "mem_int.h"

#include <stdlib.h>
#include <string.h>

/* An event from the pool with one reference; NULL when none can be made. Caller holds mem_lock
 * (or is the only thread, at shutdown). */
evref_t *ev_take(void) {
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
    v->done = 0;
    v->next = NULL;
    return v;
}

void ev_drop(evref_t *v) {
    if (v && --v->refs == 0) {
        v->next = M.ev_free;
        M.ev_free = v;
    }
}

/* Has the event's work completed? (Non-blocking; an error counts as done: the sticky error
 * surfaces to the program on its own calls.) */
/* Has v's work completed? A completed event is remembered: many dying chunks share one fence
 * event, and on a real driver each query is a call into it. */
int ev_done(evref_t *v) {
    if (v->done)
        return 1;
    ooc_stats_add(OOC_STAT_event_queries, 1);
    v->done = ooc_real.cuEventQuery(v->e) != CUDA_ERROR_NOT_READY;
    return v->done;
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

/* Takes a host slot from the pool (first taking back those whose copies are done), growing it by
 * a block when empty; NULL when the host (or the driver) has no more pinned memory. Caller holds
 * mem_lock. */
hslot_t *host_slot(void) {
    if (!M.host_free && M.nlimbo)
        limbo_poll();
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
        ooc_stats_gauge_add(OOC_STAT_host_pool_bytes, HOST_BLOCK_CHUNKS * M.chunk);
        for (size_t i = 0; i < HOST_BLOCK_CHUNKS; i++) {
            slots[i].next = M.host_free;
            M.host_free = &slots[i];
        }
    }
    hslot_t *s = M.host_free;
    M.host_free = s->next;
    s->next = NULL;
    ooc_stats_gauge_add(OOC_STAT_host_slot_bytes, M.chunk);
    return s;
}

void host_slot_put(hslot_t *s) {
    if (s) {
        s->next = M.host_free;
        M.host_free = s;
        ooc_stats_gauge_sub(OOC_STAT_host_slot_bytes, M.chunk);
    }
}

/* Rounding of chunk_used: a whole page past a buffer's last byte moves with it. */
#define USED_ROUND 4096u

uint64_t chunk_used(const chunk_t *c) {
    const buf_t *b = c->owner;
    uintptr_t a = chunk_addr(c);
    if (!b || c->nbufs != 1 || b->addr > a || b->addr + b->size <= a)
        return M.chunk;
    uint64_t left = b->addr + b->size - a;
    left = (left + USED_ROUND - 1) / USED_ROUND * USED_ROUND;
    return left < M.chunk ? left : M.chunk;
}

/* The event whatever reaches physical chunk p (may be NULL) must still wait for (p->after: a
 * remap off its last owner's address behind a gate, or work on a freed buffer that handed it on
 * early), or NULL when there is none or it has completed (then dropped). */
evref_t *phys_pending(phys_t *p) {
    if (p && p->after && ev_done(p->after)) {
        ev_drop(p->after);
        p->after = NULL;
    }
    return p ? p->after : NULL;
}

/* Orders stream st after what physical chunk p (may be NULL) must still wait for
 * (phys_pending). */
CUresult phys_ordered(phys_t *p, CUstream st) {
    evref_t *v = phys_pending(p);
    return v ? ooc_real.cuStreamWaitEvent(st, v->e, 0) : CUDA_SUCCESS;
}

/* Copies a chunk's bytes (chunk_used) between the device and its host slot on stream st (not
 * waited for), after any remap still to come off its memory (phys_ordered). */
CUresult copy_out(chunk_t *c, CUstream st) {
    uint64_t n = chunk_used(c);
    CUresult r = phys_ordered(c->phys, st);
    if (r != CUDA_SUCCESS)
        return r;
    if (M.safe)
        return ooc_real.cuMemcpyDtoDAsync_v2(c->host->va, chunk_addr(c), n, st);
    return ooc_real.cuMemcpyDtoHAsync_v2(c->host->p, chunk_addr(c), n, st);
}

/* The copy of c's host slot to device address dst (c's own, or a staging address: stage.c). */
CUresult copy_in_at(chunk_t *c, CUdeviceptr dst, CUstream st) {
    uint64_t n = chunk_used(c);
    if (M.safe)
        return ooc_real.cuMemcpyDtoDAsync_v2(dst, c->host->va, n, st);
    return ooc_real.cuMemcpyHtoDAsync_v2(dst, c->host->p, n, st);
}

CUresult copy_in(chunk_t *c, CUstream st) {
    CUresult r = phys_ordered(c->phys, st);
    return r != CUDA_SUCCESS ? r : copy_in_at(c, chunk_addr(c), st);
}

/* Frees every host block; at shutdown, after every alias is unmapped. */
void host_blocks_free(void) {
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

/* ---- host slots in flight (limbo) ----------------------------------------------------------- */

/* Keeps slot s out of the pool until ev's copy is done (takes a reference on ev). The slots in
 * limbo go back when the pool runs dry (host_slot) and, every LIMBO_POLL puts, here: in demand
 * mode nothing else polls them, and each swap-in's slot stayed out of the pool until exit (on an
 * H100, ResNet-50 at batch 256 held 13 GiB more host memory per iteration and was killed). */
#define LIMBO_POLL 64
void limbo_put(hslot_t *s, evref_t *ev) {
    if (!s)
        return;
    if (M.nlimbo && M.nlimbo % LIMBO_POLL == 0)
        limbo_poll();
    if (grow(&M.limbo, &M.cap_limbo, M.nlimbo + 1, sizeof *M.limbo) != 0) {
        sync_event(ev->e); /* no room to defer: wait for the copy now */
        host_slot_put(s);
        return;
    }
    ev->refs++;
    M.limbo[M.nlimbo++] = (limbo_t){s, ev};
}

/* Returns to the pool the slots whose copies are done. */
void limbo_poll(void) {
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
