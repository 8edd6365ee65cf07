/* SPDX-License-Identifier: MIT */
/* check_planner_sim.c: the simulator's timing on hand-made cases, its rule checks, and the
 * invariants of every policy's plans on every reference profile and on random profiles (memory
 * within the budget, no op before its buffers, no chunk released under a transfer, recompute
 * inputs resident and unchanged, swap-outs swapped back in before use), checked on the trace by
 * an independent checker; and `auto` never worse than another policy. */
#include <check.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ooc_planner.h"
#include "testutil.h"

Suite *suite_planner_sim(void);

/* Four ops, two buffers: A written by op 0 and read by op 3, B written by op 1 and read by op 2.
 * 1 byte per ns each way, 1 us per op. */
static ooc_profile_t *tiny(void) {
    ooc_profile_t *p = ooc_profile_new();
    p->chunk_bytes = 1 << 16;
    p->h2d_bps = p->d2h_bps = 1e9;
    p->bidir_bps = 2e9;
    int32_t prod = 0;
    ck_assert_int_eq(ooc_profile_add_buffer(p, 1000, 0, 3, 0, "A", &prod, 1), 0);
    ck_assert_int_eq(ooc_profile_add_buffer(p, 1000, 1, 2, 0, "B", NULL, 0), 1);
    ooc_ref_t r0 = {0, OOC_ACCESS_W, 0}, r1 = {1, OOC_ACCESS_W, 0}, r2 = {1, OOC_ACCESS_R, 0},
              r3 = {0, OOC_ACCESS_R, 0};
    ooc_profile_add_op(p, 0, OOC_KIND_KERNEL, "k0", NULL, 1000, &r0, 1);
    ooc_profile_add_op(p, 0, OOC_KIND_KERNEL, "k1", NULL, 1000, &r1, 1);
    ooc_profile_add_op(p, 0, OOC_KIND_KERNEL, "k2", NULL, 1000, &r2, 1);
    ooc_profile_add_op(p, 0, OOC_KIND_KERNEL, "k3", NULL, 1000, &r3, 1);
    ck_assert_int_eq(ooc_profile_validate(p, NULL, 0), 0);
    return p;
}

/* Simulates with a trace and checks the trace independently when the plan is feasible. */
static void run_checked(const ooc_model_t *m, const ooc_plan_t *pl, ooc_sim_result_t *r) {
    ooc_trace_t tr = {0};
    ooc_sim_opts_t o = {.trace = &tr, .want_op_stalls = 1};
    ck_assert_int_eq(ooc_sim_run(m, pl, &o, r), 0);
    if (r->feasible) {
        char err[512] = "";
        ck_assert_msg(ooc_trace_check(m, pl, &tr, err, sizeof err) == 0, "%s: %s", pl->policy, err);
        ck_assert_uint_le(r->peak_bytes, pl->budget_bytes);
    }
    ooc_trace_free(&tr);
}

/* run_checked for case i of a table: feasible, and the time and stall it expects. */
static void run_case(const ooc_model_t *m, const ooc_plan_t *pl, size_t i, uint64_t time,
                     uint64_t stall, ooc_sim_result_t *r) {
    run_checked(m, pl, r);
    ck_assert_msg(r->feasible, "%s", r->viol_msg);
    ck_assert_msg(r->time_ns == time && r->stall_ns == stall,
                  "case %zu: time %llu stall %llu, expected %llu and %llu", i,
                  (unsigned long long)r->time_ns, (unsigned long long)r->stall_ns,
                  (unsigned long long)time, (unsigned long long)stall);
}

static ooc_plan_t *swap_a(uint64_t budget, int32_t in_at, int with_wait) {
    ooc_plan_t *pl = ooc_plan_new("test", 4, 2, budget, 1 << 16);
    ooc_plan_add(pl, 0, OOC_AFTER, OOC_ACT_SWAPOUT, 0, NULL, 0);
    ooc_plan_add(pl, in_at, OOC_BEFORE, OOC_ACT_SWAPIN, 0, NULL, 0);
    if (with_wait)
        ooc_plan_add(pl, 3, OOC_BEFORE, OOC_ACT_WAIT, 0, NULL, 0);
    ooc_plan_finalize(pl);
    return pl;
}

START_TEST(test_swap_overlaps_compute_exactly) {
    ooc_profile_t *p = tiny();
    ooc_model_t *m;
    ck_assert_int_eq(ooc_model_build(p, p->chunk_bytes, &m), 0);
    ooc_sim_result_t r;
    ooc_plan_t *pl = swap_a(1 << 20, 2, 1);
    run_checked(m, pl, &r);
    ck_assert_msg(r.feasible, "%s", r.viol_msg);
    ck_assert_uint_eq(r.time_ns, 4000);
    ck_assert_uint_eq(r.stall_ns, 0);
    ck_assert_uint_eq(r.h2d_bytes, 1000);
    ck_assert_uint_eq(r.d2h_bytes, 1000);
    ck_assert_uint_eq(r.peak_bytes, 2048);
    ck_assert_uint_eq(r.n_swap, 1);
    ooc_sim_result_free(&r);
    ooc_plan_free(pl);
    /* swapped in only at its use: the copy is exposed */
    pl = swap_a(1 << 20, 3, 1);
    run_checked(m, pl, &r);
    ck_assert_uint_eq(r.time_ns, 5000);
    ck_assert_uint_eq(r.stall_ns, 1000);
    ck_assert_uint_eq(r.op_stall_ns[3], 1000);
    ooc_sim_result_free(&r);
    ooc_plan_free(pl);
    ooc_model_free(m);
    ooc_profile_free(p);
}
END_TEST

/* Safe mode without staging (swapin_exclusive): a copy in starts only between ops and nothing
 * runs until it ends. A is copied out during op 1 (1000 ns) and swapped in before op 2: at 2000
 * ns, op 2 then waits for it (3000), and the iteration takes 5000 ns where the copy hid behind op
 * 2 before. The trace checker refuses a trace that overlaps the two. */
START_TEST(test_exclusive_swap_in_runs_alone) {
    ooc_profile_t *p = tiny();
    ooc_model_t *m;
    ck_assert_int_eq(ooc_model_build(p, p->chunk_bytes, &m), 0);
    ooc_plan_t *pl = swap_a(1 << 20, 2, 1);
    ooc_trace_t tr = {0};
    ooc_sim_opts_t o = {.trace = &tr, .want_op_stalls = 1};
    ooc_sim_result_t r;
    ck_assert_int_eq(ooc_sim_run(m, pl, &o, &r), 0);
    ck_assert_uint_eq(r.time_ns, 4000);
    ooc_sim_result_free(&r);
    char err[512] = "";
    p->swapin_exclusive = 1;
    ck_assert_int_eq(ooc_trace_check(m, pl, &tr, err, sizeof err), OOC_EINFEASIBLE);
    ck_assert_msg(strstr(err, "while a swap-in runs") || strstr(err, "starts while op"), "%s", err);
    ooc_trace_free(&tr);
    run_checked(m, pl, &r);
    ck_assert_msg(r.feasible, "%s", r.viol_msg);
    ck_assert_uint_eq(r.time_ns, 5000);
    ck_assert_uint_eq(r.stall_ns, 1000);
    ck_assert_uint_eq(r.op_stall_ns[2], 1000);
    ooc_sim_result_free(&r);
    ooc_plan_free(pl);
    ooc_model_free(m);
    ooc_profile_free(p);
}
END_TEST

/* Three buffers of one 1 KiB chunk, 1 byte per ns each way: op 0 (1000 ns) writes A and B, op 1
 * (3000 ns) reads B, op 2 (1000 ns) reads B and C, op 3 (1000 ns) reads A (`swap`: op 2 reads A
 * and B, op 3 reads C). B is freed after op 2; C is persistent. */
static ooc_profile_t *three(int gate, int swap) {
    ooc_profile_t *q = ooc_profile_new();
    q->chunk_bytes = 1024;
    q->h2d_bps = q->d2h_bps = 1e9;
    q->bidir_bps = 2e9;
    q->remap_gate = (uint8_t)gate;
    int32_t prod = 0;
    ck_assert_int_eq(ooc_profile_add_buffer(q, 1000, 0, 3, 0, "A", &prod, 1), 0);
    ck_assert_int_eq(ooc_profile_add_buffer(q, 1000, 0, 2, 0, "B", NULL, 0), 1);
    ck_assert_int_eq(ooc_profile_add_buffer(q, 1000, -1, -1, 1, "C", NULL, 0), 2);
    ooc_ref_t r0[2] = {{0, OOC_ACCESS_W, 0}, {1, OOC_ACCESS_W, 0}}, r1 = {1, OOC_ACCESS_R, 0},
              r2[2] = {{swap ? 0 : 1, OOC_ACCESS_R, 0}, {swap ? 1 : 2, OOC_ACCESS_R, 0}},
              r3 = {swap ? 2 : 0, OOC_ACCESS_R, 0};
    ooc_profile_add_op(q, 0, OOC_KIND_KERNEL, "k0", NULL, 1000, r0, 2);
    ooc_profile_add_op(q, 0, OOC_KIND_KERNEL, "k1", NULL, 3000, &r1, 1);
    ooc_profile_add_op(q, 0, OOC_KIND_KERNEL, "k2", NULL, 1000, r2, 2);
    ooc_profile_add_op(q, 0, OOC_KIND_KERNEL, "k3", NULL, 1000, &r3, 1);
    ck_assert_int_eq(ooc_profile_validate(q, NULL, 0), 0);
    return q;
}

