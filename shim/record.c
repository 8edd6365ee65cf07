/* SPDX-License-Identifier: MIT */
/* record.c: the recorder: logs every op, allocation and free from the first one, finds the
 * training iteration in that log (iterdet.c), and writes the profile of the last recorded
 * iteration (profiles/FORMAT.md, with its Chrome trace) once OOC_PROFILE_ITERS matching
 * iterations after the warm-up have been seen.
 *
 * An op is logged with its stream, kind, name, launch shape, the buffers it references (from
 * mem.c, with how it uses them) and its duration, measured by a pair of events recorded around
 * it on its own stream (so the time the host spent making its buffers resident is not in it).
 * Event pairs come from a ring: when the ring wraps, the oldest pair's time is read (waiting for
 * it if it has not run yet) and the pair reused. A profile op's duration is the lower median over
 * the recorded iterations. Allocation call sites are taken with libunwind (8 frames) and named with
 * dladdr when the profile is written. A shim built without libunwind (OOC_NO_UNWIND, which the
 * Makefile sets when libunwind.h is missing, as on a GPU machine without Debian's packages)
 * records no call sites: the profile's site column is "-", and recording says so once.
 *
 * Locking: rec_lock guards everything here. Ops are logged inside ooc_mem_begin/ooc_mem_end,
 * so they arrive in issue order; ooc_record_finish runs outside the residency lock because it
 * measures the copy bandwidth through mem.c. */
#ifndef OOC_NO_UNWIND
#define UNW_LOCAL_ONLY
#endif
#include "grow.h"
#include "shim.h"

#include <dlfcn.h>
#include <errno.h>
#ifndef OOC_NO_UNWIND
#include <libunwind.h>
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "iterdet.h"
#include "ooc_planner.h"

#define uthash_nonfatal_oom(obj) (rec_oom = 1)
static int rec_oom;
#include <uthash.h>

#define SITE_DEPTH 8
#define EV_RING    4096
#define MAX_OPS    ((size_t)4 << 20) /* give up beyond this many ops without a profile */

typedef struct rbuf {
    uint64_t id;
    uint64_t bytes;
    int64_t alloc_pos; /* ops logged before it was allocated */
    int64_t free_pos;  /* ops logged before it was freed; -1 while live */
    int64_t first_use; /* the first op logged that references it; -1 while none */
    void *ips[SITE_DEPTH];
    int nips;
    int64_t pid; /* its id in the profile being built; -1 outside build() */
    UT_hash_handle hh;
} rbuf_t;

typedef struct rop {
    uint32_t stream;
    uint8_t kind;
    const char *name; /* interned: lives as long as the recorder */
    unsigned grid[3], block[3];
    uint64_t bytes;
    uint64_t ref_off;
    uint32_t nref;
    int64_t dur_ns; /* -1 until read */
    uint64_t key;   /* what recompute.c verified it under (kernels); 0 when nothing */
    uint64_t live;  /* bytes of the recorded live buffers when it was issued */
} rop_t;

typedef struct rref {
    uint64_t id;
    uint8_t use;
    uint16_t word; /* ooc_opbuf_t.word, 0 beyond 65535 */
} rref_t;

static pthread_mutex_t rec_lock = PTHREAD_MUTEX_INITIALIZER;

static struct {
    rop_t *ops;
    size_t nops, cap_ops;
    size_t unprofiled; /* ops recorded since the last profile, over restarts (module unloads) */
    size_t dumped;     /* ops in the unrepeated-ops.tsv written (dump_unrepeated), or 0 */
    char dump_path[OOC_PATH_MAX + 32];
    rref_t *refs;
    size_t nrefs, cap_refs;
    rbuf_t *bufs;
    CUstream streams[64];
    unsigned nstreams;
    ooc_iterdet_t *det;
    ooc_iterdet_event_t ev;
    int want;
    CUevent ev0[EV_RING], ev1[EV_RING];
    int64_t ev_op[EV_RING]; /* the op a pair timed, -1 when free */
    unsigned ev_next;
    _Atomic int pending; /* enough iterations: finish before the next op (frees and allocations
                            before it still belong to the iteration) */
    int give_up;         /* the log grew too long, or memory ran out */
    uint64_t live;       /* bytes of the live buffers the recorder knows */
    int64_t grew_first, grew_period; /* the last run refused for growing (logged once) */
    CUcontext ctx;
} R;

void ooc_record_start(void) {
    pthread_mutex_lock(&rec_lock);
    if (atomic_load(&ooc_rec_state) == OOC_REC_OFF) {
        ooc_iterdet_t *d = NULL;
        if (ooc_iterdet_new(NULL, &d) != 0) {
            OOC_LOG_E("recording is off: the iteration detector could not be created");
            pthread_mutex_unlock(&rec_lock);
            return;
        }
        R.det = d;
        R.want = ooc_opts()->profile_iters;
        for (int i = 0; i < EV_RING; i++)
            R.ev_op[i] = -1;
        ooc_real.cuCtxGetCurrent(&R.ctx);
#ifdef OOC_NO_UNWIND
        OOC_LOG_W("this shim was built without libunwind: allocation call sites are not "
                  "recorded (the profile's site column is \"-\")");
#endif
        atomic_store(&ooc_rec_state, OOC_REC_ON);
    }
    pthread_mutex_unlock(&rec_lock);
}

