/* SPDX-License-Identifier: MIT */
/* ooc_err.h: the one error vocabulary of ooc-shim, shared by the planner and the shim (shim/ooc.h
 * includes it). Defined once here, below both, so that a code means the same thing on either side
 * of the planner's interface.
 *
 * Functions return 0 on success or one of these negative codes; they never report through errno.
 * No state, no dependencies: any file may include it. */
#ifndef OOC_ERR_H
#define OOC_ERR_H

/* Error codes: negative, distinct, stable. 0 is success. */
#define OOC_OK          0
#define OOC_EINVAL      (-1)  /* a malformed argument or configuration value */
#define OOC_ENOMEM      (-2)  /* host memory exhausted (malloc, pinned host pool) */
#define OOC_EDRIVER     (-3)  /* the real driver returned an error; the caller has the CUresult */
#define OOC_ERANGE      (-4)  /* a value is out of its accepted range, or a size overflows */
#define OOC_ENOENT      (-5)  /* no such buffer, file or entry */
#define OOC_EBUSY       (-6)  /* the object is in use (pinned, captured, mid-transfer) */
#define OOC_EIO         (-7)  /* reading or writing a file failed */
#define OOC_EBUDGET     (-8)  /* the device budget is exhausted and nothing can be evicted */
#define OOC_ENOTSUP     (-9)  /* the device or driver lacks a feature we need */
#define OOC_EMISMATCH   (-10) /* live operations diverge from the plan or profile */
#define OOC_ESTATE      (-11) /* called in the wrong state (before init, after shutdown) */
#define OOC_EFORMAT     (-12) /* a malformed profile or plan (the message names file, line, field) */
#define OOC_EINFEASIBLE (-13) /* no plan can run under this budget (the message names the op) */

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
    case OOC_EFORMAT:
        return "malformed profile or plan";
    case OOC_EINFEASIBLE:
        return "no plan fits the budget";
    default:
        return "unknown error";
    }
}

#endif
