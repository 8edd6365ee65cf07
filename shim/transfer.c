/* SPDX-License-Identifier: MIT */
/* transfer.c: the plan's transfers for replay.c: planned swap-outs on the device-to-host
 * stream, swap-ins queued for the worker, and dropping or discarding a buffer's chunks.
 *
 * Invariants: an action applies to the buffer at addr only while it is still serial `id` and
 * owns whole chunks (small buffers are left to demand residency); a chunk queued for the worker
 * has a job that will clear `queued`, or is unqueued; queued swap-ins get memory in the plan's
 * order, except the chunks of the op being issued (serve_op_chunks). Locking: callers hold
 * mem_lock (replay.c inside ooc_mem_begin/ooc_mem_end). Callers: replay.c, worker.c, resident.c
 * (ooc_mem_op_pin). */
#include "mem_int.h"

#include <limits.h>
#include <string.h>

/* ---- planned transfers (replay.c calls these with the residency lock held) ------------------ */

/* The buffer (addr, id) if it is still live and owns whole chunks; NULL otherwise (freed, or a
 * small buffer in a shared slab chunk, which is left to demand residency). */
buf_t *plan_buf(uintptr_t addr, uint64_t id) {
    buf_t *b = lookup(addr);
    return b && b->id == id && b->addr == addr && !b->small ? b : NULL;
}

chunk_t *plan_chunk(const buf_t *b, uint64_t i) {
    return chunk_find(((b->addr - M.va_base) >> M.shift) + i);
}

uint64_t buf_chunks(const buf_t *b) {
    return (b->size + M.chunk - 1) >> M.shift;
}

/* Takes b's chunks off the worker's queue: demand residency brings them in when an op needs them
 * (ops wait while a chunk they use is queued, so none may be left queued without a job). */
void unqueue_buffer(const buf_t *b) {
    for (uint64_t i = 0, n = buf_chunks(b); i < n; i++) {
        chunk_t *c = plan_chunk(b, i);
        if (c)
            c->queued = 0;
    }
}

