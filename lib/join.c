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
 * load+store canceller that spin rejects.)
 *
 * Join.  `remaining` starts at ntasks.  A runner writes the result slots
 * of every chunk it owned and then, once it finds nothing left to claim,
 * subtracts how many children it finished, in one release RMW (the
 * canceller subtracts the size of its range).  The subtraction that
 * takes it to zero is the last: every slot was written before some release
 * subtraction in the counter's modification order, and the zeroing thread's
 * acquire (acq_rel) makes all of them visible.  Exactly one thread sees the
 * counter go from k to 0, so exactly one thread finalises, and exactly one
 * event is published.
 */
#include "internal.h"

#include <assert.h>
#include <errno.h>
#include <string.h>

static FQ_TLS struct fanout_child *tls_child;

struct fanout_child *fanout__current(void)
{
	return tls_child;
}

/* -------------------------------------------------------------- finalise */

static const char *code_text(int code)
{
	const char *s;

	if (code == -ECANCELED)
		return "interrupted";
	if (code > 0)
		return "child returned a positive value (reported as an error)";
	s = strerrordesc_np(-code);
	return s ? s : "child failed with an unknown error";
}

static void finalise(struct record *rec)
{
	struct fanout_engine *e = rec->e;
	struct fanout_event *ev = &rec->ev;
	/* One RMW both reads the cancel bits and closes the door: a cancel
	 * whose own fetch_or finds CANCEL_FINAL returns -EALREADY, so the
	 * event's `cancelled` is true exactly when fanout_cancel returned 0
	 * (test_cancel's cancel_races_completion).  acq_rel: pairs with the
	 * canceller's fetch_or. */
	uint32_t cancel = atomic_fetch_or_explicit(&rec->cancel, CANCEL_FINAL,
						   memory_order_acq_rel) &
			  ~CANCEL_FINAL;
	unsigned i, nc = 0, ne = 0, ni = 0;
	double cost = 0;

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
	ev->id = rec->id;
	ev->context = rec->context;
	ev->session_key = rec->session_key;
	ev->user = rec->user;
	ev->nresults = rec->ntasks;
	ev->results = rec->results;
	ev->dispatched_ns = rec->dispatched_ns;
	ev->completed_ns = fq_now_ns();
	ev->cost = cost;
	ev->ncompleted = nc;
	ev->nerror = ne;
	ev->ninterrupted = ni;
	ev->cancelled = cancel != 0;
	if (nc) {
		ev->status = FANOUT_COMPLETED;
		ev->error = NULL;
	} else if (ni == rec->ntasks) {
		ev->status = FANOUT_INTERRUPTED;
		ev->error = cancel & CANCEL_SHUTDOWN ? "engine shut down" :
			    cancel		     ? "cancelled" :
				     "every child was interrupted";
	} else {
		ev->status = FANOUT_ERROR;
		ev->error = "no child completed";
	}
	/* relaxed: finish_seq needs only the RMW's total order (it is read by
	 * other finalisers through the kept[] CAS, acq_rel).  release on
	 * st_completed: pairs with the acquire load in fanout_stats(), which
	 * then sees this delegation's st_dispatched/st_runs increment (made
	 * before the ring handoff) - snapshots never show completed > started. */
	rec->finish_seq = atomic_fetch_add_explicit(&e->finish_seq, 1,
						    memory_order_relaxed);
	atomic_fetch_add_explicit(&e->st_completed, 1, memory_order_release);

	/* `state` turns FINISHED exactly when the event can be had, seen from
	 * both sides: a lookup that reads FINISHED finds the event in the
	 * sink (so the store comes after the enqueue), and a consumer that
	 * took the event sees FINISHED in lookup (so the consumer stores it
	 * too, in the sink's take(); both are release stores after ev was
	 * written).  A synchronous caller is woken only after the store. */
	fanout__read_lock(); /* publish and pruning run under the read lock */
	if (rec->background) {
		struct fanout_sink *s = rec->sink;

		/* Give the capacity slot back before the event can be seen.
		 * release: pairs with the acquire fetch_add in dispatch. */
		atomic_fetch_sub_explicit(&e->async_running, 1,
					  memory_order_release);
		fanout__sink_publish(s, rec);
		atomic_store_explicit(&rec->state, REC_FINISHED,
				      memory_order_release);
	} else {
		atomic_store_explicit(&rec->state, REC_FINISHED,
				      memory_order_release);
		fq_done_signal(&rec->done_word);
	}
	fanout__table_retire(e, rec);
	fanout__read_unlock();
	fanout__active_put(e, 1);
}

