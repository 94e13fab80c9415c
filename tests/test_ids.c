/* SPDX-License-Identifier: MIT */
/*
 * test_ids.c - delegation ids (issue 9.6): unique and non-zero within an
 * engine, and different between engines.  Before the fix every engine
 * counted from 1 through the same bijection, so every process's first id
 * was deleg_5692161d100b05e5.  (A forked child's first id: test_fork.c.)
 */
#include "common.h"

static struct fanout_engine *eng(void)
{
	return NEW_ENGINE(.workers = 2, .flags = FANOUT_NO_PIN,
			  .spin_ns = 1000);
}

static fanout_id first_id(struct fanout_engine *e)
{
	atomic_int count = 0;
	struct fanout_task t = {"first", count_fn, &count};
	struct fanout_batch b = {.tasks = &t, .ntasks = 1};
	struct fanout_event *ev;
	fanout_id id = 0;

	assert_int_equal(fanout_dispatch(e, &b, &id), 0);
	assert_true(id != 0);
	ev = must_wait(fanout_default_sink(e));
	assert_true(ev->id == id);
	fanout_event_free(ev);
	return id;
}

/* Two live engines, and a third created where the first one was freed
 * (likely at the same address): three different first ids. */
static void ids_differ_between_engines(void **state)
{
	struct fanout_engine *a = eng(), *b = eng(), *c;
	fanout_id ida = first_id(a), idb = first_id(b), idc;

	assert_true(ida != idb);
	fanout_destroy(a);
	c = eng();
	idc = first_id(c);
	assert_true(idc != ida);
	assert_true(idc != idb);
	fanout_destroy(b);
	fanout_destroy(c);
}

static int cmp_u64(const void *x, const void *y)
{
	uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;

	return a < b ? -1 : a > b;
}

/* 100000 delegations of one engine: every id non-zero and distinct, and
 * each event carries the id its dispatch returned. */
static void ids_unique_nonzero(void **state)
{
	enum { N = 100000, ROUND = 256 };
	struct fanout_engine *e = eng();
	fanout_id *ids = calloc(N, sizeof(*ids)),
		  *evids = calloc(N, sizeof(*ids));
	atomic_int count = 0;
	struct fanout_task t = {"id", count_fn, &count};
	struct fanout_batch b = {.tasks = &t, .ntasks = 1};

	assert_non_null(ids);
	assert_non_null(evids);
	for (int done = 0; done < N;) {
		int k = N - done < ROUND ? N - done : ROUND;

		for (int i = 0; i < k; i++) {
			assert_int_equal(fanout_dispatch(e, &b, &ids[done + i]),
					 0);
			assert_true(ids[done + i] != 0);
		}
		for (int i = 0; i < k; i++) {
			struct fanout_event *ev =
				must_wait(fanout_default_sink(e));

			evids[done + i] = ev->id;
			fanout_event_free(ev);
		}
		done += k;
	}
	assert_int_equal(atomic_load(&count), N);
	qsort(ids, N, sizeof(*ids), cmp_u64);
	qsort(evids, N, sizeof(*evids), cmp_u64);
	for (int i = 0; i < N; i++) {
		if (i)
			assert_true(ids[i] != ids[i - 1]);
		assert_true(ids[i] == evids[i]);
	}
	free(ids);
	free(evids);
	fanout_destroy(e);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		TC(ids_differ_between_engines),
		TC(ids_unique_nonzero),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
