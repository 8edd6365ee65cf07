/* SPDX-License-Identifier: MIT */
/* ooc_planner.h: the public interface of libooc_planner.a (profiles, plans, the simulator and the
 * placement policies).
 *
 * The library is pure C: no CUDA, no environment reads, no global state, deterministic (the same
 * inputs give the same plan, byte for byte). Every function is thread-compatible: distinct
 * objects may be used from distinct threads, one object from one thread at a time. Functions
 * return 0 or a negative OOC_E* code; messages for the user go to a caller-supplied buffer
 * (`err`, `errlen`; either may be NULL/0). File formats are specified in profiles/FORMAT.md. */
#ifndef OOC_PLANNER_H
#define OOC_PLANNER_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "ooc_err.h" /* the error codes, shared with the shim */

#define OOC_FORMAT_VERSION 1

/* ---- profiles (planner/profile.c) ------------------------------------------------------------ */

typedef enum {
    OOC_KIND_KERNEL = 0,
    OOC_KIND_MEMCPY,
    OOC_KIND_MEMSET,
    OOC_KIND_CUDNN,
    OOC_KIND_CUBLAS,
    OOC_KIND_NCCL,
    OOC_KIND_HOST,
    OOC_KIND_COUNT
} ooc_op_kind_t;

#define OOC_ACCESS_R  1u
#define OOC_ACCESS_W  2u
#define OOC_ACCESS_RW 3u

typedef struct ooc_ref {
    int32_t buf;    /* buffer id */
    uint8_t access; /* OOC_ACCESS_R, _W or _RW */
    /* 1 + the index of the kernel parameter word (8 bytes) through which the buffer was found;
     * 0: not found through a parameter word (ops.tsv: "BUFFER:ACCESS@BYTE", BYTE = 8 * index) */
    uint16_t word;
} ooc_ref_t;

typedef struct ooc_op {
    int32_t stream;       /* stream id as recorded (0 = the default stream) */
    uint8_t kind;         /* ooc_op_kind_t */
    char *name;           /* function name, never NULL */
    char *shape;          /* launch shape ("-" when none), never NULL */
    uint64_t duration_ns; /* measured (or modelled) duration */
    uint32_t ref_off;     /* first reference in ooc_profile_t.refs */
    uint32_t nref;        /* references, in file order, no buffer twice */
} ooc_op_t;

typedef struct ooc_buffer {
    uint64_t bytes;
    int64_t alloc_idx;  /* op index before which it is allocated, -1: exists at iteration start */
    int64_t free_idx;   /* op index after which it is freed, -1: still exists at iteration end */
    uint8_t persistent; /* lives across iterations (alloc_idx == free_idx == -1) */
    char *site;         /* allocation call site, never NULL ("-" when unknown) */
    uint32_t prod_off;  /* first producer in ooc_profile_t.prods */
    uint32_t nprod;     /* producer ops verified re-executable, in execution order; 0: none */
} ooc_buffer_t;

