/* SPDX-License-Identifier: MIT */
/* grow.h: private to the planner: its one helper for arrays that grow by doubling (grow.c). The
 * shim has its own, shim/grow.h, which returns -1 rather than an OOC_E* code. */
#ifndef OOC_PLANNER_GROW_H
#define OOC_PLANNER_GROW_H

#include <stddef.h>
#include <stdint.h>

/* Makes room for `need` elements of `elem` bytes in the array *arr (arr is the address of the
 * array's pointer, of any element type) of capacity *cap: the capacity doubles, from `first`
 * elements for an array that has none. Returns 0, or OOC_ENOMEM out of memory or when the size
 * would overflow (*arr and *cap are then unchanged). Thread-safe on distinct arrays. */
int ooc_grow(void *arr, size_t *cap, size_t need, size_t elem, size_t first);
/* The same for a capacity counted in 32 bits (the profile's and the plan's arrays); OOC_ENOMEM
 * too when need is over UINT32_MAX / 2. */
int ooc_grow32(void *arr, uint32_t *cap, uint32_t need, size_t elem, uint32_t first);

#endif
