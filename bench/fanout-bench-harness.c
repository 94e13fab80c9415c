/* SPDX-License-Identifier: MIT */
/*
 * fanout-bench-harness.c - the driver loops shared by every peer.
 *
 * Each measurement is a "job" run through the peer's enter() hook, so a peer
 * whose API only works inside its own context (OpenMP: a parallel region
 * with one producer inside `single`) runs exactly the same loop as the rest.
 */
/* fanout.h first: it decides whether FANOUT_NO_CHILD_CLOCK (and so the
 * fanout_noclock peer) exists. */
#include <fanout.h>

#include "bench-harness.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const struct peer_ops *const all_peers[] = {
	&peer_fanout_dispatch,
	&peer_fanout_help,
#ifdef FANOUT_NO_CHILD_CLOCK
	&peer_fanout_noclock,
#endif
#ifdef FANOUT_RUNNERS_ON_DEMAND
	&peer_fanout_ondemand,
#endif
	&peer_fanout_run,
#ifdef BENCH_HAVE_PEERS
	&peer_mutexpool,
	&peer_uv,
	&peer_glib,
	&peer_omp,
	&peer_tbb,
#endif
};

static struct peer_inst insts[BENCH_ARRAY_SIZE(all_peers)];
static size_t ninsts;

size_t hx_count(void)
{
	return ninsts;
}

struct peer_inst *hx_at(size_t i)
{
	return i < ninsts ? &insts[i] : NULL;
}

struct peer_inst *hx_find(const char *name)
{
	for (size_t i = 0; i < ninsts; i++)
		if (!strcmp(insts[i].ops->name, name))
			return &insts[i];
	return NULL;
}

struct hx_job {
	struct peer_inst *p;
	unsigned n, inflight, nsamples;
	const struct bwork *w;
	uint64_t dur_ns, gap_ns;
	struct bench_hist *h;
	double result;
};

static void enter(struct peer_inst *p, void (*body)(void *), struct hx_job *j)
{
	if (p->ops->enter)
		p->ops->enter(p->ctx, body, j);
	else
		body(j);
}

/* ----------------------------------------------------------- throughput */

static void tp_body(void *arg)
{
	struct hx_job *j = arg;
	struct peer_inst *p = j->p;
	const struct peer_ops *o = p->ops;
	unsigned k = j->inflight, n = j->n;
	uint64_t done = 0;

	/* Small batches in flight look at the clock every 16th batch only, so
	 * that the driver's own clock reads stay a small part of each child. */
	unsigned every = n >= 64 ? 1 : 16, tick = 0;
	uint64_t c0 = bench_children_total();
	uint64_t t0 = bench_now_ns(), deadline = t0 + j->dur_ns;
	p->last_batch_p50 = NAN;
	if (k == 1) {
		/* One batch at a time: time each one as well; the clock reads
		 * are per batch, so they cost < 1% of a batch of 64. */
		struct bench_hist *h = bench_hist_new();
		uint64_t tb = t0, now;
		do {
			if (o->run) {
				o->run(p->ctx, p->batches[0], n, j->w);
			} else {
				o->submit(p->ctx, p->batches[0], n, j->w);
				o->join(p->ctx, p->batches[0]);
			}
			done += n;
			now = bench_now_ns();
			bench_hist_add(h, now - tb);
			tb = now;
		} while (now < deadline);
		p->last_batch_p50 = bench_hist_quantile(h, 0.5);
		bench_hist_free(h);
	} else {
		unsigned head = 0, live = 0;
		bool stop = false;
		for (unsigned i = 0; i < k; i++, live++)
			o->submit(p->ctx, p->batches[i], n, j->w);
		while (live) {
			o->join(p->ctx, p->batches[head]);
			done += n;
			live--;
			if (!stop && ++tick % every == 0 &&
			    bench_now_ns() >= deadline)
				stop = true;
			if (!stop) {
				o->submit(p->ctx, p->batches[head], n, j->w);
				live++;
			}
			head = (head + 1) % k;
		}
	}
	uint64_t t1 = bench_now_ns();
	uint64_t ran = bench_children_total() - c0;
	if (ran != done)
		bench_die("%s: %llu children joined but %llu ran (batch %u, %u "
			  "in "
			  "flight)",
			  o->name, (unsigned long long)done,
			  (unsigned long long)ran, n, k);
	j->result = (double)done * 1e9 / (double)(t1 - t0);
}

