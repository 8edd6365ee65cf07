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
 * any launch-time scan: without safe mode it must end in a clear error, never wrong bytes. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* Runs xfmr under the shim at half its footprint. */
static tu_result_t under_shim(const tu_result_t *ref, int table, const char *mode,
                              const char *sched, unsigned seed, int safe) {
    char cap[64], budget[64], sch[64], jit[64], sd[64], md[64];
    unsigned long long b = ref->peak / 2;
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
                ck_assert_int_eq(
                    tu_stat_row(r.err, "graph launches whose buffers were not learned"), 0);
                ck_assert_int_gt(tu_stat_row(r.err, "operands found through TMA descriptors"), 0);
                tu_result_free(&r);
            }
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

Suite *suite_framework(void) {
    Suite *s = suite_create("framework");
    TCase *tc = tcase_create("xfmr");
    tcase_set_timeout(tc, 900);
    tcase_add_test(tc, test_xfmr_matches_oracle_with_every_path_seen);
    tcase_add_test(tc, test_xfmr_pointer_table_without_safe_mode_is_a_clear_error);
    suite_add_tcase(s, tc);
    return s;
}
