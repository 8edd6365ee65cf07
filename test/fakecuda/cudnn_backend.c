/* SPDX-License-Identifier: MIT */
/* cudnn_backend.c: the simulated cuDNN's backend (graph) API, for one convolution forward.
 *
 * Exports, with the prototypes of cudnn_graph.h, cudnnBackendCreateDescriptor, -Destroy-,
 * -Initialize, -Finalize, -SetAttribute, -GetAttribute and -Execute for the descriptors a
 * convolution forward needs: tensor, convolution, convolution-forward operation, operation
 * graph (one operation), engine (global index 0), engine config, execution plan and variant
 * pack. Only float, 4-d, fully packed NCHW tensors, 2 spatial dimensions and symmetric padding
 * are supported; anything else is CUDNN_STATUS_NOT_SUPPORTED (at finalize, as engines refuse
 * a graph). A wrong attribute type, count or value, or an attribute of another descriptor, is
 * CUDNN_STATUS_BAD_PARAM; setting a finalized descriptor, or reading or executing an
 * unfinalized one, is CUDNN_STATUS_NOT_INITIALIZED. A variant pack's attributes cannot be read
 * back (CUDNN_STATUS_NOT_SUPPORTED), as on the real library.
 *
 * A descriptor set as another's attribute is copied there (it must be finalized then), so the
 * caller may destroy it at once; reading such an attribute back copies into descriptors the
 * caller created, as the real library fills them.
 *
 * Strictness, on purpose: the plan asks for a workspace (FC_CONV_TABLE_BYTES), and
 * cudnnBackendExecute copies the operand table (x, w, y, geometry, alpha, beta; fc_cudnn.h)
 * into it with cuMemcpyHtoDAsync on the handle's stream (pageable memory, staged by the driver
 * at the call), then launches conv_fwd_table_f32 whose only parameter is the workspace. The
 * kernel finds the operands through the table in device memory, so a tool that scans launch
 * parameters sees only the workspace; only a hook on cudnnBackendExecute, which reads the
 * variant pack, can make the operands resident. Two ops per execution. Descriptors are not
 * thread-safe, as in the real library. */
#include "cudnn_internal.h"

#include <stdlib.h>
#include <string.h>

#define BK_MAGIC     0x444e4e42u /* tells our descriptors from stray pointers */
#define MAX_DIMS     8
#define MAX_VARIANTS 16

typedef struct bk_tensor {
    cudnnDataType_t dtype;
    int64_t ndims, dims[MAX_DIMS], nstrides, strides[MAX_DIMS];
    int64_t uid, align;
} bk_tensor_t;

typedef struct bk_conv {
    cudnnDataType_t comp;
    cudnnConvolutionMode_t mode;
    int64_t spatial;
    int64_t dil[2], str[2], pre[2], post[2];
} bk_conv_t;

typedef struct bk_op {
    bk_tensor_t x, w, y;
    bk_conv_t conv;
    float alpha, beta;
    fc_conv_geom_t geom; /* computed at finalize */
} bk_op_t;

typedef struct bk_graph {
    bk_op_t op;
    cudnnHandle_t handle;
} bk_graph_t;

typedef struct bk_engine {
    bk_graph_t graph;
    int64_t index;
} bk_engine_t;

typedef struct bk_cfg {
    bk_engine_t engine;
} bk_cfg_t;

typedef struct bk_plan {
    bk_cfg_t cfg;
    cudnnHandle_t handle;
} bk_plan_t;

typedef struct bk_pack {
    int64_t nids, ids[MAX_VARIANTS], nptrs;
    void *ptrs[MAX_VARIANTS];
    void *workspace;
} bk_pack_t;

/* Bits of `set`: which attributes were given (bit = attribute name - family base). */
typedef struct bk_desc {
    uint32_t magic;
    cudnnBackendDescriptorType_t type;
    int finalized;
    uint64_t set;
    union {
        bk_tensor_t t;
        bk_conv_t cv;
        bk_op_t op;
        bk_graph_t g;
        bk_engine_t e;
        bk_cfg_t cfg;
        bk_plan_t plan;
        bk_pack_t pack;
    } u;
} bk_desc_t;

/* The attribute names of a supported type: [lo, hi), the range its family of names occupies in
 * cudnn_graph.h, cut at 64 names (one bit each in `set`). -1 for an unsupported type. */
static int family(cudnnBackendDescriptorType_t type, int *lo, int *hi) {
    switch (type) {
    case CUDNN_BACKEND_TENSOR_DESCRIPTOR:
        *lo = 900, *hi = 900 + 64;
        return 0;
    case CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR:
        *lo = 100, *hi = 100 + 64;
        return 0;
    case CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR:
        *lo = 700, *hi = 706; /* 706 on: the backward operations' */
        return 0;
    case CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR:
        *lo = 800, *hi = 800 + 64;
        return 0;
    case CUDNN_BACKEND_ENGINE_DESCRIPTOR:
        *lo = 1300, *hi = 1300 + 64;
        return 0;
    case CUDNN_BACKEND_ENGINECFG_DESCRIPTOR:
        *lo = 300, *hi = 300 + 64;
        return 0;
    case CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR:
        *lo = 400, *hi = 400 + 64;
        return 0;
    case CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR:
        *lo = 1000, *hi = 1000 + 64;
        return 0;
    default:
        return -1;
    }
}

