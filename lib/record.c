/* SPDX-License-Identifier: MIT */
/*
 * record.c - the record block of a delegation: its one allocation, its
 * copied strings, its id, and its lifetime (references, RCU free).
 *
 * WHY IT IS CORRECT
 *
 * Lifetime.  `refs` = 1 (table) + 1 (event) + tokens.  A token's reference
 * is dropped after its claim loop has stopped touching the record; the
 * finaliser is always a token holder or a canceller inside an RCU read-side
 * section, so the record outlives finalisation.  The table reference goes
 * when the record is pruned (never before its event is published: pruning
 * happens in the finaliser after publishing).  The last put frees through
 * call_rcu, so lookups that found the record under rcu_read_lock still read
 * valid memory.
 */
#include "internal.h"

#include <errno.h>
#include <stddef.h>
#include <string.h>

/* ------------------------------------------------------------ lifetime */

static void rec_free_rcu(struct rcu_head *head)
{
	struct record *rec = caa_container_of(head, struct record, rcu);
	unsigned i;

	FQ_HANDOFF_ACQUIRE(&fanout__rcu_token);
	FQ_HANDOFF_ACQUIRE(rec);
	/* relaxed: see mark_strings() in child.c.  Without child strings the
	 * result slots are not read at all (a 4096-child block is 256 KB of
	 * them, which this thread would pull through its cache). */
	if (atomic_load_explicit(&rec->strings, memory_order_relaxed)) {
		for (i = 0; i < rec->ntasks; i++) {
			struct fanout_result *r = &rec->results[i];
			/* Child-set strings carry their size in front
			 * (child.c). */
			if (r->summary)
				fanout__str_free(r->summary);
			if (rec->owned[i] & OWN_ERROR)
				fanout__str_free(r->error);
		}
	}
	/* The record's references on its deferred children (pending.c).
	 * relaxed: the acquire of the last rec_put orders every push before
	 * this callback. */
	{
		struct fanout_pending *p = atomic_load_explicit(
			&rec->pendings, memory_order_relaxed);

		while (p) {
			struct fanout_pending *next = p->next;

			fanout__pending_put(p);
			p = next;
		}
	}
	fanout__blocks_free(&rec->e->blocks, rec, rec->alloc_size);
	/* TSan edge: this callback's use of the engine happens before the
	 * rcu_barrier() in fanout_destroy() returns (see annotate.h). */
	FQ_HANDOFF_RELEASE(&fanout__rcu_token);
}

void fanout__rec_put(struct record *rec, uint32_t n)
{
	/* release on the decrement, acquire before the free (refcount.h):
	 * every access by every holder happens before the free. */
	if (atomic_fetch_sub_explicit(&rec->refs, n, memory_order_acq_rel) ==
	    n) {
		FQ_HANDOFF_RELEASE(rec);
		call_rcu(&rec->rcu, rec_free_rcu);
	}
}

void fanout__active_put(struct fanout_engine *e, uint32_t n)
{
	/* seq_cst: the store-load pair against fanout_shutdown's prepare
	 * (seq_cst RMW) and load of `active`: either shutdown reads our
	 * decrement, or we read `shutting` set and signal (store-buffering;
	 * acq_rel would not forbid both missing).  Release part: a waiter that
	 * sees 0 sees every record's publication. */
	if (atomic_fetch_sub_explicit(&e->active, n, memory_order_seq_cst) ==
		    n &&
	    atomic_load_explicit(&e->shutting, memory_order_seq_cst))
		fq_ec_signal(&e->drained, 1);
}

/* ------------------------------------------------------------ allocation */

static size_t str_size(const char *s)
{
	return s ? strlen(s) + 1 : 0;
}

static char *copy_str(char **area, const char *s, size_t n)
{
	char *d = *area;

	if (!s)
		return NULL;
	memcpy(d, s, n);
	*area += n;
	return d;
}

