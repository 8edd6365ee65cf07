/* SPDX-License-Identifier: MIT */
/* cublas.c: a small simulated cuBLAS 13 (libcublas.so.13) that computes on the simulated device.
 *
 * It exports, with the exact prototypes of cublas_api.h, the handle calls (create, destroy,
 * stream, pointer mode, version, status names) and the float GEMMs: cublasSgemm_v2,
 * cublasGemmEx, cublasSgemmStridedBatched, cublasGemmStridedBatchedEx, cublasSgemmBatched and
 * cublasGemmBatchedEx. Matrices are column-major; transa and transb are N, T or C (C is T for
 * real data); the Ex forms take CUDA_R_32F operands and a CUBLAS_COMPUTE_32F, _32F_PEDANTIC or
 * _32F_FAST_TF32 compute type (computed in float all the same) and anything else is
 * CUBLAS_STATUS_NOT_SUPPORTED. alpha and beta are host pointers: CUBLAS_POINTER_MODE_DEVICE is
 * NOT_SUPPORTED. Arguments are checked as the cuBLAS reference documents: a NULL handle is
 * NOT_INITIALIZED; negative sizes or batch counts, an unknown operation, a leading dimension
 * below max(1, rows), or a NULL alpha or beta is INVALID_VALUE, and nothing is launched. No call
 * allocates device memory or needs a workspace.
 *
 * Every computing call is exactly one kernel launch (module "cublas", kernels_cublas.c) on the
 * handle's stream, except that m == 0, n == 0 or batchCount == 0 returns at once (the BLAS quick
 * return). The plain and strided forms pass A, B and C as kernel parameters; the pointer-array
 * forms pass only the three arrays, which must be in device memory (as cuBLAS defines them): the
 * kernel reads the operands' addresses there. The library reaches the driver as the real one
 * does: dlopen("libcuda.so.1"), dlsym "cuGetProcAddress_v2", and every entry point through it
 * with an explicit ABI version; it never links -lcuda. The driver table is built once
 * (pthread_once); a handle, like a real cuBLAS handle, must not be used by two threads at once.
 * cublasCreate_v2 needs a current context, where it loads the module. */
#include "fc_cublas.h"
#include "fc_cublas_api.h"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

#define BLAS_API __attribute__((visibility("default")))

enum { K_GEMM, K_GEMM_BATCHED, K_COUNT };

static const char *const kernel_names[K_COUNT] = {"gemm_f32", "gemm_batched_f32"};

struct cublasContext {
    CUstream stream;
    CUmodule module;
    CUfunction fn[K_COUNT];
};

/* The driver entry points, resolved once; ok is set when all of them were found. */
static struct {
    pthread_once_t once;
    int ok;
    PFN_cuCtxGetCurrent_v4000 ctx_get_current;
    PFN_cuModuleLoadData_v2000 module_load_data;
    PFN_cuModuleGetFunction_v2000 module_get_function;
    PFN_cuModuleUnload_v2000 module_unload;
    PFN_cuLaunchKernel_v4000 launch_kernel;
} drv = {.once = PTHREAD_ONCE_INIT};

static int resolve(PFN_cuGetProcAddress_v12000 gpa, const char *name, int version, void **out) {
    CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    *out = NULL;
    return gpa(name, out, version, CU_GET_PROC_ADDRESS_DEFAULT, &st) == CUDA_SUCCESS &&
                   st == CU_GET_PROC_ADDRESS_SUCCESS && *out
               ? 0
               : -1;
}

/* Opens the driver and resolves the table; the handle stays open for the process's life, as
 * real libraries keep it. */
static void driver_init(void) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!lib)
        return;
    PFN_cuGetProcAddress_v12000 gpa;
    *(void **)&gpa = dlsym(lib, "cuGetProcAddress_v2");
    if (!gpa)
        return;
    if (resolve(gpa, "cuCtxGetCurrent", 4000, (void **)&drv.ctx_get_current) ||
        resolve(gpa, "cuModuleLoadData", 2000, (void **)&drv.module_load_data) ||
        resolve(gpa, "cuModuleGetFunction", 2000, (void **)&drv.module_get_function) ||
        resolve(gpa, "cuModuleUnload", 2000, (void **)&drv.module_unload) ||
        resolve(gpa, "cuLaunchKernel", 4000, (void **)&drv.launch_kernel))
        return;
    drv.ok = 1;
}

