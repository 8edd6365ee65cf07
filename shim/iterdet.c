/* SPDX-License-Identifier: MIT */
/* iterdet.c: finds the training iteration in the op stream, or takes it from the user's markers.
 *
 * Matching. Op a matches op b = a - P when their signatures and reference counts are equal and,
 * position by position, each pair of references is the same buffer (weights, optimizer state) or
 * two buffers of equal age a - alloc_op == b - alloc_op' of at most 2P ops: a per-iteration
 * temporary, allocated exactly P ops after its counterpart. Different layers' weights are
 * different buffers, so twelve identical layers or a per-parameter optimizer loop do not look
 * periodic even though their signatures repeat with a short period; only the whole iteration
 * does. (The brief bounded a temporary's age by P; 2P also accepts an input batch prefetched one
 * iteration ahead and the weights of a functional framework, which are re-allocated by each
 * update and live exactly one period.)
 *
 * Candidates. A period P is tracked as a candidate: its run is the number of consecutive ops, up
 * to the last one, that match the op P earlier. While searching, each op proposes candidates
 * from a table of recent occurrences of keys: the hashes of the signatures of the last k ops for
 * k = 1, 8, 64, 512, 4096 (rolling hashes) and (signature, buffer) for up to four references to
 * buffers allocated before op 0 or at least 4096 ops earlier (a young temporary's key would never
 * recur). Each key remembers the last three ops it occurred at; an occurrence at op m
 * proposes P = n - m, which joins the candidates only if op n matches op m, and is then extended
 * backwards (up to 4096 ops) to find where its periodic stretch began. A period shorter than
 * min_period (4) ops is never proposed, nor one whose run also repeats with a period p / q for a
 * prime q: a loop body (256 GEMMs on views of one buffer, one per attention head) repeats with
 * periods 1, 2, 3 ... at once, and none of them is an iteration. A repeated layer's keys
 * recur within the iteration; a rarer key (the input copy, the loss, a long window that contains
 * the iteration's seam, a weight used once per iteration) recurs one iteration later and proposes
 * the true period. Keys are sampled into levels (level j holds the keys with 2j trailing zero
 * bits, a 4^-j sample), so a key seen one long period ago is still there in some level while the
 * lower ones churn. At most 16 candidates are tracked, each at O(references) per op; a newcomer
 * replaces the one that matched least recently, and a candidate that has not matched for 64 ops is
 * dropped (a later occurrence proposes it again).
 *
 * Boundaries and warm-up. Periodicity alone does not say where an iteration starts. When a
 * candidate's run first covers a whole period, the boundary is placed where the fewest lifetimes
 * (allocation to last use) of per-iteration temporaries cross it, looking at the last two
 * periods: at a real iteration boundary almost nothing crosses (activations and gradients die
 * within their iteration); ties go to the start of the periodic stretch. The first counted
 * iteration is the first one at or after the start of the stretch that does not hold op 0 and does
 * not allocate a buffer that the next iteration references as the same buffer (lazily created
 * optimizer state).
 *
 * Reporting. A candidate qualifies when two counted iterations are complete and its stretch
 * covers min_span_ops ops. Among qualifying candidates the one whose stretch began earliest wins
 * (a sub-period lives inside one iteration, the true period has explained the stream since the
 * warm-up); ties go to the shortest period. That is FOUND; then every completed iteration is ITER.
 * While a period holds, each op costs one comparison, no proposal is made, and the other
 * candidates are still updated, so that one with an earlier stretch replaces a sub-period that was
 * found first (BROKEN and FOUND together). The first op that does not match the op a period
 * earlier ends the run (BROKEN); the period stays a candidate, so a stream that resumes it is
 * found again two iterations later. A short last batch changes signatures: BROKEN, and nothing
 * new unless that shape repeats.
 *
 * Markers. The first ooc_iterdet_mark switches to marker mode for good: boundaries come from the
 * markers only, consecutive marker iterations are compared op by op with the same rule, and the
 * same warm-up test applies (the ops before the first marker are never an iteration).
 * Limits and memory: iterdet.h. */
#include "iterdet.h"

#include <stdlib.h>
#include <string.h>

#define NCAND      16         /* candidate periods tracked at once */
#define NOCC       3          /* occurrences remembered per key */
#define NSCALES    5          /* signature windows: 1, 8, 64, 512, 4096 ops */
#define REF_KEYS   4          /* (signature, buffer) keys per op */
#define EXT_MAX    4096       /* how far a new candidate is extended backwards */
#define STALE      64         /* a candidate is dropped after this many ops without a match */
#define KEY_AGE    4096       /* references this old, or from before op 0, make keys */
#define LEVEL_MAX  (1u << 13) /* key-table entries per level */
#define LEVEL_MIN  (1u << 6)
#define LEVELS_MAX 12
#define OPS_INIT   1024    /* first capacity of the op ring */
#define REFS_INIT  4096    /* first capacity of the reference ring */
#define OPAQUE     0xffffu /* ref count of an op whose references were not kept */
#define HASH_BASE  0x9e3779b97f4a7c15ULL

