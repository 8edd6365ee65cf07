/* SPDX-License-Identifier: MIT */
/* graph.c: a program that captures CUDA graphs and launches them many times, checking every
 * byte against a model computed on the host. Under the shim with a small budget, the buffers of
 * the graphs must be swapped out and in between launches.
 *
 * Buffers are one 64 KiB chunk each (run with FAKECUDA_GRANULARITY=64K, OOC_CHUNK=64K). Graph 1
 * is captured on a non-blocking stream, graph 2 on the per-thread default stream; each, per
 * launch: copies its pinned input into A, A = a*A + b (kernel), B += A (kernel: B keeps its sum
 * across launches), C = B (device-to-device copy), C = C/2 + 1 (kernel), copies C to its pinned
 * output, and sets A to zero (memset). Each graph touches three chunks; between the graphs an
 * ordinary kernel adds one to a seventh buffer K. With a budget of four chunks every launch
 * evicts what the previous one used, while it may still be running. Graph 1 is instantiated with
 * cuGraphInstantiate (CUDA 12's ABI, linked) and launched with cuGraphLaunch; graph 2 with the
 * ABIs cuGetProcAddress gives for "cuGraphInstantiate" at 11.0 and "cuGraphLaunch" for the
 * per-thread stream, as the runtime would reach them. On odd iterations graph 1 is launched
 * twice in a row. Each iteration's outputs, and at the end every buffer, are compared bit for
 * bit with the model.
 *
 * Other modes: `--many N --bytes B`: one graph of N memsets into N buffers of B bytes (more
 * buffers than one operation's access set holds when N > 256), launched twice and checked;
 * `--big`: a graph touching five chunks, which a budget of four cannot hold (the launch fails);
 * `--to-graph`: graph 1 is an explicit memset node followed by the body captured into the same
 * graph with cuStreamBeginCaptureToGraph (same results); `--add-node`: graph 1 is built node by
 * node with cuGraphAddNode (both ABIs, its second half a child graph; same results);
 * `--exec-update`: graph 1's executable graph is instantiated from a graph on other buffers,
 * then updated with cuGraphExecUpdate from graph 1 captured anew, then refused an update from a
 * graph with one node more (same results); `--set-params`: graph 1 is built node by node on other
 * buffers, each node then given graph 1's (cuGraphNodeSetParams, cuGraphKernelNodeSetParams in both
 * ABIs, cuGraphMemcpyNodeSetParams, cuGraphMemsetNodeSetParams; calls the driver must refuse change
 * nothing), and before each iteration its executable graph's copy into C, kernel on C and copy out
 * of C are moved to C or to an eighth buffer, in turn, with cuGraphExecNodeSetParams and
 * cuGraphExecMemcpyNodeSetParams (g1's C at the last iteration; same results);
 * `--alloc-in-capture`: cuMemAlloc and cuMemFree during a relaxed and a global capture, printing
 * what each call answered.
 *
 * Output: "graph: ok" and "checksum: H" (FNV-1a 64 of the final buffers). Exit status: 0 when
 * every byte is right; 1 when one is wrong (named on stderr); 2 when a driver call failed
 * ("error: <call>: <name> (<code>)"); 64 on a bad option. Linked with -lcuda (the simulated
 * driver, whose fakecuda.h gives the kernels). */
#include <cuda.h>
#include <cudaTypedefs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fakecuda.h"

#define CHUNK ((size_t)64 << 10)
#define N     ((int)(CHUNK / sizeof(float)))

/* axpb(float *x, float a, float b, int n): x[i] = a * x[i] + b. */
static int k_axpb(fakecuda_launch_t *l) {
    CUdeviceptr d = FAKECUDA_ARG(l, 0, CUdeviceptr);
    float a = FAKECUDA_ARG(l, 1, float), b = FAKECUDA_ARG(l, 2, float);
    int n = FAKECUDA_ARG(l, 3, int);
    float *x = fakecuda_access(l, d, (size_t)n * sizeof *x, 1);
    if (!x)
        return -1;
    for (int i = 0; i < n; i++)
        x[i] = a * x[i] + b;
    fakecuda_work(l, 2.0 * n, 8.0 * n);
    return 0;
}

/* acc(float *dst, const float *src, int n): dst[i] += src[i]. */
static int k_acc(fakecuda_launch_t *l) {
    CUdeviceptr dd = FAKECUDA_ARG(l, 0, CUdeviceptr), sd = FAKECUDA_ARG(l, 1, CUdeviceptr);
    int n = FAKECUDA_ARG(l, 2, int);
    float *dst = fakecuda_access(l, dd, (size_t)n * sizeof *dst, 1);
    const float *src = fakecuda_access(l, sd, (size_t)n * sizeof *src, 0);
    if (!dst || !src)
        return -1;
    for (int i = 0; i < n; i++)
        dst[i] += src[i];
    fakecuda_work(l, 1.0 * n, 12.0 * n);
    return 0;
}

