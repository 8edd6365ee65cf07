/* SPDX-License-Identifier: MIT */
/* launch.c: which buffers a kernel launch references.
 *
 * The parameter layout of a function comes from cuFuncGetParamInfo (offset and size of each
 * parameter, asked until CUDA_ERROR_INVALID_VALUE) and is cached per CUfunction. A handle the
 * driver does not answer for as a function is asked again as a CUkernel (lazy loading hands out
 * CUkernel handles, cast to CUfunction: cuKernelGetParamInfo), then as a function once more after
 * cuFuncLoad. A layout nobody answered for is never cached: the next launch asks again (each
 * such launch is counted, OOC_STATS "launches with no parameter layout"). Every aligned
 * 8-byte word of the parameter bytes that falls in the shim's reservation is looked up; a hit
 * references that whole buffer. Parameters come as kernelParams (a pointer per parameter) or
 * packed in `extra` (CU_LAUNCH_PARAM_BUFFER_POINTER/SIZE), where the packed bytes are scanned.
 *
 * Weak words. A parameter word that once held an address in the reservation with no live buffer
 * there, or that kept its value from one launch of the function to the next while the buffer
 * under that address changed (another offset into another buffer: the word did not follow a
 * buffer, the reuse of freed addresses moved one under it), is a pointer the kernel does not use
 * at every launch, a stale value (seen on an H100: a cuDNN convolution's parameter block points
 * into whatever buffer last took a freed address, one iteration a live 822 MB activation, the
 * next a 205 MB one or nothing). What each word met comes from ooc_mem_op_word_hits after the
 * launch. Its bit in the layout's `weak` map is set; from then on its queries carry
 * OOC_USE_WEAK: their buffers are still made resident (the kernel may use it), but are not
 * listed for the op, so that iteration detection and replay see the same op every iteration.
 * Only the first WEAK_BYTES of the parameters have bits.
 *
 * A module unloaded (hooks.c) may free functions whose handle values a later module's functions
 * reuse, with other layouts: ooc_launch_forget_layouts raises the generation, and a layout of an
 * older generation is asked for again before it is used.
 *
 * Locking: layouts are never freed (one replaced by a newer generation is kept on a list). A
 * launch finds its function's layout in a fixed table of atomic pointers without any lock (an
 * entry is written with release after the layout it points to is complete); the hash under a
 * read-write lock holds the current layout of each function and is asked only when the table
 * has no current entry for the function (its first launches, or a table full near it). */
#include "shim.h"

#include <stdlib.h>
#include <string.h>

#define uthash_nonfatal_oom(obj) ((void)0)
#include <uthash.h>

#define MAX_PARAMS 256
#define WEAK_BYTES 4096 /* parameter bytes whose words may be marked weak */

typedef struct layout {
    CUfunction f;
    unsigned n;
    int known; /* 0: cuFuncGetParamInfo failed; the launch's words cannot be found */
    uint32_t offset[MAX_PARAMS];
    uint32_t size[MAX_PARAMS];
    _Atomic uint64_t weak[WEAK_BYTES / 8 / 64]; /* a bit per parameter word: see "Weak words" */
    uint64_t gen;                               /* layout_gen when it was asked for */
    struct layout *older;                       /* on `replaced` */
    UT_hash_handle hh;
} layout_t;

static layout_t *cache;
static layout_t *replaced; /* layouts of an older generation, under cache_lock */
static _Atomic uint64_t layout_gen = 1;
static pthread_rwlock_t cache_lock = PTHREAD_RWLOCK_INITIALIZER;

/* The lock-free table: open addressing over PROBES slots from the function's hash. */
#define FAST_SLOTS 4096
#define PROBES     8
static _Atomic(layout_t *) fast[FAST_SLOTS];

static size_t fast_home(CUfunction f) {
    uint64_t h = (uint64_t)(uintptr_t)f * 0x9e3779b97f4a7c15ull;
    return (size_t)(h >> 52) % FAST_SLOTS;
}

