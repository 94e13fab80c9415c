/* SPDX-License-Identifier: MIT */
/*
 * test_tsan_canary.c - proves that tests/tsan.supp cannot hide OUR races.
 *
 * Under ThreadSanitizer (the tsan build) this suite re-executes itself in
 * two modes:
 *   racy  - a child writes a plain variable and the main thread reads it
 *           after spinning on a RELAXED flag: no happens-before, a real
 *           race whose write side runs inside library frames (run_child,
 *           run_token, the worker loop).  TSan must report it (exit 66).
 *   clean - the same write, read after receiving the event from the sink:
 *           the library's publish/poll is a release/acquire pair (plus our
 *           annotations across liburcu's wfcqueue), so TSan must stay quiet.
 * Without TSan the suite is skipped: plain and ASan builds cannot see races.
 */
#include "common.h"

#include <sys/wait.h>

#if defined(__SANITIZE_THREAD__)
#define HAVE_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define HAVE_TSAN 1
#endif
#endif

static int shared_plain;
static atomic_int flag;
static const char *self_path;

static int writer(struct fanout_child *c, void *arg)
{
	(void)c;
	(void)arg;
	shared_plain = 42;
	atomic_store_explicit(&flag, 1, memory_order_relaxed);
	return 0;
}

static int run_mode(const char *mode)
{
	struct fanout_engine *e;
	struct fanout_event *ev;
	struct fanout_task t = {"write", writer, NULL};
	struct fanout_batch b = {.tasks = &t, .ntasks = 1};
	struct fanout_config cfg = {.workers = 1, .flags = FANOUT_NO_PIN};
	int v = 0;

	if (fanout_create(&cfg, &e) || fanout_dispatch(e, &b, NULL))
		return 2;
	if (!strcmp(mode, "racy")) {
		while (!atomic_load_explicit(&flag, memory_order_relaxed))
			sched_yield();
		v = shared_plain; /* the seeded race */
	}
	if (fanout_wait(fanout_default_sink(e), &ev, WAIT_MS))
		return 3;
	if (!strcmp(mode, "clean"))
		v = shared_plain; /* ordered by the event's release/acquire */
	fanout_event_free(ev);
	fanout_destroy(e);
	return v == 42 ? 0 : 4;
}

static int spawn_mode(const char *mode)
{
	pid_t pid = fork();
	int st;

	if (pid == 0) {
		/* The expected report would only confuse the log. */
		if (!strcmp(mode, "racy") && !freopen("/dev/null", "w", stderr))
			_exit(126);
		execl(self_path, self_path, mode, (char *)NULL);
		_exit(127);
	}
	if (pid < 0 || waitpid(pid, &st, 0) != pid || !WIFEXITED(st))
		return -1;
	return WEXITSTATUS(st);
}

static void racy_is_reported(void **state)
{
	(void)state;
#ifdef HAVE_TSAN
	/* 66 is TSan's exit code for a run with reports. */
	assert_int_equal(spawn_mode("racy"), 66);
#else
	skip();
#endif
}

static void clean_is_quiet(void **state)
{
	(void)state;
#ifdef HAVE_TSAN
	assert_int_equal(spawn_mode("clean"), 0);
#else
	skip();
#endif
}

int main(int argc, char **argv)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(racy_is_reported),
		cmocka_unit_test(clean_is_quiet),
	};

	self_path = argv[0];
	if (argc == 2)
		return run_mode(argv[1]);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
