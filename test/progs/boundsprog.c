/* SPDX-License-Identifier: MIT */
/* boundsprog.c: what a program may get wrong, and what it may ask, about its allocations.
 *
 * 1. Wrong calls: copies (host to device, device to host, device to device, unified, async,
 *    batched) and sets (8, 32 bit, 2D) that run past a buffer's end, and copies and sets on a
 *    freed pointer. Each prints the driver's answer; afterwards every buffer must hold what the
 *    program put there (a wrong call writes nothing, to its buffer or a neighbour).
 * 2. End pointers: each iteration, for every buffer, the kernel rev walks the buffer backwards
 *    from its end pointer, its only reference to the buffer (every buffer ends where no other
 *    begins: in a slab slot's padding or inside its last chunk). The footprint is four times the
 * budget the tests give: buffers are swapped out and in between the launches.
 * 3. Pointer attributes, per allocation: BUFFER_ID the same at every byte of one allocation,
 *    different between allocations, the same after the iterations (after swaps); the range,
 *    memory type, device ordinal and context; cuPointerGetAttributes agreeing; a freed pointer
 *    and the host pointer of device memory.
 *
 * Buffers: NB of 4 KiB to 150 KiB (run with FAKECUDA_GRANULARITY=64K and OOC_CHUNK=64K).
 * Options: --iters N (default 6). Output: one line per wrong call and per attribute check, then
 * "checksum: H" (FNV-1a 64 of every buffer after the last iteration). Exit status: 0 when every
 * byte is right; 1 when one is wrong; 2 when a driver call that must succeed failed
 * ("error: <call>: <name> (<code>)"). Linked with -lcuda. */
#include <cuda.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "userprog.h"

#define NB 32

/* rev(uint32_t *end, int n, uint32_t k): end[-1 - i] = end[-1 - i] * 5 + i + k for i < n. */
static int k_rev(fakecuda_launch_t *l) {
    CUdeviceptr e = FAKECUDA_ARG(l, 0, CUdeviceptr);
    int n = FAKECUDA_ARG(l, 1, int);
    uint32_t k = FAKECUDA_ARG(l, 2, uint32_t);
    uint32_t *p = fakecuda_access(l, e - (size_t)n * 4, (size_t)n * 4, 1);
    if (!p)
        return -1;
    for (int i = 0; i < n; i++)
        p[n - 1 - i] = p[n - 1 - i] * 5u + (uint32_t)i + k;
    return 0;
}

static const fakecuda_kernel_t kernels[] = {{"boundsprog", "rev", 3, {8, 4, 4}, k_rev},
                                            UP_MIX_KERNEL("boundsprog")};

static void model_rev(uint32_t *p, int n, uint32_t k) {
    for (int i = 0; i < n; i++)
        p[n - 1 - i] = p[n - 1 - i] * 5u + (uint32_t)i + k;
}

static CUdeviceptr buf[NB];
static uint32_t *model[NB];
static int words[NB];

/* Buffer b's size in 32-bit words: the even ones small, the odd ones over two chunks of 64 KiB,
 * each ending where no other buffer begins (the shim's promise for end pointers holds there). */
static int size_words(int b) {
    return b % 2 == 0 ? 1000 + 7 * b : 30000 + 501 * (b % 16);
}

static const char *err_name(CUresult r) {
    const char *s = "?";
    cuGetErrorName(r, &s);
    return s;
}

static void say(const char *what, CUresult r) {
    printf("%s: %s\n", what, err_name(r));
}

/* Are the buffers what the model says? */
static int intact(void) {
    int ok = 1;
    for (int b = 0; b < NB; b++) {
        uint32_t *h = malloc((size_t)words[b] * 4);
        if (!h)
            exit(2);
        UP_CHECK(cuMemcpyDtoH(h, buf[b], (size_t)words[b] * 4));
        if (memcmp(h, model[b], (size_t)words[b] * 4) != 0)
            ok = 0;
        free(h);
    }
    return ok;
}

