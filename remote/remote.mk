# remote/remote.mk - libfanout-nats (remote children over NATS JetStream),
# fanout-worker, their tests, remote-check and the remote bench.  Included
# by the top Makefile.  Needs libnats-dev (and nats-server to test); when
# libnats is absent `make all` and `make install` skip it and `make
# remote` says what to install.
#
#   make remote          build/plain/libfanout-nats.{a,so}, fanout-worker
#   make remote-test     plain + asan suites (each test runs its own
#                        nats-server on a free port); part of `make test`
#   make remote-check    3 worker processes, 10,000 children, workers
#                        killed with SIGKILL; one line of figures
#   make bench-remote    remote vs local no-op children; part of `make bench`

REMOTE_DEPS := libnats-dev nats-server
REMOTE_OK   := $(shell test -f /usr/include/nats/nats.h && echo yes)
REMOTE_SRC  := $(sort $(wildcard remote/nats_*.c))
REMOTE_HDR  := remote/fanout_nats.h remote/nats_internal.h include/fanout.h
REMOTE_TESTS := test_remote test_puller
# TSan is not run on the remote suite: the tests fork real processes
# (nats-server, workers) after libnats has started its threads, which TSan
# refuses (die_after_fork), and Debian's libnats is not built with TSan,
# so its side of every message we share with it is invisible to it.  A
# spot check that forks nothing after the first connection
# (test_roundtrip under build/tsan) gave 0 reports.  Our own shared state
# is one mutex plus C11 atomic counters; the engine underneath is covered
# by the TSan runs of tests/.
REMOTE_VARIANTS := plain asan
REMOTE_CFLAGS := -Iremote

.PHONY: remote remote-deps remote-test remote-check bench-remote \
	install-remote uninstall-remote

remote-deps:
	@sh scripts/deps.sh $(REMOTE_DEPS)

define remote_rules
build/$(1)/robj/%.o: remote/%.c $(REMOTE_HDR) | remote-deps
	@mkdir -p $$(dir $$@)
	$$(CC) $$(BASE_CFLAGS) $$(REMOTE_CFLAGS) $$(CFLAGS_$(1)) $$(EXTRA_CFLAGS) -c $$< -o $$@

# As libfanout.a: one relocatable object, internal (hidden) symbols made
# local, so only fanout_nats_* is global in the archive.
build/$(1)/libfanout-nats.a: $(patsubst remote/%.c,build/$(1)/robj/%.o,$(REMOTE_SRC))
	ld -r -o build/$(1)/fanout-nats-all.o $$^
	objcopy --localize-hidden build/$(1)/fanout-nats-all.o
	rm -f $$@ && ar rcs $$@ build/$(1)/fanout-nats-all.o

build/$(1)/fanout-worker: remote/fanout-worker.c build/$(1)/libfanout-nats.a build/$(1)/libfanout.a
	$$(CC) $$(BASE_CFLAGS) $$(REMOTE_CFLAGS) $$(CFLAGS_$(1)) $$(EXTRA_CFLAGS) $$< -o $$@ \
		build/$(1)/libfanout-nats.a build/$(1)/libfanout.a -lnats $$(DEP_LIBS) $$(LIBS_$(1))

build/$(1)/remote-test-worker: remote/tests/remote-test-worker.c build/$(1)/libfanout-nats.a build/$(1)/libfanout.a
	$$(CC) $$(BASE_CFLAGS) $$(REMOTE_CFLAGS) $$(CFLAGS_$(1)) $$(EXTRA_CFLAGS) $$< -o $$@ \
		build/$(1)/libfanout-nats.a build/$(1)/libfanout.a -lnats $$(DEP_LIBS) $$(LIBS_$(1))

build/$(1)/tests/test_remote: remote/tests/test_remote.c remote/tests/nats_harness.h \
		build/$(1)/libfanout-nats.a build/$(1)/libfanout.a \
		build/$(1)/remote-test-worker build/$(1)/fanout-worker
	@mkdir -p $$(dir $$@)
	$$(CC) $$(BASE_CFLAGS) $$(REMOTE_CFLAGS) $$(CFLAGS_$(1)) $$(EXTRA_CFLAGS) $$< -o $$@ \
		build/$(1)/libfanout-nats.a build/$(1)/libfanout.a -lnats -lcmocka \
		$$(DEP_LIBS) $$(LIBS_$(1))

# The puller's own test links nats_common's object, not the archive,
# whose internal symbols are local: it checks the puller's state.
build/$(1)/tests/test_puller: remote/tests/test_puller.c remote/tests/nats_harness.h \
		build/$(1)/robj/nats_common.o
	@mkdir -p $$(dir $$@)
	$$(CC) $$(BASE_CFLAGS) $$(REMOTE_CFLAGS) $$(CFLAGS_$(1)) $$(EXTRA_CFLAGS) $$< -o $$@ \
		build/$(1)/robj/nats_common.o -lnats -lcmocka $$(DEP_LIBS) $$(LIBS_$(1))
