/* SPDX-License-Identifier: MIT */
/* tsv.h: private to the planner: the one splitter of the tab-separated lines that the profile's
 * and the plan's readers (profile.c, plan.c) parse (tsv.c). */
#ifndef OOC_TSV_H
#define OOC_TSV_H

#include <stddef.h>

#define OOC_TSV_FIELDS 16 /* the most fields a line can be split into */

/* A cursor over one file's text, line by line. The fields point into the text (they are not
 * NUL-terminated) and hold until the next line is read. */
typedef struct {
    const char *name;    /* the file's name, for the caller's messages */
    const char *s, *end; /* the text not read yet */
    unsigned line;       /* the number of the line last read, from 1 */
    const char *f[OOC_TSV_FIELDS];
    size_t flen[OOC_TSV_FIELDS];
    int nf;
} ooc_tsv_t;

/* What ooc_tsv_next found: a line, the end of the text, or a line it cannot split. */
enum {
    OOC_TSV_LINE = 1,
    OOC_TSV_END = 0,
    OOC_TSV_EMPTY = -1, /* an empty line */
    OOC_TSV_NUL = -2,   /* a NUL byte in the line */
    OOC_TSV_MANY = -3,  /* more fields than the caller allows */
};

/* Reads the next line (up to '\n' or the end of the text; a '\r' before the '\n' is dropped) and
 * splits it on tabs into r->f and r->flen, at most maxf fields (maxf <= OOC_TSV_FIELDS). Returns
 * OOC_TSV_LINE, OOC_TSV_END when the text is all read, or a negative OOC_TSV_* for a line it
 * cannot split, r->line then being that line's number: the callers word their own messages. No
 * allocation; thread-safe on distinct cursors. */
int ooc_tsv_next(ooc_tsv_t *r, int maxf);

#endif
