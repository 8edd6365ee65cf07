/* SPDX-License-Identifier: MIT */
/* check_bench.c: the benchmark drivers run and report (scripts/bench-replay).
 *
 * A benchmark's figures depend on the machine, so these tests check what does not: the quick
 * configuration (the mlp workload, short kernels, safe mode on, one round, eight iterations: about
 * 10 s) exits 0 and prints its commands, the machine's load, the table with a positive median per
 * configuration, the ratios, the verdict on the prediction, the host time blocked in the shim per
 * replayed iteration, whether auto replayed, and the checksum agreement; a run that fails is a hard
 * error that names the configuration and the round. Not run under valgrind (it would trace the
 * Python interpreter and every workload). */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

Suite *suite_bench(void);

/* Runs scripts/bench-replay with the extra arguments (NULL-terminated, at most 12). */
static tu_proc_t bench_replay(const char *const args[]) {
    const char *argv[16] = {"scripts/bench-replay"};
    int k = 1;
    for (; args[k - 1] && k < 13; k++)
        argv[k] = args[k - 1];
    argv[k] = NULL;
    static char build[4200];
    snprintf(build, sizeof build, "OOC_BUILD=%s", tu_build_dir());
    const char *const env[] = {build, NULL};
    tu_proc_t pr;
    ck_assert_int_eq(tu_run(argv, env, 170, &pr), 0);
    return pr;
}

/* The median (ms) of the table row that starts with `label`; fails when there is none. */
static double row_median(const char *out, const char *label) {
    const char *row = strstr(out, label);
    ck_assert_msg(row != NULL, "no row '%s' in:\n%s", label, out);
    double v = strtod(row + strlen(label), NULL);
    ck_assert_msg(v > 0.0, "row '%s': median %g", label, v);
    return v;
}

START_TEST(test_bench_replay_quick_run_prints_the_table) {
    if (tu_under_valgrind())
        return;
    tu_proc_t pr = bench_replay((const char *[]){"--workload", "mlp", "--rounds", "1", "--iters",
                                                 "8", "--kernels", "short", "--safe", "on", NULL});
    ck_assert_msg(pr.status == 0, "bench-replay failed (%d):\n%s\n%s", pr.status, pr.out, pr.err);
    /* the exact commands first: the in-core run without the shim, the two under it */
    static const char *const cmds[] = {"  in-core:   env ", "  demand:    env ",
                                       "  auto:      env ", "  predicted: "};
    for (int k = 0; k < 4; k++)
        ck_assert_msg(strstr(pr.out, cmds[k]) != NULL, "no command '%s':\n%s", cmds[k], pr.out);
    const char *incore_cmd = strstr(pr.out, cmds[0]);
    const char *demand_cmd = strstr(pr.out, cmds[1]);
    ck_assert_msg(strstr(incore_cmd, "FAKECUDA_TIMING=1") < demand_cmd, "%s", pr.out);
    ck_assert_msg(strstr(incore_cmd, "LD_PRELOAD=") > demand_cmd, "in-core under the shim:\n%s",
                  pr.out);
    ck_assert_msg(strstr(pr.out, "OOC_MODE=demand") && strstr(pr.out, "OOC_MODE=auto") &&
                      strstr(pr.out, "OOC_PROFILE_DIR=") && strstr(pr.out, "--time"),
                  "%s", pr.out);
    /* the table, the ratios and the verdicts */
    double incore = row_median(pr.out, "in-core (no shim, unlimited)");
    double demand = row_median(pr.out, "shim, OOC_MODE=demand");
    row_median(pr.out, "shim, OOC_MODE=auto (measured)");
    row_median(pr.out, "auto predicted by ooc-plan");
    ck_assert_msg(demand > incore,
                  "demand mode at 1/4 of the footprint (%g ms) is not slower than "
                  "in core (%g ms)",
                  demand, incore);
    ck_assert_msg(strstr(pr.out, "OOC_SAFE=on") && strstr(pr.out, "FAKECUDA_HOST_VMM=1") &&
                      strstr(pr.out, "FAKECUDA_GFLOPS=10 "),
                  "not the short-kernel, safe-mode configuration:\n%s", pr.out);
    static const char *const lines[] = {"per-iteration wall time, median of iterations 5..7",
                                        "load: before ",
                                        "== short kernels, safe mode on: compute 10 GFLOP/s",
                                        "auto: host time blocked in the shim per replayed "
                                        "iteration ",
                                        "ratios: demand/in-core ",
                                        "auto/in-core ",
                                        "auto/demand ",
                                        "measured auto / predicted auto: ",
                                        "the target is 0.85..1.15",
                                        "checksums: all 3 runs printed "};
    for (size_t k = 0; k < sizeof lines / sizeof lines[0]; k++)
        ck_assert_msg(strstr(pr.out, lines[k]) != NULL, "no '%s' in:\n%s", lines[k], pr.out);
    ck_assert_msg(strstr(pr.out, "within 15%: yes") || strstr(pr.out, "within 15%: NO"), "%s",
                  pr.out);
    /* the replay's excess beyond the simulator's own pace: the quotient of the two ratios */
    const char *bs = strstr(pr.out, "beyond the simulator: auto measured ");
    double xa = 0, xp = 0, ex = 0;
    ck_assert_msg(bs && sscanf(bs,
                               "beyond the simulator: auto measured %lfx in core, its plan %lfx "
                               "the profile's in-core sum: the replay's own excess %lfx",
                               &xa, &xp, &ex) == 3,
                  "no excess line in:\n%s", pr.out);
    /* Each figure is printed to 2 decimals: the quotient of the printed two may differ from the
     * printed quotient by what their rounding allows (at auto 4x in core and a plan 1x, 0.025). */
    double lo = (xa - 0.005) / (xp + 0.005), hi = (xa + 0.005) / (xp - 0.005);
    ck_assert_msg(xa > 0 && xp > 0.005 && ex + 0.005 >= lo - 1e-9 && ex - 0.005 <= hi + 1e-9,
                  "%g / %g is not %g (%g..%g allowing for the rounding)", xa, xp, ex, lo, hi);
    ck_assert_msg(strstr(pr.out, "replay: auto did not replay (the shim recorded then ran on "
                                 "demand)") ||
                      strstr(pr.out, "replay: auto replayed"),
                  "no word on replay:\n%s", pr.out);
    tu_proc_free(&pr);
}
END_TEST

