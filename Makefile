# SPDX-License-Identifier: MIT
# The one non-recursive Makefile of ooc-shim. Outputs go to build/ (build/san/ for a sanitizer
# build). `make test` and `make demo` first install what is missing (scripts/install-deps).

CC        ?= cc
CUDA_HOME ?= /usr/local/cuda
SANITIZE  ?=
V         ?= 0

# A plain `make` builds everything (the first rule below would otherwise be the default goal).
.DEFAULT_GOAL := all

ifeq ($(SANITIZE),)
B := build
else
B := build/san
endif

WARN := -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes -Wmissing-prototypes -Wformat=2 \
        -Wvla -Wundef -Wpointer-arith -Wwrite-strings -fno-common
CFLAGS_ALL := -std=c11 -D_GNU_SOURCE -O2 -g $(WARN) -MMD -MP -pthread $(CFLAGS)
LDFLAGS_ALL := -pthread $(LDFLAGS)
# The sanitizer build also checks the memory layer's invariants at every release of its lock
# (shim/memcheck.c); CHECKS=1 turns them on in any build.
CHECKS ?= $(if $(SANITIZE),1,0)
ifeq ($(CHECKS),1)
CFLAGS_ALL  += -DOOC_CHECKS
endif
ifneq ($(SANITIZE),)
CFLAGS_ALL  += -fsanitize=$(SANITIZE) -fno-omit-frame-pointer -fno-sanitize-recover=all
LDFLAGS_ALL += -fsanitize=$(SANITIZE)
endif
CUDA_INC := -I$(CUDA_HOME)/include

ifeq ($(V),0)
Q = @
say = @printf '  %-8s %s\n' $(1) $(2);
else
Q =
say =
endif

# The Check library's flags are read when a recipe runs, after install-deps has run.
CHECK_LIBS = $$(pkg-config --libs check 2>/dev/null || echo -lcheck -lsubunit -lm -lrt)

