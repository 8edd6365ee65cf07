/* SPDX-License-Identifier: MIT */
/* replay.c: the plan, followed op by op.
 *
 * Once the recorder has the profile of an iteration (OOC_MODE=auto), or OOC_PLAN names a saved
 * plan, the planner's actions are replayed every iteration: each op the program issues is
 * matched against the plan's op at the same position (its kind, name, launch shape or size, and
 * the sizes of the buffers it references, in order). The profile's buffers are bound to live
 * buffers as the ops reference them: persistent buffers once, the others anew each iteration.
 * Before a matched op its planned swap-ins are queued for mem.c's worker; after it, its planned
 * swap-outs are issued on the device-to-host stream.
 *
 * Residency stays demand-checked under the plan: every op's buffers are made resident by
 * ooc_mem_begin whatever the plan did, so a wrong or stale plan costs time, never data. On a
 * mismatch the rest of the iteration runs on demand (a divergence); the plan resumes at the next
 * op that looks like the iteration's first (after the marker, or after an op that looks like its
 * last). After REREC_AFTER iterations in a row that diverge, the shim records and plans again.
 *
 * Recompute actions are not replayed: the recorder does not verify producers yet, so profiles
 * it writes carry none and the planner emits none; a saved plan that has some is replayed with
 * those buffers left to demand residency.
 *
 * Locking: rp_lock guards P. ooc_replay_op_begin and _end run under the residency lock (order:
 * residency lock, rp_lock, the recorder's lock). */
#include "shim.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define REREC_AFTER 3 /* iterations in a row that diverge before the shim records again */

typedef struct rp_op {
    uint8_t kind;
    const char *name; /* the profile's */
    CUfunction fn;    /* a function seen here under that name */
    unsigned grid[3], block[3];
    uint64_t bytes;
    int shape_ok; /* the profile's shape could be read */
    uint32_t act_off, nact;
} rp_op_t;

typedef struct bind {
    uintptr_t addr;
    uint64_t id; /* 0: not bound */
} bind_t;

static pthread_mutex_t rp_lock = PTHREAD_MUTEX_INITIALIZER;
static _Atomic int rp_on;

static struct {
    ooc_profile_t *p;
    ooc_plan_t *pl;
    rp_op_t *ops;
    bind_t *bind;
    uint32_t n;
    uint32_t pos;      /* the op expected next; n: the iteration is complete */
    int32_t cur;       /* the op being issued, matched; -1 when none */
    int diverged;      /* the rest of this iteration runs on demand */
    int marked;        /* the marker was called since the last op */
    int prev_last;     /* diverged: the previous op looked like the iteration's last */
    uint64_t div_ops;  /* ops since the divergence, or since the last count of one */
    int iter_diverged; /* this iteration diverged */
    unsigned bad;      /* iterations in a row that diverged */
    int said;          /* the first divergence was logged */
} P;

int ooc_replay_on(void) {
    return atomic_load_explicit(&rp_on, memory_order_relaxed);
}

/* Forgets the plan. Caller holds rp_lock. */
static void clear(void) {
    atomic_store(&rp_on, 0);
    ooc_profile_free(P.p);
    ooc_plan_free(P.pl);
    free(P.ops);
    free(P.bind);
    memset(&P, 0, sizeof P);
    P.cur = -1;
}

/* Takes p and pl and starts replaying at op pos. Caller holds rp_lock. 0 or -1 (out of memory:
 * both are freed). */
