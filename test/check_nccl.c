/* SPDX-License-Identifier: MIT */
/* check_nccl.c: the simulated libnccl.so.2 computes what NCCL defines, across processes, strictly.
 *
 * Each test runs in Check's forked child, which takes a unique id (no driver needed) and forks
 * one process per rank before any driver call; each rank makes its own simulated device's
 * primary context current, dlopens the simulated NCCL from the build directory and runs a
 * scenario, exiting 0 when every check held (a failed check prints its line on the rank's stderr,
 * which the test quotes). The test waits for the ranks with a deadline and kills them on expiry.
 * Results are compared bit for bit with a host loop that combines the ranks' inputs in rank
 * order, for every collective, datatype and op, in place and out of place, for counts below and
 * above one piece; Send/Recv rings larger than a channel; one copy and one launch per group;
 * both schedulers; a dead rank, an unmapped buffer and bad arguments fail fast and cleanly, and
 * nothing is left in /dev/shm. Inputs are fixed pseudo-random values: no seed is needed. */
#include <check.h>
#include <cuda.h>
#include <dlfcn.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "fakecuda.h"
#include "fc_nccl.h"
#include "testutil.h"

#define MAX_RANKS 4

static struct {
    __typeof__(&ncclGetVersion) GetVersion;
    __typeof__(&ncclGetUniqueId) GetUniqueId;
    __typeof__(&ncclCommInitRank) CommInitRank;
    __typeof__(&ncclCommDestroy) CommDestroy;
    __typeof__(&ncclCommAbort) CommAbort;
    __typeof__(&ncclCommFinalize) CommFinalize;
    __typeof__(&ncclCommCount) CommCount;
    __typeof__(&ncclCommCuDevice) CommCuDevice;
    __typeof__(&ncclCommUserRank) CommUserRank;
    __typeof__(&ncclCommGetAsyncError) CommGetAsyncError;
    __typeof__(&ncclGetErrorString) GetErrorString;
    __typeof__(&ncclGetLastError) GetLastError;
    __typeof__(&ncclAllReduce) AllReduce;
    __typeof__(&ncclReduce) Reduce;
    __typeof__(&ncclBroadcast) Broadcast;
    __typeof__(&ncclAllGather) AllGather;
    __typeof__(&ncclReduceScatter) ReduceScatter;
    __typeof__(&ncclSend) Send;
    __typeof__(&ncclRecv) Recv;
    ncclResult_t (*GroupStart)(void);
    ncclResult_t (*GroupEnd)(void);
    __typeof__(&ncclCommRegister) CommRegister;
    __typeof__(&ncclCommDeregister) CommDeregister;
    __typeof__(&ncclMemAlloc) MemAlloc;
    __typeof__(&ncclMemFree) MemFree;
} nc;

/* dlopens the simulated NCCL (which finds the runner's libcuda.so.1 by its soname). */
static void nccl_load(void) {
    void *lib = dlopen(tu_build_path("fakecuda/libnccl.so.2"), RTLD_NOW | RTLD_LOCAL);
    ck_assert_msg(lib != NULL, "dlopen: %s", dlerror());
#define R(field, name)                                                                             \
    do {                                                                                           \
        *(void **)&nc.field = dlsym(lib, name);                                                    \
        ck_assert_msg(nc.field != NULL, "%s missing", name);                                       \
    } while (0)
    R(GetVersion, "ncclGetVersion");
    R(GetUniqueId, "ncclGetUniqueId");
    R(CommInitRank, "ncclCommInitRank");
    R(CommDestroy, "ncclCommDestroy");
    R(CommAbort, "ncclCommAbort");
    R(CommFinalize, "ncclCommFinalize");
    R(CommCount, "ncclCommCount");
    R(CommCuDevice, "ncclCommCuDevice");
    R(CommUserRank, "ncclCommUserRank");
    R(CommGetAsyncError, "ncclCommGetAsyncError");
    R(GetErrorString, "ncclGetErrorString");
    R(GetLastError, "ncclGetLastError");
    R(AllReduce, "ncclAllReduce");
    R(Reduce, "ncclReduce");
    R(Broadcast, "ncclBroadcast");
    R(AllGather, "ncclAllGather");
    R(ReduceScatter, "ncclReduceScatter");
    R(Send, "ncclSend");
    R(Recv, "ncclRecv");
    R(GroupStart, "ncclGroupStart");
    R(GroupEnd, "ncclGroupEnd");
    R(CommRegister, "ncclCommRegister");
    R(CommDeregister, "ncclCommDeregister");
    R(MemAlloc, "ncclMemAlloc");
    R(MemFree, "ncclMemFree");
#undef R
}

/* ---- inside a rank process -------------------------------------------------------------- */

static int g_rank;

/* A failed check in a rank: one line on its stderr, exit status 10. */
#define REQ(cond, ...)                                                                             \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "rank %d: line %d: %s: ", g_rank, __LINE__, #cond);                    \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
            exit(10);                                                                              \
        }                                                                                          \
    } while (0)
#define CU(call) REQ((call) == CUDA_SUCCESS, "%s", "driver call failed")
#define NC(call)                                                                                   \
    do {                                                                                           \
        ncclResult_t r_ = (call);                                                                  \
        REQ(r_ == ncclSuccess, "%s", nc.GetErrorString(r_));                                       \
    } while (0)

typedef struct rank_env {
    int rank, n;
    CUcontext ctx;
    CUstream stream;
    ncclComm_t comm;
} rank_env_t;

static void dev_init(rank_env_t *e) {
    CUdevice dev;
    CU(cuInit(0));
    CU(cuDeviceGet(&dev, 0));
    CU(cuDevicePrimaryCtxRetain(&e->ctx, dev));
    CU(cuCtxSetCurrent(e->ctx));
    CU(cuStreamCreate(&e->stream, CU_STREAM_NON_BLOCKING));
}

/* Destroys the comm and stream; the test's own buffers must be freed by then: nothing of the
 * device may stay allocated. */
static void dev_fini(rank_env_t *e) {
    if (e->comm)
        NC(nc.CommDestroy(e->comm));
    CU(cuStreamDestroy(e->stream));
    fakecuda_stats_t st;
    fakecuda_get_stats(&st);
    REQ(st.allocs_live == 0 && st.modules_live == 0 && st.vmm_handles_live == 0,
        "allocs %llu modules %llu vmm %llu live after destroy", (unsigned long long)st.allocs_live,
        (unsigned long long)st.modules_live, (unsigned long long)st.vmm_handles_live);
    CU(cuDevicePrimaryCtxRelease(0));
}

