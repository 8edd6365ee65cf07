/* SPDX-License-Identifier: MIT */
/* blas.c: cuBLAS and cuBLASLt calls as operations of the program, named by the function.
 *
 * The same as library.c does for cuDNN (ooc_lib_enter/ooc_lib_done): before a GEMM its
 * operands are made resident on the handle's stream (cublasGetStream_v2; cublasLtMatmul names
 * its stream) and held until its work is issued; the profile has one op of kind `cublas` named by
 * the function; the kernels cuBLAS launches are parts of it. Reached by the dynamic linker
 * (exported functions) or by dlsym (routed by pointer, real.c), the real functions looked up in
 * the loaded libcublas.so.13 and libcublasLt.so.13.
 *
 * Operands: A, B and C (and cublasLtMatmul's D, bias and epilogue buffer, and workspace) are
 * noted as the buffers that hold them: a strided batch lies in one buffer. The pointer-array
 * forms (cublas*Batched) keep their operands' addresses in device memory: the arrays are read from
 * the host's copy of what the program wrote there (shadow.c), with no wait, when the program
 * wrote them from the host (or copied them on the device from such a range) and nothing has
 * written them since; otherwise they are read back after the handle's stream has done what came
 * before (a synchronisation, counted in OOC_STATS). Either way every matrix they name is
 * resident for the call. */
#include "hook_int.h"

/* cuBLAS's headers test macros C does not define and declare f() without void. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wundef"
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <cublasLt.h>
#include <cublas_v2.h>
#pragma GCC diagnostic pop
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

#define BLAS_HOOKED(X)                                                                             \
    X(cublasSgemm_v2)                                                                              \
    X(cublasGemmEx)                                                                                \
    X(cublasSgemmStridedBatched)                                                                   \
    X(cublasGemmStridedBatchedEx)                                                                  \
    X(cublasSgemmBatched)                                                                          \
    X(cublasGemmBatchedEx)
#define BLAS_USED(X) X(cublasGetStream_v2)
#define LT_HOOKED(X) X(cublasLtMatmul)
#define LT_USED(X)   X(cublasLtMatmulDescGetAttribute)

/* cuBLAS and cuBLASLt are two libraries; the hooks of each are in its table. */
OOC_LIBTAB(blas_tab, blas, "libcublas.so.13", BLAS_HOOKED, BLAS_USED);
OOC_LIBTAB(lt_tab, blt, "libcublasLt.so.13", LT_HOOKED, LT_USED);

/* dlsym's answer `real` for a cublas* name: our hook when it is the address the loaded
 * libcublas.so.13 or libcublasLt.so.13 exports for a function we hook. */
static void *blas_route(void *real, const char *name) {
    return ooc_libtab_route(strncmp(name, "cublasLt", 8) == 0 ? &lt_tab : &blas_tab, real);
}

__attribute__((constructor)) static void blas_register(void) {
    ooc_real_route_library("cublas", blas_route);
}

static cublasStatus_t blas_missing(const char *fn) {
    OOC_LOG_E("%s: called, but no %s is loaded in this process", fn,
              strncmp(fn, "cublasLt", 8) == 0 ? "libcublasLt.so.13" : "libcublas.so.13");
    return CUBLAS_STATUS_NOT_INITIALIZED;
}

static CUstream blas_stream(cublasHandle_t h) {
    cudaStream_t s = NULL;
    if (!blas.cublasGetStream_v2 || blas.cublasGetStream_v2(h, &s) != CUBLAS_STATUS_SUCCESS)
        return NULL;
    return (CUstream)s;
}

static cublasStatus_t blas_status(CUresult r) {
    return r == CUDA_ERROR_OUT_OF_MEMORY ? CUBLAS_STATUS_ALLOC_FAILED
                                         : CUBLAS_STATUS_EXECUTION_FAILED;
}

/* The body of a hooked function of library `fns` (blas or blt, table `tab`): `args` its
 * parameters in parentheses, `notes` a parenthesised expression noting the operands in `a`,
 * `stream` the stream it runs on. */