/* The one allocation of a delegation: record + results + tasks + strings;
 * with FANOUT_BORROW_TASKS, the tasks and goals stay the caller's. */
struct record *fanout__rec_alloc(struct fanout_engine *e,
				 const struct fanout_batch *b, unsigned depth,
				 bool background, unsigned nrunners)
{
	/* Head fields the memset below leaves 0/NULL/false: pendings,
	 * deferring, npending, places, parked, ncompleted, has_kids,
	 * parent_id, deadline, dl_next; the caller sets what it needs. */
	struct fanout_child *cur = fanout__current();
	bool borrow = b->flags & FANOUT_BORROW_TASKS;
	unsigned n = b->ntasks, ntask_slots = borrow ? 0 : b->ntasks, i;
	size_t strings = str_size(b->context) + str_size(b->session_key);
	size_t head = sizeof(struct record) + n * sizeof(struct fanout_result);
	size_t size;
	struct fanout_task *slots;
	struct record *rec;
	char *area;

	for (i = 0; i < ntask_slots; i++)
		strings += b->tasks[i].goal ? strlen(b->tasks[i].goal) + 1 : 0;
	head = (head + CACHELINE - 1) & ~(size_t)(CACHELINE - 1);
	head += nrunners * sizeof(struct progress_slot);
	size = head + ntask_slots * sizeof(struct fanout_task) + n + strings;
	rec = fanout__blocks_alloc(&e->blocks, size, &size);
	if (!rec)
		return NULL;
	/* Only the read-mostly head is zeroed; the join line is initialised
	 * field by field below and the event by the finaliser, so dispatch
	 * writes no line it need not. */
	memset(rec, 0, offsetof(struct record, claim));
	rec->e = e;
	rec->parent = cur ? cur->rec : NULL;
	rec->alloc_size = size;
	rec->ntasks = n;
	rec->depth = depth;
	rec->background = background;
	rec->work.fn = fanout__run_token;
	slots = (struct fanout_task *)((char *)rec + head);
	/* Borrowed tasks are only read (the cast drops the caller's const). */
	rec->tasks = borrow ? (struct fanout_task *)b->tasks : slots;
	rec->nrunners = nrunners;
	rec->progress =
		(struct progress_slot *)((char *)slots -
					 nrunners *
						 sizeof(struct progress_slot));
	for (i = 0; i < nrunners; i++)
		atomic_init(&rec->progress[i].n, 0);
	atomic_init(&rec->runner_next, 0);
	rec->owned = (uint8_t *)(slots + ntask_slots);
	memset(rec->owned, 0, n);
	area = (char *)rec->owned + n;
	for (i = 0; i < ntask_slots; i++) {
		const char *g = b->tasks[i].goal;

		slots[i].fn = b->tasks[i].fn;
		slots[i].arg = b->tasks[i].arg;
		/* A NULL goal shares one static "" instead of a copy. */
		slots[i].goal = g ? copy_str(&area, g, strlen(g) + 1) : "";
	}
	rec->context = copy_str(&area, b->context, str_size(b->context));
	rec->session_key =
		copy_str(&area, b->session_key, str_size(b->session_key));
	rec->user = b->user;
	rec->join = b->join;
	rec->quorum = b->join == FANOUT_JOIN_ANY ? 1 : b->quorum;
	atomic_init(&rec->claim, 0);
	atomic_init(&rec->remaining, n);
	atomic_init(&rec->cancel, 0);
	atomic_init(&rec->strings, false);
	atomic_init(&rec->state, REC_RUNNING);
	atomic_init(&rec->done_word, 0);
	atomic_init(&rec->cost_bits, 0);
	cds_wfcq_node_init(&rec->qnode);
	if (fanout__table_reserve(e, rec)) { /* gives rec->id */
		fanout__blocks_free(&e->blocks, rec, size);
		return NULL;
	}
	rec->dispatched_ns = fq_now_ns();
	return rec;
}
