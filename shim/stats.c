/* SPDX-License-Identifier: MIT */
/* stats.c: the statistics cells and the table that OOC_STATS=1 prints at exit.
 *
 * Updates live in stats.h as inline relaxed atomics; this file holds the cells, the labels from
 * OOC_STAT_LIST and the formatting. Formatting uses integer arithmetic and a stack buffer only,
 * so the table can be printed from an atexit handler or a signal-driven dump without malloc. */
#include "stats.h"

#include <errno.h>
#include <stdlib.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

ooc_stats_cells_t ooc_stats_cells;

/* HIDDEN: a counter the table does not list as it is, only through a row derived from it. */
enum { KIND_COUNTER, KIND_GAUGE, KIND_HIDDEN };
enum { UNIT_BYTES, UNIT_COUNT, UNIT_NS };

static const struct {
    const char *label;
    unsigned char kind;
    unsigned char unit;
} stat_desc[OOC_STAT_N] = {
#define STAT_DESC_(id, k, u, l) [OOC_STAT_##id] = {l, KIND_##k, UNIT_##u},
    OOC_STAT_LIST(STAT_DESC_)
#undef STAT_DESC_
};

const char *ooc_stats_label(ooc_stat_t s) {
    return (unsigned)s < OOC_STAT_N ? stat_desc[s].label : "?";
}

int ooc_stats_is_gauge(ooc_stat_t s) {
    return (unsigned)s < OOC_STAT_N && stat_desc[s].kind == KIND_GAUGE;
}

void ooc_stats_reset(void) {
    for (int i = 0; i < OOC_STAT_N; i++) {
        atomic_store_explicit(&ooc_stats_cells.value[i], 0, memory_order_relaxed);
        atomic_store_explicit(&ooc_stats_cells.peak[i], 0, memory_order_relaxed);
    }
}

/* Writes whole.frac (two decimals) of value / 2^shift, rounded to nearest, followed by unit. */
static char *fmt_fixed(uint64_t value, unsigned shift, const char *unit, char *buf, size_t len) {
    uint64_t whole = value >> shift;
    uint64_t rest = value & ((UINT64_C(1) << shift) - 1);
    /* rest < 2^30, so rest * 100 cannot overflow. */
    uint64_t cents = (rest * 100 + (UINT64_C(1) << (shift - 1))) >> shift;
    if (cents == 100) {
        whole++;
        cents = 0;
    }
    snprintf(buf, len, "%" PRIu64 ".%02" PRIu64 " %s", whole, cents, unit);
    return buf;
}

char *ooc_stats_fmt_bytes(uint64_t bytes, char *buf, size_t len) {
    if (bytes >= OOC_GiB)
        return fmt_fixed(bytes, 30, "GiB", buf, len);
    /* Just below a GiB rounds to "1024.00 MiB", which is still exact enough to read. */
    return fmt_fixed(bytes, 20, "MiB", buf, len);
}

char *ooc_stats_fmt_ns(uint64_t ns, char *buf, size_t len) {
    uint64_t whole = ns / 1000000;
    uint64_t cents = (ns % 1000000 + 5000) / 10000;
    if (cents == 100) {
        whole++;
        cents = 0;
    }
    snprintf(buf, len, "%" PRIu64 ".%02" PRIu64 " ms", whole, cents);
    return buf;
}

static char *fmt_value(ooc_stat_t s, uint64_t v, char *buf, size_t len) {
    switch (stat_desc[s].unit) {
    case UNIT_BYTES:
        return ooc_stats_fmt_bytes(v, buf, len);
    case UNIT_NS:
        return ooc_stats_fmt_ns(v, buf, len);
    default:
        snprintf(buf, len, "%" PRIu64, v);
        return buf;
    }
}

/* Appends to buf like snprintf, tracking the length the full text needs in *need. */
static void OOC_PRINTF(4, 5) append(char *buf, size_t len, size_t *need, const char *fmt, ...) {
    va_list ap;
    size_t at = *need < len ? *need : len;
    va_start(ap, fmt);
    int n = vsnprintf(buf + at, len - at, fmt, ap);
    va_end(ap);
    if (n > 0)
        *need += (size_t)n;
}

#define LABEL_W 44
#define VALUE_W 14

