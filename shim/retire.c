/* SPDX-License-Identifier: MIT */
/* retire.c: chunks on their way out: retiring (a planned swap-out copy in flight) and dying
 * (their buffer freed, their memory back once the work of their users is done).
 *
 * Invariants: a retiring chunk is resident with out_ev set and is in M.ret in swap-out order; a
 * dying chunk has `dying` set, is in M.dying, and is unmapped (chunk_bury) only once its fence
 * events have completed or its users were waited for. Locking: caller holds mem_lock. Callers:
 * buffer.c (free), resident.c (eviction, reuse), worker.c. */
#include "mem_int.h"

#include <stdlib.h>
#include <string.h>

/* Staged chunks moved at most behind a gate queued for swap-outs (gate_batch). */
#define GATE_MOVES 16

/* Gives back what a dead chunk holds (its users are done): device or host mapping, host slot,
 * addresses. */
static CUresult chunk_bury(chunk_t *c) {
    CUresult r = c->state == C_RESIDENT ? unmap_chunk(c) : unalias_chunk(c);
    if (r != CUDA_SUCCESS)
        return r;
    for (unsigned i = 0; i < c->nfence; i++)
        ev_drop(c->fence[i]);
    host_slot_put(c->host);
    c->host = NULL;
    va_give(c->idx, 1);
    chunk_delete(c);
    return CUDA_SUCCESS;
}

void ret_remove(chunk_t *c) {
    for (size_t i = 0; i < M.nret; i++) {
        if (M.ret[i] == c) {
            memmove(&M.ret[i], &M.ret[i + 1], (M.nret - i - 1) * sizeof *M.ret);
            M.nret--;
            return;
        }
    }
}

/* A retiring chunk is used again before its swap-out was finished: it stays resident (its
 * device bytes are current); its host slot goes back once the copy writing it is done. */
void retire_cancel(chunk_t *c) {
    ret_remove(c);
    chunk_add_user(c, M.d2h); /* the copy still reads it */
    limbo_put(c->host, c->out_ev);
    c->host = NULL;
    ev_drop(c->out_ev);
    c->out_ev = NULL;
    ooc_stats_add(OOC_STAT_swap_cancels, 1);
}

/* Whether the retiring chunk r may give its physical chunk to another (retire_steal): it still
 * has it, the current op does not use it or was issued already, and no library call holds it. */
int retire_may_give(const chunk_t *r) {
    return r->phys && (r->pin != M.serial || M.op_done) && !r->hold;
}

/* Outside safe mode: the physical chunk of the oldest retiring chunk that may give it (not used
 * by the current op before it is issued, which would cancel that swap-out, nor held by a library
 * call; once the op is issued, the plan's swap-outs after it hand its chunks on at once), taken
 * while its copy out still runs. The retiring chunk (*from) is marked stolen: its address stays
 * mapped to the memory until its copy out is done (the worker unmaps it then), and whatever is
 * written to the memory must follow that copy on the device (its out_ev). The memory stays
 * counted resident, now as the taker's. NULL when none may. In safe mode a retiring chunk's
 * address must keep its bytes until its host alias replaces them, for an access the shim cannot
 * see. */
phys_t *retire_steal(chunk_t **from) {
    *from = NULL;
    if (M.safe)
        return NULL;
    for (size_t i = 0; i < M.nret; i++) {
        chunk_t *r = M.ret[i];
        if (retire_may_give(r)) {
            phys_t *p = r->phys;
            r->phys = NULL;
            r->stolen = 1;
            *from = r;
            return p;
        }
    }
    return NULL;
}

/* Outside safe mode: the physical chunk of the oldest fenced dying chunk (its buffer freed, the
 * work that may still use it queued), taken before that work is done: whatever is written to the
 * memory must follow its fence events on the device, and its address stays mapped to it until
 * they are done (reap_dying unmaps it then). The memory stays counted resident, now as the
 * taker's. NULL when none may. An op's own swap-ins take it (transfer.c) rather than wait on the
 * host for memory that the device will free before they run. */
phys_t *dying_steal(chunk_t **from) {
    *from = NULL;
    if (M.safe)
        return NULL;
    for (size_t i = 0; i < M.ndying; i++) {
        chunk_t *d = M.dying[i];
        if (d->fenced && d->phys && !d->stolen && !d->hold && d->state == C_RESIDENT) {
            phys_t *p = d->phys;
            d->phys = NULL;
            d->stolen = 1;
            *from = d;
            return p;
        }
    }
    return NULL;
}