/* ---- buffers --------------------------------------------------------------------------------- */

void ooc_record_alloc(uint64_t id, uint64_t bytes) {
    rbuf_t *b = calloc(1, sizeof *b);
    if (!b)
        return;
    b->id = id;
    b->bytes = bytes;
    b->free_pos = -1;
    b->first_use = -1;
    b->pid = -1;
#ifdef OOC_NO_UNWIND
    b->nips = 0;
#else
    b->nips = unw_backtrace(b->ips, SITE_DEPTH);
#endif
    pthread_mutex_lock(&rec_lock);
    if (!ooc_record_on()) {
        pthread_mutex_unlock(&rec_lock);
        free(b);
        return;
    }
    b->alloc_pos = (int64_t)R.nops;
    rec_oom = 0;
    HASH_ADD(hh, R.bufs, id, sizeof b->id, b);
    if (rec_oom) {
        free(b);
        R.give_up = 1;
    } else {
        R.live += bytes;
    }
    pthread_mutex_unlock(&rec_lock);
}

void ooc_record_free(uint64_t id) {
    pthread_mutex_lock(&rec_lock);
    rbuf_t *b;
    HASH_FIND(hh, R.bufs, &id, sizeof id, b);
    if (b && b->free_pos < 0) {
        b->free_pos = (int64_t)R.nops;
        R.live -= b->bytes;
    }
    pthread_mutex_unlock(&rec_lock);
}

/* ---- ops ------------------------------------------------------------------------------------- */

static int run_grows(const ooc_iterdet_event_t *ev);

static uint32_t stream_id(CUstream s) {
    if (s == NULL || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD)
        return 0;
    for (unsigned i = 0; i < R.nstreams; i++)
        if (R.streams[i] == s)
            return i + 1;
    if (R.nstreams < 64)
        R.streams[R.nstreams++] = s;
    return R.nstreams; /* beyond 64 streams, the last id is shared */
}

/* Reads the time of the pair at slot i into its op (waiting for it). Caller holds rec_lock. */
static void harvest(unsigned i) {
    if (R.ev_op[i] < 0)
        return;
    float ms = 0;
    if (ooc_real.cuEventSynchronize(R.ev1[i]) == CUDA_SUCCESS &&
        ooc_real.cuEventElapsedTime(&ms, R.ev0[i], R.ev1[i]) == CUDA_SUCCESS)
        R.ops[R.ev_op[i]].dur_ns = (int64_t)((double)ms * 1e6);
    R.ev_op[i] = -1;
}

int ooc_record_op_begin(CUstream s) {
    pthread_mutex_lock(&rec_lock);
    unsigned i = R.ev_next;
    harvest(i);
    CUresult r = CUDA_SUCCESS;
    if (!R.ev0[i] && (r = ooc_real.cuEventCreate(&R.ev0[i], CU_EVENT_DEFAULT)) == CUDA_SUCCESS)
        r = ooc_real.cuEventCreate(&R.ev1[i], CU_EVENT_DEFAULT);
    if (r == CUDA_SUCCESS)
        r = ooc_real.cuEventRecord(R.ev0[i], s);
    pthread_mutex_unlock(&rec_lock);
    return r == CUDA_SUCCESS ? (int)i : -1;
}

/* The detector's signature of an op: what it runs, its shape, and its buffers' sizes. */
static uint64_t signature(const rop_t *o, const ooc_opbuf_t *b, size_t nb) {
    uint64_t h = 1469598103934665603ull;
#define MIX(v) (h = (h ^ (uint64_t)(v)) * 1099511628211ull)
    MIX(o->kind);
    MIX((uintptr_t)o->name);
    for (int i = 0; i < 3; i++) {
        MIX(o->grid[i]);
        MIX(o->block[i]);
    }
    MIX(o->bytes);
    for (size_t i = 0; i < nb; i++)
        MIX(b[i].bytes);
#undef MIX
    return h;
}

