/* SPDX-License-Identifier: MIT */
/*
 * tests/common.h - helpers shared by the cmocka suites (tests/test_*.c).
 *
 * Every suite is one program that includes this header once.  Rules the
 * helpers enforce:
 *   - cmocka's assert_*() may only run on the test's own thread (they
 *     longjmp).  Children and helper threads use CHECK(), which counts the
 *     failure; the per-test teardown (TC()) turns any count into a failed
 *     test.
 *   - No timing assertions.  WAIT_MS is only a bound after which a wait that
 *     should have succeeded is declared a failure (a hang otherwise).
 *   - Ordering between the test and its children is done with flags
 *     (gates, counters), never with sleeps.
 */
#ifndef FANOUT_TESTS_COMMON_H
#define FANOUT_TESTS_COMMON_H

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <dirent.h>
#include <cmocka.h>

#include "fanout.h"

/* Every engine flag fanout.h documents.  The unknown-flag tests try each
 * bit outside this set, so a flag added to the library but not here
 * fails them (and a bit the library stops refusing fails them too). */
#define KNOWN_ENGINE_FLAGS                                                     \
	(FANOUT_NO_PIN | FANOUT_WAIT_HELPS | FANOUT_NO_CHILD_CLOCK |           \
	 FANOUT_RUNNERS_ON_DEMAND)

/* Failure bound for every wait that must succeed (not a timing assertion). */
#define WAIT_MS 10000
/* Bound for a child blocked on a gate, so a failed test cannot hang. */
#define GATE_MS 30000

/* ------------------------------------------------- off-thread assertions */

static atomic_int tc_failures;

#define CHECK(cond)                                                            \
	do {                                                                   \
		if (!(cond)) {                                                 \
			atomic_fetch_add(&tc_failures, 1);                     \
			fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, \
				__LINE__, #cond);                              \
		}                                                              \
	} while (0)

static inline int tc_teardown(void **state)
{
	(void)state;
	int n = atomic_exchange(&tc_failures, 0);

	if (n) {
		fprintf(stderr, "%d CHECK(s) failed in children/threads\n", n);
		return -1;
	}
	return 0;
}

/* A test case whose teardown fails it if any CHECK() failed. */
#define TC(f) cmocka_unit_test_teardown(f, tc_teardown)

/* ------------------------------------------------------------------ time */

static inline uint64_t mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static inline void sleep_us(unsigned us)
{
	struct timespec ts = {us / 1000000u, (long)(us % 1000000u) * 1000};

	while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
		;
}

static inline void sleep_ms(unsigned ms)
{
	sleep_us(ms * 1000u);
}

/* Wait until *p >= v; false after @ms. */
static inline bool wait_ge(atomic_int *p, int v, int ms)
{
	uint64_t end = mono_ms() + (uint64_t)ms;

	while (atomic_load(p) < v) {
		if (mono_ms() > end)
			return false;
		sleep_us(100);
	}
	return true;
}

/* Wait until *p != 0 (a gate opened); false after @ms. */
static inline bool wait_flag(atomic_int *p, int ms)
{
	return wait_ge(p, 1, ms);
}

/* ----------------------------------------------------------------- probe */

/*
 * struct probe - one child's behaviour and what it observed.
 *
 * Behaviour fields are set before dispatch.  Atomic fields may be read
 * while the child runs; the plain observation fields only after the event
 * was received (the event's publication is a release, its receipt an
 * acquire: TSan checks exactly that).
 */
struct probe {
	/* behaviour */
	int ret;		/* returned (unless until_interrupted) */
	const char *summary;	/* fanout_set_summary() if non-NULL */
	const char *error;	/* fanout_set_error() if non-NULL */
	double cost;		/* fanout_add_cost() if > 0 */
	atomic_int *gate;	/* wait until *gate != 0 first */
	bool until_interrupted; /* loop until fanout_interrupted(), then
				    return -ECANCELED */
	unsigned sleep_us;	/* sleep this long before returning */
	atomic_int *cur, *max;	/* concurrency meter (may be NULL) */
	/* observations */
	atomic_int runs;     /* times the child started */
	atomic_int finished; /* times the child returned */
	unsigned index;
	unsigned depth;
	fanout_id id;
	pthread_t thread;
	bool interrupted_seen; /* fanout_interrupted() just before return */
	int plain;	       /* a plain write, read after the event */
};

