/* SPDX-License-Identifier: MIT */
/*
 * engine.c - create, shutdown, destroy, stats.
 *
 * WHY IT IS CORRECT
 *
 * Create builds everything before starting anything that could observe it
 * (the table, the sinks, the default sink, then the workers last), and
 * unwinds in reverse on any failure, so a failed create leaves nothing.
 *
 * Shutdown is the other half of the "Shutdown" argument in deleg.c: store
 * `shutting`; full fence; interrupt every record in the table; sleep on the
 * `drained` eventcount until `active` is 0.  Each finaliser drops its unit
 * of `active` after publishing and signals `drained` when it takes it to 0
 * while `shutting` is set (store-load pair: either the finaliser sees
 * `shutting` and signals, or shutdown's re-check after fq_ec_prepare sees
 * active == 0).  Only then are the workers stopped: fq_stop drains the
 * ring, whose leftover tokens find every child claimed and just drop their
 * references.  A child cannot call shutdown of its own engine, nor of an
 * engine whose child waits (through nested fanout_run calls) for it: it
 * would wait for itself (-EDEADLK; see waits_for_caller()).
 *
 * Destroy runs after shutdown, so the engine is quiescent: it frees queued
 * events and sinks, evicts the remaining records, waits for every pending
 * call_rcu callback (rcu_barrier) and only then frees the queue and itself.
 * An engine inherited across fork() is never shut down (its workers are
 * not in this process): destroy frees the child's copy instead (fork.c).
 *
 * Per-thread counters.  The counts a calling thread makes on every call
 * (background delegations accepted, runs, children it ran itself) go to a
 * block of its own, so that the call makes no locked instruction for them
 * (each one cost a batch-1 fanout_run ~4% here; bench/PROFILE.txt phase
 * 17).  A thread finds its block through a one-entry TLS cache keyed by the
 * engine's serial (never reused, so a destroyed engine's block is never
 * found), else in the engine's list by pthread_self() (an exited thread's
 * block may pass to a new thread with the same id: still one writer at a
 * time), else allocates one and pushes it (release CAS; the walk's acquire
 * load pairs with it).  Blocks live until fanout_destroy().  A thread that
 * cannot allocate one counts in st_shared with an atomic add.
 * fanout_stats() sums the shared counts and every block, after its acquire
 * load of finish_seq: a completion it counts follows, through the
 * finaliser's release RMW, the count of its start by whichever thread made
 * it, whose relaxed store is then visible (write-read coherence).
 */
#include "internal.h"

#include <errno.h>
#include <string.h>
#include <unistd.h>

#define MAX_WORKERS 1024u
#define MAX_TASKS (1u << 24)
#define MAX_DEPTH 64u
#define MAX_SPIN_NS 1000000000ull
#define MAX_SLOTS (1u << 24)
#define MAX_ASYNC (1u << 20)
/* Half the record table (2^24 slots, table.c): a kept record holds its
 * slot until keep_completed newer ones are freed, so 2^24 of them would
 * fill the table before the first is pruned, and every dispatch after
 * would fail for want of a slot, for good.  The other half is for live
 * records. */
#define MAX_KEEP (1u << 23)
#define MAX_PENDING (1u << 24)
/* Default max_pending: 4096, and never under 4 x max_async (see fanout.h). */
#define PENDING_DEFAULT 4096u
#define PENDING_PER_ASYNC 4u

static unsigned cpu_count(void)
{
	unsigned c = fq_cpu_count();
	long n;

	if (c)
		return c;
	n = sysconf(_SC_NPROCESSORS_ONLN);
	return n > 0 ? (unsigned)n : 1;
}

static unsigned pow2_at_least(unsigned long long v)
{
	unsigned p = 4;

	while (p < v && p < MAX_SLOTS)
		p <<= 1;
	return p;
}

