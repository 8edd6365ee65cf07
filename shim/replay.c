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
 * Recompute: a matched producer that some recompute action re-launches has its launch saved
 * (ooc_launch_now, recompute.c). A planned drop of a buffer that a verified recompute follows
 * (its `via` is the profile's producers, and they ran this iteration) becomes a recipe: the
 * buffer's chunks are evicted without a copy when memory is needed (mem.c, discard). The recipe
 * is settled before any op that touches the buffer or an input of its producers, at the plan's
 * recompute, at a divergence, at the iteration's end and before an input is freed: still all
 * resident, the discard is cancelled; otherwise the buffer and the inputs join the op's chunks
 * (ooc_mem_l_include) and ooc_replay_op_ready re-launches the producers on the op's stream just
 * before the op. So a dropped buffer is never read without being rebuilt; an op that cannot
 * have them all resident fails with CUDA_ERROR_OUT_OF_MEMORY rather than read lost bytes.
 *
 * Locking: rp_lock guards P and Q. ooc_replay_op_begin, _end and _op_ready run under the
 * residency lock (order: residency lock, rp_lock, the recorder's lock). ooc_replay_fast_next and
 * ooc_replay_fast read P
 * with neither, inside the fast path's reader section (fastpath.c): so whatever changes what it
 * reads does so in a writer section (ooc_mem_l_quiesce, or ooc_mem_quiesce after the replay was
 * switched off), except P.pos, which fast-path ops move on with a compare-and-swap, P.marked,
 * set by the marker with an atomic store, and P.rc.n, which ooc_replay_before_free only lowers;
 * those three are read with atomic loads. */
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
    uint8_t is_via;        /* a producer that some recompute re-launches */
    uint64_t saved_iter;   /* the iteration `sl` was saved in; 0: none */
    ooc_saved_launch_t sl; /* is_via: the launch as issued this iteration */
} rp_op_t;

typedef struct bind {
    uintptr_t addr;
    uint64_t id;    /* 0: not bound */
    uint64_t stamp; /* its slab chunk's stamp when bound (ooc_opbuf_t) */
} bind_t;

/* A dropped buffer and how to rebuild it: its producers' launches as issued this iteration, and
 * the buffers they read, which nothing has changed since (the recompute rule, docs/planner.md). */
typedef struct recipe {
    bind_t buf;
    uint32_t nvia;
    ooc_saved_launch_t *sl; /* nvia launches, owned */
    uint32_t nin;
    bind_t *in;      /* owned */
    uint64_t dur_ns; /* the producers' recorded durations */
} recipe_t;

typedef struct recipes {
    recipe_t *v;
    size_t n, cap;
} recipes_t;

static pthread_mutex_t rp_lock = PTHREAD_MUTEX_INITIALIZER;
_Atomic int ooc_replay_rebuilds;

/* Rebuilds queued by ooc_replay_op_begin for the op being made resident, issued by
 * ooc_replay_op_ready before it (both under the residency lock, so never another op's). Kept
 * apart from P: a rebuild queued by the op whose divergence ends the replay still runs. */
static recipes_t Q;

/* The last op diverged once too often (rerecord): the replay stopped, and the recorder is to
 * start again, which ooc_replay_op_begin's caller does. Guarded by the residency lock. */
static int rerecord_due;

static struct {
    ooc_profile_t *p;
    ooc_plan_t *pl;
    rp_op_t *ops;
    bind_t *bind;
    uint32_t n;
    uint32_t pos;          /* the op expected next; n: the iteration is complete */
    int32_t cur;           /* the op being issued, matched; -1 when none */
    int diverged;          /* the rest of this iteration runs on demand */
    int marked;            /* the marker was called since the last op */
    int prev_last;         /* diverged: the previous op looked like the iteration's last */
    uint64_t div_ops;      /* ops since the divergence, or since the last count of one */
    int iter_diverged;     /* this iteration diverged */
    unsigned bad;          /* iterations in a row that diverged */
    int said;              /* divergences logged at info level (the first few) */
    uint64_t iter;         /* iterations started under this plan, from 1 */
    uint64_t blocked_mark; /* OOC_STAT_blocked_ns when the current iteration started */
    uint64_t vmm_mark;     /* OOC_STAT_vmm_prog_ns then */
    uint64_t why_mark[OOC_STAT_WHY_N]; /* OOC_STAT_blocked_<cause>_ns then */
    uint64_t idle_mark;                /* OOC_STAT_blocked_idle_ns then */
    int32_t *drop_rc;  /* per action: for a drop, the recompute of the same buffer that follows */
    recipes_t rc;      /* dropped buffers waiting to be rebuilt */
    ooc_opbuf_t *keep; /* drop_unplanned's scratch: the live buffers in the plan's order */
    uint64_t *bound;   /* and the plan's bindings of them */
    size_t keep_cap;
} P;

static void recipe_free(recipe_t *r) {
    for (uint32_t j = 0; r->sl && j < r->nvia; j++)
        ooc_launch_saved_free(&r->sl[j]);
    free(r->sl);
    free(r->in);
    memset(r, 0, sizeof *r);
}

static void recipes_clear(recipes_t *rs) {
    for (size_t i = 0; i < rs->n; i++)
        recipe_free(&rs->v[i]);
    free(rs->v);
    memset(rs, 0, sizeof *rs);
}

/* Forgets the plan (and the rebuilds pending: call resolve_all first when they are needed).
 * Caller holds rp_lock. */
static void clear(void) {
    atomic_store(&ooc_rp_on, 0);
    for (uint32_t i = 0; P.ops && i < P.n; i++)
        ooc_launch_saved_free(&P.ops[i].sl);
    recipes_clear(&P.rc);
    free(P.drop_rc);
    ooc_profile_free(P.p);
    ooc_plan_free(P.pl);
    free(P.ops);
    free(P.bind);
    free(P.keep);
    free(P.bound);
    memset(&P, 0, sizeof P);
    P.cur = -1;
}

/* Does recompute action a re-launch exactly the producers the recorder verified for its buffer
 * (a saved plan may say anything)? Only then is the buffer ever given up. */
static int verified(const ooc_profile_t *p, const ooc_plan_t *pl, const ooc_action_t *a) {
    if (a->buf < 0 || (uint32_t)a->buf >= p->nbufs)
        return 0;
    const ooc_buffer_t *b = &p->bufs[a->buf];
    if (a->nvia == 0 || a->nvia != b->nprod)
        return 0;
    for (uint32_t j = 0; j < a->nvia; j++) {
        int32_t v = pl->via[a->via_off + j];
        if (v < 0 || (uint32_t)v >= p->nops || v != p->prods[b->prod_off + j])
            return 0;
    }
    return 1;
}

/* Takes p and pl and starts replaying at op pos. Caller holds rp_lock. 0 or -1 (out of memory:
 * both are freed). */
static int start(ooc_profile_t *p, ooc_plan_t *pl, uint32_t pos) {
    clear();
    P.ops = calloc(p->nops ? p->nops : 1, sizeof *P.ops);
    P.bind = calloc(p->nbufs ? p->nbufs : 1, sizeof *P.bind);
    P.drop_rc = malloc((pl->nacts ? pl->nacts : 1) * sizeof *P.drop_rc);
    if (!P.ops || !P.bind || !P.drop_rc) {
        free(P.ops);
        free(P.bind);
        free(P.drop_rc);
        ooc_profile_free(p);
        ooc_plan_free(pl);
        P.ops = NULL;
        P.bind = NULL;
        P.drop_rc = NULL;
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
    /* Recomputes: their producers, and for each drop the recompute of its buffer that follows
     * (the plan uses the buffer nowhere in between). */
    for (uint32_t k = 0; k < pl->nacts; k++) {
        const ooc_action_t *a = &pl->acts[k];
        P.drop_rc[k] = -1;
        if (a->kind == OOC_ACT_RECOMPUTE && verified(p, pl, a))
            for (uint32_t j = 0; j < a->nvia; j++)
                P.ops[pl->via[a->via_off + j]].is_via = 1;
        if (a->kind != OOC_ACT_DROP)
            continue;
        for (uint32_t j = k + 1; j < pl->nacts; j++) {
            const ooc_action_t *b = &pl->acts[j];
            if (b->buf != a->buf)
                continue;
            if (b->kind == OOC_ACT_RECOMPUTE && verified(p, pl, b))
                P.drop_rc[k] = (int32_t)j;
            break;
        }
    }
    P.iter = 1;
    P.pos = pos < P.n ? pos : 0;
    P.cur = -1;
    atomic_store(&ooc_rp_on, 1);
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
            if (strcmp(ooc_fnname_of(a->fn), o->name) != 0)
                return 0;
            o->fn = a->fn;
        }
        return 1;
    }
    return o->bytes == a->bytes && a->name && strcmp(a->name, o->name) == 0;
}

