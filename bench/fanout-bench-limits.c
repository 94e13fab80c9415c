/* SPDX-License-Identifier: MIT */
/*
 * fanout-bench-limits.c - the physical limits, measured in the same run:
 *
 *   pingpong   round trip of one cache line between two threads pinned to
 *              CPU 0 and CPU 1 (plain loads/stores, no pause: the fastest a
 *              hand-off can be answered);
 *   ck_ring    cost per item of a raw ck_ring SPSC stream, producer pinned
 *              to CPU 0, consumer to CPU 1;
 *   rt tail    the same ping-pong timed one round trip at a time, as the
 *              hot latency scenario times fanout (the clock read around
 *              each sample): its p50 and p999 are the best a hand-off to
 *              another thread can do on this host, tail included;
 *   rt tail k  the same with k round trips per sample, k chosen in the
 *              set at the end of the run so that a sample lasts about as
 *              long as fanout's hot single child (its p50 / the rt tail's
 *              p50): a stall of the host lands in a sample in proportion
 *              to the sample's length, so this is the tail floor of an
 *              exchange as long as fanout's (bar 5);
 *   futex      round trip of two threads that each sleep in FUTEX_WAIT and
 *              wake the other with FUTEX_WAKE (what waking a parked worker
 *              and being woken by it costs), back to back;
 *
 * A limit is the typical undisturbed cost, so it is taken robustly: the
 * ping-pong is timed in blocks of 64 round trips and the ring in blocks of
 * 1024 items, and the figure is the median block (a block in which the host
 * preempted a vCPU is an outlier, not the limit); the futex round trips are
 * timed one by one and the figure is their median.  fanout's latencies are
 * medians too.
 *   futex idle the same round trip after both threads slept 2 ms, the gap
 *              the "parked" latency scenarios use (p50 of the samples): on
 *              a virtual machine an idle vCPU is descheduled by the host,
 *              and waking it costs more than waking one that just slept.
 *   DRAM       one dependent random 64-byte read (a pointer chase through
 *              the lines of a region in a random cyclic order) over a
 *              region the size of the record table holding 1M finished
 *              records (DRAM_REGION), once on 4 KiB pages (MADV_NOHUGEPAGE:
 *              each read also misses the TLB, a two-level page walk on a
 *              virtual machine) and once with MADV_HUGEPAGE (2 MiB pages
 *              where the kernel gives them); and two such chases
 *              interleaved, the time per pair: what two independent misses
 *              cost when they overlap.  The floor of fanout_lookup() at 1M
 *              records, whose table cannot fit any cache (bar 8).
 *   clocks     what the delegation contract's timestamps cost here: one
 *              CLOCK_MONOTONIC read (an event's dispatched_ns and
 *              completed_ns; the vDSO, on a VM through the paravirtual
 *              clock page) and one tick-counter read (a child's duration,
 *              the library's fq_cycles(): RDTSC on x86), back to back;
 *   locked RMW one uncontended lock-prefixed add on a private line behind
 *              a plain store, less the same loop with a plain add: what
 *              each atomic read-modify-write or seq_cst fence of the
 *              synchronous path costs (bars 2 and 3; PROFILE phase 9).
 *   bare       the bare hand-off: a dispatch + wait of the throughput
 *              scenario's shape reduced to what the contract cannot drop
 *              (the tasks copied, a ring to a worker on the other CPU and
 *              back, a tick per child); measured by the throughput
 *              scenario beside the peers in each round, see
 *              bench_bare_handoff() (bars 1 and 9).
 *
 * With one CPU the pinned pairs share it; the figures are then what that
 * machine can do, and still the reference for the ratios.
 */
#include "bench.h"

#include <fanout.h>

#include <ck_pr.h>
#include <ck_ring.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
#endif

struct pair {
	void *(*fn_a)(void *);
	void *(*fn_b)(void *);
	uint64_t iters;
	unsigned per_sample; /* rt_a: round trips per timed sample (>= 1) */
	_Atomic uint32_t ready;
	/* ping-pong line */
	_Alignas(BENCH_CACHELINE) _Atomic uint64_t flag;
	/* futex words, each on its own line */
	_Alignas(BENCH_CACHELINE) _Atomic uint32_t fa;
	_Alignas(BENCH_CACHELINE) _Atomic uint32_t fb;
	/* ring */
	_Alignas(BENCH_CACHELINE) ck_ring_t ring;
	ck_ring_buffer_t *buf;
	/* futex after an idle gap: one sample per round trip */
	uint64_t gap_ns;
	struct bench_hist *h; /* per block / per round trip samples */
};

