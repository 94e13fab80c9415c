// SPDX-License-Identifier: MIT
/*
 * nats_serve.c - the worker side: fanout_nats_serve().
 *
 * One thread (the caller's) pulls children of one kind and hands each to
 * a local fanout engine as a one-child background delegation whose event
 * comes back to a private sink; handlers therefore run on the engine's
 * workers, use fanout_interrupted() and the fanout_set_* calls like any
 * child, and a process serves as many children at once as it has
 * cores.  The same thread watches the cancel subject, keeps the running
 * children's messages alive with InProgress, publishes each outcome
 * (waiting for JetStream's ack, with Nats-Msg-Id "r.<key>" so a second
 * run's outcome is stored at most once within the duplicate window) and
 * only then acks the child.  So a worker killed at any point leaves the
 * child unacked, and JetStream redelivers it after AckWait.
 *
 * A message can reach the inbox when no request of ours is open: an idle
 * wait for one ends here while the server still holds the request for
 * about the network delay, and a message published in that gap is sent
 * to it.  Left unread while every slot is busy, it would not be kept
 * alive and would be redelivered to another worker after AckWait, then
 * run here too once a slot frees (the child run twice).  So a busy
 * worker reads its inbox without asking for more, keeps what it finds
 * (held) alive with InProgress like a running child, starts it first
 * when a slot frees, and hands it back (Nak) when it stops.  It holds at
 * most max_held (default: its concurrency): more would wait for a second
 * round of slots while an idle worker could run them, and nothing else
 * bounds how many a slow server's late replies bring.  Beyond that each
 * is handed back at once, with a delay (FNATS_NAK_DELAYED) so that a
 * request of ours still open at the server does not take it again.
 * One held whose dispatcher's cancel notice comes is answered -ECANCELED
 * at once (answer_held_cancelled()).
 *
 * Stopping, it hands back what it holds and what reaches its inbox until
 * the last of its pull requests has expired at the server: a message
 * that came after the first look (a request of an idle worker still open
 * for up to 100 ms) was otherwise left unread, and went to another
 * worker only after AckWait.
 */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <unistd.h>

#include "nats_internal.h"

#define CANCEL_RING 4096

struct job {
	struct fanout_nats_job pub; /* the handler's arg */
	natsMsg *msg;
	const char *reply; /* in msg's headers */
	char key[FNATS_KEY_MAX];
	fanout_id id;
	bool cancelled; /* by the dispatcher's notice */
	struct job *prev, *next;
	char *body; /* the encoded outcome, while it is being published */
	size_t blen;
	struct job *pnext;   /* publishing list / retry list */
	uint64_t retry_at;   /* on the retry list: not sent again before */
	unsigned backoff_ms; /* the last wait; 0 = never failed */
};

/* A message read while every slot was busy, not started yet. */
struct held {
	natsMsg *msg;
	struct held *next;
};

struct server {
	const struct fanout_nats_serve_opts *o;
	struct fnats_names nm;
	natsConnection *nc;
	jsCtx *js;
	natsSubscription *sub, *csub; /* sub binds the consumer, never read */
	struct fnats_puller pull;     /* reads it (nats_common.c) */
	struct fanout_engine *e;
	struct fanout_sink *sink;
	struct job head; /* running, a ring */
	unsigned running;
	struct held *held, **held_tail; /* FIFO, see the top */
	unsigned nheld, max_held;
	int ack_wait_ms;	/* the consumer's, as it is (setup) */
	unsigned progress_ms;	/* keep-alive period */
	uint64_t next_progress; /* the next keep-alive is due */
	size_t max_payload;	/* the server's */
	uint64_t refused_until; /* the engine refused a child: busy till */
	bool stopping;
	char ring[CANCEL_RING][FNATS_KEY_MAX]; /* recent cancel notices */
	unsigned ring_next;
	/* Outcomes published, waiting for JetStream's ack (which runs on a
	 * libnats thread, hence the lock; see fanout_nats.h THREADS). */
	pthread_mutex_t lock;
	struct job *publishing, *retry;
	/* Outcomes given to send_outcome() whose child is not acked yet: on
	 * either list, between do_retries()' lists, or in result_ack()
	 * between the list and the ack.  A retry is the same outcome, not
	 * one more (it was counted again at each retry and never taken
	 * back: after one, a stop always waited its full 3 s). */
	unsigned nunsettled;
	/* o->stats' values; only the loop's thread publishes outcomes */
	uint64_t n_publishes, n_retries;
};

