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
 * call_rcu, or, for a block under 1 MiB, keeps it in the thread's limbo
 * until the epochs say no read-side section can hold it
 * ("Limbo"), so lookups that found the record under fanout__read_lock
 * still read valid memory.
 */
#include "internal.h"

#include <errno.h>
#include <stddef.h>
#include <string.h>

/* ------------------------------------------------------------ lifetime */

/* jemalloc gives a thread whose first call is a free only a minimal
 * state, without a thread cache, and keeps it so while the thread never
 * allocates: every free then takes an arena lock.  The call_rcu thread
 * only frees, so it allocates once. */
static FQ_TLS bool freer_ready;

static void freer_init(void)
{
	void *p = fanout__alloc_unchecked(64);

	fanout__free(p, 64);
	freer_ready = true;
}

/* Free what a retired record owns apart from its block: the strings its
 * children set. */
static void release_strings(struct record *rec)
{
	unsigned i;

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
}

static void rec_free_one(struct record *rec)
{
	FQ_HANDOFF_ACQUIRE(&fanout__rcu_token);
	FQ_HANDOFF_ACQUIRE(rec);
	release_strings(rec);
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
	/* A block that left a limbo may belong to an engine destroyed since
	 * (a limbo serves any engine): it goes to the allocator. */
	if (rec->spilled)
		fanout__free(rec, rec->alloc_size);
	else
		fanout__blocks_free(&rec->e->blocks, rec, rec->alloc_size);
}

/* One grace period for a batch of records linked through free_next. */
static void rec_free_rcu(struct rcu_head *head)
{
	struct record *rec = caa_container_of(head, struct record, rcu), *next;

	if (!freer_ready)
		freer_init();
	FQ_HANDOFF_ACQUIRE(&fanout__rcu_token);
	/* The batcher's release (free_batch): its acquire of the stack made
	 * every push of the batch visible to it, hence to us. */
	FQ_HANDOFF_ACQUIRE(rec);
	for (; rec; rec = next) {
		next = rec->free_next;
		rec_free_one(rec);
	}
	/* TSan edge: this callback's use of the engine happens before the
	 * rcu_barrier() in fanout_destroy() returns (see annotate.h). */
	FQ_HANDOFF_RELEASE(&fanout__rcu_token);
}

/*
 * Batched reclamation.  A record whose last reference is gone is pushed on
 * its engine's `retired` stack, whose head carries the stack's length in
 * its low bits (records are cache-line aligned); the push that makes it
 * FREE_BATCH long takes the whole stack instead (CAS to empty) and hands
 * it to ONE call_rcu.  Push-only and take-all: no ABA.  Every record was
 * unreachable (out of the table, no reference) before its push, and the
 * call_rcu comes after every push of its batch, so the grace period
 * covers each of them.  A call_rcu costs the releasing thread ~150
 * instructions and, with liburcu's thread idle, a FUTEX_WAKE: once per
 * batch instead of per delegation.  At most FREE_BATCH - 1 records wait
 * here; fanout__rec_flush() hands them over (a consumer about to sleep,
 * fanout_destroy, fanout_test_quiesce).
 */
#define FREE_BATCH 32u
#define FREE_LEN_MASK ((uintptr_t)CACHELINE - 1)

static void free_batch(struct record *first)
{
	FQ_HANDOFF_RELEASE(first);
	call_rcu(&first->rcu, rec_free_rcu);
}

/*
 * Limbo.  A record (a block under LIMBO_BLOCK_MAX, no deferred children)
 * whose last reference a thread drops stays in that thread's limbo, a FIFO
 * tagged by fanout__epoch_tag(), instead of going to call_rcu; a
 * background record only if that thread allocates records itself (see
 * limbo_fits).  The thread's next fanout__rec_alloc() takes the oldest
 * limbo block if it fits and the epoch says that no read-side section can
 * still hold it (epoch.c): the block comes back to the thread that last
 * used it (the one that ran a synchronous batch, usually the consumer that
 * freed a background one's event), with no call_rcu, no allocator call and
 * no page fault.  The tag is read after the record became unreachable: the
 * unlink happens before the last put (the count's release/acquire), which
 * is before F_w.  Blocks are tagged LIMBO_TAG_EVERY at a time, all with the
 * epoch read after one F_w that follows every unlink among them (F_w is a
 * locked instruction, ~4% of a batch-1 fanout_run each; bench/PROFILE.txt
 * phase 17); a later fence gives a tag no older, so the rule only waits
 * longer.  A block still untagged when it reaches the head is tagged then,
 * with the rest.  A limbo holds at most LIMBO_MAX blocks; past that the
 * oldest LIMBO_BATCH go to call_rcu as one batch, and so does all of it
 * when its thread exits (epoch.c's exit hook, which a thread gets before
 * its first limbo block) or calls fanout_destroy() or
 * fanout_test_quiesce().  Such a batch is freed as any other: every
 * read-side section is also an RCU one.  A limbo block is plain allocator
 * memory and serves a dispatch to any engine; freeing it later touches
 * none: a block that leaves a limbo goes to the allocator, not to an
 * engine's block cache (`spilled`), whatever its size.  A limbo also holds
 * at most LIMBO_BYTES: past that its oldest blocks go to call_rcu one by
 * one.
 */
