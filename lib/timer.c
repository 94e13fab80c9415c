/* SPDX-License-Identifier: MIT */
/*
 * timer.c - deadlines: one timer thread per engine, started on the first
 * delegation that has a deadline.
 *
 * WHY IT IS CORRECT
 *
 * Handoff.  A dispatch with a deadline takes a record reference and pushes
 * the record onto `inbox` (a Treiber stack, CAS; only the timer thread
 * empties it, with one exchange, so there is no ABA).  The timer thread
 * copies {deadline, id} into its private min-heap and drops the reference.
 * The pusher wakes the timer when its deadline is the earliest, or every
 * TIMER_BATCH pushes: a record is pinned (its block kept, even after its
 * event was freed) until the timer next wakes - at most TIMER_BATCH
 * deadline dispatches later, or at the earliest deadline in the heap,
 * whichever comes first: not until its own deadline, but up to an earlier
 * one's when few dispatches follow.  The wake-up costs one futex call per
 * TIMER_BATCH dispatches, and a record that finishes early leaves only 16
 * bytes in the heap once taken.
 *
 * Firing.  When an entry is due, the timer looks the id up in the table
 * under the RCU read lock and interrupts the record with
 * INTERRUPT | ABANDON | CANCEL_TIMEDOUT.  A record that finished (or was
 * pruned) meanwhile is not found or answers -EALREADY: firing late is
 * harmless, and there is nothing to take out of the heap when a record
 * finishes early.  The heap is compacted (entries of records no longer
 * running dropped) when it holds more than twice the live deadlines plus
 * TIMER_SLACK, so it stays proportional to what runs.
 *
 * Sleeping.  The thread announces itself on the eventcount (prepare),
 * stores the time it will sleep until in `next_ns` (seq_cst), re-checks
 * the inbox (seq_cst) and sleeps; a pusher pushes (seq_cst) and then
 * reads `next_ns` (seq_cst), signalling when its deadline is earlier.
 * Store-buffering with seq_cst on both sides: either the thread sees the
 * push before sleeping, or the pusher sees the new `next_ns` and wakes it
 * (the eventcount makes a signal after prepare end the sleep).
 *
 * Stop.  fanout_shutdown stops the thread after every record finished:
 * set `stop`, signal, join.  Records still in the inbox are put.
 */
#include "internal.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>

#define TIMER_SLACK 1024u
/* Pushes after which the pusher wakes the timer to take them, so a record
 * is pinned by the inbox for at most this many deadline dispatches. */
#define TIMER_BATCH 64u

enum { TIMER_OFF = 0, TIMER_STARTING = 1, TIMER_ON = 2 };

struct deadline {
	uint64_t when;
	fanout_id id;
};

/* Legend as in internal.h, plus T: touched only by the timer thread. */
struct fanout_timer {
	struct fanout_engine *e;	/* I */
	pthread_t thread;		/* I */
	_Atomic(struct record *) inbox; /* A */
	_Atomic uint64_t next_ns;	/* A: UINT64_MAX = for ever */
	_Atomic bool stop;		/* A */
	_Atomic uint32_t live;		/* A: records with deadlines */
	_Atomic uint32_t inbox_n;	/* A: pushed, not taken yet */
	struct fq_ec ec;		/* A */
	struct deadline *heap;		/* T: timer thread only */
	size_t n, cap;			/* T */
};

static void heap_up(struct deadline *h, size_t i)
{
	while (i) {
		size_t p = (i - 1) / 2;
		struct deadline t;

		if (h[p].when <= h[i].when)
			return;
		t = h[p];
		h[p] = h[i];
		h[i] = t;
		i = p;
	}
}

static void heap_down(struct deadline *h, size_t n, size_t i)
{
	for (;;) {
		size_t l = 2 * i + 1, r = l + 1, m = i;
		struct deadline t;

		if (l < n && h[l].when < h[m].when)
			m = l;
		if (r < n && h[r].when < h[m].when)
			m = r;
		if (m == i)
			return;
		t = h[m];
		h[m] = h[i];
		h[i] = t;
		i = m;
	}
}

/* Room for one more entry; false when memory runs out (the entry is then
 * served by the next compaction or dropped, see take_inbox). */
static bool heap_room(struct fanout_timer *t)
{
	size_t cap;
	struct deadline *h;

	if (t->n < t->cap)
		return true;
	cap = t->cap ? 2 * t->cap : 256;
	h = fanout__alloc(cap * sizeof(*h));
	if (!h)
		return false;
	if (t->n)
		memcpy(h, t->heap, t->n * sizeof(*h));
	if (t->heap)
		fanout__free(t->heap, t->cap * sizeof(*h));
	t->heap = h;
	t->cap = cap;
	return true;
}

