// SPDX-License-Identifier: MIT
/*
 * nats_common.c - helpers the dispatcher and the worker share: names,
 * connection, streams, and the wire form of an outcome.
 *
 * An outcome travels as the body of a result message:
 *
 *   "FO1 <code> <cost> <summary_len> <error_len>\n" <summary> <error>
 *
 * with code a decimal int, cost a %.17g double, lengths decimal.  The
 * lengths make the body binary-safe (a summary may hold anything).
 */
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

int fnats_fetch(natsSubscription *sub, natsMsgList *list, int batch,
		int wait_ms)
{
	jsFetchRequest req;
	natsStatus s;

	/* What is there now, without waiting for a full batch ... */
	jsFetchRequest_Init(&req);
	req.Batch = batch;
	req.NoWait = true;
	req.Expires = 1000000000ll;
	s = natsSubscription_FetchRequest(list, sub, &req);
	if (list->Count > 0 || !wait_ms)
		return list->Count > 0 ? 0 : fnats_errno(s);
	natsMsgList_Destroy(list);
	memset(list, 0, sizeof(*list));
	/* ... else wait for ONE message: a batch of 1 returns as soon as it
	 * arrives, where a bigger batch would wait for the whole batch or
	 * the timeout. */
	s = natsSubscription_Fetch(list, sub, 1, wait_ms, NULL);
	return list->Count > 0 ? 0 : fnats_errno(s);
}
