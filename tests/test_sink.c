/* SPDX-License-Identifier: MIT */
/* test_sink.c - sinks: poll, wait, routing, the eventfd, destroy, -EBUSY. */
#include <dlfcn.h>
#include <poll.h>

#include "common.h"
#include "fanout_testing.h"

static struct fanout_engine *eng2(void)
{
	return NEW_ENGINE(.workers = 2, .flags = FANOUT_NO_PIN);
}

/* Is @fd readable?  @ms: 0 = right now; else wait at most that long. */
static bool fd_readable(int fd, int ms)
{
	struct pollfd p = {.fd = fd, .events = POLLIN};
	int rc;

	do
		rc = poll(&p, 1, ms);
	while (rc < 0 && errno == EINTR);
	assert_true(rc >= 0);
	return rc == 1 && (p.revents & POLLIN);
}

static void sink_bad_args(void **state)
{
	struct fanout_engine *e = eng2();
	struct fanout_sink *s = NULL;
	struct fanout_event *ev = NULL;

	assert_int_equal(fanout_sink_create(NULL, &s), -EINVAL);
	assert_int_equal(fanout_sink_create(e, NULL), -EINVAL);
	assert_int_equal(fanout_sink_create(e, &s), 0);
	assert_int_equal(fanout_poll(NULL, &ev), -EINVAL);
	assert_int_equal(fanout_poll(s, NULL), -EINVAL);
	assert_int_equal(fanout_wait(NULL, &ev, 10), -EINVAL);
	assert_int_equal(fanout_wait(s, NULL, 10), -EINVAL);
	assert_int_equal(fanout_sink_fd(NULL), -EINVAL);
	assert_int_equal(fanout_sink_destroy(NULL), -EINVAL);
	assert_int_equal(fanout_sink_destroy(s), 0);
	fanout_event_free(NULL); /* no-op */
	fanout_destroy(e);
}

static void sink_poll_empty(void **state)
{
	struct fanout_engine *e = eng2();
	struct fanout_sink *s = NULL;
	struct fanout_event *ev = NULL;

	assert_int_equal(fanout_sink_create(e, &s), 0);
	assert_int_equal(fanout_poll(s, &ev), -EAGAIN);
	assert_int_equal(fanout_poll(fanout_default_sink(e), &ev), -EAGAIN);
	assert_int_equal(fanout_sink_destroy(s), 0);
	fanout_destroy(e);
}

static void sink_wait_timeout(void **state)
{
	struct fanout_engine *e = eng2();
	struct fanout_sink *s = NULL;
	struct fanout_event *ev = NULL;

	assert_int_equal(fanout_sink_create(e, &s), 0);
	assert_int_equal(fanout_wait(s, &ev, 20), -ETIMEDOUT);
	assert_int_equal(fanout_wait(fanout_default_sink(e), &ev, 1),
			 -ETIMEDOUT);
	/* timeout 0 "is fanout_poll()": -EAGAIN (-ETIMEDOUT tolerated) */
	int rc = fanout_wait(s, &ev, 0);
	assert_true(rc == -EAGAIN || rc == -ETIMEDOUT);
	assert_int_equal(fanout_sink_destroy(s), 0);
	fanout_destroy(e);
}

static void sink_wait_zero_returns_waiting_event(void **state)
{
	struct fanout_engine *e = eng2();
	struct tbatch *tb = tb_new(1);
	fanout_id id = must_dispatch(e, tb);
	struct fanout_event *ev = NULL;

	wait_finished(e, id);
	assert_int_equal(fanout_wait(fanout_default_sink(e), &ev, 0), 0);
	assert_true(ev->id == id);
	fanout_event_free(ev);
	tb_free(tb);
	fanout_destroy(e);
}

static void sink_wait_receives_later_event(void **state)
{
	struct fanout_engine *e = eng2();
	struct fanout_sink *s = NULL;
	struct tbatch *tb = tb_new(2);

	assert_int_equal(fanout_sink_create(e, &s), 0);
	tb->b.sink = s;
	tb->probes[0].sleep_us = 30000; /* likely published while we sleep */
	fanout_id id = must_dispatch(e, tb);
	struct fanout_event *ev = must_wait(s);
	assert_true(ev->id == id);
	check_all_completed(ev, tb);
	fanout_event_free(ev);

	/* and with an infinite timeout */
	memset(tb->probes, 0, sizeof(tb->probes[0]) * tb->n);
	tb->probes[1].sleep_us = 30000;
	id = must_dispatch(e, tb);
	ev = NULL;
	assert_int_equal(fanout_wait(s, &ev, -1), 0);
	assert_true(ev->id == id);
	check_all_completed(ev, tb);
	fanout_event_free(ev);
	assert_int_equal(fanout_sink_destroy(s), 0);
	tb_free(tb);
	fanout_destroy(e);
}

/* A child that computes for as long as its argument says (ns). */
static int busy_for(struct fanout_child *c, void *arg)
{
	uint64_t end = fanout_now_ns() + (uint64_t)(uintptr_t)arg;

	(void)c;
	while (fanout_now_ns() < end)
		;
	return 0;
}