static size_t esize(int t) {
    switch (t) {
    case ncclInt8:
    case ncclUint8:
        return 1;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
        return 4;
    default:
        return 8;
    }
}

/* Input element i of rank q for a test `salt`: small integers (so products stay meaningful) and
 * floats of mixed magnitude (so that the order of a sum shows in its bits). */
static void fill(void *buf, int t, size_t count, int q, uint32_t salt) {
    uint32_t s = 2463534242u ^ ((uint32_t)q * 2654435761u) ^ (salt * 40503u);
    for (size_t i = 0; i < count; i++) {
        s ^= s << 13, s ^= s >> 17, s ^= s << 5;
        int32_t v = (int32_t)(s % 19) - 9;
        double f = ((double)(s >> 8) / 16777216.0 - 0.5) * (double)(1u << (s % 24));
        switch (t) {
        case ncclInt8:
            ((int8_t *)buf)[i] = (int8_t)v;
            break;
        case ncclUint8:
            ((uint8_t *)buf)[i] = (uint8_t)(s >> 3);
            break;
        case ncclInt32:
            ((int32_t *)buf)[i] = v * 1000003;
            break;
        case ncclUint32:
            ((uint32_t *)buf)[i] = s;
            break;
        case ncclInt64:
            ((int64_t *)buf)[i] = (int64_t)v * 1000000007LL;
            break;
        case ncclUint64:
            ((uint64_t *)buf)[i] = (uint64_t)s * 6364136223846793005ull;
            break;
        case ncclFloat32:
            ((float *)buf)[i] = (float)f;
            break;
        default:
            ((double *)buf)[i] = f;
        }
    }
}

/* acc = acc op in, element-wise, as a host loop does it (signed sums and products wrap). */
#define HOST_OP(T, U)                                                                              \
    static void host_##T(void *accv, const void *inv, size_t n, int op) {                          \
        T *acc = accv;                                                                             \
        const T *in = inv;                                                                         \
        for (size_t i = 0; i < n; i++) {                                                           \
            if (op == ncclSum || op == ncclAvg)                                                    \
                acc[i] = (T)((U)acc[i] + (U)in[i]);                                                \
            else if (op == ncclProd)                                                               \
                acc[i] = (T)((U)acc[i] * (U)in[i]);                                                \
            else if (op == ncclMax)                                                                \
                acc[i] = in[i] > acc[i] ? in[i] : acc[i];                                          \
            else                                                                                   \
                acc[i] = in[i] < acc[i] ? in[i] : acc[i];                                          \
        }                                                                                          \
    }                                                                                              \
    static void host_avg_##T(void *accv, size_t n, int by) {                                       \
        T *acc = accv;                                                                             \
        for (size_t i = 0; i < n; i++)                                                             \
            acc[i] = (T)(acc[i] / (T)by);                                                          \
    }
HOST_OP(int8_t, uint8_t)
HOST_OP(uint8_t, uint8_t)
HOST_OP(int32_t, uint32_t)
HOST_OP(uint32_t, uint32_t)
HOST_OP(int64_t, uint64_t)
HOST_OP(uint64_t, uint64_t)
HOST_OP(float, float)
HOST_OP(double, double)

/* out = ((in[0] op in[1]) op in[2]) ... over n ranks' count elements at element offset off. */
static void host_reduce(void *out, void *const *in, int n, size_t off, size_t count, int t,
                        int op) {
    size_t es = esize(t);
    memcpy(out, (char *)in[0] + off * es, count * es);
    for (int q = 1; q < n; q++) {
        const void *x = (char *)in[q] + off * es;
#define CASE(tag, T)                                                                               \
    case tag:                                                                                      \
        host_##T(out, x, count, op);                                                               \
        break
        switch (t) {
            CASE(ncclInt8, int8_t);
            CASE(ncclUint8, uint8_t);
            CASE(ncclInt32, int32_t);
            CASE(ncclUint32, uint32_t);
            CASE(ncclInt64, int64_t);
            CASE(ncclUint64, uint64_t);
            CASE(ncclFloat32, float);
            CASE(ncclFloat64, double);
        }
#undef CASE
    }
    if (op != ncclAvg)
        return;
#define CASE(tag, T)                                                                               \
    case tag:                                                                                      \
        host_avg_##T(out, count, n);                                                               \
        break
    switch (t) {
        CASE(ncclInt8, int8_t);
        CASE(ncclUint8, uint8_t);
        CASE(ncclInt32, int32_t);
        CASE(ncclUint32, uint32_t);
        CASE(ncclInt64, int64_t);
        CASE(ncclUint64, uint64_t);
        CASE(ncclFloat32, float);
        CASE(ncclFloat64, double);
    }
#undef CASE
}

enum { C_ALLREDUCE, C_REDUCE, C_BCAST, C_ALLGATHER, C_REDUCESCATTER };
static const char *const coll_name[] = {"AllReduce", "Reduce", "Broadcast", "AllGather",
                                        "ReduceScatter"};

/* Runs one collective on this rank and compares its output with the host reference, bit for
 * bit. `count` is NCCL's count argument (per rank for AllGather and ReduceScatter). */
