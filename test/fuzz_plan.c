/* SPDX-License-Identifier: MIT */
/* fuzz_plan.c: libFuzzer target over the plan reader (`make fuzz`). A plan that parses is
 * written back out and parsed again, and the two must agree. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ooc_planner.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[512];
    ooc_plan_t *pl = NULL;
    if (ooc_plan_parse((const char *)data, size, "fuzz.tsv", &pl, err, sizeof err) != 0)
        return 0;
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (f) {
        ooc_plan_write(pl, f);
        fclose(f);
        ooc_plan_t *again = NULL;
        if (ooc_plan_parse(buf, len, "again.tsv", &again, err, sizeof err) != 0 ||
            again->nacts != pl->nacts || memcmp(again->decision, pl->decision, pl->nbufs) != 0)
            __builtin_trap(); /* what we write, we must read back the same */
        ooc_plan_free(again);
        free(buf);
    }
    ooc_plan_free(pl);
    return 0;
}
