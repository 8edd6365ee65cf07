/* SPDX-License-Identifier: MIT */
/* graphnode.c: the hooks of graphs built node by node (the explicit graph API XLA uses): each
 * node's access set, found as for the operation it stands for (a kernel's parameter scan and TMA
 * descriptors, a copy's or a set's ranges), goes to graph.c once the driver has added the node;
 * an executable graph's kernel node given new parameters is learned again, and an executable
 * graph updated from a graph (cuGraphExecUpdate) learns what that graph touches. A call the driver
 * refuses is not learned. */
#include "hook_int.h"

/* The access set of a kernel node: f, or the CUkernel `kern` when f is NULL. */
static void kernel_access(ooc_access_t *a, const char *name, CUfunction f, CUkernel kern,
                          void **params, void **extra) {
    op_start(a, OOC_OP_KERNEL, name, 0);
    a->name = name;
    ooc_launch_access(f ? f : (CUfunction)(void *)kern, params, extra, a);
}

#define ADD_KERNEL_NODE(sym, pfn, P, KERN)                                                         \
    CUresult ooc_hook_##sym(CUgraphNode *node, CUgraph g, const CUgraphNode *deps, size_t n,       \
                            const P *p) {                                                          \
        OOC_NEED_REAL(sym);                                                                        \
        CUresult r = ooc_real.sym(node, g, deps, n, p);                                            \
        if (r != CUDA_SUCCESS || !managing() || !p)                                                \
            return r;                                                                              \
        ooc_access_t a;                                                                            \
        kernel_access(&a, #sym, p->func, KERN, p->kernelParams, p->extra);                         \
        return ooc_graph_node_added(g, *node, &a);                                                 \
    }                                                                                              \
    OOC_EXPORT_HOOK(sym, pfn)

ADD_KERNEL_NODE(cuGraphAddKernelNode, PFN_cuGraphAddKernelNode_v10000, CUDA_KERNEL_NODE_PARAMS_v1,
                NULL);
ADD_KERNEL_NODE(cuGraphAddKernelNode_v2, PFN_cuGraphAddKernelNode_v12000,
                CUDA_KERNEL_NODE_PARAMS_v2, p->kern);

#define EXEC_KERNEL_PARAMS(sym, pfn, P, KERN)                                                      \
    CUresult ooc_hook_##sym(CUgraphExec e, CUgraphNode node, const P *p) {                         \
        OOC_NEED_REAL(sym);                                                                        \
        CUresult r = ooc_real.sym(e, node, p);                                                     \
        if (r != CUDA_SUCCESS || !managing() || !p)                                                \
            return r;                                                                              \
        ooc_access_t a;                                                                            \
        kernel_access(&a, #sym, p->func, KERN, p->kernelParams, p->extra);                         \
        return ooc_graph_exec_node_params(e, node, &a);                                            \
    }                                                                                              \
    OOC_EXPORT_HOOK(sym, pfn)

EXEC_KERNEL_PARAMS(cuGraphExecKernelNodeSetParams, PFN_cuGraphExecKernelNodeSetParams_v10010,
                   CUDA_KERNEL_NODE_PARAMS_v1, NULL);
EXEC_KERNEL_PARAMS(cuGraphExecKernelNodeSetParams_v2, PFN_cuGraphExecKernelNodeSetParams_v12000,
                   CUDA_KERNEL_NODE_PARAMS_v2, p->kern);

/* The access set of a copy node. */
static CUresult memcpy_access(ooc_access_t *a, const char *name, const CUDA_MEMCPY3D *p) {
    op_start(a, OOC_OP_MEMCPY, name, 0);
    return ooc_copy3d_access(a, name, p);
}

/* The access set of a set node, as a memset's; *learn is 0 for an empty one (nothing to learn). */
static CUresult memset_access(ooc_access_t *a, const char *name, CUdeviceptr dst, size_t pitch,
                              unsigned elem, size_t width, size_t height, int *learn) {
    *learn = width && height;
    return *learn ? ooc_set_access(a, name, dst, pitch, width, height, elem) : CUDA_SUCCESS;
}

CUresult ooc_hook_cuGraphAddMemcpyNode(CUgraphNode *node, CUgraph g, const CUgraphNode *deps,
                                       size_t n, const CUDA_MEMCPY3D *p, CUcontext ctx) {
    OOC_NEED_REAL(cuGraphAddMemcpyNode);
    if (!managing() || !p)
        return ooc_real.cuGraphAddMemcpyNode(node, g, deps, n, p, ctx);
    ooc_access_t a;
    ACCESS_OR_RETURN(memcpy_access(&a, "cuGraphAddMemcpyNode", p));
    CUresult r = ooc_real.cuGraphAddMemcpyNode(node, g, deps, n, p, ctx);
    return r == CUDA_SUCCESS ? ooc_graph_node_added(g, *node, &a) : r;
}
OOC_EXPORT_HOOK(cuGraphAddMemcpyNode, PFN_cuGraphAddMemcpyNode_v10000);

CUresult ooc_hook_cuGraphAddMemsetNode(CUgraphNode *node, CUgraph g, const CUgraphNode *deps,
                                       size_t n, const CUDA_MEMSET_NODE_PARAMS *p, CUcontext ctx) {
    OOC_NEED_REAL(cuGraphAddMemsetNode);
    if (!managing() || !p)
        return ooc_real.cuGraphAddMemsetNode(node, g, deps, n, p, ctx);
    ooc_access_t a;
    int learn;
    ACCESS_OR_RETURN(memset_access(&a, "cuGraphAddMemsetNode", p->dst, p->pitch, p->elementSize,
                                   p->width, p->height, &learn));
    CUresult r = ooc_real.cuGraphAddMemsetNode(node, g, deps, n, p, ctx);
    return r == CUDA_SUCCESS ? ooc_graph_node_added(g, *node, learn ? &a : NULL) : r;
}
OOC_EXPORT_HOOK(cuGraphAddMemsetNode, PFN_cuGraphAddMemsetNode_v10000);

CUresult ooc_hook_cuGraphAddChildGraphNode(CUgraphNode *node, CUgraph g, const CUgraphNode *deps,
                                           size_t n, CUgraph child) {
    OOC_NEED_REAL(cuGraphAddChildGraphNode);
    CUresult r = ooc_real.cuGraphAddChildGraphNode(node, g, deps, n, child);
    if (r != CUDA_SUCCESS || !managing())
        return r;
    return ooc_graph_child_added(g, child);
}
OOC_EXPORT_HOOK(cuGraphAddChildGraphNode, PFN_cuGraphAddChildGraphNode_v10000);

/* cuGraphAddNode: a node of any type, CUgraphNodeParams's `type` saying which. Kernel, copy, set
 * and child-graph nodes are learned as their typed calls learn them: a copy's or a set's access
 * set is found (and a bad range refused) before the driver is asked, a kernel's and a child
 * graph's once it added the node. Other types (host, event, external semaphore, graph memory,
 * batch memop, conditional and empty nodes) are passed through unlearned. A child graph moved
 * into its parent (CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE) is learned the same; its own entry stays
 * until its handle is reused, as the shim never sees it destroyed. */
typedef enum { NODE_PASS, NODE_ACCESS, NODE_NONE, NODE_KERNEL, NODE_CHILD } node_kind_t;

/* Before the driver adds the node: *child is the child graph to learn from, read now because
 * nodeParams may carry out parameters the driver writes. */
static CUresult node_before(ooc_access_t *a, const char *name, const CUgraphNodeParams *p,
                            node_kind_t *kind, CUgraph *child) {
    *kind = NODE_PASS;
    *child = NULL;
    int learn;
    switch (p->type) {
    case CU_GRAPH_NODE_TYPE_KERNEL:
        *kind = NODE_KERNEL;
        return CUDA_SUCCESS;
    case CU_GRAPH_NODE_TYPE_GRAPH:
        *kind = NODE_CHILD;
        *child = p->graph.graph;
        return CUDA_SUCCESS;
    case CU_GRAPH_NODE_TYPE_MEMCPY:
        *kind = NODE_ACCESS;
        return memcpy_access(a, name, &p->memcpy.copyParams);
    case CU_GRAPH_NODE_TYPE_MEMSET: {
        const CUDA_MEMSET_NODE_PARAMS_v2 *m = &p->memset;
        CUresult r =
            memset_access(a, name, m->dst, m->pitch, m->elementSize, m->width, m->height, &learn);
        *kind = learn ? NODE_ACCESS : NODE_NONE; /* an empty set may be given a range later */
        return r;
    }
    default:
        return CUDA_SUCCESS;
    }
}

/* After the driver added node `node` to g. */
static CUresult node_added(ooc_access_t *a, const char *name, CUgraph g, CUgraphNode node,
                           const CUgraphNodeParams *p, node_kind_t kind, CUgraph child) {
    switch (kind) {
    case NODE_KERNEL:
        kernel_access(a, name, p->kernel.func, p->kernel.kern, p->kernel.kernelParams,
                      p->kernel.extra);
        return ooc_graph_node_added(g, node, a);
    case NODE_ACCESS:
        return ooc_graph_node_added(g, node, a);
    case NODE_NONE:
        return ooc_graph_node_added(g, node, NULL);
    case NODE_CHILD:
        return ooc_graph_child_added(g, child);
    default:
        return CUDA_SUCCESS;
    }
}

#define ADD_NODE(sym, pfn, PARAMS, ARGS)                                                           \
    CUresult ooc_hook_##sym PARAMS {                                                               \
        OOC_NEED_REAL(sym);                                                                        \
        if (!managing() || !p)                                                                     \
            return ooc_real.sym ARGS;                                                              \
        ooc_access_t a;                                                                            \
        node_kind_t kind;                                                                          \
        CUgraph child;                                                                             \
        ACCESS_OR_RETURN(node_before(&a, #sym, p, &kind, &child));                                 \
        CUresult r = ooc_real.sym ARGS;                                                            \
        return r == CUDA_SUCCESS ? node_added(&a, #sym, g, *node, p, kind, child) : r;             \
    }                                                                                              \
    OOC_EXPORT_HOOK(sym, pfn)

ADD_NODE(cuGraphAddNode, PFN_cuGraphAddNode_v12020,
         (CUgraphNode * node, CUgraph g, const CUgraphNode *deps, size_t n, CUgraphNodeParams *p),
         (node, g, deps, n, p));
ADD_NODE(cuGraphAddNode_v2, PFN_cuGraphAddNode_v12030,
         (CUgraphNode * node, CUgraph g, const CUgraphNode *deps, const CUgraphEdgeData *edges,
          size_t n, CUgraphNodeParams *p),
         (node, g, deps, edges, n, p));

/* cuGraphExecUpdate: after a successful update the executable graph touches what the source
 * graph does (graph.c); a refused one changes nothing. */
#define EXEC_UPDATE(sym, pfn, PARAMS, ARGS)                                                        \
    CUresult ooc_hook_##sym PARAMS {                                                               \
        OOC_NEED_REAL(sym);                                                                        \
        if (!managing())                                                                           \
            return ooc_real.sym ARGS;                                                              \
        ooc_graph_lock();                                                                          \
        ooc_graph_update_t *u;                                                                     \
        CUresult r = ooc_graph_update_prepare(g, &u);                                              \
        if (r == CUDA_SUCCESS) {                                                                   \
            r = ooc_real.sym ARGS;                                                                 \
            ooc_graph_update_done(u, e, r);                                                        \
        }                                                                                          \
        ooc_graph_unlock();                                                                        \
        return r;                                                                                  \
    }                                                                                              \
    OOC_EXPORT_HOOK(sym, pfn)

EXEC_UPDATE(cuGraphExecUpdate, PFN_cuGraphExecUpdate_v10020,
            (CUgraphExec e, CUgraph g, CUgraphNode *err, CUgraphExecUpdateResult *result),
            (e, g, err, result));
EXEC_UPDATE(cuGraphExecUpdate_v2, PFN_cuGraphExecUpdate_v12000,
            (CUgraphExec e, CUgraph g, CUgraphExecUpdateResultInfo *info), (e, g, info));

/* ---- parameters set after a node was added ------------------------------------------------
 *
 * In a graph (cuGraph*NodeSetParams): what the node touches is replaced in its graph (graph.c),
 * for instantiations from now on. In an executable graph (cuGraphExec*NodeSetParams): the
 * node's new access set replaces its earlier update there. As when a node is added, a copy's or
 * a set's access set is found (and a bad range refused) before the driver is asked, a kernel's
 * after it accepted; a call the driver refuses changes nothing. */

/* Hands a node's new access set to graph.c: of executable graph e, or of its graph when e is
 * NULL. Child-graph nodes and the types not learned are left as they were. */
static CUresult node_params_set(ooc_access_t *a, const char *name, CUgraphExec e, CUgraphNode node,
                                const CUgraphNodeParams *p, node_kind_t kind) {
    switch (kind) {
    case NODE_KERNEL:
        kernel_access(a, name, p->kernel.func, p->kernel.kern, p->kernel.kernelParams,
                      p->kernel.extra);
        break;
    case NODE_ACCESS:
        break;
    case NODE_NONE:
        a = NULL;
        break;
    default:
        return CUDA_SUCCESS;
    }
    return e ? ooc_graph_exec_node_params(e, node, a) : ooc_graph_node_params(node, a);
}

#define KERNEL_SET(sym, pfn, P, KERN)                                                              \
    CUresult ooc_hook_##sym(CUgraphNode node, const P *p) {                                        \
        OOC_NEED_REAL(sym);                                                                        \
        CUresult r = ooc_real.sym(node, p);                                                        \
        if (r != CUDA_SUCCESS || !managing() || !p)                                                \
            return r;                                                                              \
        ooc_access_t a;                                                                            \
        kernel_access(&a, #sym, p->func, KERN, p->kernelParams, p->extra);                         \
        return ooc_graph_node_params(node, &a);                                                    \
    }                                                                                              \
    OOC_EXPORT_HOOK(sym, pfn)

KERNEL_SET(cuGraphKernelNodeSetParams, PFN_cuGraphKernelNodeSetParams_v10000,
           CUDA_KERNEL_NODE_PARAMS_v1, NULL);
KERNEL_SET(cuGraphKernelNodeSetParams_v2, PFN_cuGraphKernelNodeSetParams_v12000,
           CUDA_KERNEL_NODE_PARAMS_v2, p->kern);

CUresult ooc_hook_cuGraphMemcpyNodeSetParams(CUgraphNode node, const CUDA_MEMCPY3D *p) {
    OOC_NEED_REAL(cuGraphMemcpyNodeSetParams);
    if (!managing() || !p)
        return ooc_real.cuGraphMemcpyNodeSetParams(node, p);
    ooc_access_t a;
    ACCESS_OR_RETURN(memcpy_access(&a, "cuGraphMemcpyNodeSetParams", p));
    CUresult r = ooc_real.cuGraphMemcpyNodeSetParams(node, p);
    return r == CUDA_SUCCESS ? ooc_graph_node_params(node, &a) : r;
}
OOC_EXPORT_HOOK(cuGraphMemcpyNodeSetParams, PFN_cuGraphMemcpyNodeSetParams_v10000);

CUresult ooc_hook_cuGraphMemsetNodeSetParams(CUgraphNode node, const CUDA_MEMSET_NODE_PARAMS *p) {
    OOC_NEED_REAL(cuGraphMemsetNodeSetParams);
    if (!managing() || !p)
        return ooc_real.cuGraphMemsetNodeSetParams(node, p);
    ooc_access_t a;
    int learn;
    ACCESS_OR_RETURN(memset_access(&a, "cuGraphMemsetNodeSetParams", p->dst, p->pitch,
                                   p->elementSize, p->width, p->height, &learn));
    CUresult r = ooc_real.cuGraphMemsetNodeSetParams(node, p);
    return r == CUDA_SUCCESS ? ooc_graph_node_params(node, learn ? &a : NULL) : r;
}
OOC_EXPORT_HOOK(cuGraphMemsetNodeSetParams, PFN_cuGraphMemsetNodeSetParams_v10000);

CUresult ooc_hook_cuGraphExecMemcpyNodeSetParams(CUgraphExec e, CUgraphNode node,
                                                 const CUDA_MEMCPY3D *p, CUcontext ctx) {
    OOC_NEED_REAL(cuGraphExecMemcpyNodeSetParams);
    if (!managing() || !p)
        return ooc_real.cuGraphExecMemcpyNodeSetParams(e, node, p, ctx);
    ooc_access_t a;
    ACCESS_OR_RETURN(memcpy_access(&a, "cuGraphExecMemcpyNodeSetParams", p));
    CUresult r = ooc_real.cuGraphExecMemcpyNodeSetParams(e, node, p, ctx);
    return r == CUDA_SUCCESS ? ooc_graph_exec_node_params(e, node, &a) : r;
}
OOC_EXPORT_HOOK(cuGraphExecMemcpyNodeSetParams, PFN_cuGraphExecMemcpyNodeSetParams_v10020);

CUresult ooc_hook_cuGraphExecMemsetNodeSetParams(CUgraphExec e, CUgraphNode node,
                                                 const CUDA_MEMSET_NODE_PARAMS *p, CUcontext ctx) {
    OOC_NEED_REAL(cuGraphExecMemsetNodeSetParams);
    if (!managing() || !p)
        return ooc_real.cuGraphExecMemsetNodeSetParams(e, node, p, ctx);
    ooc_access_t a;
    int learn;
    ACCESS_OR_RETURN(memset_access(&a, "cuGraphExecMemsetNodeSetParams", p->dst, p->pitch,
                                   p->elementSize, p->width, p->height, &learn));
    CUresult r = ooc_real.cuGraphExecMemsetNodeSetParams(e, node, p, ctx);
    return r == CUDA_SUCCESS ? ooc_graph_exec_node_params(e, node, learn ? &a : NULL) : r;
}
OOC_EXPORT_HOOK(cuGraphExecMemsetNodeSetParams, PFN_cuGraphExecMemsetNodeSetParams_v10020);

/* cuGraphNodeSetParams and cuGraphExecNodeSetParams: CUgraphNodeParams as for cuGraphAddNode;
 * kernel, memcpy and memset nodes learned, other types passed through. */
CUresult ooc_hook_cuGraphNodeSetParams(CUgraphNode node, CUgraphNodeParams *p) {
    OOC_NEED_REAL(cuGraphNodeSetParams);
    if (!managing() || !p)
        return ooc_real.cuGraphNodeSetParams(node, p);
    ooc_access_t a;
    node_kind_t kind;
    CUgraph child;
    ACCESS_OR_RETURN(node_before(&a, "cuGraphNodeSetParams", p, &kind, &child));
    CUresult r = ooc_real.cuGraphNodeSetParams(node, p);
    return r == CUDA_SUCCESS ? node_params_set(&a, "cuGraphNodeSetParams", NULL, node, p, kind) : r;
}
OOC_EXPORT_HOOK(cuGraphNodeSetParams, PFN_cuGraphNodeSetParams_v12020);

CUresult ooc_hook_cuGraphExecNodeSetParams(CUgraphExec e, CUgraphNode node, CUgraphNodeParams *p) {
    OOC_NEED_REAL(cuGraphExecNodeSetParams);
    if (!managing() || !p)
        return ooc_real.cuGraphExecNodeSetParams(e, node, p);
    ooc_access_t a;
    node_kind_t kind;
    CUgraph child;
    ACCESS_OR_RETURN(node_before(&a, "cuGraphExecNodeSetParams", p, &kind, &child));
    CUresult r = ooc_real.cuGraphExecNodeSetParams(e, node, p);
    return r == CUDA_SUCCESS ? node_params_set(&a, "cuGraphExecNodeSetParams", e, node, p, kind)
                             : r;
}
OOC_EXPORT_HOOK(cuGraphExecNodeSetParams, PFN_cuGraphExecNodeSetParams_v12020);
