# fanout - see README.md.  `make run` and `make test` do everything.
#
# Build variants live side by side under build/<variant>/:
#   plain  -O2, jemalloc (the shipped library)
#   asan   AddressSanitizer + UndefinedBehaviorSanitizer, system malloc
#   tsan   ThreadSanitizer, system malloc, TSan annotations compiled in
# (sanitizers replace malloc, so their builds do not use jemalloc).
#
# libfanout.a carries its own private copy of jemalloc (Debian's
# libjemalloc_pic.a, linked into the archive's one object, every symbol
# but the fanout_* API made local): it serves fanout's blocks only and the
# program keeps its own malloc.  libfanout.so is built from separate
# objects (build/plain/obj-pic/) with global-dynamic thread-locals and the
# system allocator, so that it loads with dlopen: jemalloc's 2.6 KB of
# initial-exec TLS cannot (README, "Loading with dlopen").

PREFIX     ?= /usr/local
DESTDIR    ?=
LIBDIR     ?= $(PREFIX)/lib
INCLUDEDIR ?= $(PREFIX)/include
CC         ?= cc
LDFLAGS    ?=
# The version is written once, in include/fanout.h.
fanout_version_part = $(shell sed -n 's/^\#define FANOUT_VERSION_$(1) *//p' include/fanout.h)
VERSION    := $(call fanout_version_part,MAJOR).$(call fanout_version_part,MINOR).$(call fanout_version_part,PATCH)

DEP_LIBS   := -lurcu-bp -lurcu-cds -lurcu-common -lck -lpthread -lm
BASE_CFLAGS := -std=c11 -D_GNU_SOURCE -g -fPIC -fvisibility=hidden \
	-Wall -Wextra -Wshadow -Wstrict-prototypes -Wno-unused-parameter \
	-Iinclude -Iqueue -Ilib
EXTRA_CFLAGS ?=

# Small memsets of a size known at compile time (a record's head, five
# lines, on every delegation) as a loop of 16-byte stores, not `rep stos`,
# whose start-up cost 2.8% of a batch-1 fanout_run, nor 8-byte ones, twice
# the instructions (bench/PROFILE.txt phases 18 and 19); only where the
# compiler has the option (gcc on x86).
MEMSET_OPT := -mmemset-strategy=vector_loop:1024:noalign,libcall:-1:noalign
MEMSET_STRATEGY := $(shell $(CC) -Werror $(MEMSET_OPT) -E -x c /dev/null \
	>/dev/null 2>&1 && echo $(MEMSET_OPT))
CFLAGS_plain := -O2 -DFANOUT_JEMALLOC $(MEMSET_STRATEGY)
LIBS_plain   :=
# Linked privately into build/plain/libfanout.a (see above).
BUNDLE_plain  = $(shell $(CC) -print-file-name=libjemalloc_pic.a)
# The shared library's objects: plain's flags minus jemalloc.
CFLAGS_pic   := -O2 -DFQ_TLS_GLOBAL_DYNAMIC $(MEMSET_STRATEGY)
# The sanitizer builds carry the test points (include/fanout_testing.h).
CFLAGS_asan  := -O1 -fno-omit-frame-pointer -fsanitize=address,undefined \
	-fno-sanitize-recover=undefined -DFANOUT_NO_LGPL -DFANOUT_TEST_POINTS
LIBS_asan    := -fsanitize=address,undefined
CFLAGS_tsan  := -O1 -fno-omit-frame-pointer -fsanitize=thread \
	-DFANOUT_NO_LGPL -Wno-tsan -DFANOUT_TEST_POINTS
LIBS_tsan    := -fsanitize=thread

