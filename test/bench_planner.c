/* SPDX-License-Identifier: MIT */
/* bench_planner.c: `make bench-planner`: planning time of `auto` on a 10,000-op iteration, every
 * policy's planning time and predicted time on every reference profile, and the
 * window-scheduling paper's Table-1-style throughput tables (a benchmark, not a test).
 *
 *     build/bench-planner [PROFILES_DIR]     (default profiles/synthetic)
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ooc_planner.h"

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* A deep network of `layers` layers: forward (a GEMM-like op and an activation per layer),
 * backward (two ops per layer), then one update per layer: 5 ops per layer. */
static ooc_profile_t *deep_profile(int layers) {
    ooc_profile_t *p = ooc_profile_new();
    ooc_profile_set_str(&p->program, "bench: deep synthetic network");
    int nops = 5 * layers;
    int32_t *w = malloc((size_t)layers * sizeof *w), *y = malloc((size_t)layers * sizeof *y),
            *a = malloc((size_t)(layers + 1) * sizeof *a);
    /* op indices: fwd heavy 2l, fwd act 2l+1, bwd act 2L+2(L-1-l), bwd heavy +1, update 4L+l */
    int L = layers;
    for (int l = 0; l < L; l++)
        w[l] = ooc_profile_add_buffer(p, 1u << 20, -1, -1, 1, "w", NULL, 0);
    a[0] = ooc_profile_add_buffer(p, 16u << 20, 0, 4 * L - 1, 0, "input", NULL, 0);
    for (int l = 0; l < L; l++) {
        int fh = 2 * l, fa = 2 * l + 1, ba = 2 * L + 2 * (L - 1 - l), bh = ba + 1;
        int32_t prod_h = fh, prod_a = fa;
        y[l] = ooc_profile_add_buffer(p, 16u << 20, fh, ba, 0, "y", &prod_h, 1);
        a[l + 1] = ooc_profile_add_buffer(
            p, 16u << 20, fa, l + 1 < L ? 2 * L + 2 * (L - 2 - l) + 1 : 2 * L, 0, "a", &prod_a, 1);
        (void)bh;
    }
    int32_t *g = malloc((size_t)(L + 1) * sizeof *g), *gw = malloc((size_t)L * sizeof *gw),
            *gyl = malloc((size_t)L * sizeof *gyl);
    g[L] = ooc_profile_add_buffer(p, 16u << 20, 2 * L, 2 * L, 0, "g", NULL, 0);
    for (int l = L - 1; l >= 0; l--) {
        int ba = 2 * L + 2 * (L - 1 - l), bh = ba + 1;
        gyl[l] = ooc_profile_add_buffer(p, 16u << 20, ba, bh, 0, "gy", NULL, 0);
        g[l] = ooc_profile_add_buffer(p, 16u << 20, bh, l > 0 ? bh + 1 : bh, 0, "g", NULL, 0);
        gw[l] = ooc_profile_add_buffer(p, 1u << 20, bh, 4 * L + l, 0, "gw", NULL, 0);
    }
    /* ops, in index order */
    for (int i = 0; i < nops; i++) {
        ooc_ref_t r[4];
        uint32_t n = 0;
        if (i < 2 * L) {
            int l = i / 2;
            if (i % 2 == 0) {
                r[n++] = (ooc_ref_t){a[l], OOC_ACCESS_R};
                r[n++] = (ooc_ref_t){w[l], OOC_ACCESS_R};
                r[n++] = (ooc_ref_t){y[l], OOC_ACCESS_W};
                ooc_profile_add_op(p, 0, OOC_KIND_CUBLAS, "gemm_fwd", NULL, 200000, r, n);
            } else {
                r[n++] = (ooc_ref_t){y[l], OOC_ACCESS_R};
                r[n++] = (ooc_ref_t){a[l + 1], OOC_ACCESS_W};
                ooc_profile_add_op(p, 0, OOC_KIND_KERNEL, "relu_fwd", NULL, 40000, r, n);
            }
        } else if (i < 4 * L) {
            int k = i - 2 * L, l = L - 1 - k / 2;
            if (k % 2 == 0) {
                /* act backward: reads g[l+1] (or the seed), y[l]; writes gy */
                int32_t gyb = gyl[l];
                if (l == L - 1) {
                    r[n++] = (ooc_ref_t){g[L], OOC_ACCESS_W};
                } else {
                    r[n++] = (ooc_ref_t){g[l + 1], OOC_ACCESS_R};
                    r[n++] = (ooc_ref_t){a[l + 1], OOC_ACCESS_R};
                }
                r[n++] = (ooc_ref_t){y[l], OOC_ACCESS_R};
                r[n++] = (ooc_ref_t){gyb, OOC_ACCESS_W};
                ooc_profile_add_op(p, 0, OOC_KIND_KERNEL, "relu_bwd", NULL, 60000, r, n);
            } else {
                int32_t gyb = gyl[l];
                r[n++] = (ooc_ref_t){gyb, OOC_ACCESS_R};
                r[n++] = (ooc_ref_t){w[l], OOC_ACCESS_R};
                r[n++] = (ooc_ref_t){g[l], OOC_ACCESS_W};
                r[n++] = (ooc_ref_t){gw[l], OOC_ACCESS_W};
                ooc_profile_add_op(p, 0, OOC_KIND_CUBLAS, "gemm_bwd", NULL, 400000, r, n);
            }
        } else {
            int l = i - 4 * L;
            r[n++] = (ooc_ref_t){w[l], OOC_ACCESS_RW};
            r[n++] = (ooc_ref_t){gw[l], OOC_ACCESS_R};
            ooc_profile_add_op(p, 0, OOC_KIND_KERNEL, "sgd_update", NULL, 5000, r, n);
        }
    }
    free(w);
    free(y);
    free(a);
    free(g);
    free(gw);
    free(gyl);
    return p;
}

