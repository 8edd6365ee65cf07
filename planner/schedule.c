/* SPDX-License-Identifier: MIT */
/* schedule.c: gaps (the stretches between a buffer's uses), one decision per gap, and the plan a
 * set of decisions stands for; plus the memory-aware placement of swap-ins.
 *
 * Every policy decides gap by gap and lets sched_plan write the actions, so that all plans obey
 * the same conventions: a swap-out right after the use before the gap, a swap-in issued before
 * op in_at and a wait before the next use, a drop after the last use of a buffer the program
 * frees later, and persistent buffers that the iteration never touches parked on the host. */
#include "schedule.h"
#include "grow.h"

#include <stdlib.h>
#include <string.h>

int sched_init(sched_t *s, const ooc_model_t *m) {
    memset(s, 0, sizeof *s);
    s->m = m;
    const ooc_profile_t *p = m->prof;
    uint32_t cap = 0;
    for (uint32_t b = 0; b < m->nb; b++)
        cap += m->nuse[b];
    s->g = calloc(cap ? cap : 1, sizeof *s->g);
    s->gap_off = calloc(m->nb + 1, sizeof *s->gap_off);
    if (!s->g || !s->gap_off) {
        sched_free(s);
        return OOC_ENOMEM;
    }
    int32_t n = (int32_t)m->n;
    for (uint32_t b = 0; b < m->nb; b++) {
        s->gap_off[b] = s->ng;
        const int32_t *u = m->uses + m->use_off[b];
        uint32_t k = m->nuse[b];
        for (uint32_t j = 0; j + 1 < k; j++)
            if (u[j + 1] - u[j] >= 2)
                s->g[s->ng++] = (gap_t){(int32_t)b, u[j], u[j + 1], OOC_KEEP, u[j + 1]};
        if (k > 0 && p->bufs[b].persistent && u[0] + n - u[k - 1] >= 2)
            s->g[s->ng++] = (gap_t){(int32_t)b, u[k - 1], u[0] + n, OOC_KEEP, u[0] + n};
    }
    s->gap_off[m->nb] = s->ng;
    return 0;
}

void sched_free(sched_t *s) {
    free(s->g);
    free(s->gap_off);
    s->g = NULL;
    s->gap_off = NULL;
    s->ng = 0;
}

int sched_copy(sched_t *dst, const sched_t *src) {
    memset(dst, 0, sizeof *dst);
    dst->m = src->m;
    dst->ng = src->ng;
    dst->g = malloc((src->ng ? src->ng : 1) * sizeof *dst->g);
    dst->gap_off = malloc((src->m->nb + 1) * sizeof *dst->gap_off);
    if (!dst->g || !dst->gap_off) {
        sched_free(dst);
        return OOC_ENOMEM;
    }
    memcpy(dst->g, src->g, src->ng * sizeof *dst->g);
    memcpy(dst->gap_off, src->gap_off, (src->m->nb + 1) * sizeof *dst->gap_off);
    dst->memo = src->memo;
    return 0;
}

gap_t *sched_gap_at(const sched_t *s, int32_t b, int32_t t) {
    int32_t n = (int32_t)s->m->n;
    for (uint32_t k = s->gap_off[b]; k < s->gap_off[b + 1]; k++) {
        gap_t *g = &s->g[k];
        if ((g->from < t && t <= g->to) || (g->to >= n && g->from < t + n && t + n <= g->to))
            return g;
    }
    return NULL;
}

void sched_input_needs(const sched_t *s, int32_t *need) {
    const ooc_model_t *m = s->m;
    const ooc_profile_t *p = m->prof;
    int32_t n = (int32_t)m->n;
    for (uint32_t k = 0; k < s->ng; k++)
        need[k] = INT32_MAX;
    for (uint32_t k = 0; k < s->ng; k++) {
        const gap_t *g = &s->g[k];
        if (g->dec != OOC_RECOMPUTE || g->to >= n)
            continue;
        const ooc_buffer_t *bf = &p->bufs[g->buf];
        for (uint32_t j = 0; j < bf->nprod; j++) {
            const ooc_op_t *o = &p->ops[p->prods[bf->prod_off + j]];
            for (uint32_t r = 0; r < o->nref; r++) {
                int32_t x = p->refs[o->ref_off + r].buf;
                gap_t *xg = x == g->buf ? NULL : sched_gap_at(s, x, g->to);
                if (!xg)
                    continue;
                int32_t t = xg->to >= n && g->to <= xg->from ? g->to + n : g->to;
                if (t < xg->to && t < need[xg - s->g])
                    need[xg - s->g] = t;
            }
        }
    }
}

