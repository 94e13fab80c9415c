/* SPDX-License-Identifier: MIT */
/*
 * testing.c - the fault-injection knobs of include/fanout_testing.h.
 * Correctness: each knob is one atomic countdown consumed by exactly one
 * failing operation (see queue/alloc.c, lib/blocks.c, queue/fq.c, lib/sink.c).
 */
#include "internal.h"
#include "fanout_testing.h"

#include <errno.h>

long fanout_test_fail_at(enum fanout_fault what, long k)
{
	_Atomic long *knob;

	switch (what) {
	case FANOUT_FAULT_ALLOC:
		knob = &fanout__fail_alloc_at;
		break;
	case FANOUT_FAULT_THREAD:
		knob = &fq__fail_thread_at;
		break;
	case FANOUT_FAULT_EVENTFD:
		knob = &fanout__fail_eventfd_at;
		break;
	default:
		return -EINVAL;
	}
	if (k < 0)
		return -EINVAL;
	/* relaxed: a test knob; the test's own thread sequences its use. */
	return atomic_exchange_explicit(knob, k, memory_order_relaxed);
}

void fanout_test_publish_gap(unsigned us)
{
	/* relaxed: a test knob; the test's own thread sequences its use. */
	atomic_store_explicit(&fanout__publish_gap_us, us,
			      memory_order_relaxed);
}

void fanout_test_quiesce(void)
{
	/* Twice, as in fanout_destroy(): the first barrier's callbacks may
	 * release records of their own (a destroyed sink's events). */
	fanout__engines_flush();
	rcu_barrier();
	fanout__engines_flush();
	rcu_barrier();
}

int fanout_test_mallctl(const char *name, void *oldp, size_t *oldlenp,
			void *newp, size_t newlen)
{
	return fanout__mallctl(name, oldp, oldlenp, newp, newlen);
}

int fanout_test_block_cache(struct fanout_engine *e, size_t *bytes,
			    uint64_t *hits)
{
	if (!e || !bytes || !hits)
		return -EINVAL;
	/* relaxed: statistics, read while the test's own thread is quiet. */
	*bytes = atomic_load_explicit(&e->blocks.bytes, memory_order_relaxed);
	*hits = atomic_load_explicit(&e->blocks.hits, memory_order_relaxed);
	return 0;
}

uint64_t fanout_test_blocks_reused(void)
{
	return fanout__limbo_reused();
}

int fanout_test_age_slot(struct fanout_engine *e, fanout_id id, uint64_t uses)
{
	if (!e || !id)
		return -EINVAL;
	return fanout__table_age_slot(e, id, uses);
}

void fanout_test_read_section(bool enter)
{
	if (enter)
		fanout__read_lock();
	else
		fanout__read_unlock();
}

bool fanout_test_wait_was_patient(void)
{
	return fanout__wait_was_patient();
}

uint64_t fanout_test_offers_taken(struct fanout_engine *e)
{
	struct fq_worker_stats st;
	uint64_t n = 0;
	unsigned i;

	for (i = 0; e && i < e->cfg.workers; i++) {
		fq_worker_stats(e->q, i, &st);
		n += st.offers;
	}
	return n;
}

#ifdef FANOUT_TEST_POINTS
typedef void (*test_hook_fn)(void *arg, enum fanout_test_point at,
			     const void *obj);
static _Atomic test_hook_fn test_hook;
static void *_Atomic test_hook_arg;

void fanout__test_point(enum fanout_test_point at, const void *obj)
{
	/* acquire: pairs with the release store in fanout_test_hook(), so
	 * the argument stored before it is seen. */
	test_hook_fn fn =
		atomic_load_explicit(&test_hook, memory_order_acquire);

	if (fn)
		fn(atomic_load_explicit(&test_hook_arg, memory_order_relaxed),
		   at, obj);
}
#endif

int fanout_test_hook(void (*fn)(void *arg, enum fanout_test_point at,
				const void *obj),
		     void *arg)
{
#ifdef FANOUT_TEST_POINTS
	/* relaxed: published by the release store below. */
	atomic_store_explicit(&test_hook_arg, arg, memory_order_relaxed);
	atomic_store_explicit(&test_hook, fn, memory_order_release);
	return 0;
#else
	(void)fn;
	(void)arg;
	return -ENOTSUP;
#endif
}
