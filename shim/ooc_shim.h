/* SPDX-License-Identifier: MIT */
/* ooc_shim.h: the public interface of libooc_shim.so, installed as <ooc_shim.h>.
 *
 * A program needs none of it: the shim finds iterations by itself. The one call a program may
 * make is the iteration marker, which makes the iteration boundaries exact (the marker wins from
 * its first call on). Python reaches it without this header:
 *     ctypes.CDLL(None).ooc_mark_iteration()
 * The shim defines ooc_mark_iteration (shim/record.c, which includes this header, so the two
 * declarations cannot drift apart). */
#ifndef OOC_SHIM_PUBLIC_H
#define OOC_SHIM_PUBLIC_H

#include <dlfcn.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Marks the end of an iteration (call it once per training step, after the optimizer step).
 * Cheap; a no-op unless the shim is recording or replaying. Thread-safe. Defined by
 * libooc_shim.so: calling it directly links the program against the shim (-looc_shim). */
void ooc_mark_iteration(void);

/* Calls ooc_mark_iteration when the shim is loaded in this process (LD_PRELOAD, ooc-run) and
 * does nothing otherwise, so a program that uses it runs with or without the shim and is not
 * linked against it. Returns 1 when the marker was called, 0 when the shim is not loaded.
 * Looks the symbol up once per translation unit (dlopen(NULL) and dlsym; with glibc before 2.34
 * link with -ldl). Thread-safe: concurrent first calls find the same address. */
static inline int ooc_mark_iteration_if_loaded(void) {
    static void *sym;
    static int looked;
    if (!__atomic_load_n(&looked, __ATOMIC_ACQUIRE)) {
        void *self = dlopen(NULL, RTLD_LAZY);
        __atomic_store_n(&sym, self ? dlsym(self, "ooc_mark_iteration") : NULL, __ATOMIC_RELAXED);
        __atomic_store_n(&looked, 1, __ATOMIC_RELEASE);
    }
    void *s = __atomic_load_n(&sym, __ATOMIC_RELAXED);
    if (!s)
        return 0;
    void (*mark)(void);
    memcpy(&mark, &s, sizeof mark); /* POSIX: dlsym's result converts to a function pointer */
    mark();
    return 1;
}

#ifdef __cplusplus
}
#endif

#endif
