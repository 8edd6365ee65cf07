/* SPDX-License-Identifier: MIT */
/* check_profile.c: the profile and plan files (profiles/FORMAT.md): round trips through the
 * writer and the reader, and malformed inputs rejected with file, line and field named. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ooc_planner.h"
#include "testutil.h"

Suite *suite_profile(void);

#define REF "profiles/synthetic/resnet50-batch64"

/* A fresh empty directory under the build tree. */
static const char *tmpdir(const char *name) {
    static char path[4][4096];
    static int slot;
    char *p = path[slot++ % 4];
    snprintf(p, sizeof path[0], "%s/tmp/check_profile-%d-%s", tu_build_dir(), (int)getpid(), name);
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", p, p);
    ck_assert_int_eq(system(cmd), 0);
    return p;
}

static void assert_same_profile(const ooc_profile_t *a, const ooc_profile_t *b) {
    ck_assert_str_eq(a->program, b->program);
    ck_assert_str_eq(a->device, b->device);
    ck_assert_uint_eq(a->device_mem_bytes, b->device_mem_bytes);
    ck_assert_uint_eq(a->budget_bytes, b->budget_bytes);
    ck_assert_uint_eq(a->chunk_bytes, b->chunk_bytes);
    ck_assert(a->h2d_bps == b->h2d_bps && a->d2h_bps == b->d2h_bps && a->bidir_bps == b->bidir_bps);
    ck_assert_uint_eq(a->iterations, b->iterations);
    ck_assert_uint_eq(a->swapin_exclusive, b->swapin_exclusive);
    ck_assert_uint_eq(a->swapout_exclusive, b->swapout_exclusive);
    ck_assert_uint_eq(a->remap_gate, b->remap_gate);
    ck_assert_uint_eq(a->swapin_vmm_ns, b->swapin_vmm_ns);
    ck_assert_uint_eq(a->swapout_vmm_ns, b->swapout_vmm_ns);
    ck_assert_uint_eq(a->map_vmm_ns, b->map_vmm_ns);
    ck_assert_uint_eq(a->unmap_vmm_ns, b->unmap_vmm_ns);
    ck_assert_uint_eq(a->stage_vmm_ns, b->stage_vmm_ns);
    ck_assert_uint_eq(a->adopt_vmm_ns, b->adopt_vmm_ns);
    ck_assert_uint_eq(a->nops, b->nops);
    ck_assert_uint_eq(a->nbufs, b->nbufs);
    for (uint32_t i = 0; i < a->nbufs; i++) {
        const ooc_buffer_t *x = &a->bufs[i], *y = &b->bufs[i];
        ck_assert_uint_eq(x->bytes, y->bytes);
        ck_assert_int_eq(x->alloc_idx, y->alloc_idx);
        ck_assert_int_eq(x->free_idx, y->free_idx);
        ck_assert_int_eq(x->persistent, y->persistent);
        ck_assert_str_eq(x->site, y->site);
        ck_assert_uint_eq(x->nprod, y->nprod);
        for (uint32_t k = 0; k < x->nprod; k++)
            ck_assert_int_eq(a->prods[x->prod_off + k], b->prods[y->prod_off + k]);
    }
    for (uint32_t i = 0; i < a->nops; i++) {
        const ooc_op_t *x = &a->ops[i], *y = &b->ops[i];
        ck_assert_int_eq(x->stream, y->stream);
        ck_assert_int_eq(x->kind, y->kind);
        ck_assert_str_eq(x->name, y->name);
        ck_assert_str_eq(x->shape, y->shape);
        ck_assert_uint_eq(x->duration_ns, y->duration_ns);
        ck_assert_uint_eq(x->nref, y->nref);
        for (uint32_t k = 0; k < x->nref; k++) {
            ck_assert_int_eq(a->refs[x->ref_off + k].buf, b->refs[y->ref_off + k].buf);
            ck_assert_int_eq(a->refs[x->ref_off + k].access, b->refs[y->ref_off + k].access);
            ck_assert_int_eq(a->refs[x->ref_off + k].word, b->refs[y->ref_off + k].word);
        }
    }
}

