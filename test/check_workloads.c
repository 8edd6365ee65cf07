/* SPDX-License-Identifier: MIT */
/* check_workloads.c: the training workloads are deterministic on the simulated device.
 *
 * Each test runs build/workloads/<name> as a child with LD_LIBRARY_PATH at the simulated driver
 * (tu_build_path("fakecuda")) and compares what it prints: the same checksum across repeated
 * runs, inline and threaded scheduling, jitter seeds, warm-up extras; the op count against the
 * driver's own statistics; the large workload's out-of-memory failure at its stated capacity;
 * cnn's --blocks option (its footprint and op count per identity block, its checks); cnn
 * --backend (convolution forwards through the cuDNN backend API) gives the legacy checksum; mlp
 * --cublas and --cublas-batched (every GEMM through cuBLAS) give the default one; xfmr's
 * framework paths (--no-ptr-table gives the same checksum; the driver saw the graph launches, the
 * TMA descriptors, the lazily loaded kernels and no illegal access); and --time (one line of
 * per-iteration wall times on stderr, stdout unchanged byte for byte). The loop index _i selects
 * the workload. */
#include <check.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testutil.h"

static const char *const workloads[] = {"mlp", "cnn", "large", "xfmr"};
#define NWORKLOADS  4
#define MLP_IDX     0
#define CNN_IDX     1
#define LARGE_IDX   2
#define XFMR_IDX    3
#define LARGE_CAP   "33554432" /* large.c's stated default capacity, 32 MiB */
#define UNLIMITED   "FAKECUDA_MEM_BYTES=1073741824"
#define RUN_TIMEOUT 90

typedef struct result {
    int status;
    char checksum[64];
    unsigned long long peak, ops;
    char *out, *err;
} result_t;

/* Runs workload `name` with the extra arguments and environment (NULL-terminated lists) and
 * parses its closing lines; *r owns out and err (result_free). */
static void run(const char *name, const char *const *args, const char *const *env, result_t *r) {
    static char libdir[PATH_MAX + 32], bin[PATH_MAX];
    char abs[PATH_MAX];
    const char *dir = tu_build_path("fakecuda");
    snprintf(libdir, sizeof libdir, "LD_LIBRARY_PATH=%s", realpath(dir, abs) ? abs : dir);
    snprintf(bin, sizeof bin, "%s/%s", tu_build_path("workloads"), name);
    const char *argv[16] = {bin};
    int n = 1;
    for (; args && *args && n < 15; args++)
        argv[n++] = *args;
    argv[n] = NULL;
    const char *envv[16] = {libdir};
    int m = 1;
    for (; env && *env && m < 15; env++)
        envv[m++] = *env;
    envv[m] = NULL;
    tu_proc_t p;
    ck_assert_int_eq(tu_run(argv, envv, RUN_TIMEOUT, &p), 0);
    memset(r, 0, sizeof *r);
    r->status = p.status;
    r->out = p.out;
    r->err = p.err;
    char buf[64];
    if (tu_field(p.out, "checksum", r->checksum, sizeof r->checksum) == NULL)
        r->checksum[0] = '\0';
    r->peak = tu_field(p.out, "peak_device_bytes", buf, sizeof buf) ? strtoull(buf, NULL, 10) : 0;
    r->ops = tu_field(p.out, "ops_per_iteration", buf, sizeof buf) ? strtoull(buf, NULL, 10) : 0;
}

static void result_free(result_t *r) {
    free(r->out);
    free(r->err);
    r->out = r->err = NULL;
}

/* Asserts a clean run: status 0 and a 16-hex-digit checksum. */
static void expect_ok(const char *what, const result_t *r) {
    ck_assert_msg(r->status == 0, "%s: status %d\nstdout:\n%s\nstderr:\n%s", what, r->status,
                  r->out, r->err);
    ck_assert_msg(strlen(r->checksum) == 16 &&
                      strspn(r->checksum, "0123456789abcdef") == strlen(r->checksum),
                  "%s: bad checksum '%s'", what, r->checksum);
}

static void expect_same(const char *what, const result_t *a, const result_t *b) {
    ck_assert_msg(strcmp(a->checksum, b->checksum) == 0, "%s: checksum %s != %s", what, a->checksum,
                  b->checksum);
}

START_TEST(test_checksum_repeats_across_runs) {
    result_t a, b;
    run(workloads[_i], NULL, NULL, &a);
    run(workloads[_i], NULL, NULL, &b);
    expect_ok("first run", &a);
    expect_ok("second run", &b);
    expect_same(workloads[_i], &a, &b);
    ck_assert_uint_eq(a.ops, b.ops);
    ck_assert_uint_eq(a.peak, b.peak);
    result_free(&a);
    result_free(&b);
}
END_TEST

START_TEST(test_inline_matches_threaded) {
    static const char *const inl[] = {"FAKECUDA_SCHED=inline", NULL};
    static const char *const thr[] = {"FAKECUDA_SCHED=threaded", NULL};
    result_t a, b;
    run(workloads[_i], NULL, inl, &a);
    run(workloads[_i], NULL, thr, &b);
    expect_ok("inline", &a);
    expect_ok("threaded", &b);
    expect_same(workloads[_i], &a, &b);
    result_free(&a);
    result_free(&b);
}
END_TEST

