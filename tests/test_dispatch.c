/* SPDX-License-Identifier: MIT */
/* test_dispatch.c - fanout_dispatch: refusals, the event, exactly once. */
#include "common.h"

static struct fanout_engine *eng2(void)
{
	return NEW_ENGINE(.workers = 2, .flags = FANOUT_NO_PIN);
}

/* Refusals (NULL engine, batch or tasks, no tasks, a task without fn,
 * too many tasks) are the bad-input table's rows D01-D06, checked once, by
 * test_misuse.c, for dispatch, run and delegate alike. */

static void dispatch_one_event_per_dispatch(void **state)
{
	struct fanout_engine *e = eng2();
	struct tbatch *tb = tb_new(5);
	fanout_id id = must_dispatch(e, tb);
	struct fanout_event *ev = must_wait(fanout_default_sink(e));

	assert_true(ev->id == id);
	check_all_completed(ev, tb);
	fanout_event_free(ev);
	assert_no_event(fanout_default_sink(e));
	tb_free(tb);
	fanout_destroy(e);
}

static void dispatch_null_id_ok(void **state)
{
	struct fanout_engine *e = eng2();
	struct tbatch *tb = tb_new(2);

	assert_int_equal(fanout_dispatch(e, &tb->b, NULL), 0);
	struct fanout_event *ev = must_wait(fanout_default_sink(e));
	assert_true(ev->id != 0);
	check_all_completed(ev, tb);
	fanout_event_free(ev);
	tb_free(tb);
	fanout_destroy(e);
}

/* Goals, context and session_key are copied: the caller reuses its memory. */
static void dispatch_strings_copied(void **state)
{
	struct fanout_engine *e = eng2();
	atomic_int gate = 0;
	char goals[3][16] = {"alpha", "beta", "gamma"};
	char ctx[16] = "the-context", key[16] = "session-42";
	struct probe pr[3];
	struct fanout_task t[3];
	int user_obj;

	memset(pr, 0, sizeof(pr));
	for (int i = 0; i < 3; i++) {
		pr[i].gate = &gate;
		t[i] = (struct fanout_task){goals[i], probe_fn, &pr[i]};
	}
	struct fanout_batch b = {.tasks = t,
				 .ntasks = 3,
				 .context = ctx,
				 .session_key = key,
				 .user = &user_obj};
	fanout_id id = 0;

	assert_int_equal(fanout_dispatch(e, &b, &id), 0);
	/* scribble over everything the batch pointed at */
	for (int i = 0; i < 3; i++)
		memset(goals[i], 'X', sizeof(goals[i]) - 1);
	memset(ctx, 'Y', sizeof(ctx) - 1);
	memset(key, 'Z', sizeof(key) - 1);
	memset(t, 0, sizeof(t));
	atomic_store(&gate, 1);

	struct fanout_event *ev = must_wait(fanout_default_sink(e));
	assert_true(ev->id == id);
	assert_int_equal(ev->nresults, 3);
	assert_string_equal(ev->results[0].goal, "alpha");
	assert_string_equal(ev->results[1].goal, "beta");
	assert_string_equal(ev->results[2].goal, "gamma");
	assert_string_equal(ev->context, "the-context");
	assert_string_equal(ev->session_key, "session-42");
	assert_ptr_equal(ev->user, &user_obj);
	for (int i = 0; i < 3; i++) {
		assert_int_equal(atomic_load(&pr[i].runs), 1);
		assert_int_equal(ev->results[i].status, FANOUT_COMPLETED);
	}
	fanout_event_free(ev);
	fanout_destroy(e);
}

/* The same for a batch of one (rec_alloc copies its goal without a
 * rescan), with a session key and context beside it so that a goal copy
 * of the wrong length shows in theirs; and a batch of one without a goal. */
