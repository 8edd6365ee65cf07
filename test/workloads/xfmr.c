/* SPDX-License-Identifier: MIT */
/* xfmr.c: a small transformer block trained on synthetic tokens, reaching the (simulated) driver
 * the way PyTorch and XLA do on Hopper.
 *
 * Model: B sequences of T = 8 tokens of width D = 32; single-head self-attention
 * (Q, K, V = x Wq, x Wk, x Wv; P = softmax(Q K^T / sqrt(D)); O = P V), a residual h = x + O Wo,
 * per-token logits h Wc over 16 classes, softmax cross-entropy, SGD with momentum and a learning
 * rate that decays each step. What it does the framework way:
 * - tensor views at offsets inside buffers: the batch buffer holds the tokens and the labels,
 *   one buffer holds Q, K and V, the attention scores of sequence b are a view of the workspace,
 *   the weight gradients are views of one flat gradient buffer (allocated each step);
 * - GEMMs through TMA descriptors (cuTensorMapEncodeTiled once per shape, then
 *   cuTensorMapReplaceAddress) launched through a lazily loaded CUkernel (cuLibraryLoadData,
 *   cuLibraryGetKernel, the kernel handle cast to CUfunction);
 * - the Q/K/V projections and their weight gradients as one grouped GEMM whose operand pointers
 *   sit in a table in device memory (--no-ptr-table: three TMA GEMMs each, the same bits);
 * - an explicitly built graph (cuGraphCreate: five SGD kernel nodes, then a child graph that
 *   updates an exponential moving average of Wo, then a memset and a 2D memcpy node that
 *   snapshot Wc), instantiated once and launched each step after cuGraphExecKernelNodeSetParams
 *   gives every SGD node that step's gradient pointer and learning rate;
 * - 2D copies: the tokens arrive through cuMemcpy2DAsync from a pitched host staging buffer;
 * - the attention workspace sized from cuMemGetInfo each step, as cuDNN sizes its workspace
 *   (between what is needed and twice that; the results do not depend on the size).
 * The checksum covers the weights, the moving average and the snapshot. */
#include "wl.h"

#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { T = 8, D = 32, C = 16, NPARAM = 5, MAX_SHAPES = 32 };
static const float LR = 0.05f, MOMENTUM = 0.9f, WD = 1e-4f;

/* The driver entry points only this program uses, resolved like wl_cuda.c's. */
static struct {
    PFN_cuMemGetInfo_v3020 MemGetInfo;
    PFN_cuCtxGetCurrent_v4000 CtxGetCurrent;
    PFN_cuLibraryLoadData_v12000 LibraryLoadData;
    PFN_cuLibraryGetKernel_v12000 LibraryGetKernel;
    PFN_cuLibraryUnload_v12000 LibraryUnload;
    PFN_cuTensorMapEncodeTiled_v12000 TensorMapEncodeTiled;
    PFN_cuTensorMapReplaceAddress_v12000 TensorMapReplaceAddress;
    PFN_cuMemcpy2DAsync_v3020 Memcpy2DAsync;
    PFN_cuGraphCreate_v10000 GraphCreate;
    PFN_cuGraphAddKernelNode_v12000 GraphAddKernelNode;
    PFN_cuGraphAddMemsetNode_v10000 GraphAddMemsetNode;
    PFN_cuGraphAddMemcpyNode_v10000 GraphAddMemcpyNode;
    PFN_cuGraphAddChildGraphNode_v10000 GraphAddChildGraphNode;
    PFN_cuGraphInstantiateWithFlags_v11040 GraphInstantiate;
    PFN_cuGraphExecKernelNodeSetParams_v12000 GraphExecKernelNodeSetParams;
    PFN_cuGraphLaunch_v10000 GraphLaunch;
    PFN_cuGraphExecDestroy_v10000 GraphExecDestroy;
    PFN_cuGraphDestroy_v10000 GraphDestroy;
    PFN_cuModuleLoadData_v2000 ModuleLoadData;
    PFN_cuModuleGetFunction_v2000 ModuleGetFunction;
    PFN_cuModuleUnload_v2000 ModuleUnload;
} cu;

