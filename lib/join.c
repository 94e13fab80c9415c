/* SPDX-License-Identifier: MIT */
/*
 * join.c - running a delegation's children: claiming, running, the join,
 * finalise, cancel, and helping.
 *
 * WHY IT IS CORRECT
 *
 * Claim.  Child indices are handed out by one counter, `claim`.  A runner
 * (a worker holding a ring token, or the fanout_run caller) takes a chunk
 * i = fetch_add(claim, chunk) and owns [i, min(i + chunk, ntasks)) iff
 * i < ntasks (each runner picks its own chunk size, see next_chunk(); the
 * argument does not depend on it); each child of its chunk it either runs
 * or, once a cancel is seen, reports interrupted.  A canceller takes
 * every index not handed out yet with old = exchange(claim, ntasks) and owns
 * [old, ntasks) when old < ntasks.  All of these are read-modify-writes of
 * one location, so they are totally ordered: every index below ntasks is
 * returned to exactly one of them, once.  Hence every child is either run
 * once or reported interrupted once, never both, never neither.
 * (tests/models/join_cancel.pml model-checks this, with a seeded
 * load+store canceller that spin rejects.)  The fanout_run caller's first
 * chunk is claimed by storing `claim` before the record is published
 * (fanout__first_chunk): the claim that comes first in every order, the
 * caller owning [0, first).  It runs that chunk like any other, so a
 * cancel that comes first still has its children reported interrupted.
 *
 * Join.  `remaining` starts at ntasks.  A runner writes the result slots
 * of every chunk it owned and then, once it finds nothing left to claim,
 * subtracts how many children it finished, in one release RMW (the
 * canceller subtracts the size of its range).  The subtraction that
 * takes it to zero is the last: every slot was written before some release
 * subtraction in the counter's modification order, and the zeroing thread's
 * acquire (acq_rel) makes all of them visible.  Exactly one thread sees the
 * counter go from k to 0, so exactly one thread finalises, and exactly one
 * event is published.  A runner that finished all ntasks children itself
 * knows that nobody else finished one (each child is finished once), so
 * nobody else subtracts: it stores 0 (release) in place of the RMW and
 * finalises.
 *
 * Deferred children.  A child that calls fanout_defer() is not counted by
 * its runner: exactly one finisher of the pending child (its completer, or
 * the library abandoning it) subtracts 1 for it, after writing its slot
 * (pending.c argues the finishers' race; tests/models/pending_finish.pml
 * checks it).  So every child is still subtracted exactly once.
 *
 * Places.  Once a child of a record has deferred (`deferring`), runners
 * claim one child at a time and each start takes a place first
 * (take_place: fetch_add on `places`, undone at max_children).  A child
 * that returns gives its place back; one that defers keeps it until it is
 * finished.  A runner that finds no place parks: it turns itself into a
 * parked token (one ring credit and one record reference, counted in
 * `parked`) and leaves; the fanout_run caller instead sleeps on the
 * record's `place_ec` until a place is given back (no_place), since only
 * a worker runs ring tokens.  Whoever gives a place back then takes one parked
 * token (CAS on `parked`) and submits it, or releases it when nothing is
 * left to claim.  No lost wake-up: park increments `parked` and then
 * re-reads `places`; give_place decrements `places` and then reads
 * `parked`; both seq_cst, so at least one of them sees the other, and the
 * CAS on `parked` lets exactly one of them own the token.  claim_rest and
 * finalise release every parked token still there, so none outlives the
 * record's join.  A runner that read `deferring` false claimed a chunk of
 * several children; when it finds no place for the next of them, it hands
 * the rest of the chunk back as a leftover range (a push-only stack,
 * emptied whole by exchange, so no ABA) and parks; runners take leftover
 * ranges before claiming new indices, and one that took a range looks at
 * the list again before it leaves (leftovers_left; tests/models/
 * places.pml checks all of this with spin).  Leftovers are children claimed but
 * not finished, so `remaining` counts them; a canceller skips them
 * (exchange), and a runner that pushes one re-reads `cancel` (seq_cst,
 * against the canceller's fetch_or before its exchange) and skips them
 * itself if it was too late for the canceller.
 */
#include "internal.h"

#include <assert.h>
#include <errno.h>
#include <limits.h>
#include <sched.h>
#include <string.h>

static FQ_TLS struct fanout_child *tls_child;

struct fanout_child *fanout__current(void)
{
	return tls_child;
}

void fanout__forget_child(void)
{
	tls_child = NULL; /* fork.c: a forked process starts at top level */
}

/* -------------------------------------------------------------- finalise */

static const char *code_text(int code)
{
	const char *s;

	if (code == -ECANCELED)
		return "interrupted";
	if (code > 0)
		return "child returned a positive value (reported as an error)";
	/* INT_MIN has no positive counterpart (negating it is undefined):
	 * no errno either. */
	s = code > INT_MIN ? strerrordesc_np(-code) : NULL;
	return s ? s : "child failed with an unknown error";
}

/* The code of a child that an interrupt (with these cancel bits) stopped. */
int fanout__interrupt_code(uint32_t cancel)
{
	return cancel & CANCEL_TIMEDOUT ? -ETIMEDOUT : -ECANCELED;
}

/* Tokens counted in @tokens (`parked` for a place, or `held` by runners
 * on demand) and not needed any more: give back their ring credits and
 * record references.  Called by claim_rest (parked) and finalise (both). */
static void release_tokens(struct record *rec, _Atomic uint32_t *tokens)
{
	uint32_t k;

	/* relaxed: a quick look, the exchange decides. */
	if (!atomic_load_explicit(tokens, memory_order_relaxed))
		return;
	/* acq_rel: owns the tokens against take_parked's CAS (parked) or
	 * add_runners' exchange (held). */
	k = atomic_exchange_explicit(tokens, 0, memory_order_acq_rel);
	if (k) {
		fq_unreserve(rec->e->q, k);
		fanout__rec_put(rec, k);
	}
}

/* @local: the fanout_run caller finalises its own record on its own thread
 * (it knows, so nobody signals it); see fanout__run_own. */