#define LIMBO_MAX 64u
#define LIMBO_BYTES ((size_t)8 << 20)
#define LIMBO_BLOCK_MAX ((size_t)1 << 20)
#define LIMBO_BATCH 32u
/* Try to move the epoch on only with LIMBO_ADVANCE blocks waiting, and
 * after a try that did not free the oldest, again only with LIMBO_RETRY
 * more: each try reads every reader's line and writes the epoch's, which
 * every reader reads, and a dispatch to spinning workers moves only a few
 * lines in all.  Workers inside sections (finalisers) refuse some tries. */
#define LIMBO_ADVANCE 16u
#define LIMBO_RETRY 8u
#define LIMBO_TAG_EVERY 8u

struct limbo {
	struct record *head, *tail; /* oldest first, through free_next */
	struct record *untagged;    /* the oldest block not tagged yet */
	unsigned nuntagged;
	unsigned n;
	size_t bytes;	 /* the blocks' alloc_size summed */
	unsigned reused; /* reuses not yet added to limbo_reused_total */
	bool allocates;	 /* this thread allocated a record (dispatch, run) */
};

static FQ_TLS struct limbo tls_limbo;
/* A: a statistic for tests.  Each thread adds its reuses 16 at a time,
 * so that the dispatch path writes no line other threads write, and the
 * rest when it asks (fanout__limbo_reused) or drains. */
static _Atomic uint64_t limbo_reused_total;
#define LIMBO_COUNT_EVERY 16u

static void count_reused(struct limbo *l)
{
	/* relaxed: a statistic. */
	atomic_fetch_add_explicit(&limbo_reused_total, l->reused,
				  memory_order_relaxed);
	l->reused = 0;
}

/* A block below LIMBO_BLOCK_MAX, synchronous or background.  From the
 * block cache's classes up (big batches) blocks come back from call_rcu
 * as late as small ones, and the cache keeps 32 of a class: the limbo ran
 * batch 512 at 33.0M children/s, the cache 17.1M (phase 11).
 * A background record's lines sit in the workers' caches, so a dispatcher
 * that reuses its block pulls the lines it writes across; but a block
 * from jemalloc costs more: blocks come back from call_rcu in bursts of
 * hundreds, and for classes with few regions per slab (batches of 32, 48,
 * 80-112, 160-224 children) jemalloc then purges emptied slabs and
 * faults fresh pages in, 1-3 page faults per dispatch (bench/PROFILE.txt,
 * phase 11: batch 96 ran at 4.3M children/s from jemalloc, 13.9M from
 * the limbo; batch 1 x 16 the same either way).  Only in the limbo of a
 * thread that allocates records itself: a worker (which drops a
 * background record's last reference when the consumer freed the event
 * first) or a thread that only consumes would keep blocks it never
 * reuses, and the big ones would miss the engine's block cache, where
 * the dispatching thread finds them (a consumer thread apart from the
 * dispatcher: batch 512 ran at 13.8M children/s instead of 17.9-20.4M).
 * The same for a synchronous record: a worker that ran part of a
 * fanout_run batch drops its last reference when the caller freed the
 * event first, and kept up to 64 blocks (8 MiB) that nobody reused.
 * And only a thread with an exit hook keeps a limbo (or its blocks would
 * be lost with it). */
static bool limbo_fits(const struct record *rec)
{
	/* relaxed: the last put's acquire ordered every push. */
	return rec->alloc_size < LIMBO_BLOCK_MAX && tls_limbo.allocates &&
	       !atomic_load_explicit(&rec->pendings, memory_order_relaxed) &&
	       fanout__epoch_hooked();
}