/*
 * No lost wakeup.  A consumer that parks almost at once (spin_ns 1) waits
 * for one child at a time whose length sweeps 0-4 us, so the worker's
 * publish lands before, during and after the consumer's announcement and
 * re-check.  The publisher bumps the eventcount only when it sees a waiter
 * (fq_ec_signal_after_rmw): a publish that missed a waiter leaves it
 * asleep, and the 5 s timeout fails the test.
 */
static void sink_wait_wakes_on_every_publish(void **state)
{
	struct fanout_engine *e =
		NEW_ENGINE(.workers = 1, .spin_ns = 1, .flags = FANOUT_NO_PIN);
	struct fanout_task t = {"busy", busy_for, NULL};
	struct fanout_batch b = {.tasks = &t, .ntasks = 1};
	unsigned rounds = 20000;

	for (unsigned i = 0; i < rounds; i++) {
		struct fanout_event *ev = NULL;
		fanout_id id;

		t.arg = (void *)(uintptr_t)((i * 37u) % 4000u);
		assert_int_equal(fanout_dispatch(e, &b, &id), 0);
		assert_int_equal(fanout_wait(fanout_default_sink(e), &ev, 5000),
				 0);
		assert_true(ev->id == id);
		assert_int_equal(ev->results[0].status, FANOUT_COMPLETED);
		fanout_event_free(ev);
	}
	fanout_destroy(e);
}

static bool has_id(const fanout_id *ids, int n, fanout_id id)
{
	for (int i = 0; i < n; i++)
		if (ids[i] == id)
			return true;
	return false;
}

static void sink_routing_two_sinks(void **state)
{
	struct fanout_engine *e = eng2();
	struct fanout_sink *s1 = NULL, *s2 = NULL;
	struct tbatch *tb[5];
	fanout_id id1[3], id2[2];
	int seen1[3] = {0}, seen2[2] = {0};

	assert_int_equal(fanout_sink_create(e, &s1), 0);
	assert_int_equal(fanout_sink_create(e, &s2), 0);
	assert_ptr_not_equal(s1, s2);
	assert_int_not_equal(fanout_sink_fd(s1), fanout_sink_fd(s2));
	for (int i = 0; i < 5; i++) {
		tb[i] = tb_new(2);
		tb[i]->b.sink = i < 3 ? s1 : s2;
		fanout_id id = must_dispatch(e, tb[i]);
		if (i < 3)
			id1[i] = id;
		else
			id2[i - 3] = id;
	}
	for (int i = 0; i < 3; i++) {
		struct fanout_event *ev = must_wait(s1);
		assert_true(has_id(id1, 3, ev->id));
		for (int j = 0; j < 3; j++)
			seen1[j] += ev->id == id1[j];
		fanout_event_free(ev);
	}
	for (int i = 0; i < 2; i++) {
		struct fanout_event *ev = must_wait(s2);
		assert_true(has_id(id2, 2, ev->id));
		for (int j = 0; j < 2; j++)
			seen2[j] += ev->id == id2[j];
		fanout_event_free(ev);
	}
	for (int j = 0; j < 3; j++)
		assert_int_equal(seen1[j], 1);
	for (int j = 0; j < 2; j++)
		assert_int_equal(seen2[j], 1);
	assert_no_event(s1);
	assert_no_event(s2);
	assert_no_event(fanout_default_sink(e));
	for (int i = 0; i < 5; i++)
		tb_free(tb[i]);
	assert_int_equal(fanout_sink_destroy(s1), 0);
	assert_int_equal(fanout_sink_destroy(s2), 0);
	fanout_destroy(e);
}

static void sink_null_means_default(void **state)
{
	struct fanout_engine *e = eng2();
	struct fanout_sink *s = NULL;
	struct tbatch *tb = tb_new(1);

	assert_int_equal(fanout_sink_create(e, &s), 0);
	tb->b.sink = NULL;
	fanout_id id = must_dispatch(e, tb);
	struct fanout_event *ev = must_wait(fanout_default_sink(e));
	assert_true(ev->id == id);
	fanout_event_free(ev);
	assert_no_event(s);

	/* and naming the default sink explicitly is the same */
	memset(tb->probes, 0, sizeof(tb->probes[0]));
	tb->b.sink = fanout_default_sink(e);
	id = must_dispatch(e, tb);
	ev = must_wait(fanout_default_sink(e));
	assert_true(ev->id == id);
	fanout_event_free(ev);
	assert_no_event(s);
	assert_int_equal(fanout_sink_destroy(s), 0);
	tb_free(tb);
	fanout_destroy(e);
}

static void sink_oldest_first(void **state)
{
	struct fanout_engine *e = eng2();
	struct tbatch *tb[3];
	fanout_id id[3];

	for (int i = 0; i < 3; i++) {
		tb[i] = tb_new(1);
		id[i] = must_dispatch(e, tb[i]);
		wait_finished(e, id[i]);
	}
	for (int i = 0; i < 3; i++) {
		struct fanout_event *ev = NULL;

		assert_int_equal(fanout_poll(fanout_default_sink(e), &ev), 0);
		assert_true(ev->id == id[i]);
		fanout_event_free(ev);
		tb_free(tb[i]);
	}
	fanout_destroy(e);
}