unsigned ooc_mem_l_swapout(uintptr_t addr, uint64_t id, CUstream s) {
    buf_t *b = plan_buf(addr, id);
    if (!b || !M.worker_on)
        return 0;
    uint64_t n = buf_chunks(b), k = 0;
    if (grow(&M.op_tmp, &M.cap_tmp, n, sizeof *M.op_tmp) != 0)
        return 0;
    for (uint64_t i = 0; i < n; i++) {
        chunk_t *c = plan_chunk(b, i);
        if (c && c->state == C_RESIDENT && !c->dying && !c->out_ev && !c->hold)
            M.op_tmp[k++] = c;
    }
    if (k == 0)
        return 0;
    /* The copy follows the work of every stream that may use the chunks, the op just issued on
     * s included; when some cannot be named, demand residency will evict them later instead. */
    CUstream users[MAX_USERS + MAX_STREAMS + 1];
    unsigned nu = 0;
    if (gather_streams(M.op_tmp, k, users, &nu))
        return 0;
    int unknown = 0;
    add_user(users, &nu, &unknown, s);
    evref_t *out = ev_take();
    if (unknown || !out) {
        ev_drop(out);
        return 0;
    }
    CUresult r = CUDA_SUCCESS;
    for (unsigned u = 0; u < nu && r == CUDA_SUCCESS; u++) {
        evref_t *v = ev_take();
        r = v ? ooc_real.cuEventRecord(v->e, users[u]) : CUDA_ERROR_OUT_OF_MEMORY;
        if (r == CUDA_SUCCESS)
            r = ooc_real.cuStreamWaitEvent(M.d2h, v->e, 0);
        ev_drop(v);
    }
    for (uint64_t i = 0; i < k && r == CUDA_SUCCESS; i++)
        if (M.op_tmp[i]->in_ev)
            r = ooc_real.cuStreamWaitEvent(M.d2h, M.op_tmp[i]->in_ev->e, 0);
    /* The chunks copied out are M.op_tmp[0, done); one whose copy could not be issued stays
     * resident, as do those after it. */
    uint64_t done = 0;
    while (r == CUDA_SUCCESS && done < k) {
        chunk_t *c = M.op_tmp[done];
        if (!(c->host = host_slot()))
            break;
        if ((r = copy_out(c, M.d2h)) != CUDA_SUCCESS) {
            host_slot_put(c->host);
            c->host = NULL;
            break;
        }
        done++;
    }
    if (done && ooc_real.cuEventRecord(out->e, M.d2h) != CUDA_SUCCESS) {
        /* Without the event nothing can tell when the copies end: wait for them; the chunks stay
         * resident and the slots go back. */
        sync_stream(M.d2h);
        for (uint64_t i = 0; i < done; i++) {
            host_slot_put(M.op_tmp[i]->host);
            M.op_tmp[i]->host = NULL;
        }
        done = 0;
    }
    if (grow(&M.ret, &M.cap_ret, M.nret + done, sizeof *M.ret) != 0) {
        sync_stream(M.d2h);
        for (uint64_t i = 0; i < done; i++) {
            host_slot_put(M.op_tmp[i]->host);
            M.op_tmp[i]->host = NULL;
        }
        done = 0;
    }
    for (uint64_t i = 0; i < done; i++) {
        chunk_t *c = M.op_tmp[i];
        out->refs++;
        c->out_ev = out;
        c->when = M.serial;
        lru_remove(c);
        M.ret[M.nret++] = c;
    }
    ev_drop(out);
    if (done) {
        if (host_serves())
            serve_queued(); /* the queued swap-ins take the memory being vacated, in order */
        ooc_stats_add(OOC_STAT_swap_outs, done);
        for (uint64_t i = 0; i < done; i++)
            ooc_stats_add(OOC_STAT_swap_out_bytes, chunk_used(M.op_tmp[i]));
        ooc_stats_add(OOC_STAT_planned_swap_outs, 1);
        pthread_cond_signal(&M.work_cv);
    }
    return (unsigned)done;
}

/* Memory for a swap-in issued now in stream order: free, made under the budget, a freed
 * buffer's kept mapped (warm.c: handed on after its last users' work, warm_release), a retiring
 * chunk's (retire_steal) or, for the op being issued (`dying_ok`), a dying chunk's
 * (dying_steal); *from: the chunk it was taken from (NULL: none), *warm: whether it was a freed
 * buffer's. NULL when there is none.
 * A freed buffer's memory before a retiring chunk's: the plan counts it free from the free on,
 * and the work it waits for (the buffer's last users) is done or nearly, where a copy out may
 * sit behind the others queued on the device-to-host stream. Kept for the next allocations
 * instead, freed buffers held a third of the budget in `mlp --layers 12` at 1/4 (13 of 33
 * chunks) while the swap-ins that the plan gives that memory to waited for copies out. */
static phys_t *phys_take(chunk_t **from, int *warm, int dying_ok) {
    *from = NULL;
    *warm = 0;
    if (!M.phys_free)
        (void)phys_new(); /* while under budget */
    if (M.phys_free)
        return phys_pop();
    if (warm_ready() && warm_release(1) == CUDA_SUCCESS && M.phys_free) {
        *warm = 1;
        return phys_pop();
    }
    phys_t *p = retire_steal(from);
    return p || !dying_ok ? p : dying_steal(from);
}

/* Orders stream st (a copy in's) after the work that may still use the memory taken from `from`
 * (its copy out, or its fences once its buffer was freed). */
static CUresult wait_from(CUstream st, const chunk_t *from) {
    if (!from)
        return CUDA_SUCCESS;
    if (!from->dying)
        return ooc_real.cuStreamWaitEvent(st, from->out_ev->e, 0);
    CUresult r = CUDA_SUCCESS;
    for (unsigned i = 0; i < from->nfence && r == CUDA_SUCCESS; i++)
        r = ooc_real.cuStreamWaitEvent(st, from->fence[i]->e, 0);
    return r;
}