static const int64_t scale_len[NSCALES] = {1, 8, 64, 512, 4096};

typedef struct op {
    uint64_t sig;
    uint64_t pos; /* position of its first reference in the ring << 16 | reference count */
} op_t;

typedef struct occ {
    uint64_t key;     /* 0: empty */
    int64_t at[NOCC]; /* most recent first; -1: none */
} occ_t;

typedef struct cand {
    int64_t period; /* 0: a free slot */
    int64_t run;    /* consecutive ops, up to the last one, that match the op a period earlier */
    int64_t last_match; /* the last op that matched */
    int64_t phase;      /* boundary residue (op index mod period), or -1 until run >= period */
    int64_t first;      /* first op of the first counted iteration, or -1 until phase is known */
    int first_ok;       /* first has passed the warm-up test */
} cand_t;

struct ooc_iterdet {
    int64_t max_period;
    int64_t min_span;
    int64_t min_period;
    uint64_t max_refs; /* a power of two */
    int64_t n;         /* ops fed */

    op_t *ops; /* ring; the last op is at ops[head], op m at head - (n - 1 - m), wrapped */
    int64_t ops_cap, head;
    ooc_iterdet_ref_t *refs; /* ring: reference r at refs[r & (refs_cap - 1)] */
    uint64_t refs_cap, refs_total;
    uint64_t refs_from; /* references before this one are gone */

    occ_t *occ; /* levels * level_n entries, two-way sets */
    unsigned levels;
    uint64_t level_n;

    uint64_t kh[NSCALES]; /* rolling hashes of the signature windows ending at the last op */
    uint64_t kpow[NSCALES];
    unsigned nscales;
    int kh_valid; /* kh describes the last op (not maintained while a period holds) */

    cand_t cand[NCAND];
    int lock;           /* the candidate slot whose run is reported, or -1 */
    int64_t lock_first; /* its first counted iteration */

    int marker;       /* marker mode */
    int64_t mk_count; /* markers seen at distinct positions */
    int64_t mk_start; /* position of the last marker: start of the current iteration */
    int64_t mk_prev;  /* length of the last complete iteration, 0 when none */
    int mk_cur_ok;    /* every op of the current iteration matched so far */
    int mk_valid;     /* the run below is in force */
    int64_t mk_first; /* the run */
    int64_t mk_iters;
    int64_t mk_period;

    size_t mem;
};

/* ---- small helpers ------------------------------------------------------------------------- */

static uint64_t mix64(uint64_t x) {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    x ^= x >> 31;
    return x;
}

/* x mod m for m > 0, in [0, m) also for negative x. */
static int64_t pmod(int64_t x, int64_t m) {
    int64_t r = x % m;
    return r < 0 ? r + m : r;
}

static uint64_t pow2_at_least(uint64_t x) {
    uint64_t p = 1;
    while (p < x)
        p <<= 1;
    return p;
}

static const op_t *op_at(const ooc_iterdet_t *d, int64_t m) {
    int64_t i = d->head - (d->n - 1 - m); /* no division: the launch path pays for this */
    return &d->ops[i < 0 ? i + d->ops_cap : i];
}

/* Whether op m is still in the op ring. */
static int have_op(const ooc_iterdet_t *d, int64_t m) {
    return m >= 0 && m < d->n && d->n - m <= d->ops_cap;
}

static unsigned op_nrefs(const op_t *o) {
    return (unsigned)(o->pos & 0xffffu);
}

static uint64_t op_begin(const op_t *o) {
    return o->pos >> 16;
}

/* Whether the references of an op that is in the ring are still in the reference ring. */
static int have_refs(const ooc_iterdet_t *d, const op_t *o) {
    return op_nrefs(o) != OPAQUE && op_begin(o) >= d->refs_from;
}

static const ooc_iterdet_ref_t *ref_at(const ooc_iterdet_t *d, uint64_t r) {
    return &d->refs[r & (d->refs_cap - 1)];
}