static int resolve(const struct fanout_config *in, struct fanout_config *c)
{
	struct fanout_config z = {0};

	*c = in ? *in : z;
	if ((c->flags & ~(FANOUT_NO_PIN | FANOUT_WAIT_HELPS |
			  FANOUT_NO_CHILD_CLOCK | FANOUT_RUNNERS_ON_DEMAND)) ||
	    c->workers > MAX_WORKERS || c->max_tasks > MAX_TASKS ||
	    c->max_depth > MAX_DEPTH || c->spin_ns > MAX_SPIN_NS ||
	    c->queue_slots > MAX_SLOTS || c->max_async > MAX_ASYNC ||
	    c->keep_completed > MAX_KEEP || c->max_children > MAX_TASKS ||
	    c->max_pending > MAX_PENDING)
		return -EINVAL;
	if (!c->workers)
		c->workers = cpu_count();
	if (!c->max_async)
		c->max_async = 256;
	if (!c->max_children)
		c->max_children = 64;
	if (!c->max_tasks)
		c->max_tasks = 65536;
	if (!c->max_depth)
		c->max_depth = 2;
	if (!c->keep_completed)
		c->keep_completed = 1024;
	if (!c->spin_ns)
		c->spin_ns = 50000;
	if (!c->max_pending)
		c->max_pending =
			c->max_async * PENDING_PER_ASYNC > PENDING_DEFAULT ?
				c->max_async * PENDING_PER_ASYNC :
				PENDING_DEFAULT;
	return 0;
}

int fanout_create(const struct fanout_config *cfg, struct fanout_engine **out)
{
	struct fanout_engine *e;
	struct fq_params qp;
	unsigned i;
	int err;

	if (!out)
		return -EINVAL;
	e = fanout__alloc(sizeof(*e));
	if (!e)
		return -ENOMEM;
	memset(e, 0, sizeof(*e));
	err = resolve(cfg, &e->cfg);
	if (err)
		goto out_free;
	/* After the first allocation: see "When" in fork.c. */
	err = fanout__fork_init();
	if (!err)
		err = fanout__engines_init();
	if (err)
		goto out_free;
	/* liburcu starts its call_rcu thread on the first call_rcu(), and a
	 * new thread inherits its creator's name: start it here, from the
	 * application's thread, rather than let the first record freed on a
	 * worker name it "fanout-w<n>" for the life of the process. */
	(void)get_default_call_rcu_data();
	/* relaxed: this process's own value; see fork.c. */
	e->fork_gen =
		atomic_load_explicit(&fanout__fork_gen, memory_order_relaxed);
	e->max_tokens = e->cfg.workers < e->cfg.max_children ?
				e->cfg.workers :
				e->cfg.max_children;
	/* Default ring: every allowed background delegation can hold all of
	 * its tokens at once, so only max_async ever refuses a dispatch. */
	qp.slots = e->cfg.queue_slots ?
			   pow2_at_least(e->cfg.queue_slots) :
			   pow2_at_least((unsigned long long)e->cfg.max_async *
						 e->max_tokens +
					 2ull * e->cfg.workers + 1);
	e->cfg.queue_slots = qp.slots;
	qp.workers = e->cfg.workers;
	qp.pin = !(e->cfg.flags & FANOUT_NO_PIN);
	qp.spin_ns = e->cfg.spin_ns;
	atomic_init(&e->async_started, 0);
	atomic_init(&e->async_limit, e->cfg.max_async);
	atomic_init(&e->async_done, 0);
	atomic_init(&e->active_in, 0);
	atomic_init(&e->active_out, 0);
	atomic_init(&e->finish_seq, 0);
	atomic_init(&e->shutting, 0);
	atomic_init(&e->shut_done, 0);
	fq_ec_init(&e->drained);
	fanout__blocks_init(&e->blocks);
	e->st_worker_children =
		fanout__alloc(sizeof(*e->st_worker_children) * e->cfg.workers);
	if (!e->st_worker_children) {
		err = -ENOMEM;
		goto out_free;
	}
	for (i = 0; i < e->cfg.workers; i++)
		atomic_init(&e->st_worker_children[i], 0);
	err = fanout__table_init(e);
	if (err)
		goto out_free_stats;
	err = fanout__sinks_init(e);
	if (err)
		goto out_table;
	err = fanout__sink_new(e, true, &e->default_sink);
	if (err)
		goto out_sinks;
	err = fq_create(&qp, &e->q);
	if (err)
		goto out_sinks;
	atomic_init(&e->timer_state, 0);
	fanout__engines_add(e);
	*out = e;
	return 0;

out_sinks:
	fanout__sinks_destroy(e);
out_table:
	fanout__table_destroy(e);
	rcu_barrier();
out_free_stats:
	fanout__free(e->st_worker_children,
		     sizeof(*e->st_worker_children) * e->cfg.workers);
out_free:
	fanout__free(e, sizeof(*e));
	return err;
}

