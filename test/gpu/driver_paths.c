/* SPDX-License-Identifier: MIT */
/* driver_paths.c: the driver API reached three ways, as programs and libraries reach it, so that
 * scripts/check-gpu can show the shim intercepting each on a real driver:
 *
 *   --path lcuda     calls through the symbols of a program linked with -lcuda;
 *   --path dlsym     dlopen("libcuda.so.1") and dlsym on that handle (cuBLASLt's way);
 *   --path getproc   cuGetProcAddress_v2 (the runtime's way), itself from dlsym.
 *
 * Each loads the PTX of kernels.cu (embedded by the Makefile as gk_kernels_ptx), allocates,
 * copies, sets and launches, and checks the bytes. Prints PASS/FAIL lines and "issued:
 * allocations A launches L". Exit 0 when right, 1 when wrong, 3 on a driver error, 77 without a
 * device, 2 on a usage error. */
#include <cuda.h>
#include <cudaTypedefs.h>
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

#include "gk.h"

extern const char gk_kernels_ptx[];

static const char *const prog = "driver_paths";

static struct {
    PFN_cuInit_v2000 init;
    PFN_cuDeviceGetCount_v2000 device_get_count;
    PFN_cuDeviceGet_v2000 device_get;
    PFN_cuDevicePrimaryCtxRetain_v7000 primary_ctx_retain;
    PFN_cuCtxSetCurrent_v4000 ctx_set_current;
    PFN_cuCtxSynchronize_v2000 ctx_synchronize;
    PFN_cuModuleLoadData_v2000 module_load_data;
    PFN_cuModuleGetFunction_v2000 module_get_function;
    PFN_cuMemAlloc_v3020 mem_alloc;
    PFN_cuMemFree_v3020 mem_free;
    PFN_cuMemcpyHtoD_v3020 memcpy_htod;
    PFN_cuMemcpyDtoH_v3020 memcpy_dtoh;
    PFN_cuMemsetD32_v3020 memset_d32;
    PFN_cuLaunchKernel_v4000 launch_kernel;
} d;

#define CK(call)                                                                                   \
    do {                                                                                           \
        CUresult r_ = (call);                                                                      \
        if (r_ != CUDA_SUCCESS) {                                                                  \
            printf("ERROR %s: %s: error %d\n", prog, #call, (int)r_);                              \
            exit(3);                                                                               \
        }                                                                                          \
    } while (0)

/* Fills d through the symbols this program is linked with. */
static void by_link(void) {
    d.init = cuInit;
    d.device_get_count = cuDeviceGetCount;
    d.device_get = cuDeviceGet;
    d.primary_ctx_retain = cuDevicePrimaryCtxRetain;
    d.ctx_set_current = cuCtxSetCurrent;
    d.ctx_synchronize = cuCtxSynchronize;
    d.module_load_data = cuModuleLoadData;
    d.module_get_function = cuModuleGetFunction;
    d.mem_alloc = cuMemAlloc;
    d.mem_free = cuMemFree;
    d.memcpy_htod = cuMemcpyHtoD;
    d.memcpy_dtoh = cuMemcpyDtoH;
    d.memset_d32 = cuMemsetD32;
    d.launch_kernel = cuLaunchKernel;
}

/* The address of a function: dlsym on the libcuda handle, or cuGetProcAddress_v2 (name without
 * its ABI suffix, the version asked for being this toolkit's). */
static void *lookup(void *h, PFN_cuGetProcAddress_v12000 gpa, const char *sym, const char *base) {
    void *p = NULL;
    if (gpa) {
        CUdriverProcAddressQueryResult q;
        CUresult r = gpa(base, &p, CUDA_VERSION, CU_GET_PROC_ADDRESS_DEFAULT, &q);
        if (r != CUDA_SUCCESS || q != CU_GET_PROC_ADDRESS_SUCCESS)
            p = NULL;
    } else {
        p = dlsym(h, sym);
    }
    if (!p) {
        printf("ERROR %s: cannot resolve %s\n", prog, gpa ? base : sym);
        exit(3);
    }
    return p;
}

#define LOOKUP(field, sym, base)                                                                   \
    memcpy(&d.field, (void *[]){lookup(h, gpa, sym, base)}, sizeof(void *))

static void by_handle(int getproc) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) {
        printf("SKIP %s: cannot open libcuda.so.1 (%s)\n", prog, dlerror());
        exit(GK_SKIP);
    }
    PFN_cuGetProcAddress_v12000 gpa = NULL;
    if (getproc) {
        void *p = dlsym(h, "cuGetProcAddress_v2");
        if (!p) {
            printf("ERROR %s: no cuGetProcAddress_v2 in libcuda.so.1\n", prog);
            exit(3);
        }
        memcpy(&gpa, &p, sizeof p);
    }
    LOOKUP(init, "cuInit", "cuInit");
    LOOKUP(device_get_count, "cuDeviceGetCount", "cuDeviceGetCount");
    LOOKUP(device_get, "cuDeviceGet", "cuDeviceGet");
    LOOKUP(primary_ctx_retain, "cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRetain");
    LOOKUP(ctx_set_current, "cuCtxSetCurrent", "cuCtxSetCurrent");
    LOOKUP(module_load_data, "cuModuleLoadData", "cuModuleLoadData");
    LOOKUP(module_get_function, "cuModuleGetFunction", "cuModuleGetFunction");
    LOOKUP(mem_alloc, "cuMemAlloc_v2", "cuMemAlloc");
    LOOKUP(mem_free, "cuMemFree_v2", "cuMemFree");
    LOOKUP(memcpy_htod, "cuMemcpyHtoD_v2", "cuMemcpyHtoD");
    LOOKUP(memcpy_dtoh, "cuMemcpyDtoH_v2", "cuMemcpyDtoH");
    LOOKUP(memset_d32, "cuMemsetD32_v2", "cuMemsetD32");
    LOOKUP(launch_kernel, "cuLaunchKernel", "cuLaunchKernel");
    /* cuCtxSynchronize has a CUDA 13 ABI with a context argument: ask for the one without. */
    if (gpa) {
        void *p = NULL;
        CUdriverProcAddressQueryResult q;
        if (gpa("cuCtxSynchronize", &p, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &q) != CUDA_SUCCESS)
            p = NULL;
        if (!p) {
            printf("ERROR %s: cannot resolve cuCtxSynchronize\n", prog);
            exit(3);
        }
        memcpy(&d.ctx_synchronize, &p, sizeof p);
    } else {
        LOOKUP(ctx_synchronize, "cuCtxSynchronize", "cuCtxSynchronize");
    }
}

