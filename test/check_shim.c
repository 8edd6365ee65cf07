/* SPDX-License-Identifier: MIT */
/* check_shim.c: the shim, preloaded into unmodified programs on the simulated device, keeps them
 * correct: the same checksum, bit for bit, as without the shim on an unlimited device, at budgets
 * far below their footprint; every way of reaching the driver is intercepted; bad configuration,
 * impossible budgets and driver faults end cleanly.
 *
 * Tests run the programs as children with LD_PRELOAD. Under a sanitizer build the runtime must
 * come first in LD_PRELOAD, so the runner's own libasan is put in front when it has one. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testutil.h"

Suite *suite_shim(void);

/* Extra arguments per workload: a deeper mlp and cnn, so that one op is small against the
 * footprint (cnn --blocks 3: the largest op is 14% of it). */
static int plain_mlp; /* the fault loops use the default (3-layer) mlp: fewer calls to fail */
static const char *workload_arg(const char *name, int i) {
    static const char *const mlp[] = {"--layers", "12"};
    static const char *const cnn[] = {"--blocks", "3"};
    if (i >= 2)
        return NULL;
    if (!plain_mlp && strcmp(name, "workloads/mlp") == 0)
        return mlp[i];
    return strcmp(name, "workloads/cnn") == 0 ? cnn[i] : NULL;
}

/* Runs build/<name> --iters 3 with the extra environment (NULL-terminated). */
static tu_result_t run_workload(const char *name, int shim, const char *const *extra) {
    const char *const args[] = {"--iters", "3", workload_arg(name, 0), workload_arg(name, 1), NULL};
    return tu_run_prog(name, args, shim, extra, 120);
}

/* The oracle: the workload without the shim on an unlimited simulated device. */
static tu_result_t oracle(const char *name) {
    static const char *const env[] = {"FAKECUDA_SCHED=inline", NULL};
    tu_result_t r = run_workload(name, 0, env);
    ck_assert_int_eq(r.status, 0);
    ck_assert_str_ne(r.checksum, "");
    return r;
}

static int no_host_vmm; /* run without host-located VMM memory: safe mode off */

/* Runs `name` under the shim at budget = capacity = peak / div, and checks the checksum. */
static void check_under_budget(const char *name, unsigned div, const char *sched,
                               unsigned jitter_seed) {
    tu_result_t ref = oracle(name);
    tu_result_free(&ref);
    char cap[64], budget[64], sch[64], jit[64], seed[64];
    unsigned long long b = ref.peak / div;
    snprintf(cap, sizeof cap, "FAKECUDA_MEM_BYTES=%llu", b);
    snprintf(budget, sizeof budget, "OOC_BUDGET=%llu", b);
    snprintf(sch, sizeof sch, "FAKECUDA_SCHED=%s", sched);
    snprintf(jit, sizeof jit, "FAKECUDA_JITTER_US=%u", jitter_seed ? 20u : 0u);
    snprintf(seed, sizeof seed, "FAKECUDA_SEED=%u", jitter_seed);
    /* Small workloads get small chunks, so that a quarter of their footprint is many chunks. */
    int small = ref.peak < (64ull << 20);
    const char *env[] = {no_host_vmm ? "FAKECUDA_HOST_VMM=0" : "FAKECUDA_HOST_VMM=1",
                         cap,
                         budget,
                         sch,
                         jit,
                         seed,
                         "OOC_MODE=demand",
                         "OOC_STATS=1",
                         small ? "OOC_CHUNK=64K" : "OOC_CHUNK=2M",
                         small ? "FAKECUDA_GRANULARITY=64K" : "FAKECUDA_GRANULARITY=2M",
                         NULL};
    tu_result_t r = run_workload(name, 1, env);
    ck_assert_msg(r.status == 0, "%s at 1/%u of %llu bytes (%s, seed %u): status %d\n%s", name, div,
                  ref.peak, sched, jitter_seed, r.status, r.err);
    ck_assert_msg(strcmp(r.checksum, ref.checksum) == 0, "%s at 1/%u: checksum %s, oracle %s", name,
                  div, r.checksum, ref.checksum);
    ck_assert_msg(strstr(r.err, "swap-outs") != NULL, "no statistics table:\n%s", r.err);
    tu_result_free(&r);
}

START_TEST(test_mlp_matches_oracle_at_quarter_budget) {
    check_under_budget("workloads/mlp", 4, "threaded", 0);
    check_under_budget("workloads/mlp", 4, "inline", 0);
}
END_TEST

START_TEST(test_cnn_matches_oracle_at_quarter_budget) {
    check_under_budget("workloads/cnn", 4, "threaded", 0);
    check_under_budget("workloads/cnn", 4, "inline", 0);
}
END_TEST

START_TEST(test_large_matches_oracle_at_quarter_and_eighth_budget) {
    check_under_budget("workloads/large", 4, "threaded", 0);
    check_under_budget("workloads/large", 8, "threaded", 0);
    check_under_budget("workloads/large", 8, "inline", 0);
}
END_TEST

START_TEST(test_workloads_match_oracle_with_jitter) {
    unsigned seed = (unsigned)(tu_seed("test_workloads_match_oracle_with_jitter") % 1000) + 1;
    check_under_budget("workloads/mlp", 4, "threaded", seed);
    check_under_budget("workloads/cnn", 4, "threaded", seed + 1);
    check_under_budget("workloads/large", 8, "threaded", seed + 2);
}
END_TEST

