/* SPDX-License-Identifier: MIT */
/*
 * test_tree.c - the cancel tree: interrupting a delegation interrupts what
 * its children started (fanout_run, fanout_dispatch, batch.within), on any
 * engine, transitively; deadlines, join policies and shutdown reach it too.
 * fanout_cancel_session and fanout_info.session_key.
 */
#include "defer.h"
#include "points.h"

#define MS (1000000ull)

/*
 * struct level - one level of a nested tree.  A child running level_fn(L)
 * runs fanout_run(L->e, L->fan children of level_fn(L->next)) and records
 * the nested event in L; a level without an engine is a leaf: its children
 * spin until interrupted.
 */
struct level {
	struct fanout_engine *e; /* NULL: leaf */
	unsigned fan;
	struct level *next;
	/* leaf observations */
	atomic_int spun;
	atomic_ullong leaf_id;
	atomic_int leaf_depth;
	/* nested-run observations (one child per level runs it) */
	atomic_int have;
	int run_rc;
	fanout_id nested_id;
	enum fanout_status st;
	bool cancelled;
	bool timed_out;
	unsigned ninterrupted, nzero, n;
	bool parent_interrupted; /* the running child saw it afterwards */
};

static int level_fn(struct fanout_child *c, void *arg)
{
	struct level *L = arg;

	if (!L->e) {
		atomic_store(&L->leaf_id, fanout_child_id(c));
		atomic_store(&L->leaf_depth, (int)fanout_child_depth(c));
		return spin_fn(c, &L->spun);
	}
	struct fanout_task t[8];
	struct fanout_event *ev = NULL;

	for (unsigned i = 0; i < L->fan; i++)
		t[i] = (struct fanout_task){"level", level_fn, L->next};
	struct fanout_batch b = {.tasks = t, .ntasks = L->fan};
	L->run_rc = fanout_run(L->e, &b, &ev);
	CHECK(L->run_rc == 0);
	if (L->run_rc == 0) {
		L->nested_id = ev->id;
		L->st = ev->status;
		L->cancelled = ev->cancelled;
		L->timed_out = ev->timed_out;
		L->ninterrupted = ev->ninterrupted;
		L->n = ev->nresults;
		for (unsigned i = 0; i < ev->nresults; i++)
			L->nzero += ev->results[i].duration_ns == 0;
		fanout_event_free(ev);
	}
	L->parent_interrupted = fanout_interrupted(c);
	atomic_store(&L->have, 1);
	return L->parent_interrupted ? -ECANCELED : 0;
}

/* A nested run that was interrupted through the tree. */
static void assert_level_interrupted(struct level *L)
{
	assert_int_equal(atomic_load(&L->have), 1);
	assert_int_equal(L->run_rc, 0);
	assert_int_equal(L->n, L->fan);
	assert_int_equal(L->st, FANOUT_INTERRUPTED);
	assert_int_equal(L->ninterrupted, L->fan);
	assert_true(L->cancelled); /* "the cancel tree of a parent" */
	assert_true(L->parent_interrupted);
}

static void assert_leaf_interrupted(struct level *parent, struct level *leaf)
{
	assert_level_interrupted(parent);
	/* children that never started were skipped, not run */
	unsigned spun = (unsigned)atomic_load(&leaf->spun);
	assert_true(spun >= 1);
	assert_true(parent->nzero <= parent->fan - spun);
}

/* Dispatch one child running level_fn(top) on @e; return its id. */
static fanout_id dispatch_level(struct fanout_engine *e, struct level *top,
				unsigned join, uint64_t deadline_ns,
				struct fanout_task *t, unsigned n)
{
	t[0] = (struct fanout_task){"outer", level_fn, top};
	struct fanout_batch b = {.tasks = t,
				 .ntasks = n,
				 .join = join,
				 .deadline_ns = deadline_ns};
	return must_dispatch_b(e, &b);
}

static void nested(struct fanout_engine *outer_e, struct fanout_engine *in_e)
{
	struct level leaf = {0};
	struct level l1 = {.e = in_e, .fan = 3, .next = &leaf};
	struct fanout_task t[1];

	fanout_id id = dispatch_level(outer_e, &l1, 0, 0, t, 1);
	assert_true(wait_flag(&leaf.spun, WAIT_MS));
	assert_int_equal(atomic_load(&leaf.leaf_depth), 2);
	assert_int_equal(fanout_cancel(outer_e, id, FANOUT_CANCEL_INTERRUPT),
			 0);
	struct fanout_event *ev = must_wait(fanout_default_sink(outer_e));
	assert_true(ev->id == id);
	assert_int_equal(ev->results[0].status, FANOUT_INTERRUPTED);
	assert_true(ev->cancelled);
	assert_leaf_interrupted(&l1, &leaf);
	assert_true(l1.nested_id == atomic_load(&leaf.leaf_id));
	fanout_event_free(ev);
}

static void tree_nested_run_same_engine(void **state)
{
	struct fanout_engine *e =
		NEW_ENGINE(.workers = 2, .flags = FANOUT_NO_PIN);

	nested(e, e);
	assert_no_event(fanout_default_sink(e));
	fanout_destroy(e);
}

static void tree_nested_run_other_engine(void **state)
{
	struct fanout_engine *e1 =
		NEW_ENGINE(.workers = 1, .flags = FANOUT_NO_PIN);
	struct fanout_engine *e2 =
		NEW_ENGINE(.workers = 2, .flags = FANOUT_NO_PIN);

	nested(e1, e2);
	assert_no_event(fanout_default_sink(e2)); /* a run publishes nothing */
	fanout_destroy(e1);
	fanout_destroy(e2);
}

/* PENDING alone does not reach the nested delegation. */
static void tree_pending_does_not_reach(void **state)
{
	struct fanout_engine *e =
		NEW_ENGINE(.workers = 2, .flags = FANOUT_NO_PIN);
	struct level leaf = {0};
	struct level l1 = {.e = e, .fan = 2, .next = &leaf};
	struct fanout_task t[1];
	struct fanout_info info;

	fanout_id id = dispatch_level(e, &l1, 0, 0, t, 1);
	assert_true(wait_flag(&leaf.spun, WAIT_MS));
	fanout_id nid = atomic_load(&leaf.leaf_id);
	assert_int_equal(fanout_cancel(e, id, FANOUT_CANCEL_PENDING), 0);
	assert_no_event(fanout_default_sink(e));
	assert_int_equal(fanout_lookup(e, nid, &info), 0);
	assert_int_equal(info.status, FANOUT_RUNNING);
	assert_false(info.cancelled);
	assert_int_equal(atomic_load(&l1.have), 0);
	assert_int_equal(fanout_cancel(e, id, FANOUT_CANCEL_INTERRUPT), 0);
	struct fanout_event *ev = must_wait(fanout_default_sink(e));
	assert_true(ev->id == id);
	assert_leaf_interrupted(&l1, &leaf);
	fanout_event_free(ev);
	fanout_destroy(e);
}