static void resolve(void) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    PFN_cuGetProcAddress_v12000 gpa = NULL;
    if (lib)
        *(void **)&gpa = dlsym(lib, "cuGetProcAddress_v2");
    if (!gpa) {
        fprintf(stderr, "error: dlsym: cuGetProcAddress_v2\n");
        exit(2);
    }
#define P(field, name, ver)                                                                        \
    do {                                                                                           \
        CUdriverProcAddressQueryResult q;                                                          \
        wl_check(gpa(name, (void **)&cu.field, ver, CU_GET_PROC_ADDRESS_DEFAULT, &q),              \
                 "cuGetProcAddress_v2");                                                           \
        if (q != CU_GET_PROC_ADDRESS_SUCCESS || !cu.field) {                                       \
            fprintf(stderr, "error: cuGetProcAddress_v2: %s\n", name);                             \
            exit(2);                                                                               \
        }                                                                                          \
    } while (0)
    P(MemGetInfo, "cuMemGetInfo", 3020);
    P(CtxGetCurrent, "cuCtxGetCurrent", 4000);
    P(LibraryLoadData, "cuLibraryLoadData", 12000);
    P(LibraryGetKernel, "cuLibraryGetKernel", 12000);
    P(LibraryUnload, "cuLibraryUnload", 12000);
    P(TensorMapEncodeTiled, "cuTensorMapEncodeTiled", 12000);
    P(TensorMapReplaceAddress, "cuTensorMapReplaceAddress", 12000);
    P(Memcpy2DAsync, "cuMemcpy2DAsync", 3020);
    P(GraphCreate, "cuGraphCreate", 10000);
    P(GraphAddKernelNode, "cuGraphAddKernelNode", 12000);
    P(GraphAddMemsetNode, "cuGraphAddMemsetNode", 10000);
    P(GraphAddMemcpyNode, "cuGraphAddMemcpyNode", 10000);
    P(GraphAddChildGraphNode, "cuGraphAddChildGraphNode", 10000);
    P(GraphInstantiate, "cuGraphInstantiateWithFlags", 11040);
    P(GraphExecKernelNodeSetParams, "cuGraphExecKernelNodeSetParams", 12000);
    P(GraphLaunch, "cuGraphLaunch", 10000);
    P(GraphExecDestroy, "cuGraphExecDestroy", 10000);
    P(GraphDestroy, "cuGraphDestroy", 10000);
    P(ModuleLoadData, "cuModuleLoadData", 2000);
    P(ModuleGetFunction, "cuModuleGetFunction", 2000);
    P(ModuleUnload, "cuModuleUnload", 2000);
#undef P
}

/* ---- kernels ----------------------------------------------------------------------------------
 */

static CUlibrary xf_lib;
static CUkernel k_tma_gemm, k_grouped, k_softmax, k_softmax_bwd; /* launched cast to CUfunction */
static CUmodule nn_mod;
static CUfunction f_sgd, f_scale, f_axpy, f_add, f_xent;
static int use_table = 1;

static void kernels_init(void) {
    wl_check(cu.LibraryLoadData(&xf_lib, "FAKECUDA-MODULE:xfmr", NULL, NULL, 0, NULL, NULL, 0),
             "cuLibraryLoadData");
    wl_check(cu.LibraryGetKernel(&k_tma_gemm, xf_lib, "tma_gemm"), "cuLibraryGetKernel");
    wl_check(cu.LibraryGetKernel(&k_grouped, xf_lib, "grouped_gemm"), "cuLibraryGetKernel");
    wl_check(cu.LibraryGetKernel(&k_softmax, xf_lib, "softmax_rows_f32"), "cuLibraryGetKernel");
    wl_check(cu.LibraryGetKernel(&k_softmax_bwd, xf_lib, "softmax_rows_bwd_f32"),
             "cuLibraryGetKernel");
    wl_check(cu.ModuleLoadData(&nn_mod, "FAKECUDA-MODULE:nn"), "cuModuleLoadData");
    wl_check(cu.ModuleGetFunction(&f_sgd, nn_mod, "sgd_momentum_f32"), "cuModuleGetFunction");
    wl_check(cu.ModuleGetFunction(&f_scale, nn_mod, "scale_f32"), "cuModuleGetFunction");
    wl_check(cu.ModuleGetFunction(&f_axpy, nn_mod, "axpy_f32"), "cuModuleGetFunction");
    wl_check(cu.ModuleGetFunction(&f_add, nn_mod, "add_f32"), "cuModuleGetFunction");
    wl_check(cu.ModuleGetFunction(&f_xent, nn_mod, "softmax_xent_f32"), "cuModuleGetFunction");
}