START_TEST(test_off_mode_passes_through) {
    static const char *const names[] = {"workloads/mlp", "workloads/cnn", "workloads/large"};
    for (int i = 0; i < 3; i++) {
        tu_result_t ref = oracle(names[i]);
        static const char *const env[] = {"OOC_MODE=off", NULL};
        tu_result_t r = run_workload(names[i], 1, env);
        ck_assert_int_eq(r.status, 0);
        ck_assert_str_eq(r.checksum, ref.checksum);
        tu_result_free(&ref);
        tu_result_free(&r);
    }
}
END_TEST

/* Removes the line that starts with `prefix` (the preload itself) from s, in place. */
static void drop_line(char *s, const char *prefix) {
    char *l = strstr(s, prefix);
    if (!l)
        return;
    char *nl = strchr(l, '\n');
    memmove(l, nl ? nl + 1 : l + strlen(l), strlen(nl ? nl + 1 : l + strlen(l)) + 1);
}

/* OOC_MODE=off changes nothing in the process: the environment a program sees (the framework
 * defaults are not set) and every driver answer are those of a run without the shim. The same
 * probe in the default mode does see the defaults, so the comparison can fail. */
START_TEST(test_off_mode_changes_neither_environment_nor_driver_answers) {
    char probe[4096]; /* tu_build_path's buffers are reused after 8 calls */
    snprintf(probe, sizeof probe, "%s", tu_build_path("test/progs/probe"));
    const char *argv[] = {probe, "answers", NULL};
    const char *plain[] = {tu_fakecuda_libpath(), "FAKECUDA_MEM_BYTES=64M", "OOC_MODE=off", NULL};
    const char *off[] = {tu_fakecuda_libpath(), tu_shim_preload(), "FAKECUDA_MEM_BYTES=64M",
                         "OOC_MODE=off", NULL};
    const char *off_spaced[] = {tu_fakecuda_libpath(), tu_shim_preload(), "FAKECUDA_MEM_BYTES=64M",
                                "OOC_MODE= Off ", NULL};
    const char *on[] = {tu_fakecuda_libpath(), tu_shim_preload(), "FAKECUDA_MEM_BYTES=64M",
                        "OOC_MODE=demand",     "OOC_BUDGET=16M",  NULL};
    tu_proc_t a, b, c, d;
    ck_assert_int_eq(tu_run(argv, plain, 30, &a), 0);
    ck_assert_int_eq(tu_run(argv, off, 30, &b), 0);
    ck_assert_int_eq(tu_run(argv, on, 30, &c), 0);
    ck_assert_msg(a.status == 0 && b.status == 0 && c.status == 0, "%s\n%s\n%s", a.err, b.err,
                  c.err);
    drop_line(b.out, "env: LD_PRELOAD=");
    drop_line(c.out, "env: LD_PRELOAD=");
    ck_assert_msg(strstr(a.out, "answer: after free") != NULL, "%s", a.out);
    ck_assert_msg(strcmp(a.out, b.out) == 0, "OOC_MODE=off changed something:\n%s\n---\n%s", a.out,
                  b.out);
    ck_assert_ptr_null(strstr(b.out, "PYTORCH_NO_CUDA_MEMORY_CACHING"));
    ck_assert_ptr_nonnull(strstr(c.out, "env: PYTORCH_NO_CUDA_MEMORY_CACHING=1"));
    ck_assert_ptr_nonnull(strstr(c.out, "env: XLA_PYTHON_CLIENT_ALLOCATOR=platform"));
    ck_assert_ptr_nonnull(strstr(c.out, "env: XLA_FLAGS=--xla_gpu_enable_command_buffer=\n"));
    /* XLA_FLAGS: the user's flags kept, the command buffers' flag added after them, and a
     * user's own choice of command buffers left alone. */
    const char *xla_more[] = {tu_fakecuda_libpath(),
                              tu_shim_preload(),
                              "FAKECUDA_MEM_BYTES=64M",
                              "OOC_BUDGET=16M",
                              "XLA_FLAGS=--xla_dump_to=/tmp/x",
                              NULL};
    ck_assert_int_eq(tu_run(argv, xla_more, 30, &d), 0);
    ck_assert_msg(
        strstr(d.out, "env: XLA_FLAGS=--xla_dump_to=/tmp/x --xla_gpu_enable_command_buffer=\n"),
        "%s", d.out);
    tu_proc_free(&d);
    const char *xla_own[] = {tu_fakecuda_libpath(),
                             tu_shim_preload(),
                             "FAKECUDA_MEM_BYTES=64M",
                             "OOC_BUDGET=16M",
                             "XLA_FLAGS=--xla_gpu_enable_command_buffer=FUSION",
                             NULL};
    ck_assert_int_eq(tu_run(argv, xla_own, 30, &d), 0);
    ck_assert_ptr_nonnull(strstr(d.out, "env: XLA_FLAGS=--xla_gpu_enable_command_buffer=FUSION\n"));
    tu_proc_free(&d);
    /* The mode is read as the option parser reads it (case and spaces do not matter). */
    ck_assert_int_eq(tu_run(argv, off_spaced, 30, &d), 0);
    ck_assert_int_eq(d.status, 0);
    ck_assert_ptr_null(strstr(d.out, "PYTORCH_NO_CUDA_MEMORY_CACHING"));
    tu_proc_free(&a);
    tu_proc_free(&b);
    tu_proc_free(&c);
    tu_proc_free(&d);
}
END_TEST

