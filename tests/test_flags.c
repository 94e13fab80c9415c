/* SPDX-License-Identifier: MIT */
/*
 * test_flags.c - the opt-in flags of issue 13: FANOUT_NO_CHILD_CLOCK (an
 * engine whose children are not timed), FANOUT_BORROW_TASKS (a batch
 * whose task array and goals the library reads in place) and
 * FANOUT_RUNNERS_ON_DEMAND (a background batch that starts with one
 * runner), and the default each of them departs from (children timed,
 * tasks and goals copied, every runner started at once).
 */
#include "common.h"

static struct fanout_engine *engine_flags(unsigned workers, unsigned flags)
{
	return NEW_ENGINE(.workers = workers, .flags = FANOUT_NO_PIN | flags,
			  .spin_ns = 1000);
}

/* ---------------------------------------------------- FANOUT_NO_CHILD_CLOCK */

/* n probe children that sleep @us each: dispatched, then run; every result
 * checked with @check (durations). */
static void sleepers(struct fanout_engine *e, unsigned n, unsigned us,
		     void (*check)(const struct fanout_result *r))
{
	struct fanout_event *ev;
	struct tbatch *tb;

	for (int mode = 0; mode < 2; mode++) {
		tb = tb_new(n);
		for (unsigned i = 0; i < n; i++)
			tb->probes[i].sleep_us = us;
		if (mode == 0) {
			must_dispatch(e, tb);
			ev = must_wait(fanout_default_sink(e));
		} else {
			assert_int_equal(fanout_run(e, &tb->b, &ev), 0);
		}
		check_all_completed(ev, tb);
		for (unsigned i = 0; i < n; i++)
			check(&ev->results[i]);
		fanout_event_free(ev);
		tb_free(tb);
	}
}

static void duration_zero(const struct fanout_result *r)
{
	assert_int_equal(r->duration_ns, 0);
}

/* A child that slept 1 ms ran at least that long (a lower bound of the
 * monotonic clock, not a timing assertion: it cannot fail on a slow
 * host). */
static void duration_slept(const struct fanout_result *r)
{
	assert_true(r->duration_ns >= 1000000u / 2);
}

static void no_clock_durations_are_zero(void **state)
{
	struct fanout_engine *e = engine_flags(2, FANOUT_NO_CHILD_CLOCK);

	sleepers(e, 1, 1000, duration_zero);
	sleepers(e, 6, 1000, duration_zero);
	fanout_destroy(e);
}

static void default_times_children(void **state)
{
	struct fanout_engine *e = engine_flags(2, 0);

	sleepers(e, 1, 1000, duration_slept);
	sleepers(e, 6, 1000, duration_slept);
	fanout_destroy(e);
}

/* Many cheap children: adaptive chunking (which times chunks instead of
 * children under the flag) still runs each exactly once, through
 * dispatch, run, and a helping wait (whose chunks ask for no timing). */
static void no_clock_big_batches(void **state)
{
	struct fanout_engine *e =
		engine_flags(2, FANOUT_NO_CHILD_CLOCK | FANOUT_WAIT_HELPS);
	const unsigned sizes[] = {2, 64, 513, 4096};

	for (unsigned k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
		struct fanout_stats before = stats_of(e), after;
		struct fanout_event *ev;
		struct tbatch *tb = tb_new(sizes[k]);

		must_dispatch(e, tb);
		ev = must_wait(fanout_default_sink(e));
		check_all_completed(ev, tb);
		for (unsigned i = 0; i < tb->n; i++) {
			assert_int_equal(ev->results[i].duration_ns, 0);
			atomic_store(&tb->probes[i].runs, 0);
		}
		fanout_event_free(ev);
		assert_int_equal(fanout_run(e, &tb->b, &ev), 0);
		check_all_completed(ev, tb);
		for (unsigned i = 0; i < tb->n; i++)
			assert_int_equal(ev->results[i].duration_ns, 0);
		fanout_event_free(ev);
		after = stats_of(e);
		assert_int_equal(after.children_run - before.children_run,
				 2 * tb->n);
		assert_int_equal(after.completed - before.completed, 2);
		tb_free(tb);
	}
	fanout_destroy(e);
}

