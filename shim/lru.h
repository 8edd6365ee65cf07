/* SPDX-License-Identifier: MIT */
/* lru.h: the list of resident chunks, most recently used at the head, and the eviction walk that
 * gives a chunk the fast path used a second chance, as CLOCK does (lru.c). Pure list work: no
 * driver, no lock, no global state (the memory layer passes its list head M.lru and calls it
 * under mem_lock), so it is unit-tested on its own (suite memunit). */
#ifndef OOC_LRU_H
#define OOC_LRU_H

#include <stdint.h>

struct chunk; /* mem_int.h: prev, next, touched, pin */

/* The list is circular through a sentinel `head` (head->next the most recent, head->prev the
 * least); a chunk outside it has prev == NULL. The locked path orders it; the fast path only sets
 * a chunk's `touched` flag, which every placement in the list clears. */

/* Takes c out of its list (nothing when it is in none). */
void lru_remove(struct chunk *c);
/* Puts c at the hot end of the list at head, untouched (taken out of any list first). */
void lru_list_push(struct chunk *head, struct chunk *c);
/* Puts c at the cold end of the list at head, untouched: the first to be evicted. */
void lru_list_push_tail(struct chunk *head, struct chunk *c);
/* Picks up to `want` eviction victims into victims[], least recently used first, walking the list
 * at head from its tail. Chunks pinned by the current op (pin == serial) or held by a library
 * call in flight (hold) are skipped and stay where they are; a touched chunk gets a second chance:
 * it goes back to the head, untouched, so the walk meets it again last (a victim then, unless used
 * again meanwhile). The walk looks at no more than `steps` chunks, so it ends even while the fast
 * path keeps touching chunks. Victims stay in the list (the caller takes them out when it evicts
 * them). Returns their number. */
unsigned lru_pick(struct chunk *head, uint64_t serial, uint64_t steps, struct chunk **victims,
                  unsigned want);

#endif
