/* SPDX-License-Identifier: MIT */
/*
 * test_memory.c - the cache of large record blocks (lib/blocks.c), and
 * the thread's limbo that serves blocks under 1 MiB first (lib/record.c).
 *
 * Records of big batches (16 KiB and more) are freed by RCU callbacks in
 * bursts; the engine keeps up to 32 MiB of them for the next dispatches,
 * and gives the rest back to the allocator.  These tests check that blocks
 * are reused, that the cache never holds more than its cap however many
 * big delegations were in flight, and that fault injection still reaches
 * a dispatch the cache could serve.
 */
#include "common.h"

#include <sys/resource.h>
#include <unistd.h>

#include "fanout_testing.h"

#define CACHE_CAP ((size_t)32 << 20)

static void block_cache(struct fanout_engine *e, size_t *bytes, uint64_t *hits)
{
	assert_int_equal(fanout_test_block_cache(e, bytes, hits), 0);
}

/* Dispatch @k delegations of @n children at once, then take and check
 * every event; returns with all of them freed.  The first child of each
 * waits at a gate opened only after the last dispatch, so no record
 * finishes (and none is pruned and freed) while the wave allocates: the
 * counts below do not depend on timing. */
static void wave(struct fanout_engine *e, unsigned k, unsigned n)
{
	struct tbatch **tb = calloc(k, sizeof(*tb));
	fanout_id *ids = calloc(k, sizeof(*ids));
	atomic_int gate = 0;

	assert_non_null(tb);
	assert_non_null(ids);
	for (unsigned i = 0; i < k; i++) {
		tb[i] = tb_new(n);
		tb[i]->b.user = tb[i];
		tb[i]->probes[0].gate = &gate;
		ids[i] = must_dispatch(e, tb[i]);
	}
	atomic_store(&gate, 1);
	for (unsigned i = 0; i < k; i++) {
		struct fanout_event *ev = must_wait(fanout_default_sink(e));
		struct tbatch *t = ev->user;
		unsigned j;

		for (j = 0; j < k && tb[j] != t; j++)
			;
		assert_true(j < k);
		assert_true(ev->id == ids[j]);
		check_all_completed(ev, t);
		fanout_event_free(ev);
	}
	for (unsigned i = 0; i < k; i++)
		tb_free(tb[i]);
	free(tb);
	free(ids);
}

/* keep_completed = 1 everywhere: a finished record is freed as soon as the
 * next one finishes (the latest stays for lookup, holding its block).
 * Batches of BIG children have blocks of 2 MiB, too big for a thread's
 * limbo (record.c), which would take smaller ones back before the cache
 * saw them (test_epoch). */
#define BIG 16384u

static void large_blocks_are_reused(void **state)
{
	struct fanout_engine *e = NEW_ENGINE(.workers = 2, .keep_completed = 1,
					     .max_children = BIG);
	size_t bytes, bytes1;
	uint64_t hits, hits1;

	block_cache(e, &bytes, &hits);
	assert_int_equal(bytes, 0);
	assert_int_equal(hits, 0);

	/* Small records never go through the cache. */
	wave(e, 4, 8);
	fanout_test_quiesce();
	block_cache(e, &bytes, &hits);
	assert_int_equal(bytes, 0);
	assert_int_equal(hits, 0);

	/* Four blocks of BIG children: once their events are freed, the
	 * kept records are tombs (table.c), so all four blocks are freed
	 * after the grace period, into the cache... */
	wave(e, 4, BIG);
	fanout_test_quiesce();
	block_cache(e, &bytes1, &hits1);
	assert_true(bytes1 > 0);
	assert_int_equal(bytes1 % 4, 0);
	assert_int_equal(hits1, 0);

	/* ...the next four dispatches of that size take those four, and the
	 * four come back: no block more. */
	wave(e, 4, BIG);
	block_cache(e, &bytes, &hits);
	assert_int_equal(hits, 4);
	fanout_test_quiesce();
	block_cache(e, &bytes, &hits);
	assert_int_equal(bytes, bytes1);
	assert_int_equal(hits, 4);

	/* From now on every dispatch is served from the cache, and it holds
	 * the same four blocks after each round. */
	for (int r = 0; r < 10; r++) {
		wave(e, 4, BIG);
		fanout_test_quiesce();
	}
	block_cache(e, &bytes, &hits);
	assert_int_equal(hits, 44);
	assert_int_equal(bytes, bytes1);
	fanout_destroy(e);
}

