// SPDX-License-Identifier: MIT
/*
 * test_puller.c - the hand-made JetStream pull of nats_common.c
 * (fnats_pull), against a real nats-server started on a free port in a
 * temporary directory.  Linked with nats_common's object itself, so the
 * puller's state can be checked, not only what comes out of it.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <nats/nats.h>

#include "nats_harness.h"
#include "nats_internal.h"

#define STREAM "PULLT"
#define SUBJECT "pullt.x"
#define CONSUMER "d"

struct env {
	struct nats_srv srv;
	natsConnection *nc;
	jsCtx *js;
	struct fnats_puller p;
};

static struct env *cur;

static struct env *env_new(void)
{
	struct env *v = calloc(1, sizeof(*v));
	const char *subj[] = {SUBJECT};
	jsStreamConfig sc;
	jsConsumerConfig cc;

	assert_non_null(v);
	cur = v;
	assert_int_equal(nats_srv_start(&v->srv), 0);
	assert_int_equal(natsConnection_ConnectTo(&v->nc, v->srv.url), NATS_OK);
	assert_int_equal(natsConnection_JetStream(&v->js, v->nc, NULL),
			 NATS_OK);
	jsStreamConfig_Init(&sc);
	sc.Name = STREAM;
	sc.Subjects = subj;
	sc.SubjectsLen = 1;
	assert_int_equal(js_AddStream(NULL, v->js, &sc, NULL, NULL), NATS_OK);
	jsConsumerConfig_Init(&cc);
	cc.Durable = CONSUMER;
	cc.AckPolicy = js_AckExplicit;
	assert_int_equal(js_AddConsumer(NULL, v->js, STREAM, &cc, NULL, NULL),
			 NATS_OK);
	assert_int_equal(fnats_puller_open(&v->p, v->nc, STREAM, CONSUMER), 0);
	return v;
}

static void env_free(struct env *v)
{
	/* Closed first, as the library does (nats_dispatch.c, destroy). */
	if (v->nc)
		natsConnection_Close(v->nc);
	fnats_puller_close(&v->p);
	if (v->js)
		jsCtx_Destroy(v->js);
	if (v->nc)
		natsConnection_Destroy(v->nc);
	nats_srv_stop(&v->srv);
	free(v);
	cur = NULL;
}

static int teardown(void **state)
{
	(void)state;
	if (cur)
		env_free(cur);
	return 0;
}

/* Store message "<i>" in the stream. */
static void put(struct env *v, int i)
{
	char b[16];

	snprintf(b, sizeof(b), "%d", i);
	assert_int_equal(
		js_Publish(NULL, v->js, SUBJECT, b, (int)strlen(b), NULL, NULL),
		NATS_OK);
}

/* The index a message carries; acks it. */
static int take(struct env *v, natsMsg *m)
{
	char b[16] = {0};
	int len = natsMsg_GetDataLength(m);

	assert_true(len > 0 && len < (int)sizeof(b));
	memcpy(b, natsMsg_GetData(m), (size_t)len);
	assert_int_equal(fnats_ack(v->nc, m, FNATS_ACK), 0);
	natsMsg_Destroy(m);
	return atoi(b);
}

/*
 * A status for another request (a late 408 of an expired wait) must not
 * end the open request: it comes on that request's reply subject.  With
 * one reply subject for every request it did, and the next read sent a
 * second request.
 */
static void test_stale_status_ignored(void **state)
{
	struct env *v = env_new();
	uint64_t until = fnats_now_ms() + 5000;
	char stale[sizeof(v->p.cur) + 8];
	natsMsg *m = NULL, *st = NULL;

	(void)state;
	put(v, 0);
	assert_int_equal(fnats_pull(&v->p, 10, false, until, &m), 0);
	assert_int_equal(take(v, m), 0);
	assert_int_equal(v->p.seq, 1);
	assert_int_equal(v->p.asked, 9);
	/* an older request's end, as the server sends it: no data, a
	 * Status header, on that request's own reply subject */
	snprintf(stale, sizeof(stale), "%s.999", v->p.reply);
	assert_int_equal(natsMsg_Create(&st, stale, NULL, NULL, 0), NATS_OK);
	assert_int_equal(natsMsgHeader_Set(st, "Status", "408"), NATS_OK);
	assert_int_equal(natsConnection_PublishMsg(v->nc, st), NATS_OK);
	natsMsg_Destroy(st);
	assert_int_equal(natsConnection_Flush(v->nc), NATS_OK);
	put(v, 1);
	assert_int_equal(fnats_pull(&v->p, 10, false, until, &m), 0);
	assert_int_equal(take(v, m), 1);
	assert_int_equal(v->p.seq, 1); /* still the first request */
	assert_int_equal(v->p.asked, 8);
	env_free(v);
}

/*
 * Requests that expire on our side while the server still serves them:
 * their replies come late, mixed with the next requests', in a burst
 * bigger than any batch asked for.  libnats' Fetch (before 3.10) wrote
 * past its array in that case (nats.c #749).  Every message must be read
 * exactly once, one at a time, whatever request it answers.
 */
