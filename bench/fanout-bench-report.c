/* SPDX-License-Identifier: MIT */
/*
 * fanout-bench-report.c - the bars (targets fanout is held to), --json, gnuplot plots and
 * bench/RESULTS.md, all made from the figure registry.
 */
#include "bench-harness.h"
#include "bench-scen.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

static double fig(const char *scen, const char *metric, const char *peer)
{
	const struct bench_fig *f = bench_fig_find(scen, metric, peer);
	return f ? f->value : NAN;
}

void bench_machine(char *model, size_t mlen, char *kernel, size_t klen)
{
	snprintf(model, mlen, "unknown CPU");
	FILE *p = popen("lscpu 2>/dev/null", "r");
	char line[512];
	bool found = false;
	if (p) {
		while (fgets(line, sizeof(line), p))
			if (!strncmp(line, "Model name:", 11)) {
				char *v = line + 11;
				while (*v == ' ' || *v == '\t')
					v++;
				v[strcspn(v, "\n")] = 0;
				snprintf(model, mlen, "%s", v);
				found = true;
			}
		pclose(p);
	}
	if (!found && (p = fopen("/proc/cpuinfo", "r"))) {
		while (fgets(line, sizeof(line), p))
			if (!strncmp(line, "model name", 10)) {
				char *v = strchr(line, ':');
				if (v) {
					v++;
					while (*v == ' ')
						v++;
					v[strcspn(v, "\n")] = 0;
					snprintf(model, mlen, "%s", v);
				}
				break;
			}
		fclose(p);
	}
	struct utsname u;
	if (uname(&u) == 0)
		snprintf(kernel, klen, "%s %s %s", u.sysname, u.release,
			 u.machine);
	else
		snprintf(kernel, klen, "unknown");
}

/* ------------------------------------------------------------ bars */

/*
 * The bars of issue 13, exactly nine.  The yardstick is the strongest peer
 * measured in the same run (oneTBB, the mutex+condvar pool, Python's
 * ThreadPoolExecutor) and the physical limits (a raw ck_ring handoff),
 * never a fixed multiple of a figure from another run.  Every figure is a
 * median over rounds in which the peers took turns (latency percentiles
 * come from histograms pooled over the rounds).  "fanout" is the default
 * configuration on the background path (fanout_dispatch + fanout_wait).
 */
struct bar {
	char what[112];
	char target[64];
	char measured[1024];
	int holds; /* 1 yes, 0 no, -1 not measured */
};

#define NBARS 9
static struct bar bars[NBARS + 1];
static size_t nbars;

static struct bar *bar_new(const char *what, const char *target)
{
	struct bar *b = &bars[nbars++];
	memset(b, 0, sizeof(*b));
	snprintf(b->what, sizeof(b->what), "%s", what);
	snprintf(b->target, sizeof(b->target), "%s", target);
	b->holds = -1;
	snprintf(b->measured, sizeof(b->measured), "not measured");
	return b;
}

