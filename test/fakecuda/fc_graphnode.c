/* SPDX-License-Identifier: MIT */
/* fc_graphnode.c: the explicit graph API (fc_graph.c has the graphs themselves): cuGraphCreate;
 * kernel (both ABIs), memcpy (CUDA_MEMCPY3D), memset, child-graph and empty nodes; dependencies
 * (both ABIs); cuGraphGetNodes, cuGraphNodeGetType; and cuGraphAddNode, the generic node call
 * (CUDA 12.2's ABI and 12.3's with edge data, cuGraphAddNode_v2): a CUgraphNodeParams tagged
 * union whose `type` selects the node. Kernel, memcpy, memset, child-graph and empty nodes are
 * added by the code of their typed calls, with the same checks; the other types (host, event,
 * external semaphore, graph memory, batch memop and conditional nodes) are not simulated:
 * CUDA_ERROR_NOT_SUPPORTED, one of the errors cuda.h lists for the call. So is a child graph moved
 * into its parent (CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE): the simulated graph always owns a copy. *
 * As cuda.h says, reserved0, reserved2 and every byte of the union past the member the type uses
 * must be zero (CUDA_ERROR_INVALID_VALUE otherwise), and so must a memcpy node's flags and
 * reserved fields; edge data, when given, must be the default edge (full completion), as for
 * cuGraphAddDependencies_v2. */
#include "fc_graph.h"

#include <stddef.h>
#include <string.h>

/* ---- the typed node calls ------------------------------------------------------------------ */

