/* SPDX-License-Identifier: MIT */
/* hooks.c: the intercepted driver entry points (hooks.def). A hook holds no policy: it gathers
 * what the operation touches, runs it through op.c's sequence (record, replay, residency on the
 * operation's stream order), calls the real function, and hands op.c the result.
 *
 * On a stream that is capturing a graph (graph.c), an operation does not run: its hook notes
 * what it touches in the capture and calls the real function, nothing more. A graph launch is
 * one operation that touches everything its graph does.
 *
 * In OOC_MODE=off, before the device is set up, or for memory that is not ours, a hook forwards
 * the call unchanged. Driver errors pass through unchanged. Each hook is checked against its
 * cudaTypedefs.h type (shim.h) and exported under the driver's name (OOC_EXPORT_HOOK). */
#include "hook_int.h"

#include <string.h>

/* ---- allocation ------------------------------------------------------------------------------ */

/* Graph memory nodes (cuMemAllocAsync and cuMemFreeAsync captured into a graph) are not
 * supported: the shim's allocations are not ordered in a graph. Refused on a capturing stream
 * (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, logged) rather than turned into something else. */
static CUresult refuse_in_capture(const char *what, CUstream s, int ptds) {
    if (OOC_LIKELY(!atomic_load_explicit(&ooc_graph_captures, memory_order_relaxed)))
        return CUDA_SUCCESS;
    int cap = 0;
    CUresult r = ooc_graph_capture_note(NULL, s, ptds, &cap);
    if (r == CUDA_SUCCESS && cap) {
        OOC_LOG_E("%s on a capturing stream: graph memory nodes are not supported under the shim",
                  what);
        r = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    return r;
}

/* cuMemAlloc and cuMemFree are unsafe while a stream captures: the real driver refuses them in
 * a global-mode capture (any thread) or a thread-local one (its thread), and invalidates that
 * capture, so that a graph never replays into memory freed or allocated behind it. The shim's
 * memory never reaches the driver, so while any capture it follows is in progress it asks the
 * driver itself: a real one-byte allocation, freed at once, gets the same answer and the same
 * invalidation (a device too full for the probe is let through: not a capture question). */
static CUresult capture_unsafe(const char *what) {
    if (OOC_LIKELY(!atomic_load_explicit(&ooc_graph_captures, memory_order_relaxed)) ||
        !ooc_real.cuMemAlloc_v2 || !ooc_real.cuMemFree_v2)
        return CUDA_SUCCESS;
    CUdeviceptr probe = 0;
    CUresult r = ooc_real.cuMemAlloc_v2(&probe, 1);
    if (r == CUDA_SUCCESS) {
        ooc_real.cuMemFree_v2(probe);
        return CUDA_SUCCESS;
    }
    if (r == CUDA_ERROR_OUT_OF_MEMORY)
        return CUDA_SUCCESS;
    OOC_LOG_I("%s while a stream captures: %s, as the driver answers", what, ooc_real_errname(r));
    return r;
}

static CUresult alloc(CUdeviceptr *p, size_t size) {
    CUresult r = ooc_device_init();
    if (r != CUDA_SUCCESS)
        return r;
    uint64_t id;
    r = ooc_mem_alloc(p, size, &id); /* counted there, with its sizes */
    if (r == CUDA_SUCCESS)
        ooc_mem_back_new((uintptr_t)*p);
    if (r == CUDA_SUCCESS && ooc_record_on())
        ooc_record_alloc(id, size);
    return r;
}

CUresult ooc_hook_cuMemAlloc_v2(CUdeviceptr *p, size_t size) {
    OOC_NEED_REAL(cuMemAlloc_v2);
    if (!managing())
        return ooc_real.cuMemAlloc_v2(p, size);
    CUresult r = capture_unsafe("cuMemAlloc");
    return r == CUDA_SUCCESS ? alloc(p, size) : r;
}
OOC_EXPORT_HOOK(cuMemAlloc_v2, PFN_cuMemAlloc_v3020);

CUresult ooc_hook_cuMemAllocPitch_v2(CUdeviceptr *p, size_t *pitch, size_t w, size_t h,
                                     unsigned int elem) {
    OOC_NEED_REAL(cuMemAllocPitch_v2);
    if (!managing())
        return ooc_real.cuMemAllocPitch_v2(p, pitch, w, h, elem);
    CUresult r = capture_unsafe("cuMemAllocPitch");
    if (r != CUDA_SUCCESS)
        return r;
    if (!pitch || (elem != 4 && elem != 8 && elem != 16) || w == 0 || h == 0)
        return CUDA_ERROR_INVALID_VALUE;
    size_t pt = (w + 511) & ~(size_t)511;
    if (h > SIZE_MAX / pt)
        return CUDA_ERROR_INVALID_VALUE;
    *pitch = pt;
    return alloc(p, pt * h);
}
OOC_EXPORT_HOOK(cuMemAllocPitch_v2, PFN_cuMemAllocPitch_v3020);

/* Stream-ordered allocation: our memory is usable by every stream at once, which is a valid
 * (earlier) point of the stream order. The pool argument is ignored: the shim is the pool. */
CUresult ooc_hook_cuMemAllocAsync(CUdeviceptr *p, size_t size, CUstream s) {
    OOC_NEED_REAL(cuMemAllocAsync);
    if (!managing())
        return ooc_real.cuMemAllocAsync(p, size, s);
    CUresult r = refuse_in_capture("cuMemAllocAsync", s, 0);
    return r == CUDA_SUCCESS ? alloc(p, size) : r;
}
OOC_EXPORT_HOOK(cuMemAllocAsync, PFN_cuMemAllocAsync_v11020);

CUresult ooc_hook_cuMemAllocAsync_ptsz(CUdeviceptr *p, size_t size, CUstream s) {
    OOC_NEED_REAL(cuMemAllocAsync_ptsz);
    if (!managing())
        return ooc_real.cuMemAllocAsync_ptsz(p, size, s);
    CUresult r = refuse_in_capture("cuMemAllocAsync", s, 1);
    return r == CUDA_SUCCESS ? alloc(p, size) : r;
}
OOC_EXPORT_HOOK(cuMemAllocAsync_ptsz, PFN_cuMemAllocAsync_v11020_ptsz);

CUresult ooc_hook_cuMemAllocFromPoolAsync(CUdeviceptr *p, size_t size, CUmemoryPool pool,
                                          CUstream s) {
    OOC_NEED_REAL(cuMemAllocFromPoolAsync);
    if (!managing())
        return ooc_real.cuMemAllocFromPoolAsync(p, size, pool, s);
    CUresult r = refuse_in_capture("cuMemAllocFromPoolAsync", s, 0);
    return r == CUDA_SUCCESS ? alloc(p, size) : r;
}
OOC_EXPORT_HOOK(cuMemAllocFromPoolAsync, PFN_cuMemAllocFromPoolAsync_v11020);

CUresult ooc_hook_cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *p, size_t size, CUmemoryPool pool,
                                               CUstream s) {
    OOC_NEED_REAL(cuMemAllocFromPoolAsync_ptsz);
    if (!managing())
        return ooc_real.cuMemAllocFromPoolAsync_ptsz(p, size, pool, s);
    CUresult r = refuse_in_capture("cuMemAllocFromPoolAsync", s, 1);
    return r == CUDA_SUCCESS ? alloc(p, size) : r;
}
OOC_EXPORT_HOOK(cuMemAllocFromPoolAsync_ptsz, PFN_cuMemAllocFromPoolAsync_v11020_ptsz);

