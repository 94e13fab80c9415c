/* SPDX-License-Identifier: MIT */
/*
 * fuzz_api.c - libFuzzer harness: the input is a program of API calls.
 *
 * Each input byte stream is decoded into operations on up to two engines
 * (create with odd configurations, dispatch/run/delegate with odd batches,
 * cancel, lookup, list, stats, poll, wait with short timeouts, sink create/
 * destroy, sink_fd, format/json into odd buffer sizes, shutdown, destroy).
 * Children complete, fail, return -ECANCELED or a positive value, wait
 * (briefly) for an interrupt, or delegate again from inside (run, delegate,
 * dispatch).
 *
 * After every step the harness checks what it can know for sure:
 *   - every return value is one the header documents for that call, and the
 *     exact one wherever the outcome is deterministic (bad arguments, bad
 *     configurations, after shutdown, over max_tasks, too deep);
 *   - every event received belongs to an accepted delegation of that engine
 *     and sink, arrives once, has every child once at its index, and obeys
 *     the status rules; no event ever comes for a refused call;
 *   - after fanout_shutdown() every accepted delegation's event is in its
 *     sink already (drained and counted on the spot);
 *   - with an allocation failure injected (fanout_test_fail_at) the call
 *     that needed the memory says -ENOMEM and is refused cleanly;
 *   - at the end every accepted delegation produced exactly one event
 *     (except those whose sink was destroyed undrained, or whose engine was
 *     destroyed undrained, which the library must free: LeakSanitizer).
 * A violation prints FUZZ-VIOLATION and aborts, so libFuzzer keeps the
 * input.  Threads make runs non-deterministic; the invariants do not
 * depend on the interleaving.
 */
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "fanout.h"
#include "fanout_testing.h"
#include "../utf8.h"

#define NENG 2
#define NSINK 4 /* [0] is the default sink */
#define MAXN 64 /* children per fuzzed batch (more only when refused) */
#define MAX_DL 1024
#define MAX_OPS 120

/* ------------------------------------------------------------- input */

struct in {
	const uint8_t *p;
	size_t n;
};

static uint8_t byte(struct in *in)
{
	if (!in->n)
		return 0;
	in->n--;
	return *in->p++;
}

#define FAIL(...)                                                              \
	do {                                                                   \
		fprintf(stderr, "FUZZ-VIOLATION %s:%d: ", __FILE__, __LINE__); \
		fprintf(stderr, __VA_ARGS__);                                  \
		fputc('\n', stderr);                                           \
		abort();                                                       \
	} while (0)

#define ENSURE(cond, ...)                                                      \
	do {                                                                   \
		if (!(cond))                                                   \
			FAIL(__VA_ARGS__);                                     \
	} while (0)

static void sleep_us(unsigned us)
{
	struct timespec ts = {0, (long)us * 1000};

	nanosleep(&ts, NULL);
}

/* ------------------------------------------------------------- model */

enum { DL_INFLIGHT = 0, DL_ACCEPTED, DL_REFUSED, DL_SYNC, DL_DROPPED };
enum {
	B_OK,
	B_ERR,
	B_CANCELED,
	B_POSITIVE,
	B_WAITINT,
	B_RUN,
	B_DELEGATE,
	B_DISPATCH,
	B_SUMMARY,
	NBEH
};

struct dl {
	atomic_int state;
	atomic_int got;
	atomic_int cancel_ok;	 /* fanout_cancel returned 0 for it */
	atomic_int ev_cancelled; /* its event said cancelled */
	int eng, sink;
	unsigned gen; /* which incarnation of engs[eng] */
	unsigned n, depth;
	_Atomic uint64_t id;
	atomic_uchar runs[MAXN];
	uint8_t beh[MAXN];
	int ret[MAXN];
};

struct eng {
	struct fanout_engine *e;
	struct fanout_config cfg;
	unsigned max_tasks, max_depth;
	struct fanout_sink *sinks[NSINK];
	bool shut;
	unsigned gen;
};

static struct eng engs[NENG];
static unsigned gen_counter;
/* An allocation failure was injected during this input (sticky: a child
 * may consume it a while after the injecting call returned). */
static atomic_int fault_armed;
static struct dl dls[MAX_DL];
static atomic_uint ndl;

static struct dl *dl_new(int eng, int sink, unsigned n, unsigned depth,
			 const uint8_t *beh)
{
	unsigned i = atomic_fetch_add(&ndl, 1);
	struct dl *d;

	if (i >= MAX_DL)
		return NULL;
	d = &dls[i];
	d->eng = eng;
	d->gen = engs[eng].gen;
	d->sink = sink;
	d->n = n;
	d->depth = depth;
	for (unsigned k = 0; k < n && k < MAXN; k++)
		d->beh[k] = beh ? beh[k] % NBEH : B_OK;
	return d;
}

static int child(struct fanout_child *c, void *arg);

/* Bytes children and batches set: every class of ill-formed UTF-8, cut
 * characters, controls, and well-formed text that must come back intact. */
