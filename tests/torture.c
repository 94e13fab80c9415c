/* SPDX-License-Identifier: MIT */
/*
 * torture.c - long randomised run of fanout: nothing lost, nothing
 * duplicated, nothing misrouted, nothing late.
 *
 * Usage: torture [-s SEED] [-t SECONDS] [-l LIVENESS_MS] [-S SHUTDOWN_MS] [-v]
 *
 * The run is a sequence of *epochs*.  Each epoch creates an engine with a
 * random configuration (1-2 workers, small max_async / queue_slots so that
 * capacity runs out, max_depth 1-3, tiny keep_completed, ...), 1-3 extra
 * sinks and starts:
 *   - 3 dispatcher threads: batches of 1..4096 children (skewed toward
 *     small), by fanout_dispatch, fanout_delegate and fanout_run, plus a few
 *     deliberately bad calls that must be refused;
 *   - one consumer per sink (fanout_wait with short timeouts, or poll(2) on
 *     fanout_sink_fd + fanout_poll);
 *   - a canceller (both modes, random moments, ids from recent dispatches
 *     and from fanout_list, so nested synchronous runs are hit too);
 *   - a lister (fanout_list, fanout_lookup, fanout_stats, and now and then a
 *     second consumer poking a random sink, which must get -EBUSY or a
 *     correct event).
 * Children complete, fail, return -ECANCELED, run slowly while polling
 * fanout_interrupted(), or delegate again from inside (fanout_run,
 * fanout_delegate, fanout_dispatch).  After a random time the engine is
 * shut down while everything is still running, the sinks are drained, every
 * record is checked and the engine is destroyed; then the next epoch.
 *
 * Every delegation has a tracker (batch->user) and every child records in
 * it that it ran, at which index, under which id and what it returned.
 * Each received event is checked against its tracker: exactly once, on its
 * own sink, every child exactly once at its index, results/status/cost/
 * strings as the children left them, the event status rules, and no event
 * ever for a refused call.  At the end of each epoch every accepted
 * delegation must have produced its event (fanout_shutdown returns only
 * when they all were published).  Liveness: each event must arrive within
 * LIVENESS_MS of its last child's return; fanout_shutdown within
 * SHUTDOWN_MS.  A watchdog turns a hang into a failure.
 *
 * Non-vacuity: the run fails unless it saw at least once a cancel that raced
 * a running child, a capacity rejection (-EBUSY), a shutdown that found
 * work still queued, and a nested synchronous join helped by its caller.
 *
 * v0.2 (a quarter of the dispatches and top-level runs): up to 8 children,
 * of which some defer (fanout_defer, maybe fanout_pending_on_cancel) and
 * are completed by two completer threads 0-3 ms later (one in 32 only
 * after 0.2-1 s, so some are completed after fanout_destroy), or at once
 * when their callback ran; some run on the epoch's second engine a batch
 * of children that wait to be interrupted (the cancel tree across
 * engines); half have a deadline of 0.3-5 ms; the join policy is any of
 * the four.  The canceller adds FANOUT_CANCEL_ABANDON half the time and
 * cancels whole sessions (fanout_cancel_session).  The ledger of deferred
 * children: each gets exactly one fanout_complete, which returns 0 (the
 * event shows its outcome) or -EALREADY (the library finished it: the
 * event shows it interrupted and says why - cancelled, timed out, policy).
 * The run also fails unless it saw a fanout_complete return -EALREADY
 * before the shutdown (a cancel, deadline or policy beat the completer), a
 * run on the second engine interrupted by the outer delegation's deadline
 * alone, and a policy interrupt.
 *
 * Self-test: -x 1 drops one received event unchecked, -x 2 checks one
 * event twice, -x 3 checks one as if it came from another sink, -x 4
 * forgets one fanout_complete; each must make the run fail (`make
 * torture-selftest`), so the checks are alive.
 *
 * Exit status: 0 clean; 1 violations; 2 bad usage; 3 hang (watchdog).
 * The seed is printed first, so a failure can be replayed with -s (thread
 * interleavings differ, but configurations and batch shapes repeat).
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "fanout.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define SANITIZED 1
#endif
#endif
#ifndef SANITIZED
#define SANITIZED 0
#endif

#define MAX_BATCH 4096u
#define MAX_SINKS 4
#define TEMP_SINK MAX_SINKS /* the lister's short-lived sink */
#define NDISPATCH 3
#define RECENT 256
#define NESTED_MAX 6
#define TR_MAGIC 0x7472616b6572ull /* "traker" */

/* ------------------------------------------------------------ utilities */

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void sleep_us(unsigned us)
{
	struct timespec ts = {us / 1000000u, (long)(us % 1000000u) * 1000};

	while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
		;
}

static uint64_t mix64(uint64_t x)
{
	x ^= x >> 30;
	x *= 0xbf58476d1ce4e5b9ull;
	x ^= x >> 27;
	x *= 0x94d049bb133111ebull;
	x ^= x >> 31;
	return x;
}

struct rng {
	uint64_t s;
};

static uint64_t rnd(struct rng *r)
{
	r->s += 0x9e3779b97f4a7c15ull;
	return mix64(r->s);
}

/* Uniform in [0, n). */
static unsigned rnd_below(struct rng *r, unsigned n)
{
	return n ? (unsigned)(rnd(r) % n) : 0;
}

/* Uniform in [lo, hi]. */
static unsigned rnd_in(struct rng *r, unsigned lo, unsigned hi)
{
	return lo + rnd_below(r, hi - lo + 1);
}

/* ------------------------------------------------------ global counters */

static uint64_t g_seed;
static unsigned g_seconds = 60;
static unsigned g_live_ms = SANITIZED ? 10000 : 1000;
static unsigned g_shut_ms = SANITIZED ? 30000 : 5000;
static int g_verbose;
static int g_selftest; /* seeded harness bug, see -x */
static atomic_int g_selftest_done;
static atomic_uint g_epoch;

static _Atomic uint64_t c_delegations; /* accepted, all kinds */
static _Atomic uint64_t c_bg;	       /* background accepted */
static _Atomic uint64_t c_sync;	       /* top-level fanout_run / inline */
static _Atomic uint64_t c_nested_sync; /* fanout_run/delegate in children */
static _Atomic uint64_t c_nested_bg;   /* fanout_dispatch in children */
static _Atomic uint64_t c_children;    /* children that ran */
static _Atomic uint64_t c_skipped;     /* children cancelled before start */
static _Atomic uint64_t c_events;      /* events received and checked */
static _Atomic uint64_t c_rejected;    /* refused calls (all reasons) */
static _Atomic uint64_t c_ebusy;       /* -EBUSY from dispatch */
static _Atomic uint64_t c_inline_full; /* fanout_delegate INLINE_FULL */
static _Atomic uint64_t c_eshutdown;
static _Atomic uint64_t c_eloop;
static _Atomic uint64_t c_bad_calls;	/* deliberate misuse, refused */
static _Atomic uint64_t c_cancels_ok;	/* fanout_cancel returned 0 */
static _Atomic uint64_t c_cancelled_ev; /* events with cancelled set */
static _Atomic uint64_t c_race_running; /* interrupt seen mid-run */
static _Atomic uint64_t c_race_pending; /* cancelled event: ran + skipped */
static _Atomic uint64_t c_shut_queued;	/* shutdown that skipped children */
static _Atomic uint64_t c_helped;	/* nested join: caller ran a child */
/* v0.2: deferred children, deadlines, join policies, the cancel tree */
static _Atomic uint64_t c_v2;		/* v0.2 delegations accepted */
static _Atomic uint64_t c_deferred;	/* fanout_defer succeeded */
static _Atomic uint64_t c_pend_ok;	/* fanout_complete returned 0 */
static _Atomic uint64_t c_pend_already; /* ... -EALREADY */
static _Atomic uint64_t c_pend_race;	/* ... -EALREADY before the shutdown */
static _Atomic uint64_t c_pend_after_destroy; /* completed after destroy */
static _Atomic uint64_t c_cb_regs, c_cb_runs; /* on_cancel: 0, callbacks */
static _Atomic uint64_t c_timed_out;	      /* events with timed_out */
static _Atomic uint64_t c_policy;	      /* interrupted_by_policy */
static _Atomic uint64_t c_tree_runs;	      /* inner runs on the 2nd engine */
static _Atomic uint64_t c_tree_intr;	      /* ... all children interrupted */
static _Atomic uint64_t c_tree_deadline;      /* ... by the outer's deadline */
static _Atomic uint64_t c_sessions, c_session_n; /* session cancels */
static _Atomic uint64_t c_st[5];		 /* events per status */
static _Atomic uint64_t c_lookups, c_lists, c_intrusions, c_temp_sinks;
static _Atomic uint64_t c_max_lat_ns, c_max_shut_ns;
static _Atomic uint64_t c_epochs, c_undrained, c_excused, c_left_to_destroy;
/* When the heartbeat thread last found itself descheduled for too long. */
static _Atomic uint64_t hb_stall_ns, hb_max_gap_ns;
static atomic_int c_violations;

static void atomic_max_u64(_Atomic uint64_t *p, uint64_t v)
{
	uint64_t cur = atomic_load_explicit(p, memory_order_relaxed);

	while (v > cur &&
	       !atomic_compare_exchange_weak_explicit(
		       p, &cur, v, memory_order_relaxed, memory_order_relaxed))
		;
}

static void add(_Atomic uint64_t *c, uint64_t n)
{
	atomic_fetch_add_explicit(c, n, memory_order_relaxed);
}

static void violation(const char *fmt, ...)
{
	int n = atomic_fetch_add(&c_violations, 1);
	va_list ap;

	if (n >= 30)
		return;
	va_start(ap, fmt);
	fprintf(stderr, "VIOLATION (seed %" PRIu64 ", epoch %u): ", g_seed,
		atomic_load(&g_epoch));
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
	if (n == 29)
		fprintf(stderr, "(further violations counted, not printed)\n");
}

#define VCHECK(cond, ...)                                                      \
	do {                                                                   \
		if (!(cond))                                                   \
			violation(__VA_ARGS__);                                \
	} while (0)

/* ---------------------------------------------------------------- model */

enum tr_state { TR_INFLIGHT = 0, TR_ACCEPTED, TR_REFUSED, TR_SYNC };

/* Child outcomes. */
enum {
	O_COMPLETE,
	O_ERROR,
	O_CANCELED,
	O_SLOW,
	O_NESTED,
	O_DEFER,
	O_TREE,
	O_WAIT
};
/* Tracker mixes.  MIX_V2: deferred children, a run on the other engine
 * (the cancel tree); MIX_TREE: children that wait to be interrupted. */
enum {
	MIX_ALL_OK,
	MIX_RANDOM,
	MIX_ALL_ERR,
	MIX_ALL_INT,
	MIX_ALL_SLOW,
	MIX_V2,
	MIX_TREE
};

#define KF_SUMMARY 0x1
#define KF_ERRMSG 0x2

/* What one child did; written by the child, read after the event. */
struct kid {
	atomic_uint runs;
	atomic_uint finished;
	int ret;
	unsigned flags;
	double cost;
	fanout_id seen_id;
	unsigned seen_depth;
	/* a deferred child (O_DEFER): its fanout_complete's code and result,
	 * how often it was called, callbacks, and what the event said */
	bool deferred;
	int pend_code;
	atomic_int pend_calls, pend_rc, cb_runs, hurry;
	atomic_int reg_rc; /* fanout_pending_on_cancel's answer; 1 = none */
	int ev_code, ev_status;
	atomic_int ev_seen;
	atomic_int tree_intr; /* O_TREE: the inner run was all interrupted */
};