uint64_t sched_score(const ooc_sim_result_t *r) {
    return r->feasible ? r->time_ns : UINT64_MAX;
}

void sched_heap_push(sched_heap_t *h, uint32_t v) {
    uint32_t i = h->n++;
    h->a[i] = v;
    while (i > 0 && h->above(h->ctx, h->a[i], h->a[(i - 1) / 2])) {
        uint32_t p = (i - 1) / 2, t = h->a[p];
        h->a[p] = h->a[i];
        h->a[i] = t;
        i = p;
    }
}

uint32_t sched_heap_pop(sched_heap_t *h) {
    uint32_t top = h->a[0];
    h->a[0] = h->a[--h->n];
    for (uint32_t i = 0;;) {
        uint32_t l = 2 * i + 1, r = l + 1, b = i;
        if (l < h->n && h->above(h->ctx, h->a[l], h->a[b]))
            b = l;
        if (r < h->n && h->above(h->ctx, h->a[r], h->a[b]))
            b = r;
        if (b == i)
            break;
        uint32_t t = h->a[b];
        h->a[b] = h->a[i];
        h->a[i] = t;
        i = b;
    }
    return top;
}

uint32_t sched_sim_budget(const ooc_model_t *m) {
    uint64_t work = (uint64_t)m->n + m->prof->nrefs + 1;
    /* a simulation costs about 80 ns per op and reference on this machine: this keeps one
     * search near 0.2 s on a 10,000-op iteration */
    uint64_t k = 2400000ull / work;
    if (k < 16)
        k = 16;
    if (k > 2000)
        k = 2000;
    return (uint32_t)k;
}

void sched_swap_all(sched_t *s, int32_t min_len, int32_t ahead) {
    for (uint32_t k = 0; k < s->ng; k++) {
        gap_t *g = &s->g[k];
        if (g->to - g->from < min_len) {
            g->dec = OOC_KEEP;
            continue;
        }
        g->dec = OOC_SWAP;
        g->in_at = g->to - ahead;
        if (g->in_at <= g->from)
            g->in_at = g->from + 1;
    }
}

/* The recomputes of a schedule being emitted: per gap, the op before which a recomputed gap's
 * buffer is rebuilt (its next use, or earlier when a later recompute reads it: a chain). */
typedef struct {
    sched_t *s;
    int32_t *at; /* per gap */
} rebuild_t;

#define REBUILD_MAX_DEPTH 8

/* Swapped gap g becomes needed (resident and waited for) before op t: its swap-in moves there
 * when later. t is on g's axis (t + n for the next iteration's part of a wrapping gap). */
static void need_swapped_by(const ooc_model_t *m, gap_t *g, int32_t t) {
    if (g->to >= (int32_t)m->n && t <= g->from)
        t += (int32_t)m->n;
    if (g->in_at > t)
        g->in_at = t;
}

/* Recompute gap g's buffer before op rb->at[g]: its producers' inputs must be resident then.
 * A swapped input's swap-in moves early enough (the wait is written with the plan); a recomputed
 * input is rebuilt first, before the same op when its id is lower (recomputes at one op replay in
 * buffer order) or one op earlier, recursively (a chain: a ReLU's output rebuilt from a batch
 * norm's rebuilt output). Returns 0 when the recompute stays, 1 when it must become a swap. */