static int bench_10k(void) {
    ooc_profile_t *p = deep_profile(2000);
    char err[512] = "";
    /* fix lifetimes to the actual first and last references */
    for (uint32_t b = 0; b < p->nbufs; b++)
        if (!p->bufs[b].persistent) {
            p->bufs[b].alloc_idx = -2;
            p->bufs[b].free_idx = -2;
        }
    for (uint32_t i = 0; i < p->nops; i++)
        for (uint32_t k = 0; k < p->ops[i].nref; k++) {
            ooc_buffer_t *b = &p->bufs[p->refs[p->ops[i].ref_off + k].buf];
            if (b->persistent)
                continue;
            if (b->alloc_idx == -2)
                b->alloc_idx = i;
            b->free_idx = i;
        }
    if (ooc_profile_validate(p, err, sizeof err)) {
        fprintf(stderr, "bench: %s\n", err);
        return 1;
    }
    ooc_model_t *m;
    ooc_model_build(p, p->chunk_bytes, &m);
    uint64_t peak = 0;
    {
        ooc_plan_t *keep = ooc_plan_new("keep", m->n, m->nb, UINT64_MAX / 2, m->chunk_bytes);
        ooc_plan_finalize(keep);
        ooc_sim_result_t r;
        ooc_sim_run(m, keep, NULL, &r);
        peak = r.peak_bytes;
        ooc_plan_free(keep);
    }
    uint64_t budget = peak / 4;
    printf("== 10,000-op iteration (%u ops, %u buffers, %u references; in-core peak %.2f GiB, "
           "budget %.2f GiB)\n",
           p->nops, p->nbufs, p->nrefs, (double)peak / (1u << 30), (double)budget / (1u << 30));
    printf("%-13s %10s %12s %9s\n", "policy", "plan_ms", "time_ms", "x_bound");
    uint64_t bound = ooc_model_bound_ns(m, budget, NULL);
    for (int i = 0; ooc_policy_names[i]; i++) {
        ooc_policy_opts_t o = {.budget_bytes = budget};
        ooc_plan_t *pl;
        double t0 = now_ms();
        int rc = ooc_policy_plan(m, ooc_policy_names[i], &o, &pl, err, sizeof err);
        double dt = now_ms() - t0;
        if (rc) {
            printf("%-13s %10.1f %12s   %s\n", ooc_policy_names[i], dt, "x", err);
            continue;
        }
        ooc_sim_result_t r;
        ooc_sim_run(m, pl, NULL, &r);
        if (r.feasible)
            printf("%-13s %10.1f %12.3f %9.3f\n", ooc_policy_names[i], dt, (double)r.time_ns / 1e6,
                   (double)r.time_ns / (double)bound);
        else
            printf("%-13s %10.1f %12s\n", ooc_policy_names[i], dt, "x");
        ooc_plan_free(pl);
    }
    ooc_model_free(m);
    ooc_profile_free(p);
    return 0;
}

#define NPOL 6
typedef struct {
    char name[256];
    char model[64];
    char axis[16];
    long size;
    int incore;
    double t_ms[NPOL]; /* predicted iteration time, <0: infeasible */
    double plan_ms[NPOL];
    double incore_ms, bound_ms;
    int fits; /* every op's own working set fits the budget */
} entry_t;

static int entry_cmp(const void *a, const void *b) {
    const entry_t *x = a, *y = b;
    int c = strcmp(x->model, y->model);
    return c ? c : (x->size > y->size) - (x->size < y->size);
}