static _Atomic(struct fanout_pending *) deferred;

static int defer_fn(struct fanout_child *c, void *arg)
{
	struct fanout_pending *p = fanout_defer(c);

	(void)arg;
	CHECK(p != NULL);
	atomic_store(&deferred, p);
	return -EINPROGRESS;
}

static struct fanout_pending *wait_deferred(void)
{
	uint64_t end = mono_ms() + WAIT_MS;
	struct fanout_pending *p;

	while (!(p = atomic_exchange(&deferred, NULL))) {
		assert_true(mono_ms() < end);
		sleep_us(100);
	}
	return p;
}

/* A deferred child's duration runs until it is finished: completed by the
 * caller, or abandoned by a cancel.  Under the flag it is 0 either way. */
static void deferred_durations(unsigned flags,
			       void (*check)(const struct fanout_result *r))
{
	struct fanout_engine *e = engine_flags(1, flags);
	struct fanout_task t = {"deferred", defer_fn, NULL};
	struct fanout_batch b = {.tasks = &t, .ntasks = 1};
	struct fanout_event *ev;
	struct fanout_pending *p;
	fanout_id id;

	assert_int_equal(fanout_dispatch(e, &b, NULL), 0);
	p = wait_deferred();
	sleep_ms(1);
	assert_int_equal(fanout_complete(p, NULL), 0);
	ev = must_wait(fanout_default_sink(e));
	assert_int_equal(ev->results[0].status, FANOUT_COMPLETED);
	check(&ev->results[0]);
	fanout_event_free(ev);

	assert_int_equal(fanout_dispatch(e, &b, &id), 0);
	p = wait_deferred();
	sleep_ms(1);
	assert_int_equal(
		fanout_cancel(e, id,
			      FANOUT_CANCEL_INTERRUPT | FANOUT_CANCEL_ABANDON),
		0);
	ev = must_wait(fanout_default_sink(e));
	assert_int_equal(ev->results[0].status, FANOUT_INTERRUPTED);
	check(&ev->results[0]);
	fanout_event_free(ev);
	assert_int_equal(fanout_complete(p, NULL), -EALREADY);
	fanout_destroy(e);
}

static void no_clock_deferred_zero(void **state)
{
	deferred_durations(FANOUT_NO_CHILD_CLOCK, duration_zero);
}

static void default_deferred_timed(void **state)
{
	deferred_durations(0, duration_slept);
}

/* ------------------------------------------------------ FANOUT_BORROW_TASKS */

/* Each result's goal is the caller's own string (borrowed) or a copy with
 * the same text (default); a NULL goal reads "" either way. */
static void goals_borrowed_or_copied(void **state)
{
	struct fanout_engine *e = engine_flags(2, 0);

	for (int borrow = 0; borrow < 2; borrow++) {
		for (int mode = 0; mode < 2; mode++) {
			struct tbatch *tb = tb_new(5);
			struct fanout_event *ev;

			tb->tasks[4].goal = NULL;
			tb->b.flags = borrow ? FANOUT_BORROW_TASKS : 0;
			if (mode == 0) {
				must_dispatch(e, tb);
				ev = must_wait(fanout_default_sink(e));
			} else {
				assert_int_equal(fanout_run(e, &tb->b, &ev), 0);
			}
			assert_int_equal(ev->ncompleted, 5);
			for (unsigned i = 0; i < 4; i++) {
				const char *g = ev->results[i].goal;

				assert_string_equal(g, tb->goals[i]);
				if (borrow)
					assert_ptr_equal(g, tb->goals[i]);
				else
					assert_ptr_not_equal(g, tb->goals[i]);
			}
			assert_non_null(ev->results[4].goal);
			assert_string_equal(ev->results[4].goal, "");
			fanout_event_free(ev);
			tb_free(tb);
		}
	}
	fanout_destroy(e);
}

