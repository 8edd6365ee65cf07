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
 * clear error, never wrong bytes.
 *
 * Stacked (--blocks 12) the footprint grows twelvefold while the largest operation stays the
 * same, so the same checks (tcase xfmr-blocks) run at 1/4 and 1/8 of the footprint, with the
 * simulated device's counters too: no illegal access, and without the pointer table no kernel
 * access to a host alias. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testutil.h"

Suite *suite_framework(void);

#define RUN_TIMEOUT_S 120

/* The runs at 1/4 and 1/8 of the footprint stack BLOCKS blocks at batch BLOCKS_BATCH for
 * BLOCKS_ITERS iterations: peak_device_bytes 12599492 (12.0 MiB; 9484 ops per iteration with
 * the pointer table, 9508 without), 0.92 MiB per block, while the largest operation (the
 * grouped GEMM over the batch buffer, a QKV buffer and three weights, about 0.5 MiB) stays the
 * one-block program's. So 1/8 (budget 1574936 bytes, 1.50 MiB) holds it three times over and
 * 1/4 (3149873 bytes) six times, and auto finds a plan at both (at batch 64, 1/8 left auto no
 * plan). Batch 128 rather than 256 and 3 iterations (one recorded, two replayed) keep each run
 * within seconds inline; threaded with jitter a run takes tens of seconds on a slow machine
 * (auto up to about 50 s on two shared cores), hence one threaded run per test. */
enum { BLOCKS = 12 };
#define BLOCKS_ARG   "12"
#define BLOCKS_BATCH "128"
#define BLOCKS_ITERS "3"

/* Runs xfmr: with `blocks`, the stacked program above; else one block, --iters 4 --batch 256. */
static tu_result_t run_xfmr_blocks(int shim, int table, int blocks, const char *const *env) {
    const char *const with[] = {"--iters", "4", "--batch", "256", NULL};
    const char *const without[] = {"--iters", "4", "--batch", "256", "--no-ptr-table", NULL};
    const char *const bwith[] = {"--iters",  BLOCKS_ITERS, "--batch", BLOCKS_BATCH,
                                 "--blocks", BLOCKS_ARG,   NULL};
    const char *const bwithout[] = {"--iters",  BLOCKS_ITERS, "--batch",        BLOCKS_BATCH,
                                    "--blocks", BLOCKS_ARG,   "--no-ptr-table", NULL};
    const char *const *args = blocks ? (table ? bwith : bwithout) : (table ? with : without);
    return tu_run_prog("workloads/xfmr", args, shim, env, RUN_TIMEOUT_S);
}

static tu_result_t run_xfmr(int shim, int table, const char *const *env) {
    return run_xfmr_blocks(shim, table, 0, env);
}

static tu_result_t oracle_of(int table, int blocks) {
    static const char *const env[] = {"FAKECUDA_SCHED=inline", "FAKECUDA_GRANULARITY=64K", NULL};
    tu_result_t r = run_xfmr_blocks(0, table, blocks, env);
    ck_assert_int_eq(r.status, 0);
    ck_assert_str_ne(r.checksum, "");
    return r;
}

static tu_result_t oracle(int table) {
    return oracle_of(table, 0);
}

/* Runs xfmr (one block, or the stacked program when `blocks`) under the shim at num/den of its
 * footprint. With `stats`, the simulated driver writes its counters there (FAKECUDA_STATS). */
/* An extra setting for the runs under the shim (NULL: none). */
static const char *extra_env;
/* When set, under_shim_frac keeps the profile's ops.tsv here (malloc'd; the caller frees it). */
static char **keep_ops;

/* The text of file `path`, malloc'd (NULL when it cannot be read). */
static char *slurp(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f)
        return NULL;
    char *buf = NULL;
    size_t len = 0, cap = 0, got;
    do {
        if (len + 4096 + 1 > cap) {
            cap = (len + 4096 + 1) * 2;
            char *nb = realloc(buf, cap);
            ck_assert_ptr_nonnull(nb);
            buf = nb;
        }
        got = fread(buf + len, 1, 4096, f);
        len += got;
    } while (got > 0);
    fclose(f);
    buf[len] = '\0';
    return buf;
}

static tu_result_t under_shim_frac(const tu_result_t *ref, int table, int blocks, const char *mode,
                                   const char *sched, unsigned seed, int safe, unsigned num,
                                   unsigned den, const char *stats) {
    char cap[64], budget[64], sch[64], jit[64], sd[64], md[64], st[128];
    unsigned long long b = ref->peak * num / den;
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
                         stats ? st : extra_env,
                         stats ? extra_env : NULL,
                         NULL};
    if (stats)
        snprintf(st, sizeof st, "FAKECUDA_STATS=%s", stats);
    tu_result_t r = run_xfmr_blocks(1, table, blocks, env);
    if (keep_ops) {
        char ops[128];
        snprintf(ops, sizeof ops, "%s/ops.tsv", dir);
        *keep_ops = slurp(ops);
    }
    char cmd[160];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    ck_assert_int_eq(system(cmd), 0);
    return r;
}

