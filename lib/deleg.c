/* SPDX-License-Identifier: MIT */
/*
 * deleg.c - the public entry points of delegations: dispatch, run,
 * delegate, cancel.  The record block lives in record.c, the children and
 * the join in join.c.
 *
 * WHY IT IS CORRECT
 *
 * Capacity.  max_async is an admission counter: fetch_add, and undo on
 * overflow; the finaliser gives the slot back BEFORE publishing, so a
 * consumer that receives an event can immediately dispatch again.  Ring
 * credits are reserved before anything is inserted, so an accepted batch
 * never finds the ring full, and a refused one has changed nothing.  The
 * sink's max_pending (back-pressure, sink.c) is the same kind of counter,
 * taken first and given back when the event is taken.
 *
 * Shutdown.  `active` (two counters, one per side: record.c) counts
 * unfinished records plus dispatch/run calls in progress.  A call adds 2
 * (itself and its record) before it reads `shutting`; fanout_shutdown
 * stores `shutting` and then scans the table.  After inserting, a
 * dispatch issues a full fence and re-reads `shutting` and cancels its own
 * record if set (recheck): with the fences on both sides (store; fence;
 * scan / insert; fence; load), either the scan sees the record or the
 * dispatch sees the flag, so no accepted delegation escapes the interrupt
 * (tests/models/shutdown_drain.pml).  The call's own unit is dropped only
 * after its last touch of the queue, so fanout_shutdown, which waits until
 * nothing is in flight (fanout__drained) before stopping the queue, never
 * stops it under a submit.
 *
 * Admission.  max_async counts background delegations between their
 * admission and their finalise: `async_started` (the dispatchers' line)
 * less `async_done` (the finalisers').  A dispatch takes its slot with a
 * fetch_add of async_started and compares the old value s with
 * `async_limit`, an async_done + max_async that a dispatcher read earlier
 * (async_done only grows, so an old limit is a low one: the bound holds
 * with any limit read); only when s reaches the limit does it read
 * async_done again, and it refuses if s is still at or past the new one.
 * So at most max_async are admitted and not finished, and a refusal means
 * max_async were admitted and not finished when it read async_done -
 * counting dispatches that took a slot and are refused later (no ring
 * credit, no memory), which hold it until they give it back: so a
 * refusal may see only max_async - k running, with k such dispatches in
 * flight, as for the sink's max_pending (sink.c).  In the usual
 * hand-off neither side RMWs a line the other wrote last (one counter
 * cost both a locked miss per delegation, bench/PROFILE.txt phase 15).
 * 32-bit counters, compared by signed difference: they never differ by
 * 2^31 (max_async <= 2^20).
 */
#include "internal.h"

#include <errno.h>
#include <string.h>

static int reject(struct fanout_engine *e, int err)
{
	fanout__stat_add(&e->st_rejected, 1);
	FANOUT_PROBE_REJECT(err);
	return err;
}

/*
 * What a new delegation hangs from: the child running on the calling
 * thread, or batch->within (a deferred child, on a thread that is not
 * running it).  Its record gives the depth and the cancel tree.  It stays
 * alive until origin_put, after the re-check (recheck), the last use: a
 * running child's record cannot finish under it, and for @within we hold
 * a reference.  A child of another engine's delegation also pins that
 * engine until then: a unit of its `active` (@pinned), so its
 * fanout_shutdown waits and its fanout_destroy cannot free it while we
 * read its record (rec_link) or drop our reference (which may retire the
 * record into that engine).  Not longer: a fanout_run's children may shut
 * that engine down themselves.
 */
struct origin {
	struct record *parent;
	/* The deferred child we hang from, if any: @within, or the calling
	 * thread's child once it called fanout_defer().  recheck() looks at
	 * it after the link ("Late kids"); alive while the parent record is
	 * (pending.c, "Lifetime"). */
	struct fanout_pending *pend;
	struct fanout_engine *pinned; /* the parent's engine, if not ours */
	bool ref;
};

static int origin_get(struct fanout_engine *e, const struct fanout_batch *b,
		      struct origin *o)
{
	struct fanout_child *cur = fanout__current();
	struct fanout_engine *pe;
	uint32_t k;

