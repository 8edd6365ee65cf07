/* SPDX-License-Identifier: MIT */
/* fc_stream.c: simulated streams and events: in-order queues run by one worker thread per stream
 * (or inline on the caller's thread), cross-stream dependencies, legacy default-stream
 * semantics, seeded jitter, the timing model's engines, the strict-mode check, and the rules of
 * stream capture that apply when work is issued.
 *
 * Every op carries a sequence number on its stream and a list of (stream, seq) dependencies;
 * a worker runs its head op once every dependency has completed. The legacy stream waits for
 * all blocking streams and they for it, as on the real driver. An op stays at the head of its
 * queue while it runs, so fc_strict_check sees running work as well as queued work.
 *
 * While a stream captures (fc_graph.c), fc_submit adds its ops to the capture instead of queuing
 * them; what a capturing stream cannot take (an event record or wait: no cross-stream capture;
 * a synchronous wait; the legacy stream used while a blocking stream captures) fails and
 * invalidates the capture, as on the driver.
 *
 * Locking: g_fc.lock guards every queue, counter and event; g_fc.cv is broadcast when an op is
 * queued or completed, for the host's waits. A stream's worker waits on the stream's own cv,
 * signalled when an op is queued on it and when the op its head waits for completes: waking
 * every worker at each completion cost 50 us per hop between two streams, 100 with six. Op
 * bodies run without the lock. */
#include "fc_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>

static _Thread_local fc_stream_t *per_thread_stream;
static atomic_int streams_started;

/* ---- ops ---------------------------------------------------------------------------------------
 */

fc_op_t *fc_op_new(const char *what, CUresult (*run)(fc_op_t *), void *payload,
                   void (*dispose)(fc_op_t *)) {
    fc_op_t *op = calloc(1, sizeof *op);
    if (!op)
        return NULL;
    op->what = what;
    op->run = run;
    op->payload = payload;
    op->dispose = dispose;
    return op;
}

void fc_op_free(fc_op_t *op) {
    if (op->dispose)
        op->dispose(op);
    free(op->deps);
    free(op->refs);
    free(op->prefs);
    free(op);
}

static void op_free(fc_op_t *op) {
    fc_op_free(op);
}

void fc_op_ref(fc_op_t *op, uintptr_t lo, uintptr_t hi, int write) {
    if (op->nrefs == op->cap_refs) {
        unsigned nc = op->cap_refs ? op->cap_refs * 2 : 4;
        fc_ref_t *n = realloc(op->refs, nc * sizeof *n);
        if (!n)
            return; /* strict checking is best effort under memory pressure */
        op->refs = n;
        op->cap_refs = nc;
    }
    op->refs[op->nrefs].lo = lo;
    op->refs[op->nrefs].hi = hi;
    op->refs[op->nrefs].write = write;
    op->nrefs++;
}

static int op_dep(fc_op_t *op, fc_stream_t *s, uint64_t seq) {
    if (seq == 0 || s->completed >= seq)
        return 0;
    if (op->ndeps == op->cap_deps) {
        unsigned nc = op->cap_deps ? op->cap_deps * 2 : 4;
        fc_dep_t *n = realloc(op->deps, nc * sizeof *n);
        if (!n)
            return -1;
        op->deps = n;
        op->cap_deps = nc;
    }
    op->deps[op->ndeps].s = s;
    op->deps[op->ndeps].seq = seq;
    op->ndeps++;
    return 0;
}

int fc_op_after(fc_op_t *op, fc_stream_t *s, uint64_t seq) {
    pthread_mutex_lock(&g_fc.lock);
    int rc = op_dep(op, s, seq);
    pthread_mutex_unlock(&g_fc.lock);
    return rc;
}

/* ---- jitter and the timing model ---------------------------------------------------------------
 */

static uint64_t splitmix(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Sleeps until fc_now_ns() reads at least `when`. */
static void sleep_until(uint64_t when) {
    struct timespec ts = {(time_t)(when / 1000000000ull), (long)(when % 1000000000ull)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) != 0)
        ;
}

/* The modelled clock. A device starts an op when it was queued, its stream's previous op is done
 * and the ops it waits for are done, and its engine is free; it ends the op its modelled time
 * later. The simulator's threads reach each of those moments late (a thread woken on 2 busy
 * cores runs 100-200 us after its time), and when every op started from the moment its thread
 * ran, each op's lateness was added to the next: a 2 MiB copy modelled at 629 us held its engine
 * 802 us (median over a replay's copies). So each op's start and end are computed from the
 * modelled ends of what it waits for (model_start_ns, model_end_ns), and its thread sleeps until
 * the modelled end: a late thread catches up on the ops queued behind, as a device would have run
 * them. Nothing ends before its modelled end (the host sees an op complete no sooner), and an
 * event's time is its modelled time (cuEventElapsedTime measures the modelled device). */

/* The modelled end of stream s's ops up to the one numbered seq (completed). A dependency's stream
 * may have moved on by the time the op waiting for it starts: on a device that op starts when the
 * op it waits for ends, not when the stream's latest does (taking the latest made a copy waiting
 * for an event recorded long before wait for whatever its stream ran since). An op older than the
 * ring holds gets the oldest end it holds, which is no earlier. Caller holds g_fc.lock. */
static uint64_t model_done_at(const fc_stream_t *s, uint64_t seq) {
    if (s->completed - seq >= FC_MODEL_RING)
        seq = s->completed - FC_MODEL_RING + 1;
    return s->model_done_at[seq % FC_MODEL_RING];
}

/* op's modelled start but for its engine: the latest of when it was queued and the modelled ends
 * of its stream's last op and of the ops it waits for. Caller holds g_fc.lock; op's dependencies
 * are done (deps_done). */
static void model_start(const fc_stream_t *s, fc_op_t *op) {
    uint64_t t = op->queued_ns;
    if (s->model_done_ns > t)
        t = s->model_done_ns;
    for (unsigned i = 0; i < op->ndeps; i++) {
        uint64_t d = model_done_at(op->deps[i].s, op->deps[i].seq);
        if (d > t)
            t = d;
    }
    op->model_start_ns = t;
}

/* This thread's CPU time. */
static uint64_t thread_cpu_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* FAKECUDA_TRACE: one row for op, on `engine`, from its modelled start to its modelled end; t0:
 * when its thread ran its body. */
static void trace_row(const char *engine, const fc_op_t *op, uint64_t t0) {
    uint64_t z = g_fc.trace_t0;
    pthread_mutex_lock(&g_fc.trace_lock);
    if (g_fc.trace)
        fprintf(g_fc.trace, "%s\t%llu\t%llu\t%s\t%llu\t%llu\t%llu\n", engine,
                (unsigned long long)(op->model_start_ns - z),
                (unsigned long long)(op->model_end_ns - z), op->what ? op->what : "-",
                (unsigned long long)(op->queued_ns - z),
                (unsigned long long)((op->ready_ns ? op->ready_ns : t0) - z),
                (unsigned long long)(t0 - z));
    pthread_mutex_unlock(&g_fc.trace_lock);
}