/* Safe mode behind the shim's gates (meta remap_gate): a planned swap-in takes its memory at its
 * point, and nothing computes until the copies out holding it are done. `three`; A is copied out
 * after op 0 (1000-2000).
 * - A budget of two chunks, C (on the host) swapped in before op 1 and waited for before op 2, A
 *   swapped in before op 2 and waited for before op 3. Without the gate: op 1 runs 1000-4000;
 *   C's copy waits for A's memory and runs 2000-3000, hidden; A's copy waits for B's free after
 *   op 2 (5000-6000) and op 3 waits for it: 7000 ns, 1000 stalled, at op 3. With the gate:
 *   C's swap-in holds op 1 until A's copy out is done (2000); op 1 runs 2000-5000; A's swap-in
 *   finds no copy out that would free memory for it and takes memory when its copy starts, as
 *   without the gate (6000-7000): 8000 ns, 2000 stalled, 1000 of them at op 1.
 * - A budget of three, A swapped in before op 1 while it still copies out, then C: A's takes
 *   memory when its copy starts (the trace checker refuses a second mapping of a buffer still
 *   mapped), and C's, behind it in the copy engine's order, then does too (holding memory at
 *   its point could leave A's copy waiting for memory behind it): A 2000-3000, C 3000-4000,
 *   6000 ns and no stall, with the gate or without. */
START_TEST(test_a_gated_swap_in_takes_its_memory_at_its_point) {
    for (int gate = 0; gate < 2; gate++) {
        ooc_profile_t *q = three(gate, 0);
        ooc_model_t *m;
        ck_assert_int_eq(ooc_model_build(q, q->chunk_bytes, &m), 0);
        for (int early = 0; early < 2; early++) {
            ooc_plan_t *pl = ooc_plan_new("test", 4, 3, early ? 3072 : 2048, 1024);
            pl->start_host[2] = 1;
            ooc_plan_add(pl, 0, OOC_AFTER, OOC_ACT_SWAPOUT, 0, NULL, 0);
            ooc_plan_add(pl, early ? 1 : 2, OOC_BEFORE, OOC_ACT_SWAPIN, 0, NULL, 0);
            ooc_plan_add(pl, 1, OOC_BEFORE, OOC_ACT_SWAPIN, 2, NULL, 0);
            ooc_plan_add(pl, 2, OOC_BEFORE, OOC_ACT_WAIT, 2, NULL, 0);
            ooc_plan_add(pl, 2, OOC_AFTER, OOC_ACT_SWAPOUT, 2, NULL, 0);
            ooc_plan_add(pl, 3, OOC_BEFORE, OOC_ACT_WAIT, 0, NULL, 0);
            ooc_plan_finalize(pl);
            ooc_sim_result_t r;
            int held = gate && !early;
            run_case(m, pl, (size_t)(2 * gate + early),
                     early  ? 6000
                     : held ? 8000
                            : 7000,
                     early  ? 0
                     : held ? 2000
                            : 1000,
                     &r);
            ck_assert_uint_eq(r.op_stall_ns[1], held ? 1000 : 0);
            ck_assert_uint_eq(r.op_stall_ns[3], early ? 0 : 1000);
            ooc_sim_result_free(&r);
            ooc_plan_free(pl);
        }
        ooc_model_free(m);
        ooc_profile_free(q);
    }
}
END_TEST

/* `three` with op 2 reading A and B and op 3 reading C, a budget of two chunks: A is copied out
 * after op 0 (1000-2000) and swapped in before op 1, while that copy runs, then C; op 2 waits for
 * A, op 3 for C. A's swap-in takes memory when its copy starts (2000-3000); C's, behind it in the
 * copy engine's order, does too, with the gate or without: held at its point, C's would take the
 * memory A's copy waits for, A's copy would wait for op 2's free of B, and op 2 for A. C's copy
 * then runs after op 2 (5000-6000), op 3 waits for it (6000-7000), and C is copied out after it
 * (any use counts as a write): 8000 ns, 1000 stalled. */
START_TEST(test_a_gated_swap_in_behind_one_waiting_for_memory_takes_none) {
    for (int gate = 0; gate < 2; gate++) {
        ooc_profile_t *q = three(gate, 1);
        ooc_model_t *m;
        ck_assert_int_eq(ooc_model_build(q, q->chunk_bytes, &m), 0);
        ooc_plan_t *pl = ooc_plan_new("test", 4, 3, 2048, 1024);
        pl->start_host[2] = 1;
        ooc_plan_add(pl, 0, OOC_AFTER, OOC_ACT_SWAPOUT, 0, NULL, 0);
        ooc_plan_add(pl, 1, OOC_BEFORE, OOC_ACT_SWAPIN, 0, NULL, 0);
        ooc_plan_add(pl, 1, OOC_BEFORE, OOC_ACT_SWAPIN, 2, NULL, 0);
        ooc_plan_add(pl, 2, OOC_BEFORE, OOC_ACT_WAIT, 0, NULL, 0);
        ooc_plan_add(pl, 3, OOC_BEFORE, OOC_ACT_WAIT, 2, NULL, 0);
        ooc_plan_add(pl, 3, OOC_AFTER, OOC_ACT_SWAPOUT, 2, NULL, 0);
        ooc_plan_finalize(pl);
        ooc_sim_result_t r;
        run_case(m, pl, (size_t)gate, 8000, 1000, &r);
        ck_assert_uint_eq(r.op_stall_ns[3], 1000);
        ooc_sim_result_free(&r);
        ooc_plan_free(pl);
        ooc_model_free(m);
        ooc_profile_free(q);
    }
}
END_TEST

/* The driver's mapping calls take the worker's time (swapin_vmm_ns, swapout_vmm_ns per chunk),
 * one after another. A (one 1 KiB chunk) is copied out during op 1 (1000-2000 ns), then swapped in
 * before op 2; op 3 reads it. With 300 ns to unmap a chunk and 500 to map one: the unmap runs
 * 2000-2300, the swap-in's mapping after it, 2300-2800, the copy 2800-3800, and op 3 waits for
 * it (3800-4800) where it ran at 3000 without mapping costs. With the unmap alone, the mapping
 * still waits for the lane: the copy runs 2300-3300. In safe mode without staging (exclusive)
 * nothing computes while a chunk is remapped: op 2 waits for the unmap, the mapping and the copy
 * (2800-3800, ops 2 and 3 after); with the unmap alone, op 2 waits for it and the copy (3300).
 * With staging the copy overlaps op 2 (2300-3300, after the unmap; the copy 2800-3800), and op 3
 * waits for it and then for the remap at its first use (3800-4300). A profile that has the
 * staged swap-in's own costs (stage_vmm_ns 700, adopt_vmm_ns 900) charges them instead there:
 * staging 2300-3000, the copy 3000-4000, the remap 4000-4900, op 3 4900-5900; and nowhere else
 * (outside safe mode they change nothing). */
START_TEST(test_mapping_calls_take_the_worker_in_turn) {
    static const struct {
        uint64_t in, out;
        int excl;
        uint64_t stage, adopt;
        uint64_t time, stall;
    } cases[] = {{0, 0, 0, 0, 0, 4000, 0},          {500, 300, 0, 0, 0, 4800, 800},
                 {0, 300, 0, 0, 0, 4300, 300},      {0, 0, 1, 0, 0, 5000, 1000},
                 {500, 300, 1, 0, 0, 5800, 1800},   {0, 300, 1, 0, 0, 5300, 1300},
                 {500, 300, 2, 0, 0, 5300, 1300},   {500, 300, 2, 700, 900, 5900, 1900},
                 {500, 300, 0, 700, 900, 4800, 800}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ooc_profile_t *p = tiny();
        p->chunk_bytes = 1024; /* A and B take a chunk each */
        p->swapin_vmm_ns = cases[i].in;
        p->swapout_vmm_ns = cases[i].out;
        p->stage_vmm_ns = cases[i].stage;
        p->adopt_vmm_ns = cases[i].adopt;
        p->swapin_exclusive = cases[i].excl == 1;  /* safe mode */
        p->swapout_exclusive = cases[i].excl != 0; /* 2: safe mode with staging */
        ooc_model_t *m;
        ck_assert_int_eq(ooc_model_build(p, p->chunk_bytes, &m), 0);
        ooc_plan_t *pl = swap_a(1 << 20, 2, 1);
        ooc_sim_result_t r;
        run_case(m, pl, i, cases[i].time, cases[i].stall, &r);
        ck_assert_uint_eq(r.h2d_bytes, 1000);
        ooc_sim_result_free(&r);
        ooc_plan_free(pl);
        ooc_model_free(m);
        ooc_profile_free(p);
    }
}
END_TEST