/* Gives back p, taken for a swap-in that was not issued: to the retiring chunk it was taken
 * from, or to the free list. */
static void phys_back(phys_t *p, chunk_t *from) {
    if (from) {
        retire_unsteal(p, from);
        return;
    }
    phys_push(p);
}

/* A planned swap-in of the swapped chunk c issued now by the host, in stream order: the chunk is
 * mapped at once (to memory a swap-out may still be copying out of, through the other chunk's
 * address: a physical chunk may be mapped at two addresses), its copy in is queued on the
 * host-to-device stream after that swap-out's event, and the ops that use c wait for the copy
 * on their streams (in_ev). Nothing waits on the host; the worker unmaps the vacated address
 * once its copy is done. Safe mode is left to the worker: there the chunk's address shows its
 * host copy (aliased), and removing that alias waits for the streams that may reach it unseen.
 * `dying_ok` (the op being issued needs c now): memory of a freed buffer whose work is still
 * queued may be taken too, the copy in ordered after that work's fences (dying_steal).
 * 1 when issued; 0 when it was not (no memory now, or a failure): the caller queues it. */
static int swapin_now(chunk_t *c, int dying_ok) {
    if (M.safe || c->state != C_SWAPPED || c->aliased || !c->host || c->out_ev)
        return 0;
    chunk_t *from = NULL;
    int warm = 0;
    phys_t *p = phys_take(&from, &warm, dying_ok);
    if (!p)
        return 0;
    CUresult r = wait_from(M.h2d, from);
    if (r == CUDA_SUCCESS)
        r = map_phys(c, p);
    if (r != CUDA_SUCCESS) {
        phys_back(p, from);
        return 0;
    }
    evref_t *v = ev_take();
    r = v ? copy_in(c, M.h2d) : CUDA_ERROR_OUT_OF_MEMORY;
    if (r == CUDA_SUCCESS)
        r = ooc_real.cuEventRecord(v->e, M.h2d);
    if (r != CUDA_SUCCESS) {
        /* The host copy stays the data; the memory goes back once nothing can write it. */
        ev_drop(v);
        sync_stream(M.h2d);
        if (vmm_unmap(chunk_addr(c)) == CUDA_SUCCESS) {
            c->phys = NULL;
            phys_back(p, from);
            return 0;
        }
        /* Still mapped: it keeps the memory, and its host copy (unqueued: demand residency). */
        OOC_LOG_E("a planned swap-in failed and its chunk at %#llx could not be unmapped",
                  (unsigned long long)chunk_addr(c));
    }
    c->state = C_RESIDENT;
    c->queued = 0;
    if (r == CUDA_SUCCESS) {
        ev_drop(c->in_ev); /* map_phys's, which the copy followed */
        c->in_ev = v;
        limbo_put(c->host, v);
        c->host = NULL;
        count_prefetch(c, from != NULL);
        ooc_stats_add(OOC_STAT_prefetch_warm, (uint64_t)warm);
    }
    lru_push(c);
    return 1;
}

/* A planned swap-in of c, whose own swap-out still copies out and whose memory another chunk
 * took, issued now without waiting for that copy (OOC_REMAP_GATE, gate.c): new memory is taken
 * in stream order as swapin_now does, the copy in is queued on the gates' own host-to-device
 * stream behind the copy out and a gate, and the mapping thread moves c's address to the new memory
 * once the copy out is done, then opens the gate. c is resident from here (its address shows the
 * new memory to every op that waits for its copy: in_ev). 1 when issued; 0 when not (the caller
 * waits for the copy out instead). */
