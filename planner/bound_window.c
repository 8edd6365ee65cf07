/* SPDX-License-Identifier: MIT */
/* bound_window.c: the per-window piece of the lower bound (bound.c): a time that must pass between
 * the starts of two consecutive ops, whatever the plan.
 *
 * Pure functions of the model and the budget; no state, thread-safe. The argument is in
 * docs/planner.md, "The lower bound" (windows between consecutive ops). Caller: ooc_model_bound. */
#include "bound.h"

#include <math.h>

enum { WIN_EXACT = 10, WIN_ENUM = 6 };

typedef struct {
    double fp, t; /* footprint; copy time (out for a leaving buffer, in for an arriving one) */
    double r;     /* rebuild time, ns; < 0: not allowed */
    double h;     /* a common buffer's copy-in time (t is its copy-out) */
} wbuf_t;

/* The least total copy time of a subset of a[0..na) whose footprint reaches need: exact over
 * subsets when na <= WIN_EXACT, else the fractional relaxation (lower, so still a bound).
 * INFINITY when all of them together do not reach it. */
static double cover(const wbuf_t *a, int na, double need) {
    if (need <= 0)
        return 0;
    double best = INFINITY;
    if (na <= WIN_EXACT) {
        for (uint32_t s = 1; s < (1u << na); s++) {
            double f = 0, t = 0;
            for (int i = 0; i < na; i++)
                if (s & (1u << i)) {
                    f += a[i].fp;
                    t += a[i].t;
                }
            if (f >= need && t < best)
                best = t;
        }
        return best;
    }
    double total = 0;
    for (int i = 0; i < na; i++)
        total += a[i].fp;
    if (total < need)
        return INFINITY;
    /* fractional: cheapest time per footprint byte first (selection, na is one op's refs) */
    uint8_t used[64] = {0};
    double t = 0;
    while (need > 0) {
        int bi = -1;
        for (int i = 0; i < na && i < 64; i++)
            if (!used[i] && (bi < 0 || a[i].t * a[bi].fp < a[bi].t * a[i].fp))
                bi = i;
        if (bi < 0)
            break;
        used[bi] = 1;
        double take = a[bi].fp < need ? a[bi].fp : need;
        t += a[bi].fp > 0 ? a[bi].t * take / a[bi].fp : 0;
        need -= take;
    }
    return t;
}

static int refs_op(const ooc_profile_t *p, int32_t op, int32_t b) {
    const ooc_op_t *o = &p->ops[op];
    for (uint32_t r = 0; r < o->nref; r++)
        if (p->refs[o->ref_off + r].buf == b)
            return 1;
    return 0;
}

static double prod_time(const ooc_profile_t *p, int32_t b) {
    const ooc_buffer_t *bf = &p->bufs[b];
    double t = 0;
    for (uint32_t q = 0; q < bf->nprod; q++)
        t += (double)p->ops[p->prods[bf->prod_off + q]].duration_ns;
    return t;
}

/* A lower bound on T_{k+1} - T_k, the time from the start of op k to the start of op k + 1, that
 * holds for every valid plan (the argument is in docs/planner.md, "The lower bound"). Op k's
 * buffers are mapped from T_k until op k ends; op k+1's are all mapped at T_{k+1}. Leaving: op
 * k's buffers that op k+1 does not use, are not freed after op k and cannot be dropped (every use
 * dirties a buffer, so their release is a copy-out that starts when op k ends). Arriving: op
 * k+1's buffers that op k does not use and that hold data; each is mapped throughout op k, or its
 * last mapping before T_{k+1} starts after T_k, by a copy-in or a rebuild. Common: used by both.
 * The arriving buffers' choices are enumerated (at most WIN_ENUM of them; more: the window gets
 * only the leaving side); the window is the least over the choices of the largest of the lower
 * bounds each choice implies. */
