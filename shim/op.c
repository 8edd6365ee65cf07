/* SPDX-License-Identifier: MIT */
/* op.c: the sequence of one operation of the program: record, then replay, then residency, then
 * the real call, then the same in reverse.
 *
 * The one owner of that order. A hook (RUN_OP in hooks.c) calls ooc_op_begin, issues the real
 * call when it returned CUDA_SUCCESS, and hands the result to ooc_op_end. In between:
 *   1. record: a recording with enough iterations is finished first (record.c, outside the
 *      residency lock); whether this op is logged is decided once;
 *   2. the lock-free path (fastpath.c) when the op's chunks are all hot and nothing is recorded
 *      or replayed;
 *   3. otherwise the locked path: residency pins the op's chunks (resident.c), the plan's actions
 *      before the op run (replay.c), residency makes the chunks resident, the plan's rebuilds are
 *      issued (replay.c), the recorder starts timing the op (record.c); after the call the
 *      recorder logs it, residency notes its stream, the plan's actions after it run, and the
 *      residency lock is released.
 * So the memory layer never calls up into replay or record: this file calls each in turn.
 * Thread-safe: the locked path holds the residency lock from ooc_op_begin to ooc_op_end (lock
 * order: residency, then replay's, then the recorder's). */
#include "shim.h"

#include "ooc_shim.h" /* the public declaration of ooc_mark_iteration */

#include <stdlib.h>

/* Finishes the recording (its profile is complete) and, in OOC_MODE=auto, plans it and replays
 * the plan: the record -> plan -> replay step of the mode's life cycle. Outside the residency
 * lock. */
static void finish_recording(void) {
    char dir[OOC_PATH_MAX];
    uint32_t pos = 0;
    ooc_profile_t *p = ooc_record_finish(dir, &pos);
    if (p)
        ooc_replay_plan(p, dir, pos); /* takes p */
}

_Thread_local int ooc_lib_depth;

static void live_init(ooc_live_op_t *op, const ooc_access_t *a, CUstream s) {
    op->a = a;
    op->s = s;
    op->fast = 0;
    op->began = 0;
    op->token = -1;
    op->nested = 0;
    op->held = NULL;
    op->nheld = 0;
}

/* The locked path's first half: the residency lock is held on return, whatever the result. */
static CUresult locked_begin(const ooc_access_t *a, CUstream s) {
    int listed = 0;
    CUresult r = ooc_mem_op_pin(a, &listed);
    if (r == CUDA_SUCCESS) {
        /* The plan's actions before this op (swap-ins queued for the worker) go first. */
        if (listed && ooc_replay_on()) {
            const ooc_opbuf_t *b;
            size_t nb = ooc_mem_op_buffers(&b);
            /* replay -> re-record: the plan no longer fits the program */
            if (ooc_replay_op_begin(a, b, nb, s) == OOC_REPLAY_RERECORD)
                ooc_record_restart_l();
        }
        r = ooc_mem_op_resident(s);
    }
    if (OOC_UNLIKELY(atomic_load_explicit(&ooc_replay_rebuilds, memory_order_relaxed)))
        r = ooc_replay_op_ready(r, s);
    return r;
}

/* A replayed op on the fast path: its chunks hot, and the plan's next op with nothing to do
 * around it, on buffers the plan bound already (ooc_replay_fast). 1 when the caller may issue
 * it, then end with ooc_mem_fast_end. */
static int replay_fast(const ooc_access_t *a, CUstream s) {
    ooc_opbuf_t cand[16], b[16];
    size_t nc = 0, nb = 0;
    uint32_t pos = 0;
    if (!ooc_mem_fast_enter(a, s))
        return 0;
    if (ooc_replay_fast_next(cand, 16, &nc, &pos) && ooc_mem_fast_list(a, cand, nc, b, 16, &nb) &&
        ooc_replay_fast(a, b, nb, pos)) {
        ooc_stats_add(OOC_STAT_fast_ops, 1);
        return 1;
    }
    ooc_mem_fast_end(0);
    return 0;
}

/* Is this op logged? A recording with enough iterations is finished first. */
static int will_record(void) {
    if (!ooc_record_on())
        return 0;
    if (ooc_record_pending()) {
        finish_recording();
        return 0;
    }
    return 1;
}

