/* SPDX-License-Identifier: MIT */
/*
 * alloc.c - see alloc.h.  A thin forwarder to the allocator, plus the
 * engine's cache of large blocks.  The fault-injection countdown is
 * decremented atomically, so exactly one allocation (the one taking it
 * from 1 to 0) fails.
 *
 * WHY A CACHE OF LARGE BLOCKS
 *
 * Records are freed by call_rcu callbacks, in bursts of hundreds after each
 * grace period.  Freed side by side, jemalloc coalesces big blocks into
 * dirty extents far larger than any request, and it will not carve a
 * request out of an extent more than 2^lg_extent_max_active_fit (64) times
 * its size; so, left to jemalloc, every dispatch of a big batch gets fresh
 * pages and faults them in (batch 512: ~14 faults per delegation).  An
 * arena with decay switched off would keep the pages but never give any
 * back, so a process would grow with every burst until fanout_destroy.
 * The cache keeps up to FA_CACHE_SLOTS blocks per power-of-two class,
 * FA_CACHE_BYTES in all, and hands them back whole, warm and already
 * faulted in; what does not fit goes back to jemalloc, whose decay returns
 * it to the kernel.  (doc/profile.txt has the measurements.)
 *
 * WHY THE CACHE IS CORRECT
 *
 * A slot holds a block or NULL.  A block is taken only by exchanging the
 * slot with NULL and put only by a CAS from NULL, so each block in a slot
 * has exactly one taker and no block is in two slots (no ABA: nothing is
 * read through a slot's pointer before it is owned).  `bytes` is raised
 * BEFORE a put and lowered AFTER a take, so it never under-counts what the
 * slots hold and the cap holds: a put that would pass it frees instead.
 */
#include "alloc.h"

#include <errno.h>
#include <stdlib.h>

#ifdef FANOUT_JEMALLOC
#include <jemalloc/jemalloc.h>
#define CL_FLAGS MALLOCX_ALIGN(ALLOC_ALIGN)
#endif

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define CACHE_POISON(p, n) ASAN_POISON_MEMORY_REGION(p, n)
#define CACHE_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#else
#define CACHE_POISON(p, n) ((void)(p), (void)(n))
#define CACHE_UNPOISON(p, n) ((void)(p), (void)(n))
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

static void *raw_alloc(size_t size)
{
#ifdef FANOUT_JEMALLOC
	return mallocx(size ? size : 1, CL_FLAGS);
#else
	return aligned_alloc(ALLOC_ALIGN, round_up(size ? size : 1));
#endif
}

void *fanout__alloc(size_t size)
{
	if (injected_failure())
		return NULL;
	return raw_alloc(size);
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

/* ------------------------------------------------------ large blocks */

void fa_cache_init(struct fa_cache *c)
{
	unsigned k, i;

	atomic_init(&c->bytes, 0);
	atomic_init(&c->hits, 0);
	for (k = 0; k < FA_CACHE_CLASSES; k++)
		for (i = 0; i < FA_CACHE_SLOTS; i++)
			atomic_init(&c->slot[k][i], NULL);
}

/* The class of a block of @size bytes (its size is 1 << shift), or -1 when
 * such blocks are not cached. */
static int size_class(size_t size, unsigned *shift)
{
	unsigned s = FA_CACHE_MIN_SHIFT;

	if (size < ((size_t)1 << FA_CACHE_MIN_SHIFT) ||
	    size > ((size_t)1 << FA_CACHE_MAX_SHIFT))
		return -1;
	while (((size_t)1 << s) < size)
		s++;
	*shift = s;
	return (int)(s - FA_CACHE_MIN_SHIFT);
}

void *fa_cache_alloc(struct fa_cache *c, size_t size, size_t *got)
{
	unsigned shift, i;
	int k = size_class(size, &shift);
	void *p;

	if (k < 0) {
		*got = size;
		return fanout__alloc(size);
	}
	*got = (size_t)1 << shift;
	if (injected_failure())
		return NULL;
	for (i = 0; i < FA_CACHE_SLOTS; i++) {
		/* relaxed: only a look; the exchange below decides. */
		if (!atomic_load_explicit(&c->slot[k][i], memory_order_relaxed))
			continue;
		/* acquire: pairs with the release CAS in fa_cache_free(), so
		 * the block's last owner's accesses happen before ours. */
		p = atomic_exchange_explicit(&c->slot[k][i], NULL,
					     memory_order_acquire);
		if (!p)
			continue;
		/* relaxed: counters; the slot's exchange moved the block. */
		atomic_fetch_sub_explicit(&c->bytes, *got,
					  memory_order_relaxed);
		atomic_fetch_add_explicit(&c->hits, 1, memory_order_relaxed);
		CACHE_UNPOISON(p, *got);
		return p;
	}
	return raw_alloc(*got);
}

void fa_cache_free(struct fa_cache *c, void *p, size_t size)
{
	unsigned shift, i;
	int k;

	if (!p)
		return;
	k = size_class(size, &shift);
	if (k < 0) {
		fanout__free(p, size);
		return;
	}
	/* relaxed: the cap is a bound on memory, not an ordering.  Raised
	 * before the put, so the sum never under-counts the slots. */
	if (atomic_fetch_add_explicit(&c->bytes, size, memory_order_relaxed) +
		    size >
	    FA_CACHE_BYTES)
		goto no_room;
	CACHE_POISON(p, size);
	for (i = 0; i < FA_CACHE_SLOTS; i++) {
		void *expect = NULL;

		/* relaxed: a look before the CAS. */
		if (atomic_load_explicit(&c->slot[k][i], memory_order_relaxed))
			continue;
		/* release: pairs with the acquire exchange in
		 * fa_cache_alloc(); relaxed on failure, nothing is read. */
		if (atomic_compare_exchange_strong_explicit(
			    &c->slot[k][i], &expect, p, memory_order_release,
			    memory_order_relaxed))
			return;
	}
	CACHE_UNPOISON(p, size);
no_room: /* relaxed: undoing our own increment */
	atomic_fetch_sub_explicit(&c->bytes, size, memory_order_relaxed);
	fanout__free(p, size);
}

void fa_cache_drain(struct fa_cache *c)
{
	unsigned k, i;

	for (k = 0; k < FA_CACHE_CLASSES; k++)
		for (i = 0; i < FA_CACHE_SLOTS; i++) {
			/* acquire: pairs with the release CAS in
			 * fa_cache_free(), like a take: the putter's last
			 * accesses (an RCU callback's) precede the free. */
			void *p = atomic_exchange_explicit(
				&c->slot[k][i], NULL, memory_order_acquire);
			size_t size = (size_t)1 << (k + FA_CACHE_MIN_SHIFT);

			if (!p)
				continue;
			atomic_fetch_sub_explicit(&c->bytes, size,
						  memory_order_relaxed);
			CACHE_UNPOISON(p, size);
			fanout__free(p, size);
		}
}
