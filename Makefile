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

# ---- the simulated device: libcuda.so.1 and libcudnn.so.9 -----------------------------------
FC_SRC  := $(filter-out test/fakecuda/cudnn.c,$(wildcard test/fakecuda/*.c))
FC_OBJ  := $(FC_SRC:%.c=$(B)/obj/%.o)
FC_LIB  := $(B)/fakecuda/libcuda.so.1
DNN_OBJ := $(B)/obj/test/fakecuda/cudnn.o
DNN_LIB := $(if $(wildcard test/fakecuda/cudnn.c),$(B)/fakecuda/libcudnn.so.9)
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
SH_SRC := $(wildcard shim/*.c)
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

$(B)/obj/shim/%.o: shim/%.c
	@mkdir -p $(@D)
	$(call say,CC,$<)$(CC) $(CFLAGS_ALL) $(CUDA_INC) -Iplanner -fPIC -fvisibility=hidden \
	    -DHASH_NONFATAL_OOM=1 -c $< -o $@

# Shim modules that never call the driver; the test runner links them for unit tests.
SH_PURE := $(filter $(addprefix $(B)/obj/shim/,options.o log.o stats.o iterdet.o),$(SH_OBJ))

$(B)/libooc_shim.so: $(SH_OBJ) $(PL_LIB)
	$(call say,LD,$@)$(CC) -shared -o $@ $(SH_OBJ) $(PL_LIB) $(LDFLAGS_ALL) -ldl -lm \
	    $$(pkg-config --libs libunwind 2>/dev/null || echo -lunwind)

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

# ---- top-level targets -------------------------------------------------------------------------
ALL := $(FC_LIB) $(DNN_LIB) $(WL_BIN) $(PL_LIB) $(PL_CLI) $(SH_LIB) $(TP_BIN)

.PHONY: all deps test check-run demo bench valgrind format check-format clean
all: $(ALL)

deps:
	$(Q)scripts/install-deps

# `make test` installs what is missing, builds everything and runs every suite.
test: deps
	$(Q)$(MAKE) --no-print-directory check-run

check-run: $(ALL) $(T_RUNNER)
	$(Q)OOC_BUILD=$(B) $(T_RUNNER)

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
	$(Q)clang-format -i $$(git ls-files '*.c' '*.h')

check-format:
	$(Q)clang-format --dry-run --Werror $$(git ls-files '*.c' '*.h')

clean:
	rm -rf build

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
	$(Q)$(PL_BENCH) profiles/synthetic

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
