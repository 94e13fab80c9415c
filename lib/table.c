/* SPDX-License-Identifier: MIT */
/*
 * table.c - the RCU record table: a slot array indexed by the id.
 *
 * WHY IT IS CORRECT
 *
 * Ids.  A record's id encodes its slot and the slot's generation:
 * raw = gen << SLOT_BITS | slot, id = raw ^ key, with a random per-engine
 * key (getrandom), so ids differ between engines, processes and restarts.
 * A slot's generation grows each time the slot is handed out, so the
 * (slot, gen) pairs, and hence the ids, never repeat within an engine (40
 * bits of generation per slot), and the raw value that would give id 0 is
 * skipped.  Lookup is one index and one compare: no hashing.
 *
 * Slots.  Chunks of CHUNK slots are allocated as needed and never freed
 * before the table is destroyed, so a slot's memory is always valid.
 * Free slots sit on a Treiber stack whose head carries a tag bumped by
 * every push and pop (no ABA).  A dispatch pops a slot before its record
 * is visible (table_reserve, which may fail with -ENOMEM: the dispatch is
 * then refused with nothing done), stores the record pointer (insert,
 * release) and sets the slot's bit in its chunk's `used` map; eviction
 * clears the bit and the pointer and pushes the slot back.
 *
 * Readers.  Lookup and list run inside rcu_read_lock (liburcu's
 * "bulletproof" flavour, which registers a thread lazily on its first read
 * lock, so any application thread may call them unregistered).  They never
 * write and never wait.  A record they find stays readable until they
 * unlock: the last reference is dropped with call_rcu (record.c), which
 * runs only after every read-side section that could have seen it ended.
 * A slot may be reused while a reader holds the old pointer: the reader
 * checks rec->id against the id it looked for, and the old record's memory
 * is still valid.  List and the scans walk the `used` words of the chunks
 * allocated so far: their cost is the records plus 16 words per 1024
 * slots ever used, not the configured capacity.
 *
 * What they read.  Immutable fields (I) directly; `state`, `remaining`,
 * `cancel`, `cost_bits` atomically; the finaliser's figures (F: the
 * done_* copies of the event's, beside `state`) only after an acquire
 * load saw state == FINISHED, which pairs with the finaliser's release
 * store made after it wrote them.
 *
 * Pruning.  Finished records are kept in `kept`, a ring of keep_completed
 * slots indexed by finish_seq mod K.  A finaliser, AFTER publishing its
 * event, CASes its record into slot finish_seq % K, evicting the record
 * there if that one is older, or evicting itself if a newer one (same slot,
 * so at least K later) already got there first.  A record r is evicted only
 * by the arrival of a record with finish_seq >= r.finish_seq + K in the same
 * slot; finish_seq values are taken in finalisation order, so at least K
 * delegations finished after r: invariant 4 of the design.  Eviction =
 * clearing its slot (inside the read lock) + dropping the table's
 * reference.
 */
#include "internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#define SLOT_BITS 24u
#define SLOT_MASK ((1u << SLOT_BITS) - 1)
#define CHUNK_SHIFT 10u
#define CHUNK (1u << CHUNK_SHIFT)
#define MAX_CHUNKS (1u << (SLOT_BITS - CHUNK_SHIFT))
#define GEN_MASK ((1ull << (64 - SLOT_BITS)) - 1)

int fanout__rcu_token;

struct slot_chunk {
	/* A: bit i set while slot i holds a record (list walks these). */
	_Atomic uint64_t used[CHUNK / 64];
	_Atomic(struct record *) rec[CHUNK]; /* A */
	_Atomic uint64_t gen[CHUNK];	     /* A: bumped per hand-out */
	_Atomic uint32_t next[CHUNK];	     /* A: free stack link, idx+1 */
};

struct fanout_table {
	uint64_t key;		    /* I: id scramble */
	_Atomic uint32_t nchunks;   /* A: chunks allocated, grow only */
	_Atomic uint64_t free_head; /* A: tag << 32 | (slot + 1); 0 = none */
	_Atomic(struct slot_chunk *) chunk[MAX_CHUNKS]; /* A: set once */
};

