/* SPDX-License-Identifier: MIT */
/*
 * sink.c - completion sinks: a wait-free MPSC queue of events, an
 * eventcount for fanout_wait, and an eventfd for poll/epoll loops.
 *
 * Which operations may run concurrently on ONE sink:
 *
 *                     publish  poll/wait  sink_fd  destroy
 *   publish (finaliser) yes     yes        yes      no (unpublished => -EBUSY)
 *   fanout_poll/wait    yes     -EBUSY     yes      no
 *   fanout_sink_fd      yes     yes        yes      no
 *   fanout_sink_destroy no      no         no       no
 *
 * WHY IT IS CORRECT
 *
 * Queue.  liburcu's wfcqueue: enqueue is wait-free for any number of
 * producers; dequeue needs mutual exclusion among consumers, which `busy`
 * gives (an exchange; the loser returns -EBUSY, nobody waits).  The
 * enqueue's exchange on the tail is a full barrier, so the event's fields,
 * written by the finaliser before it, are visible to the consumer that
 * dequeues the node.
 *
 * fanout_wait.  The eventcount argument of queue/fq.c: the consumer
 * announces itself (prepare), re-checks the queue, sleeps on the sequence;
 * publish enqueues (its tail exchange a full barrier), then, only if anyone
 * announced, bumps the sequence and wakes (fq_ec_signal_after_rmw).  No
 * lost wakeup.
 *
 * Back-pressure.  `untaken` counts accepted delegations whose event has
 * not been taken: dispatch adds 1 before it accepts (fanout__sink_hold,
 * refusing at max_pending with nothing else taken yet), take() subtracts 1
 * when poll/wait hands the event out.  So the records a sink can hold -
 * running, or finished and queued - never exceed max_pending, whoever
 * drains it or not (README, "Memory").  One RMW per dispatch and one per
 * take, both on the sink's own back-pressure line; the publishing worker
 * touches no count at all.
 *
 * Destroy.  The delegations that will still publish here are the untaken
 * ones not queued yet: fanout_sink_destroy() counts the queue and refuses
 * (-EBUSY) while that is fewer than `untaken`.  Both figures are stable
 * against the caller (destroy must not race dispatches to or takes from
 * this sink, so those happen before it), and the queue only grows, so a
 * count that reaches `untaken` means every publisher has at least done its
 * enqueue.  It does the rest of its publishing (signal, eventfd) inside
 * the RCU read lock, so fanout_sink_destroy() takes and frees the queued
 * events (as fanout_event_free does: their records are pruned like any
 * other's), unlinks the sink and hands it to call_rcu, whose callback
 * frees it after the grace period, when no publisher can still be inside.
 * So a consumer that took the last event may destroy the sink at once.
 * The callback's drain then finds nothing; fanout_destroy() drains its
 * sinks with plain puts, since its table evicts every record anyway.
 *
 * eventfd.  `armed` means "the eventfd is readable, or a write is on its
 * way".  Only the consumer disarms, and it reads (clears) the eventfd
 * BEFORE it stores armed = false, then fences and re-checks the queue,
 * re-arming if something is there.  A producer arms after enqueueing, with
 * a full barrier in between (the signal's seq_cst RMW), and writes only if
 * it flipped armed from false.  Cases: a producer that saw armed == true
 * before the consumer disarmed had enqueued before the consumer's re-check,
 * which therefore sees the event and re-arms; a producer that saw false
 * flips it and writes after the consumer's read, so its write is not
 * cleared.  Either way: an event waiting and no consumer inside => the fd
 * is readable.  Spurious readiness (readable, empty) is allowed; the next
 * poll that finds the sink empty clears it.  Producers skip all of this
 * until fanout_sink_fd() was first called (fd_used), which then arms the fd
 * if events already wait (same store; fence; check pairing).
 */
#include "internal.h"

#include <ck_pr.h>

#include <errno.h>
#include <sched.h>
#include <stdint.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

/* Injection point for fault tests: the k-th eventfd() fails. */
_Atomic long fanout__fail_eventfd_at;

