// SPDX-License-Identifier: MIT
/*
 * nats_dispatch.c - the dispatcher side of remote children.
 *
 * A remote child's life:
 *
 *   fanout_nats_task()   record allocated (payload copied), put on the
 *                        handle's list of tasks not started;
 *   never started        (the engine's skip hook, task_skipped()) its
 *                        delegation was interrupted first: the record
 *                        leaves that list and is freed;
 *   child fn             fanout_defer(); the record leaves that list,
 *                        gets a process-wide seq (its key: "<id>.<nonce>.
 *                        <seq>", see make_nonce) and enters the table of
 *                        children in flight; on_cancel registered; the
 *                        work message is handed to js_PublishMsgAsync()
 *                        and fn returns -EINPROGRESS;
 *   publish ack          (libnats thread) the stream sequence is noted;
 *                        on an error or a lost ack (MaxWait) the message
 *                        goes to the retry list, republished with the
 *                        same Nats-Msg-Id (so JetStream stores it once)
 *                        until publish_retry_ms;
 *   outcome              (dispatcher thread) the record is removed from
 *                        the table and fanout_complete() called;
 *   advisory             (dispatcher thread) MAX_DELIVERIES for its stream
 *                        sequence: removed, completed as ERROR;
 *   close                what is left is completed as ERROR.
 *
 * Whoever removes a record from the table (under tbl_lock) owns it: it
 * alone calls fanout_complete() and frees it.  So one outcome finishes a
 * child and a second finds nothing (counted as a duplicate).  Nothing
 * holds tbl_lock across fanout_complete() or fanout_pending_on_cancel():
 * both may run on_cancel callbacks of other children (a join policy),
 * which take tbl_lock.
 *
 * The on_cancel callback gets the seq, not the record, as its argument:
 * the record may be freed by a concurrent outcome while the callback
 * runs; the seq is looked up under the lock instead.
 *
 * The one mutex: lib/ takes none, but here every operation it guards
 * sits next to a network round trip or a publish costing microseconds,
 * and libnats itself is built on mutexes.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "nats_internal.h"

struct kind_ent {
	char name[FANOUT_NATS_MAX_KIND + 1];
	struct fnats_names nm;
};

/* One remote child; see the life above. */
struct rchild {
	struct fanout_nats *n;
	const struct kind_ent *kind;
	struct rchild *prev, *next; /* handle's tasks not started */
	struct rchild *hnext;	    /* table chain, while in flight */
	uint64_t seq;
	struct fanout_pending *p;
	uint64_t stream_seq;   /* from the publish ack, 0 before */
	uint64_t first_pub_ms; /* first publish attempt */
	natsStatus last_err;   /* last publish failure */
	unsigned backoff_ms;   /* the last retry wait; 0 = never failed */
	size_t len;
	unsigned char payload[];
};

/* A message waiting to be republished; looked up by seq when it is. */
struct retry {
	struct retry *next;
	uint64_t seq;
	uint64_t retry_at; /* not published again before (fnats_now_ms) */
	natsMsg *msg;
};

/*
 * A failed publish (the kind's stream missing: no responders; the server
 * away: no ack within MaxWait; the window full) waits before it is sent
 * again: RETRY_FIRST_MS after the first failure, doubled after each, at
 * most RETRY_MAX_MS, as a worker's outcome publish does (nats_serve.c).
 * It was sent again on every pass of the dispatcher's loop (every 20 ms
 * or less) for publish_retry_ms: hundreds of publishes per child to a
 * server that had lost a stream.
 */
#define RETRY_FIRST_MS 100
#define RETRY_MAX_MS 2000

/* @r failed once more: when its message may be sent again.  Called with
 * tbl_lock held. */
static uint64_t retry_time(struct rchild *r)
{
	r->backoff_ms = !r->backoff_ms			  ? RETRY_FIRST_MS :
			r->backoff_ms >= RETRY_MAX_MS / 2 ? RETRY_MAX_MS :
							    r->backoff_ms * 2;
	return fnats_now_ms() + r->backoff_ms;
}

