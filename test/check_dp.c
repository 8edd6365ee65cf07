/* SPDX-License-Identifier: MIT */
/* check_dp.c: data-parallel cnn through the simulated NCCL, its oracle and scripts/ooc-torchrun.
 *
 * `cnn --shards 1` is the plain program; W ranks launched by scripts/ooc-torchrun (inline, and
 * threaded with jitter) each end with the checksum of the single-process oracle
 * `cnn --shards W`, which differs from the one-shard run's; a rank that fails makes the
 * launcher stop the others within seconds and name it, leaving no process behind; the
 * launcher's timeout stops every rank (exit 124) and names them; bad process-group variables
 * and a global batch that the ranks cannot share are clear errors. The ranks run on the
 * simulated driver (LD_LIBRARY_PATH=<build>/fakecuda, which the launcher passes on). */
#include <check.h>
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "testutil.h"

Suite *suite_dp(void);

/* Small and quick: one identity block, three iterations, a batch of 8 (2 or 4 per rank). */
#define CNN_ARGS "--blocks", "1", "--iters", "3", "--batch", "8"

static const char *const cnn_args[] = {CNN_ARGS, NULL};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void remove_dir(const char *dir) {
    char cmd[160];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    ck_assert_int_eq(system(cmd), 0);
}

/* The whole of a small file, NUL-terminated (the caller frees it); NULL when it cannot be read. */
static char *slurp(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f)
        return NULL;
    char *buf = calloc(1, 1 << 20);
    ck_assert_ptr_nonnull(buf);
    size_t n = fread(buf, 1, (1 << 20) - 1, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

/* How many segments of the simulated NCCL exist (/dev/shm/fakenccl-*). */
static int nccl_segments(void) {
    DIR *d = opendir("/dev/shm");
    int n = 0;
    if (!d)
        return 0;
    for (struct dirent *e; (e = readdir(d));)
        n += strncmp(e->d_name, "fakenccl-", 9) == 0;
    closedir(d);
    return n;
}

/* How many live processes have `tag` (a "K=V" string) in their environment. */
static int processes_with(const char *tag) {
    DIR *d = opendir("/proc");
    ck_assert_ptr_nonnull(d);
    struct dirent *e;
    int n = 0;
    size_t tl = strlen(tag);
    static char buf[1 << 16];
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] < '0' || e->d_name[0] > '9')
            continue;
        char path[300];
        snprintf(path, sizeof path, "/proc/%s/environ", e->d_name);
        int fd = open(path, O_RDONLY);
        if (fd < 0)
            continue;
        ssize_t len = read(fd, buf, sizeof buf);
        close(fd);
        for (ssize_t i = 0; i + (ssize_t)tl <= len; i += (ssize_t)strlen(buf + i) + 1)
            if (memcmp(buf + i, tag, tl) == 0 && buf[i + (ssize_t)tl] == '\0') {
                n++;
                break;
            }
    }
    closedir(d);
    return n;
}

/* Runs scripts/ooc-torchrun --nproc-per-node n --log-dir dir [--timeout t] -- argv... with the
 * simulated driver and the extra variables (NULL-terminated, at most 8). */
static tu_proc_t launch(int n, const char *dir, int timeout_s, const char *const *prog,
                        const char *const *extra, int limit_s) {
    char np[16], to[16];
    snprintf(np, sizeof np, "%d", n);
    snprintf(to, sizeof to, "%d", timeout_s);
    const char *argv[48] = {"scripts/ooc-torchrun", "--nproc-per-node", np, "--log-dir", dir};
    int a = 5;
    if (timeout_s) {
        argv[a++] = "--timeout";
        argv[a++] = to;
    }
    argv[a++] = "--";
    for (; *prog && a < 46; prog++)
        argv[a++] = *prog;
    argv[a] = NULL;
    const char *env[12] = {tu_fakecuda_libpath()};
    int e = 1;
    for (; extra && *extra && e < 11; extra++)
        env[e++] = *extra;
    env[e] = NULL;
    tu_proc_t p;
    ck_assert_msg(tu_run(argv, env, limit_s, &p) == 0, "scripts/ooc-torchrun could not start");
    return p;
}

