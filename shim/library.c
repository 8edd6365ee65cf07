/* SPDX-License-Identifier: MIT */
/* library.c: cuDNN calls as operations of the program, named by the cuDNN function.
 *
 * A cuDNN call is one operation: before it, every operand it names (tensors, filters, the
 * workspace; a backend variant pack's data pointers and workspace) is made resident on the
 * handle's stream; until its work is issued nothing it uses is evicted (op.c's
 * ooc_op_lib_begin/end hold its chunks); the recorder logs it as kind `cudnn` with the
 * function's name, and the plan is matched against it. The driver calls cuDNN makes inside
 * (its kernels, copies, sets) are parts of it (ooc_lib_depth): made resident and issued, never
 * recorded or matched. So a kernel that reaches an operand through memory no launch scan reads
 * (cuDNN's backend engines may) finds it resident, and the profile names the convolution.
 *
 * Reached two ways, as cuDNN is: a program linked with -lcudnn calls our exported functions (the
 * preloaded library comes first); a program that dlopens libcudnn.so.9 gets our functions from
 * dlsym (real.c), routed by pointer: only the address libcudnn.so.9 itself exports is replaced,
 * so a dispatcher's lookups into cuDNN's sub-libraries stay as they are. The real functions are
 * looked up in the loaded libcudnn.so.9 (never loaded by us: RTLD_NOLOAD), once it is there.
 * A call made while another is in progress on the thread (cuDNN calling itself) passes through.
 *
 * OOC_TEST_LIB_HOOKS=0 (test harness only) passes every call through, so the tests can show that
 * the hooks, not luck, keep the backend API's operands resident. */
#include "hook_int.h"

#include <cudnn.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int lab_oom;
#define uthash_nonfatal_oom(obj) (lab_oom = 1)
#include <uthash.h>

/* The hooked cuDNN functions, and those the hooks call for themselves. */
#define DNN_HOOKED(X)                                                                              \
    X(cudnnConvolutionForward)                                                                     \
    X(cudnnConvolutionBackwardData)                                                                \
    X(cudnnConvolutionBackwardFilter)                                                              \
    X(cudnnConvolutionBackwardBias)                                                                \
    X(cudnnConvolutionBiasActivationForward)                                                       \
    X(cudnnBatchNormalizationForwardTraining)                                                      \
    X(cudnnBatchNormalizationForwardInference)                                                     \
    X(cudnnBatchNormalizationBackward)                                                             \
    X(cudnnActivationForward)                                                                      \
    X(cudnnActivationBackward)                                                                     \
    X(cudnnPoolingForward)                                                                         \
    X(cudnnPoolingBackward)                                                                        \
    X(cudnnSoftmaxForward)                                                                         \
    X(cudnnSoftmaxBackward)                                                                        \
    X(cudnnAddTensor)                                                                              \
    X(cudnnOpTensor)                                                                               \
    X(cudnnBackendExecute)                                                                         \
    X(cudnnBackendCreateDescriptor)                                                                \
    X(cudnnBackendDestroyDescriptor)                                                               \
    X(cudnnBackendSetAttribute)                                                                    \
    X(cudnnBackendGetAttribute)
#define DNN_USED(X) X(cudnnGetStream)

OOC_LIBTAB(dnn_tab, dnn, "libcudnn.so.9", DNN_HOOKED, DNN_USED);

/* dlsym's answer `real` for `name`: our hook when it is the address of a cuDNN function we hook
 * as libcudnn.so.9 exports it, else NULL. */
static void *lib_route(void *real, const char *name) {
    return strncmp(name, "cudnn", 5) == 0 ? ooc_libtab_route(&dnn_tab, real) : NULL;
}

/* Only stores a pointer: real.c's dlsym asks it about cuDNN names from then on. */
__attribute__((constructor)) static void lib_register(void) {
    ooc_real_route_library("cudnn", lib_route);
}

/* Are the hooks on? Off for the test harness's OOC_TEST_LIB_HOOKS=0. */
static int hooks_on(void) {
    static _Atomic int on = -1;
    int v = atomic_load_explicit(&on, memory_order_relaxed);
    if (OOC_UNLIKELY(v < 0)) {
        const char *e = getenv("OOC_TEST_LIB_HOOKS");
        v = !(e && strcmp(e, "0") == 0);
        atomic_store_explicit(&on, v, memory_order_relaxed);
    }
    return v;
}

