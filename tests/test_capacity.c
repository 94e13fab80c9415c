/* SPDX-License-Identifier: MIT */
/* test_capacity.c - max_async, max_children, the ring, -EBUSY messages. */
#include "common.h"

static void capacity_max_async_busy(void **state)
{
	enum { N = 3 };
	struct fanout_engine *e = NEW_ENGINE(.workers = 2, .max_async = N,
					     .flags = FANOUT_NO_PIN);
	atomic_int gate[N];
	struct tbatch *tb[N + 1];
	fanout_id id[N + 1];
	struct fanout_info infos[8];
	size_t n = 0;

	for (int i = 0; i <= N; i++) {
		tb[i] = tb_new(1);
		if (i < N) {
			atomic_init(&gate[i], 0);
			tb[i]->probes[0].gate = &gate[i];
			id[i] = must_dispatch(e, tb[i]);
		}
	}
	fanout_id bad = 0;
	assert_int_equal(fanout_dispatch(e, &tb[N]->b, &bad), -EBUSY);
	assert_int_equal(fanout_dispatch(e, &tb[N]->b, &bad), -EBUSY);

	/* the refusals changed nothing */
	struct fanout_stats st = stats_of(e);
	assert_int_equal(st.rejected, 2);
	assert_int_equal(st.dispatched, N);
	assert_int_equal(st.async_running, N);
	assert_int_equal(fanout_list(e, infos, 8, &n), 0);
	assert_int_equal(n, N);
	for (size_t i = 0; i < n; i++) {
		bool known = false;

		for (int j = 0; j < N; j++)
			known |= infos[i].id == id[j];
		assert_true(known);
	}

	/* one finishes: when its event is received the slot is free */
	atomic_store(&gate[0], 1);
	struct fanout_event *ev = must_wait(fanout_default_sink(e));
	assert_true(ev->id == id[0]);
	fanout_event_free(ev);
	id[N] = 0;
	assert_int_equal(fanout_dispatch(e, &tb[N]->b, &id[N]), 0);
	assert_true(id[N] != 0);
	assert_int_equal(fanout_dispatch(e, &tb[0]->b, NULL), -EBUSY);

	int seen[N + 1] = {0};
	seen[0] = 1;
	for (int i = 1; i < N; i++)
		atomic_store(&gate[i], 1);
	for (int k = 0; k < N; k++) {
		ev = must_wait(fanout_default_sink(e));
		for (int j = 1; j <= N; j++)
			seen[j] += ev->id == id[j];
		fanout_event_free(ev);
	}
	for (int j = 0; j <= N; j++)
		assert_int_equal(seen[j], 1);
	assert_no_event(fanout_default_sink(e));
	assert_int_equal(atomic_load(&tb[N]->probes[0].runs), 1);
	assert_int_equal(stats_of(e).rejected, 3);
	for (int i = 0; i <= N; i++)
		tb_free(tb[i]);
	fanout_destroy(e);
}

/*
 * The bound holds round after round: dispatchers compare with a limit they
 * refresh from the finalisers' count only when they reach it (lib/deleg.c,
 * "Admission"), so check it again after many refreshes.
 */
static void capacity_max_async_holds_over_rounds(void **state)
{
	enum { N = 3, ROUNDS = 20 };
	struct fanout_engine *e = NEW_ENGINE(.workers = 2, .max_async = N,
					     .flags = FANOUT_NO_PIN);
	struct tbatch *tb[N + 1];
	atomic_int gate[N];

	for (int i = 0; i <= N; i++)
		tb[i] = tb_new(1);
	for (int r = 0; r < ROUNDS; r++) {
		for (int i = 0; i < N; i++) {
			atomic_init(&gate[i], 0);
			tb[i]->probes[0].gate = &gate[i];
			must_dispatch(e, tb[i]);
		}
		assert_int_equal(fanout_dispatch(e, &tb[N]->b, NULL), -EBUSY);
		assert_int_equal(stats_of(e).async_running, N);
		for (int i = 0; i < N; i++)
			atomic_store(&gate[i], 1);
		for (int i = 0; i < N; i++)
			fanout_event_free(must_wait(fanout_default_sink(e)));
		assert_int_equal(stats_of(e).async_running, 0);
	}
	assert_int_equal(stats_of(e).rejected, ROUNDS);
	for (int i = 0; i <= N; i++)
		tb_free(tb[i]);
	fanout_destroy(e);
}

/*
 * The slot is released before the event is published: a consumer that got
 * the event can always dispatch again.  Repeated to catch the race.
 */
