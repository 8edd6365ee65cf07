/* SPDX-License-Identifier: MIT */
/* fc_mem.c: simulated device memory: allocations, pinned host memory, pointer queries and the
 * virtual memory management (VMM) API emulated with mmap.
 *
 * Device memory is host memory at the same address (unified addressing). Every range a kernel or
 * copy may touch is in one sorted table (g_fc.ranges): plain allocations, VMM mappings and pinned
 * host memory. VMM reservations are PROT_NONE mmaps; a physical handle is a memfd; cuMemMap maps
 * it with MAP_FIXED (readable and writable on the host; the access a kernel or copy may use is the
 * table's, which cuMemSetAccess sets); cuMemUnmap puts a PROT_NONE placeholder back (never a
 * hole), so touching an unmapped range faults as on a GPU. See "Host page tables" below for why
 * mappings are moved rather than made afresh.
 *
 * Locking: the tables are guarded by g_fc.mem_lock; capacity accounting by g_fc.stats_lock
 * (through fc_reserve_capacity). The VMM calls that change host mappings take g_fc.vm_lock first
 * and make their system calls under it alone: an mremap of a chunk costs 15-25 us on this
 * project's machines (a TLB shootdown on every core running the process), and made under
 * mem_lock it held up every kernel, copy and cuMemSetAccess meanwhile (in a replay of `mlp
 * --layers 12` with 64 KiB chunks the calls waited 5-17 us for the lock on average, and the
 * simulated mapping calls took 2.7 times their model). */
#include "fc_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* ---- the range table ---------------------------------------------------------------------------
 */

/* Index of the last range with base <= p, or -1. Caller holds mem_lock. */
static ssize_t find_le(const fc_range_t *a, size_t n, uintptr_t p) {
    ssize_t lo = 0, hi = (ssize_t)n - 1, ans = -1;
    while (lo <= hi) {
        ssize_t mid = (lo + hi) / 2;
        if (a[mid].base <= p) {
            ans = mid;
            lo = mid + 1;
        } else {
            hi = mid - 1;
        }
    }
    return ans;
}

static fc_range_t *find_range(uintptr_t p) {
    ssize_t i = find_le(g_fc.ranges, g_fc.nranges, p);
    if (i < 0)
        return NULL;
    fc_range_t *r = &g_fc.ranges[i];
    return p < r->base + r->size ? r : NULL;
}

static int insert_into(fc_range_t **arr, size_t *n, size_t *cap, const fc_range_t *r) {
    if (*n == *cap) {
        size_t nc = *cap ? *cap * 2 : 64;
        fc_range_t *na = realloc(*arr, nc * sizeof *na);
        if (!na)
            return -1;
        *arr = na;
        *cap = nc;
    }
    ssize_t i = find_le(*arr, *n, r->base) + 1;
    memmove(&(*arr)[i + 1], &(*arr)[i], (*n - (size_t)i) * sizeof **arr);
    (*arr)[i] = *r;
    (*n)++;
    return 0;
}

static void remove_at(fc_range_t *arr, size_t *n, size_t i) {
    memmove(&arr[i], &arr[i + 1], (*n - i - 1) * sizeof *arr);
    (*n)--;
}

static int location_is_host(const CUmemLocation *l);

int fc_mem_check(uintptr_t p, size_t n, int access) {
    int host;
    return fc_mem_check_loc(p, n, access, &host);
}

/* FAKECUDA_POISON: a new allocation reads as 0xff bytes (garbage, as a GPU's fresh memory holds,
 * but the same every run), so that a read before a write shows. cuMemAlloc on a GPU takes
 * microseconds whatever the size; filling the bytes there made the host thread, which the
 * timing model does not charge for it, spend milliseconds on a training loop's per-iteration
 * allocations (large: 52 MB of weight gradients each iteration). So the fill waits for the
 * range's first access, which every copy, memset, stream memory operation and kernel makes
 * through fc_mem_check_loc: the first to come fills the whole range, under poison_lock, before it
 * reads or writes; the others wait for it. A freed range is never filled (cuMemFree needs the
 * write lock, which the filler's read lock holds off). */
static pthread_mutex_t poison_lock = PTHREAD_MUTEX_INITIALIZER;

