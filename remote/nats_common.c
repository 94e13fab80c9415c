// SPDX-License-Identifier: MIT
/*
 * nats_common.c - helpers the dispatcher and the worker share: names,
 * connection, streams, pulling, and the wire form of an outcome.
 *
 * An outcome travels as the body of a result message:
 *
 *   "FO1 <code> <cost> <summary_len> <error_len>\n" <summary> <error>
 *
 * with code a decimal int, cost a %.17g double, lengths decimal.  The
 * lengths make the body binary-safe (a summary may hold anything).
 */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "nats_internal.h"

static bool name_ok(const char *s, size_t max, bool upper)
{
	size_t n;

	if (!s)
		return false;
	for (n = 0; s[n]; n++) {
		char ch = s[n];

		if (n >= max)
			return false;
		if ((ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') ||
		    ch == '_' || ch == '-' || (upper && ch >= 'A' && ch <= 'Z'))
			continue;
		return false;
	}
	return n > 0;
}

bool fnats_kind_ok(const char *kind)
{
	return name_ok(kind, FANOUT_NATS_MAX_KIND, false);
}

bool fnats_id_ok(const char *id)
{
	return name_ok(id, FNATS_ID_MAX, true);
}

void fnats_names(const char *kind, struct fnats_names *nm)
{
	size_t i;

	snprintf(nm->stream, sizeof(nm->stream), "FANOUT_%s", kind);
	for (i = 7; nm->stream[i]; i++)
		if (nm->stream[i] >= 'a' && nm->stream[i] <= 'z')
			nm->stream[i] -= 'a' - 'A';
	snprintf(nm->work, sizeof(nm->work), "fanout.work.%s", kind);
	snprintf(nm->cancel, sizeof(nm->cancel), "fanout.cancel.%s", kind);
	snprintf(nm->durable, sizeof(nm->durable), "fanout-worker-%s", kind);
}

int fnats_errno(natsStatus s)
{
	switch (s) {
	case NATS_OK:
		return 0;
	case NATS_NO_MEMORY:
		return -ENOMEM;
	case NATS_NO_SERVER:
	case NATS_NOT_YET_CONNECTED:
		return -ECONNREFUSED;
	case NATS_CONNECTION_CLOSED:
	case NATS_CONNECTION_DISCONNECTED:
	case NATS_STALE_CONNECTION:
		return -ENOTCONN;
	case NATS_TIMEOUT:
		return -ETIMEDOUT;
	case NATS_MAX_PAYLOAD:
		return -EMSGSIZE;
	case NATS_INVALID_ARG:
		return -EINVAL;
	default:
		return -EPROTO;
	}
}

uint64_t fnats_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

int fnats_connect(const char *url, int timeout_ms, const char *name,
		  natsConnection **nc, jsCtx **js, const jsOptions *jo)
{
	natsOptions *opts = NULL;
	natsStatus s;
	jsOptions jcopy;

	*nc = NULL;
	*js = NULL;
	/* Empty or blank: libnats 3.4.1 trims a blank URL to a length of -1
	 * and corrupts the heap (ASan: negative-size-param in nats_Trim); an
	 * empty one was freed twice in a test process. */
	if (url) {
		const char *c = url;

		while (isspace((unsigned char)*c))
			c++;
		if (!*c)
			return -EINVAL;
	}
	s = natsOptions_Create(&opts);
	if (s == NATS_OK)
		s = natsOptions_SetURL(opts, url ? url : FNATS_DEFAULT_URL);
	if (s == NATS_OK)
		s = natsOptions_SetTimeout(opts,
					   timeout_ms > 0 ? timeout_ms : 2000);
	if (s == NATS_OK && name)
		s = natsOptions_SetName(opts, name);
	/* Once connected, never give up: a restarted server comes back. */
	if (s == NATS_OK)
		s = natsOptions_SetMaxReconnect(opts, -1);
	if (s == NATS_OK)
		s = natsOptions_SetReconnectWait(opts, 100);
	if (s == NATS_OK)
		s = natsOptions_SetReconnectJitter(opts, 0, 0);
	if (s == NATS_OK)
		s = natsOptions_SetPingInterval(opts, 2000);
	if (s == NATS_OK)
		s = natsOptions_SetMaxPingsOut(opts, 3);
	if (s == NATS_OK)
		s = natsOptions_SetReconnectBufSize(opts, 64 * 1024 * 1024);
	/* Write each message at once instead of leaving it to the flusher
	 * thread: halves a remote child's dispatch -> event latency (several
	 * hops each waited for it) at no cost in throughput (bench-remote). */
	if (s == NATS_OK)
		s = natsOptions_SetSendAsap(opts, true);
	if (s == NATS_OK)
		s = natsConnection_Connect(nc, opts);
	natsOptions_Destroy(opts);
	if (s != NATS_OK) {
		*nc = NULL;
		/* A URL libnats cannot parse (a port that is not a number, an
		 * empty string) is the caller's mistake, not a server that is
		 * not there. */
		if (s == NATS_INVALID_ARG)
			return -EINVAL;
		return fnats_errno(s) == -ENOMEM ? -ENOMEM : -ECONNREFUSED;
	}
	if (jo) {
		jcopy = *jo;
		s = natsConnection_JetStream(js, *nc, &jcopy);
	} else {
		s = natsConnection_JetStream(js, *nc, NULL);
	}
	if (s != NATS_OK) {
		natsConnection_Destroy(*nc);
		*nc = NULL;
		*js = NULL;
		return fnats_errno(s);
	}
	return 0;
}

int fnats_ensure_stream(jsCtx *js, const char *name, const char *subject,
			bool workqueue, int64_t max_age_ns)
{
	jsStreamConfig cfg;
	jsErrCode jerr = 0;
	natsStatus s;
	const char *subjects[1] = {subject};

	jsStreamConfig_Init(&cfg);
	cfg.Name = name;
	cfg.Subjects = subjects;
	cfg.SubjectsLen = 1;
	cfg.Retention = workqueue ? js_WorkQueuePolicy : js_LimitsPolicy;
	cfg.Storage = js_FileStorage;
	cfg.MaxAge = max_age_ns;
	s = js_AddStream(NULL, js, &cfg, NULL, &jerr);
	if (s == NATS_OK || jerr == JSStreamNameExistErr)
		return 0;
	return s == NATS_NO_MEMORY ? -ENOMEM : -EPROTO;
}

int fnats_encode_outcome(const struct fanout_result *r, char **buf, size_t *len)
{
	const char *err = r->status == FANOUT_COMPLETED ? NULL : r->error;
	size_t slen = r->summary ? strlen(r->summary) : 0;
	size_t elen = err ? strlen(err) : 0;
	char head[128];
	int h;
	char *b;

	h = snprintf(head, sizeof(head), "FO1 %d %.17g %zu %zu\n", r->code,
		     r->cost, slen, elen);
	b = malloc((size_t)h + slen + elen + 1);
	if (!b)
		return -ENOMEM;
	memcpy(b, head, (size_t)h);
	if (slen)
		memcpy(b + h, r->summary, slen);
	if (elen)
		memcpy(b + h + slen, err, elen);
	b[h + slen + elen] = '\0';
	*buf = b;
	*len = (size_t)h + slen + elen;
	return 0;
}

int fnats_decode_outcome(const char *buf, size_t len, struct fnats_outcome *o,
			 char **error_copy)
{
	char head[128];
	size_t hl, slen, elen;
	const char *nl;
	int code;
	double cost;

	*error_copy = NULL;
	nl = buf ? memchr(buf, '\n', len < sizeof(head) ? len : sizeof(head)) :
		   NULL;
	if (!nl)
		return -EBADMSG;
	hl = (size_t)(nl - buf);
	memcpy(head, buf, hl);
	head[hl] = '\0';
	if (sscanf(head, "FO1 %d %lg %zu %zu", &code, &cost, &slen, &elen) != 4)
		return -EBADMSG;
	if (slen > len - hl - 1 || elen != len - hl - 1 - slen)
		return -EBADMSG;
	if (!isfinite(cost) || cost < 0)
		cost = 0;
	o->code = code;
	o->cost = cost;
	o->summary = slen ? nl + 1 : NULL;
	o->summary_len = slen;
	o->error = NULL;
	if (elen) {
		*error_copy = malloc(elen + 1);
		if (!*error_copy)
			return -ENOMEM;
		memcpy(*error_copy, nl + 1 + slen, elen);
		(*error_copy)[elen] = '\0';
		o->error = *error_copy;
	}
	return 0;
}

/*
 * Pulling.  A durable pull consumer is read by hand: pull requests
 * published to $JS.API.CONSUMER.MSG.NEXT.<stream>.<consumer> with a
 * private inbox as their reply subject, and the inbox read one message at
 * a time with natsSubscription_NextMsg.  Not natsSubscription_Fetch: in
 * libnats before 3.10 (Debian 12 ships 3.4.1) it writes past its message
 * array when messages of an earlier, expired request are still queued as
 * it starts (nats.c #749, fixed upstream by 8099b5c9); bench-remote
 * aborted on it ("malloc(): unaligned fastbin chunk detected") in 2 of 4
 * runs, and ASan put the overrun in the dispatcher's fetch.  A request for
 * a batch goes out when the last one is not open any more: served in
 * full, ended by the server (404 nothing there, 408 expired or a no-wait
 * request served short, 409 refused: a status that comes on the
 * request's own reply subject, so one for an older request is ignored),
 * or its wait over.  Reading one message at a time, a message
 * of an older request that comes late is read as one of the current
 * request's: nothing can overrun, nothing is dropped.  Messages read this
 * way have no libnats JetStream binding, so they are acknowledged by
 * publishing the JetStream ack bodies to their reply subject (fnats_ack).
 * One thread per puller.
 */
int fnats_puller_open(struct fnats_puller *p, natsConnection *nc,
		      const char *stream, const char *consumer)
{
	char all[sizeof(p->cur)];

	memset(p, 0, sizeof(*p));
	p->nc = nc;
	if (snprintf(p->next, sizeof(p->next),
		     "$JS.API.CONSUMER.MSG.NEXT.%s.%s", stream,
		     consumer) >= (int)sizeof(p->next))
		return -ENAMETOOLONG;
	if (natsInbox_Create(&p->reply) != NATS_OK)
		return -ENOMEM;
	/* One reply subject per request, <reply>.<seq>: the server's status
	 * for a request comes on its own, so one for an older request is
	 * told from the open one's (user messages come on their stream's
	 * subject, whichever request they answer). */
	snprintf(all, sizeof(all), "%s.*", p->reply);
	if (strlen(p->reply) + 24 > sizeof(p->cur) ||
	    natsConnection_SubscribeSync(&p->inbox, nc, all) != NATS_OK) {
		natsInbox_Destroy(p->reply);
		p->reply = NULL;
		return -EPROTO;
	}
	return 0;
}

void fnats_puller_close(struct fnats_puller *p)
{
	if (p->inbox)
		natsSubscription_Destroy(p->inbox);
	if (p->reply)
		natsInbox_Destroy(p->reply);
	memset(p, 0, sizeof(*p));
}

/* What a message read from the inbox was, the request's state updated
 * (fnats_pull, fnats_pull_queued). */
enum took { TOOK_MSG, TOOK_NOTHING, TOOK_REFUSED, TOOK_OVER };

static enum took took(struct fnats_puller *p, natsMsg *m)
{
	const char *code = NULL;

	/* A status message (no data, a Status header) is the server's word
	 * on the request; 100 is a heartbeat. */
	if (natsMsg_GetDataLength(m) == 0 &&
	    natsMsgHeader_Get(m, "Status", &code) == NATS_OK && code) {
		bool beat = !strncmp(code, "100", 3);
		bool over =
			!strncmp(code, "404", 3) || !strncmp(code, "408", 3);
		/* an older request's end says nothing of this one */
		bool stale = strcmp(natsMsg_GetSubject(m), p->cur) != 0;

		natsMsg_Destroy(m); /* @code pointed into it */
		if (beat || stale)
			return TOOK_NOTHING;
		p->asked = 0;
		return over ? TOOK_OVER : TOOK_REFUSED;
	}
	if (p->asked > 0)
		p->asked--;
	return TOOK_MSG;
}

/* How long a no-wait request's answer may take before it is given up. */
#define NO_WAIT_ANSWER_MS 1000

int fnats_pull(struct fnats_puller *p, int batch, bool no_wait,
	       uint64_t until_ms, natsMsg **msg)
{
	char req[96];

	*msg = NULL;
	for (;;) {
		uint64_t now = fnats_now_ms(), limit;
		natsMsg *m = NULL;
		natsStatus s;

		if (!p->asked || now >= p->open_until_ms) {
			uint64_t wait = until_ms > now ? until_ms - now : 1;

			if (no_wait)
				snprintf(req, sizeof(req),
					 "{\"batch\":%d,\"no_wait\":true}",
					 batch);
			else
				snprintf(req, sizeof(req),
					 "{\"batch\":%d,\"expires\":%" PRIu64
					 "}",
					 batch, wait * 1000000);
			snprintf(p->cur, sizeof(p->cur), "%s.%" PRIu64,
				 p->reply, ++p->seq);
			s = natsConnection_PublishRequestString(p->nc, p->next,
								p->cur, req);
			if (s != NATS_OK)
				return fnats_errno(s);
			p->asked = batch;
			p->open_until_ms =
				now + (no_wait ? NO_WAIT_ANSWER_MS : wait);
		}
		/* A no-wait request is answered at once: wait for the
		 * answer (messages, then a 404 if it was short). */
		limit = no_wait ? p->open_until_ms : until_ms;
		if (now >= limit)
			return -ETIMEDOUT;
		s = natsSubscription_NextMsg(&m, p->inbox,
					     (int64_t)(limit - now));
		if (s == NATS_TIMEOUT)
			return -ETIMEDOUT;
		if (s != NATS_OK) {
			p->asked = 0;
			return fnats_errno(s);
		}
		switch (took(p, m)) {
		case TOOK_MSG:
			*msg = m;
			return 0;
		case TOOK_NOTHING:
			continue;
		case TOOK_REFUSED:
			return -EAGAIN;
		case TOOK_OVER:
			if (no_wait)
				return -ETIMEDOUT;
			continue; /* ended early: ask again, time is left */
		}
	}
}

int fnats_pull_queued(struct fnats_puller *p, natsMsg **msg)
{
	*msg = NULL;
	for (;;) {
		natsMsg *m = NULL;
		natsStatus s = natsSubscription_NextMsg(&m, p->inbox, 0);

		if (s == NATS_TIMEOUT)
			return -ETIMEDOUT;
		if (s != NATS_OK) {
			p->asked = 0;
			return fnats_errno(s);
		}
		if (took(p, m) == TOOK_MSG) {
			*msg = m;
			return 0;
		}
		/* a status: the request's state is updated, read on */
	}
}

int fnats_ack(natsConnection *nc, natsMsg *msg, const char *how)
{
	const char *reply = natsMsg_GetReply(msg);

	if (!reply || !*reply)
		return -EINVAL;
	return fnats_errno(natsConnection_PublishString(nc, reply, how));
}

unsigned fnats_delivery(natsMsg *msg)
{
	const char *r = natsMsg_GetReply(msg), *tok[12];
	unsigned n = 0, at;
	char *end;
	unsigned long v;

	/* $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<tm>.<pending>,
	 * or with a domain and an account hash after ACK (11 or 12
	 * tokens) */
	if (!r || strncmp(r, "$JS.ACK.", 8))
		return 1;
	for (tok[n++] = r; *r; r++) {
		if (*r != '.')
			continue;
		if (n == 12)
			return 1; /* more than 12 tokens: not a form we know */
		tok[n++] = r + 1;
	}
	at = n == 9 ? 4 : n >= 11 ? 6 : 0;
	if (!at)
		return 1;
	v = strtoul(tok[at], &end, 10);
	return *end == '.' && v > 0 && v <= 1000000 ? (unsigned)v : 1;
}
