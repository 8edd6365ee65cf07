/* SPDX-License-Identifier: MIT */
/* bound.c: a lower bound on the simulated iteration time that no valid plan can beat.
 *
 * The argument (profiles/FORMAT.md gives the rules it relies on). Fix an op k and the moment T_k
 * at which the compute engine starts it. Every buffer that holds data needed at or after k (or a
 * dead buffer the program has not freed yet) is either mapped at T_k or off the device. The mapped
 * ones, op k's own buffers among them, fit the budget; so buffers of at least E_k bytes of
 * footprint (everything live at k minus the budget) are off. For such a buffer b:
 *   - it was copied out after its last use before k, and the copy ended by T_k (the simulator
 *     releases chunks only when a copy-out ends; a drop is allowed only for a buffer rebuilt
 *     later), unless it has no use before k and started the iteration on the host;
 *   - it is brought back for its next use u > k by a copy-in that starts after T_k (chunks are
 *     mapped when the copy starts), or rebuilt by re-launching its producers after T_k, which
 *     costs their time on the compute engine; a dead buffer never comes back.
 * Before T_k the compute engine ran ops 0..k-1 and the copy-out engine the copies above; after
 * T_k the compute engine runs ops k..n-1 and the rebuilds, the copy-in engine the copies in. With
 * D the bytes copied out before T_k, H the bytes copied in after it, R the rebuild time:
 *     T >= max(C_<k, D / bw_d2h) + max(C_>=k + R, H / bw_h2d).
 * Sharper pieces hold too: a copy-out of b starts after its last use p_b before k ends, so
 * T_k >= end(op j) + D_j / bw_d2h for every j, D_j the bytes of the off buffers with p_b >= j;
 * and a copy-in of b ends before op u_b starts, so T - T_k >= H_u / bw_h2d + C_>=u for every u,
 * H_u the bytes of the off buffers with u_b <= u.
 * Which buffers are off, and which of them are rebuilt, is the plan's choice: the bound is the
 * minimum over those choices. We relax it to fractions of buffers (each covers its footprint)
 * and use weak duality: max(a, b) >= alpha a + (1 - alpha) b for alpha in [0, 1], so for any
 * alpha, beta and pieces j, u the minimum of
 *     alpha C_<k + (1 - alpha) end(j) + beta C_>=k + (1 - beta) C_>=u
 *       + sum over off b of min(swap_b, rebuild_b),
 *     swap_b = (1 - alpha) [p_b >= j] bytes_b / bw_d2h + (1 - beta) [u_b <= u] bytes_b / bw_h2d,
 *     rebuild_b = beta (producers' time of b), where the recompute rule (docs/planner.md) allows
 * it, over fractional choices covering E_k is a valid lower bound, and that minimum is a fractional
 * knapsack (cheapest cost per footprint byte first). Every cut k and every (alpha, beta, j, u)
 * gives a valid bound, so searching them only tightens it: we screen every cut (or a sample of
 * them on long iterations) and refine the best few. The bound is also at least the compute time.
 * Copies are charged at each direction's own bandwidth (sharing only slows them), and the memory
 * a copy-out holds until it ends, the bidirectional limit and the recompute's input rules are
 * ignored: all of that makes the bound lower, never invalid. */
#include "ooc_planner.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { IT_SWAP = 0, IT_DONLY, IT_HONLY };

typedef struct {
    double fp;    /* footprint: what moving it off covers */
    double d, h;  /* copy-out, copy-in time at full bandwidth, ns */
    double r;     /* rebuild time, ns; < 0: not allowed */
    int32_t p, u; /* last use before the cut (-1: none, data from the start), next use after */
    uint8_t type;
} item_t;

typedef struct {
    double key, fp, c;
} ord_t;

typedef struct {
    const ooc_model_t *m;
    uint64_t budget;
    double *pre; /* pre[i]: sum of the durations of ops 0..i-1 (n + 1 entries) */
    item_t *it;
    ord_t *ord;
    uint32_t nit;
    double excess; /* E_k */
    int32_t k;
} bctx_t;

static int ord_cmp(const void *a, const void *b) {
    const ord_t *x = a, *y = b;
    return x->key < y->key ? -1 : x->key > y->key;
}

/* The dual value of cut c->k for one choice of (alpha, beta, j, u); j = -1: copies out from the
 * start; u = n: copies in until the end. */
