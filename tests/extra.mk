# tests/extra.mk - torture and fuzz targets (issue 4).  Included by the top
# Makefile after `EXTRA_TESTS :=`; `make test` runs torture-short last.
#
#   make torture [TORTURE_SECONDS=60] [TORTURE_SEED=S]   plain build
#   make torture-asan / torture-tsan                      same, sanitized
#   make torture-short   ~20 s plain + ~15 s asan + ~15 s tsan (make test)
#   make torture-selftest  seeded harness bugs must be caught (make test)
#   make fuzz [FUZZ_SECONDS=60]   libFuzzer + ASan + UBSan on the API
#
# Each torture run prints its seed first; replay a failure with
# `make torture TORTURE_SEED=<seed>` (or build/<v>/torture -s <seed> -t N).

TORTURE_SECONDS ?= 60
TORTURE_SEED    ?= $(shell date +%s)
TORTURE_SHORT_PLAIN ?= 20
TORTURE_SHORT_SAN   ?= 15
FUZZ_SECONDS    ?= 60
FUZZ_CC         ?= clang
TORTURE_SRC     := tests/torture.c $(wildcard tests/torture_*.c tests/torture_*.h)

# The sanitizer settings of scripts/run-tests.sh, for the torture binaries.
TORTURE_ENV := ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:halt_on_error=1 \
	UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:suppressions=$(CURDIR)/tests/tsan.supp

.PHONY: torture torture-asan torture-tsan torture-short torture-selftest \
	fuzz fuzz-build \
	$(addprefix torture-bin-,$(VARIANTS))

define torture_rules
build/$(1)/torture: $(TORTURE_SRC) build/$(1)/libfanout.a
	@mkdir -p $$(dir $$@)
	$$(CC) $$(BASE_CFLAGS) $$(CFLAGS_$(1)) $$(EXTRA_CFLAGS) tests/torture.c \
		-o $$@ build/$(1)/libfanout.a $$(DEP_LIBS) $$(LIBS_$(1))
torture-bin-$(1): build/$(1)/torture
endef
$(foreach v,$(VARIANTS),$(eval $(call torture_rules,$(v))))

torture: build/plain/torture
	$(TORTURE_ENV) build/plain/torture -s $(TORTURE_SEED) -t $(TORTURE_SECONDS)

torture-asan: build/asan/torture
	$(TORTURE_ENV) build/asan/torture -s $(TORTURE_SEED) -t $(TORTURE_SECONDS)

torture-tsan: build/tsan/torture
	$(TORTURE_ENV) build/tsan/torture -s $(TORTURE_SEED) -t $(TORTURE_SECONDS)

torture-short: build/plain/torture build/asan/torture build/tsan/torture
	$(TORTURE_ENV) build/plain/torture -s $(TORTURE_SEED) -t $(TORTURE_SHORT_PLAIN)
	$(TORTURE_ENV) build/asan/torture -s $(TORTURE_SEED) -t $(TORTURE_SHORT_SAN)
	$(TORTURE_ENV) build/tsan/torture -s $(TORTURE_SEED) -t $(TORTURE_SHORT_SAN)

# The checks must be alive: a seeded harness bug (an event dropped, seen
# twice, seen on the wrong sink, a pending child's completion forgotten)
# must fail the run.
torture-selftest: build/plain/torture
	@for x in 1 2 3 4; do \
		if build/plain/torture -s $(TORTURE_SEED) -t 3 -x $$x \
			> build/plain/torture-selftest-$$x.log 2>&1; then \
			echo "torture-selftest: seeded bug $$x NOT detected"; \
			exit 1; \
		fi; \
		grep -m1 VIOLATION build/plain/torture-selftest-$$x.log; \
	done; echo "torture-selftest: all seeded bugs detected"

EXTRA_TESTS += torture-short torture-selftest

# ------------------------------------------------------------------- fuzz
# The library is compiled again with clang (fuzzer-no-link: coverage only)
# and the system allocator (-DFANOUT_NO_LGPL: see CFLAGS_asan); the harness
# is linked with the libFuzzer runtime.
FUZZ_DIR    := build/fuzz
FUZZ_SAN    := -fsanitize=address,undefined -fno-sanitize-recover=undefined
FUZZ_CFLAGS := $(BASE_CFLAGS) -O1 -fno-omit-frame-pointer -DFANOUT_NO_LGPL \
	-Wno-unknown-warning-option
FUZZ_OBJS   := $(patsubst %.c,$(FUZZ_DIR)/obj/%.o,$(LIB_SRC))
FUZZ_CORPUS := tests/fuzz/corpus

$(FUZZ_DIR)/obj/%.o: %.c $(LIB_HDR)
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link $(FUZZ_SAN) -c $< -o $@

$(FUZZ_DIR)/fuzz_api: tests/fuzz/fuzz_api.c $(FUZZ_OBJS) $(LIB_HDR)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer $(FUZZ_SAN) \
		tests/fuzz/fuzz_api.c $(FUZZ_OBJS) -o $@ $(DEP_LIBS) -ljansson

fuzz-build: $(FUZZ_DIR)/fuzz_api

# New inputs go to build/fuzz/corpus-new, emptied at each run so a short
# run spends its time fuzzing rather than replaying old finds; the
# checked-in seeds in tests/fuzz/corpus carry what is worth keeping.  The
# execution count is libFuzzer's stat::number_of_executed_units.
# The harness keeps engines alive across inputs (see tests/fuzz/README.md),
# so libFuzzer's per-input leak check (-detect_leaks) would flag every input
# and rerun it: it is off, and LeakSanitizer checks the whole run at exit,
# after the harness has destroyed every engine.  FUZZ_FRESH=1 in the
# environment gives the slow mode (a fresh engine per input) for replaying
# an input alone.
fuzz: $(FUZZ_DIR)/fuzz_api
	@rm -rf $(FUZZ_DIR)/corpus-new && mkdir -p $(FUZZ_DIR)/corpus-new
	@echo "fuzz: $(FUZZ_SECONDS) s, log in $(FUZZ_DIR)/fuzz.log"
	@status=0; ASAN_OPTIONS=detect_leaks=1:halt_on_error=1 \
	UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
		$(FUZZ_DIR)/fuzz_api -max_total_time=$(FUZZ_SECONDS) \
		-print_final_stats=1 -timeout=30 -rss_limit_mb=4096 \
		-detect_leaks=0 \
		-artifact_prefix=$(FUZZ_DIR)/ \
		$(FUZZ_DIR)/corpus-new $(FUZZ_CORPUS) > $(FUZZ_DIR)/fuzz.log 2>&1 \
		|| status=$$?; \
	grep -E '^#[0-9]+[[:space:]]+(INITED|DONE)|ERROR|SUMMARY|FUZZ-VIOLATION|artifact' \
		$(FUZZ_DIR)/fuzz.log | tail -40; \
	sed -n 's/^stat::number_of_executed_units: */fuzz: executions: /p' \
		$(FUZZ_DIR)/fuzz.log; \
	if [ $$status -ne 0 ]; then echo "fuzz: FAILED (exit $$status)"; \
	else echo "fuzz: clean"; fi; exit $$status
