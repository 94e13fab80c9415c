/* SPDX-License-Identifier: MIT */
/*
 * fanout-bench-orch.c - the orchestrator-shaped load, and fanout's own
 * single-child latency with the library's timestamps.
 *
 * ORCHESTRATOR: one dispatcher thread (main) keeps up to --inflight
 * background delegations running (fanout_dispatch) with fan-out drawn
 * uniformly from 1..64, each child a no-op (half of them) or a busy loop of
 * 1..10 us; goals, a context and a session key are attached, as an agent
 * orchestrator would.  A consumer thread takes the events with fanout_wait()
 * on the default sink.  The dispatcher counts what is in flight itself and
 * waits for the consumer before going over the bound; if the library still
 * answers -EBUSY, the rejection is counted, the dispatcher waits for one more
 * event and retries.
 *
 * Checked for every event: it belongs to a delegation in flight (not a
 * duplicate, not foreign), its id is the one dispatch returned, nresults,
 * status, per-child index/status/code/goal, session key and context are
 * right.  At the end of each round every dispatched delegation has produced
 * its event, the sink is empty, and the per-thread child counters add up to
 * the children the events reported.  Any failure aborts.
 *
 * Latency "e2e" = consumer's fanout_now_ns() right after fanout_wait()
 * returned, minus the dispatcher's fanout_now_ns() right before the accepted
 * fanout_dispatch() call.  "lib" = ev->completed_ns - ev->dispatched_ns.
 * With the pool kept full these are queueing latencies (Little's law); the
 * unloaded single-child figures come from bench_fanout_latency_quick().
 */
#include "bench-fanout.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define ORCH_MAX_FANOUT 64
#define ORCH_SESSIONS 8
#define ORCH_MAX_ROUNDS 64

static struct bwork orch_works[11]; /* [0] no-op, [k] k microseconds */
static char orch_goals[ORCH_MAX_FANOUT][32];
static char orch_sessions[ORCH_SESSIONS][24];
static const char orch_context[] = "fanout-bench orchestrator load";

struct oslot {
	_Atomic uint32_t
		busy; /* dispatcher sets; whoever finishes last clears */
	_Atomic uint32_t phase; /* dispatch-returned and event-seen, 0..2 */
	uint32_t gen;
	unsigned ntasks;
	unsigned session;
	unsigned round;
	uint64_t t_call;
	fanout_id d_id; /* written by the dispatcher */
	fanout_id e_id; /* written by the consumer */
	bool ev_seen;
};

struct orch {
	struct fanout_engine *e;
	struct fanout_sink *sink;
	struct oslot *slots;
	unsigned nslots;
	unsigned bound;

	/* consumer -> dispatcher progress; futex word */
	_Atomic uint32_t recv_seq;
	_Atomic uint32_t waiting;
	_Atomic uint64_t received;
	_Atomic uint64_t final_dispatched; /* UINT64_MAX until the end */

	/* consumer-owned, per round */
	struct bench_hist *lat_e2e[ORCH_MAX_ROUNDS];
	struct bench_hist *lat_lib[ORCH_MAX_ROUNDS];
	uint64_t children[ORCH_MAX_ROUNDS];
	uint64_t events[ORCH_MAX_ROUNDS];
};

/* The last of dispatcher and consumer to touch a slot checks ids, frees it. */
static void slot_finish(struct oslot *s)
{
	/* acq_rel: the other side's id store (before its increment) is seen. */
	if (atomic_fetch_add_explicit(&s->phase, 1, memory_order_acq_rel) != 1)
		return;
	if (s->d_id != s->e_id)
		bench_die("orchestrator: event id " FANOUT_ID_FMT
			  " but dispatch "
			  "returned " FANOUT_ID_FMT,
			  (unsigned long long)s->e_id,
			  (unsigned long long)s->d_id);
	/* release: everything above is done before the dispatcher reuses it. */
	atomic_store_explicit(&s->busy, 0, memory_order_release);
}

