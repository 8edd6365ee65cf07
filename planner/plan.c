/* SPDX-License-Identifier: MIT */
/* plan.c: the plan (keep/swap/recompute per buffer, actions per op) in memory and as the TSV file
 * that profiles/FORMAT.md specifies.
 *
 * A plan is a list of actions attached to ops, "before" or "after" each, in replay order. The
 * per-buffer decisions are a summary derived from the actions by ooc_plan_finalize, so the two
 * can never disagree; the reader checks that the file's summary rows match its actions. */
#include "ooc_planner.h"
#include "grow.h"
#include "msg.h"
#include "tsv.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static const char *const act_names[OOC_ACT_COUNT] = {"swapin", "wait", "recompute", "drop",
                                                     "swapout"};
static const char *const dec_names[3] = {"keep", "swap", "recompute"};

const char *ooc_act_name(ooc_act_kind_t k) {
    return (unsigned)k < OOC_ACT_COUNT ? act_names[k] : "?";
}

const char *ooc_decision_name(ooc_decision_t d) {
    return (unsigned)d < 3 ? dec_names[d] : "?";
}

ooc_plan_t *ooc_plan_new(const char *policy, uint32_t nops, uint32_t nbufs, uint64_t budget_bytes,
                         uint64_t chunk_bytes) {
    ooc_plan_t *pl = calloc(1, sizeof *pl);
    if (!pl)
        return NULL;
    snprintf(pl->policy, sizeof pl->policy, "%s", policy ? policy : "-");
    pl->nops = nops;
    pl->nbufs = nbufs;
    pl->budget_bytes = budget_bytes;
    pl->chunk_bytes = chunk_bytes;
    pl->decision = calloc(nbufs ? nbufs : 1, 1);
    pl->start_host = calloc(nbufs ? nbufs : 1, 1);
    if (!pl->decision || !pl->start_host) {
        ooc_plan_free(pl);
        return NULL;
    }
    return pl;
}

void ooc_plan_free(ooc_plan_t *pl) {
    if (!pl)
        return;
    free(pl->decision);
    free(pl->start_host);
    free(pl->acts);
    free(pl->via);
    free(pl);
}

int ooc_plan_add(ooc_plan_t *pl, int32_t op, ooc_when_t when, ooc_act_kind_t kind, int32_t buf,
                 const int32_t *via, uint32_t nvia) {
    if (op < 0 || (uint32_t)op >= pl->nops || buf < 0 || (uint32_t)buf >= pl->nbufs ||
        (unsigned)kind >= OOC_ACT_COUNT)
        return OOC_EINVAL;
    if (ooc_grow32(&pl->acts, &pl->acts_cap, pl->nacts + 1, sizeof *pl->acts, 64) ||
        ooc_grow32(&pl->via, &pl->via_cap, pl->nvia + nvia, sizeof *pl->via, 64))
        return OOC_ENOMEM;
    ooc_action_t *a = &pl->acts[pl->nacts++];
    a->op = op;
    a->when = (uint8_t)when;
    a->kind = (uint8_t)kind;
    a->buf = buf;
    a->via_off = pl->nvia;
    a->nvia = nvia;
    if (nvia)
        memcpy(pl->via + pl->nvia, via, nvia * sizeof *via);
    pl->nvia += nvia;
    return 0;
}

/* The replay position of an action: op, then before/after, then kind. Actions equal under it
 * keep the order they were added in (the planner's choice, e.g. which swap-in the copy engine
 * starts first), so the sort below is stable. */
static int act_cmp(const ooc_action_t *a, const ooc_action_t *b) {
    if (a->op != b->op)
        return a->op < b->op ? -1 : 1;
    if (a->when != b->when)
        return a->when < b->when ? -1 : 1;
    if (a->kind != b->kind)
        return a->kind < b->kind ? -1 : 1;
    return 0;
}

/* Stable insertion sort by act_cmp: near-linear on the small (op, when) buckets, quadratic only
 * as the fallback when memory for the counting sort is short. */
static void insertion_sort(ooc_action_t *v, uint32_t n) {
    for (uint32_t i = 1; i < n; i++) {
        ooc_action_t a = v[i];
        uint32_t j = i;
        while (j > 0 && act_cmp(&v[j - 1], &a) > 0) {
            v[j] = v[j - 1];
            j--;
        }
        v[j] = a;
    }
}

