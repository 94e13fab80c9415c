/* SPDX-License-Identifier: MIT */
/*
 * internal.h - the engine's private structures.  Nothing here is exported;
 * every non-static function is named fanout__* and hidden.
 *
 * Legend: I: set before the object is published, read-only after.
 * A: atomic (or an object whose own operations are: an eventcount, the
 * ends of liburcu's queue, the block cache).  F: written once by the
 * finaliser before `state` turns FINISHED (release); read by others only
 * after an acquire load of `state` or after receiving the event.
 * C: written only by the thread that claimed that child (or the canceller
 * that claimed it; for a deferred child, whoever finished it).  W: written
 * only by its worker thread (or a per-thread block's owner), read by
 * anyone (relaxed).  H: handed over:
 * written before a release and read only after the matching acquire.
 * L: linkage changed only by liburcu's own operations (hash-set and queue
 * nodes, rcu_head).  O: read and written by one thread only (a per-thread
 * block's owner).
 */
#ifndef FANOUT_LIB_INTERNAL_H
#define FANOUT_LIB_INTERNAL_H

/* The shipped build inlines liburcu's fast paths (_LGPL_SOURCE).  Sanitizer
 * builds call the library instead: its inline reader code trips UBSan's
 * alignment check inside liburcu 0.13 itself (urcu_bp_reader), and TSan
 * cannot see its atomics (see tests/tsan.supp). */
#ifndef FANOUT_NO_LGPL
#define _LGPL_SOURCE
#endif
#include <urcu-bp.h>
#include <urcu/rculfhash.h>
#include <urcu/wfcqueue.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

/* Iterate a cds_lfht without liburcu's for_each_entry, whose container_of
 * on the terminating NULL is undefined behaviour (UBSan flags it). */
#define fanout__lfht_for_each(ht, iter, node)                                  \
	for (cds_lfht_first((ht), (iter));                                     \
	     ((node) = cds_lfht_iter_get_node(iter)) != NULL;                  \
	     cds_lfht_next((ht), (iter)))

#include "fanout.h"
#include "fanout_testing.h"
#include "../queue/alloc.h"
#include "blocks.h"
#include "../queue/annotate.h"
#include "../queue/clock.h"
#include "../queue/fq.h"
#include "probes.h"

#define CACHELINE FQ_CACHELINE

/* rcu_read_unlock with the TSan edge the notes ask for (see annotate.h):
 * a read-side section's accesses happen before the grace period ends. */
extern int fanout__rcu_token;
/* Every section is also an epoch section (epoch.c): small record blocks
 * are reused on the epochs, everything else freed by call_rcu. */
#define fanout__read_lock()                                                    \
	do {                                                                   \
		rcu_read_lock();                                               \
		fanout__epoch_enter();                                         \
	} while (0)
#define fanout__read_unlock()                                                  \
	do {                                                                   \
		fanout__epoch_exit();                                          \
		FQ_HANDOFF_RELEASE(&fanout__rcu_token);                        \
		rcu_read_unlock();                                             \
	} while (0)

/* epoch.c */
void fanout__epoch_enter(void);
void fanout__epoch_exit(void);
/* Does this thread own a slot, hence an exit hook that drains its limbo? */
bool fanout__epoch_hooked(void);
uint64_t fanout__epoch_tag(void);
bool fanout__epoch_safe(uint64_t tag, bool try_advance);
void fanout__epoch_fork_child(void);

/* Which result strings of a child were allocated by fanout_set_*(). */
#define OWN_ERROR 0x1u

/*
 * The record's `cancel` word: the public FANOUT_CANCEL_* bits (PENDING 0x1,
 * INTERRUPT 0x2, ABANDON 0x4), then who asked, then CANCEL_FINAL.
 */
#define CANCEL_HOW_MASK                                                        \
	(FANOUT_CANCEL_PENDING | FANOUT_CANCEL_INTERRUPT |                     \
	 FANOUT_CANCEL_ABANDON)
#define CANCEL_USER 0x10u     /* fanout_cancel, fanout_cancel_session */
#define CANCEL_SHUTDOWN 0x20u /* fanout_shutdown */
#define CANCEL_TIMEDOUT 0x40u /* the batch's deadline passed */
#define CANCEL_POLICY 0x80u   /* the batch's join policy */
#define CANCEL_TREE 0x100u    /* the parent delegation was interrupted */
/* Sources that make event->cancelled true. */
#define CANCEL_BY_CALLER (CANCEL_USER | CANCEL_SHUTDOWN | CANCEL_TREE)
/* The finaliser has read the bits; too late to cancel. */
#define CANCEL_FINAL 0x8000u