static void check_orch_event(struct orch *o, const struct fanout_event *ev,
			     struct oslot *s)
{
	bench_fo_check_event(ev, s->ntasks, true);
	for (unsigned i = 0; i < ev->nresults; i++) {
		const struct fanout_result *r = &ev->results[i];
		if (!r->goal || strcmp(r->goal, orch_goals[i]))
			bench_die("orchestrator: results[%u].goal \"%s\", "
				  "expected "
				  "\"%s\"",
				  i, r->goal ? r->goal : "(null)",
				  orch_goals[i]);
		if (r->error)
			bench_die("orchestrator: completed child %u has error "
				  "\"%s\"",
				  i, r->error);
	}
	if (!ev->session_key ||
	    strcmp(ev->session_key, orch_sessions[s->session]))
		bench_die("orchestrator: event routed with session \"%s\", "
			  "expected \"%s\"",
			  ev->session_key ? ev->session_key : "(null)",
			  orch_sessions[s->session]);
	if (!ev->context || strcmp(ev->context, orch_context))
		bench_die("orchestrator: event context wrong");
	(void)o;
}

static void *consumer_main(void *arg)
{
	struct orch *o = arg;
	uint64_t last_progress = bench_now_ns();
	for (;;) {
		uint64_t got = atomic_load_explicit(&o->received,
						    memory_order_relaxed);
		if (got == atomic_load_explicit(&o->final_dispatched,
						memory_order_acquire))
			break;
		struct fanout_event *ev;
		int rc = fanout_wait(o->sink, &ev, 200);
		uint64_t now = fanout_now_ns();
		if (rc == -ETIMEDOUT) {
			if (now - last_progress > 10000000000ull)
				bench_die(
					"orchestrator: no event for 10 s, %llu "
					"received (events never arrived)",
					(unsigned long long)got);
			continue;
		}
		if (rc)
			bench_die("fanout_wait: %s", fanout_strerror(rc));
		last_progress = now;

		uintptr_t u = (uintptr_t)ev->user;
		unsigned idx = (unsigned)(u & 0xffff);
		uint32_t gen = (uint32_t)(u >> 16);
		if (idx >= o->nslots)
			bench_die("orchestrator: event with a foreign user "
				  "pointer");
		struct oslot *s = &o->slots[idx];
		if (!atomic_load_explicit(&s->busy, memory_order_acquire) ||
		    s->gen != gen || s->ev_seen)
			bench_die(
				"orchestrator: event " FANOUT_ID_FMT
				" arrived for "
				"a delegation not in flight (duplicate event)",
				(unsigned long long)ev->id);
		s->ev_seen = true;
		check_orch_event(o, ev, s);
		unsigned r = s->round;
		bench_hist_add(o->lat_e2e[r], now - s->t_call);
		bench_hist_add(o->lat_lib[r],
			       ev->completed_ns - ev->dispatched_ns);
		o->children[r] += ev->nresults;
		o->events[r]++;
		s->e_id = ev->id;
		fanout_event_free(ev);
		slot_finish(s);

		atomic_fetch_add_explicit(&o->received, 1,
					  memory_order_release);
		/* seq_cst pairs with the dispatcher's store to waiting and its
		 * re-check: either it sees the new seq or we see waiting. */
		atomic_fetch_add_explicit(&o->recv_seq, 1,
					  memory_order_seq_cst);
		if (atomic_load_explicit(&o->waiting, memory_order_seq_cst))
			bench_futex_wake(&o->recv_seq, 1);
	}
	return NULL;
}

/* Dispatcher: sleep until the consumer has received more than @than. */
static void wait_received_above(struct orch *o, uint64_t than)
{
	for (;;) {
		uint32_t seq = atomic_load_explicit(&o->recv_seq,
						    memory_order_seq_cst);
		if (atomic_load_explicit(&o->received, memory_order_acquire) >
		    than)
			return;
		atomic_store_explicit(&o->waiting, 1, memory_order_seq_cst);
		if (atomic_load_explicit(&o->received, memory_order_acquire) >
		    than) {
			atomic_store_explicit(&o->waiting, 0,
					      memory_order_relaxed);
			return;
		}
		struct timespec ts = {.tv_sec = 0, .tv_nsec = 100000000};
		bench_futex_wait(&o->recv_seq, seq, &ts);
		atomic_store_explicit(&o->waiting, 0, memory_order_relaxed);
	}
}

struct round_out {
	double children_s;
	double deleg_s;
	double dispatch_ns;
	uint64_t rejected;
	uint64_t delegations;
	uint64_t children;
};

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return (x > y) - (x < y);
}

