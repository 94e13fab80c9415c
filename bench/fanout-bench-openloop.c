/* SPDX-License-Identifier: MIT */
/*
 * fanout-bench-openloop.c - single-child latency with open-loop arrivals.
 *
 * The sender (main thread) issues request i at its intended time
 * t0 + i * period, sleeping until then (clock_nanosleep, timer slack 1 ns;
 * it does not spin, so on a small machine it takes no CPU from the workers,
 * like a server thread waiting in epoll).
 * Latency is measured from that intended time, not from when the sender
 * got round to it: if the engine (or anything) holds the sender up, the
 * delay is charged to every request that was due meanwhile, so there is no
 * coordinated omission.
 *
 *   fanout:  fanout_dispatch() from the sender; a consumer thread takes the
 *            events with fanout_wait() and stamps them.
 *   peers that allow it (submit and join from different threads): a joiner
 *            thread joins the batches in order and stamps them.
 */
#include "bench-fanout.h"
#include "bench-harness.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>

#define OL_SLOTS 8192

struct ol_slot {
	uint64_t t_int;
	_Atomic uint32_t busy;
};

struct ol {
	struct ol_slot *slots;
	unsigned nslots;
	uint64_t n;
	struct bench_hist *h;
	_Atomic uint64_t posted;   /* sender -> joiner */
	_Atomic uint32_t post_seq; /* futex word for posted */
	_Atomic uint32_t joiner_waiting;
	struct fanout_sink *sink;
	struct peer_inst *p;
	uint64_t rejected;
};

static void wait_until(uint64_t t)
{
	struct timespec ts = {.tv_sec = (time_t)(t / 1000000000ull),
			      .tv_nsec = (long)(t % 1000000000ull)};
	while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) ==
	       EINTR)
		;
}

static void *fo_consumer(void *arg)
{
	struct ol *o = arg;
	for (uint64_t i = 0; i < o->n; i++) {
		struct fanout_event *ev;
		int rc = fanout_wait(o->sink, &ev, 10000);
		uint64_t now = bench_now_ns();
		if (rc)
			bench_die("open loop: fanout_wait: %s (event never "
				  "arrived)",
				  fanout_strerror(rc));
		unsigned idx = (unsigned)(uintptr_t)ev->user;
		if (idx >= o->nslots || !atomic_load(&o->slots[idx].busy))
			bench_die("open loop: event for no request in flight");
		bench_fo_check_event(ev, 1, false);
		bench_hist_add(o->h, now - o->slots[idx].t_int);
		fanout_event_free(ev);
		atomic_store_explicit(&o->slots[idx].busy, 0,
				      memory_order_release);
	}
	return NULL;
}

static void ol_fanout(uint64_t period, uint64_t n, struct bench_hist *h,
		      uint64_t *rejected)
{
	static struct bwork noop;
	struct fanout_engine *e = bench_fo_engine(bench_opt.nthreads, NULL);
	struct ol o = {.n = n, .h = h, .nslots = OL_SLOTS};
	o.slots = calloc(o.nslots, sizeof(*o.slots));
	if (!o.slots)
		bench_die("out of memory");
	o.sink = fanout_default_sink(e);
	pthread_t th;
	if (pthread_create(&th, NULL, fo_consumer, &o))
		bench_die("pthread_create failed");
	struct fanout_task t = {.fn = bench_fo_child, .arg = &noop};
	uint64_t c0 = bench_children_total();
	uint64_t t0 = bench_now_ns() + 1000000;
	for (uint64_t i = 0; i < n; i++) {
		uint64_t ti = t0 + i * period;
		wait_until(ti);
		unsigned idx = (unsigned)(i % o.nslots);
		while (atomic_load_explicit(&o.slots[idx].busy,
					    memory_order_acquire))
			sched_yield();
		o.slots[idx].t_int = ti;
		atomic_store_explicit(&o.slots[idx].busy, 1,
				      memory_order_release);
		struct fanout_batch b = {.tasks = &t,
					 .ntasks = 1,
					 .user = (void *)(uintptr_t)idx};
		for (;;) {
			int rc = fanout_dispatch(e, &b, NULL);
			if (rc == 0)
				break;
			if (rc != -EBUSY)
				bench_die("open loop: fanout_dispatch: %s",
					  fanout_strerror(rc));
			(*rejected)++;
			sched_yield();
		}
	}
	pthread_join(th, NULL);
	if (bench_children_total() - c0 != n)
		bench_die("open loop: children lost");
	free(o.slots);
	fanout_destroy(e);
}

