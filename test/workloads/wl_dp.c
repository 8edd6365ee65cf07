/* SPDX-License-Identifier: MIT */
/* wl_dp.c: the process group of a data-parallel run: environment, rendezvous, NCCL collectives.
 *
 * NCCL is opened with dlopen("libnccl.so.2") only when WORLD_SIZE > 1, so a single-process run
 * never loads it and issues exactly the calls it issued before. The rendezvous stands in for
 * torchrun's TCP store: rank 0 writes the ncclUniqueId to a temporary file and renames it to
 * ${TMPDIR:-/tmp}/ooc-rdzv-<MASTER_ADDR>-<MASTER_PORT> (so a reader sees all of it or nothing);
 * the other ranks poll for that file; rank 0 removes it once ncclCommInitRank has returned
 * (which it does only when every rank has joined). A launcher must give each launch its own
 * MASTER_PORT, as scripts/ooc-torchrun does. Each rank uses device 0 of its process (the
 * simulated device is per process; on a host with several GPUs, give each rank its own with
 * CUDA_VISIBLE_DEVICES). Single-threaded. */
#include "wl_dp.h"
#include "wl.h"

#include <dlfcn.h>
#include <errno.h>
/* nccl.h (and the CUDA headers it includes) is written for C++ too: silence what our flags
 * find in it. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wundef"
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <nccl.h>
#pragma GCC diagnostic pop
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Ops the library issues for one group of collectives: the simulated NCCL copies the group's
 * work items to the device (one host-to-device copy) and runs one kernel. */
enum { GROUP_OPS = 2 };

/* Gradients are all-reduced in buckets, as DDP does (its bucket_cap_mb): consecutive gradients
 * up to this many bytes in all, several in one ncclGroupStart/End, a larger one alone. A group
 * is one operation whose buffers must all be resident at once, so the bucket is small enough to
 * fit a quarter of a rank's footprint with room to spare. */
#define BUCKET_BYTES (32u << 10)

/* How long a rank other than 0 waits for rank 0's unique id, and how often it looks. */
enum { RDZV_TIMEOUT_S = 60, RDZV_POLL_US = 5000 };

/* The largest WORLD_SIZE accepted (NCCL's own limit is far above what one host runs). */
enum { MAX_WORLD = 1024 };

static struct {
    __typeof__(&ncclGetErrorString) GetErrorString;
    __typeof__(&ncclGetUniqueId) GetUniqueId;
    __typeof__(&ncclCommInitRank) CommInitRank;
    __typeof__(&ncclCommDestroy) CommDestroy;
    __typeof__(&ncclAllReduce) AllReduce;
    __typeof__(&ncclBroadcast) Broadcast;
    __typeof__(&ncclGroupStart) GroupStart;
    __typeof__(&ncclGroupEnd) GroupEnd;
} nc;

static const char *prog_name = "workload";
static int world = 1, rank, local_rank;
static const char *master_addr, *master_port;
static ncclComm_t comm;

int wl_dp_world(void) {
    return world;
}

int wl_dp_rank(void) {
    return rank;
}

static void bad_var(const char *name, const char *value, const char *accepted) {
    fprintf(stderr, "error: %s: %s=%s: %s\n", prog_name, name, value ? value : "(unset)", accepted);
    exit(2);
}

/* The integer value of variable `name`, which must lie in [lo, hi]; exits 2 otherwise. */
static int env_int(const char *name, long lo, long hi, const char *accepted) {
    const char *v = getenv(name);
    char *end = NULL;
    errno = 0;
    long n = v ? strtol(v, &end, 10) : 0;
    if (!v || !*v || errno || *end || n < lo || n > hi)
        bad_var(name, v, accepted);
    return (int)n;
}

