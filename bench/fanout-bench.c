/* SPDX-License-Identifier: MIT */
/*
 * fanout-bench.c - fanout against its peers and against the physical limit,
 * side by side in one run.  See bench.h for the honesty rules, and
 * `fanout-bench --help` for what runs.
 */
#include "bench-fanout.h"
#include "bench-harness.h"
#include "bench-scen.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char usage[] =
	"usage: fanout-bench [options]\n"
	"  (default)        the full comparison: limits, orchestrator load,\n"
	"                   every peer, python; table, plots, RESULTS.md\n"
	"  --quick          fanout only: orchestrator load, batch sweep,\n"
	"                   dispatch cost, single-child latency\n"
	"  --long           longer sweeps (3x durations, 7 rounds)\n"
	"  --json           JSON on stdout (the table goes to stderr)\n"
	"  --rounds N       rounds per figure (default 5, at least 5 "
	"reported)\n"
	"  --threads N      threads per engine/pool (default: online CPUs)\n"
	"  --scale X        multiply every duration by X\n"
	"  --only LIST      comma list of: limits,orchestrator,throughput,\n"
	"                   "
	"dispatch,latency,work,idle,fanout-latency,openloop,\n"
	"                   records,allocs,deadlines\n"
	"  --peers LIST     comma list of peers to start: fanout,fanout_help,\n"
	"                   fanout_noclock (when fanout.h has\n"
	"                   FANOUT_NO_CHILD_CLOCK),fanout_ondemand (when it\n"
	"                   has "
	"FANOUT_RUNNERS_ON_DEMAND),fanout_run,mutexpool,\n"
	"                   libuv,glib,openmp,onetbb (default all)\n"
	"  --sizes LIST     batch sizes of the sweeps (default "
	"1,8,64,512,4096)\n"
	"  --out DIR        where plots go (default bench/out)\n"
	"  --results FILE   the results file (default bench/RESULTS.md)\n"
	"  --python FILE    the ThreadPoolExecutor script "
	"(bench/peer-python.py)\n"
	"  --fanout-flags LIST  opt-ins for every fanout engine and batch:\n"
	"                   no-clock (FANOUT_NO_CHILD_CLOCK), borrow\n"
	"                   (FANOUT_BORROW_TASKS); default none\n"
	"  --no-python, --no-plots, --no-results, -v/--verbose, -h/--help\n";

/* ---- tee: what goes to the table also goes into a buffer for RESULTS.md */

struct tee {
	FILE *real;
	char *buf;
	size_t len, cap;
};

static void loadavg(char *buf, size_t len)
{
	FILE *f = fopen("/proc/loadavg", "r");
	buf[0] = 0;
	if (f) {
		if (fgets(buf, (int)len, f))
			buf[strcspn(buf, "\n")] = 0;
		fclose(f);
	}
}

static uint64_t t_scen;

/* -v: how long each scenario took (stderr). */
static void took(const char *what)
{
	uint64_t now = bench_now_ns();
	bench_note("%s took %.1f s", what, (double)(now - t_scen) / 1e9);
	t_scen = now;
}

static ssize_t tee_write(void *c, const char *data, size_t n)
{
	struct tee *t = c;
	fwrite(data, 1, n, t->real);
	fflush(t->real);
	if (t->len + n + 1 > t->cap) {
		size_t nc = (t->cap ? t->cap * 2 : 65536);
		while (nc < t->len + n + 1)
			nc *= 2;
		char *nb = realloc(t->buf, nc);
		if (!nb)
			return (ssize_t)n;
		t->buf = nb;
		t->cap = nc;
	}
	memcpy(t->buf + t->len, data, n);
	t->len += n;
	t->buf[t->len] = 0;
	return (ssize_t)n;
}

