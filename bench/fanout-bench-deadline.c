/* SPDX-License-Identifier: MIT */
/*
 * fanout-bench-deadline.c - what a deadline costs.
 *
 * One no-op child per delegation, dispatched and waited for one at a time
 * (the latency of a whole delegation, in ns), without a deadline and with
 * one (10 s, never reached), first with no other deadline alive, then with
 * LIVE delegations holding deferred children and 60 s deadlines. Then the
 * firing side: LIVE delegations whose deadlines all pass at once, timed
 * from the deadline to the last event (ns per expired deadline). Rounds
 * alternate between the cases, and medians are reported.
 */
#include "bench-fanout.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define LIVE 10000u

static int defer_child(struct fanout_child *c, void *arg)
{
	struct fanout_pending **slot = arg;

	*slot = fanout_defer(c);
	return *slot ? -EINPROGRESS : -ENOMEM;
}

/* ns per delegation of @k sequential single-child delegations. */
static double seq_round(struct fanout_engine *e, unsigned k, uint64_t dl)
{
	static struct bwork noop;
	struct fanout_task t = {
		.goal = "g", .fn = bench_fo_child, .arg = &noop};
	struct fanout_batch b = {.tasks = &t, .ntasks = 1, .deadline_ns = dl};
	struct fanout_sink *s = fanout_default_sink(e);
	uint64_t t0 = bench_now_ns();

	for (unsigned i = 0; i < k; i++) {
		struct fanout_event *ev;
		int rc = fanout_dispatch(e, &b, NULL);

		if (rc)
			bench_die("deadlines: dispatch: %s",
				  fanout_strerror(rc));
		rc = fanout_wait(s, &ev, 10000);
		if (rc)
			bench_die("deadlines: wait: %s", fanout_strerror(rc));
		bench_fo_check_event(ev, 1, false);
		fanout_event_free(ev);
	}
	return (double)(bench_now_ns() - t0) / k;
}

/* LIVE delegations, each with one deferred child and deadline @dl, on
 * sink @s.  Their pending handles go to @pend. */
static void make_live(struct fanout_engine *e, struct fanout_sink *s,
		      struct fanout_pending **pend, uint64_t dl)
{
	for (unsigned i = 0; i < LIVE; i++) {
		struct fanout_task t = {
			.goal = "live", .fn = defer_child, .arg = &pend[i]};
		struct fanout_batch b = {
			.tasks = &t, .ntasks = 1, .deadline_ns = dl, .sink = s};
		int rc = fanout_dispatch(e, &b, NULL);

		if (rc)
			bench_die("deadlines: live dispatch: %s",
				  fanout_strerror(rc));
	}
}

/* Wait for LIVE events on @s; returns when the last arrived. */
static uint64_t drain_live(struct fanout_sink *s, bool timed_out)
{
	for (unsigned i = 0; i < LIVE; i++) {
		struct fanout_event *ev;
		int rc = fanout_wait(s, &ev, 120000);

		if (rc)
			bench_die("deadlines: live wait: %s",
				  fanout_strerror(rc));
		if (ev->timed_out != timed_out)
			bench_die("deadlines: timed_out %d, want %d",
				  ev->timed_out, timed_out);
		fanout_event_free(ev);
	}
	return bench_now_ns();
}

static void complete_all(struct fanout_pending **pend, int want)
{
	for (unsigned i = 0; i < LIVE; i++) {
		struct fanout_pending *p;

		/* the worker wrote the handle before the child returned */
		while (!(p = __atomic_load_n(&pend[i], __ATOMIC_ACQUIRE)))
			bench_sleep_ns(1000);
		if (fanout_complete(p, NULL) != want)
			bench_die("deadlines: complete != %d", want);
		__atomic_store_n(&pend[i], NULL, __ATOMIC_RELAXED);
	}
}

void bench_deadlines(void)
{
	struct fanout_config cfg = {.max_async = 2 * LIVE};
	struct fanout_engine *e = bench_fo_engine(bench_opt.nthreads, &cfg);
	struct fanout_pending **pend = calloc(LIVE, sizeof(*pend));
	unsigned rounds = bench_opt.rounds, k;
	double *none = calloc(rounds, sizeof(double));
	double *one = calloc(rounds, sizeof(double));
	double *live = calloc(rounds, sizeof(double));
	double *fire = calloc(rounds, sizeof(double));
	struct fanout_sink *ls;
	FILE *o = bench_opt.out;
	int rc;

	if (!pend || !none || !one || !live || !fire)
		bench_die("deadlines: out of memory");
	rc = fanout_sink_create(e, &ls);
	if (rc)
		bench_die("deadlines: sink: %s", fanout_strerror(rc));
	k = (unsigned)(20000 * bench_opt.scale) + 200;
	seq_round(e, k, 10000000000ull); /* warm up, start the timer */
	for (unsigned r = 0; r < rounds; r++) {
		uint64_t due, last;

		none[r] = seq_round(e, k, 0);
		one[r] = seq_round(e, k, 10000000000ull);
		make_live(e, ls, pend, 60000000000ull);
		live[r] = seq_round(e, k, 10000000000ull);
		complete_all(pend, 0);
		drain_live(ls, false);
		/* firing: LIVE deadlines 50 ms from now, all at once */
		due = bench_now_ns() + 50000000ull;
		make_live(e, ls, pend, due - bench_now_ns());
		last = drain_live(ls, true);
		fire[r] = (double)(last > due ? last - due : 0) / LIVE;
		complete_all(pend, -EALREADY);
	}
	fprintf(o,
		"\n== deadlines (one timer thread per engine; %u "
		"delegations of 1 no-op child, one at a time; medians of %u "
		"rounds) ==\n",
		k, rounds);
	fprintf(o, "  %-44s %10.0f ns\n", "delegation without a deadline",
		bench_median(none, rounds));
	fprintf(o, "  %-44s %10.0f ns\n", "with a deadline, none other alive",
		bench_median(one, rounds));
	fprintf(o, "  %-44s %10.0f ns\n",
		"with a deadline, 10000 other deadlines alive",
		bench_median(live, rounds));
	fprintf(o, "  %-44s %10.0f ns\n",
		"firing: per expired deadline (10000 at once)",
		bench_median(fire, rounds));
	bench_fig_add("deadlines", "no deadline", "fanout",
		      bench_median(none, rounds), "ns", BENCH_LOWER);
	bench_fig_add("deadlines", "deadline", "fanout",
		      bench_median(one, rounds), "ns", BENCH_LOWER);
	bench_fig_add("deadlines", "deadline, 10k alive", "fanout",
		      bench_median(live, rounds), "ns", BENCH_LOWER);
	bench_fig_add("deadlines", "firing per deadline", "fanout",
		      bench_median(fire, rounds), "ns", BENCH_LOWER);
	fanout_sink_destroy(ls);
	fanout_destroy(e);
	free(pend);
	free(none);
	free(one);
	free(live);
	free(fire);
}