struct fanout_nats {
	natsConnection *nc;
	jsCtx *js;
	natsSubscription *rsub, *asub;	  /* bind the consumers, never read */
	struct fnats_puller rpull, apull; /* read them (nats_common.c) */
	struct kind_ent *kinds;
	unsigned nkinds;
	char id[FNATS_ID_MAX + 1];
	/* "<id>.<nonce>.": every key of this handle starts with it */
	char key_prefix[FNATS_ID_MAX + FNATS_NONCE_LEN + 3];
	size_t key_prefix_len;
	char result_subject[32 + FNATS_ID_MAX];
	char result_durable[32 + FNATS_ID_MAX];
	char adv_durable[32 + FNATS_ID_MAX];
	size_t max_payload;
	int retry_ms;
	pthread_t thread;
	bool thread_started;
	atomic_bool stop;
	struct rchild unstarted;  /* list head, under tbl_lock */
	struct retry *retry_head; /* under tbl_lock */
	atomic_uint_fast64_t published, republished, results, duplicates,
		redelivered, exhausted, cancels, publish_failed, in_flight,
		held; /* tasks on the unstarted list */
};

/* The table of children in flight, shared by every handle. */
static pthread_mutex_t tbl_lock = PTHREAD_MUTEX_INITIALIZER;
static struct rchild **tbl;
static size_t tbl_size, tbl_count;
static uint64_t tbl_seq;

static size_t slot(uint64_t seq, size_t size)
{
	return (size_t)((seq * 0x9e3779b97f4a7c15ull) >> 20) & (size - 1);
}

/* Called with tbl_lock held. */
static int tbl_insert(struct rchild *r)
{
	if (tbl_count + 1 > tbl_size * 2 || !tbl) {
		size_t nsize = tbl_size ? tbl_size * 4 : 1024;
		struct rchild **nt = calloc(nsize, sizeof(*nt));
		size_t i;

		if (!nt)
			return -ENOMEM;
		for (i = 0; i < tbl_size; i++) {
			while (tbl[i]) {
				struct rchild *x = tbl[i];
				size_t s = slot(x->seq, nsize);

				tbl[i] = x->hnext;
				x->hnext = nt[s];
				nt[s] = x;
			}
		}
		free(tbl);
		tbl = nt;
		tbl_size = nsize;
	}
	r->hnext = tbl[slot(r->seq, tbl_size)];
	tbl[slot(r->seq, tbl_size)] = r;
	tbl_count++;
	return 0;
}

/* Called with tbl_lock held. */
static struct rchild *tbl_find(uint64_t seq)
{
	struct rchild *r;

	if (!tbl)
		return NULL;
	for (r = tbl[slot(seq, tbl_size)]; r; r = r->hnext)
		if (r->seq == seq)
			return r;
	return NULL;
}

/* Called with tbl_lock held; the caller owns the record after. */
static struct rchild *tbl_remove(uint64_t seq)
{
	struct rchild **pp, *r;

	if (!tbl)
		return NULL;
	for (pp = &tbl[slot(seq, tbl_size)]; (r = *pp); pp = &r->hnext) {
		if (r->seq == seq) {
			*pp = r->hnext;
			tbl_count--;
			atomic_fetch_sub(&r->n->in_flight, 1);
			return r;
		}
	}
	return NULL;
}

static struct rchild *take(uint64_t seq)
{
	struct rchild *r;

	pthread_mutex_lock(&tbl_lock);
	r = tbl_remove(seq);
	pthread_mutex_unlock(&tbl_lock);
	return r;
}

static void finish(struct rchild *r, int code, const char *error)
{
	struct fanout_outcome o = {.code = code, .error = error};

	fanout_complete(r->p, &o);
	free(r);
}

static void key_of(const struct fanout_nats *n, uint64_t seq, char *key)
{
	snprintf(key, FNATS_KEY_MAX, "%s%" PRIu64, n->key_prefix, seq);
}

/* "<id>.<nonce>.<seq>" of this handle -> seq; 0 if not ours (another
 * dispatcher's, or an earlier handle's with the same id). */
static uint64_t seq_of(const struct fanout_nats *n, const char *key)
{
	const char *d;
	char *end;
	uint64_t seq;

	if (!key || strncmp(key, n->key_prefix, n->key_prefix_len))
		return 0;
	d = key + n->key_prefix_len;
	if (*d < '0' || *d > '9')
		return 0;
	seq = strtoull(d, &end, 10);
	return *end ? 0 : seq;
}

/*
 * This handle's nonce: FNATS_NONCE_LEN hex digits, random.  Keys are
 * "<id>.<nonce>.<seq>" and seq restarts at 1 in every process, so
 * without it a dispatcher restarted with the same fixed id reused the
 * last run's keys, and so its Nats-Msg-Ids: within the duplicate window
 * JetStream dropped its children as duplicates (never run), or matched
 * them to the last run's still queued messages (the old payload run, its
 * outcome taken for the new child).  64 random bits; should getrandom()
 * fail, the time, pid and a counter stand in.
 */