#define PP_BLOCK 64
#define RING_BLOCK 1024

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
	uint64_t tb = bench_now_ns();
	for (uint64_t i = 1; i <= p->iters; i++) {
		atomic_store_explicit(&p->flag, 2 * i - 1,
				      memory_order_release);
		while (atomic_load_explicit(&p->flag, memory_order_acquire) !=
		       2 * i)
			;
		if (i % PP_BLOCK == 0) {
			uint64_t t = bench_now_ns();
			bench_hist_add(p->h, t - tb);
			tb = t;
		}
	}
	return NULL;
}

/* per_sample round trips per sample, each sample timed (the "rt tail"
 * limits); iters counts round trips, as pp_b does. */
static void *rt_a(void *arg)
{
	struct pair *p = arg;
	unsigned k = p->per_sample ? p->per_sample : 1;
	bench_pin_self(cpu_of(0));
	start_gate(p);
	for (uint64_t i = 1; i + k - 1 <= p->iters;) {
		uint64_t t0 = bench_now_ns();
		for (unsigned j = 0; j < k; j++, i++) {
			atomic_store_explicit(&p->flag, 2 * i - 1,
					      memory_order_release);
			while (atomic_load_explicit(
				       &p->flag, memory_order_acquire) != 2 * i)
				;
		}
		bench_hist_add(p->h, bench_now_ns() - t0);
	}
	return NULL;
}