static void block_cache_stays_under_its_cap(void **state)
{
	/* 24 delegations of 16384 children in flight: ~1.5 MB blocks, 2 MiB
	 * each once rounded, 48 MiB in all - more than the cache may keep. */
	struct fanout_engine *e =
		NEW_ENGINE(.workers = 2, .max_children = 16384,
			   .keep_completed = 1);
	size_t bytes;
	uint64_t hits;

	wave(e, 24, 16384);
	fanout_test_quiesce();
	block_cache(e, &bytes, &hits);
	assert_true(bytes > 0);
	assert_true(bytes <= CACHE_CAP);
	assert_int_equal(hits, 0);

	/* Again: the cap holds with blocks coming and going. */
	wave(e, 24, 16384);
	fanout_test_quiesce();
	block_cache(e, &bytes, &hits);
	assert_true(bytes > 0);
	assert_true(bytes <= CACHE_CAP);
	assert_true(hits > 0 && hits <= 24);
	fanout_destroy(e);
}

/* A thread that only consumes events keeps no limbo of their blocks
 * (lib/record.c): it would never reuse them, so they go to the engine's
 * cache, where the dispatching thread finds them.  One worker, so that
 * the consumer drops every last reference (the runner drops its own
 * before the event is published).  Blocks of 2048 children: 256 KiB,
 * small enough for a limbo. */
struct consumer {
	struct fanout_engine *e;
	unsigned n;
};

static void *consume(void *arg)
{
	struct consumer *c = arg;

	/* A read-side section first: the thread gets the exit hook that a
	 * limbo needs, so only the rule above keeps the blocks out. */
	fanout_test_read_section(true);
	fanout_test_read_section(false);
	for (unsigned i = 0; i < c->n; i++) {
		struct fanout_event *ev = NULL;

		CHECK(fanout_wait(fanout_default_sink(c->e), &ev, WAIT_MS) ==
		      0);
		CHECK(ev->ncompleted == 2048);
		fanout_event_free(ev);
	}
	return NULL;
}

static void a_consumer_thread_feeds_the_cache(void **state)
{
	struct fanout_engine *e = NEW_ENGINE(.workers = 1, .keep_completed = 1);
	struct consumer c = {e, 4};
	struct tbatch *tb = tb_new(2048);
	size_t bytes;
	uint64_t hits;
	pthread_t t;

	for (unsigned i = 0; i < c.n; i++)
		must_dispatch(e, tb);
	t = spawn(consume, &c);
	join(t);
	fanout_test_quiesce();
	block_cache(e, &bytes, &hits);
	assert_true(bytes >= 3 * (size_t)2048 * sizeof(struct fanout_result));
	tb_free(tb);
	fanout_destroy(e);
}

/* A dispatch that the cache could serve still fails cleanly when its
 * allocation is made to fail, and leaves the cached block for the next. */
static void cached_dispatch_obeys_fault_injection(void **state)
{
	struct fanout_engine *e = NEW_ENGINE(.workers = 2, .keep_completed = 1,
					     .max_children = BIG);
	struct tbatch *tb = tb_new(BIG);
	size_t bytes, bytes1;
	uint64_t hits;
	fanout_id id;

	wave(e, 2, BIG); /* one pruned, one kept */
	fanout_test_quiesce();
	block_cache(e, &bytes1, &hits);
	assert_true(bytes1 > 0);

	fanout_test_fail_at(FANOUT_FAULT_ALLOC, 1);
	assert_int_equal(fanout_dispatch(e, &tb->b, &id), -ENOMEM);
	fanout_test_fail_at(FANOUT_FAULT_ALLOC, 0);
	assert_int_equal(tb_runs(tb), 0);
	block_cache(e, &bytes, &hits);
	assert_int_equal(bytes, bytes1);
	assert_int_equal(hits, 0);
	assert_int_equal(stats_of(e).running, 0);

	wave(e, 1, BIG);
	block_cache(e, &bytes, &hits);
	assert_int_equal(hits, 1);
	tb_free(tb);
	fanout_destroy(e);
}

#ifdef FANOUT_JEMALLOC
/* Minor page faults of the process so far. */
static long minor_faults(void)
{
	struct rusage ru;

	assert_int_equal(getrusage(RUSAGE_SELF, &ru), 0);
	return ru.ru_minflt;
}

/* Back-to-back batches of 192 children (a block of ~20 KiB, one of the
 * block cache's classes) fault no pages in once warm.  Their blocks used
 * to come back through call_rcu in bursts of hundreds, of which the
 * cache kept 32; jemalloc got the rest, purged the emptied extents, and
 * the next dispatches faulted fresh pages in: ~2,700 faults in 3,000
 * delegations here (bench/PROFILE.txt phase 11).  Now the consumer's
 * limbo hands each block back.  One worker, and each event freed one
 * step behind (as in test_epoch's background_reuse), so that this thread
 * drops every last reference whatever the scheduling; a block held back
 * while the worker sits in a read-side section is not lost, and the
 * bound leaves room for a loaded machine. */
