# Included by the top Makefile.  Owns every bench target.
#
#   make run          the full side-by-side comparison (about 4 minutes):
#                     fanout, its peers, the physical limits; the table on
#                     stdout ending with issue 13's bars, plots in
#                     bench/out/, bench/RESULTS.md; then barcheck (below)
#   make bench        the same with longer sweeps (--long)
#   make bench-quick  fanout alone: orchestrator load, batch sweep, latency
#   make barcheck     the independent check of the bars alone (see below)
#   make python-bench the Python package: 40 x 100 ms children vs asyncio
#                     and ThreadPoolExecutor, 10k no-op children, the example
#   BENCH_ARGS=...    extra options, e.g. BENCH_ARGS="--json --only latency"
#
# The peers come from Debian packages, installed by scripts/deps.sh.
BENCH_DEPS := libuv1-dev libglib2.0-dev libtbb-dev g++ gnuplot-nox python3
BENCH_BIN  := build/plain/fanout-bench
BENCH_OBJ  := build/plain/bench
BENCH_SRC  := $(sort $(wildcard bench/fanout-bench*.c))
BENCH_HDR  := $(wildcard bench/*.h) include/fanout.h
BENCH_PEER_C := bench/peer-mutexpool.c bench/peer-uv.c bench/peer-glib.c \
	bench/peer-omp.c
BENCH_OBJS := $(patsubst bench/%.c,$(BENCH_OBJ)/%.o,$(BENCH_SRC) $(BENCH_PEER_C)) \
	$(BENCH_OBJ)/peer-tbb.o
BENCH_CFLAGS := $(BASE_CFLAGS) $(CFLAGS_plain) -Ibench -DBENCH_HAVE_PEERS
# pkg-config is asked only when a bench recipe runs (after bench-deps).
BENCH_PKG_CFLAGS = $(shell pkg-config --cflags libuv glib-2.0 2>/dev/null)
BENCH_PKG_LIBS = $(shell pkg-config --libs libuv glib-2.0 tbb 2>/dev/null || \
	echo -luv -lglib-2.0 -ltbb)

.PHONY: bench-deps bench-quick python-bench

bench-deps:
	@sh scripts/deps.sh $(BENCH_DEPS)

$(BENCH_OBJ)/%.o: bench/%.c $(BENCH_HDR) | bench-deps
	@mkdir -p $(dir $@)
	$(CC) $(BENCH_CFLAGS) $(BENCH_PKG_CFLAGS) -c $< -o $@

$(BENCH_OBJ)/peer-omp.o: bench/peer-omp.c $(BENCH_HDR) | bench-deps
	@mkdir -p $(dir $@)
	$(CC) $(BENCH_CFLAGS) -fopenmp -c $< -o $@

$(BENCH_OBJ)/peer-tbb.o: bench/peer-tbb.cpp $(BENCH_HDR) | bench-deps
	@mkdir -p $(dir $@)
	g++ -std=c++17 -O2 -g -Wall -Wextra -Wno-unused-parameter \
		-Ibench -Iinclude -c $< -o $@

$(BENCH_BIN): $(BENCH_OBJS) build/plain/libfanout.a
	g++ -o $@ $(BENCH_OBJS) build/plain/libfanout.a $(DEP_LIBS) -ljemalloc \
		$(BENCH_PKG_LIBS) -fopenmp -lm

# (barcheck's variables are defined here: a prerequisite list is expanded
# when its rule is read.)
BARCHECK_DIR    := build/barcheck
BARCHECK_PREFIX := $(CURDIR)/$(BARCHECK_DIR)/prefix
BARCHECK_BIN    := $(BARCHECK_DIR)/barcheck
BARCHECK_PC     := PKG_CONFIG_PATH=$(BARCHECK_PREFIX)/lib/pkgconfig pkg-config

run: deps bench-deps $(BENCH_BIN) $(BARCHECK_BIN)
	$(BENCH_BIN) $(BENCH_ARGS)
	$(BARCHECK_BIN) --results bench/RESULTS.md $(BARCHECK_ARGS)
	@sh scripts/deps.sh $(PY_DEPS) && sh scripts/python-run.sh

# The independent check of issue 13's bars (bench/barcheck.c and
# bench/barcheck-tbb.cpp, no code shared with fanout-bench): built only
# against the library as installed - `make install` into
# build/barcheck/prefix, then `pkg-config --cflags --libs fanout`, which
# links libfanout.so - and run by `make run` after fanout-bench (about
# 40 s) and added as the last section of bench/RESULTS.md.  `make
# barcheck` runs it alone (stdout only); `make barcheck-smoke` runs it
# with --quick and checks that it printed all nine bars (no timing is
# judged there).

.PHONY: barcheck barcheck-smoke

$(BARCHECK_DIR)/installed: build/plain/libfanout.so build/plain/dist/libfanout.a \
		build/plain/libfanout.a \
		include/fanout.h fanout.pc.in
	@mkdir -p $(dir $@)
	$(MAKE) --no-print-directory install PREFIX=$(BARCHECK_PREFIX) >/dev/null
	@touch $@

$(BARCHECK_BIN): bench/barcheck.c bench/barcheck-tbb.cpp $(BARCHECK_DIR)/installed \
		| bench-deps
	$(CC) -std=c11 -D_GNU_SOURCE -O2 -g -Wall -Wextra -Wno-unused-parameter \
		$$($(BARCHECK_PC) --cflags fanout) -c bench/barcheck.c \
		-o $(BARCHECK_DIR)/barcheck.o
	g++ -std=c++17 -O2 -g -Wall -Wextra -c bench/barcheck-tbb.cpp \
		-o $(BARCHECK_DIR)/barcheck-tbb.o
	g++ -o $@ $(BARCHECK_DIR)/barcheck.o $(BARCHECK_DIR)/barcheck-tbb.o \
		$$($(BARCHECK_PC) --cflags --libs fanout) \
		-Wl,-rpath,$(BARCHECK_PREFIX)/lib -ltbb -lck -lpthread -lm

barcheck: deps bench-deps $(BARCHECK_BIN)
	$(BARCHECK_BIN) $(BARCHECK_ARGS)

barcheck-smoke: deps bench-deps $(BARCHECK_BIN)
	@$(BARCHECK_BIN) --quick > $(BARCHECK_DIR)/smoke.txt
	@n=$$(grep -cE '^  [1-9] \[(HOLD|MISS| \?\? )\]' $(BARCHECK_DIR)/smoke.txt); \
	  [ "$$n" = 9 ] || { cat $(BARCHECK_DIR)/smoke.txt; \
	    echo "barcheck-smoke: $$n bars printed, 9 expected" >&2; exit 1; }
	@echo "barcheck-smoke: all nine bars printed"

# The Python package's asyncio figures and examples/orchestrator.py alone.
python-bench: deps
	@sh scripts/deps.sh $(PY_DEPS) && sh scripts/python-run.sh

bench: deps bench-deps $(BENCH_BIN)
	$(BENCH_BIN) --long $(BENCH_ARGS)

bench-quick: deps bench-deps $(BENCH_BIN)
	$(BENCH_BIN) --quick $(BENCH_ARGS)

# What FANOUT_NO_CHILD_CLOCK and FANOUT_BORROW_TASKS save per child
# (bench/flags-cost.c): make flags-cost, or build/plain/flags-cost [ROUNDS].
# `make lookup-lines`: the cache lines a record lookup misses on.
build/plain/flags-cost: bench/flags-cost.c include/fanout.h build/plain/libfanout.a
	$(CC) $(BENCH_CFLAGS) -o $@ $< build/plain/libfanout.a $(DEP_LIBS)

.PHONY: flags-cost
flags-cost: build/plain/flags-cost
	build/plain/flags-cost

# Cache lines a lookup of a finished record fetches (bench/lookup-lines.c):
# callgrind's cache simulator with a 2 MiB last level, lookups only.
# valgrind: callgrind, and <valgrind/callgrind.h> for the program.
.PHONY: lookup-lines lookup-lines-deps
lookup-lines-deps:
	@sh scripts/deps.sh valgrind

build/plain/lookup-lines: bench/lookup-lines.c include/fanout.h build/plain/libfanout.a | lookup-lines-deps
	$(CC) $(BENCH_CFLAGS) -o $@ $< build/plain/libfanout.a $(DEP_LIBS)

lookup-lines: build/plain/lookup-lines
	valgrind --tool=callgrind --collect-atstart=no --cache-sim=yes \
		--D1=32768,8,64 --LL=2097152,16,64 \
		--callgrind-out-file=build/plain/lookup-lines.cg \
		build/plain/lookup-lines 20000 200000 2>/dev/null
	@callgrind_annotate build/plain/lookup-lines.cg 2>/dev/null | \
		awk '/^Events shown:/ { for (i = 3; i <= NF; i++) col[$$i] = i - 2 } \
		/PROGRAM TOTALS/ { gsub(/\([^)]*\)/, ""); gsub(",", ""); \
		printf "per lookup: %.1f instructions, %.2f D1 read misses, %.2f LL read misses\n", \
		$$col["Ir"] / 200000, $$col["D1mr"] / 200000, $$col["DLmr"] / 200000 }'

# bench/ab.c: the drivers of bench/PROFILE.txt phase 6 (two builds side by
# side); `make bench-ab` builds build/plain/ab against this tree's library.
build/plain/ab: bench/ab.c build/plain/libfanout.a include/fanout.h
	$(CC) -std=c11 -D_GNU_SOURCE -O2 -Wall -Wextra -Iinclude $< \
		build/plain/libfanout.a $(DEP_LIBS) -o $@

# bench/abdl.c: builds of libfanout.so compared inside one process
# (bench/PROFILE.txt phase 18); it links no fanout, it dlopen()s them.
build/plain/abdl: bench/abdl.c bench/dlfanout.h include/fanout.h
	$(CC) -std=c11 -D_GNU_SOURCE -O2 -Wall -Wextra -Iinclude $< -ldl -o $@

# bench/latab.c: the hot single-child latency tail of such builds, with
# parked phases in between as in fanout-bench (PROFILE.txt phase 20).
build/plain/latab: bench/latab.c bench/dlfanout.h include/fanout.h
	$(CC) -std=c11 -D_GNU_SOURCE -O2 -Wall -Wextra -Iinclude $< -ldl -o $@

.PHONY: bench-ab
bench-ab: build/plain/ab build/plain/abdl build/plain/latab
