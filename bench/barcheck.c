/* SPDX-License-Identifier: MIT */
/*
 * barcheck.c - an independent check of issue 13's bars.
 *
 * Written apart from fanout-bench (it shares no code with the bench headers) and
 * built only against the INSTALLED library: `make run` installs fanout into
 * build/barcheck/prefix and compiles this file with
 * `pkg-config --cflags --libs fanout`, as a user would, so what it measures
 * is libfanout.so as shipped.  It measures the same nine bars with its own
 * loops and its own peers:
 *
 *   - oneTBB (barcheck-tbb.cpp): task_group run + wait;
 *   - a plain mutex + condvar pool, written here (one queue, one lock, one
 *     condvar for the workers, one per batch for the join);
 *   - one raw ck_ring SPSC handoff between two pinned threads;
 *   - a raw cross-CPU exchange as long as fanout's hot single child (k
 *     round trips per timed sample), bar 5's floor;
 *   - Python's ThreadPoolExecutor, python3 started once per round.
 *
 * Peers take turns inside each round; every figure is the median over the
 * rounds (latency percentiles: over all samples of all rounds).  Every
 * child counts itself; a measurement whose count differs from what was
 * joined aborts the program.  Usage: barcheck [--rounds N] [--scale X]
 * [--quick] [--results FILE] (--quick: 1 round, short runs, 100k
 * records instead of 1M: proves it runs, the figures are rough;
 * --results: also write the output as the last section of FILE, the
 * RESULTS.md fanout-bench just wrote).  Exit 0 when it printed the
 * table, whatever the bars say.
 */
#include <fanout.h>

#include <ck_pr.h>
#include <ck_ring.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_THREADS 256
#define MAX_ROUNDS 32
#define MAX_BATCH 4096
#define MAX_INFLIGHT 16

static unsigned nthreads = 2, rounds = 5;
/* Everything printed goes here first: to stdout, and with --results also
 * into that file (fanout-bench's RESULTS.md) as its last section. */
static FILE *out;
static char *out_buf;
static size_t out_len;
static double scale = 1;
static bool quick;

static void die(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fputs("barcheck: ", stderr);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
	exit(2);
}

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void sleep_ns(uint64_t ns)
{
	struct timespec ts = {.tv_sec = (time_t)(ns / 1000000000u),
			      .tv_nsec = (long)(ns % 1000000000u)};
	while (nanosleep(&ts, &ts) && errno == EINTR)
		;
}

static uint64_t dur(double ms)
{
	return (uint64_t)(ms * 1e6 * scale);
}

