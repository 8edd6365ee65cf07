/* SPDX-License-Identifier: MIT */
/* replay_plan.c: where the replay's plan comes from. OOC_MODE=auto: the recorder's profile is
 * planned under the budget the memory layer leaves (ooc_replay_plan, which writes plan.tsv beside
 * the profile); OOC_PLAN: a saved plan and the profile it belongs to are read back and checked
 * against the shim's chunk size and budget (ooc_replay_load). Either way the plan is simulated
 * once and its summary logged, then handed to replay.c (ooc_replay_go), which follows it. */

#include "shim.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Simulates plan pl on profile p and logs its summary line ("plan (auto) in ...: keep ..."). 0,
 * or -1 when the simulator finds that the plan cannot run (logged). A saved plan (`saved`) is
 * replayed even then, with a warning: residency stays demand-checked, so it can cost time but
 * not data. */
static int summarize(const ooc_profile_t *p, const ooc_plan_t *pl, const char *where, int saved) {
    ooc_model_t *m = NULL;
    if (ooc_model_build(p, pl->chunk_bytes, &m) != 0) {
        OOC_LOG_E("no replay: out of memory while planning");
        return -1;
    }
    ooc_sim_result_t res;
    memset(&res, 0, sizeof res);
    int rc = ooc_sim_run(m, pl, NULL, &res);
    if (rc == 0 && !res.feasible && saved) {
        OOC_LOG_W("the saved plan %s does not hold in simulation (%s); replaying it anyway: every "
                  "op's buffers are still made resident before it runs",
                  where, res.viol_msg);
    } else if (rc != 0 || !res.feasible) {
        OOC_LOG_W("no replay: the %s plan cannot run under a budget of %llu bytes (%s); the shim "
                  "stays in demand mode",
                  pl->policy, (unsigned long long)pl->budget_bytes,
                  rc ? "out of memory" : res.viol_msg);
        ooc_sim_result_free(&res);
        ooc_model_free(m);
        return -1;
    }
    ooc_log_banner("plan (%s) %s, for a budget of %.1f MiB: keep %u, swap %u, recompute %u "
                   "buffers; predicted %.3f ms per iteration, %.3fx the in-core %.3f ms, %.1f "
                   "MiB each way; replaying",
                   pl->policy, where, (double)pl->budget_bytes / 1048576.0, res.n_keep, res.n_swap,
                   res.n_recompute, (double)res.time_ns / 1e6,
                   m->compute_ns ? (double)res.time_ns / (double)m->compute_ns : 0.0,
                   (double)m->compute_ns / 1e6, (double)res.h2d_bytes / 1048576.0);
    ooc_sim_result_free(&res);
    ooc_model_free(m);
    return 0;
}

void ooc_replay_plan(ooc_profile_t *p, const char *dir, uint32_t pos) {
    uint64_t chunk, budget;
    ooc_mem_geometry(&chunk, &budget);
    /* Slab chunks hold the small buffers of every iteration at once, and the shim keeps one
     * chunk of slack: the plan gets the rest. */
    uint64_t reserve = (ooc_mem_slab_chunks() + 1) * chunk;
    uint64_t plan_budget = budget > reserve + chunk ? budget - reserve : chunk;
    const ooc_options_t *o = ooc_opts();
    ooc_policy_opts_t po;
    memset(&po, 0, sizeof po);
    po.budget_bytes = plan_budget;
    po.window_bytes = o->window.kind == OOC_SIZE_BYTES ? o->window.bytes : 0;
    ooc_model_t *m = NULL;
    ooc_plan_t *pl = NULL;
    char err[256] = "";
    int rc = ooc_model_build(p, chunk, &m);
    if (rc == 0)
        rc = ooc_policy_plan(m, ooc_policy_name(o->policy), &po, &pl, err, sizeof err);
    ooc_model_free(m);
    if (rc != 0) {
        OOC_LOG_W("no replay: no %s plan under a budget of %llu bytes: %s; the shim stays in "
                  "demand mode",
                  ooc_policy_name(o->policy), (unsigned long long)plan_budget,
                  err[0] ? err : "out of memory");
        ooc_profile_free(p);
        return;
    }
    char path[OOC_PATH_MAX + 16], where[OOC_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/plan.tsv", dir);
    if (ooc_plan_write_file(pl, path, err, sizeof err) != 0) {
        OOC_LOG_W("the plan could not be written: %s", err);
        snprintf(where, sizeof where, "(not written)");
    } else {
        snprintf(where, sizeof where, "in %s", path);
    }
    if (summarize(p, pl, where, 0) != 0) {
        ooc_profile_free(p);
        ooc_plan_free(pl);
        return;
    }
    ooc_replay_go(p, pl, pos);
}

int ooc_replay_load(const char *plan_path) {
    char dir[OOC_PATH_MAX], err[512];
    snprintf(dir, sizeof dir, "%s", plan_path);
    char *slash = strrchr(dir, '/');
    if (slash)
        *slash = 0;
    else
        snprintf(dir, sizeof dir, ".");
    ooc_profile_t *p = NULL;
    ooc_plan_t *pl = NULL;
    if (ooc_profile_read(dir, &p, err, sizeof err) != 0) {
        OOC_LOG_E("OOC_PLAN=%s: the profile the plan belongs to (in %s) cannot be read: %s",
                  plan_path, dir, err);
        return -1;
    }
    if (ooc_plan_read_file(plan_path, &pl, err, sizeof err) != 0) {
        OOC_LOG_E("OOC_PLAN=%s: %s", plan_path, err);
        ooc_profile_free(p);
        return -1;
    }
    uint64_t chunk, budget;
    ooc_mem_geometry(&chunk, &budget);
    const char *bad = NULL;
    char why[256];
    if (pl->nops != p->nops || pl->nbufs != p->nbufs) {
        snprintf(why, sizeof why, "the plan has %u ops and %u buffers, its profile %u and %u",
                 pl->nops, pl->nbufs, p->nops, p->nbufs);
        bad = why;
    } else if (pl->chunk_bytes != chunk) {
        char pc[32];
        snprintf(why, sizeof why,
                 "the plan is for chunks of %llu bytes; the shim's are %llu (set OOC_CHUNK=%s, as "
                 "when it was made)",
                 (unsigned long long)pl->chunk_bytes, (unsigned long long)chunk,
                 ooc_options_fmt_size(pl->chunk_bytes, pc, sizeof pc));
        bad = why;
    }
    if (bad) {
        OOC_LOG_E("OOC_PLAN=%s: %s", plan_path, bad);
        ooc_profile_free(p);
        ooc_plan_free(pl);
        return -1;
    }
    if (pl->budget_bytes > budget)
        OOC_LOG_W("OOC_PLAN=%s was made for a budget of %llu bytes, more than the %llu in force: "
                  "expect swaps on demand",
                  plan_path, (unsigned long long)pl->budget_bytes, (unsigned long long)budget);
    char where[OOC_PATH_MAX + 16];
    snprintf(where, sizeof where, "from %s", plan_path);
    if (summarize(p, pl, where, 1) != 0) {
        ooc_profile_free(p);
        ooc_plan_free(pl);
        return -1;
    }
    ooc_replay_go(p, pl, 0);
    return 0;
}
