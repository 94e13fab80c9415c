/* SPDX-License-Identifier: MIT */
/* test_shutdown.c - fanout_shutdown/destroy: every event delivered, refusals. */
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>

#include "common.h"

/* Each child ran exactly once to completion or never ran (interrupted). */
static void check_run_or_skipped(const struct fanout_event *ev,
				 struct tbatch *tb)
{
	assert_int_equal(ev->nresults, tb->n);
	for (unsigned i = 0; i < tb->n; i++) {
		const struct fanout_result *r = &ev->results[i];

		assert_int_equal(r->index, i);
		if (r->status == FANOUT_COMPLETED) {
			assert_int_equal(atomic_load(&tb->probes[i].runs), 1);
		} else {
			assert_int_equal(r->status, FANOUT_INTERRUPTED);
			assert_int_equal(r->code, -ECANCELED);
			assert_int_equal(r->duration_ns, 0);
			assert_int_equal(atomic_load(&tb->probes[i].runs), 0);
		}
	}
}

static void shutdown_delivers_every_event(void **state)
{
	struct fanout_engine *e = NEW_ENGINE(.workers = 1, .max_children = 1,
					     .flags = FANOUT_NO_PIN);
	struct fanout_sink *s = NULL;
	struct tbatch *d1 = tb_new(4), *d2 = tb_new(3), *d3 = tb_new(2);
	struct fanout_event *ev = NULL;

	assert_int_equal(fanout_sink_create(e, &s), 0);
	for (unsigned i = 0; i < 4; i++)
		d1->probes[i].until_interrupted = true;
	fanout_id id1 = must_dispatch(e, d1);
	uint64_t end = mono_ms() + WAIT_MS;
	while (tb_runs(d1) < 1) {
		assert_true(mono_ms() < end);
		sleep_us(100);
	}
	d2->b.sink = s;
	d3->b.sink = s;
	fanout_id id2 = must_dispatch(e, d2);
	fanout_id id3 = must_dispatch(e, d3);

	assert_int_equal(fanout_shutdown(e), 0);

	/* every event is already there: poll, not wait */
	assert_int_equal(fanout_poll(fanout_default_sink(e), &ev), 0);
	assert_true(ev->id == id1);
	assert_true(ev->cancelled);
	assert_int_equal(ev->status, FANOUT_INTERRUPTED);
	assert_int_equal(ev->nresults, 4);
	assert_int_equal(tb_runs(d1), 1);
	for (unsigned i = 0; i < 4; i++) {
		const struct fanout_result *r = &ev->results[i];

		assert_int_equal(r->status, FANOUT_INTERRUPTED);
		assert_int_equal(r->code, -ECANCELED);
		if (atomic_load(&d1->probes[i].runs)) {
			assert_true(d1->probes[i].interrupted_seen);
			assert_true(r->duration_ns > 0);
		} else {
			assert_int_equal(r->duration_ns, 0);
		}
	}
	fanout_event_free(ev);
	assert_int_equal(fanout_poll(fanout_default_sink(e), &ev), -EAGAIN);

	int fd = fanout_sink_fd(s);
	struct pollfd p = {.fd = fd, .events = POLLIN};
	assert_int_equal(poll(&p, 1, 0), 1);
	int seen2 = 0, seen3 = 0;
	for (int k = 0; k < 2; k++) {
		assert_int_equal(fanout_poll(s, &ev), 0);
		if (ev->id == id2) {
			seen2++;
			check_run_or_skipped(ev, d2);
		} else {
			assert_true(ev->id == id3);
			seen3++;
			check_run_or_skipped(ev, d3);
		}
		fanout_event_free(ev);
	}
	assert_int_equal(seen2, 1);
	assert_int_equal(seen3, 1);
	assert_int_equal(fanout_poll(s, &ev), -EAGAIN);
	struct fanout_stats st = stats_of(e);
	assert_int_equal(st.running, 0);
	assert_int_equal(st.async_running, 0);
	assert_int_equal(fanout_sink_destroy(s), 0);
	tb_free(d1);
	tb_free(d2);
	tb_free(d3);
	fanout_destroy(e);
}

