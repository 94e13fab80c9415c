/* SPDX-License-Identifier: MIT */
/*
 * latab.c - the hot single-child latency of two (or more) builds of
 * libfanout.so, compared in ONE process (bench/PROFILE.txt phase 20):
 *
 *   latab LIB.so LIB.so ...
 *
 * The latency twin of abdl.c (same loading: copy the files first, one
 * path opened twice is one library; LIB.so@FLAGS gives that library's
 * engine FLAGS).  Each round, every library in turn (the order reversed
 * every round) runs PARKED samples with a 2 ms sleep before each, then
 * HOT samples back to back, as fanout-bench's latency scenario does: so
 * the hot samples start where the engine's workers were parked, and a
 * slow way out of that state shows in the tail.  A sample is fanout_
 * dispatch + fanout_wait of one no-op child on the default sink, timed with
 * CLOCK_MONOTONIC.  Prints, per library, the hot p50, p90, p99, p999 and
 * p999/p50 over all rounds, and how many hot samples took over 3 us.
 * ROUNDS (20), HOT (2000), PARKED (40) set the counts.  On a host whose
 * speed changes every few seconds, two processes run in different
 * states; rounds of one process next to each other mostly do not.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "dlfanout.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_LIBS 8

struct lib {
	struct dlfanout f;
	struct fanout_engine *e;
	uint64_t *hot; /* ns */
	size_t nhot;
};

static int noop(struct fanout_child *c, void *a)
{
	(void)c;
	(void)a;
	return 0;
}

static uint64_t now_ns(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

static int cmp(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

static int env_int(const char *name, int dflt)
{
	const char *s = getenv(name);

	return s ? atoi(s) : dflt;
}

/* One sample: dispatch one no-op child, wait for its event.  The time in
 * ns, or 0 on failure. */
static uint64_t sample(struct lib *l, const struct fanout_batch *b)
{
	struct fanout_event *ev = NULL;
	uint64_t t0 = now_ns(), t1;

	if (l->f.dispatch(l->e, b, NULL) ||
	    l->f.wait(l->f.sink(l->e), &ev, 10000) || !ev || ev->nresults != 1)
		return 0;
	t1 = now_ns();
	l->f.event_free(ev);
	return t1 > t0 ? t1 - t0 : 1;
}

static double q(const uint64_t *v, size_t n, double p)
{
	size_t i = (size_t)(p * (double)(n - 1));

	return (double)v[i] / 1000.0;
}

int main(int argc, char **argv)
{
	struct lib libs[MAX_LIBS] = {0};
	int nlibs = argc - 1, rounds = env_int("ROUNDS", 20),
	    nhot = env_int("HOT", 2000), npark = env_int("PARKED", 40);
	struct fanout_task task = {.fn = noop};
	struct fanout_batch b = {.tasks = &task, .ntasks = 1};
	struct timespec gap = {0, 2000000};

	if (nlibs < 1 || nlibs > MAX_LIBS || rounds < 1 || nhot < 10 ||
	    npark < 0) {
		fprintf(stderr,
			"usage: latab LIB.so [LIB.so ...] (at most %d;"
			" ROUNDS, HOT, PARKED in the environment)\n",
			MAX_LIBS);
		return 2;
	}
	for (int i = 0; i < nlibs; i++) {
		struct fanout_config cfg = {.workers = 2};

		if (dlfanout_load(&libs[i].f, argv[i + 1], 0, "latab"))
			return 1;
		cfg.flags = libs[i].f.flags;
		libs[i].hot =
			calloc((size_t)rounds * (size_t)nhot, sizeof(uint64_t));
		if (!libs[i].hot || libs[i].f.create(&cfg, &libs[i].e)) {
			fprintf(stderr, "latab: %s: no engine\n",
				libs[i].f.path);
			return 1;
		}
	}
	for (int r = 0; r < rounds; r++) {
		for (int k = 0; k < nlibs; k++) {
			struct lib *l = &libs[r % 2 ? nlibs - 1 - k : k];

			for (int i = 0; i < npark; i++) {
				nanosleep(&gap, NULL);
				if (!sample(l, &b))
					goto fail;
			}
			for (int i = 0; i < nhot; i++) {
				uint64_t t = sample(l, &b);

				if (!t)
					goto fail;
				l->hot[l->nhot++] = t;
			}
		}
	}
	for (int i = 0; i < nlibs; i++) {
		struct lib *l = &libs[i];
		size_t slow = 0;

		for (size_t j = 0; j < l->nhot; j++)
			slow += l->hot[j] > 3000;
		qsort(l->hot, l->nhot, sizeof(uint64_t), cmp);
		printf("%-28s hot p50 %6.2f p90 %6.2f p99 %6.2f p999 %7.2f us"
		       "  p999/p50 %6.1fx  over 3 us %zu of %zu\n",
		       l->f.path, q(l->hot, l->nhot, 0.5),
		       q(l->hot, l->nhot, 0.9), q(l->hot, l->nhot, 0.99),
		       q(l->hot, l->nhot, 0.999),
		       q(l->hot, l->nhot, 0.999) / q(l->hot, l->nhot, 0.5),
		       slow, l->nhot);
		l->f.destroy(l->e);
		free(l->hot);
	}
	return 0;
fail:
	fprintf(stderr, "latab: a dispatch or wait failed\n");
	return 1;
}
