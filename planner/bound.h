/* SPDX-License-Identifier: MIT */
/* bound.h: private to the planner: the pieces of the lower bound (bound.c) kept in files of their
 * own. */
#ifndef OOC_BOUND_H
#define OOC_BOUND_H

#include "ooc_planner.h"

/* A lower bound on T_{k+1} - T_k, the time from the start of op k to the start of op k + 1 under
 * the budget, that holds for every valid plan (bound_window.c). 0 <= k < n - 1. */
double ooc_bound_window_ns(const ooc_model_t *m, uint64_t budget, int32_t k);

#endif
