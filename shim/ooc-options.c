/* SPDX-License-Identifier: MIT */
/* ooc-options: the shim's own option table and parser, as a command, for scripts/ooc-run.
 *
 * ooc-run turns its flags into OOC_* variables and asks this program whether the shim will
 * accept the environment, before it starts the user's program: the parser is the shim's
 * (shim/options.c, linked in), so a value ooc-run lets through is one the shim accepts, and a
 * refusal carries the shim's own accepted form. It is built from options.c and log.c only (no
 * driver, no device). Installed in PREFIX/libexec/ooc-shim/, not on the PATH.
 *
 *   ooc-options check   parses the OOC_* environment; prints nothing and exits 0 when the shim
 *                       will accept it, else prints the shim's one-line message
 *                       (NAME=VALUE: problem; expected FORM) on stdout and exits 1
 *   ooc-options table   prints the table, one option a line: name, default, accepted form,
 *                       documentation, separated by tabs
 *
 * Exit status 2 for a bad command line. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "options.h"

static const char *from_environment(const char *name, void *ctx) {
    (void)ctx;
    return getenv(name);
}

static int usage(FILE *f) {
    fputs("usage: ooc-options check | table\n"
          "  check  exit 0 when the shim accepts the OOC_* environment; else print why, exit 1\n"
          "  table  print every OOC_* option: name, default, accepted form, documentation\n",
          f);
    return f == stdout ? 0 : 2;
}

int main(int argc, char **argv) {
    if (argc != 2)
        return usage(stderr);
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)
        return usage(stdout);
    if (strcmp(argv[1], "check") == 0) {
        ooc_options_t o;
        char err[1024];
        if (ooc_options_parse(from_environment, NULL, &o, err, sizeof err) == 0)
            return 0;
        printf("%s\n", err);
        return 1;
    }
    if (strcmp(argv[1], "table") == 0) {
        size_t n;
        const ooc_option_desc_t *t = ooc_options_table(&n);
        for (size_t i = 0; i < n; i++)
            printf("%s\t%s\t%s\t%s\n", t[i].name, t[i].def, t[i].accepted, t[i].doc);
        return 0;
    }
    return usage(stderr);
}