/* Orders the actions by (op, when) with a counting sort, then by kind within each (small)
 * bucket, both stable: actions equal in (op, when, kind) stay in the order they were added. */
static void sort_actions(ooc_plan_t *pl) {
    uint32_t nk = 2 * pl->nops + 1;
    uint32_t *cnt = pl->nacts > 64 ? calloc(nk + 1, sizeof *cnt) : NULL;
    ooc_action_t *tmp = cnt ? malloc(pl->nacts * sizeof *tmp) : NULL;
    if (!tmp) {
        free(cnt);
        insertion_sort(pl->acts, pl->nacts);
        return;
    }
    for (uint32_t i = 0; i < pl->nacts; i++)
        cnt[2 * (uint32_t)pl->acts[i].op + pl->acts[i].when + 1]++;
    for (uint32_t k = 0; k < nk; k++)
        cnt[k + 1] += cnt[k];
    for (uint32_t i = 0; i < pl->nacts; i++)
        tmp[cnt[2 * (uint32_t)pl->acts[i].op + pl->acts[i].when]++] = pl->acts[i];
    free(cnt);
    insertion_sort(tmp, pl->nacts);
    memcpy(pl->acts, tmp, pl->nacts * sizeof *tmp);
    free(tmp);
}

/* Does acts[i] repeat (same buffer) an action of acts[from..i), all of one (op, when, kind)?
 * seen (NULL: scan the range) holds, per buffer, from + 1 once that buffer is in the range;
 * ranges must be visited in increasing `from`. */
static int repeats(const ooc_plan_t *pl, uint32_t from, uint32_t i, uint32_t *seen) {
    int32_t b = pl->acts[i].buf;
    if (seen) {
        if (seen[b] == from + 1)
            return 1;
        seen[b] = from + 1;
        return 0;
    }
    for (uint32_t k = from; k < i; k++)
        if (pl->acts[k].buf == b)
            return 1;
    return 0;
}

/* The first recompute that repeats one of the same buffer before the same op, or -1. */
static int64_t repeated_recompute(const ooc_plan_t *pl) {
    uint32_t *seen = calloc(pl->nbufs ? pl->nbufs : 1, sizeof *seen);
    int64_t hit = -1;
    for (uint32_t from = 0, i = 0; i < pl->nacts && hit < 0; i++) {
        if (act_cmp(&pl->acts[from], &pl->acts[i]) != 0)
            from = i;
        if (pl->acts[i].kind == OOC_ACT_RECOMPUTE && repeats(pl, from, i, seen))
            hit = i;
    }
    free(seen);
    return hit;
}

void ooc_plan_finalize(ooc_plan_t *pl) {
    sort_actions(pl);
    /* identical swap-in/wait/drop/swap-out rows are one action (the first kept); no longer
     * adjacent once the order within (op, when, kind) is the planner's, so found per bucket */
    uint32_t *seen = calloc(pl->nbufs ? pl->nbufs : 1, sizeof *seen);
    uint32_t w = 0, from = 0;
    for (uint32_t i = 0; i < pl->nacts; i++) {
        if (w == 0 || act_cmp(&pl->acts[from], &pl->acts[i]) != 0)
            from = w;
        pl->acts[w] = pl->acts[i];
        if (pl->acts[w].kind != OOC_ACT_RECOMPUTE && repeats(pl, from, w, seen))
            continue;
        w++;
    }
    free(seen);
    pl->nacts = w;
    for (uint32_t b = 0; b < pl->nbufs; b++)
        pl->decision[b] = pl->start_host[b] ? OOC_SWAP : OOC_KEEP;
    for (uint32_t i = 0; i < pl->nacts; i++) {
        const ooc_action_t *a = &pl->acts[i];
        if (a->kind == OOC_ACT_RECOMPUTE)
            pl->decision[a->buf] = OOC_RECOMPUTE;
        else if ((a->kind == OOC_ACT_SWAPIN || a->kind == OOC_ACT_SWAPOUT) &&
                 pl->decision[a->buf] == OOC_KEEP)
            pl->decision[a->buf] = OOC_SWAP;
    }
}