/* A run that fails is an error, not a figure: a budget of 1/1000 of the footprint cannot hold
 * one operation, so the demand run fails and bench-replay says which run and exits 1. */
START_TEST(test_bench_replay_failed_run_is_an_error) {
    if (tu_under_valgrind())
        return;
    tu_proc_t pr = bench_replay((const char *[]){"--workload", "mlp", "--rounds", "1", "--iters",
                                                 "6", "--budget-div", "1000", NULL});
    ck_assert_msg(pr.status == 1, "status %d:\n%s\n%s", pr.status, pr.out, pr.err);
    ck_assert_msg(
        strstr(pr.err,
               "bench-replay: error: demand (long kernels, safe mode on), round 1: exit status"),
        "%s", pr.err);
    ck_assert_msg(strstr(pr.out, "ratios:") == NULL, "a table after a failure:\n%s", pr.out);
    tu_proc_free(&pr);
    /* too few iterations to measure auto after it has recorded: a usage error */
    pr = bench_replay((const char *[]){"--iters", "5", NULL});
    ck_assert_msg(pr.status == 2, "status %d:\n%s", pr.status, pr.err);
    ck_assert_msg(strstr(pr.err, "--iters"), "%s", pr.err);
    tu_proc_free(&pr);
}
END_TEST

/* `--safe staged` is safe mode with OOC_SAFE_STAGE=1 on the device with host-located memory, for
 * the shim runs only: the variable reaches demand and auto (bench-replay clears OOC_* from its own
 * environment, so this option is the only way to measure staging with it). */
START_TEST(test_bench_replay_staged_sets_the_stage_variable) {
    if (tu_under_valgrind())
        return;
    tu_proc_t pr =
        bench_replay((const char *[]){"--workload", "mlp", "--rounds", "1", "--iters", "6",
                                      "--kernels", "short", "--safe", "staged", NULL});
    ck_assert_msg(pr.status == 0, "bench-replay failed (%d):\n%s\n%s", pr.status, pr.out, pr.err);
    const char *demand_cmd = strstr(pr.out, "  demand:    env ");
    const char *auto_cmd = strstr(pr.out, "  auto:      env ");
    ck_assert_msg(demand_cmd && auto_cmd, "%s", pr.out);
    const char *stage = strstr(pr.out, "OOC_SAFE_STAGE=1");
    ck_assert_msg(stage && stage > demand_cmd, "no OOC_SAFE_STAGE=1 in the shim runs:\n%s", pr.out);
    ck_assert_msg(strstr(auto_cmd, "OOC_SAFE_STAGE=1") && strstr(auto_cmd, "OOC_SAFE=on") &&
                      strstr(auto_cmd, "FAKECUDA_HOST_VMM=1"),
                  "auto is not staged safe mode:\n%s", pr.out);
    ck_assert_msg(strstr(pr.out, "== short kernels, safe mode staged: ") &&
                      strstr(pr.out, "checksums: all 3 runs printed "),
                  "%s", pr.out);
    tu_proc_free(&pr);
    pr = bench_replay((const char *[]){"--safe", "sometimes", NULL});
    ck_assert_msg(pr.status == 2 && strstr(pr.err, "--safe 'sometimes': expected a comma-separated "
                                                   "list of on, staged, off"),
                  "status %d:\n%s", pr.status, pr.err);
    tu_proc_free(&pr);
}
END_TEST

Suite *suite_bench(void) {
    Suite *s = suite_create("bench");
    TCase *tc = tcase_create("bench_replay");
    tcase_set_timeout(tc, 180);
    tcase_add_test(tc, test_bench_replay_quick_run_prints_the_table);
    tcase_add_test(tc, test_bench_replay_failed_run_is_an_error);
    tcase_add_test(tc, test_bench_replay_staged_sets_the_stage_variable);
    suite_add_tcase(s, tc);
    return s;
}
