/* SPDX-License-Identifier: MIT */
/* check_graph.c: CUDA graphs under the shim: a program that captures graphs and launches them
 * many times (test/progs/graph.c, which checks every byte against a host model) gets the same
 * bytes under the shim at a budget that forces swaps between launches as without it, with the
 * scheduler threaded or inline, with jitter, with safe mode on or off, while recording; a graph
 * built node by node with cuGraphAddNode, or an executable graph updated with cuGraphExecUpdate,
 * is followed as a captured one, and so are nodes given new parameters after they were added,
 * in a graph or in an executable graph; a graph with more buffers than one access set holds is
 * merged or refused with a clean error, a graph larger than the budget is a clean out-of-memory,
 * and a failed driver call anywhere on the way ends the run cleanly.
 *
 * The runs use 64 KiB chunks and a budget (and a device) of four: each graph touches three
 * chunks and an ordinary kernel between them a seventh, so every launch evicts what the one
 * before it used, often while that is still queued. With safe mode off a graph that ran without
 * its buffers resident would fault; with safe mode on it would reach their host copies, which
 * the simulated driver counts (kernel_host_accesses must stay 0). */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testutil.h"

Suite *suite_graph(void);

/* Launches of graphs in the default run: six iterations of graph 2, graph 1 twice on odd ones. */
#define LAUNCHES 15

typedef struct run {
    int status;
    char checksum[64];
    char *out, *err;
    char stats[64]; /* FAKECUDA_STATS file */
} run_t;

/* Runs build/test/progs/graph with `args` (NULL-terminated, at most 6) and the environment:
 * the simulated driver, the shim when `shim`, 64 KiB granularity and FAKECUDA_STATS, then
 * `extra` (NULL-terminated, at most 16). */
static run_t run_prog(int shim, const char *const *args, const char *const *extra) {
    run_t r;
    memset(&r, 0, sizeof r);
    snprintf(r.stats, sizeof r.stats, "/tmp/ooc-graph-stats-%d-XXXXXX", (int)getpid());
    int fd = mkstemp(r.stats);
    ck_assert_int_ge(fd, 0);
    close(fd);
    char stats_env[96];
    snprintf(stats_env, sizeof stats_env, "FAKECUDA_STATS=%s", r.stats);
    const char *env[24];
    size_t n = 0;
    env[n++] = tu_fakecuda_libpath();
    if (shim)
        env[n++] = tu_shim_preload();
    env[n++] = "FAKECUDA_GRANULARITY=64K";
    env[n++] = stats_env;
    for (; extra && *extra && n < 23; extra++)
        env[n++] = *extra;
    env[n] = NULL;
    const char *argv[8] = {tu_build_path("test/progs/graph")};
    for (int i = 0; args && args[i] && i < 6; i++)
        argv[i + 1] = args[i];
    tu_proc_t p;
    ck_assert_int_eq(tu_run(argv, env, tu_under_valgrind() ? 300 : 60, &p), 0);
    r.status = p.status;
    r.out = p.out;
    r.err = p.err;
    char buf[64];
    if (tu_field(p.out, "checksum", buf, sizeof buf))
        snprintf(r.checksum, sizeof r.checksum, "%s", buf);
    return r;
}

static void run_free(run_t *r) {
    free(r->out);
    free(r->err);
    unlink(r->stats);
}

/* A value from the run's FAKECUDA_STATS file; -1 when absent. */
static long long stat_of(const run_t *r, const char *key) {
    return tu_fc_stat(r->stats, key);
}

/* The checksum of the default run without the shim on an unlimited device: the oracle. */
static void oracle(char *checksum, size_t len) {
    static const char *const env[] = {"FAKECUDA_SCHED=inline", NULL};
    run_t r = run_prog(0, NULL, env);
    ck_assert_msg(r.status == 0, "graph without the shim: status %d\n%s", r.status, r.err);
    ck_assert_ptr_nonnull(strstr(r.out, "graph: ok"));
    ck_assert_str_ne(r.checksum, "");
    snprintf(checksum, len, "%s", r.checksum);
    run_free(&r);
}