static void orch_round(struct orch *o, unsigned round, uint64_t dur_ns,
		       uint64_t *dispatched, uint64_t *rng,
		       struct round_out *out)
{
	struct fanout_task tasks[ORCH_MAX_FANOUT];
	size_t cap = 1 << 20, ncost = 0;
	uint64_t *cost = malloc(cap * sizeof(*cost));
	if (!cost)
		bench_die("out of memory");
	memset(out, 0, sizeof(*out));
	uint64_t c0 = bench_children_total(), children = 0;
	unsigned next = 0;

	uint64_t t_start = bench_now_ns(), deadline = t_start + dur_ns;
	while (bench_now_ns() < deadline) {
		/* Bound what is in flight: dispatched - received < bound. */
		if (*dispatched - atomic_load_explicit(&o->received,
						       memory_order_acquire) >=
		    o->bound)
			wait_received_above(o, *dispatched - o->bound);

		struct oslot *s = &o->slots[next];
		while (atomic_load_explicit(&s->busy, memory_order_acquire))
			wait_received_above(o, atomic_load(&o->received));
		unsigned idx = next;
		next = (next + 1) % o->nslots;

		unsigned n = 1 + (unsigned)(bench_rand(rng) % ORCH_MAX_FANOUT);
		for (unsigned i = 0; i < n; i++) {
			uint64_t r = bench_rand(rng);
			tasks[i].goal = orch_goals[i];
			tasks[i].fn = bench_fo_child;
			tasks[i].arg = (r & 1) ? &orch_works[0] :
						 &orch_works[1 + (r >> 1) % 10];
		}
		s->gen++;
		s->ntasks = n;
		s->session = (unsigned)(bench_rand(rng) % ORCH_SESSIONS);
		s->round = round;
		s->ev_seen = false;
		s->d_id = s->e_id = 0;
		atomic_store_explicit(&s->phase, 0, memory_order_relaxed);
		atomic_store_explicit(&s->busy, 1, memory_order_release);
		struct fanout_batch batch = {
			.tasks = tasks,
			.ntasks = n,
			.context = orch_context,
			.session_key = orch_sessions[s->session],
			.user = (void *)(((uintptr_t)s->gen << 16) | idx),
		};
		fanout_id id = 0;
		for (;;) {
			s->t_call = fanout_now_ns();
			int rc = fanout_dispatch(o->e, &batch, &id);
			uint64_t t1 = fanout_now_ns();
			if (rc == 0) {
				if (ncost < cap)
					cost[ncost++] = t1 - s->t_call;
				break;
			}
			if (rc != -EBUSY)
				bench_die("fanout_dispatch: %s",
					  fanout_strerror(rc));
			out->rejected++;
			if (*dispatched == atomic_load(&o->received))
				bench_die("fanout_dispatch: -EBUSY with "
					  "nothing in "
					  "flight: %s",
					  fanout_strerror(rc));
			wait_received_above(o, atomic_load(&o->received));
		}
		if (id == 0)
			bench_die("fanout_dispatch returned id 0");
		s->d_id = id;
		(*dispatched)++;
		out->delegations++;
		children += n;
		slot_finish(s);
	}
	/* Drain: every dispatched delegation must deliver its event. */
	wait_received_above(o, *dispatched - 1);
	uint64_t t_end = bench_now_ns();
	if (o->children[round] != children ||
	    o->events[round] != out->delegations)
		bench_die("orchestrator: round %u dispatched %llu delegations "
			  "/ %llu "
			  "children, events reported %llu / %llu",
			  round, (unsigned long long)out->delegations,
			  (unsigned long long)children,
			  (unsigned long long)o->events[round],
			  (unsigned long long)o->children[round]);
	uint64_t ran = bench_children_total() - c0;
	if (ran != children)
		bench_die("orchestrator: %llu children reported but %llu ran",
			  (unsigned long long)children,
			  (unsigned long long)ran);
	double secs = (double)(t_end - t_start) / 1e9;
	out->children = children;
	out->children_s = (double)children / secs;
	out->deleg_s = (double)out->delegations / secs;
	qsort(cost, ncost, sizeof(*cost), cmp_u64);
	out->dispatch_ns = ncost ? (double)cost[ncost / 2] : NAN;
	free(cost);
}

