/* SPDX-License-Identifier: MIT */
/* wl_run.c: the workloads' common options, synthetic data, iteration bookkeeping and report.
 *
 * Every workload takes the same options (documented by --help), prints one loss line per
 * iteration and ends its output with exactly three lines: peak_device_bytes, ops_per_iteration
 * and checksum. The data of an iteration depends only on the seed and the sample indices, never
 * on timing. With --time, each iteration's wall time is taken from the host (CLOCK_MONOTONIC)
 * between context synchronisations at iteration boundaries and reported on stderr at the end;
 * without it no synchronisation is added, so the default run issues exactly the same driver
 * calls. Single-threaded. */
#include "wl.h"

#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static wl_opts_t opts;
static void (*mark_fn)(void);
static uint64_t iter_ops_start;
static uint64_t steady_ops;
static int steady_known;
/* --time: iter_ms[i] is iteration i's wall time; lap_ns the synchronised start of the current. */
static double *iter_ms;
static int timed_iters;
static uint64_t lap_ns;

const wl_opts_t *wl_opts(void) {
    return &opts;
}

static void usage(const wl_program_t *p, FILE *f) {
    fprintf(f,
            "usage: %s [--iters N] [--seed S] [--batch B] [--last-batch B] [--mark]\n"
            "       %*s [--batch-from I:B] [--warmup-differs] [--relu-copy] [--time]\n"
            "       %*s [--help]\n\n"
            "%s\n\n"
            "Options:\n"
            "  --iters N          training iterations (default %d)\n"
            "  --seed S           seed of the weights and the synthetic data (default 1)\n"
            "  --batch B          samples per iteration (default %d)\n"
            "  --last-batch B     the final iteration uses B samples instead (a short last batch)\n"
            "  --batch-from I:B   from iteration I on, B samples per iteration (a lasting change\n"
            "                     of shape in the middle of training; B <= --batch)\n"
            "  --mark             after each iteration call ooc_mark_iteration() when the process\n"
            "                     has it (the ooc-shim marker, found with dlsym(RTLD_DEFAULT))\n"
            "  --warmup-differs   the first iteration also issues extra ops that do not change\n"
            "                     the results, as autotuning does\n"
            "  --relu-copy        ReLU out of place (mlp, large): the activation goes to a new\n"
            "                     buffer and the pre-activation is kept for the backward pass,\n"
            "                     as a framework does without inplace=True; same results\n"
            "  --time             time each iteration on the host (CLOCK_MONOTONIC), with a\n"
            "                     cuCtxSynchronize before the first iteration and after each\n"
            "                     one, and print at the end, on stderr, one line\n"
            "                     `time: per-iteration ms: T0 T1 ... (median of iterations\n"
            "                     K..N-1: M)`, K = 4 when there are more than 4 iterations,\n"
            "                     else 0; what is printed on stdout does not change\n"
            "  --help             print this text and exit\n\n"
            "Output: one line `iter I: batch B loss L` per iteration, then exactly\n"
            "  peak_device_bytes: N     peak of the program's own live device allocations\n"
            "  ops_per_iteration: N     kernel launches + memcpys + memsets of one steady-state\n"
            "                           iteration (a cuDNN call counts as its one launch)\n"
            "  checksum: H              FNV-1a 64 of all weight bytes after training (16 hex)\n"
            "Driver or cuDNN errors print `error: <function>: <name> (<code>)` and exit 2.\n"
            "Run on the simulated device with scripts/with-fakecuda.\n",
            p->name, (int)strlen(p->name), "", (int)strlen(p->name), "", p->about, p->default_iters,
            p->default_batch);
}

static long parse_num(const wl_program_t *p, const char *opt, const char *arg, long min) {
    char *end = NULL;
    errno = 0;
    long v = arg ? strtol(arg, &end, 0) : 0;
    if (!arg || errno || *end || v < min) {
        fprintf(stderr, "%s: %s needs an integer >= %ld, got '%s'\n", p->name, opt, min,
                arg ? arg : "");
        usage(p, stderr);
        exit(1);
    }
    return v;
}

void wl_parse_args(const wl_program_t *p, int argc, char **argv, wl_opts_t *o) {
    *o = (wl_opts_t){.iters = p->default_iters, .seed = 1, .batch = p->default_batch};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *next = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(p, stdout);
            exit(0);
        } else if (strcmp(a, "--iters") == 0) {
            o->iters = (int)parse_num(p, a, next, 1), i++;
        } else if (strcmp(a, "--seed") == 0) {
            o->seed = (uint64_t)parse_num(p, a, next, 0), i++;
        } else if (strcmp(a, "--batch") == 0) {
            o->batch = (int)parse_num(p, a, next, 1), i++;
        } else if (strcmp(a, "--last-batch") == 0) {
            o->last_batch = (int)parse_num(p, a, next, 1), i++;
        } else if (strcmp(a, "--batch-from") == 0) {
            char *colon = next ? strchr(next, ':') : NULL;
            if (!colon) {
                fprintf(stderr, "%s: --batch-from needs I:B (e.g. 5:2), got '%s'\n", p->name,
                        next ? next : "");
                exit(1);
            }
            char iter_s[32];
            snprintf(iter_s, sizeof iter_s, "%.*s", (int)(colon - next), next);
            o->change_at = (int)parse_num(p, a, iter_s, 1);
            o->change_batch = (int)parse_num(p, a, colon + 1, 1), i++;
        } else if (strcmp(a, "--mark") == 0) {
            o->mark = 1;
        } else if (strcmp(a, "--warmup-differs") == 0) {
            o->warmup_differs = 1;
        } else if (strcmp(a, "--relu-copy") == 0) {
            o->relu_copy = 1;
        } else if (strcmp(a, "--time") == 0) {
            o->time = 1;
        } else {
            fprintf(stderr, "%s: unknown option '%s'\n", p->name, a);
            usage(p, stderr);
            exit(1);
        }
    }
    if (o->batch > 65536 || o->last_batch > o->batch || o->change_batch > o->batch) {
        fprintf(stderr,
                "%s: need --last-batch <= --batch, --batch-from's B <= --batch, and "
                "--batch <= 65536\n",
                p->name);
        exit(1);
    }
    if (o->mark)
        *(void **)&mark_fn = dlsym(RTLD_DEFAULT, "ooc_mark_iteration");
    if (o->time && !(iter_ms = calloc((size_t)o->iters, sizeof *iter_ms))) {
        fprintf(stderr, "error: %s: out of host memory\n", p->name);
        exit(2);
    }
    opts = *o;
}

