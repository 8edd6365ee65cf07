/* SPDX-License-Identifier: MIT */
/* check_fastpath.c: the lock-free launch path. In demand mode an op whose buffers are all
 * resident and stable is issued without the residency lock: a workload whose footprint fits the
 * budget runs nearly all its launches that way and keeps its checksum; threads launching on
 * shared and private buffers while others allocate, free and force evictions get every byte
 * right (test/progs/stress.c checks each against a host model), with safe mode on and off,
 * threaded with jitter and strict unmapping; recording keeps every op on the locked path;
 * replayed ops with nothing planned around them take it too.
 *
 * Tests run the programs as children with LD_PRELOAD (the runner's sanitizer runtime first when
 * it has one) and read the shim's statistics table (OOC_STATS=1) from their stderr. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

Suite *suite_fastpath(void);

#define FAST_LABEL "operations issued without the lock"

/* Runs build/<prog> args... with the simulated driver, the shim when `shim`, and env. */
static tu_result_t run(const char *prog, const char *const *args, int shim,
                       const char *const *env) {
    return tu_run_prog(prog, args, shim, env, 240);
}

/* A workload in demand mode with the budget far above its footprint: after the first touch of
 * each buffer, launches take the fast path; the checksum is the oracle's. */
static void check_fits(const char *name, const char *sched) {
    const char *const args[] = {"--iters", "3", NULL};
    const char *const oenv[] = {"FAKECUDA_SCHED=inline", NULL};
    tu_result_t o = run(name, args, 0, oenv);
    ck_assert_int_eq(o.status, 0);
    ck_assert_str_ne(o.checksum, "");
    char sch[64];
    snprintf(sch, sizeof sch, "FAKECUDA_SCHED=%s", sched);
    const char *const env[] = {sch, "OOC_MODE=demand", "OOC_BUDGET=2G", "OOC_STATS=1", NULL};
    tu_result_t p = run(name, args, 1, env);
    ck_assert_msg(p.status == 0, "%s: status %d\n%s", name, p.status, p.err);
    ck_assert_str_eq(p.checksum, o.checksum);
    long long fast = tu_stat_row(p.err, FAST_LABEL),
              launches = tu_stat_row(p.err, "kernel launches");
    long long demand = tu_stat_row(p.err, "operations made resident on demand");
    ck_assert_msg(launches > 0 && fast >= launches * 3 / 4,
                  "%s: %lld ops on the fast path for %lld launches (%lld made resident)\n%s", name,
                  fast, launches, demand, p.err);
    tu_result_free(&o);
    tu_result_free(&p);
}

START_TEST(test_launches_take_the_fast_path_when_the_budget_holds_the_footprint) {
    check_fits("workloads/large", "threaded");
    check_fits("workloads/mlp", "inline");
    check_fits("workloads/cnn", "threaded");
}
END_TEST

/* While recording, every op is logged in order: none may take the fast path. */
START_TEST(test_recording_keeps_ops_on_the_locked_path) {
    const char *const args[] = {"--iters", "3", NULL};
    char dir[512];
    snprintf(dir, sizeof dir, "OOC_PROFILE_DIR=%s", tu_build_path("test/fastpath-prof"));
    const char *const env[] = {
        "OOC_MODE=record", "OOC_BUDGET=2G", "OOC_STATS=1", "OOC_PROFILE_ITERS=10", dir, NULL};
    tu_result_t p = run("workloads/mlp", args, 1, env);
    ck_assert_msg(p.status == 0, "status %d\n%s", p.status, p.err);
    ck_assert_msg(tu_stat_row(p.err, FAST_LABEL) == 0, "fast-path ops while recording:\n%s", p.err);
    tu_result_free(&p);
}
END_TEST

/* Under auto the shim records, plans and replays. Once replaying, an op whose chunks are hot,
 * that is the plan's next op with nothing planned around it and whose buffers the plan bound
 * already, is matched and issued without the lock: still counted as run as planned, never a
 * divergence, and the checksum is the oracle's. */