/* The program's thread issues the ops and maps the buffers allocated during the iteration itself
 * (map_vmm_ns per chunk before the first use, unmap_vmm_ns after the free, owed by the next op
 * issued); an op starts no earlier than it is issued, and the host issues no op before the op's
 * swap-ins were mapped. A and B are new (one 1 KiB chunk each), every op takes 1000 ns.
 * - Both kept, 500 ns to map: op 0 is issued at 500 (A mapped) and runs 500-1500; op 1 is issued
 *   at 1000 (B mapped) and the host stays ahead: 4500 ns, 500 of them stalled.
 * - The same with 3000 ns to unmap: B's free after op 2 is owed by op 3, issued at 1000 + 3000
 *   = 4000 where op 2 ended at 3500: 5000 ns, 1000 stalled.
 * - A swapped out after op 0 and in before op 2 (300 ns to unmap after the copy out, 500 to map
 *   for the swap-in), 1500 to unmap after a free: A's copy out runs 1500-2500, the worker
 *   unmaps it 2500-2800 and maps the swap-in 2800-3300, the copy 3300-4300. The host issues op 3
 *   (which reads A) only after 3300, then makes B's unmap: op 3 runs 4800-5800; without waiting
 *   for the swap-in's mapping it would be issued at 2500 and run at the copy's end, 4300. */
START_TEST(test_the_programs_thread_issues_each_op) {
    static const struct {
        uint64_t map, unmap, in, out;
        int swap;
        uint64_t time, stall;
    } cases[] = {{500, 0, 0, 0, 0, 4500, 500},
                 {500, 3000, 0, 0, 0, 5000, 1000},
                 {500, 1500, 500, 300, 1, 5800, 1800},
                 {0, 0, 500, 300, 1, 4800, 800}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ooc_profile_t *p = tiny();
        p->chunk_bytes = 1024;
        p->map_vmm_ns = cases[i].map;
        p->unmap_vmm_ns = cases[i].unmap;
        p->swapin_vmm_ns = cases[i].in;
        p->swapout_vmm_ns = cases[i].out;
        ooc_model_t *m;
        ck_assert_int_eq(ooc_model_build(p, p->chunk_bytes, &m), 0);
        ooc_plan_t *pl;
        if (cases[i].swap) {
            pl = swap_a(1 << 20, 2, 1);
        } else {
            pl = ooc_plan_new("keep", 4, 2, 1 << 20, 1 << 16);
            ooc_plan_finalize(pl);
        }
        ooc_sim_result_t r;
        run_case(m, pl, i, cases[i].time, cases[i].stall, &r);
        ooc_sim_result_free(&r);
        ooc_plan_free(pl);
        ooc_model_free(m);
        ooc_profile_free(p);
    }
}
END_TEST

START_TEST(test_memory_waits_for_released_chunks) {
    ooc_profile_t *p = tiny();
    ooc_model_t *m;
    ck_assert_int_eq(ooc_model_build(p, p->chunk_bytes, &m), 0);
    ooc_sim_result_t r;
    ooc_plan_t *pl = swap_a(1024, 2, 1); /* one buffer at a time */
    run_checked(m, pl, &r);
    ck_assert_msg(r.feasible, "%s", r.viol_msg);
    ck_assert_uint_eq(r.time_ns, 6000);
    ck_assert_uint_eq(r.stall_ns, 2000);
    ck_assert_uint_eq(r.peak_bytes, 1024);
    ooc_sim_result_free(&r);
    ooc_plan_free(pl);
    /* keeping A under that budget cannot work: op 1 never gets memory */
    pl = ooc_plan_new("keep", 4, 2, 1024, 1 << 16);
    ooc_plan_finalize(pl);
    run_checked(m, pl, &r);
    ck_assert(!r.feasible);
    ck_assert_int_eq(r.viol_code, OOC_EINFEASIBLE);
    ck_assert_int_eq(r.viol_op, 1);
    ck_assert_msg(strstr(r.viol_msg, "op 1 (k1)"), "%s", r.viol_msg);
    ooc_sim_result_free(&r);
    ooc_plan_free(pl);
    ooc_model_free(m);
    ooc_profile_free(p);
}
END_TEST

START_TEST(test_broken_plans_are_reported) {
    ooc_profile_t *p = tiny();
    ooc_model_t *m;
    ck_assert_int_eq(ooc_model_build(p, p->chunk_bytes, &m), 0);
    ooc_sim_result_t r;
    ooc_plan_t *pl = swap_a(1 << 20, 2, 0); /* no wait before the use */
    ck_assert_int_eq(ooc_sim_run(m, pl, NULL, &r), 0);
    ck_assert(!r.feasible);
    ck_assert_msg(strstr(r.viol_msg, "no wait"), "%s", r.viol_msg);
    ooc_plan_free(pl);
    pl = ooc_plan_new("t", 4, 2, 1 << 20, 1 << 16); /* out, never back in */
    ooc_plan_add(pl, 0, OOC_AFTER, OOC_ACT_SWAPOUT, 0, NULL, 0);
    ooc_plan_finalize(pl);
    ck_assert_int_eq(ooc_sim_run(m, pl, NULL, &r), 0);
    ck_assert(!r.feasible);
    ck_assert_int_eq(r.viol_op, 3);
    ck_assert_msg(strstr(r.viol_msg, "swapped out and was not swapped in"), "%s", r.viol_msg);
    ooc_plan_free(pl);
    int32_t via = 1; /* op 1 is not A's producer */
    pl = ooc_plan_new("t", 4, 2, 1 << 20, 1 << 16);
    ooc_plan_add(pl, 0, OOC_AFTER, OOC_ACT_DROP, 0, NULL, 0);
    ooc_plan_add(pl, 3, OOC_BEFORE, OOC_ACT_RECOMPUTE, 0, &via, 1);
    ooc_plan_finalize(pl);
    ck_assert_int_eq(ooc_sim_run(m, pl, NULL, &r), 0);
    ck_assert(!r.feasible);
    ck_assert_msg(strstr(r.viol_msg, "breaks the recompute rule"), "%s", r.viol_msg);
    ooc_plan_free(pl);
    ooc_model_free(m);
    ooc_profile_free(p);
}
END_TEST

START_TEST(test_recompute_relaunches_producer) {
    ooc_profile_t *p = tiny();
    ooc_model_t *m;
    ck_assert_int_eq(ooc_model_build(p, p->chunk_bytes, &m), 0);
    ck_assert_int_eq(m->recomp[0], 1);
    int32_t via = 0;
    ooc_plan_t *pl = ooc_plan_new("t", 4, 2, 1024, 1 << 16);
    ooc_plan_add(pl, 0, OOC_AFTER, OOC_ACT_DROP, 0, NULL, 0);
    ooc_plan_add(pl, 3, OOC_BEFORE, OOC_ACT_RECOMPUTE, 0, &via, 1);
    ooc_plan_finalize(pl);
    ck_assert_int_eq(pl->decision[0], OOC_RECOMPUTE);
    ooc_sim_result_t r;
    run_checked(m, pl, &r);
    ck_assert_msg(r.feasible, "%s", r.viol_msg);
    ck_assert_uint_eq(r.time_ns, 5000);
    ck_assert_uint_eq(r.recompute_ns, 1000);
    ck_assert_uint_eq(r.h2d_bytes + r.d2h_bytes, 0);
    ck_assert_uint_eq(r.n_recompute, 1);
    ooc_sim_result_free(&r);
    ooc_plan_free(pl);
    ooc_model_free(m);
    ooc_profile_free(p);
}
END_TEST

/* A buffer changed in place after its producer (a ReLU applied to a GEMM's output) is not
 * recomputable: re-launching the producer would lose the change. */
