/* SPDX-License-Identifier: MIT */
/* fc_core.c: the simulated driver's core: configuration, call counting and fault injection,
 * initialisation, the device and its contexts, cuGetProcAddress, error names and statistics.
 *
 * There is one device (ordinal 0). Contexts are tokens: every context shares the one device
 * state, but a current context is required where the real driver requires one. Configuration is
 * read from FAKECUDA_* variables once, on the first call of any entry point. */
#include "fc_internal.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include "fc_errors.h"

fc_global_t g_fc = {
    .lock = PTHREAD_MUTEX_INITIALIZER,
    .cv = PTHREAD_COND_INITIALIZER,
    .mem_lock = PTHREAD_RWLOCK_INITIALIZER,
    .vm_lock = PTHREAD_MUTEX_INITIALIZER,
    .stats_lock = PTHREAD_MUTEX_INITIALIZER,
    .trace_lock = PTHREAD_MUTEX_INITIALIZER,
    .engine = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER,
               PTHREAD_MUTEX_INITIALIZER},
};

/* ---- messages ----------------------------------------------------------------------------------
 */

void fc_warn(const char *fmt, ...) {
    char buf[1024];
    int n = snprintf(buf, sizeof buf, "fakecuda[%d]: ", (int)getpid());
    va_list ap;
    va_start(ap, fmt);
    n += vsnprintf(buf + n, sizeof buf - (size_t)n - 2, fmt, ap);
    va_end(ap);
    if (n > (int)sizeof buf - 2)
        n = (int)sizeof buf - 2;
    buf[n++] = '\n';
    ssize_t w = write(2, buf, (size_t)n);
    (void)w;
}

void fc_fatal(const char *fmt, ...) {
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fc_warn("fatal: %s", buf);
    abort();
}

uint64_t fc_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void fc_set_sticky(CUresult e) {
    CUresult expected = CUDA_SUCCESS;
    atomic_compare_exchange_strong(&g_fc.sticky, &expected, e);
}

/* ---- configuration ------------------------------------------------------------------------------
 */

static int parse_size(const char *s, uint64_t *out) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s)
        return -1;
    uint64_t mul = 1;
    switch (*end) {
    case 'K':
    case 'k':
        mul = 1ull << 10;
        end++;
        break;
    case 'M':
    case 'm':
        mul = 1ull << 20;
        end++;
        break;
    case 'G':
    case 'g':
        mul = 1ull << 30;
        end++;
        break;
    case 'T':
    case 't':
        mul = 1ull << 40;
        end++;
        break;
    default:
        break;
    }
    if (*end != '\0' || (v && mul > UINT64_MAX / v))
        return -1;
    *out = v * mul;
    return 0;
}

static uint64_t env_size(const char *name, uint64_t dflt) {
    const char *s = getenv(name);
    uint64_t v;
    if (!s || !*s)
        return dflt;
    if (parse_size(s, &v) != 0)
        fc_fatal("%s=%s: expected bytes with an optional K/M/G/T suffix", name, s);
    return v;
}

void fc_sleep_ns(uint64_t ns) {
    struct timespec ts = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
    while (nanosleep(&ts, &ts) != 0)
        ;
}

/* This thread's time in timed host calls beyond their model's, taken off its next ones. */
static __thread uint64_t host_excess_ns;

void fc_host_cost(uint64_t t0, double us) {
    if (!g_fc.cfg.timing || !(us > 0))
        return;
    /* The call ends at t0 + us: what the simulator's own work (the host mappings of a cuMemMap)
     * took counts towards it. A sleep ends late (20-25 us on this project's machines, where a
     * device mapping's cycle of map, set access and unmap models 46 us), and the simulator's
     * work can exceed a call's model (a cuMemMap's 1 us): the excess is taken off the thread's
     * next calls, so that over a run of calls the thread is held for their model's sum, not one
     * overshoot per call more. At most FC_HOST_EXCESS_MAX_NS is carried: a call is never shorter
     * than its model by more. */
    uint64_t model = (uint64_t)(us * 1000.0), credit = host_excess_ns;
    uint64_t deadline = t0 + (model > credit ? model - credit : 0), now = fc_now_ns();
    FC_STAT(vmm_own_ns, now - t0);
    if (deadline > now) {
        /* Slept, not spun: the calling thread is held for the time, as by the real driver's
         * call, but the CPU stays free for the simulated device's engines (on a GPU they need
         * none). Without the timer slack of 50 us, which would add that much to every call. */
        int slack = prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0);
        if (slack > 1)
            (void)prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
        fc_sleep_ns(deadline - now);
        if (slack > 1)
            (void)prctl(PR_SET_TIMERSLACK, (unsigned long)slack, 0, 0, 0);
        now = fc_now_ns();
    }
    uint64_t spent = now - t0 + credit; /* what the model is owed: this call's and the carry */
    host_excess_ns = spent > model ? spent - model : 0;
    if (host_excess_ns > FC_HOST_EXCESS_MAX_NS)
        host_excess_ns = FC_HOST_EXCESS_MAX_NS;
}