START_TEST(test_jitter_seeds_keep_checksum) {
    result_t base;
    run(workloads[_i], NULL, NULL, &base);
    expect_ok("no jitter", &base);
    /* The large workload is slower; one seed suffices there. */
    int seeds = _i == LARGE_IDX ? 1 : 3;
    for (int seed = 1; seed <= seeds; seed++) {
        char s[32];
        snprintf(s, sizeof s, "FAKECUDA_SEED=%d", seed);
        const char *env[] = {"FAKECUDA_SCHED=threaded", "FAKECUDA_JITTER_US=100", s, NULL};
        result_t j;
        run(workloads[_i], NULL, env, &j);
        expect_ok(s, &j);
        expect_same(s, &base, &j);
        result_free(&j);
    }
    result_free(&base);
}
END_TEST

START_TEST(test_last_batch_trains_deterministically) {
    static const char *const args[] = {"--iters", "3", "--last-batch", "2", NULL};
    static const char *const jit[] = {"FAKECUDA_JITTER_US=50", "FAKECUDA_SEED=7", NULL};
    static const char *const inl[] = {"FAKECUDA_SCHED=inline", NULL};
    result_t a, b, full;
    run(workloads[_i], args, jit, &a);
    run(workloads[_i], args, inl, &b);
    run(workloads[_i], NULL, inl, &full);
    expect_ok("--last-batch (jitter)", &a);
    expect_ok("--last-batch (inline)", &b);
    expect_ok("full batches", &full);
    expect_same("--last-batch", &a, &b);
    ck_assert_msg(strstr(a.out, "iter 2: batch 2 ") != NULL, "no short last batch:\n%s", a.out);
    ck_assert_msg(strcmp(a.checksum, full.checksum) != 0, "a short last batch changed nothing");
    ck_assert_uint_eq(a.ops, full.ops);
    result_free(&a);
    result_free(&b);
    result_free(&full);
}
END_TEST

START_TEST(test_warmup_extras_keep_checksum) {
    static const char *const args[] = {"--warmup-differs", NULL};
    static const char *const jit[] = {"FAKECUDA_JITTER_US=50", "FAKECUDA_SEED=3", NULL};
    result_t plain, warm;
    run(workloads[_i], NULL, NULL, &plain);
    run(workloads[_i], args, jit, &warm);
    expect_ok("plain", &plain);
    expect_ok("--warmup-differs", &warm);
    expect_same("--warmup-differs", &plain, &warm);
    ck_assert_uint_eq(plain.ops, warm.ops);
    ck_assert_uint_ge(warm.peak, plain.peak);
    result_free(&plain);
    result_free(&warm);
}
END_TEST

/* cnn's ops_per_iteration with --blocks n: 57 for the stem, the strided block with its shortcut,
 * the head and their SGD steps, and 24 for each identity block (7 forward: two convs, two batch
 * norms, two ReLUs, the skip's add; 11 backward: two ReLU backwards, the skip's copy, two batch
 * norm backwards, and per conv a memset of the weight gradient, backward-filter and
 * backward-data; 6 SGD steps: two conv weights, two BN scales and biases). */
static unsigned long long cnn_ops(int blocks) {
    return 57 + 24ull * (unsigned long long)blocks;
}

/* Sum of kernel launches, memcpys and memsets in a FAKECUDA_STATS file. */
static unsigned long long stats_ops(const char *path) {
    FILE *f = fopen(path, "r");
    ck_assert_msg(f != NULL, "no stats file %s", path);
    char key[128];
    unsigned long long v, sum = 0;
    while (fscanf(f, "%127s %llu", key, &v) == 2)
        if (!strcmp(key, "kernels_launched") || !strcmp(key, "memcpys") || !strcmp(key, "memsets"))
            sum += v;
    fclose(f);
    return sum;
}

/* Asserts that workload `name`, run with the extra arguments (NULL or a NULL-terminated list of
 * at most 8), reports as ops_per_iteration what the driver counted in its third iteration;
 * returns that count. */
static unsigned long long expect_ops_match_driver(const char *name, const char *const *extra) {
    unsigned long long total[2];
    result_t r[2];
    for (int k = 0; k < 2; k++) {
        char path[64], stats[96];
        snprintf(path, sizeof path, "/tmp/ooc-wl-stats-%d-%d", (int)getpid(), k);
        snprintf(stats, sizeof stats, "FAKECUDA_STATS=%s", path);
        const char *args[12] = {"--iters", k == 0 ? "2" : "3", "--mark"};
        for (int a = 0; extra && extra[a] && a < 8; a++)
            args[3 + a] = extra[a];
        const char *env[] = {stats, NULL};
        run(name, args, env, &r[k]);
        expect_ok(args[1], &r[k]);
        total[k] = stats_ops(path);
        unlink(path);
    }
    ck_assert_uint_eq(r[0].ops, r[1].ops);
    ck_assert_msg(total[1] - total[0] == r[0].ops,
                  "driver saw %llu ops in one iteration, "
                  "workload says %llu",
                  total[1] - total[0], r[0].ops);
    unsigned long long ops = r[0].ops;
    result_free(&r[0]);
    result_free(&r[1]);
    return ops;
}