static unsigned long ptr_hash(const void *p)
{
	uint64_t x = (uint64_t)(uintptr_t)p;

	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdull;
	x ^= x >> 33;
	return (unsigned long)x;
}

int fanout__sink_new(struct fanout_engine *e, bool is_default,
		     struct fanout_sink **out)
{
	struct fanout_sink *s = fanout__alloc(sizeof(*s));
	long at;

	if (!s)
		return -ENOMEM;
	memset(s, 0, sizeof(*s));
	/* relaxed: a test knob (fanout_testing.h); it orders nothing. */
	at = atomic_load_explicit(&fanout__fail_eventfd_at,
				  memory_order_relaxed);
	if (at > 0 && atomic_fetch_sub(&fanout__fail_eventfd_at, 1) == 1) {
		s->efd = -1;
		errno = EMFILE;
	} else {
		s->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	}
	if (s->efd < 0) {
		int err = errno == ENFILE ? -ENFILE :
			  errno == ENOMEM ? -ENOMEM :
					    -EMFILE;

		fanout__free(s, sizeof(*s));
		return err;
	}
	cds_wfcq_init(&s->head, &s->tail);
	fq_ec_init(&s->ec);
	atomic_init(&s->untaken, 0);
	atomic_init(&s->last_ntasks, 0);
	s->max_pending = e->cfg.max_pending;
	atomic_init(&s->fd_used, false);
	atomic_init(&s->armed, false);
	atomic_init(&s->busy, false);
	s->e = e;
	s->fork_gen = e->fork_gen;
	s->is_default = is_default;
	cds_lfht_node_init(&s->node);
	fanout__read_lock();
	FQ_HANDOFF_RELEASE(s);
	cds_lfht_add(e->sinks, ptr_hash(s), &s->node);
	fanout__read_unlock();
	*out = s;
	return 0;
}

static void efd_write(struct fanout_sink *s)
{
	uint64_t one = 1;
	ssize_t r;

	do
		r = write(s->efd, &one, sizeof(one));
	while (r < 0 && errno == EINTR);
	/* EAGAIN means the counter is saturated: it is readable anyway. */
}

static void efd_clear(struct fanout_sink *s)
{
	uint64_t v;
	ssize_t r;

	do
		r = read(s->efd, &v, sizeof(v));
	while (r < 0 && errno == EINTR);
}

static void arm(struct fanout_sink *s)
{
	/* seq_cst: orders the flip against the consumer's disarm. */
	if (!atomic_load_explicit(&s->armed, memory_order_seq_cst) &&
	    !atomic_exchange_explicit(&s->armed, true, memory_order_seq_cst))
		efd_write(s);
}

_Atomic unsigned fanout__publish_gap_us;

/* cds_wfcq_enqueue in its two steps with a pause between them: the state a
 * producer preempted there leaves behind (fanout_test_publish_gap()). */
static void enqueue_with_gap(struct fanout_sink *s, struct record *rec,
			     unsigned us)
{
	struct cds_wfcq_node *old;

	/* As liburcu's append: the exchange is a full barrier that publishes
	 * the node (next NULL) before it is reachable through the tail. */
	old = uatomic_xchg(&s->tail.p, &rec->qnode);
	usleep(us);
	CMM_STORE_SHARED(old->next, &rec->qnode);
}

void fanout__sink_publish(struct fanout_sink *s, struct record *rec)
{
	unsigned gap;

	/* The caller (the finaliser) holds the RCU read lock: a sink that
	 * fanout_sink_destroy() lets go once this enqueue is visible is
	 * drained and freed only after a grace period, i.e. after this
	 * publish has finished. */
	FQ_HANDOFF_RELEASE(rec);
	/* relaxed: a test knob, set while only the test calls in. */
	gap = atomic_load_explicit(&fanout__publish_gap_us,
				   memory_order_relaxed);
	if (caa_unlikely(gap))
		enqueue_with_gap(s, rec, gap);
	else
		cds_wfcq_enqueue(&s->head, &s->tail, &rec->qnode);
	/* The enqueue's tail exchange is the full barrier between the enqueue
	 * and the seq_cst reads of waiters and fd_used (liburcu: uatomic_xchg
	 * implies a full memory barrier before and after; enqueue_with_gap
	 * exchanges the same way).  Pairs with fq_ec_prepare() in fanout_wait
	 * and with the store; fence in fanout_sink_fd().  No second locked
	 * instruction: one here waited for the store that links the node to
	 * its predecessor, a line the consumer reads (+5-9% at batches 8-512,
	 * bench/PROFILE.txt phase 13). */
	fq_ec_signal_after_rmw(&s->ec, 1);
	if (atomic_load_explicit(&s->fd_used, memory_order_seq_cst))
		arm(s);
}