static bool stop_asked(const struct server *sv)
{
	/* relaxed: the flag carries no data, only "stop soon"; atomic so that
	 * another thread's __atomic_store_n (fanout_nats.h) is no race. */
	return sv->o->stop && __atomic_load_n(sv->o->stop, __ATOMIC_RELAXED);
}

static bool ring_has(const struct server *sv, const char *key)
{
	unsigned i;

	for (i = 0; i < CANCEL_RING; i++)
		if (sv->ring[i][0] && !strcmp(sv->ring[i], key))
			return true;
	return false;
}

static void answer_unrun(struct server *sv, natsMsg *msg, const char *reply,
			 const char *key, unsigned delivery);
static bool result_subject_ok(const char *reply);

/* @msg's child was cancelled by its dispatcher (a notice we recorded):
 * answer it -ECANCELED unrun and return true; else false, @msg still
 * the caller's. */
static bool answer_if_cancelled(struct server *sv, natsMsg *msg)
{
	const char *key = NULL, *reply = NULL;

	if (natsMsgHeader_Get(msg, FNATS_HDR_KEY, &key) != NATS_OK ||
	    natsMsgHeader_Get(msg, FNATS_HDR_REPLY, &reply) != NATS_OK ||
	    !key || !reply || strlen(key) >= FNATS_KEY_MAX ||
	    !result_subject_ok(reply) || !ring_has(sv, key))
		return false;
	answer_unrun(sv, msg, reply, key, fnats_delivery(msg));
	return true;
}

/*
 * Held messages whose child was cancelled are answered now, not kept for
 * a slot.  Kept, such a child was handed back when the worker stopped,
 * and a worker that was not subscribed when the notice went out (the
 * notice is core NATS, not stored) ran it: the dispatcher's cancel lost.
 */
static void answer_held_cancelled(struct server *sv)
{
	struct held **pp = &sv->held, *h;

	while ((h = *pp)) {
		if (!answer_if_cancelled(sv, h->msg)) {
			pp = &h->next;
			continue;
		}
		*pp = h->next;
		if (!*pp)
			sv->held_tail = pp;
		sv->nheld--;
		free(h);
	}
}

static void drain_cancels(struct server *sv)
{
	natsMsg *m = NULL;
	bool recorded = false;

	while (natsSubscription_NextMsg(&m, sv->csub, 0) == NATS_OK) {
		char key[FNATS_KEY_MAX];
		int len = natsMsg_GetDataLength(m);
		struct job *j;

		if (len > 0 && len < FNATS_KEY_MAX) {
			memcpy(key, natsMsg_GetData(m), (size_t)len);
			key[len] = '\0';
			for (j = sv->head.next; j != &sv->head; j = j->next)
				if (!strcmp(j->key, key))
					break;
			if (j != &sv->head) {
				j->cancelled = true;
				fanout_cancel(sv->e, j->id,
					      FANOUT_CANCEL_INTERRUPT);
			} else {
				snprintf(sv->ring[sv->ring_next], FNATS_KEY_MAX,
					 "%s", key);
				sv->ring_next =
					(sv->ring_next + 1) % CANCEL_RING;
				recorded = true;
			}
		}
		natsMsg_Destroy(m);
		m = NULL;
	}
	if (recorded && sv->held)
		answer_held_cancelled(sv);
}

static natsStatus publish_outcome(struct server *sv, struct job *j)
{
	char id[FNATS_KEY_MAX + 2], dv[16];
	jsPubOptions po;
	natsMsg *m = NULL;
	natsStatus s;

	sv->n_publishes++;
	if (j->backoff_ms)
		sv->n_retries++;
	if (sv->o->stats) {
		/* Relaxed: plain counters for a reader on another thread
		 * (fanout_nats.h, @stats); nothing is published with them. */
		__atomic_store_n(&sv->o->stats->outcome_publishes,
				 sv->n_publishes, __ATOMIC_RELAXED);
		__atomic_store_n(&sv->o->stats->outcome_retries, sv->n_retries,
				 __ATOMIC_RELAXED);
	}
	snprintf(id, sizeof(id), "r.%s", j->key);
	snprintf(dv, sizeof(dv), "%u", j->pub.delivery);
	jsPubOptions_Init(&po);
	po.MaxWait = 5000; /* a lost ack is retried, under the same id */
	s = natsMsg_Create(&m, j->reply, NULL, j->body, (int)j->blen);
	if (s == NATS_OK)
		s = natsMsgHeader_Set(m, "Nats-Msg-Id", id);
	if (s == NATS_OK)
		s = natsMsgHeader_Set(m, FNATS_HDR_KEY, j->key);
	if (s == NATS_OK)
		s = natsMsgHeader_Set(m, FNATS_HDR_DELIVERY, dv);
	if (s == NATS_OK)
		s = js_PublishMsgAsync(sv->js, &m, &po);
	natsMsg_Destroy(m);
	return s;
}

