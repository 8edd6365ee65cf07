/* SPDX-License-Identifier: MIT */
/* fuzz_profile.c: libFuzzer target over the profile reader (`make fuzz`). The input is the three
 * files meta.tsv, buffers.tsv and ops.tsv separated by NUL bytes; a profile that parses is also
 * modelled, bounded and, when small, planned and simulated, so hostile but valid profiles
 * exercise the planner too. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "ooc_planner.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *s = (const char *)data, *end = s + size;
    const char *part[3] = {s, s, s};
    size_t len[3] = {0, 0, 0};
    for (int i = 0; i < 3; i++) {
        const char *z = memchr(s, '\0', (size_t)(end - s));
        part[i] = s;
        len[i] = (size_t)((z ? z : end) - s);
        s = z ? z + 1 : end;
    }
    char err[512];
    ooc_profile_t *p = NULL;
    if (ooc_profile_parse(part[0], len[0], part[1], len[1], part[2], len[2], &p, err, sizeof err) !=
        0)
        return 0;
    ooc_model_t *m = NULL;
    if (ooc_model_build(p, p->chunk_bytes, &m) == 0) {
        uint64_t budget = p->budget_bytes ? p->budget_bytes : (1ull << 30);
        (void)ooc_model_bound_ns(m, budget, NULL);
        if (p->nops <= 64 && p->nbufs <= 64) {
            ooc_policy_opts_t o = {.budget_bytes = budget};
            ooc_plan_t *pl = NULL;
            const char *pol = p->nops % 2 ? "swapall" : "window";
            if (ooc_policy_plan(m, pol, &o, &pl, err, sizeof err) == 0) {
                ooc_trace_t tr = {0};
                ooc_sim_opts_t so = {.trace = &tr};
                ooc_sim_result_t r;
                if (ooc_sim_run(m, pl, &so, &r) == 0) {
                    if (r.feasible && ooc_trace_check(m, pl, &tr, err, sizeof err) != 0)
                        __builtin_trap(); /* a policy broke an invariant */
                    ooc_sim_result_free(&r);
                }
                ooc_trace_free(&tr);
                ooc_plan_free(pl);
            }
        }
        ooc_model_free(m);
    }
    ooc_profile_free(p);
    return 0;
}
