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
#include <fanout.h>

#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_LIBS 8

struct lib {
	const char *path;
	int (*create)(const struct fanout_config *, struct fanout_engine **);
	void (*destroy)(struct fanout_engine *);
	int (*dispatch)(struct fanout_engine *, const struct fanout_batch *,
			fanout_id *);
	int (*wait)(struct fanout_sink *, struct fanout_event **, int);
	struct fanout_sink *(*sink)(struct fanout_engine *);
	void (*event_free)(struct fanout_event *);
	struct fanout_engine *e;
	unsigned flags;
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

static int load(struct lib *l, char *path)
{
	char *at = strrchr(path, '@');
	void *h;

	if (at) {
		*at = '\0';
		l->flags = (unsigned)strtoul(at + 1, NULL, 0);
	}
	h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		fprintf(stderr, "latab: %s\n", dlerror());
		return -1;
	}
	l->path = path;
	*(void **)&l->create = dlsym(h, "fanout_create");
	*(void **)&l->destroy = dlsym(h, "fanout_destroy");
	*(void **)&l->dispatch = dlsym(h, "fanout_dispatch");
	*(void **)&l->wait = dlsym(h, "fanout_wait");
	*(void **)&l->sink = dlsym(h, "fanout_default_sink");
	*(void **)&l->event_free = dlsym(h, "fanout_event_free");
	if (!l->create || !l->destroy || !l->dispatch || !l->wait || !l->sink ||
	    !l->event_free) {
		fprintf(stderr, "latab: %s lacks the API\n", path);
		return -1;
	}
	return 0;
}

/* One sample: dispatch one no-op child, wait for its event.  The time in
 * ns, or 0 on failure. */
static uint64_t sample(struct lib *l, const struct fanout_batch *b)
{
	struct fanout_event *ev = NULL;
	uint64_t t0 = now_ns(), t1;

	if (l->dispatch(l->e, b, NULL) || l->wait(l->sink(l->e), &ev, 10000) ||
	    !ev || ev->nresults != 1)
		return 0;
	t1 = now_ns();
	l->event_free(ev);
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

		if (load(&libs[i], argv[i + 1]))
			return 1;
		cfg.flags = libs[i].flags;
		libs[i].hot =
			calloc((size_t)rounds * (size_t)nhot, sizeof(uint64_t));
		if (!libs[i].hot || libs[i].create(&cfg, &libs[i].e)) {
			fprintf(stderr, "latab: %s: no engine\n", libs[i].path);
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
		       l->path, q(l->hot, l->nhot, 0.5),
		       q(l->hot, l->nhot, 0.9), q(l->hot, l->nhot, 0.99),
		       q(l->hot, l->nhot, 0.999),
		       q(l->hot, l->nhot, 0.999) / q(l->hot, l->nhot, 0.5),
		       slow, l->nhot);
		l->destroy(l->e);
		free(l->hot);
	}
	return 0;
fail:
	fprintf(stderr, "latab: a dispatch or wait failed\n");
	return 1;
}