static void check_coll(rank_env_t *e, int c, int t, int op, size_t count, int inplace,
                       uint32_t salt) {
    int n = e->n, me = e->rank, root = n - 1 - (int)(salt % (unsigned)n);
    size_t es = esize(t);
    size_t scount = c == C_REDUCESCATTER ? count * (size_t)n : count;
    size_t rcount = c == C_ALLGATHER ? count * (size_t)n : count;
    void *in[MAX_RANKS] = {0};
    for (int q = 0; q < n; q++) {
        in[q] = malloc(scount * es);
        fill(in[q], t, scount, q, salt);
    }
    unsigned char *want = malloc(rcount * es), *got = malloc(rcount * es);
    memset(want, 0xab, rcount * es);
    switch (c) {
    case C_ALLREDUCE:
        host_reduce(want, in, n, 0, count, t, op);
        break;
    case C_REDUCE:
        if (me == root)
            host_reduce(want, in, n, 0, count, t, op);
        break;
    case C_BCAST:
        memcpy(want, in[root], count * es);
        break;
    case C_ALLGATHER:
        for (int q = 0; q < n; q++)
            memcpy(want + (size_t)q * count * es, in[q], count * es);
        break;
    default:
        host_reduce(want, in, n, (size_t)me * count, count, t, op);
    }
    /* Device buffers: recv prefilled with 0xab; send separate, or inside recv / recv inside
     * send for the in-place forms. */
    CUdeviceptr big, send, recv;
    size_t big_bytes = (c == C_REDUCESCATTER ? scount : rcount) * es;
    CU(cuMemAlloc(&big, big_bytes));
    CU(cuMemsetD8(big, 0xab, big_bytes));
    CUdeviceptr other = 0;
    if (!inplace) {
        CU(cuMemAlloc(&other, (c == C_REDUCESCATTER ? rcount : scount) * es));
        if (c == C_REDUCESCATTER)
            CU(cuMemsetD8(other, 0xab, rcount * es));
    }
    if (c == C_REDUCESCATTER) {
        send = big;
        recv = inplace ? big + (size_t)me * count * es : other;
    } else {
        recv = big;
        send = !inplace ? other : c == C_ALLGATHER ? big + (size_t)me * count * es : big;
    }
    CU(cuMemcpyHtoD(send, in[me], scount * es));
    if (inplace && c == C_ALLGATHER)
        memcpy(want + (size_t)me * count * es, in[me], count * es);
    ncclResult_t r = ncclInternalError;
    void *sp = (void *)(uintptr_t)send, *rp = (void *)(uintptr_t)recv;
    switch (c) {
    case C_ALLREDUCE:
        r = nc.AllReduce(sp, rp, count, t, op, e->comm, e->stream);
        break;
    case C_REDUCE:
        r = nc.Reduce(sp, rp, count, t, op, root, e->comm, e->stream);
        break;
    case C_BCAST:
        r = nc.Broadcast(sp, rp, count, t, root, e->comm, e->stream);
        break;
    case C_ALLGATHER:
        r = nc.AllGather(sp, rp, count, t, e->comm, e->stream);
        break;
    default:
        r = nc.ReduceScatter(sp, rp, count, t, op, e->comm, e->stream);
    }
    REQ(r == ncclSuccess, "%s: %s", coll_name[c], nc.GetErrorString(r));
    CU(cuStreamSynchronize(e->stream));
    CU(cuMemcpyDtoH(got, recv, rcount * es));
    /* A non-root Reduce leaves its recv alone: in place that is its own input. */
    if (c == C_REDUCE && me != root && inplace)
        memcpy(want, in[me], count * es);
    size_t bad = 0;
    while (bad < rcount * es && got[bad] == want[bad])
        bad++;
    REQ(bad == rcount * es, "%s type %d op %d count %zu %s: byte %zu differs (%#x, want %#x)",
        coll_name[c], t, op, count, inplace ? "in place" : "out of place", bad, got[bad],
        want[bad]);
    CU(cuMemFree(big));
    if (other)
        CU(cuMemFree(other));
    for (int q = 0; q < n; q++)
        free(in[q]);
    free(want), free(got);
}

typedef int (*scenario_fn)(rank_env_t *e, const ncclUniqueId *id, long arg);

/* ---- the test side: a team of rank processes ----------------------------------------------- */

typedef struct team {
    int n;
    int status[MAX_RANKS]; /* exit status, 128 + signal, or 124 when killed at the deadline */
    char *err[MAX_RANKS];
    double secs;
    ncclUniqueId id;
} team_t;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static char *slurp_fd(int fd) {
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    lseek(fd, 0, SEEK_SET);
    ssize_t r;
    while ((r = read(fd, buf + len, cap - len - 1)) > 0) {
        len += (size_t)r;
        if (cap - len < 2)
            buf = realloc(buf, cap *= 2);
    }
    buf[len] = 0;
    return buf;
}

/* How many times slower than plain the ranks run (valgrind). */
static int slow(void) {
    return tu_under_valgrind() ? 10 : 1;
}

/* Forks n rank processes that run fn with the same unique id, each with its stderr in a file,
 * and waits for them at most timeout_s seconds (then kills them). The segment must be gone. */
static void team_run(team_t *t, int n, scenario_fn fn, long arg, int timeout_s) {
    nccl_load();
    memset(t, 0, sizeof *t);
    t->n = n;
    ck_assert_int_eq(nc.GetUniqueId(&t->id), ncclSuccess);
    pid_t pid[MAX_RANKS];
    int fd[MAX_RANKS];
    double t0 = now_s();
    for (int r = 0; r < n; r++) {
        char path[] = "/tmp/check_nccl_XXXXXX";
        fd[r] = mkstemp(path);
        ck_assert_int_ge(fd[r], 0);
        unlink(path);
        pid[r] = fork();
        ck_assert_int_ge(pid[r], 0);
        if (pid[r] == 0) {
            dup2(fd[r], 2);
            g_rank = r;
            rank_env_t e = {.rank = r, .n = n};
            dev_init(&e);
            exit(fn(&e, &t->id, arg));
        }
    }
    int left = n;
    while (left) {
        int st;
        pid_t p = waitpid(-1, &st, WNOHANG);
        if (p > 0) {
            for (int r = 0; r < n; r++)
                if (pid[r] == p) {
                    t->status[r] = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
                    pid[r] = 0;
                    left--;
                }
            continue;
        }
        if (now_s() - t0 > timeout_s * slow()) {
            for (int r = 0; r < n; r++)
                if (pid[r] > 0) {
                    kill(pid[r], SIGKILL);
                    waitpid(pid[r], NULL, 0);
                    t->status[r] = 124;
                    pid[r] = 0;
                }
            break;
        }
        usleep(5000);
    }
    t->secs = now_s() - t0;
    for (int r = 0; r < n; r++) {
        t->err[r] = slurp_fd(fd[r]);
        close(fd[r]);
    }
    char shm[160];
    snprintf(shm, sizeof shm, "/dev/shm%s", t->id.internal);
    ck_assert_msg(access(shm, F_OK) != 0, "%s left behind", shm);
}

static void team_free(team_t *t) {
    for (int r = 0; r < t->n; r++)
        free(t->err[r]);
}

/* Every rank exited 0. */
static void team_assert_ok(team_t *t) {
    for (int r = 0; r < t->n; r++)
        ck_assert_msg(t->status[r] == 0, "rank %d: status %d: %s", r, t->status[r],
                      tu_tail(t->err[r], 600));
}

