/* SPDX-License-Identifier: MIT */
/* recompute.c: producers verified by checksum while recording, and launches saved to be issued
 * again when replaying.
 *
 * Verification (OOC_MODE=record and auto, while recording): around each kernel launch
 * (launch_op in hooks.c) the buffers the launch references are checksummed before and after it;
 * what is learnt is filed under the kind of launch (its function, shape, scalar parameters and
 * buffer sizes: the key). A buffer that no launch of the kind changed is one it only reads (a
 * change in any one makes it a write). For each buffer a launch is the first to use since its
 * allocation, once VERIFY_OBS launches of its kind were seen to change no other buffer, the
 * launch is issued again, twice, with that buffer's pointer words replaced by a scratch buffer
 * filled first with 0x00, then with 0xff: when both re-launches give the buffer's checksum, the
 * launch rewrites all of the buffer without reading it and reproduces its bytes (a launch that
 * reads its output, or whose result changes from one launch to the next, as with floating-point
 * atomics, fails). A re-launch happens only when the launch changes nothing else, so it never
 * touches the program's data. The recorder writes a verified launch as the buffer's producer
 * (profiles/FORMAT.md) when no later op changes the buffer. Copies and memsets are not
 * verified. Each launch is checksummed: recording is slower (once).
 *
 * All of this work is the shim's own: it runs through ooc_mem_begin/ooc_mem_end, on the launch's
 * stream, as an op that is neither recorded nor matched against a plan (ooc_internal_op), with
 * the scratch and result buffers allocated in the pool under the budget (ooc_mem_alloc_own: in
 * slab chunks of their own, so that the program's buffers lie as they would without recording).
 * Limits: a buffer of more than VERIFY_MAX_BYTES, or a launch whose buffers (in the chunks they
 * span) and scratch together exceed the budget, is not verified; once VERIFY_TOTAL_BYTES have been
 * checksummed in a recording, nothing more is. Each check waits for the launch's stream.
 *
 * The checksum kernel (shim/checksum.cu) is loaded once: first as the simulated device's module
 * "FAKECUDA-MODULE:ooc_checksum", then, on a real driver, from the PTX the Makefile embedded.
 * Without either (no nvcc at build time), verification is off and says so once.
 *
 * Locking: vf_lock guards the table of keys; the launches themselves run outside it. */
#include "grow.h"
#include "shim.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#define uthash_nonfatal_oom(obj) (vf_oom = 1)
static int vf_oom;
#include <uthash.h>

#define VERIFY_MAX_BYTES   ((uint64_t)1 << 30)  /* larger buffers are not verified */
#define VERIFY_TOTAL_BYTES ((uint64_t)64 << 30) /* bytes checksummed per recording, at most */
#define CK_BLOCK           256
#define VERIFY_OBS         2 /* launches of a kind seen not to change a buffer before it counts as read */

extern const char ooc_checksum_ptx[];

_Thread_local const ooc_launch_t *ooc_launch_now;
_Thread_local int ooc_internal_op;

/* ---- saved launches -------------------------------------------------------------------------- */

int ooc_launch_save(const ooc_launch_t *l, ooc_saved_launch_t *s) {
    s->fn = l->fn;
    memcpy(s->grid, l->grid, sizeof s->grid);
    memcpy(s->block, l->block, sizeof s->block);
    s->shared = l->shared;
    s->kind = l->kind;
    s->nbytes = 0;
    s->nparams = 0;
    s->packed = 0;
    if (l->kind == OOC_LAUNCH_KERNEL_EX) {
        if (!l->cfg || l->cfg->numAttrs > 8)
            return -1;
        s->cfg = *l->cfg;
        if (l->cfg->numAttrs)
            memcpy(s->attrs, l->cfg->attrs, l->cfg->numAttrs * sizeof *s->attrs);
        s->cfg.attrs = s->attrs;
    }
    if (l->extra) {
        const void *buf = NULL;
        const size_t *size = NULL;
        for (size_t i = 0; i < 16 && l->extra[i] != CU_LAUNCH_PARAM_END; i += 2) {
            if (l->extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER)
                buf = l->extra[i + 1];
            else if (l->extra[i] == CU_LAUNCH_PARAM_BUFFER_SIZE)
                size = l->extra[i + 1];
        }
        if (!buf || !size || grow(&s->bytes, &s->cap, *size ? *size : 1, 1) != 0)
            return -1;
        memcpy(s->bytes, buf, *size);
        s->nbytes = *size;
        s->packed = 1;
        return 0;
    }
    unsigned n = 0;
    const uint32_t *off = NULL, *size = NULL;
    if (l->params && ooc_launch_layout(l->fn, &n, &off, &size) != 0)
        return -1;
    size_t total = 0;
    for (unsigned i = 0; i < n; i++)
        if (off[i] + size[i] > total)
            total = off[i] + size[i];
    if (grow(&s->bytes, &s->cap, total ? total : 1, 1) != 0 ||
        grow(&s->ptrs, &s->cap_ptrs, n ? n : 1, sizeof *s->ptrs) != 0)
        return -1;
    /* The gaps between parameters are zero, not whatever the buffer held: the bytes are hashed
     * into the launch's key (launch_key) and compared. */
    memset(s->bytes, 0, total);
    for (unsigned i = 0; i < n; i++) {
        if (!l->params[i])
            return -1;
        memcpy(s->bytes + off[i], l->params[i], size[i]);
        s->ptrs[i] = s->bytes + off[i];
    }
    s->off = (uint32_t *)off;
    s->size = (uint32_t *)size;
    s->nparams = n;
    s->nbytes = total;
    return 0;
}

