/* SPDX-License-Identifier: MIT */
/* check_recompute.c: recompute. While recording, the shim verifies by checksum which kernel
 * launches reproduce the buffer they write (profiles/FORMAT.md, `producers`), refuses those that
 * do not (a result that changes from launch to launch, a launch that reads its output), and when
 * replaying a plan that drops and recomputes buffers it rebuilds them by re-launching their
 * producers: the program's checksum stays the oracle's, bit for bit, while the statistics show
 * buffers given up without a copy and rebuilt. The simulated device fills new memory with 0xff,
 * so a rebuild that did not happen would show in the checksum. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testutil.h"

Suite *suite_recompute(void);

/* Runs build/<name> with argv `args` (NULL-terminated) and the extra environment. */
static tu_result_t run(const char *name, const char *const *args, int shim,
                       const char *const *extra) {
    return tu_run_prog(name, args, shim, extra, 300);
}

/* A profile's ops.tsv or buffers.tsv as rows of tab-separated fields (the two header lines
 * skipped). */
typedef struct table {
    char *text;
    char **rows;
    size_t n;
} table_t;

static table_t read_table(const char *dir, const char *file) {
    char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    FILE *f = fopen(path, "r");
    ck_assert_msg(f != NULL, "%s is missing", path);
    table_t t = {NULL, NULL, 0};
    size_t cap = 1 << 16, len = 0;
    t.text = malloc(cap);
    ck_assert_ptr_nonnull(t.text);
    size_t k;
    while ((k = fread(t.text + len, 1, cap - len - 1, f)) > 0) {
        len += k;
        if (len + 1 == cap) {
            cap *= 2;
            t.text = realloc(t.text, cap);
            ck_assert_ptr_nonnull(t.text);
        }
    }
    fclose(f);
    t.text[len] = 0;
    t.rows = calloc(len / 2 + 1, sizeof *t.rows);
    ck_assert_ptr_nonnull(t.rows);
    int line = 0;
    for (char *p = strtok(t.text, "\n"); p; p = strtok(NULL, "\n"))
        if (line++ >= 2)
            t.rows[t.n++] = p;
    return t;
}

static void free_table(table_t *t) {
    free(t->text);
    free(t->rows);
}

/* Field i (from 0) of a row, copied into buf. */
static const char *field(const char *row, int i, char *buf, size_t len) {
    const char *p = row;
    for (; i > 0 && p; i--) {
        p = strchr(p, '\t');
        if (p)
            p++;
    }
    ck_assert_ptr_nonnull(p);
    size_t n = strcspn(p, "\t");
    snprintf(buf, len, "%.*s", (int)(n < len ? n : len - 1), p);
    return buf;
}

/* The access op row `op` makes to buffer `buf` ("r", "w", "rw"), or "" when it does not use it. */
static const char *access_of(const char *oprow, long buf, char *out, size_t len) {
    char refs[4096];
    field(oprow, 6, refs, sizeof refs);
    out[0] = 0;
    for (char *p = refs; *p;) {
        char *end;
        long b = strtol(p, &end, 10);
        ck_assert(*end == ':');
        size_t n = strcspn(end + 1, ",@"); /* the access, without the word after @ */
        if (b == buf)
            snprintf(out, len, "%.*s", (int)n, end + 1);
        p = end + 1 + strcspn(end + 1, ",");
        if (*p == ',')
            p++;
    }
    return out;
}

static char *tmpdir(void) {
    static char dirs[8][64];
    static int next;
    char *d = dirs[next++ % 8];
    snprintf(d, 64, "/tmp/ooc-recompute-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(d));
    return d;
}

static void rmdir_all(const char *dir) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    ck_assert_int_eq(system(cmd), 0);
}

/* The perceptron with ReLU out of place: its activations are rebuilt from the pre-activations
 * that the backward pass keeps (the in-place variant leaves nothing a producer could rebuild). */
static const char *const MLP_ARGS[] = {"--iters", "10", "--layers", "12", "--relu-copy", NULL};

