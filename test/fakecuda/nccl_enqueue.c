/* SPDX-License-Identifier: MIT */
/* nccl_enqueue.c: the collectives, Send/Recv and groups of the simulated NCCL: argument checks,
 * then one cuMemcpyHtoDAsync of the work items into the comm's ring and one nccl_work launch.
 *
 * Outside a group each call is launched at once; inside one (thread-local nesting) it is queued
 * and the outermost ncclGroupEnd launches the queue. The ring is used in order; before items are
 * written over, the host waits until the kernels that used them reported done (done_seq in the
 * comm's kernel state), as real NCCL waits for space in its work FIFO. A comm is used by one
 * thread at a time, as in NCCL. */
#include "nccl_internal.h"

#include <stdlib.h>
#include <unistd.h>

/* ---- enqueueing: one copy and one launch per call or group ------------------------------- */

static __thread struct {
    int depth;
    ncclComm_t comm;
    CUstream stream;
    fc_nccl_item_t *items;
    size_t n, cap;
    ncclResult_t err;
} grp;

/* Ring position after the comm's launches up to seq were done. */
static uint64_t end_of(ncclComm_t c, uint64_t seq) {
    return c->ends[seq % (FC_NCCL_RING_ITEMS + 1)];
}

/* Waits until ring items [first, first + n) (counted from the start) are free: every launch that
 * used them reported done. Fails when the stream has a sticky error, the segment was aborted or
 * the timeout passed. */
static ncclResult_t ring_wait(ncclComm_t c, CUstream stream, uint64_t first, size_t n) {
    uint64_t need = first + n - FC_NCCL_RING_ITEMS;
    if (first + n <= FC_NCCL_RING_ITEMS)
        return ncclSuccess;
    double deadline = fcn_now_s() + fcn_timeout_s;
    while (end_of(c, __atomic_load_n(&c->ks.done_seq, __ATOMIC_ACQUIRE)) < need) {
        CUresult q = fcn_drv.stream_query(stream);
        if (q != CUDA_SUCCESS && q != CUDA_ERROR_NOT_READY)
            return fcn_fail(ncclUnhandledCudaError, "rank %d: the stream failed (CUresult %d)",
                            c->ks.rank, (int)q);
        if (__atomic_load_n(&c->ks.shm->aborted, __ATOMIC_ACQUIRE))
            return fcn_fail(ncclRemoteError, "rank %d: the communicator was aborted", c->ks.rank);
        if (fcn_now_s() > deadline)
            return fcn_fail(ncclSystemError,
                            "rank %d: timed out after %u s waiting for space in the work ring",
                            c->ks.rank, fcn_timeout_s);
        usleep(100);
    }
    return ncclSuccess;
}

/* Copies items[0..n) into the ring on `stream` and launches nccl_work over them. */
static ncclResult_t launch(ncclComm_t c, CUstream stream, fc_nccl_item_t *items, size_t n) {
    if (n > FC_NCCL_RING_ITEMS)
        return fcn_fail(ncclInvalidUsage,
                        "a group of %zu calls exceeds the %d this simulation holds", n,
                        FC_NCCL_RING_ITEMS);
    uint64_t first = c->ring_pos;
    if (first % FC_NCCL_RING_ITEMS + n > FC_NCCL_RING_ITEMS)
        first += FC_NCCL_RING_ITEMS - first % FC_NCCL_RING_ITEMS; /* no item straddles the end */
    ncclResult_t r = ring_wait(c, stream, first, n);
    if (r != ncclSuccess)
        return r;
    uint64_t seq = c->launches + 1;
    for (size_t i = 0; i < n; i++)
        items[i].launch_seq = seq;
    CUdeviceptr at = c->ring + (first % FC_NCCL_RING_ITEMS) * sizeof(fc_nccl_item_t);
    if (fcn_drv.htod_async(at, items, n * sizeof *items, stream) != CUDA_SUCCESS)
        return fcn_fail(ncclUnhandledCudaError, "rank %d: copying the work items failed",
                        c->ks.rank);
    c->launches = seq;
    c->ring_pos = first + n;
    c->ends[seq % (FC_NCCL_RING_ITEMS + 1)] = c->ring_pos;
    unsigned count = (unsigned)n;
    uint64_t token = (uint64_t)(uintptr_t)&c->ks;
    void *args[] = {&at, &count, &token};
    if (fcn_drv.launch_kernel(c->fn, 1, 1, 1, 1, 1, 1, 0, stream, args, NULL) != CUDA_SUCCESS) {
        /* Not queued, or run inline and failed: either way this launch is over. */
        uint64_t done = __atomic_load_n(&c->ks.done_seq, __ATOMIC_ACQUIRE);
        if (done < seq)
            __atomic_store_n(&c->ks.done_seq, seq, __ATOMIC_RELEASE);
        return fcn_fail(ncclUnhandledCudaError, "rank %d: the launch failed", c->ks.rank);
    }
    return ncclSuccess;
}

