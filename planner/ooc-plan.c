/* SPDX-License-Identifier: MIT */
/* ooc-plan.c: the command that plans a recorded (or synthetic) profile offline and prints what
 * each policy would achieve.
 *
 *     ooc-plan [--policy P|all] [--budget B] [--window W] [--chunk C] [--out FILE|none]
 *              [--timeline FILE] [--trace-json FILE] DIR
 *     ooc-plan --plan PLAN [--timeline FILE] [--trace-json FILE] DIR
 *     ooc-plan --incore [--budget B] [--chunk C] [--timeline FILE] [--trace-json FILE] DIR
 *
 * It reads DIR (profiles/FORMAT.md), plans with one policy (default auto) or all of them,
 * simulates every plan, writes the chosen plan (the named policy's, or auto's with `all`) to
 * FILE (default DIR/plan.tsv) and prints one table row per policy. With --plan it simulates a
 * saved plan instead (its budget, chunk size and policy come from the plan), and with --incore
 * it plans nothing and describes the iteration without the shim. --timeline and --trace-json
 * export the chosen plan's simulated timeline (or the in-core one) as a TSV for scripts and a
 * Chrome trace for people (FORMAT.md, "A timeline" and "trace.json in detail"). Exit status: 0
 * when the chosen plan is feasible (always with --incore), 1 when it is not or the profile or
 * plan is unusable or an export fails, 2 for bad arguments. */
#include "ooc_planner.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void usage(FILE *f) {
    fprintf(f,
            "usage: ooc-plan [--policy P|all] [--budget B] [--window W] [--chunk C]\n"
            "                [--out FILE|none] [--timeline FILE] [--trace-json FILE] PROFILE_DIR\n"
            "       ooc-plan --plan PLAN [--timeline FILE] [--trace-json FILE] PROFILE_DIR\n"
            "       ooc-plan --incore [--budget B] [--chunk C] [--timeline FILE]\n"
            "                [--trace-json FILE] PROFILE_DIR\n"
            "  P: swapall, lms, superneurons, window, pooch, belady, auto (default)\n"
            "  B, W, C: bytes, with an optional K, M, G or T suffix (powers of 1024);\n"
            "           B defaults to the profile's budget_bytes, W to tuning by simulation,\n"
            "           C to the profile's chunk_bytes\n"
            "  --out FILE: where the plan goes (default PROFILE_DIR/plan.tsv; 'none': nowhere)\n"
            "  --plan PLAN: simulate this saved plan instead of planning (budget, chunk and\n"
            "           policy come from the plan; nothing is written but the exports)\n"
            "  --incore: plan nothing; the exports describe the iteration without the shim\n"
            "           (the profile's ops back to back, every buffer resident)\n"
            "  --timeline FILE: the simulated timeline of the chosen plan, as a TSV\n"
            "  --trace-json FILE: the same as a Chrome trace (chrome://tracing, Perfetto)\n");
}

