/* SPDX-License-Identifier: MIT */
/* profile.c: the profile directory (meta.tsv, buffers.tsv, ops.tsv): builder, validator, reader
 * and writer, exactly as profiles/FORMAT.md specifies.
 *
 * The reader trusts nothing: every field is parsed strictly (no sign where none is allowed, no
 * trailing characters, overflow checked), ids must be dense and in order, cross-references are
 * checked, and the first problem is reported as "file:line: field NAME: what is wrong". A profile
 * is plain data owned by its creator; nothing here keeps state between calls. */
#include "ooc_planner.h"
#include "grow.h"
#include "msg.h"
#include "tsv.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char *const kind_names[OOC_KIND_COUNT] = {"kernel", "memcpy", "memset", "cudnn",
                                                       "cublas", "nccl",   "host"};

const char *ooc_kind_name(ooc_op_kind_t k) {
    return (unsigned)k < OOC_KIND_COUNT ? kind_names[k] : "?";
}

static char *dupstr(const char *s) {
    size_t n = strlen(s);
    char *d = malloc(n + 1);
    if (d)
        memcpy(d, s, n + 1);
    return d;
}

ooc_profile_t *ooc_profile_new(void) {
    ooc_profile_t *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->version = OOC_FORMAT_VERSION;
    p->program = dupstr("-");
    p->device = dupstr("-");
    p->chunk_bytes = 2u << 20;
    p->h2d_bps = 50e9;
    p->d2h_bps = 50e9;
    p->bidir_bps = 90e9;
    p->iterations = 1;
    if (!p->program || !p->device) {
        ooc_profile_free(p);
        return NULL;
    }
    return p;
}

void ooc_profile_free(ooc_profile_t *p) {
    if (!p)
        return;
    for (uint32_t i = 0; i < p->nops; i++) {
        free(p->ops[i].name);
        free(p->ops[i].shape);
    }
    for (uint32_t i = 0; i < p->nbufs; i++)
        free(p->bufs[i].site);
    free(p->ops);
    free(p->bufs);
    free(p->refs);
    free(p->prods);
    free(p->program);
    free(p->device);
    free(p);
}

int ooc_profile_set_str(char **field, const char *s) {
    char *d = dupstr(s ? s : "-");
    if (!d)
        return OOC_ENOMEM;
    free(*field);
    *field = d;
    return 0;
}

int ooc_profile_add_buffer(ooc_profile_t *p, uint64_t bytes, int64_t alloc_idx, int64_t free_idx,
                           int persistent, const char *site, const int32_t *prods, uint32_t nprod) {
    if (p->nbufs >= INT32_MAX || nprod > INT32_MAX - p->nprods)
        return OOC_EINVAL;
    if (ooc_grow32(&p->bufs, &p->bufs_cap, p->nbufs + 1, sizeof *p->bufs, 16) ||
        ooc_grow32(&p->prods, &p->prods_cap, p->nprods + nprod, sizeof *p->prods, 16))
        return OOC_ENOMEM;
    char *s = dupstr(site && *site ? site : "-");
    if (!s)
        return OOC_ENOMEM;
    ooc_buffer_t *b = &p->bufs[p->nbufs];
    b->bytes = bytes;
    b->alloc_idx = alloc_idx;
    b->free_idx = free_idx;
    b->persistent = persistent ? 1 : 0;
    b->site = s;
    b->prod_off = p->nprods;
    b->nprod = nprod;
    if (nprod)
        memcpy(p->prods + p->nprods, prods, nprod * sizeof *prods);
    p->nprods += nprod;
    return (int)p->nbufs++;
}

int ooc_profile_add_op(ooc_profile_t *p, int32_t stream, ooc_op_kind_t kind, const char *name,
                       const char *shape, uint64_t duration_ns, const ooc_ref_t *refs,
                       uint32_t nref) {
    if (p->nops >= INT32_MAX || nref > INT32_MAX - p->nrefs || (unsigned)kind >= OOC_KIND_COUNT)
        return OOC_EINVAL;
    if (ooc_grow32(&p->ops, &p->ops_cap, p->nops + 1, sizeof *p->ops, 16) ||
        ooc_grow32(&p->refs, &p->refs_cap, p->nrefs + nref, sizeof *p->refs, 16))
        return OOC_ENOMEM;
    char *n = dupstr(name && *name ? name : "-");
    char *s = dupstr(shape && *shape ? shape : "-");
    if (!n || !s) {
        free(n);
        free(s);
        return OOC_ENOMEM;
    }
    ooc_op_t *o = &p->ops[p->nops];
    o->stream = stream;
    o->kind = (uint8_t)kind;
    o->name = n;
    o->shape = s;
    o->duration_ns = duration_ns;
    o->ref_off = p->nrefs;
    o->nref = nref;
    if (nref)
        memcpy(p->refs + p->nrefs, refs, nref * sizeof *refs);
    p->nrefs += nref;
    return (int)p->nops++;
}