/* Append to @b->measured (which starts as "not measured"). */
static void measured_add(struct bar *b, size_t *len, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static void measured_add(struct bar *b, size_t *len, const char *fmt, ...)
{
	va_list ap;
	if (*len >= sizeof(b->measured))
		return;
	va_start(ap, fmt);
	int k = vsnprintf(b->measured + *len, sizeof(b->measured) - *len, fmt,
			  ap);
	va_end(ap);
	if (k > 0)
		*len += (size_t)k;
}

static const char *inflight_note(unsigned n)
{
	static char b[32];
	snprintf(b, sizeof(b), " (%u in flight)", bench_inflight_for(n));
	return b;
}

/*
 * children/s of @peer over oneTBB's at each size of the sweep; @need[s] is
 * the least ratio that holds.  @single: batch 1 and 8 from the rows with
 * one batch in flight.
 */
static void tbb_ratio_bar(const char *what, const char *target,
			  const char *peer, const double *need, bool single)
{
	struct bar *b = bar_new(what, target);
	size_t len = 0;
	int holds = 1;
	for (unsigned s = 0; s < BENCH_NSIZES; s++) {
		unsigned n = bench_sizes[s];
		char met[48];
		if (single && n < 16)
			bench_single_metric(n, met, sizeof(met));
		else
			snprintf(met, sizeof(met), "batch %u", n);
		double me = fig("throughput", met, peer);
		double tbb = fig("throughput", met, "onetbb");
		if (isnan(me) || isnan(tbb) || tbb <= 0) {
			/* a size not measured (--sizes, --peers): no verdict */
			snprintf(b->measured, sizeof(b->measured),
				 "not measured (batch %u)", n);
			return;
		}
		double r = me / tbb;
		if (r < need[s])
			holds = 0;
		measured_add(b, &len, "%s%u%s: %.2fx (%.3gM vs %.3gM)",
			     len ? ", " : "", n,
			     !single && n < 16 ? inflight_note(n) : "", r,
			     me / 1e6, tbb / 1e6);
	}
	b->holds = holds;
}

/* @peer's throughput at sweep size index @s (NAN if not measured). */
static double size_fig(unsigned s, const char *peer)
{
	char met[48];
	snprintf(met, sizeof(met), "batch %u", bench_sizes[s]);
	return fig("throughput", met, peer);
}

/* Start one item of a list appended to a bar: "; @intro" before the
 * first, ", " before the others. */
static void list_item(struct bar *b, size_t *len, bool *first,
		      const char *intro)
{
	if (*first)
		measured_add(b, len, "; %s", intro);
	else
		measured_add(b, len, ", ");
	*first = false;
}

/* Append, not judged, what an opt-in configuration (@peer's column, engine
 * flag @flag) gives against oneTBB at each size: the figures behind the
 * decisions whether fanout_wait helps by default (fanout_help) and
 * whether a batch starts with one runner (fanout_ondemand). */
static void opt_in_note(struct bar *b, const char *peer, const char *flag)
{
	size_t len = strlen(b->measured);
	bool first = true;
	char intro[96];

	if (b->holds < 0)
		return;
	snprintf(intro, sizeof(intro), "with %s (off by default, not judged) ",
		 flag);
	for (unsigned s = 0; s < BENCH_NSIZES; s++) {
		double me = size_fig(s, peer), tbb = size_fig(s, "onetbb");
		if (isnan(me) || isnan(tbb) || tbb <= 0)
			continue;
		list_item(b, &len, &first, intro);
		measured_add(b, &len, "%u: %.2fx", bench_sizes[s], me / tbb);
	}
}

/* A quotient bar: @num / @den <= @max holds. */
static void quot_bar(const char *what, const char *target, double num,
		     double den, double max, const char *unit, double div)
{
	struct bar *b = bar_new(what, target);
	if (isnan(num) || isnan(den) || den <= 0)
		return;
	double r = num / den;
	b->holds = r <= max;
	snprintf(b->measured, sizeof(b->measured), "%.2fx (%.4g %s vs %.4g %s)",
		 r, num / div, unit, den / div, unit);
}

/*
 * What a batch-1 fanout_run pays here for its contract alone, measured in
 * this run (the limits): two tick reads - the dispatch's, which stamps
 * dispatched_ns (from a per-thread anchor since phase 17, queue/clock.h;
 * the anchor's own CLOCK_MONOTONIC read every 4 us is left out) and starts
 * the caller's child, and the child's end, which stamps completed_ns
 * (phase 18) - and the price of each of its locked RMWs.  oneTBB's run +
 * wait reads no clock (bench/PROFILE.txt phases 9 and 18 count the RMWs).
 */
static void contract_note(struct bar *b)
{
	size_t len = strlen(b->measured);
	double tbb = fig("latency hot", "p50", "onetbb");

	if (b->holds < 0 || !(bench_limit_tick > 0))
		return;
	measured_add(b, &len,
		     "; the contract's clocks per batch-1 run (2 tick "
		     "reads: the dispatch and the child's end) %.3g us",
		     2 * bench_limit_tick / 1e3);
	if (tbb > 0)
		measured_add(b, &len, " = %.2fx oneTBB's hot p50",
			     2 * bench_limit_tick / tbb);
	if (bench_limit_rmw > 0)
		measured_add(b, &len, "; one locked RMW %.3g ns",
			     bench_limit_rmw);
}

/*
 * The bare hand-off of the same shape, measured beside the peers in every
 * throughput round (fanout-bench-limits.c): tasks copied into a recycled
 * block, a ck_ring to one worker on the other CPU and back, a tick per
 * child.  Not a bound on oneTBB or Python, which hand nothing to another
 * CPU when the waiting thread runs the children itself: what fanout's
 * contract could reach here, and so how much of fanout's figure its own
 * protocol costs (bars 1 and 9).  @py: against Python's figure instead.
 */
static void bare_note(struct bar *b, bool py)
{
	size_t len = strlen(b->measured);
	bool first = true;

	if (b->holds < 0)
		return;
	for (unsigned s = 0; s < BENCH_NSIZES; s++) {
		double bare = size_fig(s, "bare-handoff");
		double me = size_fig(s, "fanout");
		double other = size_fig(s, "python-tpe");
		if (isnan(bare) || isnan(me) || bare <= 0 ||
		    (py &&
		     (bench_sizes[s] != 64 || isnan(other) || other <= 0)))
			continue;
		list_item(b, &len, &first,
			  "the bare hand-off (tasks copied, a ck_ring to one "
			  "worker on the other CPU and back, a tick per "
			  "child) ");
		if (py)
			measured_add(b, &len,
				     "%.3gM = %.0fx Python, fanout at "
				     "%.2fx of it",
				     bare / 1e6, bare / other, me / bare);
		else
			measured_add(b, &len, "%u: %.3gM, fanout at %.2fx",
				     bench_sizes[s], bare / 1e6, me / bare);
	}
}

static void compute_bars(void)
{
	static const double need_fanout[BENCH_NSIZES] = {0.5, 1, 1, 1, 1};
	static const double need_run[BENCH_NSIZES] = {1, 1, 1, 1, 1};
	nbars = 0;
	/* 1 */
	tbb_ratio_bar("fanout (dispatch + wait) vs oneTBB, no-op children/s, "
		      "batch 1 (16 in flight), 8, 64, 512, 4096",
		      ">= 0.5x at 1, >= 1x at 8..4096", "fanout", need_fanout,
		      false);
	opt_in_note(&bars[nbars - 1], "fanout_help", "FANOUT_WAIT_HELPS");
	opt_in_note(&bars[nbars - 1], "fanout_ondemand",
		    "FANOUT_RUNNERS_ON_DEMAND");
	bare_note(&bars[nbars - 1], false);
	if (bench_limit_yield > 0 && bars[nbars - 1].holds >= 0) {
		/* what the default path's hand-offs on the consumer's CPU
		 * cost here (bench/PROFILE.txt phase 8) */
		size_t len = strlen(bars[nbars - 1].measured);
		measured_add(&bars[nbars - 1], &len,
			     "; one sched_yield switch %.3g us, one system "
			     "call %.3g us",
			     bench_limit_yield / 1e3,
			     bench_limit_syscall / 1e3);
	}
	/* 2 */
	tbb_ratio_bar("fanout_run vs oneTBB (task_group run + wait), no-op "
		      "children/s, 1 batch in flight, batch 1..4096",
		      ">= 1x at every size", "fanout_run", need_run, true);
	contract_note(&bars[nbars - 1]);
	/* 3 */
	quot_bar("fanout_run hot single-child p50 vs oneTBB's", "<= 1.5x",
		 fig("latency hot", "p50", "fanout_run"),
		 fig("latency hot", "p50", "onetbb"), 1.5, "us", 1e3);
	contract_note(&bars[nbars - 1]);
	/* 4 */
	quot_bar("parked single-child p50 (2 ms idle) vs the mutex pool's",
		 "<= 1x", fig("latency parked", "p50", "fanout"),
		 fig("latency parked", "p50", "mutexpool"), 1.0, "us", 1e3);
	/* 5 */
	quot_bar("hot single-child p999 vs hot p50", "<= 10x",
		 fig("latency hot", "p999", "fanout"),
		 fig("latency hot", "p50", "fanout"), 10.0, "us", 1e3);
	/* The floor: a child on the background path crosses to a worker and
	 * back, and a raw round trip between two pinned spinning threads,
	 * timed the same way in this run, has a tail of its own.  A stall of
	 * the host lands in a sample in proportion to its length, so the
	 * floor that compares is a raw exchange as long as fanout's hot
	 * child (k round trips per sample, fanout-bench-limits.c). */
	if (bench_limit_rtk_p50 > 0 && bars[nbars - 1].holds >= 0) {
		size_t len = strlen(bars[nbars - 1].measured);
		measured_add(&bars[nbars - 1], &len,
			     "; floor: a raw cross-CPU exchange as long, %u "
			     "round trips per sample timed the same way, %.1fx "
			     "(%.3g us vs %.3g us); one round trip per sample "
			     "%.1fx",
			     bench_limit_rtk_k,
			     bench_limit_rtk_p999 / bench_limit_rtk_p50,
			     bench_limit_rtk_p999 / 1e3,
			     bench_limit_rtk_p50 / 1e3,
			     bench_limit_rt_p999 / bench_limit_rt_p50);
	} else if (bench_limit_rt_p50 > 0 && bars[nbars - 1].holds >= 0) {
		size_t len = strlen(bars[nbars - 1].measured);
		measured_add(&bars[nbars - 1], &len,
			     "; floor: a raw cross-CPU round trip, timed the "
			     "same way, %.1fx (%.3g us vs %.3g us)",
			     bench_limit_rt_p999 / bench_limit_rt_p50,
			     bench_limit_rt_p999 / 1e3,
			     bench_limit_rt_p50 / 1e3);
	}
	/* 6 */
	/* The handoff measured in the same rounds as fanout's batch of 512
	 * when the throughput scenario ran, else the limits' figure. */
	double ring = bench_limit_ring_rounds > 0 ? bench_limit_ring_rounds :
		      bench_limit_ring > 0	  ? bench_limit_ring :
						    NAN;
	quot_bar("per-child cost at batch 512 (median batch / 512) vs one raw "
		 "ck_ring SPSC handoff",
		 "<= 2x", fig("per-child cost", "batch 512", "fanout"), ring,
		 2.0, "ns", 1);
	/* What the default per-child clock costs by itself (one tick read
	 * per child boundary, FANOUT_NO_CHILD_CLOCK off): in the host's fast
	 * state the raw handoff streams at 4-5 ns an item, and twice that is
	 * less than one tick read here (bench/PROFILE.txt phase 16). */
	if (nbars && bars[nbars - 1].holds >= 0 && bench_limit_tick > 0) {
		struct bar *b = &bars[nbars - 1];
		size_t len = strlen(b->measured);

		measured_add(b, &len,
			     "; the default per-child clock alone (one tick "
			     "read) %.3g ns = %.2fx the handoff",
			     bench_limit_tick, bench_limit_tick / ring);
	}
	/* 7 */
	{
		struct bar *b = bar_new(
			"fanout_list of 100 records: keep_completed 2^20 with "
			"1000 records; max_async 2^20 with 10 records",
			"<= 100 us each");
		double a = fig("records", "list 100 of 1000", "fanout");
		double c = fig("records", "list 100 of 10, max_async 2^20",
			       "fanout");
		if (!isnan(a) && !isnan(c)) {
			b->holds = a <= 100e3 && c <= 100e3;
			snprintf(b->measured, sizeof(b->measured),
				 "%.4g us (keep_completed 2^20, 1000 records); "
				 "%.4g us (max_async 2^20, 10 records)",
				 a / 1e3, c / 1e3);
		}
	}
	/* 8 */
	quot_bar("fanout_lookup with 1M records vs with 1k", "<= 3x",
		 fig("records", "lookup 1000000", "fanout"),
		 fig("records", "lookup 1000", "fanout"), 3.0, "ns", 1);
	if (nbars && bench_limit_dram > 0) {
		/* the floor: a lookup at 1M reads at least one line from DRAM
		 * (bench/PROFILE.txt phase 7) */
		struct bar *b = &bars[nbars - 1];
		size_t len = strlen(b->measured);
		snprintf(b->measured + len, sizeof(b->measured) - len,
			 "; one DRAM random read %.4g ns (2M pages %.4g ns)",
			 bench_limit_dram, bench_limit_dram_huge);
	}
	/* 9 */
	{
		struct bar *b = bar_new("no-op children/s, batch 64, fanout vs "
					"Python's ThreadPoolExecutor",
					">= 200x");
		double me = fig("throughput", "batch 64", "fanout");
		double py = fig("throughput", "batch 64", "python-tpe");
		if (!isnan(me) && !isnan(py) && py > 0) {
			b->holds = me / py >= 200;
			snprintf(b->measured, sizeof(b->measured),
				 "%.0fx (%.3gM vs %.3gk/s)", me / py, me / 1e6,
				 py / 1e3);
			double help =
				fig("throughput", "batch 64", "fanout_help");
			if (!isnan(help))
				snprintf(
					b->measured + strlen(b->measured),
					sizeof(b->measured) -
						strlen(b->measured),
					"; with FANOUT_WAIT_HELPS (not judged) "
					"%.0fx",
					help / py);
			double od = fig("throughput", "batch 64",
					"fanout_ondemand");
			if (!isnan(od))
				snprintf(b->measured + strlen(b->measured),
					 sizeof(b->measured) -
						 strlen(b->measured),
					 "; with FANOUT_RUNNERS_ON_DEMAND (not "
					 "judged) %.0fx",
					 od / py);
		}
		bare_note(b, true);
	}
}

static const char *holds_word(int h)
{
	return h < 0 ? " ?? " : h ? "HOLD" : "MISS";
}

void bench_report_bars(void)
{
	compute_bars();
	FILE *f = bench_opt.out;
	unsigned nh = 0, nm = 0;
	for (size_t i = 0; i < nbars; i++) {
		nh += bars[i].holds == 1;
		nm += bars[i].holds == 0;
	}
	fprintf(f,
		"\n== the bars (issue 13): %u hold, %u miss, %zu not measured "
		"==\n"
		"   medians of this run; the yardstick is the strongest peer "
		"in the same run and the\n"
		"   physical limits.  fanout = the default configuration, "
		"fanout_dispatch + fanout_wait;\n"
		"   fanout_run is judged on rows with 1 batch in flight (batch "
		"1 and 8: the\n"
		"   \"1 in flt\" rows of the sweep), where oneTBB runs "
		"task_group run + wait alike\n",
		nh, nm, nbars - nh - nm);
	for (size_t i = 0; i < nbars; i++)
		fprintf(f, "  %u [%s] %s\n        target %s; measured %s\n",
			(unsigned)i + 1, holds_word(bars[i].holds),
			bars[i].what, bars[i].target, bars[i].measured);
}

/* ------------------------------------------------------------ json */

static void json_str(FILE *f, const char *s)
{
	fputc('"', f);
	for (; *s; s++) {
		unsigned char c = (unsigned char)*s;
		if (c == '"' || c == '\\')
			fprintf(f, "\\%c", c);
		else if (c < 0x20)
			fprintf(f, "\\u%04x", c);
		else
			fputc(c, f);
	}
	fputc('"', f);
}

static void json_num(FILE *f, double v)
{
	if (isnan(v) || isinf(v))
		fputs("null", f);
	else
		fprintf(f, "%.6g", v);
}

void bench_report_json(FILE *f)
{
	char model[256], kernel[256];
	bench_machine(model, sizeof(model), kernel, sizeof(kernel));
	compute_bars();
	fputs("{\n  \"machine\": {\"cpu\": ", f);
	json_str(f, model);
	fprintf(f, ", \"cpus\": %u, \"kernel\": ", bench_ncpus());
	json_str(f, kernel);
	fputs(", \"loadavg_start\": ", f);
	json_str(f, bench_opt.load_start);
	fputs(", \"loadavg_end\": ", f);
	json_str(f, bench_opt.load_end);
	fprintf(f, "},\n  \"threads\": %u,\n  \"rounds\": %u,\n  \"scale\": ",
		bench_opt.nthreads, bench_opt.rounds);
	json_num(f, bench_opt.scale);
	fputs(",\n  \"limits\": {\"pingpong_rtt_ns\": ", f);
	json_num(f, bench_limit_pingpong ? bench_limit_pingpong : NAN);
	fputs(", \"ck_ring_ns_per_item\": ", f);
	json_num(f, bench_limit_ring ? bench_limit_ring : NAN);
	fputs(", \"futex_rtt_ns\": ", f);
	json_num(f, bench_limit_futex ? bench_limit_futex : NAN);
	fputs(", \"futex_rtt_idle_p50_ns\": ", f);
	json_num(f, bench_limit_futex_idle ? bench_limit_futex_idle : NAN);
	fputs(", \"dram_random_read_ns\": ", f);
	json_num(f, bench_limit_dram ? bench_limit_dram : NAN);
	fputs(", \"dram_random_read_hugepage_ns\": ", f);
	json_num(f, bench_limit_dram_huge ? bench_limit_dram_huge : NAN);
	fputs("},\n  \"figures\": [\n", f);
	for (size_t i = 0; i < bench_fig_count(); i++) {
		const struct bench_fig *g = bench_fig_at(i);
		fputs("    {\"scenario\": ", f);
		json_str(f, g->scen);
		fputs(", \"metric\": ", f);
		json_str(f, g->metric);
		fputs(", \"peer\": ", f);
		json_str(f, g->peer);
		fputs(", \"value\": ", f);
		json_num(f, g->value);
		fputs(", \"unit\": ", f);
		json_str(f, g->unit);
		fprintf(f, ", \"better\": \"%s\"",
			g->better > 0 ? "higher" :
			g->better < 0 ? "lower" :
					"info");
		/* fanout's advantage over this peer, >1 = fanout better */
		const struct bench_fig *me =
			bench_fig_find(g->scen, g->metric, "fanout");
		if (me && g->better && strcmp(g->peer, "fanout") &&
		    g->value > 0 && me->value > 0) {
			fputs(", \"fanout_advantage\": ", f);
			json_num(f, g->better > 0 ? me->value / g->value :
						    g->value / me->value);
		}
		fprintf(f, "}%s\n", i + 1 < bench_fig_count() ? "," : "");
	}
	fputs("  ],\n  \"bars\": [\n", f);
	for (size_t i = 0; i < nbars; i++) {
		fputs("    {\"bar\": ", f);
		json_str(f, bars[i].what);
		fputs(", \"target\": ", f);
		json_str(f, bars[i].target);
		fputs(", \"measured\": ", f);
		json_str(f, bars[i].measured);
		fprintf(f, ", \"holds\": %s}%s\n",
			bars[i].holds < 0 ? "null" :
			bars[i].holds	  ? "true" :
					    "false",
			i + 1 < nbars ? "," : "");
	}
	fputs("  ]\n}\n", f);
}

/* ------------------------------------------------------------ plots */

static const char *plot_peers[] = {
	"fanout",     "fanout_help",	"fanout_run",	  "mutexpool",
	"libuv",      "glib",		"openmp",	  "onetbb",
	"python-tpe", "fanout_noclock", "fanout_ondemand"};
/* One colour per peer, the same in every chart (index of plot_peers). */
static const char *plot_colours[] = {"#d62728", "#ff7f0e", "#8c564b", "#7f7f7f",
				     "#2ca02c", "#17becf", "#9467bd", "#1f77b4",
				     "#bcbd22", "#e377c2", "#393b79"};

static const char *peer_colour(const char *peer)
{
	for (size_t i = 0; i < BENCH_ARRAY_SIZE(plot_peers); i++)
		if (!strcmp(plot_peers[i], peer))
			return plot_colours[i];
	return "#000000";
}

/* Plot commands for a sweep file written by write_sweep: each peer's
 * median with the spread over rounds (min..max) as error bars, in its own
 * colour. */
static void plot_sweep(FILE *g, const char *dir, const char *file,
		       const char **cols, size_t nc)
{
	fputs("plot ", g);
	for (size_t c = 0; c < nc; c++)
		fprintf(g,
			"%s'%s/%s' using 1:%zu:%zu:%zu with yerrorlines lw 2 "
			"lc rgb '%s' title '%s'",
			c ? ", " : "", dir, file, 2 + 3 * c, 3 + 3 * c,
			4 + 3 * c, peer_colour(cols[c]), cols[c]);
	fputc('\n', g);
}

static bool have_peer(const char *scen, const char *metric, const char *peer)
{
	return !isnan(fig(scen, metric, peer));
}

/* One row per batch size, one column per peer that has the figure. */
static bool write_sweep(const char *dir, const char *scen, const char *file,
			const char **cols, size_t *nc)
{
	char path[512];
	snprintf(path, sizeof(path), "%s/%s", dir, file);
	FILE *d = fopen(path, "w");
	*nc = 0;
	if (!d) {
		fprintf(bench_opt.out, "\n(plots skipped: cannot write %s)\n",
			path);
		return false;
	}
	for (size_t i = 0; i < BENCH_ARRAY_SIZE(plot_peers); i++)
		if (have_peer(scen, "batch 64", plot_peers[i]))
			cols[(*nc)++] = plot_peers[i];
	fputs("batch", d);
	for (size_t c = 0; c < *nc; c++)
		fprintf(d, " %s %s_min %s_max", cols[c], cols[c], cols[c]);
	fputc('\n', d);
	for (unsigned s = 0; s < BENCH_NSIZES; s++) {
		char met[32], lo[64], hi[64];
		snprintf(met, sizeof(met), "batch %u", bench_sizes[s]);
		snprintf(lo, sizeof(lo), "%s min", scen);
		snprintf(hi, sizeof(hi), "%s max", scen);
		fprintf(d, "%u", bench_sizes[s]);
		for (size_t c = 0; c < *nc; c++) {
			double v[3] = {fig(scen, met, cols[c]),
				       fig(lo, met, cols[c]),
				       fig(hi, met, cols[c])};
			for (int k = 0; k < 3; k++) {
				if (isnan(v[k]))
					v[k] = v[0]; /* no spread recorded */
				if (isnan(v[k]))
					fputs(" NaN", d);
				else
					fprintf(d, " %.6g", v[k]);
			}
		}
		fputc('\n', d);
	}
	fclose(d);
	return true;
}

void bench_report_plots(void)
{
	const char *dir = bench_opt.outdir;
	FILE *o = bench_opt.out;
	if (system("command -v gnuplot >/dev/null 2>&1") != 0) {
		fprintf(o, "\n(plots skipped: gnuplot not installed)\n");
		return;
	}
	mkdir(dir, 0755);
	char path[512];
	/* throughput.dat / submit.dat: batch, one column per peer */
	const char *cols[16];
	size_t nc = 0, ns = 0;
	if (!write_sweep(dir, "throughput", "throughput.dat", cols, &nc))
		return;
	const char *scols[16];
	write_sweep(dir, "submit call", "submit.dat", scols, &ns);
	FILE *d;

	/* latency.dat: peer, hot p50 p99 p999, parked p50 p99 p999 (us) */
	snprintf(path, sizeof(path), "%s/latency.dat", dir);
	d = fopen(path, "w");
	if (!d)
		return;
	fputs("# peer hot_p50 hot_p99 hot_p999 parked_p50 parked_p99 "
	      "parked_p999 (us)\n",
	      d);
	size_t nl = 0;
	for (size_t i = 0; i < BENCH_ARRAY_SIZE(plot_peers); i++) {
		const char *p = plot_peers[i];
		if (!have_peer("latency hot", "p50", p))
			continue;
		fprintf(d, "%s %.4g %.4g %.4g %.4g %.4g %.4g\n", p,
			fig("latency hot", "p50", p) / 1e3,
			fig("latency hot", "p99", p) / 1e3,
			fig("latency hot", "p999", p) / 1e3,
			fig("latency parked", "p50", p) / 1e3,
			fig("latency parked", "p99", p) / 1e3,
			fig("latency parked", "p999", p) / 1e3);
		nl++;
	}
	fclose(d);

	snprintf(path, sizeof(path), "%s/plots.gp", dir);
	FILE *g = fopen(path, "w");
	if (!g)
		return;
	char model[256], kernel[256];
	bench_machine(model, sizeof(model), kernel, sizeof(kernel));
	fprintf(g,
		"set terminal pngcairo size 1000,640 noenhanced\n"
		"set datafile missing 'NaN'\n"
		"set key outside right top\n"
		"set grid\n"
		"set output '%s/throughput.png'\n"
		"set title 'no-op children per second vs batch size (%u "
		"threads, %s)'\n"
		"set logscale xy\n"
		"set xlabel 'children per batch (1 and 8: 16 children in "
		"flight)'\n"
		"set ylabel 'children / s'\n"
		"set xtics (1, 8, 64, 512, 4096)\n",
		dir, bench_opt.nthreads, model);
	plot_sweep(g, dir, "throughput.dat", cols, nc);
	if (ns) {
		fprintf(g,
			"set output '%s/submit.png'\n"
			"set title 'submit call cost vs batch size: time until "
			"fanout_dispatch() / the peer''s submit returns'\n"
			"set ylabel 'ns per call'\n"
			"set xlabel 'children per batch'\n",
			dir);
		plot_sweep(g, dir, "submit.dat", scols, ns);
	}
	if (nl) {
		fprintf(g,
			"reset\n"
			"set terminal pngcairo size 1000,640 noenhanced\n"
			"set output '%s/latency.png'\n"
			"set title 'single-child submit->join latency "
			"percentiles, closed "
			"loop (us, log scale)'\n"
			"set style data histograms\n"
			"set style histogram clustered gap 1\n"
			"set style fill solid 0.8 border -1\n"
			"set logscale y\n"
			"set grid ytics\n"
			"set key outside right top\n"
			"set ylabel 'microseconds'\n"
			"set xtics rotate by -30\n"
			"plot '%s/latency.dat' using 2:xtic(1) title 'hot "
			"p50', "
			"'' using 3 title 'hot p99', '' using 4 title 'hot "
			"p999', "
			"'' using 5 title 'parked p50', '' using 6 title "
			"'parked p99', "
			"'' using 7 title 'parked p999'\n",
			dir, dir);
	}
	fclose(g);
	char cmd[600];
	snprintf(cmd, sizeof(cmd), "gnuplot '%s/plots.gp' 2>&1", dir);
	FILE *p = popen(cmd, "r");
	char line[256];
	bool err = false;
	while (p && fgets(line, sizeof(line), p)) {
		fprintf(stderr, "gnuplot: %s", line);
		err = true;
	}
	int st = p ? pclose(p) : -1;
	if (st == 0 && !err)
		fprintf(o, "\nplots: %s/throughput.png%s%s\n", dir,
			ns ? ", submit.png" : "", nl ? ", latency.png" : "");
	else
		fprintf(o, "\nplots: gnuplot failed (status %d)\n", st);
}

/* ------------------------------------------------------------ RESULTS.md */

void bench_report_results_md(const char *table)
{
	const char *path = bench_opt.results;
	FILE *f = fopen(path, "w");
	if (!f) {
		fprintf(stderr, "fanout-bench: cannot write %s\n", path);
		return;
	}
	char model[256], kernel[256], date[64];
	bench_machine(model, sizeof(model), kernel, sizeof(kernel));
	time_t t = time(NULL);
	strftime(date, sizeof(date), "%Y-%m-%d %H:%M UTC", gmtime(&t));
	compute_bars();
	fprintf(f,
		"# fanout-bench results\n\n"
		"Written by `build/plain/fanout-bench` (`make run`); do not "
		"edit "
		"by hand, run it again.\n\n"
		"- date: %s\n- machine: %s, %u CPUs online\n- kernel: %s\n"
		"- threads per engine/pool: %u; rounds: %u; duration scale: "
		"%.2g\n"
		"- load average (1/5/15 min, runnable/total, last pid) at "
		"start: %s; "
		"at end: %s\n\n",
		date, model, bench_ncpus(), kernel, bench_opt.nthreads,
		bench_opt.rounds, bench_opt.scale, bench_opt.load_start,
		bench_opt.load_end);
	fprintf(f,
		"Everything below was measured side by side in this one run, "
		"the peers taking turns inside each round; every figure is a "
		"median over the rounds and each ratio compares two figures "
		"of the same run.\n"
		"\"fanout\" is the background path (fanout_dispatch + "
		"fanout_wait) with the default configuration; \"fanout_help\" "
		"the same on an engine created with FANOUT_WAIT_HELPS "
		"(fanout_wait runs queued children while its sink is empty); "
		"\"fanout_noclock\" (when the library has the flag) the same "
		"with FANOUT_NO_CHILD_CLOCK; \"fanout_ondemand\" the same "
		"with FANOUT_RUNNERS_ON_DEMAND; \"fanout_run\" the synchronous "
		"one.  The bars are judged on the default configuration.\n\n");
	unsigned nh = 0, nm = 0;
	for (size_t i = 0; i < nbars; i++) {
		nh += bars[i].holds == 1;
		nm += bars[i].holds == 0;
	}
	fprintf(f,
		"## The bars (issue 13)\n\n"
		"%u hold, %u miss, %zu not measured.  The yardstick is the "
		"strongest peer in the same run and the physical limits (no "
		"longer multiples of the mutex pool, whose figure moves 3x "
		"between runs on a shared host).  `fanout_run` is judged on "
		"rows with one batch in flight: at batch 1 and 8 the sweep's "
		"\"1 in flt\" rows, where oneTBB runs task_group run + wait "
		"one batch at a time as well.  `make run` prints the same "
		"table, then an independent check (bench/barcheck.c, built "
		"against the installed library) measures the bars again.\n\n"
		"| # | bar | target | measured (medians) | verdict |\n"
		"|---|---|---|---|---|\n",
		nh, nm, nbars - nh - nm);
	for (size_t i = 0; i < nbars; i++)
		fprintf(f, "| %zu | %s | %s | %s | %s |\n", i + 1, bars[i].what,
			bars[i].target, bars[i].measured,
			bars[i].holds < 0 ? "not measured" :
			bars[i].holds	  ? "HOLD" :
					    "**MISS**");
	char png[600];
	snprintf(png, sizeof(png), "%s/throughput.png", bench_opt.outdir);
	if (access(png, R_OK) == 0)
		fprintf(f,
			"\n## Plots\n\n![throughput vs batch "
			"size](out/throughput.png)\n\n"
			"![submit call cost vs batch size](out/submit.png)\n\n"
			"![latency percentiles](out/latency.png)\n");
	fprintf(f, "\n## Full output\n\n```text\n%s```\n", table);
	fclose(f);
	fprintf(stderr, "fanout-bench: wrote %s\n", path);
}
