/* SPDX-License-Identifier: MIT */
/* check_iterdet.c: the iteration detector (shim/iterdet.c), through its public interface only.
 *
 * Streams are built here the way a training loop issues them: a "world" hands out buffer serial
 * numbers and allocation op indices, an MLP generator issues forward, loss, backward and optimizer
 * ops with fresh activations and gradients each iteration, and random iteration templates stress
 * the candidate search. Every event the detector reports is logged and checked for consistency
 * (an ITER names the iteration that just ended). Random tests print their seed (tu_seed) and
 * replay it from OOC_TEST_SEED. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "iterdet.h"
#include "testutil.h"

Suite *suite_iterdet(void);

/* ---- the world: buffers, ops, and the events seen ----------------------------------------- */

#define LOG_MAX 256

typedef struct world {
    ooc_iterdet_t *d;
    uint64_t serial;
    ooc_iterdet_event_t ev; /* the last event */
    int nfound, nbroken;
    int64_t niter;
    int64_t found_at[LOG_MAX];
    ooc_iterdet_event_t found[LOG_MAX];
    int64_t broken_at[LOG_MAX];
    ooc_iterdet_event_t broken[LOG_MAX];
    int64_t detected_events; /* events with source DETECTED after the first marker */
    int marked;
} world_t;

typedef ooc_iterdet_ref_t ref_t;

static void w_init(world_t *w, const ooc_iterdet_opts_t *o) {
    memset(w, 0, sizeof *w);
    ck_assert_int_eq(ooc_iterdet_new(o, &w->d), 0);
    ck_assert_ptr_nonnull(w->d);
}

static void w_fini(world_t *w) {
    ooc_iterdet_free(w->d);
    w->d = NULL;
}

/* A buffer allocated before the first op (weights uploaded at start-up). */
static ref_t w_pre(world_t *w) {
    return (ref_t){++w->serial, -1};
}

/* A buffer allocated now, between the last op fed and the next. */
static ref_t w_new(world_t *w) {
    return (ref_t){++w->serial, ooc_iterdet_ops(w->d) - 1};
}

/* Logs the event of a call made at `at` (an op index, or a marker's position) and checks that
 * it is consistent. */
static void w_note(world_t *w, int64_t at, int is_mark) {
    const ooc_iterdet_event_t *e = &w->ev;
    if (w->marked && e->source == OOC_ITERDET_DETECTED)
        w->detected_events++;
    if (e->flags & OOC_ITERDET_FOUND) {
        ck_assert_msg(e->confirmed && e->iters >= 2, "FOUND at %lld with %lld iterations",
                      (long long)at, (long long)e->iters);
        if (w->nfound < LOG_MAX) {
            w->found_at[w->nfound] = at;
            w->found[w->nfound] = *e;
        }
        w->nfound++;
    }
    if (e->flags & OOC_ITERDET_BROKEN) {
        ck_assert_int_gt(e->broken_period, 0);
        ck_assert_int_eq(e->broken_op, at);
        if (w->nbroken < LOG_MAX) {
            w->broken_at[w->nbroken] = at;
            w->broken[w->nbroken] = *e;
        }
        w->nbroken++;
    }
    if (e->flags & OOC_ITERDET_ITER) {
        w->niter++;
        ck_assert_int_gt(e->period, 0);
        ck_assert_int_eq(e->last_op + e->period, is_mark ? at : at + 1);
    }
    if (e->period > 0) {
        ck_assert_int_ge(e->iters, 1);
        ck_assert_int_eq(e->last_op, e->first_op + (e->iters - 1) * e->period);
        ck_assert_int_ge(e->first_op, 1);
    } else {
        ck_assert_int_eq(e->iters, 0);
        ck_assert_int_eq(e->first_op, -1);
    }
}

static void w_op(world_t *w, uint64_t sig, const ref_t *refs, unsigned n) {
    int64_t at = ooc_iterdet_ops(w->d);
    ck_assert_int_eq(ooc_iterdet_op(w->d, sig, refs, n, &w->ev), 0);
    ck_assert_int_eq(ooc_iterdet_ops(w->d), at + 1);
    w_note(w, at, 0);
}

static void w_mark(world_t *w) {
    int64_t at = ooc_iterdet_ops(w->d);
    ck_assert_int_eq(ooc_iterdet_mark(w->d, &w->ev), 0);
    w->marked = 1;
    w_note(w, at, 1);
}

#define OPR(w, sig, ...)                                                                           \
    w_op((w), (sig), (ref_t[]){__VA_ARGS__}, sizeof((ref_t[]){__VA_ARGS__}) / sizeof(ref_t))
#define OP0(w, sig) w_op((w), (sig), NULL, 0)