static int start(ooc_profile_t *p, ooc_plan_t *pl, uint32_t pos) {
    clear();
    P.ops = calloc(p->nops ? p->nops : 1, sizeof *P.ops);
    P.bind = calloc(p->nbufs ? p->nbufs : 1, sizeof *P.bind);
    if (!P.ops || !P.bind) {
        free(P.ops);
        free(P.bind);
        ooc_profile_free(p);
        ooc_plan_free(pl);
        P.ops = NULL;
        P.bind = NULL;
        return -1;
    }
    P.p = p;
    P.pl = pl;
    P.n = p->nops;
    for (uint32_t i = 0; i < p->nops; i++) {
        const ooc_op_t *o = &p->ops[i];
        rp_op_t *r = &P.ops[i];
        r->kind = o->kind;
        r->name = o->name;
        unsigned long long bytes = 0;
        if (o->kind == OOC_OP_KERNEL)
            r->shape_ok =
                sscanf(o->shape, "grid=(%u,%u,%u);block=(%u,%u,%u)", &r->grid[0], &r->grid[1],
                       &r->grid[2], &r->block[0], &r->block[1], &r->block[2]) == 6;
        else
            r->shape_ok = sscanf(o->shape, "bytes=%llu", &bytes) == 1;
        r->bytes = bytes;
    }
    /* The actions are sorted by op, then before/after: index them per op. */
    for (uint32_t k = 0; k < pl->nacts; k++) {
        const ooc_action_t *a = &pl->acts[k];
        if (a->op < 0 || (uint32_t)a->op >= P.n)
            continue;
        rp_op_t *r = &P.ops[a->op];
        if (r->nact == 0)
            r->act_off = k;
        r->nact = k - r->act_off + 1;
    }
    P.pos = pos < P.n ? pos : 0;
    P.cur = -1;
    atomic_store(&rp_on, 1);
    return 0;
}

/* Does the live op look like plan op i (kind, name, shape or size)? */
static int same_op(uint32_t i, const ooc_access_t *a) {
    rp_op_t *o = &P.ops[i];
    if (!o->shape_ok || o->kind != a->kind)
        return 0;
    if (a->kind == OOC_OP_KERNEL) {
        if (memcmp(o->grid, a->grid, sizeof o->grid) || memcmp(o->block, a->block, sizeof o->block))
            return 0;
        if (o->fn != a->fn) {
            if (strcmp(ooc_record_fn_name(a->fn), o->name) != 0)
                return 0;
            o->fn = a->fn;
        }
        return 1;
    }
    return o->bytes == a->bytes && a->name && strcmp(a->name, o->name) == 0;
}

/* Do the live op's buffers match plan op i's: as many, the same sizes in the same order, and
 * the buffers already bound (when `bound`)? */
static int same_bufs(uint32_t i, const ooc_opbuf_t *b, size_t nb, int bound) {
    const ooc_op_t *o = &P.p->ops[i];
    if (o->nref != nb)
        return 0;
    for (uint32_t r = 0; r < o->nref; r++) {
        int32_t pid = P.p->refs[o->ref_off + r].buf;
        if (P.p->bufs[pid].bytes != b[r].bytes)
            return 0;
        if (bound && P.bind[pid].id && P.bind[pid].id != b[r].id)
            return 0;
    }
    return 1;
}

static void new_iteration(void) {
    if (P.pos == P.n && !P.iter_diverged)
        P.bad = 0;
    P.pos = 0;
    P.diverged = 0;
    P.iter_diverged = 0;
    P.div_ops = 0;
    P.prev_last = 0;
    for (uint32_t b = 0; b < P.p->nbufs; b++)
        if (!P.p->bufs[b].persistent)
            P.bind[b] = (bind_t){0, 0};
}

/* The iteration changed shape persistently: record and plan it again. */
static void rerecord(void) {
    ooc_stats_add(OOC_STAT_rerecords, 1);
    OOC_LOG_W("the program's iteration no longer matches the plan (%u iterations in a row "
              "diverged): recording it again",
              P.bad);
    /* No fast-path op may slip in between replay off and the recorder on: the writer section
     * lasts until the residency lock (held here) is released. */
    ooc_mem_l_quiesce();
    clear();
    ooc_record_restart_l();
}

/* A bad iteration: counted once; enough in a row and the shim records again. */
static void count_bad(void) {
    P.bad++;
    if (P.bad >= REREC_AFTER)
        rerecord();
}