/* same_op for the fast path: reads the plan, never changes it (a kernel seen under another
 * CUfunction than the one remembered takes the locked path, which remembers it). */
static int same_op_fast(uint32_t i, const ooc_access_t *a) {
    const rp_op_t *o = &P.ops[i];
    if (!o->shape_ok || o->kind != a->kind)
        return 0;
    if (a->kind == OOC_OP_KERNEL)
        return o->fn && o->fn == a->fn && !memcmp(o->grid, a->grid, sizeof o->grid) &&
               !memcmp(o->block, a->block, sizeof o->block);
    return o->bytes == a->bytes && a->name && strcmp(a->name, o->name) == 0;
}

/* Do the live op's buffers match plan op i's: as many, the same sizes in the same order, and
 * the buffers already bound (when `bound`)? When not, says how in why[n] when why is given
 * (each `return why && snprintf(...) < 0` returns 0 after writing). */
static int same_bufs(uint32_t i, const ooc_opbuf_t *b, size_t nb, int bound, char *why, size_t n) {
    const ooc_op_t *o = &P.p->ops[i];
    if (o->nref != nb)
        return why && ooc_replay_say_sizes(why, n, b, nb, P.p, o) < 0;
    for (uint32_t r = 0; r < o->nref; r++) {
        int32_t pid = P.p->refs[o->ref_off + r].buf;
        if (P.p->bufs[pid].bytes != b[r].bytes)
            return why &&
                   snprintf(why, n, "other buffers: its buffer %u has %llu bytes, the plan's %llu",
                            r, (unsigned long long)b[r].bytes,
                            (unsigned long long)P.p->bufs[pid].bytes) < 0;
        if (bound && P.bind[pid].id && P.bind[pid].id != b[r].id)
            return why && snprintf(why, n,
                                   "other buffers: its buffer %u is not the plan's buffer %d "
                                   "of earlier in the iteration",
                                   r, pid) < 0;
    }
    return 1;
}

