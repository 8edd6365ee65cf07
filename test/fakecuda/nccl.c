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
 * at a time; the driver table and options are set up once (pthread_once). This file holds
 * the driver table, options, errors and communicators; nccl_enqueue.c the calls and groups,
 * nccl_mem.c ncclMemAlloc/ncclMemFree. */
#include "nccl_internal.h"

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

#define ID_PREFIX "/fakenccl-"

fcn_drv_t fcn_drv = {.once = PTHREAD_ONCE_INIT};

unsigned fcn_timeout_s = 60;

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
        fcn_timeout_s = (unsigned)s;
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
        {"cuCtxGetCurrent", 4000, (void **)&fcn_drv.ctx_get_current},
        {"cuCtxGetDevice", 2000, (void **)&fcn_drv.ctx_get_device},
        {"cuCtxSynchronize", 2000, (void **)&fcn_drv.ctx_synchronize},
        {"cuModuleLoadData", 2000, (void **)&fcn_drv.module_load_data},
        {"cuModuleGetFunction", 2000, (void **)&fcn_drv.module_get_function},
        {"cuModuleUnload", 2000, (void **)&fcn_drv.module_unload},
        {"cuLaunchKernel", 4000, (void **)&fcn_drv.launch_kernel},
        {"cuMemAlloc", 3020, (void **)&fcn_drv.mem_alloc},
        {"cuMemFree", 3020, (void **)&fcn_drv.mem_free},
        {"cuMemcpyHtoDAsync", 3020, (void **)&fcn_drv.htod_async},
        {"cuStreamQuery", 2000, (void **)&fcn_drv.stream_query},
        {"cuPointerGetAttribute", 4000, (void **)&fcn_drv.pointer_get_attribute},
        {"cuMemGetAllocationGranularity", 10020, (void **)&fcn_drv.granularity},
        {"cuMemCreate", 10020, (void **)&fcn_drv.mem_create},
        {"cuMemRelease", 10020, (void **)&fcn_drv.mem_release},
        {"cuMemAddressReserve", 10020, (void **)&fcn_drv.address_reserve},
        {"cuMemAddressFree", 10020, (void **)&fcn_drv.address_free},
        {"cuMemMap", 10020, (void **)&fcn_drv.mem_map},
        {"cuMemUnmap", 10020, (void **)&fcn_drv.mem_unmap},
        {"cuMemSetAccess", 10020, (void **)&fcn_drv.set_access},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        if (resolve(gpa, t[i].name, t[i].version, t[i].slot))
            return;
    fcn_drv.ok = 1;
}

int fcn_driver_ready(void) {
    pthread_once(&fcn_drv.once, driver_init);
    return fcn_drv.ok;
}

/* ---- errors ------------------------------------------------------------------------------ */

static __thread char last_error[256];

/* Writes "fakenccl: <message>" to stderr in one write, keeps it for ncclGetLastError and
 * returns r. */
ncclResult_t fcn_fail(ncclResult_t r, const char *fmt, ...) {
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
        return fcn_fail(ncclInvalidArgument, "ncclGetVersion: version is NULL");
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
}

/* ---- communicators ------------------------------------------------------------------------ */

/* Names a fresh segment: pid, time and a counter make it unique on the machine. */
NCCL_API ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId) {
    static unsigned counter;
    if (!uniqueId)
        return fcn_fail(ncclInvalidArgument, "ncclGetUniqueId: uniqueId is NULL");
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    memset(uniqueId, 0, sizeof *uniqueId);
    snprintf(uniqueId->internal, sizeof uniqueId->internal, ID_PREFIX "%d-%lld%09ld-%u",
             (int)getpid(), (long long)ts.tv_sec, ts.tv_nsec,
             __atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED));
    return ncclSuccess;
}

double fcn_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Waits (polling) until *word >= want; returns 0, or -1 at the deadline or when the segment is
 * aborted (abort may be NULL: no segment yet). */
static int wait_at_least(const uint32_t *word, uint32_t want, const uint32_t *abort_flag,
                         double deadline) {
    while (__atomic_load_n(word, __ATOMIC_ACQUIRE) < want) {
        if ((abort_flag && __atomic_load_n(abort_flag, __ATOMIC_ACQUIRE)) || fcn_now_s() > deadline)
            return -1;
        usleep(200);
    }
    return 0;
}

/* Opens or creates the segment `name` for nranks ranks and maps it. Returns ncclSuccess with
 * *out and *bytes set, or an error (after its message). */
