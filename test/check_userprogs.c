/* SPDX-License-Identifier: MIT */
/* check_userprogs.c: driver-API programs written the way users write them, doing what the shim
 * must survive (fork, exit handlers, modules unloaded and loaded again, wide batched copies),
 * produce under the shim exactly what they produce without it.
 *
 * Each program (test/progs) is first run without the shim on an unlimited simulated device (the
 * oracle: its whole standard output, and its peak device memory from FAKECUDA_STATS); then under
 * the shim at a quarter of that peak, in demand and auto modes, threaded with jitter and inline,
 * with safe mode on and off: every run must exit 0 with the oracle's standard output, byte for
 * byte, leave no device memory behind, and touch no unmapped range. Every run has a timeout. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testutil.h"

Suite *suite_userprogs(void);

#define RUN_TIMEOUT_S 60

static char *tmp_file(void) {
    char *path = strdup("/tmp/ooc-userprog-XXXXXX");
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    close(fd);
    return path;
}

/* The oracle: prog without the shim, inline, on an unlimited device. Returns its run; *peak is
 * its peak device memory. */
static tu_result_t oracle(const char *prog, const char *const *args, unsigned long long *peak) {
    char *stats = tmp_file();
    char st[128];
    snprintf(st, sizeof st, "FAKECUDA_STATS=%s", stats);
    const char *env[] = {st, "FAKECUDA_SCHED=inline", "FAKECUDA_GRANULARITY=64K", NULL};
    tu_result_t r = tu_run_prog(prog, args, 0, env, RUN_TIMEOUT_S);
    ck_assert_msg(r.status == 0, "%s without the shim: status %d\n%s", prog, r.status,
                  tu_tail(r.err, 2000));
    long long p = tu_fc_stat(stats, "device_peak_bytes");
    ck_assert_msg(p > 0, "%s: no peak in FAKECUDA_STATS", prog);
    *peak = (unsigned long long)p;
    unlink(stats);
    free(stats);
    return r;
}

/* Runs prog under the shim at budget = capacity = peak / 4 in `mode`, `sched` (jitter seeded by
 * `seed` when not 0), safe mode on or off, and checks it against the oracle's output. */
static void check_one(const char *prog, const char *const *args, const tu_result_t *ref,
                      unsigned long long peak, const char *mode, const char *sched, unsigned seed,
                      int safe) {
    char cap[64], budget[64], sch[64], jit[64], sd[64], md[64], st[128], pdir[96];
    unsigned long long b = peak / 4;
    char *stats = tmp_file();
    char dir[] = "/tmp/ooc-userprog-prof-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(cap, sizeof cap, "FAKECUDA_MEM_BYTES=%llu", b);
    snprintf(budget, sizeof budget, "OOC_BUDGET=%llu", b);
    snprintf(sch, sizeof sch, "FAKECUDA_SCHED=%s", sched);
    snprintf(jit, sizeof jit, "FAKECUDA_JITTER_US=%u", seed ? 20u : 0u);
    snprintf(sd, sizeof sd, "FAKECUDA_SEED=%u", seed ? seed : 1u);
    snprintf(md, sizeof md, "OOC_MODE=%s", mode);
    snprintf(st, sizeof st, "FAKECUDA_STATS=%s", stats);
    snprintf(pdir, sizeof pdir, "OOC_PROFILE_DIR=%s", dir);
    const char *env[] = {safe ? "FAKECUDA_HOST_VMM=1" : "FAKECUDA_HOST_VMM=0",
                         cap,
                         budget,
                         sch,
                         jit,
                         sd,
                         md,
                         st,
                         pdir,
                         "OOC_PROFILE_ITERS=2",
                         "OOC_CHUNK=64K",
                         "FAKECUDA_GRANULARITY=64K",
                         NULL};
    tu_result_t r = tu_run_prog(prog, args, 1, env, RUN_TIMEOUT_S);
    ck_assert_msg(r.status == 0, "%s (%s, %s, seed %u, safe mode %s) at %llu bytes: status %d\n%s",
                  prog, mode, sched, seed, safe ? "on" : "off", b, r.status, tu_tail(r.err, 3000));
    ck_assert_msg(strcmp(r.out, ref->out) == 0,
                  "%s (%s, %s, seed %u, safe mode %s): output differs from the run without the "
                  "shim:\n--- without\n%s\n--- with\n%s\n--- log\n%s",
                  prog, mode, sched, seed, safe ? "on" : "off", tu_tail(ref->out, 1500),
                  tu_tail(r.out, 1500), tu_tail(r.err, 2000));
    static const char *const left[] = {"allocs_live", "mappings_live", "strict_violations",
                                       "illegal_accesses"};
    for (size_t i = 0; i < sizeof left / sizeof left[0]; i++) {
        long long v = tu_fc_stat(stats, left[i]);
        ck_assert_msg(v == 0, "%s (%s, %s, safe mode %s): %s = %lld after exit", prog, mode, sched,
                      safe ? "on" : "off", left[i], v);
    }
    tu_result_free(&r);
    unlink(stats);
    free(stats);
    char cmd[160];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    ck_assert_int_eq(system(cmd), 0);
}

/* The whole matrix for one program: demand and auto, threaded with jitter and inline, safe mode
 * on and off. */
static void check_prog(const char *prog, const char *const *args, const char *test) {
    unsigned long long peak = 0;
    tu_result_t ref = oracle(prog, args, &peak);
    unsigned seed = (unsigned)(tu_seed(test) % 1000) + 1;
    static const char *const modes[] = {"demand", "auto"};
    for (int m = 0; m < 2; m++) {
        for (int safe = 1; safe >= 0; safe--) {
            check_one(prog, args, &ref, peak, modes[m], "threaded", seed, safe);
            check_one(prog, args, &ref, peak, modes[m], "inline", 0, safe);
        }
    }
    tu_result_free(&ref);
}

START_TEST(test_fork_child_runs_and_exits_and_driver_refuses_it) {
    static const char *const args[] = {"--iters", "8", NULL};
    check_prog("test/progs/forkprog", args, "test_fork_child_runs_and_exits_and_driver_refuses_it");
    /* The oracle itself shows what the driver answers a forked child. */
    unsigned long long peak;
    tu_result_t ref = oracle("test/progs/forkprog", args, &peak);
    ck_assert_ptr_nonnull(strstr(ref.out, "child A: exited 0"));
    ck_assert_ptr_nonnull(strstr(ref.out, "child B: cuMemAlloc: CUDA_ERROR_NOT_INITIALIZED"));
    ck_assert_ptr_nonnull(strstr(ref.out, "child B: exited 0"));
    tu_result_free(&ref);
}
END_TEST

Suite *suite_userprogs(void) {
    Suite *s = suite_create("userprogs");
    TCase *tc = tcase_create("fork");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_fork_child_runs_and_exits_and_driver_refuses_it);
    suite_add_tcase(s, tc);
    return s;
}