int main(int argc, char **argv)
{
	static const struct option lo[] = {
		{"quick", no_argument, 0, 'q'},
		{"long", no_argument, 0, 'L'},
		{"json", no_argument, 0, 'j'},
		{"rounds", required_argument, 0, 'r'},
		{"threads", required_argument, 0, 't'},
		{"scale", required_argument, 0, 's'},
		{"only", required_argument, 0, 'o'},
		{"out", required_argument, 0, 'O'},
		{"results", required_argument, 0, 'R'},
		{"python", required_argument, 0, 'P'},
		{"peers", required_argument, 0, 'p'},
		{"sizes", required_argument, 0, 'S'},
		{"fanout-flags", required_argument, 0, 'F'},
		{"no-python", no_argument, 0, 1},
		{"no-plots", no_argument, 0, 2},
		{"no-results", no_argument, 0, 3},
		{"verbose", no_argument, 0, 'v'},
		{"help", no_argument, 0, 'h'},
		{0, 0, 0, 0}};
	bool no_results = false;
	bench_opt.rounds = 5;
	bench_opt.nthreads = bench_ncpus();
	bench_opt.scale = 1.0;
	bench_opt.outdir = "bench/out";
	bench_opt.results = "bench/RESULTS.md";
	bench_opt.python = "bench/peer-python.py";
	int c;
	while ((c = getopt_long(argc, argv, "vh", lo, NULL)) != -1) {
		switch (c) {
		case 'q':
			bench_opt.quick = true;
			break;
		case 'L':
			bench_opt.longer = true;
			break;
		case 'j':
			bench_opt.json = true;
			break;
		case 'r':
			bench_opt.rounds = (unsigned)atoi(optarg);
			break;
		case 't':
			bench_opt.nthreads = (unsigned)atoi(optarg);
			break;
		case 's':
			bench_opt.scale = atof(optarg);
			break;
		case 'o':
			bench_opt.only = optarg;
			break;
		case 'O':
			bench_opt.outdir = optarg;
			break;
		case 'R':
			bench_opt.results = optarg;
			break;
		case 'P':
			bench_opt.python = optarg;
			break;
		case 'p':
			bench_opt.peers = optarg;
			break;
		case 'S':
			bench_opt.sizes = optarg;
			break;
		case 'F':
			if (bench_fo_parse_flags(optarg)) {
				fputs(usage, stderr);
				return 2;
			}
			break;
		case 1:
			bench_opt.no_python = true;
			break;
		case 2:
			bench_opt.no_plots = true;
			break;
		case 3:
			no_results = true;
			break;
		case 'v':
			bench_opt.verbose = true;
			break;
		case 'h':
			fputs(usage, stdout);
			return 0;
		default:
			fputs(usage, stderr);
			return 2;
		}
	}
	if (bench_opt.longer) {
		bench_opt.scale *= 3;
		if (bench_opt.rounds < 7)
			bench_opt.rounds = 7;
	}
	if (bench_opt.rounds < 1 || bench_opt.rounds > 60 ||
	    bench_opt.nthreads < 1 || !(bench_opt.scale > 0)) {
		fputs(usage, stderr);
		return 2;
	}

	struct tee tee = {.real = bench_opt.json ? stderr : stdout};
	cookie_io_functions_t io = {.write = tee_write};
	bench_opt.out = fopencookie(&tee, "w", io);
	if (!bench_opt.out)
		bench_die("fopencookie failed");
	setvbuf(bench_opt.out, NULL, _IOLBF, 0);

	char model[256], kernel[256];
	bench_machine(model, sizeof(model), kernel, sizeof(kernel));
	bench_calibrate();
	t_scen = bench_now_ns();
	loadavg(bench_opt.load_start, sizeof(bench_opt.load_start));
	FILE *f = bench_opt.out;
	fprintf(f, "fanout-bench: %s, %u CPUs, %s\n", model, bench_ncpus(),
		kernel);
	fprintf(f,
		"  load average at start: %s (other work on the machine skews "
		"absolute figures;\n  peers take turns inside each round, so "
		"ratios suffer less)\n",
		bench_opt.load_start);
	fprintf(f,
		"  %u threads per engine/pool, %u rounds (medians reported), "
		"busy loop %.2f iterations/ns%s\n",
		bench_opt.nthreads, bench_opt.rounds, bench_iters_per_ns,
		bench_opt.quick ? ", --quick: fanout only" : "");

	if (bench_opt.quick) {
		if (bench_want("orchestrator")) {
			bench_orchestrator();
			took("orchestrator");
		}
		hx_start_all(true);
		if (bench_want("throughput")) {
			bench_scen_throughput();
			took("throughput");
		}
		if (bench_want("dispatch")) {
			bench_scen_dispatch();
			took("dispatch");
		}
		if (bench_want("fanout-latency")) {
			bench_fanout_latency_quick();
			took("fanout-latency");
		}
		hx_stop_all();
	} else {
		if (bench_want("limits")) {
			bench_limits();
			took("limits");
		}
		if (!bench_opt.no_python &&
		    bench_in_list(bench_opt.peers, "python-tpe"))
			bench_py_start();
		took("python start");
		if (bench_want("orchestrator")) {
			bench_orchestrator();
			took("orchestrator");
		}
		bool peers = bench_want("throughput") ||
			     bench_want("dispatch") || bench_want("latency") ||
			     bench_want("openloop") || bench_want("work") ||
			     bench_want("idle");
		if (peers)
			hx_start_all(false);
		took("peer start");
		if (bench_want("throughput")) {
			bench_scen_throughput();
			took("throughput");
		}
		if (bench_want("dispatch")) {
			bench_scen_dispatch();
			took("dispatch");
		}
		if (bench_want("latency")) {
			bench_scen_latency();
			took("latency");
		}
		if (bench_want("fanout-latency")) {
			bench_fanout_latency_quick();
			took("fanout-latency");
		}
		if (bench_want("openloop")) {
			bench_open_loop();
			took("openloop");
		}
		if (bench_want("work")) {
			bench_scen_work();
			took("work");
		}
		if (bench_want("idle")) {
			bench_scen_idle();
			took("idle");
		}
		hx_stop_all();
		bench_py_stop();
		if (bench_want("records")) {
			bench_records();
			took("records");
		}
		if (bench_want("allocs")) {
			bench_allocs();
			took("allocs");
		}
		if (bench_want("deadlines")) {
			bench_deadlines();
			took("deadlines");
		}
		if (bench_want("limits")) {
			bench_limits();
			bench_limits_report();
		}
		bench_report_bars();
		/* partial runs leave the plots of the last full run alone */
		if (!bench_opt.no_plots && !bench_opt.only &&
		    !bench_opt.peers && !bench_opt.sizes)
			bench_report_plots();
	}
	loadavg(bench_opt.load_end, sizeof(bench_opt.load_end));
	fprintf(f, "\nload average at end: %s\n", bench_opt.load_end);
	fflush(f);
	if (bench_opt.json)
		bench_report_json(stdout);
	if (!bench_opt.quick && !bench_opt.only && !bench_opt.peers &&
	    !bench_opt.sizes && !no_results)
		bench_report_results_md(tee.buf ? tee.buf : "");
	fclose(f);
	free(tee.buf);
	return 0;
}
