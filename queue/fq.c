/* SPDX-License-Identifier: MIT */
/*
 * fq.c - pinned workers over a Concurrency Kit MPMC ring.
 *
 * WHY IT IS CORRECT
 *
 * 1. The ring never overflows.  Producers count the credits they hold in
 *    `reserved` (a 32-bit counter, wrapping): fq_reserve() adds what it
 *    takes with a CAS, fq_unreserve() subtracts what was not used.  The
 *    ring's consumer counter c_head counts the tokens ever dequeued; a
 *    worker's dequeue moves it, and gives nothing back anywhere else.  So
 *        tokens in the ring + tokens being enqueued <= reserved - c_head
 *    and fq_reserve() keeps reserved - c_head <= capacity (size - 1
 *    entries for ck_ring): it takes credits only while reserved + take
 *    stays within `limit`, a value of c_head + capacity that some producer
 *    read earlier.  c_head only grows, so an old limit is a low one and
 *    the bound holds with any limit read.  So the enqueue (ring_put)
 *    needs no full check: the RMWs of c_head, `reserved` and p_head are
 *    locked instructions, in one order (x86-64; ck_pr_cas is a full
 *    barrier there), and a reservation that takes `reserved` to v follows
 *    in it a load of c_head that returned C with v <= C + capacity (the
 *    limit's store is a release after that load, the reserver's load of
 *    it an acquire).  c_head only grows and `reserved` grows only so, so
 *    reserved <= c_head + capacity at every point of that order; and
 *    p_head <= reserved, since each claim of a position spends a credit
 *    reserved before it and never given back.  At the claim of position
 *    p, then, p + 1 <= c_head + size - 1: the dequeue of p - size, the
 *    slot's last user, has moved c_head past it, after loading the slot,
 *    so the store into the slot after the claim cannot overwrite a token
 *    nobody took.  The limit is refreshed from c_head only when it is
 *    too low for the request, so in the usual hand-off a producer writes
 *    only the producers' line and a worker only the ring's consumer
 *    counter: neither RMWs a line the other wrote last (a shared credit
 *    counter cost both sides one such RMW per token; bench/PROFILE.txt
 *    phase 14).  Admission is decided before anything is enqueued: a
 *    caller that cannot get its minimum gets 0 and has changed nothing.
 *
 * 2. No lost wakeup.  A worker parks with the eventcount protocol:
 *        W1 waiters++ (seq_cst RMW), then a seq_cst fence
 *        W2 v = seq   W3 re-check ring   W4 sleep if seq == v
 *    and a producer signals (kick()) with
 *        P1 enqueue, then a seq_cst fence
 *        P3 load waiters (seq_cst); only if there are any:
 *        P2 seq++ (seq_cst), then wake
 *    (P3 and P2 only when the spinners do not cover the tokens; when they
 *    do, argument 3 makes a spinner take them).  Either P3 reads W1's
 *    announcement - then P2 follows W1 in their single total order S, so
 *    W2 read seq before P2 (and FUTEX_WAIT at W4 finds seq != v and
 *    returns at once, or the wake finds the worker queued) or read P2's
 *    value or a later one (acquiring P2's release, after P1: the re-check
 *    sees the token) - or P3 read an older count.  Then the producer's
 *    fence precedes the worker's in S (had the worker's come first, P3,
 *    after the producer's, would see W1, before it: C11 7.17.4), so W3,
 *    after the worker's fence, sees P1, before the producer's.  Either
 *    way the worker does not sleep while the token waits.  P3 before P2
 *    means a hand-off with nobody parked writes no line of the
 *    eventcount; with P2 first, the dispatcher and the worker handing on
 *    each RMWed `seq` whenever the worker was running a child (not
 *    counted as a spinner), a locked miss on each side per delegation
 *    (bench/PROFILE.txt phase 14).  The wake may prefer one sleeper
 *    (wake(): the worker on the submitter's CPU) but wakes as many as a
 *    plain FUTEX_WAKE would, so it does not matter which.
 *    tests/models/park_wake.pml checks the same handshake, and a seeded
 *    check-before-publish bug, with spin.
 *
 * 3. Only as many workers are woken as there is work for: fq_submit() wakes
 *    at most n - s sleepers, where s is the number of spinning workers
 *    (kick()), and a woken worker that finds the ring empty again simply
 *    goes back through the protocol.  A worker counts in `spinning` from
 *    before its spin (or from fq_tail(), when the item it runs has only
 *    bounded library code left and the ring holds no token; with tokens
 *    there its next take is a plain one that nobody counted on) until it
 *    leaves the spin phase or takes a
 *    token (seq_cst decrement), which it does BEFORE it announces itself
 *    as a waiter (W1) and before its next look at the ring.  A producer
 *    that counted it read `spinning` before that decrement, and enqueued
 *    before that read (a seq_cst fence between the two, and one after the
 *    worker's decrement: kick(), stop_spinning()); so the token precedes
 *    the worker's take after the spin and its re-check (W3), which
 *    therefore see it, or someone took it.  But the counted worker may
 *    take ANOTHER token and run it for a long time (a child blocked on its
 *    sibling); so whenever a worker that left the spin phase takes a
 *    token, it hands on what is left: it reads the ring's size and, if
 *    tokens remain, does the producer's step itself (kick, hand_on()).  By
 *    induction every token left to a spinner is taken or kicked on.  If
 *    the producer did not count the worker, the worker is announced in
 *    `waiters` (or will re-check), and argument 2 applies.  So a batch-1
 *    dispatch to an engine with a spinning worker makes no system call and
 *    writes none of the eventcount's lines, and no worker sleeps while a
 *    token waits
 *    (test_dispatch's dispatch_idle_worker_not_left_asleep; park_wake.pml
 *    with two submits counting one spinner, and its seeded bugs 4, 5, 7).
 *
 * 4. Idle workers stop burning CPU after spin_ns: the spin loop reads the
 *    clock every 64 pauses and parks once the deadline passed.  A spin
 *    that ended on a token someone else dequeued first starts over (there
 *    was work), so the bound runs from the last token a worker saw.
 *
 * 5. Drain on stop.  fq_stop() sets `stopping`, then signals every worker.
 *    A worker exits only after it saw `stopping` AND then found the ring
 *    empty, so every token enqueued before fq_stop() is run.  The fanout
 *    engine never submits after it began stopping the queue (see the table
 *    in fq.h).
 *
 * 6. The completion word (fq_done_*) is the classic three-state futex:
 *    the waiter CASes 0 -> 2 before sleeping on 2; the signaller exchanges
 *    in 1 and calls FUTEX_WAKE only if it took out a 2.  A wake that beats
 *    the sleep finds the word != 2 in the kernel and returns immediately.
 *
 * 7. Offers (work-first).  A thread about to run a work item itself (the
 *    fanout_run caller) may offer n tokens of it in one of FQ_OFFERS
 *    slots instead of the ring.  A slot is owned by whoever set its bit in
 *    `offers_open` (fetch_or; the bit was clear) until it clears it again.
 *    Its `word` is generation << 32 | tokens left; only the owner writes
 *    the generation, takers only decrement the low half with a CAS.
 *    Exactly once: every token is taken by exactly one successful CAS
 *    (n -> n - 1) or returned by the owner's exchange (k -> 0), all RMWs
 *    of one word, hence totally ordered; after the exchange the low half
 *    stays 0 until the owner opens the slot again with a new generation.
 *    No stale item: a taker reads `word` (acquire; the owner's exchange
 *    that opened the offer heads a release sequence that the takers' CASes
 *    continue), then `w`, then CASes the word it read; the owner rewrites
 *    `w` only after its closing exchange changed the word, so a CAS that
 *    succeeds took a token of the item it read.  No offer left behind:
 *    the owner's fetch_or of its bit and exchange that opens the offer,
 *    then its load of `spinning`, and a spinner's decrement of `spinning`,
 *    then its loads of `offers_open` and `word` before it parks, are all
 *    seq_cst; so either
 *    the owner saw no spinner (and withdraws the offer and submits the
 *    tokens to the ring, argument 2 and 3 take over), or the parking
 *    spinner sees the offer and takes a token whatever its age.  A spinner
 *    that takes one stops spinning and hands on ring tokens as if it had
 *    taken a ring token (argument 3).  While it spins, a spinner takes a
 *    token only from an offer FQ_OFFER_HOLD_NS old: the offering thread
 *    runs the item itself meanwhile, so a batch it finishes sooner costs
 *    no cross-core traffic, and a long one gets help within 2 us of its
 *    start whatever its first child does.  As many workers as can run
 *    the tokens: an owner that keeps its offer open kicks for them as a
 *    ring submit would (fq_offer_kick: the sleepers the spinners cannot
 *    cover are woken, and join once the offer is old enough), and
 *    hand_on counts the tokens left in open offers with the ring's, so a
 *    batch whose children wait for each other gets them all running.
 */