/* Three levels, alternating engines: the cancel goes all the way down. */
static void tree_three_levels(void **state)
{
	struct fanout_engine *e1 = NEW_ENGINE(.workers = 2, .max_depth = 4,
					      .flags = FANOUT_NO_PIN);
	struct fanout_engine *e2 = NEW_ENGINE(.workers = 1, .max_depth = 4,
					      .flags = FANOUT_NO_PIN);
	struct level leaf = {0};
	struct level l2 = {.e = e1, .fan = 3, .next = &leaf};
	struct level l1 = {.e = e2, .fan = 1, .next = &l2};
	struct fanout_task t[1];

	fanout_id id = dispatch_level(e1, &l1, 0, 0, t, 1);
	assert_true(wait_flag(&leaf.spun, WAIT_MS));
	assert_int_equal(atomic_load(&leaf.leaf_depth), 3);
	assert_int_equal(fanout_cancel(e1, id, FANOUT_CANCEL_INTERRUPT), 0);
	struct fanout_event *ev = must_wait(fanout_default_sink(e1));
	assert_true(ev->id == id);
	assert_true(ev->cancelled);
	assert_leaf_interrupted(&l2, &leaf);
	assert_level_interrupted(&l1);
	fanout_event_free(ev);
	assert_no_event(fanout_default_sink(e1));
	fanout_destroy(e1);
	fanout_destroy(e2);
}

/*
 * Ids are unique per engine only: the tree must link a nested delegation
 * to its parent's engine too.  Two fresh engines give their first
 * delegations the same id; interrupting e1's must not reach e2's tree.
 */
struct nest_defer {
	struct fanout_engine *e;
	struct tbatch *inner;
	struct dchild d;
};

static int nest_once_then_defer_fn(struct fanout_child *c, void *arg)
{
	struct nest_defer *n = arg;
	struct fanout_event *ev = NULL;

	/* a finished nested run: the outer record now has kids */
	CHECK(fanout_run(n->e, &n->inner->b, &ev) == 0);
	fanout_event_free(ev);
	return defer_fn(c, &n->d);
}

static void tree_same_id_other_engine_unrelated(void **state)
{
	struct fanout_engine *e1 =
		NEW_ENGINE(.workers = 1, .flags = FANOUT_NO_PIN);
	struct fanout_engine *e2 =
		NEW_ENGINE(.workers = 2, .flags = FANOUT_NO_PIN);
	struct level leaf = {0};
	struct level l1 = {.e = e2, .fan = 2, .next = &leaf};
	struct fanout_task t2[1];
	struct nest_defer nd = {.e = e1, .inner = tb_new(1)};
	struct fanout_task t1 = {"outer", nest_once_then_defer_fn, &nd};
	struct fanout_batch b1 = {.tasks = &t1, .ntasks = 1};
	struct fanout_info info;

	/* e2: a tree whose nested run is still spinning */
	fanout_id id2 = dispatch_level(e2, &l1, 0, 0, t2, 1);
	assert_true(wait_flag(&leaf.spun, WAIT_MS));
	fanout_id nid = atomic_load(&leaf.leaf_id);
	/* e1: its first delegation, whose child ran a nested run and defers */
	fanout_id id1 = must_dispatch_b(e1, &b1);
	struct fanout_pending *p = dc_wait(&nd.d);
	assert_non_null(p);
	if (id1 != id2)
		print_message("note: ids differ (%llx, %llx); the collision "
			      "this test aims at did not happen\n",
			      (unsigned long long)id1, (unsigned long long)id2);
	assert_int_equal(
		fanout_cancel(e1, id1,
			      FANOUT_CANCEL_INTERRUPT | FANOUT_CANCEL_ABANDON),
		0);
	struct fanout_event *ev = must_wait(fanout_default_sink(e1));
	assert_true(ev->id == id1);
	fanout_event_free(ev);
	assert_int_equal(fanout_complete(p, NULL), -EALREADY);
	/* e2's tree is untouched */
	assert_no_event(fanout_default_sink(e2));
	assert_int_equal(fanout_lookup(e2, nid, &info), 0);
	assert_int_equal(info.status, FANOUT_RUNNING);
	assert_false(info.cancelled);
	assert_int_equal(fanout_lookup(e2, id2, &info), 0);
	assert_false(info.cancelled);
	assert_int_equal(atomic_load(&l1.have), 0);
	/* now end it properly */
	assert_int_equal(fanout_cancel(e2, id2, FANOUT_CANCEL_INTERRUPT), 0);
	ev = must_wait(fanout_default_sink(e2));
	assert_true(ev->id == id2);
	assert_leaf_interrupted(&l1, &leaf);
	fanout_event_free(ev);
	fanout_destroy(e1);
	fanout_destroy(e2);
	tb_free(nd.inner);
}

/* A deadline on the outer delegation reaches the nested tree. */
static void tree_deadline_reaches_nested(void **state)
{
	struct fanout_engine *e1 =
		NEW_ENGINE(.workers = 2, .flags = FANOUT_NO_PIN);
	struct fanout_engine *e2 =
		NEW_ENGINE(.workers = 1, .flags = FANOUT_NO_PIN);
	struct level leaf = {0};
	struct level l1 = {.e = e2, .fan = 2, .next = &leaf};
	struct fanout_task t[1];

	fanout_id id = dispatch_level(e1, &l1, 0, 100 * MS, t, 1);
	struct fanout_event *ev = must_wait(fanout_default_sink(e1));
	assert_true(ev->id == id);
	assert_true(ev->timed_out);
	assert_int_equal(ev->results[0].status, FANOUT_INTERRUPTED);
	assert_int_equal(ev->results[0].code, -ETIMEDOUT);
	if (!atomic_load(&l1.have) && ev->results[0].duration_ns == 0) {
		/* a host so slow the outer child never started */
		print_message("note: the deadline came before the child\n");
		fanout_event_free(ev);
		fanout_destroy(e1);
		fanout_destroy(e2);
		return;
	}
	/* the nested run was interrupted, its leaves saw it */
	assert_int_equal(atomic_load(&l1.have), 1);
	assert_int_equal(l1.st, FANOUT_INTERRUPTED);
	assert_int_equal(l1.ninterrupted, 2);
	assert_true(l1.parent_interrupted);
	fanout_event_free(ev);
	fanout_destroy(e1);
	fanout_destroy(e2);
}