static void poison_now(fc_range_t *r) {
    pthread_mutex_lock(&poison_lock);
    if (__atomic_load_n(&r->poison_due, __ATOMIC_RELAXED)) {
        memset((void *)r->base, 0xff, r->size);
        __atomic_store_n(&r->poison_due, 0, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&poison_lock);
}

int fc_mem_check_loc(uintptr_t p, size_t n, int access, int *host_located) {
    int ok = 0;
    *host_located = 0;
    if (n == 0)
        return 0;
    pthread_rwlock_rdlock(&g_fc.mem_lock);
    ssize_t i = find_le(g_fc.ranges, g_fc.nranges, p);
    uintptr_t need_end = p + n;
    if (need_end < p) {
        pthread_rwlock_unlock(&g_fc.mem_lock);
        return -1;
    }
    uintptr_t cur = p;
    while (i >= 0 && (size_t)i < g_fc.nranges) {
        fc_range_t *r = &g_fc.ranges[i];
        if (cur < r->base || cur >= r->base + r->size)
            break;
        if (r->kind != FC_R_HOST && (r->access & access) != access)
            break;
        if (__atomic_load_n(&r->poison_due, __ATOMIC_ACQUIRE))
            poison_now(r);
        if (r->kind == FC_R_MAP && location_is_host(&r->h->prop.location))
            *host_located = 1;
        cur = r->base + r->size;
        if (cur >= need_end) {
            ok = 1;
            break;
        }
        /* Only adjacent VMM mappings continue a range; allocations are never adjacent. */
        if (r->kind != FC_R_MAP)
            break;
        i++;
        if ((size_t)i >= g_fc.nranges || g_fc.ranges[i].kind != FC_R_MAP)
            break;
    }
    pthread_rwlock_unlock(&g_fc.mem_lock);
    return ok ? 0 : -1;
}

int fc_mem_is_device(uintptr_t p) {
    pthread_rwlock_rdlock(&g_fc.mem_lock);
    fc_range_t *r = find_range(p);
    int dev = r && r->kind != FC_R_HOST;
    if (!r) {
        /* A reserved but unmapped address is still a device address. */
        ssize_t j = find_le(g_fc.resv, g_fc.nresv, p);
        dev = j >= 0 && p < g_fc.resv[j].base + g_fc.resv[j].size;
    }
    pthread_rwlock_unlock(&g_fc.mem_lock);
    return dev;
}

int fc_mem_is_host_located(uintptr_t p) {
    pthread_rwlock_rdlock(&g_fc.mem_lock);
    fc_range_t *r = find_range(p);
    int host = r && r->kind == FC_R_MAP && location_is_host(&r->h->prop.location);
    pthread_rwlock_unlock(&g_fc.mem_lock);
    return host;
}

int fc_mem_is_pinned_host(uintptr_t p) {
    pthread_rwlock_rdlock(&g_fc.mem_lock);
    fc_range_t *r = find_range(p);
    int host = r && r->kind == FC_R_HOST;
    pthread_rwlock_unlock(&g_fc.mem_lock);
    return host;
}

/* Appends the parts of reference r that lie in VMM mappings, as physical memory, to the array
 * *out (n used, cap allocated; grown as needed). Returns how many it appended (best effort: 0
 * when out of memory). */
unsigned fc_mem_phys(const fc_ref_t *r, fc_pref_t **out, unsigned *n, unsigned *cap) {
    unsigned added = 0;
    pthread_rwlock_rdlock(&g_fc.mem_lock);
    ssize_t i = find_le(g_fc.ranges, g_fc.nranges, r->lo);
    if (i < 0)
        i = 0;
    for (size_t j = (size_t)i; j < g_fc.nranges && g_fc.ranges[j].base < r->hi; j++) {
        const fc_range_t *g = &g_fc.ranges[j];
        uintptr_t lo = r->lo > g->base ? r->lo : g->base;
        uintptr_t hi = r->hi < g->base + g->size ? r->hi : g->base + g->size;
        if (g->kind != FC_R_MAP || lo >= hi)
            continue;
        if (*n == *cap) {
            unsigned nc = *cap ? *cap * 2 : 4;
            fc_pref_t *p = realloc(*out, nc * sizeof *p);
            if (!p)
                break;
            *out = p;
            *cap = nc;
        }
        uint64_t off = g->map_offset + (lo - g->base);
        (*out)[(*n)++] = (fc_pref_t){g->h, off, off + (hi - lo), lo, r->write};
        added++;
    }
    pthread_rwlock_unlock(&g_fc.mem_lock);
    return added;
}

int fc_mem_extent(uintptr_t p, uintptr_t *lo, uintptr_t *hi) {
    pthread_rwlock_rdlock(&g_fc.mem_lock);
    fc_range_t *r = find_range(p);
    if (r) {
        *lo = r->base;
        *hi = r->base + r->size;
    }
    pthread_rwlock_unlock(&g_fc.mem_lock);
    return r ? 0 : -1;
}

/* Counts bytes against the device capacity; returns -1 when they do not fit. */
static int reserve_capacity(uint64_t bytes) {
    int ok;
    pthread_mutex_lock(&g_fc.stats_lock);
    ok = g_fc.st.device_used_bytes + bytes <= g_fc.cfg.mem_bytes;
    if (ok) {
        g_fc.st.device_used_bytes += bytes;
        if (g_fc.st.device_used_bytes > g_fc.st.device_peak_bytes)
            g_fc.st.device_peak_bytes = g_fc.st.device_used_bytes;
    }
    pthread_mutex_unlock(&g_fc.stats_lock);
    return ok ? 0 : -1;
}

static void release_capacity(uint64_t bytes) {
    FC_STAT(device_used_bytes, -(int64_t)bytes);
}

static size_t page_round(size_t n) {
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    return (n + pg - 1) & ~(pg - 1);
}

/* ---- cuMemAlloc and friends
 * ---------------------------------------------------------------------- */

/* Freed allocations' host mappings, kept for the next allocation of the same page-rounded size
 * (newest first) rather than unmapped: a fresh mapping costs a page fault per page at its first
 * touch (the poison fill, or the first kernel), which on a 2-core machine is much of the
 * simulator's own time in a training loop that frees and allocates the same sizes every
 * iteration. Under a hypervisor with shadow page tables the first write to each page after any
 * change of its mapping costs 1 to 5 us even when populated, so a kept mapping keeps
 * its protection too: the host could still touch freed device memory, as it can touch live
 * device memory here (unified addresses), but kernels and copies are checked against the range
 * table, where it is gone. Its bytes are not cleared: a reused allocation is poisoned again
 * (FAKECUDA_POISON) or holds the old bytes, as a GPU's recycled memory does. At most KEEP_MAX
 * mappings and KEEP_BYTES bytes; the oldest is unmapped first. Guarded by keep_lock. */
#define KEEP_MAX   64
#define KEEP_BYTES (512ull << 20)
static struct {
    void *p;
    size_t bytes;
} keep[KEEP_MAX];
static size_t nkeep, keep_bytes;
static pthread_mutex_t keep_lock = PTHREAD_MUTEX_INITIALIZER;

/* A kept mapping of exactly `bytes` (page-rounded), or NULL. */
static void *keep_take(size_t bytes) {
    void *p = NULL;
    pthread_mutex_lock(&keep_lock);
    for (size_t i = nkeep; i-- > 0;) {
        if (keep[i].bytes != bytes)
            continue;
        p = keep[i].p;
        memmove(&keep[i], &keep[i + 1], (nkeep - i - 1) * sizeof keep[0]);
        nkeep--;
        keep_bytes -= bytes;
        break;
    }
    pthread_mutex_unlock(&keep_lock);
    return p;
}

/* Keeps the freed mapping [p, p + bytes) for reuse, or unmaps it (and the oldest ones, to make
 * room). */
static void keep_put(void *p, size_t bytes) {
    void *drop[KEEP_MAX];
    size_t ndrop = 0, dbytes[KEEP_MAX];
    int kept = 0;
    if (bytes <= KEEP_BYTES) {
        pthread_mutex_lock(&keep_lock);
        while (nkeep && (nkeep == KEEP_MAX || keep_bytes + bytes > KEEP_BYTES)) {
            drop[ndrop] = keep[0].p;
            dbytes[ndrop++] = keep[0].bytes;
            keep_bytes -= keep[0].bytes;
            memmove(&keep[0], &keep[1], (--nkeep) * sizeof keep[0]);
        }
        keep[nkeep].p = p;
        keep[nkeep++].bytes = bytes;
        keep_bytes += bytes;
        kept = 1;
        pthread_mutex_unlock(&keep_lock);
    }
    if (!kept)
        munmap(p, bytes);
    for (size_t i = 0; i < ndrop; i++)
        munmap(drop[i], dbytes[i]);
}

/* Allocates `size` bytes of simulated device memory; the range is exactly `size` long, so an
 * access past the end is illegal even inside the last page. */
static CUresult alloc_device(CUdeviceptr *out, size_t size) {
    if (!out || size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t acct = (size + 511) & ~(uint64_t)511;
    if (reserve_capacity(acct) != 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    void *p = keep_take(page_round(size));
    if (!p) /* populated in one call when the poison fill will touch every page anyway */
        p = mmap(NULL, page_round(size), PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | (g_fc.cfg.poison ? MAP_POPULATE : 0), -1, 0);
    if (p == MAP_FAILED) {
        release_capacity(acct);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    fc_range_t r = {.base = (uintptr_t)p,
                    .size = size,
                    .kind = FC_R_ALLOC,
                    .access = FC_ACC_RW,
                    .acct_bytes = acct,
                    .poison_due = g_fc.cfg.poison}; /* filled at its first access */
    pthread_rwlock_wrlock(&g_fc.mem_lock);
    r.id = ++g_fc.next_buffer_id;
    r.ctx = fc_ctx_current();
    int rc = insert_into(&g_fc.ranges, &g_fc.nranges, &g_fc.cap_ranges, &r);
    pthread_rwlock_unlock(&g_fc.mem_lock);
    if (rc != 0) {
        munmap(p, page_round(size));
        release_capacity(acct);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    FC_STAT(allocs_live, 1);
    FC_STAT(alloc_bytes_live, size);
    *out = (CUdeviceptr)(uintptr_t)p;
    return CUDA_SUCCESS;
}

/* Frees the allocation that starts at p. `async` is set when a queued cuMemFreeAsync runs it.
 * Returns CUDA_ERROR_INVALID_VALUE when p is not the start of a live allocation. */
static CUresult free_device(uintptr_t p, int async) {
    pthread_rwlock_wrlock(&g_fc.mem_lock);
    ssize_t i = find_le(g_fc.ranges, g_fc.nranges, p);
    if (i < 0 || g_fc.ranges[i].base != p || g_fc.ranges[i].kind != FC_R_ALLOC ||
        (!async && g_fc.ranges[i].async_pending)) {
        pthread_rwlock_unlock(&g_fc.mem_lock);
        return CUDA_ERROR_INVALID_VALUE;
    }
    fc_range_t r = g_fc.ranges[i];
    remove_at(g_fc.ranges, &g_fc.nranges, (size_t)i);
    pthread_rwlock_unlock(&g_fc.mem_lock);
    keep_put((void *)r.base, page_round(r.size));
    release_capacity(r.acct_bytes);
    FC_STAT(allocs_live, -1);
    FC_STAT(alloc_bytes_live, -(int64_t)r.size);
    return CUDA_SUCCESS;
}

static CUresult fc_mem_alloc(CUdeviceptr *p, size_t size) {
    FC_ENTER("cuMemAlloc");
    CUresult c = fc_capture_unsafe("cuMemAlloc");
    if (c != CUDA_SUCCESS)
        return c;
    return alloc_device(p, size);
}
FC_EXPORT(cuMemAlloc_v2, PFN_cuMemAlloc_v3020, fc_mem_alloc);

static CUresult fc_mem_alloc_pitch(CUdeviceptr *p, size_t *pitch, size_t width, size_t height,
                                   unsigned int elem) {
    FC_ENTER("cuMemAllocPitch");
    CUresult c = fc_capture_unsafe("cuMemAllocPitch");
    if (c != CUDA_SUCCESS)
        return c;
    if (!pitch || (elem != 4 && elem != 8 && elem != 16) || width == 0 || height == 0)
        return CUDA_ERROR_INVALID_VALUE;
    size_t pt = (width + 511) & ~(size_t)511;
    if (height > SIZE_MAX / pt)
        return CUDA_ERROR_INVALID_VALUE;
    *pitch = pt;
    return alloc_device(p, pt * height);
}
FC_EXPORT(cuMemAllocPitch_v2, PFN_cuMemAllocPitch_v3020, fc_mem_alloc_pitch);

/* cuMemFree synchronises with the device first, as the real one does. */
static CUresult fc_mem_free(CUdeviceptr p) {
    FC_ENTER("cuMemFree");
    if (p == 0)
        return CUDA_SUCCESS;
    CUresult r = fc_capture_unsafe("cuMemFree");
    if (r != CUDA_SUCCESS)
        return r;
    r = fc_sync_all();
    if (r != CUDA_SUCCESS)
        return r;
    return free_device((uintptr_t)p, 0);
}
FC_EXPORT(cuMemFree_v2, PFN_cuMemFree_v3020, fc_mem_free);

static CUresult fc_mem_info(size_t *free_b, size_t *total_b) {
    FC_ENTER("cuMemGetInfo");
    if (!free_b || !total_b)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_fc.stats_lock);
    *total_b = g_fc.cfg.mem_bytes;
    *free_b = g_fc.cfg.mem_bytes - g_fc.st.device_used_bytes;
    pthread_mutex_unlock(&g_fc.stats_lock);
    return CUDA_SUCCESS;
}
FC_EXPORT(cuMemGetInfo_v2, PFN_cuMemGetInfo_v3020, fc_mem_info);

static CUresult fc_mem_range(CUdeviceptr *base, size_t *size, CUdeviceptr p) {
    FC_ENTER("cuMemGetAddressRange");
    pthread_rwlock_rdlock(&g_fc.mem_lock);
    fc_range_t *r = find_range((uintptr_t)p);
    int ok = r && r->kind != FC_R_HOST;
    if (ok) {
        if (base)
            *base = r->base;
        if (size)
            *size = r->size;
    }
    pthread_rwlock_unlock(&g_fc.mem_lock);
    return ok ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}
FC_EXPORT(cuMemGetAddressRange_v2, PFN_cuMemGetAddressRange_v3020, fc_mem_range);

/* ---- stream-ordered allocation
 * ---------------------------------------------------------------------- */

static CUresult run_free_async(fc_op_t *op) {
    uintptr_t p = (uintptr_t)op->payload;
    uintptr_t lo = p, hi = p + 1;
    fc_mem_extent(p, &lo, &hi);
    fc_strict_check(lo, hi, "cuMemFreeAsync");
    return free_device(p, 1);
}

static CUresult alloc_async(CUdeviceptr *p, size_t size, CUstream hs, int ptds) {
    fc_stream_t *s = fc_stream_resolve(hs, ptds);
    if (!s)
        return CUDA_ERROR_INVALID_HANDLE;
    /* Graph memory nodes are not simulated: refused in a capture, which it invalidates. */
    CUresult c = fc_capture_refuse(s, "cuMemAllocAsync");
    if (c != CUDA_SUCCESS)
        return c;
    /* The memory is usable by work queued on the stream after this call: allocating it now is
     * indistinguishable from allocating it in stream order. */
    return alloc_device(p, size);
}

static CUresult free_async(CUdeviceptr p, CUstream hs, int ptds) {
    fc_stream_t *s = fc_stream_resolve(hs, ptds);
    if (!s)
        return CUDA_ERROR_INVALID_HANDLE;
    CUresult c = fc_capture_refuse(s, "cuMemFreeAsync");
    if (c != CUDA_SUCCESS)
        return c;
    pthread_rwlock_wrlock(&g_fc.mem_lock);
    ssize_t i = find_le(g_fc.ranges, g_fc.nranges, (uintptr_t)p);
    int ok = i >= 0 && g_fc.ranges[i].base == (uintptr_t)p && g_fc.ranges[i].kind == FC_R_ALLOC &&
             !g_fc.ranges[i].async_pending;
    if (ok)
        g_fc.ranges[i].async_pending = 1;
    pthread_rwlock_unlock(&g_fc.mem_lock);
    if (!ok)
        return CUDA_ERROR_INVALID_VALUE;
    fc_op_t *op = fc_op_new("cuMemFreeAsync", run_free_async, (void *)(uintptr_t)p, NULL);
    if (!op)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = fc_submit(s, op, NULL);
    if (r != CUDA_SUCCESS) {
        /* Not queued: the allocation stays live. */
        pthread_rwlock_wrlock(&g_fc.mem_lock);
        ssize_t j = find_le(g_fc.ranges, g_fc.nranges, (uintptr_t)p);
        if (j >= 0 && g_fc.ranges[j].base == (uintptr_t)p)
            g_fc.ranges[j].async_pending = 0;
        pthread_rwlock_unlock(&g_fc.mem_lock);
    }
    return r;
}

static CUresult fc_alloc_async(CUdeviceptr *p, size_t size, CUstream s) {
    FC_ENTER("cuMemAllocAsync");
    return alloc_async(p, size, s, 0);
}
FC_EXPORT(cuMemAllocAsync, PFN_cuMemAllocAsync_v11020, fc_alloc_async);

static CUresult fc_alloc_async_ptsz(CUdeviceptr *p, size_t size, CUstream s) {
    FC_ENTER("cuMemAllocAsync");
    return alloc_async(p, size, s, 1);
}
FC_EXPORT(cuMemAllocAsync_ptsz, PFN_cuMemAllocAsync_v11020_ptsz, fc_alloc_async_ptsz);

struct CUmemPoolHandle_st {
    uint32_t magic;
};
static struct CUmemPoolHandle_st default_pool = {0x504f4f4cu};

static CUresult fc_default_pool(CUmemoryPool *pool, CUdevice d) {
    FC_ENTER_INIT("cuDeviceGetDefaultMemPool");
    if (!pool)
        return CUDA_ERROR_INVALID_VALUE;
    if (d != 0)
        return CUDA_ERROR_INVALID_DEVICE;
    *pool = &default_pool;
    return CUDA_SUCCESS;
}
FC_EXPORT(cuDeviceGetDefaultMemPool, PFN_cuDeviceGetDefaultMemPool_v11020, fc_default_pool);

static CUresult fc_alloc_pool(CUdeviceptr *p, size_t size, CUmemoryPool pool, CUstream s) {
    FC_ENTER("cuMemAllocFromPoolAsync");
    if (pool != &default_pool)
        return CUDA_ERROR_INVALID_VALUE;
    return alloc_async(p, size, s, 0);
}
FC_EXPORT(cuMemAllocFromPoolAsync, PFN_cuMemAllocFromPoolAsync_v11020, fc_alloc_pool);

static CUresult fc_alloc_pool_ptsz(CUdeviceptr *p, size_t size, CUmemoryPool pool, CUstream s) {
    FC_ENTER("cuMemAllocFromPoolAsync");
    if (pool != &default_pool)
        return CUDA_ERROR_INVALID_VALUE;
    return alloc_async(p, size, s, 1);
}
FC_EXPORT(cuMemAllocFromPoolAsync_ptsz, PFN_cuMemAllocFromPoolAsync_v11020_ptsz,
          fc_alloc_pool_ptsz);

static CUresult fc_free_async(CUdeviceptr p, CUstream s) {
    FC_ENTER("cuMemFreeAsync");
    return free_async(p, s, 0);
}
FC_EXPORT(cuMemFreeAsync, PFN_cuMemFreeAsync_v11020, fc_free_async);

static CUresult fc_free_async_ptsz(CUdeviceptr p, CUstream s) {
    FC_ENTER("cuMemFreeAsync");
    return free_async(p, s, 1);
}
FC_EXPORT(cuMemFreeAsync_ptsz, PFN_cuMemFreeAsync_v11020_ptsz, fc_free_async_ptsz);

/* ---- pinned host memory
 * ---------------------------------------------------------------------------- */

static CUresult host_alloc(void **pp, size_t size) {
    if (!pp || size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    /* Populated: the real driver pins (page-locks) every page here, so no copy ever faults on
     * one. Left to fault at its first copy, it charged that copy (the shim's pool of host slots,
     * hundreds of MiB, filled over a replay's first iterations: 80,000 faults in a 12-iteration
     * `large` replay, 11,600 with this). */
    void *p = mmap(NULL, page_round(size), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (p == MAP_FAILED)
        return CUDA_ERROR_OUT_OF_MEMORY;
    fc_range_t r = {.base = (uintptr_t)p,
                    .size = size,
                    .kind = FC_R_HOST,
                    .access = FC_ACC_RW,
                    .host_owned = 1};
    pthread_rwlock_wrlock(&g_fc.mem_lock);
    r.id = ++g_fc.next_buffer_id;
    r.ctx = fc_ctx_current();
    int rc = insert_into(&g_fc.ranges, &g_fc.nranges, &g_fc.cap_ranges, &r);
    pthread_rwlock_unlock(&g_fc.mem_lock);
    if (rc != 0) {
        munmap(p, page_round(size));
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    FC_STAT(host_allocs_live, 1);
    FC_STAT(host_alloc_bytes_live, size);
    *pp = p;
    return CUDA_SUCCESS;
}

static CUresult fc_host_alloc(void **pp, size_t size, unsigned int flags) {
    FC_ENTER("cuMemHostAlloc");
    if (flags & ~(unsigned)(CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP |
                            CU_MEMHOSTALLOC_WRITECOMBINED))
        return CUDA_ERROR_INVALID_VALUE;
    return host_alloc(pp, size);
}
FC_EXPORT(cuMemHostAlloc, PFN_cuMemHostAlloc_v2020, fc_host_alloc);

static CUresult fc_alloc_host(void **pp, size_t size) {
    FC_ENTER("cuMemAllocHost");
    return host_alloc(pp, size);
}
FC_EXPORT(cuMemAllocHost_v2, PFN_cuMemAllocHost_v3020, fc_alloc_host);

/* Removes the pinned host range starting at p (owned: allocated by us, else registered). */
static CUresult host_remove(void *p, int owned) {
    pthread_rwlock_wrlock(&g_fc.mem_lock);
    ssize_t i = find_le(g_fc.ranges, g_fc.nranges, (uintptr_t)p);
    if (i < 0 || g_fc.ranges[i].base != (uintptr_t)p || g_fc.ranges[i].kind != FC_R_HOST ||
        g_fc.ranges[i].host_owned != owned) {
        pthread_rwlock_unlock(&g_fc.mem_lock);
        return owned ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
    }
    fc_range_t r = g_fc.ranges[i];
    remove_at(g_fc.ranges, &g_fc.nranges, (size_t)i);
    pthread_rwlock_unlock(&g_fc.mem_lock);
    if (owned) {
        munmap(p, page_round(r.size));
        FC_STAT(host_allocs_live, -1);
        FC_STAT(host_alloc_bytes_live, -(int64_t)r.size);
    }
    return CUDA_SUCCESS;
}

static CUresult fc_free_host(void *p) {
    FC_ENTER("cuMemFreeHost");
    CUresult r = fc_sync_all();
    if (r != CUDA_SUCCESS)
        return r;
    return host_remove(p, 1);
}
FC_EXPORT(cuMemFreeHost, PFN_cuMemFreeHost_v2000, fc_free_host);

static CUresult fc_host_dev_ptr(CUdeviceptr *d, void *p, unsigned int flags) {
    FC_ENTER("cuMemHostGetDevicePointer");
    if (!d || flags != 0 || !fc_mem_is_pinned_host((uintptr_t)p))
        return CUDA_ERROR_INVALID_VALUE;
    *d = (CUdeviceptr)(uintptr_t)p;
    return CUDA_SUCCESS;
}
FC_EXPORT(cuMemHostGetDevicePointer_v2, PFN_cuMemHostGetDevicePointer_v3020, fc_host_dev_ptr);

static CUresult fc_host_register(void *p, size_t size, unsigned int flags) {
    FC_ENTER("cuMemHostRegister");
    (void)flags;
    if (!p || size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    fc_range_t r = {.base = (uintptr_t)p, .size = size, .kind = FC_R_HOST, .access = FC_ACC_RW};
    pthread_rwlock_wrlock(&g_fc.mem_lock);
    ssize_t i = find_le(g_fc.ranges, g_fc.nranges, (uintptr_t)p + size - 1);
    if (i >= 0 && g_fc.ranges[i].base + g_fc.ranges[i].size > (uintptr_t)p) {
        pthread_rwlock_unlock(&g_fc.mem_lock);
        return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
    }
    r.id = ++g_fc.next_buffer_id;
    r.ctx = fc_ctx_current();
    int rc = insert_into(&g_fc.ranges, &g_fc.nranges, &g_fc.cap_ranges, &r);
    pthread_rwlock_unlock(&g_fc.mem_lock);
    return rc ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_SUCCESS;
}
FC_EXPORT(cuMemHostRegister_v2, PFN_cuMemHostRegister_v6050, fc_host_register);

static CUresult fc_host_unregister(void *p) {
    FC_ENTER("cuMemHostUnregister");
    CUresult r = fc_sync_all();
    if (r != CUDA_SUCCESS)
        return r;
    return host_remove(p, 0);
}
FC_EXPORT(cuMemHostUnregister, PFN_cuMemHostUnregister_v4000, fc_host_unregister);

/* ---- pointer attributes
 * ----------------------------------------------------------------------------- */

/* One attribute of the range holding p; CUDA_ERROR_INVALID_VALUE for a pointer the driver does
 * not know or an attribute it does not simulate. */
static CUresult pointer_attr(void *data, CUpointer_attribute a, CUdeviceptr p) {
    if (!data)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_rwlock_rdlock(&g_fc.mem_lock);
    fc_range_t *r = find_range((uintptr_t)p);
    fc_range_t copy;
    if (r)
        copy = *r;
    pthread_rwlock_unlock(&g_fc.mem_lock);
    if (!r)
        return CUDA_ERROR_INVALID_VALUE;
    switch (a) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
        *(CUcontext *)data = copy.ctx;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
        *(unsigned int *)data = copy.kind == FC_R_HOST ? CU_MEMORYTYPE_HOST : CU_MEMORYTYPE_DEVICE;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
        *(CUdeviceptr *)data = p;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
        if (copy.kind != FC_R_HOST)
            return CUDA_ERROR_INVALID_VALUE;
        *(void **)data = (void *)(uintptr_t)p;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
        *(int *)data = 0;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED:
        *(int *)data = 0;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MAPPED:
        *(int *)data = 1;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_BUFFER_ID:
        *(unsigned long long *)data = copy.id;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
        *(CUdeviceptr *)data = copy.base;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
        *(size_t *)data = copy.size;
        return CUDA_SUCCESS;
    default:
        return CUDA_ERROR_INVALID_VALUE;
    }
}

static CUresult fc_pointer_attr(void *data, CUpointer_attribute a, CUdeviceptr p) {
    FC_ENTER("cuPointerGetAttribute");
    return pointer_attr(data, a, p);
}
FC_EXPORT(cuPointerGetAttribute, PFN_cuPointerGetAttribute_v4000, fc_pointer_attr);

/* The size of one attribute's value, 0 for an attribute this driver does not simulate. */
static size_t attr_size(CUpointer_attribute a) {
    switch (a) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
        return sizeof(CUcontext);
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
        return sizeof(unsigned int);
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
        return sizeof(CUdeviceptr);
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
        return sizeof(void *);
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
    case CU_POINTER_ATTRIBUTE_IS_MANAGED:
    case CU_POINTER_ATTRIBUTE_MAPPED:
        return sizeof(int);
    case CU_POINTER_ATTRIBUTE_BUFFER_ID:
        return sizeof(unsigned long long);
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
        return sizeof(size_t);
    default:
        return 0;
    }
}

/* As documented, and unlike cuPointerGetAttribute: a pointer the driver does not know is not an
 * error; its attributes read as zero (NULL), and so does an attribute that does not apply to it
 * (the host pointer of device memory). An attribute that is not simulated is an invalid value. */
static CUresult fc_pointer_attrs(unsigned int n, CUpointer_attribute *attrs, void **data,
                                 CUdeviceptr p) {
    FC_ENTER("cuPointerGetAttributes");
    if (n == 0 || !attrs || !data)
        return CUDA_ERROR_INVALID_VALUE;
    for (unsigned i = 0; i < n; i++)
        if (!data[i] || attr_size(attrs[i]) == 0)
            return CUDA_ERROR_INVALID_VALUE;
    for (unsigned i = 0; i < n; i++)
        if (pointer_attr(data[i], attrs[i], p) != CUDA_SUCCESS)
            memset(data[i], 0, attr_size(attrs[i]));
    return CUDA_SUCCESS;
}
FC_EXPORT(cuPointerGetAttributes, PFN_cuPointerGetAttributes_v7000, fc_pointer_attrs);

/* ---- VMM: reservations
 * ------------------------------------------------------------------------------ */

static CUresult fc_addr_reserve(CUdeviceptr *out, size_t size, size_t align, CUdeviceptr addr,
                                unsigned long long flags) {
    FC_ENTER("cuMemAddressReserve");
    uint64_t g = g_fc.cfg.granularity;
    if (!out || size == 0 || size % g || flags != 0 || (align && (align & (align - 1))))
        return CUDA_ERROR_INVALID_VALUE;
    if (align < g)
        align = g;
    void *p = MAP_FAILED;
    if (addr && addr % align == 0)
        p = mmap((void *)(uintptr_t)addr, size, PROT_NONE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
    if (p == MAP_FAILED) {
        if (size > SIZE_MAX - align)
            return CUDA_ERROR_OUT_OF_MEMORY;
        char *raw =
            mmap(NULL, size + align, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (raw == MAP_FAILED)
            return CUDA_ERROR_OUT_OF_MEMORY;
        uintptr_t a = ((uintptr_t)raw + align - 1) & ~(uintptr_t)(align - 1);
        if (a > (uintptr_t)raw)
            munmap(raw, a - (uintptr_t)raw);
        uintptr_t end = (uintptr_t)raw + size + align;
        if (end > a + size)
            munmap((void *)(a + size), end - (a + size));
        p = (void *)a;
    }
    fc_range_t r = {.base = (uintptr_t)p, .size = size};
    pthread_rwlock_wrlock(&g_fc.mem_lock);
    int rc = insert_into(&g_fc.resv, &g_fc.nresv, &g_fc.cap_resv, &r);
    pthread_rwlock_unlock(&g_fc.mem_lock);
    if (rc) {
        munmap(p, size);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    FC_STAT(reservations_live, 1);
    FC_STAT(reserved_bytes_live, size);
    *out = (CUdeviceptr)(uintptr_t)p;
    return CUDA_SUCCESS;
}
FC_EXPORT(cuMemAddressReserve, PFN_cuMemAddressReserve_v10020, fc_addr_reserve);

/* Frees a whole reservation. Refused while any part of it is still mapped. */
static CUresult fc_addr_free(CUdeviceptr p, size_t size) {
    FC_ENTER("cuMemAddressFree");
    /* vm_lock: no cuMemMap is between its check and its entry in the table here. */
    pthread_mutex_lock(&g_fc.vm_lock);
    pthread_rwlock_wrlock(&g_fc.mem_lock);
    ssize_t i = find_le(g_fc.resv, g_fc.nresv, (uintptr_t)p);
    if (i < 0 || g_fc.resv[i].base != (uintptr_t)p || g_fc.resv[i].size != size) {
        pthread_rwlock_unlock(&g_fc.mem_lock);
        pthread_mutex_unlock(&g_fc.vm_lock);
        return CUDA_ERROR_INVALID_VALUE;
    }
    ssize_t m = find_le(g_fc.ranges, g_fc.nranges, (uintptr_t)p + size - 1);
    if (m >= 0 && g_fc.ranges[m].base + g_fc.ranges[m].size > (uintptr_t)p &&
        g_fc.ranges[m].base < (uintptr_t)p + size) {
        pthread_rwlock_unlock(&g_fc.mem_lock);
        pthread_mutex_unlock(&g_fc.vm_lock);
        fc_warn("cuMemAddressFree(%#llx, %zu): the range is still mapped", (unsigned long long)p,
                size);
        return CUDA_ERROR_INVALID_VALUE;
    }
    remove_at(g_fc.resv, &g_fc.nresv, (size_t)i);
    pthread_rwlock_unlock(&g_fc.mem_lock);
    munmap((void *)(uintptr_t)p, size);
    pthread_mutex_unlock(&g_fc.vm_lock);
    FC_STAT(reservations_live, -1);
    FC_STAT(reserved_bytes_live, -(int64_t)size);
    return CUDA_SUCCESS;
}
FC_EXPORT(cuMemAddressFree, PFN_cuMemAddressFree_v10020, fc_addr_free);

/* ---- VMM: physical handles
 * ------------------------------------------------------------------------- */

static int location_is_host(const CUmemLocation *l) {
    return l->type == CU_MEM_LOCATION_TYPE_HOST || l->type == CU_MEM_LOCATION_TYPE_HOST_NUMA ||
           l->type == CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT;
}

static fc_handle_t *handle_of(CUmemGenericAllocationHandle h) {
    fc_handle_t *x = (fc_handle_t *)(uintptr_t)h;
    return (x && x->magic == FC_MAGIC_HANDLE) ? x : NULL;
}

/* Caller holds vm_lock (the parked mappings). */
static void handle_destroy(fc_handle_t *h) {
    for (int i = 0; i < h->npark; i++)
        munmap((void *)h->park[i].addr, h->park[i].size);
    close(h->fd);
    if (location_is_host(&h->prop.location)) {
        FC_STAT(vmm_host_bytes_live, -(int64_t)h->size);
    } else {
        FC_STAT(vmm_device_bytes_live, -(int64_t)h->size);
        release_capacity(h->size);
    }
    FC_STAT(vmm_handles_live, -1);
    h->magic = 0;
    free(h);
}

static CUresult fc_mem_create(CUmemGenericAllocationHandle *out, size_t size,
                              const CUmemAllocationProp *prop, unsigned long long flags) {
    FC_ENTER("cuMemCreate");
    uint64_t t0 = fc_now_ns();
    if (!out || !prop || size == 0 || size % g_fc.cfg.granularity || flags != 0 ||
        prop->type != CU_MEM_ALLOCATION_TYPE_PINNED)
        return CUDA_ERROR_INVALID_VALUE;
    int host = location_is_host(&prop->location);
    if (host && !g_fc.cfg.host_vmm)
        return CUDA_ERROR_NOT_SUPPORTED;
    if (!host && (prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE || prop->location.id != 0))
        return CUDA_ERROR_INVALID_DEVICE;
    if (!host && reserve_capacity(size) != 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    fc_handle_t *h = calloc(1, sizeof *h);
    int fd = h ? memfd_create("fakecuda-vmm", MFD_CLOEXEC) : -1;
    if (fd < 0 || ftruncate(fd, (off_t)size) != 0) {
        if (fd >= 0)
            close(fd);
        free(h);
        if (!host)
            release_capacity(size);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (g_fc.cfg.poison && !host) {
        /* Fresh device memory holds garbage on a GPU: make reading it before writing visible. */
        void *tmp = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (tmp != MAP_FAILED) {
            memset(tmp, 0xff, size);
            munmap(tmp, size);
        }
    }
    h->magic = FC_MAGIC_HANDLE;
    h->fd = fd;
    h->size = size;
    h->prop = *prop;
    h->user_refs = 1;
    FC_STAT(vmm_handles_live, 1);
    if (host)
        FC_STAT(vmm_host_bytes_live, size);
    else
        FC_STAT(vmm_device_bytes_live, size);
    *out = (CUmemGenericAllocationHandle)(uintptr_t)h;
    fc_host_cost(t0, fc_vmm_cost(host ? VMM_HOST_CREATE : VMM_CREATE, size));
    return CUDA_SUCCESS;
}
FC_EXPORT(cuMemCreate, PFN_cuMemCreate_v10020, fc_mem_create);

/* Drops the user's reference; the memory goes once no mapping uses it (as on the driver). */
static CUresult fc_mem_release(CUmemGenericAllocationHandle hh) {
    FC_ENTER("cuMemRelease");
    pthread_mutex_lock(&g_fc.vm_lock);
    pthread_rwlock_wrlock(&g_fc.mem_lock);
    fc_handle_t *h = handle_of(hh);
    if (!h || h->user_refs <= 0) {
        pthread_rwlock_unlock(&g_fc.mem_lock);
        pthread_mutex_unlock(&g_fc.vm_lock);
        return CUDA_ERROR_INVALID_VALUE;
    }
    int gone = --h->user_refs == 0 && h->maps == 0;
    pthread_rwlock_unlock(&g_fc.mem_lock);
    if (gone)
        handle_destroy(h);
    pthread_mutex_unlock(&g_fc.vm_lock);
    return CUDA_SUCCESS;
}
FC_EXPORT(cuMemRelease, PFN_cuMemRelease_v10020, fc_mem_release);

static CUresult fc_mem_props(CUmemAllocationProp *prop, CUmemGenericAllocationHandle hh) {
    FC_ENTER("cuMemGetAllocationPropertiesFromHandle");
    fc_handle_t *h = handle_of(hh);
    if (!prop || !h)
        return CUDA_ERROR_INVALID_VALUE;
    *prop = h->prop;
    return CUDA_SUCCESS;
}
FC_EXPORT(cuMemGetAllocationPropertiesFromHandle, PFN_cuMemGetAllocationPropertiesFromHandle_v10020,
          fc_mem_props);

static CUresult fc_mem_retain(CUmemGenericAllocationHandle *out, void *addr) {
    FC_ENTER("cuMemRetainAllocationHandle");
    if (!out)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_rwlock_wrlock(&g_fc.mem_lock);
    fc_range_t *r = find_range((uintptr_t)addr);
    int ok = r && r->kind == FC_R_MAP;
    if (ok) {
        r->h->user_refs++;
        *out = (CUmemGenericAllocationHandle)(uintptr_t)r->h;
    }
    pthread_rwlock_unlock(&g_fc.mem_lock);
    return ok ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
FC_EXPORT(cuMemRetainAllocationHandle, PFN_cuMemRetainAllocationHandle_v11000, fc_mem_retain);

/* CUDA IPC: memory from cuMemAlloc can be exported; the handle names the allocation (its buffer
 * id, its base and size). Nothing else can (VMM memory needs a shareable handle type, host
 * memory is not device memory): CUDA_ERROR_INVALID_VALUE, as for an unknown pointer. The
 * simulated device runs one process, so no other process ever opens the handle. */
static CUresult fc_ipc_get_mem_handle(CUipcMemHandle *out, CUdeviceptr p) {
    FC_ENTER("cuIpcGetMemHandle");
    if (!out)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_rwlock_rdlock(&g_fc.mem_lock);
    fc_range_t *r = find_range((uintptr_t)p);
    int ok = r && r->kind == FC_R_ALLOC;
    if (ok) {
        uint64_t words[3] = {r->id, (uint64_t)r->base, (uint64_t)r->size};
        memset(out, 0, sizeof *out);
        memcpy(out->reserved, words, sizeof words);
    }
    pthread_rwlock_unlock(&g_fc.mem_lock);
    return ok ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
FC_EXPORT(cuIpcGetMemHandle, PFN_cuIpcGetMemHandle_v4010, fc_ipc_get_mem_handle);

/* Multicast (NVLS): the simulated device has no multicast objects (its
 * CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED is 0 and cuMulticastCreate is not exported), so every
 * handle is unknown: CUDA_ERROR_INVALID_VALUE, after the argument checks the driver makes. */
static CUresult fc_multicast_bind_addr(CUmemGenericAllocationHandle mc, size_t mc_offset,
                                       CUdeviceptr p, size_t size, unsigned long long flags) {
    FC_ENTER("cuMulticastBindAddr");
    (void)mc, (void)mc_offset, (void)p, (void)size, (void)flags;
    return CUDA_ERROR_INVALID_VALUE;
}
FC_EXPORT(cuMulticastBindAddr, PFN_cuMulticastBindAddr_v12010, fc_multicast_bind_addr);

static CUresult fc_mem_granularity(size_t *g, const CUmemAllocationProp *prop,
                                   CUmemAllocationGranularity_flags option) {
    FC_ENTER("cuMemGetAllocationGranularity");
    (void)option;
    if (!g || !prop)
        return CUDA_ERROR_INVALID_VALUE;
    if (location_is_host(&prop->location) && !g_fc.cfg.host_vmm)
        return CUDA_ERROR_NOT_SUPPORTED;
    *g = g_fc.cfg.granularity;
    return CUDA_SUCCESS;
}
FC_EXPORT(cuMemGetAllocationGranularity, PFN_cuMemGetAllocationGranularity_v10020,
          fc_mem_granularity);

/* ---- VMM: mapping
 * ----------------------------------------------------------------------------------- */

/* Is [p, p + size) inside one reservation? Caller holds mem_lock. */
static int in_reservation(uintptr_t p, size_t size) {
    ssize_t i = find_le(g_fc.resv, g_fc.nresv, p);
    return i >= 0 && p + size <= g_fc.resv[i].base + g_fc.resv[i].size && p + size > p;
}

/* Host page tables. The simulated device's memory is host memory at the same address, so every
 * cuMemMap is a host mapping of the handle's memfd, and a fresh one costs a fault per page at its
 * first touch. Under a hypervisor that shadows page tables (this project's development and CI
 * machines) that is about 5 us per 4 KiB page even when populated: 2.8 ms of host time to map a
 * 2 MiB chunk and copy into it, where the timing model charges 0.6 ms for the copy at 3.3 GB/s.
 * The shim remaps chunks all the time, so the simulator, not the model, would set the pace.
 * Hence: a mapping is made readable and writable, and populated, at once (which access a kernel
 * or copy may use is the range table's, checked at every access, not the host's protection); and
 * cuMemUnmap moves the host mapping aside with its page tables (mremap onto a PROT_NONE
 * reservation of its own, then a PROT_NONE placeholder over the address), where a later cuMemMap
 * of the same part of the handle moves it back (mremap onto the placeholder). At most eight
 * parked per handle (fc_internal.h).
 *
 * Until 2026-12-02 the mapping was moved aside with MREMAP_DONTUNMAP (never a hole at the
 * address) and at most two were kept per handle. On the machines of that day (Linux 6.18 under a
 * paravirtualised hypervisor), a first copy into a 2 MiB mapping moved back that way took a
 * median of 2.9-3.0 ms, against 0.15-0.19 ms moved aside plainly (build/test/progs/remapcost,
 * FAKECUDA_SCHED=threaded, 200 rounds; a second copy 0.08-0.26 ms), and the map and unmap
 * 0.41-0.44 ms against 0.06-0.07. And the shim leaves a physical chunk mapped at up to five
 * addresses at once: with room for two, 39% of a replay's maps were made afresh. Together, a
 * short-kernel `large` replay at 1/4 (one plan predicting 85.6 ms) measured 224-286 ms per
 * iteration, half its CPU stalled in those copies; 83.7-84.8 ms after both changes. */
/* Moving page tables costs a TLB shootdown on every core that runs the process (15-25 us here,
 * with another thread busy), once when parked and once when moved back; populating a fresh
 * mapping costs about 0.5 us a page. Measured on this project's development machine with a
 * thread spinning beside (a cycle of unmap and map): 64 KiB 41 us parked against 28 afresh,
 * 128 KiB 49 against 31, 256 KiB 48 against 57, 2 MiB 55 against 279. So smaller mappings are
 * made afresh (on 2026-12-02's machines too: `mlp` with 64 KiB chunks replayed at 52-54 ms made
 * afresh against 64-67 with them parked). */
#define PARK_MIN_BYTES (256u << 10)

/* Moves a parked mapping of h's [offset, offset + size) onto the placeholder at p. 1 when done,
 * 0 when none was parked (or the move failed, and the parked mapping was dropped). Caller holds
 * vm_lock. */
static int park_take(fc_handle_t *h, uintptr_t p, size_t size, size_t offset) {
    for (int i = 0; i < h->npark; i++) {
        if (h->park[i].offset != offset || h->park[i].size != size)
            continue;
        void *from = (void *)h->park[i].addr;
        h->park[i] = h->park[--h->npark];
        if (mremap(from, size, size, MREMAP_MAYMOVE | MREMAP_FIXED, (void *)p) != MAP_FAILED) {
            FC_STAT(maps_moved, 1);
            return 1;
        }
        munmap(from, size);
        return 0;
    }
    return 0;
}

/* Moves the host mapping of range r (about to be unmapped) aside, page tables kept, and puts a
 * placeholder at its address. Caller holds vm_lock. */
static void park_put(const fc_range_t *r) {
    fc_handle_t *h = r->h;
    if (r->size < PARK_MIN_BYTES || h->npark == (int)(sizeof h->park / sizeof h->park[0]))
        return;
    /* Moved onto a reservation of its own (page tables and all), and a placeholder put at once
     * where it was; the placeholder must not replace anything: between the two calls the address
     * is a hole, and another thread's mmap could, very rarely, have taken it. */
    void *to = mmap(NULL, r->size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (to == MAP_FAILED)
        return;
    if (mremap((void *)r->base, r->size, r->size, MREMAP_MAYMOVE | MREMAP_FIXED, to) ==
        MAP_FAILED) {
        munmap(to, r->size);
        return;
    }
    void *ph = mmap((void *)r->base, r->size, PROT_NONE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
    if (ph != (void *)r->base) {
        fc_warn("cuMemUnmap: the reserved range at %#lx was taken by another mapping while its "
                "memory moved aside; the simulated device cannot keep its reservation",
                (unsigned long)r->base);
        abort();
    }
    h->park[h->npark].addr = (uintptr_t)to;
    h->park[h->npark].offset = r->map_offset;
    h->park[h->npark++].size = r->size;
}

static CUresult fc_mem_map(CUdeviceptr ptr, size_t size, size_t offset,
                           CUmemGenericAllocationHandle hh, unsigned long long flags) {
    FC_ENTER("cuMemMap");
    uint64_t t0 = fc_now_ns();
    uint64_t g = g_fc.cfg.granularity;
    uintptr_t p = (uintptr_t)ptr;
    if (size == 0 || p % g || size % g || offset % g || flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    /* Checked under both locks, the host mapping made under vm_lock alone (no other call can map,
     * unmap or free this range, nor release the handle, meanwhile), then published in the table. */
    pthread_mutex_lock(&g_fc.vm_lock);
    pthread_rwlock_rdlock(&g_fc.mem_lock);
    fc_handle_t *h = handle_of(hh);
    CUresult rc = CUDA_SUCCESS;
    if (!h || h->user_refs <= 0 || offset > h->size || size > h->size - offset ||
        !in_reservation(p, size)) {
        rc = CUDA_ERROR_INVALID_VALUE;
    } else {
        ssize_t i = find_le(g_fc.ranges, g_fc.nranges, p + size - 1);
        if (i >= 0 && g_fc.ranges[i].base + g_fc.ranges[i].size > p)
            rc = CUDA_ERROR_INVALID_VALUE; /* already mapped */
    }
    pthread_rwlock_unlock(&g_fc.mem_lock);
    if (rc == CUDA_SUCCESS) {
        void *m = park_take(h, p, size, offset)
                      ? (void *)p
                      : mmap((void *)p, size, PROT_READ | PROT_WRITE,
                             MAP_SHARED | MAP_FIXED | MAP_POPULATE, h->fd, (off_t)offset);
        if (m == MAP_FAILED) {
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            fc_range_t r = {.base = p,
                            .size = size,
                            .kind = FC_R_MAP,
                            .access = FC_ACC_NONE,
                            .h = h,
                            .map_offset = offset,
                            .ctx = fc_ctx_current()};
            pthread_rwlock_wrlock(&g_fc.mem_lock);
            r.id = ++g_fc.next_buffer_id;
            if (insert_into(&g_fc.ranges, &g_fc.nranges, &g_fc.cap_ranges, &r) != 0)
                rc = CUDA_ERROR_OUT_OF_MEMORY;
            else
                h->maps++;
            pthread_rwlock_unlock(&g_fc.mem_lock);
            if (rc != CUDA_SUCCESS)
                mmap((void *)p, size, PROT_NONE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
        }
    }
    pthread_mutex_unlock(&g_fc.vm_lock);
    if (rc == CUDA_SUCCESS) {
        FC_STAT(mappings_live, 1);
        FC_STAT(mapped_bytes_live, size);
        fc_host_cost(t0, fc_vmm_cost(VMM_MAP, size));
    }
    return rc;
}
FC_EXPORT(cuMemMap, PFN_cuMemMap_v10020, fc_mem_map);

/* Finds the run of mappings that exactly covers [p, p + size): first index and count.
 * Caller holds mem_lock. Returns -1 when the range does not consist of whole mappings. */
static int whole_mappings(uintptr_t p, size_t size, size_t *first, size_t *count) {
    ssize_t i = find_le(g_fc.ranges, g_fc.nranges, p);
    if (i < 0 || g_fc.ranges[i].base != p || g_fc.ranges[i].kind != FC_R_MAP)
        return -1;
    uintptr_t cur = p, end = p + size;
    size_t n = 0;
    for (size_t j = (size_t)i; j < g_fc.nranges && cur < end; j++, n++) {
        const fc_range_t *r = &g_fc.ranges[j];
        if (r->kind != FC_R_MAP || r->base != cur)
            return -1;
        cur += r->size;
    }
    if (cur != end)
        return -1;
    *first = (size_t)i;
    *count = n;
    return 0;
}

/* Microseconds per MiB beyond the first 2 of a mapping or handle, per VMM_* call, from an H200
 * with driver 580 (profiles/gpu/h200/first-contact/probes.tsv, row hostvmm: medians of 20 for
 * one mapping of 2 and of 32 MiB): device set access 26.8 and 41.5 us, unmap 17.5 and 24.2,
 * create 27.5 and 27.7; host-located set access 59.2 and 407.0, unmap 33.0 and 108.2, create 468.5
 * and 8005.7. A device mapping costs nearly the same whatever its size; host-located memory does
 * not. */
static const double vmm_us_per_mib[7] = {0, 0.49, 0.22, 0.01, 11.6, 2.5, 251.0};

double fc_vmm_cost(int kind, size_t size) {
    double mib = (double)size / (1 << 20);
    return g_fc.cfg.vmm_us[kind] + (mib > 2 ? (mib - 2) * vmm_us_per_mib[kind] : 0);
}

/* The timing model's host cost of acting on `count` mappings from `first`: call `dev` on each
 * mapping of device-located memory, `host` on each of host-located. Caller holds mem_lock. */
static double mappings_cost(size_t first, size_t count, int dev, int host) {
    double us = 0;
    for (size_t k = 0; k < count; k++) {
        const fc_range_t *r = &g_fc.ranges[first + k];
        us += fc_vmm_cost(location_is_host(&r->h->prop.location) ? host : dev, r->size);
    }
    return us;
}

static CUresult fc_mem_unmap(CUdeviceptr ptr, size_t size) {
    FC_ENTER("cuMemUnmap");
    uint64_t t0 = fc_now_ns();
    uintptr_t p = (uintptr_t)ptr;
    size_t first, count;
    if (size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    /* Unmapping does not wait for running work: report any that still references the range
     * (FAKECUDA_REMAP_QUEUED=wait: it waits for it first). */
    fc_unmap_wait(p, p + size, "cuMemUnmap");
    fc_strict_check(p, p + size, "cuMemUnmap");
    /* The mappings leave the table under mem_lock (a kernel or copy that looks now finds them
     * gone); their host mappings are moved aside and replaced under vm_lock alone. */
    pthread_mutex_lock(&g_fc.vm_lock);
    pthread_rwlock_wrlock(&g_fc.mem_lock);
    if (whole_mappings(p, size, &first, &count) != 0) {
        pthread_rwlock_unlock(&g_fc.mem_lock);
        pthread_mutex_unlock(&g_fc.vm_lock);
        return CUDA_ERROR_INVALID_VALUE;
    }
    fc_range_t few[8], *gone = count <= 8 ? few : malloc(count * sizeof *gone);
    if (!gone) {
        pthread_rwlock_unlock(&g_fc.mem_lock);
        pthread_mutex_unlock(&g_fc.vm_lock);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    double cost = mappings_cost(first, count, VMM_UNMAP, VMM_HOST_UNMAP);
    memcpy(gone, &g_fc.ranges[first], count * sizeof *gone);
    for (size_t k = 0; k < count; k++)
        gone[k].h->maps--;
    memmove(&g_fc.ranges[first], &g_fc.ranges[first + count],
            (g_fc.nranges - first - count) * sizeof(fc_range_t));
    g_fc.nranges -= count;
    pthread_rwlock_unlock(&g_fc.mem_lock);
    for (size_t k = 0; k < count; k++)
        if (gone[k].h->maps > 0 || gone[k].h->user_refs > 0)
            park_put(&gone[k]);
    /* A PROT_NONE placeholder keeps the reservation whole. */
    mmap((void *)p, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1,
         0);
    /* A handle mapped twice in the range is destroyed once, at its last mapping's entry. */
    for (size_t k = 0; k < count; k++) {
        fc_handle_t *h = gone[k].h;
        int last = h->maps == 0 && h->user_refs == 0;
        for (size_t j = k + 1; last && j < count; j++)
            last = gone[j].h != h;
        if (last)
            handle_destroy(h);
    }
    pthread_mutex_unlock(&g_fc.vm_lock);
    if (gone != few)
        free(gone);
    FC_STAT(mappings_live, -(int64_t)count);
    FC_STAT(mapped_bytes_live, -(int64_t)size);
    fc_host_cost(t0, cost);
    return CUDA_SUCCESS;
}
FC_EXPORT(cuMemUnmap, PFN_cuMemUnmap_v10020, fc_mem_unmap);

static CUresult fc_mem_set_access(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc,
                                  size_t count) {
    FC_ENTER("cuMemSetAccess");
    uint64_t t0 = fc_now_ns();
    uintptr_t p = (uintptr_t)ptr;
    size_t first, n;
    if (!desc || count == 0 || size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    int acc = -1;
    for (size_t i = 0; i < count; i++) {
        if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE || desc[i].location.id != 0)
            return CUDA_ERROR_INVALID_DEVICE;
        switch (desc[i].flags) {
        case CU_MEM_ACCESS_FLAGS_PROT_NONE:
            acc = FC_ACC_NONE;
            break;
        case CU_MEM_ACCESS_FLAGS_PROT_READ:
            acc = FC_ACC_READ;
            break;
        case CU_MEM_ACCESS_FLAGS_PROT_READWRITE:
            acc = FC_ACC_RW;
            break;
        default:
            return CUDA_ERROR_INVALID_VALUE;
        }
    }
    pthread_rwlock_wrlock(&g_fc.mem_lock);
    if (whole_mappings(p, size, &first, &n) != 0) {
        pthread_rwlock_unlock(&g_fc.mem_lock);
        return CUDA_ERROR_INVALID_VALUE;
    }
    for (size_t k = 0; k < n; k++)
        g_fc.ranges[first + k].access = acc;
    double cost = mappings_cost(first, n, VMM_ACCESS, VMM_HOST_ACCESS);
    pthread_rwlock_unlock(&g_fc.mem_lock);
    fc_host_cost(t0, cost);
    return CUDA_SUCCESS;
}
FC_EXPORT(cuMemSetAccess, PFN_cuMemSetAccess_v10020, fc_mem_set_access);

static CUresult fc_mem_get_access(unsigned long long *flags, const CUmemLocation *loc,
                                  CUdeviceptr ptr) {
    FC_ENTER("cuMemGetAccess");
    if (!flags || !loc || loc->type != CU_MEM_LOCATION_TYPE_DEVICE || loc->id != 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_rwlock_rdlock(&g_fc.mem_lock);
    fc_range_t *r = find_range((uintptr_t)ptr);
    int ok = r && r->kind == FC_R_MAP;
    if (ok)
        *flags = r->access == FC_ACC_RW     ? CU_MEM_ACCESS_FLAGS_PROT_READWRITE
                 : r->access == FC_ACC_READ ? CU_MEM_ACCESS_FLAGS_PROT_READ
                                            : CU_MEM_ACCESS_FLAGS_PROT_NONE;
    pthread_rwlock_unlock(&g_fc.mem_lock);
    return ok ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
FC_EXPORT(cuMemGetAccess, PFN_cuMemGetAccess_v10020, fc_mem_get_access);
