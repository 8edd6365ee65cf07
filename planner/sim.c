/* SPDX-License-Identifier: MIT */
/* sim.c: the timeline simulator (one compute engine, one copy engine per direction, chunk-level
 * memory under the budget); trace_check.c checks the traces it writes, independently.
 *
 * The simulator is a discrete-event loop over three FIFO engines. The compute engine walks the
 * plan in replay order: an op's "before" actions, the op, its "after" actions. Swap-ins are
 * queued on the host-to-device engine when the compute engine reaches them (so a swap-in "at op
 * j" is ordered after op j-1); swap-outs are queued on the device-to-host engine when their op
 * ends. Memory is mapped when a copy-in starts, when a buffer is first touched, or when it is
 * recomputed, and released when a copy-out ends, on a drop, or when the program frees it; an
 * allocation that does not fit blocks its engine until enough is released. When no engine can
 * move, the plan is infeasible under the budget. Both directions share the bidirectional
 * bandwidth when they run together. With the profile's swapin_exclusive (safe mode without
 * staging), a copy in starts only between compute items and the compute engine waits for it
 * (shim/worker.c: the address maps the memory being filled).
 *
 * The driver's mapping calls take host time (the profile's swapin_vmm_ns and swapout_vmm_ns
 * per chunk), and one worker thread makes them all, one after another: the "map lane". A
 * swap-in's chunks are mapped on the lane from the moment it is queued (into memory still being
 * vacated, as the shim does), and its copy moves no byte before that is done; a swap-out's
 * chunks are unmapped on the lane after its copy ends. In safe mode remapping a chunk waits for
 * the device to drain (its host alias may be reached unseen), and no op is issued meanwhile:
 * with swapin_exclusive a swap-in's mapping is part of its exclusive copy; with
 * swapout_exclusive a swap-out's starts at the next gap between compute items, which waits for
 * it, and so, with staging (swapout_exclusive without swapin_exclusive), does the remap at a
 * swapped-in buffer's first use (its wait). With staging the profile's stage_vmm_ns and
 * adopt_vmm_ns, when it has them, are the per-chunk costs of the two (staging on the lane, the
 * move at the first use), in place of swapin_vmm_ns. With the profile's remap_gate (safe mode
 * behind the shim's gates) a swap-in of a buffer on the host takes its memory when the compute
 * engine reaches it, and when that memory is still held by copies out, nothing computes until
 * they end (the gate hands it over behind them); when even they would not free enough, the
 * swap-in takes memory when its copy starts, as without the gate.
 *
 * The program's thread issues the ops in order, and makes mapping calls of its own for the
 * buffers the program allocates during the iteration (the profile's map_vmm_ns per chunk before
 * the op that first uses one, unmap_vmm_ns after its free, charged to the next op issued): an op
 * starts no earlier than the host has issued it. The host may run ahead of the device, but it
 * does not issue an op before that op's swap-ins were mapped (it waits for the worker), nor
 * while an exclusive section holds the device. Launches themselves cost it nothing here.
 * Everything is deterministic. */
#include "ooc_planner.h"
#include "grow.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

enum { ST_NONE = 0, ST_RES, ST_IN, ST_OUTQ, ST_HOST };

typedef struct {
    int32_t buf;
    double issue;
    double mapped; /* its chunks' mapping calls end (the map lane) */
} xfer_t;

typedef struct {
    xfer_t *q;
    size_t head, n, cap;
    int active; /* head is running */
    double remaining, start;
    double hold; /* the running head moves no byte before this (its mapping calls) */
} engine_t;

typedef struct {
    const ooc_model_t *m;
    const ooc_plan_t *pl;
    ooc_sim_result_t *res;
    ooc_trace_t *tr;
    double now;
    uint64_t used, budget;
    uint8_t *st, *host_valid, *waited, *d2h_pending, *free_after_d2h, *ever, *dropped;
    uint8_t *premapped; /* remap_gate: a queued swap-in whose memory was taken at its issue */
    engine_t h2d, d2h;
    double lane;           /* the map lane (the worker's mapping calls) is busy until then */
    uint64_t out_bytes;    /* the footprint of the buffers queued or running on d2h (freed after) */
    uint32_t h2d_unmapped; /* queued swap-ins that take their memory when their copy starts */
    /* the program's thread: it has issued the ops before the current one by `host`; `issued`:
     * the current op is issued at `issue_at`; `host_debt`: mapping calls it owes (frees) */
    double host, issue_at, host_debt;
    int issued;
    double *mapped_at; /* when a buffer's latest swap-in was mapped */
    /* swapout_exclusive: swap-outs' mapping calls waiting for a gap between compute items, and
     * the end of those running (nothing computes before) */
    double excl_pending, excl_end;
    /* compute engine */
    uint32_t op;     /* current op */
    uint32_t ai;     /* next action index */
    int phase;       /* 0: before actions, 1: op itself, 2: done */
    int busy;        /* running something */
    int busy_recomp; /* the running item is a recompute */
    int32_t busy_buf;
    double busy_end, idle_since;
    int32_t blocked_buf; /* waiting for this buffer's swap-in, -1 none */
    int blocked_mem;
    double block_start;
    int stop;
} sim_t;

