/* SPDX-License-Identifier: MIT */
/* fc_copy.c: simulated copies and sets in every form (sync, Async, _ptds/_ptsz, batched, 2D and
 * 3D copies, batched 3D copies, peer copies within the one device, 2D sets of 8, 16 and 32 bits).
 *
 * Device ranges are validated when the call is made (CUDA_ERROR_INVALID_VALUE, as the driver
 * does for an unknown pointer) and again when the op runs (a range unmapped meanwhile is a
 * sticky CUDA_ERROR_ILLEGAL_ADDRESS). Pageable host memory behaves as on the driver: an async
 * copy from it is staged at call time, an async copy to it completes before the call returns.
 * Synchronous copies run on the default stream and wait; synchronous sets only queue.
 *
 * Timing model and statistics: a copy between two device-located ranges runs on the compute
 * engine at FAKECUDA_HBM_GBPS (read and write: twice the bytes) and counts as bytes_d2d; a copy
 * that crosses the link runs on the host-to-device or device-to-host engine at its bandwidth and
 * counts as bytes_h2d or bytes_d2h. Device virtual addresses mapped to host-located physical
 * memory (cuMemCreate with CU_MEM_LOCATION_TYPE_HOST or _HOST_NUMA) are host memory to the link:
 * a device-to-device copy between device- and host-located memory crosses it, as on a GPU, and
 * one between two host-located ranges does not touch it (like a host-to-host copy). A range
 * that straddles mappings is classified by the mapping at its start, when the copy is issued.
 *
 * Stream capture: copies and sets of device memory, pinned host memory and host-located mappings
 * are captured into the graph (each launch copies what the memory holds then). A captured device
 * address must be a device address (allocated or reserved) when captured, and mapped with the
 * access it needs when the graph runs (checked then, like a kernel's accesses): memory only
 * needs to be there when the graph uses it. Each launch classifies its copies again, by the
 * mappings of that time. A copy that involves pageable host memory, or a synchronous copy, on a
 * capturing stream is refused (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED) and invalidates the
 * capture. */
#include "fc_internal.h"

#include <stdlib.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

typedef enum { SIDE_PAGEABLE, SIDE_PINNED, SIDE_DEVICE } side_t;

static side_t side_of(uintptr_t p) {
    if (fc_mem_is_device(p))
        return SIDE_DEVICE;
    return fc_mem_is_pinned_host(p) ? SIDE_PINNED : SIDE_PAGEABLE;
}

typedef struct copy_one {
    uintptr_t dst, src;
    size_t n;
    side_t dside, sside;
    int dhost, shost; /* a device address mapped to host-located memory (at the range's start) */
    void *staged;     /* pageable source copied at call time */
} copy_one_t;

typedef struct copy_payload {
    size_t count;
    copy_one_t c[];
} copy_payload_t;

/* Copies at least this large are written around the host's caches (copy_bytes). */
#define STREAM_COPY_MIN (256u << 10)

/* The bytes of one copy. A copy engine's writes do not pass through the host's caches: a large
 * copy (a swapped chunk: 64 KiB to 2 MiB and more) is written here with non-temporal stores,
 * which also spares the cache lines' reads for ownership: the simulated copies of a replay were
 * a third of its CPU, all in memmove with ordinary stores (glibc streams only past 240 MiB on
 * these machines, from the L3 size the VM reports), and the engines' threads share 2 cores with
 * the program's. Overlapping ranges (a copy within one buffer) take memmove. */
static void copy_bytes(void *dst, const void *src, size_t n) {
#if defined(__SSE2__)
    uintptr_t d = (uintptr_t)dst, s = (uintptr_t)src;
    if (n >= STREAM_COPY_MIN && (d + n <= s || s + n <= d)) {
        size_t head = (16 - (d & 15)) & 15, body = (n - head) & ~(size_t)63;
        unsigned char *dp = (unsigned char *)dst;
        const unsigned char *sp = (const unsigned char *)src;
        memcpy(dp, sp, head);
        for (size_t i = head; i < head + body; i += 64) {
            __m128i a = _mm_loadu_si128((const __m128i *)(const void *)(sp + i));
            __m128i b = _mm_loadu_si128((const __m128i *)(const void *)(sp + i + 16));
            __m128i c = _mm_loadu_si128((const __m128i *)(const void *)(sp + i + 32));
            __m128i e = _mm_loadu_si128((const __m128i *)(const void *)(sp + i + 48));
            _mm_stream_si128((__m128i *)(void *)(dp + i), a);
            _mm_stream_si128((__m128i *)(void *)(dp + i + 16), b);
            _mm_stream_si128((__m128i *)(void *)(dp + i + 32), c);
            _mm_stream_si128((__m128i *)(void *)(dp + i + 48), e);
        }
        memcpy(dp + head + body, sp + head + body, n - head - body);
        _mm_sfence(); /* the streamed stores are visible before the copy completes */
        return;
    }
#endif
    memmove(dst, src, n);
}

static CUresult run_copy(fc_op_t *op) {
    copy_payload_t *p = op->payload;
    for (size_t i = 0; i < p->count; i++) {
        copy_one_t *c = &p->c[i];
        if ((c->dside != SIDE_PAGEABLE && fc_mem_check(c->dst, c->n, FC_ACC_RW) != 0) ||
            (c->sside != SIDE_PAGEABLE && !c->staged &&
             fc_mem_check(c->src, c->n, FC_ACC_READ) != 0)) {
            fc_warn("illegal address: %s of %zu bytes from %#lx to %#lx touches memory that is "
                    "not mapped with the needed access",
                    op->what, c->n, (unsigned long)c->src, (unsigned long)c->dst);
            FC_STAT(illegal_accesses, 1);
            return CUDA_ERROR_ILLEGAL_ADDRESS;
        }
        copy_bytes((void *)c->dst, c->staged ? c->staged : (const void *)c->src, c->n);
    }
    return CUDA_SUCCESS;
}

static void dispose_copy(fc_op_t *op) {
    copy_payload_t *p = op->payload;
    for (size_t i = 0; i < p->count; i++)
        free(p->c[i].staged);
    free(p);
}

static void account(fc_op_t *op, const copy_one_t *c);

/* One launch of a captured copy, classified by where its memory is located now. A captured copy
 * never has a staged source (pageable memory is refused in a capture). */
static int clone_copy(fc_op_t *dst, const fc_op_t *src) {
    const copy_payload_t *p = src->payload;
    size_t bytes = sizeof *p + p->count * sizeof(copy_one_t);
    copy_payload_t *q = malloc(bytes);
    if (!q)
        return -1;
    memcpy(q, p, bytes);
    dst->payload = q;
    dst->engine = FC_ENG_NONE;
    dst->model_ns = 0;
    dst->b_h2d = dst->b_d2h = dst->b_d2d = 0;
    for (size_t i = 0; i < q->count; i++) {
        copy_one_t *c = &q->c[i];
        c->staged = NULL;
        c->dhost = c->dside == SIDE_DEVICE && fc_mem_is_host_located(c->dst);
        c->shost = c->sside == SIDE_DEVICE && fc_mem_is_host_located(c->src);
        account(dst, c);
    }
    return 0;
}