/* Runs op's body; with timing on, holds its engine until the op's modelled end. */
static CUresult execute(fc_op_t *op) {
    if (!g_fc.cfg.timing)
        return op->run(op);
    if (g_fc.cfg.remap_queued && op->relocate)
        op->relocate(op);
    if (op->engine == FC_ENG_NONE) {
        /* No engine: the op takes what its body takes, from its modelled start (a host function
         * or a wait on memory holds its stream that long on a device too), or nothing. A wait on
         * memory that had to wait ends no sooner than the host wrote the value: its thread may
         * have started it late, and counting its wait from the modelled start ended it before
         * the write, so that ops behind it completed earlier than they could (CI, 2026-12-03:
         * the host saw twenty copies done 0.1 ms before their modelled time). The moment it saw
         * the value is taken as a device would have: less the lateness with which the host had
         * learned of what it replied to ("the host's replies", below). */
        uint64_t t0 = fc_now_ns();
        CUresult r = op->run(op);
        op->model_end_ns = op->model_start_ns + (op->instant ? 0 : fc_now_ns() - t0);
        if (op->seen_ns) /* (the host's reply, as a device would have seen it) */
            op->model_end_ns = op->seen_ns > op->model_start_ns ? op->seen_ns : op->model_start_ns;
        if (g_fc.trace && op->seen_ns) /* a wait on memory that had to wait: what held it */
            trace_row("memwait", op, t0);
        return r;
    }
    pthread_mutex_lock(&g_fc.engine[op->engine]);
    uint64_t t0 = fc_now_ns(), c0 = thread_cpu_ns();
    uint64_t start = op->model_start_ns;
    if (g_fc.engine_free_ns[op->engine] > start)
        start = g_fc.engine_free_ns[op->engine];
    op->model_start_ns = start;
    CUresult r = op->run(op);
    /* The longer of the modelled time (known after the body: a kernel's grows by what it reached
     * across the link) and the body's own, both from the modelled start. The body's own is the
     * CPU time its thread spent on it (and the waits it declared, fakecuda_waited), not the time
     * that passed: on a GPU an engine does not stop while the host's threads run, and here the
     * engines' threads share the host's few cores with the program's thread and each other (an
     * engine's thread descheduled for a copy's memmove on another engine is not the device being
     * slower). */
    uint64_t now = fc_now_ns(), spent = thread_cpu_ns() - c0 + op->waited_ns;
    uint64_t end = start + ((double)spent > op->model_ns ? spent : (uint64_t)op->model_ns);
    if (now < end)
        sleep_until(end);
    op->model_end_ns = end;
    g_fc.engine_free_ns[op->engine] = end;
    pthread_mutex_unlock(&g_fc.engine[op->engine]);
    if (g_fc.trace) {
        static const char *const names[] = {"none", "compute", "h2d", "d2h"};
        trace_row(names[op->engine], op, t0);
    }
    return r;
}

/* Strict mode, threaded: op starts on stream s. A physical chunk mapped at two addresses (the
 * shim gives the memory a swap-out is vacating to a swap-in at once) may be written through one
 * while another op reads or writes it through the other only when the two are ordered (events,
 * streams); two such ops running at once are not, and on a GPU the bytes would be wrong. Such a
 * pair is reported (and fatal in strict mode) rather than left to corrupt data by chance. Two
 * copies or memsets through the same address are held to the same rule (a copy in that reads a
 * host copy still being written by its copy out; since 2026-12-03): a kernel's references are
 * only what its parameters point into, read or written, so two kernels, or a kernel and a copy,
 * through one address are left to fc_strict_access, which sees the bytes a kernel touches.
 * Finds op's physical parts without g_fc.lock, then takes it. */
static void start_op(fc_stream_t *s, fc_op_t *op) {
    unsigned cap = 0;
    op->nprefs = 0;
    for (unsigned i = 0; i < op->nrefs; i++)
        fc_mem_phys(&op->refs[i], &op->prefs, &op->nprefs, &cap);
    const char *other = NULL;
    uintptr_t va1 = 0, va2 = 0;
    pthread_mutex_lock(&g_fc.lock);
    for (fc_stream_t *t = g_fc.all_streams; t && !other; t = t->all_next) {
        const fc_op_t *o = t->head;
        if (t == s || !o || !o->running)
            continue;
        for (unsigned i = 0; i < op->nprefs && !other; i++) {
            const fc_pref_t *a = &op->prefs[i];
            for (unsigned j = 0; j < o->nprefs && !other; j++) {
                const fc_pref_t *b = &o->prefs[j];
                if (a->h == b->h && a->lo < b->hi && b->lo < a->hi && (a->write || b->write) &&
                    (a->va - a->lo != b->va - b->lo || (!op->n_kernels && !o->n_kernels))) {
                    other = o->what ? o->what : "an op";
                    va1 = a->va;
                    va2 = b->va;
                }
            }
        }
    }
    op->running = 1;
    pthread_mutex_unlock(&g_fc.lock);
    if (other) {
        fc_warn("strict: %s starts at %#lx while %s, with no order between them, still runs on "
                "the same physical memory through %s (%#lx)",
                op->what ? op->what : "an op", (unsigned long)va1, other,
                va1 == va2 ? "the same address" : "another address", (unsigned long)va2);
        FC_STAT(strict_violations, 1);
        if (g_fc.cfg.strict)
            fc_fatal("strict mode: two unordered ops on one physical chunk%s "
                     "(FAKECUDA_STRICT=0 only counts it)",
                     va1 == va2 ? "" : " through two addresses");
    }
}

/* Strict mode, threaded: a kernel that op runs is about to access [p, p + bytes) (`write`: to
 * write it), through any pointer, its parameters' or one it read from memory. When a copy or a
 * memset that is not ordered with it (it runs now, on another stream) writes those physical
 * bytes, the kernel could read them half written on a GPU, or its own write be overwritten: the
 * race is reported (and fatal in strict mode). Not reported: a kernel writing bytes that such a
 * copy reads (the copy's result may be thrown away, as the shim does with a swap-out that an op
 * overtook); kernels' own references, which count as writes of whole allocations where this
 * check wants what each op really touches. */
/* Whether a copy or memset other than op runs now and writes physical bytes (caller holds
 * g_fc.lock). */
static int copy_writing(const fc_op_t *op) {
    for (fc_stream_t *t = g_fc.all_streams; t; t = t->all_next) {
        const fc_op_t *o = t->head;
        if (!o || o == op || !o->running || o->n_kernels)
            continue;
        for (unsigned j = 0; j < o->nprefs; j++)
            if (o->prefs[j].write)
                return 1;
    }
    return 0;
}