/* Frees never synchronise: mem.c reuses the memory once its users' work has completed. */
static CUresult free_ours(CUdeviceptr p, CUstream s) {
    if (ooc_replay_on())
        ooc_replay_before_free(p, s);
    ooc_shadow_freed((uintptr_t)p); /* before its address can be reused */
    uint64_t id;
    CUresult r = ooc_mem_free(p, s, &id); /* counted there */
    if (r == CUDA_SUCCESS && ooc_record_on())
        ooc_record_free(id);
    return r;
}

CUresult ooc_hook_cuMemFree_v2(CUdeviceptr p) {
    OOC_NEED_REAL(cuMemFree_v2);
    if (p == 0)
        return CUDA_SUCCESS;
    if (!ooc_mem_owns((uintptr_t)p))
        return ooc_real.cuMemFree_v2(p);
    CUresult r = capture_unsafe("cuMemFree");
    return r == CUDA_SUCCESS ? free_ours(p, NULL) : r;
}
OOC_EXPORT_HOOK(cuMemFree_v2, PFN_cuMemFree_v3020);

CUresult ooc_hook_cuMemFreeAsync(CUdeviceptr p, CUstream s) {
    OOC_NEED_REAL(cuMemFreeAsync);
    if (!ooc_mem_owns((uintptr_t)p))
        return ooc_real.cuMemFreeAsync(p, s);
    CUresult r = refuse_in_capture("cuMemFreeAsync", s, 0);
    return r == CUDA_SUCCESS ? free_ours(p, s) : r;
}
OOC_EXPORT_HOOK(cuMemFreeAsync, PFN_cuMemFreeAsync_v11020);

CUresult ooc_hook_cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream s) {
    OOC_NEED_REAL(cuMemFreeAsync_ptsz);
    if (!ooc_mem_owns((uintptr_t)p))
        return ooc_real.cuMemFreeAsync_ptsz(p, s);
    CUresult r = refuse_in_capture("cuMemFreeAsync", s, 1);
    return r == CUDA_SUCCESS ? free_ours(p, s ? s : CU_STREAM_PER_THREAD) : r;
}
OOC_EXPORT_HOOK(cuMemFreeAsync_ptsz, PFN_cuMemFreeAsync_v11020_ptsz);

/* The program sees the budget as the device's memory, and as free what the shim could make
 * free: the budget less the program's own VMM memory (every buffer of ours can be swapped out).
 * cuDNN and XLA size workspaces from it: a figure that moved with residency would change their
 * choices (and the iteration's shape) from step to step. */
CUresult ooc_hook_cuMemGetInfo_v2(size_t *free_b, size_t *total_b) {
    OOC_NEED_REAL(cuMemGetInfo_v2);
    if (!managing() || ooc_device_init() != CUDA_SUCCESS)
        return ooc_real.cuMemGetInfo_v2(free_b, total_b);
    if (!free_b || !total_b)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t budget, held;
    ooc_mem_info(&budget, &held);
    *total_b = budget;
    *free_b = budget > held ? budget - held : 0;
    return CUDA_SUCCESS;
}
OOC_EXPORT_HOOK(cuMemGetInfo_v2, PFN_cuMemGetInfo_v3020);

/* The program's own physical allocations (NCCL makes its buffers this way) are not ours to
 * move, but device-located ones count against the budget. */
CUresult ooc_hook_cuMemCreate(CUmemGenericAllocationHandle *h, size_t size,
                              const CUmemAllocationProp *prop, unsigned long long flags) {
    OOC_NEED_REAL(cuMemCreate);
    if (!managing() || !h || !prop || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
        ooc_device_init() != CUDA_SUCCESS)
        return ooc_real.cuMemCreate(h, size, prop, flags);
    return ooc_mem_external_create(h, size, prop, flags);
}
OOC_EXPORT_HOOK(cuMemCreate, PFN_cuMemCreate_v10020);

CUresult ooc_hook_cuMemRelease(CUmemGenericAllocationHandle h) {
    OOC_NEED_REAL(cuMemRelease);
    CUresult r = ooc_real.cuMemRelease(h);
    if (r == CUDA_SUCCESS && managing())
        ooc_mem_external_release(h);
    return r;
}
OOC_EXPORT_HOOK(cuMemRelease, PFN_cuMemRelease_v10020);

/* ---- launches -------------------------------------------------------------------------------- */

/* The real launch of `kind`, grid g and block b. */
static CUresult real_launch(CUfunction f, CUstream s, int ptds, void **params, void **extra,
                            const CUlaunchConfig *cfg, ooc_launch_kind_t kind, const unsigned *g,
                            const unsigned *b, unsigned shared) {
    switch (kind) {
    case OOC_LAUNCH_KERNEL:
        return (ptds ? ooc_real.cuLaunchKernel_ptsz : ooc_real.cuLaunchKernel)(
            f, g[0], g[1], g[2], b[0], b[1], b[2], shared, s, params, extra);
    case OOC_LAUNCH_KERNEL_EX:
        return (ptds ? ooc_real.cuLaunchKernelEx_ptsz : ooc_real.cuLaunchKernelEx)(cfg, f, params,
                                                                                   extra);
    default:
        return (ptds ? ooc_real.cuLaunchCooperativeKernel_ptsz
                     : ooc_real.cuLaunchCooperativeKernel)(f, g[0], g[1], g[2], b[0], b[1], b[2],
                                                           shared, s, params);
    }
}

/* Issues a launch whose access set is `a`. */
static CUresult issue_launch(ooc_access_t *a, CUfunction f, CUstream s, int ptds, void **params,
                             void **extra, const CUlaunchConfig *cfg, ooc_launch_kind_t kind,
                             unsigned shared) {
    RUN_OP(a, s, ptds,
           real_launch(f, s, ptds, params, extra, cfg, kind, a->grid, a->block, shared));
}

/* A kernel launch: what it touches, then the launch itself (recompute.c verifies it around the
 * launch while recording; replay.c may save it, through ooc_launch_now, to issue it again). */