/* Line numbers in messages: line 1 is the version header, line 2 the column names, so entry i
 * is on line i + 3. */
int ooc_profile_validate(const ooc_profile_t *p, char *err, size_t errlen) {
    if (p->chunk_bytes == 0 || (p->chunk_bytes & (p->chunk_bytes - 1))) {
        ooc_msg_say(err, errlen, "meta.tsv: field chunk_bytes: %llu is not a power of two",
                    (unsigned long long)p->chunk_bytes);
        return OOC_EFORMAT;
    }
    if (!(p->h2d_bps > 0) || !(p->d2h_bps > 0) || !(p->bidir_bps > 0) || !isfinite(p->h2d_bps) ||
        !isfinite(p->d2h_bps) || !isfinite(p->bidir_bps)) {
        ooc_msg_say(err, errlen, "meta.tsv: field h2d_bps/d2h_bps/bidir_bps: must be positive");
        return OOC_EFORMAT;
    }
    int64_t n = p->nops;
    for (uint32_t i = 0; i < p->nbufs; i++) {
        const ooc_buffer_t *b = &p->bufs[i];
        unsigned line = i + 3;
        if (b->alloc_idx < -1 || b->alloc_idx >= n) {
            ooc_msg_say(err, errlen,
                        "buffers.tsv:%u: field alloc_idx: %lld is not -1 or an op index", line,
                        (long long)b->alloc_idx);
            return OOC_EFORMAT;
        }
        if (b->free_idx < -1 || b->free_idx >= n) {
            ooc_msg_say(err, errlen,
                        "buffers.tsv:%u: field free_idx: %lld is not -1 or an op index", line,
                        (long long)b->free_idx);
            return OOC_EFORMAT;
        }
        if (b->alloc_idx >= 0 && b->free_idx >= 0 && b->free_idx < b->alloc_idx) {
            ooc_msg_say(err, errlen,
                        "buffers.tsv:%u: field free_idx: %lld is before alloc_idx %lld", line,
                        (long long)b->free_idx, (long long)b->alloc_idx);
            return OOC_EFORMAT;
        }
        int both = b->alloc_idx == -1 && b->free_idx == -1;
        if (b->persistent != both) {
            ooc_msg_say(err, errlen,
                        "buffers.tsv:%u: field persistent: must be 1 exactly when alloc_idx and "
                        "free_idx are both -1",
                        line);
            return OOC_EFORMAT;
        }
        for (uint32_t k = 0; k < b->nprod; k++) {
            int32_t o = p->prods[b->prod_off + k];
            if (o < 0 || o >= n) {
                ooc_msg_say(err, errlen, "buffers.tsv:%u: field producers: op %d does not exist",
                            line, (int)o);
                return OOC_EFORMAT;
            }
            if (k > 0 && o <= p->prods[b->prod_off + k - 1]) {
                ooc_msg_say(err, errlen, "buffers.tsv:%u: field producers: not in ascending order",
                            line);
                return OOC_EFORMAT;
            }
        }
    }
    for (uint32_t i = 0; i < p->nops; i++) {
        const ooc_op_t *o = &p->ops[i];
        unsigned line = i + 3;
        for (uint32_t k = 0; k < o->nref; k++) {
            const ooc_ref_t *r = &p->refs[o->ref_off + k];
            if (r->buf < 0 || (uint32_t)r->buf >= p->nbufs) {
                ooc_msg_say(err, errlen, "ops.tsv:%u: field refs: buffer %d does not exist", line,
                            (int)r->buf);
                return OOC_EFORMAT;
            }
            if (r->access < 1 || r->access > 3) {
                ooc_msg_say(err, errlen, "ops.tsv:%u: field refs: bad access for buffer %d", line,
                            (int)r->buf);
                return OOC_EFORMAT;
            }
            const ooc_buffer_t *b = &p->bufs[r->buf];
            if ((b->alloc_idx >= 0 && i < b->alloc_idx) || (b->free_idx >= 0 && i > b->free_idx)) {
                ooc_msg_say(err, errlen,
                            "ops.tsv:%u: field refs: buffer %d is referenced outside its lifetime "
                            "[%lld, %lld]",
                            line, (int)r->buf, (long long)b->alloc_idx, (long long)b->free_idx);
                return OOC_EFORMAT;
            }
            for (uint32_t j = 0; j < k; j++)
                if (p->refs[o->ref_off + j].buf == r->buf) {
                    ooc_msg_say(err, errlen, "ops.tsv:%u: field refs: buffer %d is listed twice",
                                line, (int)r->buf);
                    return OOC_EFORMAT;
                }
        }
    }
    return 0;
}