static ncclResult_t shm_open_map(const char *name, int nranks, int rank, fc_nccl_shm_t **out,
                                 size_t *bytes) {
    double deadline = fcn_now_s() + fcn_timeout_s;
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
                return fcn_fail(ncclSystemError,
                                "ncclCommInitRank: cannot size %s to %zu bytes: %s", name, need,
                                strerror(errno));
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
            return fcn_fail(ncclSystemError, "ncclCommInitRank: shm_open %s: %s", name,
                            strerror(errno));
        fd = shm_open(name, O_RDWR, 0);
        if (fd < 0 && errno == ENOENT)
            continue; /* unlinked meanwhile: try to create it again */
        if (fd < 0)
            return fcn_fail(ncclSystemError, "ncclCommInitRank: shm_open %s: %s", name,
                            strerror(errno));
        struct stat st;
        while (fstat(fd, &st) == 0 && (uint64_t)st.st_size < fc_nccl_hdr_bytes() &&
               fcn_now_s() < deadline)
            usleep(200);
        fc_nccl_shm_t *h =
            (uint64_t)st.st_size < fc_nccl_hdr_bytes()
                ? MAP_FAILED
                : mmap(NULL, fc_nccl_hdr_bytes(), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (h == MAP_FAILED || wait_at_least(&h->ready, 1, NULL, deadline)) {
            if (h != MAP_FAILED)
                munmap(h, fc_nccl_hdr_bytes());
            close(fd);
            return fcn_fail(ncclSystemError,
                            "rank %d: timed out after %u s in ncclCommInitRank waiting for the "
                            "creator of %s",
                            rank, fcn_timeout_s, name);
        }
        int theirs = h->nranks;
        uint64_t total = h->total_bytes;
        munmap(h, fc_nccl_hdr_bytes());
        if (theirs != nranks || total != need) {
            close(fd);
            return fcn_fail(ncclInvalidUsage,
                            "ncclCommInitRank: rank %d: nranks %d differs from the %d of the ranks "
                            "already in the communicator",
                            rank, nranks, theirs);
        }
        void *p = mmap(NULL, need, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        close(fd);
        if (p == MAP_FAILED)
            return fcn_fail(ncclSystemError, "ncclCommInitRank: mmap %s: %s", name,
                            strerror(errno));
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
        return fcn_fail(ncclInvalidUsage,
                        "ncclCommInitRank: rank %d already joined this communicator (pid %d)", rank,
                        (int)zero);
    }
    if (__atomic_add_fetch(&s->arrived, 1, __ATOMIC_ACQ_REL) == (uint32_t)nranks)
        shm_unlink(name);
    if (wait_at_least(&s->arrived, (uint32_t)nranks, &s->aborted, fcn_now_s() + fcn_timeout_s)) {
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
            return fcn_fail(ncclRemoteError, "rank %d: rank %u aborted", rank, ab - 1);
        return fcn_fail(ncclSystemError,
                        "rank %d: timed out after %u s in ncclCommInitRank waiting for rank(s) %s",
                        rank, fcn_timeout_s, late);
    }
    c->ks.shm = s;
    return ncclSuccess;
}

NCCL_API ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId,
                                       int rank) {
    if (!comm)
        return fcn_fail(ncclInvalidArgument, "ncclCommInitRank: comm is NULL");
    *comm = NULL;
    if (nranks < 1 || nranks > FC_NCCL_MAX_RANKS)
        return fcn_fail(ncclInvalidArgument, "ncclCommInitRank: nranks %d is not in 1..%d", nranks,
                        FC_NCCL_MAX_RANKS);
    if (rank < 0 || rank >= nranks)
        return fcn_fail(ncclInvalidArgument,
                        "ncclCommInitRank: rank %d is out of range for nranks %d", rank, nranks);
    if (strncmp(commId.internal, ID_PREFIX, strlen(ID_PREFIX)) != 0 ||
        !memchr(commId.internal, 0, sizeof commId.internal))
        return fcn_fail(ncclInvalidArgument, "ncclCommInitRank: the unique id is not one that "
                                             "ncclGetUniqueId made");
    if (!fcn_driver_ready())
        return fcn_fail(ncclUnhandledCudaError, "ncclCommInitRank: cannot load libcuda.so.1");
    CUcontext ctx = NULL;
    CUdevice dev = 0;
    if (fcn_drv.ctx_get_current(&ctx) != CUDA_SUCCESS || !ctx ||
        fcn_drv.ctx_get_device(&dev) != CUDA_SUCCESS)
        return fcn_fail(ncclInvalidUsage, "ncclCommInitRank: rank %d: no current CUDA context",
                        rank);
    ncclComm_t c = calloc(1, sizeof *c);
    if (!c)
        return fcn_fail(ncclSystemError, "ncclCommInitRank: out of host memory");
    c->ks.rank = rank, c->ks.nranks = nranks, c->ks.timeout_s = fcn_timeout_s, c->dev = (int)dev;
    ncclResult_t r = ncclUnhandledCudaError;
    if (fcn_drv.module_load_data(&c->module, FC_NCCL_MODULE) != CUDA_SUCCESS) {
        r = fcn_fail(r, "ncclCommInitRank: cannot load module %s", FC_NCCL_MODULE);
        goto err_free;
    }
    if (fcn_drv.module_get_function(&c->fn, c->module, FC_NCCL_KERNEL) != CUDA_SUCCESS) {
        r = fcn_fail(r, "ncclCommInitRank: no kernel %s", FC_NCCL_KERNEL);
        goto err_module;
    }
    if (fcn_drv.mem_alloc(&c->ring, FC_NCCL_RING_ITEMS * sizeof(fc_nccl_item_t)) != CUDA_SUCCESS) {
        r = fcn_fail(r, "ncclCommInitRank: cannot allocate the work ring");
        goto err_module;
    }
    r = shm_join(c, commId.internal, nranks, rank);
    if (r != ncclSuccess)
        goto err_ring;
    *comm = c;
    return ncclSuccess;
err_ring:
    fcn_drv.mem_free(c->ring);
err_module:
    fcn_drv.module_unload(c->module);
err_free:
    free(c);
    return r;
}