START_TEST(test_profile_names_verified_producers) {
    const char *dir = tmpdir();
    char pdir[96];
    snprintf(pdir, sizeof pdir, "OOC_PROFILE_DIR=%s", dir);
    const char *env[] = {
        "FAKECUDA_SCHED=inline", "OOC_MODE=record", "OOC_BUDGET=1G", "OOC_STATS=1", pdir, NULL};
    static const char *const args[] = {"--iters", "6", "--layers", "4", "--relu-copy", NULL};
    tu_result_t r = run("workloads/mlp", args, 1, env);
    ck_assert_msg(r.status == 0, "%s", r.err);
    ck_assert_msg(tu_stat_row(r.err, "producers verified by checksum") > 0, "%s", r.err);
    ck_assert_int_eq(tu_stat_row(r.err, "producers refused by checksum"), 0);
    table_t bufs = read_table(dir, "buffers.tsv"), ops = read_table(dir, "ops.tsv");
    int with = 0, relu = 0;
    char f[4096], acc[16];
    for (size_t i = 0; i < bufs.n; i++) {
        field(bufs.rows[i], 6, f, sizeof f);
        if (strcmp(f, "-") == 0)
            continue;
        with++;
        long b = strtol(field(bufs.rows[i], 0, f, sizeof f), NULL, 10);
        ck_assert_str_eq(field(bufs.rows[i], 4, f, sizeof f), "0"); /* not persistent */
        long alloc = strtol(field(bufs.rows[i], 2, f, sizeof f), NULL, 10);
        long prod = strtol(field(bufs.rows[i], 6, f, sizeof f), NULL, 10);
        ck_assert(alloc >= 0 && prod >= alloc && (size_t)prod < ops.n);
        /* The producer is the buffer's first user, writes all of it and only reads the rest;
         * every later op only reads it. */
        for (long k = alloc; k < prod; k++)
            ck_assert_str_eq(access_of(ops.rows[k], b, acc, sizeof acc), "");
        ck_assert_str_eq(field(ops.rows[prod], 2, f, sizeof f), "kernel");
        ck_assert_str_eq(access_of(ops.rows[prod], b, acc, sizeof acc), "w");
        char refs[4096];
        field(ops.rows[prod], 6, refs, sizeof refs);
        ck_assert_msg(strstr(refs, ":rw") == NULL, "producer %ld of %ld: %s", prod, b, refs);
        ck_assert_ptr_nonnull(strstr(refs, ":w"));
        for (size_t k = (size_t)prod + 1; k < ops.n; k++) {
            access_of(ops.rows[k], b, acc, sizeof acc);
            ck_assert_msg(acc[0] == 0 || strcmp(acc, "r") == 0, "op %zu changes buffer %ld (%s)", k,
                          b, acc);
        }
        relu += strcmp(field(ops.rows[prod], 3, f, sizeof f), "relu_f32") == 0;
    }
    /* The three hidden activations are rebuilt from their pre-activations; the pre-activations
     * themselves are not (the bias is added in place after the GEMM that writes them). */
    ck_assert_int_ge(relu, 3);
    ck_assert_int_ge(with, relu);
    free_table(&bufs);
    free_table(&ops);
    tu_result_free(&r);
    rmdir_all(dir);
}
END_TEST

START_TEST(test_nondeterministic_producers_are_refused) {
    const char *dir = tmpdir();
    char pdir[96];
    snprintf(pdir, sizeof pdir, "OOC_PROFILE_DIR=%s", dir);
    const char *env[] = {
        "FAKECUDA_SCHED=threaded", "OOC_MODE=record", "OOC_BUDGET=1G", "OOC_STATS=1", pdir, NULL};
    tu_result_t r = run("test/progs/rcprog", NULL, 1, env);
    ck_assert_msg(r.status == 0, "%s", r.err);
    ck_assert_msg(tu_stat_row(r.err, "producers refused by checksum") >= 2, "%s", r.err);
    ck_assert_msg(tu_stat_row(r.err, "producers verified by checksum") >= 1, "%s", r.err);
    table_t bufs = read_table(dir, "buffers.tsv"), ops = read_table(dir, "ops.tsv");
    char f[256], name[64];
    int copy = 0, noisy = 0, acc_own = 0;
    for (size_t i = 0; i < bufs.n; i++) {
        field(bufs.rows[i], 6, f, sizeof f);
        long b = (long)i;
        /* The op that first uses this buffer. */
        for (size_t k = 0; k < ops.n; k++) {
            char a[16];
            if (access_of(ops.rows[k], b, a, sizeof a)[0] == 0)
                continue;
            field(ops.rows[k], 3, name, sizeof name);
            if (strcmp(name, "noisy_fill_f32") == 0) {
                noisy++;
                ck_assert_msg(strcmp(f, "-") == 0, "a nondeterministic producer was kept");
            } else if (strcmp(name, "accumulate_f32") == 0) {
                acc_own++;
                ck_assert_msg(strcmp(f, "-") == 0, "a producer that reads its output was kept");
            } else if (strcmp(name, "copy_f32") == 0 && strcmp(f, "-") != 0) {
                copy++;
                ck_assert_int_eq(strtol(f, NULL, 10), (long)k);
            }
            break;
        }
    }
    ck_assert_int_eq(noisy, 1);
    ck_assert_int_ge(acc_own, 1);
    ck_assert_int_eq(copy, 1);
    free_table(&bufs);
    free_table(&ops);
    tu_result_free(&r);
    rmdir_all(dir);
}
END_TEST

