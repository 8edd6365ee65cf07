/* SPDX-License-Identifier: MIT */
/* replay_match.c: a live operation against the plan's operation at its place, where their
 * buffers differ (replay.c): the words of the divergence log line, and the kernel op whose
 * difference is stale parameter words, which then match.
 *
 * Stale words. A parameter word may hold whatever its bytes held before: PyTorch's reduction
 * kernels pass a parameter block of several hundred bytes whose unused fields, on an H200,
 * pointed one iteration into a 784 MiB activation, the next into another buffer or at nothing.
 * Where such a word pointed while the iteration was recorded, the plan's op has that buffer;
 * where it points now, the live op has it. The two lists are lined up by their longest common
 * subsequence (the same size and, for a plan buffer bound earlier in the iteration, the same
 * buffer). The live op matches when every live buffer left over is reached through parameter
 * words that can be marked weak (ooc_launch_weaken: their buffers are still made resident, but
 * are no longer part of the op's identity), and every plan buffer left over was found, when the
 * iteration was recorded, through a parameter word (the profile keeps it: ops.tsv's
 * "BUFFER:ACCESS@BYTE"), which is then marked weak too: on an H200 such a word pointed, after the
 * plan was made, into a buffer another word of the same launch names, so the live op had one
 * buffer fewer. A plan buffer with no word (a profile written before words were kept) is accepted
 * only where the op has weak words, through which the recording may have found it. Correctness
 * never rests on the match: every op's buffers are made resident before it runs, listed or not.
 *
 * Called under the replay's lock (the scratch below is guarded by it). */

#include "shim.h"

#include <stdio.h>
#include <stdlib.h>

#define MATCH_MAX 64 /* buffers on either side beyond which no match is tried */

static uint8_t lcs[(MATCH_MAX + 1) * (MATCH_MAX + 1)];
static uint32_t grow[OOC_MAX_REFS], shrink[MATCH_MAX]; /* words to mark weak, by case */

/* Does live buffer x fit plan ref j (its size; its binding when bound)? */
static int fits(const ooc_profile_t *p, const ooc_op_t *o, const uint64_t *bound, uint32_t j,
                const ooc_opbuf_t *x) {
    return p->bufs[p->refs[o->ref_off + j].buf].bytes == x->bytes &&
           (!bound[j] || bound[j] == x->id);
}

int ooc_replay_match_stale(const ooc_profile_t *p, const ooc_op_t *o, const uint64_t *bound,
                           const ooc_access_t *a, const ooc_opbuf_t *b, size_t n,
                           ooc_opbuf_t *keep) {
    size_t m = o->nref;
    if (a->kind != OOC_OP_KERNEL || n > MATCH_MAX || m > MATCH_MAX)
        return 0;
#define L(r, j) lcs[(r) * (m + 1) + (j)]
    for (size_t r = n + 1; r-- > 0;)
        for (size_t j = m + 1; j-- > 0;) {
            if (r == n || j == m) {
                L(r, j) = 0;
                continue;
            }
            uint8_t best = L(r + 1, j) > L(r, j + 1) ? L(r + 1, j) : L(r, j + 1);
            if (fits(p, o, bound, (uint32_t)j, &b[r]) && L(r + 1, j + 1) + 1 > best)
                best = (uint8_t)(L(r + 1, j + 1) + 1);
            L(r, j) = best;
        }
    size_t r = 0, j = 0, ng = 0, ns = 0, unknown = 0;
    for (size_t k = 0; k < m; k++)
        keep[k] = (ooc_opbuf_t){0};
    while (r < n || j < m) {
        if (r < n && j < m && fits(p, o, bound, (uint32_t)j, &b[r]) &&
            L(r, j) == L(r + 1, j + 1) + 1) {
            keep[j++] = b[r++];
        } else if (r < n && (j == m || L(r + 1, j) >= L(r, j + 1))) {
            /* A live buffer the plan's op does not have: every learnable word into it. */
            size_t had = ng;
            for (unsigned i = 0; i < a->n; i++)
                if (ooc_launch_word_learnable(a, i) && a->refs[i].lo >= b[r].addr &&
                    a->refs[i].lo < b[r].addr + b[r].bytes)
                    grow[ng++] = a->refs[i].word;
            if (ng == had)
                return 0; /* not reached through a word that can be marked */
            r++;
        } else {
            /* A plan buffer the live op does not have: the word the recording found it through,
             * unless that word is weak now (then nothing more to mark). */
            uint32_t w = p->refs[o->ref_off + j].word;
            int weak_now = 0;
            for (unsigned i = 0; i < a->n && w && !weak_now; i++)
                weak_now = a->refs[i].word == w && (a->refs[i].use & OOC_USE_WEAK);
            if (!w)
                unknown++;
            else if (!weak_now)
                shrink[ns++] = w;
            j++;
        }
    }
#undef L
    /* A plan buffer found through no known word (a profile written before words were kept) is
     * accepted only where the op has weak words, through which the recording may have found it. */
    int weak = ng + ns > 0;
    for (unsigned i = 0; i < a->n && !weak; i++)
        weak = a->refs[i].word && (a->refs[i].use & OOC_USE_WEAK);
    if (unknown && !weak)
        return 0;
    /* Both lists checked before either is marked: a word that cannot be (beyond the first
     * parameter bytes that have weak bits: only from an edited profile) fails the match with
     * nothing marked. */
    if ((ng && ooc_launch_weaken(a, grow, ng, NULL) != 0) ||
        (ns && ooc_launch_weaken(a, shrink, ns, NULL) != 0))
        return 0;
    if (ng && ooc_launch_weaken(a, grow, ng,
                                "pointed into a buffer that the plan's operation at this place "
                                "does not use") != 0)
        return 0;
    if (ns && ooc_launch_weaken(a, shrink, ns,
                                "pointed, when the iteration was recorded, into a buffer that the "
                                "operation at this place no longer uses") != 0)
        return 0;
    return 1;
}

int ooc_replay_say_sizes(char *why, size_t n, const ooc_opbuf_t *b, size_t nb,
                         const ooc_profile_t *p, const ooc_op_t *o) {
    /* The sizes side by side tell an extra workspace or pointer from a changed shape. */
    size_t w = (size_t)snprintf(why, n, "other buffers: %zu (bytes", nb);
    for (size_t r = 0; r < nb && r < 12 && w < n; r++)
        w += (size_t)snprintf(why + w, n - w, " %llu", (unsigned long long)b[r].bytes);
    if (w < n)
        w += (size_t)snprintf(why + w, n - w, "%s), the plan's op has %u (bytes",
                              nb > 12 ? " ..." : "", o->nref);
    for (uint32_t r = 0; r < o->nref && r < 12 && w < n; r++)
        w += (size_t)snprintf(why + w, n - w, " %llu",
                              (unsigned long long)p->bufs[p->refs[o->ref_off + r].buf].bytes);
    if (w < n)
        snprintf(why + w, n - w, "%s)", o->nref > 12 ? " ..." : "");
    return 0;
}