typedef struct ooc_profile {
    int version;
    char *program;
    char *device;
    uint64_t device_mem_bytes;
    uint64_t budget_bytes;              /* the plan's; in core, the one given (for comparison) */
    uint64_t chunk_bytes;               /* the model's chunk size */
    double h2d_bps, d2h_bps, bidir_bps; /* bytes per second; bidir is the sum of both directions */
    uint32_t iterations;
    /* 1: a swap-in's copy runs alone on the device: the work issued before it completes first
     * and nothing runs until it ends (safe mode without staging: its address maps the memory
     * being filled, which any op may reach unseen). Optional meta key swapin_exclusive. */
    uint8_t swapin_exclusive;
    /* 1: a swap-out's mapping calls (below) run while nothing computes: the device drains first
     * and no op is issued meanwhile (safe mode: the chunk's address gets its host copy, which any
     * op may reach unseen). Optional meta key swapout_exclusive. */
    uint8_t swapout_exclusive;
    /* 1: a planned swap-in takes its memory when the compute engine reaches it, and nothing
     * computes until it has it (the shim's remapping gate in safe mode, OOC_REMAP_GATE=1: the
     * memory of chunks still copying out is handed over behind a gate that every later op waits
     * for). Optional meta key remap_gate. */
    uint8_t remap_gate;
    /* Host time of the driver's mapping calls per chunk (ns): those that bring a swapped chunk
     * back (map and set access; in safe mode also the unmap of its host alias) and those that
     * follow its copy out (unmap; in safe mode also mapping the host alias). One worker thread
     * makes them all, one after another. Optional meta keys swapin_vmm_ns and swapout_vmm_ns:
     * 0 when absent. */
    uint64_t swapin_vmm_ns, swapout_vmm_ns;
    /* Safe mode with staging (swapout_exclusive without swapin_exclusive), per chunk (ns): the
     * mapping calls that stage a planned swap-in beside the host alias (on the worker, in place of
     * swapin_vmm_ns) and those that move it to the chunk's address at its first use (while
     * nothing computes). Optional meta keys stage_vmm_ns and adopt_vmm_ns: 0 when absent, and
     * then swapin_vmm_ns stands for each. */
    uint64_t stage_vmm_ns, adopt_vmm_ns;
    /* Host time per chunk (ns) of the mapping calls the program's own thread makes for a buffer
     * allocated during the iteration: map and set access before the op that first uses it (in
     * safe mode at its allocation, which comes first), unmap after its free. The op waits for
     * the program's thread to issue it. Optional meta keys map_vmm_ns and unmap_vmm_ns: 0 when
     * absent. */
    uint64_t map_vmm_ns, unmap_vmm_ns;
    uint32_t nops, nbufs, nrefs, nprods;
    ooc_op_t *ops;
    ooc_buffer_t *bufs;
    ooc_ref_t *refs;
    int32_t *prods;
    /* capacities, private to the builder */
    uint32_t ops_cap, bufs_cap, refs_cap, prods_cap;
} ooc_profile_t;

/* Creates an empty profile (format version 1, 2 MiB chunks, 50 GB/s each way, 90 GB/s both
 * ways, program and device "-"). The caller owns it (ooc_profile_free). NULL when out of
 * memory. */
ooc_profile_t *ooc_profile_new(void);
void ooc_profile_free(ooc_profile_t *p);
/* Replaces a string field (program, device) with a copy of s. */
int ooc_profile_set_str(char **field, const char *s);

/* Appends a buffer; its id is the returned index (>= 0) or a negative OOC_E* code. `prods` are
 * op indices (may name ops not yet added). */
int ooc_profile_add_buffer(ooc_profile_t *p, uint64_t bytes, int64_t alloc_idx, int64_t free_idx,
                           int persistent, const char *site, const int32_t *prods, uint32_t nprod);
/* Appends an op referencing `nref` buffers; returns its index or a negative OOC_E* code. */
int ooc_profile_add_op(ooc_profile_t *p, int32_t stream, ooc_op_kind_t kind, const char *name,
                       const char *shape, uint64_t duration_ns, const ooc_ref_t *refs,
                       uint32_t nref);

/* Checks cross-references (buffer ids, op ids, positions, persistent flags). Returns 0 or
 * OOC_EFORMAT with a message naming the file, line and field (line = entry index + 3). */
int ooc_profile_validate(const ooc_profile_t *p, char *err, size_t errlen);

/* Reads a profile directory (meta.tsv, buffers.tsv, ops.tsv; trace.json is ignored). On success
 * *out is a new profile owned by the caller. Errors: OOC_EIO, OOC_EFORMAT, OOC_ENOMEM. */
int ooc_profile_read(const char *dir, ooc_profile_t **out, char *err, size_t errlen);
/* The same from three in-memory texts (need not be NUL-terminated). */
int ooc_profile_parse(const char *meta, size_t meta_len, const char *bufs, size_t bufs_len,
                      const char *ops, size_t ops_len, ooc_profile_t **out, char *err,
                      size_t errlen);
/* Writes meta.tsv, buffers.tsv and ops.tsv into an existing directory. */
int ooc_profile_write(const ooc_profile_t *p, const char *dir, char *err, size_t errlen);

