/* SPDX-License-Identifier: MIT */
/*
 * fanout-bench-scen.c - the side-by-side scenarios, run on every peer:
 * throughput vs batch size, submit/dispatch call cost vs batch size,
 * closed-loop single-child latency (hot, parked), short real work, idle CPU.
 * Python's ThreadPoolExecutor (fanout-bench-python.c) takes its turn in the
 * throughput, latency and idle rounds too.
 *
 * Inside every round the peers take turns, so drift on a shared machine
 * hits them alike; the figure is the median over the rounds.
 */
#include "bench-harness.h"
#include "bench-scen.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

const unsigned bench_sizes[BENCH_NSIZES] = {1, 8, 64, 512, 4096};

static bool size_wanted(unsigned n)
{
	char b[16];
	snprintf(b, sizeof(b), "%u", n);
	return bench_in_list(bench_opt.sizes, b);
}

unsigned bench_inflight_for(unsigned n)
{
	/* keep at least 16 children in flight: batch 1 -> 16, 8 -> 2 */
	return n >= 16 ? 1 : 16 / n;
}

const char *bench_si(double v, char *buf, size_t len)
{
	if (isnan(v))
		snprintf(buf, len, "n/a");
	else if (fabs(v) >= 1e9)
		snprintf(buf, len, "%.2fG", v / 1e9);
	else if (fabs(v) >= 1e6)
		snprintf(buf, len, "%.2fM", v / 1e6);
	else if (fabs(v) >= 1e4)
		snprintf(buf, len, "%.1fk", v / 1e3);
	else if (fabs(v) >= 100)
		snprintf(buf, len, "%.0f", v);
	else
		snprintf(buf, len, "%.2f", v);
	return buf;
}

static const char *ratio_str(double r, char *buf, size_t len)
{
	if (isnan(r) || isinf(r))
		snprintf(buf, len, "-");
	else if (r >= 100)
		snprintf(buf, len, "%.0fx", r);
	else
		snprintf(buf, len, "%.2fx", r);
	return buf;
}

/* All peers whose figures exist in @scen, in harness order, then python. */
static size_t columns(const char *names[16])
{
	size_t n = 0;
	for (size_t i = 0; i < hx_count() && n < 15; i++)
		names[n++] = hx_at(i)->ops->name;
	for (size_t i = 0; i < bench_fig_count(); i++)
		if (!strcmp(bench_fig_at(i)->peer, "python-tpe")) {
			names[n++] = "python-tpe";
			break;
		}
	return n;
}

/* Column width: 11, or the longest peer name ("fanout_ondemand"). */
static int col_width(const char *const *cols, size_t nc)
{
	int w = 11;
	for (size_t c = 0; c < nc; c++)
		if ((int)strlen(cols[c]) > w)
			w = (int)strlen(cols[c]);
	return w;
}

static double fig(const char *scen, const char *metric, const char *peer)
{
	const struct bench_fig *f = bench_fig_find(scen, metric, peer);
	return f ? f->value : NAN;
}

/*
 * Print a table: one row per metric in @metrics, one column per peer, then
 * the same rows as "fanout is X times better than the peer".
 */
static void print_grid(const char *scen, const char *const *metrics,
		       const char *const *labels, size_t nm, bool higher,
		       double scale, const char *unit)
{
	FILE *f = bench_opt.out;
	const char *cols[16];
	size_t nc = columns(cols);
	int w = col_width(cols, nc);
	char b[32];
	fprintf(f, "  %-16s", unit);
	for (size_t c = 0; c < nc; c++)
		fprintf(f, " %*s", w, cols[c]);
	fputc('\n', f);
	for (size_t m = 0; m < nm; m++) {
		fprintf(f, "  %-16s", labels[m]);
		for (size_t c = 0; c < nc; c++)
			fprintf(f, " %*s", w,
				bench_si(fig(scen, metrics[m], cols[c]) / scale,
					 b, sizeof(b)));
		fputc('\n', f);
	}
	fprintf(f, "  fanout is N x %s than:\n",
		higher ? "higher" : "lower(faster)");
	for (size_t m = 0; m < nm; m++) {
		double me = fig(scen, metrics[m], "fanout");
		fprintf(f, "  %-16s", labels[m]);
		for (size_t c = 0; c < nc; c++) {
			double v = fig(scen, metrics[m], cols[c]);
			double r = higher ? me / v : v / me;
			fprintf(f, " %*s", w,
				!strcmp(cols[c], "fanout") ?
					"-" :
					ratio_str(r, b, sizeof(b)));
		}
		fputc('\n', f);
	}
}

