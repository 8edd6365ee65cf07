/* SPDX-License-Identifier: MIT */
/* check_trace_json.c: the timeline and its exports (planner/timeline.c, planner/trace_json.c,
 * `ooc-plan --timeline/--trace-json/--plan/--incore`) and the pictures of scripts/ooc-report.
 *
 * The Chrome traces are read back with a strict JSON parser written here (RFC 8259: no trailing
 * commas, no NaN, no raw control characters, valid UTF-8, no duplicate keys) and, as a second
 * opinion, with Python's json module; then every op must appear once, slices on one track must
 * not overlap, the memory counter must match the model (in core) or the simulator (with a plan)
 * and stay within the budget, and awkward names must come back exactly. The timeline TSV is read
 * back strictly and compared with the simulator's own trace and totals. */
#include <check.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ooc_planner.h"
#include "testutil.h"

Suite *suite_trace_json(void);

/* ---- a strict JSON parser ---------------------------------------------------------------------
 */

typedef enum { J_NULL, J_BOOL, J_NUM, J_STR, J_ARR, J_OBJ } jtype_t;

typedef struct jv {
    jtype_t t;
    char *s;     /* J_STR: the decoded UTF-8 text; J_NUM: the literal */
    size_t slen; /* J_STR: its length (it may hold NUL) */
    int b;
    struct jv *items; /* J_ARR, J_OBJ: the values */
    char **keys;      /* J_OBJ: the decoded keys */
    size_t n, cap;
} jv_t;

typedef struct {
    const unsigned char *s;
    size_t i, n;
    int depth;
    char err[160];
} jp_t;

static int jfail(jp_t *p, const char *what) {
    if (!p->err[0])
        snprintf(p->err, sizeof p->err, "offset %zu: %s", p->i, what);
    return -1;
}

static void jws(jp_t *p) {
    while (p->i < p->n &&
           (p->s[p->i] == ' ' || p->s[p->i] == '\t' || p->s[p->i] == '\n' || p->s[p->i] == '\r'))
        p->i++;
}

static void jfree(jv_t *v) {
    if (!v)
        return;
    free(v->s);
    for (size_t k = 0; k < v->n; k++) {
        jfree(&v->items[k]);
        if (v->keys)
            free(v->keys[k]);
    }
    free(v->items);
    free(v->keys);
}

static void putb(char **buf, size_t *len, size_t *cap, const void *d, size_t n) {
    if (*len + n + 1 > *cap) {
        *cap = (*len + n + 1) * 2;
        *buf = realloc(*buf, *cap);
        ck_assert_ptr_nonnull(*buf);
    }
    memcpy(*buf + *len, d, n);
    *len += n;
    (*buf)[*len] = '\0';
}

static void put_utf8(char **buf, size_t *len, size_t *cap, unsigned cp) {
    unsigned char u[4];
    size_t n;
    if (cp < 0x80) {
        u[0] = (unsigned char)cp;
        n = 1;
    } else if (cp < 0x800) {
        u[0] = (unsigned char)(0xc0 | cp >> 6);
        u[1] = (unsigned char)(0x80 | (cp & 0x3f));
        n = 2;
    } else if (cp < 0x10000) {
        u[0] = (unsigned char)(0xe0 | cp >> 12);
        u[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3f));
        u[2] = (unsigned char)(0x80 | (cp & 0x3f));
        n = 3;
    } else {
        u[0] = (unsigned char)(0xf0 | cp >> 18);
        u[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3f));
        u[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3f));
        u[3] = (unsigned char)(0x80 | (cp & 0x3f));
        n = 4;
    }
    putb(buf, len, cap, u, n);
}

static int jhex4(jp_t *p, unsigned *out) {
    unsigned v = 0;
    for (int k = 0; k < 4; k++, p->i++) {
        if (p->i >= p->n)
            return jfail(p, "truncated \\u escape");
        unsigned c = p->s[p->i];
        unsigned d = c >= '0' && c <= '9'   ? c - '0'
                     : c >= 'a' && c <= 'f' ? c - 'a' + 10
                     : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                            : 99;
        if (d == 99)
            return jfail(p, "bad hex digit in \\u escape");
        v = v * 16 + d;
    }
    *out = v;
    return 0;
}

/* A string at p->i (the opening quote), decoded into *out. */
static int jstring(jp_t *p, char **out, size_t *olen) {
    char *buf = NULL;
    size_t len = 0, cap = 0;
    putb(&buf, &len, &cap, "", 0);
    p->i++;
    for (;;) {
        if (p->i >= p->n) {
            free(buf);
            return jfail(p, "unterminated string");
        }
        unsigned c = p->s[p->i];
        if (c == '"') {
            p->i++;
            break;
        }
        if (c < 0x20) {
            free(buf);
            return jfail(p, "raw control character in a string");
        }
        if (c == '\\') {
            p->i++;
            if (p->i >= p->n) {
                free(buf);
                return jfail(p, "truncated escape");
            }
            unsigned e = p->s[p->i++];
            const char *simple = strchr("\"\\/bfnrt", (int)e);
            if (e && simple) {
                static const char map[] = "\"\\/\b\f\n\r\t";
                putb(&buf, &len, &cap, &map[simple - "\"\\/bfnrt"], 1);
            } else if (e == 'u') {
                unsigned cp, lo;
                if (jhex4(p, &cp)) {
                    free(buf);
                    return -1;
                }
                if (cp >= 0xdc00 && cp <= 0xdfff) {
                    free(buf);
                    return jfail(p, "lone low surrogate");
                }
                if (cp >= 0xd800 && cp <= 0xdbff) {
                    if (p->i + 2 > p->n || p->s[p->i] != '\\' || p->s[p->i + 1] != 'u') {
                        free(buf);
                        return jfail(p, "lone high surrogate");
                    }
                    p->i += 2;
                    if (jhex4(p, &lo) || lo < 0xdc00 || lo > 0xdfff) {
                        free(buf);
                        return jfail(p, "bad low surrogate");
                    }
                    cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
                }
                put_utf8(&buf, &len, &cap, cp);
            } else {
                free(buf);
                return jfail(p, "bad escape");
            }
            continue;
        }
        /* raw UTF-8: check the sequence */
        size_t n = c < 0x80                 ? 1
                   : c >= 0xc2 && c <= 0xdf ? 2
                   : c >= 0xe0 && c <= 0xef ? 3
                   : c >= 0xf0 && c <= 0xf4 ? 4
                                            : 0;
        if (n == 0 || p->i + n > p->n) {
            free(buf);
            return jfail(p, "invalid UTF-8");
        }
        unsigned cp = n == 1 ? c : n == 2 ? (c & 0x1f) : n == 3 ? (c & 0x0f) : (c & 0x07);
        for (size_t k = 1; k < n; k++) {
            if ((p->s[p->i + k] & 0xc0) != 0x80) {
                free(buf);
                return jfail(p, "invalid UTF-8 continuation");
            }
            cp = cp << 6 | (p->s[p->i + k] & 0x3f);
        }
        static const unsigned min[5] = {0, 0, 0x80, 0x800, 0x10000};
        if (cp < min[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) {
            free(buf);
            return jfail(p, "overlong or out-of-range UTF-8");
        }
        putb(&buf, &len, &cap, p->s + p->i, n);
        p->i += n;
    }
    *out = buf;
    *olen = len;
    return 0;
}

static int jnumber(jp_t *p, jv_t *v) {
    size_t st = p->i;
    if (p->s[p->i] == '-')
        p->i++;
    if (p->i < p->n && p->s[p->i] == '0') {
        p->i++;
    } else if (p->i < p->n && p->s[p->i] >= '1' && p->s[p->i] <= '9') {
        while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9')
            p->i++;
    } else {
        return jfail(p, "bad number");
    }
    if (p->i < p->n && p->s[p->i] == '.') {
        p->i++;
        size_t d = p->i;
        while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9')
            p->i++;
        if (p->i == d)
            return jfail(p, "no digits after the decimal point");
    }
    if (p->i < p->n && (p->s[p->i] == 'e' || p->s[p->i] == 'E')) {
        p->i++;
        if (p->i < p->n && (p->s[p->i] == '+' || p->s[p->i] == '-'))
            p->i++;
        size_t d = p->i;
        while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9')
            p->i++;
        if (p->i == d)
            return jfail(p, "no digits in the exponent");
    }
    v->t = J_NUM;
    v->s = strndup((const char *)p->s + st, p->i - st);
    ck_assert_ptr_nonnull(v->s);
    return 0;
}

static int jvalue(jp_t *p, jv_t *v);

static void jpush(jv_t *v, jv_t *item, char *key) {
    if (v->n == v->cap) {
        v->cap = v->cap ? v->cap * 2 : 8;
        v->items = realloc(v->items, v->cap * sizeof *v->items);
        ck_assert_ptr_nonnull(v->items);
        if (v->t == J_OBJ) {
            v->keys = realloc(v->keys, v->cap * sizeof *v->keys);
            ck_assert_ptr_nonnull(v->keys);
        }
    }
    v->items[v->n] = *item;
    if (v->t == J_OBJ)
        v->keys[v->n] = key;
    v->n++;
}

static int jcontainer(jp_t *p, jv_t *v, int obj) {
    v->t = obj ? J_OBJ : J_ARR;
    if (++p->depth > 64)
        return jfail(p, "nested too deep");
    p->i++;
    jws(p);
    if (p->i < p->n && p->s[p->i] == (obj ? '}' : ']')) {
        p->i++;
        p->depth--;
        return 0;
    }
    for (;;) {
        char *key = NULL;
        jws(p);
        if (obj) {
            size_t klen;
            if (p->i >= p->n || p->s[p->i] != '"')
                return jfail(p, "expected a key");
            if (jstring(p, &key, &klen))
                return -1;
            for (size_t k = 0; k < v->n; k++)
                if (strcmp(v->keys[k], key) == 0) {
                    free(key);
                    return jfail(p, "duplicate key");
                }
            jws(p);
            if (p->i >= p->n || p->s[p->i] != ':') {
                free(key);
                return jfail(p, "expected ':'");
            }
            p->i++;
        }
        jv_t item = {0};
        if (jvalue(p, &item)) {
            jfree(&item);
            free(key);
            return -1;
        }
        jpush(v, &item, key);
        jws(p);
        if (p->i < p->n && p->s[p->i] == ',') {
            p->i++;
            continue;
        }
        if (p->i < p->n && p->s[p->i] == (obj ? '}' : ']')) {
            p->i++;
            p->depth--;
            return 0;
        }
        return jfail(p, obj ? "expected ',' or '}'" : "expected ',' or ']'");
    }
}

static int jvalue(jp_t *p, jv_t *v) {
    jws(p);
    if (p->i >= p->n)
        return jfail(p, "expected a value");
    unsigned c = p->s[p->i];
    if (c == '{' || c == '[')
        return jcontainer(p, v, c == '{');
    if (c == '"') {
        v->t = J_STR;
        return jstring(p, &v->s, &v->slen);
    }
    if (c == '-' || (c >= '0' && c <= '9'))
        return jnumber(p, v);
    static const char *const words[3] = {"true", "false", "null"};
    for (int k = 0; k < 3; k++) {
        size_t l = strlen(words[k]);
        if (p->i + l <= p->n && memcmp(p->s + p->i, words[k], l) == 0) {
            p->i += l;
            v->t = k == 2 ? J_NULL : J_BOOL;
            v->b = k == 0;
            return 0;
        }
    }
    return jfail(p, "unexpected character");
}

/* Parses a whole text; fails the test with the parser's message when it is not JSON. */
static jv_t jparse(const char *text, size_t len) {
    jp_t p = {.s = (const unsigned char *)text, .n = len};
    jv_t v = {0};
    int rc = jvalue(&p, &v);
    if (!rc) {
        jws(&p);
        if (p.i != p.n)
            rc = jfail(&p, "text after the value");
    }
    ck_assert_msg(rc == 0, "not JSON: %s", p.err);
    return v;
}

static const jv_t *jget(const jv_t *o, const char *key) {
    if (!o || o->t != J_OBJ)
        return NULL;
    for (size_t k = 0; k < o->n; k++)
        if (strcmp(o->keys[k], key) == 0)
            return &o->items[k];
    return NULL;
}

static const char *jstr(const jv_t *o, const char *key) {
    const jv_t *v = jget(o, key);
    return v && v->t == J_STR ? v->s : NULL;
}

static int jhas_num(const jv_t *o, const char *key) {
    const jv_t *v = jget(o, key);
    return v && v->t == J_NUM;
}

static uint64_t jint(const jv_t *o, const char *key) {
    const jv_t *v = jget(o, key);
    ck_assert_msg(v && v->t == J_NUM, "no number '%s'", key);
    char *e;
    unsigned long long x = strtoull(v->s, &e, 10);
    ck_assert_msg(*e == '\0' && v->s[0] != '-', "'%s' is not a whole number: %s", key, v->s);
    return x;
}

/* A time in microseconds with exactly three decimals, as nanoseconds. */
static uint64_t jns(const jv_t *o, const char *key) {
    const jv_t *v = jget(o, key);
    ck_assert_msg(v && v->t == J_NUM, "no number '%s'", key);
    const char *dot = strchr(v->s, '.');
    ck_assert_msg(dot && strlen(dot) == 4 && v->s[0] != '-', "'%s' is not us.nnn: %s", key, v->s);
    char *e;
    unsigned long long us = strtoull(v->s, &e, 10);
    ck_assert(e == dot);
    unsigned long long frac = strtoull(dot + 1, &e, 10);
    ck_assert(*e == '\0');
    return us * 1000 + frac;
}

/* ---- helpers ----------------------------------------------------------------------------------
 */

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    ck_assert_msg(f != NULL, "cannot open %s", path);
    char *buf = NULL;
    size_t n = 0, cap = 0;
    char chunk[65536];
    size_t k;
    while ((k = fread(chunk, 1, sizeof chunk, f)) > 0)
        putb(&buf, &n, &cap, chunk, k);
    fclose(f);
    if (!buf)
        putb(&buf, &n, &cap, "", 0);
    *len = n;
    return buf;
}