/* The layout of rcprog --addrs's small buffers: per iteration and buffer, its offset inside its
 * chunk and which of the iteration's buffers before it share that chunk (a bit each). */
#define RC_ITERS 8
static void rc_layout(const char *text, long long lay[RC_ITERS][4][2]) {
    const long long chunk = 2 << 20; /* the default OOC_CHUNK */
    int seen = 0;
    for (const char *p = strstr(text, "addrs "); p; p = strstr(p + 1, "addrs ")) {
        int it;
        long long o[4];
        ck_assert_int_eq(
            sscanf(p, "addrs %d: %lld %lld %lld %lld", &it, &o[0], &o[1], &o[2], &o[3]), 5);
        ck_assert(it >= 0 && it < RC_ITERS);
        for (int k = 0; k < 4; k++) {
            lay[it][k][0] = o[k] % chunk;
            lay[it][k][1] = 0;
            for (int j = 0; j < k; j++)
                lay[it][k][1] |= (long long)(o[j] / chunk == o[k] / chunk) << j;
        }
        seen++;
    }
    ck_assert_int_eq(seen, RC_ITERS);
}

/* Recording verifies producers with checksums and scratch buffers of the shim's own; those must
 * not land among the program's small buffers. Interleaved, they spread the program's buffers
 * over more chunks than in demand mode, and an op touching many small buffers (PyTorch's
 * foreach optimizer step, on a GPU: 56 chunks where the budget held 52) then fails as out of
 * memory while recording where demand mode ran. Each small buffer sits at the same place in its
 * chunk, beside the same neighbours, recording or not. */
START_TEST(test_recording_leaves_the_program_layout_alone) {
    long long base[RC_ITERS][4][2], rec[RC_ITERS][4][2];
    static const char *const args[] = {"--addrs", NULL};
    const char *denv[] = {"FAKECUDA_SCHED=inline", "OOC_MODE=demand", "OOC_BUDGET=64M", NULL};
    tu_result_t d = run("test/progs/rcprog", args, 1, denv);
    ck_assert_msg(d.status == 0, "%s", d.err);
    rc_layout(d.out, base);
    static const char *const modes[] = {"OOC_MODE=record", "OOC_MODE=auto"};
    for (int m = 0; m < 2; m++) {
        const char *dir = tmpdir();
        char pdir[96];
        snprintf(pdir, sizeof pdir, "OOC_PROFILE_DIR=%s", dir);
        const char *env[] = {"FAKECUDA_SCHED=inline", modes[m], "OOC_BUDGET=64M",
                             "OOC_STATS=1",           pdir,     NULL};
        tu_result_t r = run("test/progs/rcprog", args, 1, env);
        ck_assert_msg(r.status == 0, "%s", r.err);
        ck_assert_msg(tu_stat_row(r.err, "producers verified by checksum") >= 1, "%s", r.err);
        rc_layout(r.out, rec);
        for (int it = 0; it < RC_ITERS; it++)
            for (int k = 0; k < 4; k++)
                ck_assert_msg(rec[it][k][0] == base[it][k][0] && rec[it][k][1] == base[it][k][1],
                              "%s: iteration %d buffer %d at +%lld, sharing its chunk with 0x%llx; "
                              "in demand mode +%lld, with 0x%llx",
                              modes[m], it, k, rec[it][k][0], rec[it][k][1], base[it][k][0],
                              base[it][k][1]);
        ck_assert_str_eq(strstr(r.out, "checksum:"), strstr(d.out, "checksum:"));
        tu_result_free(&r);
        rmdir_all(dir);
    }
    tu_result_free(&d);
}
END_TEST

/* One staleprog run with the shim in auto mode, its statistics and info log, in a fresh profile
 * folder (removed after), with `sched`, `safe` and the NULL-ended `extra` settings: it must end
 * well with `base`'s checksum. The caller frees the result. */
