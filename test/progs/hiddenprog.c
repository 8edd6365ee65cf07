/* SPDX-License-Identifier: MIT */
/* hiddenprog.c: a kernel that reads a buffer through a pointer stored in device memory, which
 * the shim cannot see, shortly after that buffer's planned swap-in, while the host is not ahead
 * of the device. Tests safe mode's promise that such a read gets the buffer's bytes.
 *
 * Persistent: B and an accumulator A (one 64 KiB chunk each), a table T holding B's address,
 * and D (one chunk). Each iteration allocates X (one chunk) and issues: memset X (op 0), mix B
 * (op 1), mix X (op 2), mix X (op 3), then pauses on the host for --pause-ms (default 0), then
 * copy_indirect(T, D) (op 4: D = B, reached through T, unseen), mix A with D (op 5), mix D with B
 * (op 6: names B), and frees X and synchronises. check_replay.c replays a hand-written plan
 * that swaps B out after op 1 and in before op 3, with the host-to-device link slowed so that
 * the copy in still runs when the pause ends: op 4 must not read B's memory while that copy
 * fills it (a wrong read shows in A for good).
 *
 * With --write, op 4 is bump_indirect(T, D) instead: adds 1 to every word of B through T, then
 * D = B: a write the shim cannot see, which safe mode keeps with OOC_SAFE_STAGE=0 (with 1 it
 * faults, unless the shim saw B's address stored: see below).
 *
 * T is written by cuMemcpyHtoD, whose bytes the shim reads (with OOC_SAFE_STAGE=1 it then never
 * stages B); with --device-table, by a kernel (store_word) given B's address as an integer,
 * which the shim cannot tell from a plain access to B.
 *
 * With --indirect-ms MS, op 4 holds the device MS milliseconds before it reaches B (its body
 * sleeps and declares it, fakecuda_waited): a hidden access still to come while the device runs
 * the op, which a remap of B's address must wait for.
 *
 * Options: --iters N (default 12, at least 1), --pause-ms MS, --write, --device-table,
 * --indirect-ms MS (0 to 10000, default 0). Output:
 * "hiddenprog: ok" when A, B and D hold the host model's words after the last iteration. Exit
 * status: 0; 1 when a word is wrong (named on stderr); 2 when a driver call failed; 64 on a bad
 * option. Linked with -lcuda (the simulated driver). Run it with FAKECUDA_GRANULARITY=64K and
 * OOC_CHUNK=64K. */
#include "userprog.h" /* cuda.h, fakecuda.h, the mix kernel, UP_CHECK */

#include <time.h>

#define WORDS ((size_t)16384) /* 64 KiB */

/* --indirect-ms: how long the indirect kernels hold the device before they reach B. */
static int indirect_ms;

