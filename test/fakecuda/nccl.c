/* SPDX-License-Identifier: MIT */
/* nccl.c: a strict simulated NCCL (libnccl.so.2) for N ranks in N processes on one machine.
 *
 * Each rank is a process with its own simulated device. ncclGetUniqueId names a fresh POSIX
 * shared-memory segment (it needs no driver); ncclCommInitRank (with a current context) loads
 * module "nccl", allocates the comm's ring of work items in device memory (FC_NCCL_RING_ITEMS
 * items of fc_nccl_item_t, its own cuMemAlloc, as real NCCL keeps its own device memory), then
 * joins the segment: the first rank creates it (O_EXCL), the others open it, each claims its
 * rank, and the last to arrive unlinks the name, so nothing stays in /dev/shm; a rank that times
 * out waiting for the others unlinks it too. Every collective or Send/Recv call outside a group
 * is exactly one cuMemcpyHtoDAsync of its item into the ring on the user's stream and one launch
 * of nccl_work on that stream (fc_nccl.h, kernels_nccl.c); count 0 launches nothing. The items
 * are copied from pageable host memory, which the driver stages at call time (as CUDA does for
 * an async copy from pageable memory), so no host staging outlives the call; this is also why a
 * captured NCCL call is refused by the driver. Ring space is reused once the kernel that used it
 * reported done (host waits, as real NCCL waits for its work FIFO).
 *
 * Groups (ncclGroupStart/End, thread-local nesting) queue the calls and launch them at the
 * outermost ncclGroupEnd as one copy and one launch, in call order. All calls of a group must use
 * one comm and one stream: anything else is ncclInvalidUsage. A call refused inside a group
 * (for that or a bad argument) fails the whole group: ncclGroupEnd returns the first error and
 * launches nothing. A group holds at most
 * FC_NCCL_RING_ITEMS calls. Arguments are checked before anything is queued; a bad one is
 * ncclInvalidArgument (or ncclInvalidUsage) with one line on stderr naming the value, also kept
 * for ncclGetLastError. FAKENCCL_TIMEOUT_S (default 60, whole seconds 1..86400, anything else is
 * fatal) bounds every wait here and in the kernel. A comm, like a real one, is used by one thread
 * at a time; the driver table and options are set up once (pthread_once). */
#include "fc_nccl.h"

#include <cudaTypedefs.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define NCCL_API __attribute__((visibility("default")))

#define FC_NCCL_RING_ITEMS 1024
#define ID_PREFIX          "/fakenccl-"

/* The driver entry points, resolved once; ok is set when all of them were found. */
static struct {
    pthread_once_t once;
    int ok;
    PFN_cuCtxGetCurrent_v4000 ctx_get_current;
    PFN_cuCtxGetDevice_v2000 ctx_get_device;
    PFN_cuCtxSynchronize_v2000 ctx_synchronize;
    PFN_cuModuleLoadData_v2000 module_load_data;
    PFN_cuModuleGetFunction_v2000 module_get_function;
    PFN_cuModuleUnload_v2000 module_unload;
    PFN_cuLaunchKernel_v4000 launch_kernel;
    PFN_cuMemAlloc_v3020 mem_alloc;
    PFN_cuMemFree_v3020 mem_free;
    PFN_cuMemcpyHtoDAsync_v3020 htod_async;
    PFN_cuStreamQuery_v2000 stream_query;
    PFN_cuPointerGetAttribute_v4000 pointer_get_attribute;
    PFN_cuMemGetAllocationGranularity_v10020 granularity;
    PFN_cuMemCreate_v10020 mem_create;
    PFN_cuMemRelease_v10020 mem_release;
    PFN_cuMemAddressReserve_v10020 address_reserve;
    PFN_cuMemAddressFree_v10020 address_free;
    PFN_cuMemMap_v10020 mem_map;
    PFN_cuMemUnmap_v10020 mem_unmap;
    PFN_cuMemSetAccess_v10020 set_access;
} drv = {.once = PTHREAD_ONCE_INIT};

static unsigned timeout_s = 60;