static void *pp_b(void *arg)
{
	struct pair *p = arg;
	bench_pin_self(cpu_of(1));
	start_gate(p);
	for (uint64_t i = 1; i <= p->iters; i++) {
		while (atomic_load_explicit(&p->flag, memory_order_acquire) !=
		       2 * i - 1)
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
	uint64_t tb = 0;
	for (uintptr_t i = 1; i <= p->iters; i++) {
		while (!ck_ring_dequeue_spsc(&p->ring, p->buf, &v))
			ck_pr_stall();
		if (i == 1) {
			tb = bench_now_ns();
		} else if ((i - 1) % RING_BLOCK == 0) {
			uint64_t t = bench_now_ns();
			bench_hist_add(p->h, t - tb);
			tb = t;
		}
		if ((uintptr_t)v != i)
			bench_die("ck_ring delivered %zu, expected %zu",
				  (size_t)(uintptr_t)v, (size_t)i);
	}
	return NULL;
}

static void *fx_a(void *arg)
{
	struct pair *p = arg;
	bench_pin_self(cpu_of(0));
	start_gate(p);
	uint64_t tb = bench_now_ns();
	for (uint64_t i = 0; i < p->iters; i++) {
		atomic_store(&p->fb, 1);
		bench_futex_wake(&p->fb, 1);
		while (atomic_load(&p->fa) == 0)
			bench_futex_wait(&p->fa, 0, NULL);
		atomic_store(&p->fa, 0);
		uint64_t t = bench_now_ns();
		bench_hist_add(p->h, t - tb);
		tb = t;
	}
	return NULL;
}

static void *fxi_a(void *arg)
{
	struct pair *p = arg;
	bench_pin_self(cpu_of(0));
	start_gate(p);
	for (uint64_t i = 0; i < p->iters; i++) {
		bench_sleep_ns(p->gap_ns);
		uint64_t t0 = bench_now_ns();
		atomic_store(&p->fb, 1);
		bench_futex_wake(&p->fb, 1);
		while (atomic_load(&p->fa) == 0)
			bench_futex_wait(&p->fa, 0, NULL);
		bench_hist_add(p->h, bench_now_ns() - t0);
		atomic_store(&p->fa, 0);
	}
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

/*
 * What a hand-off through the kernel costs on this machine: one system call
 * (getppid), and one switch between two threads that share a CPU by
 * sched_yield (both pinned to CPU 0, each yielding to the other).  The
 * background path's hand-offs between the consumer and the worker on its
 * CPU are such switches whenever the engine has as many workers as CPUs.
 */
static _Atomic int yield_ready;

static void *yield_thread(void *arg)
{
	uint64_t n = *(const uint64_t *)arg;

	bench_pin_self(0);
	atomic_fetch_add(&yield_ready, 1);
	while (atomic_load(&yield_ready) < 2)
		sched_yield();
	for (uint64_t i = 0; i < n; i++)
		sched_yield();
	return NULL;
}

static double yield_switch_ns(uint64_t n)
{
	pthread_t a, b;

	atomic_store(&yield_ready, 0);
	uint64_t t0 = bench_now_ns();
	if (pthread_create(&a, NULL, yield_thread, &n) ||
	    pthread_create(&b, NULL, yield_thread, &n))
		bench_die("pthread_create failed");
	pthread_join(a, NULL);
	pthread_join(b, NULL);
	return (double)(bench_now_ns() - t0) / (2.0 * (double)n);
}

static double syscall_ns(uint64_t n)
{
	uint64_t t0 = bench_now_ns();

	for (uint64_t i = 0; i < n; i++)
		syscall(SYS_getppid);
	return (double)(bench_now_ns() - t0) / (double)n;
}

static volatile uint64_t clock_sink;

static double clock_read_ns(uint64_t n)
{
	uint64_t t0 = bench_now_ns(), acc = 0;

	for (uint64_t i = 0; i < n; i++) {
		struct timespec ts;

		clock_gettime(CLOCK_MONOTONIC, &ts);
		acc += (uint64_t)ts.tv_nsec;
	}
	clock_sink = acc;
	return (double)(bench_now_ns() - t0) / (double)n;
}

static double tick_read_ns(uint64_t n)
{
#if defined(__x86_64__) || defined(__i386__)
	uint64_t t0 = bench_now_ns(), acc = 0;

	for (uint64_t i = 0; i < n; i++)
		acc += __rdtsc();
	clock_sink = acc;
	return (double)(bench_now_ns() - t0) / (double)n;
#else
	return clock_read_ns(n); /* the library's ticks are the clock */
#endif
}

/* 8 lines, one word each: a store and an RMW per step, as the sync path
 * writes its record between its RMWs. */
static _Atomic uint64_t rmw_line[8 * 8];
static uint64_t rmw_plain[16 * 8];

static double locked_rmw_ns(uint64_t n)
{
	uint64_t t0 = bench_now_ns(), t1, t2;

	for (uint64_t i = 0; i < n; i++) {
		rmw_plain[(i & 15) * 8] += i;
		/* relaxed: still a lock-prefixed instruction on x86. */
		atomic_fetch_add_explicit(&rmw_line[(i & 7) * 8], 1,
					  memory_order_relaxed);
	}
	t1 = bench_now_ns();
	for (uint64_t i = 0; i < n; i++) {
		rmw_plain[(i & 15) * 8] += i;
		/* relaxed load and store: the same work without the lock. */
		atomic_store_explicit(
			&rmw_line[(i & 7) * 8],
			atomic_load_explicit(&rmw_line[(i & 7) * 8],
					     memory_order_relaxed) +
				1,
			memory_order_relaxed);
	}
	t2 = bench_now_ns();
	clock_sink = rmw_plain[0];
	return ((double)(t1 - t0) - (double)(t2 - t1)) / (double)n;
}

static double run_pair_hk(void *(*a)(void *), void *(*b)(void *),
			  uint64_t iters, bool ring, uint64_t gap_ns,
			  struct bench_hist *h, unsigned per_sample)
{
	struct pair *p = aligned_alloc(BENCH_CACHELINE,
				       (sizeof(*p) + BENCH_CACHELINE - 1) &
					       ~(size_t)(BENCH_CACHELINE - 1));
	if (!p)
		bench_die("out of memory");
	memset(p, 0, sizeof(*p));
	p->iters = iters;
	p->per_sample = per_sample;
	p->gap_ns = gap_ns;
	p->h = h;
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
	free(p->buf);
	free(p);
	return 0;
}

static double run_pair_h(void *(*a)(void *), void *(*b)(void *), uint64_t iters,
			 bool ring, uint64_t gap_ns, struct bench_hist *h)
{
	return run_pair_hk(a, b, iters, ring, gap_ns, h, 1);
}

/* Run a pair; return the median block time divided by @per_block. */
static double run_pair(void *(*a)(void *), void *(*b)(void *), uint64_t iters,
		       bool ring, unsigned per_block)
{
	struct bench_hist *h = bench_hist_new();
	run_pair_h(a, b, iters, ring, 0, h);
	double v = bench_hist_quantile(h, 0.5) / per_block;
	bench_hist_free(h);
	return v;
}

/* ------------------------------------------------------------------ DRAM */

/* The record table's footprint with 1M finished records: ~148 bytes a slot
 * (lib/table.c: the slot's line pair, generation, free link). */
#define DRAM_REGION ((size_t)148 << 20)
#define DRAM_HUGE ((size_t)2 << 20)

struct chase {
	uint32_t *next; /* line i's first word: the index of the next line */
	size_t nlines;
};

/* A 2 MiB-aligned anonymous region of DRAM_REGION bytes whose lines form
 * one random cycle; @advice MADV_HUGEPAGE or MADV_NOHUGEPAGE. */
static void chase_init(struct chase *c, int advice)
{
	size_t len = DRAM_REGION + DRAM_HUGE, n = DRAM_REGION / 64;
	char *raw = mmap(NULL, len, PROT_READ | PROT_WRITE,
			 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (raw == MAP_FAILED)
		bench_die("DRAM limit: mmap of %zu MiB failed", len >> 20);
	char *base = (char *)(((uintptr_t)raw + DRAM_HUGE - 1) &
			      ~(uintptr_t)(DRAM_HUGE - 1));
	madvise(base, DRAM_REGION, advice); /* a hint: ignore failure */
	uint32_t *perm = malloc(n * sizeof(*perm));
	if (!perm)
		bench_die("out of memory");
	for (size_t i = 0; i < n; i++)
		perm[i] = (uint32_t)i;
	uint64_t rng = 0x9e3779b97f4a7c15ull;
	for (size_t i = n - 1; i > 0; i--) { /* Sattolo: one cycle */
		size_t j = bench_rand(&rng) % i;
		uint32_t t = perm[i];
		perm[i] = perm[j];
		perm[j] = t;
	}
	c->next = (uint32_t *)(void *)base;
	c->nlines = n;
	for (size_t i = 0; i < n; i++)
		c->next[(size_t)perm[i] * 16] = perm[(i + 1) % n];
	free(perm);
}

/* ns per step of one chase (pair = false) or per step of two chases
 * interleaved (pair = true), over @steps steps. */
static double chase_run(const struct chase *c, uint64_t steps, bool pair)
{
	const volatile uint32_t *w = c->next;
	uint32_t a = 0, b = (uint32_t)(c->nlines / 2);
	uint64_t t0 = bench_now_ns();
	if (pair) {
		for (uint64_t i = 0; i < steps; i++) {
			a = w[(size_t)a * 16];
			b = w[(size_t)b * 16];
		}
	} else {
		for (uint64_t i = 0; i < steps; i++)
			a = w[(size_t)a * 16];
	}
	double ns = (double)(bench_now_ns() - t0) / (double)steps;
	if (a == UINT32_MAX || b == UINT32_MAX)
		bench_die("DRAM limit: chase broken");
	return ns;
}

/* AnonHugePages of the mapping that holds @p, in KiB (/proc/self/smaps). */
static long huge_kb(const void *p)
{
	FILE *f = fopen("/proc/self/smaps", "r");
	char line[256];
	bool in = false;
	long kb = -1;
	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f)) {
		unsigned long lo, hi;
		if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 &&
		    strchr(line, '-') < strchr(line, ' ')) {
			in = (uintptr_t)p >= lo && (uintptr_t)p < hi;
			continue;
		}
		if (in && sscanf(line, "AnonHugePages: %ld kB", &kb) == 1)
			break;
	}
	fclose(f);
	return kb;
}

