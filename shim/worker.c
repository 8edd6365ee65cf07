/* SPDX-License-Identifier: MIT */
/* worker.c: the replay worker thread, which performs the planned swap-ins queued by
 * transfer.c (outside safe mode in stream order, serve_queued, so that their mapping calls are
 * not made on the program's thread) and finishes the planned swap-outs whose copies are done.
 *
 * Invariants: the worker holds mem_lock except while it waits for an event, on work_cv, or lets
 * a program thread that waits for the lock go first (mem_yield); after each of these it looks
 * everything up again. It never evicts what the plan keeps: a swap-in with no
 * free memory coming is left to demand residency. Callers: replay.c (ooc_mem_replay_init);
 * mem.c stops it at shutdown. */
#include "mem_int.h"

#include <math.h>
#include <stdio.h>

/* The swap-ins the worker issues in stream order between two chances for a program thread to
 * take mem_lock (mem_yield): each is a map and a set-access call, about 50 us. */
#define WORKER_SERVE_BATCH 2

/* The worker, holding mem_lock: waits without the lock for `v` (may be NULL) and, in safe mode,
 * for the work issued so far on the streams that may reach the chunks `cs[0, n)` unseen, so that
 * the wait_chunks that follows under the lock has little left to wait for. The lock is released
 * meanwhile: the chunks may be gone on return. */
static void worker_wait(evref_t *v, chunk_t *const *cs, size_t n) {
    CUstream users[MAX_USERS + MAX_STREAMS];
    unsigned nu = 0;
    evref_t *pre[MAX_USERS + MAX_STREAMS];
    unsigned npre = 0;
    uint64_t epoch = 0;
    int all_pre = 0;
    if (v)
        v->refs++;
    if (n && M.safe && !gather_streams(cs, n, users, &nu)) {
        epoch = issue_epoch();
        all_pre = 1;
        for (unsigned u = 0; u < nu; u++) {
            evref_t *e = ev_take();
            if (e && ooc_real.cuEventRecord(e->e, users[u]) == CUDA_SUCCESS) {
                pre[npre++] = e;
            } else {
                ev_drop(e);
                all_pre = 0;
            }
        }
    }
    M.worker_blocked = 1; /* meanwhile the host issues what it can (host_serves) */
    mem_unlock();
    if (v)
        sync_event(v->e);
    for (unsigned i = 0; i < npre; i++)
        all_pre &= sync_event(pre[i]->e) == CUDA_SUCCESS;
    mem_lock_take();
    M.worker_blocked = 0;
    if (all_pre) /* if nothing was issued meanwhile, the wait under the lock has nothing to do */
        note_waited(epoch, users, nu, 0);
    for (unsigned i = 0; i < npre; i++)
        ev_drop(pre[i]);
    ev_drop(v);
}

/* The worker: waits for the oldest swap-out's copy, then finishes what is done. In safe mode
 * the wait also covers the streams that may reach `c` (may be NULL) unseen: the chunk that needs
 * the memory, whose alias goes next, so that one wait serves both remaps. */
static void worker_wait_retiree(chunk_t *c) {
    chunk_t *cs[2] = {M.ret[0], c};
    worker_wait(M.ret[0]->out_ev, cs, c ? 2 : 1);
    retire_poll(0);
}

/* The worker, outside safe mode, between two steps of its work: lets a program thread that waits
 * for mem_lock have it first (mem_yield), then issues a few queued swap-ins in stream order
 * (serve_queued_some) and wakes an op that waits for them. 1 when the caller must look everything
 * up again and come back: the lock was released, or more may be issued. (Not in safe mode: there
 * each op the program issues meanwhile would have the next alias removal wait for its streams
 * again, and swap-ins are not issued in stream order.) */
static int worker_serve(void) {
    if (M.safe)
        return 0;
    if (mem_yield())
        return 1;
    if (!M.njobs && !M.job_busy)
        return 0;
    int more = serve_queued_some(WORKER_SERVE_BATCH);
    if (M.op_waiting)
        pthread_cond_broadcast(&M.done_cv);
    return more;
}

/* The worker: the swap-in of one queued buffer, chunk by chunk, each copy on the host-to-device
 * stream followed by its own event (ops that use the chunk wait for it on their streams). A
 * chunk needs a free physical chunk: when there is none it waits for planned swap-outs to
 * finish, and when none is under way it leaves the rest to demand residency rather than evict
 * what the plan keeps. Caller holds mem_lock; it is released while waiting. */