static CUresult fc_graph_create(CUgraph *out, unsigned int flags) {
    FC_ENTER("cuGraphCreate");
    if (!out || flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    fc_graph_t *g = fc_graph_new();
    if (!g)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *out = g;
    return CUDA_SUCCESS;
}
FC_EXPORT(cuGraphCreate, PFN_cuGraphCreate_v10000, fc_graph_create);

/* The common part of every cuGraphAdd*Node: checks, then adds the node (taking op and child). */
static CUresult add_node(CUgraphNode *out, CUgraph hg, const CUgraphNode *deps, size_t ndeps,
                         CUgraphNodeType type, fc_op_t *op, fc_graph_t *child) {
    fc_graph_t *g = graph_of(hg);
    CUresult r = !out || !g ? CUDA_ERROR_INVALID_VALUE : fc_graph_check_deps(g, deps, ndeps);
    if (r != CUDA_SUCCESS) {
        if (op)
            fc_op_free(op);
        if (child)
            fc_graph_free(child);
        return r;
    }
    fc_node_t *n = fc_graph_node_add(g, type, op, child, deps, ndeps);
    if (!n)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *out = n;
    return CUDA_SUCCESS;
}

CUresult fc_graph_kernel_op(const CUDA_KERNEL_NODE_PARAMS *p, fc_op_t **op) {
    if (!p)
        return CUDA_ERROR_INVALID_VALUE;
    CUfunction f = p->func ? p->func : (CUfunction)(void *)p->kern;
    if (!f)
        return CUDA_ERROR_INVALID_VALUE;
    const unsigned grid[3] = {p->gridDimX, p->gridDimY, p->gridDimZ};
    const unsigned block[3] = {p->blockDimX, p->blockDimY, p->blockDimZ};
    return fc_launch_op(f, grid, block, p->sharedMemBytes, p->kernelParams, p->extra, op);
}

/* The CUDA 10 layout is the CUDA 12 one without its last two fields (kern, ctx). */
CUDA_KERNEL_NODE_PARAMS fc_graph_kernel_v1(const CUDA_KERNEL_NODE_PARAMS_v1 *p) {
    CUDA_KERNEL_NODE_PARAMS q = {0};
    if (p)
        memcpy(&q, p, sizeof *p);
    return q;
}

static CUresult add_kernel(CUgraphNode *out, CUgraph g, const CUgraphNode *deps, size_t n,
                           const CUDA_KERNEL_NODE_PARAMS *p) {
    if (!graph_of(g) || !out)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = fc_graph_check_deps(g, deps, n);
    fc_op_t *op = NULL;
    if (r == CUDA_SUCCESS)
        r = fc_graph_kernel_op(p, &op);
    if (r != CUDA_SUCCESS)
        return r;
    return add_node(out, g, deps, n, CU_GRAPH_NODE_TYPE_KERNEL, op, NULL);
}

static CUresult fc_add_kernel_v1(CUgraphNode *out, CUgraph g, const CUgraphNode *deps, size_t n,
                                 const CUDA_KERNEL_NODE_PARAMS_v1 *p) {
    FC_ENTER("cuGraphAddKernelNode");
    if (!p)
        return CUDA_ERROR_INVALID_VALUE;
    CUDA_KERNEL_NODE_PARAMS q = fc_graph_kernel_v1(p);
    return add_kernel(out, g, deps, n, &q);
}
FC_EXPORT(cuGraphAddKernelNode, PFN_cuGraphAddKernelNode_v10000, fc_add_kernel_v1);

static CUresult fc_add_kernel(CUgraphNode *out, CUgraph g, const CUgraphNode *deps, size_t n,
                              const CUDA_KERNEL_NODE_PARAMS *p) {
    FC_ENTER("cuGraphAddKernelNode");
    return add_kernel(out, g, deps, n, p);
}
FC_EXPORT(cuGraphAddKernelNode_v2, PFN_cuGraphAddKernelNode_v12000, fc_add_kernel);

/* The checks a memcpy or memset node's arguments share, in the driver's order: the graph and
 * the out pointer, the context, the dependencies. */
static CUresult check_op_node(CUgraphNode *out, CUgraph g, const CUgraphNode *deps, size_t n,
                              CUcontext ctx) {
    if (!graph_of(g) || !out)
        return CUDA_ERROR_INVALID_VALUE;
    if (!fc_ctx_valid(ctx))
        return CUDA_ERROR_INVALID_CONTEXT;
    return fc_graph_check_deps(g, deps, n);
}

static fc_dims_t memcpy_dims(const CUDA_MEMCPY3D *c) {
    return (fc_dims_t){.width = c->WidthInBytes, .height = c->Height, .depth = c->Depth};
}

static fc_dims_t memset_dims(const CUDA_MEMSET_NODE_PARAMS *m) {
    return (fc_dims_t){
        .width = m->width, .height = m->height, .pitch = m->pitch, .elem = m->elementSize};
}

static CUresult add_memcpy(CUgraphNode *out, CUgraph g, const CUgraphNode *deps, size_t n,
                           const CUDA_MEMCPY3D *c, CUcontext ctx) {
    CUresult r = check_op_node(out, g, deps, n, ctx);
    fc_op_t *op = NULL;
    if (r == CUDA_SUCCESS)
        r = fc_copy3d_op(c, &op);
    if (r == CUDA_SUCCESS)
        r = add_node(out, g, deps, n, CU_GRAPH_NODE_TYPE_MEMCPY, op, NULL);
    if (r == CUDA_SUCCESS)
        (*out)->dims = memcpy_dims(c);
    return r;
}

static CUresult fc_add_memcpy(CUgraphNode *out, CUgraph g, const CUgraphNode *deps, size_t n,
                              const CUDA_MEMCPY3D *c, CUcontext ctx) {
    FC_ENTER("cuGraphAddMemcpyNode");
    return add_memcpy(out, g, deps, n, c, ctx);
}
FC_EXPORT(cuGraphAddMemcpyNode, PFN_cuGraphAddMemcpyNode_v10000, fc_add_memcpy);

static CUresult add_memset(CUgraphNode *out, CUgraph g, const CUgraphNode *deps, size_t n,
                           const CUDA_MEMSET_NODE_PARAMS *m, CUcontext ctx) {
    CUresult r = check_op_node(out, g, deps, n, ctx);
    fc_op_t *op = NULL;
    if (r == CUDA_SUCCESS)
        r = fc_memset_op(m, &op);
    if (r == CUDA_SUCCESS)
        r = add_node(out, g, deps, n, CU_GRAPH_NODE_TYPE_MEMSET, op, NULL);
    if (r == CUDA_SUCCESS)
        (*out)->dims = memset_dims(m);
    return r;
}

static CUresult fc_add_memset(CUgraphNode *out, CUgraph g, const CUgraphNode *deps, size_t n,
                              const CUDA_MEMSET_NODE_PARAMS *m, CUcontext ctx) {
    FC_ENTER("cuGraphAddMemsetNode");
    return add_memset(out, g, deps, n, m, ctx);
}
FC_EXPORT(cuGraphAddMemsetNode, PFN_cuGraphAddMemsetNode_v10000, fc_add_memset);

static CUresult add_child(CUgraphNode *out, CUgraph g, const CUgraphNode *deps, size_t n,
                          CUgraph child) {
    fc_graph_t *c = graph_of(child);
    if (!graph_of(g) || !out || !c || c == g)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = fc_graph_check_deps(g, deps, n);
    if (r != CUDA_SUCCESS)
        return r;
    fc_graph_t *copy = fc_graph_clone(c);
    if (!copy)
        return CUDA_ERROR_OUT_OF_MEMORY;
    return add_node(out, g, deps, n, CU_GRAPH_NODE_TYPE_GRAPH, NULL, copy);
}

static CUresult fc_add_child(CUgraphNode *out, CUgraph g, const CUgraphNode *deps, size_t n,
                             CUgraph child) {
    FC_ENTER("cuGraphAddChildGraphNode");
    return add_child(out, g, deps, n, child);
}
FC_EXPORT(cuGraphAddChildGraphNode, PFN_cuGraphAddChildGraphNode_v10000, fc_add_child);

static CUresult add_empty(CUgraphNode *out, CUgraph g, const CUgraphNode *deps, size_t n) {
    return add_node(out, g, deps, n, CU_GRAPH_NODE_TYPE_EMPTY, NULL, NULL);
}

static CUresult fc_add_empty(CUgraphNode *out, CUgraph g, const CUgraphNode *deps, size_t n) {
    FC_ENTER("cuGraphAddEmptyNode");
    return add_empty(out, g, deps, n);
}
FC_EXPORT(cuGraphAddEmptyNode, PFN_cuGraphAddEmptyNode_v10000, fc_add_empty);

/* Adds edges from[i] -> to[i]: both nodes of g, the edge new; edge data, when given, must be
 * the default edge (full completion). A cycle is found at instantiation. */
static CUresult add_deps(CUgraph hg, const CUgraphNode *from, const CUgraphNode *to,
                         const CUgraphEdgeData *edges, size_t n) {
    fc_graph_t *g = graph_of(hg);
    if (!g || (n && (!from || !to)))
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < n; i++) {
        fc_node_t *a = node_of(from[i]), *b = node_of(to[i]);
        if (!a || !b || a->g != g || b->g != g || a == b)
            return CUDA_ERROR_INVALID_VALUE;
        if (edges && (edges[i].from_port || edges[i].to_port || edges[i].type))
            return CUDA_ERROR_INVALID_VALUE;
        for (size_t k = 0; k < b->ndeps; k++)
            if (b->deps[k] == a)
                return CUDA_ERROR_INVALID_VALUE;
    }
    for (size_t i = 0; i < n; i++) {
        fc_node_t *b = to[i];
        fc_node_t **d = realloc(b->deps, (b->ndeps + 1) * sizeof *d);
        if (!d)
            return CUDA_ERROR_OUT_OF_MEMORY;
        d[b->ndeps++] = from[i];
        b->deps = d;
    }
    return CUDA_SUCCESS;
}

