/* SPDX-License-Identifier: MIT */
/* forkprog.c: a program that forks after initialising CUDA, as a DataLoader's workers do: one
 * child does host work only and returns from main (its exit handlers run), while another thread
 * of the parent is launching kernels; a second child calls the driver, which must refuse (a
 * forked child cannot use its parent's device) without crashing or hanging; the parent goes on
 * and checks its device memory.
 *
 * Device work (64 KiB buffers, run with FAKECUDA_GRANULARITY=64K and OOC_CHUNK=64K): NB
 * buffers, each iteration mixes buffer b with buffer b + 1 for every b, on the main thread; a
 * helper thread does the same on its own buffers and stream around the first fork. Kernels
 * compute in 32-bit integers, so a host model gives every byte.
 *
 * Options: --iters N (default 10). Output: the children's lines, each child's exit status, and
 * "checksum: H" (FNV-1a 64 of every buffer). Exit status: 0 when every byte is right; 1 when one
 * is wrong or a child failed; 2 when a driver call of the parent failed ("error: <call>: <name>
 * (<code>)"). Linked with -lcuda (the simulated driver, whose fakecuda.h gives the kernels). */
#include <cuda.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "userprog.h"

#define WORDS  (16384) /* 64 KiB */
#define NB     16
#define NB_BG  4
#define ITERS  10
#define BG_OPS 200

static const fakecuda_kernel_t kernels[] = {UP_MIX_KERNEL("forkprog")};

#define CHECK UP_CHECK

static CUcontext ctx;
static CUfunction f_mix;
static CUdeviceptr bufs[NB], bg_bufs[NB_BG];
static uint32_t *model[NB], *bg_model[NB_BG];

static void mix(CUdeviceptr dst, CUdeviceptr src, uint32_t k, CUstream s) {
    CHECK(up_mix(f_mix, dst, src, k, WORDS, s));
}

static void model_mix(uint32_t *dst, const uint32_t *src, uint32_t k) {
    up_model_mix(dst, src, k, WORDS);
}

/* The helper thread: kernels on its own stream and buffers while the main thread forks. */
static void *bg_main(void *arg) {
    (void)arg;
    CUstream s;
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    for (int i = 0; i < BG_OPS; i++) {
        int b = i % NB_BG;
        mix(bg_bufs[b], bg_bufs[(b + 1) % NB_BG], (uint32_t)i, s);
        model_mix(bg_model[b], bg_model[(b + 1) % NB_BG], (uint32_t)i);
    }
    CHECK(cuStreamSynchronize(s));
    CHECK(cuStreamDestroy(s));
    return NULL;
}

/* What a call in the child answered: its error name (the driver refuses; never success). */
static void child_says(const char *call, CUresult r) {
    const char *name = "?";
    if (cuGetErrorName(r, &name) != CUDA_SUCCESS)
        name = "?";
    printf("child B: %s: %s\n", call, name);
}

static int wait_child(pid_t pid, const char *who) {
    int st = 0;
    if (waitpid(pid, &st, 0) != pid) {
        printf("%s: waitpid failed\n", who);
        return 1;
    }
    if (WIFEXITED(st)) {
        printf("%s: exited %d\n", who, WEXITSTATUS(st));
        return WEXITSTATUS(st) != 0;
    }
    printf("%s: killed by signal %d\n", who, WTERMSIG(st));
    return 1;
}

/* Child A: host work only, then returns from main, so every exit handler runs. */
static int child_a(void) {
    uint64_t h = UP_FNV_SEED;
    for (uint32_t i = 0; i < 100000; i++)
        h = up_fnv(h, &i, sizeof i);
    printf("child A: host work %016llx\n", (unsigned long long)h);
    fflush(stdout);
    return 0;
}

/* Child B: driver calls; each must be refused, as after a fork with the real driver. */
static int child_b(void) {
    uint32_t host[16];
    CUdeviceptr p = 0;
    child_says("cuMemAlloc", cuMemAlloc(&p, 4096));
    child_says("cuMemcpyDtoH", cuMemcpyDtoH(host, bufs[0], sizeof host));
    child_says("cuMemsetD32", cuMemsetD32(bufs[1], 7, 16));
    child_says("cuCtxSynchronize", cuCtxSynchronize());
    child_says("cuMemFree", cuMemFree(bufs[2]));
    fflush(stdout);
    return 0;
}

int main(int argc, char **argv) {
    int iters = ITERS;
    if (up_parse_iters(argc, argv, "forkprog", 4, &iters) != 0)
        return 64;
    if (fakecuda_register_kernels(kernels, sizeof kernels / sizeof kernels[0]) != 0)
        return 2;
    CUmodule mod;
    ctx = up_init_context();
    CHECK(cuModuleLoadData(&mod, FAKECUDA_IMAGE_PREFIX "forkprog"));
    CHECK(cuModuleGetFunction(&f_mix, mod, "mix"));
    for (int b = 0; b < NB + NB_BG; b++) {
        uint32_t **m = b < NB ? &model[b] : &bg_model[b - NB];
        CUdeviceptr *d = b < NB ? &bufs[b] : &bg_bufs[b - NB];
        *m = malloc(WORDS * 4);
        if (!*m)
            return 2;
        for (int i = 0; i < WORDS; i++)
            (*m)[i] = (uint32_t)(b * 7919 + i);
        CHECK(cuMemAlloc(d, WORDS * 4));
        CHECK(cuMemcpyHtoD(*d, *m, WORDS * 4));
    }
    int bad = 0;
    pthread_t bg;
    for (int it = 0; it < iters; it++) {
        for (int b = 0; b < NB; b++) {
            mix(bufs[b], bufs[(b + 1) % NB], (uint32_t)(it * NB + b), NULL);
            model_mix(model[b], model[(b + 1) % NB], (uint32_t)(it * NB + b));
        }
        if (it == 2 || it == 3) {
            fflush(stdout);
            if (it == 2 && pthread_create(&bg, NULL, bg_main, NULL) != 0)
                return 2;
            pid_t pid = fork();
            if (pid < 0) {
                perror("fork");
                return 2;
            }
            if (pid == 0)
                return it == 2 ? child_a() : child_b();
            bad |= wait_child(pid, it == 2 ? "child A" : "child B");
            if (it == 2)
                pthread_join(bg, NULL);
        }
    }
    CHECK(cuCtxSynchronize());
    uint64_t sum = UP_FNV_SEED;
    uint32_t *host = malloc(WORDS * 4);
    if (!host)
        return 2;
    for (int b = 0; b < NB + NB_BG; b++) {
        const uint32_t *m = b < NB ? model[b] : bg_model[b - NB];
        CHECK(cuMemcpyDtoH(host, b < NB ? bufs[b] : bg_bufs[b - NB], WORDS * 4));
        if (memcmp(host, m, WORDS * 4) != 0) {
            fprintf(stderr, "forkprog: buffer %d is wrong\n", b);
            bad = 1;
        }
        sum = up_fnv(sum, m, WORDS * 4);
        CHECK(cuMemFree(b < NB ? bufs[b] : bg_bufs[b - NB]));
    }
    printf("checksum: %016llx\n", (unsigned long long)sum);
    return bad;
}