static char *make_dir(void) {
    static char dir[64];
    snprintf(dir, sizeof dir, "/tmp/ooc-dp-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(dir));
    return dir;
}

START_TEST(test_one_shard_is_the_plain_program) {
    static const char *const env[] = {"FAKECUDA_SCHED=inline", NULL};
    static const char *const one[] = {CNN_ARGS, "--shards", "1", NULL};
    tu_result_t plain = tu_run_prog("workloads/cnn", cnn_args, 0, env, 120);
    tu_result_t shard = tu_run_prog("workloads/cnn", one, 0, env, 120);
    ck_assert_msg(plain.status == 0 && shard.status == 0, "%s\n%s", plain.err, shard.err);
    ck_assert_str_ne(plain.checksum, "");
    ck_assert_str_eq(shard.out, plain.out);
    tu_result_free(&plain);
    tu_result_free(&shard);
}
END_TEST

/* _i: 2 or 4 ranks (bit 0), inline or threaded with jitter (bit 1). */
START_TEST(test_every_rank_ends_with_the_oracle_checksum) {
    int w = (_i & 1) ? 4 : 2, threaded = _i & 2;
    char ws[8];
    snprintf(ws, sizeof ws, "%d", w);
    const char *sched[] = {threaded ? "FAKECUDA_SCHED=threaded" : "FAKECUDA_SCHED=inline",
                           threaded ? "FAKECUDA_JITTER_US=20" : "FAKECUDA_JITTER_US=0",
                           "FAKECUDA_SEED=7", NULL};
    static const char *const inline_env[] = {"FAKECUDA_SCHED=inline", NULL};
    const char *oracle_args[] = {CNN_ARGS, "--shards", ws, NULL};
    tu_result_t oracle = tu_run_prog("workloads/cnn", oracle_args, 0, inline_env, 120);
    tu_result_t single = tu_run_prog("workloads/cnn", cnn_args, 0, inline_env, 120);
    ck_assert_msg(oracle.status == 0 && single.status == 0, "%s\n%s", oracle.err, single.err);
    ck_assert_str_ne(oracle.checksum, "");
    ck_assert_msg(strcmp(oracle.checksum, single.checksum) != 0,
                  "--shards %d gives the one-shard checksum %s", w, single.checksum);

    char *dir = make_dir();
    const char *prog[] = {tu_build_path("workloads/cnn"), CNN_ARGS, NULL};
    tu_proc_t p = launch(w, dir, 0, prog, sched, 300);
    ck_assert_msg(p.status == 0, "%d ranks: launcher status %d\n%s", w, p.status,
                  tu_tail(p.err, 3000));
    unsigned long long ops0 = 0;
    for (int r = 0; r < w; r++) {
        char path[128], sum[64], ops[64];
        snprintf(path, sizeof path, "%s/rank%d.out", dir, r);
        char *out = slurp(path);
        ck_assert_msg(out != NULL, "no %s", path);
        ck_assert_msg(tu_field(out, "checksum", sum, sizeof sum) != NULL, "rank %d: %s", r, out);
        ck_assert_msg(strcmp(sum, oracle.checksum) == 0, "%d ranks: rank %d checksum %s, oracle %s",
                      w, r, sum, oracle.checksum);
        ck_assert_ptr_nonnull(tu_field(out, "ops_per_iteration", ops, sizeof ops));
        if (r == 0)
            ops0 = strtoull(ops, NULL, 10);
        ck_assert_uint_eq(strtoull(ops, NULL, 10), ops0);
        free(out);
    }
    /* the prefixed copy on the launcher's stdout */
    ck_assert_msg(strstr(p.out, "[rank 1] checksum: ") != NULL, "%s", tu_tail(p.out, 2000));
    tu_proc_free(&p);
    remove_dir(dir);
    tu_result_free(&oracle);
    tu_result_free(&single);
}
END_TEST

START_TEST(test_a_failing_rank_stops_the_others) {
    char *dir = make_dir(), wrap[128], tag[64];
    snprintf(wrap, sizeof wrap, "%s/wrap.sh", dir);
    FILE *f = fopen(wrap, "w");
    ck_assert_ptr_nonnull(f);
    fputs("#!/bin/sh\n[ \"$RANK\" = 1 ] && exit 3\nexec \"$@\"\n", f);
    fclose(f);
    ck_assert_int_eq(chmod(wrap, 0755), 0);
    snprintf(tag, sizeof tag, "OOC_DP_TEST_TAG=fail-%ld", (long)getpid());
    const char *prog[] = {wrap, tu_build_path("workloads/cnn"), CNN_ARGS, NULL};
    const char *extra[] = {tag, NULL};
    int segments = nccl_segments();
    double t0 = now_s();
    tu_proc_t p = launch(2, dir, 0, prog, extra, 60);
    double took = now_s() - t0;
    ck_assert_msg(p.status == 1, "launcher status %d\n%s", p.status, tu_tail(p.err, 3000));
    ck_assert_msg(took < 10.0, "took %.1f s", took);
    ck_assert_msg(strstr(p.err, "rank 1 failed (exit status 3)") != NULL, "%s",
                  tu_tail(p.err, 3000));
    ck_assert_msg(strstr(p.err, "rank1.err") != NULL, "%s", tu_tail(p.err, 3000));
    ck_assert_int_eq(processes_with(tag), 0);
    /* rank 0, stopped while it waited for rank 1 to join, left no shared-memory segment */
    ck_assert_int_eq(nccl_segments(), segments);
    tu_proc_free(&p);
    remove_dir(dir);
}
END_TEST

START_TEST(test_the_timeout_stops_every_rank) {
    char *dir = make_dir(), tag[64];
    snprintf(tag, sizeof tag, "OOC_DP_TEST_TAG=timeout-%ld", (long)getpid());
    const char *prog[] = {"sleep", "30", NULL};
    const char *extra[] = {tag, NULL};
    double t0 = now_s();
    tu_proc_t p = launch(2, dir, 1, prog, extra, 60);
    double took = now_s() - t0;
    ck_assert_msg(p.status == 124, "launcher status %d\n%s", p.status, tu_tail(p.err, 3000));
    ck_assert_msg(took < 10.0, "took %.1f s", took);
    ck_assert_msg(strstr(p.err, "ranks still running: 0 1") != NULL, "%s", tu_tail(p.err, 3000));
    ck_assert_int_eq(processes_with(tag), 0);
    tu_proc_free(&p);
    remove_dir(dir);
}
END_TEST

START_TEST(test_bad_arguments_are_usage_errors) {
    const char *const cases[][4] = {{"--nproc-per-node", "0", "true", NULL},
                                    {"--nproc-per-node", "2", "--timeout", "x"},
                                    {"--bogus", NULL, NULL, NULL},
                                    {"--nproc-per-node", "2", NULL, NULL}};
    const char *const names[] = {"--nproc-per-node '0'", "--timeout 'x'", "'--bogus'",
                                 "no PROGRAM"};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *argv[6] = {"scripts/ooc-torchrun"};
        for (int a = 0; a < 4 && cases[i][a]; a++)
            argv[a + 1] = cases[i][a];
        tu_proc_t p;
        ck_assert_int_eq(tu_run(argv, NULL, 30, &p), 0);
        ck_assert_msg(p.status == 2, "case %zu: status %d\n%s", i, p.status, p.err);
        ck_assert_msg(strstr(p.err, names[i]) != NULL, "case %zu: %s", i, p.err);
        tu_proc_free(&p);
    }
}
END_TEST

