/* SPDX-License-Identifier: MIT */
/*
 * test_join.c - fanout_batch.join: FIRST_ERROR, ANY, QUORUM interrupt the
 * rest (unstarted skipped, running see fanout_interrupted, pending
 * abandoned); ALL unchanged; bad policies refused; policies on fanout_run.
 */
#include "defer.h"

static struct fanout_engine *eng2(void)
{
	return NEW_ENGINE(.workers = 2, .flags = FANOUT_NO_PIN);
}

/* The first @k children to start return @ret at once; the rest spin until
 * interrupted. */
struct ticket {
	atomic_int next;
	int k;
	int ret;
	atomic_int spun;
};

static int ticket_fn(struct fanout_child *c, void *arg)
{
	struct ticket *t = arg;

	if (atomic_fetch_add(&t->next, 1) < t->k)
		return t->ret;
	return spin_fn(c, &t->spun);
}

/*
 * FIRST_ERROR: child 0 defers (pending), child 1 spins (running), one of
 * children 2/3 fails once the gate opens; max_children 3 keeps the other
 * from starting.  The error interrupts the rest.
 */
static void first_error_interrupts_rest(void **state)
{
	struct fanout_engine *e = NEW_ENGINE(.workers = 2, .max_children = 3,
					     .flags = FANOUT_NO_PIN);
	struct mbatch *mb = mb_new(4);
	struct cbrec r = {0};
	atomic_int spun = 0, gate = 0;

	mb->d[0].on_cancel = cb_fn;
	mb->d[0].on_cancel_arg = &r;
	mb->tasks[1] = (struct fanout_task){"spin", spin_fn, &spun};
	for (unsigned i = 2; i < 4; i++) {
		mb_sync(mb, i)->gate = &gate;
		mb->pr[i].ret = -EIO;
	}
	mb->b.join = FANOUT_JOIN_FIRST_ERROR;
	fanout_id id = must_dispatch_b(e, &mb->b);
	struct fanout_pending *p = dc_wait(&mb->d[0]);
	assert_non_null(p);
	assert_true(wait_flag(&spun, WAIT_MS));
	uint64_t end = mono_ms() + WAIT_MS;
	while (atomic_load(&mb->pr[2].runs) + atomic_load(&mb->pr[3].runs) <
	       1) {
		assert_true(mono_ms() < end);
		sleep_us(100);
	}
	assert_false(fanout_pending_interrupted(p));
	atomic_store(&gate, 1);

	struct fanout_event *ev = must_wait(fanout_default_sink(e));
	assert_true(ev->id == id);
	check_shape(ev, 4);
	assert_true(ev->interrupted_by_policy);
	assert_false(ev->timed_out);
	assert_int_equal(ev->status, FANOUT_ERROR);
	assert_int_equal(ev->nerror, 1);
	assert_int_equal(ev->ninterrupted, 3);
	/* pending: abandoned, on_cancel ran once */
	assert_int_equal(ev->results[0].status, FANOUT_INTERRUPTED);
	assert_int_equal(ev->results[0].code, -ECANCELED);
	assert_int_equal(atomic_load(&r.calls), 1);
	assert_true(fanout_pending_interrupted(p));
	assert_int_equal(fanout_complete(p, NULL), -EALREADY);
	/* running: saw fanout_interrupted */
	assert_int_equal(ev->results[1].status, FANOUT_INTERRUPTED);
	assert_int_equal(ev->results[1].code, -ECANCELED);
	assert_int_equal(atomic_load(&spun), 1);
	/* the failed one, and the one that never started */
	unsigned f = atomic_load(&mb->pr[2].runs) ? 2 : 3, u = 5 - f;
	assert_int_equal(ev->results[f].status, FANOUT_ERROR);
	assert_int_equal(ev->results[f].code, -EIO);
	assert_int_equal(ev->results[u].status, FANOUT_INTERRUPTED);
	assert_int_equal(ev->results[u].code, -ECANCELED);
	assert_int_equal(ev->results[u].duration_ns, 0);
	assert_int_equal(atomic_load(&mb->pr[u].runs), 0);
	fanout_event_free(ev);
	assert_no_event(fanout_default_sink(e));
	fanout_destroy(e);
	assert_int_equal(atomic_load(&mb->pr[u].runs), 0);
	mb_free(mb);
}