static tu_result_t stale_run(const char *const *args, const char *sched, const char *safe,
                             const char *const *extra, const tu_result_t *base) {
    const char *dir = tmpdir();
    char pdir[96];
    snprintf(pdir, sizeof pdir, "OOC_PROFILE_DIR=%s", dir);
    const char *env[16] = {sched, safe, "OOC_MODE=auto", "OOC_STATS=1", "OOC_LOG=info", pdir};
    size_t n = 6;
    for (size_t i = 0; extra[i] && n < 15; i++)
        env[n++] = extra[i];
    env[n] = NULL;
    tu_result_t r = run("test/progs/staleprog", args, 1, env);
    rmdir_all(dir);
    ck_assert_msg(r.status == 0, "%s %s: %s", sched, safe, tu_tail(r.err, 3000));
    ck_assert_str_eq(strstr(r.out, "checksum:"), strstr(base->out, "checksum:"));
    return r;
}

/* A kernel parameter holding a stale pointer, as cuDNN's parameter blocks do on a GPU
 * (staleprog): dangling in some iterations and pointing into a live temporary the kernel never
 * reads in the others, in no repeating order; with --moved, one fixed address that the reuse of
 * freed memory puts inside one buffer or another, at another offset. Once the word has been seen
 * dangling, or keeping its value while the buffer under it changed, its buffers are no part of
 * the launch's identity: the iteration is found and replayed without divergence, and the bytes
 * are the program's own. Without weak words a false period was found, diverged and was recorded
 * again, and nothing was found after. Safe mode on and off, inline and threaded. */
START_TEST(test_a_stale_parameter_word_does_not_hide_the_iteration) {
    static const char *const sched[] = {"FAKECUDA_SCHED=inline", "FAKECUDA_SCHED=threaded"};
    static const char *const safe[] = {"OOC_SAFE=on", "OOC_SAFE=off"};
    static const char *const plain[] = {NULL}, *const moved[] = {"--moved", NULL};
    for (int v = 0; v < 2; v++) {
        const char *const *args = v ? moved : plain;
        const char *why = v ? "kept its value while the buffer there changed"
                            : "held an address with no buffer there";
        tu_result_t o = run("test/progs/staleprog", args, 0, NULL);
        ck_assert_msg(o.status == 0, "%s", o.err);
        for (int k = 0; k < 4; k++) {
            static const char *const extra[] = {"OOC_BUDGET=64M", "OOC_PROFILE_ITERS=2",
                                                "OOC_REUSE=1", NULL};
            tu_result_t r = stale_run(args, sched[k & 1], safe[k >> 1], extra, &o);
            char line[160];
            snprintf(line, sizeof line, "copy_hint_f32: parameter byte 24 %s", why);
            ck_assert_msg(strstr(r.err, line) != NULL, "%s", tu_tail(r.err, 3000));
            /* 24 iterations of 12 (14) ops: found within the first 10. */
            ck_assert_msg(tu_stat_row(r.err, "operations run as planned") >= 12 * 12, "%s %s %s",
                          args[0] ? args[0] : "", sched[k & 1], tu_tail(r.err, 3000));
            ck_assert_int_eq(tu_stat_row(r.err, "divergences from the plan"), 0);
            ck_assert_int_eq(tu_stat_row(r.err, "re-recordings after divergence"), 0);
            tu_result_free(&r);
        }
        tu_result_free(&o);
    }
}
END_TEST

/* A parameter word that held no address while the shim recorded and planned, and from then on
 * the address of a live temporary the kernel never reads, in some iterations (staleprog --late,
 * as stale bytes of PyTorch's reduction kernels' parameter blocks did on an H200): the replayed
 * op has a buffer more than the plan's. With --wander the word pointed into one temporary while
 * recording and into another of another size later: the plan's op has a buffer the live op has
 * not, and the live op one the plan's has not. With --shared it pointed into a temporary while
 * recording and later, in some iterations, into a buffer another word of the launch names: the
 * live op has one buffer fewer (as PyTorch's reduction kernel on an H200, safe mode off); the
 * profile names the word the plan's buffer was found through. The replay marks the word weak and
 * goes on: no divergence, no recording again, the program's bytes. Without it each such
 * iteration diverged, and three in a row recorded again, on the GPU for the whole run. */
