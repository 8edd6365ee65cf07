/* SPDX-License-Identifier: MIT */
/* trace_json.c: the Chrome trace export (the JSON object format that chrome://tracing and
 * Perfetto open) of a timeline: slices per track, the memory counter, and the profile's names.
 *
 * Layout (profiles/FORMAT.md, "trace.json in detail"): one process; for an in-core timeline one
 * thread (track) per recorded stream, for a simulated one the compute, host-to-device and
 * device-to-host engines; the counters "device memory in use" and "device memory budget" (one
 * series each: a counter with several series is drawn stacked by chrome://tracing, which would
 * add the budget to the memory, and some Perfetto versions reject it). Slices on one track never
 * overlap, because every engine runs one item at a time.
 * Times are written in microseconds with three decimals, exactly the timeline's nanoseconds.
 * Strings are escaped for JSON, and bytes that are not UTF-8 are written as U+FFFD, so the output
 * parses whatever a recorded name holds. Called by the shim (trace.json of a recorded profile)
 * and by ooc-plan (--trace-json); no global state. */
#include "ooc_planner.h"
#include "msg.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* The length of the well-formed UTF-8 sequence at s (1 to 4), or 0 when it is not one: a stray
 * continuation byte, a truncated or overlong sequence, a surrogate, or a value past U+10FFFF. */
static int utf8_len(const unsigned char *s) {
    unsigned c = s[0];
    int n;
    unsigned min, v;
    if (c < 0x80)
        return 1;
    if (c >= 0xc2 && c <= 0xdf) {
        n = 2;
        min = 0x80;
        v = c & 0x1f;
    } else if (c >= 0xe0 && c <= 0xef) {
        n = 3;
        min = 0x800;
        v = c & 0x0f;
    } else if (c >= 0xf0 && c <= 0xf4) {
        n = 4;
        min = 0x10000;
        v = c & 0x07;
    } else {
        return 0;
    }
    for (int k = 1; k < n; k++) {
        if ((s[k] & 0xc0) != 0x80) /* also stops at the terminating NUL */
            return 0;
        v = v << 6 | (s[k] & 0x3f);
    }
    if (v < min || v > 0x10ffff || (v >= 0xd800 && v <= 0xdfff))
        return 0;
    return n;
}

/* Writes s as a JSON string, quotes included. */
static void put_str(FILE *f, const char *str) {
    const unsigned char *s = (const unsigned char *)str;
    fputc('"', f);
    while (*s) {
        unsigned c = *s;
        if (c == '"' || c == '\\') {
            fputc('\\', f);
            fputc((int)c, f);
            s++;
        } else if (c < 0x20 || c == 0x7f) {
            switch (c) {
            case '\n':
                fputs("\\n", f);
                break;
            case '\t':
                fputs("\\t", f);
                break;
            case '\r':
                fputs("\\r", f);
                break;
            default:
                fprintf(f, "\\u%04x", c);
            }
            s++;
        } else {
            int n = utf8_len(s);
            if (n == 0) {
                fputs("\\ufffd", f);
                s++;
            } else {
                fwrite(s, 1, (size_t)n, f);
                s += n;
            }
        }
    }
    fputc('"', f);
}

/* Writes a time in nanoseconds as microseconds with three decimals (exact). */
static void put_us(FILE *f, uint64_t ns) {
    fprintf(f, "%llu.%03llu", (unsigned long long)(ns / 1000), (unsigned long long)(ns % 1000));
}