static CUresult launch_op(CUfunction f, CUstream s, int ptds, void **params, void **extra,
                          const CUlaunchConfig *cfg, ooc_launch_kind_t kind, unsigned gx,
                          unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                          unsigned shared) {
    ooc_access_t a;
    a.n = 0;
    a.overflow = 0;
    a.kind = OOC_OP_KERNEL;
    a.fn = f;
    a.name = NULL;
    a.bytes = 0;
    if (cfg) {
        gx = cfg->gridDimX, gy = cfg->gridDimY, gz = cfg->gridDimZ;
        bx = cfg->blockDimX, by = cfg->blockDimY, bz = cfg->blockDimZ;
    }
    a.grid[0] = gx, a.grid[1] = gy, a.grid[2] = gz;
    a.block[0] = bx, a.block[1] = by, a.block[2] = bz;
    /* What the driver refuses without launching (no function, an empty grid or block) goes to
     * it as is: nothing is made resident, recorded or verified. */
    if (!f || !gx || !gy || !gz || !bx || !by || !bz)
        return real_launch(f, s, ptds, params, extra, cfg, kind, a.grid, a.block, shared);
    ooc_stats_add(OOC_STAT_launches, 1);
    ooc_launch_access(f, params, extra, &a);
    ooc_launch_t l = {.fn = f,
                      .grid = {gx, gy, gz},
                      .block = {bx, by, bz},
                      .shared = cfg ? cfg->sharedMemBytes : shared,
                      .kind = kind,
                      .cfg = cfg,
                      .params = params,
                      .extra = extra};
    /* The per-thread default stream, as the shim's own launches name it. */
    CUstream st = (ptds && s == NULL) ? CU_STREAM_PER_THREAD : s;
    ooc_verify_t v;
    ooc_verify_pre(&v, &l, &a, st);
    ooc_launch_now = &l;
    (void)ooc_mem_op_word_hits(); /* what an earlier op of this thread left is not this one's */
    CUresult r = issue_launch(&a, f, s, ptds, params, extra, cfg, kind, shared);
    ooc_launch_now = NULL;
    const ooc_word_hit_t *hits = ooc_mem_op_word_hits(); /* before verify_post's own op */
    if (hits)
        ooc_launch_learn_words(f, &a, hits);
    ooc_verify_post(&v, &l, st, r);
    return r;
}

CUresult ooc_hook_cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                 unsigned by, unsigned bz, unsigned shared, CUstream s,
                                 void **params, void **extra) {
    OOC_NEED_REAL(cuLaunchKernel);
    if (!managing())
        return ooc_real.cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shared, s, params, extra);
    return launch_op(f, s, 0, params, extra, NULL, OOC_LAUNCH_KERNEL, gx, gy, gz, bx, by, bz,
                     shared);
}
OOC_EXPORT_HOOK(cuLaunchKernel, PFN_cuLaunchKernel_v4000);

CUresult ooc_hook_cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                      unsigned bx, unsigned by, unsigned bz, unsigned shared,
                                      CUstream s, void **params, void **extra) {
    OOC_NEED_REAL(cuLaunchKernel_ptsz);
    if (!managing())
        return ooc_real.cuLaunchKernel_ptsz(f, gx, gy, gz, bx, by, bz, shared, s, params, extra);
    return launch_op(f, s, 1, params, extra, NULL, OOC_LAUNCH_KERNEL, gx, gy, gz, bx, by, bz,
                     shared);
}
OOC_EXPORT_HOOK(cuLaunchKernel_ptsz, PFN_cuLaunchKernel_v7000_ptsz);

CUresult ooc_hook_cuLaunchKernelEx(const CUlaunchConfig *cfg, CUfunction f, void **params,
                                   void **extra) {
    OOC_NEED_REAL(cuLaunchKernelEx);
    if (!managing() || !cfg)
        return ooc_real.cuLaunchKernelEx(cfg, f, params, extra);
    return launch_op(f, cfg->hStream, 0, params, extra, cfg, OOC_LAUNCH_KERNEL_EX, 0, 0, 0, 0, 0, 0,
                     0);
}
OOC_EXPORT_HOOK(cuLaunchKernelEx, PFN_cuLaunchKernelEx_v11060);

CUresult ooc_hook_cuLaunchKernelEx_ptsz(const CUlaunchConfig *cfg, CUfunction f, void **params,
                                        void **extra) {
    OOC_NEED_REAL(cuLaunchKernelEx_ptsz);
    if (!managing() || !cfg)
        return ooc_real.cuLaunchKernelEx_ptsz(cfg, f, params, extra);
    return launch_op(f, cfg->hStream, 1, params, extra, cfg, OOC_LAUNCH_KERNEL_EX, 0, 0, 0, 0, 0, 0,
                     0);
}
OOC_EXPORT_HOOK(cuLaunchKernelEx_ptsz, PFN_cuLaunchKernelEx_v11060_ptsz);

CUresult ooc_hook_cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                            unsigned bx, unsigned by, unsigned bz, unsigned shared,
                                            CUstream s, void **params) {
    OOC_NEED_REAL(cuLaunchCooperativeKernel);
    if (!managing())
        return ooc_real.cuLaunchCooperativeKernel(f, gx, gy, gz, bx, by, bz, shared, s, params);
    return launch_op(f, s, 0, params, NULL, NULL, OOC_LAUNCH_COOPERATIVE, gx, gy, gz, bx, by, bz,
                     shared);
}
OOC_EXPORT_HOOK(cuLaunchCooperativeKernel, PFN_cuLaunchCooperativeKernel_v9000);

CUresult ooc_hook_cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned gx, unsigned gy,
                                                 unsigned gz, unsigned bx, unsigned by, unsigned bz,
                                                 unsigned shared, CUstream s, void **params) {
    OOC_NEED_REAL(cuLaunchCooperativeKernel_ptsz);
    if (!managing())
        return ooc_real.cuLaunchCooperativeKernel_ptsz(f, gx, gy, gz, bx, by, bz, shared, s,
                                                       params);
    return launch_op(f, s, 1, params, NULL, NULL, OOC_LAUNCH_COOPERATIVE, gx, gy, gz, bx, by, bz,
                     shared);
}
OOC_EXPORT_HOOK(cuLaunchCooperativeKernel_ptsz, PFN_cuLaunchCooperativeKernel_v9000_ptsz);

/* ---- copies ------------------------------------------------------------------------------------
 */

/* The access set of a copy: the buffers of ours that its two ranges overlap. Each range must lie
 * in one live buffer (ooc_mem_check_range): otherwise CUDA_ERROR_INVALID_VALUE, and nothing is
 * noted, made resident or recorded. */
static CUresult copy_access(ooc_access_t *a, const char *name, uintptr_t dst, uintptr_t src,
                            size_t n) {
    CUresult r = ooc_mem_check_range(name, dst, n);
    if (r == CUDA_SUCCESS)
        r = ooc_mem_check_range(name, src, n);
    if (r != CUDA_SUCCESS)
        return r;
    op_start(a, OOC_OP_MEMCPY, name, n);
    ooc_mem_note_range(a, dst, n, OOC_USE_W);
    ooc_mem_note_range(a, src, n, OOC_USE_R);
    return CUDA_SUCCESS;
}

