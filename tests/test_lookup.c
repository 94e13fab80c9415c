/* SPDX-License-Identifier: MIT */
/* test_lookup.c - fanout_lookup/fanout_list, keep_completed pruning. */
#include "common.h"
#include "points.h"

static void lookup_bad_args(void **state)
{
	struct fanout_engine *e =
		NEW_ENGINE(.workers = 1, .flags = FANOUT_NO_PIN);
	struct fanout_info info, infos[2];
	size_t n = 0;

	assert_int_equal(fanout_lookup(NULL, 1, &info), -EINVAL);
	assert_int_equal(fanout_lookup(e, 0, &info), -EINVAL);
	assert_int_equal(fanout_lookup(e, 1, NULL), -EINVAL);
	assert_int_equal(fanout_lookup(e, 1, &info), -ENOENT);
	assert_int_equal(fanout_lookup(e, ~0ull, &info), -ENOENT);
	assert_int_equal(fanout_list(NULL, infos, 2, &n), -EINVAL);
	assert_int_equal(fanout_list(e, infos, 2, NULL), -EINVAL);
	assert_int_equal(fanout_list(e, NULL, 2, &n), -EINVAL);
	n = 77;
	assert_int_equal(fanout_list(e, NULL, 0, &n), 0);
	assert_int_equal(n, 0);
	n = 77;
	assert_int_equal(fanout_list(e, infos, 2, &n), 0);
	assert_int_equal(n, 0);

	struct tbatch *tb = tb_new(1);
	fanout_id id = must_dispatch(e, tb);
	struct fanout_event *ev = must_wait(fanout_default_sink(e));
	fanout_event_free(ev);
	assert_int_equal(fanout_lookup(e, id ^ 0x1000000000000000ull, &info),
			 -ENOENT);
	tb_free(tb);
	fanout_destroy(e);
}

static void lookup_while_running_and_after(void **state)
{
	struct fanout_engine *e = NEW_ENGINE(.workers = 1, .max_children = 1,
					     .flags = FANOUT_NO_PIN);
	atomic_int gate[3];
	struct tbatch *tb = tb_new(3);
	struct fanout_info info;
	int user;

	for (int i = 0; i < 3; i++) {
		atomic_init(&gate[i], 0);
		tb->probes[i].gate = &gate[i];
		tb->probes[i].cost = 1.5;
	}
	tb->b.user = &user;
	uint64_t t0 = fanout_now_ns();
	fanout_id id = must_dispatch(e, tb);
	uint64_t end = mono_ms() + WAIT_MS;
	while (tb_runs(tb) < 1) {
		assert_true(mono_ms() < end);
		sleep_us(100);
	}
	assert_int_equal(fanout_lookup(e, id, &info), 0);
	assert_true(info.id == id);
	assert_int_equal(info.status, FANOUT_RUNNING);
	assert_int_equal(info.ntasks, 3);
	assert_int_equal(info.ndone, 0);
	assert_true(info.dispatched_ns >= t0);
	assert_int_equal(info.completed_ns, 0);
	assert_int_equal(info.depth, 1);
	assert_true(info.background);
	assert_false(info.cancelled);
	assert_ptr_equal(info.user, &user);
	assert_float_equal(info.cost, 0.0, 1e-12);

	/* finish the running child; the next one starts: ndone is 1 */
	int first = -1;
	for (int i = 0; i < 3; i++)
		if (atomic_load(&tb->probes[i].runs))
			first = i;
	atomic_store(&gate[first], 1);
	end = mono_ms() + WAIT_MS;
	while (tb_runs(tb) < 2) {
		assert_true(mono_ms() < end);
		sleep_us(100);
	}
	assert_int_equal(fanout_lookup(e, id, &info), 0);
	assert_int_equal(info.status, FANOUT_RUNNING);
	assert_int_equal(info.ndone, 1);
	assert_float_equal(info.cost, 1.5, 1e-9);
	assert_int_equal(info.completed_ns, 0);

	for (int i = 0; i < 3; i++)
		atomic_store(&gate[i], 1);
	struct fanout_event *ev = must_wait(fanout_default_sink(e));
	assert_true(ev->id == id);
	assert_int_equal(fanout_lookup(e, id, &info), 0);
	assert_int_equal(info.status, FANOUT_COMPLETED);
	assert_int_equal(info.ndone, 3);
	assert_true(info.completed_ns != 0);
	assert_true(info.completed_ns >= info.dispatched_ns);
	assert_true(info.dispatched_ns == ev->dispatched_ns);
	assert_true(info.completed_ns == ev->completed_ns);
	assert_float_equal(info.cost, 4.5, 1e-9);
	assert_float_equal(ev->cost, 4.5, 1e-9);
	assert_false(info.cancelled);
	fanout_event_free(ev);
	tb_free(tb);
	fanout_destroy(e);
}