#define TAKE_PAUSES 64 /* busy steps before a half-linked event yields */

/* The @i-th wait for a half-linked event (see take()). */
static void half_linked_pause(unsigned i)
{
	if (i < TAKE_PAUSES)
		caa_cpu_relax();
	else
		sched_yield();
}

static struct record *take(struct fanout_sink *s)
{
	struct cds_wfcq_node *node;
	struct record *rec;

	if (cds_wfcq_empty(&s->head, &s->tail))
		return NULL;
	/* Consumers are serialised by `busy`.  A dequeue can only be held up
	 * by a producer between its tail exchange and its next-pointer store
	 * (cds_wfcq_enqueue): a few instructions, unless that producer was
	 * preempted there.  liburcu's "blocking" dequeue waits that out with
	 * 10 busy steps and then poll() for 10 ms, again and again: on a host
	 * where a store takes ~200 ns to cross cores, or where the producer
	 * is a worker preempted on this CPU by this very thread, that was a
	 * 10 ms stall ~100 times a second (bench/PROFILE.txt, phase 8).  So
	 * the non-blocking dequeue, which leaves the queue as it was when it
	 * would block, and our own wait: pause a little, then yield, so that
	 * a producer preempted on this CPU gets to finish its store. */
	for (unsigned i = 0;; i++) {
		node = __cds_wfcq_dequeue_nonblocking(&s->head, &s->tail);
		if (node != CDS_WFCQ_WOULDBLOCK)
			break;
		half_linked_pause(i);
	}
	if (!node)
		return NULL;
	rec = caa_container_of(node, struct record, qnode);
	FQ_HANDOFF_ACQUIRE(rec);
	fanout__sink_unhold(s); /* the event is taken: its place is free */
	/* release: the finaliser may not have stored FINISHED yet; a lookup
	 * after we hand the event out must see it finished (join.c, finalise). */
	atomic_store_explicit(&rec->state, REC_FINISHED, memory_order_release);
	return rec;
}

static bool enter(struct fanout_sink *s)
{
	/* acquire: pairs with the release in leave(); the previous consumer's
	 * dequeues happen before ours. */
	return !atomic_exchange_explicit(&s->busy, true, memory_order_acquire);
}

static void leave(struct fanout_sink *s)
{
	atomic_store_explicit(&s->busy, false, memory_order_release);
}

/* The sink looked empty: clear a readable eventfd, then re-check. */
static void disarm(struct fanout_sink *s)
{
	if (!atomic_load_explicit(&s->armed, memory_order_seq_cst))
		return;
	efd_clear(s);
	atomic_store_explicit(&s->armed, false, memory_order_seq_cst);
	/* seq_cst fence: store armed; fence; check queue - pairs with the
	 * producer's enqueue; seq_cst RMW; load armed. */
	atomic_thread_fence(memory_order_seq_cst);
	if (!cds_wfcq_empty(&s->head, &s->tail))
		arm(s);
}

int fanout_poll(struct fanout_sink *s, struct fanout_event **ev)
{
	struct record *rec;

	if (!s || !ev)
		return -EINVAL;
	if (fanout__inherited(s->fork_gen))
		return -EOWNERDEAD; /* see fanout.h, "Fork" */
	if (!enter(s))
		return -EBUSY;
	rec = take(s);
	if (!rec)
		disarm(s);
	leave(s);
	if (!rec)
		return -EAGAIN;
	*ev = &rec->ev;
	return 0;
}

