// SPDX-License-Identifier: MIT
/*
 * test_remote.c - remote children over NATS JetStream, against a real
 * nats-server that each test starts on a free port in a temporary
 * directory (and kills at the end), and real worker processes
 * (remote-test-worker, fanout-worker).  Faults are real too: SIGKILL to a
 * worker, the server stopped and restarted on its store, the
 * dispatcher's TCP connection cut by a proxy.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <nats/nats.h>

#include "fanout_nats.h"
#include "nats_harness.h"

#define MAXW 4

struct env {
	struct nats_srv srv;
	struct fanout_engine *e;
	struct fanout_nats *n;
	pid_t w[MAXW];
	char log[MAXW][PATH_MAX + 32];
	char worker[PATH_MAX];
};

/* The running test's env, for the teardown after a failed assertion. */
static struct env *cur;

static struct env *env_new(const char *url_override_unused)
{
	struct env *v = calloc(1, sizeof(*v));
	struct fanout_config cfg = {.flags = FANOUT_NO_PIN, .workers = 2};
	const char *w = getenv("REMOTE_TEST_ENGINE_WORKERS");
	int i;

	(void)url_override_unused;
	assert_non_null(v);
	if (w)
		cfg.workers = (unsigned)atoi(w);
	assert_int_equal(nats_srv_start(&v->srv), 0);
	assert_int_equal(fanout_create(&cfg, &v->e), 0);
	h_sibling(v->worker, sizeof(v->worker), "remote-test-worker");
	for (i = 0; i < MAXW; i++) {
		size_t dl = strlen(v->srv.dir);

		memcpy(v->log[i], v->srv.dir, dl);
		snprintf(v->log[i] + dl, sizeof(v->log[i]) - dl, "/w%d.log", i);
	}
	cur = v;
	return v;
}

static int open_disp(struct env *v, const char *url, int retry_ms)
{
	static const char *const kinds[] = {"t", "x"};
	struct fanout_nats_opts o = {.kinds = kinds,
				     .nkinds = 2,
				     .id = "tdisp",
				     .publish_retry_ms = retry_ms};

	return fanout_nats_open(url ? url : v->srv.url, &o, &v->n);
}

/* The test's own connection and JetStream context, to look at or change
 * the server's streams and consumers beside the library's. */
static void js_connect(const struct env *v, natsConnection **nc, jsCtx **js)
{
	assert_int_equal(natsConnection_ConnectTo(nc, v->srv.url), NATS_OK);
	assert_int_equal(natsConnection_JetStream(js, *nc, NULL), NATS_OK);
}

static void js_disconnect(natsConnection *nc, jsCtx *js)
{
	jsCtx_Destroy(js);
	natsConnection_Destroy(nc);
}

/* A remote-test-worker as worker @i; @max_held 0 = the default. */
static void start_worker_ex(struct env *v, int i, const char *kind, int conc,
			    int max_deliver, int ack_wait_ms, int max_held)
{
	char c[16], m[16], a[16], h[16];
	char *argv[] = {v->worker,
			"--url",
			v->srv.url,
			"--kind",
			(char *)kind,
			"--concurrency",
			c,
			"--ack-wait-ms",
			a,
			"--max-deliver",
			m,
			"--max-held",
			h,
			"--log",
			v->log[i],
			NULL};

	snprintf(c, sizeof(c), "%d", conc);
	snprintf(m, sizeof(m), "%d", max_deliver);
	snprintf(a, sizeof(a), "%d", ack_wait_ms);
	snprintf(h, sizeof(h), "%d", max_held);
	v->w[i] = h_spawn(argv);
	assert_true(v->w[i] > 0);
}

static void start_worker(struct env *v, int i, const char *kind, int conc,
			 int max_deliver)
{
	start_worker_ex(v, i, kind, conc, max_deliver, 1000, 0);
}