/* A join policy on the outer delegation reaches the nested tree. */
static void tree_policy_reaches_nested(void **state)
{
	struct fanout_engine *e =
		NEW_ENGINE(.workers = 2, .flags = FANOUT_NO_PIN);
	struct level leaf = {0};
	struct level l1 = {.e = e, .fan = 2, .next = &leaf};
	struct fanout_task t[2];
	struct probe fail_pr = {.ret = -EIO};
	atomic_int gate = 0;

	fail_pr.gate = &gate;
	t[1] = (struct fanout_task){"fail", probe_fn, &fail_pr};
	fanout_id id = dispatch_level(e, &l1, FANOUT_JOIN_FIRST_ERROR, 0, t, 2);
	assert_true(wait_flag(&leaf.spun, WAIT_MS));
	assert_true(wait_flag(&fail_pr.runs, WAIT_MS));
	atomic_store(&gate, 1);
	struct fanout_event *ev = must_wait(fanout_default_sink(e));
	assert_true(ev->id == id);
	assert_true(ev->interrupted_by_policy);
	assert_int_equal(ev->results[1].status, FANOUT_ERROR);
	assert_int_equal(ev->results[0].status, FANOUT_INTERRUPTED);
	assert_int_equal(atomic_load(&l1.have), 1);
	assert_int_equal(l1.st, FANOUT_INTERRUPTED);
	assert_true(l1.parent_interrupted);
	fanout_event_free(ev);
	fanout_destroy(e);
}

/* Shutdown of the outer's engine reaches a nested run on another engine. */
static void tree_shutdown_reaches_other_engine(void **state)
{
	struct fanout_engine *e1 =
		NEW_ENGINE(.workers = 1, .flags = FANOUT_NO_PIN);
	struct fanout_engine *e2 =
		NEW_ENGINE(.workers = 2, .flags = FANOUT_NO_PIN);
	struct level leaf = {0};
	struct level l1 = {.e = e2, .fan = 2, .next = &leaf};
	struct fanout_task t[1];

	fanout_id id = dispatch_level(e1, &l1, 0, 0, t, 1);
	assert_true(wait_flag(&leaf.spun, WAIT_MS));
	assert_int_equal(fanout_shutdown(e1), 0);
	struct fanout_event *ev = NULL;
	assert_int_equal(fanout_poll(fanout_default_sink(e1), &ev), 0);
	assert_true(ev->id == id);
	assert_true(ev->cancelled);
	assert_leaf_interrupted(&l1, &leaf);
	fanout_event_free(ev);
	/* e2 is still alive and works */
	struct tbatch *tb = tb_new(2);
	assert_int_equal(fanout_run(e2, &tb->b, &ev), 0);
	check_all_completed(ev, tb);
	fanout_event_free(ev);
	tb_free(tb);
	fanout_destroy(e1);
	fanout_destroy(e2);
}

/*
 * A background delegation dispatched from a running child (to another
 * engine) is part of the tree while that child runs.
 */
struct bg {
	struct fanout_engine *e2;
	struct level leaf;
	atomic_ullong id;
	int rc;
};

static int dispatch_then_spin_fn(struct fanout_child *c, void *arg)
{
	struct bg *g = arg;
	struct fanout_task t[2];
	fanout_id id = 0;

	for (int i = 0; i < 2; i++)
		t[i] = (struct fanout_task){"bg", level_fn, &g->leaf};
	struct fanout_batch b = {.tasks = t, .ntasks = 2};
	g->rc = fanout_dispatch(g->e2, &b, &id);
	atomic_store(&g->id, id);
	return spin_fn(c, NULL);
}

static void tree_background_nested_dispatch(void **state)
{
	struct fanout_engine *e1 =
		NEW_ENGINE(.workers = 1, .flags = FANOUT_NO_PIN);
	struct fanout_engine *e2 =
		NEW_ENGINE(.workers = 2, .flags = FANOUT_NO_PIN);
	struct bg g = {.e2 = e2};
	struct fanout_task t = {"outer", dispatch_then_spin_fn, &g};
	struct fanout_batch b = {.tasks = &t, .ntasks = 1};

	fanout_id id = must_dispatch_b(e1, &b);
	assert_true(wait_ge(&g.leaf.spun, 2, WAIT_MS));
	uint64_t end = mono_ms() + WAIT_MS;
	while (atomic_load(&g.id) == 0) { /* stored after dispatch returned */
		assert_true(mono_ms() < end);
		sleep_us(100);
	}
	fanout_id nid = atomic_load(&g.id);
	assert_int_equal(fanout_cancel(e1, id, FANOUT_CANCEL_INTERRUPT), 0);
	struct fanout_event *ev = must_wait(fanout_default_sink(e1));
	assert_true(ev->id == id);
	assert_int_equal(ev->results[0].status, FANOUT_INTERRUPTED);
	assert_int_equal(g.rc, 0);
	fanout_event_free(ev);
	ev = must_wait(fanout_default_sink(e2));
	assert_true(ev->id == nid);
	assert_true(ev->cancelled);
	assert_int_equal(ev->status, FANOUT_INTERRUPTED);
	assert_int_equal(ev->ninterrupted, 2);
	assert_int_equal(atomic_load(&g.leaf.leaf_depth), 2);
	fanout_event_free(ev);
	fanout_destroy(e1);
	fanout_destroy(e2);
}

/*
 * batch.within from a completer thread: the new delegation gets depth + 1
 * and joins the deferred child's tree.
 */