static void make_nonce(char *out)
{
	static atomic_uint_fast64_t calls;
	uint64_t x = 0;
	struct timespec ts;

	if (getrandom(&x, sizeof(x), GRND_NONBLOCK) != (ssize_t)sizeof(x)) {
		clock_gettime(CLOCK_REALTIME, &ts);
		x = ((uint64_t)ts.tv_sec * 1000000000ull +
		     (uint64_t)ts.tv_nsec) ^
		    ((uint64_t)getpid() << 40) ^
		    (atomic_fetch_add(&calls, 1) * 0x9e3779b97f4a7c15ull);
	}
	snprintf(out, FNATS_NONCE_LEN + 1, "%016" PRIx64, x);
}

static void on_cancel(struct fanout_pending *p, void *arg)
{
	uint64_t seq = (uintptr_t)arg;
	struct rchild *r;
	char key[FNATS_KEY_MAX];

	pthread_mutex_lock(&tbl_lock);
	r = tbl_find(seq);
	if (r) {
		/* Under the lock: close() cannot free the connection now. */
		key_of(r->n, seq, key);
		if (natsConnection_PublishString(r->n->nc, r->kind->nm.cancel,
						 key) == NATS_OK)
			atomic_fetch_add(&r->n->cancels, 1);
	}
	pthread_mutex_unlock(&tbl_lock);
}

static void queue_retry(struct fanout_nats *n, uint64_t seq, natsMsg *msg,
			natsStatus why)
{
	struct retry *q = malloc(sizeof(*q));
	struct rchild *r;

	pthread_mutex_lock(&tbl_lock);
	r = tbl_find(seq);
	if (r)
		r->last_err = why;
	if (r && q) {
		q->retry_at = retry_time(r);
		q->seq = seq;
		q->msg = msg;
		q->next = n->retry_head;
		n->retry_head = q;
		msg = NULL;
		q = NULL;
	}
	pthread_mutex_unlock(&tbl_lock);
	free(q);
	if (!msg)
		return;
	natsMsg_Destroy(msg);
	if (r && (r = take(seq)))
		finish(r, -ENOMEM,
		       "remote child: out of memory queueing a "
		       "publish retry");
}

static int publish(struct fanout_nats *n, natsMsg **msg)
{
	jsPubOptions po;

	jsPubOptions_Init(&po);
	/* A lost ack (server restarted) is reported after this long, and the
	 * child republished under the same Nats-Msg-Id. */
	po.MaxWait = 5000;
	return js_PublishMsgAsync(n->js, msg, &po);
}

static int child_fn(struct fanout_child *c, void *arg)
{
	struct rchild *r = arg;
	struct fanout_nats *n = r->n;
	struct fanout_pending *p;
	char key[FNATS_KEY_MAX];
	natsMsg *msg = NULL;
	natsStatus s;
	uint64_t seq;
	int err;

	p = fanout_defer(c);
	pthread_mutex_lock(&tbl_lock);
	r->prev->next = r->next;
	r->next->prev = r->prev;
	atomic_fetch_sub(&n->held, 1);
	if (!p) {
		pthread_mutex_unlock(&tbl_lock);
		err = errno ? -errno : -ENOMEM;
		free(r);
		return err;
	}
	r->p = p;
	r->seq = seq = ++tbl_seq;
	r->first_pub_ms = fnats_now_ms();
	err = tbl_insert(r);
	if (!err)
		atomic_fetch_add(&n->in_flight, 1);
	pthread_mutex_unlock(&tbl_lock);
	if (err) {
		finish(r, err, NULL);
		return -EINPROGRESS;
	}
	/* May run on_cancel at once; it finds the record by seq. */
	fanout_pending_on_cancel(p, on_cancel, (void *)(uintptr_t)seq);
	if (fanout_pending_interrupted(p)) {
		if ((r = take(seq)))
			finish(r, -ECANCELED, NULL);
		return -EINPROGRESS;
	}
	key_of(n, seq, key);
	s = natsMsg_Create(&msg, r->kind->nm.work, NULL,
			   (const char *)r->payload, (int)r->len);
	if (s == NATS_OK)
		s = natsMsgHeader_Set(msg, "Nats-Msg-Id", key);
	if (s == NATS_OK)
		s = natsMsgHeader_Set(msg, FNATS_HDR_KEY, key);
	if (s == NATS_OK)
		s = natsMsgHeader_Set(msg, FNATS_HDR_REPLY, n->result_subject);
	if (s != NATS_OK) {
		natsMsg_Destroy(msg);
		if ((r = take(seq)))
			finish(r, fnats_errno(s),
			       "remote child: could not build its message");
		return -EINPROGRESS;
	}
	/* From here r may be freed by an outcome at any moment. */
	s = publish(n, &msg);
	if (s != NATS_OK)
		queue_retry(n, seq, msg, s);
	return -EINPROGRESS;
}