/* struct fanout_pending's `state` bits. */
#define PEND_DONE 0x1u /* finished, by its completer or by the library */
#define PEND_CB 0x2u   /* an on_cancel callback is registered */
#define PEND_RUN 0x4u  /* someone claimed running the callback */

struct fanout_timer;
struct leftover;
struct fanout_table;
struct fanout_tomb;

enum rec_state { REC_RUNNING = 0, REC_FINISHED = 1 };

/* Children a runner has finished and not yet subtracted from `remaining`
 * (run_token): one line per runner, so progress for lookup costs a private
 * store per child (see snapshot()). */
struct progress_slot {
	_Atomic uint32_t n; /* A (W: only its runner writes it) */
} __attribute__((aligned(CACHELINE)));

/* The running child; lives on the stack of the thread that runs it. */
struct fanout_child {
	struct record *rec;		/* I */
	unsigned index;			/* I */
	struct fanout_result *res;	/* C */
	struct fanout_pending *pending; /* C: set by fanout_defer() */
	uint64_t t0;			/* C: start, fq_cycles(), or 0 */
	bool placed; /* C: holds one of the record's max_children places */
};

/*
 * A deferred child (pending.c).  Lifetime: `refs` = 1 for the record (put
 * when the record is freed, so anyone who reaches p through the record's
 * pending list reads valid memory) + 1 for the completer (put by
 * fanout_complete).  `rec` is dereferenced only by a thread that knows
 * the child is not finished (it won the DONE CAS, or it is inside an RCU
 * read section and saw DONE clear), because a finished child's record may
 * be freed.
 */
struct fanout_pending {
	struct record *rec;	     /* I */
	struct fanout_pending *next; /* I: the record's pending list */
	fanout_id id;		     /* I */
	unsigned index;		     /* I */
	uint64_t t0;		     /* I: the child's start, fq_cycles() */
	/* H: written by the one registrant before PEND_CB (release). */
	void (*cb)(struct fanout_pending *p, void *arg); /* H */
	void *cb_arg;					 /* H */
	_Atomic uint32_t state;				 /* A: PEND_* */
	_Atomic uint32_t refs;				 /* A */
	/* A: fanout_pending_add_cost()'s sum, as double bits; the finisher
	 * swaps in PEND_COST_TAKEN (see pending.c, "Cost"). */
	_Atomic uint64_t cost_bits;
};

/*
 * One delegation: record, result slots, task slots and copied strings in
 * ONE allocation (alloc_size bytes).  Lifetime: `refs` counts the table
 * entry, the event (held by the sink, then by the consumer) and every ring
 * token; the last put frees the block after an RCU grace period, so
 * lookups that still see it in the table read valid memory.
 */
struct slot_chunk;