static void diverge(uint32_t i, const char *why) {
    ooc_stats_add(OOC_STAT_divergences, 1);
    if (!P.said) {
        P.said = 1;
        OOC_LOG_I("replay: the program's op %u of the iteration does not match the plan (%s); "
                  "the rest of the iteration runs on demand",
                  i, why);
    }
    P.diverged = 1;
    P.div_ops = 0;
    if (!P.iter_diverged) {
        P.iter_diverged = 1;
        count_bad();
    }
}

void ooc_replay_op_begin(const ooc_access_t *a, const ooc_opbuf_t *b, size_t nb, CUstream s) {
    pthread_mutex_lock(&rp_lock);
    if (!ooc_replay_on()) {
        pthread_mutex_unlock(&rp_lock);
        return;
    }
    P.cur = -1;
    int marked = P.marked;
    P.marked = 0;
    if (marked && !P.diverged && P.pos != 0 && P.pos != P.n)
        diverge(P.pos, "the iteration ended early");
    if (!ooc_replay_on()) {
        pthread_mutex_unlock(&rp_lock);
        return;
    }
    if (P.diverged || marked || P.pos == P.n) {
        /* At an iteration's end, or looking for one: only the plan's first op starts the next. */
        int boundary = marked || P.pos == P.n || P.prev_last;
        if (boundary && same_op(0, a) && same_bufs(0, b, nb, 0)) {
            new_iteration();
        } else {
            if (!P.diverged)
                diverge(P.n, "the iteration went on past the plan's end");
            if (ooc_replay_on()) {
                P.prev_last = same_op(P.n - 1, a);
                if (++P.div_ops >= P.n) { /* a whole iteration's worth of ops without a match */
                    P.div_ops = 0;
                    count_bad();
                }
            }
            pthread_mutex_unlock(&rp_lock);
            return;
        }
    }
    uint32_t i = P.pos;
    if (!same_op(i, a) || !same_bufs(i, b, nb, 1)) {
        diverge(i, same_op(i, a) ? "other buffers" : "another operation");
        if (ooc_replay_on())
            P.prev_last = same_op(P.n - 1, a);
        pthread_mutex_unlock(&rp_lock);
        return;
    }
    const ooc_op_t *o = &P.p->ops[i];
    for (uint32_t r = 0; r < o->nref; r++)
        P.bind[P.p->refs[o->ref_off + r].buf] = (bind_t){b[r].addr, b[r].id};
    const rp_op_t *ro = &P.ops[i];
    for (uint32_t k = ro->act_off; k < ro->act_off + ro->nact; k++) {
        const ooc_action_t *act = &P.pl->acts[k];
        const bind_t *x = &P.bind[act->buf];
        if (act->when == OOC_BEFORE && act->kind == OOC_ACT_SWAPIN && x->id)
            ooc_mem_l_prefetch(x->addr, x->id, s);
        /* WAIT: ops wait for the copies of the chunks they use (mem.c). RECOMPUTE: see top. */
    }
    P.cur = (int32_t)i;
    P.pos = i + 1;
    ooc_stats_add(OOC_STAT_planned_ops, 1);
    pthread_mutex_unlock(&rp_lock);
}

void ooc_replay_op_end(CUstream s) {
    pthread_mutex_lock(&rp_lock);
    if (!ooc_replay_on() || P.cur < 0) {
        pthread_mutex_unlock(&rp_lock);
        return;
    }
    const rp_op_t *ro = &P.ops[P.cur];
    for (uint32_t k = ro->act_off; k < ro->act_off + ro->nact; k++) {
        const ooc_action_t *act = &P.pl->acts[k];
        const bind_t *x = &P.bind[act->buf];
        if (act->when != OOC_AFTER || !x->id)
            continue;
        if (act->kind == OOC_ACT_SWAPOUT)
            ooc_mem_l_swapout(x->addr, x->id, s);
        else if (act->kind == OOC_ACT_DROP)
            ooc_mem_l_drop(x->addr, x->id);
    }
    P.cur = -1;
    pthread_mutex_unlock(&rp_lock);
}