static int resolve(PFN_cuGetProcAddress_v12000 gpa, const char *name, int version, void **out) {
    CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    *out = NULL;
    return gpa(name, out, version, CU_GET_PROC_ADDRESS_DEFAULT, &st) == CUDA_SUCCESS &&
                   st == CU_GET_PROC_ADDRESS_SUCCESS && *out
               ? 0
               : -1;
}

/* Reads FAKENCCL_TIMEOUT_S strictly; a bad value stops the process with one message. */
static void options_init(void) {
    const char *v = getenv("FAKENCCL_TIMEOUT_S");
    if (v) {
        char *end = NULL;
        errno = 0;
        unsigned long s = strtoul(v, &end, 10);
        if (!*v || *v < '0' || *v > '9' || *end || errno || s < 1 || s > 86400) {
            fprintf(stderr,
                    "fakenccl: FAKENCCL_TIMEOUT_S=%s: expected whole seconds from 1 to 86400\n", v);
            exit(2);
        }
        timeout_s = (unsigned)s;
    }
}

/* Opens the driver and resolves the table; the handle stays open for the process's life. */
static void driver_init(void) {
    options_init();
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!lib)
        return;
    PFN_cuGetProcAddress_v12000 gpa;
    *(void **)&gpa = dlsym(lib, "cuGetProcAddress_v2");
    if (!gpa)
        return;
    struct {
        const char *name;
        int version;
        void **slot;
    } t[] = {
        {"cuCtxGetCurrent", 4000, (void **)&drv.ctx_get_current},
        {"cuCtxGetDevice", 2000, (void **)&drv.ctx_get_device},
        {"cuCtxSynchronize", 2000, (void **)&drv.ctx_synchronize},
        {"cuModuleLoadData", 2000, (void **)&drv.module_load_data},
        {"cuModuleGetFunction", 2000, (void **)&drv.module_get_function},
        {"cuModuleUnload", 2000, (void **)&drv.module_unload},
        {"cuLaunchKernel", 4000, (void **)&drv.launch_kernel},
        {"cuMemAlloc", 3020, (void **)&drv.mem_alloc},
        {"cuMemFree", 3020, (void **)&drv.mem_free},
        {"cuMemcpyHtoDAsync", 3020, (void **)&drv.htod_async},
        {"cuStreamQuery", 2000, (void **)&drv.stream_query},
        {"cuPointerGetAttribute", 4000, (void **)&drv.pointer_get_attribute},
        {"cuMemGetAllocationGranularity", 10020, (void **)&drv.granularity},
        {"cuMemCreate", 10020, (void **)&drv.mem_create},
        {"cuMemRelease", 10020, (void **)&drv.mem_release},
        {"cuMemAddressReserve", 10020, (void **)&drv.address_reserve},
        {"cuMemAddressFree", 10020, (void **)&drv.address_free},
        {"cuMemMap", 10020, (void **)&drv.mem_map},
        {"cuMemUnmap", 10020, (void **)&drv.mem_unmap},
        {"cuMemSetAccess", 10020, (void **)&drv.set_access},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        if (resolve(gpa, t[i].name, t[i].version, t[i].slot))
            return;
    drv.ok = 1;
}

static int driver_ready(void) {
    pthread_once(&drv.once, driver_init);
    return drv.ok;
}

/* ---- errors ------------------------------------------------------------------------------ */

static __thread char last_error[256];

/* Writes "fakenccl: <message>" to stderr in one write, keeps it for ncclGetLastError and
 * returns r. */
__attribute__((format(printf, 2, 3))) static ncclResult_t fail(ncclResult_t r, const char *fmt,
                                                               ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    char line[300];
    int n = snprintf(line, sizeof line, "fakenccl: %s\n", last_error);
    ssize_t w = write(2, line, n < (int)sizeof line ? (size_t)n : sizeof line - 1);
    (void)w;
    return r;
}

NCCL_API const char *ncclGetErrorString(ncclResult_t result) {
    switch (result) {
    case ncclSuccess:
        return "no error";
    case ncclUnhandledCudaError:
        return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError:
        return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError:
        return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument:
        return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage:
        return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError:
        return "remote process exited or there was a network error";
    case ncclInProgress:
        return "NCCL operation in progress";
    default:
        return "unknown result code";
    }
}