struct epoch;

struct tracker {
	uint64_t magic;
	struct tracker *next; /* epoch list (heap trackers only) */
	struct epoch *ep;
	unsigned n;
	unsigned depth; /* depth of its children */
	int sink_idx;	/* background: sink index; -1 sync */
	uint64_t oseed;
	unsigned mix;
	bool on_stack;
	bool null_goal0; /* task 0 had goal NULL */
	bool has_skey;
	const char *skey; /* the batch's session_key */
	pthread_t caller; /* sync: the thread that called run */
	bool has_caller;
	char ctx[32];
	atomic_int state;	 /* enum tr_state */
	atomic_int got;		 /* events received */
	atomic_int done;	 /* verified; kids may be gone */
	atomic_int helped;	 /* the sync caller ran one of its children */
	atomic_int cancel_ok;	 /* a fanout_cancel of it returned 0 */
	atomic_int ev_cancelled; /* the event's cancelled flag, once seen */
	_Atomic uint64_t id;	 /* from the dispatch call */
	_Atomic uint64_t ev_id;	 /* from the event */
	_Atomic uint64_t last_end;
	struct kid *kids;
	/* v0.2: a deadline, a join policy, deferred children */
	bool v2;
	uint64_t deadline_ns;
	unsigned join, quorum;
	atomic_int ev_flags; /* EVF_*, stored when the event is verified */
};

#define EVF_CANCELLED 0x1
#define EVF_TIMED_OUT 0x2
#define EVF_POLICY 0x4

/* A deferred child waiting for its completer. */
struct pend_item {
	struct fanout_pending *p;
	struct tracker *tr;
	unsigned i;
	uint64_t due;
	struct pend_item *next;
};

struct epoch {
	unsigned idx;
	struct fanout_engine *e;
	struct fanout_engine *foreign; /* its sink must be refused */
	struct fanout_config cfg;      /* as requested (0 = default) */
	unsigned max_tasks, max_depth; /* effective */
	unsigned nsinks;
	struct fanout_sink *sinks[MAX_SINKS + 1];
	char skey[MAX_SINKS + 1][16];
	atomic_int stop_dispatch, stop_cancel, stop_consume, stop_list;
	atomic_int shutting, shut_returned;
	_Atomic(struct tracker *) all;
	_Atomic uint64_t recent[RECENT];
	atomic_uint recent_pos;
	_Atomic uint64_t bg_accepted; /* on this engine */
	_Atomic uint64_t bg_received;
	_Atomic uint64_t refused;      /* calls refused by this engine */
	_Atomic uint64_t deleg_errors; /* top-level delegate errors */
	_Atomic uint64_t inline_full;
	uint64_t seed;
	/* completers of deferred children (the harness may lock) */
	pthread_mutex_t pq_lock;
	struct pend_item *pq;
	atomic_int stop_complete, destroyed;
};

static char goal_tbl[MAX_BATCH][8];

static const char *goal_of(const struct tracker *tr, unsigned i)
{
	if (i == 0 && tr->null_goal0)
		return "";
	return goal_tbl[i];
}

static unsigned outcome_of(const struct tracker *tr, unsigned i)
{
	uint64_t h = mix64(tr->oseed ^ ((uint64_t)i * 0x9e3779b97f4a7c15ull));
	unsigned p = (unsigned)(h % 1000);

	switch (tr->mix) {
	case MIX_ALL_OK:
		return O_COMPLETE;
	case MIX_ALL_ERR:
		return O_ERROR;
	case MIX_ALL_INT:
		return O_CANCELED;
	case MIX_ALL_SLOW:
		return O_SLOW;
	case MIX_TREE:
		return O_WAIT;
	case MIX_V2:
		if (p < 400)
			return O_DEFER;
		if (p < 650)
			return O_COMPLETE;
		if (p < 780)
			return O_ERROR;
		if (p < 930)
			return O_SLOW;
		return O_TREE;
	default:
		if (p < 760)
			return O_COMPLETE;
		if (p < 860)
			return O_ERROR;
		if (p < 940)
			return O_CANCELED;
		if (p < 970)
			return O_SLOW;
		return O_NESTED;
	}
}

static uint64_t child_hash(const struct tracker *tr, unsigned i)
{
	return mix64(tr->oseed + 0x632be59bd9b4e019ull * (i + 1));
}

static void recent_push(struct epoch *ep, fanout_id id)
{
	unsigned p = atomic_fetch_add_explicit(&ep->recent_pos, 1,
					       memory_order_relaxed);

	atomic_store_explicit(&ep->recent[p % RECENT], id,
			      memory_order_relaxed);
}

static fanout_id recent_pick(struct epoch *ep, struct rng *r)
{
	return atomic_load_explicit(&ep->recent[rnd_below(r, RECENT)],
				    memory_order_relaxed);
}

static struct tracker *tr_new(struct epoch *ep, unsigned n, unsigned depth,
			      int sink_idx, struct rng *r)
{
	struct tracker *tr = calloc(1, sizeof(*tr));
	unsigned p;

	if (!tr || !(tr->kids = calloc(n ? n : 1, sizeof(*tr->kids)))) {
		fprintf(stderr, "torture: out of memory\n");
		exit(2);
	}
	tr->magic = TR_MAGIC;
	tr->ep = ep;
	tr->n = n;
	tr->depth = depth;
	tr->sink_idx = sink_idx;
	tr->oseed = rnd(r);
	p = rnd_below(r, 100);
	tr->mix = p < 40 ? MIX_ALL_OK :
		  p < 85 ? MIX_RANDOM :
		  p < 92 ? MIX_ALL_ERR :
		  p < 98 ? MIX_ALL_INT :
			   MIX_ALL_SLOW;
	if (tr->mix == MIX_ALL_SLOW && n > 16)
		tr->mix = MIX_RANDOM;
	tr->null_goal0 = rnd_below(r, 8) == 0;
	tr->has_skey = sink_idx >= 0 || rnd_below(r, 2);
	snprintf(tr->ctx, sizeof(tr->ctx), "ctx-%" PRIx64, tr->oseed);
	/* push onto the epoch's list (freed when the epoch ends) */
	tr->next = atomic_load_explicit(&ep->all, memory_order_relaxed);
	while (!atomic_compare_exchange_weak_explicit(&ep->all, &tr->next, tr,
						      memory_order_release,
						      memory_order_relaxed))
		;
	return tr;
}

/* The dispatch call returned 0 with @id (0: the caller passed id NULL). */
static void tr_accept(struct tracker *tr, fanout_id id)
{
	if (id)
		atomic_store(&tr->id, id);
	atomic_store(&tr->state, TR_ACCEPTED);
	if (id && atomic_load(&tr->got)) {
		uint64_t evid = atomic_load(&tr->ev_id);

		VCHECK(evid == id,
		       "event id %016" PRIx64 " but dispatch said %016" PRIx64,
		       evid, id);
	}
}

/*
 * A fanout_cancel() of @tr's delegation returned 0: its event must say
 * cancelled.  Checked on whichever side comes second (seq_cst pairs with
 * the store of ev_cancelled before got in verify_event).
 */
static void tr_cancel_ok(struct tracker *tr)
{
	atomic_store(&tr->cancel_ok, 1);
	if (atomic_load(&tr->got))
		VCHECK(atomic_load(&tr->ev_cancelled) == 1,
		       "fanout_cancel returned 0, the event says not "
		       "cancelled");
}

/* The call was refused: no event may ever come. */
static void tr_refuse(struct tracker *tr)
{
	atomic_store(&tr->state, TR_REFUSED);
	VCHECK(atomic_load(&tr->got) == 0,
	       "event arrived for a refused dispatch (ctx %s)", tr->ctx);
}

static enum fanout_status status_of(int ret)
{
	return ret == 0		 ? FANOUT_COMPLETED :
	       ret == -ECANCELED ? FANOUT_INTERRUPTED :
				   FANOUT_ERROR;
}

/* ------------------------------------------------------------- children */

static int tchild(struct fanout_child *c, void *arg);

static void fill_tasks(struct tracker *tr, struct fanout_task *t)
{
	for (unsigned i = 0; i < tr->n; i++) {
		t[i].goal = (i == 0 && tr->null_goal0) ? NULL : goal_tbl[i];
		t[i].fn = tchild;
		t[i].arg = tr;
	}
}

static void fill_batch(struct tracker *tr, struct fanout_batch *b,
		       struct fanout_task *t)
{
	struct epoch *ep = tr->ep;

	memset(b, 0, sizeof(*b));
	fill_tasks(tr, t);
	b->tasks = t;
	b->ntasks = tr->n;
	b->context = tr->ctx;
	b->user = tr;
	if (tr->sink_idx >= 0) {
		b->sink = tr->sink_idx == 0 && (tr->oseed & 1) ?
				  NULL :
				  ep->sinks[tr->sink_idx];
		b->session_key = ep->skey[tr->sink_idx];
	} else {
		b->session_key = tr->has_skey ? "sync" : NULL;
	}
	tr->skey = b->session_key;
}

static void verify_event(struct tracker *tr, struct fanout_event *ev,
			 int where);

/*
 * A child that delegates again from inside: fanout_run / fanout_delegate
 * (synchronous, the tracker lives on this stack) or fanout_dispatch
 * (background, an ordinary heap tracker).
 */
