/* SPDX-License-Identifier: MIT */
/* stats.h: process-wide counters, updated lock-free, printed as a table at exit (OOC_STATS=1).
 *
 * One list, OOC_STAT_LIST, names every statistic once: its identifier, its kind, its unit and
 * the label the table prints. A counter only grows (bytes swapped, launches); a gauge goes up
 * and down and keeps its peak (resident bytes). Updates are relaxed C11 atomics: the numbers are
 * for people, not for synchronisation, and the launch path must not pay for a lock or a fence.
 * A peak is maintained with a compare-and-swap loop, so concurrent updates never lose a maximum.
 * Safe from any thread, at any time, including inside the allocator's paths (no allocation). */
#ifndef OOC_STATS_H
#define OOC_STATS_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "ooc.h"

/* X(id, kind, unit, label): kind is COUNTER, GAUGE or HIDDEN (a counter the table shows only per
 * replayed iteration, under its label: stats.c); unit is BYTES, COUNT or NS. */
#define OOC_STAT_LIST(X)                                                                           \
    X(resident_bytes, GAUGE, BYTES, "resident device memory")                                      \
    X(requested_bytes, GAUGE, BYTES, "bytes requested by live buffers")                            \
    X(mapped_bytes, GAUGE, BYTES, "bytes mapped for live buffers")                                 \
    X(external_bytes, GAUGE, BYTES, "program's own cuMemCreate memory")                            \
    X(va_bytes, GAUGE, BYTES, "address space handed out (reservation)")                            \
    X(host_pool_bytes, GAUGE, BYTES, "host memory for swapped chunks (pool)")                      \
    X(host_slot_bytes, GAUGE, BYTES, "of it holding chunks or copies in flight")                   \
    X(swap_out_bytes, COUNTER, BYTES, "swapped out (device to host)")                              \
    X(swap_outs, COUNTER, COUNT, "swap-outs")                                                      \
    X(swap_in_bytes, COUNTER, BYTES, "swapped in (host to device)")                                \
    X(swap_ins, COUNTER, COUNT, "swap-ins")                                                        \
    X(stall_ns, COUNTER, NS, "stall time")                                                         \
    X(blocked_ns, COUNTER, NS, "host time blocked in the shim")                                    \
    X(blocked_lock_ns, COUNTER, NS, "of it: waiting for the residency lock")                       \
    X(blocked_queued_ns, COUNTER, NS, "of it: for planned swap-ins still queued")                  \
    X(blocked_out_ns, COUNTER, NS, "of it: for copies out (memory, remaps)")                       \
    X(blocked_streams_ns, COUNTER, NS, "of it: for a chunk's streams (remaps)")                    \
    X(blocked_idle_ns, COUNTER, NS, "of it: with the program's streams empty")                     \
    X(replay_blocked_ns, COUNTER, NS, "of it in whole replayed iterations")                        \
    X(replay_iters, COUNTER, COUNT, "whole iterations replayed")                                   \
    X(replay_lock_ns, HIDDEN, NS, "  of it: the residency lock")                                   \
    X(replay_queued_ns, HIDDEN, NS, "  of it: planned swap-ins still queued")                      \
    X(replay_out_ns, HIDDEN, NS, "  of it: copies out (memory, remaps)")                           \
    X(replay_streams_ns, HIDDEN, NS, "  of it: a chunk's streams (remaps)")                        \
    X(replay_idle_ns, HIDDEN, NS, "  of it: the program's streams empty")                          \
    X(host_aliases, COUNTER, COUNT, "swapped chunks mapped to their host copy")                    \
    X(recomputes, COUNTER, COUNT, "recomputations")                                                \
    X(recompute_launches, COUNTER, COUNT, "producer re-launches to rebuild buffers")               \
    X(recompute_ns, COUNTER, NS, "rebuild time (producers' recorded durations)")                   \
    X(recompute_drops, COUNTER, COUNT, "buffers dropped to be rebuilt")                            \
    X(recompute_unneeded, COUNTER, COUNT, "rebuilds not needed: bytes still there")                \
    X(recompute_evictions, COUNTER, COUNT, "chunks released without a copy (rebuildable)")         \
    X(producers_verified, COUNTER, COUNT, "producers verified by checksum")                        \
    X(producers_refused, COUNTER, COUNT, "producers refused by checksum")                          \
    X(verify_ns, COUNTER, NS, "time spent verifying producers")                                    \
    X(demand_ops, COUNTER, COUNT, "operations made resident on demand")                            \
    X(fast_ops, COUNTER, COUNT, "operations issued without the lock")                              \
    X(planned_ops, COUNTER, COUNT, "operations run as planned")                                    \
    X(divergences, COUNTER, COUNT, "divergences from the plan")                                    \
    X(weak_by_replay, COUNTER, COUNT, "parameter words found stale by the replay")                 \
    X(weak_left, COUNTER, COUNT, "safe mode: stale words' chunks left in place")                   \
    X(prefetches, COUNTER, COUNT, "planned swap-ins issued ahead (chunks)")                        \
    X(prefetch_stolen, COUNTER, COUNT, "of them into memory being vacated (chunks)")               \
    X(prefetch_warm, COUNTER, COUNT, "of them into freed buffers' memory (chunks)")                \
    X(ahead_copies, GAUGE, COUNT, "of them still copying (chunks)")                                \
    X(prefetch_late, COUNTER, COUNT, "planned swap-ins an op waited for (chunks)")                 \
    X(prefetch_own_out, COUNTER, COUNT, "of them behind their own swap-out (chunks)")              \
    X(prefetch_gated, COUNTER, COUNT, "remapped behind the device (chunks)")                       \
    X(retire_gated, COUNTER, COUNT, "swapped out behind the device (chunks)")                      \
    X(retire_joined, COUNTER, COUNT, "of them behind a swap-in's gate (chunks)")                   \
    X(gates, COUNTER, COUNT, "gates the device waited behind (remaps)")                            \
    X(gate_settles, COUNTER, COUNT, "mapping calls that waited for such a remap")                  \
    X(prefetch_no_memory, COUNTER, COUNT, "planned swap-ins with no memory coming")                \
    X(staged, COUNTER, COUNT, "safe mode: swap-ins staged beside the alias")                       \
    X(staged_dropped, COUNTER, COUNT, "of them given back before their op")                        \
    X(staged_gated, COUNTER, COUNT, "of them moved at their op behind a gate")                     \
    X(staged_early, COUNTER, COUNT, "of them moved earlier, at a swap-out's gate")                 \
    X(staged_pending, COUNTER, COUNT, "of them staged before their alias was mapped")              \
    X(stage_reached, COUNTER, COUNT, "chunks not staged: address stored by a copy")                \
    X(waits_skipped, COUNTER, COUNT, "safe mode: stream waits with nothing new")                   \
    X(planned_swap_outs, COUNTER, COUNT, "planned swap-outs (buffers)")                            \
    X(retired_chunks, COUNTER, COUNT, "their chunks unmapped once copied (chunks)")                \
    X(retire_unmaps, COUNTER, COUNT, "in unmap calls")                                             \
    X(swap_cancels, COUNTER, COUNT, "swap-outs cancelled: used again first")                       \
    X(warm_reuses, COUNTER, COUNT, "chunks reused mapped from freed buffers")                      \
    X(stable_addrs, COUNTER, COUNT, "large buffers at their stable address")                       \
    X(stable_moved, COUNTER, COUNT, "elsewhere: a freed one's memory still there")                 \
    X(warm_handed_early, COUNTER, COUNT, "freed chunks handed on early")                           \
    X(vmm_calls, COUNTER, COUNT, "mapping calls (map, set access, unmap)")                         \
    X(vmm_ns, COUNTER, NS, "time in mapping calls")                                                \
    X(vmm_prog_ns, COUNTER, NS, "of it on the program's threads")                                  \
    X(replay_vmm_prog_ns, COUNTER, NS, "of that in whole replayed iterations")                     \
    X(event_queries, COUNTER, COUNT, "event queries")                                              \
    X(rerecords, COUNTER, COUNT, "re-recordings after divergence")                                 \
    X(lru_evictions, COUNTER, COUNT, "chunks evicted on demand (LRU)")                             \
    X(allocs, COUNTER, COUNT, "allocations")                                                       \
    X(frees, COUNTER, COUNT, "frees")                                                              \
    X(launches, COUNTER, COUNT, "kernel launches")                                                 \
    X(library_calls, COUNTER, COUNT, "cuDNN calls made operations")                                \
    X(blas_calls, COUNTER, COUNT, "cuBLAS calls made operations")                                  \
    X(nccl_calls, COUNTER, COUNT, "NCCL calls made operations")                                    \
    X(ptr_arrays_kept, COUNTER, COUNT, "pointer arrays read from the host's copy")                 \
    X(ptr_arrays_synced, COUNTER, COUNT, "pointer arrays read back after a sync")                  \
    X(launches_no_layout, COUNTER, COUNT, "launches with no parameter layout")                     \
    X(tma_operands, COUNTER, COUNT, "operands found through TMA descriptors")                      \
    X(graph_launches_unseen, COUNTER, COUNT, "graph launches with buffers not learned")