static CUresult fc_add_deps(CUgraph hg, const CUgraphNode *from, const CUgraphNode *to, size_t n) {
    FC_ENTER("cuGraphAddDependencies");
    return add_deps(hg, from, to, NULL, n);
}
FC_EXPORT(cuGraphAddDependencies, PFN_cuGraphAddDependencies_v10000, fc_add_deps);

static CUresult fc_add_deps_v2(CUgraph hg, const CUgraphNode *from, const CUgraphNode *to,
                               const CUgraphEdgeData *edges, size_t n) {
    FC_ENTER("cuGraphAddDependencies");
    return add_deps(hg, from, to, edges, n);
}
FC_EXPORT(cuGraphAddDependencies_v2, PFN_cuGraphAddDependencies_v12030, fc_add_deps_v2);

static CUresult fc_graph_nodes(CUgraph hg, CUgraphNode *nodes, size_t *count) {
    FC_ENTER("cuGraphGetNodes");
    fc_graph_t *g = graph_of(hg);
    if (!g || !count)
        return CUDA_ERROR_INVALID_VALUE;
    if (nodes)
        for (size_t i = 0; i < g->n && i < *count; i++)
            nodes[i] = g->nodes[i];
    if (!nodes || *count > g->n)
        *count = g->n;
    return CUDA_SUCCESS;
}
FC_EXPORT(cuGraphGetNodes, PFN_cuGraphGetNodes_v10000, fc_graph_nodes);