/* Gives back a physical chunk retire_steal or dying_steal took, unused. */
void retire_unsteal(phys_t *p, chunk_t *from) {
    from->phys = p;
    from->stolen = 0;
}

/* A retiring chunk whose memory a planned swap-in took (stolen) is used again: its bytes are on
 * their way to its host slot, and its address still shows the other chunk's. The host waits for
 * the copy and finishes it (and the older ones): c is then swapped, and demand residency brings
 * it back. */
void retire_settle(chunk_t *c) {
    while (c->out_ev && M.nret)
        if (!retire_poll(1))
            break;
}

/* Safe mode behind a gate: queues on the gates' stream a wait for `first` (may be NULL) and for
 * the work issued so far on every stream that may reach the chunks as[0, na) or bs[0, nb) unseen,
 * then the event *after (a reference) the mapping thread waits for, then a gate (its ticket in
 * *t). 0; -1 when a stream cannot be named or a call failed (nothing was pushed: the caller gives
 * up). Also: no fast-path op passes from here until mem_lock is let go (gather_streams). */
int gate_behind(chunk_t *const *as, size_t na, chunk_t *const *bs, size_t nb, evref_t *first,
                evref_t **after, uint32_t *t) {
    CUstream users[2 * (MAX_USERS + MAX_STREAMS)];
    unsigned nu = 0, nb_users = 0;
    if ((na && gather_streams(as, na, users, &nu)) ||
        (nb && gather_streams(bs, nb, users + nu, &nb_users)))
        return -1;
    unsigned end = nu + nb_users;
    for (unsigned i = nu; i < end; i++) { /* the second group's, once each (nu <= i) */
        unsigned k = 0;
        while (k < nu && users[k] != users[i])
            k++;
        if (k == nu)
            users[nu++] = users[i];
    }
    CUstream gs = gate_stream();
    CUresult r = first ? ooc_real.cuStreamWaitEvent(gs, first->e, 0) : CUDA_SUCCESS;
    for (unsigned u = 0; u < nu && r == CUDA_SUCCESS; u++) {
        evref_t *e = ev_take();
        r = e ? ooc_real.cuEventRecord(e->e, users[u]) : CUDA_ERROR_OUT_OF_MEMORY;
        if (r == CUDA_SUCCESS)
            r = ooc_real.cuStreamWaitEvent(gs, e->e, 0);
        ev_drop(e); /* the wait keeps the record it saw */
    }
    *after = r == CUDA_SUCCESS ? ev_take() : NULL;
    r = *after ? ooc_real.cuEventRecord((*after)->e, gs) : CUDA_ERROR_OUT_OF_MEMORY;
    if (r == CUDA_SUCCESS)
        r = gate_wait_on(gs, t);
    if (r != CUDA_SUCCESS) {
        ev_drop(*after);
        *after = NULL;
        return -1;
    }
    return 0;
}

/* Whether the retiring chunk c may be finished behind a gate (retire_behind_gate). */
static int retire_gateable(const chunk_t *c) {
    return c->out_ev && !c->stolen && c->phys && c->host && !c->hold;
}

/* The oldest r retiring chunks, their remaps to their host copies queued behind a gate that v
 * follows (NULL: the host waited for it): swapped and aliased from here; their memory (unless a
 * swap-in behind the same gate took it: phys NULL) free at once, in stream order (p->after). */
void retirees_gated(size_t r, evref_t *v) {
    for (size_t i = 0; i < r; i++) {
        chunk_t *c = M.ret[i];
        ev_drop(c->out_ev);
        c->out_ev = NULL;
        phys_t *p = c->phys; /* NULL when a swap-in above took it */
        c->phys = NULL;
        c->state = C_SWAPPED;
        c->nusers = 0;
        c->users_unknown = 0;
        ev_drop(c->in_ev);
        c->in_ev = NULL;
        c->aliased = 1;
        c->since = M.serial;
        if (!p)
            continue;
        if (v) {
            ev_drop(p->after); /* an older remap's: the stream runs them in order */
            v->refs++;
            p->after = v;
        }
        phys_push(p);
    }
    if (r) { /* (M.ret may be NULL when none ever retired) */
        memmove(M.ret, M.ret + r, (M.nret - r) * sizeof *M.ret);
        M.nret -= r;
    }
    ooc_stats_add(OOC_STAT_host_aliases, r);
    ooc_stats_add(OOC_STAT_retire_gated, r);
}