START_TEST(test_ops_per_iteration_matches_driver) {
    expect_ops_match_driver(workloads[_i], NULL);
}
END_TEST

START_TEST(test_output_ends_with_report) {
    static const char *const args[] = {"--iters", "2", NULL};
    result_t r;
    run(workloads[_i], args, NULL, &r);
    expect_ok("run", &r);
    ck_assert_ptr_nonnull(strstr(r.out, "iter 0: batch "));
    ck_assert_ptr_nonnull(strstr(r.out, "iter 1: batch "));
    ck_assert_ptr_null(strstr(r.out, "iter 2: batch "));
    const char *tail = strstr(r.out, "peak_device_bytes: ");
    ck_assert_ptr_nonnull(tail);
    unsigned long long peak, ops;
    char sum[17], end[4];
    ck_assert_int_eq(sscanf(tail,
                            "peak_device_bytes: %llu\nops_per_iteration: %llu\n"
                            "checksum: %16[0-9a-f]\n%3s",
                            &peak, &ops, sum, end),
                     3);
    ck_assert_uint_gt(peak, 0);
    ck_assert_uint_gt(ops, 0);
    result_free(&r);
}
END_TEST

START_TEST(test_help_documents_options) {
    static const char *const args[] = {"--help", NULL};
    static const char *const bad[] = {"--no-such-option", NULL};
    result_t r, e;
    run(workloads[_i], args, NULL, &r);
    ck_assert_int_eq(r.status, 0);
    const char *opts[] = {"--iters",           "--seed",   "--batch", "--last-batch",
                          "--warmup-differs",  "--mark",   "--help",  "peak_device_bytes",
                          "ops_per_iteration", "checksum", "--time",  "time: per-iteration ms:"};
    for (size_t i = 0; i < sizeof opts / sizeof opts[0]; i++)
        ck_assert_msg(strstr(r.out, opts[i]) != NULL, "--help does not mention %s", opts[i]);
    if (_i == LARGE_IDX)
        ck_assert_msg(strstr(r.out, "FAKECUDA_MEM_BYTES=" LARGE_CAP) != NULL,
                      "large --help does not state its capacity");
    if (_i == CNN_IDX) {
        ck_assert_msg(strstr(r.out, "--blocks N (1..16, default 1)") != NULL,
                      "cnn --help does not document --blocks");
        ck_assert_msg(strstr(r.out, "--backend") != NULL, "cnn --help does not document --backend");
    }
    if (_i == MLP_IDX) {
        ck_assert_msg(strstr(r.out, "--cublas sends") != NULL, "mlp --help: no --cublas");
        ck_assert_msg(strstr(r.out, "--cublas-batched issues") != NULL,
                      "mlp --help: no --cublas-batched");
    }
    if (_i == XFMR_IDX) {
        ck_assert_msg(strstr(r.out, "--no-ptr-table") != NULL,
                      "xfmr --help does not document --no-ptr-table");
        ck_assert_msg(strstr(r.out, "--blocks N (1..16, default 1)") != NULL,
                      "xfmr --help does not document --blocks");
    }
    run(workloads[_i], bad, NULL, &e);
    ck_assert_int_eq(e.status, 1);
    result_free(&r);
    result_free(&e);
}
END_TEST

/* Checks the --time line of a run of `iters` iterations: exactly one line on stderr, `iters`
 * positive times, and the median of the iterations it names (4..iters-1, or all of them when
 * there are 4 or fewer), recomputed here from the printed times. */
static void expect_time_line(const char *err, int iters) {
    const char *line = strstr(err, "time: per-iteration ms:");
    ck_assert_msg(line != NULL, "no time line on stderr:\n%s", err);
    ck_assert_msg(strstr(line + 1, "time: per-iteration ms:") == NULL, "two time lines:\n%s", err);
    const char *p = line + strlen("time: per-iteration ms:");
    double t[64];
    int n = 0;
    for (;;) {
        char *end;
        while (*p == ' ')
            p++;
        double v = strtod(p, &end);
        if (end == p)
            break;
        ck_assert_int_lt(n, 64);
        ck_assert_msg(v > 0.0, "iteration %d: %g ms", n, v);
        t[n++] = v;
        p = end;
    }
    ck_assert_msg(n == iters, "%d times for %d iterations: %s", n, iters, line);
    int first, last;
    double med;
    ck_assert_msg(sscanf(p, "(median of iterations %d..%d: %lf)", &first, &last, &med) == 3,
                  "no median in: %s", line);
    ck_assert_int_eq(first, iters > 4 ? 4 : 0);
    ck_assert_int_eq(last, iters - 1);
    /* the median of t[first..last] (a few values: sort by insertion) */
    double s[64];
    int m = 0;
    for (int i = first; i <= last; i++) {
        int j = m++;
        for (; j > 0 && s[j - 1] > t[i]; j--)
            s[j] = s[j - 1];
        s[j] = t[i];
    }
    double want = m % 2 ? s[m / 2] : (s[m / 2 - 1] + s[m / 2]) / 2;
    ck_assert_msg(med > want - 0.0015 && med < want + 0.0015, "median %.3f, expected %.3f", med,
                  want);
    const char *nl = strchr(line, '\n');
    ck_assert_msg(nl && nl[1] == '\0', "the time line is not the last line of stderr:\n%s", err);
}

