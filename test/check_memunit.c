/* SPDX-License-Identifier: MIT */
/* check_memunit.c: the memory layer's pure parts, without a driver: runs of the address
 * reservation (shim/vaspace.c: best fit, the quarantine, coalescing, the tail, a direct space's
 * immediate reuse and the same addresses for the same allocations every iteration), the slab
 * lists of small buffers (shim/slab.c: sorted insertion, lookup of interior pointers, padding,
 * removal) and the LRU's eviction walk (shim/lru.c: least recently used first, the second
 * chance of touched chunks, pinned chunks skipped, the bound on the walk). */
#include "mem_int.h" /* first: it sets up cuda.h as the shim does */

#include <check.h>
#include <stdlib.h>

Suite *suite_memunit(void);

static va_space_t fresh(uint64_t chunks) {
    va_space_t v;
    memset(&v, 0, sizeof v);
    v.chunks = chunks;
    return v;
}

static uint64_t take(va_space_t *v, uint64_t n) {
    uint64_t first = UINT64_MAX;
    ck_assert_int_eq(va_space_take(v, n, &first), 0);
    return first;
}

/* Gives back QUARANTINE_RUNS one-chunk runs taken from the tail, pushing every earlier run out
 * of the quarantine. */
static void flush_quarantine(va_space_t *v) {
    uint64_t d[QUARANTINE_RUNS];
    for (int i = 0; i < QUARANTINE_RUNS; i++)
        d[i] = take(v, 1);
    for (int i = 0; i < QUARANTINE_RUNS; i++)
        va_space_give(v, d[i], 1);
}

START_TEST(test_runs_come_from_the_tail_until_exhausted) {
    va_space_t v = fresh(20);
    ck_assert_uint_eq(take(&v, 8), 0);
    ck_assert_uint_eq(take(&v, 12), 8);
    uint64_t first = 77;
    ck_assert_int_eq(va_space_take(&v, 1, &first), -1);
    ck_assert_uint_eq(first, 77); /* untouched on failure */
    va_space_free(&v);
}
END_TEST

START_TEST(test_a_freed_run_waits_in_quarantine_before_reuse) {
    va_space_t v = fresh(1000);
    uint64_t a = take(&v, 10);
    take(&v, 1); /* keeps a away from the tail */
    va_space_give(&v, a, 10);
    ck_assert_uint_ne(take(&v, 10), a); /* still quarantined: a use after free would fault */
    flush_quarantine(&v);
    ck_assert_uint_eq(take(&v, 10), a); /* now free, and the best fit */
    va_space_free(&v);
}
END_TEST

START_TEST(test_neighbours_coalesce_into_one_run) {
    va_space_t v = fresh(1000);
    uint64_t a = take(&v, 4), b = take(&v, 4), c = take(&v, 4);
    take(&v, 1); /* a guard before the tail */
    va_space_give(&v, b, 4);
    va_space_give(&v, a, 4);
    va_space_give(&v, c, 4);
    flush_quarantine(&v);
    /* Only the coalesced run serves 12 chunks at a; the flush's one-chunk runs are elsewhere. */
    ck_assert_uint_eq(take(&v, 12), a);
    va_space_free(&v);
}
END_TEST

START_TEST(test_best_fit_prefers_the_smallest_run_that_fits) {
    va_space_t v = fresh(1000);
    uint64_t big = take(&v, 16);
    take(&v, 1);
    uint64_t small = take(&v, 5);
    take(&v, 1);
    va_space_give(&v, big, 16);
    va_space_give(&v, small, 5);
    flush_quarantine(&v);
    ck_assert_uint_eq(take(&v, 5), small);
    ck_assert_uint_eq(take(&v, 16), big);
    va_space_free(&v);
}
END_TEST

START_TEST(test_a_run_at_the_tail_joins_the_tail) {
    va_space_t v = fresh(1000);
    take(&v, 3);
    uint64_t d[QUARANTINE_RUNS];
    for (int i = 0; i < QUARANTINE_RUNS; i++)
        d[i] = take(&v, 1);
    uint64_t last = take(&v, 7);
    ck_assert_uint_eq(v.next, 3 + QUARANTINE_RUNS + 7);
    va_space_give(&v, last, 7);
    for (int i = 0; i < QUARANTINE_RUNS; i++)
        va_space_give(&v, d[i], 1);  /* the last of these pushes `last` out of the quarantine */
    ck_assert_uint_eq(v.next, last); /* it joined the untouched tail */
    ck_assert_uint_eq(take(&v, 7), last);
    va_space_free(&v);
}
END_TEST