static uint64_t msg_seq(struct fanout_nats *n, natsMsg *msg)
{
	const char *key = NULL;

	if (natsMsgHeader_Get(msg, FNATS_HDR_KEY, &key) != NATS_OK)
		return 0;
	return seq_of(n, key);
}

static void ack_cb(jsCtx *js, natsMsg *msg, jsPubAck *pa, jsPubAckErr *pae,
		   void *closure)
{
	struct fanout_nats *n = closure;
	uint64_t seq = msg_seq(n, msg);
	struct rchild *r;

	if (pa) {
		pthread_mutex_lock(&tbl_lock);
		r = tbl_find(seq);
		if (r && !r->stream_seq) {
			r->stream_seq = pa->Sequence;
			atomic_fetch_add(&n->published, 1);
		}
		pthread_mutex_unlock(&tbl_lock);
		natsMsg_Destroy(msg);
		return;
	}
	queue_retry(n, seq, msg, pae ? pae->Err : NATS_ERR);
}

static void do_retries(struct fanout_nats *n)
{
	struct retry *q, *next, *keep = NULL;
	uint64_t now = fnats_now_ms();

	pthread_mutex_lock(&tbl_lock);
	q = n->retry_head;
	n->retry_head = NULL;
	pthread_mutex_unlock(&tbl_lock);
	for (; q; q = next) {
		struct rchild *r;
		bool expired, cancelled;
		natsStatus why = NATS_OK;

		next = q->next;
		if (q->retry_at > now) {
			q->next = keep;
			keep = q;
			continue;
		}
		pthread_mutex_lock(&tbl_lock);
		r = tbl_find(q->seq);
		expired = r && now - r->first_pub_ms > (uint64_t)n->retry_ms;
		/* Its delegation was interrupted (a cancel, its deadline, a
		 * join policy) while its publish was unconfirmed (not stored,
		 * or the ack lost): nobody waits for its outcome, and the
		 * cancel notice is already gone, so a worker that was not
		 * subscribed then would run it.  If it was stored after all,
		 * a worker's outcome is a duplicate. */
		cancelled = r && fanout_pending_interrupted(r->p);
		if (r)
			why = r->last_err;
		pthread_mutex_unlock(&tbl_lock);
		if (!r) { /* finished meanwhile */
			natsMsg_Destroy(q->msg);
			free(q);
			continue;
		}
		if (cancelled) {
			natsMsg_Destroy(q->msg);
			if ((r = take(q->seq)))
				finish(r, -ECANCELED,
				       "remote child: cancelled before "
				       "JetStream confirmed storing it");
			free(q);
			continue;
		}
		if (expired) {
			char msg[256];

			natsMsg_Destroy(q->msg);
			snprintf(msg, sizeof(msg),
				 "remote child: publishing to JetStream failed "
				 "for %d ms (%s)",
				 n->retry_ms, natsStatus_GetText(why));
			if ((r = take(q->seq))) {
				atomic_fetch_add(&n->publish_failed, 1);
				finish(r, -EHOSTUNREACH, msg);
			}
			free(q);
			continue;
		}
		atomic_fetch_add(&n->republished, 1);
		why = publish(n, &q->msg);
		if (why == NATS_OK) {
			free(q);
			continue;
		}
		pthread_mutex_lock(&tbl_lock);
		r = tbl_find(q->seq);
		if (r) {
			r->last_err = why;
			q->retry_at = retry_time(r);
		}
		pthread_mutex_unlock(&tbl_lock);
		q->next = keep;
		keep = q;
	}
	if (keep) {
		pthread_mutex_lock(&tbl_lock);
		for (q = keep; q->next; q = q->next)
			;
		q->next = n->retry_head;
		n->retry_head = keep;
		pthread_mutex_unlock(&tbl_lock);
	}
}