/* ------------------------------------------------------------ throughput */

/*
 * The sweep keeps 16 children in flight at batch 1 and 8 (16 and 2
 * batches), which a run-style peer (fanout_run: submit and join in one
 * call) cannot do.  So batch 1 and 8 are measured a second time with one
 * batch in flight, by every peer: these rows compare fanout_run with
 * oneTBB's task_group run + wait one batch at a time, like with like, and
 * the fanout_run bar is judged on them.
 */
static const unsigned single_sizes[BENCH_NSINGLE] = {1, 8};

void bench_single_metric(unsigned n, char *buf, size_t len)
{
	snprintf(buf, len, "batch %u, 1 in flight", n);
}

void bench_scen_throughput(void)
{
	static const struct bwork noop;
	unsigned R = bench_opt.rounds;
	size_t np = hx_count();
	uint64_t dur = (uint64_t)(100e6 * bench_opt.scale);
	/* rows: the BENCH_NSIZES sweep sizes, then the BENCH_NSINGLE
	 * one-in-flight rows; peers 0..np-1, then python at index np */
	const unsigned NR = BENCH_NSIZES + BENCH_NSINGLE;
	unsigned row_n[BENCH_NSIZES + BENCH_NSINGLE],
		row_k[BENCH_NSIZES + BENCH_NSINGLE];
	for (unsigned s = 0; s < BENCH_NSIZES; s++) {
		row_n[s] = bench_sizes[s];
		row_k[s] = bench_inflight_for(bench_sizes[s]);
	}
	for (unsigned s = 0; s < BENCH_NSINGLE; s++) {
		row_n[BENCH_NSIZES + s] = single_sizes[s];
		row_k[BENCH_NSIZES + s] = 1;
	}
	double *v = calloc((np + 1) * NR * R, sizeof(double));
	double *pc = calloc(np * NR * R, sizeof(double));
	/* bar 6's yardstick, one raw ck_ring stream per round, right after
	 * the peers' batch of 512: the host changes state within a run, and
	 * the limits' sets at its start and end can catch another state */
	double *ring = calloc(R, sizeof(double));
	unsigned nring = 0;
	/* bars 1 and 9's floor, the bare hand-off of the same shape, right
	 * after the peers' sweep rows up to batch 64, in every round */
	double *bare = calloc(BENCH_NSIZES * R, sizeof(double));
	if (!v || !pc || !ring || !bare)
		bench_die("out of memory");
	/* warm-up pass */
	for (unsigned s = 0; s < NR; s++) {
		unsigned n = row_n[s], k = row_k[s];
		if (!size_wanted(n))
			continue;
		for (size_t p = 0; p < np; p++)
			hx_throughput(hx_at(p), n, k, &noop, dur / 4);
		bench_py_throughput(n, k, dur / 4);
	}
	for (unsigned r = 0; r < R; r++)
		for (unsigned s = 0; s < NR; s++) {
			unsigned n = row_n[s], k = row_k[s];
			if (!size_wanted(n))
				continue;
			for (size_t p = 0; p < np; p++) {
				v[(p * NR + s) * R + r] = hx_throughput(
					hx_at(p), n, k, &noop, dur);
				pc[(p * NR + s) * R + r] =
					hx_at(p)->last_batch_p50 / n;
			}
			v[(np * NR + s) * R + r] =
				bench_py_throughput(n, k, dur);
			if (n == 512 && k == 1)
				ring[nring++] = bench_ring_item_ns();
			if (s < BENCH_NSIZES && n <= 64)
				bare[s * R + r] = bench_bare_handoff(n, k, dur);
		}
	if (nring)
		bench_limit_ring_rounds = bench_median(ring, nring);
	free(ring);
	/* print order: each batch-1/8 sweep row followed by its
	 * one-in-flight row */
	const char *metrics[BENCH_NSIZES + BENCH_NSINGLE],
		*labels[BENCH_NSIZES + BENCH_NSINGLE];
	static char mbuf[BENCH_NSIZES + BENCH_NSINGLE][32],
		lbuf[BENCH_NSIZES + BENCH_NSINGLE][32];
	unsigned nm = 0;
	for (unsigned s = 0; s < NR; s++) {
		if (!size_wanted(row_n[s]))
			continue;
		if (s < BENCH_NSIZES)
			snprintf(mbuf[s], sizeof(mbuf[s]), "batch %u",
				 row_n[s]);
		else
			bench_single_metric(row_n[s], mbuf[s], sizeof(mbuf[s]));
		snprintf(lbuf[s], sizeof(lbuf[s]), "%u (%u in flt)", row_n[s],
			 row_k[s]);
		for (size_t p = 0; p < np; p++) {
			bench_fig_add("throughput", mbuf[s],
				      hx_at(p)->ops->name,
				      bench_median(&v[(p * NR + s) * R], R),
				      "children/s", BENCH_HIGHER);
			if (s >= BENCH_NSIZES)
				continue;
			/* the spread over rounds, for the plots */
			bench_fig_add("throughput min", mbuf[s],
				      hx_at(p)->ops->name,
				      bench_min(&v[(p * NR + s) * R], R),
				      "children/s", BENCH_INFO);
			bench_fig_add("throughput max", mbuf[s],
				      hx_at(p)->ops->name,
				      bench_max(&v[(p * NR + s) * R], R),
				      "children/s", BENCH_INFO);
			double c = bench_median(&pc[(p * NR + s) * R], R);
			if (!isnan(c))
				bench_fig_add("per-child cost", mbuf[s],
					      hx_at(p)->ops->name, c, "ns",
					      BENCH_LOWER);
		}
		if (s < BENCH_NSIZES && row_n[s] <= 64)
			bench_fig_add("throughput", mbuf[s], "bare-handoff",
				      bench_median(&bare[s * R], R),
				      "children/s", BENCH_INFO);
		double py = bench_median(&v[(np * NR + s) * R], R);
		if (!isnan(py))
			bench_fig_add("throughput", mbuf[s], "python-tpe", py,
				      "children/s", BENCH_HIGHER);
	}
	for (unsigned s = 0; s < BENCH_NSIZES; s++) {
		if (!size_wanted(row_n[s]))
			continue;
		metrics[nm] = mbuf[s];
		labels[nm++] = lbuf[s];
		for (unsigned t = 0; t < BENCH_NSINGLE; t++)
			if (single_sizes[t] == row_n[s] && row_k[s] != 1) {
				metrics[nm] = mbuf[BENCH_NSIZES + t];
				labels[nm++] = lbuf[BENCH_NSIZES + t];
			}
	}
	fprintf(bench_opt.out,
		"\n== no-op children per second vs batch size "
		"(median of %u rounds x %.0f ms, %u threads) ==\n",
		R, (double)dur / 1e6, bench_opt.nthreads);
	print_grid("throughput", metrics, labels, nm, true, 1, "batch");
	fprintf(bench_opt.out,
		"  \"in flt\" = batches in flight; fanout_run (submit + join "
		"in one call) can only\n  keep 1, so batch 1 and 8 are also "
		"run with 1 in flight by every peer (oneTBB:\n  task_group run "
		"+ wait, one batch at a time): fanout_run's bar is judged on "
		"those rows.\n");
	/* the same runs, per child: median batch time / batch size */
	const char *pm[BENCH_NSIZES], *pl[BENCH_NSIZES];
	unsigned npm = 0;
	for (unsigned i = 0; i < nm; i++)
		if (bench_fig_find("per-child cost", metrics[i],
				   hx_at(0)->ops->name)) {
			pm[npm] = metrics[i];
			pl[npm++] = labels[i];
		}
	if (npm) {
		fprintf(bench_opt.out,
			"  per-child cost, ns = median time of one "
			"batch (submit..join) / batch size:\n");
		print_grid("per-child cost", pm, pl, npm, false, 1, "batch");
	}
	for (size_t p = 0; p < np; p++) {
		const struct peer_ops *o = hx_at(p)->ops;
		if (o->rejected && o->rejected(hx_at(p)->ctx))
			fprintf(bench_opt.out,
				"  %s: %llu -EBUSY rejections "
				"(retried after taking an event)\n",
				o->name,
				(unsigned long long)o->rejected(hx_at(p)->ctx));
	}
	free(v);
	free(pc);
	free(bare);
}