/* Kernel op i's buffers differ from the plan's only by stale parameter words
 * (ooc_replay_match_stale): then *b becomes the plan's buffers (id 0 where the live op has none),
 * *nb their number, and 1 is returned; else 0 (a divergence). Caller holds rp_lock. */
static int drop_unplanned(uint32_t i, const ooc_access_t *a, const ooc_opbuf_t **b, size_t *nb) {
    const ooc_op_t *o = &P.p->ops[i];
    if (o->nref > P.keep_cap) {
        ooc_opbuf_t *k = realloc(P.keep, o->nref * sizeof *k);
        if (k)
            P.keep = k;
        uint64_t *d = k ? realloc(P.bound, o->nref * sizeof *d) : NULL;
        if (!d)
            return 0;
        P.bound = d;
        P.keep_cap = o->nref;
    }
    for (uint32_t r = 0; r < o->nref; r++)
        P.bound[r] = P.bind[P.p->refs[o->ref_off + r].buf].id;
    if (!ooc_replay_match_stale(P.p, o, P.bound, a, *b, *nb, P.keep))
        return 0;
    *b = P.keep;
    *nb = o->nref;
    return 1;
}

/* ---- recompute ------------------------------------------------------------------------------ */

static int recipes_push(recipes_t *rs, recipe_t *r) {
    if (rs->n == rs->cap) {
        size_t nc = rs->cap ? rs->cap * 2 : 8;
        recipe_t *v = realloc(rs->v, nc * sizeof *v);
        if (!v)
            return -1;
        rs->v = v;
        rs->cap = nc;
    }
    rs->v[rs->n++] = *r;
    memset(r, 0, sizeof *r);
    return 0;
}

/* Takes pending recipe i out of P.rc into *out. */
static void take(size_t i, recipe_t *out) {
    *out = P.rc.v[i];
    P.rc.v[i] = P.rc.v[--P.rc.n];
}

/* Does buffer (addr, id) belong to recipe r (its buffer, or one its producers read)? */
static int in_recipe(const recipe_t *r, uint64_t id, int inputs_only) {
    if (!inputs_only && r->buf.id == id)
        return 1;
    for (uint32_t j = 0; j < r->nin; j++)
        if (r->in[j].id == id)
            return 1;
    return 0;
}

/* Settles pending recipe i before an op (residency lock held, inside ooc_mem_begin): when the
 * buffer still has all its bytes, its drop is cancelled; otherwise it and the buffers its
 * producers read join the op's chunks, and the producers are queued for ooc_replay_op_ready,
 * after those of any dropped buffer they read. */