static void shutdown_refuses_new_work(void **state)
{
	struct fanout_engine *e =
		NEW_ENGINE(.workers = 2, .flags = FANOUT_NO_PIN);
	struct fanout_sink *s = NULL, *s2 = NULL;
	struct tbatch *tb = tb_new(2);
	struct fanout_event *ev = NULL;
	fanout_id id = 0;

	assert_int_equal(fanout_sink_create(e, &s), 0);
	assert_int_equal(fanout_shutdown(e), 0);
	assert_int_equal(fanout_dispatch(e, &tb->b, &id), -ESHUTDOWN);
	assert_int_equal(fanout_run(e, &tb->b, &ev), -ESHUTDOWN);
	assert_int_equal(fanout_delegate(e, &tb->b, &id, &ev), -ESHUTDOWN);
	tb->b.sink = s;
	assert_int_equal(fanout_dispatch(e, &tb->b, &id), -ESHUTDOWN);
	assert_int_equal(fanout_sink_create(e, &s2), -ESHUTDOWN);
	assert_int_equal(tb_runs(tb), 0);
	/* idempotent */
	assert_int_equal(fanout_shutdown(e), 0);
	assert_int_equal(fanout_shutdown(e), 0);
	/* sinks still answer */
	assert_int_equal(fanout_poll(s, &ev), -EAGAIN);
	assert_int_equal(fanout_poll(fanout_default_sink(e), &ev), -EAGAIN);
	assert_int_equal(fanout_wait(s, &ev, 5), -ETIMEDOUT);
	struct fanout_stats st = stats_of(e);
	assert_int_equal(st.dispatched, 0);
	assert_int_equal(st.runs, 0);
	assert_int_equal(st.children_run, 0);
	assert_int_equal(fanout_sink_destroy(s), 0);
	tb_free(tb);
	fanout_destroy(e);
}

static void shutdown_idle_then_destroy(void **state)
{
	struct fanout_engine *e =
		NEW_ENGINE(.workers = 2, .flags = FANOUT_NO_PIN);
	struct tbatch *tb = tb_new(3);

	fanout_id id = must_dispatch(e, tb);
	struct fanout_event *ev = must_wait(fanout_default_sink(e));
	assert_true(ev->id == id);
	fanout_event_free(ev);
	assert_int_equal(fanout_shutdown(e), 0);
	fanout_destroy(e);
	tb_free(tb);
}

/* An event stays valid after shutdown (only fanout_destroy ends it). */
static void event_valid_after_shutdown(void **state)
{
	struct fanout_engine *e =
		NEW_ENGINE(.workers = 2, .flags = FANOUT_NO_PIN);
	struct tbatch *a = tb_new(2), *b = tb_new(3);
	struct fanout_event *eva = NULL, *evb = NULL;

	a->b.context = "ctx-a";
	a->probes[0].summary = "sum-a0";
	b->b.session_key = "key-b";
	b->probes[2].summary = "sum-b2";
	fanout_id ida = must_dispatch(e, a);
	eva = must_wait(fanout_default_sink(e));
	assert_int_equal(fanout_run(e, &b->b, &evb), 0);
	assert_int_equal(fanout_shutdown(e), 0);

	assert_true(eva->id == ida);
	assert_string_equal(eva->context, "ctx-a");
	assert_string_equal(eva->results[0].summary, "sum-a0");
	assert_string_equal(eva->results[1].goal, "task-1");
	assert_string_equal(evb->session_key, "key-b");
	assert_string_equal(evb->results[2].summary, "sum-b2");
	char buf[512];
	assert_true(fanout_format(eva, buf, sizeof(buf)) > 0);
	assert_true(fanout_event_json(evb, buf, sizeof(buf)) > 0);
	fanout_event_free(eva);
	fanout_event_free(evb);
	tb_free(a);
	tb_free(b);
	fanout_destroy(e);
}

/* destroy frees undrained events in every sink (ASan's leak check). */
static void destroy_frees_undrained_events(void **state)
{
	struct fanout_engine *e =
		NEW_ENGINE(.workers = 2, .flags = FANOUT_NO_PIN);
	struct fanout_sink *s = NULL;
	struct tbatch *tb[5];

	assert_int_equal(fanout_sink_create(e, &s), 0);
	for (int i = 0; i < 5; i++) {
		tb[i] = tb_new(2);
		tb[i]->b.sink = i < 3 ? NULL : s;
		tb[i]->b.context = "ctx";
		tb[i]->probes[0].summary = "a summary";
		tb[i]->probes[1].error = "an error";
		tb[i]->probes[1].ret = -EIO;
		wait_finished(e, must_dispatch(e, tb[i]));
	}
	fanout_destroy(e);
	for (int i = 0; i < 5; i++)
		tb_free(tb[i]);
}

