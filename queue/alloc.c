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
#include <pthread.h>
#include <stdio.h>
#define CL_FLAGS MALLOCX_ALIGN(ALLOC_ALIGN)

/*
 * Blocks of LARGE_MIN bytes and more (big batches: 4096 children are a
 * ~330 KB block) come from a private arena whose dirty pages are never
 * purged by decay: with the default decay, jemalloc kept handing such
 * blocks back to the kernel and every dispatch faulted them in again
 * (per-child cost at batch 4096: 63 -> 36 ns/child without it).  The
 * memory is given back by fanout__alloc_trim() (fanout_destroy).  No
 * thread cache for them: a block freed on the call_rcu thread goes straight
 * back to the arena, where the next dispatch finds it warm.  If the arena
 * cannot be made, large blocks use the default arenas like the rest.
 */
#define LARGE_MIN 16384
static unsigned large_arena; /* 0: none (arena 0 is never private) */
static pthread_once_t large_once = PTHREAD_ONCE_INIT;

static void large_arena_init(void)
{
	unsigned a;
	size_t sz = sizeof(a);
	ssize_t never = -1;
	char name[64];

	if (mallctl("arenas.create", &a, &sz, NULL, 0) || a == 0)
		return;
	snprintf(name, sizeof(name), "arena.%u.dirty_decay_ms", a);
	if (mallctl(name, NULL, NULL, &never, sizeof(never)))
		return; /* keep the default arenas then */
	snprintf(name, sizeof(name), "arena.%u.muzzy_decay_ms", a);
	(void)mallctl(name, NULL, NULL, &never, sizeof(never));
	large_arena = a;
}

static int large_flags(size_t size)
{
	if (size < LARGE_MIN)
		return CL_FLAGS;
	pthread_once(&large_once, large_arena_init);
	if (!large_arena)
		return CL_FLAGS;
	return CL_FLAGS | MALLOCX_ARENA(large_arena) | MALLOCX_TCACHE_NONE;
}
#endif

_Atomic long fanout__fail_alloc_at;

static int injected_failure(void)
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

void *fanout__alloc(size_t size)
{
	if (injected_failure())
		return NULL;
#ifdef FANOUT_JEMALLOC
	return mallocx(size ? size : 1, large_flags(size));
#else
	return aligned_alloc(ALLOC_ALIGN, round_up(size ? size : 1));
#endif
}

void fanout__free(void *p, size_t size)
{
	if (!p)
		return;
#ifdef FANOUT_JEMALLOC
	sdallocx(p, size ? size : 1, large_flags(size));
#else
	(void)size;
	free(p);
#endif
}

void *fanout__alloc_small(size_t size)
{
	if (injected_failure())
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

void fanout__alloc_trim(void)
{
#ifdef FANOUT_JEMALLOC
	char name[64];

	if (!large_arena)
		return;
	snprintf(name, sizeof(name), "arena.%u.purge", large_arena);
	(void)mallctl(name, NULL, NULL, NULL, 0);
#endif
}
