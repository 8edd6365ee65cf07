/* SPDX-License-Identifier: MIT */
/* model.c: facts derived once from a profile (footprints, uses, working sets, which buffers may
 * be recomputed). The lower bound on iteration time is in bound.c.
 *
 * A model borrows its profile and is read-only after ooc_model_build, so the simulator and every
 * policy can share one. Recompute eligibility follows the recompute rule (docs/planner.md): the
 * profile must list producer ops verified re-executable, none of them a copy, memset or host op
 * (the shim re-launches kernels and library calls only); each producer must write the buffer and
 * nothing else; no later op may write the buffer; and the buffers the producers read must not be
 * written or freed before the recompute point (kept per buffer as recomp_until). Residency of those
 * inputs at that point is checked by the simulator, since it depends on the plan. */
#include "ooc_planner.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

uint64_t ooc_model_fp(uint64_t bytes, uint64_t chunk_bytes) {
    if (bytes * 8 > chunk_bytes) /* the shim's rule (shim/buffer.c): above chunk/8, whole chunks */
        return (bytes + chunk_bytes - 1) / chunk_bytes * chunk_bytes;
    return (bytes + 255) / 256 * 256;
}

void ooc_model_free(ooc_model_t *m) {
    if (!m)
        return;
    free(m->fp);
    free(m->use_off);
    free(m->nuse);
    free(m->uses);
    free(m->written);
    free(m->recomp);
    free(m->recomp_until);
    free(m->ws);
    free(m->heavy);
    free(m->free_off);
    free(m->frees);
    free(m);
}

/* Compute-heavy ops (SuperNeurons' checkpoints), by the op's kind and name: every cuBLAS call
 * (GEMMs); a cuDNN call when it convolves, multiplies matrices or attends (the shim names cuDNN
 * ops by function, cudnnConvolutionForward, and backend executions by what their plan computes,
 * cudnnBackendExecute:conv_fwd+pointwise; an execution whose plan was not seen counts as heavy),
 * not batch norm, activation, pooling, softmax or tensor arithmetic, which are cheap to redo;
 * a kernel whose name says convolution, GEMM, matmul, linear or attention. */
static int is_heavy(const ooc_op_t *o) {
    if (o->kind == OOC_KIND_CUBLAS)
        return 1;
    if (o->kind == OOC_KIND_CUDNN) {
        static const char *const dnn[] = {"Convolution", "conv", "matmul",
                                          "sdpa",        "RNN",  "MultiHead"};
        if (strcmp(o->name, "cudnnBackendExecute") == 0)
            return 1;
        for (size_t i = 0; i < sizeof dnn / sizeof dnn[0]; i++)
            if (strstr(o->name, dnn[i]))
                return 1;
        return 0;
    }
    static const char *const words[] = {"conv", "gemm", "matmul", "linear", "attn", "fc_"};
    for (size_t i = 0; i < sizeof words / sizeof words[0]; i++)
        if (strstr(o->name, words[i]))
            return 1;
    return 0;
}

