/* SPDX-License-Identifier: MIT */
/* check_ooc_plan.c: the ooc-plan command: its table, the plan it writes, and clear errors for
 * bad arguments and malformed profiles. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ooc_planner.h"
#include "testutil.h"

Suite *suite_ooc_plan(void);

#define REF "profiles/synthetic/unet-batch32"

static tu_proc_t run(const char *a1, const char *a2, const char *a3, const char *a4, const char *a5,
                     const char *a6) {
    const char *argv[8] = {tu_build_path("ooc-plan"), a1, a2, a3, a4, a5, a6, NULL};
    tu_proc_t p;
    ck_assert_int_eq(tu_run(argv, NULL, 120, &p), 0);
    return p;
}

START_TEST(test_all_policies_print_a_table_and_write_auto_plan) {
    char out[4096];
    snprintf(out, sizeof out, "%s/tmp/ooc-plan-%d.tsv", tu_build_dir(), (int)getpid());
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "mkdir -p %s/tmp", tu_build_dir());
    ck_assert_int_eq(system(cmd), 0);
    tu_proc_t p = run("--policy", "all", "--out", out, REF, NULL);
    ck_assert_msg(p.status == 0, "%s%s", p.out, p.err);
    static const char *const cols[] = {"policy", "time_ms", "x_incore", "x_bound", "peak_GiB",
                                       "h2d_GB", "keep",    "swap",     "recomp",  "plan_ms"};
    for (size_t i = 0; i < sizeof cols / sizeof cols[0]; i++)
        ck_assert_msg(strstr(p.out, cols[i]), "no column %s in\n%s", cols[i], p.out);
    for (int i = 0; ooc_policy_names[i]; i++) {
        char row[64];
        snprintf(row, sizeof row, "\n%s ", ooc_policy_names[i]);
        ck_assert_msg(strstr(p.out, row), "no row for %s in\n%s", ooc_policy_names[i], p.out);
    }
    ooc_plan_t *pl;
    char err[512] = "";
    ck_assert_msg(ooc_plan_read_file(out, &pl, err, sizeof err) == 0, "%s", err);
    ck_assert_str_eq(pl->policy, "auto");
    ooc_plan_free(pl);
    unlink(out);
    tu_proc_free(&p);
}
END_TEST

START_TEST(test_bad_arguments_are_explained) {
    tu_proc_t p = run("--budget", "lots", REF, NULL, NULL, NULL);
    ck_assert_int_eq(p.status, 2);
    ck_assert_msg(strstr(p.err, "--budget 'lots': expected a positive size"), "%s", p.err);
    tu_proc_free(&p);
    p = run("--policy", "fastest", REF, NULL, NULL, NULL);
    ck_assert_int_eq(p.status, 2);
    ck_assert_msg(strstr(p.err, "--policy 'fastest'"), "%s", p.err);
    tu_proc_free(&p);
    p = run("--frobnicate", "1", REF, NULL, NULL, NULL);
    ck_assert_int_eq(p.status, 2);
    ck_assert_msg(strstr(p.err, "unknown option --frobnicate"), "%s", p.err);
    tu_proc_free(&p);
    p = run(NULL, NULL, NULL, NULL, NULL, NULL);
    ck_assert_int_eq(p.status, 2);
    ck_assert_msg(strstr(p.err, "usage"), "%s", p.err);
    tu_proc_free(&p);
}
END_TEST

START_TEST(test_malformed_profile_names_file_line_field) {
    char dir[1024], cmd[8400];
    snprintf(dir, sizeof dir, "%s/tmp/ooc-plan-bad-%d", tu_build_dir(), (int)getpid());
    snprintf(cmd, sizeof cmd,
             "rm -rf %s && mkdir -p %s && cp %s/*.tsv %s/ && "
             "sed -i '5s/\\t[0-9]*\\t/\\tbig\\t/' %s/buffers.tsv",
             dir, dir, REF, dir, dir);
    ck_assert_int_eq(system(cmd), 0);
    tu_proc_t p = run("--out", "none", dir, NULL, NULL, NULL);
    ck_assert_int_eq(p.status, 1);
    ck_assert_msg(strstr(p.err, "buffers.tsv:5: field bytes: 'big'"), "%s", p.err);
    tu_proc_free(&p);
    p = run("/nonexistent", NULL, NULL, NULL, NULL, NULL);
    ck_assert_int_eq(p.status, 1);
    ck_assert_msg(strstr(p.err, "/nonexistent/meta.tsv: cannot open"), "%s", p.err);
    tu_proc_free(&p);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

START_TEST(test_infeasible_budget_names_the_op) {
    tu_proc_t p = run("--budget", "1M", "--out", "none", REF, NULL);
    ck_assert_int_eq(p.status, 1);
    ck_assert_msg(strstr(p.out, "infeasible: op ") && strstr(p.out, "needs"), "%s", p.out);
    tu_proc_free(&p);
}
END_TEST

Suite *suite_ooc_plan(void) {
    Suite *s = suite_create("ooc_plan");
    TCase *tc = tcase_create("cli");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_all_policies_print_a_table_and_write_auto_plan);
    tcase_add_test(tc, test_bad_arguments_are_explained);
    tcase_add_test(tc, test_malformed_profile_names_file_line_field);
    tcase_add_test(tc, test_infeasible_budget_names_the_op);
    suite_add_tcase(s, tc);
    return s;
}
