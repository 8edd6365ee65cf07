/* SPDX-License-Identifier: MIT */
/* check_stats.c: counters, gauges and their peaks (also under concurrent threads), and the
 * formatting of the table that OOC_STATS=1 prints. */
#include <check.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "stats.h"

Suite *suite_stats(void);

static void setup(void) {
    ooc_stats_reset();
}

START_TEST(test_counters_accumulate) {
    ooc_stats_add(OOC_STAT_launches, 1);
    ooc_stats_add(OOC_STAT_launches, 41);
    ooc_stats_add(OOC_STAT_swap_out_bytes, 3 * OOC_MiB);
    ck_assert_uint_eq(ooc_stats_get(OOC_STAT_launches), 42);
    ck_assert_uint_eq(ooc_stats_get(OOC_STAT_swap_out_bytes), 3 * OOC_MiB);
    ck_assert_uint_eq(ooc_stats_peak(OOC_STAT_launches), 0);
    ck_assert_int_eq(ooc_stats_is_gauge(OOC_STAT_launches), 0);
}
END_TEST

START_TEST(test_gauge_keeps_its_peak) {
    ooc_stats_gauge_add(OOC_STAT_resident_bytes, 10);
    ooc_stats_gauge_add(OOC_STAT_resident_bytes, 5);
    ooc_stats_gauge_sub(OOC_STAT_resident_bytes, 12);
    ooc_stats_gauge_add(OOC_STAT_resident_bytes, 3);
    ck_assert_uint_eq(ooc_stats_get(OOC_STAT_resident_bytes), 6);
    ck_assert_uint_eq(ooc_stats_peak(OOC_STAT_resident_bytes), 15);
    ck_assert_int_eq(ooc_stats_is_gauge(OOC_STAT_resident_bytes), 1);
}
END_TEST

START_TEST(test_max_only_raises) {
    _Atomic uint64_t cell = 7;
    ooc_stats_max(&cell, 3);
    ck_assert_uint_eq(cell, 7);
    ooc_stats_max(&cell, 9);
    ck_assert_uint_eq(cell, 9);
}
END_TEST

START_TEST(test_alloc_and_free_account_requested_and_mapped) {
    ooc_stats_alloc(3 * OOC_MiB + 5, 4 * OOC_MiB);
    ooc_stats_alloc(OOC_MiB, 2 * OOC_MiB);
    ooc_stats_free(OOC_MiB, 2 * OOC_MiB);
    ck_assert_uint_eq(ooc_stats_get(OOC_STAT_allocs), 2);
    ck_assert_uint_eq(ooc_stats_get(OOC_STAT_frees), 1);
    ck_assert_uint_eq(ooc_stats_get(OOC_STAT_requested_bytes), 3 * OOC_MiB + 5);
    ck_assert_uint_eq(ooc_stats_get(OOC_STAT_mapped_bytes), 4 * OOC_MiB);
    ck_assert_uint_eq(ooc_stats_peak(OOC_STAT_requested_bytes), 4 * OOC_MiB + 5);
    ck_assert_uint_eq(ooc_stats_peak(OOC_STAT_mapped_bytes), 6 * OOC_MiB);
}
END_TEST

enum { THREADS = 8, ROUNDS = 20000 };
static _Atomic uint64_t shared_cell;

/* Each thread raises the shared cell through values that interleave with the others', ending
 * at 1000000 * (id + 1); and moves the gauge up and down by id + 1. */
static void *hammer(void *arg) {
    uint64_t id = (uint64_t)(uintptr_t)arg;
    for (uint64_t i = 1; i <= ROUNDS; i++) {
        ooc_stats_max(&shared_cell, (1000000 * (id + 1)) * i / ROUNDS);
        ooc_stats_gauge_add(OOC_STAT_resident_bytes, id + 1);
        ooc_stats_add(OOC_STAT_launches, 1);
        ooc_stats_gauge_sub(OOC_STAT_resident_bytes, id + 1);
    }
    return NULL;
}