/* "784.0 MiB": a size for people. */
static const char *human(char *buf, size_t len, uint64_t bytes) {
    static const char *const units[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};
    if (bytes < 1024) {
        snprintf(buf, len, "%llu B", (unsigned long long)bytes);
        return buf;
    }
    double v = (double)bytes / 1024;
    int u = 0;
    while (v >= 1024 && u < 4) {
        v /= 1024;
        u++;
    }
    snprintf(buf, len, "%.1f %s", v, units[u]);
    return buf;
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* The track of op i in an in-core trace: 1 + the rank of its stream among the profile's. */
static int stream_tid(const int32_t *streams, size_t n, int32_t s) {
    const int32_t *hit = bsearch(&s, streams, n, sizeof *streams, cmp_i32);
    return hit ? (int)(hit - streams) + 1 : 1;
}

/* A metadata event: a track's (tid's) or the process's name or sort index. */
static void put_meta(FILE *f, const char *what, int tid, const char *key, const char *name,
                     int num) {
    fprintf(f, "{\"ph\":\"M\",\"pid\":1,\"tid\":%d,\"name\":\"%s\",\"args\":{\"%s\":", tid, what,
            key);
    if (name)
        put_str(f, name);
    else
        fprintf(f, "%d", num);
    fputs("}},\n", f);
}

/* One sample of a counter track whose one series is "bytes". */
static void put_counter(FILE *f, const char *name, uint64_t at_ns, uint64_t bytes) {
    fputs("{\"ph\":\"C\",\"pid\":1,\"ts\":", f);
    put_us(f, at_ns);
    fprintf(f, ",\"name\":\"%s\",\"args\":{\"bytes\":%llu}}", name, (unsigned long long)bytes);
}

/* "#12 relu.out": a buffer for people. */
static void put_buf_name(FILE *f, const char *verb, const ooc_profile_t *p, int32_t b) {
    char buf[64];
    size_t site_len = strlen(p->bufs[b].site);
    char *s = malloc(site_len + 80);
    if (!s) {
        snprintf(buf, sizeof buf, "%s #%d", verb, (int)b);
        put_str(f, buf);
        return;
    }
    snprintf(s, site_len + 80, "%s #%d %s", verb, (int)b, p->bufs[b].site);
    put_str(f, s);
    free(s);
}

/* The args of op i's slice: what the profile says about it, its buffers named and sized. */
static void put_op_args(FILE *f, const ooc_profile_t *p, int32_t i) {
    const ooc_op_t *o = &p->ops[i];
    char hb[32];
    fprintf(f, "\"op\":%d,\"kind\":\"%s\",\"stream\":%d,\"duration_ns\":%llu,\"shape\":", (int)i,
            ooc_kind_name((ooc_op_kind_t)o->kind), (int)o->stream,
            (unsigned long long)o->duration_ns);
    put_str(f, o->shape);
    fputs(",\"refs\":[", f);
    static const char *const acc[4] = {"?", "r", "w", "rw"};
    for (uint32_t k = 0; k < o->nref; k++) {
        const ooc_ref_t *r = &p->refs[o->ref_off + k];
        const char *site = p->bufs[r->buf].site;
        size_t len = strlen(site) + 96;
        char *s = malloc(len);
        if (k)
            fputc(',', f);
        if (!s) {
            fprintf(f, "\"%d:%s\"", (int)r->buf, acc[r->access & 3]);
            continue;
        }
        snprintf(s, len, "%d:%s %s (%s)", (int)r->buf, acc[r->access & 3], site,
                 human(hb, sizeof hb, p->bufs[r->buf].bytes));
        put_str(f, s);
        free(s);
    }
    fputc(']', f);
}

/* A complete ("X") event for a compute, swap-in or swap-out row on track tid. */
static void put_slice(FILE *f, const ooc_profile_t *p, const ooc_tl_row_t *r, int tid) {
    fprintf(f, "{\"ph\":\"X\",\"pid\":1,\"tid\":%d,\"ts\":", tid);
    put_us(f, r->start_ns);
    fputs(",\"dur\":", f);
    put_us(f, r->end_ns - r->start_ns);
    fputs(",\"name\":", f);
    char hb[32];
    switch (r->action) {
    case OOC_TL_OP:
        put_str(f, p->ops[r->op].name);
        fprintf(f, ",\"cat\":\"%s\",\"args\":{", ooc_kind_name((ooc_op_kind_t)p->ops[r->op].kind));
        put_op_args(f, p, r->op);
        break;
    case OOC_TL_RECOMPUTE: {
        const ooc_buffer_t *b = &p->bufs[r->buf];
        put_buf_name(f, "recompute", p, r->buf);
        fprintf(f, ",\"cat\":\"recompute\",\"args\":{\"buffer\":%d,\"site\":", (int)r->buf);
        put_str(f, b->site);
        fprintf(f, ",\"bytes\":%llu,\"size\":\"%s\",\"before_op\":%d,\"via\":[",
                (unsigned long long)b->bytes, human(hb, sizeof hb, b->bytes), (int)r->op);
        for (uint32_t k = 0; k < b->nprod; k++)
            fprintf(f, "%s%d", k ? "," : "", (int)p->prods[b->prod_off + k]);
        fputc(']', f);
        break;
    }
    default: {
        int in = r->action == OOC_TL_SWAPIN;
        put_buf_name(f, in ? "swap-in" : "swap-out", p, r->buf);
        fprintf(f, ",\"cat\":\"%s\",\"args\":{\"buffer\":%d,\"site\":", in ? "swapin" : "swapout",
                (int)r->buf);
        put_str(f, p->bufs[r->buf].site);
        fprintf(f, ",\"bytes\":%llu,\"size\":\"%s\",\"%s\":%d", (unsigned long long)r->bytes,
                human(hb, sizeof hb, r->bytes), in ? "before_op" : "after_op", (int)r->op);
        break;
    }
    }
    fputs("}}", f);
}

/* Checks that every row names ops and buffers of p and fits its engine. */
static int rows_fit(const ooc_profile_t *p, const ooc_timeline_t *t, char *err, size_t errlen) {
    if (t->nops != p->nops || t->nbufs != p->nbufs) {
        ooc_msg_say(err, errlen,
                    "the timeline is of %u ops and %u buffers, the profile has %u and %u", t->nops,
                    t->nbufs, p->nops, p->nbufs);
        return OOC_EINVAL;
    }
    for (size_t i = 0; i < t->nrows; i++) {
        const ooc_tl_row_t *r = &t->rows[i];
        int need_op = r->action == OOC_TL_OP, need_buf = r->action != OOC_TL_OP;
        int ok = r->engine < OOC_ENG_COUNT && r->action < OOC_TL_COUNT &&
                 r->end_ns >= r->start_ns && r->op < (int32_t)p->nops &&
                 r->buf < (int32_t)p->nbufs && (!need_op || r->op >= 0) &&
                 (!need_buf || r->buf >= 0) && (r->action != OOC_TL_RECOMPUTE || r->op >= 0);
        if (!ok) {
            ooc_msg_say(err, errlen, "timeline row %zu is inconsistent with the profile", i);
            return OOC_EINVAL;
        }
    }
    return 0;
}

/* Writes the whole trace of timeline t (checked against p first). Returns 0 or an OOC_E* code
 * with a message; a write error is seen through ferror at the end. */
static int write_json(const ooc_profile_t *p, const ooc_timeline_t *t, FILE *f, char *err,
                      size_t errlen) {
    int rc = rows_fit(p, t, err, errlen);
    if (rc)
        return rc;
    /* the recorded streams, sorted and unique: the in-core tracks */
    int32_t *streams = malloc((p->nops ? p->nops : 1) * sizeof *streams);
    if (!streams) {
        ooc_msg_say(err, errlen, "out of memory");
        return OOC_ENOMEM;
    }
    size_t ns = 0;
    for (uint32_t i = 0; i < p->nops; i++)
        streams[ns++] = p->ops[i].stream;
    qsort(streams, ns, sizeof *streams, cmp_i32);
    size_t w = 0;
    for (size_t i = 0; i < ns; i++)
        if (w == 0 || streams[w - 1] != streams[i])
            streams[w++] = streams[i];
    ns = w;

    char hb[32], title[160];
    fprintf(f,
            "{\"displayTimeUnit\":\"ns\",\"otherData\":{\"format\":\"ooc-trace %d\","
            "\"source\":\"%s\",\"program\":",
            OOC_FORMAT_VERSION, t->simulated ? "simulated" : "incore");
    put_str(f, p->program);
    fputs(",\"device\":", f);
    put_str(f, p->device);
    fputs(",\"policy\":", f);
    put_str(f, t->policy);
    fprintf(f,
            ",\"budget_bytes\":%llu,\"chunk_bytes\":%llu,\"time_ns\":%llu,\"peak_bytes\":%llu,"
            "\"nops\":%u,\"nbufs\":%u},\n\"traceEvents\":[\n",
            (unsigned long long)t->budget_bytes, (unsigned long long)t->chunk_bytes,
            (unsigned long long)t->time_ns, (unsigned long long)t->peak_bytes, t->nops, t->nbufs);
    if (t->simulated)
        snprintf(title, sizeof title, "simulated iteration: policy %s, budget %s", t->policy,
                 human(hb, sizeof hb, t->budget_bytes));
    else
        snprintf(title, sizeof title, "recorded iteration, in core (ops back to back)");
    put_meta(f, "process_name", 0, "name", title, 0);
    if (t->simulated) {
        static const char *const names[3] = {"compute", "host-to-device copies (swap-in)",
                                             "device-to-host copies (swap-out)"};
        for (int k = 0; k < 3; k++) {
            put_meta(f, "thread_name", k + 1, "name", names[k], 0);
            put_meta(f, "thread_sort_index", k + 1, "sort_index", NULL, k + 1);
        }
    } else {
        for (size_t k = 0; k < ns; k++) {
            char name[32];
            snprintf(name, sizeof name, "stream %d", (int)streams[k]);
            put_meta(f, "thread_name", (int)k + 1, "name", name, 0);
            put_meta(f, "thread_sort_index", (int)k + 1, "sort_index", NULL, (int)k + 1);
        }
    }
    /* both counters span the whole iteration; memory starts at zero */
    put_counter(f, "device memory budget", 0, t->budget_bytes);
    fputs(",\n", f);
    put_counter(f, "device memory budget", t->time_ns, t->budget_bytes);
    fputs(",\n", f);
    put_counter(f, "device memory in use", 0, 0);
    for (size_t i = 0; i < t->nrows; i++) {
        const ooc_tl_row_t *r = &t->rows[i];
        fputs(",\n", f);
        if (r->engine == OOC_ENG_MEMORY) {
            put_counter(f, "device memory in use", r->start_ns, r->in_use_bytes);
            continue;
        }
        int tid = t->simulated ? r->engine + 1 : stream_tid(streams, ns, p->ops[r->op].stream);
        put_slice(f, p, r, tid);
    }
    fputs("\n]}\n", f);
    free(streams);
    if (ferror(f)) {
        ooc_msg_say(err, errlen, "write error");
        return OOC_EIO;
    }
    return 0;
}

int ooc_trace_json_write(const ooc_profile_t *p, const ooc_timeline_t *t, FILE *f, char *err,
                         size_t errlen) {
    if (t)
        return write_json(p, t, f, err, errlen);
    if (p->chunk_bytes == 0 || (p->chunk_bytes & (p->chunk_bytes - 1))) {
        ooc_msg_say(err, errlen, "the profile's chunk_bytes (%llu) is not a power of two",
                    (unsigned long long)p->chunk_bytes);
        return OOC_EINVAL;
    }
    ooc_model_t *m = NULL;
    ooc_timeline_t tl;
    memset(&tl, 0, sizeof tl);
    int rc = ooc_model_build(p, p->chunk_bytes, &m);
    if (!rc)
        rc = ooc_timeline_incore(m, p->budget_bytes, &tl);
    if (rc)
        ooc_msg_say(err, errlen, "out of memory");
    else
        rc = write_json(p, &tl, f, err, errlen);
    ooc_timeline_free(&tl);
    ooc_model_free(m);
    return rc;
}

int ooc_trace_json_write_file(const ooc_profile_t *p, const ooc_timeline_t *t, const char *path,
                              char *err, size_t errlen) {
    FILE *f = fopen(path, "w");
    if (!f) {
        ooc_msg_say(err, errlen, "%s: cannot create: %s", path, strerror(errno));
        return OOC_EIO;
    }
    char why[256] = "";
    int rc = ooc_trace_json_write(p, t, f, why, sizeof why);
    if (fclose(f) != 0 && !rc)
        rc = OOC_EIO;
    if (rc) {
        ooc_msg_say(err, errlen, "%s: %s", path, rc == OOC_EIO && !why[0] ? "write error" : why);
    }
    return rc;
}