/* --time prints one line of per-iteration wall times on stderr and changes nothing on stdout:
 * the loss lines, the report and the checksum are the same bytes as without it. */
START_TEST(test_time_reports_iterations_and_keeps_output) {
    static const char *const plain[] = {"--iters", "6", NULL};
    static const char *const timed[] = {"--iters", "6", "--time", NULL};
    static const char *const timed_short[] = {"--time", "--iters", "3", NULL};
    static const char *const thr[] = {"FAKECUDA_SCHED=threaded", NULL};
    result_t a, b, c;
    run(workloads[_i], plain, thr, &a);
    run(workloads[_i], timed, thr, &b);
    run(workloads[_i], timed_short, thr, &c);
    expect_ok("without --time", &a);
    expect_ok("--time", &b);
    expect_ok("--time --iters 3", &c);
    expect_same("--time", &a, &b);
    ck_assert_msg(strcmp(a.out, b.out) == 0, "stdout differs with --time:\n%s\n---\n%s", a.out,
                  b.out);
    ck_assert_msg(strstr(a.err, "time:") == NULL, "a time line without --time:\n%s", a.err);
    expect_time_line(b.err, 6);
    expect_time_line(c.err, 3);
    result_free(&a);
    result_free(&b);
    result_free(&c);
}
END_TEST

START_TEST(test_large_runs_out_of_memory_at_its_capacity) {
    static const char *const env[] = {"FAKECUDA_MEM_BYTES=" LARGE_CAP, NULL};
    result_t r;
    run("large", NULL, env, &r);
    ck_assert_msg(r.status == 2, "status %d, stderr:\n%s", r.status, r.err);
    ck_assert_msg(strstr(r.err, "error: cuMemAlloc_v2: CUDA_ERROR_OUT_OF_MEMORY (2)") != NULL,
                  "stderr:\n%s", r.err);
    ck_assert_ptr_nonnull(strstr(r.err, " bytes"));
    ck_assert_ptr_null(strstr(r.out, "checksum: "));
    result_free(&r);
}
END_TEST

START_TEST(test_large_footprint_is_4_to_8_times_capacity) {
    static const char *const env[] = {UNLIMITED, NULL};
    const unsigned long long cap = strtoull(LARGE_CAP, NULL, 10);
    result_t r;
    run("large", NULL, env, &r);
    expect_ok("unlimited", &r);
    ck_assert_msg(r.peak >= 4 * cap && r.peak <= 8 * cap, "peak %llu vs capacity %llu", r.peak,
                  cap);
    result_free(&r);
}
END_TEST

START_TEST(test_small_workloads_fit_the_large_capacity) {
    static const char *const env[] = {"FAKECUDA_MEM_BYTES=" LARGE_CAP, NULL};
    result_t r;
    run(workloads[_i], NULL, env, &r);
    expect_ok(workloads[_i], &r);
    result_free(&r);
}
END_TEST

/* cnn --blocks N (_i + 2: 2 and 3) gives one checksum inline, threaded and under jitter, with and
 * without the autotuning extras. */
START_TEST(test_cnn_blocks_are_deterministic) {
    char n[16];
    snprintf(n, sizeof n, "%d", _i + 2);
    const char *args[] = {"--blocks", n, NULL};
    const char *warm[] = {"--blocks", n, "--warmup-differs", NULL};
    static const char *const inl[] = {"FAKECUDA_SCHED=inline", NULL};
    static const char *const thr[] = {"FAKECUDA_SCHED=threaded", NULL};
    static const char *const jit[] = {"FAKECUDA_SCHED=threaded", "FAKECUDA_JITTER_US=20",
                                      "FAKECUDA_SEED=5", NULL};
    result_t a, b, c, d, one;
    run("cnn", args, inl, &a);
    run("cnn", args, thr, &b);
    run("cnn", args, jit, &c);
    run("cnn", warm, jit, &d);
    run("cnn", NULL, inl, &one);
    expect_ok("inline", &a);
    expect_ok("threaded", &b);
    expect_ok("jitter", &c);
    expect_ok("--warmup-differs", &d);
    expect_ok("--blocks 1", &one);
    expect_same("threaded", &a, &b);
    expect_same("jitter", &a, &c);
    expect_same("--warmup-differs", &a, &d);
    ck_assert_uint_eq(a.ops, d.ops);
    ck_assert_msg(strcmp(a.checksum, one.checksum) != 0, "--blocks %s trains like --blocks 1", n);
    result_free(&a);
    result_free(&b);
    result_free(&c);
    result_free(&d);
    result_free(&one);
}
END_TEST