void fc_strict_access(const fc_op_t *op, uintptr_t p, size_t bytes, int write) {
    pthread_mutex_lock(&g_fc.lock);
    int any = copy_writing(op); /* most accesses: none, and no translation below */
    pthread_mutex_unlock(&g_fc.lock);
    if (!any)
        return;
    fc_pref_t *parts = NULL;
    unsigned n = 0, cap = 0;
    fc_ref_t r = {p, p + bytes, write};
    fc_mem_phys(&r, &parts, &n, &cap);
    const char *other = NULL;
    pthread_mutex_lock(&g_fc.lock);
    for (fc_stream_t *t = g_fc.all_streams; t && !other && n; t = t->all_next) {
        const fc_op_t *o = t->head;
        if (!o || o == op || !o->running || o->n_kernels)
            continue;
        for (unsigned i = 0; i < n && !other; i++) {
            for (unsigned j = 0; j < o->nprefs && !other; j++) {
                const fc_pref_t *b = &o->prefs[j];
                if (parts[i].h == b->h && parts[i].lo < b->hi && b->lo < parts[i].hi && b->write)
                    other = o->what ? o->what : "an op";
            }
        }
    }
    pthread_mutex_unlock(&g_fc.lock);
    free(parts);
    if (!other)
        return;
    fc_warn("strict: %s %s %zu bytes at %#lx while %s, with no order between them, writes them",
            op->what ? op->what : "a kernel", write ? "writes" : "reads", bytes, (unsigned long)p,
            other);
    FC_STAT(strict_violations, 1);
    if (g_fc.cfg.strict)
        fc_fatal("strict mode: a kernel and a copy or memset touch the same bytes at once, "
                 "unordered (FAKECUDA_STRICT=0 only counts it)");
}

static int deps_done(const fc_op_t *op) {
    for (unsigned i = 0; i < op->ndeps; i++)
        if (op->deps[i].s->completed < op->deps[i].seq)
            return 0;
    return 1;
}

/* Completes the head op of s. Caller holds g_fc.lock. */
static void complete_head(fc_stream_t *s, fc_op_t *op, CUresult r) {
    if (r != CUDA_SUCCESS)
        fc_set_sticky(r);
    s->head = op->next;
    if (!s->head)
        s->tail = NULL;
    s->completed = op->seq;
    if (op->model_end_ns > s->model_done_ns)
        s->model_done_ns = op->model_end_ns;
    s->model_done_at[op->seq % FC_MODEL_RING] = s->model_done_ns;
    if (g_fc.cfg.timing)
        s->done_wall_at[op->seq % FC_MODEL_RING] = fc_now_ns();
    pthread_cond_broadcast(&g_fc.cv);
    for (fc_stream_t *t = g_fc.all_streams; t; t = t->all_next)
        if (t->blocked && deps_done(t->head))
            pthread_cond_signal(&t->cv);
}

/* Set on the simulator's own stream threads: an op they run that submits (none should, as a host
 * function may not call the driver) is never held by the launch queue's bound. */
static _Thread_local int on_stream_thread;

static void *worker(void *arg) {
    fc_stream_t *s = arg;
    on_stream_thread = 1;
    /* The timing model's sleeps end on time (the default slack of 50 us would add that much
     * to every op, where a GPU adds nothing). */
    (void)prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
    uint64_t rng = g_fc.cfg.seed ^ ((uint64_t)(uintptr_t)s * 0x9e3779b97f4a7c15ull);
    pthread_mutex_lock(&g_fc.lock);
    for (;;) {
        while (!s->head && !s->closing) {
            pthread_cond_wait(&s->cv, &g_fc.lock);
            FC_STAT(worker_wakeups, 1);
        }
        if (!s->head)
            break;
        fc_op_t *op = s->head;
        s->blocked = 1;
        while (!deps_done(op)) {
            pthread_cond_wait(&s->cv, &g_fc.lock);
            FC_STAT(worker_wakeups, 1);
        }
        s->blocked = 0;
        if (g_fc.trace)
            op->ready_ns = fc_now_ns();
        if (g_fc.cfg.jitter_us) {
            /* A thread late to an op it could start: the other streams may have moved on
             * meanwhile, which the modelled device must not see (model_start). */
            pthread_mutex_unlock(&g_fc.lock);
            fc_sleep_ns((splitmix(&rng) % ((uint64_t)g_fc.cfg.jitter_us + 1)) * 1000ull);
            pthread_mutex_lock(&g_fc.lock);
        }
        if (g_fc.cfg.timing)
            model_start(s, op);
        pthread_mutex_unlock(&g_fc.lock);
        start_op(s, op);
        CUresult r = atomic_load(&g_fc.sticky) != CUDA_SUCCESS ? CUDA_SUCCESS : execute(op);
        pthread_mutex_lock(&g_fc.lock);
        op->running = 0;
        complete_head(s, op, r);
        pthread_mutex_unlock(&g_fc.lock);
        op_free(op);
        pthread_mutex_lock(&g_fc.lock);
    }
    pthread_mutex_unlock(&g_fc.lock);
    return NULL;
}

/* ---- streams -----------------------------------------------------------------------------------
 */

static fc_stream_t *stream_new(unsigned flags, int priority) {
    fc_stream_t *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->magic = FC_MAGIC_STREAM;
    pthread_cond_init(&s->cv, NULL);
    s->flags = flags;
    s->priority = priority;
    pthread_mutex_lock(&g_fc.lock);
    s->all_next = g_fc.all_streams;
    g_fc.all_streams = s;
    pthread_mutex_unlock(&g_fc.lock);
    return s;
}

static fc_stream_t *legacy_stream(void) {
    pthread_mutex_lock(&g_fc.lock);
    fc_stream_t *s = g_fc.legacy;
    pthread_mutex_unlock(&g_fc.lock);
    if (s)
        return s;
    fc_stream_t *n = stream_new(0, 0);
    if (!n)
        return NULL;
    n->legacy = 1;
    pthread_mutex_lock(&g_fc.lock);
    if (!g_fc.legacy)
        g_fc.legacy = n;
    else
        n->closing = 1; /* lost the race: stays on the list, never used */
    s = g_fc.legacy;
    pthread_mutex_unlock(&g_fc.lock);
    return s;
}

fc_stream_t *fc_stream_resolve(CUstream h, int ptds) {
    if (h == CU_STREAM_PER_THREAD || (h == NULL && ptds)) {
        if (!per_thread_stream) {
            per_thread_stream = stream_new(0, 0);
            if (per_thread_stream)
                per_thread_stream->per_thread = 1;
        }
        return per_thread_stream;
    }
    if (h == NULL || h == CU_STREAM_LEGACY)
        return legacy_stream();
    if (h->magic != FC_MAGIC_STREAM || h->closing)
        return NULL;
    return h;
}

int fc_stream_valid(CUstream h) {
    return h == NULL || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD ||
           (h->magic == FC_MAGIC_STREAM && !h->closing);
}

/* Adds the implicit dependencies of legacy default-stream semantics. Caller holds the lock. */
static int implicit_deps(fc_stream_t *s, fc_op_t *op) {
    if (s->flags & CU_STREAM_NON_BLOCKING)
        return 0;
    if (s->legacy) {
        for (fc_stream_t *t = g_fc.all_streams; t; t = t->all_next)
            if (t != s && !(t->flags & CU_STREAM_NON_BLOCKING) && op_dep(op, t, t->submitted))
                return -1;
        return 0;
    }
    fc_stream_t *l = g_fc.legacy;
    return l ? op_dep(op, l, l->submitted) : 0;
}

/* ---- the rules of stream capture at issue time ----------------------------------------------- */