static void sink_fd_readable_iff_events(void **state)
{
	struct fanout_engine *e = eng2();
	struct fanout_sink *s = NULL;
	atomic_int gate = 0;
	struct tbatch *tb = tb_new(1);
	struct fanout_event *ev = NULL;

	assert_int_equal(fanout_sink_create(e, &s), 0);
	int fd = fanout_sink_fd(s);
	assert_true(fd >= 0);
	assert_int_equal(fanout_sink_fd(s), fd);
	assert_true(fanout_sink_fd(fanout_default_sink(e)) >= 0);
	assert_int_not_equal(fanout_sink_fd(fanout_default_sink(e)), fd);
	assert_false(fd_readable(fd, 0)); /* no event ever arrived */

	tb->b.sink = s;
	tb->probes[0].gate = &gate;
	fanout_id id = must_dispatch(e, tb);
	assert_true(wait_ge(&tb->probes[0].runs, 1, WAIT_MS));
	assert_false(fd_readable(fd, 0)); /* running, nothing published */
	atomic_store(&gate, 1);
	assert_true(fd_readable(fd, WAIT_MS));
	assert_int_equal(fanout_poll(s, &ev), 0);
	assert_true(ev->id == id);
	fanout_event_free(ev);
	assert_int_equal(fanout_poll(s, &ev), -EAGAIN);
	assert_false(fd_readable(fd, 0));

	/* two events: readable until the second is taken and a poll is empty */
	fanout_id ids[2];
	for (int i = 0; i < 2; i++) {
		memset(tb->probes, 0, sizeof(tb->probes[0]));
		ids[i] = must_dispatch(e, tb);
		wait_finished(e, ids[i]);
	}
	assert_true(fd_readable(fd, 0));
	assert_int_equal(fanout_poll(s, &ev), 0);
	fanout_event_free(ev);
	assert_true(fd_readable(fd, 0)); /* one still waits */
	assert_int_equal(fanout_poll(s, &ev), 0);
	fanout_event_free(ev);
	assert_int_equal(fanout_poll(s, &ev), -EAGAIN);
	assert_false(fd_readable(fd, 0));

	/* fanout_wait drains it too */
	memset(tb->probes, 0, sizeof(tb->probes[0]));
	id = must_dispatch(e, tb);
	assert_true(fd_readable(fd, WAIT_MS));
	ev = must_wait(s);
	assert_true(ev->id == id);
	fanout_event_free(ev);
	assert_int_equal(fanout_wait(s, &ev, 1), -ETIMEDOUT);
	assert_false(fd_readable(fd, 0));

	assert_int_equal(fanout_sink_destroy(s), 0);
	tb_free(tb);
	fanout_destroy(e);
}

static void sink_destroy_default_einval(void **state)
{
	struct fanout_engine *e = eng2();
	struct tbatch *tb = tb_new(1);

	assert_int_equal(fanout_sink_destroy(fanout_default_sink(e)), -EINVAL);
	/* still works */
	fanout_id id = must_dispatch(e, tb);
	struct fanout_event *ev = must_wait(fanout_default_sink(e));
	assert_true(ev->id == id);
	fanout_event_free(ev);
	tb_free(tb);
	fanout_destroy(e);
}

static void sink_destroy_busy_while_running(void **state)
{
	struct fanout_engine *e = eng2();
	struct fanout_sink *s = NULL;
	atomic_int gate = 0;
	struct tbatch *tb = tb_new(3);

	assert_int_equal(fanout_sink_create(e, &s), 0);
	tb->b.sink = s;
	tb_gate(tb, &gate);
	fanout_id id = must_dispatch(e, tb);
	assert_int_equal(fanout_sink_destroy(s), -EBUSY);
	assert_int_equal(fanout_sink_destroy(s), -EBUSY);
	/* nothing was freed: the sink still works */
	struct fanout_event *ev = NULL;
	assert_int_equal(fanout_poll(s, &ev), -EAGAIN);
	atomic_store(&gate, 1);
	ev = must_wait(s);
	assert_true(ev->id == id);
	check_all_completed(ev, tb);
	fanout_event_free(ev);
	assert_int_equal(fanout_sink_destroy(s), 0);
	assert_no_event(fanout_default_sink(e));
	tb_free(tb);
	fanout_destroy(e);
}

/*
 * Once the consumer holds the event, no accepted delegation will publish to
 * the sink any more: fanout_sink_destroy must not say -EBUSY.  Repeated to
 * catch a publisher that is still "pending" after its event was taken.
 */
