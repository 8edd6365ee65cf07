/* SPDX-License-Identifier: MIT */
/* init.c: the shim's life in a process: the device side at the first allocation that has a
 * current context, the start-up line, the statistics table and the release of the pool at exit,
 * and what a forked child gives up. (The configuration and the mode are mode.c's.)
 *
 * The only constructor work is setting framework defaults with setenv (README.md, "Things to
 * know"), unless OOC_MODE is off: no driver call, no thread, no device memory. Everything else
 * happens lazily, once (pthread_once and a mutex), on the calling thread. A forked child gives up
 * the parent's device state (as CUDA itself does) and passes every call through. */
#include "shim.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static pthread_mutex_t device_lock = PTHREAD_MUTEX_INITIALIZER;
static int device_state; /* 0: not yet; 1: ready; -1: failed (result in device_rc) */
static CUresult device_rc;

/* The environment as the constructor may read it: OOC_MODE alone (every other option takes its
 * default, so that a bad value elsewhere does not hide the mode). */
static const char *mode_only(const char *name, void *ctx) {
    (void)ctx;
    return strcmp(name, "OOC_MODE") == 0 ? getenv(name) : NULL;
}

/* Frameworks cache device memory in large segments, which would hide their tensors from us. In
 * OOC_MODE=off the shim changes nothing in the process, its environment included: the mode is
 * read here with the pure option parser (no driver call, no allocation). A malformed OOC_MODE
 * is not off: the defaults are set, and the first driver call stops with the parser's message. */
__attribute__((constructor)) static void framework_defaults(void) {
    ooc_options_t o;
    if (ooc_options_parse(mode_only, NULL, &o, NULL, 0) == 0 && o.mode == OOC_MODE_OFF)
        return;
    setenv("PYTORCH_NO_CUDA_MEMORY_CACHING", "1", 0);
    setenv("XLA_PYTHON_CLIENT_ALLOCATOR", "platform", 0);
    /* XLA's command buffers are CUDA graphs whose while loops are conditional nodes, which the
     * shim does not learn: their kernels would run with nothing made resident. An empty list of
     * command-buffer kinds makes XLA launch every kernel itself, where the shim sees it. A user's
     * own setting of the flag is kept. */
    static const char flag[] = "--xla_gpu_enable_command_buffer=";
    static char xla[8192];
    const char *x = getenv("XLA_FLAGS");
    if (x && strstr(x, "xla_gpu_enable_command_buffer"))
        return;
    int n = snprintf(xla, sizeof xla, "%s%s%s", x ? x : "", x && *x ? " " : "", flag);
    if (n > 0 && (size_t)n < sizeof xla)
        setenv("XLA_FLAGS", xla, 1);
}

/* Set in a child forked after the first driver call. The child has none of the parent's threads
 * (the replay worker, the simulated or real driver's) and its copies of our locks may be held by
 * threads that do not exist there: it takes none of them. Every hook passes through (mode off),
 * so the driver answers, as it does after a fork (CUDA_ERROR_NOT_INITIALIZED for the parent's
 * device), and the exit handler does nothing: the pool, the profile and the statistics are the
 * parent's. */
static atomic_int forked_child;

static void on_fork_child(void) {
    atomic_store(&forked_child, 1);
    atomic_store(&ooc_mode_now, OOC_MODE_OFF); /* mode.c's own handler does too */
    ooc_mem_forget_in_child();
}

/* Was the option set in the environment (not defaulted)? */
static int was_set(const char *name) {
    size_t n;
    const ooc_option_desc_t *t = ooc_options_table(&n);
    const ooc_option_desc_t *d = ooc_options_find(name);
    return d && (ooc_options()->set_mask >> (d - t) & 1u);
}

/* Process exit comes in two steps, so that the program's own exit work keeps its memory:
 * - at_exit, registered with atexit at the first allocation (while the driver and any runtime
 *   above it are certainly alive): writes the profile if a recording is still open. It lets
 *   nothing go: exit handlers registered before it (a C++ static destructor, an atexit call at
 *   the top of main) run after it and may still copy, set and launch on our buffers.
 * - at_unload, the library's destructor: runs after every exit handler and after the program's
 *   own destructors (the dynamic linker finalises a preloaded library after the program and
 *   before the driver it does not depend on). It stops replay, prints the statistics and releases
 *   the pool; ooc_mem_shutdown waits for all work queued on the context first, so nothing is
 *   unmapped under a kernel another thread left running, and an op another thread issues after
 *   that gets CUDA_ERROR_DEINITIALIZED, as from a driver that has shut down.
 * Neither does anything in a forked child (on_fork_child). */
