/* SPDX-License-Identifier: MIT */
/* check_userprogs.c: driver-API programs written the way users write them, doing what the shim
 * must survive (fork, exit handlers, modules unloaded and loaded again, wide batched copies, 1D
 * and 3D), produce under the shim exactly what they produce without it.
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
    /* These programs exit, fork and unload on purpose without freeing what the simulated driver
     * holds: in the sanitizer build, LeakSanitizer would turn the oracle's exit status into 1. */
    const char *env[] = {st, "FAKECUDA_SCHED=inline", "FAKECUDA_GRANULARITY=64K",
                         "ASAN_OPTIONS=detect_leaks=0", NULL};
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
                         "ASAN_OPTIONS=detect_leaks=0", /* as in oracle() */
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

START_TEST(test_exit_handlers_read_device_memory_before_the_shim_lets_go) {
    static const char *const args[] = {"--iters", "8", NULL};
    check_prog("test/progs/exitprog", args,
               "test_exit_handlers_read_device_memory_before_the_shim_lets_go");
    unsigned long long peak;
    tu_result_t ref = oracle("test/progs/exitprog", args, &peak);
    ck_assert_ptr_nonnull(strstr(ref.out, "atexit: ok\ndestructor: ok\n"));
    tu_result_free(&ref);
}
END_TEST

START_TEST(test_modules_unloaded_and_loaded_again_with_reused_handles) {
    static const char *const args[] = {"--iters", "8", NULL};
    check_prog("test/progs/modprog", args,
               "test_modules_unloaded_and_loaded_again_with_reused_handles");
    /* The simulated driver did hand out a freed function's handle again: the test bites. */
    unsigned long long peak;
    tu_result_t ref = oracle("test/progs/modprog", args, &peak);
    ck_assert_ptr_nonnull(strstr(ref.out, "handles reused: yes\nhandles swapped: yes"));
    tu_result_free(&ref);
}
END_TEST

START_TEST(test_wide_batched_copies_are_split) {
    static const char *const args[] = {"--iters", "5", NULL};
    check_prog("test/progs/batchprog", args, "test_wide_batched_copies_are_split");
}
END_TEST

START_TEST(test_wide_batched_3d_copies_are_split) {
    static const char *const args[] = {"--iters", "5", "--3d", NULL};
    check_prog("test/progs/batchprog", args, "test_wide_batched_3d_copies_are_split");
}
END_TEST

START_TEST(test_producer_with_host_side_effect_is_launched_as_often_as_the_program_does) {
    static const char *const args[] = {"--iters", "8", NULL};
    check_prog("test/progs/sideprog", args,
               "test_producer_with_host_side_effect_is_launched_as_often_as_the_program_does");
}
END_TEST

START_TEST(test_wrong_calls_end_pointers_and_pointer_attributes_as_the_driver_answers) {
    static const char *const args[] = {"--iters", "6", NULL};
    check_prog("test/progs/boundsprog", args,
               "test_wrong_calls_end_pointers_and_pointer_attributes_as_the_driver_answers");
    /* The oracle shows the driver refusing every wrong call, so the comparison bites. */
    unsigned long long peak;
    tu_result_t ref = oracle("test/progs/boundsprog", args, &peak);
    ck_assert_ptr_null(strstr(ref.out, "CUDA_SUCCESS\n"));
    ck_assert_ptr_nonnull(strstr(ref.out, "memset 2D past the end: CUDA_ERROR_INVALID_VALUE\n"));
    ck_assert_ptr_nonnull(strstr(ref.out, "buffers intact after the wrong calls: yes\n"
                                          "end pointers: every byte right\n"));
    ck_assert_ptr_null(strstr(ref.out, ": no\n"));
    tu_result_free(&ref);
}
END_TEST

START_TEST(test_stream_memory_operations_on_buffers_that_move) {
    static const char *const args[] = {"--iters", "6", NULL};
    check_prog("test/progs/memopprog", args, "test_stream_memory_operations_on_buffers_that_move");
}
END_TEST

/* The error-path rule over every hooked entry point (shim/hooks.def): each refused call gets the
 * driver's own answer, the same in every iteration, and changes nothing: every byte right, and
 * the recorded iteration holds the program's 24 launches only. */
