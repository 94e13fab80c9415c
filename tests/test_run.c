/* SPDX-License-Identifier: MIT */
/* test_run.c - fanout_run: synchronous join, nesting, depth, helping. */
#include "common.h"
#include "fanout_testing.h"

static void run_returns_event(void **state)
{
	struct fanout_engine *e =
		NEW_ENGINE(.workers = 2, .flags = FANOUT_NO_PIN);
	struct fanout_sink *s = NULL;
	struct tbatch *tb = tb_new(6);
	struct fanout_event *ev = NULL;
	int user;

	assert_int_equal(fanout_sink_create(e, &s), 0);
	tb->b.sink = s; /* ignored by fanout_run */
	tb->b.user = &user;
	tb->b.context = "ctx";
	tb->b.session_key = "key";
	for (unsigned i = 0; i < 6; i++)
		tb->probes[i].cost = 1.0;
	assert_int_equal(fanout_run(e, &tb->b, &ev), 0);
	assert_non_null(ev);
	assert_true(ev->id != 0);
	check_all_completed(ev, tb);
	for (unsigned i = 0; i < 6; i++)
		assert_int_equal(tb->probes[i].plain, 1234);
	assert_ptr_equal(ev->user, &user);
	assert_string_equal(ev->context, "ctx");
	assert_string_equal(ev->session_key, "key");
	assert_float_equal(ev->cost, 6.0, 1e-9);
	assert_true(ev->completed_ns >= ev->dispatched_ns);
	fanout_event_free(ev);
	/* nothing was published anywhere */
	assert_no_event(s);
	assert_no_event(fanout_default_sink(e));
	struct fanout_stats st = stats_of(e);
	assert_int_equal(st.runs, 1);
	assert_int_equal(st.dispatched, 0);
	assert_int_equal(st.children_run, 6);
	assert_int_equal(st.running, 0);
	assert_int_equal(fanout_sink_destroy(s), 0);
	tb_free(tb);
	fanout_destroy(e);
}

static void run_error_outcomes_in_event(void **state)
{
	struct fanout_engine *e =
		NEW_ENGINE(.workers = 1, .flags = FANOUT_NO_PIN);
	struct tbatch *tb = tb_new(2);
	struct fanout_event *ev = NULL;

	tb->probes[0].ret = -EIO;
	tb->probes[1].ret = -EPERM;
	/* the call succeeds; the children's failure is in the event */
	assert_int_equal(fanout_run(e, &tb->b, &ev), 0);
	assert_int_equal(ev->status, FANOUT_ERROR);
	assert_int_equal(ev->results[0].code, -EIO);
	assert_int_equal(ev->results[1].code, -EPERM);
	fanout_event_free(ev);
	tb_free(tb);
	fanout_destroy(e);
}

static void run_bad_input(void **state)
{
	struct fanout_engine *e = NEW_ENGINE(.workers = 1, .max_tasks = 4,
					     .flags = FANOUT_NO_PIN);
	struct tbatch *tb = tb_new(5);
	struct fanout_event *ev = NULL;

	assert_int_equal(fanout_run(NULL, &tb->b, &ev), -EINVAL);
	assert_int_equal(fanout_run(e, NULL, &ev), -EINVAL);
	tb->b.ntasks = 2;
	assert_int_equal(fanout_run(e, &tb->b, NULL), -EINVAL);
	tb->b.ntasks = 0;
	assert_int_equal(fanout_run(e, &tb->b, &ev), -EINVAL);
	tb->b.ntasks = 5;
	assert_int_equal(fanout_run(e, &tb->b, &ev), -E2BIG);
	tb->b.ntasks = 3;
	tb->tasks[1].fn = NULL;
	assert_int_equal(fanout_run(e, &tb->b, &ev), -EINVAL);
	struct fanout_batch nb = {.tasks = NULL, .ntasks = 1};
	assert_int_equal(fanout_run(e, &nb, &ev), -EINVAL);
	assert_int_equal(tb_runs(tb), 0);
	struct fanout_stats st = stats_of(e);
	assert_int_equal(st.runs, 0);
	assert_int_equal(st.children_run, 0);
	assert_int_equal(st.rejected, 6); /* every refusal with an engine */
	size_t n = 9;
	assert_int_equal(fanout_list(e, NULL, 0, &n), 0);
	assert_int_equal(n, 0);
	tb_free(tb);
	fanout_destroy(e);
}