/* Children never started (cancelled) of a borrowed batch report the
 * caller's goal too, and "" for NULL. */
static void borrowed_goals_of_skipped_children(void **state)
{
	struct fanout_engine *e = engine_flags(1, 0);
	struct tbatch *tb = tb_new(4);
	atomic_int gate = 0;
	struct fanout_event *ev;
	fanout_id id;

	tb->probes[0].gate = &gate;
	tb->tasks[3].goal = NULL;
	tb->b.flags = FANOUT_BORROW_TASKS;
	id = must_dispatch(e, tb);
	assert_true(wait_ge(&tb->probes[0].runs, 1, WAIT_MS));
	assert_int_equal(fanout_cancel(e, id, FANOUT_CANCEL_PENDING), 0);
	atomic_store(&gate, 1);
	ev = must_wait(fanout_default_sink(e));
	assert_int_equal(ev->results[0].status, FANOUT_COMPLETED);
	for (unsigned i = 1; i < 4; i++) {
		assert_int_equal(ev->results[i].status, FANOUT_INTERRUPTED);
		assert_int_equal(atomic_load(&tb->probes[i].runs), 0);
	}
	assert_ptr_equal(ev->results[1].goal, tb->goals[1]);
	assert_ptr_equal(ev->results[2].goal, tb->goals[2]);
	assert_string_equal(ev->results[3].goal, "");
	fanout_event_free(ev);
	tb_free(tb);
	fanout_destroy(e);
}

static int must_not_run(struct fanout_child *c, void *arg)
{
	(void)c;
	(void)arg;
	CHECK(!"a task changed after the call ran");
	return -EIO;
}

/* Default: the task array is copied, so changing it after the call
 * returned (fn, arg and goal of children not started yet) changes nothing. */
static void default_copies_task_array(void **state)
{
	struct fanout_engine *e = engine_flags(1, 0);
	struct tbatch *tb = tb_new(4);
	atomic_int gate = 0, wrong = 0;
	struct fanout_event *ev;

	tb->probes[0].gate = &gate; /* one worker: the others wait */
	must_dispatch(e, tb);
	assert_true(wait_ge(&tb->probes[0].runs, 1, WAIT_MS));
	for (unsigned i = 0; i < 4; i++) {
		tb->tasks[i].fn = must_not_run;
		tb->tasks[i].arg = &wrong;
		tb->tasks[i].goal = "changed";
	}
	atomic_store(&gate, 1);
	ev = must_wait(fanout_default_sink(e));
	tb->tasks[0].goal = tb->goals[0]; /* check_all_completed's view */
	check_all_completed(ev, tb);
	fanout_event_free(ev);
	tb_free(tb);
	fanout_destroy(e);
}

/* The same through fanout_run: child 0 rewrites the caller's array while
 * its siblings are still to run. */
struct rewrite {
	struct fanout_task *tasks;
	unsigned n;
	atomic_int ran;
};

static int rewrite_fn(struct fanout_child *c, void *arg)
{
	struct rewrite *rw = arg;

	atomic_fetch_add(&rw->ran, 1);
	if (fanout_child_index(c) == 0)
		for (unsigned i = 1; i < rw->n; i++)
			rw->tasks[i].fn = must_not_run;
	return 0;
}

static void default_run_copies_task_array(void **state)
{
	struct fanout_engine *e = engine_flags(1, 0);
	struct fanout_task t[64];
	struct rewrite rw = {t, 64, 0};
	struct fanout_batch b = {.tasks = t, .ntasks = 64};
	struct fanout_event *ev;

	for (unsigned i = 0; i < 64; i++)
		t[i] = (struct fanout_task){"rw", rewrite_fn, &rw};
	assert_int_equal(fanout_run(e, &b, &ev), 0);
	assert_int_equal(ev->ncompleted, 64);
	assert_int_equal(atomic_load(&rw.ran), 64);
	fanout_event_free(ev);
	fanout_destroy(e);
}

