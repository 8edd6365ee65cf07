/* SPDX-License-Identifier: MIT */
/* check_framework.c: the framework-like workload (workloads/xfmr: lazily loaded CUkernels, GEMMs
 * through TMA descriptors, an explicitly built graph updated every step, 2D copies, a workspace
 * sized from cuMemGetInfo) under the shim.
 *
 * Its largest operation holds about a third of its footprint, so it runs at half of it (batch
 * 256, chunks of 64 KiB): in demand and auto, threaded with jitter and inline, safe mode on and
 * off, it must give the oracle's checksum with every launch's layout found, every graph launch's
 * buffers learned, and its TMA operands seen. The grouped GEMM that reaches its operands through
 * a table of pointers in device memory (the default, without --no-ptr-table) cannot be seen by
 * any launch-time scan: in safe mode it gets the oracle's bytes (every buffer has memory from
 * its allocation, resident or aliased to its host copy); without safe mode it must end in a
 * clear error, never wrong bytes. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testutil.h"

Suite *suite_framework(void);

#define RUN_TIMEOUT_S 120

static tu_result_t run_xfmr(int shim, int table, const char *const *env) {
    const char *const with[] = {"--iters", "4", "--batch", "256", NULL};
    const char *const without[] = {"--iters", "4", "--batch", "256", "--no-ptr-table", NULL};
    return tu_run_prog("workloads/xfmr", table ? with : without, shim, env, RUN_TIMEOUT_S);
}

static tu_result_t oracle(int table) {
    static const char *const env[] = {"FAKECUDA_SCHED=inline", "FAKECUDA_GRANULARITY=64K", NULL};
    tu_result_t r = run_xfmr(0, table, env);
    ck_assert_int_eq(r.status, 0);
    ck_assert_str_ne(r.checksum, "");
    return r;
}

/* Runs xfmr under the shim at `tenths` tenths of its footprint. */
static tu_result_t under_shim_at(const tu_result_t *ref, int table, const char *mode,
                                 const char *sched, unsigned seed, int safe, unsigned tenths) {
    char cap[64], budget[64], sch[64], jit[64], sd[64], md[64];
    unsigned long long b = ref->peak * tenths / 10;
    snprintf(cap, sizeof cap, "FAKECUDA_MEM_BYTES=%llu", b);
    snprintf(budget, sizeof budget, "OOC_BUDGET=%llu", b);
    snprintf(sch, sizeof sch, "FAKECUDA_SCHED=%s", sched);
    snprintf(jit, sizeof jit, "FAKECUDA_JITTER_US=%u", seed ? 20u : 0u);
    snprintf(sd, sizeof sd, "FAKECUDA_SEED=%u", seed ? seed : 1u);
    snprintf(md, sizeof md, "OOC_MODE=%s", mode);
    char dir[] = "/tmp/ooc-framework-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char pdir[96];
    snprintf(pdir, sizeof pdir, "OOC_PROFILE_DIR=%s", dir);
    const char *env[] = {safe ? "FAKECUDA_HOST_VMM=1" : "FAKECUDA_HOST_VMM=0",
                         cap,
                         budget,
                         sch,
                         jit,
                         sd,
                         md,
                         pdir,
                         "OOC_PROFILE_ITERS=1",
                         "OOC_STATS=1",
                         "OOC_CHUNK=64K",
                         "FAKECUDA_GRANULARITY=64K",
                         NULL};
    tu_result_t r = run_xfmr(1, table, env);
    char cmd[160];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    ck_assert_int_eq(system(cmd), 0);
    return r;
}

/* Runs xfmr under the shim at half its footprint. */
static tu_result_t under_shim(const tu_result_t *ref, int table, const char *mode,
                              const char *sched, unsigned seed, int safe) {
    return under_shim_at(ref, table, mode, sched, seed, safe, 5);
}

