/* SPDX-License-Identifier: MIT */
/*
 * fanout-bench-records.c - the record table and the allocator.
 *
 * RECORDS: an engine with keep_completed large enough to keep every record,
 * filled with 1k, then 100k, then 1M finished single-child delegations.  At
 * each size: fanout_lookup() of random known ids (ns per call; the ids are
 * drawn before the clock starts into an array the timed loop reads in
 * order: drawing them from the 8 MB id array inside the loop added a
 * cache miss of the bench's own to every lookup at 1M), a full
 * fanout_list() (time per call and per record), and a one-page list (cap
 * 100, the median of up to 21 calls).  Then a one-page list on an engine
 * with max_async 2^20 holding 10 records.  Lookups must find their record
 * and every list must see exactly the records made, or the bench aborts.
 *
 * ALLOCATIONS: jemalloc's experimental hooks count every allocation and
 * deallocation made through the library's private jemalloc (installed
 * with fanout_test_mallctl(): the program's own malloc is another
 * allocator) by any thread while a fixed number of delegations run; the
 * counts are split between the calling thread (dispatch + consume) and all
 * others.  Bytes are the sizes asked for.
 */
#include "bench-fanout.h"
#include <fanout_testing.h>

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* --------------------------------------------------------------- records */

struct filler {
	struct fanout_engine *e;
	struct fanout_sink *sink;
	fanout_id *ids;
	size_t nids;
	unsigned inflight;
};

static void fill_consume(struct filler *f)
{
	struct fanout_event *ev;
	int rc = fanout_wait(f->sink, &ev, 10000);
	if (rc)
		bench_die("records: fanout_wait: %s", fanout_strerror(rc));
	bench_fo_check_event(ev, 1, false);
	fanout_event_free(ev);
	f->inflight--;
}