static void nested(struct fanout_child *c, struct tracker *parent, unsigned i)
{
	struct epoch *ep = parent->ep;
	uint64_t h = child_hash(parent, i) >> 8;
	unsigned depth = fanout_child_depth(c) + 1;
	bool too_deep = depth > ep->max_depth;
	unsigned kind = (unsigned)(h % 100);
	struct rng r = {h};
	struct fanout_task tasks[NESTED_MAX];
	struct fanout_batch b;
	struct fanout_event *ev = NULL;
	fanout_id id = 0;
	int rc;

	if (kind < 15) { /* background from inside a child */
		struct tracker *tr =
			tr_new(ep, rnd_in(&r, 1, NESTED_MAX), depth,
			       (int)rnd_below(&r, ep->nsinks), &r);

		if (tr->mix == MIX_RANDOM)
			tr->mix = MIX_ALL_OK; /* no nesting below nesting */
		fill_batch(tr, &b, tasks);
		rc = fanout_dispatch(ep->e, &b, &id);
		if (rc == 0) {
			VCHECK(!too_deep,
			       "nested dispatch at depth %u > max %u accepted",
			       depth, ep->max_depth);
			atomic_fetch_add(&ep->bg_accepted, 1);
			add(&c_delegations, 1);
			add(&c_nested_bg, 1);
			add(&c_bg, 1);
			tr_accept(tr, id);
			recent_push(ep, id);
			return;
		}
		tr_refuse(tr);
		atomic_fetch_add(&ep->refused, 1);
		add(&c_rejected, 1);
		if (too_deep) {
			VCHECK(rc == -ELOOP,
			       "nested dispatch too deep: %d, want -ELOOP", rc);
			add(&c_eloop, 1);
		} else if (rc == -EBUSY) {
			add(&c_ebusy, 1);
		} else if (rc == -ESHUTDOWN) {
			VCHECK(atomic_load(&ep->shutting),
			       "nested dispatch -ESHUTDOWN before shutdown");
			add(&c_eshutdown, 1);
		} else {
			violation("nested dispatch returned %d", rc);
		}
		return;
	}

	/* synchronous: tracker and kids on this stack */
	struct tracker tr;
	struct kid kids[NESTED_MAX];

	memset(&tr, 0, sizeof(tr));
	memset(kids, 0, sizeof(kids));
	tr.magic = TR_MAGIC;
	tr.ep = ep;
	tr.n = rnd_in(&r, 1, NESTED_MAX);
	tr.depth = depth;
	tr.sink_idx = -1;
	tr.oseed = rnd(&r);
	tr.mix = rnd_below(&r, 4) ? MIX_RANDOM : MIX_ALL_OK;
	tr.on_stack = true;
	tr.caller = pthread_self();
	tr.has_caller = true;
	tr.has_skey = rnd_below(&r, 2);
	snprintf(tr.ctx, sizeof(tr.ctx), "nested-%" PRIx64, tr.oseed);
	atomic_init(&tr.state, TR_SYNC);
	tr.kids = kids;
	fill_batch(&tr, &b, tasks);
	if (rnd_below(&r, 2))
		b.sink = ep->sinks[rnd_below(&r, ep->nsinks)]; /* ignored */
	if (kind < 60) {
		rc = fanout_run(ep->e, &b, &ev);
		if (rc == 0)
			rc = 1;
	} else {
		rc = fanout_delegate(ep->e, &b, &id, &ev);
		if (rc == FANOUT_INLINE) {
			VCHECK(ev && id == ev->id,
			       "delegate INLINE: id not set");
			rc = 1;
		} else if (rc > 0) {
			violation("fanout_delegate inside a child returned %d, "
				  "want FANOUT_INLINE",
				  rc);
			if (rc == FANOUT_BACKGROUND)
				return; /* would need a tracker: give up */
		}
	}
	if (rc > 0) {
		VCHECK(!too_deep, "nested run at depth %u > max %u accepted",
		       depth, ep->max_depth);
		add(&c_delegations, 1);
		add(&c_nested_sync, 1);
		verify_event(&tr, ev, -1);
		if (atomic_load(&tr.helped))
			add(&c_helped, 1);
		fanout_event_free(ev);
		return;
	}
	atomic_fetch_add(&ep->refused, 1);
	add(&c_rejected, 1);
	if (too_deep) {
		VCHECK(rc == -ELOOP, "nested run too deep: %d, want -ELOOP",
		       rc);
		add(&c_eloop, 1);
	} else if (rc == -ESHUTDOWN) {
		VCHECK(atomic_load(&ep->shutting),
		       "nested run -ESHUTDOWN before shutdown");
		add(&c_eshutdown, 1);
	} else {
		violation("nested run/delegate returned %d", rc);
	}
}

/* ------------------------------------------ v0.2: children that finish later */

/* on_cancel callback of a deferred child: tell its completer to hurry. */
static void pend_cb(struct fanout_pending *p, void *arg)
{
	struct kid *k = arg;

	if (atomic_fetch_add(&k->cb_runs, 1) != 0)
		violation("on_cancel callback of child %u ran twice",
			  fanout_pending_index(p));
	VCHECK(fanout_pending_interrupted(p),
	       "on_cancel callback, but fanout_pending_interrupted() false");
	atomic_store(&k->hurry, 1);
	add(&c_cb_runs, 1);
}

/* O_DEFER: defer, maybe register a callback, hand the pending child to the
 * completers (due in 0-3 ms) and return -EINPROGRESS. */
static int defer_child(struct fanout_child *c, struct tracker *tr, unsigned i,
		       struct kid *k, uint64_t h)
{
	struct epoch *ep = tr->ep;
	struct fanout_pending *p;
	struct pend_item *it;
	int rc;

	/* Everything the event's check reads is written before fanout_defer:
	 * if the delegation is being abandoned, fanout_defer finishes the
	 * child itself and the event may be checked before it returns.
	 * After it, only atomics. */
	k->deferred = true;
	k->pend_code = (h >> 13) % 8 == 0 ? -EIO :
		       (h >> 13) % 8 == 1 ? -ECANCELED :
					    0;
	k->ret = -EINPROGRESS;
	atomic_store(&k->reg_rc, 1);
	p = fanout_defer(c);
	if (!p) {
		violation("fanout_defer: %d", errno);
		atomic_max_u64(&tr->last_end, now_ns());
		atomic_store_explicit(&k->finished, 1, memory_order_release);
		return 0;
	}
	VCHECK(fanout_defer(c) == NULL && errno == EINVAL,
	       "a second fanout_defer of one child was accepted");
	VCHECK(fanout_pending_index(p) == i &&
		       fanout_pending_id(p) == fanout_child_id(c),
	       "pending index/id wrong");
	if ((h >> 16) & 1) {
		rc = fanout_pending_on_cancel(p, pend_cb, k);
		VCHECK(rc == 0 || rc == -EALREADY, "on_cancel: %d", rc);
		atomic_store(&k->reg_rc, rc);
		if (rc == 0)
			add(&c_cb_regs, 1);
		rc = fanout_pending_on_cancel(p, pend_cb, k);
		VCHECK(rc == -EBUSY || rc == -EALREADY, "second on_cancel: %d",
		       rc);
	}
	it = malloc(sizeof(*it));
	if (!it) {
		fprintf(stderr, "torture: out of memory\n");
		exit(2);
	}
	it->p = p;
	it->tr = tr;
	it->i = i;
	/* due in 0-3 ms; one in 32 in 0.2-1 s, so that some are still
	 * pending when the engine is destroyed */
	it->due = now_ns() + 1000ull * ((h >> 25) % 32 ?
						(h >> 20) % 3000 :
						200000 + (h >> 20) % 800000);
	add(&c_deferred, 1);
	atomic_max_u64(&tr->last_end, now_ns());
	/* before the hand-off: the completer may finish the delegation and
	 * its event be checked before this returns */
	atomic_store_explicit(&k->finished, 1, memory_order_release);
	pthread_mutex_lock(&ep->pq_lock);
	it->next = ep->pq;
	ep->pq = it;
	pthread_mutex_unlock(&ep->pq_lock);
	return -EINPROGRESS;
}

/* O_TREE: a synchronous run on the epoch's second engine whose children
 * wait to be interrupted; an interrupt of this delegation (cancel,
 * deadline, policy, shutdown) must reach them through the cancel tree. */
static void tree_child(struct fanout_child *c, struct tracker *parent,
		       unsigned i, struct kid *k)
{
	struct epoch *ep = parent->ep;
	struct rng r = {child_hash(parent, i) >> 3};
	struct fanout_task tasks[4];
	struct kid kids[4];
	struct tracker tr;
	struct fanout_batch b;
	struct fanout_event *ev = NULL;
	int rc;

	memset(&tr, 0, sizeof(tr));
	memset(kids, 0, sizeof(kids));
	tr.magic = TR_MAGIC;
	tr.ep = ep;
	tr.n = rnd_in(&r, 1, 4);
	tr.depth = fanout_child_depth(c) + 1;
	tr.sink_idx = -1;
	tr.oseed = rnd(&r);
	tr.mix = MIX_TREE;
	tr.on_stack = true;
	tr.caller = pthread_self();
	tr.has_caller = true;
	snprintf(tr.ctx, sizeof(tr.ctx), "tree-%" PRIx64, tr.oseed);
	atomic_init(&tr.state, TR_SYNC);
	tr.kids = kids;
	fill_batch(&tr, &b, tasks);
	rc = fanout_run(ep->foreign, &b, &ev);
	if (rc != 0) {
		VCHECK(rc == -ELOOP, "run on the second engine: %d", rc);
		return;
	}
	add(&c_delegations, 1);
	add(&c_nested_sync, 1);
	add(&c_tree_runs, 1);
	verify_event(&tr, ev, -1);
	if (ev->ninterrupted == tr.n && ev->cancelled) {
		add(&c_tree_intr, 1);
		atomic_store(&k->tree_intr, 1);
	}
	fanout_event_free(ev);
}

static int tchild(struct fanout_child *c, void *arg)
{
	struct tracker *tr = arg;
	unsigned i = fanout_child_index(c);
	struct epoch *ep;
	struct kid *k;
	uint64_t h, end;
	unsigned o;
	int ret = 0;
	char buf[16];

	if (!tr || tr->magic != TR_MAGIC) {
		violation("child got a bad arg %p", arg);
		return -EINVAL;
	}
	ep = tr->ep;
	if (i >= tr->n) {
		violation("child index %u >= ntasks %u", i, tr->n);
		return -EINVAL;
	}
	if (atomic_load(&tr->state) == TR_REFUSED)
		violation("child %u of a refused delegation ran", i);
	if (atomic_load(&tr->done)) {
		violation("child %u ran after its event was received", i);
		return 0;
	}
	VCHECK(fanout_current_child() == c, "fanout_current_child() != c");
	k = &tr->kids[i];
	if (atomic_fetch_add(&k->runs, 1) != 0) {
		violation("child %u of %s ran twice", i, tr->ctx);
		return 0;
	}
	k->seen_id = fanout_child_id(c);
	k->seen_depth = fanout_child_depth(c);
	if (tr->has_caller && pthread_equal(pthread_self(), tr->caller))
		atomic_store_explicit(&tr->helped, 1, memory_order_relaxed);
	h = child_hash(tr, i);
	o = outcome_of(tr, i);
	switch (o) {
	case O_COMPLETE:
		if (h & 0x100) {
			snprintf(buf, sizeof(buf), "s%u", i);
			VCHECK(fanout_set_summary(c, buf, strlen(buf)) == 0,
			       "set_summary failed");
			k->flags |= KF_SUMMARY;
		}
		break;
	case O_ERROR:
		switch ((h >> 9) % 5) {
		case 0:
			ret = 5; /* positive: reported as an error */
			break;
		case 1:
			ret = -ENOENT; /* no message: library describes it */
			break;
		default:
			snprintf(buf, sizeof(buf), "e%u", i);
			VCHECK(fanout_set_error(c, buf) == 0,
			       "set_error failed");
			k->flags |= KF_ERRMSG;
			ret = -EIO;
		}
		break;
	case O_CANCELED:
		ret = -ECANCELED;
		break;
	case O_SLOW: {
		bool at_start = fanout_interrupted(c);

		end = now_ns() + 1000ull * (10 + (h >> 12) % 290);
		while (now_ns() < end) {
			if (fanout_interrupted(c)) {
				if (!at_start && !atomic_load(&ep->shutting))
					add(&c_race_running, 1);
				ret = -ECANCELED;
				break;
			}
			sleep_us(40);
		}
		break;
	}
	case O_NESTED:
		nested(c, tr, i);
		ret = fanout_interrupted(c) ? -ECANCELED : 0;
		break;
	case O_DEFER:
		return defer_child(c, tr, i, k, h);
	case O_TREE:
		tree_child(c, tr, i, k);
		ret = fanout_interrupted(c) ? -ECANCELED : 0;
		break;
	case O_WAIT: /* up to 30 ms, unless interrupted */
		end = now_ns() + 30000000ull;
		while (now_ns() < end) {
			if (fanout_interrupted(c)) {
				ret = -ECANCELED;
				break;
			}
			sleep_us(100);
		}
		break;
	}
	if ((h & 0x600) == 0x200) {
		VCHECK(fanout_add_cost(c, 1.0) == 0, "add_cost failed");
		k->cost = 1.0;
	} else if ((h & 0x600) == 0x400) {
		VCHECK(fanout_add_cost(c, 0.25) == 0 &&
			       fanout_add_cost(c, 0.25) == 0,
		       "add_cost failed");
		k->cost = 0.5;
	}
	k->ret = ret;
	atomic_max_u64(&tr->last_end, now_ns());
	atomic_store_explicit(&k->finished, 1, memory_order_release);
	return ret;
}