START_TEST(test_every_hook_refuses_bad_arguments_as_the_driver_and_changes_nothing) {
    static const char *const args[] = {"--iters", "8", NULL};
    check_prog("test/progs/badcalls", args,
               "test_every_hook_refuses_bad_arguments_as_the_driver_and_changes_nothing");
    unsigned long long peak;
    tu_result_t ref = oracle("test/progs/badcalls", args, &peak);
    ck_assert_ptr_null(strstr(ref.out, "NO CASE"));
    ck_assert_ptr_null(strstr(ref.out, ": CUDA_SUCCESS\n"));
    ck_assert_ptr_nonnull(strstr(ref.out, "answers the same in every iteration: yes\n"
                                          "every byte right: yes\n"));
    char cap[64], budget[64];
    snprintf(cap, sizeof cap, "FAKECUDA_MEM_BYTES=%llu", peak / 4);
    snprintf(budget, sizeof budget, "OOC_BUDGET=%llu", peak / 4);
    char dir[] = "/tmp/ooc-userprog-prof-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char pdir[96];
    snprintf(pdir, sizeof pdir, "OOC_PROFILE_DIR=%s", dir);
    const char *env[] = {cap,
                         budget,
                         pdir,
                         "OOC_MODE=auto",
                         "OOC_PROFILE_ITERS=2",
                         "OOC_CHUNK=64K",
                         "FAKECUDA_GRANULARITY=64K",
                         "ASAN_OPTIONS=detect_leaks=0",
                         NULL};
    tu_result_t r = tu_run_prog("test/progs/badcalls", args, 1, env, RUN_TIMEOUT_S);
    ck_assert_msg(r.status == 0, "auto: status %d\n%s", r.status, tu_tail(r.err, 2000));
    ck_assert_msg(strstr(r.err, ": 24 ops, 24 buffers per iteration") != NULL,
                  "refused calls were recorded as operations:\n%s", tu_tail(r.err, 2000));
    ck_assert_ptr_nonnull(strstr(r.err, "replaying"));
    tu_result_free(&r);
    tu_result_free(&ref);
    char cmd[160];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

/* Fails the Nth call of `api` that `prog` makes, under the shim in auto mode at a quarter of its
 * footprint (for modprog, a plan is being replayed when the first unload comes), for every N up
 * to `every` and then for about `every` more spread over the rest: each run ends with the
 * oracle's checksum or a clean driver error (exit 2), and leaves nothing behind. `option`: one
 * more argument for prog, or NULL. */
static void fault_loop(const char *prog, const char *api, const char *iters, long long every,
                       const char *option) {
    const char *const args[] = {"--iters", iters, option, NULL};
    unsigned long long peak = 0;
    tu_result_t ref = oracle(prog, args, &peak);
    char *stats = tmp_file();
    char dir[] = "/tmp/ooc-userprog-prof-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char st[128], pdir[96], cap[64], budget[64], key[96], fail[128];
    snprintf(st, sizeof st, "FAKECUDA_STATS=%s", stats);
    snprintf(pdir, sizeof pdir, "OOC_PROFILE_DIR=%s", dir);
    snprintf(cap, sizeof cap, "FAKECUDA_MEM_BYTES=%llu", peak / 4);
    snprintf(budget, sizeof budget, "OOC_BUDGET=%llu", peak / 4);
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
                         "ASAN_OPTIONS=detect_leaks=0", /* as in oracle() */
                         NULL,
                         NULL};
    tu_result_t r = tu_run_prog(prog, args, 1, env, RUN_TIMEOUT_S);
    ck_assert_msg(r.status == 0 && strcmp(r.checksum, ref.checksum) == 0,
                  "without a fault: status %d\n%s", r.status, tu_tail(r.err, 2000));
    tu_result_free(&r);
    long long calls = tu_fc_stat(stats, key);
    ck_assert_int_gt(calls, 0);
    long long stride = calls > 2 * every ? calls / every : 1;
    for (long long n = 1; n <= calls; n += n < every ? 1 : stride) {
        snprintf(fail, sizeof fail, "FAKECUDA_FAIL=%s@%lld", api, n);
        env[10] = fail;
        r = tu_run_prog(prog, args, 1, env, RUN_TIMEOUT_S);
        tu_assert_fault_outcome(&r, ref.checksum, stats, fail + strlen("FAKECUDA_FAIL="));
        tu_result_free(&r);
    }
    tu_result_free(&ref);
    unlink(stats);
    free(stats);
    char cmd[160];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    ck_assert_int_eq(system(cmd), 0);
}

START_TEST(test_fault_in_module_unload_is_clean) {
    fault_loop("test/progs/modprog", "cuModuleUnload", "4", 1000, NULL);
}
END_TEST

START_TEST(test_fault_in_module_load_is_clean) {
    fault_loop("test/progs/modprog", "cuModuleLoadData", "4", 1000, NULL);
}
END_TEST

/* The split batches: a part that fails ends the call with its error. Sampled: a run makes
 * hundreds of parts. */
START_TEST(test_fault_in_split_batch_is_clean) {
    fault_loop("test/progs/batchprog", "cuMemcpyBatchAsync", "1", 8, NULL);
}
END_TEST

/* The same for the split 3D batches. */
START_TEST(test_fault_in_split_3d_batch_is_clean) {
    fault_loop("test/progs/batchprog", "cuMemcpy3DBatchAsync", "1", 8, "--3d");
}
END_TEST

Suite *suite_userprogs(void) {
    Suite *s = suite_create("userprogs");
    TCase *tc = tcase_create("fork");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_fork_child_runs_and_exits_and_driver_refuses_it);
    suite_add_tcase(s, tc);
    tc = tcase_create("exit");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_exit_handlers_read_device_memory_before_the_shim_lets_go);
    suite_add_tcase(s, tc);
    tc = tcase_create("modules");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_modules_unloaded_and_loaded_again_with_reused_handles);
    suite_add_tcase(s, tc);
    tc = tcase_create("batch");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_wide_batched_copies_are_split);
    tcase_add_test(tc, test_wide_batched_3d_copies_are_split);
    suite_add_tcase(s, tc);
    tc = tcase_create("side_effects");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc,
                   test_producer_with_host_side_effect_is_launched_as_often_as_the_program_does);
    suite_add_tcase(s, tc);
    tc = tcase_create("bounds");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_wrong_calls_end_pointers_and_pointer_attributes_as_the_driver_answers);
    suite_add_tcase(s, tc);
    tc = tcase_create("memops");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_stream_memory_operations_on_buffers_that_move);
    suite_add_tcase(s, tc);
    tc = tcase_create("error_path");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_every_hook_refuses_bad_arguments_as_the_driver_and_changes_nothing);
    suite_add_tcase(s, tc);
    tc = tcase_create("faults");
    tcase_set_timeout(tc, tu_under_valgrind() ? 36000 : 600);
    tcase_add_test(tc, test_fault_in_module_unload_is_clean);
    tcase_add_test(tc, test_fault_in_module_load_is_clean);
    tcase_add_test(tc, test_fault_in_split_batch_is_clean);
    tcase_add_test(tc, test_fault_in_split_3d_batch_is_clean);
    suite_add_tcase(s, tc);
    return s;
}
