/* SPDX-License-Identifier: MIT */
/* belady.c: the next-use policy: walk the ops and, whenever the buffers that must be resident
 * exceed the budget, evict the kept buffer whose next use is farthest (Belady's rule; the larger
 * first among equals), swapping it out after its last use and back in before its next one, or
 * rebuilding it there when its producers are cheap enough (either every such buffer up front, or
 * only those evicted).
 *
 * The walk is static (no timing): memory is the footprint of the buffers resident between their
 * uses under the decisions taken so far, the way sched_place_swapins counts it. Evicting a buffer
 * frees it from its last use on, so earlier ops only get more room. The result is a schedule;
 * swap-ins are placed by the caller (as early as memory allows, or a fixed number of ops ahead),
 * and the simulator judges it. `belady_schedule` is shared with auto, which evaluates several
 * variants (which recomputes, how much of the budget the walk may fill, where swap-ins go). With
 * a pin share > 0 (auto only) the walk also counts a rebuild's inputs: it rebuilds only where they
 * are on the device anyway and keeps them resident from the rebuild to their next use. */
#include "schedule.h"

#include <stdlib.h>
#include <string.h>

/* The heap's context: the schedule, and per gap whether eviction should take it first (a cheap
 * rebuild, when rebuilds are preferred; NULL: no preference). */
typedef struct {
    const sched_t *s;
    const uint8_t *first;
} order_t;

/* The heap order: the gaps to take first, then the farthest next use (`to`), then the larger
 * footprint. */
static int farther(const void *ctx, uint32_t x, uint32_t y) {
    const order_t *c = ctx;
    const sched_t *s = c->s;
    if (c->first && c->first[x] != c->first[y])
        return c->first[x] > c->first[y];
    const gap_t *gx = &s->g[x], *gy = &s->g[y];
    if (gx->to != gy->to)
        return gx->to > gy->to;
    uint64_t fx = s->m->fp[gx->buf], fy = s->m->fp[gy->buf];
    if (fx != fy)
        return fx > fy;
    return x < y;
}

/* Producers' time of buffer b, ns. */
static double rebuild_ns(const ooc_model_t *m, int32_t b) {
    const ooc_profile_t *p = m->prof;
    const ooc_buffer_t *bf = &p->bufs[b];
    double t = 0;
    for (uint32_t k = 0; k < bf->nprod; k++)
        t += (double)p->ops[p->prods[bf->prod_off + k]].duration_ns;
    return t;
}

/* May gap g be rebuilt instead of kept, at most rec_ns_per_byte per byte? */
static int cheap_rebuild(const ooc_model_t *m, const gap_t *g, double rec_ns_per_byte) {
    int32_t b = g->buf;
    return rec_ns_per_byte > 0 && m->recomp[b] && g->to < (int32_t)m->n &&
           g->to <= m->recomp_until[b] &&
           rebuild_ns(m, b) <= rec_ns_per_byte * (double)m->prof->bufs[b].bytes;
}

/* Can gap g be rebuilt before its next use t with its producers' inputs already there? Each input
 * is used by op t itself or sits in a kept gap that no rebuild empties (need[] < to marks the gaps
 * that rebuilds read; a gap that is itself rebuilt is never read), whose stay from t to its next
 * use costs at most `pin` times the footprint-ops the rebuild saves, and with which every op
 * until then still fits `budget` on its own working set. With commit, the input gaps are marked
 * needed by t: the walk keeps them resident from t on even when evicted earlier (the emitter
 * brings a swapped input back before the recompute). */