/* Spin from @now for spin_ns, never past the caller's @deadline (0: none). */
static uint64_t spin_end(struct fq *q, uint64_t now, uint64_t deadline)
{
	uint64_t end = now + fq_spin_ns(q);

	return deadline && end > deadline ? deadline : end;
}

/*
 * fanout_wait in steps.  A waiter takes an event if there is one; else, on
 * a FANOUT_WAIT_HELPS engine at top level, runs one chunk of queued work;
 * else spins (WAIT_SPIN_CHECKS cheap emptiness checks between clock reads,
 * until spin_ns is over); else sleeps on the sink's eventcount until an
 * event is published or the deadline passes.  Each step is a function.
 */
#define WAIT_SPIN_CHECKS 64	/* emptiness checks between two clock reads */
#define WAIT_YIELD_EVERY 8	/* while tokens wait, yield every 8th check */
#define WAIT_PATIENCE_NS 4000	/* a patient waiter does not yield before */
#define WAIT_PATIENT_UNTAKEN 2	/* patient with at most 2 events untaken */
#define WAIT_PATIENT_NTASKS 512 /* ... the last batch under 512 children */

/* Whether this thread's last fanout_wait that spun was patient (for tests;
 * the wait that finds its event at once does not touch it). */
static FQ_TLS bool tls_patient;

bool fanout__wait_was_patient(void)
{
	return tls_patient;
}

struct waiter {
	struct fanout_sink *s;
	struct fq *q;
	uint64_t deadline;   /* CLOCK_MONOTONIC ns; 0 = none */
	uint64_t spin_until; /* spin until then, sleep after */
	uint64_t yield_from; /* no yield before then (patience); 0: none */
	bool helps;	     /* FANOUT_WAIT_HELPS and not inside a child */
};

static bool sink_empty(struct fanout_sink *s)
{
	return cds_wfcq_empty(&s->head, &s->tail);
}

/* Whether a helping waiter may run another chunk: its sink is empty and
 * its deadline not passed (fanout__help_step asks between chunks). */
static bool help_more(void *arg)
{
	const struct waiter *w = arg;

	return sink_empty(w->s) && (!w->deadline || fq_now_ns() < w->deadline);
}

/* Help with one delegation (fanout__help_step).  1: helped (look again);
 * 0: nothing to help with; -1: the deadline passed meanwhile.  The clock
 * is read only when the help did not publish our event. */
static int wait_help(struct waiter *w)
{
	uint64_t now;

	if (!fanout__help_step(w->s->e, help_more, w))
		return 0;
	if (!sink_empty(w->s))
		return 1;
	now = fq_now_ns();
	if (w->deadline && now >= w->deadline)
		return -1;
	w->spin_until = spin_end(w->q, now, w->deadline);
	return 1;
}

/*
 * Spin a little.  With more runnable threads than CPUs, a waiter must not
 * keep the worker that would publish its event off the CPU: while tokens
 * wait in the ring, it yields every WAIT_YIELD_EVERY checks.
 *
 * Patience.  A yield hands the CPU to the worker pinned there and costs
 * the waiter its reaction: a switch there and one back, ~1.9 us each on
 * this host (fanout-bench's limits).  A waiter with at most
 * WAIT_PATIENT_UNTAKEN events untaken (not a pipeline) mostly waits for
 * a batch that the other CPU's worker is running already: a token of it
 * still in the ring is an extra runner, which that worker's runner makes
 * redundant by claiming the rest.  Yielding to it cost two switches per
 * batch (44,500 per 22,225 batches of 64).  So such a waiter spins
 * WAIT_PATIENCE_NS without yielding first, and yields as before only if
 * the event is later than that (a long batch, which the other worker
 * then shares).  A pipelining waiter (16 batches in flight) stays as it
 * was: its ring holds other delegations' tokens, and patience measured
 * 10-20% slower there.  So does a waiter whose dispatch had to wake a
 * worker (fq.c, kick()): no worker was spinning to take it.  If it woke
 * the worker pinned to its CPU, that worker waits for this very CPU, and
 * patience cost the parked single child ~4 us (bench/PROFILE.txt, phase
 * 10).  If it woke the other CPU's, that one runs tens of us later on a
 * VM (an IPI to a halted vCPU), and meanwhile only the worker on this CPU
 * can take the token, once we yield: the first hot dispatches after the
 * workers parked cost ~10 us each with patience, ~4.5 us without (phase
 * 20).  So does a waiter whose sink's last batch had
 * WAIT_PATIENT_NTASKS children or more: one worker alone runs them for
 * longer than the patience even when they return at once (~10 ns a
 * child), so the patience only kept the worker on the waiter's CPU from
 * sharing them (impatient from 512: batch 512 x1 1.03-1.23x, 1024 1.17x,
 * 4096 1.04x; from 256, batch 256 read 0.88-0.90x; phase 19).
 */