static void tree_within_from_completer(void **state)
{
	/* three workers: two leaves spin while the depth probe runs */
	struct fanout_engine *e =
		NEW_ENGINE(.workers = 3, .flags = FANOUT_NO_PIN);
	struct fanout_sink *s2 = NULL;
	struct mbatch *outer = mb_new(1);
	struct level leaf = {0};
	struct probe depth_pr = {0};
	struct fanout_task t[3];

	assert_int_equal(fanout_sink_create(e, &s2), 0);
	fanout_id id = must_dispatch_b(e, &outer->b);
	struct fanout_pending *p = dc_wait(&outer->d[0]);
	assert_non_null(p);
	t[0] = (struct fanout_task){"leaf", level_fn, &leaf};
	t[1] = (struct fanout_task){"leaf", level_fn, &leaf};
	t[2] = (struct fanout_task){"depth", probe_fn, &depth_pr};
	struct fanout_batch b = {
		.tasks = t, .ntasks = 3, .sink = s2, .within = p};
	fanout_id nid = must_dispatch_b(e, &b);
	assert_true(wait_ge(&leaf.spun, 2, WAIT_MS));
	assert_true(wait_flag(&depth_pr.finished, WAIT_MS));
	assert_int_equal(depth_pr.depth, 2);
	assert_int_equal(atomic_load(&leaf.leaf_depth), 2);
	struct fanout_info info;
	assert_int_equal(fanout_lookup(e, nid, &info), 0);
	assert_int_equal(info.depth, 2);

	/* INTERRUPT without ABANDON: the outer waits for the completer */
	assert_int_equal(fanout_cancel(e, id, FANOUT_CANCEL_INTERRUPT), 0);
	assert_true(fanout_pending_interrupted(p));
	struct fanout_event *ev = must_wait(s2);
	assert_true(ev->id == nid);
	assert_true(ev->cancelled);
	assert_int_equal(ev->results[0].status, FANOUT_INTERRUPTED);
	assert_int_equal(ev->results[1].status, FANOUT_INTERRUPTED);
	assert_int_equal(ev->results[2].status, FANOUT_COMPLETED);
	fanout_event_free(ev);
	assert_no_event(fanout_default_sink(e));
	struct fanout_outcome o = {.code = -ECANCELED};
	assert_int_equal(fanout_complete(p, &o), 0);
	ev = must_wait(fanout_default_sink(e));
	assert_true(ev->id == id);
	assert_int_equal(ev->status, FANOUT_INTERRUPTED);
	fanout_event_free(ev);
	assert_int_equal(fanout_sink_destroy(s2), 0);
	fanout_destroy(e);
	mb_free(outer);
}

/* within + ABANDON: the deferred child is abandoned, its tree interrupted */
static void tree_within_abandon(void **state)
{
	struct fanout_engine *e1 =
		NEW_ENGINE(.workers = 1, .flags = FANOUT_NO_PIN);
	struct fanout_engine *e2 =
		NEW_ENGINE(.workers = 1, .flags = FANOUT_NO_PIN);
	struct mbatch *outer = mb_new(1);
	struct level leaf = {0};
	struct fanout_task t[2];

	fanout_id id = must_dispatch_b(e1, &outer->b);
	struct fanout_pending *p = dc_wait(&outer->d[0]);
	assert_non_null(p);
	t[0] = (struct fanout_task){"leaf", level_fn, &leaf};
	t[1] = (struct fanout_task){"leaf", level_fn, &leaf};
	struct fanout_batch b = {.tasks = t, .ntasks = 2, .within = p};
	fanout_id nid = must_dispatch_b(e2, &b);
	assert_true(wait_flag(&leaf.spun, WAIT_MS));
	assert_int_equal(atomic_load(&leaf.leaf_depth), 2);
	assert_int_equal(
		fanout_cancel(e1, id,
			      FANOUT_CANCEL_INTERRUPT | FANOUT_CANCEL_ABANDON),
		0);
	struct fanout_event *ev = must_wait(fanout_default_sink(e1));
	assert_true(ev->id == id);
	assert_int_equal(ev->results[0].status, FANOUT_INTERRUPTED);
	fanout_event_free(ev);
	ev = must_wait(fanout_default_sink(e2));
	assert_true(ev->id == nid);
	assert_true(ev->cancelled);
	assert_int_equal(ev->status, FANOUT_INTERRUPTED);
	/* one worker on e2: the second leaf never started */
	assert_int_equal(atomic_load(&leaf.spun), 1);
	fanout_event_free(ev);
	assert_int_equal(fanout_complete(p, NULL), -EALREADY);
	fanout_destroy(e1);
	fanout_destroy(e2);
	mb_free(outer);
}

/* within counts against max_depth like a call from inside the child. */
static void tree_within_depth_limit(void **state)
{
	struct fanout_engine *e = NEW_ENGINE(.workers = 1, .max_depth = 1,
					     .flags = FANOUT_NO_PIN);
	struct mbatch *outer = mb_new(1);
	struct tbatch *tb = tb_new(1);
	struct fanout_event *ev = NULL;

	fanout_id id = must_dispatch_b(e, &outer->b);
	struct fanout_pending *p = dc_wait(&outer->d[0]);
	assert_non_null(p);
	tb->b.within = p;
	assert_int_equal(fanout_dispatch(e, &tb->b, NULL), -ELOOP);
	assert_int_equal(fanout_run(e, &tb->b, &ev), -ELOOP);
	assert_int_equal(tb_runs(tb), 0);
	assert_int_equal(stats_of(e).dispatched, 1);
	assert_int_equal(fanout_complete(p, NULL), 0);
	ev = must_wait(fanout_default_sink(e));
	assert_true(ev->id == id);
	fanout_event_free(ev);
	fanout_destroy(e);
	tb_free(tb);
	mb_free(outer);
}

/* ------------------------------------------------------------- sessions */