int ooc_plan_write(const ooc_plan_t *pl, FILE *f) {
    fprintf(f, "#ooc-plan\t%d\tpolicy=%s\tbudget_bytes=%llu\tchunk_bytes=%llu\tnops=%u\tnbufs=%u\n",
            OOC_FORMAT_VERSION, pl->policy, (unsigned long long)pl->budget_bytes,
            (unsigned long long)pl->chunk_bytes, pl->nops, pl->nbufs);
    fprintf(f, "type\top\tbuffer\taction\tvia\n");
    for (uint32_t b = 0; b < pl->nbufs; b++)
        if (pl->decision[b] != OOC_KEEP)
            fprintf(f, "buffer\t-\t%u\t%s\t-\n", b, dec_names[pl->decision[b]]);
    for (uint32_t b = 0; b < pl->nbufs; b++)
        if (pl->start_host[b])
            fprintf(f, "start\t-\t%u\thost\t-\n", b);
    for (uint32_t i = 0; i < pl->nacts; i++) {
        const ooc_action_t *a = &pl->acts[i];
        fprintf(f, "%s\t%d\t%d\t%s\t", a->when == OOC_BEFORE ? "before" : "after", (int)a->op,
                (int)a->buf, act_names[a->kind]);
        if (a->nvia == 0)
            fputc('-', f);
        for (uint32_t k = 0; k < a->nvia; k++)
            fprintf(f, "%s%d", k ? "," : "", (int)pl->via[a->via_off + k]);
        fputc('\n', f);
    }
    return ferror(f) ? OOC_EIO : 0;
}

int ooc_plan_write_file(const ooc_plan_t *pl, const char *path, char *err, size_t errlen) {
    FILE *f = fopen(path, "w");
    if (!f) {
        ooc_msg_say(err, errlen, "%s: cannot create: %s", path, strerror(errno));
        return OOC_EIO;
    }
    int rc = ooc_plan_write(pl, f);
    if (fclose(f) != 0 || rc) {
        ooc_msg_say(err, errlen, "%s: write error", path);
        return OOC_EIO;
    }
    return 0;
}

/* ---- reading ----------------------------------------------------------------------------------
 */

static int num(const char *s, size_t n, uint64_t max, uint64_t *out) {
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
    if (v > max)
        return -1;
    *out = v;
    return 0;
}

static int is(const char *s, size_t n, const char *w) {
    return n == strlen(w) && memcmp(s, w, n) == 0;
}

/* "key=NUMBER" (or "policy=NAME") in field f. */
static int kv(const char *f, size_t n, const char *key, const char **val, size_t *vlen) {
    size_t k = strlen(key);
    if (n <= k || memcmp(f, key, k) != 0 || f[k] != '=')
        return -1;
    *val = f + k + 1;
    *vlen = n - k - 1;
    return 0;
}