void ooc_replay_mark(void) {
    pthread_mutex_lock(&rp_lock);
    if (ooc_replay_on())
        P.marked = 1;
    pthread_mutex_unlock(&rp_lock);
}

void ooc_replay_stop(void) {
    pthread_mutex_lock(&rp_lock);
    clear();
    pthread_mutex_unlock(&rp_lock);
}

/* ---- planning -------------------------------------------------------------------------------- */

/* Simulates plan pl on profile p and logs its summary line ("plan (auto) in ...: keep ..."). 0,
 * or -1 when the simulator finds that the plan cannot run (logged). A saved plan (`saved`) is
 * replayed even then, with a warning: residency stays demand-checked, so it can cost time but
 * not data. */
static int summarize(const ooc_profile_t *p, const ooc_plan_t *pl, const char *where, int saved) {
    ooc_model_t *m = NULL;
    if (ooc_model_build(p, pl->chunk_bytes, &m) != 0) {
        OOC_LOG_E("no replay: out of memory while planning");
        return -1;
    }
    ooc_sim_result_t res;
    memset(&res, 0, sizeof res);
    int rc = ooc_sim_run(m, pl, NULL, &res);
    if (rc == 0 && !res.feasible && saved) {
        OOC_LOG_W("the saved plan %s does not hold in simulation (%s); replaying it anyway: every "
                  "op's buffers are still made resident before it runs",
                  where, res.viol_msg);
    } else if (rc != 0 || !res.feasible) {
        OOC_LOG_W("no replay: the %s plan cannot run under a budget of %llu bytes (%s); the shim "
                  "stays in demand mode",
                  pl->policy, (unsigned long long)pl->budget_bytes,
                  rc ? "out of memory" : res.viol_msg);
        ooc_sim_result_free(&res);
        ooc_model_free(m);
        return -1;
    }
    char line[OOC_PATH_MAX + 512];
    int n = snprintf(line, sizeof line,
                     "ooc[%d] ooc-shim: plan (%s) %s, for a budget of %.1f MiB: keep %u, swap %u, "
                     "recompute %u buffers; predicted %.3f ms per iteration, %.3fx the in-core "
                     "%.3f ms, %.1f MiB each way; replaying\n",
                     (int)getpid(), pl->policy, where, (double)pl->budget_bytes / 1048576.0,
                     res.n_keep, res.n_swap, res.n_recompute, (double)res.time_ns / 1e6,
                     m->compute_ns ? (double)res.time_ns / (double)m->compute_ns : 0.0,
                     (double)m->compute_ns / 1e6, (double)res.h2d_bytes / 1048576.0);
    if (n > 0 && ooc_log_level() >= OOC_LOG_WARN) {
        ssize_t w = write(2, line, (size_t)(n < (int)sizeof line ? n : (int)sizeof line - 1));
        (void)w;
    }
    ooc_sim_result_free(&res);
    ooc_model_free(m);
    return 0;
}

/* Starts the worker, then replaying. Takes p and pl. */
static void go(ooc_profile_t *p, ooc_plan_t *pl, uint32_t pos) {
    if (ooc_mem_replay_init() != 0) {
        OOC_LOG_E("no replay: the transfer streams or the worker thread could not be made; the "
                  "shim stays in demand mode");
        ooc_profile_free(p);
        ooc_plan_free(pl);
        return;
    }
    pthread_mutex_lock(&rp_lock);
    if (start(p, pl, pos) != 0)
        OOC_LOG_E("no replay: out of memory");
    pthread_mutex_unlock(&rp_lock);
    ooc_mem_quiesce(); /* a fast-path op that saw replay off has ended: later ones see it on */
}