/* Whether op a matches op b = a - P (the rule in the file comment). Both must be in the ring. */
static int same_op(const ooc_iterdet_t *d, int64_t a, int64_t b) {
    const op_t *x = op_at(d, a), *y = op_at(d, b);
    if (x->sig != y->sig || op_nrefs(x) != op_nrefs(y))
        return 0;
    unsigned k = op_nrefs(x);
    if (k == 0)
        return 1;
    if (!have_refs(d, y)) /* x is newer: its references are there when y's are */
        return 0;
    int64_t p = a - b;
    uint64_t bx = op_begin(x), by = op_begin(y);
    for (unsigned i = 0; i < k; i++) {
        const ooc_iterdet_ref_t *rx = ref_at(d, bx + i), *ry = ref_at(d, by + i);
        if (rx->id == ry->id)
            continue;
        if (rx->alloc_op < 0 || ry->alloc_op < 0)
            return 0;
        int64_t age = b - ry->alloc_op;
        if (a - rx->alloc_op != age || age > 2 * p)
            return 0;
    }
    return 1;
}

/* Whether op a is in the ring with its references, and matches the op p earlier. */
static int matches(const ooc_iterdet_t *d, int64_t a, int64_t p) {
    return have_op(d, a - p) && have_op(d, a) && same_op(d, a, a - p);
}

/* ---- history ------------------------------------------------------------------------------- */

static void *mem_alloc(ooc_iterdet_t *d, size_t bytes) {
    void *p = malloc(bytes);
    if (p)
        d->mem += bytes;
    return p;
}

static void mem_free(ooc_iterdet_t *d, void *p, size_t bytes) {
    if (p) {
        free(p);
        d->mem -= bytes;
    }
}

/* Doubles the op ring (up to max_period + 1 ops), keeping every op it holds. Returns 0 or
 * OOC_ENOMEM (the ring is unchanged). */
static int grow_ops(ooc_iterdet_t *d) {
    int64_t cap = d->ops_cap * 2;
    if (cap > d->max_period + 1)
        cap = d->max_period + 1;
    op_t *o = mem_alloc(d, (size_t)cap * sizeof *o);
    if (!o)
        return OOC_ENOMEM;
    int64_t from = d->n > d->ops_cap ? d->n - d->ops_cap : 0;
    for (int64_t m = from; m < d->n; m++)
        o[m - from] = *op_at(d, m);
    mem_free(d, d->ops, (size_t)d->ops_cap * sizeof *d->ops);
    d->ops = o;
    d->ops_cap = cap;
    d->head = d->n - from > 0 ? d->n - from - 1 : cap - 1;
    return 0;
}

/* Grows the reference ring to hold at least `need` references (a power of two up to max_refs),
 * keeping references [keep, refs_total). Returns 0 or OOC_ENOMEM (the ring is unchanged). */
static int grow_refs(ooc_iterdet_t *d, uint64_t need, uint64_t keep) {
    uint64_t cap = pow2_at_least(need);
    if (cap > d->max_refs)
        cap = d->max_refs;
    if (cap <= d->refs_cap)
        return 0;
    ooc_iterdet_ref_t *r = mem_alloc(d, (size_t)cap * sizeof *r);
    if (!r)
        return OOC_ENOMEM;
    for (uint64_t i = keep; i < d->refs_total; i++)
        r[i & (cap - 1)] = d->refs[i & (d->refs_cap - 1)];
    mem_free(d, d->refs, (size_t)d->refs_cap * sizeof *d->refs);
    d->refs = r;
    d->refs_cap = cap;
    d->refs_from = keep;
    return 0;
}

/* Appends op n = d->n to the history, growing the rings while they are below their bounds.
 * Returns 0, or OOC_ENOMEM when a ring could not grow (the op is stored all the same; the
 * oldest ops or references are overwritten). */
static int append(ooc_iterdet_t *d, uint64_t sig, const ooc_iterdet_ref_t *refs, unsigned k) {
    int rc = 0;
    int64_t a = d->n;
    if (a >= d->ops_cap && d->ops_cap < d->max_period + 1)
        rc = grow_ops(d);

    /* References still needed: those of the oldest op that stays in the op ring. */
    int64_t oldest = a + 1 - d->ops_cap;
    uint64_t keep = d->refs_total;
    if (oldest < 0)
        oldest = 0;
    if (oldest < a)
        keep = op_begin(op_at(d, oldest));
    if (keep < d->refs_from)
        keep = d->refs_from; /* already overwritten */
    uint64_t need = d->refs_total + k - keep;
    if (need > d->refs_cap && d->refs_cap < d->max_refs && grow_refs(d, need, keep) != 0)
        rc = OOC_ENOMEM;

    d->head = d->head + 1 == d->ops_cap ? 0 : d->head + 1;
    op_t *o = &d->ops[d->head];
    o->sig = sig;
    if (k > d->refs_cap) {
        o->pos = d->refs_total << 16 | OPAQUE;
    } else {
        o->pos = d->refs_total << 16 | k;
        for (unsigned i = 0; i < k; i++)
            d->refs[(d->refs_total + i) & (d->refs_cap - 1)] = refs[i];
        d->refs_total += k;
        if (d->refs_total - d->refs_from > d->refs_cap)
            d->refs_from = d->refs_total - d->refs_cap;
    }
    d->n = a + 1;
    return rc;
}