static void worker_swapin(job_t j) {
    /* Safe mode: whether the streams that may reach the chunk were waited for since the program
     * could last issue work unseen (a wait that covered them, or the lock held since a locked
     * wait): the wait without the lock before removing its alias would add nothing. */
    int waited = 0;
    for (;;) {
        if (worker_serve())
            continue; /* look again */
        buf_t *b = plan_buf(j.addr, j.id);
        if (!b)
            return;
        uint64_t n = buf_chunks(b), i = 0;
        chunk_t *c = NULL;
        for (; i < n && !c; i++) {
            chunk_t *x = plan_chunk(b, i);
            if (x && x->queued == j.seq)
                c = x;
        }
        if (!c)
            return;
        if (c->out_ev) {
            /* Its swap-out was under way when the host planned the swap-in. The plan has the
             * copy out end, its memory serve others meanwhile, and the copy in follow, and so
             * does the worker: it waits for the copy out, unmaps the chunk (with the older
             * retirees), and brings it in below. Keeping it mapped instead would hold memory
             * that the plan gives to other buffers until then. */
            if (!ev_done(c->out_ev)) {
                worker_wait(c->out_ev, NULL, 0);
                waited = 0;
                continue; /* the lock was released: look again */
            }
            retire_done(c);
        }
        if (c->state != C_SWAPPED || c->stage) {
            c->queued = 0;
            continue;
        }
        /* Safe mode: an aliased chunk is staged (stage.c): copied in beside its alias, with no
         * wait for the streams; it moves at its first use. */
        int stage = M.safe && M.stage && c->aliased && stage_allowed(c);
        if (!M.phys_free && M.phys_made >= M.budget_chunks && !M.ndying && !warm_ready() &&
            !any_discard()) {
            if (M.nret) {
                if (retire_oldest_behind_gate())
                    continue; /* its memory is free now, in stream order */
                worker_wait_retiree(M.safe && c->aliased && !stage ? c : NULL);
                waited = !stage; /* c's streams were waited for with the retiree's */
                continue;
            }
            if (!M.op_waiting && !M.worker_stop) {
                /* Memory may still come before the op that needs it: the plan has the host
                 * issue more swap-outs before that op (its memory may also go to c from there,
                 * serve_queued). Wait for one, or for that op (which then waits for this). */
                mem_wait(&M.work_cv);
                waited = 0;
                continue;
            }
            unqueue_buffer(b);
            ooc_stats_add(OOC_STAT_prefetch_no_memory, 1);
            if (OOC_LOG_ENABLED(OOC_LOG_DEBUG)) {
                char line[600];
                size_t o = 0;
                unsigned ns = 0;
                for (chunk_t *x = M.lru.next; x != &M.lru && o + 24 < sizeof line; x = x->next) {
                    if (x->slab)
                        ns++;
                    else
                        o += (size_t)snprintf(line + o, sizeof line - o, " %llu",
                                              (unsigned long long)(x->owner ? x->owner->id : 0));
                }
                line[o] = 0;
                OOC_LOG_D("resident: %u slab chunks; chunks of buffers:%s", ns, line);
            }
            OOC_LOG_D("op %llu: no memory coming for the planned swap-in of buffer %llu "
                      "(resident %llu)",
                      (unsigned long long)M.serial, (unsigned long long)j.id,
                      (unsigned long long)M.resident);
            return;
        }
        /* Safe mode with OOC_REMAP_GATE=1: the alias goes behind a gate on the device instead
         * (swapin_behind_gate): nothing to wait for here. */
        int gated = M.safe && c->aliased && !stage && M.remap_gate && gate_on();
        if (M.safe && c->aliased && !waited && !stage && !gated) {
            waited = 1;
            worker_wait(NULL, &c, 1); /* then look again: the lock was released */
            continue;
        }
        CUresult r = need_phys(1); /* a new physical chunk while under budget */
        if (r == CUDA_SUCCESS && !ahead_room()) {
            /* as many chunks copying in ahead of their ops as the link needs queued: this one
             * takes its memory once the oldest is done (transfer.c, ahead_room; need_phys may
             * have let the lock go, so this is looked at after it) */
            worker_wait(M.ahead[0], NULL, 0);
            waited = 0;
            continue;
        }
        if (r == CUDA_SUCCESS && stage && stage_in(c) == CUDA_SUCCESS) {
            c->queued = 0;
            ooc_stats_add(OOC_STAT_prefetches, 1);
            continue;
        }
        if (r == CUDA_SUCCESS && gated && swapin_behind_gate(c, 1))
            continue;
        /* (Not staged, e.g. no spare address: in at its own address, its streams waited for.) */
        if (r == CUDA_SUCCESS && M.safe && c->aliased && (r = wait_chunks(&c, 1)) == CUDA_SUCCESS) {
            waited = 1; /* the lock stays held until the next chunk */
            r = unalias_chunk(c);
        }
        if (r == CUDA_SUCCESS)
            r = map_chunk(c);
        if (r != CUDA_SUCCESS) {
            c->queued = 0;
            continue;
        }
        evref_t *v = ev_take();
        r = copy_in(c, M.h2d);
        if (r == CUDA_SUCCESS && v)
            r = ooc_real.cuEventRecord(v->e, M.h2d);
        else if (r == CUDA_SUCCESS)
            r = sync_stream(M.h2d);
        if (r != CUDA_SUCCESS) {
            /* The host copy stays; the physical chunk goes back (the copy may not have run). */
            sync_stream(M.h2d);
            ev_drop(v);
            if (unmap_failed_copy_in(c) != CUDA_SUCCESS)
                c->state = C_RESIDENT; /* mapped: demand residency cannot tell; keep the data */
            unqueue_buffer(b);         /* the rest of the buffer too: demand residency retries it */
            return;
        }
        c->state = C_RESIDENT;
        c->queued = 0;
        if (v) {
            if (M.safe)
                fill_set(FILL_WORKER, v);
            ev_drop(c->in_ev); /* map_phys's, which the copy followed */
            c->in_ev = v;
            ahead_add(v);
            limbo_put(c->host, v);
        } else {
            host_slot_put(c->host);
        }
        c->host = NULL;
        lru_push(c);
        count_prefetch(c, 0);
    }
}

