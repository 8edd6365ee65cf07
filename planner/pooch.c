/* SPDX-License-Identifier: MIT */
/* pooch.c: PoocH's classification (section 4 of the PoocH paper), evaluated by our simulator.
 *
 * Start from "everything swapped" with swap-ins issued as soon as memory allows (section 4.3).
 * Simulate once and read the timeline: LO is the set of buffers whose swap-outs are not hidden
 * (they queue on the copy engine or hold memory the compute engine waits for), LI the set whose
 * swap-ins stall the compute engine. Other buffers stay swapped. Then LO is switched to keep
 * greedily from the output side (latest first) while that helps, and LI is searched (greedily,
 * largest stall first: the paper's exhaustive search over LI does not scale past a few dozen
 * elements). Finally each remaining swap X whose buffer may be recomputed gets
 * r(X) = recompute overhead / swap overhead from two simulations, and the smallest r < 1 is
 * switched to recompute, repeatedly, as in section 4.4.3. Every step is bounded by a simulation
 * budget so that planning time stays predictable. */
#include "schedule.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    sched_t *s;
    uint64_t budget;
    uint32_t sims, max_sims;
    uint64_t cur; /* score of the current schedule */
} search_t;

/* Places swap-ins and simulates; returns the score (UINT64_MAX when infeasible or out of
 * budget). */
static uint64_t eval(search_t *x, const ooc_sim_opts_t *o, ooc_sim_result_t *keep_res,
                     uint64_t budget) {
    if (x->sims >= x->max_sims)
        return UINT64_MAX;
    x->sims++;
    if (sched_place_swapins(x->s, budget))
        return UINT64_MAX;
    ooc_sim_result_t r;
    if (sched_eval(x->s, budget, o, &r))
        return UINT64_MAX;
    uint64_t sc = sched_score(&r);
    if (keep_res)
        *keep_res = r;
    else
        ooc_sim_result_free(&r);
    return sc;
}

/* Sets decision `dec` on the swapped gaps of buffer b (for a recompute, only where it is
 * allowed), saving the old state into log[]; returns the entries logged. */
typedef struct {
    uint32_t k;
    uint8_t dec;
    int32_t in_at;
} undo_t;

static uint32_t set_buffer(sched_t *s, int32_t b, uint8_t dec, undo_t *log) {
    const ooc_model_t *m = s->m;
    uint32_t n = 0;
    for (uint32_t k = s->gap_off[b]; k < s->gap_off[b + 1]; k++) {
        gap_t *g = &s->g[k];
        if (g->dec != OOC_SWAP)
            continue;
        if (dec == OOC_RECOMPUTE && (g->to >= (int32_t)m->n || g->to > m->recomp_until[b]))
            continue;
        log[n++] = (undo_t){k, g->dec, g->in_at};
        g->dec = dec;
    }
    return n;
}

static void undo(sched_t *s, const undo_t *log, uint32_t n) {
    while (n-- > 0) {
        s->g[log[n].k].dec = log[n].dec;
        s->g[log[n].k].in_at = log[n].in_at;
    }
}

typedef struct {
    int32_t buf;
    double key;
    int32_t from;
} cand_t;

/* Switches the candidates, in order, to `dec` where that shortens the simulated iteration.
 * Candidates are tried in groups that double after a success and halve after a failure, so a
 * long run of good switches costs few simulations; a single candidate that does not help is
 * left as it was. */
static int switch_greedy(search_t *x, const cand_t *c, uint32_t nc, uint8_t dec) {
    sched_t *s = x->s;
    undo_t *log = malloc((s->ng ? s->ng : 1) * sizeof *log);
    if (!log)
        return OOC_ENOMEM;
    uint32_t i = 0, g = 4;
    while (i < nc && x->sims < x->max_sims) {
        uint32_t end = i + g < nc ? i + g : nc, nl = 0;
        for (uint32_t j = i; j < end; j++)
            nl += set_buffer(s, c[j].buf, dec, log + nl);
        if (nl == 0) {
            i = end;
            continue;
        }
        uint64_t sc = eval(x, NULL, NULL, x->budget);
        if (sc < x->cur) {
            x->cur = sc;
            i = end;
            g *= 2;
            continue;
        }
        undo(s, log, nl);
        if (g > 1)
            g /= 2;
        else
            i++;
    }
    free(log);
    return 0;
}

/* Descending key, then latest first (the output side), then buffer id. */
static int cand_cmp(const void *a, const void *b) {
    const cand_t *x = a, *y = b;
    if (x->key != y->key)
        return x->key > y->key ? -1 : 1;
    if (x->from != y->from)
        return x->from > y->from ? -1 : 1;
    return x->buf < y->buf ? -1 : x->buf > y->buf;
}

