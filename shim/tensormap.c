/* SPDX-License-Identifier: MIT */
/* tensormap.c: operands reached through TMA descriptors (CUtensorMap), as Hopper GEMM and
 * attention kernels reach them.
 *
 * A CUtensorMap is 128 opaque bytes that the driver encodes from a global address (and shape);
 * a kernel takes it by value among its parameters and reaches memory only through it, so the
 * launch-time scan of parameter words cannot see the address. The encoders
 * (cuTensorMapEncodeTiled, cuTensorMapEncodeIm2col, cuTensorMapEncodeIm2colWide) and
 * cuTensorMapReplaceAddress are hooked: after the driver encodes a descriptor, its 128 bytes are
 * remembered with the global address they stand for (only for an address in the shim's
 * reservation). At a launch, every 64-byte-aligned 128-byte slice of the parameters is looked up
 * among the descriptors remembered (ooc_tmap_scan, only while there are any): a match stands
 * for the buffer containing its global address, used read-write.
 *
 * The table keeps the newest TMAP_MAX descriptors (a program that replaces addresses every step
 * makes a new descriptor each time); the oldest is forgotten first. Locking: a read-write lock;
 * lookups at launch take it for reading. */
#include "hook_int.h"

#include <stdlib.h>
#include <string.h>

#define uthash_nonfatal_oom(obj) ((void)0)
#include <uthash.h>

#define TMAP_BYTES 128
#define TMAP_MAX   65536

typedef struct tmap {
    unsigned char bytes[TMAP_BYTES]; /* the key */
    uintptr_t addr;
    UT_hash_handle hh;
} tmap_t;

static tmap_t *table; /* in insertion order (uthash keeps it): the oldest first */
static pthread_rwlock_t table_lock = PTHREAD_RWLOCK_INITIALIZER;
static _Atomic unsigned long table_n;

/* Remembers descriptor m as standing for addr. */
static void remember(const CUtensorMap *m, void *addr) {
    if (!m || !ooc_mem_owns((uintptr_t)addr))
        return;
    tmap_t *t = calloc(1, sizeof *t);
    if (!t)
        return; /* not remembered: its operand is then not seen (safe mode covers it) */
    memcpy(t->bytes, m, TMAP_BYTES);
    t->addr = (uintptr_t)addr;
    pthread_rwlock_wrlock(&table_lock);
    tmap_t *old;
    HASH_FIND(hh, table, t->bytes, TMAP_BYTES, old);
    if (old) {
        HASH_DEL(table, old);
        free(old);
    }
    HASH_ADD(hh, table, bytes, TMAP_BYTES, t);
    while (HASH_COUNT(table) > TMAP_MAX) {
        tmap_t *first = table;
        HASH_DEL(table, first);
        free(first);
    }
    atomic_store(&table_n, HASH_COUNT(table));
    pthread_rwlock_unlock(&table_lock);
}

void ooc_tmap_scan(const unsigned char *p, size_t n, size_t off, ooc_access_t *a) {
    if (atomic_load_explicit(&table_n, memory_order_relaxed) == 0 || n < TMAP_BYTES)
        return;
    pthread_rwlock_rdlock(&table_lock);
    for (size_t i = (64 - off % 64) % 64; i + TMAP_BYTES <= n; i += 64) {
        tmap_t *t;
        HASH_FIND(hh, table, p + i, TMAP_BYTES, t);
        if (t) {
            ooc_mem_note(a, t->addr);
            ooc_stats_add(OOC_STAT_tma_operands, 1);
        }
    }
    pthread_rwlock_unlock(&table_lock);
}

CUresult ooc_hook_cuTensorMapEncodeTiled(CUtensorMap *m, CUtensorMapDataType type, cuuint32_t rank,
                                         void *addr, const cuuint64_t *dim,
                                         const cuuint64_t *strides, const cuuint32_t *box,
                                         const cuuint32_t *estrides, CUtensorMapInterleave il,
                                         CUtensorMapSwizzle sw, CUtensorMapL2promotion l2,
                                         CUtensorMapFloatOOBfill oob) {
    OOC_NEED_REAL(cuTensorMapEncodeTiled);
    CUresult r = ooc_real.cuTensorMapEncodeTiled(m, type, rank, addr, dim, strides, box, estrides,
                                                 il, sw, l2, oob);
    if (r == CUDA_SUCCESS && managing())
        remember(m, addr);
    ooc_mem_report_fault(r); /* a kernel's earlier fault may surface here */
    return r;
}
OOC_EXPORT_HOOK(cuTensorMapEncodeTiled, PFN_cuTensorMapEncodeTiled_v12000);

CUresult ooc_hook_cuTensorMapEncodeIm2col(CUtensorMap *m, CUtensorMapDataType type, cuuint32_t rank,
                                          void *addr, const cuuint64_t *dim,
                                          const cuuint64_t *strides, const int *lower,
                                          const int *upper, cuuint32_t channels, cuuint32_t pixels,
                                          const cuuint32_t *estrides, CUtensorMapInterleave il,
                                          CUtensorMapSwizzle sw, CUtensorMapL2promotion l2,
                                          CUtensorMapFloatOOBfill oob) {
    OOC_NEED_REAL(cuTensorMapEncodeIm2col);
    CUresult r = ooc_real.cuTensorMapEncodeIm2col(m, type, rank, addr, dim, strides, lower, upper,
                                                  channels, pixels, estrides, il, sw, l2, oob);
    if (r == CUDA_SUCCESS && managing())
        remember(m, addr);
    ooc_mem_report_fault(r); /* a kernel's earlier fault may surface here */
    return r;
}
OOC_EXPORT_HOOK(cuTensorMapEncodeIm2col, PFN_cuTensorMapEncodeIm2col_v12000);

CUresult ooc_hook_cuTensorMapEncodeIm2colWide(
    CUtensorMap *m, CUtensorMapDataType type, cuuint32_t rank, void *addr, const cuuint64_t *dim,
    const cuuint64_t *strides, int lower, int upper, cuuint32_t channels, cuuint32_t pixels,
    const cuuint32_t *estrides, CUtensorMapInterleave il, CUtensorMapIm2ColWideMode mode,
    CUtensorMapSwizzle sw, CUtensorMapL2promotion l2, CUtensorMapFloatOOBfill oob) {
    OOC_NEED_REAL(cuTensorMapEncodeIm2colWide);
    CUresult r =
        ooc_real.cuTensorMapEncodeIm2colWide(m, type, rank, addr, dim, strides, lower, upper,
                                             channels, pixels, estrides, il, mode, sw, l2, oob);
    if (r == CUDA_SUCCESS && managing())
        remember(m, addr);
    ooc_mem_report_fault(r); /* a kernel's earlier fault may surface here */
    return r;
}
OOC_EXPORT_HOOK(cuTensorMapEncodeIm2colWide, PFN_cuTensorMapEncodeIm2colWide_v12080);

CUresult ooc_hook_cuTensorMapReplaceAddress(CUtensorMap *m, void *addr) {
    OOC_NEED_REAL(cuTensorMapReplaceAddress);
    CUresult r = ooc_real.cuTensorMapReplaceAddress(m, addr);
    if (r == CUDA_SUCCESS && managing())
        remember(m, addr);
    ooc_mem_report_fault(r); /* a kernel's earlier fault may surface here */
    return r;
}
OOC_EXPORT_HOOK(cuTensorMapReplaceAddress, PFN_cuTensorMapReplaceAddress_v12000);