typedef enum ooc_stat {
#define OOC_STAT_ENUM_(id, kind, unit, label) OOC_STAT_##id,
    OOC_STAT_LIST(OOC_STAT_ENUM_)
#undef OOC_STAT_ENUM_
        OOC_STAT_N
} ooc_stat_t;

/* What the host's blocked time is split by (fastpath.c, wait_for): each cause c has a counter
 * over the run, blocked_<c>_ns, and one per replayed iteration, replay_<c>_ns (replay.c adds it
 * up, stats.c prints it). */
#define OOC_STAT_WHY(X)        X(lock) X(queued) X(out) X(streams)
#define OOC_STAT_WHY_COUNT_(c) +1
enum { OOC_STAT_WHY_N = 0 OOC_STAT_WHY(OOC_STAT_WHY_COUNT_) };

/* The cells: current value and (for gauges) peak, per statistic. Use the functions below. */
typedef struct ooc_stats_cells {
    _Atomic uint64_t value[OOC_STAT_N];
    _Atomic uint64_t peak[OOC_STAT_N];
} ooc_stats_cells_t;

extern OOC_INTERNAL ooc_stats_cells_t ooc_stats_cells;

/* Raises *cell to v unless it already holds at least v. Lock-free; a concurrent larger update
 * always wins, and the loop ends once the cell is at least v. */