static void capacity_slot_released_before_event(void **state)
{
	struct fanout_engine *e = NEW_ENGINE(.workers = 2, .max_async = 1,
					     .flags = FANOUT_NO_PIN);
	atomic_int count = 0;
	struct fanout_task t[2] = {{"a", count_fn, &count},
				   {"b", count_fn, &count}};
	struct fanout_batch b = {.tasks = t, .ntasks = 2};

	for (int i = 0; i < 300; i++) {
		fanout_id id = 0;

		b.ntasks = 1 + (i & 1);
		assert_int_equal(fanout_dispatch(e, &b, &id), 0);
		struct fanout_event *ev = must_wait(fanout_default_sink(e));
		assert_true(ev->id == id);
		fanout_event_free(ev);
	}
	assert_int_equal(atomic_load(&count), 450);
	assert_int_equal(stats_of(e).rejected, 0);
	fanout_destroy(e);
}

/* Refused calls take no slot: the pool is exactly as big afterwards. */
static void capacity_refusals_leave_no_credit(void **state)
{
	struct fanout_engine *e =
		NEW_ENGINE(.workers = 2, .max_async = 2, .max_tasks = 4,
			   .flags = FANOUT_NO_PIN);
	struct fanout_engine *other =
		NEW_ENGINE(.workers = 1, .flags = FANOUT_NO_PIN);
	struct tbatch *bad = tb_new(5);
	atomic_int gate = 0;
	struct tbatch *g[3];

	for (int round = 0; round < 2; round++) {
		for (int i = 0; i < 50; i++) {
			bad->b.ntasks = 5;
			assert_int_equal(fanout_dispatch(e, &bad->b, NULL),
					 -E2BIG);
			bad->b.ntasks = 0;
			assert_int_equal(fanout_dispatch(e, &bad->b, NULL),
					 -EINVAL);
			bad->b.ntasks = 1;
			bad->b.sink = fanout_default_sink(other);
			assert_int_equal(fanout_dispatch(e, &bad->b, NULL),
					 -EINVAL);
			bad->b.sink = NULL;
		}
		atomic_store(&gate, 0);
		for (int i = 0; i < 3; i++) {
			g[i] = tb_new(1);
			g[i]->probes[0].gate = &gate;
		}
		must_dispatch(e, g[0]);
		must_dispatch(e, g[1]);
		for (int i = 0; i < 50; i++)
			assert_int_equal(fanout_dispatch(e, &g[2]->b, NULL),
					 -EBUSY);
		atomic_store(&gate, 1);
		for (int i = 0; i < 2; i++)
			fanout_event_free(must_wait(fanout_default_sink(e)));
		assert_int_equal(tb_runs(g[2]), 0);
		assert_int_equal(stats_of(e).async_running, 0);
		for (int i = 0; i < 3; i++)
			tb_free(g[i]);
	}
	assert_int_equal(tb_runs(bad), 0);
	assert_no_event(fanout_default_sink(e));
	assert_no_event(fanout_default_sink(other));
	assert_int_equal(stats_of(e).rejected, 2 * (150 + 50));
	tb_free(bad);
	fanout_destroy(other);
	fanout_destroy(e);
}

/* A delegation holds one slot, however many children. */
static void capacity_one_slot_per_batch(void **state)
{
	struct fanout_engine *e = NEW_ENGINE(.workers = 2, .max_async = 1,
					     .flags = FANOUT_NO_PIN);
	atomic_int gate = 0;
	struct tbatch *big = tb_new(1000);
	struct tbatch *one = tb_new(1);

	tb_gate(big, &gate);
	fanout_id id = must_dispatch(e, big);
	assert_int_equal(stats_of(e).async_running, 1);
	assert_int_equal(fanout_dispatch(e, &one->b, NULL), -EBUSY);
	atomic_store(&gate, 1);
	struct fanout_event *ev = must_wait(fanout_default_sink(e));
	assert_true(ev->id == id);
	check_all_completed(ev, big);
	fanout_event_free(ev);
	fanout_id id2 = must_dispatch(e, one);
	ev = must_wait(fanout_default_sink(e));
	assert_true(ev->id == id2);
	fanout_event_free(ev);
	tb_free(big);
	tb_free(one);
	fanout_destroy(e);
}

/* Highest number of children of one batch seen running at once. */
static int measure_concurrency(struct fanout_engine *e, unsigned n, bool sync)
{
	atomic_int cur = 0, max = 0;
	struct tbatch *tb = tb_new(n);
	struct fanout_event *ev = NULL;

	for (unsigned i = 0; i < n; i++) {
		tb->probes[i].cur = &cur;
		tb->probes[i].max = &max;
		tb->probes[i].sleep_us = 2000;
	}
	if (sync) {
		assert_int_equal(fanout_run(e, &tb->b, &ev), 0);
	} else {
		must_dispatch(e, tb);
		ev = must_wait(fanout_default_sink(e));
	}
	check_all_completed(ev, tb);
	fanout_event_free(ev);
	tb_free(tb);
	return atomic_load(&max);
}

