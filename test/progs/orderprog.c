/* SPDX-License-Identifier: MIT */
/* orderprog.c: two persistent buffers X and Y of one 64 KiB chunk each, and an iteration that
 * allocates two more, A and B, of one chunk, and issues five operations: memset A, memset B,
 * mix A, mix X, mix Y (each rewrites its buffer in place), then frees A and B and synchronises.
 * Inside an iteration nothing waits: the host runs ahead of the device. check_replay.c replays a
 * hand-written plan over it at a budget of two chunks, in which the memory that a swap-out frees
 * must go to the swap-in planned first (see the test).
 *
 * Options: --iters N (default 12, at least 1); --pause-ms MS (default 0): the host sleeps that
 * long after memset B (op 1), so that the device, and the shim's worker, catch up with it there.
 * Output: "orderprog: ok" when every word of X and
 * Y is the host model's after the last iteration. Exit status: 0; 1 when a word is wrong (named
 * on stderr); 2 when a driver call failed; 64 on a bad option. Linked with -lcuda (the simulated
 * driver). Run it with FAKECUDA_GRANULARITY=64K and OOC_CHUNK=64K. */
#include "userprog.h" /* cuda.h, fakecuda.h, the mix kernel, UP_CHECK */

#include <time.h>

#define WORDS ((size_t)16384) /* 64 KiB */

static const fakecuda_kernel_t kernels[] = {UP_MIX_KERNEL("orderprog")};

int main(int argc, char **argv) {
    int iters = 12, pause_ms = 0;
    char *rest[4] = {argv[0]};
    int nrest = 1;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--pause-ms") == 0 && i + 1 < argc) {
            if (up_parse_pause("orderprog", argv[++i], &pause_ms) != 0)
                return 64;
        } else if (nrest < 3) {
            rest[nrest++] = argv[i];
        } else {
            fprintf(stderr, "usage: orderprog [--iters N] [--pause-ms MS]\n");
            return 64;
        }
    }
    int rc = up_parse_iters(nrest, rest, "orderprog", 1, &iters);
    if (rc != 0)
        return rc;
    if (fakecuda_register_kernels(kernels, 1) != 0)
        return 2;
    up_init_context();
    CUmodule mod;
    CUfunction f;
    UP_CHECK(cuModuleLoadData(&mod, FAKECUDA_IMAGE_PREFIX "orderprog"));
    UP_CHECK(cuModuleGetFunction(&f, mod, "mix"));
    uint32_t *model[2], *back = malloc(WORDS * 4);
    CUdeviceptr xy[2];
    if (!back)
        return 2;
    for (int b = 0; b < 2; b++) {
        if (!(model[b] = malloc(WORDS * 4)))
            return 2;
        for (size_t i = 0; i < WORDS; i++)
            model[b][i] = (uint32_t)(b * 1000003u + i * 7u);
        UP_CHECK(cuMemAlloc(&xy[b], WORDS * 4));
        UP_CHECK(cuMemcpyHtoD(xy[b], model[b], WORDS * 4));
    }
    int n = (int)WORDS;
    for (int it = 0; it < iters; it++) {
        CUdeviceptr a, b;
        UP_CHECK(cuMemAlloc(&a, WORDS * 4));
        UP_CHECK(cuMemAlloc(&b, WORDS * 4));
        UP_CHECK(cuMemsetD32(a, 1, WORDS));
        UP_CHECK(cuMemsetD32(b, 2, WORDS));
        up_pause(pause_ms);
        UP_CHECK(up_mix(f, a, a, 3, n, NULL));
        for (int k = 0; k < 2; k++) {
            UP_CHECK(up_mix(f, xy[k], xy[k], 4u + (uint32_t)k, n, NULL));
            up_model_mix(model[k], model[k], 4u + (uint32_t)k, WORDS);
        }
        UP_CHECK(cuMemFree(a));
        UP_CHECK(cuMemFree(b));
        UP_CHECK(cuCtxSynchronize());
    }
    int bad = 0;
    for (int k = 0; k < 2 && !bad; k++) {
        UP_CHECK(cuMemcpyDtoH(back, xy[k], WORDS * 4));
        for (size_t i = 0; i < WORDS && !bad; i++) {
            if (back[i] != model[k][i]) {
                fprintf(stderr, "orderprog: buffer %c word %zu is %u, expected %u\n", "XY"[k], i,
                        back[i], model[k][i]);
                bad = 1;
            }
        }
    }
    for (int k = 0; k < 2; k++) {
        UP_CHECK(cuMemFree(xy[k]));
        free(model[k]);
    }
    free(back);
    UP_CHECK(cuModuleUnload(mod));
    if (bad)
        return 1;
    printf("orderprog: ok\n");
    return 0;
}
