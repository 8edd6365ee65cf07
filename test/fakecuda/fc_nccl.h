/* SPDX-License-Identifier: MIT */
/* fc_nccl.h: the layouts shared by the simulated NCCL (nccl*.c) and its kernel (kernels_nccl.c).
 *
 * Ranks are processes on one machine, each its own simulated device. A communicator is a POSIX
 * shared-memory segment (named in the ncclUniqueId) that every rank maps: a header (arrival,
 * abort flag, one barrier counter per rank), one staging slot per rank for the collectives and
 * one byte channel per (sender, receiver) pair for Send/Recv. Every collective or p2p call is
 * one cuMemcpyHtoDAsync of its work items (fc_nccl_item_t) into the comm's ring in device memory,
 * then one launch of nccl_work(items, count, token) in module "nccl": the user buffers' addresses
 * are only in the items, which the kernel reads through fakecuda_access. The token is a host
 * pointer to the comm's fc_nccl_kstate_t (the kernel runs in the launching process); it stays
 * valid until ncclCommDestroy/Abort, which wait for every queued launch first. Shared fields are
 * read and written with __atomic builtins only. */
#ifndef FC_NCCL_H
#define FC_NCCL_H

#include <cuda.h>
#include <stdint.h>

/* The toolkit's nccl.h declares ncclGroupStart() without a prototype and tests __cplusplus in
 * #if: both are errors under our warnings, so it is included through here. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#pragma GCC diagnostic ignored "-Wundef"
#include <nccl.h>
#pragma GCC diagnostic pop

/* Module image for cuModuleLoadData and the one kernel's name. */
#define FC_NCCL_MODULE "FAKECUDA-MODULE:nccl"
#define FC_NCCL_KERNEL "nccl_work"

#define FC_NCCL_MAX_RANKS  64
#define FC_NCCL_SLOT_BYTES (1u << 20)   /* per-rank collective staging slot (one piece) */
#define FC_NCCL_CHAN_BYTES (256u << 10) /* per-(src, dst) Send/Recv ring */
#define FC_NCCL_MAGIC      0x4e43434cu  /* "NCCL" */

enum fc_nccl_kind {
    FC_NCCL_ALLREDUCE = 1,
    FC_NCCL_REDUCE,
    FC_NCCL_BROADCAST,
    FC_NCCL_ALLGATHER,
    FC_NCCL_REDUCESCATTER,
    FC_NCCL_SEND,
    FC_NCCL_RECV,
};

/* One operation, 48 bytes, as copied into the ring. All items of one launch carry the same
 * launch_seq (1, 2, ... per comm), by which the kernel runs launches in issue order. */
typedef struct fc_nccl_item {
    uint64_t launch_seq;
    uint32_t kind;        /* enum fc_nccl_kind */
    int32_t datatype;     /* ncclDataType_t */
    int32_t op;           /* ncclRedOp_t for the reducing collectives, else 0 */
    int32_t peer;         /* root (Reduce, Broadcast), peer (Send, Recv), else -1 */
    uint64_t count;       /* elements: AllGather sendcount, ReduceScatter recvcount, else count */
    CUdeviceptr sendbuff; /* 0 for Recv */
    CUdeviceptr recvbuff; /* 0 for Send; Reduce: only read on the root */
} fc_nccl_item_t;

_Static_assert(sizeof(fc_nccl_item_t) == 48, "fc_nccl_item_t is 48 bytes");

/* A Send/Recv channel: head is bytes written by the sender, tail bytes consumed by the receiver;
 * the data follow the 64-byte header. A message is an 8-byte length, then its bytes. */
typedef struct fc_nccl_chan {
    uint64_t head;
    uint64_t pad0[7];
    uint64_t tail;
    uint64_t pad1[7];
} fc_nccl_chan_t;

/* The segment's header. The creator (O_EXCL) sizes the segment, fills nranks and total_bytes and
 * then sets ready; joiners claim pid[rank] and count themselves in arrived. */
typedef struct fc_nccl_shm {
    uint32_t magic;
    uint32_t ready;
    int32_t nranks;
    uint32_t arrived;
    uint64_t total_bytes;
    uint32_t aborted; /* 0, or the aborting rank + 1 */
    uint32_t pad;
    int32_t pid[FC_NCCL_MAX_RANKS];
    uint64_t step[FC_NCCL_MAX_RANKS * 8]; /* rank r's barrier count at [r * 8]: own cache line */
} fc_nccl_shm_t;

static inline uint64_t fc_nccl_hdr_bytes(void) {
    return (sizeof(fc_nccl_shm_t) + 4095) & ~(uint64_t)4095;
}

static inline uint64_t fc_nccl_chan_stride(void) {
    return sizeof(fc_nccl_chan_t) + FC_NCCL_CHAN_BYTES;
}

static inline uint64_t fc_nccl_shm_bytes(int nranks) {
    uint64_t n = (uint64_t)nranks;
    return fc_nccl_hdr_bytes() + n * FC_NCCL_SLOT_BYTES + n * n * fc_nccl_chan_stride();
}

static inline unsigned char *fc_nccl_slot(fc_nccl_shm_t *s, int rank) {
    return (unsigned char *)s + fc_nccl_hdr_bytes() + (uint64_t)rank * FC_NCCL_SLOT_BYTES;
}

static inline fc_nccl_chan_t *fc_nccl_chan(fc_nccl_shm_t *s, int src, int dst) {
    uint64_t n = (uint64_t)s->nranks;
    return (fc_nccl_chan_t *)((unsigned char *)s + fc_nccl_hdr_bytes() + n * FC_NCCL_SLOT_BYTES +
                              ((uint64_t)src * n + (uint64_t)dst) * fc_nccl_chan_stride());
}

/* The comm's process-local state the kernel reaches through its token. step and the rest are
 * touched by kernels only, one at a time (launches run in launch_seq order); done_seq is
 * published by the kernel (the last launch_seq finished, failed or not) and read by the host to
 * reuse ring space. */
typedef struct fc_nccl_kstate {
    fc_nccl_shm_t *shm;
    int rank, nranks;
    unsigned timeout_s;
    uint64_t step;     /* barriers this rank has entered */
    uint64_t done_seq; /* atomic */
    uint32_t failed;   /* atomic: a kernel of this comm failed (timeout, fault, abort seen) */
} fc_nccl_kstate_t;

/* Kernel nccl_work(CUdeviceptr items, unsigned count, uint64_t token), module "nccl": parameter
 * sizes 8, 4, 8 at offsets 0, 8, 16 (CUDA ABI alignment). items is the ring address of the
 * launch's first item (contiguous, count of them); token is (uint64_t)(uintptr_t) of the comm's
 * fc_nccl_kstate_t. Launched with grid 1x1x1, block 1x1x1, no shared memory, through
 * kernelParams. */

#endif