struct record {
	/* Line 0 holds what the runners and a lookup of a finished record
	 * read (table.c, snapshot()), so such a lookup misses on it, `state`
	 * and the event only. */
	struct fq_work work;		/* I: fn = run_token */
	struct fanout_engine *e;	/* I */
	void *user;			/* I */
	fanout_id id;			/* I */
	unsigned ntasks;		/* I */
	unsigned depth;			/* I */
	unsigned chunk;			/* I: indices taken per claim */
	bool background;		/* I */
	const char *session_key;	/* I */
	uint64_t dispatched_ns;		/* I */
	struct fanout_sink *sink;	/* I: NULL for synchronous runs */
	struct slot_chunk *tchunk;	/* I: the table slot's chunk, */
	uint32_t tslot;			/* I: and the slot (table.c) */
	size_t alloc_size;		/* I */
	struct fanout_task *tasks;	/* I: copied or borrowed */
	uint8_t *owned;			/* C: per child, OWN_* bits */
	struct progress_slot *progress; /* I: nrunners slots */
	unsigned nrunners;		/* I: tokens + the fanout_run caller */
	/* I: the record of the child that started this delegation (the
	 * calling thread's fanout__current() at alloc), NULL at top level.
	 * Lifetime: a synchronous record's parent outlives it, because the
	 * parent child sits in fanout_run until this record has finished; a
	 * background record's parent may finish and be freed first, so it is
	 * followed only from synchronous records (engine.c,
	 * waits_for_caller()). */
	struct record *parent;
	/* Copied into the event by the finaliser, so dispatch never
	 * touches the event's lines (the finaliser writes them anyway). */
	const char *context; /* I */
	fanout_id parent_id; /* I: record whose child started this one, or 0 */
	uint64_t parent_engine; /* I: that record's engine's serial */
	uint64_t deadline;	/* I: absolute, fq_now_ns(); 0 = none */
	unsigned join;		/* I: FANOUT_JOIN_* */
	unsigned quorum;	/* I: completed children that end a QUORUM */
	struct record *dl_next; /* H: the timer's inbox link (timer.c) */
	/* A: a child of this record started a delegation (the cancel tree
	 * scans for it only then; see tree.c). */
	_Atomic bool has_kids;
	/* A: FANOUT_CANCEL_* | CANCEL_* sources | CANCEL_FINAL.  Read before
	 * every child, written at most a few times per record: kept off the
	 * line the runners' claim/join RMWs bounce. */
	_Atomic uint32_t cancel;
	/* A: a child set a string of its own (set once, never cleared), so
	 * the free must visit the result slots; see rec_free_rcu(). */
	_Atomic bool strings;
	/* A: some child did not simply complete at no cost (an error, an
	 * interrupt, a skip, a cost): set once, never cleared, before the
	 * setter's release on `remaining`.  While it is clear the finaliser
	 * knows the counts without reading a result slot (finalise()). */
	_Atomic bool irregular;
	/* Deferred children (pending.c, join.c) and the QUORUM count: in the
	 * zeroed head, written only by records whose children defer or that
	 * have a join policy, so an ordinary dispatch writes no extra line. */
	_Atomic(struct fanout_pending *) pendings; /* A: list, push only */
	_Atomic bool deferring;	   /* A: a child deferred: claim one by one */
	_Atomic uint32_t npending; /* A: deferred, not finished yet */
	_Atomic uint32_t places; /* A: children holding a max_children place */
	_Atomic uint32_t parked; /* A: tokens waiting for a place */
	/* A: claimed ranges handed back for want of a place (join.c) */
	_Atomic(struct leftover *) leftovers;
	_Atomic uint32_t ncompleted; /* A: completed children (QUORUM) */
	/* A: a child ended interrupted with CANCEL_POLICY in the cancel
	 * word (skipped, abandoned, or returned -ECANCELED after it): the
	 * policy stopped something (event->interrupted_by_policy).  Set
	 * once, before the setter's release on `remaining`, as for
	 * `irregular`. */
	_Atomic bool policy_stopped;
	/* A: ring tokens not submitted yet (FANOUT_RUNNERS_ON_DEMAND), each
	 * with its ring credit and record reference taken (join.c). */
	_Atomic uint32_t held;
	struct rcu_head rcu;	  /* L: deferred free */
	struct record *free_next; /* H: the engine's `retired` batch, or
				   * a thread's limbo (record.c) */
	uint64_t limbo_tag;	  /* H: epoch tag in a limbo */
	bool spilled; /* H: left a limbo: freed to the allocator (record.c) */
	struct cds_wfcq_node qnode; /* L: sink linkage */
	uint64_t finish_seq;	    /* F: position among finished records */
	/* I: the tick dispatched_ns was stamped from, or 0 if it is a fresh
	 * clock reading; a fanout_run caller's first child starts there
	 * (join.c, run_token; 0: it reads its own). */
	uint64_t start_tick;
	/* A: a fanout_run caller that found no max_children place sleeps
	 * here until a place is given back (join.c, "Places"); written only
	 * by records whose children defer. */
	struct fq_ec place_ec;

	/* Hot: every child of the batch touches these; own line. */
	_Atomic uint32_t claim __attribute__((aligned(CACHELINE))); /* A */
	_Atomic uint32_t remaining;   /* A: join counter */
	_Atomic uint32_t runner_next; /* A: hands out progress slots */
	_Atomic uint32_t refs;	      /* A */
	_Atomic uint32_t state;	      /* A: enum rec_state */
	_Atomic uint32_t done_word;   /* A: synchronous join, see fq_done_* */
	_Atomic uint64_t cost_bits;   /* A: double, running sum for lookup */
	/* F: the event's figures beside `state`, so that a lookup of a
	 * finished record reads line 0 and this line only (table.c). */
	uint64_t done_ns;    /* F: ev.completed_ns */
	double done_cost;    /* F: ev.cost */
	uint8_t done_status; /* F: ev.status */
	bool done_cancelled; /* F: ev.cancelled */