/* Safe mode, OOC_REMAP_GATE=1: one gate for the oldest r retiring chunks (M.ret[0, r), which
 * the caller checked with retire_gateable) and the swap-ins of the aliased chunks cs[0, k) (checked
 * with swapin_gateable; memory for them among the retirees' and, for the rest, on the free list),
 * with no wait on the host for the copies out nor for the streams that may reach the addresses
 * unseen. The gates' stream waits for the copies out and for the work issued so far on each of
 * those streams; the mapping thread (gate.c) then moves each retiree's address from its device
 * memory to its host copy (the alias), each swapped-in chunk's from its alias to device memory,
 * and opens the gate after the last; the copies in follow the gate on the same stream. A retiree's
 * memory is free at once, handed over in stream order: every op issued from here waits for the
 * gate (fill_set), and every copy the shim makes into or out of it waits for it too (its `after`,
 * phys_ordered), so nothing reaches it through a new address while it may still be reached
 * through the old. One gate for all: each costs the device the mapping thread's wake-up, and a
 * swap-in that needs a retiree's memory would otherwise wait behind two. Returns how many
 * swap-ins were issued (cs[0, that)); -1 when nothing was done (a stream that cannot be named, a
 * failure): the caller finishes the retirees on the host and brings cs in as before.
 * `planned`: the swap-ins are planned ones. Caller holds mem_lock and keeps it until cs are
 * settled. */
static long gate_batch(size_t r, chunk_t *const *cs, size_t k, int planned) {
    /* Retirees only: staged chunks whose copies are done move behind the same gate, ahead of
     * their ops (stagegate.c), which then need no gate of their own. */
    chunk_t *mv[GATE_MOVES];
    size_t nm = k ? 0 : stages_ready(mv, GATE_MOVES);
    if (!M.safe || !M.remap_gate || !gate_on() || r > M.nret || (!r && !k) ||
        gate_reserve_n(r + k + 2 * nm) != 0)
        return -1;
    CUstream gs = gate_stream();
    size_t m = 0; /* the copies in follow the work that may still use memory handed on early */
    for (phys_t *p = M.phys_free; p && m + r < k; p = p->next, m++)
        if (phys_ordered(p, gs) != CUDA_SUCCESS)
            return -1;
    evref_t *first = r ? M.ret[r - 1]->out_ev : NULL; /* copies out run in order: the last */
    evref_t *after = NULL;
    uint32_t t = 0;
    if (gate_behind(M.ret, r, k ? cs : mv, k ? k : nm, first, &after, &t) != 0)
        return -1;
    evref_t *v = ev_take();
    size_t done = 0; /* the copies queued behind the gate */
    while (v && done < k && copy_in(cs[done], gs) == CUDA_SUCCESS)
        done++;
    if (!done && !r) {
        gate_push(t, after, chunk_addr(cs[0]), 0); /* nothing behind the gate: it only opens */
        ev_drop(after);
        ev_drop(v);
        return 0;
    }
    for (size_t i = 0; i < r; i++)
        gate_push_batch(t, after, chunk_addr(M.ret[i]), M.ret[i]->host->h,
                        !done && !nm && i + 1 == r);
    stages_push(mv, nm, t, after);
    for (size_t i = 0; i < done; i++) {
        phys_t *p = NULL;
        if (i < r) { /* a retiree's memory, ordered by this gate already */
            p = M.ret[i]->phys;
            M.ret[i]->phys = NULL;
        } else {
            p = phys_pop();
        }
        gate_push_batch(t, after, chunk_addr(cs[i]), p->h, i + 1 == done);
        cs[i]->phys = p;
    }
    ev_drop(after); /* the jobs hold their own references */
    if (!v || ooc_real.cuEventRecord(v->e, gs) != CUDA_SUCCESS) {
        sync_stream(gs); /* nothing to order the device's work after: wait for the remaps */
        ev_drop(v);
        v = NULL;
    }
    retirees_gated(r, v);
    stages_moved(mv, nm, v);
    ooc_stats_add(OOC_STAT_staged_early, nm);
    for (size_t i = 0; i < done; i++) {
        chunk_t *c = cs[i];
        gated_in(c, v);
        if (planned) {
            count_prefetch(c, 0);
        } else {
            ooc_stats_add(OOC_STAT_swap_ins, 1);
            ooc_stats_add(OOC_STAT_swap_in_bytes, chunk_used(c));
        }
    }
    if (v)
        fill_set(FILL_GATE, v);
    ev_drop(v);
    if (done)
        ooc_stats_add(OOC_STAT_retire_joined, r);
    ooc_stats_add(OOC_STAT_prefetch_gated, done);
    return (long)done;
}

