/* SPDX-License-Identifier: MIT */
/*
 * alloc.c - see alloc.h.  Correctness: a thin forwarder; the only state is
 * the fault-injection countdown, decremented atomically so that exactly one
 * allocation (the one taking it from 1 to 0) fails.
 */
#include "alloc.h"

#include <stdlib.h>

#ifdef FANOUT_JEMALLOC
#include <jemalloc/jemalloc.h>
#endif

_Atomic long fanout__fail_alloc_at;

void *fanout__alloc(size_t size)
{
	/* relaxed: a test knob; it orders nothing. */
	if (atomic_load_explicit(&fanout__fail_alloc_at, memory_order_relaxed) > 0 &&
	    atomic_fetch_sub_explicit(&fanout__fail_alloc_at, 1,
				      memory_order_relaxed) == 1)
		return NULL;
#ifdef FANOUT_JEMALLOC
	return mallocx(size ? size : 1, 0);
#else
	return malloc(size ? size : 1);
#endif
}

void fanout__free(void *p, size_t size)
{
	if (!p)
		return;
#ifdef FANOUT_JEMALLOC
	sdallocx(p, size ? size : 1, 0);
#else
	(void)size;
	free(p);
#endif
}