/* ---- reading ----------------------------------------------------------------------------------
 */

/* Reads the next line into fields (tsv.c). Returns 1 when a line was read, 0 at end of text, and
 * OOC_EFORMAT for an empty line, a NUL byte or too many fields. */
static int next_line(ooc_tsv_t *r, char *err, size_t errlen) {
    int rc = ooc_tsv_next(r, OOC_TSV_FIELDS);
    if (rc >= 0)
        return rc;
    ooc_msg_say(err, errlen, "%s:%u: %s", r->name, r->line,
                rc == OOC_TSV_EMPTY ? "empty line"
                : rc == OOC_TSV_NUL ? "NUL byte in line"
                                    : "too many fields");
    return OOC_EFORMAT;
}

static int field_is(const ooc_tsv_t *r, int i, const char *s) {
    return r->flen[i] == strlen(s) && memcmp(r->f[i], s, r->flen[i]) == 0;
}

/* Checks the version header "#ooc-profile<TAB>KIND<TAB>1" and the column-name line. */
static int read_header(ooc_tsv_t *r, const char *kind, const char *const *cols, int ncols,
                       char *err, size_t errlen) {
    int rc = next_line(r, err, errlen);
    if (rc < 0)
        return rc;
    if (rc == 0 || r->nf != 3 || !field_is(r, 0, "#ooc-profile") || !field_is(r, 1, kind)) {
        ooc_msg_say(err, errlen, "%s:1: field header: expected \"#ooc-profile\\t%s\\t%d\"", r->name,
                    kind, OOC_FORMAT_VERSION);
        return OOC_EFORMAT;
    }
    if (!field_is(r, 2, "1")) {
        ooc_msg_say(err, errlen,
                    "%s:1: field version: '%.*s' is not a supported format version (1)", r->name,
                    (int)(r->flen[2] > 20 ? 20 : r->flen[2]), r->f[2]);
        return OOC_EFORMAT;
    }
    rc = next_line(r, err, errlen);
    if (rc < 0)
        return rc;
    if (rc == 0 || r->nf != ncols) {
        ooc_msg_say(err, errlen, "%s:2: field columns: expected %d column names", r->name, ncols);
        return OOC_EFORMAT;
    }
    for (int i = 0; i < ncols; i++)
        if (!field_is(r, i, cols[i])) {
            ooc_msg_say(err, errlen, "%s:2: field columns: column %d must be named '%s'", r->name,
                        i + 1, cols[i]);
            return OOC_EFORMAT;
        }
    return 0;
}

static int bad(const ooc_tsv_t *r, int i, const char *field, const char *what, char *err,
               size_t errlen) {
    ooc_msg_say(err, errlen, "%s:%u: field %s: '%.*s' %s", r->name, r->line, field,
                (int)(r->flen[i] > 40 ? 40 : r->flen[i]), r->f[i], what);
    return OOC_EFORMAT;
}

static int parse_u64(const char *s, size_t n, uint64_t *out) {
    if (n == 0 || n > 20)
        return -1;
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -1;
        unsigned d = (unsigned)(s[i] - '0');
        if (v > (UINT64_MAX - d) / 10)
            return -1;
        v = v * 10 + d;
    }
    *out = v;
    return 0;
}

static int parse_i64(const char *s, size_t n, int64_t *out) {
    uint64_t v;
    if (n >= 1 && s[0] == '-') {
        if (parse_u64(s + 1, n - 1, &v) || v > (uint64_t)INT64_MAX)
            return -1;
        *out = -(int64_t)v;
        return 0;
    }
    if (parse_u64(s, n, &v) || v > (uint64_t)INT64_MAX)
        return -1;
    *out = (int64_t)v;
    return 0;
}

static int parse_pos_double(const char *s, size_t n, double *out) {
    char buf[64];
    if (n == 0 || n >= sizeof buf)
        return -1;
    memcpy(buf, s, n);
    buf[n] = '\0';
    for (size_t i = 0; i < n; i++)
        if (!strchr("0123456789.eE+-", buf[i]))
            return -1;
    char *e;
    errno = 0;
    double v = strtod(buf, &e);
    if (*e || errno || !isfinite(v) || !(v > 0))
        return -1;
    *out = v;
    return 0;
}

