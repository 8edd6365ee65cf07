/* SPDX-License-Identifier: MIT */
/* staleprog.c: a kernel parameter that holds a stale pointer, as cuDNN's parameter blocks do on
 * a GPU: each iteration launches copy_hint_f32 (module "rctest", test/fakecuda/kernels_ooc.c),
 * whose `hint` the kernel never reads. In some iterations the hint is the address of a buffer
 * freed at the start (nothing lives there), in others the address of a live temporary of the
 * iteration, in an order that does not repeat (a fixed pseudo-random one; dangling in the first).
 * Everything else is the same every iteration: X is copied into A, A into B through
 * copy_hint_f32, B into A and back four times, B is read back and checksummed, and X changes a
 * little.
 *
 * Under the shim, the dangling hint marks the parameter word weak, so the live temporary it
 * points at in the other iterations is not part of the op's identity: the iteration is found
 * and replayed.
 *
 * With --moved the hint never dangles: it keeps one address, which the shim's reuse of freed
 * memory puts inside one buffer or another. A buffer of 3 chunks (2 MiB each, the default
 * OOC_CHUNK; run with OOC_REUSE=1) is set and freed at the start, and hint = its start + 4 MiB +
 * 64. Each iteration allocates C (1 chunk) and T (2 chunks), in the pseudo-random order, sets
 * both, and frees both: C before T puts C at the start and the hint 2 MiB + 64 into T; T before
 * C puts the hint 64 bytes into C. Same ops every iteration.
 *
 * With --late the hint holds 0 (no address) for the first 12 iterations, while the shim records
 * and plans, and from then on the address of the live temporary in some iterations (a fixed
 * pseudo-random order): a word that never dangled nor moved, which the replay finds pointing
 * where the plan's op has no buffer.
 *
 * With --wander the hint holds the address of the live temporary T for the first 12 iterations,
 * and from then on, in some iterations, the address of another live temporary U of twice the
 * size, allocated and freed beside T every iteration: the plan's op has T where the live op has
 * U.
 *
 * With --shared the hint holds the address of the live temporary T for the first 12 iterations,
 * and from then on, in some iterations, an address inside A, which the launch passes anyway (as
 * stale words of PyTorch's reduction kernels pointed, on an H200, into a buffer another word of
 * the same launch named): the plan's op has T where the live op has nothing more than A and B.
 *
 * With --cold the hint dangles in the first iteration and from then on points into G, an 8 MiB
 * buffer set once at the start and never used again: under OOC_BUDGET=8M (4 chunks of 2 MiB) G
 * and the op's own buffers cannot all be resident at once.
 *
 * Options: --iters N (default 24, at least 4), --moved, --late, --wander, --shared or
 * --cold. Prints
 * `checksum: H` (FNV-1a of every B read back). Exit status 0, 2 on a driver error, 64 on a bad
 * option. Linked with -lcuda (the simulated driver). */
#include "userprog.h"

#define N (64 * 1024)

static CUfunction f_copy, f_hint;

static void launch(CUfunction f, CUstream s, void **args) {
    UP_CHECK(cuLaunchKernel(f, 64, 1, 1, 256, 1, 1, 0, s, args, NULL));
}

