/* SPDX-License-Identifier: MIT */
/*
 * test_deadline.c - fanout_batch.deadline_ns: what a passed deadline
 * reports, that it never fires twice or after the end, many live ones,
 * fanout_run, bad values.  Deadlines are short (10-200 ms); nothing here
 * asserts how late a deadline fires, only what it does.
 */
#include "defer.h"

#include <sched.h>

#define MS (1000000ull)

static struct fanout_engine *eng2(void)
{
	return NEW_ENGINE(.workers = 2, .flags = FANOUT_NO_PIN);
}

static void assert_timed_out_result(const struct fanout_result *r)
{
	assert_int_equal(r->status, FANOUT_INTERRUPTED);
	assert_int_equal(r->code, -ETIMEDOUT);
	assert_non_null(r->error);
}

/* Synchronous children blocked until interrupted, some never started. */
static void deadline_sync_children_blocked(void **state)
{
	struct fanout_engine *e = NEW_ENGINE(.workers = 2, .max_children = 1,
					     .flags = FANOUT_NO_PIN);
	atomic_int started = 0;
	struct fanout_task t[3];
	struct fanout_info info;

	for (int i = 0; i < 3; i++)
		t[i] = (struct fanout_task){"spin", spin_fn, &started};
	struct fanout_batch b = {
		.tasks = t, .ntasks = 3, .deadline_ns = 50 * MS};
	fanout_id id = must_dispatch_b(e, &b);
	struct fanout_event *ev = must_wait(fanout_default_sink(e));
	assert_true(ev->id == id);
	check_shape(ev, 3);
	assert_true(ev->timed_out);
	assert_false(ev->interrupted_by_policy);
	assert_int_equal(ev->status, FANOUT_INTERRUPTED);
	assert_non_null(ev->error);
	unsigned zero = 0;
	for (unsigned i = 0; i < 3; i++) {
		assert_timed_out_result(&ev->results[i]);
		zero += ev->results[i].duration_ns == 0;
	}
	/* max_children 1: one ran (and saw the interrupt), two never did
	 * (none, if the host was so slow that the deadline came first) */
	assert_true(atomic_load(&started) <= 1);
	assert_int_equal(zero, 3 - (unsigned)atomic_load(&started));
	assert_int_equal(fanout_lookup(e, id, &info), 0);
	assert_int_equal(info.status, FANOUT_INTERRUPTED);
	assert_int_equal(info.ndone, 3);
	fanout_event_free(ev);
	assert_no_event(fanout_default_sink(e));
	assert_int_equal(fanout_cancel(e, id, FANOUT_CANCEL_INTERRUPT),
			 -EALREADY);
	fanout_destroy(e);
	assert_true(atomic_load(&started) <= 1);
}

/* Pending children the test never completes before the event. */
static void deadline_pending_never_completed(void **state)
{
	struct fanout_engine *e = eng2();
	struct mbatch *mb = mb_new(3);
	struct cbrec r = {0};
	struct fanout_info info;
	int oc = 1;

	mb->b.deadline_ns = 50 * MS;
	fanout_id id = must_dispatch_b(e, &mb->b);
	/* register on_cancel from here once child 0 deferred (a slow host
	 * may let the deadline come first: then it runs at once, here, or
	 * the child is already finished, or it never started) */
	uint64_t end = mono_ms() + WAIT_MS;
	for (;;) {
		if (atomic_load(&mb->d[0].deferred)) {
			oc = fanout_pending_on_cancel(dc_wait(&mb->d[0]), cb_fn,
						      &r);
			break;
		}
		assert_int_equal(fanout_lookup(e, id, &info), 0);
		if (info.status != FANOUT_RUNNING)
			break;
		assert_true(mono_ms() < end);
		sleep_us(100);
	}
	bool at_once = atomic_load(&r.calls) == 1;
	struct fanout_event *ev = must_wait(fanout_default_sink(e));
	assert_true(ev->id == id);
	check_shape(ev, 3);
	assert_true(ev->timed_out);
	assert_int_equal(ev->status, FANOUT_INTERRUPTED);
	for (unsigned i = 0; i < 3; i++)
		assert_timed_out_result(&ev->results[i]);
	if (oc == 0) {
		/* on_cancel ran once: at once here if the deadline had
		 * passed, else later on the thread that fired it */
		assert_int_equal(atomic_load(&r.calls), 1);
		assert_int_equal(pthread_equal(r.thread, pthread_self()) != 0,
				 at_once);
	} else {
		assert_true(oc == 1 || oc == -EALREADY);
		assert_int_equal(atomic_load(&r.calls), 0);
		print_message("note: the deadline came before on_cancel\n");
	}
	assert_int_equal(fanout_lookup(e, id, &info), 0);
	assert_int_equal(info.npending, 0);
	assert_int_equal(info.ndone, 3);
	for (unsigned i = 0; i < 3; i++) {
		if (!atomic_load(&mb->d[i].runs)) {
			assert_int_equal(ev->results[i].duration_ns, 0);
			continue;
		}
		struct fanout_pending *p = dc_wait(&mb->d[i]);

		assert_non_null(p);
		assert_true(fanout_pending_interrupted(p));
		assert_int_equal(fanout_complete(p, &mb->d[i].o), -EALREADY);
	}
	fanout_event_free(ev);
	assert_no_event(fanout_default_sink(e));
	assert_int_equal(atomic_load(&r.calls), oc == 0);
	fanout_destroy(e);
	mb_free(mb);
}