/* Tag every untagged block with the epoch read after one F_w. */
static void limbo_tag(struct limbo *l)
{
	uint64_t t;
	struct record *r;

	if (!l->untagged)
		return;
	t = fanout__epoch_tag();
	for (r = l->untagged; r; r = r->free_next)
		r->limbo_tag = t;
	l->untagged = NULL;
	l->nuntagged = 0;
}

/* Hand the @k oldest limbo blocks to call_rcu as one batch. */
static void limbo_spill(struct limbo *l, unsigned k)
{
	struct record *first = l->head, *last = first;

	if (!first)
		return;
	limbo_tag(l); /* rare: the untagged mark need not follow the cut */
	for (;;) {
		l->n--;
		l->bytes -= last->alloc_size;
		last->spilled = true;
		if (!--k || !last->free_next)
			break;
		last = last->free_next;
	}
	l->head = last->free_next;
	if (!l->head)
		l->tail = NULL;
	last->free_next = NULL;
	free_batch(first);
}

static void limbo_put(struct record *rec)
{
	struct limbo *l = &tls_limbo;

	rec->free_next = NULL;
	if (l->tail)
		l->tail->free_next = rec;
	else
		l->head = rec;
	l->tail = rec;
	if (!l->untagged)
		l->untagged = rec;
	if (++l->nuntagged == LIMBO_TAG_EVERY)
		limbo_tag(l);
	l->bytes += rec->alloc_size;
	if (++l->n > LIMBO_MAX)
		limbo_spill(l, LIMBO_BATCH);
	while (l->bytes > LIMBO_BYTES)
		limbo_spill(l, 1);
}

/* The oldest limbo block if it can hold @size bytes (without wasting a
 * third of it, or half of a block the cache would round up to a power of
 * two) and no reader can still hold it; NULL otherwise.  *@fault: the
 * allocation fault injection fired (as fanout__blocks_alloc would). */
static struct record *limbo_take(size_t size, bool *fault)
{
	struct limbo *l = &tls_limbo;
	struct record *rec = l->head;
	size_t most = size >= ((size_t)1 << BLOCKS_MIN_SHIFT) ? 2 * size :
								size + size / 2;

	*fault = false;
	l->allocates = true; /* one TLS base with the limbo's own fields */
	if (rec && rec == l->untagged)
		limbo_tag(l);
	if (!rec || rec->alloc_size < size || rec->alloc_size > most ||
	    !fanout__epoch_safe(rec->limbo_tag,
				l->n >= LIMBO_ADVANCE &&
					l->n % LIMBO_RETRY == 0))
		return NULL;
	if (fanout__alloc_fault()) {
		*fault = true;
		return NULL;
	}
	l->head = rec->free_next;
	if (!l->head)
		l->tail = NULL;
	l->n--;
	l->bytes -= rec->alloc_size;
	if (++l->reused == LIMBO_COUNT_EVERY)
		count_reused(l);
	release_strings(rec);
	return rec;
}

void fanout__limbo_drain(void)
{
	struct limbo *l = &tls_limbo;

	count_reused(l);
	while (l->head)
		limbo_spill(l, LIMBO_BATCH);
}

uint64_t fanout__limbo_reused(void)
{
	count_reused(&tls_limbo);
	/* relaxed: a statistic. */
	return atomic_load_explicit(&limbo_reused_total, memory_order_relaxed);
}

static void retire(struct record *rec)
{
	struct fanout_engine *e = rec->e;
	uintptr_t h;

	if (limbo_fits(rec)) {
		limbo_put(rec);
		return;
	}
	/* relaxed: a first look; the CAS below orders. */
	h = atomic_load_explicit(&e->retired, memory_order_relaxed);

	for (;;) {
		uintptr_t len = (h & FREE_LEN_MASK) + 1;

		rec->free_next = (struct record *)(h & ~FREE_LEN_MASK);
		if (len >= FREE_BATCH) {
			/* acq_rel: the pushes' releases (their records'
			 * last accesses) before the callback frees them. */
			if (atomic_compare_exchange_weak_explicit(
				    &e->retired, &h, 0, memory_order_acq_rel,
				    memory_order_relaxed)) {
				free_batch(rec);
				return;
			}
		} else if (atomic_compare_exchange_weak_explicit(
				   &e->retired, &h, (uintptr_t)rec | len,
				   memory_order_release,
				   memory_order_relaxed)) {
			return; /* release: publishes free_next */
		}
	}
}

