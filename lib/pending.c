/* SPDX-License-Identifier: MIT */
/*
 * pending.c - children that finish later: fanout_defer, fanout_complete,
 * on_cancel callbacks, abandoning.
 *
 * WHY IT IS CORRECT
 *
 * Finishing.  A pending child is finished by exactly one of: its completer
 * (fanout_complete), an abandoner (fanout__pendings_cancel with ABANDON:
 * fanout_cancel, the deadline, a join policy, shutdown, the cancel tree),
 * or fanout_defer itself when it finds ABANDON already set after pushing.
 * Each does CAS(state, s, s | PEND_DONE) from a state without PEND_DONE;
 * the CAS's total order gives one winner.  The winner writes the child's
 * result slot, gives its max_children place back and subtracts 1 from the
 * join (join.c), in that order, so the record cannot finish before the
 * slot is written.  Losers write nothing; the completer returns -EALREADY.
 * (tests/models/pending_finish.pml checks this race.)
 *
 * Push against abandon.  fanout_defer pushes p onto the record's list
 * (seq_cst CAS) and then loads `cancel` (seq_cst); an abandoner sets the
 * cancel bits (seq_cst fetch_or in fanout__cancel_rec) and then loads the
 * list head (seq_cst).  Store-buffering with seq_cst on both sides: at
 * least one sees the other, so no pending child escapes an abandon.
 *
 * Callbacks.  Registering claims PEND_CBW (one registrant), writes cb and
 * cb_arg, sets PEND_CB (seq_cst RMW) and then loads `cancel` (seq_cst); an
 * interrupter sets the cancel bits and then loads each p's state (seq_cst).
 * Again at least one sees the other; whoever does claims PEND_RUN by CAS,
 * only while PEND_DONE is clear, and runs the callback: at most once, and
 * never for a child already finished when it was claimed.  It runs inside
 * an RCU read section (the interrupter's, or the registrant's own), so p
 * stays valid until it returns even if a completer finishes the child
 * meanwhile and the record is freed (Lifetime).
 *
 * Cost.  fanout_pending_add_cost() adds to cost_bits by CAS, only while it
 * is not PEND_COST_TAKEN (a NaN pattern: no sum of finite costs has it);
 * the finisher, once it has won try_finish, swaps PEND_COST_TAKEN in and
 * counts what it took.  The CAS and the swap are RMWs on one location, so
 * each addition comes before the swap (taken, so in the event) or after
 * it (refused with -EALREADY): none is lost.
 *
 * Lifetime.  refs = 2: the record's (put when the record is freed after a
 * grace period, rec_free_rcu in record.c) and the completer's (put by
 * fanout_complete whatever it returns).  The record is read through p only
 * by a finisher that won the CAS (the record cannot finish before its
 * subtraction), or inside an RCU read section after seeing PEND_DONE clear
 * (the record cannot be freed before that section ends).  So p outlives
 * both the record and every walker of its list, and a completer that
 * comes after the record and even the engine are gone touches neither.
 */
#include "internal.h"

#include <errno.h>
#include <float.h>
#include <math.h>
#include <string.h>

#define MAX_TEXT (16u << 20)
#define PEND_CBW 0x8u /* a registration is under way (cb being written) */
#define PEND_COST_TAKEN UINT64_MAX /* cost_bits once the child finished */

void fanout__pending_put(struct fanout_pending *p)
{
	/* release on the decrement, acquire before the free (refcount.h). */
	if (atomic_fetch_sub_explicit(&p->refs, 1, memory_order_acq_rel) == 1)
		fanout__free_small(p, sizeof(*p));
}

/* Claim the right to finish @p; exactly one caller gets true. */
static bool try_finish(struct fanout_pending *p)
{
	uint32_t s = atomic_load_explicit(&p->state, memory_order_relaxed);

	/* acq_rel: the winner sees what the registrant and the child wrote
	 * before their own RMWs on `state`; the losers publish nothing.
	 * seq_cst: also in the single order S, against the fence and load
	 * of a dispatch hanging from this child (deleg.c recheck, tree.c
	 * "Late kids"). */
	do {
		if (s & PEND_DONE)
			return false;
	} while (!atomic_compare_exchange_weak_explicit(
		&p->state, &s, s | PEND_DONE, memory_order_seq_cst,
		memory_order_relaxed));
	return true;
}