static int swapin_gated(chunk_t *c) {
    if (!M.remap_gate || !gate_on() || M.safe || !c->out_ev || !c->stolen || c->phys || c->hold ||
        !c->host || ev_done(c->out_ev) || gate_reserve() != 0)
        return 0;
    chunk_t *from = NULL;
    int warm = 0;
    phys_t *p = phys_take(&from, &warm, 1);
    if (!p)
        return 0;
    uint32_t t = 0;
    CUstream gs = gate_stream(); /* its own: a closed gate holds back no other swap-in */
    CUresult r = ooc_real.cuStreamWaitEvent(gs, c->out_ev->e, 0);
    if (r == CUDA_SUCCESS)
        r = wait_from(gs, from);
    if (r == CUDA_SUCCESS)
        r = phys_ordered(p, gs); /* memory handed on early (warm.c) */
    if (r == CUDA_SUCCESS)
        r = gate_wait_on(gs, &t);
    if (r != CUDA_SUCCESS) {
        phys_back(p, from);
        return 0;
    }
    evref_t *v = ev_take();
    r = v ? copy_in(c, gs) : CUDA_ERROR_OUT_OF_MEMORY;
    if (r != CUDA_SUCCESS) {
        /* Nothing behind the gate: it only opens; c waits for its copy out as before. */
        gate_push(t, c->out_ev, chunk_addr(c), 0);
        ev_drop(v);
        phys_back(p, from);
        return 0;
    }
    gate_push(t, c->out_ev, chunk_addr(c), p->h);
    if (ooc_real.cuEventRecord(v->e, gs) != CUDA_SUCCESS) {
        sync_stream(gs); /* the gate opens once the remap is done: then the copy runs */
        ev_drop(v);
        v = NULL;
    }
    ret_remove(c);
    ev_drop(c->out_ev); /* the job holds its own reference */
    c->out_ev = NULL;
    c->stolen = 0;
    c->phys = p;
    c->since = M.serial;
    c->discard = 0;
    c->queued = 0;
    c->in_ev = v;
    if (v)
        limbo_put(c->host, v);
    else
        host_slot_put(c->host);
    c->host = NULL;
    lru_push(c);
    count_prefetch(c, from != NULL);
    ooc_stats_add(OOC_STAT_prefetch_warm, (uint64_t)warm);
    ooc_stats_add(OOC_STAT_prefetch_gated, 1);
    return 1;
}

/* Whether a queued planned swap-in may be issued ahead of its op now: fewer than M.ahead_max
 * chunks issued that way are still copying in. The memory a swap-in takes is then taken shortly
 * before the link can use it, as the plan's simulator takes it when the copy starts; taken as
 * soon as the host got there, far ahead of the device, it was memory the plan still had free
 * for the ops in between (their new buffers found none and evicted what the plan keeps). Outside
 * safe mode (there the worker issues each swap-in when the device reaches its point). */
int ahead_room(void) {
    if (M.safe)
        return 1;
    unsigned k = 0;
    while (k < M.nahead && ev_done(M.ahead[k])) /* the stream runs them in order */
        ev_drop(M.ahead[k++]);
    if (k) {
        memmove(M.ahead, M.ahead + k, (M.nahead - k) * sizeof *M.ahead);
        M.nahead -= k;
        ooc_stats_gauge_sub(OOC_STAT_ahead_copies, k);
    }
    return M.nahead < M.ahead_max;
}

/* Notes the copy (its event v) of a chunk just issued ahead of its op. */
void ahead_add(evref_t *v) {
    if (M.safe || !v || M.nahead == AHEAD_CAP)
        return;
    v->refs++;
    M.ahead[M.nahead++] = v;
    ooc_stats_gauge_add(OOC_STAT_ahead_copies, 1);
}

/* Whether the host issues queued swap-ins itself (serve_queued): only while the worker waits for
 * the device. Otherwise the worker does, in its loop, so that their mapping calls (tens of
 * microseconds each) are not made on the program's thread, which would then run less far ahead
 * of the device. */
int host_serves(void) {
    return M.worker_blocked;
}

