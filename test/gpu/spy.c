/* SPDX-License-Identifier: MIT */
/* spy.c: libgpuspy.so, a diagnostic LD_PRELOAD library for scripts/gpu-first-contact (probes
 * paraminfo and tensormap). It is not the shim and changes nothing a program does: it watches
 * the kernel launches, tensor-map encodes and allocations that reach the real driver, and writes
 * what it learns about each to GPUSPY_OUT (a file, appended; default stderr):
 *
 *   SPY handle H phase P via V kind K funcinfo A kernelinfo B getfunction C loaded L name N
 *       once per distinct launched handle: which kind of handle arrived (K: "function" when
 *       cuFuncGetName answers for it, "kernel" when cuKernelGetName does, "both", "neither"),
 *       and how each parameter-layout lookup answered (a count of parameters, or the error's
 *       name): cuFuncGetParamInfo on the handle (A), cuKernelGetParamInfo on it (B), and
 *       cuFuncGetParamInfo on the function cuKernelGetFunction gives for it (C);
 *   SPY encode ADDR rank R plain-word W shifted-word S
 *       per cuTensorMapEncodeTiled: the index of the 8-byte word of the 128-byte descriptor that
 *       holds the address as it is (W), or shifted right by 4 (S), or "none";
 *   SPY block handle H param I offset O size Z match M words-into-allocations C
 *       per parameter of 128 bytes at a 64-aligned offset (a CUtensorMap passed by value) in a
 *       launch whose layout is known: whether its bytes equal a descriptor encoded earlier
 *       ("encode#k of ADDR", or "none") and how many of its 8-byte words point into device
 *       memory the program allocated (cuMemAlloc_v2);
 *   SPY-SUMMARY phase P handles N function F kernel K both B neither X funcinfo-answered A
 *       kernelinfo-answered C any-answered Y launches L encodes E blocks D blocks-matching M
 *       at exit, one per phase.
 *
 * A program names its phases with gpuspy_phase("name") (found with dlsym(RTLD_DEFAULT), or
 * ctypes), so that each handle's line says which library launched it.
 *
 * Interposition: dlsym is overridden (an x86-64 stub sends RTLD_NEXT lookups straight to the
 * real dlsym so they resolve relative to their caller); lookups on the libcuda handle and
 * cuGetProcAddress answers for cuGetProcAddress, cuLaunchKernel(Ex) in both stream flavours,
 * cuTensorMapEncodeTiled and cuMemAlloc are replaced by the spy's. Matching is by exact name and
 * ABI version (a diagnostic may; the shim routes by pointer), and each distinct real pointer
 * gets its own slot, so a per-thread-stream variant keeps its own real function.
 *
 * Locking: one mutex around the tables; launches from several threads are serialised while the
 * spy notes them (it is a diagnostic, not a fast path). A crash inside a lookup is reported with
 * the step it happened in before the signal is re-raised. */
#include <cuda.h>
#include <cudaTypedefs.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SPY_EXPORT __attribute__((visibility("default")))
#define SPY_HIDDEN __attribute__((visibility("hidden")))

typedef void *(*dlsym_fn)(void *, const char *);
SPY_HIDDEN dlsym_fn spy_real_dlsym;
SPY_HIDDEN void *spy_dlsym_c(void *handle, const char *name);

static struct {
    PFN_cuGetErrorName_v6000 get_error_name;
    PFN_cuFuncGetParamInfo_v12040 func_param_info;
    PFN_cuKernelGetParamInfo_v12040 kernel_param_info;
    PFN_cuFuncGetName_v12030 func_name;
    PFN_cuKernelGetName_v12030 kernel_name;
    PFN_cuKernelGetFunction_v12000 kernel_function;
    PFN_cuFuncIsLoaded_v12040 func_is_loaded;
} real;

static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int out_fd = 2;
static volatile const char *step = "";
static volatile void *step_handle;

/* ---- output -----------------------------------------------------------------------------------
 */

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...) {
    char buf[2048];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf - 1, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n > sizeof buf - 2)
        n = (int)sizeof buf - 2;
    buf[n++] = '\n';
    ssize_t w = write(out_fd, buf, (size_t)n);
    (void)w;
}

static const char *err_name(CUresult r) {
    const char *s = NULL;
    if (real.get_error_name && real.get_error_name(r, &s) == CUDA_SUCCESS && s)
        return s;
    return "CUDA_ERROR_?";
}