static void env_free(struct env *v)
{
	int i;

	for (i = 0; i < MAXW; i++)
		h_kill_wait(v->w[i], SIGTERM);
	if (v->e)
		fanout_shutdown(v->e);
	fanout_nats_close(v->n);
	fanout_destroy(v->e);
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

/* Make tasks for @payloads and dispatch them. */
static fanout_id dispatch(struct env *v, const char *kind, const char **pl,
			  unsigned n, uint64_t deadline_ns)
{
	struct fanout_task t[64];
	struct fanout_batch b = {
		.tasks = t, .ntasks = n, .deadline_ns = deadline_ns};
	fanout_id id = 0;
	unsigned i;

	assert_true(n <= 64);
	for (i = 0; i < n; i++)
		assert_int_equal(fanout_nats_task(v->n, kind, pl[i],
						  strlen(pl[i]), NULL, &t[i]),
				 0);
	assert_int_equal(fanout_dispatch(v->e, &b, &id), 0);
	return id;
}

/* The one event of the only delegation, and no second one. */
static struct fanout_event *one_event(struct env *v, int timeout_ms)
{
	struct fanout_sink *s = fanout_default_sink(v->e);
	struct fanout_event *ev = NULL, *ev2 = NULL;

	assert_int_equal(fanout_wait(s, &ev, timeout_ms), 0);
	assert_int_equal(fanout_wait(s, &ev2, 200), -ETIMEDOUT);
	return ev;
}

static void test_roundtrip(void **state)
{
	struct env *v = env_new(NULL);
	const char *pl[] = {"echo:alpha", "fail:5:boom", "cost:2.5", "noop"};
	struct fanout_nats_stats st;
	struct fanout_event *ev;

	(void)state;
	assert_int_equal(open_disp(v, NULL, 0), 0);
	start_worker(v, 0, "t", 2, 5);
	dispatch(v, "t", pl, 4, 0);
	ev = one_event(v, 60000);
	assert_int_equal(ev->nresults, 4);
	assert_int_equal(ev->results[0].status, FANOUT_COMPLETED);
	assert_string_equal(ev->results[0].summary, "alpha");
	assert_int_equal(ev->results[1].status, FANOUT_ERROR);
	assert_int_equal(ev->results[1].code, -5);
	assert_string_equal(ev->results[1].error, "boom");
	assert_int_equal(ev->results[2].status, FANOUT_COMPLETED);
	assert_true(ev->results[2].cost == 2.5);
	assert_int_equal(ev->results[3].status, FANOUT_COMPLETED);
	assert_int_equal(ev->ncompleted, 3);
	fanout_event_free(ev);
	assert_int_equal(fanout_nats_stats(v->n, &st), 0);
	assert_int_equal(st.results, 4);
	assert_int_equal(st.in_flight, 0);
	env_free(v);
}

/*
 * A stream of results: one delegation of 4096 remote children, all in
 * flight at once, whose results come back while the dispatcher's pull
 * requests expire and new ones go out, so results of an expired request
 * are still arriving when the next read starts: the case in which
 * libnats' own natsSubscription_Fetch (before 3.10) writes past its
 * message array (nats.c #749), which bench-remote's ASan build caught in
 * fetch_some.  This test does not hit that race reliably (nor did it in
 * nine runs against the old pump); it holds the hand-made puller that
 * replaced Fetch to exactly-once delivery of a stream of results.
 */
#define STREAM_N 4096

static void test_result_stream(void **state)
{
	struct env *v = env_new(NULL);
	struct fanout_config cfg = {
		.flags = FANOUT_NO_PIN, .workers = 2, .max_children = STREAM_N};
	struct fanout_task *t = calloc(STREAM_N, sizeof(*t));
	struct fanout_batch b = {.tasks = t, .ntasks = STREAM_N};
	struct fanout_nats_stats st;
	unsigned round, i;

	(void)state;
	assert_non_null(t);
	/* this test's engine: every child of the batch in flight at once */
	fanout_shutdown(v->e);
	fanout_destroy(v->e);
	v->e = NULL;
	assert_int_equal(fanout_create(&cfg, &v->e), 0);
	assert_int_equal(open_disp(v, NULL, 0), 0);
	start_worker(v, 0, "t", 16, 5);
	start_worker(v, 1, "t", 16, 5);
	for (round = 0; round < 3; round++) {
		struct fanout_event *ev = NULL;

		for (i = 0; i < STREAM_N; i++)
			assert_int_equal(fanout_nats_task(v->n, "t", "noop", 4,
							  NULL, &t[i]),
					 0);
		assert_int_equal(fanout_dispatch(v->e, &b, NULL), 0);
		assert_int_equal(
			fanout_wait(fanout_default_sink(v->e), &ev, 120000), 0);
		assert_int_equal(ev->ncompleted, STREAM_N);
		fanout_event_free(ev);
	}
	free(t);
	assert_int_equal(fanout_nats_stats(v->n, &st), 0);
	assert_int_equal(st.results, 3 * STREAM_N);
	assert_int_equal(st.duplicates, 0);
	assert_int_equal(st.in_flight, 0);
	env_free(v);
}

static void test_exec_worker(void **state)
{
	struct env *v = env_new(NULL);
	char fw[PATH_MAX];
	const char *pl1[] = {"abc", "hello"};
	const char *pl2[] = {"x"};
	struct fanout_event *ev;
	pid_t a, b;

	(void)state;
	h_sibling(fw, sizeof(fw), "fanout-worker");
	assert_int_equal(open_disp(v, NULL, 0), 0);
	{
		char *av[] = {fw,  "--url",  v->srv.url,   "--kind",
			      "t", "--exec", "tr a-z A-Z", NULL};
		char *bv[] = {fw,
			      "--url",
			      v->srv.url,
			      "--kind",
			      "x",
			      "--exec",
			      "cat >/dev/null; echo -n partial; exit 3",
			      NULL};

		a = h_spawn(av);
		b = h_spawn(bv);
	}
	dispatch(v, "t", pl1, 2, 0);
	ev = one_event(v, 60000);
	assert_int_equal(ev->status, FANOUT_COMPLETED);
	assert_string_equal(ev->results[0].summary, "ABC");
	assert_string_equal(ev->results[1].summary, "HELLO");
	fanout_event_free(ev);
	dispatch(v, "x", pl2, 1, 0);
	ev = one_event(v, 60000);
	assert_int_equal(ev->results[0].status, FANOUT_ERROR);
	assert_int_equal(ev->results[0].code, 3);
	assert_string_equal(ev->results[0].summary, "partial");
	assert_non_null(strstr(ev->results[0].error, "status 3"));
	fanout_event_free(ev);
	h_kill_wait(a, SIGTERM);
	h_kill_wait(b, SIGTERM);
	env_free(v);
}

/* A worker killed mid-child: another gets it after AckWait; once in the
 * event. */
static void test_worker_killed_redelivered(void **state)
{
	struct env *v = env_new(NULL);
	const char *pl[10];
	char buf[10][32];
	struct fanout_nats_stats st;
	struct fanout_event *ev;
	unsigned i;

	(void)state;
	for (i = 0; i < 10; i++) {
		snprintf(buf[i], sizeof(buf[i]), "sleep:300:c%u", i);
		pl[i] = buf[i];
	}
	assert_int_equal(open_disp(v, NULL, 0), 0);
	start_worker(v, 0, "t", 2, 5);
	dispatch(v, "t", pl, 10, 0);
	assert_true(h_wait_lines(v->log[0], "S ", 1, 30000));
	h_kill_wait(v->w[0], SIGKILL);
	v->w[0] = 0;
	start_worker(v, 1, "t", 4, 5);
	ev = one_event(v, 60000);
	assert_int_equal(ev->nresults, 10);
	assert_int_equal(ev->ncompleted, 10);
	for (i = 0; i < 10; i++) {
		char want[16];

		snprintf(want, sizeof(want), "c%u", i);
		assert_int_equal(ev->results[i].index, i);
		assert_string_equal(ev->results[i].summary, want);
	}
	fanout_event_free(ev);
	fanout_nats_stats(v->n, &st);
	assert_true(st.redelivered >= 1);
	assert_true(h_count_lines(v->log[1], "S ") >= 10 - 1);
	env_free(v);
}

/* A child that kills every worker that takes it: ERROR naming MaxDeliver;
 * the other child of the batch is unaffected; the join does not hang. */
static void test_max_deliver_exhausted(void **state)
{
	struct env *v = env_new(NULL);
	const char *pl[] = {"crash", "echo:fine"};
	struct fanout_sink *s;
	struct fanout_event *ev = NULL;
	struct fanout_nats_stats st;
	long t0 = h_now_ms();
	int stt;

	(void)state;
	assert_int_equal(open_disp(v, NULL, 0), 0);
	start_worker(v, 0, "t", 1, 2);
	dispatch(v, "t", pl, 2, 0);
	s = fanout_default_sink(v->e);
	while (fanout_wait(s, &ev, 100) == -ETIMEDOUT) {
		assert_true(h_now_ms() - t0 < 60000);
		if (waitpid(v->w[0], &stt, WNOHANG) == v->w[0])
			start_worker(v, 0, "t", 1, 2); /* a supervisor */
	}
	assert_int_equal(ev->results[0].status, FANOUT_ERROR);
	assert_non_null(ev->results[0].error);
	assert_non_null(strstr(ev->results[0].error, "MaxDeliver=2"));
	assert_int_equal(ev->results[1].status, FANOUT_COMPLETED);
	assert_string_equal(ev->results[1].summary, "fine");
	fanout_event_free(ev);
	fanout_nats_stats(v->n, &st);
	assert_int_equal(st.exhausted, 1);
	env_free(v);
}

/* A deadline: INTERRUPTED with -ETIMEDOUT, and the worker is told. */
static void test_deadline(void **state)
{
	struct env *v = env_new(NULL);
	const char *pl[] = {"sleep:60000:late", "echo:soon"};
	struct fanout_event *ev;

	(void)state;
	assert_int_equal(open_disp(v, NULL, 0), 0);
	start_worker(v, 0, "t", 2, 5);
	dispatch(v, "t", pl, 2, 1500ull * 1000000);
	ev = one_event(v, 60000);
	assert_true(ev->timed_out);
	assert_int_equal(ev->results[0].status, FANOUT_INTERRUPTED);
	assert_int_equal(ev->results[0].code, -ETIMEDOUT);
	assert_int_equal(ev->results[1].status, FANOUT_COMPLETED);
	fanout_event_free(ev);
	/* the cancel notice reached the running handler */
	assert_true(h_wait_lines(v->log[0], "C ", 1, 30000));
	/* its outcome, after the deadline finished the child, finished
	 * nothing: a duplicate, not a result (it was counted as both) */
	{
		struct fanout_nats_stats st;
		long t0 = h_now_ms();

		do {
			fanout_nats_stats(v->n, &st);
			assert_true(h_now_ms() - t0 < 30000);
			h_sleep_ms(10);
		} while (st.duplicates == 0);
		assert_int_equal(st.duplicates, 1);
		assert_int_equal(st.results, 1);
	}
	env_free(v);
}

/* fanout_cancel(INTERRUPT) without ABANDON: the worker's handler sees
 * fanout_interrupted() and its -ECANCELED comes back as the outcome. */
static void test_cancel_reaches_worker(void **state)
{
	struct env *v = env_new(NULL);
	const char *pl[] = {"sleep:60000:never"};
	struct fanout_nats_stats st;
	struct fanout_event *ev;
	fanout_id id;

	(void)state;
	assert_int_equal(open_disp(v, NULL, 0), 0);
	start_worker(v, 0, "t", 1, 5);
	id = dispatch(v, "t", pl, 1, 0);
	assert_true(h_wait_lines(v->log[0], "S ", 1, 30000));
	assert_int_equal(fanout_cancel(v->e, id, FANOUT_CANCEL_INTERRUPT), 0);
	ev = one_event(v, 60000);
	assert_int_equal(ev->results[0].status, FANOUT_INTERRUPTED);
	assert_int_equal(ev->results[0].code, -ECANCELED);
	assert_true(ev->cancelled);
	fanout_event_free(ev);
	assert_int_equal(h_count_lines(v->log[0], "C "), 1);
	fanout_nats_stats(v->n, &st);
	assert_int_equal(st.cancels, 1);
	env_free(v);
}

/* nats-server stopped and restarted on the same store mid-run: nothing
 * accepted is lost, children in flight complete after it is back. */
static void test_server_restart(void **state)
{
	struct env *v = env_new(NULL);
	const char *pl[30];
	char buf[30][32];
	struct fanout_event *ev;
	unsigned i;

	(void)state;
	for (i = 0; i < 30; i++) {
		snprintf(buf[i], sizeof(buf[i]), "sleep:200:r%u", i);
		pl[i] = buf[i];
	}
	assert_int_equal(open_disp(v, NULL, 0), 0);
	start_worker(v, 0, "t", 2, 10);
	start_worker(v, 1, "t", 2, 10);
	dispatch(v, "t", pl, 30, 0);
	/* both workers connected and running children */
	assert_true(h_wait_lines(v->log[0], "S ", 1, 30000));
	assert_true(h_wait_lines(v->log[1], "S ", 1, 30000));
	nats_srv_kill(&v->srv, SIGTERM);
	h_sleep_ms(700);
	assert_int_equal(nats_srv_run(&v->srv), 0);
	ev = one_event(v, 120000);
	assert_int_equal(ev->ncompleted, 30);
	for (i = 0; i < 30; i++) {
		char want[16];

		snprintf(want, sizeof(want), "r%u", i);
		assert_string_equal(ev->results[i].summary, want);
	}
	fanout_event_free(ev);
	env_free(v);
}

/* The dispatcher's connection is cut while workers finish: it reconnects
 * and the outcomes published meanwhile are delivered (durable consumer). */
static void test_dispatcher_reconnect(void **state)
{
	struct env *v = env_new(NULL);
	const char *pl[4] = {"sleep:1000:a", "sleep:1000:b", "sleep:1000:c",
			     "sleep:1000:d"};
	struct fanout_nats_stats st;
	struct fanout_event *ev = NULL;
	struct proxy px;
	char url[64];

	(void)state;
	assert_int_equal(proxy_start(&px, v->srv.port), 0);
	snprintf(url, sizeof(url), "nats://127.0.0.1:%d", px.port);
	assert_int_equal(open_disp(v, url, 0), 0);
	start_worker(v, 0, "t", 4, 5);
	dispatch(v, "t", pl, 4, 0);
	assert_true(h_wait_lines(v->log[0], "S ", 4, 30000));
	atomic_store(&px.down, true);
	/* every outcome is published while the dispatcher is cut off */
	assert_true(h_wait_lines(v->log[0], "D ", 4, 30000));
	h_sleep_ms(500);
	assert_int_equal(fanout_poll(fanout_default_sink(v->e), &ev), -EAGAIN);
	atomic_store(&px.down, false);
	ev = one_event(v, 60000);
	assert_int_equal(ev->ncompleted, 4);
	assert_string_equal(ev->results[3].summary, "d");
	fanout_event_free(ev);
	fanout_nats_stats(v->n, &st);
	assert_int_equal(st.results, 4);
	fanout_shutdown(v->e);
	fanout_nats_close(v->n);
	v->n = NULL;
	proxy_stop(&px);
	env_free(v);
}

/* The key of the first child @log's worker started ("S <key> <n>"). */
static void first_key(const char *log, char *key, size_t cap)
{
	char line[256];
	FILE *f = fopen(log, "r");

	assert_non_null(f);
	assert_non_null(fgets(line, sizeof(line), f));
	fclose(f);
	assert_int_equal(sscanf(line, "S %79s", key), 1);
	assert_true(strlen(key) < cap);
}

/* An outcome that arrives twice is counted once. */
static void test_duplicate_outcome(void **state)
{
	struct env *v = env_new(NULL);
	const char *pl[] = {"echo:once"};
	struct fanout_nats_stats st;
	struct fanout_event *ev;
	natsConnection *nc = NULL;
	natsMsg *m = NULL;
	const char *body = "FO1 0 0 5 0\ntwice";
	char key[80];
	long t0;

	(void)state;
	assert_int_equal(open_disp(v, NULL, 0), 0);
	start_worker(v, 0, "t", 1, 5);
	dispatch(v, "t", pl, 1, 0);
	ev = one_event(v, 60000);
	assert_string_equal(ev->results[0].summary, "once");
	fanout_event_free(ev);
	/* the same child's outcome again, as a second run would send it */
	first_key(v->log[0], key, sizeof(key));
	assert_non_null(strstr(key, "tdisp."));
	assert_int_equal(natsConnection_ConnectTo(&nc, v->srv.url), NATS_OK);
	assert_int_equal(natsMsg_Create(&m, "fanout.result.tdisp", NULL, body,
					(int)strlen(body)),
			 NATS_OK);
	natsMsgHeader_Set(m, "Fanout-Key", key);
	natsMsgHeader_Set(m, "Fanout-Delivery", "2");
	assert_int_equal(natsConnection_PublishMsg(nc, m), NATS_OK);
	natsConnection_Flush(nc);
	natsMsg_Destroy(m);
	natsConnection_Destroy(nc);
	t0 = h_now_ms();
	do {
		fanout_nats_stats(v->n, &st);
		h_sleep_ms(10);
	} while (st.duplicates == 0 && h_now_ms() - t0 < 30000);
	assert_int_equal(st.duplicates, 1);
	assert_int_equal(st.results, 1);
	assert_int_equal(fanout_poll(fanout_default_sink(v->e), &ev), -EAGAIN);
	env_free(v);
}

/*
 * A dispatcher in a process of its own (this program, re-executed with
 * --dispatch-once): opens with id @id, dispatches one child of kind "t"
 * with @payload, waits up to @wait_ms for its event, closes and exits.
 * Its stdout, "EVENT <status> <code> <summary>" or "NOEVENT", lands in
 * @out.  A fresh process is what a restarted dispatcher is: its
 * library state starts from zero.
 */
static int dispatch_once_main(int argc, char **argv)
{
	static const char *const kinds[] = {"t"};
	struct fanout_config cfg = {.flags = FANOUT_NO_PIN, .workers = 1};
	struct fanout_nats_opts o = {.kinds = kinds, .nkinds = 1};
	struct fanout_engine *e = NULL;
	struct fanout_nats *n = NULL;
	struct fanout_event *ev = NULL;
	struct fanout_task t;
	struct fanout_batch b = {.tasks = &t, .ntasks = 1};
	int err;

	if (argc != 6)
		return 2;
	o.id = argv[3];
	if (fanout_create(&cfg, &e) || fanout_nats_open(argv[2], &o, &n) ||
	    fanout_nats_task(n, "t", argv[4], strlen(argv[4]), NULL, &t) ||
	    fanout_dispatch(e, &b, NULL))
		return 3;
	err = fanout_wait(fanout_default_sink(e), &ev, atoi(argv[5]));
	if (!err)
		printf("EVENT %s %d %s\n",
		       fanout_status_name(ev->results[0].status),
		       ev->results[0].code,
		       ev->results[0].summary ? ev->results[0].summary : "-");
	else
		printf("NOEVENT\n");
	fflush(stdout);
	if (ev)
		fanout_event_free(ev);
	fanout_shutdown(e);
	fanout_nats_close(n);
	fanout_destroy(e);
	return nats_suite_end(0);
}

static void run_dispatch_once(struct env *v, const char *id,
			      const char *payload, int wait_ms, char *out,
			      size_t cap)
{
	char self[PATH_MAX], ms[16];
	char *argv[] = {self,	    "--dispatch-once", v->srv.url,
			(char *)id, (char *)payload,   ms,
			NULL};
	ssize_t l = readlink("/proc/self/exe", self, sizeof(self) - 1);
	size_t got = 0;
	int fd[2], st;
	pid_t pid;

	assert_true(l > 0);
	self[l] = '\0';
	snprintf(ms, sizeof(ms), "%d", wait_ms);
	assert_int_equal(pipe(fd), 0);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		dup2(fd[1], 1);
		close(fd[0]);
		close(fd[1]);
		execv(self, argv);
		_exit(127);
	}
	close(fd[1]);
	for (;;) {
		ssize_t r = read(fd[0], out + got, cap - 1 - got);

		if (r <= 0 || got + (size_t)r >= cap - 1) {
			got += r > 0 ? (size_t)r : 0;
			break;
		}
		got += (size_t)r;
	}
	out[got] = '\0';
	close(fd[0]);
	assert_int_equal(waitpid(pid, &st, 0), pid);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 0);
}

