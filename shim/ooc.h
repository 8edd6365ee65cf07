/* SPDX-License-Identifier: MIT */
/* ooc.h: the error codes (planner/ooc_err.h) and small macros that every module of the shim
 * shares.
 *
 * Internal functions return 0 on success or one of the negative OOC_E* codes; they never report
 * through errno. Hooks translate these codes into the closest CUresult at the boundary. This
 * header has no state and no dependencies beyond <stddef.h> and ooc_err.h, so any file may
 * include it. */
#ifndef OOC_H
#define OOC_H

#include <stddef.h>

#include "ooc_err.h" /* the error codes, shared with the planner (planner/ooc_err.h) */

/* The shim is built with -fvisibility=hidden, so OOC_INTERNAL is the default; it is written
 * where a reader might otherwise wonder. OOC_EXPORT marks the hooks and the small public API. */
#define OOC_INTERNAL __attribute__((visibility("hidden")))
#define OOC_EXPORT   __attribute__((visibility("default")))

#define OOC_LIKELY(x)   __builtin_expect(!!(x), 1)
#define OOC_UNLIKELY(x) __builtin_expect(!!(x), 0)

#define OOC_PRINTF(fmt_idx, arg_idx) __attribute__((format(printf, fmt_idx, arg_idx)))
#define OOC_UNUSED                   __attribute__((unused))

#define OOC_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))

#define OOC_KiB (1024ULL)
#define OOC_MiB (1024ULL * 1024)
#define OOC_GiB (1024ULL * 1024 * 1024)
#define OOC_TiB (1024ULL * 1024 * 1024 * 1024)

#endif