/* --------------------------------------------------------- verification */

/*
 * Check @ev against @tr.  @where: the sink index it was received on, or -1
 * for a synchronous event (fanout_run / inline delegate).
 */
static void verify_event(struct tracker *tr, struct fanout_event *ev, int where)
{
	unsigned nc = 0, ne = 0, ni = 0, ran = 0, skipped = 0, i;
	double cost = 0;
	uint64_t ref, lat, t = now_ns();
	struct epoch *ep;
	int st, old;

	if (!ev) {
		violation("NULL event");
		return;
	}
	if (!tr || tr->magic != TR_MAGIC) {
		violation("event " FANOUT_ID_FMT
			  " with a foreign user pointer %p",
			  (unsigned long long)ev->id, (void *)tr);
		return;
	}
	ep = tr->ep;
	atomic_store(&tr->ev_id, ev->id);
	atomic_store(&tr->ev_cancelled, ev->cancelled ? 1 : 0);
	atomic_store(&tr->ev_flags,
		     (ev->cancelled ? EVF_CANCELLED : 0) |
			     (ev->timed_out ? EVF_TIMED_OUT : 0) |
			     (ev->interrupted_by_policy ? EVF_POLICY : 0));
	old = atomic_fetch_add(&tr->got, 1);
	if (old) {
		violation("DUPLICATE event " FANOUT_ID_FMT " (%d before)",
			  (unsigned long long)ev->id, old);
		return;
	}
	st = atomic_load(&tr->state);
	if (st == TR_REFUSED)
		violation("event " FANOUT_ID_FMT " for a REFUSED call",
			  (unsigned long long)ev->id);
	if (where >= 0) {
		VCHECK(tr->sink_idx >= 0,
		       "synchronous delegation's event on sink %d", where);
		VCHECK(tr->sink_idx == where,
		       "event " FANOUT_ID_FMT
		       " on sink %d, dispatched to sink %d",
		       (unsigned long long)ev->id, where, tr->sink_idx);
		if (st == TR_ACCEPTED && atomic_load(&tr->id))
			VCHECK(atomic_load(&tr->id) == ev->id,
			       "event id " FANOUT_ID_FMT
			       " != dispatch id %016" PRIx64,
			       (unsigned long long)ev->id,
			       atomic_load(&tr->id));
	}
	VCHECK(ev->id != 0, "event id 0");
	VCHECK(ev->user == tr, "event user pointer wrong");
	if (ev->nresults != tr->n || !ev->results) {
		violation("event " FANOUT_ID_FMT ": nresults %u, want %u",
			  (unsigned long long)ev->id, ev->nresults, tr->n);
		return;
	}
	VCHECK(ev->context && strcmp(ev->context, tr->ctx) == 0,
	       "context not copied");
	if (tr->skey)
		VCHECK(ev->session_key && ev->session_key != tr->skey &&
			       strcmp(ev->session_key, tr->skey) == 0,
		       "session_key not copied");
	else
		VCHECK(ev->session_key == NULL, "session_key should be NULL");
	for (i = 0; i < tr->n; i++) {
		const struct fanout_result *r = &ev->results[i];
		struct kid *k = &tr->kids[i];
		unsigned runs = atomic_load(&k->runs);

		if (r->index != i)
			violation("result %u has index %u", i, r->index);
		if (!r->goal || strcmp(r->goal, goal_of(tr, i)) != 0)
			violation("result %u goal \"%s\"", i,
				  r->goal ? r->goal : "(null)");
		if (runs > 1) {
			violation("child %u ran %u times", i, runs);
		} else if (runs == 1) {
			ran++;
			/* (a deferred child may be finished, and its event
			 * published, before its fn returns) */
			if (!k->deferred &&
			    !atomic_load_explicit(&k->finished,
						  memory_order_acquire))
				violation("event " FANOUT_ID_FMT
					  " before child %u "
					  "returned",
					  (unsigned long long)ev->id, i);
			if (k->seen_id != ev->id)
				violation("child %u saw id %016" PRIx64, i,
					  k->seen_id);
			if (k->seen_depth != tr->depth)
				violation("child %u depth %u, want %u", i,
					  k->seen_depth, tr->depth);
			if (k->deferred) {
				/* checked against its completer's result at
				 * the end of the epoch */
				k->ev_code = r->code;
				k->ev_status = r->status;
				atomic_store(&k->ev_seen, 1);
				VCHECK(r->summary == NULL && r->cost == 0,
				       "deferred child %u: summary/cost", i);
				VCHECK(r->status == status_of(r->code) ||
					       (r->code == -ETIMEDOUT &&
						r->status ==
							FANOUT_INTERRUPTED),
				       "deferred child %u: code %d status %d",
				       i, r->code, r->status);
				VCHECK(r->code == 0 || r->error,
				       "deferred child %u: no error text", i);
				goto tally;
			}
			if (ev->timed_out && r->code == -ETIMEDOUT &&
			    k->ret != -ETIMEDOUT) {
				/* returned after the deadline: reported as
				 * timed out whatever it returned */
				VCHECK(r->status == FANOUT_INTERRUPTED &&
					       r->error,
				       "timed-out child %u: status %d", i,
				       r->status);
				goto tally;
			}
			if (r->code != k->ret || r->status != status_of(k->ret))
				violation("child %u returned %d, result says "
					  "code %d status %d",
					  i, k->ret, r->code, r->status);
			if (k->ret == 0) {
				VCHECK(r->error == NULL,
				       "completed child with error");
			} else if (!r->error) {
				violation("failed child %u without error text",
					  i);
			} else if (k->flags & KF_ERRMSG) {
				char want[16];

				snprintf(want, sizeof(want), "e%u", i);
				VCHECK(strcmp(r->error, want) == 0,
				       "child %u error \"%s\"", i, r->error);
			}
			if (k->flags & KF_SUMMARY) {
				char want[16];

				snprintf(want, sizeof(want), "s%u", i);
				VCHECK(r->summary &&
					       strcmp(r->summary, want) == 0,
				       "child %u summary wrong", i);
			} else {
				VCHECK(r->summary == NULL,
				       "child %u has a summary", i);
			}
			VCHECK(r->cost == k->cost, "child %u cost %g, want %g",
			       i, r->cost, k->cost);
		} else {
			skipped++;
			if (r->status != FANOUT_INTERRUPTED ||
			    (r->code != -ECANCELED &&
			     !(ev->timed_out && r->code == -ETIMEDOUT)) ||
			    r->duration_ns != 0 || r->summary || !r->error ||
			    r->cost != 0)
				violation(
					"unstarted child %u: status %d code %d "
					"duration %" PRIu64,
					i, r->status, r->code, r->duration_ns);
		}
	tally:
		cost += r->cost;
		if (r->status == FANOUT_COMPLETED)
			nc++;
		else if (r->status == FANOUT_INTERRUPTED)
			ni++;
		else if (r->status == FANOUT_ERROR)
			ne++;
		else
			violation("child %u has status %d", i, r->status);
	}
	if (atomic_load(&tr->cancel_ok))
		VCHECK(ev->cancelled,
		       "fanout_cancel returned 0 for " FANOUT_ID_FMT
		       ", its event says not cancelled",
		       (unsigned long long)ev->id);
	if (skipped)
		VCHECK(ev->cancelled || ev->timed_out ||
			       ev->interrupted_by_policy,
		       "event " FANOUT_ID_FMT " skipped %u children "
		       "but is not marked cancelled/timed out/policy",
		       (unsigned long long)ev->id, skipped);
	if (ev->timed_out) {
		VCHECK(tr->deadline_ns, "timed_out without a deadline");
		add(&c_timed_out, 1);
	}
	if (ev->interrupted_by_policy) {
		add(&c_policy, 1);
		VCHECK(tr->join == FANOUT_JOIN_FIRST_ERROR ? ne >= 1 :
		       tr->join == FANOUT_JOIN_ANY	   ? nc >= 1 :
		       tr->join == FANOUT_JOIN_QUORUM	   ? nc >= tr->quorum :
							     false,
		       "interrupted_by_policy: join %u quorum %u, %u "
		       "completed %u errors",
		       tr->join, tr->quorum, nc, ne);
	}
	/* the cancel tree reached a run on the other engine because (only)
	 * this delegation's deadline passed */
	if (ev->timed_out && !ev->cancelled && !ev->interrupted_by_policy)
		for (i = 0; i < tr->n; i++)
			if (atomic_load(&tr->kids[i].tree_intr)) {
				add(&c_tree_deadline, 1);
				break;
			}
	VCHECK(ev->ncompleted == nc && ev->nerror == ne &&
		       ev->ninterrupted == ni,
	       "event counts %u/%u/%u, results say %u/%u/%u", ev->ncompleted,
	       ev->nerror, ev->ninterrupted, nc, ne, ni);
	if (nc)
		VCHECK(ev->status == FANOUT_COMPLETED && ev->error == NULL,
		       "event status %d with %u completed", ev->status, nc);
	else if (ni == tr->n)
		VCHECK(ev->status == FANOUT_INTERRUPTED && ev->error,
		       "event status %d, every child interrupted", ev->status);
	else
		VCHECK(ev->status == FANOUT_ERROR && ev->error,
		       "event status %d, want error", ev->status);
	VCHECK(ev->cost == cost, "event cost %g, children %g", ev->cost, cost);
	VCHECK(ev->dispatched_ns && ev->dispatched_ns <= ev->completed_ns,
	       "event times");
	if ((unsigned)ev->status < 5)
		add(&c_st[ev->status], 1);
	if (ev->cancelled) {
		add(&c_cancelled_ev, 1);
		if (ran && skipped && !atomic_load(&ep->shutting))
			add(&c_race_pending, 1);
	}
	/* liveness: from the last child's return (or the finalisation when
	 * no child ran) to here */
	ref = atomic_load(&tr->last_end);
	if (!ref)
		ref = ev->completed_ns;
	lat = t > ref ? t - ref : 0;
	atomic_max_u64(&c_max_lat_ns, lat);
	if (lat > (uint64_t)g_live_ms * 1000000ull) {
		/* Late.  If the whole process (the VM) was stalled, the
		 * heartbeat may not have run since: give it the chance. */
		sleep_us(20000);
		if (atomic_load(&hb_stall_ns) >= ref)
			add(&c_excused, 1); /* the whole process was starved */
		else
			violation("event " FANOUT_ID_FMT
				  " (%u tasks, %s %d) arrived "
				  "%.1f ms after its last child (bound %u ms): "
				  "join->publish %.1f ms, publish->receipt "
				  "%.1f ms",
				  (unsigned long long)ev->id, tr->n,
				  where >= 0 ? "sink" : "sync", where,
				  lat / 1e6, g_live_ms,
				  ((int64_t)ev->completed_ns - (int64_t)ref) /
					  1e6,
				  ((int64_t)t - (int64_t)ev->completed_ns) /
					  1e6);
	}
	add(&c_children, ran);
	add(&c_skipped, skipped);
	add(&c_events, 1);
	if (where >= 0)
		atomic_fetch_add(&ep->bg_received, 1);
	atomic_store(&tr->done, 1);
	if (!tr->on_stack && !tr->v2) {
		free(tr->kids);
		tr->kids = NULL;
	}
}

/* A consumer or the lister took @ev from sink @where. */
static void receive(struct epoch *ep, struct fanout_event *ev, int where,
		    struct rng *r)
{
	struct tracker *tr = ev ? ev->user : NULL;