NCCL_API const char *ncclGetLastError(ncclComm_t comm) {
    (void)comm;
    return last_error;
}

NCCL_API ncclResult_t ncclGetVersion(int *version) {
    if (!version)
        return fail(ncclInvalidArgument, "ncclGetVersion: version is NULL");
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
}

/* ---- communicators ------------------------------------------------------------------------ */

typedef struct reg {
    struct reg *next;
    CUdeviceptr base;
    size_t bytes;
} reg_t;

struct ncclComm {
    fc_nccl_kstate_t ks; /* first: the kernel's token points here */
    size_t shm_bytes;
    int dev;
    int finalized;
    CUmodule module;
    CUfunction fn;
    CUdeviceptr ring;
    uint64_t ring_pos; /* next free item, counted from the start (wrap skips included) */
    uint64_t launches; /* the last launch_seq issued */
    uint64_t ends[FC_NCCL_RING_ITEMS + 1]; /* ring_pos after launch s at [s % (ITEMS + 1)] */
    reg_t *regs;
};

/* Names a fresh segment: pid, time and a counter make it unique on the machine. */
NCCL_API ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId) {
    static unsigned counter;
    if (!uniqueId)
        return fail(ncclInvalidArgument, "ncclGetUniqueId: uniqueId is NULL");
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    memset(uniqueId, 0, sizeof *uniqueId);
    snprintf(uniqueId->internal, sizeof uniqueId->internal, ID_PREFIX "%d-%lld%09ld-%u",
             (int)getpid(), (long long)ts.tv_sec, ts.tv_nsec,
             __atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED));
    return ncclSuccess;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Waits (polling) until *word >= want; returns 0, or -1 at the deadline or when the segment is
 * aborted (abort may be NULL: no segment yet). */
static int wait_at_least(const uint32_t *word, uint32_t want, const uint32_t *abort_flag,
                         double deadline) {
    while (__atomic_load_n(word, __ATOMIC_ACQUIRE) < want) {
        if ((abort_flag && __atomic_load_n(abort_flag, __ATOMIC_ACQUIRE)) || now_s() > deadline)
            return -1;
        usleep(200);
    }
    return 0;
}

/* Opens or creates the segment `name` for nranks ranks and maps it. Returns ncclSuccess with
 * *out and *bytes set, or an error (after its message). */