/* Is a stream that synchronises with the legacy stream capturing? Caller holds the lock. */
static int blocking_capture(void) {
    if (atomic_load(&g_fc.captures) == 0)
        return 0;
    for (fc_stream_t *t = g_fc.all_streams; t; t = t->all_next)
        if (t->capture && !(t->flags & CU_STREAM_NON_BLOCKING))
            return 1;
    return 0;
}

/* The legacy stream used while a blocking stream captures would make the capture depend on it
 * implicitly: refused, and every such capture invalidated. Caller holds the lock. */
static CUresult legacy_rule(fc_stream_t *s, const char *what) {
    if (!s->legacy || !blocking_capture())
        return CUDA_SUCCESS;
    for (fc_stream_t *t = g_fc.all_streams; t; t = t->all_next)
        if (t->capture && !(t->flags & CU_STREAM_NON_BLOCKING))
            fc_capture_invalidate(t, what);
    return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
}

CUresult fc_capture_refuse(fc_stream_t *s, const char *what) {
    if (atomic_load(&g_fc.captures) == 0)
        return CUDA_SUCCESS;
    CUresult r = CUDA_SUCCESS;
    pthread_mutex_lock(&g_fc.lock);
    if (s->capture) {
        r = s->capture->invalidated ? CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
                                    : CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
        fc_capture_invalidate(s, what);
    } else {
        r = legacy_rule(s, what);
    }
    pthread_mutex_unlock(&g_fc.lock);
    return r;
}

int fc_capturing(CUstream h, int ptds) {
    if (atomic_load(&g_fc.captures) == 0)
        return 0;
    fc_stream_t *s = fc_stream_resolve(h, ptds);
    if (!s)
        return 0;
    pthread_mutex_lock(&g_fc.lock);
    int c = s->capture != NULL;
    pthread_mutex_unlock(&g_fc.lock);
    return c;
}

CUresult fc_capture_unsafe(const char *what) {
    if (atomic_load(&g_fc.captures) == 0)
        return CUDA_SUCCESS;
    CUresult r = CUDA_SUCCESS;
    pthread_t self = pthread_self();
    pthread_mutex_lock(&g_fc.lock);
    for (fc_stream_t *t = g_fc.all_streams; t; t = t->all_next) {
        fc_capture_t *c = t->capture;
        if (!c)
            continue;
        if (c->mode == CU_STREAM_CAPTURE_MODE_GLOBAL ||
            (c->mode == CU_STREAM_CAPTURE_MODE_THREAD_LOCAL && pthread_equal(c->thread, self))) {
            fc_capture_invalidate(t, what);
            r = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
        }
    }
    pthread_mutex_unlock(&g_fc.lock);
    return r;
}