#include "fq.h"
#include "clock.h"
#include "annotate.h"

#include <ck_pr.h>
#include <ck_ring.h>
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "alloc.h"
#include "../lib/probes.h"

struct fq_worker {
	struct fq *q;	  /* I */
	pthread_t thread; /* I */
	unsigned index;	  /* I */
	int cpu;	  /* I: pinned CPU or -1 */
	bool started;	  /* I: pthread_create succeeded */
	bool counted;	  /* W: counted in q->spinning (argument 3) */
	/* A: a hint for kick(): set just before the worker's FUTEX_WAIT, and
	 * cleared when it returns (relaxed both ways; see prefer_local()). */
	_Atomic bool asleep;
	_Atomic uint64_t items;	  /* W: read by stats with relaxed loads */
	_Atomic uint64_t parks;	  /* W */
	_Atomic uint64_t wakeups; /* W */
	_Atomic uint64_t offers;  /* W: tokens taken from offers */
} __attribute__((aligned(FQ_CACHELINE)));

struct fq {
	/* Read-mostly, shared by everyone. */
	struct ck_ring ring;	    /* ck_ring keeps its own counters apart */
	struct ck_ring_buffer *buf; /* I */
	unsigned nworkers;	    /* I */
	unsigned capacity;	    /* I: usable entries, slots - 1 */
	uint64_t spin_ns;	    /* I */
	struct fq_worker *workers;  /* I */
	cpu_set_t cpus;		    /* I: the workers' CPUs (worker_mask) */
	bool cpus_known;	    /* I */

	/* Credits (argument 1): written by producers only, on their own
	 * line so that workers never write it and reserve/unreserve traffic
	 * does not bounce the ring's read-mostly fields. */
	_Atomic uint32_t reserved __attribute__((aligned(FQ_CACHELINE)));
	_Atomic uint32_t limit; /* c_head + capacity, as last read */

	/* Park/wake: seq is bumped by a submit or hand-on that finds a
	 * worker parked (argument 2); workers write this line only when
	 * they park, so a hand-off with nobody parked only reads it. */
	struct fq_ec idle __attribute__((aligned(FQ_CACHELINE)));
	/* A: workers in the spin phase (arg. 3).  Written by workers around
	 * every token, read by producers: its own line, so neither side's
	 * writes evict the other's line. */
	_Atomic uint32_t spinning __attribute__((aligned(FQ_CACHELINE)));
	/* Read at every spin step, written almost never: their own line. */
	_Atomic int app_cpu __attribute__((aligned(FQ_CACHELINE))); /* hint */
	_Atomic bool stopping;
	bool stopped; /* only fq_stop's caller */

	/* Offers (argument 7): written by offering threads, read by spinners
	 * every 64 spin steps. */
	_Atomic uint64_t offers_open __attribute__((aligned(FQ_CACHELINE)));
	struct fq_offer *offers; /* I: FQ_OFFERS slots */
};

/* One offer slot (argument 7). */
#define FQ_OFFERS 64
struct fq_offer {
	_Atomic uint64_t word;	     /* A: generation << 32 | tokens left */
	_Atomic(struct fq_work *) w; /* A: written by the owner only */
	_Atomic uint64_t t0;	     /* A: fq_cycles() at open; a hint */
} __attribute__((aligned(FQ_CACHELINE)));

static FQ_TLS struct fq_worker *tls_self;
static FQ_TLS unsigned tls_offer_hint; /* where this thread last offered */
/* This thread's last fq_submit() had to wake a worker: none was spinning
 * where it could take the tokens (fq_woke_worker()). */
static FQ_TLS bool tls_woke;
_Atomic long fq__fail_thread_at;

/*
 * Enqueue one token for which the caller holds a ring credit.  The ring is
 * ck_ring's (ck_ring_init, its dequeue and ck_ring_size read it as theirs);
 * this is ck_ring_enqueue_mpmc() without the full check, which the credit
 * makes redundant (argument 1), and so without its load of c_head: that is
 * the line every worker's dequeue writes, and with tokens in flight the
 * load missed on every dispatch (bench/PROFILE.txt phase 15).  As there:
 * claim a position with a CAS of p_head, store the slot, wait for the
 * producers before us, then a store fence and p_tail (the dequeue's load
 * fence after reading p_tail pairs with it).
 */
