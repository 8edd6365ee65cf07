/* SPDX-License-Identifier: MIT */
/* options.c: the one table of OOC_* options, its parser, and the once-per-process load.
 *
 * Each row of `table` is an option: its name, type, default, accepted form and one line of
 * documentation. The parser is driven by the table alone: it applies each documented default by
 * parsing the row's `def` (so the documentation cannot drift from the behaviour), then each value
 * the caller's getter returns. Nothing here allocates. ooc_options_load is the only reader of
 * the environment in the shim, and it runs once (pthread_once); a forked child keeps its parent's
 * options, which came from the same environment. Callers: the shim's lazy initialisation. */
#include "options.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"

static const char *const mode_words[] = {"off", "demand", "record", "auto", NULL};
static const char *const policy_words[] = {"swapall", "lms",    "superneurons", "window",
                                           "pooch",   "belady", "auto",         NULL};
static const char *const safe_words[] = {"auto", "on", "off", NULL};
static const char *const log_words[] = {"error", "warn", "info", "debug", NULL};

#define SIZE_FORM  "bytes with an optional K/M/G/T suffix (e.g. 16G)"
#define OFF(field) offsetof(ooc_options_t, field)

/* The options. README.md has one row per entry (test_readme_documents_every_option). Rows with
 * dynamic = 1 have a default computed at run time; `def` then describes it. */