static void finalise(struct record *rec, bool local, bool *ref,
		     uint64_t end_tick)
{
	struct fanout_engine *e = rec->e;
	bool background = rec->background;
	struct fanout_event *ev = &rec->ev;
	uint64_t now;
	/* One RMW both reads the cancel bits and closes the door: a cancel
	 * whose own fetch_or finds CANCEL_FINAL returns -EALREADY, so the
	 * event's `cancelled` is true exactly when fanout_cancel returned 0
	 * (test_cancel's cancel_races_completion).  acq_rel: pairs with the
	 * canceller's fetch_or. */
	uint32_t cancel = atomic_fetch_or_explicit(&rec->cancel, CANCEL_FINAL,
						   memory_order_acq_rel) &
			  ~CANCEL_FINAL;
	unsigned i, nc = rec->ntasks, ne = 0, ni = 0;
	double cost = 0;

	/* Every child completed at no cost unless one said otherwise: then
	 * the slots need not be read here (a batch of 512 is 448 lines,
	 * half of them written on the other core).  relaxed: after the
	 * join's acquire (see fanout__mark_irregular). */
	if (atomic_load_explicit(&rec->irregular, memory_order_relaxed)) {
		nc = 0;
		for (i = 0; i < rec->ntasks; i++) {
			const struct fanout_result *r = &rec->results[i];

			cost += r->cost;
			if (r->status == FANOUT_COMPLETED)
				nc++;
			else if (r->status == FANOUT_INTERRUPTED)
				ni++;
			else
				ne++;
		}
	}
	release_tokens(rec, &rec->parked);
	release_tokens(rec, &rec->held); /* runners on demand not started */
	if (rec->deadline)
		fanout__timer_done(e);
	ev->id = rec->id;
	ev->context = rec->context;
	ev->session_key = rec->session_key;
	ev->user = rec->user;
	ev->nresults = rec->ntasks;
	ev->results = rec->results;
	ev->dispatched_ns = rec->dispatched_ns;
	/* After every child's end (this runner's join came last); from this
	 * thread's anchor (clock.h), so never before the dispatch stamped on
	 * another thread's. */
	now = end_tick ? fq_stamp_at(end_tick) : fq_stamp();
	ev->completed_ns = now > rec->dispatched_ns ? now : rec->dispatched_ns;
	ev->cost = cost;
	ev->ncompleted = nc;
	ev->nerror = ne;
	ev->ninterrupted = ni;
	ev->cancelled = (cancel & CANCEL_BY_CALLER) != 0;
	ev->timed_out = (cancel & CANCEL_TIMEDOUT) != 0;
	/* Only when the policy stopped something: a quorum reached by the
	 * last child interrupted nothing, and a child interrupted before
	 * (by itself, a cancel) was not the policy's.  relaxed: after the
	 * join's acquire (see fanout__mark_policy). */
	ev->interrupted_by_policy = (cancel & CANCEL_POLICY) &&
				    atomic_load_explicit(&rec->policy_stopped,
							 memory_order_relaxed);
	if (nc) {
		ev->status = FANOUT_COMPLETED;
		ev->error = NULL;
	} else if (ni == rec->ntasks) {
		ev->status = FANOUT_INTERRUPTED;
		ev->error = cancel & CANCEL_SHUTDOWN ?
				    "engine shut down" :
			    cancel & CANCEL_TIMEDOUT ?
				    "deadline passed" :
			    cancel & CANCEL_TREE ?
				    "its parent delegation was interrupted" :
			    cancel & CANCEL_USER ?
				    "cancelled" :
				    "every child was interrupted";
	} else {
		ev->status = FANOUT_ERROR;
		ev->error = "no child completed";
	}
	rec->done_ns = ev->completed_ns; /* what lookup reads (table.c) */
	rec->done_cost = cost;
	rec->done_status = (uint8_t)ev->status;
	rec->done_cancelled = ev->cancelled;
	FANOUT_PROBE_BATCH_DONE(rec->id, ev->status, nc, ne, ni);
	/* finish_seq is also fanout_stats()' count of completed delegations
	 * (one RMW for both).  release: pairs with the acquire load there,
	 * which then sees this delegation's dispatched/runs count
	 * (made before the ring handoff, or earlier on this thread) -
	 * snapshots never show completed > started.  Pruning needs only the
	 * RMW's total order (it reads finish_seq through the event's
	 * hand-over and the kept[] CAS, acq_rel). */
	rec->finish_seq = atomic_fetch_add_explicit(&e->finish_seq, 1,
						    memory_order_release);
	/* Before the event can be taken and freed (table.c, "Tombs"). */
	fanout__table_tomb(e, rec);

	/* `state` turns FINISHED exactly when the event can be had, seen from
	 * both sides: a lookup that reads FINISHED finds the event in the
	 * sink (so the store comes after the enqueue), and a consumer that
	 * took the event sees FINISHED in lookup (so the consumer stores it
	 * too, in the sink's take(); both are release stores after ev was
	 * written).  A synchronous caller is woken only after the store. */
	if (rec->background) {
		struct fanout_sink *s = rec->sink;

		/* Give the capacity slot back before the event can be seen.
		 * release: pairs with the acquire loads of async_done in
		 * dispatch's admission and in fanout__async_running (deleg.c);
		 * the finalisers' own line ("Admission" there). */
		atomic_fetch_add_explicit(&e->async_done, 1,
					  memory_order_release);
		/* The runner's own reference goes before the event can be
		 * had: the event's keeps the record until then, so this put
		 * is never the last, and the consumer that frees the event
		 * usually drops the last one and gets the block back from
		 * its limbo (record.c); a worker's last put sends it through
		 * RCU.  Nothing below touches the record outside the read
		 * lock. */
		if (ref && *ref) {
			fanout__rec_put(rec, 1);
			*ref = false;
		}
		/* The read lock keeps the sink (sink.c) and the record: once
		 * published, its event may be taken and freed at once.  And
		 * the engine: the unit active_done drops lets fanout_shutdown
		 * return, and fanout_destroy frees the engine only after a
		 * grace period (fanout__engines_del); a finaliser that nobody
		 * joins (a fanout_complete() on the application's thread)
		 * still reads `shutting` and may signal after that drop. */
		fanout__read_lock();
		fanout__sink_publish(s, rec);
		atomic_store_explicit(&rec->state, REC_FINISHED,
				      memory_order_release);
		fanout__active_done(e); /* pruning waits for the event's free */
		fanout__read_unlock();
	} else {
		/* Nobody has the event before the wake-up below, so the
		 * record needs no read lock. */
		atomic_store_explicit(&rec->state, REC_FINISHED,
				      memory_order_release);
	}
	if (!background && !local)
		/* The last touch: a synchronous record's unit of `active` is
		 * dropped by its caller with the call's own, after this wakes
		 * it (fanout_run), so shutdown waits for it as before. */
		fq_done_signal(&rec->done_word);
}