/* The first n retiring chunks behind one gate (gate_batch). 1 when done (the chunks are swapped
 * and aliased); 0 when not: the caller finishes them on the host. */
static int retire_behind_gate(size_t n) {
    return n && gate_batch(n, NULL, 0, 0) >= 0;
}

/* How many of the oldest retiring chunks retire_behind_gate may take at once: those whose
 * copies out are done, at least one (`any`: the oldest even if its copy still runs). */
static size_t retire_gate_batch(int any) {
    if (!M.safe || !M.remap_gate || !gate_on())
        return 0; /* nothing to ask the copies out: retire_behind_gate would not take them */
    size_t n = 0;
    while (n < M.nret && retire_gateable(M.ret[n]) && ev_done(M.ret[n]->out_ev))
        n++;
    if (!n && any && M.nret && retire_gateable(M.ret[0]))
        n = 1;
    return n;
}

/* How many of the oldest retiring chunks may go behind a gate queued anyway, their copies out
 * done (retirees_gated after it). */
size_t retirees_ready(void) {
    return retire_gate_batch(0);
}

/* Safe mode, OOC_REMAP_GATE=1: the oldest retiring chunks finished behind one gate, their
 * copies out done or not (retire_behind_gate). 1 when some were (their memory is free). */
int retire_oldest_behind_gate(void) {
    return retire_behind_gate(retire_gate_batch(1));
}

/* Safe mode, OOC_REMAP_GATE=1: a swap-in of the aliased chunk c (its address shows its host
 * copy) issued now without waiting on the host for the streams that may reach that address
 * unseen. The gates' stream waits for the work issued so far on each of those streams (an event
 * recorded on each), then for a gate; the mapping thread (gate.c) waits for that point, moves
 * c's address from its host copy to free device memory and opens the gate; the copy in follows
 * on the same stream. Every op issued from here waits for that copy (fill_set: the op's stream
 * waits for it whatever it names), so no op reaches the address while it changes or before it
 * is filled; ops issued before are in the events the remap waits for. Memory: free, made under
 * the budget, or a retiring chunk's handed over behind its own gate (retire_behind_gate); never
 * evicted here (the caller may make room first: need_phys). 1 when
 * issued; 0 when not (no free memory, a stream that cannot be named, a failure): the caller
 * brings c in as before. `planned`: a planned swap-in (counted as one), else an op's own demand.
 * Caller holds mem_lock and keeps it until c is settled. */
int swapin_behind_gate(chunk_t *c, int planned) {
    return swapins_behind_gate(&c, 1, planned) == 1;
}

/* Whether c may be swapped in behind a gate (swapins_behind_gate). */
static int swapin_gateable(const chunk_t *c) {
    return c->state == C_SWAPPED && c->aliased && c->host && !c->out_ev && !c->stage && !c->hold;
}

/* Free physical chunks on the list. */
static size_t phys_free_count(size_t enough) {
    size_t k = 0;
    for (phys_t *p = M.phys_free; p && k < enough; p = p->next)
        k++;
    return k;
}

/* Memory for k more chunks: free, made under the budget, else the oldest retirees' (their number
 * in *r, to be handed over behind one gate; those whose copies are done go too, since each would
 * cost a gate of its own later). Returns for how many of the k it comes. */
size_t mem_coming(size_t k, size_t *r) {
    size_t have = phys_free_count(k);
    *r = k ? retire_gate_batch(0) : 0;
    while (have + *r < k) {
        if (phys_new() == CUDA_SUCCESS)
            have = phys_free_count(k);
        else if (*r < M.nret && retire_gateable(M.ret[*r]))
            (*r)++;
        else
            break; /* none made under the budget, none handed over */
    }
    return have + *r < k ? have + *r : k;
}

/* swapin_behind_gate for the first of cs[0, n) that may be (swapin_gateable, stopping at the
 * first that may not) and that memory comes for, behind one gate: one wait of the mapping
 * thread's for the device, one wake-up. Returns how many were issued (cs[0, that)). */
