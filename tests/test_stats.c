/* SPDX-License-Identifier: MIT */
/* test_stats.c - fanout_stats counters move as documented. */
#include "common.h"

#include <dirent.h>

static uint64_t worker_children_sum(const struct fanout_stats *st)
{
	uint64_t s = 0;
	unsigned n = st->nworkers < FANOUT_STATS_MAX_WORKERS ?
			     st->nworkers :
			     FANOUT_STATS_MAX_WORKERS;

	for (unsigned i = 0; i < n; i++)
		s += st->worker[i].children_run;
	return s;
}

static void stats_fresh_engine(void **state)
{
	struct fanout_engine *e =
		NEW_ENGINE(.workers = 2, .flags = FANOUT_NO_PIN);
	struct fanout_stats st = stats_of(e);

	assert_int_equal(st.nworkers, 2);
	assert_int_equal(st.dispatched, 0);
	assert_int_equal(st.runs, 0);
	assert_int_equal(st.completed, 0);
	assert_int_equal(st.rejected, 0);
	assert_int_equal(st.cancelled, 0);
	assert_int_equal(st.children_run, 0);
	assert_int_equal(st.children_skipped, 0);
	assert_int_equal(st.running, 0);
	assert_int_equal(st.async_running, 0);
	assert_int_equal(worker_children_sum(&st), 0);
	fanout_destroy(e);
}

static void stats_dispatch_and_run_counts(void **state)
{
	struct fanout_engine *e =
		NEW_ENGINE(.workers = 2, .flags = FANOUT_NO_PIN);
	struct fanout_event *ev = NULL;

	for (unsigned n = 2; n <= 4; n++) {
		struct tbatch *tb = tb_new(n);

		must_dispatch(e, tb);
		ev = must_wait(fanout_default_sink(e));
		fanout_event_free(ev);
		tb_free(tb);
	}
	struct fanout_stats st = stats_of(e);
	assert_int_equal(st.dispatched, 3);
	assert_int_equal(st.completed, 3);
	assert_int_equal(st.children_run, 9);
	assert_int_equal(st.runs, 0);
	assert_int_equal(st.running, 0);
	assert_int_equal(st.async_running, 0);
	assert_int_equal(st.rejected, 0);
	/* background children run on workers only */
	assert_int_equal(worker_children_sum(&st), 9);

	for (unsigned n = 1; n <= 5; n += 4) {
		struct tbatch *tb = tb_new(n);

		assert_int_equal(fanout_run(e, &tb->b, &ev), 0);
		fanout_event_free(ev);
		tb_free(tb);
	}
	st = stats_of(e);
	assert_int_equal(st.dispatched, 3);
	assert_int_equal(st.runs, 2);
	assert_int_equal(st.completed, 5);
	assert_int_equal(st.children_run, 15);
	assert_true(worker_children_sum(&st) <= st.children_run);
	assert_true(worker_children_sum(&st) >= 9);
	assert_int_equal(st.running, 0);
	fanout_destroy(e);
}

static void stats_worker_sum_many(void **state)
{
	struct fanout_engine *e =
		NEW_ENGINE(.workers = 2, .flags = FANOUT_NO_PIN);
	struct tbatch *tb[20];

	for (int i = 0; i < 20; i++) {
		tb[i] = tb_new(10);
		must_dispatch(e, tb[i]);
	}
	for (int i = 0; i < 20; i++)
		fanout_event_free(must_wait(fanout_default_sink(e)));
	struct fanout_stats st = stats_of(e);
	assert_int_equal(st.children_run, 200);
	assert_int_equal(worker_children_sum(&st), 200);
	assert_int_equal(st.completed, 20);
	for (int i = 0; i < 20; i++) {
		assert_int_equal(tb_runs(tb[i]), 10);
		tb_free(tb[i]);
	}
	fanout_destroy(e);
}

/* Each calling thread counts in a block of its own (engine.c, "Per-thread
 * counters"); the sums must still be exact, across threads, across two
 * engines one thread alternates between (its one-entry cache misses every
 * call and finds its block in the engine's list), and for an engine
 * created after another was destroyed (the cache is keyed by serial). */
struct counts_arg {
	struct fanout_engine *e[2];
	unsigned rounds;
};

static void *counting_thread(void *p)
{
	struct counts_arg *a = p;
	struct tbatch *tb = tb_new(3);
	struct fanout_sink *s[2];
	struct fanout_event *ev;

	/* A sink has one consumer at a time: one per thread and engine. */
	for (int k = 0; k < 2; k++)
		CHECK(fanout_sink_create(a->e[k], &s[k]) == 0);
	for (unsigned i = 0; i < a->rounds; i++)
		for (int k = 0; k < 2; k++) {
			ev = NULL;
			CHECK(fanout_run(a->e[k], &tb->b, &ev) == 0);
			fanout_event_free(ev);
			tb->b.sink = s[k];
			CHECK(fanout_dispatch(a->e[k], &tb->b, NULL) == 0);
			CHECK(fanout_wait(s[k], &ev, -1) == 0);
			fanout_event_free(ev);
		}
	for (int k = 0; k < 2; k++)
		CHECK(fanout_sink_destroy(s[k]) == 0);
	tb_free(tb);
	return NULL;
}

