/* SPDX-License-Identifier: MIT */
/* memop.c: stream memory operations (cuStreamWriteValue32/64, cuStreamWaitValue32/64,
 * cuStreamBatchMemOp), as NCCL and frameworks use them for flags between streams and with the
 * host.
 *
 * Each is one operation on its stream whose access set is the word it writes (4 or 8 bytes, a
 * set for the recorder) or waits on (read). The word must lie in one live buffer (the driver's
 * rule, which it cannot apply to the shim's memory). A batch is one operation over all its
 * words. While a wait is pending on its stream, the buffer it polls is in use by that stream:
 * an eviction of it waits for the wait to be satisfied, so the value must come from the host or
 * from another stream's operation that does not need that eviction (see README). */
#include "hook_int.h"

/* Notes the word of one memory operation; CUDA_ERROR_INVALID_VALUE when it leaves its buffer. */
static CUresult note_word(ooc_access_t *a, const char *name, CUdeviceptr p, size_t n,
                          unsigned use) {
    ACCESS_OR_RETURN(ooc_mem_check_range(name, (uintptr_t)p, n));
    ooc_mem_note_range(a, (uintptr_t)p, n, use);
    a->bytes += n;
    return CUDA_SUCCESS;
}

#define MEMOP(sym, pfn, ptds, VT, use)                                                             \
    CUresult ooc_hook_##sym(CUstream s, CUdeviceptr p, VT v, unsigned flags) {                     \
        OOC_NEED_REAL(sym);                                                                        \
        if (!managing())                                                                           \
            return ooc_real.sym(s, p, v, flags);                                                   \
        ooc_access_t a;                                                                            \
        op_start(&a, OOC_OP_MEMSET, #sym, 0);                                                      \
        ACCESS_OR_RETURN(note_word(&a, #sym, p, sizeof(VT), use));                                 \
        RUN_OP(&a, s, ptds, ooc_real.sym(s, p, v, flags));                                         \
    }                                                                                              \
    OOC_EXPORT_HOOK(sym, pfn)

MEMOP(cuStreamWriteValue32_v2, PFN_cuStreamWriteValue32_v11070, 0, cuuint32_t, OOC_USE_W);
MEMOP(cuStreamWriteValue32_v2_ptsz, PFN_cuStreamWriteValue32_v11070_ptsz, 1, cuuint32_t, OOC_USE_W);
MEMOP(cuStreamWriteValue64_v2, PFN_cuStreamWriteValue64_v11070, 0, cuuint64_t, OOC_USE_W);
MEMOP(cuStreamWriteValue64_v2_ptsz, PFN_cuStreamWriteValue64_v11070_ptsz, 1, cuuint64_t, OOC_USE_W);
MEMOP(cuStreamWaitValue32_v2, PFN_cuStreamWaitValue32_v11070, 0, cuuint32_t, OOC_USE_R);
MEMOP(cuStreamWaitValue32_v2_ptsz, PFN_cuStreamWaitValue32_v11070_ptsz, 1, cuuint32_t, OOC_USE_R);
MEMOP(cuStreamWaitValue64_v2, PFN_cuStreamWaitValue64_v11070, 0, cuuint64_t, OOC_USE_R);
MEMOP(cuStreamWaitValue64_v2_ptsz, PFN_cuStreamWaitValue64_v11070_ptsz, 1, cuuint64_t, OOC_USE_R);

/* A batch's access set: every word its operations write or wait on. Flushes and barriers touch
 * no memory of a buffer. An operation the shim does not know is left to the driver to judge. */
static CUresult batch_access(ooc_access_t *a, const char *name, unsigned count,
                             const CUstreamBatchMemOpParams *ops) {
    op_start(a, OOC_OP_MEMSET, name, 0);
    for (unsigned i = 0; i < count; i++) {
        const CUstreamBatchMemOpParams *o = &ops[i];
        switch (o->operation) {
        case CU_STREAM_MEM_OP_WAIT_VALUE_32:
            ACCESS_OR_RETURN(note_word(a, name, o->waitValue.address, 4, OOC_USE_R));
            break;
        case CU_STREAM_MEM_OP_WAIT_VALUE_64:
            ACCESS_OR_RETURN(note_word(a, name, o->waitValue.address, 8, OOC_USE_R));
            break;
        case CU_STREAM_MEM_OP_WRITE_VALUE_32:
            ACCESS_OR_RETURN(note_word(a, name, o->writeValue.address, 4, OOC_USE_W));
            break;
        case CU_STREAM_MEM_OP_WRITE_VALUE_64:
            ACCESS_OR_RETURN(note_word(a, name, o->writeValue.address, 8, OOC_USE_W));
            break;
        default:
            break;
        }
    }
    return CUDA_SUCCESS;
}

#define BATCH_MEMOP(sym, pfn, ptds)                                                                \
    CUresult ooc_hook_##sym(CUstream s, unsigned count, CUstreamBatchMemOpParams *ops,             \
                            unsigned flags) {                                                      \
        OOC_NEED_REAL(sym);                                                                        \
        if (!managing() || !ops || !count)                                                         \
            return ooc_real.sym(s, count, ops, flags);                                             \
        ooc_access_t a;                                                                            \
        ACCESS_OR_RETURN(batch_access(&a, #sym, count, ops));                                      \
        RUN_OP(&a, s, ptds, ooc_real.sym(s, count, ops, flags));                                   \
    }                                                                                              \
    OOC_EXPORT_HOOK(sym, pfn)

BATCH_MEMOP(cuStreamBatchMemOp_v2, PFN_cuStreamBatchMemOp_v11070, 0);
BATCH_MEMOP(cuStreamBatchMemOp_v2_ptsz, PFN_cuStreamBatchMemOp_v11070_ptsz, 1);