/* A child that nests fanout_run @levels more levels deep, @fan wide. */
struct nest {
	struct fanout_engine *e;
	int levels;
	unsigned fan;
	unsigned depth; /* expected depth of this child */
	atomic_int *leaves;
	atomic_int *maxdepth;
};

static int nest_fn(struct fanout_child *c, void *arg)
{
	struct nest *n = arg;
	unsigned depth = fanout_child_depth(c);

	CHECK(fanout_current_child() == c);
	CHECK(depth == n->depth);
	if (n->maxdepth && (int)depth > atomic_load(n->maxdepth))
		atomic_store(n->maxdepth, (int)depth);
	if (n->levels == 0) {
		atomic_fetch_add(n->leaves, 1);
		return 0;
	}
	struct nest sub = *n;
	struct fanout_task t[8];
	struct fanout_event *ev = NULL;

	sub.levels--;
	sub.depth++;
	for (unsigned i = 0; i < n->fan; i++)
		t[i] = (struct fanout_task){"nested", nest_fn, &sub};
	struct fanout_batch b = {.tasks = t, .ntasks = n->fan};
	int rc = fanout_run(n->e, &b, &ev);

	CHECK(rc == 0);
	/* the nested run restored this thread's current child */
	CHECK(fanout_current_child() == c);
	CHECK(fanout_child_depth(c) == depth);
	if (rc == 0 && ev) {
		CHECK(ev->nresults == n->fan);
		CHECK(ev->status == FANOUT_COMPLETED);
		for (unsigned i = 0; i < ev->nresults; i++) {
			CHECK(ev->results[i].index == i);
			CHECK(ev->results[i].status == FANOUT_COMPLETED);
		}
		fanout_event_free(ev);
	}
	return 0;
}

static int pow_u(unsigned b, int e)
{
	int r = 1;

	while (e-- > 0)
		r *= (int)b;
	return r;
}

static void nested(unsigned workers, unsigned max_depth, int levels,
		   unsigned fan, bool background)
{
	struct fanout_engine *e =
		NEW_ENGINE(.workers = workers, .max_depth = max_depth,
			   .flags = FANOUT_NO_PIN);
	atomic_int leaves = 0, maxdepth = 0;
	struct nest top = {e, levels, fan, 1, &leaves, &maxdepth};
	struct fanout_task t[8];
	struct fanout_event *ev = NULL;

	for (unsigned i = 0; i < fan; i++)
		t[i] = (struct fanout_task){"top", nest_fn, &top};
	struct fanout_batch b = {.tasks = t, .ntasks = fan};
	if (background) {
		assert_int_equal(fanout_dispatch(e, &b, NULL), 0);
		ev = must_wait(fanout_default_sink(e));
	} else {
		assert_int_equal(fanout_run(e, &b, &ev), 0);
	}
	assert_int_equal(ev->nresults, fan);
	assert_int_equal(ev->status, FANOUT_COMPLETED);
	fanout_event_free(ev);
	assert_int_equal(atomic_load(&leaves), pow_u(fan, levels + 1));
	assert_int_equal(atomic_load(&maxdepth), levels + 1);
	assert_null(fanout_current_child());
	fanout_destroy(e);
}

static void run_nested_one_worker(void **state)
{
	nested(1, 2, 1, 3, false);
}

static void run_nested_one_worker_background(void **state)
{
	/* the only worker runs the parent; it must run the nested batch */
	nested(1, 2, 1, 3, true);
}

static void run_nested_two_deep(void **state)
{
	nested(1, 3, 2, 3, false);
	nested(1, 3, 2, 3, true);
	nested(2, 3, 2, 3, true);
}

static void run_nested_deep_chain(void **state)
{
	/* depth 1..10 on one worker, max_depth 10 */
	nested(1, 10, 9, 1, false);
	nested(1, 10, 9, 1, true);
}

static void run_nested_wide_two_workers(void **state)
{
	nested(2, 2, 1, 8, true);
}

/* A child that tries every way of delegating one more level down. */
struct tryer {
	struct fanout_engine *e;
	atomic_int count;
	unsigned depth;
	int rc_run, rc_dispatch, rc_delegate;
};