	o->parent = NULL;
	o->pend = NULL;
	o->pinned = NULL;
	o->ref = false;
	if (!b->within) {
		o->parent = cur ? cur->rec : NULL;
		o->pend = cur ? cur->pending : NULL;
		return 0;
	}
	fanout__read_lock();
	/* acquire: pairs with the finisher's CAS; unfinished, the child's
	 * record cannot be freed before we unlock (pending.c, "Lifetime"). */
	if (atomic_load_explicit(&b->within->state, memory_order_acquire) &
	    PEND_DONE) {
		fanout__read_unlock();
		return -ECANCELED; /* that child was abandoned */
	}
	o->parent = b->within->rec;
	o->pend = b->within;
	FANOUT_TEST_POINT(FANOUT_AT_ORIGIN_CHECKED, o->parent);
	/* The child may be finished since, and its record's last reference
	 * put: a reference is taken only from a count that is not zero.
	 * relaxed: the CAS's total order on `refs` decides; the record's
	 * memory is ours to read until we unlock. */
	k = atomic_load_explicit(&o->parent->refs, memory_order_relaxed);
	do {
		if (!k) {
			fanout__read_unlock();
			o->parent = NULL;
			o->pend = NULL;
			return -ECANCELED;
		}
	} while (!atomic_compare_exchange_weak_explicit(
		&o->parent->refs, &k, k + 1, memory_order_relaxed,
		memory_order_relaxed));
	o->ref = true;
	pe = o->parent->e;
	if (pe != e) {
		/* Still inside the section, so pe is not freed yet.  seq_cst
		 * (both): the store-load pair of enter() against pe's
		 * fanout_shutdown().  A shutting engine abandons the child. */
		atomic_fetch_add_explicit(&pe->active_in, 1,
					  memory_order_seq_cst);
		if (atomic_load_explicit(&pe->shutting, memory_order_seq_cst)) {
			fanout__active_put(pe, 1);
			fanout__rec_put(o->parent, 1);
			fanout__read_unlock();
			o->parent = NULL;
			o->pend = NULL;
			o->ref = false;
			return -ECANCELED;
		}
		o->pinned = pe;
	}
	fanout__read_unlock();
	FANOUT_TEST_POINT(FANOUT_AT_ORIGIN_TAKEN, o->parent);
	return 0;
}

static void origin_put(struct origin *o)
{
	if (o->ref)
		fanout__rec_put(o->parent, 1);
	if (o->pinned) {
		/* The last touch of that engine: after the drop its shutdown
		 * may return, and its destroy waits for this section (a grace
		 * period) before it frees it. */
		fanout__read_lock();
		fanout__active_put(o->pinned, 1);
		fanout__read_unlock();
	}
}

/* Check @b and size its goal copies (*goals: bytes, see
 * fanout__rec_alloc) in one pass over the caller's tasks. */
static int check_batch(struct fanout_engine *e, const struct fanout_batch *b,
		       unsigned *depth, struct origin *o, size_t *goals)
{
	const struct fanout_task *t = b->tasks;
	const char *prev = NULL;
	uintptr_t any_goal = 0;
	size_t bytes = 0;
	unsigned i;
	bool bad = false;
	int err;

	if (!b->tasks || !b->ntasks || (b->flags & ~FANOUT_BORROW_TASKS))
		return -EINVAL;
	if (b->ntasks > e->cfg.max_tasks)
		return -E2BIG;
	for (i = 0; i < b->ntasks; i++) { /* no branch per task */
		bad |= !t[i].fn;
		any_goal |= (uintptr_t)t[i].goal;
	}
	if (bad)
		return -EINVAL;
	/* The same rule as the copy's: a goal that repeats the one before
	 * it shares its copy. */
	for (i = 0;
	     any_goal && !(b->flags & FANOUT_BORROW_TASKS) && i < b->ntasks;
	     i++) {
		if (t[i].goal && t[i].goal != prev) {
			prev = t[i].goal;
			bytes += strlen(prev) + 1;
		}
	}
	*goals = bytes;
	if (b->join > FANOUT_JOIN_QUORUM ||
	    (b->join == FANOUT_JOIN_QUORUM ?
		     !b->quorum || b->quorum > b->ntasks :
		     b->quorum != 0) ||
	    b->deadline_ns > FANOUT_MAX_DEADLINE_NS)
		return -EINVAL;
	err = origin_get(e, b, o);
	if (err)
		return err;
	*depth = (o->parent ? o->parent->depth : 0) + 1;
	if (*depth > e->cfg.max_depth) {
		origin_put(o);
		return -ELOOP;
	}
	return 0;
}