/*
 * A failed outcome publish (the results stream missing: no responders;
 * the server away: no ack within MaxWait) waits before it is sent again:
 * RETRY_FIRST_MS after the first failure, doubled after each, at most
 * RETRY_MAX_MS.  It was sent again on every pass of the loop (up to
 * every 2 ms while children run), flooding a server that had lost its
 * stream.  The child stays ours meanwhile: progress() keeps its message
 * alive.
 */
#define RETRY_FIRST_MS 100
#define RETRY_MAX_MS 2000

/* o->stats' outcomes_unsettled from sv->nunsettled; under sv->lock,
 * so the last store is the last value. */
static void note_unsettled(struct server *sv)
{
	/* Relaxed: as in publish_outcome(). */
	if (sv->o->stats)
		__atomic_store_n(&sv->o->stats->outcomes_unsettled,
				 (uint64_t)sv->nunsettled, __ATOMIC_RELAXED);
}

/* Put @j on the retry list, not to be sent before its backoff; under
 * sv->lock. */
static void retry_later(struct server *sv, struct job *j)
{
	j->backoff_ms = !j->backoff_ms			  ? RETRY_FIRST_MS :
			j->backoff_ms >= RETRY_MAX_MS / 2 ? RETRY_MAX_MS :
							    j->backoff_ms * 2;
	j->retry_at = fnats_now_ms() + j->backoff_ms;
	j->pnext = sv->retry;
	sv->retry = j;
}

static void job_free(struct job *j)
{
	natsMsg_Destroy(j->msg);
	free(j->body);
	free(j);
}

/* JetStream stored the outcome (ack the child) or did not (retry). */
static void result_ack(jsCtx *js, natsMsg *m, jsPubAck *pa, jsPubAckErr *pae,
		       void *closure)
{
	struct server *sv = closure;
	const char *key = NULL;
	struct job **pp, *j = NULL;

	natsMsgHeader_Get(m, FNATS_HDR_KEY, &key);
	pthread_mutex_lock(&sv->lock);
	for (pp = &sv->publishing; key && *pp; pp = &(*pp)->pnext) {
		if (!strcmp((*pp)->key, key)) {
			j = *pp;
			*pp = j->pnext;
			break;
		}
	}
	if (j && !pa) {
		retry_later(sv, j);
		j = NULL;
	}
	pthread_mutex_unlock(&sv->lock);
	natsMsg_Destroy(m);
	if (!j)
		return;
	/* only now: the outcome is stored */
	fnats_ack(sv->nc, j->msg, FNATS_ACK);
	job_free(j);
	/* Settled only once acked: a stop that saw 0 earlier closed the
	 * connection (the ack lost, the child run again) and freed sv under
	 * us.  Nothing of sv is touched after the unlock. */
	pthread_mutex_lock(&sv->lock);
	sv->nunsettled--;
	note_unsettled(sv);
	pthread_mutex_unlock(&sv->lock);
}

/* (Re)send @j's outcome; result_ack() finishes the job. */
static void publish_or_retry(struct server *sv, struct job *j)
{
	pthread_mutex_lock(&sv->lock);
	j->pnext = sv->publishing;
	sv->publishing = j;
	pthread_mutex_unlock(&sv->lock);
	if (publish_outcome(sv, j) == NATS_OK)
		return;
	pthread_mutex_lock(&sv->lock);
	{
		struct job **pp;

		for (pp = &sv->publishing; *pp && *pp != j; pp = &(*pp)->pnext)
			;
		if (*pp) {
			*pp = j->pnext;
			retry_later(sv, j);
		}
	}
	pthread_mutex_unlock(&sv->lock);
}

/* Hand @j's outcome to JetStream, counted unsettled until its child is
 * acked. */
static void send_outcome(struct server *sv, struct job *j)
{
	pthread_mutex_lock(&sv->lock);
	sv->nunsettled++;
	note_unsettled(sv);
	pthread_mutex_unlock(&sv->lock);
	publish_or_retry(sv, j);
}

/* Send again the outcomes whose backoff has passed. */
static void do_retries(struct server *sv)
{
	struct job *j, *next, *due = NULL, **pp;
	uint64_t now = fnats_now_ms();

	pthread_mutex_lock(&sv->lock);
	for (pp = &sv->retry; (j = *pp);) {
		if (j->retry_at <= now) {
			*pp = j->pnext;
			j->pnext = due;
			due = j;
		} else {
			pp = &j->pnext;
		}
	}
	pthread_mutex_unlock(&sv->lock);
	for (j = due; j; j = next) {
		next = j->pnext;
		publish_or_retry(sv, j);
	}
}