static bk_desc_t *desc_of(cudnnBackendDescriptor_t d) {
    bk_desc_t *b = d;
    return b && b->magic == BK_MAGIC ? b : NULL;
}

/* Creates an empty descriptor of a supported type; any other type is NOT_SUPPORTED (the real
 * library has more, this one simulates a convolution forward only). The caller owns it
 * (cudnnBackendDestroyDescriptor). */
DNN_API cudnnStatus_t cudnnBackendCreateDescriptor(cudnnBackendDescriptorType_t descriptorType,
                                                   cudnnBackendDescriptor_t *descriptor) {
    int lo, hi;
    if (!descriptor)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    if (family(descriptorType, &lo, &hi))
        return CUDNN_STATUS_NOT_SUPPORTED;
    bk_desc_t *b = calloc(1, sizeof *b);
    if (!b)
        return CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED;
    b->magic = BK_MAGIC;
    b->type = descriptorType;
    *descriptor = b;
    return CUDNN_STATUS_SUCCESS;
}

DNN_API cudnnStatus_t cudnnBackendDestroyDescriptor(cudnnBackendDescriptor_t descriptor) {
    bk_desc_t *b = desc_of(descriptor);
    if (!b)
        return CUDNN_STATUS_BAD_PARAM;
    b->magic = 0;
    free(b);
    return CUDNN_STATUS_SUCCESS;
}

/* Returns the descriptor to its created state: no attributes, not finalized. */
DNN_API cudnnStatus_t cudnnBackendInitialize(cudnnBackendDescriptor_t descriptor) {
    bk_desc_t *b = desc_of(descriptor);
    if (!b)
        return CUDNN_STATUS_BAD_PARAM;
    b->finalized = 0;
    b->set = 0;
    memset(&b->u, 0, sizeof b->u);
    return CUDNN_STATUS_SUCCESS;
}

/* ---- setting attributes -------------------------------------------------------------------- */

/* BAD_PARAM unless the caller's type is `want` and its count is in [lo, hi]. */
static cudnnStatus_t expect(cudnnBackendAttributeType_t type, int64_t count,
                            cudnnBackendAttributeType_t want, int64_t lo, int64_t hi) {
    return type == want && count >= lo && count <= hi ? CUDNN_STATUS_SUCCESS
                                                      : CUDNN_STATUS_BAD_PARAM;
}

/* Element i of a BACKEND_DESCRIPTOR array, which must be a finalized descriptor of `type`. */
static const bk_desc_t *sub(const void *arr, int64_t i, cudnnBackendDescriptorType_t type) {
    const bk_desc_t *d = desc_of(((cudnnBackendDescriptor_t const *)arr)[i]);
    return d && d->type == type && d->finalized ? d : NULL;
}

/* A FLOAT or DOUBLE scalar, as the real library takes alpha and beta. */
static cudnnStatus_t scalar(cudnnBackendAttributeType_t type, int64_t count, const void *arr,
                            float *out) {
    if (count != 1)
        return CUDNN_STATUS_BAD_PARAM;
    if (type == CUDNN_TYPE_FLOAT)
        *out = *(const float *)arr;
    else if (type == CUDNN_TYPE_DOUBLE)
        *out = (float)*(const double *)arr;
    else
        return CUDNN_STATUS_BAD_PARAM;
    return CUDNN_STATUS_SUCCESS;
}

static cudnnStatus_t set_tensor(bk_tensor_t *t, cudnnBackendAttributeName_t name,
                                cudnnBackendAttributeType_t type, int64_t n, const void *arr) {
    cudnnStatus_t st;
    switch (name) {
    case CUDNN_ATTR_TENSOR_DATA_TYPE:
        if (!(st = expect(type, n, CUDNN_TYPE_DATA_TYPE, 1, 1)))
            t->dtype = *(const cudnnDataType_t *)arr;
        return st;
    case CUDNN_ATTR_TENSOR_DIMENSIONS:
        if (!(st = expect(type, n, CUDNN_TYPE_INT64, 1, MAX_DIMS)))
            memcpy(t->dims, arr, (size_t)n * sizeof(int64_t)), t->ndims = n;
        return st;
    case CUDNN_ATTR_TENSOR_STRIDES:
        if (!(st = expect(type, n, CUDNN_TYPE_INT64, 1, MAX_DIMS)))
            memcpy(t->strides, arr, (size_t)n * sizeof(int64_t)), t->nstrides = n;
        return st;
    case CUDNN_ATTR_TENSOR_UNIQUE_ID:
        if (!(st = expect(type, n, CUDNN_TYPE_INT64, 1, 1)))
            t->uid = *(const int64_t *)arr;
        return st;
    case CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT:
        if (!(st = expect(type, n, CUDNN_TYPE_INT64, 1, 1)))
            t->align = *(const int64_t *)arr;
        return st;
    default:
        return CUDNN_STATUS_NOT_SUPPORTED;
    }
}