START_TEST(test_a_word_that_points_only_after_the_plan_is_made_weak) {
    static const char *const sched[] = {"FAKECUDA_SCHED=inline", "FAKECUDA_SCHED=threaded"};
    static const char *const safe[] = {"OOC_SAFE=on", "OOC_SAFE=off"};
    static const char *const late[] = {"--iters", "32", "--late", NULL};
    static const char *const wander[] = {"--iters", "32", "--wander", NULL};
    static const char *const shared[] = {"--iters", "32", "--shared", NULL};
    for (int k = 0; k < 12; k++) {
        const char *const *args = k < 4 ? late : k < 8 ? wander : shared;
        tu_result_t o = run("test/progs/staleprog", args, 0, NULL);
        ck_assert_msg(o.status == 0, "%s", o.err);
        static const char *const extra[] = {"OOC_BUDGET=64M", "OOC_PROFILE_ITERS=2", NULL};
        tu_result_t r = stale_run(args, sched[k & 1], safe[(k >> 1) & 1], extra, &o);
        ck_assert_msg(tu_stat_row(r.err, "divergences from the plan") == 0 &&
                          tu_stat_row(r.err, "re-recordings after divergence") == 0,
                      "%s %s %s: %s", args[2], sched[k & 1], safe[(k >> 1) & 1],
                      tu_tail(r.err, 3000));
        const char *said = k < 8 ? "copy_hint_f32: parameter byte 24 pointed into a buffer that "
                                   "the plan's operation at this place does not use"
                                 : "copy_hint_f32: parameter byte 24 pointed, when the iteration "
                                   "was recorded, into a buffer that the operation at this place "
                                   "no longer uses";
        ck_assert_msg(strstr(r.err, said) != NULL, "%s %s %s: %s", args[2], sched[k & 1],
                      safe[(k >> 1) & 1], tu_tail(r.err, 3000));
        ck_assert_int_eq(tu_stat_row(r.err, "parameter words found stale by the replay"), 1);
        /* 32 iterations of 12 ops: planned from the 8th at the latest. */
        ck_assert_msg(tu_stat_row(r.err, "operations run as planned") >= 20 * 12, "%s",
                      tu_tail(r.err, 3000));
        tu_result_free(&r);
        tu_result_free(&o);
    }
}
END_TEST

/* A plan word that cannot be marked weak (beyond the first 4096 parameter bytes, as only an
 * edited profile can have: the profile of a staleprog --wander recording with the hint's word
 * moved from byte 24 to 4104) fails the match with nothing marked. The live op's own word into
 * the other temporary is left as it was: marked first, it made the op lose the temporary from
 * its identity in the iterations that did match (every later one diverged). The replay diverges
 * where the hint wanders, records again, and the bytes are the program's. */
START_TEST(test_a_plan_word_that_cannot_be_marked_marks_nothing) {
    static const char *const rec_args[] = {"--iters", "10", "--wander", NULL};
    static const char *const args[] = {"--iters", "32", "--wander", NULL};
    static const char *const cfg[][2] = {{"FAKECUDA_SCHED=inline", "OOC_SAFE=on"},
                                         {"FAKECUDA_SCHED=threaded", "OOC_SAFE=off"}};
    tu_result_t o = run("test/progs/staleprog", args, 0, NULL);
    ck_assert_msg(o.status == 0, "%s", o.err);
    for (int k = 0; k < 2; k++) {
        const char *dir = tmpdir();
        char pdir[96], plan[96], cmd[256];
        snprintf(pdir, sizeof pdir, "OOC_PROFILE_DIR=%s", dir);
        const char *rec_env[] = {
            cfg[k][0], cfg[k][1], "OOC_MODE=auto", "OOC_BUDGET=64M", "OOC_PROFILE_ITERS=2",
            pdir,      NULL};
        tu_result_t r = run("test/progs/staleprog", rec_args, 1, rec_env);
        ck_assert_msg(r.status == 0, "%s", tu_tail(r.err, 3000));
        tu_result_free(&r);
        snprintf(cmd, sizeof cmd,
                 "grep -q 'copy_hint_f32.*@24$' '%s/ops.tsv' && "
                 "sed -i '/copy_hint_f32/s/@24$/@4104/' '%s/ops.tsv'",
                 dir, dir);
        ck_assert_msg(system(cmd) == 0, "%s/ops.tsv: no copy_hint_f32 row ending in @24", dir);
        snprintf(plan, sizeof plan, "OOC_PLAN=%s/plan.tsv", dir);
        const char *env[] = {
            cfg[k][0], cfg[k][1], "OOC_MODE=auto", "OOC_BUDGET=64M", "OOC_STATS=1", "OOC_LOG=info",
            plan,      NULL};
        r = run("test/progs/staleprog", args, 1, env);
        rmdir_all(dir);
        ck_assert_msg(r.status == 0, "%s", tu_tail(r.err, 3000));
        ck_assert_str_eq(strstr(r.out, "checksum:"), strstr(o.out, "checksum:"));
        const char *div = strstr(r.err, "does not match the plan's (copy_hint_f32)");
        ck_assert_msg(div != NULL, "%s %s: the wandering hint never diverged: %s", cfg[k][0],
                      cfg[k][1], tu_tail(r.err, 3000));
        const char *mark = strstr(r.err, "copy_hint_f32: parameter byte 24 pointed into");
        ck_assert_msg(mark == NULL || mark > div,
                      "%s %s: the live word was marked weak before the match failed: %s", cfg[k][0],
                      cfg[k][1], tu_tail(r.err, 3000));
        ck_assert_ptr_null(strstr(r.err, "parameter byte 4104"));
        tu_result_free(&r);
    }
    tu_result_free(&o);
}
END_TEST

