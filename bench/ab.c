/* SPDX-License-Identifier: MIT */
/*
 * ab.c - the two small drivers of bench/PROFILE.txt phase 6, for
 * comparing two builds of the library side by side (link one copy
 * against each libfanout.a and alternate them in one script):
 *
 *   ab run N [ITERS]     fanout_run of N no-op children, one at a time
 *   ab bg N K [ITERS]    fanout_dispatch + fanout_wait, K batches of N
 *                        in flight
 *
 * Prints the median of 7 rounds in children per second.  Exits non-zero
 * if a call fails or an event is not what was dispatched.  AB_FLAGS=N
 * sets fanout_config.flags (2: FANOUT_WAIT_HELPS); AB_STATS=1 prints the
 * engine's per-worker counters and the main thread's CPU at the end;
 * AB_WORKERS=N sets fanout_config.workers (2 by default);
 * AB_BORROW=1 borrows the task array (FANOUT_BORROW_TASKS);
 * AB_CPU=C pins the calling thread to CPU C once the workers started.
 */
#include <fanout.h>

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int noop(struct fanout_child *c, void *a)
{
	(void)c;
	(void)a;
	return 0;
}

static unsigned long long now_ns(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (unsigned long long)t.tv_sec * 1000000000ull + t.tv_nsec;
}

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static int take(struct fanout_engine *e, unsigned n)
{
	struct fanout_event *ev = NULL;

	if (fanout_wait(fanout_default_sink(e), &ev, -1) || !ev ||
	    ev->ncompleted != n)
		return -1;
	fanout_event_free(ev);
	return 0;
}

/* AB_STATS: each round's rate and the parks the workers took in it. */
static void round_stats(struct fanout_engine *e, int r, double rate)
{
	static unsigned long long last[64];
	struct fanout_stats st;

	if (fanout_stats(e, &st))
		return;
	fprintf(stderr, "  round %d: %.2fM/s, parks", r, rate);
	for (unsigned i = 0; i < st.nworkers && i < 64; i++) {
		fprintf(stderr, " %llu", st.worker[i].parks - last[i]);
		last[i] = st.worker[i].parks;
	}
	fputc('\n', stderr);
}

int main(int argc, char **argv)
{
	struct fanout_config cfg = {.workers = 2};
	const char *fl = getenv("AB_FLAGS");
	bool bg = argc > 1 && !strcmp(argv[1], "bg");
	unsigned n = argc > 2 ? (unsigned)atoi(argv[2]) : 1;
	unsigned k = bg && argc > 3 ? (unsigned)atoi(argv[3]) : 1;
	unsigned iters = (unsigned)atoi(argc > 3 + bg ? argv[3 + bg] : "0");
	struct fanout_engine *e;
	struct fanout_task *t;
	double med[7];

	if (argc < 3 || (!bg && strcmp(argv[1], "run")) || !n || !k) {
		fprintf(stderr,
			"usage: ab run N [ITERS] | ab bg N K [ITERS]\n");
		return 2;
	}
	if (getenv("AB_WORKERS"))
		cfg.workers = (unsigned)atoi(getenv("AB_WORKERS"));
	if (fl)
		cfg.flags = (unsigned)strtoul(fl, NULL, 0);
	if (!iters)
		iters = 200000 / n + 50;
	if (fanout_create(&cfg, &e))
		return 1;
	if (getenv("AB_CPU")) { /* pin the calling thread after the workers */
		cpu_set_t set;

		CPU_ZERO(&set);
		CPU_SET(atoi(getenv("AB_CPU")), &set);
		if (sched_setaffinity(0, sizeof(set), &set))
			return 1;
	}
	t = calloc(n, sizeof(*t));
	if (!t)
		return 1;
	for (unsigned i = 0; i < n; i++)
		t[i] = (struct fanout_task){"g", noop, NULL};
	struct fanout_batch b = {.tasks = t, .ntasks = n};

	if (getenv("AB_BORROW"))
		b.flags = FANOUT_BORROW_TASKS;
	for (int r = 0; r < 7; r++) {
		unsigned long long t0 = now_ns();
		unsigned live = 0;

		for (unsigned i = 0; i < iters; i++) {
			struct fanout_event *ev = NULL;

			if (!bg) {
				if (fanout_run(e, &b, &ev) ||
				    ev->ncompleted != n)
					return 1;
				fanout_event_free(ev);
				continue;
			}
			for (; live < k; live++)
				if (fanout_dispatch(e, &b, NULL))
					return 1;
			if (take(e, n))
				return 1;
			live--;
		}
		for (; live; live--)
			if (take(e, n))
				return 1;
		med[r] = (double)(now_ns() - t0) / iters;
		if (getenv("AB_STATS"))
			round_stats(e, r, n * 1e3 / med[r]);
	}
	qsort(med, 7, sizeof(double), cmp);
	printf("%s batch %u x%u: %.2fM children/s (median of 7 rounds)\n",
	       bg ? "dispatch+wait" : "fanout_run", n, k, n * 1e3 / med[3]);
	if (getenv("AB_STATS")) {
		struct fanout_stats st;

		if (fanout_stats(e, &st))
			return 1;
		for (unsigned i = 0; i < st.nworkers; i++)
			fprintf(stderr,
				"  worker %u (cpu %d): %llu children, %llu "
				"parks, %llu wakeups\n",
				i, st.worker[i].cpu,
				(unsigned long long)st.worker[i].children_run,
				(unsigned long long)st.worker[i].parks,
				(unsigned long long)st.worker[i].wakeups);
		fprintf(stderr, "  main thread on cpu %d at the end\n",
			sched_getcpu());
		fprintf(stderr, "  all: %llu children, %llu delegations\n",
			(unsigned long long)st.children_run,
			(unsigned long long)(st.dispatched + st.runs));
	}
	free(t);
	fanout_destroy(e);
	return 0;
}