static int join(rank_env_t *e, const ncclUniqueId *id) {
    ncclResult_t r = nc.CommInitRank(&e->comm, e->n, *id, e->rank);
    REQ(r == ncclSuccess, "init: %s", nc.GetErrorString(r));
    int v;
    NC(nc.CommCount(e->comm, &v));
    REQ(v == e->n, "count %d", v);
    NC(nc.CommUserRank(e->comm, &v));
    REQ(v == e->rank, "user rank %d", v);
    NC(nc.CommCuDevice(e->comm, &v));
    REQ(v == 0, "device %d", v);
    return 0;
}

/* ---- scenarios (run in each rank) ---------------------------------------------------------- */

static const int all_types[] = {ncclInt8,  ncclUint8,  ncclInt32,   ncclUint32,
                                ncclInt64, ncclUint64, ncclFloat32, ncclFloat64};
#define NTYPES ((int)(sizeof all_types / sizeof all_types[0]))
#define SLOT   FC_NCCL_SLOT_BYTES

static uint64_t launches(void) {
    fakecuda_stats_t st;
    fakecuda_get_stats(&st);
    return st.kernels_launched;
}

/* Every collective, datatype and op, in place and out of place; with arg != 0 also counts of
 * several pieces (not multiples of one); count 0 launches nothing. */
static int sc_collectives(rank_env_t *e, const ncclUniqueId *id, long big) {
    join(e, id);
    uint32_t salt = 1;
    for (int i = 0; i < NTYPES; i++)
        for (int op = ncclSum; op <= ncclAvg; op++)
            for (int inplace = 0; inplace < 2; inplace++)
                check_coll(e, C_ALLREDUCE, all_types[i], op, 1001, inplace, salt++);
    for (int i = 0; i < NTYPES; i++)
        for (int inplace = 0; inplace < 2; inplace++) {
            check_coll(e, C_BCAST, all_types[i], 0, 777, inplace, salt++);
            check_coll(e, C_ALLGATHER, all_types[i], 0, 333, inplace, salt++);
        }
    for (int i = 0; i < NTYPES; i++)
        for (int op = ncclSum; op <= ncclAvg; op++) {
            check_coll(e, C_REDUCE, all_types[i], op, 555, op % 2, salt++);
            check_coll(e, C_REDUCESCATTER, all_types[i], op, 301, (op + 1) % 2, salt++);
        }
    if (big) {
        size_t n = (size_t)e->n;
        check_coll(e, C_ALLREDUCE, ncclFloat32, ncclSum, SLOT / 4 * 2 + 37, 0, salt++);
        check_coll(e, C_ALLREDUCE, ncclFloat64, ncclAvg, SLOT / 8 + 5, 1, salt++);
        check_coll(e, C_ALLREDUCE, ncclInt8, ncclMax, SLOT + 3, 1, salt++);
        check_coll(e, C_REDUCE, ncclFloat32, ncclProd, SLOT / 4 + 11, 0, salt++);
        check_coll(e, C_BCAST, ncclUint8, 0, SLOT * 2 + 1, 1, salt++);
        check_coll(e, C_ALLGATHER, ncclFloat32, 0, SLOT / 4 + 9, 1, salt++);
        check_coll(e, C_ALLGATHER, ncclInt64, 0, SLOT / 8 + 3, 0, salt++);
        check_coll(e, C_REDUCESCATTER, ncclFloat64, ncclSum, SLOT / 8 / n * 2 + 3, 1, salt++);
        check_coll(e, C_REDUCESCATTER, ncclInt32, ncclMin, SLOT / 4 / n + 1, 0, salt++);
    }
    uint64_t l0 = launches(), c0 = fakecuda_call_count("cuMemcpyHtoDAsync");
    NC(nc.AllReduce((void *)8, (void *)8, 0, ncclFloat32, ncclSum, e->comm, e->stream));
    NC(nc.AllGather((void *)8, (void *)8, 0, ncclInt8, e->comm, e->stream));
    REQ(launches() == l0 && fakecuda_call_count("cuMemcpyHtoDAsync") == c0, "%s",
        "count 0 launched");
    dev_fini(e);
    return 0;
}

/* A ring exchange in one group, each message `arg` bytes (several channel pieces): one copy and
 * one launch; then a group of three AllReduces, likewise one copy and one launch. */