void fanout__rec_flush(struct fanout_engine *e)
{
	uintptr_t h;

	/* relaxed: a quick look; the exchange decides. */
	if (!atomic_load_explicit(&e->retired, memory_order_relaxed))
		return;
	/* acquire: the pushers' releases, as in retire(). */
	h = atomic_exchange_explicit(&e->retired, 0, memory_order_acquire);
	if (h)
		free_batch((struct record *)(h & ~FREE_LEN_MASK));
}

void fanout__rec_put(struct record *rec, uint32_t n)
{
	/* The last holder needs no RMW when references are taken only by
	 * holders (tokens, the timer, parking and helping runners: each from
	 * a reference it has): when the count is @n, ours are all there are
	 * and nobody can add one.  A record with deferred children is the
	 * exception: a dispatch within one of them takes a reference from an
	 * RCU read section (origin_get in deleg.c), so it always takes the
	 * RMW.  `refs` first: acquire, it pairs with the other holders'
	 * release decrements, as the RMW's acquire would; read as @n, every
	 * other holder is gone, the finaliser among them, after the join,
	 * after every push; so the look at `pendings` after it sees any
	 * (relaxed).  The other way round, a push after the look and a
	 * finish before the load let a dispatch within the record take a
	 * reference that this free ignored (a use after free).  Otherwise
	 * release on the decrement, acquire before the free (refcount.h):
	 * every access by every holder happens before it. */
	if ((atomic_load_explicit(&rec->refs, memory_order_acquire) == n &&
	     (FANOUT_TEST_POINT(FANOUT_AT_PUT_LOADS, rec),
	      !atomic_load_explicit(&rec->pendings, memory_order_relaxed))) ||
	    atomic_fetch_sub_explicit(&rec->refs, n, memory_order_acq_rel) ==
		    n) {
		FQ_HANDOFF_RELEASE(rec);
		retire(rec);
	}
}

/*
 * Shutdown's count of what is in flight is two counters, one per side of
 * the hand-off: `active_in`, which the calls add to when they enter (2: the
 * call and its record) and subtract from when they drop a unit, and
 * `active_out`, which finalisers add a background record's unit to.  With
 * one counter both sides RMWed one line on every delegation (bench/
 * PROFILE.txt phase 15).  Drained when in == out (fanout__drained).
 */

/* A put: seq_cst RMW, then seq_cst load of `shutting`, against
 * fanout_shutdown's exchange of `shutting` and its seq_cst loads in
 * fanout__drained (after its eventcount announcement, a seq_cst RMW and
 * fence): either shutdown's load sees our RMW, or we see `shutting` and
 * signal (store-buffering; acq_rel would not forbid both missing).  While
 * shutting, every put signals: shutdown re-checks; a cold path.  It wakes
 * every sleeper: `drained` also has later fanout_shutdown() callers asleep
 * on it, waiting for shut_done (engine.c, wait_word), and one wake-up
 * could go to one of them - which sleeps again - and never to the caller
 * that waits for this drain (tests/test_shutdown.c,
 * shutdown_twice_at_once). */
static void put_signal(struct fanout_engine *e)
{
	if (atomic_load_explicit(&e->shutting, memory_order_seq_cst))
		fq_ec_signal(&e->drained, UINT32_MAX);
}

/* A caller drops @n units of its own (its call's, a synchronous record's,
 * or both entered ones when it turns back). */
void fanout__active_put(struct fanout_engine *e, uint32_t n)
{
	/* seq_cst: put_signal(); the release part also orders the caller's
	 * last touch of the queue before shutdown's stop. */
	atomic_fetch_sub_explicit(&e->active_in, n, memory_order_seq_cst);
	put_signal(e);
}

/* A finaliser drops a background record's unit, after its event was
 * published, inside a read-side section (see finalise in join.c). */
void fanout__active_done(struct fanout_engine *e)
{
	/* seq_cst: put_signal(); the release part makes the publication
	 * visible to the shutdown that sees this increment. */
	atomic_fetch_add_explicit(&e->active_out, 1, memory_order_seq_cst);
	FANOUT_TEST_POINT(FANOUT_AT_ACTIVE_DONE, e);
	put_signal(e);
}