static int rebuild_inputs(rebuild_t *rb, gap_t *g, int depth) {
    sched_t *s = rb->s;
    const ooc_model_t *m = s->m;
    const ooc_profile_t *p = m->prof;
    const ooc_buffer_t *bf = &p->bufs[g->buf];
    int32_t t = rb->at[g - s->g];
    if (!m->recomp[g->buf] || g->to >= (int32_t)m->n || g->to > m->recomp_until[g->buf] ||
        t <= g->from)
        return 1;
    for (uint32_t k = 0; k < bf->nprod; k++) {
        const ooc_op_t *o = &p->ops[p->prods[bf->prod_off + k]];
        for (uint32_t r = 0; r < o->nref; r++) {
            int32_t x = p->refs[o->ref_off + r].buf;
            if (x == g->buf)
                continue;
            gap_t *xg = sched_gap_at(s, x, t);
            if (!xg || xg->dec == OOC_KEEP)
                continue;
            if (xg->dec == OOC_SWAP) {
                need_swapped_by(m, xg, t);
                continue;
            }
            int32_t tx = x < g->buf ? t : t - 1, *xat = &rb->at[xg - s->g];
            if (depth >= REBUILD_MAX_DEPTH || tx <= xg->from)
                return 1;
            if (*xat <= tx)
                continue;
            *xat = tx;
            if (rebuild_inputs(rb, xg, depth + 1)) {
                xg->dec = OOC_SWAP;
                xg->in_at = xg->to - 1 > xg->from ? xg->to - 1 : xg->from + 1;
                need_swapped_by(m, xg, tx);
            }
        }
    }
    return 0;
}

static int emit_gap(ooc_plan_t *pl, const ooc_model_t *m, const gap_t *g, int32_t rebuild_at) {
    int32_t n = (int32_t)m->n;
    int rc = 0;
    if (g->dec == OOC_SWAP) {
        rc |= ooc_plan_add(pl, g->from, OOC_AFTER, OOC_ACT_SWAPOUT, g->buf, NULL, 0);
        if (g->to < n) {
            rc |= ooc_plan_add(pl, g->in_at, OOC_BEFORE, OOC_ACT_SWAPIN, g->buf, NULL, 0);
            rc |= ooc_plan_add(pl, g->to, OOC_BEFORE, OOC_ACT_WAIT, g->buf, NULL, 0);
        } else if (g->in_at < n) {
            rc |= ooc_plan_add(pl, g->in_at, OOC_BEFORE, OOC_ACT_SWAPIN, g->buf, NULL, 0);
        } else {
            pl->start_host[g->buf] = 1;
            rc |= ooc_plan_add(pl, g->in_at - n, OOC_BEFORE, OOC_ACT_SWAPIN, g->buf, NULL, 0);
            rc |= ooc_plan_add(pl, g->to - n, OOC_BEFORE, OOC_ACT_WAIT, g->buf, NULL, 0);
        }
    } else if (g->dec == OOC_RECOMPUTE) {
        const ooc_buffer_t *bf = &m->prof->bufs[g->buf];
        rc |= ooc_plan_add(pl, g->from, OOC_AFTER, OOC_ACT_DROP, g->buf, NULL, 0);
        rc |= ooc_plan_add(pl, rebuild_at, OOC_BEFORE, OOC_ACT_RECOMPUTE, g->buf,
                           m->prof->prods + bf->prod_off, bf->nprod);
    }
    return rc ? OOC_ENOMEM : 0;
}

/* Keeps, of the waits of a finalized plan, only the first after each swap-in (the one before the
 * buffer's first use, or before a recompute reading it if that comes first): a second wait for
 * the same copy, or two waits at one op (a recompute input that is also the op's), would be
 * redundant. Actions stay in replay order. Returns 0 or OOC_ENOMEM. */
static int one_wait_per_swapin(ooc_plan_t *pl) {
    uint8_t *pending = calloc(pl->nbufs ? pl->nbufs : 1, 1);
    if (!pending)
        return OOC_ENOMEM;
    uint32_t w = 0;
    for (uint32_t i = 0; i < pl->nacts; i++) {
        const ooc_action_t *a = &pl->acts[i];
        if (a->kind == OOC_ACT_SWAPIN)
            pending[a->buf] = 1;
        if (a->kind == OOC_ACT_WAIT) {
            if (!pending[a->buf])
                continue;
            pending[a->buf] = 0;
        }
        pl->acts[w++] = *a;
    }
    pl->nacts = w;
    free(pending);
    return 0;
}