static void resolve(size_t i, unsigned depth) {
    recipe_t r;
    take(i, &r);
    if (!ooc_mem_l_lost(r.buf.addr, r.buf.id)) {
        ooc_mem_l_discard(r.buf.addr, r.buf.id, 0);
        ooc_stats_add(OOC_STAT_recompute_unneeded, 1);
        recipe_free(&r);
        return;
    }
    for (size_t k = 0; depth < 8 && k < P.rc.n;) {
        if (in_recipe(&r, P.rc.v[k].buf.id, 1))
            resolve(k, depth + 1); /* k now holds another recipe */
        else
            k++;
    }
    int ok = ooc_mem_l_include(r.buf.addr, r.buf.id) == 0;
    for (uint32_t j = 0; ok && j < r.nin; j++)
        ok = ooc_mem_l_include(r.in[j].addr, r.in[j].id) == 0;
    if (!ok || recipes_push(&Q, &r) != 0) {
        OOC_LOG_E("a dropped buffer (%#llx) cannot be rebuilt: %s; the operations that read it "
                  "will see wrong bytes",
                  (unsigned long long)r.buf.addr,
                  ok ? "out of memory" : "a buffer its producers read is gone");
        recipe_free(&r);
        return;
    }
    atomic_store(&ooc_replay_rebuilds, 1);
}

/* Settles every pending recipe (a divergence, an iteration's end, the end of the plan). */
static void resolve_all(void) {
    while (P.rc.n)
        resolve(P.rc.n - 1, 0);
}

/* Settles the recipes the op about to run touches: its buffer, or one its producers read (an op
 * may change that). */
static void resolve_touched(const ooc_opbuf_t *b, size_t nb) {
    for (size_t k = 0; k < P.rc.n;) {
        int hit = 0;
        for (size_t q = 0; q < nb && !hit; q++)
            hit = in_recipe(&P.rc.v[k], b[q].id, 0);
        if (hit)
            resolve(k, 0);
        else
            k++;
    }
}

/* The recipe of buffer `buf` dropped by action k, or -1 when it cannot be had now (a producer
 * not issued this iteration, a buffer not bound, memory). */
static int make_recipe(uint32_t k, recipe_t *r) {
    const ooc_action_t *rc = &P.pl->acts[P.drop_rc[k]];
    int32_t buf = P.pl->acts[k].buf;
    memset(r, 0, sizeof *r);
    r->buf = P.bind[buf];
    uint32_t nin = 0;
    for (uint32_t j = 0; j < rc->nvia; j++) {
        int32_t v = P.pl->via[rc->via_off + j];
        if (v < 0 || (uint32_t)v >= P.n || P.ops[v].saved_iter != P.iter)
            return -1;
        nin += P.p->ops[v].nref;
    }
    r->sl = calloc(rc->nvia ? rc->nvia : 1, sizeof *r->sl);
    r->in = calloc(nin ? nin : 1, sizeof *r->in);
    if (!r->sl || !r->in) {
        recipe_free(r);
        return -1;
    }
    r->nvia = rc->nvia;
    for (uint32_t j = 0; j < rc->nvia; j++) {
        int32_t v = P.pl->via[rc->via_off + j];
        const ooc_op_t *o = &P.p->ops[v];
        /* The launch moves to the recipe: each producer serves one buffer per iteration. */
        r->sl[j] = P.ops[v].sl;
        memset(&P.ops[v].sl, 0, sizeof P.ops[v].sl);
        P.ops[v].saved_iter = 0;
        r->dur_ns += o->duration_ns;
        for (uint32_t q = 0; q < o->nref; q++) {
            int32_t x = P.p->refs[o->ref_off + q].buf;
            if (x == buf)
                continue;
            if (!P.bind[x].id) {
                recipe_free(r);
                return -1;
            }
            int dup = 0;
            for (uint32_t t = 0; t < r->nin; t++)
                dup |= r->in[t].id == P.bind[x].id;
            if (!dup)
                r->in[r->nin++] = P.bind[x];
        }
    }
    return 0;
}

/* The plan drops buffer x after the op just issued (action k): when a recompute of it follows
 * and its recipe is complete, its bytes are given up (evicted without a copy, when memory is
 * needed); otherwise it is only the first to evict, with a copy, as a dead buffer is. */
static void drop(uint32_t k, const bind_t *x) {
    recipe_t r;
    for (size_t i = 0; i < P.rc.n; i++)
        if (P.rc.v[i].buf.id == x->id)
            return; /* already waiting to be rebuilt */
    if (P.drop_rc[k] >= 0 && make_recipe(k, &r) == 0) {
        if (ooc_mem_l_discard(x->addr, x->id, 1) && recipes_push(&P.rc, &r) == 0) {
            ooc_stats_add(OOC_STAT_recompute_drops, 1);
            return;
        }
        ooc_mem_l_discard(x->addr, x->id, 0);
        recipe_free(&r);
    }
    ooc_mem_l_drop(x->addr, x->id);
}

