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

#include <stdint.h>

uint64_t fq_now_ns(void);
void fq_clock_init(void);
uint64_t fq_cycles(void);
uint64_t fq_cycles_to_ns(uint64_t d);

#endif