static void violate(sim_t *s, int code, int32_t op, int32_t buf, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static void violate(sim_t *s, int code, int32_t op, int32_t buf, const char *fmt, ...) {
    if (s->stop)
        return;
    s->stop = 1;
    s->res->feasible = 0;
    s->res->viol_code = code;
    s->res->viol_op = op;
    s->res->viol_buf = buf;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->res->viol_msg, sizeof s->res->viol_msg, fmt, ap);
    va_end(ap);
}

static void trace(sim_t *s, ooc_trace_kind_t k, int32_t op, int32_t buf, int32_t aux,
                  uint64_t bytes) {
    ooc_trace_t *t = s->tr;
    if (!t)
        return;
    if (ooc_grow(&t->ev, &t->cap, t->n + 1, sizeof *t->ev, 1024)) {
        violate(s, OOC_ENOMEM, op, buf, "out of memory for the trace");
        return;
    }
    t->ev[t->n++] = (ooc_trace_ev_t){s->now, (uint8_t)k, op, buf, aux, bytes};
}

void ooc_trace_free(ooc_trace_t *t) {
    if (t) {
        free(t->ev);
        t->ev = NULL;
        t->n = t->cap = 0;
    }
}

void ooc_sim_result_free(ooc_sim_result_t *r) {
    if (!r)
        return;
    free(r->op_stall_ns);
    free(r->h2d_wait_ns);
    free(r->d2h_delay_ns);
    r->op_stall_ns = NULL;
    r->h2d_wait_ns = r->d2h_delay_ns = NULL;
}

static int push(engine_t *e, int32_t buf, double issue, double mapped) {
    if (e->head + e->n == e->cap) {
        if (e->head > 0) {
            memmove(e->q, e->q + e->head, e->n * sizeof *e->q);
            e->head = 0;
        }
        if (ooc_grow(&e->q, &e->cap, e->n + 1, sizeof *e->q, 64))
            return OOC_ENOMEM;
    }
    e->q[e->head + e->n++] = (xfer_t){buf, issue, mapped};
    return 0;
}

/* Puts `ns` of mapping calls on the map lane, after its earlier work and not before now: when
 * they end. */
static double lane_take(sim_t *s, double ns) {
    s->lane = (s->lane > s->now ? s->lane : s->now) + ns;
    return s->lane;
}

/* The mapping calls per chunk that bring a planned swap-in back, on the worker's lane: with
 * staging (safe mode, swapout_exclusive without swapin_exclusive) those that stage it beside the
 * host alias, when the profile has them. */
static uint64_t in_vmm_ns(const ooc_profile_t *p) {
    if (p->swapout_exclusive && !p->swapin_exclusive && p->stage_vmm_ns)
        return p->stage_vmm_ns;
    return p->swapin_vmm_ns;
}

/* The host time of the mapping calls for buffer b's chunks, `per_chunk` ns each; a buffer that
 * shares a chunk (at most chunk/8 bytes, shim/buffer.c) is charged its share. */
static double vmm_ns(const sim_t *s, int32_t b, uint64_t per_chunk) {
    return (double)s->m->fp[b] / (double)s->m->chunk_bytes * (double)per_chunk;
}

static int map(sim_t *s, int32_t b) {
    uint64_t fp = s->m->fp[b];
    if (s->used + fp > s->budget)
        return 0;
    s->used += fp;
    if (s->used > s->res->peak_bytes)
        s->res->peak_bytes = s->used;
    trace(s, OOC_TR_MAP, (int32_t)s->op, b, -1, fp);
    return 1;
}