/*
 * ndone is "children finished so far": with one worker blocked in one child
 * of a larger batch, it equals the number of children that have returned.
 */
static void lookup_ndone_counts_finished_children(void **state)
{
	enum { N = 64, BLOCK = 43 };
	struct fanout_engine *e =
		NEW_ENGINE(.workers = 1, .flags = FANOUT_NO_PIN);
	atomic_int gate = 0;
	struct tbatch *tb = tb_new(N);
	struct fanout_info info;

	tb->probes[BLOCK].gate = &gate;
	fanout_id id = must_dispatch(e, tb);
	assert_true(wait_ge(&tb->probes[BLOCK].runs, 1, WAIT_MS));
	/* the only worker is inside child BLOCK: nothing else moves */
	int finished = 0;
	for (int i = 0; i < N; i++)
		finished += atomic_load(&tb->probes[i].finished);
	int rc = fanout_lookup(e, id, &info);
	struct fanout_info running = info;

	/* release the worker before asserting, so a failure stays clean */
	atomic_store(&gate, 1);
	struct fanout_event *ev = must_wait(fanout_default_sink(e));
	check_all_completed(ev, tb);
	fanout_event_free(ev);
	assert_int_equal(fanout_lookup(e, id, &info), 0);
	assert_int_equal(info.ndone, N);
	tb_free(tb);
	fanout_destroy(e);

	assert_int_equal(rc, 0);
	assert_int_equal(running.status, FANOUT_RUNNING);
	if (running.ndone != (unsigned)finished)
		print_error("ndone %u, but %d children have returned\n",
			    running.ndone, finished);
	assert_int_equal(running.ndone, finished);
}

static void lookup_final_status(void **state)
{
	struct fanout_engine *e =
		NEW_ENGINE(.workers = 2, .flags = FANOUT_NO_PIN);
	static const int rets[3] = {-EIO, -ECANCELED, 0};
	static const enum fanout_status want[3] = {
		FANOUT_ERROR, FANOUT_INTERRUPTED, FANOUT_COMPLETED};

	for (int k = 0; k < 3; k++) {
		struct tbatch *tb = tb_new(2);
		struct fanout_info info;

		tb->probes[0].ret = tb->probes[1].ret = rets[k];
		fanout_id id = must_dispatch(e, tb);
		struct fanout_event *ev = must_wait(fanout_default_sink(e));
		assert_int_equal(ev->status, want[k]);
		assert_int_equal(fanout_lookup(e, id, &info), 0);
		assert_int_equal(info.status, want[k]);
		assert_int_equal(info.ndone, 2);
		fanout_event_free(ev);
		tb_free(tb);
	}
	fanout_destroy(e);
}

