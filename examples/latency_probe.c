/* SPDX-License-Identifier: MIT */
/*
 * latency_probe.c - reading fanout's own timestamps the way a
 * latency-benchmarking harness would.
 *
 * Every event carries, on CLOCK_MONOTONIC (fanout_now_ns()):
 *   ev->dispatched_ns   when the dispatch was accepted,
 *   ev->completed_ns    when the last child finished and the event was made,
 * and every result its child's own run time, results[i].duration_ns (0 for
 * a child that never started).  So a harness needs no clock of its own to
 * split "time in the engine" from "time in my children"; it only collects
 * the numbers and takes percentiles.  This program runs ROUNDS delegations
 * of FANOUT children, each child spinning for about WORK_NS, and prints:
 *   - dispatch->event: completed_ns - dispatched_ns per delegation;
 *   - receipt lag: from completed_ns to the moment we held the event;
 *   - child duration: duration_ns per child.
 * The figures depend on the machine and its load; nothing here asserts a
 * speed, only that the timestamps are consistent.
 *
 * Build: cc -Wall -Wextra latency_probe.c $(pkg-config --cflags --libs fanout)
 */
#include <fanout.h>

#include <stdio.h>
#include <stdlib.h>

#define ROUNDS 2000
#define FANOUT 4
#define WORK_NS 2000 /* each child spins ~2 us */

/* A child that spins for about WORK_NS: a stand-in for a short request. */
static int spin(struct fanout_child *c, void *arg)
{
	uint64_t end = fanout_now_ns() + WORK_NS;

	(void)c;
	(void)arg;
	while (fanout_now_ns() < end)
		;
	return 0;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

/* Sort @v and print its percentiles in microseconds. */
static void print_percentiles(const char *what, uint64_t *v, size_t n)
{
	static const double ps[] = {50, 90, 99, 99.9};

	qsort(v, n, sizeof(*v), cmp_u64);
	printf("  %-16s", what);
	for (size_t k = 0; k < sizeof(ps) / sizeof(ps[0]); k++) {
		size_t i = (size_t)(ps[k] / 100.0 * (double)(n - 1) + 0.5);

		printf("  p%g %.2f", ps[k], (double)v[i] / 1000.0);
	}
	printf("  max %.2f us (n=%zu)\n", (double)v[n - 1] / 1000.0, n);
}

int main(void)
{
	struct fanout_engine *e;
	struct fanout_sink *sink;
	struct fanout_task tasks[FANOUT];
	struct fanout_batch b = {.tasks = tasks, .ntasks = FANOUT};
	uint64_t *latency = calloc(ROUNDS, sizeof(uint64_t));
	uint64_t *lag = calloc(ROUNDS, sizeof(uint64_t));
	uint64_t *child = calloc((size_t)ROUNDS * FANOUT, sizeof(uint64_t));
	unsigned bad = 0;

	if (!latency || !lag || !child || fanout_create(NULL, &e))
		return 1;
	sink = fanout_default_sink(e);
	for (unsigned i = 0; i < FANOUT; i++)
		tasks[i] = (struct fanout_task){"spin", spin, NULL};

	for (unsigned r = 0; r < ROUNDS; r++) {
		struct fanout_event *ev;
		uint64_t held;

		if (fanout_dispatch(e, &b, NULL) ||
		    fanout_wait(sink, &ev, 10000))
			return 1;
		held = fanout_now_ns();
		/* The harness's whole job: read the timestamps. */
		latency[r] = ev->completed_ns - ev->dispatched_ns;
		lag[r] = held - ev->completed_ns;
		for (unsigned i = 0; i < ev->nresults; i++)
			child[(size_t)r * FANOUT + i] =
				ev->results[i].duration_ns;
		/* Consistency: the order of the three clocks, every child
		 * ran and ran at least as long as it spun. */
		if (ev->completed_ns < ev->dispatched_ns ||
		    held < ev->completed_ns || ev->ncompleted != FANOUT)
			bad++;
		for (unsigned i = 0; i < ev->nresults; i++)
			if (ev->results[i].duration_ns < WORK_NS / 2)
				bad++;
		fanout_event_free(ev);
	}
	fanout_destroy(e);

	printf("latency_probe: %d delegations of %d children, each ~%d ns of "
	       "work\n",
	       ROUNDS, FANOUT, WORK_NS);
	print_percentiles("dispatch->event", latency, ROUNDS);
	print_percentiles("event->receipt", lag, ROUNDS);
	print_percentiles("child duration", child, (size_t)ROUNDS * FANOUT);
	free(latency);
	free(lag);
	free(child);
	if (bad) {
		fprintf(stderr, "latency_probe: %u inconsistent timestamps\n",
			bad);
		return 1;
	}
	return 0;
}
