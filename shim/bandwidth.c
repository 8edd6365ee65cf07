/* SPDX-License-Identifier: MIT */
/* bandwidth.c: the recorder's probes, with a scratch chunk and host slots of the pool: the
 * host<->device bandwidth, and the host time of the mapping calls that move a chunk.
 *
 * A plan is only as good as the link speed it was made for, and one timed batch can be slowed by
 * anything else using the device or the host at that moment. So each figure is the median of
 * BW_SAMPLES batches, taken in turns (to device, to host, both at once, then again), so that a
 * disturbance that lasts a moment spoils one sample of each at most.
 *
 * Locking: takes mem_lock for the whole probe (run once per recorded profile, on an idle
 * device). Callers: record.c. */
#include "mem_int.h"

#include <stdlib.h>
#include <string.h>

/* One timed batch: `reps` copies of `bytes` between slot s and the device chunk at dev, on
 * stream st, host-to-device when h2d. Caller holds mem_lock. */
static CUresult bw_copies(CUstream st, hslot_t *s, CUdeviceptr dev, uint64_t bytes, int reps,
                          int h2d) {
    CUresult r = CUDA_SUCCESS;
    for (int i = 0; i < reps && r == CUDA_SUCCESS; i++) {
        if (M.safe)
            r = h2d ? ooc_real.cuMemcpyDtoDAsync_v2(dev, s->va, bytes, st)
                    : ooc_real.cuMemcpyDtoDAsync_v2(s->va, dev, bytes, st);
        else
            r = h2d ? ooc_real.cuMemcpyHtoDAsync_v2(dev, s->p, bytes, st)
                    : ooc_real.cuMemcpyDtoHAsync_v2(s->p, dev, bytes, st);
    }
    return r;
}

/* A probe's scratch chunk c: a chunk of address space with a physical chunk mapped there (one
 * swapped out if the pool is full). Nothing is held on failure. Caller holds mem_lock. */