enum { PIN_MAX = 16 }; /* inputs of one rebuild that may stay (more: no rebuild) */
static int inputs_ready(const sched_t *s, const gap_t *g, int32_t *need, double pin,
                        uint64_t budget, int commit) {
    const ooc_model_t *m = s->m;
    const ooc_profile_t *p = m->prof;
    const ooc_buffer_t *bf = &p->bufs[g->buf];
    int32_t n = (int32_t)m->n, until[PIN_MAX];
    uint64_t fp[PIN_MAX];
    uint32_t np = 0;
    for (uint32_t j = 0; j < bf->nprod; j++) {
        const ooc_op_t *o = &p->ops[p->prods[bf->prod_off + j]];
        for (uint32_t r = 0; r < o->nref; r++) {
            int32_t x = p->refs[o->ref_off + r].buf;
            gap_t *xg = x == g->buf ? NULL : sched_gap_at(s, x, g->to);
            if (!xg)
                continue;
            int32_t t = xg->to >= n && g->to <= xg->from ? g->to + n : g->to;
            if (t >= xg->to)
                continue; /* op t uses it */
            if (xg->dec != OOC_KEEP || np == PIN_MAX)
                return 0;
            /* the input stays from t to its next use: worth it only when that is short */
            if ((double)m->fp[x] * (double)(xg->to - t) >
                pin * (double)m->fp[g->buf] * (double)(g->to - g->from))
                return 0;
            fp[np] = m->fp[x];
            until[np++] = g->to + (xg->to - t);
            if (commit && t < need[xg - s->g])
                need[xg - s->g] = t;
        }
    }
    /* the ops until the inputs' next uses hold them beside their own buffers */
    for (int32_t i = g->to; !commit && i < n; i++) {
        uint64_t extra = 0;
        for (uint32_t q = 0; q < np; q++)
            extra += until[q] > i ? fp[q] : 0;
        if (!extra)
            break;
        if (m->ws[i] + extra > budget)
            return 0;
    }
    return 1;
}

/* Gap g becomes a rebuild when it may be, is not read by another rebuild and has its inputs. */
static int try_rebuild(const sched_t *s, const gap_t *g, int32_t *need, double rec_ns_per_byte,
                       double pin, uint64_t budget) {
    if (!cheap_rebuild(s->m, g, rec_ns_per_byte))
        return 0;
    if (pin <= 0)
        return 1; /* inputs left to the emitter */
    if (need[g - s->g] != INT32_MAX || !inputs_ready(s, g, need, pin, budget, 0))
        return 0;
    inputs_ready(s, g, need, pin, budget, 1);
    return 1;
}