static CUresult fc_node_type(CUgraphNode hn, CUgraphNodeType *type) {
    FC_ENTER("cuGraphNodeGetType");
    fc_node_t *n = node_of(hn);
    if (!n || !type)
        return CUDA_ERROR_INVALID_VALUE;
    *type = n->type;
    return CUDA_SUCCESS;
}
FC_EXPORT(cuGraphNodeGetType, PFN_cuGraphNodeGetType_v10000, fc_node_type);

/* ---- cuGraphAddNode ------------------------------------------------------------------------- */

/* Are the bytes of p's union from `used` on, and its reserved fields, all zero? */
static int unused_zero(const CUgraphNodeParams *p, size_t used) {
    if (p->reserved0[0] || p->reserved0[1] || p->reserved0[2] || p->reserved2)
        return 0;
    const unsigned char *u = (const unsigned char *)&p->reserved1;
    for (size_t i = used; i < sizeof p->reserved1; i++)
        if (u[i])
            return 0;
    return 1;
}

/* CUDA_KERNEL_NODE_PARAMS_v3 has the fields of _v2, in its order. */
static CUDA_KERNEL_NODE_PARAMS kernel_v3(const CUDA_KERNEL_NODE_PARAMS_v3 *k) {
    return (CUDA_KERNEL_NODE_PARAMS){
        .func = k->func,
        .gridDimX = k->gridDimX,
        .gridDimY = k->gridDimY,
        .gridDimZ = k->gridDimZ,
        .blockDimX = k->blockDimX,
        .blockDimY = k->blockDimY,
        .blockDimZ = k->blockDimZ,
        .sharedMemBytes = k->sharedMemBytes,
        .kernelParams = k->kernelParams,
        .extra = k->extra,
        .kern = k->kern,
        .ctx = k->ctx,
    };
}

static CUDA_MEMSET_NODE_PARAMS memset_v2(const CUDA_MEMSET_NODE_PARAMS_v2 *m) {
    return (CUDA_MEMSET_NODE_PARAMS){.dst = m->dst,
                                     .pitch = m->pitch,
                                     .value = m->value,
                                     .elementSize = m->elementSize,
                                     .width = m->width,
                                     .height = m->height};
}

/* Are a generic memcpy node's parameters well formed (unused bytes, flags and reserved zero)? */
static int memcpy_params_ok(const CUgraphNodeParams *p) {
    return unused_zero(p, sizeof p->memcpy) && !p->memcpy.flags && !p->memcpy.reserved;
}