static void cancel_session_counts_and_scope(void **state)
{
	struct fanout_engine *e =
		NEW_ENGINE(.workers = 2, .flags = FANOUT_NO_PIN);
	const char *keys[] = {"a", "b", "a", NULL, "ab", "a", "b"};
	enum { N = 7 };
	struct mbatch *mb[N];
	fanout_id ids[N];
	struct fanout_info info;
	size_t n = 99;

	/* a finished delegation of session "a" is not counted */
	struct tbatch *done = tb_new(1);
	done->b.session_key = "a";
	fanout_id did = must_dispatch(e, done);
	struct fanout_event *ev = must_wait(fanout_default_sink(e));
	assert_true(ev->id == did);
	fanout_event_free(ev);

	for (unsigned k = 0; k < N; k++) {
		mb[k] = mb_new(1);
		mb[k]->b.session_key = keys[k];
		ids[k] = must_dispatch_b(e, &mb[k]->b);
		assert_non_null(dc_wait(&mb[k]->d[0]));
	}
	assert_int_equal(
		fanout_cancel_session(NULL, "a", FANOUT_CANCEL_INTERRUPT, &n),
		-EINVAL);
	assert_int_equal(
		fanout_cancel_session(e, NULL, FANOUT_CANCEL_INTERRUPT, &n),
		-EINVAL);
	assert_int_equal(fanout_cancel_session(e, "a", 0, &n), -EINVAL);
	assert_int_equal(
		fanout_cancel_session(e, "a", FANOUT_CANCEL_ABANDON, &n),
		-EINVAL);
	assert_int_equal(fanout_cancel_session(e, "a", 0x80, &n), -EINVAL);
	assert_int_equal(n, 99);
	for (unsigned k = 0; k < N; k++) {
		assert_int_equal(fanout_lookup(e, ids[k], &info), 0);
		assert_false(info.cancelled);
	}
	assert_int_equal(
		fanout_cancel_session(e, "zzz", FANOUT_CANCEL_INTERRUPT, &n),
		0);
	assert_int_equal(n, 0);
	assert_int_equal(
		fanout_cancel_session(e, "", FANOUT_CANCEL_INTERRUPT, &n), 0);
	assert_int_equal(n, 0);

	assert_int_equal(fanout_cancel_session(e, "a",
					       FANOUT_CANCEL_INTERRUPT |
						       FANOUT_CANCEL_ABANDON,
					       &n),
			 0);
	assert_int_equal(n, 3);
	for (unsigned k = 0; k < N; k++) {
		bool a = keys[k] && !strcmp(keys[k], "a");
		struct fanout_pending *p = atomic_load(&mb[k]->d[0].p);

		assert_int_equal(fanout_pending_interrupted(p), a);
		assert_int_equal(fanout_lookup(e, ids[k], &info), 0);
		assert_int_equal(info.cancelled, a);
		assert_int_equal(info.status,
				 a ? FANOUT_INTERRUPTED : FANOUT_RUNNING);
	}
	for (unsigned j = 0; j < 3; j++) {
		ev = must_wait(fanout_default_sink(e));
		assert_non_null(ev->session_key);
		assert_string_equal(ev->session_key, "a");
		assert_true(ev->cancelled);
		assert_int_equal(ev->results[0].status, FANOUT_INTERRUPTED);
		fanout_event_free(ev);
	}
	assert_no_event(fanout_default_sink(e));
	/* again: nothing of "a" is running any more; n may be NULL */
	assert_int_equal(
		fanout_cancel_session(e, "a", FANOUT_CANCEL_INTERRUPT, &n), 0);
	assert_int_equal(n, 0);
	assert_int_equal(
		fanout_cancel_session(e, "a", FANOUT_CANCEL_INTERRUPT, NULL),
		0);

	/* PENDING on "b": counted, pending children keep waiting */
	assert_int_equal(
		fanout_cancel_session(e, "b", FANOUT_CANCEL_PENDING, &n), 0);
	assert_int_equal(n, 2);
	/* the same again: both still run, but this call cancels neither */
	n = 99;
	assert_int_equal(
		fanout_cancel_session(e, "b", FANOUT_CANCEL_PENDING, &n), 0);
	assert_int_equal(n, 0);
	for (unsigned k = 0; k < N; k++) {
		bool a = keys[k] && !strcmp(keys[k], "a");
		int rc = dc_complete(&mb[k]->d[0]);

		assert_int_equal(rc, a ? -EALREADY : 0);
	}
	for (unsigned j = 0; j < 4; j++) {
		ev = must_wait(fanout_default_sink(e));
		assert_int_equal(ev->results[0].status, FANOUT_COMPLETED);
		assert_int_equal(ev->cancelled,
				 ev->session_key &&
					 !strcmp(ev->session_key, "b"));
		fanout_event_free(ev);
	}
	assert_no_event(fanout_default_sink(e));
	fanout_destroy(e);
	for (unsigned k = 0; k < N; k++)
		mb_free(mb[k]);
	tb_free(done);
}

/* cancel_session interrupts running synchronous children and their trees */
static void cancel_session_reaches_tree(void **state)
{
	struct fanout_engine *e =
		NEW_ENGINE(.workers = 2, .flags = FANOUT_NO_PIN);
	struct level leaf = {0};
	struct level l1 = {.e = e, .fan = 2, .next = &leaf};
	struct fanout_task t = {"outer", level_fn, &l1};
	struct fanout_batch b = {.tasks = &t, .ntasks = 1, .session_key = "s1"};
	size_t n = 0;

	fanout_id id = must_dispatch_b(e, &b);
	assert_true(wait_flag(&leaf.spun, WAIT_MS));
	assert_int_equal(
		fanout_cancel_session(e, "s1", FANOUT_CANCEL_INTERRUPT, &n), 0);
	/* the nested run has no session key: only the outer one counts */
	assert_int_equal(n, 1);
	struct fanout_event *ev = must_wait(fanout_default_sink(e));
	assert_true(ev->id == id);
	assert_true(ev->cancelled);
	assert_leaf_interrupted(&l1, &leaf);
	fanout_event_free(ev);
	fanout_destroy(e);
}

static void info_session_key(void **state)
{
	struct fanout_engine *e =
		NEW_ENGINE(.workers = 1, .flags = FANOUT_NO_PIN);
	struct mbatch *a = mb_new(1), *b = mb_new(1);
	char key[16];
	struct fanout_info info;

	strcpy(key, "sess-42");
	a->b.session_key = key;
	fanout_id ida = must_dispatch_b(e, &a->b);
	fanout_id idb = must_dispatch_b(e, &b->b);
	memset(key, 'x', sizeof(key) - 1); /* copied at dispatch */
	assert_int_equal(fanout_lookup(e, ida, &info), 0);
	assert_non_null(info.session_key);
	assert_string_equal(info.session_key, "sess-42");
	assert_ptr_not_equal(info.session_key, key);
	assert_int_equal(fanout_lookup(e, idb, &info), 0);
	assert_null(info.session_key);
	struct fanout_info infos[4];
	size_t n = 0;
	assert_int_equal(fanout_list(e, infos, 4, &n), 0);
	assert_int_equal(n, 2);
	for (unsigned i = 0; i < 2; i++) {
		if (infos[i].id == ida)
			assert_string_equal(infos[i].session_key, "sess-42");
		else
			assert_null(infos[i].session_key);
	}
	assert_int_equal(dc_complete(&a->d[0]), 0);
	assert_int_equal(dc_complete(&b->d[0]), 0);
	for (int j = 0; j < 2; j++)
		fanout_event_free(must_wait(fanout_default_sink(e)));
	/* finished records keep it */
	assert_int_equal(fanout_lookup(e, ida, &info), 0);
	assert_string_equal(info.session_key, "sess-42");
	fanout_destroy(e);
	mb_free(a);
	mb_free(b);
}