/* Fill in what the batch adds to a new record before it is inserted: its
 * place in the cancel tree and its deadline. */
static void rec_link(struct record *rec, const struct fanout_batch *b,
		     const struct origin *o)
{
	if (o->parent) {
		rec->parent_id = o->parent->id;
		rec->parent_engine = o->parent->e->serial;
		/* relaxed: ordered before our re-check by its seq_cst fence
		 * (recheck); see "Tree" in tree.c. */
		atomic_store_explicit(&o->parent->has_kids, true,
				      memory_order_relaxed);
	}
	if (b->deadline_ns)
		rec->deadline = rec->dispatched_ns + b->deadline_ns;
}

/* Take a max_async slot ("Admission" above); false: max_async are running.
 * The caller undoes the increment, taken or not, if it turns back. */
static bool async_admit(struct fanout_engine *e)
{
	/* relaxed: the count's own order is all the bound needs. */
	uint32_t s = atomic_fetch_add_explicit(&e->async_started, 1,
					       memory_order_relaxed);
	/* relaxed: any limit read is a valid bound (see above). */
	uint32_t lim =
		atomic_load_explicit(&e->async_limit, memory_order_relaxed);

	if ((int32_t)(s - lim) < 0)
		return true;
	/* acquire: pairs with the release increment in finalise, so a
	 * consumer that took an event and dispatches again finds its slot
	 * free (the event's hand-over orders that increment before). */
	lim = atomic_load_explicit(&e->async_done, memory_order_acquire) +
	      e->cfg.max_async;
	/* relaxed: a hint for the next dispatches; a lower limit stored by
	 * a slower one only makes them read async_done again. */
	atomic_store_explicit(&e->async_limit, lim, memory_order_relaxed);
	return (int32_t)(s - lim) < 0;
}

unsigned fanout__async_running(struct fanout_engine *e)
{
	/* acquire: pairs with finalise's release increments, each after its
	 * delegation's increment of async_started, so the load of started
	 * below sees those: the difference is never negative.  A figure. */
	uint32_t done =
		atomic_load_explicit(&e->async_done, memory_order_acquire);

	return atomic_load_explicit(&e->async_started, memory_order_relaxed) -
	       done;
}

/* Enter a dispatch/run call: count the call and its record in `active`
 * (see "Shutdown" above). */
static int enter(struct fanout_engine *e)
{
	/* seq_cst: the store-load pair against fanout_shutdown(). */
	atomic_fetch_add_explicit(&e->active_in, 2, memory_order_seq_cst);
	if (atomic_load_explicit(&e->shutting, memory_order_seq_cst)) {
		fanout__active_put(e, 2);
		return -ESHUTDOWN;
	}
	return 0;
}

/* The engine's deadline timer, for a call that entered (so shutdown has
 * not stopped the timer yet and will stop it after this call). */
static int start_timer(struct fanout_engine *e)
{
	int err = fanout__timer_start(e);

	if (err)
		fanout__active_put(e, 2);
	return err;
}

/* What dispatch and run do first: check the batch, enter the engine and
 * start its timer if the batch has a deadline.  0, or the refusal (counted
 * by reject(); nothing is left held). */
static int admit(struct fanout_engine *e, const struct fanout_batch *b,
		 unsigned *depth, struct origin *o, size_t *goals)
{
	int err = check_batch(e, b, depth, o, goals);

	if (err)
		return reject(e, err);
	err = enter(e);
	if (!err && b->deadline_ns)
		err = start_timer(e);
	if (err) {
		origin_put(o);
		return reject(e, err);
	}
	return 0;
}

/*
 * After the insert: if shutdown began meanwhile, or the parent delegation
 * was interrupted, interrupt ourselves.  Either the shutdown's scan (or the
 * parent's tree walk) sees our record, or we see its flag here.
 */