static uint64_t random_key(void)
{
	uint64_t k = 0;

	if (getrandom(&k, sizeof(k), GRND_NONBLOCK) != sizeof(k)) {
		/* No entropy source: still differ between processes. */
		struct timespec ts;

		clock_gettime(CLOCK_REALTIME, &ts);
		k = (uint64_t)ts.tv_nsec * 0x9e3779b97f4a7c15ull ^
		    (uint64_t)ts.tv_sec << 20 ^ (uint64_t)getpid() << 40 ^
		    (uint64_t)(uintptr_t)&k;
	}
	return k;
}

int fanout__table_init(struct fanout_engine *e)
{
	unsigned k = e->cfg.keep_completed, i;
	struct fanout_table *t;

	e->kept = fanout__alloc(sizeof(*e->kept) * k);
	if (!e->kept)
		return -ENOMEM;
	for (i = 0; i < k; i++)
		atomic_init(&e->kept[i], NULL);
	t = fanout__alloc(sizeof(*t));
	if (!t) {
		fanout__free(e->kept, sizeof(*e->kept) * k);
		e->kept = NULL;
		return -ENOMEM;
	}
	memset(t, 0, sizeof(*t));
	t->key = random_key();
	e->table = t;
	return 0;
}

static struct slot_chunk *chunk_of(struct fanout_table *t, uint32_t slot)
{
	/* acquire: pairs with the release CAS that installed the chunk. */
	return atomic_load_explicit(&t->chunk[slot >> CHUNK_SHIFT],
				    memory_order_acquire);
}

/* Push slots [first, first + n) of one chunk, already linked, as one. */
static void free_push(struct fanout_table *t, uint32_t first, uint32_t last)
{
	struct slot_chunk *c = chunk_of(t, last);
	uint64_t h = atomic_load_explicit(&t->free_head, memory_order_relaxed);
	uint64_t nh;

	do {
		/* relaxed: published by the release CAS below. */
		atomic_store_explicit(&c->next[last & (CHUNK - 1)], (uint32_t)h,
				      memory_order_relaxed);
		nh = ((h >> 32) + 1) << 32 | (first + 1);
		/* release: the link above is seen by the popper's acquire. */
	} while (!atomic_compare_exchange_weak_explicit(&t->free_head, &h, nh,
							memory_order_release,
							memory_order_relaxed));
}

/* A new chunk: slot 0 for the caller, the rest onto the free stack. */
static int grow(struct fanout_table *t, uint32_t *slot)
{
	uint32_t n = atomic_load_explicit(&t->nchunks, memory_order_acquire);
	struct slot_chunk *c, *none = NULL;
	uint32_t base, i;

	if (n >= MAX_CHUNKS)
		return -ENOMEM;
	c = fanout__alloc(sizeof(*c));
	if (!c)
		return -ENOMEM;
	memset(c, 0, sizeof(*c));
	base = n << CHUNK_SHIFT;
	for (i = 1; i + 1 < CHUNK; i++)
		atomic_init(&c->next[i], base + i + 2);
	/* release: the zeroed chunk is seen by whoever loads the pointer;
	 * acquire on failure: another grower's chunk n is installed. */
	if (!atomic_compare_exchange_strong_explicit(&t->chunk[n], &none, c,
						     memory_order_release,
						     memory_order_acquire)) {
		fanout__free(c, sizeof(*c));
		/* Wait for the winner to publish the count; then pop. */
		while (atomic_load_explicit(&t->nchunks,
					    memory_order_acquire) == n)
			fq_spin_relax(0);
		return 1;
	}
	/* release: pairs with the walkers' acquire of nchunks. */
	atomic_store_explicit(&t->nchunks, n + 1, memory_order_release);
	free_push(t, base + 1, base + CHUNK - 1);
	*slot = base;
	return 0;
}

