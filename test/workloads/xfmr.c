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
 * The checksum covers the weights, the moving averages and the snapshots.
 *
 * --blocks N (1..16, default 1) stacks N such blocks (h of one is x of the next; Wo starts 1/N
 * as large so the residual stream stays bounded), each with its own weights, moving average of
 * its Wo, snapshot (of Wo; the last block's of Wc) and graph (the last one also steps Wc), and
 * each doing all of the above. A block's activations (QKV, workspace, O, h) live from its
 * forward to its backward; its graph runs right after its backward (a later block's weights
 * are not read again that step), and a block other than the first frees its buffers then. So
 * the footprint grows by one block's activations per block while the largest operation (a
 * grouped GEMM over the batch buffer and a QKV-sized buffer) stays the same. With --blocks 1
 * the program issues exactly the ops, allocations and frees it did before the option existed:
 * same checksum, op count and peak. The gradient at a block's input (for the block before it)
 * is dh + dQ Wq^T + dK Wk^T + dV Wv^T: three TMA GEMMs and an add, which the first block skips. */
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

/* ---- the optimizer graphs ---------------------------------------------------------------------
 */

/* One transformer block: its weights, the moving average and snapshot its graph keeps, the
 * graph itself, and this step's activations (kept from its forward to its backward). The last
 * block's graph also steps the classifier Wc and snapshots it; the others snapshot their Wo. */
typedef struct block {
    wl_param_t *W[NPARAM]; /* Wq, Wk, Wv, Wo, and in the last block Wc */
    int nsgd;              /* 5 in the last block, else 4 */
    CUdeviceptr ema, snap; /* moving average of Wo; pitched snapshot (Wc or Wo) */
    int snap_cols;         /* columns of the snapshotted weight (C or D) */
    CUgraph graph;
    CUgraphExec exec;
    CUgraphNode sgd_node[NPARAM];
    CUdeviceptr sgd_grad[NPARAM]; /* what the SGD nodes' parameters point at (copied) */
    CUdeviceptr qkv, ws, o, h;    /* this step's activations */
} block_t;

enum { MAX_BLOCKS = 16 };
static block_t blk[MAX_BLOCKS];
static int nblocks = 1;
static float sgd_lr;
static float momentum = MOMENTUM, wd = WD;

static size_t snap_pitch(const block_t *bk) {
    return (size_t)bk->snap_cols * 4 + 64;
}

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

static void sgd_args(block_t *bk, int i, void **args) {
    args[0] = &bk->W[i]->w;
    args[1] = &bk->sgd_grad[i];
    args[2] = &bk->W[i]->v;
    args[3] = &bk->W[i]->n;
    args[4] = &sgd_lr;
    args[5] = &momentum;
    args[6] = &wd;
}

/* Ops one launch of a block's graph runs: its SGD steps, two in the child, a memset, a memcpy. */
static int graph_ops(const block_t *bk) {
    return bk->nsgd + 2 + 2;
}

/* Builds a block's graph once: the SGD nodes (parameters set per step), then the child graph
 * (ema = 0.9 ema + 0.1 Wo) after all of them, then memset snap and copy the snapshotted weight
 * (Wc in the last block, else Wo) into it (2D). */
