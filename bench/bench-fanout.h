/* SPDX-License-Identifier: MIT */
/*
 * bench-fanout.h - fanout-specific helpers shared by the scenario files.
 */
#ifndef BENCH_FANOUT_H
#define BENCH_FANOUT_H

#include "bench.h"
#include <fanout.h>

/* The child every fanout scenario runs: bench_child(arg), return 0. */
int bench_fo_child(struct fanout_child *c, void *arg);

/*
 * bench_fo_check_event() - abort unless @ev is the complete, successful
 * event of a delegation of @n children: nresults, status, per-status
 * counts; with @full also every result's index, status and code.
 */
void bench_fo_check_event(const struct fanout_event *ev, unsigned n, bool full);

/* fanout_create() with @workers workers and otherwise @base (or defaults). */
struct fanout_engine *bench_fo_engine(unsigned workers,
				      const struct fanout_config *base);

/*
 * --fanout-flags: fanout_config.flags ORed into every engine the bench
 * creates, and fanout_batch.flags of the harness's fanout peers.  The
 * defaults (0) are what the bars are judged on.
 */
extern unsigned bench_fo_engine_flags, bench_fo_batch_flags;
/* Parse "no-clock,borrow" into the two; -1 on an unknown name. */
int bench_fo_parse_flags(const char *list);

/* Scenario entry points (each adds figures and prints its table). */
void bench_orchestrator(void);
void bench_fanout_latency_quick(void);
void bench_records(void);
void bench_allocs(void);
void bench_open_loop(void);
void bench_deadlines(void);

#endif /* BENCH_FANOUT_H */
