/* SPDX-License-Identifier: MIT */
/* vmm.c: the address space and the chunk table: VA runs with a quarantine, chunk objects,
 * mapping and unmapping them, safe-mode host aliases, the pool of physical chunks.
 *
 * Invariants: buffers never move; a freed run goes through a quarantine of QUARANTINE_RUNS runs
 * before reuse (a use after free faults), and leaves it coalesced with its free neighbours. A
 * chunk object is in the hash (M.chunks) and in the fast path's table (M.table) from chunk_new to
 * chunk_delete, and is freed only in a writer section (the graveyard waits for one). A RESIDENT
 * chunk is mapped read-write to its physical chunk (the LRU of resident live chunks is lru.c's).
 * Locking: caller holds mem_lock. Callers: the other memory files. */
#include "mem_int.h"

#include <stdlib.h>
#include <string.h>

int oom_flag;

/* ---- the driver's mapping calls, counted and timed (OOC_STATS) ------------------------------ */

/* Counts `calls` mapping calls that started at t0, and their time (also as the program's, off the
 * replay worker: time the program's thread does not issue work). */
static void vmm_count(unsigned calls, uint64_t t0) {
    uint64_t dt = mem_clock_ns() - t0;
    ooc_stats_add(OOC_STAT_vmm_calls, calls);
    ooc_stats_add(OOC_STAT_vmm_ns, dt);
    if (!mem_is_worker())
        ooc_stats_add(OOC_STAT_vmm_prog_ns, dt);
}

/* Unmaps the chunk-sized mapping at a. */
CUresult vmm_unmap(CUdeviceptr a) {
    gate_settle(a); /* a remap behind the device still to come there comes first */
    uint64_t t0 = mem_clock_ns();
    CUresult r = ooc_real.cuMemUnmap(a, M.chunk);
    vmm_count(1, t0);
    return r;
}

/* Unmaps the n chunk-sized mappings from a with one call: the driver's cuMemUnmap may cover
 * several adjacent mappings, whole (CUDA Driver API, Virtual Memory Management). One call where
 * there were n: on the simulated device each unmap of a populated host mapping costs a TLB
 * shootdown on every core running the process (about 50-60 us on this project's machines,
 * whatever its size), and the real driver's call costs 17-19 us (profiles/gpu/h200). */
CUresult vmm_unmap_run(CUdeviceptr a, uint64_t n) {
    for (uint64_t i = 0; i < n; i++)
        gate_settle(a + i * M.chunk);
    uint64_t t0 = mem_clock_ns();
    CUresult r = ooc_real.cuMemUnmap(a, n * M.chunk);
    vmm_count(1, t0);
    return r;
}

/* Maps h (one chunk) at a, read-write for the device; nothing stays mapped on failure. */
CUresult vmm_map_rw(CUdeviceptr a, CUmemGenericAllocationHandle h) {
    gate_settle(a);
    uint64_t t0 = mem_clock_ns();
    unsigned calls = 1;
    CUresult r = ooc_real.cuMemMap(a, M.chunk, 0, h, 0);
    if (r == CUDA_SUCCESS) {
        CUmemAccessDesc d = chunk_access(0);
        calls++;
        r = ooc_real.cuMemSetAccess(a, M.chunk, &d, 1);
        if (r != CUDA_SUCCESS) {
            calls++;
            ooc_real.cuMemUnmap(a, M.chunk);
        }
    }
    vmm_count(calls, t0);
    return r;
}

/* Sets the chunk-sized mapping at a read-only for the device (`ro`) or read-write again. */
CUresult vmm_protect(CUdeviceptr a, int ro) {
    gate_settle(a); /* the mapping it protects may still be to come behind the device */
    uint64_t t0 = mem_clock_ns();
    CUmemAccessDesc d = chunk_access(ro);
    CUresult r = ooc_real.cuMemSetAccess(a, M.chunk, &d, 1);
    vmm_count(1, t0);
    return r;
}

/* ---- VA runs (vaspace.c), with the address-space gauge ------------------------------------ */

/* Takes from or gives to space v, keeping the gauge of the addresses handed out (each space's
 * untouched tail). */
