/* SPDX-License-Identifier: MIT */
/* graphnode.c: the hooks of graphs built node by node (the explicit graph API XLA uses): each
 * node's access set, found as for the operation it stands for (a kernel's parameter scan and TMA
 * descriptors, a copy's or a set's ranges), goes to graph.c once the driver has added the node;
 * an executable graph's kernel node given new parameters is learned again. A call the driver
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
        return ooc_graph_node_added(g, &a);                                                        \
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

CUresult ooc_hook_cuGraphAddMemcpyNode(CUgraphNode *node, CUgraph g, const CUgraphNode *deps,
                                       size_t n, const CUDA_MEMCPY3D *p, CUcontext ctx) {
    OOC_NEED_REAL(cuGraphAddMemcpyNode);
    if (!managing() || !p)
        return ooc_real.cuGraphAddMemcpyNode(node, g, deps, n, p, ctx);
    ooc_access_t a;
    op_start(&a, OOC_OP_MEMCPY, "cuGraphAddMemcpyNode", 0);
    ACCESS_OR_RETURN(ooc_copy3d_access(&a, "cuGraphAddMemcpyNode", p));
    CUresult r = ooc_real.cuGraphAddMemcpyNode(node, g, deps, n, p, ctx);
    return r == CUDA_SUCCESS ? ooc_graph_node_added(g, &a) : r;
}
OOC_EXPORT_HOOK(cuGraphAddMemcpyNode, PFN_cuGraphAddMemcpyNode_v10000);

CUresult ooc_hook_cuGraphAddMemsetNode(CUgraphNode *node, CUgraph g, const CUgraphNode *deps,
                                       size_t n, const CUDA_MEMSET_NODE_PARAMS *p, CUcontext ctx) {
    OOC_NEED_REAL(cuGraphAddMemsetNode);
    if (!managing() || !p || !p->width || !p->height)
        return ooc_real.cuGraphAddMemsetNode(node, g, deps, n, p, ctx);
    size_t span, row;
    if (__builtin_mul_overflow(p->height - 1, p->pitch, &span) ||
        __builtin_mul_overflow(p->width, (size_t)p->elementSize, &row) ||
        __builtin_add_overflow(span, row, &span))
        return CUDA_ERROR_INVALID_VALUE;
    ACCESS_OR_RETURN(ooc_mem_check_range("cuGraphAddMemsetNode", (uintptr_t)p->dst, span));
    ooc_access_t a;
    op_start(&a, OOC_OP_MEMSET, "cuGraphAddMemsetNode", p->width * p->height * p->elementSize);
    unsigned use = (p->height == 1 || p->pitch == row) ? OOC_USE_W : OOC_USE_RW;
    ooc_mem_note_range(&a, (uintptr_t)p->dst, span, use);
    CUresult r = ooc_real.cuGraphAddMemsetNode(node, g, deps, n, p, ctx);
    return r == CUDA_SUCCESS ? ooc_graph_node_added(g, &a) : r;
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