static void ring_put(struct fq *q, struct fq_work *w)
{
	struct ck_ring *r = &q->ring;
	unsigned p = ck_pr_load_uint(&r->p_head);

	while (!ck_pr_cas_uint_value(&r->p_head, p, p + 1, &p))
		ck_pr_stall();
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
	/* The sanitizer builds, which run every suite, still check the
	 * credits; the shipped one does not pay the load of c_head. */
	if (p - ck_pr_load_uint(&r->c_head) >= q->capacity)
		abort(); /* broken invariant: credits (argument 1) */
#endif
	ck_pr_store_ptr(&q->buf[p & r->mask].value, w);
	while (ck_pr_load_uint(&r->p_tail) != p)
		ck_pr_stall();
	ck_pr_fence_store();
	ck_pr_store_uint(&r->p_tail, p + 1);
}

static long futex(_Atomic uint32_t *uaddr, int op, uint32_t val,
		  const struct timespec *ts)
{
	return syscall(SYS_futex, (uint32_t *)uaddr, op, val, ts, NULL, 0);
}

void fq_spin_relax(unsigned i)
{
	if ((i & 63) == 63)
		sched_yield();
	else
		ck_pr_stall();
}

/* Is @self pinned to the CPU where an application thread last submitted
 * work or waited for it (`app_cpu`)?  That worker always shares its CPU
 * with the application thread on a box with as many workers as CPUs. */
static bool app_cpu_worker(const struct fq_worker *self)
{
	/* relaxed: a placement hint; a stale value only costs a yield. */
	return self->q->nworkers > 1 && self->cpu >= 0 &&
	       atomic_load_explicit(&self->q->app_cpu, memory_order_relaxed) ==
		       self->cpu;
}

/* --------------------------------------------------------------- offers */

int fq_offer_open(struct fq *q, struct fq_work *w, unsigned n, uint64_t t0)
{
	unsigned k;

	for (k = 0; k < FQ_OFFERS; k++) {
		unsigned i = (tls_offer_hint + k) % FQ_OFFERS;
		uint64_t bit = 1ull << i, gen;
		struct fq_offer *o = &q->offers[i];

		/* relaxed: a look; the fetch_or decides. */
		if (atomic_load_explicit(&q->offers_open,
					 memory_order_relaxed) &
		    bit)
			continue;
		/* acquire: the slot's previous owner's accesses (its close)
		 * happen before ours; pairs with the release fetch_and in
		 * fq_offer_close().  seq_cst: the bit is set before the
		 * exchange that opens the offer in argument 7's single order,
		 * so a parking spinner that misses our load of `spinning`
		 * sees the bit (on x86 any RMW is that already). */
		if (atomic_fetch_or_explicit(&q->offers_open, bit,
					     memory_order_seq_cst) &
		    bit)
			continue;
		tls_offer_hint = i;
		/* relaxed: only the owner writes the generation. */
		gen = (atomic_load_explicit(&o->word, memory_order_relaxed) >>
		       32) +
		      1;
		/* relaxed: published by the exchange below (argument 7). */
		atomic_store_explicit(&o->w, w, memory_order_relaxed);
		atomic_store_explicit(&o->t0, t0 ? t0 : fq_cycles(),
				      memory_order_relaxed);
		FQ_HANDOFF_RELEASE(w);
		/* seq_cst: the release that publishes the item to takers, and
		 * the store of argument 7's pair with a parking spinner (before
		 * the caller's fq_spinners()). */
		atomic_exchange_explicit(&o->word, gen << 32 | n,
					 memory_order_seq_cst);
		return (int)i;
	}
	return -1;
}

bool fq_spinners(struct fq *q)
{
	/* seq_cst: the load of argument 7's pair (after the open). */
	return atomic_load_explicit(&q->spinning, memory_order_seq_cst) != 0;
}

unsigned fq_offer_close(struct fq *q, int slot)
{
	struct fq_offer *o = &q->offers[slot];
	/* relaxed: only the owner writes the generation. */
	uint64_t gen =
		atomic_load_explicit(&o->word, memory_order_relaxed) >> 32;
	/* relaxed: the tokens' ownership is the RMW order alone; what the
	 * owner does with the count (drop references) has its own order. */
	uint64_t old = atomic_exchange_explicit(&o->word, gen << 32,
						memory_order_relaxed);

	/* release: pairs with the acquire fetch_or of the next owner. */
	atomic_fetch_and_explicit(&q->offers_open, ~(1ull << slot),
				  memory_order_release);
	return (uint32_t)old;
}

/* Tokens left in open offers (a hint for hand_on, argument 7).  relaxed:
 * like the ring's size read there, ordered by stop_spinning's fence. */
static unsigned offered_left(struct fq *q)
{
	uint64_t open =
		atomic_load_explicit(&q->offers_open, memory_order_relaxed);
	unsigned n = 0;

	while (open) {
		unsigned i = (unsigned)__builtin_ctzll(open);

		open &= open - 1;
		n += (uint32_t)atomic_load_explicit(&q->offers[i].word,
						    memory_order_relaxed);
	}
	return n;
}

/* Take one token from an open offer: one old enough, or any with @any
 * (a spinner about to park).  NULL if none. */
static struct fq_work *offer_take(struct fq *q, bool any)
{
	/* seq_cst: argument 7, after the spinner's seq_cst decrement of
	 * `spinning` on the parking path. */
	uint64_t open =
		atomic_load_explicit(&q->offers_open, memory_order_seq_cst);

	while (open) {
		unsigned i = (unsigned)__builtin_ctzll(open);
		struct fq_offer *o = &q->offers[i];
		/* seq_cst (acquire at least): argument 7. */
		uint64_t word =
			atomic_load_explicit(&o->word, memory_order_seq_cst);
		struct fq_work *w;

		open &= open - 1;
		if (!(uint32_t)word)
			continue;
		/* relaxed: the age is a hint; a stale t0 only moves the
		 * moment of joining. */
		if (!any &&
		    fq_cycles_to_ns(fq_cycles() -
				    atomic_load_explicit(
					    &o->t0, memory_order_relaxed)) <
			    FQ_OFFER_HOLD_NS)
			continue;
		/* relaxed: validated by the CAS below (argument 7). */
		w = atomic_load_explicit(&o->w, memory_order_relaxed);
		/* acquire: the owner's writes before the open (the item). */
		if (atomic_compare_exchange_strong_explicit(
			    &o->word, &word, word - 1, memory_order_acquire,
			    memory_order_relaxed)) {
			FQ_HANDOFF_ACQUIRE(w);
			return w;
		}
	}
	return NULL;
}