static double env_double(const char *name, double dflt) {
    const char *s = getenv(name);
    if (!s || !*s)
        return dflt;
    char *end;
    double v = strtod(s, &end);
    if (*end != '\0' || !(v > 0))
        fc_fatal("%s=%s: expected a positive number", name, s);
    return v;
}

/* 1 for "1", "yes", "on"; 0 for "0", "no", "off"; -1 for anything else. */
static int bool_word(const char *s) {
    if (strcmp(s, "1") == 0 || strcmp(s, "yes") == 0 || strcmp(s, "on") == 0)
        return 1;
    if (strcmp(s, "0") == 0 || strcmp(s, "no") == 0 || strcmp(s, "off") == 0)
        return 0;
    return -1;
}

static int env_bool(const char *name, int dflt) {
    const char *s = getenv(name);
    if (!s || !*s)
        return dflt;
    int b = bool_word(s);
    if (b < 0)
        fc_fatal("%s=%s: expected 0 or 1", name, s);
    return b;
}

static int set_rules(const char *spec, int factor);

/* A child forked after cuInit: the parent's device, streams and worker threads are not its own.
 * As with the real driver, every call that needs initialisation (cuInit included) fails with
 * CUDA_ERROR_NOT_INITIALIZED, and the child's exit leaves the parent's state (stream threads
 * it does not have, the statistics file, the trace) alone. A child forked before cuInit may
 * initialise for itself. */
static atomic_int forked_after_init;

static void on_fork_child(void) {
    if (atomic_load(&g_fc.inited))
        atomic_store(&forked_after_init, 1);
}

static void config_load_once(void) {
    pthread_atfork(NULL, NULL, on_fork_child);
    fc_config_t *c = &g_fc.cfg;
    c->mem_bytes = env_size("FAKECUDA_MEM_BYTES", 64ull << 30);
    c->granularity = env_size("FAKECUDA_GRANULARITY", 2ull << 20);
    if (c->granularity < 4096 || (c->granularity & (c->granularity - 1)))
        fc_fatal("FAKECUDA_GRANULARITY=%llu: expected a power of two >= 4096",
                 (unsigned long long)c->granularity);
    const char *sched = getenv("FAKECUDA_SCHED");
    if (!sched || !*sched || strcmp(sched, "threaded") == 0)
        c->threaded = 1;
    else if (strcmp(sched, "inline") == 0)
        c->threaded = 0;
    else
        fc_fatal("FAKECUDA_SCHED=%s: expected inline or threaded", sched);
    c->jitter_us = (unsigned)env_size("FAKECUDA_JITTER_US", 0);
    c->seed = env_size("FAKECUDA_SEED", 1);
    c->strict = env_bool("FAKECUDA_STRICT", 1);
    const char *rq = getenv("FAKECUDA_REMAP_QUEUED");
    c->remap_queued = !rq || !*rq ? 0 : strcmp(rq, "wait") == 0 ? 2 : bool_word(rq);
    if (c->remap_queued < 0)
        fc_fatal("FAKECUDA_REMAP_QUEUED=%s: expected 0, 1 or wait", rq);
    c->queue_depth = (unsigned)env_size("FAKECUDA_QUEUE_DEPTH", 1024);
    c->poison = env_bool("FAKECUDA_POISON", 1);
    c->host_vmm = env_bool("FAKECUDA_HOST_VMM", 1);
    c->timing = env_bool("FAKECUDA_TIMING", 0);
    c->gflops = env_double("FAKECUDA_GFLOPS", 4.0);
    c->hbm_gbps = env_double("FAKECUDA_HBM_GBPS", 40.0);
    c->h2d_gbps = env_double("FAKECUDA_H2D_GBPS", 2.0);
    c->d2h_gbps = env_double("FAKECUDA_D2H_GBPS", 2.0);
    c->launch_us = env_double("FAKECUDA_LAUNCH_US", 5.0);
    /* Measured on an H200 with driver 580 (profiles/gpu/h200/first-contact/logs/hostvmm.log,
     * medians per 2 MiB mapping): map 0.9, set access 26.8, unmap 17.5, create 27.5 us; host-
     * located: set access 59.2, unmap 33.0, create 468.5 us. The cost is per mapping, whatever
     * the size and however many one call covers. */
    static const double vmm_default[7] = {1, 27, 18, 27, 59, 33, 469};
    memcpy(c->vmm_us, vmm_default, sizeof c->vmm_us);
    const char *vmm = getenv("FAKECUDA_VMM_US");
    if (vmm && *vmm) {
        const char *q = vmm;
        for (int i = 0; i < 7; i++) {
            char *end;
            c->vmm_us[i] = strtod(q, &end);
            if (end == q || !(c->vmm_us[i] >= 0) || (i < 6 && *end != ',') || (i == 6 && *end))
                fc_fatal("FAKECUDA_VMM_US=%s: expected 7 numbers of microseconds, comma-"
                         "separated: map,access,unmap,create,host_access,host_unmap,host_create",
                         vmm);
            q = end + 1;
        }
    }
    c->stats_path = getenv("FAKECUDA_STATS");
    c->trace_path = getenv("FAKECUDA_TRACE");
    if (c->timing && c->trace_path && *c->trace_path) {
        g_fc.trace = fopen(c->trace_path, "w");
        if (!g_fc.trace)
            fc_fatal("FAKECUDA_TRACE=%s: %s", c->trace_path, strerror(errno));
        g_fc.trace_t0 = fc_now_ns();
        fprintf(g_fc.trace, "engine\tstart_ns\tend_ns\top\tqueued_ns\tready_ns\tran_ns\n");
    }
    c->fail_spec = getenv("FAKECUDA_FAIL");
    const char *name = getenv("FAKECUDA_DEVICE_NAME");
    snprintf(c->device_name, sizeof c->device_name, "%s",
             name && *name ? name : "fakecuda simulated device");
    g_fc.st.device_capacity_bytes = c->mem_bytes;
    if (c->fail_spec && *c->fail_spec && set_rules(c->fail_spec, 0) != 0)
        fc_fatal("FAKECUDA_FAIL=%s: expected name@N[+][=code][,...]", c->fail_spec);
    const char *slow = getenv("FAKECUDA_SLOW");
    if (slow && *slow && set_rules(slow, 1) != 0)
        fc_fatal("FAKECUDA_SLOW=%s: expected name@N[+]=factor[,...]", slow);
}