static CUresult add_any(CUgraphNode *out, CUgraph g, const CUgraphNode *deps,
                        const CUgraphEdgeData *edges, size_t n, CUgraphNodeParams *p) {
    if (!p)
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; edges && i < n; i++)
        if (edges[i].from_port || edges[i].to_port || edges[i].type)
            return CUDA_ERROR_INVALID_VALUE;
    switch (p->type) {
    case CU_GRAPH_NODE_TYPE_KERNEL: {
        if (!unused_zero(p, sizeof p->kernel))
            return CUDA_ERROR_INVALID_VALUE;
        CUDA_KERNEL_NODE_PARAMS q = kernel_v3(&p->kernel);
        return add_kernel(out, g, deps, n, &q);
    }
    case CU_GRAPH_NODE_TYPE_MEMCPY:
        if (!memcpy_params_ok(p))
            return CUDA_ERROR_INVALID_VALUE;
        return add_memcpy(out, g, deps, n, &p->memcpy.copyParams, p->memcpy.copyCtx);
    case CU_GRAPH_NODE_TYPE_MEMSET: {
        if (!unused_zero(p, sizeof p->memset))
            return CUDA_ERROR_INVALID_VALUE;
        CUDA_MEMSET_NODE_PARAMS q = memset_v2(&p->memset);
        return add_memset(out, g, deps, n, &q, p->memset.ctx);
    }
    case CU_GRAPH_NODE_TYPE_GRAPH:
        if (!unused_zero(p, sizeof p->graph))
            return CUDA_ERROR_INVALID_VALUE;
        if (p->graph.ownership == CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE)
            return CUDA_ERROR_NOT_SUPPORTED;
        if (p->graph.ownership != CU_GRAPH_CHILD_GRAPH_OWNERSHIP_CLONE)
            return CUDA_ERROR_INVALID_VALUE;
        return add_child(out, g, deps, n, p->graph.graph);
    case CU_GRAPH_NODE_TYPE_EMPTY:
        if (!unused_zero(p, 0))
            return CUDA_ERROR_INVALID_VALUE;
        return add_empty(out, g, deps, n);
    default:
        return CUDA_ERROR_NOT_SUPPORTED;
    }
}

static CUresult fc_add_node(CUgraphNode *out, CUgraph g, const CUgraphNode *deps, size_t n,
                            CUgraphNodeParams *p) {
    FC_ENTER("cuGraphAddNode");
    return add_any(out, g, deps, NULL, n, p);
}
FC_EXPORT(cuGraphAddNode, PFN_cuGraphAddNode_v12020, fc_add_node);

static CUresult fc_add_node_v2(CUgraphNode *out, CUgraph g, const CUgraphNode *deps,
                               const CUgraphEdgeData *edges, size_t n, CUgraphNodeParams *p) {
    FC_ENTER("cuGraphAddNode");
    return add_any(out, g, deps, edges, n, p);
}
FC_EXPORT(cuGraphAddNode_v2, PFN_cuGraphAddNode_v12030, fc_add_node_v2);

/* ---- parameters set after a node was added ------------------------------------------------- */

/* Gives node n of a graph the op `op` (taken; NULL for an empty copy) and its shape. Executable
 * graphs instantiated before keep their own copies of the old op. */
static void node_set(fc_node_t *n, fc_op_t *op, fc_dims_t dims) {
    if (n->op)
        fc_op_free(n->op);
    n->op = op;
    n->dims = dims;
}

/* The node hn when it is a node of type `type`, else NULL. */
static fc_node_t *node_typed(CUgraphNode hn, CUgraphNodeType type) {
    fc_node_t *n = node_of(hn);
    return n && n->type == type ? n : NULL;
}

static CUresult kernel_set(CUgraphNode hn, const CUDA_KERNEL_NODE_PARAMS *p) {
    fc_node_t *n = node_typed(hn, CU_GRAPH_NODE_TYPE_KERNEL);
    if (!n || !p)
        return CUDA_ERROR_INVALID_VALUE;
    fc_op_t *op;
    CUresult r = fc_graph_kernel_op(p, &op);
    if (r == CUDA_SUCCESS)
        node_set(n, op, (fc_dims_t){0});
    return r;
}

static CUresult fc_kernel_set_v1(CUgraphNode hn, const CUDA_KERNEL_NODE_PARAMS_v1 *p) {
    FC_ENTER("cuGraphKernelNodeSetParams");
    if (!p)
        return CUDA_ERROR_INVALID_VALUE;
    CUDA_KERNEL_NODE_PARAMS q = fc_graph_kernel_v1(p);
    return kernel_set(hn, &q);
}
FC_EXPORT(cuGraphKernelNodeSetParams, PFN_cuGraphKernelNodeSetParams_v10000, fc_kernel_set_v1);

static CUresult fc_kernel_set(CUgraphNode hn, const CUDA_KERNEL_NODE_PARAMS *p) {
    FC_ENTER("cuGraphKernelNodeSetParams");
    return kernel_set(hn, p);
}
FC_EXPORT(cuGraphKernelNodeSetParams_v2, PFN_cuGraphKernelNodeSetParams_v12000, fc_kernel_set);