/* The shim's memory is never shared outside it: CUDA IPC, an allocation handle and a multicast
 * binding of a buffer it manages are refused with CUDA_ERROR_NOT_SUPPORTED and one logged error
 * each, where the driver alone exports the same cuMemAlloc buffer (the comparison bites). */
START_TEST(test_sharing_the_shims_memory_is_refused) {
    const char *argv[] = {tu_build_path("test/progs/probe"), "share", NULL};
    const char *plain[] = {tu_fakecuda_libpath(), "FAKECUDA_MEM_BYTES=64M", NULL};
    const char *shim[] = {tu_fakecuda_libpath(), tu_shim_preload(), "FAKECUDA_MEM_BYTES=64M",
                          "OOC_BUDGET=16M", NULL};
    tu_proc_t a, b;
    ck_assert_int_eq(tu_run(argv, plain, 30, &a), 0);
    ck_assert_msg(a.status == 0, "%s", a.err);
    ck_assert_msg(strstr(a.out, "share: ipc CUDA_SUCCESS\n"
                                "share: retain CUDA_ERROR_INVALID_VALUE\n"
                                "share: multicast CUDA_ERROR_INVALID_VALUE\n"),
                  "%s", a.out);
    ck_assert_int_eq(tu_run(argv, shim, 30, &b), 0);
    ck_assert_msg(b.status == 0, "%s", b.err);
    ck_assert_msg(strstr(b.out, "share: ipc CUDA_ERROR_NOT_SUPPORTED\n"
                                "share: retain CUDA_ERROR_NOT_SUPPORTED\n"
                                "share: multicast CUDA_ERROR_NOT_SUPPORTED\n"),
                  "%s", b.out);
    static const char *const fns[] = {"cuIpcGetMemHandle(0x", "cuMemRetainAllocationHandle(0x",
                                      "cuMulticastBindAddr(0x"};
    for (int i = 0; i < 3; i++)
        ck_assert_msg(strstr(b.err, fns[i]) &&
                          strstr(b.err, "refused with CUDA_ERROR_NOT_SUPPORTED"),
                      "no error logged for %s\n%s", fns[i], b.err);
    tu_proc_free(&a);
    tu_proc_free(&b);
}
END_TEST

START_TEST(test_intercepts_get_proc_address_dlsym_and_linked) {
    static const char *const modes[] = {"gpa", "dlsym", "linked"};
    for (int i = 0; i < 3; i++) {
        const char *argv[] = {tu_build_path("test/progs/probe"), modes[i], NULL};
        const char *env[] = {tu_fakecuda_libpath(), tu_shim_preload(), "FAKECUDA_MEM_BYTES=64M",
                             "OOC_BUDGET=8M", NULL};
        tu_proc_t p;
        char total[64];
        ck_assert_int_eq(tu_run(argv, env, 30, &p), 0);
        ck_assert_msg(p.status == 0, "%s: %s", modes[i], p.err);
        ck_assert_ptr_nonnull(tu_field(p.out, "total", total, sizeof total));
        ck_assert_msg(strcmp(total, "8388608") == 0, "%s: cuMemGetInfo not intercepted: %s",
                      modes[i], total);
        tu_proc_free(&p);
        const char *env_plain[] = {tu_fakecuda_libpath(), "FAKECUDA_MEM_BYTES=64M", NULL};
        ck_assert_int_eq(tu_run(argv, env_plain, 30, &p), 0);
        ck_assert_ptr_nonnull(tu_field(p.out, "total", total, sizeof total));
        ck_assert_str_eq(total, "67108864");
        tu_proc_free(&p);
    }
}
END_TEST

START_TEST(test_bad_budget_stops_startup_naming_variable_value_and_form) {
    static const char *const env[] = {"OOC_BUDGET=12X", NULL};
    tu_result_t r = run_workload("workloads/mlp", 1, env);
    ck_assert_int_eq(r.status, 1);
    ck_assert_ptr_nonnull(strstr(r.err, "OOC_BUDGET=12X"));
    ck_assert_ptr_nonnull(strstr(r.err, "K/M/G/T"));
    tu_result_free(&r);
}
END_TEST

START_TEST(test_budget_below_one_op_is_a_clean_out_of_memory) {
    /* large's biggest op touches a 4 MiB weight and more: two 2 MiB chunks cannot hold it. */
    static const char *const env[] = {"OOC_BUDGET=4M", "FAKECUDA_MEM_BYTES=64M", NULL};
    tu_result_t r = run_workload("workloads/large", 1, env);
    ck_assert_msg(r.status == 2, "status %d (a signal is 128+N)\n%s", r.status, r.err);
    ck_assert_ptr_nonnull(strstr(r.err, "CUDA_ERROR_OUT_OF_MEMORY"));
    ck_assert_ptr_nonnull(strstr(r.err, "out of memory: an operation needs"));
    tu_result_free(&r);
}
END_TEST

/* Fails the Nth call of `api`, for every N the run makes: each run ends with the oracle checksum
 * or a clean driver error (exit 2), never a signal, and leaves no device memory behind. */
