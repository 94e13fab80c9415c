/* SPDX-License-Identifier: MIT */
/*
 * tests/defer.h - helpers for the v0.2 suites (deferred children,
 * deadlines, join policies, the cancel tree).  Include after common.h's
 * rules: CHECK() off the test thread, gates instead of sleeps.
 *
 * Lifetime rule of these helpers: a batch (struct mbatch) is freed only
 * after fanout_destroy() of every engine that ran it (the workers have
 * exited, so no child fn still touches it) and after every thread that
 * called fanout_run() on it was joined.
 */
#ifndef FANOUT_TESTS_DEFER_H
#define FANOUT_TESTS_DEFER_H

#include "common.h"

struct dq;

/*
 * struct dchild - a child that defers.  Behaviour fields are set before
 * dispatch; the observations are written by the child fn before it stores
 * @deferred (seq_cst), so read them after seeing @deferred != 0.
 */
struct dchild {
	/* behaviour */
	atomic_int *gate;	 /* wait for it before deferring */
	const char *pre_summary; /* set before deferring */
	const char *pre_error;
	double pre_cost;
	bool inline_complete; /* fanout_complete(p, &o) inside fn */
	bool check_after;     /* try set_*()/add_cost()/defer again after */
	int ret;	      /* fn's return after deferring; 0: -EINPROGRESS */
	struct fanout_outcome o; /* the outcome dc_complete()/inline use */
	void (*on_cancel)(struct fanout_pending *, void *);
	void *on_cancel_arg;   /* registered from inside fn */
	struct dq *q;	       /* push this dchild once deferred */
	atomic_int *cur, *max; /* pending-at-once meter, entered on defer */
	atomic_int *started;   /* counts fn entries (may be NULL) */
	/* observations */
	_Atomic(struct fanout_pending *) p;
	atomic_int deferred; /* 1 once deferred (and p stored), -1 failed */
	atomic_int runs;
	unsigned index, depth;
	fanout_id id;
	pthread_t thread;
	int inline_rc;
	int on_cancel_rc;
	int after_summary_rc, after_error_rc, after_cost_rc;
	int defer2_errno;
	bool defer2_null;
};

/* A locked FIFO of deferred children, for completer threads. */
struct dq {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct dchild **v;
	unsigned head, tail, cap;
};

static inline void dq_init(struct dq *q, unsigned cap)
{
	memset(q, 0, sizeof(*q));
	pthread_mutex_init(&q->mu, NULL);
	pthread_cond_init(&q->cv, NULL);
	q->v = calloc(cap, sizeof(*q->v));
	assert_non_null(q->v);
	q->cap = cap;
}

static inline void dq_fini(struct dq *q)
{
	pthread_mutex_destroy(&q->mu);
	pthread_cond_destroy(&q->cv);
	free(q->v);
}

static inline void dq_push(struct dq *q, struct dchild *d)
{
	pthread_mutex_lock(&q->mu);
	CHECK(q->tail < q->cap);
	if (q->tail < q->cap)
		q->v[q->tail++] = d;
	pthread_cond_broadcast(&q->cv);
	pthread_mutex_unlock(&q->mu);
}

/* The next deferred child; NULL after @ms without one. */
static inline struct dchild *dq_pop(struct dq *q, int ms)
{
	struct timespec ts = realtime_in_ms(ms);
	struct dchild *d = NULL;

	pthread_mutex_lock(&q->mu);
	while (q->head == q->tail)
		if (pthread_cond_timedwait(&q->cv, &q->mu, &ts) == ETIMEDOUT)
			break;
	if (q->head != q->tail)
		d = q->v[q->head++];
	pthread_mutex_unlock(&q->mu);
	return d;
}