static void dispatch_one_task_strings_copied(void **state)
{
	struct fanout_engine *e = eng2();
	atomic_int gate = 0;
	char goal[24] = "the-only-goal", ctx[16] = "ctx-1", key[16] = "key-1";
	struct probe pr;
	struct fanout_task t;
	struct fanout_batch b = {
		.tasks = &t, .ntasks = 1, .context = ctx, .session_key = key};
	struct fanout_event *ev;

	memset(&pr, 0, sizeof(pr));
	pr.gate = &gate;
	t = (struct fanout_task){goal, probe_fn, &pr};
	assert_int_equal(fanout_dispatch(e, &b, NULL), 0);
	memset(goal, 'X', sizeof(goal) - 1);
	memset(ctx, 'Y', sizeof(ctx) - 1);
	memset(key, 'Z', sizeof(key) - 1);
	memset(&t, 0, sizeof(t));
	atomic_store(&gate, 1);
	ev = must_wait(fanout_default_sink(e));
	assert_string_equal(ev->results[0].goal, "the-only-goal");
	assert_string_equal(ev->context, "ctx-1");
	assert_string_equal(ev->session_key, "key-1");
	assert_int_equal(ev->results[0].status, FANOUT_COMPLETED);
	fanout_event_free(ev);

	t = (struct fanout_task){NULL, probe_fn, &pr};
	b.context = b.session_key = NULL;
	assert_int_equal(fanout_run(e, &b, &ev), 0);
	assert_non_null(ev->results[0].goal);
	assert_string_equal(ev->results[0].goal, "");
	assert_int_equal(atomic_load(&pr.runs), 2);
	fanout_event_free(ev);
	fanout_destroy(e);
}

static void dispatch_null_strings(void **state)
{
	struct fanout_engine *e = eng2();
	struct tbatch *tb = tb_new(2);

	tb->tasks[1].goal = NULL; /* taken as "" */
	fanout_id id = must_dispatch(e, tb);
	struct fanout_event *ev = must_wait(fanout_default_sink(e));

	assert_true(ev->id == id);
	assert_null(ev->context);
	assert_null(ev->session_key);
	assert_null(ev->user);
	assert_string_equal(ev->results[0].goal, "task-0");
	assert_non_null(ev->results[1].goal);
	assert_string_equal(ev->results[1].goal, "");
	fanout_event_free(ev);
	tb_free(tb);
	fanout_destroy(e);
}

/* Summaries, errors and costs arrive per child and costs are summed. */
static void dispatch_summaries_errors_cost(void **state)
{
	struct fanout_engine *e = eng2();
	struct tbatch *tb = tb_new(4);
	char sums[4][16], errs[4][16];
	double total = 0;

	for (unsigned i = 0; i < 4; i++) {
		snprintf(sums[i], sizeof(sums[i]), "summary-%u", i);
		snprintf(errs[i], sizeof(errs[i]), "error-%u", i);
		tb->probes[i].summary = sums[i];
		tb->probes[i].cost = 0.25 + i;
		tb->probes[i].sleep_us = 100; /* ran: duration_ns > 0 */
		total += 0.25 + i;
	}
	tb->probes[1].error = errs[1];
	tb->probes[1].ret = -EIO;
	tb->probes[2].ret = -ENOMEM;   /* no message set: a description */
	tb->probes[3].error = errs[3]; /* set, but completed: error NULL */

	fanout_id id = must_dispatch(e, tb);
	struct fanout_event *ev = must_wait(fanout_default_sink(e));
	assert_true(ev->id == id);
	assert_int_equal(ev->nresults, 4);
	for (unsigned i = 0; i < 4; i++) {
		const struct fanout_result *r = &ev->results[i];

		assert_int_equal(r->index, i);
		assert_string_equal(r->summary, sums[i]);
		assert_float_equal(r->cost, 0.25 + i, 1e-9);
		assert_true(r->duration_ns > 0);
		assert_int_equal(tb->probes[i].plain, 1234);
	}
	assert_int_equal(ev->results[0].status, FANOUT_COMPLETED);
	assert_null(ev->results[0].error);
	assert_int_equal(ev->results[1].status, FANOUT_ERROR);
	assert_int_equal(ev->results[1].code, -EIO);
	assert_string_equal(ev->results[1].error, "error-1");
	assert_int_equal(ev->results[2].status, FANOUT_ERROR);
	assert_int_equal(ev->results[2].code, -ENOMEM);
	assert_non_null(ev->results[2].error);
	assert_true(strlen(ev->results[2].error) > 0);
	assert_int_equal(ev->results[3].status, FANOUT_COMPLETED);
	assert_int_equal(ev->results[3].code, 0);
	assert_null(ev->results[3].error);
	assert_float_equal(ev->cost, total, 1e-9);
	assert_int_equal(ev->status, FANOUT_COMPLETED);
	assert_int_equal(ev->ncompleted, 2);
	assert_int_equal(ev->nerror, 2);
	assert_int_equal(ev->ninterrupted, 0);
	assert_null(ev->error);
	fanout_event_free(ev);
	tb_free(tb);
	fanout_destroy(e);
}