START_TEST(test_xfmr_matches_oracle_with_every_path_seen) {
    tu_result_t ref = oracle(0);
    unsigned seed = (unsigned)(tu_seed("test_xfmr_matches_oracle_with_every_path_seen") % 1000) + 1;
    static const char *const modes[] = {"demand", "auto"};
    for (int m = 0; m < 2; m++) {
        for (int safe = 1; safe >= 0; safe--) {
            for (int inl = 0; inl < 2; inl++) {
                tu_result_t r = under_shim(&ref, 0, modes[m], inl ? "inline" : "threaded",
                                           inl ? 0 : seed, safe);
                const char *what = inl ? "inline" : "threaded";
                ck_assert_msg(r.status == 0 && strcmp(r.checksum, ref.checksum) == 0,
                              "xfmr (%s, %s, safe mode %s): status %d, checksum %s, oracle %s\n%s",
                              modes[m], what, safe ? "on" : "off", r.status, r.checksum,
                              ref.checksum, tu_tail(r.err, 3000));
                ck_assert_int_eq(tu_stat_row(r.err, "launches with no parameter layout"), 0);
                ck_assert_int_eq(tu_stat_row(r.err, "graph launches with buffers not learned"), 0);
                ck_assert_int_gt(tu_stat_row(r.err, "operands found through TMA descriptors"), 0);
                tu_result_free(&r);
            }
        }
    }
    tu_result_free(&ref);
}
END_TEST

/* At 6/10 of its footprint a plan fits (at half, one op's own buffers do not). xfmr runs 256
 * GEMMs per attention pass on views of the same two buffers: a loop body that repeats exactly,
 * which the detector must not take for the iteration (it once did, and the shim then recorded,
 * planned, diverged and recorded again for the whole run). */
START_TEST(test_xfmr_auto_replays_the_whole_iteration) {
    tu_result_t ref = oracle(0);
    for (int safe = 1; safe >= 0; safe--) {
        for (int inl = 0; inl < 2; inl++) {
            tu_result_t r =
                under_shim_at(&ref, 0, "auto", inl ? "inline" : "threaded", inl ? 0 : 7, safe, 6);
            const char *what = inl ? "inline" : "threaded";
            ck_assert_msg(r.status == 0 && strcmp(r.checksum, ref.checksum) == 0,
                          "xfmr (auto, %s, safe mode %s): status %d, checksum %s, oracle %s\n%s",
                          what, safe ? "on" : "off", r.status, r.checksum, ref.checksum,
                          tu_tail(r.err, 3000));
            const char *rec = strstr(r.err, "profile recorded in ");
            const char *ops = rec ? strstr(rec, ": ") : NULL;
            long n = ops ? strtol(ops + 2, NULL, 10) : 0;
            ck_assert_msg(n > 1000 && strstr(ops, " ops, ") == strstr(ops, " ops") &&
                              strstr(rec + 1, "profile recorded in ") == NULL,
                          "xfmr (auto, %s, safe mode %s): recorded %ld ops, not once the whole "
                          "iteration:\n%s",
                          what, safe ? "on" : "off", n, tu_tail(r.err, 3000));
            ck_assert_int_gt(tu_stat_row(r.err, "operations run as planned"), 1000);
            ck_assert_int_eq(tu_stat_row(r.err, "re-recordings after divergence"), 0);
            ck_assert_msg(strstr(r.err, "no profile written") == NULL, "%s", tu_tail(r.err, 3000));
            tu_result_free(&r);
        }
    }
    tu_result_free(&ref);
}
END_TEST

/* In safe mode a new buffer has device memory from its allocation (as cuMemAlloc's), so the
 * grouped GEMM that reaches its operands only through a table of pointers in device memory
 * finds them, resident or aliased to their host copies, never unmapped: the oracle's bytes
 * (it once faulted on an output no op the shim saw had used yet). */
START_TEST(test_xfmr_pointer_table_in_safe_mode_matches_oracle) {
    tu_result_t ref = oracle(1);
    static const char *const modes[] = {"demand", "auto"};
    for (int m = 0; m < 2; m++) {
        for (int inl = 0; inl < 2; inl++) {
            tu_result_t r =
                under_shim(&ref, 1, modes[m], inl ? "inline" : "threaded", inl ? 0 : 5, 1);
            ck_assert_msg(r.status == 0 && strcmp(r.checksum, ref.checksum) == 0,
                          "xfmr with its pointer table (%s, %s, safe mode on): status %d, checksum "
                          "%s, oracle %s\n%s",
                          modes[m], inl ? "inline" : "threaded", r.status, r.checksum, ref.checksum,
                          tu_tail(r.err, 3000));
            tu_result_free(&r);
        }
    }
    tu_result_free(&ref);
}
END_TEST

START_TEST(test_xfmr_pointer_table_without_safe_mode_is_a_clear_error) {
    tu_result_t ref = oracle(1);
    tu_result_t r = under_shim(&ref, 1, "demand", "inline", 0, 0);
    ck_assert_msg(r.status != 0 || strcmp(r.checksum, ref.checksum) == 0,
                  "wrong bytes: checksum %s, oracle %s", r.checksum, ref.checksum);
    if (r.status != 0)
        ck_assert_msg(strstr(r.err, "illegal address") != NULL, "no clear error:\n%s",
                      tu_tail(r.err, 3000));
    tu_result_free(&r);
    tu_result_free(&ref);
}
END_TEST

