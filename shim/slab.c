/* SPDX-License-Identifier: MIT */
/* slab.c: the sorted list of the small buffers that share one slab chunk (slab.h). No driver, no
 * lock. */
#include "mem_int.h" /* buf_t */

#include <stdlib.h>
#include <string.h>

int slab_insert(slab_t *s, buf_t *b) {
    if (s->n == s->cap) {
        size_t nc = s->cap ? s->cap * 2 : 16;
        buf_t **n = realloc(s->bufs, nc * sizeof *n);
        if (!n)
            return -1;
        s->bufs = n;
        s->cap = nc;
    }
    s->bufs[s->n++] = b; /* bump allocation: addresses only grow */
    return 0;
}

buf_t *slab_find(const slab_t *s, uintptr_t p) {
    size_t lo = 0, hi = s->n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        const buf_t *b = s->bufs[mid];
        if (p < b->addr)
            hi = mid;
        else if (p >= b->addr + b->size)
            lo = mid + 1;
        else
            return s->bufs[mid];
    }
    return NULL;
}

void slab_remove(slab_t *s, const buf_t *b) {
    for (size_t i = 0; i < s->n; i++) {
        if (s->bufs[i] == b) {
            memmove(&s->bufs[i], &s->bufs[i + 1], (s->n - i - 1) * sizeof *s->bufs);
            s->n--;
            return;
        }
    }
}