static void *worker_main(void *arg) {
    (void)arg;
    ooc_real.cuCtxSetCurrent(M.ctx);
    mem_on_worker();
    mem_lock_take();
    while (!M.worker_stop) {
        if (worker_serve())
            continue; /* worker_stop may be set, the jobs changed */
        if (M.njobs) {
            job_t j = M.jobs[M.job_head++];
            if (--M.njobs == 0)
                M.job_head = 0;
            M.job_cur = j;
            M.job_busy = 1;
            if (j.gate && job_queued(j))
                worker_wait(j.gate, NULL, 0); /* the plan's point, in device time */
            ev_drop(j.gate);
            worker_swapin(j);
            M.job_busy = 0;
            pthread_cond_broadcast(&M.done_cv);
            continue;
        }
        if (M.nlimbo)
            limbo_poll();
        /* (Safe mode with the gate too, as soon as their copies are done, in batches: until
         * its alias goes in, a write the shim cannot see into a chunk copied out lands in
         * memory about to be given up; waiting for memory to be needed lost such writes.) */
        if (M.nret) {
            if (!retire_poll(0))
                worker_wait_retiree(NULL);
            continue;
        }
        mem_wait(&M.work_cv);
    }
    mem_unlock();
    return NULL;
}

int ooc_mem_replay_init(double h2d_bps) {
    mem_lock_take();
    int rc = 0;
    double link = h2d_bps > 0 ? h2d_bps * AHEAD_NS / 1e9 / (double)M.chunk : 0;
    M.ahead_max = link > AHEAD_CAP   ? AHEAD_CAP
                  : link > AHEAD_MIN ? (unsigned)ceil(link)
                                     : AHEAD_MIN;
    if (M.ready && !M.worker_on) {
        CUcontext prev = NULL;
        ooc_real.cuCtxGetCurrent(&prev);
        ooc_real.cuCtxSetCurrent(M.ctx);
        if (ooc_real.cuStreamCreate(&M.h2d, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS ||
            ooc_real.cuStreamCreate(&M.d2h, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) {
            rc = -1;
        } else {
            pthread_cond_init(&M.work_cv, NULL);
            pthread_cond_init(&M.done_cv, NULL);
            if (pthread_create(&M.worker, NULL, worker_main, NULL) != 0) {
                pthread_cond_destroy(&M.work_cv);
                pthread_cond_destroy(&M.done_cv);
                rc = -1;
            }
        }
        if (rc != 0) {
            if (M.h2d)
                ooc_real.cuStreamDestroy_v2(M.h2d);
            if (M.d2h)
                ooc_real.cuStreamDestroy_v2(M.d2h);
            M.h2d = M.d2h = NULL;
        } else {
            M.worker_on = 1;
            if (M.remap_gate && gate_start() != 0)
                OOC_LOG_W("OOC_REMAP_GATE=1: no pinned host word for the gates; the program's "
                          "thread waits for copies out instead");
        }
        ooc_real.cuCtxSetCurrent(prev);
    }
    mem_unlock();
    return rc;
}