static void list_running_and_finished_sorted(void **state)
{
	struct fanout_engine *e =
		NEW_ENGINE(.workers = 2, .flags = FANOUT_NO_PIN);
	atomic_int gate = 0;
	struct tbatch *tb[3];
	fanout_id id[3];
	struct fanout_info infos[8];
	size_t n = 0;

	for (int i = 0; i < 3; i++) {
		tb[i] = tb_new(2);
		if (i == 2)
			tb_gate(tb[i], &gate);
		id[i] = must_dispatch(e, tb[i]);
		if (i < 2)
			wait_finished(e, id[i]);
	}
	assert_int_equal(fanout_list(e, infos, 8, &n), 0);
	assert_int_equal(n, 3);
	assert_true(infos[0].id == id[2]);
	assert_true(infos[1].id == id[1]);
	assert_true(infos[2].id == id[0]);
	assert_int_equal(infos[0].status, FANOUT_RUNNING);
	assert_int_equal(infos[1].status, FANOUT_COMPLETED);
	assert_int_equal(infos[2].status, FANOUT_COMPLETED);
	for (int i = 0; i < 2; i++)
		assert_true(infos[i].dispatched_ns >=
			    infos[i + 1].dispatched_ns);
	for (int i = 0; i < 3; i++) {
		assert_int_equal(infos[i].ntasks, 2);
		assert_true(infos[i].background);
	}

	/* n may exceed cap; only cap entries are written */
	struct fanout_info two[3];
	memset(two, 0xab, sizeof(two));
	struct fanout_info pristine;
	memset(&pristine, 0xab, sizeof(pristine));
	assert_int_equal(fanout_list(e, two, 2, &n), 0);
	assert_int_equal(n, 3);
	assert_true(two[0].id == id[2]);
	assert_true(two[1].id == id[1]);
	assert_memory_equal(&two[2], &pristine, sizeof(pristine));
	assert_int_equal(fanout_list(e, NULL, 0, &n), 0);
	assert_int_equal(n, 3);

	atomic_store(&gate, 1);
	for (int i = 0; i < 3; i++) {
		struct fanout_event *ev = must_wait(fanout_default_sink(e));
		fanout_event_free(ev);
		tb_free(tb[i]);
	}
	fanout_destroy(e);
}

/* Finish one small delegation through the default sink (polled, freed). */
static void finish_one(struct fanout_engine *e)
{
	atomic_int count = 0;
	struct fanout_task t = {"filler", count_fn, &count};
	struct fanout_batch b = {.tasks = &t, .ntasks = 1};
	fanout_id id = 0;

	assert_int_equal(fanout_dispatch(e, &b, &id), 0);
	struct fanout_event *ev = must_wait(fanout_default_sink(e));
	assert_true(ev->id == id);
	fanout_event_free(ev);
}

static void lookup_keep_completed_prunes(void **state)
{
	struct fanout_engine *e = NEW_ENGINE(.workers = 2, .keep_completed = 4,
					     .flags = FANOUT_NO_PIN);
	struct fanout_sink *sa = NULL;
	struct tbatch *a = tb_new(3);
	struct fanout_info info;
	char sums[3][32];

	assert_int_equal(fanout_sink_create(e, &sa), 0);
	a->b.sink = sa;
	a->b.context = "context of A";
	a->b.session_key = "session-A";
	for (int i = 0; i < 3; i++) {
		snprintf(sums[i], sizeof(sums[i]), "summary of A/%d", i);
		a->probes[i].summary = sums[i];
		a->probes[i].cost = 2.0;
	}
	a->probes[2].ret = -EIO;
	a->probes[2].error = "A/2 failed";
	fanout_id ida = must_dispatch(e, a);
	wait_finished(e, ida);

	/* fewer than keep_completed newer ones finished: A stays */
	for (int i = 0; i < 3; i++)
		finish_one(e);
	assert_int_equal(fanout_lookup(e, ida, &info), 0);
	assert_int_equal(info.status, FANOUT_COMPLETED);

	/* many more, but A's event is not freed yet: A stays, whole */
	for (int i = 0; i < 20; i++)
		finish_one(e);
	memset(&info, 0, sizeof(info));
	assert_int_equal(fanout_lookup(e, ida, &info), 0);
	assert_int_equal(info.status, FANOUT_COMPLETED);
	assert_int_equal(info.ntasks, 3);
	assert_float_equal(info.cost, 6.0, 1e-9);
	assert_string_equal(info.session_key, "session-A");

	/* A's event, polled after 23 newer ones finished, is intact */
	struct fanout_event *ev = NULL;
	assert_int_equal(fanout_poll(sa, &ev), 0);
	assert_true(ev->id == ida);
	assert_int_equal(ev->nresults, 3);
	assert_string_equal(ev->context, "context of A");
	assert_string_equal(ev->session_key, "session-A");
	assert_float_equal(ev->cost, 6.0, 1e-9);
	assert_int_equal(ev->status, FANOUT_COMPLETED);
	for (int i = 0; i < 3; i++) {
		assert_int_equal(ev->results[i].index, i);
		assert_string_equal(ev->results[i].goal, a->goals[i]);
		assert_string_equal(ev->results[i].summary, sums[i]);
	}
	assert_string_equal(ev->results[2].error, "A/2 failed");
	assert_int_equal(ev->results[2].code, -EIO);
	char buf[1024];
	int len = fanout_format(ev, buf, sizeof(buf));
	assert_true(len > 0 && (size_t)len < sizeof(buf));
	assert_contains(buf, "summary of A/1");
	len = fanout_event_json(ev, buf, sizeof(buf));
	assert_true(len > 0 && (size_t)len < sizeof(buf));
	assert_contains(buf, "summary of A/0");
	fanout_event_free(ev);

	/* freed: pruned at once, since more than keep_completed newer ones
	 * finished (and were freed) meanwhile */
	assert_int_equal(fanout_lookup(e, ida, &info), -ENOENT);
	assert_int_equal(fanout_cancel(e, ida, FANOUT_CANCEL_PENDING), -ENOENT);
	size_t n = 0;
	assert_int_equal(fanout_list(e, NULL, 0, &n), 0);
	assert_true(n <= 4); /* the kept ones: pruning shows in the list */
	assert_int_equal(fanout_poll(sa, &ev), -EAGAIN);
	assert_int_equal(fanout_sink_destroy(sa), 0);
	tb_free(a);
	fanout_destroy(e);
}

