/* SPDX-License-Identifier: MIT */
/* check_nccl_shim.c: NCCL calls are operations of the program (shim/nccl.c), in every rank of a
 * data-parallel run.
 *
 * cnn trains data-parallel under scripts/ooc-torchrun (WORLD_SIZE ranks, one process and one
 * simulated device each; the simulated libnccl.so.2 opened with dlopen, so the shim reaches it
 * through its dlsym routing): gradients are all-reduced in buckets (a bucket of several is one
 * ncclGroupStart/End, a lone large one a plain ncclAllReduce) and the batch-norm statistics
 * broadcast from rank 0 in one group. The simulated NCCL's kernel finds the user's buffers
 * through work items in its own device memory, so only the hook can make them resident. Under
 * the shim, at a quarter of each rank's footprint, with safe mode off (a missed buffer faults):
 * every rank's checksum equals the single-process oracle (`cnn --shards W` on the same global
 * batch), in demand and auto mode, threaded with jitter, for 2 and 4 ranks; the profile names
 * the collectives (kind `nccl`), each rank's in OOC_PROFILE_DIR/rank<R>; and with the hooks
 * switched off (OOC_TEST_LIB_HOOKS=0) the ranks stop with the shim's illegal-address report and the
 * launcher names the failed rank. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testutil.h"

Suite *suite_nccl_shim(void);

/* The global batch for `world` ranks: 8 samples per rank, the footprint at which a quarter
 * still holds cnn's largest operation. */
static int global_batch(int world) {
    return 8 * world;
}

/* cnn's arguments for a run of `world` ranks (shards > 0: the single-process oracle). */
static void cnn_args(int world, int shards, char *batch, size_t blen, char *sh, size_t shlen,
                     const char **args) {
    snprintf(batch, blen, "%d", global_batch(world));
    snprintf(sh, shlen, "%d", shards);
    int n = 0;
    args[n++] = "--iters";
    args[n++] = "6";
    args[n++] = "--blocks";
    args[n++] = "3";
    args[n++] = "--batch";
    args[n++] = batch;
    if (shards > 0) {
        args[n++] = "--shards";
        args[n++] = sh;
    }
    args[n] = NULL;
}

/* The oracle of a `world`-rank run, in core, and one rank's footprint (a single process on the
 * local batch: the ranks allocate what it does). */
static tu_result_t oracle(int world, unsigned long long *rank_peak) {
    static const char *const env[] = {"FAKECUDA_SCHED=inline", NULL};
    char b[16], s[16], b1[16];
    const char *args[12], *local[12];
    cnn_args(world, world, b, sizeof b, s, sizeof s, args);
    tu_result_t r = tu_run_prog("workloads/cnn", args, 0, env, 300);
    ck_assert_msg(r.status == 0, "oracle failed: %s", r.err);
    ck_assert_str_ne(r.checksum, "");
    cnn_args(1, 0, b1, sizeof b1, s, sizeof s, local);
    tu_result_t one = tu_run_prog("workloads/cnn", local, 0, env, 300);
    ck_assert_msg(one.status == 0 && one.peak > 0, "%s", one.err);
    /* The plain single process differs: the W shards are what the ranks compute. */
    ck_assert_str_ne(one.checksum, r.checksum);
    *rank_peak = one.peak;
    tu_result_free(&one);
    return r;
}

/* Runs `world` ranks of cnn under the shim at a quarter of rank_peak, through the launcher,
 * with `mode`, threaded with jitter, safe mode off, and `extra`; logs and profiles in dir
 * (made here; the caller removes it). */