int pooch_refine(sched_t *s, uint64_t budget, uint32_t max_sims) {
    const ooc_model_t *m = s->m;
    search_t x = {s, budget, 0, max_sims, UINT64_MAX};
    ooc_sim_opts_t o = {.want_attribution = 1};
    cand_t *lo = calloc(m->nb ? m->nb : 1, sizeof *lo);
    cand_t *li = calloc(m->nb ? m->nb : 1, sizeof *li);
    if (!lo || !li) {
        free(lo);
        free(li);
        return OOC_ENOMEM;
    }
    int rc = 0;
    /* rounds of: read the timeline, then switch LI and LO to keep where it helps */
    uint32_t all = x.max_sims;
    x.max_sims = all / 2; /* half for keep/swap, the rest for swap/recompute */
    for (int round = 0; round < 4 && !rc && x.sims < x.max_sims; round++) {
        ooc_sim_result_t r;
        memset(&r, 0, sizeof r);
        uint64_t before = eval(&x, &o, &r, budget);
        if (round == 0)
            x.cur = before;
        if (!r.h2d_wait_ns)
            break;
        uint32_t nlo = 0, nli = 0;
        for (uint32_t b = 0; b < m->nb; b++) {
            int swapped = 0;
            int32_t from = -1;
            for (uint32_t k = s->gap_off[b]; k < s->gap_off[b + 1]; k++)
                if (s->g[k].dec == OOC_SWAP) {
                    swapped = 1;
                    if (s->g[k].from > from)
                        from = s->g[k].from;
                }
            if (!swapped)
                continue;
            if (r.h2d_wait_ns[b] > 0)
                li[nli++] = (cand_t){(int32_t)b, r.h2d_wait_ns[b], from};
            else if (r.d2h_delay_ns[b] > 0)
                lo[nlo++] = (cand_t){(int32_t)b, (double)from, from};
        }
        ooc_sim_result_free(&r);
        /* LI: largest stall first */
        if (nli)
            qsort(li, nli, sizeof *li, cand_cmp);
        rc = switch_greedy(&x, li, nli, OOC_KEEP);
        /* LO \ LI: from the output side */
        if (nlo)
            qsort(lo, nlo, sizeof *lo, cand_cmp);
        if (!rc)
            rc = switch_greedy(&x, lo, nlo, OOC_KEEP);
        if (x.cur >= before)
            break;
    }
    x.max_sims = all;
    /* swap or recompute, by r(X) */
    uint32_t nl = 0;
    for (uint32_t b = 0; b < m->nb; b++) {
        if (!m->recomp[b])
            continue;
        for (uint32_t k = s->gap_off[b]; k < s->gap_off[b + 1]; k++)
            if (s->g[k].dec == OOC_SWAP && s->g[k].to <= m->recomp_until[b]) {
                lo[nl++] = (cand_t){(int32_t)b, 0, s->g[k].from};
                break;
            }
    }
    /* r(X) for every candidate, against the schedule as it stands */
    undo_t *log = malloc((s->ng ? s->ng : 1) * sizeof *log);
    uint32_t nr = 0;
    for (uint32_t i = 0; log && !rc && i < nl && x.sims + 2 <= x.max_sims; i++) {
        int32_t b = lo[i].buf;
        uint32_t n1 = set_buffer(s, b, OOC_RECOMPUTE, log);
        uint64_t t_rec = eval(&x, NULL, NULL, budget);
        undo(s, log, n1);
        n1 = set_buffer(s, b, OOC_KEEP, log);
        uint64_t t_keep = eval(&x, NULL, NULL, budget + m->fp[b]);
        undo(s, log, n1);
        double rx = 2.0;
        if (t_rec != UINT64_MAX && t_keep != UINT64_MAX && x.cur != UINT64_MAX && x.cur > t_keep)
            rx = ((double)t_rec - (double)t_keep) / ((double)x.cur - (double)t_keep);
        else if (t_rec != UINT64_MAX && x.cur == UINT64_MAX)
            rx = 0; /* recompute makes an infeasible schedule feasible */
        if (rx < 1.0)
            lo[nr++] = (cand_t){b, -rx, lo[i].from}; /* sorted descending: smallest r first */
    }
    free(log);
    if (nr)
        qsort(lo, nr, sizeof *lo, cand_cmp);
    if (!rc)
        rc = switch_greedy(&x, lo, nr, OOC_RECOMPUTE);
    /* leave the schedule with its swap-ins placed, as evaluated */
    if (!rc)
        rc = sched_place_swapins(s, budget);
    free(lo);
    free(li);
    return rc;
}

int pol_pooch(const ooc_model_t *m, const ooc_policy_opts_t *o, ooc_plan_t **out) {
    sched_t s;
    sched_memo_t *memo;
    int rc = sched_memo_new(&memo);
    if (!rc && (rc = sched_init(&s, m)) != 0)
        sched_memo_free(memo);
    if (rc)
        return rc;
    s.memo = memo;
    sched_swap_all(&s, 2, 1);
    rc = pooch_refine(&s, o->budget_bytes, sched_sim_budget(m));
    if (rc == 0)
        rc = sched_plan(&s, "pooch", o->budget_bytes, out);
    sched_free(&s);
    sched_memo_free(memo);
    return rc;
}
