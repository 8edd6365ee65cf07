/* SPDX-License-Identifier: MIT */
/* lru.c: the list of resident chunks and the eviction walk with a second chance (lru.h). No
 * driver, no lock: the memory layer (vmm.c's callers through mem_int.h, resident.c's need_phys)
 * calls it under mem_lock. */
#include "mem_int.h" /* chunk_t */

void lru_remove(chunk_t *c) {
    if (!c->prev)
        return;
    c->prev->next = c->next;
    c->next->prev = c->prev;
    c->prev = c->next = NULL;
}

/* Moves c between neighbours prev and next, untouched. */
static void lru_insert(chunk_t *c, chunk_t *prev, chunk_t *next) {
    atomic_store_explicit(&c->touched, 0, memory_order_relaxed);
    c->prev = prev;
    c->next = next;
    prev->next = c;
    next->prev = c;
}

void lru_list_push(chunk_t *head, chunk_t *c) {
    lru_remove(c);
    lru_insert(c, head, head->next);
}

void lru_list_push_tail(chunk_t *head, chunk_t *c) {
    lru_remove(c);
    lru_insert(c, head->prev, head);
}

unsigned lru_pick(chunk_t *head, uint64_t serial, uint64_t steps, chunk_t **victims,
                  unsigned want) {
    unsigned nv = 0;
    for (chunk_t *c = head->prev, *prev; c != head && nv < want && steps; c = prev, steps--) {
        prev = c->prev;
        if (c->pin == serial || c->hold)
            continue;
        if (atomic_load_explicit(&c->touched, memory_order_relaxed)) {
            lru_list_push(head, c);
            continue;
        }
        victims[nv++] = c;
    }
    return nv;
}