static int space_take(va_space_t *v, uint64_t count, uint64_t *first) {
    uint64_t tail = v->next;
    if (va_space_take(v, count, first) != 0)
        return -1;
    if (v->next > tail)
        ooc_stats_gauge_add(OOC_STAT_va_bytes, (v->next - tail) * M.chunk);
    return 0;
}

static void space_give(va_space_t *v, uint64_t first, uint64_t count) {
    uint64_t tail = v->next;
    va_space_give(v, first, count);
    if (v->next < tail)
        ooc_stats_gauge_sub(OOC_STAT_va_bytes, (tail - v->next) * M.chunk);
}

int va_take(uint64_t count, uint64_t *first) {
    return space_take(&M.va, count, first);
}

void va_give(uint64_t first, uint64_t count) {
    if (first < M.pva.chunks)
        return; /* a stable address: M.pva took it back when its buffer was freed (pva_give) */
    space_give(&M.va, first, count);
}

int pva_take(uint64_t count, uint64_t *first) {
    return space_take(&M.pva, count, first);
}

void pva_give(uint64_t first, uint64_t count) {
    space_give(&M.pva, first, count);
}

/* ---- chunk life --------------------------------------------------------------------------------
 */

/* A new chunk at idx, part of the buffer whose chunks are [first, first + n), published to the
 * fast path (which finds it cold). Caller holds mem_lock. */