/*
 * Children that finished before the deadline keep their outcome.  On a
 * slow host the deadline may win a race; every branch is checked for
 * consistency with what the calls returned.
 */
static void deadline_mixed_outcomes(void **state)
{
	struct fanout_engine *e = eng2();
	struct mbatch *mb = mb_new(3);

	mb->d[0].inline_complete = true;
	mb->d[0].o =
		(struct fanout_outcome){.summary = "quick", .summary_len = 5};
	mb->d[2].o.code = -EIO;
	mb->b.deadline_ns = 200 * MS;
	fanout_id id = must_dispatch_b(e, &mb->b);
	int rc2 = dc_complete(&mb->d[2]);
	assert_true(rc2 == 0 || rc2 == -EALREADY);
	struct fanout_event *ev = must_wait(fanout_default_sink(e));
	assert_true(ev->id == id);
	check_shape(ev, 3);
	assert_true(ev->timed_out);
	/* child 0: completed inside fn, unless the deadline came first */
	if (atomic_load(&mb->d[0].runs) &&
	    wait_flag(&mb->d[0].deferred, WAIT_MS) && mb->d[0].inline_rc == 0) {
		assert_int_equal(ev->results[0].status, FANOUT_COMPLETED);
		assert_string_equal(ev->results[0].summary, "quick");
	} else {
		assert_timed_out_result(&ev->results[0]);
	}
	/* child 1: never completed */
	assert_timed_out_result(&ev->results[1]);
	if (rc2 == 0) {
		assert_int_equal(ev->results[2].status, FANOUT_ERROR);
		assert_int_equal(ev->results[2].code, -EIO);
	} else {
		assert_timed_out_result(&ev->results[2]);
	}
	assert_int_equal(fanout_complete(dc_wait(&mb->d[1]), NULL), -EALREADY);
	fanout_event_free(ev);
	assert_no_event(fanout_default_sink(e));
	fanout_destroy(e);
	mb_free(mb);
}

/*
 * A synchronous child that ignores the interrupt and returns 0 after the
 * deadline passed: "children not finished by then are reported
 * FANOUT_INTERRUPTED with code -ETIMEDOUT".  The test knows the deadline
 * has passed because a pending sibling's on_cancel ran.
 */