/* destroy without shutdown, with children running: they are interrupted. */
static void destroy_with_work_running(void **state)
{
	struct fanout_engine *e =
		NEW_ENGINE(.workers = 2, .flags = FANOUT_NO_PIN);
	struct tbatch *tb = tb_new(6);

	for (unsigned i = 0; i < 6; i++)
		tb->probes[i].until_interrupted = true;
	must_dispatch(e, tb);
	uint64_t end = mono_ms() + WAIT_MS;
	while (tb_runs(tb) < 1) {
		assert_true(mono_ms() < end);
		sleep_us(100);
	}
	fanout_destroy(e);
	/* every child that started has returned */
	for (unsigned i = 0; i < 6; i++)
		assert_int_equal(atomic_load(&tb->probes[i].finished),
				 atomic_load(&tb->probes[i].runs));
	tb_free(tb);
}

/* shutdown/destroy from a child of the same engine. */
struct selfkill {
	struct fanout_engine *e;
	int rc;
};

static int selfkill_fn(struct fanout_child *c, void *arg)
{
	struct selfkill *k = arg;

	(void)c;
	k->rc = fanout_shutdown(k->e);
	fanout_destroy(k->e); /* does nothing from a child */
	return 0;
}

static void shutdown_from_child_edeadlk(void **state)
{
	struct fanout_engine *e =
		NEW_ENGINE(.workers = 1, .flags = FANOUT_NO_PIN);
	struct selfkill k = {e, 1};
	struct fanout_task t = {"selfkill", selfkill_fn, &k};
	struct fanout_batch b = {.tasks = &t, .ntasks = 1};
	struct fanout_event *ev = NULL;

	/* from a background child */
	fanout_id id = 0;
	assert_int_equal(fanout_dispatch(e, &b, &id), 0);
	ev = must_wait(fanout_default_sink(e));
	assert_true(ev->id == id);
	assert_int_equal(ev->status, FANOUT_COMPLETED);
	fanout_event_free(ev);
	assert_int_equal(k.rc, -EDEADLK);

	/* from a child of fanout_run (possibly on this very thread) */
	k.rc = 1;
	assert_int_equal(fanout_run(e, &b, &ev), 0);
	assert_int_equal(ev->status, FANOUT_COMPLETED);
	fanout_event_free(ev);
	assert_int_equal(k.rc, -EDEADLK);

	/* the engine is still accepting work */
	struct tbatch *tb = tb_new(3);
	id = must_dispatch(e, tb);
	ev = must_wait(fanout_default_sink(e));
	assert_true(ev->id == id);
	check_all_completed(ev, tb);
	fanout_event_free(ev);
	tb_free(tb);
	fanout_destroy(e);
}

/*
 * Shutdown/destroy from a child nested in a child of the engine (issue 9.2).
 *
 * The application calls fanout_run(eng[0]); each level's child calls
 * fanout_run(eng[l + 1]); the innermost child tries fanout_shutdown() and
 * fanout_destroy() of every engine up the chain: each would wait for the
 * caller itself, so shutdown must return -EDEADLK and destroy do nothing.
 * With `cross` = L, level L's run has two children and the one that runs on
 * the caller's own thread only waits until the other, on a worker of
 * eng[L], has made its attempts: the chain then crosses threads (the
 * parent child sits in fanout_run on one thread, the nested child runs on
 * another engine's worker).  A hang fails through the watchdog.
 */
#define NEST_MAX 3

static void watchdog_fired(int sig)
{
	static const char msg[] = "test_shutdown: watchdog: a nested shutdown "
				  "or destroy hung\n";

	(void)sig;
	(void)!write(2, msg, sizeof(msg) - 1);
	_exit(1);
}

/* Fail the test (instead of hanging the suite) after @s seconds. */
static void watchdog(unsigned s)
{
	signal(SIGALRM, watchdog_fired);
	alarm(s);
}

