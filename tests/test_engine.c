/* SPDX-License-Identifier: MIT */
/* test_engine.c - fanout_create/destroy, config validation, small helpers. */
#include <dirent.h>

#include "common.h"

static int cpus_allowed(void)
{
	cpu_set_t set;

	CPU_ZERO(&set);
	if (sched_getaffinity(0, sizeof(set), &set) != 0)
		return -1;
	return CPU_COUNT(&set);
}

/* Run a small batch to prove the engine works; every child exactly once. */
static void run_some(struct fanout_engine *e, unsigned n)
{
	struct tbatch *tb = tb_new(n);
	struct fanout_event *ev = NULL;

	assert_int_equal(fanout_run(e, &tb->b, &ev), 0);
	check_all_completed(ev, tb);
	fanout_event_free(ev);

	tb_free(tb);
	tb = tb_new(n);
	fanout_id id = must_dispatch(e, tb);
	ev = must_wait(fanout_default_sink(e));
	assert_true(ev->id == id);
	check_all_completed(ev, tb);
	fanout_event_free(ev);
	tb_free(tb);
}

static void create_null_cfg_uses_defaults(void **state)
{
	struct fanout_engine *e = NULL;

	assert_int_equal(fanout_create(NULL, &e), 0);
	assert_non_null(e);
	struct fanout_stats st = stats_of(e);
	int ncpu = cpus_allowed();
	if (ncpu > 0)
		assert_int_equal(st.nworkers, (unsigned)ncpu);
	assert_true(st.nworkers >= 1);
	run_some(e, 5);
	fanout_destroy(e);
}

static void create_null_out_einval(void **state)
{
	struct fanout_config cfg = {.workers = 1};

	assert_int_equal(fanout_create(&cfg, NULL), -EINVAL);
	assert_int_equal(fanout_create(NULL, NULL), -EINVAL);
}

static void expect_einval(struct fanout_config cfg)
{
	struct fanout_engine *e = (struct fanout_engine *)0x1;

	assert_int_equal(fanout_create(&cfg, &e), -EINVAL);
}

static void expect_ok(struct fanout_config cfg)
{
	struct fanout_engine *e = NULL;

	assert_int_equal(fanout_create(&cfg, &e), 0);
	assert_non_null(e);
	run_some(e, 3);
	fanout_destroy(e);
}

static void create_unknown_flags(void **state)
{
	for (unsigned bit = 0; bit < 32; bit++) {
		unsigned f = 1u << bit;

		if (f & KNOWN_ENGINE_FLAGS) {
			expect_ok((struct fanout_config){.workers = 1,
							 .flags = f});
			continue;
		}
		expect_einval((struct fanout_config){.workers = 1, .flags = f});
		expect_einval((struct fanout_config){
			.workers = 1, .flags = KNOWN_ENGINE_FLAGS | f});
	}
}

static void create_workers_too_many(void **state)
{
	expect_einval((struct fanout_config){.workers = 1025,
					     .flags = FANOUT_NO_PIN});
	expect_einval((struct fanout_config){.workers = UINT_MAX,
					     .flags = FANOUT_NO_PIN});
}

static void create_max_depth_range(void **state)
{
	expect_einval((struct fanout_config){.workers = 1, .max_depth = 65});
	expect_einval(
		(struct fanout_config){.workers = 1, .max_depth = UINT_MAX});
	expect_ok((struct fanout_config){
		.workers = 1, .flags = FANOUT_NO_PIN, .max_depth = 64});
}

static void create_max_tasks_range(void **state)
{
	expect_einval((struct fanout_config){.workers = 1,
					     .max_tasks = (1u << 24) + 1});
	expect_einval(
		(struct fanout_config){.workers = 1, .max_tasks = UINT_MAX});
	expect_ok((struct fanout_config){
		.workers = 1, .flags = FANOUT_NO_PIN, .max_tasks = 1u << 24});
}

static void create_spin_ns_range(void **state)
{
	expect_einval((struct fanout_config){.workers = 1,
					     .spin_ns = 1000000000ull + 1});
	expect_einval(
		(struct fanout_config){.workers = 1, .spin_ns = UINT64_MAX});
	expect_ok((struct fanout_config){.workers = 1,
					 .flags = FANOUT_NO_PIN,
					 .spin_ns = 1000000000ull});
	expect_ok((struct fanout_config){
		.workers = 1, .flags = FANOUT_NO_PIN, .spin_ns = 1});
}

