/* SPDX-License-Identifier: MIT */
/*
 * fanout-bench-limits.c - the physical limits, measured in the same run:
 *
 *   pingpong   round trip of one cache line between two threads pinned to
 *              CPU 0 and CPU 1 (plain loads/stores, no pause: the fastest a
 *              hand-off can be answered);
 *   ck_ring    cost per item of a raw ck_ring SPSC stream, producer pinned
 *              to CPU 0, consumer to CPU 1 (total time / items);
 *   futex      round trip of two threads that each sleep in FUTEX_WAIT and
 *              wake the other with FUTEX_WAKE (what waking a parked worker
 *              and being woken by it costs).
 *
 * With one CPU the pinned pairs share it; the figures are then what that
 * machine can do, and still the reference for the ratios.
 */
#include "bench.h"

#include <ck_pr.h>
#include <ck_ring.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

struct pair {
	void *(*fn_a)(void *);
	void *(*fn_b)(void *);
	uint64_t iters;
	_Atomic uint32_t ready;
	uint64_t elapsed;
	uint64_t t_start, t_end; /* ring: producer's first, consumer's last */
	/* ping-pong line */
	_Alignas(BENCH_CACHELINE) _Atomic uint64_t flag;
	/* futex words, each on its own line */
	_Alignas(BENCH_CACHELINE) _Atomic uint32_t fa;
	_Alignas(BENCH_CACHELINE) _Atomic uint32_t fb;
	/* ring */
	_Alignas(BENCH_CACHELINE) ck_ring_t ring;
	ck_ring_buffer_t *buf;
};

static int cpu_of(int k)
{
	return bench_ncpus() > 1 ? k : 0;
}

static void start_gate(struct pair *p)
{
	atomic_fetch_add(&p->ready, 1);
	while (atomic_load(&p->ready) < 2)
		ck_pr_stall();
}

static void *pp_a(void *arg)
{
	struct pair *p = arg;
	bench_pin_self(cpu_of(0));
	start_gate(p);
	uint64_t t0 = bench_now_ns();
	for (uint64_t i = 1; i <= p->iters; i++) {
		atomic_store_explicit(&p->flag, 2 * i - 1, memory_order_release);
		while (atomic_load_explicit(&p->flag, memory_order_acquire) != 2 * i)
			;
	}
	p->elapsed = bench_now_ns() - t0;
	return NULL;
}

static void *pp_b(void *arg)
{
	struct pair *p = arg;
	bench_pin_self(cpu_of(1));
	start_gate(p);
	for (uint64_t i = 1; i <= p->iters; i++) {
		while (atomic_load_explicit(&p->flag, memory_order_acquire) != 2 * i - 1)
			;
		atomic_store_explicit(&p->flag, 2 * i, memory_order_release);
	}
	return NULL;
}

static void *ring_prod(void *arg)
{
	struct pair *p = arg;
	bench_pin_self(cpu_of(0));
	start_gate(p);
	p->t_start = bench_now_ns();
	for (uintptr_t i = 1; i <= p->iters; i++)
		while (!ck_ring_enqueue_spsc(&p->ring, p->buf, (void *)i))
			ck_pr_stall();
	return NULL;
}

static void *ring_cons(void *arg)
{
	struct pair *p = arg;
	bench_pin_self(cpu_of(1));
	start_gate(p);
	void *v;
	for (uintptr_t i = 1; i <= p->iters; i++) {
		while (!ck_ring_dequeue_spsc(&p->ring, p->buf, &v))
			ck_pr_stall();
		if ((uintptr_t)v != i)
			bench_die("ck_ring delivered %zu, expected %zu", (size_t)(uintptr_t)v,
				  (size_t)i);
	}
	p->t_end = bench_now_ns();
	return NULL;
}

static void *fx_a(void *arg)
{
	struct pair *p = arg;
	bench_pin_self(cpu_of(0));
	start_gate(p);
	uint64_t t0 = bench_now_ns();
	for (uint64_t i = 0; i < p->iters; i++) {
		atomic_store(&p->fb, 1);
		bench_futex_wake(&p->fb, 1);
		while (atomic_load(&p->fa) == 0)
			bench_futex_wait(&p->fa, 0, NULL);
		atomic_store(&p->fa, 0);
	}
	p->elapsed = bench_now_ns() - t0;
	return NULL;
}