/*
 * A dispatcher restarted with the same fixed id, well within JetStream's
 * duplicate window (2 minutes): its children are its own.  Keys once
 * restarted from "<id>.1" in every process, so JetStream took the new
 * run's work messages for duplicates of the old run's: a child queued
 * by the old run was run in place of the new one (the new run got the
 * old payload's outcome), and one whose key the old run had already
 * used was never stored, so it never completed.
 */
static void test_restart_same_id(void **state)
{
	struct env *v = env_new(NULL);
	char out[512];

	(void)state;
	/* this process uses libnats too (nats_suite_end() expects it) */
	assert_int_equal(open_disp(v, NULL, 0), 0);
	/* run 1: no worker yet; its child stays queued after it exits */
	run_dispatch_once(v, "fixed", "echo:first", 300, out, sizeof(out));
	assert_string_equal(out, "NOEVENT\n");
	start_worker(v, 0, "t", 1, 5);
	/* run 2: its own payload's outcome, not run 1's */
	run_dispatch_once(v, "fixed", "echo:second", 30000, out, sizeof(out));
	assert_string_equal(out, "EVENT completed 0 second\n");
	/* run 3: stored and run, though runs 1 and 2 are in the window */
	run_dispatch_once(v, "fixed", "echo:third", 30000, out, sizeof(out));
	assert_string_equal(out, "EVENT completed 0 third\n");
	/* run 1's orphan was run too, under a key of its own */
	assert_true(h_wait_lines(v->log[0], "D ", 3, 30000));
	env_free(v);
}

/*
 * A worker stopped (SIGTERM) while a handler runs, which gives up with an
 * error of its own (-EIO: its command killed) rather than -ECANCELED:
 * the child is handed back and completed by another worker.  The
 * stopping worker once sent that error as the child's outcome.
 */
static void test_stop_hands_back_failed(void **state)
{
	struct env *v = env_new(NULL);
	const char *pl[] = {"stopfail:again"};
	struct fanout_event *ev;

	(void)state;
	assert_int_equal(open_disp(v, NULL, 0), 0);
	start_worker(v, 0, "t", 1, 5);
	dispatch(v, "t", pl, 1, 0);
	assert_true(h_wait_lines(v->log[0], "S ", 1, 30000));
	h_kill_wait(v->w[0], SIGTERM);
	v->w[0] = 0;
	/* the handler saw the stop's interrupt and failed */
	assert_int_equal(h_count_lines(v->log[0], "C "), 1);
	start_worker(v, 1, "t", 1, 5);
	ev = one_event(v, 60000);
	assert_int_equal(ev->results[0].status, FANOUT_COMPLETED);
	assert_string_equal(ev->results[0].summary, "again");
	fanout_event_free(ev);
	assert_int_equal(h_count_lines(v->log[1], "S "), 1);
	env_free(v);
}

/*
 * A message that reaches a busy worker's inbox though it asked for none
 * (in production: published while the server still held the worker's
 * idle request whose wait had just ended here) runs once, on that
 * worker, after its running child.  The test learns the worker's inbox
 * from its pull requests and opens a request on it itself, while the
 * worker (concurrency 1) runs a long child.  The worker once left such a
 * message unread and not kept alive: after AckWait it went to a second
 * worker (delivery 2), and ran here as well once the slot freed.
 */
static void test_busy_inbox_kept(void **state)
{
	struct env *v = env_new(NULL);
	const char *pl1[] = {"sleep:5000:long"}, *pl2[] = {"echo:extra"};
	const char *next = "$JS.API.CONSUMER.MSG.NEXT.FANOUT_T.fanout-worker-t";
	struct fanout_sink *sink = fanout_default_sink(v->e);
	natsConnection *nc = NULL;
	natsSubscription *sub = NULL;
	jsCtx *js = NULL;
	natsMsg *m = NULL;
	char inbox[256], *dot;
	bool long_done = false, extra_done = false;
	long t0;
	int i;

	(void)state;
	assert_int_equal(open_disp(v, NULL, 0), 0);
	js_connect(v, &nc, &js);
	assert_int_equal(natsConnection_SubscribeSync(&sub, nc, next), NATS_OK);
	assert_int_equal(natsConnection_Flush(nc), NATS_OK);
	start_worker(v, 0, "t", 1, 5);
	/* its requests' reply subjects are <inbox>.<seq> */
	assert_int_equal(natsSubscription_NextMsg(&m, sub, 30000), NATS_OK);
	assert_non_null(natsMsg_GetReply(m));
	snprintf(inbox, sizeof(inbox), "%s", natsMsg_GetReply(m));
	natsMsg_Destroy(m);
	natsSubscription_Destroy(sub);
	dot = strrchr(inbox, '.');
	assert_non_null(dot);
	*dot = '\0';
	dispatch(v, "t", pl1, 1, 0);
	assert_true(h_wait_lines(v->log[0], "S ", 1, 30000));
	/* busy now (1 of 1): a request of ours on its inbox, then a child */
	{
		char reply[300];

		snprintf(reply, sizeof(reply), "%s.999999", inbox);
		assert_int_equal(
			natsConnection_PublishRequestString(
				nc, next, reply,
				"{\"batch\":1,\"expires\":60000000000}"),
			NATS_OK);
		assert_int_equal(natsConnection_Flush(nc), NATS_OK);
	}
	dispatch(v, "t", pl2, 1, 0);
	/* delivered (to that inbox: no one else asks) */
	t0 = h_now_ms();
	for (;;) {
		jsConsumerInfo *ci = NULL;
		int pending = -1;

		if (js_GetConsumerInfo(&ci, js, "FANOUT_T", "fanout-worker-t",
				       NULL, NULL) == NATS_OK) {
			pending = (int)ci->NumAckPending;
			jsConsumerInfo_Destroy(ci);
		}
		if (pending == 2)
			break;
		assert_true(h_now_ms() - t0 < 30000);
		h_sleep_ms(10);
	}
	/* a second worker, idle: it must not be given the child */
	start_worker(v, 1, "t", 1, 5);
	for (i = 0; i < 2; i++) {
		struct fanout_event *ev = NULL;

		assert_int_equal(fanout_wait(sink, &ev, 60000), 0);
		assert_int_equal(ev->nresults, 1);
		assert_int_equal(ev->results[0].status, FANOUT_COMPLETED);
		if (!strcmp(ev->results[0].summary, "long"))
			long_done = true;
		else if (!strcmp(ev->results[0].summary, "extra"))
			extra_done = true;
		fanout_event_free(ev);
	}
	assert_true(long_done && extra_done);
	/* both ran on the first worker, once each */
	assert_true(h_wait_lines(v->log[0], "D ", 2, 30000));
	assert_int_equal(h_count_lines(v->log[0], "S "), 2);
	assert_int_equal(h_count_lines(v->log[1], "S "), 0);
	js_disconnect(nc, js);
	env_free(v);
}

/*
 * Helpers for the tests that reach into a worker's inbox: the test learns
 * it from the worker's pull requests (their reply subjects are
 * <inbox>.<seq>) and opens a request on it itself, as a request of the
 * worker's still open at the server would deliver.
 */
#define NEXT_T "$JS.API.CONSUMER.MSG.NEXT.FANOUT_T.fanout-worker-t"
/* AckWait for the tests in which only a hand-back (Nak) may move a
 * child to another worker before the test gives up: 10 minutes. */
#define LONG_ACK_MS 600000

/* Subscribe to kind t's pull requests; before the worker starts. */
static natsSubscription *snoop_pulls(natsConnection *nc)
{
	natsSubscription *sub = NULL;

	assert_int_equal(natsConnection_SubscribeSync(&sub, nc, NEXT_T),
			 NATS_OK);
	assert_int_equal(natsConnection_Flush(nc), NATS_OK);
	return sub;
}

/* The inbox of the (only) worker whose requests @sub sees. */
static void worker_inbox(natsSubscription *sub, char *inbox, size_t cap)
{
	natsMsg *m = NULL;
	char *dot;

	assert_int_equal(natsSubscription_NextMsg(&m, sub, 30000), NATS_OK);
	assert_non_null(natsMsg_GetReply(m));
	assert_true(strlen(natsMsg_GetReply(m)) < cap);
	snprintf(inbox, cap, "%s", natsMsg_GetReply(m));
	natsMsg_Destroy(m);
	natsSubscription_Destroy(sub);
	dot = strrchr(inbox, '.');
	assert_non_null(dot);
	*dot = '\0';
}

/* A pull request for @batch messages on @inbox, open for 60 s. */
static void forge_pull(natsConnection *nc, const char *inbox, int batch)
{
	char reply[300], req[64];

	snprintf(reply, sizeof(reply), "%s.999999", inbox);
	snprintf(req, sizeof(req), "{\"batch\":%d,\"expires\":60000000000}",
		 batch);
	assert_int_equal(
		natsConnection_PublishRequestString(nc, NEXT_T, reply, req),
		NATS_OK);
	assert_int_equal(natsConnection_Flush(nc), NATS_OK);
}