/* FIRST_ERROR without an error (an interrupted child is no error). */
static void first_error_without_error(void **state)
{
	struct fanout_engine *e = eng2();
	struct mbatch *mb = mb_new(4);

	mb_sync(mb, 0)->ret = 0;
	mb_sync(mb, 1)->ret = -ECANCELED;
	mb->b.join = FANOUT_JOIN_FIRST_ERROR;
	fanout_id id = must_dispatch_b(e, &mb->b);
	struct fanout_pending *p2 = dc_wait(&mb->d[2]);
	struct fanout_pending *p3 = dc_wait(&mb->d[3]);
	assert_true(wait_flag(&mb->pr[0].finished, WAIT_MS));
	assert_true(wait_flag(&mb->pr[1].finished, WAIT_MS));
	struct fanout_info info;
	WAIT_INFO(e, id, info, info.ndone == 2);
	assert_false(fanout_pending_interrupted(p2));
	assert_int_equal(info.status, FANOUT_RUNNING);
	assert_int_equal(fanout_complete(p2, NULL), 0);
	assert_int_equal(fanout_complete(p3, NULL), 0);
	struct fanout_event *ev = must_wait(fanout_default_sink(e));
	assert_true(ev->id == id);
	check_shape(ev, 4);
	assert_false(ev->interrupted_by_policy);
	assert_int_equal(ev->ncompleted, 3);
	assert_int_equal(ev->results[1].status, FANOUT_INTERRUPTED);
	fanout_event_free(ev);
	fanout_destroy(e);
	mb_free(mb);
}

/* ANY: errors do not count; the first completed child interrupts the rest. */
static void any_first_completed(void **state)
{
	struct fanout_engine *e = eng2();
	struct mbatch *mb = mb_new(3);
	atomic_int spun = 0;
	struct fanout_info info;

	mb->tasks[2] = (struct fanout_task){"spin", spin_fn, &spun};
	mb->d[0].o.code = -EIO;
	mb->d[1].o =
		(struct fanout_outcome){.summary = "winner", .summary_len = 6};
	mb->b.join = FANOUT_JOIN_ANY;
	fanout_id id = must_dispatch_b(e, &mb->b);
	struct fanout_pending *p1 = dc_wait(&mb->d[1]);
	assert_true(wait_flag(&spun, WAIT_MS));
	assert_int_equal(dc_complete(&mb->d[0]), 0);
	assert_int_equal(fanout_lookup(e, id, &info), 0);
	assert_int_equal(info.status, FANOUT_RUNNING);
	assert_false(fanout_pending_interrupted(p1));
	assert_int_equal(fanout_complete(p1, &mb->d[1].o), 0);
	struct fanout_event *ev = must_wait(fanout_default_sink(e));
	assert_true(ev->id == id);
	check_shape(ev, 3);
	assert_true(ev->interrupted_by_policy);
	assert_int_equal(ev->status, FANOUT_COMPLETED);
	assert_int_equal(ev->results[0].status, FANOUT_ERROR);
	assert_int_equal(ev->results[1].status, FANOUT_COMPLETED);
	assert_string_equal(ev->results[1].summary, "winner");
	assert_int_equal(ev->results[2].status, FANOUT_INTERRUPTED);
	assert_int_equal(ev->results[2].code, -ECANCELED);
	fanout_event_free(ev);
	fanout_destroy(e);
	mb_free(mb);
}

/* ANY: hedged requests, the loser's late completion gets -EALREADY. */
static void any_hedged_loser_abandoned(void **state)
{
	struct fanout_engine *e = eng2();
	struct mbatch *mb = mb_new(3);
	struct cbrec r[3] = {0};

	for (unsigned i = 0; i < 3; i++) {
		mb->d[i].on_cancel = cb_fn;
		mb->d[i].on_cancel_arg = &r[i];
	}
	mb->b.join = FANOUT_JOIN_ANY;
	fanout_id id = must_dispatch_b(e, &mb->b);
	for (unsigned i = 0; i < 3; i++)
		assert_non_null(dc_wait(&mb->d[i]));
	assert_int_equal(dc_complete(&mb->d[1]), 0);
	struct fanout_event *ev = must_wait(fanout_default_sink(e));
	assert_true(ev->id == id);
	assert_true(ev->interrupted_by_policy);
	assert_int_equal(ev->ncompleted, 1);
	assert_int_equal(ev->ninterrupted, 2);
	assert_int_equal(atomic_load(&r[1].calls), 0); /* the winner */
	for (unsigned i = 0; i < 3; i += 2) {
		assert_int_equal(atomic_load(&r[i].calls), 1);
		/* the policy ran the callbacks on the completing thread */
		assert_true(pthread_equal(r[i].thread, pthread_self()));
		assert_int_equal(ev->results[i].status, FANOUT_INTERRUPTED);
		assert_int_equal(dc_complete(&mb->d[i]), -EALREADY);
	}
	fanout_event_free(ev);
	fanout_destroy(e);
	mb_free(mb);
}