/* A running record is never pruned, however many others finish. */
static void lookup_running_never_pruned(void **state)
{
	struct fanout_engine *e = NEW_ENGINE(.workers = 2, .keep_completed = 1,
					     .flags = FANOUT_NO_PIN);
	atomic_int gate = 0;
	struct tbatch *g = tb_new(1);
	struct fanout_info info;

	g->probes[0].gate = &gate;
	fanout_id id = must_dispatch(e, g);
	for (int i = 0; i < 12; i++)
		finish_one(e);
	assert_int_equal(fanout_lookup(e, id, &info), 0);
	assert_int_equal(info.status, FANOUT_RUNNING);
	struct fanout_info infos[32];
	size_t n = 0;
	bool found = false;
	assert_int_equal(fanout_list(e, infos, 32, &n), 0);
	for (size_t i = 0; i < n && i < 32; i++)
		found |= infos[i].id == id;
	assert_true(found);
	atomic_store(&gate, 1);
	struct fanout_event *ev = must_wait(fanout_default_sink(e));
	assert_true(ev->id == id);
	fanout_event_free(ev);
	/* finished now: visible right after its event */
	assert_int_equal(fanout_lookup(e, id, &info), 0);
	assert_int_equal(info.status, FANOUT_COMPLETED);
	tb_free(g);
	fanout_destroy(e);
}

/* Events nobody took are freed by fanout_sink_destroy(), and their
 * records are then pruned like any other: without that they would stay
 * in the table until fanout_destroy(). */
static void sink_destroy_prunes_untaken(void **state)
{
	struct fanout_engine *e = NEW_ENGINE(.workers = 2, .keep_completed = 2,
					     .flags = FANOUT_NO_PIN);
	struct fanout_sink *s = NULL;
	struct tbatch *tb = tb_new(1);
	struct fanout_info info;
	fanout_id id[3];
	size_t n = 0;

	assert_int_equal(fanout_sink_create(e, &s), 0);
	tb->b.sink = s;
	for (int i = 0; i < 3; i++) {
		id[i] = must_dispatch(e, tb);
		wait_finished(e, id[i]);
	}
	/* untaken: kept however many newer ones finish */
	for (int i = 0; i < 4; i++)
		finish_one(e);
	for (int i = 0; i < 3; i++)
		assert_int_equal(fanout_lookup(e, id[i], &info), 0);
	assert_int_equal(fanout_sink_destroy(s), 0);
	/* freed with the sink, after 4 newer ones finished: pruned */
	for (int i = 0; i < 3; i++)
		assert_int_equal(fanout_lookup(e, id[i], &info), -ENOENT);
	assert_int_equal(fanout_list(e, NULL, 0, &n), 0);
	assert_true(n <= 2);
	tb_free(tb);
	fanout_destroy(e);
}