static void capacity_max_children_bound(void **state)
{
	for (unsigned k = 1; k <= 2; k++) {
		struct fanout_engine *e =
			NEW_ENGINE(.workers = 3, .max_children = k,
				   .flags = FANOUT_NO_PIN);

		int m = measure_concurrency(e, 24, false);
		assert_true(m >= 1);
		assert_true(m <= (int)k);
		/* the caller of fanout_run counts as a runner too */
		m = measure_concurrency(e, 24, true);
		assert_true(m >= 1);
		assert_true(m <= (int)k);
		fanout_destroy(e);
	}
}

static void capacity_max_children_allows_parallel(void **state)
{
	struct fanout_engine *e = NEW_ENGINE(.workers = 2, .max_children = 4,
					     .flags = FANOUT_NO_PIN);
	int best = 0;

	assert_int_equal(stats_of(e).nworkers, 2);
	for (int tries = 0; tries < 10 && best < 2; tries++) {
		int m = measure_concurrency(e, 24, false);

		assert_true(m <= 4);
		if (m > best)
			best = m;
	}
	if (best < 2) {
		struct fanout_stats st = stats_of(e);

		print_error(
			"never 2 children at once; per worker: run %llu/%llu "
			"parks %llu/%llu wakeups %llu/%llu\n",
			(unsigned long long)st.worker[0].children_run,
			(unsigned long long)st.worker[1].children_run,
			(unsigned long long)st.worker[0].parks,
			(unsigned long long)st.worker[1].parks,
			(unsigned long long)st.worker[0].wakeups,
			(unsigned long long)st.worker[1].wakeups);
	}
	assert_true(best > 1);
	fanout_destroy(e);
}

static void capacity_describe_ebusy(void **state)
{
	struct fanout_engine *e = NEW_ENGINE(.workers = 1, .max_async = 1,
					     .flags = FANOUT_NO_PIN);
	atomic_int gate = 0;
	struct tbatch *tb = tb_new(1);
	char buf[512], small[8];

	tb->probes[0].gate = &gate;
	must_dispatch(e, tb);
	assert_int_equal(fanout_dispatch(e, &tb->b, NULL), -EBUSY);

	int n = fanout_describe_error(e, -EBUSY, buf, sizeof(buf));
	assert_true(n > 0);
	assert_true((size_t)n < sizeof(buf));
	assert_int_equal(strlen(buf), (size_t)n);
	assert_contains(buf, "max_async");
	assert_int_equal(fanout_describe_error(e, -EBUSY, NULL, 0), n);
	assert_int_equal(fanout_describe_error(e, EBUSY, buf, sizeof(buf)), n);
	assert_contains(buf, "max_async");
	/* truncation: snprintf-style */
	memset(small, 'x', sizeof(small));
	assert_int_equal(fanout_describe_error(e, -EBUSY, small, sizeof(small)),
			 n);
	assert_int_equal(strlen(small), sizeof(small) - 1);
	assert_memory_equal(small, buf, sizeof(small) - 1);
	assert_int_equal(fanout_describe_error(NULL, -EBUSY, buf, sizeof(buf)),
			 -EINVAL);
	assert_int_equal(fanout_describe_error(e, -EBUSY, NULL, 10), -EINVAL);
	/* other codes give some text too */
	assert_true(fanout_describe_error(e, -E2BIG, buf, sizeof(buf)) > 0);
	assert_true(strlen(buf) > 0);

	atomic_store(&gate, 1);
	struct fanout_event *ev = must_wait(fanout_default_sink(e));
	fanout_event_free(ev);
	tb_free(tb);
	fanout_destroy(e);
}

/*
 * A tiny ring: dispatch refuses (-EBUSY) instead of overflowing, and every
 * accepted delegation still completes exactly once.
 */
