/* SPDX-License-Identifier: MIT */
/*
 * deleg.c - the public entry points of delegations: dispatch, run,
 * delegate, cancel.  The record block lives in record.c, the children and
 * the join in join.c.
 *
 * WHY IT IS CORRECT
 *
 * Capacity.  max_async is an admission counter: fetch_add, and undo on
 * overflow; the finaliser gives the slot back BEFORE publishing, so a
 * consumer that receives an event can immediately dispatch again.  Ring
 * credits are reserved before anything is inserted, so an accepted batch
 * never finds the ring full, and a refused one has changed nothing.
 *
 * Shutdown.  `active` counts unfinished records plus dispatch/run calls in
 * progress.  A call adds 2 (itself and its record) before it reads
 * `shutting`; fanout_shutdown stores `shutting` and then scans the table.
 * After inserting, a dispatch issues a full fence and re-reads `shutting`
 * and cancels its own record if set: with the fences on both sides (store;
 * fence; scan / insert; fence; load), either the scan sees the record or
 * the dispatch sees the flag, so no accepted delegation escapes the
 * interrupt (tests/models/shutdown_drain.pml).  The call's own unit is
 * dropped only after its last touch of the queue, so fanout_shutdown, which
 * waits for active == 0 before stopping the queue, never stops it under a
 * submit.
 */
#include "internal.h"

#include <errno.h>

static int reject(struct fanout_engine *e, int err)
{
	/* relaxed: a statistic */
	atomic_fetch_add_explicit(&e->st_rejected, 1, memory_order_relaxed);
	return err;
}

static int check_batch(struct fanout_engine *e, const struct fanout_batch *b,
		       unsigned *depth)
{
	struct fanout_child *cur = fanout__current();
	unsigned i;

	if (!b->tasks || !b->ntasks)
		return -EINVAL;
	if (b->ntasks > e->cfg.max_tasks)
		return -E2BIG;
	for (i = 0; i < b->ntasks; i++)
		if (!b->tasks[i].fn)
			return -EINVAL;
	*depth = (cur ? cur->rec->depth : 0) + 1;
	if (*depth > e->cfg.max_depth)
		return -ELOOP;
	return 0;
}

/* Enter a dispatch/run call: count the call and its record in `active`
 * (see "Shutdown" above). */
static int enter(struct fanout_engine *e)
{
	/* seq_cst: the store-load pair against fanout_shutdown(). */
	atomic_fetch_add_explicit(&e->active, 2, memory_order_seq_cst);
	if (atomic_load_explicit(&e->shutting, memory_order_seq_cst)) {
		fanout__active_put(e, 2);
		return -ESHUTDOWN;
	}
	return 0;
}

/* After the insert: if shutdown began meanwhile, interrupt ourselves. */
static void recheck_shutdown(struct fanout_engine *e, fanout_id id)
{
	struct record *rec;

	/* seq_cst fence: insert; fence; load - pairs with the store; fence;
	 * scan in fanout_shutdown(). */
	atomic_thread_fence(memory_order_seq_cst);
	if (!atomic_load_explicit(&e->shutting, memory_order_relaxed))
		return;
	fanout__read_lock();
	rec = fanout__table_find(e, id);
	if (rec)
		fanout__cancel_rec(rec,
				   FANOUT_CANCEL_INTERRUPT | CANCEL_SHUTDOWN);
	fanout__read_unlock();
}