static void handle_result(struct fanout_nats *n, natsMsg *msg)
{
	const char *dv = NULL;
	struct fnats_outcome fo;
	struct fanout_outcome o;
	char *errcopy = NULL;
	struct rchild *r;
	uint64_t seq = msg_seq(n, msg);
	int err;

	r = seq ? take(seq) : NULL;
	if (!r) {
		atomic_fetch_add(&n->duplicates, 1);
		return;
	}
	if (natsMsgHeader_Get(msg, FNATS_HDR_DELIVERY, &dv) == NATS_OK && dv &&
	    strtoul(dv, NULL, 10) > 1)
		atomic_fetch_add(&n->redelivered, 1);
	/* Counted before fanout_complete(), which publishes the event: a
	 * reader of the stats after the event must find it. */
	atomic_fetch_add(&n->results, 1);
	err = fnats_decode_outcome(natsMsg_GetData(msg),
				   (size_t)natsMsg_GetDataLength(msg), &fo,
				   &errcopy);
	if (err) {
		free(errcopy);
		finish(r, -EBADMSG,
		       "remote child: malformed outcome from the "
		       "worker");
		return;
	}
	o = (struct fanout_outcome){.code = fo.code,
				    .summary = fo.summary,
				    .summary_len = fo.summary_len,
				    .error = fo.error,
				    .cost = fo.cost};
	err = fanout_complete(r->p, &o);
	if (err == -EINVAL) /* -EINPROGRESS or an oversized summary */
		finish(r, -EBADMSG,
		       "remote child: invalid outcome from the "
		       "worker");
	else
		free(r);
	/* -EALREADY: the library had finished it (a deadline, a join
	 * policy): this outcome finished nothing, no event came of it.  Taken
	 * back from results before it is counted a duplicate (seq_cst: who
	 * sees the duplicate sees results without it). */
	if (err == -EALREADY) {
		atomic_fetch_sub(&n->results, 1);
		atomic_fetch_add(&n->duplicates, 1);
	}
	free(errcopy);
}

static bool json_str(const char *js, const char *field, char *out, size_t cap)
{
	char pat[64];
	const char *s, *e;

	snprintf(pat, sizeof(pat), "\"%s\":\"", field);
	s = strstr(js, pat);
	if (!s)
		return false;
	s += strlen(pat);
	e = strchr(s, '"');
	if (!e || (size_t)(e - s) >= cap)
		return false;
	memcpy(out, s, (size_t)(e - s));
	out[e - s] = '\0';
	return true;
}

static bool json_u64(const char *js, const char *field, uint64_t *out)
{
	char pat[64];
	const char *s;

	snprintf(pat, sizeof(pat), "\"%s\":", field);
	s = strstr(js, pat);
	if (!s)
		return false;
	*out = strtoull(s + strlen(pat), NULL, 10);
	return true;
}

static void handle_advisory(struct fanout_nats *n, natsMsg *msg)
{
	char stream[64], text[256], *body;
	uint64_t sseq = 0, deliveries = 0;
	struct rchild *r = NULL;
	size_t i;
	int len = natsMsg_GetDataLength(msg);

	body = malloc((size_t)len + 1);
	if (!body)
		return;
	memcpy(body, natsMsg_GetData(msg), (size_t)len);
	body[len] = '\0';
	if (!json_str(body, "stream", stream, sizeof(stream)) ||
	    !json_u64(body, "stream_seq", &sseq) || !sseq) {
		free(body);
		return;
	}
	json_u64(body, "deliveries", &deliveries);
	free(body);
	/* Rare: a scan of the table rather than a second index. */
	pthread_mutex_lock(&tbl_lock);
	for (i = 0; i < tbl_size && !r; i++) {
		for (r = tbl[i]; r; r = r->hnext)
			if (r->n == n && r->stream_seq == sseq &&
			    !strcmp(r->kind->nm.stream, stream))
				break;
	}
	if (r)
		r = tbl_remove(r->seq);
	pthread_mutex_unlock(&tbl_lock);
	if (!r)
		return;
	/* The message stays in the work queue after MaxDeliver: drop it. */
	js_DeleteMsg(n->js, stream, sseq, NULL, NULL);
	snprintf(text, sizeof(text),
		 "remote child exhausted MaxDeliver=%" PRIu64 " deliveries "
		 "(stream %s seq %" PRIu64 "): every worker that took it died "
		 "or gave it back",
		 deliveries, stream, sseq);
	atomic_fetch_add(&n->exhausted, 1);
	finish(r, -EHOSTDOWN, text);
}

/* Hand up to @batch messages of @p's consumer to @handle, acking each
 * after it; wait up to @wait_ms for the first.  A request goes out when
 * none is open; it asks the server to wait as long as we do. */