static void capacity_small_ring_never_overflows(void **state)
{
	enum { MAXA = 64 };
	struct fanout_engine *e =
		NEW_ENGINE(.workers = 1, .max_async = MAXA, .queue_slots = 1,
			   .flags = FANOUT_NO_PIN);
	atomic_int gate = 0;
	struct tbatch *blocker = tb_new(1);
	struct tbatch *tb[MAXA];
	fanout_id id[MAXA + 1];
	int accepted = 0, busy = 0;

	blocker->probes[0].gate = &gate;
	id[0] = must_dispatch(e, blocker);
	assert_true(wait_ge(&blocker->probes[0].runs, 1, WAIT_MS));
	for (int i = 0; i < MAXA; i++) {
		tb[i] = tb_new(3);
		int rc = fanout_dispatch(e, &tb[i]->b, &id[accepted + 1]);

		if (rc == 0)
			accepted++;
		else if (rc == -EBUSY)
			busy++;
		else
			fail_msg("dispatch returned %d", rc);
	}
	assert_int_equal(accepted + busy, MAXA);
	assert_true(busy >= 1); /* max_async = 64 with the blocker running */
	assert_int_equal(stats_of(e).rejected, busy);
	atomic_store(&gate, 1);

	int seen[MAXA + 1] = {0};
	for (int k = 0; k <= accepted; k++) {
		struct fanout_event *ev = must_wait(fanout_default_sink(e));

		for (int j = 0; j <= accepted; j++)
			seen[j] += ev->id == id[j];
		assert_int_equal(ev->status, FANOUT_COMPLETED);
		fanout_event_free(ev);
	}
	for (int j = 0; j <= accepted; j++)
		assert_int_equal(seen[j], 1);
	assert_no_event(fanout_default_sink(e));
	int runs = 0;
	for (int i = 0; i < MAXA; i++) {
		runs += tb_runs(tb[i]);
		tb_free(tb[i]);
	}
	assert_int_equal(runs, 3 * accepted);
	tb_free(blocker);
	fanout_destroy(e);
}

/*
 * A ring of 4 slots (3 usable) with its one worker held: exactly 3 more
 * single-child batches fit, round after round.  The credits come back
 * with the workers' dequeues, so a refill that missed them refuses
 * early, and one that counted them twice overflows the ring (the
 * sanitizer builds' ring_put aborts on it).
 */
static void capacity_ring_refills_exactly(void **state)
{
	struct fanout_engine *e = NEW_ENGINE(.workers = 1, .queue_slots = 4,
					     .flags = FANOUT_NO_PIN);
	atomic_int ran = 0;
	struct fanout_task t = {"x", count_fn, &ran};
	struct fanout_batch b = {.tasks = &t, .ntasks = 1};

	for (int round = 0; round < 20; round++) {
		struct tbatch *hold = tb_new(1);
		atomic_int gate = 0;
		int accepted = 0, rc = 0;

		hold->probes[0].gate = &gate;
		must_dispatch(e, hold);
		assert_true(wait_ge(&hold->probes[0].runs, 1, WAIT_MS));
		for (int i = 0; i < 8 && rc == 0; i++) {
			rc = fanout_dispatch(e, &b, NULL);
			accepted += rc == 0;
		}
		assert_int_equal(rc, -EBUSY);
		assert_int_equal(accepted, 3);
		atomic_store(&gate, 1);
		for (int i = 0; i < accepted + 1; i++)
			fanout_event_free(must_wait(fanout_default_sink(e)));
		assert_no_event(fanout_default_sink(e));
		tb_free(hold);
	}
	assert_int_equal(atomic_load(&ran), 20 * 3);
	assert_int_equal(stats_of(e).rejected, 20);
	fanout_destroy(e);
}

/* keep_completed and the record table: the table has 2^24 slots, and a
 * kept record holds its slot until keep_completed newer ones have their
 * events freed.  With keep_completed = 2^24 (accepted before the fix),
 * the 2^24 kept records fill every slot before any is pruned: the next
 * dispatch finds no slot (-ENOMEM), no event is left to free, and the
 * engine refuses every dispatch for good.  (Reaching that takes 2^24
 * delegations and 2.4 GiB of table, so the test checks the bound that
 * create enforces: half the table at most, the rest for live records.) */
static void capacity_keep_completed_leaves_table_room(void **state)
{
	struct fanout_engine *e = NULL;
	struct fanout_config c = {.workers = 1,
				  .flags = FANOUT_NO_PIN,
				  .keep_completed = 1u << 24};

	assert_int_equal(fanout_create(&c, &e), -EINVAL);
	assert_null(e);
	c.keep_completed = (1u << 23) + 1;
	assert_int_equal(fanout_create(&c, &e), -EINVAL);
	assert_null(e);
	c.keep_completed = 1u << 23;
	assert_int_equal(fanout_create(&c, &e), 0);
	assert_non_null(e);
	must_run_one(e);
	fanout_destroy(e);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		TC(capacity_max_async_busy),
		TC(capacity_max_async_holds_over_rounds),
		TC(capacity_slot_released_before_event),
		TC(capacity_refusals_leave_no_credit),
		TC(capacity_one_slot_per_batch),
		TC(capacity_max_children_bound),
		TC(capacity_max_children_allows_parallel),
		TC(capacity_describe_ebusy),
		TC(capacity_small_ring_never_overflows),
		TC(capacity_ring_refills_exactly),
		TC(capacity_keep_completed_leaves_table_room),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