struct nest;

struct nest_arg {
	struct nest *n;
	unsigned level;
};

struct nest {
	struct fanout_engine *eng[NEST_MAX];
	unsigned levels;
	unsigned cross;		     /* level with the two-child run; 0: none */
	struct fanout_engine *other; /* unrelated: its shutdown is allowed */
	struct nest_arg arg[NEST_MAX];
	pthread_t caller[NEST_MAX]; /* the thread calling fanout_run(eng[l]) */
	atomic_int worker_done;	 /* cross level: the worker child is through */
	atomic_int attempts;	 /* innermost children that tried */
	atomic_int rc[NEST_MAX]; /* the last fanout_shutdown(eng[l]) */
	atomic_int other_rc;
	atomic_int on_caller_thread; /* innermost ran on caller[0]'s thread */
	atomic_int on_other_thread;  /* ... or on another one */
};

static int nest_fn(struct fanout_child *c, void *arg);

/* Level l - 1's child: run level l (two children at the cross level). */
static void nest_run(struct nest *n, unsigned l)
{
	struct fanout_task t[2] = {{"nested", nest_fn, &n->arg[l]},
				   {"nested", nest_fn, &n->arg[l]}};
	struct fanout_batch b = {.tasks = t,
				 .ntasks = l && l == n->cross ? 2 : 1};
	struct fanout_event *ev = NULL;

	n->caller[l] = pthread_self();
	CHECK(fanout_run(n->eng[l], &b, &ev) == 0);
	if (!ev)
		return;
	CHECK(ev->status == FANOUT_COMPLETED);
	CHECK(ev->ncompleted == b.ntasks);
	fanout_event_free(ev);
}

static int nest_fn(struct fanout_child *c, void *arg)
{
	struct nest_arg *a = arg;
	struct nest *n = a->n;
	unsigned l = a->level, i;

	(void)c;
	if (l && l == n->cross && pthread_equal(pthread_self(), n->caller[l])) {
		/* the caller's own child: keep the run open until the child
		 * on eng[l]'s worker has made its attempts */
		CHECK(wait_flag(&n->worker_done, GATE_MS));
		return 0;
	}
	if (l + 1 < n->levels) {
		nest_run(n, l + 1);
	} else {
		for (i = 0; i < n->levels; i++) {
			atomic_store(&n->rc[i], fanout_shutdown(n->eng[i]));
			CHECK(atomic_load(&n->rc[i]) == -EDEADLK);
			fanout_destroy(n->eng[i]); /* must do nothing */
		}
		if (n->other)
			atomic_store(&n->other_rc, fanout_shutdown(n->other));
		if (pthread_equal(pthread_self(), n->caller[0]))
			atomic_fetch_add(&n->on_caller_thread, 1);
		else
			atomic_fetch_add(&n->on_other_thread, 1);
		atomic_fetch_add(&n->attempts, 1);
	}
	if (l && l == n->cross)
		atomic_store(&n->worker_done, 1);
	return 0;
}

/* An engine that was asked to shut down from inside still works. */
static void still_works(struct fanout_engine *e)
{
	struct tbatch *tb = tb_new(3);
	struct fanout_event *ev = NULL;
	fanout_id id;

	assert_int_equal(fanout_run(e, &tb->b, &ev), 0);
	check_all_completed(ev, tb);
	fanout_event_free(ev);
	tb_free(tb);
	tb = tb_new(3);
	id = must_dispatch(e, tb);
	ev = must_wait(fanout_default_sink(e));
	assert_true(ev->id == id);
	check_all_completed(ev, tb);
	fanout_event_free(ev);
	tb_free(tb);
}

/* Build the chain: eng[l] has workers[l] threads (unpinned, so the test
 * does not depend on the CPUs), max_depth deep enough for the chain. */
static void nest_go(struct nest *n, const unsigned *workers)
{
	unsigned l;

	watchdog(120);
	for (l = 0; l < n->levels; l++) {
		n->eng[l] = NEW_ENGINE(.workers = workers[l],
				       .flags = FANOUT_NO_PIN,
				       .max_depth = NEST_MAX + 1);
		n->arg[l] = (struct nest_arg){n, l};
	}
	nest_run(n, 0);
	alarm(0);
	assert_true(atomic_load(&n->attempts) >= 1);
	for (l = 0; l < n->levels; l++)
		assert_int_equal(atomic_load(&n->rc[l]), -EDEADLK);
}