/* The winner of try_finish: base plus what fanout_pending_add_cost() added,
 * which no addition can join any more (see "Cost"); DBL_MAX if the sum
 * overflows. */
static double take_cost(struct fanout_pending *p, double base)
{
	/* relaxed: only the RMW order on cost_bits matters ("Cost"); the
	 * sum is published with the child's slot by the join. */
	uint64_t b = atomic_exchange_explicit(&p->cost_bits, PEND_COST_TAKEN,
					      memory_order_relaxed);
	double sum = base + fanout__bits_to_double(b);

	return isfinite(sum) ? sum : DBL_MAX;
}

/* The winner's tail: count, give the place back, apply the join policy,
 * and hand the child to the join (which may finalise the record). */
static void finish_tail(struct record *rec, enum fanout_status st)
{
	/* relaxed: a figure for lookup. */
	atomic_fetch_sub_explicit(&rec->npending, 1, memory_order_relaxed);
	fanout__give_place(rec);
	if (rec->join != FANOUT_JOIN_ALL)
		fanout__after_child(rec, st);
	fanout__join_sub(rec, 1);
}

/* The library finishes @p as interrupted (abandon). */
static void abandon(struct fanout_pending *p, uint32_t cancel)
{
	struct record *rec;
	struct fanout_result *r;

	if (!try_finish(p))
		return;
	rec = p->rec;
	r = &rec->results[p->index];
	if (rec->owned[p->index] & OWN_ERROR) {
		fanout__str_free(r->error);
		rec->owned[p->index] = 0;
	}
	r->code = fanout__interrupt_code(cancel);
	r->status = FANOUT_INTERRUPTED;
	fanout__mark_irregular(rec);
	fanout__mark_policy(rec, cancel);
	r->error = cancel & CANCEL_TIMEDOUT ?
			   "abandoned: the delegation's deadline passed" :
			   "abandoned: the delegation was interrupted";
	r->duration_ns = fanout__child_ns(rec, p->t0);
	r->cost = take_cost(p, r->cost);
	fanout__cost_add(rec, r->cost);
	FANOUT_PROBE_CHILD_DONE(p->id, p->index, FANOUT_INTERRUPTED,
				r->duration_ns);
	finish_tail(rec, FANOUT_INTERRUPTED);
}

/* Run @p's callback if one is registered and nobody ran it yet. */
static void maybe_run_cb(struct fanout_pending *p)
{
	/* seq_cst: the load of the "Callbacks" pair. */
	uint32_t s = atomic_load_explicit(&p->state, memory_order_seq_cst);

	while ((s & PEND_CB) && !(s & (PEND_RUN | PEND_DONE))) {
		/* acquire: sees cb/cb_arg, written before PEND_CB was set. */
		if (atomic_compare_exchange_weak_explicit(
			    &p->state, &s, s | PEND_RUN, memory_order_acq_rel,
			    memory_order_relaxed)) {
			p->cb(p, p->cb_arg);
			return;
		}
	}
}

void fanout__pendings_cancel(struct record *rec, uint32_t cancel)
{
	struct fanout_pending *p;

	/* seq_cst: the load of the "Push against abandon" pair; also an
	 * acquire of every push, so each p's fields and `next` are seen. */
	for (p = atomic_load_explicit(&rec->pendings, memory_order_seq_cst); p;
	     p = p->next) {
		maybe_run_cb(p);
		if (cancel & FANOUT_CANCEL_ABANDON)
			abandon(p, cancel);
	}
}

struct fanout_pending *fanout_defer(struct fanout_child *c)
{
	struct fanout_pending *p, *head;
	struct record *rec;
	uint32_t cancel;

