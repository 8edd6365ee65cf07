/* SPDX-License-Identifier: MIT */
/* graph.c: CUDA graphs made by stream capture: what a captured graph touches, so that each
 * cuGraphLaunch can make it resident like any other operation.
 *
 * While a stream captures, the driver records its operations into a graph instead of running
 * them, so the shim must not make anything resident for them (nothing runs yet, and a capture
 * must not synchronise). Instead the hook of each launch, copy or set notes the op's access set
 * (the same queries launch.c and the copy hooks find for a running op) in the capture's list.
 * At cuStreamEndCapture the list, sorted and without duplicates, belongs to the CUgraph; at
 * instantiation each CUgraphExec gets its own copy (an executable graph outlives its graph); both
 * go at their destroy. A cuGraphLaunch is then one operation whose access set is the union of
 * the graph's queries, made resident with ooc_mem_begin/ooc_mem_end around the real launch on
 * the launch stream, so the next op that needs the memory waits for the whole graph.
 *
 * One access set holds OOC_MAX_REFS queries. A larger union is resolved to the buffers live at
 * launch time, identical buffers merged and buffers that follow each other exactly in the
 * address space merged into one range (residency walks a range buffer by buffer); if more than
 * OOC_MAX_REFS remain, the launch fails with CUDA_ERROR_OUT_OF_MEMORY and a log line, never
 * with a reference dropped. Graphs built with the explicit node API are learned node by node
 * (below); a capture into an existing graph (cuStreamBeginCaptureToGraph) adds what it touches to
 * that graph's list. A graph the shim learned nothing of (built only of nodes it does not learn)
 * is launched with a warning and nothing made resident:
 * its accesses are like those through pointers stored in device memory (safe mode).
 *
 * Which streams capture: the captures the shim saw begin, at most MAX_CAPTURES at once (per
 * stream handle; a per-thread default stream per thread). ooc_graph_captures counts them, so an
 * op pays one relaxed atomic load when none is in progress; otherwise its stream is looked up,
 * and for a stream in the set the real driver is asked (cuStreamIsCapturing), because a capture
 * can end where the shim does not see it.
 *
 * Locking: graph_lock guards everything here. The hooks hold it (ooc_graph_lock) across the real
 * call that begins or ends a capture, or creates or destroys a graph or executable graph, so that
 * a handle the driver reuses is never confused with the one it replaced and a capture is tracked
 * from the moment it exists. It is never held across an operation's own real call. */
#include "shim.h"

#include <stdlib.h>
#include <string.h>

#define uthash_nonfatal_oom(obj) (graph_oom = 1)
static int graph_oom;
#include <uthash.h>

#define MAX_CAPTURES 64
#define COMPACT_MIN  1024 /* queries a capture holds before it removes duplicates as it grows */

/* A growing list of queries. */
typedef struct qlist {
    ooc_query_t *q;
    size_t n, cap;
    size_t compact_n; /* n after the last removal of duplicates */
} qlist_t;

typedef struct capture {
    int used;
    CUstream stream;  /* CU_STREAM_PER_THREAD for a thread's per-thread default stream */
    pthread_t thread; /* that thread */
    CUgraph into;     /* cuStreamBeginCaptureToGraph's graph, else NULL */
    qlist_t list;
} capture_t;

struct tracked;

/* The queries of one node: of a graph, learned from the node calls (its entry also in the table
 * of all such nodes, `nodes`, found by handle alone as cuGraph*NodeSetParams name no graph); or
 * of an executable graph, given new parameters since instantiation. */
typedef struct override {
    CUgraphNode node;
    qlist_t list;
    struct tracked *graph; /* a graph's node: its graph's entry; NULL for an executable graph's */
    UT_hash_handle hh;
    UT_hash_handle hh_node; /* in `nodes` (a graph's node only) */
} override_t;

