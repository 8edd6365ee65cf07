/* SPDX-License-Identifier: MIT */
/* check_library.c: cuDNN calls are operations of the program (shim/library.c).
 *
 * The cnn workload (--blocks 3) opens the simulated libcudnn.so.9 with dlopen (RTLD_LOCAL) and
 * resolves its calls with dlsym, as frameworks do, so the shim reaches them through its dlsym
 * routing. Under the shim: each cuDNN call is one op of kind `cudnn` named by the function in the
 * profile (the kernels it launches are not ops of their own), in ops.tsv and in the Chrome trace;
 * the checksum equals the oracle's at a quarter of the footprint in demand and auto mode, inline
 * and threaded with jitter, safe mode on and off; and the test-only switch OOC_TEST_LIB_HOOKS=0
 * really turns the hooks off (the kernels are the ops again). */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testutil.h"

Suite *suite_library(void);

static const char *const cnn_args[] = {"--iters", "10", "--blocks", "3", NULL};
/* Every convolution forward through the backend API, whose kernel finds x, w and y through a
 * table in the workspace: a launch scan sees only the workspace. */
static const char *const backend_args[] = {"--iters", "10", "--blocks", "3", "--backend", NULL};

static tu_result_t oracle_in(const char *prog, const char *const *args) {
    static const char *const env[] = {"FAKECUDA_SCHED=inline", NULL};
    tu_result_t r = tu_run_prog(prog, args, 0, env, 300);
    ck_assert_msg(r.status == 0, "oracle failed: %s", r.err);
    ck_assert_str_ne(r.checksum, "");
    return r;
}

static tu_result_t oracle_of(const char *const *args) {
    return oracle_in("workloads/cnn", args);
}

static tu_result_t oracle(void) {
    return oracle_of(cnn_args);
}

/* The whole of a file, NUL-terminated (the caller frees it). */
static char *slurp(const char *path) {
    FILE *f = fopen(path, "r");
    ck_assert_msg(f != NULL, "cannot open %s", path);
    char *buf = NULL;
    size_t len = 0, cap = 0, n;
    char tmp[4096];
    while ((n = fread(tmp, 1, sizeof tmp, f)) > 0) {
        if (len + n + 1 > cap) {
            cap = 2 * (len + n + 1);
            buf = realloc(buf, cap);
            ck_assert_ptr_nonnull(buf);
        }
        memcpy(buf + len, tmp, n);
        len += n;
    }
    fclose(f);
    if (!buf)
        buf = calloc(1, 1);
    buf[len] = '\0';
    return buf;
}

/* How many rows of ops.tsv have `kind` in their third column and `name` in their fourth. */
static int rows_of(const char *ops, const char *kind, const char *name) {
    char want[160];
    snprintf(want, sizeof want, "\t%s\t%s\t", kind, name);
    int n = 0;
    for (const char *p = strstr(ops, want); p; p = strstr(p + 1, want))
        n++;
    return n;
}

/* Runs cnn under the shim at 1/4 of the oracle's peak with `mode`, `sched` (jitter when
 * threaded), safe mode `safe` and the extra variables, checks the checksum and returns the run;
 * the profile goes to dir (made here; the caller removes it). */