static void on_crash(int sig) {
    char buf[256];
    int n = snprintf(buf, sizeof buf, "SPY crashed (signal %d) in %s on handle %p\n", sig,
                     (const char *)step, (void *)step_handle);
    if (n > 0) {
        ssize_t w = write(out_fd, buf, (size_t)n < sizeof buf ? (size_t)n : sizeof buf);
        (void)w;
    }
    signal(sig, SIG_DFL);
    raise(sig);
}

/* ---- phases and per-phase counts --------------------------------------------------------------
 */

enum { MAX_PHASES = 32 };
typedef struct phase {
    char name[64];
    unsigned handles, function, kernel, both, neither, funcinfo, kernelinfo, any;
    unsigned long launches, encodes, blocks, blocks_matching;
} phase_t;
static phase_t phases[MAX_PHASES];
static unsigned nphases = 1, cur_phase; /* phase 0: "start" */

/* Names the phase the following launches belong to. Thread-safe. */
SPY_EXPORT void gpuspy_phase(const char *name);
void gpuspy_phase(const char *name) {
    pthread_mutex_lock(&lock);
    unsigned k;
    for (k = 0; k < nphases; k++)
        if (strcmp(phases[k].name, name) == 0)
            break;
    if (k == nphases && nphases < MAX_PHASES)
        snprintf(phases[nphases++].name, sizeof phases[0].name, "%s", name);
    if (k < nphases)
        cur_phase = k;
    pthread_mutex_unlock(&lock);
}

/* ---- allocations and encodes ------------------------------------------------------------------
 */

enum { MAX_ALLOCS = 1 << 16, MAX_ENCODES = 4096, MAX_HANDLES = 1 << 14 };
static struct {
    uintptr_t base;
    size_t bytes;
} allocs[MAX_ALLOCS];
static unsigned nallocs;
static struct {
    uintptr_t addr;
    uint64_t words[16];
} encodes[MAX_ENCODES];
static unsigned nencodes;

static int into_alloc(uint64_t w) {
    for (unsigned k = 0; k < nallocs; k++)
        if (w >= allocs[k].base && w - allocs[k].base < allocs[k].bytes)
            return 1;
    return 0;
}

/* ---- the handles ------------------------------------------------------------------------------
 */

static void *seen[MAX_HANDLES];
static unsigned nseen;
static unsigned long unrecorded;

static int seen_before(void *h) {
    for (unsigned k = 0; k < nseen; k++)
        if (seen[k] == h)
            return 1;
    if (nseen < MAX_HANDLES)
        seen[nseen++] = h;
    else
        unrecorded++;
    return 0;
}

/* The parameter count a layout lookup gives (asked until CUDA_ERROR_INVALID_VALUE) into buf,
 * or the error's name; the layout itself into off/size when they are given. */
static int count_params(CUresult (*ask)(void *, size_t, size_t *, size_t *), void *h,
                        const char *what, char *buf, size_t len, size_t *off, size_t *size,
                        unsigned max) {
    step = what;
    step_handle = h;
    for (unsigned i = 0; i < 4096; i++) {
        size_t o = 0, s = 0;
        CUresult r = ask(h, i, &o, &s);
        if (r == CUDA_ERROR_INVALID_VALUE) {
            snprintf(buf, len, "%u", i);
            return (int)i;
        }
        if (r != CUDA_SUCCESS) {
            snprintf(buf, len, "%s%s", err_name(r), i ? "@" : "");
            if (i)
                snprintf(buf + strlen(buf), len - strlen(buf), "%u", i);
            return -1;
        }
        if (off && i < max) {
            off[i] = o;
            size[i] = s;
        }
    }
    snprintf(buf, len, "4096+");
    return -1;
}

static CUresult ask_func(void *h, size_t i, size_t *o, size_t *s) {
    return real.func_param_info((CUfunction)h, i, o, s);
}
static CUresult ask_kernel(void *h, size_t i, size_t *o, size_t *s) {
    return real.kernel_param_info((CUkernel)h, i, o, s);
}

enum { MAX_PARAMS = 512 };