/* Replaces the word at p when it falls in [from, from + bytes). */
static unsigned subst_word(unsigned char *p, uintptr_t from, uint64_t bytes, uintptr_t to) {
    uint64_t w;
    memcpy(&w, p, 8);
    if (w < from || w - from >= bytes)
        return 0;
    w = to + (w - from);
    memcpy(p, &w, 8);
    return 1;
}

unsigned ooc_launch_subst(ooc_saved_launch_t *s, uintptr_t from, uint64_t bytes, uintptr_t to) {
    unsigned k = 0;
    if (s->packed) {
        for (size_t o = 0; o + 8 <= s->nbytes; o += 8)
            k += subst_word(s->bytes + o, from, bytes, to);
        return k;
    }
    for (unsigned i = 0; i < s->nparams; i++)
        for (uint32_t o = 0; s->size[i] >= 8 && o + 8 <= s->size[i]; o += 8)
            k += subst_word(s->bytes + s->off[i] + o, from, bytes, to);
    return k;
}

CUresult ooc_launch_issue(const ooc_saved_launch_t *s, CUstream st) {
    size_t nbytes = s->nbytes;
    void *extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, s->bytes, CU_LAUNCH_PARAM_BUFFER_SIZE, &nbytes,
                     CU_LAUNCH_PARAM_END};
    void **params = s->packed ? NULL : s->ptrs;
    void **ex = s->packed ? extra : NULL;
    switch (s->kind) {
    case OOC_LAUNCH_KERNEL_EX: {
        CUlaunchConfig cfg = s->cfg;
        cfg.hStream = st;
        return ooc_real.cuLaunchKernelEx(&cfg, s->fn, params, ex);
    }
    case OOC_LAUNCH_COOPERATIVE:
        return ooc_real.cuLaunchCooperativeKernel(s->fn, s->grid[0], s->grid[1], s->grid[2],
                                                  s->block[0], s->block[1], s->block[2], s->shared,
                                                  st, params);
    default:
        return ooc_real.cuLaunchKernel(s->fn, s->grid[0], s->grid[1], s->grid[2], s->block[0],
                                       s->block[1], s->block[2], s->shared, st, params, ex);
    }
}

void ooc_launch_saved_free(ooc_saved_launch_t *s) {
    free(s->bytes);
    free(s->ptrs);
    memset(s, 0, sizeof *s);
}

/* ---- the checksum kernel --------------------------------------------------------------------- */

static pthread_once_t ck_once = PTHREAD_ONCE_INIT;
static CUfunction ck_fn;

static void ck_load(void) {
    CUmodule m = NULL;
    CUresult r = ooc_real.cuModuleLoadData
                     ? ooc_real.cuModuleLoadData(&m, "FAKECUDA-MODULE:ooc_checksum")
                     : CUDA_ERROR_NOT_FOUND;
    if (r != CUDA_SUCCESS && ooc_checksum_ptx[0] && ooc_real.cuModuleLoadData)
        r = ooc_real.cuModuleLoadData(&m, ooc_checksum_ptx);
    if (r == CUDA_SUCCESS)
        r = ooc_real.cuModuleGetFunction(&ck_fn, m, "ooc_checksum64");
    if (r != CUDA_SUCCESS) {
        ck_fn = NULL;
        OOC_LOG_W("recompute verification is off: the checksum kernel could not be loaded (%s%s); "
                  "no producer is verified, so no buffer is recomputed",
                  ooc_real_errname(r),
                  ooc_checksum_ptx[0] ? "" : "; the shim was built without nvcc");
    }
}

