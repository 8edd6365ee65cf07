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
 * ignored: all of that makes the bound lower, never invalid.
 *
 * Two plan-independent facts sharpen the pieces. Windows: T_{i+1} - T_i >= w_i for each op i,
 * where w_i counts what must happen between the starts of ops i and i+1 whatever the plan (op
 * i itself; the copy-outs of op i's buffers that must be gone when op i+1 starts; the copy-ins
 * or rebuilds of op i+1's buffers that cannot be mapped during op i; and the order memory
 * imposes on them, window_ns). So T_k >= W_<k (the sum of w_i over i < k), the end of op j is
 * at least W_<j + its duration, and T - T_u >= W_>=u; the dual uses these instead of compute
 * sums, and T >= the sum of all w_i. Forced gaps: a buffer that cannot be dropped and lies
 * unused between ops a and z while an op between them leaves no room for it must be copied out
 * after a and in before z, by every plan. Such a copy wholly before the cut (a >= j, z <= k) or
 * wholly after it (a >= k, z <= u) is none of the cut's buffers' own and adds to D_j or H_u;
 * one whose gap spans the cut, forced on the cut's side, is paid whether or not its buffer is
 * off at the cut, so it is added outright and the buffer covers footprint without that cost.
 * Shortfall after the cut: at an op i > k, the buffers unused across op i between two uses at or
 * after k are none of the cut's; with every buffer that spans the cut counted off for free, those
 * that do not fit beside op i's own must be off at T_i, copied out after their use and back in
 * after T_i (unless they may be rebuilt, are dead, or have a forced gap counted already), so the
 * cheapest fractional cover of that shortfall adds copies in to H_u (one op i per cut, the
 * costliest of a sample). Copy engines: a forced gap's copy-out runs between the end of op a and
 * the start of its first op without room, its copy-in between the end of its last such op and the
 * start of op z, one copy at a time per engine; so the windows' prefix and suffix sums are
 * raised to what those copies take (engine_bounds), and the dual uses the raised ones. */
#include "bound.h"

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
    uint8_t fd, fh; /* the gap (p, u) is forced (gap_t) by an op at or before the cut (fd), at or
                     * after it (fh): its copy out (in) happens on that side whatever the plan */
} item_t;

typedef struct {
    double key, fp, c;
} ord_t;

/* A forced gap: buffer b, used at a and next at z, with an op in between whose own buffers leave
 * too little room for b; b cannot be dropped, so it is copied out after op a and back in before
 * op z, whatever the plan. */
typedef struct {
    int32_t a, z;
    int32_t f0, f1; /* the first and the last op in between that leave no room for b */
    double d, h;    /* copy-out, copy-in time */
} gap_t;

typedef struct {
    const ooc_model_t *m;
    uint64_t budget;
    double *pre;  /* pre[i]: sum of the durations of ops 0..i-1 (n + 1 entries) */
    double *wpre; /* wpre[i]: sum of the window bounds of ops 0..i-1, so T_i >= wpre[i] */
    double *lo;   /* lo[i] >= wpre[i]: T_i >= lo[i], the copy engines' forced work counted */
    double *tail; /* tail[i]: T - T_i >= tail[i] (tail[n] = 0) */
    item_t *it;
    ord_t *ord;
    uint32_t nit;
    gap_t *gap; /* forced gaps (forced_gaps) */
    uint32_t ngap;
    uint64_t *st; /* sparse table of working sets: st[l * n + i] = max of ws[i .. i + 2^l - 1] */
    /* a later op's shortfall (later_items): the buffers between two uses at or after the cut
     * that must be off when op `li` starts; each covers fp and costs h when its next use <= u */
    item_t *lit;
    ord_t *lord;
    uint32_t nlit;
    double lexcess;
    double excess; /* E_k */
    int32_t k;
} bctx_t;

/* The largest working set of ops lo..hi (0 when the range is empty). */
static uint64_t ws_max(const bctx_t *c, int32_t lo, int32_t hi) {
    if (lo > hi)
        return 0;
    uint32_t n = c->m->n, len = (uint32_t)(hi - lo + 1), l = 0;
    while ((2u << l) <= len)
        l++;
    uint64_t x = c->st[l * n + (uint32_t)lo], y = c->st[l * n + (uint32_t)hi + 1 - (1u << l)];
    return x > y ? x : y;
}

