# examples/examples.mk - small programs a user copies from (examples/*.c).
# Included by the top Makefile; `make test` runs examples-check.
#
#   make examples         build them (build/examples/), warnings are errors
#   make examples-check   build and run each; each checks its own results
#
# They see only include/fanout.h, as an installed user would, and link the
# archive `make install` installs (no test hooks).

EXAMPLE_SRC  := $(sort $(wildcard examples/*.c))
EXAMPLE_BINS := $(patsubst examples/%.c,build/examples/%,$(EXAMPLE_SRC))
EXAMPLE_CFLAGS := -std=c11 -O2 -g -Wall -Wextra -Werror -Iinclude

.PHONY: examples examples-check

build/examples/%: examples/%.c include/fanout.h build/plain/dist/libfanout.a
	@mkdir -p $(dir $@)
	$(CC) $(EXAMPLE_CFLAGS) $(EXTRA_CFLAGS) $< -o $@ \
		build/plain/dist/libfanout.a $(LDFLAGS) $(DEP_LIBS)

examples: $(EXAMPLE_BINS)

examples-check: $(EXAMPLE_BINS)
	@for x in $(EXAMPLE_BINS); do \
		echo "== $$x"; \
		timeout -k 5 120 $$x || { echo "FAILED $$x"; exit 1; }; \
	done; echo "examples-check: $(words $(EXAMPLE_BINS)) examples ran and checked their results"

EXTRA_TESTS += examples-check