static uint64_t mix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* Queues the checksum of [p, p + n) into the 8 bytes at out, on s. */
static CUresult ck_launch(uintptr_t p, uint64_t n, uintptr_t out, CUstream s) {
    CUresult r = ooc_real.cuMemsetD8Async((CUdeviceptr)out, 0, 8, s);
    if (r != CUDA_SUCCESS)
        return r;
    CUdeviceptr dp = (CUdeviceptr)p, dout = (CUdeviceptr)out;
    unsigned long long nn = n;
    void *args[] = {&dp, &nn, &dout};
    uint64_t words = (n + 7) / 8;
    uint64_t grid = (words + CK_BLOCK - 1) / CK_BLOCK;
    grid = grid < 1 ? 1 : grid > 1024 ? 1024 : grid;
    return ooc_real.cuLaunchKernel(ck_fn, (unsigned)grid, 1, 1, CK_BLOCK, 1, 1, 0, s, args, NULL);
}

/* ---- internal ops ---------------------------------------------------------------------------- */

/* Runs fn(ctx) with the buffers at addrs resident, as one op on s that is neither recorded nor
 * matched against a plan. Returns fn's result, or ooc_mem_begin's. */
static CUresult internal_op(const uintptr_t *addrs, unsigned n, CUstream s,
                            CUresult (*fn)(void *ctx), void *ctx) {
    ooc_access_t *a = malloc(sizeof *a);
    if (!a)
        return CUDA_ERROR_OUT_OF_MEMORY;
    memset(a, 0, offsetof(ooc_access_t, kind));
    a->kind = OOC_OP_KERNEL;
    a->name = "ooc-internal";
    a->fn = NULL;
    for (unsigned i = 0; i < n; i++)
        ooc_mem_note(a, addrs[i]);
    ooc_internal_op = OOC_OWN_VERIFY;
    CUresult r = ooc_mem_begin(a, s);
    if (r == CUDA_SUCCESS)
        r = fn(ctx);
    ooc_mem_end(a, s, r == CUDA_SUCCESS);
    ooc_internal_op = OOC_OWN_NONE;
    free(a);
    return r;
}

/* ---- verification ---------------------------------------------------------------------------- */

typedef struct vkey {
    uint64_t key;
    uint32_t nref;
    unsigned obs; /* launches of this kind checksummed before and after */
    uint8_t *acc; /* OOC_USE_R while unchanged in every one, OOC_USE_RW once changed */
    int8_t *prod; /* 1 verified producer, -1 refused, 0 unknown */
    UT_hash_handle hh;
} vkey_t;

static pthread_mutex_t vf_lock = PTHREAD_MUTEX_INITIALIZER;
static vkey_t *vf_keys;
static uint64_t vf_bytes; /* checksummed in this recording */

/* What ooc_record_op_end noted about the op being verified on this thread. */
static _Thread_local struct {
    uint64_t key;
    int noted;
    unsigned n;
    uint64_t id[OOC_MAX_REFS];
    uint8_t first[OOC_MAX_REFS];
} vnote;

uint64_t ooc_verify_key(void) {
    return vnote.key;
}

void ooc_verify_note(const ooc_opbuf_t *b, size_t nb, const uint8_t *first) {
    if (!vnote.key || nb > OOC_MAX_REFS)
        return;
    vnote.n = (unsigned)nb;
    for (size_t i = 0; i < nb; i++) {
        vnote.id[i] = b[i].id;
        vnote.first[i] = first[i];
    }
    vnote.noted = 1;
}

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* The key of a launch: its function, shape and kind, its parameter bytes with every word that
 * points into the shim's reservation left out, and the sizes of its buffers. */
