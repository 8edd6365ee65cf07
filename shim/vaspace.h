/* SPDX-License-Identifier: MIT */
/* vaspace.h: runs of chunk indices in the shim's address reservation, handed out to buffers and
 * taken back through a quarantine (vaspace.c). Pure bookkeeping: no driver, no lock (the memory
 * layer calls it under mem_lock), so it is unit-tested on its own (suite memunit). */
#ifndef OOC_VASPACE_H
#define OOC_VASPACE_H

#include <stddef.h>
#include <stdint.h>

#define QUARANTINE_RUNS 64

typedef struct run {
    uint64_t first, count;
} run_t;

/* Invariants: runs in free_runs and in the quarantine are disjoint and below `next`; a run
 * given back is reusable only after QUARANTINE_RUNS later runs were given back (a use after
 * free faults meanwhile), and then joins its free neighbours, or the untouched tail. A `direct`
 * space has no quarantine: a run given back is free at once. */
typedef struct va_space {
    uint64_t chunks; /* capacity, in chunks */
    uint64_t next;   /* the untouched tail begins here */
    int direct;
    run_t quarantine[QUARANTINE_RUNS];
    unsigned q_head, q_len;
    run_t *free_runs;
    size_t nfree_runs, cap_free_runs;
} va_space_t;

/* Takes `count` contiguous indices: a free run first (best fit; of equal fits the lowest), else
 * from the tail. Returns 0 and the first index, or -1 when the reservation is exhausted. */
int va_space_take(va_space_t *v, uint64_t count, uint64_t *first);
/* Gives [first, first + count) back to the quarantine; the oldest quarantined run becomes free.
 * In a direct space the run itself becomes free. */
void va_space_give(va_space_t *v, uint64_t first, uint64_t count);
/* Frees the lists (the space is then empty, its capacity kept). */
void va_space_free(va_space_t *v);

#endif