static pthread_once_t config_once = PTHREAD_ONCE_INIT;

void fc_config_load(void) {
    pthread_once(&config_once, config_load_once);
}

/* ---- call counting and fault injection
 * ------------------------------------------------------------ */

#define FC_MAX_SLOTS  256
#define FC_MAX_FAULTS 32

struct fc_api_slot {
    char name[64];
    atomic_uint_fast64_t calls;
};

static fc_api_slot_t slots[FC_MAX_SLOTS];
static atomic_int nslots;
static pthread_mutex_t slot_lock = PTHREAD_MUTEX_INITIALIZER;

/* A rule about the Nth call (or every call from the Nth, `plus`) of one entry point: a fault
 * returns `val` as its error code; a slow-down multiplies the modelled time of the op it queues
 * by `val`. */
typedef struct fc_rule {
    fc_api_slot_t *slot;
    uint64_t n;
    int plus;
    double val;
} fc_rule_t;

static fc_rule_t faults[FC_MAX_FAULTS], slows[FC_MAX_FAULTS];
static atomic_int nfaults, nslows;
static pthread_mutex_t fault_lock = PTHREAD_MUTEX_INITIALIZER;
/* The slow-down the calling thread's last entry point asked for, taken by the op it queues. */
static _Thread_local double slow_factor = 1.0;

fc_api_slot_t *fc_api_slot(const char *base) {
    pthread_mutex_lock(&slot_lock);
    int n = atomic_load(&nslots);
    for (int i = 0; i < n; i++) {
        if (strcmp(slots[i].name, base) == 0) {
            pthread_mutex_unlock(&slot_lock);
            return &slots[i];
        }
    }
    if (n == FC_MAX_SLOTS)
        fc_fatal("too many distinct entry points");
    snprintf(slots[n].name, sizeof slots[n].name, "%s", base);
    atomic_store(&nslots, n + 1);
    pthread_mutex_unlock(&slot_lock);
    return &slots[n];
}

/* Parses "name@N[+][=value],..." into out (at most FC_MAX_FAULTS rules); a fault's value is a
 * positive integer (default 2, out of memory), a slow-down's a factor above 0 (required). Slots
 * are looked up only when apply is set. Returns the number of rules, or -1 on a bad spec. */
static int parse_rules(const char *spec, fc_rule_t *out, int factor, int apply) {
    int n = 0;
    const char *p = spec;
    while (*p) {
        const char *at = strchr(p, '@');
        if (!at || at == p || at - p >= 63 || n == FC_MAX_FAULTS)
            return -1;
        char name[64];
        memcpy(name, p, (size_t)(at - p));
        name[at - p] = '\0';
        char *end;
        errno = 0;
        unsigned long long cnt = strtoull(at + 1, &end, 10);
        if (errno || end == at + 1 || cnt == 0)
            return -1;
        int plus = 0;
        if (*end == '+') {
            plus = 1;
            end++;
        }
        double val = CUDA_ERROR_OUT_OF_MEMORY;
        if (*end == '=') {
            char *e2;
            val = factor ? strtod(end + 1, &e2) : (double)strtol(end + 1, &e2, 10);
            if (e2 == end + 1 || !(val > 0))
                return -1;
            end = e2;
        } else if (factor) {
            return -1;
        }
        if (*end != ',' && *end != '\0')
            return -1;
        out[n] = (fc_rule_t){
            .slot = apply ? fc_api_slot(name) : NULL, .n = cnt, .plus = plus, .val = val};
        n++;
        p = *end == ',' ? end + 1 : end;
    }
    return n;
}