/* Validates one copy at call time and fills c. expect_d/expect_s: the side a typed copy
 * (HtoD...) requires, or -1 for any. `captured`: the copy goes into a graph, so its device
 * ranges are checked when the graph runs. */
static CUresult prepare(copy_one_t *c, uintptr_t dst, uintptr_t src, size_t n, int expect_d,
                        int expect_s, int captured) {
    c->dst = dst;
    c->src = src;
    c->n = n;
    c->staged = NULL;
    c->dside = side_of(dst);
    c->sside = side_of(src);
    c->dhost = c->dside == SIDE_DEVICE && fc_mem_is_host_located(dst);
    c->shost = c->sside == SIDE_DEVICE && fc_mem_is_host_located(src);
    if (!dst || !src)
        return CUDA_ERROR_INVALID_VALUE;
    if (expect_d == SIDE_DEVICE && c->dside != SIDE_DEVICE)
        return CUDA_ERROR_INVALID_VALUE;
    if (expect_s == SIDE_DEVICE && c->sside != SIDE_DEVICE)
        return CUDA_ERROR_INVALID_VALUE;
    if (expect_d == SIDE_PAGEABLE && c->dside == SIDE_DEVICE)
        return CUDA_ERROR_INVALID_VALUE;
    if (expect_s == SIDE_PAGEABLE && c->sside == SIDE_DEVICE)
        return CUDA_ERROR_INVALID_VALUE;
    if (n == 0 || captured)
        return CUDA_SUCCESS;
    if (c->dside == SIDE_DEVICE && fc_mem_check(dst, n, FC_ACC_RW) != 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (c->sside == SIDE_DEVICE && fc_mem_check(src, n, FC_ACC_READ) != 0)
        return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}

/* Which engine a copy uses (left as it is when the copy does not cross the link or the device's
 * memory), how long it holds it and which counter its bytes go to (b[0] host-to-device, b[1]
 * device-to-host, b[2] device-to-device): by where each side's memory is located (see the header
 * comment). */
static double classify(const copy_one_t *c, fc_engine_t *engine, uint64_t b[3]) {
    int d_dev = c->dside == SIDE_DEVICE && !c->dhost, s_dev = c->sside == SIDE_DEVICE && !c->shost;
    if (d_dev && s_dev) {
        *engine = FC_ENG_COMPUTE;
        b[2] += c->n;
        return 2.0 * (double)c->n / g_fc.cfg.hbm_gbps;
    }
    if (d_dev) {
        *engine = FC_ENG_H2D;
        b[0] += c->n;
        return (double)c->n / g_fc.cfg.h2d_gbps;
    }
    if (s_dev) {
        *engine = FC_ENG_D2H;
        b[1] += c->n;
        return (double)c->n / g_fc.cfg.d2h_gbps;
    }
    return 0;
}

/* A copy queued before an address it names was remapped (FAKECUDA_REMAP_QUEUED=1) runs on what
 * is mapped when it starts, as a copy engine translates addresses as it goes: its engine,
 * modelled time (FAKECUDA_SLOW's factor kept) and byte counters are taken again then. A copy in
 * queued while its destination still showed a host copy crosses the link when it runs. */
static void relocate_copy(fc_op_t *op) {
    copy_payload_t *p = op->payload;
    fc_engine_t engine = FC_ENG_NONE, old_engine = FC_ENG_NONE;
    uint64_t b[3] = {0, 0, 0}, old_b[3] = {0, 0, 0};
    double ns = 0, old_ns = 0;
    for (size_t i = 0; i < p->count; i++) {
        copy_one_t *c = &p->c[i];
        old_ns += classify(c, &old_engine, old_b);
        c->dhost = c->dside == SIDE_DEVICE && fc_mem_is_host_located(c->dst);
        c->shost = c->sside == SIDE_DEVICE && fc_mem_is_host_located(c->src);
        ns += classify(c, &engine, b);
    }
    if (engine == old_engine && ns == old_ns)
        return;
    double slow = old_ns > 0 ? op->model_ns / old_ns : 1.0;
    op->engine = engine;
    op->model_ns = ns * slow;
    FC_STAT(bytes_h2d, (int64_t)b[0] - (int64_t)old_b[0]);
    FC_STAT(bytes_d2h, (int64_t)b[1] - (int64_t)old_b[1]);
    FC_STAT(bytes_d2d, (int64_t)b[2] - (int64_t)old_b[2]);
    op->b_h2d = b[0];
    op->b_d2h = b[1];
    op->b_d2d = b[2];
}

/* Classifies one copy of op (classify) and adds its time and bytes to op's. */
static void account(fc_op_t *op, const copy_one_t *c) {
    uint64_t b[3] = {0, 0, 0};
    op->model_ns += classify(c, &op->engine, b);
    op->b_h2d += b[0];
    op->b_d2h += b[1];
    op->b_d2d += b[2];
    /* Strict mode watches every device address range, host-located mappings included. */
    if (c->dside == SIDE_DEVICE)
        fc_op_ref(op, c->dst, c->dst + c->n, 1);
    if (c->sside == SIDE_DEVICE)
        fc_op_ref(op, c->src, c->src + c->n, 0);
}

/* Queues `count` prepared copies as one op on the stream; waits for it when `wait` is set or a
 * destination is pageable host memory. */
static CUresult submit_copies(copy_payload_t *p, const char *what, CUstream h, int ptds, int wait,
                              uint32_t ncalls) {
    fc_stream_t *s = fc_stream_resolve(h, ptds);
    if (!s) {
        free(p);
        return CUDA_ERROR_INVALID_HANDLE;
    }
    int pageable = 0;
    for (size_t i = 0; i < p->count; i++)
        pageable |= p->c[i].dside == SIDE_PAGEABLE || p->c[i].sside == SIDE_PAGEABLE;
    if (wait || pageable) {
        /* A capture can take neither a wait nor memory that is only valid at this call. */
        CUresult r = fc_capture_refuse(s, wait ? "a synchronous copy" : "a pageable-memory copy");
        if (r != CUDA_SUCCESS) {
            free(p);
            return r;
        }
    }
    for (size_t i = 0; i < p->count; i++) {
        copy_one_t *c = &p->c[i];
        if (c->sside == SIDE_PAGEABLE && c->dside != SIDE_PAGEABLE && c->n) {
            c->staged = malloc(c->n);
            if (!c->staged) {
                for (size_t j = 0; j < i; j++)
                    free(p->c[j].staged);
                free(p);
                return CUDA_ERROR_OUT_OF_MEMORY;
            }
            memcpy(c->staged, (const void *)c->src, c->n);
        }
        if (c->dside == SIDE_PAGEABLE)
            wait = 1;
    }
    fc_op_t *op = fc_op_new(what, run_copy, p, dispose_copy);
    if (!op) {
        for (size_t j = 0; j < p->count; j++)
            free(p->c[j].staged);
        free(p);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    for (size_t i = 0; i < p->count; i++)
        account(op, &p->c[i]);
    op->model_ns *= fc_slow_take();
    op->n_memcpys = ncalls;
    op->clone = clone_copy;
    op->relocate = relocate_copy;
    uint64_t seq;
    CUresult r = fc_submit(s, op, &seq);
    if (r != CUDA_SUCCESS)
        return r;
    return wait && seq ? fc_wait_seq(s, seq) : CUDA_SUCCESS;
}

static CUresult copy1(const char *what, uintptr_t dst, uintptr_t src, size_t n, int expect_d,
                      int expect_s, CUstream h, int ptds, int wait) {
    copy_payload_t *p = malloc(sizeof *p + sizeof(copy_one_t));
    if (!p)
        return CUDA_ERROR_OUT_OF_MEMORY;
    p->count = 1;
    CUresult r = prepare(&p->c[0], dst, src, n, expect_d, expect_s, fc_capturing(h, ptds));
    if (r != CUDA_SUCCESS) {
        free(p);
        return r;
    }
    return submit_copies(p, what, h, ptds, wait, 1);
}

#define ANY  (-1)
#define DEV  SIDE_DEVICE
#define HOST SIDE_PAGEABLE

/* ---- synchronous copies
 * --------------------------------------------------------------------------- */

#define SYNC_COPY(fname, base, sym, pfn, what, ed, es, ptds, DT, ST)                               \
    static CUresult fname(DT dst, ST src, size_t n) {                                              \
        FC_ENTER(base);                                                                            \
        return copy1(what, (uintptr_t)dst, (uintptr_t)src, n, ed, es, NULL, ptds, 1);              \
    }                                                                                              \
    FC_EXPORT(sym, pfn, fname)

SYNC_COPY(fc_memcpy, "cuMemcpy", cuMemcpy, PFN_cuMemcpy_v4000, "memcpy", ANY, ANY, 0, CUdeviceptr,
          CUdeviceptr);
SYNC_COPY(fc_memcpy_ptds, "cuMemcpy", cuMemcpy_ptds, PFN_cuMemcpy_v7000_ptds, "memcpy", ANY, ANY, 1,
          CUdeviceptr, CUdeviceptr);
SYNC_COPY(fc_htod, "cuMemcpyHtoD", cuMemcpyHtoD_v2, PFN_cuMemcpyHtoD_v3020, "memcpy HtoD", DEV,
          HOST, 0, CUdeviceptr, const void *);
SYNC_COPY(fc_htod_ptds, "cuMemcpyHtoD", cuMemcpyHtoD_v2_ptds, PFN_cuMemcpyHtoD_v7000_ptds,
          "memcpy HtoD", DEV, HOST, 1, CUdeviceptr, const void *);
SYNC_COPY(fc_dtoh, "cuMemcpyDtoH", cuMemcpyDtoH_v2, PFN_cuMemcpyDtoH_v3020, "memcpy DtoH", HOST,
          DEV, 0, void *, CUdeviceptr);
SYNC_COPY(fc_dtoh_ptds, "cuMemcpyDtoH", cuMemcpyDtoH_v2_ptds, PFN_cuMemcpyDtoH_v7000_ptds,
          "memcpy DtoH", HOST, DEV, 1, void *, CUdeviceptr);
SYNC_COPY(fc_dtod, "cuMemcpyDtoD", cuMemcpyDtoD_v2, PFN_cuMemcpyDtoD_v3020, "memcpy DtoD", DEV, DEV,
          0, CUdeviceptr, CUdeviceptr);
SYNC_COPY(fc_dtod_ptds, "cuMemcpyDtoD", cuMemcpyDtoD_v2_ptds, PFN_cuMemcpyDtoD_v7000_ptds,
          "memcpy DtoD", DEV, DEV, 1, CUdeviceptr, CUdeviceptr);

/* ---- asynchronous copies
 * -------------------------------------------------------------------------- */

#define ASYNC_COPY(fname, base, sym, pfn, what, ed, es, ptds, DT, ST)                              \
    static CUresult fname(DT dst, ST src, size_t n, CUstream h) {                                  \
        FC_ENTER(base);                                                                            \
        return copy1(what, (uintptr_t)dst, (uintptr_t)src, n, ed, es, h, ptds, 0);                 \
    }                                                                                              \
    FC_EXPORT(sym, pfn, fname)

ASYNC_COPY(fc_memcpy_async, "cuMemcpyAsync", cuMemcpyAsync, PFN_cuMemcpyAsync_v4000, "memcpy async",
           ANY, ANY, 0, CUdeviceptr, CUdeviceptr);
ASYNC_COPY(fc_memcpy_async_ptsz, "cuMemcpyAsync", cuMemcpyAsync_ptsz, PFN_cuMemcpyAsync_v7000_ptsz,
           "memcpy async", ANY, ANY, 1, CUdeviceptr, CUdeviceptr);
ASYNC_COPY(fc_htod_async, "cuMemcpyHtoDAsync", cuMemcpyHtoDAsync_v2, PFN_cuMemcpyHtoDAsync_v3020,
           "memcpy HtoD async", DEV, HOST, 0, CUdeviceptr, const void *);
ASYNC_COPY(fc_htod_async_ptsz, "cuMemcpyHtoDAsync", cuMemcpyHtoDAsync_v2_ptsz,
           PFN_cuMemcpyHtoDAsync_v7000_ptsz, "memcpy HtoD async", DEV, HOST, 1, CUdeviceptr,
           const void *);
ASYNC_COPY(fc_dtoh_async, "cuMemcpyDtoHAsync", cuMemcpyDtoHAsync_v2, PFN_cuMemcpyDtoHAsync_v3020,
           "memcpy DtoH async", HOST, DEV, 0, void *, CUdeviceptr);
ASYNC_COPY(fc_dtoh_async_ptsz, "cuMemcpyDtoHAsync", cuMemcpyDtoHAsync_v2_ptsz,
           PFN_cuMemcpyDtoHAsync_v7000_ptsz, "memcpy DtoH async", HOST, DEV, 1, void *,
           CUdeviceptr);
ASYNC_COPY(fc_dtod_async, "cuMemcpyDtoDAsync", cuMemcpyDtoDAsync_v2, PFN_cuMemcpyDtoDAsync_v3020,
           "memcpy DtoD async", DEV, DEV, 0, CUdeviceptr, CUdeviceptr);
ASYNC_COPY(fc_dtod_async_ptsz, "cuMemcpyDtoDAsync", cuMemcpyDtoDAsync_v2_ptsz,
           PFN_cuMemcpyDtoDAsync_v7000_ptsz, "memcpy DtoD async", DEV, DEV, 1, CUdeviceptr,
           CUdeviceptr);

/* ---- 2D and 3D copies, peer copies ----------------------------------------------------------
 *
 * A 2D or 3D copy is one op of Height x Depth row copies, each prepared (validated, classified)
 * like a 1D copy; it counts as one memcpy. Arrays (CU_MEMORYTYPE_ARRAY) are not simulated: no
 * CUarray can exist here, so one is an invalid value. The rules are the reference manual's:
 * srcLOD and dstLOD 0, the reserved fields NULL, each pitch at least WidthInBytes plus its X
 * offset and (for more than one slice) each height at least Height plus its Y offset. */

/* One side of a 2D/3D copy, as the CUDA_MEMCPY2D/3D fields give it. */
typedef struct side3d {
    CUmemorytype type;
    const void *host;
    CUdeviceptr dev;
    size_t x, y, z, pitch, height;
} side3d_t;

/* The base address of one side and the side a typed copy expects (see prepare). */
static CUresult side_base(const side3d_t *sd, size_t width, size_t height, size_t depth,
                          uintptr_t *base, int *expect) {
    switch (sd->type) {
    case CU_MEMORYTYPE_HOST:
        *base = (uintptr_t)sd->host;
        *expect = SIDE_PAGEABLE; /* any host memory: pageable or pinned, never device */
        break;
    case CU_MEMORYTYPE_DEVICE:
        *base = (uintptr_t)sd->dev;
        *expect = SIDE_DEVICE;
        break;
    case CU_MEMORYTYPE_UNIFIED:
        *base = (uintptr_t)sd->dev;
        *expect = ANY;
        break;
    default: /* CU_MEMORYTYPE_ARRAY (none can exist) or not a memory type */
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (!*base || sd->pitch < width || sd->x > sd->pitch - width)
        return CUDA_ERROR_INVALID_VALUE;
    if (depth > 1 && (sd->height < height || sd->y > sd->height - height))
        return CUDA_ERROR_INVALID_VALUE;
    size_t slice = depth > 1 ? sd->height : 0;
    size_t off;
    if (__builtin_mul_overflow(sd->z, slice, &off) || __builtin_add_overflow(off, sd->y, &off) ||
        __builtin_mul_overflow(off, sd->pitch, &off) || __builtin_add_overflow(off, sd->x, &off) ||
        __builtin_add_overflow(*base, off, base))
        return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}

/* Builds the payload of a 2D/3D copy: one prepared row copy per (y, z). On success *out owns it
 * (NULL for an empty copy). */
static CUresult rows_payload(const side3d_t *src, const side3d_t *dst, size_t width, size_t height,
                             size_t depth, int captured, copy_payload_t **out) {
    *out = NULL;
    uintptr_t sb, db;
    int es, ed;
    CUresult r = side_base(src, width, height, depth, &sb, &es);
    if (r == CUDA_SUCCESS)
        r = side_base(dst, width, height, depth, &db, &ed);
    if (r != CUDA_SUCCESS)
        return r;
    if (width == 0 || height == 0 || depth == 0)
        return CUDA_SUCCESS;
    size_t rows;
    if (__builtin_mul_overflow(height, depth, &rows) ||
        rows > (SIZE_MAX - sizeof(copy_payload_t)) / sizeof(copy_one_t))
        return CUDA_ERROR_INVALID_VALUE;
    copy_payload_t *p = malloc(sizeof *p + rows * sizeof(copy_one_t));
    if (!p)
        return CUDA_ERROR_OUT_OF_MEMORY;
    p->count = rows;
    size_t sslice = depth > 1 ? src->height * src->pitch : 0;
    size_t dslice = depth > 1 ? dst->height * dst->pitch : 0;
    for (size_t z = 0, i = 0; z < depth; z++) {
        for (size_t y = 0; y < height; y++, i++) {
            r = prepare(&p->c[i], db + z * dslice + y * dst->pitch,
                        sb + z * sslice + y * src->pitch, width, ed, es, captured);
            if (r != CUDA_SUCCESS) {
                free(p);
                return r;
            }
        }
    }
    *out = p;
    return CUDA_SUCCESS;
}

static CUresult sides_of(const CUDA_MEMCPY3D *c, side3d_t *src, side3d_t *dst) {
    if (!c || c->srcLOD || c->dstLOD || c->reserved0 || c->reserved1)
        return CUDA_ERROR_INVALID_VALUE;
    *src = (side3d_t){c->srcMemoryType, c->srcHost, c->srcDevice, c->srcXInBytes,
                      c->srcY,          c->srcZ,    c->srcPitch,  c->srcHeight};
    *dst = (side3d_t){c->dstMemoryType, c->dstHost, c->dstDevice, c->dstXInBytes,
                      c->dstY,          c->dstZ,    c->dstPitch,  c->dstHeight};
    return CUDA_SUCCESS;
}

static CUresult copy3d(const char *what, const CUDA_MEMCPY3D *c, CUstream h, int ptds, int wait) {
    side3d_t src, dst;
    CUresult r = sides_of(c, &src, &dst);
    if (r != CUDA_SUCCESS)
        return r;
    if (!fc_stream_resolve(h, ptds))
        return CUDA_ERROR_INVALID_HANDLE;
    copy_payload_t *p;
    r = rows_payload(&src, &dst, c->WidthInBytes, c->Height, c->Depth, fc_capturing(h, ptds), &p);
    if (r != CUDA_SUCCESS || !p)
        return r;
    return submit_copies(p, what, h, ptds, wait, 1);
}

static CUresult copy2d(const char *what, const CUDA_MEMCPY2D *c, CUstream h, int ptds, int wait) {
    if (!c)
        return CUDA_ERROR_INVALID_VALUE;
    CUDA_MEMCPY3D d = {.srcXInBytes = c->srcXInBytes,
                       .srcY = c->srcY,
                       .srcMemoryType = c->srcMemoryType,
                       .srcHost = c->srcHost,
                       .srcDevice = c->srcDevice,
                       .srcArray = c->srcArray,
                       .srcPitch = c->srcPitch,
                       .dstXInBytes = c->dstXInBytes,
                       .dstY = c->dstY,
                       .dstMemoryType = c->dstMemoryType,
                       .dstHost = c->dstHost,
                       .dstDevice = c->dstDevice,
                       .dstArray = c->dstArray,
                       .dstPitch = c->dstPitch,
                       .WidthInBytes = c->WidthInBytes,
                       .Height = c->Height,
                       .Depth = 1};
    return copy3d(what, &d, h, ptds, wait);
}

CUresult fc_copy3d_op(const CUDA_MEMCPY3D *c, fc_op_t **out) {
    *out = NULL;
    side3d_t src, dst;
    CUresult r = sides_of(c, &src, &dst);
    if (r != CUDA_SUCCESS)
        return r;
    copy_payload_t *p;
    r = rows_payload(&src, &dst, c->WidthInBytes, c->Height, c->Depth, 1, &p);
    if (r != CUDA_SUCCESS || !p)
        return r;
    for (size_t i = 0; i < p->count; i++) {
        if (p->c[i].dside == SIDE_PAGEABLE || p->c[i].sside == SIDE_PAGEABLE) {
            free(p); /* a graph cannot hold memory that is only valid during this call */
            return CUDA_ERROR_INVALID_VALUE;
        }
    }
    fc_op_t *op = fc_op_new("memcpy node", run_copy, p, dispose_copy);
    if (!op) {
        free(p);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    for (size_t i = 0; i < p->count; i++)
        account(op, &p->c[i]);
    op->n_memcpys = 1;
    op->clone = clone_copy;
    op->relocate = relocate_copy;
    *out = op;
    return CUDA_SUCCESS;
}

#define COPY2D(fname, base, sym, pfn, what, ptds, wait, ...)                                       \
    static CUresult fname(const CUDA_MEMCPY2D *c __VA_ARGS__) {                                    \
        FC_ENTER(base);                                                                            \
        return copy2d(what, c, HSTREAM, ptds, wait);                                               \
    }                                                                                              \
    FC_EXPORT(sym, pfn, fname)
#define COPY3D(fname, base, sym, pfn, what, ptds, wait, ...)                                       \
    static CUresult fname(const CUDA_MEMCPY3D *c __VA_ARGS__) {                                    \
        FC_ENTER(base);                                                                            \
        return copy3d(what, c, HSTREAM, ptds, wait);                                               \
    }                                                                                              \
    FC_EXPORT(sym, pfn, fname)

#define HSTREAM NULL
COPY2D(fc_copy2d, "cuMemcpy2D", cuMemcpy2D_v2, PFN_cuMemcpy2D_v3020, "memcpy 2D", 0, 1);
COPY2D(fc_copy2d_ptds, "cuMemcpy2D", cuMemcpy2D_v2_ptds, PFN_cuMemcpy2D_v7000_ptds, "memcpy 2D", 1,
       1);
COPY2D(fc_copy2du, "cuMemcpy2DUnaligned", cuMemcpy2DUnaligned_v2, PFN_cuMemcpy2DUnaligned_v3020,
       "memcpy 2D", 0, 1);
COPY2D(fc_copy2du_ptds, "cuMemcpy2DUnaligned", cuMemcpy2DUnaligned_v2_ptds,
       PFN_cuMemcpy2DUnaligned_v7000_ptds, "memcpy 2D", 1, 1);
COPY3D(fc_copy3d, "cuMemcpy3D", cuMemcpy3D_v2, PFN_cuMemcpy3D_v3020, "memcpy 3D", 0, 1);
COPY3D(fc_copy3d_ptds, "cuMemcpy3D", cuMemcpy3D_v2_ptds, PFN_cuMemcpy3D_v7000_ptds, "memcpy 3D", 1,
       1);
#undef HSTREAM
#define HSTREAM h
COPY2D(fc_copy2d_async, "cuMemcpy2DAsync", cuMemcpy2DAsync_v2, PFN_cuMemcpy2DAsync_v3020,
       "memcpy 2D async", 0, 0, , CUstream h);
COPY2D(fc_copy2d_async_ptsz, "cuMemcpy2DAsync", cuMemcpy2DAsync_v2_ptsz,
       PFN_cuMemcpy2DAsync_v7000_ptsz, "memcpy 2D async", 1, 0, , CUstream h);
COPY3D(fc_copy3d_async, "cuMemcpy3DAsync", cuMemcpy3DAsync_v2, PFN_cuMemcpy3DAsync_v3020,
       "memcpy 3D async", 0, 0, , CUstream h);
COPY3D(fc_copy3d_async_ptsz, "cuMemcpy3DAsync", cuMemcpy3DAsync_v2_ptsz,
       PFN_cuMemcpy3DAsync_v7000_ptsz, "memcpy 3D async", 1, 0, , CUstream h);
#undef HSTREAM

/* Peer copies: the simulated device is the only one, so both contexts must be live contexts (of
 * that device) and the copy is a device-to-device copy. */
static CUresult peer(const char *what, CUdeviceptr dst, CUcontext dctx, CUdeviceptr src,
                     CUcontext sctx, size_t n, CUstream h, int ptds, int wait) {
    if (!fc_ctx_valid(dctx) || !fc_ctx_valid(sctx))
        return CUDA_ERROR_INVALID_CONTEXT;
    return copy1(what, (uintptr_t)dst, (uintptr_t)src, n, DEV, DEV, h, ptds, wait);
}

static CUresult fc_peer(CUdeviceptr d, CUcontext dc, CUdeviceptr s, CUcontext sc, size_t n) {
    FC_ENTER("cuMemcpyPeer");
    return peer("memcpy peer", d, dc, s, sc, n, NULL, 0, 1);
}
FC_EXPORT(cuMemcpyPeer, PFN_cuMemcpyPeer_v4000, fc_peer);

static CUresult fc_peer_ptds(CUdeviceptr d, CUcontext dc, CUdeviceptr s, CUcontext sc, size_t n) {
    FC_ENTER("cuMemcpyPeer");
    return peer("memcpy peer", d, dc, s, sc, n, NULL, 1, 1);
}
FC_EXPORT(cuMemcpyPeer_ptds, PFN_cuMemcpyPeer_v7000_ptds, fc_peer_ptds);

static CUresult fc_peer_async(CUdeviceptr d, CUcontext dc, CUdeviceptr s, CUcontext sc, size_t n,
                              CUstream h) {
    FC_ENTER("cuMemcpyPeerAsync");
    return peer("memcpy peer async", d, dc, s, sc, n, h, 0, 0);
}
FC_EXPORT(cuMemcpyPeerAsync, PFN_cuMemcpyPeerAsync_v4000, fc_peer_async);

static CUresult fc_peer_async_ptsz(CUdeviceptr d, CUcontext dc, CUdeviceptr s, CUcontext sc,
                                   size_t n, CUstream h) {
    FC_ENTER("cuMemcpyPeerAsync");
    return peer("memcpy peer async", d, dc, s, sc, n, h, 1, 0);
}
FC_EXPORT(cuMemcpyPeerAsync_ptsz, PFN_cuMemcpyPeerAsync_v7000_ptsz, fc_peer_async_ptsz);

/* ---- batched copies
 * ------------------------------------------------------------------------------- */

static CUresult batch(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count,
                      CUmemcpyAttributes *attrs, size_t *attr_idxs, size_t nattrs, size_t *fail_idx,
                      CUstream h, int ptds) {
    if (fail_idx)
        *fail_idx = SIZE_MAX;
    if (!dsts || !srcs || !sizes || count == 0 || !attrs || !attr_idxs || nattrs == 0 ||
        nattrs > count || attr_idxs[0] != 0)
        return CUDA_ERROR_INVALID_VALUE;
    /* The reference manual: the legacy NULL stream is refused, and every attribute needs a
     * valid srcAccessOrder; attribute indices rise strictly. */
    if (h == CU_STREAM_LEGACY || (!h && !ptds))
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < nattrs; i++)
        if (attrs[i].srcAccessOrder < CU_MEMCPY_SRC_ACCESS_ORDER_STREAM ||
            attrs[i].srcAccessOrder > CU_MEMCPY_SRC_ACCESS_ORDER_ANY ||
            (i > 0 && attr_idxs[i] <= attr_idxs[i - 1]) || attr_idxs[i] >= count)
            return CUDA_ERROR_INVALID_VALUE;
    if (count > (SIZE_MAX - sizeof(copy_payload_t)) / sizeof(copy_one_t))
        return CUDA_ERROR_INVALID_VALUE;
    copy_payload_t *p = malloc(sizeof *p + count * sizeof(copy_one_t));
    if (!p)
        return CUDA_ERROR_OUT_OF_MEMORY;
    p->count = count;
    int captured = fc_capturing(h, ptds);
    for (size_t i = 0; i < count; i++) {
        CUresult r =
            prepare(&p->c[i], (uintptr_t)dsts[i], (uintptr_t)srcs[i], sizes[i], ANY, ANY, captured);
        if (r != CUDA_SUCCESS) {
            if (fail_idx)
                *fail_idx = i;
            free(p);
            return r;
        }
    }
    return submit_copies(p, "memcpy batch", h, ptds, 0, (uint32_t)count);
}

static CUresult fc_batch_12080(CUdeviceptr *d, CUdeviceptr *s, size_t *n, size_t count,
                               CUmemcpyAttributes *a, size_t *ai, size_t na, size_t *fail,
                               CUstream h) {
    FC_ENTER("cuMemcpyBatchAsync");
    return batch(d, s, n, count, a, ai, na, fail, h, 0);
}
FC_EXPORT(cuMemcpyBatchAsync, PFN_cuMemcpyBatchAsync_v12080, fc_batch_12080);

static CUresult fc_batch_12080_ptsz(CUdeviceptr *d, CUdeviceptr *s, size_t *n, size_t count,
                                    CUmemcpyAttributes *a, size_t *ai, size_t na, size_t *fail,
                                    CUstream h) {
    FC_ENTER("cuMemcpyBatchAsync");
    return batch(d, s, n, count, a, ai, na, fail, h, 1);
}
FC_EXPORT(cuMemcpyBatchAsync_ptsz, PFN_cuMemcpyBatchAsync_v12080_ptsz, fc_batch_12080_ptsz);

static CUresult fc_batch_13000(CUdeviceptr *d, CUdeviceptr *s, size_t *n, size_t count,
                               CUmemcpyAttributes *a, size_t *ai, size_t na, CUstream h) {
    FC_ENTER("cuMemcpyBatchAsync");
    return batch(d, s, n, count, a, ai, na, NULL, h, 0);
}
FC_EXPORT(cuMemcpyBatchAsync_v2, PFN_cuMemcpyBatchAsync_v13000, fc_batch_13000);

static CUresult fc_batch_13000_ptsz(CUdeviceptr *d, CUdeviceptr *s, size_t *n, size_t count,
                                    CUmemcpyAttributes *a, size_t *ai, size_t na, CUstream h) {
    FC_ENTER("cuMemcpyBatchAsync");
    return batch(d, s, n, count, a, ai, na, NULL, h, 1);
}
FC_EXPORT(cuMemcpyBatchAsync_v2_ptsz, PFN_cuMemcpyBatchAsync_v13000_ptsz, fc_batch_13000_ptsz);

/* ---- batched 3D copies --------------------------------------------------------------------------
 *
 * cuMemcpy3DBatchAsync: numOps independent strided copies, validated together at the call (one
 * bad op and nothing is queued; the 12.8 form reports its index), then queued as one op on the
 * stream that counts numOps memcpys. Each is a pointer-to-pointer copy of extent width x height x
 * depth bytes (the element size of pointers is 1); an operand's rowLength and layerHeight are its
 * pitch and rows per layer, 0 meaning packed by the extent, otherwise at least width and height.
 * A pointer may be device or host memory, told by its first byte. Array operands are
 * refused as an invalid value, as in cuMemcpy3D: no CUarray can exist here. The reference
 * manual's other rules: numOps > 0, a non-NULL opList, flags 0, every extent non-zero, a valid
 * srcAccessOrder and only CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE among an op's flags; the
 * stream must not be the legacy NULL stream. */

/* The side3d_t of a pointer operand, or CUDA_ERROR_INVALID_VALUE for any other operand. */
static CUresult operand_side(const CUmemcpy3DOperand *o, const CUextent3D *e, side3d_t *sd) {
    if (o->type != CU_MEMCPY_OPERAND_TYPE_POINTER)
        return CUDA_ERROR_INVALID_VALUE;
    size_t row = o->op.ptr.rowLength, layer = o->op.ptr.layerHeight;
    if ((row && row < e->width) || (layer && layer < e->height))
        return CUDA_ERROR_INVALID_VALUE;
    /* The operand is device or host memory by its pointer, as for the driver: every row of a
     * device operand must then lie in device memory. */
    CUmemorytype t = side_of((uintptr_t)o->op.ptr.ptr) == SIDE_DEVICE ? CU_MEMORYTYPE_DEVICE
                                                                      : CU_MEMORYTYPE_HOST;
    *sd = (side3d_t){t,
                     (const void *)(uintptr_t)o->op.ptr.ptr,
                     o->op.ptr.ptr,
                     0,
                     0,
                     0,
                     row ? row : e->width,
                     layer ? layer : e->height};
    return CUDA_SUCCESS;
}

/* Validates op `o` and builds its rows (*out owns them). */
static CUresult batch3d_rows(const CUDA_MEMCPY3D_BATCH_OP *o, int captured, copy_payload_t **out) {
    const CUextent3D *e = &o->extent;
    if (!e->width || !e->height || !e->depth)
        return CUDA_ERROR_INVALID_VALUE;
    if (o->srcAccessOrder < CU_MEMCPY_SRC_ACCESS_ORDER_STREAM ||
        o->srcAccessOrder > CU_MEMCPY_SRC_ACCESS_ORDER_ANY ||
        (o->flags & ~(unsigned)CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE))
        return CUDA_ERROR_INVALID_VALUE;
    side3d_t src, dst;
    CUresult r = operand_side(&o->src, e, &src);
    if (r == CUDA_SUCCESS)
        r = operand_side(&o->dst, e, &dst);
    if (r != CUDA_SUCCESS)
        return r;
    return rows_payload(&src, &dst, e->width, e->height, e->depth, captured, out);
}

static CUresult batch3d(size_t nops, CUDA_MEMCPY3D_BATCH_OP *ops, size_t *fail_idx,
                        unsigned long long flags, CUstream h, int ptds) {
    if (fail_idx)
        *fail_idx = SIZE_MAX;
    if (nops == 0 || !ops || flags)
        return CUDA_ERROR_INVALID_VALUE;
    if (h == CU_STREAM_LEGACY || (!h && !ptds))
        return CUDA_ERROR_INVALID_VALUE; /* "must not be default NULL stream" */
    if (!fc_stream_resolve(h, ptds))
        return CUDA_ERROR_INVALID_HANDLE;
    if (nops > SIZE_MAX / sizeof(copy_payload_t *))
        return CUDA_ERROR_INVALID_VALUE;
    copy_payload_t **parts = calloc(nops, sizeof *parts);
    if (!parts)
        return CUDA_ERROR_OUT_OF_MEMORY;
    int captured = fc_capturing(h, ptds);
    size_t rows = 0;
    CUresult r = CUDA_SUCCESS;
    size_t i = 0;
    for (; i < nops && r == CUDA_SUCCESS; i++) {
        r = batch3d_rows(&ops[i], captured, &parts[i]);
        if (r == CUDA_SUCCESS && __builtin_add_overflow(rows, parts[i]->count, &rows))
            r = CUDA_ERROR_INVALID_VALUE;
    }
    copy_payload_t *p = NULL;
    if (r != CUDA_SUCCESS) {
        if (fail_idx && r == CUDA_ERROR_INVALID_VALUE)
            *fail_idx = i - 1;
    } else if (rows > (SIZE_MAX - sizeof(copy_payload_t)) / sizeof(copy_one_t)) {
        r = CUDA_ERROR_INVALID_VALUE;
    } else if (!(p = malloc(sizeof *p + rows * sizeof(copy_one_t)))) {
        r = CUDA_ERROR_OUT_OF_MEMORY;
    } else {
        p->count = 0;
        for (size_t k = 0; k < nops; k++) {
            memcpy(&p->c[p->count], parts[k]->c, parts[k]->count * sizeof(copy_one_t));
            p->count += parts[k]->count;
        }
    }
    for (size_t k = 0; k < nops; k++)
        free(parts[k]);
    free(parts);
    if (r != CUDA_SUCCESS)
        return r;
    return submit_copies(p, "memcpy 3D batch", h, ptds, 0, (uint32_t)nops);
}

static CUresult fc_batch3d_12080(size_t n, CUDA_MEMCPY3D_BATCH_OP *ops, size_t *fail,
                                 unsigned long long flags, CUstream h) {
    FC_ENTER("cuMemcpy3DBatchAsync");
    return batch3d(n, ops, fail, flags, h, 0);
}
FC_EXPORT(cuMemcpy3DBatchAsync, PFN_cuMemcpy3DBatchAsync_v12080, fc_batch3d_12080);

static CUresult fc_batch3d_12080_ptsz(size_t n, CUDA_MEMCPY3D_BATCH_OP *ops, size_t *fail,
                                      unsigned long long flags, CUstream h) {
    FC_ENTER("cuMemcpy3DBatchAsync");
    return batch3d(n, ops, fail, flags, h, 1);
}
FC_EXPORT(cuMemcpy3DBatchAsync_ptsz, PFN_cuMemcpy3DBatchAsync_v12080_ptsz, fc_batch3d_12080_ptsz);

static CUresult fc_batch3d_13000(size_t n, CUDA_MEMCPY3D_BATCH_OP *ops, unsigned long long flags,
                                 CUstream h) {
    FC_ENTER("cuMemcpy3DBatchAsync");
    return batch3d(n, ops, NULL, flags, h, 0);
}
FC_EXPORT(cuMemcpy3DBatchAsync_v2, PFN_cuMemcpy3DBatchAsync_v13000, fc_batch3d_13000);

static CUresult fc_batch3d_13000_ptsz(size_t n, CUDA_MEMCPY3D_BATCH_OP *ops,
                                      unsigned long long flags, CUstream h) {
    FC_ENTER("cuMemcpy3DBatchAsync");
    return batch3d(n, ops, NULL, flags, h, 1);
}
FC_EXPORT(cuMemcpy3DBatchAsync_v2_ptsz, PFN_cuMemcpy3DBatchAsync_v13000_ptsz,
          fc_batch3d_13000_ptsz);

/* ---- sets ---------------------------------------------------------------------------------------
 */

typedef struct set_payload {
    uintptr_t dst;
    size_t pitch, width, height; /* width in elements; height 1 for 1D */
    unsigned elem;
    uint32_t value;
} set_payload_t;

static CUresult run_set(fc_op_t *op) {
    set_payload_t *p = op->payload;
    size_t row = p->width * p->elem;
    for (size_t y = 0; y < p->height; y++) {
        uintptr_t d = p->dst + y * p->pitch;
        if (fc_mem_check(d, row, FC_ACC_RW) != 0) {
            fc_warn("illegal address: %s of %zu bytes at %#lx touches memory that is not "
                    "mapped read-write",
                    op->what, row, (unsigned long)d);
            FC_STAT(illegal_accesses, 1);
            return CUDA_ERROR_ILLEGAL_ADDRESS;
        }
        if (p->elem == 1) {
            memset((void *)d, (int)(p->value & 0xff), row);
        } else if (p->elem == 2) {
            uint16_t *q = (uint16_t *)d;
            for (size_t i = 0; i < p->width; i++)
                q[i] = (uint16_t)p->value;
        } else {
            uint32_t *q = (uint32_t *)d;
            for (size_t i = 0; i < p->width; i++)
                q[i] = p->value;
        }
    }
    return CUDA_SUCCESS;
}

static void dispose_set(fc_op_t *op) {
    free(op->payload);
}

static int clone_set(fc_op_t *dst, const fc_op_t *src) {
    set_payload_t *q = malloc(sizeof *q);
    if (!q)
        return -1;
    *q = *(const set_payload_t *)src->payload;
    dst->payload = q;
    for (unsigned i = 0; i < src->nrefs; i++)
        fc_op_ref(dst, src->refs[i].lo, src->refs[i].hi, src->refs[i].write);
    return 0;
}

/* Builds a set op after the call-time checks; `captured`: its rows are checked when the graph
 * runs instead. *out is NULL for an empty set. */
static CUresult set_op(const char *what, CUdeviceptr dst, size_t pitch, uint32_t value,
                       unsigned elem, size_t width, size_t height, int captured, fc_op_t **out) {
    *out = NULL;
    if (width == 0 || height == 0)
        return CUDA_SUCCESS;
    if ((uintptr_t)dst % elem || (height > 1 && pitch < width * elem))
        return CUDA_ERROR_INVALID_VALUE;
    if (width > SIZE_MAX / elem || (height > 1 && pitch > (SIZE_MAX - width * elem) / (height - 1)))
        return CUDA_ERROR_INVALID_VALUE;
    size_t span = (height - 1) * pitch + width * elem;
    if (side_of((uintptr_t)dst) == SIDE_PAGEABLE)
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t y = 0; y < height && !captured; y++)
        if (fc_mem_check((uintptr_t)dst + y * pitch, width * elem, FC_ACC_RW) != 0)
            return CUDA_ERROR_INVALID_VALUE;
    set_payload_t *p = malloc(sizeof *p);
    if (!p)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *p = (set_payload_t){(uintptr_t)dst, pitch, width, height, elem, value};
    fc_op_t *op = fc_op_new(what, run_set, p, dispose_set);
    if (!op) {
        free(p);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    op->engine = FC_ENG_COMPUTE;
    op->model_ns = (double)span / g_fc.cfg.hbm_gbps + g_fc.cfg.launch_us * 1000.0;
    fc_op_ref(op, (uintptr_t)dst, (uintptr_t)dst + span, 1);
    op->n_memsets = 1;
    op->clone = clone_set;
    *out = op;
    return CUDA_SUCCESS;
}

CUresult fc_memset_op(const CUDA_MEMSET_NODE_PARAMS *m, fc_op_t **out) {
    *out = NULL;
    if (!m || (m->elementSize != 1 && m->elementSize != 2 && m->elementSize != 4) ||
        m->width == 0 || m->height == 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (m->elementSize < 4 && m->value >> (8 * m->elementSize))
        return CUDA_ERROR_INVALID_VALUE;
    return set_op("memset node", m->dst, m->pitch, m->value, m->elementSize, m->width, m->height, 1,
                  out);
}

static CUresult set2d(const char *what, CUdeviceptr dst, size_t pitch, uint32_t value,
                      unsigned elem, size_t width, size_t height, CUstream h, int ptds) {
    if (width == 0 || height == 0)
        return CUDA_SUCCESS;
    fc_stream_t *s = fc_stream_resolve(h, ptds);
    fc_op_t *op;
    CUresult r = set_op(what, dst, pitch, value, elem, width, height, fc_capturing(h, ptds), &op);
    if (r != CUDA_SUCCESS || !op)
        return r;
    if (!s) {
        fc_op_free(op);
        return CUDA_ERROR_INVALID_HANDLE;
    }
    return fc_submit(s, op, NULL);
}

#define SET1(fname, base, sym, pfn, elem, VT, ptds)                                                \
    static CUresult fname(CUdeviceptr d, VT v, size_t n) {                                         \
        FC_ENTER(base);                                                                            \
        return set2d(base, d, n * elem, (uint32_t)v, elem, n, 1, NULL, ptds);                      \
    }                                                                                              \
    FC_EXPORT(sym, pfn, fname)

SET1(fc_set8, "cuMemsetD8", cuMemsetD8_v2, PFN_cuMemsetD8_v3020, 1, unsigned char, 0);
SET1(fc_set8_ptds, "cuMemsetD8", cuMemsetD8_v2_ptds, PFN_cuMemsetD8_v7000_ptds, 1, unsigned char,
     1);
SET1(fc_set16, "cuMemsetD16", cuMemsetD16_v2, PFN_cuMemsetD16_v3020, 2, unsigned short, 0);
SET1(fc_set16_ptds, "cuMemsetD16", cuMemsetD16_v2_ptds, PFN_cuMemsetD16_v7000_ptds, 2,
     unsigned short, 1);
SET1(fc_set32, "cuMemsetD32", cuMemsetD32_v2, PFN_cuMemsetD32_v3020, 4, unsigned int, 0);
SET1(fc_set32_ptds, "cuMemsetD32", cuMemsetD32_v2_ptds, PFN_cuMemsetD32_v7000_ptds, 4, unsigned int,
     1);

#define SET1_ASYNC(fname, base, sym, pfn, elem, VT, ptds)                                          \
    static CUresult fname(CUdeviceptr d, VT v, size_t n, CUstream h) {                             \
        FC_ENTER(base);                                                                            \
        return set2d(base, d, n * elem, (uint32_t)v, elem, n, 1, h, ptds);                         \
    }                                                                                              \
    FC_EXPORT(sym, pfn, fname)

SET1_ASYNC(fc_set8_async, "cuMemsetD8Async", cuMemsetD8Async, PFN_cuMemsetD8Async_v3020, 1,
           unsigned char, 0);
SET1_ASYNC(fc_set8_async_ptsz, "cuMemsetD8Async", cuMemsetD8Async_ptsz,
           PFN_cuMemsetD8Async_v7000_ptsz, 1, unsigned char, 1);
SET1_ASYNC(fc_set16_async, "cuMemsetD16Async", cuMemsetD16Async, PFN_cuMemsetD16Async_v3020, 2,
           unsigned short, 0);
SET1_ASYNC(fc_set16_async_ptsz, "cuMemsetD16Async", cuMemsetD16Async_ptsz,
           PFN_cuMemsetD16Async_v7000_ptsz, 2, unsigned short, 1);
SET1_ASYNC(fc_set32_async, "cuMemsetD32Async", cuMemsetD32Async, PFN_cuMemsetD32Async_v3020, 4,
           unsigned int, 0);
SET1_ASYNC(fc_set32_async_ptsz, "cuMemsetD32Async", cuMemsetD32Async_ptsz,
           PFN_cuMemsetD32Async_v7000_ptsz, 4, unsigned int, 1);

#define SET2(fname, base, sym, pfn, elem, VT, ptds)                                                \
    static CUresult fname(CUdeviceptr d, size_t pitch, VT v, size_t w, size_t hgt) {               \
        FC_ENTER(base);                                                                            \
        return set2d(base, d, pitch, (uint32_t)v, elem, w, hgt, NULL, ptds);                       \
    }                                                                                              \
    FC_EXPORT(sym, pfn, fname)

SET2(fc_set2d8, "cuMemsetD2D8", cuMemsetD2D8_v2, PFN_cuMemsetD2D8_v3020, 1, unsigned char, 0);
SET2(fc_set2d8_ptds, "cuMemsetD2D8", cuMemsetD2D8_v2_ptds, PFN_cuMemsetD2D8_v7000_ptds, 1,
     unsigned char, 1);
SET2(fc_set2d16, "cuMemsetD2D16", cuMemsetD2D16_v2, PFN_cuMemsetD2D16_v3020, 2, unsigned short, 0);
SET2(fc_set2d16_ptds, "cuMemsetD2D16", cuMemsetD2D16_v2_ptds, PFN_cuMemsetD2D16_v7000_ptds, 2,
     unsigned short, 1);
SET2(fc_set2d32, "cuMemsetD2D32", cuMemsetD2D32_v2, PFN_cuMemsetD2D32_v3020, 4, unsigned int, 0);
SET2(fc_set2d32_ptds, "cuMemsetD2D32", cuMemsetD2D32_v2_ptds, PFN_cuMemsetD2D32_v7000_ptds, 4,
     unsigned int, 1);

#define SET2_ASYNC(fname, base, sym, pfn, elem, VT, ptds)                                          \
    static CUresult fname(CUdeviceptr d, size_t pitch, VT v, size_t w, size_t hgt, CUstream h) {   \
        FC_ENTER(base);                                                                            \
        return set2d(base, d, pitch, (uint32_t)v, elem, w, hgt, h, ptds);                          \
    }                                                                                              \
    FC_EXPORT(sym, pfn, fname)

SET2_ASYNC(fc_set2d8_async, "cuMemsetD2D8Async", cuMemsetD2D8Async, PFN_cuMemsetD2D8Async_v3020, 1,
           unsigned char, 0);
SET2_ASYNC(fc_set2d8_async_ptsz, "cuMemsetD2D8Async", cuMemsetD2D8Async_ptsz,
           PFN_cuMemsetD2D8Async_v7000_ptsz, 1, unsigned char, 1);
SET2_ASYNC(fc_set2d16_async, "cuMemsetD2D16Async", cuMemsetD2D16Async, PFN_cuMemsetD2D16Async_v3020,
           2, unsigned short, 0);
SET2_ASYNC(fc_set2d16_async_ptsz, "cuMemsetD2D16Async", cuMemsetD2D16Async_ptsz,
           PFN_cuMemsetD2D16Async_v7000_ptsz, 2, unsigned short, 1);
SET2_ASYNC(fc_set2d32_async, "cuMemsetD2D32Async", cuMemsetD2D32Async, PFN_cuMemsetD2D32Async_v3020,
           4, unsigned int, 0);
SET2_ASYNC(fc_set2d32_async_ptsz, "cuMemsetD2D32Async", cuMemsetD2D32Async_ptsz,
           PFN_cuMemsetD2D32Async_v7000_ptsz, 4, unsigned int, 1);