const char *ooc_kind_name(ooc_op_kind_t k);

/* ---- the derived model (planner/model.c) ----------------------------------------------------- */

/* Facts derived once from a profile and a chunk size, shared by the simulator and the policies.
 * Footprint: a buffer of more than an eighth of a chunk occupies whole chunks (shim/buffer.c places
 * it so); a smaller one lives in a shared slab chunk and occupies its size rounded up to 256
 * bytes. */
typedef struct ooc_model {
    const ooc_profile_t *prof; /* borrowed; must outlive the model */
    uint64_t chunk_bytes;      /* the model's chunk size */
    uint32_t n, nb;
    uint64_t *fp;      /* per buffer: device footprint in bytes */
    uint32_t *use_off; /* per buffer: first entry in uses */
    uint32_t *nuse;    /* per buffer: number of distinct ops referencing it */
    int32_t *uses;     /* op indices, ascending */
    uint8_t *written;  /* per ref (parallel to prof->refs): 1 (any use counts as a write) */
    uint8_t
        *recomp; /* per buffer: 1 when the recompute rule (docs/planner.md) allows recomputing it */
    int32_t *recomp_until; /* per buffer: the last op before which a recompute is still safe */
    uint64_t *ws;          /* per op: working set (sum of footprints of its buffers) */
    uint32_t *free_off;    /* per op (n + 1 entries): first entry in frees */
    int32_t *frees;        /* buffers the program frees after each op */
    uint8_t *heavy;        /* per op: compute-heavy kind (convolution, GEMM) */
    uint64_t compute_ns;   /* sum of op durations: the in-core iteration time */
    uint64_t persist_bytes;
} ooc_model_t;

int ooc_model_build(const ooc_profile_t *p, uint64_t chunk_bytes, ooc_model_t **out);
void ooc_model_free(ooc_model_t *m);
uint64_t ooc_model_fp(uint64_t bytes, uint64_t chunk_bytes);
/* The index in uses[] of the first use of buffer b at or after op i; nuse[b] when none. */
uint32_t ooc_model_next_use(const ooc_model_t *m, int32_t b, int64_t i);
/* Returns 0 when every op's working set fits the budget, else OOC_EINFEASIBLE naming the first
 * op that does not fit (and *op_out, when not NULL, set to its index). */
int ooc_model_check_budget(const ooc_model_t *m, uint64_t budget_bytes, int32_t *op_out, char *err,
                           size_t errlen);

/* A lower bound on the iteration time of every valid plan under a budget (planner/bound.c gives
 * the argument): at the cut of some op k, what does not fit the budget is off the device, was
 * copied out before k and comes back (by a copy, or by re-launching its producers) after it. */
typedef struct ooc_bound {
    uint64_t bound_ns;  /* the bound (at least the in-core compute time) */
    int32_t cut_op;     /* the op whose cut gives it; -1: no cut, the compute time or the sum of
                         * the op-to-op windows (bound.c) */
    uint64_t off_bytes; /* footprint that must be off the device at that cut */
} ooc_bound_t;

/* Computes the bound into *out. Returns 0, OOC_EINFEASIBLE when some op's own buffers exceed the
 * budget (out->bound_ns is then the compute time), or OOC_ENOMEM. Deterministic. */
int ooc_model_bound(const ooc_model_t *m, uint64_t budget_bytes, ooc_bound_t *out);
/* The same bound's time alone; *must_bytes (may be NULL) receives off_bytes. */
uint64_t ooc_model_bound_ns(const ooc_model_t *m, uint64_t budget_bytes, uint64_t *must_bytes);

/* ---- plans (planner/plan.c) ------------------------------------------------------------------ */

typedef enum { OOC_KEEP = 0, OOC_SWAP = 1, OOC_RECOMPUTE = 2 } ooc_decision_t;
typedef enum { OOC_BEFORE = 0, OOC_AFTER = 1 } ooc_when_t;
typedef enum {
    OOC_ACT_SWAPIN = 0, /* before op: start the host-to-device copy (chunks mapped first) */
    OOC_ACT_WAIT,       /* before op: the op's stream waits for the buffer's swap-in */
    OOC_ACT_RECOMPUTE,  /* before op: map the buffer and re-launch the `via` ops */
    OOC_ACT_DROP,       /* after op: unmap the buffer without copying (dead or recomputable) */
    OOC_ACT_SWAPOUT,    /* after op: copy to host, unmap when the copy is done */
    OOC_ACT_COUNT
} ooc_act_kind_t;