START_TEST(test_buffer_written_after_its_producer_is_not_recomputable) {
    ooc_profile_t *p = ooc_profile_new();
    p->chunk_bytes = 1 << 16;
    p->h2d_bps = p->d2h_bps = 1e9;
    p->bidir_bps = 2e9;
    int32_t prod = 0;
    ck_assert_int_eq(ooc_profile_add_buffer(p, 1000, 0, 4, 0, "A", &prod, 1), 0);
    ck_assert_int_eq(ooc_profile_add_buffer(p, 1000, 0, 4, 0, "X", NULL, 0), 1);
    ooc_ref_t w[2] = {{0, OOC_ACCESS_W, 0}, {1, OOC_ACCESS_R, 0}}, inplace = {0, OOC_ACCESS_RW, 0},
              other = {1, OOC_ACCESS_R, 0}, rd = {0, OOC_ACCESS_R, 0};
    ooc_profile_add_op(p, 0, OOC_KIND_KERNEL, "gemm", NULL, 1000, w, 2);
    ooc_profile_add_op(p, 0, OOC_KIND_KERNEL, "relu", NULL, 1000, &inplace, 1);
    ooc_profile_add_op(p, 0, OOC_KIND_KERNEL, "k2", NULL, 1000, &other, 1);
    ooc_profile_add_op(p, 0, OOC_KIND_KERNEL, "k3", NULL, 1000, &other, 1);
    ooc_profile_add_op(p, 0, OOC_KIND_KERNEL, "k4", NULL, 1000, &rd, 1);
    char err[512] = "";
    ck_assert_msg(ooc_profile_validate(p, err, sizeof err) == 0, "%s", err);
    ooc_model_t *m;
    ck_assert_int_eq(ooc_model_build(p, p->chunk_bytes, &m), 0);
    ck_assert_int_eq(m->recomp[0], 0);
    ooc_model_free(m);
    /* without the in-place op it would be */
    p->refs[p->ops[1].ref_off].access = OOC_ACCESS_R;
    ck_assert_int_eq(ooc_model_build(p, p->chunk_bytes, &m), 0);
    ck_assert_int_eq(m->recomp[0], 1);
    ooc_model_free(m);
    ooc_profile_free(p);
}
END_TEST

START_TEST(test_budget_below_an_op_is_infeasible_naming_it) {
    ooc_profile_t *p = tiny();
    ooc_model_t *m;
    ck_assert_int_eq(ooc_model_build(p, p->chunk_bytes, &m), 0);
    for (int i = 0; ooc_policy_names[i]; i++) {
        char err[512] = "";
        ooc_policy_opts_t o = {.budget_bytes = 1000};
        ooc_plan_t *pl = NULL;
        ck_assert_int_eq(ooc_policy_plan(m, ooc_policy_names[i], &o, &pl, err, sizeof err),
                         OOC_EINFEASIBLE);
        ck_assert_ptr_null(pl);
        ck_assert_msg(strstr(err, "op 0 (k0) needs 1024 bytes"), "%s", err);
    }
    ooc_model_free(m);
    ooc_profile_free(p);
}
END_TEST

/* A buffer dead after its last use but freed by the program only later (a gradient after the
 * optimizer step) is swapped out after that use under every policy, never dropped: the shim does
 * not discard bytes a program may still read, so the copy is what the simulator must charge. One
 * freed right after its last use gets no action. auto, when everything fits, keeps it resident
 * and copies nothing. */
START_TEST(test_dead_buffers_freed_later_are_swapped_out) {
    ooc_profile_t *p = ooc_profile_new();
    p->chunk_bytes = 1 << 16;
    p->h2d_bps = p->d2h_bps = 1e9;
    p->bidir_bps = 2e9;
    /* G: written by op 0, read by op 1, freed after op 4; T: written by op 2, read by op 3,
     * freed after op 4 too but used by op 4; X: each op's scratch, freed right after op 3 */
    ck_assert_int_eq(ooc_profile_add_buffer(p, 1000, 0, 4, 0, "G", NULL, 0), 0);
    ck_assert_int_eq(ooc_profile_add_buffer(p, 1000, 2, 4, 0, "T", NULL, 0), 1);
    ck_assert_int_eq(ooc_profile_add_buffer(p, 1000, 0, 3, 0, "X", NULL, 0), 2);
    ooc_ref_t gw[2] = {{0, OOC_ACCESS_W, 0}, {2, OOC_ACCESS_RW, 0}};
    ooc_ref_t gr[2] = {{0, OOC_ACCESS_R, 0}, {2, OOC_ACCESS_RW, 0}};
    ooc_ref_t tw[2] = {{1, OOC_ACCESS_W, 0}, {2, OOC_ACCESS_RW, 0}};
    ooc_ref_t tr[2] = {{1, OOC_ACCESS_R, 0}, {2, OOC_ACCESS_RW, 0}};
    ooc_ref_t tr2[1] = {{1, OOC_ACCESS_R, 0}};
    ooc_profile_add_op(p, 0, OOC_KIND_KERNEL, "k0", NULL, 1000, gw, 2);
    ooc_profile_add_op(p, 0, OOC_KIND_KERNEL, "k1", NULL, 1000, gr, 2);
    ooc_profile_add_op(p, 0, OOC_KIND_KERNEL, "k2", NULL, 1000, tw, 2);
    ooc_profile_add_op(p, 0, OOC_KIND_KERNEL, "k3", NULL, 1000, tr, 2);
    ooc_profile_add_op(p, 0, OOC_KIND_KERNEL, "k4", NULL, 1000, tr2, 1);
    char err[512] = "";
    ck_assert_msg(ooc_profile_validate(p, err, sizeof err) == 0, "%s", err);
    ooc_model_t *m;
    ck_assert_int_eq(ooc_model_build(p, p->chunk_bytes, &m), 0);
    for (int i = 0; ooc_policy_names[i]; i++) {
        ooc_policy_opts_t o = {.budget_bytes = 1 << 20};
        ooc_plan_t *pl = NULL;
        ck_assert_int_eq(ooc_policy_plan(m, ooc_policy_names[i], &o, &pl, err, sizeof err), 0);
        int g_out = 0, x_act = 0;
        for (uint32_t k = 0; k < pl->nacts; k++) {
            const ooc_action_t *a = &pl->acts[k];
            ck_assert_msg(a->kind != OOC_ACT_DROP, "%s: drop of buffer %d after op %d",
                          ooc_policy_names[i], a->buf, a->op);
            g_out += a->buf == 0 && a->kind == OOC_ACT_SWAPOUT && a->op == 1;
            x_act += a->buf == 2;
        }
        /* auto keeps everything when it all fits (1 MiB holds the three chunks) */
        int is_auto = strcmp(ooc_policy_names[i], "auto") == 0;
        ck_assert_msg(g_out == !is_auto, "%s: G is %sswapped out after its last use",
                      ooc_policy_names[i], g_out ? "" : "not ");
        ck_assert_msg(x_act == 0, "%s: an action on X, freed right after its last use",
                      ooc_policy_names[i]);
        ooc_sim_result_t r;
        run_checked(m, pl, &r);
        ck_assert_msg(r.feasible, "%s: %s", ooc_policy_names[i], r.viol_msg);
        if (is_auto)
            ck_assert_uint_eq(r.d2h_bytes, 0);
        else
            ck_assert_uint_ge(r.d2h_bytes, 1000); /* G's copy is charged */
        ooc_sim_result_free(&r);
        ooc_plan_free(pl);
    }
    /* 2500 bytes do not hold G, T and X at op 2: auto too swaps G out, and is charged for it. */
    ooc_policy_opts_t o = {.budget_bytes = 2500};
    ooc_plan_t *pl = NULL;
    ck_assert_int_eq(ooc_policy_plan(m, "auto", &o, &pl, err, sizeof err), 0);
    ooc_sim_result_t r;
    run_checked(m, pl, &r);
    ck_assert_msg(r.feasible, "auto at 2500 bytes: %s", r.viol_msg);
    ck_assert_uint_ge(r.d2h_bytes, 1000);
    ooc_sim_result_free(&r);
    ooc_plan_free(pl);
    ooc_model_free(m);
    ooc_profile_free(p);
}
END_TEST

/* tiny() with 100 ns ops; A recomputable (op 0 its producer) or not. Under a budget of one
 * buffer (1024 bytes of footprint), A is off the device while B lives (ops 1 and 2). */
static ooc_profile_t *tiny_fast(int recomputable) {
    ooc_profile_t *p = tiny();
    for (uint32_t i = 0; i < p->nops; i++)
        p->ops[i].duration_ns = 100;
    if (!recomputable)
        p->bufs[0].nprod = 0;
    return p;
}

/* By hand, not recomputable: at the cut of op 1 A (1000 bytes at 1 byte/ns) is off; its copy-out
 * starts after op 0 (100 ns) and ends before op 1, its copy-in starts after that and ends before
 * op 3 (100 ns): 100 + 1000 + 1000 + 100 = 2200 ns. The windows between consecutive ops see more:
 * A must be gone when op 1 starts (op 0 + its copy-out, 1100 ns), op 1 takes 100 ns, and A's
 * copy-in cannot start until op 2 has ended and B is freed (op 2 + the copy-in, 1100 ns), then
 * op 3: 2400 ns, what the best plan takes (B's op waits for A's copy-out, A's copy-in for B's
 * free). */