#define SYNC_COPY(sym, pfn, ptds, DT, ST, how)                                                     \
    CUresult ooc_hook_##sym(DT dst, ST src, size_t n) {                                            \
        OOC_NEED_REAL(sym);                                                                        \
        if (!managing())                                                                           \
            return ooc_real.sym(dst, src, n);                                                      \
        ooc_access_t a;                                                                            \
        ACCESS_OR_RETURN(copy_access(&a, #sym, (uintptr_t)dst, (uintptr_t)src, n));                \
        uintptr_t sb_[2];                                                                          \
        ooc_shadow_buffer(how, (uintptr_t)dst, (uintptr_t)src, n, sb_);                            \
        if (how == OOC_SH_H2D)                                                                     \
            ooc_mem_note_stored((uintptr_t)dst, (const void *)(uintptr_t)src, n);                  \
        RUN_OP(&a, NULL, ptds,                                                                     \
               ooc_shadow_after(how, ooc_real.sym(dst, src, n), (uintptr_t)dst, (uintptr_t)src, n, \
                                sb_));                                                             \
    }                                                                                              \
    OOC_EXPORT_HOOK(sym, pfn)

SYNC_COPY(cuMemcpy, PFN_cuMemcpy_v4000, 0, CUdeviceptr, CUdeviceptr, OOC_SH_ANY);
SYNC_COPY(cuMemcpy_ptds, PFN_cuMemcpy_v7000_ptds, 1, CUdeviceptr, CUdeviceptr, OOC_SH_ANY);
SYNC_COPY(cuMemcpyHtoD_v2, PFN_cuMemcpyHtoD_v3020, 0, CUdeviceptr, const void *, OOC_SH_H2D);
SYNC_COPY(cuMemcpyHtoD_v2_ptds, PFN_cuMemcpyHtoD_v7000_ptds, 1, CUdeviceptr, const void *,
          OOC_SH_H2D);
SYNC_COPY(cuMemcpyDtoH_v2, PFN_cuMemcpyDtoH_v3020, 0, void *, CUdeviceptr, OOC_SH_NONE);
SYNC_COPY(cuMemcpyDtoH_v2_ptds, PFN_cuMemcpyDtoH_v7000_ptds, 1, void *, CUdeviceptr, OOC_SH_NONE);
SYNC_COPY(cuMemcpyDtoD_v2, PFN_cuMemcpyDtoD_v3020, 0, CUdeviceptr, CUdeviceptr, OOC_SH_D2D);
SYNC_COPY(cuMemcpyDtoD_v2_ptds, PFN_cuMemcpyDtoD_v7000_ptds, 1, CUdeviceptr, CUdeviceptr,
          OOC_SH_D2D);

#define ASYNC_COPY(sym, pfn, ptds, DT, ST, how)                                                    \
    CUresult ooc_hook_##sym(DT dst, ST src, size_t n, CUstream s) {                                \
        OOC_NEED_REAL(sym);                                                                        \
        if (!managing())                                                                           \
            return ooc_real.sym(dst, src, n, s);                                                   \
        ooc_access_t a;                                                                            \
        ACCESS_OR_RETURN(copy_access(&a, #sym, (uintptr_t)dst, (uintptr_t)src, n));                \
        uintptr_t sb_[2];                                                                          \
        ooc_shadow_buffer(how, (uintptr_t)dst, (uintptr_t)src, n, sb_);                            \
        if (how == OOC_SH_H2D)                                                                     \
            ooc_mem_note_stored((uintptr_t)dst, (const void *)(uintptr_t)src, n);                  \
        RUN_OP(&a, s, ptds,                                                                        \
               ooc_shadow_after(how, ooc_real.sym(dst, src, n, s), (uintptr_t)dst, (uintptr_t)src, \
                                n, sb_));                                                          \
    }                                                                                              \
    OOC_EXPORT_HOOK(sym, pfn)

ASYNC_COPY(cuMemcpyAsync, PFN_cuMemcpyAsync_v4000, 0, CUdeviceptr, CUdeviceptr, OOC_SH_ANY);
ASYNC_COPY(cuMemcpyAsync_ptsz, PFN_cuMemcpyAsync_v7000_ptsz, 1, CUdeviceptr, CUdeviceptr,
           OOC_SH_ANY);
ASYNC_COPY(cuMemcpyHtoDAsync_v2, PFN_cuMemcpyHtoDAsync_v3020, 0, CUdeviceptr, const void *,
           OOC_SH_H2D);
ASYNC_COPY(cuMemcpyHtoDAsync_v2_ptsz, PFN_cuMemcpyHtoDAsync_v7000_ptsz, 1, CUdeviceptr,
           const void *, OOC_SH_H2D);
ASYNC_COPY(cuMemcpyDtoHAsync_v2, PFN_cuMemcpyDtoHAsync_v3020, 0, void *, CUdeviceptr, OOC_SH_NONE);
ASYNC_COPY(cuMemcpyDtoHAsync_v2_ptsz, PFN_cuMemcpyDtoHAsync_v7000_ptsz, 1, void *, CUdeviceptr,
           OOC_SH_NONE);
ASYNC_COPY(cuMemcpyDtoDAsync_v2, PFN_cuMemcpyDtoDAsync_v3020, 0, CUdeviceptr, CUdeviceptr,
           OOC_SH_D2D);
ASYNC_COPY(cuMemcpyDtoDAsync_v2_ptsz, PFN_cuMemcpyDtoDAsync_v7000_ptsz, 1, CUdeviceptr, CUdeviceptr,
           OOC_SH_D2D);

/* ---- batched copies ----------------------------------------------------------------------------
 *
 * A batch is independent copies, so one too wide for a single op (more than OOC_MAX_REFS / 8
 * copies, which may reference more buffers than an access set holds) is issued as several
 * batches in order on the same stream, each as wide as fits both an access set and the budget:
 * the same copies, the same attributes, the same stream order. A
 * part's attributes are the caller's that cover its copies, their indices made relative to it.
 * When a part fails, the result is its error (and, for the 12.8 form, the index of the failing
 * copy in the caller's batch); parts already issued stay issued, as copies of a failed batch
 * before the failing one may have been done by the driver too. Arguments the driver would refuse
 * (null arrays, no copies, attribute indices that do not start at 0 or are not increasing) go to
 * it unsplit, so that it answers. */

typedef struct batch {
    const char *name;
    int ptds, v2;
    CUdeviceptr *d, *s;
    size_t *n, count;
    CUmemcpyAttributes *at;
    size_t *ai, na;
    size_t *fail; /* 12.8 form only */
    CUstream h;
    PFN_cuMemcpyBatchAsync_v12080 real12;
    PFN_cuMemcpyBatchAsync_v13000 real13;
} batch_t;

static void batch_access(ooc_access_t *a, const char *name, CUdeviceptr *d, CUdeviceptr *s,
                         size_t *n, size_t count) {
    size_t total = 0;
    for (size_t i = 0; d && s && n && i < count; i++)
        total += n[i];
    op_start(a, OOC_OP_MEMCPY, name, total);
    for (size_t i = 0; d && s && n && i < count; i++) {
        ooc_mem_note_range(a, (uintptr_t)d[i], n[i], OOC_USE_W);
        ooc_mem_note_range(a, (uintptr_t)s[i], n[i], OOC_USE_R);
    }
}

static CUresult batch_real(const batch_t *b, size_t lo, size_t cnt, CUmemcpyAttributes *at,
                           size_t *ai, size_t na, size_t *fail) {
    if (b->v2)
        return b->real13(b->d + lo, b->s + lo, b->n + lo, cnt, at, ai, na, b->h);
    return b->real12(b->d + lo, b->s + lo, b->n + lo, cnt, at, ai, na, fail, b->h);
}

/* Copies [lo, lo + cnt) of b as one op, with attributes at[0, na) at indices ai. */
static CUresult batch_op(const batch_t *b, size_t lo, size_t cnt, CUmemcpyAttributes *at,
                         size_t *ai, size_t na, size_t *fail) {
    ooc_access_t a;
    batch_access(&a, b->name, b->d + lo, b->s + lo, b->n + lo, cnt);
    RUN_OP(&a, b->h, b->ptds, batch_real(b, lo, cnt, at, ai, na, fail));
}

/* How many copies from lo on fit one op (at least one). */
static size_t batch_fit(const batch_t *b, size_t lo, uint64_t chunk, uint64_t budget_chunks) {
    uint64_t chunks = 0;
    unsigned refs = 0;
    size_t i = lo;
    for (; i < b->count; i++) {
        uint64_t c = range_chunks((uintptr_t)b->d[i], b->n[i], chunk) +
                     range_chunks((uintptr_t)b->s[i], b->n[i], chunk);
        /* A range may overlap several buffers: count each side as up to 4 queries. */
        if (i > lo && (chunks + c > budget_chunks || refs + 8 > OOC_MAX_REFS))
            break;
        chunks += c;
        refs += 8;
    }
    return i - lo;
}

static CUresult batch_run(const batch_t *b) {
    /* Every copy's ranges are checked before any part is issued, as the driver checks a batch. */
    for (size_t i = 0; b->d && b->s && b->n && i < b->count; i++) {
        CUresult r = ooc_mem_check_range(b->name, (uintptr_t)b->d[i], b->n[i]);
        if (r == CUDA_SUCCESS)
            r = ooc_mem_check_range(b->name, (uintptr_t)b->s[i], b->n[i]);
        if (r != CUDA_SUCCESS) {
            if (b->fail)
                *b->fail = i;
            return r;
        }
    }
    int valid = b->d && b->s && b->n && b->count && b->at && b->ai && b->na && b->na <= b->count &&
                b->ai[0] == 0;
    for (size_t k = 1; valid && k < b->na; k++)
        valid = b->ai[k] > b->ai[k - 1] && b->ai[k] < b->count;
    /* The driver refuses the legacy NULL stream and a bad srcAccessOrder: such a batch is given
     * to it whole, so that it refuses it before anything is copied. */
    valid = valid && b->h != CU_STREAM_LEGACY && (b->h || b->ptds);
    for (size_t k = 0; valid && k < b->na; k++)
        valid = b->at[k].srcAccessOrder >= CU_MEMCPY_SRC_ACCESS_ORDER_STREAM &&
                b->at[k].srcAccessOrder <= CU_MEMCPY_SRC_ACCESS_ORDER_ANY;
    /* One the driver refuses whole that is too wide for one op: answered here as the driver
     * answers it (an op could not hold its buffers to give it to the driver), nothing done. */
    if (!valid && b->d && b->s && b->n && b->count > OOC_MAX_REFS / 8) {
        if (b->fail)
            *b->fail = SIZE_MAX;
        return CUDA_ERROR_INVALID_VALUE;
    }
    /* A narrow batch (the common case) is one op, as before, without looking up its buffers
     * (a lookup takes the residency lock); only one that may not fit one access set is split. */
    valid = valid && b->count > OOC_MAX_REFS / 8;
    uint64_t chunk = 0, budget = 0;
    if (valid)
        ooc_mem_geometry(&chunk, &budget);
    size_t first = valid && chunk ? batch_fit(b, 0, chunk, budget / chunk) : b->count;
    if (first >= b->count)
        return batch_op(b, 0, b->count, b->at, b->ai, b->na, b->fail);
    size_t *ai = malloc(b->na * sizeof *ai);
    if (!ai)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = CUDA_SUCCESS;
    size_t k0 = 0; /* the attribute that covers copy lo */
    for (size_t lo = 0, cnt = first; lo < b->count && r == CUDA_SUCCESS;) {
        while (k0 + 1 < b->na && b->ai[k0 + 1] <= lo)
            k0++;
        size_t na = 0;
        for (size_t k = k0; k < b->na && b->ai[k] < lo + cnt; k++)
            ai[na++] = k == k0 ? 0 : b->ai[k] - lo;
        size_t fail = SIZE_MAX;
        r = batch_op(b, lo, cnt, b->at + k0, ai, na, &fail);
        if (r != CUDA_SUCCESS && b->fail)
            *b->fail = fail == SIZE_MAX ? SIZE_MAX : lo + fail;
        lo += cnt;
        if (lo < b->count)
            cnt = batch_fit(b, lo, chunk, budget / chunk);
    }
    free(ai);
    return r;
}

#define BATCH_12080(sym, pfn, ptds)                                                                \
    CUresult ooc_hook_##sym(CUdeviceptr *d, CUdeviceptr *s, size_t *n, size_t count,               \
                            CUmemcpyAttributes *at, size_t *ai, size_t na, size_t *fail,           \
                            CUstream h) {                                                          \
        OOC_NEED_REAL(sym);                                                                        \
        if (!managing())                                                                           \
            return ooc_real.sym(d, s, n, count, at, ai, na, fail, h);                              \
        batch_t b = {#sym, ptds, 0, d, s, n, count, at, ai, na, fail, h, ooc_real.sym, NULL};      \
        return batch_run(&b);                                                                      \
    }                                                                                              \
    OOC_EXPORT_HOOK(sym, pfn)

#define BATCH_13000(sym, pfn, ptds)                                                                \
    CUresult ooc_hook_##sym(CUdeviceptr *d, CUdeviceptr *s, size_t *n, size_t count,               \
                            CUmemcpyAttributes *at, size_t *ai, size_t na, CUstream h) {           \
        OOC_NEED_REAL(sym);                                                                        \
        if (!managing())                                                                           \
            return ooc_real.sym(d, s, n, count, at, ai, na, h);                                    \
        batch_t b = {#sym, ptds, 1, d, s, n, count, at, ai, na, NULL, h, NULL, ooc_real.sym};      \
        return batch_run(&b);                                                                      \
    }                                                                                              \
    OOC_EXPORT_HOOK(sym, pfn)

BATCH_12080(cuMemcpyBatchAsync, PFN_cuMemcpyBatchAsync_v12080, 0);
BATCH_12080(cuMemcpyBatchAsync_ptsz, PFN_cuMemcpyBatchAsync_v12080_ptsz, 1);
BATCH_13000(cuMemcpyBatchAsync_v2, PFN_cuMemcpyBatchAsync_v13000, 0);
BATCH_13000(cuMemcpyBatchAsync_v2_ptsz, PFN_cuMemcpyBatchAsync_v13000_ptsz, 1);

/* ---- sets ------------------------------------------------------------------------------------ */

/* The access set of a set of h rows of w elements of `elem` bytes, `pitch` bytes apart. Its range
 * must lie in one live buffer, as for a copy. Also graph set nodes' (graphnode.c). */
CUresult ooc_set_access(ooc_access_t *a, const char *name, CUdeviceptr d, size_t pitch, size_t w,
                        size_t h, size_t elem) {
    size_t span = 0, last = 0;
    if (w && h) {
        if (__builtin_mul_overflow(h - 1, pitch, &span) || __builtin_mul_overflow(w, elem, &last) ||
            __builtin_add_overflow(span, last, &span))
            return CUDA_ERROR_INVALID_VALUE;
        ACCESS_OR_RETURN(ooc_mem_check_range(name, (uintptr_t)d, span));
    }
    op_start(a, OOC_OP_MEMSET, name, w * h * elem);
    /* A 2D set with gaps between rows leaves the gaps as they were. */
    unsigned use = (h == 1 || pitch == w * elem) ? OOC_USE_W : OOC_USE_RW;
    if (span)
        ooc_mem_note_range(a, (uintptr_t)d, span, use);
    return CUDA_SUCCESS;
}

#define SET1(sym, pfn, ptds, elem, VT)                                                             \
    CUresult ooc_hook_##sym(CUdeviceptr d, VT v, size_t n) {                                       \
        OOC_NEED_REAL(sym);                                                                        \
        if (!managing())                                                                           \
            return ooc_real.sym(d, v, n);                                                          \
        ooc_access_t a;                                                                            \
        ACCESS_OR_RETURN(ooc_set_access(&a, #sym, d, n *elem, n, 1, elem));                        \
        RUN_OP(&a, NULL, ptds, ooc_real.sym(d, v, n));                                             \
    }                                                                                              \
    OOC_EXPORT_HOOK(sym, pfn)

SET1(cuMemsetD8_v2, PFN_cuMemsetD8_v3020, 0, 1, unsigned char);
SET1(cuMemsetD8_v2_ptds, PFN_cuMemsetD8_v7000_ptds, 1, 1, unsigned char);
SET1(cuMemsetD16_v2, PFN_cuMemsetD16_v3020, 0, 2, unsigned short);
SET1(cuMemsetD16_v2_ptds, PFN_cuMemsetD16_v7000_ptds, 1, 2, unsigned short);
SET1(cuMemsetD32_v2, PFN_cuMemsetD32_v3020, 0, 4, unsigned int);
SET1(cuMemsetD32_v2_ptds, PFN_cuMemsetD32_v7000_ptds, 1, 4, unsigned int);

#define SET1_ASYNC(sym, pfn, ptds, elem, VT)                                                       \
    CUresult ooc_hook_##sym(CUdeviceptr d, VT v, size_t n, CUstream s) {                           \
        OOC_NEED_REAL(sym);                                                                        \
        if (!managing())                                                                           \
            return ooc_real.sym(d, v, n, s);                                                       \
        ooc_access_t a;                                                                            \
        ACCESS_OR_RETURN(ooc_set_access(&a, #sym, d, n *elem, n, 1, elem));                        \
        RUN_OP(&a, s, ptds, ooc_real.sym(d, v, n, s));                                             \
    }                                                                                              \
    OOC_EXPORT_HOOK(sym, pfn)

SET1_ASYNC(cuMemsetD8Async, PFN_cuMemsetD8Async_v3020, 0, 1, unsigned char);
SET1_ASYNC(cuMemsetD8Async_ptsz, PFN_cuMemsetD8Async_v7000_ptsz, 1, 1, unsigned char);
SET1_ASYNC(cuMemsetD16Async, PFN_cuMemsetD16Async_v3020, 0, 2, unsigned short);
SET1_ASYNC(cuMemsetD16Async_ptsz, PFN_cuMemsetD16Async_v7000_ptsz, 1, 2, unsigned short);
SET1_ASYNC(cuMemsetD32Async, PFN_cuMemsetD32Async_v3020, 0, 4, unsigned int);
SET1_ASYNC(cuMemsetD32Async_ptsz, PFN_cuMemsetD32Async_v7000_ptsz, 1, 4, unsigned int);

#define SET2(sym, pfn, ptds, elem, VT)                                                             \
    CUresult ooc_hook_##sym(CUdeviceptr d, size_t pitch, VT v, size_t w, size_t h) {               \
        OOC_NEED_REAL(sym);                                                                        \
        if (!managing())                                                                           \
            return ooc_real.sym(d, pitch, v, w, h);                                                \
        ooc_access_t a;                                                                            \
        ACCESS_OR_RETURN(ooc_set_access(&a, #sym, d, pitch, w, h, elem));                          \
        RUN_OP(&a, NULL, ptds, ooc_real.sym(d, pitch, v, w, h));                                   \
    }                                                                                              \
    OOC_EXPORT_HOOK(sym, pfn)

SET2(cuMemsetD2D8_v2, PFN_cuMemsetD2D8_v3020, 0, 1, unsigned char);
SET2(cuMemsetD2D8_v2_ptds, PFN_cuMemsetD2D8_v7000_ptds, 1, 1, unsigned char);
SET2(cuMemsetD2D16_v2, PFN_cuMemsetD2D16_v3020, 0, 2, unsigned short);
SET2(cuMemsetD2D16_v2_ptds, PFN_cuMemsetD2D16_v7000_ptds, 1, 2, unsigned short);
SET2(cuMemsetD2D32_v2, PFN_cuMemsetD2D32_v3020, 0, 4, unsigned int);
SET2(cuMemsetD2D32_v2_ptds, PFN_cuMemsetD2D32_v7000_ptds, 1, 4, unsigned int);

#define SET2_ASYNC(sym, pfn, ptds, elem, VT)                                                       \
    CUresult ooc_hook_##sym(CUdeviceptr d, size_t pitch, VT v, size_t w, size_t h, CUstream s) {   \
        OOC_NEED_REAL(sym);                                                                        \
        if (!managing())                                                                           \
            return ooc_real.sym(d, pitch, v, w, h, s);                                             \
        ooc_access_t a;                                                                            \
        ACCESS_OR_RETURN(ooc_set_access(&a, #sym, d, pitch, w, h, elem));                          \
        RUN_OP(&a, s, ptds, ooc_real.sym(d, pitch, v, w, h, s));                                   \
    }                                                                                              \
    OOC_EXPORT_HOOK(sym, pfn)

SET2_ASYNC(cuMemsetD2D8Async, PFN_cuMemsetD2D8Async_v3020, 0, 1, unsigned char);
SET2_ASYNC(cuMemsetD2D8Async_ptsz, PFN_cuMemsetD2D8Async_v7000_ptsz, 1, 1, unsigned char);
SET2_ASYNC(cuMemsetD2D16Async, PFN_cuMemsetD2D16Async_v3020, 0, 2, unsigned short);
SET2_ASYNC(cuMemsetD2D16Async_ptsz, PFN_cuMemsetD2D16Async_v7000_ptsz, 1, 2, unsigned short);
SET2_ASYNC(cuMemsetD2D32Async, PFN_cuMemsetD2D32Async_v3020, 0, 4, unsigned int);
SET2_ASYNC(cuMemsetD2D32Async_ptsz, PFN_cuMemsetD2D32Async_v7000_ptsz, 1, 4, unsigned int);

/* ---- graphs ---------------------------------------------------------------------------------- */

/* Begins a capture the shim follows from the moment it exists (graph.c's lock is held across the
 * real call, so no op on the stream slips between them). */
#define BEGIN_CAPTURE(sym, ptds, s, call) BEGIN_CAPTURE_INTO(sym, ptds, s, NULL, call)
#define BEGIN_CAPTURE_INTO(sym, ptds, s, into, call)                                               \
    do {                                                                                           \
        OOC_NEED_REAL(sym);                                                                        \
        if (!managing())                                                                           \
            return (call);                                                                         \
        ooc_graph_lock();                                                                          \
        CUresult r_ = ooc_graph_capture_room((s), (ptds));                                         \
        if (r_ == CUDA_SUCCESS) {                                                                  \
            r_ = (call);                                                                           \
            if (r_ == CUDA_SUCCESS)                                                                \
                ooc_graph_capture_started((s), (ptds), (into));                                    \
        }                                                                                          \
        ooc_graph_unlock();                                                                        \
        return r_;                                                                                 \
    } while (0)

CUresult ooc_hook_cuStreamBeginCapture(CUstream s) {
    BEGIN_CAPTURE(cuStreamBeginCapture, 0, s, ooc_real.cuStreamBeginCapture(s));
}
OOC_EXPORT_HOOK(cuStreamBeginCapture, PFN_cuStreamBeginCapture_v10000);

CUresult ooc_hook_cuStreamBeginCapture_ptsz(CUstream s) {
    BEGIN_CAPTURE(cuStreamBeginCapture_ptsz, 1, s, ooc_real.cuStreamBeginCapture_ptsz(s));
}
OOC_EXPORT_HOOK(cuStreamBeginCapture_ptsz, PFN_cuStreamBeginCapture_v10000_ptsz);

CUresult ooc_hook_cuStreamBeginCapture_v2(CUstream s, CUstreamCaptureMode mode) {
    BEGIN_CAPTURE(cuStreamBeginCapture_v2, 0, s, ooc_real.cuStreamBeginCapture_v2(s, mode));
}
OOC_EXPORT_HOOK(cuStreamBeginCapture_v2, PFN_cuStreamBeginCapture_v10010);

CUresult ooc_hook_cuStreamBeginCapture_v2_ptsz(CUstream s, CUstreamCaptureMode mode) {
    BEGIN_CAPTURE(cuStreamBeginCapture_v2_ptsz, 1, s,
                  ooc_real.cuStreamBeginCapture_v2_ptsz(s, mode));
}
OOC_EXPORT_HOOK(cuStreamBeginCapture_v2_ptsz, PFN_cuStreamBeginCapture_v10010_ptsz);

/* A capture appended to an existing graph (XLA builds graphs this way): followed like any
 * capture, and what it touches is added to what the graph already touches. */
CUresult ooc_hook_cuStreamBeginCaptureToGraph(CUstream s, CUgraph g, const CUgraphNode *deps,
                                              const CUgraphEdgeData *edges, size_t ndeps,
                                              CUstreamCaptureMode mode) {
    BEGIN_CAPTURE_INTO(cuStreamBeginCaptureToGraph, 0, s, g,
                       ooc_real.cuStreamBeginCaptureToGraph(s, g, deps, edges, ndeps, mode));
}
OOC_EXPORT_HOOK(cuStreamBeginCaptureToGraph, PFN_cuStreamBeginCaptureToGraph_v12030);

CUresult ooc_hook_cuStreamBeginCaptureToGraph_ptsz(CUstream s, CUgraph g, const CUgraphNode *deps,
                                                   const CUgraphEdgeData *edges, size_t ndeps,
                                                   CUstreamCaptureMode mode) {
    BEGIN_CAPTURE_INTO(cuStreamBeginCaptureToGraph_ptsz, 1, s, g,
                       ooc_real.cuStreamBeginCaptureToGraph_ptsz(s, g, deps, edges, ndeps, mode));
}
OOC_EXPORT_HOOK(cuStreamBeginCaptureToGraph_ptsz, PFN_cuStreamBeginCaptureToGraph_v12030_ptsz);

/* Ends a capture: what its ops touch belongs to the graph. */
#define END_CAPTURE(sym, ptds, s, g)                                                               \
    do {                                                                                           \
        OOC_NEED_REAL(sym);                                                                        \
        if (!managing())                                                                           \
            return ooc_real.sym((s), (g));                                                         \
        ooc_graph_lock();                                                                          \
        CUresult r_ = ooc_real.sym((s), (g));                                                      \
        r_ = ooc_graph_capture_ended((s), (ptds), r_, (g));                                        \
        ooc_graph_unlock();                                                                        \
        return r_;                                                                                 \
    } while (0)

CUresult ooc_hook_cuStreamEndCapture(CUstream s, CUgraph *g) {
    END_CAPTURE(cuStreamEndCapture, 0, s, g);
}
OOC_EXPORT_HOOK(cuStreamEndCapture, PFN_cuStreamEndCapture_v10000);

CUresult ooc_hook_cuStreamEndCapture_ptsz(CUstream s, CUgraph *g) {
    END_CAPTURE(cuStreamEndCapture_ptsz, 1, s, g);
}
OOC_EXPORT_HOOK(cuStreamEndCapture_ptsz, PFN_cuStreamEndCapture_v10000_ptsz);

/* Instantiates: the executable graph gets what its graph touches. */
#define INSTANTIATE(sym, e, g, call)                                                               \
    do {                                                                                           \
        OOC_NEED_REAL(sym);                                                                        \
        if (!managing())                                                                           \
            return (call);                                                                         \
        ooc_graph_lock();                                                                          \
        CUresult r_ = (call);                                                                      \
        if (r_ == CUDA_SUCCESS && (e))                                                             \
            r_ = ooc_graph_instantiated((g), *(e));                                                \
        ooc_graph_unlock();                                                                        \
        return r_;                                                                                 \
    } while (0)

CUresult ooc_hook_cuGraphInstantiate(CUgraphExec *e, CUgraph g, CUgraphNode *err, char *log,
                                     size_t n) {
    INSTANTIATE(cuGraphInstantiate, e, g, ooc_real.cuGraphInstantiate(e, g, err, log, n));
}
OOC_EXPORT_HOOK(cuGraphInstantiate, PFN_cuGraphInstantiate_v10000);

CUresult ooc_hook_cuGraphInstantiate_v2(CUgraphExec *e, CUgraph g, CUgraphNode *err, char *log,
                                        size_t n) {
    INSTANTIATE(cuGraphInstantiate_v2, e, g, ooc_real.cuGraphInstantiate_v2(e, g, err, log, n));
}
OOC_EXPORT_HOOK(cuGraphInstantiate_v2, PFN_cuGraphInstantiate_v11000);

CUresult ooc_hook_cuGraphInstantiateWithFlags(CUgraphExec *e, CUgraph g, unsigned long long f) {
    INSTANTIATE(cuGraphInstantiateWithFlags, e, g, ooc_real.cuGraphInstantiateWithFlags(e, g, f));
}
OOC_EXPORT_HOOK(cuGraphInstantiateWithFlags, PFN_cuGraphInstantiateWithFlags_v11040);

CUresult ooc_hook_cuGraphInstantiateWithParams(CUgraphExec *e, CUgraph g,
                                               CUDA_GRAPH_INSTANTIATE_PARAMS *p) {
    INSTANTIATE(cuGraphInstantiateWithParams, e, g, ooc_real.cuGraphInstantiateWithParams(e, g, p));
}
OOC_EXPORT_HOOK(cuGraphInstantiateWithParams, PFN_cuGraphInstantiateWithParams_v12000);

CUresult ooc_hook_cuGraphInstantiateWithParams_ptsz(CUgraphExec *e, CUgraph g,
                                                    CUDA_GRAPH_INSTANTIATE_PARAMS *p) {
    INSTANTIATE(cuGraphInstantiateWithParams_ptsz, e, g,
                ooc_real.cuGraphInstantiateWithParams_ptsz(e, g, p));
}
OOC_EXPORT_HOOK(cuGraphInstantiateWithParams_ptsz, PFN_cuGraphInstantiateWithParams_v12000_ptsz);

CUresult ooc_hook_cuGraphExecDestroy(CUgraphExec e) {
    OOC_NEED_REAL(cuGraphExecDestroy);
    if (!managing())
        return ooc_real.cuGraphExecDestroy(e);
    ooc_graph_lock();
    CUresult r = ooc_real.cuGraphExecDestroy(e);
    if (r == CUDA_SUCCESS)
        ooc_graph_exec_destroyed(e);
    ooc_graph_unlock();
    return r;
}
OOC_EXPORT_HOOK(cuGraphExecDestroy, PFN_cuGraphExecDestroy_v10000);

CUresult ooc_hook_cuGraphDestroy(CUgraph g) {
    OOC_NEED_REAL(cuGraphDestroy);
    if (!managing())
        return ooc_real.cuGraphDestroy(g);
    ooc_graph_lock();
    CUresult r = ooc_real.cuGraphDestroy(g);
    if (r == CUDA_SUCCESS)
        ooc_graph_destroyed(g);
    ooc_graph_unlock();
    return r;
}
OOC_EXPORT_HOOK(cuGraphDestroy, PFN_cuGraphDestroy_v10000);

/* A graph launch is one operation on the launch stream that touches everything the graph does.
 * The recorder logs it as one kernel-kind op (it names kernels by function: "kernel"). */
static CUresult graph_launch(CUgraphExec e, CUstream s, int ptds) {
    if (!e) /* the driver refuses it: not an operation */
        return (ptds ? ooc_real.cuGraphLaunch_ptsz : ooc_real.cuGraphLaunch)(e, s);
    ooc_access_t a;
    op_start(&a, OOC_OP_KERNEL, "cuGraphLaunch", 0);
    CUresult r = ooc_graph_launch_access(e, &a);
    if (r != CUDA_SUCCESS)
        return r;
    RUN_OP(&a, s, ptds, (ptds ? ooc_real.cuGraphLaunch_ptsz : ooc_real.cuGraphLaunch)(e, s));
}

CUresult ooc_hook_cuGraphLaunch(CUgraphExec e, CUstream s) {
    OOC_NEED_REAL(cuGraphLaunch);
    if (!managing())
        return ooc_real.cuGraphLaunch(e, s);
    return graph_launch(e, s, 0);
}
OOC_EXPORT_HOOK(cuGraphLaunch, PFN_cuGraphLaunch_v10000);

CUresult ooc_hook_cuGraphLaunch_ptsz(CUgraphExec e, CUstream s) {
    OOC_NEED_REAL(cuGraphLaunch_ptsz);
    if (!managing())
        return ooc_real.cuGraphLaunch_ptsz(e, s);
    return graph_launch(e, s, 1);
}
OOC_EXPORT_HOOK(cuGraphLaunch_ptsz, PFN_cuGraphLaunch_v10000_ptsz);

/* ---- modules unloaded ---------------------------------------------------------------------------
 *
 * The driver may give a later function the handle value of one freed at an unload: before the
 * real unload, what the shim keeps per function is forgotten and the plan given up (op.c,
 * ooc_op_functions_gone; a rebuild still needs its function); the layouts and kernel names are
 * forgotten again after it, for a launch that asked in between. A program that unloads modules
 * in every iteration is never planned: it runs on demand residency. */

#define UNLOAD_HOOK(sym, pfn, T)                                                                   \
    CUresult ooc_hook_##sym(T h) {                                                                 \
        OOC_NEED_REAL(sym);                                                                        \
        if (!managing() || !h) /* a NULL handle is refused: nothing is unloaded */                 \
            return ooc_real.sym(h);                                                                \
        ooc_launch_forget_layouts();                                                               \
        ooc_op_functions_gone();                                                                   \
        CUresult r = ooc_real.sym(h);                                                              \
        ooc_launch_forget_layouts();                                                               \
        ooc_fnname_forget();                                                                       \
        return r;                                                                                  \
    }                                                                                              \
    OOC_EXPORT_HOOK(sym, pfn)

UNLOAD_HOOK(cuModuleUnload, PFN_cuModuleUnload_v2000, CUmodule);
UNLOAD_HOOK(cuLibraryUnload, PFN_cuLibraryUnload_v12000, CUlibrary);