/* Installs the rules of spec (faults, or slow-downs when factor is set) in place of the ones
 * before, and starts every call count again. Returns 0, or -1 on a bad spec (nothing changed). */
static int set_rules(const char *spec, int factor) {
    fc_rule_t parsed[FC_MAX_FAULTS];
    if (parse_rules(spec, parsed, factor, 0) < 0)
        return -1;
    int n = parse_rules(spec, parsed, factor, 1);
    pthread_mutex_lock(&fault_lock);
    memcpy(factor ? slows : faults, parsed, sizeof(fc_rule_t) * (size_t)n);
    atomic_store(factor ? &nslows : &nfaults, n);
    int ns = atomic_load(&nslots);
    for (int i = 0; i < ns; i++)
        atomic_store(&slots[i].calls, 0);
    pthread_mutex_unlock(&fault_lock);
    return 0;
}

static int rule_hits(const fc_rule_t *r, const fc_api_slot_t *slot, uint64_t n) {
    return r->slot == slot && (n == r->n || (r->plus && n > r->n));
}

double fc_slow_take(void) {
    double f = slow_factor;
    slow_factor = 1.0;
    return f;
}

FAKECUDA_API int fakecuda_set_faults(const char *spec) {
    fc_config_load();
    return set_rules(spec ? spec : "", 0);
}

FAKECUDA_API uint64_t fakecuda_call_count(const char *api) {
    int n = atomic_load(&nslots);
    for (int i = 0; i < n; i++)
        if (strcmp(slots[i].name, api) == 0)
            return atomic_load(&slots[i].calls);
    return 0;
}

CUresult fc_enter(fc_api_slot_t *slot, int need_init, int check_sticky) {
    fc_config_load();
    uint64_t n = atomic_fetch_add(&slot->calls, 1) + 1;
    int nf = atomic_load_explicit(&nfaults, memory_order_acquire);
    for (int i = 0; i < nf; i++) {
        if (rule_hits(&faults[i], slot, n)) {
            FC_STAT(injected_faults, 1);
            return (CUresult)faults[i].val;
        }
    }
    slow_factor = 1.0;
    int nsl = atomic_load_explicit(&nslows, memory_order_acquire);
    for (int i = 0; i < nsl; i++)
        if (rule_hits(&slows[i], slot, n))
            slow_factor = slows[i].val;
    if (need_init && (!atomic_load(&g_fc.inited) || atomic_load(&forked_after_init)))
        return CUDA_ERROR_NOT_INITIALIZED;
    if (check_sticky) {
        CUresult s = atomic_load(&g_fc.sticky);
        if (s != CUDA_SUCCESS)
            return s;
    }
    return CUDA_SUCCESS;
}

/* ---- statistics
 * ------------------------------------------------------------------------------------ */

void fc_stat_add(size_t offset, int64_t delta) {
    pthread_mutex_lock(&g_fc.stats_lock);
    uint64_t *f = (uint64_t *)((char *)&g_fc.st + offset);
    *f += (uint64_t)delta;
    if (offset == offsetof(fakecuda_stats_t, device_used_bytes) &&
        g_fc.st.device_used_bytes > g_fc.st.device_peak_bytes)
        g_fc.st.device_peak_bytes = g_fc.st.device_used_bytes;
    pthread_mutex_unlock(&g_fc.stats_lock);
}

FAKECUDA_API void fakecuda_get_stats(fakecuda_stats_t *out) {
    fc_config_load();
    pthread_mutex_lock(&g_fc.stats_lock);
    *out = g_fc.st;
    pthread_mutex_unlock(&g_fc.stats_lock);
}