/*
 * Let the peer that ran before go idle.  libgomp's team threads spin for
 * milliseconds after a parallel region, and while they held the CPUs the
 * next peer's own workers got little of them: oneTBB, which follows
 * OpenMP in every round, then ran its small batches on the waiting thread
 * alone and read 3.19-3.27M children/s at batch 1 x16 (4.34-4.62M at 8
 * x2) against 2.52-2.76M (3.1-3.96M) after a pause of 5 ms or more
 * (bench/PROFILE.txt phase 16).  Every peer's turn starts after one.
 */
#define SETTLE_NS 10000000L

static void settle(void)
{
	struct timespec ts = {0, SETTLE_NS};

	while (nanosleep(&ts, &ts) && errno == EINTR)
		;
}

double hx_throughput(struct peer_inst *p, unsigned n, unsigned inflight,
		     const struct bwork *w, uint64_t dur_ns)
{
	if (inflight > p->nbatches || n > p->maxn)
		bench_die("hx_throughput: %u in flight / batch %u too big",
			  inflight, n);
	if (inflight > 1 && !p->ops->submit)
		return NAN;
	if (!p->ops->submit && !p->ops->run)
		return NAN;
	struct hx_job j = {
		.p = p, .n = n, .inflight = inflight, .w = w, .dur_ns = dur_ns};
	settle();
	enter(p, tp_body, &j);
	return j.result;
}

/* ----------------------------------------------------------- submit cost */

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return (x > y) - (x < y);
}

static void sc_body(void *arg)
{
	struct hx_job *j = arg;
	struct peer_inst *p = j->p;
	const struct peer_ops *o = p->ops;
	static const struct bwork noop;
	size_t cap = 1 << 16, ns = 0;
	uint64_t *s = malloc(cap * sizeof(*s));
	if (!s)
		bench_die("out of memory");
	uint64_t c0 = bench_children_total(), done = 0;
	uint64_t deadline = bench_now_ns() + j->dur_ns;
	do {
		uint64_t t0 = bench_now_ns();
		o->submit(p->ctx, p->batches[0], j->n, &noop);
		uint64_t t1 = bench_now_ns();
		o->join(p->ctx, p->batches[0]);
		done += j->n;
		s[ns++] = t1 - t0;
	} while (ns < cap && bench_now_ns() < deadline);
	if (bench_children_total() - c0 != done)
		bench_die("%s: submit-cost run lost children", o->name);
	qsort(s, ns, sizeof(*s), cmp_u64);
	j->result = (double)s[ns / 2];
	free(s);
}

double hx_submit_cost(struct peer_inst *p, unsigned n, uint64_t dur_ns)
{
	if (!p->ops->submit)
		return NAN;
	struct hx_job j = {.p = p, .n = n, .dur_ns = dur_ns};
	enter(p, sc_body, &j);
	return j.result;
}

/* ----------------------------------------------------------- latency */

static void lat_body(void *arg)
{
	struct hx_job *j = arg;
	struct peer_inst *p = j->p;
	const struct peer_ops *o = p->ops;
	static const struct bwork noop;
	uint64_t c0 = bench_children_total();
	for (unsigned i = 0; i < j->nsamples; i++) {
		if (j->gap_ns)
			bench_sleep_ns(j->gap_ns);
		uint64_t t0 = bench_now_ns();
		if (o->run) {
			o->run(p->ctx, p->batches[0], 1, &noop);
		} else {
			o->submit(p->ctx, p->batches[0], 1, &noop);
			o->join(p->ctx, p->batches[0]);
		}
		bench_hist_add(j->h, bench_now_ns() - t0);
	}
	if (bench_children_total() - c0 != j->nsamples)
		bench_die("%s: latency run lost children", o->name);
}