static cudnnStatus_t set_pair(int64_t *dst, cudnnBackendAttributeType_t type, int64_t n,
                              const void *arr) {
    cudnnStatus_t st = expect(type, n, CUDNN_TYPE_INT64, 2, 2);
    if (!st)
        memcpy(dst, arr, 2 * sizeof(int64_t));
    return st;
}

static cudnnStatus_t set_conv(bk_conv_t *c, cudnnBackendAttributeName_t name,
                              cudnnBackendAttributeType_t type, int64_t n, const void *arr) {
    cudnnStatus_t st;
    switch (name) {
    case CUDNN_ATTR_CONVOLUTION_COMP_TYPE:
        if (!(st = expect(type, n, CUDNN_TYPE_DATA_TYPE, 1, 1)))
            c->comp = *(const cudnnDataType_t *)arr;
        return st;
    case CUDNN_ATTR_CONVOLUTION_CONV_MODE:
        if (!(st = expect(type, n, CUDNN_TYPE_CONVOLUTION_MODE, 1, 1)))
            c->mode = *(const cudnnConvolutionMode_t *)arr;
        return st;
    case CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS:
        if (!(st = expect(type, n, CUDNN_TYPE_INT64, 1, 1)))
            c->spatial = *(const int64_t *)arr;
        return st;
    case CUDNN_ATTR_CONVOLUTION_DILATIONS:
        return set_pair(c->dil, type, n, arr);
    case CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES:
        return set_pair(c->str, type, n, arr);
    case CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS:
        return set_pair(c->pre, type, n, arr);
    case CUDNN_ATTR_CONVOLUTION_POST_PADDINGS:
        return set_pair(c->post, type, n, arr);
    default:
        return CUDNN_STATUS_NOT_SUPPORTED;
    }
}

static cudnnStatus_t set_op(bk_op_t *o, cudnnBackendAttributeName_t name,
                            cudnnBackendAttributeType_t type, int64_t n, const void *arr) {
    cudnnStatus_t st;
    const bk_desc_t *d;
    switch (name) {
    case CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA:
        return scalar(type, n, arr, &o->alpha);
    case CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA:
        return scalar(type, n, arr, &o->beta);
    case CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC:
        if ((st = expect(type, n, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, 1)))
            return st;
        if (!(d = sub(arr, 0, CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR)))
            return CUDNN_STATUS_BAD_PARAM;
        o->conv = d->u.cv;
        return CUDNN_STATUS_SUCCESS;
    case CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W:
    case CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X:
    case CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y:
        if ((st = expect(type, n, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, 1)))
            return st;
        if (!(d = sub(arr, 0, CUDNN_BACKEND_TENSOR_DESCRIPTOR)))
            return CUDNN_STATUS_BAD_PARAM;
        *(name == CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W   ? &o->w
          : name == CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X ? &o->x
                                                               : &o->y) = d->u.t;
        return CUDNN_STATUS_SUCCESS;
    default:
        return CUDNN_STATUS_NOT_SUPPORTED;
    }
}

static cudnnStatus_t set_handle(cudnnHandle_t *dst, cudnnBackendAttributeType_t type, int64_t n,
                                const void *arr) {
    cudnnStatus_t st = expect(type, n, CUDNN_TYPE_HANDLE, 1, 1);
    if (st)
        return st;
    if (!(*dst = *(const cudnnHandle_t *)arr))
        return CUDNN_STATUS_BAD_PARAM;
    return CUDNN_STATUS_SUCCESS;
}

/* One descriptor-valued attribute: copies the finalized descriptor's contents to dst. */
static cudnnStatus_t set_sub(void *dst, size_t bytes, cudnnBackendDescriptorType_t want,
                             cudnnBackendAttributeType_t type, int64_t n, const void *arr) {
    cudnnStatus_t st = expect(type, n, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, 1);
    if (st)
        return st;
    const bk_desc_t *d = sub(arr, 0, want);
    if (!d)
        return CUDNN_STATUS_BAD_PARAM;
    memcpy(dst, &d->u, bytes);
    return CUDNN_STATUS_SUCCESS;
}