static void deadline_late_return_reported_timed_out(void **state)
{
	struct fanout_engine *e = eng2();
	struct mbatch *mb = mb_new(2);
	struct fanout_info info;
	atomic_int gate = 0;

	mb_sync(mb, 0)->gate = &gate;
	mb->b.deadline_ns = 50 * MS;
	fanout_id id = must_dispatch_b(e, &mb->b);
	/* the deadline has passed once child 1 (pending or never started)
	 * is interrupted or finished: child 0 waits on the gate */
	uint64_t end = mono_ms() + WAIT_MS;
	for (;;) {
		if (atomic_load(&mb->d[1].deferred) &&
		    fanout_pending_interrupted(dc_wait(&mb->d[1])))
			break;
		assert_int_equal(fanout_lookup(e, id, &info), 0);
		if (info.ndone > 0)
			break;
		assert_true(mono_ms() < end);
		sleep_us(100);
	}
	atomic_store(&gate, 1);
	struct fanout_event *ev = must_wait(fanout_default_sink(e));
	assert_true(ev->id == id);
	assert_true(ev->timed_out);
	/* child 0 returned 0 after the deadline, or never started */
	assert_timed_out_result(&ev->results[0]);
	assert_timed_out_result(&ev->results[1]);
	if (atomic_load(&mb->d[1].runs))
		assert_int_equal(fanout_complete(dc_wait(&mb->d[1]), NULL),
				 -EALREADY);
	fanout_event_free(ev);
	fanout_destroy(e);
	mb_free(mb);
}

/*
 * A delegation that finished before its deadline: timed_out false, and its
 * timer firing later changes nothing.  A second delegation with a later
 * deadline that does pass tells the test the first one's time is over.
 */
static void deadline_after_finish_is_harmless(void **state)
{
	struct fanout_engine *e = eng2();
	struct tbatch *a = tb_new(4);
	struct mbatch *b = mb_new(1);
	struct fanout_info info;

	fanout_id ida = 0;
	struct fanout_event *ev = NULL;

	/* a loaded host may let the deadline win: then try again */
	for (int attempt = 0;; attempt++) {
		assert_true(attempt < 5);
		memset(a->probes, 0, a->n * sizeof(*a->probes));
		a->b.deadline_ns = 100 * MS;
		ida = must_dispatch(e, a);
		ev = must_wait(fanout_default_sink(e));
		assert_true(ev->id == ida);
		if (!ev->timed_out)
			break;
		print_message("note: the deadline beat 4 children\n");
		fanout_event_free(ev);
		for (unsigned i = 0; i < a->n; i++)
			if (atomic_load(&a->probes[i].runs))
				assert_true(wait_flag(&a->probes[i].finished,
						      WAIT_MS));
	}
	check_all_completed(ev, a);
	fanout_event_free(ev);

	b->b.deadline_ns = 150 * MS;
	fanout_id idb = must_dispatch_b(e, &b->b);
	ev = must_wait(fanout_default_sink(e));
	assert_true(ev->id == idb);
	assert_true(ev->timed_out);
	fanout_event_free(ev);

	assert_int_equal(fanout_lookup(e, ida, &info), 0);
	assert_int_equal(info.status, FANOUT_COMPLETED);
	assert_int_equal(info.ndone, 4);
	assert_false(info.cancelled);
	assert_no_event(fanout_default_sink(e));
	assert_int_equal(fanout_complete(dc_wait(&b->d[0]), NULL), -EALREADY);
	fanout_destroy(e);
	tb_free(a);
	mb_free(b);
}

/* A cancel before the deadline: the deadline later finds it finished. */
static void deadline_after_cancel_is_harmless(void **state)
{
	struct fanout_engine *e = eng2();
	struct mbatch *a = mb_new(1), *b = mb_new(1);

	a->b.deadline_ns = 30 * MS;
	fanout_id ida = must_dispatch_b(e, &a->b);
	struct fanout_pending *p = dc_wait(&a->d[0]);
	assert_non_null(p);
	int rc = fanout_cancel(e, ida,
			       FANOUT_CANCEL_INTERRUPT | FANOUT_CANCEL_ABANDON);
	assert_true(rc == 0 || rc == -EALREADY); /* a slow host: deadline */
	struct fanout_event *ev = must_wait(fanout_default_sink(e));
	assert_true(ev->id == ida);
	assert_int_equal(ev->results[0].status, FANOUT_INTERRUPTED);
	if (rc == 0) {
		assert_true(ev->cancelled);
		assert_false(ev->timed_out);
		assert_int_equal(ev->results[0].code, -ECANCELED);
	} else {
		assert_true(ev->timed_out);
		assert_int_equal(ev->results[0].code, -ETIMEDOUT);
	}
	fanout_event_free(ev);
	b->b.deadline_ns = 60 * MS;
	fanout_id idb = must_dispatch_b(e, &b->b);
	ev = must_wait(fanout_default_sink(e));
	assert_true(ev->id == idb);
	assert_true(ev->timed_out);
	fanout_event_free(ev);
	assert_no_event(fanout_default_sink(e));
	assert_int_equal(fanout_complete(p, NULL), -EALREADY);
	assert_int_equal(fanout_complete(dc_wait(&b->d[0]), NULL), -EALREADY);
	fanout_destroy(e);
	mb_free(a);
	mb_free(b);
}