static int ord_cmp(const void *a, const void *b) {
    const ord_t *x = a, *y = b;
    return x->key < y->key ? -1 : x->key > y->key;
}

/* The cheapest fractional cover of need footprint from o[0..no) (sorts o). */
static double knap(ord_t *o, uint32_t no, double need) {
    double v = 0;
    qsort(o, no, sizeof *o, ord_cmp);
    for (uint32_t i = 0; i < no && need > 0; i++) {
        double take = o[i].fp <= need ? o[i].fp : need;
        v += o[i].key * take;
        need -= take;
    }
    return v;
}

/* The cheapest fractional cover of the later shortfall (later_items), copies in counted up to
 * op u. */
static double dual_later(bctx_t *c, int32_t u) {
    if (c->nlit == 0 || c->lexcess <= 0)
        return 0;
    for (uint32_t i = 0; i < c->nlit; i++) {
        const item_t *x = &c->lit[i];
        double cost = x->u <= u ? x->h : 0;
        c->lord[i] = (ord_t){cost / x->fp, x->fp, cost};
    }
    return knap(c->lord, c->nlit, c->lexcess);
}

/* The dual value of cut c->k for one choice of (alpha, beta, j, u); j = -1: copies out from the
 * start; u = n: copies in until the end. */
static double dual(bctx_t *c, double alpha, double beta, int32_t j, int32_t u) {
    const ooc_model_t *m = c->m;
    double C = c->pre[m->n], C2 = C - c->pre[c->k];
    const double *L = c->lo;
    double endj = j < 0 ? 0 : L[j] + (c->pre[j + 1] - c->pre[j]), after_u = c->tail[u];
    double v = alpha * L[c->k] + (1 - alpha) * endj + beta * C2 + (1 - beta) * after_u;
    for (uint32_t i = 0; i < c->nit; i++) {
        const item_t *x = &c->it[i];
        if (x->fd && x->p >= j)
            v += (1 - alpha) * x->d;
        if (x->fh && x->u <= u)
            v += (1 - beta) * x->h;
    }
    /* forced gaps wholly on one side of the cut: their copies are none of the cut's buffers' */
    for (uint32_t g = 0; g < c->ngap; g++) {
        const gap_t *x = &c->gap[g];
        if (x->a >= j && x->z <= c->k)
            v += (1 - alpha) * x->d;
        else if (x->a >= c->k && x->z <= u)
            v += (1 - beta) * x->h;
    }
    v += (1 - beta) * dual_later(c, u);
    if (c->excess <= 0)
        return v;
    for (uint32_t i = 0; i < c->nit; i++) {
        const item_t *x = &c->it[i];
        double dc = x->p >= j ? (1 - alpha) * x->d : 0;
        double hc = x->u <= u ? (1 - beta) * x->h : 0;
        /* a forced copy is paid whether or not this buffer is off at the cut: counted in v */
        if (x->fd)
            dc = 0;
        if (x->fh)
            hc = 0;
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
                    IT_SWAP,
                    0,
                    0};
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
        if (x.type == IT_SWAP && x.r < 0 && !m->recomp[b] && prev >= 0 && next >= 0) {
            uint64_t room = c->budget - m->fp[b];
            x.fd = ws_max(c, prev + 1, k) > room;
            x.fh = ws_max(c, k, next - 1) > room;
        }
        live += x.fp;
        c->it[c->nit++] = x;
    }
    c->excess = live + forced - (double)c->budget;
    return 0;
}

/* Collects into c->lit the buffers that lie unused across op i between two uses a < i < z with
 * a >= c->k (so none of the cut's buffers, and their copies none of the cut's), each with its
 * copy-in time (0 when it may be dropped and rebuilt, ends the iteration where it is, or has a
 * forced gap, whose copies are counted already), and the shortfall: what of them must be off
 * when op i starts, every buffer that spans the cut counted off for free. */