static inline void meter_enter(atomic_int *cur, atomic_int *max)
{
	int now = atomic_fetch_add(cur, 1) + 1;
	int m = atomic_load(max);

	while (now > m && !atomic_compare_exchange_weak(max, &m, now))
		;
}

static inline int probe_fn(struct fanout_child *c, void *arg)
{
	struct probe *p = arg;
	int ret = p->ret;

	atomic_fetch_add(&p->runs, 1);
	if (p->cur)
		meter_enter(p->cur, p->max);
	p->index = fanout_child_index(c);
	p->depth = fanout_child_depth(c);
	p->id = fanout_child_id(c);
	p->thread = pthread_self();
	p->plain = 1234;
	CHECK(fanout_current_child() == c);
	if (p->gate)
		CHECK(wait_flag(p->gate, GATE_MS));
	if (p->until_interrupted) {
		uint64_t end = mono_ms() + GATE_MS;

		while (!fanout_interrupted(c) && mono_ms() < end)
			sleep_us(50);
		CHECK(fanout_interrupted(c));
		ret = -ECANCELED;
	}
	if (p->sleep_us)
		sleep_us(p->sleep_us);
	if (p->summary)
		CHECK(fanout_set_summary(c, p->summary, strlen(p->summary)) ==
		      0);
	if (p->error)
		CHECK(fanout_set_error(c, p->error) == 0);
	if (p->cost > 0)
		CHECK(fanout_add_cost(c, p->cost) == 0);
	p->interrupted_seen = fanout_interrupted(c);
	if (p->cur)
		atomic_fetch_sub(p->cur, 1);
	atomic_fetch_add(&p->finished, 1);
	return ret;
}

/* A child that only counts how often it ran: arg is an atomic_int. */
static inline int count_fn(struct fanout_child *c, void *arg)
{
	(void)c;
	atomic_fetch_add((atomic_int *)arg, 1);
	return 0;
}

/* ----------------------------------------------------------------- batch */

#define GOAL_LEN 32

/* A batch of n probe children with goals "task-<i>". */
struct tbatch {
	struct fanout_batch b;
	struct fanout_task *tasks;
	struct probe *probes;
	char (*goals)[GOAL_LEN];
	unsigned n;
};

static inline struct tbatch *tb_new(unsigned n)
{
	struct tbatch *tb = calloc(1, sizeof(*tb));

	assert_non_null(tb);
	tb->n = n;
	tb->tasks = calloc(n ? n : 1, sizeof(*tb->tasks));
	tb->probes = calloc(n ? n : 1, sizeof(*tb->probes));
	tb->goals = calloc(n ? n : 1, sizeof(*tb->goals));
	assert_non_null(tb->tasks);
	assert_non_null(tb->probes);
	assert_non_null(tb->goals);
	for (unsigned i = 0; i < n; i++) {
		snprintf(tb->goals[i], GOAL_LEN, "task-%u", i);
		tb->tasks[i].goal = tb->goals[i];
		tb->tasks[i].fn = probe_fn;
		tb->tasks[i].arg = &tb->probes[i];
	}
	tb->b.tasks = tb->tasks;
	tb->b.ntasks = n;
	return tb;
}

static inline void tb_free(struct tbatch *tb)
{
	if (!tb)
		return;
	free(tb->tasks);
	free(tb->probes);
	free(tb->goals);
	free(tb);
}

/* Set every probe's gate. */
static inline void tb_gate(struct tbatch *tb, atomic_int *gate)
{
	for (unsigned i = 0; i < tb->n; i++)
		tb->probes[i].gate = gate;
}