/* ---- candidate proposals ------------------------------------------------------------------- */

static uint64_t sig_term(const ooc_iterdet_t *d, int64_t m) {
    return have_op(d, m) ? mix64(op_at(d, m)->sig) : 0;
}

/* Brings the rolling signature hashes up to the last op: one step when they were current before
 * it, else recomputed from the history. */
static void update_windows(ooc_iterdet_t *d) {
    int64_t a = d->n - 1;
    uint64_t x = sig_term(d, a);
    for (unsigned s = 0; s < d->nscales; s++) {
        int64_t k = scale_len[s];
        if (d->kh_valid) {
            d->kh[s] = d->kh[s] * HASH_BASE + x - sig_term(d, a - k) * d->kpow[s];
        } else {
            uint64_t h = 0;
            for (int64_t m = a - k + 1; m <= a; m++)
                h = h * HASH_BASE + sig_term(d, m);
            d->kh[s] = h;
        }
    }
    d->kh_valid = 1;
}

/* The level of a key: two trailing zero bits per level. */
static unsigned key_level(const ooc_iterdet_t *d, uint64_t key) {
    unsigned l = (unsigned)__builtin_ctzll(key | (1ULL << 62)) / 2;
    return l < d->levels ? l : d->levels - 1;
}

/* Records that key occurred at op a in level l, first appending to p[*np] (up to cap) the
 * periods its earlier occurrences propose. */
static void occur(ooc_iterdet_t *d, unsigned l, uint64_t key, int64_t a, int64_t *p, unsigned *np,
                  unsigned cap) {
    occ_t *set = &d->occ[l * d->level_n + ((key >> 24) & (d->level_n - 2))];
    occ_t *e = set[0].key == key ? &set[0] : set[1].key == key ? &set[1] : NULL;
    if (!e) {
        e = set[0].at[0] <= set[1].at[0] ? &set[0] : &set[1];
        e->key = key;
        for (unsigned i = 0; i < NOCC; i++)
            e->at[i] = -1;
    }
    for (unsigned i = 0; i < NOCC && e->at[i] >= 0; i++) {
        int64_t per = a - e->at[i];
        unsigned j = 0;
        while (j < *np && p[j] != per)
            j++;
        if (j == *np && *np < cap)
            p[(*np)++] = per;
    }
    for (unsigned i = NOCC - 1; i > 0; i--)
        e->at[i] = e->at[i - 1];
    e->at[0] = a;
}

static int find_cand(const ooc_iterdet_t *d, int64_t per) {
    for (int i = 0; i < NCAND; i++)
        if (d->cand[i].period == per)
            return i;
    return -1;
}

static void reset_cand(cand_t *c) {
    c->run = 0;
    c->phase = -1;
    c->first = -1;
    c->first_ok = 0;
}

/* A set of buffer ids for pick_phase: open addressing, never full (twice the ids it may hold). */
typedef struct idset {
    uint64_t *id;
    unsigned char *used;
    uint64_t mask;
} idset_t;

/* Adds id; returns 1 when it was new. */
static int idset_add(idset_t *s, uint64_t id) {
    uint64_t i = mix64(id) & s->mask;
    while (s->used[i]) {
        if (s->id[i] == id)
            return 0;
        i = (i + 1) & s->mask;
    }
    s->used[i] = 1;
    s->id[i] = id;
    return 1;
}

/* The boundary residue for period p after op a (whose last 2p ops are periodic): the residue
 * crossed by the fewest lifetimes of per-iteration temporaries, scanning from the residue of s0
 * (the start of the periodic stretch) so that ties go to it. One instance of each temporary is
 * counted: those allocated in [a - 2p + 1, a - p], whose whole life (shorter than p; longer ones
 * cross every residue alike) lies in the last 2p ops. A buffer allocated between ops q - 1 and q
 * belongs to the iteration that starts at q, so a life from alloc_op to its last use u crosses
 * the boundary before op q when alloc_op + 2 <= q <= u. Without memory for the work, the residue
 * of s0. */