static void wait_spin(const struct waiter *w, uint64_t now)
{
	unsigned k;
	bool patient = now < w->yield_from;

	for (k = 0; k < WAIT_SPIN_CHECKS && sink_empty(w->s) &&
		    !(w->helps && fq_pending(w->q));
	     k++) {
		if (patient)
			ck_pr_stall();
		else if (k % WAIT_YIELD_EVERY == WAIT_YIELD_EVERY - 1 &&
			 fq_pending(w->q))
			sched_yield();
		else
			fq_spin_relax(k);
	}
}

/* Sleep until a publisher signals or the deadline passes (false). */
static bool wait_sleep(const struct waiter *w)
{
	uint32_t v;
	bool woke = true;

	/* About to sleep: records this engine retired wait for no batch
	 * (record.c, "Batched reclamation"). */
	fanout__rec_flush(w->s->e);
	v = fq_ec_prepare(&w->s->ec);

	/* Re-check after announcing ourselves: a publish before the
	 * announcement is seen here, one after it signals (fq.c). */
	if (sink_empty(w->s))
		woke = fq_ec_wait(&w->s->ec, v, w->deadline);
	fq_ec_done(&w->s->ec);
	return woke;
}

/* The deadline passed: one last look, then -ETIMEDOUT. */
static int wait_timed_out(struct fanout_sink *s, struct fanout_event **ev)
{
	struct record *rec = take(s);

	if (!rec)
		disarm(s);
	leave(s);
	if (!rec)
		return -ETIMEDOUT;
	*ev = &rec->ev;
	return 0;
}

int fanout_wait(struct fanout_sink *s, struct fanout_event **ev, int timeout_ms)
{
	struct waiter w = {.s = s};
	struct record *rec;
	uint64_t now;
	int helped;

	if (!s || !ev)
		return -EINVAL;
	if (timeout_ms == 0 || fanout__inherited(s->fork_gen))
		return fanout_poll(s, ev); /* which refuses an inherited s */
	if (!enter(s))
		return -EBUSY;
	rec = take(s); /* the common case under load: no clock read at all */
	if (rec)
		goto out;
	w.q = s->e->q;
	/* Helping only at the top level: a child waiting on a sink must not
	 * grow its stack with unrelated children (see fanout.h). */
	w.helps = (s->e->cfg.flags & FANOUT_WAIT_HELPS) && !fanout__current();
	fq_note_app_cpu(w.q); /* we are about to spin for an event */
	now = fq_now_ns();
	if (timeout_ms > 0)
		w.deadline = now + (uint64_t)timeout_ms * 1000000ull;
	w.spin_until = spin_end(w.q, now, w.deadline);
	/* relaxed (both): hints for wait_spin() alone; pair with nothing. */
	if (atomic_load_explicit(&s->untaken, memory_order_relaxed) <=
		    WAIT_PATIENT_UNTAKEN &&
	    atomic_load_explicit(&s->last_ntasks, memory_order_relaxed) <
		    WAIT_PATIENT_NTASKS &&
	    !fq_woke_worker())
		w.yield_from = now + WAIT_PATIENCE_NS;
	tls_patient = w.yield_from != 0; /* only a wait that spins writes it */
	while (!(rec = take(s))) {
		helped = w.helps ? wait_help(&w) : 0;
		if (helped < 0)
			return wait_timed_out(s, ev);
		if (helped)
			continue;
		now = fq_now_ns();
		if (now < w.spin_until)
			wait_spin(&w, now);
		else if (!wait_sleep(&w))
			return wait_timed_out(s, ev);
	}
out:
	leave(s);
	*ev = &rec->ev;
	return 0;
}

