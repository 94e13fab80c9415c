// SPDX-License-Identifier: MIT
/*
 * bench-remote - remote no-op children through a local nats-server next
 * to the same children on local workers (issue 12's figures).
 *
 * Starts its own nats-server (free port, temporary store) and W worker
 * processes (remote-test-worker, no-op handler).  Reports:
 *   throughput  N no-op children in one delegation, dispatch -> event;
 *               children/s and the cost per child in microseconds;
 *   latency     one-child delegations one after another, dispatch ->
 *               event, median and p99;
 * for: remote (publish window 4096: js_PublishAsync, acks awaited in the
 * background), remote with a window of 64 publishes in flight, and local workers.
 *
 *   bench-remote -w path/to/remote-test-worker [-n N] [-l LAT_ITERS]
 *                [-W workers] [-c concurrency]
 */
#include <getopt.h>

#include <nats/nats.h>

#include "fanout_nats.h"
#include "../remote/tests/nats_harness.h"

static int noop(struct fanout_child *c, void *arg)
{
	(void)c;
	(void)arg;
	return 0;
}

/* JetStream publish cost on its own: synchronous js_Publish (one round
 * trip each) against js_PublishAsync with a bounded window. */
static void publish_cost(const char *url, unsigned n)
{
	natsConnection *nc = NULL;
	jsCtx *js = NULL;
	jsOptions jo;
	jsStreamConfig sc;
	jsPubOptions po;
	const char *subj[] = {"benchpub.x"};
	uint64_t t0, sync_ns, async_ns;
	unsigned i;

	if (natsConnection_ConnectTo(&nc, url) != NATS_OK)
		return;
	jsOptions_Init(&jo);
	jo.PublishAsync.MaxPending = 4096;
	natsConnection_JetStream(&js, nc, &jo);
	jsStreamConfig_Init(&sc);
	sc.Name = "BENCHPUB";
	sc.Subjects = subj;
	sc.SubjectsLen = 1;
	js_AddStream(NULL, js, &sc, NULL, NULL);
	t0 = fanout_now_ns();
	for (i = 0; i < n; i++)
		js_Publish(NULL, js, "benchpub.x", "noop", 4, NULL, NULL);
	sync_ns = fanout_now_ns() - t0;
	jsPubOptions_Init(&po);
	po.MaxWait = 30000;
	t0 = fanout_now_ns();
	for (i = 0; i < n; i++)
		js_PublishAsync(js, "benchpub.x", "noop", 4, NULL);
	js_PublishAsyncComplete(js, &po);
	async_ns = fanout_now_ns() - t0;
	printf("%-28s %8u messages  %9.2f us/msg\n", "js_Publish (synchronous)",
	       n, sync_ns / 1e3 / n);
	printf("%-28s %8u messages  %9.2f us/msg\n",
	       "js_PublishAsync, window 4096", n, async_ns / 1e3 / n);
	js_DeleteStream(js, "BENCHPUB", NULL, NULL);
	jsCtx_Destroy(js);
	natsConnection_Destroy(nc);
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

/* One delegation of @n children; returns ns from dispatch to event. */
static uint64_t run_batch(struct fanout_engine *e, struct fanout_nats *nn,
			  unsigned n, unsigned *ok)
{
	struct fanout_task *t = calloc(n, sizeof(*t));
	struct fanout_batch b = {.tasks = t, .ntasks = n};
	struct fanout_event *ev;
	uint64_t t0, t1;
	unsigned i;

	for (i = 0; i < n; i++) {
		if (nn) {
			if (fanout_nats_task(nn, "bench", "noop", 4, NULL,
					     &t[i]))
				abort();
		} else {
			t[i].fn = noop;
		}
	}
	t0 = fanout_now_ns();
	if (fanout_dispatch(e, &b, NULL))
		abort();
	if (fanout_wait(fanout_default_sink(e), &ev, 600000))
		abort();
	t1 = fanout_now_ns();
	*ok = ev->ncompleted;
	fanout_event_free(ev);
	free(t);
	return t1 - t0;
}

static void throughput(const char *name, struct fanout_engine *e,
		       struct fanout_nats *nn, unsigned n)
{
	uint64_t best = UINT64_MAX;
	unsigned ok = 0, r;

	for (r = 0; r < 3; r++) {
		uint64_t ns = run_batch(e, nn, n, &ok);

		if (ns < best)
			best = ns;
	}
	printf("%-28s %8u children  %10.0f children/s  %9.2f us/child%s\n",
	       name, n, n / (best / 1e9), best / 1e3 / n,
	       ok == n ? "" : "  (NOT ALL COMPLETED)");
}

static void latency(const char *name, struct fanout_engine *e,
		    struct fanout_nats *nn, unsigned iters)
{
	uint64_t *lat = calloc(iters, sizeof(*lat));
	unsigned i, ok;

	for (i = 0; i < iters; i++)
		lat[i] = run_batch(e, nn, 1, &ok);
	qsort(lat, iters, sizeof(*lat), cmp_u64);
	printf("%-28s %8u rounds    median %9.1f us  p99 %9.1f us\n", name,
	       iters, lat[iters / 2] / 1e3, lat[iters * 99 / 100] / 1e3);
	free(lat);
}

int main(int argc, char **argv)
{
	static const char *const kinds[] = {"bench"};
	struct fanout_nats_opts no = {.kinds = kinds, .nkinds = 1};
	struct fanout_config cfg = {.flags = FANOUT_NO_PIN,
				    .max_children = 1u << 16,
				    .max_tasks = 1u << 20};
	const char *prog = NULL, *conc = "16";
	unsigned n = 20000, iters = 300, nw = 2, i;
	struct fanout_engine *e = NULL;
	struct fanout_nats *nn, *n1;
	struct nats_srv srv;
	pid_t w[16];
	int ch;

	while ((ch = getopt(argc, argv, "w:n:l:W:c:")) != -1) {
		switch (ch) {
		case 'w':
			prog = optarg;
			break;
		case 'n':
			n = (unsigned)atoi(optarg);
			break;
		case 'l':
			iters = (unsigned)atoi(optarg);
			break;
		case 'W':
			nw = (unsigned)atoi(optarg);
			break;
		case 'c':
			conc = optarg;
			break;
		default:
			return 2;
		}
	}
	if (!prog || !n || !iters || !nw || nw > 16)
		return 2;
	signal(SIGPIPE, SIG_IGN);
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (nats_srv_start(&srv))
		return 1;
	/* A failure below must not leave the server behind (it would hold
	 * the caller's pipe open). */
	if (fanout_create(&cfg, &e) || fanout_nats_open(srv.url, &no, &nn)) {
		fanout_destroy(e);
		nats_srv_stop(&srv);
		return 1;
	}
	no.publish_window = 64;
	if (fanout_nats_open(srv.url, &no, &n1)) {
		fanout_nats_close(nn);
		fanout_destroy(e);
		nats_srv_stop(&srv);
		return 1;
	}
	for (i = 0; i < nw; i++) {
		char *av[] = {(char *)prog, "--url", srv.url,
			      "--kind",	    "bench", "--concurrency",
			      (char *)conc, NULL};

		w[i] = h_spawn(av);
	}
	printf("bench-remote: nats-server %s, %u worker processes x %s "
	       "handlers, dispatcher engine %u workers\n",
	       srv.url, nw, conc, 2u);
	{
		unsigned ok;

		run_batch(e, nn, 1000, &ok); /* warm up: workers connected */
	}
	publish_cost(srv.url, 5000);
	throughput("remote, publish window 4096", e, nn, n);
	throughput("remote, publish window 64", e, n1, n / 4);
	throughput("local workers", e, NULL, n);
	latency("remote, one child", e, nn, iters);
	latency("local, one child", e, NULL, iters * 10);
	for (i = 0; i < nw; i++)
		h_kill_wait(w[i], SIGTERM);
	fanout_shutdown(e);
	fanout_nats_close(n1);
	fanout_nats_close(nn);
	fanout_destroy(e);
	nats_srv_stop(&srv);
	return 0;
}