static const struct {
	const char *s;
	size_t n;
} odd[] = {
	{"sum\n\"mary\"", 10},
	{"cut \xc3", 5},		  /* 2-byte lead at the end */
	{"ab\xe2\x82", 4},		  /* 3-byte char cut short */
	{"\xf0\x9f\x98", 3},		  /* 4-byte char cut short */
	{"\xed\xa0\x80|\xed\xbf\xbf", 7}, /* surrogates */
	{"\xc0\xaf\xe0\x80\xaf\xf0\x80\x80\xaf", 9}, /* overlongs */
	{"\xf4\x90\x80\x80\xf8\x88\x80\x80\x80", 9}, /* > U+10FFFF */
	{"\x80\xbf stray \xfe\xff", 11},
	{"\x01\x1b[31m\x7f\r\n\t\b\f\x1f", 13},
	{"\xc2\x9b\xc2\x80 C1", 7},
	{"ok \xf0\x9f\x98\x80 \xe2\x82\xac \xc3\xbc \xef\xbf\xbf", 18},
	{"a\0b", 3}, /* read up to the NUL */
};
#define NODD (sizeof(odd) / sizeof(odd[0]))

/* A batch of @n children of @d (n may exceed MAXN only for refused calls:
 * their children must never run). */
static void mk_batch(struct dl *d, struct fanout_task *t, unsigned n,
		     struct fanout_batch *b)
{
	static const char *goals[] = {"g",
				      NULL,
				      "",
				      "a goal with \"quotes\"\n",
				      "\xe2\x82\xac\xe2\x82",
				      "\xed\xb0\x80\x01"};

	for (unsigned i = 0; i < n; i++) {
		t[i].goal = goals[i % 6];
		t[i].fn = child;
		t[i].arg = d;
	}
	memset(b, 0, sizeof(*b));
	b->tasks = t;
	b->ntasks = n;
	b->context = (d->n & 1) ? "context\xc3" : NULL;
	b->session_key = (d->n & 2) ? "key\x1b\xff" : NULL;
	b->user = d;
}

static enum fanout_status status_of(int ret)
{
	return ret == 0		 ? FANOUT_COMPLETED :
	       ret == -ECANCELED ? FANOUT_INTERRUPTED :
				   FANOUT_ERROR;
}

/* Check @ev against its delegation; @sink is where it came from (-1 sync). */
static void check_event(struct fanout_event *ev, int eng, int sink)
{
	struct dl *d;
	unsigned nc = 0, ne = 0, ni = 0, skipped = 0;
	int st;

	ENSURE(ev, "NULL event");
	d = ev->user;
	ENSURE(d >= dls && d < dls + MAX_DL, "event with foreign user %p",
	       (void *)d);
	atomic_store(&d->ev_cancelled, ev->cancelled);
	ENSURE(atomic_fetch_add(&d->got, 1) == 0, "duplicate event");
	if (atomic_load(&d->cancel_ok))
		ENSURE(ev->cancelled, "cancel returned 0, event not cancelled");
	st = atomic_load(&d->state);
	ENSURE(st != DL_REFUSED, "event for a refused call");
	ENSURE(st != DL_DROPPED, "event from a destroyed sink");
	ENSURE(d->eng == eng, "event on engine %d, dispatched on %d", eng,
	       d->eng);
	if (sink >= 0) {
		ENSURE(st != DL_SYNC, "synchronous event on a sink");
		ENSURE(d->sink == sink, "event on sink %d, dispatched to %d",
		       sink, d->sink);
		if (st == DL_ACCEPTED && atomic_load(&d->id))
			ENSURE(atomic_load(&d->id) == ev->id,
			       "event id differs");
	}
	ENSURE(ev->nresults == d->n && ev->results, "nresults %u want %u",
	       ev->nresults, d->n);
	for (unsigned i = 0; i < d->n; i++) {
		const struct fanout_result *r = &ev->results[i];
		unsigned runs = atomic_load(&d->runs[i]);

		ENSURE(r->index == i, "result %u index %u", i, r->index);
		ENSURE(r->goal, "goal NULL");
		ENSURE(runs <= 1, "child %u ran %u times", i, runs);
		if (runs) {
			ENSURE(r->code == d->ret[i] &&
				       r->status == status_of(d->ret[i]),
			       "child %u returned %d, result %d/%d", i,
			       d->ret[i], r->code, r->status);
			ENSURE((r->status == FANOUT_COMPLETED) ==
				       (r->error == NULL),
			       "error text vs status");
		} else {
			skipped++;
			ENSURE(r->status == FANOUT_INTERRUPTED &&
				       r->code == -ECANCELED &&
				       r->duration_ns == 0,
			       "unstarted child %u: %d/%d", i, r->status,
			       r->code);
		}
		nc += r->status == FANOUT_COMPLETED;
		ne += r->status == FANOUT_ERROR;
		ni += r->status == FANOUT_INTERRUPTED;
	}
	if (skipped)
		ENSURE(ev->cancelled, "children skipped, event not cancelled");
	ENSURE(ev->ncompleted == nc && ev->nerror == ne &&
		       ev->ninterrupted == ni,
	       "counts");
	if (nc)
		ENSURE(ev->status == FANOUT_COMPLETED && !ev->error,
		       "status C");
	else if (ni == d->n)
		ENSURE(ev->status == FANOUT_INTERRUPTED && ev->error,
		       "status I");
	else
		ENSURE(ev->status == FANOUT_ERROR && ev->error, "status E");
}

