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
 * Callers: auto (auto.c), on the schedules it refines. Not thread-safe on one schedule. */
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

/* One release and the mapping after it: buffer buf unmapped by trace event iu (the compute engine
 * at op ou) and mapped again by event im. */
typedef struct {
    int32_t buf, iu, im, ou;
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

/* The swapped or recomputed gap of b that the release at op ou belongs to: the latest one that
 * starts at or before ou (the release follows the use that opens the gap). NULL when none. */
static gap_t *released_gap(const sched_t *s, int32_t b, int32_t ou) {
    gap_t *best = NULL;
    for (uint32_t k = s->gap_off[b]; k < s->gap_off[b + 1]; k++) {
        gap_t *g = &s->g[k];
        if (g->dec != OOC_KEEP && g->from <= ou && (!best || g->from > best->from))
            best = g;
    }
    return best;
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
    ooc_sim_opts_t o = {.trace = &tr};
    ooc_sim_result_t r;
    int rc = sched_eval(s, budget, &o, &r);
    *nsw = 0;
    if (rc || !r.feasible || tr.n == 0) {
        ooc_sim_result_free(&r);
        ooc_trace_free(&tr);
        return rc;
    }
    ooc_sim_result_free(&r);
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
            if (last[ev->buf] >= 0 && e > last[ev->buf] + 1)
                rel[nr++] = (rel_t){ev->buf, last[ev->buf], e, tr.ev[last[ev->buf]].op,
                                    m->fp[ev->buf]};
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
        gap_t *g = released_gap(s, x->buf, x->ou);
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

int keep_refine(sched_t *s, uint64_t budget, int rounds) {
    sw_t *sw = malloc((s->ng ? s->ng : 1) * sizeof *sw);
    int rc = 0;
    if (!sw) {
        rc = OOC_ENOMEM;
        goto out;
    }
    ooc_sim_result_t r;
    if ((rc = sched_eval(s, budget, NULL, &r)))
        goto out;
    uint64_t cur = sched_score(&r);
    if (!s->memo)
        ooc_sim_result_free(&r);
    for (int round = 0; round < rounds && cur != UINT64_MAX; round++) {
        uint32_t nsw = 0;
        if ((rc = switch_round(s, budget, sw, &nsw)) || nsw == 0)
            break;
        if ((rc = sched_eval(s, budget, NULL, &r)))
            break;
        uint64_t sc = sched_score(&r);
        if (!s->memo)
            ooc_sim_result_free(&r);
        if (sc >= cur) {
            while (nsw-- > 0)
                s->g[sw[nsw].k].dec = sw[nsw].dec;
            break;
        }
        cur = sc;
    }
out:
    free(sw);
    return rc;
}