static double dual(bctx_t *c, double alpha, double beta, int32_t j, int32_t u) {
    const ooc_model_t *m = c->m;
    double C = c->pre[m->n], C1 = c->pre[c->k], C2 = C - C1;
    double endj = j < 0 ? 0 : c->pre[j + 1], after_u = C - c->pre[u];
    double v = alpha * C1 + (1 - alpha) * endj + beta * C2 + (1 - beta) * after_u;
    if (c->excess <= 0)
        return v;
    for (uint32_t i = 0; i < c->nit; i++) {
        const item_t *x = &c->it[i];
        double dc = x->p >= j ? (1 - alpha) * x->d : 0;
        double hc = x->u <= u ? (1 - beta) * x->h : 0;
        double cost = x->type == IT_DONLY ? dc : x->type == IT_HONLY ? hc : dc + hc;
        if (x->r >= 0 && beta * x->r < cost)
            cost = beta * x->r;
        c->ord[i] = (ord_t){cost / x->fp, x->fp, cost};
    }
    qsort(c->ord, c->nit, sizeof *c->ord, ord_cmp);
    double need = c->excess;
    for (uint32_t i = 0; i < c->nit && need > 0; i++) {
        if (c->ord[i].fp <= need) {
            v += c->ord[i].c;
            need -= c->ord[i].fp;
        } else {
            v += c->ord[i].key * need;
            need = 0;
        }
    }
    return v;
}

/* Collects the items of cut k (buffers that may be off the device when op k starts) and E_k.
 * Returns 0, or OOC_EINFEASIBLE when op k's own buffers exceed the budget. */
static int collect(bctx_t *c, int32_t k) {
    const ooc_model_t *m = c->m;
    const ooc_profile_t *p = m->prof;
    const ooc_op_t *o = &p->ops[k];
    double live = 0, forced = 0, bwd = p->d2h_bps / 1e9, bwh = p->h2d_bps / 1e9;
    c->nit = 0;
    c->k = k;
    for (uint32_t r = 0; r < o->nref; r++)
        forced += (double)m->fp[p->refs[o->ref_off + r].buf];
    if (forced > (double)c->budget)
        return OOC_EINFEASIBLE;
    for (uint32_t b = 0; b < m->nb; b++) {
        const ooc_buffer_t *bf = &p->bufs[b];
        const int32_t *us = m->uses + m->use_off[b];
        uint32_t nu = m->nuse[b], at = ooc_model_next_use(m, (int32_t)b, k);
        if (at < nu && us[at] == k)
            continue; /* op k's own: counted in `forced` */
        int32_t prev = at > 0 ? us[at - 1] : -1, next = at < nu ? us[at] : -1;
        item_t x = {(double)m->fp[b],
                    (double)bf->bytes / bwd,
                    (double)bf->bytes / bwh,
                    -1,
                    prev,
                    next < 0 ? (int32_t)m->n : next,
                    IT_SWAP};
        if (bf->persistent) {
            if (nu == 0)
                continue; /* parked on the host for free */
            if (prev < 0 && next < 0)
                continue;
            if (prev < 0)
                x.type = IT_HONLY; /* may start on the host */
            else if (next < 0)
                x.type = IT_DONLY; /* may end on the host */
        } else {
            int32_t end = bf->free_idx < 0 ? (int32_t)m->n - 1 : (int32_t)bf->free_idx;
            if (bf->alloc_idx >= 0 && (nu == 0 || us[0] > k))
                continue; /* not mapped before its first use */
            if (k > end)
                continue; /* freed */
            if (next < 0) {
                x.type = IT_DONLY; /* dead but not freed yet: it can only leave by a copy */
            } else if (m->recomp[b] && k < m->recomp_until[b]) {
                double t = 0;
                for (uint32_t q = 0; q < bf->nprod; q++)
                    t += (double)p->ops[p->prods[bf->prod_off + q]].duration_ns;
                x.r = t;
            }
        }
        live += x.fp;
        c->it[c->nit++] = x;
    }
    c->excess = live + forced - (double)c->budget;
    return 0;
}

/* Maximises the dual of the current cut over (alpha, beta) by a shrinking pattern search, for
 * fixed j and u. */
static double best_ab(bctx_t *c, int32_t j, int32_t u, double *alpha, double *beta) {
    double a = *alpha, b = *beta, v = dual(c, a, b, j, u);
    for (double step = 0.25; step > 1.0 / 512; step /= 2) {
        int moved = 1;
        while (moved) {
            moved = 0;
            static const int dir[8][2] = {{1, 0}, {-1, 0},  {0, 1},  {0, -1},
                                          {1, 1}, {-1, -1}, {1, -1}, {-1, 1}};
            for (int d = 0; d < 8; d++) {
                double na = a + step * dir[d][0], nb = b + step * dir[d][1];
                if (na < 0 || na > 1 || nb < 0 || nb > 1)
                    continue;
                double nv = dual(c, na, nb, j, u);
                if (nv > v + 1e-6) {
                    v = nv;
                    a = na;
                    b = nb;
                    moved = 1;
                }
            }
        }
    }
    *alpha = a;
    *beta = b;
    return v;
}

/* Refines the current cut: (alpha, beta), then the pieces j and u over a sample of the items'
 * last and next uses, then (alpha, beta) again. */