/* One raw ck_ring SPSC stream as the limits set runs it (ns per item):
 * for the throughput scenario, which measures it in each of its rounds
 * beside the peers' batch of 512 (bar 6). */
double bench_ring_item_ns(void)
{
	return run_pair(ring_prod, ring_cons,
			(uint64_t)(2000000 * bench_opt.scale) + 1000, true,
			RING_BLOCK);
}

/* --------------------------------------------------------- bare hand-off */

/*
 * The bare hand-off (bars 1 and 9): the least that fanout_dispatch() +
 * fanout_wait() of @n children with @k batches in flight must do when the
 * children run on another CPU and the tasks are copied, as the contract has
 * it by default.  The caller, pinned to CPU 0, copies the n tasks into a
 * recycled block (struct fanout_task, as fanout copies them) and hands the
 * block to a worker pinned to CPU 1 through a ck_ring SPSC; the worker runs
 * each child through the task's pointer, reads the tick counter once per
 * child boundary and writes the child's whole struct fanout_result, then
 * hands the block back through a second ck_ring; the caller takes it,
 * checks the last result and reuses the block.  No record table,
 * admission, join counter, cancel word, sink, event, second worker or
 * sleeping: the distance from here to fanout's figure is what those cost.
 */
struct bare_blk {
	struct bare_blk *next; /* the caller's free list */
	unsigned n;
	_Alignas(BENCH_CACHELINE) struct fanout_result res[]; /* then tasks */
};

struct bare {
	_Alignas(BENCH_CACHELINE) ck_ring_t to_w; /* caller -> worker */
	_Alignas(BENCH_CACHELINE) ck_ring_t to_c; /* worker -> caller */
	ck_ring_buffer_t *bw, *bc;
	_Alignas(BENCH_CACHELINE) _Atomic uint32_t ready;
	_Atomic bool stop;
	unsigned n, k;
	bool one_cpu; /* both threads pinned to CPU 0 */
	uint64_t dur_ns;
	double rate;   /* children/s, the caller's result */
	uint64_t sent; /* batches the caller handed over */
	uint64_t ran;  /* children the worker ran */
};

#define BARE_RING 64 /* > the most batches in flight (16) */

static _Thread_local uint64_t bare_ran;

static int bare_child(struct fanout_child *c, void *arg)
{
	(void)c;
	(void)arg;
	bare_ran++; /* what bench_child() does: a thread-local count */
	return 0;
}