static void sink_destroy_right_after_event(void **state)
{
	struct fanout_engine *e = eng2();
	atomic_int count = 0;
	struct fanout_task t = {"c", count_fn, &count};
	int busy = 0;

	for (int i = 0; i < 1000; i++) {
		struct fanout_sink *s = NULL;
		struct fanout_batch b = {.tasks = &t, .ntasks = 1};
		fanout_id id = 0;

		assert_int_equal(fanout_sink_create(e, &s), 0);
		b.sink = s;
		assert_int_equal(fanout_dispatch(e, &b, &id), 0);
		struct fanout_event *ev = NULL;
		if (i & 1) {
			ev = must_wait(s);
		} else {
			/* busy-poll: take the event the moment it is there */
			uint64_t end = mono_ms() + WAIT_MS;
			int prc;
			while ((prc = fanout_poll(s, &ev)) == -EAGAIN)
				assert_true(mono_ms() < end);
			assert_int_equal(prc, 0);
		}
		assert_true(ev->id == id);
		fanout_event_free(ev);
		int rc = fanout_sink_destroy(s);
		if (rc == -EBUSY) {
			busy++;
			/* wait it out so the test can go on */
			uint64_t end = mono_ms() + WAIT_MS;
			while ((rc = fanout_sink_destroy(s)) == -EBUSY &&
			       mono_ms() < end)
				sleep_us(10);
		}
		assert_int_equal(rc, 0);
	}
	if (busy)
		print_error("fanout_sink_destroy said -EBUSY %d/1000 times "
			    "after the sink's only event was taken\n",
			    busy);
	assert_int_equal(busy, 0);
	assert_int_equal(atomic_load(&count), 1000);
	fanout_destroy(e);
}

/*
 * fanout_sink_destroy racing the publish of the sink's last event: once it
 * returns 0 no delegation publishes there any more, so the event was either
 * already queued (and is freed by the destroy) or... nothing else.  An event
 * enqueued after the drain would leak (ASan/LSan reports it at exit) and its
 * publisher would touch a closed eventfd.
 */
static void sink_destroy_races_publish(void **state)
{
	struct fanout_engine *e = eng2();
	atomic_int count = 0;
	struct fanout_task t = {"c", count_fn, &count};

	for (int i = 0; i < 2000; i++) {
		struct fanout_sink *s = NULL;
		struct fanout_batch b = {.tasks = &t, .ntasks = 1};
		uint64_t end = mono_ms() + WAIT_MS;
		int rc;

		assert_int_equal(fanout_sink_create(e, &s), 0);
		b.sink = s;
		assert_int_equal(fanout_dispatch(e, &b, NULL), 0);
		while ((rc = fanout_sink_destroy(s)) == -EBUSY)
			assert_true(mono_ms() < end);
		assert_int_equal(rc, 0);
	}
	assert_int_equal(atomic_load(&count), 2000);
	assert_no_event(fanout_default_sink(e));
	fanout_destroy(e);
}

static void sink_destroy_frees_undrained(void **state)
{
	struct fanout_engine *e = eng2();
	struct fanout_sink *s = NULL;
	struct tbatch *tb[3];

	assert_int_equal(fanout_sink_create(e, &s), 0);
	for (int i = 0; i < 3; i++) {
		tb[i] = tb_new(2);
		tb[i]->b.sink = s;
		tb[i]->b.context = "undrained context";
		tb[i]->probes[0].summary = "a summary that must be freed";
		wait_finished(e, must_dispatch(e, tb[i]));
	}
	/* all three published, none polled: idle, so destroy frees them */
	assert_int_equal(fanout_sink_destroy(s), 0);
	for (int i = 0; i < 3; i++)
		tb_free(tb[i]);
	assert_no_event(fanout_default_sink(e));
	fanout_destroy(e);
}

/* fanout_destroy frees created sinks and their undrained events. */
static void engine_destroy_frees_sinks(void **state)
{
	struct fanout_engine *e = eng2();
	struct fanout_sink *s[3];
	struct tbatch *tb = tb_new(1);

	for (int i = 0; i < 3; i++) {
		assert_int_equal(fanout_sink_create(e, &s[i]), 0);
		tb->b.sink = s[i];
		wait_finished(e, must_dispatch(e, tb));
	}
	tb->b.sink = NULL;
	wait_finished(e, must_dispatch(e, tb));
	fanout_destroy(e);
	tb_free(tb);
}

static void sink_of_other_engine_einval(void **state)
{
	struct fanout_engine *e1 = eng2();
	struct fanout_engine *e2 = eng2();
	struct fanout_sink *s2 = NULL;
	struct tbatch *tb = tb_new(2);
	fanout_id id = 0;

	assert_int_equal(fanout_sink_create(e2, &s2), 0);
	tb->b.sink = s2;
	assert_int_equal(fanout_dispatch(e1, &tb->b, &id), -EINVAL);
	tb->b.sink = fanout_default_sink(e2);
	assert_int_equal(fanout_dispatch(e1, &tb->b, &id), -EINVAL);
	assert_int_equal(stats_of(e1).rejected, 2);
	assert_int_equal(stats_of(e1).dispatched, 0);
	sleep_ms(10);
	assert_int_equal(tb_runs(tb), 0);
	assert_no_event(s2);
	assert_no_event(fanout_default_sink(e2));
	assert_no_event(fanout_default_sink(e1));

	/* fanout_run ignores batch->sink */
	struct fanout_event *ev = NULL;
	tb->b.sink = s2;
	assert_int_equal(fanout_run(e1, &tb->b, &ev), 0);
	check_all_completed(ev, tb);
	fanout_event_free(ev);
	assert_no_event(s2);

	assert_int_equal(fanout_sink_destroy(s2), 0);
	tb_free(tb);
	fanout_destroy(e1);
	fanout_destroy(e2);
}

