/* SPDX-License-Identifier: MIT */
/* shadow.c: the host's copy of small device ranges the program wrote from the host, so that a
 * library call whose operands' addresses lie in device memory (cublas*Batched's pointer arrays)
 * can read them without waiting for the device.
 *
 * A slot holds the bytes of one host-to-device copy of at most OOC_SHADOW_MAX_BYTES into a
 * buffer of ours, as the copy was issued, or of a device-to-device copy whose source a slot holds
 * whole (ooc_shadow_after, from hooks.c's copies; nothing is kept while a stream captures a
 * graph: a captured copy reads the host's bytes when the graph runs, not now). A slot is dropped
 * by anything that may write what it holds after that, in the order the program issues its work:
 *   - every op of the program (ooc_shadow_forget, from op.c), before it is issued: a copy or a set
 *     drops the slots its destination overlaps; a kernel, a library call or a graph drops every
 *     slot in a buffer it may write (it names an address in the buffer, and a kernel may write
 *     anywhere in it); an op whose access set overflowed, or a graph whose access the shim
 *     did not learn (ooc_shadow_forget_all, graph.c), drops them all;
 *   - the free of the buffer (ooc_shadow_freed), before its address can be reused.
 * The ops a library issues inside its own call (ooc_lib_depth > 0) do not drop slots: the call's
 * own access set says what it writes.
 * So a slot is what the device will hold there when the next op of the program runs, as long as
 * the program orders its work (a write on one stream that another stream's op does not wait for
 * is the program's race, with or without the shim). What the shim cannot see: a kernel writing
 * a range it reaches only through memory (a pointer it reads from a table in device memory).
 * A miss is never wrong, only slower: blas.c then reads the array back after a stream sync.
 *
 * Thread-safe: one mutex; ops take it only while some slot is held (one relaxed load when none
 * is). A bounded table: the oldest slot makes room for a new one. */
#include "shim.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define SLOTS 64

typedef struct slot {
    uintptr_t lo, hi;   /* the bytes held: [lo, hi) */
    uintptr_t blo, bhi; /* the buffer they lie in */
    uint64_t age;       /* when written, for the oldest */
    unsigned char *bytes;
} slot_t;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static slot_t slots[SLOTS];
static uint64_t clock_now;
_Atomic unsigned ooc_shadow_held; /* slots in use: op.c skips the lock while 0 */

static void drop_l(slot_t *s) {
    free(s->bytes);
    memset(s, 0, sizeof *s);
    atomic_fetch_sub_explicit(&ooc_shadow_held, 1, memory_order_relaxed);
}

static int overlaps(uintptr_t lo, uintptr_t hi, uintptr_t a, uintptr_t b) {
    return lo < b && a < hi;
}

/* Drops the slots that hold any byte of [lo, hi). */
static void drop_range_l(uintptr_t lo, uintptr_t hi) {
    for (int i = 0; i < SLOTS; i++)
        if (slots[i].bytes && overlaps(lo, hi, slots[i].lo, slots[i].hi))
            drop_l(&slots[i]);
}

/* Stores n bytes (taken: malloc'd) for [dst, dst + n) in the buffer [blo, bhi). */
static void store_l(uintptr_t dst, unsigned char *bytes, size_t n, uintptr_t blo, uintptr_t bhi) {
    drop_range_l(dst, dst + n);
    slot_t *s = &slots[0];
    for (int i = 0; i < SLOTS; i++) {
        if (!slots[i].bytes) {
            s = &slots[i];
            break;
        }
        if (slots[i].age < s->age)
            s = &slots[i];
    }
    if (s->bytes)
        drop_l(s);
    *s = (slot_t){dst, dst + n, blo, bhi, ++clock_now, bytes};
    atomic_fetch_add_explicit(&ooc_shadow_held, 1, memory_order_relaxed);
}

/* Copies [p, p + n) to out when one slot holds it all. */
static int read_l(uintptr_t p, void *out, size_t n) {
    for (int i = 0; i < SLOTS; i++)
        if (slots[i].bytes && slots[i].lo <= p && p + n <= slots[i].hi) {
            memcpy(out, slots[i].bytes + (p - slots[i].lo), n);
            return 1;
        }
    return 0;
}