static cudnnStatus_t set_rest(bk_desc_t *b, cudnnBackendAttributeName_t name,
                              cudnnBackendAttributeType_t type, int64_t n, const void *arr) {
    cudnnStatus_t st;
    switch ((int)name) {
    case CUDNN_ATTR_OPERATIONGRAPH_HANDLE:
        return set_handle(&b->u.g.handle, type, n, arr);
    case CUDNN_ATTR_OPERATIONGRAPH_OPS:
        /* One operation: a longer graph is a pattern no engine here runs. */
        if (type != CUDNN_TYPE_BACKEND_DESCRIPTOR || n < 1)
            return CUDNN_STATUS_BAD_PARAM;
        if (n > 1)
            return CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN;
        return set_sub(&b->u.g.op, sizeof b->u.g.op,
                       CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR, type, n, arr);
    case CUDNN_ATTR_ENGINE_OPERATION_GRAPH:
        return set_sub(&b->u.e.graph, sizeof b->u.e.graph, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR,
                       type, n, arr);
    case CUDNN_ATTR_ENGINE_GLOBAL_INDEX:
        if (!(st = expect(type, n, CUDNN_TYPE_INT64, 1, 1)))
            b->u.e.index = *(const int64_t *)arr;
        return st;
    case CUDNN_ATTR_ENGINECFG_ENGINE:
        return set_sub(&b->u.cfg.engine, sizeof b->u.cfg.engine, CUDNN_BACKEND_ENGINE_DESCRIPTOR,
                       type, n, arr);
    case CUDNN_ATTR_EXECUTION_PLAN_HANDLE:
        return set_handle(&b->u.plan.handle, type, n, arr);
    case CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG:
        return set_sub(&b->u.plan.cfg, sizeof b->u.plan.cfg, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR,
                       type, n, arr);
    case CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS:
        if (!(st = expect(type, n, CUDNN_TYPE_INT64, 0, MAX_VARIANTS)) && n > 0)
            memcpy(b->u.pack.ids, arr, (size_t)n * sizeof(int64_t));
        if (!st)
            b->u.pack.nids = n;
        return st;
    case CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS:
        if (!(st = expect(type, n, CUDNN_TYPE_VOID_PTR, 0, MAX_VARIANTS)) && n > 0)
            memcpy(b->u.pack.ptrs, arr, (size_t)n * sizeof(void *));
        if (!st)
            b->u.pack.nptrs = n;
        return st;
    case CUDNN_ATTR_VARIANT_PACK_WORKSPACE:
        if (!(st = expect(type, n, CUDNN_TYPE_VOID_PTR, 1, 1)))
            b->u.pack.workspace = *(void *const *)arr;
        return st;
    default:
        return CUDNN_STATUS_NOT_SUPPORTED;
    }
}

/* Sets one attribute of an unfinalized descriptor. The values are copied; arrayOfElements may
 * be reused at once. */
DNN_API cudnnStatus_t cudnnBackendSetAttribute(cudnnBackendDescriptor_t descriptor,
                                               cudnnBackendAttributeName_t attributeName,
                                               cudnnBackendAttributeType_t attributeType,
                                               int64_t elementCount, const void *arrayOfElements) {
    bk_desc_t *b = desc_of(descriptor);
    int lo, hi;
    if (!descriptor)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    if (!b || family(b->type, &lo, &hi) || (int)attributeName < lo || (int)attributeName >= hi ||
        elementCount < 0)
        return CUDNN_STATUS_BAD_PARAM;
    if (b->finalized)
        return CUDNN_STATUS_NOT_INITIALIZED;
    if (!arrayOfElements && elementCount > 0)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    cudnnStatus_t st;
    switch (b->type) {
    case CUDNN_BACKEND_TENSOR_DESCRIPTOR:
        st = set_tensor(&b->u.t, attributeName, attributeType, elementCount, arrayOfElements);
        break;
    case CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR:
        st = set_conv(&b->u.cv, attributeName, attributeType, elementCount, arrayOfElements);
        break;
    case CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR:
        st = set_op(&b->u.op, attributeName, attributeType, elementCount, arrayOfElements);
        break;
    default:
        st = set_rest(b, attributeName, attributeType, elementCount, arrayOfElements);
        break;
    }
    if (st == CUDNN_STATUS_SUCCESS)
        b->set |= 1ull << ((int)attributeName - lo);
    return st;
}

/* ---- finalizing ---------------------------------------------------------------------------- */

static int has(const bk_desc_t *b, int lo, int name) {
    return (b->set >> (name - lo)) & 1;
}