void bench_orchestrator(void)
{
	struct orch o;
	memset(&o, 0, sizeof(o));
	orch_works[0] = bench_work_ns(0);
	for (unsigned k = 1; k <= 10; k++)
		orch_works[k] = bench_work_ns(k * 1000);
	for (unsigned i = 0; i < ORCH_MAX_FANOUT; i++)
		snprintf(orch_goals[i], sizeof(orch_goals[i]),
			 "research subtopic %u", i + 1);
	for (unsigned i = 0; i < ORCH_SESSIONS; i++)
		snprintf(orch_sessions[i], sizeof(orch_sessions[i]),
			 "session-%u", i);

	struct fanout_config cfg = {.max_async = 256};
	o.e = bench_fo_engine(bench_opt.nthreads, &cfg);
	o.sink = fanout_default_sink(o.e);
	o.bound = cfg.max_async;
	o.nslots = 2 * o.bound;
	o.slots = calloc(o.nslots, sizeof(*o.slots));
	if (!o.slots)
		bench_die("out of memory");
	unsigned rounds = bench_opt.rounds;
	if (rounds + 1 > ORCH_MAX_ROUNDS)
		rounds = ORCH_MAX_ROUNDS - 1;
	for (unsigned r = 0; r <= rounds; r++) {
		o.lat_e2e[r] = bench_hist_new();
		o.lat_lib[r] = bench_hist_new();
	}
	atomic_store(&o.final_dispatched, UINT64_MAX);

	pthread_t th;
	if (pthread_create(&th, NULL, consumer_main, &o))
		bench_die("pthread_create failed");

	uint64_t rng = 0x9E3779B97F4A7C15ull, dispatched = 0;
	uint64_t dur = (uint64_t)(3e9 * bench_opt.scale);
	struct round_out ro[ORCH_MAX_ROUNDS];
	/* round 0 is the warm-up and is not reported */
	orch_round(&o, 0, dur / 3, &dispatched, &rng, &ro[0]);
	for (unsigned r = 1; r <= rounds; r++)
		orch_round(&o, r, dur, &dispatched, &rng, &ro[r]);

	atomic_store_explicit(&o.final_dispatched, dispatched,
			      memory_order_release);
	pthread_join(th, NULL);
	/* Nothing extra may be left: exactly one event per delegation. */
	struct fanout_event *extra;
	if (fanout_poll(o.sink, &extra) != -EAGAIN)
		bench_die("orchestrator: an extra event is waiting after all "
			  "events arrived (duplicate)");
	struct fanout_stats st;
	if (fanout_stats(o.e, &st) == 0 && st.dispatched != dispatched)
		bench_die("orchestrator: stats say %llu dispatched, we counted "
			  "%llu",
			  (unsigned long long)st.dispatched,
			  (unsigned long long)dispatched);

	double cs[ORCH_MAX_ROUNDS], ds[ORCH_MAX_ROUNDS], dc[ORCH_MAX_ROUNDS];
	uint64_t rej = 0, deleg = 0, kids = 0;
	struct bench_hist *e2e = bench_hist_new(), *lib = bench_hist_new();
	for (unsigned r = 1; r <= rounds; r++) {
		cs[r - 1] = ro[r].children_s;
		ds[r - 1] = ro[r].deleg_s;
		dc[r - 1] = ro[r].dispatch_ns;
		rej += ro[r].rejected;
		deleg += ro[r].delegations;
		kids += ro[r].children;
		bench_hist_merge(e2e, o.lat_e2e[r]);
		bench_hist_merge(lib, o.lat_lib[r]);
	}
	const char *S = "orchestrator";
	bench_fig_add(S, "children/s", "fanout", bench_median(cs, rounds),
		      "1/s", BENCH_HIGHER);
	bench_fig_add(S, "delegations/s", "fanout", bench_median(ds, rounds),
		      "1/s", BENCH_HIGHER);
	bench_fig_add(S, "dispatch call", "fanout", bench_median(dc, rounds),
		      "ns", BENCH_LOWER);
	bench_fig_add(S, "e2e p50", "fanout", bench_hist_quantile(e2e, 0.5),
		      "ns", BENCH_LOWER);
	bench_fig_add(S, "e2e p99", "fanout", bench_hist_quantile(e2e, 0.99),
		      "ns", BENCH_LOWER);
	bench_fig_add(S, "e2e p999", "fanout", bench_hist_quantile(e2e, 0.999),
		      "ns", BENCH_LOWER);
	bench_fig_add(S, "lib p50", "fanout", bench_hist_quantile(lib, 0.5),
		      "ns", BENCH_LOWER);
	bench_fig_add(S, "lib p99", "fanout", bench_hist_quantile(lib, 0.99),
		      "ns", BENCH_LOWER);
	bench_fig_add(S, "lib p999", "fanout", bench_hist_quantile(lib, 0.999),
		      "ns", BENCH_LOWER);
	bench_fig_add(S, "rejected (-EBUSY)", "fanout", (double)rej, "",
		      BENCH_INFO);
	bench_fig_add(S, "delegations checked", "fanout", (double)deleg, "",
		      BENCH_INFO);
	bench_fig_add(S, "children checked", "fanout", (double)kids, "",
		      BENCH_INFO);

	FILE *f = bench_opt.out;
	fprintf(f,
		"\n== orchestrator load: fan-out 1..64, half no-op / half "
		"1..10 us children, up to %u in flight, %u rounds x %.1f s "
		"==\n",
		o.bound, rounds, (double)dur / 1e9);
	fprintf(f,
		"  children/s          %12.0f   (median of rounds; min %.0f, "
		"max %.0f)\n",
		bench_median(cs, rounds), bench_min(cs, rounds),
		bench_max(cs, rounds));
	fprintf(f, "  delegations/s       %12.0f\n", bench_median(ds, rounds));
	fprintf(f, "  dispatch call       %12.0f ns (median per call)\n",
		bench_median(dc, rounds));
	fprintf(f,
		"  e2e latency         p50 %.1f us  p99 %.1f us  p999 %.1f us  "
		"max %.1f us\n",
		bench_hist_quantile(e2e, 0.5) / 1e3,
		bench_hist_quantile(e2e, 0.99) / 1e3,
		bench_hist_quantile(e2e, 0.999) / 1e3, (double)e2e->max / 1e3);
	fprintf(f,
		"  lib latency         p50 %.1f us  p99 %.1f us  p999 %.1f us  "
		"max %.1f us\n",
		bench_hist_quantile(lib, 0.5) / 1e3,
		bench_hist_quantile(lib, 0.99) / 1e3,
		bench_hist_quantile(lib, 0.999) / 1e3, (double)lib->max / 1e3);
	fprintf(f, "    e2e = consumer's fanout_now_ns() after fanout_wait() - "
		   "fanout_now_ns() before fanout_dispatch();\n"
		   "    lib = ev->completed_ns - ev->dispatched_ns.  Pool kept "
		   "full, "
		   "so these include queueing.\n");
	fprintf(f, "  -EBUSY rejections   %12llu\n", (unsigned long long)rej);
	fprintf(f,
		"  verified            %llu delegations, %llu children: each "
		"event exactly once, right id,\n"
		"                      nresults, status, goals, session; child "
		"counters match\n",
		(unsigned long long)deleg, (unsigned long long)kids);

	bench_hist_free(e2e);
	bench_hist_free(lib);
	for (unsigned r = 0; r <= rounds; r++) {
		bench_hist_free(o.lat_e2e[r]);
		bench_hist_free(o.lat_lib[r]);
	}
	fanout_destroy(o.e);
	free(o.slots);
}

