/* SPDX-License-Identifier: MIT */
/* nccl.c: NCCL collectives and point-to-point calls as operations of the program.
 *
 * As library.c does for cuDNN: before a call its send and receive buffers are made resident on
 * the call's stream and held until its work is issued (op.c); the chunks then note the stream,
 * so nothing they hold is evicted before the collective completes on the device. The profile
 * has one op of kind `nccl` named by the function; NCCL's copies and kernels are parts of it.
 * NCCL's kernels find the user buffers through work items in NCCL's own device memory, which no
 * launch scan reads: only this hook makes them resident.
 *
 * Groups: between the outermost ncclGroupStart and its ncclGroupEnd, NCCL only queues the calls
 * and launches them all at the end. So a call inside a group adds its buffers to the group's
 * operands (per thread, as NCCL's groups are) and is passed on; the group is one operation at
 * ncclGroupEnd, named `ncclGroupEnd:` and the calls' short names (`AllReduce*12+Broadcast`),
 * made resident on the stream of its first call. When its calls use several streams, each other
 * stream waits for that one before the group's work and that one waits for them after it, so
 * the residency covers every stream and the hold lasts until all of them are done.
 *
 * NCCL's own memory: NCCL allocates its buffers with cuMemCreate (the default since NCCL 2.19),
 * which the shim counts against the budget and never moves (external.c).
 *
 * Refused: ncclCommRegister and ncclCommWindowRegister of memory the shim manages (NCCL would
 * keep the buffer's physical pages, which the shim moves): ncclInvalidUsage and a logged error.
 * Memory from ncclMemAlloc is NCCL's own (cuMemCreate) and may be registered.
 *
 * Reached as cuDNN is: exported functions for programs linked with -lnccl, dlsym routed by
 * pointer for those that dlopen libnccl.so.2 (the pncclXxx profiling aliases are not hooked). */
#include "hook_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* nccl.h and the half-float headers it includes test macros C does not define, and declare
 * f() without void: the two group calls are declared again below, with their prototype. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wundef"
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <nccl.h>
#pragma GCC diagnostic pop

ncclResult_t ncclGroupStart(void);
ncclResult_t ncclGroupEnd(void);

#define NCCL_HOOKED(X)                                                                             \
    X(ncclAllReduce)                                                                               \
    X(ncclReduce)                                                                                  \
    X(ncclBroadcast)                                                                               \
    X(ncclBcast)                                                                                   \
    X(ncclAllGather)                                                                               \
    X(ncclReduceScatter)                                                                           \
    X(ncclAlltoAll)                                                                                \
    X(ncclGather)                                                                                  \
    X(ncclScatter)                                                                                 \
    X(ncclSend)                                                                                    \
    X(ncclRecv)                                                                                    \
    X(ncclGroupStart)                                                                              \
    X(ncclGroupEnd)                                                                                \
    X(ncclCommRegister)                                                                            \
    X(ncclCommWindowRegister)
#define NCCL_USED(X) X(ncclCommCount)

OOC_LIBTAB(nccl_tab, nccl, "libnccl.so.2", NCCL_HOOKED, NCCL_USED);

static void *nccl_route(void *real, const char *name) {
    return strncmp(name, "nccl", 4) == 0 ? ooc_libtab_route(&nccl_tab, real) : NULL;
}

__attribute__((constructor)) static void nccl_register(void) {
    ooc_real_route_library("nccl", nccl_route);
}

static ncclResult_t nccl_missing(const char *fn) {
    OOC_LOG_E("%s: called, but no libnccl.so.2 with it is loaded in this process", fn);
    return ncclSystemError;
}

/* A failure to make the operands resident, in NCCL's words. */
static ncclResult_t nccl_status(CUresult r) {
    (void)r;
    return ncclUnhandledCudaError;
}

/* ---- operands -------------------------------------------------------------------------------- */