static void recheck(struct fanout_engine *e, fanout_id id,
		    const struct origin *o)
{
	uint32_t how = 0, pc;
	struct record *rec;

	/* Insert; fence; load - against the store; fence; scan of
	 * fanout_shutdown(), and with a parent the fetch_or; fence; scan of
	 * fanout__tree_cancel().  The insert's seq_cst RMW of the slot's
	 * `used` word (table.c), which both scans load after their fence, is
	 * the fence for `shutting`: if our seq_cst load below misses the
	 * shutdown's store, the RMW precedes that store, hence its fence, in
	 * the single order S, and the scan sees the bit (C11 7.17.3p5).  The
	 * parent's has_kids store (rec_link) is relaxed, so a nested call
	 * still needs the seq_cst fence to pair with the tree walk's. */
	if (o->parent)
		atomic_thread_fence(memory_order_seq_cst);
	if (atomic_load_explicit(&e->shutting, memory_order_seq_cst))
		how = FANOUT_CANCEL_INTERRUPT | FANOUT_CANCEL_ABANDON |
		      CANCEL_SHUTDOWN;
	if (o->parent) {
		/* relaxed: after the fence above (see there). */
		pc = atomic_load_explicit(&o->parent->cancel,
					  memory_order_relaxed);
		if (pc & FANOUT_CANCEL_INTERRUPT)
			how |= (pc & CANCEL_HOW_MASK) | CANCEL_TREE;
	}
	/* "Late kids" in tree.c: the deferred child we hang from finished
	 * before our link may have been seen, so its delegation may have
	 * finished and a walk passed it: interrupt ourselves.  seq_cst:
	 * after the fence above, against the finisher's seq_cst CAS
	 * (pending.c, try_finish); a clear bit means that CAS, hence every
	 * walk that finds the parent finished (and fences, tree.c), comes
	 * after our fence in S, so the walk sees our link. */
	if (o->pend &&
	    (atomic_load_explicit(&o->pend->state, memory_order_seq_cst) &
	     PEND_DONE))
		how |= FANOUT_CANCEL_INTERRUPT | FANOUT_CANCEL_ABANDON |
		       CANCEL_TREE;
	if (!how)
		return;
	fanout__read_lock();
	rec = fanout__table_find(e, id);
	if (rec)
		fanout__cancel_rec(rec, how);
	fanout__read_unlock();
}

/* fanout_dispatch(); with @inline_next, a -EBUSY is no refusal (neither
 * counted nor probed): fanout_delegate() runs the batch inline instead. */