int main(int argc, char **argv) {
    const char *root = argc > 1 ? argv[1] : "profiles/synthetic";
    if (bench_10k())
        return 1;
    DIR *d = opendir(root);
    if (!d) {
        perror(root);
        return 1;
    }
    entry_t *e = calloc(256, sizeof *e);
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)) && n < 256) {
        if (de->d_name[0] == '.')
            continue;
        entry_t *x = &e[n];
        snprintf(x->name, sizeof x->name, "%s", de->d_name);
        const char *dash = strrchr(de->d_name, '-');
        if (!dash)
            continue;
        snprintf(x->model, sizeof x->model, "%.*s", (int)(dash - de->d_name), de->d_name);
        const char *num = dash + 1;
        size_t al = strcspn(num, "0123456789");
        snprintf(x->axis, sizeof x->axis, "%.*s", (int)al, num);
        x->size = atol(num + al);
        n++;
    }
    closedir(d);
    qsort(e, (size_t)n, sizeof *e, entry_cmp);
    printf("\n== every policy on every reference profile (budget from the profile: 8 GiB)\n");
    printf("%-24s %-13s %9s %11s %9s %8s\n", "profile", "policy", "plan_ms", "time_ms", "x_incore",
           "x_bound");
    for (int i = 0; i < n; i++) {
        char path[600], err[512] = "";
        snprintf(path, sizeof path, "%s/%s", root, e[i].name);
        ooc_profile_t *p;
        if (ooc_profile_read(path, &p, err, sizeof err)) {
            fprintf(stderr, "bench: %s\n", err);
            return 1;
        }
        ooc_model_t *m;
        ooc_model_build(p, p->chunk_bytes, &m);
        uint64_t budget = p->budget_bytes;
        e[i].incore_ms = (double)m->compute_ns / 1e6;
        e[i].bound_ms = (double)ooc_model_bound_ns(m, budget, NULL) / 1e6;
        e[i].fits = ooc_model_check_budget(m, budget, NULL, NULL, 0) == 0;
        ooc_plan_t *keep = ooc_plan_new("keep", m->n, m->nb, budget, m->chunk_bytes);
        ooc_plan_finalize(keep);
        ooc_sim_result_t r;
        ooc_sim_run(m, keep, NULL, &r);
        e[i].incore = r.feasible;
        ooc_plan_free(keep);
        for (int k = 0; k < NPOL; k++) {
            ooc_policy_opts_t o = {.budget_bytes = budget};
            ooc_plan_t *pl = NULL;
            double t0 = now_ms();
            int rc = ooc_policy_plan(m, ooc_policy_names[k], &o, &pl, err, sizeof err);
            e[i].plan_ms[k] = now_ms() - t0;
            e[i].t_ms[k] = -1;
            if (rc == 0) {
                ooc_sim_run(m, pl, NULL, &r);
                if (r.feasible)
                    e[i].t_ms[k] = (double)r.time_ns / 1e6;
                ooc_plan_free(pl);
            }
            if (e[i].t_ms[k] >= 0)
                printf("%-24s %-13s %9.1f %11.3f %9.3f %8.3f\n", e[i].name, ooc_policy_names[k],
                       e[i].plan_ms[k], e[i].t_ms[k], e[i].t_ms[k] / e[i].incore_ms,
                       e[i].t_ms[k] / e[i].bound_ms);
            else
                printf("%-24s %-13s %9.1f %11s\n", e[i].name, ooc_policy_names[k], e[i].plan_ms[k],
                       "x");
        }
        ooc_model_free(m);
        ooc_profile_free(p);
    }
    /* Table-1-style tables: one per model */
    for (int i = 0; i < n;) {
        int j = i;
        while (j < n && strcmp(e[j].model, e[i].model) == 0)
            j++;
        int gpt = strcmp(e[i].axis, "seq") == 0;
        printf("\n== %s, 8 GiB budget, predicted %s/s (x: does not fit)\n", e[i].model,
               gpt ? "tokens (batch 8)" : "images");
        printf("%-13s", gpt ? "seq length" : "batch size");
        for (int k = i; k < j; k++)
            printf(" %9ld", e[k].size);
        printf("\n%-13s", "in-core");
        for (int k = i; k < j; k++) {
            double per = gpt ? 8.0 * (double)e[k].size : (double)e[k].size;
            if (e[k].incore)
                printf(" %9.0f", per / (e[k].incore_ms / 1e3));
            else
                printf(" %9s", "x");
        }
        for (int pidx = 0; pidx < NPOL; pidx++) {
            printf("\n%-13s", ooc_policy_names[pidx]);
            for (int k = i; k < j; k++) {
                double per = gpt ? 8.0 * (double)e[k].size : (double)e[k].size;
                if (e[k].t_ms[pidx] >= 0)
                    printf(" %9.0f", per / (e[k].t_ms[pidx] / 1e3));
                else
                    printf(" %9s", "x");
            }
        }
        printf("\n%-13s", "bound");
        for (int k = i; k < j; k++) {
            double per = gpt ? 8.0 * (double)e[k].size : (double)e[k].size;
            if (e[k].fits)
                printf(" %9.0f", per / (e[k].bound_ms / 1e3));
            else
                printf(" %9s", "x");
        }
        printf("\n%-13s", "auto/bound");
        for (int k = i; k < j; k++) {
            if (e[k].t_ms[NPOL - 1] >= 0)
                printf(" %9.3f", e[k].t_ms[NPOL - 1] / e[k].bound_ms);
            else
                printf(" %9s", "x");
        }
        printf("\n");
        i = j;
    }
    free(e);
    return 0;
}