/*
 * An idle worker's spin, until the ring has tokens, the queue stops or
 * spin_ns has passed.  The ring is checked with a plain size read, cheap
 * and local while nothing changes.
 *
 * A counted spinner (argument 3) yields only every 1024 steps (~40 us):
 * often enough to bound how long it keeps an unknown thread off its CPU,
 * rarely enough that a hot hand-off is not turned into a context switch.
 * It stops spinning at once if it turns out to be on the application's
 * CPU.  The uncounted app-CPU worker (@yield_always) yields at every step,
 * so it runs only while the application thread on its CPU blocks or
 * yields: that CPU belongs to the thread that dispatches, and neither a
 * rarely-yielding spinner (the dispatcher waits for its CPU) nor parking
 * at once (a FUTEX_WAKE and a preemption of the application per dispatch)
 * serves it.  The measurements behind these rates are in bench/PROFILE.txt.
 */
static struct fq_work *spin_for_work(struct fq_worker *self, bool yield_always,
				     bool *saw_tokens)
{
	struct fq *q = self->q;
	uint64_t deadline = 0;
	struct fq_work *w;
	unsigned i;

	*saw_tokens = false;
	for (i = 0;; i++) {
		if (ck_ring_size(&q->ring) != 0) {
			*saw_tokens = true;
			return NULL;
		}
		/* relaxed: only ends the spin early; the acquire load before
		 * the worker parks decides (argument 5). */
		if (atomic_load_explicit(&q->stopping, memory_order_relaxed))
			return NULL;
		if ((i & 63) == 0) {
			uint64_t now = fq_now_ns();

			if (!deadline)
				deadline = now + q->spin_ns;
			else if (now >= deadline)
				return NULL;
			/* relaxed: a look; offer_take decides (argument 7). */
			if (atomic_load_explicit(&q->offers_open,
						 memory_order_relaxed) &&
			    (w = offer_take(q, false)))
				return w;
		}
		if (yield_always)
			sched_yield();
		else if (app_cpu_worker(self))
			return NULL;
		else if ((i & 1023) == 1023)
			sched_yield();
		else
			ck_pr_stall();
	}
}

static int note_app_cpu(struct fq *q)
{
	int cpu = sched_getcpu();

	/* relaxed: a placement hint, see app_cpu_worker(). */
	if (atomic_load_explicit(&q->app_cpu, memory_order_relaxed) != cpu)
		atomic_store_explicit(&q->app_cpu, cpu, memory_order_relaxed);
	return cpu;
}

void fq_note_app_cpu(struct fq *q)
{
	(void)note_app_cpu(q);
}

/* ------------------------------------------------------------ eventcount */

uint32_t fq_ec_prepare(struct fq_ec *ec)
{
	/* seq_cst RMW and fence: W1 of argument 2; orders the announcement
	 * before the read of seq and the caller's re-check, against the
	 * signaller's fence before its load of `waiters` (kick(),
	 * fq_ec_signal_after_rmw()).  On x86 the locked RMW is that fence
	 * already; the fence makes it so in C11. */
	atomic_fetch_add_explicit(&ec->waiters, 1, memory_order_seq_cst);
	atomic_thread_fence(memory_order_seq_cst);
	return atomic_load_explicit(&ec->seq, memory_order_seq_cst);
}

bool fq_ec_wait(struct fq_ec *ec, uint32_t v, uint64_t deadline_ns)
{
	struct timespec ts, *tsp = NULL;

	if (deadline_ns) {
		uint64_t now = fq_now_ns();

		if (now >= deadline_ns)
			return false;
		ts.tv_sec = (time_t)((deadline_ns - now) / 1000000000ull);
		ts.tv_nsec = (long)((deadline_ns - now) % 1000000000ull);
		tsp = &ts;
	}
	if (futex(&ec->seq, FUTEX_WAIT_PRIVATE, v, tsp) < 0 &&
	    errno == ETIMEDOUT)
		return false;
	return true;
}

void fq_ec_done(struct fq_ec *ec)
{
	/* relaxed: the count only decides whether a signaller makes a
	 * syscall; a stale non-zero costs one useless FUTEX_WAKE. */
	atomic_fetch_sub_explicit(&ec->waiters, 1, memory_order_relaxed);
}

static void ec_wake(struct fq_ec *ec, unsigned nwake)
{
	futex(&ec->seq, FUTEX_WAKE_PRIVATE, nwake > INT_MAX ? INT_MAX : nwake,
	      NULL);
}

void fq_ec_signal(struct fq_ec *ec, unsigned nwake)
{
	/* seq_cst increment then seq_cst load: P2/P3 of the argument; pairs
	 * with the seq_cst fetch_add/load in fq_ec_prepare(). */
	atomic_fetch_add_explicit(&ec->seq, 1, memory_order_seq_cst);
	if (atomic_load_explicit(&ec->waiters, memory_order_seq_cst))
		ec_wake(ec, nwake);
}

/*
 * P3 then P2 of argument 2, for a signaller whose P1 is already followed
 * by a full barrier (an RMW that enqueues, or kick()'s fence): the
 * seq_cst load of `waiters`, and only if there are any the seq_cst bump
 * of `seq`; pairs with the seq_cst fetch_add, fence and load in
 * fq_ec_prepare().  Returns the waiters seen; the caller wakes if > 0.
 */
static unsigned ec_bump_if_waiters(struct fq_ec *ec)
{
	unsigned waiters =
		atomic_load_explicit(&ec->waiters, memory_order_seq_cst);

	if (waiters)
		atomic_fetch_add_explicit(&ec->seq, 1, memory_order_seq_cst);
	return waiters;
}

void fq_ec_signal_after_rmw(struct fq_ec *ec, unsigned nwake)
{
	if (ec_bump_if_waiters(ec))
		ec_wake(ec, nwake);
}

/* ------------------------------------------------------ completion word */

void fq_done_signal(_Atomic uint32_t *word)
{
	/* release: everything before the signal (the finalised record) is
	 * visible to the waiter's acquire in fq_done_wait(). */
	if (atomic_exchange_explicit(word, 1, memory_order_acq_rel) == 2)
		futex(word, FUTEX_WAKE_PRIVATE, INT_MAX, NULL);
}