/* Runs xfmr under the shim at `tenths` tenths of its footprint. */
static tu_result_t under_shim_at(const tu_result_t *ref, int table, const char *mode,
                                 const char *sched, unsigned seed, int safe, unsigned tenths) {
    return under_shim_frac(ref, table, 0, mode, sched, seed, safe, tenths, 10, NULL);
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
            char *names = NULL;
            keep_ops = &names;
            tu_result_t r =
                under_shim_at(&ref, 0, "auto", inl ? "inline" : "threaded", inl ? 0 : 7, safe, 6);
            keep_ops = NULL;
            /* Kernels launched through a CUkernel handle are named in the profile (cuFuncGetName
             * refuses such a handle; on a GPU every kernel was once named "kernel"). */
            ck_assert_ptr_nonnull(names);
            /* (An op of grid 0 is a graph's launch, which has no kernel name.) */
            const char *unnamed = strstr(names, "\tkernel\tkernel\t");
            while (unnamed && strncmp(unnamed + 15, "grid=(0,0,0)", 12) == 0)
                unnamed = strstr(unnamed + 1, "\tkernel\tkernel\t");
            ck_assert_msg(
                strstr(names, "\tkernel\ttma_gemm\t") &&
                    strstr(names, "\tkernel\tsoftmax_rows_f32\t") && !unnamed,
                "kernel names in ops.tsv: tma_gemm %d, softmax_rows_f32 %d, unnamed %.200s",
                strstr(names, "\tkernel\ttma_gemm\t") != NULL,
                strstr(names, "\tkernel\tsoftmax_rows_f32\t") != NULL, unnamed ? unnamed : "none");
            free(names);
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
    /* The device names the kernel; the shim names the buffers that were not resident. */
    if (r.status != 0)
        ck_assert_msg(strstr(r.err, "illegal address") != NULL &&
                          strstr(r.err, "kernel grouped_gemm") != NULL &&
                          strstr(r.err, "never used by an operation the shim saw): 0x") != NULL,
                      "no clear error:\n%s", tu_tail(r.err, 3000));
    tu_result_free(&r);
    tu_result_free(&ref);
}
END_TEST

/* The stacked program's runs: _i picks the fraction and the mode. */
static const struct {
    unsigned den;
    const char *mode;
} blocks_runs[] = {{4, "demand"}, {4, "auto"}, {8, "demand"}, {8, "auto"}};

/* Runs the stacked program under the shim at 1/den of its footprint and checks the oracle's
 * bytes and the visibility rows: every launch's layout found, every graph launch's buffers
 * learned, TMA operands seen, no illegal access on the simulated device, and (without the
 * pointer table, where every buffer a kernel touches is one the shim saw) no kernel access to
 * a host alias. In auto, a plan was found and replayed. */
static void expect_blocks_match_oracle(const tu_result_t *ref, int table, unsigned den,
                                       const char *mode, const char *sched, unsigned seed,
                                       int safe) {
    char stats[] = "/tmp/ooc-framework-stats-XXXXXX";
    int fd = mkstemp(stats);
    ck_assert_int_ge(fd, 0);
    close(fd);
    tu_result_t r = under_shim_frac(ref, table, 1, mode, sched, seed, safe, 1, den, stats);
    ck_assert_msg(r.status == 0 && strcmp(r.checksum, ref->checksum) == 0,
                  "xfmr --blocks %d at 1/%u (%s, %s, safe mode %s, %s): status %d, checksum %s, "
                  "oracle %s\n%s",
                  BLOCKS, den, mode, sched, safe ? "on" : "off",
                  table ? "pointer table" : "--no-ptr-table", r.status, r.checksum, ref->checksum,
                  tu_tail(r.err, 3000));
    ck_assert_int_eq(tu_stat_row(r.err, "launches with no parameter layout"), 0);
    ck_assert_int_eq(tu_stat_row(r.err, "graph launches with buffers not learned"), 0);
    ck_assert_int_gt(tu_stat_row(r.err, "operands found through TMA descriptors"), 0);
    ck_assert_int_gt(tu_stat_row(r.err, "swap-outs"), 0);
    ck_assert_int_eq(tu_fc_stat(stats, "illegal_accesses"), 0);
    if (!table)
        ck_assert_int_eq(tu_fc_stat(stats, "kernel_host_accesses"), 0);
    if (strcmp(mode, "auto") == 0) {
        ck_assert_msg(tu_stat_row(r.err, "operations run as planned") > 0,
                      "xfmr --blocks %d at 1/%u (auto, %s): no plan replayed\n%s", BLOCKS, den,
                      sched, tu_tail(r.err, 3000));
        ck_assert_int_eq(tu_stat_row(r.err, "re-recordings after divergence"), 0);
    }
    tu_result_free(&r);
    unlink(stats);
}