static int64_t pick_phase(ooc_iterdet_t *d, int64_t a, int64_t p, int64_t s0) {
    int64_t lo = a - 2 * p + 1, best = pmod(s0, p);
    uint64_t nref = 0;
    for (int64_t u = lo; u <= a; u++)
        if (have_op(d, u) && have_refs(d, op_at(d, u)))
            nref += op_nrefs(op_at(d, u));
    idset_t set = {0};
    set.mask = pow2_at_least(2 * nref + 2) - 1;
    int64_t *cnt = calloc((size_t)p + 1, sizeof *cnt);
    set.id = malloc((set.mask + 1) * sizeof *set.id);
    set.used = calloc(set.mask + 1, 1);
    if (!cnt || !set.id || !set.used)
        goto out;
    for (int64_t u = a; u >= lo; u--) { /* backwards: the first sighting is the last use */
        if (!have_op(d, u) || !have_refs(d, op_at(d, u)))
            continue;
        const op_t *o = op_at(d, u);
        for (unsigned i = 0; i < op_nrefs(o); i++) {
            const ooc_iterdet_ref_t *r = ref_at(d, op_begin(o) + i);
            if (r->alloc_op < lo || r->alloc_op > a - p || !idset_add(&set, r->id))
                continue;
            int64_t len = u - r->alloc_op - 1; /* boundaries q in [alloc_op + 2, u] */
            if (len < 1 || len >= p)
                continue;
            int64_t st = pmod(r->alloc_op + 2, p), en = st + len;
            cnt[st]++;
            if (en <= p) {
                cnt[en]--;
            } else {
                cnt[p]--;
                cnt[0]++;
                cnt[en - p]--;
            }
        }
    }
    for (int64_t q = 1; q < p; q++)
        cnt[q] += cnt[q - 1];
    int64_t r0 = best;
    for (int64_t i = 1; i < p; i++) {
        int64_t q = (r0 + i) % p;
        if (cnt[q] < cnt[best])
            best = q;
    }
out:
    free(cnt);
    free(set.id);
    free(set.used);
    return best;
}

/* Whether the iteration [b, b + p) allocated a buffer that the next iteration references, at the
 * same place, as the same buffer: state created lazily by a warm-up iteration. Ops that have
 * left the history are skipped. */
static int allocates_state(const ooc_iterdet_t *d, int64_t b, int64_t p) {
    for (int64_t m = b + p; m < b + 2 * p; m++) {
        if (!have_op(d, m) || !have_op(d, m - p))
            continue;
        const op_t *x = op_at(d, m), *y = op_at(d, m - p);
        unsigned k = op_nrefs(x);
        if (k != op_nrefs(y) || !have_refs(d, y))
            continue;
        for (unsigned i = 0; i < k; i++) {
            const ooc_iterdet_ref_t *rx = ref_at(d, op_begin(x) + i);
            const ooc_iterdet_ref_t *ry = ref_at(d, op_begin(y) + i);
            if (rx->id == ry->id && rx->alloc_op >= b - 1 && rx->alloc_op <= b + p - 2)
                return 1;
        }
    }
    return 0;
}

/* First op of candidate c's periodic stretch, as of op a. */
static int64_t stretch_start(const cand_t *c, int64_t a) {
    return a - c->run - c->period + 1;
}

/* Brings candidate c's boundary and first counted iteration up to op a. */
static void settle(ooc_iterdet_t *d, cand_t *c, int64_t a) {
    int64_t p = c->period;
    if (c->run < p)
        return;
    int64_t s0 = stretch_start(c, a);
    if (c->phase < 0)
        c->phase = pick_phase(d, a, p, s0);
    if (c->first < 0) {
        int64_t lo = s0 > 1 ? s0 : 1;
        c->first = lo + pmod(c->phase - lo, p);
        c->first_ok = 0;
    }
    while (!c->first_ok && c->first + 2 * p <= a + 1) {
        if (allocates_state(d, c->first, p))
            c->first += p;
        else
            c->first_ok = 1;
    }
}

/* Whether candidate c may be reported at op a: two counted iterations complete, a long enough
 * stretch. */
static int qualifies(const ooc_iterdet_t *d, const cand_t *c, int64_t a) {
    if (c->period == 0 || !c->first_ok || c->first + 2 * c->period > a + 1)
        return 0;
    return a + 1 - stretch_start(c, a) >= d->min_span;
}

/* Whether the run ops up to op a, which repeat with period p, also repeat with period p / q for
 * a prime q: p is then turns of a loop body. Proposed again later, p may have a longer run. */
static int repeats_shorter(const ooc_iterdet_t *d, int64_t p, int64_t a, int64_t run) {
    for (int64_t q = 2, rest = p; rest > 1; q = q * q > rest ? rest : q + 1) {
        if (rest % q != 0)
            continue;
        while (rest % q == 0)
            rest /= q; /* q: a prime factor of p */
        int64_t k = 0;
        while (k < run && matches(d, a - k, p / q))
            k++;
        if (k == run)
            return 1;
    }
    return 0;
}

/* Makes period p a candidate at op a (which matches the op p earlier): extends its run backwards
 * and takes a free slot, or the slot of the candidate that matched least recently (then with the
 * shorter run) when that one is worse than the newcomer. */