/* Notes a launch of h with its parameters. Called with the lock held. */
static void note_launch(CUfunction h, void **params, void **extra, const char *via) {
    phase_t *ph = &phases[cur_phase];
    ph->launches++;
    if (seen_before(h))
        return;
    ph->handles++;
    size_t off[MAX_PARAMS], size[MAX_PARAMS];
    char fi[64] = "absent", ki[64] = "absent", gf[80] = "absent", ld[32] = "absent";
    int nf = -1, nk = -1;
    if (real.func_param_info)
        nf = count_params(ask_func, h, "cuFuncGetParamInfo", fi, sizeof fi, off, size, MAX_PARAMS);
    if (real.kernel_param_info)
        nk = count_params(ask_kernel, h, "cuKernelGetParamInfo", ki, sizeof ki, nf < 0 ? off : NULL,
                          nf < 0 ? size : NULL, MAX_PARAMS);
    if (real.kernel_function) {
        CUfunction f2 = NULL;
        step = "cuKernelGetFunction";
        CUresult r = real.kernel_function(&f2, (CUkernel)h);
        if (r != CUDA_SUCCESS) {
            snprintf(gf, sizeof gf, "%s", err_name(r));
        } else if (real.func_param_info) {
            char c[64];
            int n2 = count_params(ask_func, f2, "cuFuncGetParamInfo(cuKernelGetFunction)", c,
                                  sizeof c, nf < 0 && nk < 0 ? off : NULL,
                                  nf < 0 && nk < 0 ? size : NULL, MAX_PARAMS);
            snprintf(gf, sizeof gf, "%s%s", c, f2 == h ? "(same)" : "");
            if (nf < 0 && nk < 0)
                nf = n2;
        }
    }
    if (real.func_is_loaded) {
        CUfunctionLoadingState st;
        step = "cuFuncIsLoaded";
        CUresult r = real.func_is_loaded(&st, h);
        snprintf(ld, sizeof ld, "%s",
                 r != CUDA_SUCCESS                        ? err_name(r)
                 : st == CU_FUNCTION_LOADING_STATE_LOADED ? "1"
                                                          : "0");
    }
    const char *fname = NULL, *kname = NULL;
    step = "cuFuncGetName";
    int is_f = real.func_name && real.func_name(&fname, h) == CUDA_SUCCESS && fname;
    step = "cuKernelGetName";
    int is_k = real.kernel_name && real.kernel_name(&kname, (CUkernel)h) == CUDA_SUCCESS && kname;
    step = "";
    const char *kind = is_f && is_k ? "both" : is_k ? "kernel" : is_f ? "function" : "neither";
    ph->function += is_f && !is_k;
    ph->kernel += is_k && !is_f;
    ph->both += is_f && is_k;
    ph->neither += !is_f && !is_k;
    ph->funcinfo += fi[0] >= '0' && fi[0] <= '9';
    ph->kernelinfo += ki[0] >= '0' && ki[0] <= '9';
    int any = nf >= 0 || nk >= 0;
    ph->any += any;
    const char *name = is_f ? fname : is_k ? kname : "?";
    say("SPY handle %p phase %s via %s kind %s funcinfo %s kernelinfo %s getfunction %s loaded %s "
        "params %s name %.300s",
        (void *)h, ph->name, via, kind, fi, ki, gf, ld,
        extra    ? "extra"
        : params ? "array"
                 : "none",
        name);
    if (!any || !params || extra)
        return;
    unsigned n = (unsigned)(nf >= 0 ? nf : nk);
    for (unsigned i = 0; i < n && i < MAX_PARAMS; i++) {
        if (size[i] != 128 || off[i] % 64 || !params[i])
            continue;
        uint64_t w[16];
        memcpy(w, params[i], sizeof w);
        ph->blocks++;
        int match = -1;
        for (unsigned k = 0; k < nencodes && match < 0; k++)
            if (memcmp(w, encodes[k].words, sizeof w) == 0)
                match = (int)k;
        unsigned into = 0;
        for (unsigned k = 0; k < 16; k++)
            into += into_alloc(w[k]);
        char m[64] = "none";
        if (match >= 0) {
            ph->blocks_matching++;
            snprintf(m, sizeof m, "encode#%d-of-0x%llx", match,
                     (unsigned long long)encodes[match].addr);
        }
        say("SPY block handle %p param %u offset %zu size %zu match %s words-into-allocations %u",
            (void *)h, i, off[i], size[i], m, into);
    }
}