int fanout_sink_fd(struct fanout_sink *s)
{
	if (!s)
		return -EINVAL;
	/* The eventfd is shared with the parent: reading it here would steal
	 * the parent's wakeups. */
	if (fanout__inherited(s->fork_gen))
		return -EOWNERDEAD;
	/* relaxed: only a shortcut; the seq_cst store below is the real
	 * publication, and storing true twice is harmless. */
	if (!atomic_load_explicit(&s->fd_used, memory_order_relaxed)) {
		atomic_store_explicit(&s->fd_used, true, memory_order_seq_cst);
		/* seq_cst fence: store fd_used; fence; check queue - pairs
		 * with publish's enqueue; seq_cst RMW; load fd_used. */
		atomic_thread_fence(memory_order_seq_cst);
		if (!cds_wfcq_empty(&s->head, &s->tail))
			arm(s);
	}
	return s->efd;
}

/* The event's reference, and the table's if the record's tomb took its
 * place (table.c, "Tombs"); the record joins the kept ring first, which
 * prunes an older one (table.c, "Pruning"). */
static void event_release(struct record *rec)
{
	uint32_t refs = fanout__table_compact(rec);

	fanout__table_retire(rec->e, rec);
	fanout__rec_put(rec, refs);
}

void fanout_event_free(struct fanout_event *ev)
{
	if (ev)
		event_release(caa_container_of(ev, struct record, ev));
}

struct fanout_sink *fanout_default_sink(struct fanout_engine *e)
{
	return e ? e->default_sink : NULL;
}

int fanout_sink_create(struct fanout_engine *e, struct fanout_sink **out)
{
	if (!e || !out)
		return -EINVAL;
	if (fanout__inherited(e->fork_gen))
		return -EOWNERDEAD;
	/* acquire: pairs with the seq_cst exchange in fanout_shutdown(); a
	 * sink created concurrently with shutdown is harmless either way. */
	if (atomic_load_explicit(&e->shutting, memory_order_acquire))
		return -ESHUTDOWN;
	return fanout__sink_new(e, false, out);
}

/* Plain puts, not event_release(), on purpose.  From
 * fanout__sinks_destroy() the table is destroyed next and evicts every
 * record.  From sink_free_rcu() the queue is empty (see "Destroy":
 * fanout_sink_destroy() returns 0 only once every untaken event is
 * queued, and takes them all); only a dispatch racing the destroy, which
 * README (U04, U05) makes undefined, could leave one.  event_release()
 * there would be wrong twice over: the callback may run inside
 * fanout_destroy()'s rcu_barrier(), after the table and the kept ring are
 * freed; and its evictions would go to the call_rcu thread's slot cache,
 * which no dispatch ever takes from. */
static void drain_and_close(struct fanout_sink *s)
{
	struct record *rec;

	while ((rec = take(s)))
		fanout__rec_put(rec, 1);
	close(s->efd);
	cds_wfcq_destroy(&s->head, &s->tail);
}

/* After a grace period no publisher is inside this sink any more (they
 * publish under the RCU read lock): drain what they left, then free. */
static void sink_free_rcu(struct rcu_head *head)
{
	struct fanout_sink *s = caa_container_of(head, struct fanout_sink, rcu);

	FQ_HANDOFF_ACQUIRE(&fanout__rcu_token);
	FQ_HANDOFF_ACQUIRE(s);
	drain_and_close(s);
	fanout__free(s, sizeof(*s));
	/* TSan edge: the puts' use of the engine happens before the
	 * rcu_barrier() in fanout_destroy() returns (as in rec_free_rcu). */
	FQ_HANDOFF_RELEASE(&fanout__rcu_token);
}