static void add_cand(ooc_iterdet_t *d, int64_t p, int64_t a) {
    if (p < d->min_period)
        return;
    int64_t run = 1;
    while (run < EXT_MAX && matches(d, a - run, p))
        run++;
    if (run < 2) /* a lone match is common; a period proposed by its first op comes back */
        return;
    if (repeats_shorter(d, p, a, run))
        return;
    int v = -1;
    for (int i = 0; i < NCAND; i++) {
        const cand_t *c = &d->cand[i];
        if (c->period == 0) {
            v = i;
            break;
        }
        if (v < 0 || c->last_match < d->cand[v].last_match ||
            (c->last_match == d->cand[v].last_match && c->run < d->cand[v].run))
            v = i;
    }
    cand_t *c = &d->cand[v];
    if (c->period != 0 && (c->last_match > a || (c->last_match == a && c->run >= run)))
        return;
    c->period = p;
    reset_cand(c);
    c->run = run;
    c->last_match = a;
    settle(d, c, a);
}

/* Proposes candidates from the keys of op a (the last op). */
static void propose(ooc_iterdet_t *d, int64_t a) {
    int64_t p[NOCC * (NSCALES + REF_KEYS) * 2];
    unsigned np = 0;
    const op_t *o = op_at(d, a);

    update_windows(d);
    uint64_t keys[NSCALES + REF_KEYS];
    unsigned nk = 0;
    for (unsigned s = 0; s < d->nscales; s++)
        keys[nk++] = mix64(d->kh[s] ^ (uint64_t)scale_len[s] * 0x632be59bd9b4e019ULL);
    unsigned k = op_nrefs(o);
    for (unsigned i = 0; k != OPAQUE && i < k && nk < OOC_ARRAY_SIZE(keys); i++) {
        const ooc_iterdet_ref_t *r = ref_at(d, op_begin(o) + i);
        if (r->alloc_op < 0 || a - r->alloc_op >= KEY_AGE) /* a temporary's key never recurs */
            keys[nk++] = mix64(o->sig * 0xd6e8feb86659fd93ULL ^ mix64(r->id));
    }
    for (unsigned i = 0; i < nk; i++) {
        uint64_t key = keys[i] ? keys[i] : 1;
        unsigned top = key_level(d, key);
        for (unsigned l = 0; l <= top; l++)
            occur(d, l, key, a, p, &np, OOC_ARRAY_SIZE(p));
    }

    int64_t held[NCAND]; /* periods that hold: their multiples add nothing */
    unsigned nheld = 0;
    for (int j = 0; j < NCAND; j++) {
        const cand_t *c = &d->cand[j];
        if (c->period && c->last_match == a && c->run >= c->period)
            held[nheld++] = c->period;
    }
    for (unsigned i = 0; i < np; i++) {
        int64_t per = p[i];
        if (per < 1 || per > d->max_period || find_cand(d, per) >= 0)
            continue;
        unsigned j = 0;
        while (j < nheld && per % held[j] != 0)
            j++;
        if (j == nheld && matches(d, a, per))
            add_cand(d, per, a);
    }
}

/* ---- events -------------------------------------------------------------------------------- */

static void ev_clear(ooc_iterdet_event_t *ev) {
    memset(ev, 0, sizeof *ev);
    ev->first_op = -1;
    ev->last_op = -1;
    ev->broken_op = -1;
}

/* Fills the state fields of ev (not flags, not broken_*). */
static void ev_state(const ooc_iterdet_t *d, ooc_iterdet_event_t *ev) {
    ev->source = OOC_ITERDET_NONE;
    ev->confirmed = 0;
    ev->period = 0;
    ev->first_op = -1;
    ev->iters = 0;
    ev->last_op = -1;
    if (d->marker) {
        ev->source = OOC_ITERDET_MARKER;
        if (!d->mk_valid)
            return;
        ev->period = d->mk_period;
        ev->first_op = d->mk_first;
        ev->iters = d->mk_iters;
    } else if (d->lock >= 0) {
        ev->source = OOC_ITERDET_DETECTED;
        ev->period = d->cand[d->lock].period;
        ev->first_op = d->lock_first;
        ev->iters = (d->n - d->lock_first) / ev->period;
        if (ev->iters == 0)
            return; /* not reachable: a run is reported with two iterations */
    } else {
        return;
    }
    ev->confirmed = ev->iters >= 2;
    ev->last_op = ev->first_op + (ev->iters - 1) * ev->period;
}

static void broken(ooc_iterdet_event_t *ev, int64_t at, int64_t period) {
    ev->flags |= OOC_ITERDET_BROKEN;
    ev->broken_op = at;
    ev->broken_period = period;
}

