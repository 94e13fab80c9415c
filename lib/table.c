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
 * bits of generation per slot: a slot whose last generation was handed
 * out is retired, never handed out again), and the raw value that would
 * give id 0 is skipped.  Lookup is one index and one compare: no hashing.
 *
 * Slots.  Chunks of CHUNK slots are allocated as needed and never freed
 * before the table is destroyed, so a slot's memory is always valid.
 * Free slots sit on a Treiber stack whose head carries a tag bumped by
 * every push and pop (no ABA).  A dispatch pops a slot before its record
 * is visible (table_reserve, which may fail with -ENOMEM: the dispatch is
 * then refused with nothing done), stores the record pointer (insert,
 * release) and sets the slot's bit in its chunk's `used` map; eviction
 * clears the bit and the pointer and pushes the slot back.  The record
 * keeps its slot and the slot's chunk (rec->tslot, rec->tchunk), so the
 * insert, the tomb and the event's free need not derive them from the id
 * (the key's and the chunk array's loads; 25 instructions fewer a batch-1
 * fanout_run, bench/PROFILE.txt phase 20).
 *
 * Slot cache.  A thread keeps up to TSTAT_SLOTS free slots of its own in
 * its per-thread block (engine.c, "Per-thread counters"): eviction puts the
 * slot there while there is room, and table_reserve takes from there
 * first, so a thread that frees what it dispatched (fanout_run, or a
 * consumer that also dispatches) makes no CAS on the shared stack either
 * way (two locked instructions, ~8% of a batch-1 fanout_run; bench/
 * PROFILE.txt phase 17).  A cached slot is free exactly as one on the
 * stack: its pointer is NULL before it is cached, and the thread that
 * takes it is the one that put it there (program order stands in for the
 * stack's release/acquire).  Its `used` bit stays set (one RMW fewer per
 * delegation, phase 18): walkers skip its NULL pointer as they skip a
 * slot emptied under them, and the insert that reuses it sets the bit
 * again all the same (that RMW is also recheck's fence, deleg.c).  A
 * thread that exits leaves its cached slots to the next thread with its
 * pthread id, or unused: at most TSTAT_SLOTS per thread, which only makes
 * the table grow a chunk sooner.
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
 * Tombs.  Each slot has a tomb beside it in its chunk: a fixed-size
 * summary of a finished record (what fanout_info shows, the session key
 * if it fits).  The finaliser writes its slot's tomb BEFORE publishing the
 * event (fanout__table_tomb).  Once the event is freed, the record is
 * needed only for lookup and list, so fanout_event_free() swaps the
 * slot's pointer from the record to the tagged tomb (a store: until the
 * record's tomb enters the kept ring, after this, nobody else writes the
 * slot) and drops the table's reference with its own: a kept
 * finished record costs its tomb, ~128 bytes, instead of its whole block,
 * and the block goes back to the allocator (and the block cache) warm,
 * one grace period later.  A tomb is rewritten only by the next owner of
 * its slot, after the slot was evicted and handed out again, so a reader
 * that races with that write reads a torn tomb: the tomb's sequence
 * count (odd while written) and its id, both checked after the copy, make
 * the reader retry or miss (the id it looked for is gone).
 *
 * Pruning.  Finished records are kept in `kept`, a ring of keep_completed
 * entries indexed by finish_seq mod K.  An entry names one finished
 * record: its table slot and its lap, finish_seq / K (kept_entry()), so
 * two records of one slot never look alike and the entry itself says
 * which is older: no tomb is read.  (Entries were the slots' tombs, which
 * the slot's next record reuses: a freer delayed between its load and its
 * CAS found the same pointer for a newer record of that slot and evicted
 * it, or read the newer one's finish_seq and evicted itself, both before
 * K newer records had finished.)  Whoever frees a record's event
 * (fanout_event_free, or fanout_sink_destroy for events nobody took)
 * CASes its entry into slot finish_seq % K, evicting the one there if that
 * one is older, or evicting itself if a newer one (same slot, so at least
 * K later) already got there first.  So a record whose event is not freed
 * is never pruned, and the ring, the slots and the free stack stay on the
 * thread that frees events, usually the one that pops the slots again to
 * dispatch: when the finaliser pruned, a worker and the dispatcher pulled
 * these lines across for every delegation (batch 1 with 16 in flight:
 * 0.71M children/s against 0.81M; bench/PROFILE.txt, phase 12).  A record
 * r is evicted only by the arrival of a record with finish_seq >=
 * r.finish_seq + K in the same slot; finish_seq values are taken in
 * finalisation order, so at least K delegations finished after r:
 * invariant 4 of the design.  Eviction = storing NULL in its slot, which
 * hands the table's reference to the evicter if the pointer was still the
 * record (the swap to the tomb dropped it otherwise), then pushing the
 * slot back.  No RMW: the ring's CAS that chose the evicter came after
 * the freer's, which came after the freer's swap, so the slot has one
 * writer at a time.  Pruning needs no read lock: it touches the kept
 * ring and slot chunks, which live as long as the table, and a record
 * only through the reference the slot held.  Laps are compared modulo
 * 2^KEPT_LAP_BITS: an event still unfreed after 2^(KEPT_LAP_BITS - 1) laps
 * (2.7e11 x keep_completed delegations) would be judged newer than it is.
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