int ooc_lib_on(void) {
    return managing() && ooc_lib_depth == 0 && hooks_on();
}

static cudnnStatus_t dnn_missing(const char *fn) {
    OOC_LOG_E("%s: called, but no libcudnn.so.9 is loaded in this process", fn);
    return CUDNN_STATUS_NOT_INITIALIZED;
}

void ooc_lib_in(ooc_access_t *a, const void *p) {
    if (p)
        ooc_mem_note_range(a, (uintptr_t)p, 1, OOC_USE_R);
}
void ooc_lib_out(ooc_access_t *a, const void *p) {
    if (p)
        ooc_mem_note_range(a, (uintptr_t)p, 1, OOC_USE_RW);
}
#define lib_in  ooc_lib_in
#define lib_out ooc_lib_out

static CUstream dnn_stream(cudnnHandle_t h) {
    cudaStream_t s = NULL;
    if (!dnn.cudnnGetStream || dnn.cudnnGetStream(h, &s) != CUDNN_STATUS_SUCCESS)
        return NULL;
    return (CUstream)s;
}

int ooc_lib_enter(ooc_live_op_t *op, const ooc_access_t *a, CUstream s, CUresult *err) {
    *err = CUDA_SUCCESS;
    if (OOC_UNLIKELY(atomic_load_explicit(&ooc_graph_captures, memory_order_relaxed))) {
        int cap = 0;
        CUresult c = ooc_graph_capture_note(a, s, 0, &cap);
        if (c != CUDA_SUCCESS) {
            *err = c;
            OOC_LOG_E("%s: its operands could not be noted for the capture (%s)", a->name,
                      ooc_real_errname(c));
            return OOC_LIB_FAIL;
        }
        if (cap)
            return OOC_LIB_AS_IS;
    }
    CUresult r = ooc_op_lib_begin(op, a, s);
    if (r != CUDA_SUCCESS) {
        ooc_op_lib_end(op, r);
        *err = r;
        OOC_LOG_E("%s: its operands could not be made resident (%s)", a->name, ooc_real_errname(r));
        return OOC_LIB_FAIL;
    }
    ooc_stats_add(a->kind == OOC_OP_CUDNN    ? OOC_STAT_library_calls
                  : a->kind == OOC_OP_CUBLAS ? OOC_STAT_blas_calls
                                             : OOC_STAT_nccl_calls,
                  1);
    ooc_lib_depth++;
    return OOC_LIB_RUN;
}

void ooc_lib_done(ooc_live_op_t *op, int ok) {
    ooc_lib_depth--;
    ooc_op_lib_end(op, ok ? CUDA_SUCCESS : CUDA_ERROR_UNKNOWN);
}

/* What a failure to make the operands resident is in cuDNN's words. */
static cudnnStatus_t dnn_status(CUresult r) {
    return r == CUDA_ERROR_OUT_OF_MEMORY ? CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED
                                         : CUDNN_STATUS_EXECUTION_FAILED_CUDA_DRIVER;
}

/* Runs `call` (the real function) as one operation (ooc_lib_enter) on the handle's stream. */
#define LIB_RUN(a, handle, call)                                                                   \
    OOC_LIB_CALL(cudnnStatus_t, CUDNN_STATUS_SUCCESS, dnn_status, (a), dnn_stream(handle), call)

/* The body of a hooked function: `args` its parameters in parentheses, `notes` a parenthesised
 * comma expression of lib_in/lib_out calls on `a`. */