/* Orders the swap-ins issued before one op by when their buffers are needed (the op of the wait
 * that follows each, then buffer id; one with no wait this iteration last): the host-to-device
 * engine runs them first come, first served, so the copy needed first is started first. Runs on
 * a finalized plan after one_wait_per_swapin; ooc_plan_finalize keeps this order (and the plan
 * file records it). Returns 0 or OOC_ENOMEM. */
static int swapins_by_need(ooc_plan_t *pl) {
    int32_t *need = malloc((pl->nacts ? pl->nacts : 1) * sizeof *need);
    uint32_t *pending = malloc((pl->nbufs ? pl->nbufs : 1) * sizeof *pending);
    if (!need || !pending) {
        free(need);
        free(pending);
        return OOC_ENOMEM;
    }
    for (uint32_t b = 0; b < pl->nbufs; b++)
        pending[b] = UINT32_MAX;
    for (uint32_t i = 0; i < pl->nacts; i++) {
        const ooc_action_t *a = &pl->acts[i];
        need[i] = INT32_MAX;
        if (a->kind == OOC_ACT_SWAPIN)
            pending[a->buf] = i;
        else if (a->kind == OOC_ACT_WAIT && pending[a->buf] != UINT32_MAX) {
            need[pending[a->buf]] = a->op;
            pending[a->buf] = UINT32_MAX;
        }
    }
    for (uint32_t s = 0, e; s < pl->nacts; s = e) {
        const ooc_action_t *a = &pl->acts[s];
        for (e = s + 1; e < pl->nacts && pl->acts[e].op == a->op && pl->acts[e].when == a->when &&
                        pl->acts[e].kind == a->kind;
             e++)
            ;
        if (a->kind != OOC_ACT_SWAPIN)
            continue;
        for (uint32_t i = s + 1; i < e; i++) { /* insertion sort: buckets are small */
            ooc_action_t x = pl->acts[i];
            int32_t nx = need[i];
            uint32_t j = i;
            while (j > s &&
                   (need[j - 1] > nx || (need[j - 1] == nx && pl->acts[j - 1].buf > x.buf))) {
                pl->acts[j] = pl->acts[j - 1];
                need[j] = need[j - 1];
                j--;
            }
            pl->acts[j] = x;
            need[j] = nx;
        }
    }
    free(need);
    free(pending);
    return 0;
}

typedef struct {
    int32_t need, op, buf;
    uint32_t idx;
} issue_t;

static int issue_cmp(const void *x, const void *y) {
    const issue_t *a = x, *b = y;
    if (a->need != b->need)
        return a->need < b->need ? -1 : 1;
    if (a->op != b->op)
        return a->op < b->op ? -1 : 1;
    return a->buf < b->buf ? -1 : a->buf > b->buf;
}