static int try_fn(struct fanout_child *c, void *arg)
{
	struct tryer *t = arg;
	struct fanout_task task = {"too-deep", count_fn, &t->count};
	struct fanout_batch b = {.tasks = &task, .ntasks = 1};
	struct fanout_event *ev = NULL;
	fanout_id id = 0;

	t->depth = fanout_child_depth(c);
	t->rc_run = fanout_run(t->e, &b, &ev);
	if (t->rc_run == 0)
		fanout_event_free(ev);
	ev = NULL;
	t->rc_dispatch = fanout_dispatch(t->e, &b, &id);
	t->rc_delegate = fanout_delegate(t->e, &b, &id, &ev);
	if (t->rc_delegate == FANOUT_INLINE ||
	    t->rc_delegate == FANOUT_INLINE_FULL)
		fanout_event_free(ev);
	return 0;
}

/* A child that runs one @fn(@arg) child synchronously (one level down). */
struct wrap {
	struct fanout_engine *e;
	fanout_fn fn;
	void *arg;
};

static int wrap_fn(struct fanout_child *c, void *arg)
{
	struct wrap *w = arg;
	struct fanout_task task = {"wrap", w->fn, w->arg};
	struct fanout_batch b = {.tasks = &task, .ntasks = 1};
	struct fanout_event *ev = NULL;

	CHECK(fanout_run(w->e, &b, &ev) == 0);
	if (ev) {
		CHECK(ev->nresults == 1 &&
		      ev->results[0].status == FANOUT_COMPLETED);
		fanout_event_free(ev);
	}
	return 0;
}

static void run_depth_two_refuses_deeper(void **state)
{
	/* default max_depth is 2 */
	struct fanout_engine *e =
		NEW_ENGINE(.workers = 1, .flags = FANOUT_NO_PIN);
	struct tryer t = {.e = e};
	struct wrap w = {e, try_fn, &t};
	struct fanout_task task = {"top", wrap_fn, &w};
	struct fanout_batch b = {.tasks = &task, .ntasks = 1};
	struct fanout_event *ev = NULL;

	assert_int_equal(fanout_run(e, &b, &ev), 0);
	assert_int_equal(ev->status, FANOUT_COMPLETED);
	fanout_event_free(ev);
	assert_int_equal(t.depth, 2);
	assert_int_equal(t.rc_run, -ELOOP);
	assert_int_equal(t.rc_dispatch, -ELOOP);
	assert_int_equal(t.rc_delegate, -ELOOP);
	assert_int_equal(atomic_load(&t.count), 0);
	assert_no_event(fanout_default_sink(e));
	struct fanout_stats st = stats_of(e);
	assert_int_equal(st.rejected, 3);
	assert_int_equal(st.dispatched, 0);
	assert_int_equal(st.runs, 2);
	fanout_destroy(e);
}

static void run_depth_two_from_background(void **state)
{
	struct fanout_engine *e = NEW_ENGINE(.workers = 2, .max_depth = 2,
					     .flags = FANOUT_NO_PIN);
	struct tryer t = {.e = e};
	struct wrap w = {e, try_fn, &t};
	struct fanout_task task = {"top", wrap_fn, &w};
	struct fanout_batch b = {.tasks = &task, .ntasks = 1};

	assert_int_equal(fanout_dispatch(e, &b, NULL), 0);
	struct fanout_event *ev = must_wait(fanout_default_sink(e));
	fanout_event_free(ev);
	assert_int_equal(t.depth, 2);
	assert_int_equal(t.rc_run, -ELOOP);
	assert_int_equal(t.rc_dispatch, -ELOOP);
	assert_int_equal(t.rc_delegate, -ELOOP);
	assert_int_equal(atomic_load(&t.count), 0);
	assert_no_event(fanout_default_sink(e));
	fanout_destroy(e);
}