/* Sum of runs over all probes. */
static inline int tb_runs(struct tbatch *tb)
{
	int s = 0;

	for (unsigned i = 0; i < tb->n; i++)
		s += atomic_load(&tb->probes[i].runs);
	return s;
}

/*
 * Check the shape of an event for a batch where every child ran to
 * completion: n results, index == position, goals copied, each child ran
 * exactly once, status COMPLETED.
 */
static inline void check_all_completed(const struct fanout_event *ev,
				       struct tbatch *tb)
{
	assert_non_null(ev);
	assert_int_equal(ev->nresults, tb->n);
	assert_non_null(ev->results);
	for (unsigned i = 0; i < tb->n; i++) {
		const struct fanout_result *r = &ev->results[i];

		assert_int_equal(r->index, i);
		assert_int_equal(r->status, FANOUT_COMPLETED);
		assert_int_equal(r->code, 0);
		assert_null(r->error);
		assert_non_null(r->goal);
		assert_string_equal(r->goal, tb->goals[i]);
		assert_int_equal(atomic_load(&tb->probes[i].runs), 1);
		assert_int_equal(tb->probes[i].index, i);
		assert_int_equal(tb->probes[i].id, ev->id);
	}
	assert_int_equal(ev->status, FANOUT_COMPLETED);
	assert_int_equal(ev->ncompleted, tb->n);
	assert_int_equal(ev->nerror, 0);
	assert_int_equal(ev->ninterrupted, 0);
	assert_null(ev->error);
	assert_false(ev->cancelled);
}

/* ---------------------------------------------------------------- engine */

static inline struct fanout_engine *engine_with(const struct fanout_config *c)
{
	struct fanout_engine *e = NULL;

	assert_int_equal(fanout_create(c, &e), 0);
	assert_non_null(e);
	return e;
}

/* NEW_ENGINE(.workers = 1, .flags = FANOUT_NO_PIN, ...) */
#define NEW_ENGINE(...) engine_with(&(struct fanout_config){__VA_ARGS__})

static inline struct fanout_stats stats_of(struct fanout_engine *e)
{
	struct fanout_stats st;

	memset(&st, 0, sizeof(st));
	assert_int_equal(fanout_stats(e, &st), 0);
	return st;
}

/* ---------------------------------------------------------------- events */

/* Take the next event from @s; fail the test if none comes within WAIT_MS. */
static inline struct fanout_event *must_wait(struct fanout_sink *s)
{
	struct fanout_event *ev = NULL;

	assert_int_equal(fanout_wait(s, &ev, WAIT_MS), 0);
	assert_non_null(ev);
	return ev;
}

/*
 * Assert that no event is (or arrives shortly) in @s.  The short sleep only
 * gives a wrong extra event the chance to show up; a correct library passes
 * regardless of how long it is.
 */
static inline void assert_no_event(struct fanout_sink *s)
{
	struct fanout_event *ev = NULL;
	int rc;

	sleep_ms(20);
	rc = fanout_poll(s, &ev);
	if (rc == 0)
		fanout_event_free(ev);
	assert_int_equal(rc, -EAGAIN);
}

/* Wait until the record of @id is no longer RUNNING (its event published). */
static inline void wait_finished(struct fanout_engine *e, fanout_id id)
{
	uint64_t end = mono_ms() + WAIT_MS;
	struct fanout_info info;

	for (;;) {
		assert_int_equal(fanout_lookup(e, id, &info), 0);
		if (info.status != FANOUT_RUNNING)
			return;
		assert_true(mono_ms() < end);
		sleep_us(200);
	}
}

/* Dispatch @tb to @e and return its id (asserting success). */
static inline fanout_id must_dispatch(struct fanout_engine *e,
				      struct tbatch *tb)
{
	fanout_id id = 0;

	assert_int_equal(fanout_dispatch(e, &tb->b, &id), 0);
	assert_true(id != 0);
	return id;
}

/* --------------------------------------------------------------- threads */

/* One dispatch of one counting child, waited for: the engine works.
 * Returns the delegation's id. */
