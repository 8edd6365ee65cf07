/* SPDX-License-Identifier: MIT */
/* exitprog.c: a program whose exit handlers use device memory, as C++ static destructors do:
 * an atexit handler registered before the first driver call reads every buffer back, checks
 * it and frees all but one; a destructor of the program reads that last one. When main returns,
 * another thread has just queued kernels on its own stream and never waits for them.
 *
 * Device work (64 KiB buffers, run with FAKECUDA_GRANULARITY=64K and OOC_CHUNK=64K): NB
 * buffers, each iteration mixes buffer b with buffer b + 1 for every b (userprog.h's kernel and
 * host model); the helper thread does the same on its own buffers.
 *
 * Options: --iters N (default 8). Output: "main: done", then the exit handler's "checksum: H"
 * (FNV-1a 64 of every buffer) and "atexit: ok", then the destructor's "destructor: ok". Exit
 * status: 0 when every byte is right; 1 when one is wrong; 2 when a driver call failed
 * ("error: <call>: <name> (<code>)"). Linked with -lcuda. */
#include <cuda.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "userprog.h"

#define WORDS  16384 /* 64 KiB */
#define NB     16
#define NB_BG  4
#define BG_OPS 300

static const fakecuda_kernel_t kernels[] = {UP_MIX_KERNEL("exitprog")};

static CUcontext ctx;
static CUfunction f_mix;
static CUdeviceptr bufs[NB], bg_bufs[NB_BG];
static uint32_t *model[NB];
static int ready; /* the buffers exist: the handlers have something to check */

/* Reads buffer b back and compares it with its model; 1 when it differs. */
static int check_buf(int b, uint32_t *host) {
    UP_CHECK(cuMemcpyDtoH(host, bufs[b], WORDS * 4));
    if (memcmp(host, model[b], WORDS * 4) != 0) {
        fprintf(stderr, "exitprog: buffer %d is wrong\n", b);
        return 1;
    }
    return 0;
}

/* Registered before the first driver call: runs after anything registered later. */
static void at_exit_handler(void) {
    if (!ready)
        return;
    uint32_t *host = malloc(WORDS * 4);
    if (!host)
        _exit(2);
    int bad = 0;
    uint64_t sum = UP_FNV_SEED;
    for (int b = 0; b < NB; b++) {
        bad |= check_buf(b, host);
        sum = up_fnv(sum, model[b], WORDS * 4);
        if (b > 0)
            UP_CHECK(cuMemFree(bufs[b]));
    }
    free(host);
    printf("checksum: %016llx\natexit: %s\n", (unsigned long long)sum, bad ? "WRONG" : "ok");
    fflush(stdout);
    if (bad)
        _exit(1);
}

/* The program's own destructor: runs after every exit handler. */
__attribute__((destructor)) static void program_destructor(void) {
    if (!ready)
        return;
    uint32_t *host = malloc(WORDS * 4);
    if (!host)
        _exit(2);
    int bad = check_buf(0, host);
    free(host);
    UP_CHECK(cuMemFree(bufs[0]));
    printf("destructor: %s\n", bad ? "WRONG" : "ok");
    fflush(stdout);
    if (bad)
        _exit(1);
}

/* Queues kernels on its own stream and returns without waiting for them. */
static void *bg_main(void *arg) {
    (void)arg;
    CUstream s;
    UP_CHECK(cuCtxSetCurrent(ctx));
    UP_CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    for (int i = 0; i < BG_OPS; i++)
        UP_CHECK(
            up_mix(f_mix, bg_bufs[i % NB_BG], bg_bufs[(i + 1) % NB_BG], (uint32_t)i, WORDS, s));
    return NULL;
}

int main(int argc, char **argv) {
    atexit(at_exit_handler);
    int iters = 8;
    if (up_parse_iters(argc, argv, "exitprog", 1, &iters) != 0)
        return 64;
    if (fakecuda_register_kernels(kernels, sizeof kernels / sizeof kernels[0]) != 0)
        return 2;
    CUmodule mod;
    ctx = up_init_context();
    UP_CHECK(cuModuleLoadData(&mod, FAKECUDA_IMAGE_PREFIX "exitprog"));
    UP_CHECK(cuModuleGetFunction(&f_mix, mod, "mix"));
    for (int b = 0; b < NB; b++) {
        model[b] = malloc(WORDS * 4);
        if (!model[b])
            return 2;
        for (int i = 0; i < WORDS; i++)
            model[b][i] = (uint32_t)(b * 7919 + i);
        UP_CHECK(cuMemAlloc(&bufs[b], WORDS * 4));
        UP_CHECK(cuMemcpyHtoD(bufs[b], model[b], WORDS * 4));
    }
    for (int b = 0; b < NB_BG; b++) {
        UP_CHECK(cuMemAlloc(&bg_bufs[b], WORDS * 4));
        UP_CHECK(cuMemsetD32(bg_bufs[b], (unsigned)b, WORDS));
    }
    ready = 1;
    for (int it = 0; it < iters; it++) {
        for (int b = 0; b < NB; b++) {
            uint32_t k = (uint32_t)(it * NB + b);
            UP_CHECK(up_mix(f_mix, bufs[b], bufs[(b + 1) % NB], k, WORDS, NULL));
            up_model_mix(model[b], model[(b + 1) % NB], k, WORDS);
        }
    }
    pthread_t bg;
    if (pthread_create(&bg, NULL, bg_main, NULL) != 0)
        return 2;
    pthread_join(bg, NULL);
    printf("main: done\n");
    return 0;
}