CUresult ooc_op_begin(ooc_live_op_t *op, const ooc_access_t *a, CUstream stream, int per_thread) {
    CUstream s = ooc_stream_of(stream, per_thread); /* the one place the pair is resolved */
    live_init(op, a, s);
    if (OOC_UNLIKELY(ooc_lib_depth)) {
        /* A part of a library call: residency only (its operands are held already). */
        op->nested = 1;
        op->rec = 0;
        if (ooc_mem_fast_begin(a, s)) {
            op->fast = 1;
            return CUDA_SUCCESS;
        }
        CUresult r = ooc_mem_begin(a, s);
        op->began = r == CUDA_SUCCESS;
        return r;
    }
    if (OOC_UNLIKELY(atomic_load_explicit(&ooc_shadow_held, memory_order_relaxed)))
        ooc_shadow_forget(a); /* what it may write is no longer what the host wrote */
    op->rec = will_record();
    if (!op->rec && (ooc_mem_fast_begin(a, s) || (ooc_replay_on() && replay_fast(a, s)))) {
        op->fast = 1;
        return CUDA_SUCCESS;
    }
    CUresult r = locked_begin(a, s);
    if (r == CUDA_SUCCESS) {
        op->began = 1;
        if (op->rec)
            op->token = ooc_record_op_begin(s);
    }
    return r;
}

CUresult ooc_op_end(ooc_live_op_t *op, CUresult r) {
    int issued = r == CUDA_SUCCESS;
    if (op->fast) {
        ooc_mem_fast_end(issued);
    } else if (op->nested) {
        ooc_mem_end(op->a, op->s, issued);
    } else {
        if (op->began && op->rec)
            ooc_record_op_end(op->token, op->a, op->s, issued);
        ooc_mem_op_issued(op->s, issued);
        if (issued && ooc_replay_on())
            ooc_replay_op_end(op->s); /* the plan's swap-outs after this op */
        ooc_mem_op_release();
    }
    if (r == CUDA_ERROR_ILLEGAL_ADDRESS)
        ooc_mem_report_fault(r);
    return r;
}

CUresult ooc_op_lib_begin(ooc_live_op_t *op, const ooc_access_t *a, CUstream stream) {
    live_init(op, a, stream);
    if (atomic_load_explicit(&ooc_shadow_held, memory_order_relaxed))
        ooc_shadow_forget(a);
    op->rec = will_record();
    CUresult r = locked_begin(a, stream);
    if (r == CUDA_SUCCESS)
        r = ooc_mem_op_hold(&op->held, &op->nheld);
    if (r == CUDA_SUCCESS) {
        op->began = 1;
        if (op->rec)
            op->token = ooc_record_op_begin(stream);
    }
    ooc_mem_op_release(); /* the library's own driver calls take the lock */
    return r;
}

CUresult ooc_op_lib_end(ooc_live_op_t *op, CUresult r) {
    if (!op->began)
        return r;
    /* The lock again, and the op's buffers listed again for the recorder and the plan (the
     * library's own calls listed theirs meanwhile); held chunks are still resident. */
    int listed = 0;
    CUresult pr = ooc_mem_op_pin(op->a, &listed);
    /* Not pinned again (out of host memory: rare): the chunks are let go only once the call's
     * work is done. */
    if (pr == CUDA_ERROR_OUT_OF_MEMORY && ooc_real.cuStreamSynchronize)
        (void)ooc_real.cuStreamSynchronize(op->s);
    ooc_mem_op_unhold(op->held, op->nheld);
    op->held = NULL;
    int issued = r == CUDA_SUCCESS;
    if (op->rec && pr == CUDA_SUCCESS)
        ooc_record_op_end(op->token, op->a, op->s, issued);
    /* A call that failed may have issued work before it did: its stream is waited for all the
     * same before any of its chunks is evicted. */
    ooc_mem_op_issued(op->s, pr == CUDA_SUCCESS);
    if (issued && pr == CUDA_SUCCESS && ooc_replay_on())
        ooc_replay_op_end(op->s);
    ooc_mem_op_release();
    return r;
}

void ooc_op_functions_gone(void) {
    ooc_fnname_forget();
    if (!ooc_record_on() && !ooc_replay_on()) {
        ooc_verify_reset();
        return;
    }
    ooc_replay_settle_all(); /* dropped buffers, while their producers' functions exist */
    ooc_access_t *a = calloc(1, sizeof *a);
    if (!a) {
        OOC_LOG_E("out of memory: the plan could not be given up at a module's unloading");
        return;
    }
    a->kind = OOC_OP_KERNEL;
    a->name = "ooc-unload";
    ooc_internal_op = OOC_OWN_REBUILD; /* neither recorded nor matched */
    /* For the residency lock (nothing to make resident); refused only at exit, when the plan is
     * given up all the same. */
    (void)ooc_mem_begin(a, NULL);
    ooc_record_functions_gone_l(ooc_replay_give_up_l());
    ooc_mem_end(a, NULL, 0);
    ooc_internal_op = OOC_OWN_NONE;
    free(a);
}

/* The user's iteration marker (Python: ctypes.CDLL(None).ooc_mark_iteration()). An iteration
 * ends here, for the plan being replayed and for the recorder (once called, only markers
 * delimit iterations). Cheap; a no-op unless recording or replaying. */
OOC_EXPORT void ooc_mark_iteration(void) {
    if (ooc_replay_on())
        ooc_replay_mark();
    ooc_record_mark();
}