/* ------------------------------------------------ single-child latency */

static void latency_loop(struct fanout_engine *e, unsigned nsamples,
			 uint64_t gap_ns, struct bench_hist *he2e,
			 struct bench_hist *hlib, struct bench_hist *hcall)
{
	static struct bwork noop;
	struct fanout_task t = {.fn = bench_fo_child, .arg = &noop};
	struct fanout_batch b = {.tasks = &t, .ntasks = 1};
	struct fanout_sink *sink = fanout_default_sink(e);
	uint64_t c0 = bench_children_total();
	for (unsigned i = 0; i < nsamples; i++) {
		if (gap_ns)
			bench_sleep_ns(gap_ns);
		fanout_id id;
		struct fanout_event *ev;
		uint64_t t0 = fanout_now_ns();
		int rc = fanout_dispatch(e, &b, &id);
		uint64_t t1 = fanout_now_ns();
		if (rc)
			bench_die("fanout_dispatch: %s", fanout_strerror(rc));
		rc = fanout_wait(sink, &ev, 10000);
		uint64_t t2 = fanout_now_ns();
		if (rc)
			bench_die("fanout_wait: %s (event never arrived)",
				  fanout_strerror(rc));
		if (ev->id != id)
			bench_die("latency: event for another delegation");
		bench_fo_check_event(ev, 1, true);
		bench_hist_add(he2e, t2 - t0);
		bench_hist_add(hlib, ev->completed_ns - ev->dispatched_ns);
		bench_hist_add(hcall, t1 - t0);
		fanout_event_free(ev);
	}
	if (bench_children_total() - c0 != nsamples)
		bench_die("latency: children lost");
}

