/* SPDX-License-Identifier: MIT */
/*
 * test_faults.c - fault injection (include/fanout_testing.h).
 *
 * For every path that allocates (create, sink_create, dispatch, run,
 * delegate, nested run/dispatch inside a child, the child's own setters,
 * shutdown and destroy) the k-th allocation is made to fail for k = 1, 2,
 * ... until a run completes without the fault firing.  Each failure must
 * surface as -ENOMEM from the call that needed it and leave nothing behind:
 * no record (fanout_list), no event, no capacity slot (max_async = 1 engines
 * would refuse the next dispatch), stats.rejected + 1, no thread, no file
 * descriptor, and no memory (LeakSanitizer checks at exit in the asan
 * build).  Thread creation (-EAGAIN) and eventfd creation (-EMFILE) are
 * failed the same way.
 *
 * The knobs count process-wide, so while one is armed only the test's own
 * thread calls into the library (children stay behind a gate or do not
 * allocate), except in the nested tests, where the child is the only caller.
 *
 * The number of k values each path needed is printed at the end.
 */
#include <dirent.h>

#include "common.h"
#include "fanout_testing.h"

/* ------------------------------------------------------------- helpers */

static int count_dir(const char *path)
{
	DIR *d = opendir(path);
	struct dirent *de;
	int n = 0;

	assert_non_null(d);
	while ((de = readdir(d)))
		if (de->d_name[0] != '.')
			n++;
	closedir(d);
	return n;
}

static int fd_count(void)
{
	return count_dir("/proc/self/fd") - 1; /* the DIR's own fd */
}

static int thread_count(void)
{
	return count_dir("/proc/self/task");
}

/*
 * A destroyed sink's eventfd may be closed after an RCU grace period
 * (fanout_sink_destroy defers the free), so wait for the count to settle;
 * a real leak never does.
 */
static bool fds_settle(int want)
{
	uint64_t end = mono_ms() + WAIT_MS;

	while (fd_count() > want) {
		if (mono_ms() > end)
			return false;
		sleep_us(200);
	}
	return true;
}

static void arm_alloc(long k)
{
	assert_int_equal(fanout_test_fail_at(FANOUT_FAULT_ALLOC, 0), 0);
	assert_int_equal(fanout_test_fail_at(FANOUT_FAULT_ALLOC, k), 0);
}

/* Disarm; true if the armed fault fired. */
static bool disarm_alloc(void)
{
	long left = fanout_test_fail_at(FANOUT_FAULT_ALLOC, 0);

	assert_true(left >= 0);
	return left == 0;
}

#define MAX_K 10000

struct coverage {
	const char *path;
	int k; /* fault points: k values that fired */
};

static struct coverage cov[32];
static int ncov;

static void record(const char *path, int fired)
{
	assert_true(ncov < 32);
	cov[ncov].path = path;
	cov[ncov].k = fired;
	ncov++;
}

static size_t list_count(struct fanout_engine *e)
{
	size_t n = 99999;

	assert_int_equal(fanout_list(e, NULL, 0, &n), 0);
	return n;
}

/* A one-worker engine whose only async slot must come back after a fault. */
static struct fanout_engine *tight_engine(void)
{
	return NEW_ENGINE(.workers = 1, .flags = FANOUT_NO_PIN, .max_async = 1,
			  .spin_ns = 1000);
}

/* A fresh engine, used once and destroyed, so the process has its liburcu
 * helper threads before any thread is counted. */
static void warm_up(void)
{
	struct fanout_engine *e =
		NEW_ENGINE(.workers = 1, .flags = FANOUT_NO_PIN);
	struct tbatch *tb = tb_new(1);
	struct fanout_event *ev;

	must_dispatch(e, tb);
	ev = must_wait(fanout_default_sink(e));
	fanout_event_free(ev);
	fanout_destroy(e);
	tb_free(tb);
}

/* --------------------------------------------------------------- create */

static void create_alloc_faults_cfg(const char *name,
				    const struct fanout_config *cfg)
{
	int fds = fd_count(), threads = thread_count();
	int k;

	for (k = 1; k < MAX_K; k++) {
		struct fanout_engine *e = NULL;
		int rc;

		arm_alloc(k);
		rc = fanout_create(cfg, &e);
		if (!disarm_alloc()) {
			assert_int_equal(rc, 0);
			assert_non_null(e);
			must_run_one(e);
			fanout_destroy(e);
			break;
		}
		assert_int_equal(rc, -ENOMEM);
		assert_null(e);
		assert_true(fds_settle(fds));
		assert_int_equal(thread_count(), threads);
	}
	assert_true(fds_settle(fds));
	assert_int_equal(thread_count(), threads);
	assert_true(k > 1); /* create does allocate */
	record(name, k - 1);
}