static void stats_counted_per_thread(void **state)
{
	enum { THREADS = 4, ROUNDS = 300 };
	struct counts_arg a = {.rounds = ROUNDS};
	pthread_t th[THREADS];

	for (int round = 0; round < 2; round++) {
		for (int k = 0; k < 2; k++)
			a.e[k] = NEW_ENGINE(.workers = 2,
					    .flags = FANOUT_NO_PIN);
		for (int i = 0; i < THREADS; i++)
			assert_int_equal(pthread_create(&th[i], NULL,
							counting_thread, &a),
					 0);
		counting_thread(&a); /* and this thread too */
		for (int i = 0; i < THREADS; i++)
			pthread_join(th[i], NULL);
		for (int k = 0; k < 2; k++) {
			struct fanout_stats st = stats_of(a.e[k]);

			assert_int_equal(st.runs, (THREADS + 1) * ROUNDS);
			assert_int_equal(st.dispatched, (THREADS + 1) * ROUNDS);
			assert_int_equal(st.completed,
					 2 * (THREADS + 1) * ROUNDS);
			assert_int_equal(st.children_run,
					 6 * (THREADS + 1) * ROUNDS);
			assert_int_equal(st.running, 0);
			fanout_destroy(a.e[k]);
		}
	}
}

/* A child at depth 2 that tries to go one deeper (max_depth 2). */
static int too_deep_fn(struct fanout_child *c, void *arg)
{
	struct fanout_engine *e = arg;
	atomic_int n = 0;
	struct fanout_task t = {"deeper", count_fn, &n};
	struct fanout_batch b = {.tasks = &t, .ntasks = 1};
	struct fanout_event *ev = NULL;

	(void)c;
	CHECK(fanout_run(e, &b, &ev) == -ELOOP);
	return 0;
}

static int depth1_fn(struct fanout_child *c, void *arg)
{
	struct fanout_engine *e = arg;
	struct fanout_task t = {"depth2", too_deep_fn, e};
	struct fanout_batch b = {.tasks = &t, .ntasks = 1};
	struct fanout_event *ev = NULL;

	(void)c;
	CHECK(fanout_run(e, &b, &ev) == 0);
	fanout_event_free(ev);
	return 0;
}

static void stats_rejected(void **state)
{
	struct fanout_engine *e =
		NEW_ENGINE(.workers = 2, .max_async = 1, .max_tasks = 4,
			   .flags = FANOUT_NO_PIN);
	atomic_int gate = 0;
	struct tbatch *blocker = tb_new(1);
	struct tbatch *tb = tb_new(5);
	struct fanout_event *ev = NULL;

	assert_int_equal(fanout_dispatch(e, NULL, NULL), -EINVAL);
	assert_int_equal(stats_of(e).rejected, 1);
	assert_int_equal(fanout_dispatch(e, &tb->b, NULL), -E2BIG);
	assert_int_equal(stats_of(e).rejected, 2);
	blocker->probes[0].gate = &gate;
	must_dispatch(e, blocker);
	tb->b.ntasks = 1;
	assert_int_equal(fanout_dispatch(e, &tb->b, NULL), -EBUSY);
	assert_int_equal(stats_of(e).rejected, 3);
	atomic_store(&gate, 1);
	fanout_event_free(must_wait(fanout_default_sink(e)));

	struct fanout_task t = {"depth1", depth1_fn, e};
	struct fanout_batch b = {.tasks = &t, .ntasks = 1};
	assert_int_equal(fanout_run(e, &b, &ev), 0);
	fanout_event_free(ev);
	struct fanout_stats st = stats_of(e);
	assert_int_equal(st.rejected, 4);
	assert_int_equal(st.dispatched, 1);
	assert_int_equal(st.runs, 2);
	assert_int_equal(st.completed, 3);
	tb_free(tb);
	tb_free(blocker);
	fanout_destroy(e);
}