static void write_stats(void) {
    const char *path = g_fc.cfg.stats_path;
    if (!path || !*path)
        return;
    FILE *f = strcmp(path, "-") == 0 ? stderr : fopen(path, "w");
    if (!f) {
        fc_warn("FAKECUDA_STATS=%s: %s", path, strerror(errno));
        return;
    }
    fakecuda_stats_t s;
    fakecuda_get_stats(&s);
#define ROW(field) fprintf(f, "%s\t%llu\n", #field, (unsigned long long)s.field)
    ROW(device_capacity_bytes);
    ROW(device_used_bytes);
    ROW(device_peak_bytes);
    ROW(allocs_live);
    ROW(alloc_bytes_live);
    ROW(vmm_handles_live);
    ROW(vmm_device_bytes_live);
    ROW(vmm_host_bytes_live);
    ROW(reservations_live);
    ROW(reserved_bytes_live);
    ROW(mappings_live);
    ROW(mapped_bytes_live);
    ROW(host_allocs_live);
    ROW(host_alloc_bytes_live);
    ROW(streams_live);
    ROW(events_live);
    ROW(modules_live);
    ROW(kernels_launched);
    ROW(memcpys);
    ROW(memsets);
    ROW(bytes_h2d);
    ROW(bytes_d2h);
    ROW(bytes_d2d);
    ROW(illegal_accesses);
    ROW(strict_violations);
    ROW(injected_faults);
    ROW(kernel_host_accesses);
    ROW(graphs_live);
    ROW(graph_execs_live);
    ROW(graph_launches);
    ROW(ops_captured);
    ROW(maps_moved);
    ROW(vmm_own_ns);
    ROW(worker_wakeups);
    ROW(queue_full_waits);
#undef ROW
    int n = atomic_load(&nslots);
    for (int i = 0; i < n; i++)
        fprintf(f, "calls.%s\t%llu\n", slots[i].name,
                (unsigned long long)atomic_load(&slots[i].calls));
    if (f != stderr)
        fclose(f);
}

static atomic_int shut_down;

FAKECUDA_API void fakecuda_shutdown(void) {
    if (atomic_exchange(&shut_down, 1) || atomic_load(&forked_after_init))
        return;
    if (atomic_load(&g_fc.inited)) {
        fc_streams_shutdown();
        fc_kernels_shutdown();
    }
    write_stats();
    pthread_mutex_lock(&g_fc.trace_lock);
    if (g_fc.trace) {
        fclose(g_fc.trace);
        g_fc.trace = NULL;
    }
    pthread_mutex_unlock(&g_fc.trace_lock);
}

__attribute__((destructor)) static void fc_fini(void) {
    fakecuda_shutdown();
}

/* ---- initialisation, device, contexts
 * ---------------------------------------------------------------- */

struct CUctx_st {
    uint32_t magic;
    int primary;
};

static struct CUctx_st primary_ctx = {FC_MAGIC_CTX, 1};
static atomic_int primary_refs;
static _Thread_local CUcontext ctx_stack[16];
static _Thread_local int ctx_depth;

static pthread_once_t init_once = PTHREAD_ONCE_INIT;

static void init_once_fn(void) {
    fc_kernels_init();
    atomic_store(&g_fc.inited, 1);
}