static struct job *job_for_outcome(natsMsg *msg, const char *reply,
				   const char *key, unsigned delivery,
				   const struct fanout_result *r)
{
	struct job *j = calloc(1, sizeof(*j));

	if (!j)
		return NULL;
	if (fnats_encode_outcome(r, &j->body, &j->blen)) {
		free(j);
		return NULL;
	}
	j->msg = msg;
	j->reply = reply;
	snprintf(j->key, sizeof(j->key), "%s", key);
	j->pub.delivery = delivery;
	return j;
}

/* Hand @msg back to JetStream for another worker, and drop our copy. */
static void nak_drop(struct server *sv, natsMsg *msg)
{
	fnats_ack(sv->nc, msg, FNATS_NAK);
	natsMsg_Destroy(msg);
}

static void answer_unrun(struct server *sv, natsMsg *msg, const char *reply,
			 const char *key, unsigned delivery)
{
	struct fanout_result r = {
		.status = FANOUT_INTERRUPTED,
		.code = -ECANCELED,
		.error = "cancelled by the dispatcher before a worker ran it",
	};

	struct job *j = job_for_outcome(msg, reply, key, delivery, &r);

	if (!j) {
		nak_drop(sv, msg);
		return;
	}
	send_outcome(sv, j);
}

/* "fanout.result.<dispatcher id>", as a dispatcher names its own. */
static bool result_subject_ok(const char *reply)
{
	static const char prefix[] = "fanout.result.";

	return !strncmp(reply, prefix, sizeof(prefix) - 1) &&
	       fnats_id_ok(reply + sizeof(prefix) - 1);
}

/* How long a worker whose engine refused a child (-EBUSY) takes no
 * other before it tries again. */
#define REFUSED_MS 20

static void hold_front(struct server *sv, natsMsg *msg);

/* Start the child of @msg.  Return: 0 (started, answered, or handed
 * back); -EBUSY when the engine refused it, the message then held
 * first. */
static int start(struct server *sv, natsMsg *msg)
{
	const char *key = NULL, *reply = NULL;
	unsigned delivery;
	struct fanout_task t;
	struct fanout_batch b;
	struct job *j;
	int err;

	if (natsMsgHeader_Get(msg, FNATS_HDR_KEY, &key) != NATS_OK ||
	    natsMsgHeader_Get(msg, FNATS_HDR_REPLY, &reply) != NATS_OK ||
	    !key || !reply || strlen(key) >= FNATS_KEY_MAX ||
	    !result_subject_ok(reply)) {
		/* Not ours: never redeliver it.  An outcome sent to a subject
		 * no stream stores would be retried for ever. */
		fnats_ack(sv->nc, msg, FNATS_TERM);
		natsMsg_Destroy(msg);
		return 0;
	}
	delivery = fnats_delivery(msg);
	if (ring_has(sv, key)) {
		answer_unrun(sv, msg, reply, key, delivery);
		return 0;
	}
	j = calloc(1, sizeof(*j));
	if (!j) {
		nak_drop(sv, msg);
		return 0;
	}
	j->msg = msg;
	j->reply = reply;
	snprintf(j->key, sizeof(j->key), "%s", key);
	j->pub = (struct fanout_nats_job){
		.payload = natsMsg_GetData(msg),
		.len = (size_t)natsMsg_GetDataLength(msg),
		.kind = sv->o->kind,
		.key = j->key,
		.delivery = delivery,
		.user = sv->o->handler_arg,
	};
	t = (struct fanout_task){
		.goal = j->key, .fn = sv->o->handler, .arg = &j->pub};
	b = (struct fanout_batch){
		.tasks = &t, .ntasks = 1, .sink = sv->sink, .user = j};
	j->next = &sv->head;
	j->prev = sv->head.prev;
	j->prev->next = j;
	sv->head.prev = j;
	err = fanout_dispatch(sv->e, &b, &j->id);
	if (err) {
		j->prev->next = j->next;
		j->next->prev = j->prev;
		free(j);
		if (err == -EBUSY) {
			/* The engine is full (a caller's engine, its other
			 * delegations): we are busy.  Handed back, the child
			 * came straight back to our own open request, a
			 * delivery each time, until MaxDeliver. */
			hold_front(sv, msg);
			sv->refused_until = fnats_now_ms() + REFUSED_MS;
			return -EBUSY;
		}
		/* another worker may take it; not our own open request */
		fnats_ack(sv->nc, msg, FNATS_NAK_DELAYED);
		natsMsg_Destroy(msg);
		return 0;
	}
	sv->running++;
	return 0;
}

