/* SPDX-License-Identifier: MIT */
/* runner.c: the one test runner. Every test/check_<area>.c exports `Suite *suite_<area>(void)`;
 * the Makefile lists them in suites.h. Arguments name suites to run (default: all). Exits
 * non-zero when any test fails, and ends with the line "N passed, N failed". */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SUITE(name) Suite *suite_##name(void);
#include "suites.h"
#undef SUITE

typedef struct {
    const char *name;
    Suite *(*make)(void);
} entry_t;

static const entry_t suites[] = {
#define SUITE(name) {#name, suite_##name},
#include "suites.h"
#undef SUITE
};

int main(int argc, char **argv) {
    SRunner *sr = NULL;
    for (size_t i = 0; i < sizeof suites / sizeof suites[0]; i++) {
        int wanted = argc < 2;
        for (int a = 1; a < argc; a++)
            if (strcmp(argv[a], suites[i].name) == 0)
                wanted = 1;
        if (!wanted)
            continue;
        if (!sr)
            sr = srunner_create(suites[i].make());
        else
            srunner_add_suite(sr, suites[i].make());
    }
    if (!sr) {
        fprintf(stderr, "runner: no suite matches; suites are:");
        for (size_t i = 0; i < sizeof suites / sizeof suites[0]; i++)
            fprintf(stderr, " %s", suites[i].name);
        fprintf(stderr, "\n");
        return 2;
    }
    srunner_run_all(sr, CK_NORMAL);
    int run = srunner_ntests_run(sr);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    printf("%d passed, %d failed\n", run - failed, failed);
    return failed == 0 && run > 0 ? 0 : 1;
}