static void graph_build(block_t *bk, CUdeviceptr some_grad) {
    CUcontext ctx;
    wl_check(cu.CtxGetCurrent(&ctx), "cuCtxGetCurrent");
    wl_check(cu.GraphCreate(&bk->graph, 0), "cuGraphCreate");
    for (int i = 0; i < bk->nsgd; i++) {
        bk->sgd_grad[i] = some_grad;
        void *args[7];
        sgd_args(bk, i, args);
        CUDA_KERNEL_NODE_PARAMS p = node_params(f_sgd, args);
        wl_check(cu.GraphAddKernelNode(&bk->sgd_node[i], bk->graph, NULL, 0, &p),
                 "cuGraphAddKernelNode");
    }
    CUgraph child;
    CUgraphNode a, b, sub, set, copy;
    wl_check(cu.GraphCreate(&child, 0), "cuGraphCreate");
    uint64_t n = bk->W[3]->n;
    float decay = 0.9f, mix = 0.1f;
    void *sargs[] = {&n, &decay, &bk->ema};
    CUDA_KERNEL_NODE_PARAMS sp = node_params(f_scale, sargs);
    wl_check(cu.GraphAddKernelNode(&a, child, NULL, 0, &sp), "cuGraphAddKernelNode");
    void *aargs[] = {&n, &mix, &bk->W[3]->w, &bk->ema};
    CUDA_KERNEL_NODE_PARAMS ap = node_params(f_axpy, aargs);
    wl_check(cu.GraphAddKernelNode(&b, child, &a, 1, &ap), "cuGraphAddKernelNode");
    wl_check(cu.GraphAddChildGraphNode(&sub, bk->graph, bk->sgd_node, (size_t)bk->nsgd, child),
             "cuGraphAddChildGraphNode");
    wl_check(cu.GraphDestroy(child), "cuGraphDestroy"); /* the node holds its own copy */
    const size_t pitch = snap_pitch(bk), width = (size_t)bk->snap_cols * 4;
    CUDA_MEMSET_NODE_PARAMS ms = {.dst = bk->snap,
                                  .pitch = pitch,
                                  .value = 0,
                                  .elementSize = 4,
                                  .width = pitch / 4,
                                  .height = D};
    wl_check(cu.GraphAddMemsetNode(&set, bk->graph, bk->sgd_node, (size_t)bk->nsgd, &ms, ctx),
             "cuGraphAddMemsetNode");
    CUDA_MEMCPY3D cp = {.srcMemoryType = CU_MEMORYTYPE_DEVICE,
                        .srcDevice = bk->W[bk->nsgd - 1]->w,
                        .srcPitch = width,
                        .dstXInBytes = 16,
                        .dstMemoryType = CU_MEMORYTYPE_DEVICE,
                        .dstDevice = bk->snap,
                        .dstPitch = pitch,
                        .WidthInBytes = width,
                        .Height = D,
                        .Depth = 1};
    CUgraphNode after[2] = {sub, set};
    wl_check(cu.GraphAddMemcpyNode(&copy, bk->graph, after, 2, &cp, ctx), "cuGraphAddMemcpyNode");
    wl_check(cu.GraphInstantiate(&bk->exec, bk->graph, 0), "cuGraphInstantiateWithFlags");
}

/* Points a block's SGD nodes at this step's gradients and learning rate, then launches its
 * graph. */
static void graph_step(block_t *bk, CUstream s, const CUdeviceptr *grads, int it, int iters) {
    sgd_lr = LR * (1.0f - 0.5f * (float)it / (float)(iters > 1 ? iters : 1));
    for (int i = 0; i < bk->nsgd; i++) {
        bk->sgd_grad[i] = grads[i];
        void *args[7];
        sgd_args(bk, i, args);
        CUDA_KERNEL_NODE_PARAMS p = node_params(f_sgd, args);
        wl_check(cu.GraphExecKernelNodeSetParams(bk->exec, bk->sgd_node[i], &p),
                 "cuGraphExecKernelNodeSetParams");
    }
    wl_check(cu.GraphLaunch(bk->exec, s), "cuGraphLaunch");
    wl_ops_add(graph_ops(bk));
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
        gemm(s, 0, 0, n, D, D, 1.0f, x, D, blk[0].W[0]->w, D, 0.0f, scratch, D);
    wl_sync(s);
    wl_free(scratch);
    wl_ops_pause(0);
}

/* One block's forward on its input x (N tokens): Q, K, V through the grouped GEMM (its
 * problems staged in `th`), attention sequence by sequence on views, h = x + O Wo. The
 * activations stay in the block until its backward. */
