/* SPDX-License-Identifier: MIT */
/*
 * tree.c - the cancel tree across engines, and cancelling a session.
 *
 * WHY IT IS CORRECT
 *
 * Links.  A delegation started from inside a child (or with
 * fanout_batch.within) stores its parent record's id in `parent_id` and
 * that record's engine's serial in `parent_engine` (ids are unique per
 * engine only), and marks the parent `has_kids`.  No pointer goes from parent to child or
 * back, so no lifetime ties records of different engines together.
 *
 * Walk.  Interrupting a record R that has kids scans the records of every
 * engine for those whose parent_id is R's id, and interrupts each (which
 * walks on from there if it has kids of its own).  A cold path: its cost is
 * the number of records in the tables, paid only by records whose children
 * started delegations.
 *
 * Tree.  A kid inserted while its parent is being interrupted is not
 * missed: the kid's dispatch stores has_kids, inserts, issues a seq_cst
 * fence and loads the parent's cancel word (deleg.c, recheck); the
 * interrupter sets the cancel bits (seq_cst RMW), issues a seq_cst fence,
 * then loads has_kids and scans.  Either the kid's load sees the bits (it
 * interrupts itself) or the interrupter's fence comes after the kid's in
 * the single total order, so it sees has_kids and the inserted record.
 *
 * Finished kids.  A kid that finished before the walk reached it is not
 * interrupted (-EALREADY), but its own kids may still run, started by its
 * children before it finished: the walk goes on through it, from its
 * record while the table holds one, else from its tomb, which keeps the
 * record's parent link when it has kids or deferred children (table.c,
 * TOMB_KIDS).  Its kids were linked before it finished (their dispatch
 * ran inside its child, or hung from one of its deferred children, which
 * finish before it - but see "Late kids"), so the walk finds them; once
 * its tomb is pruned (keep_completed newer records finished), its kids
 * are no longer reached through it.
 *
 * Late kids.  A dispatch that hangs from a deferred child (batch.within,
 * or made by the child's fn after fanout_defer) may link its record after
 * that child was finished - by a completer on another thread, or before
 * the fn returned - and the parent record with it, so after a walk that
 * found the parent finished and passed it without a look at this kid; no
 * cancel bit on a finished parent tells the kid.  So the dispatch, after
 * its link and seq_cst fence (deleg.c, recheck), loads the child's state
 * (seq_cst), and interrupts itself if the child is finished.  If not, the
 * finisher's CAS on that state (seq_cst, pending.c try_finish) comes
 * after the dispatch's fence in S; a walk that finds the parent finished
 * does so through the join (or the tomb) that follows that CAS, and then
 * issues a seq_cst fence before it reads has_kids and scans, so that
 * fence too comes after the dispatch's in S, and the walk sees the link
 * (C11 7.17.3p7).  A walk that finds the parent running sets its cancel
 * bits: "Tree" above.
 *
 * Engines.  Every engine is in one process-wide cds_lfht (liburcu's
 * lock-free hash set, keyed by the engine's serial, no resizing, so no
 * helper thread): create adds it and destroy removes it, both lock-free,
 * and destroy waits for a grace period (synchronize_rcu) before it frees
 * the engine's table, so no walker (under rcu_read_lock) still reads it.
 * The set is made once (pthread_once) and lives as long as the process.
 */
#include "internal.h"

#include <errno.h>
#include <pthread.h>
#include <string.h>

static struct cds_lfht *engines; /* I after engines_once */
static pthread_once_t engines_once = PTHREAD_ONCE_INIT;
static _Atomic uint64_t serials;

static void engines_make(void)
{
	engines = cds_lfht_new_flavor(64, 64, 0, 0, &urcu_bp_flavor, NULL);
}

/* The registry exists (made once per process); -ENOMEM if it cannot be. */
int fanout__engines_init(void)
{
	pthread_once(&engines_once, engines_make);
	return engines ? 0 : -ENOMEM;
}

void fanout__engines_add(struct fanout_engine *e)
{
	/* relaxed: a distinct value is all that is needed (RMW order). */
	e->serial =
		atomic_fetch_add_explicit(&serials, 1, memory_order_relaxed) +
		1;
	cds_lfht_node_init(&e->engines_node);
	fanout__read_lock();
	FQ_HANDOFF_RELEASE(e);
	cds_lfht_add(engines, (unsigned long)e->serial, &e->engines_node);
	fanout__read_unlock();
}

void fanout__engines_del(struct fanout_engine *e)
{
	fanout__read_lock();
	cds_lfht_del(engines, &e->engines_node);
	fanout__read_unlock();
	synchronize_rcu(); /* no walker still reads e's table */
}

