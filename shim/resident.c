/* SPDX-License-Identifier: MIT */
/* resident.c: residency on demand: before an op is issued every chunk it references is made
 * resident, evicting least recently used chunks (CLOCK second chance) when the budget is full.
 *
 * Invariants: ooc_mem_begin takes mem_lock and ooc_mem_end releases it, so no eviction slips
 * between an op's residency check and its submission; the op's chunks are pinned (pin ==
 * M.serial) and never evicted for it; resident chunks never exceed the budget. A chunk is made
 * hot (set_hot) only when the fast path may issue ops on it. Callers: op.c, which runs the
 * phases ooc_mem_op_pin, _resident, _issued and _release around the plan's actions (this file
 * never calls up into replay or record); recompute.c and replay.c (ooc_mem_begin/end for the
 * shim's own ops); record.c (ooc_mem_op_buffers), replay.c (ooc_mem_l_include); worker.c,
 * external.c and bandwidth.c (need_phys). */
#include "mem_int.h"

#include <stdlib.h>
#include <string.h>

/* Is some resident chunk's memory given up by the plan (need_phys takes it first)? */
int any_discard(void) {
    for (chunk_t *c = M.lru.prev; c != &M.lru; c = c->prev)
        if (c->discard && c->pin != M.serial && !c->hold)
            return 1;
    return 0;
}

/* Takes the victims' memory back: waits for their users, copies them out (those whose bytes
 * the plan gave up are not copied), unmaps them. Caller holds mem_lock. */
static CUresult evict(chunk_t **victims, unsigned nv) {
    CUresult r = wait_chunks(victims, nv);
    if (r != CUDA_SUCCESS)
        return r;
    for (unsigned i = 0; i < nv; i++)
        settle_in(victims[i]); /* the copy out must not read what the copy in still writes */
    for (unsigned i = 0; i < nv && r == CUDA_SUCCESS; i++) {
        if (victims[i]->discard)
            continue; /* its bytes will be rebuilt: nothing to keep */
        victims[i]->host = host_slot();
        if (!victims[i]->host)
            r = CUDA_ERROR_OUT_OF_MEMORY;
        else
            r = copy_out(victims[i], M.swap);
    }
    if (r == CUDA_SUCCESS) {
        unsigned why = wait_for(WAIT_OUT);
        r = sync_stream(M.swap);
        wait_for(why);
    }
    if (r != CUDA_SUCCESS) {
        /* The victims stay resident with their data; nothing was unmapped. */
        for (unsigned i = 0; i < nv; i++) {
            host_slot_put(victims[i]->host);
            victims[i]->host = NULL;
        }
        return r;
    }
    for (unsigned i = 0; i < nv; i++) {
        OOC_LOG_D("op %llu: evicts chunk %llu (buffer %llu, last used at op %llu): resident %llu, "
                  "retiring %llu, dying %llu",
                  (unsigned long long)M.serial, (unsigned long long)victims[i]->idx,
                  (unsigned long long)(victims[i]->owner ? victims[i]->owner->id : 0),
                  (unsigned long long)victims[i]->pin, (unsigned long long)M.resident,
                  (unsigned long long)M.nret, (unsigned long long)M.ndying);
        lru_remove(victims[i]);
        r = unmap_chunk(victims[i]);
        if (r != CUDA_SUCCESS)
            return r;
        if (victims[i]->discard) {
            victims[i]->state = C_EMPTY;
            victims[i]->discard = 0;
            ooc_stats_add(OOC_STAT_recompute_evictions, 1);
            continue;
        }
        if (M.safe)
            alias_chunk(victims[i]);
        ooc_stats_add(OOC_STAT_swap_outs, 1);
        ooc_stats_add(OOC_STAT_swap_out_bytes, chunk_used(victims[i]));
        ooc_stats_add(OOC_STAT_lru_evictions, 1);
    }
    return CUDA_SUCCESS;
}

/* Makes a physical chunk available: a new one while under budget, else a dying chunk's, else
 * by swapping out least recently used chunks (up to `want` at once). */