/* Runs a FILE*-writer into memory. */
#define CAPTURE(text, len, call)                                                                   \
    do {                                                                                           \
        FILE *mf_ = open_memstream(&(text), &(len));                                               \
        ck_assert_ptr_nonnull(mf_);                                                                \
        int rc_ = (call);                                                                          \
        ck_assert_int_eq(fclose(mf_), 0);                                                          \
        ck_assert_int_eq(rc_, 0);                                                                  \
    } while (0)
#define MF mf_

/* A fresh empty directory under the build tree. */
static const char *tmpdir(const char *name) {
    static char path[4][4096];
    static int slot;
    char *p = path[slot++ % 4];
    snprintf(p, sizeof path[0], "%s/tmp/check_trace_json-%d-%s", tu_build_dir(), (int)getpid(),
             name);
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", p, p);
    ck_assert_int_eq(system(cmd), 0);
    return p;
}

static void rmdir_r(const char *dir) {
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    ck_assert_int_eq(system(cmd), 0);
}

/* Python's json module as a second, independent parser (no NaN or Infinity, no control
 * characters in strings). Not under valgrind, which would trace the interpreter. */
static void python_parses(const char *path) {
    if (tu_under_valgrind())
        return;
    static const char code[] = "import json,sys\n"
                               "def bad(c): raise ValueError('non-standard constant ' + c)\n"
                               "with open(sys.argv[1], encoding='utf-8', errors='strict') as f:\n"
                               "    d = json.load(f, parse_constant=bad)\n"
                               "assert isinstance(d, dict) and isinstance(d['traceEvents'], list)\n"
                               "print(len(d['traceEvents']))\n";
    const char *argv[] = {"/usr/bin/env", "python3", "-c", code, path, NULL};
    tu_proc_t pr;
    ck_assert_int_eq(tu_run(argv, NULL, 120, &pr), 0);
    ck_assert_msg(pr.status == 0, "python3 json.load rejects %s: %s", path, pr.err);
    tu_proc_free(&pr);
}

static ooc_profile_t *read_profile(const char *dir) {
    char err[512] = "";
    ooc_profile_t *p;
    ck_assert_msg(ooc_profile_read(dir, &p, err, sizeof err) == 0, "%s", err);
    return p;
}

/* The largest in-core footprint, computed here from the buffers' lifetimes: a buffer occupies
 * its footprint from the start of op alloc_idx to the end of op free_idx. */
static uint64_t incore_peak(const ooc_model_t *m) {
    const ooc_profile_t *p = m->prof;
    uint64_t peak = 0;
    for (int64_t i = 0; i < (int64_t)m->n || (i == 0 && m->n == 0); i++) {
        uint64_t live = 0; /* while op i runs */
        for (uint32_t b = 0; b < m->nb; b++) {
            const ooc_buffer_t *x = &p->bufs[b];
            if ((x->alloc_idx < 0 || x->alloc_idx <= i) && (x->free_idx < 0 || x->free_idx >= i))
                live += m->fp[b];
        }
        if (live > peak)
            peak = live;
    }
    return peak;
}

/* ---- checking a Chrome trace ------------------------------------------------------------------
 */

typedef struct {
    uint64_t ts, dur;
} span_t;

typedef struct {
    uint32_t nops_seen;
    uint32_t n_recompute, n_swapin, n_swapout, n_counter, n_budget;
    uint64_t max_in_use, end_ns;
} trace_facts_t;

/* Checks the structure every trace has (see the file comment), and returns what it found. */
static trace_facts_t check_trace(const ooc_profile_t *p, const ooc_timeline_t *tl, const char *text,
                                 size_t len) {
    trace_facts_t f = {0};
    jv_t root = jparse(text, len);
    ck_assert_int_eq(root.t, J_OBJ);
    ck_assert_str_eq(jstr(&root, "displayTimeUnit"), "ns");
    const jv_t *other = jget(&root, "otherData");
    ck_assert_msg(other && other->t == J_OBJ, "no otherData");
    ck_assert_str_eq(jstr(other, "source"), tl->simulated ? "simulated" : "incore");
    ck_assert_str_eq(jstr(other, "policy"), tl->policy);
    ck_assert_uint_eq(jint(other, "budget_bytes"), tl->budget_bytes);
    ck_assert_uint_eq(jint(other, "time_ns"), tl->time_ns);
    ck_assert_uint_eq(jint(other, "peak_bytes"), tl->peak_bytes);
    const jv_t *ev = jget(&root, "traceEvents");
    ck_assert_msg(ev && ev->t == J_ARR, "no traceEvents array");
    uint32_t *seen = calloc(p->nops + 1, sizeof *seen);
    span_t *last = calloc(64, sizeof *last); /* per tid: the last slice */
    int *has_last = calloc(64, sizeof *has_last);
    char **tname = calloc(64, sizeof *tname);
    ck_assert(seen && last && has_last && tname);
    uint64_t op_t = 0; /* in core: where the next op must start */
    for (size_t k = 0; k < ev->n; k++) {
        const jv_t *e = &ev->items[k];
        ck_assert_int_eq(e->t, J_OBJ);
        const char *ph = jstr(e, "ph");
        ck_assert_msg(ph, "event %zu has no ph", k);
        ck_assert_uint_eq(jint(e, "pid"), 1);
        if (strcmp(ph, "M") == 0) {
            const char *name = jstr(e, "name");
            ck_assert_ptr_nonnull(name);
            uint64_t tid = jint(e, "tid");
            ck_assert_uint_lt(tid, 64);
            if (strcmp(name, "thread_name") == 0)
                tname[tid] = jget(e, "args") ? (char *)jstr(jget(e, "args"), "name") : NULL;
            continue;
        }
        if (strcmp(ph, "C") == 0) {
            const char *name = jstr(e, "name");
            const jv_t *a = jget(e, "args");
            ck_assert_msg(a && a->t == J_OBJ && a->n == 1, "a counter with other than one series");
            ck_assert_uint_le(jns(e, "ts"), tl->time_ns);
            if (strcmp(name, "device memory budget") == 0) {
                ck_assert_uint_eq(jint(a, "bytes"), tl->budget_bytes);
                f.n_budget++;
                continue;
            }
            ck_assert_str_eq(name, "device memory in use");
            uint64_t in_use = jint(a, "bytes");
            if (tl->simulated)
                ck_assert_msg(in_use <= tl->budget_bytes, "counter %llu above the budget %llu",
                              (unsigned long long)in_use, (unsigned long long)tl->budget_bytes);
            if (in_use > f.max_in_use)
                f.max_in_use = in_use;
            f.n_counter++;
            continue;
        }
        ck_assert_msg(strcmp(ph, "X") == 0, "unexpected phase %s", ph);
        uint64_t tid = jint(e, "tid"), ts = jns(e, "ts"), dur = jns(e, "dur");
        ck_assert_uint_lt(tid, 64);
        ck_assert_msg(tname[tid], "slice on track %llu, which has no name",
                      (unsigned long long)tid);
        ck_assert_ptr_nonnull(jstr(e, "name"));
        const char *cat = jstr(e, "cat");
        ck_assert_ptr_nonnull(cat);
        const jv_t *a = jget(e, "args");
        ck_assert_msg(a && a->t == J_OBJ, "slice without args");
        if (has_last[tid])
            ck_assert_msg(last[tid].ts + last[tid].dur <= ts,
                          "slices overlap on track %s: [%llu, +%llu) and [%llu, ...)", tname[tid],
                          (unsigned long long)last[tid].ts, (unsigned long long)last[tid].dur,
                          (unsigned long long)ts);
        has_last[tid] = 1;
        last[tid] = (span_t){ts, dur};
        if (ts + dur > f.end_ns)
            f.end_ns = ts + dur;
        if (strcmp(cat, "recompute") == 0) {
            f.n_recompute++;
            ck_assert_str_eq(tname[tid], "compute");
            ck_assert(jhas_num(a, "buffer") && jhas_num(a, "before_op"));
        } else if (strcmp(cat, "swapin") == 0 || strcmp(cat, "swapout") == 0) {
            int in = cat[4] == 'i';
            if (in)
                f.n_swapin++;
            else
                f.n_swapout++;
            ck_assert_str_eq(tname[tid], in ? "host-to-device copies (swap-in)"
                                            : "device-to-host copies (swap-out)");
            uint64_t b = jint(a, "buffer");
            ck_assert_uint_lt(b, p->nbufs);
            ck_assert_uint_eq(jint(a, "bytes"), p->bufs[b].bytes);
            ck_assert_str_eq(jstr(a, "site"), p->bufs[b].site);
        } else {
            uint64_t op = jint(a, "op");
            ck_assert_uint_lt(op, p->nops);
            const ooc_op_t *o = &p->ops[op];
            seen[op]++;
            f.nops_seen++;
            ck_assert_str_eq(jstr(e, "name"), o->name);
            ck_assert_str_eq(cat, ooc_kind_name((ooc_op_kind_t)o->kind));
            ck_assert_str_eq(jstr(a, "shape"), o->shape);
            ck_assert_uint_eq(jint(a, "duration_ns"), o->duration_ns);
            const jv_t *refs = jget(a, "refs");
            ck_assert_msg(refs && refs->t == J_ARR && refs->n == o->nref, "op %llu: refs",
                          (unsigned long long)op);
            /* simulated times are rounded to whole nanoseconds at both ends */
            ck_assert_msg(dur + 1 >= o->duration_ns && dur <= o->duration_ns + 1,
                          "op %llu lasts %llu ns, recorded %llu", (unsigned long long)op,
                          (unsigned long long)dur, (unsigned long long)o->duration_ns);
            if (!tl->simulated)
                ck_assert_uint_eq(dur, o->duration_ns);
            if (tl->simulated) {
                ck_assert_str_eq(tname[tid], "compute");
            } else {
                char want[32];
                snprintf(want, sizeof want, "stream %d", (int)o->stream);
                ck_assert_str_eq(tname[tid], want);
                ck_assert_uint_eq(ts, op_t); /* back to back, in issue order */
                op_t += o->duration_ns;
            }
        }
    }
    for (uint32_t i = 0; i < p->nops; i++)
        ck_assert_msg(seen[i] == 1, "op %u appears %u times", i, seen[i]);
    ck_assert_uint_eq(f.max_in_use, tl->peak_bytes);
    ck_assert_uint_eq(f.n_budget, 2); /* at the start and at the end */
    size_t nmem = 0;
    for (size_t k = 0; k < tl->nrows; k++)
        nmem += tl->rows[k].engine == OOC_ENG_MEMORY;
    ck_assert_uint_eq(f.n_counter, nmem + 1); /* a zero at the start, then every change */
    ck_assert_uint_le(f.end_ns, tl->time_ns);
    free(seen);
    free(last);
    free(has_last);
    free(tname);
    jfree(&root);
    return f;
}