static CUresult fc_init(unsigned int flags) {
    FC_ENTER_ANY("cuInit");
    if (atomic_load(&forked_after_init))
        return CUDA_ERROR_NOT_INITIALIZED;
    if (flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_once(&init_once, init_once_fn);
    return CUDA_SUCCESS;
}
FC_EXPORT(cuInit, PFN_cuInit_v2000, fc_init);

static CUresult fc_driver_version(int *v) {
    FC_ENTER_ANY("cuDriverGetVersion");
    if (!v)
        return CUDA_ERROR_INVALID_VALUE;
    *v = CUDA_VERSION;
    return CUDA_SUCCESS;
}
FC_EXPORT(cuDriverGetVersion, PFN_cuDriverGetVersion_v2020, fc_driver_version);

static CUresult fc_device_get(CUdevice *d, int ordinal) {
    FC_ENTER_INIT("cuDeviceGet");
    if (!d || ordinal != 0)
        return CUDA_ERROR_INVALID_DEVICE;
    *d = 0;
    return CUDA_SUCCESS;
}
FC_EXPORT(cuDeviceGet, PFN_cuDeviceGet_v2000, fc_device_get);

static CUresult fc_device_count(int *n) {
    FC_ENTER_INIT("cuDeviceGetCount");
    if (!n)
        return CUDA_ERROR_INVALID_VALUE;
    *n = 1;
    return CUDA_SUCCESS;
}
FC_EXPORT(cuDeviceGetCount, PFN_cuDeviceGetCount_v2000, fc_device_count);

static CUresult fc_device_name(char *name, int len, CUdevice d) {
    FC_ENTER_INIT("cuDeviceGetName");
    if (!name || len <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (d != 0)
        return CUDA_ERROR_INVALID_DEVICE;
    snprintf(name, (size_t)len, "%s", g_fc.cfg.device_name);
    return CUDA_SUCCESS;
}
FC_EXPORT(cuDeviceGetName, PFN_cuDeviceGetName_v2000, fc_device_name);

static CUresult fc_device_total(size_t *bytes, CUdevice d) {
    FC_ENTER_INIT("cuDeviceTotalMem");
    if (!bytes)
        return CUDA_ERROR_INVALID_VALUE;
    if (d != 0)
        return CUDA_ERROR_INVALID_DEVICE;
    *bytes = g_fc.cfg.mem_bytes;
    return CUDA_SUCCESS;
}
FC_EXPORT(cuDeviceTotalMem_v2, PFN_cuDeviceTotalMem_v3020, fc_device_total);

static CUresult fc_device_attr(int *v, CUdevice_attribute a, CUdevice d) {
    FC_ENTER_INIT("cuDeviceGetAttribute");
    if (!v || (int)a <= 0 || a >= CU_DEVICE_ATTRIBUTE_MAX)
        return CUDA_ERROR_INVALID_VALUE;
    if (d != 0)
        return CUDA_ERROR_INVALID_DEVICE;
    switch (a) {
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK:
        *v = 1024;
        break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X:
        *v = 1024;
        break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y:
        *v = 1024;
        break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z:
        *v = 64;
        break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X:
        *v = 2147483647;
        break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y:
        *v = 65535;
        break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z:
        *v = 65535;
        break;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE:
        *v = 32;
        break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT:
        *v = 132;
        break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR:
        *v = 9;
        break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR:
        *v = 0;
        break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK:
        *v = 49152;
        break;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING:
        *v = 1;
        break;
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS:
        *v = 1;
        break;
    case CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT:
        *v = 2;
        break;
    case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY:
        *v = 1;
        break;
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
        *v = 1;
        break;
    case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED:
        *v = 1;
        break;
    case CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH:
        *v = 1;
        break;
    case CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_HOST_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
        *v = g_fc.cfg.host_vmm;
        break;
    default:
        *v = 0;
        break;
    }
    return CUDA_SUCCESS;
}
FC_EXPORT(cuDeviceGetAttribute, PFN_cuDeviceGetAttribute_v2000, fc_device_attr);

static CUresult fc_device_uuid(CUuuid *u, CUdevice d) {
    FC_ENTER_INIT("cuDeviceGetUuid");
    if (!u)
        return CUDA_ERROR_INVALID_VALUE;
    if (d != 0)
        return CUDA_ERROR_INVALID_DEVICE;
    memcpy(u->bytes, "fakecuda-device0", 16);
    return CUDA_SUCCESS;
}
FC_EXPORT(cuDeviceGetUuid_v2, PFN_cuDeviceGetUuid_v11040, fc_device_uuid);

static CUresult fc_primary_retain(CUcontext *c, CUdevice d) {
    FC_ENTER_INIT("cuDevicePrimaryCtxRetain");
    if (!c)
        return CUDA_ERROR_INVALID_VALUE;
    if (d != 0)
        return CUDA_ERROR_INVALID_DEVICE;
    atomic_fetch_add(&primary_refs, 1);
    *c = &primary_ctx;
    return CUDA_SUCCESS;
}
FC_EXPORT(cuDevicePrimaryCtxRetain, PFN_cuDevicePrimaryCtxRetain_v7000, fc_primary_retain);

static CUresult fc_primary_release(CUdevice d) {
    FC_ENTER_INIT("cuDevicePrimaryCtxRelease");
    if (d != 0)
        return CUDA_ERROR_INVALID_DEVICE;
    if (atomic_load(&primary_refs) <= 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    atomic_fetch_sub(&primary_refs, 1);
    return CUDA_SUCCESS;
}
FC_EXPORT(cuDevicePrimaryCtxRelease_v2, PFN_cuDevicePrimaryCtxRelease_v11000, fc_primary_release);

static CUresult fc_primary_state(CUdevice d, unsigned int *flags, int *active) {
    FC_ENTER_INIT("cuDevicePrimaryCtxGetState");
    if (!flags || !active)
        return CUDA_ERROR_INVALID_VALUE;
    if (d != 0)
        return CUDA_ERROR_INVALID_DEVICE;
    *flags = 0;
    *active = atomic_load(&primary_refs) > 0;
    return CUDA_SUCCESS;
}
FC_EXPORT(cuDevicePrimaryCtxGetState, PFN_cuDevicePrimaryCtxGetState_v7000, fc_primary_state);

static CUresult fc_primary_reset(CUdevice d) {
    FC_ENTER_INIT("cuDevicePrimaryCtxReset");
    if (d != 0)
        return CUDA_ERROR_INVALID_DEVICE;
    return fc_sync_all();
}
FC_EXPORT(cuDevicePrimaryCtxReset_v2, PFN_cuDevicePrimaryCtxReset_v11000, fc_primary_reset);

static CUresult fc_ctx_create(CUcontext *c, unsigned int flags, CUdevice d) {
    FC_ENTER_INIT("cuCtxCreate");
    (void)flags;
    if (!c)
        return CUDA_ERROR_INVALID_VALUE;
    if (d != 0)
        return CUDA_ERROR_INVALID_DEVICE;
    struct CUctx_st *x = calloc(1, sizeof *x);
    if (!x)
        return CUDA_ERROR_OUT_OF_MEMORY;
    x->magic = FC_MAGIC_CTX;
    if (ctx_depth < 16)
        ctx_stack[ctx_depth++] = x;
    else
        ctx_stack[15] = x;
    *c = x;
    return CUDA_SUCCESS;
}
FC_EXPORT(cuCtxCreate_v2, PFN_cuCtxCreate_v3020, fc_ctx_create);

static CUresult fc_ctx_destroy(CUcontext c) {
    FC_ENTER_INIT("cuCtxDestroy");
    if (!c || c->magic != FC_MAGIC_CTX || c->primary)
        return CUDA_ERROR_INVALID_CONTEXT;
    CUresult r = fc_sync_all();
    for (int i = 0; i < ctx_depth; i++)
        if (ctx_stack[i] == c)
            ctx_stack[i] = NULL;
    c->magic = 0;
    free(c);
    return r;
}
FC_EXPORT(cuCtxDestroy_v2, PFN_cuCtxDestroy_v4000, fc_ctx_destroy);

int fc_ctx_valid(CUcontext c) {
    return c && c->magic == FC_MAGIC_CTX;
}

CUresult fc_require_ctx(void) {
    if (ctx_depth == 0 || ctx_stack[ctx_depth - 1] == NULL)
        return CUDA_ERROR_INVALID_CONTEXT;
    return CUDA_SUCCESS;
}

CUcontext fc_ctx_current(void) {
    return ctx_depth ? ctx_stack[ctx_depth - 1] : NULL;
}

static CUresult fc_ctx_get(CUcontext *c) {
    FC_ENTER_INIT("cuCtxGetCurrent");
    if (!c)
        return CUDA_ERROR_INVALID_VALUE;
    *c = ctx_depth ? ctx_stack[ctx_depth - 1] : NULL;
    return CUDA_SUCCESS;
}
FC_EXPORT(cuCtxGetCurrent, PFN_cuCtxGetCurrent_v4000, fc_ctx_get);

static CUresult fc_ctx_set(CUcontext c) {
    FC_ENTER_INIT("cuCtxSetCurrent");
    if (c && c->magic != FC_MAGIC_CTX)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (!c) {
        if (ctx_depth)
            ctx_depth--;
        return CUDA_SUCCESS;
    }
    if (ctx_depth == 0)
        ctx_depth = 1;
    ctx_stack[ctx_depth - 1] = c;
    return CUDA_SUCCESS;
}
FC_EXPORT(cuCtxSetCurrent, PFN_cuCtxSetCurrent_v4000, fc_ctx_set);

static CUresult fc_ctx_push(CUcontext c) {
    FC_ENTER_INIT("cuCtxPushCurrent");
    if (!c || c->magic != FC_MAGIC_CTX)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (ctx_depth == 16)
        return CUDA_ERROR_OUT_OF_MEMORY;
    ctx_stack[ctx_depth++] = c;
    return CUDA_SUCCESS;
}
FC_EXPORT(cuCtxPushCurrent_v2, PFN_cuCtxPushCurrent_v4000, fc_ctx_push);

static CUresult fc_ctx_pop(CUcontext *c) {
    FC_ENTER_INIT("cuCtxPopCurrent");
    if (ctx_depth == 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    ctx_depth--;
    if (c)
        *c = ctx_stack[ctx_depth];
    return CUDA_SUCCESS;
}
FC_EXPORT(cuCtxPopCurrent_v2, PFN_cuCtxPopCurrent_v4000, fc_ctx_pop);

static CUresult fc_ctx_device(CUdevice *d) {
    FC_ENTER("cuCtxGetDevice");
    if (!d)
        return CUDA_ERROR_INVALID_VALUE;
    *d = 0;
    return CUDA_SUCCESS;
}
FC_EXPORT(cuCtxGetDevice, PFN_cuCtxGetDevice_v2000, fc_ctx_device);

static CUresult fc_ctx_device_v2(CUdevice *d, CUcontext c) {
    FC_ENTER_INIT("cuCtxGetDevice");
    if (!d)
        return CUDA_ERROR_INVALID_VALUE;
    if (!c && fc_require_ctx() != CUDA_SUCCESS)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (c && c->magic != FC_MAGIC_CTX)
        return CUDA_ERROR_INVALID_CONTEXT;
    *d = 0;
    return CUDA_SUCCESS;
}
FC_EXPORT(cuCtxGetDevice_v2, PFN_cuCtxGetDevice_v13000, fc_ctx_device_v2);

static CUresult fc_ctx_sync(void) {
    FC_ENTER("cuCtxSynchronize");
    CUresult c = fc_capture_unsafe("cuCtxSynchronize");
    if (c != CUDA_SUCCESS)
        return c;
    return fc_sync_all();
}
FC_EXPORT(cuCtxSynchronize, PFN_cuCtxSynchronize_v2000, fc_ctx_sync);

static CUresult fc_ctx_sync_v2(CUcontext c) {
    FC_ENTER_INIT("cuCtxSynchronize");
    if (c && c->magic != FC_MAGIC_CTX)
        return CUDA_ERROR_INVALID_CONTEXT;
    CUresult u = fc_capture_unsafe("cuCtxSynchronize");
    if (u != CUDA_SUCCESS)
        return u;
    return fc_sync_all();
}
FC_EXPORT(cuCtxSynchronize_v2, PFN_cuCtxSynchronize_v13000, fc_ctx_sync_v2);

/* ---- errors
 * ---------------------------------------------------------------------------------------- */

static CUresult fc_error_name(CUresult e, const char **s) {
    FC_ENTER_ANY("cuGetErrorName");
    if (!s)
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < sizeof fc_error_names / sizeof fc_error_names[0]; i++) {
        if (fc_error_names[i].code == e) {
            *s = fc_error_names[i].name;
            return CUDA_SUCCESS;
        }
    }
    *s = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}
FC_EXPORT(cuGetErrorName, PFN_cuGetErrorName_v6000, fc_error_name);

static CUresult fc_error_string(CUresult e, const char **s) {
    FC_ENTER_ANY("cuGetErrorString");
    if (!s)
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < sizeof fc_error_names / sizeof fc_error_names[0]; i++) {
        if (fc_error_names[i].code == e) {
            /* The simulated driver's description is the name itself. */
            *s = fc_error_names[i].name;
            return CUDA_SUCCESS;
        }
    }
    *s = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}
FC_EXPORT(cuGetErrorString, PFN_cuGetErrorString_v6000, fc_error_string);

/* The runtime's private export tables cannot be simulated; say so the way a driver that lacks
 * one does. The call is counted so that tests can see a shim pass it through. */
static CUresult fc_export_table(const void **table, const CUuuid *id) {
    FC_ENTER_ANY("cuGetExportTable");
    if (!table || !id)
        return CUDA_ERROR_INVALID_VALUE;
    *table = NULL;
    return CUDA_ERROR_NOT_FOUND;
}
FC_EXPORT(cuGetExportTable, PFN_cuGetExportTable_v3000, fc_export_table);

/* ---- cuGetProcAddress
 * ------------------------------------------------------------------------------- */

#define FC_API(base, ver, ptds, sym, pfn) extern __typeof__(*(pfn)0) sym;
#include "fc_api.def"
#undef FC_API

typedef struct fc_proc {
    const char *base;
    int version;
    int ptds;
    void *fn;
} fc_proc_t;

static const fc_proc_t procs[] = {
#define FC_API(base, ver, ptds, sym, pfn) {#base, ver, ptds, (void *)&sym},
#include "fc_api.def"
#undef FC_API
};

/* Picks the row the real driver would: the newest ABI not newer than `version`, the per-thread
 * variant when the flags ask for it and one exists. */
static CUresult lookup_proc(const char *symbol, void **pfn, int version, cuuint64_t flags,
                            CUdriverProcAddressQueryResult *status) {
    const fc_proc_t *best = NULL, *best_ptds = NULL;
    int found_name = 0;
    int want_ptds = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
    if (!symbol || !pfn)
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < sizeof procs / sizeof procs[0]; i++) {
        const fc_proc_t *p = &procs[i];
        if (strcmp(p->base, symbol) != 0)
            continue;
        found_name = 1;
        if (p->version > version)
            continue;
        if (p->ptds) {
            if (!best_ptds || p->version > best_ptds->version)
                best_ptds = p;
        } else if (!best || p->version > best->version) {
            best = p;
        }
    }
    const fc_proc_t *pick = (want_ptds && best_ptds) ? best_ptds : best;
    if (!pick) {
        *pfn = NULL;
        if (status)
            *status = found_name ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
                                 : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
        return CUDA_ERROR_NOT_FOUND;
    }
    *pfn = pick->fn;
    if (status)
        *status = CU_GET_PROC_ADDRESS_SUCCESS;
    return CUDA_SUCCESS;
}

static CUresult fc_get_proc_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                               CUdriverProcAddressQueryResult *status) {
    FC_ENTER_ANY("cuGetProcAddress");
    return lookup_proc(symbol, pfn, version, flags, status);
}
FC_EXPORT(cuGetProcAddress_v2, PFN_cuGetProcAddress_v12000, fc_get_proc_v2);

static CUresult fc_get_proc(const char *symbol, void **pfn, int version, cuuint64_t flags) {
    FC_ENTER_ANY("cuGetProcAddress");
    return lookup_proc(symbol, pfn, version, flags, NULL);
}
FC_EXPORT(cuGetProcAddress, PFN_cuGetProcAddress_v11030, fc_get_proc);
