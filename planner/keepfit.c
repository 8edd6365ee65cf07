/* SPDX-License-Identifier: MIT */
/* keepfit.c: keeps the buffers whose release the simulated timeline did not need.
 *
 * A swapped (or dropped) gap releases its buffer's chunks when the copy-out ends (or at the drop)
 * and maps them again when the swap-in starts (or at the rebuild). Where, in the simulated
 * timeline, the memory mapped between those two moments always left room for the buffer, the
 * release made room that nothing used: the copies (or the rebuild) bought nothing. keep_refine
 * reads one traced simulation, switches such gaps to keep, largest first, each only where the
 * room is still there with the ones switched before it counted in (a segment tree over the
 * trace's events: range add, range max), and keeps the result only when the simulator finds it
 * faster: the timeline moves when copies go, so the room read is a guess the simulation judges.
 * Then it tries each swapped gap that may be rebuilt as a rebuild, largest first, within a
 * simulation budget. Every schedule is judged as auto takes it: the faster of its plan and that
 * plan with its swap-ins issued in need order. Caller: auto (auto.c), on the best schedule it
 * found. Not thread-safe on one schedule; deterministic. */
#include "schedule.h"

#include <stdlib.h>
#include <string.h>

/* Range add and range max over [0, n), recursive over node i covering [l, r]. */
typedef struct {
    int64_t *mx, *ad;
    int32_t n;
} rmq_t;

static void rmq_build(rmq_t *t, const int64_t *v, int32_t i, int32_t l, int32_t r) {
    t->ad[i] = 0;
    if (l == r) {
        t->mx[i] = v[l];
        return;
    }
    int32_t mid = l + (r - l) / 2;
    rmq_build(t, v, 2 * i, l, mid);
    rmq_build(t, v, 2 * i + 1, mid + 1, r);
    t->mx[i] = t->mx[2 * i] > t->mx[2 * i + 1] ? t->mx[2 * i] : t->mx[2 * i + 1];
}

static void rmq_add(rmq_t *t, int32_t i, int32_t l, int32_t r, int32_t lo, int32_t hi, int64_t v) {
    if (hi < l || r < lo)
        return;
    if (lo <= l && r <= hi) {
        t->mx[i] += v;
        t->ad[i] += v;
        return;
    }
    int32_t mid = l + (r - l) / 2;
    rmq_add(t, 2 * i, l, mid, lo, hi, v);
    rmq_add(t, 2 * i + 1, mid + 1, r, lo, hi, v);
    int64_t a = t->mx[2 * i], b = t->mx[2 * i + 1];
    t->mx[i] = (a > b ? a : b) + t->ad[i];
}

static int64_t rmq_max(const rmq_t *t, int32_t i, int32_t l, int32_t r, int32_t lo, int32_t hi) {
    if (hi < l || r < lo)
        return INT64_MIN / 4;
    if (lo <= l && r <= hi)
        return t->mx[i];
    int32_t mid = l + (r - l) / 2;
    int64_t a = rmq_max(t, 2 * i, l, mid, lo, hi), b = rmq_max(t, 2 * i + 1, mid + 1, r, lo, hi);
    return (a > b ? a : b) + t->ad[i];
}

/* One release and the mapping after it: buffer buf unmapped by trace event iu and mapped again by
 * event im, the compute engine at op ou and om then. */
typedef struct {
    int32_t buf, iu, im, ou, om;
    uint64_t fp;
} rel_t;

static int rel_cmp(const void *a, const void *b) {
    const rel_t *x = a, *y = b;
    if (x->fp != y->fp)
        return x->fp > y->fp ? -1 : 1;
    if (x->iu != y->iu)
        return x->iu < y->iu ? -1 : 1;
    return x->buf < y->buf ? -1 : x->buf > y->buf;
}

/* The swapped or recomputed gap of b that a release (the compute engine at op ou) and the mapping
 * after it (at op om) belong to: the release follows the use that opens the gap (from <= ou) and
 * the mapping is for the use that closes it, which the compute engine has not passed (to >= om);
 * of those, the one that closes first. NULL when none. */