START_TEST(test_bound_by_hand_transfers) {
    ooc_profile_t *p = tiny_fast(0);
    ooc_model_t *m;
    ck_assert_int_eq(ooc_model_build(p, p->chunk_bytes, &m), 0);
    ooc_bound_t b;
    ck_assert_int_eq(ooc_model_bound(m, 1024, &b), 0);
    ck_assert_uint_le(b.bound_ns, 2400);
    ck_assert_uint_ge(b.bound_ns, 2399);
    ck_assert_int_eq(b.cut_op, -1); /* the windows' sum, above every cut */
    ck_assert_uint_eq(ooc_model_bound_ns(m, 1024, NULL), b.bound_ns);
    /* with room for both, the compute time */
    ck_assert_int_eq(ooc_model_bound(m, 2048, &b), 0);
    ck_assert_uint_eq(b.bound_ns, 400);
    ck_assert_int_eq(b.cut_op, -1);
    /* below op 0's own buffer: infeasible */
    ck_assert_int_eq(ooc_model_bound(m, 1000, &b), OOC_EINFEASIBLE);
    ooc_plan_t *pl = swap_a(1024, 1, 1);
    ooc_sim_result_t r;
    run_checked(m, pl, &r);
    ck_assert_msg(r.feasible, "%s", r.viol_msg);
    ck_assert_uint_eq(r.time_ns, 2400);
    ooc_sim_result_free(&r);
    ooc_plan_free(pl);
    ooc_model_free(m);
    ooc_profile_free(p);
}
END_TEST

/* By hand, the copy engines' forced work: A and B (1000 bytes each, 1 byte/ns, not
 * recomputable) are written by ops 0 and 1 and read by op 4; op 2's 2000-byte buffer fills the
 * 2048-byte budget, so both must be copied out before op 2 and back in after it ends, one after
 * the other on the copy-in engine, while op 3 (100 bytes) runs: 100 + 100 + 100 + 2000 + 100 =
 * 2400 ns from the start of op 2 on, after op 0 and both copies out (2100 ns): 4300 ns, what the
 * plan below takes. The windows between consecutive ops and the cuts see less (op 3 may run
 * beside one of them). */
START_TEST(test_bound_by_hand_copy_engine) {
    ooc_profile_t *p = ooc_profile_new();
    p->chunk_bytes = 1 << 16;
    p->h2d_bps = p->d2h_bps = 1e9;
    p->bidir_bps = 2e9;
    ck_assert_int_eq(ooc_profile_add_buffer(p, 1000, 0, 4, 0, "A", NULL, 0), 0);
    ck_assert_int_eq(ooc_profile_add_buffer(p, 1000, 1, 4, 0, "B", NULL, 0), 1);
    ck_assert_int_eq(ooc_profile_add_buffer(p, 2000, 2, 2, 0, "C", NULL, 0), 2);
    ck_assert_int_eq(ooc_profile_add_buffer(p, 100, 3, 3, 0, "D", NULL, 0), 3);
    ooc_ref_t r0 = {0, OOC_ACCESS_W, 0}, r1 = {1, OOC_ACCESS_W, 0}, r2 = {2, OOC_ACCESS_W, 0},
              r3 = {3, OOC_ACCESS_W, 0}, r4[2] = {{0, OOC_ACCESS_R, 0}, {1, OOC_ACCESS_R, 0}};
    ooc_profile_add_op(p, 0, OOC_KIND_KERNEL, "k0", NULL, 100, &r0, 1);
    ooc_profile_add_op(p, 0, OOC_KIND_KERNEL, "k1", NULL, 100, &r1, 1);
    ooc_profile_add_op(p, 0, OOC_KIND_KERNEL, "k2", NULL, 100, &r2, 1);
    ooc_profile_add_op(p, 0, OOC_KIND_KERNEL, "k3", NULL, 100, &r3, 1);
    ooc_profile_add_op(p, 0, OOC_KIND_KERNEL, "k4", NULL, 100, r4, 2);
    ck_assert_int_eq(ooc_profile_validate(p, NULL, 0), 0);
    ooc_model_t *m;
    ck_assert_int_eq(ooc_model_build(p, p->chunk_bytes, &m), 0);
    ooc_bound_t b;
    ck_assert_int_eq(ooc_model_bound(m, 2048, &b), 0);
    ck_assert_uint_le(b.bound_ns, 4300);
    ck_assert_uint_ge(b.bound_ns, 4299);
    ooc_plan_t *pl = ooc_plan_new("t", 5, 4, 2048, 1 << 16);
    ooc_plan_add(pl, 0, OOC_AFTER, OOC_ACT_SWAPOUT, 0, NULL, 0);
    ooc_plan_add(pl, 1, OOC_AFTER, OOC_ACT_SWAPOUT, 1, NULL, 0);
    ooc_plan_add(pl, 3, OOC_BEFORE, OOC_ACT_SWAPIN, 0, NULL, 0);
    ooc_plan_add(pl, 4, OOC_BEFORE, OOC_ACT_SWAPIN, 1, NULL, 0);
    ooc_plan_add(pl, 4, OOC_BEFORE, OOC_ACT_WAIT, 0, NULL, 0);
    ooc_plan_add(pl, 4, OOC_BEFORE, OOC_ACT_WAIT, 1, NULL, 0);
    ooc_plan_finalize(pl);
    ooc_sim_result_t r;
    run_checked(m, pl, &r);
    ck_assert_msg(r.feasible, "%s", r.viol_msg);
    ck_assert_uint_eq(r.time_ns, 4300);
    ooc_sim_result_free(&r);
    ooc_plan_free(pl);
    ooc_model_free(m);
    ooc_profile_free(p);
}
END_TEST

/* By hand, recomputable: dropping A and re-running op 0 (100 ns) before op 3 costs 100 ns of
 * compute after the cut: 400 + 100 = 500 ns, which the recompute plan achieves. */
START_TEST(test_bound_by_hand_recompute) {
    ooc_profile_t *p = tiny_fast(1);
    ooc_model_t *m;
    ck_assert_int_eq(ooc_model_build(p, p->chunk_bytes, &m), 0);
    ooc_bound_t b;
    ck_assert_int_eq(ooc_model_bound(m, 1024, &b), 0);
    ck_assert_uint_le(b.bound_ns, 500);
    ck_assert_uint_ge(b.bound_ns, 499);
    int32_t via = 0;
    ooc_plan_t *pl = ooc_plan_new("t", 4, 2, 1024, 1 << 16);
    ooc_plan_add(pl, 0, OOC_AFTER, OOC_ACT_DROP, 0, NULL, 0);
    ooc_plan_add(pl, 3, OOC_BEFORE, OOC_ACT_RECOMPUTE, 0, &via, 1);
    ooc_plan_finalize(pl);
    ooc_sim_result_t r;
    run_checked(m, pl, &r);
    ck_assert_msg(r.feasible, "%s", r.viol_msg);
    ck_assert_uint_eq(r.time_ns, 500);
    ooc_sim_result_free(&r);
    ooc_plan_free(pl);
    /* auto finds that plan */
    char err[256] = "";
    ooc_policy_opts_t o = {.budget_bytes = 1024};
    ck_assert_int_eq(ooc_policy_plan(m, "auto", &o, &pl, err, sizeof err), 0);
    run_checked(m, pl, &r);
    ck_assert_msg(r.feasible, "%s", r.viol_msg);
    ck_assert_uint_eq(r.time_ns, 500);
    ooc_sim_result_free(&r);
    ooc_plan_free(pl);
    ooc_model_free(m);
    ooc_profile_free(p);
}
END_TEST

/* By hand, a rebuild's input: X (1000 bytes, 1 byte/ns, not recomputable) is written by op 0 and
 * read by op 1, which writes B (1000 bytes, rebuilt by op 1, 1 ns) and op 5; B is read by op 3;
 * ops 2 and 4 each fill the 2048-byte budget with a buffer of their own. X leaves after op 1
 * (1000 ns) and B is dropped; op 3 needs B: copied in, or rebuilt from X, which must be copied in
 * for it and leave again for op 4 (free: it is clean), then come back for op 5. Either way a
 * 1000-ns copy-in runs between the end of op 2 and the start of op 3, and X's own copy-in after
 * op 4: 101 + 1000 + 100 + 1000 + (1) + 100 + 100 + 1000 + 100 = 3502 ns with the rebuild, 3501
 * from the bound (the rebuild's 1 ns is not in it). Without the rebuild's inputs the bound saw
 * 2502 ns (a rebuild for 1 ns in place of the copy before op 3). */