/* Event status from the children's return values. */
struct status_case {
	unsigned n;
	int ret[4];
	enum fanout_status want;
};

static enum fanout_status child_status(int ret)
{
	if (ret == 0)
		return FANOUT_COMPLETED;
	if (ret == -ECANCELED)
		return FANOUT_INTERRUPTED;
	return FANOUT_ERROR;
}

static void dispatch_status_rules(void **state)
{
	static const struct status_case cases[] = {
		{3, {0, 0, 0}, FANOUT_COMPLETED},
		{3, {0, -EIO, 0}, FANOUT_COMPLETED},
		{2, {-EIO, 0}, FANOUT_COMPLETED},
		{2, {-EIO, -ENOMEM}, FANOUT_ERROR},
		{1, {-EPERM}, FANOUT_ERROR},
		{2, {-ECANCELED, -ECANCELED}, FANOUT_INTERRUPTED},
		{1, {-ECANCELED}, FANOUT_INTERRUPTED},
		{2, {-EIO, -ECANCELED}, FANOUT_ERROR},
		{3, {-ECANCELED, -EIO, -ECANCELED}, FANOUT_ERROR},
		{2, {0, -ECANCELED}, FANOUT_COMPLETED},
		{1, {7}, FANOUT_ERROR},
		{2, {1, -ECANCELED}, FANOUT_ERROR},
		{4, {0, 3, -ECANCELED, -EIO}, FANOUT_COMPLETED},
	};
	struct fanout_engine *e = eng2();

	for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
		const struct status_case *sc = &cases[k];
		struct tbatch *tb = tb_new(sc->n);
		unsigned nc = 0, ne = 0, ni = 0;

		for (unsigned i = 0; i < sc->n; i++)
			tb->probes[i].ret = sc->ret[i];
		fanout_id id = must_dispatch(e, tb);
		struct fanout_event *ev = must_wait(fanout_default_sink(e));

		assert_true(ev->id == id);
		assert_int_equal(ev->nresults, sc->n);
		for (unsigned i = 0; i < sc->n; i++) {
			const struct fanout_result *r = &ev->results[i];
			enum fanout_status want = child_status(sc->ret[i]);

			assert_int_equal(r->index, i);
			assert_int_equal(r->status, want);
			assert_int_equal(atomic_load(&tb->probes[i].runs), 1);
			if (sc->ret[i] <= 0)
				assert_int_equal(r->code, sc->ret[i]);
			else
				assert_int_not_equal(r->code, 0);
			if (want == FANOUT_COMPLETED) {
				assert_null(r->error);
				nc++;
			} else {
				assert_non_null(r->error);
				if (want == FANOUT_ERROR)
					ne++;
				else
					ni++;
			}
		}
		if (ev->status != sc->want)
			print_error("case %zu: status %d, want %d\n", k,
				    ev->status, sc->want);
		assert_int_equal(ev->status, sc->want);
		assert_int_equal(ev->ncompleted, nc);
		assert_int_equal(ev->nerror, ne);
		assert_int_equal(ev->ninterrupted, ni);
		assert_false(ev->cancelled);
		if (sc->want == FANOUT_COMPLETED) {
			assert_null(ev->error);
		} else {
			assert_non_null(ev->error);
			assert_true(strlen(ev->error) > 0);
			assert_null(strchr(ev->error, '\n'));
		}
		fanout_event_free(ev);
		tb_free(tb);
	}
	assert_no_event(fanout_default_sink(e));
	fanout_destroy(e);
}