endef
$(foreach v,$(VARIANTS),$(eval $(call remote_rules,$(v))))

build/plain/libfanout-nats.so: $(patsubst remote/%.c,build/plain/robj/%.o,$(REMOTE_SRC)) build/plain/libfanout.so
	$(CC) -shared -Wl,-soname,libfanout-nats.so.0 -o $@ \
		$(patsubst remote/%.c,build/plain/robj/%.o,$(REMOTE_SRC)) \
		-Lbuild/plain -l:libfanout.so -lnats -lpthread

# Written at every install, as fanout.pc (it holds PREFIX).
fanout-nats.pc: remote/fanout-nats.pc.in FORCE
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@LIBDIR@|$(call pc_rel,$(LIBDIR))|' \
	    -e 's|@INCLUDEDIR@|$(call pc_rel,$(INCLUDEDIR))|' \
	    -e 's|@VERSION@|$(VERSION)|' $< > $@

REMOTE_BUILT := build/plain/libfanout-nats.a build/plain/libfanout-nats.so \
	build/plain/fanout-worker
remote: remote-deps $(REMOTE_BUILT)

ifeq ($(REMOTE_OK),yes)
all: $(REMOTE_BUILT)
install: install-remote
uninstall: uninstall-remote
EXTRA_TESTS += remote-test
bench: bench-remote
endif

BINDIR ?= $(PREFIX)/bin
install-remote: $(REMOTE_BUILT) fanout-nats.pc
	install -d $(DESTDIR)$(INCLUDEDIR) $(DESTDIR)$(LIBDIR)/pkgconfig $(DESTDIR)$(BINDIR)
	install -m 644 remote/fanout_nats.h $(DESTDIR)$(INCLUDEDIR)/fanout_nats.h
	install -m 644 build/plain/libfanout-nats.a $(DESTDIR)$(LIBDIR)/libfanout-nats.a
	install -m 755 build/plain/libfanout-nats.so \
		$(DESTDIR)$(LIBDIR)/libfanout-nats.so.$(VERSION)
	ln -sf libfanout-nats.so.$(VERSION) $(DESTDIR)$(LIBDIR)/libfanout-nats.so.0
	ln -sf libfanout-nats.so.$(VERSION) $(DESTDIR)$(LIBDIR)/libfanout-nats.so
	install -m 644 fanout-nats.pc $(DESTDIR)$(LIBDIR)/pkgconfig/fanout-nats.pc
	install -m 755 build/plain/fanout-worker $(DESTDIR)$(BINDIR)/fanout-worker

uninstall-remote:
	rm -f $(DESTDIR)$(INCLUDEDIR)/fanout_nats.h $(DESTDIR)$(LIBDIR)/libfanout-nats.a \
	      $(DESTDIR)$(LIBDIR)/libfanout-nats.so.0 $(DESTDIR)$(LIBDIR)/libfanout-nats.so \
	      $(DESTDIR)$(LIBDIR)/libfanout-nats.so.$(VERSION) \
	      $(DESTDIR)$(LIBDIR)/pkgconfig/fanout-nats.pc $(DESTDIR)$(BINDIR)/fanout-worker

remote-test: remote-deps $(foreach v,$(REMOTE_VARIANTS),$(foreach t,$(REMOTE_TESTS),build/$(v)/tests/$(t)))
	@for v in $(REMOTE_VARIANTS); do \
		sh scripts/run-tests.sh $$v-remote $(TEST_TIMEOUT) \
			$(foreach t,$(REMOTE_TESTS),build/$$v/tests/$(t)) || exit 1; \
	done
	@sh remote/check-install.sh

build/plain/remote-check: remote/tests/remote-check.c remote/tests/nats_harness.h \
		build/plain/libfanout-nats.a build/plain/libfanout.a build/plain/remote-test-worker
	$(CC) $(BASE_CFLAGS) $(REMOTE_CFLAGS) $(CFLAGS_plain) $(EXTRA_CFLAGS) $< -o $@ \
		build/plain/libfanout-nats.a build/plain/libfanout.a -lnats $(DEP_LIBS) $(LIBS_plain)

REMOTE_CHECK_CHILDREN ?= 10000
remote-check: remote-deps build/plain/remote-check
	@build/plain/remote-check -n $(REMOTE_CHECK_CHILDREN) -w build/plain/remote-test-worker

build/plain/bench-remote: bench/bench-remote.c remote/tests/nats_harness.h remote/fanout_nats.h \
		build/plain/libfanout-nats.a build/plain/libfanout.a build/plain/remote-test-worker
	$(CC) $(BASE_CFLAGS) $(REMOTE_CFLAGS) $(CFLAGS_plain) $(EXTRA_CFLAGS) $< -o $@ \
		build/plain/libfanout-nats.a build/plain/libfanout.a -lnats $(DEP_LIBS) $(LIBS_plain)

bench-remote: remote-deps build/plain/bench-remote
	build/plain/bench-remote -w build/plain/remote-test-worker