int belady_schedule(sched_t *s, uint64_t budget, double rec_ns_per_byte, int on_evict, double pin) {
    const ooc_model_t *m = s->m;
    const ooc_profile_t *p = m->prof;
    int32_t n = (int32_t)m->n;
    if (n == 0)
        return 0;
    /* 1. unless rebuilds wait for evictions, rebuild every gap that may be, cheaply enough */
    int32_t *need = malloc((s->ng ? s->ng : 1) * sizeof *need);
    if (!need)
        return OOC_ENOMEM;
    for (uint32_t k = 0; k < s->ng; k++) {
        s->g[k].dec = OOC_KEEP;
        s->g[k].in_at = s->g[k].to;
        need[k] = INT32_MAX;
    }
    for (uint32_t k = 0; k < s->ng && !on_evict; k++)
        if (try_rebuild(s, &s->g[k], need, rec_ns_per_byte, pin, budget))
            s->g[k].dec = OOC_RECOMPUTE;
    /* per op: the gaps that start there (by reference), to push them when the op is done */
    uint32_t *start_off = calloc((size_t)n + 2, sizeof *start_off);
    uint32_t *starts = malloc((s->ng ? s->ng : 1) * sizeof *starts);
    uint8_t *first = on_evict == 2 ? malloc(s->ng ? s->ng : 1) : NULL;
    order_t ord = {s, first};
    sched_heap_t h = {malloc(((size_t)s->ng + m->nb + 1) * sizeof(uint32_t)), 0, farther, &ord};
    int64_t *delta = calloc((size_t)n + 1, sizeof *delta); /* memory arriving at op i */
    if (!start_off || !starts || !h.a || !delta || (on_evict == 2 && !first)) {
        free(need);
        free(start_off);
        free(starts);
        free(first);
        free(h.a);
        free(delta);
        return OOC_ENOMEM;
    }
    for (uint32_t k = 0; first && k < s->ng; k++)
        first[k] = (uint8_t)cheap_rebuild(m, &s->g[k], rec_ns_per_byte);
    for (uint32_t k = 0; k < s->ng; k++)
        start_off[s->g[k].from + 1]++;
    for (int32_t i = 0; i < n; i++)
        start_off[i + 1] += start_off[i];
    {
        uint32_t *pos = calloc((size_t)n + 1, sizeof *pos);
        if (!pos) {
            free(need);
            free(start_off);
            free(starts);
            free(first);
            free(h.a);
            free(delta);
            return OOC_ENOMEM;
        }
        for (uint32_t k = 0; k < s->ng; k++) {
            int32_t f = s->g[k].from;
            starts[start_off[f] + pos[f]++] = k;
        }
        free(pos);
    }
    /* memory at the start: buffers that exist; persistent ones sit in their wrapping gap, which
     * may be evicted like any other */
    int64_t res = 0;
    for (uint32_t b = 0; b < m->nb; b++) {
        const ooc_buffer_t *bf = &p->bufs[b];
        if (bf->alloc_idx >= 0 || (bf->persistent && m->nuse[b] == 0))
            continue;
        res += (int64_t)m->fp[b];
        if (bf->persistent) {
            uint32_t last = s->gap_off[b + 1];
            if (last > s->gap_off[b] && s->g[last - 1].to >= n)
                sched_heap_push(&h, last - 1);
        }
    }
    for (int32_t i = 0; i < n; i++) {
        const ooc_op_t *o = &p->ops[i];
        /* buffers op i needs that are not resident: first uses, and gaps that end here */
        res += delta[i];
        for (uint32_t r = 0; r < o->nref; r++) {
            int32_t b = p->refs[o->ref_off + r].buf;
            if (m->uses[m->use_off[b]] == i && p->bufs[b].alloc_idx >= 0)
                res += (int64_t)m->fp[b];
        }
        /* over the budget: evict the kept buffer whose next use is farthest */
        while (res > (int64_t)budget && h.n > 0) {
            uint32_t k = sched_heap_pop(&h);
            gap_t *g = &s->g[k];
            /* stale: decided already, or not open at op i (op i itself uses it) */
            int32_t t = g->to >= n && i <= g->from ? i + n : i;
            if (g->dec != OOC_KEEP || !(g->from < t && t < g->to))
                continue;
            /* a rebuild reads it before need[k]: off until then at most, and not at all after */
            int32_t to = g->to < need[k] ? g->to : need[k];
            if (to <= t)
                continue;
            g->dec = on_evict && try_rebuild(s, g, need, rec_ns_per_byte, pin, budget)
                         ? OOC_RECOMPUTE
                         : OOC_SWAP;
            res -= (int64_t)m->fp[g->buf];
            int32_t back = to < n ? to : t == i + n ? to - n : -1;
            if (back >= 0)
                delta[back] += (int64_t)m->fp[g->buf]; /* else: back in the next iteration */
        }
        /* after op i: gaps that start here are kept for now; recomputed and swapped ones leave;
         * a buffer without a next use leaves (freed, or swapped out dead) */
        for (uint32_t q = start_off[i]; q < start_off[i + 1]; q++) {
            gap_t *g = &s->g[starts[q]];
            if (g->dec == OOC_KEEP) {
                sched_heap_push(&h, starts[q]);
            } else {
                res -= (int64_t)m->fp[g->buf];
                if (g->to < n)
                    delta[g->to] += (int64_t)m->fp[g->buf];
            }
        }
        for (uint32_t r = 0; r < o->nref; r++) {
            int32_t b = p->refs[o->ref_off + r].buf;
            if (!p->bufs[b].persistent && m->uses[m->use_off[b] + m->nuse[b] - 1] == i)
                res -= (int64_t)m->fp[b]; /* the next use, if any, is counted by its gap */
        }
    }
    free(need);
    free(start_off);
    free(starts);
    free(first);
    free(h.a);
    free(delta);
    return 0;
}