static uint64_t mix(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

/* A signature: function `kind` with one size-like parameter. */
static uint64_t sg(uint64_t kind, uint64_t size) {
    return mix(kind * 1000003 + size);
}

static uint64_t rng_next(uint64_t *s) {
    *s += 0x9e3779b97f4a7c15ULL;
    return mix(*s);
}

static unsigned rnd(uint64_t *s, unsigned n) {
    return (unsigned)(rng_next(s) % n);
}

/* ---- an MLP training loop ------------------------------------------------------------------ */

enum {
    K_COPY = 1,
    K_TRIAL,
    K_MM = 10,
    K_BIAS,
    K_RELU,
    K_DROP,
    K_LOSS,
    K_LGRAD,
    K_DDROP,
    K_RGRAD,
    K_WGRAD,
    K_BGRAD,
    K_DGRAD,
    K_FILL,
    K_SGD,
};

#define MLP_LAYERS_MAX 64
#define MLP_ITERS_MAX  64

typedef struct mlp {
    int layers;
    int warmup_differs; /* iteration 0 autotunes: three extra trial ops with workspaces */
    int lazy_state;     /* momentum is created by the first optimizer step, with a fill op */
    int functional;     /* every update allocates the new weights (a functional framework) */
    int arena;          /* every op references one buffer (a framework's own arena) */
    int prefetch;       /* the next batch is copied in at the end of each iteration */
    ref_t w[MLP_LAYERS_MAX], b[MLP_LAYERS_MAX], mw[MLP_LAYERS_MAX], mb[MLP_LAYERS_MAX];
    int have_state;
    ref_t one, next_x;
    int have_next;
    int iters;
    int64_t start[MLP_ITERS_MAX + 1]; /* op index at which each iteration started */
} mlp_t;

static void mlp_init(world_t *w, mlp_t *m) {
    ck_assert_int_le(m->layers, MLP_LAYERS_MAX);
    for (int i = 0; i < m->layers; i++) {
        m->w[i] = w_pre(w);
        m->b[i] = w_pre(w);
        if (!m->lazy_state) {
            m->mw[i] = w_pre(w);
            m->mb[i] = w_pre(w);
        }
    }
    m->have_state = !m->lazy_state;
    m->one = w_pre(w);
}

/* Issues one op of the MLP, through the arena when there is one. */
static void mop(world_t *w, const mlp_t *m, uint64_t sig, ref_t *refs, unsigned n) {
    if (m->arena)
        for (unsigned i = 0; i < n; i++)
            refs[i] = m->one;
    w_op(w, sig, refs, n);
}

#define MOP(w, m, sig, ...)                                                                        \
    mop((w), (m), (sig), (ref_t[]){__VA_ARGS__}, sizeof((ref_t[]){__VA_ARGS__}) / sizeof(ref_t))

static void sgd(world_t *w, mlp_t *m, uint64_t size, ref_t *param, ref_t grad, ref_t *mom) {
    if (!m->have_state) {
        *mom = w_new(w);
        MOP(w, m, sg(K_FILL, size), *mom);
    }
    if (m->functional) {
        ref_t next = w_new(w);
        MOP(w, m, sg(K_SGD, size), *param, grad, *mom, next);
        *param = next;
    } else {
        MOP(w, m, sg(K_SGD, size), *param, grad, *mom);
    }
}

/* One training iteration with `batch` samples. */
static void mlp_iter(world_t *w, mlp_t *m, uint64_t batch) {
    ck_assert_int_lt(m->iters, MLP_ITERS_MAX);
    int idx = m->iters++;
    m->start[idx] = ooc_iterdet_ops(w->d);
    ref_t x;
    if (m->prefetch && m->have_next) {
        x = m->next_x;
    } else {
        x = w_new(w);
        MOP(w, m, sg(K_COPY, batch), x);
    }
    if (idx == 0 && m->warmup_differs)
        for (int k = 0; k < 3; k++) {
            ref_t ws = w_new(w);
            MOP(w, m, sg(K_TRIAL + (uint64_t)k, batch), x, ws);
        }
    ref_t xin[MLP_LAYERS_MAX], y[MLP_LAYERS_MAX], mask[MLP_LAYERS_MAX];
    for (int i = 0; i < m->layers; i++) {
        xin[i] = x;
        y[i] = w_new(w);
        MOP(w, m, sg(K_MM, batch), x, m->w[i], y[i]);
        MOP(w, m, sg(K_BIAS, batch), y[i], m->b[i]);
        ref_t z = w_new(w);
        MOP(w, m, sg(K_RELU, batch), y[i], z);
        mask[i] = w_new(w);
        MOP(w, m, sg(K_DROP, batch), z, mask[i]);
        x = z;
    }
    ref_t loss = w_new(w);
    MOP(w, m, sg(K_LOSS, batch), x, loss);
    ref_t dz = w_new(w);
    MOP(w, m, sg(K_LGRAD, batch), loss, x, dz);
    ref_t dw[MLP_LAYERS_MAX], db[MLP_LAYERS_MAX];
    for (int i = m->layers - 1; i >= 0; i--) {
        ref_t dd = w_new(w);
        MOP(w, m, sg(K_DDROP, batch), dz, mask[i], dd);
        ref_t dy = w_new(w);
        MOP(w, m, sg(K_RGRAD, batch), dd, y[i], dy);
        dw[i] = w_new(w);
        MOP(w, m, sg(K_WGRAD, batch), xin[i], dy, dw[i]);
        db[i] = w_new(w);
        MOP(w, m, sg(K_BGRAD, batch), dy, db[i]);
        if (i > 0) {
            dz = w_new(w);
            MOP(w, m, sg(K_DGRAD, batch), dy, m->w[i], dz);
        }
    }
    for (int i = 0; i < m->layers; i++) {
        sgd(w, m, 1, &m->w[i], dw[i], &m->mw[i]);
        sgd(w, m, 2, &m->b[i], db[i], &m->mb[i]);
    }
    m->have_state = 1;
    if (m->prefetch) {
        m->next_x = w_new(w);
        MOP(w, m, sg(K_COPY, batch), m->next_x);
        m->have_next = 1;
    }
    m->start[idx + 1] = ooc_iterdet_ops(w->d);
}

/* The steady iteration's length, in ops (iterations 1 and 2 are steady in every variant). */
static int64_t mlp_period(const mlp_t *m) {
    return m->start[2] - m->start[1];
}

/* ---- a simple loop ------------------------------------------------------------------------- */

START_TEST(test_simple_loop_of_28_ops_is_found_after_two_iterations_past_the_first) {
    world_t w;
    w_init(&w, NULL);
    for (int it = 0; it < 20; it++) {
        for (int k = 0; k < 28; k++) {
            OP0(&w, sg(1, (uint64_t)(k % 10)));
            int64_t at = it * 28 + k;
            if (at < 83)
                ck_assert_msg(w.nfound == 0, "found at op %lld", (long long)at);
        }
    }
    ck_assert_int_eq(w.nfound, 1);
    ck_assert_int_eq(w.found_at[0], 83);
    ck_assert_int_eq(w.found[0].period, 28);
    ck_assert_int_eq(w.found[0].first_op, 28);
    ck_assert_int_eq(w.found[0].iters, 2);
    ck_assert_int_eq(w.found[0].source, OOC_ITERDET_DETECTED);
    ck_assert(w.found[0].flags & OOC_ITERDET_ITER);
    ck_assert_int_eq(w.nbroken, 0);
    ck_assert_int_eq(w.niter, 18); /* iterations 2..19 each completed one */
    ooc_iterdet_event_t st;
    ck_assert_int_eq(ooc_iterdet_state(w.d, &st), 0);
    ck_assert_int_eq(st.flags, 0);
    ck_assert_int_eq(st.period, 28);
    ck_assert_int_eq(st.iters, 19);
    ck_assert_int_eq(st.last_op, 19 * 28);
    w_fini(&w);
}
END_TEST

/* ---- the MLP ------------------------------------------------------------------------------- */

/* Runs `iters` iterations of m and checks that the period is found exactly once, at the end of
 * iteration `found_iter`, with its first counted iteration `first_iter`, and never breaks. */
static void expect_mlp(world_t *w, mlp_t *m, int iters, int found_iter, int first_iter) {
    for (int it = 0; it < iters; it++) {
        mlp_iter(w, m, 32);
        if (it < found_iter)
            ck_assert_msg(w->nfound == 0, "found period %lld in iteration %d",
                          (long long)w->found[0].period, it);
    }
    int64_t p = mlp_period(m);
    ck_assert_msg(w->nfound == 1, "%d FOUND events (first: period %lld at op %lld), want 1",
                  w->nfound, (long long)w->found[0].period, (long long)w->found_at[0]);
    ck_assert_int_eq(w->found[0].period, p);
    ck_assert_int_eq(w->found_at[0], m->start[found_iter + 1] - 1);
    ck_assert_int_eq(w->found[0].first_op, m->start[first_iter]);
    ck_assert_int_eq(w->nbroken, 0);
    ck_assert_int_eq(w->ev.period, p);
    ck_assert_int_eq(w->ev.iters, iters - first_iter);
    ck_assert_int_eq(w->ev.last_op, m->start[iters - 1]);
}

START_TEST(test_mlp_of_12_identical_layers_finds_the_iteration_not_a_layer) {
    world_t w;
    w_init(&w, NULL);
    mlp_t m = {.layers = 12};
    mlp_init(&w, &m);
    expect_mlp(&w, &m, 8, 2, 1);
    /* The forward pass repeats every 4 ops twelve times, the optimizer every 2 ops. */
    ck_assert_int_eq(mlp_period(&m), 1 + 12 * 4 + 2 + 12 * 5 - 1 + 12 * 2);
    w_fini(&w);
}
END_TEST

START_TEST(test_mlp_with_a_differing_first_iteration_counts_from_the_second) {
    world_t w;
    w_init(&w, NULL);
    mlp_t m = {.layers = 12, .warmup_differs = 1, .lazy_state = 1};
    mlp_init(&w, &m);
    expect_mlp(&w, &m, 8, 2, 1);
    ck_assert_int_eq(m.start[1] - m.start[0], mlp_period(&m) + 3 + 24);
    w_fini(&w);
}
END_TEST

/* One iteration of 24 ops: an input copy, 20 layers, 3 optimizer steps whose state (*have 0) is
 * created just before its first use, without any extra op. */
static void state_iter(world_t *w, const ref_t *weights, ref_t *state, int *have) {
    ref_t x = w_new(w);
    OPR(w, sg(K_COPY, 32), x);
    for (int i = 0; i < 20; i++) {
        ref_t y = w_new(w);
        OPR(w, sg(K_MM, 32), x, weights[i], y);
        x = y;
    }
    for (int i = 0; i < 3; i++) {
        if (!*have)
            state[i] = w_new(w);
        OPR(w, sg(K_SGD, 1), weights[i], x, state[i]);
    }
    *have = 1;
}

/* Three set-up ops (weight uploads) before the loop. */
static void setup(world_t *w) {
    for (uint64_t k = 0; k < 3; k++) {
        ref_t r = w_pre(w);
        OPR(w, sg(90 + k, 0), r);
    }
}

START_TEST(test_iteration_that_creates_optimizer_state_is_not_counted) {
    /* After the set-up, iteration 0 issues the same ops as the others, but creates the state that
     * later iterations use as the same buffers: it is a warm-up all the same. */
    world_t w;
    w_init(&w, NULL);
    ref_t weights[20], state[3];
    for (int i = 0; i < 20; i++)
        weights[i] = w_pre(&w);
    int have = 0;
    setup(&w);
    int64_t start[8];
    for (int it = 0; it < 7; it++) {
        start[it] = ooc_iterdet_ops(w.d);
        state_iter(&w, weights, state, &have);
    }
    start[7] = ooc_iterdet_ops(w.d);
    ck_assert_int_eq(w.nfound, 1);
    ck_assert_int_eq(w.found[0].period, 24);
    ck_assert_int_eq(w.found[0].first_op, start[1]);
    ck_assert_int_eq(w.found_at[0], start[3] - 1);
    ck_assert_int_eq(w.nbroken, 0);
    w_fini(&w);

    /* The same with markers at the top of each iteration. */
    w_init(&w, NULL);
    for (int i = 0; i < 20; i++)
        weights[i] = w_pre(&w);
    have = 0;
    setup(&w);
    for (int it = 0; it < 4; it++) {
        start[it] = ooc_iterdet_ops(w.d);
        w_mark(&w);
        state_iter(&w, weights, state, &have);
    }
    w_mark(&w);
    ck_assert_int_eq(w.nfound, 1);
    ck_assert_int_eq(w.found[0].first_op, start[1]);
    ck_assert_int_eq(w.found_at[0], start[3]);
    ck_assert_int_eq(w.ev.iters, 3);
    w_fini(&w);
}
END_TEST

START_TEST(test_smaller_last_batch_breaks_the_period_and_finds_nothing_new) {
    world_t w;
    w_init(&w, NULL);
    mlp_t m = {.layers = 12, .warmup_differs = 1, .lazy_state = 1};
    mlp_init(&w, &m);
    for (int it = 0; it < 6; it++)
        mlp_iter(&w, &m, 32);
    ck_assert_int_eq(w.nfound, 1);
    mlp_iter(&w, &m, 7);
    ck_assert_int_eq(w.nbroken, 1);
    ck_assert_int_eq(w.broken_at[0], m.start[6]); /* its first op already differs */
    ck_assert_int_eq(w.broken[0].broken_period, mlp_period(&m));
    ck_assert_int_eq(w.nfound, 1);
    ck_assert_int_eq(w.ev.period, 0);
    ck_assert_int_eq(w.ev.source, OOC_ITERDET_NONE);
    w_fini(&w);
}
END_TEST

START_TEST(test_smaller_batch_that_repeats_is_found_as_a_new_run) {
    world_t w;
    w_init(&w, NULL);
    mlp_t m = {.layers = 12};
    mlp_init(&w, &m);
    for (int it = 0; it < 5; it++)
        mlp_iter(&w, &m, 32);
    for (int it = 5; it < 10; it++)
        mlp_iter(&w, &m, 7);
    ck_assert_int_eq(w.nbroken, 1);
    ck_assert_int_eq(w.broken_at[0], m.start[5]);
    ck_assert_int_eq(w.nfound, 2);
    ck_assert_int_eq(w.found[1].period, mlp_period(&m));
    ck_assert_int_eq(w.found[1].first_op, m.start[5]);
    ck_assert_int_eq(w.found_at[1], m.start[7] - 1);
    w_fini(&w);
}
END_TEST

START_TEST(test_inserted_op_breaks_the_period_which_is_found_again) {
    world_t w;
    w_init(&w, NULL);
    mlp_t m = {.layers = 4};
    mlp_init(&w, &m);
    for (int it = 0; it < 6; it++)
        mlp_iter(&w, &m, 32);
    ck_assert_int_eq(w.nfound, 1);
    int64_t at = ooc_iterdet_ops(w.d);
    ref_t t = w_new(&w);
    OPR(&w, sg(99, 1), t); /* a logging kernel, once */
    ck_assert_int_eq(w.nbroken, 1);
    ck_assert_int_eq(w.broken_at[0], at);
    for (int it = 6; it < 12; it++)
        mlp_iter(&w, &m, 32);
    ck_assert_int_eq(w.nfound, 2);
    ck_assert_int_eq(w.found[1].period, mlp_period(&m));
    ck_assert_int_eq(w.found[1].first_op, m.start[6]);
    ck_assert_int_eq(w.nbroken, 1);
    w_fini(&w);
}
END_TEST

START_TEST(test_weights_reallocated_by_every_update_are_matched_as_temporaries) {
    world_t w;
    w_init(&w, NULL);
    mlp_t m = {.layers = 12, .functional = 1};
    mlp_init(&w, &m);
    expect_mlp(&w, &m, 8, 2, 1);
    w_fini(&w);
}
END_TEST

START_TEST(test_batch_prefetched_one_iteration_ahead_is_matched) {
    world_t w;
    w_init(&w, NULL);
    mlp_t m = {.layers = 6, .prefetch = 1};
    mlp_init(&w, &m);
    for (int it = 0; it < 8; it++)
        mlp_iter(&w, &m, 32);
    ck_assert_int_eq(w.nfound, 1);
    ck_assert_int_eq(w.found[0].period, mlp_period(&m));
    ck_assert_int_le(w.found_at[0], m.start[4]);
    ck_assert_int_eq(w.nbroken, 0);
    w_fini(&w);
}
END_TEST

START_TEST(test_one_buffer_arena_sub_periods_give_way_to_the_iteration) {
    /* Every op references the same buffer, so the 30 identical layers repeat exactly: the
     * documented limit. Sub-periods may be reported while they hold; each breaks, and once the
     * iteration has been seen twice after the first it is found and holds. */
    world_t w;
    w_init(&w, NULL);
    mlp_t m = {.layers = 30, .arena = 1};
    mlp_init(&w, &m);
    for (int it = 0; it < 8; it++)
        mlp_iter(&w, &m, 32);
    int64_t p = mlp_period(&m);
    ck_assert_int_ge(w.nfound, 1);
    ck_assert_int_le(w.nfound, LOG_MAX);
    int last = w.nfound - 1;
    ck_assert_int_eq(w.found[last].period, p);
    ck_assert_int_le(w.found_at[last], m.start[3] - 1);
    for (int i = 0; i < last; i++) {
        ck_assert_int_lt(w.found[i].period, p);
        ck_assert_int_lt(w.found_at[i], w.found_at[last]);
    }
    ck_assert_int_eq(w.nbroken, last); /* each sub-period broke, the iteration did not */
    ck_assert_int_eq(w.ev.period, p);
    w_fini(&w);
}
END_TEST

/* One iteration of an attention block as xfmr issues it: per-iteration buffers, then `heads`
 * GEMMs on views of the same two buffers (a loop body of `body` ops: 1 or 2), then the rest. */
static void attention_iter(world_t *w, const ref_t *wt, int heads, int body) {
    ref_t x = w_new(w);
    OPR(w, sg(20, 1), x, wt[0]);
    ref_t qkv = w_new(w), ws = w_new(w);
    OPR(w, sg(21, 1), x, wt[1], qkv);
    for (int h = 0; h < heads; h++)
        for (int b = 0; b < body; b++)
            OPR(w, sg(22, (uint64_t)b), qkv, ws);
    ref_t o = w_new(w);
    OPR(w, sg(23, 1), ws, o);
    OPR(w, sg(24, 1), o, wt[2]);
    OPR(w, sg(25, 1), wt[0], wt[1], wt[2]);
}

START_TEST(test_loop_body_over_the_same_buffers_is_never_reported) {
    /* 256 turns of a 1- or 2-op body inside each iteration repeat with periods 1, 2, 3, 4, 6
     * ... over the very same buffers: none is an iteration (shorter than min_period, or a
     * multiple of a shorter one). Only the iteration is reported, once. */
    for (int body = 1; body <= 2; body++) {
        world_t w;
        w_init(&w, NULL);
        ref_t wt[3] = {w_pre(&w), w_pre(&w), w_pre(&w)};
        int64_t p = 5 + 256 * body;
        for (int it = 0; it < 5; it++)
            attention_iter(&w, wt, 256, body);
        ck_assert_msg(w.nfound == 1, "body %d: %d FOUND events, first period %lld", body, w.nfound,
                      (long long)w.found[0].period);
        ck_assert_int_eq(w.found[0].period, p);
        ck_assert_int_eq(w.nbroken, 0);
        ck_assert_int_eq(w.ev.period, p);
        w_fini(&w);
    }
}
END_TEST

START_TEST(test_min_period_is_an_option) {
    /* The same stream with min_period 1: the 1-op body is reported (then breaks). */
    ooc_iterdet_opts_t o = {.min_period = 1};
    world_t w;
    w_init(&w, &o);
    ref_t wt[3] = {w_pre(&w), w_pre(&w), w_pre(&w)};
    for (int it = 0; it < 5; it++)
        attention_iter(&w, wt, 256, 1);
    ck_assert_int_ge(w.nfound, 2);
    ck_assert_int_eq(w.found[0].period, 1);
    ck_assert_int_eq(w.ev.period, 5 + 256);
    w_fini(&w);
    o.min_period = -1;
    ooc_iterdet_t *d = NULL;
    ck_assert_int_eq(ooc_iterdet_new(&o, &d), OOC_EINVAL);
}
END_TEST

/* ---- markers ------------------------------------------------------------------------------- */

START_TEST(test_markers_take_precedence_over_detection) {
    /* The user marks every second iteration: the iteration is what the markers say. */
    world_t w;
    w_init(&w, NULL);
    mlp_t m = {.layers = 12};
    mlp_init(&w, &m);
    for (int it = 0; it < 10; it++) {
        if (it % 2 == 0)
            w_mark(&w);
        mlp_iter(&w, &m, 32);
    }
    w_mark(&w);
    int64_t p = mlp_period(&m);
    ck_assert_int_eq(w.detected_events, 0);
    ck_assert_int_eq(w.nfound, 1);
    ck_assert_int_eq(w.found[0].source, OOC_ITERDET_MARKER);
    ck_assert_int_eq(w.found[0].period, 2 * p);
    ck_assert_int_eq(w.found_at[0], m.start[6]);
    ck_assert_int_eq(w.found[0].first_op, m.start[2]); /* [0,2) starts at op 0: the warm-up */
    ck_assert_int_eq(w.ev.iters, 4);                   /* [2,4) [4,6) [6,8) [8,10) */
    ck_assert_int_eq(w.ev.source, OOC_ITERDET_MARKER);
    ck_assert_int_eq(w.niter, 4);
    ck_assert_int_eq(w.nbroken, 0);
    w_fini(&w);
}
END_TEST

START_TEST(test_first_marker_breaks_a_detected_period) {
    world_t w;
    w_init(&w, NULL);
    mlp_t m = {.layers = 4};
    mlp_init(&w, &m);
    for (int it = 0; it < 6; it++)
        mlp_iter(&w, &m, 32);
    ck_assert_int_eq(w.nfound, 1);
    ck_assert_int_eq(w.ev.source, OOC_ITERDET_DETECTED);
    w_mark(&w);
    ck_assert_int_eq(w.nbroken, 1);
    ck_assert_int_eq(w.broken_at[0], m.start[6]);
    ck_assert_int_eq(w.broken[0].broken_period, mlp_period(&m));
    ck_assert_int_eq(w.ev.source, OOC_ITERDET_MARKER);
    ck_assert_int_eq(w.ev.period, 0);
    /* Markers at the end of each iteration, as test/workloads --mark places them. */
    for (int it = 6; it < 10; it++) {
        mlp_iter(&w, &m, 32);
        w_mark(&w);
    }
    ck_assert_int_eq(w.nfound, 2);
    ck_assert_int_eq(w.found[1].period, mlp_period(&m));
    ck_assert_int_eq(w.found[1].first_op, m.start[6]);
    ck_assert_int_eq(w.found_at[1], m.start[8]);
    ck_assert_int_eq(w.ev.iters, 4);
    ck_assert_int_eq(w.detected_events, 0);
    w_fini(&w);
}
END_TEST

/* Issues an iteration of `len` ops whose shape depends on len (and on `variant`), with a
 * temporary per op used again by the next op. */
static void shaped_iter(world_t *w, int64_t len, uint64_t variant) {
    ref_t prev = w_new(w);
    for (int64_t k = 0; k < len; k++) {
        ref_t t = w_new(w);
        OPR(w, sg(200 + (uint64_t)len, (uint64_t)k % 7 + 10 * variant), prev, t);
        prev = t;
    }
}

START_TEST(test_markers_with_varying_lengths_report_each_iteration_and_runs) {
    world_t w;
    w_init(&w, NULL);
    setup(&w);
    static const int64_t lens[] = {30, 45, 30, 30, 52, 52, 52, 40, 40};
    int64_t at[OOC_ARRAY_SIZE(lens) + 1];
    int iters_want[] = {0, 1, 1, 1, 2, 1, 2, 3, 1, 2};
    for (size_t i = 0; i < OOC_ARRAY_SIZE(lens); i++) {
        at[i] = ooc_iterdet_ops(w.d);
        w_mark(&w);
        if (i > 0) {
            ck_assert(w.ev.flags & OOC_ITERDET_ITER);
            ck_assert_int_eq(w.ev.period, lens[i - 1]);
            ck_assert_int_eq(w.ev.last_op, at[i - 1]);
            ck_assert_int_eq(w.ev.iters, iters_want[i]);
            ck_assert_int_eq(w.ev.confirmed, iters_want[i] >= 2);
        }
        shaped_iter(&w, lens[i], i == 8); /* the last 40 differs in its ops */
    }
    w_mark(&w);
    ck_assert_int_eq(w.ev.period, 40);
    ck_assert_int_eq(w.ev.iters, 1); /* same length, different ops */
    ck_assert_int_eq(w.nfound, 2);   /* 30 30, then 52 52 */
    ck_assert_int_eq(w.found[0].period, 30);
    ck_assert_int_eq(w.found[1].period, 52);
    /* The 30-run breaks at the first op of the 52-iteration, the 52-run at the first op of the
     * first 40-iteration; the 40-run never had two iterations. */
    ck_assert_int_eq(w.nbroken, 2);
    ck_assert_int_eq(w.broken[0].broken_period, 30);
    ck_assert_int_eq(w.broken_at[0], at[4]);
    ck_assert_int_eq(w.broken[1].broken_period, 52);
    ck_assert_int_eq(w.broken_at[1], at[7]);
    ck_assert_int_eq(w.detected_events, 0);
    w_fini(&w);
}
END_TEST

START_TEST(test_marker_iteration_that_ends_early_breaks_the_run_at_the_marker) {
    world_t w;
    w_init(&w, NULL);
    setup(&w);
    for (int i = 0; i < 4; i++) {
        w_mark(&w);
        shaped_iter(&w, 20, 0);
    }
    w_mark(&w);
    ck_assert_int_eq(w.ev.iters, 4);
    int64_t at = ooc_iterdet_ops(w.d);
    shaped_iter(&w, 12, 0); /* signatures depend on the length: it breaks at its first op */
    ck_assert_int_eq(w.nbroken, 1);
    ck_assert_int_eq(w.broken_at[0], at);
    at = ooc_iterdet_ops(w.d);
    w_mark(&w);
    ck_assert_int_eq(w.nbroken, 1);
    ck_assert_int_eq(w.ev.iters, 1);
    ck_assert_int_eq(w.ev.period, 12);
    ck_assert_int_eq(w.ev.last_op, at - 12);
    /* A prefix of the same ops that ends early breaks at the marker. */
    for (int i = 0; i < 3; i++) {
        shaped_iter(&w, 12, 0);
        w_mark(&w);
    }
    ck_assert_int_eq(w.ev.iters, 4);
    ref_t prev = w_new(&w);
    for (int64_t k = 0; k < 5; k++) {
        ref_t t = w_new(&w);
        OPR(&w, sg(212, (uint64_t)k % 7), prev, t);
        prev = t;
    }
    ck_assert_int_eq(w.nbroken, 1);
    at = ooc_iterdet_ops(w.d);
    w_mark(&w);
    ck_assert_int_eq(w.nbroken, 2);
    ck_assert_int_eq(w.broken_at[1], at);
    ck_assert_int_eq(w.broken[1].broken_period, 12);
    ck_assert_int_eq(w.ev.period, 5);
    ck_assert_int_eq(w.ev.iters, 1);
    w_fini(&w);
}
END_TEST

START_TEST(test_repeated_marker_is_ignored) {
    world_t w;
    w_init(&w, NULL);
    setup(&w);
    w_mark(&w);
    shaped_iter(&w, 10, 0);
    w_mark(&w);
    w_mark(&w);
    ck_assert_int_eq(w.ev.flags, 0);
    ck_assert_int_eq(w.ev.period, 10);
    ck_assert_int_eq(w.niter, 1);
    w_fini(&w);
}
END_TEST

/* ---- random streams ------------------------------------------------------------------------ */

START_TEST(test_random_stream_never_reports_a_period) {
    uint64_t seed = tu_seed("test_random_stream_never_reports_a_period");
    world_t w;
    w_init(&w, NULL);
    ref_t pool[8];
    for (int i = 0; i < 8; i++)
        pool[i] = w_pre(&w);
    ref_t recent[4] = {pool[0], pool[1], pool[2], pool[3]};
    for (int i = 0; i < 200000; i++) {
        unsigned alphabet = i < 100000 ? 6 : 2;
        ref_t r[3];
        unsigned n = rnd(&seed, 4);
        for (unsigned j = 0; j < n; j++) {
            unsigned kind = rnd(&seed, 3);
            if (kind == 0) {
                r[j] = pool[rnd(&seed, 8)];
            } else if (kind == 1) {
                r[j] = w_new(&w);
                recent[rnd(&seed, 4)] = r[j];
            } else {
                r[j] = recent[rnd(&seed, 4)];
            }
        }
        w_op(&w, sg(7, rnd(&seed, alphabet)), r, n);
    }
    ck_assert_int_eq(w.nfound, 0);
    ck_assert_int_eq(w.nbroken, 0);
    ck_assert_int_eq(w.niter, 0);
    /* Nothing but signatures, from two values: not even a short repetition is reported. */
    for (int i = 0; i < 100000; i++)
        OP0(&w, sg(8, rnd(&seed, 2)));
    ck_assert_int_eq(w.nfound, 0);
    w_fini(&w);
}
END_TEST

#define TPL_MAX  400
#define TPL_REFS 3

/* A random iteration template: signatures from a small alphabet (a primitive sequence, so the
 * template is not itself periodic) and, per op, references of four kinds. */
typedef struct tpl {
    int64_t len;
    uint64_t sig[TPL_MAX];
    unsigned nref[TPL_MAX];
    unsigned kind[TPL_MAX][TPL_REFS]; /* 0 weight, 1 lazily created state, 2 new, 3 earlier new */
    unsigned arg[TPL_MAX][TPL_REFS];  /* weight or state index; for 3, the op that created it */
    ref_t weights[16], state[8];
    int have_state[8];
    ref_t made[TPL_MAX]; /* the temporary each op made in the current copy */
} tpl_t;

static int primitive(const uint64_t *s, int64_t len) {
    for (int64_t d = 1; d < len; d++) {
        if (len % d)
            continue;
        int64_t j = 0;
        while (j < len && s[j] == s[(j + d) % len])
            j++;
        if (j == len)
            return 0;
    }
    return 1;
}

static void tpl_make(world_t *w, tpl_t *t, uint64_t *seed, int64_t len, unsigned alphabet) {
    memset(t, 0, sizeof *t);
    t->len = len;
    do {
        for (int64_t j = 0; j < len; j++)
            t->sig[j] = sg(300, rnd(seed, alphabet));
    } while (!primitive(t->sig, len));
    for (int64_t j = 0; j < len; j++) {
        t->nref[j] = rnd(seed, TPL_REFS + 1);
        int made = 0;
        for (unsigned r = 0; r < t->nref[j]; r++) {
            unsigned k = rnd(seed, 4);
            if (k == 3 && j == 0)
                k = 2;
            if (k == 2 && made)
                k = 0;
            t->kind[j][r] = k;
            t->arg[j][r] = k == 0 ? rnd(seed, 16) : k == 1 ? rnd(seed, 8) : 0;
            if (k == 3) { /* an earlier op of this copy that made a temporary */
                int64_t from = (int64_t)rnd(seed, (unsigned)j);
                while (from > 0 &&
                       !(t->kind[from][0] == 2 || t->kind[from][1] == 2 || t->kind[from][2] == 2))
                    from--;
                t->arg[j][r] = (unsigned)from;
                if (t->kind[from][0] != 2 && t->kind[from][1] != 2 && t->kind[from][2] != 2) {
                    t->kind[j][r] = 0; /* none: a weight */
                    t->arg[j][r] = rnd(seed, 16);
                }
            }
            made |= t->kind[j][r] == 2;
        }
    }
    for (int i = 0; i < 16; i++)
        t->weights[i] = w_pre(w);
}

/* Issues one copy of the template; a warm-up copy (seed not NULL) has about one op in 50 with
 * another signature and one in 200 followed by an extra op. */
static void tpl_copy(world_t *w, tpl_t *t, uint64_t *warm) {
    for (int64_t j = 0; j < t->len; j++) {
        ref_t r[TPL_REFS];
        for (unsigned i = 0; i < t->nref[j]; i++) {
            unsigned a = t->arg[j][i];
            switch (t->kind[j][i]) {
            case 0:
                r[i] = t->weights[a];
                break;
            case 1:
                if (!t->have_state[a]) {
                    t->state[a] = w_new(w);
                    t->have_state[a] = 1;
                }
                r[i] = t->state[a];
                break;
            case 2:
                r[i] = t->made[j] = w_new(w);
                break;
            default:
                r[i] = t->made[a];
                break;
            }
        }
        w_op(w, warm && rnd(warm, 50) == 0 ? t->sig[j] ^ 1 : t->sig[j], r, t->nref[j]);
        if (warm && rnd(warm, 200) == 0)
            OP0(w, sg(301, 0));
    }
}

START_TEST(test_random_templates_are_found_with_their_length) {
    uint64_t seed = tu_seed("test_random_templates_are_found_with_their_length");
    for (int trial = 0; trial < 60; trial++) {
        world_t w;
        w_init(&w, NULL);
        static tpl_t t;
        int64_t len = 8 + rnd(&seed, 300);
        unsigned alphabet = 2 + rnd(&seed, 30);
        tpl_make(&w, &t, &seed, len, alphabet);
        int64_t prefix = rnd(&seed, (unsigned)(2 * len + 1));
        for (int64_t i = 0; i < prefix; i++) {
            ref_t r = rnd(&seed, 2) ? w_new(&w) : t.weights[rnd(&seed, 16)];
            w_op(&w, sg(300, rnd(&seed, alphabet)), &r, rnd(&seed, 2));
        }
        int warm = rnd(&seed, 2);
        tpl_copy(&w, &t, warm ? &seed : NULL);
        int64_t steady = ooc_iterdet_ops(w.d); /* where the first unaltered copy starts */
        for (int64_t c = 0; c < 6 + 64 / len; c++)
            tpl_copy(&w, &t, NULL);
        ck_assert_msg(w.nfound == 1 && w.found[0].period == len,
                      "trial %d (len %lld, alphabet %u, prefix %lld, warm-up %d): %d FOUND, first "
                      "period %lld",
                      trial, (long long)len, alphabet, (long long)prefix, warm, w.nfound,
                      (long long)w.found[0].period);
        /* At worst the boundary falls just after a copy's start: two iterations counted after
         * the one cut by it, and min_span. */
        ck_assert_int_lt(w.found_at[0], steady + 4 * len + 64);
        ck_assert_int_eq(w.nbroken, 0);
        ck_assert_int_eq(w.ev.period, len);
        w_fini(&w);
    }
}
END_TEST

/* ---- bounds and arguments ------------------------------------------------------------------ */

START_TEST(test_period_longer_than_the_history_is_not_found_and_memory_stays_bounded) {
    ooc_iterdet_opts_t o = {.max_period = 256};
    world_t w;
    w_init(&w, &o);
    size_t limit = ooc_iterdet_mem_limit(w.d);
    ck_assert_uint_lt(limit, 256 * 1024);
    uint64_t seed = 42;
    static tpl_t t;
    tpl_make(&w, &t, &seed, 300, 5);
    size_t mid = 0;
    for (int c = 0; c < 40; c++) {
        tpl_copy(&w, &t, NULL);
        ck_assert_uint_le(ooc_iterdet_mem_bytes(w.d), limit);
        if (c == 20)
            mid = ooc_iterdet_mem_bytes(w.d);
    }
    ck_assert_uint_eq(ooc_iterdet_mem_bytes(w.d), mid);
    ck_assert_int_eq(w.nfound, 0);
    w_fini(&w);

    /* Within the bound, the same detector finds it. */
    w_init(&w, &o);
    tpl_make(&w, &t, &seed, 200, 5);
    for (int c = 0; c < 6; c++)
        tpl_copy(&w, &t, NULL);
    ck_assert_int_eq(w.nfound, 1);
    ck_assert_int_eq(w.found[0].period, 200);
    w_fini(&w);
}
END_TEST

/* An iteration of `len` ops, each referencing a weight, the previous op's output and a new
 * output. */
static void chain_iter(world_t *w, const ref_t *weights, int64_t len) {
    ref_t prev = w_new(w);
    for (int64_t k = 0; k < len; k++) {
        ref_t out = w_new(w);
        OPR(w, sg(400, (uint64_t)k % 5), weights[k], prev, out);
        prev = out;
    }
}

START_TEST(test_references_that_left_the_history_are_not_compared) {
    /* 64 references kept: an iteration of 40 ops with 3 references each cannot be compared with
     * the one before it, one of 10 ops can. */
    ooc_iterdet_opts_t o = {.max_period = 1000, .max_refs = 64};
    world_t w;
    w_init(&w, &o);
    ref_t weights[40];
    for (int i = 0; i < 40; i++)
        weights[i] = w_pre(&w);
    for (int it = 0; it < 20; it++)
        chain_iter(&w, weights, 40);
    ck_assert_int_eq(w.nfound, 0);
    ck_assert_uint_le(ooc_iterdet_mem_bytes(w.d), ooc_iterdet_mem_limit(w.d));
    for (int it = 0; it < 12; it++)
        chain_iter(&w, weights, 10);
    ck_assert_int_eq(w.nfound, 1);
    ck_assert_int_eq(w.found[0].period, 10);
    /* An op with more references than the history holds is kept without them: never a match. */
    ref_t many[65];
    for (int i = 0; i < 65; i++)
        many[i] = weights[i % 40];
    w_op(&w, sg(401, 0), many, 65);
    ck_assert_int_eq(w.nbroken, 1);
    w_fini(&w);
}
END_TEST

START_TEST(test_default_memory_limit_is_documented_size) {
    world_t w;
    w_init(&w, NULL);
    size_t limit = ooc_iterdet_mem_limit(w.d);
    /* 2^20 + 1 ops and 2^22 references of 16 bytes, plus the key table. */
    ck_assert_uint_ge(limit, (((size_t)1 << 20) + ((size_t)1 << 22)) * 16);
    ck_assert_uint_le(limit, (((size_t)1 << 20) + ((size_t)1 << 22)) * 16 + 4 * 1024 * 1024);
    ck_assert_uint_lt(ooc_iterdet_mem_bytes(w.d), 4 * 1024 * 1024); /* it starts small */
    w_fini(&w);
}
END_TEST

START_TEST(test_bad_arguments_are_rejected_and_the_op_not_taken) {
    ooc_iterdet_t *d = (ooc_iterdet_t *)1;
    ck_assert_int_eq(ooc_iterdet_new(NULL, NULL), OOC_EINVAL);
    ooc_iterdet_opts_t o = {.max_period = -1};
    ck_assert_int_eq(ooc_iterdet_new(&o, &d), OOC_EINVAL);
    ck_assert_ptr_null(d);
    o = (ooc_iterdet_opts_t){.max_period = OOC_ITERDET_MAX_PERIOD_LIMIT + 1};
    ck_assert_int_eq(ooc_iterdet_new(&o, &d), OOC_ERANGE);
    o = (ooc_iterdet_opts_t){.max_refs = OOC_ITERDET_MAX_REFS_LIMIT + 1};
    ck_assert_int_eq(ooc_iterdet_new(&o, &d), OOC_ERANGE);
    o = (ooc_iterdet_opts_t){.min_span_ops = -5};
    ck_assert_int_eq(ooc_iterdet_new(&o, &d), OOC_EINVAL);

    ck_assert_int_eq(ooc_iterdet_new(NULL, &d), 0);
    ooc_iterdet_event_t ev;
    ck_assert_int_eq(ooc_iterdet_op(NULL, 1, NULL, 0, &ev), OOC_EINVAL);
    ck_assert_int_eq(ooc_iterdet_op(d, 1, NULL, 2, &ev), OOC_EINVAL);
    ref_t future = {1, 0}; /* allocated after op 0, referenced by op 0 */
    ck_assert_int_eq(ooc_iterdet_op(d, 1, &future, 1, &ev), OOC_EINVAL);
    ref_t many = {1, -1};
    ck_assert_int_eq(ooc_iterdet_op(d, 1, &many, OOC_ITERDET_MAX_OP_REFS + 1, &ev), OOC_ERANGE);
    ck_assert_int_eq(ooc_iterdet_ops(d), 0);
    ck_assert_int_eq(ooc_iterdet_op(d, 1, NULL, 0, NULL), 0);
    ck_assert_int_eq(ooc_iterdet_op(d, 1, &future, 1, &ev), 0); /* now it is in the past */
    ck_assert_int_eq(ooc_iterdet_ops(d), 2);
    ck_assert_int_eq(ooc_iterdet_mark(NULL, &ev), OOC_EINVAL);
    ck_assert_int_eq(ooc_iterdet_state(NULL, &ev), OOC_EINVAL);
    ck_assert_int_eq(ooc_iterdet_state(d, NULL), OOC_EINVAL);
    ck_assert_int_eq(ooc_iterdet_ops(NULL), 0);
    ck_assert_uint_eq(ooc_iterdet_mem_bytes(NULL), 0);
    ooc_iterdet_free(d);
    ooc_iterdet_free(NULL);
}
END_TEST

START_TEST(test_ops_with_many_references_are_compared_in_full) {
    /* 300 references per op, one of them a different weight in each layer. */
    world_t w;
    w_init(&w, NULL);
    ref_t shared[300], layer[8];
    for (int i = 0; i < 300; i++)
        shared[i] = w_pre(&w);
    for (int i = 0; i < 8; i++)
        layer[i] = w_pre(&w);
    for (int it = 0; it < 10; it++) {
        ref_t x = w_new(&w);
        OPR(&w, sg(1, 0), x);
        for (int l = 0; l < 8; l++) {
            shared[150] = layer[l];
            w_op(&w, sg(2, 0), shared, 300);
        }
    }
    ck_assert_int_eq(w.nfound, 1);
    ck_assert_int_eq(w.found[0].period, 9);
    w_fini(&w);
}
END_TEST

Suite *suite_iterdet(void) {
    Suite *s = suite_create("iterdet");

    TCase *tc = tcase_create("detect");
    tcase_set_timeout(tc, 20);
    tcase_add_test(tc, test_simple_loop_of_28_ops_is_found_after_two_iterations_past_the_first);
    tcase_add_test(tc, test_mlp_of_12_identical_layers_finds_the_iteration_not_a_layer);
    tcase_add_test(tc, test_mlp_with_a_differing_first_iteration_counts_from_the_second);
    tcase_add_test(tc, test_iteration_that_creates_optimizer_state_is_not_counted);
    tcase_add_test(tc, test_smaller_last_batch_breaks_the_period_and_finds_nothing_new);
    tcase_add_test(tc, test_smaller_batch_that_repeats_is_found_as_a_new_run);
    tcase_add_test(tc, test_inserted_op_breaks_the_period_which_is_found_again);
    tcase_add_test(tc, test_weights_reallocated_by_every_update_are_matched_as_temporaries);
    tcase_add_test(tc, test_batch_prefetched_one_iteration_ahead_is_matched);
    tcase_add_test(tc, test_one_buffer_arena_sub_periods_give_way_to_the_iteration);
    tcase_add_test(tc, test_loop_body_over_the_same_buffers_is_never_reported);
    tcase_add_test(tc, test_min_period_is_an_option);
    tcase_add_test(tc, test_ops_with_many_references_are_compared_in_full);
    suite_add_tcase(s, tc);

    tc = tcase_create("markers");
    tcase_set_timeout(tc, 10);
    tcase_add_test(tc, test_markers_take_precedence_over_detection);
    tcase_add_test(tc, test_first_marker_breaks_a_detected_period);
    tcase_add_test(tc, test_markers_with_varying_lengths_report_each_iteration_and_runs);
    tcase_add_test(tc, test_marker_iteration_that_ends_early_breaks_the_run_at_the_marker);
    tcase_add_test(tc, test_repeated_marker_is_ignored);
    suite_add_tcase(s, tc);

    tc = tcase_create("random");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_random_stream_never_reports_a_period);
    tcase_add_test(tc, test_random_templates_are_found_with_their_length);
    suite_add_tcase(s, tc);

    tc = tcase_create("bounds");
    tcase_set_timeout(tc, 20);
    tcase_add_test(tc, test_period_longer_than_the_history_is_not_found_and_memory_stays_bounded);
    tcase_add_test(tc, test_references_that_left_the_history_are_not_compared);
    tcase_add_test(tc, test_default_memory_limit_is_documented_size);
    tcase_add_test(tc, test_bad_arguments_are_rejected_and_the_op_not_taken);
    suite_add_tcase(s, tc);
    return s;
}