#define DNN_HOOK(fn, handle, args, notes)                                                          \
    do {                                                                                           \
        OOC_LIB_NEED(dnn, dnn_tab, fn, dnn_missing);                                               \
        if (!ooc_lib_on())                                                                         \
            return dnn.fn args;                                                                    \
        ooc_access_t acc_;                                                                         \
        op_start(&acc_, OOC_OP_CUDNN, #fn, 0);                                                     \
        ooc_access_t *a = &acc_;                                                                   \
        (void)notes;                                                                               \
        LIB_RUN(a, handle, dnn.fn args);                                                           \
    } while (0)

/* ---- convolutions ---------------------------------------------------------------------------- */

OOC_EXPORT cudnnStatus_t cudnnConvolutionForward(cudnnHandle_t handle, const void *alpha,
                                                 const cudnnTensorDescriptor_t xDesc, const void *x,
                                                 const cudnnFilterDescriptor_t wDesc, const void *w,
                                                 const cudnnConvolutionDescriptor_t convDesc,
                                                 cudnnConvolutionFwdAlgo_t algo, void *workSpace,
                                                 size_t workSpaceSizeInBytes, const void *beta,
                                                 const cudnnTensorDescriptor_t yDesc, void *y) {
    DNN_HOOK(cudnnConvolutionForward, handle,
             (handle, alpha, xDesc, x, wDesc, w, convDesc, algo, workSpace, workSpaceSizeInBytes,
              beta, yDesc, y),
             (lib_in(a, x), lib_in(a, w), lib_out(a, workSpace), lib_out(a, y)));
}

OOC_EXPORT cudnnStatus_t cudnnConvolutionBackwardData(
    cudnnHandle_t handle, const void *alpha, const cudnnFilterDescriptor_t wDesc, const void *w,
    const cudnnTensorDescriptor_t dyDesc, const void *dy,
    const cudnnConvolutionDescriptor_t convDesc, cudnnConvolutionBwdDataAlgo_t algo,
    void *workSpace, size_t workSpaceSizeInBytes, const void *beta,
    const cudnnTensorDescriptor_t dxDesc, void *dx) {
    DNN_HOOK(cudnnConvolutionBackwardData, handle,
             (handle, alpha, wDesc, w, dyDesc, dy, convDesc, algo, workSpace, workSpaceSizeInBytes,
              beta, dxDesc, dx),
             (lib_in(a, w), lib_in(a, dy), lib_out(a, workSpace), lib_out(a, dx)));
}

OOC_EXPORT cudnnStatus_t cudnnConvolutionBackwardFilter(
    cudnnHandle_t handle, const void *alpha, const cudnnTensorDescriptor_t xDesc, const void *x,
    const cudnnTensorDescriptor_t dyDesc, const void *dy,
    const cudnnConvolutionDescriptor_t convDesc, cudnnConvolutionBwdFilterAlgo_t algo,
    void *workSpace, size_t workSpaceSizeInBytes, const void *beta,
    const cudnnFilterDescriptor_t dwDesc, void *dw) {
    DNN_HOOK(cudnnConvolutionBackwardFilter, handle,
             (handle, alpha, xDesc, x, dyDesc, dy, convDesc, algo, workSpace, workSpaceSizeInBytes,
              beta, dwDesc, dw),
             (lib_in(a, x), lib_in(a, dy), lib_out(a, workSpace), lib_out(a, dw)));
}

OOC_EXPORT cudnnStatus_t cudnnConvolutionBackwardBias(cudnnHandle_t handle, const void *alpha,
                                                      const cudnnTensorDescriptor_t dyDesc,
                                                      const void *dy, const void *beta,
                                                      const cudnnTensorDescriptor_t dbDesc,
                                                      void *db) {
    DNN_HOOK(cudnnConvolutionBackwardBias, handle, (handle, alpha, dyDesc, dy, beta, dbDesc, db),
             (lib_in(a, dy), lib_out(a, db)));
}

OOC_EXPORT cudnnStatus_t cudnnConvolutionBiasActivationForward(
    cudnnHandle_t handle, const void *alpha1, const cudnnTensorDescriptor_t xDesc, const void *x,
    const cudnnFilterDescriptor_t wDesc, const void *w, const cudnnConvolutionDescriptor_t convDesc,
    cudnnConvolutionFwdAlgo_t algo, void *workSpace, size_t workSpaceSizeInBytes,
    const void *alpha2, const cudnnTensorDescriptor_t zDesc, const void *z,
    const cudnnTensorDescriptor_t biasDesc, const void *bias,
    const cudnnActivationDescriptor_t activationDesc, const cudnnTensorDescriptor_t yDesc,
    void *y) {
    DNN_HOOK(cudnnConvolutionBiasActivationForward, handle,
             (handle, alpha1, xDesc, x, wDesc, w, convDesc, algo, workSpace, workSpaceSizeInBytes,
              alpha2, zDesc, z, biasDesc, bias, activationDesc, yDesc, y),
             (lib_in(a, x), lib_in(a, w), lib_in(a, z), lib_in(a, bias), lib_out(a, workSpace),
              lib_out(a, y)));
}

/* ---- batch normalisation --------------------------------------------------------------------- */

OOC_EXPORT cudnnStatus_t cudnnBatchNormalizationForwardTraining(
    cudnnHandle_t handle, cudnnBatchNormMode_t mode, const void *alpha, const void *beta,
    const cudnnTensorDescriptor_t xDesc, const void *x, const cudnnTensorDescriptor_t yDesc,
    void *y, const cudnnTensorDescriptor_t bnScaleBiasMeanVarDesc, const void *bnScale,
    const void *bnBias, double exponentialAverageFactor, void *resultRunningMean,
    void *resultRunningVariance, double epsilon, void *resultSaveMean,
    void *resultSaveInvVariance) {
    DNN_HOOK(cudnnBatchNormalizationForwardTraining, handle,
             (handle, mode, alpha, beta, xDesc, x, yDesc, y, bnScaleBiasMeanVarDesc, bnScale,
              bnBias, exponentialAverageFactor, resultRunningMean, resultRunningVariance, epsilon,
              resultSaveMean, resultSaveInvVariance),
             (lib_in(a, x), lib_in(a, bnScale), lib_in(a, bnBias), lib_out(a, y),
              lib_out(a, resultRunningMean), lib_out(a, resultRunningVariance),
              lib_out(a, resultSaveMean), lib_out(a, resultSaveInvVariance)));
}

OOC_EXPORT cudnnStatus_t cudnnBatchNormalizationForwardInference(
    cudnnHandle_t handle, cudnnBatchNormMode_t mode, const void *alpha, const void *beta,
    const cudnnTensorDescriptor_t xDesc, const void *x, const cudnnTensorDescriptor_t yDesc,
    void *y, const cudnnTensorDescriptor_t bnScaleBiasMeanVarDesc, const void *bnScale,
    const void *bnBias, const void *estimatedMean, const void *estimatedVariance, double epsilon) {
    DNN_HOOK(cudnnBatchNormalizationForwardInference, handle,
             (handle, mode, alpha, beta, xDesc, x, yDesc, y, bnScaleBiasMeanVarDesc, bnScale,
              bnBias, estimatedMean, estimatedVariance, epsilon),
             (lib_in(a, x), lib_in(a, bnScale), lib_in(a, bnBias), lib_in(a, estimatedMean),
              lib_in(a, estimatedVariance), lib_out(a, y)));
}

OOC_EXPORT cudnnStatus_t cudnnBatchNormalizationBackward(
    cudnnHandle_t handle, cudnnBatchNormMode_t mode, const void *alphaDataDiff,
    const void *betaDataDiff, const void *alphaParamDiff, const void *betaParamDiff,
    const cudnnTensorDescriptor_t xDesc, const void *x, const cudnnTensorDescriptor_t dyDesc,
    const void *dy, const cudnnTensorDescriptor_t dxDesc, void *dx,
    const cudnnTensorDescriptor_t dBnScaleBiasDesc, const void *bnScale, void *dBnScaleResult,
    void *dBnBiasResult, double epsilon, const void *savedMean, const void *savedInvVariance) {
    DNN_HOOK(cudnnBatchNormalizationBackward, handle,
             (handle, mode, alphaDataDiff, betaDataDiff, alphaParamDiff, betaParamDiff, xDesc, x,
              dyDesc, dy, dxDesc, dx, dBnScaleBiasDesc, bnScale, dBnScaleResult, dBnBiasResult,
              epsilon, savedMean, savedInvVariance),
             (lib_in(a, x), lib_in(a, dy), lib_in(a, bnScale), lib_in(a, savedMean),
              lib_in(a, savedInvVariance), lib_out(a, dx), lib_out(a, dBnScaleResult),
              lib_out(a, dBnBiasResult)));
}

/* ---- activation, pooling, softmax, tensor arithmetic ----------------------------------------- */

OOC_EXPORT cudnnStatus_t cudnnActivationForward(cudnnHandle_t handle,
                                                cudnnActivationDescriptor_t activationDesc,
                                                const void *alpha,
                                                const cudnnTensorDescriptor_t xDesc, const void *x,
                                                const void *beta,
                                                const cudnnTensorDescriptor_t yDesc, void *y) {
    DNN_HOOK(cudnnActivationForward, handle,
             (handle, activationDesc, alpha, xDesc, x, beta, yDesc, y),
             (lib_in(a, x), lib_out(a, y)));
}

OOC_EXPORT cudnnStatus_t cudnnActivationBackward(
    cudnnHandle_t handle, cudnnActivationDescriptor_t activationDesc, const void *alpha,
    const cudnnTensorDescriptor_t yDesc, const void *y, const cudnnTensorDescriptor_t dyDesc,
    const void *dy, const cudnnTensorDescriptor_t xDesc, const void *x, const void *beta,
    const cudnnTensorDescriptor_t dxDesc, void *dx) {
    DNN_HOOK(cudnnActivationBackward, handle,
             (handle, activationDesc, alpha, yDesc, y, dyDesc, dy, xDesc, x, beta, dxDesc, dx),
             (lib_in(a, y), lib_in(a, dy), lib_in(a, x), lib_out(a, dx)));
}

OOC_EXPORT cudnnStatus_t cudnnPoolingForward(cudnnHandle_t handle,
                                             const cudnnPoolingDescriptor_t poolingDesc,
                                             const void *alpha, const cudnnTensorDescriptor_t xDesc,
                                             const void *x, const void *beta,
                                             const cudnnTensorDescriptor_t yDesc, void *y) {
    DNN_HOOK(cudnnPoolingForward, handle, (handle, poolingDesc, alpha, xDesc, x, beta, yDesc, y),
             (lib_in(a, x), lib_out(a, y)));
}

OOC_EXPORT cudnnStatus_t cudnnPoolingBackward(
    cudnnHandle_t handle, const cudnnPoolingDescriptor_t poolingDesc, const void *alpha,
    const cudnnTensorDescriptor_t yDesc, const void *y, const cudnnTensorDescriptor_t dyDesc,
    const void *dy, const cudnnTensorDescriptor_t xDesc, const void *x, const void *beta,
    const cudnnTensorDescriptor_t dxDesc, void *dx) {
    DNN_HOOK(cudnnPoolingBackward, handle,
             (handle, poolingDesc, alpha, yDesc, y, dyDesc, dy, xDesc, x, beta, dxDesc, dx),
             (lib_in(a, y), lib_in(a, dy), lib_in(a, x), lib_out(a, dx)));
}

OOC_EXPORT cudnnStatus_t cudnnSoftmaxForward(cudnnHandle_t handle, cudnnSoftmaxAlgorithm_t algo,
                                             cudnnSoftmaxMode_t mode, const void *alpha,
                                             const cudnnTensorDescriptor_t xDesc, const void *x,
                                             const void *beta, const cudnnTensorDescriptor_t yDesc,
                                             void *y) {
    DNN_HOOK(cudnnSoftmaxForward, handle, (handle, algo, mode, alpha, xDesc, x, beta, yDesc, y),
             (lib_in(a, x), lib_out(a, y)));
}

OOC_EXPORT cudnnStatus_t cudnnSoftmaxBackward(cudnnHandle_t handle, cudnnSoftmaxAlgorithm_t algo,
                                              cudnnSoftmaxMode_t mode, const void *alpha,
                                              const cudnnTensorDescriptor_t yDesc, const void *y,
                                              const cudnnTensorDescriptor_t dyDesc, const void *dy,
                                              const void *beta,
                                              const cudnnTensorDescriptor_t dxDesc, void *dx) {
    DNN_HOOK(cudnnSoftmaxBackward, handle,
             (handle, algo, mode, alpha, yDesc, y, dyDesc, dy, beta, dxDesc, dx),
             (lib_in(a, y), lib_in(a, dy), lib_out(a, dx)));
}

OOC_EXPORT cudnnStatus_t cudnnAddTensor(cudnnHandle_t handle, const void *alpha,
                                        const cudnnTensorDescriptor_t aDesc, const void *A,
                                        const void *beta, const cudnnTensorDescriptor_t cDesc,
                                        void *C) {
    DNN_HOOK(cudnnAddTensor, handle, (handle, alpha, aDesc, A, beta, cDesc, C),
             (lib_in(a, A), lib_out(a, C)));
}

OOC_EXPORT cudnnStatus_t cudnnOpTensor(cudnnHandle_t handle,
                                       const cudnnOpTensorDescriptor_t opTensorDesc,
                                       const void *alpha1, const cudnnTensorDescriptor_t aDesc,
                                       const void *A, const void *alpha2,
                                       const cudnnTensorDescriptor_t bDesc, const void *B,
                                       const void *beta, const cudnnTensorDescriptor_t cDesc,
                                       void *C) {
    DNN_HOOK(cudnnOpTensor, handle,
             (handle, opTensorDesc, alpha1, aDesc, A, alpha2, bDesc, B, beta, cDesc, C),
             (lib_in(a, A), lib_in(a, B), lib_out(a, C)));
}

/* ---- the backend (graph) API ----------------------------------------------------------------- */

/* What an execution plan computes, for the op's name ("cudnnBackendExecute:conv_fwd"): each
 * backend descriptor the program creates is remembered with its type, and a label follows the
 * chain the program builds with cudnnBackendSetAttribute: the operations set on an operation
 * graph (their kinds joined by '+'), the graph on an engine or a heuristics query, the engine on
 * an engine config (also the configs a heuristics query returns), the config on a plan. Labels
 * are interned (the profile keeps pointers to them); descriptors are forgotten when destroyed. */
typedef struct dlab {
    void *d;
    int type;
    const char *label; /* interned, or NULL */
    const char *exec;  /* plans: the interned op name of an execution of `exec_of` */
    const char *exec_of;
    void **pack_ptrs; /* variant packs: the data pointers and workspace set on it, as set */
    int64_t pack_n;   /* -1: more than OOC_MAX_REFS, or out of memory */
    void *pack_ws;
    unsigned char pack_has; /* PACK_PTRS | PACK_WS: what was set */
    UT_hash_handle hh;
} dlab_t;

enum { PACK_PTRS = 1, PACK_WS = 2 };

static pthread_mutex_t lab_lock = PTHREAD_MUTEX_INITIALIZER;
static dlab_t *dlabs;

/* The interned "cudnnBackendExecute:<label>" or the label itself (prefix NULL). NULL out of
 * memory. */
static const char *intern(const char *prefix, const char *label) {
    char buf[160];
    snprintf(buf, sizeof buf, "%s%s%s", prefix ? prefix : "", prefix ? ":" : "", label);
    return ooc_intern(buf);
}

/* The SDPA descriptors by number: cuDNN 9.19's headers name both, older 9.x headers (the GPU
 * machine's PyTorch wheel) lack the backward one, and the numbers are fixed by the ABI. */
enum { DESC_SDPA_FWD = 41, DESC_SDPA_BWD = 43 };

static const char *op_kind(int type) {
    switch (type) {
    case CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR:
        return "conv_fwd";
    case CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR:
        return "conv_bwd_data";
    case CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR:
        return "conv_bwd_filter";
    case CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR:
        return "pointwise";
    case CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR:
        return "matmul";
    case CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR:
        return "reduction";
    case CUDNN_BACKEND_OPERATION_NORM_FORWARD_DESCRIPTOR:
        return "norm_fwd";
    case CUDNN_BACKEND_OPERATION_NORM_BACKWARD_DESCRIPTOR:
        return "norm_bwd";
    case DESC_SDPA_FWD:
        return "sdpa_fwd";
    case DESC_SDPA_BWD:
        return "sdpa_bwd";
    default:
        return "op";
    }
}

static void lab_free(dlab_t *l) {
    free(l->pack_ptrs);
    free(l);
}

static dlab_t *lab_find(void *d) {
    dlab_t *l = NULL;
    HASH_FIND_PTR(dlabs, &d, l);
    return l;
}

/* An attribute was set on d: carry the label along the chain. Caller holds lab_lock. */
static void lab_set(void *d, cudnnBackendAttributeName_t name, int64_t n, const void *elems) {
    dlab_t *l = lab_find(d);
    if (!l || !elems || n < 1)
        return;
    void *const *v = elems;
    if (name == CUDNN_ATTR_OPERATIONGRAPH_OPS) {
        char buf[128] = "";
        size_t at = 0;
        for (int64_t i = 0; i < n && at < sizeof buf - 16; i++) {
            dlab_t *o = lab_find(v[i]);
            int w = snprintf(buf + at, sizeof buf - at, "%s%s", i ? "+" : "",
                             o ? op_kind(o->type) : "op");
            at += w > 0 ? (size_t)w : 0;
        }
        l->label = intern(NULL, buf);
    } else if (name == CUDNN_ATTR_ENGINE_OPERATION_GRAPH ||
               name == CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH ||
               name == CUDNN_ATTR_ENGINECFG_ENGINE ||
               name == CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG) {
        dlab_t *from = lab_find(v[0]);
        if (from && from->label)
            l->label = from->label;
    }
}

/* A variant pack's data pointers or workspace were set: keep a copy. The real cuDNN (9.19, an
 * H200) refuses to give them back (cudnnBackendGetAttribute: CUDNN_STATUS_NOT_SUPPORTED), so
 * what the program set is the only record of the operands. Caller holds lab_lock. */
static void pack_set(void *d, cudnnBackendAttributeName_t name, int64_t n, const void *elems) {
    dlab_t *l = lab_find(d);
    if (!l || n < 0 || (n > 0 && !elems))
        return;
    if (name == CUDNN_ATTR_VARIANT_PACK_WORKSPACE) {
        l->pack_ws = n > 0 ? *(void *const *)elems : NULL;
        l->pack_has |= PACK_WS;
        return;
    }
    void **v = n > 0 && n <= OOC_MAX_REFS ? malloc((size_t)n * sizeof *v) : NULL;
    free(l->pack_ptrs);
    l->pack_ptrs = v;
    l->pack_n = n == 0 || v ? n : -1;
    if (v)
        memcpy(v, elems, (size_t)n * sizeof *v);
    l->pack_has |= PACK_PTRS;
}

/* Notes every data pointer of the variant pack and its workspace, as the program set them
 * (above), or, for a pack whose setting was not seen, as cuDNN gives them back; 0, or -1 when
 * neither is known (logged once). Every pointer is taken as read and written: which are outputs
 * is the operation graph's business. */
static int note_variant_pack(ooc_access_t *a, cudnnBackendDescriptor_t pack) {
    static _Atomic int warned;
    void *ptrs[OOC_MAX_REFS];
    int64_t n = -1, nws = 0;
    void *ws = NULL;
    cudnnStatus_t st = CUDNN_STATUS_SUCCESS;
    pthread_mutex_lock(&lab_lock);
    dlab_t *l = lab_find(pack);
    int seen = l && (l->pack_has & PACK_PTRS);
    if (seen) {
        n = l->pack_n;
        if (n > 0)
            memcpy(ptrs, l->pack_ptrs, (size_t)n * sizeof *ptrs);
        nws = (l->pack_has & PACK_WS) && l->pack_ws ? 1 : 0;
        ws = l->pack_ws;
    }
    pthread_mutex_unlock(&lab_lock);
    if (!seen) {
        st = dnn.cudnnBackendGetAttribute
                 ? dnn.cudnnBackendGetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS,
                                                CUDNN_TYPE_VOID_PTR, OOC_MAX_REFS, &n, ptrs)
                 : CUDNN_STATUS_NOT_SUPPORTED;
        if (st == CUDNN_STATUS_SUCCESS)
            st = dnn.cudnnBackendGetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE,
                                              CUDNN_TYPE_VOID_PTR, 1, &nws, &ws);
    }
    if (st != CUDNN_STATUS_SUCCESS || n < 0 || n > OOC_MAX_REFS) {
        if (!atomic_exchange(&warned, 1))
            OOC_LOG_W("cudnnBackendExecute: its variant pack's operands are unknown (%s): "
                      "operands only its kernels' parameters name are made resident",
                      st != CUDNN_STATUS_SUCCESS ? "not seen set, and cuDNN does not give them back"
                                                 : "more than the shim records");
        return -1;
    }
    for (int64_t i = 0; i < n; i++)
        lib_out(a, ptrs[i]);
    if (nws == 1)
        lib_out(a, ws);
    return 0;
}