/*
 * Racing deadlines against children that finish around them: one event
 * each, every result either completed or timed out, and no timed-out
 * result in an event that says it did not time out.
 */
struct racer {
	unsigned us;
};

static int racer_fn(struct fanout_child *c, void *arg)
{
	struct racer *r = arg;

	for (unsigned i = 0; i < r->us / 100; i++) {
		if (fanout_interrupted(c))
			return -ECANCELED;
		sleep_us(100);
	}
	return 0;
}

static void deadline_races_completion(void **state)
{
	struct fanout_engine *e =
		NEW_ENGINE(.workers = 2, .flags = FANOUT_NO_PIN);
	enum { N = 300 };
	struct racer rc[2];
	struct fanout_task t[2];
	unsigned timed = 0, clean = 0;

	/* one at a time, so that both endings happen */
	for (unsigned k = 0; k < N; k++) {
		for (unsigned i = 0; i < 2; i++) {
			rc[i].us = ((k * 7 + i * 3) % 5) * 500;
			t[i] = (struct fanout_task){"race", racer_fn, &rc[i]};
		}
		struct fanout_batch b = {.tasks = t,
					 .ntasks = 2,
					 .deadline_ns = (1 + k % 3) * MS};
		fanout_id id = must_dispatch_b(e, &b);
		struct fanout_event *ev = must_wait(fanout_default_sink(e));

		assert_true(ev->id == id);
		check_shape(ev, 2);
		for (unsigned i = 0; i < 2; i++) {
			const struct fanout_result *r = &ev->results[i];

			if (r->status == FANOUT_COMPLETED) {
				assert_int_equal(r->code, 0);
			} else {
				assert_timed_out_result(r);
				assert_true(ev->timed_out);
			}
		}
		timed += ev->timed_out;
		clean += !ev->timed_out;
		fanout_event_free(ev);
	}
	assert_no_event(fanout_default_sink(e));
	fanout_destroy(e);
	print_message("deadline races: %u timed out, %u finished first\n",
		      timed, clean);
}

/* Thousands of live deadlines, staggered: every one fires exactly once. */
#define LIVE_N 5000

static atomic_int live_cb_calls;

static void live_cb(struct fanout_pending *p, void *arg)
{
	atomic_fetch_add(&live_cb_calls, 1);
	atomic_fetch_add((atomic_int *)arg, 1);
}

static int cmp_id(const void *a, const void *b)
{
	fanout_id x = *(const fanout_id *)a, y = *(const fanout_id *)b;

	return x < y ? -1 : x > y;
}

