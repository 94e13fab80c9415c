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
	X(EBUSY,                                                               \
	  "at capacity: max_async background delegations are running, "        \
	  "or the batch's sink holds max_pending events nobody has "           \
	  "taken (nobody drains that sink: poll or wait on it), or the "       \
	  "work ring is full, or another thread is polling this sink; "        \
	  "take events, raise fanout_config.max_async, max_pending or "        \
	  "queue_slots, or use fanout_delegate to run inline")                 \
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
		  "worker thread; from a dispatch or run with a deadline: "    \
		  "could not start the engine's timer thread, retry later)")   \
	X(ETIMEDOUT, "no event arrived within the timeout; wait again")        \
	X(EDEADLK,                                                             \
	  "called from a child the engine waits for (its own child, "          \
	  "or one nested in its children through fanout_run), so it "          \
	  "would wait for itself; call it from outside those children")        \
	X(EMFILE, "no file descriptor left for the sink's eventfd; close "     \
		  "some or raise RLIMIT_NOFILE")                               \
	X(ENFILE, "the system is out of file descriptors for the sink's "      \
		  "eventfd; retry later")                                      \
	X(ERANGE, "no such worker: the index must be below the engine's "      \
		  "worker count (fanout_stats().nworkers)")                    \
	X(ECANCELED,                                                           \
	  "interrupted: the delegation was cancelled or the engine "           \
	  "shut down")                                                         \
	X(EOVERFLOW, "the event's text (fanout_format, fanout_event_json) "    \
		     "would be longer than INT_MAX bytes, which the return "   \
		     "value cannot count; the buffer holds an empty string; "  \
		     "keep the children's summaries and errors shorter")       \
	X(EOWNERDEAD, "engine was created in the parent process before "       \
		      "fork(); create a new engine in the child (only "        \
		      "fanout_destroy() works on this one)")

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

/* -EBUSY with the figures now: which sinks nobody drains (at max_pending),
 * how full the async pool is, and the ring's size. */
static int describe_busy(struct fanout_engine *e, const char *base, char *buf,
			 size_t len)
{
	bool dflt;
	unsigned full = fanout__sinks_full(e, &dflt);
	unsigned running = fanout__async_running(e); /* a figure */
	unsigned created = dflt ? full - 1 : full;

	if (!full)
		return snprintf(buf, len,
				"%s [%u of max_async=%u background delegations "
				"running; queue_slots=%u; no sink at "
				"max_pending=%u]",
				base, running, e->cfg.max_async,
				e->cfg.queue_slots, e->cfg.max_pending);
	return snprintf(
		buf, len,
		"nobody drains %s%s%.0u%s%s: %s at max_pending=%u events "
		"not taken (a delegation keeps its place on its sink "
		"until fanout_poll/fanout_wait returns its event); take "
		"events from it, or raise fanout_config.max_pending "
		"[%u of max_async=%u background delegations running; "
		"queue_slots=%u]",
		dflt ? "the default sink" : "", dflt && created ? " and " : "",
		created, created ? " created sink" : "", created > 1 ? "s" : "",
		full > 1 ? "each is" : "it is", e->cfg.max_pending, running,
		e->cfg.max_async, e->cfg.queue_slots);
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
		return describe_busy(e, base, buf, len);
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
	return fq_now_ns_floor();
}