static void unmap(sim_t *s, int32_t b) {
    s->used -= s->m->fp[b];
    trace(s, OOC_TR_UNMAP, (int32_t)s->op, b, -1, s->m->fp[b]);
}

/* Marks the compute engine blocked (on a buffer or on memory) from now on. */
static void block(sim_t *s, int32_t buf, int mem) {
    if (s->blocked_buf < 0 && !s->blocked_mem)
        s->block_start = s->now;
    s->blocked_buf = buf;
    s->blocked_mem = mem;
}

static void unblock(sim_t *s) {
    if (s->blocked_buf >= 0 || s->blocked_mem) {
        double w = s->now - s->block_start;
        if (s->res->h2d_wait_ns && s->blocked_buf >= 0)
            s->res->h2d_wait_ns[s->blocked_buf] += w;
        if (s->res->d2h_delay_ns && s->blocked_mem && s->d2h.n > 0)
            s->res->d2h_delay_ns[s->d2h.q[s->d2h.head].buf] += w;
    }
    s->blocked_buf = -1;
    s->blocked_mem = 0;
}

static void start_compute(sim_t *s, double dur, int recomp, int32_t buf) {
    unblock(s);
    double st = s->now - s->idle_since;
    s->res->stall_ns += (uint64_t)llround(st);
    if (s->res->op_stall_ns)
        s->res->op_stall_ns[s->op] += (uint64_t)llround(st);
    s->busy = 1;
    s->busy_recomp = recomp;
    s->busy_buf = buf;
    s->busy_end = s->now + dur;
}

/* Is every input of a recompute of b (via ops) resident and unchanged? */
static int recompute_inputs(sim_t *s, const ooc_action_t *a, int32_t *missing) {
    const ooc_profile_t *p = s->m->prof;
    for (uint32_t k = 0; k < a->nvia; k++) {
        const ooc_op_t *o = &p->ops[s->pl->via[a->via_off + k]];
        for (uint32_t r = 0; r < o->nref; r++) {
            int32_t x = p->refs[o->ref_off + r].buf;
            if (x == a->buf)
                continue;
            if (s->st[x] != ST_RES) {
                *missing = x;
                return s->st[x] == ST_IN ? 0 : -1;
            }
            if (!s->waited[x])
                *missing = x;
        }
    }
    return 1;
}

/* Could the head of the host-to-device queue start now (issued, its own copy out done, memory
 * for it)? */
static int h2d_ready(const sim_t *s) {
    const engine_t *e = &s->h2d;
    if (e->active || e->n == 0)
        return 0;
    const xfer_t *x = &e->q[e->head];
    return x->issue <= s->now && !s->d2h_pending[x->buf] &&
           (s->premapped[x->buf] || s->used + s->m->fp[x->buf] <= s->budget);
}

/* Advances the compute engine as far as it can at the current time. Returns 1 on progress. With
 * swapin_exclusive, a copy in that can start goes first and the compute engine waits for it. */