/* A finished record's summary (see "Tombs").  Every field is written by
 * the slot's owner inside the odd phase of `seq` and read by anyone, so
 * they are relaxed atomics. */
#define TOMB_KEY 48 /* bytes of session key a tomb holds, NUL included */
#define TOMB_BG 0x10000u
#define TOMB_CANCELLED 0x20000u
/* The record's children started delegations, or deferred (has_kids()):
 * key[0..1] hold its own
 * parent_id and parent_engine, so the cancel tree finds it among its
 * parent's kids and walks on to its own (fanout__table_kid_tombs); the
 * session key follows them. */
#define TOMB_KIDS 0x40000u
#define TOMB_LINK 2	      /* words of key[] the link takes */
#define TOMB_HAS_KEY 0x80000u /* key[] holds the session key */
#define TOMB_DEPTH 0xffffu

struct fanout_tomb {
	/* What a lookup reads: one line. */
	_Atomic uint32_t seq;	/* A: odd while the owner writes */
	_Atomic uint32_t flags; /* depth | TOMB_* */
	_Atomic uint64_t id, dispatched_ns, completed_ns, cost;
	_Atomic(void *) user;
	_Atomic uint32_t ntasks, status, npending;
	/* The slot and the session key (read only if there is one). */
	uint32_t slot __attribute__((aligned(CACHELINE))); /* I */
	_Atomic uint64_t key[TOMB_KEY / 8];
} __attribute__((aligned(CACHELINE)));

/* Whether @rec's tomb keeps its place in the cancel tree: it has kids
 * (set while it ran, tree.c "Links"), or it may have one this finaliser
 * does not see - a dispatch hanging from one of its deferred children
 * links it with nothing ordering the link before this read, the child
 * still unfinished at the dispatch's re-check (tree.c, "Late kids").
 * relaxed: both were written before the join's acquire that ended it, or
 * are that late link, which the tomb then does not need to see. */
static bool has_kids(const struct record *rec)
{
	return atomic_load_explicit(&rec->has_kids, memory_order_relaxed) ||
	       atomic_load_explicit(&rec->pendings, memory_order_relaxed);
}

/* Whether @rec's session key (if any) fits in a tomb, after the link if
 * it has kids. */
static bool key_fits(const struct record *rec)
{
	if (!rec->session_key)
		return true; /* the usual case: no look at has_kids */
	return strlen(rec->session_key) <
	       TOMB_KEY - (has_kids(rec) ? TOMB_LINK * 8 : 0);
}