static int sc_groups(rank_env_t *e, const ncclUniqueId *id, long bytes) {
    join(e, id);
    int n = e->n, me = e->rank;
    size_t count = (size_t)bytes / 4;
    float *out = malloc(count * 4), *in = malloc(count * 4), *want = malloc(count * 4);
    fill(out, ncclFloat32, count, me, 77);
    fill(want, ncclFloat32, count, (me + n - 1) % n, 77);
    CUdeviceptr s, r;
    CU(cuMemAlloc(&s, count * 4));
    CU(cuMemAlloc(&r, count * 4));
    CU(cuMemcpyHtoD(s, out, count * 4));
    uint64_t l0 = launches(), c0 = fakecuda_call_count("cuMemcpyHtoDAsync");
    /* And a message to itself, received before it is sent. */
    CUdeviceptr self;
    int64_t mine[3] = {me, -me, 7}, back[3] = {0};
    CU(cuMemAlloc(&self, 48));
    CUdeviceptr r2;
    CU(cuMemAlloc(&r2, count / 3 * 4));
    CU(cuMemcpyHtoD(self, mine, 24));
    NC(nc.GroupStart());
    NC(nc.Recv((void *)(uintptr_t)(self + 24), 3, ncclInt64, me, e->comm, e->stream));
    NC(nc.Send((void *)(uintptr_t)s, count, ncclFloat32, (me + 1) % n, e->comm, e->stream));
    NC(nc.GroupStart()); /* groups nest */
    NC(nc.Recv((void *)(uintptr_t)r, count, ncclFloat32, (me + n - 1) % n, e->comm, e->stream));
    NC(nc.Send((void *)(uintptr_t)self, 3, ncclInt64, me, e->comm, e->stream));
    /* A second message on the same channels, received in call order. */
    NC(nc.Send((void *)(uintptr_t)(s + 4), count / 3, ncclFloat32, (me + 1) % n, e->comm,
               e->stream));
    NC(nc.Recv((void *)(uintptr_t)r2, count / 3, ncclFloat32, (me + n - 1) % n, e->comm,
               e->stream));
    NC(nc.GroupEnd());
    REQ(launches() == l0, "%s", "a nested ncclGroupEnd launched");
    NC(nc.GroupEnd());
    CU(cuStreamSynchronize(e->stream));
    REQ(launches() == l0 + 1 && fakecuda_call_count("cuMemcpyHtoDAsync") == c0 + 1,
        "ring group: %llu launches, %llu copies", (unsigned long long)(launches() - l0),
        (unsigned long long)(fakecuda_call_count("cuMemcpyHtoDAsync") - c0));
    CU(cuMemcpyDtoH(in, r, count * 4));
    REQ(memcmp(in, want, count * 4) == 0, "%s", "ring exchange delivered wrong bytes");
    CU(cuMemcpyDtoH(in, r2, count / 3 * 4));
    REQ(memcmp(in, want + 1, count / 3 * 4) == 0, "%s", "the second message differs");
    CU(cuMemFree(r2));
    CU(cuMemcpyDtoH(back, self + 24, 24));
    REQ(memcmp(back, mine, 24) == 0, "%s", "the message to itself differs");
    CU(cuMemFree(self));
    /* Three AllReduces (the second in place) in one group. */
    size_t m = 4099;
    CUdeviceptr a[3];
    void *inputs[MAX_RANKS] = {0};
    for (int q = 0; q < n; q++) {
        inputs[q] = malloc(m * 8);
        fill(inputs[q], ncclFloat64, m, q, 5);
    }
    CU(cuMemAlloc(&a[0], m * 8));
    CU(cuMemAlloc(&a[1], m * 8));
    CU(cuMemAlloc(&a[2], m * 8));
    CU(cuMemcpyHtoD(a[0], inputs[me], m * 8));
    l0 = launches(), c0 = fakecuda_call_count("cuMemcpyHtoDAsync");
    NC(nc.GroupStart());
    NC(nc.AllReduce((void *)(uintptr_t)a[0], (void *)(uintptr_t)a[1], m, ncclFloat64, ncclSum,
                    e->comm, e->stream));
    NC(nc.AllReduce((void *)(uintptr_t)a[1], (void *)(uintptr_t)a[1], m, ncclFloat64, ncclMax,
                    e->comm, e->stream));
    NC(nc.AllReduce((void *)(uintptr_t)a[1], (void *)(uintptr_t)a[2], m, ncclFloat64, ncclProd,
                    e->comm, e->stream));
    NC(nc.GroupEnd());
    CU(cuStreamSynchronize(e->stream));
    REQ(launches() == l0 + 1 && fakecuda_call_count("cuMemcpyHtoDAsync") == c0 + 1,
        "AllReduce group: %llu launches, %llu copies", (unsigned long long)(launches() - l0),
        (unsigned long long)(fakecuda_call_count("cuMemcpyHtoDAsync") - c0));
    /* Reference: sum, then max of identical inputs (itself), then the product of n copies. */
    double *sum = malloc(m * 8), *got = malloc(m * 8);
    host_reduce(sum, inputs, n, 0, m, ncclFloat64, ncclSum);
    void *same[MAX_RANKS] = {0};
    for (int q = 0; q < n; q++)
        same[q] = sum;
    double *prod = malloc(m * 8);
    host_reduce(prod, same, n, 0, m, ncclFloat64, ncclProd);
    CU(cuMemcpyDtoH(got, a[1], m * 8));
    REQ(memcmp(got, sum, m * 8) == 0, "%s", "grouped AllReduce 1-2 differ");
    CU(cuMemcpyDtoH(got, a[2], m * 8));
    REQ(memcmp(got, prod, m * 8) == 0, "%s", "grouped AllReduce 3 differs");
    for (int q = 0; q < n; q++)
        free(inputs[q]);
    free(sum), free(got), free(prod), free(out), free(in), free(want);
    for (int i = 0; i < 3; i++)
        CU(cuMemFree(a[i]));
    CU(cuMemFree(s));
    CU(cuMemFree(r));
    dev_fini(e);
    return 0;
}

/* Best-effort cleanup after an expected failure (the context may hold a sticky error). */
static void failed_fini(rank_env_t *e) {
    if (e->comm)
        nc.CommDestroy(e->comm);
    e->comm = NULL;
}

/* Rank `arg` joins and exits at once; the others run an AllReduce, which must fail within the
 * timeout (the test sets FAKENCCL_TIMEOUT_S=2). */
static int sc_dead_rank(rank_env_t *e, const ncclUniqueId *id, long dead) {
    join(e, id);
    if (e->rank == dead) {
        NC(nc.CommDestroy(e->comm));
        return 0;
    }
    CUdeviceptr b;
    CU(cuMemAlloc(&b, 4096));
    ncclResult_t r = nc.AllReduce((void *)(uintptr_t)b, (void *)(uintptr_t)b, 1024, ncclFloat32,
                                  ncclSum, e->comm, e->stream);
    CUresult s = cuStreamSynchronize(e->stream);
    REQ(r != ncclSuccess || s == CUDA_ERROR_ILLEGAL_ADDRESS, "call %d, sync %d", (int)r, (int)s);
    ncclResult_t async = ncclSuccess;
    NC(nc.CommGetAsyncError(e->comm, &async));
    REQ(async != ncclSuccess, "%s", "no async error");
    failed_fini(e);
    return 0;
}

/* Rank `arg` passes a reserved but unmapped receive buffer: its kernel's access is refused, and
 * the others see the abort at once. */
static int sc_unmapped(rank_env_t *e, const ncclUniqueId *id, long bad) {
    join(e, id);
    CUdeviceptr b, hole = 0;
    CU(cuMemAlloc(&b, 1 << 16));
    if (e->rank == bad)
        CU(cuMemAddressReserve(&hole, 1 << 21, 0, 0, 0));
    ncclResult_t r = nc.AllReduce((void *)(uintptr_t)b, (void *)(uintptr_t)(hole ? hole : b),
                                  1 << 14, ncclFloat32, ncclSum, e->comm, e->stream);
    CUresult s = cuStreamSynchronize(e->stream);
    REQ(r != ncclSuccess || s == CUDA_ERROR_ILLEGAL_ADDRESS, "call %d, sync %d", (int)r, (int)s);
    ncclResult_t async = ncclSuccess;
    NC(nc.CommGetAsyncError(e->comm, &async));
    REQ(async == (e->rank == bad ? ncclSystemError : ncclRemoteError), "async error %d",
        (int)async);
    failed_fini(e);
    return 0;
}

