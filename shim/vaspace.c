/* SPDX-License-Identifier: MIT */
/* vaspace.c: runs of chunk indices in the address reservation (vaspace.h): best-fit reuse of
 * freed runs (after a quarantine, unless direct), coalesced with their neighbours. No driver, no
 * lock. */
#include "vaspace.h"

#include <stdlib.h>

int va_space_take(va_space_t *v, uint64_t count, uint64_t *first) {
    size_t best = SIZE_MAX;
    for (size_t i = 0; i < v->nfree_runs; i++)
        if (v->free_runs[i].count >= count &&
            (best == SIZE_MAX || v->free_runs[i].count < v->free_runs[best].count ||
             (v->free_runs[i].count == v->free_runs[best].count &&
              v->free_runs[i].first < v->free_runs[best].first)))
            best = i; /* ties to the lowest address: the choice never depends on the list order */
    if (best != SIZE_MAX) {
        run_t *r = &v->free_runs[best];
        *first = r->first;
        r->first += count;
        r->count -= count;
        if (r->count == 0)
            v->free_runs[best] = v->free_runs[--v->nfree_runs];
        return 0;
    }
    if (v->next + count > v->chunks)
        return -1;
    *first = v->next;
    v->next += count;
    return 0;
}

/* Run `old` becomes free: coalesced with its free neighbours (a freed buffer's chunks come back
 * one at a time, and only a coalesced run serves a multi-chunk buffer again; else the
 * reservation would grow with every large free, and the search with it). A run that ends where
 * the untouched tail begins joins the tail. */
static void release(va_space_t *v, run_t old) {
    for (size_t i = 0; i < v->nfree_runs;) {
        run_t *r = &v->free_runs[i];
        if (r->first + r->count == old.first || old.first + old.count == r->first) {
            if (r->first < old.first)
                old.first = r->first;
            old.count += r->count;
            v->free_runs[i] = v->free_runs[--v->nfree_runs];
            i = 0; /* the merged run may now touch one already passed */
            continue;
        }
        i++;
    }
    if (old.first + old.count == v->next) {
        v->next = old.first;
        old.count = 0;
    }
    if (old.count && v->nfree_runs == v->cap_free_runs) {
        size_t nc = v->cap_free_runs ? v->cap_free_runs * 2 : 64;
        run_t *n = realloc(v->free_runs, nc * sizeof *n);
        if (n) {
            v->free_runs = n;
            v->cap_free_runs = nc;
        }
    }
    if (old.count && v->nfree_runs < v->cap_free_runs)
        v->free_runs[v->nfree_runs++] = old; /* else the range is lost: VA is plentiful */
}

void va_space_give(va_space_t *v, uint64_t first, uint64_t count) {
    if (v->direct) {
        release(v, (run_t){first, count});
        return;
    }
    if (v->q_len == QUARANTINE_RUNS) {
        run_t old = v->quarantine[v->q_head];
        v->q_head = (v->q_head + 1) % QUARANTINE_RUNS;
        v->q_len--;
        release(v, old);
    }
    v->quarantine[(v->q_head + v->q_len) % QUARANTINE_RUNS] = (run_t){first, count};
    v->q_len++;
}

void va_space_free(va_space_t *v) {
    free(v->free_runs);
    v->free_runs = NULL;
    v->nfree_runs = v->cap_free_runs = 0;
    v->q_head = v->q_len = 0;
    v->next = 0;
}