static void fetch_some(struct fanout_nats *n, struct fnats_puller *p, int batch,
		       int wait_ms,
		       void (*handle)(struct fanout_nats *, natsMsg *))
{
	uint64_t until = fnats_now_ms() + (uint64_t)wait_ms;
	int i, err;

	for (i = 0; i < batch; i++) {
		natsMsg *m = NULL;

		err = fnats_pull(p, batch, false, until, &m);
		if (err) {
			/* reconnecting, or refused (409: the consumer gone,
			 * too many waiting requests): not again at once */
			if (err != -ETIMEDOUT)
				usleep(20000);
			return;
		}
		handle(n, m);
		fnats_ack(n->nc, m, FNATS_ACK);
		natsMsg_Destroy(m);
		if (!p->asked)
			return; /* served in full: one batch per call */
	}
}

static void *pump(void *arg)
{
	struct fanout_nats *n = arg;
	uint64_t next_adv = 0;

	while (!atomic_load(&n->stop)) {
		do_retries(n);
		fetch_some(n, &n->rpull, 256, 20, handle_result);
		if (fnats_now_ms() >= next_adv) {
			/* A NoWait-only fetch missed stored advisories on
			 * nats-server 2.9.10 (test_max_deliver_exhausted);
			 * a 5 ms wait for one does not. */
			fetch_some(n, &n->apull, 64, 5, handle_advisory);
			next_adv = fnats_now_ms() + 250;
		}
	}
	return NULL;
}

static int pull_sub(struct fanout_nats *n, natsSubscription **sub,
		    const char *stream, const char *subject,
		    const char *durable, bool new_only)
{
	jsSubOptions so;
	jsErrCode jerr = 0;
	natsStatus s;

	jsSubOptions_Init(&so);
	so.Stream = stream;
	so.Config.AckPolicy = js_AckExplicit;
	so.Config.AckWait = 30 * 1000000000ll;
	so.Config.MaxAckPending = 65536;
	so.Config.DeliverPolicy = new_only ? js_DeliverNew : js_DeliverAll;
	s = js_PullSubscribe(sub, n->js, subject, durable, NULL, &so, &jerr);
	if (s == NATS_OK)
		return 0;
	*sub = NULL;
	return s == NATS_NO_MEMORY ? -ENOMEM : -EPROTO;
}

static void destroy(struct fanout_nats *n, bool delete_consumers)
{
	jsPubOptions po;

	if (n->js) {
		/* Let acks of publishes in flight arrive (ack_cb drops them:
		 * their records are gone) before the handle goes away. */
		jsPubOptions_Init(&po);
		po.MaxWait = 1000;
		js_PublishAsyncComplete(n->js, &po);
	}
	if (delete_consumers && n->js) {
		js_DeleteConsumer(n->js, FNATS_RESULTS_STREAM,
				  n->result_durable, NULL, NULL);
		js_DeleteConsumer(n->js, FNATS_ADV_STREAM, n->adv_durable, NULL,
				  NULL);
	}
	/* Close before any subscription goes: pull replies may still be on
	 * their way to the pullers' inboxes, and libnats 3.4.1's reader
	 * thread crashed now and then on one that came in while its
	 * subscription was being destroyed (test_puller under ASan, ~1 run
	 * in 10; none in 80 with the connection closed first). */
	if (n->nc)
		natsConnection_Close(n->nc);
	fnats_puller_close(&n->rpull);
	fnats_puller_close(&n->apull);
	if (n->rsub)
		natsSubscription_Destroy(n->rsub);
	if (n->asub)
		natsSubscription_Destroy(n->asub);
	if (n->js)
		jsCtx_Destroy(n->js);
	if (n->nc)
		natsConnection_Destroy(n->nc);
	free(n->kinds);
	free(n);
}

/* Registers task_skipped(), once per process, by the first open. */
static void register_skip_hook(void);
static pthread_once_t skip_hook_once = PTHREAD_ONCE_INIT;

int fanout_nats_open(const char *url, const struct fanout_nats_opts *o,
		     struct fanout_nats **out)
{
	struct fanout_nats *n;
	jsOptions jo;
	unsigned i;
	int err;

