/* SPDX-License-Identifier: MIT */
/*
 * clock.c - the library's clock: CLOCK_MONOTONIC for timestamps, and a
 * cheap tick counter for per-child durations.
 *
 * Correctness: where the CPU has an invariant TSC (CPUID 0x80000007, EDX
 * bit 8: constant rate, keeps counting in deep sleep, synchronised across
 * cores by the kernel), durations are measured in TSC ticks and converted
 * with a factor calibrated once against CLOCK_MONOTONIC over 200 us or
 * more; the calibration runs under pthread_once, so every thread sees the
 * same factor (pthread_once is a full barrier for the variables it sets).
 * Elsewhere, fq_cycles() is CLOCK_MONOTONIC in ns and the factor is 1.
 * Both ends of the calibration are clock readings bracketed by ordered
 * ticks, and it runs until the brackets' widths are under 5e-4 of its
 * length (at most 5 ms): the factor's error is under 0.05%, plus NTP's
 * slew of the clock (at most 0.05%).  Timestamps (fq_stamp) extrapolate a
 * per-thread reading by that factor over at most FQ_STAMP_SPAN_NS; why
 * they do not lead the clock and how far they trail it: clock.h.
 */
#include "clock.h"

#include <pthread.h>
#include <stdbool.h>
#include <time.h>

#ifdef FQ_HAVE_TSC
#include <cpuid.h>
#endif

uint64_t fq_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static pthread_once_t once = PTHREAD_ONCE_INIT;
bool fq__clock_tsc;
uint64_t fq__clock_mult;
uint64_t fq__stamp_span;
FQ_TLS struct fq_anchor fq__anchor;

#ifdef FQ_HAVE_TSC
static uint64_t anchor_max; /* ticks: the widest reading that anchors */

/* A tick read after every instruction before it has completed (lfence is
 * dispatch-serialising on Intel, and on AMD with the setting Linux makes
 * for Spectre v1, as the vDSO's own read relies on), so that a wait for
 * loads and locked instructions in flight falls before it, not inside the
 * reading it brackets. */
static uint64_t ordered_tick(void)
{
	_mm_lfence();
	return __rdtsc();
}

/* CLOCK_MONOTONIC bracketed by two ordered ticks (so the vDSO's own tick
 * read falls between them); returns the bracket's width. */
static uint64_t bracketed(uint64_t *ns, uint64_t *after)
{
	uint64_t before = ordered_tick();

	*ns = fq_now_ns();
	*after = ordered_tick();
	return *after - before;
}
#endif

uint64_t fq__stamp_slow(void)
{
#ifdef FQ_HAVE_TSC
	uint64_t ns, t;

	if (fq__clock_tsc) {
		/* The tick after the reading: the ns stand for an instant
		 * at or before it, so stamps extrapolated from here do not
		 * lead the clock, and trail it by less than the bracket.  A
		 * reading that took long (preempted between the two) stays
		 * a reading and anchors nothing. */
		if (bracketed(&ns, &t) <= anchor_max) {
			fq__anchor.ns = ns;
			fq__anchor.tick = t;
		}
		return ns;
	}
#endif
	return fq_now_ns();
}

#ifdef FQ_HAVE_TSC
static bool invariant_tsc(void)
{
	unsigned a, b, c, d;

	if (!__get_cpuid(0x80000000, &a, &b, &c, &d) || a < 0x80000007)
		return false;
	__get_cpuid(0x80000007, &a, &b, &c, &d);
	return d & (1u << 8);
}

static uint64_t ns_to_ticks(uint64_t ns)
{
	return (uint64_t)(((unsigned __int128)ns << 32) / fq__clock_mult);
}

/* The stamps' span, and the widest bracket that anchors: twice the
 * quickest of 16, at least FQ_STAMP_SLACK_NS.  A clock too slow to bracket
 * within twice that gets no stamps (a span of 0 ticks extrapolates
 * nothing: every stamp reads the clock). */
static void calibrate_stamps(void)
{
	uint64_t least = UINT64_MAX, w, ns, t,
		 slack = ns_to_ticks(FQ_STAMP_SLACK_NS);
	int i;

	for (i = 0; i < 16; i++) {
		w = bracketed(&ns, &t);
		if (w < least)
			least = w;
	}
	anchor_max = 2 * least > slack ? 2 * least : slack;
	fq__stamp_span =
		anchor_max > 2 * slack ? 0 : ns_to_ticks(FQ_STAMP_SPAN_NS);
}
#endif

#ifdef FQ_HAVE_TSC
/* The narrowest of 8 bracketed readings: its ns and the tick at its
 * bracket's middle, which is within half the returned width of the
 * clock's own tick read. */
static uint64_t narrowest(uint64_t *ns, uint64_t *mid)
{
	uint64_t best = UINT64_MAX, n, after, w;

	for (int i = 0; i < 8; i++) {
		w = bracketed(&n, &after);
		if (w < best) {
			best = w;
			*ns = n;
			*mid = after - w / 2;
		}
	}
	return best;
}
#endif

static void calibrate(void)
{
#ifdef FQ_HAVE_TSC
	uint64_t t0 = 0, t1 = 0, c0 = 0, c1 = 0, w0, w1;

	if (!invariant_tsc())
		return;
	/* The factor's error is at most (w0 + w1) / 2 over c1 - c0: go on
	 * past 200 us until that is under 5e-4 (a slow clock, such as an
	 * intercepted one under a sanitizer), but not past 5 ms. */
	w0 = narrowest(&t0, &c0);
	do
		w1 = narrowest(&t1, &c1);
	while (t1 - t0 < 200000 ||
	       (c1 - c0 < 1000 * (w0 + w1) && t1 - t0 < 5000000));
	if (c1 <= c0)
		return;
	fq__clock_mult =
		(uint64_t)(((unsigned __int128)(t1 - t0) << 32) / (c1 - c0));
	if (!fq__clock_mult)
		return;
	calibrate_stamps();
	fq__clock_tsc = true;
#endif
}

void fq_clock_init(void)
{
	pthread_once(&once, calibrate);
}
