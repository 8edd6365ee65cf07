/* SPDX-License-Identifier: MIT */
/* fc_graph.c: simulated CUDA graphs: stream capture (cuStreamBeginCapture, both ABIs, and
 * cuStreamBeginCaptureToGraph; cuStreamEndCapture, cuStreamIsCapturing), instantiation (every
 * ABI), exec updates of kernel, memcpy and memset nodes (fc_graph_exec_set, the entry points in
 * fc_graphnode.c; cuGraphExecKernelNodeSetParams, both ABIs, here) and of whole
 * graphs of the same topology (cuGraphExecUpdate, both ABIs), cuGraphLaunch, cuGraphExecDestroy
 * and cuGraphDestroy, with their per-thread-stream variants. The explicit graph API XLA builds its
 * command buffers with (cuGraphCreate, the node calls, dependencies, cuGraphGetNodes,
 * cuGraphNodeGetType) is in fc_graphnode.c; fc_graph.h is what the two share.
 *
 * A graph is a set of nodes with dependencies on earlier nodes. A node holds the op it runs (a
 * template: fc_op_t.clone makes a runnable copy), or a child graph (its own deep copy, as
 * cuGraphAddChildGraphNode makes), or nothing (an empty node). Capture appends the captured ops
 * as a chain of nodes, to a new graph or (cuStreamBeginCaptureToGraph) to an existing one after
 * the given dependencies. What a capture of several branches would need (an event record or a
 * wait on a capturing stream: fork and join) is refused with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
 * and invalidates the capture, and so is everything a capture cannot take on the driver either
 * (fc_stream.c): a synchronous wait, pageable memory, the legacy stream while a blocking stream
 * captures, and, while a capture in global mode is in progress, cuMemAlloc, cuMemAllocPitch,
 * cuMemFree and cuCtxSynchronize. Graph memory nodes (cuMemAllocAsync/cuMemFreeAsync in a
 * capture) are not simulated and refused the same way.
 *
 * Instantiation orders the nodes topologically (among nodes ready together, the one created
 * first), flattens child graphs in place, and gives the executable graph its own copy of every
 * op: later changes to the graph do not reach it, an exec update of a node changes only it (a
 * kernel, memcpy or memset node of the graph it came from, not inside a child graph). It also keeps
 * the graph's topology (node types and dependencies), against which cuGraphExecUpdate checks a
 * graph before it makes every op anew from that graph's nodes. A dependency cycle fails
 * instantiation with CUDA_ERROR_INVALID_VALUE. cuGraphLaunch queues on the launch stream, in that
 * order, a fresh copy of every op, so a launched graph is ordinary work: its kernels and copies
 * check their memory when they run (memory unmapped since the graph was built faults with a
 * sticky CUDA_ERROR_ILLEGAL_ADDRESS), strict mode sees their references (a kernel's are found
 * again at launch), the timing model times them and the statistics count them. Running the
 * nodes one after another is one of the orders the dependencies allow. Each launch of an
 * executable graph runs after its previous launch, as on the driver. A graph launched into a
 * capturing stream is captured as its ops (the child graph, flattened).
 *
 * Locking: capture state is guarded by g_fc.lock; graphs are not thread-safe (as on the driver:
 * the caller serialises calls on one graph); an executable graph's mutex orders its launches and
 * updates. */
#include "fc_graph.h"

#include <stdlib.h>
#include <string.h>

#define FC_MAGIC_GEXEC 0x47455845u

/* Where an executable graph's op came from: the node of the instantiated graph (compared, never
 * read: the graph may be gone; NULL inside a child graph), its type and its shape as instantiated
 * or last updated. */
typedef struct exec_origin {
    const fc_node_t *node;
    CUgraphNodeType type;
    fc_dims_t dims;
} exec_origin_t;

struct CUgraphExec_st {
    uint32_t magic;
    fc_op_t **ops;         /* templates, in launch order */
    exec_origin_t *origin; /* the node each op came from, for exec updates of nodes */
    size_t n;
    struct CUgraph_st *shape; /* the topology it was instantiated with, for cuGraphExecUpdate */
    pthread_mutex_t lock;
    fc_stream_t *last_s; /* where its previous launch's last op was queued */
    uint64_t last_seq;
};

static uint64_t capture_ids; /* guarded by g_fc.lock */

/* ---- op lists -------------------------------------------------------------------------------- */

static fc_oplist_t *oplist_new(void) {
    fc_oplist_t *l = calloc(1, sizeof *l);
    if (l)
        l->refs = 1;
    return l;
}

void fc_oplist_put(fc_oplist_t *l) {
    pthread_mutex_lock(&g_fc.lock);
    int last = --l->refs == 0;
    pthread_mutex_unlock(&g_fc.lock);
    if (!last)
        return;
    for (size_t i = 0; i < l->n; i++)
        fc_op_free(l->ops[i]);
    free(l->ops);
    free(l);
}

