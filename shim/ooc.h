/* SPDX-License-Identifier: MIT */
/* ooc.h: the error codes and small macros that every module of the shim shares.
 *
 * Internal functions return 0 on success or one of the negative OOC_E* codes below; they never
 * report through errno. Hooks translate these codes into the closest CUresult at the boundary.
 * This header has no state and no dependencies beyond <stddef.h>, so any file may include it. */
#ifndef OOC_H
#define OOC_H

#include <stddef.h>

/* Error codes: negative, distinct, stable. 0 is success. */
#define OOC_OK        0
#define OOC_EINVAL    (-1)  /* a malformed argument or configuration value */
#define OOC_ENOMEM    (-2)  /* host memory exhausted (malloc, pinned host pool) */
#define OOC_EDRIVER   (-3)  /* the real driver returned an error; the caller has the CUresult */
#define OOC_ERANGE    (-4)  /* a value is out of its accepted range, or a size overflows */
#define OOC_ENOENT    (-5)  /* no such buffer, file or entry */
#define OOC_EBUSY     (-6)  /* the object is in use (pinned, captured, mid-transfer) */
#define OOC_EIO       (-7)  /* reading or writing a file failed */
#define OOC_EBUDGET   (-8)  /* the device budget is exhausted and nothing can be evicted */
#define OOC_ENOTSUP   (-9)  /* the device or driver lacks a feature we need */
#define OOC_EMISMATCH (-10) /* live operations diverge from the plan or profile */
#define OOC_ESTATE    (-11) /* called in the wrong state (before init, after shutdown) */

/* A short constant description of an OOC_E* code; never NULL. Safe anywhere (no allocation). */
static inline const char *ooc_strerror(int err) {
    switch (err) {
    case OOC_OK:
        return "success";
    case OOC_EINVAL:
        return "invalid argument";
    case OOC_ENOMEM:
        return "out of host memory";
    case OOC_EDRIVER:
        return "driver error";
    case OOC_ERANGE:
        return "value out of range";
    case OOC_ENOENT:
        return "not found";
    case OOC_EBUSY:
        return "busy";
    case OOC_EIO:
        return "input/output error";
    case OOC_EBUDGET:
        return "device budget exhausted";
    case OOC_ENOTSUP:
        return "not supported";
    case OOC_EMISMATCH:
        return "diverges from the plan";
    case OOC_ESTATE:
        return "wrong state";
    default:
        return "unknown error";
    }
}

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