/*
 * Would fanout_shutdown(e) on this thread wait for itself?  It would on one
 * of e's workers, and whenever a record of e cannot finish before the
 * calling child returns: the child's own record, then, going up, the
 * parent of each synchronous record on the way - a parent child sits in
 * fanout_run() (or an inline fanout_delegate()) until the record below it
 * has finished, whether that record's children run on this thread or on
 * another engine's worker while the parent waits on its own thread.  A
 * background record ends the walk: its parent child does not wait for it
 * (unless it waits for the event on a sink, which the library cannot see;
 * fanout.h says so).
 *
 * Every record on the walk is alive: the calling child's record is held
 * by its runner, and the parent child of a synchronous record is blocked
 * until that record has finished, so the parent record is still running.
 * The fields read are I: written before the record's children could
 * start, which happens-before this thread runs the child below.  No lock
 * and no atomic; one step per nesting level, paid by shutdown/destroy only.
 */
static bool waits_for_caller(struct fanout_engine *e)
{
	struct fanout_child *c = fanout__current();
	struct record *rec;

	if (fq_self(e->q) >= 0)
		return true;
	for (rec = c ? c->rec : NULL; rec; rec = rec->parent) {
		if (rec->e == e)
			return true;
		if (rec->background)
			break;
	}
	return false;
}

/* Sleep on `drained` until *word reaches want.  The first caller sleeps
 * on the same eventcount for the drain, so its signallers wake every
 * sleeper (record.c, put_signal): a wake-up taken by us is not lost to it. */
static void wait_word(struct fanout_engine *e, _Atomic uint32_t *word,
		      uint32_t want)
{
	for (;;) {
		uint32_t v = fq_ec_prepare(&e->drained);

		/* seq_cst: after the seq_cst announcement in fq_ec_prepare;
		 * pairs with the release store of shut_done. */
		if (atomic_load_explicit(word, memory_order_seq_cst) == want) {
			fq_ec_done(&e->drained);
			return;
		}
		fq_ec_wait(&e->drained, v, 0);
		fq_ec_done(&e->drained);
	}
}

/* Sleep on `drained` until nothing is in flight (record.c, "active"). */
static void wait_drained(struct fanout_engine *e)
{
	for (;;) {
		uint32_t v = fq_ec_prepare(&e->drained);

		/* After the seq_cst announcement in fq_ec_prepare: the loads
		 * in fanout__drained pair with the puts' RMWs (put_signal). */
		if (fanout__drained(e)) {
			fq_ec_done(&e->drained);
			return;
		}
		fq_ec_wait(&e->drained, v, 0);
		fq_ec_done(&e->drained);
	}
}

static void cancel_one(struct record *rec, void *how)
{
	fanout__cancel_rec(rec, *(unsigned *)how);
}

/* Interrupt every record in the table (shutdown's scan). */
static void cancel_all(struct fanout_engine *e, unsigned how)
{
	fanout__table_for_each(e, cancel_one, &how);
}