/* A big borrowed batch whose tasks share one goal: every child runs once
 * and every result points at that goal. */
static void borrowed_big_batch(void **state)
{
	struct fanout_engine *e = engine_flags(2, FANOUT_NO_CHILD_CLOCK);
	static const char goal[] = "shared";
	const unsigned n = 4096;
	struct fanout_task *t = calloc(n, sizeof(*t));
	struct fanout_batch b = {
		.tasks = t, .ntasks = n, .flags = FANOUT_BORROW_TASKS};
	struct fanout_event *ev;
	atomic_int count = 0;

	assert_non_null(t);
	for (unsigned i = 0; i < n; i++)
		t[i] = (struct fanout_task){goal, count_fn, &count};
	assert_int_equal(fanout_dispatch(e, &b, NULL), 0);
	ev = must_wait(fanout_default_sink(e));
	assert_int_equal(ev->ncompleted, n);
	for (unsigned i = 0; i < n; i++)
		assert_ptr_equal(ev->results[i].goal, goal);
	fanout_event_free(ev);
	assert_int_equal(fanout_run(e, &b, &ev), 0);
	assert_int_equal(ev->ncompleted, n);
	assert_ptr_equal(ev->results[n - 1].goal, goal);
	fanout_event_free(ev);
	assert_int_equal(atomic_load(&count), 2 * n);
	free(t);
	fanout_destroy(e);
}

/* Unknown bits in fanout_batch.flags: -EINVAL from every entry point, and
 * nothing accepted - no record, no event, no child run, only
 * stats.rejected moves. */
static void bad_batch_flags_refused(void **state)
{
	struct fanout_engine *e = engine_flags(1, 0);
	atomic_int ran = 0;
	struct fanout_task t = {"x", count_fn, &ran};
	struct fanout_batch b = {.tasks = &t, .ntasks = 1, .flags = 0x100};
	struct fanout_stats before = stats_of(e), after;
	struct fanout_event *ev = NULL;
	fanout_id id = 0;
	size_t n = 99;

	assert_int_equal(fanout_dispatch(e, &b, &id), -EINVAL);
	assert_int_equal(fanout_run(e, &b, &ev), -EINVAL);
	assert_int_equal(fanout_delegate(e, &b, &id, &ev), -EINVAL);
	b.flags = FANOUT_BORROW_TASKS << 1;
	assert_int_equal(fanout_dispatch(e, &b, &id), -EINVAL);
	assert_null(ev);
	assert_true(id == 0);
	after = stats_of(e);
	assert_int_equal(after.rejected, before.rejected + 4);
	assert_int_equal(after.dispatched, before.dispatched);
	assert_int_equal(after.runs, before.runs);
	assert_int_equal(after.completed, before.completed);
	assert_int_equal(after.children_run, before.children_run);
	assert_int_equal(after.running, 0);
	assert_int_equal(fanout_list(e, NULL, 0, &n), 0);
	assert_int_equal(n, 0);
	assert_no_event(fanout_default_sink(e));
	assert_int_equal(atomic_load(&ran), 0);
	fanout_destroy(e);
}

/* ------------------------------------------------ FANOUT_RUNNERS_ON_DEMAND */

static atomic_int od_running, od_most;

static int od_slow_fn(struct fanout_child *c, void *arg)
{
	int now = atomic_fetch_add(&od_running, 1) + 1, most;

	(void)c;
	(void)arg;
	most = atomic_load(&od_most);
	while (now > most &&
	       !atomic_compare_exchange_weak(&od_most, &most, now))
		;
	sleep_us(3000);
	atomic_fetch_sub(&od_running, 1);
	return 0;
}