/* ---- the timeline TSV, read back --------------------------------------------------------------
 */

typedef struct {
    char engine[16], action[16];
    uint64_t start_ns, end_ns, bytes, in_use;
    int64_t op, buf; /* -1: '-' */
    int has_bytes, has_in_use;
} tsv_row_t;

static int64_t field_id(const char *s) {
    if (strcmp(s, "-") == 0)
        return -1;
    char *e;
    ck_assert_msg(*s >= '0' && *s <= '9', "'%s' is not an id", s);
    long long v = strtoll(s, &e, 10);
    ck_assert_msg(*e == '\0', "'%s' is not an id", s);
    return v;
}

static uint64_t field_u64(const char *s) {
    char *e;
    ck_assert_msg(*s >= '0' && *s <= '9', "'%s' is not a number", s);
    unsigned long long v = strtoull(s, &e, 10);
    ck_assert_msg(*e == '\0', "'%s' is not a number", s);
    return v;
}

/* Splits line into exactly n TAB-separated fields (in place). */
static void split(char *line, char **f, int n) {
    for (int k = 0; k < n; k++) {
        f[k] = line;
        char *t = strchr(line, '\t');
        if (k < n - 1) {
            ck_assert_msg(t != NULL, "too few fields in '%s'", f[0]);
            *t = '\0';
            line = t + 1;
        } else {
            ck_assert_msg(t == NULL, "too many fields");
        }
    }
}

/* Reads a timeline TSV strictly; the header's key=value fields go to hdr. */
static tsv_row_t *read_tsv(char *text, size_t *nrows, char hdr[10][64]) {
    char *save = NULL, *line = strtok_r(text, "\n", &save);
    ck_assert_ptr_nonnull(line);
    char *h[10];
    split(line, h, 10);
    ck_assert_str_eq(h[0], "#ooc-timeline");
    ck_assert_str_eq(h[1], "1");
    static const char *const keys[8] = {"source=",  "policy=",     "budget_bytes=", "chunk_bytes=",
                                        "time_ns=", "peak_bytes=", "nops=",         "nbufs="};
    for (int k = 0; k < 8; k++) {
        ck_assert_msg(strncmp(h[k + 2], keys[k], strlen(keys[k])) == 0, "header field %d: %s",
                      k + 2, h[k + 2]);
        snprintf(hdr[k], 64, "%s", h[k + 2] + strlen(keys[k]));
    }
    line = strtok_r(NULL, "\n", &save);
    ck_assert_ptr_nonnull(line);
    ck_assert_str_eq(line, "engine\tstart_ns\tend_ns\top\tbuffer\taction\tbytes\tin_use_bytes");
    size_t n = 0, cap = 1024;
    tsv_row_t *rows = malloc(cap * sizeof *rows);
    ck_assert_ptr_nonnull(rows);
    uint64_t prev_start = 0;
    while ((line = strtok_r(NULL, "\n", &save))) {
        char *f[8];
        split(line, f, 8);
        if (n == cap) {
            cap *= 2;
            rows = realloc(rows, cap * sizeof *rows);
            ck_assert_ptr_nonnull(rows);
        }
        tsv_row_t *r = &rows[n++];
        memset(r, 0, sizeof *r);
        ck_assert(strlen(f[0]) < sizeof r->engine && strlen(f[5]) < sizeof r->action);
        strcpy(r->engine, f[0]);
        strcpy(r->action, f[5]);
        r->start_ns = field_u64(f[1]);
        r->end_ns = field_u64(f[2]);
        ck_assert_uint_le(r->start_ns, r->end_ns);
        ck_assert_msg(r->start_ns >= prev_start, "rows are not in start order");
        prev_start = r->start_ns;
        r->op = field_id(f[3]);
        r->buf = field_id(f[4]);
        r->has_bytes = strcmp(f[6], "-") != 0;
        if (r->has_bytes)
            r->bytes = field_u64(f[6]);
        r->has_in_use = strcmp(f[7], "-") != 0;
        if (r->has_in_use)
            r->in_use = field_u64(f[7]);
        int mem = strcmp(r->engine, "memory") == 0;
        ck_assert_int_eq(r->has_in_use, mem);
        ck_assert_int_eq(r->has_bytes, strcmp(r->action, "op") != 0);
        if (mem)
            ck_assert(r->start_ns == r->end_ns && r->buf >= 0 &&
                      (strcmp(r->action, "map") == 0 || strcmp(r->action, "unmap") == 0));
        else if (strcmp(r->engine, "compute") == 0)
            ck_assert(strcmp(r->action, "op") == 0 || strcmp(r->action, "recompute") == 0);
        else if (strcmp(r->engine, "h2d") == 0)
            ck_assert_str_eq(r->action, "swapin");
        else if (strcmp(r->engine, "d2h") == 0)
            ck_assert_str_eq(r->action, "swapout");
        else
            ck_abort_msg("unknown engine '%s'", r->engine);
    }
    *nrows = n;
    return rows;
}

static int has_action(const ooc_plan_t *pl, ooc_act_kind_t kind, int64_t op, int64_t buf) {
    for (uint32_t i = 0; i < pl->nacts; i++)
        if (pl->acts[i].kind == kind && pl->acts[i].op == op && pl->acts[i].buf == buf)
            return 1;
    return 0;
}

/* ---- a simulated plan of a reference profile --------------------------------------------------
 */

typedef struct {
    ooc_profile_t *p;
    ooc_model_t *m;
    ooc_plan_t *pl;
    ooc_trace_t tr;
    ooc_sim_result_t r;
    ooc_timeline_t tl;
} simcase_t;

/* Plans `dir` with `policy`, doubling the budget from `budget` (0: the profile's) until the plan
 * is feasible, simulates it with a trace and builds its timeline. */
static void simcase_open(simcase_t *c, const char *dir, const char *policy, uint64_t budget) {
    memset(c, 0, sizeof *c);
    c->p = read_profile(dir);
    ck_assert_int_eq(ooc_model_build(c->p, c->p->chunk_bytes, &c->m), 0);
    if (!budget)
        budget = c->p->budget_bytes;
    char err[512] = "";
    for (int tries = 0;; tries++) {
        ck_assert_msg(tries < 8, "%s: no feasible %s plan", dir, policy);
        ooc_policy_opts_t o = {.budget_bytes = budget};
        int rc = ooc_policy_plan(c->m, policy, &o, &c->pl, err, sizeof err);
        if (rc == 0) {
            ooc_sim_opts_t so = {.trace = &c->tr};
            ck_assert_int_eq(ooc_sim_run(c->m, c->pl, &so, &c->r), 0);
            if (c->r.feasible)
                break;
            ooc_sim_result_free(&c->r);
            ooc_trace_free(&c->tr);
            ooc_plan_free(c->pl);
            c->pl = NULL;
        } else {
            ck_assert_msg(rc == OOC_EINFEASIBLE, "%s", err);
        }
        budget *= 2;
    }
    ck_assert_msg(ooc_timeline_simulated(c->m, c->pl, &c->tr, &c->tl, err, sizeof err) == 0, "%s",
                  err);
}