/* One consumer at a time: the second gets -EBUSY. */
struct waiter {
	struct fanout_sink *s;
	atomic_int entering;
	int rc;
	struct fanout_event *ev;
};

static void *waiter_thread(void *arg)
{
	struct waiter *w = arg;

	atomic_store(&w->entering, 1);
	/* -EBUSY is legitimate if the main thread is inside fanout_poll */
	while ((w->rc = fanout_wait(w->s, &w->ev, -1)) == -EBUSY)
		sleep_us(100);
	return NULL;
}

static void sink_concurrent_pollers_ebusy(void **state)
{
	struct fanout_engine *e = eng2();
	struct fanout_sink *s = NULL;
	struct waiter w = {0};
	struct fanout_event *ev = NULL;
	bool saw_busy = false;
	int rc = 0;

	assert_int_equal(fanout_sink_create(e, &s), 0);
	w.s = s;
	pthread_t t = spawn(waiter_thread, &w);
	assert_true(wait_flag(&w.entering, WAIT_MS));
	uint64_t end = mono_ms() + WAIT_MS;
	while (mono_ms() < end) {
		rc = fanout_poll(s, &ev);
		if (rc == -EBUSY) {
			saw_busy = true;
			break;
		}
		if (rc != -EAGAIN) /* nothing was published: only these two */
			break;
		sleep_us(500);
	}
	int rc_wait = saw_busy ? fanout_wait(s, &ev, 10) : -EBUSY;

	/* release the waiter whatever happened */
	struct tbatch *tb = tb_new(1);
	tb->b.sink = s;
	fanout_id id = must_dispatch(e, tb);
	join(t);

	assert_true(saw_busy);
	assert_int_equal(rc, -EBUSY);
	assert_int_equal(rc_wait, -EBUSY);
	assert_int_equal(w.rc, 0);
	assert_non_null(w.ev);
	assert_true(w.ev->id == id);
	fanout_event_free(w.ev);
	/* the consumer is gone: polling is fine again */
	assert_int_equal(fanout_poll(s, &ev), -EAGAIN);
	assert_int_equal(fanout_sink_destroy(s), 0);
	tb_free(tb);
	fanout_destroy(e);
}

/* Two consumers on two sinks at once are independent. */
struct drainer {
	struct fanout_sink *s;
	int want;
	int got;
};

static void *drainer_thread(void *arg)
{
	struct drainer *d = arg;

	while (d->got < d->want) {
		struct fanout_event *ev = NULL;
		int rc = fanout_wait(d->s, &ev, WAIT_MS);

		CHECK(rc == 0);
		if (rc)
			break;
		d->got++;
		fanout_event_free(ev);
	}
	return NULL;
}

static void sink_consumers_on_two_sinks(void **state)
{
	enum { N = 40 };
	struct fanout_engine *e = eng2();
	struct fanout_sink *s[2];
	struct drainer d[2];
	pthread_t t[2];
	atomic_int count = 0;
	struct fanout_task task = {"c", count_fn, &count};

	for (int i = 0; i < 2; i++) {
		assert_int_equal(fanout_sink_create(e, &s[i]), 0);
		d[i] = (struct drainer){s[i], N, 0};
		t[i] = spawn(drainer_thread, &d[i]);
	}
	for (int k = 0; k < 2 * N; k++) {
		struct fanout_batch b = {
			.tasks = &task, .ntasks = 1, .sink = s[k % 2]};
		int rc;

		while ((rc = fanout_dispatch(e, &b, NULL)) == -EBUSY)
			sleep_us(100);
		assert_int_equal(rc, 0);
	}
	for (int i = 0; i < 2; i++)
		join(t[i]);
	for (int i = 0; i < 2; i++) {
		assert_int_equal(d[i].got, N);
		assert_no_event(s[i]);
		assert_int_equal(fanout_sink_destroy(s[i]), 0);
	}
	assert_int_equal(atomic_load(&count), 2 * N);
	fanout_destroy(e);
}

/* ------------------------------------------- a half-linked event in a sink */

/*
 * Count the poll() calls of one thread.  liburcu's "blocking" wfcqueue
 * dequeue sleeps in poll(NULL, 0, 10) while a producer sits between its
 * tail exchange and its next-pointer store; the sink must not (it waits
 * with pauses and sched_yield), or every such moment costs its consumer
 * 10 ms.  This definition takes the place of libc's for the library's
 * calls too (static link); it forwards to the next one.  Under
 * ThreadSanitizer the runtime's own poll() comes first and this one sees
 * nothing: the plain build is the one that checks (it fails with the old
 * dequeue: 5 calls).
 */
static pthread_t poll_watched;
static atomic_bool poll_watching;
static atomic_int polls_seen;

int poll(struct pollfd *fds, nfds_t nfds, int timeout)
{
	static int (*next)(struct pollfd *, nfds_t, int);

	if (!next)
		next = (int (*)(struct pollfd *, nfds_t, int))dlsym(RTLD_NEXT,
								    "poll");
	if (atomic_load(&poll_watching) &&
	    pthread_equal(pthread_self(), poll_watched))
		atomic_fetch_add(&polls_seen, 1);
	return next(fds, nfds, timeout);
}