static const ooc_option_desc_t table[] = {
    {.name = "OOC_BUDGET",
     .type = OOC_OPT_SIZE_PCT,
     .def = "free device memory less OOC_RESERVE",
     .accepted = SIZE_FORM " or a percentage of device memory (e.g. 80%)",
     .doc = "Device memory the program's buffers may occupy; the rest lives in host memory.",
     .offset = OFF(budget),
     .min = 1,
     .dynamic = 1},
    /* 1G: a CUDA context takes 300-500 MiB of device memory outside any allocation, and cuBLAS
     * and cuDNN allocate workspaces (tens to hundreds of MiB) that the shim does not see. */
    {.name = "OOC_RESERVE",
     .type = OOC_OPT_SIZE_PCT,
     .def = "1G",
     .accepted = SIZE_FORM " or a percentage of device memory (e.g. 5%)",
     .doc = "Device memory kept free for the CUDA context and library workspaces when "
            "OOC_BUDGET is not set.",
     .offset = OFF(reserve)},
    {.name = "OOC_CHUNK",
     .type = OOC_OPT_SIZE_AUTO,
     .def = "auto",
     .accepted = "auto, or a power of two from 64K to 1G with an optional K/M/G suffix (e.g. 2M)",
     .doc = "Physical chunk size; auto: the budget / 256 rounded down to a power of two, at most "
            "32M; always rounded up to the device's allocation granularity.",
     .offset = OFF(chunk),
     .min = 64 * 1024,
     .max = 1024 * 1024 * 1024,
     .pow2 = 1},
    {.name = "OOC_WINDOW",
     .type = OOC_OPT_SIZE_AUTO,
     .def = "auto",
     .accepted = "auto, or " SIZE_FORM,
     .doc = "Bytes of transfers kept in flight ahead of compute; auto lets the planner tune it.",
     .offset = OFF(window),
     .min = 1},
    {.name = "OOC_MODE",
     .type = OOC_OPT_CHOICE,
     .def = "auto",
     .accepted = "one of off, demand, record, auto",
     .doc = "off: pass-through; demand: swap on demand; record: demand and record a profile; "
            "auto: record, plan, replay.",
     .offset = OFF(mode),
     .choices = mode_words},
    {.name = "OOC_POLICY",
     .type = OOC_OPT_CHOICE,
     .def = "auto",
     .accepted = "one of swapall, lms, superneurons, window, pooch, belady, auto",
     .doc = "The planner's policy; auto picks the best plan the simulator finds.",
     .offset = OFF(policy),
     .choices = policy_words},
    {.name = "OOC_PROFILE_DIR",
     .type = OOC_OPT_PATH,
     .def = "./ooc-profiles/<program>-<pid>",
     .accepted = "a directory path",
     .doc = "Where the recorded profile and the plan are written; rank R of a data-parallel "
            "run (RANK, WORLD_SIZE > 1) writes DIR/rankR.",
     .offset = OFF(profile_dir),
     .dynamic = 1},
    {.name = "OOC_PROFILE_ITERS",
     .type = OOC_OPT_INT,
     .def = "3",
     .accepted = "an integer from 1 to 1000",
     .doc = "Iterations recorded before planning; the first (warm-up) is not planned on.",
     .offset = OFF(profile_iters),
     .min = 1,
     .max = 1000},
    {.name = "OOC_PLAN",
     .type = OOC_OPT_PATH,
     .def = "none",
     .accepted = "a path to a saved plan file",
     .doc = "In OOC_MODE=auto, replay this saved plan (its profile is the directory the file is "
            "in) instead of recording; ops that do not match it run on demand, and repeated "
            "mismatch records anew.",
     .offset = OFF(plan),
     .dynamic = 1},
    {.name = "OOC_LOG",
     .type = OOC_OPT_CHOICE,
     .def = "warn",
     .accepted = "one of error, warn, info, debug",
     .doc = "The least severe level of log line written.",
     .offset = OFF(log_level),
     .choices = log_words},
    {.name = "OOC_STATS",
     .type = OOC_OPT_BOOL,
     .def = "0",
     .accepted = "0 or 1",
     .doc = "1: print a table of statistics (peak resident, bytes swapped, stalls) at exit.",
     .offset = OFF(stats)},
    {.name = "OOC_SAFE",
     .type = OOC_OPT_CHOICE,
     .def = "auto",
     .accepted = "one of auto, on, off",
     .doc = "Safe mode: map a swapped buffer's address to its host copy so that a stray access "
            "is slow but correct; auto: on when the device supports host-located VMM memory.",
     .offset = OFF(safe),
     .choices = safe_words},
    {.name = "OOC_SAFE_STAGE",
     .type = OOC_OPT_BOOL,
     .def = "0",
     .accepted = "0 or 1",
     .doc = "Safe mode, planned swap-ins: 1: copied in beside the buffer's host alias, which is "
            "read-only meanwhile, and moved to its address at its next use, so the copy overlaps "
            "the compute (a write through a pointer the shim cannot see into the buffer meanwhile "
            "faults); 0: the address is moved first, after the device finishes the work issued "
            "so far, and the copy in follows (such a write is kept, the copy does not overlap "
            "the compute).",
     .offset = OFF(safe_stage)},
    {.name = "OOC_REMAP_GATE",
     .type = OOC_OPT_BOOL,
     .def = "0",
     .accepted = "0 or 1",
     .doc = "Replay, experimental: 1: a planned swap-in whose buffer is still being copied "
            "out, its memory given to another, does not hold the program's thread until the copy "
            "out ends: its copy in waits on the GPU behind a word of host memory that a shim "
            "thread writes once it has moved the address to new memory; in safe mode, a planned "
            "swap-in of a buffer whose address shows its host copy does not wait on the host for "
            "the device to finish the work that may reach it: the shim thread moves the address "
            "once the device got there, and every operation issued meanwhile waits for the copy "
            "in on the GPU. Relies on driver behaviour the documentation does not promise (work "
            "queued before a remap reads the new memory; unmapping does not wait for a stream "
            "that waits on host memory; an H200 showed both); 0: the host waits.",
     .offset = OFF(remap_gate)},
    {.name = "OOC_GATE_TIMEOUT",
     .type = OOC_OPT_INT,
     .def = "60",
     .accepted = "an integer from 1 to 86400 (seconds)",
     .doc = "With OOC_REMAP_GATE=1: a mapping call behind a gate that has not returned in this "
            "many seconds stops the program with an error that says so (a driver that waits for "
            "the device before it remaps would otherwise hang it); a copy out waited for that "
            "long, or a gate with no remap to open it, is reported.",
     .offset = OFF(gate_timeout),
     .min = 1,
     .max = 86400},
    {.name = "OOC_REUSE",
     .type = OOC_OPT_BOOL,
     .def = "1",
     .accepted = "0 or 1",
     .doc = "1: a freed buffer's memory stays mapped at its address and serves the next "
            "allocation of the same size with no driver call (a use after free then reads stale "
            "bytes); 0: it is unmapped at once, so that a use after free faults.",
     .offset = OFF(reuse)},
    {.name = "OOC_LOG_FILE",
     .type = OOC_OPT_PATH,
     .def = "stderr",
     .accepted = "a file path (opened for appending), or stderr",
     .doc = "Where log lines and the statistics table go.",
     .offset = OFF(log_file)},
};

