/* SPDX-License-Identifier: MIT */
/* grow.c: the planner's one helper for arrays that grow by doubling (grow.h), used by the
 * profile, the plan, the simulator's queues and trace, the timeline and the schedules' memo; no
 * state. */
#include "grow.h"

#include "ooc_err.h"

#include <stdlib.h>

int ooc_grow(void *arr, size_t *cap, size_t need, size_t elem, size_t first) {
    if (need <= *cap)
        return 0;
    if (elem == 0 || need > SIZE_MAX / 2 / elem)
        return OOC_ENOMEM;
    size_t nc = *cap ? *cap * 2 : first ? first : 1;
    while (nc < need)
        nc *= 2;
    void *p = realloc(*(void **)arr, nc * elem);
    if (!p)
        return OOC_ENOMEM;
    *(void **)arr = p;
    *cap = nc;
    return 0;
}

int ooc_grow32(void *arr, uint32_t *cap, uint32_t need, size_t elem, uint32_t first) {
    if (need <= *cap)
        return 0;
    if (need > UINT32_MAX / 2)
        return OOC_ENOMEM;
    size_t c = *cap;
    int rc = ooc_grow(arr, &c, need, elem, first);
    if (rc == 0)
        *cap = (uint32_t)c; /* below 2 * need: it fits */
    return rc;
}