/* --blocks 1 is the default; each further block adds the same footprint (its activations and
 * parameters) and 24 ops per iteration. */
START_TEST(test_cnn_footprint_grows_with_blocks) {
    result_t def, r[4];
    run("cnn", NULL, NULL, &def);
    expect_ok("default", &def);
    for (int k = 0; k < 4; k++) {
        char n[16];
        snprintf(n, sizeof n, "%d", k + 1);
        const char *args[] = {"--blocks", n, NULL};
        run("cnn", args, NULL, &r[k]);
        expect_ok(n, &r[k]);
        ck_assert_msg(r[k].ops == cnn_ops(k + 1), "--blocks %s: %llu ops per iteration, not %llu",
                      n, r[k].ops, cnn_ops(k + 1));
    }
    expect_same("--blocks 1", &def, &r[0]);
    ck_assert_uint_eq(def.peak, r[0].peak);
    ck_assert_uint_eq(def.ops, r[0].ops);
    unsigned long long step = r[1].peak - r[0].peak;
    ck_assert_msg(r[1].peak > r[0].peak, "peak %llu at 2 blocks, %llu at 1", r[1].peak, r[0].peak);
    for (int k = 2; k < 4; k++)
        ck_assert_msg(r[k].peak - r[k - 1].peak == step, "peak %llu at %d blocks, %llu at %d",
                      r[k].peak, k + 1, r[k - 1].peak, k);
    /* Each block keeps at least its four activations (batch x 16 x 16 x 16 floats) live. */
    ck_assert_uint_ge(step, 4ull * 8 * 16 * 16 * 16 * sizeof(float));
    result_free(&def);
    for (int k = 0; k < 4; k++)
        result_free(&r[k]);
}
END_TEST

START_TEST(test_cnn_blocks_ops_match_driver) {
    static const char *const args[] = {"--blocks", "16", NULL};
    ck_assert_uint_eq(expect_ops_match_driver("cnn", args), cnn_ops(16));
}
END_TEST

/* A --blocks value outside 1..16 or not an integer stops the program with status 2 and a
 * message that names the option, the value and the range. */
static void expect_rejects_bad_blocks(const char *prog) {
    static const char *const bad[] = {"0", "17", "x", "-1", "4x", ""};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        const char *args[] = {"--blocks", bad[k], NULL};
        char want[64];
        snprintf(want, sizeof want, "--blocks %s: expected an integer from 1 to 16", bad[k]);
        result_t r;
        run(prog, args, NULL, &r);
        ck_assert_msg(r.status == 2, "%s --blocks '%s': status %d", prog, bad[k], r.status);
        ck_assert_msg(strstr(r.err, want) != NULL, "%s --blocks '%s': stderr:\n%s", prog, bad[k],
                      r.err);
        ck_assert_ptr_null(strstr(r.out, "checksum: "));
        result_free(&r);
    }
}

START_TEST(test_cnn_rejects_bad_blocks) {
    expect_rejects_bad_blocks("cnn");
}
END_TEST

/* Reads one counter from a FAKECUDA_STATS file (-1 when absent). */
static long long stats_value(const char *path, const char *name) {
    FILE *f = fopen(path, "r");
    ck_assert_msg(f != NULL, "no stats file %s", path);
    char key[128];
    unsigned long long v;
    long long found = -1;
    while (fscanf(f, "%127s %llu", key, &v) == 2)
        if (!strcmp(key, name))
            found = (long long)v;
    fclose(f);
    return found;
}

/* xfmr without the device pointer table computes the same bits (the grouped GEMM and the three
 * separate GEMMs run the same products), inline, threaded and under jitter, and the driver saw
 * what the program claims: one graph launch per iteration, no illegal access. */
START_TEST(test_xfmr_pointer_table_and_separate_gemms_agree) {
    static const char *const nopt[] = {"--no-ptr-table", NULL};
    static const char *const inl[] = {"FAKECUDA_SCHED=inline", NULL};
    result_t a, b, c;
    char path[64], stats[96];
    snprintf(path, sizeof path, "/tmp/ooc-xfmr-stats-%d", (int)getpid());
    snprintf(stats, sizeof stats, "FAKECUDA_STATS=%s", path);
    const char *jit[] = {"FAKECUDA_SCHED=threaded", "FAKECUDA_JITTER_US=100", "FAKECUDA_SEED=5",
                         stats, NULL};
    run("xfmr", NULL, inl, &a);
    run("xfmr", nopt, jit, &b);
    expect_ok("with the table", &a);
    expect_ok("--no-ptr-table", &b);
    expect_same("--no-ptr-table", &a, &b);
    /* Each grouped GEMM (a table copy and one launch) becomes three GEMMs. */
    ck_assert_uint_eq(b.ops, a.ops + 2);
    ck_assert_int_eq(stats_value(path, "graph_launches"), 6);
    ck_assert_int_eq(stats_value(path, "illegal_accesses"), 0);
    ck_assert_int_eq(stats_value(path, "graphs_live"), 0);
    ck_assert_int_eq(stats_value(path, "graph_execs_live"), 0);
    unlink(path);
    run("xfmr", nopt, inl, &c);
    expect_ok("--no-ptr-table inline", &c);
    expect_same("--no-ptr-table inline", &a, &c);
    result_free(&a);
    result_free(&b);
    result_free(&c);
}
END_TEST