/* Queues one item in the open group, or launches it now. */
static ncclResult_t enqueue(ncclComm_t c, CUstream stream, const fc_nccl_item_t *it) {
    if (grp.depth == 0) {
        fc_nccl_item_t one = *it;
        return launch(c, stream, &one, 1);
    }
    if (grp.n && (grp.comm != c || grp.stream != stream))
        return grp.err = fcn_fail(ncclInvalidUsage,
                                  "a group's calls must use one comm and one stream (this one: "
                                  "comm %p, stream %p; the group's: comm %p, stream %p)",
                                  (void *)c, (void *)stream, (void *)grp.comm, (void *)grp.stream);
    if (grp.n == grp.cap) {
        size_t cap = grp.cap ? grp.cap * 2 : 16;
        fc_nccl_item_t *p = realloc(grp.items, cap * sizeof *p);
        if (!p)
            return grp.err = fcn_fail(ncclSystemError, "out of host memory queueing a group call");
        grp.items = p, grp.cap = cap;
    }
    grp.comm = c, grp.stream = stream;
    grp.items[grp.n++] = *it;
    return ncclSuccess;
}

/* nccl.h declares these two without a prototype. */
NCCL_API ncclResult_t ncclGroupStart(void);
NCCL_API ncclResult_t ncclGroupEnd(void);

NCCL_API ncclResult_t ncclGroupStart(void) {
    grp.depth++;
    return ncclSuccess;
}