int ooc_plan_parse(const char *text, size_t len, const char *name, ooc_plan_t **out, char *err,
                   size_t errlen) {
    *out = NULL;
    ooc_tsv_t t = {.name = name, .s = text, .end = text + len};
    const char *const *fld = t.f;
    const size_t *flen = t.flen;
    unsigned line = 0;
    ooc_plan_t *pl = NULL;
    uint8_t *seen_dec = NULL;
    int rc = OOC_EFORMAT;
    int32_t *via = NULL;
    uint32_t via_cap = 0;
    static const char *const hdr_keys[5] = {"policy", "budget_bytes", "chunk_bytes", "nops",
                                            "nbufs"};
    for (;;) {
        int got = ooc_tsv_next(&t, 8);
        line = t.line;
        if (got == OOC_TSV_END)
            break;
        if (got == OOC_TSV_EMPTY || got == OOC_TSV_NUL) {
            ooc_msg_say(err, errlen, "%s:%u: empty line or NUL byte", name, line);
            goto fail;
        }
        if (got != OOC_TSV_LINE) {
            ooc_msg_say(err, errlen, "%s:%u: too many fields", name, line);
            goto fail;
        }
        int nf = t.nf;
        if (line == 1) {
            if (nf != 7 || !is(fld[0], flen[0], "#ooc-plan")) {
                ooc_msg_say(err, errlen,
                            "%s:1: field header: expected \"#ooc-plan<TAB>1<TAB>policy=...<TAB>"
                            "budget_bytes=...<TAB>chunk_bytes=...<TAB>nops=...<TAB>nbufs=...\"",
                            name);
                goto fail;
            }
            if (!is(fld[1], flen[1], "1")) {
                ooc_msg_say(err, errlen, "%s:1: field version: not a supported format version (1)",
                            name);
                goto fail;
            }
            uint64_t v[5] = {0};
            char policy[32] = "";
            for (int k = 0; k < 5; k++) {
                const char *val;
                size_t vl;
                if (kv(fld[k + 2], flen[k + 2], hdr_keys[k], &val, &vl)) {
                    ooc_msg_say(err, errlen, "%s:1: field %s: expected %s=VALUE", name, hdr_keys[k],
                                hdr_keys[k]);
                    goto fail;
                }
                if (k == 0) {
                    if (vl >= sizeof policy) {
                        ooc_msg_say(err, errlen, "%s:1: field policy: too long", name);
                        goto fail;
                    }
                    memcpy(policy, val, vl);
                    policy[vl] = '\0';
                } else if (num(val, vl, k >= 3 ? INT32_MAX : UINT64_MAX, &v[k]) ||
                           (k == 2 && (v[2] == 0 || (v[2] & (v[2] - 1))))) {
                    ooc_msg_say(err, errlen, "%s:1: field %s: bad value", name, hdr_keys[k]);
                    goto fail;
                }
            }
            if (v[4] > (64u << 20) || v[3] > (64u << 20)) {
                ooc_msg_say(err, errlen, "%s:1: field nops/nbufs: larger than 2^26", name);
                goto fail;
            }
            pl = ooc_plan_new(policy, (uint32_t)v[3], (uint32_t)v[4], v[1], v[2]);
            seen_dec = calloc(v[4] ? v[4] : 1, 1);
            if (!pl || !seen_dec) {
                rc = OOC_ENOMEM;
                goto fail;
            }
            continue;
        }
        if (line == 2) {
            if (nf != 5 || !is(fld[0], flen[0], "type") || !is(fld[1], flen[1], "op") ||
                !is(fld[2], flen[2], "buffer") || !is(fld[3], flen[3], "action") ||
                !is(fld[4], flen[4], "via")) {
                ooc_msg_say(err, errlen, "%s:2: field columns: expected type op buffer action via",
                            name);
                goto fail;
            }
            continue;
        }
        if (nf != 5) {
            ooc_msg_say(err, errlen, "%s:%u: field type: expected 5 fields, found %d", name, line,
                        nf);
            goto fail;
        }
        uint64_t b;
        if (num(fld[2], flen[2], pl->nbufs ? pl->nbufs - 1 : 0, &b) || pl->nbufs == 0) {
            ooc_msg_say(err, errlen, "%s:%u: field buffer: not a buffer id below nbufs=%u", name,
                        line, pl->nbufs);
            goto fail;
        }
        if (is(fld[0], flen[0], "buffer") || is(fld[0], flen[0], "start")) {
            int start = is(fld[0], flen[0], "start");
            if (!is(fld[1], flen[1], "-") || !is(fld[4], flen[4], "-")) {
                ooc_msg_say(err, errlen, "%s:%u: field op: must be '-' (and via '-') in a %s row",
                            name, line, start ? "start" : "buffer");
                goto fail;
            }
            if (start) {
                if (!is(fld[3], flen[3], "host")) {
                    ooc_msg_say(err, errlen, "%s:%u: field action: a start row says 'host'", name,
                                line);
                    goto fail;
                }
                if (pl->start_host[b]) {
                    ooc_msg_say(err, errlen, "%s:%u: field buffer: start row repeated", name, line);
                    goto fail;
                }
                pl->start_host[b] = 1;
            } else {
                int d = -1;
                for (int k = 1; k < 3; k++)
                    if (is(fld[3], flen[3], dec_names[k]))
                        d = k;
                if (d < 0 || seen_dec[b]) {
                    ooc_msg_say(err, errlen,
                                "%s:%u: field action: not swap|recompute, or buffer repeated", name,
                                line);
                    goto fail;
                }
                seen_dec[b] = (uint8_t)d;
            }
            continue;
        }
        int when = is(fld[0], flen[0], "before")  ? OOC_BEFORE
                   : is(fld[0], flen[0], "after") ? OOC_AFTER
                                                  : -1;
        if (when < 0) {
            ooc_msg_say(err, errlen, "%s:%u: field type: not buffer|start|before|after", name,
                        line);
            goto fail;
        }
        uint64_t op;
        if (pl->nops == 0 || num(fld[1], flen[1], pl->nops - 1, &op)) {
            ooc_msg_say(err, errlen, "%s:%u: field op: not an op index below nops=%u", name, line,
                        pl->nops);
            goto fail;
        }
        int kind = -1;
        for (int k = 0; k < OOC_ACT_COUNT; k++)
            if (is(fld[3], flen[3], act_names[k]))
                kind = k;
        int before_kind =
            kind == OOC_ACT_SWAPIN || kind == OOC_ACT_WAIT || kind == OOC_ACT_RECOMPUTE;
        if (kind < 0 || (when == OOC_BEFORE) != before_kind) {
            ooc_msg_say(err, errlen,
                        "%s:%u: field action: expected swapin|wait|recompute before an op, "
                        "drop|swapout after one",
                        name, line);
            goto fail;
        }
        uint32_t nvia = 0;
        if (kind == OOC_ACT_RECOMPUTE) {
            const char *p = fld[4], *e = fld[4] + flen[4];
            for (;;) {
                const char *c = memchr(p, ',', (size_t)(e - p));
                const char *ce = c ? c : e;
                uint64_t v;
                if (num(p, (size_t)(ce - p), pl->nops - 1, &v) || nvia >= 4096) {
                    ooc_msg_say(err, errlen, "%s:%u: field via: not a list of op indices", name,
                                line);
                    goto fail;
                }
                if (ooc_grow32(&via, &via_cap, nvia + 1, sizeof *via, 16)) {
                    rc = OOC_ENOMEM;
                    goto fail;
                }
                via[nvia++] = (int32_t)v;
                if (!c)
                    break;
                p = c + 1;
            }
        } else if (!is(fld[4], flen[4], "-")) {
            ooc_msg_say(err, errlen, "%s:%u: field via: must be '-' for %s", name, line,
                        act_names[kind]);
            goto fail;
        }
        if ((rc = ooc_plan_add(pl, (int32_t)op, (ooc_when_t)when, (ooc_act_kind_t)kind, (int32_t)b,
                               via, nvia)))
            goto fail;
        rc = OOC_EFORMAT;
    }
    if (!pl) {
        ooc_msg_say(err, errlen, "%s:1: field header: the file is empty", name);
        goto fail;
    }
    if (line < 2) {
        ooc_msg_say(err, errlen, "%s:2: field columns: missing", name);
        goto fail;
    }
    ooc_plan_finalize(pl);
    int64_t dup = repeated_recompute(pl);
    if (dup >= 0) {
        const ooc_action_t *a = &pl->acts[dup];
        ooc_msg_say(err, errlen, "%s: field action: %s of buffer %d at op %d given twice", name,
                    act_names[a->kind], (int)a->buf, (int)a->op);
        goto fail;
    }
    for (uint32_t b2 = 0; b2 < pl->nbufs; b2++)
        if (seen_dec[b2] != pl->decision[b2]) {
            ooc_msg_say(err, errlen,
                        "%s: field buffer: buffer %u is marked %s but its actions say %s", name, b2,
                        dec_names[seen_dec[b2]], dec_names[pl->decision[b2]]);
            goto fail;
        }
    free(seen_dec);
    free(via);
    *out = pl;
    return 0;
fail:
    if (rc == OOC_ENOMEM)
        ooc_msg_say(err, errlen, "%s: out of memory", name);
    free(seen_dec);
    free(via);
    ooc_plan_free(pl);
    return rc;
}

int ooc_plan_read_file(const char *path, ooc_plan_t **out, char *err, size_t errlen) {
    FILE *f = fopen(path, "rb");
    *out = NULL;
    if (!f) {
        ooc_msg_say(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return OOC_EIO;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        if (n == cap) {
            char *nb = cap < (1u << 30) ? realloc(buf, cap * 2) : NULL;
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0)
            break;
    }
    fclose(f);
    if (!buf) {
        ooc_msg_say(err, errlen, "%s: out of memory or larger than 1 GiB", path);
        return OOC_ENOMEM;
    }
    int rc = ooc_plan_parse(buf, n, path, out, err, errlen);
    free(buf);
    return rc;
}
