/* SPDX-License-Identifier: MIT */
/* replay_why.c: how a live operation differs from the plan's operation at its place, in the words
 * of the divergence log line (replay.c). Pure formatting: reads the profile, calls nothing. */

#include "shim.h"

#include <stdio.h>

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