static CUresult memcpy_set(CUgraphNode hn, const CUDA_MEMCPY3D *c) {
    fc_node_t *n = node_typed(hn, CU_GRAPH_NODE_TYPE_MEMCPY);
    if (!n || !c)
        return CUDA_ERROR_INVALID_VALUE;
    fc_op_t *op = NULL;
    CUresult r = fc_copy3d_op(c, &op);
    if (r == CUDA_SUCCESS)
        node_set(n, op, memcpy_dims(c));
    return r;
}

static CUresult fc_memcpy_set(CUgraphNode hn, const CUDA_MEMCPY3D *c) {
    FC_ENTER("cuGraphMemcpyNodeSetParams");
    return memcpy_set(hn, c);
}
FC_EXPORT(cuGraphMemcpyNodeSetParams, PFN_cuGraphMemcpyNodeSetParams_v10000, fc_memcpy_set);

static CUresult memset_set(CUgraphNode hn, const CUDA_MEMSET_NODE_PARAMS *m) {
    fc_node_t *n = node_typed(hn, CU_GRAPH_NODE_TYPE_MEMSET);
    if (!n || !m)
        return CUDA_ERROR_INVALID_VALUE;
    fc_op_t *op = NULL;
    CUresult r = fc_memset_op(m, &op);
    if (r == CUDA_SUCCESS)
        node_set(n, op, memset_dims(m));
    return r;
}

static CUresult fc_memset_set(CUgraphNode hn, const CUDA_MEMSET_NODE_PARAMS *m) {
    FC_ENTER("cuGraphMemsetNodeSetParams");
    return memset_set(hn, m);
}
FC_EXPORT(cuGraphMemsetNodeSetParams, PFN_cuGraphMemsetNodeSetParams_v10000, fc_memset_set);

/* cuGraphNodeSetParams: the type in p must be the node's, and p well formed as for
 * cuGraphAddNode (CUDA_ERROR_INVALID_VALUE otherwise). Kernel, memcpy and memset nodes take the
 * checks of their typed calls (and a valid context); an empty node has nothing to set; a
 * child-graph node's graph is not simulated (CUDA_ERROR_NOT_SUPPORTED). */
static CUresult fc_node_set(CUgraphNode hn, CUgraphNodeParams *p) {
    FC_ENTER("cuGraphNodeSetParams");
    fc_node_t *n = node_of(hn);
    if (!n || !p || p->type != n->type)
        return CUDA_ERROR_INVALID_VALUE;
    switch (p->type) {
    case CU_GRAPH_NODE_TYPE_KERNEL: {
        if (!unused_zero(p, sizeof p->kernel))
            return CUDA_ERROR_INVALID_VALUE;
        CUDA_KERNEL_NODE_PARAMS q = kernel_v3(&p->kernel);
        return kernel_set(hn, &q);
    }
    case CU_GRAPH_NODE_TYPE_MEMCPY:
        if (!memcpy_params_ok(p) || !fc_ctx_valid(p->memcpy.copyCtx))
            return CUDA_ERROR_INVALID_VALUE;
        return memcpy_set(hn, &p->memcpy.copyParams);
    case CU_GRAPH_NODE_TYPE_MEMSET: {
        if (!unused_zero(p, sizeof p->memset) || !fc_ctx_valid(p->memset.ctx))
            return CUDA_ERROR_INVALID_VALUE;
        CUDA_MEMSET_NODE_PARAMS q = memset_v2(&p->memset);
        return memset_set(hn, &q);
    }
    case CU_GRAPH_NODE_TYPE_EMPTY:
        return unused_zero(p, 0) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    default:
        return CUDA_ERROR_NOT_SUPPORTED;
    }
}
FC_EXPORT(cuGraphNodeSetParams, PFN_cuGraphNodeSetParams_v12020, fc_node_set);

/* ---- parameters of a node of an executable graph ------------------------------------------ */

/* cuGraphExecMemcpyNodeSetParams: a non-empty 1D copy replacing a 1D copy (fc_graph_exec_set). */
static CUresult exec_memcpy_set(CUgraphExec he, CUgraphNode hn, const CUDA_MEMCPY3D *c,
                                CUcontext ctx) {
    if (!c || !fc_ctx_valid(ctx))
        return CUDA_ERROR_INVALID_VALUE;
    fc_op_t *op = NULL;
    CUresult r = fc_copy3d_op(c, &op);
    if (r != CUDA_SUCCESS)
        return r;
    return fc_graph_exec_set(he, hn, CU_GRAPH_NODE_TYPE_MEMCPY, op, memcpy_dims(c));
}