static char *field_dup(const ooc_tsv_t *r, int i) {
    char *d = malloc(r->flen[i] + 1);
    if (d) {
        memcpy(d, r->f[i], r->flen[i]);
        d[r->flen[i]] = '\0';
    }
    return d;
}

static const char *const meta_cols[] = {"key", "value"};
static const char *const buf_cols[] = {"id",         "bytes", "alloc_idx", "free_idx",
                                       "persistent", "site",  "producers"};
static const char *const op_cols[] = {"idx",   "stream",      "kind", "name",
                                      "shape", "duration_ns", "refs"};

enum {
    M_VERSION,
    M_PROGRAM,
    M_DEVICE,
    M_DEVMEM,
    M_BUDGET,
    M_CHUNK,
    M_H2D,
    M_D2H,
    M_BIDIR,
    M_ITERS,
    M_EXCL, /* optional from here on: 0 when absent */
    M_VMM_IN,
    M_VMM_OUT,
    M_OUT_EXCL,
    M_VMM_MAP,
    M_VMM_UNMAP,
    M_VMM_STAGE,
    M_VMM_ADOPT,
    M_GATE
};
static const char *const meta_keys[] = {
    "format_version",   "program",       "device",         "device_mem_bytes",  "budget_bytes",
    "chunk_bytes",      "h2d_bps",       "d2h_bps",        "bidir_bps",         "iterations",
    "swapin_exclusive", "swapin_vmm_ns", "swapout_vmm_ns", "swapout_exclusive", "map_vmm_ns",
    "unmap_vmm_ns",     "stage_vmm_ns",  "adopt_vmm_ns",   "remap_gate"};
#define NMETA ((int)(sizeof meta_keys / sizeof meta_keys[0]))

static int parse_meta(ooc_profile_t *p, ooc_tsv_t *r, char *err, size_t errlen) {
    int rc = read_header(r, "meta", meta_cols, 2, err, errlen);
    if (rc)
        return rc;
    int seen[NMETA] = {0};
    while ((rc = next_line(r, err, errlen)) == 1) {
        if (r->nf != 2) {
            ooc_msg_say(err, errlen, "%s:%u: field key: expected 2 fields, found %d", r->name,
                        r->line, r->nf);
            return OOC_EFORMAT;
        }
        int k = -1;
        for (int i = 0; i < NMETA; i++)
            if (field_is(r, 0, meta_keys[i]))
                k = i;
        if (k < 0)
            continue; /* unknown keys are for later versions; ignored */
        if (seen[k]) {
            ooc_msg_say(err, errlen, "%s:%u: field %s: given twice", r->name, r->line,
                        meta_keys[k]);
            return OOC_EFORMAT;
        }
        seen[k] = 1;
        uint64_t u = 0;
        double d = 0;
        switch (k) {
        case M_VERSION:
            if (!field_is(r, 1, "1"))
                return bad(r, 1, meta_keys[k], "is not a supported format version", err, errlen);
            break;
        case M_EXCL:
        case M_OUT_EXCL:
        case M_GATE:
            if (!field_is(r, 1, "0") && !field_is(r, 1, "1"))
                return bad(r, 1, meta_keys[k], "is not 0 or 1", err, errlen);
            *(k == M_EXCL       ? &p->swapin_exclusive
              : k == M_OUT_EXCL ? &p->swapout_exclusive
                                : &p->remap_gate) = field_is(r, 1, "1");
            break;
        case M_PROGRAM:
        case M_DEVICE: {
            if (r->flen[1] == 0)
                return bad(r, 1, meta_keys[k], "is empty", err, errlen);
            char *s = field_dup(r, 1);
            if (!s)
                return OOC_ENOMEM;
            char **dst = k == M_PROGRAM ? &p->program : &p->device;
            free(*dst);
            *dst = s;
            break;
        }
        case M_DEVMEM:
        case M_BUDGET:
        case M_CHUNK:
        case M_ITERS:
        case M_VMM_IN:
        case M_VMM_OUT:
        case M_VMM_MAP:
        case M_VMM_UNMAP:
        case M_VMM_STAGE:
        case M_VMM_ADOPT:
            if (parse_u64(r->f[1], r->flen[1], &u))
                return bad(r, 1, meta_keys[k], "is not an unsigned integer", err, errlen);
            if (k == M_DEVMEM)
                p->device_mem_bytes = u;
            else if (k == M_BUDGET)
                p->budget_bytes = u;
            else if (k == M_CHUNK) {
                if (u == 0 || (u & (u - 1)))
                    return bad(r, 1, meta_keys[k], "is not a power of two", err, errlen);
                p->chunk_bytes = u;
            } else if (k != M_ITERS) {
                if (u > 60000000000ull)
                    return bad(r, 1, meta_keys[k], "is above a minute per chunk", err, errlen);
                *(k == M_VMM_IN      ? &p->swapin_vmm_ns
                  : k == M_VMM_OUT   ? &p->swapout_vmm_ns
                  : k == M_VMM_MAP   ? &p->map_vmm_ns
                  : k == M_VMM_UNMAP ? &p->unmap_vmm_ns
                  : k == M_VMM_STAGE ? &p->stage_vmm_ns
                                     : &p->adopt_vmm_ns) = u;
            } else {
                if (u > UINT32_MAX)
                    return bad(r, 1, meta_keys[k], "is too large", err, errlen);
                p->iterations = (uint32_t)u;
            }
            break;
        default:
            if (parse_pos_double(r->f[1], r->flen[1], &d))
                return bad(r, 1, meta_keys[k], "is not a positive number", err, errlen);
            if (k == M_H2D)
                p->h2d_bps = d;
            else if (k == M_D2H)
                p->d2h_bps = d;
            else
                p->bidir_bps = d;
        }
    }
    if (rc < 0)
        return rc;
    for (int i = 0; i < NMETA; i++)
        if (!seen[i] && i < M_EXCL) {
            ooc_msg_say(err, errlen, "%s: field %s: missing", r->name, meta_keys[i]);
            return OOC_EFORMAT;
        }
    return 0;
}