chunk_t *chunk_new(uint64_t idx, uint64_t first, uint64_t n) {
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

chunk_t *chunk_find(uint64_t idx) {
    /* The table holds every chunk of the hash at its index (mem_check checks it): one load,
     * where the hash costs a hash of the key and a walk. */
    if (OOC_LIKELY(M.table != NULL && idx < M.va.chunks))
        return atomic_load_explicit(&M.table[idx], memory_order_relaxed);
    chunk_t *c;
    HASH_FIND(hh, M.chunks, &idx, sizeof idx, c);
    return c;
}

/* Forgets a chunk and frees it after a grace period: a fast-path op may have read its pointer
 * from the table (it then finds the chunk cold: deleted chunks are). Inside a writer section no
 * reader is left, so it is freed at once; otherwise it waits in the graveyard for the next
 * writer section (a free of a chunk no op ever used need not stop the fast path). Caller holds
 * mem_lock. */
void chunk_delete(chunk_t *c) {
    if (M.table && c->idx < M.va.chunks &&
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
    chunk_free(c);
}

/* Unmaps a resident chunk whose users have completed; its physical chunk returns to the pool
 * (a stolen chunk's is another chunk's by now, and was counted there). */
/* c was unmapped: its state follows. */
static void chunk_unmapped(chunk_t *c) {
    if (!c->stolen)
        phys_push(c->phys);
    c->phys = NULL;
    c->stolen = 0;
    c->state = C_SWAPPED;
    c->nusers = 0;
    c->users_unknown = 0;
    ev_drop(c->in_ev);
    c->in_ev = NULL;
}

CUresult unmap_chunk(chunk_t *c) {
    cool(c);
    if (M.safe)
        quiesce(); /* wait_chunks did already, unless the lock was let go since */
    CUresult r = vmm_unmap(chunk_addr(c));
    if (r == CUDA_SUCCESS)
        chunk_unmapped(c);
    return r;
}

/* unmap_chunk for the resident chunks cs[0, n), adjacent in address order, with one unmap
 * (vmm_unmap_run). Outside safe mode. On failure none is changed (the caller unmaps them one by
 * one: the driver may have unmapped some). */
CUresult unmap_chunks(chunk_t *const *cs, size_t n) {
    for (size_t i = 0; i < n; i++)
        cool(cs[i]);
    CUresult r = vmm_unmap_run(chunk_addr(cs[0]), n);
    for (size_t i = 0; i < n && r == CUDA_SUCCESS; i++)
        chunk_unmapped(cs[i]);
    return r;
}

/* A new physical chunk on the free list while under budget: CUDA_ERROR_OUT_OF_MEMORY at the
 * budget, or when the device has no more (the budget is then lowered to what was made). */
CUresult phys_new(void) {
    if (M.phys_made >= M.budget_chunks)
        return CUDA_ERROR_OUT_OF_MEMORY;
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
    if (r == CUDA_ERROR_OUT_OF_MEMORY) {
        /* The device has less than the budget: live with what we have. */
        OOC_LOG_W("the device ran out of memory at %llu chunks, below the budget of %llu; "
                  "using that as the budget",
                  (unsigned long long)M.phys_made, (unsigned long long)M.budget_chunks);
        M.budget_chunks = M.phys_made;
        M.budget_bytes = M.phys_made * M.chunk + M.external_bytes;
    }
    return r;
}

/* Releases physical chunk p (on no list any more); the caller counts it (M.phys_made). */
void phys_release(phys_t *p) {
    ev_drop(p->after);
    ooc_real.cuMemRelease(p->h);
    free(p);
}

/* Takes the physical chunk at the head of the free list (the caller checked that there is one):
 * resident memory from here. */
phys_t *phys_pop(void) {
    phys_t *p = M.phys_free;
    M.phys_free = p->next;
    p->next = NULL;
    M.resident++;
    ooc_stats_gauge_add(OOC_STAT_resident_bytes, M.chunk);
    return p;
}

/* Puts p back on the free list: no longer resident memory. */
void phys_push(phys_t *p) {
    p->next = M.phys_free;
    M.phys_free = p;
    M.resident--;
    ooc_stats_gauge_sub(OOC_STAT_resident_bytes, M.chunk);
}

/* A copy into chunk c, freshly mapped for a swap-in, failed: unmaps it and gives its physical
 * chunk back (the host copy stays the data; nothing used the device copy), and in safe mode maps
 * the host copy there again. Returns the unmap's result; on failure c stays mapped. Caller holds
 * the residency lock. */
CUresult unmap_failed_copy_in(chunk_t *c) {
    CUresult r = vmm_unmap(chunk_addr(c));
    if (r != CUDA_SUCCESS)
        return r;
    phys_push(c->phys);
    c->phys = NULL;
    if (M.safe)
        alias_chunk(c);
    return CUDA_SUCCESS;
}

/* Safe mode: maps a swapped chunk's host slot at the chunk's own address, so that an access the
 * shim could not see reaches the host copy, slowly but correctly. A failure is logged and leaves
 * the address unmapped (such an access would then fault); the data is safe either way. */
void alias_chunk(chunk_t *c) {
    CUresult r = vmm_map_rw(chunk_addr(c), c->host->h);
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
CUresult unalias_chunk(chunk_t *c) {
    if (!c->aliased)
        return CUDA_SUCCESS;
    cool(c);
    quiesce();
    CUresult r = vmm_unmap(chunk_addr(c));
    if (r == CUDA_SUCCESS)
        c->aliased = 0;
    return r;
}

/* Maps a physical chunk at c (taken from the free list) with read-write access. In safe mode no
 * fast-path op may be issued between the mapping and the end of this hold of mem_lock (an op
 * issued meanwhile could reach c unseen, and an error path unmaps c at once). */
CUresult map_chunk(chunk_t *c) {
    CUresult r = map_phys(c, M.phys_free);
    if (r != CUDA_SUCCESS)
        return r;
    (void)phys_pop(); /* c->phys */
    return CUDA_SUCCESS;
}

/* Maps the physical chunk p at c with read-write access (as map_chunk, which takes p from the
 * free list; a stolen chunk's memory is counted resident already). */
CUresult map_phys(chunk_t *c, phys_t *p) {
    if (M.safe)
        quiesce();
    CUresult r = vmm_map_rw(chunk_addr(c), p->h);
    if (r != CUDA_SUCCESS)
        return r;
    c->phys = p;
    c->since = M.serial;
    c->discard = 0;
    /* Memory handed on while work through another address may still use it (p->after): the ops
     * that name c wait for that work on their streams, as for a copy in (a copy in queued into it
     * waits for it too, phys_ordered, and its event then replaces this one). */
    evref_t *v = phys_pending(p);
    if (v && !c->in_ev) {
        v->refs++;
        c->in_ev = v;
    }
    return CUDA_SUCCESS;
}

int ooc_mem_owns(uintptr_t p) {
    return __atomic_load_n(&M.ready, __ATOMIC_ACQUIRE) && p >= M.va_base &&
           p - M.va_base < M.va_size;
}

void ooc_mem_forget_in_child(void) {
    __atomic_store_n(&M.ready, 0, __ATOMIC_RELEASE);
}