int fanout_dispatch(struct fanout_engine *e, const struct fanout_batch *b,
		    fanout_id *idp)
{
	struct fanout_sink *s;
	struct record *rec;
	unsigned depth, want, got;
	fanout_id id;
	int err;

	if (!e || !b)
		return e ? reject(e, -EINVAL) : -EINVAL;
	err = check_batch(e, b, &depth);
	if (!err && b->sink && b->sink->e != e)
		err = -EINVAL;
	if (err)
		return reject(e, err);
	err = enter(e);
	if (err)
		return reject(e, err);
	/* Admission: one max_async slot per batch.  acquire: pairs with the
	 * release decrement in finalise, so the slot's old owner is done. */
	if (atomic_fetch_add_explicit(&e->async_running, 1,
				      memory_order_acquire) >=
	    e->cfg.max_async) {
		err = -EBUSY;
		goto out_async;
	}
	want = b->ntasks < e->max_tokens ? b->ntasks : e->max_tokens;
	got = fq_reserve(e->q, want, 1);
	if (!got) {
		err = -EBUSY;
		goto out_async;
	}
	rec = fanout__rec_alloc(e, b, depth, true, got);
	if (!rec) {
		err = -ENOMEM;
		goto out_credits;
	}
	s = b->sink ? b->sink : e->default_sink;
	rec->sink = s;
	/* relaxed: destroy reads it only after quiescence (documented).  The
	 * default sink cannot be destroyed, so it keeps no count: one shared
	 * RMW less on the dispatch and on the publish. */
	if (!s->is_default)
		atomic_fetch_add_explicit(&s->pending, 1, memory_order_relaxed);
	atomic_init(&rec->refs, 2 + got);
	rec->chunk = fanout__chunk_for(b->ntasks, got);
	id = rec->id;
	/* The caller's id is written before anything is visible to a worker:
	 * a child that reads the caller's variable sees the id (the ring's
	 * handoff in fq_submit is the release that publishes this store). */
	if (idp)
		*idp = id;
	atomic_fetch_add_explicit(&e->st_dispatched, 1,
				  memory_order_relaxed); /* stat */
	fanout__read_lock();
	fanout__table_insert(e, rec);
	fanout__read_unlock();
	fq_submit(e->q, &rec->work, got); /* rec may be gone after this */
	recheck_shutdown(e, id);
	fanout__active_put(e, 1); /* the call's unit; the record keeps one */
	return 0;

out_credits:
	fq_unreserve(e->q, got);
out_async:
	/* relaxed: undoing our own increment publishes nothing. */
	atomic_fetch_sub_explicit(&e->async_running, 1, memory_order_relaxed);
	fanout__active_put(e, 2);
	return reject(e, err);
}

int fanout_run(struct fanout_engine *e, const struct fanout_batch *b,
	       struct fanout_event **evp)
{
	struct record *rec;
	unsigned depth, want, extra;
	int err;

	if (!e || !b || !evp)
		return e ? reject(e, -EINVAL) : -EINVAL;
	err = check_batch(e, b, &depth);
	if (err)
		return reject(e, err);
	err = enter(e);
	if (err)
		return reject(e, err);
	/* The caller is one runner; idle workers may add up to max_children
	 * in all.  No credit is fine: the caller then runs everything. */
	want = b->ntasks < e->cfg.max_children ? b->ntasks :
						 e->cfg.max_children;
	want = want > e->max_tokens ? e->max_tokens : want;
	extra = want > 1 ? fq_reserve(e->q, want - 1, 0) : 0;
	rec = fanout__rec_alloc(e, b, depth, false, extra + 1);
	if (!rec) {
		fq_unreserve(e->q, extra);
		fanout__active_put(e, 2);
		return reject(e, -ENOMEM);
	}
	/* refs: table + event (returned to the caller) + caller + tokens. */
	atomic_init(&rec->refs, 3 + extra);
	rec->chunk = fanout__chunk_for(b->ntasks, extra + 1);
	atomic_fetch_add_explicit(&e->st_runs, 1,
				  memory_order_relaxed); /* stat */
	fanout__read_lock();
	fanout__table_insert(e, rec);
	fanout__read_unlock();
	recheck_shutdown(e, rec->id);
	fq_help_wait(e->q, &rec->work, extra, &rec->done_word);
	fanout__active_put(e, 1);
	*evp = &rec->ev;
	return 0;
}

int fanout_delegate(struct fanout_engine *e, const struct fanout_batch *b,
		    fanout_id *idp, struct fanout_event **evp)
{
	int err;

	if (!e || !b || !evp)
		return e ? reject(e, -EINVAL) : -EINVAL;
	*evp = NULL;
	if (!fanout__current()) {
		/* idp goes straight in: dispatch writes it before any child
		 * can run, and not at all when it refuses. */
		err = fanout_dispatch(e, b, idp);
		if (!err)
			return FANOUT_BACKGROUND;
		if (err != -EBUSY)
			return err;
		err = fanout_run(e, b, evp);
		if (err)
			return err;
		if (idp)
			*idp = (*evp)->id;
		return FANOUT_INLINE_FULL;
	}
	err = fanout_run(e, b, evp);
	if (err)
		return err;
	if (idp)
		*idp = (*evp)->id;
	return FANOUT_INLINE;
}

int fanout_cancel(struct fanout_engine *e, fanout_id id, unsigned how)
{
	struct record *rec;
	int err;

	if (!e || !id || !how ||
	    (how & ~(FANOUT_CANCEL_PENDING | FANOUT_CANCEL_INTERRUPT)))
		return -EINVAL;
	fanout__read_lock();
	rec = fanout__table_find(e, id);
	err = rec ? fanout__cancel_rec(rec, how) : -ENOENT;
	fanout__read_unlock();
	return err;
}
