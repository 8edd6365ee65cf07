/* SPDX-License-Identifier: MIT */
/* probe.c: reaches cuMemGetInfo_v2 one of three ways and prints what it reports, so a test can
 * see whether a preloaded shim intercepted that path; or prints its environment and a set of
 * driver answers, so a test can see whether a preloaded shim changed anything.
 *
 * With `share`, tries to share a 1 MiB cuMemAlloc buffer outside the process and prints each
 * answer's name: "share: ipc NAME", "share: retain NAME", "share: multicast NAME".
 *
 * Usage: probe gpa|dlsym|linked|answers|share. Linked with -lcuda (the simulated driver in tests);
 * prints "total: N", the device memory cuMemGetInfo reports (under the shim: the budget). With
 * `answers`, first one line "env: NAME=VALUE" per environment variable (in environ's order),
 * then "answer: ..." lines: driver version, device name and memory, attributes, granularity,
 * free and total memory around an allocation, the allocation's range size. */
#include <cuda.h>
#include <cudaTypedefs.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

extern char **environ;

#define CHECK(x)                                                                                   \
    do {                                                                                           \
        CUresult r_ = (x);                                                                         \
        if (r_ != CUDA_SUCCESS) {                                                                  \
            fprintf(stderr, "probe: %s failed: %d\n", #x, (int)r_);                                \
            return 2;                                                                              \
        }                                                                                          \
    } while (0)

static int answers(void) {
    for (char **e = environ; *e; e++)
        printf("env: %s\n", *e);
    int v;
    CUdevice dev;
    CUcontext ctx;
    char name[256];
    size_t bytes, fr, tot, gran, range;
    CHECK(cuDriverGetVersion(&v));
    printf("answer: driver %d\n", v);
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDeviceGetName(name, sizeof name, dev));
    CHECK(cuDeviceTotalMem(&bytes, dev));
    printf("answer: device %s, %zu bytes\n", name, bytes);
    static const CUdevice_attribute attrs[] = {
        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
        CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
        CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED};
    for (size_t i = 0; i < sizeof attrs / sizeof attrs[0]; i++) {
        CHECK(cuDeviceGetAttribute(&v, attrs[i], dev));
        printf("answer: attribute %d = %d\n", (int)attrs[i], v);
    }
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                .location = {CU_MEM_LOCATION_TYPE_DEVICE, 0}};
    CHECK(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    printf("answer: granularity %zu\n", gran);
    CHECK(cuMemGetInfo(&fr, &tot));
    printf("answer: free %zu total %zu\n", fr, tot);
    CUdeviceptr p;
    CHECK(cuMemAlloc(&p, 3 << 20));
    CHECK(cuMemGetInfo(&fr, &tot));
    CHECK(cuPointerGetAttribute(&range, CU_POINTER_ATTRIBUTE_RANGE_SIZE, p));
    printf("answer: after 3 MiB: free %zu total %zu range %zu\n", fr, tot, range);
    CHECK(cuMemFree(p));
    CHECK(cuMemGetInfo(&fr, &tot));
    printf("answer: after free: free %zu total %zu\n", fr, tot);
    return 0;
}

static void say_answer(const char *what, CUresult r) {
    const char *n = NULL;
    printf("share: %s %s\n", what, cuGetErrorName(r, &n) == CUDA_SUCCESS && n ? n : "?");
}

static int share(void) {
    CUdevice dev;
    CUcontext ctx;
    CUdeviceptr p;
    CUipcMemHandle ipc;
    CUmemGenericAllocationHandle h;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuMemAlloc(&p, 1 << 20));
    say_answer("ipc", cuIpcGetMemHandle(&ipc, p + 4096));
    CUresult r = cuMemRetainAllocationHandle(&h, (void *)(uintptr_t)p);
    say_answer("retain", r);
    if (r == CUDA_SUCCESS)
        CHECK(cuMemRelease(h));
    say_answer("multicast", cuMulticastBindAddr(1, 0, p, 1 << 20, 0));
    CHECK(cuMemFree(p));
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: probe gpa|dlsym|linked|answers|share\n");
        return 2;
    }
    if (strcmp(argv[1], "answers") == 0)
        return answers();
    if (strcmp(argv[1], "share") == 0)
        return share();
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