/* Hand @n finished children to the join counter; the one that takes it to
 * zero finalises.  acq_rel: release publishes the caller's result slots;
 * the acquire makes the zeroing thread see every other finisher's (the
 * join argument above). */
void fanout__join_sub(struct record *rec, uint32_t n)
{
	if (atomic_fetch_sub_explicit(&rec->remaining, n,
				      memory_order_acq_rel) == n)
		finalise(rec, false, NULL, 0);
}

/* ---------------------------------------------------------- skip hooks */

/*
 * fanout_set_skip_hook(): a few (fn, hook) pairs, read only when a child
 * is skipped (a cancel's cold path), never on a child's run.  A slot is
 * claimed once for a fn and never given back: its fn is written once, its
 * hook replaced in place.  No lock: registrations are rare and a slot is
 * claimed by a CAS on its fn.
 */
static struct {
	_Atomic(fanout_fn) fn;
	_Atomic(void (*)(void *)) hook;
} skip_hooks[FANOUT_MAX_SKIP_HOOKS];

int fanout_set_skip_hook(fanout_fn fn, void (*hook)(void *arg))
{
	unsigned i;

	if (!fn)
		return -EINVAL;
	for (i = 0; i < FANOUT_MAX_SKIP_HOOKS; i++) {
		fanout_fn cur = NULL;

		/* acq_rel: on success publishes the slot to the skippers'
		 * acquire load of fn below; on failure (acquire) reads the
		 * fn another registration claimed it for. */
		if (atomic_compare_exchange_strong_explicit(
			    &skip_hooks[i].fn, &cur, fn, memory_order_acq_rel,
			    memory_order_acquire) ||
		    cur == fn) {
			/* release: pairs with the acquire load of hook in
			 * fanout__skip_hook(). */
			atomic_store_explicit(&skip_hooks[i].hook, hook,
					      memory_order_release);
			return 0;
		}
	}
	return -ENOSPC;
}

/* Child @t is never run: hand its arg to its fn's hook, if any. */
static void fanout__skip_hook(const struct fanout_task *t)
{
	unsigned i;

	for (i = 0; i < FANOUT_MAX_SKIP_HOOKS; i++) {
		/* acquire: pairs with the claiming CAS (acq_rel) in
		 * fanout_set_skip_hook(); NULL ends the claimed slots. */
		fanout_fn fn = atomic_load_explicit(&skip_hooks[i].fn,
						    memory_order_acquire);
		void (*hook)(void *);

		if (!fn)
			return;
		if (fn != t->fn)
			continue;
		/* acquire: pairs with the release store of the hook in
		 * fanout_set_skip_hook(). */
		hook = atomic_load_explicit(&skip_hooks[i].hook,
					    memory_order_acquire);
		if (hook)
			hook(t->arg);
		return;
	}
}

/* ----------------------------------------------------------------- run */

/* Report child i as never started (the delegation was interrupted; the
 * cancel bits say by what). */
static void skip_child(struct record *rec, unsigned i, uint32_t cancel)
{
	struct fanout_result *r = &rec->results[i];

	r->index = i;
	r->goal = rec->tasks[i].goal ? rec->tasks[i].goal : ""; /* NULL */
	r->status = FANOUT_INTERRUPTED;
	r->summary = NULL;
	r->error =
		cancel & CANCEL_TIMEDOUT ?
			"the delegation's deadline passed before it started" :
		cancel & CANCEL_POLICY ?
			"the join policy was met before it started" :
			"cancelled before it started";
	r->duration_ns = 0;
	r->cost = 0;
	r->code = fanout__interrupt_code(cancel); /* owned[i] stays 0 */
	fanout__mark_irregular(rec);
	fanout__mark_policy(rec, cancel);
	fanout__skip_hook(&rec->tasks[i]);
}

/*
 * The join policy, after child @st finished (sync or deferred): the first
 * error (FIRST_ERROR), the first completion (ANY) or the quorum-th one
 * (QUORUM) interrupts the rest.  The caller's own child is not yet
 * subtracted, so the record cannot finish under the cancel.
 */
void fanout__after_child(struct record *rec, enum fanout_status st)
{
	bool hit = false;

	switch (rec->join) {
	case FANOUT_JOIN_FIRST_ERROR:
		hit = st == FANOUT_ERROR;
		break;
	case FANOUT_JOIN_ANY:
		hit = st == FANOUT_COMPLETED;
		break;
	case FANOUT_JOIN_QUORUM:
		/* relaxed: the count's RMW order alone picks the quorum-th. */
		hit = st == FANOUT_COMPLETED &&
		      atomic_fetch_add_explicit(&rec->ncompleted, 1,
						memory_order_relaxed) +
				      1 ==
			      rec->quorum;
		break;
	default:
		return;
	}
	if (hit)
		fanout__cancel_rec(rec, FANOUT_CANCEL_INTERRUPT |
						FANOUT_CANCEL_ABANDON |
						CANCEL_POLICY);
}

/* The outcome of a child that returned @rc into its slot. */
enum fanout_status fanout__set_outcome(struct record *rec, unsigned i,
				       struct fanout_result *r, int rc)
{
	/* relaxed: whether the deadline passed first; the cancel word's bits
	 * only decide how this child is reported. */
	uint32_t cancel =
		atomic_load_explicit(&rec->cancel, memory_order_relaxed);

	if (cancel & CANCEL_TIMEDOUT) { /* not finished by the deadline */
		r->code = -ETIMEDOUT;
		r->status = FANOUT_INTERRUPTED;
		if (rec->owned[i] & OWN_ERROR) {
			fanout__str_free(r->error);
			rec->owned[i] = 0;
		}
		r->error = "the delegation's deadline passed";
	} else if (rc == 0) {
		r->code = 0;
		r->status = FANOUT_COMPLETED;
		/* An error string set, then completed anyway: drop it. */
		if (rec->owned[i] & OWN_ERROR) {
			fanout__str_free(r->error);
			rec->owned[i] = 0;
		}
		r->error = NULL;
	} else {
		/* Only -ECANCELED is an interrupt: a child's own -ETIMEDOUT
		 * (a connect that timed out) is an error like any other, as
		 * enum fanout_status says; the deadline is the case above. */
		r->code = rc;
		r->status =
			rc == -ECANCELED ? FANOUT_INTERRUPTED : FANOUT_ERROR;
		if (!r->error)
			r->error = code_text(rc);
	}
	if (r->status != FANOUT_COMPLETED)
		fanout__mark_irregular(rec);
	if (r->status == FANOUT_INTERRUPTED)
		fanout__mark_policy(rec, cancel);
	return r->status;
}