void fq_done_wait(_Atomic uint32_t *word, uint64_t spin_ns)
{
	uint64_t deadline = 0;
	unsigned i;

	for (i = 0;; i++) {
		/* acquire: pairs with the exchange in fq_done_signal(). */
		if (atomic_load_explicit(word, memory_order_acquire) == 1)
			return;
		if ((i & 63) == 0) {
			uint64_t now = fq_now_ns();

			if (!deadline)
				deadline = now + spin_ns;
			else if (now >= deadline)
				break;
		}
		fq_spin_relax(i);
	}
	for (;;) {
		uint32_t expect = 0;

		/* acquire on failure too: a 1 read here must publish the
		 * signaller's writes, as above. */
		if (!atomic_compare_exchange_strong_explicit(
			    word, &expect, 2, memory_order_acquire,
			    memory_order_acquire) &&
		    expect == 1)
			return;
		futex(word, FUTEX_WAIT_PRIVATE, 2, NULL);
	}
}

/* ------------------------------------------------------------- credits */

/* Credits left under @lim for a producer that sees @r taken: signed, as
 * both counters wrap. */
static int32_t room(uint32_t lim, uint32_t r)
{
	return (int32_t)(lim - r);
}

unsigned fq_reserve(struct fq *q, unsigned want, unsigned min)
{
	/* relaxed: `reserved` orders nothing but itself (argument 1). */
	uint32_t r = atomic_load_explicit(&q->reserved, memory_order_relaxed);

	for (;;) {
		/* acquire: pairs with the release store below, after the
		 * load of c_head the limit came from (argument 1: that load
		 * precedes our reservation, so the position we claim later
		 * was vacated). */
		uint32_t lim =
			atomic_load_explicit(&q->limit, memory_order_acquire);
		int32_t left = room(lim, r);
		unsigned take;

		if (left < (int32_t)want) {
			/* Refresh from the consumers' counter.  Relaxed load
			 * (a plain ck_pr load); release store: pairs with the
			 * acquire above. */
			lim = ck_pr_load_uint(&q->ring.c_head) + q->capacity;
			atomic_store_explicit(&q->limit, lim,
					      memory_order_release);
			left = room(lim, r);
		}
		if (left < (int32_t)min || left <= 0)
			return 0;
		take = (unsigned)left < want ? (unsigned)left : want;
		/* relaxed: see the load above. */
		if (atomic_compare_exchange_weak_explicit(
			    &q->reserved, &r, r + take, memory_order_relaxed,
			    memory_order_relaxed))
			return take;
	}
}

void fq_prefetch_submit(struct fq *q)
{
	/* The lines of fq_reserve()'s CAS and fq_submit()'s ring CAS.  The
	 * builtin's write hint is a read prefetch (PREFETCHT0) on x86-64
	 * without -mprfchw, and stays one on purpose: a real PREFETCHW here
	 * was worse at batch 8 x2, as p_head shares its line with the p_tail
	 * that spinning workers poll (bench/PROFILE.txt phase 16). */
	__builtin_prefetch(&q->reserved, 1, 3);
	__builtin_prefetch(&q->ring.p_head, 1, 3);
	/* For reading: kick()'s load after its fence.  Not the consumer
	 * counter: the enqueue no longer reads it (ring_put), and a copy
	 * here would cost the next dequeue's CAS an invalidation. */
	__builtin_prefetch(&q->spinning, 0, 3);
}

void fq_unreserve(struct fq *q, unsigned n)
{
	if (n) /* relaxed: see fq_reserve() */
		atomic_fetch_sub_explicit(&q->reserved, n,
					  memory_order_relaxed);
}

/* A parked worker sleeps on q->idle.seq with this bit in its futex bitset,
 * so that a waker can pick it out (wake()); several workers may share a
 * bit beyond 32 workers, which only makes the pick less precise. */
static uint32_t worker_bit(const struct fq_worker *wk)
{
	return 1u << (wk->index & 31);
}

/* The worker pinned to @cpu, if it looks parked (a relaxed hint: a stale
 * answer costs one futex call that wakes nobody, or a remote wake). */
static struct fq_worker *local_sleeper(struct fq *q, int cpu)
{
	struct fq_worker *wk = NULL;
	unsigned i;

	if (cpu < 0)
		return NULL;
	/* Worker i is pinned to the i-th allowed CPU: to CPU i when every
	 * CPU is allowed.  Otherwise look for it (only on this slow path,
	 * about to make a system call anyway). */
	if ((unsigned)cpu < q->nworkers && q->workers[cpu].cpu == cpu)
		wk = &q->workers[cpu];
	for (i = 0; !wk && i < q->nworkers; i++)
		if (q->workers[i].cpu == cpu)
			wk = &q->workers[i];
	/* relaxed: a hint, see struct fq_worker. */
	if (!wk || !atomic_load_explicit(&wk->asleep, memory_order_relaxed))
		return NULL;
	return wk;
}

/*
 * FUTEX_WAKE up to @n workers parked on q->idle.seq, and first, if it is
 * parked, the one pinned to @cpu: the CPU of the application thread that
 * submits (-1: no preference).  That thread usually waits for the result
 * next (fanout_wait, a join), so its CPU is about to be free; a worker
 * woken there runs at once, where the futex queue's first sleeper - the
 * one parked longest, as often as not pinned to the other CPU - needs an
 * inter-processor interrupt to a halted CPU, which on a virtual machine is
 * a trip through the hypervisor: 30-40 us of the waker's time and 80 us
 * until the item runs on this host (bench/PROFILE.txt, "The parked
 * path").  The kernel places an unpinned thread the same way (a wakee
 * goes to the waker's CPU when that is cheaper).
 *
 * Whom we wake does not matter to arguments 2 and 3, only how many: the
 * targeted FUTEX_WAKE_BITSET and the plain FUTEX_WAKE after it together
 * wake min(n, queued sleepers), as one plain FUTEX_WAKE(n) would.  A
 * worker that queues itself between the two calls read seq after our
 * increment (else its FUTEX_WAIT fails with EAGAIN) and so re-checked the
 * ring after our enqueue: waking it too is only a spurious wake.
 */
static void wake(struct fq *q, unsigned n, int cpu)
{
	struct fq_worker *wk = local_sleeper(q, cpu);
	long woken = 0;

	if (wk) {
		woken = syscall(SYS_futex, (uint32_t *)&q->idle.seq,
				FUTEX_WAKE_BITSET_PRIVATE, 1, NULL, NULL,
				worker_bit(wk));
		if (woken < 0)
			woken = 0;
	}
	if ((unsigned long)woken < n)
		futex(&q->idle.seq, FUTEX_WAKE_PRIVATE,
		      (uint32_t)(n - (unsigned long)woken), NULL);
}

