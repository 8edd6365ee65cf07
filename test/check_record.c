/* SPDX-License-Identifier: MIT */
/* check_record.c: OOC_MODE=record on the simulated device: the workloads still print their
 * oracle checksums, the profile appears and reads back, one iteration holds exactly the ops the
 * workload counts per iteration, and (with markers, whose iteration is the workload's own) every
 * buffer the workload allocates or frees in an iteration appears with its size and lifetime.
 *
 * The workload's own account comes from WL_ALLOC_LOG (test/workloads/wl_cuda.c): each allocation
 * and free with the ops counted so far. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ooc_planner.h"
#include "testutil.h"

Suite *suite_record(void);

typedef struct run {
    int status;
    char checksum[64];
    long long ops_per_iter;
    char dir[64], log[96];
    tu_proc_t p;
} run_t;

/* Runs build/workloads/<name> args... --iters 6 with or without the shim (recording into a
 * fresh directory, 2 iterations after the warm-up), with the allocation log. */
static void run(run_t *r, const char *name, int shim, const char *const *args) {
    memset(r, 0, sizeof *r);
    snprintf(r->dir, sizeof r->dir, "/tmp/ooc-rec-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(r->dir));
    snprintf(r->log, sizeof r->log, "%s/alloc.log", r->dir);
    char dirv[128], logv[128];
    snprintf(dirv, sizeof dirv, "OOC_PROFILE_DIR=%s/profile", r->dir);
    snprintf(logv, sizeof logv, "WL_ALLOC_LOG=%s", r->log);
    const char *env[] = {tu_fakecuda_libpath(),
                         logv,
                         dirv,
                         "OOC_MODE=record",
                         "OOC_PROFILE_ITERS=2",
                         "OOC_BUDGET=1G",
                         shim ? tu_shim_preload() : NULL,
                         NULL};
    const char *argv[16];
    int n = 0;
    argv[n++] = tu_build_path(name);
    argv[n++] = "--iters";
    argv[n++] = "6";
    for (; args && *args && n < 15; args++)
        argv[n++] = *args;
    argv[n] = NULL;
    ck_assert_int_eq(tu_run(argv, env, 120, &r->p), 0);
    r->status = r->p.status;
    char buf[64];
    if (tu_field(r->p.out, "checksum", buf, sizeof buf))
        snprintf(r->checksum, sizeof r->checksum, "%s", buf);
    if (tu_field(r->p.out, "ops_per_iteration", buf, sizeof buf))
        r->ops_per_iter = atoll(buf);
}

static void run_done(run_t *r) {
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", r->dir);
    ck_assert_int_eq(system(cmd), 0);
    tu_proc_free(&r->p);
}

/* One buffer event of the workload's iteration: size, alloc_idx, free_idx (as the profile). */
typedef struct life {
    unsigned long long bytes;
    long long a, f;
} life_t;

static int cmp_life(const void *x, const void *y) {
    const life_t *p = x, *q = y;
    if (p->bytes != q->bytes)
        return p->bytes < q->bytes ? -1 : 1;
    if (p->a != q->a)
        return p->a < q->a ? -1 : 1;
    return (p->f > q->f) - (p->f < q->f);
}

/* The buffers the workload allocated or freed in iteration `it`, as profile lifetimes. */
static size_t workload_lives(const char *path, int it, life_t *out, size_t cap) {
    FILE *f = fopen(path, "r");
    ck_assert_ptr_nonnull(f);
    char line[256];
    int cur = -1;
    long long start = -1, end = -1;
    /* First pass: where iteration it starts and ends (in ops). */
    while (fgets(line, sizeof line, f)) {
        int i;
        long long ops;
        if (sscanf(line, "iter\t%d\t%lld", &i, &ops) == 2) {
            if (i == it)
                start = ops;
            if (i == it + 1)
                end = ops;
        }
    }
    ck_assert_int_ge(start, 0);
    ck_assert_int_gt(end, start);
    rewind(f);
    struct {
        unsigned long long p, bytes;
        long long a;
        int in;
    } live[4096];
    size_t nlive = 0, n = 0;
    while (fgets(line, sizeof line, f)) {
        int i;
        long long ops;
        unsigned long long bytes, p;
        if (sscanf(line, "iter\t%d\t%lld", &i, &ops) == 2) {
            cur = i;
        } else if (sscanf(line, "alloc\t%lld\t%llu\t%llx", &ops, &bytes, &p) == 3) {
            ck_assert_uint_lt(nlive, 4096);
            live[nlive].p = p;
            live[nlive].bytes = bytes;
            live[nlive].a = cur == it ? ops - start : -1;
            live[nlive].in = cur == it;
            nlive++;
        } else if (sscanf(line, "free\t%lld\t%llx", &ops, &p) == 2) {
            for (size_t k = nlive; k-- > 0;) {
                if (live[k].p != p)
                    continue;
                if (cur == it || live[k].in) {
                    ck_assert_uint_lt(n, cap);
                    out[n++] = (life_t){live[k].bytes, live[k].a, cur == it ? ops - 1 - start : -1};
                }
                live[k] = live[--nlive];
                break;
            }
        }
    }
    for (size_t k = 0; k < nlive; k++)
        if (live[k].in) /* allocated in it, never freed */
            out[n++] = (life_t){live[k].bytes, live[k].a, -1};
    fclose(f);
    return n;
}

/* Records `name`, checks checksum, op count and the profile; with `marked`, the lifetimes. */
static void check_record(const char *name, const char *const *args, int marked) {
    run_t ref, r;
    run(&ref, name, 0, args);
    ck_assert_int_eq(ref.status, 0);
    run(&r, name, 1, args);
    ck_assert_msg(r.status == 0, "%s: status %d\n%s", name, r.status, r.p.err);
    ck_assert_str_eq(r.checksum, ref.checksum);
    ck_assert_msg(strstr(r.p.err, "profile recorded in"), "%s: no profile line:\n%s", name,
                  r.p.err);
    ck_assert_ptr_nonnull(strstr(r.p.err, marked ? "(marked," : "(detected,"));
    char dir[128], err[512];
    snprintf(dir, sizeof dir, "%s/profile", r.dir);
    ooc_profile_t *p = NULL;
    ck_assert_msg(ooc_profile_read(dir, &p, err, sizeof err) == 0, "%s: %s", name, err);
    ck_assert_msg((long long)p->nops == r.ops_per_iter,
                  "%s: %u ops in the profile, the workload "
                  "counts %lld",
                  name, p->nops, r.ops_per_iter);
    ck_assert_int_eq(p->iterations, 2);
    char trace[160];
    snprintf(trace, sizeof trace, "%s/trace.json", dir);
    ck_assert_msg(access(trace, R_OK) == 0, "%s: no trace.json", name);
    snprintf(trace, sizeof trace, "%s/bandwidth.tsv", dir);
    FILE *bw = fopen(trace, "r");
    ck_assert_msg(bw != NULL, "%s: no bandwidth.tsv", name);
    char line[256];
    int rows = 0;
    while (fgets(line, sizeof line, bw))
        rows++;
    fclose(bw);
    ck_assert_int_eq(rows, 2 + 3); /* header, columns, three copy sizes */
    ck_assert(p->h2d_bps > 0 && p->d2h_bps > 0 && p->bidir_bps > 0);
    for (uint32_t i = 0; i < p->nops; i++)
        ck_assert_msg(p->ops[i].duration_ns > 0, "%s: op %u has no duration", name, i);
    /* Per-iteration buffers: with markers the profile's iteration is the workload's. */
    life_t want[4096], got[4096];
    size_t nw = workload_lives(ref.log, 2, want, 4096), ng = 0;
    unsigned long long want_bytes = 0, got_bytes = 0;
    for (uint32_t b = 0; b < p->nbufs; b++) {
        const ooc_buffer_t *bb = &p->bufs[b];
        if (bb->persistent)
            continue;
        got[ng++] = (life_t){bb->bytes, bb->alloc_idx, bb->free_idx};
        got_bytes += bb->bytes;
    }
    for (size_t i = 0; i < nw; i++)
        want_bytes += want[i].bytes;
    ck_assert_msg(ng == nw, "%s: %zu per-iteration buffers in the profile, the workload has %zu",
                  name, ng, nw);
    ck_assert_uint_eq(got_bytes, want_bytes);
    if (marked) {
        qsort(want, nw, sizeof *want, cmp_life);
        qsort(got, ng, sizeof *got, cmp_life);
        for (size_t i = 0; i < nw; i++)
            ck_assert_msg(cmp_life(&want[i], &got[i]) == 0,
                          "%s: buffer %zu: workload %llu bytes [%lld, %lld], profile %llu bytes "
                          "[%lld, %lld]",
                          name, i, want[i].bytes, want[i].a, want[i].f, got[i].bytes, got[i].a,
                          got[i].f);
    }
    ooc_profile_free(p);
    run_done(&ref);
    run_done(&r);
}

START_TEST(test_record_mlp_detects_its_iteration) {
    static const char *const args[] = {"--layers", "12", NULL};
    check_record("workloads/mlp", args, 0);
}
END_TEST

START_TEST(test_record_cnn_detects_its_iteration) {
    static const char *const args[] = {"--blocks", "2", NULL};
    check_record("workloads/cnn", args, 0);
}
END_TEST

/* cnn with 16 identical blocks uploads its parameters block after block: the same 8 copies,
 * each into fresh buffers that stay allocated, 16 times before the first iteration. That
 * repeats like an iteration but keeps what it allocates; the detector once took it for the
 * iteration (as PyTorch's model.to("cuda") of ResNet-50 on a GPU), and the whole iteration must
 * be recorded instead. */
START_TEST(test_record_skips_a_parameter_upload_that_repeats) {
    static const char *const args[] = {"--blocks", "16", NULL};
    check_record("workloads/cnn", args, 0);
    /* In auto mode the first report is planned at once: it must be the iteration. */
    static const char *const auto_args[] = {"--blocks", "16", "--iters", "6", NULL};
    static const char *const env[] = {"OOC_MODE=auto",
                                      "OOC_BUDGET=1G",
                                      "OOC_STATS=1",
                                      "OOC_LOG=info",
                                      "OOC_PROFILE_DIR=/tmp/ooc-rec-upload-prof",
                                      NULL};
    static const char *const oenv[] = {"FAKECUDA_SCHED=inline", NULL};
    tu_result_t ref = tu_run_prog("workloads/cnn", auto_args, 0, oenv, 120);
    tu_result_t r = tu_run_prog("workloads/cnn", auto_args, 1, env, 120);
    ck_assert_msg(r.status == 0 && strcmp(r.checksum, ref.checksum) == 0,
                  "status %d, checksum %s, oracle %s\n%s", r.status, r.checksum, ref.checksum,
                  tu_tail(r.err, 3000));
    const char *rec = strstr(r.err, "profile recorded in ");
    const char *ops = rec ? strstr(rec, ": ") : NULL;
    long n = ops ? strtol(ops + 2, NULL, 10) : 0;
    ck_assert_msg(n == (long)r.ops && strstr(r.err, "keep what they allocate") != NULL,
                  "recorded %ld ops first, the iteration has %llu:\n%s", n, r.ops,
                  tu_tail(r.err, 3000));
    ck_assert_int_eq(tu_stat_row(r.err, "re-recordings after divergence"), 0);
    tu_result_free(&r);
    tu_result_free(&ref);
    ck_assert_int_eq(system("rm -rf /tmp/ooc-rec-upload-prof"), 0);
}
END_TEST

START_TEST(test_record_large_detects_its_iteration) {
    check_record("workloads/large", NULL, 0);
}
END_TEST

START_TEST(test_record_with_markers_has_every_buffer_and_lifetime) {
    static const char *const mlp[] = {"--layers", "12", "--mark", NULL};
    static const char *const cnn[] = {"--blocks", "2", "--mark", NULL};
    static const char *const large[] = {"--mark", NULL};
    check_record("workloads/mlp", mlp, 1);
    check_record("workloads/cnn", cnn, 1);
    check_record("workloads/large", large, 1);
}
END_TEST

START_TEST(test_record_survives_a_differing_first_iteration_and_short_last_batch) {
    static const char *const cnn[] = {"--blocks",     "2", "--warmup-differs",
                                      "--last-batch", "3", NULL};
    static const char *const mlp[] = {"--warmup-differs", "--last-batch", "5", NULL};
    check_record("workloads/cnn", cnn, 0);
    check_record("workloads/mlp", mlp, 0);
}
END_TEST

/* A program too short to repeat gets no profile, a line that says why, its checksum, and the
 * ops it issued listed in unrepeated-ops.tsv (one row each, in order) for the user to compare. */
START_TEST(test_record_without_an_iteration_says_so) {
    char dir[] = "/tmp/ooc-none-XXXXXX", pdir[64], path[96];
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(pdir, sizeof pdir, "OOC_PROFILE_DIR=%s", dir);
    snprintf(path, sizeof path, "%s/unrepeated-ops.tsv", dir);
    const char *argv[] = {tu_build_path("workloads/mlp"), "--iters", "1", NULL};
    const char *env[] = {tu_fakecuda_libpath(), tu_shim_preload(), "OOC_MODE=record", pdir, NULL};
    tu_proc_t p;
    ck_assert_int_eq(tu_run(argv, env, 60, &p), 0);
    ck_assert_int_eq(p.status, 0);
    const char *w = strstr(p.err, "no profile written: no repeating iteration was found in ");
    ck_assert_ptr_nonnull(w);
    long nops =
        strtol(w + strlen("no profile written: no repeating iteration was found in "), NULL, 10);
    ck_assert_int_gt(nops, 10);
    ck_assert_msg(strstr(p.err, path) != NULL, "the message names %s: %s", path, p.err);
    char ops[96];
    snprintf(ops, sizeof ops, "%s/ops.tsv", dir);
    ck_assert_int_ne(access(ops, F_OK), 0);
    FILE *f = fopen(path, "r");
    ck_assert_ptr_nonnull(f);
    char line[8192];
    long rows = 0, kernels = 0;
    ck_assert_ptr_nonnull(fgets(line, sizeof line, f));
    ck_assert_int_eq(strncmp(line, "#ooc-unrepeated-ops\t1", 21), 0);
    ck_assert_ptr_nonnull(fgets(line, sizeof line, f));
    while (fgets(line, sizeof line, f)) {
        ck_assert_int_eq(strtol(line, NULL, 10), rows); /* in order, numbered from 0 */
        kernels += strstr(line, "\tkernel\t") != NULL &&
                   (strstr(line, ":w:") != NULL || strstr(line, ":rw:") != NULL);
        rows++;
    }
    fclose(f);
    ck_assert_int_eq(rows, nops);
    ck_assert_int_gt(kernels, 0);
    tu_proc_free(&p);
    char cmd[96];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

/* Records the mlp with the timing model (a 2 GB/s link each way, safe mode on: the probe's
 * copies are the only cuMemcpyDtoDAsync calls) and FAKECUDA_SLOW set to `slow` (may be ""); the
 * profile's link figures in bps[3] (to the device, to the host, both), and the number of
 * cuMemcpyDtoDAsync calls as the return value. */
static long long record_link(const char *slow, double *bps) {
    char dir[64], dirv[96], stats[96], statv[128], slowv[128];
    snprintf(dir, sizeof dir, "/tmp/ooc-bw-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(dirv, sizeof dirv, "OOC_PROFILE_DIR=%s/profile", dir);
    snprintf(stats, sizeof stats, "%s/fc.stats", dir);
    snprintf(statv, sizeof statv, "FAKECUDA_STATS=%s", stats);
    snprintf(slowv, sizeof slowv, "FAKECUDA_SLOW=%s", slow);
    static const char *const args[] = {"--iters", "6", NULL};
    const char *const env[] = {dirv,
                               statv,
                               slowv,
                               "FAKECUDA_TIMING=1",
                               "FAKECUDA_H2D_GBPS=2",
                               "FAKECUDA_D2H_GBPS=2",
                               "OOC_MODE=record",
                               "OOC_PROFILE_ITERS=2",
                               "OOC_BUDGET=1G",
                               "OOC_SAFE=on",
                               NULL};
    tu_result_t r = tu_run_prog("workloads/mlp", args, 1, env, 120);
    ck_assert_msg(r.status == 0, "FAKECUDA_SLOW=%s: status %d\n%s", slow, r.status,
                  tu_tail(r.err, 2000));
    char prof[96], err[512];
    snprintf(prof, sizeof prof, "%s/profile", dir);
    ooc_profile_t *p = NULL;
    ck_assert_msg(ooc_profile_read(prof, &p, err, sizeof err) == 0, "%s", err);
    bps[0] = p->h2d_bps;
    bps[1] = p->d2h_bps;
    bps[2] = p->bidir_bps;
    ooc_profile_free(p);
    long long n = tu_fc_stat(stats, "calls.cuMemcpyDtoDAsync");
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    ck_assert_int_eq(system(cmd), 0);
    tu_result_free(&r);
    return n;
}

/* One copy of the bandwidth probe slowed 50 times (a moment of contention: averaged into one
 * batch, as before, it read the link at about a seventh of its speed) leaves the profile's link
 * figures, the ones the plan is made for, at least a third of those of a run without it (a
 * loaded machine and the sanitizer build read the 2 GB/s link lower, so the measure is relative,
 * and the runner runs two suites at once: the run without it may have had the machine to
 * itself, and every chunk-sized copy slowed read 0.47 of it so), wherever it falls among the
 * probe's chunk-sized copies (the last 40 of its calls); so does every chunk-sized copy slowed
 * (the smaller copies' figures stand in). */
START_TEST(test_link_bandwidth_survives_a_slow_sample) {
    double bps[3], clean[3];
    long long n = record_link("", clean);
    ck_assert_int_ge(n, 40);
    for (int k = 0; k < 3; k++)
        ck_assert_msg(clean[k] > 0.2e9 && clean[k] < 2.2e9 * (k == 2 ? 2 : 1),
                      "figure %d: %.3g B/s", k, clean[k]);
    static const int back[] = {39, 30, 21, 12, 3, 0};
    for (size_t i = 0; i <= sizeof back / sizeof *back; i++) {
        char slow[64];
        if (i < sizeof back / sizeof *back)
            snprintf(slow, sizeof slow, "cuMemcpyDtoDAsync@%lld=50", n - back[i]);
        else
            snprintf(slow, sizeof slow, "cuMemcpyDtoDAsync@%lld+=50", n - 39);
        ck_assert_int_eq(record_link(slow, bps), n);
        for (int k = 0; k < 2; k++)
            ck_assert_msg(bps[k] > clean[k] / 3 && bps[k] < 2.2e9,
                          "FAKECUDA_SLOW=%s: figure %d: %.3g B/s, %.3g without it", slow, k, bps[k],
                          clean[k]);
        /* Both ways at once: between the faster way alone and both added, give or take the 10%
         * of timing noise the shim allows. */
        ck_assert_msg(bps[2] * 1.1 >= (bps[0] > bps[1] ? bps[0] : bps[1]) &&
                          bps[2] <= 1.1 * (bps[0] + bps[1]),
                      "FAKECUDA_SLOW=%s: both ways %.3g B/s", slow, bps[2]);
    }
}
END_TEST

/* The profile tells the planner whether a planned swap-in's copy runs alone on the device (safe
 * mode without staging: meta.tsv swapin_exclusive 1): so in safe mode, not with staging, not
 * outside safe mode; whether a swap-out's remapping does (safe mode, staged or not:
 * swapout_exclusive 1); whether a planned swap-in takes its memory behind a gate at its point
 * (safe mode with OOC_REMAP_GATE=1, staged or not: remap_gate 1; not outside safe mode, where
 * the gate only brings back chunks still copying out); and the host time of the mapping calls per
 * chunk, measured (a mapping takes some, even on the simulated device without its timing model),
 * with the device chunk's own map and unmap among them (map_vmm_ns, unmap_vmm_ns); with staging,
 * also those of staging a swap-in and of moving it at its first use (stage_vmm_ns, adopt_vmm_ns),
 * else none. */
START_TEST(test_profile_says_whether_swap_ins_run_alone) {
    static const struct {
        const char *safe, *stage, *gate;
        int want, want_out, want_gate;
    } cases[] = {{"OOC_SAFE=on", "OOC_SAFE_STAGE=0", "OOC_REMAP_GATE=0", 1, 1, 0},
                 {"OOC_SAFE=on", "OOC_SAFE_STAGE=1", "OOC_REMAP_GATE=0", 0, 1, 0},
                 {"OOC_SAFE=off", "OOC_SAFE_STAGE=0", "OOC_REMAP_GATE=0", 0, 0, 0},
                 {"OOC_SAFE=on", "OOC_SAFE_STAGE=1", "OOC_REMAP_GATE=1", 0, 1, 1},
                 {"OOC_SAFE=on", "OOC_SAFE_STAGE=0", "OOC_REMAP_GATE=1", 1, 1, 1},
                 {"OOC_SAFE=off", "OOC_SAFE_STAGE=0", "OOC_REMAP_GATE=1", 0, 0, 0}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char dir[64], dirv[96], prof[96], err[512];
        snprintf(dir, sizeof dir, "/tmp/ooc-excl-XXXXXX");
        ck_assert_ptr_nonnull(mkdtemp(dir));
        snprintf(dirv, sizeof dirv, "OOC_PROFILE_DIR=%s/profile", dir);
        static const char *const args[] = {"--iters", "4", NULL};
        const char *const env[] = {dirv,
                                   "OOC_MODE=record",
                                   "OOC_PROFILE_ITERS=2",
                                   "OOC_BUDGET=1G",
                                   cases[i].safe,
                                   cases[i].stage,
                                   cases[i].gate,
                                   cases[i].want_gate ? "FAKECUDA_REMAP_QUEUED=1" : NULL,
                                   NULL};
        tu_result_t r = tu_run_prog("workloads/mlp", args, 1, env, 120);
        ck_assert_msg(r.status == 0, "%s %s: status %d\n%s", cases[i].safe, cases[i].stage,
                      r.status, tu_tail(r.err, 2000));
        snprintf(prof, sizeof prof, "%s/profile", dir);
        ooc_profile_t *p = NULL;
        ck_assert_msg(ooc_profile_read(prof, &p, err, sizeof err) == 0, "%s", err);
        ck_assert_msg(p->swapin_exclusive == cases[i].want, "%s %s: swapin_exclusive %d",
                      cases[i].safe, cases[i].stage, p->swapin_exclusive);
        ck_assert_msg(p->swapout_exclusive == cases[i].want_out, "%s %s: swapout_exclusive %d",
                      cases[i].safe, cases[i].stage, p->swapout_exclusive);
        ck_assert_msg(p->remap_gate == cases[i].want_gate, "%s %s %s: remap_gate %d", cases[i].safe,
                      cases[i].stage, cases[i].gate, p->remap_gate);
        ck_assert_msg(p->swapin_vmm_ns > 0 && p->swapout_vmm_ns > 0 &&
                          p->swapin_vmm_ns < 10000000 && p->swapout_vmm_ns < 10000000,
                      "%s %s: %llu and %llu ns of mapping calls per chunk", cases[i].safe,
                      cases[i].stage, (unsigned long long)p->swapin_vmm_ns,
                      (unsigned long long)p->swapout_vmm_ns);
        int staged = strcmp(cases[i].stage, "OOC_SAFE_STAGE=1") == 0;
        ck_assert_msg(staged ? p->stage_vmm_ns > 0 && p->adopt_vmm_ns > 0 &&
                                   p->stage_vmm_ns < 10000000 && p->adopt_vmm_ns < 10000000
                             : p->stage_vmm_ns == 0 && p->adopt_vmm_ns == 0,
                      "%s %s: stage %llu, adopt %llu ns per chunk", cases[i].safe, cases[i].stage,
                      (unsigned long long)p->stage_vmm_ns, (unsigned long long)p->adopt_vmm_ns);
        /* the device chunk's own map and unmap: parts of those same cycles */
        ck_assert_msg(p->map_vmm_ns > 0 && p->unmap_vmm_ns > 0 &&
                          p->map_vmm_ns <= p->swapin_vmm_ns && p->unmap_vmm_ns <= p->swapout_vmm_ns,
                      "%s %s: map %llu, unmap %llu ns per chunk", cases[i].safe, cases[i].stage,
                      (unsigned long long)p->map_vmm_ns, (unsigned long long)p->unmap_vmm_ns);
        ooc_profile_free(p);
        tu_result_free(&r);
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        ck_assert_int_eq(system(cmd), 0);
    }
}
END_TEST

/* The committed recorded profiles read back and validate (the format they were written in is
 * the one the planner reads today). */
START_TEST(test_committed_recorded_profiles_read_back) {
    static const char *const names[] = {"mlp", "cnn", "large"};
    for (int i = 0; i < 3; i++) {
        char dir[128], err[512];
        snprintf(dir, sizeof dir, "profiles/recorded/%s", names[i]);
        ooc_profile_t *p = NULL;
        ck_assert_msg(ooc_profile_read(dir, &p, err, sizeof err) == 0, "%s: %s", dir, err);
        ck_assert_msg(ooc_profile_validate(p, err, sizeof err) == 0, "%s: %s", dir, err);
        ck_assert_uint_gt(p->nops, 100);
        ooc_profile_free(p);
    }
}
END_TEST

Suite *suite_record(void) {
    Suite *s = suite_create("record");
    TCase *t = tcase_create("record");
    tcase_set_timeout(t, 300);
    tcase_add_test(t, test_record_mlp_detects_its_iteration);
    tcase_add_test(t, test_record_cnn_detects_its_iteration);
    tcase_add_test(t, test_record_large_detects_its_iteration);
    tcase_add_test(t, test_record_skips_a_parameter_upload_that_repeats);
    tcase_add_test(t, test_record_with_markers_has_every_buffer_and_lifetime);
    tcase_add_test(t, test_record_survives_a_differing_first_iteration_and_short_last_batch);
    tcase_add_test(t, test_record_without_an_iteration_says_so);
    tcase_add_test(t, test_committed_recorded_profiles_read_back);
    tcase_add_test(t, test_profile_says_whether_swap_ins_run_alone);
    tcase_add_test(t, test_link_bandwidth_survives_a_slow_sample);
    suite_add_tcase(s, t);
    return s;
}
