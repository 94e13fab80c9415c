/* SPDX-License-Identifier: MIT */
/*
 * test_epoch.c - record blocks under 1 MiB, of synchronous and background
 * delegations, come back to the thread that retired them (lib/record.c
 * "Limbo", lib/epoch.c), and never while a read-side section that could
 * hold them is open.
 *
 * fanout_test_blocks_reused() counts blocks a dispatch took from its
 * thread's limbo; fanout_test_read_section() opens a section as lookups
 * do.  Under ASan a block reused too early, or one left in the limbo of an
 * exited thread, is a report (use after reuse shows up as a wrong id or
 * count here; a leaked limbo as a leak at exit).
 */
#include "common.h"

#include <unistd.h>

#include "section.h"

static int nop_fn(struct fanout_child *c, void *arg)
{
	(void)c;
	(void)arg;
	return 0;
}

/* fanout_run of @n no-op children, checking the event. */
static void run_n(struct fanout_engine *e, unsigned n)
{
	struct fanout_task t[4];
	struct fanout_batch b = {.tasks = t, .ntasks = n};
	struct fanout_event *ev = NULL;

	for (unsigned i = 0; i < n; i++)
		t[i] = (struct fanout_task){"nop", nop_fn, NULL};
	assert_int_equal(fanout_run(e, &b, &ev), 0);
	assert_non_null(ev);
	assert_int_equal(ev->nresults, n);
	assert_int_equal(ev->status, FANOUT_COMPLETED);
	fanout_event_free(ev);
}

/* Back-to-back synchronous delegations reuse their blocks.  The only
 * worker is kept busy, so this thread runs every child and drops every
 * last reference itself: all but the first LIMBO_ADVANCE or so blocks
 * come back, whatever the timing. */
static void small_blocks_come_back(void **state)
{
	(void)state;
	struct fanout_engine *e = NEW_ENGINE(.workers = 1);
	struct tbatch *busy = tb_new(1);
	atomic_int gate = 0;
	struct fanout_event *ev;
	uint64_t before;

	tb_gate(busy, &gate);
	must_dispatch(e, busy);
	assert_true(wait_ge(&busy->probes[0].runs, 1, WAIT_MS));
	before = fanout_test_blocks_reused();
	for (unsigned i = 0; i < 2000; i++)
		run_n(e, 1);
	/* Without the limbo every dispatch allocates: 0 reused. */
	assert_true(fanout_test_blocks_reused() - before >= 1900);
	atomic_store(&gate, 1);
	ev = must_wait(fanout_default_sink(e));
	fanout_event_free(ev);
	tb_free(busy);
	fanout_destroy(e);
}

/* Background delegations' blocks come back too.  With one worker, which
 * runs one token at a time to its end, a delegation's event arriving
 * means the worker dropped the previous one's token reference: freeing
 * the previous event, one step behind, drops that record's last
 * reference on this thread, whose next dispatch can take the block back.
 * Blocks come back unless a worker is inside a read-side section when
 * the epoch is checked, which holds a block back but never loses it.
 * @n children: 32 make a small block, 2048 one of the engine block
 * cache's classes (256 KiB). */
static void background_reuse(unsigned n, unsigned rounds)
{
	struct fanout_engine *e = NEW_ENGINE(.workers = 1);
	struct fanout_task *t = calloc(n, sizeof(*t));
	struct fanout_batch b = {.tasks = t, .ntasks = n};
	struct fanout_event *held = NULL, *ev;
	uint64_t before;
	fanout_id id;

	assert_non_null(t);
	for (unsigned i = 0; i < n; i++)
		t[i] = (struct fanout_task){"nop", nop_fn, NULL};
	fanout_test_quiesce(); /* empties this thread's limbo */
	before = fanout_test_blocks_reused();
	for (unsigned i = 0; i < rounds; i++) {
		assert_int_equal(fanout_dispatch(e, &b, &id), 0);
		ev = must_wait(fanout_default_sink(e));
		/* A reused block that was still in use shows as another
		 * delegation's id or count. */
		assert_true(ev->id == id);
		assert_int_equal(ev->nresults, n);
		assert_int_equal(ev->ncompleted, n);
		if (held)
			fanout_event_free(held);
		held = ev;
	}
	fanout_event_free(held);
	/* Before background records (and big blocks) had a limbo: 0. */
	assert_true(fanout_test_blocks_reused() - before >= rounds / 2);
	free(t);
	fanout_destroy(e);
}

static void background_blocks_come_back(void **state)
{
	(void)state;
	background_reuse(32, 2000);
}

static void big_blocks_come_back(void **state)
{
	(void)state;
	background_reuse(2048, 300);
}

/* While another thread is inside a section opened before them, no block
 * retired after it opened is reused; once it leaves, reuse resumes. */
static void an_open_section_holds_blocks_back(void **state)
{
	(void)state;
	struct fanout_engine *e = NEW_ENGINE(.workers = 1);
	struct holder h = {0};
	uint64_t before;
	pthread_t t;

	fanout_test_quiesce(); /* empties this thread's limbo */
	t = spawn(hold_section, &h);
	assert_true(wait_flag(&h.inside, WAIT_MS));
	before = fanout_test_blocks_reused();
	for (unsigned i = 0; i < 300; i++)
		run_n(e, 1);
	assert_true(fanout_test_blocks_reused() == before);
	atomic_store(&h.release, 1);
	join(t);
	before = fanout_test_blocks_reused();
	for (unsigned i = 0; i < 300; i++)
		run_n(e, 1);
	assert_true(fanout_test_blocks_reused() > before);
	fanout_destroy(e);
}

