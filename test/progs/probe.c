/* SPDX-License-Identifier: MIT */
/* probe.c: reaches cuMemGetInfo_v2 one of three ways and prints what it reports, so a test can
 * see whether a preloaded shim intercepted that path.
 *
 * Usage: probe gpa|dlsym|linked. Linked with -lcuda (the simulated driver in tests); prints
 * "total: N", the device memory cuMemGetInfo reports (under the shim: the budget). */
#include <cuda.h>
#include <cudaTypedefs.h>
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#define CHECK(x)                                                                                   \
    do {                                                                                           \
        CUresult r_ = (x);                                                                         \
        if (r_ != CUDA_SUCCESS) {                                                                  \
            fprintf(stderr, "probe: %s failed: %d\n", #x, (int)r_);                                \
            return 2;                                                                              \
        }                                                                                          \
    } while (0)

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: probe gpa|dlsym|linked\n");
        return 2;
    }
    CUdevice dev;
    CUcontext ctx;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    PFN_cuMemGetInfo_v3020 info = NULL;
    if (strcmp(argv[1], "linked") == 0) {
        info = cuMemGetInfo;
    } else {
        void *h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
        if (!h)
            return 2;
        if (strcmp(argv[1], "dlsym") == 0) {
            info = (PFN_cuMemGetInfo_v3020)dlsym(h, "cuMemGetInfo_v2");
        } else {
            PFN_cuGetProcAddress_v12000 gpa =
                (PFN_cuGetProcAddress_v12000)dlsym(h, "cuGetProcAddress_v2");
            CUdriverProcAddressQueryResult st;
            if (!gpa || gpa("cuMemGetInfo", (void **)&info, 12000, 0, &st) != CUDA_SUCCESS)
                return 2;
        }
    }
    if (!info)
        return 2;
    CUdeviceptr p;
    size_t fr, tot;
    CHECK(cuMemAlloc(&p, 100));
    CHECK(info(&fr, &tot));
    printf("total: %zu\n", tot);
    CHECK(cuMemFree(p));
    return 0;
}