static uint64_t launch_key(const ooc_saved_launch_t *s, const uint64_t *size, unsigned n) {
    uint64_t h = 1469598103934665603ull;
#define MIX(v) (h = (h ^ (uint64_t)(v)) * 1099511628211ull)
    MIX((uintptr_t)s->fn);
    for (int i = 0; i < 3; i++) {
        MIX(s->grid[i]);
        MIX(s->block[i]);
    }
    MIX(s->shared);
    MIX(s->kind);
    MIX(s->nbytes);
    for (size_t o = 0; o < s->nbytes; o++) {
        if (o % 8 == 0 && o + 8 <= s->nbytes) {
            uint64_t w;
            memcpy(&w, s->bytes + o, 8);
            if (ooc_mem_owns((uintptr_t)w)) {
                o += 7;
                continue;
            }
        }
        MIX(s->bytes[o]);
    }
    for (unsigned i = 0; i < n; i++)
        MIX(size[i]);
#undef MIX
    return h ? h : 1;
}

static vkey_t *key_find(uint64_t key) {
    vkey_t *k;
    HASH_FIND(hh, vf_keys, &key, sizeof key, k);
    return k;
}

/* The key's entry, made when missing. Caller holds vf_lock. NULL when out of memory. */
static vkey_t *key_get(uint64_t key, uint32_t nref) {
    vkey_t *k = key_find(key);
    if (k)
        return k->nref == nref ? k : NULL;
    k = calloc(1, sizeof *k);
    if (!k)
        return NULL;
    k->key = key;
    k->nref = nref;
    k->acc = calloc(nref ? nref : 1, 1);
    k->prod = calloc(nref ? nref : 1, 1);
    vf_oom = 0;
    if (k->acc && k->prod)
        HASH_ADD(hh, vf_keys, key, sizeof k->key, k);
    if (!k->acc || !k->prod || vf_oom) {
        free(k->acc);
        free(k->prod);
        free(k);
        return NULL;
    }
    return k;
}

void ooc_verify_reset(void) {
    pthread_mutex_lock(&vf_lock);
    vkey_t *k, *t;
    HASH_ITER(hh, vf_keys, k, t) {
        HASH_DEL(vf_keys, k);
        free(k->acc);
        free(k->prod);
        free(k);
    }
    vf_bytes = 0;
    pthread_mutex_unlock(&vf_lock);
}

int ooc_verify_lookup(uint64_t key, uint32_t nref, uint8_t *acc, uint8_t *prod) {
    if (!key)
        return -1;
    pthread_mutex_lock(&vf_lock);
    vkey_t *k = key_find(key);
    int rc = -1;
    if (k && k->nref == nref) {
        for (uint32_t r = 0; r < nref; r++) {
            if (k->obs >= VERIFY_OBS)
                acc[r] = k->acc[r];
            prod[r] = k->prod[r] == 1;
            if (prod[r])
                acc[r] = OOC_USE_W;
        }
        rc = 0;
    }
    pthread_mutex_unlock(&vf_lock);
    return rc;
}

/* Footprint of n bytes, rounded up to whole chunks (conservative for small buffers). */
static uint64_t chunks_of(uint64_t n, uint64_t chunk) {
    return (n + chunk - 1) / chunk;
}

/* Do the buffers at addrs[0..n), in the chunks they span, and `extra` bytes of the shim's own
 * more (plus the slab chunk those may start) fit the budget at once? An internal op that did
 * not would fail as out of memory, and say so as if the program's op had. */
static int fits(const uintptr_t *addrs, unsigned n, uint64_t extra) {
    uint64_t chunk, budget, span, budget_chunks;
    ooc_mem_geometry(&chunk, &budget);
    if (ooc_mem_span(addrs, n, &span, &budget_chunks) != 0)
        return 0;
    return span + chunks_of(extra, chunk) + 1 <= budget_chunks;
}

/* Takes `bytes` from the recording's allowance; 0 when it is spent. */
static int allowance(uint64_t bytes) {
    pthread_mutex_lock(&vf_lock);
    int ok = vf_bytes + bytes <= VERIFY_TOTAL_BYTES;
    if (ok)
        vf_bytes += bytes;
    pthread_mutex_unlock(&vf_lock);
    return ok;
}

/* The checksums of one internal op: what to sum where, then read back. */
typedef struct sums {
    CUstream s;
    unsigned n;           /* checksums */
    const uintptr_t *src; /* per checksum: the range summed */
    const uint64_t *len;
    uintptr_t out; /* device results, 8 bytes each */
    uint64_t *host;
    /* Candidates: re-launch into scratch, twice (fill 0x00, then 0xff), summing scratch. */
    ooc_saved_launch_t *sl;
    unsigned ncand;
    const unsigned *cand; /* reference index of each candidate */
    const uint64_t *size; /* per reference */
    uintptr_t scratch;
    const uintptr_t *also; /* more buffers to keep resident (the launch's, for re-launches) */
    unsigned nalso;
} sums_t;