/* Runs the default program under the shim in demand mode at four chunks, and checks: the
 * oracle's bytes, swaps in both directions, every graph launch queued, no illegal access, no
 * unmap under queued work, and no kernel access to a host alias. */
static void check_swapping_run_of(const char *const *args, int safe, const char *sched,
                                  unsigned jitter_seed, const char *mode) {
    char ref[64];
    oracle(ref, sizeof ref);
    char sch[64], jit[64], seed[64], md[64];
    snprintf(sch, sizeof sch, "FAKECUDA_SCHED=%s", sched);
    snprintf(jit, sizeof jit, "FAKECUDA_JITTER_US=%u", jitter_seed ? 30u : 0u);
    snprintf(seed, sizeof seed, "FAKECUDA_SEED=%u", jitter_seed);
    snprintf(md, sizeof md, "OOC_MODE=%s", mode);
    char dir[64] = "/tmp/ooc-graph-profile-XXXXXX", profile[96];
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(profile, sizeof profile, "OOC_PROFILE_DIR=%s/p", dir);
    const char *env[] = {safe ? "FAKECUDA_HOST_VMM=1" : "FAKECUDA_HOST_VMM=0",
                         sch,
                         jit,
                         seed,
                         md,
                         profile,
                         "FAKECUDA_MEM_BYTES=256K",
                         "OOC_BUDGET=256K",
                         "OOC_CHUNK=64K",
                         "OOC_STATS=1",
                         NULL};
    run_t r = run_prog(1, args, env);
    ck_assert_msg(r.status == 0, "%s %s, safe %d, %s, seed %u: status %d\n%s", mode,
                  args ? args[0] : "", safe, sched, jitter_seed, r.status, r.err);
    ck_assert_msg(strcmp(r.checksum, ref) == 0, "checksum %s, oracle %s", r.checksum, ref);
    ck_assert_msg(strstr(r.err, safe ? "safe mode on" : "safe mode off") != NULL, "%s", r.err);
    ck_assert_msg(tu_stat_row(r.err, "swap-outs") >= 2 * LAUNCHES, "too few swap-outs:\n%s", r.err);
    ck_assert_msg(tu_stat_row(r.err, "swap-ins") >= LAUNCHES, "too few swap-ins:\n%s", r.err);
    ck_assert_int_eq(stat_of(&r, "graph_launches"), LAUNCHES);
    ck_assert_int_eq(stat_of(&r, "illegal_accesses"), 0);
    ck_assert_int_eq(stat_of(&r, "strict_violations"), 0);
    ck_assert_int_eq(stat_of(&r, "kernel_host_accesses"), 0);
    ck_assert_int_eq(stat_of(&r, "graphs_live"), 0);
    ck_assert_int_eq(stat_of(&r, "graph_execs_live"), 0);
    ck_assert_int_eq(tu_stat_row(r.err, "graph launches with buffers not learned"), 0);
    run_free(&r);
    char cmd[160];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    ck_assert_int_eq(system(cmd), 0);
}

START_TEST(test_graph_program_matches_its_model_without_the_shim) {
    static const char *const scheds[] = {"FAKECUDA_SCHED=inline", "FAKECUDA_SCHED=threaded"};
    char ref[64];
    oracle(ref, sizeof ref);
    for (int i = 0; i < 2; i++) {
        const char *env[] = {scheds[i], "FAKECUDA_JITTER_US=20", NULL};
        run_t r = run_prog(0, NULL, env);
        ck_assert_msg(r.status == 0, "%s: status %d\n%s", scheds[i], r.status, r.err);
        ck_assert_str_eq(r.checksum, ref);
        ck_assert_int_eq(stat_of(&r, "graph_launches"), LAUNCHES);
        ck_assert_int_eq(stat_of(&r, "graphs_live"), 0);
        run_free(&r);
    }
    /* Without the shim the device must hold all seven chunks (and the pinned ones are host). */
    static const char *const small[] = {"FAKECUDA_MEM_BYTES=256K", NULL};
    run_t r = run_prog(0, NULL, small);
    ck_assert_int_eq(r.status, 2);
    ck_assert_ptr_nonnull(strstr(r.err, "CUDA_ERROR_OUT_OF_MEMORY"));
    run_free(&r);
}
END_TEST