/* ---- the hooks and their slots ----------------------------------------------------------------
 */

enum { K_GPA1, K_GPA2, K_LAUNCH, K_LAUNCH_EX, K_ENCODE, K_ALLOC, NKINDS };
enum { SLOTS = 4 };
static void *slot_real[NKINDS][SLOTS];

#define REAL(kind, k, pfn) ((pfn)slot_real[kind][k])

static void *route(int kind, void *p);

#define GPA1_HOOK(k)                                                                               \
    static CUresult gpa1_##k(const char *sym, void **pfn, int ver, cuuint64_t flags) {             \
        CUresult r = REAL(K_GPA1, k, PFN_cuGetProcAddress_v11030)(sym, pfn, ver, flags);           \
        if (r == CUDA_SUCCESS && pfn && *pfn)                                                      \
            *pfn = route_proc(sym, ver, *pfn);                                                     \
        return r;                                                                                  \
    }
#define GPA2_HOOK(k)                                                                               \
    static CUresult gpa2_##k(const char *sym, void **pfn, int ver, cuuint64_t flags,               \
                             CUdriverProcAddressQueryResult *st) {                                 \
        CUresult r = REAL(K_GPA2, k, PFN_cuGetProcAddress_v12000)(sym, pfn, ver, flags, st);       \
        if (r == CUDA_SUCCESS && pfn && *pfn)                                                      \
            *pfn = route_proc(sym, ver, *pfn);                                                     \
        return r;                                                                                  \
    }
#define LAUNCH_HOOK(k)                                                                             \
    static CUresult launch_##k(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,   \
                               unsigned by, unsigned bz, unsigned shmem, CUstream s,               \
                               void **params, void **extra) {                                      \
        pthread_mutex_lock(&lock);                                                                 \
        note_launch(f, params, extra, "cuLaunchKernel");                                           \
        pthread_mutex_unlock(&lock);                                                               \
        return REAL(K_LAUNCH, k, PFN_cuLaunchKernel_v4000)(f, gx, gy, gz, bx, by, bz, shmem, s,    \
                                                           params, extra);                         \
    }
#define LAUNCH_EX_HOOK(k)                                                                          \
    static CUresult launch_ex_##k(const CUlaunchConfig *c, CUfunction f, void **params,            \
                                  void **extra) {                                                  \
        pthread_mutex_lock(&lock);                                                                 \
        note_launch(f, params, extra, "cuLaunchKernelEx");                                         \
        pthread_mutex_unlock(&lock);                                                               \
        return REAL(K_LAUNCH_EX, k, PFN_cuLaunchKernelEx_v11060)(c, f, params, extra);             \
    }
#define ENCODE_HOOK(k)                                                                             \
    static CUresult encode_##k(CUtensorMap *m, CUtensorMapDataType t, cuuint32_t rank, void *a,    \
                               const cuuint64_t *dim, const cuuint64_t *strides,                   \
                               const cuuint32_t *box, const cuuint32_t *es,                        \
                               CUtensorMapInterleave il, CUtensorMapSwizzle sw,                    \
                               CUtensorMapL2promotion l2, CUtensorMapFloatOOBfill oob) {           \
        CUresult r = REAL(K_ENCODE, k, PFN_cuTensorMapEncodeTiled_v12000)(                         \
            m, t, rank, a, dim, strides, box, es, il, sw, l2, oob);                                \
        if (r == CUDA_SUCCESS)                                                                     \
            note_encode(m, a, rank);                                                               \
        return r;                                                                                  \
    }
#define ALLOC_HOOK(k)                                                                              \
    static CUresult alloc_##k(CUdeviceptr *p, size_t bytes) {                                      \
        CUresult r = REAL(K_ALLOC, k, PFN_cuMemAlloc_v3020)(p, bytes);                             \
        if (r == CUDA_SUCCESS)                                                                     \
            note_alloc(*p, bytes);                                                                 \
        return r;                                                                                  \
    }

static void *route_proc(const char *sym, int ver, void *p);