START_TEST(test_peaks_are_exact_under_concurrent_threads) {
    pthread_t t[THREADS];
    shared_cell = 0;
    for (uintptr_t i = 0; i < THREADS; i++)
        ck_assert_int_eq(pthread_create(&t[i], NULL, hammer, (void *)i), 0);
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
    ck_assert_uint_eq(shared_cell, 1000000 * THREADS);
    ck_assert_uint_eq(ooc_stats_get(OOC_STAT_launches), (uint64_t)THREADS * ROUNDS);
    ck_assert_uint_eq(ooc_stats_get(OOC_STAT_resident_bytes), 0);
    /* The peak saw at least the largest single thread's share and never more than all of them
     * at once (1 + 2 + ... + THREADS). */
    uint64_t peak = ooc_stats_peak(OOC_STAT_resident_bytes);
    ck_assert_uint_ge(peak, THREADS);
    ck_assert_uint_le(peak, THREADS * (THREADS + 1) / 2);
}
END_TEST

START_TEST(test_bytes_print_in_mib_below_a_gib_and_gib_above) {
    char b[32];
    ck_assert_str_eq(ooc_stats_fmt_bytes(0, b, sizeof b), "0.00 MiB");
    ck_assert_str_eq(ooc_stats_fmt_bytes(OOC_MiB * 3 / 2, b, sizeof b), "1.50 MiB");
    ck_assert_str_eq(ooc_stats_fmt_bytes(5 * OOC_KiB, b, sizeof b), "0.00 MiB");
    ck_assert_str_eq(ooc_stats_fmt_bytes(6 * OOC_KiB, b, sizeof b), "0.01 MiB");
    ck_assert_str_eq(ooc_stats_fmt_bytes(OOC_GiB - 1, b, sizeof b), "1024.00 MiB");
    ck_assert_str_eq(ooc_stats_fmt_bytes(OOC_GiB, b, sizeof b), "1.00 GiB");
    ck_assert_str_eq(ooc_stats_fmt_bytes(16 * OOC_GiB - 20 * OOC_MiB, b, sizeof b), "15.98 GiB");
    ck_assert_str_eq(ooc_stats_fmt_bytes(2 * OOC_GiB - OOC_MiB, b, sizeof b), "2.00 GiB");
    ck_assert_str_eq(ooc_stats_fmt_bytes(UINT64_MAX, b, sizeof b), "17179869184.00 GiB");
}
END_TEST

START_TEST(test_time_prints_in_milliseconds) {
    char b[32];
    ck_assert_str_eq(ooc_stats_fmt_ns(0, b, sizeof b), "0.00 ms");
    ck_assert_str_eq(ooc_stats_fmt_ns(1234567890, b, sizeof b), "1234.57 ms");
    ck_assert_str_eq(ooc_stats_fmt_ns(999999999, b, sizeof b), "1000.00 ms");
    ck_assert_str_eq(ooc_stats_fmt_ns(4999, b, sizeof b), "0.00 ms");
    ck_assert_str_eq(ooc_stats_fmt_ns(5000, b, sizeof b), "0.01 ms");
}
END_TEST

/* The line of the table whose label is `label`, copied into line. */
static int find_line(const char *table, const char *label, char *line, size_t len) {
    for (const char *p = table; *p;) {
        const char *nl = strchr(p, '\n');
        size_t n = nl ? (size_t)(nl - p) : strlen(p);
        if (n > 2 && strncmp(p + 2, label, strlen(label)) == 0 && p[2 + strlen(label)] == ' ') {
            snprintf(line, len, "%.*s", (int)n, p);
            return 1;
        }
        p += n + (nl != NULL);
    }
    return 0;
}

/* Asserts that the table has a row labelled `label` holding ` value`. */
static void row_reads(const char *table, const char *label, const char *value) {
    char line[256], want[64];
    ck_assert_msg(find_line(table, label, line, sizeof line), "no row '%s' in\n%s", label, table);
    snprintf(want, sizeof want, " %s", value);
    ck_assert_msg(strstr(line, want) != NULL, "row '%s' does not read '%s'", line, value);
}