static tu_proc_t run_ranks(int world, unsigned long long rank_peak, const char *mode,
                           const char *extra, char *dir, size_t dirlen) {
    char nproc[16], b[16], s[16], budget[64], pdir[96], md[32], logdir[96];
    const char *args[12];
    snprintf(dir, dirlen, "/tmp/ooc-nccl-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(logdir, sizeof logdir, "%s/logs", dir);
    snprintf(nproc, sizeof nproc, "%d", world);
    snprintf(budget, sizeof budget, "OOC_BUDGET=%llu", rank_peak / 4);
    snprintf(pdir, sizeof pdir, "OOC_PROFILE_DIR=%s", dir);
    snprintf(md, sizeof md, "OOC_MODE=%s", mode);
    cnn_args(world, 0, b, sizeof b, s, sizeof s, args);
    /* The shim is preloaded into the ranks only (through env), not into the launcher's shell. */
    const char *argv[24] = {"scripts/ooc-torchrun",
                            "--nproc-per-node",
                            nproc,
                            "--timeout",
                            "280",
                            "--log-dir",
                            logdir,
                            "--",
                            "/usr/bin/env",
                            tu_shim_preload(),
                            tu_build_path("workloads/cnn")};
    int n = 11;
    for (int i = 0; args[i]; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    const char *env[] = {tu_fakecuda_libpath(),
                         budget,
                         pdir,
                         md,
                         "OOC_SAFE=off",
                         "FAKECUDA_SCHED=threaded",
                         "FAKECUDA_JITTER_US=20",
                         "FAKECUDA_SEED=7",
                         "OOC_CHUNK=64K",
                         "FAKECUDA_GRANULARITY=64K",
                         "OOC_STATS=1",
                         "FAKENCCL_TIMEOUT_S=60",
                         extra,
                         NULL};
    tu_proc_t p;
    ck_assert_int_eq(tu_run(argv, env, 300, &p), 0);
    return p;
}

/* The whole of dir/logs/rank<r>.<ext> (the caller frees it). */
static char *rank_log(const char *dir, int r, const char *ext) {
    char path[160];
    snprintf(path, sizeof path, "%s/logs/rank%d.%s", dir, r, ext);
    FILE *f = fopen(path, "r");
    ck_assert_msg(f != NULL, "no log %s", path);
    size_t cap = 1 << 16, len = 0, n;
    char *buf = malloc(cap);
    ck_assert_ptr_nonnull(buf);
    while ((n = fread(buf + len, 1, cap - len - 1, f)) > 0) {
        len += n;
        if (cap - len < 4096) {
            cap *= 2;
            buf = realloc(buf, cap);
            ck_assert_ptr_nonnull(buf);
        }
    }
    fclose(f);
    buf[len] = '\0';
    return buf;
}

static void remove_dir(const char *dir) {
    char cmd[160];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    ck_assert_int_eq(system(cmd), 0);
}

/* How many rows of kind nccl the ops.tsv files under dir hold whose name starts with `name`. */
static int nccl_rows(const char *dir, const char *name) {
    char cmd[256];
    snprintf(cmd, sizeof cmd, "cat '%s'/*/ops.tsv 2>/dev/null | cut -f3,4 | grep -c '^nccl\t%s'",
             dir, name);
    FILE *f = popen(cmd, "r");
    ck_assert_ptr_nonnull(f);
    int n = 0;
    if (fscanf(f, "%d", &n) != 1)
        n = 0;
    pclose(f);
    return n;
}

/* _i: 2 or 4 ranks (bit 0), demand or auto (bit 1). */
START_TEST(test_every_rank_matches_the_single_process_oracle_at_a_quarter) {
    int world = (_i & 1) ? 4 : 2;
    const char *mode = (_i & 2) ? "auto" : "demand";
    unsigned long long peak;
    tu_result_t ref = oracle(world, &peak);
    char dir[64];
    tu_proc_t p = run_ranks(world, peak, mode, NULL, dir, sizeof dir);
    ck_assert_msg(p.status == 0, "%d ranks %s: launcher status %d\n%s", world, mode, p.status,
                  tu_tail(p.err, 3000));
    for (int r = 0; r < world; r++) {
        char *out = rank_log(dir, r, "out"), *err = rank_log(dir, r, "err"), sum[64];
        ck_assert_msg(tu_field(out, "checksum", sum, sizeof sum) != NULL, "rank %d: %s", r,
                      tu_tail(err, 3000));
        ck_assert_msg(strcmp(sum, ref.checksum) == 0,
                      "%d ranks %s: rank %d checksum %s, oracle %s\n%s", world, mode, r, sum,
                      ref.checksum, tu_tail(err, 3000));
        ck_assert_msg(tu_stat_row(err, "NCCL calls made operations") > 0, "rank %d:\n%s", r,
                      tu_tail(err, 3000));
        ck_assert_msg(tu_stat_row(err, "chunks evicted on demand (LRU)") > 0 ||
                          tu_stat_row(err, "planned swap-outs (buffers)") > 0,
                      "rank %d: nothing was swapped at a quarter:\n%s", r, tu_tail(err, 3000));
        free(out);
        free(err);
    }
    if (_i & 2) {
        /* The ranks were given one OOC_PROFILE_DIR: rank R's profile is in DIR/rankR. */
        for (int r = 0; r < world; r++) {
            char path[128];
            snprintf(path, sizeof path, "%s/rank%d/ops.tsv", dir, r);
            ck_assert_msg(access(path, R_OK) == 0, "no %s", path);
        }
        /* Every rank's profile: the grouped all-reduces, the lone ones and the broadcast group
         * are ops of kind nccl; NCCL's own kernel is not an op. */
        ck_assert_int_ge(nccl_rows(dir, "ncclGroupEnd:AllReduce*"), world);
        ck_assert_int_ge(nccl_rows(dir, "ncclAllReduce"), world);
        ck_assert_int_ge(nccl_rows(dir, "ncclGroupEnd:Broadcast*"), world);
        char cmd[160];
        snprintf(cmd, sizeof cmd, "cat '%s'/*/ops.tsv | grep -q 'nccl_work'", dir);
        ck_assert_msg(system(cmd) != 0, "NCCL's kernel is an op of its own");
    }
    remove_dir(dir);
    tu_proc_free(&p);
    tu_result_free(&ref);
}
END_TEST

/* The proof that the hooks, not luck, keep the collectives' buffers resident: with them
 * switched off, NCCL's kernel reaches a swapped-out gradient through its work item, the rank
 * stops, and the launcher fails naming a rank. How the rank stops depends on timing: with the
 * shim's illegal-address report when the kernel reads the gradient while it is away, or with
 * the simulated device's strict-mode abort when it reads it while the shim's copy brings it back
 * (seen once in CI under AddressSanitizer, after the simulated mapping calls became faster). */
START_TEST(test_collectives_without_the_hooks_fail_cleanly) {
    unsigned long long peak;
    tu_result_t ref = oracle(2, &peak);
    char dir[64];
    tu_proc_t p = run_ranks(2, peak, "demand", "OOC_TEST_LIB_HOOKS=0", dir, sizeof dir);
    ck_assert_msg(p.status != 0 && p.status != 124, "status %d\n%s", p.status,
                  tu_tail(p.err, 3000));
    ck_assert_msg(strstr(p.err, "ooc-torchrun: rank ") && strstr(p.err, " failed"), "%s",
                  tu_tail(p.err, 3000));
    int faulted = 0;
    for (int r = 0; r < 2; r++) {
        char *err = rank_log(dir, r, "err");
        faulted +=
            strstr(err, "the device reported an illegal address") != NULL ||
            (strstr(err, "strict: nccl_work") != NULL &&
             strstr(err, "a kernel and a copy or memset touch the same bytes at once") != NULL);
        free(err);
    }
    ck_assert_msg(faulted > 0, "no rank reported NCCL's kernel reaching a moved buffer\n%s",
                  tu_tail(p.err, 3000));
    remove_dir(dir);
    tu_proc_free(&p);
    tu_result_free(&ref);
}
END_TEST

Suite *suite_nccl_shim(void) {
    Suite *s = suite_create("nccl_shim");
    TCase *t = tcase_create("ranks");
    tcase_set_timeout(t, tu_under_valgrind() ? 36000 : 900);
    tcase_add_loop_test(t, test_every_rank_matches_the_single_process_oracle_at_a_quarter, 0, 4);
    tcase_add_test(t, test_collectives_without_the_hooks_fail_cleanly);
    suite_add_tcase(s, t);
    return s;
}
