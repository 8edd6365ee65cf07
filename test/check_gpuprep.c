/* SPDX-License-Identifier: MIT */
/* check_gpuprep.c: what of the GPU work (issue 6) can be checked without a GPU.
 *
 * scripts/check-gpu without a GPU says so in one line and exits 2, or 0 with --allow-no-gpu
 * (OOC_TEST_NO_GPU makes it find none, whatever the machine has); the Python scripts compile;
 * scripts/torch-train --help works without PyTorch; scripts/bench-gpu --quick --dry-run prints
 * the runs it would make, with the shim's settings; the GPU check programs (built with nvcc by
 * check-run when the toolkit is present) start, find no device and exit 77. Nothing here runs
 * on a GPU: `make check-gpu` does that. scripts/demo (`make demo`) says which device it runs on.
 * scripts/gpu-first-contact (issue 19) without a GPU says so in one line, exits 2 and writes a
 * probes.tsv saying so; its runner, driven by fake probes (OOC_GFC_SELFTEST), records every probe
 * as it finishes whatever the one before did (failed, hung past its timeout, crashed, said
 * nothing), and its TSV is well-formed. */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "testutil.h"

Suite *suite_gpuprep(void);

static tu_proc_t run(const char *const argv[], const char *const env[]) {
    tu_proc_t pr;
    ck_assert_int_eq(tu_run(argv, env, tu_under_valgrind() ? 600 : 60, &pr), 0);
    return pr;
}

/* run() for a child that takes longer (the first-contact runner over several fake probes). */
static tu_proc_t run_long(const char *const argv[], const char *const env[]) {
    tu_proc_t pr;
    ck_assert_int_eq(tu_run(argv, env, tu_under_valgrind() ? 1200 : 200, &pr), 0);
    return pr;
}

static const char *const no_gpu_env[] = {"OOC_TEST_NO_GPU=1", NULL};

START_TEST(test_check_gpu_without_a_gpu_says_so_and_exits_2) {
    tu_proc_t pr = run((const char *[]){"scripts/check-gpu", NULL}, no_gpu_env);
    ck_assert_msg(pr.status == 2, "status %d:\n%s\n%s", pr.status, pr.out, pr.err);
    ck_assert_msg(strstr(pr.out, "check-gpu: no GPU found") && strstr(pr.out, "nothing was run"),
                  "%s", pr.out);
    ck_assert_msg(strstr(pr.out, "interpose-cudart") && strstr(pr.out, "safe-mode") &&
                      strstr(pr.out, "resnet50"),
                  "it does not say what it would run:\n%s", pr.out);
    const char *nl = strchr(pr.out, '\n');
    ck_assert_msg(nl && nl[1] == 0, "more than one line:\n%s", pr.out);
    tu_proc_free(&pr);
}
END_TEST

START_TEST(test_check_gpu_allow_no_gpu_exits_0) {
    tu_proc_t pr = run((const char *[]){"scripts/check-gpu", "--allow-no-gpu", NULL}, no_gpu_env);
    ck_assert_msg(pr.status == 0, "status %d:\n%s\n%s", pr.status, pr.out, pr.err);
    ck_assert_msg(strstr(pr.out, "no GPU found"), "%s", pr.out);
    tu_proc_free(&pr);
    pr = run((const char *[]){"scripts/check-gpu", "--only", "nonsense", NULL}, no_gpu_env);
    ck_assert_msg(pr.status == 2 && strstr(pr.err, "unknown check"), "status %d:\n%s", pr.status,
                  pr.err);
    tu_proc_free(&pr);
}
END_TEST

START_TEST(test_python_scripts_compile) {
    static const char code[] = "import sys\n"
                               "for f in sys.argv[1:]:\n"
                               "    compile(open(f).read(), f, 'exec')\n"
                               "print('compiled', len(sys.argv) - 1)\n";
    tu_proc_t pr = run((const char *[]){"/usr/bin/env", "python3", "-c", code,
                                        "scripts/torch-train", "scripts/bench-gpu",
                                        "scripts/check-gpu", "scripts/gpu-probe-torch", NULL},
                       NULL);
    ck_assert_msg(pr.status == 0 && strstr(pr.out, "compiled 4"), "status %d:\n%s\n%s", pr.status,
                  pr.out, pr.err);
    tu_proc_free(&pr);
}
END_TEST

START_TEST(test_torch_train_help_needs_no_torch) {
    tu_proc_t pr = run((const char *[]){"scripts/torch-train", "--help", NULL}, NULL);
    ck_assert_msg(pr.status == 0, "status %d:\n%s", pr.status, pr.err);
    ck_assert_msg(strstr(pr.out, "--mode") && strstr(pr.out, "save_on_cpu") &&
                      strstr(pr.out, "--deterministic") && strstr(pr.out, "peak_bytes"),
                  "%s", pr.out);
    tu_proc_free(&pr);
    pr = run((const char *[]){"scripts/torch-train", "--model", "nonsense", NULL}, NULL);
    ck_assert_msg(pr.status == 2, "status %d:\n%s", pr.status, pr.err);
    tu_proc_free(&pr);
}
END_TEST