static void wrong_calls(CUstream s) {
    static uint32_t host[1 << 16];
    memset(host, 0xAB, sizeof host);
    size_t s0 = (size_t)words[0] * 4, s1 = (size_t)words[1] * 4;
    say("HtoD 16 bytes from 8 before the end", cuMemcpyHtoD(buf[0] + s0 - 8, host, 16));
    say("HtoD of a large buffer's size plus 4", cuMemcpyHtoD(buf[1], host, s1 + 4));
    say("DtoH 16 bytes from 8 before the end",
        cuMemcpyDtoH(host, buf[2] + (size_t)words[2] * 4 - 8, 16));
    say("DtoD source runs past its end", cuMemcpyDtoD(buf[1], buf[0] + 8, s0));
    say("DtoD destination runs past its end", cuMemcpyDtoD(buf[0] + 8, buf[1], s0));
    say("unified copy past the end", cuMemcpy(buf[4] + (size_t)words[4] * 4 - 4, buf[3], 8));
    say("HtoDAsync past the end", cuMemcpyHtoDAsync(buf[3] + 4, host, (size_t)words[3] * 4, s));
    say("DtoDAsync past the end", cuMemcpyDtoDAsync(buf[5], buf[6] + 4, (size_t)words[6] * 4, s));
    say("memset D8 past the end", cuMemsetD8(buf[0] + s0 - 4, 0xEE, 8));
    say("memset D32 one word too many", cuMemsetD32(buf[1], 0xEEEEEEEEu, (size_t)words[1] + 1));
    say("memset D32 async past the end",
        cuMemsetD32Async(buf[7], 0xEEEEEEEEu, (size_t)words[7] + 1, s));
    say("memset 2D past the end", cuMemsetD2D8(buf[0], 1024, 0xEE, 64, 5));
    CUdeviceptr d[3] = {buf[8], buf[9], buf[10]}, src[3] = {buf[11], buf[12], buf[13]};
    size_t n[3] = {(size_t)words[8] * 4, (size_t)words[12] * 4 + 64, 16}, ai = 0;
    CUmemcpyAttributes at;
    memset(&at, 0, sizeof at);
    at.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
    say("batch with copy 1 past its source's end",
        cuMemcpyBatchAsync(d, src, n, 3, &at, &ai, 1, s));
    CUdeviceptr gone;
    UP_CHECK(cuMemAlloc(&gone, 4096));
    UP_CHECK(cuMemsetD8(gone, 0, 16)); /* checked while live: the shim must not remember it so */
    UP_CHECK(cuMemFree(gone));
    say("HtoD to a freed pointer", cuMemcpyHtoD(gone, host, 16));
    say("DtoH from a freed pointer", cuMemcpyDtoH(host, gone, 16));
    say("memset of a freed pointer", cuMemsetD8(gone, 0, 16));
    say("DtoD from a freed pointer", cuMemcpyDtoD(buf[0], gone, 16));
    UP_CHECK(cuStreamSynchronize(s));
    printf("buffers intact after the wrong calls: %s\n", intact() ? "yes" : "no");
}

typedef struct attrs {
    unsigned long long id[3];
    CUdeviceptr start;
    size_t size;
    unsigned type;
    int ordinal;
    CUcontext ctx;
} attrs_t;

static attrs_t attrs_of(int b) {
    attrs_t a;
    size_t bytes = (size_t)words[b] * 4;
    CUdeviceptr at[3] = {buf[b], buf[b] + bytes / 2, buf[b] + bytes - 1};
    for (int i = 0; i < 3; i++)
        UP_CHECK(cuPointerGetAttribute(&a.id[i], CU_POINTER_ATTRIBUTE_BUFFER_ID, at[i]));
    UP_CHECK(cuPointerGetAttribute(&a.start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, at[2]));
    UP_CHECK(cuPointerGetAttribute(&a.size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, at[1]));
    UP_CHECK(cuPointerGetAttribute(&a.type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, at[1]));
    UP_CHECK(cuPointerGetAttribute(&a.ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, at[2]));
    UP_CHECK(cuPointerGetAttribute(&a.ctx, CU_POINTER_ATTRIBUTE_CONTEXT, at[0]));
    return a;
}

/* cuPointerGetAttributes at the middle of b: agrees with a? */
static int plural_agrees(int b, const attrs_t *a) {
    unsigned long long id = 0;
    CUdeviceptr start = 0;
    size_t size = 0;
    unsigned type = 0;
    int ordinal = -1;
    CUpointer_attribute which[] = {
        CU_POINTER_ATTRIBUTE_BUFFER_ID, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
        CU_POINTER_ATTRIBUTE_RANGE_SIZE, CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
        CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL};
    void *data[] = {&id, &start, &size, &type, &ordinal};
    UP_CHECK(cuPointerGetAttributes(5, which, data, buf[b] + (size_t)words[b] * 2));
    return id == a->id[0] && start == a->start && size == a->size && type == a->type &&
           ordinal == a->ordinal;
}