static void many_live_deadlines(void **state)
{
	struct fanout_engine *e = NEW_ENGINE(.workers = 2, .max_async = 8192,
					     .flags = FANOUT_NO_PIN);
	struct dchild *d = calloc(LIVE_N, sizeof(*d));
	struct fanout_task *t = calloc(LIVE_N, sizeof(*t));
	atomic_int *calls = calloc(LIVE_N, sizeof(*calls));
	fanout_id *ids = calloc(LIVE_N, sizeof(*ids));
	fanout_id *got = calloc(LIVE_N, sizeof(*got));

	assert_non_null(d);
	assert_non_null(t);
	assert_non_null(calls);
	assert_non_null(ids);
	assert_non_null(got);
	atomic_store(&live_cb_calls, 0);
	for (unsigned k = 0; k < LIVE_N; k++) {
		d[k].on_cancel = live_cb;
		d[k].on_cancel_arg = &calls[k];
		t[k] = (struct fanout_task){"live", defer_fn, &d[k]};
		struct fanout_batch b = {
			.tasks = &t[k],
			.ntasks = 1,
			.deadline_ns = (10 + (k * 37) % 191) * MS,
		};
		ids[k] = must_dispatch_b(e, &b);
	}
	for (unsigned n = 0; n < LIVE_N; n++) {
		struct fanout_event *ev = must_wait(fanout_default_sink(e));

		got[n] = ev->id;
		if (!ev->timed_out || ev->nresults != 1 ||
		    ev->results[0].status != FANOUT_INTERRUPTED ||
		    ev->results[0].code != -ETIMEDOUT)
			fail_msg("event %u: timed_out %d status %d code %d", n,
				 ev->timed_out, ev->results[0].status,
				 ev->results[0].code);
		fanout_event_free(ev);
	}
	assert_no_event(fanout_default_sink(e));
	qsort(ids, LIVE_N, sizeof(*ids), cmp_id);
	qsort(got, LIVE_N, sizeof(*got), cmp_id);
	for (unsigned k = 0; k < LIVE_N; k++)
		assert_true(ids[k] == got[k]); /* each id once */
	/*
	 * On a slow host (sanitizers) a deadline may fire before its child
	 * started (skipped) or before it registered on_cancel (-EALREADY: it
	 * was already abandoned); otherwise on_cancel ran exactly once.
	 */
	int pending_at_deadline = 0, skipped = 0, late = 0;
	for (unsigned k = 0; k < LIVE_N; k++) {
		if (!atomic_load(&d[k].runs)) {
			assert_int_equal(atomic_load(&calls[k]), 0);
			skipped++;
			continue;
		}
		struct fanout_pending *p = dc_wait(&d[k]);
		assert_non_null(p);
		if (d[k].on_cancel_rc == 0) {
			assert_int_equal(atomic_load(&calls[k]), 1);
			pending_at_deadline++;
		} else {
			assert_int_equal(d[k].on_cancel_rc, -EALREADY);
			assert_int_equal(atomic_load(&calls[k]), 0);
			late++;
		}
		assert_true(fanout_pending_interrupted(p));
		assert_int_equal(fanout_complete(p, NULL), -EALREADY);
	}
	assert_int_equal(atomic_load(&live_cb_calls), pending_at_deadline);
	assert_true(pending_at_deadline > 0);
	print_message("live deadlines: %d fired on pending children, %d "
		      "before the child started, %d before on_cancel\n",
		      pending_at_deadline, skipped, late);
	struct fanout_stats st = stats_of(e);
	assert_int_equal(st.running, 0);
	assert_int_equal(st.completed, LIVE_N);
	fanout_destroy(e);
	assert_int_equal(atomic_load(&live_cb_calls), pending_at_deadline);
	free(d);
	free(t);
	free(calls);
	free(ids);
	free(got);
}

/* A deadline on fanout_run. */
static void deadline_on_run(void **state)
{
	struct fanout_engine *e = eng2();
	struct mbatch *mb = mb_new(4);
	atomic_int started = 0;
	struct fanout_event *ev = NULL;

	for (unsigned i = 0; i < 3; i++)
		mb->tasks[i] = (struct fanout_task){"spin", spin_fn, &started};
	mb->b.deadline_ns = 30 * MS;
	assert_int_equal(fanout_run(e, &mb->b, &ev), 0);
	assert_non_null(ev);
	check_shape(ev, 4);
	assert_true(ev->timed_out);
	assert_int_equal(ev->status, FANOUT_INTERRUPTED);
	for (unsigned i = 0; i < 4; i++)
		assert_timed_out_result(&ev->results[i]);
	fanout_event_free(ev);
	if (atomic_load(&mb->d[3].runs))
		assert_int_equal(fanout_complete(dc_wait(&mb->d[3]), NULL),
				 -EALREADY);
	assert_no_event(fanout_default_sink(e));
	fanout_destroy(e);
	mb_free(mb);
}