/* Wait until kind t's consumer has @n messages delivered and unacked. */
static void wait_ack_pending(jsCtx *js, int n)
{
	long t0 = h_now_ms();

	for (;;) {
		jsConsumerInfo *ci = NULL;
		int pending = -1;

		if (js_GetConsumerInfo(&ci, js, "FANOUT_T", "fanout-worker-t",
				       NULL, NULL) == NATS_OK) {
			pending = (int)ci->NumAckPending;
			jsConsumerInfo_Destroy(ci);
		}
		if (pending == n)
			return;
		assert_true(h_now_ms() - t0 < 30000);
		h_sleep_ms(10);
	}
}

/* "S <key> <delivery>" lines of @log: how many, each key at most once. */
static int started_once_each(const char *log)
{
	char line[256], keys[64][96];
	FILE *f = fopen(log, "r");
	int n = 0, i;

	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f)) {
		if (strncmp(line, "S ", 2))
			continue;
		assert_true(n < 64);
		assert_int_equal(sscanf(line, "S %95s", keys[n]), 1);
		for (i = 0; i < n; i++)
			assert_string_not_equal(keys[i], keys[n]);
		n++;
	}
	fclose(f);
	return n;
}

/*
 * A busy worker holds at most max_held of the messages that reach its
 * inbox; it hands back the rest at once, and an idle worker runs them.
 * Worker 0 (concurrency 1, max_held 1) runs a long child while a request
 * on its inbox brings it four more; worker 1 starts idle.  The worker
 * once held all four (kept alive with InProgress), so worker 1 got none
 * until worker 0's slot freed: the held list had no bound.
 */
static void test_busy_inbox_overflow(void **state)
{
	struct env *v = env_new(NULL);
	const char *pl1[] = {"sleep:60000:long"};
	const char *pl2[] = {"echo:h0", "echo:h1", "echo:h2", "echo:h3"};
	struct fanout_sink *sink = fanout_default_sink(v->e);
	struct fanout_nats_stats st;
	natsConnection *nc = NULL;
	natsSubscription *sub;
	jsCtx *js = NULL;
	char inbox[256];
	fanout_id long_id, batch_id;
	bool long_seen = false, batch_seen = false;
	int i;

	(void)state;
	assert_int_equal(open_disp(v, NULL, 0), 0);
	js_connect(v, &nc, &js);
	sub = snoop_pulls(nc);
	start_worker_ex(v, 0, "t", 1, 5, LONG_ACK_MS, 1);
	worker_inbox(sub, inbox, sizeof(inbox));
	long_id = dispatch(v, "t", pl1, 1, 0);
	assert_true(h_wait_lines(v->log[0], "S ", 1, 30000));
	/* busy (1 of 1): four children reach its inbox */
	forge_pull(nc, inbox, 4);
	batch_id = dispatch(v, "t", pl2, 4, 0);
	wait_ack_pending(js, 5);
	start_worker_ex(v, 1, "t", 4, 5, LONG_ACK_MS, 0);
	/* the three beyond max_held run on worker 1, while worker 0 is
	 * still busy (AckWait is 10 minutes: only a hand-back moves them) */
	assert_true(h_wait_lines(v->log[1], "D ", 3, 60000));
	assert_int_equal(fanout_cancel(v->e, long_id, FANOUT_CANCEL_INTERRUPT),
			 0);
	for (i = 0; i < 2; i++) {
		struct fanout_event *ev = NULL;

		assert_int_equal(fanout_wait(sink, &ev, 60000), 0);
		if (ev->id == long_id) {
			assert_false(long_seen);
			long_seen = true;
			assert_int_equal(ev->results[0].status,
					 FANOUT_INTERRUPTED);
			assert_int_equal(ev->results[0].code, -ECANCELED);
		} else {
			assert_true(ev->id == batch_id);
			assert_false(batch_seen);
			batch_seen = true;
			assert_int_equal(ev->ncompleted, 4);
			assert_string_equal(ev->results[0].summary, "h0");
			assert_string_equal(ev->results[3].summary, "h3");
		}
		fanout_event_free(ev);
	}
	{
		struct fanout_event *ev = NULL;

		assert_int_equal(fanout_wait(sink, &ev, 200), -ETIMEDOUT);
	}
	/* the one held ran on worker 0 after the long one (which, cancelled,
	 * logs no "D"); each child once */
	assert_true(h_wait_lines(v->log[0], "D ", 1, 30000));
	assert_int_equal(started_once_each(v->log[0]), 2);
	assert_int_equal(started_once_each(v->log[1]), 3);
	fanout_nats_stats(v->n, &st);
	assert_int_equal(st.results, 5);
	assert_int_equal(st.duplicates, 0);
	js_disconnect(nc, js);
	env_free(v);
}

/*
 * A busy worker stopped hands back what it holds (Nak) at once, not
 * after AckWait: a second worker runs each held child once, and each
 * delegation has one event.  AckWait is 10 minutes, so nothing but the
 * hand-back can bring them to worker 1 before the test gives up.
 */
static void test_stop_naks_held(void **state)
{
	struct env *v = env_new(NULL);
	const char *pl_long[] = {"stopfail:long"};
	const char *pl[3][1] = {{"echo:b1"}, {"echo:b2"}, {"echo:b3"}};
	static const char *const want[4] = {"long", "b1", "b2", "b3"};
	struct fanout_sink *sink = fanout_default_sink(v->e);
	struct fanout_nats_stats st;
	natsConnection *nc = NULL;
	natsSubscription *sub;
	jsCtx *js = NULL;
	char inbox[256];
	fanout_id ids[4];
	bool seen[4] = {false};
	int i, k;

	(void)state;
	assert_int_equal(open_disp(v, NULL, 0), 0);
	js_connect(v, &nc, &js);
	sub = snoop_pulls(nc);
	start_worker_ex(v, 0, "t", 1, 5, LONG_ACK_MS, 8);
	worker_inbox(sub, inbox, sizeof(inbox));
	ids[0] = dispatch(v, "t", pl_long, 1, 0);
	assert_true(h_wait_lines(v->log[0], "S ", 1, 30000));
	/* busy: three children, one delegation each, reach its inbox */
	forge_pull(nc, inbox, 3);
	for (i = 0; i < 3; i++)
		ids[i + 1] = dispatch(v, "t", pl[i], 1, 0);
	wait_ack_pending(js, 4);
	start_worker_ex(v, 1, "t", 4, 5, LONG_ACK_MS, 0);
	h_kill_wait(v->w[0], SIGTERM);
	v->w[0] = 0;
	for (i = 0; i < 4; i++) {
		struct fanout_event *ev = NULL;

		assert_int_equal(fanout_wait(sink, &ev, 60000), 0);
		for (k = 0; k < 4 && ids[k] != ev->id; k++)
			;
		assert_true(k < 4);
		assert_false(seen[k]);
		seen[k] = true;
		assert_int_equal(ev->results[0].status, FANOUT_COMPLETED);
		assert_string_equal(ev->results[0].summary, want[k]);
		fanout_event_free(ev);
	}
	{
		struct fanout_event *ev = NULL;

		assert_int_equal(fanout_wait(sink, &ev, 200), -ETIMEDOUT);
	}
	/* worker 0 ran only the long one; worker 1 each of the four once */
	assert_int_equal(started_once_each(v->log[0]), 1);
	assert_int_equal(started_once_each(v->log[1]), 4);
	fanout_nats_stats(v->n, &st);
	assert_int_equal(st.results, 4);
	assert_int_equal(st.duplicates, 0);
	js_disconnect(nc, js);
	env_free(v);
}

/*
 * A child that reaches a worker's inbox while it is stopping (after its
 * first look there: a request of its own still open at the server) is
 * handed back too.  Worker 0's handler is slow to stop; the child comes
 * meanwhile, through a request on its inbox.  The worker once read its
 * inbox only at the start of the stop: the child stayed with it, unread,
 * and another worker got it only after AckWait (10 minutes here).
 */
static void test_stop_naks_late(void **state)
{
	struct env *v = env_new(NULL);
	const char *pl_x[] = {"echo:x"};
	char lingerpl[PATH_MAX + 64], release[PATH_MAX + 16];
	const char *pl_long[] = {lingerpl};
	struct fanout_sink *sink = fanout_default_sink(v->e);
	natsConnection *nc = NULL;
	natsSubscription *sub;
	jsCtx *js = NULL;
	char inbox[256];
	fanout_id ids[2];
	bool seen[2] = {false};
	int i, k, stt;
	FILE *f;

	(void)state;
	snprintf(release, sizeof(release), "%s/release", v->srv.dir);
	snprintf(lingerpl, sizeof(lingerpl), "linger:%s:long", release);
	assert_int_equal(open_disp(v, NULL, 0), 0);
	js_connect(v, &nc, &js);
	sub = snoop_pulls(nc);
	start_worker_ex(v, 0, "t", 1, 5, LONG_ACK_MS, 0);
	worker_inbox(sub, inbox, sizeof(inbox));
	ids[0] = dispatch(v, "t", pl_long, 1, 0);
	assert_true(h_wait_lines(v->log[0], "S ", 1, 30000));
	forge_pull(nc, inbox, 1);
	/* stopping: its running handler saw the interrupt, lingers */
	kill(v->w[0], SIGTERM);
	assert_true(h_wait_lines(v->log[0], "C ", 1, 30000));
	ids[1] = dispatch(v, "t", pl_x, 1, 0);
	wait_ack_pending(js, 2);
	start_worker_ex(v, 1, "t", 2, 5, LONG_ACK_MS, 0);
	f = fopen(release, "w");
	assert_non_null(f);
	fclose(f);
	assert_int_equal(waitpid(v->w[0], &stt, 0), v->w[0]);
	v->w[0] = 0;
	for (i = 0; i < 2; i++) {
		struct fanout_event *ev = NULL;

		assert_int_equal(fanout_wait(sink, &ev, 60000), 0);
		for (k = 0; k < 2 && ids[k] != ev->id; k++)
			;
		assert_true(k < 2);
		assert_false(seen[k]);
		seen[k] = true;
		assert_int_equal(ev->results[0].status, FANOUT_COMPLETED);
		assert_string_equal(ev->results[0].summary,
				    k == 0 ? "long" : "x");
		fanout_event_free(ev);
	}
	{
		struct fanout_event *ev = NULL;

		assert_int_equal(fanout_wait(sink, &ev, 200), -ETIMEDOUT);
	}
	assert_int_equal(started_once_each(v->log[0]), 1);
	assert_int_equal(started_once_each(v->log[1]), 2);
	js_disconnect(nc, js);
	env_free(v);
}

/*
 * A stopping worker keeps its children alive (InProgress) while it waits
 * for them: one whose handler is slow to stop is not redelivered to
 * another worker while it still runs here.  AckWait is 1 s; worker 0's
 * handler saw the stop's interrupt and lingers until the test releases
 * it, three AckWaits later.  The worker sent no keep-alive once stopping:
 * worker 1 got the child (delivery 2) after 1 s and ran it while worker
 * 0 still did; its outcome was the event.  Now worker 1 gets it only
 * from worker 0's hand-back, after the release.
 */