static void simcase_close(simcase_t *c) {
    ooc_timeline_free(&c->tl);
    ooc_sim_result_free(&c->r);
    ooc_trace_free(&c->tr);
    ooc_plan_free(c->pl);
    ooc_model_free(c->m);
    ooc_profile_free(c->p);
}

static char ref_dirs[64][300];
static int nrefs;

static void list_refs(void) {
    DIR *d = opendir("profiles/synthetic");
    struct dirent *e;
    nrefs = 0;
    while (d && (e = readdir(d)) && nrefs < 64)
        if (e->d_name[0] != '.')
            snprintf(ref_dirs[nrefs++], sizeof ref_dirs[0], "profiles/synthetic/%s", e->d_name);
    if (d)
        closedir(d);
    qsort(ref_dirs, (size_t)nrefs, sizeof ref_dirs[0], (int (*)(const void *, const void *))strcmp);
}

/* ---- tests ------------------------------------------------------------------------------------
 */

START_TEST(test_profile_trace_has_every_op_once_on_its_stream) {
    ooc_profile_t *p = read_profile(ref_dirs[_i]);
    ooc_model_t *m;
    ck_assert_int_eq(ooc_model_build(p, p->chunk_bytes, &m), 0);
    ooc_timeline_t tl;
    ck_assert_int_eq(ooc_timeline_incore(m, p->budget_bytes, &tl), 0);
    ck_assert_uint_eq(tl.time_ns, m->compute_ns);
    ck_assert_uint_eq(tl.peak_bytes, incore_peak(m));
    /* the file the shim writes: from the profile alone */
    const char *d = tmpdir("incore");
    char path[4200];
    snprintf(path, sizeof path, "%s/trace.json", d);
    char err[512] = "";
    ck_assert_msg(ooc_trace_json_write_file(p, NULL, path, err, sizeof err) == 0, "%s", err);
    size_t len;
    char *text = slurp(path, &len);
    trace_facts_t f = check_trace(p, &tl, text, len);
    ck_assert_uint_eq(f.nops_seen, p->nops);
    ck_assert_uint_eq(f.n_recompute + f.n_swapin + f.n_swapout, 0);
    ck_assert_uint_eq(f.end_ns, m->compute_ns);
    /* an explicit in-core timeline gives the same bytes */
    char *text2 = NULL;
    size_t len2 = 0;
    CAPTURE(text2, len2, ooc_trace_json_write(p, &tl, MF, err, sizeof err));
    ck_assert_uint_eq(len, len2);
    ck_assert(memcmp(text, text2, len) == 0);
    python_parses(path);
    free(text);
    free(text2);
    rmdir_r(d);
    ooc_timeline_free(&tl);
    ooc_model_free(m);
    ooc_profile_free(p);
}
END_TEST

START_TEST(test_simulated_trace_shows_the_plan_within_budget) {
    simcase_t c;
    simcase_open(&c, ref_dirs[_i], "auto", 0);
    char *text = NULL, err[512] = "";
    size_t len = 0;
    CAPTURE(text, len, ooc_trace_json_write(c.p, &c.tl, MF, err, sizeof err));
    trace_facts_t f = check_trace(c.p, &c.tl, text, len);
    ck_assert_uint_eq(f.nops_seen, c.p->nops);
    ck_assert_uint_eq(f.max_in_use, c.r.peak_bytes);
    ck_assert_uint_le(f.max_in_use, c.pl->budget_bytes);
    ck_assert_uint_eq(f.end_ns, c.r.time_ns);
    uint32_t n_in = 0, n_out = 0, n_rec = 0;
    for (uint32_t i = 0; i < c.pl->nacts; i++) {
        n_in += c.pl->acts[i].kind == OOC_ACT_SWAPIN;
        n_out += c.pl->acts[i].kind == OOC_ACT_SWAPOUT;
        n_rec += c.pl->acts[i].kind == OOC_ACT_RECOMPUTE;
    }
    ck_assert_uint_eq(f.n_swapin, n_in);   /* every swap-in copies */
    ck_assert_uint_le(f.n_swapout, n_out); /* a swap-out of an unchanged buffer does not */
    ck_assert_uint_eq(f.n_recompute, n_rec);
    uint64_t moved = 0;
    for (size_t k = 0; k < c.tl.nrows; k++)
        if (c.tl.rows[k].engine == OOC_ENG_D2H)
            moved += c.tl.rows[k].bytes;
    ck_assert_uint_eq(moved, c.r.d2h_bytes);
    free(text);
    simcase_close(&c);
}
END_TEST

/* Plans whose timelines are read back: swaps and recomputations (auto), buffers swapped out and
 * in several times, some swap-outs without a copy (swapall, lms, window). */
static const struct {
    const char *dir, *policy;
} rt_cases[] = {
    {"profiles/synthetic/resnet50-batch256", "auto"},
    {"profiles/synthetic/densenet121-batch256", "auto"},
    {"profiles/synthetic/resnet50-batch256", "swapall"},
    {"profiles/synthetic/gpt2-seq2048", "lms"},
    {"profiles/synthetic/unet-batch64", "window"},
};

START_TEST(test_timeline_tsv_round_trips_against_the_simulator) {
    simcase_t c;
    simcase_open(&c, rt_cases[_i].dir, rt_cases[_i].policy, 8ull << 30);
    ck_assert_uint_gt(c.r.n_swap, 0);
    if (_i == 0)
        ck_assert_uint_gt(c.r.n_recompute, 0);
    char *text = NULL;
    size_t len = 0;
    CAPTURE(text, len, ooc_timeline_write(&c.tl, MF));
    char hdr[10][64];
    size_t n;
    tsv_row_t *rows = read_tsv(text, &n, hdr);
    ck_assert_str_eq(hdr[0], "simulated");
    ck_assert_str_eq(hdr[1], rt_cases[_i].policy);
    ck_assert_uint_eq(field_u64(hdr[2]), 8ull << 30);
    ck_assert_uint_eq(field_u64(hdr[3]), c.p->chunk_bytes);
    ck_assert_uint_eq(field_u64(hdr[4]), c.r.time_ns);
    ck_assert_uint_eq(field_u64(hdr[5]), c.r.peak_bytes);
    ck_assert_uint_eq(field_u64(hdr[6]), c.p->nops);
    ck_assert_uint_eq(field_u64(hdr[7]), c.p->nbufs);
    ck_assert_uint_eq(n, c.tl.nrows);

    /* row by row against the simulator's trace: each start event opens the next row of its
     * engine, each end event closes it, at the same (rounded) time */
    size_t next[4] = {0, 0, 0, 0}; /* per engine: the next row to match */
    size_t open_row[3] = {SIZE_MAX, SIZE_MAX, SIZE_MAX};
    static const char *const eng[4] = {"compute", "h2d", "d2h", "memory"};
    uint64_t in_use = 0, h2d = 0, d2h = 0, busy = 0, max_end = 0;
    int64_t *lastw = malloc(c.p->nbufs * sizeof *lastw); /* per buffer: its last writer so far */
    ck_assert_ptr_nonnull(lastw);
    for (uint32_t b = 0; b < c.p->nbufs; b++)
        lastw[b] = -1;
    for (size_t k = 0; k < c.tr.n; k++) {
        const ooc_trace_ev_t *e = &c.tr.ev[k];
        uint64_t t = (uint64_t)llround(e->t_ns);
        int g = e->kind <= OOC_TR_OP_END    ? 0
                : e->kind <= OOC_TR_H2D_END ? 1
                : e->kind <= OOC_TR_D2H_END ? 2
                                            : 3;
        int start = e->kind == OOC_TR_OP_START || e->kind == OOC_TR_H2D_START ||
                    e->kind == OOC_TR_D2H_START || g == 3;
        if (start) {
            while (next[g] < n && strcmp(rows[next[g]].engine, eng[g]) != 0)
                next[g]++;
            ck_assert_msg(next[g] < n, "no %s row for trace event %zu", eng[g], k);
            const tsv_row_t *r = &rows[next[g]];
            ck_assert_uint_eq(r->start_ns, t);
            if (g == 3) {
                in_use = e->kind == OOC_TR_MAP ? in_use + e->bytes : in_use - e->bytes;
                ck_assert_int_eq(r->buf, e->buf);
                ck_assert_uint_eq(r->bytes, e->bytes);
                ck_assert_uint_eq(r->in_use, in_use);
                ck_assert_str_eq(r->action, e->kind == OOC_TR_MAP ? "map" : "unmap");
            } else {
                open_row[g] = next[g];
                if (g == 0) {
                    ck_assert_int_eq(r->op, e->op);
                    ck_assert_int_eq(r->buf, e->buf);
                    ck_assert_str_eq(r->action, e->buf < 0 ? "op" : "recompute");
                } else {
                    ck_assert_int_eq(r->buf, e->buf);
                    ck_assert_uint_eq(r->bytes, c.p->bufs[e->buf].bytes);
                    /* the copy belongs to a plan action of that buffer at that op */
                    ck_assert_msg(
                        has_action(c.pl, g == 1 ? OOC_ACT_SWAPIN : OOC_ACT_SWAPOUT, r->op, r->buf),
                        "%s row of buffer %lld at op %lld has no plan action", eng[g],
                        (long long)r->buf, (long long)r->op);
                    /* a copy-out is queued when its op ends, and only when the buffer was written
                     * since it was last copied: its swap-out is no earlier than the last writer */
                    if (g == 2)
                        ck_assert_msg(r->op <= e->op && r->op >= lastw[r->buf],
                                      "copy-out of buffer %lld attributed to op %lld; last "
                                      "written at op %lld, compute at op %d",
                                      (long long)r->buf, (long long)r->op, (long long)lastw[r->buf],
                                      (int)e->op);
                    if (g == 1)
                        h2d += r->bytes;
                    else
                        d2h += r->bytes;
                }
            }
            next[g]++;
        } else {
            ck_assert_msg(open_row[g] != SIZE_MAX, "trace event %zu ends nothing", k);
            const tsv_row_t *r = &rows[open_row[g]];
            ck_assert_uint_eq(r->end_ns, t);
            if (g == 0) {
                busy += r->end_ns - r->start_ns;
                if (r->buf >= 0) {
                    lastw[r->buf] = r->op; /* a recompute rewrites its buffer */
                } else {
                    const ooc_op_t *o = &c.p->ops[r->op];
                    for (uint32_t j = 0; j < o->nref; j++)
                        if (c.p->refs[o->ref_off + j].access & OOC_ACCESS_W)
                            lastw[c.p->refs[o->ref_off + j].buf] = r->op;
                }
            }
            if (r->end_ns > max_end)
                max_end = r->end_ns;
            open_row[g] = SIZE_MAX;
        }
    }
    for (int g = 0; g < 4; g++)
        while (next[g] < n)
            ck_assert_msg(strcmp(rows[next[g]++].engine, eng[g]) != 0, "an extra %s row", eng[g]);
    /* the simulator's totals */
    ck_assert_uint_eq(h2d, c.r.h2d_bytes);
    ck_assert_uint_eq(d2h, c.r.d2h_bytes);
    ck_assert_uint_eq(max_end, c.r.time_ns);
    uint64_t want_busy = c.m->compute_ns + c.r.recompute_ns;
    ck_assert_msg(llabs((long long)busy - (long long)want_busy) <= (long long)n,
                  "compute busy %llu ns, simulator %llu ns", (unsigned long long)busy,
                  (unsigned long long)want_busy);
    uint64_t peak = 0, ops = 0;
    for (size_t k = 0; k < n; k++) {
        if (rows[k].has_in_use && rows[k].in_use > peak)
            peak = rows[k].in_use;
        ops += strcmp(rows[k].action, "op") == 0;
    }
    ck_assert_uint_eq(peak, c.r.peak_bytes);
    ck_assert_uint_le(peak, 8ull << 30);
    ck_assert_uint_eq(ops, c.p->nops);
    free(lastw);
    free(rows);
    free(text);
    simcase_close(&c);
}
END_TEST

