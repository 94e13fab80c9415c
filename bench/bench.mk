# Included by the top Makefile.  Owns every bench target.
#
#   make run          the full side-by-side comparison (about 3 minutes):
#                     fanout, its peers, the physical limits; the table on
#                     stdout, plots in bench/out/, bench/RESULTS.md;
#                     then build/plain/flags-cost: the default
#                     against FANOUT_NO_CHILD_CLOCK / FANOUT_BORROW_TASKS
#   make bench        the same with longer sweeps (--long)
#   make bench-quick  fanout alone: orchestrator load, batch sweep, latency
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

run: deps bench-deps $(BENCH_BIN) build/plain/flags-cost
	$(BENCH_BIN) $(BENCH_ARGS)
	@echo "== the opt-in flags (FANOUT_NO_CHILD_CLOCK, FANOUT_BORROW_TASKS) against the default =="
	build/plain/flags-cost
	@sh scripts/deps.sh $(PY_DEPS) && sh scripts/python-run.sh

# The Python package's asyncio figures and examples/orchestrator.py alone.
python-bench: deps
	@sh scripts/deps.sh $(PY_DEPS) && sh scripts/python-run.sh

bench: deps bench-deps $(BENCH_BIN)
	$(BENCH_BIN) --long $(BENCH_ARGS)

bench-quick: deps bench-deps $(BENCH_BIN)
	$(BENCH_BIN) --quick $(BENCH_ARGS)

# What FANOUT_NO_CHILD_CLOCK and FANOUT_BORROW_TASKS save per child
# (bench/flags-cost.c): build/plain/flags-cost [ROUNDS].
build/plain/flags-cost: bench/flags-cost.c include/fanout.h build/plain/libfanout.a
	$(CC) $(BENCH_CFLAGS) -o $@ $< build/plain/libfanout.a $(DEP_LIBS)
