# tests/models/models.mk - `make models`: Promela models of fanout's
# lock-free protocols, checked exhaustively with spin. Included by the top
# Makefile. Needs nothing but spin and gcc (scripts/deps.sh installs spin
# when run as root). See tests/models/README.md.
#
# Every correct variant must verify with errors: 0; every seeded-bug
# variant must be REJECTED by spin (errors > 0) - the target fails if a
# seeded bug is not caught, since then the model checks nothing.
# Scratch files (pan.c, pan, pan.out, trails) go to build/models/<run>/.
# Runs are independent targets: `make -j2 models` is fine.

MODELS_SRC := tests/models
MODELS_OUT ?= build/models
MODELS_RUNS :=

# $(1) run name  $(2) model  $(3) pass|fail  $(4) spin flags
# $(5) pan build flags  $(6) pan run flags
define models_run
.PHONY: models-$(1)
models-$(1): models-deps
	@MODELS_OUT=$(MODELS_OUT) sh $(MODELS_SRC)/check.sh $(1) \
		$(MODELS_SRC)/$(2).pml $(3) '$(4)' '$(5)' '$(6)'
MODELS_RUNS += models-$(1)
endef

# join/cancel claim: N=3 children, 2 workers + the helping caller, and a
# canceller; also N=4, and two cancellers racing (cancel + shutdown)
$(eval $(call models_run,join_cancel,join_cancel,pass,,-DSAFETY,))
$(eval $(call models_run,join_cancel-N4,join_cancel,pass,-DN=4,-DSAFETY,))
$(eval $(call models_run,join_cancel-C2,join_cancel,pass,-DC=2,-DSAFETY,))
$(eval $(call models_run,join_cancel-bug1,join_cancel,fail,-DBUG=1,-DSAFETY,))
$(eval $(call models_run,join_cancel-bug2,join_cancel,fail,-DBUG=2,-DSAFETY,))

# park/wake (spinner count + hand-on, a token may block on its siblings):
# 2 workers x 2 one-token submits; 3 x 3; one batch submit; 2 producers.
# The default (FIX=1) is queue/fq.c as it is: stop_spinning before the
# waiter announcement, and a hand-on after every take that follows the spin.
# -DFIX=0 is the code before that fix (a spinner counted by two submits,
# between its re-check and stop_spinning, slept through the second token):
# spin must still find that lost wakeup.  -DFIX=2 is an alternative fix.
# A producer's wake is a targeted FUTEX_WAKE_BITSET of the worker on its
# CPU, then a plain wake for the rest (fq.c, wake()); BUG=6 drops the
# plain wake once a targeted one was tried.  A producer whose tokens the
# spinners cover does not touch seq; BUG=7 reads spinning before enqueueing.
# Nor does one that finds nobody parked: kick() loads nidle (P3) first and
# bumps seq (P2) only for a sleeper; -DP2FIRST checks the older order.
$(eval $(call models_run,park_wake,park_wake,pass,,-DSAFETY,))
$(eval $(call models_run,park_wake-np,park_wake,pass,,-DNP,-l))
$(eval $(call models_run,park_wake-W3K3,park_wake,pass,-DW=3 -DK=3,-DSAFETY,))
$(eval $(call models_run,park_wake-batch,park_wake,pass,-DBATCH=1 -DW=3 -DK=3,-DSAFETY,))
$(eval $(call models_run,park_wake-P2,park_wake,pass,-DP=2 -DW=3,-DSAFETY,))
$(eval $(call models_run,park_wake-fix2,park_wake,pass,-DFIX=2,-DSAFETY,))
$(eval $(call models_run,park_wake-p2first,park_wake,pass,-DP2FIRST=1 -DW=3 -DK=3,-DSAFETY,))
$(eval $(call models_run,park_wake-prefix,park_wake,fail,-DFIX=0,-DSAFETY,))
$(eval $(call models_run,park_wake-bug1,park_wake,fail,-DBUG=1,-DSAFETY,))
$(eval $(call models_run,park_wake-bug2,park_wake,fail,-DBUG=2,-DSAFETY,))
$(eval $(call models_run,park_wake-bug3-np,park_wake,fail,-DBUG=3,-DNP,-l))
$(eval $(call models_run,park_wake-bug4,park_wake,fail,-DBUG=4,-DSAFETY,))
$(eval $(call models_run,park_wake-bug5,park_wake,fail,-DBUG=5,-DSAFETY,))
$(eval $(call models_run,park_wake-bug6,park_wake,fail,-DBUG=6,-DSAFETY,))
$(eval $(call models_run,park_wake-bug6-batch,park_wake,fail,-DBUG=6 -DBATCH=1,-DSAFETY,))
$(eval $(call models_run,park_wake-bug7,park_wake,fail,-DBUG=7,-DSAFETY,))

# work-first offers (queue/fq.c argument 7, lib/deleg.c help_offer): a
# fanout_run caller whose child needs a sibling run elsewhere; 2 and 3
# workers; a worker parking without its last look at the offers, an owner
# that never checks for spinners, an owner that checks before it opens.
$(eval $(call models_run,offers,offers,pass,,-DSAFETY,))
$(eval $(call models_run,offers-W3,offers,pass,-DW=3,-DSAFETY,))
$(eval $(call models_run,offers-bug1,offers,fail,-DBUG=1,-DSAFETY,))
$(eval $(call models_run,offers-bug2,offers,fail,-DBUG=2,-DSAFETY,))
$(eval $(call models_run,offers-bug3,offers,fail,-DBUG=3,-DSAFETY,))