	struct fanout_event ev __attribute__((aligned(CACHELINE))); /* F */
	struct fanout_result results[]; /* C; then tasks[], then strings */
};

/* What a calling thread counts for fanout_stats() (engine.c, "Per-thread
 * counters"). */
enum tstat {
	TSTAT_DISPATCHED, /* background delegations accepted */
	TSTAT_RUNS,	  /* fanout_run calls accepted */
	TSTAT_CHILDREN,	  /* children run by non-worker threads */
	TSTAT_N
};

/* Free table slots a thread keeps for itself (table.c, "Slot cache"). */
#define TSTAT_SLOTS 8u

/* One thread's counters for one engine, and its cache of the engine's free
 * table slots: written by that thread alone, the counters read by
 * fanout_stats(). */
struct fanout_tstats {
	_Atomic uint64_t n[TSTAT_N]; /* W */
	pthread_t owner;	     /* I */
	struct fanout_tstats *next;  /* I: the engine's list */
	unsigned nslots;	     /* O: slots[0..nslots) are free */
	uint32_t slots[TSTAT_SLOTS]; /* O */
};

struct fanout_sink {
	/* Producers: enqueue + signal. */
	struct cds_wfcq_tail tail __attribute__((aligned(CACHELINE))); /* A */
	struct fq_ec ec;      /* A: consumers waiting in fanout_wait */
	_Atomic bool fd_used; /* A: fanout_sink_fd() was called */
	_Atomic bool armed;   /* A: the eventfd is (about to be) readable */

	/* Consumer side. */
	struct cds_wfcq_head head __attribute__((aligned(CACHELINE))); /* A */
	_Atomic bool busy; /* A: a consumer is inside poll/wait */

	struct fanout_engine *e;   /* I */
	uint32_t fork_gen;	   /* I: fanout__fork_gen at creation */
	int efd;		   /* I */
	bool is_default;	   /* I */
	struct cds_lfht_node node; /* L: in e->sinks */
	struct rcu_head rcu;	   /* L */

	/* Back-pressure (sink.c): touched by dispatchers and the consumer -
	 * often one thread - never by the publishing worker, so it has its
	 * own line, away from the producers' tail and the consumer's head.
	 * A: accepted delegations whose event has not been TAKEN yet (still
	 * running, or published and queued here); at most max_pending. */
	_Atomic uint32_t untaken __attribute__((aligned(CACHELINE)));
	uint32_t max_pending; /* I: fanout_config.max_pending */
	/* A: ntasks of the batch last dispatched here: a hint for the
	 * waiter's patience (sink.c), on the line the dispatch writes. */
	_Atomic uint32_t last_ntasks;
};

struct fanout_engine {
	struct fanout_config cfg;	  /* I: after defaults */
	struct fq *q;			  /* I */
	struct fanout_table *table;	  /* I: records by id (table.c) */
	struct cds_lfht *sinks;		  /* I: the set of its sinks (sink.c) */
	struct fanout_sink *default_sink; /* I */
	/* A: cfg.keep_completed entries naming finished records (table.c,
	 * "Pruning") */
	_Atomic uint64_t *kept;
	_Atomic uint64_t *st_worker_children; /* I pointer; per worker, W */
	unsigned max_tokens; /* I: min(workers, max_children) */
	uint32_t fork_gen;   /* I: fanout__fork_gen at creation (fork.c) */

	/* The counters a calling thread keeps for itself (engine.c,
	 * "Per-thread counters"): the threads' blocks, and the shared
	 * counts for a thread that could not get one. */
	_Atomic(struct fanout_tstats *) tstats /* A: push only */
		__attribute__((aligned(CACHELINE)));
	_Atomic uint64_t st_shared[TSTAT_N]; /* A */

	/* Admission and shutdown's count, split so that no line is RMWed by
	 * both sides of a hand-off (deleg.c, "Admission"; record.c, before
	 * fanout__active_put).  Touched by dispatching threads: */
	/* A: background delegations admitted (less the refused) */
	_Atomic uint32_t async_started __attribute__((aligned(CACHELINE)));
	_Atomic uint32_t async_limit; /* A: async_done + max_async, as read */
	/* A: units in: +2 per call entered (the call and its record), less
	 * what the callers drop (their call's unit, a synchronous record's) */
	_Atomic uint64_t active_in;