static int step_compute(sim_t *s) {
    const ooc_model_t *m = s->m;
    const ooc_profile_t *p = m->prof;
    const ooc_plan_t *pl = s->pl;
    if (s->busy || s->stop)
        return 0;
    if (s->excl_pending > 0) {
        s->excl_end = lane_take(s, s->excl_pending);
        s->excl_pending = 0;
        if (s->host < s->excl_end)
            s->host = s->excl_end; /* no op is issued meanwhile */
    }
    if (s->phase == 2 || s->now < s->excl_end)
        return 0;
    if (p->swapin_exclusive) {
        /* A copy in runs alone: nothing starts while one runs, nor while one could start. */
        if (s->h2d.active)
            block(s, s->h2d.q[s->h2d.head].buf, 0);
        if (s->h2d.active || h2d_ready(s))
            return 0;
    }
    /* before actions */
    while (s->ai < pl->nacts && pl->acts[s->ai].op == (int32_t)s->op &&
           pl->acts[s->ai].when == OOC_BEFORE) {
        const ooc_action_t *a = &pl->acts[s->ai];
        int32_t b = a->buf;
        if (a->kind == OOC_ACT_SWAPIN) {
            if (s->st[b] != ST_HOST && s->st[b] != ST_OUTQ) {
                violate(s, OOC_EFORMAT, a->op, b,
                        "swap-in of buffer %d before op %d, but it is not swapped out", b, a->op);
                return 0;
            }
            if (p->remap_gate && s->st[b] == ST_HOST && !s->h2d_unmapped) {
                /* The gate (shim/retire.c): the memory is handed over here, behind the copies
                 * out that free it, and nothing computes until they are done. When even they
                 * would not free enough, or an earlier swap-in still waits to take memory (the
                 * copies run in order: this one would hold memory that one waits for), the
                 * swap-in takes memory when its copy can start, as below (the shim queues it for
                 * its worker). */
                uint64_t fp = m->fp[b];
                if (s->used + fp > s->budget && s->used + fp <= s->budget + s->out_bytes) {
                    block(s, -1, 1);
                    return 0;
                }
                s->premapped[b] = (uint8_t)map(s, b);
            }
            double mapped = p->swapin_exclusive
                                ? 0 /* the lane takes it when the copy starts (step_h2d) */
                                : lane_take(s, vmm_ns(s, b, in_vmm_ns(p)));
            s->mapped_at[b] = mapped;
            if (push(&s->h2d, b, s->now, mapped)) {
                violate(s, OOC_ENOMEM, a->op, b, "out of memory");
                return 0;
            }
            s->h2d_unmapped += !s->premapped[b];
            s->st[b] = ST_IN;
            s->waited[b] = 0; /* a use needs a wait first, however early the copy ends */
            if (p->swapin_exclusive) {
                s->ai++;
                return 1; /* the copy may start before anything else (step_h2d) */
            }
        } else if (a->kind == OOC_ACT_WAIT) {
            s->waited[b] = 1;
            if (s->st[b] == ST_IN) {
                block(s, b, 0);
                return 0;
            }
            if (s->st[b] != ST_RES) {
                violate(s, OOC_EFORMAT, a->op, b,
                        "wait for buffer %d before op %d, but no swap-in of it was started", b,
                        a->op);
                return 0;
            }
            if (p->swapout_exclusive && !p->swapin_exclusive) {
                /* Safe mode with staging: the copy went beside the host alias, and the first use
                 * removes the alias and remaps the chunk while nothing computes. */
                s->excl_pending +=
                    vmm_ns(s, b, p->adopt_vmm_ns ? p->adopt_vmm_ns : p->swapin_vmm_ns);
                s->ai++;
                return 1;
            }
        } else if (a->kind == OOC_ACT_RECOMPUTE) {
            int ok = 1;
            if (!m->recomp[b] || a->op > m->recomp_until[b] || s->st[b] != ST_NONE ||
                !s->dropped[b] || a->nvia != p->bufs[b].nprod)
                ok = 0;
            for (uint32_t k = 0; ok && k < a->nvia; k++)
                if (pl->via[a->via_off + k] != p->prods[p->bufs[b].prod_off + k])
                    ok = 0;
            if (!ok) {
                violate(s, OOC_EFORMAT, a->op, b,
                        "recompute of buffer %d before op %d breaks the recompute rule "
                        "(docs/planner.md) (not "
                        "dropped, not re-executable, or its inputs changed)",
                        b, a->op);
                return 0;
            }
            int32_t miss = -1;
            int r = recompute_inputs(s, a, &miss);
            if (r == 1 && miss >= 0) {
                violate(s, OOC_EFORMAT, a->op, miss,
                        "recompute before op %d reads buffer %d after its swap-in, and the plan "
                        "has no wait for it",
                        a->op, miss);
                return 0;
            }
            if (r < 0) {
                violate(s, OOC_EFORMAT, a->op, b,
                        "recompute of buffer %d before op %d: input buffer %d is not resident", b,
                        a->op, miss);
                return 0;
            }
            if (r == 0) {
                if (!s->waited[miss]) {
                    violate(s, OOC_EFORMAT, a->op, miss,
                            "recompute before op %d reads buffer %d while its swap-in is in "
                            "flight and no wait precedes it",
                            a->op, miss);
                    return 0;
                }
                block(s, miss, 0);
                return 0;
            }
            if (!map(s, b)) {
                block(s, -1, 1);
                return 0;
            }
            double dur = 0;
            for (uint32_t k = 0; k < a->nvia; k++)
                dur += (double)p->ops[pl->via[a->via_off + k]].duration_ns;
            trace(s, OOC_TR_OP_START, a->op, b, pl->via[a->via_off], 0);
            s->st[b] = ST_RES;
            s->dropped[b] = 0;
            s->ai++;
            start_compute(s, dur, 1, b);
            return 1;
        }
        s->ai++;
    }
    /* the op itself */
    const ooc_op_t *o = &p->ops[s->op];
    uint64_t need = 0;
    for (uint32_t k = 0; k < o->nref; k++) {
        int32_t b = p->refs[o->ref_off + k].buf;
        if (!s->waited[b]) {
            violate(s, OOC_EFORMAT, (int32_t)s->op, b,
                    "op %u (%s) uses buffer %d after its swap-in, and the plan has no wait for "
                    "it",
                    s->op, o->name, b);
            return 0;
        }
        switch (s->st[b]) {
        case ST_RES:
            break;
        case ST_IN:
            if (!s->waited[b]) {
                violate(s, OOC_EFORMAT, (int32_t)s->op, b,
                        "op %u (%s) uses buffer %d while its swap-in is in flight, and the plan "
                        "has no wait for it",
                        s->op, o->name, b);
                return 0;
            }
            block(s, b, 0);
            return 0;
        case ST_NONE:
            if (!s->ever[b]) {
                need += m->fp[b];
                break;
            }
            violate(s, OOC_EFORMAT, (int32_t)s->op, b,
                    "op %u (%s) uses buffer %d, which was %s and not rebuilt", s->op, o->name, b,
                    s->dropped[b] ? "dropped" : "freed");
            return 0;
        case ST_HOST:
            violate(s, OOC_EFORMAT, (int32_t)s->op, b,
                    "op %u (%s) uses buffer %d, which is swapped out and was not swapped in", s->op,
                    o->name, b);
            return 0;
        default:
            violate(s, OOC_EFORMAT, (int32_t)s->op, b,
                    "op %u (%s) uses buffer %d while its swap-out is still in flight", s->op,
                    o->name, b);
            return 0;
        }
    }
    if (!s->issued) {
        /* The program's thread issues the op: after the mapping calls it owes and those for the
         * op's new buffers, and not before the op's swap-ins were mapped. */
        double t = s->host;
        for (uint32_t k = 0; k < o->nref; k++) {
            int32_t b = p->refs[o->ref_off + k].buf;
            if (s->mapped_at[b] > t)
                t = s->mapped_at[b];
        }
        /* the new buffers' footprint (need), charged per chunk as vmm_ns does */
        s->host = t + s->host_debt + (double)need / (double)m->chunk_bytes * (double)p->map_vmm_ns;
        s->host_debt = 0;
        s->issue_at = s->host;
        s->issued = 1;
    }
    if (s->now < s->issue_at)
        return 0; /* the host has not issued it yet */
    if (need) {
        if (s->used + need > s->budget) {
            block(s, -1, 1);
            return 0;
        }
        for (uint32_t k = 0; k < o->nref; k++) {
            int32_t b = p->refs[o->ref_off + k].buf;
            if (s->st[b] == ST_NONE) {
                map(s, b);
                s->st[b] = ST_RES;
                s->ever[b] = 1;
            }
        }
    }
    trace(s, OOC_TR_OP_START, (int32_t)s->op, -1, (int32_t)s->op, 0);
    start_compute(s, (double)o->duration_ns, 0, -1);
    s->phase = 1;
    s->issued = 0;
    return 1;
}