static void test_stop_keeps_alive(void **state)
{
	struct env *v = env_new(NULL);
	char lingerpl[PATH_MAX + 64], release[PATH_MAX + 16];
	const char *pl[] = {lingerpl};
	struct fanout_event *ev;
	struct fanout_nats_stats st;
	int stt;
	FILE *f;

	(void)state;
	snprintf(release, sizeof(release), "%s/release", v->srv.dir);
	snprintf(lingerpl, sizeof(lingerpl), "linger:%s:long", release);
	assert_int_equal(open_disp(v, NULL, 0), 0);
	start_worker_ex(v, 0, "t", 1, 5, 1000, 0);
	dispatch(v, "t", pl, 1, 0);
	assert_true(h_wait_lines(v->log[0], "S ", 1, 30000));
	start_worker_ex(v, 1, "t", 1, 5, 1000, 0);
	kill(v->w[0], SIGTERM);
	assert_true(h_wait_lines(v->log[0], "C ", 1, 30000));
	/* three AckWaits with worker 0 stopping, its handler running */
	h_sleep_ms(3000);
	assert_int_equal(h_count_lines(v->log[1], "S "), 0);
	f = fopen(release, "w");
	assert_non_null(f);
	fclose(f);
	assert_int_equal(waitpid(v->w[0], &stt, 0), v->w[0]);
	v->w[0] = 0;
	assert_true(WIFEXITED(stt) && WEXITSTATUS(stt) == 0);
	ev = one_event(v, 60000);
	assert_int_equal(ev->results[0].status, FANOUT_COMPLETED);
	assert_string_equal(ev->results[0].summary, "long");
	fanout_event_free(ev);
	assert_int_equal(h_count_lines(v->log[1], "S "), 1);
	fanout_nats_stats(v->n, &st);
	assert_int_equal(st.results, 1);
	assert_int_equal(st.duplicates, 0);
	env_free(v);
}

/*
 * A worker started with options other than those the kind's consumer was
 * created with (here the default AckWait, 30 s, against 1 s) serves the
 * consumer as it is, and keeps its running children alive within the
 * consumer's AckWait.  libnats refused the binding (configuration
 * mismatch), and the worker exited with -EPROTO; had it bound, its
 * keep-alive (every 10 s, from its own option) would have let a child
 * running 3 s be redelivered to another worker after 1 s.
 */
static void test_worker_other_options(void **state)
{
	struct env *v = env_new(NULL);
	const char *pl[] = {"sleep:3000:slow"};
	struct fanout_event *ev;
	jsCtx *js = NULL;
	natsConnection *nc = NULL;
	long t0;

	(void)state;
	assert_int_equal(open_disp(v, NULL, 0), 0);
	js_connect(v, &nc, &js);
	/* worker 0 creates the consumer (AckWait 1 s) and stops */
	start_worker(v, 0, "t", 1, 5);
	t0 = h_now_ms();
	for (;;) {
		jsConsumerInfo *ci = NULL;

		if (js_GetConsumerInfo(&ci, js, "FANOUT_T", "fanout-worker-t",
				       NULL, NULL) == NATS_OK) {
			jsConsumerInfo_Destroy(ci);
			break;
		}
		assert_true(h_now_ms() - t0 < 30000);
		h_sleep_ms(10);
	}
	h_kill_wait(v->w[0], SIGTERM);
	v->w[0] = 0;
	/* two workers with every option at its default */
	start_worker_ex(v, 1, "t", 1, 0, 0, 0);
	start_worker_ex(v, 2, "t", 1, 0, 0, 0);
	dispatch(v, "t", pl, 1, 0);
	ev = one_event(v, 60000);
	assert_int_equal(ev->results[0].status, FANOUT_COMPLETED);
	assert_string_equal(ev->results[0].summary, "slow");
	fanout_event_free(ev);
	/* run once: not redelivered while it ran */
	assert_int_equal(h_count_lines(v->log[1], "S ") +
				 h_count_lines(v->log[2], "S "),
			 1);
	js_disconnect(nc, js);
	env_free(v);
}

/*
 * A work message that is not a dispatcher's (its Fanout-Reply is not a
 * result subject) is refused unrun (Term).  The worker once ran it and
 * then retried publishing its outcome to a subject no stream stores,
 * for ever, and ran it again at each redelivery.  The worker
 * (concurrency 1) takes the stream in order: the bad message first, then
 * a dispatcher's child.
 */
static void test_foreign_work_refused(void **state)
{
	struct env *v = env_new(NULL);
	const char *pl[] = {"echo:good"};
	struct fanout_event *ev;
	natsConnection *nc = NULL;
	jsCtx *js = NULL;
	natsMsg *m = NULL;
	jsPubAck *pa = NULL;

	(void)state;
	assert_int_equal(open_disp(v, NULL, 0), 0); /* makes the streams */
	js_connect(v, &nc, &js);
	assert_int_equal(
		natsMsg_Create(&m, "fanout.work.t", NULL, "echo:bad", 8),
		NATS_OK);
	natsMsgHeader_Set(m, "Fanout-Key", "other.0000000000000000.1");
	natsMsgHeader_Set(m, "Fanout-Reply", "nowhere.x");
	assert_int_equal(js_PublishMsg(&pa, js, m, NULL, NULL), NATS_OK);
	jsPubAck_Destroy(pa);
	natsMsg_Destroy(m);
	start_worker(v, 0, "t", 1, 5);
	dispatch(v, "t", pl, 1, 0);
	ev = one_event(v, 60000);
	assert_string_equal(ev->results[0].summary, "good");
	fanout_event_free(ev);
	/* the good child alone ran */
	assert_int_equal(h_count_lines(v->log[0], "S "), 1);
	js_disconnect(nc, js);
	env_free(v);
}

/*
 * A handler's outcome too big for the server (a 2 MB summary; the
 * server's max_payload is 1 MiB): the child ends FANOUT_ERROR -EMSGSIZE
 * saying so, after one run.  The worker once retried publishing it for
 * ever, left its message unkept, so it was redelivered and run again
 * until MaxDeliver, and the event said "exhausted MaxDeliver".
 */
static void test_outcome_too_big(void **state)
{
	struct env *v = env_new(NULL);
	const char *pl[] = {"big:2000000", "echo:small"};
	struct fanout_event *ev;

	(void)state;
	assert_int_equal(open_disp(v, NULL, 0), 0);
	start_worker(v, 0, "t", 1, 3);
	dispatch(v, "t", pl, 2, 0);
	ev = one_event(v, 60000);
	assert_int_equal(ev->results[0].status, FANOUT_ERROR);
	assert_int_equal(ev->results[0].code, -EMSGSIZE);
	assert_non_null(strstr(ev->results[0].error, "max_payload"));
	assert_int_equal(ev->results[1].status, FANOUT_COMPLETED);
	assert_string_equal(ev->results[1].summary, "small");
	fanout_event_free(ev);
	assert_true(h_wait_lines(v->log[0], "D ", 2, 30000));
	assert_int_equal(h_count_lines(v->log[0], "S "), 2);
	env_free(v);
}

/*
 * A child whose outcome cannot be stored yet (the results stream is gone:
 * every publish fails) stays with the worker that ran it, kept alive
 * while the worker retries: it does not run again.  The worker kept
 * only running and held children alive; a child whose outcome it was
 * publishing was redelivered after AckWait (1 s here) and ran again
 * (delivery 2) on it or another.  No outcome can arrive here; the test
 * looks for a second run during three AckWaits.
 */
/* Wait up to @ms for a line starting @prefix in worker 0's or 1's log. */
static bool wait_lines_either(struct env *v, const char *prefix, long ms)
{
	long t0 = h_now_ms();

	while (h_count_lines(v->log[0], prefix) +
		       h_count_lines(v->log[1], prefix) <
	       1) {
		if (h_now_ms() - t0 > ms)
			return false;
		h_sleep_ms(10);
	}
	return true;
}

static void test_publishing_kept_alive(void **state)
{
	struct env *v = env_new(NULL);
	const char *pl[] = {"sleep:500:a"};
	natsConnection *nc = NULL;
	jsCtx *js = NULL;
	struct fanout_event *ev = NULL;

	(void)state;
	assert_int_equal(open_disp(v, NULL, 0), 0);
	js_connect(v, &nc, &js);
	start_worker(v, 0, "t", 1, 5);
	start_worker(v, 1, "t", 1, 5);
	dispatch(v, "t", pl, 1, 0);
	assert_true(wait_lines_either(v, "S ", 30000));
	assert_int_equal(js_DeleteStream(js, "FANOUT_RESULTS", NULL, NULL),
			 NATS_OK);
	/* the handler returned; its outcome cannot be stored */
	assert_true(wait_lines_either(v, "D ", 30000));
	assert_int_equal(fanout_wait(fanout_default_sink(v->e), &ev, 3000),
			 -ETIMEDOUT);
	assert_int_equal(h_count_lines(v->log[0], "S ") +
				 h_count_lines(v->log[1], "S "),
			 1);
	js_disconnect(nc, js);
	env_free(v);
}

/*
 * FANOUT_RESULTS made to store nothing (@on false: its subject moved
 * elsewhere, so an outcome publish finds no responder, as with the
 * stream gone) and back (@on true).  The stream and the dispatcher's
 * consumer stay, so the dispatcher reads on once it is back.
 */
static void results_stream(jsCtx *js, bool on)
{
	jsStreamInfo *si = NULL;
	const char *subj[1] = {on ? "fanout.result.>" : "fanout.parked.>"};
	jsStreamInfo *out = NULL;
	jsErrCode jerr = 0;
	const char **own;
	int nown;

	assert_int_equal(
		js_GetStreamInfo(&si, js, "FANOUT_RESULTS", NULL, NULL),
		NATS_OK);
	/* ours only for the update: the info's own are freed with it */
	own = si->Config->Subjects;
	nown = si->Config->SubjectsLen;
	si->Config->Subjects = subj;
	si->Config->SubjectsLen = 1;
	assert_int_equal(js_UpdateStream(&out, js, si->Config, NULL, &jerr),
			 NATS_OK);
	si->Config->Subjects = own;
	si->Config->SubjectsLen = nown;
	jsStreamInfo_Destroy(out);
	jsStreamInfo_Destroy(si);
}

/* An in-process worker: fanout_nats_serve() on a thread. */
struct inproc {
	struct fanout_nats_serve_opts o;
	volatile sig_atomic_t stop;
	pthread_t th;
	int rc;
};

static void *inproc_main(void *arg)
{
	struct inproc *w = arg;

	w->rc = fanout_nats_serve(&w->o);
	return NULL;
}

static int echo_handler(struct fanout_child *c, void *arg)
{
	const struct fanout_nats_job *job = arg;

	fanout_set_summary(c, job->payload, job->len);
	return 0;
}

static atomic_bool blocker_go;

static int blocker(struct fanout_child *c, void *arg)
{
	(void)c;
	(void)arg;
	while (!atomic_load(&blocker_go))
		h_sleep_ms(5);
	return 0;
}

