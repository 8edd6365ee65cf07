/* SPDX-License-Identifier: MIT */
/* hook_int.h: what the files of hooks share (hooks.c, copy2d.c, memop.c, tensormap.c, and the
 * library hooks library.c, blas.c, nccl.c): whether the shim manages memory, the access set's
 * start, a batch part's size, RUN_OP, the one way a hook runs an operation (op.c's sequence, or
 * the capture of a graph), and the library tables and OOC_LIB_CALL of the library hooks. */
#ifndef OOC_HOOK_INT_H
#define OOC_HOOK_INT_H

#include "shim.h"

/* Are we managing memory (mode not off, device set up)? */
static inline int managing(void) {
    return atomic_load_explicit(&ooc_mode_now, memory_order_relaxed) != OOC_MODE_OFF;
}

/* Runs `call` with the access set `a` resident on `stream`. While some stream captures (one
 * relaxed load when none does), an op on a capturing stream is captured, not run: its access set
 * goes to the capture and `call` is made as is. An op whose chunks are all resident and stable
 * is issued on the fast path, without the residency lock (fastpath.c); any other, and every op
 * while recording or replaying, takes the lock. The sequence is op.c's. */
#define RUN_OP(a, stream, ptds, call)                                                              \
    do {                                                                                           \
        if (OOC_UNLIKELY(atomic_load_explicit(&ooc_graph_captures, memory_order_relaxed))) {       \
            int cap_ = 0;                                                                          \
            CUresult c_ = ooc_graph_capture_note((a), (stream), (ptds), &cap_);                    \
            if (c_ != CUDA_SUCCESS)                                                                \
                return c_;                                                                         \
            if (cap_)                                                                              \
                return (call);                                                                     \
        }                                                                                          \
        ooc_live_op_t op_;                                                                         \
        CUresult r_ = ooc_op_begin(&op_, (a), (stream), (ptds));                                   \
        if (r_ == CUDA_SUCCESS)                                                                    \
            r_ = (call);                                                                           \
        return ooc_op_end(&op_, r_);                                                               \
    } while (0)

/* Starts the access set of a copy or set named `name`. */
static inline void op_start(ooc_access_t *a, int kind, const char *name, size_t bytes) {
    a->n = 0;
    a->overflow = 0;
    a->kind = kind;
    a->fn = NULL;
    a->name = name;
    a->bytes = bytes;
    for (int i = 0; i < 3; i++)
        a->grid[i] = a->block[i] = 0;
}

/* ---- library calls (library.c, blas.c, nccl.c) ------------------------------------------------
 */

/* A library's real functions (libtab.c): `names` lists the nhook functions we hook, then those
 * we only call; fns[i] receives names[i]'s address in the loaded library (NULL when it lacks
 * it); hooks[i] is our function for names[i]; real[i] the library's own address of hooked
 * function i (what dlsym answers, routed by pointer). */
typedef struct ooc_libtab {
    const char *soname;
    const char *const *names;
    void **fns;
    void *const *hooks;
    size_t nhook, n;
    void **real;
    pthread_mutex_t lock;
    _Atomic int loaded;
} ooc_libtab_t;

/* Fills t from the library the program has loaded (never loads it): 0, or -1 while it has none. */
int ooc_libtab_load(ooc_libtab_t *t);
/* dlsym's answer `real` for a name of t's library: our hook when it is the library's address of
 * a function we hook, else NULL. */
void *ooc_libtab_route(ooc_libtab_t *t, void *real);
/* A copy of s that lives as long as the process, the same pointer for equal strings (an op's
 * name the recorder keeps); NULL out of memory. Linear in the names interned so far. */
const char *ooc_intern(const char *s);

#define OOC_LT_FIELD(fn) __typeof__(&fn) fn;
#define OOC_LT_NAME(fn)  #fn,
#define OOC_LT_HOOK(fn)  (void *)&fn,
/* Defines `fns`, a struct of typed pointers to the real functions HOOKED then USED (X-macros),
 * and `tab`, its ooc_libtab_t for the library `soname`. The struct's members are all function
 * pointers, laid out as the array libtab.c fills. */