static int dispatch(struct fanout_engine *e, const struct fanout_batch *b,
		    fanout_id *idp, bool inline_next)
{
	struct fanout_sink *s;
	struct record *rec;
	unsigned depth, want, got, now;
	struct origin o;
	size_t goals;
	fanout_id id;
	int err;

	if (!e || !b)
		return e ? reject(e, -EINVAL) : -EINVAL;
	if (fanout__inherited(e->fork_gen))
		return -EOWNERDEAD; /* fork.c; not counted: nothing changes */
	if (b->sink && b->sink->e != e)
		return reject(e, -EINVAL);
	/* The queue's lines this call will write or read, which workers
	 * touched since: fetched from here on, they arrive during
	 * check_batch() instead of one by one (fq.h).  The engine's
	 * admission line is the dispatchers' own ("Admission"). */
	fq_prefetch_submit(e->q);
	err = admit(e, b, &depth, &o, &goals);
	if (err)
		return err;
	/* Back-pressure: a place on the sink until the event is taken. */
	s = b->sink ? b->sink : e->default_sink;
	if (!fanout__sink_hold(s)) {
		err = -EBUSY;
		goto out_active;
	}
	/* Admission: one max_async slot per batch ("Admission" above). */
	if (!async_admit(e)) {
		err = -EBUSY;
		goto out_async;
	}
	want = b->ntasks < e->max_tokens ? b->ntasks : e->max_tokens;
	got = fq_reserve(e->q, want, 1);
	if (!got) {
		err = -EBUSY;
		goto out_async;
	}
	rec = fanout__rec_alloc(e, b, depth, true, got, goals);
	if (!rec) {
		err = -ENOMEM;
		goto out_credits;
	}
	rec->sink = s;
	atomic_init(&rec->refs, 2 + got);
	rec->chunk = fanout__chunk_for(b->ntasks, got);
	now = got;
	/* On demand: one runner now, the others once the batch proves slow
	 * (join.c, "Runners on demand"); their credits and references are
	 * taken with the first's.  Set before the record is reachable. */
	if ((e->cfg.flags & FANOUT_RUNNERS_ON_DEMAND) && got > 1) {
		atomic_store_explicit(&rec->held, got - 1,
				      memory_order_relaxed);
		now = 1;
	}
	id = rec->id;
	/* The caller's id is written before anything is visible to a worker:
	 * a child that reads the caller's variable sees the id (the ring's
	 * handoff in fq_submit is the release that publishes this store). */
	if (idp)
		*idp = id;
	fanout__tstat_add(e, TSTAT_DISPATCHED, 1);
	rec_link(rec, b, &o);
	fanout__table_insert(e, rec); /* no read lock: see table.c */
	if (rec->deadline)
		fanout__timer_add(e, rec);
	FANOUT_PROBE_BATCH_SUBMIT(id, b->ntasks, depth);
	/* relaxed: a hint for the waiter's patience (sink.c), written once
	 * the dispatch is accepted, on the line its hold wrote. */
	atomic_store_explicit(&s->last_ntasks, b->ntasks, memory_order_relaxed);
	fq_submit(e->q, &rec->work, now); /* rec may be gone after this */
	recheck(e, id, &o);
	origin_put(&o);
	fanout__active_put(e, 1); /* the call's unit; the record keeps one */
	return 0;

out_credits:
	fq_unreserve(e->q, got);
out_async:
	/* relaxed: undoing our own increment publishes nothing. */
	atomic_fetch_sub_explicit(&e->async_started, 1, memory_order_relaxed);
	fanout__sink_unhold(s);
out_active:
	fanout__active_put(e, 2);
	origin_put(&o);
	return inline_next && err == -EBUSY ? err : reject(e, err);
}

int fanout_dispatch(struct fanout_engine *e, const struct fanout_batch *b,
		    fanout_id *idp)
{
	return dispatch(e, b, idp, false);
}

/*
 * Work-first help for a fanout_run caller about to run its own batch:
 * @extra tokens (record references already counted) for other runners.
 * While a worker spins, they are OFFERED (fq.c, argument 7): no wake-up,
 * no ring credit, and a spinner joins only once the batch has run for
 * FQ_OFFER_HOLD_NS, so a small batch is run by the caller alone and no
 * line of it crosses cores.  With no spinner, or no free offer slot, they
 * go into the ring as before (which wakes parked workers: an idle engine
 * pays that wake-up so that long children still run in parallel).  Tokens
 * that get neither are dropped here.  Returns the offer slot to close
 * after the caller's own run, or -1.
 */
static int help_offer(struct record *rec, unsigned extra)
{
	struct fanout_engine *e = rec->e;
	unsigned n = extra, got;
	int slot;

	if (!extra)
		return -1;
	/* The dispatch's tick (0 if its stamp read the clock): the offer's
	 * age starts there, a few hundred ns early at most. */
	slot = fq_offer_open(e->q, &rec->work, extra, rec->start_tick);
	if (slot >= 0) {
		if (fq_spinners(e->q)) {
			fq_offer_kick(e->q, extra);
			return slot;
		}
		n = fq_offer_close(e->q, slot); /* nobody may look */
	}
	got = n ? fq_reserve(e->q, n, 0) : 0;
	fq_submit(e->q, &rec->work, got);
	if (n > got)
		fanout__rec_put(rec, n - got); /* the event's keeps it */
	return -1;
}

int fanout_run(struct fanout_engine *e, const struct fanout_batch *b,
	       struct fanout_event **evp)
{
	struct record *rec;
	unsigned depth, want, extra;
	struct origin o;
	size_t goals;
	int err, slot;
	bool local;