void ooc_replay_plan(ooc_profile_t *p, const char *dir, uint32_t pos) {
    uint64_t chunk, budget;
    ooc_mem_geometry(&chunk, &budget);
    /* Slab chunks hold the small buffers of every iteration at once, and the shim keeps one
     * chunk of slack: the plan gets the rest. */
    uint64_t reserve = (ooc_mem_slab_chunks() + 1) * chunk;
    uint64_t plan_budget = budget > reserve + chunk ? budget - reserve : chunk;
    const ooc_options_t *o = ooc_opts();
    ooc_policy_opts_t po;
    memset(&po, 0, sizeof po);
    po.budget_bytes = plan_budget;
    po.window_bytes = o->window.kind == OOC_SIZE_BYTES ? o->window.bytes : 0;
    ooc_model_t *m = NULL;
    ooc_plan_t *pl = NULL;
    char err[256] = "";
    int rc = ooc_model_build(p, chunk, &m);
    if (rc == 0)
        rc = ooc_policy_plan(m, ooc_policy_name(o->policy), &po, &pl, err, sizeof err);
    ooc_model_free(m);
    if (rc != 0) {
        OOC_LOG_W("no replay: no %s plan under a budget of %llu bytes: %s; the shim stays in "
                  "demand mode",
                  ooc_policy_name(o->policy), (unsigned long long)plan_budget,
                  err[0] ? err : "out of memory");
        ooc_profile_free(p);
        return;
    }
    char path[OOC_PATH_MAX + 16], where[OOC_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/plan.tsv", dir);
    if (ooc_plan_write_file(pl, path, err, sizeof err) != 0) {
        OOC_LOG_W("the plan could not be written: %s", err);
        snprintf(where, sizeof where, "(not written)");
    } else {
        snprintf(where, sizeof where, "in %s", path);
    }
    if (summarize(p, pl, where, 0) != 0) {
        ooc_profile_free(p);
        ooc_plan_free(pl);
        return;
    }
    go(p, pl, pos);
}

int ooc_replay_load(const char *plan_path) {
    char dir[OOC_PATH_MAX], err[512];
    snprintf(dir, sizeof dir, "%s", plan_path);
    char *slash = strrchr(dir, '/');
    if (slash)
        *slash = 0;
    else
        snprintf(dir, sizeof dir, ".");
    ooc_profile_t *p = NULL;
    ooc_plan_t *pl = NULL;
    if (ooc_profile_read(dir, &p, err, sizeof err) != 0) {
        OOC_LOG_E("OOC_PLAN=%s: the profile the plan belongs to (in %s) cannot be read: %s",
                  plan_path, dir, err);
        return -1;
    }
    if (ooc_plan_read_file(plan_path, &pl, err, sizeof err) != 0) {
        OOC_LOG_E("OOC_PLAN=%s: %s", plan_path, err);
        ooc_profile_free(p);
        return -1;
    }
    uint64_t chunk, budget;
    ooc_mem_geometry(&chunk, &budget);
    const char *bad = NULL;
    char why[256];
    if (pl->nops != p->nops || pl->nbufs != p->nbufs) {
        snprintf(why, sizeof why, "the plan has %u ops and %u buffers, its profile %u and %u",
                 pl->nops, pl->nbufs, p->nops, p->nbufs);
        bad = why;
    } else if (pl->chunk_bytes != chunk) {
        snprintf(why, sizeof why,
                 "the plan is for chunks of %llu bytes; the shim's are %llu (set "
                 "OOC_CHUNK)",
                 (unsigned long long)pl->chunk_bytes, (unsigned long long)chunk);
        bad = why;
    }
    if (bad) {
        OOC_LOG_E("OOC_PLAN=%s: %s", plan_path, bad);
        ooc_profile_free(p);
        ooc_plan_free(pl);
        return -1;
    }
    if (pl->budget_bytes > budget)
        OOC_LOG_W("OOC_PLAN=%s was made for a budget of %llu bytes, more than the %llu in force: "
                  "expect swaps on demand",
                  plan_path, (unsigned long long)pl->budget_bytes, (unsigned long long)budget);
    char where[OOC_PATH_MAX + 16];
    snprintf(where, sizeof where, "from %s", plan_path);
    if (summarize(p, pl, where, 1) != 0) {
        ooc_profile_free(p);
        ooc_plan_free(pl);
        return -1;
    }
    go(p, pl, 0);
    return 0;
}
