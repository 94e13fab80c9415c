/* SPDX-License-Identifier: MIT */
/* test_child.c - the calls a child makes on itself. */
#include "common.h"

#include <float.h>

#define MAX_TEXT (16u << 20) /* 16 MiB, the documented limit */

/* Run one child @fn(@arg) synchronously and return its event. */
static struct fanout_event *run_one(struct fanout_engine *e, fanout_fn fn,
				    void *arg)
{
	struct fanout_task t = {"one", fn, arg};
	struct fanout_batch b = {.tasks = &t, .ntasks = 1};
	struct fanout_event *ev = NULL;

	assert_int_equal(fanout_run(e, &b, &ev), 0);
	assert_non_null(ev);
	assert_int_equal(ev->nresults, 1);
	return ev;
}

static struct fanout_engine *eng(void)
{
	return NEW_ENGINE(.workers = 2, .flags = FANOUT_NO_PIN);
}

/* ------------------------------------------------------------- summary */

struct sumcase {
	int rc[8];
	char *huge; /* MAX_TEXT + 1 bytes, not NUL-terminated */
};

static int summary_replace_fn(struct fanout_child *c, void *arg)
{
	struct sumcase *s = arg;

	s->rc[0] = fanout_set_summary(c, "first", 5);
	s->rc[1] = fanout_set_summary(c, "second", 6);
	return 0;
}

static int summary_partial_fn(struct fanout_child *c, void *arg)
{
	struct sumcase *s = arg;
	char buf[6] = {'a', 'b', 'c', 'd', 'e', 'f'}; /* no NUL */

	s->rc[0] = fanout_set_summary(c, buf, 3);
	memset(buf, 'z', sizeof(buf)); /* copied: ours to scribble on */
	return 0;
}

static int summary_empty_fn(struct fanout_child *c, void *arg)
{
	struct sumcase *s = arg;

	s->rc[0] = fanout_set_summary(c, "something", 9);
	s->rc[1] = fanout_set_summary(c, "xyz", 0);
	return 0;
}

static int summary_bad_fn(struct fanout_child *c, void *arg)
{
	struct sumcase *s = arg;

	s->rc[0] = fanout_set_summary(c, "kept", 4);
	s->rc[1] = fanout_set_summary(NULL, "x", 1);
	s->rc[2] = fanout_set_summary(c, NULL, 5);
	s->rc[3] = fanout_set_summary(c, s->huge, (size_t)MAX_TEXT + 1);
	s->rc[4] = fanout_set_summary(c, s->huge, SIZE_MAX);
	return 0;
}

static int summary_max_fn(struct fanout_child *c, void *arg)
{
	struct sumcase *s = arg;

	s->rc[0] = fanout_set_summary(c, s->huge, MAX_TEXT);
	s->rc[1] = fanout_set_summary(c, "small again", 11);
	return 0;
}

static void child_summary_replaced(void **state)
{
	struct fanout_engine *e = eng();
	struct sumcase s = {.rc = {1, 1}};
	struct fanout_event *ev = run_one(e, summary_replace_fn, &s);

	assert_int_equal(s.rc[0], 0);
	assert_int_equal(s.rc[1], 0);
	assert_string_equal(ev->results[0].summary, "second");
	fanout_event_free(ev);
	fanout_destroy(e);
}

static void child_summary_not_nul_terminated(void **state)
{
	struct fanout_engine *e = eng();
	struct sumcase s = {.rc = {1}};
	struct fanout_event *ev = run_one(e, summary_partial_fn, &s);

	assert_int_equal(s.rc[0], 0);
	assert_non_null(ev->results[0].summary);
	assert_string_equal(ev->results[0].summary, "abc");
	fanout_event_free(ev);
	fanout_destroy(e);
}

static void child_summary_len_zero(void **state)
{
	struct fanout_engine *e = eng();
	struct sumcase s = {.rc = {1, 1}};
	struct fanout_event *ev = run_one(e, summary_empty_fn, &s);

	assert_int_equal(s.rc[0], 0);
	assert_int_equal(s.rc[1], 0);
	/* it replaced "something" with the empty text */
	assert_non_null(ev->results[0].summary);
	assert_string_equal(ev->results[0].summary, "");
	fanout_event_free(ev);
	fanout_destroy(e);
}