BLAS_API const char *cublasGetStatusName(cublasStatus_t status) {
    switch (status) {
    case CUBLAS_STATUS_SUCCESS:
        return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED:
        return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED:
        return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE:
        return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH:
        return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR:
        return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED:
        return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR:
        return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED:
        return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR:
        return "CUBLAS_STATUS_LICENSE_ERROR";
    }
    return "CUBLAS_STATUS_UNKNOWN";
}

BLAS_API const char *cublasGetStatusString(cublasStatus_t status) {
    switch (status) {
    case CUBLAS_STATUS_SUCCESS:
        return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED:
        return "the library was not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED:
        return "the resource allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE:
        return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_ARCH_MISMATCH:
        return "an absent device architectural feature is required";
    case CUBLAS_STATUS_MAPPING_ERROR:
        return "an access to GPU memory space failed";
    case CUBLAS_STATUS_EXECUTION_FAILED:
        return "the GPU program failed to execute";
    case CUBLAS_STATUS_INTERNAL_ERROR:
        return "an internal operation failed";
    case CUBLAS_STATUS_NOT_SUPPORTED:
        return "the functionality requested is not supported";
    case CUBLAS_STATUS_LICENSE_ERROR:
        return "error detected trying to check the license";
    }
    return "unknown error";
}

/* Creates a handle on the current context's null stream and loads the kernels there. Returns
 * INVALID_VALUE for a NULL handle pointer, NOT_INITIALIZED without a driver or a current
 * context. The caller owns the handle (cublasDestroy_v2). */
BLAS_API cublasStatus_t cublasCreate_v2(cublasHandle_t *handle) {
    if (!handle)
        return CUBLAS_STATUS_INVALID_VALUE;
    pthread_once(&drv.once, driver_init);
    if (!drv.ok)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    CUcontext ctx = NULL;
    if (drv.ctx_get_current(&ctx) != CUDA_SUCCESS || !ctx)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    struct cublasContext *h = calloc(1, sizeof *h);
    if (!h)
        return CUBLAS_STATUS_ALLOC_FAILED;
    if (drv.module_load_data(&h->module, FC_CUBLAS_MODULE) != CUDA_SUCCESS) {
        free(h);
        return CUBLAS_STATUS_NOT_INITIALIZED;
    }
    for (int i = 0; i < K_COUNT; i++) {
        if (drv.module_get_function(&h->fn[i], h->module, kernel_names[i]) != CUDA_SUCCESS) {
            drv.module_unload(h->module);
            free(h);
            return CUBLAS_STATUS_NOT_INITIALIZED;
        }
    }
    *handle = h;
    return CUBLAS_STATUS_SUCCESS;
}

BLAS_API cublasStatus_t cublasDestroy_v2(cublasHandle_t handle) {
    if (!handle)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    cublasStatus_t st = drv.module_unload(handle->module) == CUDA_SUCCESS
                            ? CUBLAS_STATUS_SUCCESS
                            : CUBLAS_STATUS_INTERNAL_ERROR;
    free(handle);
    return st;
}

BLAS_API cublasStatus_t cublasGetVersion_v2(cublasHandle_t handle, int *version) {
    if (!handle)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!version)
        return CUBLAS_STATUS_INVALID_VALUE;
    *version = CUBLAS_VERSION;
    return CUBLAS_STATUS_SUCCESS;
}

BLAS_API cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t streamId) {
    if (!handle)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    handle->stream = (CUstream)streamId;
    return CUBLAS_STATUS_SUCCESS;
}

BLAS_API cublasStatus_t cublasGetStream_v2(cublasHandle_t handle, cudaStream_t *streamId) {
    if (!handle)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!streamId)
        return CUBLAS_STATUS_INVALID_VALUE;
    *streamId = (cudaStream_t)handle->stream;
    return CUBLAS_STATUS_SUCCESS;
}

BLAS_API cublasStatus_t cublasGetPointerMode_v2(cublasHandle_t handle, cublasPointerMode_t *mode) {
    if (!handle)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!mode)
        return CUBLAS_STATUS_INVALID_VALUE;
    *mode = CUBLAS_POINTER_MODE_HOST;
    return CUBLAS_STATUS_SUCCESS;
}

/* Only host scalars are simulated: device mode is NOT_SUPPORTED (the handle stays in host
 * mode), any other value INVALID_VALUE. */
BLAS_API cublasStatus_t cublasSetPointerMode_v2(cublasHandle_t handle, cublasPointerMode_t mode) {
    if (!handle)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (mode == CUBLAS_POINTER_MODE_HOST)
        return CUBLAS_STATUS_SUCCESS;
    return mode == CUBLAS_POINTER_MODE_DEVICE ? CUBLAS_STATUS_NOT_SUPPORTED
                                              : CUBLAS_STATUS_INVALID_VALUE;
}