/* Whether job j's buffer still has chunks queued. */
int job_queued(job_t j) {
    buf_t *b = plan_buf(j.addr, j.id);
    for (uint64_t i = 0, n = b ? buf_chunks(b) : 0; i < n; i++) {
        chunk_t *c = plan_chunk(b, i);
        if (c && c->queued == j.seq)
            return 1;
    }
    return 0;
}

/* A planned swap-in of c, whose own planned swap-out is still under way, issued now by the host
 * (outside safe mode). While its memory is still its own (no later swap-in or new buffer took
 * it), the swap-out is cancelled: the bytes are still there, and everything the host issued
 * before this point, in the plan's order, found other memory. 1 when done (c is resident again);
 * 0 when its memory went to another chunk: then c must wait for its copy out to end before it
 * can be brought back (the worker does that), and the swap-ins planned after it wait their turn,
 * as the plan's copy-in engine has them, rather than take the memory it will need. */
static int reclaim_retiring(chunk_t *c) {
    if (M.safe || !c->out_ev || c->stolen || !c->phys || c->hold)
        return 0;
    retire_cancel(c);
    lru_push(c);
    c->queued = 0;
    ooc_stats_add(OOC_STAT_prefetches, 1);
    return 1;
}

/* The queued chunks of the op being issued (M.op_chunks) that the host can bring in now, ahead of
 * the swap-ins queued before them: the op needs them first, and waiting for the queue's turn
 * would block the host (the worker serves the queue in the plan's order, where the swap-ins
 * queued first are for later ops). One whose own swap-out still runs and whose memory nothing
 * took is reclaimed; one whose swap-out finished after its memory went elsewhere is finished
 * (retire_done: it alone, the older ones left to the worker) and, swapped now, is
 * issued in stream order (swapin_now) as any swapped one. Outside safe mode. */
void serve_op_chunks(void) {
    if (M.safe)
        return; /* (with OOC_REMAP_GATE=1, resident.c's op_pin issues them behind a gate) */
    for (size_t i = 0; i < M.nop; i++) {
        chunk_t *c = M.op_chunks[i];
        if (!c->queued || reclaim_retiring(c) || swapin_gated(c))
            continue;
        if (c->out_ev && ev_done(c->out_ev))
            retire_done(c);
        (void)swapin_now(c, 1); /* which refuses what it cannot do now */
    }
}

/* The op being issued has queued chunks whose own swap-outs still run, their memory taken by
 * other swap-ins (outside safe mode): only the end of those copies lets them come back (their
 * addresses cannot be remapped before), and the worker would get to them only in the queue's
 * order. Waits without the lock for the newest of those copies (the retiring list is in the
 * stream's order, which runs them in order). 1 when it waited: the lock was released,
 * everything must be looked up again. */
int wait_op_swapouts(void) {
    if (M.safe)
        return 0;
    evref_t *v = NULL;
    unsigned n = 0;
    for (size_t k = M.nret; k-- > 0;) {
        chunk_t *r = M.ret[k];
        if (r->pin != M.serial || !r->queued || ev_done(r->out_ev))
            continue; /* pin: one of the op's chunks (just pinned) */
        v = v ? v : r->out_ev;
        n++;
    }
    if (!v)
        return 0;
    ooc_stats_add(OOC_STAT_prefetch_own_out, n);
    v->refs++;
    mem_unlock();
    unsigned why = wait_for(WAIT_OUT);
    sync_event(v->e);
    wait_for(why);
    mem_lock_take();
    ev_drop(v);
    return 1;
}

/* Memory a planned swap-in may take now: physical chunks free or not yet made under the budget,
 * and retiring chunks whose memory nothing took yet (retire_steal). */
static uint64_t spare_chunks(void) {
    uint64_t n = M.phys_made < M.budget_chunks ? M.budget_chunks - M.phys_made : 0;
    n += M.warm_chunks; /* phys_take hands them on */
    for (phys_t *p = M.phys_free; p; p = p->next)
        n++;
    for (size_t i = 0; i < M.nret; i++)
        n += retire_may_give(M.ret[i]);
    return n;
}