START_TEST(test_bad_process_group_variables_are_clear_errors) {
    static const char *const rank5[] = {"WORLD_SIZE=2",      "RANK=5",
                                        "LOCAL_RANK=0",      "MASTER_ADDR=127.0.0.1",
                                        "MASTER_PORT=29500", NULL};
    tu_result_t r = tu_run_prog("workloads/cnn", cnn_args, 0, rank5, 60);
    ck_assert_int_eq(r.status, 2);
    ck_assert_msg(strstr(r.err, "error: cnn: RANK=5: expected an integer from 0 to 1") != NULL,
                  "%s", r.err);
    tu_result_free(&r);

    static const char *const nosize[] = {"WORLD_SIZE=two", NULL};
    r = tu_run_prog("workloads/cnn", cnn_args, 0, nosize, 60);
    ck_assert_int_eq(r.status, 2);
    ck_assert_msg(strstr(r.err, "error: cnn: WORLD_SIZE=two: expected an integer") != NULL, "%s",
                  r.err);
    tu_result_free(&r);

    static const char *const noport[] = {"WORLD_SIZE=2",          "RANK=1",       "LOCAL_RANK=1",
                                         "MASTER_ADDR=127.0.0.1", "MASTER_PORT=", NULL};
    r = tu_run_prog("workloads/cnn", cnn_args, 0, noport, 60);
    ck_assert_int_eq(r.status, 2);
    ck_assert_msg(strstr(r.err, "error: cnn: MASTER_PORT=(unset): expected a port") != NULL, "%s",
                  r.err);
    tu_result_free(&r);

    static const char *const four[] = {"WORLD_SIZE=4",      "RANK=0",
                                       "LOCAL_RANK=0",      "MASTER_ADDR=127.0.0.1",
                                       "MASTER_PORT=29500", NULL};
    static const char *const batch6[] = {"--iters", "1", "--batch", "6", NULL};
    r = tu_run_prog("workloads/cnn", batch6, 0, four, 60);
    ck_assert_int_eq(r.status, 2);
    ck_assert_msg(strstr(r.err, "error: cnn: --batch: a global batch of 6 is not divisible by "
                                "WORLD_SIZE=4") != NULL,
                  "%s", r.err);
    tu_result_free(&r);

    static const char *const shards4[] = {"--iters", "1", "--batch", "6", "--shards", "4", NULL};
    r = tu_run_prog("workloads/cnn", shards4, 0, NULL, 60);
    ck_assert_int_eq(r.status, 2);
    ck_assert_msg(strstr(r.err, "not divisible by --shards=4") != NULL, "%s", r.err);
    tu_result_free(&r);
}
END_TEST

Suite *suite_dp(void) {
    Suite *s = suite_create("dp");
    TCase *tc = tcase_create("dp");
    tcase_set_timeout(tc, tu_under_valgrind() ? 3600 : 300);
    tcase_add_test(tc, test_one_shard_is_the_plain_program);
    tcase_add_loop_test(tc, test_every_rank_ends_with_the_oracle_checksum, 0, 4);
    tcase_add_test(tc, test_a_failing_rank_stops_the_others);
    tcase_add_test(tc, test_the_timeout_stops_every_rank);
    tcase_add_test(tc, test_bad_arguments_are_usage_errors);
    tcase_add_test(tc, test_bad_process_group_variables_are_clear_errors);
    suite_add_tcase(s, tc);
    return s;
}