/* A graph or an executable graph and the queries of its ops. */
typedef struct tracked {
    void *handle;
    qlist_t list;     /* graphs: what captures and child graphs added; executable graphs: all */
    override_t *over; /* graphs: nodes learned one by one; executable graphs: nodes updated */
    UT_hash_handle hh;
} tracked_t;

_Atomic unsigned ooc_graph_captures;

static pthread_mutex_t graph_lock = PTHREAD_MUTEX_INITIALIZER;
static capture_t captures[MAX_CAPTURES];
static tracked_t *graphs, *execs;
static override_t *nodes; /* every graph's learned nodes, by handle */

void ooc_graph_lock(void) {
    pthread_mutex_lock(&graph_lock);
}

void ooc_graph_unlock(void) {
    pthread_mutex_unlock(&graph_lock);
}

/* ---- query lists ----------------------------------------------------------------------------- */

static int query_cmp(const void *a, const void *b) {
    const ooc_query_t *x = a, *y = b;
    if (x->lo != y->lo)
        return x->lo < y->lo ? -1 : 1;
    if (x->hi != y->hi)
        return x->hi < y->hi ? -1 : 1;
    return 0;
}

/* Sorts the list and merges identical queries (their uses combined). Always safe: residency and
 * the recorder treat two equal queries exactly as one. */
static void qlist_compact(qlist_t *l) {
    if (l->n > 1) {
        qsort(l->q, l->n, sizeof *l->q, query_cmp);
        size_t k = 0;
        for (size_t i = 1; i < l->n; i++) {
            if (l->q[i].lo == l->q[k].lo && l->q[i].hi == l->q[k].hi)
                l->q[k].use |= l->q[i].use;
            else
                l->q[++k] = l->q[i];
        }
        l->n = k + 1;
    }
    l->compact_n = l->n;
}

/* Appends n queries; returns 0 or OOC_ENOMEM (the list is unchanged). */
static int qlist_add(qlist_t *l, const ooc_query_t *q, size_t n) {
    if (n == 0)
        return 0;
    if (l->n + n > l->cap) {
        size_t nc = l->cap ? l->cap : 64;
        while (nc < l->n + n)
            nc *= 2;
        ooc_query_t *p = realloc(l->q, nc * sizeof *p);
        if (!p)
            return OOC_ENOMEM;
        l->q = p;
        l->cap = nc;
    }
    memcpy(l->q + l->n, q, n * sizeof *q);
    l->n += n;
    /* A long capture repeats the same buffers: keep the list near its number of distinct
     * queries (amortised O(log n) per query). */
    if (l->n >= COMPACT_MIN && l->n >= 2 * l->compact_n)
        qlist_compact(l);
    return 0;
}

static int qlist_copy(qlist_t *dst, const qlist_t *src) {
    memset(dst, 0, sizeof *dst);
    if (src->n == 0)
        return 0;
    dst->q = malloc(src->n * sizeof *dst->q);
    if (!dst->q)
        return OOC_ENOMEM;
    memcpy(dst->q, src->q, src->n * sizeof *dst->q);
    dst->n = dst->cap = dst->compact_n = src->n;
    return 0;
}

static void qlist_free(qlist_t *l) {
    free(l->q);
    memset(l, 0, sizeof *l);
}

/* ---- graphs and executable graphs ------------------------------------------------------------ */

static tracked_t *tracked_find(tracked_t *table, const void *handle) {
    tracked_t *t;
    HASH_FIND_PTR(table, &handle, t);
    return t;
}

/* Removes node entry o from its table (and from `nodes`, for a graph's node) and frees it. */
static void override_free(tracked_t *t, override_t *o) {
    HASH_DEL(t->over, o);
    if (o->graph)
        HASH_DELETE(hh_node, nodes, o);
    qlist_free(&o->list);
    free(o);
}