size_t swapins_behind_gate(chunk_t *const *cs, size_t n, int planned) {
    if (!M.safe || !M.remap_gate || !gate_on())
        return 0;
    size_t k = 0, r = 0;
    while (k < n && swapin_gateable(cs[k]))
        k++;
    k = mem_coming(k, &r); /* the retirees' behind the same gate */
    if (!k)
        return 0;
    long done = gate_batch(r, cs, k, planned);
    return done > 0 ? (size_t)done : 0;
}

/* Safe mode, OOC_REMAP_GATE=1: k free physical chunks made, retirees handed over behind one gate
 * where needed (mem_coming). Returns how many are free now (up to k). */
size_t phys_free_behind_gate(size_t k) {
    size_t r = 0;
    if (!M.safe || !M.remap_gate || !gate_on())
        return 0;
    k = mem_coming(k, &r);
    if (r)
        (void)retire_behind_gate(r); /* (when it fails, fewer are free) */
    return phys_free_count(k);
}

/* What follows the unmap of the retired chunk c (r: how it went) in retire_finish. */
static CUresult retire_unmapped(chunk_t *c, CUresult r) {
    if (r != CUDA_SUCCESS && c->stolen) {
        /* Still mapped, but to memory another chunk holds now: the host copy is its data. Its
         * address stays mapped (a later map there fails: demand residency reports it). */
        OOC_LOG_E("the swapped-out chunk at %#llx could not be unmapped (%s)",
                  (unsigned long long)chunk_addr(c), ooc_real_errname(r));
        c->stolen = 0;
        c->state = C_SWAPPED;
        return r;
    }
    if (r != CUDA_SUCCESS) {
        /* Still mapped, bytes current: it stays resident; the finished host copy is dropped. */
        host_slot_put(c->host);
        c->host = NULL;
        lru_push(c);
        return r;
    }
    if (M.safe)
        alias_chunk(c);
    return CUDA_SUCCESS;
}

/* The swap-out copy of c is done: its physical chunk returns to the pool and, in safe mode, its
 * host copy is mapped at its address. Every user of c was waited for by the copy (a later user
 * would have cancelled the swap-out); in safe mode the streams that may reach it unseen are
 * waited for here. */
static CUresult retire_finish(chunk_t *c) {
    CUresult r = M.safe ? wait_chunks(&c, 1) : CUDA_SUCCESS;
    ret_remove(c);
    ev_drop(c->out_ev);
    c->out_ev = NULL;
    if (r == CUDA_SUCCESS)
        r = unmap_chunk(c); /* keeps c->host: the finished copy is now the chunk's bytes */
    ooc_stats_add(OOC_STAT_retired_chunks, 1);
    ooc_stats_add(OOC_STAT_retire_unmaps, 1);
    return retire_unmapped(c, r);
}

/* The most retirees finished with one unmap (retire_run). */
#define RUN_MAX 64

/* Whether retirees a and b (b listed right after a) are one run: copied out by the same swap-out
 * (one event), b at the address after a's. */
static int run_next(const chunk_t *a, const chunk_t *b) {
    return a->out_ev == b->out_ev && chunk_addr(b) == chunk_addr(a) + M.chunk;
}

/* The run of retirees around M.ret[i] (whose copy is done) that retire_run finishes together:
 * outside safe mode, the neighbours in the list copied out by the same swap-out at the adjacent
 * addresses (done too: one event). Its first index in *first; returns its length (1 in safe
 * mode). */
static size_t retire_run_len(size_t i, size_t *first) {
    size_t a = i, b = i + 1;
    while (!M.safe && a > 0 && b - a < RUN_MAX && run_next(M.ret[a - 1], M.ret[a]))
        a--;
    while (!M.safe && b < M.nret && b - a < RUN_MAX && run_next(M.ret[b - 1], M.ret[b]))
        b++;
    *first = a;
    return b - a;
}

