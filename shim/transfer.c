/* SPDX-License-Identifier: MIT */
/* transfer.c: the plan's transfers for replay.c: planned swap-outs on the device-to-host
 * stream, swap-ins queued for the worker, and dropping or discarding a buffer's chunks.
 *
 * Invariants: an action applies to the buffer at addr only while it is still serial `id` and
 * owns whole chunks (small buffers are left to demand residency); a chunk queued for the worker
 * has a job that will clear `queued`, or is unqueued. Locking: replay.c calls these with
 * mem_lock held (inside ooc_mem_begin/ooc_mem_end). Callers: replay.c, worker.c. */
#include "mem_int.h"

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
        ooc_stats_add(OOC_STAT_swap_outs, done);
        ooc_stats_add(OOC_STAT_swap_out_bytes, done * M.chunk);
        ooc_stats_add(OOC_STAT_planned_swap_outs, 1);
        pthread_cond_signal(&M.work_cv);
    }
    return (unsigned)done;
}

unsigned ooc_mem_l_prefetch(uintptr_t addr, uint64_t id, CUstream s) {
    buf_t *b = plan_buf(addr, id);
    if (!b || !M.worker_on)
        return 0;
    unsigned q = 0;
    for (uint64_t i = 0, n = buf_chunks(b); i < n; i++) {
        chunk_t *c = plan_chunk(b, i);
        if (!c)
            continue;
        /* A chunk whose swap-out is still under way is queued too: whether its copy is done is
         * decided when the device reaches this point (the worker), not now, when the host,
         * which runs ahead, looks. */
        if ((c->out_ev || c->state == C_SWAPPED) && !c->queued) {
            cool(c); /* it is not hot (not resident, or retiring): this only keeps it so */
            c->queued = 1;
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
    M.jobs[M.job_head + M.njobs++] = (job_t){addr, id, fence_ev(s)};
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
