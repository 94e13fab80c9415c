/* SPDX-License-Identifier: MIT */
/*
 * bench.h - shared pieces of fanout-bench: clocks, statistics, an HDR-style
 * latency histogram, the calibrated child workload, the peer harness and the
 * figure registry every report (table, --json, RESULTS.md, plots) is made of.
 *
 * HONESTY RULES the whole program follows
 *   - A child counts only when it ran: every child, of every peer, goes
 *     through bench_child(), which bumps a per-thread counter.  After each
 *     measurement the counters are summed and must equal what the driver
 *     believes completed, or the program aborts.
 *   - fanout's events are checked: each accepted delegation must produce
 *     exactly one event with the right nresults and status, or the program
 *     aborts (bench_die()).
 *   - Throughput figures are medians over >= 5 rounds after a warm-up, peers
 *     interleaved inside each round so that a noisy neighbour hurts all of
 *     them alike; ratios come from the same run.
 *   - Latency percentiles come from a histogram pooled over all rounds;
 *     open-loop latency is measured from the intended send time, so a
 *     sender that falls behind is charged for it (no coordinated omission).
 */
#ifndef BENCH_H
#define BENCH_H

#ifndef __cplusplus
#include <stdatomic.h>
#endif
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------- basics */

#define BENCH_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define BENCH_CACHELINE 64

/* CLOCK_MONOTONIC in ns: the clock fanout_now_ns() uses too. */
uint64_t bench_now_ns(void);
void bench_sleep_ns(uint64_t ns);
/* Print "fanout-bench: error: ..." and exit(2).  For broken invariants. */
void bench_die(const char *fmt, ...)
	__attribute__((format(printf, 1, 2), noreturn));
void bench_note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
unsigned bench_ncpus(void);
int bench_pin_self(int cpu);

/* xorshift64*: deterministic, per caller state. */
static inline uint64_t bench_rand(uint64_t *s)
{
	uint64_t x = *s;
	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	*s = x;
	return x * 0x2545F4914F6CDD1DULL;
}

/* ------------------------------------------------------------- statistics */

double bench_median(const double *v, size_t n);
double bench_min(const double *v, size_t n);
double bench_max(const double *v, size_t n);

/*
 * struct bench_hist - log-linear histogram of ns values, HDR style: exact
 * below 256 ns, then 128 sub-buckets per power of two (< 0.8% error), up to
 * 2^63 ns.  Min, max, count and sum are exact.
 */
#define BENCH_HIST_SUB 128
#define BENCH_HIST_BUCKETS (256 + 56 * BENCH_HIST_SUB)
struct bench_hist {
	uint64_t count;
	uint64_t min;
	uint64_t max;
	double sum;
	uint64_t b[BENCH_HIST_BUCKETS];
};
struct bench_hist *bench_hist_new(void);
void bench_hist_free(struct bench_hist *h);
void bench_hist_reset(struct bench_hist *h);
void bench_hist_add(struct bench_hist *h, uint64_t v);
void bench_hist_merge(struct bench_hist *dst, const struct bench_hist *src);
/* Value at quantile q in [0,1] (bucket midpoint; exact max for q = 1). */
double bench_hist_quantile(const struct bench_hist *h, double q);

/* ------------------------------------------------------------- workload */

/*
 * struct bwork - what one child does: @iters iterations of a calibrated
 * busy loop (0 = a no-op child).  @ns is the nominal duration.
 */
struct bwork {
	uint64_t iters;
	uint64_t ns;
};

/* Busy-loop iterations per ns, measured once by bench_calibrate(). */
extern double bench_iters_per_ns;
void bench_calibrate(void);
struct bwork bench_work_ns(uint64_t ns);

/*
 * Single-writer per-thread counter, one cache line per thread.  Accessed
 * with the __atomic builtins so that the C++ peer (TBB) shares the header.
 */
struct bench_tcount {
	uint64_t n;
	char pad[BENCH_CACHELINE - sizeof(uint64_t)];
};
extern __thread struct bench_tcount *bench_tl_count;
struct bench_tcount *bench_tcount_register(void);
/* Children run by all threads since the start of the program. */
uint64_t bench_children_total(void);

static inline void bench_spin_iters(uint64_t n)
{
	for (uint64_t i = 0; i < n; i++)
		__asm__ __volatile__("" ::: "memory");
}

/* The one child body every peer runs. */
static inline void bench_child(const struct bwork *w)
{
	struct bench_tcount *c = bench_tl_count;
	if (__builtin_expect(c == NULL, 0))
		c = bench_tcount_register();
	/* Single writer: a relaxed load+store, no locked instruction. */
	__atomic_store_n(&c->n, __atomic_load_n(&c->n, __ATOMIC_RELAXED) + 1,
			 __ATOMIC_RELAXED);
	if (w->iters)
		bench_spin_iters(w->iters);
}

/* ------------------------------------------------------------- threads */

