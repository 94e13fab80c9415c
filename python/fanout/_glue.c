/* SPDX-License-Identifier: MIT */
/*
 * _glue.c - the C half of the Python package (compiled into fanout._fanout
 * together with the library's own sources; see fanout_build.py).
 *
 * No Python code runs on a fanout worker thread.  A Python child (an
 * `async def` or a plain function) is, to the library, the C child
 * pyfo_defer_child(): it defers itself (fanout_defer), hands the pending
 * child to the event loop through a lock-free stack and an eventfd, and
 * returns -EINPROGRESS, so its worker moves on at once.  The loop takes
 * the stack (pyfo_take), starts the coroutine or the thread, and later calls
 * fanout_complete() itself.  An interrupt from the library (cancel,
 * deadline, join policy, shutdown, cancel tree) reaches the loop the same
 * way: pyfo_on_cancel(), run on the interrupting thread, pushes a note and
 * the loop cancels the coroutine.
 *
 * Both stacks are Treiber stacks with one consumer (the loop thread) that
 * takes the whole stack with one exchange, so there is no ABA: nothing is
 * read through a node the consumer does not own.  A push that finds the
 * stack empty writes the eventfd; the consumer reads the eventfd BEFORE it
 * takes the stacks, so a push after the take is never without a wakeup.
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "fanout.h"

struct pyfo_node {
	struct pyfo_node *next;
	struct fanout_pending *p;
	uint64_t token;
	fanout_id id;
	unsigned index;
};

struct pyfo_glue {
	_Atomic(struct pyfo_node *) starts;
	_Atomic(struct pyfo_node *) cancels;
	_Atomic int rescan; /* a cancel note could not be allocated */
	int efd;
	/* Consumer-private: what pyfo_take() took but could not return yet,
	 * oldest first. */
	struct pyfo_node *start_left, *cancel_left;
};

/* What a Python child's fanout_task.arg points to: one per batch, owned by
 * the Python side until the batch's event is in (no child fn of the batch
 * can run after that; the fn reads it before it defers). */
struct pyfo_batch {
	struct pyfo_glue *g;
	uint64_t token;
};

/* What pyfo_take() returns per started child or cancel note. */
struct pyfo_start {
	struct fanout_pending *p;
	uint64_t token;
	fanout_id id;
	unsigned index;
};

static void wake(struct pyfo_glue *g)
{
	uint64_t one = 1;
	ssize_t n;

	do
		n = write(g->efd, &one, sizeof(one));
	while (n < 0 && errno == EINTR);
	/* EAGAIN: the counter is saturated, so the fd is readable anyway. */
}

static __attribute__((unused)) void
push(struct pyfo_glue *g, _Atomic(struct pyfo_node *) *top, struct pyfo_node *n)
{
	struct pyfo_node *old = atomic_load_explicit(top, memory_order_relaxed);

	/* release: pairs with the acquire exchange in take_all(), so the
	 * node's fields are visible to the loop. */
	do
		n->next = old;
	while (!atomic_compare_exchange_weak_explicit(
		top, &old, n, memory_order_release, memory_order_relaxed));
	if (!old)
		wake(g);
}

struct pyfo_glue *pyfo_glue_new(void)
{
	struct pyfo_glue *g = calloc(1, sizeof(*g));

	if (!g)
		return NULL;
	g->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (g->efd < 0) {
		free(g);
		return NULL;
	}
	atomic_init(&g->starts, NULL);
	atomic_init(&g->cancels, NULL);
	atomic_init(&g->rescan, 0);
	return g;
}

int pyfo_glue_fd(struct pyfo_glue *g)
{
	return g->efd;
}

static void free_list(struct pyfo_node *n)
{
	while (n) {
		struct pyfo_node *next = n->next;

		free(n);
		n = next;
	}
}

/* Free start notes nobody took, releasing each pending child: every
 * fanout_defer() needs its one fanout_complete() (which releases p unless
 * it says -EINVAL, for a bad outcome).  Returns how many it released. */
static size_t release_starts(struct pyfo_node *n)
{
	size_t k = 0;

	while (n) {
		struct pyfo_node *next = n->next;
#if PYFO_HAVE_DEFER
		struct fanout_outcome o = {.code = -ECANCELED};

		k += fanout_complete(n->p, &o) != -EINVAL;
#endif
		free(n);
		n = next;
	}
	return k;
}

/*
 * After fanout_destroy(): no thread can push any more.  A start note may
 * still be here: a worker's fanout_defer() that found its delegation
 * abandoned (by the close) publishes the event before the note is pushed,
 * so the loop can take the event, finish closing and stop reading notes
 * first.  Its pending child was finished by the library (abandoned, or by
 * the shutdown in fanout_destroy), so fanout_complete() only releases it.
 * Returns the number of pending children it released.
 */