/* Take a free slot for @rec and give it its id.  0 or -ENOMEM. */
int fanout__table_reserve(struct fanout_engine *e, struct record *rec)
{
	struct fanout_table *t = e->table;
	uint32_t slot;
	uint64_t h, gen, raw;
	struct slot_chunk *c;

	for (;;) {
		/* acquire: sees the pushed slot's link (free_push). */
		h = atomic_load_explicit(&t->free_head, memory_order_acquire);
		if (!(uint32_t)h) {
			int err = grow(t, &slot);

			if (err < 0)
				return err;
			if (err == 0)
				break;
			continue;
		}
		slot = (uint32_t)h - 1;
		c = chunk_of(t, slot);
		/* relaxed: a stale link fails the tagged CAS below. */
		uint32_t nx = atomic_load_explicit(&c->next[slot & (CHUNK - 1)],
						   memory_order_relaxed);
		/* acquire: as the load above, for the next pop. */
		if (atomic_compare_exchange_weak_explicit(
			    &t->free_head, &h, ((h >> 32) + 1) << 32 | nx,
			    memory_order_acquire, memory_order_relaxed))
			break;
	}
	c = chunk_of(t, slot);
	do {
		/* relaxed: the slot is ours; the count only has to grow. */
		gen = atomic_fetch_add_explicit(&c->gen[slot & (CHUNK - 1)], 1,
						memory_order_relaxed) +
		      1;
		raw = (gen & GEN_MASK) << SLOT_BITS | slot;
	} while ((raw ^ t->key) == 0);
	rec->id = raw ^ t->key;
	return 0;
}

/* Caller holds the read lock. */
void fanout__table_insert(struct fanout_engine *e, struct record *rec)
{
	uint32_t slot = (uint32_t)((rec->id ^ e->table->key) & SLOT_MASK);
	struct slot_chunk *c = chunk_of(e->table, slot);
	unsigned i = slot & (CHUNK - 1);

	FQ_HANDOFF_RELEASE(rec);
	/* release: a reader that loads the pointer sees the record. */
	atomic_store_explicit(&c->rec[i], rec, memory_order_release);
	/* release: a walker that sees the bit sees the pointer. */
	atomic_fetch_or_explicit(&c->used[i / 64], 1ull << (i % 64),
				 memory_order_release);
}

/* Caller holds the read lock; the result is valid until it unlocks. */
struct record *fanout__table_find(struct fanout_engine *e, fanout_id id)
{
	struct fanout_table *t = e->table;
	uint32_t slot = (uint32_t)((id ^ t->key) & SLOT_MASK);
	struct slot_chunk *c;
	struct record *rec;

	if ((slot >> CHUNK_SHIFT) >=
	    atomic_load_explicit(&t->nchunks, memory_order_acquire))
		return NULL;
	c = chunk_of(t, slot);
	/* acquire: pairs with the release store in insert. */
	rec = atomic_load_explicit(&c->rec[slot & (CHUNK - 1)],
				   memory_order_acquire);
	if (!rec)
		return NULL;
	FQ_HANDOFF_ACQUIRE(rec);
	return rec->id == id ? rec : NULL;
}