static gap_t *released_gap(const sched_t *s, int32_t b, int32_t ou, int32_t om) {
    gap_t *best = NULL;
    for (uint32_t k = s->gap_off[b]; k < s->gap_off[b + 1]; k++) {
        gap_t *g = &s->g[k];
        if (g->dec != OOC_KEEP && g->from <= ou && g->to >= om && (!best || g->to < best->to))
            best = g;
    }
    return best;
}

/* Scores schedule s as auto would take it: its plan and the copy with swap-ins issued in need
 * order (sched_issue_in_need_order), the faster of the two; with tr, the faster is simulated
 * again into tr. Returns 0 or OOC_ENOMEM; *sc is UINT64_MAX when neither is feasible. */
static int score2(const sched_t *s, uint64_t budget, ooc_trace_t *tr, uint64_t *sc) {
    ooc_plan_t *pl[2] = {NULL, NULL};
    uint64_t v[2] = {UINT64_MAX, UINT64_MAX};
    int rc = sched_plan(s, "keep", budget, &pl[0]);
    if (!rc)
        rc = sched_issue_in_need_order(pl[0], &pl[1]);
    for (int i = 0; i < 2 && !rc; i++) {
        ooc_sim_result_t r = {0};
        if ((rc = ooc_sim_run(s->m, pl[i], NULL, &r)) == 0)
            v[i] = sched_score(&r);
        ooc_sim_result_free(&r);
    }
    int w = v[1] < v[0];
    *sc = v[w];
    if (!rc && tr && v[w] != UINT64_MAX) {
        ooc_sim_opts_t o = {.trace = tr};
        ooc_sim_result_t r = {0};
        rc = ooc_sim_run(s->m, pl[w], &o, &r);
        ooc_sim_result_free(&r);
    }
    ooc_plan_free(pl[0]);
    ooc_plan_free(pl[1]);
    return rc;
}

/* One round: simulates s with a trace and switches to keep the gaps whose release found room
 * that nothing used (logging each switched gap's index in sw[], *nsw of them). Returns 0 or
 * OOC_ENOMEM. */
typedef struct {
    uint32_t k;
    uint8_t dec;
} sw_t;

static int switch_round(sched_t *s, uint64_t budget, sw_t *sw, uint32_t *nsw) {
    const ooc_model_t *m = s->m;
    ooc_trace_t tr = {0};
    uint64_t sc;
    int rc = score2(s, budget, &tr, &sc);
    *nsw = 0;
    if (rc || sc == UINT64_MAX || tr.n == 0) {
        ooc_trace_free(&tr);
        return rc;
    }
    int32_t ne = (int32_t)tr.n;
    int64_t *use = malloc((size_t)ne * sizeof *use);
    int32_t *last = malloc((m->nb ? m->nb : 1) * sizeof *last);
    rel_t *rel = malloc((size_t)ne * sizeof *rel);
    rmq_t t = {malloc(4 * (size_t)ne * sizeof(int64_t)), malloc(4 * (size_t)ne * sizeof(int64_t)),
               ne};
    uint32_t nr = 0;
    if (!use || !last || !rel || !t.mx || !t.ad) {
        rc = OOC_ENOMEM;
        goto out;
    }
    for (uint32_t b = 0; b < m->nb; b++)
        last[b] = -1;
    int64_t cur = 0;
    for (int32_t e = 0; e < ne; e++) {
        const ooc_trace_ev_t *ev = &tr.ev[e];
        if (ev->kind == OOC_TR_MAP) {
            cur += (int64_t)ev->bytes;
            if (last[ev->buf] >= 0)
                rel[nr++] = (rel_t){ev->buf, last[ev->buf], e, tr.ev[last[ev->buf]].op,
                                    ev->op,  m->fp[ev->buf]};
            last[ev->buf] = -1;
        } else if (ev->kind == OOC_TR_UNMAP) {
            cur -= (int64_t)ev->bytes;
            last[ev->buf] = e;
        }
        use[e] = cur;
    }
    rmq_build(&t, use, 1, 0, ne - 1);
    qsort(rel, nr, sizeof *rel, rel_cmp);
    for (uint32_t i = 0; i < nr; i++) {
        const rel_t *x = &rel[i];
        /* mapped after the release up to just before the mapping again */
        int64_t top = rmq_max(&t, 1, 0, ne - 1, x->iu, x->im - 1);
        if (top + (int64_t)x->fp > (int64_t)budget)
            continue;
        gap_t *g = released_gap(s, x->buf, x->ou, x->om);
        if (!g)
            continue;
        rmq_add(&t, 1, 0, ne - 1, x->iu, x->im - 1, (int64_t)x->fp);
        sw[(*nsw)++] = (sw_t){(uint32_t)(g - s->g), g->dec};
        g->dec = OOC_KEEP;
    }
out:
    free(use);
    free(last);
    free(rel);
    free(t.mx);
    free(t.ad);
    ooc_trace_free(&tr);
    return rc;
}