static void nested(struct fanout_child *c, struct dl *parent, unsigned i)
{
	struct eng *g = &engs[parent->eng];
	unsigned depth = fanout_child_depth(c) + 1;
	bool deep = depth > g->max_depth;
	uint8_t beh[3] = {B_OK, B_ERR, B_CANCELED};
	unsigned n = 1 + i % 3;
	struct fanout_task t[3];
	struct fanout_batch b;
	struct fanout_event *ev = NULL;
	fanout_id id = 0;
	struct dl *d;
	int rc;

	d = dl_new(parent->eng, parent->beh[i] == B_DISPATCH ? 0 : -1, n, depth,
		   beh);
	if (!d)
		return;
	mk_batch(d, t, n, &b);
	switch (parent->beh[i]) {
	case B_RUN:
		atomic_store(&d->state, DL_SYNC);
		rc = fanout_run(g->e, &b, &ev);
		break;
	case B_DELEGATE:
		atomic_store(&d->state, DL_SYNC);
		rc = fanout_delegate(g->e, &b, &id, &ev);
		if (rc > 0) {
			ENSURE(rc == FANOUT_INLINE, "delegate in a child: %d",
			       rc);
			ENSURE(ev && id == ev->id, "inline id");
			rc = 0;
		}
		break;
	default:
		rc = fanout_dispatch(g->e, &b, &id);
		if (rc == 0) {
			atomic_store(&d->id, id);
			atomic_store(&d->state, DL_ACCEPTED);
			if (atomic_load(&d->got))
				ENSURE(id, "id");
			ENSURE(!deep, "nested dispatch too deep accepted");
			return;
		}
		atomic_store(&d->state, DL_REFUSED);
		ENSURE(atomic_load(&d->got) == 0,
		       "event for refused nested dispatch");
		break;
	}
	if (deep)
		ENSURE(rc == -ELOOP, "too deep: %d", rc);
	else
		ENSURE(rc == 0 || rc == -ESHUTDOWN || rc == -EBUSY ||
			       (rc == -ENOMEM && atomic_load(&fault_armed)),
		       "nested call: %d", rc);
	if (rc == -EBUSY)
		ENSURE(parent->beh[i] == B_DISPATCH, "-EBUSY from a sync call");
	if (rc == 0 && ev) {
		check_event(ev, parent->eng, -1);
		fanout_event_free(ev);
	} else if (rc) {
		atomic_store(&d->state, DL_REFUSED);
	}
}

static int child(struct fanout_child *c, void *arg)
{
	struct dl *d = arg;
	unsigned i = fanout_child_index(c);
	int ret = 0;

	ENSURE(d >= dls && d < dls + MAX_DL, "child arg");
	ENSURE(i < d->n && i < MAXN, "child index %u of %u", i, d->n);
	ENSURE(atomic_load(&d->state) != DL_REFUSED, "child of a refused call");
	ENSURE(fanout_child_depth(c) == d->depth, "depth %u want %u",
	       fanout_child_depth(c), d->depth);
	ENSURE(atomic_fetch_add(&d->runs[i], 1) == 0, "child %u ran twice", i);
	switch (d->beh[i]) {
	case B_ERR:
		fanout_set_error(c, odd[(i + d->n) % NODD].s);
		ret = -EIO;
		break;
	case B_CANCELED:
		ret = -ECANCELED;
		break;
	case B_POSITIVE:
		ret = 3;
		break;
	case B_WAITINT: /* about 100 us, yielding (a sleep lasts longer) */
		for (uint64_t t0 = fanout_now_ns();
		     i < 4 && fanout_now_ns() - t0 < 100000; sched_yield()) {
			if (fanout_interrupted(c)) {
				ret = -ECANCELED;
				break;
			}
		}
		break;
	case B_RUN:
	case B_DELEGATE:
	case B_DISPATCH:
		nested(c, d, i);
		break;
	case B_SUMMARY:
		fanout_set_summary(c, odd[(i + d->n) % NODD].s,
				   odd[(i + d->n) % NODD].n);
		fanout_add_cost(c, 0.5);
		break;
	}
	d->ret[i] = ret;
	return ret;
}

/* ------------------------------------------------------------ operations */

static bool cfg_valid(const struct fanout_config *c)
{
	return !(c->flags & ~(FANOUT_NO_PIN | FANOUT_WAIT_HELPS)) &&
	       c->workers <= 1024 && c->max_tasks <= (1u << 24) &&
	       c->max_depth <= 64 && c->spin_ns <= 1000000000ull &&
	       c->queue_slots <= (1u << 24) && c->max_async <= (1u << 20) &&
	       c->keep_completed <= (1u << 24) && c->max_children <= (1u << 24);
}

/* Both renderings of @ev, whole: valid UTF-8; the text without controls but
 * \n and \t; the JSON parsed by jansson (strict: it rejects ill-formed
 * UTF-8, raw controls, duplicate keys), with every result present. */
static void check_renderings(const struct fanout_event *ev)
{
	int n = fanout_format(ev, NULL, 0), m = fanout_event_json(ev, NULL, 0);
	char *t, *j;
	json_error_t err;
	json_t *root, *res;

	ENSURE(n > 0 && m > 0, "format %d json %d", n, m);
	t = malloc((size_t)n + 1);
	j = malloc((size_t)m + 1);
	ENSURE(t && j, "malloc");
	ENSURE(fanout_format(ev, t, (size_t)n + 1) == n &&
		       fanout_event_json(ev, j, (size_t)m + 1) == m,
	       "lengths differ between calls");
	ENSURE(utf8_strict(t, (size_t)n, 1u << '\n' | 1u << '\t', false),
	       "text not clean UTF-8: %s", t);
	ENSURE(utf8_strict(j, (size_t)m, 0, true), "JSON not clean UTF-8: %s",
	       j);
	root = json_loadb(j, (size_t)m, JSON_REJECT_DUPLICATES, &err);
	ENSURE(root, "JSON rejected (%s at %d): %s", err.text, err.position, j);
	res = json_object_get(root, "results");
	ENSURE(json_is_array(res) && json_array_size(res) == ev->nresults,
	       "results");
	json_decref(root);
	free(t);
	free(j);
}