START_TEST(test_table_lists_every_statistic_aligned) {
    ooc_stats_gauge_add(OOC_STAT_resident_bytes, 16 * OOC_GiB - 20 * OOC_MiB);
    ooc_stats_gauge_sub(OOC_STAT_resident_bytes, 16 * OOC_GiB - 20 * OOC_MiB);
    ooc_stats_add(OOC_STAT_swap_out_bytes, 123 * OOC_GiB);
    ooc_stats_add(OOC_STAT_swap_outs, 1234);
    ooc_stats_add(OOC_STAT_stall_ns, 1234567890);
    ooc_stats_add(OOC_STAT_launches, 123456);
    char table[16384], line[256];
    size_t n = ooc_stats_format(table, sizeof table);
    ck_assert_uint_eq(n, strlen(table));
    char head[64];
    snprintf(head, sizeof head, "ooc[%ld] stats\n", (long)getpid());
    ck_assert_int_eq(strncmp(table, head, strlen(head)), 0);

    /* The values are right-aligned under the header's "total/now": each row's first value ends
     * in the same column, and a gauge's peak ends under "peak". */
    const char *header = table + strlen(head);
    size_t value_end = (size_t)(strstr(header, "total/now") - header) + strlen("total/now");
    size_t peak_end = (size_t)(strstr(header, "peak") - header) + strlen("peak");
    for (int i = 0; i < OOC_STAT_N; i++) {
        const char *label = ooc_stats_label((ooc_stat_t)i);
        ck_assert_msg(find_line(table, label, line, sizeof line), "no row for %s in\n%s", label,
                      table);
        ck_assert_msg(strlen(line) >= value_end && line[value_end - 1] != ' ' &&
                          (line[value_end] == ' ' || line[value_end] == '\0'),
                      "row '%s' is not aligned in\n%s", line, table);
        if (ooc_stats_is_gauge((ooc_stat_t)i))
            ck_assert_msg(strlen(line) == peak_end, "peak of '%s' is not aligned", line);
    }
    row_reads(table, "resident device memory", "0.00 MiB");
    row_reads(table, "resident device memory", "15.98 GiB");
    row_reads(table, "swapped out (device to host)", "123.00 GiB");
    row_reads(table, "swap-outs", "1234");
    row_reads(table, "stall time", "1234.57 ms");
    row_reads(table, "kernel launches", "123456");
}
END_TEST

/* The host time the program's thread was blocked, and the mapping calls it made itself (not the
 * replay worker), per replayed iteration. */
START_TEST(test_table_reports_blocked_time_per_replayed_iteration) {
    char table[16384], line[256];
    ooc_stats_add(OOC_STAT_blocked_ns, 9000000);
    ooc_stats_add(OOC_STAT_replay_blocked_ns, 6000000);
    ooc_stats_format(table, sizeof table);
    ck_assert(find_line(table, "blocked per replayed iteration", line, sizeof line));
    ck_assert_msg(line[strlen(line) - 1] == '-', "no iteration replayed, yet '%s'", line);
    ooc_stats_add(OOC_STAT_replay_iters, 4);
    ooc_stats_format(table, sizeof table);
    row_reads(table, "host time blocked in the shim", "9.00 ms");
    row_reads(table, "blocked per replayed iteration", "1.50 ms");
    /* the mapping calls the program's thread made itself, the same way */
    ooc_stats_add(OOC_STAT_vmm_prog_ns, 3000000);
    ooc_stats_add(OOC_STAT_replay_vmm_prog_ns, 2000000);
    ooc_stats_format(table, sizeof table);
    row_reads(table, "program's mapping per replayed iteration", "0.50 ms");
    /* ... and by cause: the whole run's rows, and per replayed iteration (listed only there) */
    ooc_stats_add(OOC_STAT_blocked_queued_ns, 7000000);
    ooc_stats_add(OOC_STAT_replay_queued_ns, 4000000);
    ooc_stats_add(OOC_STAT_replay_streams_ns, 1000000);
    ooc_stats_format(table, sizeof table);
    row_reads(table, "of it: for planned swap-ins still queued", "7.00 ms");
    row_reads(table, "  of it: planned swap-ins still queued", "1.00 ms");
    row_reads(table, "  of it: a chunk's streams (remaps)", "0.25 ms");
    row_reads(table, "  of it: the residency lock", "0.00 ms");
    /* ... and the part whose waits ended with the program's streams empty */
    ooc_stats_add(OOC_STAT_blocked_idle_ns, 5000000);
    ooc_stats_add(OOC_STAT_replay_idle_ns, 2000000);
    ooc_stats_format(table, sizeof table);
    row_reads(table, "of it: with the program's streams empty", "5.00 ms");
    row_reads(table, "  of it: the program's streams empty", "0.50 ms");
    ck_assert_msg(strstr(table, "4.00 ms") == NULL, "a per-iteration cell listed as it is:\n%s",
                  table);
}
END_TEST