START_TEST(test_replayed_ops_take_the_fast_path) {
    const char *const args[] = {"--iters", "8", NULL};
    const char *const oenv[] = {"FAKECUDA_SCHED=inline", NULL};
    tu_result_t o = run("workloads/mlp", args, 0, oenv);
    ck_assert_int_eq(o.status, 0);
    char dir[512];
    snprintf(dir, sizeof dir, "OOC_PROFILE_DIR=%s", tu_build_path("test/fastpath-auto"));
    const char *const env[] = {"OOC_MODE=auto", "OOC_BUDGET=2G", "OOC_STATS=1", dir, NULL};
    tu_result_t p = run("workloads/mlp", args, 1, env);
    ck_assert_msg(p.status == 0, "status %d", p.status);
    ck_assert_str_eq(p.checksum, o.checksum);
    long long planned = tu_stat_row(p.err, "operations run as planned");
    long long fast = tu_stat_row(p.err, FAST_LABEL);
    /* mlp allocates its activations anew each iteration: the first op to touch one binds it to
     * the plan's buffer, on the locked path; the ops after it may go lock-free. */
    ck_assert_msg(planned > 0 && fast >= planned / 4,
                  "%lld replayed ops, %lld of them on the fast path", planned, fast);
    long long div = tu_stat_row(p.err, "divergences from the plan");
    ck_assert_msg(div <= 1, "%lld divergences", div);
    tu_result_free(&o);
    tu_result_free(&p);
}
END_TEST

/* test/progs/stress with 4 workers at a budget of `budget` (64 KiB chunks), seed `seed`, the
 * simulated driver scheduling `sched` (threaded with jitter, or inline: each op run by the
 * thread that issues it): every byte right, the checksum the run without the shim gives, and
 * some ops on the fast path (with `want_fast`). */
static void check_stress(unsigned seed, int host_vmm, const char *budget, int want_fast,
                         const char *sched) {
    char sd[32], fseed[48], bud[48], cap[48], sch[48];
    snprintf(sch, sizeof sch, "FAKECUDA_SCHED=%s", sched);
    snprintf(sd, sizeof sd, "%u", seed);
    snprintf(fseed, sizeof fseed, "FAKECUDA_SEED=%u", seed);
    snprintf(bud, sizeof bud, "OOC_BUDGET=%s", budget);
    snprintf(cap, sizeof cap, "FAKECUDA_MEM_BYTES=%s", budget);
    const char *const args[] = {"--seed", sd, "--threads", "4", NULL};
    const char *const oenv[] = {"FAKECUDA_SCHED=inline", "FAKECUDA_GRANULARITY=64K", NULL};
    tu_result_t o = run("test/progs/stress", args, 0, oenv);
    ck_assert_msg(o.status == 0, "seed %u without the shim: status %d\n%s", seed, o.status, o.err);
    ck_assert_str_ne(o.checksum, "");
    const char *const env[] = {host_vmm ? "FAKECUDA_HOST_VMM=1" : "FAKECUDA_HOST_VMM=0",
                               sch,
                               "FAKECUDA_JITTER_US=20",
                               "FAKECUDA_STRICT=1",
                               fseed,
                               "FAKECUDA_GRANULARITY=64K",
                               "OOC_CHUNK=64K",
                               bud,
                               cap,
                               "OOC_MODE=demand",
                               "OOC_STATS=1",
                               NULL};
    tu_result_t p = run("test/progs/stress", args, 1, env);
    ck_assert_msg(p.status == 0, "seed %u, safe mode %s, budget %s, %s: status %d\n%s", seed,
                  host_vmm ? "on" : "off", budget, sched, p.status, p.err);
    ck_assert_ptr_nonnull(strstr(p.out, "stress: ok"));
    ck_assert_str_eq(p.checksum, o.checksum);
    ck_assert_ptr_nonnull(strstr(p.err, host_vmm ? "safe mode on" : "safe mode off"));
    long long fast = tu_stat_row(p.err, FAST_LABEL);
    if (want_fast)
        ck_assert_msg(fast > 0, "no op took the fast path:\n%s", p.err);
    tu_result_free(&o);
    tu_result_free(&p);
}

START_TEST(test_threads_under_eviction_get_every_byte_right_with_safe_mode) {
    unsigned base = (unsigned)tu_seed("test_threads_under_eviction_get_every_byte_right");
    for (unsigned i = 0; i < 3; i++)
        check_stress(base + i, 1, "1M", 1, "threaded");
}
END_TEST

START_TEST(test_threads_under_eviction_get_every_byte_right_without_safe_mode) {
    unsigned base = (unsigned)tu_seed("test_threads_under_eviction_get_every_byte_right");
    for (unsigned i = 0; i < 3; i++)
        check_stress(base + i, 0, "1M", 1, "threaded");
}
END_TEST

/* Inline: the workers' ops run on their own threads, beside each other and the shim's worker. */
START_TEST(test_threads_under_eviction_get_every_byte_right_inline) {
    unsigned base = (unsigned)tu_seed("test_threads_under_eviction_get_every_byte_right_inline");
    check_stress(base, 1, "1M", 1, "inline");
    check_stress(base + 1, 0, "1M", 1, "inline");
}
END_TEST

