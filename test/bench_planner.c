/* SPDX-License-Identifier: MIT */
/* bench_planner.c: `make bench-planner`: planning time of `auto` on a 10,000-op iteration, every
 * policy's planning time and predicted time on every reference profile, and the
 * window-scheduling paper's Table-1-style throughput tables (a benchmark, not a test).
 *
 *     build/bench-planner [SYNTHETIC_DIR [RECORDED_DIR]]
 *         (default profiles/synthetic and profiles/recorded)
 *     build/bench-planner --10k      (the 10,000-op planning-time table only)
 *
 * The last table runs every profile of both directories at its own budget and at 1/2, 1/4 and
 * 1/8 of its in-core peak, with the lower bound (planner/bound.c) and auto's ratios to it and to
 * the best other policy.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ooc_planner.h"

/* Milliseconds on `clock`: CLOCK_MONOTONIC for wall-clock time, CLOCK_PROCESS_CPUTIME_ID for
 * the CPU time the planning itself used (what a loaded machine distorts least). */
static double now_ms(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
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
                r[n++] = (ooc_ref_t){a[l], OOC_ACCESS_R, 0};
                r[n++] = (ooc_ref_t){w[l], OOC_ACCESS_R, 0};
                r[n++] = (ooc_ref_t){y[l], OOC_ACCESS_W, 0};
                ooc_profile_add_op(p, 0, OOC_KIND_CUBLAS, "gemm_fwd", NULL, 200000, r, n);
            } else {
                r[n++] = (ooc_ref_t){y[l], OOC_ACCESS_R, 0};
                r[n++] = (ooc_ref_t){a[l + 1], OOC_ACCESS_W, 0};
                ooc_profile_add_op(p, 0, OOC_KIND_KERNEL, "relu_fwd", NULL, 40000, r, n);
            }
        } else if (i < 4 * L) {
            int k = i - 2 * L, l = L - 1 - k / 2;
            if (k % 2 == 0) {
                /* act backward: reads g[l+1] (or the seed), y[l]; writes gy */
                int32_t gyb = gyl[l];
                if (l == L - 1) {
                    r[n++] = (ooc_ref_t){g[L], OOC_ACCESS_W, 0};
                } else {
                    r[n++] = (ooc_ref_t){g[l + 1], OOC_ACCESS_R, 0};
                    r[n++] = (ooc_ref_t){a[l + 1], OOC_ACCESS_R, 0};
                }
                r[n++] = (ooc_ref_t){y[l], OOC_ACCESS_R, 0};
                r[n++] = (ooc_ref_t){gyb, OOC_ACCESS_W, 0};
                ooc_profile_add_op(p, 0, OOC_KIND_KERNEL, "relu_bwd", NULL, 60000, r, n);
            } else {
                int32_t gyb = gyl[l];
                r[n++] = (ooc_ref_t){gyb, OOC_ACCESS_R, 0};
                r[n++] = (ooc_ref_t){w[l], OOC_ACCESS_R, 0};
                r[n++] = (ooc_ref_t){g[l], OOC_ACCESS_W, 0};
                r[n++] = (ooc_ref_t){gw[l], OOC_ACCESS_W, 0};
                ooc_profile_add_op(p, 0, OOC_KIND_CUBLAS, "gemm_bwd", NULL, 400000, r, n);
            }
        } else {
            int l = i - 4 * L;
            r[n++] = (ooc_ref_t){w[l], OOC_ACCESS_RW, 0};
            r[n++] = (ooc_ref_t){gw[l], OOC_ACCESS_R, 0};
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
    printf("%-13s %10s %10s %12s %9s\n", "policy", "plan_ms", "cpu_ms", "time_ms", "x_bound");
    uint64_t bound = ooc_model_bound_ns(m, budget, NULL);
    for (int i = 0; ooc_policy_names[i]; i++) {
        ooc_policy_opts_t o = {.budget_bytes = budget};
        ooc_plan_t *pl;
        double t0 = now_ms(CLOCK_MONOTONIC), c0 = now_ms(CLOCK_PROCESS_CPUTIME_ID);
        int rc = ooc_policy_plan(m, ooc_policy_names[i], &o, &pl, err, sizeof err);
        double dt = now_ms(CLOCK_MONOTONIC) - t0, dc = now_ms(CLOCK_PROCESS_CPUTIME_ID) - c0;
        if (rc) {
            printf("%-13s %10.1f %10.1f %12s   %s\n", ooc_policy_names[i], dt, dc, "x", err);
            continue;
        }
        ooc_sim_result_t r;
        ooc_sim_run(m, pl, NULL, &r);
        if (r.feasible)
            printf("%-13s %10.1f %10.1f %12.3f %9.3f\n", ooc_policy_names[i], dt, dc,
                   (double)r.time_ns / 1e6, (double)r.time_ns / (double)bound);
        else
            printf("%-13s %10.1f %10.1f %12s\n", ooc_policy_names[i], dt, dc, "x");
        ooc_plan_free(pl);
    }
    ooc_model_free(m);
    ooc_profile_free(p);
    return 0;
}

#define NPOL 7
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

static int dbl_cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* One directory's profiles, sorted by name, into names[] (at most cap). */
static int list_profiles(const char *root, char (*names)[600], int n, int cap) {
    DIR *d = opendir(root);
    if (!d)
        return n;
    struct dirent *de;
    int first = n;
    while ((de = readdir(d)) && n < cap)
        if (de->d_name[0] != '.')
            snprintf(names[n++], 600, "%s/%s", root, de->d_name);
    closedir(d);
    qsort(names + first, (size_t)(n - first), sizeof names[0],
          (int (*)(const void *, const void *))strcmp);
    return n;
}