int fanout_shutdown(struct fanout_engine *e)
{
	if (!e)
		return -EINVAL;
	if (fanout__inherited(e->fork_gen))
		return -EOWNERDEAD;
	if (waits_for_caller(e))
		return -EDEADLK;
	/* seq_cst: the store of the store-load pairs in deleg.c (enter,
	 * recheck) and fanout__active_put(). */
	if (atomic_exchange_explicit(&e->shutting, 1, memory_order_seq_cst)) {
		wait_word(e, &e->shut_done, 1); /* another caller is at it */
		return 0;
	}
	/* seq_cst fence: store shutting; fence; scan. */
	atomic_thread_fence(memory_order_seq_cst);
	cancel_all(e, FANOUT_CANCEL_INTERRUPT | FANOUT_CANCEL_ABANDON |
			      CANCEL_SHUTDOWN);
	wait_drained(e);
	fanout__timer_stop(e);
	fq_stop(e->q);
	/* release: pairs with the acquire in wait_word() of later callers. */
	atomic_store_explicit(&e->shut_done, 1, memory_order_release);
	fq_ec_signal(&e->drained, UINT32_MAX);
	return 0;
}

FQ_TLS struct fanout_tls_stats fanout__tls_stats;

struct fanout_tstats *fanout__tstats_slow(struct fanout_engine *e)
{
	pthread_t me = pthread_self();
	struct fanout_tstats *ts, *head;
	int k;

	/* acquire: pairs with the release CAS below (the block's fields). */
	head = atomic_load_explicit(&e->tstats, memory_order_acquire);
	for (ts = head; ts; ts = ts->next)
		if (pthread_equal(ts->owner, me))
			goto found;
	/* Unchecked: not an allocation the fault tests count; on failure
	 * the thread counts in st_shared. */
	ts = fanout__alloc_unchecked(sizeof(*ts));
	if (!ts)
		return NULL;
	for (k = 0; k < TSTAT_N; k++)
		atomic_init(&ts->n[k], 0);
	ts->nslots = 0;
	ts->owner = me;
	ts->next = head;
	/* release: publishes the block's fields to the walks above and to
	 * fanout_stats(); relaxed on failure: the retry only links ours in
	 * front of the head it read (no other thread pushes a block of
	 * ours). */
	while (!atomic_compare_exchange_weak_explicit(&e->tstats, &ts->next, ts,
						      memory_order_release,
						      memory_order_relaxed))
		;
found:
	fanout__tls_stats.serial = e->serial;
	fanout__tls_stats.ts = ts;
	return ts;
}

/* Counter @k summed over the shared count and every thread's block;
 * relaxed loads, see fanout_stats. */
static uint64_t tstat_sum(struct fanout_engine *e, enum tstat k)
{
	uint64_t sum =
		atomic_load_explicit(&e->st_shared[k], memory_order_relaxed);
	struct fanout_tstats *ts;

	/* acquire: see fanout__tstats_slow. */
	for (ts = atomic_load_explicit(&e->tstats, memory_order_acquire); ts;
	     ts = ts->next)
		sum += atomic_load_explicit(&ts->n[k], memory_order_relaxed);
	return sum;
}

static void tstats_free(struct fanout_engine *e)
{
	/* relaxed: destroy runs after every call into the engine returned. */
	struct fanout_tstats *ts = atomic_load_explicit(&e->tstats,
							memory_order_relaxed),
			     *next;

	for (; ts; ts = next) {
		next = ts->next;
		fanout__free(ts, sizeof(*ts));
	}
}