CUresult ooc_replay_op_ready(CUresult r, CUstream s) {
    pthread_mutex_lock(&rp_lock);
    size_t i = 0;
    for (; i < Q.n && r == CUDA_SUCCESS; i++) {
        recipe_t *q = &Q.v[i];
        for (uint32_t j = 0; j < q->nvia && r == CUDA_SUCCESS; j++)
            r = ooc_launch_issue(&q->sl[j], s);
        if (r != CUDA_SUCCESS) {
            OOC_LOG_E("a dropped buffer (%#llx) could not be rebuilt: re-launching its producer "
                      "failed (%s)",
                      (unsigned long long)q->buf.addr, ooc_real_errname(r));
            break;
        }
        ooc_stats_add(OOC_STAT_recomputes, 1);
        ooc_stats_add(OOC_STAT_recompute_launches, q->nvia);
        ooc_stats_add(OOC_STAT_recompute_ns, q->dur_ns);
    }
    /* The op will not run (its residency or a rebuild failed): what was not rebuilt waits again
     * while the plan is followed; without a plan it cannot be rebuilt any more. */
    for (; i < Q.n; i++) {
        if (ooc_replay_on() && recipes_push(&P.rc, &Q.v[i]) == 0)
            continue;
        OOC_LOG_E("a dropped buffer (%#llx) is lost: the operation before which it was to be "
                  "rebuilt failed",
                  (unsigned long long)Q.v[i].buf.addr);
        recipe_free(&Q.v[i]);
    }
    for (size_t k = 0; k < Q.n; k++)
        recipe_free(&Q.v[k]);
    Q.n = 0;
    atomic_store(&ooc_replay_rebuilds, 0);
    pthread_mutex_unlock(&rp_lock);
    return r;
}

void ooc_replay_before_free(CUdeviceptr p, CUstream s) {
    pthread_mutex_lock(&rp_lock);
    int hit = 0;
    for (size_t k = 0; k < P.rc.n;) {
        const recipe_t *r = &P.rc.v[k];
        for (uint32_t j = 0; j < r->nin; j++)
            hit |= r->in[j].addr == (uintptr_t)p;
        if (r->buf.addr == (uintptr_t)p) {
            recipe_t dead;
            take(k, &dead); /* freed: nothing to rebuild */
            recipe_free(&dead);
        } else {
            k++;
        }
    }
    pthread_mutex_unlock(&rp_lock);
    if (!hit)
        return;
    /* An op of the shim's that reads p: the recipes that need p are settled before it. */
    ooc_access_t *a = malloc(sizeof *a);
    if (!a) {
        OOC_LOG_E("out of memory: a dropped buffer whose producer reads %#llx may be lost",
                  (unsigned long long)p);
        return;
    }
    memset(a, 0, offsetof(ooc_access_t, kind));
    a->kind = OOC_OP_KERNEL;
    a->name = "ooc-rebuild";
    ooc_mem_note(a, (uintptr_t)p);
    ooc_internal_op = OOC_OWN_REBUILD;
    /* op.c's sequence, less the recorder: the recipes the op touches are settled first. */
    int listed = 0;
    CUresult r = ooc_mem_op_pin(a, &listed);
    if (r == CUDA_SUCCESS) {
        if (listed && ooc_replay_on()) {
            const ooc_opbuf_t *b;
            size_t nb = ooc_mem_op_buffers(&b);
            ooc_replay_op_begin(a, b, nb, s);
        }
        r = ooc_mem_op_resident(s);
    }
    if (atomic_load_explicit(&ooc_replay_rebuilds, memory_order_relaxed))
        r = ooc_replay_op_ready(r, s);
    ooc_mem_end(a, s, r == CUDA_SUCCESS);
    ooc_internal_op = OOC_OWN_NONE;
    free(a);
}