/* Waits for every launch of the comm (a kernel that times out or aborts still ends). */
static ncclResult_t flush(ncclComm_t c) {
    if (c->launches && fcn_drv.ctx_synchronize() != CUDA_SUCCESS)
        return ncclUnhandledCudaError;
    return ncclSuccess;
}

NCCL_API ncclResult_t ncclCommFinalize(ncclComm_t comm) {
    if (!comm)
        return fcn_fail(ncclInvalidArgument, "ncclCommFinalize: comm is NULL");
    comm->finalized = 1;
    return flush(comm);
}

static ncclResult_t release(ncclComm_t c) {
    ncclResult_t r = ncclSuccess;
    if (fcn_drv.mem_free(c->ring) != CUDA_SUCCESS ||
        fcn_drv.module_unload(c->module) != CUDA_SUCCESS)
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
        return fcn_fail(ncclInvalidArgument, "ncclCommDestroy: comm is NULL");
    ncclResult_t r = comm->finalized ? ncclSuccess : flush(comm);
    ncclResult_t r2 = release(comm);
    return r != ncclSuccess ? r : r2;
}

/* Marks the segment aborted (peers waiting fail at once), lets queued kernels end, frees. */
NCCL_API ncclResult_t ncclCommAbort(ncclComm_t comm) {
    if (!comm)
        return fcn_fail(ncclInvalidArgument, "ncclCommAbort: comm is NULL");
    uint32_t zero = 0;
    __atomic_compare_exchange_n(&comm->ks.shm->aborted, &zero, (uint32_t)comm->ks.rank + 1, 0,
                                __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
    flush(comm);
    release(comm);
    return ncclSuccess;
}

NCCL_API ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError) {
    if (!comm || !asyncError)
        return fcn_fail(ncclInvalidArgument, "ncclCommGetAsyncError: %s is NULL",
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
        return fcn_fail(ncclInvalidArgument, "ncclCommCount: %s is NULL", comm ? "count" : "comm");
    *count = comm->ks.nranks;
    return ncclSuccess;
}

NCCL_API ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device) {
    if (!comm || !device)
        return fcn_fail(ncclInvalidArgument, "ncclCommCuDevice: %s is NULL",
                        comm ? "device" : "comm");
    *device = comm->dev;
    return ncclSuccess;
}

NCCL_API ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank) {
    if (!comm || !rank)
        return fcn_fail(ncclInvalidArgument, "ncclCommUserRank: %s is NULL",
                        comm ? "rank" : "comm");
    *rank = comm->ks.rank;
    return ncclSuccess;
}

/* ---- registration and memory ------------------------------------------------------------- */

static int is_device(CUdeviceptr p) {
    unsigned int type = 0;
    return fcn_drv.pointer_get_attribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p) ==
               CUDA_SUCCESS &&
           type == CU_MEMORYTYPE_DEVICE;
}

/* Records [buff, buff + size) (device memory: both ends are checked) and returns a handle the
 * comm owns until ncclCommDeregister or ncclCommDestroy. */
NCCL_API ncclResult_t ncclCommRegister(const ncclComm_t comm, void *buff, size_t size,
                                       void **handle) {
    if (!comm || !buff || !handle || !size)
        return fcn_fail(ncclInvalidArgument, "ncclCommRegister: %s",
                        !comm     ? "comm is NULL"
                        : !buff   ? "buff is NULL"
                        : !handle ? "handle is NULL"
                                  : "size is 0");
    CUdeviceptr p = (CUdeviceptr)(uintptr_t)buff;
    if (!is_device(p) || !is_device(p + size - 1))
        return fcn_fail(ncclInvalidArgument,
                        "ncclCommRegister: %p (%zu bytes) is not device memory", buff, size);
    reg_t *g = malloc(sizeof *g);
    if (!g)
        return fcn_fail(ncclSystemError, "ncclCommRegister: out of host memory");
    *g = (reg_t){.next = comm->regs, .base = p, .bytes = size};
    comm->regs = g;
    *handle = g;
    return ncclSuccess;
}

NCCL_API ncclResult_t ncclCommDeregister(const ncclComm_t comm, void *handle) {
    if (!comm)
        return fcn_fail(ncclInvalidArgument, "ncclCommDeregister: comm is NULL");
    for (reg_t **pp = &comm->regs; *pp; pp = &(*pp)->next)
        if (*pp == handle) {
            *pp = (*pp)->next;
            free(handle);
            return ncclSuccess;
        }
    return fcn_fail(ncclInvalidArgument, "ncclCommDeregister: %p is not a handle of this comm",
                    handle);
}