void fanout_destroy(struct fanout_engine *e)
{
	bool inherited;

	if (!e)
		return;
	/* Inherited across fork(): no worker, call or publisher of it exists
	 * in this process; free what is ours without stopping anything
	 * (fork.c, "Destroying an inherited engine"). */
	inherited = fanout__inherited(e->fork_gen);
	if (inherited) {
		fanout__fork_forget_sinks(e);
		fanout__timer_forget(e);
	} else {
		if (waits_for_caller(e))
			return;
		fanout_shutdown(e);
		fanout__sinks_destroy(e);
	}
	fanout__engines_del(e); /* no cancel tree walks e's table after */
	fanout__table_destroy(e);
	/* Every record and sink handed to call_rcu is gone after this; the
	 * second barrier catches records released BY those callbacks (a sink
	 * destroyed earlier drains its leftover events in its callback).
	 * Before each, the records waiting for a batch are handed over. */
	fanout__rec_flush(e);
	fanout__limbo_drain(); /* this thread's; blocks, not the engine's */
	rcu_barrier();
	fanout__rec_flush(e);
	fanout__limbo_drain();
	rcu_barrier();
	FQ_HANDOFF_ACQUIRE(&fanout__rcu_token); /* the callbacks' release */
	if (inherited)
		fq_free_forked(e->q);
	else
		fq_free(e->q);
	fanout__blocks_drain(&e->blocks); /* every record is freed by now */
	fanout__free(e->st_worker_children,
		     sizeof(*e->st_worker_children) * e->cfg.workers);
	tstats_free(e);
	fanout__free(e, sizeof(*e));
}

/* Worker @i's counters (i < cfg.workers); relaxed loads, see fanout_stats. */
static void worker_stats(struct fanout_engine *e, unsigned i,
			 struct fanout_worker_stats *out)
{
	struct fq_worker_stats ws;

	fq_worker_stats(e->q, i, &ws);
	out->children_run = atomic_load_explicit(&e->st_worker_children[i],
						 memory_order_relaxed);
	out->parks = ws.parks;
	out->wakeups = ws.wakeups;
	out->cpu = ws.cpu;
}

int fanout_worker_stats(struct fanout_engine *e, unsigned i,
			struct fanout_worker_stats *out)
{
	if (!e || !out)
		return -EINVAL;
	if (fanout__inherited(e->fork_gen))
		return -EOWNERDEAD; /* as fanout_stats */
	if (i >= e->cfg.workers)
		return -ERANGE;
	worker_stats(e, i, out);
	return 0;
}

int fanout_stats(struct fanout_engine *e, struct fanout_stats *st)
{
	unsigned i;

	if (!e || !st)
		return -EINVAL;
	if (fanout__inherited(e->fork_gen))
		return -EOWNERDEAD;
	memset(st, 0, sizeof(*st));
	/* acquire first: pairs with the release increment in finalise, so
	 * every completion counted here has its start counted below.  The
	 * rest is relaxed: counters, exact once the engine is quiet. */
	st->completed =
		atomic_load_explicit(&e->finish_seq, memory_order_acquire);
	st->dispatched = tstat_sum(e, TSTAT_DISPATCHED);
	st->runs = tstat_sum(e, TSTAT_RUNS);
	st->rejected =
		atomic_load_explicit(&e->st_rejected, memory_order_relaxed);
	st->cancelled =
		atomic_load_explicit(&e->st_cancelled, memory_order_relaxed);
	st->children_skipped =
		atomic_load_explicit(&e->st_skipped, memory_order_relaxed);
	st->children_run = tstat_sum(e, TSTAT_CHILDREN);
	st->async_running = fanout__async_running(e);
	st->nworkers = e->cfg.workers;
	for (i = 0; i < e->cfg.workers; i++) {
		struct fanout_worker_stats ws;

		worker_stats(e, i, &ws);
		st->children_run += ws.children_run;
		st->parks += ws.parks;
		st->wakeups += ws.wakeups;
		if (i < FANOUT_STATS_MAX_WORKERS)
			st->worker[i] = ws;
	}
	{
		uint64_t d = st->dispatched + st->runs, c = st->completed;

		st->running = d > c ? (unsigned)(d - c) : 0;
	}
	return 0;
}