static CUresult fc_exec_memcpy_set(CUgraphExec he, CUgraphNode hn, const CUDA_MEMCPY3D *c,
                                   CUcontext ctx) {
    FC_ENTER("cuGraphExecMemcpyNodeSetParams");
    return exec_memcpy_set(he, hn, c, ctx);
}
FC_EXPORT(cuGraphExecMemcpyNodeSetParams, PFN_cuGraphExecMemcpyNodeSetParams_v10020,
          fc_exec_memcpy_set);

/* cuGraphExecMemsetNodeSetParams: the height unchanged, a 2D memset's shape unchanged. */
static CUresult exec_memset_set(CUgraphExec he, CUgraphNode hn, const CUDA_MEMSET_NODE_PARAMS *m,
                                CUcontext ctx) {
    if (!m || !fc_ctx_valid(ctx))
        return CUDA_ERROR_INVALID_VALUE;
    fc_op_t *op = NULL;
    CUresult r = fc_memset_op(m, &op);
    if (r != CUDA_SUCCESS)
        return r;
    return fc_graph_exec_set(he, hn, CU_GRAPH_NODE_TYPE_MEMSET, op, memset_dims(m));
}

static CUresult fc_exec_memset_set(CUgraphExec he, CUgraphNode hn, const CUDA_MEMSET_NODE_PARAMS *m,
                                   CUcontext ctx) {
    FC_ENTER("cuGraphExecMemsetNodeSetParams");
    return exec_memset_set(he, hn, m, ctx);
}
FC_EXPORT(cuGraphExecMemsetNodeSetParams, PFN_cuGraphExecMemsetNodeSetParams_v10020,
          fc_exec_memset_set);

/* cuGraphExecNodeSetParams: kernel, memcpy and memset nodes with the limits of their typed exec
 * calls; a child-graph node's update is not simulated (CUDA_ERROR_NOT_SUPPORTED, as for the node
 * types the simulated graphs never hold); an empty node has no parameters to update. */
static CUresult fc_exec_node_set(CUgraphExec he, CUgraphNode hn, CUgraphNodeParams *p) {
    FC_ENTER("cuGraphExecNodeSetParams");
    if (!p)
        return CUDA_ERROR_INVALID_VALUE;
    switch (p->type) {
    case CU_GRAPH_NODE_TYPE_KERNEL: {
        if (!unused_zero(p, sizeof p->kernel))
            return CUDA_ERROR_INVALID_VALUE;
        CUDA_KERNEL_NODE_PARAMS q = kernel_v3(&p->kernel);
        fc_op_t *op;
        CUresult r = fc_graph_kernel_op(&q, &op);
        if (r != CUDA_SUCCESS)
            return r;
        return fc_graph_exec_set(he, hn, CU_GRAPH_NODE_TYPE_KERNEL, op, (fc_dims_t){0});
    }
    case CU_GRAPH_NODE_TYPE_MEMCPY:
        if (!memcpy_params_ok(p))
            return CUDA_ERROR_INVALID_VALUE;
        return exec_memcpy_set(he, hn, &p->memcpy.copyParams, p->memcpy.copyCtx);
    case CU_GRAPH_NODE_TYPE_MEMSET: {
        if (!unused_zero(p, sizeof p->memset))
            return CUDA_ERROR_INVALID_VALUE;
        CUDA_MEMSET_NODE_PARAMS q = memset_v2(&p->memset);
        return exec_memset_set(he, hn, &q, p->memset.ctx);
    }
    case CU_GRAPH_NODE_TYPE_EMPTY:
        return CUDA_ERROR_INVALID_VALUE;
    default:
        return CUDA_ERROR_NOT_SUPPORTED;
    }
}
FC_EXPORT(cuGraphExecNodeSetParams, PFN_cuGraphExecNodeSetParams_v12020, fc_exec_node_set);
