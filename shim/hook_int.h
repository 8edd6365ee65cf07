/* SPDX-License-Identifier: MIT */
/* hook_int.h: what the files of hooks share (hooks.c, copy2d.c, memop.c, tensormap.c): whether
 * the shim manages memory, the access set's start, a batch part's size, and RUN_OP, the one way a
 * hook runs an operation (op.c's sequence, or the capture of a graph). */
#ifndef OOC_HOOK_INT_H
#define OOC_HOOK_INT_H

#include "shim.h"

/* Are we managing memory (mode not off, device set up)? */
static inline int managing(void) {
    return atomic_load_explicit(&ooc_mode_now, memory_order_relaxed) != OOC_MODE_OFF;
}

/* Runs `call` with the access set `a` resident on `stream`. While some stream captures (one
 * relaxed load when none does), an op on a capturing stream is captured, not run: its access set
 * goes to the capture and `call` is made as is. An op whose chunks are all resident and stable
 * is issued on the fast path, without the residency lock (fastpath.c); any other, and every op
 * while recording or replaying, takes the lock. The sequence is op.c's. */
#define RUN_OP(a, stream, ptds, call)                                                              \
    do {                                                                                           \
        if (OOC_UNLIKELY(atomic_load_explicit(&ooc_graph_captures, memory_order_relaxed))) {       \
            int cap_ = 0;                                                                          \
            CUresult c_ = ooc_graph_capture_note((a), (stream), (ptds), &cap_);                    \
            if (c_ != CUDA_SUCCESS)                                                                \
                return c_;                                                                         \
            if (cap_)                                                                              \
                return (call);                                                                     \
        }                                                                                          \
        ooc_live_op_t op_;                                                                         \
        CUresult r_ = ooc_op_begin(&op_, (a), (stream), (ptds));                                   \
        if (r_ == CUDA_SUCCESS)                                                                    \
            r_ = (call);                                                                           \
        return ooc_op_end(&op_, r_);                                                               \
    } while (0)

/* Starts the access set of a copy or set named `name`. */
static inline void op_start(ooc_access_t *a, int kind, const char *name, size_t bytes) {
    a->n = 0;
    a->overflow = 0;
    a->kind = kind;
    a->fn = NULL;
    a->name = name;
    a->bytes = bytes;
    for (int i = 0; i < 3; i++)
        a->grid[i] = a->block[i] = 0;
}

/* Returns from the hook with `call`'s result unless it is CUDA_SUCCESS. */
#define ACCESS_OR_RETURN(call)                                                                     \
    do {                                                                                           \
        CUresult ar_ = (call);                                                                     \
        if (ar_ != CUDA_SUCCESS)                                                                   \
            return ar_;                                                                            \
    } while (0)

/* Chunks that the buffers of ours [p, p + n) overlaps need resident: an upper bound, used to cut
 * a wide batch into parts that fit the budget. Takes the residency lock per buffer looked up. */
static inline uint64_t range_chunks(uintptr_t p, size_t n, uint64_t chunk) {
    uint64_t c = 0;
    uintptr_t end = p + (n ? n : 1), base;
    size_t size;
    while (p < end && ooc_mem_owns(p) && ooc_mem_lookup(p, &base, &size) == 0) {
        c += (size + chunk - 1) / chunk + 1; /* + 1: a small buffer need not start a chunk */
        p = base + size;
    }
    return c;
}

/* The access set of a 3D copy (copy2d.c): each device side of ours, range-checked. */
CUresult ooc_copy3d_access(ooc_access_t *a, const char *name, const CUDA_MEMCPY3D *p);
/* The access set of a memset of h rows of w elements of `elem` bytes, `pitch` bytes apart
 * (hooks.c); CUDA_ERROR_INVALID_VALUE when the range is not in one live buffer. */
CUresult ooc_set_access(ooc_access_t *a, const char *name, CUdeviceptr d, size_t pitch, size_t w,
                        size_t h, size_t elem);

#endif
