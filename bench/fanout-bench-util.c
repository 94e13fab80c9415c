/* SPDX-License-Identifier: MIT */
/*
 * fanout-bench-util.c - clocks, statistics, histogram, calibrated busy loop,
 * per-thread child counters, thread CPU time, futex, figure registry.
 */
#include "bench.h"

#include <dirent.h>
#include <errno.h>
#include <linux/futex.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

struct bench_opts bench_opt;

uint64_t bench_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void bench_sleep_ns(uint64_t ns)
{
	struct timespec ts = {.tv_sec = (time_t)(ns / 1000000000ull),
			      .tv_nsec = (long)(ns % 1000000000ull)};
	while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
		;
}

void bench_die(const char *fmt, ...)
{
	va_list ap;
	fflush(stdout);
	fputs("fanout-bench: error: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(2);
}

void bench_note(const char *fmt, ...)
{
	va_list ap;
	if (!bench_opt.verbose)
		return;
	fputs("fanout-bench: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
}

unsigned bench_ncpus(void)
{
	cpu_set_t set;
	if (sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0)
		return (unsigned)CPU_COUNT(&set);
	long n = sysconf(_SC_NPROCESSORS_ONLN);
	return n > 0 ? (unsigned)n : 1;
}

int bench_pin_self(int cpu)
{
	cpu_set_t set;
	CPU_ZERO(&set);
	CPU_SET(cpu, &set);
	return -pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
}

/* ------------------------------------------------------------- statistics */

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

double bench_median(const double *v, size_t n)
{
	if (n == 0)
		return NAN;
	double *t = malloc(n * sizeof(*t));
	if (!t)
		bench_die("out of memory");
	memcpy(t, v, n * sizeof(*t));
	qsort(t, n, sizeof(*t), cmp_double);
	double m = n % 2 ? t[n / 2] : (t[n / 2 - 1] + t[n / 2]) / 2;
	free(t);
	return m;
}

double bench_min(const double *v, size_t n)
{
	double m = INFINITY;
	for (size_t i = 0; i < n; i++)
		if (v[i] < m)
			m = v[i];
	return n ? m : NAN;
}

double bench_max(const double *v, size_t n)
{
	double m = -INFINITY;
	for (size_t i = 0; i < n; i++)
		if (v[i] > m)
			m = v[i];
	return n ? m : NAN;
}

/* ------------------------------------------------------------- histogram */

struct bench_hist *bench_hist_new(void)
{
	struct bench_hist *h = calloc(1, sizeof(*h));
	if (!h)
		bench_die("out of memory");
	h->min = UINT64_MAX;
	return h;
}

void bench_hist_free(struct bench_hist *h)
{
	free(h);
}

void bench_hist_reset(struct bench_hist *h)
{
	memset(h, 0, sizeof(*h));
	h->min = UINT64_MAX;
}

/*
 * Index layout: values 0..255 map to themselves.  A larger value with its
 * top bit at position m (m >= 8) is shifted right by s = m - 7, leaving
 * 128..255; those 128 sub-buckets of each power of two follow one another.
 */
static unsigned hist_index(uint64_t v)
{
	if (v < 256)
		return (unsigned)v;
	unsigned m = 63u - (unsigned)__builtin_clzll(v);
	unsigned s = m - 7;
	return 256 + (s - 1) * BENCH_HIST_SUB + (unsigned)((v >> s) - 128);
}

static void hist_range(unsigned idx, double *lo, double *width)
{
	if (idx < 256) {
		*lo = idx;
		*width = 1;
		return;
	}
	unsigned s = (idx - 256) / BENCH_HIST_SUB + 1;
	unsigned sub = (idx - 256) % BENCH_HIST_SUB + 128;
	*lo = ldexp((double)sub, (int)s);
	*width = ldexp(1.0, (int)s);
}

void bench_hist_add(struct bench_hist *h, uint64_t v)
{
	h->b[hist_index(v)]++;
	h->count++;
	h->sum += (double)v;
	if (v < h->min)
		h->min = v;
	if (v > h->max)
		h->max = v;
}

void bench_hist_merge(struct bench_hist *dst, const struct bench_hist *src)
{
	for (unsigned i = 0; i < BENCH_HIST_BUCKETS; i++)
		dst->b[i] += src->b[i];
	dst->count += src->count;
	dst->sum += src->sum;
	if (src->min < dst->min)
		dst->min = src->min;
	if (src->max > dst->max)
		dst->max = src->max;
}

double bench_hist_quantile(const struct bench_hist *h, double q)
{
	if (h->count == 0)
		return NAN;
	if (q >= 1.0)
		return (double)h->max;
	if (q <= 0.0)
		return (double)h->min;
	/* The rank-th smallest value, rank counted from 1. */
	uint64_t rank = (uint64_t)ceil(q * (double)h->count);
	if (rank < 1)
		rank = 1;
	uint64_t seen = 0;
	for (unsigned i = 0; i < BENCH_HIST_BUCKETS; i++) {
		seen += h->b[i];
		if (seen >= rank) {
			double lo, w;
			hist_range(i, &lo, &w);
			double mid = w > 1 ? lo + w / 2 : lo;
			if (mid > (double)h->max)
				mid = (double)h->max;
			if (mid < (double)h->min)
				mid = (double)h->min;
			return mid;
		}
	}
	return (double)h->max;
}

/* ------------------------------------------------------------- workload */

double bench_iters_per_ns = 1.0;

void bench_calibrate(void)
{
	/*
	 * The busy loop runs a fixed number of iterations, so a child that is
	 * preempted still does exactly its work.  Calibrate on the fastest of
	 * several runs: that is the loop's speed when nobody interferes.
	 */
	const uint64_t n = 500000;
	double best = INFINITY;
	for (int i = 0; i < 60; i++) {
		uint64_t t0 = bench_now_ns();
		bench_spin_iters(n);
		uint64_t dt = bench_now_ns() - t0;
		if ((double)dt < best)
			best = (double)dt;
	}
	bench_iters_per_ns = (double)n / best;
}

struct bwork bench_work_ns(uint64_t ns)
{
	struct bwork w = {
		.iters = (uint64_t)llround((double)ns * bench_iters_per_ns),
		.ns = ns};
	if (ns && w.iters == 0)
		w.iters = 1;
	return w;
}

#define BENCH_MAX_COUNTERS 1024
static struct bench_tcount counters[BENCH_MAX_COUNTERS]
	__attribute__((aligned(BENCH_CACHELINE)));
static _Atomic unsigned ncounters;
__thread struct bench_tcount *bench_tl_count;

struct bench_tcount *bench_tcount_register(void)
{
	unsigned i =
		atomic_fetch_add_explicit(&ncounters, 1, memory_order_relaxed);
	if (i >= BENCH_MAX_COUNTERS)
		bench_die("more than %d threads ran children",
			  BENCH_MAX_COUNTERS);
	bench_tl_count = &counters[i];
	return bench_tl_count;
}

uint64_t bench_children_total(void)
{
	uint64_t s = 0;
	unsigned n = atomic_load_explicit(&ncounters, memory_order_acquire);
	if (n > BENCH_MAX_COUNTERS)
		n = BENCH_MAX_COUNTERS;
	for (unsigned i = 0; i < n; i++)
		s += __atomic_load_n(&counters[i].n, __ATOMIC_RELAXED);
	return s;
}

/* ------------------------------------------------------------- threads */

static int cmp_pid(const void *a, const void *b)
{
	pid_t x = *(const pid_t *)a, y = *(const pid_t *)b;
	return (x > y) - (x < y);
}

size_t bench_list_tids(pid_t *tids, size_t cap)
{
	DIR *d = opendir("/proc/self/task");
	size_t n = 0;
	struct dirent *de;
	if (!d)
		return 0;
	while ((de = readdir(d)) != NULL) {
		if (de->d_name[0] < '0' || de->d_name[0] > '9')
			continue;
		if (n < cap)
			tids[n] = (pid_t)atoi(de->d_name);
		n++;
	}
	closedir(d);
	if (n > cap)
		n = cap;
	qsort(tids, n, sizeof(*tids), cmp_pid);
	return n;
}

uint64_t bench_thread_cpu_ns(pid_t tid)
{
	/*
	 * The kernel's per-thread CPU clock id: MAKE_THREAD_CPUCLOCK(tid,
	 * CPUCLOCK_SCHED) = (~tid << 3) | CPUCLOCK_PERTHREAD_MASK(4) | SCHED(2).
	 * It has ns resolution, unlike the tick counts of /proc/.../stat.
	 */
	clockid_t id = (clockid_t)(((~(unsigned)tid) << 3) | 6u);
	struct timespec ts;
	if (clock_gettime(id, &ts) == 0)
		return (uint64_t)ts.tv_sec * 1000000000ull +
		       (uint64_t)ts.tv_nsec;
	/* Fallback: utime + stime ticks of /proc/self/task/TID/stat. */
	char path[64], buf[1024];
	snprintf(path, sizeof(path), "/proc/self/task/%d/stat", (int)tid);
	FILE *f = fopen(path, "r");
	if (!f)
		return 0;
	size_t len = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[len] = 0;
	char *p = strrchr(buf, ')');
	unsigned long long ut = 0, st = 0;
	if (!p ||
	    sscanf(p + 2,
		   "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut,
		   &st) != 2)
		return 0;
	long hz = sysconf(_SC_CLK_TCK);
	return (ut + st) * (1000000000ull / (uint64_t)(hz > 0 ? hz : 100));
}

int bench_futex_wait(_Atomic uint32_t *w, uint32_t val,
		     const struct timespec *ts)
{
	return (int)syscall(SYS_futex, (uint32_t *)w, FUTEX_WAIT_PRIVATE, val,
			    ts, NULL, 0);
}

int bench_futex_wake(_Atomic uint32_t *w, int n)
{
	return (int)syscall(SYS_futex, (uint32_t *)w, FUTEX_WAKE_PRIVATE, n,
			    NULL, NULL, 0);
}

/* ------------------------------------------------------------- figures */

static struct bench_fig *figs;
static size_t nfigs, capfigs;

void bench_fig_add(const char *scen, const char *metric, const char *peer,
		   double value, const char *unit, int better)
{
	if (nfigs == capfigs) {
		capfigs = capfigs ? capfigs * 2 : 256;
		figs = realloc(figs, capfigs * sizeof(*figs));
		if (!figs)
			bench_die("out of memory");
	}
	struct bench_fig *f = &figs[nfigs++];
	memset(f, 0, sizeof(*f));
	snprintf(f->scen, sizeof(f->scen), "%s", scen);
	snprintf(f->metric, sizeof(f->metric), "%s", metric);
	snprintf(f->peer, sizeof(f->peer), "%s", peer);
	snprintf(f->unit, sizeof(f->unit), "%s", unit);
	f->value = value;
	f->better = better;
}

const struct bench_fig *bench_fig_find(const char *scen, const char *metric,
				       const char *peer)
{
	for (size_t i = nfigs; i-- > 0;)
		if (!strcmp(figs[i].scen, scen) &&
		    !strcmp(figs[i].metric, metric) &&
		    !strcmp(figs[i].peer, peer))
			return &figs[i];
	return NULL;
}

size_t bench_fig_count(void)
{
	return nfigs;
}

const struct bench_fig *bench_fig_at(size_t i)
{
	return i < nfigs ? &figs[i] : NULL;
}

bool bench_want(const char *scenario)
{
	return bench_in_list(bench_opt.only, scenario);
}

bool bench_in_list(const char *list, const char *scenario)
{
	const char *s = list;
	size_t n = strlen(scenario);
	if (!s || !*s)
		return true;
	while (*s) {
		const char *e = strchr(s, ',');
		size_t len = e ? (size_t)(e - s) : strlen(s);
		if (len == n && !strncmp(s, scenario, n))
			return true;
		if (!e)
			break;
		s = e + 1;
	}
	return false;
}