static void fault_loop(const char *api, int host_vmm) {
    plain_mlp = 1;
    tu_result_t ref = oracle("workloads/mlp");
    tu_result_free(&ref);
    char path[] = "/tmp/ooc-fault-XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    close(fd);
    char stats[256], fail[128];
    snprintf(stats, sizeof stats, "FAKECUDA_STATS=%s", path);
    const char *hv = host_vmm ? "FAKECUDA_HOST_VMM=1" : "FAKECUDA_HOST_VMM=0";
    const char *base[] = {stats,
                          hv,
                          "OOC_MODE=demand",
                          "OOC_BUDGET=1M",
                          "OOC_CHUNK=64K",
                          "FAKECUDA_GRANULARITY=64K",
                          "FAKECUDA_MEM_BYTES=1M",
                          NULL};
    tu_result_t r = run_workload("workloads/mlp", 1, base);
    ck_assert_int_eq(r.status, 0);
    tu_result_free(&r);
    char key[128];
    snprintf(key, sizeof key, "calls.%s", api);
    long long calls = tu_fc_stat(path, key);
    ck_assert_int_gt(calls, 0);
    for (long long n = 1; n <= calls; n++) {
        snprintf(fail, sizeof fail, "FAKECUDA_FAIL=%s@%lld", api, n);
        const char *env[] = {stats,
                             hv,
                             "OOC_MODE=demand",
                             fail,
                             "OOC_BUDGET=1M",
                             "OOC_CHUNK=64K",
                             "FAKECUDA_GRANULARITY=64K",
                             "FAKECUDA_MEM_BYTES=1M",
                             NULL};
        r = run_workload("workloads/mlp", 1, env);
        tu_assert_fault_outcome(&r, ref.checksum, path, fail + strlen("FAKECUDA_FAIL="));
        tu_result_free(&r);
    }
    unlink(path);
}

/* Safe mode on (the simulated device has host-located VMM memory): physical chunks, host slots
 * and host aliases are all cuMemCreate/cuMemMap calls, and swaps are device-to-device copies
 * into host-located memory. */
START_TEST(test_fault_in_mem_create_is_clean) {
    fault_loop("cuMemCreate", 1);
}
END_TEST

START_TEST(test_fault_in_mem_map_is_clean) {
    fault_loop("cuMemMap", 1);
}
END_TEST

START_TEST(test_fault_in_safe_swap_copy_is_clean) {
    fault_loop("cuMemcpyDtoDAsync", 1);
}
END_TEST

/* Safe mode off: swaps go through pinned host memory. */
START_TEST(test_fault_in_swap_out_copy_is_clean) {
    fault_loop("cuMemcpyDtoHAsync", 0);
}
END_TEST

START_TEST(test_fault_in_swap_in_copy_is_clean) {
    fault_loop("cuMemcpyHtoDAsync", 0);
}
END_TEST

START_TEST(test_fault_in_pinned_host_alloc_is_clean) {
    fault_loop("cuMemHostAlloc", 0);
}
END_TEST

/* Runs test/progs/stray (a kernel reaching a swapped-out buffer through a pointer stored in
 * device memory) with the simulated device's host-VMM support on or off. */
static tu_proc_t run_stray(int host_vmm, const char *safe) {
    const char *argv[] = {tu_build_path("test/progs/stray"), NULL};
    const char *env[] = {tu_fakecuda_libpath(),
                         tu_shim_preload(),
                         host_vmm ? "FAKECUDA_HOST_VMM=1" : "FAKECUDA_HOST_VMM=0",
                         safe,
                         "FAKECUDA_GRANULARITY=64K",
                         "OOC_CHUNK=64K",
                         "OOC_BUDGET=256K",
                         "OOC_MODE=demand",
                         "OOC_STATS=1",
                         NULL};
    tu_proc_t p;
    ck_assert_int_eq(tu_run(argv, env, 30, &p), 0);
    return p;
}

START_TEST(test_safe_mode_lets_a_hidden_access_reach_the_host_copy) {
    tu_proc_t p = run_stray(1, "OOC_SAFE=auto");
    ck_assert_msg(p.status == 0, "status %d\n%s", p.status, p.err);
    ck_assert_ptr_nonnull(strstr(p.out, "stray: ok"));
    ck_assert_ptr_nonnull(strstr(p.err, "safe mode on"));
    const char *label = "swapped chunks mapped to their host copy";
    const char *a = strstr(p.err, label);
    ck_assert_ptr_nonnull(a);
    ck_assert_msg(atoll(a + strlen(label)) > 0, "no host alias was made:\n%s", p.err);
    tu_proc_free(&p);
}
END_TEST

START_TEST(test_without_safe_mode_a_hidden_access_is_reported) {
    tu_proc_t p = run_stray(0, "OOC_SAFE=auto");
    ck_assert_msg(p.status == 3, "status %d (3: an operation failed)\n%s", p.status, p.err);
    ck_assert_ptr_nonnull(strstr(p.err, "safe mode off (the device has no host-located VMM"));
    ck_assert_msg(strstr(p.err, "the device reported an illegal address"), "%s", p.err);
    ck_assert_ptr_nonnull(strstr(p.err, "never used by an operation the shim saw): 0x"));
    tu_proc_free(&p);
}
END_TEST