static int parse_buffers(ooc_profile_t *p, ooc_tsv_t *r, char *err, size_t errlen) {
    int rc = read_header(r, "buffers", buf_cols, 7, err, errlen);
    if (rc)
        return rc;
    int32_t prods[64];
    while ((rc = next_line(r, err, errlen)) == 1) {
        if (r->nf != 7) {
            ooc_msg_say(err, errlen, "%s:%u: field id: expected 7 fields, found %d", r->name,
                        r->line, r->nf);
            return OOC_EFORMAT;
        }
        uint64_t id, bytes, pers;
        int64_t a, f;
        if (parse_u64(r->f[0], r->flen[0], &id) || id != p->nbufs)
            return bad(r, 0, "id", "is not the next id (ids are 0, 1, 2, ... in order)", err,
                       errlen);
        if (parse_u64(r->f[1], r->flen[1], &bytes) || bytes == 0 || bytes > (1ull << 50))
            return bad(r, 1, "bytes", "is not a size between 1 and 2^50", err, errlen);
        if (parse_i64(r->f[2], r->flen[2], &a) || a < -1 || a > INT32_MAX)
            return bad(r, 2, "alloc_idx", "is not -1 or an op index", err, errlen);
        if (parse_i64(r->f[3], r->flen[3], &f) || f < -1 || f > INT32_MAX)
            return bad(r, 3, "free_idx", "is not -1 or an op index", err, errlen);
        if (parse_u64(r->f[4], r->flen[4], &pers) || pers > 1)
            return bad(r, 4, "persistent", "is not 0 or 1", err, errlen);
        if (r->flen[5] == 0)
            return bad(r, 5, "site", "is empty (write '-' when unknown)", err, errlen);
        uint32_t np = 0;
        if (!field_is(r, 6, "-")) {
            const char *s = r->f[6], *e = r->f[6] + r->flen[6];
            while (s <= e) {
                const char *c = memchr(s, ',', (size_t)(e - s));
                const char *ce = c ? c : e;
                uint64_t v;
                if (np == 64 || parse_u64(s, (size_t)(ce - s), &v) || v > INT32_MAX)
                    return bad(r, 6, "producers",
                               "is not '-' or up to 64 comma-separated op indices", err, errlen);
                prods[np++] = (int32_t)v;
                if (!c)
                    break;
                s = c + 1;
            }
        }
        char *site = field_dup(r, 5);
        if (!site)
            return OOC_ENOMEM;
        rc = ooc_profile_add_buffer(p, bytes, a, f, (int)pers, site, prods, np);
        free(site);
        if (rc < 0)
            return rc;
    }
    return rc < 0 ? rc : 0;
}