static bool still_running(struct fanout_engine *e, fanout_id id)
{
	struct record *rec;
	bool run;

	fanout__read_lock();
	rec = fanout__table_find(e, id);
	/* relaxed: a hint; a record finishing meanwhile is harmless. */
	run = rec &&
	      atomic_load_explicit(&rec->remaining, memory_order_relaxed) != 0;
	fanout__read_unlock();
	return run;
}

/* Drop the entries of records that are not running any more. */
static void compact(struct fanout_timer *t)
{
	size_t i, k = 0;

	for (i = 0; i < t->n; i++)
		if (still_running(t->e, t->heap[i].id))
			t->heap[k++] = t->heap[i];
	t->n = k;
	for (i = k / 2; i-- > 0;)
		heap_down(t->heap, t->n, i);
}

static void take_inbox(struct fanout_timer *t)
{
	/* acquire (seq_cst includes it): pairs with the pushers' seq_cst
	 * CAS, the release of their records (deadline and id written
	 * before). */
	struct record *rec =
		atomic_exchange_explicit(&t->inbox, NULL, memory_order_seq_cst);
	uint32_t taken = 0;

	for (struct record *r = rec; r; r = r->dl_next)
		taken++;
	/* relaxed: a wake-up heuristic (see "Handoff"). */
	atomic_fetch_sub_explicit(&t->inbox_n, taken, memory_order_relaxed);
	while (rec) {
		struct record *next = rec->dl_next;

		if (!heap_room(t)) {
			compact(t);
			if (!heap_room(t)) {
				/* Out of memory: fire now rather than never. */
				fanout__read_lock();
				fanout__cancel_rec(
					rec, FANOUT_CANCEL_INTERRUPT |
						     FANOUT_CANCEL_ABANDON |
						     CANCEL_TIMEDOUT);
				fanout__read_unlock();
				fanout__rec_put(rec, 1);
				rec = next;
				continue;
			}
		}
		t->heap[t->n].when = rec->deadline;
		t->heap[t->n].id = rec->id;
		heap_up(t->heap, t->n++);
		fanout__rec_put(rec, 1);
		rec = next;
	}
}

static void fire(struct fanout_timer *t, fanout_id id)
{
	struct record *rec;

	fanout__read_lock();
	rec = fanout__table_find(t->e, id);
	if (rec)
		fanout__cancel_rec(rec, FANOUT_CANCEL_INTERRUPT |
						FANOUT_CANCEL_ABANDON |
						CANCEL_TIMEDOUT);
	fanout__read_unlock();
}

static void *timer_main(void *arg)
{
	struct fanout_timer *t = arg;

	for (;;) {
		uint32_t v = fq_ec_prepare(&t->ec);
		uint64_t now, next;

		take_inbox(t);
		now = fq_now_ns();
		while (t->n && t->heap[0].when <= now) {
			fanout_id id = t->heap[0].id;

			t->heap[0] = t->heap[--t->n];
			heap_down(t->heap, t->n, 0);
			fire(t, id);
		}
		/* relaxed: a sizing hint. */
		if (t->n > 2 * (size_t)atomic_load_explicit(
				       &t->live, memory_order_relaxed) +
				   TIMER_SLACK)
			compact(t);
		/* acquire: pairs with fanout__timer_stop's store. */
		if (atomic_load_explicit(&t->stop, memory_order_acquire)) {
			fq_ec_done(&t->ec);
			break;
		}
		next = t->n ? t->heap[0].when : 0;
		/* seq_cst: the "Sleeping" pair (store next_ns; load inbox). */
		atomic_store_explicit(&t->next_ns, next ? next : UINT64_MAX,
				      memory_order_seq_cst);
		if (!atomic_load_explicit(&t->inbox, memory_order_seq_cst))
			fq_ec_wait(&t->ec, v, next);
		fq_ec_done(&t->ec);
	}
	return NULL;
}