enum { NBUF = 4, WORDS = 1 << 20 };

int main(int argc, char **argv) {
    const char *path = argc == 3 && strcmp(argv[1], "--path") == 0 ? argv[2] : "";
    if (strcmp(path, "lcuda") == 0) {
        by_link();
    } else if (strcmp(path, "dlsym") == 0 || strcmp(path, "getproc") == 0) {
        by_handle(strcmp(path, "getproc") == 0);
    } else {
        fprintf(stderr, "usage: %s --path lcuda|dlsym|getproc\n", argv[0]);
        return 2;
    }
    int n = 0;
    if (d.init(0) != CUDA_SUCCESS || d.device_get_count(&n) != CUDA_SUCCESS || n == 0) {
        printf("SKIP %s: no CUDA device\n", prog);
        return GK_SKIP;
    }
    printf("shim: %s; path %s\n",
           dlsym(RTLD_DEFAULT, "ooc_mark_iteration") ? "loaded" : "not loaded", path);
    CUdevice dev;
    CUcontext ctx;
    CK(d.device_get(&dev, 0));
    CK(d.primary_ctx_retain(&ctx, dev));
    CK(d.ctx_set_current(ctx));
    CUmodule mod;
    CUfunction fill, sum;
    CK(d.module_load_data(&mod, gk_kernels_ptx));
    CK(d.module_get_function(&fill, mod, "gk_fill"));
    CK(d.module_get_function(&sum, mod, "gk_sum"));
    unsigned allocs = 0, launches = 0;
    CUdeviceptr buf[NBUF], sums;
    for (int k = 0; k < NBUF; k++, allocs++)
        CK(d.mem_alloc(&buf[k], WORDS * sizeof(uint32_t)));
    CK(d.mem_alloc(&sums, NBUF * sizeof(unsigned long long)));
    allocs++;
    unsigned long long zero[NBUF] = {0};
    CK(d.memcpy_htod(sums, zero, sizeof zero));
    unsigned long long words = WORDS;
    for (int k = 0; k < NBUF; k++, launches++) {
        uint32_t seed = 7U + (uint32_t)k;
        void *args[] = {&buf[k], &words, &seed};
        CK(d.launch_kernel(fill, 256, 1, 1, 256, 1, 1, 0, NULL, args, NULL));
    }
    CK(d.memset_d32(buf[NBUF - 1], 0xa5a5a5a5U, WORDS));
    for (int k = 0; k < NBUF; k++, launches++) {
        CUdeviceptr out = sums + (CUdeviceptr)k * sizeof(unsigned long long);
        void *args[] = {&buf[k], &words, &out};
        CK(d.launch_kernel(sum, 128, 1, 1, 256, 1, 1, 0, NULL, args, NULL));
    }
    unsigned long long got[NBUF];
    CK(d.memcpy_dtoh(got, sums, sizeof got));
    CK(d.ctx_synchronize());
    int ok = 1;
    for (int k = 0; k < NBUF; k++) {
        uint64_t want = 0;
        if (k == NBUF - 1)
            for (uint64_t i = 0; i < WORDS; i++)
                want += gk_term(i, 0xa5a5a5a5U);
        else
            want = gk_expected_sum(WORDS, 7U + (uint32_t)k);
        ok &= got[k] == want;
    }
    gk_report(prog, ok, "kernels from PTX, copies and a set give the expected bytes", NULL);
    for (int k = 0; k < NBUF; k++)
        CK(d.mem_free(buf[k]));
    CK(d.mem_free(sums));
    printf("issued: allocations %u launches %u\n", allocs, launches);
    return gk_failures ? 1 : 0;
}