START_TEST(test_a_direct_space_frees_a_run_at_once) {
    va_space_t v = fresh(1000);
    v.direct = 1;
    uint64_t a = take(&v, 10);
    take(&v, 1); /* keeps a away from the tail */
    va_space_give(&v, a, 10);
    ck_assert_uint_eq(take(&v, 10), a); /* no quarantine */
    uint64_t b = take(&v, 3);
    va_space_give(&v, b, 3); /* at the tail: joins it */
    ck_assert_uint_eq(v.next, b);
    va_space_free(&v);
}
END_TEST

START_TEST(test_equal_fits_go_to_the_lowest_address) {
    va_space_t v = fresh(1000);
    v.direct = 1;
    uint64_t a = take(&v, 4);
    take(&v, 1);
    uint64_t b = take(&v, 4);
    take(&v, 1);
    uint64_t c = take(&v, 4);
    take(&v, 1);
    /* Freed out of address order: the list holds c, a, b, in some order of its own. */
    va_space_give(&v, c, 4);
    va_space_give(&v, a, 4);
    va_space_give(&v, b, 4);
    ck_assert_uint_eq(take(&v, 4), a);
    ck_assert_uint_eq(take(&v, 4), b);
    ck_assert_uint_eq(take(&v, 4), c);
    va_space_free(&v);
}
END_TEST

/* One "iteration" of a program: buffers of these chunk counts allocated in order, some freed
 * along the way, the rest at the end; their first chunks go to out[]. */
static void iteration(va_space_t *v, uint64_t *out) {
    static const uint64_t sizes[] = {8, 3, 3, 12, 1, 5, 8, 2};
    uint64_t n = sizeof sizes / sizeof sizes[0];
    for (uint64_t i = 0; i < n; i++) {
        out[i] = take(v, sizes[i]);
        if (i % 3 == 2) /* a temporary freed before the next allocation */
            va_space_give(v, out[i - 1], sizes[i - 1]);
    }
    for (uint64_t i = n; i-- > 0;)
        if (i % 3 != 1 || i + 1 == n)
            va_space_give(v, out[i], sizes[i]);
}

START_TEST(test_a_direct_space_repeats_an_iteration_s_addresses) {
    va_space_t v = fresh(1000);
    v.direct = 1;
    take(&v, 20); /* weights, allocated once */
    uint64_t prev[8], cur[8];
    iteration(&v, prev);
    for (int it = 1; it < 5; it++) {
        iteration(&v, cur);
        for (int i = 0; i < 8; i++)
            ck_assert_uint_eq(cur[i], prev[i]);
    }
    va_space_free(&v);
}
END_TEST

static buf_t *mkbuf(uintptr_t addr, size_t size) {
    buf_t *b = calloc(1, sizeof *b);
    ck_assert_ptr_nonnull(b);
    b->addr = addr;
    b->size = size;
    return b;
}

START_TEST(test_slab_finds_interior_pointers_not_padding) {
    slab_t s;
    memset(&s, 0, sizeof s);
    buf_t *b[40];
    for (int i = 0; i < 40; i++) {
        b[i] = mkbuf(0x10000 + (uintptr_t)i * 256, 200); /* 56 bytes of padding after each */
        ck_assert_int_eq(slab_insert(&s, b[i]), 0);
    }
    for (int i = 0; i < 40; i++) {
        ck_assert_ptr_eq(slab_find(&s, b[i]->addr), b[i]);
        ck_assert_ptr_eq(slab_find(&s, b[i]->addr + 199), b[i]);
        ck_assert_ptr_null(slab_find(&s, b[i]->addr + 200)); /* padding */
    }
    ck_assert_ptr_null(slab_find(&s, 0x10000 - 1));
    slab_remove(&s, b[17]);
    ck_assert_ptr_null(slab_find(&s, b[17]->addr + 5));
    ck_assert_ptr_eq(slab_find(&s, b[16]->addr + 5), b[16]);
    ck_assert_ptr_eq(slab_find(&s, b[18]->addr + 5), b[18]);
    slab_remove(&s, b[17]); /* not there: nothing */
    ck_assert_uint_eq(s.n, 39);
    for (int i = 0; i < 40; i++)
        free(b[i]);
    free(s.bufs);
}
END_TEST

/* ---- the LRU (lru.c) ------------------------------------------------------------------------ */

#define NLRU 5

/* An LRU of NLRU chunks pushed in index order: c[NLRU - 1] the most recent, c[0] the least. */
typedef struct {
    chunk_t head;
    chunk_t c[NLRU];
} lru_fix_t;