static void note_encode(const CUtensorMap *m, void *a, unsigned rank) {
    uint64_t w[16];
    memcpy(w, m, sizeof w);
    int plain = -1, shifted = -1;
    for (int k = 0; k < 16; k++) {
        if (plain < 0 && w[k] == (uint64_t)(uintptr_t)a)
            plain = k;
        if (shifted < 0 && w[k] == (uint64_t)(uintptr_t)a >> 4)
            shifted = k;
    }
    pthread_mutex_lock(&lock);
    phases[cur_phase].encodes++;
    if (nencodes < MAX_ENCODES) {
        encodes[nencodes].addr = (uintptr_t)a;
        memcpy(encodes[nencodes].words, w, sizeof w);
        nencodes++;
    }
    pthread_mutex_unlock(&lock);
    char ps[16] = "none", ss[16] = "none";
    if (plain >= 0)
        snprintf(ps, sizeof ps, "%d", plain);
    if (shifted >= 0)
        snprintf(ss, sizeof ss, "%d", shifted);
    say("SPY encode %p rank %u plain-word %s shifted-word %s phase %s", a, rank, ps, ss,
        phases[cur_phase].name);
}

static void note_alloc(CUdeviceptr p, size_t bytes) {
    pthread_mutex_lock(&lock);
    if (nallocs < MAX_ALLOCS) {
        allocs[nallocs].base = (uintptr_t)p;
        allocs[nallocs].bytes = bytes;
        nallocs++;
    }
    pthread_mutex_unlock(&lock);
}

#define SLOTS_OF(H) H(0) H(1) H(2) H(3)
SLOTS_OF(GPA1_HOOK)
SLOTS_OF(GPA2_HOOK)
SLOTS_OF(LAUNCH_HOOK)
SLOTS_OF(LAUNCH_EX_HOOK)
SLOTS_OF(ENCODE_HOOK)
SLOTS_OF(ALLOC_HOOK)

