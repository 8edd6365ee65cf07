/* SPDX-License-Identifier: MIT */
/* schedule.h: private to the planner: a schedule is one decision per gap (the stretch between two
 * consecutive uses of a buffer), from which a plan is emitted. Shared by the policies. */
#ifndef OOC_SCHEDULE_H
#define OOC_SCHEDULE_H

#include "ooc_planner.h"

/* Between op `from` and op `to` the buffer is not used. For a persistent buffer the last gap
 * wraps around the iteration: to >= n stands for op to - n of the next iteration. */
typedef struct gap {
    int32_t buf, from, to;
    uint8_t dec;   /* OOC_KEEP, OOC_SWAP, OOC_RECOMPUTE */
    int32_t in_at; /* OOC_SWAP: swap-in issued before op in_at (from < in_at <= to) */
} gap_t;

typedef struct sched_memo sched_memo_t;

typedef struct sched {
    const ooc_model_t *m;
    gap_t *g;
    uint32_t ng;
    uint32_t *gap_off;  /* per buffer (nb + 1): its gaps, ordered by `from` */
    sched_memo_t *memo; /* NULL, or the results of sched_eval so far (not owned; copied along) */
    int keep_dead;      /* 1: a buffer dead before its free stays resident (sched_plan) */
} sched_t;

/* Collects every gap of at least one op, all kept. */
int sched_init(sched_t *s, const ooc_model_t *m);
void sched_free(sched_t *s);
int sched_copy(sched_t *dst, const sched_t *src);
/* The gap of buffer b that op t falls in (from < t <= to, or t + n for a wrapping gap). */
gap_t *sched_gap_at(const sched_t *s, int32_t b, int32_t t);
/* Emits the plan: swap-outs, swap-ins, waits, drops of dead buffers, recomputes (with their
 * inputs brought in first; an input that is itself recomputed is rebuilt first, before the same
 * op or one earlier, up to 8 deep; a recompute whose inputs cannot be had becomes a swap). */
int sched_plan(const sched_t *s, const char *policy, uint64_t budget, ooc_plan_t **out);
/* Emits and simulates. Returns 0 or OOC_ENOMEM; the result's feasible flag says the rest. With
 * s->memo set and no options, a schedule simulated before at the same budget is not simulated
 * again: its result is returned from the memo. */
int sched_eval(const sched_t *s, uint64_t budget, const ooc_sim_opts_t *o, ooc_sim_result_t *r);
/* The memo of sched_eval's results for one model: a search that meets the same decisions twice
 * (different variants often do) simulates them once. A schedule is known by a 128-bit hash of
 * its decisions and swap-in ops and the budget (a collision, which would reuse another
 * schedule's result, is about 1 in 2^100 over a search's few hundred entries). */
int sched_memo_new(sched_memo_t **out);
void sched_memo_free(sched_memo_t *mm);
/* A copy of plan `in` whose swap-ins are issued in the order their buffers are needed (the op of
 * the wait that follows each): a swap-in issued before one needed earlier is delayed to that
 * one's op (and ordered after it there); no swap-in is issued earlier than in `in`.
 * Returns 0 or OOC_ENOMEM; *out is owned by the caller. */
int sched_issue_in_need_order(const ooc_plan_t *in, ooc_plan_t **out);
/* Places every swap-in of a swapped gap as early as memory allows (PoocH section 4.3), using the
 * static residency implied by the decisions. */
int sched_place_swapins(sched_t *s, uint64_t budget);
/* need[k] (one per gap): for a gap that a recompute's producers read, the op before which its
 * buffer must be back on the device (on the gap's axis, < to), else INT32_MAX. */
void sched_input_needs(const sched_t *s, int32_t *need);
/* Sets every gap that crosses at least `min_len` ops to swap, swap-in `ahead` ops before use. */
void sched_swap_all(sched_t *s, int32_t min_len, int32_t ahead);

/* The number of simulations a search may run on this model: a deterministic budget scaled so
 * that `auto` stays near a second on a 10,000-op iteration. */
uint32_t sched_sim_budget(const ooc_model_t *m);

/* Policies (policy.c, window.c, pooch.c, auto.c). Each returns a finalized plan. */
/* A binary heap of gap (or any) indices, ordered by `above` (x above y: x comes out first);
 * `a` holds room for every index pushed. Shared by the window and belady policies. */
