/* SPDX-License-Identifier: MIT */
/* fc_memop.c: simulated stream memory operations: cuStreamWaitValue32/64, cuStreamWriteValue32/64
 * and cuStreamBatchMemOp (the _v2 ABI of CUDA 11.7, with their per-thread-stream variants).
 *
 * Each call is one op on its stream that runs its operations in order when the stream reaches
 * it: a write stores the value; a wait polls the word (every 20 us) until its condition holds,
 * holding its stream back as it does on a GPU; in the timing model a wait that had to wait ends
 * when the host's write would have reached a device, less the lateness with which the host learned
 * of what it replied to (fc_stream.c, "the host's replies"). The address must be device memory or
 * pinned host memory, aligned to the operand size (CUDA_ERROR_INVALID_VALUE at the call otherwise,
 * as are unknown flags and a batch of 0 or of 256 or more operations); it is checked again when the
 * op runs (unmapped then: a sticky CUDA_ERROR_ILLEGAL_ADDRESS). A wait that never completes is a
 * deadlock on a GPU; here it gives up after FC_WAIT_LIMIT_S seconds with a message and a sticky
 * CUDA_ERROR_LAUNCH_TIMEOUT, so that a test fails instead of hanging (in inline scheduling the
 * wait runs on the issuing thread: only another thread can satisfy it). Captured, the ops become
 * part of the graph like any other work. Statistics count none of them as kernels, copies or
 * sets. */
#include "fc_internal.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#define FC_WAIT_LIMIT_S 10
#define FC_MAX_MEMOPS   255

typedef struct memop {
    CUstreamBatchMemOpType type;
    uintptr_t addr;
    uint64_t value;
    unsigned flags;
} memop_t;

typedef struct memop_payload {
    unsigned count;
    memop_t m[];
} memop_payload_t;

static int is_wait(CUstreamBatchMemOpType t) {
    return t == CU_STREAM_MEM_OP_WAIT_VALUE_32 || t == CU_STREAM_MEM_OP_WAIT_VALUE_64;
}

static int is_64(CUstreamBatchMemOpType t) {
    return t == CU_STREAM_MEM_OP_WAIT_VALUE_64 || t == CU_STREAM_MEM_OP_WRITE_VALUE_64;
}

/* Does the word hold the wait's condition (CUstreamWaitValue_flags, cyclic for GEQ)? */
static int holds(const memop_t *m, uint64_t cur) {
    int w64 = is_64(m->type);
    switch (m->flags & ~(unsigned)CU_STREAM_WAIT_VALUE_FLUSH) {
    case CU_STREAM_WAIT_VALUE_GEQ:
        return w64 ? (int64_t)(cur - m->value) >= 0 : (int32_t)(uint32_t)(cur - m->value) >= 0;
    case CU_STREAM_WAIT_VALUE_EQ:
        return cur == m->value;
    case CU_STREAM_WAIT_VALUE_AND:
        return (cur & m->value) != 0;
    default: /* CU_STREAM_WAIT_VALUE_NOR */
        return w64 ? ~(cur | m->value) != 0 : (uint32_t) ~(cur | m->value) != 0;
    }
}

static uint64_t load_word(const memop_t *m) {
    if (is_64(m->type))
        return __atomic_load_n((const uint64_t *)m->addr, __ATOMIC_ACQUIRE);
    return __atomic_load_n((const uint32_t *)m->addr, __ATOMIC_ACQUIRE);
}

static CUresult run_memop(fc_op_t *op) {
    memop_payload_t *p = op->payload;
    for (unsigned i = 0; i < p->count; i++) {
        const memop_t *m = &p->m[i];
        if (m->type == CU_STREAM_MEM_OP_BARRIER || m->type == CU_STREAM_MEM_OP_FLUSH_REMOTE_WRITES)
            continue; /* every simulated access is already ordered and visible */
        size_t n = is_64(m->type) ? 8 : 4;
        if (fc_mem_check(m->addr, n, is_wait(m->type) ? FC_ACC_READ : FC_ACC_RW) != 0) {
            fc_warn("illegal address: %s at %#lx touches memory that is not mapped", op->what,
                    (unsigned long)m->addr);
            FC_STAT(illegal_accesses, 1);
            return CUDA_ERROR_ILLEGAL_ADDRESS;
        }
        if (!is_wait(m->type)) {
            if (n == 8)
                __atomic_store_n((uint64_t *)m->addr, m->value, __ATOMIC_RELEASE);
            else
                __atomic_store_n((uint32_t *)m->addr, (uint32_t)m->value, __ATOMIC_RELEASE);
            continue;
        }
        uint64_t t0 = fc_now_ns();
        if (holds(m, load_word(m)))
            continue;
        while (!holds(m, load_word(m))) {
            if (fc_now_ns() - t0 > (uint64_t)FC_WAIT_LIMIT_S * 1000000000ull) {
                fc_warn("%s at %#lx for value %#llx (flags %#x) still waits after %d s: a "
                        "deadlock on a GPU",
                        op->what, (unsigned long)m->addr, (unsigned long long)m->value, m->flags,
                        FC_WAIT_LIMIT_S);
                return CUDA_ERROR_LAUNCH_TIMEOUT;
            }
            nanosleep(&(struct timespec){0, 20000}, NULL);
        }
        uint64_t seen = fc_now_ns(), late = g_fc.cfg.timing ? fc_host_late_ns(seen) : 0;
        op->seen_ns = seen > late ? seen - late : 1;
    }
    return CUDA_SUCCESS;
}