static void kernels_fini(void) {
    wl_check(cu.LibraryUnload(xf_lib), "cuLibraryUnload");
    wl_check(cu.ModuleUnload(nn_mod), "cuModuleUnload");
}

static void launch_kernel(CUkernel k, void **args, CUstream s) {
    wl_launch((CUfunction)(void *)k, 1, args, s);
}

/* ---- TMA GEMMs ------------------------------------------------------------------------------ */

/* Descriptors are encoded once per shape and retargeted with cuTensorMapReplaceAddress. */
static struct shape {
    int rows, cols, ld;
    CUtensorMap map;
} shapes[MAX_SHAPES];
static int nshapes;

static void tensor_map(CUtensorMap *out, CUdeviceptr p, int rows, int cols, int ld) {
    for (int i = 0; i < nshapes; i++) {
        if (shapes[i].rows == rows && shapes[i].cols == cols && shapes[i].ld == ld) {
            *out = shapes[i].map;
            wl_check(cu.TensorMapReplaceAddress(out, (void *)(uintptr_t)p),
                     "cuTensorMapReplaceAddress");
            return;
        }
    }
    cuuint64_t dim[2] = {(cuuint64_t)cols, (cuuint64_t)rows}, stride[1] = {(cuuint64_t)ld * 4};
    cuuint32_t box[2] = {4, rows < 8 ? (cuuint32_t)rows : 8}, es[2] = {1, 1};
    wl_check(cu.TensorMapEncodeTiled(out, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, (void *)(uintptr_t)p,
                                     dim, stride, box, es, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                     CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_NONE,
                                     CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
             "cuTensorMapEncodeTiled");
    if (nshapes < MAX_SHAPES)
        shapes[nshapes++] = (struct shape){rows, cols, ld, *out};
}

/* C (m x n) = alpha op(A) op(B) + beta C, row-major with leading dimensions, through TMA. */
static void gemm(CUstream s, int ta, int tb, int m, int n, int k, float alpha, CUdeviceptr a,
                 int lda, CUdeviceptr b, int ldb, float beta, CUdeviceptr c, int ldc) {
    CUtensorMap ma, mb, mc;
    tensor_map(&ma, a, ta ? k : m, ta ? m : k, lda);
    tensor_map(&mb, b, tb ? n : k, tb ? k : n, ldb);
    tensor_map(&mc, c, m, n, ldc);
    void *args[] = {&ma, &mb, &mc, &ta, &tb, &alpha, &beta};
    launch_kernel(k_tma_gemm, args, s);
}

/* One problem of the grouped GEMM, as kernels_xfmr.c reads it from device memory. */
typedef struct problem {
    CUdeviceptr a, b, c;
    int32_t m, n, k, lda, ldb, ldc, ta, tb;
    float alpha, beta;
} problem_t;

/* Three products of one shape; a grouped GEMM through a device pointer table, or (with
 * --no-ptr-table) three TMA GEMMs. The table lives in `table` (3 problems). */
static void gemm3(CUstream s, const problem_t *p, CUdeviceptr table, problem_t *host) {
    if (!use_table) {
        for (int i = 0; i < 3; i++)
            gemm(s, p[i].ta, p[i].tb, p[i].m, p[i].n, p[i].k, p[i].alpha, p[i].a, p[i].lda, p[i].b,
                 p[i].ldb, p[i].beta, p[i].c, p[i].ldc);
        return;
    }
    memcpy(host, p, 3 * sizeof *p);
    wl_h2d(table, host, 3 * sizeof *p, s);
    int count = 3;
    void *args[] = {&table, &count};
    launch_kernel(k_grouped, args, s);
}

/* ---- the optimizer graph ----------------------------------------------------------------------
 */

static wl_param_t *W[NPARAM]; /* Wq, Wk, Wv, Wo, Wc */
static CUdeviceptr ema, snap; /* moving average of Wo; snapshot of Wc (pitched) */
enum { SNAP_PITCH = C * 4 + 64 };
static CUgraph graph;
static CUgraphExec graph_exec;
static CUgraphNode sgd_node[NPARAM];
/* The values the SGD nodes' parameters point at when added or updated (copied by the driver). */
static CUdeviceptr sgd_grad[NPARAM];
static float sgd_lr;
static float momentum = MOMENTUM, wd = WD;

static CUDA_KERNEL_NODE_PARAMS node_params(CUfunction f, void **args) {
    return (CUDA_KERNEL_NODE_PARAMS){.func = f,
                                     .gridDimX = 1,
                                     .gridDimY = 1,
                                     .gridDimZ = 1,
                                     .blockDimX = 256,
                                     .blockDimY = 1,
                                     .blockDimZ = 1,
                                     .kernelParams = args};
}

static void sgd_args(int i, void **args) {
    args[0] = &W[i]->w;
    args[1] = &sgd_grad[i];
    args[2] = &W[i]->v;
    args[3] = &W[i]->n;
    args[4] = &sgd_lr;
    args[5] = &momentum;
    args[6] = &wd;
}

/* Ops one launch of the graph runs: five SGD steps, two in the child, a memset, a memcpy. */
#define GRAPH_OPS (NPARAM + 2 + 2)

/* Builds the graph once: the SGD nodes (parameters set per step), then the child graph
 * (ema = 0.9 ema + 0.1 Wo) after all of them, then memset snap and copy Wc into it (2D). */
static void graph_build(CUdeviceptr some_grad) {
    CUcontext ctx;
    wl_check(cu.CtxGetCurrent(&ctx), "cuCtxGetCurrent");
    wl_check(cu.GraphCreate(&graph, 0), "cuGraphCreate");
    for (int i = 0; i < NPARAM; i++) {
        sgd_grad[i] = some_grad;
        void *args[7];
        sgd_args(i, args);
        CUDA_KERNEL_NODE_PARAMS p = node_params(f_sgd, args);
        wl_check(cu.GraphAddKernelNode(&sgd_node[i], graph, NULL, 0, &p), "cuGraphAddKernelNode");
    }
    CUgraph child;
    CUgraphNode a, b, sub, set, copy;
    wl_check(cu.GraphCreate(&child, 0), "cuGraphCreate");
    uint64_t n = W[3]->n;
    float decay = 0.9f, mix = 0.1f;
    void *sargs[] = {&n, &decay, &ema};
    CUDA_KERNEL_NODE_PARAMS sp = node_params(f_scale, sargs);
    wl_check(cu.GraphAddKernelNode(&a, child, NULL, 0, &sp), "cuGraphAddKernelNode");
    void *aargs[] = {&n, &mix, &W[3]->w, &ema};
    CUDA_KERNEL_NODE_PARAMS ap = node_params(f_axpy, aargs);
    wl_check(cu.GraphAddKernelNode(&b, child, &a, 1, &ap), "cuGraphAddKernelNode");
    wl_check(cu.GraphAddChildGraphNode(&sub, graph, sgd_node, NPARAM, child),
             "cuGraphAddChildGraphNode");
    wl_check(cu.GraphDestroy(child), "cuGraphDestroy"); /* the node holds its own copy */
    CUDA_MEMSET_NODE_PARAMS ms = {.dst = snap,
                                  .pitch = SNAP_PITCH,
                                  .value = 0,
                                  .elementSize = 4,
                                  .width = SNAP_PITCH / 4,
                                  .height = D};
    wl_check(cu.GraphAddMemsetNode(&set, graph, sgd_node, NPARAM, &ms, ctx),
             "cuGraphAddMemsetNode");
    CUDA_MEMCPY3D cp = {.srcMemoryType = CU_MEMORYTYPE_DEVICE,
                        .srcDevice = W[4]->w,
                        .srcPitch = C * 4,
                        .dstXInBytes = 16,
                        .dstMemoryType = CU_MEMORYTYPE_DEVICE,
                        .dstDevice = snap,
                        .dstPitch = SNAP_PITCH,
                        .WidthInBytes = C * 4,
                        .Height = D,
                        .Depth = 1};
    CUgraphNode after[2] = {sub, set};
    wl_check(cu.GraphAddMemcpyNode(&copy, graph, after, 2, &cp, ctx), "cuGraphAddMemcpyNode");
    wl_check(cu.GraphInstantiate(&graph_exec, graph, 0), "cuGraphInstantiateWithFlags");
}

/* Points the SGD nodes at this step's gradients and learning rate, then launches the graph. */
static void graph_step(CUstream s, const CUdeviceptr *grads, int it, int iters) {
    sgd_lr = LR * (1.0f - 0.5f * (float)it / (float)(iters > 1 ? iters : 1));
    for (int i = 0; i < NPARAM; i++) {
        sgd_grad[i] = grads[i];
        void *args[7];
        sgd_args(i, args);
        CUDA_KERNEL_NODE_PARAMS p = node_params(f_sgd, args);
        wl_check(cu.GraphExecKernelNodeSetParams(graph_exec, sgd_node[i], &p),
                 "cuGraphExecKernelNodeSetParams");
    }
    wl_check(cu.GraphLaunch(graph_exec, s), "cuGraphLaunch");
    wl_ops_add(GRAPH_OPS);
}

/* ---- training ---------------------------------------------------------------------------------
 */

static void launch_nn(CUfunction f, void **args, CUstream s) {
    wl_launch(f, 1, args, s);
}

/* Copies the tokens (n rows of D floats, staged with a pitch of D + 4 floats) into the batch
 * buffer: one 2D copy. */
static void tokens_in(CUstream s, CUdeviceptr x, const float *staged, int n) {
    CUDA_MEMCPY2D c = {.srcMemoryType = CU_MEMORYTYPE_HOST,
                       .srcHost = staged,
                       .srcPitch = (D + 4) * 4,
                       .dstMemoryType = CU_MEMORYTYPE_DEVICE,
                       .dstDevice = x,
                       .dstPitch = D * 4,
                       .WidthInBytes = D * 4,
                       .Height = (size_t)n};
    wl_check(cu.Memcpy2DAsync(&c, s), "cuMemcpy2DAsync_v2");
    wl_ops_add(1);
}

/* The attention workspace: what the step needs, or more when cuMemGetInfo says memory is free
 * (at most twice; the results never depend on it). */
static size_t workspace_bytes(size_t need) {
    size_t free_b = 0, total = 0;
    wl_check(cu.MemGetInfo(&free_b, &total), "cuMemGetInfo_v2");
    size_t want = free_b / 16;
    return want < need ? need : want > 2 * need ? 2 * need : want;
}

/* The first iteration's "autotuning": a few GEMMs into scratch; changes nothing trained. */
static void autotune(CUstream s, CUdeviceptr x, int n) {
    wl_ops_pause(1);
    CUdeviceptr scratch = wl_alloc((size_t)n * D * 4);
    for (int trial = 0; trial < 3; trial++)
        gemm(s, 0, 0, n, D, D, 1.0f, x, D, W[0]->w, D, 0.0f, scratch, D);
    wl_sync(s);
    wl_free(scratch);
    wl_ops_pause(0);
}

static void train_step(CUstream s, int it, int iters, int B, float *hx, float *staged, int32_t *hy,
                       problem_t *table_host) {
    const int N = B * T;
    const size_t act = (size_t)N * D * 4;
    const float scale = 1.0f / sqrtf((float)D);
    wl_batch(it, N, D, C, hx, hy);
    for (int r = 0; r < N; r++)
        memcpy(staged + (size_t)r * (D + 4), hx + (size_t)r * D, D * 4);

    /* The batch buffer: tokens, then labels (views at offsets). */
    CUdeviceptr io = wl_alloc(act + (size_t)N * 4);
    CUdeviceptr x = io, labels = io + act;
    tokens_in(s, x, staged, N);
    wl_h2d(labels, hy, (size_t)N * 4, s);
    if (it == 0 && wl_opts()->warmup_differs)
        autotune(s, x, N);
    CUdeviceptr table = wl_alloc(3 * sizeof(problem_t));

    /* Q, K, V: views of one buffer. */
    CUdeviceptr qkv = wl_alloc(3 * act), q = qkv, k = qkv + act, v = qkv + 2 * act;
    problem_t proj[3];
    for (int i = 0; i < 3; i++)
        proj[i] = (problem_t){x, W[i]->w, qkv + i * act, N, D, D, D, D, D, 0, 0, 1.0f, 0.0f};
    gemm3(s, proj, table, table_host);

    /* Attention, sequence by sequence on views; S, P, dP, dS are views of the workspace. */
    const size_t tt = (size_t)B * T * T * 4;
    CUdeviceptr ws = wl_alloc(workspace_bytes(4 * tt));
    CUdeviceptr S = ws, P = ws + tt, dP = ws + 2 * tt, dS = ws + 3 * tt;
    const size_t seq = (size_t)T * D * 4, sq = (size_t)T * T * 4;
    for (int b = 0; b < B; b++)
        gemm(s, 0, 1, T, T, D, 1.0f, q + b * seq, D, k + b * seq, D, 0.0f, S + b * sq, T);
    int rows = N, cols = T;
    void *smargs[] = {&S, &P, &rows, &cols, (void *)&scale};
    launch_kernel(k_softmax, smargs, s);
    CUdeviceptr o = wl_alloc(act);
    for (int b = 0; b < B; b++)
        gemm(s, 0, 0, T, D, T, 1.0f, P + b * sq, T, v + b * seq, D, 0.0f, o + b * seq, D);

    /* h = x + O Wo; logits = h Wc; loss. */
    CUdeviceptr h = wl_alloc(act);
    gemm(s, 0, 0, N, D, D, 1.0f, o, D, W[3]->w, D, 0.0f, h, D);
    uint64_t nact = (uint64_t)N * D;
    void *addargs[] = {&h, &x, &h, &nact};
    launch_nn(f_add, addargs, s);
    CUdeviceptr logits = wl_alloc((size_t)N * C * 4), dlogits = wl_alloc((size_t)N * C * 4);
    CUdeviceptr loss = wl_alloc_async(4, s);
    int classes = C;
    void *xargs[] = {&logits, &labels, &loss, &dlogits, &rows, &classes};
    gemm(s, 0, 0, N, C, D, 1.0f, h, D, W[4]->w, C, 0.0f, logits, C);
    launch_nn(f_xent, xargs, s);

    /* Backward. The weight gradients are views of one flat buffer. */
    size_t goff[NPARAM + 1] = {0};
    for (int i = 0; i < NPARAM; i++)
        goff[i + 1] = goff[i] + W[i]->n * 4;
    CUdeviceptr gflat = wl_alloc(goff[NPARAM]), g[NPARAM];
    for (int i = 0; i < NPARAM; i++)
        g[i] = gflat + goff[i];
    CUdeviceptr dh = wl_alloc(act), dO = wl_alloc(act), dqkv = wl_alloc(3 * act);
    gemm(s, 1, 0, D, C, N, 1.0f, h, D, dlogits, C, 0.0f, g[4], C);
    gemm(s, 0, 1, N, D, C, 1.0f, dlogits, C, W[4]->w, C, 0.0f, dh, D);
    gemm(s, 1, 0, D, D, N, 1.0f, o, D, dh, D, 0.0f, g[3], D);
    gemm(s, 0, 1, N, D, D, 1.0f, dh, D, W[3]->w, D, 0.0f, dO, D);
    CUdeviceptr dq = dqkv, dk = dqkv + act, dv = dqkv + 2 * act;
    for (int b = 0; b < B; b++) {
        gemm(s, 0, 1, T, T, D, 1.0f, dO + b * seq, D, v + b * seq, D, 0.0f, dP + b * sq, T);
        gemm(s, 1, 0, T, D, T, 1.0f, P + b * sq, T, dO + b * seq, D, 0.0f, dv + b * seq, D);
    }
    void *sbargs[] = {&P, &dP, &dS, &rows, &cols, (void *)&scale};
    launch_kernel(k_softmax_bwd, sbargs, s);
    for (int b = 0; b < B; b++) {
        gemm(s, 0, 0, T, D, T, 1.0f, dS + b * sq, T, k + b * seq, D, 0.0f, dq + b * seq, D);
        gemm(s, 1, 0, T, D, T, 1.0f, dS + b * sq, T, q + b * seq, D, 0.0f, dk + b * seq, D);
    }
    problem_t wg[3];
    for (int i = 0; i < 3; i++)
        wg[i] = (problem_t){x, dqkv + i * act, g[i], D, D, N, D, D, D, 1, 0, 1.0f, 0.0f};
    gemm3(s, wg, table, table_host + 3);

    /* The optimizer: the graph, with this step's gradient pointers and learning rate. */
    graph_step(s, g, it, iters);
    wl_iter_end(it, s, loss);
    wl_free_async(loss, s);
    CUdeviceptr done[] = {io, table, qkv, ws, o, h, logits, dlogits, gflat, dh, dO, dqkv};
    for (size_t i = 0; i < sizeof done / sizeof done[0]; i++)
        wl_free(done[i]);
}

int main(int argc, char **argv) {
    static const wl_program_t prog = {
        "xfmr",
        "Trains a small transformer block (8-token sequences of width 32, single-head attention,\n"
        "a residual projection, 16-class per-token logits, SGD with momentum) on synthetic data,\n"
        "the way PyTorch and XLA drive a Hopper GPU: GEMMs through TMA descriptors launched as\n"
        "lazily loaded CUkernels, tensor views at offsets inside buffers, a grouped GEMM through "
        "a\n"
        "table of device pointers in device memory, an explicitly built CUDA graph replayed each\n"
        "step with updated kernel parameters, 2D copies, and a workspace sized from cuMemGetInfo.\n"
        "--batch counts sequences. --no-ptr-table replaces the grouped GEMM by separate GEMMs\n"
        "(same checksum; the run then has no pointers stored in device memory).",
        6, 4};
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--no-ptr-table") == 0) {
            use_table = 0;
            memmove(&argv[i], &argv[i + 1], (size_t)(argc - i) * sizeof *argv);
            argc--;
            break;
        }
    }
    wl_opts_t o;
    wl_parse_args(&prog, argc, argv, &o);
    wl_cuda_init();
    wl_nn_init();
    resolve();
    kernels_init();
    CUstream s = wl_stream_create();

    wl_ops_pause(1);
    for (int i = 0; i < NPARAM; i++) {
        uint64_t n = i == 4 ? (uint64_t)D * C : (uint64_t)D * D;
        W[i] = wl_param_new(s, n, sqrtf(3.0f / (float)D), 0.0f);
    }
    ema = wl_alloc((size_t)D * D * 4);
    snap = wl_alloc((size_t)SNAP_PITCH * D);
    wl_memset32(ema, 0, (size_t)D * D, s);
    wl_memset32(snap, 0, (size_t)SNAP_PITCH / 4 * D, s);
    wl_state_register(ema, (uint64_t)D * D);
    wl_state_register(snap, (uint64_t)SNAP_PITCH / 4 * D);
    graph_build(W[0]->v); /* any valid pointer until the first step's update */
    wl_ops_pause(0);

    int maxb = o.batch > o.last_batch ? o.batch : o.last_batch;
    if (o.change_batch > maxb)
        maxb = o.change_batch;
    size_t ntok = (size_t)maxb * T;
    float *hx = malloc(ntok * D * 4), *staged = malloc(ntok * (D + 4) * 4);
    int32_t *hy = malloc(ntok * 4);
    problem_t *table_host = malloc(6 * sizeof *table_host);
    if (!hx || !staged || !hy || !table_host) {
        fprintf(stderr, "error: xfmr: out of host memory\n");
        return 2;
    }
    memset(staged, 0, ntok * (D + 4) * 4);
    for (int it = 0; it < o.iters; it++) {
        wl_iter_begin(it);
        train_step(s, it, o.iters, wl_batch_size(it), hx, staged, hy, table_host);
    }
    wl_iters_done();

    wl_ops_pause(1);
    uint64_t sum = wl_checksum(s);
    wl_check(cu.GraphExecDestroy(graph_exec), "cuGraphExecDestroy");
    wl_check(cu.GraphDestroy(graph), "cuGraphDestroy");
    wl_free(ema);
    wl_free(snap);
    wl_params_free();
    wl_stream_destroy(s);
    kernels_fini();
    wl_nn_fini();
    wl_cuda_fini();
    free(hx);
    free(staged);
    free(hy);
    free(table_host);
    wl_report(sum);
    return 0;
}