/* A candidate of rebuild_pass: gap k of a buffer of `bytes`. */
typedef struct {
    uint64_t bytes;
    int32_t from;
    uint32_t k;
} cand_t;

/* Larger buffers first, then the earlier gap, then the gap's index. */
static int cand_cmp(const void *a, const void *b) {
    const cand_t *x = a, *y = b;
    if (x->bytes != y->bytes)
        return x->bytes > y->bytes ? -1 : 1;
    if (x->from != y->from)
        return x->from < y->from ? -1 : 1;
    return x->k < y->k ? -1 : x->k > y->k;
}

/* Tries each swapped gap that may be rebuilt instead, largest buffer first, one simulation each
 * (at most max_sims), and keeps the switch when faster: with the rest of the plan fixed, the
 * simulator sees where a rebuild's inputs are and what room they take. *cur holds the score of
 * s. Returns 0 or OOC_ENOMEM. */
static int rebuild_pass(sched_t *s, uint64_t budget, uint64_t *cur, uint32_t max_sims) {
    const ooc_model_t *m = s->m;
    cand_t *c = malloc((s->ng ? s->ng : 1) * sizeof *c);
    sched_t keep = {0};
    uint32_t nc = 0;
    int rc = 0;
    if (!c || (rc = sched_copy(&keep, s)) != 0) {
        free(c);
        return rc ? rc : OOC_ENOMEM;
    }
    for (uint32_t k = 0; k < s->ng; k++) {
        gap_t *g = &s->g[k];
        if (g->dec == OOC_SWAP && m->recomp[g->buf] && g->to < (int32_t)m->n &&
            g->to <= m->recomp_until[g->buf])
            c[nc++] = (cand_t){m->prof->bufs[g->buf].bytes, g->from, k};
    }
    qsort(c, nc, sizeof *c, cand_cmp);
    /* each switch as it stands, then with the swap-ins placed again (a rebuild's inputs come in
     * before it: they may be better placed) */
    for (uint32_t i = 0, sims = 0; i < nc && sims < max_sims && !rc; i++) {
        s->g[c[i].k].dec = OOC_RECOMPUTE;
        uint64_t sc = UINT64_MAX;
        for (int place = 0; place < 2 && sc >= *cur && !rc; place++, sims++) {
            if (place)
                rc = sched_place_swapins(s, budget);
            if (!rc)
                rc = score2(s, budget, NULL, &sc);
        }
        if (!rc && sc < *cur) {
            *cur = sc;
            memcpy(keep.g, s->g, s->ng * sizeof *s->g);
        } else {
            memcpy(s->g, keep.g, s->ng * sizeof *s->g);
        }
    }
    sched_free(&keep);
    free(c);
    return rc;
}

int keep_refine(sched_t *s, uint64_t budget, int rounds, uint32_t max_sims) {
    sw_t *sw = malloc((s->ng ? s->ng : 1) * sizeof *sw);
    uint64_t cur = UINT64_MAX;
    int rc = sw ? score2(s, budget, NULL, &cur) : OOC_ENOMEM;
    for (int round = 0; !rc && round < rounds && cur != UINT64_MAX; round++) {
        uint32_t nsw = 0;
        uint64_t sc;
        if ((rc = switch_round(s, budget, sw, &nsw)) || nsw == 0)
            break;
        if ((rc = score2(s, budget, NULL, &sc)))
            break;
        if (sc >= cur) {
            while (nsw-- > 0)
                s->g[sw[nsw].k].dec = sw[nsw].dec;
            break;
        }
        cur = sc;
    }
    if (!rc && cur != UINT64_MAX)
        rc = rebuild_pass(s, budget, &cur, max_sims);
    free(sw);
    return rc;
}