	if (!c || c->pending) {
		errno = EINVAL;
		return NULL;
	}
	rec = c->rec;
	p = fanout__alloc_small(sizeof(*p));
	if (!p) {
		errno = ENOMEM;
		return NULL;
	}
	p->rec = rec;
	p->id = rec->id;
	p->index = c->index;
	p->t0 = c->t0;
	p->cb = NULL;
	p->cb_arg = NULL;
	atomic_init(&p->state, 0);
	atomic_init(&p->refs, 2);
	atomic_init(&p->cost_bits, 0); /* +0.0 */
	c->pending = p;
	/* relaxed (all three): the place and the count are RMWs whose order
	 * alone matters; `deferring` is a mode hint for the runners. */
	if (!c->placed)
		atomic_fetch_add_explicit(&rec->places, 1,
					  memory_order_relaxed);
	atomic_fetch_add_explicit(&rec->npending, 1, memory_order_relaxed);
	if (!atomic_load_explicit(&rec->deferring, memory_order_relaxed))
		atomic_store_explicit(&rec->deferring, true,
				      memory_order_relaxed);
	head = atomic_load_explicit(&rec->pendings, memory_order_relaxed);
	do {
		p->next = head;
		/* seq_cst: the store of the "Push against abandon" pair, and
		 * the release that publishes p to the list's walkers. */
	} while (!atomic_compare_exchange_weak_explicit(&rec->pendings, &head,
							p, memory_order_seq_cst,
							memory_order_relaxed));
	FANOUT_PROBE_DEFER(p->id, p->index);
	cancel = atomic_load_explicit(&rec->cancel, memory_order_seq_cst);
	if ((cancel & FANOUT_CANCEL_ABANDON) && !(cancel & CANCEL_FINAL))
		abandon(p, cancel);
	return p;
}

/* @error is ignored when @code is 0 (fanout.h), so it is not even read
 * then: a stale or unterminated pointer beside a success is no -EINVAL
 * (which would leave the child unfinished for a caller that ignores it). */
static bool bad_outcome(const struct fanout_outcome *o)
{
	return o->code == -EINPROGRESS || !isfinite(o->cost) || o->cost < 0 ||
	       (!o->summary && o->summary_len) || o->summary_len > MAX_TEXT ||
	       (o->code && o->error &&
		strnlen(o->error, MAX_TEXT + 1) > MAX_TEXT);
}

int fanout_complete(struct fanout_pending *p, const struct fanout_outcome *o)
{
	static const struct fanout_outcome nothing;
	struct fanout_result *r;
	struct record *rec;
	char *sum = NULL, *err = NULL;
	enum fanout_status st;
	int code, ret = 0;

	if (!p)
		return -EINVAL;
	if (!o)
		o = &nothing;
	if (bad_outcome(o))
		return -EINVAL;
	/* acquire: a finished child's record may be gone; do not copy. */
	if (atomic_load_explicit(&p->state, memory_order_acquire) & PEND_DONE) {
		fanout__pending_put(p);
		return -EALREADY;
	}
	code = o->code;
	if (o->summary)
		sum = fanout__str_dup(o->summary, o->summary_len);
	if (code && o->error)
		err = fanout__str_dup(o->error, strlen(o->error));
	if ((o->summary && !sum) || (code && o->error && !err)) {
		fanout__str_free(sum);
		fanout__str_free(err);
		sum = err = NULL;
		code = ret = -ENOMEM;
	}
	if (!try_finish(p)) {
		fanout__str_free(sum);
		fanout__str_free(err);
		fanout__pending_put(p);
		return -EALREADY;
	}
	rec = p->rec;
	r = &rec->results[p->index];
	/* The outcome replaces what the child set before deferring. */
	fanout__str_free(r->summary);
	r->summary = sum;
	if (rec->owned[p->index] & OWN_ERROR)
		fanout__str_free(r->error);
	r->error = err;
	rec->owned[p->index] = err ? OWN_ERROR : 0;
	if (sum || err)
		fanout__mark_strings(rec);
	r->cost = take_cost(p, o->cost);
	fanout__cost_add(rec, r->cost);
	r->duration_ns = fanout__child_ns(rec, p->t0);
	st = fanout__set_outcome(rec, p->index, r, code);
	FANOUT_PROBE_COMPLETE(p->id, p->index, r->code);
	FANOUT_PROBE_CHILD_DONE(p->id, p->index, st, r->duration_ns);
	finish_tail(rec, st);
	fanout__pending_put(p);
	return ret;
}