/* Sets every swapped gap's swap-in `ahead` ops before its use (0: as early as memory allows). */
static int place(sched_t *s, uint64_t budget, int32_t ahead) {
    if (ahead == 0)
        return sched_place_swapins(s, budget);
    for (uint32_t k = 0; k < s->ng; k++) {
        gap_t *g = &s->g[k];
        if (g->dec != OOC_SWAP)
            continue;
        g->in_at = g->to - ahead > g->from ? g->to - ahead : g->from + 1;
    }
    return 0;
}

int belady_best(sched_t *s, uint64_t budget, uint64_t *score) {
    const ooc_model_t *m = s->m;
    const ooc_profile_t *p = m->prof;
    /* recompute: never, where cheaper than one copy, than both copies, or always */
    double per_byte = 1e9 / (p->h2d_bps < p->d2h_bps ? p->h2d_bps : p->d2h_bps);
    /* rebuild thresholds, each up front or on eviction (none: once) */
    const double rec[] = {0, per_byte, per_byte, 2 * per_byte, 2 * per_byte, 1e300, 1e300};
    static const int evict[] = {0, 0, 1, 0, 1, 0, 1};
    static const double fill[] = {1.0, 0.9, 0.8};
    static const int32_t ahead[] = {0, 2, 8};
    sched_t best = {0};
    uint64_t best_sc = UINT64_MAX;
    int rc = 0;
    for (size_t a = 0; a < sizeof rec / sizeof rec[0] && !rc; a++)
        for (size_t f = 0; f < sizeof fill / sizeof fill[0] && !rc; f++) {
            uint64_t b2 = (uint64_t)((double)budget * fill[f]);
            if (f > 0 && ooc_model_check_budget(m, b2, NULL, NULL, 0))
                break;
            if ((rc = belady_schedule(s, b2, rec[a], evict[a], 0)))
                break;
            for (size_t h = 0; h < sizeof ahead / sizeof ahead[0] && !rc; h++) {
                ooc_sim_result_t r;
                if ((rc = place(s, budget, ahead[h])) || (rc = sched_eval(s, budget, NULL, &r)))
                    break;
                uint64_t sc = sched_score(&r);
                ooc_sim_result_free(&r);
                if (sc < best_sc) {
                    best_sc = sc;
                    sched_free(&best);
                    rc = sched_copy(&best, s);
                }
            }
        }
    if (!rc && best.g) {
        memcpy(s->g, best.g, s->ng * sizeof *s->g);
    }
    sched_free(&best);
    *score = best_sc;
    return rc;
}

/* Is this variant one of belady_best's (which auto has simulated already)? */
static int basic_variant(size_t f, size_t a, size_t h) {
    return f < 3 && (a < 3 || a == 5 || a == 6 || a == 11 || a == 12) && h < 3;
}