/* The running compute item ends at s->now. */
static void end_compute(sim_t *s) {
    const ooc_model_t *m = s->m;
    const ooc_profile_t *p = m->prof;
    const ooc_plan_t *pl = s->pl;
    s->busy = 0;
    s->idle_since = s->now;
    if (s->busy_recomp) {
        trace(s, OOC_TR_OP_END, (int32_t)s->op, s->busy_buf, -1, 0);
        s->host_valid[s->busy_buf] = 0;
        return;
    }
    const ooc_op_t *o = &p->ops[s->op];
    trace(s, OOC_TR_OP_END, (int32_t)s->op, -1, (int32_t)s->op, 0);
    for (uint32_t k = 0; k < o->nref; k++)
        if (m->written[o->ref_off + k])
            s->host_valid[p->refs[o->ref_off + k].buf] = 0;
    while (s->ai < pl->nacts && pl->acts[s->ai].op == (int32_t)s->op) {
        const ooc_action_t *a = &pl->acts[s->ai++];
        int32_t b = a->buf;
        if (a->when != OOC_AFTER)
            continue;
        if (s->st[b] != ST_RES) {
            violate(s, OOC_EFORMAT, a->op, b, "%s of buffer %d after op %d, but it is not resident",
                    ooc_act_name((ooc_act_kind_t)a->kind), b, a->op);
            return;
        }
        if (a->kind == OOC_ACT_DROP) {
            if (ooc_model_next_use(m, b, a->op + 1) == m->nuse[b]) {
                violate(s, OOC_EFORMAT, a->op, b,
                        "drop of buffer %d after op %d, which has no later use to rebuild it for "
                        "(a dead buffer leaves by a swap-out)",
                        b, a->op);
                return;
            }
            unmap(s, b);
            s->st[b] = ST_NONE;
            s->dropped[b] = 1;
        } else if (s->host_valid[b]) {
            unmap(s, b); /* the host copy is current: nothing to copy */
            s->st[b] = ST_HOST;
        } else {
            if (push(&s->d2h, b, s->now, 0)) {
                violate(s, OOC_ENOMEM, a->op, b, "out of memory");
                return;
            }
            s->out_bytes += m->fp[b];
            s->st[b] = ST_OUTQ;
            s->d2h_pending[b] = 1;
        }
    }
    /* the program's own frees */
    for (uint32_t k = m->free_off[s->op]; k < m->free_off[s->op + 1]; k++) {
        int32_t b = m->frees[k];
        if (s->st[b] == ST_RES) {
            unmap(s, b);
            s->st[b] = ST_NONE;
            s->host_debt += vmm_ns(s, b, p->unmap_vmm_ns);
        } else if (s->st[b] == ST_OUTQ) {
            s->free_after_d2h[b] = 1;
        } else if (s->st[b] == ST_HOST) {
            s->st[b] = ST_NONE;
        }
        s->dropped[b] = 0;
    }
    s->op++;
    s->phase = s->op < m->n ? 0 : 2;
}