/*
 * Whether nothing is in flight.  Out first, then in: every unit goes in
 * before it goes out (a record's unit enters with its call, whose hand-off
 * to the finaliser follows the RMW; seq_cst RMWs are ordered by happens-
 * before in the single order S), so in - out >= 0 at every point of S.
 * If this reads out = o and then in = i = o, then at the second load
 * in - out <= i - o = 0 (out only grows): nothing was in flight then.
 * 64-bit counters: no wrap.
 */
bool fanout__drained(struct fanout_engine *e)
{
	/* seq_cst: see put_signal(); acquire part: the publications of
	 * what was put. */
	uint64_t out =
		atomic_load_explicit(&e->active_out, memory_order_seq_cst);

	return atomic_load_explicit(&e->active_in, memory_order_seq_cst) == out;
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
 * with FANOUT_BORROW_TASKS, the tasks and goals stay the caller's.
 * @goals: the bytes of the goal copies, as check_batch() (deleg.c) sized
 * them: a goal equal (same pointer) to the one before it shares its copy;
 * 0 when every goal is NULL (or the tasks are borrowed). */
struct record *fanout__rec_alloc(struct fanout_engine *e,
				 const struct fanout_batch *b, unsigned depth,
				 bool background, unsigned nrunners,
				 size_t goals)
{
	/* Head fields the memset below leaves 0/NULL/false: pendings,
	 * deferring, npending, places, parked, ncompleted, policy_stopped,
	 * spilled, has_kids, parent_id, deadline, dl_next; the caller sets
	 * what it needs. */
	struct fanout_child *cur = fanout__current();
	bool borrow = b->flags & FANOUT_BORROW_TASKS;
	unsigned n = b->ntasks, ntask_slots = borrow ? 0 : b->ntasks, i;
	size_t strings =
		goals + str_size(b->context) + str_size(b->session_key);
	size_t head = sizeof(struct record) + n * sizeof(struct fanout_result);
	size_t size;
	struct fanout_task *slots;
	struct record *rec;
	bool fault;
	char *area;
	uint64_t tick;

	head = (head + CACHELINE - 1) & ~(size_t)(CACHELINE - 1);
	head += nrunners * sizeof(struct progress_slot);
	size = head + ntask_slots * sizeof(struct fanout_task) + n + strings;
	rec = limbo_take(size, &fault);
	if (rec)
		size = rec->alloc_size;
	else if (!fault)
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
	/* A synchronous record's caller runs in slot 0 (fanout__run_own). */
	atomic_init(&rec->runner_next, background ? 0 : 1);
	rec->owned = (uint8_t *)(slots + ntask_slots);
	if (n == 1) /* a batch of one: stores, not calls (also below) */
		rec->owned[0] = 0;
	else
		memset(rec->owned, 0, n);
	area = (char *)rec->owned + n;
	/* The tasks in one copy, then their goals pointed at copies of
	 * their own.  A NULL goal stays NULL (the runners report it as "",
	 * as for borrowed tasks), so a batch without goals is one memcpy. */
	if (ntask_slots == 1) {
		slots[0] = b->tasks[0];
		if (goals) { /* check_batch sized its one goal: no rescan */
			memcpy(area, slots[0].goal, goals);
			slots[0].goal = area;
			area += goals;
		}
	} else if (ntask_slots) {
		memcpy(slots, b->tasks, ntask_slots * sizeof(*slots));
	}
	if (goals && ntask_slots > 1) {
		const char *prev = NULL, *copy = NULL;

		for (i = 0; i < ntask_slots; i++) {
			const char *g = slots[i].goal;

			if (!g)
				continue;
			if (g != prev) { /* the rule of check_batch() */
				prev = g;
				copy = area;
				area = stpcpy(area, g) + 1;
			}
			slots[i].goal = copy;
		}
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
	atomic_init(&rec->irregular, false);
	atomic_init(&rec->state, REC_RUNNING);
	atomic_init(&rec->done_word, 0);
	atomic_init(&rec->cost_bits, 0);
	cds_wfcq_node_init(&rec->qnode);
	if (fanout__table_reserve(e, rec)) { /* gives rec->id */
		fanout__blocks_free(&e->blocks, rec, size);
		return NULL;
	}
	tick = fq_cycles();
	/* A fanout_run caller's first child starts at this tick only if
	 * dispatched_ns is its stamp (a fresh clock reading is later). */
	rec->start_tick = fq_stamp_extrapolates(tick) ? tick : 0;
	rec->dispatched_ns = fq_stamp_at(tick); /* the clock, cheaply */
	return rec;
}
