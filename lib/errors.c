/* SPDX-License-Identifier: MIT */
/*
 * errors.c - messages that tell the caller what to do, status names, clock.
 * Correctness: pure functions over static tables, plus relaxed reads of
 * counters in fanout_describe_error() (figures for a human, not a decision).
 */
#include "internal.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>

#define FANOUT_ERRORS(X)                                                       \
	X(EINVAL, "invalid argument: a NULL pointer, an empty batch, a task "  \
		  "without fn, a bad flag or config field, or a sink of "      \
		  "another engine; fix the call")                              \
	X(E2BIG,                                                               \
	  "batch has more tasks than fanout_config.max_tasks; split it "       \
	  "or raise max_tasks")                                                \
	X(EBUSY, "at capacity: max_async background delegations are running "  \
		 "(or the work ring is full, or another thread is polling "    \
		 "this sink); wait for events, raise fanout_config.max_async " \
		 "or queue_slots, or use fanout_delegate to run inline")       \
	X(ELOOP,                                                               \
	  "delegation too deep: its children would exceed "                    \
	  "fanout_config.max_depth; do the work in this child or raise "       \
	  "max_depth")                                                         \
	X(ENOMEM, "out of memory; nothing was started, retry later")           \
	X(ESHUTDOWN, "engine is shut down: it accepts no new work; create a "  \
		     "new engine")                                             \
	X(ENOENT, "no such delegation: the id is unknown or its record was "   \
		  "pruned (raise fanout_config.keep_completed to keep more)")  \
	X(EALREADY, "the delegation already finished; its event is (or was) "  \
		    "in its sink")                                             \
	X(EAGAIN, "no event waiting; poll again later or use fanout_wait / "   \
		  "fanout_sink_fd (from fanout_create: could not start a "     \
		  "worker thread)")                                            \
	X(ETIMEDOUT, "no event arrived within the timeout; wait again")        \
	X(EDEADLK, "called from a child of the same engine, which would wait " \
		   "for itself; call it from outside the engine's children")   \
	X(EMFILE, "no file descriptor left for the sink's eventfd; close "     \
		  "some or raise RLIMIT_NOFILE")                               \
	X(ENFILE, "the system is out of file descriptors for the sink's "      \
		  "eventfd; retry later")                                      \
	X(ERANGE, "no such worker: the index must be below the engine's "      \
		  "worker count (fanout_stats().nworkers)")                    \
	X(ECANCELED,                                                           \
	  "interrupted: the delegation was cancelled or the engine "           \
	  "shut down")

const char *fanout_strerror(int err)
{
	if (err == INT_MIN)
		return "unknown error code: not one fanout returns";
	if (err < 0)
		err = -err;
	switch (err) {
	case 0:
		return "success";
#define X(code, text)                                                          \
	case code:                                                             \
		return text;
		FANOUT_ERRORS(X)
#undef X
	default:
		return "unknown error code: not one fanout returns";
	}
}

int fanout_describe_error(struct fanout_engine *e, int err, char *buf,
			  size_t len)
{
	const char *base = fanout_strerror(err);

	if (!e || (!buf && len))
		return -EINVAL;
	if (err < 0 && err != INT_MIN)
		err = -err;
	switch (err) {
	case EBUSY:
		return snprintf(
			buf, len,
			"%s [%u of max_async=%u background delegations "
			"running; queue_slots=%u]",
			base,
			atomic_load_explicit(&e->async_running, /* a figure */
					     memory_order_relaxed),
			e->cfg.max_async, e->cfg.queue_slots);
	case E2BIG:
		return snprintf(buf, len, "%s [max_tasks=%u]", base,
				e->cfg.max_tasks);
	case ELOOP:
		return snprintf(buf, len, "%s [max_depth=%u]", base,
				e->cfg.max_depth);
	case ENOENT:
		return snprintf(buf, len, "%s [keep_completed=%u]", base,
				e->cfg.keep_completed);
	default:
		return snprintf(buf, len, "%s", base);
	}
}

const char *fanout_status_name(enum fanout_status st)
{
	switch (st) {
	case FANOUT_PENDING:
		return "pending";
	case FANOUT_RUNNING:
		return "running";
	case FANOUT_COMPLETED:
		return "completed";
	case FANOUT_ERROR:
		return "error";
	case FANOUT_INTERRUPTED:
		return "interrupted";
	}
	return "unknown";
}

uint64_t fanout_now_ns(void)
{
	return fq_now_ns();
}