size_t pyfo_glue_free(struct pyfo_glue *g)
{
	size_t n;

	if (!g)
		return 0;
	n = release_starts(g->start_left) +
	    release_starts(atomic_exchange(&g->starts, NULL));
	free_list(atomic_exchange(&g->cancels, NULL));
	free_list(g->cancel_left);
	close(g->efd);
	free(g);
	return n;
}

#if PYFO_HAVE_DEFER
static void pyfo_on_cancel(struct fanout_pending *p, void *arg)
{
	struct pyfo_glue *g = arg;
	struct pyfo_node *n = malloc(sizeof(*n));

	if (!n) {
		/* relaxed: the eventfd write below orders it for the loop. */
		atomic_store_explicit(&g->rescan, 1, memory_order_relaxed);
		wake(g);
		return;
	}
	n->p = p;
	n->token = 0;
	n->id = fanout_pending_id(p);
	n->index = fanout_pending_index(p);
	push(g, &g->cancels, n);
}

/* The fanout_fn of every Python child. */
int pyfo_defer_child(struct fanout_child *c, void *arg)
{
	/* Read the batch before deferring: once deferred, the delegation may
	 * be abandoned and its batch released. */
	struct pyfo_batch *b = arg;
	struct pyfo_glue *g = b->g;
	struct pyfo_node *n = malloc(sizeof(*n));

	if (!n)
		return -ENOMEM;
	n->token = b->token;
	n->id = fanout_child_id(c);
	n->index = fanout_child_index(c);
	n->p = fanout_defer(c);
	if (!n->p) {
		int err = errno ? errno : ENOMEM;

		free(n);
		return -err;
	}
	/* -EALREADY (finished meanwhile) and 0 both leave nothing to do:
	 * the loop looks at fanout_pending_interrupted() when it starts the
	 * child.  The callback may run here, at once, if the delegation was
	 * interrupted already. */
	fanout_pending_on_cancel(n->p, pyfo_on_cancel, g);
	push(g, &g->starts, n);
	return -EINPROGRESS;
}
#else
/* A library without fanout_defer(): Python children cannot run. */
int pyfo_defer_child(struct fanout_child *c, void *arg)
{
	(void)c, (void)arg;
	return -ENOSYS;
}
#endif

/*
 * Inline runs (fanout_run on a thread of the Python side).  The task
 * awaiting one may be cancelled before the run is in the table, where a
 * cancel by id cannot find it.  Each C child of the run is started through
 * pyfo_run_child(), which stores the run's id and then looks at the
 * cancelled flag; pyfo_run_cancel() stores the flag and then looks at the
 * id.  Store-buffering with seq_cst on both sides: at least one of them
 * sees the other, so either the canceller gets the id and cancels the run,
 * or the child cancels its own run, and no C child runs its fn after a
 * cancel that missed the id.  (Python children of the run are cancelled
 * by the loop when their start note arrives, see _start.)  Both structs
 * are allocated zeroed by the Python side (ffi.new).
 */
struct pyfo_run {
	struct fanout_engine *e; /* I */
	_Atomic int cancelled;
	_Atomic fanout_id id; /* 0 until a C child of the run starts */
};

/* A C child of an inline run: its own fn and arg, and the run. */
struct pyfo_cwrap {
	fanout_fn fn;
	void *arg;
	struct pyfo_run *run;
};

/* The fanout_fn of every C child of an inline run. */
int pyfo_run_child(struct fanout_child *c, void *arg)
{
	struct pyfo_cwrap *w = arg;
	struct pyfo_run *r = w->run;
	fanout_id id = fanout_child_id(c);

	/* seq_cst (both): the store-load pair against pyfo_run_cancel(). */
	atomic_store_explicit(&r->id, id, memory_order_seq_cst);
	if (atomic_load_explicit(&r->cancelled, memory_order_seq_cst)) {
		fanout_cancel(r->e, id,
			      FANOUT_CANCEL_PENDING | FANOUT_CANCEL_INTERRUPT
#ifdef FANOUT_CANCEL_ABANDON
				      | FANOUT_CANCEL_ABANDON
#endif
		);
		return -ECANCELED;
	}
	return w->fn(c, w->arg);
}

/* Loop thread: the task awaiting the run was cancelled.  Returns the run's
 * id for the caller to cancel, or 0 when no C child of it has started yet
 * (each one that starts from now on cancels the run). */
fanout_id pyfo_run_cancel(struct pyfo_run *r)
{
	/* seq_cst (both): the store-load pair against pyfo_run_child(). */
	atomic_store_explicit(&r->cancelled, 1, memory_order_seq_cst);
	return atomic_load_explicit(&r->id, memory_order_seq_cst);
}

/* Reverse a taken stack: oldest first. */
static struct pyfo_node *reverse(struct pyfo_node *n)
{
	struct pyfo_node *r = NULL;

	while (n) {
		struct pyfo_node *next = n->next;

		n->next = r;
		r = n;
		n = next;
	}
	return r;
}