	/* Touched only by finalisers. */
	/* A: also fanout_stats()' completed count (finalise, join.c) */
	_Atomic uint64_t finish_seq __attribute__((aligned(CACHELINE)));
	_Atomic uint32_t async_done; /* A: background delegations finished */
	_Atomic uint64_t active_out; /* A: background records' units out */

	/* Shutdown. */
	_Atomic uint32_t shutting __attribute__((aligned(CACHELINE))); /* A */
	struct fq_ec drained;	    /* A: signalled by puts while shutting */
	_Atomic uint32_t shut_done; /* A */

	/* Colder statistics (relaxed; exact once quiescent). */
	_Atomic uint64_t st_rejected
		__attribute__((aligned(CACHELINE))); /* A */
	_Atomic uint64_t st_cancelled;		     /* A */
	_Atomic uint64_t st_skipped;		     /* A */

	/* The deadline timer (timer.c); started on the first deadline. */
	struct fanout_timer *timer;   /* H: published by timer_state */
	_Atomic uint32_t timer_state; /* A */

	/* Every engine, for the cancel tree (tree.c). */
	struct cds_lfht_node engines_node; /* L: in tree.c's registry */
	uint64_t serial; /* I: unique per process, never reused (tree.c) */

	/* A: records waiting for a batched call_rcu: head | batch length
	 * (record.c, "Batched reclamation"). */
	_Atomic uintptr_t retired __attribute__((aligned(CACHELINE)));

	/* Large record blocks kept for reuse (blocks.c): taken by dispatch,
	 * given back by the call_rcu callbacks that free records. */
	struct fanout_blocks blocks __attribute__((aligned(CACHELINE))); /* A */
};

/* Test points (fanout_testing.h, fanout_test_hook()): a call in the
 * sanitizer builds, nothing in the plain one. */
#ifdef FANOUT_TEST_POINTS
void fanout__test_point(enum fanout_test_point at, const void *obj);
#define FANOUT_TEST_POINT(at, obj) fanout__test_point(at, obj)
#else
#define FANOUT_TEST_POINT(at, obj) ((void)0)
#endif

/* sink.c */
bool fanout__wait_was_patient(void);

/* record.c */
struct record *fanout__rec_alloc(struct fanout_engine *e,
				 const struct fanout_batch *b, unsigned depth,
				 bool background, unsigned nrunners,
				 size_t goals);
void fanout__rec_put(struct record *rec, uint32_t n);
void fanout__rec_flush(struct fanout_engine *e);
void fanout__limbo_drain(void);
uint64_t fanout__limbo_reused(void);
void fanout__active_put(struct fanout_engine *e, uint32_t n);
void fanout__active_done(struct fanout_engine *e);
bool fanout__drained(struct fanout_engine *e);
unsigned fanout__async_running(struct fanout_engine *e);

/* join.c */
struct fanout_child *fanout__current(void);
void fanout__forget_child(void);
void fanout__run_token(struct fq_work *w);
bool fanout__run_own(struct record *rec);
bool fanout__help_step(struct fanout_engine *e, bool (*more)(void *),
		       void *arg);
int fanout__cancel_rec(struct record *rec, unsigned how);
int fanout__cancel_rec_new(struct record *rec, unsigned how, bool *fresh);
void fanout__join_sub(struct record *rec, uint32_t n);
void fanout__after_child(struct record *rec, enum fanout_status st);
enum fanout_status fanout__set_outcome(struct record *rec, unsigned i,
				       struct fanout_result *r, int rc);
void fanout__give_place(struct record *rec);
int fanout__interrupt_code(uint32_t cancel);

/* pending.c */
void fanout__pending_put(struct fanout_pending *p);
void fanout__pendings_cancel(struct record *rec, uint32_t bits);

/* timer.c */
int fanout__timer_start(struct fanout_engine *e);
void fanout__timer_add(struct fanout_engine *e, struct record *rec);
void fanout__timer_done(struct fanout_engine *e);
void fanout__timer_stop(struct fanout_engine *e);
void fanout__timer_forget(struct fanout_engine *e);

/* tree.c */
void fanout__engines_add(struct fanout_engine *e);
void fanout__engines_del(struct fanout_engine *e);
int fanout__engines_init(void);
void fanout__tree_cancel(struct record *rec, unsigned how);
void fanout__engines_flush(void);
/* Chunk size: about 8 claims per runner, so runners stay balanced while
 * `claim` is touched once per chunk, not once per child (and `remaining`
 * once per runner, see fanout__run_token). */