/* Keeps the n bytes a host-to-device copy from src wrote at dst, in our buffer [blo, bhi). */
static void keep_h2d(uintptr_t dst, const void *src, size_t n, uintptr_t blo, uintptr_t bhi) {
    if (atomic_load_explicit(&ooc_graph_captures, memory_order_relaxed) || !src || n == 0 ||
        n > OOC_SHADOW_MAX_BYTES)
        return;
    unsigned char *b = malloc(n);
    if (!b)
        return; /* the op dropped what the range held: a miss later, never a stale slot */
    memcpy(b, src, n);
    pthread_mutex_lock(&lock);
    store_l(dst, b, n, blo, bhi);
    pthread_mutex_unlock(&lock);
}

/* Keeps what a device-to-device copy wrote at dst when a slot holds all of its source. */
static void keep_d2d(uintptr_t dst, uintptr_t src, size_t n, uintptr_t blo, uintptr_t bhi) {
    if (!atomic_load_explicit(&ooc_shadow_held, memory_order_relaxed) ||
        atomic_load_explicit(&ooc_graph_captures, memory_order_relaxed) || n == 0 ||
        n > OOC_SHADOW_MAX_BYTES)
        return;
    unsigned char *b = malloc(n);
    if (!b)
        return;
    pthread_mutex_lock(&lock);
    if (read_l(src, b, n))
        store_l(dst, b, n, blo, bhi);
    else
        free(b);
    pthread_mutex_unlock(&lock);
}

void ooc_shadow_buffer(int how, uintptr_t dst, uintptr_t src, size_t n, uintptr_t buf[2]) {
    size_t size = 0;
    buf[0] = buf[1] = 0;
    if (how == OOC_SH_NONE || n == 0 || n > OOC_SHADOW_MAX_BYTES ||
        (how == OOC_SH_ANY && !ooc_mem_owns(src)))
        return;
    if (ooc_mem_lookup(dst, &buf[0], &size) != 0 || dst + n > buf[0] + size) {
        buf[0] = 0;
        return;
    }
    buf[1] = buf[0] + size;
}

CUresult ooc_shadow_after(int how, CUresult r, uintptr_t dst, uintptr_t src, size_t n,
                          const uintptr_t buf[2]) {
    if (r != CUDA_SUCCESS || !buf[0])
        return r;
    if (how == OOC_SH_H2D)
        keep_h2d(dst, (const void *)src, n, buf[0], buf[1]);
    else
        keep_d2d(dst, src, n, buf[0], buf[1]);
    return r;
}

int ooc_shadow_read(uintptr_t p, void *out, size_t n) {
    if (!atomic_load_explicit(&ooc_shadow_held, memory_order_relaxed))
        return 0;
    pthread_mutex_lock(&lock);
    int hit = read_l(p, out, n);
    pthread_mutex_unlock(&lock);
    return hit;
}

static void drop_all_l(void) {
    for (int i = 0; i < SLOTS; i++)
        if (slots[i].bytes)
            drop_l(&slots[i]);
}

void ooc_shadow_forget_all(void) {
    if (!atomic_load_explicit(&ooc_shadow_held, memory_order_relaxed))
        return;
    pthread_mutex_lock(&lock);
    drop_all_l();
    pthread_mutex_unlock(&lock);
}

void ooc_shadow_forget(const ooc_access_t *a) {
    int exact = a->kind == OOC_OP_MEMCPY || a->kind == OOC_OP_MEMSET;
    pthread_mutex_lock(&lock);
    if (a->overflow)
        drop_all_l();
    for (unsigned r = 0; r < a->n && atomic_load_explicit(&ooc_shadow_held, memory_order_relaxed);
         r++) {
        const ooc_query_t *q = &a->refs[r];
        if (!(q->use & OOC_USE_W))
            continue;
        if (exact && q->hi > q->lo) {
            drop_range_l(q->lo, q->hi);
            continue;
        }
        /* An address in a buffer, written who knows where: all the buffer's slots. */
        uintptr_t hi = q->hi > q->lo ? q->hi : q->lo + 1;
        for (int i = 0; i < SLOTS; i++)
            if (slots[i].bytes &&
                (overlaps(q->lo, hi, slots[i].blo, slots[i].bhi) || q->lo == slots[i].bhi))
                drop_l(&slots[i]); /* the latter: an end pointer */
    }
    pthread_mutex_unlock(&lock);
}

void ooc_shadow_freed(uintptr_t p) {
    if (!atomic_load_explicit(&ooc_shadow_held, memory_order_relaxed))
        return;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < SLOTS; i++)
        if (slots[i].bytes && slots[i].blo == p)
            drop_l(&slots[i]);
    pthread_mutex_unlock(&lock);
}