static void mid_size_batches_do_not_fault_pages_in(void **state)
{
	struct fanout_engine *e = NEW_ENGINE(.workers = 1);
	struct tbatch *tb = tb_new(192);
	struct fanout_event *held = NULL, *ev;
	long before = 0;

	for (int r = 0; r < 2; r++) {
		if (r == 1)
			before = minor_faults();
		for (int i = 0; i < 3000; i++) {
			must_dispatch(e, tb);
			ev = must_wait(fanout_default_sink(e));
			assert_int_equal(ev->ncompleted, 192);
			if (held)
				fanout_event_free(held);
			held = ev;
		}
	}
	assert_true(minor_faults() - before < 300);
	fanout_event_free(held);
	tb_free(tb);
	fanout_destroy(e);
}

/* Resident set now, in KiB (/proc/self/statm, second field in pages). */
static long rss_kb(void)
{
	FILE *f = fopen("/proc/self/statm", "r");
	long size, resident;

	assert_non_null(f);
	assert_int_equal(fscanf(f, "%ld %ld", &size, &resident), 2);
	fclose(f);
	return resident * (sysconf(_SC_PAGESIZE) / 1024);
}

/* The process does not grow with the number of big delegations (the
 * shipped build only: sanitizers keep freed memory in quarantine).  Before
 * the cache, a private jemalloc arena that never purged kept carving fresh
 * pages: ~40 KB more per delegation of 512 children, ~190 MB here. */
static void big_delegations_do_not_grow_the_process(void **state)
{
	/* Default keep_completed: 1024 kept records of ~45 KB each are the
	 * steady state; the warm-up fills that ring. */
	struct fanout_engine *e = NEW_ENGINE(.workers = 2);
	long before;

	for (int r = 0; r < 400; r++)
		wave(e, 4, 512);
	before = rss_kb();
	for (int r = 0; r < 1250; r++) /* 5000 delegations more */
		wave(e, 4, 512);
	assert_true(rss_kb() - before < 64 * 1024);
	fanout_destroy(e);
}

/* A kept finished record whose event was freed costs its tomb, not its
 * block (table.c, "Tombs"): 600 delegations of 2048 children (a 256 KiB
 * block each) all stay listed with the default keep_completed = 1024,
 * and the process does not grow by their blocks (~150 MB if kept). */
static void kept_records_do_not_hold_their_blocks(void **state)
{
	struct fanout_engine *e = NEW_ENGINE(.workers = 2);
	struct fanout_info *infos = calloc(700, sizeof(*infos));
	size_t n = 0;
	long before;

	assert_non_null(infos);
	wave(e, 4, 2048); /* warm the block cache */
	fanout_test_quiesce();
	before = rss_kb();
	for (int r = 0; r < 150; r++)
		wave(e, 4, 2048);
	fanout_test_quiesce();
	assert_true(rss_kb() - before < 32 * 1024);
	assert_int_equal(fanout_list(e, infos, 700, &n), 0);
	assert_int_equal(n, 604);
	for (size_t i = 0; i < n; i++) {
		assert_int_equal(infos[i].status, FANOUT_COMPLETED);
		assert_int_equal(infos[i].ntasks, 2048);
		assert_int_equal(infos[i].ndone, 2048);
	}
	free(infos);
	fanout_destroy(e);
}
#endif

static void block_cache_hook_rejects_null(void **state)
{
	struct fanout_engine *e = NEW_ENGINE(.workers = 1);
	size_t bytes;
	uint64_t hits;

	assert_int_equal(fanout_test_block_cache(NULL, &bytes, &hits), -EINVAL);
	assert_int_equal(fanout_test_block_cache(e, NULL, &hits), -EINVAL);
	assert_int_equal(fanout_test_block_cache(e, &bytes, NULL), -EINVAL);
	fanout_destroy(e);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		TC(large_blocks_are_reused),
		TC(block_cache_stays_under_its_cap),
		TC(cached_dispatch_obeys_fault_injection),
		TC(a_consumer_thread_feeds_the_cache),
		TC(block_cache_hook_rejects_null),
#ifdef FANOUT_JEMALLOC
		TC(big_delegations_do_not_grow_the_process),
		TC(mid_size_batches_do_not_fault_pages_in),
		TC(kept_records_do_not_hold_their_blocks),
#endif
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