static void later_items(bctx_t *c, int32_t i) {
    const ooc_model_t *m = c->m;
    const ooc_profile_t *p = m->prof;
    double bwh = p->h2d_bps / 1e9, live = 0;
    c->nlit = 0;
    for (uint32_t b = 0; b < m->nb; b++) {
        const int32_t *us = m->uses + m->use_off[b];
        uint32_t nu = m->nuse[b], at = ooc_model_next_use(m, (int32_t)b, i);
        if (at == 0 || (at < nu && us[at] == i))
            continue; /* not used before op i, or op i's own */
        int32_t a = us[at - 1];
        if (a < c->k)
            continue;
        const ooc_buffer_t *bf = &p->bufs[b];
        if (!bf->persistent && bf->free_idx >= 0 && bf->free_idx < i)
            continue; /* freed */
        item_t x = {(double)m->fp[b], 0, 0, -1, a, at < nu ? us[at] : (int32_t)m->n, IT_SWAP, 0, 0};
        if (at < nu && !m->recomp[b] && ws_max(c, a + 1, us[at] - 1) <= c->budget - m->fp[b])
            x.h = (double)bf->bytes / bwh; /* (a forced gap's copy-in is counted already) */
        live += x.fp;
        c->lit[c->nlit++] = x;
    }
    c->lexcess = (double)m->ws[i] + live - (double)c->budget;
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
    /* the later op whose shortfall costs most with every copy counted (a sample of them) */
    int32_t step = (n - c->k) / 256 + 1, bi = -1;
    double bv = 0;
    for (int32_t i = c->k + 1; i < n; i += step) {
        later_items(c, i);
        double lv = dual_later(c, n);
        if (lv > bv) {
            bv = lv;
            bi = i;
        }
    }
    c->nlit = 0;
    if (bi >= 0)
        later_items(c, bi);
    double a = 0.5, b = 0.5, v = best_ab(c, j, u, &a, &b);
    /* the optimum often lies near (1, 1), where swaps hide under compute: start there too */
    double a2 = 1, b2 = 1, v2 = best_ab(c, j, u, &a2, &b2);
    if (v2 > v) {
        v = v2;
        a = a2;
        b = b2;
    }
    /* and at u = k, beta = 0: the cut's copies out, then the windows from k on */
    double a3 = 0.5, b3 = 0, v3 = best_ab(c, j, c->k, &a3, &b3);
    if (v3 > v) {
        v = v3;
        a = a3;
        b = b3;
        u = c->k;
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

/* The last op in lo..hi whose working set is above room (one is). */
static int32_t last_above(const bctx_t *c, int32_t lo, int32_t hi, uint64_t room) {
    while (lo < hi) {
        int32_t mid = lo + (hi - lo + 1) / 2;
        if (ws_max(c, mid, hi) > room)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

/* Makes room in c->gap for one more. Returns 0 or OOC_ENOMEM. */
static int gap_room(bctx_t *c, uint32_t *cap) {
    if (c->ngap < *cap)
        return 0;
    uint32_t nc = *cap ? 2 * *cap : 64;
    gap_t *ng = realloc(c->gap, nc * sizeof *ng);
    if (!ng)
        return OOC_ENOMEM;
    c->gap = ng;
    *cap = nc;
    return 0;
}

/* Adds to c->gap the copies-in that a rebuild's inputs force (the argument is in docs/planner.md,
 * "The lower bound": a rebuild's inputs). A buffer b that may be rebuilt, unused between its uses
 * a and z while op f_b in between leaves no room for it, is unmapped at T_{f_b} and mapped again
 * after op f_b ends, by a copy-in (of b) or a rebuild, which needs each producer input x mapped.
 * Take an input x that cannot be rebuilt, unused from op p_x < z until op u_x > z, with an op g_x
 * in (p_x, f_b] and an op in [z, u_x) that leave no room for it: x mapped at the rebuild was copied
 * in after op g_x ended, and unmapped again before its own next use, so that copy is one more than
 * x's forced gap makes (whose copy-in starts after an op at or after z). Either way, a copy-in of
 * at least min(b's, x's) starts after op g_x (<= f_b) ends and ends before op z starts: a gap with
 * only a copy-in (d = 0), f1 = g_x, and a = min(a, p_x) (its copy is none of a cut's buffers' when
 * a >= the cut). Each gap of b and each gap of x serves one such copy, so none is counted twice.
 * With the forced gaps, at most 2,048 in all. Returns 0 or OOC_ENOMEM. */
static int rebuild_gaps(bctx_t *c) {
    const ooc_model_t *m = c->m;
    const ooc_profile_t *p = m->prof;
    uint32_t cap = c->ngap, nuses = m->use_off[m->nb];
    uint8_t *used = calloc(nuses ? nuses : 1, 1); /* per use of x: its gap before serves one */
    double bwh = p->h2d_bps / 1e9;
    int rc = used ? 0 : OOC_ENOMEM;
    for (uint32_t b = 0; b < m->nb && !rc && c->ngap < 2048; b++) {
        const ooc_buffer_t *bf = &p->bufs[b];
        if (!m->recomp[b] || m->fp[b] > c->budget)
            continue;
        const int32_t *us = m->uses + m->use_off[b];
        uint64_t room = c->budget - m->fp[b];
        for (uint32_t t = 0; t + 1 < m->nuse[b] && !rc && c->ngap < 2048; t++) {
            int32_t a = us[t], z = us[t + 1];
            if (z - a < 2 || ws_max(c, a + 1, z - 1) <= room)
                continue;
            int32_t fb = last_above(c, a + 1, z - 1, room), bx = -1, bg = 0, bp = 0;
            double bh = 0;
            for (uint32_t q = 0; q < bf->nprod; q++) {
                const ooc_op_t *o = &p->ops[p->prods[bf->prod_off + q]];
                for (uint32_t r = 0; r < o->nref; r++) {
                    const ooc_ref_t *ref = &p->refs[o->ref_off + r];
                    int32_t x = ref->buf;
                    if (x == (int32_t)b || !(ref->access & OOC_ACCESS_R) || m->recomp[x] ||
                        m->fp[x] > c->budget)
                        continue;
                    const int32_t *ux = m->uses + m->use_off[x];
                    uint32_t nx = m->nuse[x], at = ooc_model_next_use(m, x, z);
                    if (at == 0 || at >= nx || ux[at] == z || ux[at - 1] >= fb ||
                        used[m->use_off[x] + at])
                        continue; /* x used at z, not before, not after, or not before f_b */
                    uint64_t rx = c->budget - m->fp[x];
                    if (ws_max(c, z, ux[at] - 1) <= rx || ws_max(c, ux[at - 1] + 1, fb) <= rx)
                        continue;
                    double h =
                        (double)(bf->bytes < p->bufs[x].bytes ? bf->bytes : p->bufs[x].bytes) / bwh;
                    if (h > bh) {
                        bh = h;
                        bx = (int32_t)(m->use_off[x] + at);
                        bg = last_above(c, ux[at - 1] + 1, fb, rx);
                        bp = ux[at - 1];
                    }
                }
            }
            if (bx < 0 || (rc = gap_room(c, &cap)) != 0)
                continue;
            used[bx] = 1;
            c->gap[c->ngap++] = (gap_t){bp < a ? bp : a, z, z, bg, 0, bh};
        }
    }
    free(used);
    return rc;
}

/* Finds the forced gaps (gap_t) into c->gap, with a sparse table for the largest working set
 * over a range of ops. Returns 0 or OOC_ENOMEM. */
static int forced_gaps(bctx_t *c) {
    const ooc_model_t *m = c->m;
    const ooc_profile_t *p = m->prof;
    uint32_t n = m->n, lg = 1;
    while ((1u << lg) < n)
        lg++;
    uint64_t *st = c->st = malloc((size_t)lg * n * sizeof *st);
    uint32_t cap = 0;
    if (!st)
        return OOC_ENOMEM;
    memcpy(st, m->ws, n * sizeof *st);
    for (uint32_t l = 1; l < lg; l++)
        for (uint32_t i = 0; i + (1u << l) <= n; i++) {
            uint64_t x = st[(l - 1) * n + i], y = st[(l - 1) * n + i + (1u << (l - 1))];
            st[l * n + i] = x > y ? x : y;
        }
    double bwd = p->d2h_bps / 1e9, bwh = p->h2d_bps / 1e9;
    for (uint32_t b = 0; b < m->nb; b++) {
        if (m->recomp[b])
            continue; /* may be dropped and rebuilt instead */
        const int32_t *us = m->uses + m->use_off[b];
        for (uint32_t t = 0; t + 1 < m->nuse[b]; t++) {
            int32_t a = us[t], z = us[t + 1];
            if (z - a < 2)
                continue;
            if (ws_max(c, a + 1, z - 1) + m->fp[b] <= c->budget)
                continue;
            if (gap_room(c, &cap))
                return OOC_ENOMEM;
            /* the first and the last op in (a, z) whose own buffers leave no room for b */
            uint64_t room = c->budget - m->fp[b];
            int32_t lo = a + 1, hi = z - 1;
            while (lo < hi) {
                int32_t mid = lo + (hi - lo) / 2;
                if (ws_max(c, a + 1, mid) > room)
                    hi = mid;
                else
                    lo = mid + 1;
            }
            int32_t f0 = lo;
            double bytes = (double)p->bufs[b].bytes;
            c->gap[c->ngap++] =
                (gap_t){a, z, f0, last_above(c, a + 1, z - 1, room), bytes / bwd, bytes / bwh};
        }
    }
    return rebuild_gaps(c);
}

static const gap_t *sort_gaps; /* engine_bounds' qsort key: 0 a, 1 z, 2 f0, 3 f1 */
static int sort_key;

static int32_t gap_key(const gap_t *g, int key) {
    return key == 0 ? g->a : key == 1 ? g->z : key == 2 ? g->f0 : g->f1;
}

static int gidx_cmp(const void *x, const void *y) {
    int32_t a = gap_key(&sort_gaps[*(const uint32_t *)x], sort_key);
    int32_t b = gap_key(&sort_gaps[*(const uint32_t *)y], sort_key);
    return a < b ? -1 : a > b;
}

/* Fills c->lo and c->tail from the windows and the forced gaps (the argument is in
 * docs/planner.md, "The lower bound": the copy engines' forced work). A forced gap's copy-out
 * starts after op a ends and ends before op f0 starts; its copy-in starts after op f1 ends (op
 * f1's buffers stay mapped until then) and ends before op z starts; each engine runs one copy at
 * a time, at most at its direction's own bandwidth. So for ops s < z, T_z >= end(op s) + the
 * copy-ins of the gaps with f1 >= s and z_g <= z, and T_f >= end(op s) + the copy-outs of the
 * gaps with a >= s and f0 <= f; the same sets bound T - T_s from the other end. With too many gaps
 * only the windows are used (a weaker bound). Returns 0 or OOC_ENOMEM. */
static int engine_bounds(bctx_t *c) {
    const ooc_model_t *m = c->m;
    uint32_t n = m->n, ng = c->ngap <= 2048 ? c->ngap : 0;
    double *L = c->lo = malloc(((size_t)n + 1) * sizeof *L);
    double *Q = c->tail = malloc(((size_t)n + 1) * sizeof *Q);
    uint32_t *ix = malloc((4 * (size_t)ng + 1) * sizeof *ix);
    uint8_t *ev = calloc((size_t)n + 1, 1);
    int rc = 0;
    if (!L || !Q || !ix || !ev) {
        rc = OOC_ENOMEM;
        goto out;
    }
    /* ix: the gaps ordered by a, z, f0 and f1 (four runs of ng) */
    sort_gaps = c->gap;
    for (int key = 0; key < 4; key++) {
        for (uint32_t g = 0; g < ng; g++)
            ix[key * ng + g] = g;
        sort_key = key;
        if (ng)
            qsort(ix + key * ng, ng, sizeof *ix, gidx_cmp);
    }
    const uint32_t *by_a = ix, *by_z = ix + ng, *by_f0 = ix + 2 * ng, *by_f1 = ix + 3 * ng;
    for (uint32_t g = 0; g < ng; g++) {
        ev[c->gap[g].a] |= 1;
        ev[c->gap[g].z] |= 2;
        ev[c->gap[g].f0] |= 4;
        ev[c->gap[g].f1] |= 8;
    }
    const double *pre = c->pre, *W = c->wpre;
    L[0] = 0;
    for (uint32_t i = 0; i < n; i++) {
        double v = L[i] + (W[i + 1] - W[i]);
        int32_t t = (int32_t)i + 1;
        if (ev[t] & 2) { /* copy-ins due by op t, started after op s ends (f1 >= s) */
            double acc = 0;
            for (uint32_t q = ng; q-- > 0;) {
                const gap_t *g = &c->gap[by_f1[q]];
                if (g->z > t)
                    continue;
                acc += g->h;
                v = fmax(v, L[g->f1] + (pre[g->f1 + 1] - pre[g->f1]) + acc);
            }
        }
        if (ev[t] & 4) { /* copy-outs due by op t, started after op s ends (a >= s) */
            double acc = 0;
            for (uint32_t q = ng; q-- > 0;) {
                const gap_t *g = &c->gap[by_a[q]];
                if (g->f0 > t)
                    continue;
                acc += g->d;
                v = fmax(v, L[g->a] + (pre[g->a + 1] - pre[g->a]) + acc);
            }
        }
        L[t] = v;
    }
    Q[n] = 0;
    for (uint32_t i = n; i-- > 0;) {
        double v = Q[i + 1] + (W[i + 1] - W[i]);
        if (ev[i] & 8) { /* copy-ins started after op i ends (f1 >= i), due by op z */
            double acc = 0;
            for (uint32_t q = 0; q < ng; q++) {
                const gap_t *g = &c->gap[by_z[q]];
                if (g->f1 < (int32_t)i)
                    continue;
                acc += g->h;
                v = fmax(v, (pre[i + 1] - pre[i]) + acc + Q[g->z]);
            }
        }
        if (ev[i] & 1) { /* copy-outs started after op i ends (a >= i), due by op f0 */
            double acc = 0;
            for (uint32_t q = 0; q < ng; q++) {
                const gap_t *g = &c->gap[by_f0[q]];
                if (g->a < (int32_t)i)
                    continue;
                acc += g->d;
                v = fmax(v, (pre[i + 1] - pre[i]) + acc + Q[g->f0]);
            }
        }
        Q[i] = v;
    }
out:
    free(ix);
    free(ev);
    return rc;
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
    c.wpre = malloc(((size_t)m->n + 1) * sizeof *c.wpre);
    c.it = malloc((m->nb ? m->nb : 1) * sizeof *c.it);
    c.ord = malloc((m->nb ? m->nb : 1) * sizeof *c.ord);
    c.lit = malloc((m->nb ? m->nb : 1) * sizeof *c.lit);
    c.lord = malloc((m->nb ? m->nb : 1) * sizeof *c.lord);
    /* on long iterations, screen a sample of the cuts: any subset gives a valid bound */
    uint32_t stride = m->n > 2048 ? (m->n + 2047) / 2048 : 1, ncut = (m->n + stride - 1) / stride;
    cutv_t *cv = malloc(ncut * sizeof *cv);
    int rc = 0;
    if (!c.pre || !c.wpre || !c.it || !c.ord || !c.lit || !c.lord || !cv) {
        rc = OOC_ENOMEM;
        goto out;
    }
    c.pre[0] = 0;
    for (uint32_t i = 0; i < m->n; i++)
        c.pre[i + 1] = c.pre[i] + (double)m->prof->ops[i].duration_ns;
    if ((rc = forced_gaps(&c)))
        goto out;
    c.wpre[0] = 0;
    for (uint32_t i = 0; i < m->n; i++)
        c.wpre[i + 1] = c.wpre[i] + (i + 1 < m->n ? ooc_bound_window_ns(m, budget_bytes, (int32_t)i)
                                                  : (double)m->prof->ops[i].duration_ns);
    if ((rc = engine_bounds(&c)))
        goto out;
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
        for (int s = 0; s < 3 && c.excess > 0; s++) {
            double x = dual(&c, 0.5 * s, 0, -1, (int32_t)k);
            if (x > v)
                v = x;
        }
        if (c.excess > 0)
            cv[nc++] = (cutv_t){v, (int32_t)k};
    }
    qsort(cv, nc, sizeof *cv, cutv_cmp);
    /* the windows and the copy engines' forced work alone */
    double best = fmax(c.lo[m->n], c.tail[0]);
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
    free(c.wpre);
    free(c.lo);
    free(c.tail);
    free(c.gap);
    free(c.st);
    free(c.it);
    free(c.ord);
    free(c.lit);
    free(c.lord);
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