/* The indirect kernels' wait before they read the table (--indirect-ms). */
static void indirect_wait(fakecuda_launch_t *l) {
    if (!indirect_ms)
        return;
    struct timespec ts = {indirect_ms / 1000, (long)(indirect_ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
    fakecuda_waited(l, (uint64_t)indirect_ms * 1000000u);
}

/* copy_indirect(table, dst, n): dst[0 .. n) = (table[0])[0 .. n), 32-bit words. */
static int k_copy_indirect(fakecuda_launch_t *l) {
    CUdeviceptr t = FAKECUDA_ARG(l, 0, CUdeviceptr), d = FAKECUDA_ARG(l, 1, CUdeviceptr);
    int n = FAKECUDA_ARG(l, 2, int);
    indirect_wait(l);
    const CUdeviceptr *tab = fakecuda_access(l, t, sizeof *tab, 0);
    if (!tab)
        return -1;
    const uint32_t *src = fakecuda_access(l, tab[0], (size_t)n * 4, 0);
    uint32_t *dst = fakecuda_access(l, d, (size_t)n * 4, 1);
    if (!src || !dst)
        return -1;
    memcpy(dst, src, (size_t)n * 4);
    return 0;
}

/* bump_indirect(table, dst, n): (table[0])[i] += 1, then dst[i] = (table[0])[i], i < n. */
static int k_bump_indirect(fakecuda_launch_t *l) {
    CUdeviceptr t = FAKECUDA_ARG(l, 0, CUdeviceptr), d = FAKECUDA_ARG(l, 1, CUdeviceptr);
    int n = FAKECUDA_ARG(l, 2, int);
    indirect_wait(l);
    const CUdeviceptr *tab = fakecuda_access(l, t, sizeof *tab, 0);
    if (!tab)
        return -1;
    uint32_t *src = fakecuda_access(l, tab[0], (size_t)n * 4, 1);
    uint32_t *dst = fakecuda_access(l, d, (size_t)n * 4, 1);
    if (!src || !dst)
        return -1;
    for (int i = 0; i < n; i++)
        dst[i] = ++src[i];
    return 0;
}

/* store_word(p, v): the 64-bit word at p = v (a table filled on the device, as the shim cannot
 * see: v is a plain integer to it). */
static int k_store_word(fakecuda_launch_t *l) {
    CUdeviceptr p = FAKECUDA_ARG(l, 0, CUdeviceptr);
    uint64_t v = FAKECUDA_ARG(l, 1, uint64_t);
    uint64_t *w = fakecuda_access(l, p, sizeof v, 1);
    if (!w)
        return -1;
    *w = v;
    return 0;
}

static const fakecuda_kernel_t kernels[] = {
    UP_MIX_KERNEL("hiddenprog"),
    {"hiddenprog", "copy_indirect", 3, {8, 8, 4}, k_copy_indirect},
    {"hiddenprog", "bump_indirect", 3, {8, 8, 4}, k_bump_indirect},
    {"hiddenprog", "store_word", 2, {8, 8}, k_store_word},
};

static int check(CUdeviceptr p, const uint32_t *model, uint32_t *back, const char *what) {
    UP_CHECK(cuMemcpyDtoH(back, p, WORDS * 4));
    for (size_t i = 0; i < WORDS; i++) {
        if (back[i] != model[i]) {
            fprintf(stderr, "hiddenprog: %s word %zu is %u, expected %u\n", what, i, back[i],
                    model[i]);
            return 1;
        }
    }
    return 0;
}

int main(int argc, char **argv) {
    int iters = 12, pause_ms = 0, write = 0, device_table = 0;
    char *rest[4] = {argv[0]};
    int nrest = 1;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--pause-ms") == 0 && i + 1 < argc) {
            if (up_parse_pause("hiddenprog", argv[++i], &pause_ms) != 0)
                return 64;
        } else if (strcmp(argv[i], "--indirect-ms") == 0 && i + 1 < argc) {
            char *end;
            long v = strtol(argv[++i], &end, 10);
            if (end == argv[i] || *end || v < 0 || v > 10000) {
                fprintf(stderr, "hiddenprog: --indirect-ms %s: expected 0 to 10000\n", argv[i]);
                return 64;
            }
            indirect_ms = (int)v;
        } else if (strcmp(argv[i], "--write") == 0) {
            write = 1;
        } else if (strcmp(argv[i], "--device-table") == 0) {
            device_table = 1;
        } else if (nrest < 3) {
            rest[nrest++] = argv[i];
        } else {
            fprintf(stderr,
                    "usage: hiddenprog [--iters N] [--pause-ms MS] [--write] [--device-table] "
                    "[--indirect-ms MS]\n");
            return 64;
        }
    }
    int rc = up_parse_iters(nrest, rest, "hiddenprog", 1, &iters);
    if (rc != 0)
        return rc;
    if (fakecuda_register_kernels(kernels, 4) != 0)
        return 2;
    up_init_context();
    CUmodule mod;
    CUfunction mix, copy, store;
    UP_CHECK(cuModuleLoadData(&mod, FAKECUDA_IMAGE_PREFIX "hiddenprog"));
    UP_CHECK(cuModuleGetFunction(&mix, mod, "mix"));
    UP_CHECK(cuModuleGetFunction(&copy, mod, write ? "bump_indirect" : "copy_indirect"));
    UP_CHECK(cuModuleGetFunction(&store, mod, "store_word"));
    uint32_t *ma = malloc(WORDS * 4), *mb = malloc(WORDS * 4), *md = malloc(WORDS * 4),
             *back = malloc(WORDS * 4);
    if (!ma || !mb || !md || !back)
        return 2;
    for (size_t i = 0; i < WORDS; i++) {
        ma[i] = (uint32_t)(i * 3u + 1u);
        mb[i] = (uint32_t)(i * 7u + 11u);
        md[i] = 0;
    }
    CUdeviceptr a, b, t, d;
    UP_CHECK(cuMemAlloc(&a, WORDS * 4));
    UP_CHECK(cuMemAlloc(&b, WORDS * 4));
    UP_CHECK(cuMemAlloc(&d, WORDS * 4));
    UP_CHECK(cuMemAlloc(&t, sizeof b));
    UP_CHECK(cuMemcpyHtoD(a, ma, WORDS * 4));
    UP_CHECK(cuMemcpyHtoD(b, mb, WORDS * 4));
    UP_CHECK(cuMemcpyHtoD(d, md, WORDS * 4));
    if (device_table) {
        uint64_t bw = (uint64_t)b;
        void *sargs[] = {&t, &bw};
        UP_CHECK(cuLaunchKernel(store, 1, 1, 1, 1, 1, 1, 0, NULL, sargs, NULL));
    } else {
        UP_CHECK(cuMemcpyHtoD(t, &b, sizeof b));
    }
    int n = (int)WORDS, bad;
    for (int it = 0; it < iters; it++) {
        CUdeviceptr x;
        UP_CHECK(cuMemAlloc(&x, WORDS * 4));
        UP_CHECK(cuMemsetD32(x, 5, WORDS));
        UP_CHECK(up_mix(mix, b, b, 1u + (uint32_t)it, n, NULL));
        up_model_mix(mb, mb, 1u + (uint32_t)it, WORDS);
        UP_CHECK(up_mix(mix, x, x, 2, n, NULL));
        UP_CHECK(up_mix(mix, x, x, 3, n, NULL));
        up_pause(pause_ms);
        void *args[] = {&t, &d, &n};
        UP_CHECK(cuLaunchKernel(copy, 1, 1, 1, 32, 1, 1, 0, NULL, args, NULL));
        for (size_t i = 0; i < WORDS && write; i++)
            mb[i]++;
        memcpy(md, mb, WORDS * 4);
        UP_CHECK(up_mix(mix, a, d, 4, n, NULL));
        up_model_mix(ma, md, 4, WORDS);
        UP_CHECK(up_mix(mix, d, b, 5, n, NULL));
        up_model_mix(md, mb, 5, WORDS);
        UP_CHECK(cuMemFree(x));
        UP_CHECK(cuCtxSynchronize());
    }
    bad = check(a, ma, back, "A") || check(b, mb, back, "B") || check(d, md, back, "D");
    UP_CHECK(cuMemFree(a));
    UP_CHECK(cuMemFree(b));
    UP_CHECK(cuMemFree(d));
    UP_CHECK(cuMemFree(t));
    free(ma);
    free(mb);
    free(md);
    free(back);
    UP_CHECK(cuModuleUnload(mod));
    if (bad)
        return 1;
    printf("hiddenprog: ok\n");
    return 0;
}
