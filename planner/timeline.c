/* SPDX-License-Identifier: MIT */
/* timeline.c: one iteration as rows (what each engine runs when, and every change of mapped
 * device memory), built from a profile alone or from a simulation's trace, and its TSV form.
 *
 * The in-core timeline places the ops back to back in issue order, each starting when the
 * previous one ends (a profile records durations, not start times; the simulator runs them in
 * the same order), and maps every buffer from its allocation to its free.
 * The simulated timeline pairs the trace's start and end events; a copy is attributed to the
 * plan action that caused it (the trace names the op the compute engine was at, which for a
 * queued copy is later). Rows are appended in the order of the events, so their start times
 * never decrease. Callers: ooc-plan (--timeline, --trace-json) and trace_json.c. Pure functions
 * of their inputs; no global state. */
#include "ooc_planner.h"
#include "grow.h"
#include "msg.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char *const engine_names[OOC_ENG_COUNT] = {"compute", "h2d", "d2h", "memory"};
static const char *const action_names[OOC_TL_COUNT] = {"op",      "recompute", "swapin",
                                                       "swapout", "map",       "unmap"};

const char *ooc_engine_name(ooc_engine_t e) {
    return (unsigned)e < OOC_ENG_COUNT ? engine_names[e] : "?";
}

const char *ooc_tl_action_name(ooc_tl_action_t a) {
    return (unsigned)a < OOC_TL_COUNT ? action_names[a] : "?";
}

void ooc_timeline_free(ooc_timeline_t *t) {
    if (!t)
        return;
    free(t->rows);
    t->rows = NULL;
    t->nrows = t->cap = 0;
}

/* Appends a row and returns its index, or -1 when out of memory. */
static long add_row(ooc_timeline_t *t, ooc_engine_t eng, ooc_tl_action_t act, uint64_t start_ns,
                    int32_t op, int32_t buf, uint64_t bytes) {
    if (ooc_grow(&t->rows, &t->cap, t->nrows + 1, sizeof *t->rows, 1024))
        return -1;
    t->rows[t->nrows] = (ooc_tl_row_t){.start_ns = start_ns,
                                       .end_ns = start_ns,
                                       .op = op,
                                       .buf = buf,
                                       .engine = (uint8_t)eng,
                                       .action = (uint8_t)act,
                                       .bytes = bytes};
    return (long)t->nrows++;
}

/* Appends a memory row: buf's footprint `fp` mapped (map != 0) or released, with *in_use the
 * running total. Returns 0 or -1 when out of memory. */
static int mem_row(ooc_timeline_t *t, uint64_t at_ns, int32_t op, int32_t buf, int map, uint64_t fp,
                   uint64_t *in_use) {
    long r = add_row(t, OOC_ENG_MEMORY, map ? OOC_TL_MAP : OOC_TL_UNMAP, at_ns, op, buf, fp);
    if (r < 0)
        return -1;
    *in_use = map ? *in_use + fp : *in_use - fp;
    t->rows[r].in_use_bytes = *in_use;
    if (*in_use > t->peak_bytes)
        t->peak_bytes = *in_use;
    return 0;
}

/* An empty timeline of the model's profile. */
static void init(ooc_timeline_t *t, const ooc_model_t *m, int simulated, const char *policy,
                 uint64_t budget_bytes) {
    memset(t, 0, sizeof *t);
    t->simulated = simulated;
    snprintf(t->policy, sizeof t->policy, "%s", policy);
    t->budget_bytes = budget_bytes;
    t->chunk_bytes = m->chunk_bytes;
    t->nops = m->n;
    t->nbufs = m->nb;
}