/* ------------------------------------------------- started after a cancel */

/* A leaf that spins until interrupted, but gives up after 3 s (returns 0),
 * so a tree that never reaches it fails the test instead of hanging it. */
static int bounded_leaf_fn(struct fanout_child *c, void *arg)
{
	uint64_t end = mono_ms() + 3000;

	atomic_fetch_add((atomic_int *)arg, 1);
	while (!fanout_interrupted(c))
		if (mono_ms() > end)
			return 0;
		else
			sleep_us(50);
	return -ECANCELED;
}

struct late_nest {
	struct fanout_engine *e;
	unsigned ntasks; /* of the nested run; 0: 2 */
	atomic_int started;
	atomic_int leaves;
	int run_rc;
	enum fanout_status st;
	unsigned ninterrupted;
	bool cancelled;
};

/* Waits until its delegation is interrupted, then starts a nested run. */
static int nest_after_interrupt_fn(struct fanout_child *c, void *arg)
{
	struct late_nest *n = arg;
	uint64_t end = mono_ms() + GATE_MS;
	struct fanout_task t[2];
	struct fanout_event *ev = NULL;

	atomic_store(&n->started, 1);
	while (!fanout_interrupted(c) && mono_ms() < end)
		sleep_us(50);
	for (int i = 0; i < 2; i++)
		t[i] = (struct fanout_task){"late", bounded_leaf_fn,
					    &n->leaves};
	struct fanout_batch b = {.tasks = t,
				 .ntasks = n->ntasks ? n->ntasks : 2};
	n->run_rc = fanout_run(n->e, &b, &ev);
	if (n->run_rc == 0) {
		n->st = ev->status;
		n->ninterrupted = ev->ninterrupted;
		n->cancelled = ev->cancelled;
		fanout_event_free(ev);
	}
	return -ECANCELED;
}

/*
 * A delegation started from a child whose delegation was already
 * interrupted belongs to an interrupted tree (like a context derived from
 * a cancelled one): it is interrupted at once.
 */
static void nested_after_interrupt(unsigned ntasks)
{
	struct fanout_engine *e1 =
		NEW_ENGINE(.workers = 1, .flags = FANOUT_NO_PIN);
	struct fanout_engine *e2 =
		NEW_ENGINE(.workers = 1, .flags = FANOUT_NO_PIN);
	struct late_nest n = {.e = e2, .ntasks = ntasks, .run_rc = 1};
	struct fanout_task t = {"outer", nest_after_interrupt_fn, &n};
	struct fanout_batch b = {.tasks = &t, .ntasks = 1};

	fanout_id id = must_dispatch_b(e1, &b);
	assert_true(wait_flag(&n.started, WAIT_MS));
	assert_int_equal(fanout_cancel(e1, id, FANOUT_CANCEL_INTERRUPT), 0);
	struct fanout_event *ev = must_wait(fanout_default_sink(e1));
	assert_true(ev->id == id);
	fanout_event_free(ev);
	assert_true(n.run_rc <= 0);
	if (n.run_rc == 0) {
		assert_int_equal(n.st, FANOUT_INTERRUPTED);
		assert_int_equal(n.ninterrupted, ntasks);
		assert_true(n.cancelled);
		/* Interrupted before its caller's first chunk, which was
		 * claimed at the record's creation: no child ran. */
		assert_int_equal(atomic_load(&n.leaves), 0);
	} else {
		print_message("note: nested run refused: %d\n", n.run_rc);
	}
	fanout_destroy(e1);
	fanout_destroy(e2);
}

static void tree_nested_after_interrupt(void **state)
{
	nested_after_interrupt(2);
}

/* The same with one child: the caller's first chunk is the whole batch,
 * and its run would be the sole runner's. */
static void tree_nested_run_of_one_after_interrupt(void **state)
{
	nested_after_interrupt(1);
}

/* The same with batch.within naming an abandoned (not yet completed) child */
static void tree_within_after_parent_abandoned(void **state)
{
	struct fanout_engine *e =
		NEW_ENGINE(.workers = 2, .flags = FANOUT_NO_PIN);
	struct fanout_sink *s2 = NULL;
	struct mbatch *outer = mb_new(1);
	atomic_int leaves = 0;
	struct fanout_task t[2];

	assert_int_equal(fanout_sink_create(e, &s2), 0);
	fanout_id id = must_dispatch_b(e, &outer->b);
	struct fanout_pending *p = dc_wait(&outer->d[0]);
	assert_non_null(p);
	assert_int_equal(
		fanout_cancel(e, id,
			      FANOUT_CANCEL_INTERRUPT | FANOUT_CANCEL_ABANDON),
		0);
	struct fanout_event *ev = must_wait(fanout_default_sink(e));
	assert_true(ev->id == id);
	fanout_event_free(ev);
	for (int i = 0; i < 2; i++)
		t[i] = (struct fanout_task){"late", bounded_leaf_fn, &leaves};
	struct fanout_batch b = {
		.tasks = t, .ntasks = 2, .sink = s2, .within = p};
	fanout_id nid = 0;
	int rc = fanout_dispatch(e, &b, &nid);
	if (rc == 0) {
		ev = must_wait(s2);
		assert_true(ev->id == nid);
		assert_int_equal(ev->status, FANOUT_INTERRUPTED);
		assert_int_equal(ev->ninterrupted, 2);
		assert_true(ev->cancelled);
		fanout_event_free(ev);
	} else {
		/* refused as a whole (not documented in fanout.h yet) */
		assert_int_equal(rc, -ECANCELED);
		assert_int_equal(atomic_load(&leaves), 0);
		assert_no_event(s2);
	}
	assert_int_equal(fanout_complete(p, NULL), -EALREADY);
	assert_int_equal(fanout_sink_destroy(s2), 0);
	fanout_destroy(e);
	mb_free(outer);
}