static void *peer_joiner(void *arg)
{
	struct ol *o = arg;
	struct peer_inst *p = o->p;
	for (uint64_t i = 0; i < o->n; i++) {
		for (;;) {
			uint32_t seq = atomic_load(&o->post_seq);
			if (atomic_load(&o->posted) > i)
				break;
			atomic_store(&o->joiner_waiting, 1);
			if (atomic_load(&o->posted) > i) {
				atomic_store(&o->joiner_waiting, 0);
				break;
			}
			bench_futex_wait(&o->post_seq, seq, NULL);
			atomic_store(&o->joiner_waiting, 0);
		}
		unsigned idx = (unsigned)(i % o->nslots);
		p->ops->join(p->ctx, p->batches[idx]);
		uint64_t now = bench_now_ns();
		bench_hist_add(o->h, now - o->slots[idx].t_int);
		atomic_store_explicit(&o->slots[idx].busy, 0,
				      memory_order_release);
	}
	return NULL;
}

static void ol_peer(struct peer_inst *p, uint64_t period, uint64_t n,
		    struct bench_hist *h)
{
	static struct bwork noop;
	struct ol o = {.n = n, .h = h, .nslots = p->nbatches, .p = p};
	o.slots = calloc(o.nslots, sizeof(*o.slots));
	if (!o.slots)
		bench_die("out of memory");
	pthread_t th;
	if (pthread_create(&th, NULL, peer_joiner, &o))
		bench_die("pthread_create failed");
	uint64_t c0 = bench_children_total();
	uint64_t t0 = bench_now_ns() + 1000000;
	for (uint64_t i = 0; i < n; i++) {
		uint64_t ti = t0 + i * period;
		wait_until(ti);
		unsigned idx = (unsigned)(i % o.nslots);
		while (atomic_load_explicit(&o.slots[idx].busy,
					    memory_order_acquire))
			sched_yield();
		o.slots[idx].t_int = ti;
		atomic_store_explicit(&o.slots[idx].busy, 1,
				      memory_order_release);
		p->ops->submit(p->ctx, p->batches[idx], 1, &noop);
		atomic_fetch_add(&o.posted, 1);
		atomic_fetch_add(&o.post_seq, 1);
		if (atomic_load(&o.joiner_waiting))
			bench_futex_wake(&o.post_seq, 1);
	}
	pthread_join(th, NULL);
	if (bench_children_total() - c0 != n)
		bench_die("open loop: %s lost children", p->ops->name);
	free(o.slots);
}

void bench_open_loop(void)
{
	struct {
		const char *name;
		uint64_t rate;
		double secs;
	} rates[] = {
		{"20k/s", 20000, 0.5},
		{"1k/s", 1000, 1.5},
	};
	FILE *f = bench_opt.out;
	/* Fine-grained sleeps for the sender. */
	prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
	fprintf(f, "\n== open-loop single-child latency, fixed arrival rate, "
		   "measured from the intended send time (us) ==\n");
	fprintf(f, "  %-7s %-11s %9s %9s %9s %9s %9s %8s\n", "rate", "peer",
		"p50", "p90", "p99", "p999", "max", "samples");
	for (size_t r = 0; r < BENCH_ARRAY_SIZE(rates); r++) {
		uint64_t period = 1000000000ull / rates[r].rate;
		uint64_t n = (uint64_t)(rates[r].rate * rates[r].secs *
					bench_opt.scale);
		if (n < 100)
			n = 100;
		/* fanout first, then every peer that can be driven open-loop */
		for (size_t pi = 0; pi <= hx_count(); pi++) {
			struct peer_inst *p = pi ? hx_at(pi - 1) : NULL;
			if (p && (!p->ops->split_ok || !p->ops->submit))
				continue;
			const char *name = p ? p->ops->name : "fanout";
			struct bench_hist *h = bench_hist_new();
			uint64_t rej = 0;
			if (p)
				ol_peer(p, period, n, h);
			else
				ol_fanout(period, n, h, &rej);
			char scen[40];
			snprintf(scen, sizeof(scen), "open loop %s",
				 rates[r].name);
			static const double qs[] = {0.5, 0.9, 0.99, 0.999, 1.0};
			static const char *qn[] = {"p50", "p90", "p99", "p999",
						   "max"};
			for (int k = 0; k < 5; k++)
				bench_fig_add(scen, qn[k], name,
					      bench_hist_quantile(h, qs[k]),
					      "ns", BENCH_LOWER);
			fprintf(f,
				"  %-7s %-11s %9.2f %9.2f %9.2f %9.2f %9.2f "
				"%8llu%s\n",
				rates[r].name, name,
				bench_hist_quantile(h, 0.5) / 1e3,
				bench_hist_quantile(h, 0.9) / 1e3,
				bench_hist_quantile(h, 0.99) / 1e3,
				bench_hist_quantile(h, 0.999) / 1e3,
				(double)h->max / 1e3,
				(unsigned long long)h->count,
				rej ? " (-EBUSY retried)" : "");
			bench_hist_free(h);
		}
	}
}
