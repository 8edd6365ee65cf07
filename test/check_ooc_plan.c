/* SPDX-License-Identifier: MIT */
/* check_ooc_plan.c: the ooc-plan command: its table, the plan it writes, and clear errors for
 * bad arguments and malformed profiles; the order of a plan's same-op actions, kept through the
 * plan file and followed by the simulator. */
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

/* Eight ops of 1 us: op 0 writes B (buffer 0, 3000 bytes) and A (buffer 1, 1000 bytes), ops
 * 1-5 use a scratch buffer S (2 chunks of 64 KiB), op 6 reads A and op 7 reads B. 1 byte per ns
 * each way. A is needed first but has the higher id. */
enum { BUF_B = 0, BUF_A = 1 };
static ooc_profile_t *two_swapins(void) {
    ooc_profile_t *p = ooc_profile_new();
    p->chunk_bytes = 1 << 16;
    p->h2d_bps = p->d2h_bps = 1e9;
    p->bidir_bps = 2e9;
    ck_assert_int_eq(ooc_profile_add_buffer(p, 3000, 0, 7, 0, "B", NULL, 0), BUF_B);
    ck_assert_int_eq(ooc_profile_add_buffer(p, 1000, 0, 6, 0, "A", NULL, 0), BUF_A);
    ck_assert_int_eq(ooc_profile_add_buffer(p, 100000, 1, 5, 0, "S", NULL, 0), 2);
    ooc_ref_t w[2] = {{BUF_B, OOC_ACCESS_W, 0}, {BUF_A, OOC_ACCESS_W, 0}},
              s = {2, OOC_ACCESS_RW, 0}, ra = {BUF_A, OOC_ACCESS_R, 0},
              rb = {BUF_B, OOC_ACCESS_R, 0};
    ooc_profile_add_op(p, 0, OOC_KIND_KERNEL, "k0", NULL, 1000, w, 2);
    for (int i = 1; i <= 5; i++)
        ooc_profile_add_op(p, 0, OOC_KIND_KERNEL, "k", NULL, 1000, &s, 1);
    ooc_profile_add_op(p, 0, OOC_KIND_KERNEL, "k6", NULL, 1000, &ra, 1);
    ooc_profile_add_op(p, 0, OOC_KIND_KERNEL, "k7", NULL, 1000, &rb, 1);
    ck_assert_int_eq(ooc_profile_validate(p, NULL, 0), 0);
    return p;
}

/* Both swapped out after op 0 and swapped in before op 6, `first` added (and so issued) first;
 * `dup` adds A's swap-in a second time, after B's. */
static ooc_plan_t *two_swapins_plan(int32_t first, int dup) {
    ooc_plan_t *pl = ooc_plan_new("test", 8, 3, 1 << 20, 1 << 16);
    ooc_plan_add(pl, 0, OOC_AFTER, OOC_ACT_SWAPOUT, BUF_B, NULL, 0);
    ooc_plan_add(pl, 0, OOC_AFTER, OOC_ACT_SWAPOUT, BUF_A, NULL, 0);
    ooc_plan_add(pl, 7, OOC_BEFORE, OOC_ACT_WAIT, BUF_B, NULL, 0);
    ooc_plan_add(pl, 6, OOC_BEFORE, OOC_ACT_WAIT, BUF_A, NULL, 0);
    ooc_plan_add(pl, 6, OOC_BEFORE, OOC_ACT_SWAPIN, first, NULL, 0);
    ooc_plan_add(pl, 6, OOC_BEFORE, OOC_ACT_SWAPIN, first == BUF_A ? BUF_B : BUF_A, NULL, 0);
    if (dup)
        ooc_plan_add(pl, 6, OOC_BEFORE, OOC_ACT_SWAPIN, BUF_A, NULL, 0);
    ooc_plan_finalize(pl);
    return pl;
}

static uint64_t sim_ns(const ooc_model_t *m, const ooc_plan_t *pl) {
    ooc_sim_result_t r;
    ck_assert_int_eq(ooc_sim_run(m, pl, NULL, &r), 0);
    ck_assert_msg(r.feasible, "%s", r.viol_msg);
    uint64_t t = r.time_ns;
    ooc_sim_result_free(&r);
    return t;
}

/* Writes pl and reads it back. */
static ooc_plan_t *round_trip(const ooc_plan_t *pl) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    ck_assert_ptr_nonnull(f);
    ck_assert_int_eq(ooc_plan_write(pl, f), 0);
    ck_assert_int_eq(fclose(f), 0);
    ooc_plan_t *back = NULL;
    char err[512] = "";
    ck_assert_msg(ooc_plan_parse(text, len, "mem", &back, err, sizeof err) == 0, "%s", err);
    free(text);
    return back;
}

