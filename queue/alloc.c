/* SPDX-License-Identifier: MIT */
/*
 * alloc.c - see alloc.h.  A thin forwarder to the allocator.  The
 * fault-injection countdown is decremented atomically, so exactly one
 * allocation (the one taking it from 1 to 0) fails.
 */
#include "alloc.h"

#include <errno.h>
#include <stdlib.h>

#ifdef FANOUT_JEMALLOC
#include <jemalloc/jemalloc.h>
#define CL_FLAGS MALLOCX_ALIGN(ALLOC_ALIGN)
#endif

_Atomic long fanout__fail_alloc_at;

bool fanout__alloc_fault(void)
{
	/* relaxed: a test knob; it orders nothing. */
	return atomic_load_explicit(&fanout__fail_alloc_at,
				    memory_order_relaxed) > 0 &&
	       atomic_fetch_sub_explicit(&fanout__fail_alloc_at, 1,
					 memory_order_relaxed) == 1;
}

static inline size_t round_up(size_t size)
{
	return (size + ALLOC_ALIGN - 1) & ~(size_t)(ALLOC_ALIGN - 1);
}

void *fanout__alloc_unchecked(size_t size)
{
#ifdef FANOUT_JEMALLOC
	return mallocx(size ? size : 1, CL_FLAGS);
#else
	return aligned_alloc(ALLOC_ALIGN, round_up(size ? size : 1));
#endif
}

void *fanout__alloc(size_t size)
{
	if (fanout__alloc_fault())
		return NULL;
	return fanout__alloc_unchecked(size);
}

void fanout__free(void *p, size_t size)
{
	if (!p)
		return;
#ifdef FANOUT_JEMALLOC
	sdallocx(p, size ? size : 1, CL_FLAGS);
#else
	(void)size;
	free(p);
#endif
}

void *fanout__alloc_small(size_t size)
{
	if (fanout__alloc_fault())
		return NULL;
#ifdef FANOUT_JEMALLOC
	return mallocx(size ? size : 1, 0);
#else
	return malloc(size ? size : 1);
#endif
}

void fanout__free_small(void *p, size_t size)
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

int fanout__mallctl(const char *name, void *oldp, size_t *oldlenp, void *newp,
		    size_t newlen)
{
#ifdef FANOUT_JEMALLOC
	return mallctl(name, oldp, oldlenp, newp, newlen);
#else
	(void)name, (void)oldp, (void)oldlenp, (void)newp, (void)newlen;
	return ENOSYS;
#endif
}