static void receive(int eng, int sink, struct fanout_event *ev, struct in *in)
{
	check_event(ev, eng, sink);
	if (byte(in) & 1) {
		check_renderings(ev);
		size_t len = byte(in) % 96;
		char *buf = len ? malloc(len) : NULL;
		int a = fanout_format(ev, buf, len);
		int b = fanout_event_json(ev, buf, len);

		ENSURE(a > 0 && b > 0, "format %d json %d", a, b);
		if (len)
			ENSURE(strlen(buf) < len, "unterminated");
		free(buf);
	}
	fanout_event_free(ev);
}

/* Take everything from every sink of engine @g (after shutdown). */
static void drain(int eng, struct in *in)
{
	struct eng *g = &engs[eng];
	struct fanout_event *ev;

	for (int s = 0; s < NSINK; s++) {
		int rc;

		if (!g->sinks[s])
			continue;
		while ((rc = fanout_poll(g->sinks[s], &ev)) == 0)
			receive(eng, s, ev, in);
		ENSURE(rc == -EAGAIN, "poll while draining: %d", rc);
	}
}

/* After shutdown + drain: every accepted delegation of @eng got its event. */
static void all_arrived(int eng)
{
	unsigned n = atomic_load(&ndl);

	if (n > MAX_DL)
		n = MAX_DL;
	for (unsigned i = 0; i < n; i++) {
		struct dl *d = &dls[i];

		if (d->eng != eng)
			continue;
		if (atomic_load(&d->state) == DL_ACCEPTED)
			ENSURE(atomic_load(&d->got) == 1,
			       "LOST: accepted delegation without its event");
	}
}

/* The sink was destroyed (or its engine): its undrained events are gone. */
static void drop_sink(int eng, int sink)
{
	unsigned n = atomic_load(&ndl);

	if (n > MAX_DL)
		n = MAX_DL;
	for (unsigned i = 0; i < n; i++) {
		struct dl *d = &dls[i];

		if (d->eng == eng && (sink < 0 || d->sink == sink) &&
		    atomic_load(&d->state) == DL_ACCEPTED &&
		    !atomic_load(&d->got))
			atomic_store(&d->state, DL_DROPPED);
	}
}

/* ------------------------------------------------- engine cache, reaper */

/*
 * Speed.  A fresh engine per input costs tens of ms: fanout_destroy() waits
 * twice for the RCU callbacks (rcu_barrier), and liburcu's call_rcu thread
 * sleeps 10 ms between batches.  So an engine whose input ended without
 * shutting it down goes back to a small cache, keyed by its exact
 * configuration, after settle() proved it quiescent (every accepted
 * delegation's event received, the counters balanced, the sinks empty and
 * the created ones destroyed); op_create() with the same configuration
 * takes it from there.  An engine that was shut down (or destroyed by the
 * input), or evicted from the cache, is handed to reaper threads, which
 * call fanout_destroy() on it while the next inputs run: once
 * fanout_shutdown() has returned, or the engine settled, no child of it
 * runs, so nothing of the harness is touched any more.  Several reapers,
 * as their rcu_barrier() calls share the call_rcu thread's batches.
 *
 * FUZZ_FRESH=1 in the environment turns both off (every engine created and
 * destroyed within its input, as a replayed crash input needs when it
 * depended on what an earlier input left in a cached engine).
 */
#define NCACHE 48
#define NREAP 32
#define REAPQ 256

static struct {
	struct fanout_engine *e;
	struct fanout_config cfg;
	unsigned long used; /* input number of its last use (LRU) */
} cache[NCACHE];
static unsigned long ninputs;
static bool fresh_mode;

static pthread_mutex_t rq_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t rq_work = PTHREAD_COND_INITIALIZER;
static pthread_cond_t rq_room = PTHREAD_COND_INITIALIZER;
static struct fanout_engine *rq[REAPQ];
static unsigned rq_head, rq_len, rq_busy;
static bool rq_stop, rq_started;
static pthread_t reapers[NREAP];

static void *reaper(void *arg)
{
	pthread_mutex_lock(&rq_lock);
	for (;;) {
		struct fanout_engine *e;

		while (!rq_len && !rq_stop)
			pthread_cond_wait(&rq_work, &rq_lock);
		if (!rq_len)
			break;
		e = rq[rq_head];
		rq_head = (rq_head + 1) % REAPQ;
		rq_len--;
		rq_busy++;
		pthread_cond_signal(&rq_room);
		pthread_mutex_unlock(&rq_lock);
		fanout_destroy(e);
		pthread_mutex_lock(&rq_lock);
		rq_busy--;
		pthread_cond_broadcast(&rq_room);
	}
	pthread_mutex_unlock(&rq_lock);
	return NULL;
}

/* Destroy @e now or on a reaper thread; no child of @e may run any more
 * (after fanout_shutdown(), or settled), so none can touch the harness. */
