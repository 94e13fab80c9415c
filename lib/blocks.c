/* SPDX-License-Identifier: MIT */
/*
 * blocks.c - the engine's cache of large record blocks (blocks.h).
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
 * The cache keeps up to BLOCKS_SLOTS blocks per power-of-two class,
 * BLOCKS_BYTES in all, and hands them back whole, warm and already
 * faulted in; what does not fit goes back to jemalloc, whose decay returns
 * it to the kernel.  (bench/PROFILE.txt has the measurements.)
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
#include "blocks.h"

#include "../queue/alloc.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define CACHE_POISON(p, n) ASAN_POISON_MEMORY_REGION(p, n)
#define CACHE_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#else
#define CACHE_POISON(p, n) ((void)(p), (void)(n))
#define CACHE_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

void fanout__blocks_init(struct fanout_blocks *c)
{
	unsigned k, i;

	atomic_init(&c->bytes, 0);
	atomic_init(&c->hits, 0);
	for (k = 0; k < BLOCKS_CLASSES; k++)
		for (i = 0; i < BLOCKS_SLOTS; i++)
			atomic_init(&c->slot[k][i], NULL);
}

/* The class of a block of @size bytes (its size is 1 << shift), or -1 when
 * such blocks are not cached. */
static int size_class(size_t size, unsigned *shift)
{
	unsigned s = BLOCKS_MIN_SHIFT;

	if (size < ((size_t)1 << BLOCKS_MIN_SHIFT) ||
	    size > ((size_t)1 << BLOCKS_MAX_SHIFT))
		return -1;
	while (((size_t)1 << s) < size)
		s++;
	*shift = s;
	return (int)(s - BLOCKS_MIN_SHIFT);
}

void *fanout__blocks_alloc(struct fanout_blocks *c, size_t size, size_t *got)
{
	unsigned shift, i;
	int k = size_class(size, &shift);
	void *p;

	if (k < 0) {
		*got = size;
		return fanout__alloc(size);
	}
	*got = (size_t)1 << shift;
	if (fanout__alloc_fault())
		return NULL;
	for (i = 0; i < BLOCKS_SLOTS; i++) {
		/* relaxed: only a look; the exchange below decides. */
		if (!atomic_load_explicit(&c->slot[k][i], memory_order_relaxed))
			continue;
		/* acquire: pairs with the release CAS in fanout__blocks_free(), so
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
	return fanout__alloc_unchecked(*got);
}

void fanout__blocks_free(struct fanout_blocks *c, void *p, size_t size)
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
	    BLOCKS_BYTES)
		goto no_room;
	CACHE_POISON(p, size);
	for (i = 0; i < BLOCKS_SLOTS; i++) {
		void *expect = NULL;

		/* relaxed: a look before the CAS. */
		if (atomic_load_explicit(&c->slot[k][i], memory_order_relaxed))
			continue;
		/* release: pairs with the acquire exchange in
		 * fanout__blocks_alloc(); relaxed on failure, nothing is read. */
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

void fanout__blocks_drain(struct fanout_blocks *c)
{
	unsigned k, i;

	for (k = 0; k < BLOCKS_CLASSES; k++)
		for (i = 0; i < BLOCKS_SLOTS; i++) {
			/* acquire: pairs with the release CAS in
			 * fanout__blocks_free(), like a take: the putter's last
			 * accesses (an RCU callback's) precede the free. */
			void *p = atomic_exchange_explicit(
				&c->slot[k][i], NULL, memory_order_acquire);
			size_t size = (size_t)1 << (k + BLOCKS_MIN_SHIFT);

			if (!p)
				continue;
			atomic_fetch_sub_explicit(&c->bytes, size,
						  memory_order_relaxed);
			CACHE_UNPOISON(p, size);
			fanout__free(p, size);
		}
}