static void run_max_depth_one_refuses_nested(void **state)
{
	struct fanout_engine *e = NEW_ENGINE(.workers = 1, .max_depth = 1,
					     .flags = FANOUT_NO_PIN);
	struct tryer t = {.e = e};
	struct fanout_task task = {"top", try_fn, &t};
	struct fanout_batch b = {.tasks = &task, .ntasks = 1};
	struct fanout_event *ev = NULL;

	assert_int_equal(fanout_run(e, &b, &ev), 0);
	fanout_event_free(ev);
	assert_int_equal(t.depth, 1);
	assert_int_equal(t.rc_run, -ELOOP);
	assert_int_equal(t.rc_dispatch, -ELOOP);
	assert_int_equal(t.rc_delegate, -ELOOP);
	assert_int_equal(atomic_load(&t.count), 0);

	/* top level still works */
	struct tbatch *tb = tb_new(3);
	assert_int_equal(fanout_run(e, &tb->b, &ev), 0);
	check_all_completed(ev, tb);
	for (unsigned i = 0; i < 3; i++)
		assert_int_equal(tb->probes[i].depth, 1);
	fanout_event_free(ev);
	tb_free(tb);
	assert_no_event(fanout_default_sink(e));
	fanout_destroy(e);
}

static void run_child_depths(void **state)
{
	struct fanout_engine *e =
		NEW_ENGINE(.workers = 2, .flags = FANOUT_NO_PIN);
	struct tbatch *tb = tb_new(4);
	struct fanout_event *ev = NULL;

	assert_int_equal(fanout_run(e, &tb->b, &ev), 0);
	for (unsigned i = 0; i < 4; i++)
		assert_int_equal(tb->probes[i].depth, 1);
	fanout_event_free(ev);
	tb_free(tb);

	tb = tb_new(4);
	must_dispatch(e, tb);
	ev = must_wait(fanout_default_sink(e));
	for (unsigned i = 0; i < 4; i++)
		assert_int_equal(tb->probes[i].depth, 1);
	fanout_event_free(ev);

	/* one level down: depth 2 */
	struct tbatch *inner = tb_new(3);
	struct wrap w = {e, probe_fn, &inner->probes[0]};
	struct fanout_task task = {"top", wrap_fn, &w};
	struct fanout_batch b = {.tasks = &task, .ntasks = 1};
	assert_int_equal(fanout_run(e, &b, &ev), 0);
	fanout_event_free(ev);
	assert_int_equal(atomic_load(&inner->probes[0].runs), 1);
	assert_int_equal(inner->probes[0].depth, 2);
	tb_free(inner);
	tb_free(tb);
	fanout_destroy(e);
}

static void current_child_outside_null(void **state)
{
	struct fanout_engine *e =
		NEW_ENGINE(.workers = 1, .flags = FANOUT_NO_PIN);
	struct tbatch *tb = tb_new(3);
	struct fanout_event *ev = NULL;

	assert_null(fanout_current_child());
	/* probe_fn CHECKs fanout_current_child() == c inside */
	assert_int_equal(fanout_run(e, &tb->b, &ev), 0);
	check_all_completed(ev, tb);
	fanout_event_free(ev);
	/* the caller may have run children itself: restored to NULL */
	assert_null(fanout_current_child());
	tb_free(tb);
	fanout_destroy(e);
}

static void *run_in_thread(void *arg)
{
	struct fanout_engine *e = arg;
	struct probe p;
	memset(&p, 0, sizeof(p));
	struct fanout_task t = {"t", probe_fn, &p};
	struct fanout_batch b = {.tasks = &t, .ntasks = 1};
	struct fanout_event *ev = NULL;

	CHECK(fanout_current_child() == NULL);
	CHECK(fanout_run(e, &b, &ev) == 0);
	CHECK(fanout_current_child() == NULL);
	CHECK(atomic_load(&p.runs) == 1);
	fanout_event_free(ev);
	return NULL;
}

static void run_from_unregistered_threads(void **state)
{
	struct fanout_engine *e =
		NEW_ENGINE(.workers = 2, .flags = FANOUT_NO_PIN);
	pthread_t t[4];

	for (int i = 0; i < 4; i++)
		t[i] = spawn(run_in_thread, e);
	for (int i = 0; i < 4; i++)
		join(t[i]);
	assert_int_equal(stats_of(e).runs, 4);
	fanout_destroy(e);
}

/*
 * The only worker is stuck in a long background child; fanout_run from the
 * main thread still completes because the caller runs its own children.
 */
