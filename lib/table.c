/* SPDX-License-Identifier: MIT */
/*
 * table.c - the RCU record table: insert, lookup, list, prune.
 *
 * WHY IT IS CORRECT
 *
 * Readers.  Lookup and list run inside rcu_read_lock (liburcu's "bulletproof"
 * flavour, which registers a thread lazily on its first read lock, so any
 * application thread may call them unregistered).  They never write and
 * never wait.  A record they find stays readable until they unlock: the
 * last reference is dropped with call_rcu (record.c), which runs only after
 * every read-side section that could have seen the record has ended.
 *
 * What they read.  Immutable fields (I) directly; `state`, `remaining`,
 * `cancel`, `cost_bits` atomically; the event fields (F) only after an
 * acquire load saw state == FINISHED, which pairs with the finaliser's
 * release store made after it wrote them.
 *
 * Pruning.  Finished records are kept in `kept`, a ring of keep_completed
 * slots indexed by finish_seq mod K.  A finaliser, AFTER publishing its
 * event, CASes its record into slot finish_seq % K, evicting the record
 * there if that one is older, or evicting itself if a newer one (same slot,
 * so at least K later) already got there first.  A record r is evicted only
 * by the arrival of a record with finish_seq >= r.finish_seq + K in the same
 * slot; finish_seq values are taken in finalisation order, so at least K
 * delegations finished after r: invariant 4 of the design.  Eviction =
 * cds_lfht_del (inside the read lock) + dropping the table's reference.
 */
#include "internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int fanout__rcu_token;

static int match_id(struct cds_lfht_node *node, const void *key)
{
	struct record *rec = caa_container_of(node, struct record, node);

	FQ_HANDOFF_ACQUIRE(rec);
	return rec->id == *(const fanout_id *)key;
}

int fanout__table_init(struct fanout_engine *e)
{
	unsigned k = e->cfg.keep_completed, i;
	unsigned long size = 1024;

	e->kept = fanout__alloc(sizeof(*e->kept) * k);
	if (!e->kept)
		return -ENOMEM;
	for (i = 0; i < k; i++)
		atomic_init(&e->kept[i], NULL);
	/* Sized for what it normally holds (running + kept records), so the
	 * lazy auto-resize never has to catch up on the hot path. */
	while (size < (unsigned long)e->cfg.max_async + k && size < (1ul << 24))
		size <<= 1;
	e->table = cds_lfht_new_flavor(
		size, size, 0, CDS_LFHT_AUTO_RESIZE | CDS_LFHT_ACCOUNTING,
		&urcu_bp_flavor, NULL);
	if (!e->table) {
		fanout__free(e->kept, sizeof(*e->kept) * k);
		e->kept = NULL;
		return -ENOMEM;
	}
	return 0;
}

/* Caller holds the read lock.  Ids are unique, so a plain add suffices. */
void fanout__table_insert(struct fanout_engine *e, struct record *rec)
{
	FQ_HANDOFF_RELEASE(rec);
	cds_lfht_add(e->table, rec->id, &rec->node);
}

/* Caller holds the read lock; the result is valid until it unlocks. */
struct record *fanout__table_find(struct fanout_engine *e, fanout_id id)
{
	struct cds_lfht_iter iter;
	struct cds_lfht_node *node;

	cds_lfht_lookup(e->table, id, match_id, &id, &iter);
	node = cds_lfht_iter_get_node(&iter);
	return node ? caa_container_of(node, struct record, node) : NULL;
}

/* Caller holds the read lock. */
static void evict(struct fanout_engine *e, struct record *rec)
{
	if (cds_lfht_del(e->table, &rec->node) == 0)
		fanout__rec_put(rec, 1);
}

/* The finaliser, after publishing, with the read lock held: see "Pruning". */
void fanout__table_retire(struct fanout_engine *e, struct record *rec)
{
	_Atomic(struct record *) *slot =
		&e->kept[rec->finish_seq % e->cfg.keep_completed];
	/* acquire: the record we may evict was put there by another
	 * finaliser's release CAS; we read its finish_seq. */
	struct record *cur = atomic_load_explicit(slot, memory_order_acquire);

	for (;;) {
		if (cur && cur->finish_seq > rec->finish_seq) {
			evict(e, rec); /* a record K or more newer is there */
			return;
		}
		/* release: publishes rec->finish_seq to the next CAS-er. */
		if (atomic_compare_exchange_weak_explicit(slot, &cur, rec,
							  memory_order_acq_rel,
							  memory_order_acquire))
			break;
	}
	if (cur)
		evict(e, cur);
}

void fanout__table_for_each(struct fanout_engine *e,
			    void (*fn)(struct record *rec, void *arg),
			    void *arg)
{
	struct cds_lfht_iter iter;
	struct cds_lfht_node *node;
	struct record *rec;

	fanout__read_lock();
	fanout__lfht_for_each(e->table, &iter, node) {
		rec = caa_container_of(node, __typeof__(*rec), node);
		FQ_HANDOFF_ACQUIRE(rec);
		fn(rec, arg);
	}
	fanout__read_unlock();
}