OOC_EXPORT cudnnStatus_t cudnnBackendCreateDescriptor(cudnnBackendDescriptorType_t descriptorType,
                                                      cudnnBackendDescriptor_t *descriptor) {
    OOC_LIB_NEED(dnn, dnn_tab, cudnnBackendCreateDescriptor, dnn_missing);
    cudnnStatus_t st = dnn.cudnnBackendCreateDescriptor(descriptorType, descriptor);
    if (st != CUDNN_STATUS_SUCCESS || !descriptor || !*descriptor || ooc_lib_depth || !managing())
        return st; /* OOC_MODE=off keeps nothing */
    dlab_t *l = calloc(1, sizeof *l);
    if (!l)
        return st; /* only the name is lost */
    l->d = *descriptor;
    l->type = (int)descriptorType;
    pthread_mutex_lock(&lab_lock);
    dlab_t *old = lab_find(l->d); /* a handle value reused without our seeing its destruction */
    if (old) {
        HASH_DEL(dlabs, old);
        lab_free(old);
    }
    lab_oom = 0;
    HASH_ADD_PTR(dlabs, d, l);
    if (lab_oom)
        free(l);
    pthread_mutex_unlock(&lab_lock);
    return st;
}

OOC_EXPORT cudnnStatus_t cudnnBackendDestroyDescriptor(cudnnBackendDescriptor_t descriptor) {
    OOC_LIB_NEED(dnn, dnn_tab, cudnnBackendDestroyDescriptor, dnn_missing);
    pthread_mutex_lock(&lab_lock);
    dlab_t *l = lab_find(descriptor);
    if (l) {
        HASH_DEL(dlabs, l);
        lab_free(l);
    }
    pthread_mutex_unlock(&lab_lock);
    return dnn.cudnnBackendDestroyDescriptor(descriptor);
}

