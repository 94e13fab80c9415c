/* SPDX-License-Identifier: MIT */
/*
 * probes.h - USDT probes (provider "fanout") for perf, bpftrace, SystemTap
 * and gdb.  Every probe of the library is defined here, one macro each.
 *
 * Modelled on the kernel's workqueue tracepoints (queue_work,
 * activate_work, execute_start, execute_end): a probe at each step of a
 * delegation's life, named provider:object__event, with the delegation id
 * as first argument so a script can join the steps.
 *
 *   probe                arguments
 *   batch__submit        id, ntasks, depth        accepted: dispatch or run
 *   child__start         id, index, cpu           a child is about to run
 *   child__done          id, index, status, duration_ns
 *                                                 it returned (status: enum
 *                                                 fanout_status)
 *   batch__done          id, status, ncompleted, nerror, ninterrupted
 *                                                 the event is made
 *   cancel               id, how, source          a delegation is interrupted
 *                                                 (how: the FANOUT_CANCEL_*
 *                                                 bits asked for; source: who
 *                                                 asked, CANCEL_* in
 *                                                 internal.h: 0x10 fanout_cancel
 *                                                 or _session, 0x20 shutdown,
 *                                                 0x40 deadline, 0x80 join
 *                                                 policy, 0x100 its parent)
 *   defer                id, index                a child deferred itself
 *   complete             id, index, code          a deferred child completed
 *   reject               err                      a call refused (-errno)
 *   worker__park         worker, cpu              a worker goes to sleep
 *   worker__wake         worker, slept_ns         ... and woke up
 *
 * Cost.  A probe site is one NOP while no tracer is attached; its
 * arguments are still computed (they are usually in registers already).
 * When an argument costs something to compute, guard it with the probe's
 * _ENABLED() form, which reads the probe's semaphore: a counter the tracer
 * (perf, bpftrace, stap, all through the kernel's uprobe reference
 * counter) raises while it is attached:
 *
 *	if (FANOUT_PROBE_WORKER_WAKE_ENABLED())
 *		t0 = fq_now_ns();
 *
 * Semaphores.  <sys/sdt.h> records a semaphore address in a probe's note
 * only when _SDT_HAS_SEMAPHORES is defined before it is included; the
 * variable, provider_name_semaphore, is then ours to define (dtrace -G
 * would generate it), an unsigned short in the ".probes" section, for
 * EVERY probe.  lib/probes.c defines them; they are hidden, so nothing is
 * exported.  (SDT_USE_VARIADIC is unrelated: it only enables STAP_PROBEV.)
 *
 * Without <sys/sdt.h> (Debian: systemtap-sdt-dev), or with
 * -DFANOUT_NO_PROBES, every macro compiles to nothing and _ENABLED() to 0.
 * tests/check-probes.sh checks that each probe called in the source is in
 * both libfanout.a and libfanout.so.
 */
#ifndef FANOUT_LIB_PROBES_H
#define FANOUT_LIB_PROBES_H

#if !defined(FANOUT_NO_PROBES) && defined(__has_include)
#if __has_include(<sys/sdt.h>)
#define FANOUT_HAVE_PROBES 1
#endif
#endif

#ifdef FANOUT_HAVE_PROBES

#define _SDT_HAS_SEMAPHORES 1
#include <sys/sdt.h>

/* Apply X(name) to every probe: the semaphores' one list. */
#define FANOUT_PROBE_LIST(X)                                                   \
	X(batch__submit)                                                       \
	X(child__start)                                                        \
	X(child__done)                                                         \
	X(batch__done)                                                         \
	X(cancel)                                                              \
	X(defer)                                                               \
	X(complete)                                                            \
	X(reject)                                                              \
	X(worker__park)                                                        \
	X(worker__wake)

#define FANOUT__SEMAPHORE_DECLARE(name)                                        \
	extern unsigned short fanout_##name##_semaphore                        \
		__attribute__((visibility("hidden")));
FANOUT_PROBE_LIST(FANOUT__SEMAPHORE_DECLARE)

/* Non-zero while a tracer is attached to that probe. */
#define FANOUT__ENABLED(name)                                                  \
	__builtin_expect(                                                      \
		*(volatile unsigned short *)&fanout_##name##_semaphore != 0,   \
		0)

#define FANOUT_PROBE_BATCH_SUBMIT(id, ntasks, depth)                           \
	STAP_PROBE3(fanout, batch__submit, id, ntasks, depth)