START_TEST(test_bench_gpu_dry_run_prints_the_runs) {
    tu_proc_t pr = run((const char *[]){"scripts/bench-gpu", "--quick", "--dry-run", NULL}, NULL);
    ck_assert_msg(pr.status == 0, "status %d:\n%s\n%s", pr.status, pr.out, pr.err);
    static const char *const want[] = {
        "resnet50-batch64-oracle: ",
        "resnet50-batch256-auto: ",
        "OOC_MODE=demand OOC_BUDGET=8589934592",
        "OOC_MODE=auto OOC_BUDGET=8589934592",
        "--mode save_on_cpu --mem-cap 8589934592",
        "--mode checkpoint --mem-cap 8589934592",
        "resnet50-batch64-off: ",
        "OOC_MODE=off",
        "resnet50-batch64-auto-nothing-to-swap: ",
        "--iters 8 --skip 4",
        "deadline 380 s",
    };
    for (size_t k = 0; k < sizeof want / sizeof want[0]; k++)
        ck_assert_msg(strstr(pr.out, want[k]), "no '%s' in:\n%s", want[k], pr.out);
    ck_assert_msg(strstr(pr.out, "resnet50-batch256-off") == NULL, "overhead at 4x:\n%s", pr.out);
    tu_proc_free(&pr);
    pr = run((const char *[]){"scripts/bench-gpu", "--dry-run", "--only", "gpt2", "--methods",
                              "oracle,auto", NULL},
             NULL);
    ck_assert_msg(pr.status == 0 && strstr(pr.out, "gpt2-seq4096-auto: ") &&
                      strstr(pr.out, "OOC_BUDGET=12884901888") &&
                      strstr(pr.out, "--batch 8 --seq 512") && !strstr(pr.out, "demand"),
                  "status %d:\n%s\n%s", pr.status, pr.out, pr.err);
    tu_proc_free(&pr);
}
END_TEST

START_TEST(test_gpu_programs_start_and_find_no_device) {
    char path[4200];
    /* (the programs linked with -lcuda cannot start without a driver: not run here) */
    static const char *const progs[] = {"interpose", "interpose-static", "stray",
                                        "demand",    "paraminfo",        "bw"};
    for (size_t k = 0; k < sizeof progs / sizeof progs[0]; k++) {
        snprintf(path, sizeof path, "%s/gpu/%s", tu_build_dir(), progs[k]);
        if (access(path, X_OK) != 0) {
            fprintf(stderr, "gpuprep: %s is not built (no nvcc): not checked\n", path);
            continue;
        }
        tu_proc_t pr = run((const char *[]){path, NULL}, NULL);
        /* 77 without a device (here); 0 where a GPU happens to be */
        ck_assert_msg(pr.status == 77 || pr.status == 0, "%s: status %d:\n%s\n%s", path, pr.status,
                      pr.out, pr.err);
        if (pr.status == 77)
            ck_assert_msg(strstr(pr.out, "SKIP ") && strstr(pr.out, "no CUDA device"), "%s",
                          pr.out);
        tu_proc_free(&pr);
    }
}
END_TEST

/* Writes an executable shell script dir/name with `body`. */
static void write_script(const char *dir, const char *name, const char *body) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fprintf(f, "#!/bin/sh\n%s\n", body);
    fclose(f);
    ck_assert_int_eq(chmod(path, 0755), 0);
}

/* The GPU path of scripts/demo with PyTorch (a fake python3 playing scripts/torch-train: its
 * footprint without the shim; under it, the shim's plan line on stderr and the iterations on
 * stdout): it prints both rates and the replayed iterations' median (the first replayed one left
 * out) beside the plan's prediction. */
START_TEST(test_demo_gpu_path_prints_replay_against_prediction) {
    char dir[] = "/tmp/ooc-demo-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    write_script(dir, "nvidia-smi", "echo 'GPU 0: Fake H100 (UUID: GPU-0)'");
    write_script(dir, "python3",
                 "[ \"$1\" = -c ] && exit 0\n"
                 "if [ -z \"$OOC_BUDGET\" ]; then\n"
                 "  echo 'peak_reserved_bytes: 3221225472'; echo 'samples_per_s: 900.0'; exit 0\n"
                 "fi\n"
                 "echo 'iter 0: loss 1 (x) time_ms 500.0'; echo 'iter 1: loss 1 (x) time_ms 90.0'\n"
                 "echo 'ooc[1] ooc-shim: plan (auto) in p/plan.tsv, for a budget of 1024.0 MiB: "
                 "keep 1, swap 2, recompute 0 buffers; predicted 50.000 ms per iteration, 2.0x "
                 "the in-core 25.000 ms, 10.0 MiB each way; replaying' >&2\n"
                 "echo 'iter 2: loss 1 (x) time_ms 300.0'; echo 'iter 3: loss 1 (x) time_ms 60.0'\n"
                 "echo 'iter 4: loss 1 (x) time_ms 55.0'; echo 'iter 5: loss 1 (x) time_ms 70.0'\n"
                 "echo 'samples_per_s: 400.0'");
    char path[4096], build[600];
    snprintf(path, sizeof path, "PATH=%s:%s", dir, getenv("PATH"));
    snprintf(build, sizeof build, "OOC_BUILD=%s", tu_build_dir());
    const char *const argv[] = {"scripts/demo", NULL};
    const char *const env[] = {build, path, "DEMO_ITERS=6", "ASAN_OPTIONS=detect_leaks=0", NULL};
    tu_proc_t pr = run(argv, env);
    ck_assert_msg(pr.status == 0, "status %d:\n%s\n%s", pr.status, tu_tail(pr.out, 2000),
                  tu_tail(pr.err, 2000));
    ck_assert_msg(strstr(pr.out, "OOC_BUDGET=1073741824"), "%s", tu_tail(pr.out, 2000));
    ck_assert_msg(strstr(pr.out, "demo: samples per second: 900.0 without the shim"), "%s",
                  tu_tail(pr.out, 2000));
    ck_assert_msg(strstr(pr.out, "demo: 400.0 under the shim at a third of it (exit 0)"), "%s",
                  tu_tail(pr.out, 2000));
    ck_assert_msg(strstr(pr.out, "demo: replayed iterations: median 60.0 ms, predicted 50.000 ms "
                                 "(1.20x)"),
                  "%s", tu_tail(pr.out, 2000));
    tu_proc_free(&pr);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s/demo-gpu' '%s/demo-gpu-profile'", dir,
             tu_build_dir(), tu_build_dir());
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