static void child_summary_bad_args(void **state)
{
	struct fanout_engine *e = eng();
	struct sumcase s = {.rc = {1, 1, 1, 1, 1}};

	s.huge = malloc((size_t)MAX_TEXT + 1);
	assert_non_null(s.huge);
	memset(s.huge, 'h', (size_t)MAX_TEXT + 1);
	struct fanout_event *ev = run_one(e, summary_bad_fn, &s);
	assert_int_equal(s.rc[0], 0);
	assert_int_equal(s.rc[1], -EINVAL);
	assert_int_equal(s.rc[2], -EINVAL);
	assert_int_equal(s.rc[3], -EINVAL);
	assert_int_equal(s.rc[4], -EINVAL);
	/* the failures left the summary as it was */
	assert_string_equal(ev->results[0].summary, "kept");
	fanout_event_free(ev);
	free(s.huge);
	fanout_destroy(e);
}

static void child_summary_max_length(void **state)
{
	struct fanout_engine *e = eng();
	struct sumcase s = {.rc = {1, 1}};

	s.huge = malloc(MAX_TEXT);
	assert_non_null(s.huge);
	memset(s.huge, 'm', MAX_TEXT);
	struct fanout_event *ev = run_one(e, summary_max_fn, &s);
	assert_int_equal(s.rc[0], 0);
	assert_int_equal(s.rc[1], 0);
	assert_string_equal(ev->results[0].summary, "small again");
	fanout_event_free(ev);
	free(s.huge);
	fanout_destroy(e);
}

static void child_no_summary_is_null(void **state)
{
	struct fanout_engine *e = eng();
	struct probe p;

	memset(&p, 0, sizeof(p));
	struct fanout_event *ev = run_one(e, probe_fn, &p);
	assert_null(ev->results[0].summary);
	assert_null(ev->results[0].error);
	fanout_event_free(ev);
	fanout_destroy(e);
}

/* --------------------------------------------------------------- error */

struct errcase {
	int rc[6];
	char *huge; /* MAX_TEXT + 1 chars + NUL */
	int ret;
};

static int error_fn(struct fanout_child *c, void *arg)
{
	struct errcase *s = arg;
	char msg[32];

	snprintf(msg, sizeof(msg), "first failure");
	s->rc[0] = fanout_set_error(c, msg);
	memset(msg, 0, sizeof(msg)); /* copied */
	s->rc[1] = fanout_set_error(c, "final failure");
	s->rc[2] = fanout_set_error(NULL, "x");
	s->rc[3] = fanout_set_error(c, NULL);
	s->rc[4] = s->huge ? fanout_set_error(c, s->huge) : -EINVAL;
	s->rc[5] = fanout_set_summary(c, "summary too", 11);
	return s->ret;
}

static void child_set_error(void **state)
{
	struct fanout_engine *e = eng();
	struct errcase s = {.ret = -EIO};

	s.huge = malloc((size_t)MAX_TEXT + 2);
	assert_non_null(s.huge);
	memset(s.huge, 'e', (size_t)MAX_TEXT + 1);
	s.huge[MAX_TEXT + 1] = '\0';
	struct fanout_event *ev = run_one(e, error_fn, &s);
	assert_int_equal(s.rc[0], 0);
	assert_int_equal(s.rc[1], 0);
	assert_int_equal(s.rc[2], -EINVAL);
	assert_int_equal(s.rc[3], -EINVAL);
	assert_int_equal(s.rc[4], -EINVAL); /* too long: unchanged */
	assert_int_equal(s.rc[5], 0);
	const struct fanout_result *r = &ev->results[0];
	assert_int_equal(r->status, FANOUT_ERROR);
	assert_int_equal(r->code, -EIO);
	assert_string_equal(r->error, "final failure");
	assert_string_equal(r->summary, "summary too");
	assert_int_equal(ev->status, FANOUT_ERROR);
	assert_non_null(ev->error);
	fanout_event_free(ev);
	free(s.huge);
	fanout_destroy(e);
}

static void child_error_ignored_when_completed(void **state)
{
	struct fanout_engine *e = eng();
	struct errcase s = {.ret = 0};
	struct fanout_event *ev = run_one(e, error_fn, &s);

	assert_int_equal(ev->results[0].status, FANOUT_COMPLETED);
	assert_null(ev->results[0].error);
	assert_string_equal(ev->results[0].summary, "summary too");
	fanout_event_free(ev);
	fanout_destroy(e);
}

static void child_error_when_interrupted(void **state)
{
	struct fanout_engine *e = eng();
	struct errcase s = {.ret = -ECANCELED};
	struct fanout_event *ev = run_one(e, error_fn, &s);

	assert_int_equal(ev->results[0].status, FANOUT_INTERRUPTED);
	assert_string_equal(ev->results[0].error, "final failure");
	fanout_event_free(ev);
	fanout_destroy(e);
}

/* ---------------------------------------------------------------- cost */

struct costcase {
	int rc[10];
};