/* Thread ids of this process, sorted; returns count (<= cap). */
size_t bench_list_tids(pid_t *tids, size_t cap);
/* CPU time (user+system) of one thread of this process, in ns. */
uint64_t bench_thread_cpu_ns(pid_t tid);
#ifndef __cplusplus
/* Futex helpers on a 32-bit word. */
struct timespec;
int bench_futex_wait(_Atomic uint32_t *w, uint32_t val,
		     const struct timespec *ts);
int bench_futex_wake(_Atomic uint32_t *w, int n);
#endif

/* ------------------------------------------------------------- peers */

/*
 * struct peer_ops - one fan-out engine behind the harness.  Every peer runs
 * the same workload with the same number of threads.
 *
 * @create:    start the engine with @nthreads workers; 0 or -errno.
 * @destroy:   stop and free it.
 * @enter:     run @body(@arg) in the context the engine's API needs (an
 *             OpenMP parallel region); NULL = call it directly.
 * @batch_new: storage for one in-flight batch of up to @maxn children,
 *             allocated outside any timed region.
 * @submit:    start @n children, each running bench_child(@w), into batch
 *             @b; returns without waiting (NULL if the engine has no
 *             asynchronous submit).
 * @join:      wait until every child of @b ran.
 * @run:       submit and join in one structured call (a taskgroup,
 *             fanout_run); NULL if the engine has none.  Used when one
 *             batch at a time is in flight.
 * @rejected:  optional: calls refused for capacity so far (-EBUSY).
 * @split_ok:  submit and join may be called from two different threads
 *             (for different batches) at the same time: open-loop capable.
 */
struct peer_ops {
	const char *name;
	const char *desc;
	int (*create)(unsigned nthreads, void **ctx);
	void (*destroy)(void *ctx);
	void (*enter)(void *ctx, void (*body)(void *), void *arg);
	void *(*batch_new)(void *ctx, unsigned maxn);
	void (*batch_free)(void *ctx, void *b);
	void (*submit)(void *ctx, void *b, unsigned n, const struct bwork *w);
	void (*join)(void *ctx, void *b);
	void (*run)(void *ctx, void *b, unsigned n, const struct bwork *w);
	uint64_t (*rejected)(void *ctx);
	bool split_ok;
};

extern const struct peer_ops peer_fanout_dispatch;
extern const struct peer_ops peer_fanout_run;
extern const struct peer_ops peer_fanout_help;
/* Only when fanout.h (included before this header) has the flag. */
#ifdef FANOUT_NO_CHILD_CLOCK
extern const struct peer_ops peer_fanout_noclock;
#endif
#ifdef FANOUT_RUNNERS_ON_DEMAND
extern const struct peer_ops peer_fanout_ondemand;
#endif
#ifdef BENCH_HAVE_PEERS
extern const struct peer_ops peer_mutexpool;
extern const struct peer_ops peer_uv;
extern const struct peer_ops peer_glib;
extern const struct peer_ops peer_omp;
extern const struct peer_ops peer_tbb;
#endif

/* ------------------------------------------------------------- figures */

enum bench_better { BENCH_HIGHER = 1, BENCH_LOWER = -1, BENCH_INFO = 0 };

/*
 * struct bench_fig - one number of the report.  @scen groups figures into
 * one table; @metric is the row/column name inside it; @peer who it is of.
 */
struct bench_fig {
	char scen[40];
	char metric[48];
	char peer[24];
	char unit[16];
	double value;
	int better;
};

void bench_fig_add(const char *scen, const char *metric, const char *peer,
		   double value, const char *unit, int better);
const struct bench_fig *bench_fig_find(const char *scen, const char *metric,
				       const char *peer);
size_t bench_fig_count(void);
const struct bench_fig *bench_fig_at(size_t i);

/* ------------------------------------------------------------- options */

struct bench_opts {
	unsigned rounds;
	unsigned nthreads;
	double scale; /* multiplies every duration */
	bool json;
	bool quick;  /* fanout alone: orchestrator + fanout sweeps */
	bool longer; /* make bench: bigger sweeps */
	bool no_python;
	bool no_plots;
	bool verbose;
	const char *only;    /* comma list of scenario names, NULL = all */
	const char *peers;   /* comma list of peer names, NULL = all */
	const char *sizes;   /* comma list of batch sizes, NULL = all */
	char load_start[64]; /* /proc/loadavg when the run began and ended */
	char load_end[64];
	const char *outdir;  /* bench/out */
	const char *results; /* bench/RESULTS.md */
	const char *python;  /* path of peer-python.py */
	FILE *out;	     /* where the human table goes */
};
extern struct bench_opts bench_opt;
bool bench_want(const char *scenario);
/* Is @name in the comma-separated @list (NULL or "" = everything)? */
bool bench_in_list(const char *list, const char *name);

#ifdef __cplusplus
}
#endif
#endif /* BENCH_H */
