/* SPDX-License-Identifier: MIT */
/*
 * probes.c - the semaphores of the USDT probes in probes.h.
 *
 * <sys/sdt.h> (with _SDT_HAS_SEMAPHORES) names one per probe,
 * fanout_<probe>_semaphore, in every probe's note; a tracer attaching to
 * the probe increments it (the kernel's uprobe reference counter) and
 * decrements it when it leaves, so the probe's _ENABLED() form can skip
 * costly arguments otherwise.  They live in ".probes", as the semaphores
 * dtrace -G generates do, and are hidden: nothing here is exported.
 */
#include "probes.h"

#ifdef FANOUT_HAVE_PROBES
#define FANOUT__SEMAPHORE_DEFINE(name)                                         \
	unsigned short fanout_##name##_semaphore                               \
		__attribute__((section(".probes"), used));
FANOUT_PROBE_LIST(FANOUT__SEMAPHORE_DEFINE)
#else
typedef int fanout__no_probes; /* ISO C wants a non-empty unit */
#endif