static void run_caller_helps(void **state)
{
	struct fanout_engine *e =
		NEW_ENGINE(.workers = 1, .flags = FANOUT_NO_PIN);
	atomic_int gate = 0;
	struct tbatch *blocker = tb_new(1);
	struct tbatch *tb = tb_new(5);
	struct fanout_event *ev = NULL;

	blocker->probes[0].gate = &gate;
	fanout_id bid = must_dispatch(e, blocker);
	assert_true(wait_ge(&blocker->probes[0].runs, 1, WAIT_MS));

	assert_int_equal(fanout_run(e, &tb->b, &ev), 0);
	check_all_completed(ev, tb);
	for (unsigned i = 0; i < 5; i++)
		assert_true(
			pthread_equal(tb->probes[i].thread, pthread_self()));
	fanout_event_free(ev);

	atomic_store(&gate, 1);
	ev = must_wait(fanout_default_sink(e));
	assert_true(ev->id == bid);
	check_all_completed(ev, blocker);
	fanout_event_free(ev);
	tb_free(tb);
	tb_free(blocker);
	fanout_destroy(e);
}

/*
 * The caller of fanout_run runs only its own batch: background work queued
 * behind a blocked worker stays queued while the caller helps.
 */
static void run_never_runs_unrelated_work(void **state)
{
	struct fanout_engine *e =
		NEW_ENGINE(.workers = 1, .flags = FANOUT_NO_PIN);
	atomic_int gate = 0;
	struct tbatch *blocker = tb_new(1);
	struct tbatch *queued = tb_new(6);
	struct tbatch *mine = tb_new(4);
	struct fanout_event *ev = NULL;

	blocker->probes[0].gate = &gate;
	fanout_id bid = must_dispatch(e, blocker);
	assert_true(wait_ge(&blocker->probes[0].runs, 1, WAIT_MS));
	fanout_id qid = must_dispatch(e, queued);

	assert_int_equal(fanout_run(e, &mine->b, &ev), 0);
	check_all_completed(ev, mine);
	fanout_event_free(ev);
	assert_int_equal(tb_runs(queued), 0);

	atomic_store(&gate, 1);
	for (int k = 0; k < 2; k++) {
		ev = must_wait(fanout_default_sink(e));
		assert_true(ev->id == bid || ev->id == qid);
		check_all_completed(ev, ev->id == bid ? blocker : queued);
		fanout_event_free(ev);
	}
	for (unsigned i = 0; i < 6; i++)
		assert_false(pthread_equal(queued->probes[i].thread,
					   pthread_self()));
	tb_free(blocker);
	tb_free(queued);
	tb_free(mine);
	fanout_destroy(e);
}

/* Same inside a child: a nested fanout_run on the only worker does not
 * pick up unrelated queued work while it waits. */
struct isolated {
	struct fanout_engine *e;
	atomic_int started;
	atomic_int gate;
	struct tbatch *inner;
	struct tbatch *unrelated;
	int unrelated_runs_after;
	int rc;
};

static int isolated_fn(struct fanout_child *c, void *arg)
{
	struct isolated *s = arg;
	struct fanout_event *ev = NULL;

	(void)c;
	atomic_store(&s->started, 1);
	CHECK(wait_flag(&s->gate, GATE_MS));
	s->rc = fanout_run(s->e, &s->inner->b, &ev);
	s->unrelated_runs_after = tb_runs(s->unrelated);
	fanout_event_free(ev);
	return 0;
}

static void run_nested_never_runs_unrelated_work(void **state)
{
	struct fanout_engine *e =
		NEW_ENGINE(.workers = 1, .flags = FANOUT_NO_PIN);
	struct isolated s = {
		.e = e, .inner = tb_new(5), .unrelated = tb_new(3), .rc = 1};
	struct fanout_task t = {"parent", isolated_fn, &s};
	struct fanout_batch b = {.tasks = &t, .ntasks = 1};
	fanout_id pid = 0;

	assert_int_equal(fanout_dispatch(e, &b, &pid), 0);
	/* the only worker is in the parent: the next one queues behind it */
	assert_true(wait_flag(&s.started, WAIT_MS));
	fanout_id uid = must_dispatch(e, s.unrelated);
	atomic_store(&s.gate, 1);
	for (int k = 0; k < 2; k++) {
		struct fanout_event *ev = must_wait(fanout_default_sink(e));

		assert_true(ev->id == pid || ev->id == uid);
		fanout_event_free(ev);
	}
	assert_int_equal(s.rc, 0);
	assert_int_equal(tb_runs(s.inner), 5);
	assert_int_equal(s.unrelated_runs_after, 0);
	assert_int_equal(tb_runs(s.unrelated), 3);
	tb_free(s.inner);
	tb_free(s.unrelated);
	fanout_destroy(e);
}

