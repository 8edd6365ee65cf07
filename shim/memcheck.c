/* SPDX-License-Identifier: MIT */
/* memcheck.c: the memory layer's invariants as code, checked at every release of the residency
 * lock in builds with OOC_CHECKS (the sanitizer build: make SANITIZE=...), SQLite-style.
 *
 * mem_check walks every chunk (chunk_check) and the LRU list and aborts with one log line naming
 * the broken invariant when one does not hold: a broken invariant is a bug of the shim, caught
 * where it happens rather than as corrupted data later. Without OOC_CHECKS both are empty inline
 * functions (mem_int.h). Locking: caller holds mem_lock (fastpath.c calls mem_check before each
 * release). Calls nothing else in the shim but the log: the lowest file of the layer. */
#include "mem_int.h"

#ifdef OOC_CHECKS

#include <stdlib.h>

#define CHECK(cond, c)                                                                             \
    do {                                                                                           \
        if (!(cond))                                                                               \
            check_failed(#cond, c);                                                                \
    } while (0)

static void check_failed(const char *what, const chunk_t *c) {
    if (c)
        OOC_LOG_E("invariant broken: %s (chunk %llu: state %d, hot %d, dying %d, queued %u, "
                  "aliased %d, discard %d, retiring %d)",
                  what, (unsigned long long)c->idx, c->state, (int)c->hot, c->dying, c->queued,
                  c->aliased, c->discard, c->out_ev != NULL);
    else
        OOC_LOG_E("invariant broken: %s (resident %llu, made %llu, budget %llu chunks)", what,
                  (unsigned long long)M.resident, (unsigned long long)M.phys_made,
                  (unsigned long long)M.budget_chunks);
    abort();
}

void chunk_check(const chunk_t *c) {
    CHECK(c->state == C_EMPTY || c->state == C_RESIDENT || c->state == C_SWAPPED, c);
    /* Resident exactly when it holds a physical chunk of the pool. */
    CHECK((c->state == C_RESIDENT) == (c->phys != NULL || c->stolen), c);
    /* Stolen: resident without memory of its own, until its copy out is done and it is unmapped
     * (retiring, or dying if freed meanwhile), or until its fences are done (dying, its memory
     * taken by an op's swap-in: dying_steal). */
    CHECK(!c->stolen || (c->state == C_RESIDENT && c->phys == NULL && (c->out_ev || c->dying)), c);
    /* Safe mode: a host alias is the swapped chunk's host slot, mapped at its address. */
    CHECK(!c->aliased || (c->state == C_SWAPPED && c->host != NULL && M.safe), c);
    /* Staged (safe mode): swapped, its host slot still its data, not dying, its copy followed
     * by an event (stage.c). */
    CHECK(!c->stage || (c->state == C_SWAPPED && c->host != NULL && c->stage_ev != NULL &&
                        !c->dying && M.safe),
          c);
    CHECK(!c->stage_ro || c->stage, c);
    /* Retiring: still resident, its host slot receiving the planned swap-out's copy. */
    CHECK(!c->out_ev || (c->state == C_RESIDENT && c->host != NULL), c);
    /* Hot: what the fast path relies on (set_hot's conditions). */
    CHECK(!c->hot || (c->state == C_RESIDENT && !c->out_ev && !c->dying && !c->queued &&
                      !c->aliased && !c->in_ev && !c->discard && c->ext_n != 0),
          c);
    /* In the LRU: resident and live, not on its way out. */
    CHECK(!c->prev || (c->state == C_RESIDENT && !c->dying && !c->out_ev), c);
    /* Dying: no live buffer owns it any more. */
    CHECK(!c->dying || c->ext_n == 0, c);
    CHECK(c->nusers <= MAX_USERS && c->nfence <= MAX_USERS, c);
    CHECK(!c->slab || !c->owner, c);
    /* A slab chunk has a stamp (fastpath.c). */
    CHECK(!c->slab || (c->stamp != 0 && c->gone != NULL), c);
    /* A hot chunk lists its buffer for the fast path: a large buffer's serial and size. */
    CHECK(!c->hot || (c->owner ? c->own_id == c->owner->id && c->own_bytes == c->owner->size
                               : c->own_id == 0),
          c);
}

/* Whether the job numbered seq is the worker's (the ring, or the one it works on). */
static int job_listed(uint32_t seq) {
    if (M.job_busy && M.job_cur.seq == seq)
        return 1;
    for (size_t k = 0; k < M.njobs; k++)
        if (M.jobs[M.job_head + k].seq == seq)
            return 1;
    return 0;
}

void mem_check(void) {
    if (!M.ready)
        return; /* before start-up, or after shutdown */
    uint64_t resident = 0;
    for (const chunk_t *c = M.chunks; c; c = c->hh.next) {
        chunk_check(c);
        /* Queued: the job that queued it will serve it or clear it; no older job of the same
         * buffer may (its place in the plan's order is not this swap-in's). */
        CHECK(!c->queued || job_listed(c->queued), c);
        resident += (c->state == C_RESIDENT && !c->stolen) + (c->stage != NULL);
        /* The table holds it at its index (chunk_find reads the table): one chunk per index,
         * and chunk_delete's clearing of its entry leaves no deleted chunk there. */
        CHECK(!M.table || (c->idx < M.va.chunks &&
                           atomic_load_explicit(&M.table[c->idx], memory_order_relaxed) == c),
              c);
    }
    /* Every resident chunk is in the table (the bandwidth probe's scratch chunk is mapped and
     * unmapped within one hold of the lock). */
    CHECK(resident == M.resident, NULL);
    CHECK(M.resident + M.warm_chunks <= M.phys_made, NULL);
    uint64_t n = 0;
    for (const chunk_t *c = M.lru.next; c != &M.lru; c = c->next) {
        CHECK(c->next->prev == c && c->prev->next == c, c);
        CHECK(++n <= M.resident, c);
    }
}

#endif