/* Bad arguments give their codes and launch nothing (one rank). */
static int sc_bad_args(rank_env_t *e, const ncclUniqueId *id, long unused) {
    (void)unused;
    ncclComm_t c = (ncclComm_t)1;
    REQ(nc.CommInitRank(&c, 2, *id, 2) == ncclInvalidArgument && c == NULL, "%s", "rank 2 of 2");
    REQ(nc.CommInitRank(&c, 0, *id, 0) == ncclInvalidArgument, "%s", "nranks 0");
    ncclUniqueId junk = {{'x'}};
    REQ(nc.CommInitRank(&c, 1, junk, 0) == ncclInvalidArgument, "%s", "junk id");
    join(e, id);
    int v = 0;
    NC(nc.GetVersion(&v));
    REQ(v == NCCL_VERSION_CODE, "version %d", v);
    REQ(strstr(nc.GetErrorString(ncclInvalidArgument), "invalid argument") != NULL, "%s",
        nc.GetErrorString(ncclInvalidArgument));
    CUdeviceptr b;
    CU(cuMemAlloc(&b, 4096));
    void *p = (void *)(uintptr_t)b;
    uint64_t l0 = launches(), c0 = fakecuda_call_count("cuMemcpyHtoDAsync");
    REQ(nc.AllReduce(p, p, 16, ncclFloat16, ncclSum, e->comm, e->stream) == ncclInvalidArgument,
        "%s", "float16");
    REQ(strstr(nc.GetLastError(e->comm), "datatype 6") != NULL, "last error: %s",
        nc.GetLastError(e->comm));
    REQ(nc.AllReduce(p, p, 16, ncclFloat32, ncclSum, NULL, e->stream) == ncclInvalidArgument, "%s",
        "null comm");
    REQ(nc.AllReduce(p, p, 16, ncclFloat32, (ncclRedOp_t)9, e->comm, e->stream) ==
            ncclInvalidArgument,
        "%s", "op 9");
    REQ(nc.Broadcast(p, p, 16, ncclInt8, 1, e->comm, e->stream) == ncclInvalidArgument, "%s",
        "root 1 of 1");
    REQ(nc.Send(p, 16, ncclInt8, -1, e->comm, e->stream) == ncclInvalidArgument, "%s", "peer -1");
    REQ(nc.AllReduce(NULL, p, 16, ncclInt8, ncclSum, e->comm, e->stream) == ncclInvalidArgument,
        "%s", "null sendbuff");
    REQ(nc.GroupEnd() == ncclInvalidUsage, "%s", "unbalanced ncclGroupEnd");
    CUstream other;
    CU(cuStreamCreate(&other, CU_STREAM_NON_BLOCKING));
    NC(nc.GroupStart());
    NC(nc.AllReduce(p, p, 16, ncclInt8, ncclSum, e->comm, e->stream));
    REQ(nc.AllReduce(p, p, 16, ncclInt8, ncclSum, e->comm, other) == ncclInvalidUsage, "%s",
        "second stream in a group");
    REQ(nc.GroupEnd() == ncclInvalidUsage, "%s", "group end after a refused call");
    REQ(launches() == l0 && fakecuda_call_count("cuMemcpyHtoDAsync") == c0, "%s",
        "a refused call launched");
    /* Registration: device memory only. */
    void *h = NULL;
    int host;
    REQ(nc.CommRegister(e->comm, &host, sizeof host, &h) == ncclInvalidArgument, "%s",
        "registered host memory");
    NC(nc.CommRegister(e->comm, p, 4096, &h));
    NC(nc.CommDeregister(e->comm, h));
    REQ(nc.CommDeregister(e->comm, h) == ncclInvalidArgument, "%s", "deregistered twice");
    /* A one-rank AllReduce still works afterwards. */
    int8_t x[16], y[16];
    fill(x, ncclInt8, 16, 0, 3);
    CU(cuMemcpyHtoD(b, x, 16));
    NC(nc.AllReduce(p, p, 16, ncclInt8, ncclSum, e->comm, e->stream));
    CU(cuStreamSynchronize(e->stream));
    CU(cuMemcpyDtoH(y, b, 16));
    REQ(memcmp(x, y, 16) == 0, "%s", "one-rank AllReduce changed its data");
    CU(cuStreamDestroy(other));
    CU(cuMemFree(b));
    NC(nc.CommFinalize(e->comm));
    dev_fini(e);
    return 0;
}

/* ncclMemAlloc memory as the buffers of an AllReduce, registered; freed without a trace. */
static int sc_memalloc(rank_env_t *e, const ncclUniqueId *id, long unused) {
    (void)unused;
    join(e, id);
    size_t m = 25001, bytes = m * 4;
    void *s, *r, *hs, *hr;
    NC(nc.MemAlloc(&s, bytes));
    NC(nc.MemAlloc(&r, bytes));
    NC(nc.CommRegister(e->comm, s, bytes, &hs));
    NC(nc.CommRegister(e->comm, r, bytes, &hr));
    void *in[MAX_RANKS] = {0};
    for (int q = 0; q < e->n; q++) {
        in[q] = malloc(bytes);
        fill(in[q], ncclFloat32, m, q, 9);
    }
    float *want = malloc(bytes), *got = malloc(bytes);
    host_reduce(want, in, e->n, 0, m, ncclFloat32, ncclSum);
    CU(cuMemcpyHtoD((CUdeviceptr)(uintptr_t)s, in[e->rank], bytes));
    NC(nc.AllReduce(s, r, m, ncclFloat32, ncclSum, e->comm, e->stream));
    CU(cuStreamSynchronize(e->stream));
    CU(cuMemcpyDtoH(got, (CUdeviceptr)(uintptr_t)r, bytes));
    REQ(memcmp(got, want, bytes) == 0, "%s", "AllReduce on ncclMemAlloc memory differs");
    NC(nc.CommDeregister(e->comm, hs));
    NC(nc.CommDeregister(e->comm, hr));
    NC(nc.MemFree(s));
    NC(nc.MemFree(r));
    for (int q = 0; q < e->n; q++)
        free(in[q]);
    free(want), free(got);
    dev_fini(e);
    return 0;
}

/* Rank 1 claims one more rank than rank 0: whoever joins second is refused (ncclInvalidUsage),
 * the other times out in init. */