/* The batch size changes the tensor maps' shapes and the graph's gradient pointers: a run whose
 * batch changes mid-way is still deterministic, and differs from one that does not. */
START_TEST(test_xfmr_batch_change_reencodes_and_stays_deterministic) {
    static const char *const change[] = {"--batch-from", "3:2", NULL};
    static const char *const jit[] = {"FAKECUDA_SCHED=threaded", "FAKECUDA_JITTER_US=50",
                                      "FAKECUDA_SEED=9", NULL};
    static const char *const inl[] = {"FAKECUDA_SCHED=inline", NULL};
    result_t a, b, full;
    run("xfmr", change, jit, &a);
    run("xfmr", change, inl, &b);
    run("xfmr", NULL, inl, &full);
    expect_ok("--batch-from (jitter)", &a);
    expect_ok("--batch-from (inline)", &b);
    expect_ok("full", &full);
    expect_same("--batch-from", &a, &b);
    ck_assert_msg(strcmp(a.checksum, full.checksum) != 0, "a smaller batch changed nothing");
    ck_assert_ptr_nonnull(strstr(a.out, "iter 3: batch 2 "));
    result_free(&a);
    result_free(&b);
    result_free(&full);
}
END_TEST

/* xfmr's ops_per_iteration with --blocks n at the default batch (4 sequences), with the
 * pointer table: 46 per block, 6 GEMMs per sequence (24) and 22 more (two grouped GEMMs of a
 * table copy and a launch each, softmax forward and backward, the O Wo GEMM, the residual add,
 * the two GEMMs of Wo's backward, the input gradient's three GEMMs and add, and the block's
 * graph: 4 SGD steps, 2 in the child, a memset and a memcpy); and 4 more: the token and label
 * copies, the logits GEMM, the loss, the two head gradient GEMMs, Wc's SGD step in the last
 * graph and the loss read back (8), less the input gradient the first block does not compute. */
static unsigned long long xfmr_ops(int blocks) {
    return 4 + 46ull * (unsigned long long)blocks;
}

/* xfmr --blocks 3 gives one checksum inline, threaded, under jitter, with the autotuning extras
 * and without the pointer table, and it is not the one-block program's. */
START_TEST(test_xfmr_blocks_are_deterministic) {
    static const char *const args[] = {"--blocks", "3", NULL};
    static const char *const warm[] = {"--blocks", "3", "--warmup-differs", NULL};
    static const char *const nopt[] = {"--blocks", "3", "--no-ptr-table", NULL};
    static const char *const inl[] = {"FAKECUDA_SCHED=inline", NULL};
    static const char *const thr[] = {"FAKECUDA_SCHED=threaded", NULL};
    static const char *const jit[] = {"FAKECUDA_SCHED=threaded", "FAKECUDA_JITTER_US=20",
                                      "FAKECUDA_SEED=5", NULL};
    result_t a, b, c, d, e, one;
    run("xfmr", args, inl, &a);
    run("xfmr", args, thr, &b);
    run("xfmr", args, jit, &c);
    run("xfmr", warm, jit, &d);
    run("xfmr", nopt, jit, &e);
    run("xfmr", NULL, inl, &one);
    expect_ok("inline", &a);
    expect_ok("threaded", &b);
    expect_ok("jitter", &c);
    expect_ok("--warmup-differs", &d);
    expect_ok("--no-ptr-table", &e);
    expect_ok("--blocks 1", &one);
    expect_same("threaded", &a, &b);
    expect_same("jitter", &a, &c);
    expect_same("--warmup-differs", &a, &d);
    expect_same("--no-ptr-table", &a, &e);
    ck_assert_uint_eq(a.ops, d.ops);
    /* Each block's two grouped GEMMs (a table copy and a launch each) become six GEMMs. */
    ck_assert_uint_eq(e.ops, a.ops + 2 * 3);
    ck_assert_msg(strcmp(a.checksum, one.checksum) != 0, "--blocks 3 trains like --blocks 1");
    result_free(&a);
    result_free(&b);
    result_free(&c);
    result_free(&d);
    result_free(&e);
    result_free(&one);
}
END_TEST

/* --blocks 1 is the default (same checksum, peak and ops); each further block adds 46 ops per
 * iteration and, from the third on, the same footprint: its activations (QKV, the attention
 * workspace, O and h), live from its forward to its backward. The second adds one activation
 * more: the gradient at a block's input, which the first block does not compute. */