int sched_issue_in_need_order(const ooc_plan_t *in, ooc_plan_t **out) {
    *out = NULL;
    ooc_plan_t *pl =
        ooc_plan_new(in->policy, in->nops, in->nbufs, in->budget_bytes, in->chunk_bytes);
    issue_t *v = malloc((in->nacts ? in->nacts : 1) * sizeof *v);
    uint32_t *pending = malloc((in->nbufs ? in->nbufs : 1) * sizeof *pending);
    int rc = pl && v && pending ? 0 : OOC_ENOMEM;
    uint32_t nv = 0;
    if (!rc) {
        memcpy(pl->start_host, in->start_host, in->nbufs);
        for (uint32_t b = 0; b < in->nbufs; b++)
            pending[b] = UINT32_MAX;
        for (uint32_t i = 0; i < in->nacts; i++) {
            const ooc_action_t *a = &in->acts[i];
            if (a->kind == OOC_ACT_SWAPIN)
                pending[a->buf] = i;
            else if (a->kind == OOC_ACT_WAIT && pending[a->buf] != UINT32_MAX) {
                uint32_t k = pending[a->buf];
                v[nv++] = (issue_t){a->op, in->acts[k].op, a->buf, k};
                pending[a->buf] = UINT32_MAX;
            }
        }
        qsort(v, nv, sizeof *v, issue_cmp);
    }
    int32_t *at = rc ? NULL : malloc((in->nacts ? in->nacts : 1) * sizeof *at);
    if (!rc && !at)
        rc = OOC_ENOMEM;
    if (!rc) {
        for (uint32_t i = 0; i < in->nacts; i++)
            at[i] = in->acts[i].op;
        int32_t run = -1;
        for (uint32_t k = 0; k < nv; k++) {
            if (v[k].op < run)
                at[v[k].idx] = run;
            else
                run = v[k].op;
        }
        for (uint32_t i = 0; i < in->nacts && !rc; i++) {
            const ooc_action_t *a = &in->acts[i];
            rc = ooc_plan_add(pl, at[i], (ooc_when_t)a->when, (ooc_act_kind_t)a->kind, a->buf,
                              in->via + a->via_off, a->nvia);
        }
    }
    free(at);
    free(v);
    free(pending);
    if (!rc) {
        ooc_plan_finalize(pl);
        rc = swapins_by_need(pl);
    }
    if (rc) {
        ooc_plan_free(pl);
        return rc;
    }
    *out = pl;
    return 0;
}

int sched_plan(const sched_t *s0, const char *policy, uint64_t budget, ooc_plan_t **out) {
    const ooc_model_t *m = s0->m;
    const ooc_profile_t *p = m->prof;
    *out = NULL;
    sched_t s;
    int rc = sched_copy(&s, s0);
    if (rc)
        return rc;
    /* recomputes need their inputs: bring swapped inputs in first, rebuild recomputed ones
     * first, or give up the recompute */
    rebuild_t rb = {&s, malloc((s.ng ? s.ng : 1) * sizeof *rb.at)};
    if (!rb.at) {
        sched_free(&s);
        return OOC_ENOMEM;
    }
    for (uint32_t k = 0; k < s.ng; k++)
        rb.at[k] = s.g[k].to;
    for (uint32_t k = 0; k < s.ng; k++) {
        gap_t *g = &s.g[k];
        if (g->dec == OOC_RECOMPUTE && rebuild_inputs(&rb, g, 0)) {
            g->dec = OOC_SWAP;
            g->in_at = g->to - 1 > g->from ? g->to - 1 : g->from + 1;
            if (g->in_at > rb.at[k])
                g->in_at = rb.at[k];
        }
    }
    ooc_plan_t *pl = ooc_plan_new(policy, m->n, m->nb, budget, m->chunk_bytes);
    if (!pl) {
        free(rb.at);
        sched_free(&s);
        return OOC_ENOMEM;
    }
    for (uint32_t k = 0; k < s.ng && !rc; k++)
        rc = emit_gap(pl, m, &s.g[k], rb.at[k]);
    for (uint32_t k = 0; k < s.ng && !rc; k++) {
        const gap_t *g = &s.g[k];
        if (g->dec != OOC_RECOMPUTE)
            continue;
        const ooc_buffer_t *bf = &p->bufs[g->buf];
        for (uint32_t j = 0; j < bf->nprod && !rc; j++) {
            const ooc_op_t *o = &p->ops[p->prods[bf->prod_off + j]];
            for (uint32_t r = 0; r < o->nref && !rc; r++) {
                int32_t x = p->refs[o->ref_off + r].buf;
                gap_t *xg = x == g->buf ? NULL : sched_gap_at(&s, x, rb.at[k]);
                if (xg && xg->dec == OOC_SWAP)
                    rc = ooc_plan_add(pl, rb.at[k], OOC_BEFORE, OOC_ACT_WAIT, x, NULL, 0);
            }
        }
    }
    free(rb.at);
    for (uint32_t b = 0; b < m->nb && !rc; b++) {
        const ooc_buffer_t *bf = &p->bufs[b];
        if (m->nuse[b] == 0) {
            if (bf->persistent)
                pl->start_host[b] = 1;
            continue;
        }
        /* A buffer dead after its last use but freed by the program only later (a gradient
         * after the optimizer step, kept until the next zero_grad) holds its memory until then.
         * It is swapped out, not dropped: the shim never discards bytes the program may still
         * read (a program that reads it anyway, unlike the recorded iterations, must get them),
         * so the copy is what replay costs and what the simulator charges. One freed right after
         * its last use needs nothing, nor does any under keep_dead (the plan that keeps
         * everything resident, which auto tries first). */
        int32_t last = m->uses[m->use_off[b] + m->nuse[b] - 1];
        if (!s0->keep_dead && !bf->persistent && bf->free_idx > last + 1)
            rc = ooc_plan_add(pl, last, OOC_AFTER, OOC_ACT_SWAPOUT, (int32_t)b, NULL, 0);
    }
    sched_free(&s);
    if (rc) {
        ooc_plan_free(pl);
        return rc;
    }
    ooc_plan_finalize(pl);
    rc = one_wait_per_swapin(pl);
    if (!rc)
        rc = swapins_by_need(pl);
    if (rc) {
        ooc_plan_free(pl);
        return rc;
    }
    *out = pl;
    return 0;
}