int wl_dp_env(const char *prog) {
    char accepted[160];
    prog_name = prog;
    const char *ws = getenv("WORLD_SIZE");
    if (!ws)
        return world = 1;
    snprintf(accepted, sizeof accepted, "expected an integer from 1 to %d (the number of ranks)",
             MAX_WORLD);
    world = env_int("WORLD_SIZE", 1, MAX_WORLD, accepted);
    if (world == 1)
        return world;
    snprintf(accepted, sizeof accepted, "expected an integer from 0 to %d (WORLD_SIZE=%d)",
             world - 1, world);
    rank = env_int("RANK", 0, world - 1, accepted);
    local_rank = env_int("LOCAL_RANK", 0, world - 1, accepted);
    master_addr = getenv("MASTER_ADDR");
    size_t len = master_addr ? strlen(master_addr) : 0;
    if (len == 0 || len > 200 ||
        strspn(master_addr, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.:-_") !=
            len)
        bad_var("MASTER_ADDR", master_addr,
                "expected a host name or address (1 to 200 letters, digits, '.', ':', '-', '_')");
    env_int("MASTER_PORT", 1, 65535, "expected a port number from 1 to 65535");
    master_port = getenv("MASTER_PORT");
    return world;
}

static void check(ncclResult_t r, const char *fn) {
    if (r == ncclSuccess)
        return;
    fprintf(stderr, "error: %s: %s (%d)\n", fn,
            nc.GetErrorString ? nc.GetErrorString(r) : "unknown NCCL error", (int)r);
    exit(2);
}

static void rdzv_fail(const char *what, const char *path) {
    fprintf(stderr, "error: %s: rendezvous: %s %s: %s\n", prog_name, what, path, strerror(errno));
    exit(2);
}

static void rdzv_path(char *buf, size_t len) {
    const char *tmp = getenv("TMPDIR");
    snprintf(buf, len, "%s/ooc-rdzv-%s-%s", tmp && *tmp ? tmp : "/tmp", master_addr, master_port);
}

/* Rank 0: writes *id to path through a temporary file and a rename. */
static void rdzv_publish(const char *path, const ncclUniqueId *id) {
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "wb");
    if (!f)
        rdzv_fail("cannot create", tmp);
    int ok = fwrite(id, sizeof *id, 1, f) == 1;
    if (fclose(f) != 0 || !ok) {
        unlink(tmp);
        rdzv_fail("cannot write", tmp);
    }
    if (rename(tmp, path) != 0) {
        unlink(tmp);
        rdzv_fail("cannot rename to", path);
    }
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Other ranks: waits for the file at path and reads the id from it (exits 2 after
 * RDZV_TIMEOUT_S seconds). */
static void rdzv_wait(const char *path, ncclUniqueId *id) {
    double deadline = now_s() + RDZV_TIMEOUT_S;
    for (;;) {
        FILE *f = fopen(path, "rb");
        if (f) {
            size_t got = fread(id, sizeof *id, 1, f);
            fclose(f);
            if (got == 1)
                return;
        } else if (errno != ENOENT) {
            rdzv_fail("cannot open", path);
        }
        if (now_s() > deadline) {
            fprintf(stderr,
                    "error: %s: rendezvous: rank %d: no ncclUniqueId from rank 0 in %s after %d s "
                    "(is rank 0 running, with the same MASTER_ADDR and MASTER_PORT?)\n",
                    prog_name, rank, path, RDZV_TIMEOUT_S);
            exit(2);
        }
        usleep(RDZV_POLL_US);
    }
}

void wl_dp_init(void) {
    if (world == 1)
        return;
    void *lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "error: dlopen: %s\n", dlerror());
        exit(2);
    }
#define R(field, name)                                                                             \
    do {                                                                                           \
        *(void **)&nc.field = dlsym(lib, name);                                                    \
        if (!nc.field) {                                                                           \
            fprintf(stderr, "error: dlsym: %s not in libnccl.so.2\n", name);                       \
            exit(2);                                                                               \
        }                                                                                          \
    } while (0)
    R(GetErrorString, "ncclGetErrorString");
    R(GetUniqueId, "ncclGetUniqueId");
    R(CommInitRank, "ncclCommInitRank");
    R(CommDestroy, "ncclCommDestroy");
    R(AllReduce, "ncclAllReduce");
    R(Broadcast, "ncclBroadcast");
    R(GroupStart, "ncclGroupStart");
    R(GroupEnd, "ncclGroupEnd");
#undef R
    char path[4096];
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    rdzv_path(path, sizeof path);
    if (rank == 0) {
        check(nc.GetUniqueId(&id), "ncclGetUniqueId");
        rdzv_publish(path, &id);
    } else {
        rdzv_wait(path, &id);
    }
    check(nc.CommInitRank(&comm, world, id, rank), "ncclCommInitRank");
    if (rank == 0)
        unlink(path);
}

void wl_dp_allreduce_sum(CUstream s, const CUdeviceptr *bufs, const uint64_t *n, int count) {
    for (int i = 0; i < count;) {
        int j = i + 1;
        uint64_t bytes = n[i] * sizeof(float);
        while (j < count && bytes + n[j] * sizeof(float) <= BUCKET_BYTES)
            bytes += n[j++] * sizeof(float);
        if (j - i > 1)
            check(nc.GroupStart(), "ncclGroupStart");
        for (int k = i; k < j; k++) {
            void *p = (void *)(uintptr_t)bufs[k];
            check(nc.AllReduce(p, p, (size_t)n[k], ncclFloat32, ncclSum, comm, (cudaStream_t)s),
                  "ncclAllReduce");
        }
        if (j - i > 1)
            check(nc.GroupEnd(), "ncclGroupEnd");
        wl_ops_add(GROUP_OPS); /* a lone call is one copy and one kernel too */
        i = j;
    }
}

void wl_dp_broadcast(CUstream s, const CUdeviceptr *bufs, const uint64_t *n, int count) {
    check(nc.GroupStart(), "ncclGroupStart");
    for (int i = 0; i < count; i++) {
        void *p = (void *)(uintptr_t)bufs[i];
        check(nc.Broadcast(p, p, (size_t)n[i], ncclFloat32, 0, comm, (cudaStream_t)s),
              "ncclBroadcast");
    }
    check(nc.GroupEnd(), "ncclGroupEnd");
    wl_ops_add(GROUP_OPS);
}

void wl_dp_fini(void) {
    if (world == 1 || !comm)
        return;
    check(nc.CommDestroy(comm), "ncclCommDestroy");
    comm = NULL;
}