/* Whether a wait of the op does not hold now (fc_op_t.closed). */
static int memop_closed(const fc_op_t *op) {
    const memop_payload_t *p = op->payload;
    for (unsigned i = 0; i < p->count; i++) {
        const memop_t *m = &p->m[i];
        if (is_wait(m->type) && fc_mem_check(m->addr, is_64(m->type) ? 8 : 4, FC_ACC_READ) == 0 &&
            !holds(m, load_word(m)))
            return 1;
    }
    return 0;
}

static void dispose_memop(fc_op_t *op) {
    free(op->payload);
}

static int clone_memop(fc_op_t *dst, const fc_op_t *src) {
    const memop_payload_t *p = src->payload;
    size_t bytes = sizeof *p + p->count * sizeof(memop_t);
    memop_payload_t *q = malloc(bytes);
    if (!q)
        return -1;
    memcpy(q, p, bytes);
    dst->payload = q;
    dst->closed = memop_closed;
    for (unsigned i = 0; i < src->nrefs; i++)
        fc_op_ref(dst, src->refs[i].lo, src->refs[i].hi, src->refs[i].write);
    return 0;
}

/* Validates one operation at call time (the rules of the reference manual). */
static CUresult check_one(const memop_t *m) {
    switch (m->type) {
    case CU_STREAM_MEM_OP_WAIT_VALUE_32:
    case CU_STREAM_MEM_OP_WAIT_VALUE_64:
        if ((m->flags & ~(unsigned)CU_STREAM_WAIT_VALUE_FLUSH) > CU_STREAM_WAIT_VALUE_NOR)
            return CUDA_ERROR_INVALID_VALUE;
        break;
    case CU_STREAM_MEM_OP_WRITE_VALUE_32:
    case CU_STREAM_MEM_OP_WRITE_VALUE_64:
        if (m->flags & ~(unsigned)CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER)
            return CUDA_ERROR_INVALID_VALUE;
        break;
    case CU_STREAM_MEM_OP_FLUSH_REMOTE_WRITES:
        return m->flags ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
    case CU_STREAM_MEM_OP_BARRIER:
        return m->flags > CU_STREAM_MEMORY_BARRIER_TYPE_GPU ? CUDA_ERROR_INVALID_VALUE
                                                            : CUDA_SUCCESS;
    default:
        return CUDA_ERROR_INVALID_VALUE;
    }
    size_t n = is_64(m->type) ? 8 : 4;
    if (!m->addr || m->addr % n)
        return CUDA_ERROR_INVALID_VALUE;
    if (!fc_mem_is_device(m->addr) && !fc_mem_is_pinned_host(m->addr))
        return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}