#define LATE_N 600

static void test_late_replies_read_once(void **state)
{
	struct env *v = env_new();
	static unsigned char seen[LATE_N];
	unsigned got = 0, i;
	uint64_t until;
	natsMsg *m = NULL;
	int err;

	(void)state;
	memset(seen, 0, sizeof(seen));
	for (i = 0; i < LATE_N; i++)
		put(v, (int)i);
	/* Many small requests, each given up by us at once: the server
	 * answers them all while we are not reading. */
	for (i = 0; i < 40; i++) {
		err = fnats_pull(&v->p, 16, false, fnats_now_ms(), &m);
		if (err == 0) {
			int k = take(v, m);

			assert_true(k >= 0 && k < LATE_N);
			assert_int_equal(seen[k], 0);
			seen[k] = 1;
			got++;
		} else {
			assert_int_equal(err, -ETIMEDOUT);
		}
	}
	h_sleep_ms(200); /* the replies pile up in the inbox */
	until = fnats_now_ms() + 10000;
	while (got < LATE_N && fnats_now_ms() < until) {
		err = fnats_pull(&v->p, 256, false,
				 fnats_now_ms() + 200 < until ?
					 fnats_now_ms() + 200 :
					 until,
				 &m);
		if (err == -ETIMEDOUT)
			continue;
		assert_int_equal(err, 0);
		i = (unsigned)take(v, m);
		assert_true(i < LATE_N);
		assert_int_equal(seen[i], 0);
		seen[i] = 1;
		got++;
	}
	assert_int_equal(got, LATE_N);
	/* and nothing more: a short wait brings no duplicate */
	err = fnats_pull(&v->p, 256, false, fnats_now_ms() + 300, &m);
	assert_int_equal(err, -ETIMEDOUT);
	env_free(v);
}

/* A no-wait request with nothing there ends at once with the server's
 * status, not after a wait. */
static void test_no_wait_empty(void **state)
{
	struct env *v = env_new();
	natsMsg *m = NULL;
	uint64_t t0;

	(void)state;
	t0 = fnats_now_ms();
	assert_int_equal(fnats_pull(&v->p, 8, true, t0, &m), -ETIMEDOUT);
	assert_null(m);
	assert_int_equal(v->p.asked, 0); /* ended by the status */
	put(v, 5);
	assert_int_equal(fnats_pull(&v->p, 8, true, fnats_now_ms(), &m), 0);
	assert_int_equal(take(v, m), 5);
	env_free(v);
}

/*
 * fnats_pull_queued reads what is in the inbox without asking for more: a
 * message of a request that is not ours any more (made here on the
 * puller's inbox) after a stale status, which it skips; then nothing.
 */
static void test_queued_asks_nothing(void **state)
{
	struct env *v = env_new();
	char reply[sizeof(v->p.cur) + 8];
	natsMsg *m = NULL, *st = NULL;
	uint64_t until;
	int err;

	(void)state;
	put(v, 0);
	assert_int_equal(fnats_pull(&v->p, 1, false, fnats_now_ms() + 5000, &m),
			 0);
	assert_int_equal(take(v, m), 0);
	assert_int_equal(v->p.seq, 1);
	assert_int_equal(v->p.asked, 0);
	assert_int_equal(fnats_pull_queued(&v->p, &m), -ETIMEDOUT);
	snprintf(reply, sizeof(reply), "%s.999", v->p.reply);
	assert_int_equal(natsMsg_Create(&st, reply, NULL, NULL, 0), NATS_OK);
	assert_int_equal(natsMsgHeader_Set(st, "Status", "408"), NATS_OK);
	assert_int_equal(natsConnection_PublishMsg(v->nc, st), NATS_OK);
	natsMsg_Destroy(st);
	snprintf(reply, sizeof(reply), "%s.998", v->p.reply);
	assert_int_equal(natsConnection_PublishRequestString(
				 v->nc, v->p.next, reply,
				 "{\"batch\":1,\"expires\":10000000000}"),
			 NATS_OK);
	assert_int_equal(natsConnection_Flush(v->nc), NATS_OK);
	put(v, 1);
	until = fnats_now_ms() + 10000;
	while ((err = fnats_pull_queued(&v->p, &m)) == -ETIMEDOUT &&
	       fnats_now_ms() < until)
		h_sleep_ms(5);
	assert_int_equal(err, 0);
	assert_int_equal(take(v, m), 1);
	assert_int_equal(v->p.seq, 1); /* no request sent */
	assert_int_equal(fnats_pull_queued(&v->p, &m), -ETIMEDOUT);
	assert_null(m);
	env_free(v);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_stale_status_ignored, teardown),
		cmocka_unit_test_teardown(test_late_replies_read_once,
					  teardown),
		cmocka_unit_test_teardown(test_no_wait_empty, teardown),
		cmocka_unit_test_teardown(test_queued_asks_nothing, teardown),
	};

	return nats_suite_end(cmocka_run_group_tests(tests, NULL, NULL));
}