START_TEST(test_safe_mode_required_but_missing_stops_startup) {
    tu_proc_t p = run_stray(0, "OOC_SAFE=on");
    ck_assert_int_eq(p.status, 3);
    ck_assert_ptr_nonnull(strstr(p.err, "OOC_SAFE=on, but safe mode is not available"));
    tu_proc_free(&p);
    p = run_stray(1, "OOC_SAFE=off");
    ck_assert_int_eq(p.status, 3); /* safe mode refused: the hidden access faults */
    ck_assert_ptr_nonnull(strstr(p.err, "safe mode off (OOC_SAFE=off)"));
    tu_proc_free(&p);
}
END_TEST

/* A program's own cuMemCreate (NCCL's way) counts against the budget: on a device exactly as
 * large as the budget it only succeeds because the shim's pool gives chunks back, and the
 * buffers whose chunks were taken keep their bytes. */
START_TEST(test_programs_own_vmm_memory_counts_against_the_budget) {
    const char *argv[] = {tu_build_path("test/progs/vmm_external"), NULL};
    const char *env[] = {tu_fakecuda_libpath(),     tu_shim_preload(),
                         "FAKECUDA_MEM_BYTES=512K", "FAKECUDA_GRANULARITY=64K",
                         "OOC_CHUNK=64K",           "OOC_BUDGET=512K",
                         "OOC_MODE=demand",         NULL};
    tu_proc_t p;
    ck_assert_int_eq(tu_run(argv, env, 30, &p), 0);
    ck_assert_msg(p.status == 0, "status %d\n%s%s", p.status, p.out, p.err);
    ck_assert_ptr_nonnull(strstr(p.out, "vmm_external: ok"));
    ck_assert_ptr_nonnull(strstr(p.err, "less than one chunk of the budget"));
    tu_proc_free(&p);
    /* Without the shim the same device cannot hold both. */
    const char *plain[] = {tu_fakecuda_libpath(), "FAKECUDA_MEM_BYTES=512K",
                           "FAKECUDA_GRANULARITY=64K", NULL};
    ck_assert_int_eq(tu_run(argv, plain, 30, &p), 0);
    ck_assert_int_eq(p.status, 3);
    tu_proc_free(&p);
}
END_TEST

/* Address space is reused: a hundred thousand 4 KiB and a hundred 4 MiB allocate-free pairs (the
 * pattern of a framework without a caching allocator) hand out about the quarantine's worth of
 * the reservation, not a new range each time. A full slab chunk whose buffers were all freed is
 * released when the next one starts, and a freed multi-chunk range, which comes back chunk by
 * chunk, is coalesced so that a multi-chunk buffer can use it again (without either, the same
 * run handed out about 400 MiB). */
START_TEST(test_address_space_is_reused) {
    const char *argv[] = {tu_build_path("test/progs/bench_hooks"), "20000", NULL};
    const char *env[] = {tu_fakecuda_libpath(),
                         tu_shim_preload(),
                         "FAKECUDA_SCHED=inline",
                         "OOC_MODE=demand",
                         "OOC_BUDGET=64M",
                         "OOC_STATS=1",
                         NULL};
    tu_proc_t p;
    ck_assert_int_eq(tu_run(argv, env, 300, &p), 0);
    ck_assert_msg(p.status == 0, "status %d\n%s", p.status, p.err);
    const char *row = strstr(p.err, "address space handed out");
    ck_assert_msg(row != NULL, "no address-space row:\n%s", p.err);
    double now = 0, peak = 0;
    char u1[8] = "", u2[8] = "";
    ck_assert_int_eq(sscanf(strstr(row, ")") + 1, "%lf %7s %lf %7s", &now, u1, &peak, u2), 4);
    double mib = peak * (strcmp(u2, "GiB") == 0 ? 1024 : strcmp(u2, "MiB") == 0 ? 1 : 1e9);
    /* the quarantine holds 64 runs of 2 MiB chunks; freed buffers kept mapped (OOC_REUSE) hold
     * their addresses too, at most the budget's 64 MiB (they are resident memory); a slab chunk
     * and one buffer besides: 196 MiB, however many allocations */
    ck_assert_msg(mib <= 200, "%.2f %s of address space handed out", peak, u2);
    tu_proc_free(&p);
}
END_TEST

/* test/progs/churn under the shim (demand, 64 KiB chunks) at a budget of `budget`: its output
 * and statistics. Every word it reads back must be right. */
static tu_result_t run_churn(const char *budget, const char *reuse, int vary) {
    char b[64], r[32];
    snprintf(b, sizeof b, "OOC_BUDGET=%s", budget);
    snprintf(r, sizeof r, "OOC_REUSE=%s", reuse);
    const char *const args[] = {"--iters", "8", vary ? "--vary" : NULL, NULL};
    const char *const env[] = {
        "FAKECUDA_GRANULARITY=64K", "OOC_CHUNK=64K", "OOC_MODE=demand", "OOC_STATS=1", b, r, NULL};
    tu_result_t p = tu_run_prog("test/progs/churn", args, 1, env, 120);
    ck_assert_msg(p.status == 0 && strstr(p.out, "churn: ok"), "status %d\n%s\n%s", p.status, p.out,
                  tu_tail(p.err, 3000));
    return p;
}

/* Where iteration `it`'s line of a churn run's output ("iter I: maps M addrs H") goes on after
 * "maps ". */
