/* SPDX-License-Identifier: MIT */
/* stage.c: safe mode's planned swap-ins, staged beside the host alias. The worker copies a
 * swapped chunk's bytes into a physical chunk mapped at a spare address of the reservation while
 * the chunk's own address stays mapped to its host copy: an access the shim cannot see reads the
 * host copy, and no address of the program ever shows memory half filled, so the copy needs no
 * wait for the streams and overlaps the compute. The first op that uses the chunk (make_resident,
 * after the wait for the streams that removing an alias needs anyway) moves it: waits for the
 * copy, maps the physical chunk at the chunk's address and unmaps the spare one.
 *
 * A write through the alias after the copy read it would be lost: the alias is read-only while the
 * chunk is staged, so that such a write faults (reported by ooc_mem_report_fault, which names
 * OOC_SAFE_STAGE=0, the setting that keeps such writes) rather than vanish.
 *
 * Invariants: a staged chunk is swapped and (normally) aliased, holds `stage` (counted resident,
 * not in the LRU) and is in M.staged, oldest first; its copy is on the worker's host-to-device
 * stream (after the copy out when its alias was still to come), followed by stage_ev. Its host slot
 * stays its data until it moves. With OOC_REMAP_GATE=1 a staged chunk may also move behind a
 * gate on the device (the helpers at the end: at its op, stagegate.c; earlier, its copy done,
 * behind a gate queued for swap-outs, retire.c), and gated_in makes any chunk moved behind a gate
 * resident. Locking: caller holds mem_lock. Callers: worker.c (stage_in), resident.c
 * (stage_adopt, stage_reclaim), retire.c (chunk_release, gated_in, the moves), mem.c (shutdown),
 * stagegate.c (with OOC_REMAP_GATE=1). */
#include "mem_int.h"

#include <stdlib.h>
#include <string.h>

/* Takes c off the list of staged chunks (its `stage` is being given up or adopted). */
void staged_remove(chunk_t *c) {
    for (size_t i = 0; i < M.nstaged; i++) {
        if (M.staged[i] == c) {
            memmove(&M.staged[i], &M.staged[i + 1], (M.nstaged - i - 1) * sizeof *M.staged);
            M.nstaged--;
            return;
        }
    }
}

/* Starts the copy of swapped chunk c into the free physical chunk at the head of M.phys_free
 * (the caller made one: need_phys), mapped at a spare address. Returns CUDA_SUCCESS, or an error
 * with nothing changed (the caller then swaps c in at its own address). */