/* fanout_run does not take a max_async slot. */
static void run_ignores_max_async(void **state)
{
	struct fanout_engine *e = NEW_ENGINE(.workers = 2, .max_async = 1,
					     .flags = FANOUT_NO_PIN);
	atomic_int gate = 0;
	struct tbatch *blocker = tb_new(1);
	struct tbatch *tb = tb_new(3);
	struct fanout_event *ev = NULL;

	blocker->probes[0].gate = &gate;
	must_dispatch(e, blocker);
	assert_int_equal(fanout_dispatch(e, &tb->b, NULL), -EBUSY);
	assert_int_equal(fanout_run(e, &tb->b, &ev), 0);
	check_all_completed(ev, tb);
	fanout_event_free(ev);
	atomic_store(&gate, 1);
	ev = must_wait(fanout_default_sink(e));
	fanout_event_free(ev);
	tb_free(tb);
	tb_free(blocker);
	fanout_destroy(e);
}

/* Children of fanout_run may dispatch in the background. */
struct bg_from_child {
	struct fanout_engine *e;
	struct tbatch *tb;
	fanout_id id;
	int rc;
};

static int bg_from_child_fn(struct fanout_child *c, void *arg)
{
	struct bg_from_child *g = arg;

	(void)c;
	g->rc = fanout_dispatch(g->e, &g->tb->b, &g->id);
	return 0;
}

static void run_child_dispatches_background(void **state)
{
	struct fanout_engine *e =
		NEW_ENGINE(.workers = 1, .flags = FANOUT_NO_PIN);
	struct bg_from_child g = {.e = e, .tb = tb_new(3)};
	struct fanout_task t = {"parent", bg_from_child_fn, &g};
	struct fanout_batch b = {.tasks = &t, .ntasks = 1};
	struct fanout_event *ev = NULL;

	assert_int_equal(fanout_run(e, &b, &ev), 0);
	fanout_event_free(ev);
	assert_int_equal(g.rc, 0);
	ev = must_wait(fanout_default_sink(e));
	assert_true(ev->id == g.id);
	check_all_completed(ev, g.tb);
	for (unsigned i = 0; i < 3; i++)
		assert_int_equal(g.tb->probes[i].depth, 2);
	fanout_event_free(ev);
	tb_free(g.tb);
	fanout_destroy(e);
}

/*
 * Work-first (queue/fq.c, argument 7).  Child 0 waits for child 1 to
 * start; the caller claims child 0 first, so the batch finishes only if
 * another thread runs child 1 while the caller is inside child 0.  With
 * workers spinning (spin_ns 1 s), the caller OFFERS its tokens and a
 * spinner must take one once the offer is old enough; with workers
 * parking at once (spin_ns 1 ns), the tokens go through the ring and a
 * worker must be woken.  A lost offer or a lost wake-up times out child 0.
 */
struct sibling_wait {
	atomic_int started1;
	pthread_t t1;
};

static int wait_for_sibling(struct fanout_child *c, void *arg)
{
	struct sibling_wait *w = arg;

	if (fanout_child_index(c) == 1) {
		w->t1 = pthread_self();
		atomic_store(&w->started1, 1);
		return 0;
	}
	return wait_ge(&w->started1, 1, WAIT_MS) ? 0 : -ETIMEDOUT;
}