static int cost_fn(struct fanout_child *c, void *arg)
{
	struct costcase *s = arg;

	s->rc[0] = fanout_add_cost(c, 1.25);
	s->rc[1] = fanout_add_cost(c, 2.5);
	s->rc[2] = fanout_add_cost(c, -1.0);
	s->rc[3] = fanout_add_cost(c, NAN);
	s->rc[4] = fanout_add_cost(c, INFINITY);
	s->rc[5] = fanout_add_cost(c, -INFINITY);
	s->rc[6] = fanout_add_cost(c, 0.0);
	s->rc[7] = fanout_add_cost(NULL, 1.0);
	s->rc[8] = fanout_add_cost(c, -1e-300);
	s->rc[9] = fanout_add_cost(c, -NAN);
	return 0;
}

static void child_add_cost(void **state)
{
	struct fanout_engine *e = eng();
	struct costcase s[3];
	struct fanout_task t[3];
	struct fanout_event *ev = NULL;

	for (int i = 0; i < 3; i++) {
		memset(&s[i], 0x55, sizeof(s[i]));
		t[i] = (struct fanout_task){"cost", cost_fn, &s[i]};
	}
	struct fanout_batch b = {.tasks = t, .ntasks = 3};
	assert_int_equal(fanout_dispatch(e, &b, NULL), 0);
	ev = must_wait(fanout_default_sink(e));
	for (int i = 0; i < 3; i++) {
		assert_int_equal(s[i].rc[0], 0);
		assert_int_equal(s[i].rc[1], 0);
		assert_int_equal(s[i].rc[2], -EINVAL);
		assert_int_equal(s[i].rc[3], -EINVAL);
		assert_int_equal(s[i].rc[4], -EINVAL);
		assert_int_equal(s[i].rc[5], -EINVAL);
		assert_int_equal(s[i].rc[6], 0);
		assert_int_equal(s[i].rc[7], -EINVAL);
		assert_int_equal(s[i].rc[8], -EINVAL);
		assert_int_equal(s[i].rc[9], -EINVAL);
		assert_float_equal(ev->results[i].cost, 3.75, 1e-12);
	}
	assert_float_equal(ev->cost, 3 * 3.75, 1e-12);
	assert_false(isnan(ev->cost));
	fanout_event_free(ev);
	fanout_destroy(e);
}

/* A sum past the largest double: refused, the cost unchanged, as for
 * fanout_pending_add_cost() (it was +inf, a cost no outcome may have). */
static int cost_overflow_fn(struct fanout_child *c, void *arg)
{
	int *rc = arg;

	rc[0] = fanout_add_cost(c, DBL_MAX);
	rc[1] = fanout_add_cost(c, DBL_MAX);
	rc[2] = fanout_add_cost(c, 0.0);
	return 0;
}

static void child_add_cost_overflow(void **state)
{
	struct fanout_engine *e = eng();
	int rc[3] = {1, 1, 1};
	struct fanout_task t = {"cost", cost_overflow_fn, rc};
	struct fanout_batch b = {.tasks = &t, .ntasks = 1};
	struct fanout_event *ev = NULL;

	assert_int_equal(fanout_run(e, &b, &ev), 0);
	assert_int_equal(rc[0], 0);
	assert_int_equal(rc[1], -EINVAL);
	assert_int_equal(rc[2], 0);
	assert_true(isfinite(ev->results[0].cost));
	assert_true(ev->results[0].cost == DBL_MAX);
	assert_true(ev->cost == DBL_MAX);
	fanout_event_free(ev);
	fanout_destroy(e);
}

/* ------------------------------------------------------- index, id ... */

static void child_index_and_id(void **state)
{
	struct fanout_engine *e = eng();
	struct tbatch *tb = tb_new(10);
	struct fanout_event *ev = NULL;

	fanout_id id = must_dispatch(e, tb);
	ev = must_wait(fanout_default_sink(e));
	assert_true(ev->id == id);
	for (unsigned i = 0; i < 10; i++) {
		assert_int_equal(tb->probes[i].index, i);
		assert_true(tb->probes[i].id == id);
		assert_int_equal(tb->probes[i].depth, 1);
		assert_false(tb->probes[i].interrupted_seen);
	}
	fanout_event_free(ev);
	tb_free(tb);

	/* and for fanout_run */
	tb = tb_new(5);
	assert_int_equal(fanout_run(e, &tb->b, &ev), 0);
	for (unsigned i = 0; i < 5; i++) {
		assert_int_equal(tb->probes[i].index, i);
		assert_true(tb->probes[i].id == ev->id);
	}
	fanout_event_free(ev);
	tb_free(tb);
	fanout_destroy(e);
}