/* Decides whether buffer b may be recomputed, and until which op. */
static void recompute_rule(ooc_model_t *m, int32_t b) {
    const ooc_profile_t *p = m->prof;
    const ooc_buffer_t *bf = &p->bufs[b];
    m->recomp[b] = 0;
    m->recomp_until[b] = -1;
    if (bf->persistent || bf->nprod == 0 || bf->alloc_idx < 0 || m->nuse[b] == 0)
        return;
    int32_t until = (int32_t)m->n - 1;
    if (bf->free_idx >= 0 && bf->free_idx < until)
        until = (int32_t)bf->free_idx;
    int32_t last_prod = -1;
    int writes_b = 0;
    for (uint32_t k = 0; k < bf->nprod; k++) {
        int32_t op = p->prods[bf->prod_off + k];
        const ooc_op_t *o = &p->ops[op];
        last_prod = op;
        /* copies, memsets, collectives and host work are never producers: the shim re-launches
         * kernels (and library calls) only, a copy from the host would cost a transfer, not
         * compute, and a collective run again on one rank alone would wait for the others */
        if (o->kind == OOC_KIND_MEMCPY || o->kind == OOC_KIND_MEMSET || o->kind == OOC_KIND_HOST ||
            o->kind == OOC_KIND_NCCL)
            return;
        for (uint32_t r = 0; r < o->nref; r++) {
            const ooc_ref_t *rf = &p->refs[o->ref_off + r];
            if (rf->buf == b) {
                if (rf->access != OOC_ACCESS_W)
                    return; /* reads its own output: not a pure producer */
                writes_b = 1;
            } else if (rf->access != OOC_ACCESS_R) {
                return; /* a side effect on another buffer: re-launching would repeat it */
            }
        }
    }
    if (!writes_b || last_prod != m->uses[m->use_off[b]])
        return; /* the producers must be the buffer's first users */
    /* ...and its only writers: a later write (an in-place op on the producer's output) would be
     * lost by a re-launch of the producers. */
    for (uint32_t u = 0; u < m->nuse[b]; u++) {
        int32_t op = m->uses[m->use_off[b] + u];
        if (op <= last_prod)
            continue;
        const ooc_op_t *wo = &p->ops[op];
        for (uint32_t q = 0; q < wo->nref; q++)
            if (p->refs[wo->ref_off + q].buf == b &&
                (p->refs[wo->ref_off + q].access & OOC_ACCESS_W))
                return;
    }
    for (uint32_t k = 0; k < bf->nprod; k++) {
        const ooc_op_t *o = &p->ops[p->prods[bf->prod_off + k]];
        for (uint32_t r = 0; r < o->nref; r++) {
            int32_t x = p->refs[o->ref_off + r].buf;
            if (x == b)
                continue;
            const ooc_buffer_t *xb = &p->bufs[x];
            if (xb->free_idx >= 0 && xb->free_idx < until)
                until = (int32_t)xb->free_idx;
            /* a non-persistent input is dropped after its last use */
            if (!xb->persistent && m->nuse[x] > 0) {
                int32_t lu = m->uses[m->use_off[x] + m->nuse[x] - 1];
                if (lu < until)
                    until = lu;
            }
            /* the first write to x after the last producer ends the window */
            for (uint32_t u = 0; u < m->nuse[x]; u++) {
                int32_t op = m->uses[m->use_off[x] + u];
                if (op <= last_prod || op > until)
                    continue;
                const ooc_op_t *wo = &p->ops[op];
                for (uint32_t q = 0; q < wo->nref; q++)
                    if (p->refs[wo->ref_off + q].buf == x &&
                        (p->refs[wo->ref_off + q].access & OOC_ACCESS_W))
                        until = op - 1 < until ? op - 1 : until;
            }
        }
    }
    if (until > last_prod + 1) {
        m->recomp[b] = 1;
        m->recomp_until[b] = until;
    }
}