/* ----------------------------------------------------------------- run */

/* Report child i as never started (the delegation was cancelled). */
static void skip_child(struct record *rec, unsigned i)
{
	struct fanout_result *r = &rec->results[i];

	r->index = i;
	r->goal = rec->tasks[i].goal;
	r->status = FANOUT_INTERRUPTED;
	r->summary = NULL;
	r->error = "cancelled before it started";
	r->duration_ns = 0;
	r->cost = 0;
	r->code = -ECANCELED; /* owned[i] stays 0 (rec_alloc) */
}

/* Run child i.  *clock is the time it starts; on return, the time it ended
 * (which is when the next child of the same chunk starts). */
static void run_child(struct record *rec, unsigned i, uint64_t *clock)
{
	struct task_slot *t = &rec->tasks[i];
	struct fanout_result *r = &rec->results[i];
	struct fanout_child c = {.rec = rec, .index = i, .res = r};
	struct fanout_child *prev = tls_child;
	uint64_t t1;
	int rc;

	r->index = i;
	r->goal = t->goal;
	r->summary = NULL;
	r->error = NULL;
	r->cost = 0;
	/* owned[i] is 0 from rec_alloc; it is written only when a string is
	 * set, so neighbouring runners do not bounce its line. */
	tls_child = &c;
	rc = t->fn(&c, t->arg);
	tls_child = prev;
	t1 = fq_cycles();
	r->duration_ns = fq_cycles_to_ns(t1 - *clock);
	*clock = t1;
	r->code = rc;
	if (rc == 0) {
		r->status = FANOUT_COMPLETED;
		/* An error string set, then completed anyway: drop it. */
		if (rec->owned[i] & OWN_ERROR) {
			fanout__str_free(r->error);
			rec->owned[i] = 0;
		}
		r->error = NULL;
	} else {
		r->status =
			rc == -ECANCELED ? FANOUT_INTERRUPTED : FANOUT_ERROR;
		if (!r->error)
			r->error = code_text(rc);
	}
	if (r->cost != 0) {
		uint64_t old = atomic_load_explicit(&rec->cost_bits,
						    memory_order_relaxed);
		/* relaxed: a running sum for lookup only; the event's cost is
		 * recomputed from the slots after the join's acquire. */
		while (!atomic_compare_exchange_weak_explicit(
			&rec->cost_bits, &old,
			fanout__double_to_bits(fanout__bits_to_double(old) +
					       r->cost),
			memory_order_relaxed, memory_order_relaxed))
			;
	}
}

/* Run the claimed chunk [i, end): children not started when a cancel
 * arrives are reported interrupted instead (they are still ours).  *done
 * counts the runner's finished children (its progress slot shows it);
 * *cycles (if not NULL) receives the chunk's duration in fq_cycles ticks;
 * returns how many of them ran. */
static unsigned run_chunk(struct record *rec, struct progress_slot *prog,
			  unsigned i, unsigned end, unsigned *done,
			  uint64_t *cycles)
{
	uint64_t clock = fq_cycles(), start = clock;
	unsigned j, ran = 0;

	for (j = i; j < end; j++) {
		/* relaxed: whether to start is a hint-level decision; the
		 * child's outcome is published by the join below. */
		if (atomic_load_explicit(&rec->cancel, memory_order_relaxed) &
		    FANOUT_CANCEL_PENDING)
			skip_child(rec, j);
		else {
			run_child(rec, j, &clock);
			ran++;
		}
		/* relaxed: a progress figure for lookup, nothing read through
		 * it; only this runner writes its slot.  A helping consumer
		 * has none (its chunk counts once it is subtracted). */
		++*done;
		if (prog)
			atomic_store_explicit(&prog->n, *done,
					      memory_order_relaxed);
	}
	if (cycles)
		*cycles = clock - start;
	return ran;
}

/* A runner is through: count what it ran and hand its @done children to
 * the join counter in ONE subtraction; the one that takes it to zero
 * finalises.  @prog: its progress slot, or NULL. */