static const layout_t *fast_find(CUfunction f) {
    for (size_t i = 0, k = fast_home(f); i < PROBES; i++, k = (k + 1) % FAST_SLOTS) {
        layout_t *l = atomic_load_explicit(&fast[k], memory_order_acquire);
        if (!l)
            return NULL;
        if (l->f == f)
            return l;
    }
    return NULL;
}

/* Puts l in the table if a slot near its home is free or holds an older layout of the same
 * function (else it stays in the hash only). */
static void fast_put(layout_t *l) {
    for (size_t i = 0, k = fast_home(l->f); i < PROBES; i++, k = (k + 1) % FAST_SLOTS) {
        layout_t *cur = NULL;
        if (atomic_compare_exchange_strong_explicit(&fast[k], &cur, l, memory_order_release,
                                                    memory_order_acquire))
            return;
        if (cur->f == l->f) {
            if (cur->gen < l->gen)
                atomic_compare_exchange_strong_explicit(&fast[k], &cur, l, memory_order_release,
                                                        memory_order_relaxed);
            return;
        }
    }
}

void ooc_launch_forget_layouts(void) {
    atomic_fetch_add(&layout_gen, 1);
}

enum { ASK_FUNCTION, ASK_KERNEL };
enum { ASK_OK, ASK_NONE, ASK_FAULT };

/* Asks the driver for f's layout, as a function or as a CUkernel, into l. ASK_OK (l->known set),
 * ASK_NONE (no answer about f), or ASK_FAULT (a sticky device error, reported). */
static int ask_layout(layout_t *l, int how) {
    PFN_cuFuncGetParamInfo_v12040 fn = ooc_real.cuFuncGetParamInfo;
    PFN_cuKernelGetParamInfo_v12040 kn = ooc_real.cuKernelGetParamInfo;
    if (how == ASK_FUNCTION ? !fn : !kn)
        return ASK_NONE;
    l->n = 0;
    for (size_t i = 0; i < MAX_PARAMS; i++) {
        size_t off, size;
        CUresult r = how == ASK_FUNCTION ? fn(l->f, i, &off, &size)
                                         : kn((CUkernel)(void *)l->f, i, &off, &size);
        /* The end of the list; at index 0 from cuKernelGetParamInfo, also "not a kernel" (its
         * only documented error): a kernel with no parameters has nothing to find anyway. */
        if (r == CUDA_ERROR_INVALID_VALUE && (i > 0 || how == ASK_FUNCTION))
            break;
        if (r == CUDA_ERROR_INVALID_VALUE || r == CUDA_ERROR_NOT_SUPPORTED ||
            r == CUDA_ERROR_NOT_FOUND || r == CUDA_ERROR_INVALID_HANDLE)
            return ASK_NONE;
        if (r != CUDA_SUCCESS) {
            ooc_mem_report_fault(r);
            return ASK_FAULT;
        }
        l->offset[i] = (uint32_t)off;
        l->size[i] = (uint32_t)size;
        l->n = (unsigned)i + 1;
    }
    l->known = 1;
    return ASK_OK;
}

static const layout_t *layout_of(CUfunction f) {
    uint64_t gen = atomic_load_explicit(&layout_gen, memory_order_acquire);
    layout_t *l = (layout_t *)fast_find(f);
    if (l && l->gen == gen)
        return l;
    pthread_rwlock_rdlock(&cache_lock);
    HASH_FIND_PTR(cache, &f, l);
    pthread_rwlock_unlock(&cache_lock);
    if (l && l->gen == gen) {
        fast_put(l);
        return l;
    }
    l = calloc(1, sizeof *l);
    if (!l)
        return NULL;
    l->f = f;
    l->gen = gen;
    int asked = ask_layout(l, ASK_FUNCTION);
    if (asked == ASK_NONE)
        asked = ask_layout(l, ASK_KERNEL);
    if (asked == ASK_NONE && ooc_real.cuFuncLoad && ooc_real.cuFuncLoad(f) == CUDA_SUCCESS)
        asked = ask_layout(l, ASK_FUNCTION);
    if (asked != ASK_OK) {
        /* Not cached: a later launch asks again (a sticky device error is not an answer). */
        if (asked != ASK_FAULT)
            OOC_LOG_W("no parameter layout for function %p (neither cuFuncGetParamInfo, nor "
                      "cuKernelGetParamInfo, nor after cuFuncLoad; a CUDA 12.4 driver is "
                      "needed): its buffers cannot be made resident",
                      (void *)f);
        free(l);
        return NULL;
    }
    pthread_rwlock_wrlock(&cache_lock);
    layout_t *other;
    HASH_FIND_PTR(cache, &f, other);
    if (other && other->gen >= l->gen) {
        free(l);
        l = other;
    } else {
        if (other) {
            HASH_DEL(cache, other);
            other->older = replaced; /* a launch may still be reading it */
            replaced = other;
        }
        HASH_ADD_PTR(cache, f, l);
    }
    pthread_rwlock_unlock(&cache_lock);
    fast_put(l);
    return l;
}