static const fakecuda_kernel_t kernels[] = {
    {"graphprog", "axpb", 4, {8, 4, 4, 4}, k_axpb},
    {"graphprog", "acc", 3, {8, 8, 4}, k_acc},
};

static void die(const char *call, CUresult r) {
    const char *name = "?";
    cuGetErrorName(r, &name);
    fprintf(stderr, "error: %s: %s (%d)\n", call, name, (int)r);
    exit(2);
}

#define CHECK(x)                                                                                   \
    do {                                                                                           \
        CUresult r_ = (x);                                                                         \
        if (r_ != CUDA_SUCCESS)                                                                    \
            die(#x, r_);                                                                           \
    } while (0)

static CUfunction f_axpb, f_acc;

static void axpb(CUdeviceptr x, float a, float b, CUstream s) {
    int n = N;
    void *args[] = {&x, &a, &b, &n};
    CHECK(cuLaunchKernel(f_axpb, 1, 1, 1, 32, 1, 1, 0, s, args, NULL));
}

static void acc(CUdeviceptr dst, CUdeviceptr src, CUstream s) {
    int n = N;
    void *args[] = {&dst, &src, &n};
    CHECK(cuLaunchKernel(f_acc, 1, 1, 1, 32, 1, 1, 0, s, args, NULL));
}

/* One graph's buffers, constants and host model. */
typedef struct gbuf {
    CUdeviceptr a, b, c;
    float *in, *out; /* pinned */
    float ka, kb;
    float mb[N]; /* the model of B; A ends at zero, C equals the last output */
    float mc[N];
} gbuf_t;

static gbuf_t g1, g2;
static float mk[N]; /* the model of K */

/* Captures graph g on stream s (already capturing). */
static void capture_body(gbuf_t *g, CUstream s) {
    CHECK(cuMemcpyHtoDAsync(g->a, g->in, CHUNK, s));
    axpb(g->a, g->ka, g->kb, s);
    acc(g->b, g->a, s);
    CHECK(cuMemcpyDtoDAsync(g->c, g->b, CHUNK, s));
    axpb(g->c, 0.5f, 1.0f, s);
    CHECK(cuMemcpyDtoHAsync(g->out, g->c, CHUNK, s));
    CHECK(cuMemsetD32Async(g->a, 0, (size_t)N, s));
}

/* What one launch of g does, on the host. */
static void model_launch(gbuf_t *g) {
    for (int i = 0; i < N; i++) {
        float a = g->in[i];
        a = g->ka * a + g->kb;
        g->mb[i] += a;
        float c = g->mb[i];
        c = 0.5f * c + 1.0f;
        g->mc[i] = c;
    }
}

static void fill_input(gbuf_t *g, int it, int salt) {
    for (int i = 0; i < N; i++)
        g->in[i] = (float)((i * 7 + salt) % 101 + it) * 0.25f;
}

static int same(const float *got, const float *want, const char *what, int it) {
    if (memcmp(got, want, CHUNK) == 0)
        return 1;
    for (int i = 0; i < N; i++) {
        if (memcmp(&got[i], &want[i], sizeof *got) != 0) {
            fprintf(stderr, "graph: %s after iteration %d: element %d is %a, expected %a\n", what,
                    it, i, (double)got[i], (double)want[i]);
            break;
        }
    }
    return 0;
}

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

static void alloc_gbuf(gbuf_t *g, float ka, float kb) {
    CHECK(cuMemAlloc(&g->a, CHUNK));
    CHECK(cuMemAlloc(&g->b, CHUNK));
    CHECK(cuMemAlloc(&g->c, CHUNK));
    CHECK(cuMemHostAlloc((void **)&g->in, CHUNK, 0));
    CHECK(cuMemHostAlloc((void **)&g->out, CHUNK, 0));
    CHECK(cuMemsetD32(g->b, 0, (size_t)N));
    memset(g->mb, 0, sizeof g->mb);
    g->ka = ka;
    g->kb = kb;
}

static void free_gbuf(gbuf_t *g) {
    CHECK(cuMemFree(g->a));
    CHECK(cuMemFree(g->b));
    CHECK(cuMemFree(g->c));
    CHECK(cuMemFreeHost(g->in));
    CHECK(cuMemFreeHost(g->out));
}

/* Compares a device buffer with the model; returns 1 when equal. */
static int check_buffer(CUdeviceptr d, const float *want, const char *what, int it, uint64_t *sum) {
    static float host[N];
    CHECK(cuMemcpyDtoH(host, d, CHUNK));
    *sum = fnv(*sum, host, CHUNK);
    return same(host, want, what, it);
}

static int to_graph;    /* --to-graph */
static int add_node;    /* --add-node */
static int exec_update; /* --exec-update */
static int set_params;  /* --set-params */

/* Fills a kernel node's generic parameters: f(args) on one block of 32 threads. */
static void kernel_params(CUgraphNodeParams *p, CUfunction f, void **args) {
    memset(p, 0, sizeof *p); /* cuda.h: every unused byte zero */
    p->type = CU_GRAPH_NODE_TYPE_KERNEL;
    p->kernel.func = f;
    p->kernel.gridDimX = p->kernel.gridDimY = p->kernel.gridDimZ = 1;
    p->kernel.blockDimX = 32;
    p->kernel.blockDimY = p->kernel.blockDimZ = 1;
    p->kernel.kernelParams = args;
}

/* Adds a kernel node running f(args) after dep (when not NULL), through cuGraphAddNode. */
static CUgraphNode node_kernel(CUgraph g, CUgraphNode dep, CUfunction f, void **args) {
    CUgraphNodeParams p;
    kernel_params(&p, f, args);
    CUgraphNode n;
    CHECK(cuGraphAddNode(&n, g, dep ? &dep : NULL, NULL, dep ? 1 : 0, &p));
    return n;
}

/* Fills a memcpy node's parameters: a 1D copy of CHUNK bytes. */
static void copy_params(CUgraphNodeParams *p, CUcontext ctx, CUmemorytype st, const void *sh,
                        CUdeviceptr sd, CUmemorytype dt, void *dh, CUdeviceptr dd) {
    memset(p, 0, sizeof *p);
    p->type = CU_GRAPH_NODE_TYPE_MEMCPY;
    p->memcpy.copyCtx = ctx;
    CUDA_MEMCPY3D *c = &p->memcpy.copyParams;
    c->srcMemoryType = st;
    c->srcHost = sh;
    c->srcDevice = sd;
    c->dstMemoryType = dt;
    c->dstHost = dh;
    c->dstDevice = dd;
    c->srcPitch = c->dstPitch = CHUNK;
    c->srcHeight = c->dstHeight = 1;
    c->WidthInBytes = CHUNK;
    c->Height = c->Depth = 1;
}

/* Graph 1 built node by node with cuGraphAddNode, the same ops as capture_body: the first three
 * through CUDA 12.3's ABI (cuGraphAddNode_v2, linked), the last four in a child graph built
 * through CUDA 12.2's (cuGetProcAddress "cuGraphAddNode" at 12020) and added as a child-graph
 * node. */
static CUgraph build_by_node(gbuf_t *g, CUcontext ctx) {
    void *p_add = NULL;
    CUdriverProcAddressQueryResult q;
    CHECK(cuGetProcAddress_v2("cuGraphAddNode", &p_add, 12020, 0, &q));
    PFN_cuGraphAddNode_v12020 add_v12020 = (PFN_cuGraphAddNode_v12020)p_add;
    /* The driver copies the parameters when it adds a node. */
    int n = N;
    float half = 0.5f, one = 1.0f;
    CUdeviceptr a = g->a, b = g->b, c = g->c;
    void *axpb_a[] = {&a, &g->ka, &g->kb, &n}, *acc_ba[] = {&b, &a, &n};
    void *axpb_c[] = {&c, &half, &one, &n};

    CUgraph gr, child;
    CUgraphNodeParams p;
    CUgraphNode h2d, ka, kb, d2d, kc, d2h, set;
    CHECK(cuGraphCreate(&gr, 0));
    copy_params(&p, ctx, CU_MEMORYTYPE_HOST, g->in, 0, CU_MEMORYTYPE_DEVICE, NULL, g->a);
    CHECK(cuGraphAddNode(&h2d, gr, NULL, NULL, 0, &p));
    ka = node_kernel(gr, h2d, f_axpb, axpb_a);
    kb = node_kernel(gr, ka, f_acc, acc_ba);

    CHECK(cuGraphCreate(&child, 0));
    copy_params(&p, ctx, CU_MEMORYTYPE_DEVICE, NULL, g->b, CU_MEMORYTYPE_DEVICE, NULL, g->c);
    CHECK(add_v12020(&d2d, child, NULL, 0, &p));
    memset(&p, 0, sizeof p);
    p.type = CU_GRAPH_NODE_TYPE_KERNEL;
    p.kernel.func = f_axpb;
    p.kernel.gridDimX = p.kernel.gridDimY = p.kernel.gridDimZ = 1;
    p.kernel.blockDimX = 32;
    p.kernel.blockDimY = p.kernel.blockDimZ = 1;
    p.kernel.kernelParams = axpb_c;
    CHECK(add_v12020(&kc, child, &d2d, 1, &p));
    copy_params(&p, ctx, CU_MEMORYTYPE_DEVICE, NULL, g->c, CU_MEMORYTYPE_HOST, g->out, 0);
    CHECK(add_v12020(&d2h, child, &kc, 1, &p));
    memset(&p, 0, sizeof p);
    p.type = CU_GRAPH_NODE_TYPE_MEMSET;
    p.memset.dst = g->a;
    p.memset.elementSize = 4;
    p.memset.width = (size_t)N;
    p.memset.height = 1;
    p.memset.ctx = ctx;
    CHECK(add_v12020(&set, child, &d2h, 1, &p));

    memset(&p, 0, sizeof p);
    p.type = CU_GRAPH_NODE_TYPE_GRAPH;
    p.graph.graph = child;
    CUgraphNode sub;
    CHECK(cuGraphAddNode(&sub, gr, &kb, NULL, 1, &p));
    CHECK(cuGraphDestroy(child)); /* the node holds its own copy */
    return gr;
}

/* --set-params: graph 1's nodes, in capture_body's order. */
enum { N_H2D, N_KA, N_KB, N_D2D, N_KC, N_D2H, N_SET, N_NODES };

/* Expects a call the driver must refuse with CUDA_ERROR_INVALID_VALUE; returns 1 when it did, 0
 * when it succeeded; any other error is a failed call (exit status 2), as an injected fault. */
static int refused(CUresult r, const char *call) {
    if (r == CUDA_ERROR_INVALID_VALUE)
        return 1;
    if (r != CUDA_SUCCESS)
        die(call, r);
    fprintf(stderr, "graph: %s succeeded, not CUDA_ERROR_INVALID_VALUE\n", call);
    return 0;
}

/* Graph 1 built node by node on g0's buffers (one chain, no child graph), then each node given
 * g's with the calls that set a node's parameters in a graph: cuGraphNodeSetParams (both copies
 * and one kernel), cuGraphKernelNodeSetParams (CUDA 12's ABI, linked, and CUDA 10's, through
 * cuGetProcAddress at 10000), cuGraphMemcpyNodeSetParams and cuGraphMemsetNodeSetParams. Two
 * calls the driver refuses (parameters of another node type) change nothing. Returns NULL when a
 * refusal was wrong. */
static CUgraph build_set_params(gbuf_t *g, gbuf_t *g0, CUcontext ctx, CUgraphNode nd[N_NODES]) {
    void *p_set = NULL;
    CUdriverProcAddressQueryResult q;
    CHECK(cuGetProcAddress_v2("cuGraphKernelNodeSetParams", &p_set, 10000, 0, &q));
    PFN_cuGraphKernelNodeSetParams_v10000 set_v1 = (PFN_cuGraphKernelNodeSetParams_v10000)p_set;
    int n = N;
    float half = 0.5f, one = 1.0f;
    CUdeviceptr a0 = g0->a, b0 = g0->b, c0 = g0->c, a = g->a, b = g->b, c = g->c;
    void *axpb_a0[] = {&a0, &g0->ka, &g0->kb, &n}, *acc_ba0[] = {&b0, &a0, &n};
    void *axpb_c0[] = {&c0, &half, &one, &n};
    void *axpb_a[] = {&a, &g->ka, &g->kb, &n}, *acc_ba[] = {&b, &a, &n};
    void *axpb_c[] = {&c, &half, &one, &n};

    CUgraph gr;
    CUgraphNodeParams p;
    CHECK(cuGraphCreate(&gr, 0));
    copy_params(&p, ctx, CU_MEMORYTYPE_HOST, g0->in, 0, CU_MEMORYTYPE_DEVICE, NULL, g0->a);
    CHECK(cuGraphAddNode(&nd[N_H2D], gr, NULL, NULL, 0, &p));
    nd[N_KA] = node_kernel(gr, nd[N_H2D], f_axpb, axpb_a0);
    nd[N_KB] = node_kernel(gr, nd[N_KA], f_acc, acc_ba0);
    copy_params(&p, ctx, CU_MEMORYTYPE_DEVICE, NULL, g0->b, CU_MEMORYTYPE_DEVICE, NULL, g0->c);
    CHECK(cuGraphAddMemcpyNode(&nd[N_D2D], gr, &nd[N_KB], 1, &p.memcpy.copyParams, ctx));
    nd[N_KC] = node_kernel(gr, nd[N_D2D], f_axpb, axpb_c0);
    copy_params(&p, ctx, CU_MEMORYTYPE_DEVICE, NULL, g0->c, CU_MEMORYTYPE_HOST, g0->out, 0);
    CHECK(cuGraphAddNode(&nd[N_D2H], gr, &nd[N_KC], NULL, 1, &p));
    CUDA_MEMSET_NODE_PARAMS mp = {
        .dst = g0->a, .pitch = 0, .value = 0, .elementSize = 4, .width = (size_t)N, .height = 1};
    CHECK(cuGraphAddMemsetNode(&nd[N_SET], gr, &nd[N_D2H], 1, &mp, ctx));

    copy_params(&p, ctx, CU_MEMORYTYPE_HOST, g->in, 0, CU_MEMORYTYPE_DEVICE, NULL, g->a);
    CHECK(cuGraphNodeSetParams(nd[N_H2D], &p));
    CUDA_KERNEL_NODE_PARAMS kp = {.func = f_axpb,
                                  .gridDimX = 1,
                                  .gridDimY = 1,
                                  .gridDimZ = 1,
                                  .blockDimX = 32,
                                  .blockDimY = 1,
                                  .blockDimZ = 1,
                                  .kernelParams = axpb_a};
    CHECK(cuGraphKernelNodeSetParams(nd[N_KA], &kp));
    CUDA_KERNEL_NODE_PARAMS_v1 kp1;
    memcpy(&kp1, &kp, sizeof kp1); /* the CUDA 10 layout is CUDA 12's first fields */
    kp1.func = f_acc;
    kp1.kernelParams = acc_ba;
    CHECK(set_v1(nd[N_KB], &kp1));
    copy_params(&p, ctx, CU_MEMORYTYPE_DEVICE, NULL, g->b, CU_MEMORYTYPE_DEVICE, NULL, g->c);
    CHECK(cuGraphMemcpyNodeSetParams(nd[N_D2D], &p.memcpy.copyParams));
    kernel_params(&p, f_axpb, axpb_c);
    CHECK(cuGraphNodeSetParams(nd[N_KC], &p));
    copy_params(&p, ctx, CU_MEMORYTYPE_DEVICE, NULL, g->c, CU_MEMORYTYPE_HOST, g->out, 0);
    CHECK(cuGraphNodeSetParams(nd[N_D2H], &p));
    mp.dst = g->a;
    CHECK(cuGraphMemsetNodeSetParams(nd[N_SET], &mp));

    /* Refused: a kernel's parameters for a copy node, a kernel node's for a set node. */
    kernel_params(&p, f_axpb, axpb_c0);
    kp.kernelParams = axpb_a0;
    if (!refused(cuGraphNodeSetParams(nd[N_D2D], &p), "cuGraphNodeSetParams(copy node, kernel)") ||
        !refused(cuGraphKernelNodeSetParams(nd[N_SET], &kp), "cuGraphKernelNodeSetParams(set)"))
        return NULL;
    return gr;
}

/* --set-params, before each launch of e1: the last three nodes' C moved to ct with
 * cuGraphExecNodeSetParams (the copy into C and the kernel on it) and
 * cuGraphExecMemcpyNodeSetParams (the copy out of it); the set node given its own parameters
 * again with cuGraphExecMemsetNodeSetParams; and a 2D copy, a memset of another height and a
 * kernel's parameters for a copy node refused. Returns 1, or 0 when a refusal was wrong. */
static int exec_set_params(CUgraphExec e, CUgraphNode nd[N_NODES], gbuf_t *g, CUdeviceptr ct,
                           CUcontext ctx) {
    int n = N;
    float half = 0.5f, one = 1.0f;
    void *axpb_c[] = {&ct, &half, &one, &n};
    CUgraphNodeParams p;
    copy_params(&p, ctx, CU_MEMORYTYPE_DEVICE, NULL, g->b, CU_MEMORYTYPE_DEVICE, NULL, ct);
    CHECK(cuGraphExecNodeSetParams(e, nd[N_D2D], &p));
    kernel_params(&p, f_axpb, axpb_c);
    CHECK(cuGraphExecNodeSetParams(e, nd[N_KC], &p));
    copy_params(&p, ctx, CU_MEMORYTYPE_DEVICE, NULL, ct, CU_MEMORYTYPE_HOST, g->out, 0);
    CHECK(cuGraphExecMemcpyNodeSetParams(e, nd[N_D2H], &p.memcpy.copyParams, ctx));
    CUDA_MEMSET_NODE_PARAMS mp = {
        .dst = g->a, .pitch = 0, .value = 0, .elementSize = 4, .width = (size_t)N, .height = 1};
    CHECK(cuGraphExecMemsetNodeSetParams(e, nd[N_SET], &mp, ctx));
    /* Exec updates of copies are 1D only (cuda.h). */
    copy_params(&p, ctx, CU_MEMORYTYPE_DEVICE, NULL, g->b, CU_MEMORYTYPE_DEVICE, NULL, ct);
    p.memcpy.copyParams.WidthInBytes = CHUNK / 2;
    p.memcpy.copyParams.Height = 2;
    p.memcpy.copyParams.srcHeight = p.memcpy.copyParams.dstHeight = 2;
    p.memcpy.copyParams.srcPitch = p.memcpy.copyParams.dstPitch = CHUNK / 2;
    if (!refused(cuGraphExecMemcpyNodeSetParams(e, nd[N_D2D], &p.memcpy.copyParams, ctx),
                 "cuGraphExecMemcpyNodeSetParams(2D copy)"))
        return 0;
    /* Nor may a memset's height change, or a node get another type's parameters. */
    mp.width = (size_t)N / 2;
    mp.height = 2;
    mp.pitch = CHUNK / 2;
    if (!refused(cuGraphExecMemsetNodeSetParams(e, nd[N_SET], &mp, ctx),
                 "cuGraphExecMemsetNodeSetParams(height 2)"))
        return 0;
    kernel_params(&p, f_axpb, axpb_c);
    return refused(cuGraphExecNodeSetParams(e, nd[N_D2H], &p),
                   "cuGraphExecNodeSetParams(copy node, kernel)");
}

static int run_graphs(int iters) {
    typedef CUresult (*instantiate_v11_fn)(CUgraphExec *, CUgraph, CUgraphNode *, char *, size_t);
    void *p_inst = NULL, *p_launch = NULL;
    CUdriverProcAddressQueryResult q;
    CHECK(cuGetProcAddress_v2("cuGraphInstantiate", &p_inst, 11000, 0, &q));
    CHECK(cuGetProcAddress_v2("cuGraphLaunch", &p_launch, 12000,
                              CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &q));
    instantiate_v11_fn instantiate_v11 = (instantiate_v11_fn)p_inst;
    PFN_cuGraphLaunch_v10000_ptsz launch_ptsz = (PFN_cuGraphLaunch_v10000_ptsz)p_launch;

    CUstream s1;
    CHECK(cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING));
    CUstream s2 = CU_STREAM_PER_THREAD;
    alloc_gbuf(&g1, 2.0f, 1.0f);
    alloc_gbuf(&g2, -0.75f, 3.0f);
    CUdeviceptr k;
    CHECK(cuMemAlloc(&k, CHUNK));
    CHECK(cuMemsetD32(k, 0, (size_t)N));
    memset(mk, 0, sizeof mk);
    CHECK(cuCtxSynchronize());

    CUgraph gr1, gr2;
    CUgraphExec e1, e2;
    gbuf_t g0; /* --exec-update, --set-params: the buffers graph 1 is first built on */
    CUgraphNode nd[N_NODES];
    CUdeviceptr d1 = 0; /* --set-params: the other buffer C moves to */
    CUcontext ctx;
    CHECK(cuCtxGetCurrent(&ctx));
    int instantiated = 0;
    if (set_params) {
        alloc_gbuf(&g0, -1.5f, 0.5f);
        CHECK(cuMemAlloc(&d1, CHUNK));
        gr1 = build_set_params(&g1, &g0, ctx, nd);
        if (!gr1)
            return 1;
    } else if (add_node) {
        gr1 = build_by_node(&g1, ctx);
    } else if (exec_update) {
        /* Instantiated on other buffers (g0), then updated to graph 1's from a graph captured
         * anew: every node, kernels included, now points at g1's buffers. */
        alloc_gbuf(&g0, 2.0f, 1.0f);
        CHECK(cuStreamBeginCapture(s1, CU_STREAM_CAPTURE_MODE_GLOBAL));
        capture_body(&g0, s1);
        CUgraph decoy;
        CHECK(cuStreamEndCapture(s1, &decoy));
        CHECK(cuGraphInstantiate(&e1, decoy, 0));
        CHECK(cuStreamBeginCapture(s1, CU_STREAM_CAPTURE_MODE_GLOBAL));
        capture_body(&g1, s1);
        CHECK(cuStreamEndCapture(s1, &gr1));
        CUgraphExecUpdateResultInfo info;
        CHECK(cuGraphExecUpdate(e1, gr1, &info));
        if (info.result != CU_GRAPH_EXEC_UPDATE_SUCCESS) {
            fprintf(stderr, "graph: cuGraphExecUpdate succeeded with result %d\n",
                    (int)info.result);
            return 1;
        }
        /* A refused update (one node more) changes nothing: e1 stays on g1's buffers. */
        CHECK(cuStreamBeginCapture(s1, CU_STREAM_CAPTURE_MODE_GLOBAL));
        capture_body(&g0, s1);
        CHECK(cuMemsetD32Async(g0.c, 0, (size_t)N, s1));
        CUgraph longer;
        CHECK(cuStreamEndCapture(s1, &longer));
        CUresult r = cuGraphExecUpdate(e1, longer, &info);
        if (r != CUDA_SUCCESS && r != CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE)
            die("cuGraphExecUpdate(e1, longer, &info)", r);
        if (r == CUDA_SUCCESS || info.result != CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED) {
            fprintf(stderr, "graph: cuGraphExecUpdate to a longer graph: %d, result %d\n", (int)r,
                    (int)info.result);
            return 1;
        }
        CHECK(cuGraphDestroy(decoy));
        CHECK(cuGraphDestroy(longer));
        instantiated = 1;
    } else if (to_graph) {
        /* XLA's way: an explicit node (C = 0, undone by the body's C = B), then the body
         * captured into the same graph after it. */
        CHECK(cuGraphCreate(&gr1, 0));
        CUDA_MEMSET_NODE_PARAMS mp = {
            .dst = g1.c, .pitch = 0, .value = 0, .elementSize = 4, .width = (size_t)N, .height = 1};
        CUgraphNode zero;
        CHECK(cuGraphAddMemsetNode(&zero, gr1, NULL, 0, &mp, ctx));
        CHECK(cuStreamBeginCaptureToGraph(s1, gr1, &zero, NULL, 1, CU_STREAM_CAPTURE_MODE_GLOBAL));
        capture_body(&g1, s1);
        CUgraph got;
        CHECK(cuStreamEndCapture(s1, &got));
        if (got != gr1) {
            fprintf(stderr, "graph: cuStreamEndCapture gave graph %p, not %p\n", (void *)got,
                    (void *)gr1);
            return 1;
        }
    } else {
        CHECK(cuStreamBeginCapture(s1, CU_STREAM_CAPTURE_MODE_GLOBAL));
        capture_body(&g1, s1);
        CHECK(cuStreamEndCapture(s1, &gr1));
    }
    CHECK(cuStreamBeginCapture(s2, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
    capture_body(&g2, s2);
    CHECK(cuStreamEndCapture(s2, &gr2));
    if (!instantiated)
        CHECK(cuGraphInstantiate(&e1, gr1, 0));
    CHECK(instantiate_v11(&e2, gr2, NULL, NULL, 0));
    CHECK(cuGraphDestroy(gr1)); /* the executable graphs live on */

    int ok = 1;
    for (int it = 0; it < iters && ok; it++) {
        fill_input(&g1, it, 3);
        fill_input(&g2, it, 11);
        int twice = it % 2;
        /* C on alternate buffers, g1.c at the last iteration (which the final check reads). */
        if (set_params && !exec_set_params(e1, nd, &g1, (iters - 1 - it) % 2 ? d1 : g1.c, ctx))
            return 1;
        CHECK(cuGraphLaunch(e1, s1));
        model_launch(&g1);
        if (twice) {
            CHECK(cuGraphLaunch(e1, s1));
            model_launch(&g1);
        }
        axpb(k, 1.0f, 1.0f, s1);
        for (int i = 0; i < N; i++)
            mk[i] = 1.0f * mk[i] + 1.0f;
        CHECK(launch_ptsz(e2, NULL));
        model_launch(&g2);
        CHECK(cuStreamSynchronize(s1));
        CHECK(cuStreamSynchronize(s2));
        ok = same(g1.out, g1.mc, "graph 1 output", it) && same(g2.out, g2.mc, "graph 2 output", it);
    }

    static float zero[N];
    uint64_t sum = 1469598103934665603ull;
    ok = ok && check_buffer(g1.a, zero, "graph 1 A", iters, &sum) &&
         check_buffer(g1.b, g1.mb, "graph 1 B", iters, &sum) &&
         check_buffer(g1.c, g1.mc, "graph 1 C", iters, &sum) &&
         check_buffer(g2.a, zero, "graph 2 A", iters, &sum) &&
         check_buffer(g2.b, g2.mb, "graph 2 B", iters, &sum) &&
         check_buffer(g2.c, g2.mc, "graph 2 C", iters, &sum) &&
         check_buffer(k, mk, "K", iters, &sum);
    CHECK(cuGraphExecDestroy(e1));
    CHECK(cuGraphExecDestroy(e2));
    CHECK(cuGraphDestroy(gr2));
    free_gbuf(&g1);
    free_gbuf(&g2);
    if (exec_update || set_params)
        free_gbuf(&g0);
    if (d1)
        CHECK(cuMemFree(d1));
    CHECK(cuMemFree(k));
    CHECK(cuStreamDestroy(s1));
    if (!ok)
        return 1;
    printf("graph: ok\nchecksum: %016llx\n", (unsigned long long)sum);
    return 0;
}

/* One graph of `n` memsets into n buffers of `bytes` bytes each, launched twice. */
static int run_many(int n, size_t bytes) {
    CUdeviceptr *d = calloc((size_t)n, sizeof *d);
    unsigned char *host = malloc(bytes);
    if (!d || !host)
        return 2;
    CUstream s;
    CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    for (int i = 0; i < n; i++)
        CHECK(cuMemAlloc(&d[i], bytes));
    CUgraph g;
    CUgraphExec e;
    CHECK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    for (int i = 0; i < n; i++)
        CHECK(cuMemsetD8Async(d[i], (unsigned char)(i * 13 + 1), bytes, s));
    CHECK(cuStreamEndCapture(s, &g));
    CHECK(cuGraphInstantiate(&e, g, 0));
    CHECK(cuGraphLaunch(e, s));
    CHECK(cuGraphLaunch(e, s));
    CHECK(cuStreamSynchronize(s));
    int ok = 1;
    uint64_t sum = 1469598103934665603ull;
    for (int i = 0; i < n && ok; i++) {
        CHECK(cuMemcpyDtoH(host, d[i], bytes));
        sum = fnv(sum, host, bytes);
        for (size_t j = 0; j < bytes; j++) {
            if (host[j] != (unsigned char)(i * 13 + 1)) {
                fprintf(stderr, "graph: buffer %d byte %zu is %#x, expected %#x\n", i, j, host[j],
                        (unsigned char)(i * 13 + 1));
                ok = 0;
                break;
            }
        }
    }
    CHECK(cuGraphExecDestroy(e));
    CHECK(cuGraphDestroy(g));
    for (int i = 0; i < n; i++)
        CHECK(cuMemFree(d[i]));
    CHECK(cuStreamDestroy(s));
    free(d);
    free(host);
    if (!ok)
        return 1;
    printf("graph: ok\nchecksum: %016llx\n", (unsigned long long)sum);
    return 0;
}

/* A graph touching five chunks: under a budget of four its launch cannot be made resident. */
static int run_big(void) {
    CUstream s;
    CUdeviceptr d[5];
    CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    for (int i = 0; i < 5; i++)
        CHECK(cuMemAlloc(&d[i], CHUNK));
    CUgraph g;
    CUgraphExec e;
    CHECK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    for (int i = 0; i < 5; i++)
        CHECK(cuMemsetD32Async(d[i], (unsigned)i, (size_t)N, s));
    CHECK(cuStreamEndCapture(s, &g));
    CHECK(cuGraphInstantiate(&e, g, 0));
    CHECK(cuGraphLaunch(e, s));
    CHECK(cuStreamSynchronize(s));
    printf("graph: ok\n");
    return 0;
}

static const char *ename(CUresult r) {
    const char *n = NULL;
    return cuGetErrorName(r, &n) == CUDA_SUCCESS && n ? n : "?";
}

/* cuMemAlloc and cuMemFree while a stream captures: allowed in a relaxed capture, refused in a
 * global one, which they invalidate. Prints what each call answered. */
static int run_alloc_in_capture(void) {
    CUstream s;
    CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CUdeviceptr x, y = 0;
    CHECK(cuMemAlloc(&x, CHUNK));
    CUgraph g = NULL;
    CHECK(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_RELAXED));
    CUresult ra = cuMemAlloc(&y, CHUNK);
    CUresult rf = ra == CUDA_SUCCESS ? cuMemFree(y) : ra;
    CUresult rs = cuMemsetD32Async(x, 7, (size_t)N, s);
    CUresult re = cuStreamEndCapture(s, &g);
    printf("relaxed: alloc %s, free %s, op %s, end %s\n", ename(ra), ename(rf), ename(rs),
           ename(re));
    if (re == CUDA_SUCCESS)
        CHECK(cuGraphDestroy(g));
    CHECK(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    ra = cuMemAlloc(&y, CHUNK);
    rf = cuMemFree(x);
    rs = cuMemsetD32Async(x, 7, (size_t)N, s);
    g = NULL;
    re = cuStreamEndCapture(s, &g);
    printf("global: alloc %s, free %s, op %s, end %s\n", ename(ra), ename(rf), ename(rs),
           ename(re));
    if (re == CUDA_SUCCESS && g)
        CHECK(cuGraphDestroy(g));
    if (ra == CUDA_SUCCESS)
        CHECK(cuMemFree(y));
    if (rf != CUDA_SUCCESS)
        CHECK(cuMemFree(x));
    CHECK(cuStreamDestroy(s));
    return 0;
}

int main(int argc, char **argv) {
    int iters = 6, many = 0, big = 0, in_capture = 0;
    size_t bytes = 256;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--iters") == 0 && i + 1 < argc) {
            iters = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--many") == 0 && i + 1 < argc) {
            many = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--bytes") == 0 && i + 1 < argc) {
            bytes = (size_t)strtoull(argv[++i], NULL, 10);
        } else if (strcmp(argv[i], "--alloc-in-capture") == 0) {
            in_capture = 1;
        } else if (strcmp(argv[i], "--to-graph") == 0) {
            to_graph = 1;
        } else if (strcmp(argv[i], "--add-node") == 0) {
            add_node = 1;
        } else if (strcmp(argv[i], "--exec-update") == 0) {
            exec_update = 1;
        } else if (strcmp(argv[i], "--set-params") == 0) {
            set_params = 1;
        } else if (strcmp(argv[i], "--big") == 0) {
            big = 1;
        } else {
            fprintf(stderr, "usage: graph [--iters N] [--to-graph | --add-node | --exec-update | "
                            "--set-params] [--many N [--bytes B]] [--big] [--alloc-in-capture]\n");
            return 64;
        }
    }
    if (iters < 1 || many < 0 || bytes == 0) {
        fprintf(stderr, "graph: bad option value\n");
        return 64;
    }
    if (fakecuda_register_kernels(kernels, sizeof kernels / sizeof kernels[0]) != 0)
        return 2;
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuModuleLoadData(&mod, FAKECUDA_IMAGE_PREFIX "graphprog"));
    CHECK(cuModuleGetFunction(&f_axpb, mod, "axpb"));
    CHECK(cuModuleGetFunction(&f_acc, mod, "acc"));
    int rc = in_capture ? run_alloc_in_capture()
             : big      ? run_big()
             : many     ? run_many(many, bytes)
                        : run_graphs(iters);
    CHECK(cuModuleUnload(mod));
    CHECK(cuDevicePrimaryCtxRelease(dev));
    return rc;
}