static void sink_unlink(struct fanout_sink *s)
{
	fanout__read_lock();
	cds_lfht_del(s->e->sinks, &s->node);
	fanout__read_unlock();
	FQ_HANDOFF_RELEASE(s);
}

/* Events queued in @s now.  Iterating needs only what dequeue needs
 * (no concurrent consumer: destroy does not race poll/wait); enqueues may
 * run alongside.  A half-linked one is waited out as take() does: the
 * "blocking" iterator would sleep 10 ms in poll() at a time instead. */
static uint32_t queued(struct fanout_sink *s)
{
	struct cds_wfcq_node *node, *next;
	uint32_t n = 0;
	unsigned i = 0;

	while ((node = __cds_wfcq_first_nonblocking(&s->head, &s->tail)) ==
	       CDS_WFCQ_WOULDBLOCK)
		half_linked_pause(i++);
	while (node) {
		n++;
		while ((next = __cds_wfcq_next_nonblocking(&s->head, &s->tail,
							   node)) ==
		       CDS_WFCQ_WOULDBLOCK)
			half_linked_pause(i++);
		node = next;
	}
	return n;
}

int fanout_sink_destroy(struct fanout_sink *s)
{
	struct record *rec;
	uint32_t untaken;

	if (!s || s->is_default)
		return -EINVAL;
	if (fanout__inherited(s->fork_gen))
		return -EOWNERDEAD; /* fanout_destroy() frees it */
	/* relaxed: the dispatches and takes that changed it happen before
	 * this call (see "Destroy" above); only publishers run alongside, and
	 * they do not touch it. */
	untaken = atomic_load_explicit(&s->untaken, memory_order_relaxed);
	if (untaken && queued(s) < untaken)
		return -EBUSY; /* some accepted delegation will still publish */
	/* The events nobody took, freed as events (see "Destroy"). */
	while ((rec = take(s)))
		event_release(rec);
	sink_unlink(s);
	call_rcu(&s->rcu, sink_free_rcu);
	return 0;
}

/* For fanout_describe_error(): how many sinks of @e are at max_pending
 * now, and whether the default sink is one of them.  A figure for a human
 * (relaxed loads, under the read lock that keeps the sinks alive). */
unsigned fanout__sinks_full(struct fanout_engine *e, bool *default_full)
{
	struct cds_lfht_iter iter;
	struct cds_lfht_node *node;
	struct fanout_sink *s;
	unsigned n = 0;

	*default_full = false;
	fanout__read_lock();
	fanout__lfht_for_each(e->sinks, &iter, node) {
		s = caa_container_of(node, struct fanout_sink, node);
		FQ_HANDOFF_ACQUIRE(s);
		if (atomic_load_explicit(&s->untaken, memory_order_relaxed) <
		    s->max_pending)
			continue;
		n++;
		if (s->is_default)
			*default_full = true;
	}
	fanout__read_unlock();
	return n;
}

/* A set (cds_lfht: lock-free add and remove from any thread; no resizing,
 * so no helper thread) walked only by describe_error and destroy. */
int fanout__sinks_init(struct fanout_engine *e)
{
	e->sinks = cds_lfht_new_flavor(16, 16, 0, 0, &urcu_bp_flavor, NULL);
	return e->sinks ? 0 : -ENOMEM;
}

/* Engine destroy: quiescent, every event published. */
void fanout__sinks_destroy(struct fanout_engine *e)
{
	struct cds_lfht_iter iter;
	struct cds_lfht_node *node;
	struct fanout_sink *s;

	if (!e->sinks)
		return;
	/* Quiescent engine: nobody publishes; free synchronously so the
	 * records the sinks release are queued before rcu_barrier. */
	fanout__read_lock();
	fanout__lfht_for_each(e->sinks, &iter, node) {
		s = caa_container_of(node, struct fanout_sink, node);
		FQ_HANDOFF_ACQUIRE(s);
		sink_unlink(s);
		drain_and_close(s);
		fanout__free(s, sizeof(*s));
	}
	fanout__read_unlock();
	cds_lfht_destroy(e->sinks, NULL);
	e->sinks = NULL;
}
