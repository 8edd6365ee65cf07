/* SPDX-License-Identifier: MIT */
/* iterdet.h: the iteration detector: finds the training iteration in the stream of ops.
 *
 * The shim feeds every op it sees (a kernel launch, a copy, a set, a cuDNN call), in issue
 * order, as a 64-bit signature and the buffers the op references; ops are numbered 0, 1, 2, ...
 * in call order. The stream of a training program is w0 u u u ... v: a first iteration w0 that
 * may differ (autotuning, lazily created optimizer state), the steady iteration u, and perhaps a
 * short last iteration v. The detector reports when iterations are known ("iterations from op
 * F, each P ops, k of them, all matching; the warm-up excluded") and when that stops holding.
 * An explicit marker (ooc_iterdet_mark, behind the user's ooc_mark_iteration) wins: once one
 * has been seen, only markers delimit iterations. The algorithm is described in iterdet.c, its
 * limits below.
 *
 * Pure C: no driver, no environment, no global state, no log. One detector is not thread-safe;
 * its owner serialises the calls (the shim feeds it from the path that already orders ops).
 * Memory is bounded by the options (ooc_iterdet_mem_limit).
 *
 * Limits. A repetition whose ops reference the same buffers each time (shared weights, an RNN
 * over time steps, a framework that puts every tensor in one allocation) cannot be told from an
 * iteration by references: if its body has at least min_period ops and it spans min_span_ops ops
 * and two repetitions after its first, it is reported, then replaced by the true period once that
 * has two iterations (tests show it); a recorder that stops at the first report records the loop
 * body (the shim's recorder then sees its plan diverge and records again). A
 * temporary re-allocated every iteration that lives longer than two periods, or references given
 * in a varying order, prevent detection. A period longer than max_period, or whose ops' references
 * have left the history (max_refs), is never found; neither is one made only of keys that recur
 * more than three times per iteration at every scale up to 4096 ops (no rare op, no rare window,
 * no buffer used once per iteration), which a training iteration with a loss does not do. When
 * nothing is found the caller stays in demand mode; searching then costs a few table probes per
 * op (0.4 to 0.6 us on the development machine, against 40 ns per op while a period holds).
 *
 * Memory. The history is two rings (ops: 16 bytes each, max_period + 1 of them; references: 16
 * bytes each, max_refs rounded up to a power of two) that start small and double as ops arrive;
 * the key table is fixed at creation. Nothing else grows. Not thread-safe; no global state. */
#ifndef OOC_ITERDET_H
#define OOC_ITERDET_H

#include <stddef.h>
#include <stdint.h>

#include "ooc.h"

/* Defaults of the options (a zero field means "the default"). */
#define OOC_ITERDET_MAX_PERIOD_DEFAULT ((int64_t)1 << 20)
#define OOC_ITERDET_MIN_SPAN_DEFAULT   64
#define OOC_ITERDET_MIN_PERIOD_DEFAULT 4
/* Largest accepted values. */
#define OOC_ITERDET_MAX_PERIOD_LIMIT ((int64_t)1 << 32)
#define OOC_ITERDET_MAX_REFS_LIMIT   ((int64_t)1 << 34)
/* The most buffers one op may reference (more is OOC_ERANGE). */
#define OOC_ITERDET_MAX_OP_REFS 65534u

typedef struct ooc_iterdet_opts {
    /* The longest period that can be found, in ops; the history keeps this many ops. 0: 2^20.
     * A longer iteration is never found (the caller stays in demand mode). */
    int64_t max_period;
    /* References kept in the history, rounded up to a power of two. 0: 4 * max_period. Ops
     * whose references have left the history cannot be compared, so with more than
     * max_refs / max_period references per op on average the longest findable period shrinks
     * to about max_refs / (references per op). */
    int64_t max_refs;
    /* A detected period is reported only when the matching stretch covers at least this many
     * ops (on top of two whole iterations after the warm-up). It keeps a short repetition
     * inside one iteration that the references cannot rule out (below) from being reported.
     * 0: 64. Markers ignore it. */
    int64_t min_span_ops;
    /* The shortest period that is reported, in ops. 0: 4. A shorter repetition is a loop body
     * (a GEMM per attention head on views of one buffer, 256 times), never a training
     * iteration, which has at least a forward, a loss and a backward. Markers ignore it. */
    int64_t min_period;
} ooc_iterdet_opts_t;

/* One buffer an op references: its serial number (unique per allocation, never reused) and
 * the index of the last op fed before it was allocated (a buffer allocated between ops n - 1 and
 * n has alloc_op n - 1); negative when it was allocated before the first op (or is unknown). */
typedef struct ooc_iterdet_ref {
    uint64_t id;
    int64_t alloc_op;
} ooc_iterdet_ref_t;

/* How the iterations in an event are known. */
typedef enum ooc_iterdet_source {
    OOC_ITERDET_NONE,     /* no iteration is known (searching) */
    OOC_ITERDET_DETECTED, /* found in the op stream */
    OOC_ITERDET_MARKER,   /* delimited by the user's markers (marker mode, for good) */
} ooc_iterdet_source_t;

/* What a call saw (ooc_iterdet_event_t.flags); several can be set at once. */
#define OOC_ITERDET_FOUND  0x1u /* a run of two or more matching iterations is now reported */
#define OOC_ITERDET_ITER   0x2u /* an iteration was just completed: the one at last_op */
#define OOC_ITERDET_BROKEN 0x4u /* the run reported before stopped holding (broken_*) */