static void lookup_after_event_freed(void **state)
{
	struct fanout_engine *e =
		NEW_ENGINE(.workers = 2, .flags = FANOUT_NO_PIN);
	struct tbatch *tb = tb_new(2);
	struct fanout_info info, infos[4];
	size_t n = 0;

	fanout_id id = must_dispatch(e, tb);
	struct fanout_event *ev = must_wait(fanout_default_sink(e));
	fanout_event_free(ev);
	assert_int_equal(fanout_lookup(e, id, &info), 0);
	assert_true(info.id == id);
	assert_int_equal(info.status, FANOUT_COMPLETED);
	assert_int_equal(info.ndone, 2);
	assert_int_equal(fanout_list(e, infos, 4, &n), 0);
	assert_int_equal(n, 1);
	assert_true(infos[0].id == id);
	tb_free(tb);
	fanout_destroy(e);
}

/*
 * Once its event is freed, a finished record is a tomb in the table
 * (lib/table.c): lookup and list show the same snapshot as before the
 * free, with the session key, and cancel says -EALREADY, not -ENOENT.  A
 * key too long for a tomb keeps the whole record; both must look alike.
 */
static void finished_snapshot_survives_event_free(const char *key, bool run)
{
	struct fanout_engine *e =
		NEW_ENGINE(.workers = 2, .flags = FANOUT_NO_PIN);
	struct tbatch *tb = tb_new(3);
	struct fanout_info before, after, infos[2];
	struct fanout_event *ev = NULL;
	fanout_id id;
	size_t n = 0;
	int user;

	tb->b.session_key = key;
	tb->b.user = &user;
	tb->probes[1].cost = 2.5;
	if (run) {
		assert_int_equal(fanout_run(e, &tb->b, &ev), 0);
		id = ev->id;
	} else {
		id = must_dispatch(e, tb);
		ev = must_wait(fanout_default_sink(e));
	}
	assert_int_equal(fanout_lookup(e, id, &before), 0);
	fanout_event_free(ev);
	assert_int_equal(fanout_lookup(e, id, &after), 0);
	assert_true(after.id == id);
	assert_int_equal(after.status, FANOUT_COMPLETED);
	assert_int_equal(after.status, before.status);
	assert_int_equal(after.ntasks, 3);
	assert_int_equal(after.ndone, 3);
	assert_int_equal(after.depth, 1);
	assert_int_equal(after.background, !run);
	assert_false(after.cancelled);
	assert_ptr_equal(after.user, &user);
	assert_true(after.dispatched_ns == before.dispatched_ns);
	assert_true(after.completed_ns == before.completed_ns);
	assert_true(after.completed_ns >= after.dispatched_ns);
	assert_float_equal(after.cost, 2.5, 1e-9);
	assert_non_null(after.session_key);
	assert_string_equal(after.session_key, key);
	assert_int_equal(fanout_cancel(e, id, FANOUT_CANCEL_INTERRUPT),
			 -EALREADY);
	assert_int_equal(fanout_list(e, infos, 2, &n), 0);
	assert_int_equal(n, 1);
	assert_true(infos[0].id == id);
	assert_string_equal(infos[0].session_key, key);
	assert_int_equal(
		fanout_cancel(e, id ^ 0x1000000, FANOUT_CANCEL_PENDING),
		-ENOENT);
	tb_free(tb);
	fanout_destroy(e);
}

static void lookup_tomb_background(void **state)
{
	finished_snapshot_survives_event_free("session-7", false);
}

static void lookup_tomb_run(void **state)
{
	finished_snapshot_survives_event_free("s", true);
}