/*
 * The tree goes on through a delegation that finished.  R's child A
 * dispatches K (background, another engine) and returns; R's child B
 * waits to be interrupted, so R runs on.  K's child dispatches G (a third
 * engine) and returns, so K finishes; G's child waits to be interrupted.
 * Cancelling R must reach G: through K's record while K's event is still
 * held, through K's tomb once it is freed.  (The walk stopped at K, whose
 * cancel answered -EALREADY, and G ran on.)
 */
struct mid {
	struct fanout_engine *ek, *eg;
	struct probe g; /* until_interrupted */
	atomic_int dispatched;
};

static int mid_k_fn(struct fanout_child *c, void *arg)
{
	struct mid *m = arg;
	struct fanout_task t = {"G", probe_fn, &m->g};
	struct fanout_batch b = {.tasks = &t, .ntasks = 1};
	fanout_id id;

	(void)c;
	CHECK(fanout_dispatch(m->eg, &b, &id) == 0);
	return 0;
}

static int mid_a_fn(struct fanout_child *c, void *arg)
{
	struct mid *m = arg;
	struct fanout_task t = {"K", mid_k_fn, m};
	struct fanout_batch b = {.tasks = &t, .ntasks = 1};
	fanout_id id;

	(void)c;
	CHECK(fanout_dispatch(m->ek, &b, &id) == 0);
	atomic_store(&m->dispatched, 1);
	return 0;
}

static void tree_through_finished(bool free_k)
{
	struct mid m = {.g = {.until_interrupted = true}};
	struct probe b_probe = {.until_interrupted = true};
	struct fanout_engine *er =
		NEW_ENGINE(.workers = 2, .flags = FANOUT_NO_PIN);
	struct fanout_task t[2] = {{"A", mid_a_fn, &m},
				   {"B", probe_fn, &b_probe}};
	struct fanout_batch b = {.tasks = t, .ntasks = 2};
	struct fanout_event *ev, *kev;
	fanout_id rid = 0;

	m.ek = NEW_ENGINE(.workers = 1, .max_depth = 4, .flags = FANOUT_NO_PIN);
	m.eg = NEW_ENGINE(.workers = 1, .max_depth = 4, .flags = FANOUT_NO_PIN);
	assert_int_equal(fanout_dispatch(er, &b, &rid), 0);
	kev = must_wait(fanout_default_sink(m.ek)); /* K finished */
	assert_int_equal(kev->status, FANOUT_COMPLETED);
	if (free_k) {
		fanout_event_free(kev);
		kev = NULL;
	}
	assert_true(wait_flag(&m.g.runs, WAIT_MS)); /* G's child runs */
	assert_int_equal(fanout_cancel(er, rid, FANOUT_CANCEL_INTERRUPT), 0);
	ev = must_wait(fanout_default_sink(er));
	assert_true(ev->id == rid);
	fanout_event_free(ev);
	ev = must_wait(fanout_default_sink(m.eg));
	assert_int_equal(ev->status, FANOUT_INTERRUPTED);
	assert_true(m.g.interrupted_seen);
	fanout_event_free(ev);
	if (kev)
		fanout_event_free(kev);
	fanout_destroy(er);
	fanout_destroy(m.ek);
	fanout_destroy(m.eg);
}

static void tree_through_finished_record(void **state)
{
	(void)state;
	tree_through_finished(false);
}

static void tree_through_finished_tomb(void **state)
{
	(void)state;
	tree_through_finished(true);
}

/*
 * Late kids (tree.c): a dispatch within P's deferred child, stopped after
 * it took its reference (test point FANOUT_AT_ORIGIN_TAKEN) while the
 * child completes and P finishes (and, @free_p, P's event is freed: P is
 * a tomb), then links K under P.  The child K hangs from finished before
 * K was linked, so K is interrupted at once, by its own re-check: a walk
 * from G, P's parent, may have passed P before the link, and no cancel
 * bit of a finished P tells K.  @cancel_first: G is interrupted while K's
 * dispatch is stopped, before the link.  (K ran on, never interrupted,
 * when G's cancel came first; the link was found only by a later walk.)
 */
struct late_kid {
	struct fanout_engine *e;
	struct fanout_pending *pp;
	struct dchild *dk;
	int rc;
	fanout_id kid;
};

static void *late_kid_thread(void *arg)
{
	struct late_kid *l = arg;
	struct fanout_task t = {"K", defer_fn, l->dk};
	struct fanout_batch b = {.tasks = &t, .ntasks = 1, .within = l->pp};

	pause_mine = true;
	l->rc = fanout_dispatch(l->e, &b, &l->kid);
	return NULL;
}

/* K, just dispatched, was interrupted by its own re-check: its event
 * comes, INTERRUPTED, without anyone completing its child. */
static void expect_kid_interrupted(struct fanout_engine *e, fanout_id kid,
				   struct dchild *dk)
{
	struct fanout_info info;
	struct fanout_event *ev;

	assert_int_equal(fanout_lookup(e, kid, &info), 0);
	assert_true(info.cancelled); /* set before the dispatch returned */
	ev = must_wait(fanout_default_sink(e));
	assert_true(ev->id == kid);
	assert_int_equal(ev->status, FANOUT_INTERRUPTED);
	assert_true(ev->cancelled);
	fanout_event_free(ev);
	/* Its child may have started (and deferred) before the re-check. */
	if (atomic_load(&dk->runs))
		assert_int_equal(fanout_complete(dc_wait(dk), NULL), -EALREADY);
}