/* A new op that runs captured op t once: t's kind, timing and statistics, its own payload. */
static fc_op_t *op_clone(const fc_op_t *t) {
    fc_op_t *op = fc_op_new(t->what, t->run, NULL, t->dispose);
    if (!op)
        return NULL;
    op->engine = t->engine;
    op->model_ns = t->model_ns;
    op->on_submit = t->on_submit;
    op->clone = t->clone;
    op->relocate = t->relocate;
    op->n_kernels = t->n_kernels;
    op->n_memcpys = t->n_memcpys;
    op->n_memsets = t->n_memsets;
    op->b_h2d = t->b_h2d;
    op->b_d2h = t->b_d2h;
    op->b_d2d = t->b_d2d;
    if (t->clone(op, t) != 0) {
        op->dispose = NULL; /* no payload to dispose of */
        fc_op_free(op);
        return NULL;
    }
    return op;
}

/* ---- graphs and nodes ------------------------------------------------------------------------ */

static struct CUgraphExec_st *exec_of(CUgraphExec e) {
    return (e && e->magic == FC_MAGIC_GEXEC) ? e : NULL;
}

/* A new empty graph; a shape is one an executable graph keeps, not a graph the program holds. */
static fc_graph_t *graph_alloc(int shape) {
    fc_graph_t *g = calloc(1, sizeof *g);
    if (!g)
        return NULL;
    g->magic = FC_MAGIC_GRAPH;
    g->shape = shape;
    if (!shape)
        FC_STAT(graphs_live, 1);
    return g;
}

fc_graph_t *fc_graph_new(void) {
    return graph_alloc(0);
}

static void node_free(fc_node_t *n) {
    if (n->op)
        fc_op_free(n->op);
    if (n->child)
        fc_graph_free(n->child);
    free(n->deps);
    n->magic = 0;
    free(n);
}

void fc_graph_free(fc_graph_t *g) {
    for (size_t i = 0; i < g->n; i++)
        node_free(g->nodes[i]);
    free(g->nodes);
    g->magic = 0;
    if (!g->shape)
        FC_STAT(graphs_live, -1);
    free(g);
}