void ooc_record_op_end(int token, const ooc_access_t *a, CUstream s, int issued) {
    pthread_mutex_lock(&rec_lock);
    if (!issued || !ooc_record_on() || R.give_up) {
        pthread_mutex_unlock(&rec_lock);
        return;
    }
    const ooc_opbuf_t *b;
    size_t nb = ooc_mem_op_buffers(&b);
    if (R.nops >= MAX_OPS || grow_from(&R.ops, &R.cap_ops, R.nops + 1, sizeof *R.ops, 1024) != 0 ||
        grow_from(&R.refs, &R.cap_refs, R.nrefs + nb, sizeof *R.refs, 1024) != 0) {
        R.give_up = 1;
        pthread_mutex_unlock(&rec_lock);
        OOC_LOG_W("recording stopped: no iteration was found in the first %zu operations; the "
                  "shim stays in demand mode",
                  R.nops);
        return;
    }
    rop_t *o = &R.ops[R.nops];
    memset(o, 0, sizeof *o);
    o->stream = stream_id(s);
    o->kind = (uint8_t)a->kind;
    o->name = a->kind == OOC_OP_KERNEL ? ooc_fnname_of(a->fn) : a->name;
    memcpy(o->grid, a->grid, sizeof o->grid);
    memcpy(o->block, a->block, sizeof o->block);
    o->bytes = a->bytes;
    o->ref_off = R.nrefs;
    o->nref = (uint32_t)nb;
    o->dur_ns = -1;
    o->key = a->kind == OOC_OP_KERNEL ? ooc_verify_key() : 0;
    o->live = R.live;
    ooc_iterdet_ref_t dref[64];
    unsigned nd = 0;
    uint8_t first[OOC_MAX_REFS];
    for (size_t i = 0; i < nb; i++) {
        R.refs[R.nrefs + i] = (rref_t){.id = b[i].id,
                                       .use = (uint8_t)b[i].use,
                                       .word = b[i].word <= UINT16_MAX ? b[i].word : 0};
        rbuf_t *rb;
        HASH_FIND(hh, R.bufs, &b[i].id, sizeof b[i].id, rb);
        if (i < OOC_MAX_REFS)
            first[i] = rb && rb->first_use < 0;
        if (rb && rb->first_use < 0)
            rb->first_use = (int64_t)R.nops;
        if (nd < 64)
            dref[nd++] =
                (ooc_iterdet_ref_t){.id = b[i].id, .alloc_op = rb ? rb->alloc_pos - 1 : -1};
    }
    if (o->key)
        ooc_verify_note(b, nb, first);
    R.nrefs += nb;
    if (token >= 0 && ooc_real.cuEventRecord(R.ev1[token], s) == CUDA_SUCCESS) {
        R.ev_op[token] = (int64_t)R.nops;
        R.ev_next = (R.ev_next + 1) % EV_RING;
    }
    R.nops++;
    R.unprofiled++;
    ooc_iterdet_op(R.det, signature(o, b, nb), dref, nd, &R.ev);
    if (R.ev.source != OOC_ITERDET_NONE && R.ev.iters >= R.want && R.ev.period > 0 &&
        !run_grows(&R.ev))
        atomic_store(&R.pending, 1);
    pthread_mutex_unlock(&rec_lock);
}

/* Does a detected run leave more memory allocated with each repetition? A training iteration
 * frees what it allocates (the live bytes at the start of each iteration are the same); a
 * repetition that keeps what it allocates is not one: a framework uploading its parameters
 * (PyTorch's model.to("cuda"): a weight, four batch-norm tensors and a counter, per layer, each
 * copied into a new buffer) repeats the same ops on fresh buffers, layer after layer. Growth up
 * to 64 KiB or 1% of the live bytes is let pass (a loss kept per iteration for logging).
 * Markers are never refused. Caller holds rec_lock. */
static int run_grows(const ooc_iterdet_event_t *ev) {
    if (ev->source != OOC_ITERDET_DETECTED || ev->first_op < 0 || ev->last_op <= ev->first_op ||
        (size_t)ev->last_op >= R.nops)
        return 0;
    uint64_t a = R.ops[ev->first_op].live, b = R.ops[ev->last_op].live;
    uint64_t slack = a / 100 > ((uint64_t)64 << 10) ? a / 100 : (uint64_t)64 << 10;
    if (b <= a + slack)
        return 0;
    if (ev->first_op != R.grew_first || ev->period != R.grew_period) {
        R.grew_first = ev->first_op;
        R.grew_period = ev->period;
        OOC_LOG_I("ops %lld.. repeat every %lld ops but keep what they allocate (%llu bytes more "
                  "live after %lld repetitions): not an iteration; still looking",
                  (long long)ev->first_op, (long long)ev->period, (unsigned long long)(b - a),
                  (long long)(ev->iters - 1));
    }
    return 1;
}

int ooc_record_pending(void) {
    return atomic_load_explicit(&R.pending, memory_order_relaxed);
}

/* ---- the marker ------------------------------------------------------------------------------ */

/* The recorder's side of the user's iteration marker (op.c's ooc_mark_iteration). An iteration
 * ends here; once called, only markers delimit iterations. Cheap; a no-op unless recording. */
void ooc_record_mark(void) {
    if (!ooc_record_on())
        return;
    pthread_mutex_lock(&rec_lock);
    ooc_iterdet_mark(R.det, &R.ev);
    if (R.ev.source != OOC_ITERDET_NONE && R.ev.iters >= R.want && R.ev.period > 0)
        atomic_store(&R.pending, 1);
    pthread_mutex_unlock(&rec_lock);
}

/* ---- the profile ----------------------------------------------------------------------------- */