/* Frees the node entries of a graph's or an executable graph's entry. */
static void overrides_free(tracked_t *t) {
    override_t *o, *tmp;
    HASH_ITER(hh, t->over, o, tmp) {
        override_free(t, o);
    }
}

/* A copy of everything t's graph touches: its list and each node's. 0 or OOC_ENOMEM (*out
 * empty). */
static int queries_copy(qlist_t *out, const tracked_t *t) {
    int rc = qlist_copy(out, &t->list);
    for (const override_t *o = t->over; o && rc == 0; o = o->hh.next)
        rc = qlist_add(out, o->list.q, o->list.n);
    if (rc != 0)
        qlist_free(out);
    return rc;
}

/* Removes and frees the entry of handle, if any. Caller holds graph_lock. */
static void tracked_forget(tracked_t **table, const void *handle) {
    tracked_t *t = tracked_find(*table, handle);
    if (!t)
        return;
    HASH_DEL(*table, t);
    qlist_free(&t->list);
    overrides_free(t);
    free(t);
}

/* Records handle with the list (taken over on success). Returns 0 or OOC_ENOMEM. Caller holds
 * graph_lock. */
static int tracked_add(tracked_t **table, void *handle, qlist_t *list) {
    tracked_t *t = calloc(1, sizeof *t);
    if (!t)
        return OOC_ENOMEM;
    tracked_forget(table, handle); /* a stale entry of a handle the driver reused */
    t->handle = handle;
    graph_oom = 0;
    HASH_ADD_PTR(*table, handle, t);
    if (graph_oom) {
        free(t);
        return OOC_ENOMEM;
    }
    t->list = *list;
    memset(list, 0, sizeof *list);
    return 0;
}

/* ---- captures -------------------------------------------------------------------------------- */

/* The key of a stream in the capture set: NULL for the legacy stream (which never captures). */
static CUstream stream_key(CUstream s, int per_thread) {
    if (s == CU_STREAM_PER_THREAD || (s == NULL && per_thread))
        return CU_STREAM_PER_THREAD;
    if (s == CU_STREAM_LEGACY)
        return NULL;
    return s;
}

/* The capture of key, or a free slot when `free_slot` is set and there is none. Caller holds
 * graph_lock. */
static capture_t *capture_find(CUstream key, int free_slot) {
    capture_t *empty = NULL;
    pthread_t self = pthread_self();
    for (unsigned i = 0; i < MAX_CAPTURES; i++) {
        capture_t *c = &captures[i];
        if (!c->used) {
            if (!empty)
                empty = c;
            continue;
        }
        if (c->stream == key && (key != CU_STREAM_PER_THREAD || pthread_equal(c->thread, self)))
            return c;
    }
    return free_slot ? empty : NULL;
}

static void capture_drop(capture_t *c) {
    qlist_free(&c->list);
    c->used = 0;
    atomic_fetch_sub_explicit(&ooc_graph_captures, 1, memory_order_relaxed);
}

/* Does the real driver say the stream of key captures? *status is its answer. */
static CUresult real_status(CUstream key, CUstreamCaptureStatus *status) {
    *status = CU_STREAM_CAPTURE_STATUS_NONE;
    if (!ooc_real.cuStreamIsCapturing)
        return CUDA_ERROR_NOT_SUPPORTED;
    return ooc_real.cuStreamIsCapturing(key, status);
}

CUresult ooc_graph_capture_room(CUstream stream, int per_thread) {
    CUstream key = stream_key(stream, per_thread);
    if (!key || capture_find(key, 1))
        return CUDA_SUCCESS; /* the legacy stream: the driver refuses it itself */
    OOC_LOG_E("cuStreamBeginCapture: %d stream captures are in progress, the most the shim can "
              "follow at once",
              MAX_CAPTURES);
    return CUDA_ERROR_OUT_OF_MEMORY;
}

