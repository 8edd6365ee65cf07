/* SPDX-License-Identifier: MIT */
/* batchprog.c: wide batched copies, as an optimizer that gathers many small tensors does: each
 * iteration fills NB source buffers from the host with one cuMemcpyBatchAsync of NB copies,
 * copies each source to its destination with a second batch (device to device), mixes every
 * destination with its neighbour, and reads the destinations back with a third batch. Each
 * batch has three attribute ranges, so that a batch split in parts keeps each copy's attributes.
 * NB copies reference 2 * NB buffers, more than one operation can hold. With --3d, the device to
 * device batch is one cuMemcpy3DBatchAsync of 4 * NB strided copies instead: each buffer seen as
 * 32 rows of 128 bytes in layers of 8 rows, copied as four boxes of 64 bytes x 4 rows x 4 layers
 * (rowLength 128, layerHeight 8), the left or right half of the first or last 4 rows of each layer.
 *
 * Buffers: 2 * NB of 4 KiB (run with FAKECUDA_GRANULARITY=64K and OOC_CHUNK=64K).
 *
 * Options: --iters N (default 6), --3d. Output: "checksum: H" (FNV-1a 64 of every destination after
 * the last iteration). Exit status: 0 when every byte is right; 1 when one is wrong; 2 when a
 * driver call failed ("error: <call>: <name> (<code>)"). Linked with -lcuda. */
#include <cuda.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "userprog.h"

#define WORDS 1024 /* 4 KiB: small buffers, which share slab chunks */
#define NB    140

static const fakecuda_kernel_t kernels[] = {UP_MIX_KERNEL("batchprog")};

/* One batch of NB copies from src[i] to dst[i], with three attribute ranges; with `spoil`, the
 * last range's srcAccessOrder is invalid (the driver refuses the whole batch). */
static CUresult batch_of(CUdeviceptr *dst, CUdeviceptr *src, CUstream s, int spoil) {
    static size_t sizes[NB];
    CUmemcpyAttributes attrs[3];
    memset(attrs, 0, sizeof attrs);
    for (int k = 0; k < 3; k++)
        attrs[k].srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
    if (spoil)
        attrs[2].srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_INVALID;
    size_t idx[3] = {0, NB / 3, NB - 7};
    for (int i = 0; i < NB; i++)
        sizes[i] = WORDS * 4;
    return cuMemcpyBatchAsync(dst, src, sizes, NB, attrs, idx, 3, s);
}

static CUresult batch(CUdeviceptr *dst, CUdeviceptr *src, CUstream s) {
    return batch_of(dst, src, s, 0);
}

/* The same copies as batch(dst, src, s), as 4 * NB strided 3D copies in one batch. */
static CUresult batch3d(CUdeviceptr *dst, CUdeviceptr *src, CUstream s) {
    static CUDA_MEMCPY3D_BATCH_OP ops[4 * NB];
    memset(ops, 0, sizeof ops);
    for (int i = 0; i < 4 * NB; i++) {
        CUDA_MEMCPY3D_BATCH_OP *o = &ops[i];
        size_t off = (size_t)(i & 1) * 64 + (size_t)((i >> 1) & 1) * 4 * 128;
        o->src.type = o->dst.type = CU_MEMCPY_OPERAND_TYPE_POINTER;
        o->src.op.ptr.ptr = src[i / 4] + off;
        o->dst.op.ptr.ptr = dst[i / 4] + off;
        o->src.op.ptr.rowLength = o->dst.op.ptr.rowLength = 128;
        o->src.op.ptr.layerHeight = o->dst.op.ptr.layerHeight = 8;
        o->extent = (CUextent3D){64, 4, 4};
        o->srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
    }
    return cuMemcpy3DBatchAsync(4 * NB, ops, 0, s);
}