/* Is e's running transfer moving bytes (past its mapping calls)? */
static int moving(const sim_t *s, const engine_t *e) {
    return e->active && s->now >= e->hold;
}

static double rate(const sim_t *s, int h2d) {
    const ooc_profile_t *p = s->m->prof;
    double r = h2d ? p->h2d_bps : p->d2h_bps;
    if (moving(s, &s->h2d) && moving(s, &s->d2h) && p->h2d_bps + p->d2h_bps > p->bidir_bps)
        r *= p->bidir_bps / (p->h2d_bps + p->d2h_bps);
    return r / 1e9; /* bytes per ns */
}

static int step_h2d(sim_t *s) {
    engine_t *e = &s->h2d;
    /* (swapin_exclusive: after the running op, since the copy runs alone) */
    if (s->stop || !h2d_ready(s) || (s->m->prof->swapin_exclusive && s->busy))
        return 0;
    xfer_t *x = &e->q[e->head];
    if (!s->premapped[x->buf]) {
        (void)map(s, x->buf); /* it fits: h2d_ready */
        s->h2d_unmapped--;
    }
    s->premapped[x->buf] = 0;
    e->active = 1;
    e->start = s->now;
    if (s->m->prof->swapin_exclusive)
        e->hold = s->mapped_at[x->buf] = lane_take(s, vmm_ns(s, x->buf, s->m->prof->swapin_vmm_ns));
    else
        e->hold = x->mapped > s->now ? x->mapped : s->now;
    e->remaining = (double)s->m->prof->bufs[x->buf].bytes;
    s->res->h2d_bytes += s->m->prof->bufs[x->buf].bytes;
    trace(s, OOC_TR_H2D_START, (int32_t)s->op, x->buf, -1, s->m->prof->bufs[x->buf].bytes);
    return 1;
}

static int step_d2h(sim_t *s) {
    engine_t *e = &s->d2h;
    if (e->active || e->n == 0 || s->stop)
        return 0;
    xfer_t *x = &e->q[e->head];
    if (x->issue > s->now)
        return 0;
    e->active = 1;
    e->start = s->now;
    e->hold = s->now;
    e->remaining = (double)s->m->prof->bufs[x->buf].bytes;
    s->res->d2h_bytes += s->m->prof->bufs[x->buf].bytes;
    if (s->res->d2h_delay_ns)
        s->res->d2h_delay_ns[x->buf] += s->now - x->issue;
    trace(s, OOC_TR_D2H_START, (int32_t)s->op, x->buf, -1, s->m->prof->bufs[x->buf].bytes);
    return 1;
}