static CUresult scratch_take(chunk_t *c) {
    memset(c, 0, sizeof *c);
    CUresult r = need_phys(1);
    if (r != CUDA_SUCCESS)
        return r;
    if (va_take(1, &c->idx) != 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    if ((r = map_chunk(c)) != CUDA_SUCCESS)
        va_give(c->idx, 1);
    return r;
}

/* Gives back scratch chunk c, still `mapped` at its address or not (its physical chunk then
 * goes back to the free list). Nothing may still run on it. Caller holds mem_lock. */
static void scratch_give(chunk_t *c, int mapped) {
    if (mapped) {
        unmap_chunk(c);
    } else if (c->phys) {
        phys_push(c->phys);
        c->phys = NULL;
    }
    va_give(c->idx, 1);
}

/* Samples per figure: the median of five survives two bad ones. */
#define BW_SAMPLES 5

/* One sample of each figure: the milliseconds that `reps` copies of `bytes` take to the device
 * (ms[0]), to the host (ms[1]) and both ways at once on two streams (ms[2]; to dev, and to the
 * host from dev2: a copy reading memory that another writes, unordered, is a race on a GPU and
 * stops the strict simulated device). Caller holds mem_lock; ev holds three events. */
static CUresult bw_sample(CUstream st2, hslot_t *s1, hslot_t *s2, CUdeviceptr dev, CUdeviceptr dev2,
                          uint64_t bytes, int reps, CUevent *ev, float *ms) {
    CUresult r = CUDA_SUCCESS;
    for (int dir = 0; dir < 2 && r == CUDA_SUCCESS; dir++) {
        /* One direction at a time: dir 0 host to device, dir 1 device to host. */
        if ((r = ooc_real.cuEventRecord(ev[0], M.swap)) == CUDA_SUCCESS &&
            (r = bw_copies(M.swap, s1, dev, bytes, reps, dir == 0)) == CUDA_SUCCESS &&
            (r = ooc_real.cuEventRecord(ev[1], M.swap)) == CUDA_SUCCESS &&
            (r = ooc_real.cuEventSynchronize(ev[1])) == CUDA_SUCCESS)
            r = ooc_real.cuEventElapsedTime(&ms[dir], ev[0], ev[1]);
    }
    if (r != CUDA_SUCCESS)
        return r;
    /* Both at once: the device-to-host stream starts when the host-to-device one does. */
    float a = 0, b = 0;
    if ((r = ooc_real.cuEventRecord(ev[0], M.swap)) == CUDA_SUCCESS &&
        (r = ooc_real.cuStreamWaitEvent(st2, ev[0], 0)) == CUDA_SUCCESS &&
        (r = bw_copies(M.swap, s1, dev, bytes, reps, 1)) == CUDA_SUCCESS &&
        (r = bw_copies(st2, s2, dev2, bytes, reps, 0)) == CUDA_SUCCESS &&
        (r = ooc_real.cuEventRecord(ev[1], M.swap)) == CUDA_SUCCESS &&
        (r = ooc_real.cuEventRecord(ev[2], st2)) == CUDA_SUCCESS &&
        (r = ooc_real.cuEventSynchronize(ev[1])) == CUDA_SUCCESS &&
        (r = ooc_real.cuEventSynchronize(ev[2])) == CUDA_SUCCESS &&
        (r = ooc_real.cuEventElapsedTime(&a, ev[0], ev[1])) == CUDA_SUCCESS &&
        (r = ooc_real.cuEventElapsedTime(&b, ev[0], ev[2])) == CUDA_SUCCESS)
        ms[2] = a > b ? a : b;
    return r;
}

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* The median of the n samples of figure k in ms[n][3] (sorts a copy). */
static float median_ms(float (*ms)[3], int n, int k) {
    float v[BW_SAMPLES];
    for (int i = 0; i < n; i++)
        v[i] = ms[i][k];
    qsort(v, (size_t)n, sizeof *v, cmp_float);
    return v[n / 2];
}

CUresult ooc_mem_measure_bw(uint64_t bytes, double *h2d_bps, double *d2h_bps, double *bidir_bps) {
    mem_lock_take();
    if (bytes > M.chunk)
        bytes = M.chunk;
    /* Two chunks' worth of copies per sample, ten per figure. */
    int reps = (int)((2 * M.chunk) / bytes);
    if (reps < 2)
        reps = 2;
    /* On an idle device: copies still queued (the recorded iteration's swaps) would share the
     * engines and make the link look slower than it is. Once per profile. */
    ooc_real.cuCtxSynchronize();
    M.serial++;
    chunk_t scratch, scratch2;
    CUresult r = scratch_take(&scratch);
    int mapped = r == CUDA_SUCCESS;
    /* (The first is mapped, not on the free list: need_phys finds a second.) */
    CUresult r2 = mapped ? scratch_take(&scratch2) : r;
    int mapped2 = r2 == CUDA_SUCCESS;
    if (r == CUDA_SUCCESS)
        r = r2;
    hslot_t *s1 = mapped ? host_slot() : NULL, *s2 = s1 ? host_slot() : NULL;
    CUstream st2 = NULL;
    CUevent ev[3] = {NULL, NULL, NULL};
    if (mapped && (!s1 || !s2))
        r = CUDA_ERROR_OUT_OF_MEMORY;
    if (r == CUDA_SUCCESS)
        r = ooc_real.cuStreamCreate(&st2, CU_STREAM_NON_BLOCKING);
    for (int i = 0; i < 3 && r == CUDA_SUCCESS; i++)
        r = ooc_real.cuEventCreate(&ev[i], CU_EVENT_DEFAULT);
    CUdeviceptr dev = mapped ? (CUdeviceptr)chunk_addr(&scratch) : 0;
    CUdeviceptr dev2 = mapped2 ? (CUdeviceptr)chunk_addr(&scratch2) : 0;
    float ms[BW_SAMPLES][3];
    for (int i = 0; i < BW_SAMPLES && r == CUDA_SUCCESS; i++)
        r = bw_sample(st2, s1, s2, dev, dev2, bytes, reps, ev, ms[i]);
    /* Nothing may still run on the scratch chunk when it is unmapped. */
    ooc_real.cuStreamSynchronize(M.swap);
    if (st2) {
        ooc_real.cuStreamSynchronize(st2);
        ooc_real.cuStreamDestroy_v2(st2);
    }
    for (int i = 0; i < 3; i++)
        if (ev[i])
            ooc_real.cuEventDestroy_v2(ev[i]);
    host_slot_put(s1);
    host_slot_put(s2);
    if (mapped2)
        scratch_give(&scratch2, 1);
    if (mapped)
        scratch_give(&scratch, 1);
    mem_unlock();
    if (r != CUDA_SUCCESS)
        return r;
    double total = (double)bytes * reps;
    float med[3];
    for (int k = 0; k < 3; k++) {
        med[k] = median_ms(ms, BW_SAMPLES, k);
        /* A timer that reads 0 (too fast to see) would make an infinite bandwidth: floor at
         * 1 us. */
        if (med[k] < 1e-3f)
            med[k] = 1e-3f;
    }
    *h2d_bps = total / (med[0] * 1e-3);
    *d2h_bps = total / (med[1] * 1e-3);
    *bidir_bps = 2 * total / (med[2] * 1e-3);
    return CUDA_SUCCESS;
}

/* ---- the host time of the mapping calls per chunk ------------------------------------------ */

/* Untimed cycles first, then timed ones. Each figure is a mean over the timed cycles, not a
 * median: a driver (the simulated one is) may hold one call longer and the next shorter, so that
 * only a run of calls adds up to their cost. A cycle that took more than twice the median cycle
 * (the thread preempted, another process's work) is left out of every mean. */
#define VMM_WARMUP 3
#define VMM_CYCLES 16

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* The timed cycles to keep: one bit each, set unless the cycle (a[i] + b[i], its two parts) took
 * more than twice the median cycle. The median cycle itself is never over: at least one bit. */
static uint64_t kept_cycles(const uint64_t *a, const uint64_t *b) {
    uint64_t total[VMM_CYCLES], keep = 0;
    for (int i = 0; i < VMM_CYCLES; i++)
        total[i] = a[i] + b[i];
    qsort(total, VMM_CYCLES, sizeof total[0], cmp_u64);
    uint64_t cap = 2 * total[VMM_CYCLES / 2];
    for (int i = 0; i < VMM_CYCLES; i++)
        if (a[i] + b[i] <= cap)
            keep |= 1ull << i;
    return keep;
}

/* The mean of t over the cycles kept (kept_cycles). */
static uint64_t kept_mean(const uint64_t *t, uint64_t keep) {
    uint64_t sum = 0, n = 0;
    for (int i = 0; i < VMM_CYCLES; i++)
        if (keep >> i & 1) {
            sum += t[i];
            n++;
        }
    return sum / n;
}

/* Safe mode with staging (stage.c), what replay does per chunk instead of a swap-in at the
 * chunk's address: staging, on the worker (map the memory at a spare address, make the host alias
 * read-only), then adopting it at the first use (unmap the alias and the spare address, map the
 * memory at the chunk's address). Times each into stage[] and adopt[] (the last VMM_CYCLES
 * cycles); a, mapped to scratch's memory on entry, is so on return unless an error left it
 * otherwise (*mapped, *aliased say how). Caller holds mem_lock. */
static CUresult stage_cycles(CUdeviceptr a, chunk_t *scratch, hslot_t *slot, uint64_t *stage,
                             uint64_t *adopt, int *mapped, int *aliased) {
    uint64_t idx;
    if (va_take(1, &idx) != 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUdeviceptr spare = (CUdeviceptr)idx_addr(idx);
    int spare_mapped = 0;
    CUresult r = CUDA_SUCCESS;
    for (int i = 0; i < VMM_WARMUP + VMM_CYCLES && r == CUDA_SUCCESS; i++) {
        if ((r = vmm_unmap(a)) != CUDA_SUCCESS)
            break;
        *mapped = 0;
        if ((r = vmm_map_rw(a, slot->h)) != CUDA_SUCCESS)
            break;
        *aliased = 1;
        uint64_t t0 = mem_clock_ns();
        if ((r = vmm_map_rw(spare, scratch->phys->h)) != CUDA_SUCCESS)
            break;
        spare_mapped = 1;
        if ((r = vmm_protect(a, 1)) != CUDA_SUCCESS)
            break;
        uint64_t t1 = mem_clock_ns();
        if ((r = vmm_unmap(a)) != CUDA_SUCCESS)
            break;
        *aliased = 0;
        if ((r = vmm_unmap(spare)) != CUDA_SUCCESS)
            break;
        spare_mapped = 0;
        if ((r = vmm_map_rw(a, scratch->phys->h)) != CUDA_SUCCESS)
            break;
        *mapped = 1;
        if (i >= VMM_WARMUP) {
            stage[i - VMM_WARMUP] = t1 - t0;
            adopt[i - VMM_WARMUP] = mem_clock_ns() - t1;
        }
    }
    if (spare_mapped && vmm_unmap(spare) != CUDA_SUCCESS)
        return r != CUDA_SUCCESS ? r : CUDA_ERROR_UNKNOWN; /* the spare address is lost */
    va_give(idx, 1);
    return r;
}

CUresult ooc_mem_measure_vmm(ooc_vmm_times_t *vmm) {
    mem_lock_take();
    chunk_t scratch;
    CUresult r = scratch_take(&scratch);
    int taken = r == CUDA_SUCCESS, mapped = taken;
    hslot_t *slot = mapped && M.safe ? host_slot() : NULL;
    if (mapped && M.safe && !slot)
        r = CUDA_ERROR_OUT_OF_MEMORY;
    CUdeviceptr a = (CUdeviceptr)chunk_addr(&scratch);
    uint64_t t_in[VMM_CYCLES], t_out[VMM_CYCLES], t_map[VMM_CYCLES], t_unmap[VMM_CYCLES];
    int aliased = 0;
    /* What replay does per chunk, with nothing to wait for: after a copy out, unmap (and in safe
     * mode map the host copy there); for a swap-in, (unmap the alias and) map a device chunk. */
    for (int i = 0; i < VMM_WARMUP + VMM_CYCLES && r == CUDA_SUCCESS; i++) {
        uint64_t t0 = mem_clock_ns();
        if ((r = vmm_unmap(a)) != CUDA_SUCCESS)
            break;
        mapped = 0;
        uint64_t tu = mem_clock_ns();
        if (M.safe && (r = vmm_map_rw(a, slot->h)) != CUDA_SUCCESS)
            break;
        aliased = M.safe;
        uint64_t t1 = mem_clock_ns();
        if (aliased && (r = vmm_unmap(a)) != CUDA_SUCCESS)
            break;
        aliased = 0;
        uint64_t tm = mem_clock_ns();
        if ((r = vmm_map_rw(a, scratch.phys->h)) != CUDA_SUCCESS)
            break;
        mapped = 1;
        if (i >= VMM_WARMUP) {
            uint64_t t2 = mem_clock_ns();
            t_out[i - VMM_WARMUP] = t1 - t0;
            t_in[i - VMM_WARMUP] = t2 - t1;
            t_unmap[i - VMM_WARMUP] = tu - t0;
            t_map[i - VMM_WARMUP] = t2 - tm;
        }
    }
    /* With staging, its own calls too; when they cannot be timed, the plan charges a swap-in's
     * for them (the profile then has no stage_vmm_ns), and the figures above stand. */
    uint64_t t_stage[VMM_CYCLES], t_adopt[VMM_CYCLES];
    int staged = r == CUDA_SUCCESS && M.safe && M.stage;
    CUresult rs = staged ? stage_cycles(a, &scratch, slot, t_stage, t_adopt, &mapped, &aliased)
                         : CUDA_SUCCESS;
    if (rs != CUDA_SUCCESS) {
        OOC_LOG_W("staging's mapping calls could not be timed (%s); the plan charges a swap-in's "
                  "for them",
                  ooc_real_errname(rs));
        staged = 0;
    }
    if (aliased)
        (void)vmm_unmap(a);
    host_slot_put(slot);
    if (taken)
        scratch_give(&scratch, mapped); /* the loop may have left it unmapped */
    mem_unlock();
    if (r != CUDA_SUCCESS)
        return r;
    uint64_t keep = kept_cycles(t_in, t_out);
    *vmm = (ooc_vmm_times_t){kept_mean(t_in, keep),
                             kept_mean(t_out, keep),
                             kept_mean(t_map, keep),
                             kept_mean(t_unmap, keep),
                             0,
                             0};
    if (staged) {
        keep = kept_cycles(t_stage, t_adopt);
        vmm->stage_ns = kept_mean(t_stage, keep);
        vmm->adopt_ns = kept_mean(t_adopt, keep);
    }
    return CUDA_SUCCESS;
}