static inline fanout_id must_run_one(struct fanout_engine *e)
{
	atomic_int count = 0;
	struct fanout_task t = {"one", count_fn, &count};
	struct fanout_batch b = {.tasks = &t, .ntasks = 1};
	struct fanout_event *ev;
	fanout_id id = 0;

	assert_int_equal(fanout_dispatch(e, &b, &id), 0);
	ev = must_wait(fanout_default_sink(e));
	assert_true(ev->id == id);
	assert_int_equal(ev->status, FANOUT_COMPLETED);
	fanout_event_free(ev);
	assert_int_equal(atomic_load(&count), 1);
	return id;
}

static inline pthread_t spawn(void *(*fn)(void *), void *arg)
{
	pthread_t t;

	assert_int_equal(pthread_create(&t, NULL, fn, arg), 0);
	return t;
}

static inline void join(pthread_t t)
{
	assert_int_equal(pthread_join(t, NULL), 0);
}

/* CLOCK_REALTIME @ms from now (for timed waits on condvars, semaphores). */
static inline struct timespec realtime_in_ms(unsigned ms)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += ms / 1000;
	ts.tv_nsec += (long)(ms % 1000) * 1000000L;
	if (ts.tv_nsec >= 1000000000L) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000L;
	}
	return ts;
}

/* The ids of this process's threads, up to @cap, in /proc's order. */
static inline size_t list_tids(pid_t *tids, size_t cap)
{
	DIR *d = opendir("/proc/self/task");
	struct dirent *de;
	size_t n = 0;

	assert_non_null(d);
	while ((de = readdir(d)))
		if (de->d_name[0] != '.' && n < cap)
			tids[n++] = (pid_t)atoi(de->d_name);
	closedir(d);
	return n;
}

/* Call @fn with the id and name of every thread of this process, until it
 * returns true (threads that exit meanwhile are skipped).  A thread that
 * exits while /proc/self/task is read ends the kernel's walk early, and
 * the read resumes by position, one past a live thread: a thread that
 * pthread_join() has returned for is still being unlinked.  So the
 * listing is read until two readings 1 ms apart agree (bounded), and only
 * then are the names read. */
static inline void
each_thread(bool (*fn)(pid_t tid, const char *name, void *arg), void *arg)
{
	enum { CAP = 4096 };
	pid_t *a = calloc(CAP, sizeof(*a)), *b = calloc(CAP, sizeof(*b));
	size_t na, nb, i;

	assert_non_null(a);
	assert_non_null(b);
	na = list_tids(a, CAP);
	for (i = 0; i < 1000; i++) {
		sleep_ms(1); /* longer than a dying thread stays in the walk */
		nb = list_tids(b, CAP);
		if (nb == na && !memcmp(a, b, na * sizeof(*a)))
			break;
		memcpy(a, b, nb * sizeof(*a));
		na = nb;
	}
	for (i = 0; i < na; i++) {
		char path[64], comm[32] = "";
		bool stop = false;
		FILE *f;

		snprintf(path, sizeof(path), "/proc/self/task/%d/comm",
			 (int)a[i]);
		f = fopen(path, "r");
		if (!f) /* the thread exited meanwhile */
			continue;
		if (fgets(comm, sizeof(comm), f)) {
			comm[strcspn(comm, "\n")] = '\0';
			stop = fn(a[i], comm, arg);
		}
		fclose(f);
		if (stop)
			break;
	}
	free(a);
	free(b);
}

/* Does @hay contain @needle?  (assert helper with a readable message) */
#define assert_contains(hay, needle)                                           \
	do {                                                                   \
		const char *h_ = (hay), *n_ = (needle);                        \
		if (!h_ || !strstr(h_, n_)) {                                  \
			print_error("expected \"%s\" in:\n%s\n", n_,           \
				    h_ ? h_ : "(null)");                       \
			fail();                                                \
		}                                                              \
	} while (0)

#endif /* FANOUT_TESTS_COMMON_H */