static size_t type_bytes(ncclDataType_t t) {
    switch (t) {
    case ncclInt8:
    case ncclUint8:
    case ncclFloat8e4m3:
    case ncclFloat8e5m2:
        return 1;
    case ncclFloat16:
    case ncclBfloat16:
        return 2;
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

/* Notes [p, p + count * type * times) as used (OOC_USE_R or _RW); the buffer holding p alone
 * when the size is unknown or overflows. */
static void note(ooc_access_t *a, const void *p, size_t count, ncclDataType_t t, size_t times,
                 unsigned use) {
    if (!p)
        return;
    size_t n = type_bytes(t), bytes;
    if (n == 0 || __builtin_mul_overflow(count, n, &bytes) ||
        __builtin_mul_overflow(bytes, times, &bytes) || bytes == 0)
        bytes = 1;
    ooc_mem_note_range(a, (uintptr_t)p, bytes, use);
}

/* The communicator's rank count (1 when it cannot be asked). */
static size_t ranks(ncclComm_t comm) {
    int n = 1;
    if (!nccl.ncclCommCount || nccl.ncclCommCount(comm, &n) != ncclSuccess || n < 1)
        n = 1;
    return (size_t)n;
}

/* ---- groups ---------------------------------------------------------------------------------- */

enum { MAX_GROUP_NAMES = 8, MAX_GROUP_STREAMS = 8 };

/* This thread's open group: its operands, streams and calls (by short name, with counts). */
typedef struct group {
    int depth;
    int lost; /* a stream beyond MAX_GROUP_STREAMS: not every stream could be ordered */
    ooc_access_t a;
    CUstream s[MAX_GROUP_STREAMS];
    unsigned ns;
    struct {
        const char *fn;
        unsigned n;
    } calls[MAX_GROUP_NAMES];
    unsigned ncalls, more; /* more: calls of further kinds */
} group_t;

static _Thread_local group_t *grp;

static void group_add(group_t *g, const char *fn, CUstream s) {
    unsigned i = 0;
    while (i < g->ns && g->s[i] != s)
        i++;
    if (i == g->ns) {
        if (g->ns < MAX_GROUP_STREAMS)
            g->s[g->ns++] = s;
        else
            g->lost = 1;
    }
    for (i = 0; i < g->ncalls; i++)
        if (g->calls[i].fn == fn) {
            g->calls[i].n++;
            return;
        }
    if (g->ncalls < MAX_GROUP_NAMES)
        g->calls[g->ncalls++].fn = fn, g->calls[g->ncalls - 1].n = 1;
    else
        g->more++;
}

/* The group's interned name: "ncclGroupEnd:AllReduce*12+Broadcast" ("ncclGroupEnd" when empty). */
static const char *group_name(const group_t *g) {
    char buf[160];
    size_t len = (size_t)snprintf(buf, sizeof buf, "ncclGroupEnd");
    for (unsigned i = 0; i < g->ncalls && len < sizeof buf; i++) {
        const char *shortname = g->calls[i].fn + 4; /* past "nccl" */
        len += (size_t)snprintf(buf + len, sizeof buf - len, "%c%s", i ? '+' : ':', shortname);
        if (g->calls[i].n > 1 && len < sizeof buf)
            len += (size_t)snprintf(buf + len, sizeof buf - len, "*%u", g->calls[i].n);
    }
    if (g->more && len < sizeof buf)
        snprintf(buf + len, sizeof buf - len, "+...");
    const char *n = ooc_intern(buf);
    return n ? n : "ncclGroupEnd";
}

/* Orders stream `to` after the work issued so far on `from` (an event, destroyed at once: the
 * driver keeps what the wait needs). */
static void order_after(CUstream to, CUstream from) {
    CUevent e;
    if (ooc_real.cuEventCreate(&e, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS)
        return;
    if (ooc_real.cuEventRecord(e, from) == CUDA_SUCCESS)
        ooc_real.cuStreamWaitEvent(to, e, 0);
    ooc_real.cuEventDestroy_v2(e);
}

OOC_EXPORT ncclResult_t ncclGroupStart(void) {
    OOC_LIB_NEED(nccl, nccl_tab, ncclGroupStart, nccl_missing);
    if (grp) {
        grp->depth++;
    } else if (ooc_lib_on()) {
        grp = calloc(1, sizeof *grp);
        if (!grp) {
            OOC_LOG_E("ncclGroupStart: out of host memory for the group's operands");
            return ncclSystemError;
        }
        grp->depth = 1;
        op_start(&grp->a, OOC_OP_NCCL, "ncclGroupEnd", 0);
    }
    return nccl.ncclGroupStart();
}

OOC_EXPORT ncclResult_t ncclGroupEnd(void) {
    OOC_LIB_NEED(nccl, nccl_tab, ncclGroupEnd, nccl_missing);
    group_t *g = grp;
    if (!g || --g->depth > 0)
        return nccl.ncclGroupEnd();
    grp = NULL;
    if (g->ns == 0) { /* nothing queued: nothing to make resident */
        free(g);
        return nccl.ncclGroupEnd();
    }
    g->a.name = group_name(g);
    if (g->lost)
        OOC_LOG_W("%s: its calls use more than %d streams: those beyond are not ordered with the "
                  "first, so their buffers may move before they are done",
                  g->a.name, MAX_GROUP_STREAMS);
    ooc_live_op_t op;
    CUresult e;
    ncclResult_t st;
    switch (ooc_lib_enter(&op, &g->a, g->s[0], &e)) {
    case OOC_LIB_AS_IS:
        st = nccl.ncclGroupEnd();
        break;
    case OOC_LIB_FAIL:
        nccl.ncclGroupEnd(); /* NCCL's group must still close */
        st = nccl_status(e);
        break;
    default:
        for (unsigned i = 1; i < g->ns; i++)
            order_after(g->s[i], g->s[0]);
        st = nccl.ncclGroupEnd();
        for (unsigned i = 1; i < g->ns; i++)
            order_after(g->s[0], g->s[i]);
        ooc_lib_done(&op, st == ncclSuccess);
        break;
    }
    free(g);
    return st;
}

/* The body of a collective or point-to-point hook: `args` its parameters in parentheses, `notes`
 * a parenthesised expression noting its buffers in `a`, `stream` its stream. Inside a group the
 * call joins the group (NCCL only queues it); outside it is one operation. */
#define NCCL_HOOK(fn, stream, args, notes)                                                         \
    do {                                                                                           \
        OOC_LIB_NEED(nccl, nccl_tab, fn, nccl_missing);                                            \
        if (grp && ooc_lib_depth == 0) {                                                           \
            ooc_access_t *a = &grp->a;                                                             \
            (void)notes;                                                                           \
            group_add(grp, #fn, (CUstream)(stream));                                               \
            ooc_lib_depth++; /* what NCCL does now is part of the group */                         \
            ncclResult_t st_ = nccl.fn args;                                                       \
            ooc_lib_depth--;                                                                       \
            return st_;                                                                            \
        }                                                                                          \
        if (!ooc_lib_on())                                                                         \
            return nccl.fn args;                                                                   \
        ooc_access_t acc_;                                                                         \
        op_start(&acc_, OOC_OP_NCCL, #fn, 0);                                                      \
        ooc_access_t *a = &acc_;                                                                   \
        (void)notes;                                                                               \
        OOC_LIB_CALL(ncclResult_t, ncclSuccess, nccl_status, a, (CUstream)(stream), nccl.fn args); \
    } while (0)

#define IN(p, count, type, times)  note(a, (p), (count), (type), (times), OOC_USE_R)
#define OUT(p, count, type, times) note(a, (p), (count), (type), (times), OOC_USE_RW)

/* ---- collectives ----------------------------------------------------------------------------- */

OOC_EXPORT ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                                      ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                      cudaStream_t stream) {
    NCCL_HOOK(ncclAllReduce, stream, (sendbuff, recvbuff, count, datatype, op, comm, stream),
              (IN(sendbuff, count, datatype, 1), OUT(recvbuff, count, datatype, 1)));
}

OOC_EXPORT ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count,
                                   ncclDataType_t datatype, ncclRedOp_t op, int root,
                                   ncclComm_t comm, cudaStream_t stream) {
    NCCL_HOOK(ncclReduce, stream, (sendbuff, recvbuff, count, datatype, op, root, comm, stream),
              (IN(sendbuff, count, datatype, 1), OUT(recvbuff, count, datatype, 1)));
}

OOC_EXPORT ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count,
                                      ncclDataType_t datatype, int root, ncclComm_t comm,
                                      cudaStream_t stream) {
    NCCL_HOOK(ncclBroadcast, stream, (sendbuff, recvbuff, count, datatype, root, comm, stream),
              (IN(sendbuff, count, datatype, 1), OUT(recvbuff, count, datatype, 1)));
}

OOC_EXPORT ncclResult_t ncclBcast(void *buff, size_t count, ncclDataType_t datatype, int root,
                                  ncclComm_t comm, cudaStream_t stream) {
    NCCL_HOOK(ncclBcast, stream, (buff, count, datatype, root, comm, stream),
              (OUT(buff, count, datatype, 1)));
}

OOC_EXPORT ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                                      ncclDataType_t datatype, ncclComm_t comm,
                                      cudaStream_t stream) {
    NCCL_HOOK(
        ncclAllGather, stream, (sendbuff, recvbuff, sendcount, datatype, comm, stream),
        (IN(sendbuff, sendcount, datatype, 1), OUT(recvbuff, sendcount, datatype, ranks(comm))));
}

OOC_EXPORT ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                                          ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                          cudaStream_t stream) {
    NCCL_HOOK(
        ncclReduceScatter, stream, (sendbuff, recvbuff, recvcount, datatype, op, comm, stream),
        (IN(sendbuff, recvcount, datatype, ranks(comm)), OUT(recvbuff, recvcount, datatype, 1)));
}

