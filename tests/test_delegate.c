/* SPDX-License-Identifier: MIT */
/* test_delegate.c - fanout_delegate: background, inline, inline-when-full. */
#include "common.h"

static void delegate_top_level_background(void **state)
{
	struct fanout_engine *e =
		NEW_ENGINE(.workers = 2, .flags = FANOUT_NO_PIN);
	struct fanout_sink *s = NULL;
	struct tbatch *tb = tb_new(4);
	struct fanout_event *ev = NULL;
	fanout_id id = 0;
	atomic_int gate = 0;

	assert_int_equal(fanout_sink_create(e, &s), 0);
	tb->b.sink = s;
	tb_gate(tb, &gate); /* proves the call returned before the join */
	assert_int_equal(fanout_delegate(e, &tb->b, &id, &ev),
			 FANOUT_BACKGROUND);
	assert_true(id != 0);
	for (unsigned i = 0; i < 4; i++)
		assert_int_equal(atomic_load(&tb->probes[i].finished), 0);
	atomic_store(&gate, 1);
	ev = must_wait(s);
	assert_true(ev->id == id);
	check_all_completed(ev, tb);
	fanout_event_free(ev);
	assert_no_event(s);
	assert_no_event(fanout_default_sink(e));
	struct fanout_stats st = stats_of(e);
	assert_int_equal(st.dispatched, 1);
	assert_int_equal(st.runs, 0);
	assert_int_equal(fanout_sink_destroy(s), 0);
	tb_free(tb);
	fanout_destroy(e);
}

static void delegate_null_id_ok(void **state)
{
	struct fanout_engine *e =
		NEW_ENGINE(.workers = 2, .flags = FANOUT_NO_PIN);
	struct tbatch *tb = tb_new(2);
	struct fanout_event *ev = NULL;

	assert_int_equal(fanout_delegate(e, &tb->b, NULL, &ev),
			 FANOUT_BACKGROUND);
	ev = must_wait(fanout_default_sink(e));
	check_all_completed(ev, tb);
	fanout_event_free(ev);
	tb_free(tb);
	fanout_destroy(e);
}

/* A child that delegates a batch and checks it came back inline. */
struct inner {
	struct fanout_engine *e;
	struct tbatch *tb;
	int rc;
	fanout_id id;
	fanout_id evid;
	bool all_ran_before_return;
	unsigned nresults;
	enum fanout_status status;
};

static int delegating_child(struct fanout_child *c, void *arg)
{
	struct inner *in = arg;
	struct fanout_event *ev = NULL;

	(void)c;
	in->rc = fanout_delegate(in->e, &in->tb->b, &in->id, &ev);
	in->all_ran_before_return = tb_runs(in->tb) == (int)in->tb->n;
	if (ev) {
		in->evid = ev->id;
		in->nresults = ev->nresults;
		in->status = ev->status;
		for (unsigned i = 0; i < ev->nresults; i++)
			CHECK(ev->results[i].index == i &&
			      ev->results[i].status == FANOUT_COMPLETED);
		fanout_event_free(ev);
	}
	return 0;
}

static void check_inner_inline(struct inner *in)
{
	assert_int_equal(in->rc, FANOUT_INLINE);
	assert_true(in->id != 0);
	assert_true(in->id == in->evid);
	assert_true(in->all_ran_before_return);
	assert_int_equal(in->nresults, in->tb->n);
	assert_int_equal(in->status, FANOUT_COMPLETED);
	for (unsigned i = 0; i < in->tb->n; i++) {
		assert_int_equal(atomic_load(&in->tb->probes[i].runs), 1);
		assert_int_equal(in->tb->probes[i].depth, 2);
	}
}