static int sc_nranks_mismatch(rank_env_t *e, const ncclUniqueId *id, long unused) {
    (void)unused;
    ncclResult_t r = nc.CommInitRank(&e->comm, e->rank == 1 ? 3 : 2, *id, e->rank);
    REQ(r == ncclInvalidUsage || r == ncclSystemError, "init: %d", (int)r);
    REQ(e->comm == NULL, "%s", "a comm despite the error");
    return r == ncclInvalidUsage ? 3 : 4;
}

/* Processes 1 and 2 both claim rank 1 of 3: the second is refused, the other two time out. */
static int sc_duplicate_rank(rank_env_t *e, const ncclUniqueId *id, long unused) {
    (void)unused;
    ncclResult_t r = nc.CommInitRank(&e->comm, 3, *id, e->rank == 2 ? 1 : e->rank);
    REQ(r == ncclInvalidUsage || r == ncclSystemError || r == ncclRemoteError, "init: %d", (int)r);
    return r == ncclInvalidUsage ? 3 : 4;
}

/* Rank 0 aborts its comm at once; rank 1's AllReduce fails at once, naming it. */
static int sc_abort(rank_env_t *e, const ncclUniqueId *id, long unused) {
    (void)unused;
    join(e, id);
    if (e->rank == 0) {
        NC(nc.CommAbort(e->comm));
        e->comm = NULL;
        dev_fini(e);
        return 0;
    }
    CUdeviceptr b;
    CU(cuMemAlloc(&b, 4096));
    ncclResult_t r = nc.AllReduce((void *)(uintptr_t)b, (void *)(uintptr_t)b, 1024, ncclFloat32,
                                  ncclSum, e->comm, e->stream);
    CUresult s = cuStreamSynchronize(e->stream);
    REQ(r != ncclSuccess || s == CUDA_ERROR_ILLEGAL_ADDRESS, "call %d, sync %d", (int)r, (int)s);
    ncclResult_t async = ncclSuccess;
    NC(nc.CommGetAsyncError(e->comm, &async));
    REQ(async == ncclRemoteError, "async error %d", (int)async);
    failed_fini(e);
    return 0;
}

/* `arg` one-element AllReduces, alternating between two streams, more than the work ring holds:
 * they run in issue order (the ring is reused only after its kernels finished). */
static int sc_many_launches(rank_env_t *e, const ncclUniqueId *id, long k) {
    join(e, id);
    size_t m = (size_t)k;
    void *in[MAX_RANKS] = {0};
    for (int q = 0; q < e->n; q++) {
        in[q] = malloc(m * 4);
        fill(in[q], ncclInt32, m, q, 11);
    }
    int32_t *want = malloc(m * 4), *got = malloc(m * 4);
    host_reduce(want, in, e->n, 0, m, ncclInt32, ncclSum);
    CUstream s2;
    CU(cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING));
    CUdeviceptr a, b;
    CU(cuMemAlloc(&a, m * 4));
    CU(cuMemAlloc(&b, m * 4));
    CU(cuMemcpyHtoD(a, in[e->rank], m * 4));
    for (size_t i = 0; i < m; i++)
        NC(nc.AllReduce((void *)(uintptr_t)(a + i * 4), (void *)(uintptr_t)(b + i * 4), 1,
                        ncclInt32, ncclSum, e->comm, i % 2 ? s2 : e->stream));
    CU(cuCtxSynchronize());
    CU(cuMemcpyDtoH(got, b, m * 4));
    REQ(memcmp(got, want, m * 4) == 0, "%s", "AllReduces across the ring's wrap differ");
    CU(cuStreamDestroy(s2));
    CU(cuMemFree(a));
    CU(cuMemFree(b));
    for (int q = 0; q < e->n; q++)
        free(in[q]);
    free(want), free(got);
    dev_fini(e);
    return 0;
}

static int sc_init_only(rank_env_t *e, const ncclUniqueId *id, long unused) {
    (void)unused;
    join(e, id);
    dev_fini(e);
    return 0;
}

/* ---- tests -------------------------------------------------------------------------------- */

static void run_ok(int n, scenario_fn fn, long arg, int timeout_s) {
    team_t t;
    team_run(&t, n, fn, arg, timeout_s);
    team_assert_ok(&t);
    team_free(&t);
}

START_TEST(test_collectives_match_rank_order_2_ranks) {
    run_ok(2, sc_collectives, 1, 60);
}
END_TEST

START_TEST(test_collectives_match_rank_order_4_ranks) {
    run_ok(4, sc_collectives, 1, 60);
}
END_TEST

START_TEST(test_collectives_inline_scheduler) {
    setenv("FAKECUDA_SCHED", "inline", 1);
    run_ok(3, sc_collectives, 0, 60);
}
END_TEST

START_TEST(test_collectives_threaded_with_jitter) {
    setenv("FAKECUDA_SCHED", "threaded", 1);
    setenv("FAKECUDA_JITTER_US", "30", 1);
    run_ok(2, sc_collectives, 0, 60);
}
END_TEST

START_TEST(test_ring_and_allreduce_groups_are_one_launch) {
    run_ok(4, sc_groups, (long)FC_NCCL_CHAN_BYTES * 5 / 2 + 12, 60);
}
END_TEST

START_TEST(test_ring_group_inline_scheduler) {
    setenv("FAKECUDA_SCHED", "inline", 1);
    run_ok(3, sc_groups, (long)FC_NCCL_CHAN_BYTES * 3 + 4, 60);
}
END_TEST

/* The dead rank: the others fail within the 2 s timeout, naming it; `sched` as given. */
static void dead_rank(const char *sched) {
    setenv("FAKECUDA_SCHED", sched, 1);
    setenv("FAKENCCL_TIMEOUT_S", "2", 1);
    team_t t;
    team_run(&t, 3, sc_dead_rank, 1, 30);
    team_assert_ok(&t);
    ck_assert_msg(t.secs < 9 * slow(), "took %.1f s", t.secs);
    /* The first to time out aborts the segment: the other may see that first. */
    int timed_out = 0;
    for (int r = 0; r < 3; r += 2) {
        char want[128];
        snprintf(want, sizeof want,
                 "fakenccl: rank %d: timed out after 2 s in AllReduce waiting for rank(s) 1", r);
        timed_out += strstr(t.err[r], want) != NULL;
        ck_assert_msg(strstr(t.err[r], want) || strstr(t.err[r], "aborted"), "rank %d said: %s", r,
                      tu_tail(t.err[r], 600));
    }
    ck_assert_msg(timed_out >= 1, "no rank timed out: %s | %s", tu_tail(t.err[0], 300),
                  tu_tail(t.err[2], 300));
    team_free(&t);
}