/* ------------------------------------------------------------ call cost */

void bench_scen_dispatch(void)
{
	unsigned R = bench_opt.rounds;
	size_t np = hx_count();
	uint64_t dur = (uint64_t)(40e6 * bench_opt.scale);
	double *v = calloc(np * BENCH_NSIZES * R, sizeof(double));
	if (!v)
		bench_die("out of memory");
	for (unsigned r = 0; r < R; r++)
		for (unsigned s = 0; s < BENCH_NSIZES; s++)
			for (size_t p = 0; p < np; p++)
				if (size_wanted(bench_sizes[s]))
					v[(p * BENCH_NSIZES + s) * R + r] =
						hx_submit_cost(hx_at(p),
							       bench_sizes[s],
							       dur);
	const char *metrics[BENCH_NSIZES], *labels[BENCH_NSIZES];
	static char mbuf[BENCH_NSIZES][32], lbuf[BENCH_NSIZES][32];
	unsigned nm = 0;
	for (unsigned s = 0; s < BENCH_NSIZES; s++) {
		if (!size_wanted(bench_sizes[s]))
			continue;
		snprintf(mbuf[s], sizeof(mbuf[s]), "batch %u", bench_sizes[s]);
		snprintf(lbuf[s], sizeof(lbuf[s]), "%u", bench_sizes[s]);
		metrics[nm] = mbuf[s];
		labels[nm++] = lbuf[s];
		for (size_t p = 0; p < np; p++) {
			bench_fig_add(
				"submit call", mbuf[s], hx_at(p)->ops->name,
				bench_median(&v[(p * BENCH_NSIZES + s) * R], R),
				"ns", BENCH_LOWER);
			bench_fig_add(
				"submit call min", mbuf[s], hx_at(p)->ops->name,
				bench_min(&v[(p * BENCH_NSIZES + s) * R], R),
				"ns", BENCH_INFO);
			bench_fig_add(
				"submit call max", mbuf[s], hx_at(p)->ops->name,
				bench_max(&v[(p * BENCH_NSIZES + s) * R], R),
				"ns", BENCH_INFO);
		}
	}
	fprintf(bench_opt.out,
		"\n== submit call cost vs batch size: time until "
		"fanout_dispatch() / the peer's submit returns, ns (median) "
		"==\n");
	print_grid("submit call", metrics, labels, nm, false, 1, "batch");
	free(v);
}