/* One pass of serve_queued over the queue: the chunks queued before the current one that only
 * the worker can bring back (their own swap-outs still run and their memory went elsewhere),
 * which the memory that is there must still cover; and how many more swap-ins it may issue. */
typedef struct {
    uint64_t owed;
    unsigned left;
} serve_t;

/* Issues the queued chunk c now if it can (outside safe mode), in the plan's order (sv). 1 when
 * c was issued (or needs nothing); 0 when it waits its turn. A chunk whose own swap-out runs is
 * reclaimed or added to sv->owed (and counts as waiting). */
static int serve_chunk(chunk_t *c, serve_t *sv) {
    if (c->out_ev) {
        if (reclaim_retiring(c))
            return 1;
        sv->owed++;
        return 0;
    }
    if (c->state != C_SWAPPED)
        return 1;
    if (!sv->left || (sv->owed && spare_chunks() <= sv->owed) || !ahead_room() || !swapin_now(c, 0))
        return 0;
    ahead_add(c->in_ev);
    sv->left--;
    return 1;
}

/* The queued swap-ins of job j's buffer that can be issued now; 1 when one could not be for
 * want of memory (those after it wait their turn). */
static int serve_job(job_t j, serve_t *sv) {
    buf_t *b = plan_buf(j.addr, j.id);
    for (uint64_t i = 0, n = b ? buf_chunks(b) : 0; i < n; i++) {
        chunk_t *c = plan_chunk(b, i);
        if (c && c->queued == j.seq && !serve_chunk(c, sv) && !c->out_ev)
            return 1;
    }
    return 0;
}

/* Outside safe mode: the queued planned swap-ins issued now, in the plan's order (the worker's
 * current job first, then the ring), as far as memory goes: memory being vacated goes to the
 * swap-in planned first, as the plan has it, rather than to a later one that happens to be
 * issued when the memory is there. A chunk that only the worker can bring back (its own swap-out
 * still runs, its memory taken) does not hold up those after it while memory for it remains.
 * Called when memory may have come (a planned swap-out was issued, an op begins) and before a
 * later swap-in is issued. -1 when a queued swap-in is still waiting for memory; else how many
 * queued chunks are left to the worker (the memory they will need). */
static long serve_all(serve_t *sv) {
    if (M.safe || !M.worker_on || (!M.job_busy && !M.njobs))
        return 0;
    if (M.job_busy && serve_job(M.job_cur, sv))
        return -1;
    for (size_t k = 0; k < M.njobs; k++)
        if (serve_job(M.jobs[M.job_head + k], sv))
            return -1;
    return (long)sv->owed;
}

long serve_queued(void) {
    serve_t sv = {0, UINT_MAX};
    return serve_all(&sv);
}

/* As serve_queued, issuing at most `max` chunks (each a mapping of tens of microseconds, made
 * while holding mem_lock): 1 when it stopped there, and more may be issued after the caller let
 * a waiting program thread have the lock (the worker, mem_yield). */
int serve_queued_some(unsigned max) {
    serve_t sv = {0, max};
    (void)serve_all(&sv);
    return sv.left == 0;
}