OOC_EXPORT ncclResult_t ncclAlltoAll(const void *sendbuff, void *recvbuff, size_t count,
                                     ncclDataType_t datatype, ncclComm_t comm,
                                     cudaStream_t stream) {
    NCCL_HOOK(
        ncclAlltoAll, stream, (sendbuff, recvbuff, count, datatype, comm, stream),
        (IN(sendbuff, count, datatype, ranks(comm)), OUT(recvbuff, count, datatype, ranks(comm))));
}

OOC_EXPORT ncclResult_t ncclGather(const void *sendbuff, void *recvbuff, size_t count,
                                   ncclDataType_t datatype, int root, ncclComm_t comm,
                                   cudaStream_t stream) {
    NCCL_HOOK(ncclGather, stream, (sendbuff, recvbuff, count, datatype, root, comm, stream),
              (IN(sendbuff, count, datatype, 1), OUT(recvbuff, count, datatype, ranks(comm))));
}

OOC_EXPORT ncclResult_t ncclScatter(const void *sendbuff, void *recvbuff, size_t count,
                                    ncclDataType_t datatype, int root, ncclComm_t comm,
                                    cudaStream_t stream) {
    NCCL_HOOK(ncclScatter, stream, (sendbuff, recvbuff, count, datatype, root, comm, stream),
              (IN(sendbuff, count, datatype, ranks(comm)), OUT(recvbuff, count, datatype, 1)));
}