static void late_within_kid(bool cancel_first, bool free_p)
{
	struct pause pz;
	struct dchild dg = {0}, dp = {0}, dk = {0};
	struct fanout_task tg = {"G", defer_fn, &dg};
	struct fanout_task tp = {"P", defer_fn, &dp};
	struct fanout_batch bg = {.tasks = &tg, .ntasks = 1};
	struct late_kid l = {.dk = &dk};
	struct fanout_event *ev, *pev = NULL;
	fanout_id gid, pid;

	if (!pause_arm(&pz, FANOUT_AT_ORIGIN_TAKEN))
		skip(); /* a build without test points */
	l.e = NEW_ENGINE(.workers = 2, .max_depth = 4, .flags = FANOUT_NO_PIN);
	gid = must_dispatch_b(l.e, &bg);
	struct fanout_pending *pg = dc_wait(&dg);
	struct fanout_batch bp = {.tasks = &tp, .ntasks = 1, .within = pg};
	pid = must_dispatch_b(l.e, &bp);
	l.pp = dc_wait(&dp);
	assert_non_null(l.pp);
	pthread_t a = spawn(late_kid_thread, &l);
	pause_wait(&pz); /* it holds P's record; K is not linked yet */
	assert_int_equal(fanout_complete(l.pp, NULL), 0); /* P finishes */
	pev = must_wait(fanout_default_sink(l.e));
	assert_true(pev->id == pid);
	if (free_p) {
		fanout_event_free(pev); /* P is a tomb now */
		pev = NULL;
	}
	/* The walk from G passes P, finished, with no kid yet. */
	if (cancel_first)
		assert_int_equal(
			fanout_cancel(l.e, gid, FANOUT_CANCEL_INTERRUPT), 0);
	pause_go(&pz);
	join(a);
	pause_done(&pz);
	assert_int_equal(l.rc, 0);
	expect_kid_interrupted(l.e, l.kid, &dk);
	if (!cancel_first)
		assert_int_equal(
			fanout_cancel(l.e, gid, FANOUT_CANCEL_INTERRUPT), 0);
	assert_int_equal(fanout_complete(pg, NULL), 0);
	ev = must_wait(fanout_default_sink(l.e));
	assert_true(ev->id == gid);
	fanout_event_free(ev);
	if (pev)
		fanout_event_free(pev);
	fanout_destroy(l.e);
}

static void tree_late_within_kid(void **state)
{
	(void)state;
	late_within_kid(false, true);
}

static void tree_late_within_kid_cancel_first_record(void **state)
{
	(void)state;
	late_within_kid(true, false);
}

static void tree_late_within_kid_cancel_first_tomb(void **state)
{
	(void)state;
	late_within_kid(true, true);
}

/*
 * The same from inside the deferred child's fn: P's only child defers and
 * is completed (by another thread, as fanout.h allows before fn returns),
 * P finishes, G is interrupted, and only then does the child's fn start K
 * (implicitly under P).  The walk from G found P finished without kids; K
 * must be interrupted at once rather than run outside any tree.  (K ran
 * on: its re-check saw no cancel bit on P.)
 */
struct after_done {
	struct fanout_engine *e;
	struct dchild *dk;
	_Atomic(struct fanout_pending *) p;
	atomic_int deferred, gate, rc_set;
	int rc;
	fanout_id kid;
};

static int start_after_done_fn(struct fanout_child *c, void *arg)
{
	struct after_done *a = arg;
	struct fanout_task t = {"K", defer_fn, a->dk};
	struct fanout_batch b = {.tasks = &t, .ntasks = 1};
	struct fanout_pending *p = fanout_defer(c);

	CHECK(p != NULL);
	atomic_store(&a->p, p);
	atomic_store(&a->deferred, 1);
	CHECK(wait_flag(&a->gate, GATE_MS)); /* completed by the test */
	a->rc = fanout_dispatch(a->e, &b, &a->kid);
	atomic_store(&a->rc_set, 1);
	return -EINPROGRESS;
}

static void tree_kid_after_deferred_child_done(void **state)
{
	struct dchild dg = {0}, dk = {0};
	struct after_done ad = {.dk = &dk};
	struct fanout_task tg = {"G", defer_fn, &dg};
	struct fanout_task tp = {"P", start_after_done_fn, &ad};
	struct fanout_batch bg = {.tasks = &tg, .ntasks = 1};
	struct fanout_event *ev;
	fanout_id gid, pid;

	(void)state;
	ad.e = NEW_ENGINE(.workers = 2, .max_depth = 4, .flags = FANOUT_NO_PIN);
	gid = must_dispatch_b(ad.e, &bg);
	struct fanout_pending *pg = dc_wait(&dg);
	struct fanout_batch bp = {.tasks = &tp, .ntasks = 1, .within = pg};
	pid = must_dispatch_b(ad.e, &bp);
	assert_true(wait_flag(&ad.deferred, WAIT_MS));
	assert_int_equal(fanout_complete(atomic_load(&ad.p), NULL), 0);
	ev = must_wait(fanout_default_sink(ad.e)); /* P finished */
	assert_true(ev->id == pid);
	fanout_event_free(ev);
	assert_int_equal(fanout_cancel(ad.e, gid, FANOUT_CANCEL_INTERRUPT), 0);
	atomic_store(&ad.gate, 1); /* now P's child starts K */
	assert_true(wait_flag(&ad.rc_set, WAIT_MS));
	assert_int_equal(ad.rc, 0);
	expect_kid_interrupted(ad.e, ad.kid, &dk);
	assert_int_equal(fanout_complete(pg, NULL), 0);
	ev = must_wait(fanout_default_sink(ad.e));
	assert_true(ev->id == gid);
	fanout_event_free(ev);
	fanout_destroy(ad.e);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		TC(tree_nested_run_same_engine),
		TC(tree_nested_run_other_engine),
		TC(tree_pending_does_not_reach),
		TC(tree_three_levels),
		TC(tree_same_id_other_engine_unrelated),
		TC(tree_deadline_reaches_nested),
		TC(tree_policy_reaches_nested),
		TC(tree_shutdown_reaches_other_engine),
		TC(tree_background_nested_dispatch),
		TC(tree_within_from_completer),
		TC(tree_within_abandon),
		TC(tree_within_depth_limit),
		TC(tree_through_finished_record),
		TC(tree_through_finished_tomb),
		TC(tree_late_within_kid),
		TC(tree_late_within_kid_cancel_first_record),
		TC(tree_late_within_kid_cancel_first_tomb),
		TC(tree_kid_after_deferred_child_done),
		TC(tree_nested_after_interrupt),
		TC(tree_nested_run_of_one_after_interrupt),
		TC(tree_within_after_parent_abandoned),
		TC(cancel_session_counts_and_scope),
		TC(cancel_session_reaches_tree),
		TC(info_session_key),
	};
	tc_filters();
	return cmocka_run_group_tests(tests, NULL, NULL);
}