static void *fx_b(void *arg)
{
	struct pair *p = arg;
	bench_pin_self(cpu_of(1));
	start_gate(p);
	for (uint64_t i = 0; i < p->iters; i++) {
		while (atomic_load(&p->fb) == 0)
			bench_futex_wait(&p->fb, 0, NULL);
		atomic_store(&p->fb, 0);
		atomic_store(&p->fa, 1);
		bench_futex_wake(&p->fa, 1);
	}
	return NULL;
}

static double run_pair(void *(*a)(void *), void *(*b)(void *), uint64_t iters,
		       bool ring)
{
	struct pair *p = aligned_alloc(BENCH_CACHELINE,
				       (sizeof(*p) + BENCH_CACHELINE - 1) &
					       ~(size_t)(BENCH_CACHELINE - 1));
	if (!p)
		bench_die("out of memory");
	memset(p, 0, sizeof(*p));
	p->iters = iters;
	if (ring) {
		p->buf = aligned_alloc(BENCH_CACHELINE, 1024 * sizeof(*p->buf));
		if (!p->buf)
			bench_die("out of memory");
		ck_ring_init(&p->ring, 1024);
	}
	pthread_t ta, tb;
	if (pthread_create(&ta, NULL, a, p) || pthread_create(&tb, NULL, b, p))
		bench_die("pthread_create failed");
	pthread_join(ta, NULL);
	pthread_join(tb, NULL);
	double per;
	if (ring)
		per = (double)(p->t_end - p->t_start) / (double)iters;
	else
		per = (double)p->elapsed / (double)iters;
	free(p->buf);
	free(p);
	return per;
}

double bench_limit_pingpong, bench_limit_ring, bench_limit_futex;

void bench_limits(void)
{
	unsigned R = bench_opt.rounds;
	double *pp = calloc(R, sizeof(double)), *rg = calloc(R, sizeof(double)),
	       *fx = calloc(R, sizeof(double));
	uint64_t npp = (uint64_t)(200000 * bench_opt.scale) + 1000;
	uint64_t nrg = (uint64_t)(5000000 * bench_opt.scale) + 1000;
	uint64_t nfx = (uint64_t)(10000 * bench_opt.scale) + 100;
	/* warm-up */
	run_pair(pp_a, pp_b, npp / 10, false);
	run_pair(ring_prod, ring_cons, nrg / 10, true);
	run_pair(fx_a, fx_b, nfx / 10, false);
	for (unsigned r = 0; r < R; r++) {
		pp[r] = run_pair(pp_a, pp_b, npp, false);
		rg[r] = run_pair(ring_prod, ring_cons, nrg, true);
		fx[r] = run_pair(fx_a, fx_b, nfx, false);
	}
	bench_limit_pingpong = bench_median(pp, R);
	bench_limit_ring = bench_median(rg, R);
	bench_limit_futex = bench_median(fx, R);
	bench_fig_add("limits", "cache-line ping-pong RTT", "limit",
		      bench_limit_pingpong, "ns", BENCH_LOWER);
	bench_fig_add("limits", "ck_ring SPSC per item", "limit", bench_limit_ring,
		      "ns", BENCH_LOWER);
	bench_fig_add("limits", "futex wake RTT", "limit", bench_limit_futex, "ns",
		      BENCH_LOWER);
	FILE *f = bench_opt.out;
	fprintf(f, "\n== physical limits (threads pinned to CPU %d and %d; median "
		"of %u rounds) ==\n", cpu_of(0), cpu_of(1), R);
	fprintf(f, "  cache-line ping-pong round trip  %9.1f ns   (min %.1f, max "
		"%.1f)\n", bench_limit_pingpong, bench_min(pp, R), bench_max(pp, R));
	fprintf(f, "  raw ck_ring SPSC handoff         %9.1f ns/item (min %.1f, "
		"max %.1f)\n", bench_limit_ring, bench_min(rg, R), bench_max(rg, R));
	fprintf(f, "  futex wake round trip            %9.1f ns   (min %.1f, max "
		"%.1f)\n", bench_limit_futex, bench_min(fx, R), bench_max(fx, R));
	free(pp);
	free(rg);
	free(fx);
}
