/* SPDX-License-Identifier: MIT */
/* auto.c: the default policy: the best plan found, by simulation.
 *
 * Candidates: the plan of every other policy (so auto is never worse than any of them in
 * simulation, by construction), and our own: for each window size of the window policy's grid,
 * the window schedule with its swap-ins moved as early as memory allows; the next-use (belady)
 * schedule, and the best of a wider search of its variants (belady_search); then, from the best
 * window and the best next-use schedule (from the better only on iterations of more than 2,000
 * ops), PoocH's classification (keep what stalls, recompute where r(X) < 1). Each candidate is
 * also tried with its swap-ins issued in the order their buffers are needed (a swap-in issued
 * before one needed earlier waits for it: the copy engine is first come, first served). The
 * fastest feasible candidate wins; among equally fast ones, the one that copies fewer bytes, then
 * the earlier, so the result is deterministic. The first candidate keeps everything resident and
 * moves nothing: it wins whenever the iteration fits the budget as it is. Last, the schedule of
 * the best candidate built from our own schedules is refined by keep_refine (keepfit.c: keep what
 * was released for nothing, then try rebuilds) and considered once more. */
#include "schedule.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    ooc_plan_t *plan;
    uint64_t score;
    uint64_t moved; /* bytes copied each way together, per iteration */
} best_t;

/* Simulates plan and keeps it in *b when it beats the current best (takes ownership): faster, or
 * as fast and moving fewer bytes. The model overlaps copies with compute perfectly, so a plan
 * that swaps everything may tie with one that moves nothing; on a real link a copy costs
 * engine time, host time and power, so the tie goes to the plan that moves less. */
static int consider1(const ooc_model_t *m, best_t *b, ooc_plan_t *plan) {
    ooc_sim_result_t r;
    int rc = ooc_sim_run(m, plan, NULL, &r);
    if (rc) {
        ooc_plan_free(plan);
        return rc;
    }
    uint64_t sc = sched_score(&r), moved = r.h2d_bytes + r.d2h_bytes;
    ooc_sim_result_free(&r);
    if (!b->plan || sc < b->score || (sc == b->score && moved < b->moved)) {
        ooc_plan_free(b->plan);
        b->plan = plan;
        b->score = sc;
        b->moved = moved;
    } else {
        ooc_plan_free(plan);
    }
    return 0;
}

/* Considers plan (takes ownership), then a copy of it with its swap-ins issued in need order
 * (sched_issue_in_need_order: it only delays swap-ins, and the simulation judges it; one simulation
 * more, and it wins only when strictly faster, the copy coming second). */
static int consider(const ooc_model_t *m, best_t *b, ooc_plan_t *plan) {
    ooc_plan_t *edf = NULL;
    int rc = sched_issue_in_need_order(plan, &edf);
    if (rc) {
        ooc_plan_free(plan);
        return rc;
    }
    if ((rc = consider1(m, b, plan)) != 0) {
        ooc_plan_free(edf);
        return rc;
    }
    return consider1(m, b, edf);
}

/* Considers the plan of schedule s; when it becomes the best, *bs (a schedule, or zeroed) is
 * replaced by a copy of s, for keep_refine at the end. */
static int consider_sched(const ooc_model_t *m, best_t *b, const sched_t *s, uint64_t budget,
                          sched_t *bs) {
    ooc_plan_t *pl, *was = b->plan;
    int rc = sched_plan(s, "auto", budget, &pl);
    if (!rc)
        rc = consider(m, b, pl);
    if (rc || b->plan == was)
        return rc;
    sched_free(bs);
    return sched_copy(bs, s);
}