/* In safe mode a stale word's buffer stays where it is (staleprog --cold: the hint, weak from
 * the first iteration, points into an 8 MiB buffer that the 8 MiB budget cannot hold beside the
 * op's own buffers): its chunks resident or aliased to their host copies are left in place, and
 * the op runs, with the program's bytes. Making them resident, as outside safe mode, ends the
 * run with the shim's out-of-memory report (an H200 brought back 784 MiB activations this way). */
START_TEST(test_a_stale_word_leaves_its_buffer_in_place_in_safe_mode) {
    static const char *const sched[] = {"FAKECUDA_SCHED=inline", "FAKECUDA_SCHED=threaded"};
    static const char *const args[] = {"--iters", "12", "--cold", NULL};
    tu_result_t o = run("test/progs/staleprog", args, 0, NULL);
    ck_assert_msg(o.status == 0, "%s", o.err);
    for (int k = 0; k < 2; k++) {
        static const char *const extra[] = {"OOC_BUDGET=8M", NULL};
        tu_result_t r = stale_run(args, sched[k], "OOC_SAFE=on", extra, &o);
        ck_assert_ptr_nonnull(
            strstr(r.err, "copy_hint_f32: parameter byte 24 held an address with no buffer there"));
        ck_assert_int_gt(tu_stat_row(r.err, "safe mode: stale words' chunks left in place"), 0);
        tu_result_free(&r);
    }
    tu_result_free(&o);
}
END_TEST

/* The environment of a run at `budget` bytes: the timing model with a slow link (2 Gbit/s each
 * way), so that swapping costs more than re-launching a ReLU and the planner recomputes. */
typedef struct envs {
    char cap[64], budget[64], sched[64], jit[64], seed[64], pdir[96], plan[128];
    const char *v[24];
} envs_t;

static const char *const *make_env(envs_t *e, unsigned long long budget, const char *sched,
                                   unsigned seed, const char *dir, const char *mode,
                                   const char *plan) {
    snprintf(e->cap, sizeof e->cap, "FAKECUDA_MEM_BYTES=%llu", budget);
    snprintf(e->budget, sizeof e->budget, "OOC_BUDGET=%llu", budget);
    snprintf(e->sched, sizeof e->sched, "FAKECUDA_SCHED=%s", sched);
    snprintf(e->jit, sizeof e->jit, "FAKECUDA_JITTER_US=%u", seed ? 20u : 0u);
    snprintf(e->seed, sizeof e->seed, "FAKECUDA_SEED=%u", seed ? seed : 1u);
    snprintf(e->pdir, sizeof e->pdir, "OOC_PROFILE_DIR=%s", dir);
    size_t n = 0;
    e->v[n++] = e->cap;
    e->v[n++] = e->budget;
    e->v[n++] = e->sched;
    e->v[n++] = e->jit;
    e->v[n++] = e->seed;
    e->v[n++] = e->pdir;
    e->v[n++] = mode;
    e->v[n++] = "OOC_STATS=1";
    e->v[n++] = "OOC_CHUNK=64K";
    e->v[n++] = "FAKECUDA_GRANULARITY=64K";
    e->v[n++] = "FAKECUDA_HOST_VMM=1";
    e->v[n++] = "FAKECUDA_TIMING=1";
    e->v[n++] = "FAKECUDA_H2D_GBPS=0.25";
    e->v[n++] = "FAKECUDA_D2H_GBPS=0.25";
    if (plan) {
        snprintf(e->plan, sizeof e->plan, "OOC_PLAN=%s", plan);
        e->v[n++] = e->plan;
    }
    e->v[n] = NULL;
    return e->v;
}