/* deadline_ns over FANOUT_MAX_DEADLINE_NS: -EINVAL, nothing changes. */
static void deadline_bad_value(void **state)
{
	struct fanout_engine *e = eng2();
	struct tbatch *tb = tb_new(2);
	struct fanout_event *ev = NULL;
	fanout_id id = 0;
	uint64_t bad[] = {FANOUT_MAX_DEADLINE_NS + 1, UINT64_MAX,
			  FANOUT_MAX_DEADLINE_NS * 2};

	for (unsigned i = 0; i < 3; i++) {
		tb->b.deadline_ns = bad[i];
		assert_int_equal(fanout_dispatch(e, &tb->b, &id), -EINVAL);
		assert_int_equal(fanout_run(e, &tb->b, &ev), -EINVAL);
		assert_null(ev);
		assert_int_equal(fanout_delegate(e, &tb->b, &id, &ev), -EINVAL);
	}
	assert_int_equal(tb_runs(tb), 0);
	struct fanout_stats st = stats_of(e);
	assert_int_equal(st.dispatched, 0);
	assert_int_equal(st.runs, 0);
	assert_int_equal(st.running, 0);
	size_t n = 9;
	assert_int_equal(fanout_list(e, NULL, 0, &n), 0);
	assert_int_equal(n, 0);
	assert_no_event(fanout_default_sink(e));

	/* the maximum itself is accepted */
	tb->b.deadline_ns = FANOUT_MAX_DEADLINE_NS;
	id = must_dispatch(e, tb);
	ev = must_wait(fanout_default_sink(e));
	assert_true(ev->id == id);
	check_all_completed(ev, tb);
	assert_false(ev->timed_out);
	fanout_event_free(ev);
	fanout_destroy(e);
	tb_free(tb);
}

/* A far deadline does not keep shutdown or destroy waiting. */
static void far_deadline_destroy(void **state)
{
	struct fanout_engine *e = eng2();
	struct mbatch *mb = mb_new(1);

	mb->b.deadline_ns = FANOUT_MAX_DEADLINE_NS;
	fanout_id id = must_dispatch_b(e, &mb->b);
	struct fanout_pending *p = dc_wait(&mb->d[0]);
	assert_non_null(p);
	assert_int_equal(fanout_shutdown(e), 0);
	struct fanout_event *ev = NULL;
	assert_int_equal(fanout_poll(fanout_default_sink(e), &ev), 0);
	assert_true(ev->id == id);
	assert_false(ev->timed_out);
	assert_true(ev->cancelled);
	assert_int_equal(ev->results[0].status, FANOUT_INTERRUPTED);
	fanout_event_free(ev);
	fanout_destroy(e);
	assert_int_equal(fanout_complete(p, NULL), -EALREADY);
	mb_free(mb);
}

/*
 * A completer, a cancel with ABANDON and a 1-2 ms deadline racing for the
 * same pending children: one event each, and every child agrees with what
 * its fanout_complete returned.
 */
struct racing_completer {
	struct mbatch *mb;
	atomic_int stop; /* the event came: children not started never will */
	int rc[3];	 /* 1: not completed here */
};

static void *racing_completer_thread(void *arg)
{
	struct racing_completer *rc = arg;

	for (unsigned i = 0; i < 3; i++) {
		rc->rc[i] = 1;
		while (!atomic_load(&rc->mb->d[i].deferred) &&
		       !atomic_load(&rc->stop))
			sched_yield();
		if (atomic_load(&rc->mb->d[i].deferred))
			rc->rc[i] = dc_complete(&rc->mb->d[i]);
	}
	return NULL;
}