/* The worker publishes our event in two steps 50 ms apart, as a producer
 * preempted between them would.  The consumer polls all along, so it meets
 * the half-linked event: it gets it without a single poll() (the old
 * dequeue made about 5, one per 10 ms). */
static void wait_does_not_sleep_on_a_half_linked_event(void **state)
{
	struct fanout_engine *e = NEW_ENGINE(.workers = 1);
	struct tbatch *tb = tb_new(1);
	struct fanout_event *ev = NULL;
	fanout_id id;

	(void)state;
	fanout_test_publish_gap(50000);
	poll_watched = pthread_self();
	atomic_store(&polls_seen, 0);
	atomic_store(&poll_watching, true);
	id = must_dispatch(e, tb);
	uint64_t end = mono_ms() + WAIT_MS;
	int rc;

	while ((rc = fanout_poll(fanout_default_sink(e), &ev)) == -EAGAIN &&
	       mono_ms() < end)
		;
	assert_int_equal(rc, 0);
	atomic_store(&poll_watching, false);
	fanout_test_publish_gap(0);
	assert_true(ev->id == id);
	check_all_completed(ev, tb);
	assert_int_equal(atomic_load(&polls_seen), 0);
	fanout_event_free(ev);
	tb_free(tb);
	fanout_destroy(e);
}

/* The same for fanout_sink_destroy(): its count of the queued events meets
 * the half-linked one (the loop below calls it until the publisher is in
 * its 50 ms gap, -EBUSY before).  It waits that out without a poll() (the
 * "blocking" iterator it used slept in poll() 10 ms at a time) and then
 * frees the sink with the event in it. */
static void sink_destroy_does_not_sleep_on_a_half_linked_event(void **state)
{
	struct fanout_engine *e = NEW_ENGINE(.workers = 1);
	struct tbatch *tb = tb_new(1);
	struct fanout_sink *s = NULL;
	uint64_t end;
	int rc;

	(void)state;
	assert_int_equal(fanout_sink_create(e, &s), 0);
	tb->b.sink = s;
	fanout_test_publish_gap(50000);
	poll_watched = pthread_self();
	atomic_store(&polls_seen, 0);
	atomic_store(&poll_watching, true);
	must_dispatch(e, tb);
	end = mono_ms() + WAIT_MS;
	while ((rc = fanout_sink_destroy(s)) == -EBUSY && mono_ms() < end)
		;
	atomic_store(&poll_watching, false);
	assert_int_equal(rc, 0);
	assert_int_equal(atomic_load(&polls_seen), 0);
	fanout_test_publish_gap(0);
	/* the event went with the sink: the child ran, once (and, taking no
	 * event, we wait for its probe to be through with tb before freeing) */
	assert_true(wait_ge(&tb->probes[0].finished, 1, WAIT_MS));
	assert_int_equal(tb_runs(tb), 1);
	assert_no_event(fanout_default_sink(e));
	tb_free(tb);
	fanout_destroy(e);
}

/* ------------------------------------------------- FANOUT_WAIT_HELPS */

struct helpfix {
	struct fanout_engine *e;
	struct fanout_sink *s2;
	atomic_int gate;
	struct tbatch *blocker; /* 1 gated child: occupies the only worker */
	struct tbatch *queued;	/* 2 children on s2, queued behind it */
	fanout_id qid;
};

static void helpfix_start(struct helpfix *f, unsigned flags)
{
	f->e = NEW_ENGINE(.workers = 1, .flags = FANOUT_NO_PIN | flags);
	atomic_init(&f->gate, 0);
	assert_int_equal(fanout_sink_create(f->e, &f->s2), 0);
	f->blocker = tb_new(1);
	tb_gate(f->blocker, &f->gate);
	must_dispatch(f->e, f->blocker);
	/* the worker holds the blocker's child, so it cannot take more */
	assert_true(wait_ge(&f->blocker->probes[0].runs, 1, WAIT_MS));
	f->queued = tb_new(2);
	f->queued->b.sink = f->s2;
	f->qid = must_dispatch(f->e, f->queued);
}

static void helpfix_finish(struct helpfix *f)
{
	struct fanout_event *ev;

	atomic_store(&f->gate, 1);
	ev = must_wait(fanout_default_sink(f->e));
	check_all_completed(ev, f->blocker);
	assert_false(
		pthread_equal(f->blocker->probes[0].thread, pthread_self()));
	fanout_event_free(ev);
	assert_int_equal(fanout_sink_destroy(f->s2), 0);
	tb_free(f->blocker);
	tb_free(f->queued);
	fanout_destroy(f->e);
}

/* The only worker is stuck: a helping wait runs the queued children on the
 * waiting thread and gets their event; without the flag it would time
 * out (wait_pure_does_not_help). */
static void wait_helps_runs_queued_children(void **state)
{
	struct helpfix f;
	struct fanout_event *ev = NULL;

	helpfix_start(&f, FANOUT_WAIT_HELPS);
	uint64_t helped0 = stats_of(f.e).children_run;
	assert_int_equal(fanout_wait(f.s2, &ev, WAIT_MS), 0);
	assert_true(ev->id == f.qid);
	check_all_completed(ev, f.queued);
	for (unsigned i = 0; i < 2; i++)
		assert_true(pthread_equal(f.queued->probes[i].thread,
					  pthread_self()));
	assert_int_equal(stats_of(f.e).children_run, helped0 + 2);
	fanout_event_free(ev);
	helpfix_finish(&f);
}