/* Checks a dependency list for a new node of g: each a node of g, none twice. */
CUresult fc_graph_check_deps(fc_graph_t *g, const CUgraphNode *deps, size_t n) {
    if (n && !deps)
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < n; i++) {
        fc_node_t *d = node_of(deps[i]);
        if (!d || d->g != g)
            return CUDA_ERROR_INVALID_VALUE;
        for (size_t j = 0; j < i; j++)
            if (deps[j] == deps[i])
                return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

/* Adds a node to g after the (checked) dependencies; takes ownership of op and child, also on
 * failure. Returns the node or NULL (out of memory). */
fc_node_t *fc_graph_node_add(fc_graph_t *g, CUgraphNodeType type, fc_op_t *op, fc_graph_t *child,
                             const CUgraphNode *deps, size_t ndeps) {
    fc_node_t *n = calloc(1, sizeof *n);
    fc_node_t **d = n && ndeps ? malloc(ndeps * sizeof *d) : NULL;
    if (g->n == g->cap && n && (d || !ndeps)) {
        size_t nc = g->cap ? g->cap * 2 : 16;
        fc_node_t **nn = realloc(g->nodes, nc * sizeof *nn);
        if (nn) {
            g->nodes = nn;
            g->cap = nc;
        }
    }
    if (!n || (ndeps && !d) || g->n == g->cap) {
        free(n);
        free(d);
        if (op)
            fc_op_free(op);
        if (child)
            fc_graph_free(child);
        return NULL;
    }
    n->magic = FC_MAGIC_GNODE;
    n->g = g;
    n->type = type;
    n->op = op;
    n->child = child;
    if (ndeps)
        memcpy(d, deps, ndeps * sizeof *d);
    n->deps = d;
    n->ndeps = ndeps;
    n->idx = g->n;
    g->nodes[g->n++] = n;
    return n;
}

/* A node's type for a captured op, by what it does. */
static CUgraphNodeType op_type(const fc_op_t *op) {
    return op->n_kernels   ? CU_GRAPH_NODE_TYPE_KERNEL
           : op->n_memcpys ? CU_GRAPH_NODE_TYPE_MEMCPY
           : op->n_memsets ? CU_GRAPH_NODE_TYPE_MEMSET
                           : CU_GRAPH_NODE_TYPE_HOST;
}

/* A deep copy of g (each op a fresh template), for a child-graph node; or, when `shape`, of its
 * nodes' types and dependencies only. NULL when out of memory. */
static fc_graph_t *graph_copy(const fc_graph_t *g, int shape) {
    fc_graph_t *c = graph_alloc(shape);
    if (!c)
        return NULL;
    /* The nodes first, then their dependencies: an edge added later (cuGraphAddDependencies) may
     * come from a node created after the one it leads to. */
    for (size_t i = 0; i < g->n; i++) {
        const fc_node_t *s = g->nodes[i];
        fc_op_t *op = s->op && !shape ? op_clone(s->op) : NULL;
        fc_graph_t *child = s->child ? graph_copy(s->child, shape) : NULL;
        if ((s->op && !shape && !op) || (s->child && !child)) {
            if (op)
                fc_op_free(op);
            if (child)
                fc_graph_free(child);
            fc_graph_free(c);
            return NULL;
        }
        if (!fc_graph_node_add(c, s->type, op, child, NULL, 0)) {
            fc_graph_free(c);
            return NULL;
        }
    }
    for (size_t i = 0; i < g->n; i++) {
        const fc_node_t *s = g->nodes[i];
        fc_node_t *n = c->nodes[i];
        if (!s->ndeps)
            continue;
        if (!(n->deps = malloc(s->ndeps * sizeof *n->deps))) {
            fc_graph_free(c);
            return NULL;
        }
        for (size_t k = 0; k < s->ndeps; k++)
            n->deps[k] = c->nodes[s->deps[k]->idx];
        n->ndeps = s->ndeps;
    }
    return c;
}

fc_graph_t *fc_graph_clone(const fc_graph_t *g) {
    return graph_copy(g, 0);
}

/* ---- capture --------------------------------------------------------------------------------- */

void fc_capture_invalidate(fc_stream_t *s, const char *why) {
    fc_capture_t *c = s->capture;
    if (c->invalidated)
        return;
    c->invalidated = 1;
    fc_warn("stream capture %llu invalidated: %s is not allowed while a stream captures",
            (unsigned long long)c->id, why);
}

static int is_legacy(CUstream h, int ptds) {
    return h == CU_STREAM_LEGACY || (h == NULL && !ptds);
}

/* Begins a capture on the stream of h: into a new graph (target NULL), or appended to target
 * after the nodes deps[0..ndeps) (checked by the caller). */
static CUresult begin_capture(CUstream h, int ptds, CUstreamCaptureMode mode, fc_graph_t *target,
                              const CUgraphNode *deps, size_t ndeps) {
    if (mode != CU_STREAM_CAPTURE_MODE_GLOBAL && mode != CU_STREAM_CAPTURE_MODE_THREAD_LOCAL &&
        mode != CU_STREAM_CAPTURE_MODE_RELAXED)
        return CUDA_ERROR_INVALID_VALUE;
    if (is_legacy(h, ptds))
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED; /* as documented for CU_STREAM_LEGACY */
    fc_stream_t *s = fc_stream_resolve(h, ptds);
    if (!s)
        return CUDA_ERROR_INVALID_HANDLE;
    fc_capture_t *c = calloc(1, sizeof *c);
    fc_oplist_t *l = c ? oplist_new() : NULL;
    fc_node_t **d = l && ndeps ? malloc(ndeps * sizeof *d) : NULL;
    if (!l || (ndeps && !d)) {
        free(l);
        free(c);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (ndeps)
        memcpy(d, deps, ndeps * sizeof *d);
    c->mode = mode;
    c->thread = pthread_self();
    c->list = l;
    c->target = target;
    c->target_deps = d;
    c->ntarget_deps = ndeps;
    pthread_mutex_lock(&g_fc.lock);
    if (s->capture) {
        pthread_mutex_unlock(&g_fc.lock);
        free(d);
        free(l);
        free(c);
        return CUDA_ERROR_ILLEGAL_STATE;
    }
    c->id = ++capture_ids;
    s->capture = c;
    atomic_fetch_add(&g_fc.captures, 1);
    pthread_mutex_unlock(&g_fc.lock);
    return CUDA_SUCCESS;
}

/* Ends the capture: its ops become a chain of nodes (the first after the capture's dependencies)
 * of a new graph, or of the graph cuStreamBeginCaptureToGraph named. */
static CUresult end_capture(CUstream h, int ptds, CUgraph *out) {
    if (!out)
        return CUDA_ERROR_INVALID_VALUE;
    if (is_legacy(h, ptds))
        return CUDA_ERROR_STREAM_CAPTURE_UNMATCHED;
    fc_stream_t *s = fc_stream_resolve(h, ptds);
    if (!s)
        return CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&g_fc.lock);
    fc_capture_t *c = s->capture;
    if (!c) {
        pthread_mutex_unlock(&g_fc.lock);
        return CUDA_ERROR_STREAM_CAPTURE_UNMATCHED;
    }
    if (c->mode != CU_STREAM_CAPTURE_MODE_RELAXED && !pthread_equal(c->thread, pthread_self())) {
        pthread_mutex_unlock(&g_fc.lock);
        return CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD;
    }
    s->capture = NULL;
    atomic_fetch_sub(&g_fc.captures, 1);
    pthread_mutex_unlock(&g_fc.lock);
    *out = NULL;
    fc_oplist_t *l = c->list;
    fc_graph_t *target = c->target, *g = NULL;
    fc_node_t **deps = c->target_deps;
    size_t ndeps = c->ntarget_deps;
    CUresult r = CUDA_SUCCESS;
    if (c->invalidated)
        r = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    else if (!(g = target ? target : fc_graph_new()))
        r = CUDA_ERROR_OUT_OF_MEMORY;
    free(c);
    fc_node_t *last = NULL;
    size_t nops = l->n;
    for (size_t i = 0; r == CUDA_SUCCESS && i < nops; i++) {
        fc_op_t *op = l->ops[i];
        l->ops[i] = NULL; /* the node owns it now (fc_graph_node_add frees it on failure) */
        last = i == 0 ? fc_graph_node_add(g, op_type(op), op, NULL, deps, ndeps)
                      : fc_graph_node_add(g, op_type(op), op, NULL, &last, 1);
        if (!last)
            r = CUDA_ERROR_OUT_OF_MEMORY;
    }
    free(deps);
    for (size_t i = 0; i < nops; i++)
        if (l->ops[i])
            fc_op_free(l->ops[i]); /* not turned into nodes: invalidated, or after a failure */
    l->n = 0;
    fc_oplist_put(l);
    if (r != CUDA_SUCCESS) {
        if (g && !target)
            fc_graph_free(g);
        return r;
    }
    *out = g;
    return CUDA_SUCCESS;
}

static CUresult is_capturing(CUstream h, int ptds, CUstreamCaptureStatus *st) {
    if (!st)
        return CUDA_ERROR_INVALID_VALUE;
    if (is_legacy(h, ptds)) {
        /* As documented: asking about the legacy stream while a blocking stream captures is an
         * error, which does not invalidate that capture. */
        CUresult r = CUDA_SUCCESS;
        pthread_mutex_lock(&g_fc.lock);
        for (fc_stream_t *t = g_fc.all_streams; t; t = t->all_next)
            if (t->capture && !(t->flags & CU_STREAM_NON_BLOCKING))
                r = CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
        pthread_mutex_unlock(&g_fc.lock);
        if (r == CUDA_SUCCESS)
            *st = CU_STREAM_CAPTURE_STATUS_NONE;
        return r;
    }
    fc_stream_t *s = fc_stream_resolve(h, ptds);
    if (!s)
        return CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&g_fc.lock);
    fc_capture_t *c = s->capture;
    *st = !c               ? CU_STREAM_CAPTURE_STATUS_NONE
          : c->invalidated ? CU_STREAM_CAPTURE_STATUS_INVALIDATED
                           : CU_STREAM_CAPTURE_STATUS_ACTIVE;
    pthread_mutex_unlock(&g_fc.lock);
    return CUDA_SUCCESS;
}