size_t ooc_stats_format(char *buf, size_t len) {
    char v[32], p[32];
    size_t need = 0;
    if (len > 0)
        buf[0] = '\0';
    append(buf, len, &need, "ooc[%ld] stats\n", (long)getpid());
    append(buf, len, &need, "  %-*s %*s %*s\n", LABEL_W, "", VALUE_W, "total/now", VALUE_W, "peak");
    for (int i = 0; i < OOC_STAT_N; i++) {
        ooc_stat_t s = (ooc_stat_t)i;
        if (stat_desc[s].kind == KIND_HIDDEN)
            continue;
        fmt_value(s, ooc_stats_get(s), v, sizeof v);
        if (stat_desc[s].kind == KIND_GAUGE)
            append(buf, len, &need, "  %-*s %*s %*s\n", LABEL_W, stat_desc[s].label, VALUE_W, v,
                   VALUE_W, fmt_value(s, ooc_stats_peak(s), p, sizeof p));
        else
            append(buf, len, &need, "  %-*s %*s\n", LABEL_W, stat_desc[s].label, VALUE_W, v);
    }
    /* Fragmentation: how much more was mapped than requested, at the peaks. */
    uint64_t req = ooc_stats_peak(OOC_STAT_requested_bytes);
    uint64_t map = ooc_stats_peak(OOC_STAT_mapped_bytes);
    if (req > 0 && map >= req) {
        uint64_t over = map - req;
        /* Basis points, in 128 bits so that no size overflows. */
        uint64_t bp = (uint64_t)(((unsigned __int128)over * 10000 + req / 2) / req);
        snprintf(v, sizeof v, "%" PRIu64 ".%02" PRIu64 " %%", bp / 100, bp % 100);
    } else {
        snprintf(v, sizeof v, "-");
    }
    append(buf, len, &need, "  %-*s %*s\n", LABEL_W, "mapped beyond requested, at peak", VALUE_W,
           v);
    /* What the program's thread waits for the shim in an iteration of the plan. */
    uint64_t iters = ooc_stats_get(OOC_STAT_replay_iters);
    if (iters > 0)
        ooc_stats_fmt_ns(ooc_stats_get(OOC_STAT_replay_blocked_ns) / iters, v, sizeof v);
    else
        snprintf(v, sizeof v, "-");
    append(buf, len, &need, "  %-*s %*s\n", LABEL_W, "blocked per replayed iteration", VALUE_W, v);
    /* ... by what it waited for (the rest: other waits for the device). */
#define WHY_(c) OOC_STAT_replay_##c##_ns,
    static const ooc_stat_t why[OOC_STAT_WHY_N] = {OOC_STAT_WHY(WHY_)};
#undef WHY_
    for (size_t i = 0; i < OOC_STAT_WHY_N; i++) {
        if (iters > 0)
            ooc_stats_fmt_ns(ooc_stats_get(why[i]) / iters, v, sizeof v);
        else
            snprintf(v, sizeof v, "-");
        append(buf, len, &need, "  %-*s %*s\n", LABEL_W, stat_desc[why[i]].label, VALUE_W, v);
    }
    /* ... and the part of it that ended with the program's streams empty (the device may have
     * been out of the program's work: on a GPU, the part that can cost time). */
    if (iters > 0)
        ooc_stats_fmt_ns(ooc_stats_get(OOC_STAT_replay_idle_ns) / iters, v, sizeof v);
    else
        snprintf(v, sizeof v, "-");
    append(buf, len, &need, "  %-*s %*s\n", LABEL_W, stat_desc[OOC_STAT_replay_idle_ns].label,
           VALUE_W, v);
    /* The mapping calls the program's thread makes itself in such an iteration (the plan has the
     * worker make them). */
    if (iters > 0)
        ooc_stats_fmt_ns(ooc_stats_get(OOC_STAT_replay_vmm_prog_ns) / iters, v, sizeof v);
    else
        snprintf(v, sizeof v, "-");
    append(buf, len, &need, "  %-*s %*s\n", LABEL_W, "program's mapping per replayed iteration",
           VALUE_W, v);
    return need;
}

int ooc_stats_print(int fd) {
    /* Sized from the table's own length (it grows with every statistic: a fixed buffer cut it
     * short once it passed 8 KiB); a stack buffer when no memory can be had. */
    char small[8192];
    size_t need = ooc_stats_format(small, sizeof small);
    char *buf = need < sizeof small ? small : malloc(need + 1);
    size_t n = need;
    if (!buf) {
        buf = small;
        n = sizeof small - 1;
    } else if (buf != small) {
        n = ooc_stats_format(buf, need + 1);
        if (n > need)
            n = need;
    }
    const char *at = buf;
    while (n > 0) {
        ssize_t w = write(fd, at, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            if (buf != small)
                free(buf);
            return OOC_EIO;
        }
        at += w;
        n -= (size_t)w;
    }
    if (buf != small)
        free(buf);
    return 0;
}