START_TEST(test_xfmr_footprint_grows_with_blocks) {
    result_t def, r[4];
    run("xfmr", NULL, NULL, &def);
    expect_ok("default", &def);
    for (int k = 0; k < 4; k++) {
        char n[16];
        snprintf(n, sizeof n, "%d", k + 1);
        const char *args[] = {"--blocks", n, NULL};
        run("xfmr", args, NULL, &r[k]);
        expect_ok(n, &r[k]);
        ck_assert_msg(r[k].ops == xfmr_ops(k + 1), "--blocks %s: %llu ops per iteration, not %llu",
                      n, r[k].ops, xfmr_ops(k + 1));
    }
    expect_same("--blocks 1", &def, &r[0]);
    ck_assert_uint_eq(def.peak, r[0].peak);
    ck_assert_uint_eq(def.ops, r[0].ops);
    const unsigned long long act = 4ull * 8 * 32 * sizeof(float); /* batch x T x D floats */
    unsigned long long step = r[2].peak - r[1].peak;
    ck_assert_msg(r[1].peak - r[0].peak == step + act,
                  "peak %llu at 2 blocks, %llu at 1, %llu at 3", r[1].peak, r[0].peak, r[2].peak);
    ck_assert_msg(r[3].peak - r[2].peak == step, "peak %llu at 4 blocks, %llu at 3", r[3].peak,
                  r[2].peak);
    /* QKV (3), the workspace (at least 1), O and h: at least six activations per block. */
    ck_assert_uint_ge(step, 6 * act);
    result_free(&def);
    for (int k = 0; k < 4; k++)
        result_free(&r[k]);
}
END_TEST

START_TEST(test_xfmr_blocks_ops_match_driver) {
    static const char *const args[] = {"--blocks", "16", NULL};
    ck_assert_uint_eq(expect_ops_match_driver("xfmr", args), xfmr_ops(16));
}
END_TEST

/* A --blocks value outside 1..16 or not an integer stops xfmr as it stops cnn. */
START_TEST(test_xfmr_rejects_bad_blocks) {
    expect_rejects_bad_blocks("xfmr");
}
END_TEST

/* cnn --backend runs every convolution forward through the cuDNN backend API (a plan per layer
 * and batch size, a variant pack and a workspace per call) and trains exactly as the legacy
 * calls do: the same checksum inline, threaded and under jitter, and with two identity blocks
 * and a short last batch (two plans per layer). Each convolution forward is one more op (the
 * library's table copy), as the driver counts: 4 + 2 per identity block. */
START_TEST(test_cnn_backend_matches_legacy) {
    static const char *const be[] = {"--backend", NULL};
    static const char *const short_legacy[] = {"--blocks",     "2", "--iters", "3",
                                               "--last-batch", "2", NULL};
    static const char *const short_be[] = {"--blocks",     "2", "--iters",   "3",
                                           "--last-batch", "2", "--backend", NULL};
    static const char *const inl[] = {"FAKECUDA_SCHED=inline", NULL};
    static const char *const jit[] = {"FAKECUDA_SCHED=threaded", "FAKECUDA_JITTER_US=20",
                                      "FAKECUDA_SEED=9", NULL};
    result_t legacy, backend, jitter, sl, sb;
    run("cnn", NULL, inl, &legacy);
    run("cnn", be, inl, &backend);
    run("cnn", be, jit, &jitter);
    run("cnn", short_legacy, inl, &sl);
    run("cnn", short_be, jit, &sb);
    expect_ok("legacy", &legacy);
    expect_ok("--backend", &backend);
    expect_ok("--backend (jitter)", &jitter);
    expect_ok("--blocks 2 --last-batch 2", &sl);
    expect_ok("--blocks 2 --last-batch 2 --backend", &sb);
    expect_same("--backend", &legacy, &backend);
    expect_same("--backend (jitter)", &legacy, &jitter);
    expect_same("--blocks 2 --last-batch 2 --backend", &sl, &sb);
    ck_assert_msg(strcmp(legacy.checksum, sl.checksum) != 0,
                  "the short run trains like the default");
    ck_assert_uint_eq(backend.ops, legacy.ops + 6);
    ck_assert_uint_eq(sb.ops, sl.ops + 8);
    result_free(&legacy);
    result_free(&backend);
    result_free(&jitter);
    result_free(&sl);
    result_free(&sb);
    ck_assert_uint_eq(expect_ops_match_driver("cnn", be), cnn_ops(1) + 6);
}
END_TEST

/* mlp --cublas sends every GEMM through the simulated cuBLAS as cublasGemmEx, --cublas-batched
 * as a cublasGemmBatchedEx of one member whose pointer arrays are per-call temporaries in device
 * memory: both train exactly as module nn's GEMM does (the same checksum), inline, threaded
 * under jitter, deeper and with a short last batch. cublasGemmEx is one op like the kernel it
 * replaces; the batched form adds its three array copies per GEMM (8 GEMMs per iteration at 3
 * layers), as the driver counts. */