static int cmp_dbl(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

/* Median of @n values (sorts them); NaN for none. */
static double median(double *v, size_t n)
{
	if (!n)
		return NAN;
	qsort(v, n, sizeof(*v), cmp_dbl);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* ---------------------------------------------------------- the child */

/* One counter per thread, each on its own cache line, single writer. */
static struct {
	_Alignas(64) _Atomic uint64_t n;
} counts[MAX_THREADS];
static _Atomic unsigned ncounts;
static _Thread_local _Atomic uint64_t *my_count;

/* The child every peer runs: count itself, nothing else. */
void barcheck_child(void)
{
	if (__builtin_expect(!my_count, 0)) {
		unsigned i = atomic_fetch_add(&ncounts, 1);
		if (i >= MAX_THREADS)
			die("more than %d threads ran children", MAX_THREADS);
		my_count = &counts[i].n;
	}
	atomic_store_explicit(
		my_count,
		atomic_load_explicit(my_count, memory_order_relaxed) + 1,
		memory_order_relaxed);
}

static uint64_t children_ran(void)
{
	uint64_t s = 0;
	unsigned n = atomic_load(&ncounts);
	for (unsigned i = 0; i < n && i < MAX_THREADS; i++)
		s += atomic_load_explicit(&counts[i].n, memory_order_relaxed);
	return s;
}

static void check_ran(const char *who, uint64_t before, uint64_t joined)
{
	uint64_t ran = children_ran() - before;
	if (ran != joined)
		die("%s: %llu children joined but %llu ran", who,
		    (unsigned long long)joined, (unsigned long long)ran);
}

/* ---------------------------------------------------------- fanout */

static int fo_child(struct fanout_child *c, void *arg)
{
	barcheck_child();
	return 0;
}

static struct fanout_task tasks[MAX_BATCH];

static struct fanout_engine *engine(const struct fanout_config *base)
{
	struct fanout_config cfg = {0};
	struct fanout_engine *e;
	if (base)
		cfg = *base;
	cfg.workers = nthreads;
	int rc = fanout_create(&cfg, &e);
	if (rc)
		die("fanout_create: %s", fanout_strerror(rc));
	return e;
}

static void take_event(struct fanout_sink *s, unsigned n)
{
	struct fanout_event *ev;
	int rc = fanout_wait(s, &ev, 10000);
	if (rc)
		die("fanout_wait: %s", fanout_strerror(rc));
	if (ev->status != FANOUT_COMPLETED || ev->nresults != n ||
	    ev->ncompleted != n)
		die("event: status %s, %u of %u completed",
		    fanout_status_name(ev->status), ev->ncompleted, n);
	fanout_event_free(ev);
}

static void dispatch(struct fanout_engine *e, unsigned n)
{
	struct fanout_batch b = {.tasks = tasks, .ntasks = n};
	fanout_id id;
	int rc = fanout_dispatch(e, &b, &id);
	if (rc)
		die("fanout_dispatch: %s", fanout_strerror(rc));
}

static void run(struct fanout_engine *e, unsigned n)
{
	struct fanout_batch b = {.tasks = tasks, .ntasks = n};
	struct fanout_event *ev;
	int rc = fanout_run(e, &b, &ev);
	if (rc)
		die("fanout_run: %s", fanout_strerror(rc));
	if (ev->ncompleted != n)
		die("fanout_run: %u of %u completed", ev->ncompleted, n);
	fanout_event_free(ev);
}

/*
 * How many batches a driver with @k in flight joins between its looks at
 * the clock: 16 with several in flight, else 1 (a batch of one is timed
 * whole).  One CLOCK_MONOTONIC read per joined batch held oneTBB's batch 1
 * x16 at 1.8-2.2M children/s here against 2.5-3.4M with a read every 16th
 * in a standalone driver (bench/PROFILE.txt phase 16), part of what told
 * the two programs' oneTBB figures apart.  fanout-bench's driver looks every 16th
 * batch too, and both peers here are driven alike (barcheck-tbb.cpp).
 */
unsigned barcheck_clock_every(unsigned k)
{
	return k > 1 ? 16 : 1;
}

/*
 * Background path: batches of @n, @k in flight (any event frees a place),
 * for @ns.  Children/s; with @k == 1 also the median batch time in
 * *@batch_ns (dispatch to event taken).
 */
static double fo_stream(struct fanout_engine *e, unsigned n, unsigned k,
			uint64_t ns, double *batch_ns)
{
	struct fanout_sink *s = fanout_default_sink(e);
	static double bt[1 << 16];
	size_t nbt = 0;
	unsigned every = barcheck_clock_every(k), tick = 0;
	uint64_t c0 = children_ran(), done = 0;
	uint64_t t0 = now_ns(), end = t0 + ns, t = t0, tb = t0;
	for (unsigned i = 0; i < k; i++)
		dispatch(e, n);
	for (unsigned live = k; live; live--) {
		take_event(s, n);
		done += n;
		if (++tick % every == 0 || live == 1)
			t = now_ns();
		if (k == 1 && nbt < sizeof(bt) / sizeof(bt[0]))
			bt[nbt++] = (double)(t - tb);
		if (t < end) {
			tb = t;
			dispatch(e, n);
			live++;
		}
	}
	check_ran("fanout", c0, done);
	if (batch_ns)
		*batch_ns = median(bt, nbt);
	return (double)done * 1e9 / (double)(t - t0);
}

static double fo_run_stream(struct fanout_engine *e, unsigned n, uint64_t ns)
{
	uint64_t c0 = children_ran(), done = 0;
	uint64_t t0 = now_ns(), end = t0 + ns, t;
	do {
		run(e, n);
		done += n;
	} while ((t = now_ns()) < end);
	check_ran("fanout_run", c0, done);
	return (double)done * 1e9 / (double)(t - t0);
}

/* ---------------------------------------------------------- oneTBB */

int barcheck_tbb_init(unsigned nthreads, unsigned maxgroups);
void barcheck_tbb_fini(void);
uint64_t barcheck_tbb_stream(unsigned n, unsigned k, uint64_t dur_ns);
void barcheck_tbb_batch(unsigned n);

static double tbb_stream(unsigned n, unsigned k, uint64_t ns)
{
	uint64_t c0 = children_ran(), t0 = now_ns();
	uint64_t done = barcheck_tbb_stream(n, k, ns);
	uint64_t t1 = now_ns();
	check_ran("onetbb", c0, done);
	return (double)done * 1e9 / (double)(t1 - t0);
}

/* ---------------------------------------------------------- mutex pool */

struct mp_job {
	struct mp_job *next;
	struct mp_wait *w;
};

struct mp_wait {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	unsigned left;
};

static struct {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	struct mp_job *head, **tail;
	bool stop;
	pthread_t th[MAX_THREADS];
} mp = {.lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER};

static void *mp_worker(void *arg)
{
	pthread_mutex_lock(&mp.lock);
	for (;;) {
		while (!mp.head && !mp.stop)
			pthread_cond_wait(&mp.cond, &mp.lock);
		if (!mp.head)
			break;
		struct mp_job *j = mp.head;
		mp.head = j->next;
		if (!mp.head)
			mp.tail = &mp.head;
		pthread_mutex_unlock(&mp.lock);
		barcheck_child();
		pthread_mutex_lock(&j->w->lock);
		if (--j->w->left == 0)
			pthread_cond_signal(&j->w->cond);
		pthread_mutex_unlock(&j->w->lock);
		pthread_mutex_lock(&mp.lock);
	}
	pthread_mutex_unlock(&mp.lock);
	return NULL;
}

static void mp_start(void)
{
	mp.tail = &mp.head;
	for (unsigned i = 0; i < nthreads; i++)
		if (pthread_create(&mp.th[i], NULL, mp_worker, NULL))
			die("pthread_create failed");
}

static void mp_stop(void)
{
	pthread_mutex_lock(&mp.lock);
	mp.stop = true;
	pthread_cond_broadcast(&mp.cond);
	pthread_mutex_unlock(&mp.lock);
	for (unsigned i = 0; i < nthreads; i++)
		pthread_join(mp.th[i], NULL);
}

/* One child through the pool, waited for. */
static void mp_one(void)
{
	struct mp_wait w = {.lock = PTHREAD_MUTEX_INITIALIZER,
			    .cond = PTHREAD_COND_INITIALIZER,
			    .left = 1};
	struct mp_job j = {.w = &w};
	pthread_mutex_lock(&mp.lock);
	*mp.tail = &j;
	mp.tail = &j.next;
	pthread_cond_signal(&mp.cond);
	pthread_mutex_unlock(&mp.lock);
	pthread_mutex_lock(&w.lock);
	while (w.left)
		pthread_cond_wait(&w.cond, &w.lock);
	pthread_mutex_unlock(&w.lock);
	pthread_cond_destroy(&w.cond);
	pthread_mutex_destroy(&w.lock);
}

/* ---------------------------------------------------------- ck_ring */

#define RING_SLOTS 1024
#define RING_BLOCK 1024

static struct {
	ck_ring_t ring;
	ck_ring_buffer_t buf[RING_SLOTS];
	uint64_t items;
	_Atomic unsigned ready;
	double *blocks; /* ns per block of RING_BLOCK items, consumer side */
	size_t nblocks;
} rg;

static void pin(int cpu)
{
	long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	cpu_set_t set;
	CPU_ZERO(&set);
	CPU_SET(ncpu > 1 ? cpu : 0, &set);
	pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
}

static void ring_gate(void)
{
	atomic_fetch_add(&rg.ready, 1);
	while (atomic_load(&rg.ready) < 2)
		ck_pr_stall();
}

static void *ring_producer(void *arg)
{
	pin(0);
	ring_gate();
	for (uint64_t i = 1; i <= rg.items; i++)
		while (!ck_ring_enqueue_spsc(&rg.ring, rg.buf,
					     (void *)(uintptr_t)i))
			ck_pr_stall();
	return NULL;
}

static void *ring_consumer(void *arg)
{
	pin(1);
	ring_gate();
	uint64_t tb = now_ns();
	for (uint64_t i = 1; i <= rg.items; i++) {
		void *v;
		while (!ck_ring_dequeue_spsc(&rg.ring, rg.buf, &v))
			ck_pr_stall();
		if ((uintptr_t)v != i)
			die("ck_ring: item %llu out of order",
			    (unsigned long long)i);
		if (i % RING_BLOCK == 0) {
			uint64_t t = now_ns();
			rg.blocks[rg.nblocks++] = (double)(t - tb) / RING_BLOCK;
			tb = t;
		}
	}
	return NULL;
}

/* ns per item of one SPSC stream, CPU 0 -> CPU 1: the median block. */
static double ring_handoff(void)
{
	pthread_t a, b;
	rg.items = (uint64_t)(1 << 20) * (quick ? 1 : 2);
	rg.blocks = malloc(rg.items / RING_BLOCK * sizeof(double));
	if (!rg.blocks)
		die("out of memory");
	rg.nblocks = 0;
	atomic_store(&rg.ready, 0);
	ck_ring_init(&rg.ring, RING_SLOTS);
	if (pthread_create(&a, NULL, ring_producer, NULL) ||
	    pthread_create(&b, NULL, ring_consumer, NULL))
		die("pthread_create failed");
	pthread_join(a, NULL);
	pthread_join(b, NULL);
	double m = median(rg.blocks, rg.nblocks);
	free(rg.blocks);
	return m;
}

/* ------------------------------------------------- exchange tail */

/* Bar 5's floor: a raw cross-CPU exchange as long as fanout's hot single
 * child (k round trips per timed sample), timed the same way; a stall of
 * the host lands in a sample in proportion to its length. */
static struct {
	_Alignas(64) _Atomic uint64_t flag;
	_Atomic unsigned ready;
	uint64_t samples;
	unsigned k;
	uint64_t *v;
} xp;

static void xp_gate(void)
{
	atomic_fetch_add(&xp.ready, 1);
	while (atomic_load(&xp.ready) < 2)
		ck_pr_stall();
}

static void *xp_asker(void *arg)
{
	uint64_t i = 0;
	pin(0);
	xp_gate();
	for (uint64_t s = 0; s < xp.samples; s++) {
		uint64_t t0 = now_ns();
		for (unsigned j = 0; j < xp.k; j++) {
			i++;
			atomic_store_explicit(&xp.flag, 2 * i - 1,
					      memory_order_release);
			while (atomic_load_explicit(
				       &xp.flag, memory_order_acquire) != 2 * i)
				;
		}
		xp.v[s] = now_ns() - t0;
	}
	return NULL;
}

static void *xp_answerer(void *arg)
{
	pin(1);
	xp_gate();
	for (uint64_t i = 1; i <= xp.samples * xp.k; i++) {
		while (atomic_load_explicit(&xp.flag, memory_order_acquire) !=
		       2 * i - 1)
			;
		atomic_store_explicit(&xp.flag, 2 * i, memory_order_release);
	}
	return NULL;
}

static double pct(uint64_t *v, size_t n, double q);

static void exchange_tail(unsigned k, uint64_t n, double *p50, double *p999)
{
	pthread_t a, b;
	xp.samples = n;
	xp.k = k;
	xp.v = malloc(n * sizeof(*xp.v));
	if (!xp.v)
		die("out of memory");
	atomic_store(&xp.flag, 0);
	atomic_store(&xp.ready, 0);
	if (pthread_create(&a, NULL, xp_asker, NULL) ||
	    pthread_create(&b, NULL, xp_answerer, NULL))
		die("pthread_create failed");
	pthread_join(a, NULL);
	pthread_join(b, NULL);
	*p50 = pct(xp.v, n, 0.5);
	*p999 = pct(xp.v, n, 0.999);
	free(xp.v);
}

/* ---------------------------------------------------------- python */

static const char py_src[] =
	"import sys, time, itertools\n"
	"from concurrent.futures import ThreadPoolExecutor, wait\n"
	"threads, batch, secs = int(sys.argv[1]), int(sys.argv[2]), "
	"float(sys.argv[3])\n"
	"tally = itertools.count()\n"
	"def child():\n"
	"    next(tally)\n"
	"with ThreadPoolExecutor(max_workers=threads) as ex:\n"
	"    for _ in range(20):\n"
	"        wait([ex.submit(child) for _ in range(batch)])\n"
	"    c0 = next(tally)\n"
	"    done, t0 = 0, time.monotonic()\n"
	"    while True:\n"
	"        wait([ex.submit(child) for _ in range(batch)])\n"
	"        done += batch\n"
	"        t = time.monotonic()\n"
	"        if t - t0 >= secs:\n"
	"            break\n"
	"    if next(tally) - c0 - 1 != done:\n"
	"        sys.exit(\"children lost\")\n"
	"print(done / (t - t0))\n";

/* Children/s of ThreadPoolExecutor, batches of @n one at a time; NaN if
 * python3 is missing. */
static double python_stream(unsigned n, uint64_t ns)
{
	char cmd[8192];
	snprintf(cmd, sizeof(cmd), "python3 -c '%s' %u %u %.3f 2>/dev/null",
		 py_src, nthreads, n, (double)ns / 1e9);
	FILE *p = popen(cmd, "r");
	double v = NAN;
	if (!p)
		return NAN;
	if (fscanf(p, "%lf", &v) != 1)
		v = NAN;
	if (pclose(p) != 0)
		v = NAN;
	return v;
}

/* ---------------------------------------------------------- records */

struct recs {
	double lookup_1k, lookup_big, list_keep, list_async, dram;
	size_t big;
};

/*
 * The floor of a lookup at 1M records: one dependent random 64-byte read
 * over 148 MiB (about the record table's size with 1M finished records),
 * a pointer chase through the lines in one random cycle (Sattolo), on
 * the pages malloc gives.  ns per read, over ~@ns.
 */
static double dram_read(uint64_t ns)
{
	size_t n = ((size_t)148 << 20) / 64;
	uint32_t *w = malloc(n * 64), *perm = malloc(n * sizeof(*perm));
	uint64_t x = 2463534242ull, k = 0, t0, t;
	uint32_t a = 0;
	if (!w || !perm)
		die("out of memory");
	for (size_t i = 0; i < n; i++)
		perm[i] = (uint32_t)i;
	for (size_t i = n - 1; i > 0; i--) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		size_t j = x % i;
		uint32_t v = perm[i];
		perm[i] = perm[j];
		perm[j] = v;
	}
	for (size_t i = 0; i < n; i++)
		w[(size_t)perm[i] * 16] = perm[(i + 1) % n];
	free(perm);
	const volatile uint32_t *vw = w;
	t0 = now_ns();
	do {
		for (int j = 0; j < 4096; j++, k++)
			a = vw[(size_t)a * 16];
	} while ((t = now_ns()) - t0 < ns);
	if (a >= n)
		die("DRAM chase broken");
	free(w);
	return (double)(t - t0) / (double)k;
}

static void fill(struct fanout_engine *e, fanout_id *ids, size_t from,
		 size_t to)
{
	struct fanout_sink *s = fanout_default_sink(e);
	struct fanout_batch b = {.tasks = tasks, .ntasks = 1};
	unsigned live = 0;
	for (size_t i = from; i < to;) {
		int rc = fanout_dispatch(e, &b, &ids[i]);
		if (rc == -EBUSY && live) {
			take_event(s, 1);
			live--;
			continue;
		}
		if (rc)
			die("fill: fanout_dispatch: %s", fanout_strerror(rc));
		i++;
		if (++live >= 64) {
			take_event(s, 1);
			live--;
		}
	}
	while (live--)
		take_event(s, 1);
}

/* Median ns of fanout_list(cap 100) over up to 21 calls; each must see
 * exactly @n records. */
static double list_page(struct fanout_engine *e, size_t n)
{
	static struct fanout_info infos[100];
	double t[21];
	size_t k = 0;
	uint64_t start = now_ns();
	do {
		size_t got;
		uint64_t t0 = now_ns();
		int rc = fanout_list(e, infos, 100, &got);
		t[k++] = (double)(now_ns() - t0);
		if (rc || got != n)
			die("fanout_list: %s, %zu records seen, %zu made",
			    fanout_strerror(rc), got, n);
	} while (k < 21 && now_ns() - start < dur(20));
	return median(t, k);
}

/* Mean ns of fanout_lookup() of random ids among @ids[0..n), ~@ns long.
 * The ids are drawn beforehand, @n of them, and read in order (drawn
 * inside the loop, each would add a miss on the id array at 1M). */
static double lookups(struct fanout_engine *e, const fanout_id *ids, size_t n,
		      uint64_t ns)
{
	static uint64_t x = 88172645463325252ull;
	fanout_id *seq = malloc(n * sizeof(*seq));
	uint64_t k = 0, t0, t;
	size_t at = 0;
	if (!seq)
		die("out of memory");
	for (size_t i = 0; i < n; i++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		seq[i] = ids[x % n];
	}
	t0 = now_ns();
	do {
		for (int j = 0; j < 256; j++, k++) {
			fanout_id id = seq[at];
			at = at + 1 < n ? at + 1 : 0;
			struct fanout_info info;
			int rc = fanout_lookup(e, id, &info);
			if (rc || info.id != id)
				die("fanout_lookup: %s",
				    rc ? fanout_strerror(rc) : "wrong record");
		}
	} while ((t = now_ns()) - t0 < ns);
	free(seq);
	return (double)(t - t0) / (double)k;
}

static void records(struct recs *out)
{
	struct fanout_config keep = {.keep_completed = 1u << 20};
	struct fanout_config wide = {.max_async = 1u << 20};
	size_t big = quick ? 100000 : 1000000;
	fanout_id *ids = malloc(big * sizeof(*ids));
	double a[MAX_ROUNDS], b[MAX_ROUNDS], c[MAX_ROUNDS], d[MAX_ROUNDS],
		m[MAX_ROUNDS];
	if (!ids)
		die("out of memory");
	struct fanout_engine *e = engine(&keep);
	struct fanout_engine *w = engine(&wide);
	fill(e, ids, 0, 1000);
	fanout_id wids[10];
	fill(w, wids, 0, 10);
	for (unsigned r = 0; r < rounds; r++) {
		a[r] = lookups(e, ids, 1000, dur(20));
		b[r] = list_page(e, 1000);
		c[r] = list_page(w, 10);
	}
	fill(e, ids, 1000, big);
	for (unsigned r = 0; r < rounds; r++) {
		d[r] = lookups(e, ids, big, dur(50));
		m[r] = dram_read(dur(50));
	}
	out->dram = median(m, rounds);
	out->lookup_1k = median(a, rounds);
	out->list_keep = median(b, rounds);
	out->list_async = median(c, rounds);
	out->lookup_big = median(d, rounds);
	out->big = big;
	fanout_destroy(w);
	fanout_destroy(e);
	free(ids);
}

/* ---------------------------------------------------------- the bars */

static int bar_no;
static unsigned n_hold, n_miss;

static void bar(int holds, const char *what, const char *target,
		const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void bar(int holds, const char *what, const char *target,
		const char *fmt, ...)
{
	char m[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(m, sizeof(m), fmt, ap);
	va_end(ap);
	n_hold += holds == 1;
	n_miss += holds == 0;
	fprintf(out, "  %d [%s] %s\n        target %s; measured %s\n", ++bar_no,
		holds < 0 ? " ?? " :
		holds	  ? "HOLD" :
			    "MISS",
		what, target, m);
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return (x > y) - (x < y);
}

static double pct(uint64_t *v, size_t n, double q)
{
	qsort(v, n, sizeof(*v), cmp_u64);
	size_t i = (size_t)(q * (double)n);
	return (double)v[i < n ? i : n - 1];
}

static const unsigned sizes[] = {1, 8, 64, 512, 4096};
#define NS (sizeof(sizes) / sizeof(sizes[0]))

static unsigned inflight(unsigned n)
{
	return n >= 16 ? 1 : 16 / n;
}

#define SECTION "\n## The independent check (bench/barcheck.c)\n"

/*
 * Replace (or add) the last section of @path, fanout-bench's RESULTS.md,
 * with this run's output; a file without the bench's header is left alone.
 */
static void write_results(const char *path)
{
	FILE *f = fopen(path, "r");
	if (!f) {
		fprintf(stderr, "barcheck: %s: %s; not written\n", path,
			strerror(errno));
		return;
	}
	char *old = NULL;
	size_t cap = 0, len = 0, k;
	char chunk[65536];
	while ((k = fread(chunk, 1, sizeof(chunk), f)) > 0) {
		if (len + k + 1 > cap) {
			cap = 2 * (len + k + 1);
			char *n = realloc(old, cap);
			if (!n)
				die("out of memory");
			old = n;
		}
		memcpy(old + len, chunk, k);
		len += k;
		old[len] = 0;
	}
	fclose(f);
	if (!old || strncmp(old, "# fanout-bench results", 22)) {
		fprintf(stderr,
			"barcheck: %s is not fanout-bench's results; "
			"not written\n",
			path);
		free(old);
		return;
	}
	char *cut = strstr(old, SECTION);
	if (cut)
		len = (size_t)(cut - old);
	f = fopen(path, "w");
	if (!f)
		die("%s: %s", path, strerror(errno));
	fwrite(old, 1, len, f);
	fprintf(f,
		SECTION
		"\nWritten by `build/barcheck/barcheck` (`make run` runs "
		"it right after fanout-bench): a separate program "
		"built against the installed library with "
		"`pkg-config --cflags --libs fanout`, sharing no code "
		"with fanout-bench.\n\n```text\n%s```\n",
		out_buf);
	fclose(f);
	free(old);
	fprintf(stderr, "barcheck: wrote its section of %s\n", path);
}

int main(int argc, char **argv)
{
	const char *results = NULL;
	out = open_memstream(&out_buf, &out_len);
	if (!out)
		die("open_memstream failed");
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--quick"))
			quick = true;
		else if (!strcmp(argv[i], "--results") && i + 1 < argc)
			results = argv[++i];
		else if (!strcmp(argv[i], "--rounds") && i + 1 < argc)
			rounds = (unsigned)atoi(argv[++i]);
		else if (!strcmp(argv[i], "--scale") && i + 1 < argc)
			scale = atof(argv[++i]);
		else {
			fprintf(stderr, "usage: barcheck [--rounds N] "
					"[--scale X] [--quick] "
					"[--results RESULTS.md]\n");
			return 2;
		}
	}
	if (quick) {
		rounds = 1;
		scale *= 0.2;
	}
	if (rounds < 1 || rounds > MAX_ROUNDS || !(scale > 0))
		die("--rounds 1..%d, --scale > 0", MAX_ROUNDS);
	long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	nthreads = ncpu > 0 && ncpu < MAX_THREADS ? (unsigned)ncpu : 2;
	for (unsigned i = 0; i < MAX_BATCH; i++)
		tasks[i] = (struct fanout_task){.goal = "barcheck",
						.fn = fo_child};
	char load0[64] = "", load1[64] = "";
	FILE *lf = fopen("/proc/loadavg", "r");
	if (lf) {
		if (fgets(load0, sizeof(load0), lf))
			load0[strcspn(load0, "\n")] = 0;
		fclose(lf);
	}
	uint64_t t_start = now_ns();

	struct fanout_engine *e = engine(NULL);
	/* the opt-in helping wait, shown beside bars 1 and 9, not judged */
	struct fanout_engine *eh =
		engine(&(struct fanout_config){.flags = FANOUT_WAIT_HELPS});
	barcheck_tbb_init(nthreads, MAX_INFLIGHT);
	mp_start();

	/* throughput: [size][round] */
	double fo[NS][MAX_ROUNDS], fh[NS][MAX_ROUNDS], fr[NS][MAX_ROUNDS],
		tb[NS][MAX_ROUNDS], tb1[NS][MAX_ROUNDS], pc512[MAX_ROUNDS],
		py[MAX_ROUNDS], ring[MAX_ROUNDS];
	unsigned npy = 0;
	for (unsigned s = 0; s < NS; s++) { /* warm-up */
		fo_stream(e, sizes[s], inflight(sizes[s]), dur(10), NULL);
		fo_stream(eh, sizes[s], inflight(sizes[s]), dur(10), NULL);
		fo_run_stream(e, sizes[s], dur(10));
		tbb_stream(sizes[s], inflight(sizes[s]), dur(10));
	}
	for (unsigned r = 0; r < rounds; r++) {
		for (unsigned s = 0; s < NS; s++) {
			unsigned n = sizes[s], k = inflight(n);
			double bt;
			fo[s][r] = fo_stream(e, n, k, dur(60), &bt);
			if (n == 512)
				pc512[r] = bt / 512;
			fh[s][r] = fo_stream(eh, n, k, dur(60), NULL);
			fr[s][r] = fo_run_stream(e, n, dur(60));
			tb[s][r] = tbb_stream(n, k, dur(60));
			tb1[s][r] =
				k == 1 ? tb[s][r] : tbb_stream(n, 1, dur(60));
		}
		double v = python_stream(64, dur(100));
		if (!isnan(v))
			py[npy++] = v;
		ring[r] = ring_handoff();
	}
	fanout_destroy(eh); /* idle from here: out of the way of latency */

	/* latency: samples of all rounds pooled */
	unsigned nhot = quick ? 500 : 3000, npark = quick ? 10 : 40;
	size_t cap_hot = (size_t)nhot * rounds,
	       cap_park = (size_t)npark * rounds;
	uint64_t *h_fo = malloc(cap_hot * 8), *h_run = malloc(cap_hot * 8),
		 *h_tbb = malloc(cap_hot * 8), *p_fo = malloc(cap_park * 8),
		 *p_mp = malloc(cap_park * 8);
	if (!h_fo || !h_run || !h_tbb || !p_fo || !p_mp)
		die("out of memory");
	struct fanout_sink *sink = fanout_default_sink(e);
	size_t ih = 0, ip = 0;
	uint64_t c0 = children_ran();
	for (unsigned r = 0; r < rounds; r++) {
		/*
		 * One peer at a time (a block of samples each), not one sample
		 * of each in turn: a peer's workers spin a while after their
		 * last child, and on a small machine that would tax whoever
		 * came next on every sample.
		 */
		for (unsigned i = 0; i < nhot; i++) {
			uint64_t t0 = now_ns();
			dispatch(e, 1);
			take_event(sink, 1);
			h_fo[ih + i] = now_ns() - t0;
		}
		for (unsigned i = 0; i < nhot; i++) {
			uint64_t t0 = now_ns();
			run(e, 1);
			h_run[ih + i] = now_ns() - t0;
		}
		for (unsigned i = 0; i < nhot; i++) {
			uint64_t t0 = now_ns();
			barcheck_tbb_batch(1);
			h_tbb[ih + i] = now_ns() - t0;
		}
		ih += nhot;
		for (unsigned i = 0; i < npark; i++, ip++) {
			sleep_ns(2000000);
			uint64_t t0 = now_ns();
			dispatch(e, 1);
			take_event(sink, 1);
			p_fo[ip] = now_ns() - t0;
			sleep_ns(2000000);
			t0 = now_ns();
			mp_one();
			p_mp[ip] = now_ns() - t0;
		}
	}
	check_ran("latency", c0, 3 * ih + 2 * ip);
	double fo_p50 = pct(h_fo, ih, 0.5), fo_p999 = pct(h_fo, ih, 0.999),
	       run_p50 = pct(h_run, ih, 0.5), tbb_p50 = pct(h_tbb, ih, 0.5),
	       fo_park = pct(p_fo, ip, 0.5), mp_park = pct(p_mp, ip, 0.5);
	mp_stop();
	barcheck_tbb_fini();
	fanout_destroy(e);
	double xk_p50 = NAN, xk_p999 = NAN;
	unsigned xk = 0;
	if (sysconf(_SC_NPROCESSORS_ONLN) > 1 && fo_p50 > 0) {
		double r50, r999;
		long k;

		exchange_tail(1, cap_hot, &r50, &r999);
		k = r50 > 0 ? lround(fo_p50 / r50) : 1;
		xk = k < 1 ? 1 : k > 64 ? 64 : (unsigned)k;
		exchange_tail(xk, cap_hot, &xk_p50, &xk_p999);
	}

	struct recs rc;
	records(&rc);

	lf = fopen("/proc/loadavg", "r");
	if (lf) {
		if (fgets(load1, sizeof(load1), lf))
			load1[strcspn(load1, "\n")] = 0;
		fclose(lf);
	}

	double m_fo[NS], m_fh[NS], m_fr[NS], m_tb[NS], m_tb1[NS];
	for (unsigned s = 0; s < NS; s++) {
		m_fo[s] = median(fo[s], rounds);
		m_fh[s] = median(fh[s], rounds);
		m_fr[s] = median(fr[s], rounds);
		m_tb[s] = median(tb[s], rounds);
		m_tb1[s] = median(tb1[s], rounds);
	}
	double m_pc = median(pc512, rounds), m_ring = median(ring, rounds),
	       m_py = median(py, npy);

	fprintf(out,
		"\n== independent check: bench/barcheck.c, built against the "
		"installed libfanout %s\n   (pkg-config --cflags --libs "
		"fanout); %u threads, %u rounds%s, %.1f s ==\n",
		fanout_version(), nthreads, rounds, quick ? " (--quick)" : "",
		(double)(now_ns() - t_start) / 1e9);
	fprintf(out, "   load average at start: %s; at end: %s\n", load0,
		load1);
	fprintf(out,
		"  %-16s %12s %12s %12s %12s %12s   (children/s, medians)\n",
		"batch", "fanout", "onetbb", "fanout_run", "onetbb 1 in flt",
		"fanout_help");
	for (unsigned s = 0; s < NS; s++) {
		char lbl[32];
		snprintf(lbl, sizeof(lbl), "%u (%u in flt)", sizes[s],
			 inflight(sizes[s]));
		fprintf(out,
			"  %-16s %11.3gM %11.3gM %11.3gM %11.3gM %11.3gM\n",
			lbl, m_fo[s] / 1e6, m_tb[s] / 1e6, m_fr[s] / 1e6,
			m_tb1[s] / 1e6, m_fh[s] / 1e6);
	}
	fprintf(out,
		"  (fanout_run is always 1 in flight and is compared with the "
		"fourth column; fanout_help: FANOUT_WAIT_HELPS, not judged)\n");
	fprintf(out,
		"  hot single child, us: fanout p50 %.3f p999 %.3f; fanout_run "
		"p50 %.3f; onetbb p50 %.3f\n",
		fo_p50 / 1e3, fo_p999 / 1e3, run_p50 / 1e3, tbb_p50 / 1e3);
	if (xk)
		fprintf(out,
			"  hot p999/p50 floor: a raw cross-CPU exchange as "
			"long "
			"(%u round trips per sample), %.1fx (p999 %.3f us, p50 "
			"%.3f us)\n",
			xk, xk_p999 / xk_p50, xk_p999 / 1e3, xk_p50 / 1e3);
	fprintf(out,
		"  after 2 ms idle, p50 us: fanout %.2f; mutex+condvar pool "
		"%.2f\n",
		fo_park / 1e3, mp_park / 1e3);
	fprintf(out,
		"  batch 512: %.1f ns per child; raw ck_ring SPSC handoff %.1f "
		"ns/item\n",
		m_pc, m_ring);
	fprintf(out,
		"  records: lookup %.1f ns at 1k, %.1f ns at %zuk; list(100) "
		"%.2f us (keep_completed 2^20, 1000 records), %.2f us "
		"(max_async 2^20, 10 records)\n",
		rc.lookup_1k, rc.lookup_big, rc.big / 1000, rc.list_keep / 1e3,
		rc.list_async / 1e3);
	fprintf(out,
		"  DRAM random read (148 MiB, pointer chase): %.1f ns, the "
		"floor of a lookup at 1M records\n",
		rc.dram);
	fprintf(out, "  python ThreadPoolExecutor, batch 64: %s\n",
		npy ? "measured" : "python3 not available");

	fprintf(out, "\n== the bars (issue 13), measured by barcheck ==\n");
	{
		static const double need[NS] = {0.5, 1, 1, 1, 1};
		char m[400];
		size_t len = 0;
		int h = 1;
		for (unsigned s = 0; s < NS; s++) {
			double x = m_fo[s] / m_tb[s];
			h &= x >= need[s];
			len += (size_t)snprintf(m + len, sizeof(m) - len,
						"%s%u: %.2fx", s ? ", " : "",
						sizes[s], x);
		}
		for (unsigned s = 0; s < NS; s++)
			len += (size_t)snprintf(
				m + len, sizeof(m) - len, "%s%u: %.2fx",
				s ? ", " :
				    "; with FANOUT_WAIT_HELPS (not judged) ",
				sizes[s], m_fh[s] / m_tb[s]);
		bar(h,
		    "fanout (dispatch + wait) vs oneTBB, no-op children/s, "
		    "batch 1 (16 in flight), 8, 64, 512, 4096",
		    ">= 0.5x at 1, >= 1x at 8..4096", "%s", m);
		len = 0;
		h = 1;
		for (unsigned s = 0; s < NS; s++) {
			double x = m_fr[s] / m_tb1[s];
			h &= x >= 1;
			len += (size_t)snprintf(m + len, sizeof(m) - len,
						"%s%u: %.2fx", s ? ", " : "",
						sizes[s], x);
		}
		bar(h,
		    "fanout_run vs oneTBB (task_group run + wait), no-op "
		    "children/s, 1 batch in flight, batch 1..4096",
		    ">= 1x at every size", "%s", m);
	}
	bar(run_p50 <= 1.5 * tbb_p50,
	    "fanout_run hot single-child p50 vs oneTBB's", "<= 1.5x",
	    "%.2fx (%.3f us vs %.3f us)", run_p50 / tbb_p50, run_p50 / 1e3,
	    tbb_p50 / 1e3);
	bar(fo_park <= mp_park,
	    "parked single-child p50 (2 ms idle) vs the mutex pool's", "<= 1x",
	    "%.2fx (%.2f us vs %.2f us)", fo_park / mp_park, fo_park / 1e3,
	    mp_park / 1e3);
	if (xk)
		bar(fo_p999 <= 10 * fo_p50, "hot single-child p999 vs hot p50",
		    "<= 10x",
		    "%.2fx (%.3f us vs %.3f us); floor: a raw cross-CPU "
		    "exchange as long, %u round trips per sample, %.1fx",
		    fo_p999 / fo_p50, fo_p999 / 1e3, fo_p50 / 1e3, xk,
		    xk_p999 / xk_p50);
	else
		bar(fo_p999 <= 10 * fo_p50, "hot single-child p999 vs hot p50",
		    "<= 10x", "%.2fx (%.3f us vs %.3f us)", fo_p999 / fo_p50,
		    fo_p999 / 1e3, fo_p50 / 1e3);
	bar(m_pc <= 2 * m_ring,
	    "per-child cost at batch 512 (median batch / 512) vs one raw "
	    "ck_ring SPSC handoff",
	    "<= 2x", "%.2fx (%.1f ns vs %.1f ns)", m_pc / m_ring, m_pc, m_ring);
	bar(rc.list_keep <= 100e3 && rc.list_async <= 100e3,
	    "fanout_list of 100 records: keep_completed 2^20 with 1000 "
	    "records; max_async 2^20 with 10 records",
	    "<= 100 us each", "%.4g us; %.4g us", rc.list_keep / 1e3,
	    rc.list_async / 1e3);
	{
		char what[96];
		snprintf(what, sizeof(what),
			 "fanout_lookup with %s records vs with 1k",
			 quick ? "100k (--quick)" : "1M");
		bar(rc.lookup_big <= 3 * rc.lookup_1k, what, "<= 3x",
		    "%.2fx (%.1f ns vs %.1f ns; one DRAM read %.1f ns)",
		    rc.lookup_big / rc.lookup_1k, rc.lookup_big, rc.lookup_1k,
		    rc.dram);
	}
	if (npy)
		bar(m_fo[2] / m_py >= 200,
		    "no-op children/s, batch 64, fanout vs Python's "
		    "ThreadPoolExecutor",
		    ">= 200x",
		    "%.0fx (%.3gM vs %.3gk/s); with FANOUT_WAIT_HELPS (not "
		    "judged) %.0fx",
		    m_fo[2] / m_py, m_fo[2] / 1e6, m_py / 1e3, m_fh[2] / m_py);
	else
		bar(-1,
		    "no-op children/s, batch 64, fanout vs Python's "
		    "ThreadPoolExecutor",
		    ">= 200x", "not measured (python3 missing)");
	fprintf(out, "  barcheck: %u hold, %u miss, %d not measured\n", n_hold,
		n_miss, bar_no - (int)(n_hold + n_miss));
	fclose(out);
	fputs(out_buf, stdout);
	if (results)
		write_results(results);
	free(out_buf);
	free(h_fo);
	free(h_run);
	free(h_tbb);
	free(p_fo);
	free(p_mp);
	return 0;
}
