/* SPDX-License-Identifier: MIT */
/* stray.cu: safe mode on a real GPU. Kernels reach a buffer through a pointer stored in device
 * memory (which the shim cannot see) after the shim swapped that buffer out; the GPU analogue of
 * test/progs/stray.c. Run under the shim with a budget of 12 MiB (six 2 MiB chunks): the victim
 * V (4 MiB) is filled, its address stored in a table T, then six other 4 MiB buffers are
 * written, which pushes V out. A kernel given only T sums V; another, given only T, rewrites V;
 * the fillers are written again; a kernel given V itself sums it (a swap-in: it must bring the
 * stray writes back).
 *
 * With safe mode (host-located VMM) V's address is mapped to its host copy while it is swapped
 * out, so both stray kernels see and change the right bytes. Without it a stray access faults:
 * the program reports the CUDA error, never wrong bytes. Exit 0: every sum right; 1: a wrong sum
 * (corruption); 3: a CUDA error (what no safe mode gives); 77: no device. */
#include <cuda_runtime.h>
#include <stdlib.h>

#include "kernels.cuh"

static const char *const prog = "stray";

enum { NFILL = 6, WORDS = 1 << 20 }; /* 4 MiB buffers */

static unsigned long long read_sum(unsigned long long *d) {
    unsigned long long v = 0;
    CK(cudaMemcpy(&v, d, sizeof v, cudaMemcpyDeviceToHost));
    return v;
}

int main(void) {
    if (gk_no_device(prog))
        return GK_SKIP;
    uint32_t *v, *fill[NFILL];
    uint32_t **table;
    unsigned long long *sums;
    CK(cudaMalloc(&v, WORDS * sizeof(uint32_t)));
    CK(cudaMalloc(&table, sizeof *table));
    CK(cudaMalloc(&sums, 2 * sizeof *sums));
    for (int k = 0; k < NFILL; k++)
        CK(cudaMalloc(&fill[k], WORDS * sizeof(uint32_t)));
    CK(cudaMemcpy(table, &v, sizeof v, cudaMemcpyHostToDevice));
    CK(cudaMemset(sums, 0, 2 * sizeof *sums));
    gk_fill<<<256, 256>>>(v, WORDS, 11);
    CK(cudaGetLastError());
    for (int k = 0; k < NFILL; k++)
        gk_fill<<<256, 256>>>(fill[k], WORDS, 200U + (uint32_t)k);
    CK(cudaGetLastError());
    /* V is swapped out now (under a 12 MiB budget); only the table names it. */
    gk_sum_indirect<<<128, 256>>>(table, 0, WORDS, &sums[0]);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    gk_report(prog, read_sum(&sums[0]) == gk_expected_sum(WORDS, 11),
              "a kernel reads a swapped-out buffer through a pointer in device memory", NULL);
    gk_fill_indirect<<<256, 256>>>(table, 0, WORDS, 22);
    CK(cudaGetLastError());
    for (int k = 0; k < NFILL; k++)
        gk_fill<<<256, 256>>>(fill[k], WORDS, 300U + (uint32_t)k);
    gk_sum<<<128, 256>>>(v, WORDS, &sums[1]);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    gk_report(prog, read_sum(&sums[1]) == gk_expected_sum(WORDS, 22),
              "what a kernel wrote through that pointer is there after the next swap-in", NULL);
    for (int k = 0; k < NFILL; k++)
        CK(cudaFree(fill[k]));
    CK(cudaFree(v));
    CK(cudaFree(table));
    CK(cudaFree(sums));
    return gk_failures ? 1 : 0;
}