CUresult need_phys(uint64_t want) {
    if (M.phys_free)
        return CUDA_SUCCESS;
    if (M.phys_made < M.budget_chunks) {
        CUresult r = phys_new();
        if (r != CUDA_ERROR_OUT_OF_MEMORY)
            return r;
    }
    /* Chunks whose bytes the plan gave up (dropped, to be rebuilt by recompute): the plan counts
     * their memory as free from the drop on, so they go first, without a copy. */
    chunk_t *victims[64];
    unsigned nv = 0;
    if (want > 64)
        want = 64;
    for (chunk_t *c = M.lru.prev; c != &M.lru && nv < want; c = c->prev)
        if (c->discard && c->pin != M.serial && !c->hold)
            victims[nv++] = c;
    if (nv)
        return evict(victims, nv);
    /* Freed buffers and planned swap-outs whose work is done; else wait for the older. */
    if (M.ndying)
        reap_dying(0);
    if (M.nret && !M.phys_free && M.safe)
        retire_poll(0);
    else if (M.nret && !M.phys_free)
        (void)retire_free(0); /* the stolen ones give no memory: the worker finishes them */
    if (!M.phys_free) /* safe mode with the gate: the oldest swap-out's memory, in stream order */
        (void)retire_oldest_behind_gate();
    /* Freed buffers' runs kept mapped (warm.c): the oldest go back before anything waits. */
    while (!M.phys_free && warm_ready())
        if (warm_release(want) != CUDA_SUCCESS)
            break;
    while (!M.phys_free && (M.ndying || M.nret)) {
        int dying_first =
            M.ndying && (!M.nret || !M.dying[0]->fenced || M.dying[0]->when <= M.ret[0]->when);
        if (dying_first) {
            CUresult r = reap_dying(1);
            if (r != CUDA_SUCCESS)
                return r;
        } else if (M.safe ? !retire_poll(1) : !retire_free(1)) {
            /* The older swap-outs give nothing now (stolen: the worker finishes them): the
             * freed buffers' chunks still can. */
            if (!M.ndying)
                break;
            CUresult r = reap_dying(1);
            if (r != CUDA_SUCCESS)
                return r;
        }
        while (!M.phys_free && warm_ready()) /* a run may have been made meanwhile */
            if (warm_release(want) != CUDA_SUCCESS)
                break;
    }
    if (M.phys_free)
        return CUDA_SUCCESS;
    /* Safe mode: memory staged for a planned swap-in whose op has not come (its copy is wasted,
     * the host copy stays the data). */
    if (stage_reclaim())
        return CUDA_SUCCESS;
    /* Swap out the least recently used chunks that the current op does not need. A chunk the
     * fast path used since it was placed in the list gets a second chance: it goes back to the
     * head (the walk meets it again last, untouched, unless used again meanwhile: bounded). See
     * lru.c. */
    nv = lru_pick(&M.lru, M.serial, 2 * M.resident + 64, victims, (unsigned)want);
    if (nv == 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    return evict(victims, nv);
}

/* Safe mode: the new buffer at p gets device memory at once, as cuMemAlloc's does: a kernel may
 * reach it through a pointer stored in device memory before any op the shim sees uses it (a
 * grouped GEMM's table of operands), and an address with nothing mapped would fault. Room is
 * made as for an op (least recently used chunks swapped out, their host copies aliased); when
 * none can be, the rest stays unmapped until its first use. Outside safe mode nothing is done:
 * memory is mapped at first use. */
void ooc_mem_back_new(uintptr_t p) {
    if (!M.safe) /* set once by ooc_mem_init, before any allocation: no lock for every one */
        return;
    mem_lock_take();
    buf_t *b = lookup(p);
    uint64_t c0 = 1, c1 = 0;
    if (b)
        buf_span(b, &c0, &c1);
    for (uint64_t idx = c0; idx <= c1; idx++) {
        chunk_t *c = chunk_find(idx);
        if (!c || c->state != C_EMPTY)
            continue;
        c->pin = M.serial; /* not a victim of its own buffer's room */
        CUresult r = need_phys(c1 - idx + 1);
        if (r == CUDA_SUCCESS)
            r = map_chunk(c);
        if (r != CUDA_SUCCESS) {
            OOC_LOG_D("the new buffer at %#llx stays unmapped from chunk %llu on (%s): mapped at "
                      "its first use",
                      (unsigned long long)p, (unsigned long long)idx, ooc_real_errname(r));
            break;
        }
        c->state = C_RESIDENT;
        lru_push(c);
    }
    mem_unlock();
}

/* What the parameter words of this thread's op met (ooc_mem_op_word_hits). */
static _Thread_local ooc_word_hit_t op_hits[OOC_MAX_REFS];
static _Thread_local int op_hits_set;

const ooc_word_hit_t *ooc_mem_op_word_hits(void) {
    if (!op_hits_set)
        return NULL;
    op_hits_set = 0;
    return op_hits;
}

/* Lists b for the current op (once), with how the query [lo, hi) uses it. */
static int opbuf_add(buf_t *b, uintptr_t lo, uintptr_t hi, unsigned use, uint32_t word) {
    /* A write that does not cover the whole buffer keeps the rest: read-write for the planner. */
    if (use == OOC_USE_W && (lo > b->addr || hi < b->addr + b->size))
        use = OOC_USE_RW;
    if (b->opmark == M.serial) {
        for (size_t i = 0; i < M.nopb; i++)
            if (M.op_bufs[i].id == b->id)
                M.op_bufs[i].use |= use;
        return 0;
    }
    if (M.nopb == M.cap_opb) {
        size_t nc = M.cap_opb ? M.cap_opb * 2 : 32;
        ooc_opbuf_t *n = realloc(M.op_bufs, nc * sizeof *n);
        if (!n)
            return -1;
        M.op_bufs = n;
        M.cap_opb = nc;
    }
    b->opmark = M.serial;
    uint64_t stamp = 0; /* a small buffer's: its slab chunk's (fastpath.c) */
    if (b->small) {
        chunk_t *c = chunk_find((b->addr - M.va_base) >> M.shift);
        stamp = c ? atomic_load_explicit(&c->stamp, memory_order_relaxed) : 0;
    }
    M.op_bufs[M.nopb++] = (ooc_opbuf_t){
        .id = b->id, .addr = b->addr, .bytes = b->size, .use = use, .stamp = stamp, .word = word};
    return 0;
}

size_t ooc_mem_op_buffers(const ooc_opbuf_t **out) {
    *out = M.op_bufs;
    return M.nopb;
}

/* Adds c to the current op's chunks. 0, or -1 out of host memory. */
static int op_push(chunk_t *c) {
    if (M.nop == M.cap_op) {
        size_t nc = M.cap_op ? M.cap_op * 2 : 64;
        chunk_t **n = realloc(M.op_chunks, nc * sizeof *n);
        if (!n)
            return -1;
        M.op_chunks = n;
        M.cap_op = nc;
    }
    M.op_chunks[M.nop++] = c;
    return 0;
}

/* Is c settled where a weak word may reach it: no copy in or out in flight, nothing queued, not
 * handed on, and either resident with memory or swapped and aliased to a writable host copy (an
 * access, if any, reaches the device memory or the host copy; every remap in safe mode waits for
 * the streams that issued work since: gather_streams)? */
static int chunk_settled(const chunk_t *c) {
    if (c->in_ev || c->out_ev || c->queued || c->stolen || c->discard)
        return 0;
    return (c->state == C_RESIDENT && c->phys) ||
           (c->state == C_SWAPPED && c->aliased && !c->stage_ro && !c->stage);
}

/* Pins b's chunks for the current op (M.serial) and adds those not pinned yet to its chunks.
 * With leave_settled (a buffer only a weak word reaches, a pointer the kernel may not use, in
 * safe mode), settled chunks stay where they are and only the others (no memory at the address,
 * a read-only alias, a copy in or out in flight) are made resident. On an H200, stale words in
 * PyTorch's parameter blocks named 784 MiB activations, which every such launch made resident.
 * 0, or -1 out of host memory. */
static int pin_buffer(const buf_t *b, int leave_settled) {
    uint64_t c0, c1;
    buf_span(b, &c0, &c1);
    for (uint64_t idx = c0; idx <= c1; idx++) {
        chunk_t *c = chunk_find(idx);
        if (!c || c->pin == M.serial)
            continue;
        if (leave_settled && chunk_settled(c)) {
            ooc_stats_add(OOC_STAT_weak_left, 1);
            continue;
        }
        c->pin = M.serial;
        if (op_push(c) != 0)
            return -1;
    }
    return 0;
}

/* Is one of b's chunks queued for the worker? */
static int buf_queued(const buf_t *b) {
    uint64_t c0, c1;
    buf_span(b, &c0, &c1);
    for (uint64_t idx = c0; idx <= c1; idx++) {
        chunk_t *c = chunk_find(idx);
        if (c && c->queued)
            return 1;
    }
    return 0;
}

int ooc_mem_l_include(uintptr_t addr, uint64_t id) {
    buf_t *b = lookup(addr);
    if (!b || b->id != id || b->addr != addr)
        return -1;
    return pin_buffer(b, 0);
}

/* ---- residency ------------------------------------------------------------------------------ */

static void log_oom(uint64_t need) {
    size_t nbufs = HASH_COUNT(M.bufs);
    OOC_LOG_E("out of memory: an operation needs %llu chunks of %llu bytes resident at once, "
              "the budget holds %llu; %llu are resident, in use by %zu live buffers; nothing "
              "else can be evicted because the operation itself needs every resident chunk",
              (unsigned long long)need, (unsigned long long)M.chunk,
              (unsigned long long)M.budget_chunks, (unsigned long long)M.resident, nbufs);
}

static CUresult make_resident(uint64_t missing);

/* Safe mode with OOC_REMAP_GATE=1: the op's chunks whose addresses show their host copies
 * (with `planned`, only those whose planned swap-in is still queued for the worker) come in behind
 * a gate (swapin_behind_gate) while memory comes: need_phys, up to `want` chunks at once, where
 * swap-outs hand theirs on in stream order behind gates too. Stops at the first that cannot.
 * Returns how many came in. Caller holds mem_lock. */
static uint64_t op_swapins_behind_gate(int planned, uint64_t want) {
    uint64_t n = 0;
    for (size_t i = 0; i < M.nop && M.safe && M.remap_gate; i++) {
        chunk_t *c = M.op_chunks[i];
        if ((planned && !c->queued) || c->state != C_SWAPPED || !c->aliased || c->stage ||
            c->out_ev)
            continue;
        if (need_phys(want > n ? want - n : 1) != CUDA_SUCCESS || !swapin_behind_gate(c, planned))
            break;
        n++;
    }
    return n;
}

/* Safe mode with OOC_REMAP_GATE=1: the op's staged chunks move to their memory behind one gate
 * (stages_behind_gate), with no wait for the streams; the same gate frees memory for the rest of
 * the `missing` chunks. Returns how many moved. Caller holds mem_lock. */
static uint64_t op_stages_behind_gate(uint64_t missing) {
    if (!M.safe || !M.remap_gate || !M.nstaged ||
        grow(&M.op_tmp, &M.cap_tmp, M.nop, sizeof *M.op_tmp) != 0)
        return 0;
    size_t k = 0;
    for (size_t i = 0; i < M.nop; i++) {
        chunk_t *c = M.op_chunks[i];
        if (c->stage && c->state == C_SWAPPED && c->aliased)
            M.op_tmp[k++] = c;
    }
    return stages_behind_gate(M.op_tmp, k, missing > k ? missing - k : 0);
}

/* Is a chunk that op `a` references queued for the worker? Caller holds mem_lock. */
static int any_queued(const ooc_access_t *a) {
    for (unsigned i = 0; i < a->n; i++) {
        query_walk_t w = QUERY_WALK(&a->refs[i]);
        buf_t *b;
        while ((b = query_next(&w)) != NULL)
            if (buf_queued(b))
                return 1;
    }
    return 0;
}

/* ooc_mem_op_pin; `again` when it pins the op once more after waiting for its swap-ins (they
 * were counted late the first time). */
static CUresult op_pin(const ooc_access_t *a, int *listed, int again) {
    mem_lock_take();
    if (OOC_UNLIKELY(atomic_load(&mem_closed))) {
        *listed = 0;
        return CUDA_ERROR_DEINITIALIZED; /* the process is exiting: the pool is gone */
    }
    M.serial++;
    M.op_done = 0;
    M.nop = 0;
    M.op_kind = a->kind;
    M.nopb = 0;
    int list = ooc_record_on() || ooc_replay_on();
    *listed = list;
    if (a->overflow) {
        OOC_LOG_E("an operation references more than %d buffers; the shim cannot make them all "
                  "resident",
                  OOC_MAX_REFS);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    /* Stale words matter only to listed ops (record, replay): demand mode learns nothing. */
    op_hits_set = list && a->kind == OOC_OP_KERNEL;
    for (unsigned i = 0; i < a->n; i++) {
        query_walk_t w = QUERY_WALK(&a->refs[i]);
        buf_t *b;
        uintptr_t hit = 0;
        /* A weak word's buffer is not listed (OOC_USE_WEAK); outside safe mode it is made
         * resident (a swapped chunk's address has no memory), in safe mode only where its
         * address has none (pin_buffer). */
        int weak = (a->refs[i].use & OOC_USE_WEAK) != 0;
        int listed_here = list && !weak;
        while ((b = query_next(&w)) != NULL) {
            hit = hit ? hit : b->addr;
            if (listed_here &&
                opbuf_add(b, a->refs[i].lo, a->refs[i].hi, a->refs[i].use, a->refs[i].word) != 0)
                return CUDA_ERROR_OUT_OF_MEMORY;
            if (pin_buffer(b, weak && M.safe) != 0)
                return CUDA_ERROR_OUT_OF_MEMORY;
        }
        op_hits[i].base = hit;
    }
    if (list)
        fast_buffers_check(a); /* OOC_CHECKS builds: the fast path would list the same */
    if (M.nop > M.budget_chunks) {
        log_oom(M.nop);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    /* Planned swap-ins of this op's chunks that the worker has not done yet: wait for it (the
     * lock is released meanwhile, so everything is looked up again after). First the host issues
     * what it can in stream order: the memory that the previous op's planned swap-outs are
     * vacating could not go to the queue while that op held it (retire_steal), and may now; and
     * the op's own chunks go before the queue (serve_op_chunks). A chunk that must first wait
     * for its own swap-out's copy is waited for here, not in the queue's turn
     * (wait_op_swapouts), and the op is pinned again: the host then brings it in itself. */
    if (M.worker_on) {
        if (M.nret && host_serves())
            serve_queued();
        serve_op_chunks();
        /* Safe mode with OOC_REMAP_GATE=1: the op's queued chunks come in behind a gate now,
         * ahead of the worker. */
        (void)op_swapins_behind_gate(1, 1);
        size_t nq = 0;
        for (size_t i = 0; i < M.nop; i++)
            nq += M.op_chunks[i]->queued != 0;
        if (nq) {
            if (!again)
                ooc_stats_add(OOC_STAT_prefetch_late, nq);
            OOC_LOG_D("op %llu: waits for %zu planned swap-ins (jobs queued %zu)",
                      (unsigned long long)M.serial, nq, (size_t)M.njobs);
            uint64_t t0 = mem_clock_ns();
            if (!wait_op_swapouts()) {
                M.op_waiting++;
                pthread_cond_signal(&M.work_cv); /* a worker waiting for memory gives up now */
                unsigned why = wait_for(WAIT_QUEUED);
                while (any_queued(a))
                    mem_wait(&M.done_cv);
                wait_for(why);
                M.op_waiting--;
            }
            ooc_stats_add(OOC_STAT_stall_ns, mem_clock_ns() - t0);
            mem_unlock();
            return op_pin(a, listed, 1);
        }
    }
    return CUDA_SUCCESS;
}

CUresult ooc_mem_op_pin(const ooc_access_t *a, int *listed) {
    return op_pin(a, listed, 0);
}

CUresult ooc_mem_op_resident(CUstream s) {
    uint64_t missing = 0;
    for (size_t i = 0; i < M.nop; i++) {
        chunk_t *c = M.op_chunks[i];
        if (c->out_ev) {
            OOC_LOG_D("op %llu: uses chunk %llu before its swap-out finished%s",
                      (unsigned long long)M.serial, (unsigned long long)c->idx,
                      c->stolen ? " (its memory taken by a swap-in: waits for the copy)" : "");
            if (c->stolen) {
                retire_settle(c); /* now swapped: brought back below */
            } else {
                retire_cancel(c); /* used again before its swap-out finished */
                lru_push(c);
            }
        }
        c->queued = 0; /* queued by this op's own actions: bring it in now */
        c->discard = 0;
        if (c->state != C_RESIDENT)
            missing++;
    }
    CUresult rc = CUDA_SUCCESS;
    if (missing) {
        OOC_LOG_D("op %llu: %llu of its %zu chunks are not resident (resident %llu, free %d, "
                  "retiring %llu, dying %llu)",
                  (unsigned long long)M.serial, (unsigned long long)missing, M.nop,
                  (unsigned long long)M.resident, M.phys_free != NULL, (unsigned long long)M.nret,
                  (unsigned long long)M.ndying);
        ooc_stats_add(OOC_STAT_demand_ops, 1);
        uint64_t t0 = mem_clock_ns();
        rc = make_resident(missing);
        ooc_stats_add(OOC_STAT_stall_ns, mem_clock_ns() - t0);
    }
    /* Chunks a planned swap-in brought: the op's stream waits for their copies. */
    for (size_t i = 0; i < M.nop && rc == CUDA_SUCCESS; i++) {
        chunk_t *c = M.op_chunks[i];
        if (!c->in_ev)
            continue;
        if (ev_done(c->in_ev)) {
            ev_drop(c->in_ev);
            c->in_ev = NULL;
        } else {
            rc = ooc_real.cuStreamWaitEvent(s, c->in_ev->e, 0);
        }
    }
    if (M.safe && rc == CUDA_SUCCESS) /* and for memory being filled that it may reach unseen */
        rc = fill_wait(s);
    /* The driver checks a copy's or a set's addresses when it is called: none of the op's may be
     * between a remap's unmap and map on the mapping thread (gate.c), where it would answer
     * CUDA_ERROR_INVALID_VALUE. A kernel's are reached only when it runs, behind the gate. */
    if (rc == CUDA_SUCCESS && gate_on() &&
        (M.op_kind == OOC_OP_MEMCPY || M.op_kind == OOC_OP_MEMSET))
        for (size_t i = 0; i < M.nop; i++)
            gate_settle(chunk_addr(M.op_chunks[i]));
    return rc;
}

/* Removes the host aliases of the op's swapped chunks (safe mode), after waiting for every
 * stream that may have reached them through an address the shim could not see. */
static CUresult unalias_op_chunks(void) {
    chunk_t **al = NULL;
    size_t nal = 0;
    for (size_t i = 0; i < M.nop; i++) {
        if (!M.op_chunks[i]->aliased)
            continue;
        if (!al && !(al = malloc(M.nop * sizeof *al)))
            return CUDA_ERROR_OUT_OF_MEMORY;
        al[nal++] = M.op_chunks[i];
    }
    CUresult r = nal ? wait_chunks(al, nal) : CUDA_SUCCESS;
    for (size_t i = 0; i < nal && r == CUDA_SUCCESS; i++)
        r = unalias_chunk(al[i]);
    free(al);
    return r;
}

/* The op's chunks swapped in by make_resident (resident, host slot still attached): one event
 * after their copies, which the op's stream waits for (ooc_mem_begin) while the host goes on;
 * their slots go back once it has completed. Without an event, the host waits for the copies. */
static CUresult swapins_issued(void) {
    evref_t *v = ev_take();
    CUresult r = v ? ooc_real.cuEventRecord(v->e, M.swap) : CUDA_ERROR_OUT_OF_MEMORY;
    if (r != CUDA_SUCCESS) {
        ev_drop(v);
        v = NULL;
        if ((r = sync_stream(M.swap)) != CUDA_SUCCESS)
            return r;
    }
    for (size_t i = 0; i < M.nop; i++) {
        chunk_t *c = M.op_chunks[i];
        if (c->state != C_RESIDENT || !c->host || c->out_ev)
            continue;
        if (v) {
            limbo_put(c->host, v);
            ev_drop(c->in_ev);
            v->refs++;
            c->in_ev = v;
        } else {
            host_slot_put(c->host);
        }
        c->host = NULL;
    }
    if (v && M.safe)
        fill_set(FILL_DEMAND, v);
    ev_drop(v);
    return CUDA_SUCCESS;
}

/* Maps (and swaps in) the op's chunks that are not resident. Caller holds mem_lock. */
static CUresult make_resident(uint64_t missing) {
    int swapped_in = 0;
    /* Safe mode with OOC_REMAP_GATE=1: the op's swapped chunks come in behind a gate, with no
     * wait for the streams that may reach them unseen. */
    missing -= op_swapins_behind_gate(0, missing);
    missing -= op_stages_behind_gate(missing);
    CUresult r = M.safe ? unalias_op_chunks() : CUDA_SUCCESS;
    if (r != CUDA_SUCCESS)
        return r;
    for (size_t i = 0; i < M.nop; i++) {
        chunk_t *c = M.op_chunks[i];
        if (c->state == C_RESIDENT)
            continue;
        if (c->stage) {
            /* Safe mode: its planned swap-in copied it beside the alias (removed above). */
            r = stage_adopt(c);
            if (r == CUDA_SUCCESS) {
                host_slot_put(c->host); /* the copy is done */
                c->host = NULL;
                c->state = C_RESIDENT;
                lru_push(c);
                missing--;
                continue;
            }
            if (c->stage) { /* its spare address could not be unmapped */
                if (swapped_in)
                    swapins_issued();
                return r;
            }
            r = CUDA_SUCCESS; /* not mapped here: its memory is free again, copied in below */
        }
        /* Under replay, at the budget, the memory a planned swap-out is vacating is taken at
         * once (outside safe mode): the op's stream, or the copy in, waits for that copy out on
         * the device, rather than the host for it here (need_phys). */
        chunk_t *from = NULL;
        phys_t *p = !M.phys_free && M.phys_made >= M.budget_chunks ? retire_steal(&from) : NULL;
        if (p && (r = map_phys(c, p)) != CUDA_SUCCESS) {
            retire_unsteal(p, from);
            p = NULL;
        }
        if (p && c->state == C_EMPTY) { /* nothing to copy in: the op waits for the copy out */
            ev_drop(c->in_ev);
            from->out_ev->refs++;
            c->in_ev = from->out_ev;
        } else if (p) {
            r = ooc_real.cuStreamWaitEvent(M.swap, from->out_ev->e, 0);
        } else {
            r = need_phys(missing);
            if (r == CUDA_ERROR_OUT_OF_MEMORY)
                log_oom(M.nop);
            if (r == CUDA_SUCCESS)
                r = map_chunk(c);
        }
        if (r != CUDA_SUCCESS && p) {
            /* The wait could not be queued: the memory goes back, unused. */
            if (vmm_unmap(chunk_addr(c)) == CUDA_SUCCESS) {
                c->phys = NULL;
                retire_unsteal(p, from);
            }
        }
        if (r != CUDA_SUCCESS) {
            if (swapped_in)
                swapins_issued();
            return r;
        }
        if (c->state == C_SWAPPED) {
            r = copy_in(c, M.swap);
            if (r != CUDA_SUCCESS) {
                /* Keep the host copy; give the physical chunk back (nothing used it yet), once
                 * the copy out of the chunk it was taken from no longer reads it. */
                if (p)
                    sync_event(from->out_ev->e);
                (void)unmap_failed_copy_in(c);
                if (swapped_in)
                    swapins_issued();
                return r;
            }
            swapped_in = 1;
            ooc_stats_add(OOC_STAT_swap_ins, 1);
            ooc_stats_add(OOC_STAT_swap_in_bytes, chunk_used(c));
        }
        c->state = C_RESIDENT;
        lru_push(c);
        missing--;
    }
    return swapped_in ? swapins_issued() : CUDA_SUCCESS;
}

/* Makes c hot when the fast path may issue an op that uses it on any of its users' streams:
 * such an op would find c resident and stable, and the locked path would do nothing to c but
 * note a user it already has and move c to the head of the LRU (the fast path sets `touched`
 * instead). That is: resident; not retiring (out_ev), dying or queued for the worker, each of
 * which a later op must act on; not aliased; no copy in that an op must wait for (in_ev); its
 * bytes not given up to be rebuilt (discard); still owned by a live buffer. Called by the locked
 * path after an op on c was issued. Caller holds mem_lock. */
static void set_hot(chunk_t *c) {
    if (c->in_ev && ev_done(c->in_ev)) { /* the copy that brought it in has completed */
        ev_drop(c->in_ev);
        c->in_ev = NULL;
    }
    if (M.table && c->state == C_RESIDENT && !c->out_ev && !c->dying && !c->queued && !c->aliased &&
        !c->in_ev && !c->discard && c->ext_n)
        atomic_store_explicit(&c->hot, 1, memory_order_release);
}

void ooc_mem_op_issued(CUstream s, int issued) {
    if (issued) {
        for (size_t i = 0; i < M.nop; i++) {
            chunk_t *c = M.op_chunks[i];
            chunk_add_user(c, s);
            if (!c->dying)
                lru_push(c);
            set_hot(c);
        }
        stream_issued(s);
        M.op_done = 1; /* the plan's swap-outs after it may hand its memory on at once */
    }
    /* Even when the op itself failed: the shim may have issued work before it (a rebuild's
     * producers), and a stream wait taken before must not count for it (streams.c, waited). */
    M.fc_epoch++;
}

CUresult ooc_mem_op_hold(uint64_t **idx, size_t *n) {
    *idx = NULL;
    *n = 0;
    if (M.nop == 0)
        return CUDA_SUCCESS;
    uint64_t *v = malloc(M.nop * sizeof *v);
    if (!v) {
        OOC_LOG_E("out of memory: a library call's chunks could not be held resident");
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    for (size_t i = 0; i < M.nop; i++) {
        M.op_chunks[i]->hold++;
        v[i] = M.op_chunks[i]->idx;
    }
    *idx = v;
    *n = M.nop;
    return CUDA_SUCCESS;
}

void ooc_mem_op_unhold(uint64_t *idx, size_t n) {
    for (size_t i = 0; i < n; i++) {
        chunk_t *c = chunk_find(idx[i]);
        if (c && c->hold) /* a chunk buried meanwhile and made again starts at 0 */
            c->hold--;
    }
    free(idx);
}

void ooc_mem_op_release(void) {
    M.nop = 0;
    mem_unlock();
}

CUresult ooc_mem_begin(const ooc_access_t *a, CUstream s) {
    int listed;
    CUresult r = ooc_mem_op_pin(a, &listed);
    return r == CUDA_SUCCESS ? ooc_mem_op_resident(s) : r;
}

void ooc_mem_end(const ooc_access_t *a, CUstream s, int issued) {
    (void)a;
    ooc_mem_op_issued(s, issued);
    ooc_mem_op_release();
}