/* At 1/4 and 1/8 of its footprint, inline, in demand and auto: safe mode on with and without
 * the pointer table, and safe mode off without it, give the oracle's checksum with every path
 * seen; safe mode off with the pointer table ends in a clear error (the simulated device names
 * the grouped GEMM and the access it refused) or, should the table's operands happen to be
 * resident, the oracle's checksum: never wrong bytes. */
START_TEST(test_xfmr_blocks_inline_match_oracle_at_a_quarter_and_an_eighth) {
    unsigned den = blocks_runs[_i].den;
    const char *mode = blocks_runs[_i].mode;
    tu_result_t ref = oracle_of(0, 1), reft = oracle_of(1, 1);
    ck_assert_str_eq(ref.checksum, reft.checksum);
    expect_blocks_match_oracle(&reft, 1, den, mode, "inline", 0, 1);
    expect_blocks_match_oracle(&ref, 0, den, mode, "inline", 0, 1);
    expect_blocks_match_oracle(&ref, 0, den, mode, "inline", 0, 0);
    tu_result_t r = under_shim_frac(&reft, 1, 1, mode, "inline", 0, 0, 1, den, NULL);
    ck_assert_msg(r.status != 0 || strcmp(r.checksum, reft.checksum) == 0,
                  "xfmr --blocks %d at 1/%u (%s, pointer table, safe mode off): wrong bytes: "
                  "checksum %s, oracle %s",
                  BLOCKS, den, mode, r.checksum, reft.checksum);
    if (r.status != 0) {
        /* The device names the kernel; the shim names the buffers that were not resident. */
        ck_assert_msg(strstr(r.err, "illegal address") != NULL &&
                          strstr(r.err, "kernel grouped_gemm") != NULL &&
                          strstr(r.err, "never used by an operation the shim saw): 0x") != NULL,
                      "xfmr --blocks %d at 1/%u (%s, pointer table, safe mode off): no clear "
                      "error:\n%s",
                      BLOCKS, den, mode, tu_tail(r.err, 3000));
        ck_assert_int_eq(r.status, 2);
    }
    tu_result_free(&r);
    tu_result_free(&ref);
    tu_result_free(&reft);
}
END_TEST

/* The same threaded with jitter, one run per test (_i / 3 picks the fraction and mode, _i % 3
 * the run: safe mode on with the pointer table, on without it, off without it). */
START_TEST(test_xfmr_blocks_threaded_match_oracle_at_a_quarter_and_an_eighth) {
    unsigned den = blocks_runs[_i / 3].den;
    const char *mode = blocks_runs[_i / 3].mode;
    int table = _i % 3 == 0, safe = _i % 3 < 2;
    unsigned seed =
        (unsigned)(tu_seed("test_xfmr_blocks_threaded_match_oracle_at_a_quarter_and_an_eighth") %
                   1000) +
        1;
    tu_result_t ref = oracle_of(table, 1);
    expect_blocks_match_oracle(&ref, table, den, mode, "threaded", seed, safe);
    tu_result_free(&ref);
}
END_TEST

/* Safe mode, OOC_SAFE_STAGE=1: the grouped GEMM writes its outputs through the pointer table
 * that xfmr copies to the device before each launch (cuMemcpyHtoDAsync); the shim reads the
 * table's words and never stages those buffers, so no write lands on a read-only alias (this
 * run faulted before it did), while the other planned swap-ins are staged. Threaded, at 1/8,
 * auto. */
