/* SPDX-License-Identifier: MIT */
/* check_bench.c: the benchmark drivers run and report (scripts/bench-replay), and
 * scripts/ooc-replay-trace sets a replay's trace beside its plan (the last two tests).
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

/* Runs `script` (a path in the checkout) with the extra arguments (NULL-terminated, at most 14)
 * and OOC_BUILD set, for at most timeout_s seconds. */
static tu_proc_t run_script(const char *script, const char *const args[], int timeout_s) {
    const char *argv[16] = {script};
    int k = 1;
    for (; args[k - 1] && k < 15; k++)
        argv[k] = args[k - 1];
    argv[k] = NULL;
    static char build[4200];
    snprintf(build, sizeof build, "OOC_BUILD=%s", tu_build_dir());
    const char *const env[] = {build, NULL};
    tu_proc_t pr;
    ck_assert_int_eq(tu_run(argv, env, timeout_s, &pr), 0);
    return pr;
}

static tu_proc_t bench_replay(const char *const args[]) {
    return run_script("scripts/bench-replay", args, 170);
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
    double autom = row_median(pr.out, "shim, OOC_MODE=auto (measured)");
    /* the device's idle time for the host, from its trace: a part of the measured iteration */
    const char *il = strstr(pr.out, "auto: the device idle waiting for the host per replayed "
                                    "iteration ");
    double idle = -1;
    ck_assert_msg(il &&
                      sscanf(il,
                             "auto: the device idle waiting for the host per replayed "
                             "iteration %lf ms",
                             &idle) == 1 &&
                      idle >= 0 && idle <= autom,
                  "idle for the host %g ms of an iteration of %g:\n%s", idle, autom, pr.out);
    row_median(pr.out, "auto predicted by ooc-plan");
    /* no gate, no time behind gates (test_bench_replay_gated_prints_the_time_behind_gates) */
    ck_assert_msg(!strstr(pr.out, "behind the shim's gates"), "%s", pr.out);
    /* the simulated device's own cost of a remap here, with the workload's chunk (64 KiB) */
    const char *rc = strstr(pr.out, "the simulated device's own host cost here (");
    const char *cp = rc ? strstr(rc, "a copy into a chunk of 64 KiB just mapped ") : NULL;
    double first = 0, again = 0, mu = 0;
    ck_assert_msg(cp &&
                      sscanf(cp,
                             "a copy into a chunk of 64 KiB just mapped %lf us, into it again "
                             "%lf us; a map and unmap %lf us",
                             &first, &again, &mu) == 3 &&
                      first > 0 && again > 0 && mu > 0,
                  "no remap cost line in:\n%s", pr.out);
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
                                        "auto: the device idle waiting for the host per "
                                        "replayed iteration ",
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

/* bench-replay on mlp, one round of 6 iterations with short kernels, safe mode `safe`: it must
 * succeed. */
static tu_proc_t mlp_short_6(const char *safe) {
    tu_proc_t pr = bench_replay((const char *[]){"--workload", "mlp", "--rounds", "1", "--iters",
                                                 "6", "--kernels", "short", "--safe", safe, NULL});
    ck_assert_msg(pr.status == 0, "bench-replay failed (%d):\n%s\n%s", pr.status, pr.out, pr.err);
    return pr;
}

/* `--safe staged` is safe mode with OOC_SAFE_STAGE=1 on the device with host-located memory, for
 * the shim runs only: the variable reaches demand and auto (bench-replay clears OOC_* from its own
 * environment, so this option is the only way to measure staging with it). */
START_TEST(test_bench_replay_staged_sets_the_stage_variable) {
    if (tu_under_valgrind())
        return;
    tu_proc_t pr = mlp_short_6("staged");
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

/* With the remapping gate (`--safe ongated`), the time the compute engine sat behind the gates,
 * from the trace's `memwait` rows: some, and a part of the measured iteration. */
START_TEST(test_bench_replay_gated_prints_the_time_behind_gates) {
    if (tu_under_valgrind())
        return;
    tu_proc_t pr = mlp_short_6("ongated");
    double autom = row_median(pr.out, "shim, OOC_MODE=auto (measured)"), g = -1;
    const char *gl = strstr(pr.out, "auto: the device idle behind the shim's gates per replayed "
                                    "iteration ");
    ck_assert_msg(gl &&
                      sscanf(gl,
                             "auto: the device idle behind the shim's gates per replayed "
                             "iteration %lf ms",
                             &g) == 1 &&
                      g > 0 && g <= autom,
                  "behind the gates %g ms of an iteration of %g:\n%s", g, autom, pr.out);
    tu_proc_free(&pr);
}
END_TEST

/* ---- scripts/ooc-replay-trace -----------------------------------------------------------------
 */

/* Writes `text` to dir/name. */
static void put(const char *dir, const char *name, const char *text) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    ck_assert_int_ge(fputs(text, f), 0);
    ck_assert_int_eq(fclose(f), 0);
}

static tu_proc_t replay_trace(const char *const args[]) {
    return run_script("scripts/ooc-replay-trace", args, 120);
}

/* The tab-separated fields of the line of `out` that starts with `first` (a whole first field),
 * as numbers into v (at most n); how many were read. */
static int fields(const char *out, const char *first, double *v, int n) {
    char key[64], line[1024];
    snprintf(key, sizeof key, "\n%s\t", first);
    const char *p = strstr(out, key);
    ck_assert_msg(p != NULL, "no row '%s' in:\n%s", first, out);
    p += strlen(key);
    size_t len = strcspn(p, "\n");
    ck_assert_uint_lt(len, sizeof line);
    memcpy(line, p, len);
    line[len] = 0;
    int k = 0;
    for (char *save = NULL, *f = strtok_r(line, "\t", &save); f && k < n;
         f = strtok_r(NULL, "\t", &save))
        v[k++] = strtod(f, NULL);
    return k;
}

/* A made-up profile, plan timeline and trace whose answers are known: the plan's iteration lasts
 * 10 ms, each measured one 12 ms. Op 3 starts 1 ms late because the host queued it 1 ms after
 * the engine was free (and 0.5 ms after that waiting for something else); the next iteration's
 * anchor (op 1) loses another 1 ms, 2 of its 4 ms idle the host's. One record per iteration is
 * the shim's own (skipped). The program's copy (op 0) goes to the h2d engine, as on the device. */
START_TEST(test_replay_trace_reports_a_made_up_replay_exactly) {
    if (tu_under_valgrind())
        return;
    char d[] = "/tmp/ooc-rtrace-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(d));
    put(d, "ops.tsv",
        "#ooc-profile\tops\t1\nidx\tstream\tkind\tname\tshape\tduration_ns\trefs\n"
        "0\t1\tmemcpy\tcuMemcpyHtoDAsync_v2\tbytes=4\t1000000\t0:w\n"
        "1\t1\tkernel\tk1\tgrid=1,1,1\t2000000\t0:rw\n"
        "2\t1\tkernel\tk2\tgrid=1,1,1\t2000000\t0:rw\n"
        "3\t1\tkernel\tk2\tgrid=1,1,1\t2000000\t0:rw\n");
    put(d, "timeline.tsv",
        "#ooc-timeline\t1\tsource=simulated\tpolicy=auto\tbudget_bytes=1\tchunk_bytes=1\t"
        "time_ns=10000000\tpeak_bytes=1\tnops=4\tnbufs=1\n"
        "engine\tstart_ns\tend_ns\top\tbuffer\taction\tbytes\tin_use_bytes\n"
        "compute\t0\t1000000\t0\t-\top\t-\t-\n"
        "compute\t1000000\t3000000\t1\t-\top\t-\t-\n"
        "compute\t3000000\t5000000\t2\t-\top\t-\t-\n"
        "h2d\t3000000\t7000000\t2\t0\tswapin\t4\t-\n"
        "d2h\t5000000\t9000000\t2\t0\tswapout\t4\t-\n"
        "compute\t6000000\t8000000\t3\t-\top\t-\t-\n");
    char trace[8192];
    size_t o = (size_t)snprintf(trace, sizeof trace,
                                "engine\tstart_ns\tend_ns\top\tqueued_ns\tready_ns\tran_ns\n");
    for (long t = 0; t <= 48; t += 12) { /* ms; 4 whole iterations, then the closing anchor */
        const long us = 1000000;
        o += (size_t)snprintf(trace + o, sizeof trace - o, "compute\t%ld\t%ld\tk1\t%ld\t0\t0\n",
                              (t + 1) * us, (t + 3) * us, t ? (t - 1) * us : 0);
        o += (size_t)snprintf(trace + o, sizeof trace - o,
                              "h2d\t%ld\t%ld\tmemcpy HtoD async\t%ld\t0\t0\n", t * us, (t + 1) * us,
                              t * us);
        if (t == 48)
            break;
        o += (size_t)snprintf(trace + o, sizeof trace - o,
                              "compute\t%ld\t%ld\tk2\t%ld\t0\t0\n"
                              "compute\t%ld\t%ld\tooc_checksum\t%ld\t0\t0\n"
                              "h2d\t%ld\t%ld\tmemcpy DtoD async\t%ld\t0\t0\n"
                              "d2h\t%ld\t%ld\tmemcpy DtoD async\t%ld\t0\t0\n"
                              "compute\t%ld\t%ld\tk2\t%ld\t0\t0\n",
                              (t + 3) * us, (t + 5) * us, t * us, (t + 5) * us,
                              (t * 2 + 11) * us / 2, t * us, (t + 4) * us, (t + 8) * us, t * us,
                              (t + 6) * us, (t + 9) * us, t * us, (t + 7) * us, (t + 9) * us,
                              (t * 2 + 13) * us / 2);
    }
    put(d, "trace.tsv", trace);
    char prof[64], tl[80], tr[80];
    snprintf(prof, sizeof prof, "%s", d);
    snprintf(tl, sizeof tl, "%s/timeline.tsv", d);
    snprintf(tr, sizeof tr, "%s/trace.tsv", d);
    tu_proc_t pr = replay_trace((const char *[]){prof, "--timeline", tl, "--trace", tr, "--iters",
                                                 "3", "--top", "2", NULL});
    ck_assert_msg(pr.status == 0, "status %d:\n%s%s", pr.status, pr.out, pr.err);
    ck_assert_msg(strstr(pr.out, "4 whole iterations") && strstr(pr.out, "cut at k1 (op 1 of 4)"),
                  "%s", pr.out);
    /* measured, predicted, ratio, compute (6.5 with the shim's record) against 6, h2d 5 (the next
     * iteration's copy, 1 ms, and the swap, 4) against 5 (the plan's copy op moved to h2d), d2h 3
     * against 4, idle for the host 1 + 2, for the rest 0.5 + 2, host ahead by 1 ms (median of 1,
     * 3, 0.5: the anchor queued 2 ms ahead, op 2 3 ms, op 3 0.5 ms), one record skipped */
    static const double want[13] = {12, 10, 1.2, 6.5, 6, 5, 5, 3, 4, 3, 2.5, 2, 1};
    for (int it = 1; it <= 3; it++) {
        char first[16];
        double v[13];
        snprintf(first, sizeof first, "%d", it);
        ck_assert_int_eq(fields(pr.out, first, v, 13), 13);
        for (int c = 0; c < 13; c++)
            ck_assert_msg(fabs(v[c] - want[c]) < 1e-3, "iteration %d column %d: %g, not %g\n%s", it,
                          c + 1, v[c], want[c], pr.out);
    }
    double m[13];
    ck_assert_int_eq(fields(pr.out, "median", m, 13), 13);
    ck_assert(fabs(m[0] - 12) < 1e-3 && fabs(m[11] - 2) < 1e-3);
    /* the ops: op 3 and op 1 each 1 ms later than the plan; op 3 after 1 ms of host idle and
     * 0.5 of the rest where the plan's engine idled 1 ms; op 1 after 2 and 2 where it idled 3
     * (the plan's copy, op 0, runs on the copy engine as on the device) */
    double o3[5], o1[5];
    ck_assert_int_eq(fields(pr.out, "3\tk2", o3, 5), 4);
    ck_assert_int_eq(fields(pr.out, "1\tk1", o1, 5), 4);
    ck_assert_msg(fabs(o3[0] - 1) < 1e-3 && fabs(o3[1] - 1) < 1e-3 && fabs(o3[2] - 0.5) < 1e-3 &&
                      fabs(o3[3] - 1) < 1e-3,
                  "%s", pr.out);
    ck_assert_msg(fabs(o1[0] - 1) < 1e-3 && fabs(o1[1] - 2) < 1e-3 && fabs(o1[2] - 2) < 1e-3 &&
                      fabs(o1[3] - 3) < 1e-3,
                  "%s", pr.out);
    ck_assert_msg(!strstr(pr.out, "\n2\tk2\t"), "op 2, on time, among the top 2:\n%s", pr.out);
    tu_proc_free(&pr);

    /* a timeline of another profile, a trace with no whole iteration: said, not guessed */
    put(d, "short.tsv",
        "engine\tstart_ns\tend_ns\top\tqueued_ns\tready_ns\tran_ns\n"
        "compute\t0\t5\tk1\t0\t0\t0\n");
    snprintf(tr, sizeof tr, "%s/short.tsv", d);
    pr = replay_trace((const char *[]){prof, "--timeline", tl, "--trace", tr, NULL});
    ck_assert_msg(pr.status == 1 && strstr(pr.err, "no whole iteration"), "%d %s", pr.status,
                  pr.err);
    tu_proc_free(&pr);
    put(d, "ops.tsv",
        "#ooc-profile\tops\t1\nidx\tstream\tkind\tname\tshape\tduration_ns\trefs\n"
        "0\t1\tkernel\tk1\tgrid=1,1,1\t2000000\t0:rw\n");
    pr = replay_trace((const char *[]){prof, "--timeline", tl, "--trace", tr, NULL});
    ck_assert_msg(pr.status == 2 && strstr(pr.err, "a timeline of 4 ops, the profile has 1"),
                  "%d %s", pr.status, pr.err);
    tu_proc_free(&pr);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", d);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

/* The same on a real replay: `mlp --layers 12` at 1/4 of its footprint on the simulated device's
 * timing model (short kernels, safe mode off), recorded, planned and replayed by `auto` with
 * FAKECUDA_TRACE on. Every plan op is found in every iteration, nothing is skipped, the
 * prediction is the one the shim printed, and in each iteration the compute engine's busy and
 * idle times add up to its length. */
START_TEST(test_replay_trace_follows_a_real_replay) {
    if (tu_under_valgrind())
        return;
    char d[] = "/tmp/ooc-rtrace-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(d));
    char pdir[96], trace[96], prof[64], plan[80];
    snprintf(prof, sizeof prof, "%s/prof", d);
    snprintf(pdir, sizeof pdir, "OOC_PROFILE_DIR=%s", prof);
    snprintf(trace, sizeof trace, "FAKECUDA_TRACE=%s/trace.tsv", d);
    snprintf(plan, sizeof plan, "%s/plan.tsv", prof);
    const char *const args[] = {"--layers", "12", "--iters", "12", "--time", NULL};
    const char *const env[] = {"FAKECUDA_SCHED=threaded",
                               "FAKECUDA_TIMING=1",
                               "FAKECUDA_GFLOPS=10",
                               "FAKECUDA_HBM_GBPS=66.67",
                               "FAKECUDA_H2D_GBPS=0.5333",
                               "FAKECUDA_D2H_GBPS=0.5333",
                               "FAKECUDA_LAUNCH_US=5",
                               "FAKECUDA_GRANULARITY=64K",
                               "FAKECUDA_HOST_VMM=0",
                               "FAKECUDA_MEM_BYTES=2195231",
                               "OOC_BUDGET=2195231",
                               "OOC_CHUNK=64K",
                               "OOC_SAFE=off",
                               "OOC_MODE=auto",
                               pdir,
                               trace,
                               NULL};
    tu_result_t r = tu_run_prog("workloads/mlp", args, 1, env, 120);
    ck_assert_msg(r.status == 0 && r.checksum[0], "%s", tu_tail(r.err, 3000));
    const char *said = strstr(r.err, "; predicted ");
    double predicted = said ? strtod(said + strlen("; predicted "), NULL) : 0;
    ck_assert_msg(predicted > 0 && strstr(r.err, "replaying"), "no plan replayed:\n%s",
                  tu_tail(r.err, 3000));
    tu_result_free(&r);
    snprintf(trace, sizeof trace, "%s/trace.tsv", d);
    tu_proc_t pr = replay_trace(
        (const char *[]){prof, "--plan", plan, "--trace", trace, "--iters", "4", NULL});
    ck_assert_msg(pr.status == 0, "status %d:\n%s%s", pr.status, pr.out, pr.err);
    int whole = 0;
    const char *w = strstr(pr.out, "ooc-replay-trace: ");
    ck_assert_msg(w && sscanf(w, "ooc-replay-trace: %d whole iterations", &whole) == 1 &&
                      whole >= 6,
                  "%s", pr.out);
    for (int it = whole - 4; it < whole; it++) {
        char first[16];
        double v[13];
        snprintf(first, sizeof first, "%d", it);
        ck_assert_int_eq(fields(pr.out, first, v, 13), 13);
        ck_assert_msg(v[12] == 0, "iteration %d: %g compute records not matched\n%s", it, v[12],
                      pr.out);
        ck_assert_msg(fabs(v[1] - predicted) < 0.002 * predicted, "predicted %g, the shim said %g",
                      v[1], predicted);
        double sum = v[3] + v[9] + v[10];
        ck_assert_msg(v[0] > 0 && fabs(sum - v[0]) < 0.001 * v[0] + 0.002,
                      "iteration %d: busy %g + idle %g + %g is not its %g ms\n%s", it, v[3], v[9],
                      v[10], v[0], pr.out);
        ck_assert_msg(v[5] > 0 && v[7] > 0 && v[6] > 0 && v[8] > 0, "no swaps:\n%s", pr.out);
    }
    fprintf(stderr, "%s", pr.out);
    tu_proc_free(&pr);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", d);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

Suite *suite_bench(void) {
    Suite *s = suite_create("bench");
    TCase *tc = tcase_create("bench_replay");
    tcase_set_timeout(tc, 180);
    tcase_add_test(tc, test_bench_replay_quick_run_prints_the_table);
    tcase_add_test(tc, test_bench_replay_failed_run_is_an_error);
    tcase_add_test(tc, test_bench_replay_staged_sets_the_stage_variable);
    tcase_add_test(tc, test_bench_replay_gated_prints_the_time_behind_gates);
    suite_add_tcase(s, tc);
    tc = tcase_create("replay_trace");
    tcase_set_timeout(tc, 180);
    tcase_add_test(tc, test_replay_trace_reports_a_made_up_replay_exactly);
    tcase_add_test(tc, test_replay_trace_follows_a_real_replay);
    suite_add_tcase(s, tc);
    return s;
}
