/* SPDX-License-Identifier: MIT */
/*
 * bench-scen.h - scenario entry points and the shared batch-size sweep.
 */
#ifndef BENCH_SCEN_H
#define BENCH_SCEN_H

#include "bench.h"

#define BENCH_NSIZES 5
extern const unsigned bench_sizes[BENCH_NSIZES];
unsigned bench_inflight_for(unsigned n);
/* Batch 1 and 8 are also measured with one batch in flight, by every peer
 * (metric "batch N, 1 in flight"): fanout_run's bar is judged on them. */
#define BENCH_NSINGLE 2
void bench_single_metric(unsigned n, char *buf, size_t len);
const char *bench_si(double v, char *buf, size_t len);

void bench_scen_throughput(void);
void bench_scen_dispatch(void);
void bench_scen_latency(void);
void bench_scen_work(void);
void bench_scen_idle(void);

/* fanout-bench-python.c: the ThreadPoolExecutor peer (NaN / no-op when it
 * is not running) */
bool bench_py_start(void);
void bench_py_stop(void);
bool bench_py_running(void);
double bench_py_throughput(unsigned n, unsigned inflight, uint64_t dur_ns);
void bench_py_latency(unsigned nsamples, uint64_t gap_ns, struct bench_hist *h);
double bench_py_idle(uint64_t ns);

/* fanout-bench-limits.c */
extern double bench_limit_pingpong, bench_limit_ring, bench_limit_futex,
	bench_limit_futex_idle, bench_limit_rt_p50, bench_limit_rt_p999,
	bench_limit_dram, bench_limit_dram_huge, bench_limit_syscall,
	bench_limit_yield, bench_limit_clock, bench_limit_tick, bench_limit_rmw,
	bench_limit_rtk_p50, bench_limit_rtk_p999;
extern unsigned bench_limit_rtk_k;
void bench_limits(void); /* one set of rounds; call at start and end */
/* one raw ck_ring SPSC stream, ns per item */
double bench_ring_item_ns(void);
/* the median of bench_ring_item_ns() over the throughput scenario's
 * rounds, each taken right after the peers' batch of 512; 0 if not */
extern double bench_limit_ring_rounds;
/* children/s of the bare hand-off: @n tasks copied into a block that goes
 * to a worker on CPU 1 and back through two ck_rings, @k in flight, for
 * @dur_ns (fanout-bench-limits.c) */
double bench_bare_handoff(unsigned n, unsigned k, uint64_t dur_ns);
void bench_limits_report(void);

/* fanout-bench-report.c */
void bench_report_bars(void);
void bench_report_json(FILE *f);
void bench_report_plots(void);
void bench_report_results_md(const char *table_text);
void bench_machine(char *model, size_t mlen, char *kernel, size_t klen);

#endif /* BENCH_SCEN_H */