/*
 * Argument 3: wake sleepers for the n waiting tokens that the spinners
 * cannot cover; @cpu as in wake().
 *
 * seq_cst fence, then the seq_cst load of `spinning`: the enqueue before
 * the fence is seen by a counted spinner's take after its decrement and
 * the fence in stop_spinning() (fence-fence store-buffering pattern), or
 * the load sees that decrement.  When the spinners cover the tokens,
 * that is all: `seq` is not touched, so the hot hand-off writes no line a
 * worker reads (the eventcount's line stays shared, untransferred).  Else
 * the seq_cst load of `waiters` (P3) and, only if somebody waits, the
 * seq_cst increment of `seq` (P2) and the wake: argument 2, pairing with
 * fq_ec_prepare().  Returns whether it woke a sleeper (for fq_submit's
 * caller's patience: fq_woke_worker()).
 */
static bool kick(struct fq *q, unsigned n, int cpu)
{
	unsigned spinners, waiters;

	atomic_thread_fence(memory_order_seq_cst);
	spinners = atomic_load_explicit(&q->spinning, memory_order_seq_cst);
	if (n <= spinners)
		return false;
	waiters = ec_bump_if_waiters(&q->idle);
	/* Waking every sleeper anyway: no need to pick one first. */
	if (waiters)
		wake(q, n - spinners, n - spinners >= waiters ? -1 : cpu);
	return waiters != 0;
}

void fq_submit(struct fq *q, struct fq_work *w, unsigned n)
{
	unsigned i;
	int cpu = -1;

	if (!n)
		return;
	if (!tls_self)
		cpu = note_app_cpu(q);
	FQ_HANDOFF_RELEASE(w);
	for (i = 0; i < n; i++) {
		ring_put(q, w);
	}
	tls_woke = kick(q, n, cpu);
}

/* --------------------------------------------------------------- workers */

static bool take(struct fq *q, struct fq_work **w)
{
	if (!ck_ring_dequeue_mpmc(&q->ring, q->buf, w))
		return false;
	FQ_HANDOFF_ACQUIRE(*w);
	/* The dequeue's move of c_head gave the token's credit back
	 * (argument 1). */
	return true;
}

static void bump(_Atomic uint64_t *c)
{
	/* W: only the owner writes; relaxed so stats can read it. */
	atomic_store_explicit(c,
			      atomic_load_explicit(c, memory_order_relaxed) + 1,
			      memory_order_relaxed);
}

static void run_item(struct fq_worker *self, struct fq_work *w)
{
	w->fn(w);
	bump(&self->items);
}

static void stop_spinning(struct fq *q)
{
	/* seq_cst RMW, then a seq_cst fence: orders our next looks at the
	 * ring after the decrement, against kick()'s fence; load of
	 * `spinning` (argument 3).  On x86 the locked RMW is the fence
	 * already; the fence makes it so in C11 too, for the relaxed ring
	 * loads that follow. */
	atomic_fetch_sub_explicit(&q->spinning, 1, memory_order_seq_cst);
	atomic_thread_fence(memory_order_seq_cst);
}

/*
 * Tokens in the ring, for a decision that must not miss one: c_head, then
 * p_tail, not masked.  ck_ring_size() masks the difference with the
 * ring's size, so a thread stopped between its two loads while exactly a
 * multiple of the size passed through reads 0 with tokens there; here the
 * count is then too high (c_head only grows and p_tail stays ahead of it,
 * so p - c is never below the count when p was read), which wakes a worker
 * for nothing at worst.
 */
static unsigned ring_count(struct fq *q)
{
	unsigned c = ck_pr_load_uint(&q->ring.c_head);

	return ck_pr_load_uint(&q->ring.p_tail) - c;
}

/*
 * A worker that was counted as a spinner took a token and is about to run
 * it, possibly for a long time: producers that counted on it may have left
 * tokens for it, so pass them on (argument 3).  A counted worker calls it
 * after stop_spinning(), whose fence orders this size read after its
 * decrement against the producers' fence in kick(), which follows their
 * enqueue.  (The uncounted app-CPU worker also hands on; nobody relied on
 * it, so that is only a courtesy.)
 */
static void hand_on(struct fq *q)
{
	unsigned left;

	left = ring_count(q) + offered_left(q);
	if (left)
		kick(q, left, -1);
}

void fq_offer_kick(struct fq *q, unsigned n)
{
	kick(q, n, -1);
}

/* W4 of argument 2: sleep while idle.seq == v, with our bit (wake()). */
static void park(struct fq_worker *self, uint32_t v)
{
	/* relaxed: a hint for local_sleeper(); correctness never reads it. */
	atomic_store_explicit(&self->asleep, true, memory_order_relaxed);
	syscall(SYS_futex, (uint32_t *)&self->q->idle.seq,
		FUTEX_WAIT_BITSET_PRIVATE, v, NULL, NULL, worker_bit(self));
	atomic_store_explicit(&self->asleep, false, memory_order_relaxed);
}

/* Run a token taken from an offer: as a ring token taken after spinning
 * (argument 3's hand-on), counted apart for the tests. */
static void run_offer(struct fq_worker *self, struct fq_work *w)
{
	hand_on(self->q);
	bump(&self->offers);
	run_item(self, w);
}

