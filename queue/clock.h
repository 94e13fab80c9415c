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

uint64_t fq_now_ns(void);
void fq_clock_init(void);

/* The calibration (clock.c); set once under pthread_once, read-only after. */
extern bool fq__clock_tsc;
extern uint64_t fq__clock_mult; /* ns per tick, 32.32 fixed point */

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

#endif