/*
 * A worker on an engine of the caller's that refuses its dispatch
 * (-EBUSY: max_async 1, taken by the caller's own delegation) keeps the
 * child, kept alive, until the engine has room, then runs it.  It once
 * handed it back (Nak) at once, to its own open request: every round
 * trip a delivery, MaxDeliver (2 here) exhausted in milliseconds, and
 * the child ERROR "exhausted MaxDeliver" though it never ran.  AckWait
 * is 10 minutes, so nothing but a Nak could move the child: no event may
 * come while the engine is full.
 */
static void test_worker_engine_full(void **state)
{
	struct env *v = env_new(NULL);
	struct fanout_config cfg = {
		.flags = FANOUT_NO_PIN, .workers = 1, .max_async = 1};
	struct fanout_task bt = {.fn = blocker};
	struct fanout_batch bb = {.tasks = &bt, .ntasks = 1};
	struct fanout_engine *we = NULL;
	struct fanout_sink *wsink = NULL;
	const char *pl[] = {"held"};
	struct inproc w = {0};
	struct fanout_event *ev = NULL;
	natsConnection *nc = NULL;
	jsCtx *js = NULL;
	long t0;

	(void)state;
	atomic_store(&blocker_go, false);
	assert_int_equal(open_disp(v, NULL, 0), 0);
	js_connect(v, &nc, &js);
	assert_int_equal(fanout_create(&cfg, &we), 0);
	assert_int_equal(fanout_sink_create(we, &wsink), 0);
	bb.sink = wsink;
	assert_int_equal(fanout_dispatch(we, &bb, NULL), 0);
	w.o = (struct fanout_nats_serve_opts){.url = v->srv.url,
					      .kind = "t",
					      .handler = echo_handler,
					      .engine = we,
					      .concurrency = 1,
					      .ack_wait_ms = LONG_ACK_MS,
					      .max_deliver = 2,
					      .stop = &w.stop};
	assert_int_equal(pthread_create(&w.th, NULL, inproc_main, &w), 0);
	dispatch(v, "t", pl, 1, 0);
	/* delivered to the worker */
	t0 = h_now_ms();
	for (;;) {
		jsConsumerInfo *ci = NULL;
		uint64_t delivered = 0;

		if (js_GetConsumerInfo(&ci, js, "FANOUT_T", "fanout-worker-t",
				       NULL, NULL) == NATS_OK) {
			delivered = ci->Delivered.Consumer;
			jsConsumerInfo_Destroy(ci);
		}
		if (delivered >= 1)
			break;
		assert_true(h_now_ms() - t0 < 30000);
		h_sleep_ms(10);
	}
	/* nothing can finish it while the engine is full */
	assert_int_equal(fanout_wait(fanout_default_sink(v->e), &ev, 3000),
			 -ETIMEDOUT);
	atomic_store(&blocker_go, true);
	ev = one_event(v, 60000);
	assert_int_equal(ev->results[0].status, FANOUT_COMPLETED);
	assert_string_equal(ev->results[0].summary, "held");
	fanout_event_free(ev);
	__atomic_store_n(&w.stop, 1, __ATOMIC_RELAXED);
	pthread_join(w.th, NULL);
	assert_int_equal(w.rc, 0);
	assert_int_equal(fanout_wait(wsink, &ev, 60000), 0); /* blocker's */
	fanout_event_free(ev);
	fanout_shutdown(we);
	fanout_destroy(we);
	js_disconnect(nc, js);
	env_free(v);
}

static int never_called(struct fanout_child *c, void *arg)
{
	(void)c;
	(void)arg;
	return -EINVAL;
}

/* Bad input: a clear error and nothing accepted half-way. */
static void test_bad_input(void **state)
{
	struct env *v = env_new(NULL);
	static const char *const badk[] = {"Bad.Kind"};
	struct fanout_nats_opts o = {.kinds = badk, .nkinds = 1};
	struct fanout_nats *n2 = NULL;
	struct fanout_task t[2];
	struct fanout_nats_stats st;
	struct fanout_stats es;
	char url[64];
	char *big;
	long t0;
	int err;

	(void)state;
	/* server unreachable at open */
	snprintf(url, sizeof(url), "nats://127.0.0.1:%d", h_free_port());
	assert_int_equal(open_disp(v, url, 0), -ECONNREFUSED);
	assert_null(v->n);
	/* a URL libnats cannot parse: once -ECONNREFUSED, as if no server
	 * listened there */
	assert_int_equal(open_disp(v, "nats://127.0.0.1:abc", 0), -EINVAL);
	assert_int_equal(open_disp(v, "", 0), -EINVAL);
	/* blank: libnats 3.4.1 corrupted the heap (the process aborted) */
	assert_int_equal(open_disp(v, " ", 0), -EINVAL);
	assert_null(v->n);
	assert_int_equal(fanout_nats_open(v->srv.url, &o, &n2), -EINVAL);
	assert_int_equal(fanout_nats_open(v->srv.url, NULL, &n2), -EINVAL);
	assert_null(n2);
	/* negative times: once taken as the defaults */
	{
		static const char *const okk[] = {"t"};
		struct fanout_nats_opts neg = {
			.kinds = okk, .nkinds = 1, .publish_retry_ms = -1};

		assert_int_equal(fanout_nats_open(v->srv.url, &neg, &n2),
				 -EINVAL);
		neg.publish_retry_ms = 0;
		neg.connect_timeout_ms = -1;
		assert_int_equal(fanout_nats_open(v->srv.url, &neg, &n2),
				 -EINVAL);
		assert_null(n2);
	}
	{
		struct fanout_nats_serve_opts so = {.url = v->srv.url,
						    .kind = "t"};

		assert_int_equal(fanout_nats_serve(NULL), -EINVAL);
		assert_int_equal(fanout_nats_serve(&so), -EINVAL); /* handler */
		so.handler = never_called;
		so.kind = "Bad Kind";
		assert_int_equal(fanout_nats_serve(&so), -EINVAL);
		/* options that cannot work: negative, or a keep-alive no
		 * sooner than AckWait (every child that runs longer would be
		 * redelivered while it runs).  Stop already asked: the old
		 * code took them, served and returned 0 */
		{
			static volatile sig_atomic_t stopped = 1;

			so.kind = "t";
			so.stop = &stopped;
			so.ack_wait_ms = -1;
			assert_int_equal(fanout_nats_serve(&so), -EINVAL);
			so.ack_wait_ms = 0;
			so.max_deliver = -2;
			assert_int_equal(fanout_nats_serve(&so), -EINVAL);
			so.max_deliver = 0;
			so.progress_ms = -5;
			assert_int_equal(fanout_nats_serve(&so), -EINVAL);
			so.ack_wait_ms = 1000;
			so.progress_ms = 1000;
			assert_int_equal(fanout_nats_serve(&so), -EINVAL);
			so.ack_wait_ms = 0; /* default 30000 */
			so.progress_ms = 30000;
			assert_int_equal(fanout_nats_serve(&so), -EINVAL);
			so.progress_ms = 0;
			so.url = "nats://127.0.0.1:abc";
			assert_int_equal(fanout_nats_serve(&so), -EINVAL);
			so.url = "\t";
			assert_int_equal(fanout_nats_serve(&so), -EINVAL);
			so.url = v->srv.url;
		}
	}
	assert_int_equal(open_disp(v, NULL, 0), 0);
	/* unknown kind, oversized payload, NULL payload */
	assert_int_equal(fanout_nats_task(v->n, "nope", "a", 1, NULL, &t[0]),
			 -ENOENT);
	big = calloc(1, 2 << 20);
	assert_non_null(big);
	assert_int_equal(fanout_nats_task(v->n, "t", big, 2 << 20, NULL, &t[0]),
			 -EMSGSIZE);
	free(big);
	/* a length whose sum with the header room wraps: once passed the
	 * size check, then failed -ENOMEM (or, wrapping the record's size
	 * too, copied far past the payload) */
	assert_int_equal(
		fanout_nats_task(v->n, "t", "x", SIZE_MAX - 100, NULL, &t[0]),
		-EMSGSIZE);
	assert_int_equal(fanout_nats_task(v->n, "t", NULL, 3, NULL, &t[0]),
			 -EINVAL);
	/* a batch whose second child is refused is not dispatched at all */
	assert_int_equal(fanout_nats_task(v->n, "t", "noop", 4, NULL, &t[0]),
			 0);
	assert_int_equal(fanout_nats_task(v->n, "zz", "noop", 4, NULL, &t[1]),
			 -ENOENT);
	fanout_nats_task_discard(&t[0]);
	/* server unreachable at dispatch */
	nats_srv_kill(&v->srv, SIGTERM);
	t0 = h_now_ms();
	while ((err = fanout_nats_task(v->n, "t", "noop", 4, NULL, &t[0])) ==
	       0) {
		fanout_nats_task_discard(&t[0]);
		assert_true(h_now_ms() - t0 < 10000);
		h_sleep_ms(10);
	}
	assert_int_equal(err, -ENOTCONN);
	fanout_nats_stats(v->n, &st);
	assert_int_equal(st.published, 0);
	assert_int_equal(st.in_flight, 0);
	fanout_stats(v->e, &es);
	assert_int_equal(es.dispatched, 0);
	assert_int_equal(nats_srv_run(&v->srv), 0);
	env_free(v);
}

/* Accepted, then the server vanishes for good: the child still ends, as
 * ERROR saying why, in the one event. */
static void test_publish_fails_after_accept(void **state)
{
	struct env *v = env_new(NULL);
	const char *pl[] = {"noop"};
	struct fanout_task t;
	struct fanout_batch b = {.tasks = &t, .ntasks = 1};
	struct fanout_event *ev;

	(void)state;
	assert_int_equal(open_disp(v, NULL, 300), 0);
	assert_int_equal(fanout_nats_task(v->n, "t", pl[0], 4, NULL, &t), 0);
	nats_srv_kill(&v->srv, SIGKILL);
	assert_int_equal(fanout_dispatch(v->e, &b, NULL), 0);
	ev = one_event(v, 60000);
	assert_int_equal(ev->results[0].status, FANOUT_ERROR);
	assert_non_null(
		strstr(ev->results[0].error, "publishing to JetStream failed"));
	fanout_event_free(ev);
	fanout_shutdown(v->e);
	fanout_nats_close(v->n);
	v->n = NULL;
	env_free(v);
}

/*
 * An outcome whose publish keeps failing (the results stream stores
 * nothing for a while: no responder) is sent again with a growing wait,
 * not on every pass of the worker's loop, and lands once, from the one
 * run, when the stream is back.  The worker's stats count the attempts
 * over a window of at least 4 s, four AckWaits: with the documented
 * backoff (100 ms doubling to 2 s) at most 6 + window / 2 s of them.
 * The worker sent it again on every pass of its loop (every 100 ms or
 * less): dozens in 4 s.
 */