static void stats_cancel_counts(void **state)
{
	struct fanout_engine *e = NEW_ENGINE(.workers = 1, .max_children = 1,
					     .flags = FANOUT_NO_PIN);
	atomic_int gate = 0;
	struct tbatch *tb = tb_new(4);

	tb_gate(tb, &gate);
	fanout_id id = must_dispatch(e, tb);
	uint64_t end = mono_ms() + WAIT_MS;
	while (tb_runs(tb) < 1) {
		assert_true(mono_ms() < end);
		sleep_us(100);
	}
	assert_int_equal(fanout_cancel(e, id, FANOUT_CANCEL_PENDING), 0);
	assert_int_equal(stats_of(e).cancelled, 1);
	atomic_store(&gate, 1);
	fanout_event_free(must_wait(fanout_default_sink(e)));
	struct fanout_stats st = stats_of(e);
	assert_int_equal(st.cancelled, 1);
	assert_int_equal(st.children_run, 1);
	assert_int_equal(st.children_skipped, 3);
	assert_int_equal(st.completed, 1);
	assert_int_equal(st.running, 0);
	/* cancelling a finished one is not counted */
	assert_int_equal(fanout_cancel(e, id, FANOUT_CANCEL_INTERRUPT),
			 -EALREADY);
	assert_int_equal(stats_of(e).cancelled, 1);
	tb_free(tb);
	fanout_destroy(e);
}

struct runner {
	struct fanout_engine *e;
	struct tbatch *tb;
	int rc;
};

static void *runner_thread(void *arg)
{
	struct runner *r = arg;
	struct fanout_event *ev = NULL;

	r->rc = fanout_run(r->e, &r->tb->b, &ev);
	fanout_event_free(ev);
	return NULL;
}

static void stats_running_gauges(void **state)
{
	struct fanout_engine *e =
		NEW_ENGINE(.workers = 2, .flags = FANOUT_NO_PIN);
	atomic_int gate = 0;
	struct tbatch *bg = tb_new(1);
	struct runner r = {e, tb_new(1), -1};

	bg->probes[0].gate = &gate;
	r.tb->probes[0].gate = &gate;
	must_dispatch(e, bg);
	pthread_t t = spawn(runner_thread, &r);
	assert_true(wait_ge(&bg->probes[0].runs, 1, WAIT_MS));
	assert_true(wait_ge(&r.tb->probes[0].runs, 1, WAIT_MS));
	struct fanout_stats st = stats_of(e);
	assert_int_equal(st.running, 2);
	assert_int_equal(st.async_running, 1);
	atomic_store(&gate, 1);
	join(t);
	assert_int_equal(r.rc, 0);
	fanout_event_free(must_wait(fanout_default_sink(e)));
	st = stats_of(e);
	assert_int_equal(st.running, 0);
	assert_int_equal(st.async_running, 0);
	assert_int_equal(st.dispatched, 1);
	assert_int_equal(st.runs, 1);
	tb_free(bg);
	tb_free(r.tb);
	fanout_destroy(e);
}

/* Idle workers park after spin_ns, and work wakes them. */
static void stats_parks_and_wakeups(void **state)
{
	struct fanout_engine *e = NEW_ENGINE(.workers = 2, .spin_ns = 1000,
					     .flags = FANOUT_NO_PIN);
	struct fanout_stats st;
	uint64_t end = mono_ms() + WAIT_MS;

	/* give the idle workers a chance to park (bounded, not timed) */
	sleep_ms(50);
	for (;;) {
		st = stats_of(e);
		if (st.worker[0].parks > 0 && st.worker[1].parks > 0)
			break;
		assert_true(mono_ms() < end);
		sleep_ms(5);
	}
	assert_true(st.parks >= st.worker[0].parks);
	assert_true(st.parks > 0);

	struct tbatch *tb = tb_new(4);
	must_dispatch(e, tb);
	fanout_event_free(must_wait(fanout_default_sink(e)));
	st = stats_of(e);
	assert_true(st.wakeups > 0);
	assert_true(st.worker[0].wakeups + st.worker[1].wakeups > 0);
	assert_true(st.wakeups >= st.worker[0].wakeups);
	tb_free(tb);
	fanout_destroy(e);
}

struct worker_count {
	unsigned *count, n, total;
};

static bool count_worker(pid_t tid, const char *name, void *arg)
{
	struct worker_count *wc = arg;
	unsigned i;
	char tail;

	(void)tid;
	if (!strncmp(name, "fanout-w", 8)) {
		wc->total++;
		if (sscanf(name + 8, "%u%c", &i, &tail) == 1 && i < wc->n)
			wc->count[i]++;
	}
	return false;
}

/*
 * Threads of this process named "fanout-w<i>": count[i] for i < n gets how
 * many carry index i; returns how many carry such a name at all.
 */
static unsigned worker_names(unsigned *count, unsigned n)
{
	struct worker_count wc = {count, n, 0};

	memset(count, 0, n * sizeof(*count));
	each_thread(count_worker, &wc);
	return wc.total;
}

/* Wait (bounded) until no thread named fanout-w* is left: a joined thread
 * may linger in /proc for a moment after pthread_join returns. */