static void attribute_checks(const attrs_t *before, CUcontext ctx) {
    attrs_t now[NB];
    int same = 1, distinct = 1, stable = 1, range = 1, kind = 1, plural = 1;
    for (int b = 0; b < NB; b++) {
        now[b] = attrs_of(b);
        same &= now[b].id[0] == now[b].id[1] && now[b].id[1] == now[b].id[2];
        for (int c = 0; c < b; c++)
            distinct &= now[c].id[0] != now[b].id[0];
        stable &= memcmp(&now[b], &before[b], sizeof now[b]) == 0;
        range &= now[b].start == buf[b] && now[b].size == (size_t)words[b] * 4;
        kind &= now[b].type == CU_MEMORYTYPE_DEVICE && now[b].ordinal == 0 && now[b].ctx == ctx;
        plural &= plural_agrees(b, &now[b]);
    }
    printf("buffer id the same at every byte of an allocation: %s\n", same ? "yes" : "no");
    printf("buffer ids distinct between allocations: %s\n", distinct ? "yes" : "no");
    printf("attributes unchanged by the iterations: %s\n", stable ? "yes" : "no");
    printf("range start and size those of the allocation: %s\n", range ? "yes" : "no");
    printf("device memory of device 0 in the program's context: %s\n", kind ? "yes" : "no");
    printf("cuPointerGetAttributes agrees: %s\n", plural ? "yes" : "no");
    void *host_ptr = NULL;
    say("host pointer of device memory",
        cuPointerGetAttribute(&host_ptr, CU_POINTER_ATTRIBUTE_HOST_POINTER, buf[1]));
    CUdeviceptr gone, base = 1;
    size_t size = 1;
    UP_CHECK(cuMemAlloc(&gone, 100000));
    UP_CHECK(cuMemFree(gone));
    unsigned long long id = 1;
    unsigned type = 1;
    say("buffer id of a freed pointer",
        cuPointerGetAttribute(&id, CU_POINTER_ATTRIBUTE_BUFFER_ID, gone + 8));
    CUpointer_attribute which[] = {CU_POINTER_ATTRIBUTE_BUFFER_ID,
                                   CU_POINTER_ATTRIBUTE_MEMORY_TYPE};
    void *data[] = {&id, &type};
    CUresult r = cuPointerGetAttributes(2, which, data, gone + 8);
    printf("cuPointerGetAttributes of a freed pointer: %s, zeros: %s\n", err_name(r),
           id == 0 && type == 0 ? "yes" : "no");
    say("address range of a freed pointer", cuMemGetAddressRange(&base, &size, gone + 8));
}

int main(int argc, char **argv) {
    int iters = 6;
    if (up_parse_iters(argc, argv, "boundsprog", 1, &iters) != 0)
        return 64;
    if (fakecuda_register_kernels(kernels, sizeof kernels / sizeof kernels[0]) != 0)
        return 2;
    CUmodule mod;
    CUfunction f_rev;
    CUstream s;
    CUcontext ctx = up_init_context();
    UP_CHECK(cuModuleLoadData(&mod, FAKECUDA_IMAGE_PREFIX "boundsprog"));
    UP_CHECK(cuModuleGetFunction(&f_rev, mod, "rev"));
    UP_CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    for (int b = 0; b < NB; b++) {
        words[b] = size_words(b);
        model[b] = malloc((size_t)words[b] * 4);
        if (!model[b])
            return 2;
        for (int i = 0; i < words[b]; i++)
            model[b][i] = (uint32_t)(b * 7919 + i * 2654435761u);
        UP_CHECK(cuMemAlloc(&buf[b], (size_t)words[b] * 4));
        UP_CHECK(cuMemcpyHtoD(buf[b], model[b], (size_t)words[b] * 4));
    }
    attrs_t before[NB];
    for (int b = 0; b < NB; b++)
        before[b] = attrs_of(b);
    wrong_calls(s);
    for (int it = 0; it < iters; it++) {
        for (int b = 0; b < NB; b++) {
            CUdeviceptr end = buf[b] + (size_t)words[b] * 4;
            int n = words[b];
            uint32_t k = (uint32_t)(it * NB + b);
            void *args[] = {&end, &n, &k};
            UP_CHECK(cuLaunchKernel(f_rev, 1, 1, 1, 32, 1, 1, 0, s, args, NULL));
            model_rev(model[b], n, k);
        }
        UP_CHECK(cuStreamSynchronize(s));
    }
    int ok = intact();
    printf("end pointers: %s\n", ok ? "every byte right" : "WRONG BYTES");
    attribute_checks(before, ctx);
    uint64_t h = UP_FNV_SEED;
    for (int b = 0; b < NB; b++)
        h = up_fnv(h, model[b], (size_t)words[b] * 4);
    printf("checksum: %016llx\n", (unsigned long long)h);
    for (int b = 0; b < NB; b++) {
        UP_CHECK(cuMemFree(buf[b]));
        free(model[b]);
    }
    UP_CHECK(cuStreamDestroy(s));
    UP_CHECK(cuModuleUnload(mod));
    return ok ? 0 : 1;
}
