// SPDX-License-Identifier: MIT
/*
 * remote-check - the kill-a-worker scenario of issue 12, end to end.
 *
 * Starts its own nats-server (free port, temporary store), 3 worker
 * processes (remote-test-worker, AckWait 1 s), and dispatches N children
 * (default 10,000) as one delegation.  While outcomes arrive it kills a
 * worker with SIGKILL at 20%, 45% and 70% of them and starts a new one in
 * its place, so 3 workers keep running.  Then it checks the one event:
 *
 *   lost        children not COMPLETED with their own summary ("k<i>"),
 *               or no event at all within the time limit;
 *   duplicated  events beyond the first, plus outcomes that finished a
 *               child beyond N (the dispatcher counts them);
 *   redelivered outcomes that came from a redelivery (the killed
 *               workers' children, run again elsewhere);
 *
 * and prints exactly one line:
 *   remote: N children, L lost, D duplicated, R redelivered, W workers killed
 * Exit status 0 only when L and D are 0.
 *
 *   remote-check [-n N] -w path/to/remote-test-worker
 */
#include <getopt.h>

#include "fanout_nats.h"
#include "nats_harness.h"

#define NW 3

static pid_t spawn_worker(const char *prog, const char *url)
{
	char *argv[] = {
		(char *)prog, "--url",	       (char *)url, "--kind",
		"check",      "--concurrency", "8",	    "--ack-wait-ms",
		"1000",	      "--max-deliver", "50",	    NULL};

	return h_spawn(argv);
}

int main(int argc, char **argv)
{
	static const char *const kinds[] = {"check"};
	struct fanout_nats_opts no = {.kinds = kinds, .nkinds = 1};
	struct fanout_config cfg = {.flags = FANOUT_NO_PIN,
				    .workers = 2,
				    .max_children = 1u << 16,
				    .max_tasks = 1u << 20};
	const char *prog = NULL;
	struct fanout_engine *e = NULL;
	struct fanout_nats *n = NULL;
	struct fanout_nats_stats st;
	struct fanout_event *ev = NULL, *ev2 = NULL;
	struct fanout_task *t;
	struct fanout_batch b = {0};
	struct nats_srv srv;
	pid_t w[NW];
	unsigned N = 10000, i, lost = 0, dup = 0, killed = 0, next_kill = 0;
	static const unsigned kill_at[] = {20, 45, 70};
	long t0;
	int ch, err;

	while ((ch = getopt(argc, argv, "n:w:")) != -1) {
		if (ch == 'n')
			N = (unsigned)atoi(optarg);
		else if (ch == 'w')
			prog = optarg;
		else
			return 2;
	}
	if (!prog || !N) {
		fprintf(stderr, "usage: remote-check [-n N] -w WORKER\n");
		return 2;
	}
	signal(SIGPIPE, SIG_IGN);
	if ((err = nats_srv_start(&srv))) {
		fprintf(stderr, "remote-check: nats-server: %s\n",
			strerror(-err));
		return 1;
	}
	if ((err = fanout_create(&cfg, &e)) ||
	    (err = fanout_nats_open(srv.url, &no, &n))) {
		fprintf(stderr, "remote-check: %s\n", strerror(-err));
		nats_srv_stop(&srv);
		return 1;
	}
	for (i = 0; i < NW; i++)
		w[i] = spawn_worker(prog, srv.url);
	t = calloc(N, sizeof(*t));
	for (i = 0; t && i < N; i++) {
		char pl[32];

		snprintf(pl, sizeof(pl), "sleep:1:k%u", i);
		if (fanout_nats_task(n, "check", pl, strlen(pl), NULL, &t[i]))
			break;
	}
	if (!t || i < N) {
		fprintf(stderr, "remote-check: could not make the tasks\n");
		return 1;
	}
	b.tasks = t;
	b.ntasks = N;
	if ((err = fanout_dispatch(e, &b, NULL))) {
		fprintf(stderr, "remote-check: dispatch: %s\n", strerror(-err));
		return 1;
	}
	t0 = h_now_ms();
	while (fanout_wait(fanout_default_sink(e), &ev, 50) == -ETIMEDOUT) {
		fanout_nats_stats(n, &st);
		if (next_kill < 3 &&
		    st.results * 100 >= (uint64_t)kill_at[next_kill] * N) {
			unsigned k = next_kill % NW;

			h_kill_wait(w[k], SIGKILL);
			w[k] = spawn_worker(prog, srv.url);
			killed++;
			next_kill++;
		}
		if (h_now_ms() - t0 > 600000)
			break;
	}
	if (ev) {
		for (i = 0; i < N; i++) {
			char want[32];

			snprintf(want, sizeof(want), "k%u", i);
			if (ev->results[i].status != FANOUT_COMPLETED ||
			    !ev->results[i].summary ||
			    strcmp(ev->results[i].summary, want))
				lost++;
		}
		while (fanout_wait(fanout_default_sink(e), &ev2, 300) == 0) {
			dup++;
			fanout_event_free(ev2);
		}
		fanout_event_free(ev);
	} else {
		lost = N;
	}
	fanout_nats_stats(n, &st);
	if (st.results > N)
		dup += (unsigned)(st.results - N);
	printf("remote: %u children, %u lost, %u duplicated, %" PRIu64
	       " redelivered, %u workers killed\n",
	       N, lost, dup, st.redelivered, killed);
	for (i = 0; i < NW; i++)
		h_kill_wait(w[i], SIGTERM);
	fanout_shutdown(e);
	fanout_nats_close(n);
	fanout_destroy(e);
	free(t);
	nats_srv_stop(&srv);
	return lost || dup;
}
