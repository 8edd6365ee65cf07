/* SPDX-License-Identifier: MIT */
/* fc_ktab.h: how a built-in kernel file hands its table to the simulated driver.
 *
 * A file in test/fakecuda/kernels_*.c defines `static const fakecuda_kernel_t t[] = {...}` and
 * writes FC_KERNEL_TABLE(t); the linker gathers every table into the section fc_ktabs, which the
 * driver walks once at cuInit. No central list to keep in sync. */
#ifndef FC_KTAB_H
#define FC_KTAB_H

#include "fakecuda.h"

typedef struct fc_ktab {
    const fakecuda_kernel_t *kernels;
    size_t count;
} fc_ktab_t;

#define FC_KERNEL_TABLE(arr)                                                                       \
    static const fc_ktab_t fc_ktab_##arr                                                           \
        __attribute__((used, section("fc_ktabs"), aligned(8))) = {arr,                             \
                                                                  sizeof(arr) / sizeof((arr)[0])}

#endif
