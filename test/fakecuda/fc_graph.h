/* SPDX-License-Identifier: MIT */
/* fc_graph.h: what fc_graph.c (capture, instantiation, launch, exec updates) and fc_graphnode.c
 * (the explicit node API) share: the graph and node structures and their helpers. */
#ifndef FC_GRAPH_H
#define FC_GRAPH_H

#include "fc_internal.h"

#define FC_MAGIC_GRAPH 0x47524150u
#define FC_MAGIC_GNODE 0x474e4f44u

/* The shape of a memcpy node's (width in bytes, height, depth) or a memset node's (width in
 * elements, height, pitch, element size) parameters, which exec updates may not change: all zero
 * for a node made by stream capture, whose shape is not kept (not checked). */
typedef struct fc_dims {
    size_t width, height, depth, pitch;
    unsigned elem;
} fc_dims_t;

struct CUgraphNode_st {
    uint32_t magic;
    struct CUgraph_st *g;
    CUgraphNodeType type;
    fc_op_t *op;              /* the template it runs, NULL for child and empty nodes */
    struct CUgraph_st *child; /* CU_GRAPH_NODE_TYPE_GRAPH: its own copy of the child graph */
    struct CUgraphNode_st **deps;
    size_t ndeps;
    size_t idx;     /* position in g->nodes (creation order) */
    fc_dims_t dims; /* a memcpy or memset node's shape, as its parameters gave it */
};

struct CUgraph_st {
    uint32_t magic;
    int shape; /* an executable graph's copy of its graph's topology: no ops, not counted live */
    struct CUgraphNode_st **nodes;
    size_t n, cap;
};

typedef struct CUgraphNode_st fc_node_t;
typedef struct CUgraph_st fc_graph_t;

static inline fc_graph_t *graph_of(CUgraph g) {
    return (g && g->magic == FC_MAGIC_GRAPH) ? g : NULL;
}

static inline fc_node_t *node_of(CUgraphNode n) {
    return (n && n->magic == FC_MAGIC_GNODE) ? n : NULL;
}

/* ---- fc_graph.c ---- */
FC_HIDDEN fc_graph_t *fc_graph_new(void);
FC_HIDDEN void fc_graph_free(fc_graph_t *g);
/* A deep copy of g (each op a fresh template), for a child-graph node. NULL when out of memory. */
FC_HIDDEN fc_graph_t *fc_graph_clone(const fc_graph_t *g);
/* Checks a dependency list for a new node of g: each a node of g, none twice. */
FC_HIDDEN CUresult fc_graph_check_deps(fc_graph_t *g, const CUgraphNode *deps, size_t n);
/* Adds a node to g after the (checked) dependencies; takes ownership of op and child, also on
 * failure. Returns the node or NULL (out of memory). */
FC_HIDDEN fc_node_t *fc_graph_node_add(fc_graph_t *g, CUgraphNodeType type, fc_op_t *op,
                                       fc_graph_t *child, const CUgraphNode *deps, size_t ndeps);

/* Gives node hn of executable graph he the op `op` (taken, also on failure), made from new
 * parameters of shape `dims` for a node of type `type`: hn must be a node of that type of the
 * graph he was instantiated from (not inside a child graph), and a memcpy or memset node keeps the
 * limits cuda.h sets (1-dimensional copies, a memset's height and a 2D memset's shape unchanged,
 * no empty op): CUDA_ERROR_INVALID_VALUE otherwise. Launches already queued keep their ops. */
FC_HIDDEN CUresult fc_graph_exec_set(CUgraphExec he, CUgraphNode hn, CUgraphNodeType type,
                                     fc_op_t *op, fc_dims_t dims);

/* ---- fc_graphnode.c ---- */
/* The op of a kernel node's parameters (a template), or the launch's error. */
FC_HIDDEN CUresult fc_graph_kernel_op(const CUDA_KERNEL_NODE_PARAMS *p, fc_op_t **op);
/* CUDA 10's kernel node parameters in CUDA 12's layout. */
FC_HIDDEN CUDA_KERNEL_NODE_PARAMS fc_graph_kernel_v1(const CUDA_KERNEL_NODE_PARAMS_v1 *p);

#endif