static void new_iteration(void) {
    resolve_all();
    /* The host time blocked in the iteration that ends here, when it ran whole under the plan
     * (the first one starts where the plan was made): on a GPU, time the device may idle. */
#define WHY_(c) {OOC_STAT_blocked_##c##_ns, OOC_STAT_replay_##c##_ns},
    static const ooc_stat_t why[OOC_STAT_WHY_N][2] = {OOC_STAT_WHY(WHY_)};
#undef WHY_
    uint64_t blocked = ooc_stats_get(OOC_STAT_blocked_ns);
    uint64_t idle = ooc_stats_get(OOC_STAT_blocked_idle_ns);
    uint64_t vmm = ooc_stats_get(OOC_STAT_vmm_prog_ns);
    for (int i = 0; i < OOC_STAT_WHY_N; i++) {
        uint64_t now = ooc_stats_get(why[i][0]);
        if (P.iter >= 2)
            ooc_stats_add(why[i][1], now - P.why_mark[i]);
        P.why_mark[i] = now;
    }
    if (P.iter >= 2) {
        ooc_stats_add(OOC_STAT_replay_blocked_ns, blocked - P.blocked_mark);
        ooc_stats_add(OOC_STAT_replay_idle_ns, idle - P.idle_mark);
        ooc_stats_add(OOC_STAT_replay_vmm_prog_ns, vmm - P.vmm_mark);
        ooc_stats_add(OOC_STAT_replay_iters, 1);
    }
    P.blocked_mark = blocked;
    P.idle_mark = idle;
    P.vmm_mark = vmm;
    P.iter++;
    if (P.pos == P.n && !P.iter_diverged)
        P.bad = 0;
    P.pos = 0;
    P.diverged = 0;
    P.iter_diverged = 0;
    P.div_ops = 0;
    P.prev_last = 0;
    for (uint32_t b = 0; b < P.p->nbufs; b++)
        if (!P.p->bufs[b].persistent)
            P.bind[b] = (bind_t){0, 0, 0};
}

/* The iteration changed shape persistently: record and plan it again. */
static void rerecord(void) {
    ooc_stats_add(OOC_STAT_rerecords, 1);
    OOC_LOG_W("the program's iteration no longer matches the plan (%u iterations in a row "
              "diverged): recording it again",
              P.bad);
    resolve_all();
    /* No fast-path op may slip in between replay off and the recorder on: the writer section
     * lasts until the residency lock (held here) is released. */
    ooc_mem_l_quiesce();
    clear();
    rerecord_due = 1; /* ooc_replay_op_begin's caller starts the recorder */
}

/* A bad iteration: counted once; enough in a row and the shim records again. */
static void count_bad(void) {
    P.bad++;
    if (P.bad >= REREC_AFTER)
        rerecord();
}

/* Divergences named at info level; later ones at debug level, the first of each iteration. */
#define DIVERGE_SAID 4

static void diverge(uint32_t i, const ooc_access_t *a, const char *why) {
    ooc_stats_add(OOC_STAT_divergences, 1);
    resolve_all(); /* the plan no longer says what comes: rebuild what was dropped now */
    if (!P.iter_diverged) {
        const char *live = !a                         ? "-"
                           : a->kind == OOC_OP_KERNEL ? ooc_fnname_of(a->fn)
                           : a->name                  ? a->name
                                                      : "?";
        const char *plan = i < P.n && P.ops[i].name ? P.ops[i].name : "-";
        if (P.said < DIVERGE_SAID)
            OOC_LOG_I("replay: the program's op %u of iteration %llu (%s) does not match the "
                      "plan's (%s): %s; the rest of the iteration runs on demand",
                      i, (unsigned long long)P.iter, live, plan, why);
        else
            OOC_LOG_D("replay: op %u of iteration %llu (%s, the plan's %s) diverged: %s", i,
                      (unsigned long long)P.iter, live, plan, why);
        P.said++;
    }
    P.diverged = 1;
    P.div_ops = 0;
    if (!P.iter_diverged) {
        P.iter_diverged = 1;
        count_bad();
    }
}