START_TEST(test_reference_profile_round_trips) {
    char err[512] = "";
    ooc_profile_t *a, *b;
    ck_assert_msg(ooc_profile_read(REF, &a, err, sizeof err) == 0, "%s", err);
    ck_assert_uint_gt(a->nops, 100);
    const char *d = tmpdir("ref");
    ck_assert_msg(ooc_profile_write(a, d, err, sizeof err) == 0, "%s", err);
    ck_assert_msg(ooc_profile_read(d, &b, err, sizeof err) == 0, "%s", err);
    assert_same_profile(a, b);
    ooc_profile_free(a);
    ooc_profile_free(b);
}
END_TEST

/* A small profile built through the API, with awkward strings and every op kind. */
static ooc_profile_t *small_profile(void) {
    ooc_profile_t *p = ooc_profile_new();
    ck_assert_ptr_nonnull(p);
    ck_assert_int_eq(ooc_profile_set_str(&p->program, "python train.py --lr 0.1"), 0);
    ck_assert_int_eq(ooc_profile_set_str(&p->device, "NVIDIA H100 80GB HBM3"), 0);
    p->device_mem_bytes = 80ull << 30;
    p->budget_bytes = 1 << 20;
    p->chunk_bytes = 1 << 16;
    p->h2d_bps = 1.25e10;
    p->d2h_bps = 2.5e10 / 3;
    p->iterations = 3;
    int32_t prod0 = 0;
    ck_assert_int_eq(ooc_profile_add_buffer(p, 4096, -1, -1, 1, "model.py:12 weight", NULL, 0), 0);
    ck_assert_int_eq(ooc_profile_add_buffer(p, 100000, 0, 2, 0, "", &prod0, 1), 1);
    ck_assert_int_eq(ooc_profile_add_buffer(p, 3, 1, 3, 0, "x", NULL, 0), 2);
    for (int i = 0; i < 4; i++) {
        ooc_ref_t r[2] = {{0, OOC_ACCESS_R, 0},
                          {i == 0 ? 1 : 2, i == 0 ? OOC_ACCESS_W : OOC_ACCESS_RW,
                           (uint16_t)(i == 1 ? 4 : 0)}}; /* found through parameter byte 24 */
        if (i == 2)
            r[1] = (ooc_ref_t){1, OOC_ACCESS_R, 0};
        ck_assert_int_eq(ooc_profile_add_op(p, i % 2, (ooc_op_kind_t)(i + 1), "k\tname",
                                            i ? "grid=(1,1,1) block=(128,1,1)" : NULL,
                                            1000u * (unsigned)(i + 1), r, 2),
                         i);
    }
    return p;
}

/* Writes a to directory d, reads it back and checks that nothing changed. */
static void assert_round_trip(const ooc_profile_t *a, const char *d) {
    char err[512] = "";
    ooc_profile_t *b = NULL;
    ck_assert_msg(ooc_profile_write(a, d, err, sizeof err) == 0, "%s", err);
    ck_assert_msg(ooc_profile_read(d, &b, err, sizeof err) == 0, "%s", err);
    assert_same_profile(a, b);
    ooc_profile_free(b);
}