int ooc_model_build(const ooc_profile_t *p, uint64_t chunk_bytes, ooc_model_t **out) {
    *out = NULL;
    if (chunk_bytes == 0 || (chunk_bytes & (chunk_bytes - 1)))
        return OOC_EINVAL;
    ooc_model_t *m = calloc(1, sizeof *m);
    if (!m)
        return OOC_ENOMEM;
    m->prof = p;
    m->chunk_bytes = chunk_bytes;
    m->n = p->nops;
    m->nb = p->nbufs;
    size_t nb = p->nbufs ? p->nbufs : 1, n = p->nops ? p->nops : 1;
    m->fp = calloc(nb, sizeof *m->fp);
    m->use_off = calloc(nb + 1, sizeof *m->use_off);
    m->nuse = calloc(nb, sizeof *m->nuse);
    m->uses = calloc(p->nrefs ? p->nrefs : 1, sizeof *m->uses);
    m->written = calloc(p->nrefs ? p->nrefs : 1, 1);
    m->recomp = calloc(nb, 1);
    m->recomp_until = calloc(nb, sizeof *m->recomp_until);
    m->ws = calloc(n, sizeof *m->ws);
    m->heavy = calloc(n, 1);
    if (!m->fp || !m->use_off || !m->nuse || !m->uses || !m->written || !m->recomp ||
        !m->recomp_until || !m->ws || !m->heavy) {
        ooc_model_free(m);
        return OOC_ENOMEM;
    }
    for (uint32_t b = 0; b < p->nbufs; b++) {
        m->fp[b] = ooc_model_fp(p->bufs[b].bytes, chunk_bytes);
        if (p->bufs[b].persistent)
            m->persist_bytes += m->fp[b];
    }
    for (uint32_t r = 0; r < p->nrefs; r++) {
        m->nuse[p->refs[r].buf]++;
        /* Any use may have changed the buffer as far as a swap-out is concerned: the shim cannot
         * see what a kernel wrote (a profile's `r` for a kernel comes from checksums taken while
         * recording, which a later launch need not repeat), so it copies out whatever was used
         * since the last copy in, and the simulator charges that copy. */
        m->written[r] = 1;
    }
    for (uint32_t b = 0; b < p->nbufs; b++)
        m->use_off[b + 1] = m->use_off[b] + m->nuse[b];
    uint32_t *fill = calloc(nb, sizeof *fill);
    if (!fill) {
        ooc_model_free(m);
        return OOC_ENOMEM;
    }
    for (uint32_t i = 0; i < p->nops; i++) {
        const ooc_op_t *o = &p->ops[i];
        m->compute_ns += o->duration_ns;
        m->heavy[i] = (uint8_t)is_heavy(o);
        for (uint32_t k = 0; k < o->nref; k++) {
            int32_t b = p->refs[o->ref_off + k].buf;
            m->uses[m->use_off[b] + fill[b]++] = (int32_t)i;
            m->ws[i] += m->fp[b];
        }
    }
    free(fill);
    m->free_off = calloc(n + 1, sizeof *m->free_off);
    m->frees = calloc(nb, sizeof *m->frees);
    if (!m->free_off || !m->frees) {
        ooc_model_free(m);
        return OOC_ENOMEM;
    }
    for (uint32_t b = 0; b < p->nbufs; b++)
        if (p->bufs[b].free_idx >= 0)
            m->free_off[p->bufs[b].free_idx + 1]++;
    for (uint32_t i = 0; i < p->nops; i++)
        m->free_off[i + 1] += m->free_off[i];
    {
        uint32_t *pos = calloc(n, sizeof *pos);
        if (!pos) {
            ooc_model_free(m);
            return OOC_ENOMEM;
        }
        for (uint32_t b = 0; b < p->nbufs; b++)
            if (p->bufs[b].free_idx >= 0) {
                int64_t i = p->bufs[b].free_idx;
                m->frees[m->free_off[i] + pos[i]++] = (int32_t)b;
            }
        free(pos);
    }
    for (uint32_t b = 0; b < p->nbufs; b++)
        recompute_rule(m, (int32_t)b);
    *out = m;
    return 0;
}

uint32_t ooc_model_next_use(const ooc_model_t *m, int32_t b, int64_t i) {
    const int32_t *u = m->uses + m->use_off[b];
    uint32_t lo = 0, hi = m->nuse[b];
    while (lo < hi) {
        uint32_t mid = (lo + hi) / 2;
        if (u[mid] < i)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

int ooc_model_check_budget(const ooc_model_t *m, uint64_t budget_bytes, int32_t *op_out, char *err,
                           size_t errlen) {
    for (uint32_t i = 0; i < m->n; i++)
        if (m->ws[i] > budget_bytes) {
            if (op_out)
                *op_out = (int32_t)i;
            if (err && errlen)
                snprintf(err, errlen,
                         "infeasible: op %u (%s) needs %llu bytes for its own buffers, more than "
                         "the budget of %llu bytes",
                         i, m->prof->ops[i].name, (unsigned long long)m->ws[i],
                         (unsigned long long)budget_bytes);
            return OOC_EINFEASIBLE;
        }
    return 0;
}
