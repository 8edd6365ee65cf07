/* SPDX-License-Identifier: MIT */
/* check_gpuprep.c: what of the GPU work (issue 6) can be checked without a GPU.
 *
 * scripts/check-gpu without a GPU says so in one line and exits 2, or 0 with --allow-no-gpu
 * (OOC_TEST_NO_GPU makes it find none, whatever the machine has); the Python scripts compile;
 * scripts/torch-train --help works without PyTorch; scripts/bench-gpu --quick --dry-run prints
 * the runs it would make, with the shim's settings; the GPU check programs (built with nvcc by
 * check-run when the toolkit is present) start, find no device and exit 77. Nothing here runs
 * on a GPU: `make check-gpu` does that. scripts/demo (`make demo`) says which device it runs on. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "testutil.h"

Suite *suite_gpuprep(void);

static tu_proc_t run(const char *const argv[], const char *const env[]) {
    tu_proc_t pr;
    ck_assert_int_eq(tu_run(argv, env, tu_under_valgrind() ? 600 : 60, &pr), 0);
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
    tu_proc_t pr =
        run((const char *[]){"/usr/bin/env", "python3", "-c", code, "scripts/torch-train",
                             "scripts/bench-gpu", "scripts/check-gpu", NULL},
            NULL);
    ck_assert_msg(pr.status == 0 && strstr(pr.out, "compiled 3"), "status %d:\n%s\n%s", pr.status,
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
    static const char *const progs[] = {"interpose", "interpose-static", "stray", "demand"};
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

Suite *suite_gpuprep(void) {
    Suite *s = suite_create("gpuprep");
    TCase *tc = tcase_create("gpuprep");
    tcase_set_timeout(tc, tu_under_valgrind() ? 1800 : 120);
    tcase_add_test(tc, test_check_gpu_without_a_gpu_says_so_and_exits_2);
    tcase_add_test(tc, test_check_gpu_allow_no_gpu_exits_0);
    tcase_add_test(tc, test_python_scripts_compile);
    tcase_add_test(tc, test_torch_train_help_needs_no_torch);
    tcase_add_test(tc, test_bench_gpu_dry_run_prints_the_runs);
    tcase_add_test(tc, test_gpu_programs_start_and_find_no_device);
    tcase_add_test(tc, test_demo_says_which_device);
    suite_add_tcase(s, tc);
    TCase *demo = tcase_create("demo");
    tcase_set_timeout(demo, tu_under_valgrind() ? 3600 : 600);
    tcase_add_test(demo, test_demo_prints_measured_beside_predicted_and_draws_pictures);
    suite_add_tcase(s, demo);
    return s;
}
