/* SPDX-License-Identifier: MIT */
/* copy2d.c: the hooks of pitched and peer copies (cuMemcpy2D*, cuMemcpy3D*, cuMemcpy3DBatchAsync,
 * cuMemcpyPeer*), as frameworks issue them for strided tensors (PyTorch's copy of a non-contiguous
 * view) and for staging through pitched host buffers.
 *
 * Each side of a copy whose memory type is device or unified, and whose pointer lies in the
 * shim's reservation, is one device range: from the first byte copied to the last, rows and
 * slices included, gaps between them too (the shim makes whole buffers resident anyway). The
 * range must lie in one live buffer, as for a plain copy (ooc_mem_check_range); a destination
 * with gaps between its rows keeps the gaps, so it is read-write for the planner. Arrays and
 * host sides are not the shim's. A side the driver would refuse (a zero extent, an unknown memory
 * type) is left to it. */
#include "hook_int.h"

/* One side of a 3D copy: its device pointer when it is device memory of ours, 0 otherwise. */
typedef struct side {
    uintptr_t base;
    size_t x, y, z, pitch, slice_rows;
} side_t;

static uintptr_t device_side(CUmemorytype t, CUdeviceptr d) {
    if (t != CU_MEMORYTYPE_DEVICE && t != CU_MEMORYTYPE_UNIFIED)
        return 0;
    return ooc_mem_owns((uintptr_t)d) ? (uintptr_t)d : 0;
}

/* One side's range, rows of w bytes, h rows a slice, d slices: its first byte's offset from the
 * base and its span. CUDA_SUCCESS, or CUDA_ERROR_INVALID_VALUE when it overflows. */
static CUresult side_span(const side_t *s, size_t w, size_t h, size_t d, size_t *first,
                          size_t *span) {
    size_t rows, last;
    if (__builtin_mul_overflow(s->z, s->slice_rows, &rows) ||
        __builtin_add_overflow(rows, s->y, &rows) ||
        __builtin_mul_overflow(rows, s->pitch, first) ||
        __builtin_add_overflow(*first, s->x, first) ||
        __builtin_mul_overflow(d - 1, s->slice_rows, &rows) ||
        __builtin_add_overflow(rows, h - 1, &rows) ||
        __builtin_mul_overflow(rows, s->pitch, span) || __builtin_add_overflow(*span, w, span) ||
        __builtin_add_overflow(s->base, *first, &last) ||
        __builtin_add_overflow(last, *span, &last))
        return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}

/* Notes one side's range, rows of w bytes, h rows a slice, d slices. CUDA_SUCCESS, or
 * CUDA_ERROR_INVALID_VALUE when it overflows or leaves its buffer. */
static CUresult note_side(ooc_access_t *a, const char *name, const side_t *s, size_t w, size_t h,
                          size_t d, unsigned use) {
    if (!s->base || !w || !h || !d)
        return CUDA_SUCCESS;
    size_t first, span;
    ACCESS_OR_RETURN(side_span(s, w, h, d, &first, &span));
    ACCESS_OR_RETURN(ooc_mem_check_range(name, s->base + first, span));
    /* Gaps between rows or slices are kept: a write is then a read-write. */
    if (use == OOC_USE_W && ((h > 1 && s->pitch != w) || (d > 1 && s->slice_rows != h)))
        use = OOC_USE_RW;
    ooc_mem_note_range(a, s->base + first, span, use);
    return CUDA_SUCCESS;
}

CUresult ooc_copy3d_access(ooc_access_t *a, const char *name, const CUDA_MEMCPY3D *p) {
    op_start(a, OOC_OP_MEMCPY, name, p->WidthInBytes * p->Height * p->Depth);
    side_t src = {device_side(p->srcMemoryType, p->srcDevice),
                  p->srcXInBytes,
                  p->srcY,
                  p->srcZ,
                  p->srcPitch,
                  p->srcHeight};
    side_t dst = {device_side(p->dstMemoryType, p->dstDevice),
                  p->dstXInBytes,
                  p->dstY,
                  p->dstZ,
                  p->dstPitch,
                  p->dstHeight};
    ACCESS_OR_RETURN(note_side(a, name, &src, p->WidthInBytes, p->Height, p->Depth, OOC_USE_R));
    return note_side(a, name, &dst, p->WidthInBytes, p->Height, p->Depth, OOC_USE_W);
}