void hx_latency(struct peer_inst *p, unsigned nsamples, uint64_t gap_ns,
		struct bench_hist *h)
{
	struct hx_job j = {
		.p = p, .nsamples = nsamples, .gap_ns = gap_ns, .h = h};
	enter(p, lat_body, &j);
}

/* ----------------------------------------------------------- idle CPU */

uint64_t hx_idle_cpu(struct peer_inst *p, uint64_t idle_ns)
{
	uint64_t *c0 = calloc(p->ntids + 1, sizeof(*c0));
	if (!c0)
		bench_die("out of memory");
	for (size_t i = 0; i < p->ntids; i++)
		c0[i] = bench_thread_cpu_ns(p->tids[i]);
	bench_sleep_ns(idle_ns);
	uint64_t used = 0;
	for (size_t i = 0; i < p->ntids; i++) {
		uint64_t c1 = bench_thread_cpu_ns(p->tids[i]);
		if (c1 > c0[i])
			used += c1 - c0[i];
	}
	free(c0);
	return used;
}

/* ----------------------------------------------------------- lifecycle */

#define MAX_TIDS 4096

static size_t new_tids(const pid_t *before, size_t nb, pid_t **out)
{
	pid_t *now = malloc(MAX_TIDS * sizeof(*now));
	pid_t *res = malloc(MAX_TIDS * sizeof(*res));
	if (!now || !res)
		bench_die("out of memory");
	size_t nn = bench_list_tids(now, MAX_TIDS), nr = 0;
	for (size_t i = 0; i < nn; i++) {
		bool old = false;
		for (size_t k = 0; k < nb && !old; k++)
			old = before[k] == now[i];
		if (!old)
			res[nr++] = now[i];
	}
	free(now);
	*out = res;
	return nr;
}

void hx_start_all(bool fanout_only)
{
	static const struct bwork noop;
	pid_t *before = malloc(MAX_TIDS * sizeof(*before));
	if (!before)
		bench_die("out of memory");
	for (size_t i = 0; i < BENCH_ARRAY_SIZE(all_peers); i++) {
		struct peer_inst *p = &insts[ninsts];
		memset(p, 0, sizeof(*p));
		p->ops = all_peers[i];
		if (fanout_only && strncmp(p->ops->name, "fanout", 6))
			continue;
		if (!bench_in_list(bench_opt.peers, p->ops->name))
			continue;
		size_t nb = bench_list_tids(before, MAX_TIDS);
		int rc = p->ops->create(bench_opt.nthreads, &p->ctx);
		if (rc) {
			fprintf(stderr,
				"fanout-bench: peer %s unavailable (%d), "
				"left out\n",
				p->ops->name, rc);
			continue;
		}
		p->maxn = HX_MAX_BATCH;
		p->nbatches = HX_MAX_INFLIGHT;
		p->batches = calloc(p->nbatches, sizeof(*p->batches));
		if (!p->batches)
			bench_die("out of memory");
		for (unsigned b = 0; b < p->nbatches; b++)
			p->batches[b] = p->ops->batch_new(p->ctx, p->maxn);
		/* Warm up: lazily created threads appear now and count as its. */
		hx_throughput(p, 64, 1, &noop, 20000000);
		if (p->ops->submit)
			hx_throughput(p, 1, 16, &noop, 20000000);
		p->ntids = new_tids(before, nb, &p->tids);
		ninsts++;
		bench_note("peer %s: %zu threads", p->ops->name, p->ntids);
	}
	free(before);
}

void hx_stop_all(void)
{
	for (size_t i = 0; i < ninsts; i++) {
		struct peer_inst *p = &insts[i];
		for (unsigned b = 0; b < p->nbatches; b++)
			p->ops->batch_free(p->ctx, p->batches[b]);
		free(p->batches);
		p->ops->destroy(p->ctx);
		free(p->tids);
	}
	ninsts = 0;
}