/* Quiescent engine: every record is finished and no call is running. */
void fanout__table_destroy(struct fanout_engine *e)
{
	struct cds_lfht_iter iter;
	struct cds_lfht_node *node;
	struct record *rec;
	unsigned i;

	if (!e->table)
		return;
	fanout__read_lock();
	fanout__lfht_for_each(e->table, &iter, node) {
		rec = caa_container_of(node, __typeof__(*rec), node);
		FQ_HANDOFF_ACQUIRE(rec);
		evict(e, rec);
	}
	fanout__read_unlock();
	for (i = 0; i < e->cfg.keep_completed; i++)
		atomic_store_explicit(&e->kept[i], NULL,
				      memory_order_relaxed); /* quiescent */
	fanout__free(e->kept, sizeof(*e->kept) * e->cfg.keep_completed);
	e->kept = NULL;
	cds_lfht_destroy(e->table, NULL);
	e->table = NULL;
}

/* ------------------------------------------------------------- readers */

static void snapshot(const struct record *rec, struct fanout_info *info)
{
	memset(info, 0, sizeof(*info));
	info->id = rec->id;
	info->ntasks = rec->ntasks;
	info->dispatched_ns = rec->dispatched_ns;
	info->depth = rec->depth;
	info->background = rec->background;
	info->user = rec->user;
	info->session_key = rec->session_key;
	/* relaxed: flags and figures for display; nothing is read through
	 * them.  Bits set after CANCEL_FINAL belong to a cancel that got
	 * -EALREADY (the FINISHED branch below reads the event's instead). */
	info->cancelled =
		(atomic_load_explicit(&rec->cancel, memory_order_relaxed) &
		 CANCEL_BY_CALLER) != 0;
	info->npending =
		atomic_load_explicit(&rec->npending, memory_order_relaxed);
	/* acquire: pairs with the release store of FINISHED in finalise. */
	if (atomic_load_explicit(&rec->state, memory_order_acquire) ==
	    REC_FINISHED) {
		info->cancelled = rec->ev.cancelled;
		info->status = rec->ev.status;
		info->ndone = rec->ntasks;
		info->completed_ns = rec->ev.completed_ns;
		info->cost = rec->ev.cost;
	} else {
		/* relaxed: progress figures, no data read through them. */
		unsigned i, ndone;

		info->status = FANOUT_RUNNING;
		ndone = rec->ntasks -
			atomic_load_explicit(&rec->remaining,
					     memory_order_relaxed);
		for (i = 0; i < rec->nrunners; i++)
			ndone += atomic_load_explicit(&rec->progress[i].n,
						      memory_order_relaxed);
		info->ndone = ndone < rec->ntasks ? ndone : rec->ntasks;
		info->cost = fanout__bits_to_double(atomic_load_explicit(
			&rec->cost_bits, memory_order_relaxed));
	}
}

int fanout_lookup(struct fanout_engine *e, fanout_id id,
		  struct fanout_info *info)
{
	struct record *rec;
	int err = -ENOENT;

	if (!e || !id || !info)
		return -EINVAL;
	fanout__read_lock();
	rec = fanout__table_find(e, id);
	if (rec) {
		snapshot(rec, info);
		err = 0;
	}
	fanout__read_unlock();
	return err;
}

/* A min-heap on dispatched_ns keeps the newest `cap` records. */
static void sift_down(struct fanout_info *h, size_t n, size_t i)
{
	for (;;) {
		size_t l = 2 * i + 1, r = l + 1, m = i;
		struct fanout_info t;

		if (l < n && h[l].dispatched_ns < h[m].dispatched_ns)
			m = l;
		if (r < n && h[r].dispatched_ns < h[m].dispatched_ns)
			m = r;
		if (m == i)
			return;
		t = h[i];
		h[i] = h[m];
		h[m] = t;
		i = m;
	}
}

static void sift_up(struct fanout_info *h, size_t i)
{
	while (i) {
		size_t p = (i - 1) / 2;
		struct fanout_info t;

		if (h[p].dispatched_ns <= h[i].dispatched_ns)
			return;
		t = h[i];
		h[i] = h[p];
		h[p] = t;
		i = p;
	}
}

static int newest_first(const void *a, const void *b)
{
	const struct fanout_info *x = a, *y = b;

	if (x->dispatched_ns != y->dispatched_ns)
		return x->dispatched_ns > y->dispatched_ns ? -1 : 1;
	return x->id < y->id ? -1 : x->id > y->id;
}

int fanout_list(struct fanout_engine *e, struct fanout_info *infos, size_t cap,
		size_t *n)
{
	struct cds_lfht_iter iter;
	struct cds_lfht_node *node;
	struct record *rec;
	size_t seen = 0, used = 0;

	if (!e || !n || (!infos && cap))
		return -EINVAL;
	fanout__read_lock();
	fanout__lfht_for_each(e->table, &iter, node) {
		struct fanout_info info;

		rec = caa_container_of(node, struct record, node);
		FQ_HANDOFF_ACQUIRE(rec);
		seen++;
		if (!cap)
			continue;
		snapshot(rec, &info);
		if (used < cap) {
			infos[used] = info;
			sift_up(infos, used++);
		} else if (info.dispatched_ns > infos[0].dispatched_ns) {
			infos[0] = info;
			sift_down(infos, used, 0);
		}
	}
	fanout__read_unlock();
	if (used > 1)
		qsort(infos, used, sizeof(*infos), newest_first);
	*n = seen;
	return 0;
}