static void wait_pure_does_not_help(void **state)
{
	struct helpfix f;
	struct fanout_event *ev = NULL;

	helpfix_start(&f, 0);
	assert_int_equal(fanout_wait(f.s2, &ev, 30), -ETIMEDOUT);
	assert_int_equal(tb_runs(f.queued), 0);
	atomic_store(&f.gate, 1);
	ev = must_wait(f.s2);
	assert_true(ev->id == f.qid);
	check_all_completed(ev, f.queued);
	assert_false(pthread_equal(f.queued->probes[0].thread, pthread_self()));
	fanout_event_free(ev);
	helpfix_finish(&f);
}

/* A helping wait that took a long delegation of someone else's leaves it
 * as soon as its own event is there: it runs chunks of the other one only
 * while its sink is empty, and puts the rest back for the workers. */
#define LONG_N 256

struct long_child {
	atomic_int ran;
	atomic_int stop;
	atomic_int *release; /* opened by the 5th child to run */
};

static int long_child_fn(struct fanout_child *c, void *arg)
{
	struct long_child *lc = arg;

	(void)c;
	if (atomic_fetch_add(&lc->ran, 1) == 4)
		atomic_store(lc->release, 1);
	/* each child holds its runner 1 ms, until told to stop */
	if (!atomic_load(&lc->stop))
		sleep_us(1000);
	return 0;
}

static void wait_helping_leaves_for_its_event(void **state)
{
	struct helpfix f;
	struct fanout_event *ev = NULL;
	struct long_child lc = {.release = NULL};
	struct fanout_task *tasks = calloc(LONG_N, sizeof(*tasks));
	struct fanout_batch lb = {.tasks = tasks, .ntasks = LONG_N};
	fanout_id lid;
	int ran_at_return;

	(void)state;
	assert_non_null(tasks);
	atomic_init(&lc.ran, 0);
	atomic_init(&lc.stop, 0);
	/* the only worker holds the gated blocker; the long delegation is
	 * queued first, our own 2 children (on s2) behind it */
	f.e = NEW_ENGINE(.workers = 1,
			 .flags = FANOUT_NO_PIN | FANOUT_WAIT_HELPS);
	atomic_init(&f.gate, 0);
	assert_int_equal(fanout_sink_create(f.e, &f.s2), 0);
	f.blocker = tb_new(1);
	tb_gate(f.blocker, &f.gate);
	must_dispatch(f.e, f.blocker);
	assert_true(wait_ge(&f.blocker->probes[0].runs, 1, WAIT_MS));
	lc.release = &f.gate;
	for (unsigned i = 0; i < LONG_N; i++)
		tasks[i] = (struct fanout_task){"long", long_child_fn, &lc};
	assert_int_equal(fanout_dispatch(f.e, &lb, &lid), 0);
	f.queued = tb_new(2);
	f.queued->b.sink = f.s2;
	f.qid = must_dispatch(f.e, f.queued);

	/* This thread helps with the long one (first in the ring); its 5th
	 * child frees the worker, which runs ours meanwhile. */
	assert_int_equal(fanout_wait(f.s2, &ev, WAIT_MS), 0);
	ran_at_return = atomic_load(&lc.ran);
	atomic_store(&lc.stop, 1);
	assert_true(ev->id == f.qid);
	check_all_completed(ev, f.queued);
	assert_false(pthread_equal(f.queued->probes[0].thread, pthread_self()));
	fanout_event_free(ev);
	/* it came back within a chunk of the event, not after the whole
	 * delegation (256 ms of children) */
	assert_true(ran_at_return >= 5);
	assert_true(ran_at_return < LONG_N);

	/* the long one still finishes, every child once */
	for (int k = 0; k < 2; k++) {
		ev = must_wait(fanout_default_sink(f.e));
		if (ev->id == lid) {
			assert_int_equal(ev->ncompleted, LONG_N);
			assert_int_equal(atomic_load(&lc.ran), LONG_N);
		} else {
			check_all_completed(ev, f.blocker);
		}
		fanout_event_free(ev);
	}
	assert_int_equal(fanout_sink_destroy(f.s2), 0);
	tb_free(f.blocker);
	tb_free(f.queued);
	free(tasks);
	fanout_destroy(f.e);
}

/* Inside a child (here one of fanout_run's, on this thread) a wait does not
 * help: unrelated children must not pile up on a child's stack. */
struct nested_wait {
	struct fanout_sink *s;
	int rc;
};

static int nested_wait_fn(struct fanout_child *c, void *arg)
{
	struct nested_wait *nw = arg;
	struct fanout_event *ev = NULL;

	(void)c;
	nw->rc = fanout_wait(nw->s, &ev, 30);
	if (nw->rc == 0)
		fanout_event_free(ev);
	return 0;
}

