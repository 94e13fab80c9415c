/* SPDX-License-Identifier: MIT */
/*
 * test_misuse.c - one test per row of the bad-input table in README.md: every way a caller
 * can misuse the API, and what it gets.  Test names start with the row id.
 *
 * "Refused" (see README.md, "Bad input") is checked by refused_cleanly(): the error code,
 * stats.rejected + 1, no record in fanout_list, no event, no child run.
 */
#include <dirent.h>
#include <math.h>

#include "common.h"

#include <float.h>

/* ------------------------------------------------------------- helpers */

static struct fanout_engine *eng1(void)
{
	return NEW_ENGINE(.workers = 1, .flags = FANOUT_NO_PIN,
			  .spin_ns = 1000);
}

static size_t nrecords(struct fanout_engine *e)
{
	size_t n = 12345;

	assert_int_equal(fanout_list(e, NULL, 0, &n), 0);
	return n;
}

struct snap {
	struct fanout_stats st;
	size_t nlist;
};

static struct snap snap_of(struct fanout_engine *e)
{
	struct snap s = {stats_of(e), nrecords(e)};

	return s;
}

/* After a refused call: one more rejection, nothing else changed. */
static void refused_cleanly(struct fanout_engine *e, const struct snap *before,
			    unsigned nrejected, atomic_int *ran)
{
	struct fanout_stats st = stats_of(e);

	assert_int_equal(st.rejected, before->st.rejected + nrejected);
	assert_int_equal(st.dispatched, before->st.dispatched);
	assert_int_equal(st.runs, before->st.runs);
	assert_int_equal(st.async_running, before->st.async_running);
	assert_int_equal(nrecords(e), before->nlist);
	assert_no_event(fanout_default_sink(e));
	if (ran)
		assert_int_equal(atomic_load(ran), 0);
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

/* Run @fn as the only child of a background delegation on @e and return
 * its event (the test frees it). */
static struct fanout_event *in_child(struct fanout_engine *e, fanout_fn fn,
				     void *arg)
{
	struct fanout_task t = {"probe", fn, arg};
	struct fanout_batch b = {.tasks = &t, .ntasks = 1};
	fanout_id id = 0;
	struct fanout_event *ev;

	assert_int_equal(fanout_dispatch(e, &b, &id), 0);
	ev = must_wait(fanout_default_sink(e));
	assert_true(ev->id == id);
	assert_int_equal(ev->nresults, 1);
	return ev;
}

/* ---------------------------------------------------------------- engine */

static void create_expect(const struct fanout_config *c, int want)
{
	struct fanout_engine *e = (struct fanout_engine *)&e; /* sentinel */
	struct fanout_engine *sentinel = e;
	int threads = thread_count();
	int rc = fanout_create(c, &e);

	assert_int_equal(rc, want);
	if (want) {
		assert_ptr_equal(e, sentinel);
		assert_int_equal(thread_count(), threads);
	} else {
		fanout_destroy(e);
	}
}

static void E01_create_null_out(void **state)
{
	assert_int_equal(fanout_create(NULL, NULL), -EINVAL);
	struct fanout_config c = {.workers = 1};

	assert_int_equal(fanout_create(&c, NULL), -EINVAL);
}

static void E02_create_unknown_flags(void **state)
{
	for (unsigned bit = 0; bit < 32; bit++) {
		unsigned f = 1u << bit;

		if (f & KNOWN_ENGINE_FLAGS)
			continue;
		create_expect(&(struct fanout_config){.workers = 1, .flags = f},
			      -EINVAL);
		create_expect(
			&(struct fanout_config){.workers = 1,
						.flags = FANOUT_NO_PIN | f},
			-EINVAL);
	}
}

static void E03_create_too_many_workers(void **state)
{
	create_expect(&(struct fanout_config){.workers = 1025}, -EINVAL);
	create_expect(&(struct fanout_config){.workers = UINT_MAX}, -EINVAL);
}

static void E04_create_max_tasks_too_big(void **state)
{
	create_expect(&(struct fanout_config){.workers = 1,
					      .max_tasks = (1u << 24) + 1},
		      -EINVAL);
}

static void E05_create_max_depth_too_big(void **state)
{
	create_expect(&(struct fanout_config){.workers = 1, .max_depth = 65},
		      -EINVAL);
}

static void E06_create_spin_too_long(void **state)
{
	create_expect(
		&(struct fanout_config){.workers = 1, .spin_ns = 1000000001ull},
		-EINVAL);
	create_expect(
		&(struct fanout_config){.workers = 1, .spin_ns = UINT64_MAX},
		-EINVAL);
}

static void E07_create_queue_slots_too_big(void **state)
{
	create_expect(&(struct fanout_config){.workers = 1,
					      .queue_slots = (1u << 24) + 1},
		      -EINVAL);
}

static void E08_create_max_async_too_big(void **state)
{
	create_expect(&(struct fanout_config){.workers = 1,
					      .max_async = (1u << 20) + 1},
		      -EINVAL);
}

static void E09_create_keep_too_big(void **state)
{
	create_expect(&(struct fanout_config){.workers = 1,
					      .keep_completed = (1u << 24) + 1},
		      -EINVAL);
}

static void E10_create_max_children_too_big(void **state)
{
	create_expect(&(struct fanout_config){.workers = 1,
					      .max_children = (1u << 24) + 1},
		      -EINVAL);
}

static void E11_create_documented_maxima(void **state)
{
	struct fanout_engine *e =
		NEW_ENGINE(.workers = 1, .flags = FANOUT_NO_PIN,
			   .max_tasks = 1u << 24, .max_depth = 64,
			   .spin_ns = 1000000000ull, .queue_slots = 1,
			   .max_pending = 1u << 24);
	struct fanout_event *ev =
		in_child(e, (fanout_fn)count_fn, &(atomic_int){0});

	assert_int_equal(ev->results[0].status, FANOUT_COMPLETED);
	fanout_event_free(ev);
	fanout_destroy(e);
}

static void E19_create_max_pending_too_big(void **state)
{
	create_expect(&(struct fanout_config){.workers = 1,
					      .max_pending = (1u << 24) + 1},
		      -EINVAL);
}

static void E12_shutdown_null(void **state)
{
	assert_int_equal(fanout_shutdown(NULL), -EINVAL);
}

static void E13_shutdown_twice(void **state)
{
	struct fanout_engine *e = eng1();

	assert_int_equal(fanout_shutdown(e), 0);
	assert_int_equal(fanout_shutdown(e), 0);
	fanout_destroy(e);
}

struct selfcall {
	struct fanout_engine *e, *other;
	int rc;
	atomic_int returned;
	fanout_fn inner;
};

static int shutdown_self_child(struct fanout_child *c, void *arg)
{
	struct selfcall *sc = arg;

	sc->rc = fanout_shutdown(sc->e);
	return 0;
}

/* The nested form of E14/E16: app -> fanout_run(B) -> B's child calls
 * fanout_run(A) -> A's child calls fn on B (sc->e).  One worker each, so
 * the whole chain runs on this thread; test_shutdown.c has the cross-thread
 * and deeper chains.  alarm(): a hang kills the suite instead of stalling. */
static int nested_outer_child(struct fanout_child *c, void *arg)
{
	struct selfcall *sc = arg;
	struct fanout_task t = {"inner", sc->inner, sc};
	struct fanout_batch b = {.tasks = &t, .ntasks = 1};
	struct fanout_event *ev = NULL;

	CHECK(fanout_run(sc->other, &b, &ev) == 0);
	fanout_event_free(ev);
	return 0;
}

static void nested_call(struct fanout_engine *b, fanout_fn fn,
			struct selfcall *sc)
{
	struct fanout_engine *a = eng1();
	struct fanout_task t = {"outer", nested_outer_child, sc};
	struct fanout_batch bt = {.tasks = &t, .ntasks = 1};
	struct fanout_event *ev = NULL;

	sc->e = b;
	sc->other = a;
	sc->inner = fn;
	alarm(60);
	assert_int_equal(fanout_run(b, &bt, &ev), 0);
	alarm(0);
	assert_int_equal(ev->results[0].status, FANOUT_COMPLETED);
	fanout_event_free(ev);
	fanout_destroy(a);
}

static void E14_shutdown_from_own_child(void **state)
{
	struct fanout_engine *e = eng1();
	struct selfcall sc = {.e = e};
	struct fanout_event *ev = in_child(e, shutdown_self_child, &sc);

	assert_int_equal(sc.rc, -EDEADLK);
	assert_int_equal(ev->results[0].status, FANOUT_COMPLETED);
	fanout_event_free(ev);
	/* nothing changed: still accepting */
	ev = in_child(e, (fanout_fn)count_fn, &(atomic_int){0});
	fanout_event_free(ev);
	/* from a child nested in a child of e */
	sc.rc = 1;
	nested_call(e, shutdown_self_child, &sc);
	assert_int_equal(sc.rc, -EDEADLK);
	ev = in_child(e, (fanout_fn)count_fn, &(atomic_int){0});
	fanout_event_free(ev);
	fanout_destroy(e);
}

static void E15_destroy_null(void **state)
{
	fanout_destroy(NULL);
}

static int destroy_self_child(struct fanout_child *c, void *arg)
{
	struct selfcall *sc = arg;

	fanout_destroy(sc->e); /* must do nothing */
	atomic_store(&sc->returned, 1);
	return 0;
}

static void E16_destroy_from_own_child(void **state)
{
	struct fanout_engine *e = eng1();
	struct selfcall sc = {.e = e};
	struct fanout_event *ev = in_child(e, destroy_self_child, &sc);

	assert_int_equal(atomic_load(&sc.returned), 1);
	fanout_event_free(ev);
	ev = in_child(e, (fanout_fn)count_fn, &(atomic_int){0});
	fanout_event_free(ev);
	/* from a child nested in a child of e */
	atomic_store(&sc.returned, 0);
	nested_call(e, destroy_self_child, &sc);
	assert_int_equal(atomic_load(&sc.returned), 1);
	ev = in_child(e, (fanout_fn)count_fn, &(atomic_int){0});
	fanout_event_free(ev);
	fanout_destroy(e);
}

static void E17_stats_null(void **state)
{
	struct fanout_engine *e = eng1();
	struct fanout_stats st;

	assert_int_equal(fanout_stats(NULL, &st), -EINVAL);
	assert_int_equal(fanout_stats(e, NULL), -EINVAL);
	fanout_destroy(e);
}

static void E20_worker_stats_null(void **state)
{
	struct fanout_engine *e = eng1();
	struct fanout_worker_stats ws;

	assert_int_equal(fanout_worker_stats(NULL, 0, &ws), -EINVAL);
	assert_int_equal(fanout_worker_stats(e, 0, NULL), -EINVAL);
	fanout_destroy(e);
}

static void E21_worker_stats_out_of_range(void **state)
{
	struct fanout_engine *e = eng1();
	struct fanout_worker_stats ws, before;

	memset(&ws, 0x5a, sizeof(ws));
	before = ws;
	assert_int_equal(fanout_worker_stats(e, 1, &ws), -ERANGE);
	assert_int_equal(fanout_worker_stats(e, UINT_MAX, &ws), -ERANGE);
	assert_memory_equal(&ws, &before, sizeof(ws));
	assert_int_equal(fanout_worker_stats(e, 0, &ws), 0);
	fanout_destroy(e);
}

static int shutdown_other_child(struct fanout_child *c, void *arg)
{
	struct selfcall *sc = arg;

	sc->rc = fanout_shutdown(sc->other);
	return 0;
}

static void E18_shutdown_other_engine_from_child(void **state)
{
	struct fanout_engine *a = eng1(), *b = eng1();
	struct selfcall sc = {.e = a, .other = b};
	struct fanout_event *ev = in_child(a, shutdown_other_child, &sc);
	struct fanout_task t = {"x", count_fn, &(atomic_int){0}};
	struct fanout_batch bt = {.tasks = &t, .ntasks = 1};

	assert_int_equal(sc.rc, 0);
	fanout_event_free(ev);
	assert_int_equal(fanout_dispatch(b, &bt, NULL), -ESHUTDOWN);
	fanout_destroy(b);
	fanout_destroy(a);
}

/* ------------------------------------------------------------- dispatch */

static void D01_null_engine(void **state)
{
	atomic_int ran = 0;
	struct fanout_task t = {"x", count_fn, &ran};
	struct fanout_batch b = {.tasks = &t, .ntasks = 1};
	struct fanout_event *ev = NULL;
	fanout_id id = 0;

	assert_int_equal(fanout_dispatch(NULL, &b, &id), -EINVAL);
	assert_int_equal(fanout_run(NULL, &b, &ev), -EINVAL);
	assert_int_equal(fanout_delegate(NULL, &b, &id, &ev), -EINVAL);
	assert_null(ev);
	assert_true(id == 0);
	sleep_ms(10);
	assert_int_equal(atomic_load(&ran), 0);
}

/* dispatch, run and delegate of @b must all be refused with @want. */
static void all_refuse(struct fanout_engine *e, const struct fanout_batch *b,
		       int want, atomic_int *ran)
{
	struct snap s = snap_of(e);
	/* Sentinels, not NULL/0: a refusal must leave the outputs alone. */
	struct fanout_event sentinel, *ev = &sentinel;
	fanout_id id = 777;

	assert_int_equal(fanout_dispatch(e, b, &id), want);
	refused_cleanly(e, &s, 1, ran);
	assert_true(id == 777);
	s = snap_of(e);
	assert_int_equal(fanout_run(e, b, &ev), want);
	assert_ptr_equal(ev, &sentinel);
	refused_cleanly(e, &s, 1, ran);
	s = snap_of(e);
	assert_int_equal(fanout_delegate(e, b, &id, &ev), want);
	assert_ptr_equal(ev, &sentinel);
	refused_cleanly(e, &s, 1, ran);
	assert_true(id == 777);
}

static void D02_null_batch(void **state)
{
	struct fanout_engine *e = eng1();

	all_refuse(e, NULL, -EINVAL, NULL);
	fanout_destroy(e);
}

static void D03_null_tasks(void **state)
{
	struct fanout_engine *e = eng1();
	struct fanout_batch b = {.tasks = NULL, .ntasks = 3};

	all_refuse(e, &b, -EINVAL, NULL);
	fanout_destroy(e);
}

static void D04_zero_tasks(void **state)
{
	struct fanout_engine *e = eng1();
	atomic_int ran = 0;
	struct fanout_task t = {"x", count_fn, &ran};
	struct fanout_batch b = {.tasks = &t, .ntasks = 0};

	all_refuse(e, &b, -EINVAL, &ran);
	fanout_destroy(e);
}

static void D05_task_without_fn(void **state)
{
	struct fanout_engine *e = eng1();
	atomic_int ran = 0;
	struct fanout_task t[4];
	struct fanout_batch b = {.tasks = t, .ntasks = 4};

	for (unsigned bad = 0; bad < 4; bad++) {
		for (int i = 0; i < 4; i++)
			t[i] = (struct fanout_task){"x", count_fn, &ran};
		t[bad].fn = NULL;
		all_refuse(e, &b, -EINVAL, &ran);
	}
	fanout_destroy(e);
}

static void D06_too_many_tasks(void **state)
{
	struct fanout_engine *e =
		NEW_ENGINE(.workers = 1, .flags = FANOUT_NO_PIN,
			   .max_tasks = 3);
	atomic_int ran = 0;
	struct fanout_task t[4];
	struct fanout_batch b = {.tasks = t, .ntasks = 4};

	for (int i = 0; i < 4; i++)
		t[i] = (struct fanout_task){"x", count_fn, &ran};
	all_refuse(e, &b, -E2BIG, &ran);
	b.ntasks = UINT_MAX; /* never read past max_tasks */
	all_refuse(e, &b, -E2BIG, &ran);
	b.ntasks = 3; /* the limit itself is fine */
	assert_int_equal(fanout_dispatch(e, &b, NULL), 0);
	fanout_event_free(must_wait(fanout_default_sink(e)));
	assert_int_equal(atomic_load(&ran), 3);
	fanout_destroy(e);
}

static void D07_sink_of_other_engine(void **state)
{
	struct fanout_engine *e = eng1(), *o = eng1();
	struct fanout_sink *os = NULL;
	atomic_int ran = 0;
	struct fanout_task t = {"x", count_fn, &ran};
	struct fanout_batch b = {.tasks = &t, .ntasks = 1};
	struct fanout_event *ev = NULL;
	struct snap s;
	fanout_id id = 0;

	assert_int_equal(fanout_sink_create(o, &os), 0);
	for (int i = 0; i < 2; i++) {
		b.sink = i ? os : fanout_default_sink(o);
		s = snap_of(e);
		assert_int_equal(fanout_dispatch(e, &b, &id), -EINVAL);
		refused_cleanly(e, &s, 1, &ran);
		s = snap_of(e);
		assert_int_equal(fanout_delegate(e, &b, &id, &ev), -EINVAL);
		refused_cleanly(e, &s, 1, &ran);
		assert_no_event(b.sink);
	}
	/* run ignores batch->sink */
	assert_int_equal(fanout_run(e, &b, &ev), 0);
	assert_int_equal(ev->results[0].status, FANOUT_COMPLETED);
	fanout_event_free(ev);
	assert_no_event(os);
	assert_int_equal(fanout_sink_destroy(os), 0);
	fanout_destroy(o);
	fanout_destroy(e);
}

static void D08_async_pool_full(void **state)
{
	struct fanout_engine *e =
		NEW_ENGINE(.workers = 1, .flags = FANOUT_NO_PIN,
			   .max_async = 1);
	struct tbatch *hold = tb_new(1);
	atomic_int gate = 0, ran = 0;
	struct fanout_task t = {"x", count_fn, &ran};
	struct fanout_batch b = {.tasks = &t, .ntasks = 1};
	struct fanout_event *ev = NULL;
	struct snap s;
	fanout_id id = 0, hid;
	char msg[512];

	tb_gate(hold, &gate);
	hid = must_dispatch(e, hold);
	s = snap_of(e);
	assert_int_equal(fanout_dispatch(e, &b, &id), -EBUSY);
	refused_cleanly(e, &s, 1, &ran);
	assert_true(fanout_describe_error(e, -EBUSY, msg, sizeof(msg)) > 0);
	assert_contains(msg, "max_async");
	/* delegate says so instead of a silent downgrade */
	assert_int_equal(fanout_delegate(e, &b, &id, &ev), FANOUT_INLINE_FULL);
	assert_non_null(ev);
	assert_true(id == ev->id);
	assert_int_equal(atomic_load(&ran), 1);
	fanout_event_free(ev);
	atomic_store(&gate, 1);
	ev = must_wait(fanout_default_sink(e));
	assert_true(ev->id == hid);
	fanout_event_free(ev);
	assert_no_event(fanout_default_sink(e));
	tb_free(hold);
	fanout_destroy(e);
}

static void D17_sink_at_max_pending(void **state)
{
	struct fanout_engine *e =
		NEW_ENGINE(.workers = 1, .flags = FANOUT_NO_PIN,
			   .max_pending = 2);
	struct fanout_sink *s = NULL;
	atomic_int ran = 0, dran = 0;
	struct fanout_task dt = {"x", count_fn, &dran};
	struct fanout_batch db = {.tasks = &dt, .ntasks = 1};
	struct fanout_event *ev = NULL;
	struct snap sn;
	fanout_id id = 0, ids[2];
	char msg[1024];

	/* a created sink nobody drains holds two events: full */
	assert_int_equal(fanout_sink_create(e, &s), 0);
	db.sink = s;
	for (int i = 0; i < 2; i++) {
		ids[i] = 0;
		assert_int_equal(fanout_dispatch(e, &db, &ids[i]), 0);
		wait_finished(e, ids[i]);
	}
	sn = snap_of(e);
	assert_int_equal(fanout_dispatch(e, &db, &id), -EBUSY);
	refused_cleanly(e, &sn, 1, NULL);
	assert_int_equal(atomic_load(&dran), 2);
	assert_true(fanout_describe_error(e, -EBUSY, msg, sizeof(msg)) > 0);
	assert_contains(msg, "nobody drains");
	assert_contains(msg, "max_pending=2");
	/* delegate runs inline instead, and says so */
	assert_int_equal(fanout_delegate(e, &db, &id, &ev), FANOUT_INLINE_FULL);
	assert_non_null(ev);
	assert_true(id == ev->id);
	assert_int_equal(atomic_load(&dran), 3);
	fanout_event_free(ev);
	/* the default sink has its own places */
	ev = in_child(e, (fanout_fn)count_fn, &ran);
	fanout_event_free(ev);
	/* taking an event gives its place back */
	ev = must_wait(s);
	assert_true(ev->id == ids[0]);
	fanout_event_free(ev);
	assert_int_equal(fanout_dispatch(e, &db, &id), 0);
	ev = must_wait(s);
	assert_true(ev->id == ids[1]);
	fanout_event_free(ev);
	ev = must_wait(s);
	assert_true(ev->id == id);
	fanout_event_free(ev);
	assert_no_event(s);
	assert_int_equal(fanout_sink_destroy(s), 0);
	fanout_destroy(e);
}

static void D09_ring_full(void **state)
{
	/* 4 slots = 3 usable; one worker, so each dispatch takes 1 token */
	struct fanout_engine *e =
		NEW_ENGINE(.workers = 1, .flags = FANOUT_NO_PIN,
			   .queue_slots = 4);
	struct tbatch *hold = tb_new(1);
	atomic_int gate = 0, ran = 0;
	struct fanout_task t = {"x", count_fn, &ran};
	struct fanout_batch b = {.tasks = &t, .ntasks = 1};
	struct fanout_stats st;
	struct snap s;
	int accepted = 0, rc = 0;

	tb_gate(hold, &gate);
	must_dispatch(e, hold);
	assert_true(wait_ge(&hold->probes[0].runs, 1, WAIT_MS));
	/* the worker is stuck in `hold`: fill the ring */
	for (int i = 0; i < 64; i++) {
		s = snap_of(e);
		rc = fanout_dispatch(e, &b, NULL);
		if (rc)
			break;
		accepted++;
	}
	assert_int_equal(rc, -EBUSY);
	assert_true(accepted >= 1 && accepted <= 3);
	st = stats_of(e);
	assert_int_equal(st.rejected, s.st.rejected + 1);
	assert_int_equal(st.dispatched, s.st.dispatched);
	assert_int_equal(nrecords(e), s.nlist);
	atomic_store(&gate, 1);
	for (int i = 0; i < accepted + 1; i++)
		fanout_event_free(must_wait(fanout_default_sink(e)));
	assert_no_event(fanout_default_sink(e));
	assert_int_equal(atomic_load(&ran), accepted);
	tb_free(hold);
	fanout_destroy(e);
}

struct deep {
	struct fanout_engine *e;
	atomic_int ran;
	int rd, rr, rg;
	struct fanout_event *ev;
	fanout_id id;
};

static int deep_child(struct fanout_child *c, void *arg)
{
	struct deep *d = arg;
	struct fanout_task t = {"grandchild", count_fn, &d->ran};
	struct fanout_batch b = {.tasks = &t, .ntasks = 1};

	d->rd = fanout_dispatch(d->e, &b, &d->id);
	d->rr = fanout_run(d->e, &b, &d->ev);
	d->rg = fanout_delegate(d->e, &b, &d->id, &d->ev);
	return 0;
}

static void D10_too_deep(void **state)
{
	struct fanout_engine *e =
		NEW_ENGINE(.workers = 1, .flags = FANOUT_NO_PIN,
			   .max_depth = 1);
	struct deep d = {.e = e};
	struct snap s = snap_of(e);
	struct fanout_event *ev;
	char msg[256];

	atomic_init(&d.ran, 0);
	ev = in_child(e, deep_child, &d);
	assert_int_equal(d.rd, -ELOOP);
	assert_int_equal(d.rr, -ELOOP);
	assert_int_equal(d.rg, -ELOOP);
	assert_null(d.ev);
	assert_true(d.id == 0);
	assert_int_equal(atomic_load(&d.ran), 0);
	fanout_event_free(ev);
	assert_int_equal(stats_of(e).rejected, s.st.rejected + 3);
	assert_int_equal(stats_of(e).dispatched, s.st.dispatched + 1);
	assert_true(fanout_describe_error(e, -ELOOP, msg, sizeof(msg)) > 0);
	assert_contains(msg, "max_depth");
	fanout_destroy(e);
}

static void D11_after_shutdown(void **state)
{
	struct fanout_engine *e = eng1();
	atomic_int ran = 0;
	struct fanout_task t = {"x", count_fn, &ran};
	struct fanout_batch b = {.tasks = &t, .ntasks = 1};

	assert_int_equal(fanout_shutdown(e), 0);
	all_refuse(e, &b, -ESHUTDOWN, &ran);
	fanout_destroy(e);
}

static void D12_null_id(void **state)
{
	struct fanout_engine *e = eng1();
	atomic_int ran = 0;
	struct fanout_task t = {"x", count_fn, &ran};
	struct fanout_batch b = {.tasks = &t, .ntasks = 1};
	struct fanout_event *ev = NULL;

	assert_int_equal(fanout_dispatch(e, &b, NULL), 0);
	fanout_event_free(must_wait(fanout_default_sink(e)));
	assert_int_equal(fanout_delegate(e, &b, NULL, &ev), FANOUT_BACKGROUND);
	assert_null(ev);
	fanout_event_free(must_wait(fanout_default_sink(e)));
	assert_int_equal(atomic_load(&ran), 2);
	fanout_destroy(e);
}

static void D13_null_event_out(void **state)
{
	struct fanout_engine *e = eng1();
	atomic_int ran = 0;
	struct fanout_task t = {"x", count_fn, &ran};
	struct fanout_batch b = {.tasks = &t, .ntasks = 1};
	struct snap s = snap_of(e);
	fanout_id id = 0;

	assert_int_equal(fanout_run(e, &b, NULL), -EINVAL);
	refused_cleanly(e, &s, 1, &ran);
	s = snap_of(e);
	assert_int_equal(fanout_delegate(e, &b, &id, NULL), -EINVAL);
	refused_cleanly(e, &s, 1, &ran);
	assert_true(id == 0);
	fanout_destroy(e);
}

static void D14_null_strings(void **state)
{
	struct fanout_engine *e = eng1();
	atomic_int ran = 0;
	struct fanout_task t[2] = {{NULL, count_fn, &ran},
				   {"", count_fn, &ran}};
	struct fanout_batch b = {.tasks = t, .ntasks = 2};
	struct fanout_event *ev;
	char buf[1024];

	assert_int_equal(fanout_dispatch(e, &b, NULL), 0);
	ev = must_wait(fanout_default_sink(e));
	assert_non_null(ev->results[0].goal);
	assert_string_equal(ev->results[0].goal, "");
	assert_string_equal(ev->results[1].goal, "");
	assert_null(ev->context);
	assert_null(ev->session_key);
	assert_null(ev->user);
	assert_true(fanout_format(ev, buf, sizeof(buf)) > 0);
	assert_true(fanout_event_json(ev, buf, sizeof(buf)) > 0);
	assert_contains(buf, "\"context\":null");
	fanout_event_free(ev);
	fanout_destroy(e);
}

static void D15_caller_reuses_memory(void **state)
{
	struct fanout_engine *e = eng1();
	struct tbatch *tb = tb_new(2);
	atomic_int gate = 0;
	char *ctx = strdup("the context"), *key = strdup("the key");
	struct fanout_event *ev;
	void *user = &gate;

	tb_gate(tb, &gate);
	tb->b.context = ctx;
	tb->b.session_key = key;
	tb->b.user = user;
	must_dispatch(e, tb);
	/* scribble over and free everything the batch pointed to */
	memset(ctx, 'X', strlen(ctx));
	memset(key, 'Y', strlen(key));
	free(ctx);
	free(key);
	strcpy(tb->goals[0], "overwritten");
	tb->tasks[0].goal = "elsewhere";
	tb->tasks[1].fn = NULL;
	atomic_store(&gate, 1);
	ev = must_wait(fanout_default_sink(e));
	assert_string_equal(ev->context, "the context");
	assert_string_equal(ev->session_key, "the key");
	assert_ptr_equal(ev->user, user);
	assert_string_equal(ev->results[0].goal, "task-0");
	assert_string_equal(ev->results[1].goal, "task-1");
	assert_int_equal(ev->ncompleted, 2);
	fanout_event_free(ev);
	tb_free(tb);
	fanout_destroy(e);
}

static void D18_batch_unknown_flags(void **state)
{
	struct fanout_engine *e = eng1();
	atomic_int ran = 0;
	struct fanout_task t[2] = {{"a", count_fn, &ran},
				   {"b", count_fn, &ran}};
	struct fanout_batch b = {.tasks = t, .ntasks = 2};
	const unsigned bad[] = {0x2, 0x80000000u, FANOUT_BORROW_TASKS | 0x4,
				~0u};

	for (unsigned i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		b.flags = bad[i];
		all_refuse(e, &b, -EINVAL, &ran);
	}
	b.flags = FANOUT_BORROW_TASKS; /* the known bit is accepted */
	assert_int_equal(fanout_dispatch(e, &b, NULL), 0);
	fanout_event_free(must_wait(fanout_default_sink(e)));
	assert_int_equal(atomic_load(&ran), 2);
	fanout_destroy(e);
}

static void D19_borrowed_tasks(void **state)
{
	struct fanout_engine *e = eng1();
	struct tbatch *tb = tb_new(2);
	atomic_int gate = 0;
	char *ctx = strdup("the context"), *key = strdup("the key");
	struct fanout_event *ev;

	tb_gate(tb, &gate);
	tb->b.context = ctx;
	tb->b.session_key = key;
	tb->b.flags = FANOUT_BORROW_TASKS;
	must_dispatch(e, tb);
	/* context and session_key are still copies */
	memset(ctx, 'X', strlen(ctx));
	free(ctx);
	free(key);
	atomic_store(&gate, 1);
	ev = must_wait(fanout_default_sink(e));
	assert_string_equal(ev->context, "the context");
	assert_string_equal(ev->session_key, "the key");
	/* the goals are the caller's own strings, kept until the free */
	assert_ptr_equal(ev->results[0].goal, tb->goals[0]);
	assert_ptr_equal(ev->results[1].goal, tb->goals[1]);
	assert_int_equal(ev->ncompleted, 2);
	fanout_event_free(ev);
	tb_free(tb);
	fanout_destroy(e);
}

static int delegate_inside(struct fanout_child *c, void *arg)
{
	struct deep *d = arg;
	struct fanout_task t = {"grandchild", count_fn, &d->ran};
	struct fanout_batch b = {.tasks = &t, .ntasks = 1};

	d->rg = fanout_delegate(d->e, &b, &d->id, &d->ev);
	return 0;
}

static void D16_delegate_inside_child_is_inline(void **state)
{
	struct fanout_engine *e = eng1();
	struct deep d = {.e = e};
	struct fanout_event *ev;

	atomic_init(&d.ran, 0);
	ev = in_child(e, delegate_inside, &d);
	assert_int_equal(d.rg, FANOUT_INLINE);
	assert_non_null(d.ev);
	assert_true(d.id == d.ev->id);
	assert_int_equal(atomic_load(&d.ran), 1);
	fanout_event_free(d.ev);
	fanout_event_free(ev);
	assert_no_event(fanout_default_sink(e));
	fanout_destroy(e);
}

/* --------------------------------------------------------------- cancel */

static void C01_cancel_null_engine(void **state)
{
	assert_int_equal(fanout_cancel(NULL, 1, FANOUT_CANCEL_PENDING),
			 -EINVAL);
}

static void C02_cancel_id_zero(void **state)
{
	struct fanout_engine *e = eng1();

	assert_int_equal(fanout_cancel(e, 0, FANOUT_CANCEL_PENDING), -EINVAL);
	fanout_destroy(e);
}

static void C03_cancel_bad_how(void **state)
{
	struct fanout_engine *e = eng1();
	struct tbatch *tb = tb_new(2);
	atomic_int gate = 0;
	struct fanout_info info;
	struct fanout_event *ev;
	fanout_id id;
	static const unsigned bad[] = {0, 0x4, 0x8, 0x5, ~0u};

	tb_gate(tb, &gate);
	id = must_dispatch(e, tb);
	for (unsigned i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		assert_int_equal(fanout_cancel(e, id, bad[i]), -EINVAL);
	assert_int_equal(fanout_lookup(e, id, &info), 0);
	assert_false(info.cancelled);
	atomic_store(&gate, 1);
	ev = must_wait(fanout_default_sink(e));
	assert_false(ev->cancelled);
	check_all_completed(ev, tb);
	fanout_event_free(ev);
	tb_free(tb);
	fanout_destroy(e);
}

static void C04_cancel_unknown(void **state)
{
	struct fanout_engine *e = eng1();

	assert_int_equal(fanout_cancel(e, 0x1234567ull, FANOUT_CANCEL_PENDING),
			 -ENOENT);
	assert_int_equal(fanout_cancel(e, ~0ull, FANOUT_CANCEL_INTERRUPT),
			 -ENOENT);
	fanout_destroy(e);
}

static void C05_cancel_finished(void **state)
{
	struct fanout_engine *e = eng1();
	struct tbatch *tb = tb_new(2);
	struct fanout_event *ev;
	struct fanout_info info;
	fanout_id id = must_dispatch(e, tb);

	ev = must_wait(fanout_default_sink(e));
	assert_int_equal(fanout_cancel(e, id, FANOUT_CANCEL_PENDING),
			 -EALREADY);
	assert_int_equal(fanout_cancel(e, id, FANOUT_CANCEL_INTERRUPT),
			 -EALREADY);
	check_all_completed(ev, tb); /* unchanged, cancelled false */
	assert_int_equal(fanout_lookup(e, id, &info), 0);
	assert_int_equal(info.status, FANOUT_COMPLETED);
	fanout_event_free(ev);
	assert_no_event(fanout_default_sink(e));
	tb_free(tb);
	fanout_destroy(e);
}

static void C06_cancel_twice(void **state)
{
	struct fanout_engine *e = eng1();
	struct tbatch *tb = tb_new(3);
	atomic_int gate = 0;
	struct fanout_event *ev;
	fanout_id id;

	tb_gate(tb, &gate);
	id = must_dispatch(e, tb);
	assert_true(wait_ge(&tb->probes[0].runs, 1, WAIT_MS));
	assert_int_equal(fanout_cancel(e, id, FANOUT_CANCEL_PENDING), 0);
	assert_int_equal(fanout_cancel(e, id, FANOUT_CANCEL_INTERRUPT), 0);
	atomic_store(&gate, 1);
	ev = must_wait(fanout_default_sink(e));
	assert_true(ev->id == id);
	assert_true(ev->cancelled);
	assert_int_equal(ev->nresults, 3);
	assert_int_equal(tb_runs(tb), 1); /* one started, two never did */
	assert_int_equal(ev->results[1].status, FANOUT_INTERRUPTED);
	assert_int_equal(ev->results[2].status, FANOUT_INTERRUPTED);
	fanout_event_free(ev);
	assert_no_event(fanout_default_sink(e));
	tb_free(tb);
	fanout_destroy(e);
}

static void C07_cancel_pruned(void **state)
{
	struct fanout_engine *e =
		NEW_ENGINE(.workers = 1, .flags = FANOUT_NO_PIN,
			   .keep_completed = 1);
	struct tbatch *tb = tb_new(1);
	struct fanout_info info;
	fanout_id first = must_dispatch(e, tb);

	fanout_event_free(must_wait(fanout_default_sink(e)));
	for (int i = 0; i < 3; i++) {
		must_dispatch(e, tb);
		fanout_event_free(must_wait(fanout_default_sink(e)));
	}
	assert_int_equal(fanout_lookup(e, first, &info), -ENOENT);
	assert_int_equal(fanout_cancel(e, first, FANOUT_CANCEL_INTERRUPT),
			 -ENOENT);
	tb_free(tb);
	fanout_destroy(e);
}

static void C08_cancel_id_of_other_engine(void **state)
{
	struct fanout_engine *e = eng1(), *o = eng1();
	struct tbatch *tb = tb_new(1);
	atomic_int gate = 0;
	fanout_id id;

	tb_gate(tb, &gate);
	id = must_dispatch(o, tb);
	/* e has issued no id at all */
	assert_int_equal(fanout_cancel(e, id, FANOUT_CANCEL_INTERRUPT),
			 -ENOENT);
	atomic_store(&gate, 1);
	fanout_event_free(must_wait(fanout_default_sink(o)));
	tb_free(tb);
	fanout_destroy(o);
	fanout_destroy(e);
}

/* ---------------------------------------------------------- lookup/list */

static void L01_lookup_bad_args(void **state)
{
	struct fanout_engine *e = eng1();
	struct fanout_info info;

	assert_int_equal(fanout_lookup(NULL, 1, &info), -EINVAL);
	assert_int_equal(fanout_lookup(e, 1, NULL), -EINVAL);
	assert_int_equal(fanout_lookup(e, 0, &info), -EINVAL);
	fanout_destroy(e);
}

static void L02_lookup_unknown(void **state)
{
	struct fanout_engine *e = eng1();
	struct fanout_info info;

	assert_int_equal(fanout_lookup(e, 42, &info), -ENOENT);
	fanout_destroy(e);
}

static void L03_list_null(void **state)
{
	struct fanout_engine *e = eng1();
	struct fanout_info infos[2];
	size_t n;

	assert_int_equal(fanout_list(NULL, infos, 2, &n), -EINVAL);
	assert_int_equal(fanout_list(e, infos, 2, NULL), -EINVAL);
	fanout_destroy(e);
}

static void L04_list_null_infos_with_cap(void **state)
{
	struct fanout_engine *e = eng1();
	size_t n = 7;

	assert_int_equal(fanout_list(e, NULL, 1, &n), -EINVAL);
	fanout_destroy(e);
}

static void L05_list_count_only(void **state)
{
	struct fanout_engine *e = eng1();
	struct tbatch *tb = tb_new(1);
	size_t n = 99;

	assert_int_equal(fanout_list(e, NULL, 0, &n), 0);
	assert_int_equal(n, 0);
	for (int i = 0; i < 3; i++) {
		must_dispatch(e, tb);
		fanout_event_free(must_wait(fanout_default_sink(e)));
	}
	assert_int_equal(fanout_list(e, NULL, 0, &n), 0);
	assert_int_equal(n, 3);
	tb_free(tb);
	fanout_destroy(e);
}

static void L06_list_cap_too_small(void **state)
{
	struct fanout_engine *e = eng1();
	struct tbatch *tb = tb_new(1);
	struct fanout_info infos[4];
	fanout_id ids[5];
	size_t n = 0;

	for (int i = 0; i < 5; i++) {
		ids[i] = must_dispatch(e, tb);
		fanout_event_free(must_wait(fanout_default_sink(e)));
	}
	memset(infos, 0xab, sizeof(infos));
	assert_int_equal(fanout_list(e, infos, 2, &n), 0);
	assert_int_equal(n, 5);
	/* the newest two, newest first; the rest untouched */
	assert_true(infos[0].id == ids[4]);
	assert_true(infos[1].id == ids[3]);
	for (size_t i = 0; i < sizeof(infos[2]) * 2; i++)
		assert_int_equal(((unsigned char *)&infos[2])[i], 0xab);
	tb_free(tb);
	fanout_destroy(e);
}

/* -------------------------------------------------------- inside a child */

#define BIG (16u << 20)

struct kctx {
	int rcs[16];
	char *big;
	struct fanout_child *self;
};

static void K01_interrupted_null(void **state)
{
	assert_false(fanout_interrupted(NULL));
}

static int k02_child(struct fanout_child *c, void *arg)
{
	struct kctx *k = arg;

	k->rcs[0] = fanout_set_summary(c, "keep", 4);
	k->rcs[1] = fanout_set_summary(NULL, "x", 1);
	k->rcs[2] = fanout_set_summary(c, NULL, 3);
	k->rcs[3] = fanout_set_summary(c, k->big, (size_t)BIG + 1);
	return 0;
}

static void K02_set_summary_bad(void **state)
{
	struct fanout_engine *e = eng1();
	struct kctx k = {.big = malloc((size_t)BIG + 1)};
	struct fanout_event *ev;

	assert_non_null(k.big);
	memset(k.big, 'z', (size_t)BIG + 1);
	ev = in_child(e, k02_child, &k);
	assert_int_equal(k.rcs[0], 0);
	assert_int_equal(k.rcs[1], -EINVAL);
	assert_int_equal(k.rcs[2], -EINVAL);
	assert_int_equal(k.rcs[3], -EINVAL);
	assert_string_equal(ev->results[0].summary, "keep");
	fanout_event_free(ev);
	free(k.big);
	fanout_destroy(e);
}

static int k03_child(struct fanout_child *c, void *arg)
{
	struct kctx *k = arg;

	k->rcs[0] = fanout_set_summary(c, NULL, 0);
	return 0;
}

static void K03_set_summary_empty(void **state)
{
	struct fanout_engine *e = eng1();
	struct kctx k = {.rcs = {1}};
	struct fanout_event *ev = in_child(e, k03_child, &k);

	assert_int_equal(k.rcs[0], 0);
	assert_non_null(ev->results[0].summary);
	assert_string_equal(ev->results[0].summary, "");
	fanout_event_free(ev);
	fanout_destroy(e);
}

static int k04_child(struct fanout_child *c, void *arg)
{
	struct kctx *k = arg;

	k->rcs[0] = fanout_set_error(c, "keep");
	k->rcs[1] = fanout_set_error(NULL, "x");
	k->rcs[2] = fanout_set_error(c, NULL);
	k->rcs[3] = fanout_set_error(c, k->big);
	return -EIO;
}

static void K04_set_error_bad(void **state)
{
	struct fanout_engine *e = eng1();
	struct kctx k = {.big = malloc((size_t)BIG + 2)};
	struct fanout_event *ev;

	assert_non_null(k.big);
	memset(k.big, 'e', (size_t)BIG + 1);
	k.big[BIG + 1] = '\0';
	ev = in_child(e, k04_child, &k);
	assert_int_equal(k.rcs[0], 0);
	assert_int_equal(k.rcs[1], -EINVAL);
	assert_int_equal(k.rcs[2], -EINVAL);
	assert_int_equal(k.rcs[3], -EINVAL);
	assert_int_equal(ev->results[0].status, FANOUT_ERROR);
	assert_string_equal(ev->results[0].error, "keep");
	fanout_event_free(ev);
	free(k.big);
	fanout_destroy(e);
}

static int k05_child(struct fanout_child *c, void *arg)
{
	struct kctx *k = arg;

	k->rcs[0] = fanout_add_cost(c, 1.5);
	k->rcs[1] = fanout_add_cost(NULL, 1.0);
	k->rcs[2] = fanout_add_cost(c, NAN);
	k->rcs[3] = fanout_add_cost(c, -1.0);
	k->rcs[4] = fanout_add_cost(c, INFINITY);
	k->rcs[5] = fanout_add_cost(c, -INFINITY);
	/* finite values whose sum is not: the second is refused */
	k->rcs[6] = fanout_add_cost(c, DBL_MAX);
	k->rcs[7] = fanout_add_cost(c, DBL_MAX);
	return 0;
}

static void K05_add_cost_bad(void **state)
{
	struct fanout_engine *e = eng1();
	struct kctx k = {.rcs = {1}};
	struct fanout_event *ev = in_child(e, k05_child, &k);

	assert_int_equal(k.rcs[0], 0);
	for (int i = 1; i <= 5; i++)
		assert_int_equal(k.rcs[i], -EINVAL);
	assert_int_equal(k.rcs[6], 0);
	assert_int_equal(k.rcs[7], -EINVAL);
	assert_true(ev->results[0].cost == 1.5 + DBL_MAX); /* == DBL_MAX */
	assert_true(ev->cost == ev->results[0].cost);
	fanout_event_free(ev);
	fanout_destroy(e);
}

static void K06_child_getters_null(void **state)
{
	assert_int_equal(fanout_child_index(NULL), 0);
	assert_int_equal(fanout_child_depth(NULL), 0);
	assert_true(fanout_child_id(NULL) == 0);
}

static void K07_current_child_outside(void **state)
{
	struct fanout_engine *e = eng1();
	struct fanout_event *ev;

	assert_null(fanout_current_child());
	ev = in_child(e, (fanout_fn)count_fn, &(atomic_int){0});
	assert_null(fanout_current_child()); /* still none on this thread */
	fanout_event_free(ev);
	fanout_destroy(e);
}

static int ret_arg(struct fanout_child *c, void *arg)
{
	return (int)(intptr_t)arg;
}

static void K08_positive_return(void **state)
{
	struct fanout_engine *e = eng1();
	struct fanout_event *ev = in_child(e, ret_arg, (void *)(intptr_t)7);

	assert_int_equal(ev->results[0].status, FANOUT_ERROR);
	assert_int_equal(ev->results[0].code, 7);
	assert_non_null(ev->results[0].error);
	assert_contains(ev->results[0].error, "positive");
	assert_int_equal(ev->status, FANOUT_ERROR);
	fanout_event_free(ev);
	fanout_destroy(e);
}

static void K09_ecanceled_uncancelled(void **state)
{
	struct fanout_engine *e = eng1();
	struct fanout_event *ev =
		in_child(e, ret_arg, (void *)(intptr_t)-ECANCELED);

	assert_int_equal(ev->results[0].status, FANOUT_INTERRUPTED);
	assert_int_equal(ev->results[0].code, -ECANCELED);
	assert_int_equal(ev->status, FANOUT_INTERRUPTED);
	assert_false(ev->cancelled);
	fanout_event_free(ev);
	fanout_destroy(e);
}

static int k10_child(struct fanout_child *c, void *arg)
{
	CHECK(fanout_set_error(c, "never mind") == 0);
	return 0;
}

static void K10_error_then_success(void **state)
{
	struct fanout_engine *e = eng1();
	struct fanout_event *ev = in_child(e, k10_child, NULL);

	assert_int_equal(ev->results[0].status, FANOUT_COMPLETED);
	assert_null(ev->results[0].error);
	assert_null(ev->error);
	fanout_event_free(ev);
	fanout_destroy(e);
}

static void K11_ignores_interrupt(void **state)
{
	struct fanout_engine *e = eng1();
	struct tbatch *tb = tb_new(1);
	atomic_int gate = 0;
	struct fanout_event *ev;
	fanout_id id;

	tb_gate(tb, &gate);
	id = must_dispatch(e, tb);
	assert_true(wait_ge(&tb->probes[0].runs, 1, WAIT_MS));
	assert_int_equal(fanout_cancel(e, id, FANOUT_CANCEL_INTERRUPT), 0);
	atomic_store(&gate, 1);
	ev = must_wait(fanout_default_sink(e));
	assert_true(ev->cancelled);
	assert_int_equal(ev->results[0].status, FANOUT_COMPLETED);
	assert_int_equal(ev->status, FANOUT_COMPLETED);
	assert_true(tb->probes[0].interrupted_seen);
	fanout_event_free(ev);
	tb_free(tb);
	fanout_destroy(e);
}

static int k12_child(struct fanout_child *c, void *arg)
{
	CHECK(fanout_set_summary(c, "first", 5) == 0);
	CHECK(fanout_set_summary(c, "second!", 6) == 0);
	return 0;
}

static void K12_summary_twice(void **state)
{
	struct fanout_engine *e = eng1();
	struct fanout_event *ev = in_child(e, k12_child, NULL);

	assert_string_equal(ev->results[0].summary, "second");
	fanout_event_free(ev);
	fanout_destroy(e);
}

/* ---------------------------------------------------------------- sinks */

static void S01_sink_create_null(void **state)
{
	struct fanout_engine *e = eng1();
	struct fanout_sink *s = NULL;

	assert_int_equal(fanout_sink_create(NULL, &s), -EINVAL);
	assert_null(s);
	assert_int_equal(fanout_sink_create(e, NULL), -EINVAL);
	fanout_destroy(e);
}

static void S02_sink_create_after_shutdown(void **state)
{
	struct fanout_engine *e = eng1();
	struct fanout_sink *s = NULL;

	assert_int_equal(fanout_shutdown(e), 0);
	assert_int_equal(fanout_sink_create(e, &s), -ESHUTDOWN);
	assert_null(s);
	fanout_destroy(e);
}

static void S03_sink_destroy_null(void **state)
{
	assert_int_equal(fanout_sink_destroy(NULL), -EINVAL);
}

static void S04_sink_destroy_default(void **state)
{
	struct fanout_engine *e = eng1();
	struct fanout_event *ev;

	assert_int_equal(fanout_sink_destroy(fanout_default_sink(e)), -EINVAL);
	ev = in_child(e, (fanout_fn)count_fn, &(atomic_int){0}); /* works */
	fanout_event_free(ev);
	fanout_destroy(e);
}

static void S05_sink_destroy_pending(void **state)
{
	struct fanout_engine *e = eng1();
	struct fanout_sink *s = NULL;
	struct tbatch *tb = tb_new(1);
	atomic_int gate = 0;
	struct fanout_event *ev;
	fanout_id id;

	assert_int_equal(fanout_sink_create(e, &s), 0);
	tb_gate(tb, &gate);
	tb->b.sink = s;
	id = must_dispatch(e, tb);
	assert_int_equal(fanout_sink_destroy(s), -EBUSY);
	assert_int_equal(fanout_sink_destroy(s), -EBUSY);
	atomic_store(&gate, 1);
	ev = must_wait(s);
	assert_true(ev->id == id);
	fanout_event_free(ev);
	assert_int_equal(fanout_sink_destroy(s), 0);
	/* an untaken event already waiting does not make it destroyable */
	struct tbatch *quick = tb_new(1);

	assert_int_equal(fanout_sink_create(e, &s), 0);
	quick->b.sink = s;
	tb->b.sink = s;
	wait_finished(e, must_dispatch(e, quick));
	atomic_store(&gate, 0);
	id = must_dispatch(e, tb);
	assert_int_equal(fanout_sink_destroy(s), -EBUSY);
	atomic_store(&gate, 1);
	wait_finished(e, id);
	assert_int_equal(fanout_sink_destroy(s), 0); /* frees both events */
	tb_free(quick);
	tb_free(tb);
	fanout_destroy(e);
}

static void S06_sink_destroy_undrained(void **state)
{
	struct fanout_engine *e = eng1();
	struct fanout_sink *s = NULL;
	struct tbatch *tb = tb_new(2);
	fanout_id ids[3];

	assert_int_equal(fanout_sink_create(e, &s), 0);
	tb->b.sink = s;
	for (int i = 0; i < 3; i++) {
		ids[i] = must_dispatch(e, tb);
		wait_finished(e, ids[i]); /* its event sits in s */
	}
	assert_int_equal(fanout_sink_destroy(s), 0); /* LSan: freed */
	tb_free(tb);
	fanout_destroy(e);
}

static void S07_default_sink_null(void **state)
{
	assert_null(fanout_default_sink(NULL));
}

static void S08_poll_null(void **state)
{
	struct fanout_engine *e = eng1();
	struct fanout_event *ev = NULL;

	assert_int_equal(fanout_poll(NULL, &ev), -EINVAL);
	assert_int_equal(fanout_poll(fanout_default_sink(e), NULL), -EINVAL);
	fanout_destroy(e);
}

static void S09_poll_empty(void **state)
{
	struct fanout_engine *e = eng1();
	struct fanout_event *ev = NULL;

	assert_int_equal(fanout_poll(fanout_default_sink(e), &ev), -EAGAIN);
	assert_null(ev);
	fanout_destroy(e);
}

static void S10_wait_null(void **state)
{
	struct fanout_engine *e = eng1();
	struct fanout_event *ev = NULL;

	assert_int_equal(fanout_wait(NULL, &ev, 10), -EINVAL);
	assert_int_equal(fanout_wait(fanout_default_sink(e), NULL, 10),
			 -EINVAL);
	assert_int_equal(fanout_wait(NULL, &ev, -1), -EINVAL);
	fanout_destroy(e);
}

static void S11_wait_empty(void **state)
{
	struct fanout_engine *e = eng1();
	struct fanout_event *ev = NULL;

	assert_int_equal(fanout_wait(fanout_default_sink(e), &ev, 5),
			 -ETIMEDOUT);
	assert_int_equal(fanout_wait(fanout_default_sink(e), &ev, 0), -EAGAIN);
	assert_null(ev);
	fanout_destroy(e);
}

struct second {
	struct fanout_sink *s;
	atomic_int entering;
	int rc;
	struct fanout_event *ev;
};

static void *first_consumer(void *arg)
{
	struct second *sc = arg;

	atomic_store(&sc->entering, 1);
	/* the main thread's probes may hold the sink for a moment too */
	while ((sc->rc = fanout_wait(sc->s, &sc->ev, WAIT_MS)) == -EBUSY)
		sleep_us(50);
	return NULL;
}

static void S12_second_consumer(void **state)
{
	struct fanout_engine *e = eng1();
	struct second sc = {.s = fanout_default_sink(e)};
	struct tbatch *tb = tb_new(1);
	struct fanout_event *ev = NULL;
	pthread_t t;
	uint64_t end;
	int rc, busy = 0;
	fanout_id id;

	t = spawn(first_consumer, &sc);
	assert_true(wait_flag(&sc.entering, WAIT_MS));
	/* once the first is inside fanout_wait, we get -EBUSY */
	end = mono_ms() + WAIT_MS;
	while (!busy && mono_ms() < end) {
		rc = fanout_poll(sc.s, &ev);
		assert_true(rc == -EAGAIN || rc == -EBUSY);
		busy = rc == -EBUSY;
		rc = fanout_wait(sc.s, &ev, 1);
		assert_true(rc == -ETIMEDOUT || rc == -EBUSY);
		busy |= rc == -EBUSY;
		sleep_us(500);
	}
	assert_true(busy);
	id = must_dispatch(e, tb);
	join(t);
	/* the first consumer got it; nothing was taken by the refused calls */
	assert_int_equal(sc.rc, 0);
	assert_true(sc.ev->id == id);
	fanout_event_free(sc.ev);
	assert_no_event(sc.s);
	tb_free(tb);
	fanout_destroy(e);
}

static void S13_sink_fd_null(void **state)
{
	assert_int_equal(fanout_sink_fd(NULL), -EINVAL);
}

static void S14_event_free_null(void **state)
{
	fanout_event_free(NULL);
}

static void S15_destroy_with_undrained_events(void **state)
{
	struct fanout_engine *e = eng1();
	struct fanout_sink *s[2] = {NULL, NULL};
	struct tbatch *tb = tb_new(3);
	fanout_id id;

	for (int i = 0; i < 2; i++)
		assert_int_equal(fanout_sink_create(e, &s[i]), 0);
	for (int i = 0; i < 6; i++) {
		tb->b.sink = i % 3 == 2 ? NULL : s[i % 3];
		id = must_dispatch(e, tb);
		wait_finished(e, id);
	}
	(void)fanout_sink_fd(s[0]); /* an fd in use, too */
	fanout_destroy(e);	    /* LSan: every event and sink freed */
	tb_free(tb);
}

static void S16_sink_destroy_after_shutdown(void **state)
{
	struct fanout_engine *e = eng1();
	struct fanout_sink *s = NULL;
	struct tbatch *tb = tb_new(1);

	assert_int_equal(fanout_sink_create(e, &s), 0);
	tb->b.sink = s;
	must_dispatch(e, tb);
	assert_int_equal(fanout_shutdown(e), 0);
	assert_int_equal(fanout_sink_destroy(s), 0); /* event freed with it */
	tb_free(tb);
	fanout_destroy(e);
}

/* ----------------------------------------------------------- formatting */

static struct fanout_event *some_event(struct fanout_engine *e)
{
	struct tbatch *tb = tb_new(3);
	struct fanout_event *ev;

	tb->probes[0].summary = "line one\nline two";
	tb->probes[1].ret = -EIO;
	tb->probes[1].error = "broke \"badly\"\n";
	tb->b.context = "ctx";
	tb->b.session_key = "sess";
	must_dispatch(e, tb);
	ev = must_wait(fanout_default_sink(e));
	tb_free(tb);
	return ev;
}

static void F01_format_null_event(void **state)
{
	char buf[64];

	assert_int_equal(fanout_format(NULL, buf, sizeof(buf)), -EINVAL);
	assert_int_equal(fanout_event_json(NULL, buf, sizeof(buf)), -EINVAL);
	assert_int_equal(fanout_format(NULL, NULL, 0), -EINVAL);
}

static void F02_format_null_buf_with_len(void **state)
{
	struct fanout_engine *e = eng1();
	struct fanout_event *ev = some_event(e);

	assert_int_equal(fanout_format(ev, NULL, 5), -EINVAL);
	assert_int_equal(fanout_event_json(ev, NULL, 5), -EINVAL);
	fanout_event_free(ev);
	fanout_destroy(e);
}

static void F03_format_length_only(void **state)
{
	struct fanout_engine *e = eng1();
	struct fanout_event *ev = some_event(e);
	int n = fanout_format(ev, NULL, 0), j = fanout_event_json(ev, NULL, 0);
	char *buf = malloc((size_t)(n > j ? n : j) + 1);

	assert_true(n > 0 && j > 0);
	assert_int_equal(fanout_format(ev, buf, (size_t)n + 1), n);
	assert_int_equal((int)strlen(buf), n);
	assert_int_equal(fanout_event_json(ev, buf, (size_t)j + 1), j);
	assert_int_equal((int)strlen(buf), j);
	free(buf);
	fanout_event_free(ev);
	fanout_destroy(e);
}

static void F04_format_small_buffers(void **state)
{
	struct fanout_engine *e = eng1();
	struct fanout_event *ev = some_event(e);
	int need[2] = {fanout_format(ev, NULL, 0),
		       fanout_event_json(ev, NULL, 0)};

	for (int which = 0; which < 2; which++) {
		size_t lens[] = {1, 2, 10, (size_t)need[which]};

		for (unsigned i = 0; i < 4; i++) {
			/* exactly len bytes on the heap: ASan sees an overrun */
			char *buf = malloc(lens[i]);
			int rc = which ? fanout_event_json(ev, buf, lens[i]) :
					 fanout_format(ev, buf, lens[i]);

			assert_int_equal(rc, need[which]);
			assert_int_equal(strlen(buf), lens[i] - 1);
			free(buf);
		}
	}
	fanout_event_free(ev);
	fanout_destroy(e);
}

static void F05_strerror_any(void **state)
{
	static const int codes[] = {0,	     1,		  9999,	   -9999,
				    INT_MAX, INT_MIN + 1, -EINVAL, EINVAL,
				    -EBUSY,  EBUSY};

	for (unsigned i = 0; i < sizeof(codes) / sizeof(codes[0]); i++)
		assert_non_null(fanout_strerror(codes[i]));
	assert_string_equal(fanout_strerror(EBUSY), fanout_strerror(-EBUSY));
	assert_string_equal(fanout_strerror(ELOOP), fanout_strerror(-ELOOP));
	assert_contains(fanout_strerror(-9999), "unknown");
	assert_non_null(fanout_strerror(INT_MIN));
}

static void F06_describe_error_bad(void **state)
{
	struct fanout_engine *e = eng1();
	char buf[16];
	int n;

	assert_int_equal(fanout_describe_error(NULL, -EBUSY, buf, sizeof(buf)),
			 -EINVAL);
	assert_int_equal(fanout_describe_error(e, -EBUSY, NULL, 4), -EINVAL);
	n = fanout_describe_error(e, -EBUSY, NULL, 0);
	assert_true(n > (int)sizeof(buf));
	assert_int_equal(fanout_describe_error(e, -EBUSY, buf, sizeof(buf)), n);
	assert_int_equal(strlen(buf), sizeof(buf) - 1);
	fanout_destroy(e);
}

static void F07_status_name_out_of_range(void **state)
{
	assert_string_equal(fanout_status_name((enum fanout_status)99),
			    "unknown");
	assert_string_equal(fanout_status_name((enum fanout_status) - 1),
			    "unknown");
}

#define R(f) TC(f)

int main(void)
{
	const struct CMUnitTest tests[] = {
		R(E01_create_null_out),
		R(E02_create_unknown_flags),
		R(E03_create_too_many_workers),
		R(E04_create_max_tasks_too_big),
		R(E05_create_max_depth_too_big),
		R(E06_create_spin_too_long),
		R(E07_create_queue_slots_too_big),
		R(E08_create_max_async_too_big),
		R(E09_create_keep_too_big),
		R(E10_create_max_children_too_big),
		R(E11_create_documented_maxima),
		R(E12_shutdown_null),
		R(E13_shutdown_twice),
		R(E14_shutdown_from_own_child),
		R(E15_destroy_null),
		R(E16_destroy_from_own_child),
		R(E17_stats_null),
		R(E18_shutdown_other_engine_from_child),
		R(E19_create_max_pending_too_big),
		R(E20_worker_stats_null),
		R(E21_worker_stats_out_of_range),
		R(D01_null_engine),
		R(D02_null_batch),
		R(D03_null_tasks),
		R(D04_zero_tasks),
		R(D05_task_without_fn),
		R(D06_too_many_tasks),
		R(D07_sink_of_other_engine),
		R(D08_async_pool_full),
		R(D09_ring_full),
		R(D10_too_deep),
		R(D11_after_shutdown),
		R(D12_null_id),
		R(D13_null_event_out),
		R(D14_null_strings),
		R(D15_caller_reuses_memory),
		R(D16_delegate_inside_child_is_inline),
		R(D17_sink_at_max_pending),
		R(D18_batch_unknown_flags),
		R(D19_borrowed_tasks),
		R(C01_cancel_null_engine),
		R(C02_cancel_id_zero),
		R(C03_cancel_bad_how),
		R(C04_cancel_unknown),
		R(C05_cancel_finished),
		R(C06_cancel_twice),
		R(C07_cancel_pruned),
		R(C08_cancel_id_of_other_engine),
		R(L01_lookup_bad_args),
		R(L02_lookup_unknown),
		R(L03_list_null),
		R(L04_list_null_infos_with_cap),
		R(L05_list_count_only),
		R(L06_list_cap_too_small),
		R(K01_interrupted_null),
		R(K02_set_summary_bad),
		R(K03_set_summary_empty),
		R(K04_set_error_bad),
		R(K05_add_cost_bad),
		R(K06_child_getters_null),
		R(K07_current_child_outside),
		R(K08_positive_return),
		R(K09_ecanceled_uncancelled),
		R(K10_error_then_success),
		R(K11_ignores_interrupt),
		R(K12_summary_twice),
		R(S01_sink_create_null),
		R(S02_sink_create_after_shutdown),
		R(S03_sink_destroy_null),
		R(S04_sink_destroy_default),
		R(S05_sink_destroy_pending),
		R(S06_sink_destroy_undrained),
		R(S07_default_sink_null),
		R(S08_poll_null),
		R(S09_poll_empty),
		R(S10_wait_null),
		R(S11_wait_empty),
		R(S12_second_consumer),
		R(S13_sink_fd_null),
		R(S14_event_free_null),
		R(S15_destroy_with_undrained_events),
		R(S16_sink_destroy_after_shutdown),
		R(F01_format_null_event),
		R(F02_format_null_buf_with_len),
		R(F03_format_length_only),
		R(F04_format_small_buffers),
		R(F05_strerror_any),
		R(F06_describe_error_bad),
		R(F07_status_name_out_of_range),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