static int parse_ops(ooc_profile_t *p, ooc_tsv_t *r, char *err, size_t errlen) {
    int rc = read_header(r, "ops", op_cols, 7, err, errlen);
    if (rc)
        return rc;
    ooc_ref_t *refs = NULL;
    uint32_t cap = 0;
    while ((rc = next_line(r, err, errlen)) == 1) {
        if (r->nf != 7) {
            ooc_msg_say(err, errlen, "%s:%u: field idx: expected 7 fields, found %d", r->name,
                        r->line, r->nf);
            rc = OOC_EFORMAT;
            break;
        }
        uint64_t idx, dur;
        int64_t stream;
        if (parse_u64(r->f[0], r->flen[0], &idx) || idx != p->nops) {
            rc = bad(r, 0, "idx", "is not the next index (0, 1, 2, ... in order)", err, errlen);
            break;
        }
        if (parse_i64(r->f[1], r->flen[1], &stream) || stream < 0 || stream > INT32_MAX) {
            rc = bad(r, 1, "stream", "is not a stream id (0 or more)", err, errlen);
            break;
        }
        int kind = -1;
        for (int k = 0; k < OOC_KIND_COUNT; k++)
            if (field_is(r, 2, kind_names[k]))
                kind = k;
        if (kind < 0) {
            rc = bad(r, 2, "kind", "is not kernel|memcpy|memset|cudnn|cublas|nccl|host", err,
                     errlen);
            break;
        }
        if (r->flen[3] == 0 || r->flen[4] == 0) {
            rc = bad(r, r->flen[3] == 0 ? 3 : 4, r->flen[3] == 0 ? "name" : "shape",
                     "is empty (write '-')", err, errlen);
            break;
        }
        if (parse_u64(r->f[5], r->flen[5], &dur) || dur > (1ull << 62)) {
            rc = bad(r, 5, "duration_ns", "is not an unsigned integer", err, errlen);
            break;
        }
        uint32_t nref = 0;
        if (!field_is(r, 6, "-")) {
            const char *s = r->f[6], *e = r->f[6] + r->flen[6];
            for (;;) {
                const char *c = memchr(s, ',', (size_t)(e - s));
                const char *ce = c ? c : e;
                const char *colon = memchr(s, ':', (size_t)(ce - s));
                const char *at = colon ? memchr(colon, '@', (size_t)(ce - colon)) : NULL;
                const char *ae = at ? at : ce; /* the access ends at '@' when a word follows */
                uint64_t v, wb = 0;
                uint8_t acc = 0;
                if (at && (parse_u64(at + 1, (size_t)(ce - at - 1), &wb) || wb % 8 ||
                           wb / 8 >= UINT16_MAX)) {
                    rc = bad(r, 6, "refs",
                             "has a parameter byte after '@' that is not a multiple of 8 below "
                             "524280",
                             err, errlen);
                    goto out;
                }
                if (colon) {
                    size_t al = (size_t)(ae - colon - 1);
                    if (al == 1 && colon[1] == 'r')
                        acc = OOC_ACCESS_R;
                    else if (al == 1 && colon[1] == 'w')
                        acc = OOC_ACCESS_W;
                    else if (al == 2 && colon[1] == 'r' && colon[2] == 'w')
                        acc = OOC_ACCESS_RW;
                }
                if (!colon || !acc || parse_u64(s, (size_t)(colon - s), &v) || v > INT32_MAX) {
                    rc = bad(r, 6, "refs", "is not '-' or a list of BUFFER:r|w|rw[@BYTE]", err,
                             errlen);
                    goto out;
                }
                if (ooc_grow32(&refs, &cap, nref + 1, sizeof *refs, 16)) {
                    rc = OOC_ENOMEM;
                    goto out;
                }
                refs[nref].buf = (int32_t)v;
                refs[nref].access = acc;
                refs[nref].word = at ? (uint16_t)(wb / 8 + 1) : 0;
                nref++;
                if (!c)
                    break;
                s = c + 1;
            }
        }
        char *name = field_dup(r, 3), *shape = field_dup(r, 4);
        if (!name || !shape) {
            free(name);
            free(shape);
            rc = OOC_ENOMEM;
            break;
        }
        rc = ooc_profile_add_op(p, (int32_t)stream, (ooc_op_kind_t)kind, name, shape, dur, refs,
                                nref);
        free(name);
        free(shape);
        if (rc < 0)
            break;
    }
out:
    free(refs);
    return rc < 0 ? rc : 0;
}