/* Parses "123", "8G", "512M": bytes. Returns 0 or -1. */
static int parse_size(const char *s, uint64_t *out) {
    char *e;
    if (!*s || *s == '-' || *s == '+')
        return -1;
    errno = 0;
    double v = strtod(s, &e);
    if (errno || e == s || v < 0)
        return -1;
    double mul = 1;
    if (*e) {
        switch (*e) {
        case 'k':
        case 'K':
            mul = 1024.0;
            break;
        case 'm':
        case 'M':
            mul = 1024.0 * 1024;
            break;
        case 'g':
        case 'G':
            mul = 1024.0 * 1024 * 1024;
            break;
        case 't':
        case 'T':
            mul = 1024.0 * 1024 * 1024 * 1024;
            break;
        default:
            return -1;
        }
        e++;
        if (*e == 'i' && e[1] == 'B')
            e += 2;
        else if (*e == 'B')
            e++;
        if (*e)
            return -1;
    }
    v *= mul;
    if (v >= 1.8e19)
        return -1;
    *out = (uint64_t)v;
    return 0;
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* One table row: a simulated plan (dt_ms < 0: it was read, not planned). */
static void print_row(const char *name, const ooc_model_t *m, uint64_t bound,
                      const ooc_sim_result_t *r, double dt_ms) {
    char dt[32];
    if (dt_ms < 0)
        snprintf(dt, sizeof dt, "-");
    else
        snprintf(dt, sizeof dt, "%.1f", dt_ms);
    if (r->feasible)
        printf("%-13s %11.3f %9.3f %8.3f %9.2f %9.2f %9.2f %6u %6u %6u %9s\n", name,
               (double)r->time_ns / 1e6, (double)r->time_ns / (double)m->compute_ns,
               (double)r->time_ns / (double)bound, (double)r->peak_bytes / (1u << 30),
               (double)r->h2d_bytes / 1e9, (double)r->d2h_bytes / 1e9, r->n_keep, r->n_swap,
               r->n_recompute, dt);
    else if (dt_ms < 0)
        printf("%-13s %11s   %s\n", name, "x", r->viol_msg);
    else
        printf("%-13s %11s   %s (planned in %s ms)\n", name, "x", r->viol_msg, dt);
}

/* Writes the requested exports of timeline tl (either path may be NULL). Returns 0 or 1. */
static int write_exports(const ooc_profile_t *p, const ooc_timeline_t *tl, const char *tl_path,
                         const char *json_path) {
    char err[1024] = "";
    int status = 0;
    if (tl_path) {
        if (ooc_timeline_write_file(tl, tl_path, err, sizeof err)) {
            fprintf(stderr, "ooc-plan: %s\n", err);
            status = 1;
        } else {
            printf("timeline (%s) written to %s\n", tl->policy, tl_path);
        }
    }
    if (json_path) {
        if (ooc_trace_json_write_file(p, tl, json_path, err, sizeof err)) {
            fprintf(stderr, "ooc-plan: %s\n", err);
            status = 1;
        } else {
            printf("Chrome trace (%s) written to %s\n", tl->policy, json_path);
        }
    }
    return status;
}

/* Simulates plan pl again with a trace and writes its exports. Returns 0 or 1. */
static int export_plan(const ooc_profile_t *p, const ooc_model_t *m, const ooc_plan_t *pl,
                       const char *tl_path, const char *json_path) {
    if (!tl_path && !json_path)
        return 0;
    ooc_trace_t tr = {0};
    ooc_sim_opts_t o = {.trace = &tr};
    ooc_sim_result_t r;
    ooc_timeline_t tl = {0};
    char err[1024] = "";
    int status = 1;
    if (ooc_sim_run(m, pl, &o, &r)) {
        fprintf(stderr, "ooc-plan: out of memory\n");
        ooc_trace_free(&tr);
        return 1;
    }
    if (!r.feasible)
        fprintf(stderr, "ooc-plan: no timeline or trace written: the %s plan is infeasible (%s)\n",
                pl->policy, r.viol_msg);
    else if (ooc_timeline_simulated(m, pl, &tr, &tl, err, sizeof err))
        fprintf(stderr, "ooc-plan: the timeline of the %s plan: %s\n", pl->policy,
                err[0] ? err : "out of memory");
    else
        status = write_exports(p, &tl, tl_path, json_path);
    ooc_timeline_free(&tl);
    ooc_sim_result_free(&r);
    ooc_trace_free(&tr);
    return status;
}

int main(int argc, char **argv) {
    const char *policy = "auto", *dir = NULL, *outpath = NULL, *plan_in = NULL;
    const char *tl_path = NULL, *json_path = NULL;
    uint64_t budget = 0, window = 0, chunk = 0;
    int incore = 0, policy_given = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            usage(stdout);
            return 0;
        }
        if (strcmp(a, "--incore") == 0) {
            incore = 1;
            continue;
        }
        if (a[0] == '-' && a[1] == '-') {
            if (!v) {
                fprintf(stderr, "ooc-plan: %s needs a value\n", a);
                usage(stderr);
                return 2;
            }
            i++;
            if (strcmp(a, "--policy") == 0) {
                policy = v;
                policy_given = 1;
            } else if (strcmp(a, "--out") == 0) {
                outpath = v;
            } else if (strcmp(a, "--plan") == 0) {
                plan_in = v;
            } else if (strcmp(a, "--timeline") == 0) {
                tl_path = v;
            } else if (strcmp(a, "--trace-json") == 0) {
                json_path = v;
            } else if (strcmp(a, "--budget") == 0 || strcmp(a, "--window") == 0 ||
                       strcmp(a, "--chunk") == 0) {
                uint64_t x;
                if (parse_size(v, &x) || x == 0) {
                    fprintf(stderr,
                            "ooc-plan: %s '%s': expected a positive size in bytes, optionally "
                            "with a K, M, G or T suffix (for example 8G)\n",
                            a, v);
                    return 2;
                }
                if (a[2] == 'b')
                    budget = x;
                else if (a[2] == 'w')
                    window = x;
                else if (x & (x - 1)) {
                    fprintf(stderr, "ooc-plan: --chunk '%s': must be a power of two\n", v);
                    return 2;
                } else
                    chunk = x;
            } else {
                fprintf(stderr, "ooc-plan: unknown option %s\n", a);
                usage(stderr);
                return 2;
            }
        } else if (!dir) {
            dir = a;
        } else {
            fprintf(stderr, "ooc-plan: more than one profile directory ('%s', '%s')\n", dir, a);
            return 2;
        }
    }
    if (!dir) {
        usage(stderr);
        return 2;
    }
    if (plan_in && (incore || policy_given || budget || window || chunk || outpath)) {
        fprintf(stderr, "ooc-plan: --plan simulates a saved plan, which carries its budget, chunk "
                        "size and policy; drop --incore, --policy, --budget, --window, --chunk "
                        "and --out\n");
        return 2;
    }
    if (incore && (policy_given || window || outpath)) {
        fprintf(stderr, "ooc-plan: --incore plans nothing; drop --policy, --window and --out\n");
        return 2;
    }
    int all = strcmp(policy, "all") == 0;
    if (!all) {
        int ok = 0;
        for (int i = 0; ooc_policy_names[i]; i++)
            ok |= strcmp(policy, ooc_policy_names[i]) == 0;
        if (!ok) {
            fprintf(stderr,
                    "ooc-plan: --policy '%s': expected all, swapall, lms, superneurons, window, "
                    "pooch, belady or auto\n",
                    policy);
            return 2;
        }
    }
    char err[1024] = "";
    ooc_profile_t *p;
    if (ooc_profile_read(dir, &p, err, sizeof err)) {
        fprintf(stderr, "ooc-plan: %s\n", err);
        return 1;
    }
    ooc_plan_t *given = NULL;
    if (plan_in) {
        if (ooc_plan_read_file(plan_in, &given, err, sizeof err)) {
            fprintf(stderr, "ooc-plan: %s\n", err);
            ooc_profile_free(p);
            return 1;
        }
        if (given->nops != p->nops || given->nbufs != p->nbufs) {
            fprintf(stderr,
                    "ooc-plan: %s: the plan is for %u ops and %u buffers, but %s has %u ops and "
                    "%u buffers\n",
                    plan_in, given->nops, given->nbufs, dir, p->nops, p->nbufs);
            ooc_plan_free(given);
            ooc_profile_free(p);
            return 1;
        }
        budget = given->budget_bytes;
        chunk = given->chunk_bytes;
    }
    if (!budget)
        budget = p->budget_bytes ? p->budget_bytes : p->device_mem_bytes;
    if (!chunk)
        chunk = p->chunk_bytes;
    if (!budget) {
        fprintf(stderr, "ooc-plan: the profile has no budget_bytes or device_mem_bytes; give "
                        "--budget\n");
        ooc_plan_free(given);
        ooc_profile_free(p);
        return 2;
    }
    ooc_model_t *m;
    if (ooc_model_build(p, chunk, &m)) {
        fprintf(stderr, "ooc-plan: out of memory\n");
        ooc_plan_free(given);
        ooc_profile_free(p);
        return 1;
    }
    ooc_bound_t bd;
    ooc_model_bound(m, budget, &bd);
    uint64_t bound = bd.bound_ns;
    printf("profile %s: %s, %u ops, %u buffers\n", dir, p->program, p->nops, p->nbufs);
    printf("budget %.2f GiB, chunk %llu KiB, in-core time %.3f ms, lower bound %.3f ms",
           (double)budget / (1u << 30), (unsigned long long)(chunk >> 10),
           (double)m->compute_ns / 1e6, (double)bound / 1e6);
    if (bd.cut_op >= 0)
        printf(" (at op %d: %.2f GB off the device)\n", bd.cut_op, (double)bd.off_bytes / 1e9);
    else if (bound > m->compute_ns)
        printf(" (the op-to-op windows)\n");
    else
        printf(" (the compute time)\n");
    if (p->swapin_exclusive)
        printf("swap-ins run alone on the device: recorded in safe mode without staging "
               "(meta.tsv swapin_exclusive 1)\n");
    if (p->swapin_vmm_ns || p->swapout_vmm_ns)
        printf("mapping calls per chunk: %.1f us to swap in, %.1f us after a swap-out%s\n",
               (double)p->swapin_vmm_ns / 1e3, (double)p->swapout_vmm_ns / 1e3,
               p->swapout_exclusive ? ", while nothing computes (meta.tsv swapout_exclusive 1)"
                                    : "");
    if (p->remap_gate)
        printf("swap-ins take their memory at their point, behind the copies out that free it, "
               "while nothing computes: recorded in safe mode with OOC_REMAP_GATE=1 (meta.tsv "
               "remap_gate 1)\n");
    if (p->stage_vmm_ns || p->adopt_vmm_ns)
        printf("with staging (meta.tsv stage_vmm_ns, adopt_vmm_ns): %.1f us per chunk to stage "
               "a swap-in, %.1f us to move it at its first use, while nothing computes\n",
               (double)p->stage_vmm_ns / 1e3, (double)p->adopt_vmm_ns / 1e3);
    if (p->map_vmm_ns || p->unmap_vmm_ns)
        printf("the program's own mapping calls per chunk of a buffer allocated during the "
               "iteration: %.1f us before its first use, %.1f us after its free\n",
               (double)p->map_vmm_ns / 1e3, (double)p->unmap_vmm_ns / 1e3);
    int status = 1;
    if (incore) {
        ooc_timeline_t tl;
        if (ooc_timeline_incore(m, budget, &tl)) {
            fprintf(stderr, "ooc-plan: out of memory\n");
        } else {
            printf("in core: peak %.2f GiB mapped (%s the budget)\n",
                   (double)tl.peak_bytes / (1u << 30),
                   tl.peak_bytes <= budget ? "within" : "above");
            status = write_exports(p, &tl, tl_path, json_path);
        }
        ooc_timeline_free(&tl);
        ooc_model_free(m);
        ooc_profile_free(p);
        return status;
    }
    printf("%-13s %11s %9s %8s %9s %9s %9s %6s %6s %6s %9s\n", "policy", "time_ms", "x_incore",
           "x_bound", "peak_GiB", "h2d_GB", "d2h_GB", "keep", "swap", "recomp", "plan_ms");
    if (given) {
        ooc_sim_result_t r;
        if (ooc_sim_run(m, given, NULL, &r)) {
            fprintf(stderr, "ooc-plan: out of memory\n");
        } else {
            print_row(given->policy, m, bound, &r, -1);
            status = r.feasible ? 0 : 1;
            ooc_sim_result_free(&r);
            if (export_plan(p, m, given, tl_path, json_path))
                status = 1;
        }
        ooc_plan_free(given);
        ooc_model_free(m);
        ooc_profile_free(p);
        return status;
    }
    ooc_plan_t *chosen = NULL;
    for (int i = 0; ooc_policy_names[i]; i++) {
        const char *name = ooc_policy_names[i];
        if (!all && strcmp(name, policy) != 0)
            continue;
        ooc_policy_opts_t o = {.budget_bytes = budget, .window_bytes = window};
        ooc_plan_t *pl = NULL;
        double t0 = now_ms();
        int rc = ooc_policy_plan(m, name, &o, &pl, err, sizeof err);
        double dt = now_ms() - t0;
        if (rc) {
            printf("%-13s %11s   %s\n", name, "x", err);
            continue;
        }
        ooc_sim_result_t r;
        if (ooc_sim_run(m, pl, NULL, &r)) {
            fprintf(stderr, "ooc-plan: out of memory\n");
            ooc_plan_free(pl);
            break;
        }
        print_row(name, m, bound, &r, dt);
        int is_chosen = all ? strcmp(name, "auto") == 0 : 1;
        if (is_chosen) {
            status = r.feasible ? 0 : 1;
            chosen = pl;
        } else {
            ooc_plan_free(pl);
        }
        ooc_sim_result_free(&r);
    }
    if (chosen && !(outpath && strcmp(outpath, "none") == 0)) {
        char path[4096];
        if (!outpath) {
            snprintf(path, sizeof path, "%s/plan.tsv", dir);
            outpath = path;
        }
        int rc = strcmp(outpath, "-") == 0 ? ooc_plan_write(chosen, stdout)
                                           : ooc_plan_write_file(chosen, outpath, err, sizeof err);
        if (rc) {
            fprintf(stderr, "ooc-plan: %s\n", err);
            status = 1;
        } else if (strcmp(outpath, "-") != 0) {
            printf("plan (%s) written to %s\n", chosen->policy, outpath);
        }
    }
    if (chosen && export_plan(p, m, chosen, tl_path, json_path))
        status = 1;
    else if (!chosen && (tl_path || json_path))
        fprintf(stderr, "ooc-plan: no timeline or trace written: there is no plan\n");
    ooc_plan_free(chosen);
    ooc_model_free(m);
    ooc_profile_free(p);
    return status;
}