int ooc_timeline_incore(const ooc_model_t *m, uint64_t budget_bytes, ooc_timeline_t *out) {
    const ooc_profile_t *p = m->prof;
    init(out, m, 0, "incore", budget_bytes);
    /* buffers allocated before each op, as a CSR over ops (counting sort keeps id order) */
    uint32_t *off = calloc((size_t)m->n + 1, sizeof *off);
    int32_t *allocs = malloc((m->nb ? m->nb : 1) * sizeof *allocs);
    int rc = OOC_ENOMEM;
    if (!off || !allocs)
        goto out;
    for (uint32_t b = 0; b < m->nb; b++)
        if (p->bufs[b].alloc_idx >= 0 && p->bufs[b].alloc_idx < (int64_t)m->n)
            off[p->bufs[b].alloc_idx + 1]++;
    for (uint32_t i = 0; i < m->n; i++)
        off[i + 1] += off[i];
    for (uint32_t b = 0; b < m->nb; b++) {
        int64_t a = p->bufs[b].alloc_idx;
        if (a >= 0 && a < (int64_t)m->n)
            allocs[off[a]++] = (int32_t)b;
    }
    /* off[i] is now the end of op i's allocations, that is the start of op i + 1's */
    for (uint32_t i = m->n; i > 0; i--)
        off[i] = off[i - 1];
    off[0] = 0;
    uint64_t now = 0, in_use = 0;
    for (uint32_t b = 0; b < m->nb; b++)
        if (p->bufs[b].alloc_idx < 0 && mem_row(out, 0, -1, (int32_t)b, 1, m->fp[b], &in_use))
            goto out;
    for (uint32_t i = 0; i < m->n; i++) {
        for (uint32_t k = off[i]; k < off[i + 1]; k++)
            if (mem_row(out, now, (int32_t)i, allocs[k], 1, m->fp[allocs[k]], &in_use))
                goto out;
        long r = add_row(out, OOC_ENG_COMPUTE, OOC_TL_OP, now, (int32_t)i, -1, 0);
        if (r < 0)
            goto out;
        now += p->ops[i].duration_ns;
        out->rows[r].end_ns = now;
        for (uint32_t k = m->free_off[i]; k < m->free_off[i + 1]; k++)
            if (mem_row(out, now, (int32_t)i, m->frees[k], 0, m->fp[m->frees[k]], &in_use))
                goto out;
    }
    out->time_ns = now;
    rc = 0;
out:
    free(off);
    free(allocs);
    return rc;
}

/* The ops of one buffer's actions of one kind, in plan order, as a CSR over buffers. */
typedef struct {
    uint32_t *off; /* nb + 1 entries */
    int32_t *op;
    uint32_t *cur; /* per buffer: the first entry not yet used */
} by_buf_t;

static void by_buf_free(by_buf_t *x) {
    free(x->off);
    free(x->op);
    free(x->cur);
}

/* Fills x with the ops of the plan's actions of one kind, per buffer, in plan order. Returns 0 or
 * OOC_ENOMEM (x is released by by_buf_free either way). */
static int by_buf_build(by_buf_t *x, const ooc_plan_t *pl, uint32_t nb, ooc_act_kind_t kind) {
    x->off = calloc((size_t)nb + 1, sizeof *x->off);
    x->op = malloc((pl->nacts ? pl->nacts : 1) * sizeof *x->op);
    x->cur = calloc(nb ? nb : 1, sizeof *x->cur);
    if (!x->off || !x->op || !x->cur)
        return OOC_ENOMEM;
    for (uint32_t i = 0; i < pl->nacts; i++)
        if (pl->acts[i].kind == kind)
            x->off[pl->acts[i].buf + 1]++;
    for (uint32_t b = 0; b < nb; b++)
        x->off[b + 1] += x->off[b];
    for (uint32_t i = 0; i < pl->nacts; i++) {
        const ooc_action_t *a = &pl->acts[i];
        if (a->kind == kind)
            x->op[x->off[a->buf] + x->cur[a->buf]++] = a->op; /* acts are sorted by op */
    }
    memset(x->cur, 0, (nb ? nb : 1) * sizeof *x->cur);
    return 0;
}

/* A simulated time as whole nanoseconds (rounded as the simulator rounds its result). */
static uint64_t ns(double t) {
    return t > 0 ? (uint64_t)llround(t) : 0;
}