/* A slot's pointer: a record, or its tomb with bit 0 set. */
#define TOMB_TAG 1u
#define IS_TOMB(p) (((uintptr_t)(p)) & TOMB_TAG)
#define TOMB_OF(p)                                                             \
	((struct fanout_tomb *)((uintptr_t)(p) & ~(uintptr_t)TOMB_TAG))

struct slot_chunk {
	/* A: bit i set while slot i holds a record (list walks these). */
	_Atomic uint64_t used[CHUNK / 64];
	_Atomic(struct record *) rec[CHUNK]; /* A: record or tagged tomb */
	_Atomic uint64_t gen[CHUNK];	     /* A: bumped per hand-out */
	_Atomic uint32_t next[CHUNK];	     /* A: free stack link, idx+1 */
	struct fanout_tomb tomb[CHUNK];
};

struct fanout_table {
	/* Read by every lookup and event free: apart from free_head, which
	 * dispatches and evictions write. */
	uint64_t key;		  /* I: id scramble */
	_Atomic uint32_t nchunks; /* A: chunks allocated, grow only */
	_Atomic(struct slot_chunk *) chunk[MAX_CHUNKS]; /* A: set once */
	/* A: tag << 32 | (slot + 1); 0 = none */
	_Atomic uint64_t free_head __attribute__((aligned(CACHELINE)));
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
		atomic_init(&e->kept[i], 0);
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

static struct fanout_tomb *tomb_at(struct fanout_table *t, uint32_t slot)
{
	return &chunk_of(t, slot)->tomb[slot & (CHUNK - 1)];
}

static uint32_t slot_of(const struct fanout_engine *e, fanout_id id)
{
	return (uint32_t)((id ^ e->table->key) & SLOT_MASK);
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
	for (i = 0; i < CHUNK; i++)
		c->tomb[i].slot = base + i;
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
	struct fanout_tstats *ts;

	ts = fanout__tstats(e);
again:
	if (ts && ts->nslots) {
		slot = ts->slots[--ts->nslots]; /* "Slot cache" */
		goto got;
	}
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
got:
	c = chunk_of(t, slot);
	/* relaxed, and no RMW: the slot is ours alone until it is pushed
	 * back (the pop's acquire saw the last owner's release push), and
	 * nobody else reads the count. */
	gen = atomic_load_explicit(&c->gen[slot & (CHUNK - 1)],
				   memory_order_relaxed);
	do {
		gen++;
		raw = (gen & GEN_MASK) << SLOT_BITS | slot;
	} while ((raw ^ t->key) == 0);
	/* "Ids": every generation of the slot was handed out; a next one
	 * would repeat the id of its first record.  The slot is retired:
	 * never pushed back, its pointer NULL (walkers skip it), its chunk
	 * kept with the others.  (2^40 hand-outs of one slot.) */
	if (__builtin_expect(gen > GEN_MASK, 0))
		goto again;
	atomic_store_explicit(&c->gen[slot & (CHUNK - 1)], gen,
			      memory_order_relaxed);
	rec->id = raw ^ t->key;
	rec->tchunk = c;
	rec->tslot = slot;
	return 0;
}

/* No read lock needed: it dereferences nothing RCU protects (chunks live
 * until the table is destroyed). */
void fanout__table_insert(struct fanout_engine *e, struct record *rec)
{
	struct slot_chunk *c = rec->tchunk;
	unsigned i = rec->tslot & (CHUNK - 1);

	FQ_HANDOFF_RELEASE(rec);
	/* release: a reader that loads the pointer sees the record. */
	atomic_store_explicit(&c->rec[i], rec, memory_order_release);
	/* release: a walker that sees the bit sees the pointer.  seq_cst:
	 * also the store of deleg.c's insert; fence; load of `shutting`
	 * (recheck), whose walkers load this word after their fence. */
	atomic_fetch_or_explicit(&c->used[i / 64], 1ull << (i % 64),
				 memory_order_seq_cst);
}

/* What @id's slot holds now: a record, a tagged tomb or NULL (also for an
 * id whose chunk was never allocated).  Caller holds the read lock. */
static struct record *slot_load(struct fanout_engine *e, fanout_id id)
{
	struct fanout_table *t = e->table;
	uint32_t slot = slot_of(e, id);