START_TEST(test_graph_program_passes_through_in_off_mode) {
    char ref[64];
    oracle(ref, sizeof ref);
    static const char *const env[] = {"OOC_MODE=off", NULL};
    run_t r = run_prog(1, NULL, env);
    ck_assert_msg(r.status == 0, "status %d\n%s", r.status, r.err);
    ck_assert_str_eq(r.checksum, ref);
    ck_assert_int_eq(stat_of(&r, "graph_launches"), LAUNCHES);
    run_free(&r);
}
END_TEST

static void check_swapping_run(int safe, const char *sched, unsigned jitter_seed,
                               const char *mode) {
    check_swapping_run_of(NULL, safe, sched, jitter_seed, mode);
}

static const char *const to_graph[] = {"--to-graph", NULL};

/* Graph 1 built as XLA builds its command buffers: an explicit node, then a capture appended to
 * the same graph (cuStreamBeginCaptureToGraph). Without the hook the shim made the captured ops
 * resident as if they ran, and the capture was invalidated. */
START_TEST(test_capture_into_an_existing_graph_is_followed) {
    unsigned seed =
        (unsigned)(tu_seed("test_capture_into_an_existing_graph_is_followed") % 1000) + 1;
    check_swapping_run_of(to_graph, 0, "inline", 0, "demand");
    check_swapping_run_of(to_graph, 1, "inline", 0, "demand");
    check_swapping_run_of(to_graph, 0, "threaded", seed, "demand");
    check_swapping_run_of(to_graph, 1, "threaded", seed + 1, "demand");
}
END_TEST

static const char *const add_node[] = {"--add-node", NULL};
static const char *const exec_update[] = {"--exec-update", NULL};
static const char *const set_params[] = {"--set-params", NULL};

/* Graph 1 built node by node with cuGraphAddNode (both ABIs; kernel, memcpy and memset nodes, and
 * a child-graph node holding half of them): learned as the typed node calls are. Without the
 * hook the shim learned nothing of it and launched it with nothing made resident. */
START_TEST(test_graph_built_with_add_node_is_followed) {
    unsigned seed = (unsigned)(tu_seed("test_graph_built_with_add_node_is_followed") % 1000) + 1;
    check_swapping_run_of(add_node, 0, "inline", 0, "demand");
    check_swapping_run_of(add_node, 1, "inline", 0, "demand");
    check_swapping_run_of(add_node, 0, "threaded", seed, "demand");
    check_swapping_run_of(add_node, 0, "inline", 0, "auto");
    check_swapping_run_of(add_node, 1, "threaded", seed + 1, "auto");
}
END_TEST

/* Graph 1's executable graph instantiated on other buffers, then updated with cuGraphExecUpdate
 * from graph 1 (every node, kernels included, now on graph 1's buffers), then refused an update
 * from a graph of another topology: its launches make graph 1's buffers resident. Without the
 * hook the shim made the first graph's buffers resident instead. */
START_TEST(test_graph_exec_update_is_followed) {
    unsigned seed = (unsigned)(tu_seed("test_graph_exec_update_is_followed") % 1000) + 1;
    check_swapping_run_of(exec_update, 0, "inline", 0, "demand");
    check_swapping_run_of(exec_update, 1, "inline", 0, "demand");
    check_swapping_run_of(exec_update, 0, "threaded", seed, "demand");
    check_swapping_run_of(exec_update, 0, "inline", 0, "auto");
    check_swapping_run_of(exec_update, 1, "threaded", seed + 1, "auto");
}
END_TEST

/* Graph 1 built node by node on other buffers, then every node moved to graph 1's buffers with
 * cuGraphNodeSetParams, cuGraphKernelNodeSetParams (both ABIs), cuGraphMemcpyNodeSetParams and
 * cuGraphMemsetNodeSetParams, and its executable graph's C moved between two buffers before each
 * iteration with cuGraphExecNodeSetParams and cuGraphExecMemcpyNodeSetParams (refused calls
 * among them): its launches make the buffers it touches now resident. Without these hooks the
 * shim made the first buffers resident instead, and the first launch faulted (an illegal address
 * on graph 1's buffers, exit status 2). */