static CUresult run_sums(void *ctx) {
    sums_t *x = ctx;
    CUresult r = CUDA_SUCCESS;
    unsigned k = 0;
    for (; k < x->n && r == CUDA_SUCCESS; k++)
        r = ck_launch(x->src[k], x->len[k], x->out + 8 * k, x->s);
    for (unsigned c = 0; c < x->ncand && r == CUDA_SUCCESS; c++) {
        unsigned ri = x->cand[c];
        for (int fill = 0; fill < 2 && r == CUDA_SUCCESS; fill++) {
            r = ooc_real.cuMemsetD8Async((CUdeviceptr)x->scratch, fill ? 0xff : 0x00, x->size[ri],
                                         x->s);
            if (r == CUDA_SUCCESS)
                r = ooc_launch_issue(&x->sl[c], x->s);
            if (r == CUDA_SUCCESS)
                r = ck_launch(x->scratch, x->size[ri], x->out + 8 * k, x->s);
            k++;
        }
    }
    if (r == CUDA_SUCCESS)
        r = ooc_real.cuMemcpyDtoHAsync_v2(x->host, (CUdeviceptr)x->out, 8 * (size_t)k, x->s);
    if (r == CUDA_SUCCESS)
        r = ooc_real.cuStreamSynchronize(x->s);
    return r;
}

/* Checksums the n ranges (and runs the candidates' re-launches) on s; host[] gets the finished
 * checksums, the summed ranges first, then two per candidate. */
static CUresult checksums(sums_t *x, uint64_t *host) {
    unsigned total = x->n + 2 * x->ncand;
    CUdeviceptr out = 0;
    CUresult r = ooc_mem_alloc_own(&out, 8 * (size_t)total);
    if (r != CUDA_SUCCESS)
        return r;
    x->out = (uintptr_t)out;
    x->host = host;
    uintptr_t *addrs = malloc((x->n + x->nalso + 2) * sizeof *addrs);
    if (!addrs) {
        ooc_mem_free(out, x->s, NULL);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    unsigned na = 0;
    for (unsigned i = 0; i < x->n; i++)
        addrs[na++] = x->src[i];
    for (unsigned i = 0; i < x->nalso; i++)
        addrs[na++] = x->also[i];
    addrs[na++] = x->out;
    if (x->ncand)
        addrs[na++] = x->scratch;
    r = internal_op(addrs, na, x->s, run_sums, x);
    free(addrs);
    ooc_mem_free(out, x->s, NULL);
    if (r != CUDA_SUCCESS)
        return r;
    uint64_t k = 0;
    for (unsigned i = 0; i < x->n; i++, k++)
        host[k] = mix64(host[k] ^ x->len[i]);
    for (unsigned c = 0; c < x->ncand; c++)
        for (int f = 0; f < 2; f++, k++)
            host[k] = mix64(host[k] ^ x->size[x->cand[c]]);
    return CUDA_SUCCESS;
}

static void v_free(ooc_verify_t *v) {
    free(v->addr);
    free(v->size);
    free(v->pre);
    v->addr = NULL;
    v->size = NULL;
    v->pre = NULL;
    v->on = 0;
}

void ooc_verify_pre(ooc_verify_t *v, const ooc_launch_t *l, const ooc_access_t *a, CUstream s) {
    v->on = 0;
    /* A kernel of a library call is not an op of the profile: nothing to verify. */
    if (OOC_LIKELY(!ooc_record_on()) || ooc_lib_depth)
        return;
    memset(v, 0, sizeof *v);
    vnote.key = 0;
    vnote.noted = 0;
    if (atomic_load_explicit(&ooc_graph_captures, memory_order_relaxed) || a->overflow || a->n == 0)
        return;
    pthread_once(&ck_once, ck_load);
    if (!ck_fn)
        return;
    uint64_t t0 = now_ns();
    v->addr = malloc(2 * a->n * sizeof *v->addr); /* a word may stand for two buffers */
    v->size = malloc(2 * a->n * sizeof *v->size);
    ooc_saved_launch_t sl;
    memset(&sl, 0, sizeof sl);
    if (!v->addr || !v->size || ooc_launch_save(l, &sl) != 0) {
        ooc_launch_saved_free(&sl);
        v_free(v);
        return;
    }
    /* The buffers in the order ooc_mem_begin lists them: by query, each once. */
    for (unsigned i = 0; i < a->n; i++) {
        uintptr_t base[2];
        size_t size[2];
        unsigned nw = ooc_mem_lookup_word(a->refs[i].lo, base, size);
        for (unsigned k = 0; k < nw; k++) {
            unsigned j = 0;
            while (j < v->n && v->addr[j] != base[k])
                j++;
            if (j == v->n) {
                v->addr[v->n] = base[k];
                v->size[v->n++] = size[k];
            }
        }
    }
    v->key = launch_key(&sl, v->size, v->n);
    ooc_launch_saved_free(&sl);
    /* Every launch while recording is checksummed: a change in any one makes it a write. */
    int need_rw = 1;
    uint64_t bytes = 0;
    for (unsigned i = 0; i < v->n; i++)
        bytes += v->size[i];
    v->on = 1;
    vnote.key = v->key;
    if (need_rw && fits(v->addr, v->n, 8 * (uint64_t)v->n) && allowance(2 * bytes)) {
        v->pre = malloc((v->n ? v->n : 1) * sizeof *v->pre);
        sums_t x = {.s = s, .n = v->n, .src = v->addr, .len = v->size};
        if (v->pre && checksums(&x, v->pre) != CUDA_SUCCESS) {
            free(v->pre);
            v->pre = NULL;
        }
    }
    ooc_stats_add(OOC_STAT_verify_ns, now_ns() - t0);
}

/* Does launch sl reach memory the shim cannot checksum: a parameter word that the driver knows
 * as a pointer (cuPointerGetAttribute answers) into memory that is not ours, such as mapped or
 * registered host memory or the program's own VMM memory? Launching it again would repeat its
 * writes there unseen: such a launch is never re-launched, neither to verify it nor to rebuild
 * a buffer. */
static int reaches_other_memory(const ooc_saved_launch_t *sl) {
    if (!ooc_real.cuPointerGetAttribute)
        return 1;
    for (size_t o = 0; o + 8 <= sl->nbytes; o += 8) {
        uint64_t w;
        memcpy(&w, sl->bytes + o, 8);
        unsigned type = 0;
        if (w && !ooc_mem_owns((uintptr_t)w) &&
            ooc_real.cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                           (CUdeviceptr)w) == CUDA_SUCCESS)
            return 1;
    }
    return 0;
}