static void reap(struct fanout_engine *e)
{
	if (fresh_mode) {
		fanout_destroy(e);
		return;
	}
	pthread_mutex_lock(&rq_lock);
	if (!rq_started) {
		for (int i = 0; i < NREAP; i++)
			if (pthread_create(&reapers[i], NULL, reaper, NULL))
				FAIL("cannot start a reaper thread");
		rq_started = true;
	}
	while (rq_len == REAPQ)
		pthread_cond_wait(&rq_room, &rq_lock);
	rq[(rq_head + rq_len) % REAPQ] = e;
	rq_len++;
	pthread_cond_signal(&rq_work);
	pthread_mutex_unlock(&rq_lock);
}

/* At exit: every engine destroyed, so LeakSanitizer sees what they freed. */
static void cache_exit(void)
{
	for (int i = 0; i < NCACHE; i++) {
		if (cache[i].e) {
			reap(cache[i].e);
			cache[i].e = NULL;
		}
	}
	pthread_mutex_lock(&rq_lock);
	rq_stop = true;
	pthread_cond_broadcast(&rq_work);
	pthread_mutex_unlock(&rq_lock);
	if (rq_started)
		for (int i = 0; i < NREAP; i++)
			pthread_join(reapers[i], NULL);
}

int LLVMFuzzerInitialize(int *argc, char ***argv);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	const char *f = getenv("FUZZ_FRESH");

	fresh_mode = f && *f && *f != '0';
	atexit(cache_exit);
	return 0;
}

/* An engine with exactly configuration @c: a cached one, else a new one. */
static int engine_get(const struct fanout_config *c, struct fanout_engine **e)
{
	for (int i = 0; i < NCACHE; i++) {
		if (cache[i].e && !memcmp(&cache[i].cfg, c, sizeof(*c))) {
			*e = cache[i].e;
			cache[i].e = NULL;
			return 0;
		}
	}
	return fanout_create(c, e);
}

/* Keep quiescent engine @e for later inputs (evicting the oldest). */
static void engine_put(struct fanout_engine *e, const struct fanout_config *c)
{
	int victim = 0;

	for (int i = 0; i < NCACHE; i++) {
		if (!cache[i].e) {
			victim = i;
			break;
		}
		if (cache[i].used < cache[victim].used)
			victim = i;
	}
	if (cache[victim].e)
		reap(cache[victim].e); /* settled: no child of it runs */
	cache[victim].e = e;
	cache[victim].cfg = *c;
	cache[victim].used = ninputs;
}

static void op_create(struct in *in)
{
	int k = byte(in) & 1;
	struct eng *g = &engs[k];
	struct fanout_config c;
	uint8_t sel = byte(in);
	int rc;

	if (g->e)
		return;
	memset(&c, 0, sizeof(c));
	c.workers = 1 + (byte(in) & 1);
	c.flags = ((sel & 1) ? FANOUT_NO_PIN : 0) |
		  ((sel & 2) ? FANOUT_WAIT_HELPS : 0);
	/* few values per field, so that inputs share configurations and
	 * with them cached engines; each still a boundary of its own */
	c.queue_slots =
		(const unsigned[]){0, 1, 3, 4, 5, 8, 16, 33}[byte(in) & 7];
	c.max_async = byte(in) % 5;
	c.max_children = byte(in) % 4;
	c.max_tasks = byte(in) % 9;
	c.max_depth = byte(in) % 4;
	c.keep_completed = byte(in) % 5;
	c.spin_ns = (const uint64_t[]){0, 1, 2000, 20000}[byte(in) & 3];
	switch (sel >> 4) { /* now and then, a bad field */
	case 1:
		c.flags |= 0x2;
		break;
	case 2:
		c.workers = 1025;
		break;
	case 3:
		c.max_tasks = (1u << 24) + 1;
		break;
	case 4:
		c.max_depth = 65;
		break;
	case 5:
		c.spin_ns = 2000000000ull;
		break;
	case 6:
		c.queue_slots = (1u << 24) + 1;
		break;
	case 7:
		c.max_async = (1u << 20) + 1;
		break;
	case 8:
		c.keep_completed = (1u << 24) + 1;
		break;
	case 9:
		c.max_children = (1u << 24) + 1;
		break;
	case 10:
		c.workers = 0;
		break; /* default: CPUs */
	default:
		break;
	}
	if (!cfg_valid(&c)) {
		rc = fanout_create(&c, &g->e);
		ENSURE(rc == -EINVAL && !g->e, "bad config accepted: %d", rc);
		return;
	}
	rc = fresh_mode ? fanout_create(&c, &g->e) : engine_get(&c, &g->e);
	ENSURE(rc == 0 && g->e, "fanout_create: %d", rc);
	g->cfg = c;
	g->gen = ++gen_counter;
	g->max_tasks = c.max_tasks ? c.max_tasks : 65536;
	g->max_depth = c.max_depth ? c.max_depth : 2;
	memset(g->sinks, 0, sizeof(g->sinks));
	g->sinks[0] = fanout_default_sink(g->e);
	ENSURE(g->sinks[0], "no default sink");
	g->shut = false;
}

static void op_destroy(int k, struct in *in)
{
	struct eng *g = &engs[k];

	if (!g->e)
		return;
	if (byte(in) & 1) { /* check everything arrived first */
		ENSURE(fanout_shutdown(g->e) == 0, "shutdown");
		g->shut = true;
		drain(k, in);
		all_arrived(k);
	}
	if (fresh_mode) {
		fanout_destroy(g->e);
	} else {
		/* fanout_destroy() begins with this; the rest (freeing what is
		 * left, undrained events included) runs on a reaper */
		ENSURE(fanout_shutdown(g->e) == 0, "shutdown");
		reap(g->e);
	}
	drop_sink(k, -1);
	memset(g, 0, sizeof(*g));
}