/* ------------------------------------------------------------ latency */

void bench_scen_latency(void)
{
	unsigned R = bench_opt.rounds;
	size_t np = hx_count();
	unsigned nhot = (unsigned)(5000 * bench_opt.scale) + 10;
	unsigned npark = (unsigned)(150 * bench_opt.scale) + 10;
	uint64_t gap = 2000000;
	struct bench_hist **hot = calloc(np + 1, sizeof(*hot)),
			  **park = calloc(np + 1, sizeof(*park));
	hot[np] = bench_hist_new();
	park[np] = bench_hist_new();
	for (size_t p = 0; p < np; p++) {
		hot[p] = bench_hist_new();
		park[p] = bench_hist_new();
		struct bench_hist *w = bench_hist_new();
		hx_latency(hx_at(p), 500, 0, w); /* warm-up */
		bench_hist_free(w);
	}
	for (unsigned r = 0; r < R; r++) {
		for (size_t p = 0; p < np; p++) {
			hx_latency(hx_at(p), nhot, 0, hot[p]);
			hx_latency(hx_at(p), npark, gap, park[p]);
		}
		bench_py_latency(nhot, 0, hot[np]);
		bench_py_latency(npark, gap, park[np]);
	}
	static const double qs[] = {0.5, 0.99, 0.999, 1.0};
	static const char *qn[] = {"p50", "p99", "p999", "max"};
	for (size_t p = 0; p <= np; p++) {
		const char *name = p < np ? hx_at(p)->ops->name : "python-tpe";
		if (hot[p]->count == 0)
			continue;
		for (int k = 0; k < 4; k++) {
			bench_fig_add("latency hot", qn[k], name,
				      bench_hist_quantile(hot[p], qs[k]), "ns",
				      BENCH_LOWER);
			bench_fig_add("latency parked", qn[k], name,
				      bench_hist_quantile(park[p], qs[k]), "ns",
				      BENCH_LOWER);
		}
	}
	FILE *f = bench_opt.out;
	fprintf(f,
		"\n== single-child latency, closed loop: submit call -> join "
		"returns on the same thread, us ==\n"
		"   hot: back to back, %u x %u samples; parked: 2 ms idle "
		"before "
		"each, %u x %u samples\n",
		R, nhot, R, npark);
	static const char *const hm[] = {"p50", "p99", "p999", "max"};
	static const char *const hl[] = {"hot p50", "hot p99", "hot p999",
					 "hot max"};
	static const char *const pl[] = {"parked p50", "parked p99",
					 "parked p999", "parked max"};
	print_grid("latency hot", hm, hl, 4, false, 1e3, "us");
	print_grid("latency parked", hm, pl, 4, false, 1e3, "us");
	for (size_t p = 0; p <= np; p++) {
		bench_hist_free(hot[p]);
		bench_hist_free(park[p]);
	}
	free(hot);
	free(park);
}

