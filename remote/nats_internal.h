/* SPDX-License-Identifier: MIT */
/*
 * nats_internal.h - what the dispatcher (nats_dispatch.c), the worker
 * (nats_serve.c) and their shared helpers (nats_common.c) agree on: the
 * subjects, headers and the outcome's wire form.
 */
#ifndef FANOUT_NATS_INTERNAL_H
#define FANOUT_NATS_INTERNAL_H

#include <nats/nats.h>

#include "fanout_nats.h"

#define FANOUT_NATS_HIDDEN __attribute__((visibility("hidden")))

#define FNATS_DEFAULT_URL "nats://127.0.0.1:4222"
#define FNATS_RESULTS_STREAM "FANOUT_RESULTS"
#define FNATS_ADV_STREAM "FANOUT_ADVISORIES"
#define FNATS_ADV_SUBJECT "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.>"
#define FNATS_ADV_PREFIX "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES."
#define FNATS_HDR_KEY "Fanout-Key"
#define FNATS_HDR_REPLY "Fanout-Reply"
#define FNATS_HDR_DELIVERY "Fanout-Delivery"
#define FNATS_HDR_GOAL "Fanout-Goal"
/* Room left for headers below the server's max_payload. */
#define FNATS_HEADER_ROOM 512
/* A key is "<dispatcher id>.<nonce>.<seq>": 32 + 1 + 16 + 1 + 20 + NUL
 * (the nonce: random per fanout_nats_open(), see nats_dispatch.c). */
#define FNATS_ID_MAX 32
#define FNATS_NONCE_LEN 16
#define FNATS_KEY_MAX 80
_Static_assert(FNATS_KEY_MAX >= FNATS_ID_MAX + 1 + FNATS_NONCE_LEN + 1 + 20 + 1,
	       "a key must fit FNATS_KEY_MAX");

/* Names derived from a kind. */
struct fnats_names {
	char stream[8 + FANOUT_NATS_MAX_KIND];	 /* FANOUT_<KIND> */
	char work[13 + FANOUT_NATS_MAX_KIND];	 /* fanout.work.<kind> */
	char cancel[15 + FANOUT_NATS_MAX_KIND];	 /* fanout.cancel.<kind> */
	char durable[16 + FANOUT_NATS_MAX_KIND]; /* fanout-worker-<kind> */
};

/* An outcome decoded from a result message; strings point into it. */
struct fnats_outcome {
	int code;
	double cost;
	const char *summary;
	size_t summary_len;
	const char *error; /* NUL-terminated copy, or NULL */
};

FANOUT_NATS_HIDDEN bool fnats_kind_ok(const char *kind);
FANOUT_NATS_HIDDEN bool fnats_id_ok(const char *id);
FANOUT_NATS_HIDDEN void fnats_names(const char *kind, struct fnats_names *nm);
FANOUT_NATS_HIDDEN int fnats_errno(natsStatus s);
FANOUT_NATS_HIDDEN int fnats_connect(const char *url, int timeout_ms,
				     const char *name, natsConnection **nc,
				     jsCtx **js, const jsOptions *jo);
FANOUT_NATS_HIDDEN int fnats_ensure_stream(jsCtx *js, const char *name,
					   const char *subject, bool workqueue,
					   int64_t max_age_ns);
FANOUT_NATS_HIDDEN int fnats_encode_outcome(const struct fanout_result *r,
					    char **buf, size_t *len);
FANOUT_NATS_HIDDEN int fnats_decode_outcome(const char *buf, size_t len,
					    struct fnats_outcome *o,
					    char **error_copy);
FANOUT_NATS_HIDDEN uint64_t fnats_now_ms(void);
/* A durable pull consumer read by hand (nats_common.c, "Pulling"). */
struct fnats_puller {
	natsConnection *nc;
	natsSubscription *inbox; /* core subscription on <reply>.* */
	natsInbox *reply;
	char next[160];		/* the consumer's MSG.NEXT subject */
	char cur[128];		/* the open request's <reply>.<seq> */
	uint64_t seq;		/* requests sent */
	int asked;		/* messages asked for and not yet seen */
	uint64_t open_until_ms; /* the last request's wait ends */
};

FANOUT_NATS_HIDDEN int fnats_puller_open(struct fnats_puller *p,
					 natsConnection *nc, const char *stream,
					 const char *consumer);
FANOUT_NATS_HIDDEN void fnats_puller_close(struct fnats_puller *p);
/* The consumer's next message into *@msg (the caller's), asking for
 * @batch when no request is open: with @no_wait only for what is there
 * now, else waiting until @until_ms (fnats_now_ms()).  Return: 0;
 * -ETIMEDOUT when nothing came (with @no_wait: nothing is there); -EAGAIN
 * when the server refused the request (409); another negative errno
 * (disconnected, ...). */
FANOUT_NATS_HIDDEN int fnats_pull(struct fnats_puller *p, int batch,
				  bool no_wait, uint64_t until_ms,
				  natsMsg **msg);
/* A message already in the puller's inbox into *@msg, without asking
 * for any: one an earlier request brought late (its wait over here, the
 * server still held it).  Status messages are handled as fnats_pull
 * does.  Return: 0; -ETIMEDOUT when there is none; another negative
 * errno. */
FANOUT_NATS_HIDDEN int fnats_pull_queued(struct fnats_puller *p, natsMsg **msg);
/* Acknowledge a message read through a puller: FNATS_ACK, _NAK, _WPI
 * (in progress, keep it) or _TERM (never redeliver). */
#define FNATS_ACK "+ACK"
#define FNATS_NAK "-NAK"
#define FNATS_WPI "+WPI"
#define FNATS_TERM "+TERM"
/* A Nak redelivered no sooner than 250 ms later (nats-server 2.7.1 and
 * later; the body libnats' natsMsg_NakWithDelay sends): long enough for
 * the worker's own pull requests still open at the server (an idle wait
 * is 100 ms) to expire, so another worker's request takes it. */
#define FNATS_NAK_DELAYED "-NAK {\"delay\":250000000}"
FANOUT_NATS_HIDDEN int fnats_ack(natsConnection *nc, natsMsg *msg,
				 const char *how);
/* Which delivery of its message @msg is (1 = the first), from its
 * JetStream reply subject; 1 when that cannot be read. */
FANOUT_NATS_HIDDEN unsigned fnats_delivery(natsMsg *msg);

#endif