/* Caller holds the read lock. */
static void evict(struct fanout_engine *e, struct record *rec)
{
	uint32_t slot = (uint32_t)((rec->id ^ e->table->key) & SLOT_MASK);
	struct slot_chunk *c = chunk_of(e->table, slot);
	unsigned i = slot & (CHUNK - 1);
	struct record *cur = rec;

	/* relaxed: the pointer's readers are protected by RCU, not by
	 * ordering; the CAS makes exactly one evicter drop the reference. */
	if (!atomic_compare_exchange_strong_explicit(&c->rec[i], &cur, NULL,
						     memory_order_relaxed,
						     memory_order_relaxed))
		return;
	/* relaxed: the bit is a hint for walkers, who re-check the slot. */
	atomic_fetch_and_explicit(&c->used[i / 64], ~(1ull << (i % 64)),
				  memory_order_relaxed);
	free_push(e->table, slot, slot);
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

/* Call fn on every record in the table, inside the read lock. */
static void walk(struct fanout_engine *e,
		 void (*fn)(struct record *rec, void *arg), void *arg)
{
	struct fanout_table *t = e->table;
	uint32_t n = atomic_load_explicit(&t->nchunks, memory_order_acquire);

	for (uint32_t ci = 0; ci < n; ci++) {
		struct slot_chunk *c = atomic_load_explicit(
			&t->chunk[ci], memory_order_acquire);

		for (unsigned w = 0; w < CHUNK / 64; w++) {
			/* acquire: pairs with insert's release fetch_or. */
			uint64_t bits = atomic_load_explicit(
				&c->used[w], memory_order_acquire);

			while (bits) {
				unsigned i = w * 64 + __builtin_ctzll(bits);
				/* acquire: as in find. */
				struct record *rec = atomic_load_explicit(
					&c->rec[i], memory_order_acquire);

				bits &= bits - 1;
				if (!rec)
					continue;
				FQ_HANDOFF_ACQUIRE(rec);
				fn(rec, arg);
			}
		}
	}
}

void fanout__table_for_each(struct fanout_engine *e,
			    void (*fn)(struct record *rec, void *arg),
			    void *arg)
{
	fanout__read_lock();
	walk(e, fn, arg);
	fanout__read_unlock();
}

static void evict_one(struct record *rec, void *arg)
{
	evict(arg, rec);
}

/* Quiescent engine: every record is finished and no call is running. */
void fanout__table_destroy(struct fanout_engine *e)
{
	struct fanout_table *t = e->table;
	unsigned i;

	if (!t)
		return;
	fanout__read_lock();
	walk(e, evict_one, e);
	fanout__read_unlock();
	for (i = 0; i < e->cfg.keep_completed; i++)
		atomic_store_explicit(&e->kept[i], NULL,
				      memory_order_relaxed); /* quiescent */
	fanout__free(e->kept, sizeof(*e->kept) * e->cfg.keep_completed);
	e->kept = NULL;
	/* The records are freed after a grace period (call_rcu); the chunks
	 * hold only their pointers, and no reader is left (quiescent). */
	for (i = 0; i < MAX_CHUNKS; i++) {
		struct slot_chunk *c = atomic_load_explicit(
			&t->chunk[i], memory_order_relaxed);

		if (!c)
			break;
		fanout__free(c, sizeof(*c));
	}
	fanout__free(t, sizeof(*t));
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
	/* acquire: pairs with the release store of FINISHED in finalise.
	 * A finished record is read from two lines: its head (line 0) and
	 * the line of `state`, where the finaliser copied the event's
	 * figures (done_*); the running-only fields are not touched.  With
	 * many records each line read is a cache miss: `make lookup-lines`
	 * (20k records, 2 MiB LL) counts 1.4 LL misses per lookup, 5.9 when
	 * the event and the running-only fields were read too.  npending is 0
	 * then: every deferred child's decrement came before its join
	 * subtraction, hence before the store. */
	if (atomic_load_explicit(&rec->state, memory_order_acquire) ==
	    REC_FINISHED) {
		info->cancelled = rec->done_cancelled;
		info->status = (enum fanout_status)rec->done_status;
		info->ndone = rec->ntasks;
		info->completed_ns = rec->done_ns;
		info->cost = rec->done_cost;
	} else {
		/* relaxed: progress figures, no data read through them. */
		unsigned i, ndone;

		/* Bits set after CANCEL_FINAL belong to a cancel that got
		 * -EALREADY (the FINISHED branch reads the event's). */
		info->cancelled = (atomic_load_explicit(&rec->cancel,
							memory_order_relaxed) &
				   CANCEL_BY_CALLER) != 0;
		info->npending = atomic_load_explicit(&rec->npending,
						      memory_order_relaxed);
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
	if (fanout__inherited(e->fork_gen))
		return -EOWNERDEAD;
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

struct list_state {
	struct fanout_info *infos;
	size_t cap, seen, used;
};

static void list_one(struct record *rec, void *arg)
{
	struct list_state *l = arg;
	struct fanout_info info;

	l->seen++;
	if (!l->cap)
		return;
	snapshot(rec, &info);
	if (l->used < l->cap) {
		l->infos[l->used] = info;
		sift_up(l->infos, l->used++);
	} else if (info.dispatched_ns > l->infos[0].dispatched_ns) {
		l->infos[0] = info;
		sift_down(l->infos, l->used, 0);
	}
}

int fanout_list(struct fanout_engine *e, struct fanout_info *infos, size_t cap,
		size_t *n)
{
	struct list_state l = {.infos = infos, .cap = cap};

	if (!e || !n || (!infos && cap))
		return -EINVAL;
	if (fanout__inherited(e->fork_gen))
		return -EOWNERDEAD;
	fanout__table_for_each(e, list_one, &l);
	if (l.used > 1)
		qsort(infos, l.used, sizeof(*infos), newest_first);
	*n = l.seen;
	return 0;
}