/* Adds op to s's capture. Caller holds the lock; s->capture is not NULL. */
static CUresult capture_op(fc_stream_t *s, fc_op_t *op) {
    fc_capture_t *c = s->capture;
    if (c->invalidated)
        return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    if (!op->clone) {
        fc_capture_invalidate(s, op->what);
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    fc_oplist_t *l = c->list;
    if (l->n == l->cap) {
        size_t nc = l->cap ? l->cap * 2 : 16;
        fc_op_t **n = realloc(l->ops, nc * sizeof *n);
        if (!n) {
            /* A graph that silently lacked the op would be worse than no graph. */
            fc_capture_invalidate(s, "out of host memory");
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        l->ops = n;
        l->cap = nc;
    }
    l->ops[l->n++] = op;
    return CUDA_SUCCESS;
}

/* Counts what an op does, when it is queued to run. */
static void count_op(const fc_op_t *op) {
    if (op->n_kernels)
        FC_STAT(kernels_launched, op->n_kernels);
    if (op->n_memcpys)
        FC_STAT(memcpys, op->n_memcpys);
    if (op->n_memsets)
        FC_STAT(memsets, op->n_memsets);
    if (op->b_h2d)
        FC_STAT(bytes_h2d, op->b_h2d);
    if (op->b_d2h)
        FC_STAT(bytes_d2h, op->b_d2h);
    if (op->b_d2d)
        FC_STAT(bytes_d2d, op->b_d2d);
}

/* Seconds a submission may wait for room in a full launch queue before the simulator reports a
 * hang: on a GPU the host would wait for ever. */
#define FC_QUEUE_FULL_LIMIT_S 60

/* The real driver's launch queue is bounded (about 1000 operations a stream): a submission to a
 * stream that holds queue_depth ops queued or running blocks the host until one completes. A
 * host thread that blocks there while the device waits for something that thread, or a thread
 * waiting for it, was to do never returns; the simulator stops the process after
 * FC_QUEUE_FULL_LIMIT_S naming the stream's oldest op. Caller holds g_fc.lock. */
static void wait_queue_room(fc_stream_t *s) {
    if (!g_fc.cfg.threaded || !g_fc.cfg.queue_depth || on_stream_thread || s->capture)
        return;
    if (s->submitted - s->completed < g_fc.cfg.queue_depth)
        return;
    FC_STAT(queue_full_waits, 1);
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += FC_QUEUE_FULL_LIMIT_S;
    while (s->submitted - s->completed >= g_fc.cfg.queue_depth && !s->closing)
        if (pthread_cond_timedwait(&g_fc.cv, &g_fc.lock, &until) == ETIMEDOUT &&
            s->submitted - s->completed >= g_fc.cfg.queue_depth)
            fc_fatal("the host waited %d s for room in a full launch queue (FAKECUDA_QUEUE_DEPTH="
                     "%u ops queued or running on one stream; its oldest: %s): on a GPU this "
                     "hangs",
                     FC_QUEUE_FULL_LIMIT_S, g_fc.cfg.queue_depth,
                     s->head && s->head->what ? s->head->what : "?");
}

CUresult fc_submit(fc_stream_t *s, fc_op_t *op, uint64_t *seq_out) {
    if (seq_out)
        *seq_out = 0;
    pthread_mutex_lock(&g_fc.lock);
    wait_queue_room(s);
    if (s->capture) {
        CUresult r = capture_op(s, op);
        pthread_mutex_unlock(&g_fc.lock);
        if (r != CUDA_SUCCESS)
            op_free(op);
        else
            FC_STAT(ops_captured, 1);
        return r;
    }
    CUresult rule = legacy_rule(s, op->what);
    if (rule != CUDA_SUCCESS) {
        pthread_mutex_unlock(&g_fc.lock);
        op_free(op);
        return rule;
    }
    if (implicit_deps(s, op) != 0) {
        pthread_mutex_unlock(&g_fc.lock);
        op_free(op);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    count_op(op);
    op->seq = ++s->submitted;
    if (g_fc.trace || g_fc.cfg.timing)
        op->queued_ns = fc_now_ns();
    if (op->on_submit)
        op->on_submit(op, s);
    if (s->tail)
        s->tail->next = op;
    else
        s->head = op;
    s->tail = op;
    if (seq_out)
        *seq_out = op->seq;
    if (!g_fc.cfg.threaded) {
        /* Inline: the op runs now, on the caller's thread, once it is at the head of its stream
         * and its dependencies have completed; with one thread they have. Another thread issuing
         * on the same stream (the legacy one, say) may still be running its op: waiting for it
         * keeps the stream's order. The op stays queued while it runs, as in a worker. */
        while (s->head != op || !deps_done(op))
            pthread_cond_wait(&g_fc.cv, &g_fc.lock);
        if (g_fc.cfg.timing)
            model_start(s, op);
        pthread_mutex_unlock(&g_fc.lock);
        CUresult r = atomic_load(&g_fc.sticky) != CUDA_SUCCESS ? CUDA_SUCCESS : execute(op);
        pthread_mutex_lock(&g_fc.lock);
        complete_head(s, op, r);
        pthread_mutex_unlock(&g_fc.lock);
        op_free(op);
        return CUDA_SUCCESS;
    }
    if (!s->has_thread) {
        if (pthread_create(&s->thread, NULL, worker, s) != 0) {
            /* The op is the only one queued: no thread ran the stream before. */
            s->head = s->tail = NULL;
            s->submitted--;
            pthread_mutex_unlock(&g_fc.lock);
            if (seq_out)
                *seq_out = 0;
            op_free(op);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        s->has_thread = 1;
        atomic_fetch_add(&streams_started, 1);
    }
    pthread_cond_signal(&s->cv);
    pthread_cond_broadcast(&g_fc.cv);
    pthread_mutex_unlock(&g_fc.lock);
    return CUDA_SUCCESS;
}

/* ---- the host's replies -------------------------------------------------------------------------
 * A host thread that waits for an op learns that it ended only when the simulator's thread
 * running it got there, which on 2 busy cores is often hundreds of microseconds after its
 * modelled end (the op then completes late, never early). What the host does in reply reaches
 * the device that much later, and where the device waits for the reply (a word in host memory
 * that a stream waits on, fc_memop.c), the simulator's lateness became the modelled device's
 * time: in a replay of `large` with the shim's remapping gate (OOC_REMAP_GATE=1), each gate's
 * wait ended 0.5-1 ms after the copy out it followed, of which the mapping thread's own work was
 * a third. So a blocking wait notes how late it learned of the op it waited for (the op's
 * completion past its modelled end), and a wait on memory that sees a value within
 * FC_HOST_LATE_WINDOW_NS of that ends that much earlier in the modelled clock: as if the host had
 * learned on time and replied after the same host-side work. Only the simulator's lateness is
 * taken out: the host's own time between learning and replying, and the operating system's
 * wake-up of the waiting thread, stay. A blocking wait for an op that had completed already
 * learned nothing late: a completion published after the noted one resets the lateness to 0. The
 * simulator cannot tell which thread wrote a word; it takes the latest blocking wait's. */
#define FC_HOST_LATE_WINDOW_NS 20000000ull

/* When (fc_now_ns) the op numbered seq of s completed (an op older than the ring holds: the
 * oldest it holds, no earlier). Caller holds g_fc.lock; the op has completed. */
static uint64_t wall_done_at(const fc_stream_t *s, uint64_t seq) {
    if (s->completed - seq >= FC_MODEL_RING)
        seq = s->completed - FC_MODEL_RING + 1;
    return s->done_wall_at[seq % FC_MODEL_RING];
}

uint64_t fc_host_late_ns(uint64_t now) {
    pthread_mutex_lock(&g_fc.lock);
    uint64_t late = g_fc.host_late_at && now - g_fc.host_late_at <= FC_HOST_LATE_WINDOW_NS
                        ? g_fc.host_late_ns
                        : 0;
    pthread_mutex_unlock(&g_fc.lock);
    return late;
}

CUresult fc_wait_seq(fc_stream_t *s, uint64_t seq) {
    pthread_mutex_lock(&g_fc.lock);
    int waited = 0;
    while (s->completed < seq) {
        waited = 1;
        pthread_cond_wait(&g_fc.cv, &g_fc.lock);
    }
    if (g_fc.cfg.timing && seq) {
        uint64_t now = fc_now_ns(), done = wall_done_at(s, seq), model = model_done_at(s, seq);
        if (waited) {
            g_fc.host_late_ns = done > model ? done - model : 0;
            g_fc.host_late_at = now;
        } else if (done > g_fc.host_late_at) { /* learned at once: nothing late to take out */
            g_fc.host_late_ns = 0;
            g_fc.host_late_at = now;
        }
    }
    pthread_mutex_unlock(&g_fc.lock);
    return atomic_load(&g_fc.sticky);
}

CUresult fc_sync_all(void) {
    pthread_mutex_lock(&g_fc.lock);
    for (fc_stream_t *t = g_fc.all_streams; t; t = t->all_next) {
        uint64_t target = t->submitted;
        while (t->completed < target)
            pthread_cond_wait(&g_fc.cv, &g_fc.lock);
    }
    pthread_mutex_unlock(&g_fc.lock);
    return atomic_load(&g_fc.sticky);
}

/* The op numbered seq on stream t if it is still queued (caller holds g_fc.lock). */
static fc_op_t *queued_op(const fc_stream_t *t, uint64_t seq) {
    for (fc_op_t *o = t->head; o; o = o->next)
        if (o->seq == seq)
            return o;
    return NULL;
}

/* FAKECUDA_REMAP_QUEUED: whether the queued op on stream t cannot start before the host does
 * something more: it, an op before it on t, or an op any of those waits for (through events,
 * transitively) is a wait on memory that does not hold now (fc_op_t.closed). Work that waits
 * only for other work could start at any moment, during an unmap and the map after it, as on a
 * GPU, where it would fault or reach the old memory. Caller holds g_fc.lock. */
/* Whether op references any of [lo, hi). */
static int op_refs(const fc_op_t *op, uintptr_t lo, uintptr_t hi) {
    for (unsigned i = 0; i < op->nrefs; i++)
        if (op->refs[i].lo < hi && lo < op->refs[i].hi)
            return 1;
    return 0;
}

static unsigned gated_visit; /* one check's mark (fc_op_t.visit), under g_fc.lock */

/* An op marked in this check (visit == gated_visit) was found open: not a closed wait, nor
 * waiting through its dependencies for one. Each op is looked at once per check. */
static int host_gated(const fc_stream_t *t, fc_op_t *op, int depth) {
    if (depth > 64)
        return 0;
    for (fc_op_t *o = t->head; o; o = o->next) {
        if (o->visit != gated_visit) {
            if (o->closed && o->closed(o))
                return 1;
            for (unsigned i = 0; i < o->ndeps; i++) {
                const fc_dep_t *d = &o->deps[i];
                fc_op_t *x = d->s->completed < d->seq ? queued_op(d->s, d->seq) : NULL;
                if (x && host_gated(d->s, x, depth + 1))
                    return 1;
            }
            o->visit = gated_visit;
        }
        if (o == op)
            break;
    }
    return 0;
}

/* FAKECUDA_REMAP_QUEUED=wait: a driver whose unmap waits until no work, queued or running,
 * references the range (one way to read the documentation's "synchronous"). Work that waits for
 * the host, which the unmapping thread was to write, never ends: the simulator stops the process
 * after FC_QUEUE_FULL_LIMIT_S naming the op, where such a driver would hang. */
void fc_unmap_wait(uintptr_t lo, uintptr_t hi, const char *what) {
    if (g_fc.cfg.remap_queued != 2)
        return;
    pthread_mutex_lock(&g_fc.lock);
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += FC_QUEUE_FULL_LIMIT_S;
    for (;;) {
        const fc_op_t *busy = NULL;
        for (fc_stream_t *t = g_fc.all_streams; t && !busy; t = t->all_next)
            for (fc_op_t *op = t->head; op && !busy; op = op->next)
                if (op_refs(op, lo, hi))
                    busy = op;
        if (!busy)
            break;
        if (pthread_cond_timedwait(&g_fc.cv, &g_fc.lock, &until) == ETIMEDOUT)
            fc_fatal("FAKECUDA_REMAP_QUEUED=wait: %s of [%#lx, %#lx) waited %d s for queued work "
                     "that references it (%s, seq %llu): on such a driver this hangs",
                     what, (unsigned long)lo, (unsigned long)hi, FC_QUEUE_FULL_LIMIT_S,
                     busy->what ? busy->what : "?", (unsigned long long)busy->seq);
    }
    pthread_mutex_unlock(&g_fc.lock);
}

int fc_strict_check(uintptr_t lo, uintptr_t hi, const char *what) {
    int conflicts = 0;
    /* FAKECUDA_REMAP_QUEUED=1: an unmap may pass queued work that waits for the host (see
     * fc_config_t and host_gated) */
    int gated_ok = g_fc.cfg.remap_queued && strcmp(what, "cuMemUnmap") == 0;
    pthread_mutex_lock(&g_fc.lock);
    gated_visit++;
    for (fc_stream_t *t = g_fc.all_streams; t; t = t->all_next) {
        int behind_gate = 0; /* everything after a gated op on its stream is gated too */
        for (fc_op_t *op = t->head; op; op = op->next) {
            if (behind_gate)
                break;
            if (gated_ok && !op->running && op_refs(op, lo, hi) && host_gated(t, op, 0)) {
                behind_gate = 1;
                continue;
            }
            for (unsigned i = 0; i < op->nrefs; i++) {
                if (op->refs[i].lo < hi && lo < op->refs[i].hi) {
                    if (conflicts++ == 0)
                        fc_warn("strict: %s of [%#lx, %#lx) while queued work (%s, seq %llu) "
                                "still references [%#lx, %#lx)",
                                what, (unsigned long)lo, (unsigned long)hi, op->what,
                                (unsigned long long)op->seq, (unsigned long)op->refs[i].lo,
                                (unsigned long)op->refs[i].hi);
                    break;
                }
            }
        }
    }
    pthread_mutex_unlock(&g_fc.lock);
    if (conflicts) {
        FC_STAT(strict_violations, 1);
        if (g_fc.cfg.strict)
            fc_fatal("strict mode: %s under queued work (FAKECUDA_STRICT=0 only counts it)", what);
    }
    return conflicts;
}

void fc_streams_shutdown(void) {
    pthread_mutex_lock(&g_fc.lock);
    for (fc_stream_t *t = g_fc.all_streams; t; t = t->all_next) {
        t->closing = 1;
        pthread_cond_signal(&t->cv);
    }
    pthread_cond_broadcast(&g_fc.cv);
    pthread_mutex_unlock(&g_fc.lock);
    for (fc_stream_t *t = g_fc.all_streams; t; t = t->all_next) {
        if (t->has_thread) {
            pthread_join(t->thread, NULL);
            t->has_thread = 0;
        }
    }
    pthread_mutex_lock(&g_fc.lock);
    fc_stream_t *t = g_fc.all_streams;
    g_fc.all_streams = NULL;
    g_fc.legacy = NULL;
    pthread_mutex_unlock(&g_fc.lock);
    while (t) {
        fc_stream_t *next = t->all_next;
        if (t->capture) {
            /* A capture the program never ended: its ops go with it. */
            fc_oplist_put(t->capture->list);
            free(t->capture->target_deps);
            free(t->capture);
            atomic_fetch_sub(&g_fc.captures, 1);
        }
        t->magic = 0;
        free(t);
        t = next;
    }
}

static CUresult stream_create(CUstream *out, unsigned flags, int priority) {
    if (!out || (flags & ~(unsigned)CU_STREAM_NON_BLOCKING))
        return CUDA_ERROR_INVALID_VALUE;
    fc_stream_t *s = stream_new(flags, priority);
    if (!s)
        return CUDA_ERROR_OUT_OF_MEMORY;
    FC_STAT(streams_live, 1);
    *out = s;
    return CUDA_SUCCESS;
}

static CUresult fc_stream_create(CUstream *out, unsigned int flags) {
    FC_ENTER("cuStreamCreate");
    return stream_create(out, flags, 0);
}
FC_EXPORT(cuStreamCreate, PFN_cuStreamCreate_v2000, fc_stream_create);

static CUresult fc_stream_create_prio(CUstream *out, unsigned int flags, int priority) {
    FC_ENTER("cuStreamCreateWithPriority");
    return stream_create(out, flags, priority);
}
FC_EXPORT(cuStreamCreateWithPriority, PFN_cuStreamCreateWithPriority_v5050, fc_stream_create_prio);

/* Returns at once; the worker finishes the queued work and then exits (as on the driver). */
static CUresult fc_stream_destroy(CUstream h) {
    FC_ENTER_("cuStreamDestroy", 1, 0);
    if (!h || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD || h->magic != FC_MAGIC_STREAM ||
        h->closing)
        return CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&g_fc.lock);
    h->closing = 1;
    pthread_cond_signal(&h->cv);
    pthread_cond_broadcast(&g_fc.cv);
    pthread_mutex_unlock(&g_fc.lock);
    FC_STAT(streams_live, -1);
    return CUDA_SUCCESS;
}
FC_EXPORT(cuStreamDestroy_v2, PFN_cuStreamDestroy_v4000, fc_stream_destroy);

static CUresult stream_sync(CUstream h, int ptds) {
    fc_stream_t *s = fc_stream_resolve(h, ptds);
    if (!s)
        return CUDA_ERROR_INVALID_HANDLE;
    CUresult c = fc_capture_refuse(s, "cuStreamSynchronize");
    if (c != CUDA_SUCCESS)
        return c;
    pthread_mutex_lock(&g_fc.lock);
    uint64_t target = s->submitted;
    pthread_mutex_unlock(&g_fc.lock);
    return fc_wait_seq(s, target);
}

static CUresult fc_stream_sync(CUstream h) {
    FC_ENTER("cuStreamSynchronize");
    return stream_sync(h, 0);
}
FC_EXPORT(cuStreamSynchronize, PFN_cuStreamSynchronize_v2000, fc_stream_sync);

static CUresult fc_stream_sync_ptsz(CUstream h) {
    FC_ENTER("cuStreamSynchronize");
    return stream_sync(h, 1);
}
FC_EXPORT(cuStreamSynchronize_ptsz, PFN_cuStreamSynchronize_v7000_ptsz, fc_stream_sync_ptsz);

static CUresult stream_query(CUstream h, int ptds) {
    fc_stream_t *s = fc_stream_resolve(h, ptds);
    if (!s)
        return CUDA_ERROR_INVALID_HANDLE;
    CUresult c = fc_capture_refuse(s, "cuStreamQuery");
    if (c != CUDA_SUCCESS)
        return c;
    pthread_mutex_lock(&g_fc.lock);
    int done = s->completed == s->submitted;
    pthread_mutex_unlock(&g_fc.lock);
    return done ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

static CUresult fc_stream_query(CUstream h) {
    FC_ENTER("cuStreamQuery");
    return stream_query(h, 0);
}
FC_EXPORT(cuStreamQuery, PFN_cuStreamQuery_v2000, fc_stream_query);

static CUresult fc_stream_query_ptsz(CUstream h) {
    FC_ENTER("cuStreamQuery");
    return stream_query(h, 1);
}
FC_EXPORT(cuStreamQuery_ptsz, PFN_cuStreamQuery_v7000_ptsz, fc_stream_query_ptsz);

static CUresult stream_flags(CUstream h, unsigned int *flags, int ptds) {
    fc_stream_t *s = fc_stream_resolve(h, ptds);
    if (!s || !flags)
        return s ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_INVALID_HANDLE;
    *flags = s->flags;
    return CUDA_SUCCESS;
}

static CUresult fc_stream_flags(CUstream h, unsigned int *flags) {
    FC_ENTER("cuStreamGetFlags");
    return stream_flags(h, flags, 0);
}
FC_EXPORT(cuStreamGetFlags, PFN_cuStreamGetFlags_v5050, fc_stream_flags);

static CUresult fc_stream_flags_ptsz(CUstream h, unsigned int *flags) {
    FC_ENTER("cuStreamGetFlags");
    return stream_flags(h, flags, 1);
}
FC_EXPORT(cuStreamGetFlags_ptsz, PFN_cuStreamGetFlags_v7000_ptsz, fc_stream_flags_ptsz);

/* ---- events ------------------------------------------------------------------------------------
 */

typedef struct CUevent_st fc_event_t;

static void event_put(fc_event_t *e) {
    /* Caller holds g_fc.lock. */
    if (--e->refs == 0) {
        e->magic = 0;
        free(e);
    }
}

static CUresult run_event(fc_op_t *op) {
    fc_event_t *e = op->payload;
    /* With the timing model, the event's time is the device's: its modelled start. */
    uint64_t now = g_fc.cfg.timing ? op->model_start_ns : fc_now_ns();
    pthread_mutex_lock(&g_fc.lock);
    if (e->seq == op->seq && e->stream)
        e->t_ns = now;
    pthread_mutex_unlock(&g_fc.lock);
    return CUDA_SUCCESS;
}

static void dispose_event(fc_op_t *op) {
    pthread_mutex_lock(&g_fc.lock);
    event_put(op->payload);
    pthread_mutex_unlock(&g_fc.lock);
}

/* Runs under g_fc.lock in fc_submit, once the record's sequence number is known. */
static void event_on_submit(fc_op_t *op, fc_stream_t *s) {
    fc_event_t *e = op->payload;
    e->stream = s;
    e->seq = op->seq;
    e->t_ns = 0;
}

static CUresult fc_event_create(CUevent *out, unsigned int flags) {
    FC_ENTER("cuEventCreate");
    if (!out || (flags & ~(unsigned)(CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING |
                                     CU_EVENT_INTERPROCESS)))
        return CUDA_ERROR_INVALID_VALUE;
    fc_event_t *e = calloc(1, sizeof *e);
    if (!e)
        return CUDA_ERROR_OUT_OF_MEMORY;
    e->magic = FC_MAGIC_EVENT;
    e->flags = flags;
    e->refs = 1;
    FC_STAT(events_live, 1);
    *out = e;
    return CUDA_SUCCESS;
}
FC_EXPORT(cuEventCreate, PFN_cuEventCreate_v2000, fc_event_create);

static int event_ok(CUevent e) {
    return e && e->magic == FC_MAGIC_EVENT && !e->destroyed;
}

/* Records e on the stream: e completes when the work queued before it has. The stream and seq
 * are set in fc_submit, under the lock, so a later wait sees exactly this record. */
static CUresult event_record(CUevent e, CUstream h, int ptds) {
    if (!event_ok(e))
        return CUDA_ERROR_INVALID_HANDLE;
    fc_stream_t *s = fc_stream_resolve(h, ptds);
    if (!s)
        return CUDA_ERROR_INVALID_HANDLE;
    fc_op_t *op = fc_op_new("event record", run_event, e, dispose_event);
    if (!op)
        return CUDA_ERROR_OUT_OF_MEMORY;
    op->instant = 1;
    op->on_submit = event_on_submit;
    pthread_mutex_lock(&g_fc.lock);
    e->refs++;
    pthread_mutex_unlock(&g_fc.lock);
    /* Not capturable (no event nodes, no cross-stream capture): fc_submit refuses it. */
    return fc_submit(s, op, NULL);
}

static CUresult fc_event_record(CUevent e, CUstream s) {
    FC_ENTER("cuEventRecord");
    return event_record(e, s, 0);
}
FC_EXPORT(cuEventRecord, PFN_cuEventRecord_v2000, fc_event_record);

static CUresult fc_event_record_ptsz(CUevent e, CUstream s) {
    FC_ENTER("cuEventRecord");
    return event_record(e, s, 1);
}
FC_EXPORT(cuEventRecord_ptsz, PFN_cuEventRecord_v7000_ptsz, fc_event_record_ptsz);

static CUresult fc_event_record_flags(CUevent e, CUstream s, unsigned int flags) {
    FC_ENTER("cuEventRecordWithFlags");
    if (flags & ~(unsigned)CU_EVENT_RECORD_EXTERNAL)
        return CUDA_ERROR_INVALID_VALUE;
    return event_record(e, s, 0);
}
FC_EXPORT(cuEventRecordWithFlags, PFN_cuEventRecordWithFlags_v11010, fc_event_record_flags);

static CUresult fc_event_record_flags_ptsz(CUevent e, CUstream s, unsigned int flags) {
    FC_ENTER("cuEventRecordWithFlags");
    if (flags & ~(unsigned)CU_EVENT_RECORD_EXTERNAL)
        return CUDA_ERROR_INVALID_VALUE;
    return event_record(e, s, 1);
}
FC_EXPORT(cuEventRecordWithFlags_ptsz, PFN_cuEventRecordWithFlags_v11010_ptsz,
          fc_event_record_flags_ptsz);

/* Caller holds g_fc.lock. */
static int event_done(const fc_event_t *e) {
    return !e->stream || e->stream->completed >= e->seq;
}

static CUresult fc_event_query(CUevent e) {
    FC_ENTER("cuEventQuery");
    if (!event_ok(e))
        return CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&g_fc.lock);
    int done = event_done(e);
    pthread_mutex_unlock(&g_fc.lock);
    return done ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}
FC_EXPORT(cuEventQuery, PFN_cuEventQuery_v2000, fc_event_query);

static CUresult fc_event_sync(CUevent e) {
    FC_ENTER("cuEventSynchronize");
    if (!event_ok(e))
        return CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&g_fc.lock);
    fc_stream_t *s = e->stream;
    uint64_t seq = e->seq;
    pthread_mutex_unlock(&g_fc.lock);
    return s ? fc_wait_seq(s, seq) : CUDA_SUCCESS;
}
FC_EXPORT(cuEventSynchronize, PFN_cuEventSynchronize_v2000, fc_event_sync);

static CUresult event_elapsed(float *ms, CUevent a, CUevent b) {
    if (!ms)
        return CUDA_ERROR_INVALID_VALUE;
    if (!event_ok(a) || !event_ok(b))
        return CUDA_ERROR_INVALID_HANDLE;
    if ((a->flags | b->flags) & CU_EVENT_DISABLE_TIMING)
        return CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&g_fc.lock);
    CUresult r = CUDA_SUCCESS;
    if (!a->stream || !b->stream)
        r = CUDA_ERROR_INVALID_HANDLE;
    else if (!event_done(a) || !event_done(b))
        r = CUDA_ERROR_NOT_READY;
    else
        *ms = (float)(((double)b->t_ns - (double)a->t_ns) / 1e6);
    pthread_mutex_unlock(&g_fc.lock);
    return r;
}

static CUresult fc_event_elapsed(float *ms, CUevent a, CUevent b) {
    FC_ENTER("cuEventElapsedTime");
    return event_elapsed(ms, a, b);
}
FC_EXPORT(cuEventElapsedTime, PFN_cuEventElapsedTime_v2000, fc_event_elapsed);

static CUresult fc_event_elapsed_v2(float *ms, CUevent a, CUevent b) {
    FC_ENTER("cuEventElapsedTime");
    return event_elapsed(ms, a, b);
}
FC_EXPORT(cuEventElapsedTime_v2, PFN_cuEventElapsedTime_v12080, fc_event_elapsed_v2);

static CUresult fc_event_destroy(CUevent e) {
    FC_ENTER_("cuEventDestroy", 1, 0);
    if (!event_ok(e))
        return CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&g_fc.lock);
    e->destroyed = 1;
    event_put(e);
    pthread_mutex_unlock(&g_fc.lock);
    FC_STAT(events_live, -1);
    return CUDA_SUCCESS;
}
FC_EXPORT(cuEventDestroy_v2, PFN_cuEventDestroy_v4000, fc_event_destroy);

