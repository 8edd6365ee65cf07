/* SPDX-License-Identifier: MIT */
/* fnname.c: kernel names: the name of each CUfunction, asked of the driver once and kept until
 * its module is unloaded (the recorder names kernel ops by it; replay and verification compare it
 * and log it). A name returned stays valid for the life of the process: at an unload
 * (ooc_fnname_forget) the names move to a list of old ones, since recorded ops may still point to
 * them, and the driver is asked again (a function's handle value may come back as another).
 *
 * Thread-safe: fn_lock guards the cache and is taken last (after the residency, replay and
 * recorder locks). Calls only the real driver. Callers: record.c, replay.c, recompute.c. */
#include "shim.h"

#include <stdlib.h>
#include <string.h>

static int fn_oom;
#define uthash_nonfatal_oom(obj) (fn_oom = 1)
#include <uthash.h>

typedef struct fname {
    CUfunction f;
    char *name;
    struct fname *older; /* on old_fnames once its function's module was unloaded */
    UT_hash_handle hh;
} fname_t;

static pthread_mutex_t fn_lock = PTHREAD_MUTEX_INITIALIZER;
static fname_t *fnames;
static fname_t *old_fnames; /* names of unloaded functions: still pointed to */

/* f's name from the driver, or NULL. The handle may be a CUkernel cast to CUfunction, as the
 * CUDA runtime launches them (every handle PyTorch launched on an H100 and an H200 was one):
 * cuFuncGetName refuses those, cuKernelGetName answers; a lazily loaded function is loaded and
 * asked again. */
static const char *ask_name(CUfunction f) {
    const char *n = NULL;
    if (ooc_real.cuFuncGetName && ooc_real.cuFuncGetName(&n, f) == CUDA_SUCCESS && n)
        return n;
    n = NULL;
    if (ooc_real.cuKernelGetName &&
        ooc_real.cuKernelGetName(&n, (CUkernel)(void *)f) == CUDA_SUCCESS && n)
        return n;
    n = NULL;
    if (ooc_real.cuFuncGetName && ooc_real.cuFuncLoad && ooc_real.cuFuncLoad(f) == CUDA_SUCCESS &&
        ooc_real.cuFuncGetName(&n, f) == CUDA_SUCCESS && n)
        return n;
    return NULL;
}

/* The kernel's name, asked once per function; "kernel" when the driver cannot say. */
static const char *fn_name(CUfunction f) {
    fname_t *e;
    HASH_FIND_PTR(fnames, &f, e);
    if (e)
        return e->name;
    const char *n = ask_name(f);
    if (!n)
        n = "kernel";
    e = calloc(1, sizeof *e);
    char *copy = e ? strdup(n) : NULL;
    if (!copy) {
        free(e);
        return "kernel";
    }
    e->f = f;
    e->name = copy;
    fn_oom = 0;
    HASH_ADD_PTR(fnames, f, e);
    if (fn_oom) {
        free(copy);
        free(e);
        return "kernel";
    }
    return e->name;
}

const char *ooc_fnname_of(CUfunction f) {
    pthread_mutex_lock(&fn_lock);
    const char *n = fn_name(f);
    pthread_mutex_unlock(&fn_lock);
    return n;
}

void ooc_fnname_forget(void) {
    pthread_mutex_lock(&fn_lock);
    fname_t *e, *t;
    HASH_ITER(hh, fnames, e, t) {
        HASH_DEL(fnames, e);
        e->older = old_fnames;
        old_fnames = e;
    }
    pthread_mutex_unlock(&fn_lock);
}