static void dispatch_times(void **state)
{
	struct fanout_engine *e = eng2();
	struct tbatch *tb = tb_new(2);
	uint64_t t0 = fanout_now_ns();
	fanout_id id = must_dispatch(e, tb);
	struct fanout_event *ev = must_wait(fanout_default_sink(e));
	uint64_t t1 = fanout_now_ns();

	assert_true(ev->id == id);
	assert_true(ev->dispatched_ns >= t0);
	assert_true(ev->completed_ns >= ev->dispatched_ns);
	assert_true(ev->completed_ns <= t1);
	fanout_event_free(ev);
	tb_free(tb);
	fanout_destroy(e);
}

/* The events' times are stamped from a per-thread anchor, not read from
 * the clock each time (queue/clock.h).  Back to back, most stamps come
 * from an anchor; each must still fall between the caller's own clock
 * readings around the call, and one thread's dispatches keep their order.
 * A stamp that led the clock, or trailed it by more than a call takes,
 * fails here. */
static void times_between_clock_readings(void **state)
{
	struct fanout_engine *e = eng2();
	struct tbatch *tb = tb_new(1);
	struct fanout_event *ev;
	uint64_t t0, t1, prev = 0;

	for (int i = 0; i < 4000; i++) {
		bool run = i % 2 == 0;

		ev = NULL;
		t0 = fanout_now_ns();
		if (run)
			assert_int_equal(fanout_run(e, &tb->b, &ev), 0);
		else
			must_dispatch(e, tb);
		if (!run)
			ev = must_wait(fanout_default_sink(e));
		t1 = fanout_now_ns();
		assert_true(ev->dispatched_ns >= t0);
		assert_true(ev->dispatched_ns > prev);
		assert_true(ev->completed_ns >= ev->dispatched_ns);
		assert_true(ev->completed_ns <= t1);
		/* The child ran inside the delegation's window (a fanout_run
		 * caller's child is timed from the dispatch's own tick, its
		 * end gives completed_ns): 1 us for two stamps' anchors, and
		 * 0.2% for the tick factor's error against the clock
		 * (clock.c: under 0.1%). */
		uint64_t window = ev->completed_ns - ev->dispatched_ns;

		assert_true(ev->results[0].duration_ns > 0);
		assert_true(ev->results[0].duration_ns <=
			    window + 1000 + window / 500);
		prev = ev->dispatched_ns;
		fanout_event_free(ev);
	}
	tb_free(tb);
	fanout_destroy(e);
}

/*
 * Invariant 5: no worker sleeps while runnable work waits.  Two fresh
 * workers reaching the end of their spin (default spin_ns 50 us): one takes
 * a long child, the other must run the next delegation - not sleep until
 * the long child is over.  Repeated because the window is narrow; the
 * delays only aim at the spin-to-park transition, nothing is timed.
 */