static struct fanout_task *bare_tasks(struct bare_blk *b)
{
	return (struct fanout_task *)&b->res[b->n];
}

static uint64_t bare_tick(void)
{
#if defined(__x86_64__) || defined(__i386__)
	return __rdtsc();
#else
	return bench_now_ns();
#endif
}

/* Waiting for the other side: pause, or yield when both share a CPU. */
static void bare_relax(const struct bare *x)
{
	if (x->one_cpu)
		sched_yield();
	else
		ck_pr_stall();
}

static void *bare_worker(void *arg)
{
	struct bare *x = arg;
	/* ns per tick in 32.32 fixed point, as the library converts a
	 * child's ticks; its value does not change the work */
	volatile uint64_t mult_v = (uint64_t)1 << 31;
	uint64_t mult = mult_v;
	bench_pin_self(cpu_of(1));
	atomic_fetch_add(&x->ready, 1);
	for (;;) {
		struct bare_blk *b;
		if (!ck_ring_dequeue_spsc(&x->to_w, x->bw, &b)) {
			/* relaxed: set after the caller's last enqueue, whose
			 * block this loop has already taken and returned */
			if (atomic_load_explicit(&x->stop,
						 memory_order_relaxed))
				break;
			bare_relax(x);
			continue;
		}
		const struct fanout_task *t = bare_tasks(b);
		uint64_t t0 = bare_tick();
		for (unsigned i = 0; i < b->n; i++) {
			int code = t[i].fn(NULL, t[i].arg);
			uint64_t t1 = bare_tick();
			struct fanout_result *r = &b->res[i];
			r->index = i;
			r->status = FANOUT_COMPLETED;
			r->goal = t[i].goal;
			r->summary = NULL;
			r->error = NULL;
			r->duration_ns =
				(uint64_t)(((unsigned __int128)(t1 - t0) *
					    mult) >>
					   32);
			r->cost = 0;
			r->code = code;
			t0 = t1;
		}
		while (!ck_ring_enqueue_spsc(&x->to_c, x->bc, b))
			bare_relax(x);
	}
	x->ran = bare_ran;
	return NULL;
}

static void *bare_caller(void *arg)
{
	struct bare *x = arg;
	unsigned n = x->n, k = x->k, inflight = 0;
	size_t size =
		sizeof(struct bare_blk) +
		n * (sizeof(struct fanout_result) + sizeof(struct fanout_task));
	struct fanout_task *src = calloc(n, sizeof(*src));
	struct bare_blk *free_list = NULL, *all[BARE_RING], *b;
	if (!src)
		bench_die("out of memory");
	for (unsigned i = 0; i < n; i++)
		src[i] = (struct fanout_task){NULL, bare_child, x};
	for (unsigned i = 0; i < k; i++) {
		all[i] = aligned_alloc(BENCH_CACHELINE,
				       (size + BENCH_CACHELINE - 1) &
					       ~(size_t)(BENCH_CACHELINE - 1));
		if (!all[i])
			bench_die("out of memory");
		all[i]->next = free_list;
		free_list = all[i];
	}
	bench_pin_self(cpu_of(0));
	atomic_fetch_add(&x->ready, 1);
	while (atomic_load(&x->ready) < 2)
		ck_pr_stall();
	/* a clock read every `step` batches: ~1k children apart */
	uint64_t step = 1 + 1024 / n, batches = 0, t0 = bench_now_ns(), t;
	do {
		for (uint64_t j = 0; j < step; j++, batches++) {
			while (inflight < k) {
				b = free_list;
				free_list = b->next;
				b->n = n;
				memcpy(bare_tasks(b), src, n * sizeof(*src));
				while (!ck_ring_enqueue_spsc(&x->to_w, x->bw,
							     b))
					bare_relax(x);
				inflight++;
				x->sent++;
			}
			while (!ck_ring_dequeue_spsc(&x->to_c, x->bc, &b))
				bare_relax(x);
			if (b->res[n - 1].status != FANOUT_COMPLETED ||
			    b->res[n - 1].index != n - 1)
				bench_die("bare hand-off: block returned "
					  "unrun");
			b->next = free_list;
			free_list = b;
			inflight--;
		}
		t = bench_now_ns();
	} while (t - t0 < x->dur_ns);
	x->rate = (double)(batches * n) * 1e9 / (double)(t - t0);
	while (inflight--) {
		while (!ck_ring_dequeue_spsc(&x->to_c, x->bc, &b))
			bare_relax(x);
	}
	/* relaxed: a flag; every block is back, and pthread_join orders the
	 * worker's count for the check */
	atomic_store_explicit(&x->stop, true, memory_order_relaxed);
	for (unsigned i = 0; i < k; i++)
		free(all[i]);
	free(src);
	return NULL;
}