/* Closes a group; the outermost launches what was queued (nothing if a call of it failed). */
NCCL_API ncclResult_t ncclGroupEnd(void) {
    if (grp.depth == 0)
        return fcn_fail(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
    if (--grp.depth)
        return ncclSuccess;
    ncclResult_t r = grp.err;
    if (r == ncclSuccess && grp.n)
        r = launch(grp.comm, grp.stream, grp.items, grp.n);
    free(grp.items);
    grp.items = NULL, grp.n = grp.cap = 0, grp.comm = NULL, grp.stream = NULL;
    grp.err = ncclSuccess;
    return r;
}

/* ---- the calls ---------------------------------------------------------------------------- */

static size_t type_bytes(ncclDataType_t t) {
    switch (t) {
    case ncclInt8:
    case ncclUint8:
        return 1;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
        return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64:
        return 8;
    default:
        return 0;
    }
}

/* Checks a call's arguments and queues or launches its item. `mult` is how many times `count`
 * elements the larger buffer holds (nranks for AllGather and ReduceScatter); need_op and
 * need_root say what the call takes. Buffers are checked only when count > 0. */
static ncclResult_t call_checked(const char *fn, uint32_t kind, const void *sendbuff,
                                 void *recvbuff, size_t count, ncclDataType_t dt, int op, int peer,
                                 ncclComm_t comm, cudaStream_t stream) {
    if (!comm)
        return fcn_fail(ncclInvalidArgument, "%s: comm is NULL", fn);
    size_t es = type_bytes(dt);
    if (!es)
        return fcn_fail(ncclInvalidArgument, "%s: datatype %d is not supported", fn, (int)dt);
    int reducing =
        kind == FC_NCCL_ALLREDUCE || kind == FC_NCCL_REDUCE || kind == FC_NCCL_REDUCESCATTER;
    if (reducing && (op < ncclSum || op > ncclAvg))
        return fcn_fail(ncclInvalidArgument, "%s: reduction op %d is not supported", fn, op);
    int n = comm->ks.nranks;
    if (kind != FC_NCCL_ALLREDUCE && kind != FC_NCCL_ALLGATHER && kind != FC_NCCL_REDUCESCATTER &&
        (peer < 0 || peer >= n))
        return fcn_fail(ncclInvalidArgument, "%s: %s %d is out of range for nranks %d", fn,
                        kind == FC_NCCL_SEND || kind == FC_NCCL_RECV ? "peer" : "root", peer, n);
    if (count == 0)
        return ncclSuccess;
    if (count > (SIZE_MAX / 2) / es / (size_t)n)
        return fcn_fail(ncclInvalidArgument, "%s: count %zu is too large", fn, count);
    int me = comm->ks.rank;
    int need_send = kind != FC_NCCL_RECV && (kind != FC_NCCL_BROADCAST || peer == me);
    int need_recv = kind != FC_NCCL_SEND && (kind != FC_NCCL_REDUCE || peer == me);
    if ((need_send && !sendbuff) || (need_recv && !recvbuff))
        return fcn_fail(ncclInvalidArgument, "%s: %s is NULL", fn,
                        need_send && !sendbuff ? "sendbuff" : "recvbuff");
    fc_nccl_item_t it = {.kind = kind,
                         .datatype = (int32_t)dt,
                         .op = reducing ? op : 0,
                         .peer = peer,
                         .count = count,
                         .sendbuff = (CUdeviceptr)(uintptr_t)sendbuff,
                         .recvbuff = (CUdeviceptr)(uintptr_t)recvbuff};
    return enqueue(comm, (CUstream)stream, &it);
}

/* call_checked, and inside a group a refused call also fails the group (ncclGroupEnd returns
 * the first error and launches nothing), so that no rank runs half a group. */
static ncclResult_t call(const char *fn, uint32_t kind, const void *sendbuff, void *recvbuff,
                         size_t count, ncclDataType_t dt, int op, int peer, ncclComm_t comm,
                         cudaStream_t stream) {
    ncclResult_t r = call_checked(fn, kind, sendbuff, recvbuff, count, dt, op, peer, comm, stream);
    if (r != ncclSuccess && grp.depth && grp.err == ncclSuccess)
        grp.err = r;
    return r;
}

NCCL_API ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                                    ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                    cudaStream_t stream) {
    return call("ncclAllReduce", FC_NCCL_ALLREDUCE, sendbuff, recvbuff, count, datatype, (int)op,
                -1, comm, stream);
}

NCCL_API ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count,
                                 ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm,
                                 cudaStream_t stream) {
    return call("ncclReduce", FC_NCCL_REDUCE, sendbuff, recvbuff, count, datatype, (int)op, root,
                comm, stream);
}

NCCL_API ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count,
                                    ncclDataType_t datatype, int root, ncclComm_t comm,
                                    cudaStream_t stream) {
    return call("ncclBroadcast", FC_NCCL_BROADCAST, sendbuff, recvbuff, count, datatype, 0, root,
                comm, stream);
}

NCCL_API ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                                    ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
    return call("ncclAllGather", FC_NCCL_ALLGATHER, sendbuff, recvbuff, sendcount, datatype, 0, -1,
                comm, stream);
}

NCCL_API ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                                        ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                        cudaStream_t stream) {
    return call("ncclReduceScatter", FC_NCCL_REDUCESCATTER, sendbuff, recvbuff, recvcount, datatype,
                (int)op, -1, comm, stream);
}

NCCL_API ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype,
                               int peer, ncclComm_t comm, cudaStream_t stream) {
    return call("ncclSend", FC_NCCL_SEND, sendbuff, NULL, count, datatype, 0, peer, comm, stream);
}

NCCL_API ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
                               ncclComm_t comm, cudaStream_t stream) {
    return call("ncclRecv", FC_NCCL_RECV, NULL, recvbuff, count, datatype, 0, peer, comm, stream);
}