static void nest_done(struct nest *n)
{
	unsigned l;

	for (l = 0; l < n->levels; l++) {
		still_works(n->eng[l]);
		fanout_destroy(n->eng[l]);
	}
	if (n->other)
		fanout_destroy(n->other);
}

/* app -> run(B) -> run(A) -> shutdown(B)/destroy(B), all on this thread
 * (one worker each: a fanout_run caller then runs every child itself). */
static void nested_shutdown_same_thread(void **state)
{
	static const unsigned workers[] = {1, 1};
	struct nest n = {.levels = 2};

	n.other = NEW_ENGINE(.workers = 1, .flags = FANOUT_NO_PIN);
	nest_go(&n, workers);
	/* the whole chain ran on this thread */
	assert_int_equal(atomic_load(&n.on_caller_thread), 1);
	assert_int_equal(atomic_load(&n.on_other_thread), 0);
	/* an engine the chain does not wait for may be shut down (E18) */
	assert_int_equal(atomic_load(&n.other_rc), 0);
	nest_done(&n);
}

/* app -> run(B) -> run(A) with A's child on an A worker while B's child
 * sits in fanout_run(A) on this thread -> shutdown(B)/destroy(B). */
static void nested_shutdown_cross_thread(void **state)
{
	static const unsigned workers[] = {1, 2};
	struct nest n = {.levels = 2, .cross = 1};
	struct fanout_stats st;

	nest_go(&n, workers);
	assert_true(atomic_load(&n.on_other_thread) >= 1);
	/* that other thread is one of A's workers */
	st = stats_of(n.eng[1]);
	assert_true(st.worker[0].children_run + st.worker[1].children_run >= 1);
	nest_done(&n);
}

/* Three levels: app -> run(B) -> run(A) -> run(C) -> shutdown of B, A and
 * C; once all on this thread, once with the chain crossing to an A worker
 * at the middle level (C's child then runs on that worker too). */
static void nested_shutdown_three_levels(void **state)
{
	static const unsigned same[] = {1, 1, 1}, crossing[] = {1, 2, 1};
	struct nest n = {.levels = 3};
	struct nest m = {.levels = 3, .cross = 1};

	n.other = NEW_ENGINE(.workers = 1, .flags = FANOUT_NO_PIN);
	nest_go(&n, same);
	assert_int_equal(atomic_load(&n.on_caller_thread), 1);
	assert_int_equal(atomic_load(&n.other_rc), 0);
	nest_done(&n);

	nest_go(&m, crossing);
	assert_true(atomic_load(&m.on_other_thread) >= 1);
	nest_done(&m);
}

/* A background link does not make the parent wait: app -> dispatch(B) ->
 * B's child dispatches to A and returns -> A's child shuts B down: 0, and
 * B's event was published before that shutdown returned. */
struct bg_link {
	struct fanout_engine *a, *b;
	atomic_int b_child_done;
	atomic_int rc;
};

static int bg_a_fn(struct fanout_child *c, void *arg)
{
	struct bg_link *k = arg;

	(void)c;
	CHECK(wait_flag(&k->b_child_done, GATE_MS));
	atomic_store(&k->rc, fanout_shutdown(k->b));
	return 0;
}

static int bg_b_fn(struct fanout_child *c, void *arg)
{
	struct bg_link *k = arg;
	struct fanout_task t = {"in A", bg_a_fn, k};
	struct fanout_batch b = {.tasks = &t, .ntasks = 1};

	(void)c;
	CHECK(fanout_dispatch(k->a, &b, NULL) == 0);
	atomic_store(&k->b_child_done, 1);
	return 0;
}

