/* SPDX-License-Identifier: MIT */
/* test_cancel.c - fanout_cancel: refusals, PENDING, INTERRUPT, exactly once. */
#include "common.h"

static struct fanout_engine *eng1(void)
{
	return NEW_ENGINE(.workers = 1, .max_children = 1,
			  .flags = FANOUT_NO_PIN);
}

/* Index of the one probe that has started; fails unless exactly one. */
static unsigned wait_one_started(struct tbatch *tb)
{
	uint64_t end = mono_ms() + WAIT_MS;

	while (tb_runs(tb) < 1) {
		assert_true(mono_ms() < end);
		sleep_us(100);
	}
	assert_int_equal(tb_runs(tb), 1);
	for (unsigned i = 0; i < tb->n; i++)
		if (atomic_load(&tb->probes[i].runs))
			return i;
	fail();
	return 0;
}

static void assert_not_run(const struct fanout_result *r, struct probe *p)
{
	assert_int_equal(r->status, FANOUT_INTERRUPTED);
	assert_int_equal(r->code, -ECANCELED);
	assert_int_equal(r->duration_ns, 0);
	assert_non_null(r->error);
	assert_int_equal(atomic_load(&p->runs), 0);
}

static void cancel_einval(void **state)
{
	struct fanout_engine *e = eng1();
	atomic_int gate = 0;
	struct tbatch *tb = tb_new(2);
	struct fanout_info info;

	tb_gate(tb, &gate);
	fanout_id id = must_dispatch(e, tb);
	assert_int_equal(fanout_cancel(NULL, id, FANOUT_CANCEL_PENDING),
			 -EINVAL);
	assert_int_equal(fanout_cancel(e, 0, FANOUT_CANCEL_PENDING), -EINVAL);
	assert_int_equal(fanout_cancel(e, 0, FANOUT_CANCEL_INTERRUPT), -EINVAL);
	assert_int_equal(fanout_cancel(e, id, 0), -EINVAL);
	assert_int_equal(fanout_cancel(e, id, 0x4), -EINVAL);
	assert_int_equal(fanout_cancel(e, id, FANOUT_CANCEL_PENDING | 0x8),
			 -EINVAL);
	assert_int_equal(
		fanout_cancel(e, id, FANOUT_CANCEL_INTERRUPT | 0x80000000u),
		-EINVAL);
	/* nothing changed */
	assert_int_equal(fanout_lookup(e, id, &info), 0);
	assert_false(info.cancelled);
	assert_int_equal(info.status, FANOUT_RUNNING);
	assert_int_equal(stats_of(e).cancelled, 0);

	atomic_store(&gate, 1);
	struct fanout_event *ev = must_wait(fanout_default_sink(e));
	assert_true(ev->id == id);
	check_all_completed(ev, tb);
	for (unsigned i = 0; i < 2; i++)
		assert_false(tb->probes[i].interrupted_seen);
	fanout_event_free(ev);
	tb_free(tb);
	fanout_destroy(e);
}

static void cancel_enoent(void **state)
{
	struct fanout_engine *e = eng1();

	assert_int_equal(fanout_cancel(e, 12345, FANOUT_CANCEL_PENDING),
			 -ENOENT);
	struct tbatch *tb = tb_new(1);
	fanout_id id = must_dispatch(e, tb);
	fanout_id other = id ^ 0x5a5a5a5a00000000ull;
	assert_true(other != 0 && other != id);
	assert_int_equal(fanout_cancel(e, other, FANOUT_CANCEL_INTERRUPT),
			 -ENOENT);
	assert_int_equal(fanout_cancel(e, ~id, FANOUT_CANCEL_PENDING), -ENOENT);
	struct fanout_event *ev = must_wait(fanout_default_sink(e));
	assert_false(ev->cancelled);
	fanout_event_free(ev);
	assert_int_equal(stats_of(e).cancelled, 0);
	tb_free(tb);
	fanout_destroy(e);
}