	if (g_selftest && g_selftest <= 3 && where >= 0 &&
	    !atomic_exchange(&g_selftest_done, 1)) {
		if (g_selftest == 1) { /* "lose" it */
			fanout_event_free(ev);
			return;
		}
		if (g_selftest == 2) /* see it twice */
			verify_event(tr, ev, where);
		if (g_selftest == 3) /* see it on the wrong sink */
			where = where ? 0 : 1;
	}
	verify_event(tr, ev, where);
	if (ev && rnd_below(r, 8) == 0) {
		struct fanout_info info;
		int rc = fanout_lookup(ep->e, ev->id, &info);

		add(&c_lookups, 1);
		if (rc == 0)
			VCHECK(info.id == ev->id && info.status == ev->status &&
				       info.ndone == info.ntasks &&
				       info.completed_ns == ev->completed_ns &&
				       info.background,
			       "lookup after event: status %d ndone %u/%u",
			       info.status, info.ndone, info.ntasks);
		else
			VCHECK(rc == -ENOENT, "lookup after event: %d", rc);
	}
	fanout_event_free(ev);
}

/* ------------------------------------------------------------- threads */

struct targ {
	struct epoch *ep;
	unsigned idx;
	pthread_t t;
};

static unsigned pick_n(struct rng *r)
{
	unsigned p = rnd_below(r, 1000);

	if (p < 550)
		return 1;
	if (p < 800)
		return rnd_in(r, 2, 8);
	if (p < 957)
		return rnd_in(r, 9, 64);
	if (p < 997)
		return rnd_in(r, 65, 512);
	return rnd_in(r, 513, MAX_BATCH);
}

static void refused(struct epoch *ep, struct tracker *tr, int rc,
		    bool shut_before, const char *what)
{
	tr_refuse(tr);
	atomic_fetch_add(&ep->refused, 1);
	add(&c_rejected, 1);
	if (shut_before && rc != -ESHUTDOWN)
		violation("%s after fanout_shutdown returned: %d", what, rc);
	switch (rc) {
	case -EBUSY:
		add(&c_ebusy, 1);
		break;
	case -ESHUTDOWN:
		VCHECK(atomic_load(&ep->shutting),
		       "%s: -ESHUTDOWN before shutdown", what);
		add(&c_eshutdown, 1);
		break;
	case -E2BIG:
		VCHECK(tr->n > ep->max_tasks,
		       "%s: -E2BIG for %u tasks (max %u)", what, tr->n,
		       ep->max_tasks);
		break;
	default:
		violation("%s returned %d (%s)", what, rc, fanout_strerror(rc));
	}
}

/* A deliberately bad call: must be refused with the documented errno. */
static void bad_call(struct epoch *ep, struct rng *r, struct fanout_task *tasks)
{
	unsigned kind = rnd_below(r, 5);
	struct tracker *tr;
	struct fanout_batch b;
	struct fanout_event *ev = NULL;
	bool shut;
	int want = -EINVAL, rc;
	fanout_id id = 0;

	if (kind == 4 && ep->max_tasks >= MAX_BATCH)
		kind = 2;
	tr = tr_new(ep, rnd_in(r, 1, 8), 1, 0, r);
	fill_batch(tr, &b, tasks);
	switch (kind) {
	case 0:
		b.ntasks = 0;
		break;
	case 1:
		b.tasks = NULL;
		break;
	case 2:
		tasks[rnd_below(r, tr->n)].fn = NULL;
		break;
	case 3:
		b.sink = fanout_default_sink(ep->foreign);
		break;
	case 4:
		b.ntasks = ep->max_tasks + 1;
		for (unsigned i = tr->n; i < b.ntasks; i++)
			tasks[i] = tasks[0];
		want = -E2BIG;
		break;
	}
	if (kind == 3 || rnd_below(r, 2)) /* (run ignores the sink) */
		rc = fanout_dispatch(ep->e, &b, &id);
	else
		rc = fanout_run(ep->e, &b, &ev);
	shut = atomic_load(&ep->shutting); /* set before shutdown starts */
	tr_refuse(tr);
	atomic_fetch_add(&ep->refused, 1);
	add(&c_rejected, 1);
	add(&c_bad_calls, 1);
	/* (which of two applicable errors wins is not documented) */
	VCHECK(rc == want || (shut && rc == -ESHUTDOWN),
	       "bad call kind %u returned %d, want %d (shutting %d)", kind, rc,
	       want, shut);
	if (rc == 0 && ev)
		fanout_event_free(ev);
}

/* A v0.2 delegation: deferred children and a run on the other engine
 * (MIX_V2), maybe a deadline (0.3-5 ms), any join policy. */
static void v2_setup(struct tracker *tr, struct fanout_batch *b, struct rng *r)
{
	unsigned p = rnd_below(r, 100);

	tr->v2 = true;
	tr->mix = MIX_V2;
	if (rnd_below(r, 2))
		tr->deadline_ns = 1000ull * rnd_in(r, 300, 5000);
	tr->join = p < 40 ? FANOUT_JOIN_ALL :
		   p < 60 ? FANOUT_JOIN_FIRST_ERROR :
		   p < 80 ? FANOUT_JOIN_ANY :
			    FANOUT_JOIN_QUORUM;
	tr->quorum = tr->join == FANOUT_JOIN_QUORUM ? rnd_in(r, 1, tr->n) : 0;
	b->deadline_ns = tr->deadline_ns;
	b->join = tr->join;
	b->quorum = tr->quorum;
}

static void *dispatcher(void *arg)
{
	struct targ *ta = arg;
	struct epoch *ep = ta->ep;
	struct rng r = {mix64(ep->seed ^ (0xd15ull + ta->idx))};
	struct fanout_task *tasks = calloc(MAX_BATCH + 1, sizeof(*tasks));

	while (!atomic_load_explicit(&ep->stop_dispatch,
				     memory_order_relaxed)) {
		bool shut_before = atomic_load(&ep->shut_returned), v2;
		unsigned kind = rnd_below(&r, 1000);
		struct fanout_batch b;
		struct fanout_event *ev = NULL;
		struct tracker *tr;
		fanout_id id = 0;
		int rc;

		if (kind < 15) {
			bad_call(ep, &r, tasks);
			continue;
		}
		v2 = (kind < 850 || kind >= 950) && rnd_below(&r, 4) == 0;
		tr = tr_new(ep, v2 ? rnd_in(&r, 1, 8) : pick_n(&r), 1,
			    (int)rnd_below(&r, ep->nsinks), &r);
		if (kind >= 950) { /* top-level synchronous run */
			tr->sink_idx = -1;
			tr->has_caller = true;
			tr->caller = pthread_self();
			atomic_store(&tr->state, TR_SYNC);
		}
		fill_batch(tr, &b, tasks);
		if (v2)
			v2_setup(tr, &b, &r);
		if (kind < 850) {
			rc = fanout_dispatch(ep->e, &b,
					     rnd_below(&r, 16) ? &id : NULL);
		} else if (kind < 950) {
			rc = fanout_delegate(ep->e, &b, &id, &ev);
			if (rc == FANOUT_BACKGROUND) {
				VCHECK(ev == NULL,
				       "delegate BACKGROUND set ev");
				rc = 0;
			} else if (rc == FANOUT_INLINE_FULL) {
				VCHECK(ev && id == ev->id,
				       "INLINE_FULL: id not set");
				atomic_store(&tr->state, TR_SYNC);
				tr->sink_idx = -1;
				VCHECK(!shut_before,
				       "delegate ran after shutdown");
				add(&c_inline_full, 1);
				atomic_fetch_add(&ep->inline_full, 1);
				add(&c_delegations, 1);
				add(&c_sync, 1);
				verify_event(tr, ev, -1);
				fanout_event_free(ev);
				continue;
			} else if (rc > 0) {
				violation(
					"top-level fanout_delegate returned %d",
					rc);
				continue;
			} else {
				atomic_fetch_add(&ep->deleg_errors, 1);
			}
		} else {
			rc = fanout_run(ep->e, &b, &ev);
			if (rc == 0) {
				VCHECK(!shut_before,
				       "run accepted after shutdown");
				add(&c_delegations, 1);
				add(&c_sync, 1);
				if (v2)
					add(&c_v2, 1);
				verify_event(tr, ev, -1);
				fanout_event_free(ev);
				continue;
			}
		}
		if (rc == 0) {
			VCHECK(!shut_before,
			       "dispatch accepted after shutdown");
			add(&c_delegations, 1);
			add(&c_bg, 1);
			if (v2)
				add(&c_v2, 1);
			atomic_fetch_add(&ep->bg_accepted, 1);
			tr_accept(tr, id);
			if (id)
				recent_push(ep, id);
			/* now and then cancel our own, right away */
			if (id && rnd_below(&r, 64) == 0 &&
			    !atomic_load(&ep->shutting)) {
				rc = fanout_cancel(ep->e, id, rnd_in(&r, 1, 3));
				VCHECK(rc == 0 || rc == -EALREADY ||
					       rc == -ENOENT,
				       "cancel of own delegation: %d", rc);
				if (rc == 0) {
					add(&c_cancels_ok, 1);
					tr_cancel_ok(tr);
				}
			}
			continue;
		}
		refused(ep, tr, rc, shut_before,
			kind < 850 ? "fanout_dispatch" :
			kind < 950 ? "fanout_delegate" :
				     "fanout_run");
		if (rc == -EBUSY)
			sleep_us(rnd_in(&r, 5, 100));
		else if (rc == -ESHUTDOWN)
			sleep_us(200);
	}
	free(tasks);
	return NULL;
}

static void *consumer(void *arg)
{
	struct targ *ta = arg;
	struct epoch *ep = ta->ep;
	struct fanout_sink *s = ep->sinks[ta->idx];
	struct rng r = {mix64(ep->seed ^ (0xc0ull + ta->idx))};
	bool use_fd = ta->idx == 1;
	int fd = use_fd ? fanout_sink_fd(s) : -1;

	if (use_fd)
		VCHECK(fd >= 0, "fanout_sink_fd: %d", fd);
	while (!atomic_load_explicit(&ep->stop_consume, memory_order_relaxed)) {
		struct fanout_event *ev = NULL;
		int rc;

		if (use_fd) {
			struct pollfd p = {.fd = fd, .events = POLLIN};
			uint64_t t0 = now_ns();
			int pr = poll(&p, 1, 10);

			for (;;) {
				rc = fanout_poll(s, &ev);
				if (rc != 0)
					break;
				/* an event that was published long before
				 * poll(2) gave up must have made it readable */
				if (pr == 0 &&
				    ev->completed_ns + (uint64_t)g_live_ms *
							       1000000ull <
					    t0)
					violation(
						"sink fd not readable although "
						"event " FANOUT_ID_FMT
						" waited",
						(unsigned long long)ev->id);
				receive(ep, ev, (int)ta->idx, &r);
			}
			VCHECK(rc == -EAGAIN, "fanout_poll: %d", rc);
			continue;
		}
		rc = fanout_wait(s, &ev, (int)rnd_in(&r, 1, 20));
		if (rc == 0)
			receive(ep, ev, (int)ta->idx, &r);
		else
			VCHECK(rc == -ETIMEDOUT || rc == -EBUSY,
			       "fanout_wait: %d", rc);
	}
	return NULL;
}

