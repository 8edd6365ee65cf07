/* SPDX-License-Identifier: MIT */
/* wl_dp.h: data-parallel training across processes, torchrun-style, through NCCL.
 *
 * The process group comes from the environment as torchrun sets it: WORLD_SIZE, RANK,
 * LOCAL_RANK, MASTER_ADDR, MASTER_PORT. With WORLD_SIZE unset or 1 nothing here makes a call:
 * the program is the single process it always was. Otherwise wl_dp_init opens NCCL at run time
 * (dlopen "libnccl.so.2", as frameworks do; the simulated one under scripts/with-fakecuda),
 * exchanges the ncclUniqueId through a file named after MASTER_ADDR and MASTER_PORT and makes
 * one communicator of all ranks. The collectives run in place on the caller's stream, grouped
 * (one ncclGroupStart/ncclGroupEnd per call here), and count as the ops the library issues for
 * a group. Any NCCL error prints `error: <function>: <ncclGetErrorString> (<code>)` and exits
 * with status 2; a bad variable prints `error: <program>: NAME=value: <what is accepted>` and
 * exits with status 2. Single-threaded. */
#ifndef WL_DP_H
#define WL_DP_H

#include <cuda.h>
#include <stdint.h>

/* Reads and validates the process-group variables for program `prog` (used in messages).
 * Returns WORLD_SIZE (1 when unset). Makes no driver or NCCL call. */
int wl_dp_env(const char *prog);

/* WORLD_SIZE and RANK as read by wl_dp_env (1 and 0 before it). */
int wl_dp_world(void);
int wl_dp_rank(void);

/* With more than one rank: opens libnccl.so.2, rendezvous (rank 0 publishes the unique id,
 * the others wait for it at most 60 s) and ncclCommInitRank. Needs the CUDA context current.
 * With one rank it does nothing. */
void wl_dp_init(void);

/* Sums each of the `count` float buffers bufs[i] (n[i] elements) across the ranks, in place, on
 * stream s, in buckets of at most 32 KiB (wl_dp.c's BUCKET_BYTES): several in one group, a
 * larger buffer alone. Every rank gets the same bits. */
void wl_dp_allreduce_sum(CUstream s, const CUdeviceptr *bufs, const uint64_t *n, int count);

/* Copies rank 0's contents of each buffer into every rank's, in place, on stream s, all in one
 * group. */
void wl_dp_broadcast(CUstream s, const CUdeviceptr *bufs, const uint64_t *n, int count);

/* Destroys the communicator (none with one rank). The library stays loaded. */
void wl_dp_fini(void);

#endif