static cudnnStatus_t finalize_tensor(const bk_tensor_t *t) {
    if (t->ndims != 4 || t->nstrides != 4)
        return t->ndims == t->nstrides ? CUDNN_STATUS_NOT_SUPPORTED_SHAPE : CUDNN_STATUS_BAD_PARAM;
    for (int i = 0; i < 4; i++)
        if (t->dims[i] <= 0 || t->dims[i] > INT32_MAX)
            return CUDNN_STATUS_BAD_PARAM;
    if (t->align <= 0)
        return CUDNN_STATUS_BAD_PARAM;
    if (t->dtype != CUDNN_DATA_FLOAT)
        return CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE;
    const int64_t *d = t->dims, *s = t->strides;
    int64_t elems = 1;
    for (int i = 0; i < 4; i++) /* the kernels index with int extents and size_t offsets */
        if (__builtin_mul_overflow(elems, d[i], &elems) || elems > INT32_MAX)
            return CUDNN_STATUS_NOT_SUPPORTED_SHAPE;
    if (s[3] != 1 || s[2] != d[3] || s[1] != d[2] * d[3] || s[0] != d[1] * d[2] * d[3])
        return CUDNN_STATUS_NOT_SUPPORTED_LAYOUT;
    return CUDNN_STATUS_SUCCESS;
}

static cudnnStatus_t finalize_conv(const bk_conv_t *c) {
    if (c->spatial != 2)
        return c->spatial > 0 ? CUDNN_STATUS_NOT_SUPPORTED_SHAPE : CUDNN_STATUS_BAD_PARAM;
    if (c->mode != CUDNN_CONVOLUTION && c->mode != CUDNN_CROSS_CORRELATION)
        return CUDNN_STATUS_BAD_PARAM;
    for (int i = 0; i < 2; i++)
        if (c->dil[i] <= 0 || c->str[i] <= 0 || c->pre[i] < 0 || c->post[i] < 0 ||
            c->dil[i] > INT32_MAX || c->str[i] > INT32_MAX || c->pre[i] > INT32_MAX)
            return CUDNN_STATUS_BAD_PARAM;
    if (c->pre[0] != c->post[0] || c->pre[1] != c->post[1])
        return CUDNN_STATUS_NOT_SUPPORTED_PADDING;
    if (c->comp != CUDNN_DATA_FLOAT)
        return CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE;
    return CUDNN_STATUS_SUCCESS;
}

/* Checks that x (*) w = y agree and computes the kernel's geometry. */
static cudnnStatus_t finalize_op(bk_op_t *o) {
    const int64_t *x = o->x.dims, *w = o->w.dims, *y = o->y.dims;
    const bk_conv_t *c = &o->conv;
    if (o->x.uid == o->w.uid || o->x.uid == o->y.uid || o->w.uid == o->y.uid)
        return CUDNN_STATUS_BAD_PARAM_DUPLICATED_ENTRIES;
    int p = dnn_out_dim((int)x[2], (int)c->pre[0], (int)w[2], (int)c->dil[0], (int)c->str[0]);
    int q = dnn_out_dim((int)x[3], (int)c->pre[1], (int)w[3], (int)c->dil[1], (int)c->str[1]);
    if (x[1] != w[1] || y[0] != x[0] || y[1] != w[0] || y[2] != p || y[3] != q || p <= 0 || q <= 0)
        return CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH;
    o->geom = (fc_conv_geom_t){.n = (int)x[0],
                               .c = (int)x[1],
                               .h = (int)x[2],
                               .w = (int)x[3],
                               .k = (int)w[0],
                               .r = (int)w[2],
                               .s = (int)w[3],
                               .p = p,
                               .q = q,
                               .pad_h = (int)c->pre[0],
                               .pad_w = (int)c->pre[1],
                               .str_h = (int)c->str[0],
                               .str_w = (int)c->str[1],
                               .dil_h = (int)c->dil[0],
                               .dil_w = (int)c->dil[1],
                               .cross = c->mode == CUDNN_CROSS_CORRELATION};
    return CUDNN_STATUS_SUCCESS;
}

/* The attributes each type requires, as bits of `set`. */
static uint64_t required(cudnnBackendDescriptorType_t type, int lo) {
#define A(name) (1ull << ((name)-lo))
    switch (type) {
    case CUDNN_BACKEND_TENSOR_DESCRIPTOR:
        return A(CUDNN_ATTR_TENSOR_DATA_TYPE) | A(CUDNN_ATTR_TENSOR_DIMENSIONS) |
               A(CUDNN_ATTR_TENSOR_STRIDES) | A(CUDNN_ATTR_TENSOR_UNIQUE_ID) |
               A(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT);
    case CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR:
        return A(CUDNN_ATTR_CONVOLUTION_COMP_TYPE) | A(CUDNN_ATTR_CONVOLUTION_CONV_MODE) |
               A(CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS) | A(CUDNN_ATTR_CONVOLUTION_DILATIONS) |
               A(CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES) | A(CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS) |
               A(CUDNN_ATTR_CONVOLUTION_POST_PADDINGS);
    case CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR:
        return A(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X) |
               A(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W) |
               A(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y) |
               A(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC);
    case CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR:
        return A(CUDNN_ATTR_OPERATIONGRAPH_HANDLE) | A(CUDNN_ATTR_OPERATIONGRAPH_OPS);
    case CUDNN_BACKEND_ENGINE_DESCRIPTOR:
        return A(CUDNN_ATTR_ENGINE_OPERATION_GRAPH) | A(CUDNN_ATTR_ENGINE_GLOBAL_INDEX);
    case CUDNN_BACKEND_ENGINECFG_DESCRIPTOR:
        return A(CUDNN_ATTR_ENGINECFG_ENGINE);
    case CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR:
        return A(CUDNN_ATTR_EXECUTION_PLAN_HANDLE) | A(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG);
    default: /* the variant pack: every attribute may be left out until execution */
        return 0;
    }
#undef A
}