/*
 * @r encoded into @j's body; one the server would refuse (over its
 * max_payload with the headers) becomes an ERROR saying so, -EMSGSIZE.
 * Sent as it was, its publish failed at once and was retried for ever,
 * while its message, no longer kept alive, was redelivered and the child
 * run again until MaxDeliver.
 */
static int encode_for_wire(struct server *sv, const struct fanout_result *r,
			   struct job *j)
{
	struct fanout_result refused;
	char text[200];
	int err = fnats_encode_outcome(r, &j->body, &j->blen);

	if (err || j->blen + FNATS_HEADER_ROOM <= sv->max_payload)
		return err;
	snprintf(text, sizeof(text),
		 "remote child: its outcome (%zu bytes) is over the server's "
		 "max_payload (%zu) less %d bytes of headers",
		 j->blen, sv->max_payload, FNATS_HEADER_ROOM);
	free(j->body);
	j->body = NULL;
	refused = (struct fanout_result){.status = FANOUT_ERROR,
					 .code = -EMSGSIZE,
					 .error = text,
					 .cost = r->cost};
	return fnats_encode_outcome(&refused, &j->body, &j->blen);
}

static void finish(struct server *sv, struct fanout_event *ev)
{
	struct job *j = ev->user;
	const struct fanout_result *r = &ev->results[0];

	j->prev->next = j->next;
	j->next->prev = j->prev;
	sv->running--;
	if (sv->stopping && !j->cancelled && r->status != FANOUT_COMPLETED) {
		/* Interrupted by our own stop: hand it to another worker,
		 * whatever the handler made of the interrupt.  A handler
		 * that gives up with an error of its own (an exec'd command
		 * killed, an aborted request) failed because of this stop,
		 * not because of the child: sending that would finish the
		 * child as an ERROR another worker would not have had.  One
		 * that completed anyway is sent. */
		fnats_ack(sv->nc, j->msg, FNATS_NAK);
		job_free(j);
	} else if (encode_for_wire(sv, r, j)) {
		fnats_ack(sv->nc, j->msg, FNATS_NAK);
		job_free(j);
	} else {
		send_outcome(sv, j);
	}
	fanout_event_free(ev);
}

static void reap(struct server *sv, int timeout_ms)
{
	struct fanout_event *ev;

	if (fanout_wait(sv->sink, &ev, timeout_ms) != 0)
		return;
	finish(sv, ev);
	while (fanout_poll(sv->sink, &ev) == 0)
		finish(sv, ev);
}

static void progress(struct server *sv)
{
	struct job *j;
	struct held *h;

	for (j = sv->head.next; j != &sv->head; j = j->next)
		fnats_ack(sv->nc, j->msg, FNATS_WPI);
	for (h = sv->held; h; h = h->next)
		fnats_ack(sv->nc, h->msg, FNATS_WPI);
	/* Ran, outcome not stored yet (a publish in flight, or failing and
	 * retried): still ours.  Let go, the child was redelivered after
	 * AckWait and ran again. */
	pthread_mutex_lock(&sv->lock);
	for (j = sv->publishing; j; j = j->pnext)
		fnats_ack(sv->nc, j->msg, FNATS_WPI);
	for (j = sv->retry; j; j = j->pnext)
		fnats_ack(sv->nc, j->msg, FNATS_WPI);
	pthread_mutex_unlock(&sv->lock);
}

/* A keep-alive, when one is due: while serving and while stopping (a
 * handler slow to stop, an outcome still being stored), or its child was
 * redelivered to another worker after AckWait and ran there too. */
static void progress_if_due(struct server *sv)
{
	if (fnats_now_ms() < sv->next_progress)
		return;
	progress(sv);
	sv->next_progress = fnats_now_ms() + sv->progress_ms;
}

/* Busy: keep what came to the inbox anyway, up to max_held (see the
 * top). */
static void hold_queued(struct server *sv)
{
	natsMsg *m = NULL;

	while (fnats_pull_queued(&sv->pull, &m) == 0) {
		struct held *h;

		if (answer_if_cancelled(sv, m))
			continue;
		if (sv->nheld >= sv->max_held) {
			/* an idle worker takes it; not one of our requests */
			fnats_ack(sv->nc, m, FNATS_NAK_DELAYED);
			natsMsg_Destroy(m);
			continue;
		}
		h = malloc(sizeof(*h));
		if (!h) {
			/* another worker may take it */
			nak_drop(sv, m);
			continue;
		}
		h->msg = m;
		h->next = NULL;
		*sv->held_tail = h;
		sv->held_tail = &h->next;
		sv->nheld++;
	}
}