struct kid_scan {
	fanout_id parent;
	uint64_t engine; /* ids are unique per engine only */
	unsigned how;
	uint64_t scanned; /* the serial of the engine being scanned */
};

static void walk_kids(fanout_id parent, uint64_t engine, unsigned how);

static void cancel_kid(struct record *rec, void *arg)
{
	const struct kid_scan *k = arg;

	if (rec->parent_id != k->parent || rec->parent_engine != k->engine)
		return;
	/* A kid that finished already answers -EALREADY without walking
	 * on; its own kids may still run ("Finished kids" above). */
	if (!fanout__cancel_rec(rec, k->how))
		return; /* interrupted: it walked on itself ("Tree") */
	/* seq_cst fence: the walk's half of "Late kids" (after seeing the
	 * kid finished, before the load of has_kids and the scan). */
	atomic_thread_fence(memory_order_seq_cst);
	if (atomic_load_explicit(&rec->has_kids, memory_order_relaxed))
		walk_kids(rec->id, rec->e->serial, k->how);
}

/* A kid that finished and whose block is gone, found by its tomb. */
static void cancel_kid_tomb(fanout_id kid, void *arg)
{
	const struct kid_scan *k = arg;

	/* seq_cst fence: as in cancel_kid ("Late kids"), after the tomb's
	 * read, before the scan. */
	atomic_thread_fence(memory_order_seq_cst);
	walk_kids(kid, k->scanned, k->how);
}

/* Interrupt every delegation whose parent is @parent of engine @engine. */
static void walk_kids(fanout_id parent, uint64_t engine, unsigned how)
{
	struct kid_scan k = {.parent = parent, .engine = engine, .how = how};
	struct cds_lfht_iter iter;
	struct cds_lfht_node *node;
	struct fanout_engine *e;

	fanout__read_lock();
	fanout__lfht_for_each(engines, &iter, node) {
		e = caa_container_of(node, struct fanout_engine, engines_node);
		FQ_HANDOFF_ACQUIRE(e);
		k.scanned = e->serial;
		fanout__table_for_each(e, cancel_kid, &k);
		fanout__table_kid_tombs(e, parent, engine, cancel_kid_tomb, &k);
	}
	fanout__read_unlock();
}

void fanout__tree_cancel(struct record *rec, unsigned how)
{
	/* seq_cst fence: the interrupter's half of "Tree" (after the
	 * fetch_or in fanout__cancel_rec, before the load of has_kids). */
	atomic_thread_fence(memory_order_seq_cst);
	if (!atomic_load_explicit(&rec->has_kids, memory_order_relaxed))
		return;
	walk_kids(rec->id, rec->e->serial, how | CANCEL_TREE);
}

struct session_scan {
	const char *key;
	unsigned how;
	size_t n;
};

static void cancel_session_rec(struct record *rec, void *arg)
{
	struct session_scan *s = arg;
	bool fresh = false;

	/* Counted only when this call added a cancel bit: a delegation an
	 * earlier call (or a deadline, shutdown, ...) already cancelled the
	 * same way still runs, but this call did not cancel it. */
	if (rec->session_key && strcmp(rec->session_key, s->key) == 0 &&
	    fanout__cancel_rec_new(rec, s->how, &fresh) == 0 && fresh)
		s->n++;
}

int fanout_cancel_session(struct fanout_engine *e, const char *session_key,
			  unsigned how, size_t *n)
{
	struct session_scan s = {.key = session_key, .how = how | CANCEL_USER};

	if (!e || !session_key || !how || (how & ~CANCEL_HOW_MASK) ||
	    ((how & FANOUT_CANCEL_ABANDON) && !(how & FANOUT_CANCEL_INTERRUPT)))
		return -EINVAL;
	if (fanout__inherited(e->fork_gen))
		return -EOWNERDEAD;
	fanout__table_for_each(e, cancel_session_rec, &s);
	if (n)
		*n = s.n;
	return 0;
}

/* Hand every engine's retired records, and the calling thread's limbo,
 * to call_rcu (fanout_test_quiesce). */
void fanout__engines_flush(void)
{
	struct cds_lfht_iter iter;
	struct cds_lfht_node *node;

	if (fanout__engines_init())
		return;
	fanout__read_lock();
	fanout__lfht_for_each(engines, &iter, node) {
		struct fanout_engine *e = caa_container_of(
			node, struct fanout_engine, engines_node);

		FQ_HANDOFF_ACQUIRE(e);
		fanout__rec_flush(e);
	}
	fanout__read_unlock();
	fanout__limbo_drain();
}