	if (!o || !out || !o->kinds || !o->nkinds || o->nkinds > 64 ||
	    o->connect_timeout_ms < 0 || o->publish_retry_ms < 0)
		return -EINVAL;
	if (o->id && !fnats_id_ok(o->id))
		return -EINVAL;
	for (i = 0; i < o->nkinds; i++)
		if (!fnats_kind_ok(o->kinds[i]))
			return -EINVAL;
	n = calloc(1, sizeof(*n));
	if (!n)
		return -ENOMEM;
	n->kinds = calloc(o->nkinds, sizeof(*n->kinds));
	if (!n->kinds) {
		free(n);
		return -ENOMEM;
	}
	n->nkinds = o->nkinds;
	for (i = 0; i < o->nkinds; i++) {
		snprintf(n->kinds[i].name, sizeof(n->kinds[i].name), "%s",
			 o->kinds[i]);
		fnats_names(o->kinds[i], &n->kinds[i].nm);
	}
	if (o->id) {
		snprintf(n->id, sizeof(n->id), "%s", o->id);
	} else {
		struct timespec ts;

		clock_gettime(CLOCK_REALTIME, &ts);
		snprintf(n->id, sizeof(n->id), "d%x%lx%lx", (unsigned)getpid(),
			 (unsigned long)ts.tv_sec, (unsigned long)ts.tv_nsec);
	}
	{
		char nonce[FNATS_NONCE_LEN + 1];

		make_nonce(nonce);
		n->key_prefix_len =
			(size_t)snprintf(n->key_prefix, sizeof(n->key_prefix),
					 "%s.%s.", n->id, nonce);
	}
	snprintf(n->result_subject, sizeof(n->result_subject),
		 "fanout.result.%s", n->id);
	snprintf(n->result_durable, sizeof(n->result_durable),
		 "fanout-result-%s", n->id);
	snprintf(n->adv_durable, sizeof(n->adv_durable), "fanout-adv-%s",
		 n->id);
	n->retry_ms = o->publish_retry_ms > 0 ? o->publish_retry_ms : 60000;
	n->unstarted.next = n->unstarted.prev = &n->unstarted;

	jsOptions_Init(&jo);
	jo.PublishAsync.MaxPending =
		o->publish_window ? o->publish_window : 4096;
	jo.PublishAsync.AckHandler = ack_cb;
	jo.PublishAsync.AckHandlerClosure = n;
	jo.PublishAsync.StallWait = 200;
	err = fnats_connect(url, o->connect_timeout_ms, n->id, &n->nc, &n->js,
			    &jo);
	if (err)
		goto out_free;
	n->max_payload = (size_t)natsConnection_GetMaxPayload(n->nc);
	for (i = 0; i < n->nkinds && !err; i++)
		err = fnats_ensure_stream(n->js, n->kinds[i].nm.stream,
					  n->kinds[i].nm.work, true, 0);
	if (!err)
		err = fnats_ensure_stream(n->js, FNATS_RESULTS_STREAM,
					  "fanout.result.>", true,
					  24ll * 3600 * 1000000000ll);
	if (!err)
		err = fnats_ensure_stream(n->js, FNATS_ADV_STREAM,
					  FNATS_ADV_SUBJECT, false,
					  3600ll * 1000000000ll);
	if (!err)
		err = pull_sub(n, &n->rsub, FNATS_RESULTS_STREAM,
			       n->result_subject, n->result_durable, false);
	if (!err)
		err = pull_sub(n, &n->asub, FNATS_ADV_STREAM, FNATS_ADV_SUBJECT,
			       n->adv_durable, true);
	if (!err)
		err = fnats_puller_open(&n->rpull, n->nc, FNATS_RESULTS_STREAM,
					n->result_durable);
	if (!err)
		err = fnats_puller_open(&n->apull, n->nc, FNATS_ADV_STREAM,
					n->adv_durable);
	if (err)
		goto out_free;
	if (pthread_create(&n->thread, NULL, pump, n)) {
		err = -EAGAIN;
		goto out_free;
	}
	n->thread_started = true;
	pthread_once(&skip_hook_once, register_skip_hook);
	*out = n;
	return 0;
out_free:
	destroy(n, true);
	return err;
}

int fanout_nats_task(struct fanout_nats *n, const char *kind,
		     const void *payload, size_t len, const char *goal,
		     struct fanout_task *out)
{
	const struct kind_ent *k = NULL;
	struct rchild *r;
	unsigned i;