static void test_outcome_retry_backoff(void **state)
{
	struct env *v = env_new(NULL);
	const char *pl[] = {"late"};
	struct fanout_nats_serve_stats wst = {0};
	struct inproc w = {0};
	natsConnection *nc = NULL;
	jsCtx *js = NULL;
	struct fanout_event *ev;
	struct fanout_nats_stats st;
	long t0, window;
	uint64_t attempts, retries;

	(void)state;
	assert_int_equal(open_disp(v, NULL, 0), 0);
	js_connect(v, &nc, &js);
	results_stream(js, false);
	t0 = h_now_ms();
	w.o = (struct fanout_nats_serve_opts){.url = v->srv.url,
					      .kind = "t",
					      .handler = echo_handler,
					      .concurrency = 1,
					      .ack_wait_ms = 1000,
					      .stop = &w.stop,
					      .stats = &wst};
	assert_int_equal(pthread_create(&w.th, NULL, inproc_main, &w), 0);
	dispatch(v, "t", pl, 1, 0);
	/* the first attempt failed */
	while (__atomic_load_n(&wst.outcome_retries, __ATOMIC_RELAXED) < 1) {
		assert_true(h_now_ms() - t0 < 30000);
		h_sleep_ms(10);
	}
	h_sleep_ms(4000);
	attempts = __atomic_load_n(&wst.outcome_publishes, __ATOMIC_RELAXED);
	retries = __atomic_load_n(&wst.outcome_retries, __ATOMIC_RELAXED);
	window = h_now_ms() - t0;
	assert_true(retries + 1 == attempts);
	assert_true(attempts <= (uint64_t)(6 + window / 2000));
	results_stream(js, true);
	ev = one_event(v, 60000);
	assert_int_equal(ev->results[0].status, FANOUT_COMPLETED);
	assert_string_equal(ev->results[0].summary, "late");
	assert_int_equal(ev->results[0].code, 0);
	fanout_event_free(ev);
	__atomic_store_n(&w.stop, 1, __ATOMIC_RELAXED);
	assert_int_equal(pthread_join(w.th, NULL), 0);
	assert_int_equal(w.rc, 0);
	/* ran once: kept alive meanwhile (AckWait 1 s), not redelivered */
	{
		jsConsumerInfo *ci = NULL;

		assert_int_equal(js_GetConsumerInfo(&ci, js, "FANOUT_T",
						    "fanout-worker-t", NULL,
						    NULL),
				 NATS_OK);
		assert_int_equal(ci->Delivered.Consumer, 1);
		assert_int_equal(ci->NumAckPending, 0);
		jsConsumerInfo_Destroy(ci);
	}
	fanout_nats_stats(v->n, &st);
	assert_int_equal(st.results, 1);
	assert_int_equal(st.duplicates, 0);
	assert_int_equal(st.redelivered, 0);
	js_disconnect(nc, js);
	env_free(v);
}

/*
 * Once an outcome whose publish failed and was retried is stored and its
 * child acked, nothing is left for a stop to wait for: the worker's
 * outcomes_unsettled (what its stop waits on) is back to 0.  It counted
 * every retry as one more outcome in flight and never took it back, so
 * after one retry it stayed above 0 for good and every later stop waited
 * out its full 3 s bound.  Not timed: the count is the state the stop
 * polls.
 */
static void test_unsettled_after_retry(void **state)
{
	struct env *v = env_new(NULL);
	const char *pl[] = {"settled"};
	struct fanout_nats_serve_stats wst = {0};
	struct inproc w = {0};
	natsConnection *nc = NULL;
	jsCtx *js = NULL;
	struct fanout_event *ev;
	struct fanout_nats_stats st;
	long t0;

	(void)state;
	assert_int_equal(open_disp(v, NULL, 0), 0);
	js_connect(v, &nc, &js);
	results_stream(js, false);
	w.o = (struct fanout_nats_serve_opts){.url = v->srv.url,
					      .kind = "t",
					      .handler = echo_handler,
					      .concurrency = 1,
					      .ack_wait_ms = LONG_ACK_MS,
					      .stop = &w.stop,
					      .stats = &wst};
	assert_int_equal(pthread_create(&w.th, NULL, inproc_main, &w), 0);
	dispatch(v, "t", pl, 1, 0);
	t0 = h_now_ms();
	while (__atomic_load_n(&wst.outcome_retries, __ATOMIC_RELAXED) < 2) {
		assert_true(h_now_ms() - t0 < 30000);
		h_sleep_ms(10);
	}
	assert_int_equal(
		__atomic_load_n(&wst.outcomes_unsettled, __ATOMIC_RELAXED), 1);
	results_stream(js, true);
	ev = one_event(v, 60000);
	assert_int_equal(ev->results[0].status, FANOUT_COMPLETED);
	assert_string_equal(ev->results[0].summary, "settled");
	fanout_event_free(ev);
	/* stored (the event came) and acked: nothing unsettled */
	t0 = h_now_ms();
	while (__atomic_load_n(&wst.outcomes_unsettled, __ATOMIC_RELAXED)) {
		assert_true(h_now_ms() - t0 < 30000);
		h_sleep_ms(10);
	}
	__atomic_store_n(&w.stop, 1, __ATOMIC_RELAXED);
	assert_int_equal(pthread_join(w.th, NULL), 0);
	assert_int_equal(w.rc, 0);
	{
		jsConsumerInfo *ci = NULL;

		assert_int_equal(js_GetConsumerInfo(&ci, js, "FANOUT_T",
						    "fanout-worker-t", NULL,
						    NULL),
				 NATS_OK);
		assert_int_equal(ci->Delivered.Consumer, 1);
		assert_int_equal(ci->NumAckPending, 0);
		jsConsumerInfo_Destroy(ci);
	}
	fanout_nats_stats(v->n, &st);
	assert_int_equal(st.results, 1);
	assert_int_equal(st.duplicates, 0);
	js_disconnect(nc, js);
	env_free(v);
}

/* Stream @name made to store @subj (nothing a dispatcher publishes, or
 * its own subject back), as results_stream() does for FANOUT_RESULTS. */
static void stream_subject(jsCtx *js, const char *name, const char *subj)
{
	jsStreamInfo *si = NULL, *out = NULL;
	const char *subjs[1] = {subj};
	jsErrCode jerr = 0;
	const char **own;
	int nown;

	assert_int_equal(js_GetStreamInfo(&si, js, name, NULL, NULL), NATS_OK);
	own = si->Config->Subjects;
	nown = si->Config->SubjectsLen;
	si->Config->Subjects = subjs;
	si->Config->SubjectsLen = 1;
	assert_int_equal(js_UpdateStream(&out, js, si->Config, NULL, &jerr),
			 NATS_OK);
	si->Config->Subjects = own;
	si->Config->SubjectsLen = nown;
	jsStreamInfo_Destroy(out);
	jsStreamInfo_Destroy(si);
}

/*
 * A child whose publish keeps failing (its kind's stream stores nothing
 * for a while: no responder) is published again with a growing wait, as
 * a worker's outcome is, and is stored once when the stream is back.
 * Over a window of at least 4 s, with a wait of 100 ms doubling to 2 s,
 * at most 6 + window / 2 s attempts.  The dispatcher's thread published
 * it again on every pass of its loop (every 20 ms or less): about 200 in
 * 4 s, for each such child, to a server that had lost a stream.
 */
static void test_publish_retry_backoff(void **state)
{
	struct env *v = env_new(NULL);
	const char *pl[] = {"echo:back"};
	natsConnection *nc = NULL;
	jsCtx *js = NULL;
	struct fanout_event *ev;
	struct fanout_nats_stats st;
	long t0, window;

	(void)state;
	assert_int_equal(open_disp(v, NULL, 0), 0);
	js_connect(v, &nc, &js);
	stream_subject(js, "FANOUT_T", "fanout.parked.t");
	t0 = h_now_ms();
	dispatch(v, "t", pl, 1, 0);
	do {
		assert_true(h_now_ms() - t0 < 30000);
		h_sleep_ms(10);
		fanout_nats_stats(v->n, &st);
	} while (st.republished < 1);
	h_sleep_ms(4000);
	fanout_nats_stats(v->n, &st);
	window = h_now_ms() - t0;
	assert_int_equal(st.published, 0);
	assert_true(st.republished <= (uint64_t)(6 + window / 2000));
	stream_subject(js, "FANOUT_T", "fanout.work.t");
	start_worker(v, 0, "t", 1, 5);
	ev = one_event(v, 60000);
	assert_int_equal(ev->results[0].status, FANOUT_COMPLETED);
	assert_string_equal(ev->results[0].summary, "back");
	fanout_event_free(ev);
	fanout_nats_stats(v->n, &st);
	assert_int_equal(st.published, 1);
	assert_int_equal(st.results, 1);
	assert_int_equal(st.publish_failed, 0);
	assert_int_equal(h_count_lines(v->log[0], "S "), 1);
	js_disconnect(nc, js);
	env_free(v);
}

/*
 * A child whose publish kept failing (its kind's stream storing nothing)
 * and whose delegation ended meanwhile (its deadline) is not published
 * when the stream is back: nobody waits for its outcome.  The dispatcher
 * published it at its next retry all the same, and a worker that was not
 * subscribed when the cancel notice went out (started after it) ran it;
 * its outcome was a duplicate.  Now the record leaves in_flight without
 * the stream ever storing the child.
 */
static void test_retry_of_cancelled_dropped(void **state)
{
	struct env *v = env_new(NULL);
	const char *pl[] = {"echo:late"};
	natsConnection *nc = NULL;
	jsCtx *js = NULL;
	jsStreamInfo *si = NULL;
	struct fanout_event *ev;
	struct fanout_nats_stats st;
	long t0;

	(void)state;
	assert_int_equal(open_disp(v, NULL, 0), 0);
	js_connect(v, &nc, &js);
	stream_subject(js, "FANOUT_T", "fanout.parked.t");
	dispatch(v, "t", pl, 1, 300ull * 1000000);
	ev = one_event(v, 60000);
	assert_int_equal(ev->results[0].status, FANOUT_INTERRUPTED);
	assert_int_equal(ev->results[0].code, -ETIMEDOUT);
	fanout_event_free(ev);
	stream_subject(js, "FANOUT_T", "fanout.work.t");
	start_worker(v, 0, "t", 1, 5);
	t0 = h_now_ms();
	do {
		assert_true(h_now_ms() - t0 < 30000);
		h_sleep_ms(10);
		fanout_nats_stats(v->n, &st);
	} while (st.in_flight);
	assert_int_equal(st.published, 0);
	assert_int_equal(st.duplicates, 0);
	assert_int_equal(js_GetStreamInfo(&si, js, "FANOUT_T", NULL, NULL),
			 NATS_OK);
	assert_int_equal(si->State.LastSeq, 0); /* never stored */
	jsStreamInfo_Destroy(si);
	assert_int_equal(h_count_lines(v->log[0], "S "), 0);
	js_disconnect(nc, js);
	env_free(v);
}

/*
 * A stopping worker whose outcome could not be stored by the end of its
 * stop wait (the results stream stores nothing) hands the child back
 * (Nak): another worker runs it at once and its outcome is the one event.
 * The worker once left it unacked: nothing moved it before AckWait (10
 * minutes here), and worker 1, started once worker 0 had exited, got
 * nothing before the test gave up.
 */