/*
 * Run child c->index, whose fanout_child @c the chunk has set up (rec, res,
 * t0, placed; pending NULL) and made the thread's current one.  *clock is
 * the time it starts; on return, the time it ended (which is when the
 * next child its runner starts begins: one reading per child boundary).
 * @clock NULL: the engine does not time children (FANOUT_NO_CHILD_CLOCK),
 * no reading at all.  @all: the record's join is FANOUT_JOIN_ALL.
 * Returns false when the child deferred (someone else finishes it), true
 * when it is finished.
 */
static inline bool run_child(struct record *rec, struct fanout_child *c,
			     const struct fanout_task *t, uint64_t *clock,
			     bool all)
{
	struct fanout_result *r = c->res;
	unsigned i = c->index;
	enum fanout_status st;
	uint64_t t1 = 0;
	int rc;

	r->index = i;
	r->goal = t->goal ? t->goal : ""; /* a NULL goal: see rec_alloc */
	r->summary = NULL;
	r->error = NULL;
	r->cost = 0;
	/* owned[i] is 0 from rec_alloc; it is written only when a string is
	 * set, so neighbouring runners do not bounce its line. */
	if (FANOUT_PROBE_CHILD_START_ENABLED()) /* sched_getcpu: traced only */
		FANOUT_PROBE_CHILD_START(rec->id, i, sched_getcpu());
	rc = t->fn(c, t->arg);
	if (clock) {
		t1 = fq_cycles();
		*clock = t1;
	}
	if (c->pending)
		return false; /* its place went with it (pending.c) */
	if (c->placed)
		fanout__give_place(rec);
	r->duration_ns = clock ? fq_duration_ns(c->t0, t1) : 0;
	/* The common case inline: completed, no error string of its own,
	 * and no deadline passed (relaxed: as in fanout__set_outcome, whose
	 * result this is then; r->error is still the NULL stored above). */
	if (rc == 0 && !rec->owned[i] &&
	    !(atomic_load_explicit(&rec->cancel, memory_order_relaxed) &
	      CANCEL_TIMEDOUT)) {
		r->code = 0;
		r->status = FANOUT_COMPLETED;
		st = FANOUT_COMPLETED;
	} else {
		st = fanout__set_outcome(rec, i, r, rc);
	}
	FANOUT_PROBE_CHILD_DONE(rec->id, i, st, r->duration_ns);
	fanout__cost_add(rec, r->cost);
	if (!all)
		fanout__after_child(rec, st);
	return true;
}

/* What a runner did: children it ran (called fn), finished (ran and
 * returned, or skipped) and skipped; whether it handed children back for
 * want of a place (it should park). */
struct tally {
	unsigned ran, done, skipped;
	bool handed_back;
	uint64_t end_tick; /* the last child's end, when children are timed */
};

/* A claimed range handed back (see "Places"). */
struct leftover {
	uint32_t lo, hi;
	struct leftover *next;
};

/* Skip every leftover range: the delegation was cancelled. */
static void skip_leftovers(struct record *rec, uint32_t cancel)
{
	/* seq_cst: the canceller's exchange after its fetch_or (or the
	 * pusher's after its re-check); each gets disjoint ranges. */
	struct leftover *l = atomic_exchange_explicit(&rec->leftovers, NULL,
						      memory_order_seq_cst),
			*next;
	uint32_t i, k = 0;

	for (; l; l = next) {
		next = l->next;
		for (i = l->lo; i < l->hi; i++)
			skip_child(rec, i, cancel);
		k += l->hi - l->lo;
		fanout__free_small(l, sizeof(*l));
	}
	if (k) {
		fanout__stat_add(&rec->e->st_skipped, k);
		fanout__join_sub(rec, k);
	}
}

static void push_leftovers(struct record *rec, struct leftover *first,
			   struct leftover *last)
{
	struct leftover *h =
		atomic_load_explicit(&rec->leftovers, memory_order_relaxed);
	uint32_t cancel;

	do {
		last->next = h;
		/* seq_cst: publishes the nodes (release) and is the store of
		 * the store-load pair with a canceller (see "Places"). */
	} while (!atomic_compare_exchange_weak_explicit(
		&rec->leftovers, &h, first, memory_order_seq_cst,
		memory_order_relaxed));
	cancel = atomic_load_explicit(&rec->cancel, memory_order_seq_cst);
	if (cancel & FANOUT_CANCEL_PENDING)
		skip_leftovers(rec, cancel);
}

/* Hand [lo, hi) back; false when no node could be allocated (the caller
 * then runs them without places). */
static bool hand_back(struct record *rec, uint32_t lo, uint32_t hi)
{
	struct leftover *l = fanout__alloc_small(sizeof(*l));

	if (!l)
		return false;
	l->lo = lo;
	l->hi = hi;
	push_leftovers(rec, l, l);
	return true;
}

/* Take one leftover range into [*lo, *hi); the rest goes back. */
static bool take_leftover(struct record *rec, uint32_t *lo, uint32_t *hi)
{
	struct leftover *l, *last;

	/* relaxed: a quick look; the exchange decides. */
	if (!atomic_load_explicit(&rec->leftovers, memory_order_relaxed))
		return false;
	/* acquire: the pusher's nodes. */
	l = atomic_exchange_explicit(&rec->leftovers, NULL,
				     memory_order_acquire);
	if (!l)
		return false;
	*lo = l->lo;
	*hi = l->hi;
	if (l->next) {
		for (last = l->next; last->next; last = last->next)
			;
		push_leftovers(rec, l->next, last);
	}
	fanout__free_small(l, sizeof(*l));
	return true;
}

/*
 * Whether handed-back ranges are waiting, for a runner that took one
 * (take_leftover) and is about to leave.  take_leftover empties the list
 * for a moment before it pushes back the ranges it does not keep; a
 * give_place that looks in that moment, with every index claimed,
 * releases its parked token instead of resubmitting it.  The taker is
 * alive and pushed them back itself, so it looks again before it leaves
 * and goes back for them (a place, or a parked token of its own).
 * relaxed: it reads its own push, or a later change of the list.
 */
static bool leftovers_left(struct record *rec)
{
	return atomic_load_explicit(&rec->leftovers, memory_order_relaxed) !=
	       NULL;
}

static bool take_place(struct record *rec);