/* Runs ooc-plan on profile `dir`; 0 when it wrote plan `out` and that plan recomputes. */
static int plan_with_recompute(const char *dir, const char *policy, unsigned long long budget,
                               const char *out) {
    char b[64], pol[64];
    snprintf(b, sizeof b, "%llu", budget);
    snprintf(pol, sizeof pol, "%s", policy);
    const char *argv[] = {tu_build_path("ooc-plan"),
                          "--policy",
                          pol,
                          "--budget",
                          b,
                          "--chunk",
                          "64K",
                          "--out",
                          out,
                          dir,
                          NULL};
    tu_proc_t p;
    ck_assert_int_eq(tu_run(argv, NULL, 120, &p), 0);
    int ok = p.status == 0;
    tu_proc_free(&p);
    if (!ok)
        return -1;
    FILE *f = fopen(out, "r");
    if (!f)
        return -1;
    char line[256];
    int rc = -1;
    while (fgets(line, sizeof line, f))
        if (strncmp(line, "before\t", 7) == 0 && strstr(line, "\trecompute\t"))
            rc = 0;
    fclose(f);
    return rc;
}

/* At 1/div of the oracle's peak: records the workload, has the planner make a plan that
 * recomputes (auto, else pooch, at the largest budget under the run's, in steps of 1/32, where
 * one does: which budgets do depends on the recorded durations), and
 * replays it inline and threaded with jitter: the oracle's checksum, and buffers rebuilt. */
static void recompute_at(unsigned div) {
    static const char *const oenv[] = {"FAKECUDA_SCHED=inline", NULL};
    tu_result_t ref = run("workloads/mlp", MLP_ARGS, 0, oenv);
    ck_assert_msg(ref.status == 0, "%s", ref.err);
    unsigned long long budget = ref.peak / div;
    const char *dir = tmpdir();
    envs_t e;
    tu_result_t rec = run("workloads/mlp", MLP_ARGS, 1,
                          make_env(&e, budget, "inline", 0, dir, "OOC_MODE=record", NULL));
    ck_assert_msg(rec.status == 0 && strcmp(rec.checksum, ref.checksum) == 0, "record: %s",
                  rec.err);
    ck_assert_msg(tu_stat_row(rec.err, "producers verified by checksum") > 0, "%s", rec.err);
    char plan[128];
    snprintf(plan, sizeof plan, "%s/plan-recompute.tsv", dir);
    int found = -1;
    unsigned long long pb = budget;
    static const char *const pols[] = {"auto", "pooch"};
    for (int k = 32; k >= 12 && found != 0; k--)
        for (int p = 0; p < 2 && found != 0; p++) {
            pb = budget * (unsigned long long)k / 32;
            found = plan_with_recompute(dir, pols[p], pb, plan);
        }
    ck_assert_msg(found == 0, "no plan recomputes at 1/%u of the peak", div);
    /* Replayed under the plan's budget (plus the slab chunk and one of slack, as the shim plans
     * for itself), so that the memory it counts as given up by a drop is needed. */
    unsigned long long rb = pb + 2 * (64ull << 10);
    if (rb < budget)
        budget = rb;
    static const char *const scheds[] = {"inline", "threaded"};
    for (int s = 0; s < 2; s++) {
        unsigned seed = s ? (unsigned)(tu_seed("recompute_at") % 1000) + 1 : 0;
        tu_result_t r = run("workloads/mlp", MLP_ARGS, 1,
                            make_env(&e, budget, scheds[s], seed, dir, "OOC_MODE=auto", plan));
        ck_assert_msg(r.status == 0, "1/%u %s: status %d\n%s", div, scheds[s], r.status, r.err);
        ck_assert_msg(strcmp(r.checksum, ref.checksum) == 0,
                      "1/%u %s (seed %u): checksum %s, oracle %s\n%s", div, scheds[s], seed,
                      r.checksum, ref.checksum, r.err);
        long long rebuilt = tu_stat_row(r.err, "recomputations");
        long long dropped = tu_stat_row(r.err, "buffers dropped to be rebuilt");
        long long lost = tu_stat_row(r.err, "chunks released without a copy (rebuildable)");
        ck_assert_msg(rebuilt > 0 && dropped >= rebuilt && lost > 0,
                      "1/%u %s: nothing was rebuilt (rebuilt %lld, dropped %lld, chunks given up "
                      "%lld)\n%s",
                      div, scheds[s], rebuilt, dropped, lost, r.err);
        ck_assert_int_eq(tu_stat_row(r.err, "producer re-launches to rebuild buffers"), rebuilt);
        tu_result_free(&r);
    }
    tu_result_free(&rec);
    tu_result_free(&ref);
    rmdir_all(dir);
}