static void fill_to(struct filler *f, size_t n)
{
	static struct bwork noop;
	struct fanout_task t = {
		.goal = "record", .fn = bench_fo_child, .arg = &noop};
	struct fanout_batch b = {.tasks = &t, .ntasks = 1};
	while (f->nids < n) {
		int rc = fanout_dispatch(f->e, &b, &f->ids[f->nids]);
		if (rc == -EBUSY) {
			if (!f->inflight)
				bench_die("records: -EBUSY with nothing in "
					  "flight");
			fill_consume(f);
			continue;
		}
		if (rc)
			bench_die("records: fanout_dispatch: %s",
				  fanout_strerror(rc));
		f->nids++;
		f->inflight++;
		if (f->inflight >= 128)
			fill_consume(f);
	}
	while (f->inflight)
		fill_consume(f);
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

/*
 * One page: fanout_list(cap 100) with @n records alive, called up to 21
 * times or until 30 ms (x scale) have gone by; the median call, in ns.
 * Aborts unless every call saw exactly @n records.
 */
static double list_page(struct fanout_engine *e, struct fanout_info *infos,
			size_t n)
{
	double t[21];
	unsigned k = 0;
	uint64_t start = bench_now_ns();
	do {
		size_t got = 0;
		uint64_t t0 = bench_now_ns();
		int rc = fanout_list(e, infos, 100, &got);
		t[k++] = (double)(bench_now_ns() - t0);
		if (rc || got != n)
			bench_die("records: fanout_list(cap 100) with %zu "
				  "records: %s, saw %zu",
				  n, rc ? fanout_strerror(rc) : "ok", got);
	} while (k < BENCH_ARRAY_SIZE(t) &&
		 bench_now_ns() - start < 30e6 * bench_opt.scale);
	qsort(t, k, sizeof(t[0]), cmp_double);
	return t[k / 2];
}

/*
 * A page of 100 on an engine whose capacity is huge but which holds few
 * records: max_async 2^20 and 10 finished records (issue 13: a listing
 * must cost what the table holds, not what it could hold).
 */
static void records_big_capacity(void)
{
	struct fanout_config cfg = {.max_async = 1u << 20};
	struct filler f = {0};
	const size_t n = 10;
	FILE *o = bench_opt.out;
	cfg.workers = bench_opt.nthreads;
	int rc = fanout_create(&cfg, &f.e);
	if (rc) {
		fprintf(o,
			"  max_async 2^20: fanout_create failed: %s; "
			"skipped\n",
			fanout_strerror(rc));
		return;
	}
	f.sink = fanout_default_sink(f.e);
	f.ids = malloc(n * sizeof(*f.ids));
	struct fanout_info *infos = malloc(100 * sizeof(*infos));
	if (!f.ids || !infos)
		bench_die("out of memory");
	fill_to(&f, n);
	double lp[64];
	unsigned R = bench_opt.rounds, r;
	for (r = 0; r < R && r < 64; r++)
		lp[r] = list_page(f.e, infos, n);
	double m = bench_median(lp, r);
	bench_fig_add("records", "list 100 of 10, max_async 2^20", "fanout", m,
		      "ns", BENCH_LOWER);
	fprintf(o,
		"  max_async 2^20 (default keep_completed), %zu records: "
		"list(100) %.2f us (median of %u rounds)\n",
		n, m / 1e3, r);
	free(infos);
	free(f.ids);
	fanout_destroy(f.e);
}

void bench_records(void)
{
	static const size_t sizes[] = {1000, 100000, 1000000};
	const size_t maxn = sizes[BENCH_ARRAY_SIZE(sizes) - 1];
	/* 2^20: "keep_completed at 1M" of issue 13, room for every record */
	struct fanout_config cfg = {.keep_completed = 1u << 20};
	struct filler f = {0};
	int rc;
	cfg.workers = bench_opt.nthreads;
	rc = fanout_create(&cfg, &f.e);
	if (rc) {
		fprintf(bench_opt.out,
			"\n== records: fanout_create(keep_completed "
			"= %u) failed: %s; skipped ==\n",
			cfg.keep_completed, fanout_strerror(rc));
		return;
	}
	f.sink = fanout_default_sink(f.e);
	f.ids = malloc(maxn * sizeof(*f.ids));
	struct fanout_info *infos = malloc((maxn + 1024) * sizeof(*infos));
	unsigned nl = (unsigned)(200000 * bench_opt.scale) + 1000;
	fanout_id *seq = malloc(nl * sizeof(*seq));
	if (!f.ids || !infos || !seq)
		bench_die("out of memory");

	FILE *o = bench_opt.out;
	unsigned R = bench_opt.rounds;
	fprintf(o,
		"\n== record table: lookup / list with N finished records kept "
		"(keep_completed %u), median of rounds ==\n",
		cfg.keep_completed);
	fprintf(o, "  %9s %12s %14s %14s %14s %7s\n", "records", "lookup ns",
		"list(all) ms", "list ns/rec", "list(100) us", "rounds");
	uint64_t rng = 12345;
	for (size_t si = 0; si < BENCH_ARRAY_SIZE(sizes); si++) {
		size_t n = sizes[si];
		fill_to(&f, n);
		double lk[64], la[64], lp[64];
		/* Rounds: R, but with 1M records a listing takes seconds; stop
		 * after 3 rounds once 3 s (x scale) have gone by. */
		uint64_t t_size = bench_now_ns();
		unsigned r;
		for (r = 0; r < R && r < 64; r++) {
			if (r >= 3 &&
			    bench_now_ns() - t_size > 3e9 * bench_opt.scale)
				break;
			/* lookups of random known ids, at most ~100 ms worth */
			unsigned i;
			for (i = 0; i < nl; i++)
				seq[i] = f.ids[bench_rand(&rng) % n];
			uint64_t t0 = bench_now_ns(), cap_ns = 100000000;
			for (i = 0; i < nl; i++) {
				if ((i & 63) == 63 &&
				    bench_now_ns() - t0 > cap_ns)
					break;
				fanout_id id = seq[i];
				struct fanout_info info;
				rc = fanout_lookup(f.e, id, &info);
				if (rc || info.id != id ||
				    info.status != FANOUT_COMPLETED)
					bench_die("records: lookup "
						  "of " FANOUT_ID_FMT
						  " with %zu kept: %s",
						  (unsigned long long)id, n,
						  rc ? fanout_strerror(rc) :
						       "wrong record");
			}
			lk[r] = (double)(bench_now_ns() - t0) / i;
			/* one full listing */
			size_t got = 0;
			t0 = bench_now_ns();
			rc = fanout_list(f.e, infos, maxn + 1024, &got);
			la[r] = (double)(bench_now_ns() - t0);
			if (rc)
				bench_die("records: fanout_list: %s",
					  fanout_strerror(rc));
			if (got != n)
				bench_die("records: fanout_list saw %zu "
					  "records, %zu made "
					  "and all should be kept",
					  got, n);
			/* first page */
			lp[r] = list_page(f.e, infos, n);
		}
		double mlk = bench_median(lk, r), mla = bench_median(la, r),
		       mlp = bench_median(lp, r);
		char met[48];
		snprintf(met, sizeof(met), "lookup %zu", n);
		bench_fig_add("records", met, "fanout", mlk, "ns", BENCH_LOWER);
		snprintf(met, sizeof(met), "list all %zu", n);
		bench_fig_add("records", met, "fanout", mla, "ns", BENCH_LOWER);
		snprintf(met, sizeof(met), "list 100 of %zu", n);
		bench_fig_add("records", met, "fanout", mlp, "ns", BENCH_LOWER);
		fprintf(o, "  %9zu %12.1f %14.3f %14.1f %14.2f %7u\n", n, mlk,
			mla / 1e6, mla / (double)n, mlp / 1e3, r);
	}
	free(seq);
	free(infos);
	free(f.ids);
	fanout_destroy(f.e);
	records_big_capacity();
}

/* ----------------------------------------------------------- allocations */

/* jemalloc 5.x experimental hooks (include/jemalloc/internal/hook.h). */
typedef void (*je_hook_alloc)(void *extra, int type, void *result,
			      uintptr_t result_raw, uintptr_t args_raw[3]);
typedef void (*je_hook_dalloc)(void *extra, int type, void *address,
			       uintptr_t args_raw[3]);
typedef void (*je_hook_expand)(void *extra, int type, void *address,
			       size_t old_usize, size_t new_usize,
			       uintptr_t result_raw, uintptr_t args_raw[4]);
struct je_hooks {
	je_hook_alloc alloc_hook;
	je_hook_dalloc dalloc_hook;
	je_hook_expand expand_hook;
	void *extra;
};

static __thread bool is_caller;
static _Atomic uint64_t n_alloc_caller, n_alloc_other, n_free_caller,
	n_free_other, bytes_caller, bytes_other;

/* The size asked for, from the arguments of the jemalloc call (enum
 * hook_alloc_e): the pointer belongs to the library's jemalloc, so the
 * program's malloc_usable_size() cannot be asked. */
static size_t requested_size(int type, const uintptr_t args[3])
{
	switch (type) {
	case 0: /* malloc */
	case 5: /* valloc */
	case 6: /* mallocx */
		return args[0];
	case 1: /* posix_memalign */
		return args[2];
	case 3: /* calloc */
		return args[0] * args[1];
	default: /* aligned_alloc, memalign, rallocx, realloc */
		return args[1];
	}
}

static void hook_alloc(void *extra, int type, void *result, uintptr_t raw,
		       uintptr_t args[3])
{
	if (!result)
		return;
	size_t sz = requested_size(type, args);
	if (is_caller) {
		atomic_fetch_add_explicit(&n_alloc_caller, 1,
					  memory_order_relaxed);
		atomic_fetch_add_explicit(&bytes_caller, sz,
					  memory_order_relaxed);
	} else {
		atomic_fetch_add_explicit(&n_alloc_other, 1,
					  memory_order_relaxed);
		atomic_fetch_add_explicit(&bytes_other, sz,
					  memory_order_relaxed);
	}
}

static void hook_dalloc(void *extra, int type, void *addr, uintptr_t args[3])
{
	if (!addr)
		return;
	atomic_fetch_add_explicit(is_caller ? &n_free_caller : &n_free_other, 1,
				  memory_order_relaxed);
}

static void hook_expand(void *extra, int type, void *addr, size_t o, size_t n,
			uintptr_t raw, uintptr_t args[4])
{
}

struct alloc_case {
	const char *name;
	unsigned ntasks;
	bool sync;
};

static void alloc_run(struct fanout_engine *e, const struct alloc_case *c,
		      unsigned k, const struct fanout_task *tasks)
{
	struct fanout_sink *sink = fanout_default_sink(e);
	struct fanout_batch b = {.tasks = tasks, .ntasks = c->ntasks};
	for (unsigned i = 0; i < k; i++) {
		struct fanout_event *ev;
		int rc;
		if (c->sync) {
			rc = fanout_run(e, &b, &ev);
			if (rc)
				bench_die("allocs: fanout_run: %s",
					  fanout_strerror(rc));
		} else {
			fanout_id id;
			rc = fanout_dispatch(e, &b, &id);
			if (rc)
				bench_die("allocs: fanout_dispatch: %s",
					  fanout_strerror(rc));
			rc = fanout_wait(sink, &ev, 10000);
			if (rc)
				bench_die("allocs: fanout_wait: %s",
					  fanout_strerror(rc));
		}
		bench_fo_check_event(ev, c->ntasks, false);
		fanout_event_free(ev);
	}
}

void bench_allocs(void)
{
	static struct bwork noop;
	static const struct alloc_case cases[] = {
		{"dispatch, 1 child", 1, false},
		{"dispatch, 64 children", 64, false},
		{"run, 1 child", 1, true},
		{"run, 64 children", 64, true},
	};
	struct fanout_task tasks[64];
	for (unsigned i = 0; i < 64; i++)
		tasks[i] = (struct fanout_task){
			.goal = "g", .fn = bench_fo_child, .arg = &noop};
	struct fanout_engine *e = bench_fo_engine(bench_opt.nthreads, NULL);
	FILE *o = bench_opt.out;
	unsigned k = (unsigned)(20000 * bench_opt.scale) + 100;
	is_caller = true;
	fprintf(o,
		"\n== allocations per delegation (jemalloc hooks, %u "
		"delegations each; caller = dispatching/consuming thread) ==\n",
		k);
	fprintf(o, "  %-24s %9s %9s %9s %9s %10s\n", "case", "alloc", "free",
		"alloc", "free", "bytes");
	fprintf(o, "  %-24s %9s %9s %9s %9s %10s\n", "", "(caller)", "(caller)",
		"(others)", "(others)", "(all)");
	for (size_t i = 0; i < BENCH_ARRAY_SIZE(cases); i++) {
		const struct alloc_case *c = &cases[i];
		alloc_run(e, c, 2000, tasks); /* warm caches */
		struct je_hooks h = {hook_alloc, hook_dalloc, hook_expand,
				     NULL};
		void *handle = NULL;
		size_t hsz = sizeof(handle);
		atomic_store(&n_alloc_caller, 0);
		atomic_store(&n_alloc_other, 0);
		atomic_store(&n_free_caller, 0);
		atomic_store(&n_free_other, 0);
		atomic_store(&bytes_caller, 0);
		atomic_store(&bytes_other, 0);
		if (fanout_test_mallctl("experimental.hooks.install", &handle,
					&hsz, &h, sizeof(h))) {
			fprintf(o, "  jemalloc hooks unavailable; skipped\n");
			break;
		}
		alloc_run(e, c, k, tasks);
		/* Let deferred frees (RCU callbacks) of these records happen. */
		bench_sleep_ns(50000000);
		fanout_test_mallctl("experimental.hooks.remove", NULL, NULL,
				    &handle, sizeof(handle));
		double ac = (double)atomic_load(&n_alloc_caller) / k;
		double fc = (double)atomic_load(&n_free_caller) / k;
		double ao = (double)atomic_load(&n_alloc_other) / k;
		double fo = (double)atomic_load(&n_free_other) / k;
		double by = (double)(atomic_load(&bytes_caller) +
				     atomic_load(&bytes_other)) /
			    k;
		char met[48];
		snprintf(met, sizeof(met), "allocs/deleg %s", c->name);
		bench_fig_add("allocs", met, "fanout", ac + ao, "",
			      BENCH_LOWER);
		snprintf(met, sizeof(met), "caller allocs/deleg %s", c->name);
		bench_fig_add("allocs", met, "fanout", ac, "", BENCH_LOWER);
		snprintf(met, sizeof(met), "bytes/deleg %s", c->name);
		bench_fig_add("allocs", met, "fanout", by, "B", BENCH_LOWER);
		fprintf(o, "  %-24s %9.3f %9.3f %9.3f %9.3f %10.0f\n", c->name,
			ac, fc, ao, fo, by);
	}
	fprintf(o, "  allocations are exact; frees on other threads include "
		   "records "
		   "of earlier delegations\n  pruned past keep_completed and "
		   "freed after "
		   "an RCU grace period meanwhile\n");
	is_caller = false;
	fanout_destroy(e);
}