typedef int (*sched_heap_above_fn)(const void *ctx, uint32_t x, uint32_t y);
typedef struct {
    uint32_t *a;
    uint32_t n;
    sched_heap_above_fn above;
    const void *ctx;
} sched_heap_t;
void sched_heap_push(sched_heap_t *h, uint32_t v);
uint32_t sched_heap_pop(sched_heap_t *h); /* h->n > 0 */

int pol_swapall(const ooc_model_t *m, const ooc_policy_opts_t *o, ooc_plan_t **out);
int pol_lms(const ooc_model_t *m, const ooc_policy_opts_t *o, ooc_plan_t **out);
int pol_superneurons(const ooc_model_t *m, const ooc_policy_opts_t *o, ooc_plan_t **out);
int pol_window(const ooc_model_t *m, const ooc_policy_opts_t *o, ooc_plan_t **out);
int pol_pooch(const ooc_model_t *m, const ooc_policy_opts_t *o, ooc_plan_t **out);
int pol_belady(const ooc_model_t *m, const ooc_policy_opts_t *o, ooc_plan_t **out);
int pol_auto(const ooc_model_t *m, const ooc_policy_opts_t *o, ooc_plan_t **out);

/* The window schedule for one window size (window.c). */
int window_schedule(sched_t *s, uint64_t budget, uint64_t window_bytes);
/* PoocH's classification (keep/swap by the simulated timeline, then swap/recompute by r(X))
 * refining the schedule in place (pooch.c); swap-ins are placed as early as memory allows at
 * every evaluation. At most `max_sims` simulations. */
int pooch_refine(sched_t *s, uint64_t budget, uint32_t max_sims);

/* The next-use schedule (belady.c): evict the kept buffer with the farthest next use whenever the
 * resident footprint exceeds `budget`. Gaps whose producers cost at most rec_ns_per_byte per byte
 * (0: none) are rebuilt instead: all of them up front (on_evict 0), or only those evicted (1), or
 * only those evicted with such gaps evicted before any other (2). With pin 0 a rebuild's inputs
 * are left to the emitter (which brings them in, unseen by the walk); with pin > 0 a gap is rebuilt
 * only when each input is used by the rebuilding op or sits in a kept gap whose stay from the
 * rebuild to its next use costs at most `pin` times the footprint-ops the rebuild saves, and the
 * walk keeps such an input resident from the rebuild on. Swap-ins are left at their uses. */
int belady_schedule(sched_t *s, uint64_t budget, double rec_ns_per_byte, int on_evict, double pin);
/* The best of belady_schedule's variants (which rebuilds, 80-100% of the budget for the walk,
 * swap-ins as early as memory allows or 2 or 8 ops ahead) by simulation under `budget`; s is left
 * holding it and *score its simulated time (UINT64_MAX: none feasible). */
int belady_best(sched_t *s, uint64_t budget, uint64_t *score);
/* auto's wider search over the same schedule, after belady_best: the variants belady_best does
 * not try (more rebuild thresholds and walk budgets, swap-ins placed under part of the budget or
 * 32 ops ahead), at most max_sims simulations, most promising first. *score holds the score of
 * the schedule s holds (UINT64_MAX: none); s and *score are replaced only by a faster one. */
int belady_search(sched_t *s, uint64_t budget, uint32_t max_sims, uint64_t *score);

/* Switches to keep the swapped or recomputed gaps whose release, in the simulated timeline, made
 * room that nothing used (keepfit.c): up to `rounds` rounds of one traced simulation, the switches
 * it suggests, and one simulation that keeps them only when faster; then tries swapped gaps that
 * may be rebuilt as rebuilds, largest first, within max_sims simulations, each kept only when
 * faster. Each schedule is judged by the faster of its plan and that plan with its swap-ins
 * issued in need order. Returns 0 or OOC_ENOMEM. */
int keep_refine(sched_t *s, uint64_t budget, int rounds, uint32_t max_sims);

/* Time of a simulated plan for comparisons: infeasible plans are UINT64_MAX. */
uint64_t sched_score(const ooc_sim_result_t *r);

#endif