/* QUORUM k: k completed children interrupt the rest; errors do not count. */
static void quorum_interrupts_rest(void **state)
{
	struct fanout_engine *e = eng2();
	struct mbatch *mb = mb_new(5);
	struct fanout_info info;

	mb->d[1].o.code = -EIO;
	mb->d[4].o.code = -ECANCELED;
	mb->b.join = FANOUT_JOIN_QUORUM;
	mb->b.quorum = 2;
	fanout_id id = must_dispatch_b(e, &mb->b);
	for (unsigned i = 0; i < 5; i++)
		assert_non_null(dc_wait(&mb->d[i]));
	assert_int_equal(dc_complete(&mb->d[0]), 0);
	assert_int_equal(dc_complete(&mb->d[1]), 0);
	assert_int_equal(dc_complete(&mb->d[4]), 0);
	assert_int_equal(fanout_lookup(e, id, &info), 0);
	assert_int_equal(info.status, FANOUT_RUNNING);
	assert_int_equal(info.ndone, 3);
	assert_false(fanout_pending_interrupted(atomic_load(&mb->d[2].p)));
	assert_false(fanout_pending_interrupted(atomic_load(&mb->d[3].p)));
	assert_int_equal(dc_complete(&mb->d[2]), 0);
	struct fanout_event *ev = must_wait(fanout_default_sink(e));
	assert_true(ev->id == id);
	check_shape(ev, 5);
	assert_true(ev->interrupted_by_policy);
	assert_int_equal(ev->ncompleted, 2);
	assert_int_equal(ev->nerror, 1);
	assert_int_equal(ev->ninterrupted, 2);
	assert_int_equal(ev->results[3].status, FANOUT_INTERRUPTED);
	assert_int_equal(ev->results[3].code, -ECANCELED);
	assert_int_equal(dc_complete(&mb->d[3]), -EALREADY);
	fanout_event_free(ev);
	fanout_destroy(e);
	mb_free(mb);
}

/* quorum == ntasks: nothing is left to interrupt. */
static void quorum_all(void **state)
{
	struct fanout_engine *e = eng2();
	struct tbatch *tb = tb_new(3);

	tb->b.join = FANOUT_JOIN_QUORUM;
	tb->b.quorum = 3;
	fanout_id id = must_dispatch(e, tb);
	struct fanout_event *ev = must_wait(fanout_default_sink(e));
	assert_true(ev->id == id);
	check_all_completed(ev, tb);
	assert_false(ev->interrupted_by_policy);
	fanout_event_free(ev);
	/* quorum 1 of 1 */
	struct tbatch *one = tb_new(1);
	one->b.join = FANOUT_JOIN_QUORUM;
	one->b.quorum = 1;
	id = must_dispatch(e, one);
	ev = must_wait(fanout_default_sink(e));
	assert_true(ev->id == id);
	check_all_completed(ev, one);
	assert_false(ev->interrupted_by_policy);
	fanout_event_free(ev);
	fanout_destroy(e);
	tb_free(tb);
	tb_free(one);
}

/* JOIN_ALL: an error interrupts nothing. */
static void join_all_unchanged(void **state)
{
	struct fanout_engine *e = eng2();
	struct mbatch *mb = mb_new(3);
	struct fanout_info info;

	mb_sync(mb, 0)->ret = -EIO;
	mb->d[2].o.code = -EPERM;
	fanout_id id = must_dispatch_b(e, &mb->b);
	struct fanout_pending *p1 = dc_wait(&mb->d[1]);
	assert_true(wait_flag(&mb->pr[0].finished, WAIT_MS));
	assert_int_equal(dc_complete(&mb->d[2]), 0);
	WAIT_INFO(e, id, info, info.ndone == 2);
	assert_int_equal(info.status, FANOUT_RUNNING);
	assert_false(fanout_pending_interrupted(p1));
	assert_no_event(fanout_default_sink(e));
	assert_int_equal(fanout_complete(p1, NULL), 0);
	struct fanout_event *ev = must_wait(fanout_default_sink(e));
	assert_true(ev->id == id);
	check_shape(ev, 3);
	assert_false(ev->interrupted_by_policy);
	assert_false(ev->cancelled);
	assert_int_equal(ev->nerror, 2);
	assert_int_equal(ev->ncompleted, 1);
	fanout_event_free(ev);
	fanout_destroy(e);
	mb_free(mb);
}