static void delegate_inside_background_child_inline(void **state)
{
	struct fanout_engine *e =
		NEW_ENGINE(.workers = 1, .flags = FANOUT_NO_PIN);
	struct fanout_sink *s2 = NULL;
	struct inner in = {.e = e, .tb = tb_new(3)};
	struct fanout_task t = {"parent", delegating_child, &in};
	struct fanout_batch b = {.tasks = &t, .ntasks = 1};
	fanout_id id = 0;

	assert_int_equal(fanout_sink_create(e, &s2), 0);
	in.tb->b.sink = s2; /* an inline delegation publishes nothing */
	assert_int_equal(fanout_dispatch(e, &b, &id), 0);
	struct fanout_event *ev = must_wait(fanout_default_sink(e));
	assert_true(ev->id == id);
	assert_int_equal(ev->status, FANOUT_COMPLETED);
	fanout_event_free(ev);
	check_inner_inline(&in);
	assert_true(in.id != id);
	assert_no_event(s2);
	assert_no_event(fanout_default_sink(e));
	struct fanout_stats st = stats_of(e);
	assert_int_equal(st.dispatched, 1);
	assert_int_equal(st.runs, 1);
	assert_int_equal(fanout_sink_destroy(s2), 0);
	tb_free(in.tb);
	fanout_destroy(e);
}

static void delegate_inside_run_child_inline(void **state)
{
	struct fanout_engine *e =
		NEW_ENGINE(.workers = 2, .flags = FANOUT_NO_PIN);
	struct inner in = {.e = e, .tb = tb_new(4)};
	struct fanout_task t = {"parent", delegating_child, &in};
	struct fanout_batch b = {.tasks = &t, .ntasks = 1};
	struct fanout_event *ev = NULL;

	assert_int_equal(fanout_run(e, &b, &ev), 0);
	fanout_event_free(ev);
	check_inner_inline(&in);
	assert_no_event(fanout_default_sink(e));
	tb_free(in.tb);
	fanout_destroy(e);
}

/* Even when the async pool is full, a child's delegation is FANOUT_INLINE. */
static void delegate_inside_child_when_full_is_inline(void **state)
{
	struct fanout_engine *e = NEW_ENGINE(.workers = 2, .max_async = 1,
					     .flags = FANOUT_NO_PIN);
	struct inner in = {.e = e, .tb = tb_new(2)};
	struct fanout_task t = {"parent", delegating_child, &in};
	struct fanout_batch b = {.tasks = &t, .ntasks = 1};

	/* the parent itself holds the only async slot */
	assert_int_equal(fanout_dispatch(e, &b, NULL), 0);
	struct fanout_event *ev = must_wait(fanout_default_sink(e));
	fanout_event_free(ev);
	check_inner_inline(&in);
	assert_no_event(fanout_default_sink(e));
	tb_free(in.tb);
	fanout_destroy(e);
}

static void delegate_pool_full_inline_full(void **state)
{
	struct fanout_engine *e = NEW_ENGINE(.workers = 2, .max_async = 1,
					     .flags = FANOUT_NO_PIN);
	atomic_int gate = 0;
	struct tbatch *blocker = tb_new(1);
	struct tbatch *tb = tb_new(3);
	struct fanout_event *ev = NULL;
	fanout_id id = 0;

	blocker->probes[0].gate = &gate;
	fanout_id bid = must_dispatch(e, blocker);
	assert_true(wait_ge(&blocker->probes[0].runs, 1, WAIT_MS));

	assert_int_equal(fanout_delegate(e, &tb->b, &id, &ev),
			 FANOUT_INLINE_FULL);
	assert_non_null(ev);
	assert_true(id != 0);
	assert_true(ev->id == id);
	assert_true(id != bid);
	check_all_completed(ev, tb);
	fanout_event_free(ev);
	assert_int_equal(stats_of(e).runs, 1);
	assert_int_equal(stats_of(e).dispatched, 1);

	atomic_store(&gate, 1);
	ev = must_wait(fanout_default_sink(e));
	assert_true(ev->id == bid);
	fanout_event_free(ev);
	/* and nothing for the inline one */
	assert_no_event(fanout_default_sink(e));

	/* the pool has room again: background */
	memset(tb->probes, 0, sizeof(tb->probes[0]) * tb->n);
	assert_int_equal(fanout_delegate(e, &tb->b, &id, &ev),
			 FANOUT_BACKGROUND);
	ev = must_wait(fanout_default_sink(e));
	assert_true(ev->id == id);
	check_all_completed(ev, tb);
	fanout_event_free(ev);
	tb_free(tb);
	tb_free(blocker);
	fanout_destroy(e);
}

