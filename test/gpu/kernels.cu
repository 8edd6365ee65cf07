/* SPDX-License-Identifier: MIT */
/* kernels.cu: built to PTX (the Makefile embeds it as gk_kernels_ptx) for the driver-API GPU
 * check driver_paths.c, which loads it with cuModuleLoadData. */
#include "kernels.cuh"