#define FANOUT_PROBE_CHILD_START(id, index, cpu)                               \
	STAP_PROBE3(fanout, child__start, id, index, cpu)
#define FANOUT_PROBE_CHILD_DONE(id, index, status, duration_ns)                \
	STAP_PROBE4(fanout, child__done, id, index, status, duration_ns)
#define FANOUT_PROBE_BATCH_DONE(id, status, ncompleted, nerror, ninterrupted)  \
	STAP_PROBE5(fanout, batch__done, id, status, ncompleted, nerror,       \
		    ninterrupted)
#define FANOUT_PROBE_CANCEL(id, how, source)                                   \
	STAP_PROBE3(fanout, cancel, id, how, source)
#define FANOUT_PROBE_DEFER(id, index) STAP_PROBE2(fanout, defer, id, index)
#define FANOUT_PROBE_COMPLETE(id, index, code)                                 \
	STAP_PROBE3(fanout, complete, id, index, code)
#define FANOUT_PROBE_REJECT(err) STAP_PROBE1(fanout, reject, err)
#define FANOUT_PROBE_WORKER_PARK(worker, cpu)                                  \
	STAP_PROBE2(fanout, worker__park, worker, cpu)
#define FANOUT_PROBE_WORKER_WAKE(worker, slept_ns)                             \
	STAP_PROBE2(fanout, worker__wake, worker, slept_ns)

#else /* no probes */

/* Nothing is evaluated; the arguments still count as used. */
#define FANOUT__NO1(a) ((void)sizeof(a))
#define FANOUT__NO2(a, b) (FANOUT__NO1(a), FANOUT__NO1(b))
#define FANOUT__NO3(a, b, c) (FANOUT__NO2(a, b), FANOUT__NO1(c))
#define FANOUT__NO4(a, b, c, d) (FANOUT__NO3(a, b, c), FANOUT__NO1(d))
#define FANOUT__NO5(a, b, c, d, e) (FANOUT__NO4(a, b, c, d), FANOUT__NO1(e))
#define FANOUT__ENABLED(name) 0
#define FANOUT_PROBE_BATCH_SUBMIT(id, ntasks, depth)                           \
	FANOUT__NO3(id, ntasks, depth)
#define FANOUT_PROBE_CHILD_START(id, index, cpu) FANOUT__NO3(id, index, cpu)
#define FANOUT_PROBE_CHILD_DONE(id, index, status, duration_ns)                \
	FANOUT__NO4(id, index, status, duration_ns)
#define FANOUT_PROBE_BATCH_DONE(id, status, ncompleted, nerror, ninterrupted)  \
	FANOUT__NO5(id, status, ncompleted, nerror, ninterrupted)
#define FANOUT_PROBE_CANCEL(id, how, source) FANOUT__NO3(id, how, source)
#define FANOUT_PROBE_DEFER(id, index) FANOUT__NO2(id, index)
#define FANOUT_PROBE_COMPLETE(id, index, code) FANOUT__NO3(id, index, code)
#define FANOUT_PROBE_REJECT(err) FANOUT__NO1(err)
#define FANOUT_PROBE_WORKER_PARK(worker, cpu) FANOUT__NO2(worker, cpu)
#define FANOUT_PROBE_WORKER_WAKE(worker, slept_ns) FANOUT__NO2(worker, slept_ns)

#endif

/* The guarded forms: true while a tracer is attached to the probe. */
#define FANOUT_PROBE_BATCH_SUBMIT_ENABLED() FANOUT__ENABLED(batch__submit)
#define FANOUT_PROBE_CHILD_START_ENABLED() FANOUT__ENABLED(child__start)
#define FANOUT_PROBE_CHILD_DONE_ENABLED() FANOUT__ENABLED(child__done)
#define FANOUT_PROBE_BATCH_DONE_ENABLED() FANOUT__ENABLED(batch__done)
#define FANOUT_PROBE_CANCEL_ENABLED() FANOUT__ENABLED(cancel)
#define FANOUT_PROBE_DEFER_ENABLED() FANOUT__ENABLED(defer)
#define FANOUT_PROBE_COMPLETE_ENABLED() FANOUT__ENABLED(complete)
#define FANOUT_PROBE_REJECT_ENABLED() FANOUT__ENABLED(reject)
#define FANOUT_PROBE_WORKER_PARK_ENABLED() FANOUT__ENABLED(worker__park)
#define FANOUT_PROBE_WORKER_WAKE_ENABLED() FANOUT__ENABLED(worker__wake)

#endif
