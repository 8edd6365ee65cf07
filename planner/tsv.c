/* SPDX-License-Identifier: MIT */
/* tsv.c: the planner's one splitter of tab-separated lines (tsv.h), used by the profile reader
 * (profile.c) and the plan reader (plan.c); no state but the caller's cursor. */
#include "tsv.h"

#include <string.h>

int ooc_tsv_next(ooc_tsv_t *r, int maxf) {
    if (r->s >= r->end)
        return OOC_TSV_END;
    const char *nl = memchr(r->s, '\n', (size_t)(r->end - r->s));
    const char *le = nl ? nl : r->end;
    const char *ls = r->s;
    r->s = nl ? nl + 1 : r->end;
    r->line++;
    if (le > ls && le[-1] == '\r')
        le--;
    if (le == ls)
        return OOC_TSV_EMPTY;
    if (memchr(ls, '\0', (size_t)(le - ls)))
        return OOC_TSV_NUL;
    r->nf = 0;
    for (const char *p = ls;;) {
        const char *t = memchr(p, '\t', (size_t)(le - p));
        if (r->nf == maxf || r->nf == OOC_TSV_FIELDS)
            return OOC_TSV_MANY;
        r->f[r->nf] = p;
        r->flen[r->nf++] = (size_t)((t ? t : le) - p);
        if (!t)
            return OOC_TSV_LINE;
        p = t + 1;
    }
}
