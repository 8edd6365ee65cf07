/* SPDX-License-Identifier: MIT */
/* memopprog.c: stream memory operations on buffers that move. Each iteration, for every buffer
 * b: a 32-bit and a 64-bit value written with cuStreamWriteValue32/64, two more with one
 * cuStreamBatchMemOp, then mix(b, b + 1) on the same stream; after the stream is drained, a
 * second stream waits (cuStreamWaitValue32 and 64, already satisfied) on values of the last
 * buffers written and then writes a value of its own. The footprint is four times the budget the
 * tests give: buffers are swapped out and in between the operations.
 *
 * Buffers: NB of 64 KiB (run with FAKECUDA_GRANULARITY=64K and OOC_CHUNK=64K).
 * Options: --iters N (default 6). Output: "checksum: H" (FNV-1a 64 of every buffer). Exit
 * status: 0 when every byte is right; 1 when one is wrong; 2 when a driver call failed. Linked
 * with -lcuda. */
#include <cuda.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "userprog.h"

#define WORDS 16384 /* 64 KiB */
#define NB    24

static const fakecuda_kernel_t kernels[] = {UP_MIX_KERNEL("memopprog")};

static uint32_t model[NB][WORDS];

static void model_write64(uint32_t *w, uint64_t v) {
    memcpy(w, &v, 8);
}

int main(int argc, char **argv) {
    int iters = 6;
    if (up_parse_iters(argc, argv, "memopprog", 1, &iters) != 0)
        return 64;
    if (fakecuda_register_kernels(kernels, sizeof kernels / sizeof kernels[0]) != 0)
        return 2;
    CUmodule mod;
    CUfunction f_mix;
    CUstream s, s2;
    (void)up_init_context();
    UP_CHECK(cuModuleLoadData(&mod, FAKECUDA_IMAGE_PREFIX "memopprog"));
    UP_CHECK(cuModuleGetFunction(&f_mix, mod, "mix"));
    UP_CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    UP_CHECK(cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING));
    static CUdeviceptr buf[NB];
    for (int b = 0; b < NB; b++) {
        for (int i = 0; i < WORDS; i++)
            model[b][i] = (uint32_t)(b * 7919 + i * 2654435761u);
        UP_CHECK(cuMemAlloc(&buf[b], WORDS * 4));
        UP_CHECK(cuMemcpyHtoD(buf[b], model[b], WORDS * 4));
    }
    for (int it = 0; it < iters; it++) {
        for (int b = 0; b < NB; b++) {
            uint32_t v = (uint32_t)(it * NB + b) * 2654435761u;
            size_t w = (size_t)(it * 97 + b * 13) % (WORDS - 8);
            UP_CHECK(cuStreamWriteValue32(s, buf[b] + w * 4, v, 0));
            model[b][w] = v;
            UP_CHECK(cuStreamWriteValue64(s, buf[b] + (w & ~(size_t)1) * 4 + 8,
                                          ((uint64_t)v << 32) | b, 0));
            model_write64(&model[b][(w & ~(size_t)1) + 2], ((uint64_t)v << 32) | b);
            CUstreamBatchMemOpParams op[2];
            memset(op, 0, sizeof op);
            op[0].writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_32;
            op[0].writeValue.address = buf[b] + 4 * (WORDS - 1);
            op[0].writeValue.value = v + 1;
            op[1].writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_64;
            op[1].writeValue.address = buf[b];
            op[1].writeValue.value64 = (uint64_t)v * 3;
            UP_CHECK(cuStreamBatchMemOp(s, 2, op, 0));
            model[b][WORDS - 1] = v + 1;
            model_write64(&model[b][0], (uint64_t)v * 3);
            int src = (b + 1) % NB;
            UP_CHECK(up_mix(f_mix, buf[b], buf[src], (uint32_t)it, WORDS, s));
            UP_CHECK(cuStreamSynchronize(s)); /* src is read before it changes */
            up_model_mix(model[b], model[src], (uint32_t)it, WORDS);
        }
        /* The second stream: waits already satisfied, then a write of its own. */
        int last = NB - 1;
        UP_CHECK(
            cuStreamWaitValue32(s2, buf[last] + 4 * 5, model[last][5], CU_STREAM_WAIT_VALUE_EQ));
        uint64_t v64;
        memcpy(&v64, &model[last - 1][8], 8);
        UP_CHECK(cuStreamWaitValue64(s2, buf[last - 1] + 32, v64, CU_STREAM_WAIT_VALUE_EQ));
        UP_CHECK(cuStreamWriteValue32(s2, buf[it % NB] + 4 * 100, 0xC0DE0000u + (uint32_t)it, 0));
        model[it % NB][100] = 0xC0DE0000u + (uint32_t)it;
        UP_CHECK(cuStreamSynchronize(s2));
    }
    int ok = 1;
    uint64_t h = UP_FNV_SEED;
    static uint32_t check[WORDS];
    for (int b = 0; b < NB; b++) {
        UP_CHECK(cuMemcpyDtoH(check, buf[b], WORDS * 4));
        ok &= memcmp(check, model[b], WORDS * 4) == 0;
        h = up_fnv(h, model[b], WORDS * 4);
        UP_CHECK(cuMemFree(buf[b]));
    }
    printf("every byte right: %s\n", ok ? "yes" : "no");
    printf("checksum: %016llx\n", (unsigned long long)h);
    UP_CHECK(cuStreamDestroy(s));
    UP_CHECK(cuStreamDestroy(s2));
    UP_CHECK(cuModuleUnload(mod));
    return ok ? 0 : 1;
}