void ooc_verify_post(ooc_verify_t *v, const ooc_launch_t *l, CUstream s, CUresult r) {
    if (OOC_LIKELY(!v->on))
        return;
    vnote.key = 0;
    if (r != CUDA_SUCCESS || !vnote.noted || vnote.n != v->n) {
        v_free(v);
        return;
    }
    uint64_t t0 = now_ns();
    unsigned *cand = malloc((v->n ? v->n : 1) * sizeof *cand);
    ooc_saved_launch_t *sl = calloc(v->n ? v->n : 1, sizeof *sl);
    uint64_t *host = malloc((3 * (size_t)v->n + 1) * sizeof *host);
    uintptr_t *src = malloc((v->n ? v->n : 1) * sizeof *src);
    uint64_t *len = malloc((v->n ? v->n : 1) * sizeof *len);
    unsigned ncand = 0;
    uint64_t scratch_bytes = 0;
    CUdeviceptr scratch = 0;
    pthread_mutex_lock(&vf_lock);
    vkey_t *k = key_get(v->key, v->n);
    pthread_mutex_unlock(&vf_lock);
    if (!k || !cand || !sl || !host || !src || !len)
        goto out;
    /* 1. Which buffers did the launch change? */
    if (v->pre) {
        sums_t x = {.s = s, .n = v->n, .src = v->addr, .len = v->size};
        if (checksums(&x, host) != CUDA_SUCCESS)
            goto out;
        pthread_mutex_lock(&vf_lock);
        for (unsigned i = 0; i < v->n; i++)
            if (k->acc[i] != OOC_USE_RW)
                k->acc[i] = host[i] == v->pre[i] ? OOC_USE_R : OOC_USE_RW;
        k->obs++;
        pthread_mutex_unlock(&vf_lock);
    }
    /* 2. Re-launch it for each buffer it is the first to use, once launches of its kind were
     * seen often enough not to change any other buffer: a re-launch must not touch the
     * program's own data. A launch that reaches memory not ours is refused outright. */
    pthread_mutex_lock(&vf_lock);
    int open = 0;
    for (unsigned i = 0; i < v->n; i++)
        open |= vnote.first[i] && k->prod[i] == 0;
    pthread_mutex_unlock(&vf_lock);
    if (open && k->obs >= VERIFY_OBS) {
        int other = ooc_launch_save(l, &sl[0]) != 0 || reaches_other_memory(&sl[0]);
        ooc_launch_saved_free(&sl[0]);
        if (other) {
            pthread_mutex_lock(&vf_lock);
            for (unsigned i = 0; i < v->n; i++) {
                if (vnote.first[i] && k->prod[i] == 0) {
                    k->prod[i] = -1;
                    ooc_stats_add(OOC_STAT_producers_refused, 1);
                }
            }
            pthread_mutex_unlock(&vf_lock);
            OOC_LOG_I("producer refused: %s also reaches memory the shim cannot see (mapped or "
                      "registered host memory, or memory not allocated through the shim)",
                      ooc_fnname_of(l->fn));
            goto out;
        }
    }
    pthread_mutex_lock(&vf_lock);
    for (unsigned i = 0; k->obs >= VERIFY_OBS && i < v->n; i++) {
        if (!vnote.first[i] || k->prod[i] != 0 || v->size[i] > VERIFY_MAX_BYTES)
            continue;
        int others_read = 1;
        for (unsigned j = 0; j < v->n; j++)
            others_read &= j == i || k->acc[j] == OOC_USE_R;
        if (!others_read)
            continue;
        cand[ncand++] = i;
        if (v->size[i] > scratch_bytes)
            scratch_bytes = v->size[i];
    }
    pthread_mutex_unlock(&vf_lock);
    uint64_t bytes = 0;
    for (unsigned c = 0; c < ncand; c++)
        bytes += 3 * v->size[cand[c]];
    if (!ncand || !fits(v->addr, v->n, scratch_bytes + 8 * (3 * (uint64_t)v->n)) ||
        !allowance(bytes) || ooc_mem_alloc_own(&scratch, scratch_bytes) != CUDA_SUCCESS)
        goto out; /* nothing to verify, or too large for the budget or the allowance */
    unsigned nok = 0;
    for (unsigned c = 0; c < ncand; c++) {
        unsigned ri = cand[c];
        if (ooc_launch_save(l, &sl[nok]) == 0 &&
            ooc_launch_subst(&sl[nok], v->addr[ri], v->size[ri], (uintptr_t)scratch) > 0) {
            src[nok] = v->addr[ri];
            len[nok] = v->size[ri];
            cand[nok++] = ri;
        }
    }
    ncand = nok;
    /* The re-launches read the launch's buffers and write the scratch only. */
    uintptr_t *keep = v->addr; /* resident during the internal op: every buffer of the launch */
    sums_t x = {.s = s,
                .n = ncand,
                .src = src,
                .len = len,
                .sl = sl,
                .ncand = ncand,
                .cand = cand,
                .size = v->size,
                .scratch = (uintptr_t)scratch,
                .also = keep,
                .nalso = v->n};
    if (!ncand || checksums(&x, host) != CUDA_SUCCESS)
        goto out;
    int refused = 0;
    pthread_mutex_lock(&vf_lock);
    for (unsigned c = 0; c < ncand; c++) {
        unsigned ri = cand[c];
        if (k->prod[ri])
            continue;
        int ok = host[ncand + 2 * c] == host[c] && host[ncand + 2 * c + 1] == host[c];
        k->prod[ri] = ok ? 1 : -1;
        ooc_stats_add(ok ? OOC_STAT_producers_verified : OOC_STAT_producers_refused, 1);
        refused |= !ok;
    }
    pthread_mutex_unlock(&vf_lock);
    if (refused)
        OOC_LOG_I("producer refused: re-launching %s does not reproduce what it wrote",
                  ooc_fnname_of(l->fn));
out:
    if (scratch)
        ooc_mem_free(scratch, s, NULL);
    for (unsigned i = 0; sl && i < v->n; i++)
        ooc_launch_saved_free(&sl[i]);
    free(sl);
    free(cand);
    free(host);
    free(src);
    free(len);
    ooc_stats_add(OOC_STAT_verify_ns, now_ns() - t0);
    v_free(v);
}