START_TEST(test_incore_timeline_tsv_follows_the_profile) {
    ooc_profile_t *p = read_profile("profiles/synthetic/unet-batch32");
    ooc_model_t *m;
    ck_assert_int_eq(ooc_model_build(p, p->chunk_bytes, &m), 0);
    ooc_timeline_t tl;
    ck_assert_int_eq(ooc_timeline_incore(m, 123456789, &tl), 0);
    char *text = NULL;
    size_t len = 0;
    CAPTURE(text, len, ooc_timeline_write(&tl, MF));
    char hdr[10][64];
    size_t n;
    tsv_row_t *rows = read_tsv(text, &n, hdr);
    ck_assert_str_eq(hdr[0], "incore");
    ck_assert_str_eq(hdr[1], "incore");
    ck_assert_uint_eq(field_u64(hdr[2]), 123456789);
    ck_assert_uint_eq(field_u64(hdr[4]), m->compute_ns);
    ck_assert_uint_eq(field_u64(hdr[5]), incore_peak(m));
    uint64_t t = 0, in_use = 0;
    uint32_t op = 0, maps = 0, unmaps = 0;
    for (size_t k = 0; k < n; k++) {
        const tsv_row_t *r = &rows[k];
        if (strcmp(r->engine, "compute") == 0) {
            ck_assert_int_eq(r->op, op);
            ck_assert_uint_eq(r->start_ns, t);
            t += p->ops[op].duration_ns;
            ck_assert_uint_eq(r->end_ns, t);
            op++;
            continue;
        }
        const ooc_buffer_t *b = &p->bufs[r->buf];
        ck_assert_uint_eq(r->bytes, m->fp[r->buf]);
        if (strcmp(r->action, "map") == 0) {
            ck_assert_int_eq(r->op, b->alloc_idx);
            ck_assert_uint_eq(r->start_ns, t);
            in_use += r->bytes;
            maps++;
        } else {
            ck_assert_int_eq(r->op, b->free_idx);
            ck_assert_int_eq(r->op + 1, (int64_t)op); /* after its op */
            ck_assert_uint_eq(r->start_ns, t);
            in_use -= r->bytes;
            unmaps++;
        }
        ck_assert_uint_eq(r->in_use, in_use);
    }
    ck_assert_uint_eq(op, p->nops);
    ck_assert_uint_eq(maps, p->nbufs);
    uint32_t freed = 0;
    for (uint32_t b = 0; b < p->nbufs; b++)
        freed += p->bufs[b].free_idx >= 0;
    ck_assert_uint_eq(unmaps, freed);
    free(rows);
    free(text);
    ooc_timeline_free(&tl);
    ooc_model_free(m);
    ooc_profile_free(p);
}
END_TEST

/* Names a recorder might see: JSON's own metacharacters, control characters, and bytes that
 * are not UTF-8 (each such byte becomes U+FFFD). */
static const struct {
    const char *raw, *json;
} tricky[] = {
    {"quote\"d", "quote\"d"},
    {"back\\slash\\", "back\\slash\\"},
    {"ctl\x01\x1f\x7f end", "ctl\x01\x1f\x7f end"},
    {"tab\there\nnew\rline", "tab\there\nnew\rline"},
    {"caf\xc3\xa9 \xe2\x9c\x93 \xf0\x9f\x98\x80", "caf\xc3\xa9 \xe2\x9c\x93 \xf0\x9f\x98\x80"},
    {"bad\xff\xfe!", "bad\xef\xbf\xbd\xef\xbf\xbd!"},
    {"cut\xe2\x82", "cut\xef\xbf\xbd\xef\xbf\xbd"},
    {"sur\xed\xa0\x80", "sur\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"},
    {"long\xc0\xaf", "long\xef\xbf\xbd\xef\xbf\xbd"},
    {"</script>{\"x\":[1,2]}", "</script>{\"x\":[1,2]}"},
};
#define NTRICKY (sizeof tricky / sizeof tricky[0])

START_TEST(test_tricky_names_are_escaped) {
    ooc_profile_t *p = ooc_profile_new();
    ck_assert_int_eq(ooc_profile_set_str(&p->program, "prog \"x\"\\\x02\xff"), 0);
    ck_assert_int_eq(ooc_profile_set_str(&p->device, "dev\ttab"), 0);
    p->budget_bytes = 1 << 20;
    static const int32_t streams[3] = {0, 7, 3};
    for (size_t k = 0; k < NTRICKY; k++) {
        int32_t prod = (int32_t)k;
        ck_assert_int_eq(
            ooc_profile_add_buffer(p, 1000 + k, (int64_t)k, (int64_t)k, 0, tricky[k].raw, &prod, 1),
            (int)k);
    }
    for (size_t k = 0; k < NTRICKY; k++) {
        ooc_ref_t r = {(int32_t)k, OOC_ACCESS_W, 0};
        ck_assert_int_eq(ooc_profile_add_op(p, streams[k % 3], (ooc_op_kind_t)(k % OOC_KIND_COUNT),
                                            tricky[k].raw, tricky[NTRICKY - 1 - k].raw, 100 + k, &r,
                                            1),
                         (int)k);
    }
    ck_assert_int_eq(ooc_profile_validate(p, NULL, 0), 0);
    char *text = NULL, err[256] = "";
    size_t len = 0;
    CAPTURE(text, len, ooc_trace_json_write(p, NULL, MF, err, sizeof err));
    jv_t root = jparse(text, len);
    const jv_t *other = jget(&root, "otherData");
    ck_assert_str_eq(jstr(other, "program"), "prog \"x\"\\\x02\xef\xbf\xbd");
    ck_assert_str_eq(jstr(other, "device"), "dev\ttab");
    const jv_t *ev = jget(&root, "traceEvents");
    size_t found = 0;
    int stream_names = 0;
    for (size_t i = 0; i < ev->n; i++) {
        const jv_t *e = &ev->items[i];
        if (strcmp(jstr(e, "ph"), "M") == 0 && strcmp(jstr(e, "name"), "thread_name") == 0) {
            const char *tn = jstr(jget(e, "args"), "name");
            uint64_t tid = jint(e, "tid");
            /* tracks in stream order: 0, 3, 7 */
            static const char *const want[4] = {"", "stream 0", "stream 3", "stream 7"};
            ck_assert_uint_le(tid, 3);
            ck_assert_str_eq(tn, want[tid]);
            stream_names++;
        }
        if (strcmp(jstr(e, "ph"), "X") != 0)
            continue;
        const jv_t *a = jget(e, "args");
        uint64_t k = jint(a, "op");
        ck_assert_uint_lt(k, NTRICKY);
        ck_assert_str_eq(jstr(e, "name"), tricky[k].json);
        ck_assert_str_eq(jstr(a, "shape"), tricky[NTRICKY - 1 - k].json);
        const jv_t *refs = jget(a, "refs");
        ck_assert_uint_eq(refs->n, 1);
        char want[256];
        snprintf(want, sizeof want, "%d:w %s (%d B)", (int)k, tricky[k].json, (int)(1000 + k));
        ck_assert_str_eq(refs->items[0].s, want);
        found++;
    }
    ck_assert_uint_eq(found, NTRICKY);
    ck_assert_int_eq(stream_names, 3);
    jfree(&root);
    /* the same through a file, for Python */
    const char *d = tmpdir("tricky");
    char path[4200];
    snprintf(path, sizeof path, "%s/trace.json", d);
    ck_assert_msg(ooc_trace_json_write_file(p, NULL, path, err, sizeof err) == 0, "%s", err);
    python_parses(path);
    rmdir_r(d);
    free(text);
    ooc_profile_free(p);
}
END_TEST

START_TEST(test_export_errors_are_reported) {
    ooc_profile_t *p = read_profile("profiles/synthetic/unet-batch16");
    char err[512] = "";
    /* a directory that does not exist */
    ck_assert_int_eq(
        ooc_trace_json_write_file(p, NULL, "/nonexistent/dir/trace.json", err, sizeof err),
        OOC_EIO);
    ck_assert_msg(strstr(err, "/nonexistent/dir/trace.json: cannot create"), "%s", err);
    /* a full disk */
    FILE *f = fopen("/dev/full", "w");
    ck_assert_ptr_nonnull(f);
    setvbuf(f, NULL, _IONBF, 0);
    ck_assert_int_eq(ooc_trace_json_write(p, NULL, f, err, sizeof err), OOC_EIO);
    ooc_model_t *m;
    ck_assert_int_eq(ooc_model_build(p, p->chunk_bytes, &m), 0);
    ooc_timeline_t tl;
    ck_assert_int_eq(ooc_timeline_incore(m, 1, &tl), 0);
    ck_assert_int_eq(ooc_timeline_write(&tl, f), OOC_EIO);
    fclose(f);
    ck_assert_int_eq(ooc_timeline_write_file(&tl, "/nonexistent/tl.tsv", err, sizeof err), OOC_EIO);
    ck_assert_msg(strstr(err, "/nonexistent/tl.tsv: cannot create"), "%s", err);
    /* a timeline of another profile */
    ooc_profile_t *r = read_profile("profiles/synthetic/resnet50-batch64");
    f = fopen("/dev/null", "w");
    ck_assert_int_eq(ooc_trace_json_write(r, &tl, f, err, sizeof err), OOC_EINVAL);
    ck_assert_msg(strstr(err, "the timeline is of"), "%s", err);
    /* a bad chunk size */
    uint64_t chunk = r->chunk_bytes;
    r->chunk_bytes = 3000;
    ck_assert_int_eq(ooc_trace_json_write(r, NULL, f, err, sizeof err), OOC_EINVAL);
    ck_assert_msg(strstr(err, "chunk_bytes"), "%s", err);
    r->chunk_bytes = chunk;
    fclose(f);
    ooc_timeline_free(&tl);
    ooc_model_free(m);
    ooc_profile_free(p);
    ooc_profile_free(r);
}
END_TEST