static const char *churn_line(const tu_result_t *p, int it) {
    char key[32];
    snprintf(key, sizeof key, "iter %d: maps ", it);
    const char *line = strstr(p->out, key);
    ck_assert_msg(line != NULL, "no \"%s\" line:\n%s", key, p->out);
    return line + strlen(key);
}

/* cuMemMap calls in iteration `it` of a churn run's output. */
static long long churn_maps(const tu_result_t *p, int it) {
    return atoll(churn_line(p, it));
}

/* A program that frees and allocates the same sizes every iteration (a framework without its
 * caching allocator) gets its freed buffers' chunks back still mapped: after the first iteration
 * the driver maps nothing (each mapping costs tens of microseconds on a real GPU). With
 * OOC_REUSE=0 every iteration maps its buffers again. */
START_TEST(test_freed_buffers_chunks_are_reused_mapped) {
    tu_result_t p = run_churn("8M", "1", 0);
    ck_assert_int_gt(churn_maps(&p, 0), 0);
    for (int it = 1; it < 8; it++)
        ck_assert_msg(churn_maps(&p, it) == 0, "iteration %d mapped %lld chunks:\n%s", it,
                      churn_maps(&p, it), p.out);
    ck_assert_int_gt(tu_stat_row(p.err, "chunks reused mapped from freed buffers"), 0);
    tu_result_free(&p);
    p = run_churn("8M", "0", 0);
    for (int it = 1; it < 8; it++)
        ck_assert_int_eq(churn_maps(&p, it), churn_maps(&p, 0));
    ck_assert_int_eq(tu_stat_row(p.err, "chunks reused mapped from freed buffers"), 0);
    tu_result_free(&p);
}
END_TEST

/* The address hash of iteration `it` of a churn run's output ("iter I: maps M addrs H"). */
static unsigned long long churn_addrs(const tu_result_t *p, int it) {
    const char *line = churn_line(p, it), *nl = strchr(line, '\n'), *h = strstr(line, " addrs ");
    ck_assert_msg(h != NULL && (!nl || h < nl), "no address hash:\n%s", p->out);
    return strtoull(h + 7, NULL, 16);
}

/* Stable addresses: a program that allocates the same buffers every iteration gets the same
 * addresses every iteration, also when the budget holds fewer chunks than an iteration's buffers
 * (swapped chunks are not kept mapped when their buffer is freed, so the addresses cannot come
 * from memory kept mapped): a stale pointer left in a kernel's parameters then meets the same
 * buffer every iteration. With OOC_REUSE=0 freed addresses wait in a quarantine, so the
 * addresses change from one iteration to the next. */
START_TEST(test_the_same_allocations_get_the_same_addresses_every_iteration) {
    tu_result_t p = run_churn("512K", "1", 0); /* 8 chunks; an iteration allocates 13 */
    ck_assert_double_gt(tu_stat_value(p.err, "swapped out (device to host)"), 0);
    for (int it = 1; it < 8; it++)
        ck_assert_msg(churn_addrs(&p, it) == churn_addrs(&p, 0), "iteration %d:\n%s", it, p.out);
    ck_assert_int_eq(tu_stat_row(p.err, "large buffers at their stable address"), 8 * 6);
    tu_result_free(&p);
    p = run_churn("512K", "0", 0);
    int differ = 0;
    for (int it = 1; it < 8; it++)
        differ += churn_addrs(&p, it) != churn_addrs(&p, it - 1);
    ck_assert_msg(differ > 0, "the quarantine did not change the addresses:\n%s", p.out);
    tu_result_free(&p);
}
END_TEST

/* The value of a statistics row in MiB ("swapped out (device to host)   1.25 MiB"). */
static double stat_mib(const char *text, const char *label) {
    const char *p = strstr(text, label);
    ck_assert_msg(p != NULL, "no statistics row \"%s\" in:\n%s", label, text);
    return strtod(p + strlen(label), NULL);
}

/* A swap moves a chunk's bytes up to its buffer's end (rounded up to 4 KiB), not the whole chunk:
 * churn's buffers end 48 KiB short of their last chunk (16 KiB of data there), at a budget of 4
 * chunks for 13; every word read back must still be right (churn checks each), with safe mode on
 * and off, and the bytes copied out lie between 16 and 64 KiB a chunk, well below whole chunks
 * (the code before moved exactly 64 KiB a chunk). */
START_TEST(test_swaps_move_a_buffers_bytes_not_its_last_chunks_tail) {
    for (int safe = 0; safe < 2; safe++) {
        const char *const args[] = {"--iters", "3", "--short", "49152", NULL};
        const char *const env[] = {"FAKECUDA_GRANULARITY=64K",
                                   "OOC_CHUNK=64K",
                                   "OOC_MODE=demand",
                                   "OOC_STATS=1",
                                   "OOC_BUDGET=256K",
                                   safe ? "FAKECUDA_HOST_VMM=1" : "FAKECUDA_HOST_VMM=0",
                                   safe ? "OOC_SAFE=on" : "OOC_SAFE=off",
                                   NULL};
        tu_result_t p = tu_run_prog("test/progs/churn", args, 1, env, 120);
        ck_assert_msg(p.status == 0 && strstr(p.out, "churn: ok"), "safe %d: status %d\n%s\n%s",
                      safe, p.status, p.out, tu_tail(p.err, 3000));
        long long outs = tu_stat_row(p.err, "swap-outs");
        double bytes = stat_mib(p.err, "swapped out (device to host)") * 1048576.0;
        ck_assert_msg(outs > 0, "safe %d: nothing swapped out:\n%s", safe, tu_tail(p.err, 3000));
        ck_assert_msg(bytes >= (double)outs * 16384 * 0.99 && bytes <= (double)outs * 65536 * 0.85,
                      "safe %d: %lld swap-outs moved %.0f bytes", safe, outs, bytes);
        tu_result_free(&p);
    }
}
END_TEST