static void lookup_long_key_keeps_record(void **state)
{
	char key[200];

	memset(key, 'k', sizeof(key) - 1);
	key[sizeof(key) - 1] = '\0';
	finished_snapshot_survives_event_free(key, false);
}

/*
 * Enough records to fill 44 of the table's chunks of 1024 slots
 * (lib/table.c), so that lookups land on either side of many chunk
 * boundaries: each finds its
 * own record (tomb, or whole record for a key too long for a tomb) with
 * its own user pointer and key; an id with another generation in the
 * same slot misses; one listing sees them all.  Slots of different chunks
 * sharing memory would show as another record's fields here.
 */
static int nothing(struct fanout_child *c, void *arg)
{
	(void)c;
	(void)arg;
	return 0;
}

static void lookup_across_chunks(void **state)
{
	enum { N = 45000 };
	struct fanout_engine *e = NEW_ENGINE(.workers = 1, .keep_completed = N,
					     .flags = FANOUT_NO_PIN);
	struct fanout_task t = {"r", nothing, NULL};
	struct fanout_batch b = {.tasks = &t, .ntasks = 1};
	fanout_id *ids = malloc(N * sizeof(*ids));
	char longkey[80], key[16];
	struct fanout_info info;
	size_t n = 0;

	assert_non_null(ids);
	memset(longkey, 'q', sizeof(longkey) - 1);
	longkey[sizeof(longkey) - 1] = '\0';
	for (unsigned i = 0; i < N; i++) {
		struct fanout_event *ev = NULL;

		snprintf(key, sizeof(key), "k%u", i);
		b.user = (void *)(uintptr_t)(i + 1);
		b.session_key = i % 5 == 0 ? longkey : i % 5 == 1 ? NULL : key;
		assert_int_equal(fanout_run(e, &b, &ev), 0);
		ids[i] = ev->id;
		fanout_event_free(ev);
	}
	for (unsigned i = 0; i < N; i++) {
		assert_int_equal(fanout_lookup(e, ids[i], &info), 0);
		assert_true(info.id == ids[i]);
		assert_ptr_equal(info.user, (void *)(uintptr_t)(i + 1));
		assert_int_equal(info.status, FANOUT_COMPLETED);
		assert_int_equal(info.ntasks, 1);
		if (i % 5 == 1) {
			assert_null(info.session_key);
		} else if (i % 5 == 0) {
			assert_string_equal(info.session_key, longkey);
		} else {
			snprintf(key, sizeof(key), "k%u", i);
			assert_string_equal(info.session_key, key);
		}
		/* Same slot, another generation (bits above the slot's 24). */
		assert_int_equal(fanout_lookup(e, ids[i] ^ (1ull << 30), &info),
				 -ENOENT);
	}
	assert_int_equal(fanout_list(e, NULL, 0, &n), 0);
	assert_int_equal(n, N);
	free(ids);
	fanout_destroy(e);
}

/* A child looks up its own (synchronous, possibly nested) delegation. */
struct selfcheck {
	struct fanout_engine *e;
	int rc;
	struct fanout_info info;
	bool nest;
	struct selfcheck *inner;
};

static int selfcheck_fn(struct fanout_child *c, void *arg)
{
	struct selfcheck *s = arg;

	s->rc = fanout_lookup(s->e, fanout_child_id(c), &s->info);
	if (s->nest) {
		struct fanout_task t = {"inner", selfcheck_fn, s->inner};
		struct fanout_batch b = {.tasks = &t, .ntasks = 1};
		struct fanout_event *ev = NULL;

		CHECK(fanout_run(s->e, &b, &ev) == 0);
		fanout_event_free(ev);
	}
	return 0;
}