/* ---- waits and host functions -----------------------------------------------------------------
 */

static CUresult run_nop(fc_op_t *op) {
    (void)op;
    return CUDA_SUCCESS;
}

/* The wait op depends on the event's last record as it stands now (a later record of the same
 * event does not move it), exactly as cuStreamWaitEvent captures it. */
static CUresult stream_wait(CUstream h, CUevent e, unsigned int flags, int ptds) {
    if (flags & ~(unsigned)CU_EVENT_WAIT_EXTERNAL)
        return CUDA_ERROR_INVALID_VALUE;
    if (!event_ok(e))
        return CUDA_ERROR_INVALID_HANDLE;
    fc_stream_t *s = fc_stream_resolve(h, ptds);
    if (!s)
        return CUDA_ERROR_INVALID_HANDLE;
    fc_op_t *op = fc_op_new("stream wait", run_nop, NULL, NULL);
    if (!op)
        return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&g_fc.lock);
    int rc = e->stream ? op_dep(op, e->stream, e->seq) : 0;
    pthread_mutex_unlock(&g_fc.lock);
    if (rc != 0) {
        op_free(op);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    /* Not capturable (a capture cannot join another stream's work): fc_submit refuses it. */
    return fc_submit(s, op, NULL);
}

static CUresult fc_stream_wait(CUstream h, CUevent e, unsigned int flags) {
    FC_ENTER("cuStreamWaitEvent");
    return stream_wait(h, e, flags, 0);
}
FC_EXPORT(cuStreamWaitEvent, PFN_cuStreamWaitEvent_v3020, fc_stream_wait);