	/* acquire: pairs with grow()'s release store of the count, made
	 * after its chunk was installed: chunk_of() below finds it. */
	if ((slot >> CHUNK_SHIFT) >=
	    atomic_load_explicit(&t->nchunks, memory_order_acquire))
		return NULL;
	/* acquire: pairs with the release store in insert, or with the
	 * release CAS that put a tomb there (fanout__table_compact). */
	return atomic_load_explicit(&chunk_of(t, slot)->rec[slot & (CHUNK - 1)],
				    memory_order_acquire);
}

/* A finished record's tomb sits at its slot: its line is fetched while
 * the slot's pointer is loaded, so that looking up a kept record waits for
 * one memory read instead of two in a row (bench/PROFILE.txt phase 18).
 * A running record's lookup fetches one line it does not read. */
static void tomb_prefetch(struct fanout_engine *e, fanout_id id)
{
	struct fanout_table *t = e->table;
	uint32_t slot = slot_of(e, id);

	/* acquire: as in slot_load(). */
	if ((slot >> CHUNK_SHIFT) <
	    atomic_load_explicit(&t->nchunks, memory_order_acquire))
		__builtin_prefetch(tomb_at(t, slot));
}

/* Caller holds the read lock; the result is valid until it unlocks. */
struct record *fanout__table_find(struct fanout_engine *e, fanout_id id)
{
	struct record *rec = slot_load(e, id);

	if (!rec || IS_TOMB(rec))
		return NULL; /* a tomb: finished, its block gone */
	FQ_HANDOFF_ACQUIRE(rec);
	return rec->id == id ? rec : NULL;
}

/* Copy @tb into @info if it is a consistent tomb of @id (any id if 0);
 * false if it is being rewritten (retry) or is another record's. */
static bool read_tomb(const struct fanout_tomb *tb, fanout_id id,
		      struct fanout_info *info, bool *retry)
{
	/* acquire: pairs with the release store that closed the writer's
	 * odd phase (fanout__table_tomb). */
	uint32_t s = atomic_load_explicit(&tb->seq, memory_order_acquire);
	uint32_t flags;

