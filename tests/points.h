/* SPDX-License-Identifier: MIT */
/*
 * points.h - stopping a thread at one of the library's test points
 * (include/fanout_testing.h, fanout_test_hook()), as a preemption would.
 *
 * A struct pause stops, once, the first thread that passes its point with
 * pause_mine set (each thread sets its own); the test waits for it with
 * pause_wait() and lets it go with pause_go().  Builds without test points
 * make pause_arm() return false: the test skips.
 */
#ifndef FANOUT_TESTS_POINTS_H
#define FANOUT_TESTS_POINTS_H

#include "common.h"
#include "fanout_testing.h"

#include <semaphore.h>

struct pause {
	enum fanout_test_point at;
	sem_t paused, go;
	atomic_int fired;
};

/* Set by the thread that may be stopped. */
static _Thread_local bool pause_mine;

static inline void pause_hook(void *arg, enum fanout_test_point at,
			      const void *obj)
{
	struct pause *p = arg;

	(void)obj;
	if (at != p->at || !pause_mine || atomic_exchange(&p->fired, 1))
		return;
	sem_post(&p->paused);
	sem_wait(&p->go);
}

/* Wait for @s at most @ms; false if it did not come. */
static inline bool sem_wait_ms(sem_t *s, unsigned ms)
{
	struct timespec ts = realtime_in_ms(ms);

	while (sem_timedwait(s, &ts))
		if (errno != EINTR)
			return false;
	return true;
}

/* Arm @p for point @at; false in a build without test points. */
static inline bool pause_arm(struct pause *p, enum fanout_test_point at)
{
	memset(p, 0, sizeof(*p));
	p->at = at;
	assert_int_equal(sem_init(&p->paused, 0, 0), 0);
	assert_int_equal(sem_init(&p->go, 0, 0), 0);
	if (fanout_test_hook(pause_hook, p) == -ENOTSUP) {
		sem_destroy(&p->paused);
		sem_destroy(&p->go);
		return false;
	}
	return true;
}

/* The marked thread stopped at the point (asserted within WAIT_MS). */
static inline void pause_wait(struct pause *p)
{
	assert_true(sem_wait_ms(&p->paused, WAIT_MS));
}

static inline void pause_go(struct pause *p)
{
	sem_post(&p->go);
}

/* Disarm and free @p once its thread went on. */
static inline void pause_done(struct pause *p)
{
	assert_int_equal(fanout_test_hook(NULL, NULL), 0);
	sem_destroy(&p->paused);
	sem_destroy(&p->go);
}

#endif /* FANOUT_TESTS_POINTS_H */