int pol_auto(const ooc_model_t *m, const ooc_policy_opts_t *o, ooc_plan_t **out) {
    best_t best = {NULL, UINT64_MAX, UINT64_MAX};
    int rc = 0;
    /* Nothing moved at all: when the iteration fits the budget as it is, this plan wins (no
     * candidate is faster, and the ties go to the one that moves less). */
    {
        sched_t k;
        ooc_plan_t *pl;
        if ((rc = sched_init(&k, m)) != 0)
            return rc;
        k.keep_dead = 1;
        rc = sched_plan(&k, "auto", o->budget_bytes, &pl);
        sched_free(&k);
        if (!rc && (rc = consider(m, &best, pl)) != 0)
            return rc;
        if (rc)
            return rc;
    }
    int (*const others[])(const ooc_model_t *, const ooc_policy_opts_t *, ooc_plan_t **) = {
        pol_swapall, pol_lms, pol_superneurons, pol_window, pol_pooch};
    ooc_policy_opts_t wo = *o;
    for (size_t i = 0; i < sizeof others / sizeof others[0] && !rc; i++) {
        ooc_plan_t *pl;
        if ((rc = others[i](m, &wo, &pl)) == 0)
            rc = consider(m, &best, pl);
    }
    /* window sizes, with memory-aware swap-ins */
    sched_t s, bs = {0};
    sched_memo_t *memo = NULL;
    if (!rc)
        rc = sched_memo_new(&memo);
    if (!rc && (rc = sched_init(&s, m)) != 0)
        sched_memo_free(memo);
    if (rc)
        return rc;
    s.memo = memo; /* the searches below meet many schedules more than once */
    uint64_t maxws = 1, total = 0, best_w = 0, best_sc = UINT64_MAX;
    for (uint32_t i = 0; i < m->n; i++) {
        total += m->ws[i];
        if (m->ws[i] > maxws)
            maxws = m->ws[i];
    }
    for (uint64_t w = maxws; !rc; w *= 2) {
        if (o->window_bytes && w != maxws)
            break;
        uint64_t ww = o->window_bytes ? o->window_bytes : w;
        if ((rc = window_schedule(&s, o->budget_bytes, ww)) ||
            (rc = sched_place_swapins(&s, o->budget_bytes)))
            break;
        ooc_sim_result_t r;
        if ((rc = sched_eval(&s, o->budget_bytes, NULL, &r)))
            break;
        uint64_t sc = sched_score(&r);
        ooc_sim_result_free(&r);
        if (sc < best_sc) {
            best_sc = sc;
            best_w = ww;
        }
        if (w >= total || w > UINT64_MAX / 4)
            break;
    }
    /* the next-use (belady) schedule: a candidate of its own, and a seed */
    uint64_t sb = UINT64_MAX;
    if (!rc)
        rc = belady_best(&s, o->budget_bytes, &sb); /* the belady policy's plan */
    if (!rc)
        rc = consider_sched(m, &best, &s, o->budget_bytes, &bs);
    /* and more variants of it (on iterations of more than 2,000 ops, a quarter of the simulations,
     * to stay within a second on 10,000 ops) */
    uint64_t sb0 = sb;
    if (!rc)
        rc = belady_search(&s, o->budget_bytes, sched_sim_budget(m) / (m->n > 2000 ? 4 : 1), &sb);
    if (!rc && sb < sb0)
        rc = consider_sched(m, &best, &s, o->budget_bytes, &bs);
    /* PoocH's classification refines the better seed, or both on iterations of up to 2,000 ops
     * (on longer ones refining both would double the planning time for little) */
    int both = m->n <= 2000;
    if (!rc && sb != UINT64_MAX && (both || sb <= best_sc)) {
        rc = pooch_refine(&s, o->budget_bytes, sched_sim_budget(m));
        if (!rc)
            rc = consider_sched(m, &best, &s, o->budget_bytes, &bs);
    }
    if (!rc && best_w && best_sc != UINT64_MAX && (both || best_sc < sb)) {
        rc = window_schedule(&s, o->budget_bytes, best_w);
        if (!rc)
            rc = sched_place_swapins(&s, o->budget_bytes);
        if (!rc)
            rc = consider_sched(m, &best, &s, o->budget_bytes, &bs);
        if (!rc)
            rc = pooch_refine(&s, o->budget_bytes, sched_sim_budget(m));
        if (!rc)
            rc = consider_sched(m, &best, &s, o->budget_bytes, &bs);
    }
    /* the best schedule's releases that made room nothing used, switched to keep */
    if (!rc && bs.g) {
        ooc_plan_t *pl;
        rc = keep_refine(&bs, o->budget_bytes, 3, sched_sim_budget(m) / 16);
        if (!rc && (rc = sched_plan(&bs, "auto", o->budget_bytes, &pl)) == 0)
            rc = consider(m, &best, pl);
    }
    sched_free(&bs);
    sched_free(&s);
    sched_memo_free(memo);
    if (rc) {
        ooc_plan_free(best.plan);
        return rc;
    }
    *out = best.plan;
    return 0;
}