/* retire_finish for the k retirees from M.ret[first] (retire_run_len), with one unmap. */
static void retire_run(size_t first, size_t k) {
    chunk_t *run[RUN_MAX];
    memcpy(run, M.ret + first, k * sizeof *run);
    memmove(M.ret + first, M.ret + first + k, (M.nret - first - k) * sizeof *M.ret);
    M.nret -= k;
    for (size_t i = 0; i < k; i++) {
        ev_drop(run[i]->out_ev);
        run[i]->out_ev = NULL;
    }
    CUresult r = unmap_chunks(run, k);
    ooc_stats_add(OOC_STAT_retired_chunks, k);
    ooc_stats_add(OOC_STAT_retire_unmaps, r == CUDA_SUCCESS ? 1 : 1 + k);
    for (size_t i = 0; i < k; i++)
        (void)retire_unmapped(run[i], r == CUDA_SUCCESS ? r : unmap_chunk(run[i]));
}

/* Waits on the host for the retiring chunk c's copy out (counted as a wait for copies out). */
static void wait_copy_out(const chunk_t *c) {
    unsigned why = wait_for(WAIT_OUT);
    sync_event(c->out_ev->e);
    wait_for(why);
}

/* Finishes the retiring chunks whose copies are done, oldest first (the device-to-host stream
 * runs them in order); with `block`, waits for the oldest when none is. Returns how many. (A
 * caller outside safe mode that needs memory now uses retire_free: the stolen ones give none.) */
unsigned retire_poll(int block) {
    unsigned n = 0;
    /* Safe mode with the gate: the oldest whose copies are done, or with `block` the oldest,
     * behind one gate (retire_behind_gate); else on the host. */
    size_t g = retire_gate_batch(block);
    if (g && retire_behind_gate(g))
        return (unsigned)g;
    while (M.nret) {
        chunk_t *c = M.ret[0];
        if (!ev_done(c->out_ev)) {
            if (!block || n)
                break;
            wait_copy_out(c);
        }
        size_t first, k = retire_run_len(0, &first);
        if (k > 1) {
            retire_run(first, k);
            n += (unsigned)k;
            continue;
        }
        retire_finish(c); /* leaves the list either way */
        n++;
    }
    return n;
}

/* Outside safe mode: finishes the retiring chunk c, whose copy out is done, with its run
 * (retire_run_len). */
static void retire_at(chunk_t *c) {
    size_t i = 0;
    while (i < M.nret && M.ret[i] != c)
        i++;
    size_t first, k = i < M.nret ? retire_run_len(i, &first) : 1;
    if (k > 1)
        retire_run(first, k);
    else
        (void)retire_finish(c);
}

/* Outside safe mode: finishes the retiring chunk c, whose copy out is done, with its run, now,
 * out of age order (an op needs it back): the older retirees whose copies are done too are left
 * for later (each unmap costs tens of microseconds under mem_lock; the worker finishes them when
 * idle). In safe mode, all of them up to c (retire_poll). */
void retire_done(chunk_t *c) {
    if (M.safe) {
        retire_poll(0);
        return;
    }
    retire_at(c);
}

/* Outside safe mode: memory from the oldest retiree whose memory is still its own (not stolen),
 * its copy out waited for with `block`, finished (with its run) out of age order: the stolen ones
 * before it give none, and unmapping them first cost a wait for memory tens of microseconds
 * each (in `mlp --layers 12` at 1/4, 70 of them, 5 ms, while an op waited). 1 when
 * one was finished (a physical chunk is free); 0 when none may (none unstolen, or not done
 * without `block`, or safe mode: retire_poll then). */
int retire_free(int block) {
    if (M.safe)
        return 0;
    for (size_t i = 0; i < M.nret; i++) {
        chunk_t *c = M.ret[i];
        if (c->stolen)
            continue;
        if (!ev_done(c->out_ev)) {
            if (!block)
                return 0; /* the stream runs them in order: none after it is done either */
            wait_copy_out(c);
        }
        retire_at(c);
        return 1;
    }
    return 0;
}

/* Fences a dying chunk: events after the work of every stream that may use it (no later op may:
 * its buffer is freed). Unfenced when the streams cannot all be named. */
static void fence_chunk(chunk_t *c) {
    CUstream us[MAX_USERS + MAX_STREAMS];
    unsigned nu = 0;
    c->fenced = 0;
    if (gather_streams(&c, 1, us, &nu) || nu > MAX_USERS)
        return;
    if (c->in_ev && nu == MAX_USERS)
        return;
    for (unsigned i = 0; i < nu; i++) {
        evref_t *v = fence_ev(us[i]);
        if (!v)
            return;
        c->fence[c->nfence++] = v;
    }
    if (c->in_ev) { /* the copy that brought it in is not one of its users' streams */
        c->in_ev->refs++;
        c->fence[c->nfence++] = c->in_ev;
    }
    c->fenced = 1;
}