/* Run the claimed chunk [i, end): children not started when a cancel
 * arrives are reported interrupted instead (they are still ours).  @t
 * counts; the runner's progress slot shows t->done; *cycles (if not NULL)
 * receives the chunk's duration in fq_cycles ticks.  @placed: the chunk is
 * one child for which a place was taken.  Without child clocks
 * (FANOUT_NO_CHILD_CLOCK) the chunk is timed by two readings, or none when
 * nobody asks or it ends the batch (no next chunk to size).  @from: a tick
 * of this thread the chunk starts at (the dispatch's, for the fanout_run
 * caller's first chunk; the last child's end, for a chunk claimed right
 * after another), or 0 to read one.  Returns the chunk's end tick with
 * child clocks (its last child's end), else 0. */
static uint64_t run_chunk(struct record *rec, struct progress_slot *prog,
			  unsigned i, unsigned end, struct tally *t,
			  uint64_t *cycles, bool placed, bool force,
			  uint64_t from)
{
	bool timed = !(rec->e->cfg.flags & FANOUT_NO_CHILD_CLOCK);
	bool sized = timed || (cycles && end < rec->ntasks);
	bool all = rec->join == FANOUT_JOIN_ALL;
	uint64_t clock = !sized ? 0 : from ? from : fq_cycles(), start = clock;
	const struct fanout_task *tasks = rec->tasks;
	/* One fanout_child for the chunk, the thread's current one from its
	 * first child to its end: each child gets it fresh (index, res, t0,
	 * placed, pending), and nothing but the children reads it. */
	struct fanout_child c = {.rec = rec}, *prev = tls_child;
	unsigned ran = 0, done = t->done, j;

	tls_child = &c;
	for (j = i; j < end; j++, placed = false) {
		/* relaxed: whether to start is a hint-level decision; the
		 * child's outcome is published by the join below. */
		uint32_t cancel = atomic_load_explicit(&rec->cancel,
						       memory_order_relaxed);

		if (cancel & FANOUT_CANCEL_PENDING) {
			if (placed)
				fanout__give_place(rec);
			skip_child(rec, j, cancel);
			t->skipped++;
			goto done;
		}
		/* relaxed: a mode hint (see "Places"); with @force (no ring
		 * credit to park with) children start without places. */
		if (!placed && !force &&
		    atomic_load_explicit(&rec->deferring,
					 memory_order_relaxed)) {
			placed = take_place(rec);
			if (!placed && hand_back(rec, j, end)) {
				t->handed_back = true;
				break;
			}
		}
		ran++;
		c.index = j;
		c.res = &rec->results[j];
		c.pending = NULL;
		c.t0 = clock;
		c.placed = placed;
		if (!run_child(rec, &c, &tasks[j], timed ? &clock : NULL, all))
			continue; /* deferred: not ours to count */
	done:
		/* relaxed: a progress figure for lookup, nothing read through
		 * it; only this runner writes its slot.  A helping consumer
		 * has none (its chunk counts once it is subtracted). */
		++done;
		if (prog)
			atomic_store_explicit(&prog->n, done,
					      memory_order_relaxed);
	}
	tls_child = prev;
	t->ran += ran;
	t->done = done;
	if (cycles)
		*cycles = (timed ? clock : sized ? fq_cycles() : start) - start;
	if (timed && t->ran)
		t->end_tick = clock; /* after every child this runner ran */
	return timed ? clock : 0;
}

/* A runner is through: count what it ran and hand its finished children
 * to the join counter in ONE subtraction; the one that takes it to zero
 * finalises.  @prog: its progress slot, or NULL.  @local: the fanout_run
 * caller's own run.  @ref: the runner's record reference, or NULL if it
 * holds none; finalising a background record drops it and clears *@ref.
 * Returns whether this runner finalised. */
static bool runner_done(struct record *rec, struct progress_slot *prog,
			const struct tally *t, bool local, bool *ref)
{
	struct fanout_engine *e = rec->e;
	int self;

	if (t->skipped)
		fanout__stat_add(&e->st_skipped, t->skipped);
	self = fq_self(e->q);
	if (self >= 0) {
		/* W: only this worker writes its slot. */
		fanout__own_add(&e->st_worker_children[self], t->ran);
	} else if (t->ran) {
		fanout__tstat_add(e, TSTAT_CHILDREN, t->ran);
	}
	if (!t->done)
		return false;
	/* Hand the progress over to `remaining`: clearing first means a
	 * concurrent lookup may lag for an instant, never count a child
	 * twice.  relaxed: as above. */
	if (prog)
		atomic_store_explicit(&prog->n, 0, memory_order_relaxed);
	/* A runner that finished every child is the only one to subtract
	 * (the join argument above): it stores the zero.  release: publishes
	 * our result slots to the acquire loads of `remaining` (cancel,
	 * park, lookup), as the RMW would.  Otherwise acq_rel: release
	 * publishes our result slots; the acquire makes the zeroing thread
	 * see every other runner's (the join argument above). */
	if (t->done == rec->ntasks) {
		atomic_store_explicit(&rec->remaining, 0, memory_order_release);
	} else if (atomic_fetch_sub_explicit(&rec->remaining, t->done,
					     memory_order_acq_rel) != t->done) {
		return false;
	}
	/* Every child has run: a worker that is not itself inside a child
	 * only has library code left. */
	if (!tls_child)
		fq_tail(e->q);
	/* A sole runner's last child ended after every other child: the
	 * event's completed_ns is that tick's stamp. */
	finalise(rec, local, ref, t->done == rec->ntasks ? t->end_tick : 0);
	return true;
}

/*
 * Adaptive chunks.  A runner starts with rec->chunk children per claim
 * (about 8 claims per runner, see fanout__chunk_for) and doubles its chunk
 * after each chunk that took less than CHUNK_GROW_NS, up to an even share
 * of what is left among the runners that have started (a token not
 * running yet - a fanout_run offer a spinner takes only after 2 us -
 * reserves no share: with one, a fanout_run of 8 to 64 quick children
 * made up to twice the claims, each with its chunk's set-up); after a
 * slower chunk it goes back to rec->chunk.  Cheap
 * children then cost a few claims per runner instead of a cross-core
 * transfer of `claim` every few children, while a runner holds at most
 * about 2 x CHUNK_GROW_NS of claimed-but-unstarted children like the ones
 * it just ran, so an idle runner is not left waiting behind it (chunks
 * sized by count alone would let one runner sit on half a batch of slow
 * children).  The clock reads are the per-child ones run_chunk makes
 * anyway (without child clocks, two per chunk).  Once a child deferred,
 * claims are one child each: a deferring child is quick to start and slow
 * to finish, and each start needs a max_children place (see "Places").
 */
#define CHUNK_GROW_NS 2000