static void create_alloc_faults(void **state)
{
	warm_up();
	create_alloc_faults_cfg("create(NULL cfg)", NULL);
	for (unsigned w = 1; w <= 3; w++) {
		struct fanout_config c = {.workers = w,
					  .flags = FANOUT_NO_PIN,
					  .keep_completed = 4};
		static const char *names[] = {"", "create(workers=1)",
					      "create(workers=2)",
					      "create(workers=3)"};

		create_alloc_faults_cfg(names[w], &c);
	}
	{
		struct fanout_config c = {
			.workers = 2, .queue_slots = 8, .max_async = 3};

		create_alloc_faults_cfg("create(pinned, small ring)", &c);
	}
}

static void create_thread_faults(void **state)
{
	warm_up();
	int fds = fd_count(), threads = thread_count();

	for (unsigned w = 1; w <= 3; w++) {
		for (int pin = 0; pin < 2; pin++) {
			struct fanout_config c = {
				.workers = w, .flags = pin ? 0 : FANOUT_NO_PIN};
			int k;

			for (k = 1; k < 100; k++) {
				struct fanout_engine *e = NULL;
				long left;
				int rc;

				assert_int_equal(
					fanout_test_fail_at(FANOUT_FAULT_THREAD,
							    k),
					0);
				rc = fanout_create(&c, &e);
				left = fanout_test_fail_at(FANOUT_FAULT_THREAD,
							   0);
				if (left > 0) {
					assert_int_equal(rc, 0);
					must_run_one(e);
					fanout_destroy(e);
					break;
				}
				assert_int_equal(rc, -EAGAIN);
				assert_null(e);
				/* the threads already started were stopped */
				assert_int_equal(thread_count(), threads);
				assert_true(fds_settle(fds));
			}
			/* one fault point per worker thread */
			assert_int_equal(k - 1, (int)w);
			if (pin == 0) {
				static const char *names[] = {
					"", "thread: create(workers=1)",
					"thread: create(workers=2)",
					"thread: create(workers=3)"};
				record(names[w], k - 1);
			}
		}
	}
	assert_int_equal(thread_count(), threads);
}

static void create_eventfd_faults(void **state)
{
	warm_up();
	int fds = fd_count(), threads = thread_count();
	int k;

	for (k = 1; k < 100; k++) {
		struct fanout_engine *e = NULL;
		long left;
		int rc;

		assert_int_equal(fanout_test_fail_at(FANOUT_FAULT_EVENTFD, k),
				 0);
		rc = fanout_create(NULL, &e);
		left = fanout_test_fail_at(FANOUT_FAULT_EVENTFD, 0);
		if (left > 0) {
			assert_int_equal(rc, 0);
			must_run_one(e);
			fanout_destroy(e);
			break;
		}
		/* the default sink's eventfd: -EMFILE, as sink_create */
		assert_int_equal(rc, -EMFILE);
		assert_null(e);
		assert_int_equal(thread_count(), threads);
		assert_true(fds_settle(fds));
	}
	assert_int_equal(k - 1, 1); /* the default sink's eventfd */
	record("eventfd: create", k - 1);
}

/* ---------------------------------------------------------------- sinks */

static void sink_create_faults(void **state)
{
	struct fanout_engine *e =
		NEW_ENGINE(.workers = 1, .flags = FANOUT_NO_PIN);
	int fds = fd_count();
	int k;

	for (k = 1; k < MAX_K; k++) {
		struct fanout_sink *s = NULL;
		int rc;

		arm_alloc(k);
		rc = fanout_sink_create(e, &s);
		if (!disarm_alloc()) {
			assert_int_equal(rc, 0);
			assert_non_null(s);
			assert_int_equal(fanout_sink_destroy(s), 0);
			break;
		}
		assert_int_equal(rc, -ENOMEM);
		assert_null(s);
		assert_true(fds_settle(fds));
	}
	record("sink_create", k - 1);

	for (k = 1; k < 100; k++) {
		struct fanout_sink *s = NULL;
		long left;
		int rc;

		assert_int_equal(fanout_test_fail_at(FANOUT_FAULT_EVENTFD, k),
				 0);
		rc = fanout_sink_create(e, &s);
		left = fanout_test_fail_at(FANOUT_FAULT_EVENTFD, 0);
		if (left > 0) {
			assert_int_equal(rc, 0);
			assert_int_equal(fanout_sink_destroy(s), 0);
			break;
		}
		assert_int_equal(rc, -EMFILE);
		assert_null(s);
		assert_true(fds_settle(fds));
	}
	assert_int_equal(k - 1, 1);
	record("eventfd: sink_create", k - 1);
	must_run_one(e);
	fanout_destroy(e);
	assert_true(fds_settle(fds - 1)); /* the default sink's eventfd too */
}