static void background_link_shutdown_allowed(void **state)
{
	struct bg_link k = {.rc = 1};
	struct fanout_task t = {"in B", bg_b_fn, &k};
	struct fanout_batch b = {.tasks = &t, .ntasks = 1};
	struct fanout_event *ev = NULL;
	fanout_id id = 0;

	watchdog(120);
	k.a = NEW_ENGINE(.workers = 1, .flags = FANOUT_NO_PIN);
	k.b = NEW_ENGINE(.workers = 1, .flags = FANOUT_NO_PIN);
	assert_int_equal(fanout_dispatch(k.b, &b, &id), 0);
	ev = must_wait(fanout_default_sink(k.a));
	assert_int_equal(ev->status, FANOUT_COMPLETED);
	fanout_event_free(ev);
	alarm(0);
	assert_int_equal(atomic_load(&k.rc), 0);
	assert_int_equal(fanout_poll(fanout_default_sink(k.b), &ev), 0);
	assert_true(ev->id == id);
	assert_int_equal(ev->status, FANOUT_COMPLETED);
	fanout_event_free(ev);
	assert_int_equal(fanout_dispatch(k.b, &b, &id), -ESHUTDOWN);
	fanout_destroy(k.b);
	fanout_destroy(k.a);
}

/* A thread inside fanout_run when shutdown comes gets its event. */
struct runner {
	struct fanout_engine *e;
	struct tbatch *tb;
	int rc;
	struct fanout_event *ev;
};

static void *runner_thread(void *arg)
{
	struct runner *r = arg;

	r->rc = fanout_run(r->e, &r->tb->b, &r->ev);
	return NULL;
}

static void shutdown_interrupts_sync_run(void **state)
{
	struct fanout_engine *e =
		NEW_ENGINE(.workers = 1, .flags = FANOUT_NO_PIN);
	struct runner r = {.e = e, .tb = tb_new(4)};

	for (unsigned i = 0; i < 4; i++)
		r.tb->probes[i].until_interrupted = true;
	pthread_t t = spawn(runner_thread, &r);
	uint64_t end = mono_ms() + WAIT_MS;
	while (tb_runs(r.tb) < 1) {
		assert_true(mono_ms() < end);
		sleep_us(100);
	}
	assert_int_equal(fanout_shutdown(e), 0);
	join(t);
	assert_int_equal(r.rc, 0);
	assert_non_null(r.ev);
	assert_true(r.ev->cancelled);
	assert_int_equal(r.ev->status, FANOUT_INTERRUPTED);
	assert_int_equal(r.ev->nresults, 4);
	for (unsigned i = 0; i < 4; i++) {
		assert_int_equal(r.ev->results[i].status, FANOUT_INTERRUPTED);
		assert_int_equal(atomic_load(&r.tb->probes[i].finished),
				 atomic_load(&r.tb->probes[i].runs));
	}
	fanout_event_free(r.ev);
	assert_int_equal(fanout_poll(fanout_default_sink(e), &r.ev), -EAGAIN);
	tb_free(r.tb);
	fanout_destroy(e);
}

/* Dispatch and run race shutdown: accepted => event; else -ESHUTDOWN. */
enum { PER = 400 };

struct racer {
	struct fanout_engine *e;
	struct tbatch *tb[PER];
	fanout_id id[PER];
	int accepted[PER];
	int naccepted;
	int nshutdown;
	atomic_int *progress;
	bool sync;
	int sync_ok;
};

static void *racer_thread(void *arg)
{
	struct racer *r = arg;

	for (int k = 0; k < PER; k++) {
		int rc;

		if (r->sync) {
			struct fanout_event *ev = NULL;

			rc = fanout_run(r->e, &r->tb[k]->b, &ev);
			if (rc == 0) {
				CHECK(ev && ev->nresults == 2);
				for (unsigned i = 0; ev && i < 2; i++) {
					int runs = atomic_load(
						&r->tb[k]->probes[i].runs);
					if (ev->results[i].status ==
					    FANOUT_COMPLETED)
						CHECK(runs == 1);
					else
						CHECK(runs == 0);
				}
				fanout_event_free(ev);
				r->sync_ok++;
			}
		} else {
			while ((rc = fanout_dispatch(r->e, &r->tb[k]->b,
						     &r->id[k])) == -EBUSY)
				sleep_us(50);
		}
		if (rc == 0) {
			r->accepted[k] = 1;
			r->naccepted++;
			atomic_fetch_add(r->progress, 1);
		} else {
			CHECK(rc == -ESHUTDOWN);
			r->nshutdown++;
			break;
		}
	}
	return NULL;
}