/* The other documented limits (queue_slots, max_async, max_children,
 * keep_completed); the large valid values are not created here (memory). */
static void create_other_limits(void **state)
{
	expect_einval((struct fanout_config){.workers = 1,
					     .queue_slots = (1u << 24) + 1});
	expect_einval(
		(struct fanout_config){.workers = 1, .queue_slots = UINT_MAX});
	expect_einval((struct fanout_config){.workers = 1,
					     .max_async = (1u << 20) + 1});
	expect_einval((struct fanout_config){.workers = 1,
					     .max_children = (1u << 24) + 1});
	expect_einval((struct fanout_config){.workers = 1,
					     .keep_completed = (1u << 24) + 1});
	expect_ok((struct fanout_config){.workers = 1,
					 .flags = FANOUT_NO_PIN,
					 .max_children = 1u << 24});
	expect_ok((struct fanout_config){.workers = 2,
					 .flags = FANOUT_NO_PIN,
					 .queue_slots = 3,
					 .max_async = 5,
					 .keep_completed = 1});
}

static void create_no_pin(void **state)
{
	struct fanout_engine *e =
		NEW_ENGINE(.workers = 2, .flags = FANOUT_NO_PIN);
	struct fanout_stats st = stats_of(e);

	assert_int_equal(st.nworkers, 2);
	for (unsigned i = 0; i < 2; i++)
		assert_int_equal(st.worker[i].cpu, -1);
	run_some(e, 8);
	fanout_destroy(e);
}

static void create_pinned(void **state)
{
	cpu_set_t set;

	CPU_ZERO(&set);
	assert_int_equal(sched_getaffinity(0, sizeof(set), &set), 0);
	unsigned n = CPU_COUNT(&set) >= 2 ? 2 : 1;
	struct fanout_engine *e = NEW_ENGINE(.workers = n, .flags = 0);
	struct fanout_stats st = stats_of(e);

	assert_int_equal(st.nworkers, n);
	/* pinned one per CPU: a CPU we may run on, two workers not sharing */
	for (unsigned i = 0; i < n; i++) {
		assert_true(st.worker[i].cpu >= 0);
		assert_true(CPU_ISSET(st.worker[i].cpu, &set));
	}
	if (n == 2)
		assert_int_not_equal(st.worker[0].cpu, st.worker[1].cpu);
	run_some(e, 8);
	fanout_destroy(e);
}

static int mask_size_fn(struct fanout_child *c, void *arg)
{
	cpu_set_t set;

	(void)c;
	CPU_ZERO(&set);
	if (sched_getaffinity(0, sizeof(set), &set) == 0)
		atomic_store((atomic_int *)arg, CPU_COUNT(&set));
	return 0;
}

/* A caller pinned to one CPU (a dispatcher on its own core) does not
 * confine the workers to that CPU: they use the CPUs the process could
 * use when the library was loaded.  Before, both workers were pinned to
 * the caller's CPU, the default worker count was 1, and unpinned workers
 * inherited the caller's one-CPU mask. */
static void a_pinned_caller_does_not_confine_workers(void **state)
{
	cpu_set_t saved = *(cpu_set_t *)*state, one;
	atomic_int mask_size = 0;
	struct fanout_task t = {"mask", mask_size_fn, &mask_size};
	struct fanout_batch b = {.tasks = &t, .ntasks = 1};
	struct fanout_event *ev;
	int first = -1;

	if (CPU_COUNT(&saved) < 2)
		skip();
	for (int c = 0; c < CPU_SETSIZE && first < 0; c++)
		if (CPU_ISSET(c, &saved))
			first = c;
	CPU_ZERO(&one);
	CPU_SET(first, &one);
	assert_int_equal(
		pthread_setaffinity_np(pthread_self(), sizeof(one), &one), 0);

	struct fanout_engine *e = NEW_ENGINE(.workers = 2);
	struct fanout_stats st = stats_of(e);
	for (unsigned i = 0; i < 2; i++)
		assert_true(CPU_ISSET(st.worker[i].cpu, &saved));
	assert_int_not_equal(st.worker[0].cpu, st.worker[1].cpu);
	run_some(e, 8);
	fanout_destroy(e);

	e = NEW_ENGINE(.workers = 0);
	st = stats_of(e);
	assert_int_equal(st.nworkers, (unsigned)CPU_COUNT(&saved) < 1024 ?
					      (unsigned)CPU_COUNT(&saved) :
					      1024u);
	fanout_destroy(e);

	e = NEW_ENGINE(.workers = 1, .flags = FANOUT_NO_PIN);
	assert_int_equal(fanout_dispatch(e, &b, NULL), 0);
	ev = must_wait(fanout_default_sink(e));
	assert_int_equal(ev->ncompleted, 1);
	fanout_event_free(ev);
	assert_int_equal(atomic_load(&mask_size), CPU_COUNT(&saved));
	fanout_destroy(e);
}