/* Freed buffers' mapped chunks give way before live data: sizes change every iteration, the
 * budget holds the largest iteration's buffers (17 chunks) and no more, and nothing live is ever
 * swapped out. A kept run serves a smaller buffer too (the rest stays kept) and neighbouring
 * runs join again, so once the sizes have all been seen nothing is mapped any more. */
START_TEST(test_kept_chunks_go_back_before_live_data_is_evicted) {
    tu_result_t p = run_churn("1088K", "1", 1);
    ck_assert_msg(tu_stat_row(p.err, "swap-outs") == 0, "live data swapped out:\n%s",
                  tu_tail(p.err, 3000));
    for (int it = 4; it < 8; it++)
        ck_assert_msg(churn_maps(&p, it) == 0, "iteration %d mapped %lld chunks:\n%s", it,
                      churn_maps(&p, it), p.out);
    ck_assert_int_gt(tu_stat_row(p.err, "chunks reused mapped from freed buffers"), 0);
    tu_result_free(&p);
}
END_TEST

/* test/progs/churn `how` (--overlap, --overlap-grow) under the shim (demand, 64 KiB chunks, the
 * threaded simulated device) at a budget of `budget`, safe mode on or off: it ran to the end with
 * every word right. */
static tu_result_t run_overlap(const char *how, const char *budget, int safe) {
    char b[64];
    snprintf(b, sizeof b, "OOC_BUDGET=%s", budget);
    const char *const args[] = {how, NULL};
    const char *const env[] = {"FAKECUDA_SCHED=threaded",
                               "FAKECUDA_GRANULARITY=64K",
                               "OOC_CHUNK=64K",
                               "OOC_MODE=demand",
                               "OOC_STATS=1",
                               b,
                               safe ? "OOC_SAFE=auto" : "OOC_SAFE=off",
                               NULL};
    tu_result_t p = tu_run_prog("test/progs/churn", args, 1, env, 120);
    ck_assert_msg(p.status == 0 && strstr(p.out, "churn: ok"),
                  "%s, safe mode %s: status %d\n%s\n%s", how, safe ? "on" : "off", p.status, p.out,
                  tu_tail(p.err, 3000));
    return p;
}

/* Memory freed while queued work still reads it goes to the next buffer at once (the program's
 * thread runs ahead of the GPU and must not wait), but that buffer's work waits, on its own
 * stream, for the work on the old one: a sum on stream A held back by a host flag must still
 * see the freed buffer's bytes although the new buffer, on its chunks, is filled on stream B
 * before the flag is set. Safe mode on and off. */
START_TEST(test_reused_memory_waits_for_the_work_that_still_reads_it) {
    for (int safe = 1; safe >= 0; safe--) {
        tu_result_t p = run_overlap("--overlap", "8M", safe);
        ck_assert_int_gt(tu_stat_row(p.err, "chunks reused mapped from freed buffers"), 0);
        tu_result_free(&p);
    }
}
END_TEST

/* Memory freed while queued work still reads it, needed by a larger buffer (the freed run does
 * not fit it whole) at a budget where nothing else is free, goes on at once: the program's thread
 * does not wait for the device (here it could not: the work still reading it waits for a flag the
 * thread sets later, so a wait on the host would never end), and the new buffer's work waits for
 * the old work on its own stream. churn --overlap-grow at 6 chunks (X, its neighbour and the
 * small buffers' slab chunk take 5; in safe mode swapping the neighbour out would wait for the
 * stream held by the flag), safe mode on and off: the sum
 * is the freed buffer's, the new buffer holds its fill, and the chunks were counted handed on
 * early. (Without the ops' wait, map_phys's in_ev, the sum is wrong outside safe mode; in safe
 * mode every op also waits for it, fill_join, and only both removed make it wrong.) */
START_TEST(test_freed_memory_goes_on_early_in_stream_order) {
    for (int safe = 1; safe >= 0; safe--) {
        tu_result_t p = run_overlap("--overlap-grow", "384K", safe);
        ck_assert_msg(tu_stat_row(p.err, "freed chunks handed on early") > 0,
                      "safe mode %s: nothing handed on early\n%s", safe ? "on" : "off",
                      tu_tail(p.err, 3000));
        tu_result_free(&p);
    }
}
END_TEST

/* The same workloads with swaps through pinned host memory (no host-located VMM memory). */
START_TEST(test_workloads_match_oracle_without_safe_mode) {
    no_host_vmm = 1;
    check_under_budget("workloads/mlp", 4, "threaded", 0);
    check_under_budget("workloads/large", 8, "threaded", 0);
    check_under_budget("workloads/large", 8, "inline", 0);
}
END_TEST

/* The host memory that holds swapped chunks is bounded by what is swapped out at once, not by
 * how long the program runs: in demand mode each swap-in's host slot used to stay out of the
 * pool until exit (nothing polled the copies in flight), and ResNet-50 at batch 256 on an H100
 * grew by 13 GiB of host memory per iteration until the kernel killed it. cnn --blocks 4 at a
 * third of its footprint in demand mode, 3 and 9 iterations, safe mode on and off: the pool's
 * peak is the same, and the checksum is the oracle's. */