static CUresult access_2d(ooc_access_t *a, const char *name, const CUDA_MEMCPY2D *p) {
    op_start(a, OOC_OP_MEMCPY, name, p->WidthInBytes * p->Height);
    side_t src = {device_side(p->srcMemoryType, p->srcDevice),
                  p->srcXInBytes,
                  p->srcY,
                  0,
                  p->srcPitch,
                  p->Height};
    side_t dst = {device_side(p->dstMemoryType, p->dstDevice),
                  p->dstXInBytes,
                  p->dstY,
                  0,
                  p->dstPitch,
                  p->Height};
    ACCESS_OR_RETURN(note_side(a, name, &src, p->WidthInBytes, p->Height, 1, OOC_USE_R));
    return note_side(a, name, &dst, p->WidthInBytes, p->Height, 1, OOC_USE_W);
}

#define COPY2D(sym, pfn, ptds, P, access)                                                          \
    CUresult ooc_hook_##sym(const P *p) {                                                          \
        OOC_NEED_REAL(sym);                                                                        \
        if (!managing() || !p)                                                                     \
            return ooc_real.sym(p);                                                                \
        ooc_access_t a;                                                                            \
        ACCESS_OR_RETURN(access(&a, #sym, p));                                                     \
        RUN_OP(&a, NULL, ptds, ooc_real.sym(p));                                                   \
    }                                                                                              \
    OOC_EXPORT_HOOK(sym, pfn)

#define COPY2D_ASYNC(sym, pfn, ptds, P, access)                                                    \
    CUresult ooc_hook_##sym(const P *p, CUstream s) {                                              \
        OOC_NEED_REAL(sym);                                                                        \
        if (!managing() || !p)                                                                     \
            return ooc_real.sym(p, s);                                                             \
        ooc_access_t a;                                                                            \
        ACCESS_OR_RETURN(access(&a, #sym, p));                                                     \
        RUN_OP(&a, s, ptds, ooc_real.sym(p, s));                                                   \
    }                                                                                              \
    OOC_EXPORT_HOOK(sym, pfn)

COPY2D(cuMemcpy2D_v2, PFN_cuMemcpy2D_v3020, 0, CUDA_MEMCPY2D, access_2d);
COPY2D(cuMemcpy2D_v2_ptds, PFN_cuMemcpy2D_v7000_ptds, 1, CUDA_MEMCPY2D, access_2d);
COPY2D(cuMemcpy2DUnaligned_v2, PFN_cuMemcpy2DUnaligned_v3020, 0, CUDA_MEMCPY2D, access_2d);
COPY2D(cuMemcpy2DUnaligned_v2_ptds, PFN_cuMemcpy2DUnaligned_v7000_ptds, 1, CUDA_MEMCPY2D,
       access_2d);
COPY2D_ASYNC(cuMemcpy2DAsync_v2, PFN_cuMemcpy2DAsync_v3020, 0, CUDA_MEMCPY2D, access_2d);
COPY2D_ASYNC(cuMemcpy2DAsync_v2_ptsz, PFN_cuMemcpy2DAsync_v7000_ptsz, 1, CUDA_MEMCPY2D, access_2d);
COPY2D(cuMemcpy3D_v2, PFN_cuMemcpy3D_v3020, 0, CUDA_MEMCPY3D, ooc_copy3d_access);
COPY2D(cuMemcpy3D_v2_ptds, PFN_cuMemcpy3D_v7000_ptds, 1, CUDA_MEMCPY3D, ooc_copy3d_access);
COPY2D_ASYNC(cuMemcpy3DAsync_v2, PFN_cuMemcpy3DAsync_v3020, 0, CUDA_MEMCPY3D, ooc_copy3d_access);
COPY2D_ASYNC(cuMemcpy3DAsync_v2_ptsz, PFN_cuMemcpy3DAsync_v7000_ptsz, 1, CUDA_MEMCPY3D,
             ooc_copy3d_access);

/* ---- peer copies: within the one device the shim manages, a plain copy ----------------------- */

static CUresult peer_access(ooc_access_t *a, const char *name, CUdeviceptr dst, CUdeviceptr src,
                            size_t n) {
    ACCESS_OR_RETURN(ooc_mem_check_range(name, (uintptr_t)dst, n));
    ACCESS_OR_RETURN(ooc_mem_check_range(name, (uintptr_t)src, n));
    op_start(a, OOC_OP_MEMCPY, name, n);
    ooc_mem_note_range(a, (uintptr_t)dst, n, OOC_USE_W);
    ooc_mem_note_range(a, (uintptr_t)src, n, OOC_USE_R);
    return CUDA_SUCCESS;
}

#define PEER(sym, pfn, ptds)                                                                       \
    CUresult ooc_hook_##sym(CUdeviceptr d, CUcontext dc, CUdeviceptr s, CUcontext sc, size_t n) {  \
        OOC_NEED_REAL(sym);                                                                        \
        if (!managing())                                                                           \
            return ooc_real.sym(d, dc, s, sc, n);                                                  \
        ooc_access_t a;                                                                            \
        ACCESS_OR_RETURN(peer_access(&a, #sym, d, s, n));                                          \
        RUN_OP(&a, NULL, ptds, ooc_real.sym(d, dc, s, sc, n));                                     \
    }                                                                                              \
    OOC_EXPORT_HOOK(sym, pfn)

#define PEER_ASYNC(sym, pfn, ptds)                                                                 \
    CUresult ooc_hook_##sym(CUdeviceptr d, CUcontext dc, CUdeviceptr s, CUcontext sc, size_t n,    \
                            CUstream st) {                                                         \
        OOC_NEED_REAL(sym);                                                                        \
        if (!managing())                                                                           \
            return ooc_real.sym(d, dc, s, sc, n, st);                                              \
        ooc_access_t a;                                                                            \
        ACCESS_OR_RETURN(peer_access(&a, #sym, d, s, n));                                          \
        RUN_OP(&a, st, ptds, ooc_real.sym(d, dc, s, sc, n, st));                                   \
    }                                                                                              \
    OOC_EXPORT_HOOK(sym, pfn)

PEER(cuMemcpyPeer, PFN_cuMemcpyPeer_v4000, 0);
PEER(cuMemcpyPeer_ptds, PFN_cuMemcpyPeer_v7000_ptds, 1);
PEER_ASYNC(cuMemcpyPeerAsync, PFN_cuMemcpyPeerAsync_v4000, 0);
PEER_ASYNC(cuMemcpyPeerAsync_ptsz, PFN_cuMemcpyPeerAsync_v7000_ptsz, 1);

/* ---- batched 3D copies (cuMemcpy3DBatchAsync) -------------------------------------------------
 *
 * Each op of the batch is a 3D copy between two operands. A pointer operand of ours is one range
 * from its first byte to its last (rows rowLength bytes apart, layers layerHeight rows apart, 0
 * meaning packed by the extent), range-checked as for cuMemcpy3D; an array is never ours. A
 * pointer copied to or from an array counts its extent in the array's elements, whose size the
 * shim does not know: its first byte is checked and its whole buffer noted (read, or read-write).
 * Every op's ranges are checked before any part is issued; a batch too wide for one access set is
 * issued as several batches in order on the same stream, as for cuMemcpyBatchAsync (hooks.c). An
 * op the driver refuses (a zero extent, a rowLength or layerHeight short of the extent, an operand
 * neither pointer nor array, a bad srcAccessOrder) is left to it, and its batch goes to it
 * unsplit so that it refuses the whole batch. */

typedef struct batch3d {
    const char *name;
    int ptds;
    CUDA_MEMCPY3D_BATCH_OP *ops;
    size_t count;
    size_t *fail; /* 12.8 form only */
    unsigned long long flags;
    CUstream h;
    PFN_cuMemcpy3DBatchAsync_v12080 real12;
    PFN_cuMemcpy3DBatchAsync_v13000 real13;
} batch3d_t;

/* Whether the driver takes op `o` (as far as the shim can tell without arrays' descriptors). */
static int op_well_formed(const CUDA_MEMCPY3D_BATCH_OP *o) {
    const CUextent3D *e = &o->extent;
    if (!e->width || !e->height || !e->depth || o->srcAccessOrder < 1 || o->srcAccessOrder > 3)
        return 0;
    const CUmemcpy3DOperand *sides[2] = {&o->src, &o->dst};
    for (int k = 0; k < 2; k++) {
        const CUmemcpy3DOperand *p = sides[k];
        if (p->type == CU_MEMCPY_OPERAND_TYPE_ARRAY)
            continue;
        if (p->type != CU_MEMCPY_OPERAND_TYPE_POINTER ||
            (p->op.ptr.rowLength && p->op.ptr.rowLength < e->width) ||
            (p->op.ptr.layerHeight && p->op.ptr.layerHeight < e->height))
            return 0;
    }
    return 1;
}

/* Checks and, when `a` is not NULL, notes operand `p` of op `o` (used as `use`). */
static CUresult operand_access(ooc_access_t *a, const char *name, const CUDA_MEMCPY3D_BATCH_OP *o,
                               const CUmemcpy3DOperand *p, unsigned use) {
    if (p->type != CU_MEMCPY_OPERAND_TYPE_POINTER)
        return CUDA_SUCCESS;
    uintptr_t base = device_side(CU_MEMORYTYPE_UNIFIED, p->op.ptr.ptr);
    if (!base)
        return CUDA_SUCCESS;
    if (o->src.type != o->dst.type) { /* to or from an array: the extent is not in bytes */
        ACCESS_OR_RETURN(ooc_mem_check_range(name, base, 1));
        if (a)
            ooc_mem_note_range(a, base, 1, use == OOC_USE_W ? OOC_USE_RW : use);
        return CUDA_SUCCESS;
    }
    const CUextent3D *e = &o->extent;
    side_t s = {base,
                0,
                0,
                0,
                p->op.ptr.rowLength ? p->op.ptr.rowLength : e->width,
                p->op.ptr.layerHeight ? p->op.ptr.layerHeight : e->height};
    if (a)
        return note_side(a, name, &s, e->width, e->height, e->depth, use);
    size_t first, span;
    ACCESS_OR_RETURN(side_span(&s, e->width, e->height, e->depth, &first, &span));
    return ooc_mem_check_range(name, base + first, span);
}

static CUresult batch3d_real(const batch3d_t *b, size_t lo, size_t cnt, size_t *fail) {
    if (b->real13)
        return b->real13(cnt, b->ops + lo, b->flags, b->h);
    return b->real12(cnt, b->ops + lo, fail, b->flags, b->h);
}

/* Ops [lo, lo + cnt) of b as one op of ours. */
static CUresult batch3d_op(const batch3d_t *b, size_t lo, size_t cnt, size_t *fail) {
    ooc_access_t a;
    size_t total = 0;
    for (size_t i = lo; i < lo + cnt; i++) {
        const CUextent3D *e = &b->ops[i].extent;
        total += e->width * e->height * e->depth;
    }
    op_start(&a, OOC_OP_MEMCPY, b->name, total);
    for (size_t i = lo; i < lo + cnt; i++) {
        const CUDA_MEMCPY3D_BATCH_OP *o = &b->ops[i];
        if (!op_well_formed(o))
            continue;
        ACCESS_OR_RETURN(operand_access(&a, b->name, o, &o->src, OOC_USE_R));
        ACCESS_OR_RETURN(operand_access(&a, b->name, o, &o->dst, OOC_USE_W));
    }
    RUN_OP(&a, b->h, b->ptds, batch3d_real(b, lo, cnt, fail));
}

/* Chunks that op o's operands of ours need resident: an upper bound. */
static uint64_t op_chunks(const CUDA_MEMCPY3D_BATCH_OP *o, uint64_t chunk) {
    uint64_t c = 0;
    const CUmemcpy3DOperand *sides[2] = {&o->src, &o->dst};
    for (int k = 0; k < 2; k++) {
        if (sides[k]->type != CU_MEMCPY_OPERAND_TYPE_POINTER)
            continue;
        side_t s = {sides[k]->op.ptr.ptr,
                    0,
                    0,
                    0,
                    sides[k]->op.ptr.rowLength ? sides[k]->op.ptr.rowLength : o->extent.width,
                    sides[k]->op.ptr.layerHeight ? sides[k]->op.ptr.layerHeight : o->extent.height};
        size_t first = 0, span = 1;
        if (o->src.type == o->dst.type)
            (void)side_span(&s, o->extent.width, o->extent.height, o->extent.depth, &first, &span);
        c += range_chunks(s.base + first, span, chunk);
    }
    return c;
}

static CUresult batch3d_run(const batch3d_t *b) {
    int valid = b->ops && b->count && !b->flags;
    /* Every op's ranges are checked before any part is issued, as the driver checks a batch. */
    for (size_t i = 0; valid && i < b->count; i++) {
        const CUDA_MEMCPY3D_BATCH_OP *o = &b->ops[i];
        if (!op_well_formed(o)) {
            valid = 0;
            break;
        }
        CUresult r = operand_access(NULL, b->name, o, &o->src, OOC_USE_R);
        if (r == CUDA_SUCCESS)
            r = operand_access(NULL, b->name, o, &o->dst, OOC_USE_W);
        if (r != CUDA_SUCCESS) {
            if (b->fail)
                *b->fail = i;
            return r;
        }
    }
    /* A narrow batch is one op, without looking up its buffers; a wide one is cut into parts
     * that fit an access set (up to 8 queries an op) and the budget. */
    uint64_t chunk = 0, budget = 0;
    if (valid && b->count > OOC_MAX_REFS / 8)
        ooc_mem_geometry(&chunk, &budget);
    if (!chunk)
        return batch3d_op(b, 0, b->count, b->fail);
    CUresult r = CUDA_SUCCESS;
    for (size_t lo = 0; lo < b->count && r == CUDA_SUCCESS;) {
        uint64_t chunks = 0;
        size_t i = lo;
        for (; i < b->count; i++) {
            uint64_t c = op_chunks(&b->ops[i], chunk);
            if (i > lo && (chunks + c > budget / chunk || (i - lo + 1) * 8 > OOC_MAX_REFS))
                break;
            chunks += c;
        }
        size_t fail = SIZE_MAX;
        r = batch3d_op(b, lo, i - lo, &fail);
        if (r != CUDA_SUCCESS && b->fail)
            *b->fail = fail == SIZE_MAX ? SIZE_MAX : lo + fail;
        lo = i;
    }
    return r;
}

#define BATCH3D_12080(sym, pfn, ptds)                                                              \
    CUresult ooc_hook_##sym(size_t n, CUDA_MEMCPY3D_BATCH_OP *ops, size_t *fail,                   \
                            unsigned long long flags, CUstream h) {                                \
        OOC_NEED_REAL(sym);                                                                        \
        if (!managing())                                                                           \
            return ooc_real.sym(n, ops, fail, flags, h);                                           \
        batch3d_t b = {#sym, ptds, ops, n, fail, flags, h, ooc_real.sym, NULL};                    \
        return batch3d_run(&b);                                                                    \
    }                                                                                              \
    OOC_EXPORT_HOOK(sym, pfn)

#define BATCH3D_13000(sym, pfn, ptds)                                                              \
    CUresult ooc_hook_##sym(size_t n, CUDA_MEMCPY3D_BATCH_OP *ops, unsigned long long flags,       \
                            CUstream h) {                                                          \
        OOC_NEED_REAL(sym);                                                                        \
        if (!managing())                                                                           \
            return ooc_real.sym(n, ops, flags, h);                                                 \
        batch3d_t b = {#sym, ptds, ops, n, NULL, flags, h, NULL, ooc_real.sym};                    \
        return batch3d_run(&b);                                                                    \
    }                                                                                              \
    OOC_EXPORT_HOOK(sym, pfn)

BATCH3D_12080(cuMemcpy3DBatchAsync, PFN_cuMemcpy3DBatchAsync_v12080, 0);
BATCH3D_12080(cuMemcpy3DBatchAsync_ptsz, PFN_cuMemcpy3DBatchAsync_v12080_ptsz, 1);
BATCH3D_13000(cuMemcpy3DBatchAsync_v2, PFN_cuMemcpy3DBatchAsync_v13000, 0);
BATCH3D_13000(cuMemcpy3DBatchAsync_v2_ptsz, PFN_cuMemcpy3DBatchAsync_v13000_ptsz, 1);