START_TEST(test_table_reports_fragmentation_at_peak) {
    char table[16384], line[256];
    ooc_stats_format(table, sizeof table);
    ck_assert(find_line(table, "mapped beyond requested, at peak", line, sizeof line));
    ck_assert_msg(line[strlen(line) - 1] == '-', "no allocation yet, yet '%s'", line);

    ooc_stats_alloc(100 * OOC_MiB, 102 * OOC_MiB);
    ooc_stats_format(table, sizeof table);
    row_reads(table, "mapped beyond requested, at peak", "2.00 %");
}
END_TEST

START_TEST(test_format_reports_needed_length_when_cut) {
    char full[16384], small[40];
    size_t n = ooc_stats_format(full, sizeof full);
    ck_assert_uint_eq(ooc_stats_format(small, sizeof small), n);
    ck_assert_uint_eq(strlen(small), sizeof small - 1);
    ck_assert_int_eq(strncmp(small, full, sizeof small - 1), 0);
    ck_assert_uint_eq(ooc_stats_format(NULL, 0), n);
}
END_TEST

START_TEST(test_print_writes_the_table_to_fd) {
    int fd[2];
    ck_assert_int_eq(pipe2(fd, O_NONBLOCK), 0);
    ooc_stats_add(OOC_STAT_recomputes, 7);
    ck_assert_int_eq(ooc_stats_print(fd[1]), 0);
    char got[4096] = {0}, want[4096];
    ssize_t r = read(fd[0], got, sizeof got - 1);
    ck_assert_int_gt(r, 0);
    ooc_stats_format(want, sizeof want);
    ck_assert_str_eq(got, want);
    close(fd[0]);
    close(fd[1]);
    ck_assert_int_eq(ooc_stats_print(-1), OOC_EIO);
}
END_TEST

Suite *suite_stats(void) {
    Suite *s = suite_create("stats");
    TCase *tc = tcase_create("stats");
    tcase_set_timeout(tc, 20);
    tcase_add_checked_fixture(tc, setup, NULL);
    tcase_add_test(tc, test_counters_accumulate);
    tcase_add_test(tc, test_gauge_keeps_its_peak);
    tcase_add_test(tc, test_max_only_raises);
    tcase_add_test(tc, test_alloc_and_free_account_requested_and_mapped);
    tcase_add_test(tc, test_peaks_are_exact_under_concurrent_threads);
    tcase_add_test(tc, test_bytes_print_in_mib_below_a_gib_and_gib_above);
    tcase_add_test(tc, test_time_prints_in_milliseconds);
    tcase_add_test(tc, test_table_lists_every_statistic_aligned);
    tcase_add_test(tc, test_table_reports_blocked_time_per_replayed_iteration);
    tcase_add_test(tc, test_table_reports_fragmentation_at_peak);
    tcase_add_test(tc, test_format_reports_needed_length_when_cut);
    tcase_add_test(tc, test_print_writes_the_table_to_fd);
    suite_add_tcase(s, tc);
    return s;
}
