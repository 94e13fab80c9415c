/* SPDX-License-Identifier: MIT */
/*
 * fq.h - the work queue under fanout: pinned workers, a Concurrency Kit
 * MPMC ring, spin-then-park idling, admission credits, help-while-wait.
 *
 * It knows nothing about delegations.  A unit of work is a struct fq_work
 * embedded in the caller's object; the ring carries pointers to it.  The same
 * work item may be enqueued several times at once (one *token* per worker
 * that may help with it); each dequeued token calls w->fn(w) once.  Making
 * those calls idempotent and freeing the object after the last token is the
 * caller's business.
 *
 * Legend (kernel style): I: set at init, read-only after.  A: atomic.
 * W: touched only by the owning worker thread.
 *
 * Which operations may run concurrently (yes = any number of threads, in
 * any mix, without external synchronisation):
 *
 *                      reserve submit unreserve offer ec_*  stop  init/free
 *   fq_reserve          yes     yes    yes       yes   yes   yes   no
 *   fq_submit           yes     yes    yes       yes   yes   no(1) no
 *   fq_unreserve        yes     yes    yes       yes   yes   yes   no
 *   fq_offer_*          yes     yes    yes       yes   yes   no(1) no
 *   fq_ec_* (one ec)    yes     yes    yes       yes   yes   yes   no
 *   fq_stop             yes     no(1)  yes       no(1) yes   no    no
 *   (1) the caller must know no submit is in progress or will follow; the
 *       user of the queue guarantees it (fanout finishes every
 *       delegation first).
 *
 * Memory ordering: fq_submit() is a release of everything written before it
 * to the thread that runs each token (the ring's enqueue/dequeue pair, see
 * fq.c); fq_ec_signal() is a full barrier before the waiters are looked at.
 */
#ifndef FANOUT_QUEUE_FQ_H
#define FANOUT_QUEUE_FQ_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "clock.h"

#define FQ_CACHELINE 64

struct fq;
struct fq_work;

typedef void (*fq_fn)(struct fq_work *w);

/* A work item; embed it and recover the container in fn. */
struct fq_work {
	fq_fn fn; /* I: set before the first submit */
};

/*
 * An eventcount: "sleep until something changes".  A waiter announces itself
 * (prepare), re-checks its condition, then sleeps on the sequence it read; a
 * signaller changes the condition, bumps the sequence and wakes only if a
 * waiter announced itself.  No lost wakeup: see the argument in fq.c.
 */
struct fq_ec {
	_Atomic uint32_t seq; /* A: bumped by every signal; the futex word */
	_Atomic uint32_t waiters; /* A: threads between prepare and done */
};

static inline void fq_ec_init(struct fq_ec *ec)
{
	atomic_init(&ec->seq, 0);
	atomic_init(&ec->waiters, 0);
}
uint32_t fq_ec_prepare(struct fq_ec *ec);
/* Sleep while seq == v, at most until deadline_ns (0 = forever).
 * Returns false on timeout. */
bool fq_ec_wait(struct fq_ec *ec, uint32_t v, uint64_t deadline_ns);
void fq_ec_done(struct fq_ec *ec);
void fq_ec_signal(struct fq_ec *ec, unsigned nwake);
/*
 * fq_ec_signal() for a signaller whose state change (P1) was itself a
 * full-barrier RMW, e.g. an exchange that enqueues.  It reads `waiters`
 * first (P3) and bumps `seq` (P2) and wakes only when someone waits, so
 * the common signal with no sleeper issues no second locked instruction.
 * Still no lost wakeup: if P3 reads 0, then P1 < P3 < W1 < W3 and the
 * waiter's re-check sees P1; if P3 reads the waiter's announcement, P2
 * follows it and either W2 read the old seq (FUTEX_WAIT returns at once or
 * is woken) or W2 read the new one, after P2 and so after P1, and W3 sees
 * P1 (argument 2 in fq.c, whose kick() does the same after a fence).
 */
void fq_ec_signal_after_rmw(struct fq_ec *ec, unsigned nwake);

/*
 * A producer that will call fq_reserve() and fq_submit() soon: start
 * fetching the lines they write (the credits, the ring's producer
 * counters) and the one they read (`spinning`, which kick() loads; not
 * the ring's consumer counter, which the enqueue no longer reads and
 * whose copy would cost the workers' next dequeue an invalidation,
 * bench/PROFILE.txt phase 15).  Workers write or read them around every
 * token, so each is a miss, and behind locked instructions those misses
 * come one after another; prefetched together and early they overlap
 * each other and the caller's own work (dispatch of a batch of 64, slow
 * host: 3,000-3,400 -> 1,600-2,000 ticks; bench/PROFILE.txt phase 13).
 * Only a hint: nothing depends on it.
 */
void fq_prefetch_submit(struct fq *q);

/*
 * A one-shot completion word for a synchronous join: 0 pending, 1 done,
 * 2 pending with a sleeper.  fq_done_signal() is a release; fq_done_wait()
 * returns with acquire ordering once it is done.
 */
void fq_done_signal(_Atomic uint32_t *word);
void fq_done_wait(_Atomic uint32_t *word, uint64_t spin_ns);

struct fq_params {
	unsigned workers; /* >= 1 */
	bool pin;	  /* pin worker i to the i-th CPU of fq_cpu_count's */
	unsigned slots;	  /* ring size, power of two >= 4 */
	uint64_t spin_ns; /* idle spin before parking */
};

struct fq_worker_stats {
	uint64_t items; /* tokens run */
	uint64_t parks;
	uint64_t wakeups;
	uint64_t offers; /* tokens taken from offers (fq_offer_open) */
	int cpu;
};

