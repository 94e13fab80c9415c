/* SPDX-License-Identifier: MIT */
/*
 * bench-harness.h - running one workload on every peer the same way.
 */
#ifndef BENCH_HARNESS_H
#define BENCH_HARNESS_H

#include "bench.h"

/* A started peer: its engine, pre-allocated batches, the threads it made. */
struct peer_inst {
	const struct peer_ops *ops;
	void *ctx;
	void **batches;
	unsigned nbatches;
	unsigned maxn;
	pid_t *tids; /* threads that appeared when it started and warmed up */
	size_t ntids;
	/* hx_throughput with one batch in flight: the median time of one
	 * batch (submit to join), robust to preemption; NaN otherwise */
	double last_batch_p50;
};

#define HX_MAX_INFLIGHT 64
#define HX_MAX_BATCH 4096

/* Start every compiled-in peer (or only fanout's two adapters) with
 * bench_opt.nthreads threads. */
void hx_start_all(bool fanout_only);
void hx_stop_all(void);
size_t hx_count(void);
struct peer_inst *hx_at(size_t i);
struct peer_inst *hx_find(const char *name);

/*
 * hx_throughput() - children per second: @n children per batch, @inflight
 * batches kept in flight (join the oldest, submit a new one), for @dur_ns.
 * NaN when the peer cannot do it (no asynchronous submit for inflight > 1).
 * Aborts unless exactly the counted children ran.
 */
double hx_throughput(struct peer_inst *p, unsigned n, unsigned inflight,
		     const struct bwork *w, uint64_t dur_ns);

/* Median time of the submit call alone for batches of @n; NaN without submit. */
double hx_submit_cost(struct peer_inst *p, unsigned n, uint64_t dur_ns);

/*
 * hx_latency() - closed loop, one child per batch: time from the submit
 * call to the return of join (the caller's view of "dispatch -> event
 * received").  @gap_ns of idle time before each sample (0 = back to back,
 * workers hot).  Adds @nsamples values to @h.
 */
void hx_latency(struct peer_inst *p, unsigned nsamples, uint64_t gap_ns,
		struct bench_hist *h);

/* CPU time (ns) the peer's own threads used during @idle_ns of no work. */
uint64_t hx_idle_cpu(struct peer_inst *p, uint64_t idle_ns);

#endif /* BENCH_HARNESS_H */