double bench_bare_handoff(unsigned n, unsigned k, uint64_t dur_ns)
{
	struct bare *x = aligned_alloc(BENCH_CACHELINE,
				       (sizeof(*x) + BENCH_CACHELINE - 1) &
					       ~(size_t)(BENCH_CACHELINE - 1));
	if (!x || !n || !k || k >= BARE_RING)
		bench_die("bare hand-off: bad arguments or out of memory");
	memset(x, 0, sizeof(*x));
	x->bw = aligned_alloc(BENCH_CACHELINE, BARE_RING * sizeof(*x->bw));
	x->bc = aligned_alloc(BENCH_CACHELINE, BARE_RING * sizeof(*x->bc));
	if (!x->bw || !x->bc)
		bench_die("out of memory");
	ck_ring_init(&x->to_w, BARE_RING);
	ck_ring_init(&x->to_c, BARE_RING);
	x->n = n;
	x->k = k;
	x->one_cpu = bench_ncpus() < 2; /* before any pinning */
	x->dur_ns = dur_ns;
	pthread_t tc, tw;
	if (pthread_create(&tw, NULL, bare_worker, x) ||
	    pthread_create(&tc, NULL, bare_caller, x))
		bench_die("pthread_create failed");
	pthread_join(tc, NULL);
	pthread_join(tw, NULL);
	if (x->ran != x->sent * n)
		bench_die("bare hand-off: %llu children ran of %llu",
			  (unsigned long long)x->ran,
			  (unsigned long long)(x->sent * n));
	double rate = x->rate;
	free(x->bw);
	free(x->bc);
	free(x);
	return rate;
}

double bench_limit_ring_rounds;

double bench_limit_pingpong, bench_limit_ring, bench_limit_futex,
	bench_limit_futex_idle, bench_limit_rt_p50, bench_limit_rt_p999,
	bench_limit_dram, bench_limit_dram_huge, bench_limit_syscall,
	bench_limit_yield, bench_limit_clock, bench_limit_tick, bench_limit_rmw,
	bench_limit_rtk_p50, bench_limit_rtk_p999;
unsigned bench_limit_rtk_k;

/*
 * The limits are measured in two sets, at the start and at the end of the
 * run, and reported as medians over both: on a shared machine the load
 * changes during the run, and the peers' figures are spread over it too.
 */
#define LIM_MAX_ROUNDS 128
static double lim_pp[LIM_MAX_ROUNDS], lim_rg[LIM_MAX_ROUNDS],
	lim_fx[LIM_MAX_ROUNDS], lim_d4[LIM_MAX_ROUNDS], lim_dh[LIM_MAX_ROUNDS],
	lim_d2[LIM_MAX_ROUNDS], lim_sc[LIM_MAX_ROUNDS], lim_yl[LIM_MAX_ROUNDS],
	lim_ck[LIM_MAX_ROUNDS], lim_tk[LIM_MAX_ROUNDS], lim_rw[LIM_MAX_ROUNDS];
static unsigned lim_n;
static struct bench_hist *lim_hi, *lim_rt, *lim_rtk;
static struct chase lim_c4, lim_ch;
static long lim_huge_kb = -1;