START_TEST(test_replay_rebuilds_dropped_buffers_at_quarter_budget) {
    recompute_at(4);
}
END_TEST

START_TEST(test_replay_rebuilds_dropped_buffers_at_eighth_budget) {
    recompute_at(8);
}
END_TEST

/* A plan that recomputes a buffer whose producers the profile does not name (a saved plan may
 * say anything) is replayed without giving the buffer up: nothing is rebuilt, nothing is lost. */
START_TEST(test_unverified_recompute_is_not_replayed) {
    static const char *const oenv[] = {"FAKECUDA_SCHED=inline", NULL};
    tu_result_t ref = run("workloads/mlp", MLP_ARGS, 0, oenv);
    unsigned long long budget = ref.peak / 4;
    const char *dir = tmpdir();
    envs_t e;
    tu_result_t rec = run("workloads/mlp", MLP_ARGS, 1,
                          make_env(&e, budget, "inline", 0, dir, "OOC_MODE=record", NULL));
    ck_assert_int_eq(rec.status, 0);
    char plan[128], cmd[512];
    snprintf(plan, sizeof plan, "%s/plan-recompute.tsv", dir);
    int found = -1;
    static const char *const pols[] = {"auto", "pooch"};
    for (int k = 32; k >= 12 && found != 0; k--)
        for (int p = 0; p < 2 && found != 0; p++)
            found = plan_with_recompute(dir, pols[p], budget * (unsigned long long)k / 32, plan);
    ck_assert_int_eq(found, 0);
    /* The profile loses its producers column's contents: no producer is verified any more. */
    snprintf(cmd, sizeof cmd,
             "awk -F'\\t' 'BEGIN{OFS=\"\\t\"} NR>2{$7=\"-\"} {print}' %s/buffers.tsv > %s/b.tmp "
             "&& mv %s/b.tmp %s/buffers.tsv",
             dir, dir, dir, dir);
    ck_assert_int_eq(system(cmd), 0);
    tu_result_t r = run("workloads/mlp", MLP_ARGS, 1,
                        make_env(&e, budget, "threaded", 5, dir, "OOC_MODE=auto", plan));
    ck_assert_msg(r.status == 0 && strcmp(r.checksum, ref.checksum) == 0, "%s", r.err);
    ck_assert_int_eq(tu_stat_row(r.err, "recomputations"), 0);
    ck_assert_int_eq(tu_stat_row(r.err, "buffers dropped to be rebuilt"), 0);
    ck_assert_int_eq(tu_stat_row(r.err, "chunks released without a copy (rebuildable)"), 0);
    tu_result_free(&r);
    tu_result_free(&rec);
    tu_result_free(&ref);
    rmdir_all(dir);
}
END_TEST

Suite *suite_recompute(void) {
    Suite *s = suite_create("recompute");
    TCase *tc = tcase_create("recompute");
    tcase_set_timeout(tc, 900);
    tcase_add_test(tc, test_profile_names_verified_producers);
    tcase_add_test(tc, test_nondeterministic_producers_are_refused);
    tcase_add_test(tc, test_recording_leaves_the_program_layout_alone);
    tcase_add_test(tc, test_a_stale_parameter_word_does_not_hide_the_iteration);
    tcase_add_test(tc, test_a_word_that_points_only_after_the_plan_is_made_weak);
    tcase_add_test(tc, test_a_plan_word_that_cannot_be_marked_marks_nothing);
    tcase_add_test(tc, test_a_stale_word_leaves_its_buffer_in_place_in_safe_mode);
    tcase_add_test(tc, test_replay_rebuilds_dropped_buffers_at_quarter_budget);
    tcase_add_test(tc, test_replay_rebuilds_dropped_buffers_at_eighth_budget);
    tcase_add_test(tc, test_unverified_recompute_is_not_replayed);
    suite_add_tcase(s, tc);
    return s;
}