/* Fails the Nth call of `api` xfmr makes under the shim (auto, half its footprint, a plan
 * replayed after the first iteration), for every N up to 12 and then about 12 more spread over
 * the rest: each run ends with the oracle's checksum or a clean driver error (exit 2), and
 * leaves nothing behind. */
static void fault_loop(const char *api) {
    tu_result_t ref = oracle(0);
    char stats[] = "/tmp/ooc-framework-stats-XXXXXX";
    int fd = mkstemp(stats);
    ck_assert_int_ge(fd, 0);
    close(fd);
    char dir[] = "/tmp/ooc-framework-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char st[128], pdir[96], cap[64], budget[64], key[96], fail[128];
    snprintf(st, sizeof st, "FAKECUDA_STATS=%s", stats);
    snprintf(pdir, sizeof pdir, "OOC_PROFILE_DIR=%s", dir);
    snprintf(cap, sizeof cap, "FAKECUDA_MEM_BYTES=%llu", ref.peak / 2);
    snprintf(budget, sizeof budget, "OOC_BUDGET=%llu", ref.peak / 2);
    snprintf(key, sizeof key, "calls.%s", api);
    const char *env[] = {st,
                         pdir,
                         cap,
                         budget,
                         "OOC_MODE=auto",
                         "OOC_PROFILE_ITERS=1",
                         "OOC_CHUNK=64K",
                         "FAKECUDA_GRANULARITY=64K",
                         "FAKECUDA_HOST_VMM=0",
                         NULL,
                         NULL};
    tu_result_t r = run_xfmr(1, 0, env);
    ck_assert_msg(r.status == 0 && strcmp(r.checksum, ref.checksum) == 0,
                  "without a fault: status %d\n%s", r.status, tu_tail(r.err, 2000));
    tu_result_free(&r);
    long long calls = tu_fc_stat(stats, key);
    ck_assert_msg(calls > 0, "xfmr makes no call of %s", api);
    long long every = 12, stride = calls > 2 * every ? calls / every : 1;
    for (long long n = 1; n <= calls; n += n < every ? 1 : stride) {
        snprintf(fail, sizeof fail, "FAKECUDA_FAIL=%s@%lld", api, n);
        env[9] = fail;
        r = run_xfmr(1, 0, env);
        tu_assert_fault_outcome(&r, ref.checksum, stats, fail + strlen("FAKECUDA_FAIL="));
        tu_result_free(&r);
    }
    tu_result_free(&ref);
    unlink(stats);
    char cmd[160];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    ck_assert_int_eq(system(cmd), 0);
}

START_TEST(test_fault_in_tensor_map_encoding_is_clean) {
    fault_loop("cuTensorMapEncodeTiled");
    fault_loop("cuTensorMapReplaceAddress");
}
END_TEST

START_TEST(test_fault_in_explicit_graph_building_is_clean) {
    fault_loop("cuGraphAddKernelNode");
    fault_loop("cuGraphAddMemcpyNode");
    fault_loop("cuGraphAddChildGraphNode");
    fault_loop("cuGraphExecKernelNodeSetParams");
}
END_TEST

START_TEST(test_fault_in_2d_copies_is_clean) {
    fault_loop("cuMemcpy2DAsync");
}
END_TEST

Suite *suite_framework(void) {
    Suite *s = suite_create("framework");
    TCase *tc = tcase_create("xfmr");
    tcase_set_timeout(tc, 900);
    tcase_add_test(tc, test_xfmr_matches_oracle_with_every_path_seen);
    tcase_add_test(tc, test_xfmr_pointer_table_without_safe_mode_is_a_clear_error);
    tcase_add_test(tc, test_xfmr_pointer_table_in_safe_mode_matches_oracle);
    tcase_add_test(tc, test_xfmr_auto_replays_the_whole_iteration);
    suite_add_tcase(s, tc);
    tc = tcase_create("faults");
    tcase_set_timeout(tc, tu_under_valgrind() ? 36000 : 900);
    tcase_add_test(tc, test_fault_in_tensor_map_encoding_is_clean);
    tcase_add_test(tc, test_fault_in_explicit_graph_building_is_clean);
    tcase_add_test(tc, test_fault_in_2d_copies_is_clean);
    suite_add_tcase(s, tc);
    return s;
}