static inline int defer_fn(struct fanout_child *c, void *arg)
{
	struct dchild *d = arg;
	struct fanout_pending *p;

	atomic_fetch_add(&d->runs, 1);
	if (d->started)
		atomic_fetch_add(d->started, 1);
	d->index = fanout_child_index(c);
	d->depth = fanout_child_depth(c);
	d->id = fanout_child_id(c);
	d->thread = pthread_self();
	if (d->gate)
		CHECK(wait_flag(d->gate, GATE_MS));
	if (d->pre_summary)
		CHECK(fanout_set_summary(c, d->pre_summary,
					 strlen(d->pre_summary)) == 0);
	if (d->pre_error)
		CHECK(fanout_set_error(c, d->pre_error) == 0);
	if (d->pre_cost > 0)
		CHECK(fanout_add_cost(c, d->pre_cost) == 0);
	p = fanout_defer(c);
	CHECK(p != NULL);
	if (!p) {
		atomic_store(&d->deferred, -1);
		return -EIO;
	}
	if (d->check_after) {
		struct fanout_pending *p2;

		d->after_summary_rc = fanout_set_summary(c, "late", 4);
		d->after_error_rc = fanout_set_error(c, "late");
		d->after_cost_rc = fanout_add_cost(c, 1.0);
		errno = 0;
		p2 = fanout_defer(c);
		d->defer2_null = p2 == NULL;
		d->defer2_errno = errno;
	}
	if (d->cur)
		meter_enter(d->cur, d->max);
	if (d->on_cancel)
		d->on_cancel_rc = fanout_pending_on_cancel(p, d->on_cancel,
							   d->on_cancel_arg);
	/* after @deferred is set, the test may free @d: use locals */
	int ret = d->ret ? d->ret : -EINPROGRESS;
	struct dq *q = d->q;

	if (d->inline_complete) {
		d->inline_rc = fanout_complete(p, &d->o);
		atomic_store(&d->deferred, 1);
		return ret;
	}
	atomic_store(&d->p, p);
	atomic_store(&d->deferred, 1);
	if (q)
		dq_push(q, d);
	return ret;
}

/* Wait until @d deferred; its pending child. */
static inline struct fanout_pending *dc_wait(struct dchild *d)
{
	CHECK(wait_flag(&d->deferred, WAIT_MS));
	CHECK(atomic_load(&d->deferred) == 1);
	return atomic_load(&d->p);
}

/* Complete @d with its own outcome. */
static inline int dc_complete(struct dchild *d)
{
	struct fanout_pending *p = dc_wait(d);

	if (!p)
		return -ENOENT;
	return fanout_complete(p, &d->o);
}

/* Dispatch @b to @e and return its id (asserting success). */
static inline fanout_id must_dispatch_b(struct fanout_engine *e,
					const struct fanout_batch *b)
{
	fanout_id id = 0;

	assert_int_equal(fanout_dispatch(e, b, &id), 0);
	assert_true(id != 0);
	return id;
}

/* --------------------------------------------------------- mixed batch */

/*
 * A batch of n children, each a struct dchild (defer_fn) unless switched
 * to a struct probe (probe_fn, tests/common.h) with mb_sync().
 */
struct mbatch {
	struct fanout_batch b;
	struct fanout_task *tasks;
	struct dchild *d;
	struct probe *pr;
	char (*goals)[GOAL_LEN];
	unsigned n;
};

static inline struct mbatch *mb_new(unsigned n)
{
	struct mbatch *mb = calloc(1, sizeof(*mb));

	assert_non_null(mb);
	mb->n = n;
	mb->tasks = calloc(n, sizeof(*mb->tasks));
	mb->d = calloc(n, sizeof(*mb->d));
	mb->pr = calloc(n, sizeof(*mb->pr));
	mb->goals = calloc(n, sizeof(*mb->goals));
	assert_non_null(mb->tasks);
	assert_non_null(mb->d);
	assert_non_null(mb->pr);
	assert_non_null(mb->goals);
	for (unsigned i = 0; i < n; i++) {
		snprintf(mb->goals[i], GOAL_LEN, "job-%u", i);
		mb->tasks[i] =
			(struct fanout_task){mb->goals[i], defer_fn, &mb->d[i]};
	}
	mb->b.tasks = mb->tasks;
	mb->b.ntasks = n;
	return mb;
}