/* Checks the attributes together and freezes the descriptor: it can then be read, executed and
 * set as another's attribute, and no longer set. A missing or inconsistent attribute is
 * BAD_PARAM; a valid problem this simulation does not run is NOT_SUPPORTED. */
DNN_API cudnnStatus_t cudnnBackendFinalize(cudnnBackendDescriptor_t descriptor) {
    bk_desc_t *b = desc_of(descriptor);
    int lo, hi;
    if (!descriptor)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    if (!b || family(b->type, &lo, &hi))
        return CUDNN_STATUS_BAD_PARAM;
    if (b->finalized)
        return CUDNN_STATUS_BAD_PARAM;
    uint64_t need = required(b->type, lo);
    if ((b->set & need) != need)
        return CUDNN_STATUS_BAD_PARAM;
    cudnnStatus_t st = CUDNN_STATUS_SUCCESS;
    switch (b->type) {
    case CUDNN_BACKEND_TENSOR_DESCRIPTOR:
        st = finalize_tensor(&b->u.t);
        break;
    case CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR:
        st = finalize_conv(&b->u.cv);
        break;
    case CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR:
        if (!has(b, lo, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA))
            b->u.op.alpha = 1.0f;
        if (!has(b, lo, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA))
            b->u.op.beta = 0.0f;
        st = finalize_op(&b->u.op);
        break;
    case CUDNN_BACKEND_ENGINE_DESCRIPTOR:
        /* The graph has one engine (OPERATIONGRAPH_ENGINE_GLOBAL_COUNT is 1). */
        if (b->u.e.index != 0)
            st = CUDNN_STATUS_BAD_PARAM_OUT_OF_BOUND;
        break;
    case CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR:
        if (b->u.pack.nids != b->u.pack.nptrs)
            st = CUDNN_STATUS_BAD_PARAM;
        break;
    default:
        break;
    }
    if (st == CUDNN_STATUS_SUCCESS)
        b->finalized = 1;
    return st;
}

/* ---- reading attributes -------------------------------------------------------------------- */

/* Answers an attribute of `have` elements of `bytes` each: the count always, and the first
 * min(requested, have) elements when the caller gave an array. */
static cudnnStatus_t put(cudnnBackendAttributeType_t type, cudnnBackendAttributeType_t want,
                         const void *vals, int64_t have, size_t bytes, int64_t requested,
                         int64_t *count, void *arr) {
    if (type != want || requested < 0)
        return CUDNN_STATUS_BAD_PARAM;
    if (!count && !arr)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    if (count)
        *count = have;
    if (arr && requested > 0 && have > 0)
        memcpy(arr, vals, (size_t)(requested < have ? requested : have) * bytes);
    return CUDNN_STATUS_SUCCESS;
}

#define PUT_I64(vals, n)                                                                           \
    put(type, CUDNN_TYPE_INT64, (vals), (n), sizeof(int64_t), requested, count, arr)

/* Fills the caller's descriptor arr[0] (created with `want`) with a copy of src. */
static cudnnStatus_t put_sub(cudnnBackendDescriptorType_t want, const void *src, size_t bytes,
                             cudnnBackendAttributeType_t type, int64_t requested, int64_t *count,
                             void *arr) {
    int lo, hi;
    if (type != CUDNN_TYPE_BACKEND_DESCRIPTOR || requested < 0)
        return CUDNN_STATUS_BAD_PARAM;
    if (count)
        *count = 1;
    if (!arr || requested == 0)
        return count ? CUDNN_STATUS_SUCCESS : CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    bk_desc_t *d = desc_of(((cudnnBackendDescriptor_t *)arr)[0]);
    if (!d || d->type != want || family(want, &lo, &hi))
        return CUDNN_STATUS_BAD_PARAM;
    memset(&d->u, 0, sizeof d->u);
    memcpy(&d->u, src, bytes);
    d->set = required(want, lo);
    d->finalized = 1;
    return CUDNN_STATUS_SUCCESS;
}

