/* SPDX-License-Identifier: MIT */
/* trace_check.c: the independent checker of the simulator's traces (sim.c): it replays the
 * events with its own bookkeeping and refuses memory above the budget, an op before its buffers
 * are resident and restored, a chunk released under a transfer or a running op, a write during a
 * copy out, recompute inputs changed since their producer ran, and, with swapin_exclusive, an op
 * overlapping a copy in. It shares no state or code with the simulator. */
#include "ooc_planner.h"

#include <stdio.h>
#include <stdlib.h>

int ooc_trace_check(const ooc_model_t *m, const ooc_plan_t *pl, const ooc_trace_t *t, char *err,
                    size_t errlen) {
    const ooc_profile_t *p = m->prof;
    size_t nb = m->nb ? m->nb : 1;
    uint8_t *mapped = calloc(nb, 1), *valid = calloc(nb, 1), *in_h2d = calloc(nb, 1),
            *in_d2h = calloc(nb, 1), *seen = calloc(nb, 1);
    int32_t *inuse = calloc(nb, sizeof *inuse), *lastw = malloc(nb * sizeof *lastw);
    int rc = 0;
    uint64_t used = 0;
    int32_t running = -1, nin = 0;
    if (!mapped || !valid || !in_h2d || !in_d2h || !seen || !inuse || !lastw) {
        rc = OOC_ENOMEM;
        goto out;
    }
#define FAIL(...)                                                                                  \
    do {                                                                                           \
        if (err && errlen)                                                                         \
            snprintf(err, errlen, __VA_ARGS__);                                                    \
        rc = OOC_EINFEASIBLE;                                                                      \
        goto out;                                                                                  \
    } while (0)
    for (uint32_t b = 0; b < m->nb; b++) {
        lastw[b] = -1;
        if (p->bufs[b].alloc_idx < 0) {
            seen[b] = 1;
            valid[b] = 1;
        }
    }
    for (size_t i = 0; i < t->n; i++) {
        const ooc_trace_ev_t *e = &t->ev[i];
        int32_t b = e->buf;
        switch (e->kind) {
        case OOC_TR_MAP:
            if (mapped[b])
                FAIL("t=%.0f: buffer %d mapped twice", e->t_ns, b);
            mapped[b] = 1;
            used += m->fp[b];
            if (used > pl->budget_bytes)
                FAIL("t=%.0f: %llu bytes mapped, above the budget of %llu", e->t_ns,
                     (unsigned long long)used, (unsigned long long)pl->budget_bytes);
            if (!seen[b]) {
                seen[b] = 1;
                valid[b] = 1; /* a fresh allocation */
            }
            break;
        case OOC_TR_UNMAP:
            if (!mapped[b])
                FAIL("t=%.0f: buffer %d unmapped but not mapped", e->t_ns, b);
            if (in_d2h[b] || in_h2d[b])
                FAIL("t=%.0f: buffer %d's chunks released while a transfer uses them", e->t_ns, b);
            if (inuse[b])
                FAIL("t=%.0f: buffer %d's chunks released while an op uses them", e->t_ns, b);
            mapped[b] = 0;
            used -= m->fp[b];
            valid[b] = 0;
            break;
        case OOC_TR_H2D_START:
            if (!mapped[b])
                FAIL("t=%.0f: swap-in of buffer %d into unmapped memory", e->t_ns, b);
            if (p->swapin_exclusive && running >= 0)
                FAIL("t=%.0f: swap-in of buffer %d starts while op %d runs (swapin_exclusive)",
                     e->t_ns, b, running);
            in_h2d[b] = 1;
            nin++;
            valid[b] = 0;
            break;
        case OOC_TR_H2D_END:
            in_h2d[b] = 0;
            nin--;
            valid[b] = 1;
            break;
        case OOC_TR_D2H_START:
            if (!mapped[b] || !valid[b])
                FAIL("t=%.0f: swap-out of buffer %d that holds no valid data", e->t_ns, b);
            in_d2h[b] = 1;
            break;
        case OOC_TR_D2H_END:
            in_d2h[b] = 0;
            break;
        case OOC_TR_OP_START: {
            if (running >= 0)
                FAIL("t=%.0f: two compute items overlap", e->t_ns);
            if (p->swapin_exclusive && nin > 0)
                FAIL("t=%.0f: op %d starts while a swap-in runs (swapin_exclusive)", e->t_ns,
                     e->aux);
            running = e->aux;
            const ooc_op_t *o = &p->ops[e->aux];
            for (uint32_t k = 0; k < o->nref; k++) {
                const ooc_ref_t *r = &p->refs[o->ref_off + k];
                int32_t x = r->buf;
                if (!mapped[x] || in_h2d[x])
                    FAIL("t=%.0f: op %d starts before buffer %d is resident", e->t_ns, e->aux, x);
                if ((r->access & OOC_ACCESS_R) && !valid[x])
                    FAIL("t=%.0f: op %d reads buffer %d, whose contents were not restored", e->t_ns,
                         e->aux, x);
                if ((r->access & OOC_ACCESS_W) && in_d2h[x])
                    FAIL("t=%.0f: op %d writes buffer %d while it is copied out", e->t_ns, e->aux,
                         x);
                if (b >= 0 && x != b && lastw[x] > e->aux)
                    FAIL("t=%.0f: recompute of buffer %d reads buffer %d, rewritten by op %d "
                         "after the original producer %d",
                         e->t_ns, b, x, lastw[x], e->aux);
                inuse[x]++;
            }
            break;
        }
        case OOC_TR_OP_END: {
            const ooc_op_t *o = &p->ops[running];
            for (uint32_t k = 0; k < o->nref; k++) {
                const ooc_ref_t *r = &p->refs[o->ref_off + k];
                inuse[r->buf]--;
                if (r->access & OOC_ACCESS_W) {
                    valid[r->buf] = 1;
                    if (b < 0)
                        lastw[r->buf] = running;
                }
            }
            running = -1;
            break;
        }
        default:
            FAIL("unknown trace event");
        }
    }
#undef FAIL
out:
    free(mapped);
    free(valid);
    free(in_h2d);
    free(in_d2h);
    free(seen);
    free(inuse);
    free(lastw);
    return rc;
}