typedef struct ooc_action {
    int32_t op;
    uint8_t when; /* ooc_when_t */
    uint8_t kind; /* ooc_act_kind_t */
    int32_t buf;
    uint32_t via_off, nvia; /* recompute: the ops to re-launch, in ooc_plan_t.via */
} ooc_action_t;

typedef struct ooc_plan {
    char policy[32];
    uint64_t budget_bytes, chunk_bytes;
    uint32_t nops, nbufs;
    uint8_t *decision;   /* per buffer: ooc_decision_t (a summary of the actions) */
    uint8_t *start_host; /* per buffer: 1 when it is on the host at iteration start and end */
    ooc_action_t *acts;  /* by ooc_plan_finalize: op, when, kind, then order added */
    uint32_t nacts, acts_cap;
    int32_t *via;
    uint32_t nvia, via_cap;
} ooc_plan_t;

/* Creates an empty plan (everything kept) for a profile of nops ops and nbufs buffers. */
ooc_plan_t *ooc_plan_new(const char *policy, uint32_t nops, uint32_t nbufs, uint64_t budget_bytes,
                         uint64_t chunk_bytes);
void ooc_plan_free(ooc_plan_t *pl);
int ooc_plan_add(ooc_plan_t *pl, int32_t op, ooc_when_t when, ooc_act_kind_t kind, int32_t buf,
                 const int32_t *via, uint32_t nvia);
/* Sorts the actions into replay order and derives decision[] from them. */
void ooc_plan_finalize(ooc_plan_t *pl);
int ooc_plan_write(const ooc_plan_t *pl, FILE *f);
int ooc_plan_write_file(const ooc_plan_t *pl, const char *path, char *err, size_t errlen);
/* Parses a plan text; `name` is used in messages. When nops/nbufs are not 0, ids are checked
 * against them. */
int ooc_plan_parse(const char *text, size_t len, const char *name, ooc_plan_t **out, char *err,
                   size_t errlen);
int ooc_plan_read_file(const char *path, ooc_plan_t **out, char *err, size_t errlen);
const char *ooc_act_name(ooc_act_kind_t k);
const char *ooc_decision_name(ooc_decision_t d);

/* ---- the simulator (planner/sim.c) ----------------------------------------------------------- */

typedef enum {
    OOC_TR_OP_START = 0, /* a: op index; b: 1 when it is a recompute launch */
    OOC_TR_OP_END,
    OOC_TR_H2D_START, /* buf */
    OOC_TR_H2D_END,
    OOC_TR_D2H_START,
    OOC_TR_D2H_END,
    OOC_TR_MAP,   /* buf, bytes: chunks mapped */
    OOC_TR_UNMAP, /* buf, bytes: chunks released */
} ooc_trace_kind_t;

typedef struct ooc_trace_ev {
    double t_ns;
    uint8_t kind;
    int32_t op;  /* op index (recompute: the op being prepared), -1 when none */
    int32_t buf; /* -1 when none */
    int32_t aux; /* OP_START/END: the op actually launched (recompute: producer op) */
    uint64_t bytes;
} ooc_trace_ev_t;

typedef struct ooc_trace {
    ooc_trace_ev_t *ev;
    size_t n, cap;
} ooc_trace_t;