static void op_shutdown(int k, struct in *in)
{
	struct eng *g = &engs[k];
	struct fanout_sink *s = NULL;
	int rc;

	if (!g->e)
		return;
	ENSURE(fanout_shutdown(g->e) == 0, "shutdown");
	g->shut = true;
	if (byte(in) & 1) {
		drain(k, in);
		all_arrived(k);
	}
	rc = fanout_sink_create(g->e, &s);
	ENSURE(rc == -ESHUTDOWN && !s, "sink_create after shutdown: %d", rc);
}

static void op_sink_create(int k, struct in *in)
{
	struct eng *g = &engs[k];
	int slot = 1 + byte(in) % (NSINK - 1);
	int rc;

	if (!g->e || g->sinks[slot])
		return;
	rc = fanout_sink_create(g->e, &g->sinks[slot]);
	if (g->shut)
		ENSURE(rc == -ESHUTDOWN && !g->sinks[slot],
		       "sink after shutdown");
	else
		ENSURE(rc == 0 && g->sinks[slot], "sink_create: %d", rc);
}

static void op_sink_destroy(int k, struct in *in)
{
	struct eng *g = &engs[k];
	int slot = byte(in) % NSINK;
	int rc;

	if (!g->e || !g->sinks[slot])
		return;
	rc = fanout_sink_destroy(g->sinks[slot]);
	if (slot == 0) {
		ENSURE(rc == -EINVAL, "destroying the default sink: %d", rc);
		return;
	}
	ENSURE(rc == 0 || rc == -EBUSY, "sink_destroy: %d", rc);
	if (rc == 0) {
		drop_sink(k, slot);
		g->sinks[slot] = NULL;
	}
}

/* dispatch (0), run (1) or delegate (2) */
static void op_submit(int k, int how, struct in *in)
{
	struct eng *g = &engs[k];
	static struct fanout_task tasks[300];
	uint8_t shape = byte(in), beh[MAXN];
	unsigned n = shape & 0x3f;
	int sink = byte(in) % NSINK, rc;
	bool einval = false;
	struct fanout_batch b;
	struct fanout_event *ev = NULL;
	fanout_id id = 0;
	struct dl *d;

	if (!g->e)
		return;
	if (shape >= 0xf0)
		n = 65 + (shape & 0x0f) * 8; /* big: refused unless it fits */
	if (n > MAXN && n <= g->max_tasks)
		n = MAXN;
	for (unsigned i = 0; i < MAXN; i++)
		beh[i] = byte(in);
	if (!g->sinks[sink])
		sink = 0;
	d = dl_new(k, how == 1 ? -1 : sink, n, 1, beh);
	if (!d)
		return;
	mk_batch(d, tasks, n, &b);
	b.sink = sink ? g->sinks[sink] : (shape & 0x40) ? g->sinks[0] : NULL;
	switch (byte(in) % 12) { /* odd batches */
	case 1:
		b.tasks = NULL;
		einval = true;
		break;
	case 2:
		if (n)
			tasks[n - 1].fn = NULL;
		einval = true;
		break;
	case 3:
		if (engs[!k].e && how != 1) {
			b.sink = engs[!k].sinks[0];
			einval = true;
		}
		break;
	default:
		break;
	}
	einval |= n == 0;
	/* which of several applicable errors wins is not documented */
	bool refuse = einval || n > g->max_tasks || g->shut;
	if (how == 0)
		rc = fanout_dispatch(g->e, &b, (shape & 0x80) ? NULL : &id);
	else if (how == 1)
		rc = fanout_run(g->e, &b, &ev);
	else
		rc = fanout_delegate(g->e, &b, &id, &ev);
	if (refuse) {
		ENSURE((einval && rc == -EINVAL) ||
			       (n > g->max_tasks && rc == -E2BIG) ||
			       (g->shut && rc == -ESHUTDOWN),
		       "submit(%d) of a bad batch (n %u, shut %d, einval %d): "
		       "%d",
		       how, n, g->shut, einval, rc);
		atomic_store(&d->state, DL_REFUSED);
		ENSURE(atomic_load(&d->got) == 0, "event for refused call");
		return;
	}
	if (how == 0 || (how == 2 && rc == FANOUT_BACKGROUND)) {
		if (rc == 0 || rc == FANOUT_BACKGROUND) {
			ENSURE(!ev, "background set ev");
			if (id)
				atomic_store(&d->id, id);
			atomic_store(&d->state, DL_ACCEPTED);
			return;
		}
	}
	if (rc == -ENOMEM) {
		ENSURE(atomic_load(&fault_armed), "-ENOMEM without a fault");
		atomic_store(&d->state, DL_REFUSED);
		ENSURE(atomic_load(&d->got) == 0, "event for refused call");
		return;
	}
	if (rc == -EBUSY) {
		ENSURE(how == 0, "-EBUSY from run/delegate");
		atomic_store(&d->state, DL_REFUSED);
		ENSURE(atomic_load(&d->got) == 0, "event for refused call");
		return;
	}
	if (how == 1)
		ENSURE(rc == 0, "fanout_run: %d", rc);
	else
		ENSURE(rc == FANOUT_INLINE_FULL, "fanout_delegate: %d", rc);
	ENSURE(ev, "no event");
	if (how == 2)
		ENSURE(id == ev->id, "inline id");
	atomic_store(&d->state, DL_SYNC);
	check_event(ev, k, -1);
	fanout_event_free(ev);
}

