/* SPDX-License-Identifier: MIT */
/* window.c: the locally-adaptive byte window of the window-scheduling paper (section 3).
 *
 * A window of W bytes slides over the variable sequence (the buffers of the ops in order). At
 * op i: (a) buffers whose next use enters the window are swapped in, while the budget allows (a
 * use at op i itself is always brought in); (b) when memory is short, kept buffers with the
 * farthest next use are swapped out instead (after their last use, which an offline plan may
 * do); (c) after op i, each of its buffers stays when its next use lies inside the window, is
 * dropped when it has none, and is swapped out otherwise. The window's span in ops therefore
 * adapts to the bytes each op touches. W is given, or tuned by simulation over powers of two
 * from the largest working set up to the whole iteration. */
#include "schedule.h"

#include <stdlib.h>
#include <string.h>

/* Heap orders over gaps by `to` (ctx: the gap array); ties by index. */
static int to_earlier(const void *ctx, uint32_t x, uint32_t y) {
    const gap_t *g = ctx;
    return g[x].to != g[y].to ? g[x].to < g[y].to : x < y;
}

static int to_later(const void *ctx, uint32_t x, uint32_t y) {
    const gap_t *g = ctx;
    return g[x].to != g[y].to ? g[x].to > g[y].to : x < y;
}

int window_schedule(sched_t *s, uint64_t budget, uint64_t window_bytes) {
    const ooc_model_t *m = s->m;
    const ooc_profile_t *p = m->prof;
    int32_t n = (int32_t)m->n;
    if (n == 0)
        return 0;
    int32_t *e = malloc((size_t)n * sizeof *e);
    uint32_t *from_gap = malloc((p->nrefs ? p->nrefs : 1) * sizeof *from_gap);
    sched_heap_t pend = {malloc((s->ng + 1) * sizeof(uint32_t)), 0, to_earlier, s->g};
    sched_heap_t kept = {malloc((s->ng + 1) * sizeof(uint32_t)), 0, to_later, s->g};
    if (!e || !from_gap || !pend.a || !kept.a) {
        free(e);
        free(from_gap);
        free(pend.a);
        free(kept.a);
        return OOC_ENOMEM;
    }
    /* window ends, on the doubled (cyclic) op axis */
    uint64_t sum = 0;
    int32_t hi = 0; /* exclusive end; sum = bytes of ops [i, hi) */
    for (int32_t i = 0; i < n; i++) {
        if (hi <= i) {
            hi = i + 1;
            sum = m->ws[i];
        }
        while (hi <= i + n && sum + m->ws[hi % n] <= window_bytes)
            sum += m->ws[hi++ % n];
        e[i] = hi - 1;
        sum -= m->ws[i];
    }
    /* the gap starting at each reference's op, per reference (UINT32_MAX: none) */
    for (uint32_t r = 0; r < p->nrefs; r++)
        from_gap[r] = UINT32_MAX;
    for (uint32_t k = 0; k < s->ng; k++) {
        gap_t *g = &s->g[k];
        const ooc_op_t *o = &p->ops[g->from];
        for (uint32_t r = 0; r < o->nref; r++)
            if (p->refs[o->ref_off + r].buf == g->buf)
                from_gap[o->ref_off + r] = k;
        g->dec = OOC_KEEP;
        g->in_at = g->to;
    }
    int64_t res = 0;
    for (uint32_t b = 0; b < m->nb; b++)
        if (p->bufs[b].alloc_idx < 0 && (m->nuse[b] > 0 || !p->bufs[b].persistent))
            res += (int64_t)m->fp[b];
    for (int32_t i = 0; i < n; i++) {
        /* (a) swap in what enters the window, within the budget; uses at i are forced */
        while (pend.n > 0) {
            gap_t *g = &s->g[pend.a[0]];
            int forced = g->to <= i;
            if (g->to > e[i] || (!forced && res + (int64_t)m->fp[g->buf] > (int64_t)budget))
                break;
            sched_heap_pop(&pend);
            g->in_at = i > g->from ? i : g->from + 1;
            res += (int64_t)m->fp[g->buf];
        }
        const ooc_op_t *o = &p->ops[i];
        for (uint32_t r = 0; r < o->nref; r++) {
            int32_t b = p->refs[o->ref_off + r].buf;
            if (m->uses[m->use_off[b]] == i && p->bufs[b].alloc_idx >= 0)
                res += (int64_t)m->fp[b];
        }
        /* (b) over budget: evict kept buffers with the farthest next use */
        while (res > (int64_t)budget && kept.n > 0) {
            uint32_t k = sched_heap_pop(&kept);
            gap_t *g = &s->g[k];
            if (g->dec != OOC_KEEP || g->to <= i || g->from >= i)
                continue;
            g->dec = OOC_SWAP;
            res -= (int64_t)m->fp[g->buf];
            sched_heap_push(&pend, k);
        }
        /* (c) after op i: keep what the window still covers, swap out the rest */
        for (uint32_t r = 0; r < o->nref; r++) {
            int32_t b = p->refs[o->ref_off + r].buf;
            uint32_t k = from_gap[o->ref_off + r];
            if (k != UINT32_MAX) {
                gap_t *g = &s->g[k];
                if (g->to <= e[i]) {
                    sched_heap_push(&kept, k);
                } else {
                    g->dec = OOC_SWAP;
                    res -= (int64_t)m->fp[b];
                    sched_heap_push(&pend, k);
                }
                continue;
            }
            uint32_t nu = ooc_model_next_use(m, b, i + 1);
            if (nu == m->nuse[b] && !p->bufs[b].persistent && p->bufs[b].free_idx >= 0)
                res -= (int64_t)m->fp[b]; /* dead: dropped or freed */
        }
    }
    /* wrapping gaps the tail could not bring back come in at the start of the next iteration */
    while (pend.n > 0) {
        gap_t *g = &s->g[sched_heap_pop(&pend)];
        g->in_at = g->to - 1 > g->from ? g->to - 1 : g->from + 1;
    }
    free(e);
    free(from_gap);
    free(pend.a);
    free(kept.a);
    return 0;
}

int pol_window(const ooc_model_t *m, const ooc_policy_opts_t *o, ooc_plan_t **out) {
    sched_t s;
    int rc = sched_init(&s, m);
    if (rc)
        return rc;
    uint64_t w = o->window_bytes;
    if (w == 0) {
        uint64_t maxws = 1, total = 0;
        for (uint32_t i = 0; i < m->n; i++) {
            total += m->ws[i];
            if (m->ws[i] > maxws)
                maxws = m->ws[i];
        }
        uint64_t best = UINT64_MAX;
        w = maxws;
        for (uint64_t cand = maxws;; cand *= 2) {
            if ((rc = window_schedule(&s, o->budget_bytes, cand)))
                goto out;
            ooc_sim_result_t r;
            if ((rc = sched_eval(&s, o->budget_bytes, NULL, &r)))
                goto out;
            if (sched_score(&r) < best) {
                best = sched_score(&r);
                w = cand;
            }
            ooc_sim_result_free(&r);
            if (cand >= total || cand > UINT64_MAX / 4)
                break;
        }
    }
    if ((rc = window_schedule(&s, o->budget_bytes, w)) == 0)
        rc = sched_plan(&s, "window", o->budget_bytes, out);
out:
    sched_free(&s);
    return rc;
}