typedef struct ooc_sim_result {
    int feasible;          /* 1: ran to the end without a violation */
    uint64_t time_ns;      /* iteration time (all engines idle) */
    uint64_t stall_ns;     /* compute engine idle, waiting for data or memory */
    uint64_t recompute_ns; /* time spent re-launching producers */
    uint64_t peak_bytes;   /* peak mapped bytes */
    uint64_t h2d_bytes, d2h_bytes;
    uint32_t n_keep, n_swap, n_recompute; /* buffers by decision */
    uint64_t *op_stall_ns; /* per op (nops entries), owned by the result; NULL unless asked */
    /* first violation (feasible == 0) */
    int viol_code; /* OOC_EINFEASIBLE (memory) or OOC_EFORMAT (inconsistent plan) */
    int32_t viol_op, viol_buf;
    char viol_msg[256];
    /* per-action observations used by the policies (NULL unless asked): */
    double *h2d_wait_ns;  /* per buffer: compute stall attributed to its last swap-in */
    double *d2h_delay_ns; /* per buffer: queueing delay of its swap-outs */
} ooc_sim_result_t;

typedef struct ooc_sim_opts {
    int want_op_stalls;
    int want_attribution;
    ooc_trace_t *trace; /* appended to when not NULL */
} ooc_sim_opts_t;

/* Simulates one steady-state iteration of the plan on the model: one compute engine running
 * ops (and recomputations) in plan order, one engine per copy direction (FIFO, sharing the
 * bidirectional bandwidth), chunk-granular memory under pl->budget_bytes. A plan that breaks a
 * rule (an op touching a buffer that is not resident and not arriving, a missing wait, an unsafe
 * recompute, memory that never frees) gives feasible = 0 and the first violation. Returns 0
 * (the result is filled either way) or OOC_ENOMEM/OOC_EINVAL. Release with ooc_sim_result_free. */
int ooc_sim_run(const ooc_model_t *m, const ooc_plan_t *pl, const ooc_sim_opts_t *opts,
                ooc_sim_result_t *res);
void ooc_sim_result_free(ooc_sim_result_t *r);
void ooc_trace_free(ooc_trace_t *t);

/* Checks a trace independently of the simulator: memory never above the budget, every op's
 * buffers mapped and not in flight while it runs, no chunk released while a copy reads it, a
 * recompute's inputs mapped. Returns 0 or OOC_EINFEASIBLE with a message. */
int ooc_trace_check(const ooc_model_t *m, const ooc_plan_t *pl, const ooc_trace_t *t, char *err,
                    size_t errlen);

/* ---- policies (planner/policy.c, window.c, pooch.c, auto.c) ---------------------------------- */

typedef struct ooc_policy_opts {
    uint64_t budget_bytes; /* the plan's; in core, the one given (for comparison) */
    uint64_t window_bytes; /* window policy: the schedule-window; 0: tuned by simulation */
} ooc_policy_opts_t;

/* Names of the policies, in table order, NULL-terminated. */
extern const char *const ooc_policy_names[];

/* Builds a plan for the model under the budget with the named policy. The plan is owned by the
 * caller. Returns 0 (the plan may still be infeasible: simulate it), OOC_EINFEASIBLE when some
 * op's own working set exceeds the budget (the message names it), OOC_EINVAL for an unknown
 * policy. Deterministic. */
int ooc_policy_plan(const ooc_model_t *m, const char *policy, const ooc_policy_opts_t *o,
                    ooc_plan_t **out, char *err, size_t errlen);

/* ---- timelines and the Chrome trace (planner/timeline.c, planner/trace_json.c) --------------- */

/* One iteration as rows: what each engine runs when, and every change of mapped device memory.
 * A timeline is either in-core (the profile's ops back to back in issue order on one compute
 * engine, every buffer mapped from its allocation to its free: the iteration without the shim)
 * or simulated (a plan's ooc_sim_run trace). Times are whole nanoseconds from the iteration's
 * start. The TSV form is specified in profiles/FORMAT.md ("A timeline"). */
typedef enum {
    OOC_ENG_COMPUTE = 0, /* ops and recomputations, one at a time */
    OOC_ENG_H2D,         /* host-to-device copies (swap-ins), one at a time */
    OOC_ENG_D2H,         /* device-to-host copies (swap-outs), one at a time */
    OOC_ENG_MEMORY,      /* not an engine: a change of mapped device memory */
    OOC_ENG_COUNT
} ooc_engine_t;