/* Setup and teardown of the test above: the test thread's mask comes
 * back even when one of its assertions fails, so the tests after it do
 * not run pinned to one CPU. */
static int save_affinity(void **state)
{
	cpu_set_t *saved = malloc(sizeof(*saved));

	if (!saved ||
	    pthread_getaffinity_np(pthread_self(), sizeof(*saved), saved)) {
		free(saved);
		return -1;
	}
	*state = saved;
	return 0;
}

static int restore_affinity(void **state)
{
	cpu_set_t *saved = *state;
	int rc = pthread_setaffinity_np(pthread_self(), sizeof(*saved), saved);

	free(saved);
	return tc_teardown(state) || rc ? -1 : 0;
}

static void create_one_worker(void **state)
{
	struct fanout_engine *e =
		NEW_ENGINE(.workers = 1, .flags = FANOUT_NO_PIN);

	assert_int_equal(stats_of(e).nworkers, 1);
	run_some(e, 17);
	fanout_destroy(e);
}

static void stats_nworkers_matches(void **state)
{
	for (unsigned w = 1; w <= 3; w++) {
		struct fanout_engine *e =
			NEW_ENGINE(.workers = w, .flags = FANOUT_NO_PIN);
		struct fanout_stats st = stats_of(e);

		assert_int_equal(st.nworkers, w);
		assert_int_equal(st.dispatched, 0);
		assert_int_equal(st.running, 0);
		fanout_destroy(e);
	}
}

static void destroy_null_noop(void **state)
{
	fanout_destroy(NULL);
	assert_int_equal(fanout_shutdown(NULL), -EINVAL);
}

static void stats_null_einval(void **state)
{
	struct fanout_stats st;
	struct fanout_engine *e =
		NEW_ENGINE(.workers = 1, .flags = FANOUT_NO_PIN);

	assert_int_equal(fanout_stats(NULL, &st), -EINVAL);
	assert_int_equal(fanout_stats(e, NULL), -EINVAL);
	assert_null(fanout_default_sink(NULL));
	assert_non_null(fanout_default_sink(e));
	assert_ptr_equal(fanout_default_sink(e), fanout_default_sink(e));
	fanout_destroy(e);
}

static void two_engines_independent(void **state)
{
	struct fanout_engine *a =
		NEW_ENGINE(.workers = 1, .flags = FANOUT_NO_PIN);
	struct fanout_engine *b =
		NEW_ENGINE(.workers = 1, .flags = FANOUT_NO_PIN);

	assert_ptr_not_equal(fanout_default_sink(a), fanout_default_sink(b));
	run_some(a, 4);
	run_some(b, 4);
	assert_int_equal(stats_of(a).dispatched, 1);
	assert_int_equal(stats_of(b).dispatched, 1);
	fanout_destroy(a);
	fanout_destroy(b);
}

static void status_names(void **state)
{
	assert_string_equal(fanout_status_name(FANOUT_PENDING), "pending");
	assert_string_equal(fanout_status_name(FANOUT_RUNNING), "running");
	assert_string_equal(fanout_status_name(FANOUT_COMPLETED), "completed");
	assert_string_equal(fanout_status_name(FANOUT_ERROR), "error");
	assert_string_equal(fanout_status_name(FANOUT_INTERRUPTED),
			    "interrupted");
	assert_string_equal(fanout_status_name((enum fanout_status)5),
			    "unknown");
	assert_string_equal(fanout_status_name((enum fanout_status) - 1),
			    "unknown");
	assert_string_equal(fanout_status_name((enum fanout_status)12345),
			    "unknown");
}

