/* SPDX-License-Identifier: MIT */
/* checksum.cu: the kernel the recorder uses to compare a buffer with its producer's re-launch.
 *
 * ooc_checksum64(p, n, out) adds to *out (which the caller zeroes) the sum, modulo 2^64, over the
 * little-endian 8-byte words w_i of [p, p + n) (the last one zero-padded) of
 * mix64(w_i ^ i * 0x9e3779b97f4a7c15). A sum is the same in any order, so the result does not
 * depend on the launch shape; the caller finishes with mix64(sum ^ n) on the host. p is 8-byte
 * aligned (the shim's buffers are). The simulated device registers the same kernel, in C, under
 * the module name "ooc_checksum" (test/fakecuda/kernels_ooc.c); both must agree bit for bit.
 * The Makefile compiles this file to PTX and embeds it in libooc_shim.so (shim/recompute.c loads
 * it). */

__device__ static unsigned long long mix64(unsigned long long x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* Launched with whole warps (blockDim.x a multiple of 32), any grid. */
extern "C" __global__ void ooc_checksum64(const unsigned char *p, unsigned long long n,
                                          unsigned long long *out) {
    unsigned long long nw = (n + 7) / 8, acc = 0;
    unsigned long long step = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < nw;
         i += step) {
        unsigned long long w = 0;
        if (8 * i + 8 <= n) {
            w = ((const unsigned long long *)p)[i];
        } else {
            for (unsigned k = 0; 8 * i + k < n; k++)
                w |= (unsigned long long)p[8 * i + k] << (8 * k);
        }
        acc += mix64(w ^ (i * 0x9e3779b97f4a7c15ull));
    }
    for (int off = 16; off > 0; off >>= 1)
        acc += __shfl_down_sync(0xffffffffu, acc, off);
    if ((threadIdx.x & 31) == 0)
        atomicAdd(out, acc);
}