static void block_forward(block_t *bk, CUstream s, int B, CUdeviceptr x, CUdeviceptr table,
                          problem_t *th) {
    const int N = B * T;
    const size_t act = (size_t)N * D * 4;
    const float scale = 1.0f / sqrtf((float)D);

    /* Q, K, V: views of one buffer. */
    CUdeviceptr qkv = wl_alloc(3 * act), q = qkv, k = qkv + act, v = qkv + 2 * act;
    problem_t proj[3];
    for (int i = 0; i < 3; i++)
        proj[i] = (problem_t){x, bk->W[i]->w, qkv + i * act, N, D, D, D, D, D, 0, 0, 1.0f, 0.0f};
    gemm3(s, proj, table, th);

    /* Attention, sequence by sequence on views; S, P, dP, dS are views of the workspace. */
    const size_t tt = (size_t)B * T * T * 4;
    CUdeviceptr ws = wl_alloc(workspace_bytes(4 * tt));
    CUdeviceptr S = ws, P = ws + tt;
    const size_t seq = (size_t)T * D * 4, sq = (size_t)T * T * 4;
    for (int b = 0; b < B; b++)
        gemm(s, 0, 1, T, T, D, 1.0f, q + b * seq, D, k + b * seq, D, 0.0f, S + b * sq, T);
    int rows = N, cols = T;
    void *smargs[] = {&S, &P, &rows, &cols, (void *)&scale};
    launch_kernel(k_softmax, smargs, s);
    CUdeviceptr o = wl_alloc(act);
    for (int b = 0; b < B; b++)
        gemm(s, 0, 0, T, D, T, 1.0f, P + b * sq, T, v + b * seq, D, 0.0f, o + b * seq, D);

    /* h = x + O Wo. */
    CUdeviceptr h = wl_alloc(act);
    gemm(s, 0, 0, N, D, D, 1.0f, o, D, bk->W[3]->w, D, 0.0f, h, D);
    uint64_t nact = (uint64_t)N * D;
    void *addargs[] = {&h, &x, &h, &nact};
    launch_nn(f_add, addargs, s);
    bk->qkv = qkv;
    bk->ws = ws;
    bk->o = o;
    bk->h = h;
}

/* One block's backward from dh (the loss's gradient at its output h) on its input x: the weight
 * gradients into g (g[3] = dWo; dWq, dWk, dWv through the grouped GEMM, problems staged in
 * `th`); dO and dQKV in buffers it allocates and returns in *dO_out and *dqkv_out. With dx
 * (the first block has none: its input is the data), also the gradient at x:
 * dx = dh + dQ Wq^T + dK Wk^T + dV Wv^T, in a buffer it allocates. */
static void block_backward(block_t *bk, CUstream s, int B, CUdeviceptr x, CUdeviceptr dh,
                           const CUdeviceptr *g, CUdeviceptr dO, CUdeviceptr dqkv,
                           CUdeviceptr table, problem_t *th, CUdeviceptr *dx) {
    const int N = B * T;
    const size_t act = (size_t)N * D * 4;
    const float scale = 1.0f / sqrtf((float)D);
    const size_t tt = (size_t)B * T * T * 4;
    const size_t seq = (size_t)T * D * 4, sq = (size_t)T * T * 4;
    CUdeviceptr q = bk->qkv, k = bk->qkv + act, v = bk->qkv + 2 * act;
    CUdeviceptr P = bk->ws + tt, dP = bk->ws + 2 * tt, dS = bk->ws + 3 * tt;
    int rows = N, cols = T;
    gemm(s, 1, 0, D, D, N, 1.0f, bk->o, D, dh, D, 0.0f, g[3], D);
    gemm(s, 0, 1, N, D, D, 1.0f, dh, D, bk->W[3]->w, D, 0.0f, dO, D);
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
    gemm3(s, wg, table, th);
    if (!dx)
        return;
    *dx = wl_alloc(act);
    for (int i = 0; i < 3; i++)
        gemm(s, 0, 1, N, D, D, 1.0f, dqkv + i * act, D, bk->W[i]->w, D, i ? 1.0f : 0.0f, *dx, D);
    uint64_t nact = (uint64_t)N * D;
    void *addargs[] = {dx, &dh, dx, &nact};
    launch_nn(f_add, addargs, s);
}