START_TEST(test_built_profile_round_trips) {
    char err[512] = "";
    ooc_profile_t *a = small_profile(), *b;
    const char *d = tmpdir("small");
    ck_assert_msg(ooc_profile_write(a, d, err, sizeof err) == 0, "%s", err);
    ck_assert_msg(ooc_profile_read(d, &b, err, sizeof err) == 0, "%s", err);
    /* tabs cannot survive a TSV: the writer turns them into spaces */
    ck_assert_str_eq(b->ops[0].name, "k name");
    ck_assert_str_eq(b->ops[0].shape, "-");
    ck_assert_str_eq(b->bufs[1].site, "-");
    ck_assert_uint_eq(b->swapin_exclusive, 0); /* absent: 0 */
    ck_assert_uint_eq(b->swapin_vmm_ns + b->swapout_vmm_ns + b->map_vmm_ns + b->unmap_vmm_ns +
                          b->stage_vmm_ns + b->adopt_vmm_ns,
                      0);
    for (uint32_t i = 0; i < a->nops; i++) {
        free(a->ops[i].name);
        a->ops[i].name = strdup("k name");
    }
    assert_same_profile(a, b);
    ooc_profile_free(b);
    /* safe mode without staging says so; read back */
    a->swapin_exclusive = 1;
    a->swapout_exclusive = 1;
    a->remap_gate = 1;
    a->swapin_vmm_ns = 61234;
    a->swapout_vmm_ns = 78;
    a->map_vmm_ns = 4321;
    a->unmap_vmm_ns = 9;
    assert_round_trip(a, d);
    /* with staging: the staged swap-in's own mapping calls; read back */
    a->swapin_exclusive = 0;
    a->stage_vmm_ns = 90154;
    a->adopt_vmm_ns = 68651;
    assert_round_trip(a, d);
    ooc_profile_free(a);
}
END_TEST

/* Reads the three files of the reference profile into memory. */
typedef struct {
    char *f[3];
    size_t n[3];
} texts_t;

static void load(texts_t *t) {
    static const char *const names[3] = {"meta.tsv", "buffers.tsv", "ops.tsv"};
    for (int i = 0; i < 3; i++) {
        char path[512];
        snprintf(path, sizeof path, "%s/%s", REF, names[i]);
        FILE *f = fopen(path, "rb");
        ck_assert_ptr_nonnull(f);
        fseek(f, 0, SEEK_END);
        long n = ftell(f);
        fseek(f, 0, SEEK_SET);
        t->f[i] = malloc((size_t)n + 1);
        ck_assert_uint_eq(fread(t->f[i], 1, (size_t)n, f), (size_t)n);
        t->f[i][n] = '\0';
        t->n[i] = (size_t)n;
        fclose(f);
    }
}

/* Replaces the first occurrence of `from` in file i with `to`. */
static void edit(texts_t *t, int i, const char *from, const char *to) {
    char *at = strstr(t->f[i], from);
    ck_assert_msg(at != NULL, "'%s' not found", from);
    size_t lf = strlen(from), lt = strlen(to), n = t->n[i] - lf + lt;
    char *nf = malloc(n + 1);
    size_t pre = (size_t)(at - t->f[i]);
    memcpy(nf, t->f[i], pre);
    memcpy(nf + pre, to, lt);
    memcpy(nf + pre + lt, at + lf, t->n[i] - pre - lf + 1);
    free(t->f[i]);
    t->f[i] = nf;
    t->n[i] = n;
}