/* ------------------------------------------------------------- dispatch */

/* The batch used by the dispatch/run paths: children that do not allocate,
 * strings to copy. */
struct fbatch {
	atomic_int count;
	struct fanout_task t[5];
	struct fanout_batch b;
};

static void fbatch_init(struct fbatch *f, struct fanout_sink *s)
{
	static const char *goals[] = {"a", NULL, "a longer goal string", "",
				      "e"};

	atomic_init(&f->count, 0);
	for (int i = 0; i < 5; i++) {
		f->t[i].goal = goals[i];
		f->t[i].fn = count_fn;
		f->t[i].arg = &f->count;
	}
	memset(&f->b, 0, sizeof(f->b));
	f->b.tasks = f->t;
	f->b.ntasks = 5;
	f->b.context = "some context";
	f->b.session_key = "session";
	f->b.sink = s;
}

/* After a refused call: nothing changed. */
static void nothing_changed(struct fanout_engine *e, struct fanout_sink *s,
			    const struct fanout_stats *before, size_t nlist,
			    struct fbatch *f)
{
	struct fanout_stats st = stats_of(e);

	assert_int_equal(st.rejected, before->rejected + 1);
	assert_int_equal(st.dispatched, before->dispatched);
	assert_int_equal(st.runs, before->runs);
	assert_int_equal(st.completed, before->completed);
	assert_int_equal(st.running, 0);
	assert_int_equal(st.async_running, 0);
	assert_int_equal(list_count(e), nlist);
	if (s)
		assert_no_event(s);
	assert_int_equal(atomic_load(&f->count), 0);
}

static void dispatch_faults(void **state)
{
	struct fanout_engine *e = tight_engine();
	struct fanout_sink *s = NULL;
	struct fbatch f;
	int k;

	assert_int_equal(fanout_sink_create(e, &s), 0);
	for (k = 1; k < MAX_K; k++) {
		struct fanout_stats before = stats_of(e);
		size_t nlist = list_count(e);
		fanout_id id = 0;
		int rc;

		fbatch_init(&f, s);
		arm_alloc(k);
		rc = fanout_dispatch(e, &f.b, &id);
		if (!disarm_alloc()) {
			struct fanout_event *ev;

			assert_int_equal(rc, 0);
			ev = must_wait(s);
			assert_true(ev->id == id);
			assert_int_equal(ev->nresults, 5);
			assert_int_equal(ev->ncompleted, 5);
			assert_string_equal(ev->context, "some context");
			assert_string_equal(ev->results[1].goal, "");
			fanout_event_free(ev);
			assert_int_equal(atomic_load(&f.count), 5);
			break;
		}
		assert_int_equal(rc, -ENOMEM);
		assert_true(id == 0);
		nothing_changed(e, s, &before, nlist, &f);
	}
	record("dispatch", k - 1);
	/* the single async slot was never leaked: the sink is not pending and
	 * a second dispatch is accepted */
	assert_int_equal(fanout_sink_destroy(s), 0);
	must_run_one(e);
	fanout_destroy(e);
}

static void run_faults(void **state)
{
	struct fanout_engine *e = tight_engine();
	struct fbatch f;
	int k;

	for (k = 1; k < MAX_K; k++) {
		struct fanout_stats before = stats_of(e);
		size_t nlist = list_count(e);
		struct fanout_event *ev = NULL;
		int rc;

		fbatch_init(&f, NULL);
		arm_alloc(k);
		rc = fanout_run(e, &f.b, &ev);
		if (!disarm_alloc()) {
			assert_int_equal(rc, 0);
			assert_non_null(ev);
			assert_int_equal(ev->ncompleted, 5);
			fanout_event_free(ev);
			break;
		}
		assert_int_equal(rc, -ENOMEM);
		assert_null(ev);
		nothing_changed(e, fanout_default_sink(e), &before, nlist, &f);
	}
	record("run", k - 1);
	must_run_one(e);
	fanout_destroy(e);
}