#define BLAS_HOOK(fns, tab, fn, stream, args, notes)                                               \
    do {                                                                                           \
        OOC_LIB_NEED(fns, tab, fn, blas_missing);                                                  \
        if (!ooc_lib_on())                                                                         \
            return fns.fn args;                                                                    \
        ooc_access_t acc_;                                                                         \
        op_start(&acc_, OOC_OP_CUBLAS, #fn, 0);                                                    \
        ooc_access_t *a = &acc_;                                                                   \
        (void)notes;                                                                               \
        OOC_LIB_CALL(cublasStatus_t, CUBLAS_STATUS_SUCCESS, blas_status, a, (stream),              \
                     fns.fn args);                                                                 \
    } while (0)

static int abc(ooc_access_t *a, const void *A, const void *B, const void *C) {
    ooc_lib_in(a, A);
    ooc_lib_in(a, B);
    ooc_lib_out(a, C);
    return 0;
}

/* ---- plain and strided GEMM ------------------------------------------------------------------ */

OOC_EXPORT cublasStatus_t cublasSgemm_v2(cublasHandle_t handle, cublasOperation_t transa,
                                         cublasOperation_t transb, int m, int n, int k,
                                         const float *alpha, const float *A, int lda,
                                         const float *B, int ldb, const float *beta, float *C,
                                         int ldc) {
    BLAS_HOOK(blas, blas_tab, cublasSgemm_v2, blas_stream(handle),
              (handle, transa, transb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc),
              abc(a, A, B, C));
}

OOC_EXPORT cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                                       cublasOperation_t transb, int m, int n, int k,
                                       const void *alpha, const void *A, cudaDataType Atype,
                                       int lda, const void *B, cudaDataType Btype, int ldb,
                                       const void *beta, void *C, cudaDataType Ctype, int ldc,
                                       cublasComputeType_t computeType, cublasGemmAlgo_t algo) {
    BLAS_HOOK(blas, blas_tab, cublasGemmEx, blas_stream(handle),
              (handle, transa, transb, m, n, k, alpha, A, Atype, lda, B, Btype, ldb, beta, C, Ctype,
               ldc, computeType, algo),
              abc(a, A, B, C));
}

OOC_EXPORT cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t handle, cublasOperation_t transa,
                                                    cublasOperation_t transb, int m, int n, int k,
                                                    const float *alpha, const float *A, int lda,
                                                    long long int strideA, const float *B, int ldb,
                                                    long long int strideB, const float *beta,
                                                    float *C, int ldc, long long int strideC,
                                                    int batchCount) {
    BLAS_HOOK(blas, blas_tab, cublasSgemmStridedBatched, blas_stream(handle),
              (handle, transa, transb, m, n, k, alpha, A, lda, strideA, B, ldb, strideB, beta, C,
               ldc, strideC, batchCount),
              abc(a, A, B, C));
}

OOC_EXPORT cublasStatus_t cublasGemmStridedBatchedEx(
    cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
    const void *alpha, const void *A, cudaDataType Atype, int lda, long long int strideA,
    const void *B, cudaDataType Btype, int ldb, long long int strideB, const void *beta, void *C,
    cudaDataType Ctype, int ldc, long long int strideC, int batchCount,
    cublasComputeType_t computeType, cublasGemmAlgo_t algo) {
    BLAS_HOOK(blas, blas_tab, cublasGemmStridedBatchedEx, blas_stream(handle),
              (handle, transa, transb, m, n, k, alpha, A, Atype, lda, strideA, B, Btype, ldb,
               strideB, beta, C, Ctype, ldc, strideC, batchCount, computeType, algo),
              abc(a, A, B, C));
}

/* ---- pointer-array GEMM ---------------------------------------------------------------------- */

/* Reads the three arrays of n addresses into v (3n): from the host's copy of what the program
 * wrote there (shadow.c: no wait) when it holds them, else back from the device once the handle's
 * stream has done what came before (a synchronisation on the hot path, counted). */
static CUresult read_arrays(void **v, size_t n, CUstream s, const void *const arr[3]) {
    int hits = 0;
    for (int i = 0; i < 3; i++)
        hits += ooc_shadow_read((uintptr_t)arr[i], v + (size_t)i * n, n * sizeof *v);
    ooc_stats_add(OOC_STAT_ptr_arrays_kept, (uint64_t)hits);
    if (hits == 3)
        return CUDA_SUCCESS;
    /* Only when the arrays are the shim's: its copy below makes them resident as an op would. */
    for (int i = 0; i < 3; i++)
        if (!ooc_mem_owns((uintptr_t)arr[i]))
            return CUDA_ERROR_INVALID_VALUE;
    ooc_stats_add(OOC_STAT_ptr_arrays_synced, (uint64_t)(3 - hits));
    CUresult r = ooc_real.cuStreamSynchronize(s);
    /* The shim's own reads: made resident as the call's parts are, neither recorded nor matched. */
    ooc_lib_depth++;
    for (int i = 0; i < 3 && r == CUDA_SUCCESS; i++)
        r = ooc_hook_cuMemcpyDtoH_v2(v + (size_t)i * n, (CUdeviceptr)arr[i], n * sizeof *v);
    ooc_lib_depth--;
    return r;
}

/* Notes the three arrays and every matrix they name (read_arrays); when they cannot be read (not
 * device memory of ours, a driver error) only the arrays are noted and a kernel reaching a matrix
 * that is not resident faults without safe mode (logged once). */