static tu_result_t run_in(const char *prog, const char *const *args, const tu_result_t *ref,
                          const char *mode, const char *sched, const char *safe, const char *extra,
                          char *dir, size_t dirlen) {
    char budget[64], cap[64], pdir[96], md[32], sch[48], sf[32];
    snprintf(dir, dirlen, "/tmp/ooc-lib-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(budget, sizeof budget, "OOC_BUDGET=%llu", ref->peak / 4);
    snprintf(cap, sizeof cap, "FAKECUDA_MEM_BYTES=%llu", ref->peak / 4);
    snprintf(pdir, sizeof pdir, "OOC_PROFILE_DIR=%s", dir);
    snprintf(md, sizeof md, "OOC_MODE=%s", mode);
    snprintf(sch, sizeof sch, "FAKECUDA_SCHED=%s", sched);
    snprintf(sf, sizeof sf, "OOC_SAFE=%s", safe);
    int threaded = strcmp(sched, "threaded") == 0;
    const char *env[] = {budget,
                         cap,
                         pdir,
                         md,
                         sch,
                         sf,
                         threaded ? "FAKECUDA_JITTER_US=20" : "FAKECUDA_JITTER_US=0",
                         "FAKECUDA_SEED=7",
                         "FAKECUDA_HOST_VMM=1",
                         "OOC_CHUNK=64K",
                         "FAKECUDA_GRANULARITY=64K",
                         "OOC_STATS=1",
                         extra,
                         NULL};
    return tu_run_prog(prog, args, 1, env, 300);
}

static tu_result_t run_cnn(const char *const *args, const tu_result_t *ref, const char *mode,
                           const char *sched, const char *safe, const char *extra, char *dir,
                           size_t dirlen) {
    return run_in("workloads/cnn", args, ref, mode, sched, safe, extra, dir, dirlen);
}

static tu_result_t run_quarter(const tu_result_t *ref, const char *mode, const char *sched,
                               const char *safe, const char *extra, char *dir, size_t dirlen) {
    tu_result_t r = run_cnn(cnn_args, ref, mode, sched, safe, extra, dir, dirlen);
    ck_assert_msg(r.status == 0, "cnn %s %s safe %s: status %d\n%s", mode, sched, safe, r.status,
                  tu_tail(r.err, 3000));
    ck_assert_msg(strcmp(r.checksum, ref->checksum) == 0,
                  "cnn %s %s safe %s: checksum %s, oracle %s\n%s", mode, sched, safe, r.checksum,
                  ref->checksum, tu_tail(r.err, 3000));
    return r;
}

static void remove_dir(const char *dir) {
    char cmd[160];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    ck_assert_int_eq(system(cmd), 0);
}

static char *profile_file(const char *dir, const char *name) {
    char path[192];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return slurp(path);
}

static const char *const dnn_calls[] = {
    "cudnnConvolutionForward", "cudnnConvolutionBackwardData", "cudnnConvolutionBackwardFilter",
    "cudnnBatchNormalizationForwardTraining", "cudnnBatchNormalizationBackward"};
static const char *const dnn_kernels[] = {"conv_fwd_f32", "conv_bwd_data_f32",
                                          "conv_bwd_filter_f32", "bn_fwd_train_f32", "bn_bwd_f32"};

START_TEST(test_cudnn_calls_are_named_operations) {
    tu_result_t ref = oracle();
    char dir[64];
    tu_result_t r = run_quarter(&ref, "auto", "inline", "on", NULL, dir, sizeof dir);
    char *ops = profile_file(dir, "ops.tsv");
    char *trace = profile_file(dir, "trace.json");
    for (size_t i = 0; i < sizeof dnn_calls / sizeof dnn_calls[0]; i++) {
        ck_assert_msg(rows_of(ops, "cudnn", dnn_calls[i]) > 0, "no cudnn op %s in ops.tsv:\n%s",
                      dnn_calls[i], tu_tail(ops, 3000));
        ck_assert_msg(strstr(trace, dnn_calls[i]) != NULL, "%s not in trace.json", dnn_calls[i]);
        /* The kernels are parts of the call, not ops of their own. */
        ck_assert_msg(rows_of(ops, "kernel", dnn_kernels[i]) == 0,
                      "kernel %s of a cuDNN call is an op of its own:\n%s", dnn_kernels[i],
                      tu_tail(ops, 3000));
    }
    /* The plan was made and followed with cudnn ops in it. */
    ck_assert_msg(tu_stat_row(r.err, "operations run as planned") > 0, "no replay:\n%s",
                  tu_tail(r.err, 3000));
    /* A convolution's operands are listed: input read, weights read, output written. */
    ck_assert_msg(strstr(ops, "\tcudnn\tcudnnConvolutionForward\tbytes=0\t") != NULL, "%s",
                  tu_tail(ops, 2000));
    free(ops);
    free(trace);
    remove_dir(dir);
    tu_result_free(&r);
    tu_result_free(&ref);
}
END_TEST

/* _i: demand or auto (bit 0), inline or threaded with jitter (bit 1), safe mode on or off
 * (bit 2). */
START_TEST(test_cudnn_at_a_quarter_stays_correct) {
    const char *mode = (_i & 1) ? "auto" : "demand";
    const char *sched = (_i & 2) ? "threaded" : "inline";
    const char *safe = (_i & 4) ? "off" : "on";
    tu_result_t ref = oracle();
    char dir[64];
    tu_result_t r = run_quarter(&ref, mode, sched, safe, NULL, dir, sizeof dir);
    ck_assert_msg(tu_stat_row(r.err, "chunks evicted on demand (LRU)") > 0 ||
                      tu_stat_row(r.err, "planned swap-outs (buffers)") > 0,
                  "nothing was swapped at a quarter:\n%s", tu_tail(r.err, 3000));
    remove_dir(dir);
    tu_result_free(&r);
    tu_result_free(&ref);
}
END_TEST

START_TEST(test_switched_off_hooks_leave_the_kernels_as_ops) {
    tu_result_t ref = oracle();
    char dir[64];
    tu_result_t r =
        run_quarter(&ref, "auto", "inline", "on", "OOC_TEST_LIB_HOOKS=0", dir, sizeof dir);
    char *ops = profile_file(dir, "ops.tsv");
    ck_assert_msg(strstr(ops, "\tcudnn\t") == NULL, "a cudnn op with the hooks off:\n%s",
                  tu_tail(ops, 2000));
    ck_assert_msg(rows_of(ops, "kernel", "conv_fwd_f32") > 0, "%s", tu_tail(ops, 2000));
    free(ops);
    remove_dir(dir);
    tu_result_free(&r);
    tu_result_free(&ref);
}
END_TEST

/* _i: demand or auto (bit 0), inline or threaded with jitter (bit 1); safe mode off, so that a
 * buffer the backend kernel reaches through its table and the shim had not made resident
 * would fault. */
START_TEST(test_backend_api_at_a_quarter_stays_correct) {
    const char *mode = (_i & 1) ? "auto" : "demand";
    const char *sched = (_i & 2) ? "threaded" : "inline";
    tu_result_t ref = oracle_of(backend_args);
    char dir[64];
    tu_result_t r = run_cnn(backend_args, &ref, mode, sched, "off", NULL, dir, sizeof dir);
    ck_assert_msg(r.status == 0, "cnn --backend %s %s: status %d\n%s", mode, sched, r.status,
                  tu_tail(r.err, 3000));
    ck_assert_msg(strcmp(r.checksum, ref.checksum) == 0,
                  "cnn --backend %s %s: checksum %s, oracle %s\n%s", mode, sched, r.checksum,
                  ref.checksum, tu_tail(r.err, 3000));
    ck_assert_msg(tu_stat_row(r.err, "chunks evicted on demand (LRU)") > 0 ||
                      tu_stat_row(r.err, "planned swap-outs (buffers)") > 0,
                  "nothing was swapped at a quarter:\n%s", tu_tail(r.err, 3000));
    /* The simulated cuDNN, like the real one, gives no variant pack back: the operands are the
     * ones the hook saw set. */
    ck_assert_msg(strstr(r.err, "variant pack's operands are unknown") == NULL, "%s",
                  tu_tail(r.err, 3000));
    if (_i & 1) {
        char *ops = profile_file(dir, "ops.tsv");
        /* One op per execution: the table's copy and the kernel are parts of it. */
        /* Named by what its plan computes: the operation graph holds one convolution forward. */
        ck_assert_msg(rows_of(ops, "cudnn", "cudnnBackendExecute:conv_fwd") > 0, "%s",
                      tu_tail(ops, 2000));
        ck_assert_msg(rows_of(ops, "kernel", "conv_fwd_table_f32") == 0, "%s", tu_tail(ops, 2000));
        free(ops);
    }
    remove_dir(dir);
    tu_result_free(&r);
    tu_result_free(&ref);
}
END_TEST

/* The proof that the hook, not luck, keeps the backend's operands resident: with it switched off
 * and safe mode off, the kernel reaches a swapped-out operand through its table and the run
 * stops with the shim's report of an illegal address, never wrong bytes. */
START_TEST(test_backend_api_without_the_hook_faults_cleanly) {
    tu_result_t ref = oracle_of(backend_args);
    char dir[64];
    tu_result_t r = run_cnn(backend_args, &ref, "demand", "inline", "off", "OOC_TEST_LIB_HOOKS=0",
                            dir, sizeof dir);
    ck_assert_msg(r.status != 0, "ran through without the hook (checksum %s, oracle %s)\n%s",
                  r.checksum, ref.checksum, tu_tail(r.err, 3000));
    ck_assert_msg(strstr(r.err, "the device reported an illegal address") != NULL, "%s",
                  tu_tail(r.err, 3000));
    ck_assert_str_eq(r.checksum, "");
    remove_dir(dir);
    tu_result_free(&r);
    tu_result_free(&ref);
}
END_TEST

/* A program linked with -lcudnn reaches the shim's exported functions through the dynamic
 * linker (no dlsym): every call is an operation, and the results are the same. */
START_TEST(test_a_program_linked_with_cudnn_reaches_the_hooks) {
    static const char *const plain[] = {"FAKECUDA_SCHED=inline", NULL};
    tu_result_t ref = tu_run_prog("test/progs/dnnlink", NULL, 0, plain, 120);
    ck_assert_msg(ref.status == 0, "%s", ref.err);
    static const char *const env[] = {
        "OOC_BUDGET=256K", "OOC_CHUNK=64K", "FAKECUDA_GRANULARITY=64K",
        "OOC_MODE=demand", "OOC_STATS=1",   NULL};
    tu_result_t r = tu_run_prog("test/progs/dnnlink", NULL, 1, env, 120);
    ck_assert_msg(r.status == 0, "%s", tu_tail(r.err, 3000));
    ck_assert_str_eq(r.checksum, ref.checksum);
    ck_assert_msg(strstr(r.out, "dnn calls: 12") != NULL, "%s", r.out);
    ck_assert_int_eq(tu_stat_row(r.err, "cuDNN calls made operations"), 12);
    tu_result_free(&r);
    tu_result_free(&ref);
}
END_TEST

/* mlp's GEMMs through cuBLAS: cublasGemmEx (A, B, C are kernel parameters) or
 * cublasGemmBatchedEx with batch 1 (the kernel reads A, B and C from pointer arrays in device
 * memory: only the hook, reading the arrays back, can make them resident). */
static const char *const gemm_args[] = {"--iters", "10", "--layers", "12", "--cublas", NULL};
static const char *const batched_args[] = {"--iters",          "10", "--layers", "12",
                                           "--cublas-batched", NULL};

/* _i: cublasGemmEx or the pointer-array form (bit 0), demand or auto (bit 1), inline or threaded
 * with jitter (bit 2); safe mode off. */
START_TEST(test_cublas_at_a_quarter_stays_correct) {
    const char *const *args = (_i & 1) ? batched_args : gemm_args;
    const char *fn = (_i & 1) ? "cublasGemmBatchedEx" : "cublasGemmEx";
    const char *mode = (_i & 2) ? "auto" : "demand";
    const char *sched = (_i & 4) ? "threaded" : "inline";
    tu_result_t ref = oracle_in("workloads/mlp", args);
    char dir[64];
    tu_result_t r = run_in("workloads/mlp", args, &ref, mode, sched, "off", NULL, dir, sizeof dir);
    ck_assert_msg(r.status == 0, "mlp %s %s %s: status %d\n%s", fn, mode, sched, r.status,
                  tu_tail(r.err, 3000));
    ck_assert_msg(strcmp(r.checksum, ref.checksum) == 0, "mlp %s %s %s: checksum %s, oracle %s\n%s",
                  fn, mode, sched, r.checksum, ref.checksum, tu_tail(r.err, 3000));
    ck_assert_msg(tu_stat_row(r.err, "cuBLAS calls made operations") > 0, "%s",
                  tu_tail(r.err, 3000));
    ck_assert_msg(tu_stat_row(r.err, "chunks evicted on demand (LRU)") > 0 ||
                      tu_stat_row(r.err, "planned swap-outs (buffers)") > 0,
                  "nothing was swapped at a quarter:\n%s", tu_tail(r.err, 3000));
    if (_i & 1) /* the arrays were written from the host: read with no wait */
        ck_assert_msg(tu_stat_row(r.err, "pointer arrays read from the host's copy") > 0 &&
                          tu_stat_row(r.err, "pointer arrays read back after a sync") == 0,
                      "%s", tu_tail(r.err, 3000));
    if (_i & 2) {
        char *ops = profile_file(dir, "ops.tsv");
        ck_assert_msg(rows_of(ops, "cublas", fn) > 0, "no cublas op %s:\n%s", fn,
                      tu_tail(ops, 2000));
        ck_assert_msg(rows_of(ops, "kernel", "gemm_f32") == 0 &&
                          rows_of(ops, "kernel", "gemm_batched_f32") == 0,
                      "a cuBLAS kernel is an op of its own:\n%s", tu_tail(ops, 2000));
        free(ops);
    }
    remove_dir(dir);
    tu_result_free(&r);
    tu_result_free(&ref);
}
END_TEST

/* The arrays first name a decoy (another operand), then get their real addresses by a
 * device-to-device copy: from the host's copy of the staging array when nothing else touched it
 * (staged: no sync), else read back after a sync (opaque: a kernel read the staging array, so
 * what it holds is not known on the host). A stale host copy would make the decoys resident
 * instead of the operands: a fault or a wrong checksum. _i: staged or opaque (bit 0), demand or
 * auto (bit 1); threaded with jitter, safe mode off. */
START_TEST(test_pointer_arrays_copied_on_the_device_stay_right) {
    const char *form = (_i & 1) ? "--cublas-batched=opaque" : "--cublas-batched=staged";
    const char *const args[] = {"--iters", "10", "--layers", "12", form, NULL};
    const char *mode = (_i & 2) ? "auto" : "demand";
    tu_result_t ref = oracle_in("workloads/mlp", args);
    tu_result_t plain = oracle_in("workloads/mlp", batched_args);
    ck_assert_str_eq(ref.checksum, plain.checksum);
    char dir[64];
    tu_result_t r =
        run_in("workloads/mlp", args, &ref, mode, "threaded", "off", NULL, dir, sizeof dir);
    ck_assert_msg(r.status == 0 && strcmp(r.checksum, ref.checksum) == 0,
                  "mlp %s %s: status %d, checksum %s, oracle %s\n%s", form, mode, r.status,
                  r.checksum, ref.checksum, tu_tail(r.err, 3000));
    long long kept = tu_stat_row(r.err, "pointer arrays read from the host's copy");
    long long synced = tu_stat_row(r.err, "pointer arrays read back after a sync");
    if (_i & 1)
        ck_assert_msg(kept == 0 && synced > 0, "opaque arrays: %lld kept, %lld read back\n%s", kept,
                      synced, tu_tail(r.err, 3000));
    else
        ck_assert_msg(kept > 0 && synced == 0, "staged arrays: %lld kept, %lld read back\n%s", kept,
                      synced, tu_tail(r.err, 3000));
    ck_assert_msg(tu_stat_row(r.err, "chunks evicted on demand (LRU)") > 0 ||
                      tu_stat_row(r.err, "planned swap-outs (buffers)") > 0,
                  "nothing was swapped at a quarter:\n%s", tu_tail(r.err, 3000));
    remove_dir(dir);
    tu_result_free(&r);
    tu_result_free(&plain);
    tu_result_free(&ref);
}
END_TEST

/* Without the hook the pointer-array GEMM's kernel reaches swapped-out matrices: a clean stop. */
START_TEST(test_pointer_array_gemm_without_the_hook_faults_cleanly) {
    tu_result_t ref = oracle_in("workloads/mlp", batched_args);
    char dir[64];
    tu_result_t r = run_in("workloads/mlp", batched_args, &ref, "demand", "inline", "off",
                           "OOC_TEST_LIB_HOOKS=0", dir, sizeof dir);
    ck_assert_msg(r.status != 0, "ran through without the hook (checksum %s, oracle %s)\n%s",
                  r.checksum, ref.checksum, tu_tail(r.err, 3000));
    ck_assert_msg(strstr(r.err, "the device reported an illegal address") != NULL, "%s",
                  tu_tail(r.err, 3000));
    ck_assert_str_eq(r.checksum, "");
    remove_dir(dir);
    tu_result_free(&r);
    tu_result_free(&ref);
}
END_TEST

Suite *suite_library(void) {
    Suite *s = suite_create("library");
    TCase *tc = tcase_create("cudnn");
    tcase_set_timeout(tc, tu_under_valgrind() ? 36000 : 900);
    tcase_add_test(tc, test_cudnn_calls_are_named_operations);
    tcase_add_loop_test(tc, test_cudnn_at_a_quarter_stays_correct, 0, 8);
    tcase_add_test(tc, test_switched_off_hooks_leave_the_kernels_as_ops);
    tcase_add_loop_test(tc, test_backend_api_at_a_quarter_stays_correct, 0, 4);
    tcase_add_test(tc, test_backend_api_without_the_hook_faults_cleanly);
    tcase_add_test(tc, test_a_program_linked_with_cudnn_reaches_the_hooks);
    suite_add_tcase(s, tc);
    TCase *tb = tcase_create("cublas");
    tcase_set_timeout(tb, tu_under_valgrind() ? 36000 : 900);
    tcase_add_loop_test(tb, test_cublas_at_a_quarter_stays_correct, 0, 8);
    tcase_add_loop_test(tb, test_pointer_arrays_copied_on_the_device_stay_right, 0, 4);
    tcase_add_test(tb, test_pointer_array_gemm_without_the_hook_faults_cleanly);
    suite_add_tcase(s, tb);
    return s;
}