static void *canceller(void *arg)
{
	struct targ *ta = arg;
	struct epoch *ep = ta->ep;
	struct rng r = {mix64(ep->seed ^ 0xca11ull)};
	struct fanout_info infos[16];

	while (!atomic_load_explicit(&ep->stop_cancel, memory_order_relaxed)) {
		unsigned how = rnd_in(&r, 1, 3), p = rnd_below(&r, 100);
		struct tracker *tr = NULL;
		fanout_id id = 0;
		int rc;

		if ((how & FANOUT_CANCEL_INTERRUPT) && rnd_below(&r, 2))
			how |= FANOUT_CANCEL_ABANDON;
		if (p >= 95) { /* every running delegation of one session */
			size_t n = SIZE_MAX;

			rc = fanout_cancel_session(
				ep->e, ep->skey[rnd_below(&r, ep->nsinks)], how,
				&n);
			VCHECK(rc == 0 && n != SIZE_MAX,
			       "fanout_cancel_session: %d", rc);
			add(&c_sessions, 1);
			add(&c_session_n, n);
			sleep_us(rnd_in(&r, 0, 400));
			continue;
		}

		if (p < 3) { /* bad arguments */
			VCHECK(fanout_cancel(ep->e, 0, how) == -EINVAL,
			       "cancel id 0");
			VCHECK(fanout_cancel(ep->e, recent_pick(ep, &r) | 1,
					     0) == -EINVAL,
			       "cancel how 0");
			VCHECK(fanout_cancel(ep->e, 1, 8) == -EINVAL,
			       "cancel how 8");
			continue;
		}
		if (p < 70) {
			id = recent_pick(ep, &r);
		} else {
			size_t n = 0;

			rc = fanout_list(ep->e, infos, 16, &n);
			VCHECK(rc == 0, "fanout_list: %d", rc);
			for (size_t i = 0; i < n && i < 16; i++)
				if (infos[i].status == FANOUT_RUNNING &&
				    rnd_below(&r, 2)) {
					id = infos[i].id;
					/* background trackers live until the
					 * epoch ends (sync ones may be on a
					 * stack that is gone) */
					if (infos[i].background)
						tr = infos[i].user;
					break;
				}
		}
		if (id) {
			rc = fanout_cancel(ep->e, id, how);
			VCHECK(rc == 0 || rc == -EALREADY || rc == -ENOENT,
			       "fanout_cancel: %d", rc);
			if (rc == 0)
				add(&c_cancels_ok, 1);
			if (rc == 0 && tr) {
				VCHECK(tr->magic == TR_MAGIC,
				       "info.user is not the batch's user");
				tr_cancel_ok(tr);
			}
		}
		sleep_us(rnd_in(&r, 0, 400));
	}
	return NULL;
}

static void check_list(struct epoch *ep, struct fanout_info *infos, size_t cap,
		       size_t n)
{
	size_t w = n < cap ? n : cap;

	for (size_t i = 0; i < w; i++) {
		const struct fanout_info *f = &infos[i];

		VCHECK(f->id != 0, "list: id 0");
		VCHECK(f->status == FANOUT_RUNNING ||
			       f->status == FANOUT_COMPLETED ||
			       f->status == FANOUT_ERROR ||
			       f->status == FANOUT_INTERRUPTED,
		       "list: status %d", f->status);
		VCHECK(f->ndone <= f->ntasks && f->ntasks >= 1,
		       "list: ndone %u ntasks %u", f->ndone, f->ntasks);
		VCHECK(f->depth >= 1 && f->depth <= ep->max_depth,
		       "list: depth %u", f->depth);
		if (f->status != FANOUT_RUNNING)
			VCHECK(f->ndone == f->ntasks &&
				       f->completed_ns >= f->dispatched_ns,
			       "list: finished record %u/%u", f->ndone,
			       f->ntasks);
		if (i)
			VCHECK(infos[i - 1].dispatched_ns >= f->dispatched_ns,
			       "list: not sorted newest first");
	}
}

/*
 * A sink that lives for a few delegations: create it, dispatch to it, take
 * every event from it (they must all come, and only there), destroy it
 * (which must then succeed at once).  Other sinks are busy meanwhile.
 */
static void temp_sink(struct epoch *ep, struct rng *r,
		      struct fanout_task *tasks)
{
	struct fanout_sink *ts = NULL;
	unsigned k = rnd_in(r, 1, 4), accepted = 0;
	int rc = fanout_sink_create(ep->e, &ts);

	if (rc == -ESHUTDOWN) {
		VCHECK(atomic_load(&ep->shutting),
		       "sink_create: early -ESHUTDOWN");
		return;
	}
	VCHECK(rc == 0 && ts, "fanout_sink_create: %d", rc);
	if (rc)
		return;
	ep->sinks[TEMP_SINK] = ts;
	for (unsigned j = 0; j < k; j++) {
		struct tracker *tr =
			tr_new(ep, rnd_in(r, 1, 8), 1, TEMP_SINK, r);
		struct fanout_batch b;
		fanout_id id = 0;

		fill_batch(tr, &b, tasks);
		rc = fanout_dispatch(ep->e, &b, &id);
		if (rc == 0) {
			add(&c_delegations, 1);
			add(&c_bg, 1);
			atomic_fetch_add(&ep->bg_accepted, 1);
			tr_accept(tr, id);
			accepted++;
		} else {
			refused(ep, tr, rc, false, "dispatch to a new sink");
		}
	}
	for (unsigned j = 0; j < accepted; j++) {
		struct fanout_event *ev = NULL;

		rc = fanout_wait(ts, &ev, (int)g_live_ms * 4);
		VCHECK(rc == 0, "event %u/%u on a new sink: %d", j, accepted,
		       rc);
		if (rc)
			break;
		receive(ep, ev, TEMP_SINK, r);
	}
	rc = fanout_sink_destroy(ts);
	VCHECK(rc == 0, "destroying a drained sink: %d", rc);
	if (rc == 0)
		add(&c_temp_sinks, 1);
	/* (on failure the engine's destroy frees it) */
}

static void *lister(void *arg)
{
	struct targ *ta = arg;
	struct epoch *ep = ta->ep;
	struct rng r = {mix64(ep->seed ^ 0x115ull)};
	struct fanout_info infos[64];
	struct fanout_task tasks[8];

	while (!atomic_load_explicit(&ep->stop_list, memory_order_relaxed)) {
		unsigned p = rnd_below(&r, 100);
		size_t n = 0, cap = rnd_below(&r, 65);
		struct fanout_info info;
		struct fanout_stats st;
		fanout_id id;
		int rc;

		if (p < 40) {
			rc = fanout_list(ep->e, cap ? infos : NULL, cap, &n);
			VCHECK(rc == 0, "fanout_list: %d", rc);
			if (rc == 0)
				check_list(ep, infos, cap, n);
			add(&c_lists, 1);
		} else if (p < 80) {
			id = recent_pick(ep, &r);
			if (!id)
				continue;
			rc = fanout_lookup(ep->e, id, &info);
			VCHECK(rc == 0 || rc == -ENOENT, "fanout_lookup: %d",
			       rc);
			if (rc == 0)
				VCHECK(info.id == id &&
					       info.ndone <= info.ntasks,
				       "lookup: wrong record");
			add(&c_lookups, 1);
			rc = fanout_lookup(ep->e, rnd(&r) | 1, &info);
			VCHECK(rc == -ENOENT || rc == 0,
			       "lookup of junk id: %d", rc);
		} else if (p < 82) {
			temp_sink(ep, &r, tasks);
		} else if (p < 90) {
			/* (a relaxed snapshot: the counters agree only once
			 * the engine is quiet, checked at the end of the epoch) */
			rc = fanout_stats(ep->e, &st);
			VCHECK(rc == 0 && st.nworkers == ep->cfg.workers,
			       "fanout_stats: %d", rc);
		} else {
			/* a second consumer on a sink that already has one */
			unsigned si = rnd_below(&r, ep->nsinks);
			struct fanout_event *ev = NULL;

			if (si ==
			    1) /* the fd consumer's check needs it alone */
				continue;
			rc = fanout_poll(ep->sinks[si], &ev);
			VCHECK(rc == 0 || rc == -EAGAIN || rc == -EBUSY,
			       "intruding fanout_poll: %d", rc);
			if (rc == 0)
				receive(ep, ev, (int)si, &r);
			add(&c_intrusions, 1);
		}
		sleep_us(rnd_in(&r, 0, 300));
	}
	return NULL;
}

/* ------------------------------------------------------------ completers */

/* fanout_complete one pending child with its planned outcome. */
static void complete_one(struct epoch *ep, struct pend_item *it)
{
	struct kid *k = &it->tr->kids[it->i];
	struct fanout_outcome o = {.code = k->pend_code};
	int rc;

	if (g_selftest == 4 && !atomic_exchange(&g_selftest_done, 1)) {
		free(it); /* "forget" one completion: the ledger must see it */
		return;
	}
	atomic_max_u64(&it->tr->last_end, now_ns());
	if (atomic_fetch_add(&k->pend_calls, 1) != 0)
		violation("child %u of %s completed twice by the harness",
			  it->i, it->tr->ctx);
	rc = fanout_complete(it->p, &o);
	atomic_store(&k->pend_rc, rc);
	if (rc == 0)
		add(&c_pend_ok, 1);
	else if (rc == -EALREADY)
		add(atomic_load(&ep->shutting) ? &c_pend_already : &c_pend_race,
		    1);
	else
		violation("fanout_complete: %d", rc);
	if (atomic_load(&ep->destroyed))
		add(&c_pend_after_destroy, 1);
	free(it);
}

/* Completes pending children when they are due (0-3 ms after deferring),
 * or at once when their on_cancel callback ran; stops (leaving the rest)
 * when told to. */
static void *completer(void *arg)
{
	struct targ *ta = arg;
	struct epoch *ep = ta->ep;
	struct rng r = {mix64(ep->seed ^ (0xc03ull + ta->idx))};

	while (!atomic_load(&ep->stop_complete)) {
		uint64_t t = now_ns();
		struct pend_item **pp, *it = NULL;

		pthread_mutex_lock(&ep->pq_lock);
		for (pp = &ep->pq; *pp; pp = &(*pp)->next) {
			struct pend_item *x = *pp;

			if (x->due <= t ||
			    atomic_load(&x->tr->kids[x->i].hurry)) {
				*pp = x->next;
				it = x;
				break;
			}
		}
		pthread_mutex_unlock(&ep->pq_lock);
		if (it)
			complete_one(ep, it);
		else
			sleep_us(rnd_in(&r, 20, 200));
	}
	return NULL;
}

/*
 * The ledger of the deferred children, once every one was completed: each
 * got exactly one fanout_complete, which returned 0 or -EALREADY; 0 iff
 * the event shows the completer's outcome, -EALREADY iff the library
 * finished it (interrupted, and the event says why).
 */