START_TEST(test_host_memory_does_not_grow_with_iterations) {
    static const char *const safe[] = {"OOC_SAFE=on", "OOC_SAFE=off"};
    tu_result_t o[2];
    for (int k = 0; k < 2; k++) {
        const char *const args[] = {"--blocks", "4", "--iters", k ? "9" : "3", NULL};
        static const char *const oenv[] = {"FAKECUDA_SCHED=inline", NULL};
        o[k] = tu_run_prog("workloads/cnn", args, 0, oenv, 120);
        ck_assert_int_eq(o[k].status, 0);
    }
    for (int sm = 0; sm < 2; sm++) {
        long long pool[2];
        for (int k = 0; k < 2; k++) {
            const char *const args[] = {"--blocks", "4", "--iters", k ? "9" : "3", NULL};
            const char *env[] = {"FAKECUDA_SCHED=inline",
                                 "FAKECUDA_GRANULARITY=64K",
                                 "OOC_CHUNK=64K",
                                 "OOC_BUDGET=1M",
                                 "OOC_MODE=demand",
                                 "OOC_STATS=1",
                                 safe[sm],
                                 NULL};
            tu_result_t r = tu_run_prog("workloads/cnn", args, 1, env, 120);
            ck_assert_msg(r.status == 0, "%s", tu_tail(r.err, 2000));
            ck_assert_str_eq(r.checksum, o[k].checksum);
            ck_assert_int_gt(tu_stat_row(r.err, "swap-outs"), 250 * (k ? 3 : 1));
            pool[k] = tu_stat_row(r.err, "host memory for swapped chunks (pool)");
            tu_result_free(&r);
        }
        ck_assert_msg(pool[1] == pool[0],
                      "%s: %lld MiB of host memory after 9 iterations, %lld after 3", safe[sm],
                      pool[1], pool[0]);
    }
    tu_result_free(&o[0]);
    tu_result_free(&o[1]);
}
END_TEST

Suite *suite_shim(void) {
    Suite *s = suite_create("shim");
    TCase *t = tcase_create("demand");
    tcase_set_timeout(t, 300);
    tcase_add_test(t, test_mlp_matches_oracle_at_quarter_budget);
    tcase_add_test(t, test_cnn_matches_oracle_at_quarter_budget);
    tcase_add_test(t, test_large_matches_oracle_at_quarter_and_eighth_budget);
    tcase_add_test(t, test_workloads_match_oracle_with_jitter);
    tcase_add_test(t, test_off_mode_passes_through);
    tcase_add_test(t, test_off_mode_changes_neither_environment_nor_driver_answers);
    tcase_add_test(t, test_intercepts_get_proc_address_dlsym_and_linked);
    tcase_add_test(t, test_sharing_the_shims_memory_is_refused);
    tcase_add_test(t, test_bad_budget_stops_startup_naming_variable_value_and_form);
    tcase_add_test(t, test_budget_below_one_op_is_a_clean_out_of_memory);
    tcase_add_test(t, test_workloads_match_oracle_without_safe_mode);
    suite_add_tcase(s, t);
    TCase *sf = tcase_create("safe");
    /* A hang guard: test_host_memory_does_not_grow_with_iterations runs cnn six times, about 45 s
     * under the sanitizers on an idle 2-core machine (it hit 60 s in a loaded CI run). */
    tcase_set_timeout(sf, tu_under_valgrind() ? 36000 : 300);
    tcase_add_test(sf, test_safe_mode_lets_a_hidden_access_reach_the_host_copy);
    tcase_add_test(sf, test_without_safe_mode_a_hidden_access_is_reported);
    tcase_add_test(sf, test_safe_mode_required_but_missing_stops_startup);
    tcase_add_test(sf, test_programs_own_vmm_memory_counts_against_the_budget);
    tcase_add_test(sf, test_address_space_is_reused);
    tcase_add_test(sf, test_freed_buffers_chunks_are_reused_mapped);
    tcase_add_test(sf, test_the_same_allocations_get_the_same_addresses_every_iteration);
    tcase_add_test(sf, test_swaps_move_a_buffers_bytes_not_its_last_chunks_tail);
    tcase_add_test(sf, test_kept_chunks_go_back_before_live_data_is_evicted);
    tcase_add_test(sf, test_reused_memory_waits_for_the_work_that_still_reads_it);
    tcase_add_test(sf, test_freed_memory_goes_on_early_in_stream_order);
    tcase_add_test(sf, test_host_memory_does_not_grow_with_iterations);
    suite_add_tcase(s, sf);
    TCase *f = tcase_create("faults");
    tcase_set_timeout(f, 600);
    tcase_add_test(f, test_fault_in_mem_create_is_clean);
    tcase_add_test(f, test_fault_in_mem_map_is_clean);
    tcase_add_test(f, test_fault_in_safe_swap_copy_is_clean);
    tcase_add_test(f, test_fault_in_swap_out_copy_is_clean);
    tcase_add_test(f, test_fault_in_swap_in_copy_is_clean);
    tcase_add_test(f, test_fault_in_pinned_host_alloc_is_clean);
    suite_add_tcase(s, f);
    return s;
}
