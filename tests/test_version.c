/* SPDX-License-Identifier: MIT */
/* test_version.c - fanout_version() and the FANOUT_VERSION_* macros agree. */
#include "common.h"

static void version_string_matches_header(void **state)
{
	char want[32];

	snprintf(want, sizeof(want), "%d.%d.%d", FANOUT_VERSION_MAJOR,
		 FANOUT_VERSION_MINOR, FANOUT_VERSION_PATCH);
	assert_non_null(fanout_version());
	assert_string_equal(fanout_version(), want);
	assert_string_equal(FANOUT_VERSION_STRING, want);
	/* The same pointer every call: static storage. */
	assert_ptr_equal(fanout_version(), fanout_version());
}

static void version_number_combines_parts(void **state)
{
	unsigned major, minor, patch;

	assert_int_equal(
		sscanf(fanout_version(), "%u.%u.%u", &major, &minor, &patch),
		3);
	assert_int_equal(FANOUT_VERSION_NUMBER,
			 major * 10000 + minor * 100 + patch);
	assert_true(minor < 100 && patch < 100);
#if FANOUT_VERSION_NUMBER < 200
#error "this release has the v0.2 API: FANOUT_VERSION_NUMBER >= 200"
#endif
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		TC(version_string_matches_header),
		TC(version_number_combines_parts),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