START_TEST(test_trace_of_another_plan_or_cut_short_is_refused) {
    simcase_t c;
    simcase_open(&c, "profiles/synthetic/unet-batch32", "auto", 0);
    ck_assert_uint_gt(c.r.n_swap, 0);
    char err[512] = "";
    ooc_timeline_t tl;
    /* the plan without its actions: the trace's copies are unexplained */
    ooc_plan_t *empty =
        ooc_plan_new("empty", c.p->nops, c.p->nbufs, c.pl->budget_bytes, c.pl->chunk_bytes);
    ooc_plan_finalize(empty);
    ck_assert_int_eq(ooc_timeline_simulated(c.m, empty, &c.tr, &tl, err, sizeof err), OOC_EINVAL);
    ck_assert_msg(strstr(err, "copied ") && strstr(err, ", no swap-"), "%s", err);
    ooc_timeline_free(&tl);
    /* a trace cut in the middle of a copy: just after the swap-in start nearest before the middle
     * of the trace, or after it when the plan swaps in only in the second half */
    ooc_trace_t cut = c.tr;
    for (cut.n = c.tr.n / 2; cut.n > 0 && cut.ev[cut.n - 1].kind != OOC_TR_H2D_START; cut.n--)
        ;
    if (cut.n == 0)
        for (cut.n = c.tr.n / 2 + 1; cut.n < c.tr.n && cut.ev[cut.n - 1].kind != OOC_TR_H2D_START;
             cut.n++)
            ;
    ck_assert_msg(cut.n > 0 && cut.ev[cut.n - 1].kind == OOC_TR_H2D_START,
                  "the plan swaps in (%u swaps) but its trace has no swap-in start", c.r.n_swap);
    ck_assert_int_eq(ooc_timeline_simulated(c.m, c.pl, &cut, &tl, err, sizeof err), OOC_EINVAL);
    ck_assert_msg(strstr(err, "the trace ends while the"), "%s", err);
    ooc_timeline_free(&tl);
    /* a plan of another size */
    ooc_plan_t *other = ooc_plan_new("other", c.p->nops + 1, c.p->nbufs, 1, 1);
    ck_assert_int_eq(ooc_timeline_simulated(c.m, other, &c.tr, &tl, err, sizeof err), OOC_EINVAL);
    ooc_timeline_free(&tl);
    ooc_plan_free(other);
    ooc_plan_free(empty);
    simcase_close(&c);
}
END_TEST

