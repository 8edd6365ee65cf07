/* SPDX-License-Identifier: MIT */
/* busyprog.c: the program's thread waits in the shim while another of its streams still has
 * work queued on the device, or while every stream of it is empty (OOC_STATS "of it: with the
 * program's streams empty").
 *
 * Run under the shim with OOC_MODE=demand, OOC_SAFE=off, OOC_BUDGET=6M (three chunks of 2 MiB)
 * and the simulated device's timing model with a slow link (FAKECUDA_TIMING=1,
 * FAKECUDA_D2H_GBPS=0.25: a 2 MiB copy takes about 8 ms). Buffers A and B (2 MiB each) are set on
 * stream s2 and s2 is synchronised. Stream s1 waits for a word of mapped host memory to reach 1,
 * then sets D (its first use: the shim sees s1). C (2 MiB) set on s2 then needs A's memory: A is
 * copied out and the host waits for the copy, while s1 is still held behind the word. Then the
 * host writes the word, and everything is read back.
 *
 * With --idle the word is written (and s1 drained) before C is set: the same wait then ends with
 * every stream of the program empty.
 *
 * Prints `checksum: H` (FNV-1a of A, B, C and D read back). Exit status 0, 2 on a driver error,
 * 64 on a bad option. Linked with -lcuda (the simulated driver). */
#include "userprog.h"

#define MIB ((size_t)1 << 20)

int main(int argc, char **argv) {
    int idle = 0;
    if (argc == 2 && strcmp(argv[1], "--idle") == 0)
        idle = 1;
    else if (argc != 1) {
        fprintf(stderr, "usage: busyprog [--idle]\n");
        return 64;
    }
    up_init_context();
    CUstream s1, s2;
    UP_CHECK(cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING));
    UP_CHECK(cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING));
    CUdeviceptr a, b, c, d, word_dev;
    UP_CHECK(cuMemAlloc(&a, 2 * MIB));
    UP_CHECK(cuMemAlloc(&b, 2 * MIB));
    UP_CHECK(cuMemsetD8Async(a, 1, 2 * MIB, s2));
    UP_CHECK(cuMemsetD8Async(b, 2, 2 * MIB, s2));
    UP_CHECK(cuStreamSynchronize(s2));
    volatile uint32_t *word;
    UP_CHECK(cuMemHostAlloc((void **)&word, 64, CU_MEMHOSTALLOC_DEVICEMAP));
    *word = 0;
    UP_CHECK(cuMemHostGetDevicePointer(&word_dev, (void *)word, 0));
    UP_CHECK(cuStreamWaitValue32(s1, word_dev, 1, CU_STREAM_WAIT_VALUE_GEQ));
    UP_CHECK(cuMemAlloc(&d, 64 * 1024));
    UP_CHECK(cuMemsetD8Async(d, 4, 64 * 1024, s1));
    if (idle) {
        *word = 1;
        UP_CHECK(cuStreamSynchronize(s1));
    }
    UP_CHECK(cuMemAlloc(&c, 2 * MIB));
    UP_CHECK(cuMemsetD8Async(c, 3, 2 * MIB, s2)); /* A's memory: A is copied out first */
    UP_CHECK(cuStreamSynchronize(s2));
    *word = 1;
    UP_CHECK(cuCtxSynchronize());
    static unsigned char host[2 * 1024 * 1024];
    uint64_t h = UP_FNV_SEED;
    CUdeviceptr all[] = {a, b, c};
    for (int i = 0; i < 3; i++) {
        UP_CHECK(cuMemcpyDtoH(host, all[i], 2 * MIB));
        h = up_fnv(h, host, 2 * MIB);
    }
    UP_CHECK(cuMemcpyDtoH(host, d, 64 * 1024));
    h = up_fnv(h, host, 64 * 1024);
    UP_CHECK(cuMemFree(a));
    UP_CHECK(cuMemFree(b));
    UP_CHECK(cuMemFree(c));
    UP_CHECK(cuMemFree(d));
    UP_CHECK(cuMemFreeHost((void *)word));
    UP_CHECK(cuStreamDestroy(s1));
    UP_CHECK(cuStreamDestroy(s2));
    printf("checksum: %016llx\n", (unsigned long long)h);
    return 0;
}