int ooc_profile_parse(const char *meta, size_t meta_len, const char *bufs, size_t bufs_len,
                      const char *ops, size_t ops_len, ooc_profile_t **out, char *err,
                      size_t errlen) {
    *out = NULL;
    ooc_profile_t *p = ooc_profile_new();
    if (!p)
        return OOC_ENOMEM;
    ooc_tsv_t r = {.name = "meta.tsv", .s = meta, .end = meta + meta_len};
    int rc = parse_meta(p, &r, err, errlen);
    if (rc == 0) {
        ooc_tsv_t rb = {.name = "buffers.tsv", .s = bufs, .end = bufs + bufs_len};
        rc = parse_buffers(p, &rb, err, errlen);
    }
    if (rc == 0) {
        ooc_tsv_t ro = {.name = "ops.tsv", .s = ops, .end = ops + ops_len};
        rc = parse_ops(p, &ro, err, errlen);
    }
    if (rc == 0)
        rc = ooc_profile_validate(p, err, errlen);
    if (rc) {
        if (rc == OOC_ENOMEM)
            ooc_msg_say(err, errlen, "out of memory while reading the profile");
        ooc_profile_free(p);
        return rc;
    }
    *out = p;
    return 0;
}

/* Reads a whole file (at most 1 GiB) into a malloc'd buffer. */
static int slurp(const char *path, char **data, size_t *len, char *err, size_t errlen) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        ooc_msg_say(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return OOC_EIO;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    int rc = 0;
    while (buf) {
        if (n == cap) {
            if (cap >= (1u << 30)) {
                ooc_msg_say(err, errlen, "%s: larger than 1 GiB", path);
                rc = OOC_EFORMAT;
                break;
            }
            char *nb = realloc(buf, cap * 2);
            if (!nb)
                break;
            buf = nb;
            cap *= 2;
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0) {
            if (ferror(f)) {
                ooc_msg_say(err, errlen, "%s: read error", path);
                rc = OOC_EIO;
            }
            break;
        }
    }
    fclose(f);
    if (!buf)
        return OOC_ENOMEM;
    if (rc) {
        free(buf);
        return rc;
    }
    *data = buf;
    *len = n;
    return 0;
}

int ooc_profile_read(const char *dir, ooc_profile_t **out, char *err, size_t errlen) {
    static const char *const names[3] = {"meta.tsv", "buffers.tsv", "ops.tsv"};
    char *data[3] = {0};
    size_t len[3] = {0};
    int rc = 0;
    *out = NULL;
    for (int i = 0; i < 3 && rc == 0; i++) {
        char path[4096];
        if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, names[i]) >= sizeof path) {
            ooc_msg_say(err, errlen, "%s: path too long", dir);
            rc = OOC_EINVAL;
            break;
        }
        rc = slurp(path, &data[i], &len[i], err, errlen);
    }
    if (rc == 0) {
        char e2[512] = "";
        rc = ooc_profile_parse(data[0], len[0], data[1], len[1], data[2], len[2], out, e2,
                               sizeof e2);
        if (rc)
            ooc_msg_say(err, errlen, "%s/%s", dir, e2);
    }
    for (int i = 0; i < 3; i++)
        free(data[i]);
    return rc;
}

/* ---- writing ----------------------------------------------------------------------------------
 */

/* Writes s with tabs, newlines and carriage returns replaced by spaces ('-' when empty). */
static void put_clean(FILE *f, const char *s) {
    if (!*s) {
        fputc('-', f);
        return;
    }
    for (; *s; s++)
        fputc((*s == '\t' || *s == '\n' || *s == '\r') ? ' ' : *s, f);
}

static FILE *open_out(const char *dir, const char *name, char *err, size_t errlen) {
    char path[4096];
    if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, name) >= sizeof path) {
        ooc_msg_say(err, errlen, "%s: path too long", dir);
        return NULL;
    }
    FILE *f = fopen(path, "w");
    if (!f)
        ooc_msg_say(err, errlen, "%s: cannot create: %s", path, strerror(errno));
    return f;
}

static int close_out(FILE *f, const char *dir, const char *name, char *err, size_t errlen) {
    int bad_write = ferror(f);
    if (fclose(f) != 0 || bad_write) {
        ooc_msg_say(err, errlen, "%s/%s: write error", dir, name);
        return OOC_EIO;
    }
    return 0;
}