/* Every reference profile at its budget and at 1/2, 1/4 and 1/8 of its in-core peak (where the
 * largest op fits): each policy's predicted time, the lower bound, auto over the bound and auto
 * over the best other policy; then the median and the worst of those ratios. */
static int budgets_table(const char *recorded, const char *synthetic, entry_t *e, int ne) {
    static char names[128][600];
    int np = list_profiles(synthetic, names, 0, 128);
    np = list_profiles(recorded, names, np, 128);
    double *ratio = calloc(4 * (size_t)np + 1, sizeof *ratio);
    double *vs = calloc(4 * (size_t)np + 1, sizeof *vs);
    int nr = 0;
    printf("\n== every reference profile at its budget and 1/2, 1/4, 1/8 of its in-core peak: "
           "predicted ms\n");
    printf("%-22s %9s", "profile", "budget");
    for (int k = 0; k < NPOL; k++)
        printf(" %12s", ooc_policy_names[k]);
    printf(" %10s %10s %10s\n", "bound", "auto/bound", "auto/other");
    for (int i = 0; i < np; i++) {
        char err[512] = "";
        ooc_profile_t *p;
        if (ooc_profile_read(names[i], &p, err, sizeof err)) {
            fprintf(stderr, "bench: %s\n", err);
            free(ratio);
            free(vs);
            return 1;
        }
        ooc_model_t *m;
        ooc_model_build(p, p->chunk_bytes, &m);
        ooc_plan_t *keep = ooc_plan_new("keep", m->n, m->nb, UINT64_MAX / 2, m->chunk_bytes);
        ooc_plan_finalize(keep);
        ooc_sim_result_t r;
        ooc_sim_run(m, keep, NULL, &r);
        uint64_t peak = r.peak_bytes;
        ooc_plan_free(keep);
        const char *label[4] = {"own", "1/2", "1/4", "1/8"};
        uint64_t budgets[4] = {p->budget_bytes, peak / 2, peak / 4, peak / 8};
        const char *base = strrchr(names[i], '/');
        for (int b = 0; b < 4; b++) {
            if (ooc_model_check_budget(m, budgets[b], NULL, NULL, 0))
                continue;
            char lb[32];
            if (budgets[b] >= (1ull << 30))
                snprintf(lb, sizeof lb, "%s %.1fG", label[b], (double)budgets[b] / (1u << 30));
            else
                snprintf(lb, sizeof lb, "%s %.0fM", label[b], (double)budgets[b] / (1u << 20));
            printf("%-22s %9s", base ? base + 1 : names[i], lb);
            double t[NPOL], other = -1;
            for (int k = 0; k < NPOL; k++) {
                ooc_policy_opts_t o = {.budget_bytes = budgets[b]};
                ooc_plan_t *pl = NULL;
                t[k] = -1;
                if (ooc_policy_plan(m, ooc_policy_names[k], &o, &pl, err, sizeof err) == 0) {
                    ooc_sim_run(m, pl, NULL, &r);
                    if (r.feasible)
                        t[k] = (double)r.time_ns / 1e6;
                    ooc_plan_free(pl);
                }
                if (t[k] >= 0)
                    printf(" %12.2f", t[k]);
                else
                    printf(" %12s", "x");
                if (k < NPOL - 1 && t[k] >= 0 && (other < 0 || t[k] < other))
                    other = t[k];
            }
            double bound = (double)ooc_model_bound_ns(m, budgets[b], NULL) / 1e6;
            double a = t[NPOL - 1];
            for (int q = 0; q < ne && b == 0; q++)
                if (base && strcmp(e[q].name, base + 1) == 0) {
                    memcpy(e[q].t_ms, t, sizeof t);
                    e[q].incore_ms = (double)m->compute_ns / 1e6;
                    e[q].bound_ms = bound;
                    e[q].fits = 1;
                    e[q].incore = peak <= budgets[b];
                }
            printf(" %10.2f", bound);
            if (a >= 0) {
                ratio[nr] = a / bound;
                vs[nr] = other > 0 ? a / other : 1;
                printf(" %10.3f %10.3f\n", ratio[nr], vs[nr]);
                nr++;
            } else {
                printf(" %10s %10s\n", "x", "x");
            }
        }
        ooc_model_free(m);
        ooc_profile_free(p);
    }
    if (nr) {
        double worst_vs = 0;
        for (int i = 0; i < nr; i++)
            worst_vs = vs[i] > worst_vs ? vs[i] : worst_vs;
        qsort(ratio, (size_t)nr, sizeof *ratio, dbl_cmp);
        printf("auto/bound over %d cases: median %.3f, worst %.3f; auto/best other policy: worst "
               "%.3f\n",
               nr, nr % 2 ? ratio[nr / 2] : (ratio[nr / 2 - 1] + ratio[nr / 2]) / 2, ratio[nr - 1],
               worst_vs);
    }
    free(ratio);
    free(vs);
    return 0;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0); /* progress shows as it goes */
    const char *root = argc > 1 ? argv[1] : "profiles/synthetic";
    if (bench_10k())
        return 1;
    if (argc > 1 && strcmp(argv[1], "--10k") == 0)
        return 0; /* the planning-time table only */
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
        for (int k = 0; k < NPOL; k++)
            x->t_ms[k] = -1;
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
    /* every profile at its budget and fractions of its peak; fills e[] at the own budget */
    if (budgets_table(argc > 2 ? argv[2] : "profiles/recorded", root, e, n)) {
        free(e);
        return 1;
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