static void delegate_faults(void **state)
{
	struct fanout_engine *e = tight_engine();
	struct fbatch f;
	atomic_int gate = 0;
	struct tbatch *hold = tb_new(1);
	struct fanout_event *ev;
	fanout_id hid;
	int k;

	/* background outcome */
	for (k = 1; k < MAX_K; k++) {
		struct fanout_stats before = stats_of(e);
		size_t nlist = list_count(e);
		fanout_id id = 0;
		int rc;

		ev = NULL;
		fbatch_init(&f, NULL);
		arm_alloc(k);
		rc = fanout_delegate(e, &f.b, &id, &ev);
		if (!disarm_alloc()) {
			assert_int_equal(rc, FANOUT_BACKGROUND);
			ev = must_wait(fanout_default_sink(e));
			assert_true(ev->id == id);
			fanout_event_free(ev);
			break;
		}
		assert_int_equal(rc, -ENOMEM);
		assert_null(ev);
		nothing_changed(e, fanout_default_sink(e), &before, nlist, &f);
	}
	record("delegate (background)", k - 1);

	/* inline-full outcome: the only async slot is held by a gated child */
	tb_gate(hold, &gate);
	hid = must_dispatch(e, hold);
	for (k = 1; k < MAX_K; k++) {
		struct fanout_stats before = stats_of(e);
		size_t nlist = list_count(e);
		fanout_id id = 0;
		int rc;

		ev = NULL;
		fbatch_init(&f, NULL);
		arm_alloc(k);
		rc = fanout_delegate(e, &f.b, &id, &ev);
		if (!disarm_alloc()) {
			assert_int_equal(rc, FANOUT_INLINE_FULL);
			assert_non_null(ev);
			assert_true(ev->id == id);
			assert_int_equal(ev->ncompleted, 5);
			fanout_event_free(ev);
			/* answered inline: a run, not a rejection */
			assert_int_equal(stats_of(e).rejected, before.rejected);
			assert_int_equal(stats_of(e).runs, before.runs + 1);
			break;
		}
		assert_int_equal(rc, -ENOMEM);
		assert_null(ev);
		/* the -EBUSY was answered by running inline: only the failed
		 * run counts as a rejection */
		struct fanout_stats st = stats_of(e);

		assert_int_equal(st.rejected, before.rejected + 1);
		assert_int_equal(st.runs, before.runs);
		assert_int_equal(st.dispatched, before.dispatched);
		assert_int_equal(list_count(e), nlist);
		assert_int_equal(atomic_load(&f.count), 0);
	}
	record("delegate (inline, pool full)", k - 1);
	atomic_store(&gate, 1);
	ev = must_wait(fanout_default_sink(e));
	assert_true(ev->id == hid);
	fanout_event_free(ev);
	tb_free(hold);
	fanout_destroy(e);
}

/* --------------------------------------------------- inside a child */

/* What the child saw, checked by the test thread after the event. */
struct nested_res {
	struct fanout_engine *e;
	struct fanout_sink *s;
	int mode;    /* 0 run, 1 dispatch, 2 delegate, 3 setters */
	int kvalues; /* fault points found */
	int bad;     /* unexpected outcomes */
	int last_rc;
	atomic_int count; /* grandchildren run */
	fanout_id bg_id;  /* the dispatch that finally got through */
	char *why;
};