/* ------------------------------------------------------------ real work */

/* The same children run inline on this thread: no engine, one CPU. */
static double serial_rate(const struct bwork *w, unsigned n, uint64_t dur)
{
	uint64_t done = 0, t0 = bench_now_ns(), t1;
	do {
		for (unsigned i = 0; i < n; i++)
			bench_child(w);
		done += n;
	} while ((t1 = bench_now_ns()) - t0 < dur);
	return (double)done * 1e9 / (double)(t1 - t0);
}

void bench_scen_work(void)
{
	static const uint64_t works[] = {1000, 10000, 100000};
	const unsigned n = 64;
	unsigned R = bench_opt.rounds;
	size_t np = hx_count();
	uint64_t dur = (uint64_t)(100e6 * bench_opt.scale);
	size_t nw = BENCH_ARRAY_SIZE(works);
	double *v = calloc(np * nw * R, sizeof(double));
	double *ser = calloc(nw * R, sizeof(double));
	struct bwork w[3];
	if (!v || !ser)
		bench_die("out of memory");
	for (size_t i = 0; i < nw; i++)
		w[i] = bench_work_ns(works[i]);
	for (unsigned r = 0; r < R; r++)
		for (size_t i = 0; i < nw; i++) {
			ser[i * R + r] = serial_rate(&w[i], n, dur / 2);
			for (size_t p = 0; p < np; p++)
				v[(p * nw + i) * R + r] = hx_throughput(
					hx_at(p), n, 1, &w[i], dur);
		}
	const char *metrics[3], *labels[3];
	static char mbuf[3][32], lbuf[3][32], ebuf[3][32];
	FILE *f = bench_opt.out;
	for (size_t i = 0; i < nw; i++) {
		snprintf(mbuf[i], sizeof(mbuf[i]), "work %llu us",
			 (unsigned long long)(works[i] / 1000));
		snprintf(lbuf[i], sizeof(lbuf[i]), "%llu us",
			 (unsigned long long)(works[i] / 1000));
		snprintf(ebuf[i], sizeof(ebuf[i]), "efficiency %llu us",
			 (unsigned long long)(works[i] / 1000));
		metrics[i] = mbuf[i];
		labels[i] = lbuf[i];
		/*
		 * Ideal: every thread busy with child work all the time, at the
		 * speed the same loop runs inline on this machine right now.
		 */
		double s1 = bench_median(&ser[i * R], R);
		double ideal = (double)bench_opt.nthreads * s1;
		bench_fig_add("work", mbuf[i], "inline-1cpu", s1, "children/s",
			      BENCH_INFO);
		for (size_t p = 0; p < np; p++) {
			double m = bench_median(&v[(p * nw + i) * R], R);
			bench_fig_add("work", mbuf[i], hx_at(p)->ops->name, m,
				      "children/s", BENCH_HIGHER);
			bench_fig_add("work", ebuf[i], hx_at(p)->ops->name,
				      100.0 * m / ideal, "%", BENCH_HIGHER);
		}
	}
	fprintf(f,
		"\n== short real work: batch 64 of busy-loop children, "
		"children/s (median of %u rounds) ==\n",
		R);
	print_grid("work", metrics, labels, nw, true, 1, "child work");
	const char *cols[16];
	size_t nc = columns(cols);
	int cw = col_width(cols, nc);
	fprintf(f,
		"  efficiency = children/s / (%u x the same children run "
		"inline "
		"on one thread; 100%% = no overhead):\n",
		bench_opt.nthreads);
	for (size_t i = 0; i < nw; i++) {
		char b[32];
		fprintf(f, "  %-16s", labels[i]);
		for (size_t c = 0; c < nc; c++) {
			double e = fig("work", ebuf[i], cols[c]);
			if (isnan(e))
				fprintf(f, " %*s", cw, "n/a");
			else
				fprintf(f, " %*.1f%%", cw - 1, e);
		}
		fprintf(f, "   (inline: %s/s)\n",
			bench_si(fig("work", mbuf[i], "inline-1cpu"), b,
				 sizeof(b)));
	}
	free(v);
	free(ser);
}