/* "module!symbol+0x1f < ..." for the first frames outside the shim, or "-". */
static void site_of(const rbuf_t *b, char *out, size_t n) {
    Dl_info self;
    size_t len = 0;
    out[0] = 0;
    if (!dladdr((void *)site_of, &self))
        self.dli_fbase = NULL;
    int shown = 0;
    for (int i = 0; i < b->nips && shown < 3; i++) {
        Dl_info di;
        if (!dladdr(b->ips[i], &di) || di.dli_fbase == self.dli_fbase)
            continue;
        const char *mod = di.dli_fname ? strrchr(di.dli_fname, '/') : NULL;
        mod = mod ? mod + 1 : (di.dli_fname ? di.dli_fname : "?");
        int k;
        if (di.dli_sname)
            k = snprintf(out + len, n - len, "%s%s!%s+%#lx", shown ? " < " : "", mod, di.dli_sname,
                         (unsigned long)((char *)b->ips[i] - (char *)di.dli_saddr));
        else
            k = snprintf(out + len, n - len, "%s%s+%#lx", shown ? " < " : "", mod,
                         (unsigned long)((char *)b->ips[i] - (char *)di.dli_fbase));
        if (k < 0 || (size_t)k >= n - len)
            break;
        len += (size_t)k;
        shown++;
    }
    if (!len)
        snprintf(out, n, "-");
}

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

static int mkdirs(const char *path) {
    char tmp[OOC_PATH_MAX];
    snprintf(tmp, sizeof tmp, "%s", path);
    for (char *p = tmp + 1; *p; p++) {
        if (*p == '/') {
            *p = 0;
            if (mkdir(tmp, 0777) != 0 && errno != EEXIST)
                return -1;
            *p = '/';
        }
    }
    return mkdir(tmp, 0777) != 0 && errno != EEXIST ? -1 : 0;
}

static void program_line(char *out, size_t n) {
    FILE *f = fopen("/proc/self/cmdline", "r");
    size_t len = f ? fread(out, 1, n - 1, f) : 0;
    if (f)
        fclose(f);
    out[len] = 0;
    for (size_t i = 0; i + 1 < len; i++)
        if (out[i] == 0 || out[i] == '\t' || out[i] == '\n')
            out[i] = ' ';
    if (!len)
        snprintf(out, n, "-");
}

static int by_id(const void *a, const void *b) {
    const rbuf_t *x = *(rbuf_t *const *)a, *y = *(rbuf_t *const *)b;
    return x->id < y->id ? -1 : x->id > y->id;
}

/* Refines the accesses of the iteration's kernel ops with what verification found, and finds
 * each buffer's verified producer: prod[b] is the position of the op that is the first in the
 * iteration to use buffer b (allocated in the iteration, not persistent) when verification
 * found that it rewrites all of b with the same bytes whatever b held, reads every other buffer
 * it references without changing it, and no later op of the iteration changes b (re-launching it
 * then gives b's bytes up to b's free); -1 otherwise. acc[] gets one access per reference of the
 * ops [first, end), in order. Caller holds rec_lock; the live buffers have their pid. */
static void producers(int64_t first, int64_t end, size_t nlive, uint8_t *acc, int32_t *prod) {
    uint8_t pr[OOC_MAX_REFS];
    int8_t *state = calloc(nlive ? nlive : 1, 1); /* 0 unseen, 1 produced, -1 not producible */
    for (size_t i = 0; i < nlive; i++)
        prod[i] = -1;
    size_t at = 0;
    for (int64_t k = first; k < end; k++) {
        const rop_t *o = &R.ops[k];
        uint8_t *oa = acc + at;
        for (uint32_t r = 0; r < o->nref; r++)
            oa[r] = R.refs[o->ref_off + r].use;
        int known = o->nref <= OOC_MAX_REFS && ooc_verify_lookup(o->key, o->nref, oa, pr) == 0;
        int others_read = 1, nprod = 0;
        for (uint32_t r = 0; known && r < o->nref; r++) {
            nprod += pr[r] != 0;
            others_read &= pr[r] || oa[r] == OOC_USE_R;
        }
        for (uint32_t r = 0; state && r < o->nref; r++) {
            rbuf_t *b;
            HASH_FIND(hh, R.bufs, &R.refs[o->ref_off + r].id, sizeof(uint64_t), b);
            if (!b || b->pid < 0)
                continue;
            int8_t *st = &state[b->pid];
            if (*st == 0) {
                int in_iter = b->alloc_pos >= first;
                *st = known && pr[r] && nprod == 1 && others_read && in_iter ? 1 : -1;
                if (*st == 1)
                    prod[b->pid] = (int32_t)(k - first);
            } else if (*st == 1 && oa[r] != OOC_USE_R) {
                *st = -1; /* changed after its producer: re-launching it would not give b */
                prod[b->pid] = -1;
            }
        }
        at += o->nref;
    }
    free(state);
}

/* Builds the profile of the iteration [first, first + period) with durations the median of
 * the `iters` iterations that end with it. Caller holds rec_lock. NULL when out of memory. */