LIB_SRC   := $(sort $(wildcard queue/*.c lib/*.c))
# What is installed leaves out the test hooks (include/fanout_testing.h),
# which only build/<variant>/libfanout.a, the archive the tests link, has.
DIST_SRC  := $(filter-out lib/testing.c,$(LIB_SRC))
DIST_OBJ  := $(patsubst %.c,build/plain/obj/%.o,$(DIST_SRC))
DIST_PIC_OBJ := $(patsubst %.c,build/plain/obj-pic/%.o,$(DIST_SRC))
LIB_HDR   := $(wildcard include/*.h queue/*.h lib/*.h)
TEST_SRC  := $(sort $(wildcard tests/test_*.c))
TEST_NAMES := $(patsubst tests/%.c,%,$(TEST_SRC))
VARIANTS  := plain asan tsan

# Extra libraries of one suite, TEST_LIBS_<name> (tests only, never the
# library): test_format checks its JSON with jansson.
TEST_LIBS_test_format := -ljansson

# Per-test timeout (seconds) so a hang fails instead of eating CI's time.
TEST_TIMEOUT ?= 300

.PHONY: all run test deps clean install uninstall check-install check-probes bench \
	test-dlopen python-test \
	$(addprefix test-,$(VARIANTS)) $(addprefix lib-,$(VARIANTS))

all: build/plain/libfanout.a build/plain/libfanout.so build/plain/dist/libfanout.a

# Only `make run`, `make test` and the bench targets check the Debian
# packages first (scripts/deps.sh, which may call dpkg and apt-get); `make
# all` and everything else just build with whatever the compiler finds.
deps:
	@sh scripts/deps.sh
DEPS_FIRST := $(if $(filter run test bench bench-quick,$(MAKECMDGOALS)),deps)

# ------------------------------------------------------------------ library
define variant_rules
build/$(1)/obj/%.o: %.c $(LIB_HDR) | $(DEPS_FIRST)
	@mkdir -p $$(dir $$@)
	$$(CC) $$(BASE_CFLAGS) $$(CFLAGS_$(1)) $$(EXTRA_CFLAGS) -c $$< -o $$@

# One relocatable object, with every other symbol made local: only the
# public fanout_* API (and, in this archive, the fanout_test_* hooks the
# tests use) stays global - the bundled jemalloc's malloc, free,
# mallocx... included: they serve fanout alone.
build/$(1)/libfanout.a: $(patsubst %.c,build/$(1)/obj/%.o,$(LIB_SRC))
	@mkdir -p $$(dir $$@)
	ld -r -o build/$(1)/fanout-all.o $$^ $$(BUNDLE_$(1))
	objcopy --localize-hidden --wildcard --keep-global-symbol='fanout_*' \
		build/$(1)/fanout-all.o
	rm -f $$@ && ar rcs $$@ build/$(1)/fanout-all.o

lib-$(1): build/$(1)/libfanout.a

build/$(1)/tests/%: tests/%.c tests/common.h tests/defer.h tests/utf8.h build/$(1)/libfanout.a
	@mkdir -p $$(dir $$@)
	$$(CC) $$(BASE_CFLAGS) $$(CFLAGS_$(1)) $$(EXTRA_CFLAGS) $$< -o $$@ \
		build/$(1)/libfanout.a -lcmocka $$(TEST_LIBS_$$*) $$(DEP_LIBS) \
		$$(LIBS_$(1))

test-$(1): $(addprefix build/$(1)/tests/,$(TEST_NAMES))
	@sh scripts/run-tests.sh $(1) $(TEST_TIMEOUT) $$^
endef
$(foreach v,$(VARIANTS),$(eval $(call variant_rules,$(v))))

# The installed archive: the same, without the test hooks.
build/plain/dist/libfanout.a: $(DIST_OBJ)
	@mkdir -p $(dir $@)
	ld -r -o build/plain/dist/fanout-all.o $^ $(BUNDLE_plain)
	objcopy --localize-hidden --wildcard --keep-global-symbol='fanout_*' \
		build/plain/dist/fanout-all.o
	rm -f $@ && ar rcs $@ build/plain/dist/fanout-all.o

# Exports exactly the FANOUT_API functions of include/fanout.h.
build/fanout.map: include/fanout.h scripts/public-symbols.sh
	@mkdir -p $(dir $@)
	sh scripts/public-symbols.sh --map include/fanout.h > $@

build/plain/obj-pic/%.o: %.c $(LIB_HDR) | $(DEPS_FIRST)
	@mkdir -p $(dir $@)
	$(CC) $(BASE_CFLAGS) $(CFLAGS_pic) $(EXTRA_CFLAGS) -c $< -o $@

# No jemalloc and no initial-exec TLS: it must load with dlopen (Python,
# ctypes, plugins) and leave the host's malloc alone.
build/plain/libfanout.so: $(DIST_PIC_OBJ) build/fanout.map
	$(CC) -shared -Wl,-soname,libfanout.so.0 -Wl,-z,defs \
		-Wl,--version-script=build/fanout.map -o $@ $(DIST_PIC_OBJ) \
		$(LDFLAGS) $(DEP_LIBS)

# libfanout.so dlopen()ed by a program that does not link fanout.
build/plain/tests/dlopen_host: tests/dlopen_host.c include/fanout.h | $(DEPS_FIRST)
	@mkdir -p $(dir $@)
	$(CC) $(BASE_CFLAGS) -O2 $< -o $@ -lcmocka -lpthread -ldl

test-dlopen: build/plain/tests/dlopen_host build/plain/libfanout.so
	build/plain/tests/dlopen_host build/plain/libfanout.so

# The Python package (python/): pip install ./python into a throwaway venv,
# offline, then its unittest suite.  PYTHON=... picks the interpreter.
PY_DEPS := python3 python3-dev python3-cffi python3-venv python3-pip \
	python3-setuptools
python-test: deps
	@sh scripts/deps.sh $(PY_DEPS)
	@sh scripts/python-test.sh $(PYTHON)

# -------------------------------------------------------------------- bench
# bench/bench.mk defines `run` (the main job) and `bench` (longer sweeps).
include bench/bench.mk
# make models / torture / fuzz live beside their sources.  tests/extra.mk
# may append targets to EXTRA_TESTS; `make test` runs them last.
EXTRA_TESTS :=
-include tests/models/models.mk
-include tests/extra.mk
-include examples/examples.mk
# Remote children over NATS JetStream (optional: needs libnats-dev).
-include remote/remote.mk

# --------------------------------------------------------------------- test
test: deps
	$(MAKE) --no-print-directory test-plain
	$(MAKE) --no-print-directory check-install
	$(MAKE) --no-print-directory check-probes
	$(MAKE) --no-print-directory test-dlopen
	$(MAKE) --no-print-directory python-test
	$(MAKE) --no-print-directory test-asan
	$(MAKE) --no-print-directory test-tsan
	$(if $(strip $(EXTRA_TESTS)),$(MAKE) --no-print-directory $(EXTRA_TESTS))
	@echo "make test: all suites passed (plain, asan+ubsan, tsan, install, probes, dlopen, python, torture, examples)"
	@cat $(addsuffix /test-counts,$(addprefix build/,$(VARIANTS) python)) | \
		awk '{p += $$1; f += $$2} END {printf "tests: %d passed, %d failed\n", p, f}'

# Install into a scratch DESTDIR and build programs against it as a user
# would: statically through pkg-config --static, dynamically with plain
# -lfanout and through pkg-config --libs.
check-install: all
	@sh scripts/check-install.sh

# The USDT probes of lib/probes.h are in the .a and .so, and fire (gdb).
check-probes: all
	@sh tests/check-probes.sh

# ------------------------------------------------------------------ install
# libdir and includedir are written relative to ${prefix} when they lie
# under it, so the .pc file follows a relocated prefix.
pc_rel = $(patsubst $(PREFIX)/%,$${prefix}/%,$(1))
# Written at every install: it holds PREFIX, which may differ per call.
.PHONY: FORCE
fanout.pc: fanout.pc.in FORCE
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@LIBDIR@|$(call pc_rel,$(LIBDIR))|' \
	    -e 's|@INCLUDEDIR@|$(call pc_rel,$(INCLUDEDIR))|' \
	    -e 's|@VERSION@|$(VERSION)|' $< > $@

install: all fanout.pc
	install -d $(DESTDIR)$(INCLUDEDIR) $(DESTDIR)$(LIBDIR)/pkgconfig
	install -m 644 include/fanout.h $(DESTDIR)$(INCLUDEDIR)/fanout.h
	install -m 644 build/plain/dist/libfanout.a $(DESTDIR)$(LIBDIR)/libfanout.a
	install -m 755 build/plain/libfanout.so \
		$(DESTDIR)$(LIBDIR)/libfanout.so.$(VERSION)
	ln -sf libfanout.so.$(VERSION) $(DESTDIR)$(LIBDIR)/libfanout.so.0
	ln -sf libfanout.so.$(VERSION) $(DESTDIR)$(LIBDIR)/libfanout.so
	install -m 644 fanout.pc $(DESTDIR)$(LIBDIR)/pkgconfig/fanout.pc

uninstall:
	rm -f $(DESTDIR)$(INCLUDEDIR)/fanout.h $(DESTDIR)$(LIBDIR)/libfanout.a \
	      $(DESTDIR)$(LIBDIR)/libfanout.so $(DESTDIR)$(LIBDIR)/libfanout.so.0 \
	      $(DESTDIR)$(LIBDIR)/libfanout.so.$(VERSION) \
	      $(DESTDIR)$(LIBDIR)/pkgconfig/fanout.pc

clean:
	rm -rf build fanout.pc