int belady_search(sched_t *s, uint64_t budget, uint32_t max_sims, uint64_t *score) {
    const ooc_model_t *m = s->m;
    const ooc_profile_t *p = m->prof;
    double per_byte = 1e9 / (p->h2d_bps < p->d2h_bps ? p->h2d_bps : p->d2h_bps);
    /* most useful first, as the simulations may run out: the whole budget for the walk, then
     * smaller shares; rebuild thresholds in copies' times, each up front or on eviction;
     * placements (room > 0: as early as `room` of the budget allows; else `ahead` ops before the
     * use). The first three of each list, with the thresholds 0, 1, 2 and any, are belady_best's
     * grid, skipped here. */
    static const double fill[] = {1.0, 0.9, 0.8, 0.95, 0.85, 0.7, 0.6};
    static const double rec[] = {0, 1, 1, 0.5, 0.5, 2, 2, 4, 4, 16, 16, 1e300, 1e300, 1, 16, 1e300};
    static const int evict[] = {0, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 2, 2, 2};
    static const double room[] = {1.0, 0, 0, 0.95, 0.9, 0.8, 0};
    static const int32_t ahead[] = {0, 2, 8, 0, 0, 0, 32};
    sched_t best = {0};
    uint64_t best_sc = *score;
    uint32_t sims = 0;
    int rc = best_sc != UINT64_MAX ? sched_copy(&best, s) : 0; /* what s holds, to restore */
    for (size_t f = 0; f < sizeof fill / sizeof fill[0] && !rc && sims < max_sims; f++) {
        uint64_t walk = (uint64_t)((double)budget * fill[f]);
        if (f > 0 && ooc_model_check_budget(m, walk, NULL, NULL, 0))
            continue;
        for (size_t a = 0; a < sizeof rec / sizeof rec[0] && !rc && sims < max_sims; a++) {
            int scheduled = 0;
            for (size_t h = 0; h < sizeof room / sizeof room[0] && !rc && sims < max_sims; h++) {
                if (basic_variant(f, a, h))
                    continue;
                if (!scheduled && (rc = belady_schedule(s, walk, rec[a] * per_byte, evict[a], 0)))
                    break;
                scheduled = 1;
                ooc_sim_result_t r;
                uint64_t at = (uint64_t)((double)budget * room[h]);
                sims++;
                if ((rc = room[h] > 0 ? sched_place_swapins(s, at) : place(s, budget, ahead[h])) ||
                    (rc = sched_eval(s, budget, NULL, &r)))
                    break;
                uint64_t sc = sched_score(&r);
                ooc_sim_result_free(&r);
                if (sc < best_sc) {
                    best_sc = sc;
                    sched_free(&best);
                    rc = sched_copy(&best, s);
                }
            }
        }
    }
    /* then rebuilds that find their inputs on the device (pin > 0), with as many simulations
     * again: where a rebuild's input would have to come back for it, the walk swaps instead, and
     * an input a rebuild reads stays from there on, which the walk counts */
    static const double pin[] = {0.1, 0.05, 0.25};
    static const int pev[] = {0, 2};
    static const double pfill[] = {1.0, 0.9}, prec[] = {16, 1}, proom[] = {1.0, 0.9};
    sims = 0;
    for (size_t q = 0; q < sizeof pin / sizeof pin[0] && !rc && sims < max_sims; q++)
        for (size_t e = 0; e < sizeof pev / sizeof pev[0] && !rc && sims < max_sims; e++)
            for (size_t f = 0; f < sizeof pfill / sizeof pfill[0] && !rc && sims < max_sims; f++)
                for (size_t a = 0; a < sizeof prec / sizeof prec[0] && !rc && sims < max_sims;
                     a++) {
                    uint64_t walk = (uint64_t)((double)budget * pfill[f]);
                    if (f > 0 && ooc_model_check_budget(m, walk, NULL, NULL, 0))
                        continue;
                    if ((rc = belady_schedule(s, walk, prec[a] * per_byte, pev[e], pin[q])))
                        break;
                    for (size_t h = 0; h < sizeof proom / sizeof proom[0] && !rc && sims < max_sims;
                         h++) {
                        ooc_sim_result_t r;
                        sims++;
                        if ((rc = sched_place_swapins(s, (uint64_t)((double)budget * proom[h]))) ||
                            (rc = sched_eval(s, budget, NULL, &r)))
                            break;
                        uint64_t sc = sched_score(&r);
                        ooc_sim_result_free(&r);
                        if (sc < best_sc) {
                            best_sc = sc;
                            sched_free(&best);
                            rc = sched_copy(&best, s);
                        }
                    }
                }
    if (!rc && best.g)
        memcpy(s->g, best.g, s->ng * sizeof *s->g);
    sched_free(&best);
    *score = best_sc;
    return rc;
}

int pol_belady(const ooc_model_t *m, const ooc_policy_opts_t *o, ooc_plan_t **out) {
    sched_t s;
    sched_memo_t *memo;
    int rc = sched_memo_new(&memo);
    if (!rc && (rc = sched_init(&s, m)) != 0)
        sched_memo_free(memo);
    if (rc)
        return rc;
    s.memo = memo;
    uint64_t sc;
    rc = belady_best(&s, o->budget_bytes, &sc);
    if (rc == 0)
        rc = sched_plan(&s, "belady", o->budget_bytes, out);
    sched_free(&s);
    sched_memo_free(memo);
    return rc;
}