static cudnnStatus_t get_tensor(const bk_tensor_t *t, cudnnBackendAttributeName_t name,
                                cudnnBackendAttributeType_t type, int64_t requested, int64_t *count,
                                void *arr) {
    switch (name) {
    case CUDNN_ATTR_TENSOR_DATA_TYPE:
        return put(type, CUDNN_TYPE_DATA_TYPE, &t->dtype, 1, sizeof t->dtype, requested, count,
                   arr);
    case CUDNN_ATTR_TENSOR_DIMENSIONS:
        return PUT_I64(t->dims, t->ndims);
    case CUDNN_ATTR_TENSOR_STRIDES:
        return PUT_I64(t->strides, t->nstrides);
    case CUDNN_ATTR_TENSOR_UNIQUE_ID:
        return PUT_I64(&t->uid, 1);
    case CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT:
        return PUT_I64(&t->align, 1);
    default:
        return CUDNN_STATUS_NOT_SUPPORTED;
    }
}

static cudnnStatus_t get_conv(const bk_conv_t *c, cudnnBackendAttributeName_t name,
                              cudnnBackendAttributeType_t type, int64_t requested, int64_t *count,
                              void *arr) {
    switch (name) {
    case CUDNN_ATTR_CONVOLUTION_COMP_TYPE:
        return put(type, CUDNN_TYPE_DATA_TYPE, &c->comp, 1, sizeof c->comp, requested, count, arr);
    case CUDNN_ATTR_CONVOLUTION_CONV_MODE:
        return put(type, CUDNN_TYPE_CONVOLUTION_MODE, &c->mode, 1, sizeof c->mode, requested, count,
                   arr);
    case CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS:
        return PUT_I64(&c->spatial, 1);
    case CUDNN_ATTR_CONVOLUTION_DILATIONS:
        return PUT_I64(c->dil, 2);
    case CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES:
        return PUT_I64(c->str, 2);
    case CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS:
        return PUT_I64(c->pre, 2);
    case CUDNN_ATTR_CONVOLUTION_POST_PADDINGS:
        return PUT_I64(c->post, 2);
    default:
        return CUDNN_STATUS_NOT_SUPPORTED;
    }
}

static cudnnStatus_t get_rest(const bk_desc_t *b, cudnnBackendAttributeName_t name,
                              cudnnBackendAttributeType_t type, int64_t requested, int64_t *count,
                              void *arr) {
    static const int64_t one = 1, ws_bytes = FC_CONV_TABLE_BYTES;
    const bk_op_t *o = &b->u.op;
    switch ((int)name) {
    case CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA:
    case CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA:
        return put(type, CUDNN_TYPE_FLOAT,
                   name == CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA ? &o->alpha : &o->beta, 1,
                   sizeof(float), requested, count, arr);
    case CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X:
        return put_sub(CUDNN_BACKEND_TENSOR_DESCRIPTOR, &o->x, sizeof o->x, type, requested, count,
                       arr);
    case CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W:
        return put_sub(CUDNN_BACKEND_TENSOR_DESCRIPTOR, &o->w, sizeof o->w, type, requested, count,
                       arr);
    case CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y:
        return put_sub(CUDNN_BACKEND_TENSOR_DESCRIPTOR, &o->y, sizeof o->y, type, requested, count,
                       arr);
    case CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC:
        return put_sub(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR, &o->conv, sizeof o->conv, type,
                       requested, count, arr);
    case CUDNN_ATTR_OPERATIONGRAPH_HANDLE:
        return put(type, CUDNN_TYPE_HANDLE, &b->u.g.handle, 1, sizeof(cudnnHandle_t), requested,
                   count, arr);
    case CUDNN_ATTR_OPERATIONGRAPH_OPS:
        return put_sub(CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR, &b->u.g.op,
                       sizeof b->u.g.op, type, requested, count, arr);
    case CUDNN_ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT:
        return PUT_I64(&one, 1);
    case CUDNN_ATTR_ENGINE_OPERATION_GRAPH:
        return put_sub(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, &b->u.e.graph, sizeof b->u.e.graph,
                       type, requested, count, arr);
    case CUDNN_ATTR_ENGINE_GLOBAL_INDEX:
        return PUT_I64(&b->u.e.index, 1);
    case CUDNN_ATTR_ENGINECFG_ENGINE:
        return put_sub(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &b->u.cfg.engine, sizeof b->u.cfg.engine,
                       type, requested, count, arr);
    case CUDNN_ATTR_ENGINECFG_WORKSPACE_SIZE:
    case CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE:
        return PUT_I64(&ws_bytes, 1);
    case CUDNN_ATTR_EXECUTION_PLAN_HANDLE:
        return put(type, CUDNN_TYPE_HANDLE, &b->u.plan.handle, 1, sizeof(cudnnHandle_t), requested,
                   count, arr);
    case CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG:
        return put_sub(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &b->u.plan.cfg, sizeof b->u.plan.cfg,
                       type, requested, count, arr);
    case CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS:
    case CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS:
    case CUDNN_ATTR_VARIANT_PACK_WORKSPACE:
        /* A variant pack is write-only: the real cuDNN 9.19 (an H200, PyTorch 2.11's) answered
         * CUDNN_STATUS_NOT_SUPPORTED to the shim reading its data pointers and workspace back
         * (profiles/gpu/h200/gate-ab), so a hook must keep what the program set. Its unique ids
         * are refused too, as strictly (not seen on a GPU). */
        return CUDNN_STATUS_NOT_SUPPORTED;
    default:
        return CUDNN_STATUS_NOT_SUPPORTED;
    }
}