START_TEST(test_node_params_set_after_adding_are_followed) {
    unsigned seed =
        (unsigned)(tu_seed("test_node_params_set_after_adding_are_followed") % 1000) + 1;
    check_swapping_run_of(set_params, 0, "inline", 0, "demand");
    check_swapping_run_of(set_params, 1, "inline", 0, "demand");
    check_swapping_run_of(set_params, 0, "threaded", seed, "demand");
    check_swapping_run_of(set_params, 0, "inline", 0, "auto");
    check_swapping_run_of(set_params, 1, "threaded", seed + 1, "auto");
}
END_TEST

/* cuMemAlloc/cuMemFree during a capture answer as the real driver's do (the shim's memory never
 * reaches it): allowed in a relaxed capture; refused in a global one, which they invalidate, so
 * that no graph replays into memory freed behind it. Before, the shim let both succeed. */
START_TEST(test_alloc_and_free_in_a_capture_answer_as_the_driver) {
    static const char *const args[] = {"--alloc-in-capture", NULL};
    static const char *const plain[] = {"FAKECUDA_SCHED=inline", NULL};
    run_t ref = run_prog(0, args, plain);
    ck_assert_msg(ref.status == 0, "status %d\n%s", ref.status, ref.err);
    ck_assert_ptr_nonnull(strstr(ref.out, "global: alloc CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"));
    static const char *const modes[] = {"OOC_MODE=demand", "OOC_MODE=auto"};
    for (int m = 0; m < 2; m++) {
        const char *env[] = {"FAKECUDA_SCHED=inline", "OOC_BUDGET=1M", "OOC_CHUNK=64K", modes[m],
                             NULL};
        run_t r = run_prog(1, args, env);
        ck_assert_msg(r.status == 0 && strcmp(r.out, ref.out) == 0,
                      "%s: status %d, said\n%s\nwithout the shim\n%s\n%s", modes[m], r.status,
                      r.out, ref.out, r.err);
        run_free(&r);
    }
    run_free(&ref);
}
END_TEST

START_TEST(test_graph_launches_swap_at_a_small_budget_without_safe_mode) {
    check_swapping_run(0, "threaded", 0, "demand");
    check_swapping_run(0, "inline", 0, "demand");
}
END_TEST

START_TEST(test_graph_launches_swap_at_a_small_budget_in_safe_mode) {
    check_swapping_run(1, "threaded", 0, "demand");
    check_swapping_run(1, "inline", 0, "demand");
}
END_TEST

START_TEST(test_graph_launches_swap_with_jitter) {
    unsigned seed = (unsigned)(tu_seed("test_graph_launches_swap_with_jitter") % 1000) + 1;
    check_swapping_run(0, "threaded", seed, "demand");
    check_swapping_run(1, "threaded", seed + 1, "demand");
}
END_TEST

/* The recorder logs a graph launch as one op and never touches a capturing stream (an event
 * recorded on one would invalidate its capture). Not under valgrind: the recorder's libunwind
 * backtraces make memcheck report a write(2) of uninitialised stack bytes, which is libunwind's
 * own probe of readable memory, not an error of ours. */
START_TEST(test_graph_launches_while_recording) {
    if (tu_under_valgrind())
        return;
    check_swapping_run(0, "threaded", 0, "record");
}
END_TEST

/* 300 buffers: 256-byte ones lie back to back and merge into a few ranges; 100-byte ones leave
 * gaps, and the launch is refused with a line that names the count. */