/* scripts/demo says which device it runs on: the simulated one with DEMO_DEVICE=sim, even where
 * nvidia-smi lists a GPU; where it lists one, the GPU path (here without PyTorch or the means to
 * build the CUDA program: it fails and says what is missing, never falls back silently); a bad
 * DEMO_DEVICE is refused by name. The fake nvidia-smi, python3 and make come first in PATH. */
START_TEST(test_demo_says_which_device) {
    char dir[] = "/tmp/ooc-demo-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    write_script(dir, "nvidia-smi", "echo 'GPU 0: Fake GPU (UUID: GPU-0)'");
    write_script(dir, "python3", "exit 1");
    write_script(dir, "make", "echo 'make: no nvcc here' >&2; exit 1");
    char path[4096], build[600];
    snprintf(path, sizeof path, "PATH=%s:%s", dir, getenv("PATH"));
    snprintf(build, sizeof build, "OOC_BUILD=%s", tu_build_dir());
    const char *const argv[] = {"scripts/demo", NULL};

    const char *const bad[] = {build, "DEMO_DEVICE=gpu0", NULL};
    tu_proc_t pr = run(argv, bad);
    ck_assert_msg(pr.status == 2 && strstr(pr.err, "DEMO_DEVICE=gpu0") && strstr(pr.err, "sim"),
                  "status %d:\n%s", pr.status, tu_tail(pr.err, 2000));
    tu_proc_free(&pr);

    const char *const gpu[] = {build, path, "DEMO_ITERS=3", NULL};
    pr = run(argv, gpu);
    ck_assert_msg(pr.status == 1, "status %d:\n%s\n%s", pr.status, tu_tail(pr.out, 1000),
                  tu_tail(pr.err, 2000));
    ck_assert_msg(strstr(pr.out, "demo: device: a real GPU: GPU 0: Fake GPU"), "%s",
                  tu_tail(pr.out, 2000));
    ck_assert_msg(strstr(pr.out, "PyTorch with CUDA is not importable"), "%s",
                  tu_tail(pr.out, 2000));
    ck_assert_msg(strstr(pr.err, "it needs nvcc"), "%s", tu_tail(pr.err, 2000));
    tu_proc_free(&pr);

    const char *const sim[] = {build, path, "DEMO_DEVICE=sim", "DEMO_ITERS=3", NULL};
    pr = run(argv, sim);
    ck_assert_msg(pr.status == 0, "status %d:\n%s\n%s", pr.status, tu_tail(pr.out, 1000),
                  tu_tail(pr.err, 2000));
    ck_assert_msg(strstr(pr.out, "demo: device: the SIMULATED CUDA device"), "%s",
                  tu_tail(pr.out, 2000));
    ck_assert_msg(strstr(pr.err, "plan (auto)"), "no plan:\n%s", tu_tail(pr.err, 2000));
    /* Through the launcher, which says where the profile is; python3 (faked) cannot draw. */
    ck_assert_msg(strstr(pr.err, "ooc-run: profile: ") && strstr(pr.err, "ooc-run: plan: "), "%s",
                  tu_tail(pr.err, 2000));
    ck_assert_msg(strstr(pr.out, "demo: python3-matplotlib is missing: no pictures"), "%s",
                  tu_tail(pr.out, 2000));
    ck_assert_msg(strstr(pr.out, "measured ms  predicted ms") &&
                      strstr(pr.out, "no steady replayed iteration to compare"),
                  "%s", tu_tail(pr.out, 2000));
    ck_assert_ptr_null(strstr(pr.out, "the pictures are in"));
    tu_proc_free(&pr);

    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

/* The simulated demo, long enough to replay: each iteration's measured time, and beside the
 * replayed ones the plan's predicted time, which is ooc-plan's simulation of the plan the demo
 * wrote; the median of the steady replayed iterations against it; the pictures, drawn (python3
 * with matplotlib is there: the suite trace_json requires it too) where the demo says. */
START_TEST(test_demo_prints_measured_beside_predicted_and_draws_pictures) {
    char dir[] = "/tmp/ooc-demo-prof-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char build[600], prof[100];
    snprintf(build, sizeof build, "OOC_BUILD=%s", tu_build_dir());
    snprintf(prof, sizeof prof, "OOC_PROFILE_DIR=%s/prof", dir);
    const char *const env[] = {build, prof, "DEMO_DEVICE=sim", "DEMO_ITERS=6", NULL};
    tu_proc_t pr;
    ck_assert_int_eq(
        tu_run((const char *[]){"scripts/demo", NULL}, env, tu_under_valgrind() ? 3000 : 400, &pr),
        0);
    ck_assert_msg(pr.status == 0, "status %d:\n%s\n%s", pr.status, tu_tail(pr.out, 1500),
                  tu_tail(pr.err, 2000));

    /* The prediction: ooc-plan's simulation of the plan, as "time_ms" of its one policy row. */
    char plan[160], pdir[120];
    snprintf(pdir, sizeof pdir, "%s/prof", dir);
    snprintf(plan, sizeof plan, "%s/plan.tsv", pdir);
    tu_proc_t pl =
        run((const char *[]){tu_build_path("ooc-plan"), "--plan", plan, pdir, NULL}, NULL);
    ck_assert_msg(pl.status == 0, "ooc-plan --plan: %d\n%s", pl.status, pl.err);
    const char *row = strstr(pl.out, "\npolicy ");
    ck_assert_ptr_nonnull(row);
    row = strchr(row + 1, '\n');
    ck_assert_ptr_nonnull(row);
    char policy[32];
    double pred = 0;
    ck_assert_int_eq(sscanf(row + 1, "%31s %lf", policy, &pred), 2);
    char want_pred[32];
    snprintf(want_pred, sizeof want_pred, "%.1f", pred);
    tu_proc_free(&pl);

    /* Rows 1..6: 1 warm-up, 3 recorded, then replayed with the prediction beside them. */
    for (int i = 1; i <= 6; i++) {
        char key[32];
        snprintf(key, sizeof key, "\ndemo:   %9d  ", i);
        const char *l = strstr(pr.out, key);
        ck_assert_msg(l != NULL, "no row for iteration %d:\n%s", i, tu_tail(pr.out, 2500));
        double measured = 0;
        char p[32] = "", what[32] = "";
        ck_assert_int_eq(sscanf(l + strlen(key), "%lf %31s %31s", &measured, p, what), 3);
        ck_assert_msg(measured > 0, "iteration %d: measured %f", i, measured);
        if (i <= 4) {
            ck_assert_str_eq(p, "-");
            ck_assert_str_eq(what, i == 1 ? "warm-up" : "recorded");
        } else {
            ck_assert_str_eq(p, want_pred);
            ck_assert_str_eq(what, "replayed");
        }
    }
    char median[64];
    snprintf(median, sizeof median, ", predicted %s ms (", want_pred);
    ck_assert_msg(strstr(pr.out, "demo:   median of the replayed iterations 6..6: measured ") &&
                      strstr(pr.out, median),
                  "%s", tu_tail(pr.out, 2500));

    /* The pictures, where the demo and ooc-run say they are. */
    char said[200];
    snprintf(said, sizeof said,
             "demo: the pictures are in %s/report/: buffers.png gantt.png "
             "memory.png sizes.png\n",
             pdir);
    ck_assert_msg(strstr(pr.out, said), "%s", tu_tail(pr.out, 2500));
    snprintf(said, sizeof said, "ooc-run: pictures: %s/report/ (", pdir);
    ck_assert_msg(strstr(pr.err, said), "%s", tu_tail(pr.err, 2500));
    static const char *const pngs[] = {"memory.png", "gantt.png", "sizes.png", "buffers.png"};
    for (size_t k = 0; k < 4; k++) {
        char png[200];
        struct stat st;
        snprintf(png, sizeof png, "%s/report/%s", pdir, pngs[k]);
        ck_assert_msg(stat(png, &st) == 0 && st.st_size > 1000, "%s is missing or empty", png);
    }
    tu_proc_free(&pr);
    char cmd[200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

static void rm_rf(const char *dir) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    ck_assert_int_eq(system(cmd), 0);
}

/* scripts/check-gpu ends inside one 10-minute device command: with a fake nvidia-smi and fake
 * GPU programs (--no-build), a check still running at --hard-end is killed and fails, a check
 * not started by --deadline is a SKIP row, and check-gpu.tsv holds each row as it finished. */
START_TEST(test_check_gpu_deadline_and_hard_end) {
    char dir[] = "/tmp/ooc-cg-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char bin[600], gpu[600], out[600], path[700];
    snprintf(bin, sizeof bin, "%s/bin", dir);
    snprintf(gpu, sizeof gpu, "%s/build/gpu", dir);
    snprintf(out, sizeof out, "%s/out", dir);
    ck_assert_int_eq(mkdir(bin, 0755), 0);
    snprintf(path, sizeof path, "%s/build", dir);
    ck_assert_int_eq(mkdir(path, 0755), 0);
    ck_assert_int_eq(mkdir(gpu, 0755), 0);
    write_script(bin, "nvidia-smi", "echo 'GPU 0: Fake H100 (UUID: GPU-0)'");
    write_script(gpu, "vmm",
                 "sleep \"${FAKE_SLEEP:-0}\"; echo 'PASS vmm: fake'; echo 'host_vmm: 1 (fake)'");
    char path_env[4096], build_env[700];
    snprintf(path_env, sizeof path_env, "PATH=%s:%s", bin, getenv("PATH"));
    snprintf(build_env, sizeof build_env, "OOC_BUILD=%s/build", dir);
    snprintf(path, sizeof path, "%s/check-gpu.tsv", out);

    /* the deadline passes during vmm (2 s): demand is not started */
    const char *const env1[] = {path_env, build_env, "FAKE_SLEEP=2", NULL};
    tu_proc_t pr = run((const char *[]){"scripts/check-gpu", "--no-build", "--only", "vmm,demand",
                                        "--deadline", "1", "--out", out, NULL},
                       env1);
    ck_assert_msg(pr.status == 0, "status %d:\n%s\n%s", pr.status, pr.out, pr.err);
    FILE *f = fopen(path, "r");
    ck_assert_ptr_nonnull(f);
    char buf[4096] = "";
    size_t got = fread(buf, 1, sizeof buf - 1, f);
    buf[got] = 0;
    fclose(f);
    ck_assert_msg(strstr(buf, "verdict\tcheck\twhat\nPASS\tvmm\t") &&
                      strstr(buf, "\nSKIP\tdemand\tnot started: ") &&
                      strstr(buf, "the deadline is 1 s"),
                  "%s", buf);
    tu_proc_free(&pr);

    /* vmm would sleep 60 s: --hard-end 3 kills it, a FAIL row, well inside the 60 s */
    const char *const env2[] = {path_env, build_env, "FAKE_SLEEP=60", NULL};
    time_t t0 = time(NULL);
    pr = run((const char *[]){"scripts/check-gpu", "--no-build", "--only", "vmm", "--hard-end", "3",
                              "--out", out, NULL},
             env2);
    ck_assert_msg(pr.status == 1, "status %d:\n%s\n%s", pr.status, pr.out, pr.err);
    ck_assert_msg(time(NULL) - t0 < (tu_under_valgrind() ? 50 : 30), "took %ld s",
                  (long)(time(NULL) - t0));
    f = fopen(path, "r");
    ck_assert_ptr_nonnull(f);
    got = fread(buf, 1, sizeof buf - 1, f);
    buf[got] = 0;
    fclose(f);
    ck_assert_msg(strstr(buf, "\nFAIL\tvmm\texit 124"), "%s", buf);
    tu_proc_free(&pr);
    rm_rf(dir);
}
END_TEST

/* ---- scripts/gpu-first-contact ------------------------------------------------------------- */

enum { MAX_ROWS = 32 };

typedef struct tsv_row {
    char probe[64], verdict[8], detail[2048];
} tsv_row_t;

/* Reads a probes.tsv and fails the test unless it is well-formed: the header line
 * "probe<TAB>verdict<TAB>detail", then rows of exactly three tab-separated fields (a probe name
 * of lowercase letters, digits and dashes; PASS, FAIL or SKIP; a detail that is not empty), each
 * ended by a newline, no empty line, no carriage return. Returns the number of rows. */
static int read_tsv(const char *path, tsv_row_t *rows) {
    FILE *f = fopen(path, "r");
    ck_assert_msg(f, "%s: %s", path, strerror(errno));
    char line[4096];
    ck_assert_msg(fgets(line, sizeof line, f) && strcmp(line, "probe\tverdict\tdetail\n") == 0,
                  "%s: bad header", path);
    int n = 0;
    while (fgets(line, sizeof line, f)) {
        size_t len = strlen(line);
        ck_assert_msg(len > 1 && line[len - 1] == '\n', "%s: row %d is empty or unended", path,
                      n + 1);
        line[len - 1] = 0;
        ck_assert_msg(!strchr(line, '\r'), "%s: a carriage return in row %d", path, n + 1);
        char *t1 = strchr(line, '\t'), *t2 = t1 ? strchr(t1 + 1, '\t') : NULL;
        ck_assert_msg(t1 && t2 && !strchr(t2 + 1, '\t'), "%s: row %d has not 3 fields: %s", path,
                      n + 1, line);
        *t1 = *t2 = 0;
        ck_assert_msg(line[0] &&
                          strspn(line, "abcdefghijklmnopqrstuvwxyz0123456789-") == strlen(line),
                      "%s: row %d: bad probe name '%s'", path, n + 1, line);
        ck_assert_msg(!strcmp(t1 + 1, "PASS") || !strcmp(t1 + 1, "FAIL") || !strcmp(t1 + 1, "SKIP"),
                      "%s: row %d: bad verdict '%s'", path, n + 1, t1 + 1);
        ck_assert_msg(t2[1], "%s: row %d: empty detail", path, n + 1);
        ck_assert_int_lt(n, MAX_ROWS);
        snprintf(rows[n].probe, sizeof rows[n].probe, "%s", line);
        snprintf(rows[n].verdict, sizeof rows[n].verdict, "%s", t1 + 1);
        snprintf(rows[n].detail, sizeof rows[n].detail, "%s", t2 + 1);
        n++;
    }
    fclose(f);
    return n;
}

/* Without a GPU: one line saying so, exit 2, and a probes.tsv (copied to --export's folder too)
 * whose one row says so. Without an OUTDIR: usage, exit 2. */
START_TEST(test_first_contact_without_a_gpu_says_so_and_exits_2) {
    char dir[] = "/tmp/ooc-gfc-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char out[600], exp[600], path[700];
    snprintf(out, sizeof out, "%s/out", dir);
    snprintf(exp, sizeof exp, "%s/export", dir);
    tu_proc_t pr =
        run((const char *[]){"scripts/gpu-first-contact", out, "--export", exp, NULL}, no_gpu_env);
    ck_assert_msg(pr.status == 2, "status %d:\n%s\n%s", pr.status, pr.out, pr.err);
    ck_assert_msg(strstr(pr.out, "gpu-first-contact: no GPU found (OOC_TEST_NO_GPU is set)") &&
                      strstr(pr.out, "nothing was run"),
                  "%s", pr.out);
    const char *nl = strchr(pr.out, '\n');
    ck_assert_msg(nl && nl[1] == 0, "more than one line:\n%s", pr.out);
    tu_proc_free(&pr);
    static tsv_row_t rows[MAX_ROWS];
    for (int k = 0; k < 2; k++) {
        snprintf(path, sizeof path, "%s/probes.tsv", k ? exp : out);
        ck_assert_int_eq(read_tsv(path, rows), 1);
        ck_assert_str_eq(rows[0].probe, "gpu");
        ck_assert_str_eq(rows[0].verdict, "SKIP");
        ck_assert_msg(strstr(rows[0].detail, "no GPU found") &&
                          strstr(rows[0].detail, "nothing was run"),
                      "%s", rows[0].detail);
    }
    pr = run((const char *[]){"scripts/gpu-first-contact", NULL}, no_gpu_env);
    ck_assert_msg(pr.status == 2 && strstr(pr.err, "usage: gpu-first-contact OUTDIR"),
                  "status %d:\n%s", pr.status, pr.err);
    tu_proc_free(&pr);
    rm_rf(dir);
}
END_TEST

/* The runner under fake probes: a probe that fails, one that hangs past its timeout (GFC_TIMEOUT
 * caps it at 10 s), one that crashes and one that ends without a verdict line each give a FAIL row
 * and the next probe still runs; a skip is a SKIP row; the last probe finds the six rows before
 * it already in probes.tsv (rows are written as probes finish) and the hung probe's child (a
 * sleep under its own inner timeout) gone with it; every probe has its log; the
 * exit status is 1; the hang cost its timeout, not its 300 s. */
START_TEST(test_first_contact_failures_and_timeouts_do_not_stop_the_others) {
    char dir[] = "/tmp/ooc-gfc-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char out[600], exp[600], path[700];
    snprintf(out, sizeof out, "%s/out", dir);
    snprintf(exp, sizeof exp, "%s/export", dir);
    /* Every probe's timeout, the hang's too: long enough for a probe that passes on a loaded
     * machine, or under valgrind (which traces bash and every child). */
    const int limit = tu_under_valgrind() ? 60 : 10;
    char limit_env[32], hang[96];
    snprintf(limit_env, sizeof limit_env, "GFC_TIMEOUT=%d", limit);
    snprintf(hang, sizeof hang, "timed out after %d s; so far: what a fake probe knew", limit);
    const char *const env[] = {"OOC_GFC_SELFTEST=1", limit_env, NULL};
    time_t t0 = time(NULL);
    tu_proc_t pr =
        run_long((const char *[]){"scripts/gpu-first-contact", out, "--export", exp, NULL}, env);
    long took = (long)(time(NULL) - t0);
    ck_assert_msg(pr.status == 1, "status %d:\n%s\n%s", pr.status, pr.out, tu_tail(pr.err, 2000));
    ck_assert_msg(took < (tu_under_valgrind() ? 500 : 100), "took %ld s", took);
    const struct {
        const char *probe, *verdict, *detail;
    } want[] = {
        {"selftest-pass", "PASS", "a fake probe that passes"},
        {"selftest-fail", "FAIL", "a fake probe that fails"},
        {"selftest-hang", "FAIL", hang},
        {"selftest-crash", "FAIL", "exit 139 without a verdict line"},
        {"selftest-silent", "FAIL", "exit 0 without a verdict line"},
        {"selftest-skip", "SKIP", "a fake probe that cannot run here"},
        {"selftest-rows", "PASS", "probes.tsv held 6 rows when this probe started"},
    };
    const int nwant = (int)(sizeof want / sizeof want[0]);
    static tsv_row_t rows[MAX_ROWS];
    snprintf(path, sizeof path, "%s/probes.tsv", out);
    ck_assert_int_eq(read_tsv(path, rows), nwant);
    for (int k = 0; k < nwant; k++) {
        ck_assert_str_eq(rows[k].probe, want[k].probe);
        ck_assert_msg(!strcmp(rows[k].verdict, want[k].verdict) &&
                          strstr(rows[k].detail, want[k].detail),
                      "%s: %s %s", want[k].probe, rows[k].verdict, rows[k].detail);
        char line[300];
        snprintf(line, sizeof line, "%s %s: %s", want[k].verdict, want[k].probe, want[k].detail);
        ck_assert_msg(strstr(pr.out, line), "no '%s' in:\n%s", line, pr.out);
        snprintf(path, sizeof path, "%s/logs/%s.log", out, want[k].probe);
        ck_assert_msg(access(path, R_OK) == 0, "no log %s", path);
    }
    ck_assert_msg(strstr(pr.out, "2 passed, 4 failed, 1 skipped"), "%s", pr.out);
    snprintf(path, sizeof path, "%s/logs/selftest-fail.log", out);
    FILE *f = fopen(path, "r");
    ck_assert_ptr_nonnull(f);
    char buf[4096] = "";
    size_t got = fread(buf, 1, sizeof buf - 1, f);
    buf[got] = 0;
    fclose(f);
    ck_assert_msg(strstr(buf, "some output of a failing fake probe"), "log:\n%s", buf);
    snprintf(path, sizeof path, "%s/logs.tar.gz", exp);
    ck_assert_msg(access(path, R_OK) == 0, "no %s", path);
    snprintf(path, sizeof path, "%s/probes.tsv", exp);
    ck_assert_int_eq(read_tsv(path, rows), nwant);
    tu_proc_free(&pr);
    rm_rf(dir);
}
END_TEST

/* --deadline 0: no probe starts, each is a SKIP row saying why, exit 0. --only picks probes in
 * its order and refuses an unknown one. */
START_TEST(test_first_contact_deadline_and_only) {
    char dir[] = "/tmp/ooc-gfc-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char path[700];
    const char *const env[] = {"OOC_GFC_SELFTEST=1",
                               tu_under_valgrind() ? "GFC_TIMEOUT=60" : "GFC_TIMEOUT=10", NULL};
    tu_proc_t pr =
        run((const char *[]){"scripts/gpu-first-contact", dir, "--deadline", "0", NULL}, env);
    ck_assert_msg(pr.status == 0, "status %d:\n%s\n%s", pr.status, pr.out, pr.err);
    static tsv_row_t rows[MAX_ROWS];
    snprintf(path, sizeof path, "%s/probes.tsv", dir);
    int n = read_tsv(path, rows);
    ck_assert_int_eq(n, 7);
    for (int k = 0; k < n; k++)
        ck_assert_msg(!strcmp(rows[k].verdict, "SKIP") && strstr(rows[k].detail, "not started"),
                      "%s: %s %s", rows[k].probe, rows[k].verdict, rows[k].detail);
    tu_proc_free(&pr);

    pr = run((const char *[]){"scripts/gpu-first-contact", dir, "--only",
                              "selftest-skip,selftest-pass", NULL},
             env);
    ck_assert_msg(pr.status == 0, "status %d:\n%s\n%s", pr.status, pr.out, pr.err);
    ck_assert_int_eq(read_tsv(path, rows), 2);
    ck_assert_str_eq(rows[0].probe, "selftest-skip");
    ck_assert_str_eq(rows[1].probe, "selftest-pass");
    ck_assert_str_eq(rows[1].verdict, "PASS");
    tu_proc_free(&pr);

    pr = run((const char *[]){"scripts/gpu-first-contact", dir, "--only", "nonsense", NULL}, env);
    ck_assert_msg(pr.status == 2 && strstr(pr.err, "unknown probe nonsense"), "status %d:\n%s",
                  pr.status, pr.err);
    tu_proc_free(&pr);
    rm_rf(dir);
}
END_TEST

/* The probes' own reading of their programs' outputs, on a machine without a GPU: a fake
 * nvidia-smi lists one, OOC_BUILD names a build folder of fake programs (shell scripts printing
 * what the real ones print: the shim's statistics rows, the spy's lines, timings), --no-build.
 * Each probe must read the numbers right, say what they mean, and turn a wrong checksum or a
 * launch without a parameter layout (FAKE_BAD=1) into a FAIL while the others still pass. */
START_TEST(test_first_contact_probes_read_their_programs) {
    char dir[] = "/tmp/ooc-gfc-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char bin[600], gpu[600], out[600], path[700];
    snprintf(bin, sizeof bin, "%s/bin", dir);
    snprintf(gpu, sizeof gpu, "%s/build/gpu", dir);
    snprintf(out, sizeof out, "%s/out", dir);
    ck_assert_int_eq(mkdir(bin, 0755), 0);
    snprintf(path, sizeof path, "%s/build", dir);
    ck_assert_int_eq(mkdir(path, 0755), 0);
    ck_assert_int_eq(mkdir(gpu, 0755), 0);
    write_script(bin, "nvidia-smi", "echo 'GPU 0: Fake H100 (UUID: GPU-0)'");
    write_script(gpu, "libgpuspy.so", "exit 0");
    write_script(gpu, "driver_paths",
                 "echo \"shim: loaded; path $2\"\n"
                 "echo 'issued: allocations 5 launches 8'\n"
                 "printf '  %-44s %12s\\n' 'swap-outs cancelled: used again first' 3 allocations 7 "
                 "'kernel launches' 9 >&2");
    write_script(gpu, "freesync",
                 "case \"$LD_PRELOAD\" in *libooc_shim*) c=298.5 d=0.2\n"
                 "printf '  %-44s %12s\\n' 'kernel launches' 3 >&2 ;;\n"
                 "*) c=299.1 d=298.0 ;; esac\n"
                 "echo 'spin: ms 300.2'\n"
                 "echo \"free: cudaFree ms $c kernel-running-before yes\"\n"
                 "echo \"free: cuMemFree ms $d kernel-running-before yes\"\n"
                 "echo 'free: cudaFree-idle ms 0.1 kernel-running-before no'");
    write_script(gpu, "bw",
                 "echo 'bandwidth: h2d 50.10 d2h 48.00 both-h2d 40.00 both-d2h 38.00 both-total "
                 "78.00 (GB/s, 256 MiB copies, medians of 9)'");
    write_script(gpu, "hostvmm",
                 "echo 'hostvmm: attr-host-numa 1 attr-host 1 numa-id 0 create-host-numa "
                 "CUDA_SUCCESS granularity-device 2097152/2097152 granularity-host "
                 "2097152/2097152'\n"
                 "echo 'cost: host 2 MiB handles 1 create_us 300.0 map_us 10.0 access_us 20.0 "
                 "unmap_us 30.0'\n"
                 "echo 'cost: device 32 MiB handles 16 create_us 90.0 map_us 60.0 access_us 70.0 "
                 "unmap_us 80.0'");
    write_script(gpu, "remapgate",
                 "echo 'remap: round 1 wait-value CUDA_SUCCESS query-while-waiting "
                 "CUDA_ERROR_NOT_READY unmap CUDA_SUCCESS map CUDA_SUCCESS access CUDA_SUCCESS "
                 "unmap_us 40.0 map_us 2.0 access_us 30.0 before-release yes kernel-read 2 "
                 "copy-read 2 stream CUDA_SUCCESS release-to-done_us 90.0'\n"
                 "r=6; [ -n \"${FAKE_BAD:-}\" ] && r=5\n"
                 "echo \"remapgate: rounds 6 new-mapping $r old-mapping 0 other $((6 - r)) "
                 "before-release 6 unmap_us 20.0 map_us 1.0 access_us 25.0 release-to-done_us "
                 "50.0\"");
    write_script(gpu, "demand",
                 "if [ -n \"${OOC_MODE:-}\" ]; then t='20.0 8.0'; else t='5.0 4.0'; fi\n"
                 "echo \"time: per-iteration ms: $t\"\n"
                 "echo 'peak_device_bytes: 1073741824'\n"
                 "sum=00000000deadbeef\n"
                 "[ \"${OOC_SAFE:-}\" = on ] && [ -n \"${FAKE_BAD:-}\" ] && sum=0000000000000bad\n"
                 "echo \"checksum: $sum\"\n"
                 "[ -n \"${OOC_MODE:-}\" ] && printf '  %-44s %12s\\n' swap-outs 12 swap-ins 10 "
                 "'operations run as planned' 40 'kernel launches' 96 >&2\n"
                 "exit 0");
    write_script(gpu, "paraminfo",
                 "n=0; [ -n \"${FAKE_BAD:-}\" ] && n=1\n"
                 "echo 'SPY-SUMMARY phase start handles 0 function 0 kernel 0 both 0 neither 0 "
                 "funcinfo-answered 0 kernelinfo-answered 0 any-answered 0 launches 0 encodes 0 "
                 "blocks 0 blocks-matching 0' >&2\n"
                 "echo \"SPY-SUMMARY phase cudart-global handles 2 function 0 kernel 2 both 0 "
                 "neither 0 funcinfo-answered 1 kernelinfo-answered 2 any-answered $((2 - n)) "
                 "launches 2 encodes 0 blocks 0 blocks-matching 0\" >&2");
    write_script(gpu, "tmap",
                 "echo 'tensormap: plain-word 2 shifted-word none changed-words 2 delta-of-first "
                 "4096 replace-equals-encode yes'\n"
                 "echo 'SPY encode 0x7f0000000000 rank 2 plain-word 2 shifted-word none phase "
                 "cublas-gemm-bf16' >&2\n"
                 "echo 'SPY encode 0x7f0000100000 rank 2 plain-word none shifted-word none phase "
                 "cublas-gemm-bf16' >&2\n"
                 "echo 'SPY-SUMMARY phase cublas-gemm-bf16 handles 1 function 0 kernel 1 both 0 "
                 "neither 0 funcinfo-answered 1 kernelinfo-answered 1 any-answered 1 launches 1 "
                 "encodes 2 blocks 2 blocks-matching 1' >&2");
    char path_env[4096], build_env[700];
    snprintf(path_env, sizeof path_env, "PATH=%s:%s", bin, getenv("PATH"));
    snprintf(build_env, sizeof build_env, "OOC_BUILD=%s/build", dir);
    const char *const argv[] = {"scripts/gpu-first-contact",
                                out,
                                "--no-build",
                                "--only",
                                "interpose-lcuda,freesync,bandwidth,hostvmm,remapgate,demand,"
                                "paraminfo,tensormap,iteration",
                                NULL};
    static const struct {
        const char *probe, *verdict, *detail[3];
    } good[] = {
        {"interpose-lcuda",
         "PASS",
         {"the shim counted 7 allocations and 9 launches for the 5 and 8 issued"}},
        {"freesync",
         "PASS",
         {"behind a 300.2 ms kernel", "cuMemFree 298.0 ms (waits)",
          "cudart SYNCHRONISES before it reaches cuMemFree_v2"}},
        {"bandwidth", "PASS", {"h2d 50.10 d2h 48.00 both-h2d 40.00"}},
        {"hostvmm",
         "PASS",
         {"host-located VMM supported", "host 2 MiB in 1: map 10.0 us, set-access 20.0, unmap 30.0",
          "device 32 MiB in 16: map 60.0 us"}},
        {"remapgate",
         "PASS",
         {"rounds 6 new-mapping 6", "round 1: wait-value CUDA_SUCCESS",
          "a remap behind the device IS possible"}},
        {"demand",
         "PASS",
         {"budget 256 MiB (1/4)", "OOC_SAFE=on: exit 0, checksum 00000000deadbeef (equal)",
          "swap-outs 12, swap-ins 10, operations run as planned 40, kernel launches 96"}},
        {"paraminfo",
         "PASS",
         {"cudart-global: 2 handles (kernel 2, function 0, both 0, neither 0), funcinfo 1/2, "
          "kernelinfo 2/2, no layout 0"}},
        {"tensormap",
         "PASS",
         {"the address is a plain 8-byte word: word 2 (byte offset 16)",
          "2 encodes seen (1 with the address as a plain word)",
          "2 128-byte params (1 equal to an encode)"}},
        {"iteration", "PASS", {"demand: in core 4.0 ms, auto 8.0 ms (2.00x)"}},
    };
    const int n = (int)(sizeof good / sizeof good[0]);
    static tsv_row_t rows[MAX_ROWS];
    for (int bad = 0; bad < 2; bad++) {
        const char *const env[] = {path_env, build_env, bad ? "FAKE_BAD=1" : "FAKE_BAD=", NULL};
        tu_proc_t pr = run_long(argv, env);
        ck_assert_msg(pr.status == bad, "FAKE_BAD=%d: status %d:\n%s\n%s", bad, pr.status, pr.out,
                      tu_tail(pr.err, 2000));
        snprintf(path, sizeof path, "%s/probes.tsv", out);
        ck_assert_int_eq(read_tsv(path, rows), n);
        for (int k = 0; k < n; k++) {
            ck_assert_str_eq(rows[k].probe, good[k].probe);
            int fails =
                bad && (!strcmp(good[k].probe, "demand") || !strcmp(good[k].probe, "paraminfo"));
            ck_assert_msg(!strcmp(rows[k].verdict, fails ? "FAIL" : good[k].verdict),
                          "FAKE_BAD=%d: %s: %s %s", bad, rows[k].probe, rows[k].verdict,
                          rows[k].detail);
            int differs = bad && !strcmp(good[k].probe, "remapgate"); /* checked below */
            for (int d = 0; d < 3 && good[k].detail[d] && !fails && !differs; d++)
                ck_assert_msg(strstr(rows[k].detail, good[k].detail[d]), "%s: no '%s' in: %s",
                              rows[k].probe, good[k].detail[d], rows[k].detail);
        }
        if (bad) {
            /* one round read other bytes: an answer (PASS), but not "possible" */
            ck_assert_msg(strstr(rows[4].detail, "a remap behind the device is NOT possible"), "%s",
                          rows[4].detail);
            ck_assert_msg(strstr(rows[5].detail, "OOC_SAFE=on: exit 0, checksum 0000000000000bad "
                                                 "(DIFFERENT)"),
                          "%s", rows[4].detail);
            ck_assert_msg(strstr(rows[6].detail, "no parameter layout from any lookup") &&
                              strstr(rows[6].detail, "no layout 1"),
                          "%s", rows[6].detail);
        }
        tu_proc_free(&pr);
    }
    rm_rf(dir);
}
END_TEST

Suite *suite_gpuprep(void) {
    Suite *s = suite_create("gpuprep");
    TCase *tc = tcase_create("gpuprep");
    tcase_set_timeout(tc, tu_under_valgrind() ? 1800 : 300);
    tcase_add_test(tc, test_check_gpu_without_a_gpu_says_so_and_exits_2);
    tcase_add_test(tc, test_check_gpu_allow_no_gpu_exits_0);
    tcase_add_test(tc, test_python_scripts_compile);
    tcase_add_test(tc, test_demo_gpu_path_prints_replay_against_prediction);
    tcase_add_test(tc, test_torch_train_help_needs_no_torch);
    tcase_add_test(tc, test_bench_gpu_dry_run_prints_the_runs);
    tcase_add_test(tc, test_gpu_programs_start_and_find_no_device);
    tcase_add_test(tc, test_demo_says_which_device);
    tcase_add_test(tc, test_check_gpu_deadline_and_hard_end);
    tcase_add_test(tc, test_first_contact_without_a_gpu_says_so_and_exits_2);
    tcase_add_test(tc, test_first_contact_failures_and_timeouts_do_not_stop_the_others);
    tcase_add_test(tc, test_first_contact_deadline_and_only);
    tcase_add_test(tc, test_first_contact_probes_read_their_programs);
    suite_add_tcase(s, tc);
    TCase *demo = tcase_create("demo");
    tcase_set_timeout(demo, tu_under_valgrind() ? 3600 : 600);
    tcase_add_test(demo, test_demo_prints_measured_beside_predicted_and_draws_pictures);
    suite_add_tcase(s, demo);
    return s;
}