START_TEST(test_mlp_cublas_matches_default) {
    static const char *const ex[] = {"--cublas", NULL};
    static const char *const bat[] = {"--cublas-batched", NULL};
    static const char *const deep[] = {"--layers",         "5", "--last-batch", "7",
                                       "--warmup-differs", NULL};
    static const char *const deep_ex[] = {"--layers", "5", "--last-batch", "7", "--warmup-differs",
                                          "--cublas", NULL};
    static const char *const deep_bat[] = {
        "--layers", "5", "--last-batch", "7", "--warmup-differs", "--cublas-batched", NULL};
    static const char *const inl[] = {"FAKECUDA_SCHED=inline", NULL};
    static const char *const jit[] = {"FAKECUDA_SCHED=threaded", "FAKECUDA_JITTER_US=50",
                                      "FAKECUDA_SEED=11", NULL};
    const char *const *args[] = {NULL, ex, ex, bat, bat, deep, deep_ex, deep_bat};
    const char *const *envs[] = {inl, inl, jit, inl, jit, inl, jit, jit};
    const char *what[] = {"default",
                          "--cublas",
                          "--cublas (jitter)",
                          "--cublas-batched",
                          "--cublas-batched (jitter)",
                          "deep",
                          "deep --cublas",
                          "deep --cublas-batched"};
    result_t r[8];
    for (int i = 0; i < 8; i++) {
        run("mlp", args[i], envs[i], &r[i]);
        expect_ok(what[i], &r[i]);
    }
    for (int i = 1; i < 5; i++)
        expect_same(what[i], &r[0], &r[i]);
    expect_same(what[6], &r[5], &r[6]);
    expect_same(what[7], &r[5], &r[7]);
    ck_assert_msg(strcmp(r[0].checksum, r[5].checksum) != 0,
                  "the deep run trains like the default");
    ck_assert_uint_eq(r[1].ops, r[0].ops);
    ck_assert_uint_eq(r[3].ops, r[0].ops + 3 * 8);
    ck_assert_uint_eq(r[6].ops, r[5].ops);
    ck_assert_uint_eq(r[7].ops, r[5].ops + 3 * 14);
    for (int i = 0; i < 8; i++)
        result_free(&r[i]);
    ck_assert_uint_eq(expect_ops_match_driver("mlp", bat), 28 + 3 * 8);
    ck_assert_uint_eq(expect_ops_match_driver("mlp", ex), 28);
}
END_TEST

Suite *suite_workloads(void);
Suite *suite_workloads(void) {
    Suite *s = suite_create("workloads");
    TCase *tc = tcase_create("determinism");
    tcase_set_timeout(tc, 240);
    tcase_add_loop_test(tc, test_checksum_repeats_across_runs, 0, NWORKLOADS);
    tcase_add_loop_test(tc, test_inline_matches_threaded, 0, NWORKLOADS);
    tcase_add_loop_test(tc, test_jitter_seeds_keep_checksum, 0, NWORKLOADS);
    tcase_add_loop_test(tc, test_last_batch_trains_deterministically, 0, NWORKLOADS);
    tcase_add_loop_test(tc, test_warmup_extras_keep_checksum, 0, NWORKLOADS);
    suite_add_tcase(s, tc);
    tc = tcase_create("output");
    tcase_set_timeout(tc, 240);
    tcase_add_loop_test(tc, test_ops_per_iteration_matches_driver, 0, NWORKLOADS);
    tcase_add_loop_test(tc, test_output_ends_with_report, 0, NWORKLOADS);
    tcase_add_loop_test(tc, test_help_documents_options, 0, NWORKLOADS);
    tcase_add_loop_test(tc, test_time_reports_iterations_and_keeps_output, 0, NWORKLOADS);
    suite_add_tcase(s, tc);
    tc = tcase_create("capacity");
    tcase_set_timeout(tc, 240);
    tcase_add_test(tc, test_large_runs_out_of_memory_at_its_capacity);
    tcase_add_test(tc, test_large_footprint_is_4_to_8_times_capacity);
    tcase_add_loop_test(tc, test_small_workloads_fit_the_large_capacity, 0, LARGE_IDX);
    suite_add_tcase(s, tc);
    tc = tcase_create("cnn-blocks");
    tcase_set_timeout(tc, 240);
    tcase_add_loop_test(tc, test_cnn_blocks_are_deterministic, 0, 2);
    tcase_add_test(tc, test_cnn_footprint_grows_with_blocks);
    tcase_add_test(tc, test_cnn_blocks_ops_match_driver);
    tcase_add_test(tc, test_cnn_rejects_bad_blocks);
    suite_add_tcase(s, tc);
    tc = tcase_create("cnn-backend");
    tcase_set_timeout(tc, 240);
    tcase_add_test(tc, test_cnn_backend_matches_legacy);
    suite_add_tcase(s, tc);
    tc = tcase_create("mlp-cublas");
    tcase_set_timeout(tc, 240);
    tcase_add_test(tc, test_mlp_cublas_matches_default);
    suite_add_tcase(s, tc);
    tc = tcase_create("xfmr");
    tcase_set_timeout(tc, 240);
    tcase_add_test(tc, test_xfmr_pointer_table_and_separate_gemms_agree);
    tcase_add_test(tc, test_xfmr_batch_change_reencodes_and_stays_deterministic);
    tcase_add_test(tc, test_xfmr_blocks_are_deterministic);
    tcase_add_test(tc, test_xfmr_footprint_grows_with_blocks);
    tcase_add_test(tc, test_xfmr_blocks_ops_match_driver);
    tcase_add_test(tc, test_xfmr_rejects_bad_blocks);
    suite_add_tcase(s, tc);
    return s;
}
