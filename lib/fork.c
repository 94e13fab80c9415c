/* SPDX-License-Identifier: MIT */
/*
 * fork.c - fanout across fork(): a forked child can create and use new
 * engines; an engine it inherited refuses every call with -EOWNERDEAD.
 *
 * WHY IT IS CORRECT
 *
 * What fork() leaves.  Only the forking thread exists in the child.  Every
 * engine's workers, liburcu's call_rcu thread and the (unused here) cds_lfht resize
 * workqueue thread are gone, but their memory (queues, locks, registry
 * entries of dead readers) is copied as it was.  Without help, the child's
 * first rcu_barrier() (every fanout_destroy) queues work for a call_rcu
 * thread that does not exist and waits forever (issue 9.3).
 *
 * liburcu's handlers.  liburcu-bp is built to survive fork when told:
 * call_rcu_before_fork() pauses every call_rcu thread and the lfht
 * workqueue (registered with it by rculfhash) between two callbacks, and
 * urcu_bp_before_fork() takes the grace-period and registry locks, so the
 * child inherits no lock held by a thread it does not have.  In the child,
 * urcu_bp_after_fork_child() drops the dead readers from the registry and
 * call_rcu_after_fork_child() starts a new call_rcu thread (pending
 * callbacks move to it) and a new workqueue thread.  Order: the call_rcu
 * threads must reach their pause point before anyone holds the
 * grace-period lock they may need (synchronize_rcu), so call_rcu first and
 * urcu-bp second on the way in, the reverse on the way out.  We register
 * the three as ONE pthread_atfork() triple, so nothing can slip between.
 *
 * When.  On the first fanout_create() (pthread_once, which glibc keeps
 * fork-safe), after its first allocation.  pthread_atfork() runs prepare
 * handlers in reverse order of registration, so ours runs BEFORE the
 * allocator's (jemalloc registers its own when it initialises, before
 * any engine; so does TSan's runtime): the call_rcu thread may be inside
 * free() in a callback, and must reach its pause point before the
 * allocator's prepare handler takes its locks.  (This is the hang
 * liburcu's README warns about for pthread_atfork; glibc's own malloc
 * takes its locks after every handler, so it is safe too.  gcc 12's ASan
 * takes none at all: tests/test_fork.c, workers_settled().)  An engine
 * exists only after the registration, so no engine can cross a fork
 * unseen.  Not covered: _Fork(), vfork() or a raw clone()
 * whose child does anything but exec (no atfork handlers run).
 *
 * Inherited engines.  fanout__fork_gen counts, per process, the forks that
 * made it (the child handler adds one; a parent's never changes).  Each
 * engine and sink stores the value at creation; a different value now
 * means it came from an ancestor process.  The load is relaxed and exact:
 * the counter changes only in the child handler, before the child has a
 * second thread, and every thread created later is ordered after it by
 * pthread_create.  So the check costs one load of a line nobody writes.
 *
 * Destroying an inherited engine frees what the child owns outright: the
 * sinks (queued events, this process's copy of each eventfd), the
 * finished records, the table, the ring and the engine.  It joins nothing.
 * Sink queues are drained with the non-blocking dequeue: a publisher that
 * vanished between its tail exchange and its next-pointer store would make
 * a blocking dequeue wait forever.  Records still running at the fork
 * stay allocated: their other references (ring tokens, the stacks of dead
 * runners) belong to threads this process does not have, so their count
 * never reaches zero here.  In a child those pages are copy-on-write
 * copies of the parent's, so leaving them costs the child nothing.
 */
#include "internal.h"

#include <errno.h>
#include <pthread.h>
#include <unistd.h>

_Atomic uint32_t fanout__fork_gen __attribute__((aligned(CACHELINE)));

static void before_fork(void)
{
	call_rcu_before_fork();
	urcu_bp_before_fork();
}

static void after_fork_parent(void)
{
	urcu_bp_after_fork_parent();
	call_rcu_after_fork_parent();
}

static void after_fork_child(void)
{
	urcu_bp_after_fork_child();
	call_rcu_after_fork_child();
	fanout__epoch_fork_child();
	/* relaxed: the child has one thread; see "Inherited engines". */
	atomic_fetch_add_explicit(&fanout__fork_gen, 1, memory_order_relaxed);
	/* A fork from inside a child task: the new process starts at top
	 * level, not at that task's depth (fanout.h, "Fork"), and not as the
	 * worker it ran on (a helping wait would never help). */
	fanout__forget_child();
	fq_fork_child();
}

static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;
static int atfork_err; /* written once under atfork_once */

static void register_atfork(void)
{
	atfork_err = pthread_atfork(before_fork, after_fork_parent,
				    after_fork_child);
}

/* Once per process; pthread_once orders atfork_err for every caller.  A
 * failure (ENOMEM, in practice never) is remembered: creating engines
 * that would hang a forked child is worse than refusing them. */
int fanout__fork_init(void)
{
	pthread_once(&atfork_once, register_atfork);
	return atfork_err ? -ENOMEM : 0;
}

/* fanout_destroy() of an inherited engine, sinks part: see above. */
void fanout__fork_forget_sinks(struct fanout_engine *e)
{
	struct cds_lfht_iter iter;
	struct cds_lfht_node *node;
	struct cds_wfcq_node *qn;
	struct fanout_sink *s;

	if (!e->sinks)
		return;
	/* Nothing of the engine runs in this process. */
	fanout__read_lock();
	fanout__lfht_for_each(e->sinks, &iter, node) {
		s = caa_container_of(node, struct fanout_sink, node);
		FQ_HANDOFF_ACQUIRE(s);
		cds_lfht_del(e->sinks, &s->node);
		while ((qn = __cds_wfcq_dequeue_nonblocking(&s->head,
							    &s->tail)) &&
		       qn != CDS_WFCQ_WOULDBLOCK) {
			struct record *rec =
				caa_container_of(qn, struct record, qnode);

			FQ_HANDOFF_ACQUIRE(rec);
			fanout__rec_put(rec, 1); /* the event's reference */
		}
		close(s->efd); /* ours; the parent's descriptor stays open */
		cds_wfcq_destroy(&s->head, &s->tail);
		fanout__free(s, sizeof(*s));
	}
	fanout__read_unlock();
	cds_lfht_destroy(e->sinks, NULL);
	e->sinks = NULL;
}