static void deadline_cancel_complete_race(void **state)
{
	struct fanout_engine *e = eng2();
	unsigned by[4] = {0}; /* completed, timed out, cancelled, other */

	for (int k = 0; k < 200; k++) {
		struct mbatch *mb = mb_new(3);
		struct racing_completer rc = {.mb = mb};

		for (unsigned i = 0; i < 3; i++)
			mb->d[i].o = (struct fanout_outcome){
				.code = 0, .summary = "c", .summary_len = 1};
		mb->b.deadline_ns = (1 + k % 2) * MS;
		pthread_t t = spawn(racing_completer_thread, &rc);
		fanout_id id = must_dispatch_b(e, &mb->b);
		if (k % 3)
			sleep_us((unsigned)(k % 5) * 300);
		int crc = fanout_cancel(
			e, id, FANOUT_CANCEL_INTERRUPT | FANOUT_CANCEL_ABANDON);
		assert_true(crc == 0 || crc == -EALREADY);
		struct fanout_event *ev = must_wait(fanout_default_sink(e));
		atomic_store(&rc.stop, 1);
		join(t);
		assert_true(ev->id == id);
		check_shape(ev, 3);
		for (unsigned i = 0; i < 3; i++) {
			const struct fanout_result *r = &ev->results[i];

			/* abandoned before its fn stored the flag, or never
			 * started: complete it here if it deferred */
			if (rc.rc[i] == 1 && atomic_load(&mb->d[i].runs))
				rc.rc[i] = dc_complete(&mb->d[i]);
			if (rc.rc[i] == 1) {
				assert_int_equal(r->duration_ns, 0);
				rc.rc[i] = -EALREADY;
			}
			assert_true(rc.rc[i] == 0 || rc.rc[i] == -EALREADY);
			if (r->status == FANOUT_COMPLETED) {
				assert_int_equal(rc.rc[i], 0);
				assert_string_equal(r->summary, "c");
				by[0]++;
				continue;
			}
			assert_int_equal(r->status, FANOUT_INTERRUPTED);
			if (r->code == -ETIMEDOUT) {
				assert_true(ev->timed_out);
				by[1]++;
			} else {
				assert_int_equal(r->code, -ECANCELED);
				assert_int_equal(rc.rc[i], -EALREADY);
				assert_int_equal(crc, 0);
				assert_true(ev->cancelled);
				by[2]++;
			}
		}
		fanout_event_free(ev);
		mb_free(mb);
	}
	assert_no_event(fanout_default_sink(e));
	fanout_destroy(e);
	print_message("complete/cancel/deadline: %u completed, %u timed out, "
		      "%u cancelled\n",
		      by[0], by[1], by[2]);
}

struct named {
	const char *name;
	pid_t tid;
};

static bool find_named(pid_t tid, const char *name, void *arg)
{
	struct named *n = arg;

	if (strcmp(name, n->name))
		return false;
	n->tid = tid;
	return true;
}

/* The thread id of this process's thread named @name, or 0. */
static pid_t thread_named(const char *name)
{
	struct named n = {name, 0};

	each_thread(find_named, &n);
	return n.tid;
}

/* Start an engine's timer with a deadline batch run from a child. */
static int start_timer_fn(struct fanout_child *c, void *arg)
{
	atomic_int n = 0;
	struct fanout_task t = {"dl", count_fn, &n};
	struct fanout_batch b = {
		.tasks = &t, .ntasks = 1, .deadline_ns = 1000000000ull};
	struct fanout_event *ev = NULL;
	int rc = fanout_run(arg, &b, &ev);

	(void)c;
	if (rc == 0)
		fanout_event_free(ev);
	return rc;
}

struct idle_start {
	struct fanout_engine *e;
	int rc;
};

static void *idle_starter_thread(void *arg)
{
	struct idle_start *is = arg;
	struct sched_param prio = {.sched_priority = 0};

	is->rc = pthread_setschedparam(pthread_self(), SCHED_IDLE, &prio);
	if (is->rc == 0)
		is->rc = start_timer_fn(NULL, is->e);
	return NULL;
}

/*
 * The timer thread takes the workers' CPUs and the normal policy, not
 * those of the thread that made the first deadline dispatch: here a child
 * on a worker pinned to one CPU, then a SCHED_IDLE thread.  (It kept the
 * pinned worker's one CPU, and ran as SCHED_IDLE: deadlines 3-255 ms late
 * under load.)
 */
static void timer_thread_not_inherited(void **state)
{
	cpu_set_t all, got;
	struct fanout_engine *e;
	struct idle_start is;

	assert_int_equal(sched_getaffinity(0, sizeof(all), &all), 0);
	if (CPU_COUNT(&all) < 2)
		skip();		      /* one CPU: nothing to tell apart */
	e = NEW_ENGINE(.workers = 2); /* pinned, one CPU each */
	struct fanout_task t = {"starter", start_timer_fn, e};
	struct fanout_batch b = {.tasks = &t, .ntasks = 1};
	must_dispatch_b(e, &b);
	fanout_event_free(must_wait(fanout_default_sink(e)));
	pid_t tid = thread_named("fanout-timer");
	assert_true(tid > 0);
	assert_int_equal(sched_getaffinity(tid, sizeof(got), &got), 0);
	assert_int_equal(CPU_COUNT(&got), 2); /* both workers' CPUs */
	fanout_destroy(e);

	is.e = NEW_ENGINE(.workers = 2, .flags = FANOUT_NO_PIN);
	pthread_t th = spawn(idle_starter_thread, &is);
	join(th);
	assert_int_equal(is.rc, 0);
	tid = thread_named("fanout-timer");
	assert_true(tid > 0);
	assert_int_equal(sched_getscheduler(tid), SCHED_OTHER);
	fanout_destroy(is.e);
}