static void sibling_runs_elsewhere(uint64_t spin_ns, bool offered)
{
	struct fanout_engine *e =
		NEW_ENGINE(.workers = 2, .flags = FANOUT_NO_PIN,
			   .spin_ns = spin_ns);

	for (int round = 0; round < 20; round++) {
		struct sibling_wait w = {0};
		struct fanout_task t[2] = {{"waits", wait_for_sibling, &w},
					   {"sibling", wait_for_sibling, &w}};
		struct fanout_batch b = {.tasks = t, .ntasks = 2};
		struct fanout_event *ev = NULL;

		if (!offered)
			usleep(2000); /* every worker parked */
		assert_int_equal(fanout_run(e, &b, &ev), 0);
		assert_int_equal(ev->ncompleted, 2);
		assert_int_equal(ev->results[0].code, 0);
		assert_int_equal(ev->results[1].code, 0);
		fanout_event_free(ev);
	}
	if (offered)
		assert_true(fanout_test_offers_taken(e) > 0);
	else
		assert_int_equal(fanout_test_offers_taken(e), 0);
	fanout_destroy(e);
}

/*
 * Adaptive chunks (lib/join.c): a runner claims at most twice what it just
 * ran, also while it is the only runner that has started (a fanout_run
 * caller before a spinner takes its offer: such a token reserves no
 * share).  64 children, 2 spinning workers: the caller's first chunk is
 * [0, 4) (fanout__chunk_for), whose children return at once; every later
 * child waits until a child has started on another thread.  So the
 * caller blocks inside [4, 12) at most, and the first child a worker
 * starts has an index of 12 or less; a claim of everything would leave
 * the worker nothing to start and time the children out.
 */
struct claim_gate {
	pthread_t caller;
	atomic_int elsewhere;	    /* children started off the caller */
	atomic_int first_elsewhere; /* lowest such index, or 64 */
};

static int gated_after_first_chunk(struct fanout_child *c, void *arg)
{
	struct claim_gate *g = arg;
	int i = (int)fanout_child_index(c), m;

	if (!pthread_equal(pthread_self(), g->caller)) {
		m = atomic_load(&g->first_elsewhere);
		while (i < m && !atomic_compare_exchange_weak(
					&g->first_elsewhere, &m, i))
			;
		atomic_fetch_add(&g->elsewhere, 1);
	}
	if (i < 4)
		return 0;
	return wait_ge(&g->elsewhere, 1, WAIT_MS) ? 0 : -ETIMEDOUT;
}

static void run_claims_at_most_twice_what_ran(void **state)
{
	struct fanout_engine *e =
		NEW_ENGINE(.workers = 2, .flags = FANOUT_NO_PIN,
			   .spin_ns = 1000000000ull);

	for (int round = 0; round < 5; round++) {
		struct claim_gate g = {.caller = pthread_self()};
		struct fanout_task t[64];
		struct fanout_batch b = {.tasks = t, .ntasks = 64};
		struct fanout_event *ev = NULL;

		atomic_init(&g.elsewhere, 0);
		atomic_init(&g.first_elsewhere, 64);
		for (int i = 0; i < 64; i++)
			t[i] = (struct fanout_task){
				"g", gated_after_first_chunk, &g};
		assert_int_equal(fanout_run(e, &b, &ev), 0);
		assert_int_equal(ev->ncompleted, 64);
		assert_true(atomic_load(&g.first_elsewhere) <= 12);
		fanout_event_free(ev);
	}
	fanout_destroy(e);
}

static void run_offer_taken_by_spinner(void **state)
{
	sibling_runs_elsewhere(1000000000ull, true);
}

static void run_tokens_wake_parked_workers(void **state)
{
	sibling_runs_elsewhere(1, false);
}

/* A batch whose children wait for each other needs them all running at
 * once: 8 children on the caller + 7 of 8 workers, most of them parked
 * when the offer opens (spin_ns 1 ms), so the owner's kick must wake
 * them (queue/fq.c, argument 7). */
struct rendezvous {
	atomic_int arrived;
	atomic_int late;
};

static int rendezvous_fn(struct fanout_child *c, void *arg)
{
	struct rendezvous *r = arg;

	atomic_fetch_add(&r->arrived, 1);
	if (!wait_ge(&r->arrived, 8, WAIT_MS)) {
		atomic_fetch_add(&r->late, 1);
		return -ETIMEDOUT;
	}
	return 0;
}

