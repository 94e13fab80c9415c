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
VERSION    := 0.1.0

DEP_LIBS   := -lurcu-bp -lurcu-cds -lurcu-common -lck -lpthread -lm
BASE_CFLAGS := -std=c11 -D_GNU_SOURCE -g -fPIC -fvisibility=hidden \
	-Wall -Wextra -Wshadow -Wstrict-prototypes -Wno-unused-parameter \
	-Iinclude -Iqueue -Ilib
EXTRA_CFLAGS ?=

CFLAGS_plain := -O2 -DFANOUT_JEMALLOC
LIBS_plain   :=
# Linked privately into build/plain/libfanout.a (see above).
BUNDLE_plain  = $(shell $(CC) -print-file-name=libjemalloc_pic.a)
# The shared library's objects: plain's flags minus jemalloc.
CFLAGS_pic   := -O2 -DFQ_TLS_GLOBAL_DYNAMIC
CFLAGS_asan  := -O1 -fno-omit-frame-pointer -fsanitize=address,undefined \
	-fno-sanitize-recover=undefined -DFANOUT_NO_LGPL
LIBS_asan    := -fsanitize=address,undefined
CFLAGS_tsan  := -O1 -fno-omit-frame-pointer -fsanitize=thread \
	-DFANOUT_NO_LGPL -Wno-tsan
LIBS_tsan    := -fsanitize=thread