static void end_h2d(sim_t *s) {
    engine_t *e = &s->h2d;
    int32_t b = e->q[e->head].buf;
    e->head++;
    e->n--;
    e->active = 0;
    trace(s, OOC_TR_H2D_END, (int32_t)s->op, b, -1, s->m->prof->bufs[b].bytes);
    s->st[b] = ST_RES;
    s->host_valid[b] = 1;
}

static void end_d2h(sim_t *s) {
    engine_t *e = &s->d2h;
    int32_t b = e->q[e->head].buf;
    e->head++;
    e->n--;
    e->active = 0;
    trace(s, OOC_TR_D2H_END, (int32_t)s->op, b, -1, s->m->prof->bufs[b].bytes);
    unmap(s, b);
    s->out_bytes -= s->m->fp[b];
    if (s->m->prof->swapout_exclusive)
        s->excl_pending += vmm_ns(s, b, s->m->prof->swapout_vmm_ns);
    else
        (void)lane_take(s, vmm_ns(s, b, s->m->prof->swapout_vmm_ns));
    s->d2h_pending[b] = 0;
    s->host_valid[b] = 1;
    if (s->free_after_d2h[b]) {
        s->free_after_d2h[b] = 0;
        if (s->st[b] == ST_OUTQ)
            s->st[b] = ST_NONE;
    } else if (s->st[b] == ST_OUTQ) {
        s->st[b] = ST_HOST;
    }
}

