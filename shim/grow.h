/* SPDX-License-Identifier: MIT */
/* grow.h: the shim's one helper for arrays that grow by doubling (the memory layer through
 * mem_int.h, the recorder, the saved launches). A header alone: no state, no driver. */
#ifndef OOC_GROW_H
#define OOC_GROW_H

#include <stdlib.h>

/* Makes room for `need` elements of `elem` bytes in the array *p (p is the address of the array's
 * pointer, of any element type) of capacity *cap: the capacity doubles, from `first` elements for
 * an array that has none. Returns 0, or -1 out of memory (*p and *cap are then unchanged). The
 * caller serialises access to the array. */
static inline int grow_from(void *p, size_t *cap, size_t need, size_t elem, size_t first) {
    if (need <= *cap)
        return 0;
    size_t nc = *cap ? *cap * 2 : first;
    while (nc < need)
        nc *= 2;
    void *n = realloc(*(void **)p, nc * elem);
    if (!n)
        return -1;
    *(void **)p = n;
    *cap = nc;
    return 0;
}

/* grow_from with the usual first capacity, 64 elements. */
static inline int grow(void *p, size_t *cap, size_t need, size_t elem) {
    return grow_from(p, cap, need, elem, 64);
}

#endif