static void *hook_of(int kind, int k) {
    switch (kind) {
#define CASES(prefix, K)                                                                           \
    case K: {                                                                                      \
        void *h[SLOTS] = {(void *)prefix##0, (void *)prefix##1, (void *)prefix##2,                 \
                          (void *)prefix##3};                                                      \
        return h[k];                                                                               \
    }
        CASES(gpa1_, K_GPA1)
        CASES(gpa2_, K_GPA2)
        CASES(launch_, K_LAUNCH)
        CASES(launch_ex_, K_LAUNCH_EX)
        CASES(encode_, K_ENCODE)
        CASES(alloc_, K_ALLOC)
#undef CASES
    }
    return NULL;
}

/* Our hook for the real function p of this kind: the slot that already holds p, else the first
 * free one; p itself when every slot is taken (that function is then not watched). */
static void *route(int kind, void *p) {
    for (int k = 0; k < SLOTS; k++) {
        void *cur = __atomic_load_n(&slot_real[kind][k], __ATOMIC_ACQUIRE);
        if (cur == p)
            return hook_of(kind, k);
        if (!cur && __atomic_compare_exchange_n(&slot_real[kind][k], &cur, p, 0, __ATOMIC_ACQ_REL,
                                                __ATOMIC_ACQUIRE))
            return hook_of(kind, k);
        if (cur == p)
            return hook_of(kind, k);
    }
    return p;
}

/* The kind of a cuGetProcAddress request (base name and ABI version), or -1. */
static int kind_of_proc(const char *sym, int ver) {
    if (strcmp(sym, "cuGetProcAddress") == 0)
        return ver >= 12000 ? K_GPA2 : K_GPA1;
    if (strcmp(sym, "cuLaunchKernel") == 0)
        return K_LAUNCH;
    if (strcmp(sym, "cuLaunchKernelEx") == 0 && ver >= 11060)
        return K_LAUNCH_EX;
    if (strcmp(sym, "cuTensorMapEncodeTiled") == 0 && ver >= 12000)
        return K_ENCODE;
    if (strcmp(sym, "cuMemAlloc") == 0 && ver >= 3020)
        return K_ALLOC;
    return -1;
}

/* The kind of an exact exported name (a dlsym on the libcuda handle), or -1. */
static int kind_of_symbol(const char *name) {
    static const struct {
        const char *name;
        int kind;
    } t[] = {{"cuGetProcAddress", K_GPA1},         {"cuGetProcAddress_v2", K_GPA2},
             {"cuLaunchKernel", K_LAUNCH},         {"cuLaunchKernel_ptsz", K_LAUNCH},
             {"cuLaunchKernelEx", K_LAUNCH_EX},    {"cuLaunchKernelEx_ptsz", K_LAUNCH_EX},
             {"cuTensorMapEncodeTiled", K_ENCODE}, {"cuMemAlloc_v2", K_ALLOC}};
    for (size_t k = 0; k < sizeof t / sizeof t[0]; k++)
        if (strcmp(name, t[k].name) == 0)
            return t[k].kind;
    return -1;
}

static void *route_proc(const char *sym, int ver, void *p) {
    int kind = sym ? kind_of_proc(sym, ver) : -1;
    return kind < 0 ? p : route(kind, p);
}

/* ---- start-up, dlsym, exit --------------------------------------------------------------------
 */

static void bootstrap(void) {
    if (__atomic_load_n(&spy_real_dlsym, __ATOMIC_ACQUIRE))
        return;
    dlsym_fn f = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
    if (!f)
        f = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
    __atomic_store_n(&spy_real_dlsym, f, __ATOMIC_RELEASE);
}

/* Resolves the lookups once libcuda is loaded (never loads it itself). */
static void load_lookups(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (!h)
        return;
#define LOAD(field, sym) *(void **)&real.field = spy_real_dlsym(h, sym)
    LOAD(get_error_name, "cuGetErrorName");
    LOAD(func_param_info, "cuFuncGetParamInfo");
    LOAD(kernel_param_info, "cuKernelGetParamInfo");
    LOAD(func_name, "cuFuncGetName");
    LOAD(kernel_name, "cuKernelGetName");
    LOAD(kernel_function, "cuKernelGetFunction");
    LOAD(func_is_loaded, "cuFuncIsLoaded");
#undef LOAD
    say("SPY lookups: cuFuncGetParamInfo %s cuKernelGetParamInfo %s cuKernelGetFunction %s",
        real.func_param_info ? "present" : "absent", real.kernel_param_info ? "present" : "absent",
        real.kernel_function ? "present" : "absent");
}

void *spy_dlsym_c(void *handle, const char *name) {
    bootstrap();
    if (!spy_real_dlsym)
        return NULL;
    void *r = spy_real_dlsym(handle, name);
    if (!r || !name || name[0] != 'c' || name[1] != 'u')
        return r;
    int kind = kind_of_symbol(name);
    if (kind < 0)
        return r;
    pthread_once(&init_once, load_lookups);
    return route(kind, r);
}

/* RTLD_NEXT is (void *)-1: jump to the real dlsym with the caller's return address intact. */
__asm__(".text\n"
        ".globl dlsym\n"
        ".type dlsym,@function\n"
        "dlsym:\n"
        "    cmpq $-1, %rdi\n"
        "    jne 1f\n"
        "    movq spy_real_dlsym(%rip), %rax\n"
        "    testq %rax, %rax\n"
        "    je 1f\n"
        "    jmp *%rax\n"
        "1:  jmp spy_dlsym_c\n"
        ".size dlsym, .-dlsym\n");

__attribute__((constructor)) static void spy_start(void) {
    bootstrap();
    snprintf(phases[0].name, sizeof phases[0].name, "start");
    const char *p = getenv("GPUSPY_OUT");
    if (p && *p) {
        int fd = open(p, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        if (fd >= 0)
            out_fd = fd;
    }
    signal(SIGSEGV, on_crash);
    signal(SIGBUS, on_crash);
    say("SPY start pid %ld", (long)getpid());
}

__attribute__((destructor)) static void spy_end(void) {
    pthread_mutex_lock(&lock);
    for (unsigned k = 0; k < nphases; k++) {
        const phase_t *p = &phases[k];
        if (!p->launches && !p->encodes && k == 0)
            continue;
        say("SPY-SUMMARY phase %s handles %u function %u kernel %u both %u neither %u "
            "funcinfo-answered %u kernelinfo-answered %u any-answered %u launches %lu encodes %lu "
            "blocks %lu blocks-matching %lu",
            p->name, p->handles, p->function, p->kernel, p->both, p->neither, p->funcinfo,
            p->kernelinfo, p->any, p->launches, p->encodes, p->blocks, p->blocks_matching);
    }
    if (unrecorded)
        say("SPY handles beyond the table (not examined): %lu", unrecorded);
    pthread_mutex_unlock(&lock);
}