static void lru_fresh(lru_fix_t *f) {
    memset(f, 0, sizeof *f);
    f->head.next = f->head.prev = &f->head;
    for (int i = 0; i < NLRU; i++) {
        f->c[i].idx = (uint64_t)i;
        lru_list_push(&f->head, &f->c[i]);
    }
}

static void touch(chunk_t *c) {
    atomic_store_explicit(&c->touched, 1, memory_order_relaxed);
}

/* The indices of the list from its tail (least recent) to its head, as a string "01234". */
static const char *lru_order(const lru_fix_t *f) {
    static char s[NLRU + 2];
    int n = 0;
    for (const chunk_t *c = f->head.prev; c != &f->head && n <= NLRU; c = c->prev)
        s[n++] = (char)('0' + c->idx);
    s[n] = '\0';
    return s;
}

/* The victims' indices in the order picked, as a string. */
static const char *picked(chunk_t *const *v, unsigned n) {
    static char s[NLRU + 1];
    ck_assert_uint_le(n, NLRU);
    for (unsigned i = 0; i < n; i++)
        s[i] = (char)('0' + v[i]->idx);
    s[n] = '\0';
    return s;
}

START_TEST(test_lru_victims_come_least_recently_used_first) {
    lru_fix_t f;
    lru_fresh(&f);
    chunk_t *v[NLRU];
    unsigned n = lru_pick(&f.head, 1, 100, v, NLRU);
    ck_assert_str_eq(picked(v, n), "01234");
    ck_assert_str_eq(lru_order(&f), "01234"); /* victims stay in the list for the caller */
    lru_list_push(&f.head, &f.c[0]);          /* used again: now the most recent */
    n = lru_pick(&f.head, 1, 100, v, NLRU);
    ck_assert_str_eq(picked(v, n), "12340");
    lru_list_push_tail(&f.head, &f.c[3]); /* the plan swaps it out: the first to go */
    n = lru_pick(&f.head, 1, 100, v, NLRU);
    ck_assert_str_eq(picked(v, n), "31240");
}
END_TEST

START_TEST(test_lru_pick_respects_want) {
    lru_fix_t f;
    lru_fresh(&f);
    chunk_t *v[NLRU];
    ck_assert_uint_eq(lru_pick(&f.head, 1, 100, v, 0), 0);
    unsigned n = lru_pick(&f.head, 1, 100, v, 2);
    ck_assert_str_eq(picked(v, n), "01");
    touch(&f.c[0]);
    n = lru_pick(&f.head, 1, 100, v, 1);
    ck_assert_str_eq(picked(v, n), "1");
    ck_assert_str_eq(lru_order(&f), "12340"); /* the walk stopped at its one victim */
}
END_TEST

START_TEST(test_lru_touched_chunks_get_a_second_chance) {
    lru_fix_t f;
    lru_fresh(&f);
    touch(&f.c[0]);
    touch(&f.c[2]);
    chunk_t *v[NLRU];
    unsigned n = lru_pick(&f.head, 1, 100, v, NLRU);
    /* The touched ones went back to the head, untouched, and were met again last, the less
     * recent of them first. */
    ck_assert_str_eq(picked(v, n), "13402");
    ck_assert_str_eq(lru_order(&f), "13402");
    for (int i = 0; i < NLRU; i++)
        ck_assert_int_eq(atomic_load(&f.c[i].touched), 0);
    /* Untouched now: a second walk takes them in list order. */
    n = lru_pick(&f.head, 1, 100, v, 2);
    ck_assert_str_eq(picked(v, n), "13");
}
END_TEST

START_TEST(test_lru_pinned_chunks_are_skipped) {
    lru_fix_t f;
    lru_fresh(&f);
    f.c[0].pin = 7; /* the current op (serial 7) needs them */
    f.c[3].pin = 7;
    f.c[1].pin = 6; /* pinned by an earlier op: fair game */
    touch(&f.c[3]); /* pinned and touched: still skipped, not moved */
    chunk_t *v[NLRU];
    unsigned n = lru_pick(&f.head, 7, 100, v, NLRU);
    ck_assert_str_eq(picked(v, n), "124");
    ck_assert_str_eq(lru_order(&f), "01234");
    ck_assert_int_eq(atomic_load(&f.c[3].touched), 1);
}
END_TEST

