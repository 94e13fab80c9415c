/* SPDX-License-Identifier: MIT */
/*
 * test_regress_wait_timeout_spin.c - fanout_wait() must honour a timeout
 * shorter than the engine's spin_ns.
 *
 * Bug: fanout_wait() spins for the whole spin_ns before it ever looks at
 * its deadline (lib/sink.c: the spin branch `continue`s without checking
 * `deadline`), so with spin_ns = 1 s a 10 ms wait on an empty sink takes a
 * full second (measured: 1000 ms) - 100x its timeout.  The header promises
 * "sleeping up to @timeout_ms".
 *
 * The bound below (500 ms for a 10 ms timeout) is not a timing assertion in
 * the flaky sense: the buggy library takes >= 1000 ms every time, a correct
 * one ~10 ms; only a machine stalled for half a second would misjudge it.
 */
#include "common.h"

static void wait_timeout_shorter_than_spin(void **state)
{
	struct fanout_engine *e =
		NEW_ENGINE(.workers = 1, .flags = FANOUT_NO_PIN,
			   .spin_ns = 1000000000ull);
	struct fanout_sink *s = NULL;
	struct fanout_event *ev = NULL;

	assert_int_equal(fanout_sink_create(e, &s), 0);
	for (int i = 0; i < 2; i++) {
		struct fanout_sink *w = i ? fanout_default_sink(e) : s;
		uint64_t t0 = mono_ms();
		int rc = fanout_wait(w, &ev, 10);
		uint64_t took = mono_ms() - t0;

		assert_int_equal(rc, -ETIMEDOUT);
		if (took >= 500)
			print_error("fanout_wait(timeout 10 ms) took %llu ms "
				    "with spin_ns = 1 s\n",
				    (unsigned long long)took);
		assert_true(took < 500);
	}
	assert_int_equal(fanout_sink_destroy(s), 0);
	fanout_destroy(e);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		TC(wait_timeout_shorter_than_spin),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