static void test_stop_naks_unstored(void **state)
{
	struct env *v = env_new(NULL);
	const char *pl[] = {"echo:again"};
	natsConnection *nc = NULL;
	jsCtx *js = NULL;
	struct fanout_event *ev;
	struct fanout_nats_stats st;
	int stt;

	(void)state;
	assert_int_equal(open_disp(v, NULL, 0), 0);
	js_connect(v, &nc, &js);
	results_stream(js, false);
	start_worker_ex(v, 0, "t", 1, 5, LONG_ACK_MS, 0);
	dispatch(v, "t", pl, 1, 0);
	assert_true(h_wait_lines(v->log[0], "D ", 1, 30000));
	kill(v->w[0], SIGTERM);
	assert_int_equal(waitpid(v->w[0], &stt, 0), v->w[0]);
	v->w[0] = 0;
	assert_true(WIFEXITED(stt) && WEXITSTATUS(stt) == 0);
	results_stream(js, true);
	start_worker_ex(v, 1, "t", 1, 5, LONG_ACK_MS, 0);
	ev = one_event(v, 60000);
	assert_int_equal(ev->results[0].status, FANOUT_COMPLETED);
	assert_string_equal(ev->results[0].summary, "again");
	fanout_event_free(ev);
	/* worker 1 ran it, as its second delivery */
	assert_true(h_wait_lines(v->log[1], "S ", 1, 30000));
	assert_int_equal(h_count_lines(v->log[1], "S "), 1);
	assert_int_equal(h_count_lines(v->log[1], "S tdisp."), 1);
	{
		char line[256] = "";
		FILE *f = fopen(v->log[1], "r");

		assert_non_null(f);
		assert_non_null(fgets(line, sizeof(line), f));
		fclose(f);
		assert_non_null(strstr(line, " 2\n"));
	}
	fanout_nats_stats(v->n, &st);
	assert_int_equal(st.results, 1);
	assert_int_equal(st.redelivered, 1);
	js_disconnect(nc, js);
	env_free(v);
}

/*
 * A child held by a busy worker (its slot taken) that the dispatcher
 * cancels is answered -ECANCELED unrun by that worker, at once, and no
 * other worker runs it.  The cancel notice is core NATS: only workers
 * subscribed when it goes out see it.  The worker recorded it and kept
 * the child held; stopped, it handed the child back, and worker 1,
 * started after the notice, ran it (delivery 2) and reported it
 * completed.  The test waits for the cancelled child's event (the
 * observable that worker 0 has the notice) before stopping worker 0;
 * the old code sent none while worker 0 was busy.
 */
static void test_held_cancel_answered(void **state)
{
	struct env *v = env_new(NULL);
	const char *pl_long[] = {"stopfail:long"}, *pl_b[] = {"echo:b"};
	struct fanout_sink *sink = fanout_default_sink(v->e);
	struct fanout_nats_stats st;
	natsConnection *nc = NULL;
	natsSubscription *sub;
	jsCtx *js = NULL;
	struct fanout_event *ev = NULL;
	char inbox[256];
	fanout_id long_id, b_id;

	(void)state;
	assert_int_equal(open_disp(v, NULL, 0), 0);
	js_connect(v, &nc, &js);
	sub = snoop_pulls(nc);
	start_worker_ex(v, 0, "t", 1, 5, LONG_ACK_MS, 8);
	worker_inbox(sub, inbox, sizeof(inbox));
	long_id = dispatch(v, "t", pl_long, 1, 0);
	assert_true(h_wait_lines(v->log[0], "S ", 1, 30000));
	/* busy (1 of 1): b reaches its inbox and is held */
	forge_pull(nc, inbox, 1);
	b_id = dispatch(v, "t", pl_b, 1, 0);
	wait_ack_pending(js, 2);
	assert_int_equal(fanout_cancel(v->e, b_id, FANOUT_CANCEL_INTERRUPT), 0);
	assert_int_equal(fanout_wait(sink, &ev, 30000), 0);
	assert_true(ev->id == b_id);
	assert_int_equal(ev->results[0].status, FANOUT_INTERRUPTED);
	assert_int_equal(ev->results[0].code, -ECANCELED);
	assert_non_null(strstr(ev->results[0].error, "before a worker ran it"));
	fanout_event_free(ev);
	/* worker 0 stops; worker 1, which never saw the notice, gets only
	 * the long child */
	h_kill_wait(v->w[0], SIGTERM);
	v->w[0] = 0;
	start_worker_ex(v, 1, "t", 2, 5, LONG_ACK_MS, 0);
	ev = one_event(v, 60000);
	assert_true(ev->id == long_id);
	assert_int_equal(ev->results[0].status, FANOUT_COMPLETED);
	assert_string_equal(ev->results[0].summary, "long");
	fanout_event_free(ev);
	assert_int_equal(started_once_each(v->log[0]), 1);
	assert_int_equal(started_once_each(v->log[1]), 1);
	fanout_nats_stats(v->n, &st);
	assert_int_equal(st.results, 2);
	assert_int_equal(st.duplicates, 0);
	js_disconnect(nc, js);
	env_free(v);
}

/* A local child that holds the engine's one worker until *arg is set. */
static int hold_worker(struct fanout_child *c, void *arg)
{
	int *flag = arg;

	(void)c;
	__atomic_store_n(&flag[0], 1, __ATOMIC_RELEASE);
	while (!__atomic_load_n(&flag[1], __ATOMIC_ACQUIRE))
		h_sleep_ms(1);
	return 0;
}

/*
 * Tasks whose delegation ended before their child started (a deadline, a
 * cancel) are freed then, not held until fanout_nats_close(): a
 * long-lived dispatcher whose delegations met deadlines kept every such
 * task's record and payload.  stats.unstarted counts those held; it was
 * 2 after each of the two delegations here.
 */
static void test_skipped_tasks_freed(void **state)
{
	struct env *v = env_new(NULL);
	struct fanout_config cfg = {
		.flags = FANOUT_NO_PIN, .workers = 1, .max_children = 1};
	const char *pl[] = {"echo:a", "echo:b", "echo:c"};
	struct fanout_task t[2], hold = {.fn = hold_worker};
	struct fanout_batch b = {.tasks = t, .ntasks = 2},
			    hb = {.tasks = &hold, .ntasks = 1};
	struct fanout_nats_stats st;
	struct fanout_event *ev;
	int flag[2] = {0, 0};
	fanout_id id, hid;
	unsigned i;

	(void)state;
	fanout_destroy(v->e);
	assert_int_equal(fanout_create(&cfg, &v->e), 0);
	assert_int_equal(open_disp(v, NULL, 0), 0);

	/* No worker process: child 0 defers and waits for an outcome that
	 * never comes, holding the delegation's one place, so children 1
	 * and 2 never start before the deadline. */
	dispatch(v, "t", pl, 3, 300ull * 1000000);
	ev = one_event(v, 60000);
	assert_true(ev->timed_out);
	assert_int_equal(ev->results[1].status, FANOUT_INTERRUPTED);
	assert_int_equal(ev->results[1].duration_ns, 0); /* never started */
	assert_int_equal(ev->results[2].duration_ns, 0);
	fanout_event_free(ev);
	fanout_nats_stats(v->n, &st);
	assert_int_equal(st.unstarted, 0);

	/* Cancelled before any of its children started: the engine's one
	 * worker is held by a local child meanwhile. */
	hold.arg = flag;
	assert_int_equal(fanout_dispatch(v->e, &hb, &hid), 0);
	while (!__atomic_load_n(&flag[0], __ATOMIC_ACQUIRE))
		h_sleep_ms(1);
	for (i = 0; i < 2; i++)
		assert_int_equal(fanout_nats_task(v->n, "t", pl[i],
						  strlen(pl[i]), NULL, &t[i]),
				 0);
	fanout_nats_stats(v->n, &st);
	assert_int_equal(st.unstarted, 2);
	assert_int_equal(fanout_dispatch(v->e, &b, &id), 0);
	assert_int_equal(fanout_cancel(v->e, id, FANOUT_CANCEL_PENDING), 0);
	__atomic_store_n(&flag[1], 1, __ATOMIC_RELEASE);
	for (i = 0; i < 2; i++) {
		assert_int_equal(
			fanout_wait(fanout_default_sink(v->e), &ev, 60000), 0);
		if (ev->id == id) {
			assert_int_equal(ev->ninterrupted, 2);
			assert_int_equal(ev->results[0].duration_ns, 0);
			assert_int_equal(ev->results[1].duration_ns, 0);
		}
		fanout_event_free(ev);
	}
	fanout_nats_stats(v->n, &st);
	assert_int_equal(st.unstarted, 0);
	env_free(v);
}

int main(int argc, char **argv)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_roundtrip, teardown),
		cmocka_unit_test_teardown(test_result_stream, teardown),
		cmocka_unit_test_teardown(test_exec_worker, teardown),
		cmocka_unit_test_teardown(test_worker_killed_redelivered,
					  teardown),
		cmocka_unit_test_teardown(test_max_deliver_exhausted, teardown),
		cmocka_unit_test_teardown(test_deadline, teardown),
		cmocka_unit_test_teardown(test_cancel_reaches_worker, teardown),
		cmocka_unit_test_teardown(test_server_restart, teardown),
		cmocka_unit_test_teardown(test_dispatcher_reconnect, teardown),
		cmocka_unit_test_teardown(test_duplicate_outcome, teardown),
		cmocka_unit_test_teardown(test_bad_input, teardown),
		cmocka_unit_test_teardown(test_publish_fails_after_accept,
					  teardown),
		cmocka_unit_test_teardown(test_restart_same_id, teardown),
		cmocka_unit_test_teardown(test_stop_hands_back_failed,
					  teardown),
		cmocka_unit_test_teardown(test_busy_inbox_kept, teardown),
		cmocka_unit_test_teardown(test_busy_inbox_overflow, teardown),
		cmocka_unit_test_teardown(test_stop_naks_held, teardown),
		cmocka_unit_test_teardown(test_stop_naks_late, teardown),
		cmocka_unit_test_teardown(test_worker_other_options, teardown),
		cmocka_unit_test_teardown(test_foreign_work_refused, teardown),
		cmocka_unit_test_teardown(test_outcome_too_big, teardown),
		cmocka_unit_test_teardown(test_worker_engine_full, teardown),
		cmocka_unit_test_teardown(test_publishing_kept_alive, teardown),
		cmocka_unit_test_teardown(test_outcome_retry_backoff, teardown),
		cmocka_unit_test_teardown(test_stop_naks_unstored, teardown),
		cmocka_unit_test_teardown(test_held_cancel_answered, teardown),
		cmocka_unit_test_teardown(test_unsettled_after_retry, teardown),
		cmocka_unit_test_teardown(test_stop_keeps_alive, teardown),
		cmocka_unit_test_teardown(test_publish_retry_backoff, teardown),
		cmocka_unit_test_teardown(test_retry_of_cancelled_dropped,
					  teardown),
		cmocka_unit_test_teardown(test_skipped_tasks_freed, teardown),
	};

	signal(SIGPIPE, SIG_IGN);
	if (argc > 1 && !strcmp(argv[1], "--dispatch-once"))
		return dispatch_once_main(argc, argv);
	if (getenv("REMOTE_TEST_FILTER"))
		cmocka_set_test_filter(getenv("REMOTE_TEST_FILTER"));
	return nats_suite_end(cmocka_run_group_tests(tests, NULL, NULL));
}