static void cancel_ealready(void **state)
{
	struct fanout_engine *e = eng1();
	struct tbatch *tb = tb_new(2);
	struct fanout_info info;
	fanout_id id = must_dispatch(e, tb);
	struct fanout_event *ev = must_wait(fanout_default_sink(e));

	assert_true(ev->id == id);
	assert_int_equal(fanout_cancel(e, id, FANOUT_CANCEL_PENDING),
			 -EALREADY);
	assert_int_equal(fanout_cancel(e, id, FANOUT_CANCEL_INTERRUPT),
			 -EALREADY);
	assert_int_equal(fanout_lookup(e, id, &info), 0);
	assert_false(info.cancelled);
	assert_int_equal(info.status, FANOUT_COMPLETED);
	assert_int_equal(stats_of(e).cancelled, 0);
	assert_false(ev->cancelled);
	fanout_event_free(ev);
	assert_no_event(fanout_default_sink(e));
	tb_free(tb);
	fanout_destroy(e);
}

static void cancel_pending_skips_unstarted(void **state)
{
	struct fanout_engine *e = eng1();
	atomic_int gate = 0;
	struct tbatch *tb = tb_new(5);
	struct fanout_info info;

	tb_gate(tb, &gate); /* whichever starts first blocks the worker */
	fanout_id id = must_dispatch(e, tb);
	unsigned k = wait_one_started(tb);

	assert_int_equal(fanout_cancel(e, id, FANOUT_CANCEL_PENDING), 0);
	assert_int_equal(fanout_lookup(e, id, &info), 0);
	assert_true(info.cancelled);
	assert_int_equal(info.status, FANOUT_RUNNING);
	atomic_store(&gate, 1);

	struct fanout_event *ev = must_wait(fanout_default_sink(e));
	assert_true(ev->id == id);
	assert_int_equal(ev->nresults, 5);
	for (unsigned i = 0; i < 5; i++) {
		const struct fanout_result *r = &ev->results[i];

		assert_int_equal(r->index, i);
		assert_string_equal(r->goal, tb->goals[i]);
		if (i == k) {
			/* the running one was not interrupted */
			assert_int_equal(r->status, FANOUT_COMPLETED);
			assert_int_equal(r->code, 0);
			assert_true(r->duration_ns > 0);
			assert_int_equal(atomic_load(&tb->probes[i].runs), 1);
			assert_false(tb->probes[i].interrupted_seen);
		} else {
			assert_not_run(r, &tb->probes[i]);
		}
	}
	assert_true(ev->cancelled);
	assert_int_equal(ev->status, FANOUT_COMPLETED);
	assert_int_equal(ev->ncompleted, 1);
	assert_int_equal(ev->ninterrupted, 4);
	assert_int_equal(ev->nerror, 0);
	fanout_event_free(ev);
	assert_no_event(fanout_default_sink(e));

	assert_int_equal(fanout_lookup(e, id, &info), 0);
	assert_true(info.cancelled);
	assert_int_equal(info.status, FANOUT_COMPLETED);
	assert_int_equal(info.ndone, 5);
	struct fanout_stats st = stats_of(e);
	assert_int_equal(st.cancelled, 1);
	assert_int_equal(st.children_skipped, 4);
	assert_int_equal(st.children_run, 1);
	assert_int_equal(fanout_cancel(e, id, FANOUT_CANCEL_PENDING),
			 -EALREADY);
	tb_free(tb);
	fanout_destroy(e);
}