CUresult stage_in(chunk_t *c) {
    uint64_t idx;
    if (!c->host || !M.phys_free ||
        grow(&M.staged, &M.cap_staged, M.nstaged + 1, sizeof *M.staged) != 0 ||
        va_take(1, &idx) != 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    phys_t *p = M.phys_free;
    /* A chunk just swapped out behind a gate (OOC_REMAP_GATE=1) has its alias still to come: its
     * copy waits for what that gate waits for (its copy out among it: gate_after_at), not for the
     * gate (on the gates' stream it would hold every later gate back behind it), and the alias
     * comes read-only (gate_map_ro). The copy names the spare address and the host copy's own,
     * never the chunk's, which the mapping thread may have unmapped when the driver checks it. */
    evref_t *out = gate_after_at(chunk_addr(c));
    int pending = out != NULL;
    CUstream st = M.h2d;
    CUresult r = out ? ooc_real.cuStreamWaitEvent(st, out->e, 0) : CUDA_SUCCESS;
    ev_drop(out);
    if (r != CUDA_SUCCESS) {
        va_give(idx, 1);
        return r;
    }
    r = vmm_map_rw(idx_addr(idx), p->h);
    if (r != CUDA_SUCCESS) {
        va_give(idx, 1);
        return r;
    }
    evref_t *v = ev_take();
    r = v ? phys_ordered(p, st) : CUDA_ERROR_OUT_OF_MEMORY;
    if (r == CUDA_SUCCESS)
        r = copy_in_at(c, idx_addr(idx), st);
    if (r == CUDA_SUCCESS)
        r = ooc_real.cuEventRecord(v->e, st);
    if (r != CUDA_SUCCESS) {
        sync_stream(st); /* the copy may have been queued */
        ev_drop(v);
        if (vmm_unmap(idx_addr(idx)) == CUDA_SUCCESS)
            va_give(idx, 1);
        return r;
    }
    (void)phys_pop(); /* p */
    c->stage = p;
    c->stage_idx = idx;
    c->stage_ev = v;
    /* From here a write through the alias would be lost (the copy read the bytes already): the
     * alias becomes read-only, so that such a write faults instead, with a report naming
     * OOC_SAFE_STAGE (ooc_mem_report_fault). Reads still get the host copy. */
    c->stage_ro =
        (pending && gate_map_ro(chunk_addr(c))) || vmm_protect(chunk_addr(c), 1) == CUDA_SUCCESS;
    M.staged[M.nstaged++] = c;
    ooc_stats_add(OOC_STAT_staged, 1);
    ooc_stats_add(OOC_STAT_staged_pending, pending);
    ooc_stats_add(OOC_STAT_swap_ins, 1);
    ooc_stats_add(OOC_STAT_swap_in_bytes, chunk_used(c));
    return CUDA_SUCCESS;
}

/* Waits for c's staging copy and unmaps the spare address. Returns its physical chunk, or NULL
 * when the address could not be unmapped (the chunk then stays staged). */
static phys_t *stage_detach(chunk_t *c) {
    sync_event(c->stage_ev->e);
    if (vmm_unmap(idx_addr(c->stage_idx)) != CUDA_SUCCESS)
        return NULL;
    va_give(c->stage_idx, 1);
    ev_drop(c->stage_ev);
    c->stage_ev = NULL;
    phys_t *p = c->stage;
    c->stage = NULL;
    staged_remove(c);
    return p;
}

/* The first op that uses staged chunk c: its alias is gone (the caller waited for the streams
 * and unaliased it); maps the staged memory at its address, resident. Returns CUDA_SUCCESS, or an
 * error with c swapped and its memory back on the free list (demand residency then copies it
 * in again). The host slot stays attached (the caller gives it back: nothing reads it now). */
CUresult stage_adopt(chunk_t *c) {
    phys_t *p = stage_detach(c);
    if (!p)
        return CUDA_ERROR_UNKNOWN;
    c->stage_ro = 0; /* the read-only alias is gone */
    CUresult r = map_phys(c, p);
    if (r != CUDA_SUCCESS)
        phys_push(p);
    return r;
}

/* Gives c's staged memory back unused (its buffer is freed, the memory is needed elsewhere, or at
 * shutdown): c stays swapped, its host copy the data. */
void stage_drop(chunk_t *c) {
    phys_t *p = stage_detach(c);
    if (!p)
        return;
    if (c->stage_ro && c->aliased && vmm_protect(chunk_addr(c), 0) != CUDA_SUCCESS)
        OOC_LOG_W("safe mode: the host alias at %#llx stays read-only", /* a write there faults */
                  (unsigned long long)chunk_addr(c));
    c->stage_ro = 0;
    phys_push(p);
    ooc_stats_add(OOC_STAT_staged_dropped, 1);
}

/* Memory for demand residency when nothing else gives it: the newest staged chunk's (its op is
 * the furthest away) that the current op does not use. Returns 1 when one was given back. Never
 * for the worker, which stages in the plan's order: every staged chunk is needed before the one
 * it is placing. */
int stage_reclaim(void) {
    if (mem_is_worker())
        return 0;
    for (size_t i = M.nstaged; i-- > 0;) {
        if (M.staged[i]->pin == M.serial)
            continue;
        size_t n = M.nstaged;
        stage_drop(M.staged[i]);
        return M.nstaged < n;
    }
    return 0;
}

/* At shutdown: every staged chunk's memory back. */
void stage_drop_all(void) {
    while (M.nstaged) {
        size_t n = M.nstaged;
        stage_drop(M.staged[n - 1]);
        if (M.nstaged == n) {
            /* The spare address could not be unmapped (after a sticky device error nothing
             * can be): free our side anyway, as ooc_mem_shutdown does for a resident chunk. */
            chunk_t *c = M.staged[--M.nstaged];
            phys_release(c->stage);
            ev_drop(c->stage_ev);
            c->stage = NULL;
            c->stage_ev = NULL;
            c->stage_ro = 0;
        }
    }
}

/* ---- buffers reached through stored addresses ---------------------------------------------- */

/* Whether c may be staged: not when a host-to-device copy stored the address of its buffer in
 * device memory (a kernel may then write it through that pointer while it is staged, and fault).
 */
int stage_allowed(const chunk_t *c) {
    return !M.reached_all && !(M.reached && M.reached[c->idx]);
}

/* Marks the chunks of the buffer that p lies in (if one of ours: a slab's chunk for a small one)
 * as reached through memory, and gives back their staged memory (the alias becomes writable). */
static void mark_reached(uintptr_t p) {
    chunk_t *c = chunk_find((p - M.va_base) >> M.shift);
    uint64_t first = c ? atomic_load(&c->ext_first) : 0, n = c ? atomic_load(&c->ext_n) : 0;
    if (!n)
        return;
    if (!M.reached && !(M.reached = calloc(M.va.chunks, 1))) {
        M.reached_all = 1; /* no room to tell buffers apart: stage none */
        return;
    }
    for (uint64_t i = first; i < first + n && i < M.va.chunks; i++) {
        if (M.reached[i])
            continue;
        M.reached[i] = 1;
        ooc_stats_add(OOC_STAT_stage_reached, 1);
        chunk_t *x = chunk_find(i);
        if (x && x->stage)
            stage_drop(x);
    }
}

void ooc_mem_note_stored(uintptr_t dst, const void *src, size_t n) {
    if (!M.safe || !M.stage || n > OOC_SHADOW_MAX_BYTES || !src)
        return;
    const unsigned char *bytes = src;
    int locked = 0;
    for (size_t o = (8 - dst % 8) % 8; o + 8 <= n; o += 8) {
        uint64_t w;
        memcpy(&w, bytes + o, sizeof w);
        if (w < M.va_base || w - M.va_base >= M.va_size)
            continue;
        if (!locked) {
            mem_lock_take();
            locked = 1;
        }
        mark_reached((uintptr_t)w);
    }
    if (locked)
        mem_unlock();
}

/* ---- moved behind a gate (OOC_REMAP_GATE=1: retire.c, stagegate.c) ----------------------------
 */

/* The aliased chunk c (its memory in c->phys) moves from its host copy to that memory behind the
 * gate that v follows (NULL: the host waited for the gate): resident from here, the ops that name
 * it waiting for v, its host slot back once v is done. */
void gated_in(chunk_t *c, evref_t *v) {
    c->aliased = 0;
    c->since = M.serial;
    c->discard = 0;
    c->state = C_RESIDENT;
    c->queued = 0;
    ev_drop(c->in_ev);
    c->in_ev = NULL;
    if (v) {
        v->refs++;
        c->in_ev = v;
        limbo_put(c->host, v); /* mapped at c's address until the remap, which v follows */
    } else {
        host_slot_put(c->host);
    }
    c->host = NULL;
    lru_push(c);
}

/* The staged chunks whose staging copies are done, oldest first, at most `max`, into out: they
 * may move behind a gate queued for something else (retire.c's gate_batch), before their op, and
 * their op then needs no gate of its own. Returns how many. */
size_t stages_ready(chunk_t **out, size_t max) {
    size_t k = 0;
    if (!M.safe || !M.remap_gate || !M.stage)
        return 0;
    for (size_t i = 0; i < M.nstaged && k < max; i++) {
        chunk_t *c = M.staged[i];
        if (c->state == C_SWAPPED && c->aliased && c->stage_ev && ev_done(c->stage_ev))
            out[k++] = c;
    }
    return k;
}

/* The jobs that move the staged chunks cs[0, n) behind gate t (room made by gate_reserve_n, two
 * each): each address from its host copy to its staged memory, then its spare address unmapped;
 * the last opens the gate. Their staging copies are done (stages_ready), or the gates' stream
 * waited for them before the gate (stages_behind_gate). */
void stages_push(chunk_t *const *cs, size_t n, uint32_t t, evref_t *after) {
    for (size_t i = 0; i < n; i++) {
        gate_push_batch(t, after, chunk_addr(cs[i]), cs[i]->stage->h, 0);
        gate_push_unmap(t, after, idx_addr(cs[i]->stage_idx), i + 1 == n);
    }
}

/* The staged chunks cs[0, n), whose moves were pushed (stages_push) behind a gate that v follows
 * (NULL: the host waited for it): resident from here, each op issued after waiting for v (the
 * caller's fill_set). */
void stages_moved(chunk_t *const *cs, size_t n, evref_t *v) {
    for (size_t i = 0; i < n; i++) {
        chunk_t *c = cs[i];
        /* The spare address goes back once v is done (the gate open, its unmap done), so that
         * no mapping call waits there for the device (gate_settle would). */
        if (v && grow(&M.spares, &M.cap_spares, M.nspares + 1, sizeof *M.spares) == 0) {
            v->refs++;
            M.spares[M.nspares++] = (wlate_t){c->stage_idx, v};
        } else {
            va_give(c->stage_idx, 1); /* a mapping call there waits for the unmap */
        }
        ev_drop(c->stage_ev);
        c->stage_ev = NULL;
        c->phys = c->stage;
        c->stage = NULL;
        c->stage_ro = 0;
        staged_remove(c);
        gated_in(c, v);
    }
}
