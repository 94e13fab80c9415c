/* SPDX-License-Identifier: MIT */
/*
 * test_ids.c - delegation ids (issue 9.6): unique and non-zero within an
 * engine, and different between engines.  Before the fix every engine
 * counted from 1 through the same bijection, so every process's first id
 * was deleg_5692161d100b05e5.  (A forked child's first id: test_fork.c.)
 */
#include "common.h"
#include "fanout_testing.h"

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

/* A slot handed out 2^40 times (the 40 bits of generation an id carries,
 * lib/table.c "Ids") is retired, not given a 2^40th-next id equal to its
 * first one.  keep_completed 1 and one thread: A's slot is evicted when
 * B's event is freed, into this thread's slot cache, and C's dispatch
 * takes it back.  Before the fix C got A's id again: fanout_lookup() of
 * the long-pruned A found C (and fanout_cancel() of it would cancel C). */
static void ids_not_reused_after_generation_wrap(void **state)
{
	struct fanout_engine *e =
		NEW_ENGINE(.workers = 1, .flags = FANOUT_NO_PIN,
			   .spin_ns = 1000, .keep_completed = 1);
	struct fanout_info info;
	fanout_id a, b, c;

	a = must_run_one(e);
	assert_int_equal(fanout_test_age_slot(e, a, (1ull << 40) - 1), 0);
	b = must_run_one(e);
	c = must_run_one(e);
	assert_true(b != a);
	assert_true(c != a);
	assert_true(c != b);
	/* A was pruned (K = 1, two newer events freed): unknown for good. */
	assert_int_equal(fanout_lookup(e, a, &info), -ENOENT);
	assert_int_equal(fanout_lookup(e, c, &info), 0);
	assert_true(info.id == c);
	/* And the engine goes on handing out distinct ids. */
	for (int i = 0; i < 64; i++) {
		fanout_id d = must_run_one(e);

		assert_true(d != a && d != b && d != c);
	}
	assert_int_equal(fanout_test_age_slot(NULL, a, 1), -EINVAL);
	assert_int_equal(fanout_test_age_slot(e, 0, 1), -EINVAL);
	fanout_destroy(e);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		TC(ids_differ_between_engines),
		TC(ids_unique_nonzero),
		TC(ids_not_reused_after_generation_wrap),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