/* Eight children of 3 ms each on @e: how many ran at once at most. */
static int od_slow_batch(struct fanout_engine *e)
{
	struct fanout_task t[8];
	struct fanout_batch b = {.tasks = t, .ntasks = 8};
	struct fanout_event *ev;

	for (unsigned i = 0; i < 8; i++)
		t[i] = (struct fanout_task){"slow", od_slow_fn, NULL};
	atomic_store(&od_running, 0);
	atomic_store(&od_most, 0);
	assert_int_equal(fanout_dispatch(e, &b, NULL), 0);
	ev = must_wait(fanout_default_sink(e));
	assert_int_equal(ev->ncompleted, 8);
	fanout_event_free(ev);
	return atomic_load(&od_most);
}

/* Every child exactly once, at every size, and the held tokens' ring
 * credits come back: the ring has 3, and a batch of 2 or more takes 2 (one
 * held).  Had finalise kept the held ones, the quick batches would have
 * used them up, and the slow batch at the end would get one token and no
 * second runner. */
static void on_demand_exactly_once_and_credits_back(void **state)
{
	static const unsigned sizes[] = {1, 2, 3, 8, 64, 513};
	struct fanout_engine *e =
		NEW_ENGINE(.workers = 2, .queue_slots = 4,
			   .flags = FANOUT_NO_PIN | FANOUT_RUNNERS_ON_DEMAND);

	for (unsigned s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
		for (unsigned r = 0; r < 20; r++) {
			struct tbatch *tb = tb_new(sizes[s]);
			fanout_id id = must_dispatch(e, tb);
			struct fanout_event *ev =
				must_wait(fanout_default_sink(e));

			assert_true(ev->id == id);
			check_all_completed(ev, tb);
			fanout_event_free(ev);
			tb_free(tb);
		}
	}
	assert_int_equal(od_slow_batch(e), 2);
	fanout_destroy(e);
}

/* Slow children get the other runner: the first child alone takes 3 ms,
 * far more than the 20 us after which the held token is submitted, so
 * the other worker runs children beside it.  Without the submit, one
 * runner would run all eight one after the other. */
static void on_demand_slow_children_get_a_second_runner(void **state)
{
	struct fanout_engine *e =
		NEW_ENGINE(.workers = 2,
			   .flags = FANOUT_NO_PIN | FANOUT_RUNNERS_ON_DEMAND);

	assert_int_equal(od_slow_batch(e), 2);
	fanout_destroy(e);
}

/* Both flags together, and the engine flags all at once. */
static void flags_combine(void **state)
{
	struct fanout_engine *e =
		engine_flags(2, FANOUT_WAIT_HELPS | FANOUT_NO_CHILD_CLOCK |
					FANOUT_RUNNERS_ON_DEMAND);
	struct tbatch *tb = tb_new(32);
	struct fanout_event *ev;

	for (unsigned i = 0; i < tb->n; i++)
		tb->probes[i].sleep_us = 100;
	tb->b.flags = FANOUT_BORROW_TASKS;
	assert_int_equal(fanout_delegate(e, &tb->b, NULL, &ev),
			 FANOUT_BACKGROUND);
	ev = must_wait(fanout_default_sink(e));
	check_all_completed(ev, tb);
	for (unsigned i = 0; i < tb->n; i++) {
		assert_ptr_equal(ev->results[i].goal, tb->goals[i]);
		assert_int_equal(ev->results[i].duration_ns, 0);
	}
	fanout_event_free(ev);
	tb_free(tb);
	fanout_destroy(e);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		TC(no_clock_durations_are_zero),
		TC(default_times_children),
		TC(no_clock_big_batches),
		TC(no_clock_deferred_zero),
		TC(default_deferred_timed),
		TC(goals_borrowed_or_copied),
		TC(borrowed_goals_of_skipped_children),
		TC(default_copies_task_array),
		TC(default_run_copies_task_array),
		TC(borrowed_big_batch),
		TC(bad_batch_flags_refused),
		TC(on_demand_exactly_once_and_credits_back),
		TC(on_demand_slow_children_get_a_second_runner),
		TC(flags_combine),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