static CUresult fc_begin_capture_v1(CUstream h) {
    FC_ENTER("cuStreamBeginCapture");
    return begin_capture(h, 0, CU_STREAM_CAPTURE_MODE_GLOBAL, NULL, NULL, 0);
}
FC_EXPORT(cuStreamBeginCapture, PFN_cuStreamBeginCapture_v10000, fc_begin_capture_v1);

static CUresult fc_begin_capture_v1_ptsz(CUstream h) {
    FC_ENTER("cuStreamBeginCapture");
    return begin_capture(h, 1, CU_STREAM_CAPTURE_MODE_GLOBAL, NULL, NULL, 0);
}
FC_EXPORT(cuStreamBeginCapture_ptsz, PFN_cuStreamBeginCapture_v10000_ptsz,
          fc_begin_capture_v1_ptsz);

static CUresult fc_begin_capture(CUstream h, CUstreamCaptureMode mode) {
    FC_ENTER("cuStreamBeginCapture");
    return begin_capture(h, 0, mode, NULL, NULL, 0);
}
FC_EXPORT(cuStreamBeginCapture_v2, PFN_cuStreamBeginCapture_v10010, fc_begin_capture);

static CUresult fc_begin_capture_ptsz(CUstream h, CUstreamCaptureMode mode) {
    FC_ENTER("cuStreamBeginCapture");
    return begin_capture(h, 1, mode, NULL, NULL, 0);
}
FC_EXPORT(cuStreamBeginCapture_v2_ptsz, PFN_cuStreamBeginCapture_v10010_ptsz,
          fc_begin_capture_ptsz);

static CUresult fc_end_capture(CUstream h, CUgraph *g) {
    FC_ENTER("cuStreamEndCapture");
    return end_capture(h, 0, g);
}
FC_EXPORT(cuStreamEndCapture, PFN_cuStreamEndCapture_v10000, fc_end_capture);

static CUresult fc_end_capture_ptsz(CUstream h, CUgraph *g) {
    FC_ENTER("cuStreamEndCapture");
    return end_capture(h, 1, g);
}
FC_EXPORT(cuStreamEndCapture_ptsz, PFN_cuStreamEndCapture_v10000_ptsz, fc_end_capture_ptsz);

static CUresult fc_is_capturing(CUstream h, CUstreamCaptureStatus *st) {
    FC_ENTER("cuStreamIsCapturing");
    return is_capturing(h, 0, st);
}
FC_EXPORT(cuStreamIsCapturing, PFN_cuStreamIsCapturing_v10000, fc_is_capturing);

static CUresult fc_is_capturing_ptsz(CUstream h, CUstreamCaptureStatus *st) {
    FC_ENTER("cuStreamIsCapturing");
    return is_capturing(h, 1, st);
}
FC_EXPORT(cuStreamIsCapturing_ptsz, PFN_cuStreamIsCapturing_v10000_ptsz, fc_is_capturing_ptsz);

/* ---- instantiation --------------------------------------------------------------------------- */

/* Flags a linear graph of kernels, copies and sets can honour (device launch it cannot). */
#define INSTANTIATE_FLAGS                                                                          \
    ((unsigned long long)(CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH |                        \
                          CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY))

/* Appends a template copy of each op of g to e, in a topological order (among ready nodes the
 * one created first), child graphs flattened in place. `top`: g is the instantiated graph, whose
 * kernel nodes exec updates may name. Returns CUDA_SUCCESS, CUDA_ERROR_INVALID_VALUE (a cycle) or
 * CUDA_ERROR_OUT_OF_MEMORY. */