static void check_pending_ledger(struct epoch *ep)
{
	for (struct tracker *tr = atomic_load(&ep->all); tr; tr = tr->next) {
		int fl = atomic_load(&tr->ev_flags);

		if (!tr->v2 || !tr->kids)
			continue;
		for (unsigned i = 0; i < tr->n; i++) {
			struct kid *k = &tr->kids[i];
			int rc = atomic_load(&k->pend_rc);

			if (!k->deferred)
				continue;
			VCHECK(atomic_load(&k->pend_calls) == 1,
			       "deferred child %u of %s: %d completions", i,
			       tr->ctx, atomic_load(&k->pend_calls));
			VCHECK(atomic_load(&k->cb_runs) <= 1,
			       "callback ran %d times",
			       atomic_load(&k->cb_runs));
			/* registered (0), then abandoned by the library: the
			 * abandon is an interrupt, so the callback ran */
			VCHECK(!(atomic_load(&k->reg_rc) == 0 &&
				 rc == -EALREADY &&
				 atomic_load(&k->pend_calls) == 1) ||
				       atomic_load(&k->cb_runs) == 1,
			       "on_cancel returned 0 and the child was "
			       "abandoned, but its callback never ran");
			if (atomic_load(&k->pend_calls) != 1 ||
			    !atomic_load(&k->ev_seen))
				continue; /* (or event left to fanout_destroy) */
			if (rc == 0)
				VCHECK((k->ev_code == k->pend_code &&
					k->ev_status ==
						(int)status_of(k->pend_code)) ||
					       ((fl & EVF_TIMED_OUT) &&
						k->ev_code == -ETIMEDOUT),
				       "fanout_complete(%d) returned 0, the "
				       "event says code %d status %d",
				       k->pend_code, k->ev_code, k->ev_status);
			else if (rc == -EALREADY)
				VCHECK(k->ev_status == FANOUT_INTERRUPTED &&
					       (k->ev_code == -ECANCELED ||
						k->ev_code == -ETIMEDOUT) &&
					       fl,
				       "fanout_complete returned -EALREADY, "
				       "the event says code %d status %d "
				       "flags %d",
				       k->ev_code, k->ev_status, fl);
		}
	}
}

/* ------------------------------------------------------------- watchdog */

static _Atomic uint64_t wd_deadline; /* ns; 0 = off */
static const char *_Atomic wd_what;
static atomic_int wd_stop;

static void wd_arm(const char *what, uint64_t ms)
{
	atomic_store(&wd_what, what);
	atomic_store(&wd_deadline, now_ns() + ms * 1000000ull);
}

static void print_counters(FILE *f);

/*
 * Heartbeat: sleeps 1 ms at a time and notes when it was kept off the CPU
 * for more than a quarter of the liveness bound.  This machine is shared:
 * an event late only because the whole process was starved is counted as
 * "excused" (and printed), not as a violation.
 */
static void *heartbeat(void *arg)
{
	uint64_t last = now_ns();

	(void)arg;
	while (!atomic_load(&wd_stop)) {
		uint64_t t;

		sleep_us(1000);
		t = now_ns();
		atomic_max_u64(&hb_max_gap_ns, t - last);
		if (t - last > (uint64_t)g_live_ms * 250000ull)
			atomic_store(&hb_stall_ns, t);
		last = t;
	}
	return NULL;
}

static void *watchdog(void *arg)
{
	(void)arg;
	while (!atomic_load(&wd_stop)) {
		uint64_t d = atomic_load(&wd_deadline);

		if (d && now_ns() > d) {
			fprintf(stderr,
				"torture: HANG: %s took too long (seed %" PRIu64
				", epoch %u)\n",
				atomic_load(&wd_what), g_seed,
				atomic_load(&g_epoch));
			print_counters(stderr);
			fflush(NULL);
			_exit(3);
		}
		sleep_us(100000);
	}
	return NULL;
}

/* ---------------------------------------------------------------- epoch */

static void random_config(struct rng *r, struct fanout_config *c)
{
	static const unsigned asyncs[] = {1, 2, 4, 8, 32, 128, 0};
	static const unsigned kids[] = {1, 2, 0, 0};
	static const unsigned keeps[] = {1, 3, 16, 256, 0};
	static const uint64_t spins[] = {1, 1000, 20000, 0};

	memset(c, 0, sizeof(*c));
	c->workers = rnd_in(r, 1, 2);
	c->flags = rnd_below(r, 2) ? FANOUT_NO_PIN : 0;
	if (rnd_below(r, 2)) /* consumers in fanout_wait run queued work */
		c->flags |= FANOUT_WAIT_HELPS;
	if (rnd_below(r, 2)) /* one runner first, the others when slow */
		c->flags |= FANOUT_RUNNERS_ON_DEMAND;
	c->max_async = asyncs[rnd_below(r, 7)];
	c->max_children = kids[rnd_below(r, 4)];
	c->max_tasks = rnd_below(r, 4) ? 0 : rnd_below(r, 2) ? 4096 : 2000;
	c->max_depth = rnd_in(r, 1, 3);
	c->keep_completed = keeps[rnd_below(r, 5)];
	c->spin_ns = spins[rnd_below(r, 4)];
	c->queue_slots = rnd_below(r, 5) ? 0 : rnd_in(r, 1, 16);
}

static void free_trackers(struct epoch *ep)
{
	struct tracker *tr = atomic_load(&ep->all), *next;

	for (; tr; tr = next) {
		next = tr->next;
		free(tr->kids);
		free(tr);
	}
	atomic_store(&ep->all, NULL);
}

static void run_epoch(unsigned idx, uint64_t ms)
{
	struct epoch *ep = calloc(1, sizeof(*ep));
	struct rng r = {mix64(g_seed + 0x1000ull * idx)};
	struct targ disp[NDISPATCH], cons[MAX_SINKS], canc, list, compl [2];
	struct fanout_config fc = {
		.workers = 1, .flags = FANOUT_NO_PIN, .spin_ns = 1};
	struct fanout_stats st0, st1;
	struct fanout_event *ev;
	uint64_t t0, dt, lost = 0;
	bool drain_all;
	int rc;

	ep->idx = idx;
	ep->seed = rnd(&r);
	atomic_store(&g_epoch, idx);
	random_config(&r, &ep->cfg);
	ep->max_tasks = ep->cfg.max_tasks ? ep->cfg.max_tasks : 65536;
	ep->max_depth = ep->cfg.max_depth ? ep->cfg.max_depth : 2;
	drain_all = rnd_below(&r, 10) != 0 || g_selftest;
	rc = fanout_create(&ep->cfg, &ep->e);
	VCHECK(rc == 0, "fanout_create: %d", rc);
	rc = fanout_create(&fc, &ep->foreign);
	VCHECK(rc == 0, "fanout_create (foreign): %d", rc);
	if (!ep->e || !ep->foreign) {
		fprintf(stderr, "torture: cannot create engines\n");
		exit(1);
	}
	ep->nsinks = rnd_in(&r, 2, MAX_SINKS);
	ep->sinks[0] = fanout_default_sink(ep->e);
	for (unsigned i = 1; i < ep->nsinks; i++) {
		rc = fanout_sink_create(ep->e, &ep->sinks[i]);
		VCHECK(rc == 0, "fanout_sink_create: %d", rc);
		if (rc) {
			fprintf(stderr, "torture: cannot create sinks\n");
			exit(1);
		}
	}
	for (unsigned i = 0; i <= MAX_SINKS; i++)
		snprintf(ep->skey[i], sizeof(ep->skey[i]), "sink-%u", i);
	if (g_verbose)
		fprintf(stderr,
			"epoch %u: %llu ms workers=%u pin=%d max_async=%u "
			"max_children=%u max_tasks=%u max_depth=%u keep=%u "
			"spin=%llu slots=%u sinks=%u help=%d on_demand=%d%s\n",
			idx, (unsigned long long)ms, ep->cfg.workers,
			!(ep->cfg.flags & FANOUT_NO_PIN), ep->cfg.max_async,
			ep->cfg.max_children, ep->cfg.max_tasks,
			ep->cfg.max_depth, ep->cfg.keep_completed,
			(unsigned long long)ep->cfg.spin_ns,
			ep->cfg.queue_slots, ep->nsinks,
			!!(ep->cfg.flags & FANOUT_WAIT_HELPS),
			!!(ep->cfg.flags & FANOUT_RUNNERS_ON_DEMAND),
			drain_all ? "" : " (undrained destroy)");

	wd_arm("epoch run", ms + 60000);
	for (unsigned i = 0; i < ep->nsinks; i++) {
		cons[i] = (struct targ){ep, i, 0};
		pthread_create(&cons[i].t, NULL, consumer, &cons[i]);
	}
	pthread_mutex_init(&ep->pq_lock, NULL);
	for (unsigned i = 0; i < 2; i++) {
		compl [i] = (struct targ){ep, i, 0};
		pthread_create(&compl [i].t, NULL, completer, &compl [i]);
	}
	canc = (struct targ){ep, 0, 0};
	list = (struct targ){ep, 0, 0};
	pthread_create(&canc.t, NULL, canceller, &canc);
	pthread_create(&list.t, NULL, lister, &list);
	for (unsigned i = 0; i < NDISPATCH; i++) {
		disp[i] = (struct targ){ep, i, 0};
		pthread_create(&disp[i].t, NULL, dispatcher, &disp[i]);
	}

	sleep_us((unsigned)(ms * 1000));

	/* Shut down mid-flight: dispatchers, consumers and the lister keep
	 * going; only the canceller stops, so that children skipped from now
	 * on were skipped by the shutdown. */
	atomic_store(&ep->shutting, 1);
	atomic_store(&ep->stop_cancel, 1);
	pthread_join(canc.t, NULL);
	if (!drain_all) {
		/* this engine will be destroyed with its events undrained:
		 * stop consuming now so that the sinks fill up */
		atomic_store(&ep->stop_consume, 1);
		for (unsigned i = 0; i < ep->nsinks; i++)
			pthread_join(cons[i].t, NULL);
	}
	fanout_stats(ep->e, &st0);
	wd_arm("fanout_shutdown", (uint64_t)g_shut_ms * 3);
	t0 = now_ns();
	rc = fanout_shutdown(ep->e);
	dt = now_ns() - t0;
	atomic_store(&ep->shut_returned, 1);
	VCHECK(rc == 0, "fanout_shutdown: %d", rc);
	atomic_max_u64(&c_max_shut_ns, dt);
	VCHECK(dt <= (uint64_t)g_shut_ms * 1000000ull,
	       "fanout_shutdown took %.1f ms (bound %u ms)", dt / 1e6,
	       g_shut_ms);
	fanout_stats(ep->e, &st1);
	if (st1.children_skipped > st0.children_skipped)
		add(&c_shut_queued, 1);

	wd_arm("joining threads", 60000);
	atomic_store(&ep->stop_dispatch, 1);
	for (unsigned i = 0; i < NDISPATCH; i++)
		pthread_join(disp[i].t, NULL);
	if (drain_all) {
		atomic_store(&ep->stop_consume, 1);
		for (unsigned i = 0; i < ep->nsinks; i++)
			pthread_join(cons[i].t, NULL);
	}
	atomic_store(&ep->stop_list, 1);
	pthread_join(list.t, NULL);

	/* Every accepted delegation published before fanout_shutdown
	 * returned: what the consumers did not take is in the sinks now. */
	for (unsigned i = 0; i < ep->nsinks; i++) {
		unsigned left = drain_all ? UINT32_MAX : rnd_below(&r, 4);

		while (left-- && (rc = fanout_poll(ep->sinks[i], &ev)) == 0)
			receive(ep, ev, (int)i, &r);
		if (drain_all)
			VCHECK(rc == -EAGAIN, "draining sink %u: %d", i, rc);
	}
	if (drain_all) {
		for (struct tracker *tr = atomic_load(&ep->all); tr;
		     tr = tr->next) {
			int s = atomic_load(&tr->state),
			    got = atomic_load(&tr->got);

			if (s == TR_ACCEPTED && tr->sink_idx >= 0 && got != 1) {
				if (lost++ < 10)
					violation(
						"LOST event of " FANOUT_ID_FMT
						" (%u tasks, sink %d, ctx %s)",
						(unsigned long long)atomic_load(
							&tr->id),
						tr->n, tr->sink_idx, tr->ctx);
			}
			if (s == TR_INFLIGHT)
				violation("tracker still in flight after join");
		}
		VCHECK(lost == 0, "%" PRIu64 " events lost", lost);
		VCHECK(atomic_load(&ep->bg_received) ==
			       atomic_load(&ep->bg_accepted),
		       "received %" PRIu64 " events, accepted %" PRIu64,
		       atomic_load(&ep->bg_received),
		       atomic_load(&ep->bg_accepted));
	} else {
		add(&c_undrained, 1);
		add(&c_left_to_destroy, atomic_load(&ep->bg_accepted) -
						atomic_load(&ep->bg_received));
	}

	/* Counters of a quiescent engine are exact. */
	fanout_stats(ep->e, &st1);
	VCHECK(st1.dispatched == atomic_load(&ep->bg_accepted),
	       "stats.dispatched %" PRIu64 ", accepted %" PRIu64,
	       st1.dispatched, atomic_load(&ep->bg_accepted));
	VCHECK(st1.completed == st1.dispatched + st1.runs,
	       "stats.completed %" PRIu64 " != dispatched %" PRIu64
	       " + runs %" PRIu64,
	       st1.completed, st1.dispatched, st1.runs);
	VCHECK(st1.running == 0 && st1.async_running == 0,
	       "stats after shutdown: running %u async_running %u", st1.running,
	       st1.async_running);
	/* (an -EBUSY that fanout_delegate answered inline, INLINE_FULL, is a
	 * run, not a rejection: 49479e8) */
	VCHECK(st1.rejected >= atomic_load(&ep->refused) &&
		       st1.rejected <= atomic_load(&ep->refused) +
					       atomic_load(&ep->deleg_errors),
	       "stats.rejected %" PRIu64 ", observed %" PRIu64, st1.rejected,
	       atomic_load(&ep->refused));

	/* A shut-down engine refuses new work and new sinks. */
	{
		struct fanout_task t = {"late", tchild, NULL};
		struct fanout_batch b = {.tasks = &t, .ntasks = 1};
		struct fanout_sink *s = NULL;

		VCHECK(fanout_dispatch(ep->e, &b, NULL) == -ESHUTDOWN,
		       "dispatch after shutdown");
		VCHECK(fanout_run(ep->e, &b, &ev) == -ESHUTDOWN,
		       "run after shutdown");
		VCHECK(fanout_sink_create(ep->e, &s) == -ESHUTDOWN,
		       "sink_create after shutdown");
		VCHECK(fanout_shutdown(ep->e) == 0, "second shutdown");
		VCHECK(fanout_poll(fanout_default_sink(ep->foreign), &ev) ==
			       -EAGAIN,
		       "event on the foreign engine's sink");
	}
	wd_arm("destroy", 60000);
	for (unsigned i = 1; i < ep->nsinks; i++)
		if (rnd_below(&r, 2)) {
			rc = fanout_sink_destroy(ep->sinks[i]);
			VCHECK(rc == 0,
			       "fanout_sink_destroy after shutdown: %d", rc);
		}
	/* The completers stop before fanout_destroy (which must not race
	 * calls on the engine); what they left is completed after it, which
	 * a pending child allows. */
	atomic_store(&ep->stop_complete, 1);
	for (unsigned i = 0; i < 2; i++)
		pthread_join(compl [i].t, NULL);
	fanout_destroy(ep->e);
	fanout_destroy(ep->foreign);
	atomic_store(&ep->destroyed, 1);
	while (ep->pq) {
		struct pend_item *it = ep->pq;

		ep->pq = it->next;
		complete_one(ep, it);
	}
	check_pending_ledger(ep);
	pthread_mutex_destroy(&ep->pq_lock);
	atomic_store(&wd_deadline, 0);
	free_trackers(ep);
	if (g_verbose)
		fprintf(stderr,
			"epoch %u done: %" PRIu64 " background accepted, "
			"shutdown %.1f ms, %" PRIu64 " delegations so far\n",
			idx, atomic_load(&ep->bg_accepted), dt / 1e6,
			atomic_load(&c_delegations));
	free(ep);
	add(&c_epochs, 1);
}