START_TEST(test_graph_with_more_buffers_than_an_access_set) {
    static const char *const adj[] = {"--many", "300", "--bytes", "256", NULL};
    static const char *const gap[] = {"--many", "300", "--bytes", "100", NULL};
    static const char *const env[] = {"FAKECUDA_HOST_VMM=0", "FAKECUDA_MEM_BYTES=256K",
                                      "OOC_BUDGET=256K",     "OOC_CHUNK=64K",
                                      "OOC_MODE=demand",     NULL};
    run_t plain = run_prog(0, adj, NULL);
    ck_assert_int_eq(plain.status, 0);
    run_t r = run_prog(1, adj, env);
    ck_assert_msg(r.status == 0, "status %d\n%s", r.status, r.err);
    ck_assert_str_eq(r.checksum, plain.checksum);
    run_free(&r);
    run_free(&plain);
    plain = run_prog(0, gap, NULL);
    ck_assert_int_eq(plain.status, 0);
    r = run_prog(1, gap, env);
    ck_assert_msg(r.status == 2, "status %d\n%s", r.status, r.err);
    ck_assert_msg(strstr(r.err, "the graph references 300 buffers") != NULL, "%s", r.err);
    ck_assert_ptr_nonnull(strstr(r.err, "error: cuGraphLaunch(e, s): CUDA_ERROR_OUT_OF_MEMORY"));
    ck_assert_int_eq(stat_of(&r, "graph_launches"), 0);
    run_free(&r);
    run_free(&plain);
}
END_TEST

START_TEST(test_graph_larger_than_the_budget_is_a_clean_out_of_memory) {
    static const char *const big[] = {"--big", NULL};
    static const char *const env[] = {"FAKECUDA_MEM_BYTES=256K", "OOC_BUDGET=256K", "OOC_CHUNK=64K",
                                      "OOC_MODE=demand", NULL};
    run_t r = run_prog(1, big, env);
    ck_assert_msg(r.status == 2, "status %d (a signal is 128+N)\n%s", r.status, r.err);
    ck_assert_ptr_nonnull(strstr(r.err, "out of memory: an operation needs 5 chunks"));
    ck_assert_ptr_nonnull(strstr(r.err, "error: cuGraphLaunch(e, s): CUDA_ERROR_OUT_OF_MEMORY"));
    run_free(&r);
}
END_TEST

/* Fails the Nth call of `api` for every N the default run makes under the shim: each run ends
 * with the oracle's bytes or a clean driver error (exit 2), never a signal, a wrong byte, an
 * illegal access or an unmap under queued work. */
static void fault_loop_of(const char *const *args, const char *api, int safe) {
    if (tu_under_valgrind())
        return; /* dozens of runs under valgrind: covered by the other tests */
    char ref[64];
    oracle(ref, sizeof ref);
    const char *base[] = {safe ? "FAKECUDA_HOST_VMM=1" : "FAKECUDA_HOST_VMM=0",
                          "FAKECUDA_MEM_BYTES=256K",
                          "OOC_BUDGET=256K",
                          "OOC_CHUNK=64K",
                          "OOC_MODE=demand",
                          NULL};
    run_t r = run_prog(1, args, base);
    ck_assert_int_eq(r.status, 0);
    char key[128];
    snprintf(key, sizeof key, "calls.%s", api);
    long long calls = stat_of(&r, key);
    ck_assert_int_gt(calls, 0);
    run_free(&r);
    for (long long n = 1; n <= calls; n++) {
        char fail[128];
        snprintf(fail, sizeof fail, "FAKECUDA_FAIL=%s@%lld", api, n);
        const char *env[] = {base[0], base[1], base[2], base[3], base[4], fail, NULL};
        r = run_prog(1, args, env);
        ck_assert_msg(r.status == 0 || r.status == 2, "%s@%lld: status %d\n%s", api, n, r.status,
                      r.err);
        if (r.status == 0)
            ck_assert_msg(strcmp(r.checksum, ref) == 0, "%s@%lld: wrong checksum", api, n);
        else
            ck_assert_msg(strstr(r.err, "error: ") != NULL, "%s@%lld: no error line\n%s", api, n,
                          r.err);
        ck_assert_msg(stat_of(&r, "illegal_accesses") == 0, "%s@%lld: illegal access\n%s", api, n,
                      r.err);
        ck_assert_msg(stat_of(&r, "strict_violations") == 0, "%s@%lld: unmap under queued work",
                      api, n);
        run_free(&r);
    }
}

