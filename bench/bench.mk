# Included by the top Makefile.  Owns every bench target.
BENCH_SRC := $(sort $(wildcard bench/fanout-bench*.c))
build/plain/fanout-bench: $(BENCH_SRC) $(wildcard bench/*.h) build/plain/libfanout.a
	$(CC) $(BASE_CFLAGS) $(CFLAGS_plain) -Ibench $(BENCH_SRC) -o $@ \
		build/plain/libfanout.a $(DEP_LIBS) -ljemalloc -lm

run: deps build/plain/fanout-bench
	build/plain/fanout-bench $(BENCH_ARGS)

bench: run