static const struct {
    int file;
    const char *from, *to, *expect;
} bad_cases[] = {
    {0, "#ooc-profile\tmeta\t1", "#ooc-profile\tmeta\t2", "meta.tsv:1: field version"},
    {0, "chunk_bytes\t2097152", "chunk_bytes\t3000000", "field chunk_bytes"},
    {0, "chunk_bytes\t2097152\n", "", "meta.tsv: field chunk_bytes: missing"},
    {0, "h2d_bps\t5e10", "h2d_bps\tfast", "field h2d_bps"},
    {0, "iterations\t1", "iterations\t1\niterations\t2", "field iterations: given twice"},
    {0, "iterations\t1", "iterations\t1\nswapin_exclusive\t2",
     "field swapin_exclusive: '2' is not 0 or 1"},
    {0, "iterations\t1", "iterations\t1\nswapin_exclusive\t1\nswapin_exclusive\t0",
     "field swapin_exclusive: given twice"},
    {0, "iterations\t1", "iterations\t1\nswapin_vmm_ns\t-3", "field swapin_vmm_ns"},
    {0, "iterations\t1", "iterations\t1\nadopt_vmm_ns\tx", "field adopt_vmm_ns"},
    {0, "iterations\t1", "iterations\t1\nstage_vmm_ns\t99999999999", "field stage_vmm_ns"},
    {0, "iterations\t1", "iterations\t1\nswapout_exclusive\tyes",
     "field swapout_exclusive: 'yes' is not 0 or 1"},
    {0, "iterations\t1", "iterations\t1\nremap_gate\ton", "field remap_gate: 'on' is not 0 or 1"},
    {0, "iterations\t1", "iterations\t1\nremap_gate\t1\nremap_gate\t1",
     "field remap_gate: given twice"},
    {0, "iterations\t1", "iterations\t1\nswapout_vmm_ns\t61000000000",
     "field swapout_vmm_ns: '61000000000' is above a minute per chunk"},
    {0, "iterations\t1", "iterations\t1\nmap_vmm_ns\t2.5", "field map_vmm_ns"},
    {0, "iterations\t1", "iterations\t1\nunmap_vmm_ns\t1\nunmap_vmm_ns\t1",
     "field unmap_vmm_ns: given twice"},
    {0, "iterations\t1", "iterations\t1\nunmap_vmm_ns\t60000000001",
     "field unmap_vmm_ns: '60000000001' is above a minute per chunk"},
    {1, "\n1\t", "\n7\t", "buffers.tsv:4: field id"},
    {1, "id\tbytes", "id\tsize", "buffers.tsv:2: field columns"},
    {1, "\n0\t", "\n0\t-5\t", "buffers.tsv:3: field"},
    {1, "\t-1\t-1\t1\t", "\t-1\t-1\t0\t", "field persistent"},
    {1, "\t-1\t-1\t1\t", "\t-1\t-2\t1\t", "field free_idx"},
    {2, "\n0\t0\tmemcpy", "\n0\t0\tmemcopy", "ops.tsv:3: field kind"},
    {2, "\n1\t0\t", "\n1\tx\t", "ops.tsv:4: field stream"},
    {2, ":r", ":x", "field refs"},
    {2, ":r", ":r,0:r,0:r", "field refs"},
    {2, ":r", ":r@12",
     "field refs: '0:r@12,1:r,3:w' has a parameter byte after '@' that is not a multiple of 8"},
    {2, ":r", ":r@", "field refs: '0:r@,1:r,3:w' has a parameter byte"},
    {2, ":r", ":r@524280", "not a multiple of 8 below 524280"},
    {2, ":r", ":@8", "is not '-' or a list of BUFFER:r|w|rw[@BYTE]"},
    {2, "\n2\t", "\n\n2\t", "ops.tsv:5: empty line"},
    {2, "\n1\t0\t", "\n1\t0\t\t\t\t\t\t\t\t\t\t\t", "ops.tsv:4: too many fields"},
    {2, "\n1\t0\t", "\n1\t0\t\t", "ops.tsv:4: field"},
    {2, "\t-\t", "\t\t", "is empty"},
};

START_TEST(test_malformed_profile_names_file_line_field) {
    int i = _i;
    texts_t t;
    load(&t);
    edit(&t, bad_cases[i].file, bad_cases[i].from, bad_cases[i].to);
    char err[512] = "";
    ooc_profile_t *p = NULL;
    int rc = ooc_profile_parse(t.f[0], t.n[0], t.f[1], t.n[1], t.f[2], t.n[2], &p, err, sizeof err);
    ck_assert_int_eq(rc, OOC_EFORMAT);
    ck_assert_ptr_null(p);
    ck_assert_msg(strstr(err, bad_cases[i].expect) != NULL, "case %d: '%s' lacks '%s'", i, err,
                  bad_cases[i].expect);
    for (int k = 0; k < 3; k++)
        free(t.f[k]);
}
END_TEST