START_TEST(test_same_op_swapins_keep_their_order_and_the_first_needed_first_is_faster) {
    ooc_profile_t *p = two_swapins();
    ooc_model_t *m;
    ck_assert_int_eq(ooc_model_build(p, p->chunk_bytes, &m), 0);
    ooc_plan_t *ab = two_swapins_plan(BUF_A, 0), *ba = two_swapins_plan(BUF_B, 1);
    /* the order added is the order kept, whatever the ids; the repeated swap-in of A is one
     * action */
    ck_assert_uint_eq(ab->nacts, 6);
    ck_assert_uint_eq(ba->nacts, 6);
    ck_assert_int_eq(ab->acts[2].kind, OOC_ACT_SWAPIN);
    ck_assert_int_eq(ab->acts[2].buf, BUF_A);
    ck_assert_int_eq(ab->acts[3].buf, BUF_B);
    ck_assert_int_eq(ba->acts[2].kind, OOC_ACT_SWAPIN);
    ck_assert_int_eq(ba->acts[2].buf, BUF_B);
    ck_assert_int_eq(ba->acts[3].buf, BUF_A);
    /* the copy engine runs them in that order: A first (needed first) hides 1 us more of B's
     * copy behind op 6; B first delays op 6 until both copies are done */
    ck_assert_uint_eq(sim_ns(m, ab), 11000);
    ck_assert_uint_eq(sim_ns(m, ba), 12000);
    /* the plan file keeps the order */
    ooc_plan_t *plans[2] = {ab, ba};
    for (int k = 0; k < 2; k++) {
        ooc_plan_t *back = round_trip(plans[k]);
        ck_assert_uint_eq(back->nacts, plans[k]->nacts);
        for (uint32_t i = 0; i < back->nacts; i++) {
            ck_assert_int_eq(back->acts[i].op, plans[k]->acts[i].op);
            ck_assert_int_eq(back->acts[i].when, plans[k]->acts[i].when);
            ck_assert_int_eq(back->acts[i].kind, plans[k]->acts[i].kind);
            ck_assert_int_eq(back->acts[i].buf, plans[k]->acts[i].buf);
        }
        ck_assert_uint_eq(sim_ns(m, back), k ? 12000 : 11000);
        ooc_plan_free(back);
    }
    ooc_plan_free(ab);
    ooc_plan_free(ba);
    ooc_model_free(m);
    ooc_profile_free(p);
}
END_TEST

START_TEST(test_policies_issue_the_swapin_needed_first_first) {
    ooc_profile_t *p = two_swapins();
    ooc_model_t *m;
    ck_assert_int_eq(ooc_model_build(p, p->chunk_bytes, &m), 0);
    /* under 2 chunks, with S at 2 chunks, A and B are both out during ops 1-5; where a policy
     * swaps both in before one op, A (needed at op 6) comes first though its id is higher (the
     * window policy does so) */
    ooc_policy_opts_t o = {.budget_bytes = 2 << 16};
    int same_op = 0;
    for (int q = 0; ooc_policy_names[q]; q++) {
        ooc_plan_t *pl = NULL;
        char err[512] = "";
        ck_assert_msg(ooc_policy_plan(m, ooc_policy_names[q], &o, &pl, err, sizeof err) == 0,
                      "%s: %s", ooc_policy_names[q], err);
        int32_t in_at[2] = {-1, -1};
        uint32_t idx[2] = {0, 0};
        for (uint32_t k = 0; k < pl->nacts; k++)
            if (pl->acts[k].kind == OOC_ACT_SWAPIN && pl->acts[k].buf < 2) {
                in_at[pl->acts[k].buf] = pl->acts[k].op;
                idx[pl->acts[k].buf] = k;
            }
        if (in_at[BUF_A] >= 0 && in_at[BUF_A] == in_at[BUF_B]) {
            same_op += strcmp(ooc_policy_names[q], "window") == 0;
            ck_assert_msg(idx[BUF_A] < idx[BUF_B], "%s: B's swap-in issued before A's",
                          ooc_policy_names[q]);
        }
        ooc_plan_free(pl);
    }
    ck_assert_int_eq(same_op, 1);
    ooc_model_free(m);
    ooc_profile_free(p);
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
    tcase_add_test(tc, test_same_op_swapins_keep_their_order_and_the_first_needed_first_is_faster);
    tcase_add_test(tc, test_policies_issue_the_swapin_needed_first_first);
    suite_add_tcase(s, tc);
    return s;
}