static ncclResult_t shm_open_map(const char *name, int nranks, int rank, fc_nccl_shm_t **out,
                                 size_t *bytes) {
    double deadline = now_s() + timeout_s;
    size_t need = (size_t)fc_nccl_shm_bytes(nranks);
    for (;;) {
        int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
        if (fd >= 0) {
            void *p = MAP_FAILED;
            if (ftruncate(fd, (off_t)need) == 0)
                p = mmap(NULL, need, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
            close(fd);
            if (p == MAP_FAILED) {
                shm_unlink(name);
                return fail(ncclSystemError, "ncclCommInitRank: cannot size %s to %zu bytes: %s",
                            name, need, strerror(errno));
            }
            fc_nccl_shm_t *s = p;
            s->magic = FC_NCCL_MAGIC;
            s->nranks = nranks;
            s->total_bytes = need;
            __atomic_store_n(&s->ready, 1, __ATOMIC_RELEASE);
            *out = s, *bytes = need;
            return ncclSuccess;
        }
        if (errno != EEXIST)
            return fail(ncclSystemError, "ncclCommInitRank: shm_open %s: %s", name,
                        strerror(errno));
        fd = shm_open(name, O_RDWR, 0);
        if (fd < 0 && errno == ENOENT)
            continue; /* unlinked meanwhile: try to create it again */
        if (fd < 0)
            return fail(ncclSystemError, "ncclCommInitRank: shm_open %s: %s", name,
                        strerror(errno));
        struct stat st;
        while (fstat(fd, &st) == 0 && (uint64_t)st.st_size < fc_nccl_hdr_bytes() &&
               now_s() < deadline)
            usleep(200);
        fc_nccl_shm_t *h =
            (uint64_t)st.st_size < fc_nccl_hdr_bytes()
                ? MAP_FAILED
                : mmap(NULL, fc_nccl_hdr_bytes(), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (h == MAP_FAILED || wait_at_least(&h->ready, 1, NULL, deadline)) {
            if (h != MAP_FAILED)
                munmap(h, fc_nccl_hdr_bytes());
            close(fd);
            return fail(ncclSystemError,
                        "rank %d: timed out after %u s in ncclCommInitRank waiting for the "
                        "creator of %s",
                        rank, timeout_s, name);
        }
        int theirs = h->nranks;
        uint64_t total = h->total_bytes;
        munmap(h, fc_nccl_hdr_bytes());
        if (theirs != nranks || total != need) {
            close(fd);
            return fail(ncclInvalidUsage,
                        "ncclCommInitRank: rank %d: nranks %d differs from the %d of the ranks "
                        "already in the communicator",
                        rank, nranks, theirs);
        }
        void *p = mmap(NULL, need, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        close(fd);
        if (p == MAP_FAILED)
            return fail(ncclSystemError, "ncclCommInitRank: mmap %s: %s", name, strerror(errno));
        *out = p, *bytes = need;
        return ncclSuccess;
    }
}

/* Joins the segment as `rank` and waits for every rank. */
static ncclResult_t shm_join(ncclComm_t c, const char *name, int nranks, int rank) {
    fc_nccl_shm_t *s = NULL;
    ncclResult_t r = shm_open_map(name, nranks, rank, &s, &c->shm_bytes);
    if (r != ncclSuccess)
        return r;
    int32_t zero = 0;
    if (!__atomic_compare_exchange_n(&s->pid[rank], &zero, (int32_t)getpid(), 0, __ATOMIC_ACQ_REL,
                                     __ATOMIC_ACQUIRE)) {
        munmap(s, c->shm_bytes);
        return fail(ncclInvalidUsage,
                    "ncclCommInitRank: rank %d already joined this communicator (pid %d)", rank,
                    (int)zero);
    }
    if (__atomic_add_fetch(&s->arrived, 1, __ATOMIC_ACQ_REL) == (uint32_t)nranks)
        shm_unlink(name);
    if (wait_at_least(&s->arrived, (uint32_t)nranks, &s->aborted, now_s() + timeout_s)) {
        char late[256] = "";
        size_t n = 0;
        for (int q = 0; q < nranks && n < 200; q++)
            if (!__atomic_load_n(&s->pid[q], __ATOMIC_ACQUIRE))
                n += (size_t)snprintf(late + n, sizeof late - n, "%s%d", n ? "," : "", q);
        uint32_t ab = __atomic_load_n(&s->aborted, __ATOMIC_ACQUIRE);
        if (!ab)
            __atomic_store_n(&s->aborted, (uint32_t)rank + 1, __ATOMIC_RELEASE);
        shm_unlink(name);
        munmap(s, c->shm_bytes);
        if (ab)
            return fail(ncclRemoteError, "rank %d: rank %u aborted", rank, ab - 1);
        return fail(ncclSystemError,
                    "rank %d: timed out after %u s in ncclCommInitRank waiting for rank(s) %s",
                    rank, timeout_s, late);
    }
    c->ks.shm = s;
    return ncclSuccess;
}

NCCL_API ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId,
                                       int rank) {
    if (!comm)
        return fail(ncclInvalidArgument, "ncclCommInitRank: comm is NULL");
    *comm = NULL;
    if (nranks < 1 || nranks > FC_NCCL_MAX_RANKS)
        return fail(ncclInvalidArgument, "ncclCommInitRank: nranks %d is not in 1..%d", nranks,
                    FC_NCCL_MAX_RANKS);
    if (rank < 0 || rank >= nranks)
        return fail(ncclInvalidArgument, "ncclCommInitRank: rank %d is out of range for nranks %d",
                    rank, nranks);
    if (strncmp(commId.internal, ID_PREFIX, strlen(ID_PREFIX)) != 0 ||
        !memchr(commId.internal, 0, sizeof commId.internal))
        return fail(ncclInvalidArgument, "ncclCommInitRank: the unique id is not one that "
                                         "ncclGetUniqueId made");
    if (!driver_ready())
        return fail(ncclUnhandledCudaError, "ncclCommInitRank: cannot load libcuda.so.1");
    CUcontext ctx = NULL;
    CUdevice dev = 0;
    if (drv.ctx_get_current(&ctx) != CUDA_SUCCESS || !ctx ||
        drv.ctx_get_device(&dev) != CUDA_SUCCESS)
        return fail(ncclInvalidUsage, "ncclCommInitRank: rank %d: no current CUDA context", rank);
    ncclComm_t c = calloc(1, sizeof *c);
    if (!c)
        return fail(ncclSystemError, "ncclCommInitRank: out of host memory");
    c->ks.rank = rank, c->ks.nranks = nranks, c->ks.timeout_s = timeout_s, c->dev = (int)dev;
    ncclResult_t r = ncclUnhandledCudaError;
    if (drv.module_load_data(&c->module, FC_NCCL_MODULE) != CUDA_SUCCESS) {
        r = fail(r, "ncclCommInitRank: cannot load module %s", FC_NCCL_MODULE);
        goto err_free;
    }
    if (drv.module_get_function(&c->fn, c->module, FC_NCCL_KERNEL) != CUDA_SUCCESS) {
        r = fail(r, "ncclCommInitRank: no kernel %s", FC_NCCL_KERNEL);
        goto err_module;
    }
    if (drv.mem_alloc(&c->ring, FC_NCCL_RING_ITEMS * sizeof(fc_nccl_item_t)) != CUDA_SUCCESS) {
        r = fail(r, "ncclCommInitRank: cannot allocate the work ring");
        goto err_module;
    }
    r = shm_join(c, commId.internal, nranks, rank);
    if (r != ncclSuccess)
        goto err_ring;
    *comm = c;
    return ncclSuccess;
err_ring:
    drv.mem_free(c->ring);
err_module:
    drv.module_unload(c->module);
err_free:
    free(c);
    return r;
}

/* Waits for every launch of the comm (a kernel that times out or aborts still ends). */
static ncclResult_t flush(ncclComm_t c) {
    if (c->launches && drv.ctx_synchronize() != CUDA_SUCCESS)
        return ncclUnhandledCudaError;
    return ncclSuccess;
}

NCCL_API ncclResult_t ncclCommFinalize(ncclComm_t comm) {
    if (!comm)
        return fail(ncclInvalidArgument, "ncclCommFinalize: comm is NULL");
    comm->finalized = 1;
    return flush(comm);
}

static ncclResult_t release(ncclComm_t c) {
    ncclResult_t r = ncclSuccess;
    if (drv.mem_free(c->ring) != CUDA_SUCCESS || drv.module_unload(c->module) != CUDA_SUCCESS)
        r = ncclUnhandledCudaError;
    munmap(c->ks.shm, c->shm_bytes);
    while (c->regs) {
        reg_t *g = c->regs;
        c->regs = g->next;
        free(g);
    }
    free(c);
    return r;
}

/* Waits for the comm's work (unless ncclCommFinalize did), then frees the ring, the module,
 * the mapping and the registrations. */
NCCL_API ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    if (!comm)
        return fail(ncclInvalidArgument, "ncclCommDestroy: comm is NULL");
    ncclResult_t r = comm->finalized ? ncclSuccess : flush(comm);
    ncclResult_t r2 = release(comm);
    return r != ncclSuccess ? r : r2;
}

/* Marks the segment aborted (peers waiting fail at once), lets queued kernels end, frees. */
NCCL_API ncclResult_t ncclCommAbort(ncclComm_t comm) {
    if (!comm)
        return fail(ncclInvalidArgument, "ncclCommAbort: comm is NULL");
    uint32_t zero = 0;
    __atomic_compare_exchange_n(&comm->ks.shm->aborted, &zero, (uint32_t)comm->ks.rank + 1, 0,
                                __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
    flush(comm);
    release(comm);
    return ncclSuccess;
}

NCCL_API ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError) {
    if (!comm || !asyncError)
        return fail(ncclInvalidArgument, "ncclCommGetAsyncError: %s is NULL",
                    comm ? "asyncError" : "comm");
    uint32_t ab = __atomic_load_n(&comm->ks.shm->aborted, __ATOMIC_ACQUIRE);
    if (ab && (int)ab - 1 != comm->ks.rank)
        *asyncError = ncclRemoteError;
    else if (ab || __atomic_load_n(&comm->ks.failed, __ATOMIC_ACQUIRE))
        *asyncError = ncclSystemError;
    else
        *asyncError = ncclSuccess;
    return ncclSuccess;
}

NCCL_API ncclResult_t ncclCommCount(const ncclComm_t comm, int *count) {
    if (!comm || !count)
        return fail(ncclInvalidArgument, "ncclCommCount: %s is NULL", comm ? "count" : "comm");
    *count = comm->ks.nranks;
    return ncclSuccess;
}

NCCL_API ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device) {
    if (!comm || !device)
        return fail(ncclInvalidArgument, "ncclCommCuDevice: %s is NULL", comm ? "device" : "comm");
    *device = comm->dev;
    return ncclSuccess;
}