/* Notes every aligned 8-byte word of [p, p + n) that points into one of our buffers. `base` is
 * the bytes' offset in the parameters and `l` their layout, for the words' indices and weak
 * bits (NULL: packed bytes, no index). */
static void scan_words(const unsigned char *p, size_t n, ooc_access_t *a, const layout_t *l,
                       size_t base) {
    for (size_t off = 0; off + 8 <= n; off += 8) {
        uint64_t w;
        memcpy(&w, p + off, 8);
        if (!ooc_mem_owns((uintptr_t)w))
            continue;
        size_t idx = (base + off) / 8;
        if (!l || base + off + 8 > WEAK_BYTES) {
            ooc_mem_note(a, (uintptr_t)w);
            continue;
        }
        uint64_t bits = atomic_load_explicit(&l->weak[idx / 64], memory_order_relaxed);
        ooc_mem_note_word(a, (uintptr_t)w, (uint32_t)idx + 1, (int)((bits >> (idx % 64)) & 1));
    }
}

static void scan_extra(void **extra, ooc_access_t *a) {
    void *buf = NULL;
    size_t *size = NULL;
    for (size_t i = 0; i < 16 && extra[i] != CU_LAUNCH_PARAM_END; i += 2) {
        if (extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER)
            buf = extra[i + 1];
        else if (extra[i] == CU_LAUNCH_PARAM_BUFFER_SIZE)
            size = extra[i + 1];
    }
    if (buf && size) {
        scan_words(buf, *size, a, NULL, 0);
        ooc_tmap_scan(buf, *size, 0, a);
    }
}

void ooc_launch_access(CUfunction f, void **params, void **extra, ooc_access_t *a) {
    if (extra) {
        scan_extra(extra, a);
        return;
    }
    if (!params)
        return;
    const layout_t *l = layout_of(f);
    if (!l || !l->known) {
        ooc_stats_add(OOC_STAT_launches_no_layout, 1);
        return;
    }
    for (unsigned i = 0; i < l->n; i++) {
        if (l->size[i] < 8 || !params[i])
            continue;
        /* A parameter's bytes start at an 8-aligned offset when it holds a pointer. */
        scan_words(params[i], l->size[i], a, l, l->offset[i]);
        ooc_tmap_scan(params[i], l->size[i], l->offset[i], a);
    }
}

/* What a parameter word last pointed at: its value and where in the buffer it fell. */
typedef struct word_seen {
    struct {
        const layout_t *l;
        uint32_t word;
    } key;
    uint64_t value, off;
    UT_hash_handle hh;
} word_seen_t;

static word_seen_t *seen;
static pthread_mutex_t seen_lock = PTHREAD_MUTEX_INITIALIZER;

/* Is this word stale, given what it met now (hit: the buffer's start, 0 for none)? Dangling, or
 * the same value as at its last launch but at another offset into the buffer there: the buffer
 * under a fixed address changed, and the word did not follow it. A pointer to a buffer's start
 * (or at a fixed offset into it) keeps its offset whatever buffer it names. Caller holds
 * seen_lock. */