static void cancel_interrupt_running_child(void **state)
{
	struct fanout_engine *e = eng1();
	struct tbatch *tb = tb_new(3);
	struct fanout_info info;

	for (unsigned i = 0; i < 3; i++)
		tb->probes[i].until_interrupted = true;
	fanout_id id = must_dispatch(e, tb);
	unsigned k = wait_one_started(tb);

	assert_int_equal(fanout_cancel(e, id, FANOUT_CANCEL_INTERRUPT), 0);
	struct fanout_event *ev = must_wait(fanout_default_sink(e));
	assert_true(ev->id == id);
	assert_int_equal(ev->nresults, 3);
	for (unsigned i = 0; i < 3; i++) {
		const struct fanout_result *r = &ev->results[i];

		assert_int_equal(r->index, i);
		if (i == k) {
			assert_int_equal(r->status, FANOUT_INTERRUPTED);
			assert_int_equal(r->code, -ECANCELED);
			assert_true(r->duration_ns > 0);
			assert_int_equal(atomic_load(&tb->probes[i].runs), 1);
			assert_true(tb->probes[i].interrupted_seen);
		} else {
			assert_not_run(r, &tb->probes[i]);
		}
	}
	assert_true(ev->cancelled);
	assert_int_equal(ev->status, FANOUT_INTERRUPTED);
	assert_int_equal(ev->ninterrupted, 3);
	assert_non_null(ev->error);
	fanout_event_free(ev);
	assert_no_event(fanout_default_sink(e));
	assert_int_equal(fanout_lookup(e, id, &info), 0);
	assert_true(info.cancelled);
	assert_int_equal(info.status, FANOUT_INTERRUPTED);
	struct fanout_stats st = stats_of(e);
	assert_int_equal(st.cancelled, 1);
	assert_int_equal(st.children_skipped, 2);
	tb_free(tb);
	fanout_destroy(e);
}

/* What an interrupted child reports is up to it. */
static void cancel_interrupt_child_may_complete(void **state)
{
	struct fanout_engine *e = eng1();
	atomic_int gate = 0;
	struct tbatch *tb = tb_new(1);

	tb->probes[0].gate = &gate;
	fanout_id id = must_dispatch(e, tb);
	wait_one_started(tb);
	assert_int_equal(fanout_cancel(e, id, FANOUT_CANCEL_INTERRUPT), 0);
	atomic_store(&gate, 1);
	struct fanout_event *ev = must_wait(fanout_default_sink(e));
	assert_true(ev->id == id);
	assert_true(tb->probes[0].interrupted_seen);
	assert_int_equal(ev->results[0].status, FANOUT_COMPLETED);
	assert_int_equal(ev->status, FANOUT_COMPLETED);
	assert_true(ev->cancelled);
	fanout_event_free(ev);
	tb_free(tb);
	fanout_destroy(e);
}

static void cancel_twice(void **state)
{
	struct fanout_engine *e = eng1();
	struct tbatch *tb = tb_new(3);

	for (unsigned i = 0; i < 3; i++)
		tb->probes[i].until_interrupted = true;
	fanout_id id = must_dispatch(e, tb);
	unsigned k = wait_one_started(tb);

	assert_int_equal(fanout_cancel(e, id, FANOUT_CANCEL_PENDING), 0);
	assert_int_equal(fanout_cancel(e, id, FANOUT_CANCEL_PENDING), 0);
	/* PENDING does not interrupt: the running child keeps looping */
	sleep_ms(30);
	assert_int_equal(atomic_load(&tb->probes[k].finished), 0);
	struct fanout_event *ev = NULL;
	assert_int_equal(fanout_poll(fanout_default_sink(e), &ev), -EAGAIN);

	assert_int_equal(fanout_cancel(e, id, FANOUT_CANCEL_INTERRUPT), 0);
	int rc = fanout_cancel(e, id, FANOUT_CANCEL_INTERRUPT);
	assert_true(rc == 0 || rc == -EALREADY); /* it may have finished */
	ev = must_wait(fanout_default_sink(e));
	assert_true(ev->id == id);
	assert_true(ev->cancelled);
	assert_int_equal(ev->status, FANOUT_INTERRUPTED);
	for (unsigned i = 0; i < 3; i++) {
		if (i == k) {
			assert_int_equal(ev->results[i].status,
					 FANOUT_INTERRUPTED);
			assert_int_equal(atomic_load(&tb->probes[i].runs), 1);
		} else {
			assert_not_run(&ev->results[i], &tb->probes[i]);
		}
	}
	fanout_event_free(ev);
	assert_no_event(fanout_default_sink(e));
	assert_int_equal(fanout_cancel(e, id, FANOUT_CANCEL_INTERRUPT),
			 -EALREADY);
	/* "delegations cancelled": one delegation, however many calls */
	assert_int_equal(stats_of(e).cancelled, 1);
	tb_free(tb);
	fanout_destroy(e);
}