/* The state after a call, and what that call changed.
 *
 * The "run" is the current sequence of consecutive complete iterations that all match one
 * another: `iters` of them, each `period` ops, the first starting at op first_op, the most
 * recent at last_op == first_op + (iters - 1) * period. Two iterations match when each op of
 * the later one has the signature of the op `period` earlier and references, position by
 * position, either the same buffer or a buffer allocated exactly `period` ops after that one's
 * buffer (a per-iteration temporary; it must not be more than 2 * period ops old). The warm-up
 * is never in a run: not the iteration that holds op 0, not ops before the stream became
 * periodic, not an iteration that allocates a buffer the next one uses as the same buffer
 * (lazily created optimizer state).
 *
 * Confirmed: those iterations happened and matched. Tentative: that the next will match too;
 * BROKEN says when it does not, and a detected period can be replaced by one that explains a
 * longer stretch of the stream (BROKEN and FOUND together). */
typedef struct ooc_iterdet_event {
    unsigned flags;              /* OOC_ITERDET_FOUND | _ITER | _BROKEN for this call */
    ooc_iterdet_source_t source; /* DETECTED while a detected run holds; MARKER in marker mode */
    int confirmed;               /* the run has at least two iterations (always, for DETECTED) */
    int64_t period;              /* ops per iteration of the run; 0 when there is no run */
    int64_t first_op;            /* first op of the run's first iteration; -1 when none */
    int64_t iters;               /* complete iterations in the run; 0 when none */
    int64_t last_op;             /* first op of the run's most recent iteration; -1 when none */
    int64_t broken_op;     /* with BROKEN: the op (or mark position) where it broke; else -1 */
    int64_t broken_period; /* with BROKEN: the period of the run that broke; else 0 */
} ooc_iterdet_event_t;

typedef struct ooc_iterdet ooc_iterdet_t;

/* Creates a detector with options o (NULL: all defaults) into *out. The history grows as ops
 * arrive, up to the bounds of the options. Returns 0; OOC_EINVAL (out NULL, a negative option);
 * OOC_ERANGE (an option above its limit); OOC_ENOMEM. The caller owns *out (ooc_iterdet_free). */
int ooc_iterdet_new(const ooc_iterdet_opts_t *o, ooc_iterdet_t **out);

/* Frees a detector and everything it holds. NULL is a no-op. */
void ooc_iterdet_free(ooc_iterdet_t *d);

/* Feeds the next op: signature sig (function, launch shape and the sizes of the referenced
 * buffers, hashed by the caller) and its n referenced buffers refs[0..n) in a deterministic order
 * (the parameter order); the detector copies them. The op's index is ooc_iterdet_ops(d) before
 * the call. When ev is not NULL it receives the state after the op and what the op changed.
 *
 * Cost: while a period holds, O(n) per op (about 40 ns with 3 references on the development
 * machine); while searching, O(n) times the few candidates tracked plus up to a dozen table probes
 * (0.4 to 0.6 us per op on a stream that never repeats), and once per candidate that covers a
 * whole period an O(period * references) pass. A caller that no longer wants a period may simply
 * stop feeding ops. Returns 0; OOC_EINVAL (d NULL, refs NULL with n > 0, an alloc_op not before
 * this op) or OOC_ERANGE (n > OOC_ITERDET_MAX_OP_REFS), and then the op is not taken (*ev
 * holds the unchanged state); OOC_ENOMEM when the history could not grow: the op was taken and
 * *ev is valid, but periods longer than the history now holds cannot be found. */
int ooc_iterdet_op(ooc_iterdet_t *d, uint64_t sig, const ooc_iterdet_ref_t *refs, unsigned n,
                   ooc_iterdet_event_t *ev);

/* The user's marker: an iteration ends here, before the next op is fed. From the first marker on,
 * detection stops for good and only markers delimit iterations; a detected run in force is
 * reported BROKEN by that first marker. Every iteration completed by a marker is reported
 * (ITER) with its length as `period`; consecutive iterations of the same length whose ops match
 * (the rule above) form a run, and FOUND says it reached two. The ops before the first marker,
 * and an iteration that starts at op 0, are the warm-up: never reported; an iteration that
 * allocates buffers the next one uses as the same buffers is not joined by the next. A run that
 * reached two is BROKEN at the first op that differs from the previous iteration, or at a marker
 * that ends an iteration early. A second marker at the same position is ignored. When ev is not
 * NULL it receives the state and what the marker changed. Returns 0, or OOC_EINVAL when d is
 * NULL. */
int ooc_iterdet_mark(ooc_iterdet_t *d, ooc_iterdet_event_t *ev);

/* Fills *ev with the current state (flags 0, broken_* cleared). Returns 0, or OOC_EINVAL. */
int ooc_iterdet_state(const ooc_iterdet_t *d, ooc_iterdet_event_t *ev);

/* The number of ops fed so far: the index the next op will get. 0 for NULL. */
int64_t ooc_iterdet_ops(const ooc_iterdet_t *d);

/* Heap bytes the detector holds now, and the most it can ever hold between calls. Within a call,
 * a growing history briefly holds its old and new arrays, and picking an iteration boundary (once
 * per candidate period) briefly holds 8 bytes per op of the period and 18 per reference of two
 * periods. 0 for NULL. */
size_t ooc_iterdet_mem_bytes(const ooc_iterdet_t *d);
size_t ooc_iterdet_mem_limit(const ooc_iterdet_t *d);

#endif