_Static_assert(OOC_ARRAY_SIZE(table) <= 32, "set_mask has one bit per option");

const ooc_option_desc_t *ooc_options_table(size_t *n) {
    if (n)
        *n = OOC_ARRAY_SIZE(table);
    return table;
}

const ooc_option_desc_t *ooc_options_find(const char *name) {
    for (size_t i = 0; i < OOC_ARRAY_SIZE(table); i++)
        if (strcmp(table[i].name, name) == 0)
            return &table[i];
    return NULL;
}

/* ---- scanning -------------------------------------------------------------------------------- */

static int is_space(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

static int is_digit(char c) {
    return c >= '0' && c <= '9';
}

static char lower(char c) {
    return c >= 'A' && c <= 'Z' ? (char)(c - 'A' + 'a') : c;
}

/* Copies s without surrounding white space into buf (cut to len - 1 bytes). */
static void trim_copy(const char *s, char *buf, size_t len) {
    while (is_space(*s))
        s++;
    size_t n = strlen(s);
    while (n > 0 && is_space(s[n - 1]))
        n--;
    if (n >= len)
        n = len - 1;
    memcpy(buf, s, n);
    buf[n] = '\0';
}

static int equals_nocase(const char *a, const char *b) {
    for (; *a && *b; a++, b++)
        if (lower(*a) != lower(*b))
            return 0;
    return *a == *b;
}

/* Reads decimal digits at *p into *v, advancing *p past all of them. Returns the number of
 * digits, or -1 when the number overflows a uint64_t (all its digits are still consumed). */
static int digits(const char **p, uint64_t *v) {
    int n = 0, overflow = 0;
    *v = 0;
    for (; is_digit(**p); (*p)++, n++) {
        if (__builtin_mul_overflow(*v, 10, v) ||
            __builtin_add_overflow(*v, (uint64_t)(**p - '0'), v))
            overflow = 1;
    }
    return overflow ? -1 : n;
}

int ooc_options_parse_size(const char *s, uint64_t *bytes) {
    char buf[64];
    if (strlen(s) >= sizeof buf)
        return OOC_EINVAL; /* no valid size is this long; saves a longer buffer */
    trim_copy(s, buf, sizeof buf);
    const char *p = buf;
    uint64_t whole, frac = 0, frac_div = 1;
    int nd = digits(&p, &whole);
    if (nd == 0)
        return OOC_EINVAL;
    /* On overflow keep scanning, so that "99999999999999999999X" is reported as malformed. */
    int has_frac = 0;
    if (*p == '.') {
        p++;
        if (!is_digit(*p))
            return OOC_EINVAL;
        has_frac = 1;
        /* Six digits are more precision than any size needs; later digits are ignored. */
        for (int i = 0; is_digit(*p); p++, i++) {
            if (i < 6) {
                frac = frac * 10 + (uint64_t)(*p - '0');
                frac_div *= 10;
            }
        }
    }
    uint64_t mult = 1;
    switch (lower(*p)) {
    case 'k':
        mult = OOC_KiB;
        break;
    case 'm':
        mult = OOC_MiB;
        break;
    case 'g':
        mult = OOC_GiB;
        break;
    case 't':
        mult = OOC_TiB;
        break;
    default:
        break;
    }
    if (mult > 1) {
        p++;
        if (lower(p[0]) == 'i' && lower(p[1]) == 'b')
            p += 2;
        else if (lower(p[0]) == 'b')
            p++;
    } else if (lower(p[0]) == 'b') {
        p++;
    }
    if (*p != '\0')
        return OOC_EINVAL;
    if (has_frac && mult == 1)
        return OOC_EINVAL; /* "1.5" bytes is not a size */
    if (nd < 0)
        return OOC_ERANGE;
    uint64_t v;
    /* frac < 10^6 and mult <= 2^40, so frac * mult < 2^60: no overflow. */
    if (__builtin_mul_overflow(whole, mult, &v) ||
        __builtin_add_overflow(v, frac * mult / frac_div, &v))
        return OOC_ERANGE;
    *bytes = v;
    return 0;
}

/* Parses "80%", "12.5%" into hundredths of a percent. Returns 0, OOC_EINVAL when malformed,
 * OOC_ERANGE above 100%. */
static int parse_percent(const char *s, uint32_t *pct_x100) {
    const char *p = s;
    uint64_t whole, frac = 0;
    int nd = digits(&p, &whole);
    if (nd == 0)
        return OOC_EINVAL;
    if (*p == '.') {
        p++;
        int nf = 0;
        for (; is_digit(*p); p++, nf++)
            if (nf < 2)
                frac = frac * 10 + (uint64_t)(*p - '0');
        if (nf == 0)
            return OOC_EINVAL;
        if (nf == 1)
            frac *= 10;
    }
    if (p[0] != '%' || p[1] != '\0')
        return OOC_EINVAL;
    if (nd < 0 || whole > 100 || (whole == 100 && frac > 0))
        return OOC_ERANGE;
    *pct_x100 = (uint32_t)(whole * 100 + frac);
    return 0;
}

static int parse_int(const char *s, int64_t *v) {
    const char *p = s;
    uint64_t u;
    int nd = digits(&p, &u);
    if (nd == 0 || *p != '\0')
        return OOC_EINVAL;
    if (nd < 0 || u > INT64_MAX)
        return OOC_ERANGE;
    *v = (int64_t)u;
    return 0;
}

/* ---- error messages -------------------------------------------------------------------------- */

/* Writes `NAME=value: problem; expected form` into err. The value is cut at 64 bytes and its
 * control characters shown as '?', so that the message stays one readable line. */
static void OOC_PRINTF(5, 6) fail(char *err, size_t errlen, const ooc_option_desc_t *d,
                                  const char *value, const char *fmt, ...) {
    if (errlen == 0)
        return;
    char shown[72];
    size_t n = 0;
    for (; value[n] && n < 64; n++)
        shown[n] = (unsigned char)value[n] < 0x20 || value[n] == 0x7f ? '?' : value[n];
    if (value[n]) {
        memcpy(shown + n, "...", 3);
        n += 3;
    }
    shown[n] = '\0';
    char problem[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(problem, sizeof problem, fmt, ap);
    va_end(ap);
    snprintf(err, errlen, "%s=%s: %s; expected %s", d->name, shown, problem, d->accepted);
}

/* ---- the parser ------------------------------------------------------------------------------ */

static int is_pow2(uint64_t v) {
    return v != 0 && (v & (v - 1)) == 0;
}

char *ooc_options_fmt_size(uint64_t b, char *buf, size_t len) {
    static const char units[] = "KMGT";
    int u = -1;
    while (u < 3 && b >= 1024 && b % 1024 == 0) {
        b /= 1024;
        u++;
    }
    if (u < 0)
        snprintf(buf, len, "%llu", (unsigned long long)b);
    else
        snprintf(buf, len, "%llu%c", (unsigned long long)b, units[u]);
    return buf;
}

/* Checks a size against the row's bounds and alignment. */
static int check_size(const ooc_option_desc_t *d, const char *value, uint64_t b, char *err,
                      size_t errlen) {
    char lim[32];
    if (d->min > 0 && b < (uint64_t)d->min) {
        if (d->min == 1)
            fail(err, errlen, d, value, "must be more than 0");
        else
            fail(err, errlen, d, value, "below the minimum of %s",
                 ooc_options_fmt_size((uint64_t)d->min, lim, sizeof lim));
        return OOC_ERANGE;
    }
    if (d->max > 0 && b > (uint64_t)d->max) {
        fail(err, errlen, d, value, "above the maximum of %s",
             ooc_options_fmt_size((uint64_t)d->max, lim, sizeof lim));
        return OOC_ERANGE;
    }
    if (d->pow2 && !is_pow2(b)) {
        fail(err, errlen, d, value, "not a power of two");
        return OOC_EINVAL;
    }
    return 0;
}

static int size_error(const ooc_option_desc_t *d, const char *value, int rc, char *err,
                      size_t errlen) {
    if (rc == OOC_ERANGE)
        fail(err, errlen, d, value, "too large (more than 2^64 - 1 bytes)");
    else
        fail(err, errlen, d, value, "not a size");
    return rc;
}

/* Parses value (non-empty) into the field of row d in *o. */
static int set_value(const ooc_option_desc_t *d, const char *value, ooc_options_t *o, char *err,
                     size_t errlen) {
    char *field = (char *)o + d->offset;
    char word[64];
    int rc;

    if (d->type == OOC_OPT_PATH) {
        size_t n = strlen(value);
        if (n >= OOC_PATH_MAX) {
            fail(err, errlen, d, value, "longer than %d bytes", OOC_PATH_MAX - 1);
            return OOC_ERANGE;
        }
        /* The word "stderr" is the default of OOC_LOG_FILE, stored as "". */
        if (d->offset == OFF(log_file) && strcmp(value, "stderr") == 0)
            n = 0;
        memcpy(field, value, n);
        field[n] = '\0';
        return 0;
    }

    if (strlen(value) >= sizeof word) {
        fail(err, errlen, d, value, "too long");
        return OOC_EINVAL;
    }
    trim_copy(value, word, sizeof word);

    switch (d->type) {
    case OOC_OPT_SIZE: {
        uint64_t b;
        if ((rc = ooc_options_parse_size(word, &b)) < 0)
            return size_error(d, value, rc, err, errlen);
        if ((rc = check_size(d, value, b, err, errlen)) < 0)
            return rc;
        memcpy(field, &b, sizeof b);
        return 0;
    }
    case OOC_OPT_SIZE_PCT:
    case OOC_OPT_SIZE_AUTO: {
        ooc_size_spec_t spec = {.kind = OOC_SIZE_BYTES};
        size_t n = strlen(word);
        if (d->type == OOC_OPT_SIZE_AUTO && equals_nocase(word, "auto")) {
            spec.kind = OOC_SIZE_AUTO;
        } else if (d->type == OOC_OPT_SIZE_PCT && n > 0 && word[n - 1] == '%') {
            if ((rc = parse_percent(word, &spec.pct_x100)) < 0) {
                fail(err, errlen, d, value,
                     rc == OOC_ERANGE ? "a percentage above 100" : "not a percentage");
                return rc;
            }
            if (d->min > 0 && spec.pct_x100 == 0) {
                fail(err, errlen, d, value, "must be more than 0");
                return OOC_ERANGE;
            }
            spec.kind = OOC_SIZE_PERCENT;
        } else {
            if ((rc = ooc_options_parse_size(word, &spec.bytes)) < 0)
                return size_error(d, value, rc, err, errlen);
            if ((rc = check_size(d, value, spec.bytes, err, errlen)) < 0)
                return rc;
        }
        memcpy(field, &spec, sizeof spec);
        return 0;
    }
    case OOC_OPT_CHOICE:
        for (int i = 0; d->choices[i]; i++) {
            if (equals_nocase(word, d->choices[i])) {
                memcpy(field, &i, sizeof i);
                return 0;
            }
        }
        fail(err, errlen, d, value, "unknown value");
        return OOC_EINVAL;
    case OOC_OPT_INT: {
        int64_t v;
        if ((rc = parse_int(word, &v)) == OOC_EINVAL) {
            fail(err, errlen, d, value, "not an integer");
            return rc;
        }
        if (rc < 0 || v < d->min || v > d->max) {
            fail(err, errlen, d, value, "out of range");
            return OOC_ERANGE;
        }
        int iv = (int)v;
        memcpy(field, &iv, sizeof iv);
        return 0;
    }
    case OOC_OPT_BOOL: {
        static const char *const yes[] = {"1", "on", "yes", "true"};
        static const char *const no[] = {"0", "off", "no", "false"};
        for (int b = 0; b < 2; b++) {
            for (size_t i = 0; i < OOC_ARRAY_SIZE(yes); i++) {
                if (equals_nocase(word, b ? yes[i] : no[i])) {
                    memcpy(field, &b, sizeof b);
                    return 0;
                }
            }
        }
        fail(err, errlen, d, value, "not 0 or 1");
        return OOC_EINVAL;
    }
    case OOC_OPT_PATH:
        break;
    }
    fail(err, errlen, d, value, "option of unknown type");
    return OOC_EINVAL;
}

static void defaults(ooc_options_t *o) {
    memset(o, 0, sizeof *o);
    for (size_t i = 0; i < OOC_ARRAY_SIZE(table); i++) {
        if (table[i].dynamic)
            continue;
        /* The defaults are tested to parse (test_defaults_when_unset). */
        (void)set_value(&table[i], table[i].def, o, NULL, 0);
    }
}

int ooc_options_parse(ooc_options_get_fn get, void *ctx, ooc_options_t *out, char *err,
                      size_t errlen) {
    int first = 0;
    if (errlen > 0)
        err[0] = '\0';
    defaults(out);
    for (size_t i = 0; i < OOC_ARRAY_SIZE(table); i++) {
        const char *v = get ? get(table[i].name, ctx) : NULL;
        if (!v || !*v)
            continue;
        /* Report the first bad value; keep parsing so that *out holds every good one. */
        int rc = set_value(&table[i], v, out, first ? NULL : err, first ? 0 : errlen);
        if (rc < 0) {
            if (!first)
                first = rc;
            continue;
        }
        out->set_mask |= UINT32_C(1) << i;
    }
    if (first)
        return first;

    /* A budget smaller than one chunk could never hold a buffer. */
    if (out->budget.kind == OOC_SIZE_BYTES && out->chunk.kind == OOC_SIZE_BYTES &&
        out->budget.bytes < out->chunk.bytes) {
        char c[32];
        const ooc_option_desc_t *d = ooc_options_find("OOC_BUDGET");
        fail(err, errlen, d, get(d->name, ctx), "smaller than one chunk (OOC_CHUNK is %s)",
             ooc_options_fmt_size(out->chunk.bytes, c, sizeof c));
        return OOC_ERANGE;
    }
    return 0;
}

/* ---- unknown names --------------------------------------------------------------------------- */

/* Optimal-string-alignment distance (edits and adjacent swaps) between short strings; a large
 * number when either is longer than 47 bytes. */
static int distance(const char *a, const char *b) {
    enum { W = 48 };
    int rows[3][W];
    size_t la = strlen(a), lb = strlen(b);
    if (la >= W || lb >= W)
        return 1 << 20;
    int *pp = rows[0], *prev = rows[1], *cur = rows[2];
    for (size_t j = 0; j <= lb; j++)
        prev[j] = (int)j;
    for (size_t i = 1; i <= la; i++) {
        cur[0] = (int)i;
        for (size_t j = 1; j <= lb; j++) {
            int cost = a[i - 1] != b[j - 1];
            int v = prev[j] + 1;
            if (cur[j - 1] + 1 < v)
                v = cur[j - 1] + 1;
            if (prev[j - 1] + cost < v)
                v = prev[j - 1] + cost;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] && pp[j - 2] + 1 < v)
                v = pp[j - 2] + 1;
            cur[j] = v;
        }
        int *t = pp;
        pp = prev;
        prev = cur;
        cur = t;
    }
    return prev[lb];
}