static CUresult flatten(struct CUgraphExec_st *e, const fc_graph_t *g, int top) {
    unsigned char *done = calloc(g->n ? g->n : 1, 1);
    if (!done)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = CUDA_SUCCESS;
    for (size_t emitted = 0; emitted < g->n && r == CUDA_SUCCESS; emitted++) {
        const fc_node_t *next = NULL;
        for (size_t i = 0; i < g->n && !next; i++) {
            const fc_node_t *n = g->nodes[i];
            int ready = !done[i];
            for (size_t k = 0; k < n->ndeps && ready; k++)
                ready = done[n->deps[k]->idx];
            if (ready)
                next = n;
        }
        if (!next) {
            r = CUDA_ERROR_INVALID_VALUE; /* a dependency cycle */
            break;
        }
        done[next->idx] = 1;
        if (next->child) {
            r = flatten(e, next->child, 0);
        } else if (next->op) {
            fc_op_t **ops = realloc(e->ops, (e->n + 1) * sizeof *ops);
            if (ops)
                e->ops = ops;
            exec_origin_t *origin = ops ? realloc(e->origin, (e->n + 1) * sizeof *origin) : NULL;
            if (origin)
                e->origin = origin;
            fc_op_t *op = origin ? op_clone(next->op) : NULL;
            if (!op) {
                r = CUDA_ERROR_OUT_OF_MEMORY;
                break;
            }
            e->ops[e->n] = op;
            e->origin[e->n] = (exec_origin_t){top ? next : NULL, next->type, next->dims};
            e->n++;
        }
    }
    free(done);
    return r;
}

static void exec_free(struct CUgraphExec_st *e) {
    for (size_t i = 0; i < e->n; i++)
        fc_op_free(e->ops[i]);
    free(e->ops);
    free(e->origin);
    if (e->shape)
        fc_graph_free(e->shape);
    pthread_mutex_destroy(&e->lock);
    e->magic = 0;
    free(e);
}

/* Flags a graph of kernels, copies and sets can honour (device launch it cannot). */
#define INSTANTIATE_FLAGS                                                                          \
    ((unsigned long long)(CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH |                        \
                          CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY))

static CUresult instantiate(CUgraphExec *out, CUgraph hg, unsigned long long flags) {
    if (!out)
        return CUDA_ERROR_INVALID_VALUE;
    fc_graph_t *g = graph_of(hg);
    if (!g || (flags & ~INSTANTIATE_FLAGS))
        return CUDA_ERROR_INVALID_VALUE;
    struct CUgraphExec_st *e = calloc(1, sizeof *e);
    if (!e)
        return CUDA_ERROR_OUT_OF_MEMORY;
    e->magic = FC_MAGIC_GEXEC;
    pthread_mutex_init(&e->lock, NULL);
    CUresult r = flatten(e, g, 1);
    if (r == CUDA_SUCCESS && !(e->shape = graph_copy(g, 1)))
        r = CUDA_ERROR_OUT_OF_MEMORY;
    if (r != CUDA_SUCCESS) {
        exec_free(e);
        return r;
    }
    FC_STAT(graph_execs_live, 1);
    *out = e;
    return CUDA_SUCCESS;
}

/* The 5-argument ABI of CUDA 10 and 11 (cuGraphInstantiate, cuGraphInstantiate_v2). */
static CUresult instantiate_legacy(CUgraphExec *out, CUgraph g, CUgraphNode *err_node, char *log,
                                   size_t log_size) {
    if (err_node)
        *err_node = NULL;
    if (log && log_size)
        log[0] = '\0';
    return instantiate(out, g, 0);
}

static CUresult fc_instantiate_v1(CUgraphExec *out, CUgraph g, CUgraphNode *err, char *log,
                                  size_t n) {
    FC_ENTER("cuGraphInstantiate");
    return instantiate_legacy(out, g, err, log, n);
}
FC_EXPORT(cuGraphInstantiate, PFN_cuGraphInstantiate_v10000, fc_instantiate_v1);

static CUresult fc_instantiate_v2(CUgraphExec *out, CUgraph g, CUgraphNode *err, char *log,
                                  size_t n) {
    FC_ENTER("cuGraphInstantiate");
    return instantiate_legacy(out, g, err, log, n);
}
FC_EXPORT(cuGraphInstantiate_v2, PFN_cuGraphInstantiate_v11000, fc_instantiate_v2);

/* cuGetProcAddress answers "cuGraphInstantiate" from CUDA 12.0 on with this one. */
static CUresult fc_instantiate_flags(CUgraphExec *out, CUgraph g, unsigned long long flags) {
    FC_ENTER("cuGraphInstantiateWithFlags");
    return instantiate(out, g, flags);
}
FC_EXPORT(cuGraphInstantiateWithFlags, PFN_cuGraphInstantiateWithFlags_v11040,
          fc_instantiate_flags);