int fanout__timer_start(struct fanout_engine *e)
{
	struct fanout_timer *t;
	uint32_t st = TIMER_OFF;
	sigset_t all, old;
	pthread_attr_t attr;
	int err;

	/* acquire: pairs with the release store of TIMER_ON below. */
	if (atomic_load_explicit(&e->timer_state, memory_order_acquire) ==
	    TIMER_ON)
		return 0;
	/* acq_rel: one starter; the others wait for it (a cold path: the
	 * first deadline of the engine). */
	if (!atomic_compare_exchange_strong_explicit(
		    &e->timer_state, &st, TIMER_STARTING, memory_order_acq_rel,
		    memory_order_acquire)) {
		while (st == TIMER_STARTING) {
			fq_spin_relax(0);
			/* acquire: as above. */
			st = atomic_load_explicit(&e->timer_state,
						  memory_order_acquire);
		}
		return st == TIMER_ON ? 0 : fanout__timer_start(e);
	}
	t = fanout__alloc(sizeof(*t));
	if (!t) {
		err = -ENOMEM;
		goto out_off;
	}
	memset(t, 0, sizeof(*t));
	t->e = e;
	atomic_init(&t->inbox, NULL);
	atomic_init(&t->next_ns, UINT64_MAX);
	atomic_init(&t->stop, false);
	atomic_init(&t->live, 0);
	atomic_init(&t->inbox_n, 0);
	fq_ec_init(&t->ec);
	/* The thread takes no signals of the application's, and neither the
	 * CPUs nor the scheduling policy of the thread that happens to make
	 * the first deadline dispatch (fq_thread_attr). */
	if (fq_thread_attr(e->q, &attr)) {
		fanout__free(t, sizeof(*t));
		err = -EAGAIN;
		goto out_off;
	}
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	err = -pthread_create(&t->thread, &attr, timer_main, t);
	if (err == -EINVAL || err == -EPERM) /* a CPU went away, or a policy
						 * we may not set: inherit */
		err = -pthread_create(&t->thread, NULL, timer_main, t);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	pthread_attr_destroy(&attr);
	if (err) {
		fanout__free(t, sizeof(*t));
		err = -EAGAIN;
		goto out_off;
	}
	pthread_setname_np(t->thread, "fanout-timer");
	e->timer = t;
	/* release: publishes e->timer to fanout__timer_add's acquire. */
	atomic_store_explicit(&e->timer_state, TIMER_ON, memory_order_release);
	return 0;

out_off:
	/* release: a waiting starter retries. */
	atomic_store_explicit(&e->timer_state, TIMER_OFF, memory_order_release);
	return err;
}

/* Hand @rec (inserted, alive: the caller's call holds it) to the timer. */
void fanout__timer_add(struct fanout_engine *e, struct record *rec)
{
	struct fanout_timer *t = e->timer;
	struct record *head;

	/* relaxed: we hold a reference already (the call's). */
	atomic_fetch_add_explicit(&rec->refs, 1, memory_order_relaxed);
	/* relaxed: a sizing hint for compaction. */
	atomic_fetch_add_explicit(&t->live, 1, memory_order_relaxed);
	head = atomic_load_explicit(&t->inbox, memory_order_relaxed);
	do {
		rec->dl_next = head;
		/* seq_cst: the "Sleeping" pair, and the release of the
		 * record's deadline and id to the timer thread. */
	} while (!atomic_compare_exchange_weak_explicit(&t->inbox, &head, rec,
							memory_order_seq_cst,
							memory_order_relaxed));
	/* relaxed: a wake-up heuristic (see "Handoff"). */
	if (atomic_fetch_add_explicit(&t->inbox_n, 1, memory_order_relaxed) +
			    1 ==
		    TIMER_BATCH ||
	    rec->deadline <
		    atomic_load_explicit(&t->next_ns, memory_order_seq_cst))
		fq_ec_signal(&t->ec, 1);
}

/* A record with a deadline finished (finalise): a sizing hint. */
void fanout__timer_done(struct fanout_engine *e)
{
	/* relaxed: a sizing hint; the timer exists, the record had one. */
	atomic_fetch_sub_explicit(&e->timer->live, 1, memory_order_relaxed);
}

/* Quiescent (the thread is gone): drop the inbox's record references,
 * then free the timer. */
static void timer_free(struct fanout_engine *e, struct fanout_timer *t)
{
	/* relaxed: no thread of the timer or of a dispatch runs now. */
	struct record *rec =
		atomic_exchange_explicit(&t->inbox, NULL, memory_order_relaxed);

	while (rec) {
		struct record *next = rec->dl_next;

		fanout__rec_put(rec, 1);
		rec = next;
	}
	if (t->heap)
		fanout__free(t->heap, t->cap * sizeof(*t->heap));
	fanout__free(t, sizeof(*t));
	e->timer = NULL;
	/* relaxed: the engine is quiescent (or inherited: nothing of it
	 * runs in this process). */
	atomic_store_explicit(&e->timer_state, TIMER_OFF, memory_order_relaxed);
}

/* An engine inherited across fork(): its timer thread is not in this
 * process.  Free the memory only; the records are the table's to free. */
void fanout__timer_forget(struct fanout_engine *e)
{
	/* relaxed: nothing of the engine runs in this process. */
	if (atomic_load_explicit(&e->timer_state, memory_order_relaxed) ==
	    TIMER_ON)
		timer_free(e, e->timer);
}

void fanout__timer_stop(struct fanout_engine *e)
{
	struct fanout_timer *t;

	/* acquire: pairs with the release store of TIMER_ON. */
	if (atomic_load_explicit(&e->timer_state, memory_order_acquire) !=
	    TIMER_ON)
		return;
	t = e->timer;
	/* release: pairs with the thread's acquire load of `stop`. */
	atomic_store_explicit(&t->stop, true, memory_order_release);
	fq_ec_signal(&t->ec, 1);
	pthread_join(t->thread, NULL);
	timer_free(e, t);
}