/* ---- detection ----------------------------------------------------------------------------- */

static void detect(ooc_iterdet_t *d, int64_t a, ooc_iterdet_event_t *ev) {
    int broke = 0;
    for (int i = 0; i < NCAND; i++) {
        cand_t *c = &d->cand[i];
        if (c->period == 0)
            continue;
        if (matches(d, a, c->period)) {
            c->run++;
            c->last_match = a;
            settle(d, c, a);
            continue;
        }
        reset_cand(c);
        if (i == d->lock)
            broke = 1;
        else if (a - c->last_match > STALE)
            c->period = 0;
    }
    if (broke) {
        broken(ev, a, d->cand[d->lock].period);
        d->lock = -1;
    }
    if (d->lock < 0)
        propose(d, a);
    else
        d->kh_valid = 0;

    int best = -1;
    for (int i = 0; i < NCAND; i++) {
        const cand_t *c = &d->cand[i];
        if (!qualifies(d, c, a))
            continue;
        if (best < 0) {
            best = i;
            continue;
        }
        int64_t s = stretch_start(c, a), sb = stretch_start(&d->cand[best], a);
        if (s < sb || (s == sb && c->period < d->cand[best].period))
            best = i;
    }
    if (best >= 0 && best != d->lock) {
        const cand_t *b = &d->cand[best];
        if (d->lock >= 0) {
            const cand_t *l = &d->cand[d->lock];
            if (stretch_start(b, a) >= stretch_start(l, a))
                best = -1;
            else
                broken(ev, a, l->period);
        }
        if (best >= 0) {
            d->lock = best;
            d->lock_first = b->first;
            d->kh_valid = 0;
            ev->flags |= OOC_ITERDET_FOUND;
        }
    }
    if (d->lock >= 0 && (a + 1 - d->lock_first) % d->cand[d->lock].period == 0)
        ev->flags |= OOC_ITERDET_ITER;
}

/* ---- markers ------------------------------------------------------------------------------- */

static void marker_op(ooc_iterdet_t *d, int64_t a, ooc_iterdet_event_t *ev) {
    if (d->mk_prev == 0 || !d->mk_cur_ok)
        return;
    if (a - d->mk_start < d->mk_prev && matches(d, a, d->mk_prev))
        return;
    d->mk_cur_ok = 0;
    if (d->mk_valid && d->mk_iters >= 2) {
        broken(ev, a, d->mk_period);
        d->mk_valid = 0;
    }
}

/* ---- public -------------------------------------------------------------------------------- */

int ooc_iterdet_new(const ooc_iterdet_opts_t *o, ooc_iterdet_t **out) {
    static const ooc_iterdet_opts_t none;
    if (!out)
        return OOC_EINVAL;
    *out = NULL;
    if (!o)
        o = &none;
    if (o->max_period < 0 || o->max_refs < 0 || o->min_span_ops < 0 || o->min_period < 0)
        return OOC_EINVAL;
    if (o->max_period > OOC_ITERDET_MAX_PERIOD_LIMIT || o->max_refs > OOC_ITERDET_MAX_REFS_LIMIT)
        return OOC_ERANGE;

    ooc_iterdet_t *d = calloc(1, sizeof *d);
    if (!d)
        return OOC_ENOMEM;
    d->mem = sizeof *d;
    d->max_period = o->max_period ? o->max_period : OOC_ITERDET_MAX_PERIOD_DEFAULT;
    d->min_span = o->min_span_ops ? o->min_span_ops : OOC_ITERDET_MIN_SPAN_DEFAULT;
    d->min_period = o->min_period ? o->min_period : OOC_ITERDET_MIN_PERIOD_DEFAULT;
    d->max_refs = pow2_at_least(o->max_refs ? (uint64_t)o->max_refs : 4 * (uint64_t)d->max_period);
    d->lock = -1;

    /* Enough levels that the sparsest one keeps a key of every op for a whole longest period:
     * ops * keys per op / 4^level fits in a level. */
    d->level_n = pow2_at_least(4 * (uint64_t)d->max_period);
    if (d->level_n > LEVEL_MAX)
        d->level_n = LEVEL_MAX;
    if (d->level_n < LEVEL_MIN)
        d->level_n = LEVEL_MIN;
    d->levels = 1;
    while (d->levels < LEVELS_MAX &&
           (d->level_n << (2 * (d->levels - 1))) < 4 * (uint64_t)d->max_period)
        d->levels++;
    for (unsigned s = 0; s < NSCALES && scale_len[s] <= d->max_period; s++) {
        uint64_t pw = 1;
        for (int64_t i = 0; i < scale_len[s]; i++)
            pw *= HASH_BASE;
        d->kpow[s] = pw;
        d->nscales = s + 1;
    }

    d->ops_cap = OPS_INIT < d->max_period + 1 ? OPS_INIT : d->max_period + 1;
    d->head = d->ops_cap - 1;
    d->refs_cap = REFS_INIT < d->max_refs ? REFS_INIT : d->max_refs;
    size_t occ_n = (size_t)d->levels * d->level_n;
    d->ops = mem_alloc(d, (size_t)d->ops_cap * sizeof *d->ops);
    d->refs = mem_alloc(d, (size_t)d->refs_cap * sizeof *d->refs);
    d->occ = mem_alloc(d, occ_n * sizeof *d->occ);
    if (!d->ops || !d->refs || !d->occ) {
        ooc_iterdet_free(d);
        return OOC_ENOMEM;
    }
    for (size_t i = 0; i < occ_n; i++) {
        d->occ[i].key = 0;
        for (unsigned j = 0; j < NOCC; j++)
            d->occ[i].at[j] = -1;
    }
    *out = d;
    return 0;
}