int ooc_timeline_simulated(const ooc_model_t *m, const ooc_plan_t *pl, const ooc_trace_t *tr,
                           ooc_timeline_t *out, char *err, size_t errlen) {
    const ooc_profile_t *p = m->prof;
    init(out, m, 1, pl->policy, pl->budget_bytes);
    if (pl->nops != m->n || pl->nbufs != m->nb) {
        ooc_msg_say(err, errlen, "the plan is for %u ops and %u buffers, the profile has %u and %u",
                    pl->nops, pl->nbufs, m->n, m->nb);
        return OOC_EINVAL;
    }
    for (uint32_t i = 0; i < pl->nacts; i++)
        if (pl->acts[i].buf < 0 || (uint32_t)pl->acts[i].buf >= m->nb) {
            ooc_msg_say(err, errlen, "plan action %u names buffer %d, not in the profile", i,
                        (int)pl->acts[i].buf);
            return OOC_EINVAL;
        }
    by_buf_t ins = {0}, outs = {0};
    int rc = OOC_ENOMEM;
    if (by_buf_build(&ins, pl, m->nb, OOC_ACT_SWAPIN) ||
        by_buf_build(&outs, pl, m->nb, OOC_ACT_SWAPOUT))
        goto out;
    long open[3] = {-1, -1, -1}; /* the running row of each engine */
    int32_t last_ended = -1;     /* the last program op (not a recompute) that ended */
    uint64_t in_use = 0;
    double last_t = 0;
    rc = OOC_EINVAL;
    for (size_t i = 0; i < tr->n; i++) {
        const ooc_trace_ev_t *e = &tr->ev[i];
        uint64_t t = ns(e->t_ns);
        int32_t b = e->buf;
        if (e->t_ns < last_t) {
            ooc_msg_say(err, errlen, "trace event %zu goes back in time", i);
            goto out;
        }
        last_t = e->t_ns;
        if (e->kind != OOC_TR_OP_START && e->kind != OOC_TR_OP_END &&
            (b < 0 || (uint32_t)b >= m->nb)) {
            ooc_msg_say(err, errlen, "trace event %zu names buffer %d, not in the profile", i,
                        (int)b);
            goto out;
        }
        switch (e->kind) {
        case OOC_TR_OP_START: {
            if (open[OOC_ENG_COMPUTE] >= 0 || e->op < 0 || (uint32_t)e->op >= m->n ||
                b >= (int32_t)m->nb) {
                ooc_msg_say(err, errlen, "trace event %zu: no op, or a second compute item at once",
                            i);
                goto out;
            }
            uint64_t bytes = b >= 0 ? p->bufs[b].bytes : 0;
            open[OOC_ENG_COMPUTE] = add_row(
                out, OOC_ENG_COMPUTE, b >= 0 ? OOC_TL_RECOMPUTE : OOC_TL_OP, t, e->op, b, bytes);
            if (open[OOC_ENG_COMPUTE] < 0) {
                rc = OOC_ENOMEM;
                goto out;
            }
            break;
        }
        case OOC_TR_OP_END:
            if (open[OOC_ENG_COMPUTE] < 0) {
                ooc_msg_say(err, errlen, "trace event %zu: a compute item ends that never started",
                            i);
                goto out;
            }
            out->rows[open[OOC_ENG_COMPUTE]].end_ns = t;
            if (out->rows[open[OOC_ENG_COMPUTE]].action == OOC_TL_OP)
                last_ended = out->rows[open[OOC_ENG_COMPUTE]].op;
            open[OOC_ENG_COMPUTE] = -1;
            break;
        case OOC_TR_H2D_START: {
            uint32_t k = ins.off[b] + ins.cur[b];
            if (open[OOC_ENG_H2D] >= 0 || k >= ins.off[b + 1]) {
                ooc_msg_say(err, errlen,
                            "trace event %zu: buffer %d copied in, no swap-in of the plan", i,
                            (int)b);
                goto out;
            }
            ins.cur[b]++;
            open[OOC_ENG_H2D] =
                add_row(out, OOC_ENG_H2D, OOC_TL_SWAPIN, t, ins.op[k], b, p->bufs[b].bytes);
            if (open[OOC_ENG_H2D] < 0) {
                rc = OOC_ENOMEM;
                goto out;
            }
            break;
        }
        case OOC_TR_D2H_START: {
            /* the latest swap-out of b after an op that has ended: a buffer is swapped out at
             * most once before it is swapped back in, and the copy is queued when its op ends */
            uint32_t lo = outs.off[b], hi = outs.off[b + 1], k = lo + outs.cur[b];
            if (open[OOC_ENG_D2H] >= 0 || k >= hi || outs.op[k] > last_ended) {
                ooc_msg_say(err, errlen,
                            "trace event %zu: buffer %d copied out, no swap-out of the plan", i,
                            (int)b);
                goto out;
            }
            while (k + 1 < hi && outs.op[k + 1] <= last_ended)
                k++; /* the earlier swap-outs released the chunks without copying */
            outs.cur[b] = k - lo + 1;
            open[OOC_ENG_D2H] =
                add_row(out, OOC_ENG_D2H, OOC_TL_SWAPOUT, t, outs.op[k], b, p->bufs[b].bytes);
            if (open[OOC_ENG_D2H] < 0) {
                rc = OOC_ENOMEM;
                goto out;
            }
            break;
        }
        case OOC_TR_H2D_END:
        case OOC_TR_D2H_END: {
            int eng = e->kind == OOC_TR_H2D_END ? OOC_ENG_H2D : OOC_ENG_D2H;
            if (open[eng] < 0 || out->rows[open[eng]].buf != b) {
                ooc_msg_say(err, errlen,
                            "trace event %zu: a copy of buffer %d ends that never started", i,
                            (int)b);
                goto out;
            }
            out->rows[open[eng]].end_ns = t;
            open[eng] = -1;
            break;
        }
        case OOC_TR_MAP:
        case OOC_TR_UNMAP:
            if (e->kind == OOC_TR_UNMAP && e->bytes > in_use) {
                ooc_msg_say(err, errlen, "trace event %zu releases more than is mapped", i);
                goto out;
            }
            /* after the last op the compute engine is at none (the simulator says n) */
            if (mem_row(out, t, e->op >= 0 && (uint32_t)e->op < m->n ? e->op : -1, b,
                        e->kind == OOC_TR_MAP, e->bytes, &in_use)) {
                rc = OOC_ENOMEM;
                goto out;
            }
            break;
        default:
            ooc_msg_say(err, errlen, "trace event %zu has an unknown kind %d", i, (int)e->kind);
            goto out;
        }
        if (t > out->time_ns)
            out->time_ns = t;
    }
    for (int eng = 0; eng < 3; eng++)
        if (open[eng] >= 0) {
            ooc_msg_say(err, errlen,
                        "the trace ends while the %s engine is busy (an infeasible plan?)",
                        engine_names[eng]);
            goto out;
        }
    rc = 0;
out:
    if (rc == OOC_ENOMEM)
        ooc_msg_say(err, errlen, "out of memory");
    by_buf_free(&ins);
    by_buf_free(&outs);
    return rc;
}