/* Reads one attribute of a finalized descriptor: *elementCount gets the number of elements the
 * attribute has, arrayOfElements the first requestedElementCount of them (it may be NULL to
 * ask for the count only). A descriptor-valued attribute is copied into the descriptors the
 * caller created in arrayOfElements. */
DNN_API cudnnStatus_t cudnnBackendGetAttribute(cudnnBackendDescriptor_t const descriptor,
                                               cudnnBackendAttributeName_t attributeName,
                                               cudnnBackendAttributeType_t attributeType,
                                               int64_t requestedElementCount, int64_t *elementCount,
                                               void *arrayOfElements) {
    const bk_desc_t *b = desc_of(descriptor);
    int lo, hi;
    if (!descriptor)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    if (!b || family(b->type, &lo, &hi) || (int)attributeName < lo || (int)attributeName >= hi)
        return CUDNN_STATUS_BAD_PARAM;
    if (!b->finalized)
        return CUDNN_STATUS_NOT_INITIALIZED;
    switch (b->type) {
    case CUDNN_BACKEND_TENSOR_DESCRIPTOR:
        return get_tensor(&b->u.t, attributeName, attributeType, requestedElementCount,
                          elementCount, arrayOfElements);
    case CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR:
        return get_conv(&b->u.cv, attributeName, attributeType, requestedElementCount, elementCount,
                        arrayOfElements);
    default:
        return get_rest(b, attributeName, attributeType, requestedElementCount, elementCount,
                        arrayOfElements);
    }
}

/* ---- execution ----------------------------------------------------------------------------- */

/* The data pointer the pack gives for uid, or NULL. */
static void *pack_ptr(const bk_pack_t *p, int64_t uid) {
    for (int64_t i = 0; i < p->nids; i++)
        if (p->ids[i] == uid)
            return p->ptrs[i];
    return NULL;
}

/* Runs the plan's convolution on the handle's stream with the pack's operands: copies the
 * operand table into the pack's workspace (which must be device memory of at least the plan's
 * WORKSPACE_SIZE from its address to the end of its allocation), then launches the kernel that
 * reads it. Asynchronous, like every cuDNN computing call. BAD_PARAM for a missing operand or
 * workspace; NOT_INITIALIZED for an unfinalized plan or pack. */
DNN_API cudnnStatus_t cudnnBackendExecute(cudnnHandle_t handle,
                                          cudnnBackendDescriptor_t executionPlan,
                                          cudnnBackendDescriptor_t variantPack) {
    const bk_desc_t *plan = desc_of(executionPlan), *pack = desc_of(variantPack);
    if (!handle || !executionPlan || !variantPack)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    if (!plan || !pack || plan->type != CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR ||
        pack->type != CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR)
        return CUDNN_STATUS_BAD_PARAM;
    if (!plan->finalized || !pack->finalized)
        return CUDNN_STATUS_NOT_INITIALIZED;
    const bk_op_t *o = &plan->u.plan.cfg.engine.graph.op;
    const bk_pack_t *p = &pack->u.pack;
    void *x = pack_ptr(p, o->x.uid), *w = pack_ptr(p, o->w.uid), *y = pack_ptr(p, o->y.uid);
    if (!x || !w || !y || !p->workspace)
        return CUDNN_STATUS_BAD_PARAM;
    CUdeviceptr ws = (CUdeviceptr)(uintptr_t)p->workspace, base = 0;
    size_t size = 0;
    if (dnn_drv.mem_get_address_range(&base, &size, ws) != CUDA_SUCCESS ||
        base + size - ws < FC_CONV_TABLE_BYTES)
        return CUDNN_STATUS_BAD_PARAM;
    fc_conv_table_t t = {.x = (uint64_t)(uintptr_t)x,
                         .w = (uint64_t)(uintptr_t)w,
                         .y = (uint64_t)(uintptr_t)y,
                         .geom = o->geom,
                         .alpha = o->alpha,
                         .beta = o->beta};
    /* Pageable source: the driver stages it at this call, so t may go out of scope. */
    if (dnn_drv.memcpy_htod_async(ws, &t, sizeof t, handle->stream) != CUDA_SUCCESS)
        return CUDNN_STATUS_EXECUTION_FAILED_CUDA_DRIVER;
    const fc_conv_geom_t *g = &o->geom;
    void *args[] = {&ws};
    return dnn_launch(handle, K_CONV_FWD_TABLE, (uint64_t)g->n * g->k * g->p * (uint64_t)g->q,
                      args);
}