NCCL_API ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank) {
    if (!comm || !rank)
        return fail(ncclInvalidArgument, "ncclCommUserRank: %s is NULL", comm ? "rank" : "comm");
    *rank = comm->ks.rank;
    return ncclSuccess;
}

/* ---- registration and memory ------------------------------------------------------------- */

static int is_device(CUdeviceptr p) {
    unsigned int type = 0;
    return drv.pointer_get_attribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p) == CUDA_SUCCESS &&
           type == CU_MEMORYTYPE_DEVICE;
}

/* Records [buff, buff + size) (device memory: both ends are checked) and returns a handle the
 * comm owns until ncclCommDeregister or ncclCommDestroy. */
NCCL_API ncclResult_t ncclCommRegister(const ncclComm_t comm, void *buff, size_t size,
                                       void **handle) {
    if (!comm || !buff || !handle || !size)
        return fail(ncclInvalidArgument, "ncclCommRegister: %s",
                    !comm     ? "comm is NULL"
                    : !buff   ? "buff is NULL"
                    : !handle ? "handle is NULL"
                              : "size is 0");
    CUdeviceptr p = (CUdeviceptr)(uintptr_t)buff;
    if (!is_device(p) || !is_device(p + size - 1))
        return fail(ncclInvalidArgument, "ncclCommRegister: %p (%zu bytes) is not device memory",
                    buff, size);
    reg_t *g = malloc(sizeof *g);
    if (!g)
        return fail(ncclSystemError, "ncclCommRegister: out of host memory");
    *g = (reg_t){.next = comm->regs, .base = p, .bytes = size};
    comm->regs = g;
    *handle = g;
    return ncclSuccess;
}