int ooc_sim_run(const ooc_model_t *m, const ooc_plan_t *pl, const ooc_sim_opts_t *opts,
                ooc_sim_result_t *res) {
    memset(res, 0, sizeof *res);
    res->viol_op = res->viol_buf = -1;
    if (pl->nops != m->n || pl->nbufs != m->nb)
        return OOC_EINVAL;
    const ooc_profile_t *p = m->prof;
    sim_t s = {.m = m, .pl = pl, .res = res, .budget = pl->budget_bytes, .blocked_buf = -1};
    s.tr = opts ? opts->trace : NULL;
    size_t nb = m->nb ? m->nb : 1;
    uint8_t *flags = calloc(nb, 8);
    s.mapped_at = calloc(nb, sizeof *s.mapped_at);
    if (!flags || !s.mapped_at) {
        free(flags);
        free(s.mapped_at);
        return OOC_ENOMEM;
    }
    s.st = flags;
    s.host_valid = flags + nb;
    s.waited = flags + 2 * nb;
    s.d2h_pending = flags + 3 * nb;
    s.free_after_d2h = flags + 4 * nb;
    s.ever = flags + 5 * nb;
    s.dropped = flags + 6 * nb;
    s.premapped = flags + 7 * nb;
    if (opts && opts->want_op_stalls)
        res->op_stall_ns = calloc(m->n ? m->n : 1, sizeof *res->op_stall_ns);
    if (opts && opts->want_attribution) {
        res->h2d_wait_ns = calloc(nb, sizeof(double));
        res->d2h_delay_ns = calloc(nb, sizeof(double));
    }
    if ((opts && opts->want_op_stalls && !res->op_stall_ns) ||
        (opts && opts->want_attribution && (!res->h2d_wait_ns || !res->d2h_delay_ns))) {
        free(flags);
        free(s.mapped_at);
        ooc_sim_result_free(res);
        return OOC_ENOMEM;
    }
    res->feasible = 1;
    memset(s.waited, 1, nb);
    for (uint32_t i = 0; i < pl->nacts; i++)
        if (pl->acts[i].op < 0 || (uint32_t)pl->acts[i].op >= m->n) {
            violate(&s, OOC_EFORMAT, pl->acts[i].op, pl->acts[i].buf, "action on a bad op");
            break;
        }
    /* iteration start: buffers that exist are mapped, unless the plan keeps them on the host */
    for (uint32_t b = 0; b < m->nb && !s.stop; b++) {
        if (p->bufs[b].alloc_idx >= 0)
            continue;
        s.ever[b] = 1;
        if (pl->start_host[b]) {
            s.st[b] = ST_HOST;
            s.host_valid[b] = 1;
        } else if (map(&s, (int32_t)b)) {
            s.st[b] = ST_RES;
            s.host_valid[b] = pl->start_host[b];
        } else {
            violate(&s, OOC_EINFEASIBLE, 0, (int32_t)b,
                    "infeasible: the buffers alive at iteration start need more than the budget "
                    "of %llu bytes (buffer %u does not fit)",
                    (unsigned long long)s.budget, b);
        }
    }
    for (uint32_t b = 0; b < m->nb; b++)
        if (pl->start_host[b] && !p->bufs[b].persistent && !s.stop)
            violate(&s, OOC_EFORMAT, 0, (int32_t)b,
                    "buffer %u starts on the host but is not persistent", b);
    s.phase = m->n ? 0 : 2;
    while (!s.stop) {
        int prog = 1;
        while (prog && !s.stop)
            prog = step_compute(&s) | step_d2h(&s) | step_h2d(&s);
        if (s.stop)
            break;
        if (s.phase == 2 && !s.busy && !s.h2d.n && !s.d2h.n && s.now >= s.excl_end)
            break;
        double next = INFINITY;
        if (s.excl_end > s.now)
            next = s.excl_end;
        if (!s.busy && s.issued && s.issue_at > s.now && s.issue_at < next)
            next = s.issue_at; /* the compute engine waits for the host to issue the op */
        if (s.busy)
            next = s.busy_end;
        double rh = rate(&s, 1), rd = rate(&s, 0);
        if (s.h2d.active && !moving(&s, &s.h2d) && s.h2d.hold < next)
            next = s.h2d.hold;
        if (moving(&s, &s.h2d) && s.now + s.h2d.remaining / rh < next)
            next = s.now + s.h2d.remaining / rh;
        if (moving(&s, &s.d2h) && s.now + s.d2h.remaining / rd < next)
            next = s.now + s.d2h.remaining / rd;
        if (next == INFINITY) {
            if (s.phase != 2 && s.blocked_buf < 0) {
                const ooc_op_t *o = &p->ops[s.op];
                violate(&s, OOC_EINFEASIBLE, (int32_t)s.op, -1,
                        "infeasible: at op %u (%s) the budget of %llu bytes is exhausted "
                        "(%llu bytes mapped) and nothing in flight will release memory",
                        s.op, o->name, (unsigned long long)s.budget, (unsigned long long)s.used);
            } else {
                violate(&s, OOC_EINFEASIBLE, (int32_t)s.op, s.h2d.n ? s.h2d.q[s.h2d.head].buf : -1,
                        "infeasible: a swap-in cannot get memory before op %u (%llu of %llu "
                        "bytes mapped)",
                        s.op, (unsigned long long)s.used, (unsigned long long)s.budget);
            }
            break;
        }
        double dt = next - s.now;
        int h_act = moving(&s, &s.h2d), d_act = moving(&s, &s.d2h);
        if (h_act)
            s.h2d.remaining -= dt * rh;
        if (d_act)
            s.d2h.remaining -= dt * rd;
        s.now = next;
        if (s.busy && s.busy_end <= s.now)
            end_compute(&s);
        if (h_act && s.h2d.remaining <= 1e-3 * rh + 1e-9)
            end_h2d(&s);
        if (d_act && s.d2h.remaining <= 1e-3 * rd + 1e-9)
            end_d2h(&s);
    }
    if (!s.stop) {
        /* the iteration must end as it started, so that the next one can repeat it */
        for (uint32_t b = 0; b < m->nb; b++) {
            if (!p->bufs[b].persistent)
                continue;
            int host = s.st[b] == ST_HOST;
            if (host != pl->start_host[b] || (s.st[b] != ST_HOST && s.st[b] != ST_RES)) {
                violate(&s, OOC_EFORMAT, (int32_t)m->n - 1, (int32_t)b,
                        "persistent buffer %u ends the iteration %s but starts it %s", b,
                        host ? "on the host" : "not on the host",
                        pl->start_host[b] ? "on the host" : "resident");
                break;
            }
        }
    }
    res->time_ns = (uint64_t)llround(s.now);
    for (uint32_t i = 0; i < pl->nacts; i++)
        if (pl->acts[i].kind == OOC_ACT_RECOMPUTE)
            for (uint32_t k = 0; k < pl->acts[i].nvia; k++)
                res->recompute_ns += p->ops[pl->via[pl->acts[i].via_off + k]].duration_ns;
    for (uint32_t b = 0; b < m->nb; b++) {
        if (pl->decision[b] == OOC_SWAP)
            res->n_swap++;
        else if (pl->decision[b] == OOC_RECOMPUTE)
            res->n_recompute++;
        else
            res->n_keep++;
    }
    free(flags);
    free(s.mapped_at);
    free(s.h2d.q);
    free(s.d2h.q);
    return 0;
}