/* Two workers, a big batch: every child exactly once, run or skipped. */
static void cancel_big_batch_exactly_once(void **state)
{
	struct fanout_engine *e =
		NEW_ENGINE(.workers = 2, .flags = FANOUT_NO_PIN);
	atomic_int gate = 0;
	struct tbatch *tb = tb_new(1000);

	tb_gate(tb, &gate);
	fanout_id id = must_dispatch(e, tb);
	uint64_t end = mono_ms() + WAIT_MS;
	while (tb_runs(tb) < 1) {
		assert_true(mono_ms() < end);
		sleep_us(100);
	}
	assert_int_equal(fanout_cancel(e, id, FANOUT_CANCEL_PENDING), 0);
	atomic_store(&gate, 1);
	struct fanout_event *ev = must_wait(fanout_default_sink(e));
	unsigned ran = 0;

	assert_true(ev->id == id);
	assert_int_equal(ev->nresults, 1000);
	for (unsigned i = 0; i < 1000; i++) {
		const struct fanout_result *r = &ev->results[i];

		assert_int_equal(r->index, i);
		if (r->status == FANOUT_COMPLETED) {
			assert_int_equal(atomic_load(&tb->probes[i].runs), 1);
			ran++;
		} else {
			assert_not_run(r, &tb->probes[i]);
		}
	}
	assert_int_equal(ran, (unsigned)tb_runs(tb));
	assert_true(ran >= 1 && ran <= 2); /* two workers were busy */
	assert_int_equal(ev->ncompleted, ran);
	assert_int_equal(ev->ninterrupted, 1000 - ran);
	struct fanout_stats st = stats_of(e);
	assert_int_equal(st.children_skipped, 1000 - ran);
	assert_int_equal(st.children_run, ran);
	fanout_event_free(ev);
	assert_no_event(fanout_default_sink(e));
	tb_free(tb);
	fanout_destroy(e);
}

/*
 * Cancel racing the children's completion: 0 or -EALREADY; either way one
 * event, every child exactly once (run or skipped), and event.cancelled /
 * lookup's cancelled say whether the cancel took.
 */
static void cancel_races_completion(void **state)
{
	struct fanout_engine *e =
		NEW_ENGINE(.workers = 2, .flags = FANOUT_NO_PIN);
	unsigned took = 0, mismatch = 0, lmismatch = 0;

	for (int k = 0; k < 600; k++) {
		struct tbatch *tb = tb_new(8);
		struct fanout_info info;

		fanout_id id = must_dispatch(e, tb);
		/* aim the cancel at different moments of the batch's life */
		if (k & 1)
			sleep_us((unsigned)(k % 13) * 5);
		int rc = fanout_cancel(e, id,
				       (k & 2) ? FANOUT_CANCEL_INTERRUPT :
						 FANOUT_CANCEL_PENDING);
		assert_true(rc == 0 || rc == -EALREADY);
		took += rc == 0;
		struct fanout_event *ev = must_wait(fanout_default_sink(e));
		assert_true(ev->id == id);
		if (ev->cancelled != (rc == 0)) {
			if (!mismatch++)
				print_error(
					"iteration %d: fanout_cancel returned "
					"%d but event.cancelled is %d\n",
					k, rc, ev->cancelled);
		}
		unsigned ran = 0;
		for (unsigned i = 0; i < 8; i++) {
			const struct fanout_result *r = &ev->results[i];

			assert_int_equal(r->index, i);
			if (r->status == FANOUT_COMPLETED) {
				assert_int_equal(
					atomic_load(&tb->probes[i].runs), 1);
				ran++;
			} else {
				assert_true(rc == 0);
				assert_not_run(r, &tb->probes[i]);
			}
		}
		assert_int_equal(ran, (unsigned)tb_runs(tb));
		assert_int_equal(fanout_lookup(e, id, &info), 0);
		if (info.cancelled != (rc == 0) && !lmismatch++)
			print_error(
				"iteration %d: fanout_cancel returned %d but "
				"lookup says cancelled=%d\n",
				k, rc, info.cancelled);
		fanout_event_free(ev);
		tb_free(tb);
	}
	assert_no_event(fanout_default_sink(e));
	uint64_t counted = stats_of(e).cancelled;
	fanout_destroy(e);
	assert_int_equal(mismatch, 0);
	assert_int_equal(lmismatch, 0);
	assert_int_equal(counted, took);
}