LIB_SRC   := $(sort $(wildcard queue/*.c lib/*.c))
LIB_HDR   := $(wildcard include/*.h queue/*.h lib/*.h)
TEST_SRC  := $(sort $(wildcard tests/test_*.c))
TEST_NAMES := $(patsubst tests/%.c,%,$(TEST_SRC))
VARIANTS  := plain asan tsan

# Per-test timeout (seconds) so a hang fails instead of eating CI's time.
TEST_TIMEOUT ?= 300

.PHONY: all run test deps clean install uninstall check-install bench test-dlopen python-test \
	$(addprefix test-,$(VARIANTS)) $(addprefix lib-,$(VARIANTS))

all: build/plain/libfanout.a build/plain/libfanout.so

deps:
	@sh scripts/deps.sh

# ------------------------------------------------------------------ library
define variant_rules
build/$(1)/obj/%.o: %.c $(LIB_HDR) | deps-ok
	@mkdir -p $$(dir $$@)
	$$(CC) $$(BASE_CFLAGS) $$(CFLAGS_$(1)) $$(EXTRA_CFLAGS) -c $$< -o $$@

# One relocatable object, with every other symbol made local: only the
# public fanout_* API stays global in the archive (the bundled jemalloc's
# malloc, free, mallocx... included: they serve fanout alone).
build/$(1)/libfanout.a: $(patsubst %.c,build/$(1)/obj/%.o,$(LIB_SRC))
	@mkdir -p $$(dir $$@)
	ld -r -o build/$(1)/fanout-all.o $$^ $$(BUNDLE_$(1))
	objcopy --localize-hidden --wildcard --keep-global-symbol='fanout_*' \
		build/$(1)/fanout-all.o
	rm -f $$@ && ar rcs $$@ build/$(1)/fanout-all.o

lib-$(1): build/$(1)/libfanout.a

build/$(1)/tests/%: tests/%.c tests/common.h build/$(1)/libfanout.a
	@mkdir -p $$(dir $$@)
	$$(CC) $$(BASE_CFLAGS) $$(CFLAGS_$(1)) $$(EXTRA_CFLAGS) $$< -o $$@ \
		build/$(1)/libfanout.a -lcmocka $$(DEP_LIBS) $$(LIBS_$(1))

test-$(1): $(addprefix build/$(1)/tests/,$(TEST_NAMES))
	@sh scripts/run-tests.sh $(1) $(TEST_TIMEOUT) $$^
endef
$(foreach v,$(VARIANTS),$(eval $(call variant_rules,$(v))))

build/plain/obj-pic/%.o: %.c $(LIB_HDR) | deps-ok
	@mkdir -p $(dir $@)
	$(CC) $(BASE_CFLAGS) $(CFLAGS_pic) $(EXTRA_CFLAGS) -c $< -o $@

# No jemalloc and no initial-exec TLS: it must load with dlopen (the
# Python package, ctypes, plugins) and leave the host's malloc alone.
build/plain/libfanout.so: $(patsubst %.c,build/plain/obj-pic/%.o,$(LIB_SRC))
	$(CC) -shared -Wl,-soname,libfanout.so.0 -Wl,-z,defs -o $@ $^ $(DEP_LIBS)

# libfanout.so dlopen()ed by a program that does not link fanout.
build/plain/tests/dlopen_host: tests/dlopen_host.c include/fanout.h | deps-ok
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

.PHONY: deps-ok
deps-ok:
	@sh scripts/deps.sh

# -------------------------------------------------------------------- bench
# bench/bench.mk defines `run` (the main job) and `bench` (longer sweeps).
include bench/bench.mk
# make models / torture / fuzz live beside their sources.  tests/extra.mk
# may append targets to EXTRA_TESTS; `make test` runs them last.
EXTRA_TESTS :=
-include tests/models/models.mk
-include tests/extra.mk

# --------------------------------------------------------------------- test
test: deps
	$(MAKE) --no-print-directory test-plain
	$(MAKE) --no-print-directory check-install
	$(MAKE) --no-print-directory test-dlopen
	$(MAKE) --no-print-directory python-test
	$(MAKE) --no-print-directory test-asan
	$(MAKE) --no-print-directory test-tsan
	$(if $(strip $(EXTRA_TESTS)),$(MAKE) --no-print-directory $(EXTRA_TESTS))
	@echo "make test: all suites passed (plain, asan+ubsan, tsan, install, dlopen, python, torture)"
	@cat $(addsuffix /test-counts,$(addprefix build/,$(VARIANTS) python)) | \
		awk '{p += $$1; f += $$2} END {printf "tests: %d passed, %d failed\n", p, f}'

# Install into a scratch DESTDIR and build a program against it through
# pkg-config --static, as a user would.
check-install: all
	@sh scripts/check-install.sh

# ------------------------------------------------------------------ install
fanout.pc: fanout.pc.in Makefile
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@LIBDIR@|$(LIBDIR)|' \
	    -e 's|@INCLUDEDIR@|$(INCLUDEDIR)|' -e 's|@VERSION@|$(VERSION)|' \
	    -e 's|@LIBS_PRIVATE@|$(DEP_LIBS)|' $< > $@

install: all fanout.pc
	install -d $(DESTDIR)$(INCLUDEDIR) $(DESTDIR)$(LIBDIR)/pkgconfig
	install -m 644 include/fanout.h $(DESTDIR)$(INCLUDEDIR)/fanout.h
	install -m 644 build/plain/libfanout.a $(DESTDIR)$(LIBDIR)/libfanout.a
	install -m 755 build/plain/libfanout.so \
		$(DESTDIR)$(LIBDIR)/libfanout.so.$(VERSION)
	ln -sf libfanout.so.$(VERSION) $(DESTDIR)$(LIBDIR)/libfanout.so.0
	install -m 644 fanout.pc $(DESTDIR)$(LIBDIR)/pkgconfig/fanout.pc

uninstall:
	rm -f $(DESTDIR)$(INCLUDEDIR)/fanout.h $(DESTDIR)$(LIBDIR)/libfanout.a \
	      $(DESTDIR)$(LIBDIR)/libfanout.so $(DESTDIR)$(LIBDIR)/libfanout.so.0 \
	      $(DESTDIR)$(LIBDIR)/libfanout.so.$(VERSION) \
	      $(DESTDIR)$(LIBDIR)/pkgconfig/fanout.pc

clean:
	rm -rf build fanout.pc
