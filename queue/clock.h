/* SPDX-License-Identifier: MIT */
/*
 * clock.h - the one clock of the library (clock.c): CLOCK_MONOTONIC in ns
 * for timestamps and deadlines, and a cheap tick counter for durations.
 *
 * Call fq_clock_init() once before fq_cycles_to_ns() (fq_create does);
 * fq_cycles_to_ns() converts a difference of two fq_cycles() readings,
 * taken on any threads.  Thread-safe; no state but the calibration.
 */
#ifndef FANOUT_QUEUE_CLOCK_H
#define FANOUT_QUEUE_CLOCK_H

#include <stdbool.h>
#include <stdint.h>

#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
#define FQ_HAVE_TSC 1
#endif

/* Thread-local state of the library.  In libfanout.a: initial-exec, so a
 * static link reaches it with one %fs-relative load (run_child touches it
 * twice per child; the linker relaxes it further to local-exec).  In
 * libfanout.so and the Python extension (built with
 * -DFQ_TLS_GLOBAL_DYNAMIC): global-dynamic, because a module with
 * initial-exec TLS asks for glibc's small static TLS surplus when it is
 * dlopen()ed, and fails to load once that is used up (README, "Loading
 * with dlopen"). */
#ifdef FQ_TLS_GLOBAL_DYNAMIC
#define FQ_TLS _Thread_local __attribute__((tls_model("global-dynamic")))
#else
#define FQ_TLS _Thread_local __attribute__((tls_model("initial-exec")))
#endif

uint64_t fq_now_ns(void);
void fq_clock_init(void);

/* The calibration (clock.c); set once under pthread_once, read-only after. */
extern bool fq__clock_tsc;
extern uint64_t fq__clock_mult; /* ns per tick, 32.32 fixed point */
extern uint64_t fq__stamp_span; /* ticks in FQ_STAMP_SPAN_NS */

/* Inline: a runner reads the clock once per child boundary and converts
 * once per child, so a call each would be a third of a no-op child's
 * library instructions. */
static inline uint64_t fq_cycles(void)
{
#ifdef FQ_HAVE_TSC
	if (fq__clock_tsc)
		return __rdtsc();
#endif
	return fq_now_ns();
}

static inline uint64_t fq_cycles_to_ns(uint64_t d)
{
	if (!fq__clock_tsc)
		return d;
	return (uint64_t)(((unsigned __int128)d * fq__clock_mult) >> 32);
}

/* What ran between two fq_cycles() readings @t0 and @t1, in ns, at least
 * 1: a reading is not ordered after the instructions before it, so the
 * end of a child that returned at once can read 1 tick past its start
 * (1 in 20 back-to-back pairs here), and one read on another CPU, before
 * it saw the start, a little below it.  0 is left to mean "never ran". */
static inline uint64_t fq_duration_ns(uint64_t t0, uint64_t t1)
{
	uint64_t ns = (int64_t)(t1 - t0) > 0 ? fq_cycles_to_ns(t1 - t0) : 0;

	return ns ? ns : 1;
}

/*
 * Timestamps without a clock call each time.  fq_stamp() returns
 * CLOCK_MONOTONIC in ns.  Each thread keeps an anchor: a CLOCK_MONOTONIC
 * reading and the tick read right after it.  Within FQ_STAMP_SPAN_NS of
 * its anchor a stamp is the anchor plus the ticks since, converted: one
 * unordered tick read.  Past that, the stamp is a clock reading, bracketed
 * by an ordered tick before it and a tick after it, which becomes the
 * anchor if the bracket is narrow (twice the quickest seen at calibration,
 * at least FQ_STAMP_SLACK_NS).
 *
 * Why: in the library's paths a clock_gettime costs far more than in a
 * loop.  The vDSO orders its tick read with lfence, which first waits for
 * every load and locked instruction still in flight; a batch-1 fanout_run
 * made two, and stamps instead ran it 24-58% faster (bench/PROFILE.txt
 * phase 17).
 *
 * The error.  The anchor's ns stand for an instant at or before its tick,
 * so a stamp never leads CLOCK_MONOTONIC on that account and trails it by
 * less than the bracket (~40-80 ns here).  The conversion factor's error
 * (calibration over 200 us, and NTP's slew of the clock, each under 1e-3)
 * adds under 4 ns over FQ_STAMP_SPAN_NS.  A stamp is never below the
 * calling thread's last fanout_now_ns() (fq_now_ns_floor), so a thread
 * that reads the clock through the library and then calls it finds its
 * reading <= dispatched_ns however the anchor lags (test_dispatch's
 * times_between_clock_readings failed 1 run in ~8 without the floor: the
 * lag, up to the bracket, exceeded the path from the reading to the
 * stamp).  A thread's stamps may step back at a new anchor by the
 * difference of two anchors' lags, a few ns and at most the bracket: less
 * than the library's calls that stamp take, so two dispatches of one
 * thread keep their order.  Without an invariant TSC, or with a clock too
 * slow to bracket within 2 x FQ_STAMP_SLACK_NS, every stamp is a clock
 * reading.
 */
#define FQ_STAMP_SPAN_NS 4000u
#define FQ_STAMP_SLACK_NS 50u

struct fq_anchor {
	uint64_t ns, tick;
	uint64_t floor; /* the last fq_now_ns_floor() of this thread */
};
extern FQ_TLS struct fq_anchor fq__anchor;
uint64_t fq__stamp_slow(void);

/* A direct CLOCK_MONOTONIC reading that this thread's later stamps do not
 * fall below (fanout_now_ns): a stamp may trail the clock by its anchor's
 * lag, but not behind what the same thread was shown. */
static inline uint64_t fq_now_ns_floor(void)
{
	uint64_t ns = fq_now_ns();

	fq__anchor.floor = ns;
	return ns;
}

/* Whether fq_stamp_at(@tick) extrapolates @tick from this thread's anchor
 * (else it is a fresh clock reading, made after @tick). */
static inline bool fq_stamp_extrapolates(uint64_t tick)
{
	return fq__clock_tsc && tick - fq__anchor.tick <= fq__stamp_span;
}

/* The stamp of @tick, an fq_cycles() reading of this thread (or a fresh
 * clock reading, later than it, when the anchor is too old). */
static inline uint64_t fq_stamp_at(uint64_t tick)
{
	uint64_t v;

	/* Also false before the first anchor (tick 0), and for a tick read
	 * on a CPU behind the anchor's (the difference wraps): then a clock
	 * reading. */
	if (!fq_stamp_extrapolates(tick))
		return fq__stamp_slow();
	v = fq__anchor.ns + fq_cycles_to_ns(tick - fq__anchor.tick);
	return v > fq__anchor.floor ? v : fq__anchor.floor;
}

static inline uint64_t fq_stamp(void)
{
	return fq_stamp_at(fq_cycles());
}

#endif