static uint32_t next_chunk(const struct record *rec, uint32_t chunk,
			   uint32_t end, uint64_t cycles)
{
	/* relaxed: a count of the runners that took a progress slot (a
	 * synchronous record's caller holds slot 0, so it starts at 1); a
	 * hint for the share, on the line the next claim writes anyway. */
	uint32_t active =
		atomic_load_explicit(&rec->runner_next, memory_order_relaxed);
	uint32_t share, cap;

	if (fq_cycles_to_ns(cycles) >= CHUNK_GROW_NS)
		return rec->chunk; /* slow children: back to the minimum */
	active = active < 1		? 1 :
		 active > rec->nrunners ? rec->nrunners :
					  active;
	share = (rec->ntasks - end) / active;
	cap = share > rec->chunk ? share : rec->chunk;
	chunk *= 2;
	return chunk < cap ? chunk : cap;
}

/*
 * Runners on demand (FANOUT_RUNNERS_ON_DEMAND).  A background record
 * starts with one ring token; the others it may have wait in `held`, with
 * their ring credits and record references taken at dispatch.  After a
 * chunk that did not end the batch, a runner submits them if the children
 * left would take ON_DEMAND_NS or more at that chunk's speed, or if a
 * child deferred (its runners then claim one child at a time).  One
 * exchange takes them: a runner's, or finalise's, which gives back what
 * is still held.  A token submitted late that finds nothing to claim
 * leaves, as any token does.  A batch of quick children is so run by one
 * worker, without a second token that usually arrives after the first
 * runner claimed everything (bench/PROFILE.txt, phase 12 item 6).
 */
#define ON_DEMAND_NS 20000

static bool add_runners(struct record *rec, uint32_t i, uint32_t end,
			uint64_t cycles)
{
	uint32_t k;

	/* relaxed: a look; the exchange decides. */
	if (!atomic_load_explicit(&rec->held, memory_order_relaxed))
		return false;
	/* relaxed: a hint, as in run_token. */
	if (!atomic_load_explicit(&rec->deferring, memory_order_relaxed) &&
	    fq_cycles_to_ns(cycles) * (rec->ntasks - end) <
		    (uint64_t)ON_DEMAND_NS * (end - i))
		return false;
	/* relaxed: the exchange only decides who submits; the ring's
	 * handoff publishes the record to the tokens' runners. */
	k = atomic_exchange_explicit(&rec->held, 0, memory_order_relaxed);
	if (k)
		fq_submit(rec->e->q, &rec->work, k); /* credits held */
	return k != 0;
}

/* ------------------------------------------------------------- places */

static bool take_place(struct record *rec)
{
	/* seq_cst: the "Places" store-load pair with park(). */
	uint32_t old = atomic_fetch_add_explicit(&rec->places, 1,
						 memory_order_seq_cst);

	if (old < rec->e->cfg.max_children)
		return true;
	fanout__give_place(rec);
	return false;
}

/* Take one parked token, if any; true when we own it. */
static bool take_parked(struct record *rec)
{
	/* seq_cst: the load of the "Places" pair (after the place update). */
	uint32_t k = atomic_load_explicit(&rec->parked, memory_order_seq_cst);

	/* acq_rel: one owner per token; the acquire sees the parker's
	 * reference and credit taken. */
	while (k && !atomic_compare_exchange_weak_explicit(
			    &rec->parked, &k, k - 1, memory_order_acq_rel,
			    memory_order_relaxed))
		;
	return k != 0;
}

void fanout__give_place(struct record *rec)
{
	/* seq_cst: the store of the "Places" pair with park(). */
	atomic_fetch_sub_explicit(&rec->places, 1, memory_order_seq_cst);
	/* A fanout_run caller may sleep for a place (wait_place): the RMW
	 * above is P1 of fq_ec_signal_after_rmw (fq.h). */
	fq_ec_signal_after_rmw(&rec->place_ec, 1);
	if (!take_parked(rec))
		return;
	/* relaxed: hints; a token that finds nothing to claim just leaves,
	 * and the claim RMW decides. */
	if ((atomic_load_explicit(&rec->claim, memory_order_relaxed) <
		     rec->ntasks ||
	     atomic_load_explicit(&rec->leftovers, memory_order_relaxed)) &&
	    !(atomic_load_explicit(&rec->cancel, memory_order_relaxed) &
	      FANOUT_CANCEL_PENDING)) {
		fq_submit(rec->e->q, &rec->work, 1); /* credit and ref held */
	} else {
		fq_unreserve(rec->e->q, 1);
		fanout__rec_put(rec, 1);
	}
}

/* No place for the next child: park this runner as a token (a ring credit
 * and a record reference) that the next give_place resubmits.  Returns 1
 * when parked (the runner leaves), 0 when a place came free before anyone
 * took the token (try again), -1 when the ring has no credit to park with
 * (the runner goes on without a place). */
static int park(struct record *rec)
{
	if (!fq_reserve(rec->e->q, 1, 1))
		return -1;
	/* relaxed: we hold a reference already. */
	atomic_fetch_add_explicit(&rec->refs, 1, memory_order_relaxed);
	/* seq_cst: the store of the "Places" pair; then re-read `places`. */
	atomic_fetch_add_explicit(&rec->parked, 1, memory_order_seq_cst);
	/* Every child may have finished meanwhile (others ran what we handed
	 * back): then finalise's release_tokens came before our token, and
	 * nobody would release it.  acquire: after our RMW on `parked`, which
	 * follows finalise's acq_rel exchange if that came first, so its
	 * zeroing of `remaining` is seen. */
	if (atomic_load_explicit(&rec->remaining, memory_order_acquire) == 0) {
		if (take_parked(rec)) {
			fq_unreserve(rec->e->q, 1);
			fanout__rec_put(rec, 1);
		}
		return 1;
	}
	if (atomic_load_explicit(&rec->places, memory_order_seq_cst) <
		    rec->e->cfg.max_children &&
	    take_parked(rec)) {
		/* A place came free before anyone saw our token: unpark. */
		fq_unreserve(rec->e->q, 1);
		fanout__rec_put(rec, 1);
		return 0;
	}
	return 1;
}

/* The fanout_run caller found no place: sleep until a place is given back
 * (give_place signals after every give-back; a spurious wake-up only
 * makes the caller look again).  No lost wake-up: argument 2 of fq.c,
 * with the re-check of `places` as W3 and give_place's RMW on it as P1. */