static void *worker_main(void *arg)
{
	struct fq_worker *self = arg;
	struct fq *q = self->q;
	struct fq_work *w;
	uint64_t slept;

	tls_self = self;
	for (;;) {
		uint32_t v;
		bool saw = false;

		if (take(q, &w)) {
			if (self->counted) { /* counted since fq_tail() */
				self->counted = false;
				stop_spinning(q);
				hand_on(q);
			}
			run_item(self, w);
			continue;
		}
		if (app_cpu_worker(self)) {
			/* The worker sharing its CPU with the application
			 * thread spins NOT counted: it runs only when that
			 * thread blocks or yields (e.g. spinning in
			 * fanout_wait), so producers must not rely on it
			 * (argument 3) - they wake a parked worker instead,
			 * which a counted phantom spinner here would prevent. */
			if (self->counted) {
				self->counted = false;
				stop_spinning(q);
			}
			w = spin_for_work(self, true, &saw);
			if (w) {
				run_offer(self, w);
				continue;
			}
		} else {
			/* seq_cst: we are counted as a spinner from here (or
			 * from fq_tail()) until stop_spinning() below. */
			if (!self->counted)
				atomic_fetch_add_explicit(&q->spinning, 1,
							  memory_order_seq_cst);
			self->counted = false;
			w = spin_for_work(self, false, &saw);
			/* We stop counting as a spinner BEFORE announcing
			 * ourselves as a waiter, so every token a producer
			 * left to us precedes the re-check below (arg. 3). */
			stop_spinning(q);
			if (w) { /* an offer's token (argument 7) */
				run_offer(self, w);
				continue;
			}
		}
		if (take(q, &w)) {
			hand_on(q);
			run_item(self, w);
			continue;
		}
		/* The spin ended on a token that another thread (a helping
		 * waiter, the other worker) took first: spin again, as after
		 * an item, rather than park on a lost race.  Parking here
		 * cost a FUTEX_WAKE, an inter-processor interrupt on a VM,
		 * on the next dispatch (bench/PROFILE.txt, phase 8).  The
		 * spin starts over (counted again at the loop's top), so
		 * the spin_ns bound holds from the last token seen. */
		if (saw)
			continue;
		/* An offer still open now may have counted on us: take it
		 * whatever its age rather than park (argument 7). */
		w = offer_take(q, true);
		if (w) {
			run_offer(self, w);
			continue;
		}
		/* Park (argument 2): announce, re-check, sleep. */
		v = fq_ec_prepare(&q->idle);
		if (take(q, &w)) {
			fq_ec_done(&q->idle);
			hand_on(q);
			run_item(self, w);
			continue;
		}
		/* acquire: pairs with the release store in fq_stop(); the ring
		 * is empty here, so a stopping queue is drained (argument 5). */
		if (atomic_load_explicit(&q->stopping, memory_order_acquire)) {
			fq_ec_done(&q->idle);
			break;
		}
		bump(&self->parks);
		FANOUT_PROBE_WORKER_PARK(self->index, self->cpu);
		/* The clock only while a tracer watches worker__wake. */
		slept = FANOUT_PROBE_WORKER_WAKE_ENABLED() ? fq_now_ns() : 0;
		park(self, v);
		fq_ec_done(&q->idle);
		bump(&self->wakeups);
		if (FANOUT_PROBE_WORKER_WAKE_ENABLED())
			FANOUT_PROBE_WORKER_WAKE(
				self->index, slept ? fq_now_ns() - slept : 0);
	}
	tls_self = NULL;
	return NULL;
}

/* The CPUs the process could run on when the library was loaded: the
 * mask of the thread that loaded it (the main thread at start-up, or the
 * one that called dlopen), before the application pinned any thread. */
static cpu_set_t load_mask;
static bool load_mask_known;

__attribute__((constructor)) static void note_load_mask(void)
{
	load_mask_known =
		sched_getaffinity(0, sizeof(load_mask), &load_mask) == 0 &&
		CPU_COUNT(&load_mask) > 0;
}

/* The CPUs the workers may use: those of the calling thread, unless it is
 * pinned to one CPU while the process could use more when the library
 * was loaded.  A dispatcher pinned to its own core is common in latency
 * work; its mask confined every worker to that core, where they took
 * turns with it (a hot single child 13 us instead of 2.1 us here, with
 * ~3 sched_yield switches per delegation). */
static bool worker_mask(cpu_set_t *set)
{
	if (sched_getaffinity(0, sizeof(*set), set))
		return false;
	if (CPU_COUNT(set) == 1 && load_mask_known && CPU_COUNT(&load_mask) > 1)
		*set = load_mask;
	return true;
}

unsigned fq_cpu_count(void)
{
	cpu_set_t set;

	return worker_mask(&set) ? (unsigned)CPU_COUNT(&set) : 0;
}

static unsigned allowed_cpus(int *cpus, unsigned max, cpu_set_t *set)
{
	unsigned n = 0;
	int c;

	if (!worker_mask(set))
		return 0;
	for (c = 0; c < CPU_SETSIZE && n < max; c++)
		if (CPU_ISSET(c, set))
			cpus[n++] = c;
	return n;
}

/* Pinning is set in the attributes, so the thread never runs unpinned and
 * wk->cpu is final before the thread exists. */
static int start_thread(struct fq_worker *wk, const cpu_set_t *mask)
{
	long at =
		atomic_load_explicit(&fq__fail_thread_at, memory_order_relaxed);
	pthread_attr_t attr;
	cpu_set_t set;
	int err;

	if (at > 0 && atomic_fetch_sub(&fq__fail_thread_at, 1) == 1)
		return EAGAIN; /* fault injection: this creation fails */
	if (wk->cpu < 0 && !mask)
		return pthread_create(&wk->thread, NULL, worker_main, wk);
	if (pthread_attr_init(&attr))
		return EAGAIN;
	/* Unpinned: the workers' mask, not a pinned caller's (worker_mask). */
	if (wk->cpu < 0) {
		set = *mask;
	} else {
		CPU_ZERO(&set);
		CPU_SET(wk->cpu, &set);
	}
	pthread_attr_setaffinity_np(&attr, sizeof(set), &set);
	err = pthread_create(&wk->thread, &attr, worker_main, wk);
	pthread_attr_destroy(&attr);
	if (err == EINVAL) { /* the CPU went away: run unpinned */
		wk->cpu = -1;
		err = pthread_create(&wk->thread, NULL, worker_main, wk);
	}
	return err;
}

int fq_thread_attr(const struct fq *q, pthread_attr_t *attr)
{
	struct sched_param prio = {.sched_priority = 0};

	if (pthread_attr_init(attr))
		return -EAGAIN;
	if (q->cpus_known)
		pthread_attr_setaffinity_np(attr, sizeof(q->cpus), &q->cpus);
	pthread_attr_setinheritsched(attr, PTHREAD_EXPLICIT_SCHED);
	pthread_attr_setschedpolicy(attr, SCHED_OTHER);
	pthread_attr_setschedparam(attr, &prio);
	return 0;
}

/* "fanout-w<index>" in top, ps -L, perf and gdb.  Set by the creator, so
 * the name is there when fq_create() returns; a failure (the name is only
 * cosmetic) is ignored. */
static void name_thread(struct fq_worker *wk)
{
	char name[16]; /* the kernel's limit, NUL included */

	snprintf(name, sizeof(name), "fanout-w%u", wk->index);
	(void)pthread_setname_np(wk->thread, name);
}