static void shutdown_races_dispatch(void **state)
{
	struct fanout_engine *e =
		NEW_ENGINE(.workers = 2, .flags = FANOUT_NO_PIN);
	struct racer *r = calloc(3, sizeof(*r));
	atomic_int progress = 0;
	pthread_t t[3];

	assert_non_null(r);
	for (int i = 0; i < 3; i++) {
		r[i].e = e;
		r[i].progress = &progress;
		r[i].sync = i == 2;
		for (int k = 0; k < PER; k++) {
			r[i].tb[k] = tb_new(2);
			r[i].tb[k]->b.user = r[i].tb[k];
			r[i].tb[k]->probes[1].sleep_us = 100;
		}
	}
	for (int i = 0; i < 3; i++)
		t[i] = spawn(racer_thread, &r[i]);
	assert_true(wait_ge(&progress, 20, WAIT_MS));
	assert_int_equal(fanout_shutdown(e), 0);
	for (int i = 0; i < 3; i++)
		join(t[i]);

	/* every accepted dispatch has exactly one event; nothing else */
	int events = 0, accepted = 0;
	struct fanout_event *ev = NULL;
	while (fanout_poll(fanout_default_sink(e), &ev) == 0) {
		struct tbatch *tb = ev->user;
		bool found = false;

		events++;
		for (int i = 0; i < 2 && !found; i++)
			for (int k = 0; k < PER && !found; k++)
				if (r[i].tb[k] == tb) {
					found = true;
					assert_int_equal(r[i].accepted[k], 1);
					assert_true(r[i].id[k] == ev->id);
					r[i].accepted[k] = 2; /* seen */
				}
		assert_true(found);
		check_run_or_skipped(ev, tb);
		fanout_event_free(ev);
	}
	for (int i = 0; i < 2; i++) {
		accepted += r[i].naccepted;
		for (int k = 0; k < PER; k++)
			assert_int_not_equal(r[i].accepted[k], 1);
	}
	assert_int_equal(events, accepted);
	assert_int_equal(r[2].sync_ok, r[2].naccepted);
	for (int i = 0; i < 3; i++) {
		/* stopped by -ESHUTDOWN unless it ran out of batches */
		assert_true(r[i].nshutdown == 1 || r[i].naccepted == PER);
		for (int k = 0; k < PER; k++) {
			if (!r[i].accepted[k])
				assert_int_equal(tb_runs(r[i].tb[k]), 0);
			tb_free(r[i].tb[k]);
		}
	}
	free(r);
	fanout_destroy(e);
}

/*
 * Two fanout_shutdown() calls at once: the second sleeps for the first to
 * finish (shut_done) on the eventcount the first sleeps on for the drain,
 * and the last finaliser's signal must reach the first.  It woke one
 * sleeper only - the one queued first (futex wakes are FIFO among normal
 * threads) - so once a signal that did not drain the engine had woken the
 * first caller and queued it again behind the second, the last one woke
 * the second, which went back to sleep, and both calls hung.
 *
 * Forced with the kernel's own view of each thread (/proc/<tid>/syscall:
 * asleep in futex(2), and on which word), no sleeps: A shuts down while a
 * child holds the engine; B shuts down too; both sleep on one word.  A
 * refused dispatch (its unit put while shutting) wakes A, which finds the
 * child still running and queues again behind B.  Then the child returns:
 * A must come back.  If it does not, another refused dispatch wakes it, so
 * the test fails instead of hanging.
 */
struct twice {
	struct fanout_engine *e;
	atomic_int started, interrupted, gate;
};

static int hold_fn(struct fanout_child *c, void *arg)
{
	struct twice *t = arg;
	uint64_t end = mono_ms() + GATE_MS;

	atomic_store(&t->started, 1);
	while (!fanout_interrupted(c) && mono_ms() < end)
		sleep_us(50);
	atomic_store(&t->interrupted, 1);
	CHECK(wait_flag(&t->gate, GATE_MS));
	return -ECANCELED;
}

struct shutter {
	struct twice *t;
	atomic_int tid, done;
};

static void *shutter_thread(void *arg)
{
	struct shutter *s = arg;

	atomic_store(&s->tid, (int)gettid());
	CHECK(fanout_shutdown(s->t->e) == 0);
	atomic_store(&s->done, 1);
	return NULL;
}

