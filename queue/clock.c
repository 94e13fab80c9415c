/* SPDX-License-Identifier: MIT */
/*
 * clock.c - the library's clock: CLOCK_MONOTONIC for timestamps, and a
 * cheap tick counter for per-child durations.
 *
 * Correctness: where the CPU has an invariant TSC (CPUID 0x80000007, EDX
 * bit 8: constant rate, keeps counting in deep sleep, synchronised across
 * cores by the kernel), durations are measured in TSC ticks and converted
 * with a factor calibrated once against CLOCK_MONOTONIC over 200 us; the
 * calibration runs under pthread_once, so every thread sees the same
 * factor (pthread_once is a full barrier for the variables it sets).
 * Elsewhere, fq_cycles() is CLOCK_MONOTONIC in ns and the factor is 1.
 * The error of the factor is about the clock's resolution over 200 us,
 * i.e. well under 0.1%.
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

#ifdef FQ_HAVE_TSC
static bool invariant_tsc(void)
{
	unsigned a, b, c, d;

	if (!__get_cpuid(0x80000000, &a, &b, &c, &d) || a < 0x80000007)
		return false;
	__get_cpuid(0x80000007, &a, &b, &c, &d);
	return d & (1u << 8);
}
#endif

static void calibrate(void)
{
#ifdef FQ_HAVE_TSC
	uint64_t t0, t1, c0, c1;

	if (!invariant_tsc())
		return;
	t0 = fq_now_ns();
	c0 = __rdtsc();
	do
		t1 = fq_now_ns();
	while (t1 - t0 < 200000);
	c1 = __rdtsc();
	if (c1 <= c0)
		return;
	fq__clock_mult =
		(uint64_t)(((unsigned __int128)(t1 - t0) << 32) / (c1 - c0));
	fq__clock_tsc = fq__clock_mult != 0;
#endif
}

void fq_clock_init(void)
{
	pthread_once(&once, calibrate);
}