/* Make child @i an ordinary (synchronous) probe child. */
static inline struct probe *mb_sync(struct mbatch *mb, unsigned i)
{
	mb->tasks[i].fn = probe_fn;
	mb->tasks[i].arg = &mb->pr[i];
	return &mb->pr[i];
}

static inline void mb_free(struct mbatch *mb)
{
	if (!mb)
		return;
	free(mb->tasks);
	free(mb->d);
	free(mb->pr);
	free(mb->goals);
	free(mb);
}

/* --------------------------------------------------- on_cancel recorder */

struct cbrec {
	atomic_int calls;
	pthread_t thread;
	struct fanout_pending *p;
	bool complete; /* fanout_complete(p, &o) from the callback */
	struct fanout_outcome o;
	int complete_rc;
};

static inline void cb_fn(struct fanout_pending *p, void *arg)
{
	struct cbrec *r = arg;

	r->thread = pthread_self();
	r->p = p;
	if (r->complete)
		r->complete_rc = fanout_complete(p, &r->o);
	atomic_fetch_add(&r->calls, 1);
}

/* ------------------------------------------------------------- helpers */

/* Poll fanout_lookup until @pred holds for the snapshot; fail after WAIT_MS. */
#define WAIT_INFO(e, id, info, pred)                                           \
	do {                                                                   \
		uint64_t end_ = mono_ms() + WAIT_MS;                           \
		for (;;) {                                                     \
			assert_int_equal(fanout_lookup((e), (id), &(info)),    \
					 0);                                   \
			if (pred)                                              \
				break;                                         \
			assert_true(mono_ms() < end_);                         \
			sleep_us(100);                                         \
		}                                                              \
	} while (0)

/* Every result sits at its index and was counted once in the totals. */
static inline void check_shape(const struct fanout_event *ev, unsigned n)
{
	unsigned c = 0, er = 0, in = 0;

	assert_non_null(ev);
	assert_int_equal(ev->nresults, n);
	for (unsigned i = 0; i < n; i++) {
		const struct fanout_result *r = &ev->results[i];

		assert_int_equal(r->index, i);
		switch (r->status) {
		case FANOUT_COMPLETED:
			c++;
			break;
		case FANOUT_ERROR:
			er++;
			break;
		case FANOUT_INTERRUPTED:
			in++;
			break;
		default:
			fail_msg("result %u has status %d", i, r->status);
		}
	}
	assert_int_equal(ev->ncompleted, c);
	assert_int_equal(ev->nerror, er);
	assert_int_equal(ev->ninterrupted, in);
	if (c)
		assert_int_equal(ev->status, FANOUT_COMPLETED);
	else if (in == n)
		assert_int_equal(ev->status, FANOUT_INTERRUPTED);
	else
		assert_int_equal(ev->status, FANOUT_ERROR);
}

/* A child that loops until interrupted and returns -ECANCELED; counts
 * starts in *arg (an atomic_int), may be NULL. */
static inline int spin_fn(struct fanout_child *c, void *arg)
{
	uint64_t end = mono_ms() + GATE_MS;

	if (arg)
		atomic_fetch_add((atomic_int *)arg, 1);
	while (!fanout_interrupted(c) && mono_ms() < end)
		sleep_us(50);
	CHECK(fanout_interrupted(c));
	return -ECANCELED;
}

/* TEST_FILTER / TEST_SKIP (cmocka glob patterns) select tests by name. */
static inline void tc_filters(void)
{
	if (getenv("TEST_FILTER"))
		cmocka_set_test_filter(getenv("TEST_FILTER"));
	if (getenv("TEST_SKIP"))
		cmocka_set_skip_filter(getenv("TEST_SKIP"));
}

#endif /* FANOUT_TESTS_DEFER_H */