static void run_rendezvous_batch_gets_all_workers(void **state)
{
	struct fanout_engine *e =
		NEW_ENGINE(.workers = 8, .flags = FANOUT_NO_PIN,
			   .spin_ns = 1000000);

	for (int round = 0; round < 5; round++) {
		struct rendezvous r = {0};
		struct fanout_task t[8];
		struct fanout_batch b = {.tasks = t, .ntasks = 8};
		struct fanout_event *ev = NULL;

		for (int i = 0; i < 8; i++)
			t[i] = (struct fanout_task){"meet", rendezvous_fn, &r};
		usleep(round * 1000); /* some rounds with workers parked */
		assert_int_equal(fanout_run(e, &b, &ev), 0);
		assert_int_equal(atomic_load(&r.late), 0);
		assert_int_equal(ev->ncompleted, 8);
		fanout_event_free(ev);
	}
	fanout_destroy(e);
}

/* Offers under churn: nested runs from several application threads and
 * from children at once, every batch's children each run exactly once. */
struct churn {
	struct fanout_engine *e;
	atomic_int runs;
};

static int count_child(struct fanout_child *c, void *arg)
{
	atomic_fetch_add(&((struct churn *)arg)->runs, 1);
	return 0;
}

static int nested_runner(struct fanout_child *c, void *arg)
{
	struct churn *ch = arg;
	struct fanout_task t[4];
	struct fanout_batch b = {.tasks = t, .ntasks = 4};
	struct fanout_event *ev = NULL;
	int rc;

	for (int i = 0; i < 4; i++)
		t[i] = (struct fanout_task){"leaf", count_child, ch};
	rc = fanout_run(ch->e, &b, &ev);
	if (rc)
		return rc;
	rc = ev->ncompleted == 4 ? 0 : -EPROTO;
	fanout_event_free(ev);
	atomic_fetch_add(&ch->runs, 1);
	return rc;
}

static void *churn_thread(void *arg)
{
	struct churn *ch = arg;

	for (int i = 0; i < 300; i++) {
		struct fanout_task t[3];
		struct fanout_batch b = {.tasks = t, .ntasks = 3};
		struct fanout_event *ev = NULL;

		for (int k = 0; k < 3; k++)
			t[k] = (struct fanout_task){"mid", nested_runner, ch};
		if (fanout_run(ch->e, &b, &ev) || ev->ncompleted != 3)
			return (void *)1;
		fanout_event_free(ev);
	}
	return NULL;
}

static void run_offers_under_churn(void **state)
{
	struct churn ch = {.e = NEW_ENGINE(.workers = 2, .flags = FANOUT_NO_PIN,
					   .spin_ns = 1000000)};
	pthread_t th[3];
	void *ret;

	for (int i = 0; i < 3; i++)
		assert_int_equal(
			pthread_create(&th[i], NULL, churn_thread, &ch), 0);
	for (int i = 0; i < 3; i++) {
		assert_int_equal(pthread_join(th[i], &ret), 0);
		assert_null(ret);
	}
	/* 3 threads x 300 runs x 3 mid children x (4 leaves + itself) */
	assert_int_equal(atomic_load(&ch.runs), 3 * 300 * 3 * 5);
	struct fanout_stats st = stats_of(ch.e);
	assert_int_equal(st.runs, 3 * 300 * 4);
	assert_int_equal(st.completed, 3 * 300 * 4);
	assert_int_equal(st.running, 0);
	fanout_destroy(ch.e);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		TC(run_returns_event),
		TC(run_error_outcomes_in_event),
		TC(run_bad_input),
		TC(run_nested_one_worker),
		TC(run_nested_one_worker_background),
		TC(run_nested_two_deep),
		TC(run_nested_deep_chain),
		TC(run_nested_wide_two_workers),
		TC(run_depth_two_refuses_deeper),
		TC(run_depth_two_from_background),
		TC(run_max_depth_one_refuses_nested),
		TC(run_child_depths),
		TC(current_child_outside_null),
		TC(run_from_unregistered_threads),
		TC(run_caller_helps),
		TC(run_never_runs_unrelated_work),
		TC(run_nested_never_runs_unrelated_work),
		TC(run_ignores_max_async),
		TC(run_child_dispatches_background),
		TC(run_offer_taken_by_spinner),
		TC(run_claims_at_most_twice_what_ran),
		TC(run_tokens_wake_parked_workers),
		TC(run_offers_under_churn),
		TC(run_rendezvous_batch_gets_all_workers),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