/* A submit with the k-th allocation (from now, any thread) failing. */
static void op_fault_submit(int k, struct in *in)
{
	long at = 1 + byte(in) % 3;
	int how = byte(in) % 3;

	if (!engs[k].e)
		return;
	atomic_store(&fault_armed, 1);
	fanout_test_fail_at(FANOUT_FAULT_ALLOC, at);
	op_submit(k, how, in);
	fanout_test_fail_at(FANOUT_FAULT_ALLOC, 0);
}

static void op_cancel(int k, struct in *in)
{
	struct eng *g = &engs[k];
	unsigned n = atomic_load(&ndl), how = byte(in) % 5;
	uint8_t pick = byte(in);
	struct dl *d = NULL;
	fanout_id id;
	int rc;

	if (!g->e)
		return;
	if (n > MAX_DL)
		n = MAX_DL;
	if (n && pick < 200)
		d = &dls[pick % n];
	id = d ? atomic_load(&d->id) : (uint64_t)pick * 0x9e3779b97f4a7c15ull;
	if (how == 4)
		how = byte(in) & 1 ? 0x8 : 0;
	rc = fanout_cancel(g->e, id, how);
	if (!id || !how || how > 3)
		ENSURE(rc == -EINVAL, "cancel(%llx, %u): %d",
		       (unsigned long long)id, how, rc);
	else
		ENSURE(rc == 0 || rc == -ENOENT || rc == -EALREADY,
		       "cancel: %d", rc);
	/* ids are unique per engine only: the same number may name one of
	 * the other engine's delegations */
	if (rc == 0 && d && d->eng == k && d->gen == g->gen &&
	    atomic_load(&d->state) == DL_ACCEPTED) {
		atomic_store(&d->cancel_ok, 1);
		if (atomic_load(&d->got))
			ENSURE(atomic_load(&d->ev_cancelled),
			       "cancel returned 0, event not cancelled");
	}
}

static void op_lookup_list(int k, struct in *in)
{
	struct eng *g = &engs[k];
	struct fanout_info infos[8], info;
	unsigned n = atomic_load(&ndl);
	size_t cap = byte(in) % 9, seen = 0;
	fanout_id id;
	int rc;

	if (!g->e)
		return;
	if (n > MAX_DL)
		n = MAX_DL;
	id = n ? atomic_load(&dls[byte(in) % n].id) : 0;
	rc = fanout_lookup(g->e, id, &info);
	if (!id)
		ENSURE(rc == -EINVAL, "lookup(0): %d", rc);
	else
		ENSURE(rc == -ENOENT || (rc == 0 && info.id == id &&
					 info.ndone <= info.ntasks),
		       "lookup: %d", rc);
	rc = fanout_list(g->e, cap ? infos : NULL, cap, &seen);
	ENSURE(rc == 0, "list: %d", rc);
	for (size_t i = 0; i < seen && i < cap; i++) {
		ENSURE(infos[i].id && infos[i].ndone <= infos[i].ntasks,
		       "list entry");
		if (i)
			ENSURE(infos[i - 1].dispatched_ns >=
				       infos[i].dispatched_ns,
			       "list order");
	}
	ENSURE(fanout_list(g->e, NULL, 1, &seen) == -EINVAL, "list NULL cap 1");
}

static void op_consume(int k, bool wait, struct in *in)
{
	struct eng *g = &engs[k];
	int sink = byte(in) % NSINK, rc;
	struct fanout_event *ev = NULL;

	if (!g->e || !g->sinks[sink])
		return;
	if (wait)
		rc = fanout_wait(g->sinks[sink], &ev, byte(in) % 3);
	else
		rc = fanout_poll(g->sinks[sink], &ev);
	if (rc == 0) {
		receive(k, sink, ev, in);
		return;
	}
	ENSURE(rc == -EAGAIN || (wait && rc == -ETIMEDOUT), "poll/wait: %d",
	       rc);
}

static void op_fd(int k, struct in *in)
{
	struct eng *g = &engs[k];
	int sink = byte(in) % NSINK;
	struct pollfd p;
	struct fanout_event *ev;
	int fd, rc, ready;

	if (!g->e || !g->sinks[sink])
		return;
	fd = fanout_sink_fd(g->sinks[sink]);
	ENSURE(fd >= 0, "sink_fd: %d", fd);
	p.fd = fd;
	p.events = POLLIN;
	/* an event waiting => readable (spurious readiness is allowed);
	 * only knowable when nothing is being published: after shutdown */
	ready = poll(&p, 1, 0);
	rc = fanout_poll(g->sinks[sink], &ev);
	if (rc == 0) {
		if (g->shut)
			ENSURE(ready == 1, "event waited, fd not readable");
		receive(k, sink, ev, in);
	}
}