static CUresult instantiate_params(CUgraphExec *out, CUgraph g, CUDA_GRAPH_INSTANTIATE_PARAMS *p,
                                   int ptds) {
    if (!p)
        return CUDA_ERROR_INVALID_VALUE;
    unsigned long long flags = p->flags;
    if (flags & CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD) {
        /* Nothing to upload on the simulated device; the stream must still be valid. */
        if (!fc_stream_resolve(p->hUploadStream, ptds))
            return CUDA_ERROR_INVALID_HANDLE;
        flags &= ~(unsigned long long)CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD;
    }
    CUresult r = instantiate(out, g, flags);
    p->hErrNode_out = NULL;
    p->result_out =
        r == CUDA_SUCCESS ? CUDA_GRAPH_INSTANTIATE_SUCCESS : CUDA_GRAPH_INSTANTIATE_ERROR;
    return r;
}

static CUresult fc_instantiate_params(CUgraphExec *out, CUgraph g,
                                      CUDA_GRAPH_INSTANTIATE_PARAMS *p) {
    FC_ENTER("cuGraphInstantiateWithParams");
    return instantiate_params(out, g, p, 0);
}
FC_EXPORT(cuGraphInstantiateWithParams, PFN_cuGraphInstantiateWithParams_v12000,
          fc_instantiate_params);

static CUresult fc_instantiate_params_ptsz(CUgraphExec *out, CUgraph g,
                                           CUDA_GRAPH_INSTANTIATE_PARAMS *p) {
    FC_ENTER("cuGraphInstantiateWithParams");
    return instantiate_params(out, g, p, 1);
}
FC_EXPORT(cuGraphInstantiateWithParams_ptsz, PFN_cuGraphInstantiateWithParams_v12000_ptsz,
          fc_instantiate_params_ptsz);

/* ---- launch and destruction ------------------------------------------------------------------ */

/* Queues a copy of each captured op on s, in order, after the exec's previous launch. An op that
 * cannot be queued stops the launch there (the ops before it stay queued, as a partial launch
 * would on a device that ran out of memory mid-way). */
/* Queues a copy of each op on s, in order, after the exec's previous launch. An op that cannot be
 * queued stops the launch there (the ops before it stay queued, as a partial launch would on a
 * device that ran out of memory mid-way). */
static CUresult launch(CUgraphExec he, CUstream h, int ptds) {
    struct CUgraphExec_st *e = exec_of(he);
    if (!e)
        return CUDA_ERROR_INVALID_HANDLE;
    fc_stream_t *s = fc_stream_resolve(h, ptds);
    if (!s)
        return CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&e->lock);
    CUresult r = CUDA_SUCCESS;
    uint64_t seq = 0;
    int queued = 0;
    for (size_t i = 0; i < e->n && r == CUDA_SUCCESS; i++) {
        fc_op_t *op = op_clone(e->ops[i]);
        if (!op) {
            r = CUDA_ERROR_OUT_OF_MEMORY;
            break;
        }
        if (i == 0 && e->last_s && fc_op_after(op, e->last_s, e->last_seq) != 0) {
            fc_op_free(op);
            r = CUDA_ERROR_OUT_OF_MEMORY;
            break;
        }
        r = fc_submit(s, op, &seq);
        queued |= r == CUDA_SUCCESS && seq != 0;
    }
    if (queued) {
        e->last_s = s;
        e->last_seq = seq;
        FC_STAT(graph_launches, 1);
    }
    pthread_mutex_unlock(&e->lock);
    return r;
}

/* May an exec update give a node instantiated with shape `was` parameters of shape `now`? */
static int dims_allowed(CUgraphNodeType type, fc_dims_t was, fc_dims_t now) {
    if (type == CU_GRAPH_NODE_TYPE_MEMCPY)
        return now.height <= 1 && now.depth <= 1 && was.height <= 1 && was.depth <= 1;
    if (type != CU_GRAPH_NODE_TYPE_MEMSET || was.height == 0)
        return 1; /* a kernel, or a captured memset (its shape not kept) */
    if (now.height != was.height)
        return 0;
    return was.height == 1 ||
           (now.width == was.width && now.pitch == was.pitch && now.elem == was.elem);
}

