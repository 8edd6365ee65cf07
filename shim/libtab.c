/* SPDX-License-Identifier: MIT */
/* libtab.c: the real functions of a library the program loaded (cuDNN, cuBLAS, NCCL), found
 * once it is there, and dlsym's routing by pointer to our hooks.
 *
 * A hook file describes its library with OOC_LIBTAB (hook_int.h): the soname, the functions it
 * hooks and those it only calls. The library is never loaded by us (RTLD_NOLOAD): until the
 * program has it, a lookup answers -1 and is tried again at the next call. Also the interned
 * names of library operations (the profile keeps pointers to them). Thread-safe. */
#include "hook_int.h"

#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

int ooc_libtab_load(ooc_libtab_t *t) {
    if (atomic_load_explicit(&t->loaded, memory_order_acquire))
        return 0;
    pthread_mutex_lock(&t->lock);
    if (!atomic_load_explicit(&t->loaded, memory_order_relaxed)) {
        void *h = dlopen(t->soname, RTLD_LAZY | RTLD_NOLOAD);
        if (h) {
            for (size_t i = 0; i < t->n; i++)
                t->fns[i] = ooc_real_sym(h, t->names[i]);
            for (size_t i = 0; i < t->nhook; i++)
                t->real[i] = t->fns[i];
            atomic_store_explicit(&t->loaded, 1, memory_order_release);
        }
    }
    pthread_mutex_unlock(&t->lock);
    return atomic_load_explicit(&t->loaded, memory_order_acquire) ? 0 : -1;
}

typedef struct iname {
    struct iname *next;
    char s[];
} iname_t;

static pthread_mutex_t intern_lock = PTHREAD_MUTEX_INITIALIZER;
static iname_t *interned; /* every name handed out, never freed */

const char *ooc_intern(const char *s) {
    pthread_mutex_lock(&intern_lock);
    iname_t *n = interned;
    while (n && strcmp(n->s, s) != 0)
        n = n->next;
    if (!n) {
        size_t len = strlen(s) + 1;
        n = malloc(sizeof *n + len);
        if (n) {
            memcpy(n->s, s, len);
            n->next = interned;
            interned = n;
        }
    }
    pthread_mutex_unlock(&intern_lock);
    return n ? n->s : NULL;
}

void *ooc_libtab_route(ooc_libtab_t *t, void *real) {
    if (!real || ooc_libtab_load(t) != 0)
        return NULL;
    for (size_t i = 0; i < t->nhook; i++)
        if (t->real[i] == real)
            return t->hooks[i];
    return NULL;
}