int fanout_pending_on_cancel(struct fanout_pending *p,
			     void (*fn)(struct fanout_pending *p, void *arg),
			     void *arg)
{
	uint32_t s, cancel;
	bool run = false;

	if (!p || !fn)
		return -EINVAL;
	s = atomic_load_explicit(&p->state, memory_order_relaxed);
	/* relaxed on success: only this registrant writes cb until it sets
	 * PEND_CB (below, with release). */
	do {
		if (s & PEND_DONE)
			return -EALREADY;
		if (s & (PEND_CBW | PEND_CB))
			return -EBUSY;
	} while (!atomic_compare_exchange_weak_explicit(
		&p->state, &s, s | PEND_CBW, memory_order_relaxed,
		memory_order_relaxed));
	p->cb = fn;
	p->cb_arg = arg;
	fanout__read_lock();
	/* seq_cst: the store of the "Callbacks" pair, and the release of
	 * cb/cb_arg to whoever claims PEND_RUN. */
	s = atomic_fetch_or_explicit(&p->state, PEND_CB, memory_order_seq_cst);
	if (s & PEND_DONE) {
		fanout__read_unlock();
		return -EALREADY; /* finished meanwhile: fn will not run */
	}
	/* The child was not finished at the RMW above, so its record is not
	 * freed before we unlock.  seq_cst: the load of the "Callbacks" pair,
	 * after our RMW of PEND_CB, against an interrupter's fetch_or of the
	 * cancel bits and its load of `state` (maybe_run_cb). */
	cancel = atomic_load_explicit(&p->rec->cancel, memory_order_seq_cst);
	if (cancel & FANOUT_CANCEL_INTERRUPT) {
		s |= PEND_CB;
		/* acq_rel: the PEND_RUN claim, as in maybe_run_cb: one
		 * claimant in the RMW order of `state`, against an
		 * interrupter's claim and a finisher's PEND_DONE. */
		while (!(s & (PEND_RUN | PEND_DONE)) &&
		       !atomic_compare_exchange_weak_explicit(
			       &p->state, &s, s | PEND_RUN,
			       memory_order_acq_rel, memory_order_relaxed))
			;
		run = !(s & (PEND_RUN | PEND_DONE));
		/* Finished (abandoned) between our CB and our RUN claim, with
		 * nobody running fn: it never will (found by
		 * tests/models/pending_finish.pml, FIX=0). */
		if ((s & PEND_DONE) && !(s & PEND_RUN)) {
			fanout__read_unlock();
			return -EALREADY;
		}
	}
	/* fn runs inside the read section, as maybe_run_cb's callers run it:
	 * a completer may finish the child meanwhile, the record then finish
	 * and be freed, and with it the record's reference on p (Lifetime);
	 * the section keeps p valid until fn returns, as fanout.h says. */
	if (run) {
		FANOUT_TEST_POINT(FANOUT_AT_ON_CANCEL_RUN, p);
		fn(p, arg);
	}
	fanout__read_unlock();
	return 0;
}

bool fanout_pending_interrupted(const struct fanout_pending *p)
{
	bool v;

	if (!p)
		return false;
	fanout__read_lock();
	/* acquire: pairs with the finisher's CAS.  A child finished by the
	 * library was abandoned, i.e. interrupted; otherwise its record is
	 * alive until we unlock. */
	if (atomic_load_explicit(&p->state, memory_order_acquire) & PEND_DONE)
		v = true;
	else /* acquire: pairs with the canceller's fetch_or. */
		v = atomic_load_explicit(&p->rec->cancel,
					 memory_order_acquire) &
		    FANOUT_CANCEL_INTERRUPT;
	fanout__read_unlock();
	return v;
}

int fanout_pending_add_cost(struct fanout_pending *p, double x)
{
	uint64_t old;

	if (!p || !isfinite(x) || x < 0)
		return -EINVAL;
	/* relaxed (load and CAS): only the RMW order on cost_bits matters,
	 * against take_cost()'s swap ("Cost"); nothing else is published. */
	old = atomic_load_explicit(&p->cost_bits, memory_order_relaxed);
	do {
		double sum;

		if (old == PEND_COST_TAKEN)
			return -EALREADY;
		sum = fanout__bits_to_double(old) + x;
		if (!isfinite(sum))
			return -EINVAL; /* the sum would not be finite */
		if (atomic_compare_exchange_weak_explicit(
			    &p->cost_bits, &old, fanout__double_to_bits(sum),
			    memory_order_relaxed, memory_order_relaxed))
			return 0;
	} while (true);
}

unsigned fanout_pending_index(const struct fanout_pending *p)
{
	return p ? p->index : 0;
}

fanout_id fanout_pending_id(const struct fanout_pending *p)
{
	return p ? p->id : 0;
}