static int stale(const layout_t *l, uint32_t word, uint64_t value, uintptr_t hit) {
    if (!hit)
        return 1;
    word_seen_t probe, *w;
    memset(&probe, 0, sizeof probe);
    probe.key.l = l;
    probe.key.word = word;
    uint64_t off = value - (uint64_t)hit;
    int moved = 0;
    HASH_FIND(hh, seen, &probe.key, sizeof probe.key, w);
    if (!w && (w = calloc(1, sizeof *w)) != NULL) {
        w->key = probe.key;
        HASH_ADD(hh, seen, key, sizeof w->key, w);
    } else if (w) {
        moved = w->value == value && w->off != off;
    }
    if (w) {
        w->value = value;
        w->off = off;
    }
    return moved;
}

/* Is ref i of a launch a word to learn from (a pointer word within the first WEAK_BYTES, not
 * weak already)? */
static int learnable(const ooc_access_t *a, unsigned i) {
    uint32_t word = a->refs[i].word;
    return word && (size_t)word * 8 <= WEAK_BYTES && a->refs[i].hi == a->refs[i].lo &&
           !(a->refs[i].use & OOC_USE_WEAK);
}

void ooc_launch_learn_words(CUfunction f, const ooc_access_t *a, const ooc_word_hit_t *hits) {
    layout_t *l = (layout_t *)layout_of(f); /* only the atomic map is written */
    if (!l)
        return;
    /* One hold of seen_lock for the whole launch; the words found stale are logged after. */
    uint64_t found[(OOC_MAX_REFS + 63) / 64] = {0};
    int any = 0;
    for (unsigned i = 0; i < a->n; i++) {
        if (!learnable(a, i))
            continue;
        if (!any) {
            pthread_mutex_lock(&seen_lock);
            any = 1;
        }
        if (stale(l, a->refs[i].word, a->refs[i].lo, hits[i].base))
            found[i / 64] |= 1ull << (i % 64);
    }
    if (!any)
        return;
    pthread_mutex_unlock(&seen_lock);
    for (unsigned i = 0; i < a->n; i++) {
        if (!(found[i / 64] & (1ull << (i % 64))))
            continue;
        uint32_t word = a->refs[i].word;
        uint64_t bit = 1ull << ((word - 1) % 64);
        uint64_t was = atomic_fetch_or(&l->weak[(word - 1) / 64], bit);
        if (!(was & bit))
            OOC_LOG_I("%s: parameter byte %u %s; from now on what it points at is made resident "
                      "but is not part of the launch's identity (a pointer the kernel does not "
                      "always use)",
                      ooc_fnname_of(f), (word - 1) * 8,
                      hits[i].base ? "kept its value while the buffer there changed"
                                   : "held an address with no buffer there");
    }
}

int ooc_launch_word_learnable(const ooc_access_t *a, unsigned i) {
    return i < a->n && learnable(a, i);
}

int ooc_launch_weaken(const ooc_access_t *a, const uint32_t *words, size_t n, const char *why) {
    layout_t *l = a->kind == OOC_OP_KERNEL ? (layout_t *)layout_of(a->fn) : NULL;
    if (!l)
        return -1;
    for (size_t k = 0; k < n; k++)
        if (words[k] == 0 || (size_t)words[k] * 8 > WEAK_BYTES)
            return -1; /* nothing marked */
    for (size_t k = 0; k < n && why; k++) {
        uint32_t word = words[k];
        uint64_t bit = 1ull << ((word - 1) % 64);
        uint64_t was = atomic_fetch_or(&l->weak[(word - 1) / 64], bit);
        if (was & bit)
            continue;
        ooc_stats_add(OOC_STAT_weak_by_replay, 1);
        OOC_LOG_I("%s: parameter byte %u %s; from now on what it points at is made resident but "
                  "is not part of the launch's identity (a pointer the kernel does not always "
                  "use)",
                  ooc_fnname_of(a->fn), (word - 1) * 8, why);
    }
    return 0;
}

int ooc_launch_layout(CUfunction f, unsigned *n, const uint32_t **off, const uint32_t **size) {
    const layout_t *l = layout_of(f);
    if (!l || !l->known)
        return -1;
    *n = l->n;
    *off = l->offset;
    *size = l->size;
    return 0;
}