static void wait_place(struct record *rec)
{
	uint32_t v = fq_ec_prepare(&rec->place_ec);

	/* seq_cst: W3, after the announcement (see above). */
	if (atomic_load_explicit(&rec->places, memory_order_seq_cst) >=
	    rec->e->cfg.max_children)
		fq_ec_wait(&rec->place_ec, v, 0);
	fq_ec_done(&rec->place_ec);
}

/* No place for the next child.  A ring token parks (park(), whose return
 * this is); the fanout_run caller (@local) waits for a place on its own
 * thread and tries again (0).  A parked token of the caller's could only
 * be run by a worker, and when the fanout_run is nested in a child every
 * worker may be such a caller (with one worker, always): nobody would run
 * it, and the nested run would never return. */
static int no_place(struct record *rec, bool local)
{
	if (!local)
		return park(rec);
	wait_place(rec);
	return 0;
}

/* One runner: a ring token, or (@local) the fanout_run caller.  It takes
 * chunks until none is left, then hands everything it finished to the
 * join counter in ONE subtraction, so `remaining` is touched once per
 * runner, not once per chunk.  @ref as in runner_done.  Returns whether
 * it finalised. */
static bool run_token(struct record *rec, bool local, bool *ref)
{
	uint32_t n = rec->ntasks, chunk = rec->chunk;
	/* The caller has slot 0 (a synchronous record hands out from 1);
	 * relaxed: a distinct index is all the others need (RMW total
	 * order).  A token resubmitted after parking has no slot of its own. */
	uint32_t slot = local ? 0 :
				atomic_fetch_add_explicit(&rec->runner_next, 1,
							  memory_order_relaxed);
	struct progress_slot *prog =
		slot < rec->nrunners ? &rec->progress[slot] : NULL;
	struct tally t = {0, 0, 0, false, 0};
	bool force = false, first = local;
	/* took: this runner took a leftover range (take_leftover empties the
	 * list for a moment); recheck: go back for ranges still there. */
	bool took = false, recheck = false;
	uint64_t cycles, from = 0;
	uint32_t end;

	for (;;) {
		uint32_t i;
		bool placed = false;

		/* The caller's first chunk was claimed at the record's
		 * creation (fanout__first_chunk); run_chunk sees a cancel
		 * and takes places as for any chunk. */
		if (first) {
			first = false;
			i = 0;
			end = fanout__first_chunk(rec);
			from = rec->start_tick;
			goto run;
		}
		/* relaxed: a hint only; the claim below decides. */
		if (atomic_load_explicit(&rec->cancel, memory_order_relaxed) &
		    FANOUT_CANCEL_PENDING)
			break;
		/* relaxed: set once by fanout_defer; a stale false costs one
		 * chunk claimed whole, whose rest run_chunk hands back. */
		if (recheck || atomic_load_explicit(&rec->deferring,
						    memory_order_relaxed)) {
			recheck = false;
			chunk = 1;
			from = 0; /* it may park below: the next child reads */
			placed = force || take_place(rec);
			if (!placed) {
				int parked = no_place(rec, local);

				if (parked > 0)
					break; /* resubmitted on a place */
				if (parked == 0)
					continue; /* a place came free */
				force = true; /* no ring credit: run unplaced */
			}
			if (take_leftover(rec, &i, &end)) {
				took = true;
				goto run;
			}
		}
		/* relaxed: ownership comes from the RMW's total order on
		 * `claim`; the task slots were published by the ring handoff
		 * (or are the caller's own writes). */
		i = atomic_fetch_add_explicit(&rec->claim, chunk,
					      memory_order_relaxed);
		if (i >= n) {
			if (placed && !force)
				fanout__give_place(rec);
			if (took && leftovers_left(rec)) {
				recheck = true;
				continue;
			}
			break;
		}
		end = n - i < chunk ? n : i + chunk;
	run:
		t.handed_back = false;
		/* The next chunk's first child starts where this chunk's last
		 * one ended: one tick read per child boundary, also between
		 * chunks (claimed right after, unless the runner parks or
		 * submits runners in between, which reset it). */
		from = run_chunk(rec, prog, i, end, &t, &cycles,
				 placed && !force, force, from);
		if (t.handed_back) {
			int parked;

			from = 0; /* parking: the next child reads afresh */
			parked = no_place(rec, local);

			if (parked > 0)
				break;
			if (parked < 0)
				force = true;
			continue;
		}
		/* The claim reached the end: another claim would only say so
		 * (one RMW per runner saved, as in fanout__help_step).  Ranges
		 * handed back by others are not ours to wait for: their
		 * parked tokens come back for them (give_place).  Unless we
		 * took one: see leftovers_left(). */
		if (end == n) {
			if (took && leftovers_left(rec)) {
				recheck = true;
				continue;
			}
			break;
		}
		if (add_runners(rec, i, end, cycles))
			from = 0; /* its kick may have made a system call */
		chunk = next_chunk(rec, chunk, end, cycles);
	}
	return runner_done(rec, prog, &t, local, ref);
}

/* The fq_work function: a ring token, holding one record reference. */
void fanout__run_token(struct fq_work *w)
{
	struct record *rec = caa_container_of(w, struct record, work);
	bool ref = true;

	run_token(rec, false, &ref);
	if (ref)
		fanout__rec_put(rec, 1);
}

/* The fanout_run caller's own run of its record.  It holds no reference
 * of its own: the event's, which it will be handed, keeps the record.
 * Returns true when it finalised the record itself (then nothing signals
 * done_word, and there is nothing to wait for). */
bool fanout__run_own(struct record *rec)
{
	return run_token(rec, true, NULL);
}

/*
 * One step of a helping fanout_wait (FANOUT_WAIT_HELPS): take a token and
 * run chunks of its record on this thread for as long as @more(@arg) says
 * the consumer has nothing better to do (its sink is still empty, its
 * deadline not passed): it is asked between chunks, so a consumer is never
 * captured by a whole delegation.  Chunks grow as a worker's do
 * (next_chunk).  If children are left to claim when it stops, the token
 * goes back into the ring for another runner.  Keeping the token while
 * nothing calls the consumer away, rather than putting it back after each
 * chunk, is what lets a consumer run a small batch alone: a put-back wakes
 * a parked worker for children the consumer would have run sooner itself
 * (bench/PROFILE.txt, phase 8).  The token is put back BEFORE this
 * runner's children count in the join, so the record cannot finish (and
 * the engine cannot stop its queue) under that submit; we hold a
 * reference of our own meanwhile, since the token's travels with it.  The
 * helper takes no progress slot: lookup counts its children once it
 * leaves the record.  Two cases run on regardless of @more: no ring
 * credit to put the token back with (concurrent dispatches took every
 * one), and a record whose children defer (their starts are quick; places
 * and parking govern them); fanout.h says so.
 * Returns false when there was no token to take.
 */