START_TEST(test_reference_to_missing_buffer_is_rejected) {
    ooc_profile_t *p = small_profile();
    char err[256] = "";
    p->refs[1].buf = 99;
    ck_assert_int_eq(ooc_profile_validate(p, err, sizeof err), OOC_EFORMAT);
    ck_assert_msg(strstr(err, "ops.tsv:3: field refs: buffer 99 does not exist"), "%s", err);
    p->refs[1].buf = 2; /* buffer 2 is allocated at op 1: op 0 is outside its lifetime */
    ck_assert_int_eq(ooc_profile_validate(p, err, sizeof err), OOC_EFORMAT);
    ck_assert_msg(strstr(err, "outside its lifetime"), "%s", err);
    ooc_profile_free(p);
}
END_TEST

START_TEST(test_missing_directory_is_an_io_error) {
    char err[512] = "";
    ooc_profile_t *p;
    ck_assert_int_eq(ooc_profile_read("/nonexistent/profile", &p, err, sizeof err), OOC_EIO);
    ck_assert_msg(strstr(err, "/nonexistent/profile/meta.tsv: cannot open"), "%s", err);
}
END_TEST

static void assert_same_plan(const ooc_plan_t *a, const ooc_plan_t *b) {
    ck_assert_str_eq(a->policy, b->policy);
    ck_assert_uint_eq(a->budget_bytes, b->budget_bytes);
    ck_assert_uint_eq(a->chunk_bytes, b->chunk_bytes);
    ck_assert_uint_eq(a->nops, b->nops);
    ck_assert_uint_eq(a->nbufs, b->nbufs);
    ck_assert_uint_eq(a->nacts, b->nacts);
    ck_assert_mem_eq(a->decision, b->decision, a->nbufs);
    ck_assert_mem_eq(a->start_host, b->start_host, a->nbufs);
    for (uint32_t i = 0; i < a->nacts; i++) {
        const ooc_action_t *x = &a->acts[i], *y = &b->acts[i];
        ck_assert_int_eq(x->op, y->op);
        ck_assert_int_eq(x->when, y->when);
        ck_assert_int_eq(x->kind, y->kind);
        ck_assert_int_eq(x->buf, y->buf);
        ck_assert_uint_eq(x->nvia, y->nvia);
        for (uint32_t k = 0; k < x->nvia; k++)
            ck_assert_int_eq(a->via[x->via_off + k], b->via[y->via_off + k]);
    }
}

START_TEST(test_plans_of_every_policy_round_trip) {
    char err[512] = "";
    ooc_profile_t *p;
    ck_assert_msg(ooc_profile_read("profiles/synthetic/unet-batch32", &p, err, sizeof err) == 0,
                  "%s", err);
    ooc_model_t *m;
    ck_assert_int_eq(ooc_model_build(p, p->chunk_bytes, &m), 0);
    const char *d = tmpdir("plans");
    for (int i = 0; ooc_policy_names[i]; i++) {
        ooc_policy_opts_t o = {.budget_bytes = 6ull << 30};
        ooc_plan_t *a, *b;
        ck_assert_msg(ooc_policy_plan(m, ooc_policy_names[i], &o, &a, err, sizeof err) == 0, "%s",
                      err);
        char path[4200];
        snprintf(path, sizeof path, "%s/%s.tsv", d, ooc_policy_names[i]);
        ck_assert_msg(ooc_plan_write_file(a, path, err, sizeof err) == 0, "%s", err);
        ck_assert_msg(ooc_plan_read_file(path, &b, err, sizeof err) == 0, "%s", err);
        assert_same_plan(a, b);
        ooc_plan_free(a);
        ooc_plan_free(b);
    }
    ooc_model_free(m);
    ooc_profile_free(p);
}
END_TEST