NCCL_API ncclResult_t ncclCommDeregister(const ncclComm_t comm, void *handle) {
    if (!comm)
        return fail(ncclInvalidArgument, "ncclCommDeregister: comm is NULL");
    for (reg_t **pp = &comm->regs; *pp; pp = &(*pp)->next)
        if (*pp == handle) {
            *pp = (*pp)->next;
            free(handle);
            return ncclSuccess;
        }
    return fail(ncclInvalidArgument, "ncclCommDeregister: %p is not a handle of this comm", handle);
}

/* ncclMemAlloc's allocations, for ncclMemFree. */
typedef struct vmm {
    struct vmm *next;
    CUdeviceptr va;
    size_t bytes;
    CUmemGenericAllocationHandle h;
} vmm_t;

static pthread_mutex_t vmm_lock = PTHREAD_MUTEX_INITIALIZER;
static vmm_t *vmm_list;

/* Allocates through the VMM API as real NCCL does: a physical allocation on the current device,
 * rounded to the recommended granularity, reserved, mapped and made read-write. */
NCCL_API ncclResult_t ncclMemAlloc(void **ptr, size_t size) {
    if (!ptr)
        return fail(ncclInvalidArgument, "ncclMemAlloc: ptr is NULL");
    *ptr = NULL;
    if (size == 0)
        return ncclSuccess;
    if (!driver_ready())
        return fail(ncclUnhandledCudaError, "ncclMemAlloc: cannot load libcuda.so.1");
    CUdevice dev;
    if (drv.ctx_get_device(&dev) != CUDA_SUCCESS)
        return fail(ncclInvalidUsage, "ncclMemAlloc: no current CUDA context");
    CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = dev}};
    size_t gran = 0;
    if (drv.granularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) != CUDA_SUCCESS ||
        !gran)
        return fail(ncclUnhandledCudaError, "ncclMemAlloc: cuMemGetAllocationGranularity failed");
    vmm_t *v = calloc(1, sizeof *v);
    if (!v)
        return fail(ncclSystemError, "ncclMemAlloc: out of host memory");
    v->bytes = (size + gran - 1) / gran * gran;
    CUmemAccessDesc acc = {.location = prop.location, .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    const char *what = "cuMemCreate";
    if (drv.mem_create(&v->h, v->bytes, &prop, 0) != CUDA_SUCCESS)
        goto err_free;
    what = "cuMemAddressReserve";
    if (drv.address_reserve(&v->va, v->bytes, gran, 0, 0) != CUDA_SUCCESS)
        goto err_release;
    what = "cuMemMap";
    if (drv.mem_map(v->va, v->bytes, 0, v->h, 0) != CUDA_SUCCESS)
        goto err_address;
    what = "cuMemSetAccess";
    if (drv.set_access(v->va, v->bytes, &acc, 1) != CUDA_SUCCESS)
        goto err_unmap;
    pthread_mutex_lock(&vmm_lock);
    v->next = vmm_list;
    vmm_list = v;
    pthread_mutex_unlock(&vmm_lock);
    *ptr = (void *)(uintptr_t)v->va;
    return ncclSuccess;
err_unmap:
    drv.mem_unmap(v->va, v->bytes);
err_address:
    drv.address_free(v->va, v->bytes);
err_release:
    drv.mem_release(v->h);
err_free:
    free(v);
    return fail(ncclUnhandledCudaError, "ncclMemAlloc: %s failed for %zu bytes", what, size);
}

