/* SPDX-License-Identifier: MIT */
/*
 * abdl.c - two (or more) builds of libfanout.so compared in ONE process
 * (bench/PROFILE.txt phase 18):
 *
 *   abdl LIB.so LIB.so ... -- run N        fanout_run of N no-op children
 *   abdl LIB.so LIB.so ... -- bg N K       dispatch + wait, K batches of N
 *                                          in flight
 *
 * Each library is dlopen()ed with RTLD_LOCAL (copy the files first: one
 * path opened twice is one library) and gets an engine of its own; the
 * libraries then take turns in slices of SLICE_MS (60) ms, SLICES (30)
 * per library after a warm-up slice, the order reversed every round.
 * Prints each library's median rate and the median, over the rounds, of
 * its slice's rate divided by the first library's slice of the same round.
 * On a host whose speed changes every few seconds, two separate processes
 * run in different states; slices of one process next to each other
 * mostly do not (the same library listed twice read 0.999-1.030 here, so
 * a difference under ~3% is not one).  The shared
 * object is not the archive (system malloc, global-dynamic thread-locals),
 * so the ratio, not the rate, is what carries over.  AB_FLAGS=N sets
 * fanout_config.flags (LIB.so@N gives one library's engine N instead, so
 * that one build can be compared with itself under two configurations),
 * AB_WORKERS=N the workers (2), AB_CPU=C pins the
 * calling thread.  Exits non-zero if a call fails or an event is not what
 * was dispatched.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "dlfanout.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_LIBS 8
#define MAX_SLICES 256
#define STEP 256 /* calls between two clock reads */

struct lib {
	struct dlfanout f;
	struct fanout_engine *e;
	double rate[MAX_SLICES];
};

static int noop(struct fanout_child *c, void *a)
{
	(void)c;
	(void)a;
	return 0;
}

static double now_s(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static double median(const double *v, int n)
{
	double t[MAX_SLICES];

	memcpy(t, v, (size_t)n * sizeof(*v));
	qsort(t, (size_t)n, sizeof(*t), cmp);
	return n % 2 ? t[n / 2] : (t[n / 2 - 1] + t[n / 2]) / 2;
}

static int env_int(const char *name, int dflt)
{
	const char *s = getenv(name);

	return s ? atoi(s) : dflt;
}

/* One slice of @secs on @l; the rate in M children/s, or < 0 on failure. */
static double slice(struct lib *l, const struct fanout_batch *b, unsigned k,
		    double secs)
{
	unsigned n = b->ntasks, live = 0;
	struct fanout_event *ev;
	double t0 = now_s(), t1;
	long calls = 0;

	do {
		for (int i = 0; i < STEP; i++) {
			if (!k) {
				if (l->f.run(l->e, b, &ev) ||
				    ev->ncompleted != n)
					return -1;
				l->f.event_free(ev);
				continue;
			}
			for (; live < k; live++)
				if (l->f.dispatch(l->e, b, NULL))
					return -1;
			if (l->f.wait(l->f.sink(l->e), &ev, -1) ||
			    ev->ncompleted != n)
				return -1;
			l->f.event_free(ev);
			live--;
		}
		calls += STEP;
		t1 = now_s();
	} while (t1 - t0 < secs);
	for (; live; live--) {
		if (l->f.wait(l->f.sink(l->e), &ev, -1) || ev->ncompleted != n)
			return -1;
		l->f.event_free(ev);
	}
	return (double)calls * n / (t1 - t0) / 1e6;
}

int main(int argc, char **argv)
{
	static struct fanout_task t[4096];
	static struct lib libs[MAX_LIBS];
	struct fanout_config cfg = {.workers =
					    (unsigned)env_int("AB_WORKERS", 2),
				    .flags = (unsigned)env_int("AB_FLAGS", 0)};
	int nl = 0, i, slices = env_int("SLICES", 30);
	double secs = env_int("SLICE_MS", 60) / 1000.0;
	unsigned n, k = 0;

	for (i = 1; i < argc && strcmp(argv[i], "--"); i++)
		if (nl == MAX_LIBS ||
		    dlfanout_load(&libs[nl++].f, argv[i], cfg.flags, "abdl"))
			return 2;
	if (!nl || argc - i < 3 || slices < 1 || slices > MAX_SLICES ||
	    (strcmp(argv[i + 1], "run") && strcmp(argv[i + 1], "bg"))) {
		fprintf(stderr, "usage: abdl LIB.so... -- run N | bg N K\n");
		return 2;
	}
	n = (unsigned)atoi(argv[i + 2]);
	if (!strcmp(argv[i + 1], "bg"))
		k = argc - i > 3 ? (unsigned)atoi(argv[i + 3]) : 0;
	if (!n || n > 4096 || (!strcmp(argv[i + 1], "bg") && !k)) {
		fprintf(stderr, "abdl: N in 1..4096, K >= 1\n");
		return 2;
	}
	for (unsigned j = 0; j < n; j++)
		t[j] = (struct fanout_task){"g", noop, NULL};
	struct fanout_batch b = {.tasks = t, .ntasks = n};

	for (i = 0; i < nl; i++)
		if ((cfg.flags = libs[i].f.flags,
		     libs[i].f.create(&cfg, &libs[i].e))) {
			fprintf(stderr, "abdl: fanout_create failed\n");
			return 1;
		}
	if (getenv("AB_CPU")) {
		cpu_set_t s;

		CPU_ZERO(&s);
		CPU_SET(atoi(getenv("AB_CPU")), &s);
		sched_setaffinity(0, sizeof(s), &s);
	}
	for (int r = 0; r <= slices; r++)
		for (int q = 0; q < nl; q++) {
			struct lib *l = &libs[r % 2 ? nl - 1 - q : q];
			double v = slice(l, &b, k, secs);

			if (v < 0) {
				fprintf(stderr, "abdl: %s: a call failed\n",
					l->f.path);
				return 1;
			}
			if (r) /* round 0 warms up */
				l->rate[r - 1] = v;
		}
	for (i = 0; i < nl; i++) {
		double ratio[MAX_SLICES];

		for (int r = 0; r < slices; r++)
			ratio[r] = libs[i].rate[r] / libs[0].rate[r];
		printf("%-36s flags %-3u median %7.2fM/s  ratio to the "
		       "first %.3f\n",
		       libs[i].f.path, libs[i].f.flags,
		       median(libs[i].rate, slices), median(ratio, slices));
		libs[i].f.destroy(libs[i].e);
	}
	return 0;
}