/*
 * A child's own -ETIMEDOUT (a connect or read that timed out), with no
 * deadline on the batch, is an error like any other negative errno
 * (fanout.h, enum fanout_status): FANOUT_ERROR, its own error text kept,
 * and FANOUT_JOIN_FIRST_ERROR stops the rest.  It was reported
 * FANOUT_INTERRUPTED, its text replaced by "the delegation's deadline
 * passed", and the policy never fired.
 */
static int own_timeout_fn(struct fanout_child *c, void *arg)
{
	CHECK(fanout_set_error(c, "connect: timed out") == 0);
	return -ETIMEDOUT;
}

static int own_timeout_bare_fn(struct fanout_child *c, void *arg)
{
	return -ETIMEDOUT;
}

static void assert_own_timeout(const struct fanout_result *r, const char *error)
{
	assert_int_equal(r->status, FANOUT_ERROR);
	assert_int_equal(r->code, -ETIMEDOUT);
	assert_non_null(r->error);
	assert_string_equal(r->error, error);
}

static void child_own_etimedout_is_error(void **state)
{
	struct fanout_engine *e = eng2();
	struct fanout_event *ev;
	atomic_int started = 0;

	/* a synchronous child, with and without a text of its own */
	struct fanout_task t[2] = {{"own", own_timeout_fn, NULL},
				   {"bare", own_timeout_bare_fn, NULL}};
	struct fanout_batch b = {.tasks = t, .ntasks = 2};
	assert_int_equal(fanout_run(e, &b, &ev), 0);
	check_shape(ev, 2);
	assert_false(ev->timed_out);
	assert_int_equal(ev->status, FANOUT_ERROR);
	assert_own_timeout(&ev->results[0], "connect: timed out");
	assert_own_timeout(&ev->results[1], strerror(ETIMEDOUT));
	fanout_event_free(ev);

	/* a deferred child completed with -ETIMEDOUT and its text */
	struct mbatch *mb = mb_new(1);
	mb->d[0].o = (struct fanout_outcome){.code = -ETIMEDOUT,
					     .error = "read: timed out"};
	fanout_id id = must_dispatch_b(e, &mb->b);
	assert_int_equal(dc_complete(&mb->d[0]), 0);
	ev = must_wait(fanout_default_sink(e));
	assert_true(ev->id == id);
	check_shape(ev, 1);
	assert_false(ev->timed_out);
	assert_own_timeout(&ev->results[0], "read: timed out");
	fanout_event_free(ev);
	mb_free(mb);

	/* FIRST_ERROR: the child's -ETIMEDOUT is the first error */
	struct fanout_task t2[2] = {{"own", own_timeout_fn, NULL},
				    {"spin", spin_fn, &started}};
	struct fanout_batch b2 = {
		.tasks = t2, .ntasks = 2, .join = FANOUT_JOIN_FIRST_ERROR};
	assert_int_equal(fanout_run(e, &b2, &ev), 0);
	check_shape(ev, 2);
	assert_false(ev->timed_out);
	assert_true(ev->interrupted_by_policy);
	assert_own_timeout(&ev->results[0], "connect: timed out");
	assert_int_equal(ev->results[1].status, FANOUT_INTERRUPTED);
	fanout_event_free(ev);
	fanout_destroy(e);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		TC(deadline_sync_children_blocked),
		TC(deadline_pending_never_completed),
		TC(deadline_mixed_outcomes),
		TC(deadline_late_return_reported_timed_out),
		TC(deadline_after_finish_is_harmless),
		TC(deadline_after_cancel_is_harmless),
		TC(deadline_races_completion),
		TC(many_live_deadlines),
		TC(deadline_on_run),
		TC(deadline_bad_value),
		TC(far_deadline_destroy),
		TC(deadline_cancel_complete_race),
		TC(timer_thread_not_inherited),
		TC(child_own_etimedout_is_error),
	};
	tc_filters();
	return cmocka_run_group_tests(tests, NULL, NULL);
}
