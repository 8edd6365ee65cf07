/* SPDX-License-Identifier: MIT */
/* real.c: the only door to the real driver: it loads libcuda.so.1, fills the table of real
 * functions, and routes every way a program can reach a driver function to our hooks.
 *
 * Routing is by pointer, never by name: dlsym and cuGetProcAddress ask the real resolver first
 * and replace the answer only when it is the real address of a function we hook (a table built
 * once from hooks.def's exact versioned names). So versions, per-thread-stream variants and
 * everything we do not hook stay exactly as the driver meant.
 *
 * dlsym is overridden; the real one is bootstrapped with dlvsym (glibc 2.34's version first).
 * A lookup with RTLD_NEXT must resolve relative to its caller, so on x86-64 our dlsym is an
 * assembly stub that jumps straight into the real dlsym for RTLD_NEXT, return address intact.
 * Nothing here runs in a constructor; the table is built on the first lookup (pthread_once). */
#include "shim.h"

#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

ooc_real_t ooc_real;

typedef void *(*dlsym_fn)(void *, const char *);
OOC_INTERNAL dlsym_fn ooc__real_dlsym;

typedef struct route {
    void *real;
    void *hook;
} route_t;

static route_t routes[] = {
#define HOOK(base, ver, ptds, sym, pfn) {NULL, (void *)&ooc_hook_##sym},
#include "hooks.def"
#undef HOOK
};
static const char *const route_names[] = {
#define HOOK(base, ver, ptds, sym, pfn) #sym,
#include "hooks.def"
#undef HOOK
};
#define NROUTES (sizeof routes / sizeof routes[0])

static void *libcuda;
static int load_rc = OOC_ENOENT;
static pthread_once_t load_once = PTHREAD_ONCE_INIT;

/* Runs before a sanitizer runtime has initialised (its start-up asks dlsym for the functions it
 * wraps), so nothing on this path may be instrumented. */
#define OOC_NO_SANITIZE __attribute__((no_sanitize("address", "undefined", "thread")))

OOC_NO_SANITIZE static void bootstrap_dlsym(void) {
    if (ooc__real_dlsym)
        return;
    dlsym_fn f = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
    if (!f)
        f = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
    __atomic_store_n(&ooc__real_dlsym, f, __ATOMIC_RELEASE);
}

static void load(void) {
    ooc_config_init();
    bootstrap_dlsym();
    libcuda = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
    if (!libcuda)
        libcuda = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_GLOBAL);
    if (!libcuda || !ooc__real_dlsym) {
        OOC_LOG_E("cannot open libcuda.so.1 (%s): every driver call will fail",
                  libcuda ? "no dlsym" : dlerror());
        return;
    }
    size_t i = 0;
#define HOOK(base, ver, ptds, sym, pfn)                                                            \
    ooc_real.sym = (pfn)ooc__real_dlsym(libcuda, #sym);                                            \
    routes[i++].real = (void *)ooc_real.sym;
#include "hooks.def"
#undef HOOK
#define OOC_REAL_LOAD(sym, pfn) ooc_real.sym = (pfn)ooc__real_dlsym(libcuda, #sym);
    OOC_REAL_EXTRA(OOC_REAL_LOAD)
#undef OOC_REAL_LOAD
    load_rc = 0;
}

int ooc_real_load(void) {
    pthread_once(&load_once, load);
    return load_rc;
}

const char *ooc_real_errname(CUresult r) {
    const char *s = NULL;
    if (ooc_real.cuGetErrorName && ooc_real.cuGetErrorName(r, &s) == CUDA_SUCCESS && s)
        return s;
    return "CUDA_ERROR_UNKNOWN";
}

/* Our hook for a real driver address, or NULL when we do not hook it. */
static void *route(void *real) {
    if (!real)
        return NULL;
    for (size_t i = 0; i < NROUTES; i++)
        if (routes[i].real == real)
            return routes[i].hook;
    return NULL;
}

/* The libraries' routers, by name prefix (library.c, blas.c and nccl.c register theirs when the
 * shim is loaded): real.c stays below the hooks. */
typedef void *(*lib_router_fn)(void *, const char *);
#define MAX_ROUTERS 4
static struct {
    const char *prefix;
    size_t len;
    _Atomic(lib_router_fn) fn;
} routers[MAX_ROUTERS];
static _Atomic int nrouters;