void bench_fanout_latency_quick(void)
{
	struct fanout_engine *e = bench_fo_engine(bench_opt.nthreads, NULL);
	FILE *f = bench_opt.out;
	struct {
		const char *name;
		uint64_t gap;
		unsigned n;
	} modes[] = {
		{"hot", 0, (unsigned)(20000 * bench_opt.scale)},
		{"parked", 2000000, (unsigned)(200 * bench_opt.scale)},
	};
	fprintf(f,
		"\n== fanout single-child latency, closed loop (dispatch, then "
		"fanout_wait on the same thread), %u rounds ==\n",
		bench_opt.rounds);
	fprintf(f, "  %-7s %-5s %9s %9s %9s %9s   (us)\n", "workers", "clock",
		"p50", "p99", "p999", "max");
	{
		/* warm-up, not reported */
		struct bench_hist *w1 = bench_hist_new(),
				  *w2 = bench_hist_new(),
				  *w3 = bench_hist_new();
		latency_loop(e, 2000, 0, w1, w2, w3);
		bench_hist_free(w1);
		bench_hist_free(w2);
		bench_hist_free(w3);
	}
	for (size_t m = 0; m < BENCH_ARRAY_SIZE(modes); m++) {
		struct bench_hist *he = bench_hist_new(),
				  *hl = bench_hist_new(),
				  *hc = bench_hist_new();
		for (unsigned r = 0; r < bench_opt.rounds; r++)
			latency_loop(e, modes[m].n ? modes[m].n : 1,
				     modes[m].gap, he, hl, hc);
		char scen[40];
		snprintf(scen, sizeof(scen), "fanout latency %s",
			 modes[m].name);
		static const double qs[] = {0.5, 0.99, 0.999, 1.0};
		static const char *qn[] = {"p50", "p99", "p999", "max"};
		for (int k = 0; k < 4; k++) {
			char met[48];
			snprintf(met, sizeof(met), "e2e %s", qn[k]);
			bench_fig_add(scen, met, "fanout",
				      bench_hist_quantile(he, qs[k]), "ns",
				      BENCH_LOWER);
			snprintf(met, sizeof(met), "lib %s", qn[k]);
			bench_fig_add(scen, met, "fanout",
				      bench_hist_quantile(hl, qs[k]), "ns",
				      BENCH_LOWER);
		}
		bench_fig_add(scen, "dispatch call p50", "fanout",
			      bench_hist_quantile(hc, 0.5), "ns", BENCH_LOWER);
		fprintf(f, "  %-7s %-5s %9.2f %9.2f %9.2f %9.2f\n",
			modes[m].name, "e2e",
			bench_hist_quantile(he, 0.5) / 1e3,
			bench_hist_quantile(he, 0.99) / 1e3,
			bench_hist_quantile(he, 0.999) / 1e3,
			(double)he->max / 1e3);
		fprintf(f, "  %-7s %-5s %9.2f %9.2f %9.2f %9.2f\n", "", "lib",
			bench_hist_quantile(hl, 0.5) / 1e3,
			bench_hist_quantile(hl, 0.99) / 1e3,
			bench_hist_quantile(hl, 0.999) / 1e3,
			(double)hl->max / 1e3);
		fprintf(f, "  %-7s %-5s %9.2f %9.2f %9.2f %9.2f\n", "", "call",
			bench_hist_quantile(hc, 0.5) / 1e3,
			bench_hist_quantile(hc, 0.99) / 1e3,
			bench_hist_quantile(hc, 0.999) / 1e3,
			(double)hc->max / 1e3);
		bench_hist_free(he);
		bench_hist_free(hl);
		bench_hist_free(hc);
	}
	fprintf(f,
		"    e2e = before fanout_dispatch() -> fanout_wait() returned; "
		"lib = ev->completed_ns - ev->dispatched_ns;\n"
		"    call = the fanout_dispatch() call alone.  parked = 2 ms "
		"idle "
		"before each sample (> spin_ns).\n");
	fanout_destroy(e);
}