static void wait_in_child_does_not_help(void **state)
{
	struct helpfix f;
	struct nested_wait nw = {.rc = 1};
	struct fanout_task t = {.fn = nested_wait_fn, .arg = &nw};
	struct fanout_batch b = {.tasks = &t, .ntasks = 1};
	struct fanout_event *ev = NULL;

	helpfix_start(&f, FANOUT_WAIT_HELPS);
	nw.s = f.s2;
	assert_int_equal(fanout_run(f.e, &b, &ev), 0);
	assert_int_equal(ev->status, FANOUT_COMPLETED);
	fanout_event_free(ev);
	assert_int_equal(nw.rc, -ETIMEDOUT);
	assert_int_equal(tb_runs(f.queued), 0);
	/* at the top level the same thread does help */
	ev = must_wait(f.s2);
	assert_true(ev->id == f.qid);
	assert_true(pthread_equal(f.queued->probes[1].thread, pthread_self()));
	fanout_event_free(ev);
	helpfix_finish(&f);
}

/*
 * fanout.h, "Children waiting for events": a child that waits for the event
 * of a later batch holds the only worker of a one-worker engine, and its
 * own wait never runs children, so the event comes only if a top-level
 * thread helps.  Without help the wait times out (with timeout < 0 it would
 * never return); with a helping top-level fanout_wait the event comes, run
 * on the helper's thread.
 */
struct later_wait {
	struct fanout_sink *s2;
	struct tbatch *later;
	int timeout_ms;
	atomic_int started;
	int rc;
	int later_runs_at_return;
};

static int later_wait_fn(struct fanout_child *c, void *arg)
{
	struct later_wait *lw = arg;
	struct fanout_event *ev = NULL;

	(void)c;
	atomic_store(&lw->started, 1);
	lw->rc = fanout_wait(lw->s2, &ev, lw->timeout_ms);
	if (lw->rc == 0)
		fanout_event_free(ev);
	lw->later_runs_at_return = tb_runs(lw->later);
	return 0;
}

static void later_wait_case(unsigned flags, int timeout_ms)
{
	struct fanout_engine *e =
		NEW_ENGINE(.workers = 1, .flags = FANOUT_NO_PIN | flags);
	struct later_wait lw = {.timeout_ms = timeout_ms, .rc = 1};
	struct fanout_task t = {"waits for the later batch", later_wait_fn,
				&lw};
	struct fanout_batch b = {.tasks = &t, .ntasks = 1};
	struct fanout_event *ev;
	fanout_id id1 = 0, id2;

	assert_int_equal(fanout_sink_create(e, &lw.s2), 0);
	lw.later = tb_new(1);
	lw.later->b.sink = lw.s2;
	assert_int_equal(fanout_dispatch(e, &b, &id1), 0);
	assert_true(wait_flag(&lw.started, WAIT_MS)); /* it holds the worker */
	id2 = must_dispatch(e, lw.later);
	/* helping or not, per the engine's flag */
	ev = must_wait(fanout_default_sink(e));
	assert_true(ev->id == id1);
	assert_int_equal(ev->status, FANOUT_COMPLETED);
	fanout_event_free(ev);
	if (flags & FANOUT_WAIT_HELPS) {
		assert_int_equal(lw.rc, 0);
		assert_int_equal(lw.later_runs_at_return, 1);
		assert_true(pthread_equal(lw.later->probes[0].thread,
					  pthread_self()));
	} else {
		assert_int_equal(lw.rc, -ETIMEDOUT);
		assert_int_equal(lw.later_runs_at_return, 0);
		/* once the child let go of the worker, the later batch runs */
		ev = must_wait(lw.s2);
		assert_true(ev->id == id2);
		check_all_completed(ev, lw.later);
		fanout_event_free(ev);
	}
	assert_int_equal(fanout_sink_destroy(lw.s2), 0);
	tb_free(lw.later);
	fanout_destroy(e);
}

static void child_wait_needs_another_runner(void **state)
{
	later_wait_case(0, 100);		     /* nobody helps: timeout */
	later_wait_case(FANOUT_WAIT_HELPS, WAIT_MS); /* this thread helps */
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		TC(sink_bad_args),
		TC(sink_poll_empty),
		TC(sink_wait_timeout),
		TC(sink_wait_zero_returns_waiting_event),
		TC(sink_wait_receives_later_event),
		TC(sink_wait_wakes_on_every_publish),
		TC(sink_routing_two_sinks),
		TC(sink_null_means_default),
		TC(sink_oldest_first),
		TC(sink_fd_readable_iff_events),
		TC(sink_destroy_default_einval),
		TC(sink_destroy_busy_while_running),
		TC(sink_destroy_right_after_event),
		TC(sink_destroy_races_publish),
		TC(sink_destroy_frees_undrained),
		TC(engine_destroy_frees_sinks),
		TC(sink_of_other_engine_einval),
		TC(sink_concurrent_pollers_ebusy),
		TC(sink_consumers_on_two_sinks),
		TC(wait_helps_runs_queued_children),
		TC(wait_pure_does_not_help),
		TC(wait_helping_leaves_for_its_event),
		TC(wait_does_not_sleep_on_a_half_linked_event),
		TC(sink_destroy_does_not_sleep_on_a_half_linked_event),
		TC(wait_in_child_does_not_help),
		TC(child_wait_needs_another_runner),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
