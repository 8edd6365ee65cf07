/* SPDX-License-Identifier: MIT */
/* check_memunit.c: the memory layer's pure parts, without a driver: runs of the address
 * reservation (shim/vaspace.c: best fit, the quarantine, coalescing, the tail) and the slab
 * lists of small buffers (shim/slab.c: sorted insertion, lookup of interior pointers, padding,
 * removal). */
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

Suite *suite_memunit(void) {
    Suite *s = suite_create("memunit");
    TCase *tc = tcase_create("vaspace");
    tcase_add_test(tc, test_runs_come_from_the_tail_until_exhausted);
    tcase_add_test(tc, test_a_freed_run_waits_in_quarantine_before_reuse);
    tcase_add_test(tc, test_neighbours_coalesce_into_one_run);
    tcase_add_test(tc, test_best_fit_prefers_the_smallest_run_that_fits);
    tcase_add_test(tc, test_a_run_at_the_tail_joins_the_tail);
    suite_add_tcase(s, tc);
    tc = tcase_create("slab");
    tcase_add_test(tc, test_slab_finds_interior_pointers_not_padding);
    suite_add_tcase(s, tc);
    return s;
}