	*retry = false;
	if (s & 1) {
		*retry = true;
		return false;
	}
	memset(info, 0, sizeof(*info));
	/* relaxed: validated by the sequence count below. */
	info->id = atomic_load_explicit(&tb->id, memory_order_relaxed);
	info->ntasks = atomic_load_explicit(&tb->ntasks, memory_order_relaxed);
	info->ndone = info->ntasks;
	info->status = (enum fanout_status)atomic_load_explicit(
		&tb->status, memory_order_relaxed);
	info->dispatched_ns =
		atomic_load_explicit(&tb->dispatched_ns, memory_order_relaxed);
	info->completed_ns =
		atomic_load_explicit(&tb->completed_ns, memory_order_relaxed);
	info->cost = fanout__bits_to_double(
		atomic_load_explicit(&tb->cost, memory_order_relaxed));
	info->user = atomic_load_explicit(&tb->user, memory_order_relaxed);
	info->npending =
		atomic_load_explicit(&tb->npending, memory_order_relaxed);
	flags = atomic_load_explicit(&tb->flags, memory_order_relaxed);
	/* acquire fence: the loads above complete before the re-read. */
	atomic_thread_fence(memory_order_acquire);
	if (atomic_load_explicit(&tb->seq, memory_order_relaxed) != s) {
		*retry = true;
		return false;
	}
	if (id && info->id != id)
		return false;
	info->depth = flags & TOMB_DEPTH;
	info->background = (flags & TOMB_BG) != 0;
	info->cancelled = (flags & TOMB_CANCELLED) != 0;
	/* The pointer points at the tomb's copy, valid until the slot is
	 * pruned (fanout_info.session_key); a lookup reads only the first
	 * line of the tomb. */
	info->session_key =
		flags & TOMB_HAS_KEY ?
			(const char *)(const void *)(tb->key +
						     (flags & TOMB_KIDS ?
							      TOMB_LINK :
							      0)) :
			NULL;
	return true;
}

/* Whether @id is a finished record whose block is gone (its tomb is in
 * the table).  Caller holds the read lock. */
bool fanout__table_finished(struct fanout_engine *e, fanout_id id)
{
	struct fanout_info info;
	struct record *p;
	bool retry;

	do {
		p = slot_load(e, id);
		if (!IS_TOMB(p))
			return false;
	} while (!read_tomb(TOMB_OF(p), id, &info, &retry) && retry);
	return !retry && info.id == id;
}

/* Empty slot @slot (its record finished, its tomb left the kept ring):
 * exchange the pointer for NULL - if it was still the record, the table's
 * reference is ours to drop - and push the slot back.  No read lock
 * needed (see "Pruning"). */
static void evict(struct fanout_engine *e, uint32_t slot)
{
	struct slot_chunk *c = chunk_of(e->table, slot);
	unsigned i = slot & (CHUNK - 1);
	struct fanout_tstats *ts;
	/* relaxed: the slot is written by nobody but its one evicter (the
	 * kept ring's CAS chose us, after the event's freer swapped in the
	 * tomb, if it did, before its own CAS into the ring; or the table
	 * is quiescent) until it is handed out again, after this: no RMW. */
	struct record *p =
		atomic_load_explicit(&c->rec[i], memory_order_relaxed);

	if (!p)
		return;
	/* release: for the slot's next owner, as the push's. */
	atomic_store_explicit(&c->rec[i], NULL, memory_order_release);
	ts = fanout__tstats(e);
	if (ts && ts->nslots < TSTAT_SLOTS) {
		/* "Slot cache": the bit stays set, for the insert that
		 * reuses the slot. */
		ts->slots[ts->nslots++] = slot;
	} else {
		/* relaxed: the bit is a hint for walkers, who re-check the
		 * slot. */
		atomic_fetch_and_explicit(&c->used[i / 64], ~(1ull << (i % 64)),
					  memory_order_relaxed);
		free_push(e->table, slot, slot);
	}
	if (!IS_TOMB(p))
		fanout__rec_put(p, 1);
}

/*
 * Write @rec's tomb: the finaliser, after the event's fields and
 * finish_seq are set, BEFORE the event is published (so a consumer that
 * frees it at once finds the tomb complete).  relaxed stores inside the
 * seqcount's odd phase; the release fence and store close it.
 */
void fanout__table_tomb(struct fanout_engine *e, struct record *rec)
{
	struct fanout_tomb *tb = &rec->tchunk->tomb[rec->tslot & (CHUNK - 1)];
	uint32_t s = atomic_load_explicit(&tb->seq, memory_order_relaxed);
	uint32_t flags = rec->depth & TOMB_DEPTH;
	size_t klen = rec->session_key ? strlen(rec->session_key) + 1 : 0;

	atomic_store_explicit(&tb->seq, s + 1, memory_order_relaxed);
	/* release fence: the odd count is seen before any field below
	 * (pairs with the reader's acquire fence in read_tomb). */
	atomic_thread_fence(memory_order_release);
	atomic_store_explicit(&tb->id, rec->id, memory_order_relaxed);
	atomic_store_explicit(&tb->dispatched_ns, rec->dispatched_ns,
			      memory_order_relaxed);
	atomic_store_explicit(&tb->completed_ns, rec->ev.completed_ns,
			      memory_order_relaxed);
	atomic_store_explicit(&tb->cost, fanout__double_to_bits(rec->ev.cost),
			      memory_order_relaxed);
	atomic_store_explicit(&tb->user, rec->user, memory_order_relaxed);
	atomic_store_explicit(&tb->ntasks, rec->ntasks, memory_order_relaxed);
	atomic_store_explicit(&tb->status, rec->ev.status,
			      memory_order_relaxed);
	atomic_store_explicit(
		&tb->npending,
		atomic_load_explicit(&rec->npending, memory_order_relaxed),
		memory_order_relaxed);
	if (rec->background)
		flags |= TOMB_BG;
	if (rec->ev.cancelled)
		flags |= TOMB_CANCELLED;
	if (has_kids(rec)) {
		atomic_store_explicit(&tb->key[0], rec->parent_id,
				      memory_order_relaxed);
		atomic_store_explicit(&tb->key[1], rec->parent_engine,
				      memory_order_relaxed);
		flags |= TOMB_KIDS;
	}
	/* A key that does not fit is not copied: fanout__table_compact keeps
	 * such a record whole (the same test). */
	if (klen && key_fits(rec)) {
		unsigned at = flags & TOMB_KIDS ? TOMB_LINK : 0;
		uint64_t w[TOMB_KEY / 8] = {0};

		memcpy(w, rec->session_key, klen);
		for (unsigned i = at; i < TOMB_KEY / 8; i++)
			atomic_store_explicit(&tb->key[i], w[i - at],
					      memory_order_relaxed);
		flags |= TOMB_HAS_KEY;
	}
	atomic_store_explicit(&tb->flags, flags, memory_order_relaxed);
	/* release: closes the odd phase; pairs with read_tomb's acquire. */
	atomic_store_explicit(&tb->seq, s + 2, memory_order_release);
}

/*
 * fanout_event_free(): the event is gone, so the record is needed only
 * for lookup and list; if its slot still holds it and its tomb says all
 * lookup needs, swap in the tomb.  Returns how many references the caller
 * drops: 2 (the event's and the table's, now ours) or 1 (the event's).
 */
uint32_t fanout__table_compact(struct record *rec)
{
	struct slot_chunk *c = rec->tchunk;
	struct fanout_tomb *tb = &c->tomb[rec->tslot & (CHUNK - 1)];

	/* Decided from the record, which the caller's thread wrote at
	 * dispatch: the tomb's own lines are the finaliser's. */
	if (!key_fits(rec))
		return 1; /* the session key did not fit: keep the record */
	/* No RMW: nobody else writes the slot now.  Only an evicter does,
	 * chosen by the kept ring's CAS that displaces this record's tomb,
	 * which comes after our own CAS that puts it there
	 * (fanout__table_retire, after this), or fanout__table_destroy on a
	 * quiescent engine.  release: publishes the tomb to readers that
	 * load the tagged pointer, and (through the kept ring's CAS) to the
	 * evicter, which then drops only the record's event reference. */
	atomic_store_explicit(&c->rec[rec->tslot & (CHUNK - 1)],
			      (struct record *)((uintptr_t)tb | TOMB_TAG),
			      memory_order_release);
	return 2;
}

/* A kept ring entry (see "Pruning"): bit 63 set (0 is an empty entry),
 * the lap finish_seq / K in the bits above the slot's. */
#define KEPT_USED (1ull << 63)
#define KEPT_LAP_BITS (63u - SLOT_BITS)
#define KEPT_LAP_MASK ((1ull << KEPT_LAP_BITS) - 1)

static uint64_t kept_entry(const struct fanout_engine *e,
			   const struct record *rec)
{
	uint64_t lap = rec->finish_seq / e->cfg.keep_completed;

	return KEPT_USED | (lap & KEPT_LAP_MASK) << SLOT_BITS | rec->tslot;
}

/* Whether entry @a names a record that finished after @b's, at least one
 * lap (K delegations) later: the same ring index, so not the same lap. */
static bool kept_newer(uint64_t a, uint64_t b)
{
	uint64_t d = ((a >> SLOT_BITS) - (b >> SLOT_BITS)) & KEPT_LAP_MASK;

	return d && d < (1ull << (KEPT_LAP_BITS - 1));
}

/* The event is being freed; no read lock needed: see "Pruning". */
void fanout__table_retire(struct fanout_engine *e, struct record *rec)
{
	_Atomic uint64_t *kslot =
		&e->kept[rec->finish_seq % e->cfg.keep_completed];
	uint64_t mine = kept_entry(e, rec);
	/* acquire: if we displace this entry, we evict its slot, which its
	 * freer compacted before its release CAS put the entry here. */
	uint64_t cur = atomic_load_explicit(kslot, memory_order_acquire);

	for (;;) {
		if (cur && kept_newer(cur, mine)) {
			evict(e, rec->tslot); /* one K or more newer is there */
			return;
		}
		FANOUT_TEST_POINT(FANOUT_AT_RETIRE_CAS, rec);
		/* release: publishes our compact (the slot's tomb) to the
		 * freer that will displace us and evict our slot. */
		if (atomic_compare_exchange_weak_explicit(kslot, &cur, mine,
							  memory_order_acq_rel,
							  memory_order_acquire))
			break;
	}
	if (cur)
		evict(e, (uint32_t)(cur & SLOT_MASK));
}

/* Call fn on every record in the table, inside the read lock; and
 * tomb_fn (if not NULL) on every tomb. */
static void walk(struct fanout_engine *e,
		 void (*fn)(struct record *rec, void *arg),
		 void (*tomb_fn)(const struct fanout_tomb *tb, void *arg),
		 void *arg)
{
	struct fanout_table *t = e->table;
	/* acquire: pairs with grow()'s release store of the count, so the
	 * n chunks below are installed; and each chunk's load with its
	 * release CAS there (the zeroed chunk). */
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
				if (IS_TOMB(rec)) {
					if (tomb_fn)
						tomb_fn(TOMB_OF(rec), arg);
					continue;
				}
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
	walk(e, fn, NULL, arg);
	fanout__read_unlock();
}

struct kid_tombs {
	fanout_id parent;
	uint64_t engine;
	void (*fn)(fanout_id kid, void *arg);
	void *arg;
};

static void skip_record(struct record *rec, void *arg)
{
	(void)rec;
	(void)arg;
}

static void kid_tomb(const struct fanout_tomb *tb, void *arg)
{
	const struct kid_tombs *k = arg;
	/* acquire: as in read_tomb. */
	uint32_t s = atomic_load_explicit(&tb->seq, memory_order_acquire);
	uint32_t flags;
	uint64_t id, pid, peng;

	if (s & 1)
		return; /* being rewritten: its record was pruned */
	/* relaxed: validated by the sequence count below. */
	flags = atomic_load_explicit(&tb->flags, memory_order_relaxed);
	id = atomic_load_explicit(&tb->id, memory_order_relaxed);
	pid = atomic_load_explicit(&tb->key[0], memory_order_relaxed);
	peng = atomic_load_explicit(&tb->key[1], memory_order_relaxed);
	/* acquire fence: the loads above complete before the re-read. */
	atomic_thread_fence(memory_order_acquire);
	if (atomic_load_explicit(&tb->seq, memory_order_relaxed) != s ||
	    !(flags & TOMB_KIDS) || pid != k->parent || peng != k->engine)
		return;
	k->fn(id, k->arg);
}

void fanout__table_kid_tombs(struct fanout_engine *e, fanout_id parent,
			     uint64_t engine,
			     void (*fn)(fanout_id kid, void *arg), void *arg)
{
	struct kid_tombs k = {parent, engine, fn, arg};

	fanout__read_lock();
	walk(e, skip_record, kid_tomb, &k);
	fanout__read_unlock();
}

/* fanout_test_age_slot(): a quiet engine, so relaxed and no RMW. */
int fanout__table_age_slot(struct fanout_engine *e, fanout_id id, uint64_t uses)
{
	struct fanout_table *t = e->table;
	uint32_t slot = slot_of(e, id);
	_Atomic uint64_t *g;

	/* acquire: as in slot_load(). */
	if ((slot >> CHUNK_SHIFT) >=
	    atomic_load_explicit(&t->nchunks, memory_order_acquire))
		return -ENOENT;
	g = &chunk_of(t, slot)->gen[slot & (CHUNK - 1)];
	atomic_store_explicit(
		g, atomic_load_explicit(g, memory_order_relaxed) + uses,
		memory_order_relaxed);
	return 0;
}

/* Quiescent engine: every record is finished and no call is running. */
void fanout__table_destroy(struct fanout_engine *e)
{
	struct fanout_table *t = e->table;
	unsigned i;

	if (!t)
		return;
	fanout__read_lock();
	for (i = 0; i < MAX_CHUNKS; i++) {
		struct slot_chunk *c = atomic_load_explicit(
			&t->chunk[i], memory_order_relaxed); /* quiescent */

		if (!c)
			break;
		for (unsigned k = 0; k < CHUNK; k++)
			if (atomic_load_explicit(&c->rec[k],
						 memory_order_relaxed))
				evict(e, c->tomb[k].slot);
	}
	fanout__read_unlock();
	for (i = 0; i < e->cfg.keep_completed; i++)
		atomic_store_explicit(&e->kept[i], 0,
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
	struct fanout_info tomb; /* *info is written only if @id is found */
	int err = -ENOENT;

	if (!e || !id || !info)
		return -EINVAL;
	if (fanout__inherited(e->fork_gen))
		return -EOWNERDEAD;
	fanout__read_lock();
	tomb_prefetch(e, id);
	for (;;) {
		bool retry = false;

		rec = slot_load(e, id);
		if (rec && !IS_TOMB(rec)) {
			FQ_HANDOFF_ACQUIRE(rec);
			if (rec->id == id) {
				snapshot(rec, info);
				err = 0;
			}
		} else if (rec && read_tomb(TOMB_OF(rec), id, &tomb, &retry)) {
			*info = tomb;
			err = 0;
		}
		if (!retry)
			break; /* a torn tomb: its slot is being reused */
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

static void list_info(struct list_state *l, const struct fanout_info *ip)
{
	struct fanout_info info = *ip;

	if (l->used < l->cap) {
		l->infos[l->used] = info;
		sift_up(l->infos, l->used++);
	} else if (info.dispatched_ns > l->infos[0].dispatched_ns) {
		l->infos[0] = info;
		sift_down(l->infos, l->used, 0);
	}
}

static void list_one(struct record *rec, void *arg)
{
	struct list_state *l = arg;
	struct fanout_info info;

	l->seen++;
	if (!l->cap)
		return;
	snapshot(rec, &info);
	list_info(l, &info);
}

static void list_tomb(const struct fanout_tomb *tb, void *arg)
{
	struct list_state *l = arg;
	struct fanout_info info;
	bool retry;

	/* A torn tomb is a slot being reused: its old record is gone and
	 * the new one not finished yet, so it is skipped, not retried. */
	if (!read_tomb(tb, 0, &info, &retry))
		return;
	l->seen++;
	if (l->cap)
		list_info(l, &info);
}

int fanout_list(struct fanout_engine *e, struct fanout_info *infos, size_t cap,
		size_t *n)
{
	struct list_state l = {.infos = infos, .cap = cap};

	if (!e || !n || (!infos && cap))
		return -EINVAL;
	if (fanout__inherited(e->fork_gen))
		return -EOWNERDEAD;
	fanout__read_lock();
	walk(e, list_one, list_tomb, &l);
	fanout__read_unlock();
	if (l.used > 1)
		qsort(infos, l.used, sizeof(*infos), newest_first);
	*n = l.seen;
	return 0;
}