OOC_EXPORT cudnnStatus_t cudnnBackendSetAttribute(cudnnBackendDescriptor_t descriptor,
                                                  cudnnBackendAttributeName_t attributeName,
                                                  cudnnBackendAttributeType_t attributeType,
                                                  int64_t elementCount,
                                                  const void *arrayOfElements) {
    OOC_LIB_NEED(dnn, dnn_tab, cudnnBackendSetAttribute, dnn_missing);
    cudnnStatus_t st = dnn.cudnnBackendSetAttribute(descriptor, attributeName, attributeType,
                                                    elementCount, arrayOfElements);
    if (st == CUDNN_STATUS_SUCCESS && attributeType == CUDNN_TYPE_BACKEND_DESCRIPTOR &&
        !ooc_lib_depth) {
        pthread_mutex_lock(&lab_lock);
        lab_set(descriptor, attributeName, elementCount, arrayOfElements);
        pthread_mutex_unlock(&lab_lock);
    } else if (st == CUDNN_STATUS_SUCCESS && attributeType == CUDNN_TYPE_VOID_PTR &&
               !ooc_lib_depth &&
               (attributeName == CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS ||
                attributeName == CUDNN_ATTR_VARIANT_PACK_WORKSPACE)) {
        pthread_mutex_lock(&lab_lock);
        pack_set(descriptor, attributeName, elementCount, arrayOfElements);
        pthread_mutex_unlock(&lab_lock);
    }
    return st;
}

