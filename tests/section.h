/* SPDX-License-Identifier: MIT */
/*
 * section.h - a thread that sits inside a read-side section (as a lookup
 * does around its reads) until told to leave: what holds reuse of record
 * blocks back (lib/epoch.c).  For test_epoch.c and test_fork.c.
 */
#ifndef FANOUT_TESTS_SECTION_H
#define FANOUT_TESTS_SECTION_H

#include "common.h"
#include "fanout_testing.h"

struct holder {
	atomic_int inside, release;
};

static void *hold_section(void *arg)
{
	struct holder *h = arg;

	fanout_test_read_section(true);
	atomic_store(&h->inside, 1);
	CHECK(wait_flag(&h->release, GATE_MS));
	fanout_test_read_section(false);
	return NULL;
}

#endif
