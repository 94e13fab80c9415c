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
/* A key is "<dispatcher id>.<seq>": 32 + 1 + 20 + NUL. */
#define FNATS_KEY_MAX 64
#define FNATS_ID_MAX 32

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
/* Fetch up to @batch messages: what is available at once, or else wait
 * up to @wait_ms for one.  Return: 0 with list->Count > 0; -ETIMEDOUT
 * when nothing came; another negative errno (disconnected, ...). */
FANOUT_NATS_HIDDEN int fnats_fetch(natsSubscription *sub, natsMsgList *list,
				   int batch, int wait_ms);

#endif
