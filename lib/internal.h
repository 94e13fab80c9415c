/* SPDX-License-Identifier: MIT */
/*
 * internal.h - the engine's private structures.  Nothing here is exported;
 * every non-static function is named fanout__* and hidden.
 *
 * Legend: I: set before the object is published, read-only after.
 * A: atomic.  F: written once by the finaliser before `state` turns
 * FINISHED (release); read by others only after an acquire load of `state`
 * or after receiving the event.  C: written only by the thread that claimed
 * that child (or the canceller that claimed it).
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

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "fanout.h"
#include "../queue/alloc.h"
#include "../queue/annotate.h"
#include "../queue/fq.h"

#define CACHELINE FQ_CACHELINE

/* rcu_read_unlock with the TSan edge the notes ask for (see annotate.h):
 * a read-side section's accesses happen before the grace period ends. */
extern int fanout__rcu_token;
#define fanout__read_lock() rcu_read_lock()
#define fanout__read_unlock()                                                  \
	do {                                                                   \
		FQ_HANDOFF_RELEASE(&fanout__rcu_token);                        \
		rcu_read_unlock();                                             \
	} while (0)

/* Iterate a cds_lfht without liburcu's for_each_entry, whose container_of
 * on the terminating NULL is undefined behaviour (UBSan flags it). */
#define fanout__lfht_for_each(ht, iter, node)                                  \
	for (cds_lfht_first((ht), (iter));                                     \
	     ((node) = cds_lfht_iter_get_node(iter)) != NULL;                  \
	     cds_lfht_next((ht), (iter)))

/* Which result strings of a child were allocated by fanout_set_*(). */
#define OWN_ERROR 0x1u

/* Internal cancel bit: the engine is shutting down. */
#define CANCEL_SHUTDOWN 0x4u
/* Internal cancel bit: the finaliser has read the bits; too late to cancel. */
#define CANCEL_FINAL 0x8u

enum rec_state { REC_RUNNING = 0, REC_FINISHED = 1 };

/* Children a runner has finished and not yet subtracted from `remaining`
 * (run_token): one line per runner, so progress for lookup costs a private
 * store per child (see snapshot()). */
struct progress_slot {
	_Atomic uint32_t n;
} __attribute__((aligned(CACHELINE)));

struct task_slot {
	fanout_fn fn;	  /* I */
	void *arg;	  /* I */
	const char *goal; /* I: points into the record's string area */
};

/* The running child; lives on the stack of the thread that runs it. */
struct fanout_child {
	struct record *rec;
	unsigned index;
	struct fanout_result *res; /* C */
};

/*
 * One delegation: record, result slots, task slots and copied strings in
 * ONE allocation (alloc_size bytes).  Lifetime: `refs` counts the table
 * entry, the event (held by the sink, then by the consumer) and every ring
 * token; the last put frees the block after an RCU grace period, so
 * lookups that still see it in the table read valid memory.
 */
struct record {
	struct fq_work work;		/* I: fn = run_token */
	struct fanout_engine *e;	/* I */
	struct fanout_sink *sink;	/* I: NULL for synchronous runs */
	fanout_id id;			/* I */
	unsigned ntasks;		/* I */
	unsigned depth;			/* I */
	unsigned chunk;			/* I: indices taken per claim */
	bool background;		/* I */
	size_t alloc_size;		/* I */
	uint64_t dispatched_ns;		/* I */
	struct task_slot *tasks;	/* I */
	uint8_t *owned;			/* C: per child, OWN_* bits */
	struct progress_slot *progress; /* I: nrunners slots */
	unsigned nrunners;		/* I: tokens + the fanout_run caller */
	/* I: copied into the event by the finaliser, so dispatch never
	 * touches the event's lines (the finaliser writes them anyway). */
	const char *context;
	const char *session_key;
	void *user;
	/* A: FANOUT_CANCEL_* | CANCEL_SHUTDOWN | CANCEL_FINAL.  Read before
	 * every child, written at most a few times per record: kept off the
	 * line the runners' claim/join RMWs bounce. */
	_Atomic uint32_t cancel;
	/* A: a child set a string of its own (set once, never cleared), so
	 * the free must visit the result slots; see rec_free_rcu(). */
	_Atomic bool strings;
	struct cds_lfht_node node;  /* table linkage (liburcu) */
	struct rcu_head rcu;	    /* deferred free */
	struct cds_wfcq_node qnode; /* sink linkage */
	uint64_t finish_seq;	    /* F: position among finished records */

	/* Hot: every child of the batch touches these; own line. */
	_Atomic uint32_t claim __attribute__((aligned(CACHELINE))); /* A */
	_Atomic uint32_t remaining;   /* A: join counter */
	_Atomic uint32_t runner_next; /* A: hands out progress slots */
	_Atomic uint32_t refs;	      /* A */
	_Atomic uint32_t state;	      /* A: enum rec_state */
	_Atomic uint32_t done_word;   /* A: synchronous join, see fq_done_* */
	_Atomic uint64_t cost_bits;   /* A: double, running sum for lookup */