static void runner_done(struct record *rec, struct progress_slot *prog,
			unsigned ran, unsigned done)
{
	struct fanout_engine *e = rec->e;
	int self;

	if (!done)
		return;
	if (ran != done) /* relaxed: a statistic */
		atomic_fetch_add_explicit(&e->st_skipped, done - ran,
					  memory_order_relaxed);
	self = fq_self(e->q);
	if (self >= 0) {
		_Atomic uint64_t *cnt = &e->st_worker_children[self];
		/* W: only this worker writes its slot. */
		atomic_store_explicit(
			cnt,
			atomic_load_explicit(cnt, memory_order_relaxed) + ran,
			memory_order_relaxed);
	} else { /* relaxed: a statistic */
		atomic_fetch_add_explicit(&e->st_helper_children, ran,
					  memory_order_relaxed);
	}
	/* Hand the progress over to `remaining`: clearing first means a
	 * concurrent lookup may lag for an instant, never count a child
	 * twice.  relaxed: as above. */
	if (prog)
		atomic_store_explicit(&prog->n, 0, memory_order_relaxed);
	/* acq_rel: release publishes our result slots; the acquire makes the
	 * zeroing thread see every other runner's (the join argument above). */
	if (atomic_fetch_sub_explicit(&rec->remaining, done,
				      memory_order_acq_rel) == done) {
		/* Every child has run: a worker that is not itself inside a
		 * child only has library code left. */
		if (!tls_child)
			fq_tail(e->q);
		finalise(rec);
	}
}

/*
 * Adaptive chunks.  A runner starts with rec->chunk children per claim
 * (about 8 claims per runner, see fanout__chunk_for) and doubles its chunk after
 * each chunk that took less than CHUNK_GROW_NS, up to an even share of
 * what is left; after a slower chunk it goes back to rec->chunk.  Cheap
 * children then cost a few claims per runner instead of a cross-core
 * transfer of `claim` every few children, while a runner holds at most
 * about 2 x CHUNK_GROW_NS of claimed-but-unstarted children like the ones
 * it just ran, so an idle runner is not left waiting behind it (chunks
 * sized by count alone would let one runner sit on half a batch of slow
 * children).  The clock reads are the per-child ones run_chunk makes
 * anyway.  A/B on 2 workers, no-op children, one batch in flight: batch
 * 64 p50 8.1-8.6 -> 7.1-7.3 us per batch.
 */
#define CHUNK_GROW_NS 2000

static uint32_t next_chunk(const struct record *rec, uint32_t chunk,
			   uint32_t end, uint64_t cycles)
{
	uint32_t share = (rec->ntasks - end) / rec->nrunners;
	uint32_t cap = share > rec->chunk ? share : rec->chunk;

	if (fq_cycles_to_ns(cycles) >= CHUNK_GROW_NS)
		return rec->chunk; /* slow children: back to the minimum */
	chunk *= 2;
	return chunk < cap ? chunk : cap;
}

/* The fq_work function: one ring token (or the fanout_run caller).  The
 * runner takes chunks until none is left, then hands everything it
 * finished to the join counter in ONE subtraction, so `remaining` is
 * touched once per runner, not once per chunk. */
void fanout__run_token(struct fq_work *w)
{
	struct record *rec = caa_container_of(w, struct record, work);
	uint32_t n = rec->ntasks, chunk = rec->chunk;
	/* relaxed: a distinct index is all we need (RMW total order); there
	 * are exactly nrunners runners, so it stays in range. */
	uint32_t slot = atomic_fetch_add_explicit(&rec->runner_next, 1,
						  memory_order_relaxed);
	struct progress_slot *prog = &rec->progress[slot];
	unsigned done = 0, ran = 0;
	uint64_t cycles;
	uint32_t end;

	assert(slot < rec->nrunners);
	for (;;) {
		uint32_t i;

		/* relaxed: a hint only; the claim below decides. */
		if (atomic_load_explicit(&rec->cancel, memory_order_relaxed) &
		    FANOUT_CANCEL_PENDING)
			break;
		/* relaxed: ownership comes from the RMW's total order on
		 * `claim`; the task slots were published by the ring handoff
		 * (or are the caller's own writes). */
		i = atomic_fetch_add_explicit(&rec->claim, chunk,
					      memory_order_relaxed);
		if (i >= n)
			break;
		end = n - i < chunk ? n : i + chunk;
		ran += run_chunk(rec, prog, i, end, &done, &cycles);
		chunk = next_chunk(rec, chunk, end, cycles);
	}
	runner_done(rec, prog, ran, done);
	fanout__rec_put(rec, 1);
}