#define OOC_LIBTAB(tab, fns, soname, HOOKED, USED)                                                 \
    static struct { HOOKED(OOC_LT_FIELD) USED(OOC_LT_FIELD) } fns;                                 \
    static const char *const tab##_names[] = {HOOKED(OOC_LT_NAME) USED(OOC_LT_NAME)};              \
    static void *const tab##_hooks[] = {HOOKED(OOC_LT_HOOK)};                                      \
    static void *tab##_real[sizeof tab##_hooks / sizeof tab##_hooks[0]];                           \
    _Static_assert(sizeof fns == sizeof tab##_names / sizeof tab##_names[0] * sizeof(void *),      \
                   "function pointers are pointer-sized");                                         \
    static ooc_libtab_t tab = {soname,                                                             \
                               tab##_names,                                                        \
                               (void **)&fns,                                                      \
                               tab##_hooks,                                                        \
                               sizeof tab##_hooks / sizeof tab##_hooks[0],                         \
                               sizeof tab##_names / sizeof tab##_names[0],                         \
                               tab##_real,                                                         \
                               PTHREAD_MUTEX_INITIALIZER,                                          \
                               0}

/* Returns missing("fn") from the hook unless the loaded library (table `tab`, functions `fns`)
 * has fn: the library is looked for at the first call, and a library without the function is
 * an error, never a call through NULL. */
#define OOC_LIB_NEED(fns, tab, fn, missing)                                                        \
    do {                                                                                           \
        if (!fns.fn && (ooc_libtab_load(&tab) != 0 || !fns.fn))                                    \
            return missing(#fn);                                                                   \
    } while (0)

/* The end of a library hook whose operands `a` notes: runs `call` (the real function, returning
 * `stype`, `ok` on success) as one operation on stream s (ooc_lib_enter); a failure to make the
 * operands resident returns fail(the CUresult), in the library's words. */
#define OOC_LIB_CALL(stype, ok, fail, a, s, call)                                                  \
    do {                                                                                           \
        ooc_live_op_t op_;                                                                         \
        CUresult e_;                                                                               \
        switch (ooc_lib_enter(&op_, (a), (s), &e_)) {                                              \
        case OOC_LIB_AS_IS:                                                                        \
            return (call);                                                                         \
        case OOC_LIB_FAIL:                                                                         \
            return fail(e_);                                                                       \
        default:                                                                                   \
            break;                                                                                 \
        }                                                                                          \
        stype st_ = (call);                                                                        \
        ooc_lib_done(&op_, st_ == (ok));                                                           \
        return st_;                                                                                \
    } while (0)

/* Returns from the hook with `call`'s result unless it is CUDA_SUCCESS. */
#define ACCESS_OR_RETURN(call)                                                                     \
    do {                                                                                           \
        CUresult ar_ = (call);                                                                     \
        if (ar_ != CUDA_SUCCESS)                                                                   \
            return ar_;                                                                            \
    } while (0)

/* Chunks that the buffers of ours [p, p + n) overlaps need resident: an upper bound, used to cut
 * a wide batch into parts that fit the budget. Takes the residency lock per buffer looked up. */
static inline uint64_t range_chunks(uintptr_t p, size_t n, uint64_t chunk) {
    uint64_t c = 0;
    uintptr_t end = p + (n ? n : 1), base;
    size_t size;
    while (p < end && ooc_mem_owns(p) && ooc_mem_lookup(p, &base, &size) == 0) {
        c += (size + chunk - 1) / chunk + 1; /* + 1: a small buffer need not start a chunk */
        p = base + size;
    }
    return c;
}

/* The access set of a 3D copy (copy2d.c): each device side of ours, range-checked. */
CUresult ooc_copy3d_access(ooc_access_t *a, const char *name, const CUDA_MEMCPY3D *p);
/* The access set of a memset of h rows of w elements of `elem` bytes, `pitch` bytes apart
 * (hooks.c); CUDA_ERROR_INVALID_VALUE when the range is not in one live buffer. */
CUresult ooc_set_access(ooc_access_t *a, const char *name, CUdeviceptr d, size_t pitch, size_t w,
                        size_t h, size_t elem);

#endif