static void now_ns_monotonic(void **state)
{
	struct timespec a, b;
	uint64_t prev = fanout_now_ns();

	assert_true(prev > 0);
	for (int i = 0; i < 1000; i++) {
		uint64_t t = fanout_now_ns();

		assert_true(t >= prev);
		prev = t;
	}
	/* it is CLOCK_MONOTONIC: bracketed by two readings of that clock */
	clock_gettime(CLOCK_MONOTONIC, &a);
	uint64_t t = fanout_now_ns();
	clock_gettime(CLOCK_MONOTONIC, &b);
	uint64_t ta = (uint64_t)a.tv_sec * 1000000000ull + a.tv_nsec;
	uint64_t tb = (uint64_t)b.tv_sec * 1000000000ull + b.tv_nsec;
	assert_true(ta <= t);
	assert_true(t <= tb);
}

static void create_destroy_many(void **state)
{
	/* threads and eventfds are released: 50 cycles would exhaust a leak */
	for (int i = 0; i < 50; i++) {
		struct fanout_engine *e =
			NEW_ENGINE(.workers = 2, .flags = FANOUT_NO_PIN);
		if (i % 10 == 0)
			run_some(e, 2);
		fanout_destroy(e);
	}
}

static int thread_count(void)
{
	DIR *d = opendir("/proc/self/task");
	struct dirent *de;
	int n = 0;

	assert_non_null(d);
	while ((de = readdir(d)))
		if (de->d_name[0] != '.')
			n++;
	closedir(d);
	return n;
}

/*
 * The kernel may list a joined thread in /proc for a moment after
 * pthread_join returned (the joiner is woken before the task is reaped):
 * wait, bounded, for the count to come down to @max.
 */
static int thread_count_settled(int max)
{
	uint64_t end = mono_ms() + WAIT_MS;
	int n;

	while ((n = thread_count()) > max && mono_ms() < end)
		sleep_ms(1);
	return n;
}

static void cycle_with_work(void)
{
	struct fanout_engine *e = NEW_ENGINE(.workers = 3, .keep_completed = 1,
					     .flags = FANOUT_NO_PIN);
	struct fanout_sink *s = NULL;

	assert_int_equal(fanout_sink_create(e, &s), 0);
	for (int i = 0; i < 5; i++)
		run_some(e, 4); /* finishes and prunes records */
	assert_int_equal(fanout_sink_destroy(s), 0);
	fanout_destroy(e);
}

/* destroy joins the workers (and whatever else the engine started). */
static void destroy_joins_threads(void **state)
{
	cycle_with_work(); /* warm up process-wide helpers (e.g. call_rcu) */
	int base = thread_count();
	for (int i = 0; i < 20; i++) { /* let the kernel reap the last ones */
		sleep_ms(2);
		int n = thread_count();
		if (n < base)
			base = n;
	}

	for (int i = 0; i < 10; i++)
		cycle_with_work();
	assert_int_equal(thread_count_settled(base), base);

	/* shutdown alone already stops the workers */
	struct fanout_engine *e =
		NEW_ENGINE(.workers = 3, .flags = FANOUT_NO_PIN);
	run_some(e, 4);
	int running = thread_count();
	assert_true(running >= base + 3);
	assert_int_equal(fanout_shutdown(e), 0);
	/* the three workers have exited (other helpers may stay) */
	int after = thread_count_settled(running - 3);
	if (after > running - 3)
		print_error("threads: %d before create, %d running, %d after "
			    "shutdown\n",
			    base, running, after);
	assert_true(after <= running - 3);
	fanout_destroy(e);
	assert_int_equal(thread_count_settled(base), base);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		TC(create_null_cfg_uses_defaults),
		TC(create_null_out_einval),
		TC(create_unknown_flags),
		TC(create_workers_too_many),
		TC(create_max_depth_range),
		TC(create_max_tasks_range),
		TC(create_spin_ns_range),
		TC(create_other_limits),
		TC(create_no_pin),
		TC(create_pinned),
		cmocka_unit_test_setup_teardown(
			a_pinned_caller_does_not_confine_workers, save_affinity,
			restore_affinity),
		TC(create_one_worker),
		TC(stats_nworkers_matches),
		TC(destroy_null_noop),
		TC(stats_null_einval),
		TC(two_engines_independent),
		TC(status_names),
		TC(now_ns_monotonic),
		TC(create_destroy_many),
		TC(destroy_joins_threads),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