START_TEST(test_lru_held_chunks_are_skipped) {
    lru_fix_t f;
    lru_fresh(&f);
    /* A library call in flight uses chunks 1 and 2 (ooc_mem_op_hold), whatever op is current. */
    f.c[1].hold = 1;
    f.c[2].hold = 2;
    chunk_t *v[NLRU];
    unsigned n = lru_pick(&f.head, 9, 100, v, NLRU);
    ck_assert_str_eq(picked(v, n), "034");
    ck_assert_str_eq(lru_order(&f), "01234");
    f.c[1].hold = 0; /* the call has ended */
    n = lru_pick(&f.head, 9, 100, v, NLRU);
    ck_assert_str_eq(picked(v, n), "0134");
}
END_TEST

START_TEST(test_lru_walk_is_bounded) {
    lru_fix_t f;
    chunk_t *v[NLRU];
    /* Every chunk pinned: the walk reaches the head and ends with no victim. */
    lru_fresh(&f);
    for (int i = 0; i < NLRU; i++)
        f.c[i].pin = 3;
    ck_assert_uint_eq(lru_pick(&f.head, 3, UINT64_MAX, v, NLRU), 0);
    ck_assert_str_eq(lru_order(&f), "01234");
    /* Every chunk touched, steps for one pass: each gets its second chance, none is taken. */
    lru_fresh(&f);
    for (int i = 0; i < NLRU; i++)
        touch(&f.c[i]);
    ck_assert_uint_eq(lru_pick(&f.head, 1, NLRU, v, NLRU), 0);
    ck_assert_str_eq(lru_order(&f), "01234");
    /* Without the bound's help they are all met again, untouched, and taken. */
    for (int i = 0; i < NLRU; i++)
        touch(&f.c[i]);
    unsigned n = lru_pick(&f.head, 1, 2 * NLRU, v, NLRU);
    ck_assert_str_eq(picked(v, n), "01234");
    /* Untouched chunks but fewer steps than wanted victims. */
    lru_fresh(&f);
    n = lru_pick(&f.head, 1, 2, v, NLRU);
    ck_assert_str_eq(picked(v, n), "01");
    /* An empty list. */
    chunk_t head = {0};
    head.next = head.prev = &head;
    ck_assert_uint_eq(lru_pick(&head, 1, 100, v, NLRU), 0);
}
END_TEST

START_TEST(test_lru_remove_leaves_a_whole_list) {
    lru_fix_t f;
    lru_fresh(&f);
    lru_remove(&f.c[2]);
    ck_assert_ptr_null(f.c[2].prev);
    lru_remove(&f.c[2]); /* in no list: nothing */
    ck_assert_str_eq(lru_order(&f), "0134");
    lru_remove(&f.c[0]);
    lru_remove(&f.c[4]);
    ck_assert_str_eq(lru_order(&f), "13");
    lru_list_push_tail(&f.head, &f.c[4]);
    ck_assert_str_eq(lru_order(&f), "413");
}
END_TEST

Suite *suite_memunit(void) {
    Suite *s = suite_create("memunit");
    TCase *tc = tcase_create("vaspace");
    tcase_add_test(tc, test_runs_come_from_the_tail_until_exhausted);
    tcase_add_test(tc, test_a_freed_run_waits_in_quarantine_before_reuse);
    tcase_add_test(tc, test_neighbours_coalesce_into_one_run);
    tcase_add_test(tc, test_best_fit_prefers_the_smallest_run_that_fits);
    tcase_add_test(tc, test_a_run_at_the_tail_joins_the_tail);
    tcase_add_test(tc, test_a_direct_space_frees_a_run_at_once);
    tcase_add_test(tc, test_equal_fits_go_to_the_lowest_address);
    tcase_add_test(tc, test_a_direct_space_repeats_an_iteration_s_addresses);
    suite_add_tcase(s, tc);
    tc = tcase_create("slab");
    tcase_add_test(tc, test_slab_finds_interior_pointers_not_padding);
    suite_add_tcase(s, tc);
    tc = tcase_create("lru");
    tcase_add_test(tc, test_lru_victims_come_least_recently_used_first);
    tcase_add_test(tc, test_lru_pick_respects_want);
    tcase_add_test(tc, test_lru_touched_chunks_get_a_second_chance);
    tcase_add_test(tc, test_lru_pinned_chunks_are_skipped);
    tcase_add_test(tc, test_lru_held_chunks_are_skipped);
    tcase_add_test(tc, test_lru_walk_is_bounded);
    tcase_add_test(tc, test_lru_remove_leaves_a_whole_list);
    suite_add_tcase(s, tc);
    return s;
}