static void fault_loop(const char *api, int safe) {
    fault_loop_of(NULL, api, safe);
}

START_TEST(test_fault_in_capture_into_a_graph_is_clean) {
    fault_loop_of(to_graph, "cuStreamBeginCaptureToGraph", 0);
    fault_loop_of(to_graph, "cuGraphAddMemsetNode", 0);
}
END_TEST

/* The shim asks the driver whether a followed stream captures before each op on it. */
START_TEST(test_fault_in_add_node_and_exec_update_is_clean) {
    fault_loop_of(add_node, "cuGraphAddNode", 0);
    fault_loop_of(exec_update, "cuGraphExecUpdate", 0);
}
END_TEST

/* A node's new parameters, in a graph and in an executable graph: a failed call learns nothing. */
START_TEST(test_fault_in_node_set_params_is_clean) {
    fault_loop_of(set_params, "cuGraphNodeSetParams", 0);
    fault_loop_of(set_params, "cuGraphKernelNodeSetParams", 0);
    fault_loop_of(set_params, "cuGraphMemcpyNodeSetParams", 0);
    fault_loop_of(set_params, "cuGraphExecNodeSetParams", 0);
    fault_loop_of(set_params, "cuGraphExecMemcpyNodeSetParams", 0);
}
END_TEST

START_TEST(test_fault_in_capture_query_is_clean) {
    fault_loop("cuStreamIsCapturing", 0);
}
END_TEST

START_TEST(test_fault_in_graph_launch_is_clean) {
    fault_loop("cuGraphLaunch", 0);
}
END_TEST

/* Swap-ins before graph launches (safe mode off), and the program's own captured copies. */
START_TEST(test_fault_in_swap_in_around_graphs_is_clean) {
    fault_loop("cuMemcpyHtoDAsync", 0);
}
END_TEST

/* Safe mode: swaps are device-to-device copies into host-located memory. */
START_TEST(test_fault_in_safe_swap_around_graphs_is_clean) {
    fault_loop("cuMemcpyDtoDAsync", 1);
}
END_TEST

Suite *suite_graph(void) {
    Suite *s = suite_create("graph");
    TCase *t = tcase_create("graphs");
    tcase_set_timeout(t, 300);
    tcase_add_test(t, test_graph_program_matches_its_model_without_the_shim);
    tcase_add_test(t, test_graph_program_passes_through_in_off_mode);
    tcase_add_test(t, test_graph_launches_swap_at_a_small_budget_without_safe_mode);
    tcase_add_test(t, test_graph_launches_swap_at_a_small_budget_in_safe_mode);
    tcase_add_test(t, test_graph_launches_swap_with_jitter);
    tcase_add_test(t, test_graph_launches_while_recording);
    tcase_add_test(t, test_capture_into_an_existing_graph_is_followed);
    tcase_add_test(t, test_graph_built_with_add_node_is_followed);
    tcase_add_test(t, test_graph_exec_update_is_followed);
    tcase_add_test(t, test_node_params_set_after_adding_are_followed);
    tcase_add_test(t, test_alloc_and_free_in_a_capture_answer_as_the_driver);
    tcase_add_test(t, test_graph_with_more_buffers_than_an_access_set);
    tcase_add_test(t, test_graph_larger_than_the_budget_is_a_clean_out_of_memory);
    suite_add_tcase(s, t);
    TCase *f = tcase_create("graph_faults");
    tcase_set_timeout(f, 600);
    tcase_add_test(f, test_fault_in_capture_query_is_clean);
    tcase_add_test(f, test_fault_in_graph_launch_is_clean);
    tcase_add_test(f, test_fault_in_capture_into_a_graph_is_clean);
    tcase_add_test(f, test_fault_in_add_node_and_exec_update_is_clean);
    tcase_add_test(f, test_fault_in_node_set_params_is_clean);
    tcase_add_test(f, test_fault_in_swap_in_around_graphs_is_clean);
    tcase_add_test(f, test_fault_in_safe_swap_around_graphs_is_clean);
    suite_add_tcase(s, f);
    return s;
}