/* ---- the memo of simulated schedules ------------------------------------------------------------
 */

typedef struct {
    uint64_t h[2];
    ooc_sim_result_t r; /* without per-op or per-buffer arrays (no options) */
} memo_ent_t;

struct sched_memo {
    memo_ent_t *e;
    size_t n, cap;
};

int sched_memo_new(sched_memo_t **out) {
    *out = calloc(1, sizeof **out);
    return *out ? 0 : OOC_ENOMEM;
}

void sched_memo_free(sched_memo_t *mm) {
    if (!mm)
        return;
    free(mm->e);
    free(mm);
}

/* splitmix64's finaliser: a well-mixed 64-bit function of x. */
static uint64_t mix64(uint64_t x) {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* Two independent hashes of what sched_plan reads that a policy changes (the model and the gaps'
 * buffers and ops are fixed for a memo): every gap's decision and swap-in op, and the budget. */
static void sched_hash(const sched_t *s, uint64_t budget, uint64_t h[2]) {
    uint64_t a = mix64(budget ^ 0x9e3779b97f4a7c15ull), b = mix64(budget + 0x632be59bd9b4e019ull);
    for (uint32_t k = 0; k < s->ng; k++) {
        uint64_t v = ((uint64_t)s->g[k].dec << 32) | (uint32_t)s->g[k].in_at;
        a = mix64(a ^ v) + k;
        b = mix64(b + v * 0xd6e8feb86659fd93ull) ^ k;
    }
    h[0] = a;
    h[1] = b;
}

int sched_eval(const sched_t *s, uint64_t budget, const ooc_sim_opts_t *o, ooc_sim_result_t *r) {
    sched_memo_t *mm = o ? NULL : s->memo;
    uint64_t h[2] = {0, 0};
    if (mm) {
        sched_hash(s, budget, h);
        for (size_t i = 0; i < mm->n; i++)
            if (mm->e[i].h[0] == h[0] && mm->e[i].h[1] == h[1]) {
                *r = mm->e[i].r;
                return 0;
            }
    }
    ooc_plan_t *pl;
    int rc = sched_plan(s, "eval", budget, &pl);
    if (rc) {
        memset(r, 0, sizeof *r);
        return rc;
    }
    rc = ooc_sim_run(s->m, pl, o, r);
    ooc_plan_free(pl);
    if (rc || !mm)
        return rc;
    /* A full memo only costs simulations: keep going without it. */
    if (ooc_grow(&mm->e, &mm->cap, mm->n + 1, sizeof *mm->e, 64))
        return 0;
    mm->e[mm->n].h[0] = h[0];
    mm->e[mm->n].h[1] = h[1];
    mm->e[mm->n++].r = *r;
    return 0;
}

/* ---- memory-aware swap-in placement ------------------------------------------------------------
 */

/* A segment tree over ops: range add, and "the last index in [lo, hi] whose value exceeds v".
 * Laid out bottom-up over `size` leaves (a power of two, the leaves past n hold a value no query
 * exceeds): node i has children 2i and 2i + 1; mx[i] is the largest value below i counting the
 * adds of i and its descendants, lz[i] (internal nodes) an add to i's whole range not yet in its
 * descendants. Adds are iterative (no recursion: placing swap-ins is on every candidate's path). */
typedef struct {
    int64_t *mx, *lz;
    int32_t n, size;
} seg_t;

#define SEG_NONE (INT64_MIN / 4) /* below any value: padding leaves */

/* Adds v to node i's whole range. */
static void seg_apply(seg_t *t, int32_t i, int64_t v) {
    t->mx[i] += v;
    if (i < t->size)
        t->lz[i] += v;
}

/* Recomputes node i from its children. */
static void seg_pull(seg_t *t, int32_t i) {
    int64_t a = t->mx[2 * i], b = t->mx[2 * i + 1];
    t->mx[i] = (a > b ? a : b) + t->lz[i];
}

/* Adds v over [lo, hi] (0 <= lo <= hi < n). */
static void seg_add(seg_t *t, int32_t lo, int32_t hi, int64_t v) {
    int32_t l = lo + t->size, r = hi + t->size + 1;
    int32_t l0 = l, r0 = r - 1;
    while (l < r) {
        if (l & 1)
            seg_apply(t, l++, v);
        if (r & 1)
            seg_apply(t, --r, v);
        l >>= 1;
        r >>= 1;
    }
    /* the ancestors of both ends (leaves, so at the same depth), once where they meet */
    for (l0 >>= 1, r0 >>= 1; l0 >= 1; l0 >>= 1, r0 >>= 1) {
        seg_pull(t, l0);
        if (r0 != l0)
            seg_pull(t, r0);
    }
}

/* Largest index i in [lo, hi] with value(i) > v, below node `node` covering [l, r]; -1 when
 * none. `acc` carries the pending adds of the node's ancestors. */
static int32_t seg_last_above(const seg_t *t, int32_t node, int32_t l, int32_t r, int32_t lo,
                              int32_t hi, int64_t v, int64_t acc) {
    if (hi < l || r < lo || t->mx[node] + acc <= v)
        return -1;
    if (l == r)
        return l;
    int32_t mid = l + (r - l) / 2;
    acc += t->lz[node];
    int32_t x = seg_last_above(t, 2 * node + 1, mid + 1, r, lo, hi, v, acc);
    if (x >= 0)
        return x;
    return seg_last_above(t, 2 * node, l, mid, lo, hi, v, acc);
}

/* The same over the whole tree. */
static int32_t seg_last(const seg_t *t, int32_t lo, int32_t hi, int64_t v) {
    return seg_last_above(t, 1, 0, t->size - 1, lo, hi, v, 0);
}

static void add_range(seg_t *t, int32_t lo, int32_t hi, int64_t v) {
    /* [lo, hi] on the cyclic axis; hi may exceed n - 1 */
    int32_t n = t->n;
    if (hi < lo)
        return;
    if (hi - lo + 1 >= n) {
        seg_add(t, 0, n - 1, v);
        return;
    }
    int32_t a = lo % n, b = hi % n;
    if (a <= b) {
        seg_add(t, a, b, v);
    } else {
        seg_add(t, a, n - 1, v);
        seg_add(t, 0, b, v);
    }
}

/* Adds v over [lo, hi] of the cyclic axis into a difference array of n + 1 entries. */
static void diff_range(int64_t *d, int32_t n, int32_t lo, int32_t hi, int64_t v) {
    if (hi < lo)
        return;
    if (hi - lo + 1 >= n) {
        d[0] += v;
        d[n] -= v;
        return;
    }
    int32_t a = lo % n, b = hi % n;
    if (a <= b) {
        d[a] += v;
        d[b + 1] -= v;
    } else {
        d[a] += v;
        d[n] -= v;
        d[0] += v;
        d[b + 1] -= v;
    }
}

/* Builds the tree from a difference array (turned into values in place). */
static void seg_build(seg_t *t, int64_t *d) {
    for (int32_t i = 1; i < t->n; i++)
        d[i] += d[i - 1];
    for (int32_t i = 0; i < t->size; i++)
        t->mx[t->size + i] = i < t->n ? d[i] : SEG_NONE;
    for (int32_t i = t->size - 1; i >= 1; i--) {
        int64_t a = t->mx[2 * i], b = t->mx[2 * i + 1];
        t->mx[i] = a > b ? a : b;
        t->lz[i] = 0;
    }
}

static int gap_cmp_to(const void *x, const void *y) {
    const gap_t *a = *(const gap_t *const *)x, *b = *(const gap_t *const *)y;
    if (a->in_at != b->in_at) /* the latest op it may come back at */
        return a->in_at < b->in_at ? -1 : 1;
    return a->buf < b->buf ? -1 : a->buf > b->buf;
}

int sched_place_swapins(sched_t *s, uint64_t budget) {
    const ooc_model_t *m = s->m;
    const ooc_profile_t *p = m->prof;
    int32_t n = (int32_t)m->n;
    if (n == 0)
        return 0;
    int32_t size = 1;
    while (size < n)
        size *= 2;
    seg_t t = {malloc(2 * (size_t)size * sizeof(int64_t)), malloc((size_t)size * sizeof(int64_t)),
               n, size};
    gap_t **sw = malloc((s->ng ? s->ng : 1) * sizeof *sw);
    int32_t *need = malloc((s->ng ? s->ng : 1) * sizeof *need);
    if (!t.mx || !t.lz || !sw || !need) {
        free(t.mx);
        free(t.lz);
        free(sw);
        free(need);
        return OOC_ENOMEM;
    }
    /* a swapped input of a recompute is back before the recompute, not only before its use */
    sched_input_needs(s, need);
    uint32_t nsw = 0;
    int64_t *d = calloc((size_t)n + 1, sizeof *d);
    if (!d) {
        free(t.mx);
        free(t.lz);
        free(sw);
        free(need);
        return OOC_ENOMEM;
    }
    /* residency without the swapped gaps' incoming stretches, as a difference array */
    for (uint32_t b = 0; b < m->nb; b++) {
        if (m->nuse[b] == 0)
            continue;
        const ooc_buffer_t *bf = &p->bufs[b];
        const int32_t *u = m->uses + m->use_off[b];
        int64_t fp = (int64_t)m->fp[b];
        int32_t first = bf->alloc_idx < 0 && !bf->persistent ? 0 : u[0];
        int32_t last = u[m->nuse[b] - 1];
        if (bf->persistent) {
            first = 0;
            last = n - 1;
        }
        diff_range(d, n, first, last, fp);
        for (uint32_t k = s->gap_off[b]; k < s->gap_off[b + 1]; k++) {
            gap_t *g = &s->g[k];
            if (g->dec == OOC_KEEP)
                continue;
            int32_t to = g->to < need[k] ? g->to : need[k];
            diff_range(d, n, g->from + 1, to - 1, -fp); /* out during the gap */
            if (g->dec == OOC_SWAP) {
                g->in_at = to; /* the latest it may come (read below) */
                sw[nsw++] = g;
            }
        }
    }
    seg_build(&t, d);
    free(d);
    if (nsw)
        qsort(sw, nsw, sizeof *sw, gap_cmp_to);
    for (uint32_t i = 0; i < nsw; i++) {
        gap_t *g = sw[i];
        int64_t thr = (int64_t)budget - (int64_t)m->fp[g->buf];
        int32_t to = g->in_at, lo = g->from + 1, hi = to - 1, at = lo;
        if (hi >= lo) {
            int32_t v = -1;
            if (hi >= n) {
                /* the next iteration's part first, then this one's tail */
                v = seg_last(&t, 0, hi - n, thr);
                if (v >= 0)
                    v += n;
                else if (lo <= n - 1)
                    v = seg_last(&t, lo, n - 1, thr);
            } else {
                v = seg_last(&t, lo, hi, thr);
            }
            at = v >= 0 ? v + 1 : lo;
        }
        g->in_at = at;
        add_range(&t, at, to - 1, (int64_t)m->fp[g->buf]);
    }
    free(t.mx);
    free(t.lz);
    free(sw);
    free(need);
    return 0;
}