static inline void ooc_stats_max(_Atomic uint64_t *cell, uint64_t v) {
    uint64_t old = atomic_load_explicit(cell, memory_order_relaxed);
    while (old < v && !atomic_compare_exchange_weak_explicit(cell, &old, v, memory_order_relaxed,
                                                             memory_order_relaxed)) {
    }
}

/* Adds n to a counter. */
static inline void ooc_stats_add(ooc_stat_t s, uint64_t n) {
    atomic_fetch_add_explicit(&ooc_stats_cells.value[s], n, memory_order_relaxed);
}

/* Raises a gauge by n and its peak to the new value. */
static inline void ooc_stats_gauge_add(ooc_stat_t s, uint64_t n) {
    uint64_t now =
        atomic_fetch_add_explicit(&ooc_stats_cells.value[s], n, memory_order_relaxed) + n;
    ooc_stats_max(&ooc_stats_cells.peak[s], now);
}

/* Lowers a gauge by n; the caller never takes away more than it added. */
static inline void ooc_stats_gauge_sub(ooc_stat_t s, uint64_t n) {
    atomic_fetch_sub_explicit(&ooc_stats_cells.value[s], n, memory_order_relaxed);
}

/* The current value of a statistic, and the peak of a gauge (0 for a counter). */
static inline uint64_t ooc_stats_get(ooc_stat_t s) {
    return atomic_load_explicit(&ooc_stats_cells.value[s], memory_order_relaxed);
}
static inline uint64_t ooc_stats_peak(ooc_stat_t s) {
    return atomic_load_explicit(&ooc_stats_cells.peak[s], memory_order_relaxed);
}

/* Accounts one allocation: `requested` bytes asked for by the application, `mapped` bytes of
 * chunks backing it (mapped - requested is the internal waste). */
static inline void ooc_stats_alloc(uint64_t requested, uint64_t mapped) {
    ooc_stats_add(OOC_STAT_allocs, 1);
    ooc_stats_gauge_add(OOC_STAT_requested_bytes, requested);
    ooc_stats_gauge_add(OOC_STAT_mapped_bytes, mapped);
}

/* Accounts one free with the same sizes its allocation was accounted with. */
static inline void ooc_stats_free(uint64_t requested, uint64_t mapped) {
    ooc_stats_add(OOC_STAT_frees, 1);
    ooc_stats_gauge_sub(OOC_STAT_requested_bytes, requested);
    ooc_stats_gauge_sub(OOC_STAT_mapped_bytes, mapped);
}

/* The label the table prints for s, and whether s is a gauge. */
const char *ooc_stats_label(ooc_stat_t s);
int ooc_stats_is_gauge(ooc_stat_t s);

/* Zeroes every value and peak. For tests and for a forked child; not atomic as a whole. */
void ooc_stats_reset(void);

/* Formats bytes as "12.34 MiB" below one GiB and "1.23 GiB" from there, rounded to two
 * decimals, into buf; returns buf. */
char *ooc_stats_fmt_bytes(uint64_t bytes, char *buf, size_t len);

/* Formats nanoseconds as milliseconds with two decimals ("1234.57 ms") into buf; returns buf. */
char *ooc_stats_fmt_ns(uint64_t ns, char *buf, size_t len);

/* Formats the whole table into buf (NUL-terminated, cut if too small). Returns the length the
 * full table needs, excluding the NUL, as snprintf does. No allocation. */
size_t ooc_stats_format(char *buf, size_t len);

/* Writes the table to fd with one write(2) from a stack buffer. Returns 0, or OOC_EIO when the
 * write fails. Thread-safe (it reads a snapshot that other threads may be updating). */
int ooc_stats_print(int fd);

#endif