/* How many CPUs workers may use: the calling thread's, or the process's
 * at load time when the caller is pinned to one CPU (fq.c, worker_mask);
 * 0 if unknown. */
unsigned fq_cpu_count(void);
/* Create and start.  0, -ENOMEM, -EAGAIN (thread creation failed: the
 * threads already started are stopped and everything is freed). */
int fq_create(const struct fq_params *p, struct fq **out);
/* Drain the ring, stop and join the workers.  Idempotent. */
void fq_stop(struct fq *q);
/* fq_stop() then free.  NULL is a no-op. */
void fq_free(struct fq *q);
/* Free a queue inherited across fork() by the child: its workers do not
 * exist in this process, so nothing is stopped or joined; tokens left in
 * the ring are dropped unrun.  NULL is a no-op. */
void fq_free_forked(struct fq *q);

/*
 * Take between @min and @want ring credits (one per token to submit).
 * Returns how many were taken, 0 if fewer than @min were free.  A credit is
 * given back when a worker dequeues the token, or by fq_unreserve().
 */
unsigned fq_reserve(struct fq *q, unsigned want, unsigned min);
void fq_unreserve(struct fq *q, unsigned n);
/* Enqueue @n tokens of @w (n credits must be held); wakes up to n parked
 * workers.  Never fails. */
void fq_submit(struct fq *q, struct fq_work *w, unsigned n);

/*
 * Work-first offers (fq.c, argument 7), for a thread that is about to run
 * @w itself and would accept help: fq_offer_open() publishes @n tokens of
 * @w where SPINNING workers look, without waking anyone and without ring
 * credits.  A spinner takes one only once the offer is FQ_OFFER_HOLD_NS
 * old (or when it is about to park), so a short batch is finished by its
 * caller alone and no cache line crosses cores for it.  Returns the offer's
 * slot, or -1 when every slot is in use (submit to the ring instead).
 * fq_spinners() then says whether a spinner is counted: if not, nobody
 * may ever look at the offer, and the caller closes it and submits the
 * tokens to the ring (which wakes parked workers).  fq_offer_close()
 * withdraws the offer and returns how many tokens nobody took; each taken
 * token calls w->fn(w) once, on a worker, like a ring token.  @t0: when
 * the offer's age starts, an fq_cycles() reading the caller took just
 * before (one tick read fewer), or 0 to read one.
 */
#define FQ_OFFER_HOLD_NS 2000
int fq_offer_open(struct fq *q, struct fq_work *w, unsigned n, uint64_t t0);
bool fq_spinners(struct fq *q);
/* After an offer of @n tokens was kept open: wake as many parked workers
 * as the spinners cannot cover, as fq_submit() does for ring tokens
 * (a batch whose children wait for each other still gets them all
 * running at once); they join once the offer is old enough. */
void fq_offer_kick(struct fq *q, unsigned n);
unsigned fq_offer_close(struct fq *q, int slot);

/*
 * Help-while-wait for a thread with nothing else to do while it waits for
 * something the queue's work will produce: take ONE token
 * from the ring, for the caller to run (or hand back with fq_reserve +
 * fq_submit).  NULL, having done nothing, when the ring is empty or the
 * caller is a worker of @q.
 */
struct fq_work *fq_help_take(struct fq *q);
/* Called by a worker's item once no user code is left to run in it: the
 * worker counts as a spinner from now on (fq.c, argument 3).  A no-op on
 * any other thread. */
void fq_tail(struct fq *q);
/* Whether tokens wait in the ring (a relaxed hint for a helper's spin). */
bool fq_pending(const struct fq *q);
/* Whether this thread's last submit had to wake a parked worker (no
 * counted spinner covered its tokens): the worker pinned to this thread's
 * CPU, which then waits for this CPU, or another, which on a virtual
 * machine runs tens of us later.  Reading it clears it.  A hint for a
 * waiter's patience (lib/sink.c). */
bool fq_woke_worker(void);
/* In a process just forked (its one thread): this thread is no worker of
 * any queue, whatever it was in the parent (a child task that forked on a
 * worker); lib/fork.c calls it. */
void fq_fork_child(void);
/* Attributes for a helper thread of the engine (the deadline timer): the
 * workers' CPUs (not those of whichever thread starts it: a pinned
 * worker's child, a dispatcher pinned to its own core) and the normal
 * policy (not SCHED_IDLE or a real-time one inherited from it).  0, or
 * -EAGAIN; destroy @attr after use. */
int fq_thread_attr(const struct fq *q, pthread_attr_t *attr);

uint64_t fq_spin_ns(const struct fq *q);
/* Index of the calling worker thread of @q, or -1 if it is not one. */
int fq_self(const struct fq *q);
void fq_worker_stats(const struct fq *q, unsigned i,
		     struct fq_worker_stats *st);
/* Injection point for fault tests: the k-th pthread_create fails. */
extern _Atomic long fq__fail_thread_at;

/*
 * One step of a spin-wait by a thread that waits for work of the queue to
 * finish, i = the iteration count.  A pause, and every 64th
 * step a sched_yield(): with more runnable threads than CPUs (a 2-core box
 * running two workers and the application), a waiter must not keep the
 * worker that would finish its work off the CPU.  When nothing else is
 * runnable on this CPU, sched_yield() returns at once.  Workers use a
 * slower variant (fq.c, spin_for_work).
 */
void fq_spin_relax(unsigned i);
/* Note that the calling thread (not a worker) is about to spin waiting
 * for the queue's work: the worker pinned to its CPU yields to it at every
 * spin step and is not counted as a spinner (fq.c, spin_for_work).  A
 * hint. */
void fq_note_app_cpu(struct fq *q);

#endif