void bench_limits(void)
{
	unsigned R = bench_opt.rounds;
	uint64_t npp = (uint64_t)(200000 * bench_opt.scale) + 1000;
	uint64_t nrg = (uint64_t)(2000000 * bench_opt.scale) + 1000;
	uint64_t nfx = (uint64_t)(10000 * bench_opt.scale) + 100;
	uint64_t nfi = (uint64_t)(150 * bench_opt.scale) + 10;
	/* as many as the hot latency scenario takes per round */
	uint64_t nrt = (uint64_t)(5000 * bench_opt.scale) + 10;
	if (!lim_hi)
		lim_hi = bench_hist_new();
	if (!lim_rt)
		lim_rt = bench_hist_new();
	/* The set at the end of a full run: fanout's hot p50 is known, so
	 * the "rt tail k" samples can be made as long (bar 5's floor).  k
	 * comes from a round trip timed now: the host may have changed
	 * state since the set at the start. */
	const struct bench_fig *hot =
		bench_fig_find("latency hot", "p50", "fanout");
	if (hot && hot->value > 0 && !lim_rtk) {
		struct bench_hist *now = bench_hist_new();
		run_pair_h(rt_a, pp_b, nrt, false, 0, now);
		double rt50 = bench_hist_quantile(now, 0.5);
		bench_hist_free(now);
		long k = rt50 > 0 ? lround(hot->value / rt50) : 1;
		bench_limit_rtk_k = k < 1 ? 1 : k > 64 ? 64 : (unsigned)k;
		lim_rtk = bench_hist_new();
	}
	/* warm-up */
	run_pair(pp_a, pp_b, npp / 10, false, PP_BLOCK);
	run_pair(ring_prod, ring_cons, nrg / 10, true, RING_BLOCK);
	run_pair(fx_a, fx_b, nfx / 10, false, 1);
	uint64_t ndr = (uint64_t)(1000000 * bench_opt.scale) + 10000;
	uint64_t nsc = (uint64_t)(20000 * bench_opt.scale) + 1000;
	if (!lim_c4.next) {
		chase_init(&lim_c4, MADV_NOHUGEPAGE);
		chase_init(&lim_ch, MADV_HUGEPAGE);
		lim_huge_kb = huge_kb(lim_ch.next);
	}
	chase_run(&lim_c4, ndr / 10, false);
	chase_run(&lim_ch, ndr / 10, false);
	for (unsigned r = 0; r < R && lim_n < LIM_MAX_ROUNDS; r++, lim_n++) {
		lim_pp[lim_n] = run_pair(pp_a, pp_b, npp, false, PP_BLOCK);
		lim_rg[lim_n] =
			run_pair(ring_prod, ring_cons, nrg, true, RING_BLOCK);
		lim_fx[lim_n] = run_pair(fx_a, fx_b, nfx, false, 1);
		run_pair_h(fxi_a, fx_b, nfi, false, 2000000, lim_hi);
		run_pair_h(rt_a, pp_b, nrt, false, 0, lim_rt);
		if (lim_rtk)
			run_pair_hk(rt_a, pp_b, nrt * bench_limit_rtk_k, false,
				    0, lim_rtk, bench_limit_rtk_k);
		lim_d4[lim_n] = chase_run(&lim_c4, ndr, false);
		lim_dh[lim_n] = chase_run(&lim_ch, ndr, false);
		lim_d2[lim_n] = chase_run(&lim_c4, ndr / 2, true);
		lim_sc[lim_n] = syscall_ns(nsc);
		lim_yl[lim_n] = yield_switch_ns(nsc / 2);
		lim_ck[lim_n] = clock_read_ns(nsc * 20);
		lim_tk[lim_n] = tick_read_ns(nsc * 20);
		lim_rw[lim_n] = locked_rmw_ns(nsc * 50);
	}
	bench_limit_pingpong = bench_median(lim_pp, lim_n);
	bench_limit_ring = bench_median(lim_rg, lim_n);
	bench_limit_futex = bench_median(lim_fx, lim_n);
	bench_limit_futex_idle = bench_hist_quantile(lim_hi, 0.5);
	bench_limit_rt_p50 = bench_hist_quantile(lim_rt, 0.5);
	bench_limit_rt_p999 = bench_hist_quantile(lim_rt, 0.999);
	if (lim_rtk) {
		bench_limit_rtk_p50 = bench_hist_quantile(lim_rtk, 0.5);
		bench_limit_rtk_p999 = bench_hist_quantile(lim_rtk, 0.999);
	}
	bench_limit_dram = bench_median(lim_d4, lim_n);
	bench_limit_dram_huge = bench_median(lim_dh, lim_n);
	bench_limit_syscall = bench_median(lim_sc, lim_n);
	bench_limit_yield = bench_median(lim_yl, lim_n);
	bench_limit_clock = bench_median(lim_ck, lim_n);
	bench_limit_tick = bench_median(lim_tk, lim_n);
	bench_limit_rmw = bench_median(lim_rw, lim_n);
}

/* One limit's line: the median over @n rounds of @v, min and max. */
static void lim_line(FILE *f, const char *label, const double *v, unsigned n,
		     const char *note)
{
	fprintf(f, "  %-32s %9.1f ns   (min %.1f, max %.1f)%s\n", label,
		bench_median(v, n), bench_min(v, n), bench_max(v, n), note);
}