int fq_create(const struct fq_params *p, struct fq **out)
{
	struct fq *q;
	int cpus[CPU_SETSIZE];
	unsigned ncpus, i;
	cpu_set_t mask;
	int err;

	if (!p || !out || !p->workers || p->slots < 4 ||
	    (p->slots & (p->slots - 1)))
		return -EINVAL;
	fq_clock_init();
	q = fanout__alloc(sizeof(*q));
	if (!q)
		return -ENOMEM;
	memset(q, 0, sizeof(*q));
	q->buf = fanout__alloc(sizeof(*q->buf) * p->slots);
	q->workers = fanout__alloc(sizeof(*q->workers) * p->workers);
	q->offers = fanout__alloc(sizeof(*q->offers) * FQ_OFFERS);
	if (!q->buf || !q->workers || !q->offers) {
		err = -ENOMEM;
		goto out_free;
	}
	memset(q->buf, 0, sizeof(*q->buf) * p->slots);
	memset(q->workers, 0, sizeof(*q->workers) * p->workers);
	memset(q->offers, 0, sizeof(*q->offers) * FQ_OFFERS);
	atomic_init(&q->offers_open, 0);
	ck_ring_init(&q->ring, p->slots);
	q->nworkers = p->workers;
	q->capacity = p->slots - 1;
	q->spin_ns = p->spin_ns;
	atomic_init(&q->reserved, 0);
	atomic_init(&q->limit, q->capacity); /* c_head is 0 */
	fq_ec_init(&q->idle);
	atomic_init(&q->stopping, false);
	atomic_init(&q->app_cpu, -1);
	ncpus = allowed_cpus(cpus, CPU_SETSIZE, &mask);
	q->cpus = mask;
	q->cpus_known = ncpus > 0;
	for (i = 0; i < p->workers; i++) {
		struct fq_worker *wk = &q->workers[i];

		wk->q = q;
		wk->index = i;
		wk->cpu = ncpus && p->pin ? cpus[i % ncpus] : -1;
	}
	for (i = 0; i < p->workers; i++) {
		err = start_thread(&q->workers[i], ncpus ? &mask : NULL);
		if (err) {
			err = -EAGAIN;
			goto out_stop;
		}
		q->workers[i].started = true;
		name_thread(&q->workers[i]);
	}
	*out = q;
	return 0;

out_stop:
	fq_stop(q);
out_free:
	fanout__free(q->offers, sizeof(*q->offers) * FQ_OFFERS);
	fanout__free(q->workers, sizeof(*q->workers) * p->workers);
	fanout__free(q->buf, sizeof(*q->buf) * p->slots);
	fanout__free(q, sizeof(*q));
	return err;
}

void fq_stop(struct fq *q)
{
	unsigned i;

	if (!q || q->stopped)
		return;
	q->stopped = true;
	/* release: pairs with the acquire load in worker_main(); the signal
	 * below is a full barrier before it looks for sleepers. */
	atomic_store_explicit(&q->stopping, true, memory_order_release);
	fq_ec_signal(&q->idle, q->nworkers);
	for (i = 0; i < q->nworkers; i++)
		if (q->workers[i].started)
			pthread_join(q->workers[i].thread, NULL);
}

void fq_free(struct fq *q)
{
	if (!q)
		return;
	fq_stop(q);
	fq_free_forked(q);
}

void fq_free_forked(struct fq *q)
{
	if (!q)
		return;
	fanout__free(q->offers, sizeof(*q->offers) * FQ_OFFERS);
	fanout__free(q->workers, sizeof(*q->workers) * q->nworkers);
	fanout__free(q->buf, sizeof(*q->buf) * (q->capacity + 1));
	fanout__free(q, sizeof(*q));
}

/*
 * The tail (argument 3): the calling worker has run the last user code of
 * its current item and only bounded, non-blocking library code is left
 * (finalising, publishing, freeing).  It counts as a spinner from now on,
 * so a producer woken by what it publishes (a consumer that dispatches
 * again at once) finds it counted and makes no FUTEX_WAKE; the worker
 * checks the ring as soon as the item returns.
 *
 * Not when tokens wait in the ring already: the worker's next look takes
 * one (a plain take, with nothing to hand on, since nobody counted on
 * it), so the count would only cost two locked RMWs of `spinning` (here
 * and in stop_spinning()) on the line every dispatch's kick() reads, and
 * make the worker hand on and kick after its take.  With 16 batches in
 * flight that was most tokens (bench/PROFILE.txt phase 14: batch 8 with 2
 * in flight 8.04 -> 11.77M children/s).  A producer that meanwhile finds
 * no spinner and a parked worker wakes it, for tokens that outnumber the
 * awake workers anyway.
 */
void fq_tail(struct fq *q)
{
	struct fq_worker *self = tls_self;

	if (!self || self->q != q || self->counted)
		return;
	/* Tokens waiting: not counted (see above). */
	if (ck_ring_size(&q->ring) != 0)
		return;
	self->counted = true;
	/* seq_cst: as the increment in worker_main (argument 3). */
	atomic_fetch_add_explicit(&q->spinning, 1, memory_order_seq_cst);
}

/*
 * A helper is never counted in `spinning`, so no producer left a token to it
 * (argument 3): taking one only removes work that someone else would have
 * run; the tokens it leaves behind are covered exactly as before.  A token
 * it hands back goes through fq_reserve() + fq_submit() like any other.
 */
struct fq_work *fq_help_take(struct fq *q)
{
	struct fq_work *w;

	if (tls_self || !take(q, &w))
		return NULL;
	return w;
}

bool fq_pending(const struct fq *q)
{
	return ck_ring_size(&q->ring) != 0;
}

void fq_fork_child(void)
{
	tls_self = NULL; /* else fq_help_take() would never help here */
	tls_woke = false;
}

bool fq_woke_worker(void)
{
	bool woke = tls_woke;

	tls_woke = false;
	return woke;
}

uint64_t fq_spin_ns(const struct fq *q)
{
	return q->spin_ns;
}

int fq_self(const struct fq *q)
{
	struct fq_worker *self = tls_self;

	return self && self->q == q ? (int)self->index : -1;
}

void fq_worker_stats(const struct fq *q, unsigned i, struct fq_worker_stats *st)
{
	const struct fq_worker *wk = &q->workers[i];

	/* relaxed: statistics, written only by their worker (W). */
	st->items = atomic_load_explicit(&wk->items, memory_order_relaxed);
	st->parks = atomic_load_explicit(&wk->parks, memory_order_relaxed);
	st->wakeups = atomic_load_explicit(&wk->wakeups, memory_order_relaxed);
	st->offers = atomic_load_explicit(&wk->offers, memory_order_relaxed);
	st->cpu = wk->cpu;
}