static void at_exit(void) {
    if (atomic_load(&forked_child))
        return;
    ooc_record_finish_at_exit();
}

__attribute__((destructor)) static void at_unload(void) {
    if (atomic_load(&forked_child) || __atomic_load_n(&device_state, __ATOMIC_ACQUIRE) != 1)
        return;
    ooc_replay_stop();
    ooc_record_finish_at_exit();
    if (ooc_options()->stats)
        ooc_stats_print(ooc_log_fd()); /* where the log goes (OOC_LOG_FILE) */
    ooc_mem_shutdown();
}

/* "1.50 GiB", "64 KiB": bytes in the largest binary unit that keeps the number at least 1. */
static const char *size_str(char *buf, size_t n, uint64_t bytes) {
    static const char *const units[] = {"bytes", "KiB", "MiB", "GiB", "TiB"};
    unsigned u = 0;
    double v = (double)bytes;
    while (v >= 1024 && u < 4) {
        v /= 1024;
        u++;
    }
    if (u == 0 || v == (double)(uint64_t)v)
        snprintf(buf, n, "%llu %s", (unsigned long long)v, units[u]);
    else
        snprintf(buf, n, "%.2f %s", v, units[u]);
    return buf;
}

/* The chunk size a saved plan was made for, 0 when it cannot be read (ooc_replay_load says
 * why). */
static uint64_t plan_chunk(const char *plan_path) {
    char err[512];
    ooc_plan_t *pl = NULL;
    if (ooc_plan_read_file(plan_path, &pl, err, sizeof err) != 0)
        return 0;
    uint64_t c = pl->chunk_bytes;
    ooc_plan_free(pl);
    return c;
}

/* Can swapped chunks be mapped to host memory (safe mode)? Probes as NCCL does, with one real
 * allocation, because the attribute alone can be wrong in containers. Fills *loc with the host
 * location to use; otherwise writes the reason into why. */
static int safe_probe(CUdevice dev, uint64_t chunk, CUmemLocation *loc, char *why, size_t n) {
    int yes = 0, numa = -1;
    if (ooc_real.cuDeviceGetAttribute(
            &yes, CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev) !=
            CUDA_SUCCESS ||
        !yes) {
        snprintf(why, n, "the device has no host-located VMM memory");
        return 0;
    }
    if (ooc_real.cuDeviceGetAttribute(&numa, CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, dev) !=
            CUDA_SUCCESS ||
        numa < 0)
        numa = 0; /* the driver's rule when the host has no NUMA */
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
    prop.location.id = numa;
    size_t gran = 0;
    CUresult r =
        ooc_real.cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    if (r != CUDA_SUCCESS || gran == 0 || chunk % gran != 0) {
        snprintf(why, n, "host-located VMM granularity %zu does not divide the chunk (%s)", gran,
                 ooc_real_errname(r));
        return 0;
    }
    CUmemGenericAllocationHandle h;
    r = ooc_real.cuMemCreate(&h, chunk, &prop, 0);
    if (r != CUDA_SUCCESS) {
        snprintf(why, n, "a host-located cuMemCreate failed: %s", ooc_real_errname(r));
        return 0;
    }
    ooc_real.cuMemRelease(h);
    *loc = prop.location;
    return 1;
}