/* ----------------------------------------------------------------- main */

static void print_counters(FILE *f)
{
	fprintf(f,
		"delegations %" PRIu64 " (background %" PRIu64 ", sync %" PRIu64
		", nested sync %" PRIu64 ", nested background %" PRIu64 ")\n"
		"children %" PRIu64 " run, %" PRIu64 " skipped by cancels\n"
		"events %" PRIu64 " received and checked (completed %" PRIu64
		", error %" PRIu64 ", interrupted %" PRIu64
		", cancelled %" PRIu64 ")\n"
		"rejections %" PRIu64 " (-EBUSY %" PRIu64
		", delegate inline-full %" PRIu64 ", -ESHUTDOWN %" PRIu64
		", -ELOOP %" PRIu64 ", deliberate bad calls %" PRIu64 ")\n"
		"cancels accepted %" PRIu64 "; lookups %" PRIu64
		", lists %" PRIu64 ", intruding polls %" PRIu64
		", short-lived sinks %" PRIu64 "\n"
		"hard cases: cancel raced a running child %" PRIu64
		" (+%" PRIu64
		" pending-cancel splits), shutdown found queued work %" PRIu64
		", nested join helped by its caller %" PRIu64 "\n"
		"v0.2: %" PRIu64 " delegations with deferred children/deadline/"
		"policy; deferred %" PRIu64 ", completed 0 %" PRIu64
		", -EALREADY %" PRIu64 " before the shutdown + %" PRIu64
		" after it (%" PRIu64 " after destroy); on_cancel "
		"%" PRIu64 ", callbacks %" PRIu64 "; timed out %" PRIu64
		", policy %" PRIu64 "; runs on the 2nd engine %" PRIu64
		" (all interrupted %" PRIu64 ", by the outer deadline %" PRIu64
		"); session cancels %" PRIu64 " (%" PRIu64 " delegations)\n"
		"epochs %" PRIu64 " (%" PRIu64
		" destroyed undrained, leaving %" PRIu64
		" events to fanout_destroy); max event "
		"latency %.1f ms, max shutdown %.1f ms; late events excused by "
		"a starved process %" PRIu64 " (max heartbeat gap %.1f ms)\n",
		c_delegations, c_bg, c_sync, c_nested_sync, c_nested_bg,
		c_children, c_skipped, c_events, c_st[FANOUT_COMPLETED],
		c_st[FANOUT_ERROR], c_st[FANOUT_INTERRUPTED], c_cancelled_ev,
		c_rejected, c_ebusy, c_inline_full, c_eshutdown, c_eloop,
		c_bad_calls, c_cancels_ok, c_lookups, c_lists, c_intrusions,
		c_temp_sinks, c_race_running, c_race_pending, c_shut_queued,
		c_helped, c_v2, c_deferred, c_pend_ok, c_pend_race,
		c_pend_already, c_pend_after_destroy, c_cb_regs, c_cb_runs,
		c_timed_out, c_policy, c_tree_runs, c_tree_intr,
		c_tree_deadline, c_sessions, c_session_n, c_epochs, c_undrained,
		c_left_to_destroy, c_max_lat_ns / 1e6, c_max_shut_ns / 1e6,
		c_excused, hb_max_gap_ns / 1e6);
}

static void usage(void)
{
	fprintf(stderr,
		"usage: torture [-s SEED] [-t SECONDS] [-l LIVENESS_MS] "
		"[-S SHUTDOWN_MS] [-v] [-x SELFTEST]\n");
	exit(2);
}

int main(int argc, char **argv)
{
	bool have_seed = false;
	pthread_t wd, hb;
	uint64_t start, end, last_report;
	unsigned idx = 0;
	int opt;

	while ((opt = getopt(argc, argv, "s:t:l:S:vx:")) != -1) {
		switch (opt) {
		case 's':
			g_seed = strtoull(optarg, NULL, 0);
			have_seed = true;
			break;
		case 't':
			g_seconds = (unsigned)strtoul(optarg, NULL, 0);
			break;
		case 'l':
			g_live_ms = (unsigned)strtoul(optarg, NULL, 0);
			break;
		case 'S':
			g_shut_ms = (unsigned)strtoul(optarg, NULL, 0);
			break;
		case 'v':
			g_verbose++;
			break;
		case 'x':
			g_selftest = atoi(optarg);
			break;
		default:
			usage();
		}
	}
	if (!have_seed)
		g_seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
	printf("torture: seed %" PRIu64 " seconds %u liveness %u ms shutdown "
	       "bound %u ms%s\n(replay: torture -s %" PRIu64 " -t %u)\n",
	       g_seed, g_seconds, g_live_ms, g_shut_ms,
	       SANITIZED ? " (sanitizer build)" : "", g_seed, g_seconds);
	fflush(stdout);
	for (unsigned i = 0; i < MAX_BATCH; i++)
		snprintf(goal_tbl[i], sizeof(goal_tbl[i]), "g%u", i);
	pthread_create(&wd, NULL, watchdog, NULL);
	pthread_create(&hb, NULL, heartbeat, NULL);

	struct rng r = {g_seed};

	start = now_ns();
	end = start + (uint64_t)g_seconds * 1000000000ull;
	last_report = start;
	while (now_ns() < end) {
		uint64_t left = (end - now_ns()) / 1000000ull;
		uint64_t ms = rnd_in(&r, 100, 2500);

		if (ms > left)
			ms = left > 50 ? left : 50;
		run_epoch(idx++, ms);
		if (now_ns() - last_report > 30000000000ull) {
			double s = (now_ns() - start) / 1e9;

			last_report = now_ns();
			printf("torture: %.0f s: %" PRIu64
			       " delegations (%.0f/s), "
			       "%" PRIu64 " events, %d violations\n",
			       s, atomic_load(&c_delegations),
			       atomic_load(&c_delegations) / s,
			       atomic_load(&c_events),
			       atomic_load(&c_violations));
			fflush(stdout);
		}
	}
	atomic_store(&wd_stop, 1);
	pthread_join(wd, NULL);
	pthread_join(hb, NULL);

	double secs = (now_ns() - start) / 1e9;
	int bad = atomic_load(&c_violations);

	print_counters(stdout);
	printf("rate: %.0f delegations/s, %.0f children/s over %.1f s\n",
	       c_delegations / secs, c_children / secs, secs);
	/* non-vacuity */
	if (!c_race_running) {
		printf("NOT HIT: a cancel racing a running child\n");
		bad++;
	}
	if (!c_ebusy) {
		printf("NOT HIT: a capacity rejection (-EBUSY)\n");
		bad++;
	}
	if (!c_shut_queued) {
		printf("NOT HIT: a shutdown with work still queued\n");
		bad++;
	}
	if (!c_helped) {
		printf("NOT HIT: a nested join helped by its caller\n");
		bad++;
	}
	if (!c_pend_race) {
		printf("NOT HIT: an abandon racing a completion "
		       "(fanout_complete returned -EALREADY)\n");
		bad++;
	}
	if (!c_tree_deadline) {
		printf("NOT HIT: a deadline interrupting a nested run on "
		       "another engine (cancel tree)\n");
		bad++;
	}
	if (!c_policy) {
		printf("NOT HIT: a join policy interrupt\n");
		bad++;
	}
	if (c_events == 0)
		bad++;
	printf("torture: %s (seed %" PRIu64 ", %d violations)\n",
	       bad ? "FAILED" : "passed", g_seed, atomic_load(&c_violations));
	return bad ? 1 : 0;
}
