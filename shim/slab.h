/* SPDX-License-Identifier: MIT */
/* slab.h: the small buffers that share one slab chunk, kept sorted by address for lookups
 * (slab.c). Pure bookkeeping: no driver, no lock (the memory layer calls it under mem_lock), so
 * it is unit-tested on its own (suite memunit). */
#ifndef OOC_SLAB_H
#define OOC_SLAB_H

#include <stddef.h>
#include <stdint.h>

struct buf; /* mem_int.h */

typedef struct slab {
    size_t offset; /* bump pointer */
    size_t n, cap;
    struct buf **bufs; /* sorted by address: buffers are bump-allocated */
} slab_t;

/* Appends b (whose address is above every buffer's already there). 0, or -1 out of memory. */
int slab_insert(slab_t *s, struct buf *b);
/* The buffer containing p, or NULL (a freed slot, or padding between buffers). */
struct buf *slab_find(const slab_t *s, uintptr_t p);
/* Removes b (nothing when it is not there). */
void slab_remove(slab_t *s, const struct buf *b);

#endif