/* ---- GEMM ------------------------------------------------------------------------------------ */

static int max1(int v) {
    return v > 1 ? v : 1;
}

/* 0 (N), 1 (T, and C, which is T for real data) or -1 for anything else. */
static int op_of(cublasOperation_t op) {
    return op == CUBLAS_OP_N ? 0 : op == CUBLAS_OP_T || op == CUBLAS_OP_C ? 1 : -1;
}

/* Checks a GEMM's arguments as cuBLAS documents them and fills the kernel's geometry (strides
 * 0). Returns SUCCESS, NOT_INITIALIZED (no handle) or INVALID_VALUE. */
static cublasStatus_t gemm_args(cublasHandle_t h, cublasOperation_t transa,
                                cublasOperation_t transb, int m, int n, int k, const void *alpha,
                                int lda, int ldb, const void *beta, int ldc, int batch,
                                fc_gemm_geom_t *g) {
    if (!h)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    int ta = op_of(transa), tb = op_of(transb);
    if (ta < 0 || tb < 0 || m < 0 || n < 0 || k < 0 || batch < 0 || !alpha || !beta)
        return CUBLAS_STATUS_INVALID_VALUE;
    if (lda < max1(ta ? k : m) || ldb < max1(tb ? n : k) || ldc < max1(m))
        return CUBLAS_STATUS_INVALID_VALUE;
    *g = (fc_gemm_geom_t){.ta = ta,
                          .tb = tb,
                          .m = m,
                          .n = n,
                          .k = k,
                          .lda = lda,
                          .ldb = ldb,
                          .ldc = ldc,
                          .batch = batch,
                          .alpha = *(const float *)alpha,
                          .beta = *(const float *)beta};
    return CUBLAS_STATUS_SUCCESS;
}

/* The Ex forms' extra arguments: float operands, a float compute type, a known algorithm. */
static cublasStatus_t ex_args(cudaDataType a, cudaDataType b, cudaDataType c,
                              cublasComputeType_t compute, cublasGemmAlgo_t algo) {
    if (a != CUDA_R_32F || b != CUDA_R_32F || c != CUDA_R_32F)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if (compute != CUBLAS_COMPUTE_32F && compute != CUBLAS_COMPUTE_32F_PEDANTIC &&
        compute != CUBLAS_COMPUTE_32F_FAST_TF32)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    int ok = (algo >= CUBLAS_GEMM_DEFAULT && algo <= CUBLAS_GEMM_ALGO23) ||
             (algo >= CUBLAS_GEMM_DEFAULT_TENSOR_OP && algo <= CUBLAS_GEMM_ALGO15_TENSOR_OP);
    return ok ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_SUPPORTED;
}

static CUdeviceptr dptr(const void *p) {
    return (CUdeviceptr)(uintptr_t)p;
}

/* Launches kernel k of handle h on its stream: three pointers and the geometry; nothing for an
 * empty problem (the BLAS quick return). */
static cublasStatus_t launch(cublasHandle_t h, int k, CUdeviceptr p0, CUdeviceptr p1,
                             CUdeviceptr p2, fc_gemm_geom_t *g) {
    if (g->m == 0 || g->n == 0 || g->batch == 0)
        return CUBLAS_STATUS_SUCCESS;
    uint64_t tiles = ((uint64_t)g->m + 63) / 64 * (((uint64_t)g->n + 63) / 64);
    unsigned gx = tiles > 65535 ? 65535 : (unsigned)tiles;
    unsigned gz = g->batch > 65535 ? 65535 : (unsigned)g->batch;
    void *args[] = {&p0, &p1, &p2, g};
    CUresult r = drv.launch_kernel(h->fn[k], gx, 1, gz, 256, 1, 1, 0, h->stream, args, NULL);
    return r == CUDA_SUCCESS ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}

/* Strided GEMMs (the plain ones are batch 1, strides 0). */
static cublasStatus_t strided(cublasHandle_t handle, cublasOperation_t transa,
                              cublasOperation_t transb, int m, int n, int k, const void *alpha,
                              const void *A, int lda, long long sa, const void *B, int ldb,
                              long long sb, const void *beta, void *C, int ldc, long long sc,
                              int batch) {
    fc_gemm_geom_t g;
    cublasStatus_t st =
        gemm_args(handle, transa, transb, m, n, k, alpha, lda, ldb, beta, ldc, batch, &g);
    if (st)
        return st;
    g.stride_a = sa, g.stride_b = sb, g.stride_c = sc;
    return launch(handle, K_GEMM, dptr(A), dptr(B), dptr(C), &g);
}