CUresult fc_graph_exec_set(CUgraphExec he, CUgraphNode hn, CUgraphNodeType type, fc_op_t *op,
                           fc_dims_t dims) {
    struct CUgraphExec_st *e = exec_of(he);
    size_t i = 0;
    while (e && hn && i < e->n && e->origin[i].node != hn)
        i++;
    if (!op || !e || !hn || i == e->n || e->origin[i].type != type ||
        !dims_allowed(type, e->origin[i].dims, dims)) {
        if (op)
            fc_op_free(op);
        return CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_lock(&e->lock);
    fc_op_t *old = e->ops[i];
    e->ops[i] = op;
    if (type == CU_GRAPH_NODE_TYPE_MEMCPY || type == CU_GRAPH_NODE_TYPE_MEMSET)
        e->origin[i].dims = dims;
    pthread_mutex_unlock(&e->lock);
    fc_op_free(old);
    return CUDA_SUCCESS;
}

/* cuGraphExecKernelNodeSetParams: hn must be a kernel node of the graph he was instantiated
 * from. */
static CUresult exec_kernel_set(CUgraphExec he, CUgraphNode hn, const CUDA_KERNEL_NODE_PARAMS *p) {
    if (!exec_of(he) || !hn || !p)
        return CUDA_ERROR_INVALID_VALUE;
    fc_op_t *op;
    CUresult r = fc_graph_kernel_op(p, &op);
    if (r != CUDA_SUCCESS)
        return r;
    return fc_graph_exec_set(he, hn, CU_GRAPH_NODE_TYPE_KERNEL, op, (fc_dims_t){0});
}

static CUresult fc_exec_kernel_set_v1(CUgraphExec e, CUgraphNode n,
                                      const CUDA_KERNEL_NODE_PARAMS_v1 *p) {
    FC_ENTER("cuGraphExecKernelNodeSetParams");
    if (!p)
        return CUDA_ERROR_INVALID_VALUE;
    CUDA_KERNEL_NODE_PARAMS q = fc_graph_kernel_v1(p);
    return exec_kernel_set(e, n, &q);
}
FC_EXPORT(cuGraphExecKernelNodeSetParams, PFN_cuGraphExecKernelNodeSetParams_v10010,
          fc_exec_kernel_set_v1);

static CUresult fc_exec_kernel_set(CUgraphExec e, CUgraphNode n, const CUDA_KERNEL_NODE_PARAMS *p) {
    FC_ENTER("cuGraphExecKernelNodeSetParams");
    return exec_kernel_set(e, n, p);
}
FC_EXPORT(cuGraphExecKernelNodeSetParams_v2, PFN_cuGraphExecKernelNodeSetParams_v12000,
          fc_exec_kernel_set);

/* ---- cuGraphExecUpdate ----------------------------------------------------------------------- */

/* Fills *info and says whether g has the topology of `shape` (an executable graph's copy of the
 * graph it came from), recursively into child graphs: nodes are paired in creation order, each
 * with the same type and the same dependencies, in edge order. The checks and what they report
 * are cuda.h's, in its order: the count of nodes (errorNode NULL), a node's count of dependencies
 * or a mismatched dependency (errorNode the node of g, errorFromNode its dependency), then a
 * node's type. Parameters are not compared: a simulated node accepts any that its typed call
 * would. */
static int same_topology(const fc_graph_t *shape, const fc_graph_t *g,
                         CUgraphExecUpdateResultInfo *info) {
    if (shape->n != g->n) {
        *info =
            (CUgraphExecUpdateResultInfo){CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED, NULL, NULL};
        return 0;
    }
    for (size_t i = 0; i < g->n; i++) {
        const fc_node_t *a = shape->nodes[i], *b = g->nodes[i];
        if (a->ndeps != b->ndeps) {
            *info = (CUgraphExecUpdateResultInfo){CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED,
                                                  (CUgraphNode)b, NULL};
            return 0;
        }
        for (size_t k = 0; k < b->ndeps; k++) {
            if (a->deps[k]->idx != b->deps[k]->idx) {
                *info = (CUgraphExecUpdateResultInfo){CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED,
                                                      (CUgraphNode)b, (CUgraphNode)b->deps[k]};
                return 0;
            }
        }
    }
    for (size_t i = 0; i < g->n; i++) {
        const fc_node_t *a = shape->nodes[i], *b = g->nodes[i];
        if (a->type != b->type) {
            *info = (CUgraphExecUpdateResultInfo){CU_GRAPH_EXEC_UPDATE_ERROR_NODE_TYPE_CHANGED,
                                                  (CUgraphNode)b, NULL};
            return 0;
        }
        if (a->child && !same_topology(a->child, b->child, info))
            return 0;
    }
    return 1;
}

/* Gives executable graph he the parameters of every node of hg, a graph of the same topology
 * (same_topology): its ops are made again from hg's nodes, in the order instantiation gave them
 * (which depends on the topology only), so each kernel node keeps its place for
 * cuGraphExecKernelNodeSetParams, which names the nodes of the graph he was instantiated from.
 * Launches already queued keep their ops. On any failure he is unchanged. */
static CUresult exec_update(CUgraphExec he, CUgraph hg, CUgraphExecUpdateResultInfo *info) {
    if (!info)
        return CUDA_ERROR_INVALID_VALUE;
    *info = (CUgraphExecUpdateResultInfo){CU_GRAPH_EXEC_UPDATE_ERROR, NULL, NULL};
    struct CUgraphExec_st *e = exec_of(he);
    fc_graph_t *g = graph_of(hg);
    if (!e || !g)
        return CUDA_ERROR_INVALID_VALUE;
    if (!same_topology(e->shape, g, info))
        return CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE;
    struct CUgraphExec_st fresh = {.magic = 0};
    CUresult r = flatten(&fresh, g, 0);
    if (r == CUDA_SUCCESS && fresh.n != e->n)
        r = CUDA_ERROR_INVALID_VALUE; /* an empty copy (no op) made non-empty, or back */
    if (r != CUDA_SUCCESS) {
        for (size_t i = 0; i < fresh.n; i++)
            fc_op_free(fresh.ops[i]);
        free(fresh.ops);
        free(fresh.origin);
        *info = (CUgraphExecUpdateResultInfo){CU_GRAPH_EXEC_UPDATE_ERROR, NULL, NULL};
        return r == CUDA_ERROR_OUT_OF_MEMORY ? r : CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE;
    }
    pthread_mutex_lock(&e->lock);
    fc_op_t **old = e->ops;
    e->ops = fresh.ops;
    for (size_t i = 0; i < fresh.n; i++)
        e->origin[i].dims = fresh.origin[i].dims; /* as though instantiated from hg */
    pthread_mutex_unlock(&e->lock);
    for (size_t i = 0; i < fresh.n; i++)
        fc_op_free(old[i]);
    free(old);
    free(fresh.origin);
    info->result = CU_GRAPH_EXEC_UPDATE_SUCCESS;
    return CUDA_SUCCESS;
}

/* CUDA 10.2's ABI: the result and the error node only. */
static CUresult fc_exec_update_v1(CUgraphExec e, CUgraph g, CUgraphNode *err_node,
                                  CUgraphExecUpdateResult *result) {
    FC_ENTER("cuGraphExecUpdate");
    if (!err_node || !result)
        return CUDA_ERROR_INVALID_VALUE;
    CUgraphExecUpdateResultInfo info;
    CUresult r = exec_update(e, g, &info);
    *err_node = info.errorNode;
    *result = info.result;
    return r;
}
FC_EXPORT(cuGraphExecUpdate, PFN_cuGraphExecUpdate_v10020, fc_exec_update_v1);

static CUresult fc_exec_update(CUgraphExec e, CUgraph g, CUgraphExecUpdateResultInfo *info) {
    FC_ENTER("cuGraphExecUpdate");
    return exec_update(e, g, info);
}
FC_EXPORT(cuGraphExecUpdate_v2, PFN_cuGraphExecUpdate_v12000, fc_exec_update);

/* cuStreamBeginCaptureToGraph: the captured work is appended to hg after the dependencies (edge
 * data, when given, must be the default edge: full completion). */
static CUresult begin_capture_to(CUstream h, CUgraph hg, const CUgraphNode *deps,
                                 const CUgraphEdgeData *edges, size_t ndeps,
                                 CUstreamCaptureMode mode, int ptds) {
    fc_graph_t *g = graph_of(hg);
    if (!g)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = fc_graph_check_deps(g, deps, ndeps);
    if (r != CUDA_SUCCESS)
        return r;
    for (size_t i = 0; edges && i < ndeps; i++)
        if (edges[i].from_port || edges[i].to_port || edges[i].type)
            return CUDA_ERROR_INVALID_VALUE;
    return begin_capture(h, ptds, mode, g, deps, ndeps);
}

static CUresult fc_begin_capture_to(CUstream h, CUgraph g, const CUgraphNode *deps,
                                    const CUgraphEdgeData *edges, size_t n,
                                    CUstreamCaptureMode mode) {
    FC_ENTER("cuStreamBeginCaptureToGraph");
    return begin_capture_to(h, g, deps, edges, n, mode, 0);
}
FC_EXPORT(cuStreamBeginCaptureToGraph, PFN_cuStreamBeginCaptureToGraph_v12030, fc_begin_capture_to);

static CUresult fc_begin_capture_to_ptsz(CUstream h, CUgraph g, const CUgraphNode *deps,
                                         const CUgraphEdgeData *edges, size_t n,
                                         CUstreamCaptureMode mode) {
    FC_ENTER("cuStreamBeginCaptureToGraph");
    return begin_capture_to(h, g, deps, edges, n, mode, 1);
}
FC_EXPORT(cuStreamBeginCaptureToGraph_ptsz, PFN_cuStreamBeginCaptureToGraph_v12030_ptsz,
          fc_begin_capture_to_ptsz);

static CUresult fc_graph_launch(CUgraphExec e, CUstream h) {
    FC_ENTER("cuGraphLaunch");
    return launch(e, h, 0);
}
FC_EXPORT(cuGraphLaunch, PFN_cuGraphLaunch_v10000, fc_graph_launch);

static CUresult fc_graph_launch_ptsz(CUgraphExec e, CUstream h) {
    FC_ENTER("cuGraphLaunch");
    return launch(e, h, 1);
}
FC_EXPORT(cuGraphLaunch_ptsz, PFN_cuGraphLaunch_v10000_ptsz, fc_graph_launch_ptsz);

/* Launches already queued keep their own copies of the ops: destroying does not wait. */
static CUresult fc_exec_destroy(CUgraphExec he) {
    FC_ENTER_("cuGraphExecDestroy", 1, 0);
    struct CUgraphExec_st *e = exec_of(he);
    if (!e)
        return CUDA_ERROR_INVALID_VALUE;
    exec_free(e);
    FC_STAT(graph_execs_live, -1);
    return CUDA_SUCCESS;
}
FC_EXPORT(cuGraphExecDestroy, PFN_cuGraphExecDestroy_v10000, fc_exec_destroy);

static CUresult fc_graph_destroy(CUgraph hg) {
    FC_ENTER_("cuGraphDestroy", 1, 0);
    fc_graph_t *g = graph_of(hg);
    if (!g)
        return CUDA_ERROR_INVALID_VALUE;
    fc_graph_free(g);
    return CUDA_SUCCESS;
}
FC_EXPORT(cuGraphDestroy, PFN_cuGraphDestroy_v10000, fc_graph_destroy);
