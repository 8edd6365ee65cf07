/* SPDX-License-Identifier: MIT */
/* stagegate.c: safe mode's staged swap-ins moved behind the device (OOC_SAFE_STAGE=1 with
 * OOC_REMAP_GATE=1, both experimental). A gated swap-in (retire.c's swapins_behind_gate) moves its
 * chunk's address at the plan's point and copies in behind the gate, so every op issued after it
 * waits for that copy: an op may reach the chunk through a pointer the shim cannot see, and the
 * address shows memory still being filled. Staged instead (stage.c's stage_in, at the plan's point,
 * no gate), the copy goes to memory at a spare address while the chunk's address still shows its
 * host copy (read-only meanwhile), and overlaps the ops before the buffer's use; the first op that
 * uses the chunk moves its address to that memory behind a gate (gate.c), and the same gate unmaps
 * the spare address. The host waits for neither; the ops after the move wait for the gate only.
 * A chunk whose alias is itself still to come behind a swap-out's gate is staged too: its copy
 * waits for what that gate waits for (its copy out), and the gate maps its alias read-only
 * (stage_in). The memory comes from the
 * oldest retiring chunks behind one gate per buffer, not one per chunk; the move's gate also
 * hands over the memory of the op's other chunks (mem_coming); a staged chunk whose copy is done
 * by the time a gate is queued for swap-outs moves behind that one (retire.c's gate_batch).
 *
 * Invariants: a chunk moved here was staged (stage.c's invariants) and is resident after, its
 * in_ev the event after the gate; its spare address returns to the address space only once that
 * event is done (M.spares): a mapping call there before would wait for the device (gate_settle).
 * Locking: caller holds mem_lock. Callers: transfer.c (stage_some, at a planned swap-in),
 * resident.c (stages_behind_gate, at the op), mem.c (stage_spares_reap at shutdown). */
#include "mem_int.h"

#include <stdlib.h>

/* Whether c may be staged here (stage_some). One whose alias is still to come behind a gate may:
 * its copy waits for its copy out and its alias comes read-only (stage_in). */
static int stageable(const chunk_t *c) {
    return c->state == C_SWAPPED && c->aliased && !c->stage && !c->hold && !c->out_ev &&
           stage_allowed(c);
}

/* Safe mode with OOC_REMAP_GATE=1 and OOC_SAFE_STAGE=1: the planned swap-ins of cs[0, n) (swapped,
 * aliased chunks) staged at the plan's point (stage_in), as far as memory comes for them: free,
 * made under the budget, or the oldest retiring chunks' handed over behind one gate for all (the
 * staging copies then wait for that gate: phys_ordered). No gate for the swap-ins: the copies
 * overlap the compute, and the addresses still show the host copies. Stops at the first that
 * cannot be. Returns how many were staged. */
size_t stage_some(chunk_t *const *cs, size_t n) {
    stage_spares_reap(0);
    size_t m = 0, k = 0;
    while (m < n && stageable(cs[m]))
        m++;
    m = phys_free_behind_gate(m);
    for (; k < m; k++) {
        if (stage_in(cs[k]) != CUDA_SUCCESS)
            break;
        ooc_stats_add(OOC_STAT_prefetches, 1);
    }
    return k;
}

/* The spare addresses of chunks moved behind gates whose gates are open (all with `block`, at
 * shutdown, once the mapping thread is done): back to the address space. */
void stage_spares_reap(int block) {
    size_t k = 0;
    for (size_t i = 0; i < M.nspares; i++) {
        wlate_t l = M.spares[i];
        if (block)
            (void)sync_event(l.ev->e);
        if (block || ev_done(l.ev)) {
            va_give(l.idx, 1);
            ev_drop(l.ev);
            continue;
        }
        M.spares[k++] = l;
    }
    M.nspares = k;
    if (block) {
        free(M.spares);
        M.spares = NULL;
        M.cap_spares = 0;
    }
}

/* Safe mode with OOC_REMAP_GATE=1: the first use of the staged chunks cs[0, n), with no wait on
 * the host. Behind one gate: the gates' stream waits for their staging copies and for the work
 * issued so far on every stream that may reach their addresses unseen; the mapping thread moves
 * each address from its host copy to its staged memory and unmaps its spare address. Every op
 * issued from here waits for the gate (fill_set), none for a copy: the bytes were in that memory
 * before the address showed it. The same gate hands over the memory of the oldest retiring
 * chunks: those whose copies out are done (each would cost a gate of its own later), and enough
 * for `need` more chunks (the op's others: otherwise need_phys would queue a gate of its own
 * right after). Returns how many moved (all or none: 0 when a stream cannot be named or a call
 * failed, and the caller moves them as before). Caller holds mem_lock. */
size_t stages_behind_gate(chunk_t *const *cs, size_t n, size_t need) {
    size_t r = retirees_ready();
    if (need && n)
        (void)mem_coming(need, &r);
    if (!M.safe || !M.remap_gate || !gate_on() || !n || gate_reserve_n(r + 2 * n) != 0)
        return 0;
    CUstream gs = gate_stream();
    for (size_t i = 0; i < n; i++)
        if (ooc_real.cuStreamWaitEvent(gs, cs[i]->stage_ev->e, 0) != CUDA_SUCCESS)
            return 0; /* (the waits queued so far only hold the gates' stream for copies) */
    evref_t *after = NULL;
    uint32_t t = 0;
    if (gate_behind(cs, n, M.ret, r, r ? M.ret[r - 1]->out_ev : NULL, &after, &t) != 0)
        return 0;
    for (size_t i = 0; i < r; i++)
        gate_push_batch(t, after, chunk_addr(M.ret[i]), M.ret[i]->host->h, 0);
    stages_push(cs, n, t, after);
    ev_drop(after); /* the jobs hold their own references */
    evref_t *v = ev_take();
    if (!v || ooc_real.cuEventRecord(v->e, gs) != CUDA_SUCCESS) {
        sync_stream(gs); /* nothing to order the device's work after: wait for the remaps */
        ev_drop(v);
        v = NULL;
    }
    stages_moved(cs, n, v);
    retirees_gated(r, v);
    if (v)
        fill_set(FILL_GATE, v);
    ev_drop(v);
    ooc_stats_add(OOC_STAT_retire_joined, r);
    ooc_stats_add(OOC_STAT_staged_gated, n);
    return n;
}