/* ---- point to point -------------------------------------------------------------------------- */

OOC_EXPORT ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype,
                                 int peer, ncclComm_t comm, cudaStream_t stream) {
    NCCL_HOOK(ncclSend, stream, (sendbuff, count, datatype, peer, comm, stream),
              (IN(sendbuff, count, datatype, 1)));
}

OOC_EXPORT ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
                                 ncclComm_t comm, cudaStream_t stream) {
    NCCL_HOOK(ncclRecv, stream, (recvbuff, count, datatype, peer, comm, stream),
              (OUT(recvbuff, count, datatype, 1)));
}

/* ---- registration: refused for memory the shim moves ----------------------------------------- */

/* ncclInvalidUsage, logged, when [buff, buff + size) is memory the shim manages. */
static int refuse(const char *fn, const void *buff, size_t size) {
    if (!managing() || !buff || !ooc_mem_owns((uintptr_t)buff))
        return 0;
    OOC_LOG_E("%s(%p, %zu bytes): refused: the buffer is memory ooc-shim may move to the host, "
              "and a registered buffer must keep its pages; allocate buffers to register with "
              "ncclMemAlloc (NCCL's own memory, never moved) or turn registration off in the "
              "framework (PyTorch: leave TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK unset)",
              fn, buff, size);
    return 1;
}

OOC_EXPORT ncclResult_t ncclCommRegister(const ncclComm_t comm, void *buff, size_t size,
                                         void **handle) {
    OOC_LIB_NEED(nccl, nccl_tab, ncclCommRegister, nccl_missing);
    if (refuse("ncclCommRegister", buff, size))
        return ncclInvalidUsage;
    return nccl.ncclCommRegister(comm, buff, size, handle);
}

OOC_EXPORT ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void *buff, size_t size,
                                               ncclWindow_t *win, int winFlags) {
    OOC_LIB_NEED(nccl, nccl_tab, ncclCommWindowRegister, nccl_missing);
    if (refuse("ncclCommWindowRegister", buff, size))
        return ncclInvalidUsage;
    return nccl.ncclCommWindowRegister(comm, buff, size, win, winFlags);
}