int wl_batch_size(int it) {
    if (it == opts.iters - 1 && opts.last_batch)
        return opts.last_batch;
    return opts.change_at && it >= opts.change_at ? opts.change_batch : opts.batch;
}

static uint64_t mix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* Uniform float in [-1, 1) from a 64-bit hash. */
static float unit(uint64_t h) {
    return 2.0f * ((float)(h >> 40) * (1.0f / 16777216.0f)) - 1.0f;
}

void wl_batch(int it, int batch, int dim, int classes, float *x, int32_t *labels) {
    wl_batch_shard(it, 0, batch, dim, classes, x, labels);
}

void wl_batch_shard(int it, int first, int count, int dim, int classes, float *x, int32_t *labels) {
    uint64_t data_key = mix64(opts.seed ^ 0x64617461ull), teach_key = mix64(opts.seed ^ 0x7465ull);
    for (int b = 0; b < count; b++) {
        uint64_t sample = (uint64_t)it * (uint64_t)opts.batch + (uint64_t)first + (uint64_t)b;
        float *xs = x + (size_t)b * (size_t)dim;
        for (int d = 0; d < dim; d++)
            xs[d] = unit(mix64(data_key ^ mix64(sample * 0x10000ull + (uint64_t)d)));
        int best = 0;
        float best_v = 0.0f;
        for (int c = 0; c < classes; c++) {
            float v = 0.0f;
            for (int d = 0; d < dim; d++)
                v += xs[d] * unit(mix64(teach_key ^ (((uint64_t)c << 32) | (uint64_t)d)));
            if (c == 0 || v > best_v)
                best = c, best_v = v;
        }
        labels[b] = best;
    }
}

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* --time: waits for all the work issued so far, then closes the running iteration (if any) and
 * starts the next lap. */
static void time_lap(void) {
    wl_check(wl_cu.CtxSynchronize(), "cuCtxSynchronize");
    uint64_t t = now_ns();
    if (lap_ns && timed_iters < opts.iters)
        iter_ms[timed_iters++] = (double)(t - lap_ns) / 1e6;
    lap_ns = t;
}

void wl_iter_begin(int it) {
    if (opts.time)
        time_lap();
    wl_alloc_log_iter(it);
    iter_ops_start = wl_ops();
}

void wl_iters_done(void) {
    if (opts.time)
        time_lap();
}

void wl_iter_end(int it, CUstream s, CUdeviceptr loss) {
    float host_loss = 0.0f;
    wl_d2h_async(&host_loss, loss, sizeof host_loss, s);
    wl_sync(s);
    uint64_t n = wl_ops() - iter_ops_start;
    int batch = wl_batch_size(it);
    /* Ops do not depend on the batch size; a full-batch iteration is the reference. */
    if (!steady_known || batch == opts.batch) {
        if (steady_known && n != steady_ops && batch == opts.batch)
            fprintf(stderr, "warning: iteration %d issued %llu ops, earlier ones %llu\n", it,
                    (unsigned long long)n, (unsigned long long)steady_ops);
        steady_ops = n;
        steady_known = 1;
    }
    printf("iter %d: batch %d loss %.6f\n", it, batch, (double)host_loss);
    fflush(stdout);
    if (mark_fn)
        mark_fn();
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The --time line on stderr, written with one fprintf of a buffer built first. */
static void report_time(void) {
    int n = timed_iters, k = n > 4 ? 4 : 0;
    size_t cap = 64 + (size_t)n * 24, len = 0;
    char *line = malloc(cap);
    double *sorted = malloc(((size_t)n + 1) * sizeof *sorted);
    if (!line || !sorted) {
        fprintf(stderr, "error: %s: out of host memory\n", "--time");
        exit(2);
    }
    len += (size_t)snprintf(line + len, cap - len, "time: per-iteration ms:");
    for (int i = 0; i < n; i++)
        len += (size_t)snprintf(line + len, cap - len, " %.3f", iter_ms[i]);
    memcpy(sorted, iter_ms + k, (size_t)(n - k) * sizeof *sorted);
    qsort(sorted, (size_t)(n - k), sizeof *sorted, cmp_double);
    int m = n - k;
    double med = m == 0 ? 0.0 : m % 2 ? sorted[m / 2] : (sorted[m / 2 - 1] + sorted[m / 2]) / 2;
    fprintf(stderr, "%s (median of iterations %d..%d: %.3f)\n", line, k, n - 1, med);
    free(sorted);
    free(line);
    free(iter_ms);
    iter_ms = NULL;
}

void wl_report(uint64_t checksum) {
    printf("peak_device_bytes: %llu\n", (unsigned long long)wl_peak_bytes());
    printf("ops_per_iteration: %llu\n", (unsigned long long)steady_ops);
    printf("checksum: %016llx\n", (unsigned long long)checksum);
    fflush(stdout);
    if (opts.time)
        report_time();
}