# shutdown drain: 2 delegations racing fanout_shutdown (D=3 needs > 3 GB)
$(eval $(call models_run,shutdown_drain,shutdown_drain,pass,,-DSAFETY,))
$(eval $(call models_run,shutdown_drain-bug1,shutdown_drain,fail,-DBUG=1,-DSAFETY,))
$(eval $(call models_run,shutdown_drain-bug2,shutdown_drain,fail,-DBUG=2,-DSAFETY,))
$(eval $(call models_run,shutdown_drain-bug3,shutdown_drain,fail,-DBUG=3,-DSAFETY,))
$(eval $(call models_run,shutdown_drain-bug4,shutdown_drain,fail,-DBUG=4,-DSAFETY,))

# pending child's finish race (lib/pending.c: defer/complete/on_cancel vs
# an abandoner - cancel, deadline, policy, shutdown - and fanout_defer's
# re-check): 1 sync + 1 deferred child, runner, abandoner, completer; the
# callback registered by the child's fn or (REG=2) by the completer; 2
# deferred children; two abandoners; the re-check after fn returns with a
# callback step (LATE=2).  FIX=0 is on_cancel as 3e7e328 had it and
# LATE=1 the first sketch's re-check: spin must keep rejecting both.
# REACH=3 shows the abandon/complete race is reached (-EALREADY).
$(eval $(call models_run,pending_finish,pending_finish,pass,,-DSAFETY,))
$(eval $(call models_run,pending_finish-reg2,pending_finish,pass,-DREG=2,-DSAFETY,))
$(eval $(call models_run,pending_finish-D2,pending_finish,pass,-DND=2 -DNS=0,-DSAFETY,))
$(eval $(call models_run,pending_finish-A2,pending_finish,pass,-DA=2,-DSAFETY,))
$(eval $(call models_run,pending_finish-late2,pending_finish,pass,-DLATE=2,-DSAFETY,))
$(eval $(call models_run,pending_finish-reach3,pending_finish,fail,-DREACH=3,-DSAFETY,))
$(eval $(call models_run,pending_finish-bug1,pending_finish,fail,-DBUG=1,-DSAFETY,))
$(eval $(call models_run,pending_finish-bug2,pending_finish,fail,-DBUG=2,-DSAFETY,))
$(eval $(call models_run,pending_finish-bug3,pending_finish,fail,-DBUG=3,-DSAFETY,))
$(eval $(call models_run,pending_finish-bug4,pending_finish,fail,-DBUG=4,-DSAFETY,))
$(eval $(call models_run,pending_finish-late1,pending_finish,fail,-DLATE=1,-DSAFETY,))
$(eval $(call models_run,pending_finish-fix0,pending_finish,fail,-DFIX=0,-DSAFETY,))

# max_children places (lib/join.c "Places", pending.c's place): N=5
# children in chunks of 3, two deferring, max_children 2, two ring tokens,
# a completer.  Bugs: a runner that took a handed-back range leaves at the
# batch's end without looking at the list again (before 3b1f245); a
# give_place that releases its parked token without looking at the ranges.
# N=6 verifies too but needs ~11 GB and 3 minutes.
$(eval $(call models_run,places,places,pass,-DN=5,-DSAFETY -DCOLLAPSE,))
$(eval $(call models_run,places-bug1,places,fail,-DN=5 -DBUG=1,-DSAFETY -DCOLLAPSE,))
$(eval $(call models_run,places-bug2,places,fail,-DN=5 -DBUG=2,-DSAFETY -DCOLLAPSE,))

# epochs (lib/epoch.c, record.c "Limbo"): 2 readers x 2 sections, a
# retirer that reuses the block at tag + 2, one more advancer.  Bugs:
# reuse at tag + 1; tag read before the unlink; an advance that ignores an
# older announcement; a reader that loads the slot before announcing.
$(eval $(call models_run,epoch,epoch,pass,,-DSAFETY,))
$(eval $(call models_run,epoch-bug1,epoch,fail,-DBUG=1,-DSAFETY,))
$(eval $(call models_run,epoch-bug2,epoch,fail,-DBUG=2,-DSAFETY,))
$(eval $(call models_run,epoch-bug3,epoch,fail,-DBUG=3,-DSAFETY,))
$(eval $(call models_run,epoch-bug4,epoch,fail,-DBUG=4,-DSAFETY,))

.PHONY: models models-deps
models: $(MODELS_RUNS)
	@echo "make models: $(words $(MODELS_RUNS)) runs as expected" \
		"(correct variants verified, every seeded bug caught)"

# deps.sh installs spin (and the library's own packages) when root; the
# models themselves need only spin and gcc, so that is what is checked.
models-deps:
	@sh scripts/deps.sh spin || true
	@command -v $${SPIN:-spin} >/dev/null 2>&1 || { \
		echo "models: spin not found: apt-get install -y spin" >&2; exit 1; }
	@command -v $${MODEL_CC:-gcc} >/dev/null 2>&1 || { \
		echo "models: gcc not found: apt-get install -y gcc" >&2; exit 1; }