# ---- the simulated device: libcuda.so.1, libcudnn.so.9 and libcublas.so.13 ----------------------
DNN_SRC := test/fakecuda/cudnn.c test/fakecuda/cudnn_backend.c
BLAS_SRC := test/fakecuda/cublas.c
NCCL_SRC := $(wildcard test/fakecuda/nccl.c test/fakecuda/nccl_*.c)
FC_SRC  := $(filter-out $(DNN_SRC) $(BLAS_SRC) $(NCCL_SRC),$(wildcard test/fakecuda/*.c))
FC_OBJ  := $(FC_SRC:%.c=$(B)/obj/%.o)
FC_LIB  := $(B)/fakecuda/libcuda.so.1
DNN_OBJ := $(DNN_SRC:%.c=$(B)/obj/%.o)
DNN_LIB := $(if $(wildcard test/fakecuda/cudnn.c),$(B)/fakecuda/libcudnn.so.9)
BLAS_OBJ := $(BLAS_SRC:%.c=$(B)/obj/%.o)
BLAS_LIB := $(if $(wildcard test/fakecuda/cublas.c),$(B)/fakecuda/libcublas.so.13)
NCCL_OBJ := $(NCCL_SRC:%.c=$(B)/obj/%.o)
NCCL_LIB := $(if $(wildcard test/fakecuda/nccl.c),$(B)/fakecuda/libnccl.so.2)
FC_DIR  := $(B)/fakecuda

$(B)/obj/test/fakecuda/%.o: test/fakecuda/%.c
	@mkdir -p $(@D)
	$(call say,CC,$<)$(CC) $(CFLAGS_ALL) $(CUDA_INC) -fPIC -fvisibility=hidden -c $< -o $@

$(FC_LIB): $(FC_OBJ)
	@mkdir -p $(@D)
	$(call say,LD,$@)$(CC) -shared -Wl,-soname,libcuda.so.1 -o $@ $^ $(LDFLAGS_ALL) -lm -ldl
	$(Q)ln -sf libcuda.so.1 $(@D)/libcuda.so

$(B)/fakecuda/libcudnn.so.9: $(DNN_OBJ)
	@mkdir -p $(@D)
	$(call say,LD,$@)$(CC) -shared -Wl,-soname,libcudnn.so.9 -o $@ $^ $(LDFLAGS_ALL) -lm -ldl
	$(Q)ln -sf libcudnn.so.9 $(@D)/libcudnn.so

# The soname of CUDA 13's libcublas; like the real one it finds the driver at run time.
$(B)/fakecuda/libcublas.so.13: $(BLAS_OBJ)
	@mkdir -p $(@D)
	$(call say,LD,$@)$(CC) -shared -Wl,-soname,libcublas.so.13 -o $@ $^ $(LDFLAGS_ALL) -ldl
	$(Q)ln -sf libcublas.so.13 $(@D)/libcublas.so

# The soname of NCCL 2; it finds the driver at run time, like the real one.
$(B)/fakecuda/libnccl.so.2: $(NCCL_OBJ)
	@mkdir -p $(@D)
	$(call say,LD,$@)$(CC) -shared -Wl,-soname,libnccl.so.2 -o $@ $^ $(LDFLAGS_ALL) -ldl -lpthread -lrt
	$(Q)ln -sf libnccl.so.2 $(@D)/libnccl.so

# ---- test workloads: build/workloads/<name> ---------------------------------------------------
WL_COMMON := $(filter test/workloads/wl_%.c,$(wildcard test/workloads/*.c))
WL_MAIN   := $(filter-out $(WL_COMMON),$(wildcard test/workloads/*.c))
WL_BIN    := $(patsubst test/workloads/%.c,$(B)/workloads/%,$(WL_MAIN))
WL_COBJ   := $(WL_COMMON:%.c=$(B)/obj/%.o)

$(B)/obj/test/workloads/%.o: test/workloads/%.c
	@mkdir -p $(@D)
	$(call say,CC,$<)$(CC) $(CFLAGS_ALL) $(CUDA_INC) -Itest/fakecuda -c $< -o $@

$(B)/workloads/%: $(B)/obj/test/workloads/%.o $(WL_COBJ)
	@mkdir -p $(@D)
	$(call say,LD,$@)$(CC) -o $@ $^ $(LDFLAGS_ALL) -ldl -lm

# ---- the planner: libooc_planner.a and ooc-plan ------------------------------------------------
PL_SRC := $(filter-out planner/ooc-plan.c,$(wildcard planner/*.c))
PL_OBJ := $(PL_SRC:%.c=$(B)/obj/%.o)
PL_LIB := $(B)/libooc_planner.a
PL_CLI := $(if $(wildcard planner/ooc-plan.c),$(B)/ooc-plan)

$(B)/obj/planner/%.o: planner/%.c
	@mkdir -p $(@D)
	$(call say,CC,$<)$(CC) $(CFLAGS_ALL) -fPIC -c $< -o $@

$(PL_LIB): $(PL_OBJ)
	@mkdir -p $(@D)
	$(call say,AR,$@)rm -f $@ && ar rcs $@ $^

$(B)/ooc-plan: $(B)/obj/planner/ooc-plan.o $(PL_LIB)
	$(call say,LD,$@)$(CC) -o $@ $^ $(LDFLAGS_ALL) -lm

# ---- the shim: libooc_shim.so ------------------------------------------------------------------
SH_SRC := $(filter-out shim/ooc-options.c,$(wildcard shim/*.c))
SH_OBJ := $(SH_SRC:%.c=$(B)/obj/%.o) $(if $(SH_SRC),$(B)/obj/gen/checksum_ptx.o)
SH_LIB := $(if $(SH_SRC),$(B)/libooc_shim.so)

# The recompute checksum kernel (shim/checksum.cu) as PTX text in a C array, ooc_checksum_ptx.
# Without nvcc the array is empty: the shim then verifies no producer on a real GPU (it says so
# once); the simulated device has the kernel built in.
NVCC      ?= $(CUDA_HOME)/bin/nvcc
HAVE_NVCC := $(shell command -v $(NVCC) >/dev/null 2>&1 && echo 1)

$(B)/gen/checksum_ptx.c: shim/checksum.cu Makefile
	@mkdir -p $(@D)
ifeq ($(HAVE_NVCC),1)
	$(call say,NVCC,$<)$(NVCC) -ptx -arch=compute_75 -o $(@D)/checksum.ptx $<
	$(Q){ echo '/* Generated from shim/checksum.cu by the Makefile. */'; \
	    echo 'extern const char ooc_checksum_ptx[];'; \
	    echo 'const char ooc_checksum_ptx[] ='; \
	    sed -e 's/\\/\\\\/g' -e 's/"/\\"/g' -e 's/^/    "/' -e 's/$$/\\n"/' $(@D)/checksum.ptx; \
	    echo '    "";'; } >$@.tmp && mv $@.tmp $@
else
	$(call say,GEN,$@){ echo '/* nvcc was not found: no PTX for the recompute checksum kernel. */'; \
	    echo 'extern const char ooc_checksum_ptx[];'; \
	    echo 'const char ooc_checksum_ptx[] = "";'; } >$@
endif

$(B)/obj/gen/checksum_ptx.o: $(B)/gen/checksum_ptx.c
	@mkdir -p $(@D)
	$(call say,CC,$<)$(CC) $(CFLAGS_ALL) -fPIC -fvisibility=hidden -c $< -o $@

# libunwind (allocation call sites while recording) is optional: without libunwind.h (a GPU
# machine without Debian's packages) the shim is built with OOC_NO_UNWIND and records no call
# sites (it says so when recording). UNWIND=0 forces that; UNWIND=1 insists on libunwind.
UNWIND ?= auto
ifeq ($(UNWIND),auto)
override UNWIND := $(shell { [ -f /usr/include/libunwind.h ] || \
    pkg-config --exists libunwind; } 2>/dev/null && echo 1 || echo 0)
endif
ifeq ($(UNWIND),1)
SH_UNWIND_LIBS = $$(pkg-config --libs libunwind 2>/dev/null || echo -lunwind)
SH_UNWIND_DEF  :=
else
SH_UNWIND_LIBS :=
SH_UNWIND_DEF  := -DOOC_NO_UNWIND
endif
# uthash is a header; where Debian's is missing (a GPU machine), a copy carried in .gpu-deps/
# (scripts/gpu-bundle) serves.
UTHASH_INC := $(if $(wildcard /usr/include/uthash.h),,$(if $(wildcard .gpu-deps/include/uthash.h),\
    -I.gpu-deps/include))

$(B)/obj/shim/%.o: shim/%.c
	@mkdir -p $(@D)
	$(call say,CC,$<)$(CC) $(CFLAGS_ALL) $(CUDA_INC) $(UTHASH_INC) -Iplanner -fPIC \
	    -fvisibility=hidden -DHASH_NONFATAL_OOM=1 $(SH_UNWIND_DEF) -c $< -o $@

# Shim modules that never call the driver; the test runner links them for unit tests.
SH_PURE := $(filter $(addprefix $(B)/obj/shim/,options.o log.o stats.o iterdet.o vaspace.o slab.o lru.o),\
    $(SH_OBJ))

$(B)/libooc_shim.so: $(SH_OBJ) $(PL_LIB)
	$(call say,LD,$@)$(CC) -shared -o $@ $(SH_OBJ) $(PL_LIB) $(LDFLAGS_ALL) -ldl -lm \
	    $(SH_UNWIND_LIBS)

# ---- ooc-options: the shim's option table and parser as a command, for scripts/ooc-run ---------
OPT_CLI := $(if $(wildcard shim/ooc-options.c),$(B)/ooc-options)
# Man pages of the installed commands, made from their --help (rules under make install).
MAN_CMDS  := ooc-run ooc-plan ooc-report
MAN_PAGES := $(MAN_CMDS:%=$(B)/man/%.1)

$(B)/ooc-options: $(B)/obj/shim/ooc-options.o $(B)/obj/shim/options.o $(B)/obj/shim/log.o
	$(call say,LD,$@)$(CC) -o $@ $^ $(LDFLAGS_ALL)

# ---- tests: one runner over every test/check_*.c ----------------------------------------------
T_SRC    := $(wildcard test/check_*.c)
T_OBJ    := $(T_SRC:%.c=$(B)/obj/%.o) $(B)/obj/test/runner.o $(B)/obj/test/testutil.o $(SH_PURE)
T_RUNNER := $(B)/test/runner
T_LIST   := $(B)/test/suites.h

$(T_LIST): $(T_SRC) Makefile
	@mkdir -p $(@D)
	$(Q)for f in $(sort $(T_SRC)); do n=$${f#test/check_}; echo "SUITE($${n%.c})"; done >$@.tmp
	$(Q)cmp -s $@.tmp $@ || mv $@.tmp $@; rm -f $@.tmp

$(B)/obj/test/runner.o: $(T_LIST)
$(B)/obj/test/%.o: test/%.c
	@mkdir -p $(@D)
	$(call say,CC,$<)$(CC) $(CFLAGS_ALL) $(CUDA_INC) -Itest/fakecuda -Iplanner -Ishim \
	    -I$(B)/test -c $< -o $@

$(T_RUNNER): $(T_OBJ) $(FC_LIB) $(PL_LIB)
	$(call say,LD,$@)$(CC) -o $@ $(T_OBJ) $(PL_LIB) -L$(FC_DIR) -lcuda \
	    -Wl,-rpath,'$$ORIGIN/../fakecuda' $(LDFLAGS_ALL) $(CHECK_LIBS) -ldl -lm

# ---- test programs: build/test/progs/<name>, linked with -lcuda (the simulated driver) -----------
TP_BIN := $(patsubst test/progs/%.c,$(B)/test/progs/%,$(wildcard test/progs/*.c))

$(B)/test/progs/%: test/progs/%.c $(FC_LIB)
	@mkdir -p $(@D)
	$(call say,CC,$<)$(CC) $(CFLAGS_ALL) $(CUDA_INC) -Itest/fakecuda -o $@ $< -L$(FC_DIR) -lcuda \
	    -Wl,-rpath,'$$ORIGIN/../../fakecuda' $(LDFLAGS_ALL) -ldl

# dnnlink is linked with -lcudnn too (the simulated one), as framework binaries are.
$(B)/test/progs/dnnlink: test/progs/dnnlink.c $(FC_LIB) $(DNN_LIB)
	@mkdir -p $(@D)
	$(call say,CC,$<)$(CC) $(CFLAGS_ALL) $(CUDA_INC) -Itest/fakecuda -o $@ $< -L$(FC_DIR) -lcudnn \
	    -lcuda -Wl,-rpath,'$$ORIGIN/../../fakecuda' $(LDFLAGS_ALL) -ldl

# ---- GPU checks: build/gpu/<name>, against the real CUDA runtime and driver (test/gpu) -----------
# Built here to prove they compile (check-run builds them when nvcc is present; run here they
# find no device and exit 77); run on a GPU by scripts/check-gpu (`make check-gpu`).
# GPU_ARCH: machine code for Hopper (the H100/H200 of the GPU machine) and PTX that any newer
# GPU can compile. GPU_WERROR= drops -Werror for a host compiler with new warnings.
comma      := ,
GPU_DIR    := $(B)/gpu
GPU_ARCH   ?= -gencode arch=compute_90,code=sm_90 -gencode arch=compute_75,code=compute_75
GPU_WERROR ?= -Werror
NVCC_GPU   := $(NVCC) -O2 -std=c++17 $(GPU_ARCH) -Xcompiler -Wall,-Wextra$(if $(GPU_WERROR),$(comma)$(GPU_WERROR)) -Itest/gpu
GPU_RPATH  := -Xlinker -rpath -Xlinker $(CUDA_HOME)/lib64
GPU_STUBS  := -L$(CUDA_HOME)/lib64/stubs -lcuda
GPU_HDR    := test/gpu/gk.h test/gpu/kernels.cuh
HAVE_CUBLAS := $(if $(wildcard $(CUDA_HOME)/include/cublas_v2.h),1)
GPU_BIN    := $(if $(HAVE_NVCC),$(addprefix $(GPU_DIR)/,interpose interpose-static vmm stray demand \
    driver_paths paraminfo tmap hostvmm freesync remapgate bw libgpuspy.so))

# Programs of the runtime alone (shared libcudart: the way PyTorch links it).
$(GPU_DIR)/%: test/gpu/%.cu $(GPU_HDR)
	@mkdir -p $(@D)
	$(call say,NVCC,$<)$(NVCC_GPU) -cudart shared -o $@ $< -ldl $(GPU_RPATH)

$(GPU_DIR)/vmm: test/gpu/vmm.cu $(GPU_HDR)
	@mkdir -p $(@D)
	$(call say,NVCC,$<)$(NVCC_GPU) -cudart shared -o $@ $< $(GPU_STUBS) -ldl $(GPU_RPATH)

# interpose: shared libcudart, and cuBLAS where the toolkit has it; interpose-static: the static
# libcudart (the copy inside a library such as cuDNN's reaches the driver the same way).
$(GPU_DIR)/interpose: test/gpu/interpose.cu $(GPU_HDR)
	@mkdir -p $(@D)
	$(call say,NVCC,$<)$(NVCC_GPU) -cudart shared $(if $(HAVE_CUBLAS),-DGK_WITH_CUBLAS) -o $@ $< \
	    $(if $(HAVE_CUBLAS),-lcublas) -ldl $(GPU_RPATH)

$(GPU_DIR)/interpose-static: test/gpu/interpose.cu $(GPU_HDR)
	@mkdir -p $(@D)
	$(call say,NVCC,$<)$(NVCC_GPU) -cudart static -o $@ $< -ldl -lpthread -lrt

# The kernels as PTX in a C array, gk_kernels_ptx, for the driver-API program.
$(B)/gen/gk_kernels_ptx.c: test/gpu/kernels.cu $(GPU_HDR)
	@mkdir -p $(@D)
	$(call say,NVCC,$<)$(NVCC) -ptx -arch=compute_75 -Itest/gpu -o $(@D)/gk_kernels.ptx $<
	$(Q){ echo '/* Generated from test/gpu/kernels.cu by the Makefile. */'; \
	    echo 'extern const char gk_kernels_ptx[];'; \
	    echo 'const char gk_kernels_ptx[] ='; \
	    sed -e 's/\\/\\\\/g' -e 's/"/\\"/g' -e 's/^/    "/' -e 's/$$/\\n"/' $(@D)/gk_kernels.ptx; \
	    echo '    "";'; } >$@.tmp && mv $@.tmp $@

$(GPU_DIR)/driver_paths: test/gpu/driver_paths.c test/gpu/gk.h $(B)/gen/gk_kernels_ptx.c
	@mkdir -p $(@D)
	$(call say,CC,$<)$(CC) $(CFLAGS_ALL) $(if $(GPU_WERROR),,-Wno-error) $(CUDA_INC) -Itest/gpu \
	    -o $@ $< $(B)/gen/gk_kernels_ptx.c -L$(CUDA_HOME)/lib64/stubs -lcuda $(LDFLAGS_ALL) -ldl

# The probes of scripts/gpu-first-contact (issue 19). paraminfo and tmap run cuBLAS where the
# toolkit has it; hostvmm, tmap, freesync and remapgate call the driver too (-lcuda).
$(GPU_DIR)/paraminfo: test/gpu/paraminfo.cu $(GPU_HDR)
	@mkdir -p $(@D)
	$(call say,NVCC,$<)$(NVCC_GPU) -cudart shared $(if $(HAVE_CUBLAS),-DGK_WITH_CUBLAS) -o $@ $< \
	    $(if $(HAVE_CUBLAS),-lcublas) -ldl $(GPU_RPATH)

$(GPU_DIR)/tmap: test/gpu/tmap.cu $(GPU_HDR)
	@mkdir -p $(@D)
	$(call say,NVCC,$<)$(NVCC_GPU) -cudart shared $(if $(HAVE_CUBLAS),-DGK_WITH_CUBLAS) -o $@ $< \
	    $(if $(HAVE_CUBLAS),-lcublas) $(GPU_STUBS) -ldl $(GPU_RPATH)

$(GPU_DIR)/hostvmm $(GPU_DIR)/freesync $(GPU_DIR)/remapgate: $(GPU_DIR)/%: test/gpu/%.cu $(GPU_HDR)
	@mkdir -p $(@D)
	$(call say,NVCC,$<)$(NVCC_GPU) -cudart shared -o $@ $< $(GPU_STUBS) -ldl $(GPU_RPATH)

# libgpuspy.so: the diagnostic LD_PRELOAD library of probes paraminfo and tensormap (not the shim).
$(GPU_DIR)/libgpuspy.so: test/gpu/spy.c
	@mkdir -p $(@D)
	$(call say,CC,$<)$(CC) $(CFLAGS_ALL) $(if $(GPU_WERROR),,-Wno-error) $(CUDA_INC) -fPIC -shared \
	    -fvisibility=hidden -o $@ $< $(LDFLAGS_ALL) -ldl

gpu-progs:
ifeq ($(HAVE_NVCC),1)
	$(Q)$(MAKE) --no-print-directory $(GPU_BIN)
else
	@echo "make gpu-progs: nvcc was not found at $(NVCC) (set CUDA_HOME or NVCC)" >&2; exit 1
endif

# What scripts/check-gpu builds on the GPU machine: the shim, ooc-plan and the GPU checks (not
# the simulated device, the workloads or the Check runner, which need Debian's packages).
gpu-build: $(SH_LIB) $(PL_CLI) gpu-progs

# `make check-gpu`: the GPU checks and the PyTorch smoke tests on a real GPU (scripts/check-gpu).
# Without a GPU it says so in one line and fails (exit 2), unless CHECK_GPU_ARGS=--allow-no-gpu.
check-gpu:
	$(Q)OOC_BUILD=$(B) scripts/check-gpu $(CHECK_GPU_ARGS)

# ---- top-level targets -------------------------------------------------------------------------
ALL := $(FC_LIB) $(DNN_LIB) $(BLAS_LIB) $(NCCL_LIB) $(WL_BIN) $(PL_LIB) $(PL_CLI) $(SH_LIB) $(TP_BIN) $(OPT_CLI) \
    $(MAN_PAGES)

.PHONY: all deps test check-run check-arch demo bench valgrind format check-format clean gpu-progs \
    gpu-build check-gpu install uninstall
all: $(ALL)

deps:
	$(Q)scripts/install-deps

# `make test` installs what is missing, builds everything and runs every suite.
test: deps
	$(Q)$(MAKE) --no-print-directory check-run

check-run: $(ALL) $(T_RUNNER) $(if $(SANITIZE),,$(GPU_BIN))
	$(Q)scripts/check-arch $(B)
	$(Q)OOC_BUILD=$(B) $(T_RUNNER)

# `make check-arch`: file sizes, include and call cycles among the shim's files, no call from the
# memory layer up into record or replay, one error vocabulary (scripts/check-arch).
check-arch: $(SH_LIB)
	$(Q)scripts/check-arch $(B)

demo: deps
	$(Q)$(MAKE) --no-print-directory all
	$(Q)OOC_BUILD=$(B) scripts/demo

# `make bench`: benchmarks (not tests): the hook overhead, side by side with and without the shim;
# then the iteration time of the large workload in core, in demand mode and under the planned
# replay, on the simulated device's timing model, against the planner's prediction.
bench: deps
	$(Q)$(MAKE) --no-print-directory all
	$(Q)OOC_BUILD=$(B) scripts/bench-hooks
	$(Q)OOC_BUILD=$(B) scripts/bench-replay

valgrind: deps
	$(Q)$(MAKE) --no-print-directory all $(T_RUNNER)
	$(Q)OOC_BUILD=$(B) OOC_TEST_VALGRIND=1 valgrind --error-exitcode=1 --trace-children=yes \
	    --leak-check=full --errors-for-leak-kinds=definite --suppressions=test/valgrind.supp \
	    $(T_RUNNER) $(VALGRIND_SUITES)

format:
	$(Q)clang-format -i $$(git ls-files '*.c' '*.h' '*.cu' '*.cuh')

check-format:
	$(Q)clang-format --dry-run --Werror $$(git ls-files '*.c' '*.h' '*.cu' '*.cuh')

clean:
	rm -rf build

# ---- make install / make uninstall ------------------------------------------------------------
# `make install PREFIX=/usr DESTDIR=/tmp/pkg`: the library, the commands, the public header, the
# option checker ooc-run asks, and a man page per command (their --help, scripts/mkman). Nothing
# else is needed at run time; `make uninstall` (same PREFIX and DESTDIR) removes exactly these.
PREFIX  ?= /usr/local
DESTDIR ?=
VERSION ?= $(or $(shell git describe --always --dirty 2>/dev/null),unknown)
INST      := $(DESTDIR)$(PREFIX)
INSTALLED := lib/libooc_shim.so bin/ooc-run bin/ooc-plan bin/ooc-report include/ooc_shim.h \
    libexec/ooc-shim/ooc-options $(MAN_CMDS:%=share/man/man1/%.1)

$(B)/man/ooc-run.1: scripts/ooc-run scripts/mkman $(OPT_CLI)
	@mkdir -p $(@D)
	$(call say,MAN,$@)OOC_BUILD=$(B) scripts/mkman ooc-run "run a program under ooc-shim" \
	    scripts/ooc-run --help >$@.tmp && mv $@.tmp $@
$(B)/man/ooc-plan.1: $(PL_CLI) scripts/mkman
	@mkdir -p $(@D)
	$(call say,MAN,$@)scripts/mkman ooc-plan "plan a profile under a memory budget" \
	    $(PL_CLI) --help >$@.tmp && mv $@.tmp $@
$(B)/man/ooc-report.1: scripts/ooc-report scripts/mkman
	@mkdir -p $(@D)
	$(call say,MAN,$@)scripts/mkman ooc-report "draw the pictures of a profile and of a plan" \
	    scripts/ooc-report --help >$@.tmp && mv $@.tmp $@

install: $(SH_LIB) $(PL_CLI) $(OPT_CLI) $(MAN_PAGES)
	$(Q)install -d '$(INST)/bin' '$(INST)/lib' '$(INST)/include' '$(INST)/libexec/ooc-shim' \
	    '$(INST)/share/man/man1'
	$(Q)install -m 755 $(SH_LIB) '$(INST)/lib/libooc_shim.so'
	$(Q)sed 's/^version=@VERSION@$$/version=$(VERSION)/' scripts/ooc-run >'$(INST)/bin/ooc-run'
	$(Q)chmod 755 '$(INST)/bin/ooc-run'
	$(Q)install -m 755 $(PL_CLI) '$(INST)/bin/ooc-plan'
	$(Q)install -m 755 scripts/ooc-report '$(INST)/bin/ooc-report'
	$(Q)install -m 644 shim/ooc_shim.h '$(INST)/include/ooc_shim.h'
	$(Q)install -m 755 $(OPT_CLI) '$(INST)/libexec/ooc-shim/ooc-options'
	$(Q)for m in $(MAN_PAGES); do \
	    install -m 644 "$$m" '$(INST)/share/man/man1/'"$${m##*/}" || exit 1; done
	@echo "installed in $(INST): $(INSTALLED)"

uninstall:
	$(Q)rm -f $(addprefix '$(INST)/,$(addsuffix ',$(INSTALLED)))
	$(Q)rmdir '$(INST)/libexec/ooc-shim' 2>/dev/null || true
	@echo "removed from $(INST): $(INSTALLED)"

# ---- planner extras (fuzz, bench-planner): owned by the planner work ---------------------------
# `make bench-planner`: planning times and the Table-1-style tables (a benchmark, not a test).
# `make fuzz`: libFuzzer (clang) over the profile and plan readers, seeded with the reference
# profiles and their plans, FUZZ_SECONDS per target (default 30: 60 s in all).
PL_BENCH     := $(B)/bench-planner
FUZZ_DIR     := $(B)/fuzz
FUZZ_SECONDS ?= 30
FUZZ_CC      ?= clang
FUZZ_FLAGS   := -std=c11 -D_GNU_SOURCE -O1 -g -fsanitize=fuzzer,address,undefined \
                -fno-sanitize-recover=all -Iplanner
PL_FUZZ_SRC  := $(filter-out planner/ooc-plan.c,$(wildcard planner/*.c))

$(PL_BENCH): test/bench_planner.c $(PL_LIB)
	@mkdir -p $(@D)
	$(call say,LD,$@)$(CC) $(CFLAGS_ALL) -Iplanner -o $@ test/bench_planner.c $(PL_LIB) \
	    $(LDFLAGS_ALL) -lm

bench-planner: $(PL_BENCH)
	$(Q)$(PL_BENCH) profiles/synthetic profiles/recorded

$(FUZZ_DIR)/fuzz_%: test/fuzz_%.c $(PL_FUZZ_SRC) planner/ooc_planner.h planner/schedule.h
	@mkdir -p $(@D)
	$(call say,FUZZCC,$@)$(FUZZ_CC) $(FUZZ_FLAGS) -o $@ $< $(PL_FUZZ_SRC) -lm

fuzz: $(FUZZ_DIR)/fuzz_profile $(FUZZ_DIR)/fuzz_plan $(PL_CLI)
	$(Q)scripts/fuzz-seeds $(FUZZ_DIR) $(PL_CLI)
	$(Q)$(FUZZ_DIR)/fuzz_profile -max_total_time=$(FUZZ_SECONDS) -timeout=10 -rss_limit_mb=2048 \
	    -print_final_stats=1 $(FUZZ_DIR)/corpus-profile $(FUZZ_DIR)/seeds-profile
	$(Q)$(FUZZ_DIR)/fuzz_plan -max_total_time=$(FUZZ_SECONDS) -timeout=10 -rss_limit_mb=2048 \
	    -print_final_stats=1 $(FUZZ_DIR)/corpus-plan $(FUZZ_DIR)/seeds-plan

# `make report`: scripts/ooc-report's pictures of a committed profile and of a plan for it, in
# $(B)/report/ (REPORT_PROFILE at REPORT_BUDGET, where the plan swaps and recomputes). Needs
# python3-matplotlib: scripts/install-deps --report installs it when missing (as root).
REPORT_PROFILE ?= profiles/synthetic/resnet50-batch256
REPORT_BUDGET  ?= 8G
REPORT_DIR     := $(B)/report

report: $(PL_CLI)
	$(Q)scripts/ooc-report --check-deps 2>/dev/null || scripts/install-deps --report || true
	$(Q)scripts/ooc-report --check-deps || { \
	    echo "make report: python3-matplotlib is missing; run: sudo apt-get install -y python3-matplotlib" >&2; \
	    exit 1; }
	$(Q)mkdir -p $(REPORT_DIR)
	$(Q)$(PL_CLI) --policy auto --budget $(REPORT_BUDGET) --out $(REPORT_DIR)/plan.tsv \
	    $(REPORT_PROFILE)
	$(Q)OOC_BUILD=$(B) scripts/ooc-report $(REPORT_PROFILE) --plan $(REPORT_DIR)/plan.tsv \
	    --out $(REPORT_DIR) --format png,svg

.PHONY: bench-planner fuzz report

# ---- end of planner extras ---------------------------------------------------------------------

-include $(shell find $(B) -name '*.d' 2>/dev/null)