int main(int argc, char **argv) {
    int iters = 6, use3d = 0;
    if (argc > 1 && strcmp(argv[argc - 1], "--3d") == 0) {
        use3d = 1;
        argc--;
    }
    if (up_parse_iters(argc, argv, "batchprog", 1, &iters) != 0)
        return 64;
    if (fakecuda_register_kernels(kernels, sizeof kernels / sizeof kernels[0]) != 0)
        return 2;
    CUmodule mod;
    CUfunction f_mix;
    CUstream s;
    (void)up_init_context();
    UP_CHECK(cuModuleLoadData(&mod, FAKECUDA_IMAGE_PREFIX "batchprog"));
    UP_CHECK(cuModuleGetFunction(&f_mix, mod, "mix"));
    UP_CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    static CUdeviceptr src[NB], dst[NB], hin[NB], hout[NB];
    uint32_t *in, *out, *model;
    in = malloc((size_t)NB * WORDS * 4);
    out = malloc((size_t)NB * WORDS * 4);
    model = calloc((size_t)NB * WORDS, 4);
    if (!in || !out || !model)
        return 2;
    for (int b = 0; b < NB; b++) {
        UP_CHECK(cuMemAlloc(&src[b], WORDS * 4));
        UP_CHECK(cuMemAlloc(&dst[b], WORDS * 4));
        hin[b] = (CUdeviceptr)(uintptr_t)(in + (size_t)b * WORDS);
        hout[b] = (CUdeviceptr)(uintptr_t)(out + (size_t)b * WORDS);
    }
    int bad = 0;
    for (int it = 0; it < iters; it++) {
        for (size_t i = 0; i < (size_t)NB * WORDS; i++)
            in[i] = (uint32_t)(i * 2654435761u + (size_t)it * 40503u);
        UP_CHECK(batch(src, hin, s));
        if (use3d)
            UP_CHECK(batch3d(dst, src, s));
        else
            UP_CHECK(batch(dst, src, s));
        for (int b = 0; b < NB; b++) {
            uint32_t k = (uint32_t)(it * NB + b);
            UP_CHECK(up_mix(f_mix, dst[b], src[(b + 1) % NB], k, WORDS, s));
        }
        UP_CHECK(batch(hout, dst, s));
        UP_CHECK(cuStreamSynchronize(s));
        for (int b = 0; b < NB; b++) {
            uint32_t *m = model + (size_t)b * WORDS;
            memcpy(m, in + (size_t)b * WORDS, WORDS * 4);
            up_model_mix(m, in + (size_t)((b + 1) % NB) * WORDS, (uint32_t)(it * NB + b), WORDS);
        }
        if (memcmp(out, model, (size_t)NB * WORDS * 4) != 0) {
            fprintf(stderr, "batchprog: iteration %d: the destinations are wrong\n", it);
            bad = 1;
        }
    }
    /* A wide batch the driver refuses (its last attribute's srcAccessOrder is invalid; the legacy
     * NULL stream) copies nothing, although a shim would split one this wide. */
    CUresult r1 = batch_of(dst, src, s, 1), r2 = batch_of(dst, src, NULL, 0);
    UP_CHECK(cuStreamSynchronize(s));
    UP_CHECK(batch(hout, dst, s));
    UP_CHECK(cuStreamSynchronize(s));
    if (r1 != CUDA_ERROR_INVALID_VALUE || r2 != CUDA_ERROR_INVALID_VALUE ||
        memcmp(out, model, (size_t)NB * WORDS * 4) != 0) {
        fprintf(stderr, "batchprog: refused batches answered %d and %d (not %d) or copied bytes\n",
                (int)r1, (int)r2, (int)CUDA_ERROR_INVALID_VALUE);
        bad = 1;
    }
    uint64_t sum = up_fnv(UP_FNV_SEED, model, (size_t)NB * WORDS * 4);
    for (int b = 0; b < NB; b++) {
        UP_CHECK(cuMemFree(src[b]));
        UP_CHECK(cuMemFree(dst[b]));
    }
    UP_CHECK(cuStreamDestroy(s));
    printf("checksum: %016llx\n", (unsigned long long)sum);
    return bad;
}