static void op_stats(int k)
{
	struct eng *g = &engs[k];
	struct fanout_stats st;
	char buf[64];

	if (!g->e)
		return;
	ENSURE(fanout_stats(g->e, &st) == 0, "stats");
	if (g->shut) /* exact once quiescent */
		ENSURE(st.completed == st.dispatched + st.runs && !st.running,
		       "completed %llu != dispatched %llu + runs %llu",
		       (unsigned long long)st.completed,
		       (unsigned long long)st.dispatched,
		       (unsigned long long)st.runs);
	ENSURE(st.nworkers >= 1, "nworkers");
	ENSURE(fanout_describe_error(g->e, -EBUSY, buf, sizeof(buf)) > 0,
	       "describe");
}

/*
 * End of an input for an engine that was not shut down: wait until it is
 * quiescent and every accepted delegation's event has been received (each
 * exactly once: check_event), then check the counters and empty the sinks
 * and destroy the created ones, so the engine can serve a later input.
 */
static void settle(int k, struct in *in)
{
	struct eng *g = &engs[k];
	struct fanout_stats st;
	struct timespec t0, t;
	unsigned missing = 0, spins = 0;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (;;) {
		unsigned n = atomic_load(&ndl);

		ENSURE(fanout_stats(g->e, &st) == 0, "stats");
		drain(k, in);
		if (n > MAX_DL)
			n = MAX_DL;
		missing = 0;
		for (unsigned i = 0; i < n; i++)
			missing += dls[i].eng == k &&
				   atomic_load(&dls[i].state) == DL_ACCEPTED &&
				   atomic_load(&dls[i].got) != 1;
		if (st.completed == st.dispatched + st.runs && !missing)
			break;
		if (++spins < 200) { /* the work left is usually short */
			sched_yield();
			continue;
		}
		clock_gettime(CLOCK_MONOTONIC, &t);
		ENSURE(t.tv_sec - t0.tv_sec < 20,
		       "LOST: not quiescent after 20 s: %u events missing, "
		       "completed %llu, dispatched %llu + runs %llu",
		       missing, (unsigned long long)st.completed,
		       (unsigned long long)st.dispatched,
		       (unsigned long long)st.runs);
		sleep_us(50);
	}
	all_arrived(k);
	ENSURE(!st.running, "running %u while quiescent", st.running);
	for (int s = 1; s < NSINK; s++) {
		if (!g->sinks[s])
			continue;
		ENSURE(fanout_sink_destroy(g->sinks[s]) == 0,
		       "destroying a drained sink");
		drop_sink(k, s);
		g->sinks[s] = NULL;
	}
}

static void reset(void)
{
	atomic_store(&fault_armed, 0);
	memset(engs, 0, sizeof(engs));
	/* only the records the last input used (all of them is ~0.5 MB) */
	unsigned n = atomic_load(&ndl);

	memset(dls, 0, sizeof(dls[0]) * (n < MAX_DL ? n : MAX_DL));
	atomic_store(&ndl, 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct in in = {data, size};
	int ops = 0;

	reset();
	while (in.n && ops++ < MAX_OPS) {
		uint8_t op = byte(&in);
		int k = (op >> 7) & 1;

		switch (op % 19) {
		case 0:
			op_create(&in);
			break;
		/* destroy and shutdown retire the engine (see the cache):
		 * taken one time in eight (never on a zero byte), so most
		 * inputs leave their engines to the next ones */
		case 1:
			if ((byte(&in) & 7) == 7)
				op_destroy(k, &in);
			break;
		case 2:
			if ((byte(&in) & 7) == 7)
				op_shutdown(k, &in);
			break;
		case 3:
			op_sink_create(k, &in);
			break;
		case 4:
			op_sink_destroy(k, &in);
			break;
		case 5:
		case 6:
			op_submit(k, 0, &in);
			break;
		case 7:
			op_submit(k, 1, &in);
			break;
		case 8:
			op_submit(k, 2, &in);
			break;
		case 9:
			op_cancel(k, &in);
			break;
		case 10:
			op_lookup_list(k, &in);
			break;
		case 11:
		case 12:
			op_consume(k, false, &in);
			break;
		case 13:
			op_consume(k, true, &in);
			break;
		case 14:
			op_fd(k, &in);
			break;
		case 15:
			op_stats(k);
			break;
		case 16:
			sleep_us(byte(&in) & 63);
			break;
		case 17: /* API edge calls with NULLs */
			ENSURE(fanout_dispatch(NULL, NULL, NULL) == -EINVAL,
			       "NULL");
			ENSURE(fanout_poll(NULL, NULL) == -EINVAL, "NULL");
			ENSURE(fanout_run(NULL, NULL, NULL) == -EINVAL, "NULL");
			ENSURE(fanout_sink_create(NULL, NULL) == -EINVAL,
			       "NULL");
			ENSURE(fanout_lookup(NULL, 1, NULL) == -EINVAL, "NULL");
			ENSURE(fanout_sink_destroy(NULL) == -EINVAL, "NULL");
			break;
		case 18:
			op_fault_submit(k, &in);
			break;
		}
	}
	/* the end: every engine settled and cached, or shut down, drained,
	 * checked and destroyed */
	ninputs++;
	for (int k = 0; k < NENG; k++) {
		struct eng *g = &engs[k];

		if (!g->e)
			continue;
		if (!g->shut && !fresh_mode) {
			settle(k, &in);
			engine_put(g->e, &g->cfg);
			memset(g, 0, sizeof(*g));
			continue;
		}
		ENSURE(fanout_shutdown(g->e) == 0, "final shutdown");
		g->shut = true;
		drain(k, &in);
		all_arrived(k);
		reap(g->e);
		memset(g, 0, sizeof(*g));
	}
	return 0;
}
