/* SPDX-License-Identifier: MIT */
/* fc_graph.c: simulated stream capture and CUDA graphs: cuStreamBeginCapture (both ABIs),
 * cuStreamEndCapture, cuStreamIsCapturing, cuGraphInstantiate (every ABI), cuGraphLaunch,
 * cuGraphExecDestroy and cuGraphDestroy, with their per-thread-stream variants.
 *
 * A graph is linear: the kernels, copies, sets and host functions captured from one stream, in
 * order (fc_submit adds them while the stream captures; they never run themselves). What a graph
 * of several branches would need (an event record or a wait on a capturing stream: fork and
 * join) is refused with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and invalidates the capture, and
 * so is everything a capture cannot take on the driver either (fc_stream.c): a synchronous wait,
 * pageable memory, the legacy stream while a blocking stream captures, and, while a capture in
 * global mode is in progress, cuMemAlloc, cuMemFree and cuCtxSynchronize. Graph memory nodes
 * (cuMemAllocAsync/cuMemFreeAsync in a capture) are not simulated and refused the same way.
 *
 * cuGraphLaunch queues on the launch stream, in order, a fresh copy of every captured op
 * (fc_op_t.clone), so a launched graph is ordinary work: its kernels and copies check their
 * memory when they run (memory unmapped since the capture faults with a sticky
 * CUDA_ERROR_ILLEGAL_ADDRESS, like any kernel), strict mode sees their references (a kernel's
 * are found again at launch), the timing model times them and the statistics count them. Each
 * launch of an executable graph runs after its previous launch, as on the driver. A graph
 * launched into a capturing stream is captured as its ops (the child graph, flattened).
 *
 * Locking: capture state is guarded by g_fc.lock; a graph and its executable graphs share one
 * immutable op list, reference counted under g_fc.lock; an executable graph's mutex orders its
 * launches. */
#include "fc_internal.h"

#include <stdlib.h>
#include <string.h>

#define FC_MAGIC_GRAPH 0x47524150u
#define FC_MAGIC_GEXEC 0x47455845u

struct CUgraph_st {
    uint32_t magic;
    fc_oplist_t *list;
};

struct CUgraphExec_st {
    uint32_t magic;
    fc_oplist_t *list;
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

static void oplist_get(fc_oplist_t *l) {
    pthread_mutex_lock(&g_fc.lock);
    l->refs++;
    pthread_mutex_unlock(&g_fc.lock);
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

static CUresult begin_capture(CUstream h, int ptds, CUstreamCaptureMode mode) {
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
    if (!l) {
        free(c);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    c->mode = mode;
    c->thread = pthread_self();
    c->list = l;
    pthread_mutex_lock(&g_fc.lock);
    if (s->capture) {
        pthread_mutex_unlock(&g_fc.lock);
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
    int invalidated = c->invalidated;
    free(c);
    if (invalidated) {
        fc_oplist_put(l);
        return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    }
    struct CUgraph_st *g = calloc(1, sizeof *g);
    if (!g) {
        fc_oplist_put(l);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    g->magic = FC_MAGIC_GRAPH;
    g->list = l;
    FC_STAT(graphs_live, 1);
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
    return begin_capture(h, 0, CU_STREAM_CAPTURE_MODE_GLOBAL);
}
FC_EXPORT(cuStreamBeginCapture, PFN_cuStreamBeginCapture_v10000, fc_begin_capture_v1);

static CUresult fc_begin_capture_v1_ptsz(CUstream h) {
    FC_ENTER("cuStreamBeginCapture");
    return begin_capture(h, 1, CU_STREAM_CAPTURE_MODE_GLOBAL);
}
FC_EXPORT(cuStreamBeginCapture_ptsz, PFN_cuStreamBeginCapture_v10000_ptsz,
          fc_begin_capture_v1_ptsz);

static CUresult fc_begin_capture(CUstream h, CUstreamCaptureMode mode) {
    FC_ENTER("cuStreamBeginCapture");
    return begin_capture(h, 0, mode);
}
FC_EXPORT(cuStreamBeginCapture_v2, PFN_cuStreamBeginCapture_v10010, fc_begin_capture);

static CUresult fc_begin_capture_ptsz(CUstream h, CUstreamCaptureMode mode) {
    FC_ENTER("cuStreamBeginCapture");
    return begin_capture(h, 1, mode);
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

static struct CUgraph_st *graph_of(CUgraph g) {
    return (g && g->magic == FC_MAGIC_GRAPH) ? g : NULL;
}

static struct CUgraphExec_st *exec_of(CUgraphExec e) {
    return (e && e->magic == FC_MAGIC_GEXEC) ? e : NULL;
}

/* Flags a linear graph of kernels, copies and sets can honour (device launch it cannot). */
#define INSTANTIATE_FLAGS                                                                          \
    ((unsigned long long)(CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH |                        \
                          CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY))

static CUresult instantiate(CUgraphExec *out, CUgraph hg, unsigned long long flags) {
    if (!out)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUgraph_st *g = graph_of(hg);
    if (!g || (flags & ~INSTANTIATE_FLAGS))
        return CUDA_ERROR_INVALID_VALUE;
    struct CUgraphExec_st *e = calloc(1, sizeof *e);
    if (!e)
        return CUDA_ERROR_OUT_OF_MEMORY;
    e->magic = FC_MAGIC_GEXEC;
    pthread_mutex_init(&e->lock, NULL);
    oplist_get(g->list);
    e->list = g->list;
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
    for (size_t i = 0; i < e->list->n && r == CUDA_SUCCESS; i++) {
        fc_op_t *op = op_clone(e->list->ops[i]);
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
    e->magic = 0;
    fc_oplist_put(e->list);
    pthread_mutex_destroy(&e->lock);
    free(e);
    FC_STAT(graph_execs_live, -1);
    return CUDA_SUCCESS;
}
FC_EXPORT(cuGraphExecDestroy, PFN_cuGraphExecDestroy_v10000, fc_exec_destroy);

static CUresult fc_graph_destroy(CUgraph hg) {
    FC_ENTER_("cuGraphDestroy", 1, 0);
    struct CUgraph_st *g = graph_of(hg);
    if (!g)
        return CUDA_ERROR_INVALID_VALUE;
    g->magic = 0;
    fc_oplist_put(g->list);
    free(g);
    FC_STAT(graphs_live, -1);
    return CUDA_SUCCESS;
}
FC_EXPORT(cuGraphDestroy, PFN_cuGraphDestroy_v10000, fc_graph_destroy);