/* The weight gradients of a block (nsgd of them) as views of one flat buffer it allocates. */
static CUdeviceptr grads_alloc(const block_t *bk, CUdeviceptr *g) {
    size_t goff[NPARAM + 1] = {0};
    for (int i = 0; i < bk->nsgd; i++)
        goff[i + 1] = goff[i] + bk->W[i]->n * 4;
    CUdeviceptr gflat = wl_alloc(goff[bk->nsgd]);
    for (int i = 0; i < bk->nsgd; i++)
        g[i] = gflat + goff[i];
    return gflat;
}

/* One step: the blocks' forwards in order, the loss, then the blocks' backwards in reverse,
 * each followed by its graph (its weights are not needed again this step). A block other than
 * the first frees its buffers after its graph; the first block's, the batch's and the head's
 * are freed at the end (with --blocks 1 exactly as the one-block program always did). */
static void train_step(CUstream s, int it, int iters, int B, float *hx, float *staged, int32_t *hy,
                       problem_t *table_host) {
    const int N = B * T;
    const size_t act = (size_t)N * D * 4;
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
    for (int l = 0; l < nblocks; l++)
        block_forward(&blk[l], s, B, l ? blk[l - 1].h : x, table, table_host + 6 * l);

    /* logits = h Wc; loss. */
    block_t *last = &blk[nblocks - 1];
    int rows = N, classes = C;
    CUdeviceptr logits = wl_alloc((size_t)N * C * 4), dlogits = wl_alloc((size_t)N * C * 4);
    CUdeviceptr loss = wl_alloc_async(4, s);
    void *xargs[] = {&logits, &labels, &loss, &dlogits, &rows, &classes};
    gemm(s, 0, 0, N, C, D, 1.0f, last->h, D, last->W[4]->w, C, 0.0f, logits, C);
    launch_nn(f_xent, xargs, s);

    /* Backward. Each block's weight gradients are views of one flat buffer. */
    CUdeviceptr g[NPARAM], gflat = grads_alloc(last, g);
    CUdeviceptr dh = wl_alloc(act), dO = wl_alloc(act), dqkv = wl_alloc(3 * act);
    gemm(s, 1, 0, D, C, N, 1.0f, last->h, D, dlogits, C, 0.0f, g[4], C);
    gemm(s, 0, 1, N, D, C, 1.0f, dlogits, C, last->W[4]->w, C, 0.0f, dh, D);
    for (int l = nblocks - 1; l >= 0; l--) {
        block_t *bk = &blk[l];
        if (l < nblocks - 1) {
            gflat = grads_alloc(bk, g);
            dO = wl_alloc(act);
            dqkv = wl_alloc(3 * act);
        }
        CUdeviceptr dx = 0;
        block_backward(bk, s, B, l ? blk[l - 1].h : x, dh, g, dO, dqkv, table,
                       table_host + 6 * l + 3, l ? &dx : NULL);
        /* The optimizer: the block's graph, with this step's gradients and learning rate. */
        graph_step(bk, s, g, it, iters);
        if (l == 0)
            break;
        CUdeviceptr done[] = {bk->qkv, bk->ws, bk->o, bk->h, gflat, dh, dO, dqkv};
        for (size_t i = 0; i < sizeof done / sizeof done[0]; i++)
            wl_free(done[i]);
        dh = dx;
    }
    wl_iter_end(it, s, loss);
    wl_free_async(loss, s);
    block_t *b0 = &blk[0];
    CUdeviceptr done[] = {io,     table,   b0->qkv, b0->ws, b0->o, b0->h,
                          logits, dlogits, gflat,   dh,     dO,    dqkv};
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
        "(same checksum; the run then has no pointers stored in device memory).\n"
        "--blocks N (1..16, default 1) stacks N transformer blocks in sequence, each with its own\n"
        "weights, moving average, snapshot and graph (the last block's graph also steps the\n"
        "classifier); every block uses every path above. Each adds about 1.8 MiB at --batch 256\n"
        "(its activations; 70 KiB at the default batch) and 6 ops per sequence plus 22 per\n"
        "iteration, while the largest operation stays the same (--blocks 12 --batch 256: about\n"
        "23.5 MiB, 18700 ops per iteration with the pointer table).",
        6, 4};
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--no-ptr-table") == 0) {
            use_table = 0;
            memmove(&argv[i], &argv[i + 1], (size_t)(argc - i) * sizeof *argv);
            argc--;
            break;
        }
    }
    /* --blocks is this program's own option too; the shared parser sees the rest. */
    for (int i = 1; i + 1 < argc; i++) {
        if (strcmp(argv[i], "--blocks") == 0) {
            char *end;
            long n = strtol(argv[i + 1], &end, 10);
            if (*end != '\0' || n < 1 || n > MAX_BLOCKS) {
                fprintf(stderr, "error: xfmr: --blocks %s: expected an integer from 1 to %d\n",
                        argv[i + 1], MAX_BLOCKS);
                return 2;
            }
            nblocks = (int)n;
            memmove(&argv[i], &argv[i + 2], (size_t)(argc - i - 1) * sizeof *argv);
            argc -= 2;
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
    /* Each block's Wq, Wk, Wv, Wo in order, then Wc (the order seeds the weights). Wo starts
     * 1/N as large with N blocks, so that the residual stream stays bounded as blocks stack
     * (without it 16 blocks diverge within a few steps); N = 1 keeps the scale exactly. */
    const float wscale[NPARAM - 1] = {1.0f, 1.0f, 1.0f, 1.0f / (float)nblocks};
    for (int l = 0; l < nblocks; l++) {
        blk[l].nsgd = l == nblocks - 1 ? NPARAM : NPARAM - 1;
        blk[l].snap_cols = l == nblocks - 1 ? C : D;
        for (int i = 0; i < NPARAM - 1; i++)
            blk[l].W[i] =
                wl_param_new(s, (uint64_t)D * D, sqrtf(3.0f / (float)D) * wscale[i], 0.0f);
    }
    blk[nblocks - 1].W[4] = wl_param_new(s, (uint64_t)D * C, sqrtf(3.0f / (float)D), 0.0f);
    for (int l = 0; l < nblocks; l++) {
        block_t *bk = &blk[l];
        size_t snap_n = snap_pitch(bk) / 4 * D;
        bk->ema = wl_alloc((size_t)D * D * 4);
        bk->snap = wl_alloc(snap_n * 4);
        wl_memset32(bk->ema, 0, (size_t)D * D, s);
        wl_memset32(bk->snap, 0, snap_n, s);
        wl_state_register(bk->ema, (uint64_t)D * D);
        wl_state_register(bk->snap, (uint64_t)snap_n);
    }
    for (int l = 0; l < nblocks; l++)
        graph_build(&blk[l], blk[0].W[0]->v); /* any valid pointer until the first update */
    wl_ops_pause(0);

    int maxb = o.batch > o.last_batch ? o.batch : o.last_batch;
    if (o.change_batch > maxb)
        maxb = o.change_batch;
    size_t ntok = (size_t)maxb * T;
    float *hx = malloc(ntok * D * 4), *staged = malloc(ntok * (D + 4) * 4);
    int32_t *hy = malloc(ntok * 4);
    problem_t *table_host = malloc((size_t)nblocks * 6 * sizeof *table_host);
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
    for (int l = 0; l < nblocks; l++) {
        wl_check(cu.GraphExecDestroy(blk[l].exec), "cuGraphExecDestroy");
        wl_check(cu.GraphDestroy(blk[l].graph), "cuGraphDestroy");
    }
    for (int l = 0; l < nblocks; l++) {
        wl_free(blk[l].ema);
        wl_free(blk[l].snap);
    }
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