size_t ooc_options_warn_unknown(const char *const *envp) {
    size_t unknown = 0;
    for (; envp && *envp; envp++) {
        const char *e = *envp;
        if (strncmp(e, "OOC_", 4) != 0)
            continue;
        char name[128];
        size_t n = strcspn(e, "=");
        if (n >= sizeof name)
            n = sizeof name - 1;
        memcpy(name, e, n);
        name[n] = '\0';
        if (strncmp(name, "OOC_TEST_", 9) == 0 || strcmp(name, "OOC_BUILD") == 0)
            continue;
        if (ooc_options_find(name))
            continue;
        unknown++;
        const char *best = NULL;
        int best_d = 3; /* suggest only within two edits */
        for (size_t i = 0; i < OOC_ARRAY_SIZE(table); i++) {
            int dist = distance(name, table[i].name);
            if (dist < best_d) {
                best_d = dist;
                best = table[i].name;
            }
        }
        if (best)
            OOC_LOG_W("%s is not an ooc-shim option and is ignored; did you mean %s?", name, best);
        else
            OOC_LOG_W("%s is not an ooc-shim option and is ignored; see README.md for the list",
                      name);
    }
    return unknown;
}

/* ---- loading from the environment ----------------------------------------------------------- */

static pthread_once_t load_once_ctl = PTHREAD_ONCE_INIT;
static ooc_options_t loaded;
static int load_status;
static char load_err[512];