static CUresult fc_stream_wait_ptsz(CUstream h, CUevent e, unsigned int flags) {
    FC_ENTER("cuStreamWaitEvent");
    return stream_wait(h, e, flags, 1);
}
FC_EXPORT(cuStreamWaitEvent_ptsz, PFN_cuStreamWaitEvent_v7000_ptsz, fc_stream_wait_ptsz);

typedef struct host_fn {
    CUhostFn fn;
    CUstreamCallback cb;
    CUstream stream;
    void *data;
} host_fn_t;

static CUresult run_host_fn(fc_op_t *op) {
    host_fn_t *h = op->payload;
    if (h->fn)
        h->fn(h->data);
    else
        h->cb(h->stream, CUDA_SUCCESS, h->data);
    return CUDA_SUCCESS;
}

static void dispose_payload(fc_op_t *op) {
    free(op->payload);
}

static int clone_host_fn(fc_op_t *dst, const fc_op_t *src) {
    host_fn_t *p = malloc(sizeof *p);
    if (!p)
        return -1;
    *p = *(const host_fn_t *)src->payload;
    dst->payload = p;
    return 0;
}

static CUresult host_func(CUstream h, CUhostFn fn, CUstreamCallback cb, void *data, int ptds) {
    if (!fn && !cb)
        return CUDA_ERROR_INVALID_VALUE;
    fc_stream_t *s = fc_stream_resolve(h, ptds);
    if (!s)
        return CUDA_ERROR_INVALID_HANDLE;
    host_fn_t *p = malloc(sizeof *p);
    if (!p)
        return CUDA_ERROR_OUT_OF_MEMORY;
    p->fn = fn;
    p->cb = cb;
    p->stream = h;
    p->data = data;
    fc_op_t *op = fc_op_new("host function", run_host_fn, p, dispose_payload);
    if (!op) {
        free(p);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    op->clone = clone_host_fn; /* a host node when captured */
    return fc_submit(s, op, NULL);
}

static CUresult fc_host_func(CUstream h, CUhostFn fn, void *data) {
    FC_ENTER("cuLaunchHostFunc");
    return host_func(h, fn, NULL, data, 0);
}
FC_EXPORT(cuLaunchHostFunc, PFN_cuLaunchHostFunc_v10000, fc_host_func);

static CUresult fc_host_func_ptsz(CUstream h, CUhostFn fn, void *data) {
    FC_ENTER("cuLaunchHostFunc");
    return host_func(h, fn, NULL, data, 1);
}
FC_EXPORT(cuLaunchHostFunc_ptsz, PFN_cuLaunchHostFunc_v10000_ptsz, fc_host_func_ptsz);

static CUresult fc_add_callback(CUstream h, CUstreamCallback cb, void *data, unsigned int flags) {
    FC_ENTER("cuStreamAddCallback");
    if (flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    return host_func(h, NULL, cb, data, 0);
}
FC_EXPORT(cuStreamAddCallback, PFN_cuStreamAddCallback_v5000, fc_add_callback);

static CUresult fc_add_callback_ptsz(CUstream h, CUstreamCallback cb, void *data,
                                     unsigned int flags) {
    FC_ENTER("cuStreamAddCallback");
    if (flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    return host_func(h, NULL, cb, data, 1);
}
FC_EXPORT(cuStreamAddCallback_ptsz, PFN_cuStreamAddCallback_v7000_ptsz, fc_add_callback_ptsz);