/* A message that was to start and could not: first in line again. */
static void hold_front(struct server *sv, natsMsg *msg)
{
	struct held *h = malloc(sizeof(*h));

	if (!h) {
		fnats_ack(sv->nc, msg, FNATS_NAK_DELAYED);
		natsMsg_Destroy(msg);
		return;
	}
	h->msg = msg;
	h->next = sv->held;
	if (!sv->held)
		sv->held_tail = &h->next;
	sv->held = h;
	sv->nheld++;
}

static natsMsg *unhold(struct server *sv)
{
	struct held *h = sv->held;
	natsMsg *m;

	if (!h)
		return NULL;
	sv->held = h->next;
	if (!sv->held)
		sv->held_tail = &sv->held;
	sv->nheld--;
	m = h->msg;
	free(h);
	return m;
}

/* How long a stopping worker reads its inbox after its last request's
 * wait ended here: the server's end of it starts later, by the network
 * delay. */
#define STOP_DRAIN_MS 200

/* Stopping: hand back (Nak, no delay: another worker may run it now)
 * what is held and what is in the inbox. */
static void hand_back_unstarted(struct server *sv)
{
	natsMsg *m = NULL;

	/* One whose cancel notice we recorded is answered, not handed back:
	 * the worker that would take it may not have had the notice. */
	drain_cancels(sv);
	while ((m = unhold(sv)))
		if (!answer_if_cancelled(sv, m))
			nak_drop(sv, m);
	while (fnats_pull_queued(&sv->pull, &m) == 0)
		if (!answer_if_cancelled(sv, m))
			nak_drop(sv, m);
}

static int setup(struct server *sv, unsigned *conc)
{
	const struct fanout_nats_serve_opts *o = sv->o;
	jsSubOptions so;
	jsOptions jo;
	jsErrCode jerr = 0;
	natsStatus s;
	int ack_wait = o->ack_wait_ms > 0 ? o->ack_wait_ms : 30000;
	int err, attempt;

	if (o->engine) {
		sv->e = o->engine;
		if (!*conc) {
			struct fanout_stats st;

			fanout_stats(sv->e, &st);
			*conc = st.nworkers ? st.nworkers : 1;
		}
	} else {
		struct fanout_config cfg = {0};

		if (!*conc)
			*conc = 1;
		cfg.workers = *conc;
		cfg.flags = FANOUT_NO_PIN;
		cfg.max_async = *conc + 16;
		cfg.spin_ns = 1000;
		err = fanout_create(&cfg, &sv->e);
		if (err)
			return err;
	}
	err = fanout_sink_create(sv->e, &sv->sink);
	if (err)
		return err;
	jsOptions_Init(&jo);
	jo.PublishAsync.MaxPending = 4096;
	jo.PublishAsync.AckHandler = result_ack;
	jo.PublishAsync.AckHandlerClosure = sv;
	err = fnats_connect(o->url, 2000, "fanout-worker", &sv->nc, &sv->js,
			    &jo);
	if (err)
		return err;
	sv->max_payload = (size_t)natsConnection_GetMaxPayload(sv->nc);
	err = fnats_ensure_stream(sv->js, sv->nm.stream, sv->nm.work, true, 0);
	if (err)
		return err;
	/* The kind's consumer is shared: one that exists is served as it
	 * is.  Asked for with our AckWait and MaxDeliver, libnats refuses
	 * it when they differ (configuration mismatch); and its AckWait,
	 * not ours, is what the keep-alive must beat.  Twice: another
	 * worker may create it between the look and the binding. */
	for (attempt = 0;; attempt++) {
		jsConsumerInfo *ci = NULL;
		bool exists = false;

		if (js_GetConsumerInfo(&ci, sv->js, sv->nm.stream,
				       sv->nm.durable, NULL, NULL) == NATS_OK) {
			int64_t ms =
				ci->Config ? ci->Config->AckWait / 1000000 : 0;

			exists = true;
			if (ms > 0)
				ack_wait = ms > INT_MAX ? INT_MAX : (int)ms;
			jsConsumerInfo_Destroy(ci);
		}
		jsSubOptions_Init(&so);
		so.Stream = sv->nm.stream;
		so.Config.AckPolicy = js_AckExplicit;
		if (!exists) {
			so.Config.AckWait = (int64_t)ack_wait * 1000000;
			so.Config.MaxDeliver =
				o->max_deliver > 0 ? o->max_deliver : 5;
			so.Config.MaxAckPending = 65536;
		}
		s = js_PullSubscribe(&sv->sub, sv->js, sv->nm.work,
				     sv->nm.durable, NULL, &so, &jerr);
		if (s == NATS_OK)
			break;
		sv->sub = NULL;
		if (s == NATS_NO_MEMORY)
			return -ENOMEM;
		if (exists || attempt)
			return -EPROTO;
		ack_wait = o->ack_wait_ms > 0 ? o->ack_wait_ms : 30000;
	}
	sv->ack_wait_ms = ack_wait > 0 ? ack_wait : 1;
	/* a keep-alive no sooner than AckWait: refused (see the caller) */
	if (o->progress_ms >= sv->ack_wait_ms)
		return -EINVAL;
	err = fnats_puller_open(&sv->pull, sv->nc, sv->nm.stream,
				sv->nm.durable);
	if (err)
		return err;
	s = natsConnection_SubscribeSync(&sv->csub, sv->nc, sv->nm.cancel);
	if (s == NATS_OK)
		s = natsSubscription_SetPendingLimits(sv->csub, -1, -1);
	if (s == NATS_OK)
		s = natsConnection_Flush(sv->nc);
	return s == NATS_OK ? 0 : fnats_errno(s);
}