	struct fanout_event ev __attribute__((aligned(CACHELINE))); /* F */
	struct fanout_result results[]; /* C; then tasks[], then strings */
};

struct fanout_sink {
	/* Producers: enqueue + signal. */
	struct cds_wfcq_tail tail __attribute__((aligned(CACHELINE)));
	_Atomic uint32_t pending; /* A: accepted delegations still to publish */
	struct fq_ec ec;	  /* A: consumers waiting in fanout_wait */
	_Atomic bool fd_used;	  /* A: fanout_sink_fd() was called */
	_Atomic bool armed;	  /* A: the eventfd is (about to be) readable */

	/* Consumer side. */
	struct cds_wfcq_head head __attribute__((aligned(CACHELINE)));
	_Atomic bool busy; /* A: a consumer is inside poll/wait */

	struct fanout_engine *e;   /* I */
	int efd;		   /* I */
	bool is_default;	   /* I */
	struct cds_lfht_node node; /* in e->sinks */
	struct rcu_head rcu;
};

struct fanout_engine {
	/* I: configuration after defaults. */
	struct fanout_config cfg;
	struct fq *q;
	struct cds_lfht *table; /* records by id */
	struct cds_lfht *sinks; /* sinks by address */
	struct fanout_sink *default_sink;
	_Atomic(struct record *) *kept;	      /* A: cfg.keep_completed slots */
	_Atomic uint64_t *st_worker_children; /* I pointer; per worker, W */
	unsigned max_tokens; /* I: min(workers, max_children) */

	/* Touched only by dispatching threads. */
	_Atomic uint64_t next_id __attribute__((aligned(CACHELINE)));
	_Atomic uint64_t st_dispatched;
	_Atomic uint64_t st_runs;

	/* Touched by dispatchers and finalisers alike: their own line. */
	_Atomic uint32_t async_running __attribute__((aligned(CACHELINE)));
	_Atomic uint32_t active; /* A: unfinished records + calls in flight */

	/* Touched only by finalisers. */
	_Atomic uint64_t finish_seq __attribute__((aligned(CACHELINE)));
	_Atomic uint64_t st_completed;

	/* Shutdown. */
	_Atomic uint32_t shutting __attribute__((aligned(CACHELINE)));
	struct fq_ec drained; /* signalled when active reaches 0 */
	_Atomic uint32_t shut_done;

	/* Colder statistics (relaxed; exact once quiescent). */
	_Atomic uint64_t st_rejected __attribute__((aligned(CACHELINE)));
	_Atomic uint64_t st_cancelled;
	_Atomic uint64_t st_skipped;
	_Atomic uint64_t st_helper_children; /* run by non-worker threads */

	/* Large record blocks kept for reuse (alloc.c): taken by dispatch,
	 * given back by the call_rcu callbacks that free records. */
	struct fa_cache blocks __attribute__((aligned(CACHELINE)));
};

/* record.c */
struct record *fanout__rec_alloc(struct fanout_engine *e,
				 const struct fanout_batch *b, unsigned depth,
				 bool background, unsigned nrunners);
void fanout__rec_put(struct record *rec, uint32_t n);
void fanout__active_put(struct fanout_engine *e, uint32_t n);

/* join.c */
struct fanout_child *fanout__current(void);
void fanout__run_token(struct fq_work *w);
bool fanout__help_step(struct fanout_engine *e);
int fanout__cancel_rec(struct record *rec, unsigned how);
/* Chunk size: about 8 claims per runner, so runners stay balanced while
 * `claim` is touched once per chunk, not once per child (and `remaining`
 * once per runner, see fanout__run_token). */
static inline uint32_t fanout__chunk_for(unsigned n, unsigned runners)
{
	unsigned c = n / (runners * 8u);

	return c < 1 ? 1 : c > 256 ? 256 : c;
}

/* table.c */
int fanout__table_init(struct fanout_engine *e);
void fanout__table_insert(struct fanout_engine *e, struct record *rec);
struct record *fanout__table_find(struct fanout_engine *e, fanout_id id);
void fanout__table_retire(struct fanout_engine *e, struct record *rec);
/* Call fn(rec, arg) for every record in the table, under the read lock. */
void fanout__table_for_each(struct fanout_engine *e,
			    void (*fn)(struct record *rec, void *arg),
			    void *arg);
void fanout__table_destroy(struct fanout_engine *e);

/* sink.c */
int fanout__sink_new(struct fanout_engine *e, bool is_default,
		     struct fanout_sink **out);
void fanout__sink_publish(struct fanout_sink *s, struct record *rec);
int fanout__sinks_init(struct fanout_engine *e);
void fanout__sinks_destroy(struct fanout_engine *e);
extern _Atomic long fanout__fail_eventfd_at;

/* child.c: strings allocated with their size in front. */
char *fanout__str_dup(const char *s, size_t len);
void fanout__str_free(const char *s);

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

#endif