static CUresult device_setup(void) {
    CUcontext ctx = NULL;
    CUresult r = ooc_real.cuCtxGetCurrent(&ctx);
    if (r != CUDA_SUCCESS)
        return r;
    if (!ctx)
        return CUDA_ERROR_INVALID_CONTEXT;
    CUdevice dev;
    if ((r = ooc_real.cuCtxGetDevice(&dev)) != CUDA_SUCCESS)
        return r;
    size_t total = 0, free_b = 0, gran = 0;
    char name[128] = "?";
    ooc_real.cuDeviceGetName(name, sizeof name, dev);
    if ((r = ooc_real.cuDeviceTotalMem_v2(&total, dev)) != CUDA_SUCCESS ||
        (r = ooc_real.cuMemGetInfo_v2(&free_b, &total)) != CUDA_SUCCESS)
        return r;
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    r = ooc_real.cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
    if (r != CUDA_SUCCESS) {
        OOC_LOG_E("the device does not support virtual memory management (%s); the shim needs it",
                  ooc_real_errname(r));
        return r;
    }
    const ooc_options_t *o = ooc_options();
    uint64_t budget = ooc_options_budget_bytes(o, total, free_b);
    if (budget > free_b) {
        OOC_LOG_W("OOC_BUDGET of %llu bytes is more than the %zu bytes free on the device; "
                  "using what is free",
                  (unsigned long long)budget, free_b);
        budget = free_b;
    }
    uint64_t chunk = ooc_options_chunk_bytes(o, gran, budget);
    /* OOC_CHUNK=auto follows the budget; a saved plan fixes the chunk it was made for. */
    if (o->chunk.kind != OOC_SIZE_BYTES && o->plan[0] &&
        atomic_load(&ooc_mode_now) == OOC_MODE_AUTO) {
        uint64_t pc = plan_chunk(o->plan);
        if (pc >= gran && pc <= budget && (pc & (pc - 1)) == 0)
            chunk = pc;
    }
    if (budget < chunk) {
        OOC_LOG_E("the budget (%llu bytes%s) is smaller than one chunk (%llu bytes): nothing "
                  "could be resident; set OOC_BUDGET",
                  (unsigned long long)budget,
                  was_set("OOC_BUDGET") ? "" : ": the free device memory less OOC_RESERVE",
                  (unsigned long long)chunk);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    char why[160];
    CUmemLocation safe_loc;
    int safe = o->safe != OOC_SAFE_OFF && safe_probe(dev, chunk, &safe_loc, why, sizeof why);
    if (o->safe == OOC_SAFE_OFF)
        snprintf(why, sizeof why, "OOC_SAFE=off");
    if (o->safe == OOC_SAFE_ON && !safe) {
        OOC_LOG_E("OOC_SAFE=on, but safe mode is not available: %s", why);
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    if (ooc_mem_init(budget, chunk, dev, ctx, safe ? &safe_loc : NULL) != 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    ooc_mem_set_reuse(o->reuse);
    ooc_mem_set_stage(o->safe_stage);
    ooc_mem_set_remap_gate(o->remap_gate);
    ooc_mem_set_gate_timeout((unsigned)o->gate_timeout);
    atexit(at_exit);
    pthread_atfork(NULL, NULL, on_fork_child); /* once: the memory layer is up from here */
    char sb[32], st[32], sc[32];
    ooc_log_banner("device %s, budget %s of %s, chunk %s, mode %s, safe mode %s%s%s", name,
                   size_str(sb, sizeof sb, budget), size_str(st, sizeof st, total),
                   size_str(sc, sizeof sc, chunk), ooc_mode_name(atomic_load(&ooc_mode_now)),
                   safe ? "on" : "off (", safe ? "" : why, safe ? "" : ")");
    int mode = atomic_load(&ooc_mode_now);
    if (mode == OOC_MODE_AUTO && o->plan[0]) {
        if (ooc_replay_load(o->plan) != 0) {
            static const char msg[] = "ooc: stopping: OOC_PLAN names a plan that cannot be "
                                      "replayed (see above)\n";
            ssize_t w = write(2, msg, sizeof msg - 1);
            (void)w;
            exit(1);
        }
    } else if (mode == OOC_MODE_RECORD || mode == OOC_MODE_AUTO) {
        ooc_record_start();
    }
    ooc_mem_fast_enable(); /* after the recorder: no op may slip past it on the fast path */
    return CUDA_SUCCESS;
}

CUresult ooc_device_init(void) {
    if (__atomic_load_n(&device_state, __ATOMIC_ACQUIRE) == 1)
        return CUDA_SUCCESS;
    pthread_mutex_lock(&device_lock);
    if (device_state == 0) {
        device_rc = device_setup();
        /* Without a context the program may still create one: try again next time. */
        if (device_rc != CUDA_ERROR_INVALID_CONTEXT)
            __atomic_store_n(&device_state, device_rc == CUDA_SUCCESS ? 1 : -1, __ATOMIC_RELEASE);
    }
    CUresult r = device_state == 1 ? CUDA_SUCCESS : device_rc;
    pthread_mutex_unlock(&device_lock);
    return r;
}