START_TEST(test_bound_by_hand_rebuild_input) {
    ooc_profile_t *p = ooc_profile_new();
    p->chunk_bytes = 1 << 16;
    p->h2d_bps = p->d2h_bps = 1e9;
    p->bidir_bps = 2e9;
    int32_t via = 1;
    ck_assert_int_eq(ooc_profile_add_buffer(p, 1000, 0, 5, 0, "X", NULL, 0), 0);
    ck_assert_int_eq(ooc_profile_add_buffer(p, 1000, 1, 3, 0, "B", &via, 1), 1);
    ck_assert_int_eq(ooc_profile_add_buffer(p, 2000, 2, 2, 0, "C", NULL, 0), 2);
    ck_assert_int_eq(ooc_profile_add_buffer(p, 2000, 4, 4, 0, "D", NULL, 0), 3);
    ooc_ref_t r0 = {0, OOC_ACCESS_W, 0}, r1[2] = {{0, OOC_ACCESS_R, 0}, {1, OOC_ACCESS_W, 0}},
              r2 = {2, OOC_ACCESS_W, 0}, r3 = {1, OOC_ACCESS_R, 0}, r4 = {3, OOC_ACCESS_W, 0},
              r5 = {0, OOC_ACCESS_R, 0};
    ooc_profile_add_op(p, 0, OOC_KIND_KERNEL, "k0", NULL, 100, &r0, 1);
    ooc_profile_add_op(p, 0, OOC_KIND_KERNEL, "k1", NULL, 1, r1, 2);
    ooc_profile_add_op(p, 0, OOC_KIND_KERNEL, "k2", NULL, 100, &r2, 1);
    ooc_profile_add_op(p, 0, OOC_KIND_KERNEL, "k3", NULL, 100, &r3, 1);
    ooc_profile_add_op(p, 0, OOC_KIND_KERNEL, "k4", NULL, 100, &r4, 1);
    ooc_profile_add_op(p, 0, OOC_KIND_KERNEL, "k5", NULL, 100, &r5, 1);
    char err[256] = "";
    ck_assert_msg(ooc_profile_validate(p, err, sizeof err) == 0, "%s", err);
    ooc_model_t *m;
    ck_assert_int_eq(ooc_model_build(p, p->chunk_bytes, &m), 0);
    ck_assert(m->recomp[1]);
    ooc_bound_t b;
    ck_assert_int_eq(ooc_model_bound(m, 2048, &b), 0);
    ck_assert_uint_le(b.bound_ns, 3501);
    ck_assert_uint_ge(b.bound_ns, 3500);
    ooc_plan_t *pl = ooc_plan_new("t", 6, 4, 2048, 1 << 16);
    ooc_plan_add(pl, 1, OOC_AFTER, OOC_ACT_SWAPOUT, 0, NULL, 0);
    ooc_plan_add(pl, 1, OOC_AFTER, OOC_ACT_DROP, 1, NULL, 0);
    ooc_plan_add(pl, 3, OOC_BEFORE, OOC_ACT_SWAPIN, 0, NULL, 0);
    ooc_plan_add(pl, 3, OOC_BEFORE, OOC_ACT_WAIT, 0, NULL, 0);
    ooc_plan_add(pl, 3, OOC_BEFORE, OOC_ACT_RECOMPUTE, 1, &via, 1);
    ooc_plan_add(pl, 3, OOC_AFTER, OOC_ACT_SWAPOUT, 0, NULL, 0);
    ooc_plan_add(pl, 5, OOC_BEFORE, OOC_ACT_SWAPIN, 0, NULL, 0);
    ooc_plan_add(pl, 5, OOC_BEFORE, OOC_ACT_WAIT, 0, NULL, 0);
    ooc_plan_finalize(pl);
    ooc_sim_result_t r;
    run_checked(m, pl, &r);
    ck_assert_msg(r.feasible, "%s", r.viol_msg);
    ck_assert_uint_eq(r.time_ns, 3502);
    ooc_sim_result_free(&r);
    ooc_plan_free(pl);
    ooc_model_free(m);
    ooc_profile_free(p);
}
END_TEST

/* A dead buffer (no later use) cannot be dropped: only a buffer rebuilt later may leave without a
 * copy (the bound relies on it). */
START_TEST(test_drop_of_a_dead_buffer_is_reported) {
    ooc_profile_t *p = tiny();
    ooc_model_t *m;
    ck_assert_int_eq(ooc_model_build(p, p->chunk_bytes, &m), 0);
    ooc_plan_t *pl = ooc_plan_new("t", 4, 2, 1 << 20, 1 << 16);
    ooc_plan_add(pl, 2, OOC_AFTER, OOC_ACT_DROP, 1, NULL, 0); /* B, last used by op 2 */
    ooc_plan_finalize(pl);
    ooc_sim_result_t r;
    ck_assert_int_eq(ooc_sim_run(m, pl, NULL, &r), 0);
    ck_assert(!r.feasible);
    ck_assert_int_eq(r.viol_buf, 1);
    ck_assert_msg(strstr(r.viol_msg, "no later use"), "%s", r.viol_msg);
    ooc_plan_free(pl);
    ooc_model_free(m);
    ooc_profile_free(p);
}
END_TEST

/* A copy from the host is never a producer (the shim re-launches only kernels and library calls),
 * even when the profile lists it. */
START_TEST(test_memcpy_is_never_a_producer) {
    ooc_profile_t *p = tiny();
    p->ops[0].kind = OOC_KIND_MEMCPY;
    ooc_model_t *m;
    ck_assert_int_eq(ooc_model_build(p, p->chunk_bytes, &m), 0);
    ck_assert_int_eq(m->recomp[0], 0);
    ooc_model_free(m);
    p->ops[0].kind = OOC_KIND_CUDNN;
    ck_assert_int_eq(ooc_model_build(p, p->chunk_bytes, &m), 0);
    ck_assert_int_eq(m->recomp[0], 1);
    ooc_model_free(m);
    ooc_profile_free(p);
}
END_TEST

/* FORMAT.md's waits: exactly one wait after each swap-in whose buffer is used again in the
 * iteration, before that use; none without a swap-in to wait for. */
static void check_waits(const ooc_model_t *m, const ooc_plan_t *pl, const char *what) {
    int32_t *pending = malloc((pl->nbufs ? pl->nbufs : 1) * sizeof *pending);
    for (uint32_t b = 0; b < pl->nbufs; b++)
        pending[b] = -1;
    for (uint32_t i = 0; i < pl->nacts; i++) {
        const ooc_action_t *a = &pl->acts[i];
        if (a->kind == OOC_ACT_SWAPIN)
            pending[a->buf] = a->op;
        if (a->kind != OOC_ACT_WAIT)
            continue;
        ck_assert_msg(pending[a->buf] >= 0,
                      "%s %s: a wait for buffer %d before op %d without a swap-in", what,
                      pl->policy, a->buf, a->op);
        uint32_t nu = ooc_model_next_use(m, a->buf, pending[a->buf]);
        int32_t use = nu < m->nuse[a->buf] ? m->uses[m->use_off[a->buf] + nu] : -1;
        ck_assert_msg(use < 0 || a->op <= use,
                      "%s %s: buffer %d used by op %d before its wait at %d", what, pl->policy,
                      a->buf, use, a->op);
        pending[a->buf] = -1;
    }
    /* what is still pending may only be a swap-in for the next iteration */
    for (uint32_t b = 0; b < pl->nbufs; b++)
        if (pending[b] >= 0)
            ck_assert_msg(ooc_model_next_use(m, (int32_t)b, pending[b]) == m->nuse[b],
                          "%s %s: buffer %u swapped in before op %d and used with no wait", what,
                          pl->policy, b, pending[b]);
    free(pending);
}

/* Plans the model with every policy, checks each plan's trace, and checks that auto is at
 * least as fast as every other policy. Returns the number of feasible policies. */
static int check_all_policies(const ooc_model_t *m, uint64_t budget, const char *what) {
    uint64_t best_other = UINT64_MAX, auto_t = UINT64_MAX;
    int feasible = 0, infeasible_rc = 0;
    uint64_t bound = ooc_model_bound_ns(m, budget, NULL);
    for (int i = 0; ooc_policy_names[i]; i++) {
        char err[512] = "";
        ooc_policy_opts_t o = {.budget_bytes = budget};
        ooc_plan_t *pl = NULL;
        int rc = ooc_policy_plan(m, ooc_policy_names[i], &o, &pl, err, sizeof err);
        if (rc == OOC_EINFEASIBLE) {
            ck_assert_msg(strstr(err, "infeasible: op "), "%s", err);
            infeasible_rc++;
            continue;
        }
        ck_assert_msg(rc == 0, "%s %s: %s", what, ooc_policy_names[i], err);
        check_waits(m, pl, what);
        ooc_sim_result_t r;
        run_checked(m, pl, &r);
        /* a plan may run out of memory, but must never break a rule */
        ck_assert_msg(r.feasible || r.viol_code == OOC_EINFEASIBLE, "%s %s: %s", what,
                      ooc_policy_names[i], r.viol_msg);
        uint64_t t = r.feasible ? r.time_ns : UINT64_MAX;
        /* no plan beats the lower bound */
        ck_assert_msg(!r.feasible || r.time_ns >= bound, "%s %s: %llu ns, below the bound %llu ns",
                      what, ooc_policy_names[i], (unsigned long long)r.time_ns,
                      (unsigned long long)bound);
        if (strcmp(ooc_policy_names[i], "auto") == 0)
            auto_t = t;
        else if (t < best_other)
            best_other = t;
        feasible += r.feasible;
        ooc_sim_result_free(&r);
        ooc_plan_free(pl);
    }
    int npol = 0;
    while (ooc_policy_names[npol])
        npol++;
    ck_assert(infeasible_rc == 0 || infeasible_rc == npol);
    ck_assert_msg(auto_t <= best_other, "%s: auto %llu ns, another policy %llu ns", what,
                  (unsigned long long)auto_t, (unsigned long long)best_other);
    return feasible;
}

