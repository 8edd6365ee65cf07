/* SPDX-License-Identifier: MIT */
/* ooc-plan.c: the command that plans a recorded (or synthetic) profile offline and prints what
 * each policy would achieve.
 *
 *     ooc-plan [--policy P|all] [--budget B] [--window W] [--chunk C] [--out FILE|none] DIR
 *
 * It reads DIR (profiles/FORMAT.md), plans with one policy (default auto) or all of them,
 * simulates every plan, writes the chosen plan (the named policy's, or auto's with `all`) to
 * FILE (default DIR/plan.tsv) and prints one table row per policy. Exit status: 0 when the
 * written plan is feasible, 1 when it is not or the profile is unusable, 2 for bad arguments. */
#include "ooc_planner.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void usage(FILE *f) {
    fprintf(f, "usage: ooc-plan [--policy P|all] [--budget B] [--window W] [--chunk C]\n"
               "                [--out FILE|none] PROFILE_DIR\n"
               "  P: swapall, lms, superneurons, window, pooch, auto (default)\n"
               "  B, W, C: bytes, with an optional K, M, G or T suffix (powers of 1024);\n"
               "           B defaults to the profile's budget_bytes, W to tuning by simulation,\n"
               "           C to the profile's chunk_bytes\n"
               "  FILE: where the plan goes (default PROFILE_DIR/plan.tsv; 'none': nowhere)\n");
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

int main(int argc, char **argv) {
    const char *policy = "auto", *dir = NULL, *outpath = NULL;
    uint64_t budget = 0, window = 0, chunk = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            usage(stdout);
            return 0;
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
            } else if (strcmp(a, "--out") == 0) {
                outpath = v;
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
    int all = strcmp(policy, "all") == 0;
    if (!all) {
        int ok = 0;
        for (int i = 0; ooc_policy_names[i]; i++)
            ok |= strcmp(policy, ooc_policy_names[i]) == 0;
        if (!ok) {
            fprintf(stderr,
                    "ooc-plan: --policy '%s': expected all, swapall, lms, superneurons, window, "
                    "pooch or auto\n",
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
    if (!budget)
        budget = p->budget_bytes ? p->budget_bytes : p->device_mem_bytes;
    if (!chunk)
        chunk = p->chunk_bytes;
    if (!budget) {
        fprintf(stderr, "ooc-plan: the profile has no budget_bytes or device_mem_bytes; give "
                        "--budget\n");
        ooc_profile_free(p);
        return 2;
    }
    ooc_model_t *m;
    if (ooc_model_build(p, chunk, &m)) {
        fprintf(stderr, "ooc-plan: out of memory\n");
        ooc_profile_free(p);
        return 1;
    }
    uint64_t must = 0;
    uint64_t bound = ooc_model_bound_ns(m, budget, &must);
    printf("profile %s: %s, %u ops, %u buffers\n", dir, p->program, p->nops, p->nbufs);
    printf("budget %.2f GiB, chunk %llu KiB, in-core time %.3f ms, lower bound %.3f ms "
           "(%.2f GB must cross the link)\n",
           (double)budget / (1u << 30), (unsigned long long)(chunk >> 10),
           (double)m->compute_ns / 1e6, (double)bound / 1e6, (double)must / 1e9);
    printf("%-13s %11s %9s %8s %9s %9s %9s %6s %6s %6s %9s\n", "policy", "time_ms", "x_incore",
           "x_bound", "peak_GiB", "h2d_GB", "d2h_GB", "keep", "swap", "recomp", "plan_ms");
    int status = 1;
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
        if (r.feasible)
            printf("%-13s %11.3f %9.3f %8.3f %9.2f %9.2f %9.2f %6u %6u %6u %9.1f\n", name,
                   (double)r.time_ns / 1e6, (double)r.time_ns / (double)m->compute_ns,
                   (double)r.time_ns / (double)bound, (double)r.peak_bytes / (1u << 30),
                   (double)r.h2d_bytes / 1e9, (double)r.d2h_bytes / 1e9, r.n_keep, r.n_swap,
                   r.n_recompute, dt);
        else
            printf("%-13s %11s   %s (planned in %.1f ms)\n", name, "x", r.viol_msg, dt);
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
    ooc_plan_free(chosen);
    ooc_model_free(m);
    ooc_profile_free(p);
    return status;
}