/*
 * One step of a helping fanout_wait (FANOUT_WAIT_HELPS): take a token and
 * run ONE chunk of its record on this thread.  If children are left to
 * claim, the token goes back into the ring for another runner, so a
 * consumer is never captured by a whole delegation: its own sink is looked
 * at again after at most one chunk.  The token is put back BEFORE this
 * chunk counts in the join, so the record cannot finish (and the engine
 * cannot stop its queue) under that submit; we hold a reference of our
 * own meanwhile, since the token's travels with it.  The helper takes no
 * progress slot: lookup counts its chunk once it is subtracted.
 * Returns false when there was no token to take.
 */
bool fanout__help_step(struct fanout_engine *e)
{
	struct fq_work *w = fq_help_take(e->q);
	struct record *rec;
	uint32_t n, chunk, i;
	unsigned done = 0, ran;

	if (!w)
		return false;
	rec = caa_container_of(w, struct record, work);
	n = rec->ntasks;
	chunk = rec->chunk;
	/* relaxed: as in run_token; the claim decides. */
	if (atomic_load_explicit(&rec->cancel, memory_order_relaxed) &
	    FANOUT_CANCEL_PENDING) {
		fanout__rec_put(rec, 1);
		return true;
	}
	i = atomic_fetch_add_explicit(&rec->claim, chunk, memory_order_relaxed);
	if (i >= n) {
		fanout__rec_put(rec, 1);
		return true;
	}
	ran = run_chunk(rec, NULL, i, n - i < chunk ? n : i + chunk, &done,
			NULL);
	if (n - i > chunk) {
		/* relaxed: we hold the token's reference while taking ours. */
		atomic_fetch_add_explicit(&rec->refs, 1, memory_order_relaxed);
		if (fq_reserve(e->q, 1, 1))
			fq_submit(e->q, w, 1);
		else
			fanout__run_token(
				w); /* no room in the ring: run the rest */
	}
	runner_done(rec, NULL, ran, done);
	fanout__rec_put(rec, 1); /* ours, or the token's if it is used up */
	return true;
}

/* Claim every unstarted child for the canceller; see "Claim" above.
 * Returns how many it took; the caller is inside an RCU read section. */
static unsigned claim_rest(struct record *rec)
{
	uint32_t n = rec->ntasks, old, i;

	old = atomic_exchange_explicit(&rec->claim, n, memory_order_relaxed);
	if (old >= n)
		return 0;
	for (i = old; i < n; i++)
		skip_child(rec, i);
	/* relaxed: a statistic */
	atomic_fetch_add_explicit(&rec->e->st_skipped, n - old,
				  memory_order_relaxed);
	/* acq_rel: as in run_child, for the whole range at once. */
	if (atomic_fetch_sub_explicit(&rec->remaining, n - old,
				      memory_order_acq_rel) == n - old)
		finalise(rec);
	return n - old;
}

int fanout__cancel_rec(struct record *rec, unsigned how)
{
	uint32_t bits =
		how & FANOUT_CANCEL_INTERRUPT ?
			FANOUT_CANCEL_PENDING | FANOUT_CANCEL_INTERRUPT :
			FANOUT_CANCEL_PENDING;
	uint32_t old;

	bits |= how & CANCEL_SHUTDOWN;
	/* acquire: pairs with the join's last decrement; 0 remaining means
	 * every child is done and the event is (being) published. */
	if (atomic_load_explicit(&rec->remaining, memory_order_acquire) == 0)
		return -EALREADY;
	/* acq_rel: a child that sees the bit in fanout_interrupted() sees
	 * everything the canceller did before; pairs with the finaliser's
	 * fetch_or of CANCEL_FINAL, whichever comes first decides. */
	old = atomic_fetch_or_explicit(&rec->cancel, bits,
				       memory_order_acq_rel);
	if (old & CANCEL_FINAL)
		return -EALREADY; /* the finaliser already read the bits */
	if (!old)		  /* relaxed: a statistic */
		atomic_fetch_add_explicit(&rec->e->st_cancelled, 1,
					  memory_order_relaxed);
	claim_rest(rec);
	return 0;
}