int ooc_profile_write(const ooc_profile_t *p, const char *dir, char *err, size_t errlen) {
    int rc = ooc_profile_validate(p, err, errlen);
    if (rc)
        return rc;
    FILE *f = open_out(dir, "meta.tsv", err, errlen);
    if (!f)
        return OOC_EIO;
    fprintf(f, "#ooc-profile\tmeta\t%d\nkey\tvalue\n", OOC_FORMAT_VERSION);
    fprintf(f, "format_version\t%d\nprogram\t", OOC_FORMAT_VERSION);
    put_clean(f, p->program);
    fprintf(f, "\ndevice\t");
    put_clean(f, p->device);
    fprintf(f, "\ndevice_mem_bytes\t%llu\nbudget_bytes\t%llu\nchunk_bytes\t%llu\n",
            (unsigned long long)p->device_mem_bytes, (unsigned long long)p->budget_bytes,
            (unsigned long long)p->chunk_bytes);
    fprintf(f, "h2d_bps\t%.17g\nd2h_bps\t%.17g\nbidir_bps\t%.17g\niterations\t%u\n", p->h2d_bps,
            p->d2h_bps, p->bidir_bps, p->iterations);
    if (p->swapin_exclusive)
        fprintf(f, "swapin_exclusive\t1\n");
    if (p->swapout_exclusive)
        fprintf(f, "swapout_exclusive\t1\n");
    if (p->remap_gate)
        fprintf(f, "remap_gate\t1\n");
    if (p->swapin_vmm_ns || p->swapout_vmm_ns)
        fprintf(f, "swapin_vmm_ns\t%llu\nswapout_vmm_ns\t%llu\n",
                (unsigned long long)p->swapin_vmm_ns, (unsigned long long)p->swapout_vmm_ns);
    if (p->map_vmm_ns || p->unmap_vmm_ns)
        fprintf(f, "map_vmm_ns\t%llu\nunmap_vmm_ns\t%llu\n", (unsigned long long)p->map_vmm_ns,
                (unsigned long long)p->unmap_vmm_ns);
    if (p->stage_vmm_ns || p->adopt_vmm_ns)
        fprintf(f, "stage_vmm_ns\t%llu\nadopt_vmm_ns\t%llu\n", (unsigned long long)p->stage_vmm_ns,
                (unsigned long long)p->adopt_vmm_ns);
    if ((rc = close_out(f, dir, "meta.tsv", err, errlen)))
        return rc;

    if (!(f = open_out(dir, "buffers.tsv", err, errlen)))
        return OOC_EIO;
    fprintf(f,
            "#ooc-profile\tbuffers\t%d\nid\tbytes\talloc_idx\tfree_idx\tpersistent\tsite\t"
            "producers\n",
            OOC_FORMAT_VERSION);
    for (uint32_t i = 0; i < p->nbufs; i++) {
        const ooc_buffer_t *b = &p->bufs[i];
        fprintf(f, "%u\t%llu\t%lld\t%lld\t%u\t", i, (unsigned long long)b->bytes,
                (long long)b->alloc_idx, (long long)b->free_idx, (unsigned)b->persistent);
        put_clean(f, b->site);
        fputc('\t', f);
        if (b->nprod == 0)
            fputc('-', f);
        for (uint32_t k = 0; k < b->nprod; k++)
            fprintf(f, "%s%d", k ? "," : "", (int)p->prods[b->prod_off + k]);
        fputc('\n', f);
    }
    if ((rc = close_out(f, dir, "buffers.tsv", err, errlen)))
        return rc;

    if (!(f = open_out(dir, "ops.tsv", err, errlen)))
        return OOC_EIO;
    fprintf(f, "#ooc-profile\tops\t%d\nidx\tstream\tkind\tname\tshape\tduration_ns\trefs\n",
            OOC_FORMAT_VERSION);
    static const char *const acc[4] = {"?", "r", "w", "rw"};
    for (uint32_t i = 0; i < p->nops; i++) {
        const ooc_op_t *o = &p->ops[i];
        fprintf(f, "%u\t%d\t%s\t", i, (int)o->stream, ooc_kind_name((ooc_op_kind_t)o->kind));
        put_clean(f, o->name);
        fputc('\t', f);
        put_clean(f, o->shape);
        fprintf(f, "\t%llu\t", (unsigned long long)o->duration_ns);
        if (o->nref == 0)
            fputc('-', f);
        for (uint32_t k = 0; k < o->nref; k++) {
            const ooc_ref_t *r = &p->refs[o->ref_off + k];
            fprintf(f, "%s%d:%s", k ? "," : "", (int)r->buf, acc[r->access & 3]);
            if (r->word)
                fprintf(f, "@%u", (unsigned)(r->word - 1) * 8);
        }
        fputc('\n', f);
    }
    return close_out(f, dir, "ops.tsv", err, errlen);
}