void ooc_graph_capture_started(CUstream stream, int per_thread, CUgraph into) {
    CUstream key = stream_key(stream, per_thread);
    capture_t *c = key ? capture_find(key, 1) : NULL;
    if (!c)
        return; /* ooc_graph_capture_room said there was room */
    if (c->used) {
        /* The stream's earlier capture ended where the shim did not see it. */
        qlist_free(&c->list);
    } else {
        c->used = 1;
        c->stream = key;
        c->thread = pthread_self();
        atomic_fetch_add_explicit(&ooc_graph_captures, 1, memory_order_relaxed);
    }
    c->into = into;
}

CUresult ooc_graph_capture_note(const ooc_access_t *a, CUstream stream, int per_thread,
                                int *capturing) {
    *capturing = 0;
    CUstream key = stream_key(stream, per_thread);
    if (!key)
        return CUDA_SUCCESS;
    pthread_mutex_lock(&graph_lock);
    capture_t *c = capture_find(key, 0);
    if (!c) {
        pthread_mutex_unlock(&graph_lock);
        return CUDA_SUCCESS;
    }
    CUstreamCaptureStatus st;
    CUresult r = real_status(key, &st);
    if (r != CUDA_SUCCESS) {
        /* Not knowing whether the op would run or be captured, it is not issued. */
        pthread_mutex_unlock(&graph_lock);
        OOC_LOG_E("cuStreamIsCapturing failed (%s): an operation on stream %p, whose capture the "
                  "shim follows, is not issued",
                  ooc_real_errname(r), (void *)stream);
        return r;
    }
    if (st == CU_STREAM_CAPTURE_STATUS_NONE) {
        capture_drop(c); /* ended where the shim did not see it */
        pthread_mutex_unlock(&graph_lock);
        return CUDA_SUCCESS;
    }
    /* Active or invalidated: the driver captures the op, or refuses it; it does not run. */
    if (a && a->overflow) {
        pthread_mutex_unlock(&graph_lock);
        OOC_LOG_E("an operation captured on stream %p references more than %d buffers; the shim "
                  "could not make them all resident when the graph is launched",
                  (void *)stream, OOC_MAX_REFS);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (a && qlist_add(&c->list, a->refs, a->n) != 0) {
        pthread_mutex_unlock(&graph_lock);
        OOC_LOG_E("out of host memory noting what an operation captured on stream %p touches; "
                  "it is not captured",
                  (void *)stream);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *capturing = 1;
    pthread_mutex_unlock(&graph_lock);
    return CUDA_SUCCESS;
}

static tracked_t *graph_entry(CUgraph g);

CUresult ooc_graph_capture_ended(CUstream stream, int per_thread, CUresult r, CUgraph *graph) {
    CUstream key = stream_key(stream, per_thread);
    capture_t *c = key ? capture_find(key, 0) : NULL;
    if (!c)
        return r;
    CUstreamCaptureStatus st;
    if (real_status(key, &st) == CUDA_SUCCESS && st != CU_STREAM_CAPTURE_STATUS_NONE)
        return r; /* not ended (called from the wrong thread, say): still followed */
    qlist_t list = c->list;
    CUgraph into = c->into;
    memset(&c->list, 0, sizeof c->list);
    capture_drop(c);
    if (r != CUDA_SUCCESS || !graph || !*graph) {
        qlist_free(&list);
        return r;
    }
    qlist_compact(&list);
    if (into) {
        /* Appended to a graph that may already hold learned nodes: added to them. */
        tracked_t *t = graph_entry(into);
        int rc = t ? qlist_add(&t->list, list.q, list.n) : OOC_ENOMEM;
        qlist_free(&list);
        if (rc == 0)
            return r;
        OOC_LOG_E("out of host memory recording what a capture into graph %p touches; its "
                  "launches would not make all of it resident",
                  (void *)into);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (tracked_add(&graphs, *graph, &list) != 0) {
        qlist_free(&list);
        ooc_real.cuGraphDestroy(*graph);
        *graph = NULL;
        OOC_LOG_E("out of host memory recording what a captured graph touches; the graph is "
                  "destroyed");
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    return r;
}

CUresult ooc_graph_instantiated(CUgraph graph, CUgraphExec exec) {
    tracked_t *g = tracked_find(graphs, graph);
    if (!g) {
        tracked_forget(&execs, exec); /* not captured under the shim's eyes: launched as is */
        return CUDA_SUCCESS;
    }
    qlist_t copy;
    if (queries_copy(&copy, g) != 0 || tracked_add(&execs, exec, &copy) != 0) {
        qlist_free(&copy);
        ooc_real.cuGraphExecDestroy(exec);
        OOC_LOG_E("out of host memory recording what a graph touches; the executable graph is "
                  "destroyed");
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    return CUDA_SUCCESS;
}

void ooc_graph_destroyed(CUgraph graph) {
    tracked_forget(&graphs, graph);
}

void ooc_graph_exec_destroyed(CUgraphExec exec) {
    tracked_forget(&execs, exec);
}

/* ---- graphs built node by node ------------------------------------------------------------
 *
 * A graph built with the explicit API (as XLA builds its command buffers) is learned node by
 * node: the hooks of cuGraphAddKernelNode, cuGraphAddMemcpyNode, cuGraphAddMemsetNode and
 * cuGraphAddChildGraphNode, and of cuGraphAddNode for nodes of those four types, hand the node's
 * access set here after the driver added it. A kernel, memcpy or memset node keeps its own
 * queries (an override_t of the graph's entry, also in `nodes`), so that new parameters given
 * to it in its graph (cuGraphKernelNodeSetParams, cuGraphMemcpyNodeSetParams,
 * cuGraphMemsetNodeSetParams, cuGraphNodeSetParams) replace them; executable graphs
 * instantiated earlier keep their copies, as the driver's keep their parameters. A child graph's
 * queries, all of them, are copied into its parent's list. A node the shim did not see added (a
 * captured one) given new parameters is not learned, with a warning: what it touched before stays
 * in its graph's list, but the shim does not know which graph that is.
 *
 * cuGraphExecKernelNodeSetParams, cuGraphExecMemcpyNodeSetParams,
 * cuGraphExecMemsetNodeSetParams and cuGraphExecNodeSetParams give a node of an executable graph
 * new parameters: its new queries replace those of its earlier updates (the queries of the
 * parameters it was instantiated with stay, which can only make more resident). A successful
 * cuGraphExecUpdate gives every node of an executable graph the parameters of the source
 * graph's: the executable graph's queries become a copy of that graph's, its node updates dropped
 * (below). Nodes of other types (host, event and conditional nodes), and new parameters of a
 * child-graph node, are not learned: see README. */

/* The entry of graph g, made empty if there is none. Caller holds graph_lock. */
static tracked_t *graph_entry(CUgraph g) {
    tracked_t *t = tracked_find(graphs, g);
    if (t)
        return t;
    qlist_t empty = {0};
    return tracked_add(&graphs, g, &empty) == 0 ? tracked_find(graphs, g) : NULL;
}

/* Logs why what a node touches could not be kept; returns CUDA_ERROR_OUT_OF_MEMORY. */
static CUresult node_lost(const ooc_access_t *a, int rc) {
    OOC_LOG_E("%s: %s; the graph's launches would not make all of it resident",
              a && a->name ? a->name : "a graph node",
              rc ? "out of host memory" : "more buffers than one operation holds");
    return CUDA_ERROR_OUT_OF_MEMORY;
}

/* The entry of node `node` in t's table, made empty if there is none (for a graph's node, also
 * entered in `nodes`); NULL out of memory. Caller holds graph_lock. */
static override_t *override_entry(tracked_t *t, CUgraphNode node, int graph) {
    override_t *o;
    HASH_FIND_PTR(t->over, &node, o);
    if (o)
        return o;
    if (graph) {
        HASH_FIND(hh_node, nodes, &node, sizeof node, o);
        if (o)
            override_free(o->graph, o); /* a node destroyed behind the shim: its handle reused */
    }
    if (!(o = calloc(1, sizeof *o)))
        return NULL;
    o->node = node;
    graph_oom = 0;
    HASH_ADD_PTR(t->over, node, o);
    if (!graph_oom && graph) {
        HASH_ADD(hh_node, nodes, node, sizeof node, o);
        if (graph_oom)
            HASH_DEL(t->over, o);
        else
            o->graph = t;
    }
    if (graph_oom) {
        free(o);
        return NULL;
    }
    return o;
}

/* Replaces the queries of o by a's (none when a is NULL), in a list of their size (a graph may
 * have many nodes). 0 or OOC_ENOMEM (o then touches nothing). */
static int override_set(override_t *o, const ooc_access_t *a) {
    o->list.n = o->list.compact_n = 0;
    if (!a || a->n == 0)
        return 0;
    if (o->list.cap < a->n) {
        ooc_query_t *q = realloc(o->list.q, a->n * sizeof *q);
        if (!q)
            return OOC_ENOMEM;
        o->list.q = q;
        o->list.cap = a->n;
    }
    memcpy(o->list.q, a->refs, a->n * sizeof *o->list.q);
    o->list.n = o->list.compact_n = a->n;
    return 0;
}

CUresult ooc_graph_node_added(CUgraph g, CUgraphNode node, const ooc_access_t *a) {
    pthread_mutex_lock(&graph_lock);
    tracked_t *t = graph_entry(g);
    override_t *o = t ? override_entry(t, node, 1) : NULL;
    int rc = o ? override_set(o, a) : OOC_ENOMEM;
    pthread_mutex_unlock(&graph_lock);
    return rc != 0 || (a && a->overflow) ? node_lost(a, rc) : CUDA_SUCCESS;
}

CUresult ooc_graph_node_params(CUgraphNode node, const ooc_access_t *a) {
    pthread_mutex_lock(&graph_lock);
    override_t *o;
    HASH_FIND(hh_node, nodes, &node, sizeof node, o);
    int rc = o ? override_set(o, a) : 0;
    pthread_mutex_unlock(&graph_lock);
    if (!o) {
        OOC_LOG_W("%s: node %p was not added under the shim's eyes (captured, or of a graph it "
                  "does not follow): its new parameters are not learned",
                  a && a->name ? a->name : "cuGraphNodeSetParams", (void *)node);
        return CUDA_SUCCESS;
    }
    return rc != 0 || (a && a->overflow) ? node_lost(a, rc) : CUDA_SUCCESS;
}

CUresult ooc_graph_child_added(CUgraph g, CUgraph child) {
    pthread_mutex_lock(&graph_lock);
    tracked_t *c = tracked_find(graphs, child);
    int rc = 0;
    qlist_t q = {0};
    if (c && (rc = queries_copy(&q, c)) == 0 && q.n) {
        tracked_t *t = graph_entry(g);
        rc = t ? qlist_add(&t->list, q.q, q.n) : OOC_ENOMEM;
    }
    qlist_free(&q);
    pthread_mutex_unlock(&graph_lock);
    if (rc != 0) {
        OOC_LOG_E("cuGraphAddChildGraphNode: out of host memory");
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    return CUDA_SUCCESS;
}

CUresult ooc_graph_exec_node_params(CUgraphExec e, CUgraphNode node, const ooc_access_t *a) {
    pthread_mutex_lock(&graph_lock);
    tracked_t *t = tracked_find(execs, e);
    override_t *o = t ? override_entry(t, node, 0) : NULL;
    int rc = !t ? 0 : o ? override_set(o, a) : OOC_ENOMEM; /* the earlier update is replaced */
    pthread_mutex_unlock(&graph_lock);
    return rc != 0 || (a && a->overflow) ? node_lost(a, rc) : CUDA_SUCCESS;
}

/* ---- executable graphs updated from a graph ------------------------------------------------ */

struct ooc_graph_update {
    tracked_t *t; /* the entry exec gets, its handle not yet set; NULL: exec is unlearned */
};

CUresult ooc_graph_update_prepare(CUgraph graph, ooc_graph_update_t **u) {
    tracked_t *g = tracked_find(graphs, graph);
    ooc_graph_update_t *v = calloc(1, sizeof *v);
    int rc = v ? 0 : OOC_ENOMEM;
    if (v && g) {
        v->t = calloc(1, sizeof *v->t);
        rc = v->t ? queries_copy(&v->t->list, g) : OOC_ENOMEM;
        if (rc != 0) {
            free(v->t);
            free(v);
        }
    }
    *u = rc == 0 ? v : NULL;
    if (rc == 0)
        return CUDA_SUCCESS;
    OOC_LOG_E("cuGraphExecUpdate: out of host memory copying what graph %p touches; the executable "
              "graph is not updated",
              (void *)graph);
    return CUDA_ERROR_OUT_OF_MEMORY;
}

void ooc_graph_update_done(ooc_graph_update_t *u, CUgraphExec exec, CUresult r) {
    tracked_t *t = u->t;
    free(u);
    if (r != CUDA_SUCCESS) {
        if (t)
            qlist_free(&t->list);
        free(t);
        return;
    }
    /* Every node now has the source graph's parameters: what exec learned at instantiation and
     * from cuGraphExecKernelNodeSetParams no longer holds. An entry exec already has takes the
     * new queries in place (no allocation that could fail after the driver updated). */
    tracked_t *old = tracked_find(execs, exec);
    if (old && t) {
        qlist_free(&old->list);
        old->list = t->list;
        free(t);
        overrides_free(old);
        return;
    }
    tracked_forget(&execs, exec);
    if (!t)
        return;
    t->handle = exec;
    graph_oom = 0;
    HASH_ADD_PTR(execs, handle, t);
    if (graph_oom) {
        qlist_free(&t->list);
        free(t);
        OOC_LOG_E("cuGraphExecUpdate: out of host memory recording what executable graph %p "
                  "touches now; its launches will make nothing resident",
                  (void *)exec);
    }
}

/* ---- launches -------------------------------------------------------------------------------- */

typedef struct span {
    uintptr_t lo, hi;
    unsigned use;
} span_t;

static int span_cmp(const void *a, const void *b) {
    const span_t *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* Merges spans that follow each other exactly (b.lo == a.hi): with the same use only, or any
 * (uses combined) when `any`. Returns the new count. */
static size_t spans_merge(span_t *s, size_t n, int any) {
    if (n == 0)
        return 0;
    size_t k = 0;
    for (size_t i = 1; i < n; i++) {
        if (s[i].lo == s[k].hi && (any || s[i].use == s[k].use)) {
            s[k].hi = s[i].hi;
            s[k].use |= s[i].use;
        } else {
            s[++k] = s[i];
        }
    }
    return k + 1;
}

typedef struct spans {
    span_t *s;
    size_t n, cap;
} spans_t;

/* Adds buffer [base, base + size) as query q uses it. 0, or -1 out of memory. */
static int span_add(spans_t *v, const ooc_query_t *q, uintptr_t base, size_t size) {
    if (v->n == v->cap) {
        span_t *ns = realloc(v->s, 2 * v->cap * sizeof *ns);
        if (!ns)
            return -1;
        v->s = ns;
        v->cap *= 2;
    }
    unsigned use = q->use;
    /* A write of part of a buffer keeps the rest: read-write, as the recorder says. */
    if (use == OOC_USE_W && q->hi > q->lo && (q->lo > base || q->hi < base + size))
        use = OOC_USE_RW;
    v->s[v->n++] = (span_t){base, base + size, use};
    return 0;
}

/* Resolves queries to the buffers live now, as ooc_mem_begin would walk them, and merges them
 * until they fit an access set. Returns CUDA_SUCCESS with a->refs filled, or OUT_OF_MEMORY. */
static CUresult resolve(const ooc_query_t *q, size_t nq, ooc_access_t *a) {
    spans_t v = {.cap = nq + 16};
    v.s = malloc(v.cap * sizeof *v.s);
    if (!v.s)
        return CUDA_ERROR_OUT_OF_MEMORY;
    for (size_t i = 0; i < nq; i++) {
        uintptr_t base[2];
        size_t size[2];
        int bad = 0;
        if (q[i].hi == q[i].lo) {
            /* A word: the buffer containing it and the one ending there (an end pointer). */
            unsigned nw = ooc_mem_lookup_word(q[i].lo, base, size);
            for (unsigned k = 0; k < nw && !bad; k++)
                bad = span_add(&v, &q[i], base[k], size[k]);
        } else {
            for (uintptr_t p = q[i].lo;
                 !bad && p < q[i].hi && ooc_mem_lookup(p, &base[0], &size[0]) == 0;
                 p = base[0] + size[0])
                bad = span_add(&v, &q[i], base[0], size[0]);
        }
        if (bad) {
            free(v.s);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    span_t *s = v.s;
    size_t n = v.n;
    qsort(s, n, sizeof *s, span_cmp);
    size_t k = 0;
    for (size_t i = 1; i < n; i++) {
        if (s[i].lo == s[k].lo)
            s[k].use |= s[i].use; /* the same buffer */
        else
            s[++k] = s[i];
    }
    n = n ? k + 1 : 0;
    size_t buffers = n;
    n = spans_merge(s, n, 0);
    if (n > OOC_MAX_REFS)
        n = spans_merge(s, n, 1);
    if (n > OOC_MAX_REFS) {
        free(s);
        OOC_LOG_E("cuGraphLaunch: the graph references %zu buffers (%zu after merging those "
                  "adjacent in memory); the shim can make at most %d ranges resident for one "
                  "launch",
                  buffers, n, OOC_MAX_REFS);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    for (size_t i = 0; i < n; i++)
        a->refs[i] = (ooc_query_t){.lo = s[i].lo, .hi = s[i].hi, .use = s[i].use};
    a->n = (unsigned)n;
    free(s);
    return CUDA_SUCCESS;
}

CUresult ooc_graph_launch_access(CUgraphExec exec, ooc_access_t *a) {
    pthread_mutex_lock(&graph_lock);
    tracked_t *t = tracked_find(execs, exec);
    if (!t) {
        pthread_mutex_unlock(&graph_lock);
        ooc_stats_add(OOC_STAT_graph_launches_unseen, 1);
        ooc_shadow_forget_all(); /* it may write anything */
        OOC_LOG_W("cuGraphLaunch of executable graph %p, which was not instantiated from a "
                  "stream capture the shim followed: what it touches is not made resident",
                  (void *)exec);
        return CUDA_SUCCESS;
    }
    if (t->list.n <= OOC_MAX_REFS && !t->over) {
        if (t->list.n)
            memcpy(a->refs, t->list.q, t->list.n * sizeof *a->refs);
        a->n = (unsigned)t->list.n;
        pthread_mutex_unlock(&graph_lock);
        return CUDA_SUCCESS;
    }
    qlist_t copy;
    int rc = qlist_copy(&copy, &t->list);
    for (override_t *o = t->over; o && rc == 0; o = o->hh.next)
        rc = qlist_add(&copy, o->list.q, o->list.n);
    pthread_mutex_unlock(&graph_lock);
    if (rc != 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = resolve(copy.q, copy.n, a);
    qlist_free(&copy);
    return r;
}