static const struct {
    const char *text, *expect;
} bad_plans[] = {
    {"", "field header"},
    {"#ooc-plan\t2\tpolicy=x\tbudget_bytes=1\tchunk_bytes=2\tnops=3\tnbufs=3\n", "field version"},
    {"#ooc-plan\t1\tpolicy=x\tbudget_bytes=1\tchunk_bytes=3\tnops=3\tnbufs=3\n", "chunk_bytes"},
    {"#ooc-plan\t1\tpolicy=x\tbudget_bytes=1\tchunk_bytes=2\tnops=3\tnbufs=3\n", "field columns"},
    {"H\nC\nafter\t1\t2\tswapin\t-\n", "p.tsv:3: field action"},
    {"H\nC\nbefore\t9\t2\tswapin\t-\n", "p.tsv:3: field op"},
    {"H\nC\nbefore\t1\t3\tswapin\t-\n", "p.tsv:3: field buffer"},
    {"H\nC\nbefore\t1\t2\trecompute\t-\n", "p.tsv:3: field via"},
    {"H\nC\nbefore\t1\t2\tswapin\t0\n", "p.tsv:3: field via"},
    {"H\nC\nbuffer\t-\t2\tswap\t-\n", "marked swap but its actions say keep"},
    {"H\nC\nstart\t-\t2\tcold\t-\n", "p.tsv:3: field action"},
    {"H\nC\nsideways\t1\t2\tswapin\t-\n", "p.tsv:3: field type"},
    {"H\nC\nbefore\t1\t2\tswapin\n", "p.tsv:3: field type: expected 5 fields"},
    {"H\nC\nbefore\t1\t2\tswapin\t-\t\t\t\n", "p.tsv:3: field type: expected 5 fields, found 8"},
    {"H\nC\nbefore\t1\t2\tswapin\t-\t\t\t\t\n", "p.tsv:3: too many fields"},
    {"H\nC\n\nbefore\t1\t2\tswapin\t-\n", "p.tsv:3: empty line or NUL byte"},
};

START_TEST(test_malformed_plan_names_line_and_field) {
    const char *hdr = "#ooc-plan\t1\tpolicy=x\tbudget_bytes=1\tchunk_bytes=2\tnops=3\tnbufs=3\n";
    const char *cols = "type\top\tbuffer\taction\tvia\n";
    char text[1024];
    const char *src = bad_plans[_i].text;
    if (strncmp(src, "H\nC\n", 4) == 0)
        snprintf(text, sizeof text, "%s%s%s", hdr, cols, src + 4);
    else
        snprintf(text, sizeof text, "%s", src);
    char err[512] = "";
    ooc_plan_t *pl = NULL;
    ck_assert_int_eq(ooc_plan_parse(text, strlen(text), "p.tsv", &pl, err, sizeof err),
                     OOC_EFORMAT);
    ck_assert_ptr_null(pl);
    ck_assert_msg(strstr(err, bad_plans[_i].expect) != NULL, "case %d: '%s' lacks '%s'", _i, err,
                  bad_plans[_i].expect);
}
END_TEST

Suite *suite_profile(void) {
    Suite *s = suite_create("profile");
    TCase *tc = tcase_create("files");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_reference_profile_round_trips);
    tcase_add_test(tc, test_built_profile_round_trips);
    tcase_add_loop_test(tc, test_malformed_profile_names_file_line_field, 0,
                        (int)(sizeof bad_cases / sizeof bad_cases[0]));
    tcase_add_test(tc, test_reference_to_missing_buffer_is_rejected);
    tcase_add_test(tc, test_missing_directory_is_an_io_error);
    tcase_add_test(tc, test_plans_of_every_policy_round_trip);
    tcase_add_loop_test(tc, test_malformed_plan_names_line_and_field, 0,
                        (int)(sizeof bad_plans / sizeof bad_plans[0]));
    suite_add_tcase(s, tc);
    return s;
}