static ooc_profile_t *build(int64_t first, int64_t period, int64_t iters) {
    ooc_profile_t *p = ooc_profile_new();
    int64_t *durs = malloc((size_t)(iters > 0 ? iters : 1) * sizeof *durs);
    size_t nb = HASH_COUNT(R.bufs), nlive = 0;
    rbuf_t **live = malloc((nb ? nb : 1) * sizeof *live);
    ooc_ref_t *prefs = NULL;
    int64_t end = first + period;
    size_t nacc = 0;
    for (int64_t k = first; k < end; k++)
        nacc += R.ops[k].nref;
    uint8_t *acc = malloc(nacc ? nacc : 1);
    int32_t *prod = malloc((nb ? nb : 1) * sizeof *prod);
    int ok = p && durs && live && acc && prod;
    /* Every buffer that exists at some point of the iteration, in allocation order. */
    for (rbuf_t *b = R.bufs; ok && b; b = b->hh.next)
        if (b->alloc_pos < end && (b->free_pos < 0 || b->free_pos > first))
            live[nlive++] = b;
    if (ok)
        qsort(live, nlive, sizeof *live, by_id);
    for (size_t i = 0; ok && i < nlive; i++)
        live[i]->pid = (int64_t)i;
    if (ok)
        producers(first, end, nlive, acc, prod);
    char site[256];
    for (size_t i = 0; ok && i < nlive; i++) {
        rbuf_t *b = live[i];
        int64_t a = b->alloc_pos >= first ? b->alloc_pos - first : -1;
        int64_t f = (b->free_pos >= 0 && b->free_pos <= end) ? b->free_pos - 1 - first : -1;
        site_of(b, site, sizeof site);
        int persistent = a < 0 && f < 0;
        int32_t pr = prod[i];
        int np = pr >= 0 && !persistent;
        ok = ooc_profile_add_buffer(p, b->bytes, a, f, persistent, site, np ? &pr : NULL,
                                    np ? 1u : 0u) >= 0;
    }
    uint32_t maxref = 0;
    for (int64_t k = first; k < end; k++)
        if (R.ops[k].nref > maxref)
            maxref = R.ops[k].nref;
    prefs = malloc((maxref ? maxref : 1) * sizeof *prefs);
    ok = ok && prefs;
    char shape[128];
    size_t at = 0;
    for (int64_t k = first; ok && k < end; k++) {
        const rop_t *o = &R.ops[k];
        int64_t nd = 0;
        for (int64_t it = 0; it < iters; it++) {
            int64_t j = k - it * period;
            if (j >= 0 && R.ops[j].dur_ns >= 0)
                durs[nd++] = R.ops[j].dur_ns;
        }
        qsort(durs, (size_t)nd, sizeof *durs, cmp_i64);
        /* The lower median: a bracket only ever grows (the device idles in it while the host
         * stalls inside a library call), so of two iterations the shorter. */
        uint64_t dur = nd ? (uint64_t)durs[(nd - 1) / 2] : 0;
        if (o->kind == OOC_OP_KERNEL)
            snprintf(shape, sizeof shape, "grid=(%u,%u,%u);block=(%u,%u,%u)", o->grid[0],
                     o->grid[1], o->grid[2], o->block[0], o->block[1], o->block[2]);
        else
            snprintf(shape, sizeof shape, "bytes=%llu", (unsigned long long)o->bytes);
        uint32_t n = 0;
        for (uint32_t r = 0; r < o->nref; r++) {
            const rref_t *rr = &R.refs[o->ref_off + r];
            rbuf_t *b;
            HASH_FIND(hh, R.bufs, &rr->id, sizeof rr->id, b);
            if (!b || b->pid < 0)
                continue; /* not a buffer of this iteration (cannot happen) */
            prefs[n++] =
                (ooc_ref_t){.buf = (int32_t)b->pid, .access = acc[at + r], .word = rr->word};
        }
        at += o->nref;
        ok = ooc_profile_add_op(p, (int32_t)o->stream, (ooc_op_kind_t)o->kind, o->name, shape, dur,
                                prefs, n) >= 0;
    }
    for (size_t i = 0; i < nlive; i++)
        live[i]->pid = -1;
    free(prefs);
    free(live);
    free(durs);
    free(acc);
    free(prod);
    if (!ok) {
        ooc_profile_free(p);
        return NULL;
    }
    return p;
}

/* The fastest a recorded copy of the iteration moved its bytes each way (bytes per second; 0
 * when none was timed). A copy's two events enclose at least its transfer, so the link is at
 * least that fast: a floor no probe may read below. Copies whose direction the name does not
 * give (cuMemcpy, cuMemcpyAsync, batches) are not counted. */