/* Queues `count` validated operations as one op on the stream. Takes ownership of p. */
static CUresult submit(memop_payload_t *p, const char *what, CUstream h, int ptds) {
    for (unsigned i = 0; i < p->count; i++) {
        CUresult r = check_one(&p->m[i]);
        if (r != CUDA_SUCCESS) {
            free(p);
            return r;
        }
    }
    fc_stream_t *s = fc_stream_resolve(h, ptds);
    if (!s) {
        free(p);
        return CUDA_ERROR_INVALID_HANDLE;
    }
    fc_op_t *op = fc_op_new(what, run_memop, p, dispose_memop);
    if (!op) {
        free(p);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    for (unsigned i = 0; i < p->count; i++)
        if (p->m[i].addr)
            fc_op_ref(op, p->m[i].addr, p->m[i].addr + (is_64(p->m[i].type) ? 8 : 4), 1);
    op->clone = clone_memop;
    op->closed = memop_closed;
    return fc_submit(s, op, NULL);
}

static CUresult one(const char *what, CUstreamBatchMemOpType type, CUstream h, CUdeviceptr addr,
                    uint64_t value, unsigned flags, int ptds) {
    memop_payload_t *p = malloc(sizeof *p + sizeof(memop_t));
    if (!p)
        return CUDA_ERROR_OUT_OF_MEMORY;
    p->count = 1;
    p->m[0] = (memop_t){type, (uintptr_t)addr, value, flags};
    return submit(p, what, h, ptds);
}

static CUresult batch(CUstream h, unsigned count, CUstreamBatchMemOpParams *a, unsigned flags,
                      int ptds) {
    if (count == 0 || count > FC_MAX_MEMOPS || !a || flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    memop_payload_t *p = malloc(sizeof *p + count * sizeof(memop_t));
    if (!p)
        return CUDA_ERROR_OUT_OF_MEMORY;
    p->count = count;
    for (unsigned i = 0; i < count; i++) {
        const CUstreamBatchMemOpParams *b = &a[i];
        memop_t *m = &p->m[i];
        m->type = b->operation;
        switch (b->operation) {
        case CU_STREAM_MEM_OP_WAIT_VALUE_32:
        case CU_STREAM_MEM_OP_WAIT_VALUE_64:
            m->addr = (uintptr_t)b->waitValue.address;
            m->value = is_64(m->type) ? b->waitValue.value64 : b->waitValue.value;
            m->flags = b->waitValue.flags;
            break;
        case CU_STREAM_MEM_OP_WRITE_VALUE_32:
        case CU_STREAM_MEM_OP_WRITE_VALUE_64:
            m->addr = (uintptr_t)b->writeValue.address;
            m->value = is_64(m->type) ? b->writeValue.value64 : b->writeValue.value;
            m->flags = b->writeValue.flags;
            break;
        case CU_STREAM_MEM_OP_FLUSH_REMOTE_WRITES:
            m->addr = 0;
            m->flags = b->flushRemoteWrites.flags;
            break;
        default: /* CU_STREAM_MEM_OP_BARRIER, or not an operation (check_one refuses it) */
            m->addr = 0;
            m->flags = b->memoryBarrier.flags;
            break;
        }
    }
    return submit(p, "cuStreamBatchMemOp", h, ptds);
}

#define VALUE_OP(fname, base, sym, pfn, type, VT, ptds)                                            \
    static CUresult fname(CUstream h, CUdeviceptr addr, VT value, unsigned int flags) {            \
        FC_ENTER(base);                                                                            \
        return one(base, type, h, addr, value, flags, ptds);                                       \
    }                                                                                              \
    FC_EXPORT(sym, pfn, fname)

VALUE_OP(fc_wait32, "cuStreamWaitValue32", cuStreamWaitValue32_v2, PFN_cuStreamWaitValue32_v11070,
         CU_STREAM_MEM_OP_WAIT_VALUE_32, cuuint32_t, 0);
VALUE_OP(fc_wait32_ptsz, "cuStreamWaitValue32", cuStreamWaitValue32_v2_ptsz,
         PFN_cuStreamWaitValue32_v11070_ptsz, CU_STREAM_MEM_OP_WAIT_VALUE_32, cuuint32_t, 1);
VALUE_OP(fc_wait64, "cuStreamWaitValue64", cuStreamWaitValue64_v2, PFN_cuStreamWaitValue64_v11070,
         CU_STREAM_MEM_OP_WAIT_VALUE_64, cuuint64_t, 0);
VALUE_OP(fc_wait64_ptsz, "cuStreamWaitValue64", cuStreamWaitValue64_v2_ptsz,
         PFN_cuStreamWaitValue64_v11070_ptsz, CU_STREAM_MEM_OP_WAIT_VALUE_64, cuuint64_t, 1);
VALUE_OP(fc_write32, "cuStreamWriteValue32", cuStreamWriteValue32_v2,
         PFN_cuStreamWriteValue32_v11070, CU_STREAM_MEM_OP_WRITE_VALUE_32, cuuint32_t, 0);
VALUE_OP(fc_write32_ptsz, "cuStreamWriteValue32", cuStreamWriteValue32_v2_ptsz,
         PFN_cuStreamWriteValue32_v11070_ptsz, CU_STREAM_MEM_OP_WRITE_VALUE_32, cuuint32_t, 1);
VALUE_OP(fc_write64, "cuStreamWriteValue64", cuStreamWriteValue64_v2,
         PFN_cuStreamWriteValue64_v11070, CU_STREAM_MEM_OP_WRITE_VALUE_64, cuuint64_t, 0);
VALUE_OP(fc_write64_ptsz, "cuStreamWriteValue64", cuStreamWriteValue64_v2_ptsz,
         PFN_cuStreamWriteValue64_v11070_ptsz, CU_STREAM_MEM_OP_WRITE_VALUE_64, cuuint64_t, 1);

static CUresult fc_batch(CUstream h, unsigned int count, CUstreamBatchMemOpParams *a,
                         unsigned int flags) {
    FC_ENTER("cuStreamBatchMemOp");
    return batch(h, count, a, flags, 0);
}
FC_EXPORT(cuStreamBatchMemOp_v2, PFN_cuStreamBatchMemOp_v11070, fc_batch);

static CUresult fc_batch_ptsz(CUstream h, unsigned int count, CUstreamBatchMemOpParams *a,
                              unsigned int flags) {
    FC_ENTER("cuStreamBatchMemOp");
    return batch(h, count, a, flags, 1);
}
FC_EXPORT(cuStreamBatchMemOp_v2_ptsz, PFN_cuStreamBatchMemOp_v11070_ptsz, fc_batch_ptsz);