void bench_limits_report(void)
{
	unsigned n = lim_n;
	if (!n)
		return;
	/* The figures every limit adds to the run's record, in ns. */
	const struct {
		const char *metric;
		double ns;
	} figs[] = {
		{"cache-line ping-pong RTT", bench_limit_pingpong},
		{"ck_ring SPSC per item", bench_limit_ring},
		{"ck_ring SPSC per item, beside batch 512",
		 bench_limit_ring_rounds > 0 ? bench_limit_ring_rounds : NAN},
		{"futex wake RTT", bench_limit_futex},
		{"round trip one at a time p50", bench_limit_rt_p50},
		{"round trip one at a time p999", bench_limit_rt_p999},
		{"round trips as long as fanout's hot child p50",
		 bench_limit_rtk_p50},
		{"round trips as long as fanout's hot child p999",
		 bench_limit_rtk_p999},
		{"futex wake RTT after 2 ms idle p50", bench_limit_futex_idle},
		{"DRAM random read", bench_limit_dram},
		{"DRAM random read, MADV_HUGEPAGE", bench_limit_dram_huge},
		{"DRAM random read pair, overlapped", bench_median(lim_d2, n)},
		{"system call", bench_limit_syscall},
		{"sched_yield switch on one CPU", bench_limit_yield},
		{"CLOCK_MONOTONIC read", bench_limit_clock},
		{"tick read", bench_limit_tick},
		{"locked RMW behind a store", bench_limit_rmw},
	};
	for (size_t i = 0; i < sizeof(figs) / sizeof(figs[0]); i++)
		bench_fig_add("limits", figs[i].metric, "limit", figs[i].ns,
			      "ns", BENCH_LOWER);
	FILE *f = bench_opt.out;
	fprintf(f,
		"\n== physical limits (threads pinned to CPU %d and %d; per "
		"round "
		"the median block, then the median\n   of %u rounds taken at "
		"the "
		"start and the end of the run; min/max over rounds) ==\n",
		cpu_of(0), cpu_of(1), n);
	lim_line(f, "cache-line ping-pong round trip", lim_pp, n, "");
	fprintf(f,
		"  round trip, one at a time        %9.1f ns   p50 (p99 %.1f, "
		"p999 %.1f: %.1fx p50; %llu samples)\n",
		bench_limit_rt_p50, bench_hist_quantile(lim_rt, 0.99),
		bench_limit_rt_p999,
		bench_limit_rt_p50 > 0 ?
			bench_limit_rt_p999 / bench_limit_rt_p50 :
			NAN,
		(unsigned long long)lim_rt->count);
	if (lim_rtk)
		fprintf(f,
			"  %2u round trips per sample        %9.1f ns   p50 "
			"(p99 %.1f, p999 %.1f: %.1fx p50; %llu samples; as "
			"long as fanout's hot child)\n",
			bench_limit_rtk_k, bench_limit_rtk_p50,
			bench_hist_quantile(lim_rtk, 0.99),
			bench_limit_rtk_p999,
			bench_limit_rtk_p50 > 0 ?
				bench_limit_rtk_p999 / bench_limit_rtk_p50 :
				NAN,
			(unsigned long long)lim_rtk->count);
	fprintf(f,
		"  raw ck_ring SPSC handoff         %9.1f ns/item (min %.1f, "
		"max %.1f)\n",
		bench_limit_ring, bench_min(lim_rg, n), bench_max(lim_rg, n));
	if (bench_limit_ring_rounds > 0)
		fprintf(f,
			"  the same, beside batch 512       %9.1f ns/item "
			"(median over the throughput rounds, each right after "
			"the\n%37sbatch of 512: bar 6's yardstick)\n",
			bench_limit_ring_rounds, "");
	lim_line(f, "futex wake round trip", lim_fx, n, "");
	fprintf(f,
		"  futex round trip, 2 ms idle      %9.1f ns   p50 (p99 %.1f, "
		"%llu samples)\n",
		bench_limit_futex_idle, bench_hist_quantile(lim_hi, 0.99),
		(unsigned long long)lim_hi->count);
	fprintf(f,
		"  DRAM random read (%zu MiB, 4K)  %9.1f ns   (min %.1f, max "
		"%.1f): one dependent 64-byte read\n",
		DRAM_REGION >> 20, bench_limit_dram, bench_min(lim_d4, n),
		bench_max(lim_d4, n));
	fprintf(f,
		"  DRAM random read, MADV_HUGEPAGE %9.1f ns   (min %.1f, max "
		"%.1f; AnonHugePages %ld MiB of %zu)\n",
		bench_limit_dram_huge, bench_min(lim_dh, n),
		bench_max(lim_dh, n), lim_huge_kb < 0 ? -1 : lim_huge_kb >> 10,
		DRAM_REGION >> 20);
	fprintf(f,
		"  two such reads overlapped (4K)  %9.1f ns   (min %.1f, max "
		"%.1f): two chases interleaved, per pair\n",
		bench_median(lim_d2, n), bench_min(lim_d2, n),
		bench_max(lim_d2, n));
	lim_line(f, "system call (getppid)", lim_sc, n, "");
	lim_line(f, "sched_yield switch, one CPU", lim_yl, n,
		 ": two threads on CPU 0 yielding to each other, per switch");
	lim_line(f, "CLOCK_MONOTONIC read", lim_ck, n,
		 ": clock_gettime, back to back");
	lim_line(f, "tick read", lim_tk, n,
		 ": the library's child-duration counter, back to back");
	lim_line(f, "locked RMW behind a store", lim_rw, n,
		 ": a lock-prefixed add less a plain one");
}