/* Cancel a synchronous fanout_run from another thread. */
struct idspin {
	atomic_ullong id;
	atomic_int started;
};

static int idspin_fn(struct fanout_child *c, void *arg)
{
	struct idspin *s = arg;
	uint64_t end = mono_ms() + GATE_MS;

	atomic_store(&s->id, fanout_child_id(c));
	atomic_fetch_add(&s->started, 1);
	while (!fanout_interrupted(c) && mono_ms() < end)
		sleep_us(50);
	CHECK(fanout_interrupted(c));
	return -ECANCELED;
}

struct runner {
	struct fanout_engine *e;
	struct idspin spin;
	int rc;
	struct fanout_event *ev;
};

static void *runner_thread(void *arg)
{
	struct runner *r = arg;
	struct fanout_task t[3];

	for (int i = 0; i < 3; i++)
		t[i] = (struct fanout_task){"spin", idspin_fn, &r->spin};
	struct fanout_batch b = {.tasks = t, .ntasks = 3};
	r->rc = fanout_run(r->e, &b, &r->ev);
	return NULL;
}

static void cancel_synchronous_run(void **state)
{
	struct fanout_engine *e =
		NEW_ENGINE(.workers = 1, .flags = FANOUT_NO_PIN);
	struct runner r = {.e = e};
	struct fanout_info info;

	pthread_t t = spawn(runner_thread, &r);
	assert_true(wait_ge(&r.spin.started, 1, WAIT_MS));
	fanout_id id = atomic_load(&r.spin.id);
	assert_true(id != 0);
	assert_int_equal(fanout_lookup(e, id, &info), 0);
	assert_false(info.background);
	assert_int_equal(fanout_cancel(e, id, FANOUT_CANCEL_INTERRUPT), 0);
	join(t);
	assert_int_equal(r.rc, 0);
	assert_non_null(r.ev);
	assert_true(r.ev->id == id);
	assert_true(r.ev->cancelled);
	assert_int_equal(r.ev->status, FANOUT_INTERRUPTED);
	unsigned started = (unsigned)atomic_load(&r.spin.started);
	unsigned zero = 0;
	for (unsigned i = 0; i < 3; i++) {
		assert_int_equal(r.ev->results[i].status, FANOUT_INTERRUPTED);
		assert_int_equal(r.ev->results[i].code, -ECANCELED);
		if (r.ev->results[i].duration_ns == 0)
			zero++;
	}
	assert_int_equal(zero, 3 - started);
	fanout_event_free(r.ev);
	assert_no_event(fanout_default_sink(e));
	fanout_destroy(e);
}

/* fanout_set_skip_hook(): a task that never starts is handed to its fn's
 * hook, once, and one that runs is not. */
static atomic_int skip_ran, skip_seen[3];

static int skip_fn(struct fanout_child *c, void *arg)
{
	(void)c;
	(void)arg;
	atomic_fetch_add(&skip_ran, 1);
	return 0;
}

static void skip_hook(void *arg)
{
	atomic_fetch_add((atomic_int *)arg, 1);
}

#define SKIP_FILLER(k)                                                         \
	static int skip_filler##k(struct fanout_child *c, void *arg)           \
	{                                                                      \
		(void)c;                                                       \
		(void)arg;                                                     \
		return k;                                                      \
	}