START_TEST(test_dead_rank_times_out_threaded) {
    dead_rank("threaded");
}
END_TEST

START_TEST(test_dead_rank_times_out_inline) {
    dead_rank("inline");
}
END_TEST

START_TEST(test_unmapped_buffer_aborts_peers_fast) {
    setenv("FAKENCCL_TIMEOUT_S", "30", 1);
    team_t t;
    team_run(&t, 3, sc_unmapped, 1, 30);
    team_assert_ok(&t);
    ck_assert_msg(t.secs < 10 * slow(), "took %.1f s", t.secs);
    ck_assert_msg(strstr(t.err[1], "is not accessible") != NULL, "rank 1 said: %s",
                  tu_tail(t.err[1], 600));
    for (int r = 0; r < 3; r += 2)
        ck_assert_msg(strstr(t.err[r], "rank 1 aborted") != NULL, "rank %d said: %s", r,
                      tu_tail(t.err[r], 600));
    team_free(&t);
}
END_TEST

START_TEST(test_bad_arguments_launch_nothing) {
    team_t t;
    team_run(&t, 1, sc_bad_args, 0, 30);
    team_assert_ok(&t);
    const char *need[] = {"rank 2 is out of range for nranks 2",
                          "nranks 0",
                          "datatype 6",
                          "op 9",
                          "root 1",
                          "peer -1",
                          "one comm and one stream"};
    for (size_t i = 0; i < sizeof need / sizeof need[0]; i++)
        ck_assert_msg(strstr(t.err[0], need[i]) != NULL, "no \"%s\" in: %s", need[i],
                      tu_tail(t.err[0], 800));
    team_free(&t);
}
END_TEST

START_TEST(test_memalloc_memory_is_a_collective_buffer) {
    run_ok(2, sc_memalloc, 0, 30);
}
END_TEST

START_TEST(test_nranks_mismatch_is_refused) {
    setenv("FAKENCCL_TIMEOUT_S", "2", 1);
    team_t t;
    team_run(&t, 2, sc_nranks_mismatch, 0, 30);
    int refused = t.status[0] == 3 ? 0 : 1;
    ck_assert_msg(t.status[refused] == 3 && t.status[1 - refused] == 4, "statuses %d %d: %s %s",
                  t.status[0], t.status[1], tu_tail(t.err[0], 300), tu_tail(t.err[1], 300));
    ck_assert_msg(strstr(t.err[refused], "differs") != NULL, "%s", t.err[refused]);
    ck_assert_msg(strstr(t.err[1 - refused], "timed out after 2 s in ncclCommInitRank") != NULL,
                  "%s", t.err[1 - refused]);
    team_free(&t);
}
END_TEST

START_TEST(test_duplicate_rank_is_refused) {
    setenv("FAKENCCL_TIMEOUT_S", "2", 1);
    team_t t;
    team_run(&t, 3, sc_duplicate_rank, 0, 30);
    int refused = -1, others = 0;
    for (int r = 0; r < 3; r++) {
        if (t.status[r] == 3 && strstr(t.err[r], "rank 1 already joined"))
            refused = r;
        others += t.status[r] == 4;
    }
    ck_assert_msg(refused >= 1 && others == 2, "statuses %d %d %d: %s | %s | %s", t.status[0],
                  t.status[1], t.status[2], tu_tail(t.err[0], 200), tu_tail(t.err[1], 200),
                  tu_tail(t.err[2], 200));
    team_free(&t);
}
END_TEST

START_TEST(test_abort_fails_peers_fast) {
    setenv("FAKENCCL_TIMEOUT_S", "30", 1);
    team_t t;
    team_run(&t, 2, sc_abort, 0, 30);
    team_assert_ok(&t);
    ck_assert_msg(t.secs < 10 * slow(), "took %.1f s", t.secs);
    ck_assert_msg(strstr(t.err[1], "fakenccl: rank 1: rank 0 aborted") != NULL, "%s",
                  tu_tail(t.err[1], 600));
    team_free(&t);
}
END_TEST

START_TEST(test_launches_on_two_streams_wrap_the_ring) {
    run_ok(2, sc_many_launches, 2500, 60);
}
END_TEST

START_TEST(test_bad_timeout_variable_is_fatal) {
    setenv("FAKENCCL_TIMEOUT_S", "2x", 1);
    team_t t;
    team_run(&t, 1, sc_init_only, 0, 30);
    ck_assert_msg(t.status[0] == 2, "status %d: %s", t.status[0], tu_tail(t.err[0], 300));
    ck_assert_msg(strstr(t.err[0], "FAKENCCL_TIMEOUT_S=2x") != NULL, "%s", t.err[0]);
    team_free(&t);
}
END_TEST

Suite *suite_nccl(void);
Suite *suite_nccl(void) {
    Suite *s = suite_create("nccl");
    struct {
        const char *name;
        const TTest *test;
        int timeout_s;
    } cases[] = {
        {"collectives_2", test_collectives_match_rank_order_2_ranks, 90},
        {"collectives_4", test_collectives_match_rank_order_4_ranks, 90},
        {"collectives_inline", test_collectives_inline_scheduler, 90},
        {"collectives_jitter", test_collectives_threaded_with_jitter, 90},
        {"groups", test_ring_and_allreduce_groups_are_one_launch, 90},
        {"groups_inline", test_ring_group_inline_scheduler, 90},
        {"dead_threaded", test_dead_rank_times_out_threaded, 60},
        {"dead_inline", test_dead_rank_times_out_inline, 60},
        {"unmapped", test_unmapped_buffer_aborts_peers_fast, 60},
        {"bad_args", test_bad_arguments_launch_nothing, 60},
        {"memalloc", test_memalloc_memory_is_a_collective_buffer, 60},
        {"nranks_mismatch", test_nranks_mismatch_is_refused, 60},
        {"bad_timeout", test_bad_timeout_variable_is_fatal, 60},
        {"duplicate_rank", test_duplicate_rank_is_refused, 60},
        {"abort", test_abort_fails_peers_fast, 60},
        {"many_launches", test_launches_on_two_streams_wrap_the_ring, 90},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        TCase *tc = tcase_create(cases[i].name);
        tcase_set_timeout(tc, cases[i].timeout_s * (tu_under_valgrind() ? 10 : 1));
        tcase_add_test(tc, cases[i].test);
        suite_add_tcase(s, tc);
    }
    return s;
}