static void lookup_sync_records(void **state)
{
	struct fanout_engine *e =
		NEW_ENGINE(.workers = 1, .flags = FANOUT_NO_PIN);
	struct selfcheck inner = {.e = e};
	struct selfcheck outer = {.e = e, .nest = true, .inner = &inner};
	struct fanout_task t[2] = {{"outer", selfcheck_fn, &outer},
				   {"other", probe_fn, &(struct probe){0}}};
	struct fanout_batch b = {.tasks = t, .ntasks = 2};
	struct fanout_event *ev = NULL;

	assert_int_equal(fanout_run(e, &b, &ev), 0);
	assert_int_equal(outer.rc, 0);
	assert_true(outer.info.id == ev->id);
	assert_false(outer.info.background);
	assert_int_equal(outer.info.depth, 1);
	assert_int_equal(outer.info.ntasks, 2);
	assert_int_equal(outer.info.status, FANOUT_RUNNING);
	assert_int_equal(inner.rc, 0);
	assert_false(inner.info.background);
	assert_int_equal(inner.info.depth, 2);
	assert_int_equal(inner.info.ntasks, 1);
	assert_int_equal(inner.info.status, FANOUT_RUNNING);
	assert_true(inner.info.id != ev->id);
	fanout_event_free(ev);
	fanout_destroy(e);
}

/* Readers race dispatches and pruning: every snapshot is sane (RCU). */
enum { RING = 64 };

struct readers {
	struct fanout_engine *e;
	atomic_ullong ids[RING];
	atomic_int stop;
	atomic_int hits;
};

static void *reader_thread(void *arg)
{
	struct readers *r = arg;
	struct fanout_info infos[16];
	unsigned k = 0;

	while (!atomic_load(&r->stop)) {
		fanout_id id = atomic_load(&r->ids[k++ % RING]);
		struct fanout_info info;

		if (id) {
			int rc = fanout_lookup(r->e, id, &info);

			CHECK(rc == 0 || rc == -ENOENT);
			if (rc == 0) {
				CHECK(info.id == id);
				CHECK(info.ntasks == 2);
				CHECK(info.ndone <= 2);
				atomic_fetch_add(&r->hits, 1);
			}
		}
		size_t n = 0;
		CHECK(fanout_list(r->e, infos, 16, &n) == 0);
		for (size_t i = 0; i < n && i < 16; i++) {
			CHECK(infos[i].ntasks == 2);
			if (i)
				CHECK(infos[i - 1].dispatched_ns >=
				      infos[i].dispatched_ns);
		}
	}
	return NULL;
}

static void lookup_concurrent_with_pruning(void **state)
{
	struct fanout_engine *e = NEW_ENGINE(.workers = 2, .keep_completed = 2,
					     .flags = FANOUT_NO_PIN);
	struct readers *r = calloc(1, sizeof(*r));
	atomic_int count = 0;
	struct fanout_task t[2] = {{"a", count_fn, &count},
				   {"b", count_fn, &count}};
	struct fanout_batch b = {.tasks = t, .ntasks = 2};
	pthread_t th[2];

	assert_non_null(r);
	r->e = e;
	for (int i = 0; i < 2; i++)
		th[i] = spawn(reader_thread, r);
	for (int i = 0; i < 400; i++) {
		fanout_id id = 0;

		assert_int_equal(fanout_dispatch(e, &b, &id), 0);
		atomic_store(&r->ids[i % RING], id);
		if (i % 8 == 7) {
			for (int j = 0; j < 8; j++) {
				struct fanout_event *ev =
					must_wait(fanout_default_sink(e));
				fanout_event_free(ev);
			}
		}
	}
	atomic_store(&r->stop, 1);
	for (int i = 0; i < 2; i++)
		join(th[i]);
	assert_int_equal(atomic_load(&count), 800);
	free(r);
	fanout_destroy(e);
}

/* ----------------------------------------------------- a delayed freer */

static struct fanout_event *one_event(struct fanout_engine *e, fanout_id *id)
{
	atomic_int n = 0;
	struct fanout_task t = {"one", count_fn, &n};
	struct fanout_batch b = {.tasks = &t, .ntasks = 1};

	assert_int_equal(fanout_dispatch(e, &b, id), 0);
	return must_wait(fanout_default_sink(e));
}

struct late_free {
	struct pause *p;
	struct fanout_event *ev;
};

static void *late_free_thread(void *arg)
{
	struct late_free *lf = arg;

	pause_mine = true;
	fanout_event_free(lf->ev);
	return NULL;
}