double ooc_bound_window_ns(const ooc_model_t *m, uint64_t budget, int32_t k) {
    const ooc_profile_t *p = m->prof;
    const ooc_op_t *ok = &p->ops[k], *o1 = &p->ops[k + 1];
    double dur = (double)ok->duration_ns, M = (double)budget;
    double bwd = p->d2h_bps / 1e9, bwh = p->h2d_bps / 1e9;
    wbuf_t lv[64], ar[WIN_ENUM], cm[64];
    int nl = 0, na = 0, nc = 0, many = 0, manyc = 0;
    double fpk = 0, fpk1 = 0, fpl = 0, fpc = 0;
    for (uint32_t r = 0; r < ok->nref; r++) {
        int32_t b = p->refs[ok->ref_off + r].buf;
        const ooc_buffer_t *bf = &p->bufs[b];
        double fp = (double)m->fp[b];
        fpk += fp;
        wbuf_t x = {fp, (double)bf->bytes / bwd, m->recomp[b] ? prod_time(p, b) : -1,
                    (double)bf->bytes / bwh};
        if (refs_op(p, k + 1, b)) {
            if (nc < 64)
                cm[nc++] = x;
            else
                manyc = 1;
            fpc += fp;
        } else if (!(bf->free_idx == k && !bf->persistent) && !m->recomp[b] && nl < 64) {
            lv[nl++] = x; /* one not listed only lowers what is asked of the listed ones */
            fpl += fp;
        }
    }
    for (uint32_t r = 0; r < o1->nref; r++) {
        int32_t b = p->refs[o1->ref_off + r].buf;
        const ooc_buffer_t *bf = &p->bufs[b];
        fpk1 += (double)m->fp[b];
        if (refs_op(p, k, b))
            continue;
        if (!bf->persistent && bf->alloc_idx >= 0 && m->uses[m->use_off[b]] == k + 1)
            continue; /* first touched by op k+1: mapped at T_{k+1}, no data to bring */
        if (na == WIN_ENUM) {
            many = 1;
            continue;
        }
        ar[na++] = (wbuf_t){(double)m->fp[b], (double)bf->bytes / bwh,
                            m->recomp[b] ? prod_time(p, b) : -1, 0};
    }
    /* the leaving buffers that must be gone when op k+1 starts */
    double out = cover(lv, nl, fpk1 + fpl - M);
    double w = dur + (isfinite(out) ? out : 0);
    if (many)
        return w;
    double best = INFINITY;
    uint32_t nchoice = 1;
    for (int i = 0; i < na; i++)
        nchoice *= 3;
    for (uint32_t code = 0; code < nchoice; code++) {
        double fpre = 0, H = 0, R = 0, fin = 0, hmin = INFINITY;
        int ok_choice = 1, nin = 0;
        uint32_t c = code;
        for (int i = 0; i < na; i++, c /= 3) {
            if (c % 3 == 0) {
                fpre += ar[i].fp; /* mapped throughout op k */
            } else if (c % 3 == 1) {
                H += ar[i].t; /* copied in after T_k */
                fin += ar[i].fp;
                hmin = ar[i].t < hmin ? ar[i].t : hmin;
                nin++;
            } else if (ar[i].r >= 0) {
                R += ar[i].r; /* rebuilt after op k */
            } else {
                ok_choice = 0;
            }
        }
        if (!ok_choice || fpk + fpre > M)
            continue;
        double v = fmax(w, fmax(dur + R, H));
        if (nin > 0) {
            /* the last copy-in to start finds every common, pre-mapped and arriving buffer mapped,
             * and the leaving ones not yet released: unless a common buffer leaves and comes
             * back inside the window, enough of those must be released first */
            double stay = 0;
            if (fpk + fin + fpre > M) /* so it starts after op k ends */
                stay = dur + cover(lv, nl, fpc + fin + fpre + fpl - M) + hmin;
            double alt = manyc ? 0 : INFINITY;
            for (int i = 0; i < nc; i++) {
                /* common buffer i leaves after op k (a copy-out: op k dirtied it) and comes back */
                double a = fmax(dur + cm[i].t + cm[i].h, H + cm[i].h);
                a = fmax(a, dur + cm[i].t + (isfinite(out) ? out : 0));
                if (cm[i].r >= 0)
                    a = fmin(a, dur + R + cm[i].r); /* or is dropped and rebuilt */
                alt = fmin(alt, a);
            }
            v = fmax(v, fmin(stay, alt));
        }
        best = fmin(best, v);
    }
    return isfinite(best) ? fmax(best, dur) : w;
}