static inline uint32_t fanout__chunk_for(unsigned n, unsigned runners)
{
	unsigned c = n / (runners * 8u);

	return c < 1 ? 1 : c > 256 ? 256 : c;
}

/* The chunk a synchronous record's caller claims at its creation, before
 * the record is published: [0, first) (join.c, "Claim"). */
static inline uint32_t fanout__first_chunk(const struct record *rec)
{
	return rec->chunk < rec->ntasks ? rec->chunk : rec->ntasks;
}

/* table.c */
int fanout__table_init(struct fanout_engine *e);
int fanout__table_reserve(struct fanout_engine *e, struct record *rec);
void fanout__table_insert(struct fanout_engine *e, struct record *rec);
struct record *fanout__table_find(struct fanout_engine *e, fanout_id id);
void fanout__table_retire(struct fanout_engine *e, struct record *rec);
void fanout__table_tomb(struct fanout_engine *e, struct record *rec);
uint32_t fanout__table_compact(struct record *rec);
bool fanout__table_finished(struct fanout_engine *e, fanout_id id);
/* Call fn(rec, arg) for every record in the table, under the read lock. */
void fanout__table_for_each(struct fanout_engine *e,
			    void (*fn)(struct record *rec, void *arg),
			    void *arg);
/* Call @fn with the id of every finished record of @e whose block is gone
 * (a tomb) and whose children started delegations, if its parent is
 * @parent of the engine with serial @engine (tree.c); inside the read
 * lock. */
void fanout__table_kid_tombs(struct fanout_engine *e, fanout_id parent,
			     uint64_t engine,
			     void (*fn)(fanout_id kid, void *arg), void *arg);
void fanout__table_destroy(struct fanout_engine *e);
int fanout__table_age_slot(struct fanout_engine *e, fanout_id id,
			   uint64_t uses); /* fanout_test_age_slot() */

/* sink.c */
extern _Atomic unsigned fanout__publish_gap_us; /* a test knob */
int fanout__sink_new(struct fanout_engine *e, bool is_default,
		     struct fanout_sink **out);
unsigned fanout__sinks_full(struct fanout_engine *e, bool *default_full);

/* Take a place on @s for a delegation about to be accepted (its event will
 * give it back when taken); false, with nothing changed, at max_pending.
 * relaxed: an admission count, like max_async - the RMW's atomicity is the
 * bound, and nothing is published through it (the event goes through the
 * queue).  A refused caller's transient +1 can only make a concurrent
 * dispatch see the sink full a moment early, never let one past it. */
static inline bool fanout__sink_hold(struct fanout_sink *s)
{
	if (atomic_fetch_add_explicit(&s->untaken, 1, memory_order_relaxed) <
	    s->max_pending)
		return true;
	atomic_fetch_sub_explicit(&s->untaken, 1, memory_order_relaxed);
	return false;
}

/* Give back a place taken by fanout__sink_hold() (a dispatch that failed
 * later, or an event taken).  relaxed: as above. */
static inline void fanout__sink_unhold(struct fanout_sink *s)
{
	atomic_fetch_sub_explicit(&s->untaken, 1, memory_order_relaxed);
}
void fanout__sink_publish(struct fanout_sink *s, struct record *rec);
int fanout__sinks_init(struct fanout_engine *e);
void fanout__sinks_destroy(struct fanout_engine *e);
extern _Atomic long fanout__fail_eventfd_at;

/* child.c: strings allocated with their size in front. */
char *fanout__str_dup(const char *s, size_t len);
void fanout__str_free(const char *s);
void fanout__mark_strings(struct record *rec);

/* fork.c */
extern _Atomic uint32_t fanout__fork_gen;
int fanout__fork_init(void);
void fanout__fork_forget_sinks(struct fanout_engine *e);

/* Was the object stamped with @gen created in an ancestor process (it
 * crossed a fork())?  relaxed: exact, see "Inherited engines" in fork.c. */
static inline bool fanout__inherited(uint32_t gen)
{
	return atomic_load_explicit(&fanout__fork_gen, memory_order_relaxed) !=
	       gen;
}