/* The futex word thread @tid sleeps on (its first syscall argument), or
 * 0 when it is not asleep in futex(2). */
static unsigned long futex_word(int tid)
{
	char path[64], line[256];
	unsigned long word = 0;
	long nr;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/self/task/%d/syscall", tid);
	f = fopen(path, "r");
	if (!f)
		return 0;
	if (fgets(line, sizeof(line), f) &&
	    sscanf(line, "%ld %lx", &nr, &word) == 2 && nr != SYS_futex)
		word = 0;
	fclose(f);
	return word;
}

/* Wait until both shutdown callers sleep on one futex word. */
static bool both_asleep(struct shutter *a, struct shutter *b)
{
	uint64_t end = mono_ms() + WAIT_MS;

	for (;;) {
		unsigned long wa = futex_word(atomic_load(&a->tid));

		if (wa && wa == futex_word(atomic_load(&b->tid)))
			return true;
		if (mono_ms() > end)
			return false;
		sleep_us(100);
	}
}

static void refused_dispatch(struct fanout_engine *e)
{
	struct tbatch *tb = tb_new(1);

	assert_int_equal(fanout_dispatch(e, &tb->b, NULL), -ESHUTDOWN);
	assert_int_equal(tb_runs(tb), 0);
	tb_free(tb);
}

static void shutdown_twice_at_once(void **state)
{
	struct twice t = {0};
	struct shutter a = {.t = &t}, b = {.t = &t};
	struct fanout_task task = {.goal = "hold", .fn = hold_fn, .arg = &t};
	struct fanout_batch batch = {.tasks = &task, .ntasks = 1};
	pthread_t ta, tb;
	bool came_back;
	char path[64];
	FILE *f;

	/* A sandbox that hides /proc/<tid>/syscall cannot show who sleeps. */
	snprintf(path, sizeof(path), "/proc/self/task/%d/syscall",
		 (int)gettid());
	f = fopen(path, "r");
	if (!f)
		skip();
	fclose(f);
	t.e = NEW_ENGINE(.workers = 2, .flags = FANOUT_NO_PIN);
	assert_int_equal(fanout_dispatch(t.e, &batch, NULL), 0);
	/* running, so the shutdown interrupts it rather than skip it */
	assert_true(wait_flag(&t.started, WAIT_MS));
	ta = spawn(shutter_thread, &a);
	assert_true(wait_flag(&t.interrupted, WAIT_MS)); /* A is draining */
	assert_true(wait_flag(&a.tid, WAIT_MS));
	tb = spawn(shutter_thread, &b);
	assert_true(wait_flag(&b.tid, WAIT_MS));
	assert_true(both_asleep(&a, &b)); /* queued: A, B */
	refused_dispatch(t.e);		  /* wakes A: not drained yet */
	assert_true(both_asleep(&a, &b)); /* queued: B, A */
	assert_false(atomic_load(&a.done));
	atomic_store(&t.gate, 1); /* the child returns: drained */
	came_back = wait_flag(&a.done, WAIT_MS);
	while (!atomic_load(&a.done) || !atomic_load(&b.done)) {
		refused_dispatch(t.e); /* rescue a lost wake-up */
		sleep_us(1000);
	}
	join(ta);
	join(tb);
	assert_true(came_back);
	struct fanout_event *ev = must_wait(fanout_default_sink(t.e));
	assert_int_equal(ev->results[0].status, FANOUT_INTERRUPTED);
	fanout_event_free(ev);
	fanout_destroy(t.e);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		TC(shutdown_delivers_every_event),
		TC(shutdown_refuses_new_work),
		TC(shutdown_idle_then_destroy),
		TC(event_valid_after_shutdown),
		TC(destroy_frees_undrained_events),
		TC(destroy_with_work_running),
		TC(shutdown_from_child_edeadlk),
		TC(nested_shutdown_same_thread),
		TC(nested_shutdown_cross_thread),
		TC(nested_shutdown_three_levels),
		TC(background_link_shutdown_allowed),
		TC(shutdown_interrupts_sync_run),
		TC(shutdown_races_dispatch),
		TC(shutdown_twice_at_once),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