static void delegate_errors_pass_through(void **state)
{
	struct fanout_engine *e = NEW_ENGINE(.workers = 1, .max_tasks = 4,
					     .flags = FANOUT_NO_PIN);
	struct fanout_engine *other =
		NEW_ENGINE(.workers = 1, .flags = FANOUT_NO_PIN);
	struct tbatch *tb = tb_new(5);
	struct fanout_event *ev = NULL;
	fanout_id id = 0;

	assert_int_equal(fanout_delegate(NULL, &tb->b, &id, &ev), -EINVAL);
	assert_int_equal(fanout_delegate(e, NULL, &id, &ev), -EINVAL);
	assert_int_equal(fanout_delegate(e, &tb->b, &id, &ev), -E2BIG);
	tb->b.ntasks = 0;
	assert_int_equal(fanout_delegate(e, &tb->b, &id, &ev), -EINVAL);
	tb->b.ntasks = 2;
	tb->tasks[1].fn = NULL;
	assert_int_equal(fanout_delegate(e, &tb->b, &id, &ev), -EINVAL);
	tb->tasks[1].fn = probe_fn;
	tb->b.sink = fanout_default_sink(other);
	assert_int_equal(fanout_delegate(e, &tb->b, &id, &ev), -EINVAL);
	assert_int_equal(tb_runs(tb), 0);
	assert_no_event(fanout_default_sink(e));
	assert_no_event(fanout_default_sink(other));
	struct fanout_stats st = stats_of(e);
	assert_int_equal(st.dispatched, 0);
	assert_int_equal(st.runs, 0);
	size_t n = 1;
	assert_int_equal(fanout_list(e, NULL, 0, &n), 0);
	assert_int_equal(n, 0);
	tb_free(tb);
	fanout_destroy(other);
	fanout_destroy(e);
}

/* A full pool does not turn a bad batch into an inline run. */
static void delegate_full_pool_bad_batch_is_error(void **state)
{
	struct fanout_engine *e =
		NEW_ENGINE(.workers = 2, .max_async = 1, .max_tasks = 4,
			   .flags = FANOUT_NO_PIN);
	atomic_int gate = 0;
	struct tbatch *blocker = tb_new(1);
	struct tbatch *tb = tb_new(5);
	struct fanout_event *ev = NULL;
	fanout_id id = 0;

	blocker->probes[0].gate = &gate;
	must_dispatch(e, blocker);
	assert_int_equal(fanout_delegate(e, &tb->b, &id, &ev), -E2BIG);
	tb->b.ntasks = 0;
	assert_int_equal(fanout_delegate(e, &tb->b, &id, &ev), -EINVAL);
	assert_int_equal(tb_runs(tb), 0);
	assert_int_equal(stats_of(e).runs, 0);
	atomic_store(&gate, 1);
	ev = must_wait(fanout_default_sink(e));
	fanout_event_free(ev);
	assert_no_event(fanout_default_sink(e));
	tb_free(tb);
	tb_free(blocker);
	fanout_destroy(e);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		TC(delegate_top_level_background),
		TC(delegate_null_id_ok),
		TC(delegate_inside_background_child_inline),
		TC(delegate_inside_run_child_inline),
		TC(delegate_inside_child_when_full_is_inline),
		TC(delegate_pool_full_inline_full),
		TC(delegate_errors_pass_through),
		TC(delegate_full_pool_bad_batch_is_error),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