int main(int argc, char **argv) {
    int iters = 24, moved = 0, late = 0, wander = 0, shared = 0, cold = 0;
    if (argc > 1 && strcmp(argv[argc - 1], "--moved") == 0) {
        moved = 1;
        argc--;
    } else if (argc > 1 && strcmp(argv[argc - 1], "--late") == 0) {
        late = 1;
        argc--;
    } else if (argc > 1 && strcmp(argv[argc - 1], "--wander") == 0) {
        wander = 1;
        argc--;
    } else if (argc > 1 && strcmp(argv[argc - 1], "--shared") == 0) {
        shared = 1;
        argc--;
    } else if (argc > 1 && strcmp(argv[argc - 1], "--cold") == 0) {
        cold = 1;
        argc--;
    }
    int rc = up_parse_iters(argc, argv, "staleprog", 4, &iters);
    if (rc)
        return rc;
    const size_t chunk = (size_t)2 << 20;
    up_init_context();
    CUmodule mod;
    CUstream s;
    UP_CHECK(cuModuleLoadData(&mod, "FAKECUDA-MODULE:rctest"));
    UP_CHECK(cuModuleGetFunction(&f_copy, mod, "copy_f32"));
    UP_CHECK(cuModuleGetFunction(&f_hint, mod, "copy_hint_f32"));
    UP_CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    static float host[N];
    for (int i = 0; i < N; i++)
        host[i] = (float)(i % 89) * 0.25f;
    CUdeviceptr x, gone;
    UP_CHECK(cuMemAlloc(&gone, N * sizeof(float)));
    UP_CHECK(cuMemFree(gone)); /* its address stays in the reservation, with nothing there */
    UP_CHECK(cuMemAlloc(&x, N * sizeof(float)));
    UP_CHECK(cuMemcpyHtoD(x, host, N * sizeof(float)));
    CUdeviceptr big = 0, g = 0;
    if (cold) {
        UP_CHECK(cuMemAlloc(&g, 4 * chunk));
        UP_CHECK(cuMemsetD8Async(g, 7, 4 * chunk, s));
        UP_CHECK(cuStreamSynchronize(s));
    }
    if (moved) {
        UP_CHECK(cuMemAlloc(&big, 3 * chunk));
        UP_CHECK(cuMemsetD8Async(big, 0, 3 * chunk, s));
        UP_CHECK(cuStreamSynchronize(s));
        UP_CHECK(cuMemFree(big));
    }
    uint64_t h = UP_FNV_SEED, n = N;
    uint32_t lfsr = 0xace1u;
    for (int it = 0; it < iters; it++) {
        CUdeviceptr a, b, t, u = 0;
        UP_CHECK(cuMemAlloc(&a, N * sizeof(float)));
        UP_CHECK(cuMemAlloc(&b, N * sizeof(float)));
        UP_CHECK(cuMemAlloc(&t, N * sizeof(float)));
        if (wander)
            UP_CHECK(cuMemAlloc(&u, 2 * N * sizeof(float)));
        lfsr = (lfsr >> 1) ^ (-(lfsr & 1u) & 0xb400u); /* a 16-bit Galois LFSR */
        CUdeviceptr hint = it == 0 || (lfsr & 1u) ? gone : t + 64, c = 0, tt = 0;
        if (late)
            hint = it >= 12 && (lfsr & 1u) ? t + 64 : 0;
        if (wander)
            hint = it >= 12 && (lfsr & 1u) ? u + 64 : t + 64;
        if (shared)
            hint = it >= 12 && (lfsr & 1u) ? a + 64 : t + 64;
        if (cold)
            hint = it == 0 ? gone : g + 64;
        if (moved) {
            hint = big + 2 * chunk + 64;
            if (lfsr & 1u) {
                UP_CHECK(cuMemAlloc(&c, chunk));
                UP_CHECK(cuMemAlloc(&tt, 2 * chunk));
            } else {
                UP_CHECK(cuMemAlloc(&tt, 2 * chunk));
                UP_CHECK(cuMemAlloc(&c, chunk));
            }
            UP_CHECK(cuMemsetD8Async(c, 1, chunk, s));
            UP_CHECK(cuMemsetD8Async(tt, 2, 2 * chunk, s));
        }
        void *ca[] = {&x, &a, &n};
        launch(f_copy, s, ca);
        void *ha[] = {&a, &b, &n, &hint};
        launch(f_hint, s, ha);
        void *ba[] = {&b, &a, &n}, *ab[] = {&a, &b, &n};
        for (int k = 0; k < 4; k++) {
            launch(f_copy, s, ba);
            launch(f_copy, s, ab);
        }
        UP_CHECK(cuMemcpyDtoHAsync(host, b, N * sizeof(float), s));
        UP_CHECK(cuStreamSynchronize(s));
        h = up_fnv(h, host, N * sizeof(float));
        UP_CHECK(cuMemFree(a));
        UP_CHECK(cuMemFree(b));
        UP_CHECK(cuMemFree(t));
        if (wander)
            UP_CHECK(cuMemFree(u));
        if (moved) {
            UP_CHECK(cuMemFree(c));
            UP_CHECK(cuMemFree(tt));
        }
        host[0] += 1.0f;
        UP_CHECK(cuMemcpyHtoD(x, host, 16)); /* the input changes a little every iteration */
    }
    UP_CHECK(cuMemFree(x));
    if (cold)
        UP_CHECK(cuMemFree(g));
    UP_CHECK(cuStreamDestroy(s));
    printf("checksum: %016llx\n", (unsigned long long)h);
    return 0;
}