void ooc_iterdet_free(ooc_iterdet_t *d) {
    if (!d)
        return;
    free(d->ops);
    free(d->refs);
    free(d->occ);
    free(d);
}

int ooc_iterdet_op(ooc_iterdet_t *d, uint64_t sig, const ooc_iterdet_ref_t *refs, unsigned n,
                   ooc_iterdet_event_t *ev) {
    ooc_iterdet_event_t local;
    if (!ev)
        ev = &local;
    ev_clear(ev);
    if (!d)
        return OOC_EINVAL;
    int rc = 0;
    if (n > 0 && !refs)
        rc = OOC_EINVAL;
    else if (n > OOC_ITERDET_MAX_OP_REFS)
        rc = OOC_ERANGE;
    for (unsigned i = 0; rc == 0 && i < n; i++)
        if (refs[i].alloc_op >= d->n)
            rc = OOC_EINVAL;
    if (rc != 0) {
        ev_state(d, ev);
        return rc;
    }

    int64_t a = d->n;
    rc = append(d, sig, refs, n);
    if (d->marker)
        marker_op(d, a, ev);
    else
        detect(d, a, ev);
    ev_state(d, ev);
    return rc;
}

int ooc_iterdet_mark(ooc_iterdet_t *d, ooc_iterdet_event_t *ev) {
    ooc_iterdet_event_t local;
    if (!ev)
        ev = &local;
    ev_clear(ev);
    if (!d)
        return OOC_EINVAL;
    int64_t pos = d->n;
    if (!d->marker) {
        if (d->lock >= 0)
            broken(ev, pos, d->cand[d->lock].period);
        d->marker = 1;
        d->lock = -1;
        memset(d->cand, 0, sizeof d->cand);
    }
    if (d->mk_count > 0 && pos == d->mk_start) {
        ev_state(d, ev);
        return 0;
    }
    if (d->mk_count++ > 0 && d->mk_start > 0) { /* an iteration from op 0 is the warm-up */
        int64_t len = pos - d->mk_start;
        int same = d->mk_prev == len && d->mk_cur_ok;
        if (same && allocates_state(d, d->mk_start - len, len))
            same = 0; /* the previous iteration was a warm-up */
        if (same) {
            d->mk_iters++;
        } else {
            if (d->mk_valid && d->mk_iters >= 2)
                broken(ev, pos, d->mk_period);
            d->mk_first = d->mk_start;
            d->mk_iters = 1;
        }
        d->mk_period = len;
        d->mk_valid = 1;
        ev->flags |= OOC_ITERDET_ITER;
        if (same && d->mk_iters == 2)
            ev->flags |= OOC_ITERDET_FOUND;
        d->mk_prev = len;
    }
    d->mk_start = pos;
    d->mk_cur_ok = 1;
    ev_state(d, ev);
    return 0;
}

int ooc_iterdet_state(const ooc_iterdet_t *d, ooc_iterdet_event_t *ev) {
    if (!d || !ev)
        return OOC_EINVAL;
    ev_clear(ev);
    ev_state(d, ev);
    return 0;
}

int64_t ooc_iterdet_ops(const ooc_iterdet_t *d) {
    return d ? d->n : 0;
}

size_t ooc_iterdet_mem_bytes(const ooc_iterdet_t *d) {
    return d ? d->mem : 0;
}

size_t ooc_iterdet_mem_limit(const ooc_iterdet_t *d) {
    if (!d)
        return 0;
    return sizeof *d + (size_t)(d->max_period + 1) * sizeof(op_t) +
           (size_t)d->max_refs * sizeof(ooc_iterdet_ref_t) +
           (size_t)d->levels * d->level_n * sizeof(occ_t);
}