START_TEST(test_xfmr_staged_swap_ins_keep_writes_through_the_table) {
    tu_result_t ref = oracle_of(1, 1);
    char stats[] = "/tmp/ooc-framework-stats-XXXXXX";
    int fd = mkstemp(stats);
    ck_assert_int_ge(fd, 0);
    close(fd);
    extra_env = "OOC_SAFE_STAGE=1";
    tu_result_t r = under_shim_frac(&ref, 1, 1, "auto", "threaded", 0, 1, 1, 8, stats);
    extra_env = NULL;
    ck_assert_msg(r.status == 0 && strcmp(r.checksum, ref.checksum) == 0,
                  "xfmr --blocks %d at 1/8, staged: status %d, checksum %s, oracle %s\n%s", BLOCKS,
                  r.status, r.checksum, ref.checksum, tu_tail(r.err, 3000));
    ck_assert_int_eq(tu_fc_stat(stats, "illegal_accesses"), 0);
    long long staged = tu_stat_row(r.err, "safe mode: swap-ins staged beside the alias");
    long long kept = tu_stat_row(r.err, "chunks not staged: address stored by a copy");
    fprintf(stderr, "xfmr staged: %lld swap-ins staged, %lld chunks kept from staging\n", staged,
            kept);
    ck_assert_msg(staged > 0 && kept > 0, "staged %lld, kept from staging %lld\n%s", staged, kept,
                  tu_tail(r.err, 3000));
    tu_result_free(&r);
    tu_result_free(&ref);
    unlink(stats);
}
END_TEST

/* Safe mode with OOC_REMAP_GATE=1 (on the simulated device's model of the driver behaviour it
 * relies on, FAKECUDA_REMAP_QUEUED=1): the grouped GEMM reads and writes its operands through the
 * device pointer table, unseen by the shim, while planned swap-ins and swap-outs move their
 * chunks' addresses behind gates on the device. Threaded with jitter, at 1/4 and 1/8, auto: the
 * oracle's bytes, no illegal access, and both kinds of remap counted. */
START_TEST(test_xfmr_safe_mode_behind_gates_matches_oracle) {
    unsigned den = _i ? 8 : 4;
    unsigned seed =
        (unsigned)(tu_seed("test_xfmr_safe_mode_behind_gates_matches_oracle") % 1000) + 1;
    tu_result_t ref = oracle_of(1, 1);
    char stats[] = "/tmp/ooc-framework-stats-XXXXXX";
    int fd = mkstemp(stats);
    ck_assert_int_ge(fd, 0);
    close(fd);
    setenv("FAKECUDA_REMAP_QUEUED", "1", 1); /* this test's process and its children only */
    extra_env = "OOC_REMAP_GATE=1";
    tu_result_t r = under_shim_frac(&ref, 1, 1, "auto", "threaded", seed, 1, 1, den, stats);
    extra_env = NULL;
    unsetenv("FAKECUDA_REMAP_QUEUED");
    ck_assert_msg(r.status == 0 && strcmp(r.checksum, ref.checksum) == 0,
                  "xfmr --blocks %d at 1/%u, gates: status %d, checksum %s, oracle %s\n%s", BLOCKS,
                  den, r.status, r.checksum, ref.checksum, tu_tail(r.err, 3000));
    ck_assert_int_eq(tu_fc_stat(stats, "illegal_accesses"), 0);
    long long ins = tu_stat_row(r.err, "remapped behind the device (chunks)");
    long long outs = tu_stat_row(r.err, "swapped out behind the device (chunks)");
    fprintf(stderr, "xfmr at 1/%u behind gates: %lld swap-ins, %lld swap-outs\n", den, ins, outs);
    ck_assert_msg(ins > 0 && outs > 0, "swap-ins %lld, swap-outs %lld behind gates\n%s", ins, outs,
                  tu_tail(r.err, 3000));
    tu_result_free(&r);
    tu_result_free(&ref);
    unlink(stats);
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
    tc = tcase_create("xfmr-blocks");
    tcase_set_timeout(tc, tu_under_valgrind() ? 36000 : 300);
    tcase_add_loop_test(tc, test_xfmr_blocks_inline_match_oracle_at_a_quarter_and_an_eighth, 0, 4);
    tcase_add_loop_test(tc, test_xfmr_blocks_threaded_match_oracle_at_a_quarter_and_an_eighth, 0,
                        12);
    tcase_add_test(tc, test_xfmr_staged_swap_ins_keep_writes_through_the_table);
    suite_add_tcase(s, tc);
    tc = tcase_create("xfmr-gates");
    tcase_set_timeout(tc, tu_under_valgrind() ? 36000 : 300);
    tcase_add_loop_test(tc, test_xfmr_safe_mode_behind_gates_matches_oracle, 0, 2);
    suite_add_tcase(s, tc);
    tc = tcase_create("faults");
    tcase_set_timeout(tc, tu_under_valgrind() ? 36000 : 900);
    tcase_add_test(tc, test_fault_in_tensor_map_encoding_is_clean);
    tcase_add_test(tc, test_fault_in_explicit_graph_building_is_clean);
    tcase_add_test(tc, test_fault_in_2d_copies_is_clean);
    suite_add_tcase(s, tc);
    return s;
}