static inline double fanout__bits_to_double(uint64_t b)
{
	union {
		uint64_t u;
		double d;
	} v = {.u = b};
	return v.d;
}
static inline uint64_t fanout__double_to_bits(double d)
{
	union {
		uint64_t u;
		double d;
	} v = {.d = d};
	return v.u;
}

/*
 * Bump a statistic of fanout_stats().  relaxed: counters only; nothing is
 * read through them, each is exact once the engine is quiet, and the one
 * ordering stats promise (completed <= dispatched + runs) comes from the
 * release increment of finish_seq in finalise (join.c).
 */
static inline void fanout__stat_add(_Atomic uint64_t *counter, uint64_t n)
{
	atomic_fetch_add_explicit(counter, n, memory_order_relaxed);
}

/* Add @n to a counter only the calling thread writes (W): a plain load and
 * store, no locked instruction; readers load it relaxed. */
static inline void fanout__own_add(_Atomic uint64_t *counter, uint64_t n)
{
	/* relaxed: W, see above; what readers need ordered comes with an
	 * acquire they make first (fanout_stats: finish_seq). */
	atomic_store_explicit(
		counter,
		atomic_load_explicit(counter, memory_order_relaxed) + n,
		memory_order_relaxed);
}

/* The calling thread's block for @e: the last one it used, else found or
 * made (engine.c); NULL if none could be allocated. */
struct fanout_tls_stats {
	uint64_t serial; /* the engine's; 0: none yet */
	struct fanout_tstats *ts;
};
extern FQ_TLS struct fanout_tls_stats fanout__tls_stats;
struct fanout_tstats *fanout__tstats_slow(struct fanout_engine *e);

static inline struct fanout_tstats *fanout__tstats(struct fanout_engine *e)
{
	return fanout__tls_stats.serial == e->serial ? fanout__tls_stats.ts :
						       fanout__tstats_slow(e);
}

/* Count @n for @e in the calling thread's own block: a plain add, no
 * locked instruction (engine.c, "Per-thread counters"). */
static inline void fanout__tstat_add(struct fanout_engine *e, enum tstat k,
				     uint64_t n)
{
	struct fanout_tstats *ts = fanout__tstats(e);

	if (ts)
		fanout__own_add(&ts->n[k], n);
	else
		fanout__stat_add(&e->st_shared[k], n);
}

/* The duration of a child of @rec that started at @t0 (fq_cycles()) and
 * ends now; 0, with no clock read, on a FANOUT_NO_CHILD_CLOCK engine. */
static inline uint64_t fanout__child_ns(const struct record *rec, uint64_t t0)
{
	if (rec->e->cfg.flags & FANOUT_NO_CHILD_CLOCK)
		return 0;
	return fq_duration_ns(t0, fq_cycles());
}

/* A child of @rec finished other than COMPLETED at no cost: the finaliser
 * must read the result slots (see `irregular`).  relaxed: read by the
 * finaliser after the join's acquire, which every finisher's release
 * subtraction orders this store before; loaded first so that only the
 * first such child writes the line. */
static inline void fanout__mark_irregular(struct record *rec)
{
	if (!atomic_load_explicit(&rec->irregular, memory_order_relaxed))
		atomic_store_explicit(&rec->irregular, true,
				      memory_order_relaxed);
}

/* A child of @rec ended interrupted while the cancel word held @cancel:
 * if its join policy had interrupted the delegation, the policy stopped
 * something.  relaxed: as fanout__mark_irregular (read by the finaliser
 * after the join's acquire); loaded first so only the first one writes. */
static inline void fanout__mark_policy(struct record *rec, uint32_t cancel)
{
	if ((cancel & CANCEL_POLICY) &&
	    !atomic_load_explicit(&rec->policy_stopped, memory_order_relaxed))
		atomic_store_explicit(&rec->policy_stopped, true,
				      memory_order_relaxed);
}

/* Add a finished child's cost to the record's running sum (lookup). */
static inline void fanout__cost_add(struct record *rec, double x)
{
	uint64_t old;

	if (x == 0)
		return;
	fanout__mark_irregular(rec);
	old = atomic_load_explicit(&rec->cost_bits, memory_order_relaxed);
	/* relaxed: a running sum for lookup only; the event's cost is
	 * recomputed from the slots after the join's acquire. */
	while (!atomic_compare_exchange_weak_explicit(
		&rec->cost_bits, &old,
		fanout__double_to_bits(fanout__bits_to_double(old) + x),
		memory_order_relaxed, memory_order_relaxed))
		;
}

#endif