OOC_EXPORT cudnnStatus_t cudnnBackendGetAttribute(cudnnBackendDescriptor_t const descriptor,
                                                  cudnnBackendAttributeName_t attributeName,
                                                  cudnnBackendAttributeType_t attributeType,
                                                  int64_t requestedElementCount,
                                                  int64_t *elementCount, void *arrayOfElements) {
    OOC_LIB_NEED(dnn, dnn_tab, cudnnBackendGetAttribute, dnn_missing);
    cudnnStatus_t st =
        dnn.cudnnBackendGetAttribute(descriptor, attributeName, attributeType,
                                     requestedElementCount, elementCount, arrayOfElements);
    /* The engine configs a heuristics query returns compute what its graph does. */
    if (st == CUDNN_STATUS_SUCCESS && attributeName == CUDNN_ATTR_ENGINEHEUR_RESULTS &&
        arrayOfElements && elementCount && !ooc_lib_depth) {
        pthread_mutex_lock(&lab_lock);
        dlab_t *h = lab_find(descriptor);
        void **v = arrayOfElements;
        for (int64_t i = 0; h && h->label && i < *elementCount && i < requestedElementCount; i++) {
            dlab_t *c = lab_find(v[i]);
            if (c)
                c->label = h->label;
        }
        pthread_mutex_unlock(&lab_lock);
    }
    return st;
}

/* The op's name for an execution of `plan`: "cudnnBackendExecute:<what it computes>", or
 * "cudnnBackendExecute" when the plan's making was not seen. */
static const char *plan_name(void *plan) {
    const char *name = "cudnnBackendExecute";
    pthread_mutex_lock(&lab_lock);
    dlab_t *l = lab_find(plan);
    if (l && l->label) {
        if (l->exec_of != l->label) { /* formatted and interned once per label of the plan */
            l->exec = intern("cudnnBackendExecute", l->label);
            l->exec_of = l->exec ? l->label : NULL;
        }
        if (l->exec)
            name = l->exec;
    }
    pthread_mutex_unlock(&lab_lock);
    return name;
}

OOC_EXPORT cudnnStatus_t cudnnBackendExecute(cudnnHandle_t handle,
                                             cudnnBackendDescriptor_t executionPlan,
                                             cudnnBackendDescriptor_t variantPack) {
    DNN_HOOK(cudnnBackendExecute, handle, (handle, executionPlan, variantPack),
             (a->name = plan_name(executionPlan), note_variant_pack(a, variantPack)));
}