static void no_worker_names_left(void)
{
	uint64_t end = mono_ms() + WAIT_MS;
	unsigned dummy;

	while (worker_names(&dummy, 1) != 0) {
		assert_true(mono_ms() < end);
		sleep_ms(1);
	}
}

/* Every worker thread is named fanout-w<index>, from fanout_create() on. */
static void stats_thread_names(void **state)
{
	unsigned count[4];

	no_worker_names_left(); /* earlier tests' engines are gone */
	struct fanout_engine *e =
		NEW_ENGINE(.workers = 3, .flags = FANOUT_NO_PIN);

	assert_int_equal(worker_names(count, 4), 3);
	assert_int_equal(count[0], 1);
	assert_int_equal(count[1], 1);
	assert_int_equal(count[2], 1);
	assert_int_equal(count[3], 0);
	fanout_destroy(e);
	no_worker_names_left();
}

#define MANY_WORKERS 80u

struct many {
	atomic_int started;
	atomic_int ran_on[MANY_WORKERS]; /* by the runner's thread name */
	atomic_int bad_name;
};

/* Holds its worker until all MANY_WORKERS children run at once, so each
 * worker runs exactly one; notes which worker by its thread name. */
static int many_fn(struct fanout_child *c, void *arg)
{
	struct many *m = arg;
	char name[16];
	unsigned i;

	if (pthread_getname_np(pthread_self(), name, sizeof(name)) ||
	    sscanf(name, "fanout-w%u", &i) != 1 || i >= MANY_WORKERS)
		atomic_fetch_add(&m->bad_name, 1);
	else
		atomic_fetch_add(&m->ran_on[i], 1);
	atomic_fetch_add(&m->started, 1);
	CHECK(wait_ge(&m->started, MANY_WORKERS, GATE_MS));
	return 0;
}

/* fanout_worker_stats() reaches the workers past the 64 of st.worker[]. */
static void stats_worker_stats_beyond_64(void **state)
{
	struct fanout_engine *e = NEW_ENGINE(.workers = MANY_WORKERS,
					     .max_children = MANY_WORKERS,
					     .flags = FANOUT_NO_PIN);
	struct fanout_task t[MANY_WORKERS];
	struct fanout_batch b = {.tasks = t, .ntasks = MANY_WORKERS};
	struct fanout_worker_stats ws, sentinel;
	struct fanout_event *ev;
	struct fanout_stats st;
	static struct many m;

	memset(&m, 0, sizeof(m));
	for (unsigned i = 0; i < MANY_WORKERS; i++)
		t[i] = (struct fanout_task){"hold", many_fn, &m};
	assert_int_equal(fanout_dispatch(e, &b, NULL), 0);
	ev = must_wait(fanout_default_sink(e));
	assert_int_equal(ev->ncompleted, MANY_WORKERS);
	fanout_event_free(ev);
	assert_int_equal(atomic_load(&m.bad_name), 0);

	st = stats_of(e);
	assert_int_equal(st.nworkers, MANY_WORKERS);
	assert_int_equal(st.children_run, MANY_WORKERS);
	for (unsigned i = 0; i < MANY_WORKERS; i++) {
		memset(&ws, 0xa5, sizeof(ws));
		assert_int_equal(fanout_worker_stats(e, i, &ws), 0);
		/* the worker named fanout-w<i> is worker i, and ran one */
		assert_int_equal(atomic_load(&m.ran_on[i]), 1);
		assert_int_equal(ws.children_run, 1);
		assert_int_equal(ws.cpu, -1); /* FANOUT_NO_PIN */
		if (i < FANOUT_STATS_MAX_WORKERS) {
			assert_int_equal(st.worker[i].children_run, 1);
			assert_int_equal(st.worker[i].cpu, -1);
		}
	}
	/* Out of range and NULL: refused, *out untouched. */
	memset(&ws, 0xa5, sizeof(ws));
	memcpy(&sentinel, &ws, sizeof(ws));
	assert_int_equal(fanout_worker_stats(e, MANY_WORKERS, &ws), -ERANGE);
	assert_int_equal(fanout_worker_stats(e, UINT_MAX, &ws), -ERANGE);
	assert_memory_equal(&ws, &sentinel, sizeof(ws));
	assert_int_equal(fanout_worker_stats(NULL, 0, &ws), -EINVAL);
	assert_int_equal(fanout_worker_stats(e, 0, NULL), -EINVAL);
	assert_non_null(strstr(fanout_strerror(-ERANGE), "worker"));
	fanout_destroy(e);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		TC(stats_fresh_engine),	   TC(stats_dispatch_and_run_counts),
		TC(stats_worker_sum_many), TC(stats_counted_per_thread),
		TC(stats_rejected),	   TC(stats_cancel_counts),
		TC(stats_running_gauges),  TC(stats_parks_and_wakeups),
		TC(stats_thread_names),	   TC(stats_worker_stats_beyond_64),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