/* Start the children that are there, up to @conc running: those held
 * first (and only those, this time); busy, only what is there now; idle,
 * waiting up to 100 ms for one.  Returns how
 * many it started, or a negative errno when it started none. */
static int take(struct server *sv, unsigned conc)
{
	int want, got = 0, err = 0;
	bool busy;
	uint64_t until;
	natsMsg *h;

	/* those read while busy first: they came first */
	while (sv->running < conc && (h = unhold(sv))) {
		if (start(sv, h) == -EBUSY)
			return got;
		got++;
	}
	if (got)
		return got;
	want = (int)(conc - sv->running);
	busy = sv->running > 0;
	until = fnats_now_ms() + (busy ? 0 : 100);

	while (got < want) {
		natsMsg *m = NULL;

		/* What is there first; idle and given nothing, wait for
		 * ONE (a batch of 1 is served as soon as it comes). */
		err = fnats_pull(&sv->pull, want - got, true, until, &m);
		if (err == -ETIMEDOUT && !busy && !got)
			err = fnats_pull(&sv->pull, 1, false, until, &m);
		if (err)
			break;
		if (start(sv, m) == -EBUSY)
			return got;
		got++;
	}
	return got ? got : err;
}

int fanout_nats_serve(const struct fanout_nats_serve_opts *o)
{
	struct server *sv;
	unsigned conc;
	int err;

	if (!o || !o->handler || !fnats_kind_ok(o->kind))
		return -EINVAL;
	/* Negative, or a keep-alive no sooner than AckWait (each child that
	 * runs longer would be redelivered while it runs): refused before
	 * anything is made.  setup() checks progress_ms again against the
	 * AckWait of a consumer that exists. */
	if (o->ack_wait_ms < 0 || o->max_deliver < 0 || o->progress_ms < 0 ||
	    (o->progress_ms &&
	     o->progress_ms >= (o->ack_wait_ms ? o->ack_wait_ms : 30000)))
		return -EINVAL;
	sv = calloc(1, sizeof(*sv));
	if (!sv)
		return -ENOMEM;
	sv->o = o;
	if (o->stats) {
		/* Relaxed: as in publish_outcome(). */
		__atomic_store_n(&o->stats->outcome_publishes, 0,
				 __ATOMIC_RELAXED);
		__atomic_store_n(&o->stats->outcome_retries, 0,
				 __ATOMIC_RELAXED);
		__atomic_store_n(&o->stats->outcomes_unsettled, 0,
				 __ATOMIC_RELAXED);
	}
	fnats_names(o->kind, &sv->nm);
	sv->head.next = sv->head.prev = &sv->head;
	sv->held_tail = &sv->held;
	pthread_mutex_init(&sv->lock, NULL);
	conc = o->concurrency;
	err = setup(sv, &conc);
	if (err)
		goto out;
	sv->max_held = o->max_held ? o->max_held : conc;
	sv->progress_ms = o->progress_ms > 0 ? (unsigned)o->progress_ms :
			  sv->ack_wait_ms / 3 > 0 ?
					       (unsigned)sv->ack_wait_ms / 3 :
					       1;
	sv->next_progress = fnats_now_ms() + sv->progress_ms;
	while (!stop_asked(sv)) {
		drain_cancels(sv);
		do_retries(sv);
		if (sv->running < conc && fnats_now_ms() >= sv->refused_until) {
			int got = take(sv, conc);

			/* reconnecting, or refused (409): not again at once */
			if (got < 0 && got != -ETIMEDOUT)
				usleep(50000);
			reap(sv, got > 0 || !sv->running ? 0 : 2);
		} else {
			hold_queued(sv);
			reap(sv, 20);
		}
		progress_if_due(sv);
	}
	/* Stop: interrupt what runs and give it back. */
	sv->stopping = true;
	/* Read but never started: give them back at once, not after
	 * AckWait. */
	hand_back_unstarted(sv);
	{
		struct job *j;

		for (j = sv->head.next; j != &sv->head; j = j->next)
			fanout_cancel(sv->e, j->id, FANOUT_CANCEL_INTERRUPT);
	}
	while (sv->running) {
		hand_back_unstarted(sv);
		reap(sv, 100);
		progress_if_due(sv);
	}
	/* Until the last request we sent has expired at the server, what it
	 * brings is handed back too (see the top). */
	{
		uint64_t now = fnats_now_ms();
		uint64_t until =
			(sv->pull.asked && sv->pull.open_until_ms > now ?
				 sv->pull.open_until_ms :
				 now) +
			STOP_DRAIN_MS;

		do {
			hand_back_unstarted(sv);
			progress_if_due(sv);
			usleep(10000);
		} while (fnats_now_ms() < until);
		hand_back_unstarted(sv);
	}
	/* Outcomes on their way: give them a moment to be stored. */
	{
		uint64_t t0 = fnats_now_ms();

		while (fnats_now_ms() - t0 < 3000) {
			unsigned left;

			do_retries(sv);
			pthread_mutex_lock(&sv->lock);
			left = sv->nunsettled;
			pthread_mutex_unlock(&sv->lock);
			if (!left)
				break;
			progress_if_due(sv);
			usleep(10000);
		}
	}
	/* Still not stored: hand the children back (Nak) so another worker
	 * runs them now.  Left unacked, each waited out AckWait and then ran
	 * again anyway.  Not Term: no outcome would ever reach the
	 * dispatcher.  An outcome stored after all (its ack lost) makes the
	 * rerun's a duplicate, stored once (same Nats-Msg-Id) or dropped by
	 * the dispatcher: still one event. */
	{
		struct job *pub, *retry, *j;
		unsigned left;

		pthread_mutex_lock(&sv->lock);
		pub = sv->publishing;
		retry = sv->retry;
		sv->publishing = sv->retry = NULL;
		for (j = pub; j; j = j->pnext)
			sv->nunsettled--;
		for (j = retry; j; j = j->pnext)
			sv->nunsettled--;
		note_unsettled(sv);
		pthread_mutex_unlock(&sv->lock);
		for (j = pub; j; j = j->pnext)
			fnats_ack(sv->nc, j->msg, FNATS_NAK);
		for (j = retry; j; j = j->pnext)
			fnats_ack(sv->nc, j->msg, FNATS_NAK);
		/* What is left is in result_ack() between its list and its
		 * ack, about to ack: let it, before sv and the connection
		 * go. */
		do {
			pthread_mutex_lock(&sv->lock);
			left = sv->nunsettled;
			pthread_mutex_unlock(&sv->lock);
			if (left)
				usleep(1000);
		} while (left);
		natsConnection_FlushTimeout(sv->nc, 1000);
		while ((j = pub)) {
			pub = j->pnext;
			job_free(j);
		}
		while ((j = retry)) {
			retry = j->pnext;
			job_free(j);
		}
	}
	err = 0;
out:
	/* Closed first, as the dispatcher does (nats_dispatch.c, destroy):
	 * no reply may reach a subscription while it is destroyed. */
	if (sv->nc)
		natsConnection_Close(sv->nc);
	if (sv->csub)
		natsSubscription_Destroy(sv->csub);
	fnats_puller_close(&sv->pull);
	if (sv->sub)
		natsSubscription_Destroy(sv->sub);
	if (sv->js)
		jsCtx_Destroy(sv->js);
	if (sv->nc)
		natsConnection_Destroy(sv->nc);
	/* Only after a failed setup, when none were made. */
	while (sv->publishing) {
		struct job *j = sv->publishing;

		sv->publishing = j->pnext;
		job_free(j);
	}
	while (sv->retry) {
		struct job *j = sv->retry;

		sv->retry = j->pnext;
		job_free(j);
	}
	while (sv->held)
		natsMsg_Destroy(unhold(sv));
	pthread_mutex_destroy(&sv->lock);
	if (sv->e && sv->e != o->engine)
		fanout_destroy(sv->e);
	else if (sv->sink)
		fanout_sink_destroy(sv->sink);
	free(sv);
	return err;
}