static void op_begin(const ooc_access_t *a, const ooc_opbuf_t *b, size_t nb, CUstream s) {
    if (ooc_internal_op == OOC_OWN_VERIFY)
        return;
    pthread_mutex_lock(&rp_lock);
    if (!ooc_replay_on()) {
        pthread_mutex_unlock(&rp_lock);
        return;
    }
    ooc_mem_l_quiesce(); /* no fast-path op reads P until the residency lock is released */
    /* Whatever the op is, a dropped buffer it touches, or whose producers read what it touches,
     * is settled first (ooc_replay_settle_all's op settles one in any case). */
    if (P.rc.n && ooc_internal_op == OOC_OWN_SETTLE)
        resolve(P.rc.n - 1, 0);
    else if (P.rc.n)
        resolve_touched(b, nb);
    if (ooc_internal_op) {
        pthread_mutex_unlock(&rp_lock);
        return;
    }
    P.cur = -1;
    int marked = P.marked;
    P.marked = 0;
    if (marked && !P.diverged && P.pos != 0 && P.pos != P.n)
        diverge(P.pos, a, "the iteration ended early");
    if (!ooc_replay_on()) {
        pthread_mutex_unlock(&rp_lock);
        return;
    }
    if (P.diverged || marked || P.pos == P.n) {
        /* At an iteration's end, or looking for one: only the plan's first op starts the next. */
        int boundary = marked || P.pos == P.n || P.prev_last;
        if (boundary && same_op(0, a) && same_bufs(0, b, nb, 0, NULL, 0)) {
            new_iteration();
        } else {
            if (!P.diverged)
                diverge(P.n, a, "the iteration went on past the plan's end");
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
    char why[512] = "another operation";
    if (!same_op(i, a) ||
        (!same_bufs(i, b, nb, 1, why, sizeof why) && !drop_unplanned(i, a, &b, &nb))) {
        diverge(i, a, why);
        if (ooc_replay_on())
            P.prev_last = same_op(P.n - 1, a);
        pthread_mutex_unlock(&rp_lock);
        return;
    }
    const ooc_op_t *o = &P.p->ops[i];
    for (uint32_t r = 0; r < o->nref; r++)
        if (b[r].id) /* (none: a plan buffer reached by a stale word when recorded) */
            P.bind[P.p->refs[o->ref_off + r].buf] = (bind_t){b[r].addr, b[r].id, b[r].stamp};
    rp_op_t *ro = &P.ops[i];
    if (ro->is_via) {
        ro->saved_iter = 0;
        if (ooc_launch_now && ooc_launch_now->fn == a->fn &&
            ooc_launch_save(ooc_launch_now, &ro->sl) == 0)
            ro->saved_iter = P.iter;
    }
    for (uint32_t k = ro->act_off; k < ro->act_off + ro->nact; k++) {
        const ooc_action_t *act = &P.pl->acts[k];
        const bind_t *x = &P.bind[act->buf];
        if (act->when == OOC_BEFORE && act->kind == OOC_ACT_SWAPIN && x->id)
            ooc_mem_l_prefetch(x->addr, x->id, s);
        if (act->when == OOC_BEFORE && act->kind == OOC_ACT_RECOMPUTE && x->id)
            for (size_t q = 0; q < P.rc.n; q++)
                if (P.rc.v[q].buf.id == x->id) {
                    resolve(q, 0);
                    break;
                }
        /* WAIT: ops wait for the copies of the chunks they use (mem.c). */
    }
    P.cur = (int32_t)i;
    P.pos = i + 1;
    ooc_stats_add(OOC_STAT_planned_ops, 1);
    pthread_mutex_unlock(&rp_lock);
}

int ooc_replay_fast_next(ooc_opbuf_t *cand, size_t cap, size_t *nc, uint32_t *pos) {
    if (ooc_internal_op || !ooc_replay_on() || P.diverged ||
        __atomic_load_n(&P.marked, __ATOMIC_RELAXED) ||
        __atomic_load_n(&P.rc.n, __ATOMIC_RELAXED) ||
        atomic_load_explicit(&ooc_replay_rebuilds, memory_order_relaxed))
        return 0;
    uint32_t i = __atomic_load_n(&P.pos, __ATOMIC_RELAXED);
    /* The iteration's first op (new_iteration) and ops the plan acts around: the locked path. */
    if (i == 0 || i >= P.n || P.ops[i].nact || P.ops[i].is_via)
        return 0;
    const ooc_op_t *o = &P.p->ops[i];
    if (o->nref > cap)
        return 0;
    for (uint32_t r = 0; r < o->nref; r++) {
        int32_t pid = P.p->refs[o->ref_off + r].buf;
        const bind_t *x = &P.bind[pid];
        if (!x->id)
            return 0; /* the locked path binds it */
        cand[r] = (ooc_opbuf_t){
            .id = x->id, .addr = x->addr, .bytes = P.p->bufs[pid].bytes, .stamp = x->stamp};
    }
    *nc = o->nref;
    *pos = i;
    return 1;
}

int ooc_replay_fast(const ooc_access_t *a, const ooc_opbuf_t *b, size_t nb, uint32_t pos) {
    if (!same_op_fast(pos, a) || !same_bufs(pos, b, nb, 1, NULL, 0))
        return 0;
    if (!__atomic_compare_exchange_n(&P.pos, &pos, pos + 1, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
        return 0; /* another thread's op took this place */
    ooc_stats_add(OOC_STAT_planned_ops, 1);
    return 1;
}

int ooc_replay_op_begin(const ooc_access_t *a, const ooc_opbuf_t *b, size_t nb, CUstream s) {
    op_begin(a, b, nb, s);
    int due = rerecord_due; /* set and cleared under the residency lock */
    rerecord_due = 0;
    return due ? OOC_REPLAY_RERECORD : 0;
}

void ooc_replay_op_end(CUstream s) {
    if (ooc_internal_op)
        return;
    pthread_mutex_lock(&rp_lock);
    if (!ooc_replay_on() || P.cur < 0) {
        pthread_mutex_unlock(&rp_lock);
        return;
    }
    const rp_op_t *ro = &P.ops[P.cur];
    if (ro->nact)
        ooc_mem_l_quiesce(); /* a drop adds a recipe, which fast-path ops look for */
    for (uint32_t k = ro->act_off; k < ro->act_off + ro->nact; k++) {
        const ooc_action_t *act = &P.pl->acts[k];
        const bind_t *x = &P.bind[act->buf];
        if (act->when != OOC_AFTER || !x->id)
            continue;
        if (act->kind == OOC_ACT_SWAPOUT)
            ooc_mem_l_swapout(x->addr, x->id, s);
        else if (act->kind == OOC_ACT_DROP)
            drop(k, x);
    }
    P.cur = -1;
    pthread_mutex_unlock(&rp_lock);
}

void ooc_replay_mark(void) {
    pthread_mutex_lock(&rp_lock);
    if (ooc_replay_on())
        __atomic_store_n(&P.marked, 1, __ATOMIC_RELAXED); /* read by ooc_replay_fast */
    pthread_mutex_unlock(&rp_lock);
}

/* One op of the shim's own, with no buffer: op.c's sequence less the recorder, as in
 * ooc_replay_before_free; with OOC_OWN_SETTLE, op_begin settles one pending recipe whatever it
 * touches, and the rebuild is issued on the legacy stream. Returns whether it may go on; *left
 * whether recipes remain. */
static int settle_one(int *left) {
    ooc_access_t *a = calloc(1, sizeof *a);
    if (!a)
        return 0;
    a->kind = OOC_OP_KERNEL;
    a->name = "ooc-unload";
    ooc_internal_op = OOC_OWN_SETTLE;
    int listed = 0;
    CUresult r = ooc_mem_op_pin(a, &listed);
    if (r == CUDA_SUCCESS) {
        op_begin(a, NULL, 0, NULL);
        r = ooc_mem_op_resident(NULL);
    }
    if (atomic_load_explicit(&ooc_replay_rebuilds, memory_order_relaxed))
        r = ooc_replay_op_ready(r, NULL);
    pthread_mutex_lock(&rp_lock);
    *left = ooc_replay_on() && P.rc.n > 0;
    pthread_mutex_unlock(&rp_lock);
    ooc_mem_end(a, NULL, r == CUDA_SUCCESS);
    ooc_internal_op = OOC_OWN_NONE;
    free(a);
    return r == CUDA_SUCCESS;
}

void ooc_replay_settle_all(void) {
    int left = ooc_replay_on();
    for (unsigned n = 0; left && n < 4096; n++)
        if (!settle_one(&left))
            break;
}

int ooc_replay_give_up_l(void) {
    pthread_mutex_lock(&rp_lock);
    int dropped = ooc_replay_on();
    if (dropped) {
        if (P.rc.n)
            OOC_LOG_E("%zu dropped buffers could not be rebuilt before a module was unloaded: the "
                      "operations that read them will see wrong bytes",
                      P.rc.n);
        ooc_mem_l_quiesce();
        clear();
        OOC_LOG_I("a module was unloaded: the plan is given up and the iteration recorded again");
    }
    pthread_mutex_unlock(&rp_lock);
    return dropped;
}

void ooc_replay_stop(void) {
    atomic_store(&ooc_rp_on, 0);
    ooc_mem_quiesce(); /* no fast-path op is still reading P */
    pthread_mutex_lock(&rp_lock);
    clear();
    recipes_clear(&Q);
    atomic_store(&ooc_replay_rebuilds, 0);
    pthread_mutex_unlock(&rp_lock);
}

/* Starts the worker, then replaying. Takes p and pl. */
void ooc_replay_go(ooc_profile_t *p, ooc_plan_t *pl, uint32_t pos) {
    if (ooc_mem_replay_init(p->h2d_bps) != 0) {
        OOC_LOG_E("no replay: the transfer streams or the worker thread could not be made; the "
                  "shim stays in demand mode");
        ooc_profile_free(p);
        ooc_plan_free(pl);
        return;
    }
    atomic_store(&ooc_rp_on, 0); /* a plan before this one: no fast-path op reads it now */
    ooc_mem_quiesce();
    pthread_mutex_lock(&rp_lock);
    if (start(p, pl, pos) != 0)
        OOC_LOG_E("no replay: out of memory");
    pthread_mutex_unlock(&rp_lock);
    ooc_mem_quiesce(); /* a fast-path op that saw replay off has ended: later ones see it on */
}