static void recorded_link_floor(const ooc_profile_t *p, double *h2d_bps, double *d2h_bps) {
    *h2d_bps = *d2h_bps = 0;
    for (uint32_t i = 0; i < p->nops; i++) {
        const ooc_op_t *o = &p->ops[i];
        unsigned long long bytes;
        if (o->kind != OOC_KIND_MEMCPY || o->duration_ns == 0 ||
            sscanf(o->shape, "bytes=%llu", &bytes) != 1)
            continue;
        double bps = (double)bytes / ((double)o->duration_ns * 1e-9);
        double *to = strstr(o->name, "HtoD") ? h2d_bps : strstr(o->name, "DtoH") ? d2h_bps : NULL;
        if (to && bps > *to)
            *to = bps;
    }
}

/* How far apart two link figures may be from timing noise alone. */
#define LINK_SLACK 1.1

/* Sets the profile's link figures from the probe's medians bw[i] = {bytes, h2d, d2h, bidir} at
 * nbw growing copy sizes, the last one a chunk, checked for what cannot be: one way slower for
 * a chunk than for a smaller copy (larger copies move bytes at least as fast), slower than a
 * copy of the recording itself ran (recorded_link_floor), or both ways at once slower than the
 * faster way alone or faster than both added. Timing noise is allowed LINK_SLACK; beyond it,
 * the figure is corrected and the correction logged. */
static void link_figures(ooc_profile_t *p, double (*bw)[4], int nbw) {
    double fig[3] = {bw[nbw - 1][1], bw[nbw - 1][2], bw[nbw - 1][3]};
    static const char *const way[2] = {"to the device", "to the host"};
    double floor_bps[2];
    recorded_link_floor(p, &floor_bps[0], &floor_bps[1]);
    for (int k = 0; k < 2; k++) {
        int best = nbw - 1;
        for (int i = 0; i < nbw - 1; i++)
            if (bw[i][k + 1] > bw[best][k + 1])
                best = i;
        if (bw[best][k + 1] > LINK_SLACK * fig[k]) {
            OOC_LOG_W("the link %s measured %.3g GB/s with chunks but %.3g GB/s with %.0f-byte "
                      "copies: taking the latter",
                      way[k], fig[k] * 1e-9, bw[best][k + 1] * 1e-9, bw[best][0]);
            fig[k] = bw[best][k + 1];
        }
        if (floor_bps[k] > LINK_SLACK * fig[k]) {
            OOC_LOG_W("the link %s measured %.3g GB/s, but a copy of the recorded iteration ran "
                      "at %.3g GB/s: taking the latter",
                      way[k], fig[k] * 1e-9, floor_bps[k] * 1e-9);
            fig[k] = floor_bps[k];
        }
    }
    double lo = fig[0] > fig[1] ? fig[0] : fig[1], hi = fig[0] + fig[1];
    if (fig[2] * LINK_SLACK < lo || fig[2] > LINK_SLACK * hi) {
        double v = fig[2] < lo ? lo : hi;
        OOC_LOG_W("the link both ways at once measured %.3g GB/s, outside %.3g..%.3g GB/s (the "
                  "faster way alone, both added): taking %.3g GB/s",
                  fig[2] * 1e-9, lo * 1e-9, hi * 1e-9, v * 1e-9);
        fig[2] = v;
    }
    p->h2d_bps = fig[0];
    p->d2h_bps = fig[1];
    p->bidir_bps = fig[2];
}

/* When no iteration was found: every op recorded, in order, in DIR/unrepeated-ops.tsv (the
 * profile directory), so that a user can see what differs from one iteration to the next (the
 * iteration detector needs equal ops: kind, name, grid, block, bytes and buffer sizes, and the
 * same references by age). Written at exit and when a module unload restarts the recording;
 * the longest recording is kept. Sets R.dumped and R.dump_path. Caller holds rec_lock. */
static void dump_unrepeated(void) {
    char dir[OOC_PATH_MAX];
    if (R.nops == 0 || R.nops <= R.dumped ||
        ooc_options_profile_dir(ooc_opts(), dir, sizeof dir) != 0 || mkdirs(dir) != 0)
        return;
    char *path = R.dump_path;
    snprintf(path, sizeof R.dump_path, "%s/unrepeated-ops.tsv", dir);
    FILE *f = fopen(path, "w");
    if (!f)
        return;
    static const char *const kinds[] = {"kernel", "memcpy", "memset", "cudnn", "cublas", "nccl"};
    static const char *const uses[] = {"-", "r", "w", "rw"};
    fprintf(f, "#ooc-unrepeated-ops\t1\nop\tstream\tkind\tname\tgrid\tblock\tbytes\tlive\t"
               "refs (buffer id:bytes:use:ops since its allocation)\n");
    for (size_t i = 0; i < R.nops; i++) {
        const rop_t *o = &R.ops[i];
        fprintf(f, "%zu\t%u\t%s\t%s\t%u,%u,%u\t%u,%u,%u\t%llu\t%llu\t", i, o->stream,
                o->kind < 5 ? kinds[o->kind] : "?", o->name ? o->name : "-", o->grid[0], o->grid[1],
                o->grid[2], o->block[0], o->block[1], o->block[2], (unsigned long long)o->bytes,
                (unsigned long long)o->live);
        for (uint32_t k = 0; k < o->nref; k++) {
            const rref_t *r = &R.refs[o->ref_off + k];
            rbuf_t *b;
            HASH_FIND(hh, R.bufs, &r->id, sizeof r->id, b);
            fprintf(f, "%s%llu:%llu:%s:%lld", k ? " " : "", (unsigned long long)r->id,
                    b ? (unsigned long long)b->bytes : 0ull, uses[r->use & 3],
                    b ? (long long)i - (long long)b->alloc_pos : -1ll);
        }
        fputc('\n', f);
    }
    if (fclose(f) == 0)
        R.dumped = R.nops;
}