void ooc_real_route_library(const char *prefix, void *(*router)(void *real, const char *name)) {
    int i = atomic_load(&nrouters);
    if (i >= MAX_ROUTERS)
        return;
    routers[i].prefix = prefix;
    routers[i].len = strlen(prefix);
    atomic_store_explicit(&routers[i].fn, router, memory_order_release);
    atomic_store(&nrouters, i + 1);
}

static void *lib_route(void *real, const char *name) {
    int n = atomic_load_explicit(&nrouters, memory_order_acquire);
    for (int i = 0; i < n; i++) {
        lib_router_fn f = atomic_load_explicit(&routers[i].fn, memory_order_acquire);
        if (f && strncmp(name, routers[i].prefix, routers[i].len) == 0)
            return f(real, name);
    }
    return NULL;
}

void *ooc_real_sym(void *handle, const char *name) {
    bootstrap_dlsym();
    return ooc__real_dlsym ? ooc__real_dlsym(handle, name) : NULL;
}

/* ---- dlsym ----------------------------------------------------------------------------------- */

/* The C half of dlsym: every handle but RTLD_NEXT (which the stub sends to the real dlsym). */
OOC_INTERNAL void *ooc__dlsym_hook(void *handle, const char *name);
OOC_NO_SANITIZE void *ooc__dlsym_hook(void *handle, const char *name) {
    bootstrap_dlsym();
    if (!ooc__real_dlsym)
        return NULL;
    void *r = ooc__real_dlsym(handle, name);
    /* Only names of the driver, cuDNN, cuBLAS and NCCL can be ours; the string test keeps the
     * table build (which opens libcuda) away from every other library's lookups. */
    if (!r || !name || handle == RTLD_NEXT)
        return r;
    if (name[0] == 'n' && name[1] == 'c') { /* nccl... */
        void *lh = lib_route(r, name);
        return lh ? lh : r;
    }
    if (name[0] != 'c' || name[1] != 'u')
        return r;
    /* A lower-case third letter is a library's name (cudnn..., cublas...), never the driver's. */
    if (name[2] >= 'a' && name[2] <= 'z') {
        void *lh = lib_route(r, name);
        return lh ? lh : r;
    }
    if (ooc_real_load() != 0)
        return r;
    void *h = route(r);
    return h ? h : r;
}

#if defined(__x86_64__)
/* RTLD_NEXT is (void *)-1: jump to the real dlsym with the caller's return address intact. */
__asm__(".text\n"
        ".globl dlsym\n"
        ".type dlsym,@function\n"
        "dlsym:\n"
        "    cmpq $-1, %rdi\n"
        "    jne 1f\n"
        "    movq ooc__real_dlsym(%rip), %rax\n"
        "    testq %rax, %rax\n"
        "    je 1f\n"
        "    jmp *%rax\n"
        "1:  jmp ooc__dlsym_hook\n"
        ".size dlsym, .-dlsym\n");
#else
OOC_EXPORT void *dlsym(void *handle, const char *name) {
    return ooc__dlsym_hook(handle, name);
}
#endif

/* ---- cuGetProcAddress ------------------------------------------------------------------------ */

CUresult ooc_hook_cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                                      CUdriverProcAddressQueryResult *status) {
    if (ooc_real_load() != 0 || !ooc_real.cuGetProcAddress_v2)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult r = ooc_real.cuGetProcAddress_v2(symbol, pfn, version, flags, status);
    if (r == CUDA_SUCCESS && pfn) {
        void *h = route(*pfn);
        if (h)
            *pfn = h;
    }
    return r;
}

CUresult ooc_hook_cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags) {
    if (ooc_real_load() != 0 || !ooc_real.cuGetProcAddress)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult r = ooc_real.cuGetProcAddress(symbol, pfn, version, flags);
    if (r == CUDA_SUCCESS && pfn) {
        void *h = route(*pfn);
        if (h)
            *pfn = h;
    }
    return r;
}

OOC_EXPORT_HOOK(cuGetProcAddress_v2, PFN_cuGetProcAddress_v12000);
OOC_EXPORT_HOOK(cuGetProcAddress, PFN_cuGetProcAddress_v11030);

/* The name of a hooked symbol, for tests and logs; NULL past the end. */
const char *ooc_real_hook_name(size_t i);
const char *ooc_real_hook_name(size_t i) {
    return i < NROUTES ? route_names[i] : NULL;
}