/* ------------------------------------------------------------ idle CPU */

void bench_scen_idle(void)
{
	static const struct bwork noop;
	FILE *f = bench_opt.out;
	uint64_t idle =
		(uint64_t)(1e9 * (bench_opt.scale < 1 ? 1 : bench_opt.scale));
	fprintf(f,
		"\n== idle CPU: a 200 ms burst (batch 64), then %.1f s of no "
		"work; CPU used by the peer's own threads ==\n",
		(double)idle / 1e9);
	fprintf(f, "  %-11s %8s %12s %10s\n", "peer", "threads", "cpu ms",
		"% of 1 CPU");
	for (size_t p = 0; p < hx_count(); p++) {
		struct peer_inst *pi = hx_at(p);
		hx_throughput(pi, 64, 1, &noop, 200000000);
		uint64_t used = hx_idle_cpu(pi, idle);
		double pct = 100.0 * (double)used / (double)idle;
		bench_fig_add("idle", "cpu %", pi->ops->name, pct, "%",
			      BENCH_LOWER);
		fprintf(f, "  %-11s %8zu %12.3f %10.4f\n", pi->ops->name,
			pi->ntids, (double)used / 1e6, pct);
	}
	if (bench_py_running()) {
		bench_py_throughput(64, 1, 200000000);
		double py = bench_py_idle(idle);
		if (!isnan(py)) {
			bench_fig_add("idle", "cpu %", "python-tpe", py, "%",
				      BENCH_LOWER);
			fprintf(f, "  %-11s %8s %12.3f %10.4f\n", "python-tpe",
				"-", py * (double)idle / 1e11, py);
		}
	}
}