static ooc_profile_t *finish(int at_exit, char *dir_out, uint32_t *pos_out) {
    pthread_mutex_lock(&rec_lock);
    if (atomic_load(&ooc_rec_state) != OOC_REC_ON) {
        pthread_mutex_unlock(&rec_lock);
        return NULL;
    }
    atomic_store(&ooc_rec_state, OOC_REC_DONE);
    ooc_iterdet_event_t ev = R.ev;
    if (ev.source == OOC_ITERDET_NONE || ev.iters < 1 || ev.period <= 0) {
        /* Counted over restarts since the last profile: a program that unloads its modules at
         * exit restarts the recording, which then sees nothing, and is nothing to warn about. */
        size_t seen = R.unprofiled;
        if (seen)
            dump_unrepeated();
        char path[sizeof R.dump_path];
        snprintf(path, sizeof path, "%s", R.dumped ? R.dump_path : "");
        pthread_mutex_unlock(&rec_lock);
        if (seen)
            OOC_LOG_W("no profile written: no repeating iteration was found in %zu operations "
                      "(call ooc_mark_iteration() after each iteration to mark them)%s%s",
                      seen, path[0] ? "; the longest recording's operations are listed in " : "",
                      path);
        return NULL;
    }
    for (unsigned i = 0; i < EV_RING; i++)
        harvest(i);
    int64_t first = ev.last_op, period = ev.period;
    ooc_profile_t *p = build(first, period, ev.iters);
    R.unprofiled = 0;
    /* The op the program issues next, as a position in the iteration. */
    uint32_t next_pos = (uint32_t)(((int64_t)R.nops - first) % period);
    pthread_mutex_unlock(&rec_lock);
    if (!p) {
        OOC_LOG_E("no profile written: out of memory");
        return NULL;
    }
    uint64_t chunk, budget;
    ooc_mem_geometry(&chunk, &budget);
    p->swapin_exclusive = (uint8_t)ooc_mem_swapin_exclusive();
    p->swapout_exclusive = (uint8_t)ooc_mem_swapout_exclusive();
    p->remap_gate = (uint8_t)ooc_mem_remap_gate();
    /* Three copy sizes, the largest (one chunk: what a swap moves) last; meta.tsv takes it. */
    double bw[3][4];
    int nbw = 0;
    for (uint64_t size = chunk / 16 >= 4096 ? chunk / 16 : 4096; nbw < 3; size *= 4) {
        if (size > chunk || nbw == 2)
            size = chunk;
        bw[nbw][0] = (double)size;
        if (ooc_mem_measure_bw(size, &bw[nbw][1], &bw[nbw][2], &bw[nbw][3]) != CUDA_SUCCESS)
            break;
        nbw++;
        if (size == chunk)
            break;
    }
    if (nbw > 0) {
        link_figures(p, bw, nbw);
    } else {
        OOC_LOG_W("the copy bandwidth could not be measured; the profile keeps the defaults");
    }
    ooc_vmm_times_t vmm;
    if (ooc_mem_measure_vmm(&vmm) == CUDA_SUCCESS) {
        p->swapin_vmm_ns = vmm.in_ns;
        p->swapout_vmm_ns = vmm.out_ns;
        p->map_vmm_ns = vmm.map_ns;
        p->unmap_vmm_ns = vmm.unmap_ns;
        p->stage_vmm_ns = vmm.stage_ns;
        p->adopt_vmm_ns = vmm.adopt_ns;
    } else {
        OOC_LOG_W("the mapping calls' time could not be measured; the plan counts none");
    }
    char prog[1024], dev[128] = "-", dir[OOC_PATH_MAX], err[256];
    program_line(prog, sizeof prog);
    CUdevice d;
    size_t total = 0;
    if (ooc_real.cuCtxGetDevice(&d) == CUDA_SUCCESS) {
        ooc_real.cuDeviceGetName(dev, sizeof dev, d);
        ooc_real.cuDeviceTotalMem_v2(&total, d);
    }
    ooc_profile_set_str(&p->program, prog);
    ooc_profile_set_str(&p->device, dev);
    p->device_mem_bytes = total;
    p->budget_bytes = budget;
    p->chunk_bytes = chunk;
    p->iterations = (uint32_t)ev.iters;
    if (ooc_options_profile_dir(ooc_opts(), dir, sizeof dir) != 0 || mkdirs(dir) != 0) {
        OOC_LOG_E("no profile written: cannot create the directory %s: %s", dir, strerror(errno));
    } else if (ooc_profile_validate(p, err, sizeof err) != 0) {
        OOC_LOG_E("no profile written: the recorded iteration is inconsistent: %s", err);
    } else if (ooc_profile_write(p, dir, err, sizeof err) != 0) {
        OOC_LOG_E("no profile written to %s: %s", dir, err);
    } else {
        char path[OOC_PATH_MAX + 16];
        snprintf(path, sizeof path, "%s/trace.json", dir);
        if (ooc_trace_json_write_file(p, NULL, path, err, sizeof err) != 0)
            OOC_LOG_W("the profile's Chrome trace was not written: %s", err);
        snprintf(path, sizeof path, "%s/bandwidth.tsv", dir);
        FILE *f = nbw > 0 ? fopen(path, "w") : NULL;
        if (f) {
            fprintf(f, "#ooc-profile\tbandwidth\t1\nbytes\th2d_bps\td2h_bps\tbidir_bps\n");
            for (int i = 0; i < nbw; i++)
                fprintf(f, "%.0f\t%.6g\t%.6g\t%.6g\n", bw[i][0], bw[i][1], bw[i][2], bw[i][3]);
            fclose(f);
        }
        ooc_log_banner("profile recorded in %s: %u ops, %u buffers per iteration (%s, %lld "
                       "iterations matched after the warm-up)",
                       dir, p->nops, p->nbufs,
                       ev.source == OOC_ITERDET_MARKER ? "marked" : "detected",
                       (long long)ev.iters);
        if (!at_exit && atomic_load(&ooc_mode_now) == OOC_MODE_AUTO) {
            snprintf(dir_out, OOC_PATH_MAX, "%s", dir);
            *pos_out = next_pos;
            return p; /* the caller plans it (op.c) */
        }
    }
    ooc_profile_free(p);
    return NULL;
}