static char refs[64][300];
static int nrefs;

static void list_dir(const char *root) {
    DIR *d = opendir(root);
    struct dirent *e;
    int first = nrefs;
    while (d && (e = readdir(d)) && nrefs < 64)
        if (e->d_name[0] != '.')
            snprintf(refs[nrefs++], sizeof refs[0], "%s/%s", root, e->d_name);
    if (d)
        closedir(d);
    qsort(refs + first, (size_t)(nrefs - first), sizeof refs[0],
          (int (*)(const void *, const void *))strcmp);
}

static void list_refs(void) {
    nrefs = 0;
    list_dir("profiles/synthetic");
    list_dir("profiles/recorded");
}

/* Every reference profile at its own budget and at 1/2, 1/4 and 1/8 of its in-core peak (where
 * the largest op still fits): every plan valid and not below the bound, auto never slower. */
START_TEST(test_reference_profiles_keep_invariants_and_auto_is_best) {
    char err[512] = "";
    ooc_profile_t *p;
    ck_assert_msg(ooc_profile_read(refs[_i], &p, err, sizeof err) == 0, "%s", err);
    ooc_model_t *m;
    ck_assert_int_eq(ooc_model_build(p, p->chunk_bytes, &m), 0);
    ooc_plan_t *keep = ooc_plan_new("keep", m->n, m->nb, UINT64_MAX / 2, m->chunk_bytes);
    ooc_plan_finalize(keep);
    ooc_sim_result_t r;
    ck_assert_int_eq(ooc_sim_run(m, keep, NULL, &r), 0);
    ck_assert(r.feasible);
    uint64_t peak = r.peak_bytes, in_core = r.time_ns;
    ooc_sim_result_free(&r);
    ooc_plan_free(keep);
    /* When the iteration fits, auto keeps everything and copies nothing (the model overlaps
     * copies perfectly, so swapping everything ties on time; on a GPU it does not). */
    ooc_policy_opts_t o = {.budget_bytes = peak};
    ooc_plan_t *pl;
    ck_assert_int_eq(ooc_policy_plan(m, "auto", &o, &pl, err, sizeof err), 0);
    run_checked(m, pl, &r);
    ck_assert_msg(r.feasible && r.time_ns == in_core && r.h2d_bytes + r.d2h_bytes == 0,
                  "%s at its in-core peak: auto takes %llu ns (in core %llu), copies %llu bytes",
                  refs[_i], (unsigned long long)r.time_ns, (unsigned long long)in_core,
                  (unsigned long long)(r.h2d_bytes + r.d2h_bytes));
    ooc_sim_result_free(&r);
    ooc_plan_free(pl);
    uint64_t budgets[4] = {p->budget_bytes, peak / 2, peak / 4, peak / 8};
    for (int k = 0; k < 4; k++) {
        if (k > 0 && ooc_model_check_budget(m, budgets[k], NULL, NULL, 0))
            continue;
        char what[400];
        snprintf(what, sizeof what, "%s at %llu bytes", refs[_i], (unsigned long long)budgets[k]);
        check_all_policies(m, budgets[k], what);
    }
    ooc_model_free(m);
    ooc_profile_free(p);
}
END_TEST

