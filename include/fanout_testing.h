/* SPDX-License-Identifier: MIT */
/*
 * fanout_testing.h - fault injection for fanout's own test suites.
 *
 * Not part of the stable API and not installed.  Each knob is a countdown:
 * after fanout_test_fail_at(what, k) with k > 0, the k-th following
 * operation of that kind (counted process-wide, over every engine) fails as
 * if the system had refused it; k = 0 disarms.  Thread-safe; meant to be
 * used while only the test's own thread calls into the library.
 */
#ifndef FANOUT_TESTING_H
#define FANOUT_TESTING_H

#include "fanout.h"

#ifdef __cplusplus
extern "C" {
#endif

enum fanout_fault {
	FANOUT_FAULT_ALLOC = 1,	  /* every allocation the library makes */
	FANOUT_FAULT_THREAD = 2,  /* pthread_create of a worker (-EAGAIN) */
	FANOUT_FAULT_EVENTFD = 3, /* eventfd() of a sink (-EMFILE) */
};

/**
 * fanout_test_fail_at() - arm (k > 0) or disarm (k = 0) one fault.
 * Return: the countdown left from before (0 = it fired or was disarmed);
 * -EINVAL for an unknown @what or k < 0.
 */
FANOUT_API long fanout_test_fail_at(enum fanout_fault what, long k);

/**
 * fanout_test_publish_gap() - from now on, every event is published in the
 * two steps of its sink queue's enqueue with @us microseconds between them
 * (0: at once, the default), as by a producer preempted in between: a
 * consumer then finds the sink not empty but its first event not yet
 * linked.  Process-wide.
 */
FANOUT_API void fanout_test_publish_gap(unsigned us);

/**
 * fanout_test_quiesce() - wait until every record released so far is freed.
 *
 * Records are freed by RCU callbacks after a grace period; this hands
 * over what waits for a batch, and the calling thread's limbo of record
 * blocks, then waits for them (and for records those callbacks release).
 * Blocks in other threads' limbos stay there until those threads
 * dispatch, exit or call this.  Blocks; never call it from a child.
 */
FANOUT_API void fanout_test_quiesce(void);

/**
 * fanout_test_block_cache() - the engine's cache of large record blocks.
 * @e:     the engine.
 * @bytes: receives the bytes it holds now (at most 32 MiB).
 * @hits:  receives how many dispatches took a block from it so far.
 * Return: 0, or -EINVAL for a NULL argument.
 */
FANOUT_API int fanout_test_block_cache(struct fanout_engine *e, size_t *bytes,
				       uint64_t *hits);

/**
 * fanout_test_mallctl() - jemalloc's mallctl(), on the library's own copy.
 *
 * libfanout.a carries a private jemalloc that serves fanout's blocks only;
 * the program's mallctl() (if it links jemalloc itself) reaches the other
 * one.  The bench counts the library's allocations through this.
 * Return: mallctl()'s result (0 or a positive errno); ENOSYS in builds
 * without jemalloc (sanitizers, libfanout.so).
 */
FANOUT_API int fanout_test_mallctl(const char *name, void *oldp,
				   size_t *oldlenp, void *newp, size_t newlen);

/**
 * fanout_test_offers_taken() - tokens of fanout_run batches that workers
 * took from work-first offers (not from the ring), summed over @e's
 * workers since it was created.  0 for NULL.
 */
FANOUT_API uint64_t fanout_test_offers_taken(struct fanout_engine *e);

/**
 * fanout_test_wait_was_patient() - whether the calling thread's last
 * fanout_wait() that had to spin did so with patience: no yield in its
 * first microseconds, for a waiter with at most two events untaken whose
 * own last dispatch did not have to wake a parked worker, and whose
 * sink's last batch had fewer than 512 children (lib/sink.c,
 * "Patience").  A wait that finds its event at once leaves it as it was.
 */
FANOUT_API bool fanout_test_wait_was_patient(void);

/**
 * fanout_test_blocks_reused() - record blocks that dispatches in this
 * process took back from their thread's limbo (blocks under 1 MiB
 * retired by the same thread, reused once no read-side section could hold
 * them) instead of allocating.  Exact for the calling thread's own
 * reuses; other threads' are added 16 at a time (and when they exit).
 */
FANOUT_API uint64_t fanout_test_blocks_reused(void);

/**
 * fanout_test_read_section() - enter (@enter true) or leave a read-side
 * section on the calling thread, as lookups, lists and cancels do around
 * their reads.  While a thread is inside, no block retired after it
 * entered is reused.  Sections nest; leave each one entered.
 */
FANOUT_API void fanout_test_read_section(bool enter);

/**
 * fanout_test_age_slot() - advance the generation of @id's table slot by
 * @uses, as if the slot had been handed out that many more times (ids
 * carry 40 bits of it: lib/table.c, "Ids").  Call it on a quiet engine,
 * on the id of a record whose slot is free or whose record finished.
 * Return: 0; -EINVAL (NULL @e, id 0); -ENOENT (@id's slot was never
 * allocated).
 */
FANOUT_API int fanout_test_age_slot(struct fanout_engine *e, fanout_id id,
				    uint64_t uses);

/*
 * Test points: places where a test can stop a thread, as a preemption
 * would, to force a rare interleaving.  Compiled only into the sanitizer
 * builds (-DFANOUT_TEST_POINTS: build/asan, build/tsan); the plain build,
 * which ships, has none.
 */
enum fanout_test_point {
	/* lib/table.c, fanout__table_retire: the event's freer read the kept
	 * ring's entry and is about to CAS its own in (@obj: the record). */
	FANOUT_AT_RETIRE_CAS = 1,
	/* lib/record.c, fanout__rec_put: between its two loads, `refs` and
	 * `pendings`, on the way to a free without an RMW (@obj: the record). */
	FANOUT_AT_PUT_LOADS = 2,
	/* lib/deleg.c, origin_get (a dispatch with batch.within): the child
	 * was not finished, under the read lock, before the CAS that takes a
	 * reference on its record (@obj: the record). */
	FANOUT_AT_ORIGIN_CHECKED = 3,
	/* lib/deleg.c, origin_get: the reference is taken, the read lock
	 * left (@obj: the record). */
	FANOUT_AT_ORIGIN_TAKEN = 4,
	/* lib/record.c, fanout__active_done: a finaliser dropped a
	 * background record's unit (shutdown may return now) and has not
	 * looked at `shutting` yet (@obj: the engine). */
	FANOUT_AT_ACTIVE_DONE = 5,
	/* lib/pending.c, fanout_pending_on_cancel: the interrupt came
	 * first and the registrant claimed running the callback, which it is
	 * about to call (@obj: the pending child). */
	FANOUT_AT_ON_CANCEL_RUN = 6,
};

/**
 * fanout_test_hook() - call @fn(@arg, point, obj) on every thread that
 * passes a test point from now on; NULL removes it.  @fn may block (that
 * is the point), and runs wherever the library is, sometimes inside a
 * read-side section: it must not call into the library.
 * Return: 0, or -ENOTSUP in a build without test points.
 */
FANOUT_API int fanout_test_hook(void (*fn)(void *arg, enum fanout_test_point at,
					   const void *obj),
				void *arg);

#ifdef __cplusplus
}
#endif
#endif
