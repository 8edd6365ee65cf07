/* SPDX-License-Identifier: MIT */
/* policy.c: the policy table and the three baselines: swapall (vDNN), lms (TensorFlow LMS's
 * fixed graph distances) and superneurons (swap the outputs of compute-heavy ops, recompute the
 * outputs of cheap ones).
 *
 * Every policy is a pure function of the model and its options; none keeps state. The window,
 * pooch and auto policies live in window.c, pooch.c and auto.c. */
#include "schedule.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

const char *const ooc_policy_names[] = {"swapall", "lms",    "superneurons", "window",
                                        "pooch",   "belady", "auto",         NULL};

typedef int (*policy_fn)(const ooc_model_t *, const ooc_policy_opts_t *, ooc_plan_t **);
static const policy_fn policy_fns[] = {pol_swapall, pol_lms,    pol_superneurons, pol_window,
                                       pol_pooch,   pol_belady, pol_auto};

int ooc_policy_plan(const ooc_model_t *m, const char *policy, const ooc_policy_opts_t *o,
                    ooc_plan_t **out, char *err, size_t errlen) {
    *out = NULL;
    int which = -1;
    for (int i = 0; ooc_policy_names[i]; i++)
        if (strcmp(policy, ooc_policy_names[i]) == 0)
            which = i;
    if (which < 0) {
        if (err && errlen)
            snprintf(err, errlen,
                     "unknown policy '%s' (expected swapall, lms, superneurons, window, pooch, "
                     "belady or auto)",
                     policy);
        return OOC_EINVAL;
    }
    int rc = ooc_model_check_budget(m, o->budget_bytes, NULL, err, errlen);
    if (rc)
        return rc;
    rc = policy_fns[which](m, o, out);
    if (rc == 0)
        snprintf((*out)->policy, sizeof(*out)->policy, "%s", policy);
    else if (err && errlen)
        snprintf(err, errlen, "policy %s: out of memory", policy);
    return rc;
}

/* vDNN: every buffer that lives across a gap is swapped out after its last use before the gap
 * and swapped in one op before its next use. */
int pol_swapall(const ooc_model_t *m, const ooc_policy_opts_t *o, ooc_plan_t **out) {
    sched_t s;
    int rc = sched_init(&s, m);
    if (rc)
        return rc;
    sched_swap_all(&s, 2, 1);
    rc = sched_plan(&s, "swapall", o->budget_bytes, out);
    sched_free(&s);
    return rc;
}

/* TensorFlow LMS: swap out when the next use is at least `threshold` ops away, swap in `ahead`
 * ops before it. LMS tunes the two distances by simulation; so do we, over a fixed grid, and
 * keep the fastest feasible pair (the most swapping pair when none is feasible). */
int pol_lms(const ooc_model_t *m, const ooc_policy_opts_t *o, ooc_plan_t **out) {
    static const int32_t thr[] = {2, 4, 8, 16, 32, 64, 128};
    static const int32_t ahead[] = {1, 2, 4, 8, 16, 32};
    sched_t s;
    int rc = sched_init(&s, m);
    if (rc)
        return rc;
    uint64_t best = UINT64_MAX;
    int32_t bt = 2, ba = 1;
    for (size_t i = 0; i < sizeof thr / sizeof thr[0]; i++)
        for (size_t j = 0; j < sizeof ahead / sizeof ahead[0]; j++) {
            sched_swap_all(&s, thr[i], ahead[j]);
            ooc_sim_result_t r;
            rc = sched_eval(&s, o->budget_bytes, NULL, &r);
            if (rc)
                goto out;
            if (sched_score(&r) < best) {
                best = sched_score(&r);
                bt = thr[i];
                ba = ahead[j];
            }
            ooc_sim_result_free(&r);
        }
    sched_swap_all(&s, bt, ba);
    rc = sched_plan(&s, "lms", o->budget_bytes, out);
out:
    sched_free(&s);
    return rc;
}

/* SuperNeurons: tensors produced by convolutions and GEMMs (checkpoints) are offloaded and
 * prefetched at the previous checkpoint before their use; tensors of cheap ops are recomputed
 * where the recompute rule (docs/planner.md) allows, otherwise swapped like the others; parameters
 * stay. */
int pol_superneurons(const ooc_model_t *m, const ooc_policy_opts_t *o, ooc_plan_t **out) {
    sched_t s;
    int rc = sched_init(&s, m);
    if (rc)
        return rc;
    const ooc_profile_t *p = m->prof;
    int32_t *prev_heavy = malloc((m->n ? m->n : 1) * sizeof *prev_heavy);
    if (!prev_heavy) {
        sched_free(&s);
        return OOC_ENOMEM;
    }
    int32_t last = -1;
    for (uint32_t i = 0; i < m->n; i++) {
        prev_heavy[i] = last;
        if (m->heavy[i])
            last = (int32_t)i;
    }
    for (uint32_t k = 0; k < s.ng; k++) {
        gap_t *g = &s.g[k];
        if (p->bufs[g->buf].persistent || g->to >= (int32_t)m->n) {
            g->dec = OOC_KEEP;
            continue;
        }
        int32_t producer = m->uses[m->use_off[g->buf]];
        if (!m->heavy[producer] && m->recomp[g->buf] && g->to <= m->recomp_until[g->buf]) {
            g->dec = OOC_RECOMPUTE;
            continue;
        }
        g->dec = OOC_SWAP;
        int32_t h = prev_heavy[g->to];
        g->in_at = h > g->from ? h : g->to - 1;
        if (g->in_at <= g->from)
            g->in_at = g->from + 1;
    }
    free(prev_heavy);
    /* a recompute whose inputs cannot be resident then falls back to a swap */
    for (int round = 0; round < 8; round++) {
        ooc_sim_result_t r;
        rc = sched_eval(&s, o->budget_bytes, NULL, &r);
        if (rc)
            break;
        int changed = 0;
        if (!r.feasible && r.viol_code == OOC_EFORMAT && r.viol_buf >= 0)
            for (uint32_t k = 0; k < s.ng; k++)
                if (s.g[k].dec == OOC_RECOMPUTE &&
                    (s.g[k].buf == r.viol_buf || s.g[k].to == r.viol_op)) {
                    s.g[k].dec = OOC_SWAP;
                    s.g[k].in_at = s.g[k].to - 1 > s.g[k].from ? s.g[k].to - 1 : s.g[k].from + 1;
                    changed = 1;
                }
        ooc_sim_result_free(&r);
        if (!changed)
            break;
    }
    if (rc == 0)
        rc = sched_plan(&s, "superneurons", o->budget_bytes, out);
    sched_free(&s);
    return rc;
}