	if (!n || !out || !kind || (!payload && len))
		return -EINVAL;
	for (i = 0; i < n->nkinds && !k; i++)
		if (!strcmp(n->kinds[i].name, kind))
			k = &n->kinds[i];
	if (!k)
		return -ENOENT;
	/* Not len + ROOM > max: a len near SIZE_MAX wrapped the sum, and
	 * then the record's size. */
	if (n->max_payload < FNATS_HEADER_ROOM ||
	    len > n->max_payload - FNATS_HEADER_ROOM)
		return -EMSGSIZE;
	if (natsConnection_Status(n->nc) != NATS_CONN_STATUS_CONNECTED)
		return -ENOTCONN;
	r = malloc(sizeof(*r) + len);
	if (!r)
		return -ENOMEM;
	memset(r, 0, sizeof(*r));
	r->n = n;
	r->kind = k;
	r->len = len;
	if (len)
		memcpy(r->payload, payload, len);
	pthread_mutex_lock(&tbl_lock);
	r->next = &n->unstarted;
	r->prev = n->unstarted.prev;
	r->prev->next = r;
	n->unstarted.prev = r;
	atomic_fetch_add(&n->held, 1);
	pthread_mutex_unlock(&tbl_lock);
	out->fn = child_fn;
	out->arg = r;
	out->goal = goal ? goal : k->name;
	return 0;
}

/* Take @r, a task whose child never started, off its handle's list, and
 * free it. */
static void drop_unstarted(struct rchild *r)
{
	pthread_mutex_lock(&tbl_lock);
	r->prev->next = r->next;
	r->next->prev = r->prev;
	atomic_fetch_sub(&r->n->held, 1);
	pthread_mutex_unlock(&tbl_lock);
	free(r);
}

void fanout_nats_task_discard(struct fanout_task *t)
{
	struct rchild *r;

	if (!t || t->fn != child_fn || !t->arg)
		return;
	r = t->arg;
	drop_unstarted(r);
	t->arg = NULL;
}

/*
 * The engine's skip hook for child_fn (fanout_set_skip_hook()): the
 * child of @arg will never run (its delegation was interrupted before it
 * started), so nothing will take its record off the list of tasks not
 * started.  It stayed there, payload and all, until fanout_nats_close():
 * a long-lived dispatcher whose delegations met deadlines grew without
 * bound.  A task runs or is skipped, never both, so child_fn never sees
 * a record freed here.
 */
static void task_skipped(void *arg)
{
	struct rchild *r = arg;

	drop_unstarted(r);
}

static void register_skip_hook(void)
{
	/* -ENOSPC (every hook slot taken by other libraries): the records
	 * of skipped tasks are then freed by fanout_nats_close() only. */
	(void)fanout_set_skip_hook(child_fn, task_skipped);
}

int fanout_nats_stats(struct fanout_nats *n, struct fanout_nats_stats *st)
{
	if (!n || !st)
		return -EINVAL;
	st->published = atomic_load(&n->published);
	st->republished = atomic_load(&n->republished);
	st->results = atomic_load(&n->results);
	st->duplicates = atomic_load(&n->duplicates);
	st->redelivered = atomic_load(&n->redelivered);
	st->exhausted = atomic_load(&n->exhausted);
	st->cancels = atomic_load(&n->cancels);
	st->publish_failed = atomic_load(&n->publish_failed);
	st->in_flight = atomic_load(&n->in_flight);
	st->unstarted = atomic_load(&n->held);
	return 0;
}

void fanout_nats_close(struct fanout_nats *n)
{
	struct rchild *left = NULL, *r, *next;
	struct retry *q, *qn;
	size_t i;

	if (!n)
		return;
	atomic_store(&n->stop, true);
	if (n->thread_started)
		pthread_join(n->thread, NULL);
	pthread_mutex_lock(&tbl_lock);
	for (i = 0; i < tbl_size; i++) {
		struct rchild **pp = &tbl[i];

		while ((r = *pp)) {
			if (r->n != n) {
				pp = &r->hnext;
				continue;
			}
			*pp = r->hnext;
			tbl_count--;
			r->hnext = left;
			left = r;
		}
	}
	while (n->unstarted.next != &n->unstarted) {
		r = n->unstarted.next;
		n->unstarted.next = r->next;
		atomic_fetch_sub(&n->held, 1);
		free(r);
	}
	q = n->retry_head;
	n->retry_head = NULL;
	pthread_mutex_unlock(&tbl_lock);
	for (; q; q = qn) {
		qn = q->next;
		natsMsg_Destroy(q->msg);
		free(q);
	}
	for (r = left; r; r = next) {
		next = r->hnext;
		finish(r, -ECONNABORTED,
		       "remote child: the dispatcher was closed before its "
		       "outcome arrived");
	}
	destroy(n, true);
}