unsigned ooc_mem_l_prefetch(uintptr_t addr, uint64_t id, CUstream s) {
    buf_t *b = plan_buf(addr, id);
    if (!b || !M.worker_on)
        return 0;
    if (M.safe && M.remap_gate) {
        /* Safe mode with OOC_REMAP_GATE=1: the buffer's swapped chunks issued here, at the plan's
         * point, behind one gate (their memory handed over from the work issued so far: the
         * copies start when the device gets here, as the plan has it); the rest, if no memory
         * comes, are queued for the worker below. */
        uint64_t n = buf_chunks(b), k = 0;
        if (grow(&M.op_tmp, &M.cap_tmp, n, sizeof *M.op_tmp) == 0) {
            for (uint64_t i = 0; i < n; i++) {
                chunk_t *c = plan_chunk(b, i);
                if (c && c->state == C_SWAPPED && !c->queued)
                    M.op_tmp[k++] = c;
            }
            /* (With OOC_SAFE_STAGE=1 staged instead, no gate: moved at their op, stage.c.) */
            size_t st = M.stage ? stage_some(M.op_tmp, k) : 0;
            (void)swapins_behind_gate(M.op_tmp + st, k - st, 1);
        }
    }
    long left = host_serves() ? serve_queued() : -1; /* else the worker will, in order */
    int waiting = left < 0;
    serve_t sv = {left > 0 ? (uint64_t)left : 0, UINT_MAX};
    unsigned q = 0;
    uint32_t seq = M.job_seq + 1 ? M.job_seq + 1 : 1;
    for (uint64_t i = 0, n = buf_chunks(b); i < n; i++) {
        chunk_t *c = plan_chunk(b, i);
        if (!c || c->stage)
            continue; /* (a staged one is in memory already: it moves at its op) */
        /* A chunk whose swap-out is still under way keeps its memory when nothing took it
         * (reclaim_retiring); otherwise it is queued for the worker, which brings it back once
         * the copy out is done (serve_chunk). */
        if ((c->state == C_SWAPPED || c->out_ev) && !c->queued && !waiting) {
            if (serve_chunk(c, &sv))
                continue;
            if (!c->out_ev)
                waiting = 1; /* the rest of the buffer waits its turn too */
        }
        if ((c->out_ev || c->state == C_SWAPPED) && !c->queued) {
            cool(c); /* it is not hot (not resident, or retiring): this only keeps it so */
            c->queued = seq;
            q++;
        }
    }
    if (!q)
        return 0;
    if (M.job_head && M.job_head + M.njobs == M.cap_jobs) {
        memmove(M.jobs, M.jobs + M.job_head, M.njobs * sizeof *M.jobs);
        M.job_head = 0;
    }
    if (grow(&M.jobs, &M.cap_jobs, M.job_head + M.njobs + 1, sizeof *M.jobs) != 0) {
        unqueue_buffer(b);
        return 0;
    }
    M.job_seq = seq;
    M.jobs[M.job_head + M.njobs++] = (job_t){addr, id, fence_ev(s), seq};
    pthread_cond_signal(&M.work_cv);
    return q;
}

void ooc_mem_l_drop(uintptr_t addr, uint64_t id) {
    buf_t *b = plan_buf(addr, id);
    if (!b)
        return;
    for (uint64_t i = 0, n = buf_chunks(b); i < n; i++) {
        chunk_t *c = plan_chunk(b, i);
        if (c && c->state == C_RESIDENT && !c->dying && !c->out_ev)
            lru_push_tail(c);
    }
}

int ooc_mem_l_discard(uintptr_t addr, uint64_t id, int on) {
    buf_t *b = plan_buf(addr, id);
    if (!b)
        return 0;
    for (uint64_t i = 0, n = buf_chunks(b); i < n; i++) {
        chunk_t *c = plan_chunk(b, i);
        if (!c)
            continue;
        if (on)
            cool(c); /* a fast-path op must not use bytes that eviction may drop */
        c->discard = on && c->state == C_RESIDENT && !c->dying && !c->out_ev;
        if (c->discard)
            lru_push_tail(c);
    }
    return 1;
}

int ooc_mem_l_lost(uintptr_t addr, uint64_t id) {
    buf_t *b = plan_buf(addr, id);
    if (!b)
        return 1;
    for (uint64_t i = 0, n = buf_chunks(b); i < n; i++) {
        chunk_t *c = plan_chunk(b, i);
        if (!c || c->state == C_EMPTY)
            return 1;
    }
    return 0;
}