static void dispatch_idle_worker_not_left_asleep(void **state)
{
	int lost = -1;

	for (int k = 0; k < 40 && lost < 0; k++) {
		struct fanout_engine *e = eng2();
		atomic_int gate = 0;
		struct tbatch *g = tb_new(1), *f = tb_new(1);
		struct fanout_event *ev = NULL;

		sleep_us(20 + (unsigned)(k % 7) * 10);
		g->probes[0].gate = &gate;
		must_dispatch(e, g);
		fanout_id fid = must_dispatch(e, f);
		/* the long child blocks until the other event arrived */
		int rc = fanout_wait(fanout_default_sink(e), &ev, WAIT_MS);
		if (rc != 0)
			lost = k;
		else
			assert_true(ev->id == fid);
		fanout_event_free(ev);
		atomic_store(&gate, 1);
		for (int i = rc == 0 ? 1 : 0; i < 2; i++)
			fanout_event_free(must_wait(fanout_default_sink(e)));
		tb_free(g);
		tb_free(f);
		fanout_destroy(e);
	}
	if (lost >= 0)
		print_error("engine %d: a worker slept for %d ms while a "
			    "dispatched child waited in the ring\n",
			    lost, WAIT_MS);
	assert_int_equal(lost, -1);
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

static void dispatch_ids_unique(void **state)
{
	enum { ROUNDS = 3, PER = 100 };
	struct fanout_engine *e = eng2();
	fanout_id ids[ROUNDS * PER], evids[ROUNDS * PER];
	atomic_int count = 0;
	struct fanout_task t = {"count", count_fn, &count};
	struct fanout_batch b = {.tasks = &t, .ntasks = 1};

	for (int r = 0; r < ROUNDS; r++) {
		for (int i = 0; i < PER; i++) {
			fanout_id *id = &ids[r * PER + i];

			assert_int_equal(fanout_dispatch(e, &b, id), 0);
			assert_true(*id != 0);
		}
		for (int i = 0; i < PER; i++) {
			struct fanout_event *ev =
				must_wait(fanout_default_sink(e));
			evids[r * PER + i] = ev->id;
			fanout_event_free(ev);
		}
	}
	assert_no_event(fanout_default_sink(e));
	assert_int_equal(atomic_load(&count), ROUNDS * PER);
	qsort(ids, ROUNDS * PER, sizeof(ids[0]), cmp_u64);
	qsort(evids, ROUNDS * PER, sizeof(evids[0]), cmp_u64);
	for (int i = 0; i < ROUNDS * PER; i++) {
		if (i)
			assert_true(ids[i] != ids[i - 1]);
		assert_true(ids[i] == evids[i]);
	}
	fanout_destroy(e);
}

/* Regression: *id was stored after the batch was submitted, so a child
 * that read the caller's id variable could see a stale value (and TSan
 * reported the race).  The child reads the variable plainly, as the
 * contract lets it: a successful dispatch happens-before the child. */
struct id_probe {
	fanout_id id; /* written by fanout_dispatch / fanout_delegate */
	atomic_int *mismatches;
};

static int id_probe_fn(struct fanout_child *c, void *arg)
{
	struct id_probe *p = arg;

	if (p->id != fanout_child_id(c))
		atomic_fetch_add(p->mismatches, 1);
	return 0;
}

static void dispatch_id_written_before_children_run(void **state)
{
	enum { ROUNDS = 40, PER = 128 };
	struct fanout_engine *e = eng2();
	static struct id_probe probes[PER];
	atomic_int mismatches = 0;

	for (int r = 0; r < ROUNDS; r++) {
		for (int i = 0; i < PER; i++) {
			struct fanout_task t = {"id", id_probe_fn, &probes[i]};
			struct fanout_batch b = {.tasks = &t, .ntasks = 1};
			struct fanout_event *ev = NULL;

			probes[i].id = 0;
			probes[i].mismatches = &mismatches;
			if (r & 1) /* fanout_delegate's background path */
				assert_int_equal(fanout_delegate(e, &b,
								 &probes[i].id,
								 &ev),
						 FANOUT_BACKGROUND);
			else
				assert_int_equal(
					fanout_dispatch(e, &b, &probes[i].id),
					0);
		}
		for (int i = 0; i < PER; i++)
			fanout_event_free(must_wait(fanout_default_sink(e)));
	}
	assert_int_equal(atomic_load(&mismatches), 0);
	fanout_destroy(e);
}

static void dispatch_batch_sizes(void **state)
{
	static const unsigned sizes[] = {1, 2, 3, 63, 64, 65, 1000, 4096};
	struct fanout_engine *e = eng2();

	for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
		struct tbatch *tb = tb_new(sizes[k]);
		fanout_id id = must_dispatch(e, tb);
		struct fanout_event *ev = must_wait(fanout_default_sink(e));

		assert_true(ev->id == id);
		check_all_completed(ev, tb);
		fanout_event_free(ev);
		tb_free(tb);
	}
	assert_no_event(fanout_default_sink(e));
	struct fanout_stats st = stats_of(e);
	assert_int_equal(st.dispatched, 8);
	assert_int_equal(st.children_run,
			 1 + 2 + 3 + 63 + 64 + 65 + 1000 + 4096);
	fanout_destroy(e);
}