/* With room for everything, nearly every op is on the fast path while buffers are still freed
 * and reallocated (each free is a writer section). */
START_TEST(test_threads_with_room_get_every_byte_right) {
    unsigned base = (unsigned)tu_seed("test_threads_with_room_get_every_byte_right");
    check_stress(base, 1, "64M", 1, "threaded");
    check_stress(base + 1, 0, "64M", 1, "threaded");
}
END_TEST

/* The program's thread waits in the shim for a copy out (test/progs/busyprog: A copied out, about
 * 8 ms on the slow link, for C's memory) while its other stream s1 is held behind a host word:
 * that wait ended with the program's work still queued, and is not counted "with the program's
 * streams empty"; with --idle s1 drained first, and the same wait is. Both runs give the oracle's
 * bytes. The statistic separates the waits a GPU runs through from those that may starve it. */
START_TEST(test_a_wait_with_work_still_queued_is_told_from_one_with_the_streams_empty) {
    static const char *const none[] = {NULL}, *const idle[] = {"--idle", NULL};
    const char *const oenv[] = {"FAKECUDA_SCHED=threaded", NULL}; /* inline cannot hold s1 */
    tu_result_t o = run("test/progs/busyprog", none, 0, oenv);
    ck_assert_msg(o.status == 0, "%s", o.err);
    double empty[2] = {0, 0};
    for (int v = 0; v < 2; v++) {
        const char *const env[] = {
            "FAKECUDA_SCHED=threaded", "FAKECUDA_TIMING=1", "FAKECUDA_D2H_GBPS=0.25",
            "FAKECUDA_H2D_GBPS=0.25",  "OOC_MODE=demand",   "OOC_SAFE=off",
            "OOC_BUDGET=6M",           "OOC_STATS=1",       NULL};
        tu_result_t r = run("test/progs/busyprog", v ? idle : none, 1, env);
        ck_assert_msg(r.status == 0, "%s", tu_tail(r.err, 3000));
        ck_assert_str_eq(r.checksum, o.checksum);
        double all = tu_stat_value(r.err, "host time blocked in the shim");
        double out = tu_stat_value(r.err, "of it: for copies out (memory, remaps)");
        empty[v] = tu_stat_value(r.err, "of it: with the program's streams empty");
        /* the copy out of 2 MiB at 0.25 GB/s: about 8 ms */
        ck_assert_msg(out >= 4.0 && empty[v] <= all + 0.01,
                      "%s: blocked %.2f, copies out %.2f, "
                      "streams empty %.2f\n%s",
                      v ? "--idle" : "busy", all, out, empty[v], tu_tail(r.err, 3000));
        /* --idle: every wait ended with the streams empty; else the one for A's copy out (about
         * 8 ms) ended with s1 held, the others (the read-back's) with the streams empty. */
        if (v)
            ck_assert_msg(empty[v] >= all - 0.05,
                          "--idle: blocked %.2f ms, of it with the "
                          "streams empty %.2f\n%s",
                          all, empty[v], tu_tail(r.err, 3000));
        else
            ck_assert_msg(all - empty[v] >= 4.0,
                          "busy: blocked %.2f ms, of it with the streams "
                          "empty %.2f\n%s",
                          all, empty[v], tu_tail(r.err, 3000));
        tu_result_free(&r);
    }
    tu_result_free(&o);
}
END_TEST

Suite *suite_fastpath(void) {
    Suite *s = suite_create("fastpath");
    TCase *t = tcase_create("fastpath");
    tcase_set_timeout(t, 600);
    tcase_add_test(t, test_launches_take_the_fast_path_when_the_budget_holds_the_footprint);
    tcase_add_test(t, test_recording_keeps_ops_on_the_locked_path);
    tcase_add_test(t, test_replayed_ops_take_the_fast_path);
    tcase_add_test(t, test_threads_under_eviction_get_every_byte_right_with_safe_mode);
    tcase_add_test(t, test_threads_under_eviction_get_every_byte_right_without_safe_mode);
    tcase_add_test(t, test_threads_under_eviction_get_every_byte_right_inline);
    tcase_add_test(t, test_threads_with_room_get_every_byte_right);
    tcase_add_test(t, test_a_wait_with_work_still_queued_is_told_from_one_with_the_streams_empty);
    suite_add_tcase(s, t);
    return s;
}