static cublasStatus_t batched(cublasHandle_t handle, cublasOperation_t transa,
                              cublasOperation_t transb, int m, int n, int k, const void *alpha,
                              const void *const Aarray[], int lda, const void *const Barray[],
                              int ldb, const void *beta, void *const Carray[], int ldc, int batch) {
    fc_gemm_geom_t g;
    cublasStatus_t st =
        gemm_args(handle, transa, transb, m, n, k, alpha, lda, ldb, beta, ldc, batch, &g);
    if (st)
        return st;
    return launch(handle, K_GEMM_BATCHED, dptr(Aarray), dptr(Barray), dptr(Carray), &g);
}

BLAS_API cublasStatus_t cublasSgemm_v2(cublasHandle_t handle, cublasOperation_t transa,
                                       cublasOperation_t transb, int m, int n, int k,
                                       const float *alpha, const float *A, int lda, const float *B,
                                       int ldb, const float *beta, float *C, int ldc) {
    return strided(handle, transa, transb, m, n, k, alpha, A, lda, 0, B, ldb, 0, beta, C, ldc, 0,
                   1);
}

BLAS_API cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                                     cublasOperation_t transb, int m, int n, int k,
                                     const void *alpha, const void *A, cudaDataType Atype, int lda,
                                     const void *B, cudaDataType Btype, int ldb, const void *beta,
                                     void *C, cudaDataType Ctype, int ldc,
                                     cublasComputeType_t computeType, cublasGemmAlgo_t algo) {
    if (!handle)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    cublasStatus_t st = ex_args(Atype, Btype, Ctype, computeType, algo);
    if (st)
        return st;
    return strided(handle, transa, transb, m, n, k, alpha, A, lda, 0, B, ldb, 0, beta, C, ldc, 0,
                   1);
}

BLAS_API cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t handle, cublasOperation_t transa,
                                                  cublasOperation_t transb, int m, int n, int k,
                                                  const float *alpha, const float *A, int lda,
                                                  long long int strideA, const float *B, int ldb,
                                                  long long int strideB, const float *beta,
                                                  float *C, int ldc, long long int strideC,
                                                  int batchCount) {
    return strided(handle, transa, transb, m, n, k, alpha, A, lda, strideA, B, ldb, strideB, beta,
                   C, ldc, strideC, batchCount);
}

BLAS_API cublasStatus_t cublasGemmStridedBatchedEx(
    cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
    const void *alpha, const void *A, cudaDataType Atype, int lda, long long int strideA,
    const void *B, cudaDataType Btype, int ldb, long long int strideB, const void *beta, void *C,
    cudaDataType Ctype, int ldc, long long int strideC, int batchCount,
    cublasComputeType_t computeType, cublasGemmAlgo_t algo) {
    if (!handle)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    cublasStatus_t st = ex_args(Atype, Btype, Ctype, computeType, algo);
    if (st)
        return st;
    return strided(handle, transa, transb, m, n, k, alpha, A, lda, strideA, B, ldb, strideB, beta,
                   C, ldc, strideC, batchCount);
}

BLAS_API cublasStatus_t cublasSgemmBatched(cublasHandle_t handle, cublasOperation_t transa,
                                           cublasOperation_t transb, int m, int n, int k,
                                           const float *alpha, const float *const Aarray[], int lda,
                                           const float *const Barray[], int ldb, const float *beta,
                                           float *const Carray[], int ldc, int batchCount) {
    return batched(handle, transa, transb, m, n, k, alpha, (const void *const *)Aarray, lda,
                   (const void *const *)Barray, ldb, beta, (void *const *)Carray, ldc, batchCount);
}

BLAS_API cublasStatus_t cublasGemmBatchedEx(cublasHandle_t handle, cublasOperation_t transa,
                                            cublasOperation_t transb, int m, int n, int k,
                                            const void *alpha, const void *const Aarray[],
                                            cudaDataType Atype, int lda, const void *const Barray[],
                                            cudaDataType Btype, int ldb, const void *beta,
                                            void *const Carray[], cudaDataType Ctype, int ldc,
                                            int batchCount, cublasComputeType_t computeType,
                                            cublasGemmAlgo_t algo) {
    if (!handle)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    cublasStatus_t st = ex_args(Atype, Btype, Ctype, computeType, algo);
    if (st)
        return st;
    return batched(handle, transa, transb, m, n, k, alpha, Aarray, lda, Barray, ldb, beta, Carray,
                   ldc, batchCount);
}