/* Bad join/quorum: -EINVAL from every entry point, nothing changes. */
static void join_bad_input(void **state)
{
	struct fanout_engine *e = eng2();
	struct tbatch *tb = tb_new(3);
	struct fanout_event *ev = NULL;
	fanout_id id = 0;
	static const struct {
		unsigned join, quorum;
	} bad[] = {
		{FANOUT_JOIN_QUORUM, 0},
		{FANOUT_JOIN_QUORUM, 4},
		{FANOUT_JOIN_QUORUM, UINT_MAX},
		{FANOUT_JOIN_ALL, 1},
		{FANOUT_JOIN_FIRST_ERROR, 1},
		{FANOUT_JOIN_ANY, 2},
		{4, 0},
		{99, 1},
		{UINT_MAX, 0},
	};

	for (unsigned i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		tb->b.join = bad[i].join;
		tb->b.quorum = bad[i].quorum;
		if (fanout_dispatch(e, &tb->b, &id) != -EINVAL ||
		    fanout_run(e, &tb->b, &ev) != -EINVAL ||
		    fanout_delegate(e, &tb->b, &id, &ev) != -EINVAL)
			fail_msg("join %u quorum %u accepted", bad[i].join,
				 bad[i].quorum);
	}
	assert_null(ev);
	assert_int_equal(tb_runs(tb), 0);
	struct fanout_stats st = stats_of(e);
	assert_int_equal(st.dispatched, 0);
	assert_int_equal(st.runs, 0);
	assert_int_equal(st.running, 0);
	size_t n = 9;
	assert_int_equal(fanout_list(e, NULL, 0, &n), 0);
	assert_int_equal(n, 0);
	assert_no_event(fanout_default_sink(e));
	fanout_destroy(e);
	tb_free(tb);
}

/* Policies on fanout_run, with roles by start order (no order assumed). */
static struct fanout_event *run_tickets(struct fanout_engine *e,
					struct ticket *t, unsigned n,
					unsigned join, unsigned quorum)
{
	struct fanout_task tasks[8];
	struct fanout_event *ev = NULL;

	for (unsigned i = 0; i < n; i++)
		tasks[i] = (struct fanout_task){"t", ticket_fn, t};
	struct fanout_batch b = {
		.tasks = tasks, .ntasks = n, .join = join, .quorum = quorum};
	assert_int_equal(fanout_run(e, &b, &ev), 0);
	assert_non_null(ev);
	check_shape(ev, n);
	assert_true(ev->interrupted_by_policy);
	/* every child that started beyond the first k saw the interrupt */
	unsigned started = (unsigned)atomic_load(&t->next);
	assert_true(started >= (unsigned)t->k);
	assert_int_equal((unsigned)atomic_load(&t->spun), started - t->k);
	unsigned zero = 0;
	for (unsigned i = 0; i < n; i++)
		zero += ev->results[i].duration_ns == 0 &&
			ev->results[i].status == FANOUT_INTERRUPTED;
	assert_true(zero <= n - started);
	return ev;
}

static void policies_on_run(void **state)
{
	struct fanout_engine *e = eng2();
	struct fanout_event *ev;

	struct ticket fe = {.k = 1, .ret = -EIO};
	ev = run_tickets(e, &fe, 6, FANOUT_JOIN_FIRST_ERROR, 0);
	assert_int_equal(ev->nerror, 1);
	assert_int_equal(ev->ninterrupted, 5);
	assert_int_equal(ev->status, FANOUT_ERROR);
	fanout_event_free(ev);

	struct ticket any = {.k = 1, .ret = 0};
	ev = run_tickets(e, &any, 6, FANOUT_JOIN_ANY, 0);
	assert_int_equal(ev->ncompleted, 1);
	assert_int_equal(ev->ninterrupted, 5);
	assert_int_equal(ev->status, FANOUT_COMPLETED);
	fanout_event_free(ev);

	struct ticket q = {.k = 2, .ret = 0};
	ev = run_tickets(e, &q, 7, FANOUT_JOIN_QUORUM, 2);
	assert_int_equal(ev->ncompleted, 2);
	assert_int_equal(ev->ninterrupted, 5);
	fanout_event_free(ev);
	assert_no_event(fanout_default_sink(e));
	fanout_destroy(e);
}