	if (!e || !b || !evp)
		return e ? reject(e, -EINVAL) : -EINVAL;
	if (fanout__inherited(e->fork_gen))
		return -EOWNERDEAD; /* fork.c; not counted: nothing changes */
	err = admit(e, b, &depth, &o, &goals);
	if (err)
		return err;
	/* The caller is one runner; idle workers may add up to max_children
	 * in all (see help_offer). */
	want = b->ntasks < e->cfg.max_children ? b->ntasks :
						 e->cfg.max_children;
	want = want > e->max_tokens ? e->max_tokens : want;
	extra = want - 1;
	rec = fanout__rec_alloc(e, b, depth, false, want, goals);
	if (!rec) {
		fanout__active_put(e, 2);
		origin_put(&o);
		return reject(e, -ENOMEM);
	}
	/* refs: table + event (returned to the caller, so it keeps the record
	 * for the whole call: the caller's own run holds none) + the tokens
	 * help_offer may hand out (it drops those it does not). */
	atomic_init(&rec->refs, 2 + extra);
	rec->chunk = fanout__chunk_for(b->ntasks, want);
	/* The caller's first chunk is claimed before anyone can see the
	 * record, so its own run starts without a claim RMW (join.c,
	 * "Claim"). */
	atomic_init(&rec->claim, fanout__first_chunk(rec));
	fanout__tstat_add(e, TSTAT_RUNS, 1);
	rec_link(rec, b, &o);
	fanout__table_insert(e, rec); /* no read lock: see table.c */
	if (rec->deadline)
		fanout__timer_add(e, rec);
	recheck(e, rec->id, &o);
	/* The parent is not needed past the re-check, and a pin on its
	 * engine held across the run would make a child of this run that
	 * shuts that engine down wait for itself. */
	origin_put(&o);
	FANOUT_PROBE_BATCH_SUBMIT(rec->id, b->ntasks, depth);
	slot = help_offer(rec, extra);
	local = fanout__run_own(rec);
	if (slot >= 0) {
		extra = fq_offer_close(e->q, slot);
		if (extra)
			fanout__rec_put(rec, extra); /* the event's keeps it */
	}
	if (!local) /* another runner (or a canceller) finalises */
		fq_done_wait(&rec->done_word, fq_spin_ns(e->q));
	/* The call's unit and its record's: finalise leaves a synchronous
	 * record's to us, its last touch being the wake-up we just had. */
	fanout__active_put(e, 2);
	*evp = &rec->ev;
	return 0;
}

int fanout_delegate(struct fanout_engine *e, const struct fanout_batch *b,
		    fanout_id *idp, struct fanout_event **evp)
{
	int err;

	if (!e || !b || !evp)
		return e ? reject(e, -EINVAL) : -EINVAL;
	/* *evp is written only once the call is accepted: a refusal (fork,
	 * bad batch, shutdown) leaves it as the caller had it. */
	if (!fanout__current()) {
		/* idp goes straight in: dispatch writes it before any child
		 * can run, and not at all when it refuses. */
		err = dispatch(e, b, idp, true);
		if (!err) {
			*evp = NULL;
			return FANOUT_BACKGROUND;
		}
		if (err != -EBUSY)
			return err;
		/* The -EBUSY is answered inline, so dispatch() neither
		 * counted nor probed it as a rejection: what happens next
		 * (a run, or the run's own refusal) is what counts. */
		err = fanout_run(e, b, evp);
		if (err)
			return err;
		if (idp)
			*idp = (*evp)->id;
		return FANOUT_INLINE_FULL;
	}
	err = fanout_run(e, b, evp);
	if (err)
		return err;
	if (idp)
		*idp = (*evp)->id;
	return FANOUT_INLINE;
}

int fanout_cancel(struct fanout_engine *e, fanout_id id, unsigned how)
{
	struct record *rec;
	int err;

	if (!e || !id || !how || (how & ~CANCEL_HOW_MASK) ||
	    ((how & FANOUT_CANCEL_ABANDON) && !(how & FANOUT_CANCEL_INTERRUPT)))
		return -EINVAL;
	if (fanout__inherited(e->fork_gen))
		return -EOWNERDEAD;
	fanout__read_lock();
	rec = fanout__table_find(e, id);
	err = rec ? fanout__cancel_rec(rec, how | CANCEL_USER) :
	      fanout__table_finished(e, id) ? -EALREADY :
					      -ENOENT;
	fanout__read_unlock();
	return err;
}