/* Lookups and lists race with reuse: a lookup answers for the id it was
 * asked about, with that delegation's user pointer, or not at all.  The
 * only worker is busy, so this thread drops every last reference and
 * reuses blocks while the lookups run (as in small_blocks_come_back). */
#define CHURN 3000

struct churn {
	struct fanout_engine *e;
	_Atomic fanout_id ids[CHURN];
	atomic_int next, stop;
};

static void *look(void *arg)
{
	struct churn *c = arg;
	struct fanout_info info, list[16];
	size_t n;

	while (!atomic_load(&c->stop)) {
		int k = atomic_load(&c->next);

		for (int i = k > 64 ? k - 64 : 0; i < k; i++) {
			fanout_id id = atomic_load(&c->ids[i]);

			if (!id || fanout_lookup(c->e, id, &info))
				continue;
			CHECK(info.id == id);
			CHECK(info.user == (void *)(uintptr_t)(i + 1));
			CHECK(info.ntasks == 1);
		}
		n = 0;
		CHECK(fanout_list(c->e, list, 16, &n) == 0);
		sleep_us(20); /* let the epoch move now and then */
		for (size_t j = 0; j < n && j < 16; j++)
			CHECK(list[j].ntasks == 1 &&
			      (uintptr_t)list[j].user <= CHURN + 1);
	}
	return NULL;
}

static void lookups_race_with_reuse(void **state)
{
	(void)state;
	struct churn *c = calloc(1, sizeof(*c));
	struct tbatch *busy = tb_new(1);
	atomic_int gate = 0;
	struct fanout_event *ev;
	pthread_t t[2];

	assert_non_null(c);
	c->e = NEW_ENGINE(.workers = 1);
	tb_gate(busy, &gate);
	busy->b.user = (void *)(uintptr_t)(CHURN + 1);
	must_dispatch(c->e, busy);
	assert_true(wait_ge(&busy->probes[0].runs, 1, WAIT_MS));
	t[0] = spawn(look, c);
	t[1] = spawn(look, c);
	for (unsigned i = 0; i < CHURN; i++) {
		struct fanout_task tk = {"nop", nop_fn, NULL};
		struct fanout_batch b = {.tasks = &tk,
					 .ntasks = 1,
					 .user = (void *)(uintptr_t)(i + 1)};

		ev = NULL;
		assert_int_equal(fanout_run(c->e, &b, &ev), 0);
		atomic_store(&c->ids[i], ev->id);
		atomic_store(&c->next, (int)i + 1);
		assert_true(ev->user == b.user);
		fanout_event_free(ev);
	}
	atomic_store(&c->stop, 1);
	join(t[0]);
	join(t[1]);
	/* How many blocks came back depends on how often a lookup was inside
	 * a section when this thread looked (sanitizers slow the lookups
	 * down); small_blocks_come_back counts them.  What this test checks
	 * are the answers above. */
	atomic_store(&gate, 1);
	ev = must_wait(fanout_default_sink(c->e));
	fanout_event_free(ev);
	tb_free(busy);
	fanout_destroy(c->e);
	free(c);
}

static void *runs_then_exits(void *arg)
{
	struct fanout_engine *e = arg;
	uint64_t before = fanout_test_blocks_reused();

	for (unsigned i = 0; i < 500; i++)
		run_n(e, 2);
	CHECK(fanout_test_blocks_reused() > before);
	return NULL; /* its limbo goes to RCU at exit (LSan checks) */
}

static void an_exiting_thread_gives_its_blocks_back(void **state)
{
	(void)state;
	struct fanout_engine *e = NEW_ENGINE(.workers = 1);

	for (int k = 0; k < 4; k++)
		join(spawn(runs_then_exits, e));
	fanout_test_quiesce();
	fanout_destroy(e);
}

/* A thread keeps big blocks of an engine in its limbo, the engine is
 * destroyed, then the thread exits and its limbo goes to RCU: the blocks
 * go to the allocator, not to the gone engine's block cache (under ASan,
 * a use after free otherwise). */
struct outliver {
	struct fanout_engine *e;
	struct holder h; /* inside: blocks kept; release: engine gone */
};

static void *keeps_big_blocks(void *arg)
{
	struct outliver *o = arg;
	struct tbatch *tb = tb_new(2048);
	struct fanout_event *held = NULL, *ev;

	/* One event held back, as in background_reuse: the last three
	 * records' last references are dropped here, into the limbo. */
	for (unsigned i = 0; i < 4; i++) {
		CHECK(fanout_dispatch(o->e, &tb->b, NULL) == 0);
		CHECK(fanout_wait(fanout_default_sink(o->e), &ev, WAIT_MS) ==
		      0);
		CHECK(ev->ncompleted == 2048);
		if (held)
			fanout_event_free(held);
		held = ev;
	}
	fanout_event_free(held);
	tb_free(tb);
	atomic_store(&o->h.inside, 1);
	CHECK(wait_flag(&o->h.release, GATE_MS));
	return NULL;
}

static void a_limbo_outlives_its_engine(void **state)
{
	(void)state;
	struct outliver o = {.e = NEW_ENGINE(.workers = 1)};
	pthread_t t = spawn(keeps_big_blocks, &o);

	assert_true(wait_flag(&o.h.inside, WAIT_MS));
	fanout_destroy(o.e);
	atomic_store(&o.h.release, 1);
	join(t);
	fanout_test_quiesce(); /* the exited thread's limbo is freed */
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		TC(small_blocks_come_back),
		TC(background_blocks_come_back),
		TC(big_blocks_come_back),
		TC(an_open_section_holds_blocks_back),
		TC(lookups_race_with_reuse),
		TC(an_exiting_thread_gives_its_blocks_back),
		TC(a_limbo_outlives_its_engine),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