static uint64_t rnd(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* A random chain of ops on up to three streams: each op writes a new buffer and reads up to two
 * earlier ones that are still alive; a few persistent buffers; producers marked re-executable. */
static ooc_profile_t *random_profile(uint64_t *s) {
    ooc_profile_t *p = ooc_profile_new();
    p->chunk_bytes = 1 << 20;
    p->h2d_bps = 1e9 * (double)(1 + rnd(s) % 20);
    p->d2h_bps = 1e9 * (double)(1 + rnd(s) % 20);
    p->bidir_bps = (p->h2d_bps + p->d2h_bps) * 0.8;
    uint32_t nops = 3 + (uint32_t)(rnd(s) % 40), npers = (uint32_t)(rnd(s) % 4);
    uint32_t nb = npers + nops;
    int64_t *last = calloc(nb, sizeof *last);
    ooc_ref_t(*r)[4] = calloc(nops, sizeof *r);
    uint32_t *nr = calloc(nops, sizeof *nr);
    ck_assert(last && r && nr);
    for (uint32_t i = 0; i < nops; i++) {
        uint32_t avail = npers + i;
        for (int k = 0; k < 2 && avail; k++) {
            uint32_t b = (uint32_t)(rnd(s) % avail);
            int dup = 0;
            for (uint32_t j = 0; j < nr[i]; j++)
                dup |= r[i][j].buf == (int32_t)b;
            if (!dup) {
                r[i][nr[i]++] = (ooc_ref_t){(int32_t)b, OOC_ACCESS_R, 0};
                last[b] = i;
            }
        }
        r[i][nr[i]++] = (ooc_ref_t){(int32_t)(npers + i), OOC_ACCESS_W, 0};
        last[npers + i] = i;
    }
    for (uint32_t b = 0; b < npers; b++)
        ooc_profile_add_buffer(p, 1 + rnd(s) % (3u << 20), -1, -1, 1, "weight", NULL, 0);
    for (uint32_t i = 0; i < nops; i++) {
        int32_t prod = (int32_t)i;
        int pure = 1;
        for (uint32_t j = 0; j + 1 < nr[i]; j++)
            pure &= r[i][j].buf < (int32_t)npers;
        int64_t free_idx = rnd(s) % 5 == 0 ? -1 : last[npers + i];
        ooc_profile_add_buffer(p, 1 + rnd(s) % (4u << 20), i, free_idx, 0, "act", &prod,
                               pure && rnd(s) % 2);
    }
    for (uint32_t i = 0; i < nops; i++)
        ooc_profile_add_op(p, (int32_t)(rnd(s) % 3), (ooc_op_kind_t)(rnd(s) % 5), "op", NULL,
                           1000 + rnd(s) % 100000, r[i], nr[i]);
    free(last);
    free(r);
    free(nr);
    char err[256] = "";
    ck_assert_msg(ooc_profile_validate(p, err, sizeof err) == 0, "%s", err);
    return p;
}

START_TEST(test_random_profiles_give_consistent_timelines) {
    uint64_t seed = tu_seed("test_random_profiles_give_consistent_timelines");
    uint64_t s = seed | 1;
    int simulated = 0;
    for (int iter = 0; iter < 100; iter++) {
        ooc_profile_t *p = random_profile(&s);
        ooc_model_t *m;
        ck_assert_int_eq(ooc_model_build(p, p->chunk_bytes, &m), 0);
        uint64_t maxws = 0;
        for (uint32_t i = 0; i < m->n; i++)
            maxws = m->ws[i] > maxws ? m->ws[i] : maxws;
        uint64_t peak = incore_peak(m);
        uint64_t budget = maxws + rnd(&s) % (peak - maxws + 1);
        char what[96], err[512] = "";
        snprintf(what, sizeof what, "seed %llu iteration %d", (unsigned long long)seed, iter);
        ooc_timeline_t tl;
        ck_assert_int_eq(ooc_timeline_incore(m, budget, &tl), 0);
        ck_assert_msg(tl.peak_bytes == peak, "%s", what);
        char *text = NULL;
        size_t len = 0;
        CAPTURE(text, len, ooc_trace_json_write(p, &tl, MF, err, sizeof err));
        check_trace(p, &tl, text, len);
        free(text);
        ooc_timeline_free(&tl);
        const char *policy = ooc_policy_names[rnd(&s) % 6];
        ooc_policy_opts_t o = {.budget_bytes = budget};
        ooc_plan_t *pl = NULL;
        if (ooc_policy_plan(m, policy, &o, &pl, err, sizeof err) == 0) {
            ooc_trace_t tr = {0};
            ooc_sim_opts_t so = {.trace = &tr};
            ooc_sim_result_t r;
            ck_assert_int_eq(ooc_sim_run(m, pl, &so, &r), 0);
            if (r.feasible) {
                ck_assert_msg(ooc_timeline_simulated(m, pl, &tr, &tl, err, sizeof err) == 0,
                              "%s %s: %s", what, policy, err);
                ck_assert_uint_eq(tl.time_ns, r.time_ns);
                ck_assert_uint_eq(tl.peak_bytes, r.peak_bytes);
                text = NULL;
                len = 0;
                CAPTURE(text, len, ooc_trace_json_write(p, &tl, MF, err, sizeof err));
                trace_facts_t f = check_trace(p, &tl, text, len);
                ck_assert_uint_le(f.max_in_use, budget);
                free(text);
                ooc_timeline_free(&tl);
                simulated++;
            }
            ooc_sim_result_free(&r);
            ooc_trace_free(&tr);
            ooc_plan_free(pl);
        }
        ooc_model_free(m);
        ooc_profile_free(p);
    }
    ck_assert_int_gt(simulated, 20);
}
END_TEST

/* ---- ooc-plan's exports -----------------------------------------------------------------------
 */

static tu_proc_t plan_cli(const char *const args[]) {
    const char *argv[16] = {tu_build_path("ooc-plan")};
    int k = 1;
    for (; args[k - 1] && k < 15; k++)
        argv[k] = args[k - 1];
    argv[k] = NULL;
    tu_proc_t pr;
    ck_assert_int_eq(tu_run(argv, NULL, 120, &pr), 0);
    return pr;
}

static int same_file(const char *a, const char *b) {
    size_t la, lb;
    char *x = slurp(a, &la), *y = slurp(b, &lb);
    int same = la == lb && memcmp(x, y, la) == 0;
    free(x);
    free(y);
    return same;
}

#define PLAN_REF "profiles/synthetic/unet-batch32"

START_TEST(test_ooc_plan_exports_the_chosen_plan) {
    const char *d = tmpdir("cli");
    char plan[4200], tl1[4200], js1[4200], tl2[4200], js2[4200], js3[4200], js4[4200], tl3[4200];
    snprintf(plan, sizeof plan, "%s/plan.tsv", d);
    snprintf(tl1, sizeof tl1, "%s/tl1.tsv", d);
    snprintf(js1, sizeof js1, "%s/t1.json", d);
    snprintf(tl2, sizeof tl2, "%s/tl2.tsv", d);
    snprintf(js2, sizeof js2, "%s/t2.json", d);
    snprintf(js3, sizeof js3, "%s/t3.json", d);
    snprintf(js4, sizeof js4, "%s/t4.json", d);
    snprintf(tl3, sizeof tl3, "%s/tl3.tsv", d);
    /* plan and export */
    tu_proc_t pr = plan_cli((const char *[]){"--policy", "all", "--out", plan, "--timeline", tl1,
                                             "--trace-json", js1, PLAN_REF, NULL});
    ck_assert_msg(pr.status == 0, "%s%s", pr.out, pr.err);
    ck_assert_msg(strstr(pr.out, "timeline (auto) written to") &&
                      strstr(pr.out, "Chrome trace (auto) written to"),
                  "%s", pr.out);
    tu_proc_free(&pr);
    /* the saved plan, simulated again: the same exports, byte for byte */
    pr = plan_cli(
        (const char *[]){"--plan", plan, "--timeline", tl2, "--trace-json", js2, PLAN_REF, NULL});
    ck_assert_msg(pr.status == 0, "%s%s", pr.out, pr.err);
    ck_assert_msg(strstr(pr.out, "\nauto "), "no row for the saved plan in\n%s", pr.out);
    tu_proc_free(&pr);
    ck_assert(same_file(tl1, tl2));
    ck_assert(same_file(js1, js2));
    /* the same as the library gives */
    simcase_t c;
    simcase_open(&c, PLAN_REF, "auto", 0);
    char err[512] = "", tl4[4200];
    snprintf(tl4, sizeof tl4, "%s/tl4.tsv", d);
    ck_assert_int_eq(ooc_trace_json_write_file(c.p, &c.tl, js4, err, sizeof err), 0);
    ck_assert_int_eq(ooc_timeline_write_file(&c.tl, tl4, err, sizeof err), 0);
    ck_assert(same_file(js1, js4));
    ck_assert(same_file(tl1, tl4));
    size_t len;
    char *text = slurp(js1, &len);
    check_trace(c.p, &c.tl, text, len);
    free(text);
    python_parses(js1);
    /* in core: the trace the shim writes for the profile */
    pr = plan_cli(
        (const char *[]){"--incore", "--trace-json", js3, "--timeline", tl3, PLAN_REF, NULL});
    ck_assert_msg(pr.status == 0, "%s%s", pr.out, pr.err);
    ck_assert_msg(strstr(pr.out, "in core: peak"), "%s", pr.out);
    tu_proc_free(&pr);
    ck_assert_int_eq(ooc_trace_json_write_file(c.p, NULL, js4, err, sizeof err), 0);
    ck_assert(same_file(js3, js4));
    simcase_close(&c);
    rmdir_r(d);
}
END_TEST

START_TEST(test_ooc_plan_export_arguments_are_checked) {
    const char *d = tmpdir("cli-bad");
    char plan[4200], bad[4200];
    snprintf(plan, sizeof plan, "%s/plan.tsv", d);
    tu_proc_t pr = plan_cli((const char *[]){"--out", plan, PLAN_REF, NULL});
    ck_assert_msg(pr.status == 0, "%s%s", pr.out, pr.err);
    tu_proc_free(&pr);
    pr = plan_cli((const char *[]){"--plan", plan, "--budget", "8G", PLAN_REF, NULL});
    ck_assert_int_eq(pr.status, 2);
    ck_assert_msg(strstr(pr.err, "--plan simulates a saved plan"), "%s", pr.err);
    tu_proc_free(&pr);
    pr = plan_cli((const char *[]){"--incore", "--policy", "lms", PLAN_REF, NULL});
    ck_assert_int_eq(pr.status, 2);
    ck_assert_msg(strstr(pr.err, "--incore plans nothing"), "%s", pr.err);
    tu_proc_free(&pr);
    /* a plan of another profile */
    pr = plan_cli((const char *[]){"--plan", plan, "profiles/synthetic/resnet50-batch64", NULL});
    ck_assert_int_eq(pr.status, 1);
    ck_assert_msg(strstr(pr.err, "the plan is for"), "%s", pr.err);
    tu_proc_free(&pr);
    /* a malformed plan names its line */
    snprintf(bad, sizeof bad, "%s/bad.tsv", d);
    char cmd[8600];
    snprintf(cmd, sizeof cmd, "sed '3s/\\t[0-9]*\\t/\\tx\\t/' '%s' >'%s'", plan, bad);
    ck_assert_int_eq(system(cmd), 0);
    pr = plan_cli((const char *[]){"--plan", bad, "--timeline", "/dev/null", PLAN_REF, NULL});
    ck_assert_int_eq(pr.status, 1);
    ck_assert_msg(strstr(pr.err, "bad.tsv:3"), "%s", pr.err);
    tu_proc_free(&pr);
    /* an export that cannot be written */
    pr = plan_cli(
        (const char *[]){"--out", "none", "--trace-json", "/nonexistent/t.json", PLAN_REF, NULL});
    ck_assert_int_eq(pr.status, 1);
    ck_assert_msg(strstr(pr.err, "/nonexistent/t.json: cannot create"), "%s", pr.err);
    tu_proc_free(&pr);
    /* an infeasible plan has no timeline, and says so */
    pr = plan_cli((const char *[]){"--budget", "1M", "--out", "none", "--timeline", "/dev/null",
                                   PLAN_REF, NULL});
    ck_assert_int_eq(pr.status, 1);
    ck_assert_msg(strstr(pr.err, "no timeline or trace written"), "%s", pr.err);
    tu_proc_free(&pr);
    rmdir_r(d);
}
END_TEST

/* ---- scripts/ooc-report -----------------------------------------------------------------------
 */

static tu_proc_t report(const char *const args[]) {
    const char *argv[16] = {"scripts/ooc-report"};
    int k = 1;
    for (; args[k - 1] && k < 15; k++)
        argv[k] = args[k - 1];
    argv[k] = NULL;
    char env[4200];
    snprintf(env, sizeof env, "OOC_BUILD=%s", tu_build_dir());
    const char *const envv[] = {env, NULL};
    tu_proc_t pr;
    ck_assert_int_eq(tu_run(argv, envv, 240, &pr), 0);
    return pr;
}

/* A PNG: the signature, then an IHDR chunk with a plausible size. */
static void assert_png(const char *path) {
    size_t len;
    unsigned char *b = (unsigned char *)slurp(path, &len);
    ck_assert_msg(len > 1000, "%s: %zu bytes", path, len);
    ck_assert_msg(memcmp(b, "\x89PNG\r\n\x1a\n", 8) == 0, "%s is not a PNG", path);
    ck_assert(memcmp(b + 12, "IHDR", 4) == 0);
    uint32_t w = (uint32_t)b[16] << 24 | b[17] << 16 | b[18] << 8 | b[19];
    uint32_t h = (uint32_t)b[20] << 24 | b[21] << 16 | b[22] << 8 | b[23];
    ck_assert_msg(w >= 600 && w <= 5000 && h >= 300 && h <= 5000, "%s: %ux%u", path, w, h);
    ck_assert_msg(memcmp(b + len - 8, "IEND", 4) == 0, "%s: no IEND chunk", path);
    free(b);
}

static void assert_svg(const char *path) {
    size_t len;
    char *t = slurp(path, &len);
    ck_assert_msg(len > 1000 && strncmp(t, "<?xml", 5) == 0 && strstr(t, "<svg") &&
                      strstr(t, "</svg>"),
                  "%s is not an SVG", path);
    free(t);
}

/* The report needs python3-matplotlib; CI installs it (scripts/install-deps), so its absence is
 * a failure here, unless OOC_TEST_NO_MATPLOTLIB=1 says it is known to be absent. */
static int report_available(void) {
    if (tu_under_valgrind()) {
        fprintf(stderr, "check_trace_json: ooc-report not run under valgrind (it would trace the "
                        "Python interpreter)\n");
        return 0;
    }
    tu_proc_t pr = report((const char *[]){"--check-deps", NULL});
    int ok = pr.status == 0;
    const char *allow = getenv("OOC_TEST_NO_MATPLOTLIB");
    if (!ok && allow && strcmp(allow, "1") == 0) {
        fprintf(stderr,
                "check_trace_json: SKIPPED the ooc-report tests: %s(OOC_TEST_NO_MATPLOTLIB=1)\n",
                pr.err);
        tu_proc_free(&pr);
        return 0;
    }
    ck_assert_msg(ok, "scripts/ooc-report cannot run: %s", pr.err);
    tu_proc_free(&pr);
    return 1;
}

START_TEST(test_report_renders_pictures_of_a_plan) {
    if (!report_available())
        return;
    const char *d = tmpdir("report");
    char plan[4200], out[4200], path[4400];
    snprintf(plan, sizeof plan, "%s/plan.tsv", d);
    snprintf(out, sizeof out, "%s/pictures", d);
    tu_proc_t pr = plan_cli((const char *[]){"--out", plan, PLAN_REF, NULL});
    ck_assert_msg(pr.status == 0, "%s%s", pr.out, pr.err);
    tu_proc_free(&pr);
    pr = report(
        (const char *[]){PLAN_REF, "--plan", plan, "--out", out, "--format", "png,svg", NULL});
    ck_assert_msg(pr.status == 0, "ooc-report failed:\n%s%s", pr.out, pr.err);
    tu_proc_free(&pr);
    static const char *const pics[] = {"memory", "gantt", "sizes"};
    for (int k = 0; k < 3; k++) {
        snprintf(path, sizeof path, "%s/%s.png", out, pics[k]);
        assert_png(path);
        snprintf(path, sizeof path, "%s/%s.svg", out, pics[k]);
        assert_svg(path);
    }
    /* the trace and the timelines it used are left beside the pictures */
    snprintf(path, sizeof path, "%s/trace.json", out);
    python_parses(path);
    /* without a plan: the recorded streams, the in-core memory */
    snprintf(out, sizeof out, "%s/noplan", d);
    pr = report((const char *[]){PLAN_REF, "--out", out, NULL});
    ck_assert_msg(pr.status == 0, "ooc-report failed:\n%s%s", pr.out, pr.err);
    tu_proc_free(&pr);
    for (int k = 0; k < 3; k++) {
        snprintf(path, sizeof path, "%s/%s.png", out, pics[k]);
        assert_png(path);
        snprintf(path, sizeof path, "%s/%s.svg", out, pics[k]);
        ck_assert_msg(access(path, F_OK) != 0, "%s written, but only png was asked for", path);
    }
    rmdir_r(d);
}
END_TEST

/* Counts the lines of a file that start with `prefix` and contain `needle` (NULL: any). */
static int count_lines(const char *path, const char *prefix, const char *needle) {
    size_t len, plen = strlen(prefix);
    char *t = slurp(path, &len);
    int n = 0;
    for (char *line = t; line && *line;) {
        char *nl = strchr(line, '\n');
        if (nl)
            *nl = '\0';
        if (strncmp(line, prefix, plen) == 0 && (!needle || strstr(line, needle)))
            n++;
        line = nl ? nl + 1 : NULL;
    }
    free(t);
    return n;
}

typedef struct bufsum {
    int shown, total, keep, swap, recomp, outs, ins, recomps;
    char which[32];
} bufsum_t;

/* The report's summary line of the buffers picture. */
static bufsum_t buffers_summary(const char *out) {
    bufsum_t b;
    memset(&b, 0, sizeof b);
    const char *line = strstr(out, "ooc-report: buffers: ");
    ck_assert_msg(line != NULL, "no buffers summary in:\n%s", out);
    ck_assert_int_eq(sscanf(line,
                            "ooc-report: buffers: %d of %d buffers drawn (%31[a-z ]): %d kept, %d "
                            "swapped, %d recomputed; %d swap-outs, %d swap-ins, %d recomputations",
                            &b.shown, &b.total, b.which, &b.keep, &b.swap, &b.recomp, &b.outs,
                            &b.ins, &b.recomps),
                     9);
    return b;
}

#define RECORDED_LARGE "profiles/recorded/large"

/* --plan draws the plan over the profile, buffer by buffer (buffers.png/svg): with --buffers 0
 * every buffer has a row, its decision is the plan's, and every swap-out, swap-in and
 * recomputation of the plan's simulated timeline is drawn; --buffers N keeps the N largest. */
START_TEST(test_report_overlays_the_plan_on_each_buffer) {
    if (!report_available())
        return;
    const char *d = tmpdir("report-buffers");
    char plan[4200], out[4200], path[4400];
    snprintf(plan, sizeof plan, "%s/plan.tsv", d);
    snprintf(out, sizeof out, "%s/all", d);
    tu_proc_t pr =
        plan_cli((const char *[]){"--budget", "40M", "--out", plan, RECORDED_LARGE, NULL});
    ck_assert_msg(pr.status == 0, "%s%s", pr.out, pr.err);
    tu_proc_free(&pr);
    pr = report((const char *[]){RECORDED_LARGE, "--plan", plan, "--buffers", "0", "--out", out,
                                 "--format", "png,svg", NULL});
    ck_assert_msg(pr.status == 0, "ooc-report failed:\n%s%s", pr.out, pr.err);
    bufsum_t b = buffers_summary(pr.out);
    tu_proc_free(&pr);
    snprintf(path, sizeof path, "%s/buffers.png", out);
    assert_png(path);
    snprintf(path, sizeof path, "%s/buffers.svg", out);
    assert_svg(path);
    /* every buffer of the profile, with the plan's decision */
    int nbufs = count_lines(RECORDED_LARGE "/buffers.tsv", "", NULL) - 2;
    ck_assert_int_eq(b.total, nbufs);
    ck_assert_int_eq(b.shown, nbufs);
    ck_assert_str_eq(b.which, "all");
    int plan_swap = count_lines(plan, "buffer\t", "\tswap\t");
    int plan_recomp = count_lines(plan, "buffer\t", "\trecompute\t");
    ck_assert_int_gt(plan_swap, 0);
    ck_assert_int_eq(b.swap, plan_swap);
    ck_assert_int_eq(b.recomp, plan_recomp);
    ck_assert_int_eq(b.keep, nbufs - plan_swap - plan_recomp);
    /* every transfer and recomputation of the simulated timeline that the report left beside */
    snprintf(path, sizeof path, "%s/timeline.tsv", out);
    ck_assert_int_gt(b.outs, 0);
    ck_assert_int_eq(b.outs, count_lines(path, "d2h\t", NULL));
    ck_assert_int_eq(b.ins, count_lines(path, "h2d\t", NULL));
    ck_assert_int_eq(b.recomps, count_lines(path, "compute\t", "\trecompute\t"));

    /* --buffers 5: the five largest (4 MiB each; equal sizes by id: 0, 1, 4, 5, 8) */
    snprintf(out, sizeof out, "%s/five", d);
    pr = report((const char *[]){RECORDED_LARGE, "--plan", plan, "--buffers", "5", "--out", out,
                                 "--format", "svg", NULL});
    ck_assert_msg(pr.status == 0, "ooc-report failed:\n%s%s", pr.out, pr.err);
    b = buffers_summary(pr.out);
    tu_proc_free(&pr);
    ck_assert_int_eq(b.shown, 5);
    ck_assert_int_eq(b.total, nbufs);
    ck_assert_str_eq(b.which, "the largest");
    ck_assert_int_eq(b.keep + b.swap + b.recomp, 5);
    snprintf(path, sizeof path, "%s/buffers.svg", out);
    assert_svg(path);
    size_t len;
    char *svg = slurp(path, &len);
    static const char *const rows[] = {">#0 4.00 MiB", ">#1 4.00 MiB", ">#4 4.00 MiB",
                                       ">#5 4.00 MiB", ">#8 4.00 MiB"};
    for (int k = 0; k < 5; k++)
        ck_assert_msg(strstr(svg, rows[k]) != NULL, "no row %s in %s", rows[k] + 1, path);
    ck_assert_msg(strstr(svg, ">#2 ") == NULL, "buffer 2 (4 KiB) has a row in %s", path);
    ck_assert_msg(strstr(svg, "the 5 largest of") != NULL, "%s: no title", path);
    free(svg);
    snprintf(path, sizeof path, "%s/buffers.png", out);
    ck_assert_msg(access(path, F_OK) != 0, "%s written, but only svg was asked for", path);
    rmdir_r(d);
}
END_TEST

/* The last line of text (without its newline). */
static const char *last_line(const char *text, char *buf, size_t len) {
    size_t n = strlen(text);
    while (n && text[n - 1] == '\n')
        n--;
    size_t st = n;
    while (st && text[st - 1] != '\n')
        st--;
    snprintf(buf, len, "%.*s", (int)(n - st), text + st);
    return buf;
}

START_TEST(test_report_rejects_bad_input_in_one_line) {
    if (!report_available())
        return;
    const char *d = tmpdir("report-bad");
    char line[1024], dir[4200], cmd[13000];
    tu_proc_t pr = report((const char *[]){"/nonexistent/profile", NULL});
    ck_assert_int_eq(pr.status, 2);
    ck_assert_msg(strstr(pr.err, "/nonexistent/profile"), "%s", pr.err);
    ck_assert_msg(strchr(pr.err, '\n') == pr.err + strlen(pr.err) - 1, "not one line: %s", pr.err);
    tu_proc_free(&pr);
    /* a malformed buffers.tsv: the file, the line and the field */
    snprintf(dir, sizeof dir, "%s/prof", d);
    snprintf(cmd, sizeof cmd,
             "mkdir -p '%s' && cp %s/*.tsv '%s'/ && sed -i '5s/\\t[0-9]*\\t/\\tbig\\t/' "
             "'%s/buffers.tsv'",
             dir, PLAN_REF, dir, dir);
    ck_assert_int_eq(system(cmd), 0);
    pr = report((const char *[]){dir, "--out", d, NULL});
    ck_assert_int_eq(pr.status, 2);
    ck_assert_msg(strstr(last_line(pr.err, line, sizeof line), "buffers.tsv:5: field bytes"), "%s",
                  pr.err);
    ck_assert_msg(strchr(pr.err, '\n') == pr.err + strlen(pr.err) - 1, "not one line: %s", pr.err);
    tu_proc_free(&pr);
    /* a missing ops.tsv */
    snprintf(cmd, sizeof cmd, "rm '%s/ops.tsv'", dir);
    ck_assert_int_eq(system(cmd), 0);
    pr = report((const char *[]){dir, "--out", d, NULL});
    ck_assert_int_eq(pr.status, 2);
    ck_assert_msg(strstr(pr.err, "ops.tsv"), "%s", pr.err);
    tu_proc_free(&pr);
    /* a bad format, a plan that is not there */
    pr = report((const char *[]){PLAN_REF, "--format", "gif", "--out", d, NULL});
    ck_assert_int_eq(pr.status, 2);
    ck_assert_msg(strstr(pr.err, "gif"), "%s", pr.err);
    tu_proc_free(&pr);
    pr = report((const char *[]){PLAN_REF, "--plan", "/nonexistent/plan.tsv", "--out", d, NULL});
    ck_assert_int_eq(pr.status, 2);
    ck_assert_msg(strstr(pr.err, "/nonexistent/plan.tsv"), "%s", pr.err);
    tu_proc_free(&pr);
    /* --buffers: a count, and only with a plan */
    static const char *const bad_counts[] = {"many", "-2", ""};
    for (int k = 0; k < 3; k++) {
        char want[64];
        snprintf(want, sizeof want, "--buffers '%s'", bad_counts[k]);
        pr = report((const char *[]){PLAN_REF, "--plan", "/nonexistent/plan.tsv", "--buffers",
                                     bad_counts[k], "--out", d, NULL});
        ck_assert_int_eq(pr.status, 2);
        ck_assert_msg(strstr(pr.err, want), "%s", pr.err);
        ck_assert_msg(strchr(pr.err, '\n') == pr.err + strlen(pr.err) - 1, "not one line: %s",
                      pr.err);
        tu_proc_free(&pr);
    }
    pr = report((const char *[]){PLAN_REF, "--buffers", "3", "--out", d, NULL});
    ck_assert_int_eq(pr.status, 2);
    ck_assert_msg(strstr(pr.err, "needs --plan"), "%s", pr.err);
    tu_proc_free(&pr);
    rmdir_r(d);
}
END_TEST

Suite *suite_trace_json(void) {
    list_refs();
    Suite *s = suite_create("trace_json");
    TCase *tc = tcase_create("trace");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, test_profile_trace_has_every_op_once_on_its_stream, 0, nrefs);
    tcase_add_test(tc, test_tricky_names_are_escaped);
    tcase_add_test(tc, test_export_errors_are_reported);
    tcase_add_test(tc, test_incore_timeline_tsv_follows_the_profile);
    suite_add_tcase(s, tc);
    TCase *ts = tcase_create("simulated");
    tcase_set_timeout(ts, 300);
    tcase_add_loop_test(ts, test_simulated_trace_shows_the_plan_within_budget, 0, nrefs);
    tcase_add_loop_test(ts, test_timeline_tsv_round_trips_against_the_simulator, 0,
                        (int)(sizeof rt_cases / sizeof rt_cases[0]));
    tcase_add_test(ts, test_trace_of_another_plan_or_cut_short_is_refused);
    tcase_add_test(ts, test_random_profiles_give_consistent_timelines);
    suite_add_tcase(s, ts);
    TCase *tp = tcase_create("ooc_plan");
    tcase_set_timeout(tp, 120);
    tcase_add_test(tp, test_ooc_plan_exports_the_chosen_plan);
    tcase_add_test(tp, test_ooc_plan_export_arguments_are_checked);
    suite_add_tcase(s, tp);
    TCase *tr = tcase_create("report");
    tcase_set_timeout(tr, 300);
    tcase_add_test(tr, test_report_renders_pictures_of_a_plan);
    tcase_add_test(tr, test_report_rejects_bad_input_in_one_line);
    tcase_add_test(tr, test_report_overlays_the_plan_on_each_buffer);
    suite_add_tcase(s, tr);
    return s;
}