/* The same policies on background delegations of synchronous children. */
static void policies_on_dispatch_sync(void **state)
{
	struct fanout_engine *e = eng2();
	struct ticket t[3] = {
		{.k = 1, .ret = -EIO}, {.k = 1, .ret = 0}, {.k = 3, .ret = 0}};
	unsigned join[3] = {FANOUT_JOIN_FIRST_ERROR, FANOUT_JOIN_ANY,
			    FANOUT_JOIN_QUORUM};
	struct fanout_task tasks[3][6];

	for (unsigned j = 0; j < 3; j++) {
		for (unsigned i = 0; i < 6; i++)
			tasks[j][i] =
				(struct fanout_task){"t", ticket_fn, &t[j]};
		struct fanout_batch b = {.tasks = tasks[j],
					 .ntasks = 6,
					 .join = join[j],
					 .quorum = j == 2 ? 3 : 0};
		fanout_id id = must_dispatch_b(e, &b);
		struct fanout_event *ev = must_wait(fanout_default_sink(e));
		assert_true(ev->id == id);
		check_shape(ev, 6);
		assert_true(ev->interrupted_by_policy);
		assert_int_equal(ev->ninterrupted, 6 - t[j].k);
		unsigned started = (unsigned)atomic_load(&t[j].next);
		assert_int_equal((unsigned)atomic_load(&t[j].spun),
				 started - t[j].k);
		fanout_event_free(ev);
	}
	fanout_destroy(e);
}

/*
 * The policy met by the last child to finish stops nothing, even when an
 * earlier child was interrupted by something else (it returned -ECANCELED
 * on its own): interrupted_by_policy stays false ("its join policy
 * interrupted the remaining children").  It was true whenever any child
 * had ended interrupted.  ANY, QUORUM and FIRST_ERROR alike.
 */
static void policy_met_last_after_own_interrupt(void **state)
{
	static const unsigned joins[] = {FANOUT_JOIN_ANY, FANOUT_JOIN_QUORUM,
					 FANOUT_JOIN_FIRST_ERROR};
	struct fanout_engine *e = eng2();

	for (unsigned k = 0; k < 3; k++) {
		struct mbatch *mb = mb_new(3);
		struct fanout_info info;

		mb_sync(mb, 0)->ret = -ECANCELED; /* its own, no cancel */
		mb->b.join = joins[k];
		mb->b.quorum = joins[k] == FANOUT_JOIN_QUORUM ? 2 : 0;
		/* the deciding child (1) is completed last, after 2 */
		mb->d[1].o.code =
			joins[k] == FANOUT_JOIN_FIRST_ERROR ? -EIO : 0;
		mb->d[2].o.code = 0;
		if (joins[k] == FANOUT_JOIN_ANY)
			mb->d[2].o.code = -EIO; /* ANY: errors do not count */
		fanout_id id = must_dispatch_b(e, &mb->b);
		assert_true(wait_flag(&mb->pr[0].finished, WAIT_MS));
		assert_non_null(dc_wait(&mb->d[1]));
		assert_int_equal(dc_complete(&mb->d[2]), 0);
		WAIT_INFO(e, id, info, info.ndone == 2);
		assert_int_equal(info.status, FANOUT_RUNNING);
		assert_int_equal(dc_complete(&mb->d[1]), 0);
		struct fanout_event *ev = must_wait(fanout_default_sink(e));
		assert_true(ev->id == id);
		check_shape(ev, 3);
		assert_int_equal(ev->ninterrupted, 1);
		assert_int_equal(ev->results[0].status, FANOUT_INTERRUPTED);
		assert_false(ev->cancelled);
		assert_false(ev->interrupted_by_policy);
		fanout_event_free(ev);
		mb_free(mb);
	}
	fanout_destroy(e);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		TC(first_error_interrupts_rest),
		TC(first_error_without_error),
		TC(any_first_completed),
		TC(any_hedged_loser_abandoned),
		TC(quorum_interrupts_rest),
		TC(quorum_all),
		TC(join_all_unchanged),
		TC(join_bad_input),
		TC(policies_on_run),
		TC(policies_on_dispatch_sync),
		TC(policy_met_last_after_own_interrupt),
	};
	tc_filters();
	return cmocka_run_group_tests(tests, NULL, NULL);
}