static void child_null_handling(void **state)
{
	assert_int_equal(fanout_child_index(NULL), 0);
	assert_false(fanout_interrupted(NULL));
	assert_int_equal(fanout_set_summary(NULL, "x", 1), -EINVAL);
	assert_int_equal(fanout_set_error(NULL, "x"), -EINVAL);
	assert_int_equal(fanout_add_cost(NULL, 1.0), -EINVAL);
	assert_null(fanout_current_child());
}

/* Code deep inside a child finds it through fanout_current_child(). */
static void helper_deep_inside(void)
{
	struct fanout_child *c = fanout_current_child();

	CHECK(c != NULL);
	CHECK(fanout_set_summary(c, "via current", 11) == 0);
	CHECK(fanout_add_cost(c, 0.5) == 0);
}

static void *other_thread(void *arg)
{
	/* a thread started by a child is not running a child */
	*(bool *)arg = fanout_current_child() == NULL;
	return NULL;
}

static int deep_fn(struct fanout_child *c, void *arg)
{
	pthread_t t;

	(void)c;
	helper_deep_inside();
	if (pthread_create(&t, NULL, other_thread, arg) == 0)
		pthread_join(t, NULL);
	return 0;
}

static void child_current_child(void **state)
{
	struct fanout_engine *e = eng();
	bool other_null = false;
	struct fanout_event *ev = run_one(e, deep_fn, &other_null);

	assert_string_equal(ev->results[0].summary, "via current");
	assert_float_equal(ev->results[0].cost, 0.5, 1e-12);
	assert_true(other_null);
	fanout_event_free(ev);
	fanout_destroy(e);
}

/* Every child of a batch, several to a claimed chunk, finds itself
 * through fanout_current_child(), with its own index and summary slot,
 * also after a nested run of its own returned; the caller of the batch
 * finds none once it returns.  Each leaf records what it saw in its
 * summary: "ok", or what was wrong. */
#define CUR_N 192u

static int cur_leaf(struct fanout_child *c, void *arg)
{
	const char *bad = fanout_current_child() != c ? "not current" :
			  fanout_child_index(c) != (uintptr_t)arg ?
							"wrong index" :
							NULL;

	CHECK(fanout_set_summary(c, bad ? bad : "ok", bad ? strlen(bad) : 2) ==
	      0);
	return 0;
}

static int cur_parent(struct fanout_child *c, void *arg)
{
	struct fanout_engine *e = arg;
	unsigned i = fanout_child_index(c);

	if (i % 32 == 5) { /* a nested run of three on this thread */
		struct fanout_task t[3] = {{"n0", cur_leaf, (void *)0},
					   {"n1", cur_leaf, (void *)1},
					   {"n2", cur_leaf, (void *)2}};
		struct fanout_batch b = {.tasks = t, .ntasks = 3};
		struct fanout_event *ev = NULL;

		CHECK(fanout_run(e, &b, &ev) == 0 && ev);
		for (unsigned k = 0; k < 3; k++)
			CHECK(strcmp(ev->results[k].summary, "ok") == 0);
		fanout_event_free(ev);
	}
	return cur_leaf(fanout_current_child(), (void *)(uintptr_t)i);
}

static void child_current_child_each_of_a_batch(void **state)
{
	struct fanout_engine *e = eng();
	struct fanout_task *t = calloc(CUR_N, sizeof(*t));
	struct fanout_batch b = {.tasks = t, .ntasks = CUR_N};
	struct fanout_event *ev = NULL;

	assert_non_null(t);
	for (unsigned i = 0; i < CUR_N; i++)
		t[i] = (struct fanout_task){"p", cur_parent, e};
	for (int round = 0; round < 2; round++) {
		if (round == 0) {
			assert_int_equal(fanout_run(e, &b, &ev), 0);
		} else {
			fanout_id id = 0;

			assert_int_equal(fanout_dispatch(e, &b, &id), 0);
			assert_true(id != 0);
			assert_int_equal(
				fanout_wait(fanout_default_sink(e), &ev, -1),
				0);
		}
		assert_non_null(ev);
		assert_int_equal(ev->ncompleted, CUR_N);
		for (unsigned i = 0; i < CUR_N; i++)
			assert_string_equal(ev->results[i].summary, "ok");
		fanout_event_free(ev);
		assert_null(fanout_current_child());
	}
	free(t);
	fanout_destroy(e);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		TC(child_summary_replaced),
		TC(child_summary_not_nul_terminated),
		TC(child_summary_len_zero),
		TC(child_summary_bad_args),
		TC(child_summary_max_length),
		TC(child_no_summary_is_null),
		TC(child_set_error),
		TC(child_error_ignored_when_completed),
		TC(child_error_when_interrupted),
		TC(child_add_cost),
		TC(child_add_cost_overflow),
		TC(child_index_and_id),
		TC(child_null_handling),
		TC(child_current_child),
		TC(child_current_child_each_of_a_batch),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