SKIP_FILLER(0)
SKIP_FILLER(1)
SKIP_FILLER(2)
SKIP_FILLER(3)
SKIP_FILLER(4)
SKIP_FILLER(5)
SKIP_FILLER(6)
SKIP_FILLER(7)

static void cancel_skip_hook(void **state)
{
	struct fanout_engine *e = eng1();
	atomic_int gate = 0;
	struct tbatch *hold = tb_new(1);
	struct fanout_task t[3];
	struct fanout_batch b = {.tasks = t, .ntasks = 3};
	fanout_id id;
	unsigned i;

	assert_int_equal(fanout_set_skip_hook(NULL, skip_hook), -EINVAL);
	assert_int_equal(fanout_set_skip_hook(skip_fn, skip_hook), 0);
	/* the one worker held, so no child of b starts before the cancel */
	tb_gate(hold, &gate);
	must_dispatch(e, hold);
	wait_one_started(hold);
	for (i = 0; i < 3; i++)
		t[i] = (struct fanout_task){.fn = skip_fn,
					    .arg = &skip_seen[i]};
	assert_int_equal(fanout_dispatch(e, &b, &id), 0);
	assert_int_equal(fanout_cancel(e, id, FANOUT_CANCEL_PENDING), 0);
	/* the hook ran before the event was published */
	for (i = 0; i < 3; i++)
		assert_int_equal(atomic_load(&skip_seen[i]), 1);
	atomic_store(&gate, 1);
	for (i = 0; i < 2; i++)
		fanout_event_free(must_wait(fanout_default_sink(e)));
	/* children that run are not handed to the hook */
	assert_int_equal(fanout_dispatch(e, &b, &id), 0);
	fanout_event_free(must_wait(fanout_default_sink(e)));
	assert_int_equal(atomic_load(&skip_ran), 3);
	for (i = 0; i < 3; i++)
		assert_int_equal(atomic_load(&skip_seen[i]), 1);
	/* removed: a skip calls nothing; registered again: replaced */
	assert_int_equal(fanout_set_skip_hook(skip_fn, NULL), 0);
	atomic_store(&gate, 0);
	must_dispatch(e, hold);
	assert_true(wait_ge(&hold->probes[0].runs, 2, WAIT_MS));
	assert_int_equal(fanout_dispatch(e, &b, &id), 0);
	assert_int_equal(fanout_cancel(e, id, FANOUT_CANCEL_PENDING), 0);
	atomic_store(&gate, 1);
	for (i = 0; i < 2; i++)
		fanout_event_free(must_wait(fanout_default_sink(e)));
	for (i = 0; i < 3; i++)
		assert_int_equal(atomic_load(&skip_seen[i]), 1);
	assert_int_equal(atomic_load(&skip_ran), 3);
	/* the table is full once FANOUT_MAX_SKIP_HOOKS fns have one (this
	 * process registered skip_fn; a slot is never given back) */
	{
		fanout_fn f[] = {skip_filler0, skip_filler1, skip_filler2,
				 skip_filler3, skip_filler4, skip_filler5,
				 skip_filler6, skip_filler7};
		int err = 0;

		for (i = 0; i < 8 && !err; i++)
			err = fanout_set_skip_hook(f[i], skip_hook);
		assert_int_equal(err, -ENOSPC);
		assert_int_equal(i, FANOUT_MAX_SKIP_HOOKS);
	}
	tb_free(hold);
	fanout_destroy(e);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		TC(cancel_einval),
		TC(cancel_enoent),
		TC(cancel_ealready),
		TC(cancel_pending_skips_unstarted),
		TC(cancel_interrupt_running_child),
		TC(cancel_interrupt_child_may_complete),
		TC(cancel_twice),
		TC(cancel_big_batch_exactly_once),
		TC(cancel_races_completion),
		TC(cancel_synchronous_run),
		TC(cancel_skip_hook),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