static const char *env_get(const char *name, void *ctx) {
    (void)ctx;
    return getenv(name);
}

static void load_once(void) {
    int rc = ooc_options_parse(env_get, NULL, &loaded, load_err, sizeof load_err);
    int fd = -1;
    if (rc == 0 && loaded.log_file[0]) {
        fd = open(loaded.log_file, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        if (fd < 0) {
            char why[128];
            const char *s = strerror_r(errno, why, sizeof why);
            fail(load_err, sizeof load_err, ooc_options_find("OOC_LOG_FILE"), loaded.log_file,
                 "cannot open for appending (%s)", s);
            rc = OOC_EIO;
        }
    }
    if (rc < 0) {
        defaults(&loaded);
        load_status = rc;
        OOC_LOG_E("%s", load_err);
        return;
    }
    ooc_log_set_level(loaded.log_level);
    if (fd >= 0)
        ooc_log_set_fd(fd);
    ooc_options_warn_unknown((const char *const *)environ);
}

int ooc_options_load(void) {
    pthread_once(&load_once_ctl, load_once);
    return load_status;
}

const ooc_options_t *ooc_options(void) {
    pthread_once(&load_once_ctl, load_once);
    return &loaded;
}

const char *ooc_options_error(void) {
    pthread_once(&load_once_ctl, load_once);
    return load_status < 0 ? load_err : "";
}

/* ---- resolvers ------------------------------------------------------------------------------- */

/* total * pct_x100 / 10000 without overflow (pct_x100 <= 10000). */
static uint64_t share(uint64_t total, uint32_t pct_x100) {
    return total / 10000 * pct_x100 + total % 10000 * pct_x100 / 10000;
}

uint64_t ooc_options_reserve_bytes(const ooc_options_t *o, uint64_t device_total) {
    if (o->reserve.kind == OOC_SIZE_PERCENT)
        return share(device_total, o->reserve.pct_x100);
    return o->reserve.bytes;
}

uint64_t ooc_options_budget_bytes(const ooc_options_t *o, uint64_t device_total,
                                  uint64_t device_free) {
    switch (o->budget.kind) {
    case OOC_SIZE_BYTES:
        return o->budget.bytes;
    case OOC_SIZE_PERCENT:
        return share(device_total, o->budget.pct_x100);
    default: {
        uint64_t reserve = ooc_options_reserve_bytes(o, device_total);
        return device_free > reserve ? device_free - reserve : 0;
    }
    }
}

uint64_t ooc_options_chunk_bytes(const ooc_options_t *o, uint64_t granularity, uint64_t budget) {
    uint64_t c = o->chunk.bytes;
    if (o->chunk.kind != OOC_SIZE_BYTES) {
        uint64_t most = budget / OOC_CHUNK_AUTO_COUNT;
        c = OOC_CHUNK_AUTO_MAX;
        while (c > most && c > 64 * 1024)
            c >>= 1;
    }
    return granularity > c ? granularity : c;
}

uint64_t ooc_options_window_bytes(const ooc_options_t *o) {
    return o->window.kind == OOC_SIZE_BYTES ? o->window.bytes : 0;
}

/* "/rank<R>" when the process is rank R of a data-parallel run (RANK a number, WORLD_SIZE
 * above 1, as torchrun sets them), else "". */
static void rank_suffix(char *buf, size_t len) {
    const char *rank = getenv("RANK"), *world = getenv("WORLD_SIZE");
    buf[0] = '\0';
    if (!rank || !*rank || strspn(rank, "0123456789") != strlen(rank) || strlen(rank) > 9 ||
        !world || atol(world) <= 1)
        return;
    snprintf(buf, len, "/rank%s", rank);
}

int ooc_options_profile_dir(const ooc_options_t *o, char *buf, size_t len) {
    int n;
    if (o->profile_dir[0]) {
        /* Ranks given one OOC_PROFILE_DIR write apart, in DIR/rank<R> (unless it names it). */
        char sfx[24];
        rank_suffix(sfx, sizeof sfx);
        size_t dl = strlen(o->profile_dir), sl = strlen(sfx);
        if (sl && dl >= sl && strcmp(o->profile_dir + dl - sl, sfx) == 0)
            sfx[0] = '\0';
        n = snprintf(buf, len, "%s%s", o->profile_dir, sfx);
    } else {
        const char *prog = program_invocation_short_name;
        n = snprintf(buf, len, "./ooc-profiles/%s-%ld", prog && *prog ? prog : "program",
                     (long)getpid());
    }
    return n < 0 || (size_t)n >= len ? OOC_ERANGE : 0;
}

static const char *word_of(const char *const *words, size_t n, int v) {
    return v >= 0 && (size_t)v < n ? words[v] : "?";
}

const char *ooc_mode_name(int mode) {
    return word_of(mode_words, OOC_ARRAY_SIZE(mode_words) - 1, mode);
}

const char *ooc_policy_name(int policy) {
    return word_of(policy_words, OOC_ARRAY_SIZE(policy_words) - 1, policy);
}

const char *ooc_safe_name(int safe) {
    return word_of(safe_words, OOC_ARRAY_SIZE(safe_words) - 1, safe);
}