/* Waits for the copy that brought c in, if one may still run (before unmapping c without a
 * fence that covers it). */
void settle_in(chunk_t *c) {
    if (c->in_ev) {
        sync_event(c->in_ev->e);
        ev_drop(c->in_ev);
        c->in_ev = NULL;
    }
}

static int fence_done(const chunk_t *c) {
    if (!c->fenced)
        return 0;
    for (unsigned i = 0; i < c->nfence; i++)
        if (!ev_done(c->fence[i]))
            return 0;
    return 1;
}

/* A chunk that no live buffer uses any more: its memory goes back once its users are done. */
void chunk_release(chunk_t *c, CUstream free_stream) {
    cool(c);
    if (c->stage)
        stage_drop(c); /* its op will not come */
    /* A parameter word pointing into it no longer references a buffer. (A fast-path op that
     * still reads the old extent finds the chunk cold and takes the locked path.) */
    atomic_store_explicit(&c->ext_n, 0, memory_order_relaxed);
    if (c->out_ev) {
        /* Freed while its swap-out runs: the copy is one more user to wait for. */
        ret_remove(c);
        chunk_add_user(c, M.d2h);
        ev_drop(c->out_ev);
        c->out_ev = NULL;
    }
    c->queued = 0;
    lru_remove(c);
    if (c == M.slab_cur)
        M.slab_cur = NULL;
    if (c == M.slab_own)
        M.slab_own = NULL;
    if (c->state != C_RESIDENT && !c->aliased) {
        chunk_bury(c); /* nothing mapped: cannot fail */
        return;
    }
    if (free_stream)
        chunk_add_user(c, free_stream);
    if (M.ndying == M.cap_dying) {
        size_t nc = M.cap_dying ? M.cap_dying * 2 : 64;
        chunk_t **n = realloc(M.dying, nc * sizeof *n);
        if (!n) {
            /* No room to defer: wait now rather than unmap under running work. */
            settle_in(c);
            if (wait_chunks(&c, 1) == CUDA_SUCCESS)
                chunk_bury(c);
            return;
        }
        M.dying = n;
        M.cap_dying = nc;
    }
    c->dying = 1;
    c->when = M.serial;
    fence_chunk(c);
    M.dying[M.ndying++] = c;
}

/* Releases the memory of the dying chunks whose fences are done. With `block`, when none is:
 * waits for the oldest one's fence, or, when it has none, for the users of every unfenced one. */
CUresult reap_dying(int block) {
    size_t k = 0;
    unsigned freed = 0;
    for (size_t i = 0; i < M.ndying; i++) {
        chunk_t *c = M.dying[i];
        if (fence_done(c) && chunk_bury(c) == CUDA_SUCCESS)
            freed++;
        else
            M.dying[k++] = c;
    }
    M.ndying = k;
    if (freed || !block || !M.ndying)
        return CUDA_SUCCESS;
    chunk_t *c = M.dying[0];
    if (c->fenced) {
        for (unsigned i = 0; i < c->nfence; i++)
            sync_event(c->fence[i]->e);
        CUresult r = chunk_bury(c);
        if (r == CUDA_SUCCESS)
            memmove(&M.dying[0], &M.dying[1], --M.ndying * sizeof *M.dying);
        return r;
    }
    /* Gather the unfenced at the front, each list keeping its order (a stable partition in
     * place: an unfenced chunk moves down over the fenced ones before it). */
    k = 0;
    for (size_t i = 0; i < M.ndying; i++) {
        if (M.dying[i]->fenced)
            continue;
        chunk_t *u = M.dying[i];
        memmove(&M.dying[k + 1], &M.dying[k], (i - k) * sizeof *M.dying);
        M.dying[k++] = u;
    }
    size_t nun = k;
    CUresult r = wait_chunks(M.dying, nun);
    for (size_t i = 0; i < nun; i++)
        settle_in(M.dying[i]);
    size_t left = 0;
    for (size_t i = 0; i < M.ndying; i++) {
        if (i < nun && r == CUDA_SUCCESS && chunk_bury(M.dying[i]) == CUDA_SUCCESS)
            continue;
        M.dying[left++] = M.dying[i];
    }
    M.ndying = left;
    return r;
}