/* ---- the TSV form ---------------------------------------------------------------------------- */

/* Writes s with tabs, newlines and carriage returns replaced by spaces ('-' when empty). */
static void put_clean(FILE *f, const char *s) {
    if (!*s) {
        fputc('-', f);
        return;
    }
    for (; *s; s++)
        fputc((*s == '\t' || *s == '\n' || *s == '\r') ? ' ' : *s, f);
}

static void put_id(FILE *f, int32_t x) {
    if (x < 0)
        fputc('-', f);
    else
        fprintf(f, "%d", (int)x);
}

int ooc_timeline_write(const ooc_timeline_t *t, FILE *f) {
    fprintf(f, "#ooc-timeline\t%d\tsource=%s\tpolicy=", OOC_FORMAT_VERSION,
            t->simulated ? "simulated" : "incore");
    put_clean(f, t->policy);
    fprintf(f,
            "\tbudget_bytes=%llu\tchunk_bytes=%llu\ttime_ns=%llu\tpeak_bytes=%llu\tnops=%u\t"
            "nbufs=%u\n",
            (unsigned long long)t->budget_bytes, (unsigned long long)t->chunk_bytes,
            (unsigned long long)t->time_ns, (unsigned long long)t->peak_bytes, t->nops, t->nbufs);
    fprintf(f, "engine\tstart_ns\tend_ns\top\tbuffer\taction\tbytes\tin_use_bytes\n");
    for (size_t i = 0; i < t->nrows; i++) {
        const ooc_tl_row_t *r = &t->rows[i];
        fprintf(f, "%s\t%llu\t%llu\t", ooc_engine_name((ooc_engine_t)r->engine),
                (unsigned long long)r->start_ns, (unsigned long long)r->end_ns);
        put_id(f, r->op);
        fputc('\t', f);
        put_id(f, r->buf);
        fprintf(f, "\t%s\t", ooc_tl_action_name((ooc_tl_action_t)r->action));
        if (r->action == OOC_TL_OP)
            fputc('-', f);
        else
            fprintf(f, "%llu", (unsigned long long)r->bytes);
        if (r->engine == OOC_ENG_MEMORY)
            fprintf(f, "\t%llu\n", (unsigned long long)r->in_use_bytes);
        else
            fputs("\t-\n", f);
    }
    return ferror(f) ? OOC_EIO : 0;
}

int ooc_timeline_write_file(const ooc_timeline_t *t, const char *path, char *err, size_t errlen) {
    FILE *f = fopen(path, "w");
    if (!f) {
        ooc_msg_say(err, errlen, "%s: cannot create: %s", path, strerror(errno));
        return OOC_EIO;
    }
    int rc = ooc_timeline_write(t, f);
    if (fclose(f) != 0 || rc) {
        ooc_msg_say(err, errlen, "%s: write error", path);
        return OOC_EIO;
    }
    return 0;
}