bool fanout__help_step(struct fanout_engine *e, bool (*more)(void *), void *arg)
{
	struct fq_work *w = fq_help_take(e->q);
	struct record *rec;
	uint32_t n, chunk, i, end;
	struct tally t = {0, 0, 0, false, 0};
	bool ref = true; /* the token's reference, or our own */
	uint64_t cycles, from = 0;

	if (!w)
		return false;
	rec = caa_container_of(w, struct record, work);
	n = rec->ntasks;
	chunk = rec->chunk;

	/* relaxed: as in run_token; the claim decides. */
	if ((atomic_load_explicit(&rec->cancel, memory_order_relaxed) &
	     FANOUT_CANCEL_PENDING) ||
	    atomic_load_explicit(&rec->deferring, memory_order_relaxed)) {
		fanout__run_token(w);
		return true;
	}
	for (;;) {
		/* relaxed: as in run_token; the RMW's total order decides. */
		i = atomic_fetch_add_explicit(&rec->claim, chunk,
					      memory_order_relaxed);
		if (i >= n)
			break;
		end = n - i < chunk ? n : i + chunk;
		t.handed_back = false;
		/* One tick read per child boundary, as in run_token. */
		from = run_chunk(rec, NULL, i, end, &t, &cycles, false, false,
				 from);
		/* Nothing left to claim - unless this chunk handed children
		 * back for want of a place: then only a token can come back
		 * for them, so it goes back into the ring below even from the
		 * batch's last chunk (without one, nobody ran them and the
		 * event never came). */
		if (end == n && !t.handed_back)
			break;
		if (t.handed_back || !more(arg)) {
			/* Finished meanwhile (a cancel took the rest): no
			 * token to put back, and a shutdown may be stopping
			 * the queue.  acquire: as in park(). */
			if (atomic_load_explicit(&rec->remaining,
						 memory_order_acquire) == 0)
				break;
			/* relaxed: we hold the token's reference while
			 * taking ours. */
			atomic_fetch_add_explicit(&rec->refs, 1,
						  memory_order_relaxed);
			if (fq_reserve(e->q, 1, 1))
				fq_submit(e->q, w, 1);
			else
				fanout__run_token(
					w); /* no room in the ring: run the rest */
			break;
		}
		if (add_runners(rec, i, end, cycles))
			from = 0; /* as in run_token */
		chunk = next_chunk(rec, chunk, end, cycles);
	}
	runner_done(rec, NULL, &t, false, &ref);
	if (ref) /* ours, or the token's if it is used up */
		fanout__rec_put(rec, 1);
	return true;
}

/* Claim every unstarted child for the canceller; see "Claim" above.
 * Returns how many it took; the caller keeps the record alive (an RCU read
 * section, a reference, or an unfinished child of its own). */
static unsigned claim_rest(struct record *rec, uint32_t cancel)
{
	uint32_t n = rec->ntasks, old, i;

	old = atomic_exchange_explicit(&rec->claim, n, memory_order_relaxed);
	skip_leftovers(rec, cancel);
	if (old >= n)
		return 0;
	for (i = old; i < n; i++)
		skip_child(rec, i, cancel);
	release_tokens(rec, &rec->parked);
	fanout__stat_add(&rec->e->st_skipped, n - old);
	fanout__join_sub(rec, n - old);
	return n - old;
}

/*
 * Interrupt a record: @how is FANOUT_CANCEL_* (INTERRUPT implies PENDING;
 * ABANDON counts only with INTERRUPT) plus the CANCEL_* source.  Unstarted
 * children are claimed and skipped; with INTERRUPT the deferred children's
 * on_cancel callbacks run, with ABANDON they are finished, and the cancel
 * tree is walked.  The caller keeps the record alive (RCU read section, a
 * reference, or an unfinished child of its own).
 */
int fanout__cancel_rec(struct record *rec, unsigned how)
{
	return fanout__cancel_rec_new(rec, how, NULL);
}

/*
 * fanout__cancel_rec(), and *@fresh (if not NULL, on 0) tells whether this
 * call added a FANOUT_CANCEL_* bit the record did not have yet: what
 * fanout_cancel_session() counts as "cancelled by this call".
 */
int fanout__cancel_rec_new(struct record *rec, unsigned how, bool *fresh)
{
	uint32_t bits = how & ~(CANCEL_HOW_MASK | CANCEL_FINAL);
	uint32_t old;

	if (how & FANOUT_CANCEL_INTERRUPT)
		bits |= FANOUT_CANCEL_PENDING | FANOUT_CANCEL_INTERRUPT |
			(how & FANOUT_CANCEL_ABANDON);
	else
		bits |= FANOUT_CANCEL_PENDING;
	/* acquire: pairs with the join's last decrement; 0 remaining means
	 * every child is done and the event is (being) published. */
	if (atomic_load_explicit(&rec->remaining, memory_order_acquire) == 0)
		return -EALREADY;
	/* seq_cst: a child that sees the bit in fanout_interrupted() sees
	 * everything the canceller did before (release); pairs with the
	 * finaliser's fetch_or of CANCEL_FINAL, whichever comes first
	 * decides; and it is the store of the store-load pairs against
	 * fanout_defer's push (pending.c) and a nested dispatch's re-check of
	 * its parent (tree.c). */
	old = atomic_fetch_or_explicit(&rec->cancel, bits,
				       memory_order_seq_cst);
	if (old & CANCEL_FINAL)
		return -EALREADY; /* the finaliser already read the bits */
	if (fresh)
		*fresh = (bits & CANCEL_HOW_MASK & ~old) != 0;
	/* What was asked (not the PENDING that INTERRUPT implies) and by
	 * whom: README's "cancel" row. */
	FANOUT_PROBE_CANCEL(rec->id, how & CANCEL_HOW_MASK,
			    how & ~(CANCEL_HOW_MASK | CANCEL_FINAL));
	if (!(old & CANCEL_BY_CALLER) && (bits & CANCEL_BY_CALLER))
		fanout__stat_add(&rec->e->st_cancelled, 1);
	claim_rest(rec, old | bits);
	if (bits & FANOUT_CANCEL_INTERRUPT) {
		fanout__pendings_cancel(rec, old | bits);
		fanout__tree_cancel(rec, bits & CANCEL_HOW_MASK);
	}
	return 0;
}