typedef enum {
    OOC_TL_OP = 0,    /* compute: op `op` runs */
    OOC_TL_RECOMPUTE, /* compute: `buf` is rebuilt before op `op` by re-launching its producers */
    OOC_TL_SWAPIN,    /* h2d: the copy of `buf` for the swap-in before op `op` */
    OOC_TL_SWAPOUT,   /* d2h: the copy of `buf` for the swap-out after op `op` */
    OOC_TL_MAP,       /* memory: `buf`'s footprint is mapped; `op`: where the compute engine is */
    OOC_TL_UNMAP,     /* memory: `buf`'s footprint is released */
    OOC_TL_COUNT
} ooc_tl_action_t;

typedef struct ooc_tl_row {
    uint64_t start_ns, end_ns; /* [start, end); equal for memory rows */
    int32_t op, buf;           /* -1 when none */
    uint8_t engine, action;    /* ooc_engine_t, ooc_tl_action_t */
    uint64_t bytes;            /* the buffer's size (copies, recomputes) or footprint (memory) */
    uint64_t in_use_bytes;     /* memory rows: the bytes mapped after the change; others: 0 */
} ooc_tl_row_t;

typedef struct ooc_timeline {
    int simulated;         /* 0: in core; 1: a plan's simulation */
    char policy[32];       /* the plan's policy; "incore" for an in-core timeline */
    uint64_t budget_bytes; /* the plan's; in core, the one given (for comparison) */
    uint64_t chunk_bytes;  /* the model's chunk size */
    uint64_t time_ns;      /* the iteration's end: every engine idle */
    uint64_t peak_bytes;   /* the largest in_use_bytes */
    uint32_t nops, nbufs;  /* those of the profile it describes */
    ooc_tl_row_t *rows;    /* by start_ns; rows that start together keep the order of events */
    size_t nrows, cap;
} ooc_timeline_t;

/* Builds the in-core timeline of the model's profile into *out (which the caller releases with
 * ooc_timeline_free, also after a failure). budget_bytes is only recorded (the budget line of
 * the pictures); memory may exceed it. Returns 0 or OOC_ENOMEM. */
int ooc_timeline_incore(const ooc_model_t *m, uint64_t budget_bytes, ooc_timeline_t *out);
/* Builds the timeline of a simulation: `tr` must be the complete trace that ooc_sim_run wrote
 * for plan `pl` on model `m` with a feasible result. Each copy is attributed to the plan's
 * action that caused it. Returns 0, OOC_ENOMEM, or OOC_EINVAL when the trace is incomplete or
 * does not belong to the plan (the message says where). *out as for ooc_timeline_incore. */
int ooc_timeline_simulated(const ooc_model_t *m, const ooc_plan_t *pl, const ooc_trace_t *tr,
                           ooc_timeline_t *out, char *err, size_t errlen);
void ooc_timeline_free(ooc_timeline_t *t);
/* Writes the TSV form. Returns 0 or OOC_EIO. */
int ooc_timeline_write(const ooc_timeline_t *t, FILE *f);
int ooc_timeline_write_file(const ooc_timeline_t *t, const char *path, char *err, size_t errlen);
const char *ooc_engine_name(ooc_engine_t e);
const char *ooc_tl_action_name(ooc_tl_action_t a);

/* Writes a Chrome trace (the JSON object format of chrome://tracing and Perfetto) of timeline t
 * of profile p: for an in-core timeline one track per recorded stream, for a simulated one a
 * compute, a host-to-device and a device-to-host track; and the counters "device memory in use"
 * and "device memory budget" (bytes). When t is NULL, the in-core timeline of p at its
 * chunk_bytes and budget_bytes is built and written (what the shim writes as trace.json). Every
 * string is escaped; bytes that are not UTF-8 become U+FFFD. Returns 0, OOC_ENOMEM, OOC_EINVAL
 * (t does not describe p) or OOC_EIO, with a message. */
int ooc_trace_json_write(const ooc_profile_t *p, const ooc_timeline_t *t, FILE *f, char *err,
                         size_t errlen);
int ooc_trace_json_write_file(const ooc_profile_t *p, const ooc_timeline_t *t, const char *path,
                              char *err, size_t errlen);

#endif