/* Unmaps, releases and unreserves what ncclMemAlloc returned (NULL is a no-op). */
NCCL_API ncclResult_t ncclMemFree(void *ptr) {
    if (!ptr)
        return ncclSuccess;
    pthread_mutex_lock(&vmm_lock);
    vmm_t **pp = &vmm_list;
    while (*pp && (*pp)->va != (CUdeviceptr)(uintptr_t)ptr)
        pp = &(*pp)->next;
    vmm_t *v = *pp;
    if (v)
        *pp = v->next;
    pthread_mutex_unlock(&vmm_lock);
    if (!v)
        return fail(ncclInvalidArgument, "ncclMemFree: %p is not from ncclMemAlloc", ptr);
    ncclResult_t r = ncclSuccess;
    if (drv.mem_unmap(v->va, v->bytes) != CUDA_SUCCESS || drv.mem_release(v->h) != CUDA_SUCCESS ||
        drv.address_free(v->va, v->bytes) != CUDA_SUCCESS)
        r = fail(ncclUnhandledCudaError, "ncclMemFree: releasing %p failed", ptr);
    free(v);
    return r;
}

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
    double deadline = now_s() + timeout_s;
    while (end_of(c, __atomic_load_n(&c->ks.done_seq, __ATOMIC_ACQUIRE)) < need) {
        CUresult q = drv.stream_query(stream);
        if (q != CUDA_SUCCESS && q != CUDA_ERROR_NOT_READY)
            return fail(ncclUnhandledCudaError, "rank %d: the stream failed (CUresult %d)",
                        c->ks.rank, (int)q);
        if (__atomic_load_n(&c->ks.shm->aborted, __ATOMIC_ACQUIRE))
            return fail(ncclRemoteError, "rank %d: the communicator was aborted", c->ks.rank);
        if (now_s() > deadline)
            return fail(ncclSystemError,
                        "rank %d: timed out after %u s waiting for space in the work ring",
                        c->ks.rank, timeout_s);
        usleep(100);
    }
    return ncclSuccess;
}