static size_t take_from(_Atomic(struct pyfo_node *) *top,
			struct pyfo_node **left, struct pyfo_start *out,
			size_t cap)
{
	size_t k = 0;

	if (!*left)
		/* acquire: pairs with the release CAS in push(). */
		*left = reverse(atomic_exchange_explicit(top, NULL,
							 memory_order_acquire));
	while (*left && k < cap) {
		struct pyfo_node *n = *left;

		*left = n->next;
		out[k].p = n->p;
		out[k].token = n->token;
		out[k].id = n->id;
		out[k].index = n->index;
		k++;
		free(n);
	}
	return k;
}

/*
 * Loop thread only.  Clears the eventfd, then returns up to @cap started
 * children in @starts (*nstarts) and up to @cap cancel notes in @cancels
 * (*ncancels).  Return: 1 when more may be left (call again), 0 when both
 * stacks were empty at the take; 2 when a cancel note was lost to ENOMEM
 * and every running child must be checked with fanout_pending_interrupted.
 */
int pyfo_take(struct pyfo_glue *g, struct pyfo_start *starts, size_t *nstarts,
	      struct pyfo_start *cancels, size_t *ncancels, size_t cap)
{
	uint64_t v;
	int more;

	if (read(g->efd, &v, sizeof(v)) < 0 && errno != EAGAIN)
		return -errno;
	*nstarts = take_from(&g->starts, &g->start_left, starts, cap);
	*ncancels = take_from(&g->cancels, &g->cancel_left, cancels, cap);
	/* The stacks are taken only once what was left is used up, and the
	 * read above consumed the wakeup of any push onto an empty stack
	 * since then: look at them too, or that push is never seen. */
	more = g->start_left || g->cancel_left ||
	       /* relaxed: only a look; the exchange next call acquires. */
	       atomic_load_explicit(&g->starts, memory_order_relaxed) ||
	       atomic_load_explicit(&g->cancels, memory_order_relaxed);
	if (more)
		wake(g); /* keep the fd readable for the rest */
	/* relaxed: set before the eventfd write we just consumed. */
	if (atomic_exchange_explicit(&g->rescan, 0, memory_order_relaxed))
		return 2;
	return more;
}

/* -------------------------------------------------- C children for tests
 * and benchmarks: real children that run on the workers. */

/* arg: nothing.  Completes at once. */
int pyfo_child_noop(struct fanout_child *c, void *arg)
{
	(void)c, (void)arg;
	return 0;
}

/* arg: points to a uint64_t count of nanoseconds to busy-wait; polls
 * fanout_interrupted() and returns -ECANCELED when it turns true. */
int pyfo_child_spin(struct fanout_child *c, void *arg)
{
	uint64_t until = fanout_now_ns() + *(const uint64_t *)arg;

	while (fanout_now_ns() < until)
		if (fanout_interrupted(c))
			return -ECANCELED;
	return fanout_set_summary(c, "spun", 4);
}

/* arg: points to a uint64_t count of nanoseconds to sleep, in 1 ms steps,
 * polling fanout_interrupted(). */
int pyfo_child_sleep(struct fanout_child *c, void *arg)
{
	uint64_t until = fanout_now_ns() + *(const uint64_t *)arg;
	struct timespec ms = {0, 1000000};

	while (fanout_now_ns() < until) {
		if (fanout_interrupted(c))
			return -ECANCELED;
		nanosleep(&ms, NULL);
	}
	return fanout_set_summary(c, "slept", 5);
}

/* arg: points to a uint64_t counter; increments it in a loop (1 ms sleeps)
 * until the delegation is interrupted or the counter at arg + 1 is
 * non-zero (a stop flag); returns how many steps it made as summary. */
int pyfo_child_tick(struct fanout_child *c, void *arg)
{
	_Atomic uint64_t *counter = arg;
	struct timespec ms = {0, 1000000};
	char buf[32];
	uint64_t n = 0;

	/* relaxed: a progress counter and a stop flag for the test thread;
	 * no other memory hangs on them. */
	while (!atomic_load_explicit(&counter[1], memory_order_relaxed)) {
		if (fanout_interrupted(c))
			return -ECANCELED;
		atomic_fetch_add_explicit(&counter[0], 1, memory_order_relaxed);
		n++;
		nanosleep(&ms, NULL);
	}
	return fanout_set_summary(c, buf,
				  (size_t)snprintf(buf, sizeof(buf), "%llu",
						   (unsigned long long)n));
}

/* A relaxed read of a counter another thread bumps (for pyfo_child_tick). */
uint64_t pyfo_load(const void *p)
{
	return atomic_load_explicit((const _Atomic uint64_t *)p,
				    memory_order_relaxed);
}

void pyfo_store(void *p, uint64_t v)
{
	atomic_store_explicit((_Atomic uint64_t *)p, v, memory_order_relaxed);
}