static int note_arrays(ooc_access_t *a, CUstream s, const void *const *Aa, const void *const *Ba,
                       void *const *Ca, int batch) {
    static _Atomic int warned;
    ooc_lib_in(a, Aa);
    ooc_lib_in(a, Ba);
    ooc_lib_in(a, Ca);
    if (batch <= 0)
        return 0;
    size_t n = (size_t)batch;
    void **v = malloc(3 * n * sizeof *v);
    const void *arr[3] = {Aa, Ba, Ca};
    CUresult r = v ? read_arrays(v, n, s, arr) : CUDA_ERROR_OUT_OF_MEMORY;
    if (r != CUDA_SUCCESS) {
        if (!atomic_exchange(&warned, 1))
            OOC_LOG_W("%s: its pointer arrays could not be read (%s): the matrices they name are "
                      "made resident only if something else names them",
                      a->name, ooc_real_errname(r));
        free(v);
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        ooc_lib_in(a, v[i]);
        ooc_lib_in(a, v[n + i]);
        ooc_lib_out(a, v[2 * n + i]);
    }
    free(v);
    return 0;
}

OOC_EXPORT cublasStatus_t cublasSgemmBatched(cublasHandle_t handle, cublasOperation_t transa,
                                             cublasOperation_t transb, int m, int n, int k,
                                             const float *alpha, const float *const Aarray[],
                                             int lda, const float *const Barray[], int ldb,
                                             const float *beta, float *const Carray[], int ldc,
                                             int batchCount) {
    BLAS_HOOK(blas, blas_tab, cublasSgemmBatched, blas_stream(handle),
              (handle, transa, transb, m, n, k, alpha, Aarray, lda, Barray, ldb, beta, Carray, ldc,
               batchCount),
              note_arrays(a, blas_stream(handle), (const void *const *)Aarray,
                          (const void *const *)Barray, (void *const *)Carray, batchCount));
}

OOC_EXPORT cublasStatus_t
cublasGemmBatchedEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                    int m, int n, int k, const void *alpha, const void *const Aarray[],
                    cudaDataType Atype, int lda, const void *const Barray[], cudaDataType Btype,
                    int ldb, const void *beta, void *const Carray[], cudaDataType Ctype, int ldc,
                    int batchCount, cublasComputeType_t computeType, cublasGemmAlgo_t algo) {
    BLAS_HOOK(blas, blas_tab, cublasGemmBatchedEx, blas_stream(handle),
              (handle, transa, transb, m, n, k, alpha, Aarray, Atype, lda, Barray, Btype, ldb, beta,
               Carray, Ctype, ldc, batchCount, computeType, algo),
              note_arrays(a, blas_stream(handle), Aarray, Barray, Carray, batchCount));
}

/* ---- cuBLASLt -------------------------------------------------------------------------------- */

/* The descriptor's bias and epilogue buffers, when set. */
static int note_lt_desc(ooc_access_t *a, cublasLtMatmulDesc_t d) {
    static const cublasLtMatmulDescAttributes_t ptrs[] = {
        CUBLASLT_MATMUL_DESC_BIAS_POINTER, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER};
    if (!blt.cublasLtMatmulDescGetAttribute)
        return -1;
    for (size_t i = 0; i < sizeof ptrs / sizeof ptrs[0]; i++) {
        void *p = NULL;
        size_t got = 0;
        if (blt.cublasLtMatmulDescGetAttribute(d, ptrs[i], &p, sizeof p, &got) ==
                CUBLAS_STATUS_SUCCESS &&
            got == sizeof p)
            ooc_lib_out(a, p);
    }
    return 0;
}

OOC_EXPORT cublasStatus_t cublasLtMatmul(cublasLtHandle_t lightHandle,
                                         cublasLtMatmulDesc_t computeDesc, const void *alpha,
                                         const void *A, cublasLtMatrixLayout_t Adesc, const void *B,
                                         cublasLtMatrixLayout_t Bdesc, const void *beta,
                                         const void *C, cublasLtMatrixLayout_t Cdesc, void *D,
                                         cublasLtMatrixLayout_t Ddesc,
                                         const cublasLtMatmulAlgo_t *algo, void *workspace,
                                         size_t workspaceSizeInBytes, cudaStream_t stream) {
    BLAS_HOOK(blt, lt_tab, cublasLtMatmul, (CUstream)stream,
              (lightHandle, computeDesc, alpha, A, Adesc, B, Bdesc, beta, C, Cdesc, D, Ddesc, algo,
               workspace, workspaceSizeInBytes, stream),
              (abc(a, A, B, C), ooc_lib_out(a, D), ooc_lib_out(a, workspace),
               note_lt_desc(a, computeDesc)));
}