static double refine(bctx_t *c) {
    int32_t n = (int32_t)c->m->n, j = -1, u = n;
    double a = 0.5, b = 0.5, v = best_ab(c, j, u, &a, &b);
    /* the optimum often lies near (1, 1), where swaps hide under compute: start there too */
    double a2 = 1, b2 = 1, v2 = best_ab(c, j, u, &a2, &b2);
    if (v2 > v) {
        v = v2;
        a = a2;
        b = b2;
    }
    for (int round = 0; round < 2 && c->excess > 0; round++) {
        uint32_t stride = c->nit > 64 ? c->nit / 64 : 1;
        for (uint32_t i = 0; i < c->nit; i += stride) {
            int32_t cj = c->it[i].p;
            double nv = dual(c, a, b, cj, u);
            if (nv > v) {
                v = nv;
                j = cj;
            }
        }
        for (uint32_t i = 0; i < c->nit; i += stride) {
            int32_t cu = c->it[i].u;
            double nv = dual(c, a, b, j, cu);
            if (nv > v) {
                v = nv;
                u = cu;
            }
        }
        double nv = best_ab(c, j, u, &a, &b);
        if (nv <= v + 1e-6) {
            v = nv > v ? nv : v;
            break;
        }
        v = nv;
    }
    return v;
}

typedef struct {
    double v;
    int32_t k;
} cutv_t;

static int cutv_cmp(const void *a, const void *b) {
    const cutv_t *x = a, *y = b;
    if (x->v != y->v)
        return x->v > y->v ? -1 : 1;
    return x->k < y->k ? -1 : x->k > y->k;
}

int ooc_model_bound(const ooc_model_t *m, uint64_t budget_bytes, ooc_bound_t *out) {
    memset(out, 0, sizeof *out);
    out->cut_op = -1;
    out->bound_ns = m->compute_ns;
    if (ooc_model_check_budget(m, budget_bytes, NULL, NULL, 0))
        return OOC_EINFEASIBLE;
    if (m->n == 0)
        return 0;
    bctx_t c = {.m = m, .budget = budget_bytes};
    c.pre = malloc(((size_t)m->n + 1) * sizeof *c.pre);
    c.it = malloc((m->nb ? m->nb : 1) * sizeof *c.it);
    c.ord = malloc((m->nb ? m->nb : 1) * sizeof *c.ord);
    /* on long iterations, screen a sample of the cuts: any subset gives a valid bound */
    uint32_t stride = m->n > 2048 ? (m->n + 2047) / 2048 : 1, ncut = (m->n + stride - 1) / stride;
    cutv_t *cv = malloc(ncut * sizeof *cv);
    int rc = 0;
    if (!c.pre || !c.it || !c.ord || !cv) {
        rc = OOC_ENOMEM;
        goto out;
    }
    c.pre[0] = 0;
    for (uint32_t i = 0; i < m->n; i++)
        c.pre[i + 1] = c.pre[i] + (double)m->prof->ops[i].duration_ns;
    /* screen: a few fixed (alpha, beta) per cut */
    static const double screen[][2] = {{1, 0.5}, {0.5, 1},  {0.5, 0.5}, {1, 0.9},
                                       {0.9, 1}, {0.97, 1}, {1, 0.97},  {0.9, 0.9}};
    uint32_t nc = 0;
    for (uint32_t k = 0; k < m->n; k += stride) {
        if ((rc = collect(&c, (int32_t)k)))
            goto out;
        /* ranked by the screened value, even below the compute time: refining finds more */
        double v = -1;
        for (size_t s = 0; s < sizeof screen / sizeof screen[0] && c.excess > 0; s++) {
            double x = dual(&c, screen[s][0], screen[s][1], -1, (int32_t)m->n);
            if (x > v)
                v = x;
        }
        if (c.excess > 0)
            cv[nc++] = (cutv_t){v, (int32_t)k};
    }
    qsort(cv, nc, sizeof *cv, cutv_cmp);
    double best = (double)m->compute_ns;
    for (uint32_t i = 0; i < nc && i < 8; i++) {
        if ((rc = collect(&c, cv[i].k)))
            goto out;
        double v = refine(&c);
        if (v > best) {
            best = v;
            out->cut_op = cv[i].k;
            out->off_bytes = (uint64_t)c.excess;
        }
    }
    /* rounding down keeps the bound a bound */
    out->bound_ns = (uint64_t)floor(best * (1 - 1e-9));
    if (out->bound_ns < m->compute_ns)
        out->bound_ns = m->compute_ns;
out:
    free(c.pre);
    free(c.it);
    free(c.ord);
    free(cv);
    return rc;
}

uint64_t ooc_model_bound_ns(const ooc_model_t *m, uint64_t budget_bytes, uint64_t *must_bytes) {
    ooc_bound_t b;
    ooc_model_bound(m, budget_bytes, &b);
    if (must_bytes)
        *must_bytes = b.off_bytes;
    return b.bound_ns;
}