/* Several threads dispatch at once, each to its own sink. */
enum { NTHREADS = 4, PER_THREAD = 30 };

struct dthread {
	struct fanout_engine *e;
	struct fanout_sink *sink;
	struct tbatch *tb[PER_THREAD];
	fanout_id ids[PER_THREAD];
	int seen[PER_THREAD];
	int children;
};

static void *dispatcher(void *arg)
{
	struct dthread *d = arg;

	for (int k = 0; k < PER_THREAD; k++) {
		d->tb[k]->b.sink = d->sink;
		d->tb[k]->b.user = d->tb[k];
		CHECK(fanout_dispatch(d->e, &d->tb[k]->b, &d->ids[k]) == 0);
	}
	for (int k = 0; k < PER_THREAD; k++) {
		struct fanout_event *ev = NULL;

		CHECK(fanout_wait(d->sink, &ev, WAIT_MS) == 0);
		if (!ev)
			break;
		int which = -1;
		for (int j = 0; j < PER_THREAD; j++)
			if (ev->user == d->tb[j])
				which = j;
		CHECK(which >= 0);
		if (which >= 0) {
			struct tbatch *tb = d->tb[which];

			d->seen[which]++;
			CHECK(ev->id == d->ids[which]);
			CHECK(ev->nresults == tb->n);
			CHECK(ev->status == FANOUT_COMPLETED);
			for (unsigned i = 0; i < tb->n && i < ev->nresults;
			     i++) {
				CHECK(ev->results[i].index == i);
				CHECK(atomic_load(&tb->probes[i].runs) == 1);
				CHECK(strcmp(ev->results[i].goal,
					     tb->goals[i]) == 0);
			}
		}
		fanout_event_free(ev);
	}
	struct fanout_event *extra = NULL;
	sleep_ms(20);
	CHECK(fanout_poll(d->sink, &extra) == -EAGAIN);
	for (int k = 0; k < PER_THREAD; k++)
		CHECK(d->seen[k] == 1);
	return NULL;
}

static void dispatch_concurrent_threads(void **state)
{
	struct fanout_engine *e = eng2();
	struct dthread d[NTHREADS];
	pthread_t th[NTHREADS];
	uint64_t children = 0;

	memset(d, 0, sizeof(d));
	for (int t = 0; t < NTHREADS; t++) {
		d[t].e = e;
		assert_int_equal(fanout_sink_create(e, &d[t].sink), 0);
		for (int k = 0; k < PER_THREAD; k++) {
			d[t].tb[k] = tb_new(1 + (k + t) % 8);
			children += d[t].tb[k]->n;
		}
	}
	for (int t = 0; t < NTHREADS; t++)
		th[t] = spawn(dispatcher, &d[t]);
	for (int t = 0; t < NTHREADS; t++)
		join(th[t]);

	struct fanout_stats st = stats_of(e);
	assert_int_equal(st.dispatched, NTHREADS * PER_THREAD);
	assert_int_equal(st.completed, NTHREADS * PER_THREAD);
	assert_int_equal(st.children_run, children);
	assert_int_equal(st.running, 0);
	assert_no_event(fanout_default_sink(e));
	for (int t = 0; t < NTHREADS; t++) {
		for (int k = 0; k < PER_THREAD; k++) {
			assert_int_equal(d[t].seen[k], 1);
			tb_free(d[t].tb[k]);
		}
		assert_int_equal(fanout_sink_destroy(d[t].sink), 0);
	}
	fanout_destroy(e);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		TC(dispatch_one_event_per_dispatch),
		TC(dispatch_null_id_ok),
		TC(dispatch_strings_copied),
		TC(dispatch_one_task_strings_copied),
		TC(dispatch_null_strings),
		TC(dispatch_summaries_errors_cost),
		TC(dispatch_status_rules),
		TC(dispatch_times),
		TC(times_between_clock_readings),
		TC(dispatch_idle_worker_not_left_asleep),
		TC(dispatch_ids_unique),
		TC(dispatch_id_written_before_children_run),
		TC(dispatch_batch_sizes),
		TC(dispatch_concurrent_threads),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