static int nested_child(struct fanout_child *c, void *arg)
{
	struct nested_res *nr = arg;
	struct fanout_task t[3];
	struct fanout_batch b = {
		.tasks = t, .ntasks = 3, .context = "nested", .sink = nr->s};
	int k;

	for (int i = 0; i < 3; i++)
		t[i] = (struct fanout_task){"grandchild", count_fn, &nr->count};
	if (nr->mode == 3) {
		/* the setters: a failed one leaves the old text in place */
		long left;

		if (fanout_set_summary(c, "old summary", 11) ||
		    fanout_set_error(c, "old error"))
			nr->bad++;
		fanout_test_fail_at(FANOUT_FAULT_ALLOC, 1);
		if (fanout_set_summary(c, "new summary", 11) != -ENOMEM)
			nr->bad++;
		left = fanout_test_fail_at(FANOUT_FAULT_ALLOC, 0);
		fanout_test_fail_at(FANOUT_FAULT_ALLOC, 1);
		if (fanout_set_error(c, "new error") != -ENOMEM)
			nr->bad++;
		left += fanout_test_fail_at(FANOUT_FAULT_ALLOC, 0);
		if (left != 0) /* both fired */
			nr->bad++;
		nr->kvalues = 1;
		return -EIO; /* so the error text shows */
	}
	for (k = 1; k < 100; k++) {
		struct fanout_event *ev = NULL;
		fanout_id id = 0;
		long left;
		int rc;

		fanout_test_fail_at(FANOUT_FAULT_ALLOC, k);
		if (nr->mode == 0)
			rc = fanout_run(nr->e, &b, &ev);
		else if (nr->mode == 1)
			rc = fanout_dispatch(nr->e, &b, &id);
		else
			rc = fanout_delegate(nr->e, &b, &id, &ev);
		left = fanout_test_fail_at(FANOUT_FAULT_ALLOC, 0);
		nr->last_rc = rc;
		if (left > 0) {
			if (nr->mode == 1) {
				if (rc != 0)
					nr->bad++;
				nr->bg_id = id;
			} else if (rc != (nr->mode == 0 ? 0 : FANOUT_INLINE) ||
				   !ev || ev->ncompleted != 3) {
				nr->bad++;
			}
			fanout_event_free(ev);
			break;
		}
		if (rc != -ENOMEM || ev || atomic_load(&nr->count) != 0)
			nr->bad++;
	}
	nr->kvalues = k - 1;
	return 0;
}

static void nested_faults_mode(int mode, const char *name)
{
	struct fanout_engine *e =
		NEW_ENGINE(.workers = 1, .flags = FANOUT_NO_PIN,
			   .max_async = 2);
	struct nested_res nr = {.e = e, .mode = mode};
	struct fanout_task t = {"parent", nested_child, &nr};
	struct fanout_batch b = {.tasks = &t, .ntasks = 1};
	struct fanout_event *ev;
	struct fanout_stats st;
	fanout_id id = 0;

	atomic_init(&nr.count, 0);
	assert_int_equal(fanout_sink_create(e, &nr.s), 0);
	assert_int_equal(fanout_dispatch(e, &b, &id), 0);
	ev = must_wait(fanout_default_sink(e));
	assert_true(ev->id == id);
	assert_int_equal(nr.bad, 0);
	assert_true(nr.kvalues >= 1);
	if (mode == 3) {
		assert_int_equal(ev->results[0].status, FANOUT_ERROR);
		assert_string_equal(ev->results[0].summary, "old summary");
		assert_string_equal(ev->results[0].error, "old error");
	} else {
		assert_int_equal(ev->results[0].status, FANOUT_COMPLETED);
	}
	fanout_event_free(ev);
	if (mode == 1) { /* the nested background delegation's event */
		ev = must_wait(nr.s);
		assert_true(ev->id == nr.bg_id);
		assert_int_equal(ev->ncompleted, 3);
		fanout_event_free(ev);
	}
	assert_no_event(nr.s);
	assert_no_event(fanout_default_sink(e));
	if (mode != 3)
		assert_int_equal(atomic_load(&nr.count), 3);
	st = stats_of(e);
	if (mode != 3)
		assert_int_equal(st.rejected, (uint64_t)nr.kvalues);
	assert_int_equal(st.async_running, 0);
	assert_int_equal(fanout_sink_destroy(nr.s), 0);
	fanout_destroy(e);
	record(name, nr.kvalues);
}

static void nested_faults(void **state)
{
	nested_faults_mode(0, "run inside a child");
	nested_faults_mode(1, "dispatch inside a child");
	nested_faults_mode(2, "delegate inside a child");
	nested_faults_mode(3, "set_summary/set_error");
}

/* ------------------------------------------------------ shutdown/destroy */

/*
 * Shutdown and destroy with work queued and events undrained: if they
 * allocate at all, a failure may not lose an event or leak.  They have no
 * -ENOMEM to report, so the run must still be complete.
 */