static uint64_t rnd(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* A random iteration: ops read earlier buffers and write new ones, some buffers persistent, some
 * producers verified re-executable. */
static ooc_profile_t *random_profile(uint64_t *s) {
    ooc_profile_t *p = ooc_profile_new();
    p->chunk_bytes = 1 << 20;
    p->h2d_bps = 1e9 * (double)(1 + rnd(s) % 50);
    p->d2h_bps = 1e9 * (double)(1 + rnd(s) % 50);
    p->bidir_bps = (p->h2d_bps + p->d2h_bps) * (0.6 + 0.1 * (double)(rnd(s) % 5));
    uint32_t nops = 4 + (uint32_t)(rnd(s) % 60), npers = (uint32_t)(rnd(s) % 5);
    /* buffers are created as we go; alloc/free are fixed up afterwards */
    uint64_t *size = calloc(nops + npers + 1, sizeof *size);
    int32_t *first = calloc(nops + npers + 1, sizeof *first),
            *last = calloc(nops + npers + 1, sizeof *last);
    int *pers = calloc(nops + npers + 1, sizeof *pers),
        *pure = calloc(nops + npers + 1, sizeof *pure);
    ooc_ref_t(*opr)[6] = calloc(nops, sizeof *opr);
    uint32_t *nr = calloc(nops, sizeof *nr);
    uint32_t nb = 0;
    for (uint32_t i = 0; i < npers; i++) {
        size[nb] = 1 + rnd(s) % (3u << 20);
        pers[nb] = 1;
        first[nb] = -1;
        nb++;
    }
    for (uint32_t i = 0; i < nops; i++) {
        uint32_t nin = nb ? (uint32_t)(rnd(s) % 4) : 0;
        for (uint32_t k = 0; k < nin; k++) {
            int32_t b = (int32_t)(rnd(s) % nb);
            int dup = 0;
            for (uint32_t j = 0; j < nr[i]; j++)
                dup |= opr[i][j].buf == b;
            if (dup)
                continue;
            uint8_t acc = rnd(s) % 6 == 0 ? OOC_ACCESS_RW : OOC_ACCESS_R;
            opr[i][nr[i]++] = (ooc_ref_t){b, acc, 0};
            if (first[b] < 0 && !pers[b])
                first[b] = (int32_t)i;
            last[b] = (int32_t)i;
        }
        if (rnd(s) % 4 != 0 || nb == 0) {
            size[nb] = 1 + rnd(s) % (4u << 20);
            first[nb] = last[nb] = (int32_t)i;
            int only_reads = 1;
            for (uint32_t j = 0; j < nr[i]; j++)
                only_reads &= opr[i][j].access == OOC_ACCESS_R;
            pure[nb] = only_reads && rnd(s) % 2;
            opr[i][nr[i]++] = (ooc_ref_t){(int32_t)nb, OOC_ACCESS_W, 0};
            nb++;
        }
    }
    for (uint32_t b = 0; b < nb; b++) {
        int32_t prod = first[b];
        if (pers[b])
            ooc_profile_add_buffer(p, size[b], -1, -1, 1, "pers", NULL, 0);
        else
            ooc_profile_add_buffer(p, size[b], first[b], last[b], 0, "tmp", &prod, pure[b] ? 1 : 0);
    }
    for (uint32_t i = 0; i < nops; i++)
        ooc_profile_add_op(p, 0, (ooc_op_kind_t)(rnd(s) % 5), "op", NULL, 1000 + rnd(s) % 200000,
                           opr[i], nr[i]);
    free(size);
    free(first);
    free(last);
    free(pers);
    free(pure);
    free(opr);
    free(nr);
    char err[256] = "";
    ck_assert_msg(ooc_profile_validate(p, err, sizeof err) == 0, "%s", err);
    return p;
}

/* ResNet-50 batch 64 at 1/8 of its in-core peak: every convolution output may be rebuilt from the
 * ReLU output before it, but with so little room a rebuild pays only where that input is on the
 * device anyway. The next-use walk that knows this (belady.c, pin > 0) lets auto rebuild them
 * (before it: 145.8 ms, no schedule that rebuilt ran without deadlock; 129.2 ms with it, 1.29x
 * the bound with its windows, forced gaps, shortfall and the copy engines' forced work); the plan
 * stays valid under the independent checker. */
START_TEST(test_auto_rebuilds_where_the_inputs_are_resident) {
    char err[512] = "";
    ooc_profile_t *p;
    ck_assert_msg(ooc_profile_read("profiles/synthetic/resnet50-batch64", &p, err, sizeof err) == 0,
                  "%s", err);
    ooc_model_t *m;
    ck_assert_int_eq(ooc_model_build(p, p->chunk_bytes, &m), 0);
    ooc_plan_t *keep = ooc_plan_new("keep", m->n, m->nb, UINT64_MAX / 2, m->chunk_bytes);
    ooc_plan_finalize(keep);
    ooc_sim_result_t r;
    ck_assert_int_eq(ooc_sim_run(m, keep, NULL, &r), 0);
    uint64_t budget = r.peak_bytes / 8;
    ooc_sim_result_free(&r);
    ooc_plan_free(keep);
    ooc_policy_opts_t o = {.budget_bytes = budget};
    ooc_plan_t *pl;
    ck_assert_int_eq(ooc_policy_plan(m, "auto", &o, &pl, err, sizeof err), 0);
    run_checked(m, pl, &r);
    ck_assert_msg(r.feasible, "%s", r.viol_msg);
    uint64_t bound = ooc_model_bound_ns(m, budget, NULL);
    ck_assert_uint_ge(r.n_recompute, 40);
    ck_assert_msg((double)r.time_ns < 1.45 * (double)bound, "auto %llu ns, bound %llu ns",
                  (unsigned long long)r.time_ns, (unsigned long long)bound);
    ooc_sim_result_free(&r);
    ooc_plan_free(pl);
    ooc_model_free(m);
    ooc_profile_free(p);
}
END_TEST

START_TEST(test_random_profiles_keep_invariants) {
    uint64_t seed = tu_seed("test_random_profiles_keep_invariants");
    uint64_t s = seed | 1;
    for (int iter = 0; iter < 150; iter++) {
        ooc_profile_t *p = random_profile(&s);
        p->swapin_exclusive = (iter / 3) % 2; /* safe mode without staging, every other three */
        p->remap_gate = (iter / 6) % 2;       /* safe mode behind gates, every other six */
        p->swapout_exclusive = p->remap_gate;
        ooc_model_t *m;
        ck_assert_int_eq(ooc_model_build(p, p->chunk_bytes, &m), 0);
        uint64_t maxws = 0, total = 0;
        for (uint32_t i = 0; i < m->n; i++) {
            if (m->ws[i] > maxws)
                maxws = m->ws[i];
            total += m->ws[i];
        }
        uint64_t budget = maxws + rnd(&s) % (total + 1);
        if (iter % 10 == 0)
            budget = maxws - 1; /* below the largest op: infeasible, op named */
        char what[64];
        snprintf(what, sizeof what, "seed %llu iteration %d", (unsigned long long)seed, iter);
        check_all_policies(m, budget, what);
        ooc_model_free(m);
        ooc_profile_free(p);
    }
}
END_TEST

/* The exact optimum as an oracle (test/milp_oracle.py: a MILP of keep/swap with transfer timing on
 * profiles coarsened to 16 stages, solved by HiGHS through python3-scipy): auto within 5% of
 * every optimum the solver proves in 10 s, the lower bound never above one, and at least three
 * proved. */
START_TEST(test_auto_near_the_milp_optimum) {
    const char *argv[] = {"/usr/bin/python3",
                          "test/milp_oracle.py",
                          "--stages",
                          "16",
                          "--fractions",
                          "0.75,0.9",
                          "--time-limit",
                          "10",
                          "--min-proved",
                          "3",
                          "--ooc-plan",
                          tu_build_path("ooc-plan"),
                          "profiles/recorded/cnn",
                          "profiles/recorded/large",
                          "profiles/recorded/mlp",
                          "profiles/synthetic/gpt2-seq1024",
                          "profiles/synthetic/resnet50-batch128",
                          "profiles/synthetic/unet-batch16",
                          NULL};
    tu_proc_t p;
    ck_assert_int_eq(tu_run(argv, NULL, 800, &p), 0);
    printf("%s", p.out);
    ck_assert_msg(!strstr(p.err, "No module named"),
                  "python3-scipy is missing (scripts/install-deps installs it): %s", p.err);
    ck_assert_msg(p.status == 0, "%s%s", p.out, p.err);
    tu_proc_free(&p);
}
END_TEST

/* SuperNeurons' checkpoints follow the ops' kinds and names: convolutions, GEMMs and backend
 * executions that convolve are heavy; batch norm, activation, pooling and pointwise-only graphs
 * are not. */
START_TEST(test_heavy_ops_follow_kinds_and_names) {
    static const struct {
        ooc_op_kind_t kind;
        const char *name;
        int heavy;
    } ops[] = {
        {OOC_KIND_CUDNN, "cudnnConvolutionForward", 1},
        {OOC_KIND_CUDNN, "cudnnConvolutionBackwardFilter", 1},
        {OOC_KIND_CUDNN, "cudnnBatchNormalizationForwardTraining", 0},
        {OOC_KIND_CUDNN, "cudnnActivationForward", 0},
        {OOC_KIND_CUDNN, "cudnnPoolingBackward", 0},
        {OOC_KIND_CUDNN, "cudnnBackendExecute:conv_fwd+pointwise", 1},
        {OOC_KIND_CUDNN, "conv2d_fwd", 1}, /* the synthetic profiles' names */
        {OOC_KIND_CUDNN, "cudnnBackendExecute:matmul", 1},
        {OOC_KIND_CUDNN, "cudnnBackendExecute:pointwise+pointwise", 0},
        {OOC_KIND_CUDNN, "cudnnBackendExecute:norm_fwd", 0},
        {OOC_KIND_CUDNN, "cudnnBackendExecute", 1},
        {OOC_KIND_CUBLAS, "cublasGemmEx", 1},
        {OOC_KIND_CUBLAS, "cublasLtMatmul", 1},
        {OOC_KIND_KERNEL, "conv2d_fwd", 1},
        {OOC_KIND_KERNEL, "relu_f32", 0},
    };
    size_t n = sizeof ops / sizeof ops[0];
    ooc_profile_t *p = ooc_profile_new();
    p->chunk_bytes = 1 << 16;
    p->h2d_bps = p->d2h_bps = 1e9;
    p->bidir_bps = 2e9;
    ck_assert_int_eq(ooc_profile_add_buffer(p, 1000, 0, (int64_t)n - 1, 0, "A", NULL, 0), 0);
    ooc_ref_t r = {0, OOC_ACCESS_RW, 0};
    for (size_t i = 0; i < n; i++)
        ooc_profile_add_op(p, 0, ops[i].kind, ops[i].name, NULL, 1000, &r, 1);
    ck_assert_int_eq(ooc_profile_validate(p, NULL, 0), 0);
    ooc_model_t *m;
    ck_assert_int_eq(ooc_model_build(p, p->chunk_bytes, &m), 0);
    for (size_t i = 0; i < n; i++)
        ck_assert_msg(m->heavy[i] == ops[i].heavy, "%s: heavy %d, expected %d", ops[i].name,
                      m->heavy[i], ops[i].heavy);
    ooc_model_free(m);
    ooc_profile_free(p);
}
END_TEST

Suite *suite_planner_sim(void) {
    Suite *s = suite_create("planner_sim");
    TCase *tc = tcase_create("sim");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, test_heavy_ops_follow_kinds_and_names);
    tcase_add_test(tc, test_swap_overlaps_compute_exactly);
    tcase_add_test(tc, test_exclusive_swap_in_runs_alone);
    tcase_add_test(tc, test_a_gated_swap_in_takes_its_memory_at_its_point);
    tcase_add_test(tc, test_a_gated_swap_in_behind_one_waiting_for_memory_takes_none);
    tcase_add_test(tc, test_mapping_calls_take_the_worker_in_turn);
    tcase_add_test(tc, test_the_programs_thread_issues_each_op);
    tcase_add_test(tc, test_memory_waits_for_released_chunks);
    tcase_add_test(tc, test_broken_plans_are_reported);
    tcase_add_test(tc, test_recompute_relaunches_producer);
    tcase_add_test(tc, test_buffer_written_after_its_producer_is_not_recomputable);
    tcase_add_test(tc, test_budget_below_an_op_is_infeasible_naming_it);
    tcase_add_test(tc, test_dead_buffers_freed_later_are_swapped_out);
    tcase_add_test(tc, test_bound_by_hand_transfers);
    tcase_add_test(tc, test_bound_by_hand_recompute);
    tcase_add_test(tc, test_bound_by_hand_copy_engine);
    tcase_add_test(tc, test_bound_by_hand_rebuild_input);
    tcase_add_test(tc, test_drop_of_a_dead_buffer_is_reported);
    tcase_add_test(tc, test_memcpy_is_never_a_producer);
    tcase_add_test(tc, test_auto_rebuilds_where_the_inputs_are_resident);
    suite_add_tcase(s, tc);
    TCase *tp = tcase_create("policies");
    tcase_set_timeout(tp, 600);
    list_refs();
    tcase_add_loop_test(tp, test_reference_profiles_keep_invariants_and_auto_is_best, 0, nrefs);
    tcase_add_test(tp, test_random_profiles_keep_invariants);
    suite_add_tcase(s, tp);
    TCase *to = tcase_create("oracle");
    tcase_set_timeout(to, 900);
    tcase_add_test(to, test_auto_near_the_milp_optimum);
    suite_add_tcase(s, to);
    return s;
}
