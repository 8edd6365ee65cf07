/* SPDX-License-Identifier: MIT */
/* copy2d.c: the hooks of pitched and peer copies (cuMemcpy2D*, cuMemcpy3D*, cuMemcpyPeer*), as
 * frameworks issue them for strided tensors (PyTorch's copy of a non-contiguous view) and for
 * staging through pitched host buffers.
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

/* Notes one side's range, rows of w bytes, h rows a slice, d slices. CUDA_SUCCESS, or
 * CUDA_ERROR_INVALID_VALUE when it overflows or leaves its buffer. */
static CUresult note_side(ooc_access_t *a, const char *name, const side_t *s, size_t w, size_t h,
                          size_t d, unsigned use) {
    if (!s->base || !w || !h || !d)
        return CUDA_SUCCESS;
    size_t rows, first, span, last;
    if (__builtin_mul_overflow(s->z, s->slice_rows, &rows) ||
        __builtin_add_overflow(rows, s->y, &rows) ||
        __builtin_mul_overflow(rows, s->pitch, &first) ||
        __builtin_add_overflow(first, s->x, &first) ||
        __builtin_mul_overflow(d - 1, s->slice_rows, &rows) ||
        __builtin_add_overflow(rows, h - 1, &rows) ||
        __builtin_mul_overflow(rows, s->pitch, &span) || __builtin_add_overflow(span, w, &span) ||
        __builtin_add_overflow(s->base, first, &last))
        return CUDA_ERROR_INVALID_VALUE;
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