/*
 * An event's freer delayed just before its CAS into the kept ring (a
 * preemption there): meanwhile a newer record of the same table slot (the
 * slot cache hands it straight back) finished and entered the ring.  The
 * delayed CAS must fail: the newest finished record stays visible
 * (keep_completed 1).  When the ring held the slots' tombs, the delayed
 * CAS found the same tomb and evicted the newest record.
 */
static void kept_ring_delayed_freer(void **state)
{
	struct pause p;
	struct fanout_engine *e;
	struct fanout_info info;
	fanout_id id4, id5, id6, id7;
	struct late_free lf = {.p = &p};

	if (!pause_arm(&p, FANOUT_AT_RETIRE_CAS))
		skip(); /* a build without test points */
	e = NEW_ENGINE(.workers = 1, .keep_completed = 1);
	fanout_event_free(one_event(e, &id4)); /* the ring: R4 (slot A) */
	lf.ev = one_event(e, &id5);
	struct fanout_event *ev6 = one_event(e, &id6);
	pthread_t t = spawn(late_free_thread, &lf);
	pause_wait(&p);		/* before its CAS */
	fanout_event_free(ev6); /* R6 displaces R4; slot A to our cache */
	struct fanout_event *ev7 = one_event(e, &id7);
	fanout_event_free(ev7); /* R7, in slot A again, displaces R6 */
	assert_int_equal(fanout_lookup(e, id7, &info), 0);
	pause_go(&p);
	join(t);
	pause_done(&p);
	/* R7 is the newest finished record: kept.  R5 had R6 and R7 finish
	 * after it: gone. */
	assert_int_equal(fanout_lookup(e, id7, &info), 0);
	assert_true(info.id == id7);
	assert_int_equal(fanout_lookup(e, id5, &info), -ENOENT);
	fanout_destroy(e);
}

/* An unknown id leaves *info as it was (-ENOENT changes nothing).  With
 * keep_completed 1 and one thread, A's slot is evicted into this thread's
 * slot cache when B's event is freed, C takes it, and C's freed event
 * leaves C's tomb there: A's lookup reads that tomb.  Before the fix it
 * copied it into *info before comparing ids, so the -ENOENT came with
 * C's id, user pointer and session key in the caller's struct. */
static void lookup_unknown_leaves_info_alone(void **state)
{
	struct fanout_engine *e =
		NEW_ENGINE(.workers = 1, .flags = FANOUT_NO_PIN,
			   .spin_ns = 1000, .keep_completed = 1);
	struct fanout_info info, before;
	fanout_id a, b, c;

	a = must_run_one(e);
	b = must_run_one(e);
	c = must_run_one(e);
	assert_true(a != b && b != c && a != c);
	/* C is kept as a tomb (its event freed): it is there to be read. */
	assert_int_equal(fanout_lookup(e, c, &info), 0);
	assert_true(info.id == c);
	memset(&info, 0xa5, sizeof(info));
	memcpy(&before, &info, sizeof(info));
	assert_int_equal(fanout_lookup(e, a, &info), -ENOENT);
	assert_memory_equal(&info, &before, sizeof(info));
	assert_int_equal(fanout_lookup(e, b, &info), -ENOENT);
	assert_memory_equal(&info, &before, sizeof(info));
	fanout_destroy(e);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		TC(lookup_bad_args),
		TC(lookup_while_running_and_after),
		TC(lookup_ndone_counts_finished_children),
		TC(lookup_final_status),
		TC(list_running_and_finished_sorted),
		TC(lookup_keep_completed_prunes),
		TC(lookup_running_never_pruned),
		TC(sink_destroy_prunes_untaken),
		TC(lookup_after_event_freed),
		TC(lookup_sync_records),
		TC(lookup_concurrent_with_pruning),
		TC(lookup_tomb_background),
		TC(lookup_tomb_run),
		TC(lookup_long_key_keeps_record),
		TC(lookup_across_chunks),
		TC(kept_ring_delayed_freer),
		TC(lookup_unknown_leaves_info_alone),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