/* Copies items[0..n) into the ring on `stream` and launches nccl_work over them. */
static ncclResult_t launch(ncclComm_t c, CUstream stream, fc_nccl_item_t *items, size_t n) {
    if (n > FC_NCCL_RING_ITEMS)
        return fail(ncclInvalidUsage, "a group of %zu calls exceeds the %d this simulation holds",
                    n, FC_NCCL_RING_ITEMS);
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
    if (drv.htod_async(at, items, n * sizeof *items, stream) != CUDA_SUCCESS)
        return fail(ncclUnhandledCudaError, "rank %d: copying the work items failed", c->ks.rank);
    c->launches = seq;
    c->ring_pos = first + n;
    c->ends[seq % (FC_NCCL_RING_ITEMS + 1)] = c->ring_pos;
    unsigned count = (unsigned)n;
    uint64_t token = (uint64_t)(uintptr_t)&c->ks;
    void *args[] = {&at, &count, &token};
    if (drv.launch_kernel(c->fn, 1, 1, 1, 1, 1, 1, 0, stream, args, NULL) != CUDA_SUCCESS) {
        /* Not queued, or run inline and failed: either way this launch is over. */
        uint64_t done = __atomic_load_n(&c->ks.done_seq, __ATOMIC_ACQUIRE);
        if (done < seq)
            __atomic_store_n(&c->ks.done_seq, seq, __ATOMIC_RELEASE);
        return fail(ncclUnhandledCudaError, "rank %d: the launch failed", c->ks.rank);
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
        return grp.err = fail(ncclInvalidUsage,
                              "a group's calls must use one comm and one stream (this one: "
                              "comm %p, stream %p; the group's: comm %p, stream %p)",
                              (void *)c, (void *)stream, (void *)grp.comm, (void *)grp.stream);
    if (grp.n == grp.cap) {
        size_t cap = grp.cap ? grp.cap * 2 : 16;
        fc_nccl_item_t *p = realloc(grp.items, cap * sizeof *p);
        if (!p)
            return grp.err = fail(ncclSystemError, "out of host memory queueing a group call");
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
        return fail(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
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
        return fail(ncclInvalidArgument, "%s: comm is NULL", fn);
    size_t es = type_bytes(dt);
    if (!es)
        return fail(ncclInvalidArgument, "%s: datatype %d is not supported", fn, (int)dt);
    int reducing =
        kind == FC_NCCL_ALLREDUCE || kind == FC_NCCL_REDUCE || kind == FC_NCCL_REDUCESCATTER;
    if (reducing && (op < ncclSum || op > ncclAvg))
        return fail(ncclInvalidArgument, "%s: reduction op %d is not supported", fn, op);
    int n = comm->ks.nranks;
    if (kind != FC_NCCL_ALLREDUCE && kind != FC_NCCL_ALLGATHER && kind != FC_NCCL_REDUCESCATTER &&
        (peer < 0 || peer >= n))
        return fail(ncclInvalidArgument, "%s: %s %d is out of range for nranks %d", fn,
                    kind == FC_NCCL_SEND || kind == FC_NCCL_RECV ? "peer" : "root", peer, n);
    if (count == 0)
        return ncclSuccess;
    if (count > (SIZE_MAX / 2) / es / (size_t)n)
        return fail(ncclInvalidArgument, "%s: count %zu is too large", fn, count);
    int me = comm->ks.rank;
    int need_send = kind != FC_NCCL_RECV && (kind != FC_NCCL_BROADCAST || peer == me);
    int need_recv = kind != FC_NCCL_SEND && (kind != FC_NCCL_REDUCE || peer == me);
    if ((need_send && !sendbuff) || (need_recv && !recvbuff))
        return fail(ncclInvalidArgument, "%s: %s is NULL", fn,
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