ooc_profile_t *ooc_record_finish(char *dir, uint32_t *pos) {
    return finish(0, dir, pos);
}

void ooc_record_finish_at_exit(void) {
    finish(1, NULL, NULL);
}

void ooc_record_functions_gone_l(int plan_dropped) {
    pthread_mutex_lock(&rec_lock);
    int recording = atomic_load(&ooc_rec_state) == OOC_REC_ON;
    if (recording)
        atomic_store(&ooc_rec_state, OOC_REC_DONE); /* restarted below, under the same lock */
    pthread_mutex_unlock(&rec_lock);
    if (recording || plan_dropped) {
        ooc_mem_l_quiesce(); /* no fast-path op slips in before the recorder is on again */
        ooc_record_restart_l();
    } else {
        ooc_verify_reset();
    }
}

/* Takes a live buffer as existing before the first op of the new recording. */
static void seed(uint64_t id, uintptr_t addr, uint64_t bytes, void *ctx) {
    (void)addr;
    (void)ctx;
    rbuf_t *b = calloc(1, sizeof *b);
    if (!b) {
        R.give_up = 1;
        return;
    }
    b->id = id;
    b->bytes = bytes;
    b->free_pos = -1;
    b->first_use = -1;
    b->pid = -1;
    rec_oom = 0;
    HASH_ADD(hh, R.bufs, id, sizeof b->id, b);
    if (!rec_oom)
        R.live += bytes;
    if (rec_oom) {
        free(b);
        R.give_up = 1;
    }
}

void ooc_record_restart_l(void) {
    pthread_mutex_lock(&rec_lock);
    ooc_iterdet_t *d = NULL;
    if (atomic_load(&ooc_rec_state) == OOC_REC_ON || ooc_iterdet_new(NULL, &d) != 0) {
        pthread_mutex_unlock(&rec_lock);
        return;
    }
    ooc_iterdet_free(R.det);
    R.det = d;
    R.want = ooc_opts()->profile_iters;
    if (!R.ctx)
        ooc_real.cuCtxGetCurrent(&R.ctx);
    /* A recording that found nothing is listed before it goes (the longest one is kept). */
    if (R.ev.source == OOC_ITERDET_NONE)
        dump_unrepeated();
    rbuf_t *b, *bt;
    HASH_ITER(hh, R.bufs, b, bt) {
        HASH_DEL(R.bufs, b);
        free(b);
    }
    R.nops = 0;
    R.nrefs = 0;
    R.live = 0; /* the live buffers are seeded below */
    R.grew_first = R.grew_period = 0;
    memset(&R.ev, 0, sizeof R.ev);
    for (int i = 0; i < EV_RING; i++)
        R.ev_op[i] = -1;
    R.ev_next = 0;
    atomic_store(&R.pending, 0);
    R.give_up = 0;
    ooc_verify_reset();
    ooc_mem_l_each_buffer(seed, NULL);
    atomic_store(&ooc_rec_state, OOC_REC_ON);
    pthread_mutex_unlock(&rec_lock);
}