static void shutdown_destroy_faults(void **state)
{
	int ks = 0, kd = 0;

	for (int which = 0; which < 2; which++) {
		int k;

		for (k = 1; k < MAX_K; k++) {
			struct fanout_engine *e =
				NEW_ENGINE(.workers = 1, .flags = FANOUT_NO_PIN,
					   .spin_ns = 1000);
			struct fanout_sink *s = NULL;
			struct tbatch *tb[4];
			atomic_int gate = 0;
			bool fired;
			int rc, n = 0;

			assert_int_equal(fanout_sink_create(e, &s), 0);
			for (int i = 0; i < 4; i++) {
				tb[i] = tb_new(3);
				tb[i]->b.sink = i & 1 ? s : NULL;
				tb_gate(tb[i], &gate);
				if (i ==
				    0) /* one running child sees the stop */
					tb[i]->probes[0].until_interrupted =
						true;
				must_dispatch(e, tb[i]);
			}
			/* the worker is inside batch 0 (gated) now or soon */
			assert_true(
				wait_ge(&tb[0]->probes[0].runs, 1, WAIT_MS));
			atomic_store(&gate, 1);
			if (which == 0) {
				struct fanout_event *ev;

				arm_alloc(k);
				rc = fanout_shutdown(e);
				fired = disarm_alloc();
				assert_int_equal(rc, 0);
				/* every event is there */
				while (fanout_poll(s, &ev) == 0) {
					fanout_event_free(ev);
					n++;
				}
				while (fanout_poll(fanout_default_sink(e),
						   &ev) == 0) {
					fanout_event_free(ev);
					n++;
				}
				assert_int_equal(n, 4);
				fanout_destroy(e);
			} else {
				assert_int_equal(fanout_shutdown(e), 0);
				/* destroy frees the undrained events */
				arm_alloc(k);
				fanout_destroy(e);
				fired = disarm_alloc();
			}
			for (int i = 0; i < 4; i++)
				tb_free(tb[i]);
			if (!fired)
				break;
		}
		if (which == 0)
			ks = k;
		else
			kd = k;
	}
	/* k = 1 did not fire: neither allocates */
	record("shutdown (k tried)", ks);
	record("destroy (k tried)", kd);
}

/* The non-blocking calls do not allocate at all (they cannot report
 * -ENOMEM), whatever state the engine is in. */
static void readers_do_not_allocate(void **state)
{
	struct fanout_engine *e =
		NEW_ENGINE(.workers = 1, .flags = FANOUT_NO_PIN);
	struct tbatch *tb = tb_new(2), *tb2 = tb_new(2);
	atomic_int gate = 0;
	struct fanout_info infos[4];
	struct fanout_info info;
	struct fanout_event *ev = NULL;
	struct fanout_sink *empty = NULL;
	char buf[256];
	size_t n;
	fanout_id id, id2;

	assert_int_equal(fanout_sink_create(e, &empty), 0);
	tb_gate(tb, &gate);
	id = must_dispatch(e, tb);
	id2 = must_dispatch(e, tb2);
	arm_alloc(1);
	assert_int_equal(fanout_lookup(e, id, &info), 0);
	assert_int_equal(fanout_list(e, infos, 4, &n), 0);
	assert_int_equal(fanout_cancel(e, id2, FANOUT_CANCEL_PENDING), 0);
	(void)stats_of(e);
	(void)fanout_describe_error(e, -EBUSY, buf, sizeof(buf));
	assert_int_equal(fanout_wait(empty, &ev, 5), -ETIMEDOUT);
	assert_int_equal(fanout_poll(empty, &ev), -EAGAIN);
	assert_true(fanout_sink_fd(empty) >= 0);
	assert_false(disarm_alloc());
	atomic_store(&gate, 1);
	for (int i = 0; i < 2; i++) {
		ev = must_wait(fanout_default_sink(e));
		arm_alloc(1);
		assert_true(fanout_format(ev, buf, sizeof(buf)) > 0);
		assert_true(fanout_event_json(ev, buf, sizeof(buf)) > 0);
		fanout_event_free(ev);
		assert_false(disarm_alloc());
	}
	fanout_destroy(e);
	tb_free(tb);
	tb_free(tb2);
	record("lookup/list/cancel/stats/wait/format (k tried)", 1);
}

static void print_coverage(void **state)
{
	print_message("fault-injection coverage (fault points per path):\n");
	for (int i = 0; i < ncov; i++)
		print_message("  %-48s %d\n", cov[i].path, cov[i].k);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		TC(create_alloc_faults),     TC(create_thread_faults),
		TC(create_eventfd_faults),   TC(sink_create_faults),
		TC(dispatch_faults),	     TC(run_faults),
		TC(delegate_faults),	     TC(nested_faults),
		TC(shutdown_destroy_faults), TC(readers_do_not_allocate),
		TC(print_coverage),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
