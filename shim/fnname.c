/* SPDX-License-Identifier: MIT */
/* fnname.c: kernel names: the name of each CUfunction, asked of the driver once and kept for the
 * life of the process (the recorder names kernel ops by it; replay and verification compare it
 * and log it).
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
    UT_hash_handle hh;
} fname_t;

static pthread_mutex_t fn_lock = PTHREAD_MUTEX_INITIALIZER;
static fname_t *fnames;

/* The kernel's name, asked once per function; "kernel" when the driver cannot say. */
static const char *fn_name(CUfunction f) {
    fname_t *e;
    HASH_FIND_PTR(fnames, &f, e);
    if (e)
        return e->name;
    const char *n = NULL;
    if (!ooc_real.cuFuncGetName || ooc_real.cuFuncGetName(&n, f) != CUDA_SUCCESS || !n)
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
