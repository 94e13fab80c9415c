/* SPDX-License-Identifier: MIT */
/*
 * fanout.h - fan work out to pinned worker threads and join it again.
 *
 * CONTRACT
 *
 * A *delegation* is a batch of N child tasks handed over in one call. The
 * children run in parallel on the engine's worker threads; when the last one
 * has finished, exactly ONE completion event, carrying every child's result
 * at its task index, is produced:
 *   - fanout_dispatch():  background; the event goes to the batch's sink;
 *   - fanout_run():       synchronous; the event is returned to the caller,
 *                         who helps run its own children while it waits;
 *   - fanout_delegate():  the orchestrator policy choosing one of the two.
 *
 * Errors.  Every call that can fail returns 0 (or a documented positive
 * value) on success and a negative errno value on failure, as in the kernel
 * and liburing.  A call that fails changes nothing: no record, no queue slot,
 * no capacity credit, no memory is left behind, and no event will ever be
 * produced for it.  fanout_strerror() says what to do about each code.
 *
 * Exactly once.  Every delegation that fanout_dispatch() accepted (returned
 * 0) publishes exactly one event to its sink: when its children finish, when
 * it is cancelled, and across fanout_shutdown().  Every child appears in that
 * event exactly once, at results[index].
 *
 * Ownership.  Strings in a batch (goals, context, session_key) are copied;
 * the caller's memory can be reused as soon as the call returns - unless
 * the batch sets FANOUT_BORROW_TASKS, which borrows the task array and the
 * goals instead (see struct fanout_batch for how long).  tasks[i].arg
 * and batch->user are opaque and never touched.  An event belongs to whoever
 * received it (fanout_poll, fanout_wait, fanout_run, fanout_delegate) until
 * fanout_event_free(); it stays valid even after its record was pruned from
 * the table or the engine was shut down, but not after fanout_destroy().
 *
 * Threads.  Any thread may call any function without registering anywhere
 * first, including children running on the workers (nested delegation).
 * The exceptions:
 *   - fanout_destroy() must not race any other call on the same engine, and
 *     fanout_shutdown()/fanout_destroy() of an engine must not be called
 *     from a child that engine waits for: a child of the engine itself, or
 *     a child nested in one of its children through fanout_run() or an
 *     inline fanout_delegate(), at any depth and on any thread (the nested
 *     child may run on another engine's worker while the outer child waits
 *     in fanout_run()).  They return -EDEADLK / do nothing in those cases.
 *     A background link (a child that fanout_dispatch()es and returns) is
 *     not a wait: from a child of such a delegation, shutting down the
 *     dispatching child's engine is allowed - unless that child waits for
 *     the event on a sink, a wait the library cannot see, which then
 *     hangs;
 *   - one sink has one consumer at a time: a second thread calling
 *     fanout_poll()/fanout_wait() on the same sink while the first is inside
 *     gets -EBUSY instead of corrupting anything;
 *   - fanout_sink_destroy() must not race calls on that sink.
 *
 *   may run concurrently with ...   dispatch run  cancel lookup list poll/wait
 *   fanout_dispatch / run / delegate   yes    yes   yes    yes    yes   yes
 *   fanout_cancel                      yes    yes   yes    yes    yes   yes
 *   fanout_lookup / list / stats       yes    yes   yes    yes    yes   yes
 *   fanout_poll / wait (same sink)     yes    yes   yes    yes    yes   -EBUSY
 *   fanout_poll / wait (other sink)    yes    yes   yes    yes    yes   yes
 *   fanout_shutdown                    yes(1) yes(1) yes   yes    yes   yes
 *   fanout_destroy                     no     no    no     no     no    no
 *   (1) the racing call either is accepted (and its event is delivered before
 *       fanout_shutdown returns) or fails with -ESHUTDOWN.
 *
 * What may block.  Only fanout_run (and fanout_delegate when it runs inline),
 * fanout_wait, fanout_shutdown and fanout_destroy block.  Everything else is
 * non-blocking: dispatch, cancel, lookup, list, poll and stats take no lock
 * and never sleep.  Blocked threads sleep on a futex.
 *
 * Children must return.  A child ends only by returning from its fanout_fn.
 * No longjmp() out of it, no pthread_exit() (or thread cancellation) inside
 * it, no C++ exception escaping it.  The library has no way to notice any
 * of these, and the damage is permanent: the child is never counted as
 * finished, so the delegation's join never completes - its event never
 * comes, a fanout_run() waiting for it never returns, fanout_shutdown()
 * and fanout_destroy() of its engine hang, and its capacity slot and
 * memory are never given back.  Worse, the thread's record of its current
 * child (fanout_current_child()) is left pointing at the dead frame.  On a
 * worker, pthread_exit() also takes that worker away for good, and an
 * exception that escapes a child there reaches the top of the thread and
 * terminates the process (std::terminate); on a fanout_run() caller's
 * thread it propagates out of fanout_run(), leaving the above behind.
 * Catch exceptions and longjmp targets inside the child, and report a
 * failure by returning a negative errno.
 *
 * Children waiting for events.  fanout_wait() inside a child only waits:
 * it never runs children, with or without FANOUT_WAIT_HELPS (that flag
 * helps only top-level callers).  So a child that waits for the event of a
 * delegation that has not finished yet - a later batch, or one it
 * dispatched itself - needs another thread to run that delegation's
 * children while it holds its own thread.  On a one-worker engine the
 * worker is the waiting child's: the event comes only if a top-level
 * thread is in a helping fanout_wait() (FANOUT_WAIT_HELPS) on a sink of
 * that engine meanwhile; otherwise a wait with timeout < 0 never returns
 * (and fanout_shutdown() hangs on that child).  In general, as many
 * children waiting like this as the engine has workers, and nobody
 * helping, wait forever.  Inside a child, use fanout_run() or
 * fanout_delegate() instead: they run their own batch on the calling
 * thread and cannot deadlock, or wait with a timeout.
 *
 * Fork.  On the first fanout_create() fanout registers pthread_atfork()
 * handlers (liburcu-bp's, whose call_rcu and resize threads fork does not
 * copy), so a process forked from one that uses fanout - Python's
 * multiprocessing does it by default - can create, use and destroy engines
 * of its own as usual.  Do not register liburcu-bp's fork handlers again
 * yourself: they are not reentrant.  An engine created before the fork,
 * and its sinks, belong to the parent: their workers do not exist in the
 * child, so in the child every call on them fails with -EOWNERDEAD and
 * changes nothing - dispatch, run, delegate, cancel, cancel_session,
 * lookup, list, stats, worker_stats, shutdown, sink_create/destroy,
 * sink_fd, and poll/wait even when events
 * wait in the sink (they are the parent's, and the eventfd is shared with
 * the parent).  Only fanout_destroy() works: it frees the child's copy
 * (sinks, their queued events and eventfd descriptors, finished records,
 * the engine) and joins no thread; records still running at the fork are
 * left allocated (their other references belong to threads the child does
 * not have; the pages are the parent's, copy-on-write).  The parent is not
 * affected: each delegation it had accepted still publishes exactly one
 * event there.  Events the parent had taken before the fork are copies in
 * the child; read and free them before destroying the inherited engine.
 * A child task may fork (to exec a program, say): the new process starts
 * at top level (fanout_current_child() is NULL, new delegations have depth
 * 1), may create engines, and must end in exec*() or _exit(): returning
 * from the task there would resume the copied worker loop (undefined).
 * A process forked by a pinned worker inherits its one-CPU affinity, so a
 * new engine there defaults to one worker.  Not covered: _Fork(), vfork()
 * or clone() children that do more than exec (no atfork handler runs), and
 * a fork while another thread is inside fanout_destroy() (the child must
 * not destroy that engine).  Cost: one relaxed load per call, of a line
 * only a forked child's handler writes; and each fork() of a process that
 * has created an engine waits for liburcu to pause and resume its RCU
 * threads (1 ms sleeps: milliseconds per fork; posix_spawn() skips it).
 *
 * Memory ordering.  Publishing an event is a release: everything a child
 * wrote before returning (including memory reachable from its arg) is visible
 * to whoever receives the event (fanout_poll/wait/run acquire).  A successful
 * fanout_dispatch() happens-before the first instruction of each child.
 */
#ifndef FANOUT_H
#define FANOUT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define FANOUT_API __attribute__((visibility("default")))
#else
#define FANOUT_API
#endif

/*
 * The version of this header.  The Makefile reads these three lines (the
 * one place the version is written); the library built from them reports
 * the same through fanout_version().
 *
 * FANOUT_VERSION_NUMBER is MAJOR * 10000 + MINOR * 100 + PATCH, for
 * preprocessor tests: #if FANOUT_VERSION_NUMBER >= 200 (0.2.0 or later).
 * FANOUT_VERSION_STRING is "MAJOR.MINOR.PATCH".
 */
#define FANOUT_VERSION_MAJOR 0
#define FANOUT_VERSION_MINOR 2
#define FANOUT_VERSION_PATCH 0
#define FANOUT_VERSION_NUMBER                                                  \
	(FANOUT_VERSION_MAJOR * 10000 + FANOUT_VERSION_MINOR * 100 +           \
	 FANOUT_VERSION_PATCH)
#define FANOUT__VSTR(a, b, c) #a "." #b "." #c
#define FANOUT__VXSTR(a, b, c) FANOUT__VSTR(a, b, c)
#define FANOUT_VERSION_STRING                                                  \
	FANOUT__VXSTR(FANOUT_VERSION_MAJOR, FANOUT_VERSION_MINOR,              \
		      FANOUT_VERSION_PATCH)

/**
 * fanout_version() - the version of the library linked at run time.
 *
 * "MAJOR.MINOR.PATCH", e.g. "0.2.0"; static storage, never NULL.  With the
 * shared library it may differ from FANOUT_VERSION_STRING, the header the
 * program was compiled against: compare the two to detect a mismatch.
 * Context: any thread, no engine needed; never blocks.
 */
FANOUT_API const char *fanout_version(void);

/**
 * typedef fanout_id - names one delegation; never 0.
 *
 * Printed as "deleg_%016llx" (see FANOUT_ID_FMT).  Ids are unique within an
 * engine for its whole lifetime.  Each engine starts its sequence at a
 * random point (getrandom(), or clocks, pid and address without it), so
 * engines of one process, of different processes and of a parent and its
 * forked child hand out different ids with overwhelming probability -
 * but only uniqueness within one engine is guaranteed.
 */
typedef uint64_t fanout_id;
#define FANOUT_ID_FMT "deleg_%016llx"

struct fanout_engine;
struct fanout_sink;
struct fanout_child;
struct fanout_pending;

/**
 * enum fanout_status - state of a child, a delegation or an event.
 * @FANOUT_PENDING:     not produced by this version (listings say
 *                      FANOUT_RUNNING from dispatch to the event); kept
 *                      so that code naming it still compiles.
 * @FANOUT_RUNNING:     (delegation, in listings) children still running.
 * @FANOUT_COMPLETED:   child returned 0; event: at least one child completed.
 * @FANOUT_ERROR:       child returned a negative errno other than
 *                      -ECANCELED (or a positive value); event: no child
 *                      completed and not all were interrupted.
 * @FANOUT_INTERRUPTED: child returned -ECANCELED, or never started because
 *                      the delegation was cancelled; event: every child was
 *                      interrupted.
 */
enum fanout_status {
	FANOUT_PENDING = 0,
	FANOUT_RUNNING = 1,
	FANOUT_COMPLETED = 2,
	FANOUT_ERROR = 3,
	FANOUT_INTERRUPTED = 4,
};

/**
 * fanout_status_name() - "pending", "running", "completed", "error",
 * "interrupted"; "unknown" for anything else.  Never NULL.
 */
FANOUT_API const char *fanout_status_name(enum fanout_status st);

/* Flags for fanout_config.flags. */
#define FANOUT_NO_PIN 0x1u /* leave worker threads unpinned */
/* fanout_wait() runs queued children while no event is ready (see there). */
#define FANOUT_WAIT_HELPS 0x2u
/*
 * FANOUT_NO_CHILD_CLOCK - children are not timed: every
 * fanout_result.duration_ns is 0, and no clock is read per child (by
 * default one tick-counter reading per child boundary: the end of one
 * child is the start of the next one its runner starts, within a chunk
 * and from one chunk to the next it claims, and a deferred child's end
 * is read by its finisher).  Runners still read the counter twice per
 * chunk of children they claim (to size the next chunk), and not at all
 * for a chunk that ends the batch.  Events' dispatched_ns/completed_ns,
 * deadlines and everything else are unchanged.  For throughput-bound
 * callers that do not read durations; the default keeps them.
 */
#define FANOUT_NO_CHILD_CLOCK 0x4u
/*
 * FANOUT_RUNNERS_ON_DEMAND - a background batch starts with one runner;
 * the others it may have (one per worker, at most max_children) join once
 * its first children show that the rest would take 20 us or more, or once
 * a child defers.  A batch of quick children is then run by one worker
 * without the other runners' cross-core traffic (dispatch + wait of no-op
 * children on 2 workers: batch 8 with 2 in flight 1.35-1.55x, batch 64
 * 1.08-1.33x).  The price: a batch of children that compute waits for
 * its first chunk (often one child) before a second runner starts, so it
 * can take up to one child's duration longer (two children of 5 ms each:
 * 10 ms instead of 5).  Deferred children do not pay it.  fanout_run and
 * fanout_delegate's inline runs are unchanged.
 */
#define FANOUT_RUNNERS_ON_DEMAND 0x8u

/**
 * struct fanout_config - engine configuration; a zeroed field = its default.
 * @workers:        worker threads (default: CPUs this process may run on;
 *                  at most 1024).  Workers are pinned one per CPU of the
 *                  calling thread's affinity mask, or, when the calling
 *                  thread is pinned to a single CPU, of the mask the
 *                  process had when the library was loaded (so a
 *                  dispatcher pinned to its own core does not confine
 *                  the workers to it); unpinned workers (FANOUT_NO_PIN)
 *                  may run on the same CPUs.
 * @flags:          0 (workers pinned one per CPU, waits only wait,
 *                  children timed, every runner of a batch started at
 *                  once), or any of FANOUT_NO_PIN, FANOUT_WAIT_HELPS,
 *                  FANOUT_NO_CHILD_CLOCK and FANOUT_RUNNERS_ON_DEMAND.
 * @queue_slots:    work ring size, rounded up to a power of two, at most
 *                  1<<24 (default: enough that max_async background
 *                  delegations always fit; if you set it smaller, dispatch
 *                  returns -EBUSY when the ring has no room rather than
 *                  overflowing it).
 * @max_async:      background delegations running at once (default 256,
 *                  at most 1<<20).  One slot per delegation, however many
 *                  children.
 * @max_children:   children of one delegation running at once (default 64,
 *                  at most 1<<24).
 * @max_tasks:      children per delegation (default 65536, at most 1<<24).
 * @max_depth:      deepest child depth (default 2, at most 64).  Children
 *                  of a top-level delegation have depth 1.  Depth follows
 *                  the calling thread across engines: a child of engine A
 *                  (depth d) delegating to engine B makes children of
 *                  depth d + 1, checked against B's max_depth, and
 *                  fanout_delegate(B) from it runs inline.
 * @keep_completed: finished records whose event was freed that are kept
 *                  for lookup/list (default 1024, at most 1<<23: half
 *                  the 2^24 records the table holds).  A
 *                  record whose event is not freed yet (not taken, or
 *                  taken and held) stays in the table besides them and
 *                  is never pruned.  Once its event is freed, a kept
 *                  record is a 128-byte summary in the table (a "tomb":
 *                  what fanout_lookup() shows) and its block is freed; a
 *                  record whose session_key is longer than 47 bytes (31
 *                  if its children started delegations or deferred: the
 *                  tomb also keeps its place in the cancel tree) holds
 *                  its whole block (results and strings) until it is
 *                  pruned.  Freed
 *                  blocks of 16 KiB or more (batches of about 150
 *                  children and up) are kept for reuse by the engine, up
 *                  to 32 MiB, until fanout_destroy().
 * @spin_ns:        how long an idle thread spins before it parks on a futex
 *                  (default 50000 ns; at most 1 s).  Set to 1 to park almost
 *                  at once.
 * @max_pending:    back-pressure, per sink (the default sink and each one
 *                  from fanout_sink_create()): a background delegation
 *                  holds a place on its sink from the moment
 *                  fanout_dispatch() accepts it until fanout_poll() or
 *                  fanout_wait() hands its event out (running, or
 *                  finished and queued, both count).  A sink holding
 *                  max_pending refuses further dispatches with -EBUSY
 *                  (fanout_delegate() then runs inline, FANOUT_INLINE_FULL)
 *                  until its consumer takes events: a sink nobody drains
 *                  cannot grow without bound.  Default: 4096, or
 *                  4 x max_async when that is larger: the whole async pool
 *                  fits on one sink with room for three times as many
 *                  finished events waiting for a late consumer, so the
 *                  limit bites only on a sink that really is not drained,
 *                  while such a sink of one-child batches holds about
 *                  2.5 MiB (4096 blocks of ~640 bytes).  At most 1<<24.
 *                  README, "Memory", gives the bound on memory in use.
 */
struct fanout_config {
	unsigned workers;
	unsigned flags;
	unsigned queue_slots;
	unsigned max_async;
	unsigned max_children;
	unsigned max_tasks;
	unsigned max_depth;
	unsigned keep_completed;
	uint64_t spin_ns;
	unsigned max_pending;
};

/**
 * typedef fanout_fn - a child task.
 * @c:   the running child; valid only during this call.
 * @arg: fanout_task.arg.
 *
 * Return: 0 = completed; -ECANCELED = interrupted (return it after seeing
 * fanout_interrupted()); any other negative errno = error.  Positive values
 * are reported as errors.  A child MUST return: no longjmp() out of it, no
 * pthread_exit(), no C++ exception escaping it - the join would never
 * complete (see "Children must return" at the top).
 *
 * Context: runs on a worker thread or, for fanout_run, possibly on the
 * caller's thread.  It may call any fanout function, including a nested
 * fanout_run() or fanout_delegate(); fanout_shutdown() or fanout_destroy()
 * of its own engine, or of any engine whose child waits for it through
 * nested fanout_run() calls, returns -EDEADLK / does nothing (see
 * fanout_shutdown()).
 */
typedef int (*fanout_fn)(struct fanout_child *c, void *arg);

/**
 * struct fanout_task - one child of a batch.
 * @goal: short description, copied (borrowed with FANOUT_BORROW_TASKS);
 *        NULL is taken as "".
 * @fn:   the work; must not be NULL.
 * @arg:  passed to @fn.
 */
struct fanout_task {
	const char *goal;
	fanout_fn fn;
	void *arg;
};

/**
 * struct fanout_batch - what a delegation is made of.
 * @tasks:       @ntasks children, 1 <= ntasks <= max_tasks.
 * @ntasks:      number of children.
 * @context:     free text carried into the event (copied; NULL = none).
 * @session_key: routing key carried into the event (copied; NULL = none).
 * @sink:        where the event goes (background only); NULL = the engine's
 *               default sink.  Must belong to the same engine.
 * @user:        opaque, carried into the event.
 * @deadline_ns: relative deadline in ns from the call; 0 = none.  When it
 *               passes, the delegation is interrupted (as by
 *               FANOUT_CANCEL_INTERRUPT | FANOUT_CANCEL_ABANDON): children
 *               not finished by then are reported FANOUT_INTERRUPTED with
 *               code -ETIMEDOUT, pending (deferred) ones are abandoned, and
 *               the event goes out as soon as the running synchronous
 *               children return, with event->timed_out set.  At most
 *               FANOUT_MAX_DEADLINE_NS.  One timer thread per engine
 *               serves every deadline (started on the first one, also if
 *               that call is then refused for another reason; it stops
 *               with the engine).  If it has no memory to keep a
 *               deadline, that deadline passes at once (timed out early
 *               rather than never).
 * @join:        FANOUT_JOIN_ALL (0): wait for every child.
 *               FANOUT_JOIN_FIRST_ERROR: the first child that ends in
 *               FANOUT_ERROR interrupts the rest (errgroup, oneTBB).
 *               FANOUT_JOIN_ANY: the first FANOUT_COMPLETED child
 *               interrupts the rest (hedged requests).
 *               FANOUT_JOIN_QUORUM: @quorum completed children interrupt
 *               the rest.  "Interrupt the rest" is
 *               FANOUT_CANCEL_INTERRUPT | FANOUT_CANCEL_ABANDON; the event
 *               says which children finished and how.
 * @quorum:      for FANOUT_JOIN_QUORUM, 1 <= quorum <= ntasks; must be 0
 *               for the other policies.
 * @within:      a deferred child (see fanout_defer()) on whose behalf this
 *               delegation is started from a thread that is not running a
 *               child, e.g. an event loop completing it later: the new
 *               delegation's children get that child's depth + 1 and the
 *               delegation joins its cancel tree, as a call made from
 *               inside a running child does implicitly.  NULL = the calling
 *               thread's current child, if any.  @within must not have
 *               been completed yet.  If it is finished while the call
 *               links the new delegation (completed on another thread,
 *               or abandoned), the call either refuses with -ECANCELED
 *               or succeeds with the delegation interrupted at once
 *               (INTERRUPT | ABANDON, event->cancelled): a cancel of the
 *               tree may already have passed the finished child.
 * @flags:       0 (everything the call reads is copied), or
 *               FANOUT_BORROW_TASKS.  Other bits: -EINVAL.
 *
 * FANOUT_BORROW_TASKS: the library copies neither @tasks nor the goal
 * strings; it reads them from the caller's memory while the children run,
 * and each result's goal is the caller's own pointer (tasks[i].goal, or a
 * static "" for NULL).  What must outlive what:
 *   - the array @tasks[0..ntasks) - each task's goal, fn and arg - must
 *     stay valid and unchanged from the call until the event is handed to
 *     the caller: by fanout_poll()/fanout_wait() for fanout_dispatch() and
 *     a background fanout_delegate(); until fanout_run() (or an inline
 *     fanout_delegate()) returns.  A batch refused with an error borrowed
 *     nothing;
 *   - each goal string must stay valid and unchanged until that event is
 *     freed (fanout_event_free()), since results[i].goal points at it.  An
 *     event never taken (freed by fanout_sink_destroy() or
 *     fanout_destroy()) reads no goal when it is freed.
 * @context and @session_key are still copied (the caller may reuse them
 * when the call returns), as are the strings children set.  It saves the
 * copy (24 bytes per task plus the goals) and makes the record block that
 * much smaller; the default copies, so that the caller's memory can be
 * reused at once.
 */
struct fanout_batch {
	const struct fanout_task *tasks;
	unsigned ntasks;
	const char *context;
	const char *session_key;
	struct fanout_sink *sink;
	void *user;
	uint64_t deadline_ns;
	unsigned join;
	unsigned quorum;
	struct fanout_pending *within;
	unsigned flags;
};

/* fanout_batch.flags: borrow the task array and goals (see above). */
#define FANOUT_BORROW_TASKS 0x1u

/* fanout_batch.join policies. */
#define FANOUT_JOIN_ALL 0u
#define FANOUT_JOIN_FIRST_ERROR 1u
#define FANOUT_JOIN_ANY 2u
#define FANOUT_JOIN_QUORUM 3u

/* Longest accepted fanout_batch.deadline_ns: about 30 days. */
#define FANOUT_MAX_DEADLINE_NS (30ull * 24 * 3600 * 1000000000ull)

/**
 * struct fanout_result - one child's outcome, at results[index].
 * @index:       task index, equal to its position in the array.
 * @status:      FANOUT_COMPLETED, FANOUT_ERROR or FANOUT_INTERRUPTED.
 * @goal:        the task's goal (copied at dispatch; with
 *               FANOUT_BORROW_TASKS the caller's own string, "" for NULL).
 * @summary:     what the child set with fanout_set_summary(), or NULL.
 * @error:       NULL when completed; else what the child set with
 *               fanout_set_error(), or a description of @code.
 * @duration_ns: wall time the child ran, at least 1 (0 if it never
 *               started, and always 0 on an engine with
 *               FANOUT_NO_CHILD_CLOCK).  For
 *               the first child a fanout_run() caller runs itself it
 *               counts from the call's dispatched_ns, so it includes the
 *               call's own set-up after that stamp (tens of ns); for the
 *               first child of a chunk a runner claimed right after
 *               another, from the previous child's end, so it includes
 *               the claim (tens of ns).
 * @cost:        sum of the child's fanout_add_cost() calls.
 * @code:        the child's return value (0, or negative errno);
 *               -ECANCELED for a child that never started.
 */
struct fanout_result {
	unsigned index;
	enum fanout_status status;
	const char *goal;
	const char *summary;
	const char *error;
	uint64_t duration_ns;
	double cost;
	int code;
};

/**
 * struct fanout_event - the one completion of a delegation.
 * @id:           the delegation.
 * @status:       COMPLETED if any child completed; INTERRUPTED if every
 *                child was interrupted; ERROR otherwise.
 * @nresults:     equals the batch's ntasks.
 * @results:      @nresults entries, in task order.
 * @context:      the batch's context, or NULL.
 * @session_key:  the batch's session_key, or NULL.
 * @error:        NULL when COMPLETED; else a one-line reason.
 * @user:         the batch's user pointer.
 * @dispatched_ns, @completed_ns: CLOCK_MONOTONIC times (fanout_now_ns()),
 *                taken as the call dispatches and after the last
 *                child ended.  They are extrapolated by the CPU's tick
 *                counter from a clock reading at most 4 us old on the same
 *                thread, so each may trail a direct reading by up to
 *                about a clock call (tens of ns) and never leads one:
 *                completed_ns >= dispatched_ns; a fanout_now_ns() made
 *                before the call on the calling thread is <=
 *                dispatched_ns (a clock_gettime() may be up to that lag
 *                above it); a clock reading after the event is taken is
 *                >= completed_ns.
 * @cost:         sum of the children's costs.
 * @ncompleted, @nerror, @ninterrupted: children per status.
 * @cancelled:    fanout_cancel(), fanout_cancel_session(), fanout_shutdown()
 *                or the cancel tree of a parent delegation cancelled it.
 * @timed_out:    its deadline passed before every child had finished.
 * @interrupted_by_policy: its join policy interrupted the remaining
 *                children (FANOUT_JOIN_FIRST_ERROR, _ANY, _QUORUM).
 */
struct fanout_event {
	fanout_id id;
	enum fanout_status status;
	unsigned nresults;
	const struct fanout_result *results;
	const char *context;
	const char *session_key;
	const char *error;
	void *user;
	uint64_t dispatched_ns;
	uint64_t completed_ns;
	double cost;
	unsigned ncompleted;
	unsigned nerror;
	unsigned ninterrupted;
	bool cancelled;
	bool timed_out;
	bool interrupted_by_policy;
};

/**
 * struct fanout_info - a snapshot of one delegation record.
 * @id, @ntasks:  as dispatched.
 * @status:       FANOUT_RUNNING until the event is published, then the
 *                event's status.
 * @ndone:        children finished so far (including those cancelled).
 * @dispatched_ns, @completed_ns: times; completed_ns is 0 while running.
 * @cost:         sum of finished children's costs.
 * @depth:        depth of its children (1 for a top-level delegation).
 * @background:   true for fanout_dispatch, false for fanout_run.
 * @cancelled:    fanout_cancel() or shutdown asked it to stop.
 * @user:         the batch's user pointer.
 * @session_key:  the batch's session_key, or NULL.  Points into the record
 *                or its tomb (see keep_completed): read it right after the
 *                call - it stays valid only until the record is pruned
 *                (see fanout_lookup()) or, for a pointer into the
 *                record, until its event is freed and a grace period has
 *                passed.  Copy it to keep it.
 * @npending:     deferred children not completed yet (see fanout_defer()).
 */
struct fanout_info {
	fanout_id id;
	enum fanout_status status;
	unsigned ntasks;
	unsigned ndone;
	uint64_t dispatched_ns;
	uint64_t completed_ns;
	double cost;
	unsigned depth;
	bool background;
	bool cancelled;
	void *user;
	const char *session_key;
	unsigned npending;
};

#define FANOUT_STATS_MAX_WORKERS 64

/**
 * struct fanout_worker_stats - counters of one worker thread.
 * @children_run: children this worker ran.
 * @parks:        times it slept on its futex after spinning spin_ns.
 * @wakeups:      times it was woken from that sleep.
 * @cpu:          the CPU it is pinned to, or -1.
 */
struct fanout_worker_stats {
	uint64_t children_run;
	uint64_t parks;
	uint64_t wakeups;
	int cpu;
};

/**
 * struct fanout_stats - engine counters since fanout_create().
 *
 * A snapshot taken while work runs is consistent in one way: completed
 * never exceeds dispatched + runs.  Otherwise each counter is read on its
 * own; all are exact once the engine is quiet.
 * @dispatched:   background delegations accepted.
 * @runs:         synchronous delegations (fanout_run, inline delegate).
 * @completed:    events published (background) or returned (sync).
 * @rejected:     calls refused (-EBUSY, -ELOOP, -E2BIG, -EINVAL, ...).
 * @cancelled:    delegations cancelled.
 * @children_run: children run, by workers and by helping callers.
 * @children_skipped: children never started because of a cancel.
 * @parks, @wakeups: sums over workers.
 * @running:      delegations not yet finished, now.
 * @async_running: background ones among them (compare with max_async).
 * @nworkers:     worker threads.
 * @worker:       the first FANOUT_STATS_MAX_WORKERS (64) workers only, kept
 *                for compatibility; entries from @nworkers on are zero.
 *                fanout_worker_stats() reads any worker, however many.
 */
struct fanout_stats {
	uint64_t dispatched;
	uint64_t runs;
	uint64_t completed;
	uint64_t rejected;
	uint64_t cancelled;
	uint64_t children_run;
	uint64_t children_skipped;
	uint64_t parks;
	uint64_t wakeups;
	unsigned running;
	unsigned async_running;
	unsigned nworkers;
	struct fanout_worker_stats worker[FANOUT_STATS_MAX_WORKERS];
};

/* ---------------------------------------------------------------- engine */

/**
 * fanout_create() - start an engine and its worker threads.
 * @cfg: configuration, or NULL for all defaults.
 * @out: receives the engine.
 *
 * Return: 0; -EINVAL for NULL @out, unknown flags or an out-of-range field
 * (nothing is created); -ENOMEM; -EAGAIN when a worker thread cannot be
 * created (all threads already started are stopped again); -EMFILE or
 * -ENFILE when the default sink's eventfd cannot be created.  On error
 * nothing is left behind.  The first call in a process registers the fork
 * handlers (see "Fork" above); if that fails (-ENOMEM), every later call
 * fails too, rather than create engines a forked child would hang on.
 */
FANOUT_API int fanout_create(const struct fanout_config *cfg,
			     struct fanout_engine **out);

/**
 * fanout_shutdown() - stop accepting work, interrupt it, wait for the events.
 * @e: the engine.
 *
 * New dispatch/run/delegate calls fail with -ESHUTDOWN from now on.  Every
 * running delegation is cancelled as by FANOUT_CANCEL_INTERRUPT; the call
 * returns when every accepted delegation has published its event (events
 * stay in their sinks, to be polled) and the workers have exited.
 * Idempotent.
 *
 * Context: blocks until running children return.  Not from a child @e
 * waits for: a child of @e, or a child nested in one through fanout_run()
 * or an inline fanout_delegate() (any depth, any engines in between, on
 * this thread or another: e.g. the application calls fanout_run(B), B's
 * child calls fanout_run(A), and A's child - on this thread or on one of
 * A's workers - calls fanout_shutdown(B)).  Such calls are detected by
 * walking up the calling child's chain of synchronous delegations (no
 * lock; one step per level).  A background delegation ends the chain: its
 * dispatcher does not wait for it, so from its children shutting down the
 * dispatcher's engine is allowed and returns 0 - it hangs only if the
 * dispatching child itself waits for that delegation's event on a sink,
 * which the library cannot detect.
 * Return: 0; -EINVAL for NULL; -EDEADLK when @e waits for the calling
 * child, as above (nothing changes; @e keeps accepting work);
 * -EOWNERDEAD in a forked child for an engine created before the fork
 * (nothing is stopped: the parent's engine is not the child's to stop).
 */
FANOUT_API int fanout_shutdown(struct fanout_engine *e);

/**
 * fanout_destroy() - fanout_shutdown(), then free everything.
 * @e: the engine, or NULL (no-op).
 *
 * Frees all records, all sinks (default and created ones), every event
 * still waiting in them and the blocks kept for reuse.  Events already
 * taken by a consumer must have been freed with fanout_event_free()
 * before; pointers into @e are invalid after.
 * Called from a child @e waits for (the -EDEADLK cases of
 * fanout_shutdown()) it does nothing: it would wait for itself.
 * In a forked child, for an engine created before the fork: frees the
 * child's copy without stopping or joining anything (see "Fork" above).
 */
FANOUT_API void fanout_destroy(struct fanout_engine *e);

/**
 * fanout_dispatch() - start a background delegation.
 * @e:     engine.
 * @batch: the children; see struct fanout_batch.
 * @id:    receives the delegation's id (may be NULL).
 *
 * Returns at once.  Exactly one event is later published to batch->sink.
 * Costs one allocation and one to min(ntasks, max_children, workers) ring
 * operations, independent of ntasks beyond that.
 *
 * The delegation holds a place on its sink until its event is taken by
 * fanout_poll()/fanout_wait() (see fanout_config.max_pending).
 *
 * Return: 0; -EINVAL (NULL @e or @batch, NULL tasks, ntasks 0, a task
 * without fn, a sink of another engine, an unknown bit in batch->flags;
 * a sink being destroyed is not detected: fanout_sink_destroy() must not
 * race calls on that sink); -E2BIG (ntasks > max_tasks); -EBUSY (max_async
 * background delegations running, the sink holding max_pending events
 * nobody has taken yet, or the work ring full; fanout_describe_error()
 * says which); -ELOOP (children would be deeper than max_depth); -ENOMEM;
 * -ESHUTDOWN; -ECANCELED (batch->within names a deferred child the
 * library already finished: its tree was interrupted); -EINVAL also for a
 * bad join, quorum or deadline_ns; -EAGAIN (the engine's timer thread
 * could not be started for the first deadline); -EOWNERDEAD (@e was
 * created before a fork(), in the parent; not counted in stats.rejected).
 * On error nothing happened and no event will come.
 * Memory ordering: full barrier on success; none on failure.
 */
FANOUT_API int fanout_dispatch(struct fanout_engine *e,
			       const struct fanout_batch *batch, fanout_id *id);

/**
 * fanout_run() - run a delegation synchronously and return its event.
 * @e:     engine.
 * @batch: the children; batch->sink is ignored.
 * @ev:    receives the event; free it with fanout_event_free().
 *
 * The caller claims and runs children of THIS batch itself while idle
 * workers help; it never runs unrelated work, so a nested fanout_run()
 * inside a child cannot deadlock, even with one worker.  max_async does not
 * apply (the caller's thread is the capacity).
 *
 * Work-first: the caller starts on its own children at once.  Workers that
 * are spinning (idle for less than spin_ns) join the batch once it has run
 * for 2 us, so a batch the caller finishes sooner is run by the caller
 * alone and moves no data between cores; parked workers are woken at the
 * start, so long children run in parallel after an idle spell too.  Which
 * thread runs which child is therefore not fixed; the results are.
 *
 * Context: blocks until every child has finished.
 * Return: 0 (the children's outcomes are in the event, not here); -EINVAL
 * (as fanout_dispatch, batch->sink aside); -E2BIG; -ELOOP when called from a child at depth max_depth; -ENOMEM;
 * -ESHUTDOWN; -ECANCELED and -EAGAIN (as fanout_dispatch); -EOWNERDEAD
 * (@e crossed a fork(); nothing ran).
 */
FANOUT_API int fanout_run(struct fanout_engine *e,
			  const struct fanout_batch *batch,
			  struct fanout_event **ev);

/* fanout_delegate() outcomes (positive; errors are negative). */
#define FANOUT_BACKGROUND 1  /* dispatched; *id set, event comes later */
#define FANOUT_INLINE 2	     /* ran synchronously inside a child; *ev set */
#define FANOUT_INLINE_FULL 3 /* async pool full, ran synchronously; *ev set */

/**
 * fanout_delegate() - the orchestrator policy in one call.
 * @e, @batch: as for fanout_dispatch().
 * @id:    receives the id (always, for all three outcomes; may be NULL).
 * @ev:    receives the event for the two inline outcomes; must not be NULL.
 *
 * At top level: background (fanout_dispatch).  Inside a child (depth > 0):
 * synchronous (fanout_run), so the parent child gets its result before it
 * returns.  At top level when fanout_dispatch() says -EBUSY (the async
 * pool full, the sink at max_pending, or the ring full): synchronous, and
 * says so with FANOUT_INLINE_FULL - never a silent downgrade.
 *
 * Return: FANOUT_BACKGROUND, FANOUT_INLINE or FANOUT_INLINE_FULL; or the
 * negative errno of fanout_dispatch()/fanout_run() (-EOWNERDEAD in a
 * forked child for an inherited engine: never run inline instead).
 */
FANOUT_API int fanout_delegate(struct fanout_engine *e,
			       const struct fanout_batch *batch, fanout_id *id,
			       struct fanout_event **ev);

/* fanout_cancel() modes. */
#define FANOUT_CANCEL_PENDING 0x1u   /* unstarted children are not run */
#define FANOUT_CANCEL_INTERRUPT 0x2u /* + running ones see interrupted() */
/* + deferred children not completed yet are finished at once as
 * interrupted (their fanout_complete() then returns -EALREADY); only
 * together with FANOUT_CANCEL_INTERRUPT. */
#define FANOUT_CANCEL_ABANDON 0x4u

/**
 * fanout_cancel() - stop a running delegation.
 * @e:   engine.
 * @id:  the delegation.
 * @how: FANOUT_CANCEL_PENDING, or FANOUT_CANCEL_INTERRUPT (which implies
 *       PENDING), optionally | FANOUT_CANCEL_ABANDON.
 *
 * Children not yet started are reported INTERRUPTED without being run.
 * With FANOUT_CANCEL_INTERRUPT, fanout_interrupted() turns true for the
 * running ones, fanout_pending_interrupted() for the deferred ones, and
 * their fanout_pending_on_cancel() callbacks run (on this thread); what
 * they report is up to them.  With FANOUT_CANCEL_ABANDON as well, deferred
 * children are finished at once as INTERRUPTED (code -ECANCELED) instead
 * of waiting for fanout_complete().  The event is still published exactly
 * once, as soon as the running synchronous children return (and, without
 * ABANDON, the deferred ones are completed).  Cancelling again (e.g.
 * PENDING then INTERRUPT) is allowed.
 *
 * With FANOUT_CANCEL_INTERRUPT the cancel also reaches every delegation
 * started from inside this one's children (fanout_dispatch/run/delegate
 * called from a running child, or with fanout_batch.within naming one of
 * its deferred children), transitively and on any engine: each of them is
 * cancelled with the same @how.  It goes on through a delegation of the
 * tree that finished already, to the delegations its children started,
 * for as long as the finished one is kept for lookup (keep_completed).
 * Deadlines, join policies and shutdown interrupt the same tree.
 *
 * Context: never blocks; runs on_cancel callbacks, and may publish the
 * event, on the calling thread.
 * Return: 0; -EINVAL (NULL @e, id 0, bad @how, ABANDON without
 * INTERRUPT); -ENOENT (unknown or pruned id); -EALREADY (already finished;
 * nothing changes); -EOWNERDEAD (@e crossed a fork(): its delegations run
 * in the parent).
 */
FANOUT_API int fanout_cancel(struct fanout_engine *e, fanout_id id,
			     unsigned how);

/**
 * fanout_cancel_session() - cancel every running delegation of a session.
 * @e:           engine.
 * @session_key: the fanout_batch.session_key to match (strcmp).
 * @how:         as for fanout_cancel().
 * @n:           receives how many delegations this call cancelled (may be
 *               NULL): those still running to which it added a
 *               FANOUT_CANCEL_* bit they did not have.
 *
 * A delegation already cancelled with the same @how (by an earlier call, a
 * deadline, shutdown, ...) is not counted again; one cancelled with
 * FANOUT_CANCEL_PENDING and now with FANOUT_CANCEL_INTERRUPT is.
 * Delegations of that session that finish meanwhile are not counted; ones
 * dispatched after the call started may or may not be cancelled.
 * Context: never blocks (RCU read side); cost proportional to the records
 * in the table.
 * Return: 0 (also when none matched: *n = 0); -EINVAL (NULL @e or
 * @session_key, bad @how); -EOWNERDEAD (@e crossed a fork()).
 */
FANOUT_API int fanout_cancel_session(struct fanout_engine *e,
				     const char *session_key, unsigned how,
				     size_t *n);

/**
 * fanout_lookup() - snapshot one record.
 * @e, @id: engine and delegation.
 * @info:   receives the snapshot.
 *
 * A finished record stays visible while its event is not freed, and
 * after that until at least keep_completed newer delegations have
 * finished (it is pruned when one of those has its event freed too).
 * Context: RCU read side; never blocks.
 * Return: 0; -EINVAL (NULL argument, id 0); -ENOENT (@info untouched);
 * -EOWNERDEAD (@e crossed a fork(): the child's copy of a record would
 * never change).
 */
FANOUT_API int fanout_lookup(struct fanout_engine *e, fanout_id id,
			     struct fanout_info *info);

/**
 * fanout_list() - snapshot running and recently finished delegations.
 * @e:     engine.
 * @infos: array of @cap entries (may be NULL when @cap is 0).
 * @cap:   its capacity.
 * @n:     receives the number of records seen, which may exceed @cap
 *         (only the first @cap are written; call again with a bigger array).
 *
 * Entries are sorted by dispatch time, newest first.  Context: RCU read
 * side; never blocks.
 * Return: 0; -EINVAL (NULL @e or @n, or NULL @infos with @cap > 0);
 * -EOWNERDEAD (@e crossed a fork()).
 */
FANOUT_API int fanout_list(struct fanout_engine *e, struct fanout_info *infos,
			   size_t cap, size_t *n);

/**
 * fanout_stats() - read the counters.  Never blocks.
 * Return: 0; -EINVAL for NULL; -EOWNERDEAD (@e crossed a fork()).
 */
FANOUT_API int fanout_stats(struct fanout_engine *e, struct fanout_stats *st);

/**
 * fanout_worker_stats() - the counters of one worker thread.
 * @e:   engine.
 * @i:   worker index, 0 <= i < fanout_stats().nworkers (= the configured
 *       workers); worker i is the thread named "fanout-w<i>".
 * @out: receives its counters.
 *
 * Unlike fanout_stats().worker[], which holds the first 64 workers only,
 * this reaches every worker.  Each counter is read on its own, as in
 * fanout_stats().  Context: never blocks.
 * Return: 0; -EINVAL (NULL @e or @out); -ERANGE (@i >= the number of
 * workers; *out untouched); -EOWNERDEAD (@e crossed a fork()).
 */
FANOUT_API int fanout_worker_stats(struct fanout_engine *e, unsigned i,
				   struct fanout_worker_stats *out);

/* ---------------------------------------------------------- inside a child */

/**
 * fanout_interrupted() - has the delegation been cancelled with
 * FANOUT_CANCEL_INTERRUPT (or the engine shut down)?  Poll it in long
 * children and return -ECANCELED.  Cost: one load.  NULL -> false.
 */
FANOUT_API bool fanout_interrupted(const struct fanout_child *c);

/**
 * fanout_set_summary() - set the child's summary (copied; replaces any
 * earlier one).
 * @c:   the running child.
 * @s:   text, need not be NUL-terminated.
 * @len: its length in bytes (at most 16 MiB).
 * Return: 0; -EINVAL (NULL, or too long); -ENOMEM (summary unchanged).
 */
FANOUT_API int fanout_set_summary(struct fanout_child *c, const char *s,
				  size_t len);

/**
 * fanout_set_error() - set the message reported if the child fails
 * (copied, NUL-terminated, at most 16 MiB; replaces any earlier one).
 * Return: 0; -EINVAL; -ENOMEM (message unchanged).
 */
FANOUT_API int fanout_set_error(struct fanout_child *c, const char *msg);

/**
 * fanout_add_cost() - add @x to the child's cost; summed into the event.
 * Return: 0; -EINVAL (cost unchanged) for NULL @c, a NaN/negative/infinite
 * @x, or a sum that would not be finite (past DBL_MAX).
 */
FANOUT_API int fanout_add_cost(struct fanout_child *c, double x);

/** fanout_child_index() - the child's task index (0 for NULL). */
FANOUT_API unsigned fanout_child_index(const struct fanout_child *c);

/** fanout_child_depth() - 1 for children of a top-level delegation. */
FANOUT_API unsigned fanout_child_depth(const struct fanout_child *c);

/** fanout_child_id() - the id of the delegation the child belongs to. */
FANOUT_API fanout_id fanout_child_id(const struct fanout_child *c);

/**
 * fanout_current_child() - the child running on this thread, or NULL.
 * Lets code deep inside a child find its context (and its depth).
 */
FANOUT_API struct fanout_child *fanout_current_child(void);

/* ------------------------------------------------- children that finish later */

/*
 * A child may start an operation and finish later, from any thread, without
 * holding a worker: it calls fanout_defer() and returns -EINPROGRESS; later
 * some thread calls fanout_complete() exactly once with the outcome.  The
 * join, the event and exactly-once work as for any child.  A deferred child
 * counts against max_children until it completes: while max_children
 * children of the delegation are pending, its workers start no new child
 * of it (they move on to other work and come back when one completes).
 * The one exception: children that had already started when the first
 * child of the delegation deferred (at most one per worker) may defer
 * beyond the limit.
 *
 * Exactly one of these finishes a pending child, whichever comes first:
 * its fanout_complete(); fanout_cancel() with FANOUT_CANCEL_ABANDON; the
 * delegation's deadline; its join policy; fanout_shutdown().  The others
 * find it finished: fanout_complete() then returns -EALREADY and changes
 * nothing.
 *
 * Lifetime: the struct fanout_pending stays valid until fanout_complete()
 * is called on it - even after the event was published, the record pruned
 * and the engine destroyed - and is released by that call, whatever it
 * returns.  Every successful fanout_defer() needs exactly one
 * fanout_complete(), also when the child was abandoned.
 */

/**
 * struct fanout_outcome - how a deferred child ended.
 * @code:        as a child's return value: 0 completed, -ECANCELED
 *               interrupted, another negative errno (or a positive value)
 *               error.  -EINPROGRESS is not an outcome (-EINVAL).
 * @summary:     text (need not be NUL-terminated), copied; NULL = none.
 * @summary_len: its length in bytes, at most 16 MiB.
 * @error:       NUL-terminated message for a failure, copied; NULL = a
 *               description of @code.  Ignored when @code is 0.
 * @cost:        the child's cost (finite, >= 0).
 * The outcome replaces the summary, error and cost the child set before
 * it deferred; what fanout_pending_add_cost() added is added to @cost
 * (a sum that overflows is DBL_MAX).
 */
struct fanout_outcome {
	int code;
	const char *summary;
	size_t summary_len;
	const char *error;
	double cost;
};

/**
 * fanout_defer() - the running child will finish later.
 * @c: the running child (inside its fanout_fn).
 *
 * After a successful call the child's fn should return -EINPROGRESS at
 * once (whatever it returns is ignored: the outcome comes from
 * fanout_complete()), and its worker moves on.  The child must not call
 * fanout_set_summary()/set_error()/add_cost() on @c after deferring (they
 * return -EINVAL): pass the outcome to fanout_complete() instead.
 * fanout_complete() may be called before fn has returned, from any thread.
 * A delegation that fn starts after the pending child was finished (by
 * fanout_complete() or by the library) is interrupted at once (INTERRUPT |
 * ABANDON, event->cancelled): its parent may have finished, and a cancel
 * of the tree passed it, already.
 * The child's duration runs until it is finished (0 with
 * FANOUT_NO_CHILD_CLOCK).
 *
 * Context: inside a child only (the thread running @c); allocates.
 * Return: the pending child; NULL with errno set on failure - EINVAL (NULL
 * @c, or @c already deferred), ENOMEM - and the child is then an ordinary
 * one, still running.
 */
FANOUT_API struct fanout_pending *fanout_defer(struct fanout_child *c);

/**
 * fanout_complete() - finish a deferred child.
 * @p: from fanout_defer(); released by this call in every case but
 *     -EINVAL.
 * @o: the outcome (copied); NULL = completed with nothing to say.
 *
 * Exactly once per pending child.  If this call finishes the last child,
 * it finalises the delegation and publishes its event on the calling
 * thread.  May be called from any thread, including from inside the
 * child's fn before it returned, and from inside an on_cancel callback.
 *
 * Context: never blocks.
 * Memory ordering: release: what the calling thread wrote before is
 * visible to the event's receiver.
 * Return: 0; -EALREADY when the library already finished the child
 * (deadline, cancel with FANOUT_CANCEL_ABANDON, join policy, shutdown):
 * nothing changes and @p is released all the same; -EINVAL (NULL @p, a bad
 * @o: -EINPROGRESS, NaN/negative/infinite cost, summary over 16 MiB or
 * NULL with a non-zero length, an error over 16 MiB with a non-zero @code
 * (with @code 0 it is not read); @p is NOT released then and the call can
 * be repeated with a good outcome); -ENOMEM (copying the strings failed: the
 * child is finished anyway, as ERROR with code -ENOMEM; @p is released).
 */
FANOUT_API int fanout_complete(struct fanout_pending *p,
			       const struct fanout_outcome *o);

/**
 * fanout_pending_on_cancel() - be told when the delegation is interrupted.
 * @p:   a pending child.
 * @fn:  called at most once with (@p, @arg), on whichever thread
 *       interrupts the delegation (fanout_cancel with INTERRUPT, the
 *       deadline, the join policy, fanout_shutdown, the cancel tree).  It
 *       must not block; it may call fanout_complete(@p, ...).  It is never
 *       called for a child already finished.
 * @arg: passed to @fn.
 *
 * If the interrupt came first, @fn runs at once, on the caller, before
 * this returns.  @fn may run while another thread calls
 * fanout_complete(@p): @p's memory stays valid until @fn returns, but the
 * one fanout_complete() per child still holds - @fn may call it only if
 * no other thread will, and must not use @p after any thread called it.
 * Return: 0; -EINVAL (NULL @p or @fn); -EBUSY (a callback is already
 * registered: one per pending child); -EALREADY (the child is already
 * finished; @fn will not run).
 */
FANOUT_API int fanout_pending_on_cancel(struct fanout_pending *p,
					void (*fn)(struct fanout_pending *p,
						   void *arg),
					void *arg);

/**
 * fanout_pending_interrupted() - has the child's delegation been
 * interrupted (cancel with INTERRUPT, deadline, policy, shutdown, tree)?
 * Cost: two loads inside an RCU read-side section (a fence on entry).
 * NULL -> false.  Valid until fanout_complete(@p).
 */
FANOUT_API bool fanout_pending_interrupted(const struct fanout_pending *p);

/**
 * fanout_pending_add_cost() - add to a pending child's cost.
 * @p: a pending child, not yet passed to fanout_complete().
 * @x: finite, >= 0.
 *
 * For work a pending child pays for while it runs (tokens of a call in
 * flight): what this adds goes into the child's cost when it is finished
 * - on top of the outcome's @cost by fanout_complete(), on top of what the
 * child set before deferring when the library finishes it (deadline,
 * cancel with FANOUT_CANCEL_ABANDON, join policy, shutdown).  An addition
 * racing that finish is either in the event or refused with -EALREADY,
 * never lost.  The one caller that must not race it is fanout_complete()
 * on the same @p, which releases @p.
 *
 * Context: any thread; never blocks.
 * Memory ordering: none (the cost is published with the event).
 * Return: 0; -EINVAL (NULL @p, @x NaN, infinite or negative, or a sum
 * that would not be finite: nothing changes); -EALREADY (the child is
 * finished - the library finished it - so its cost is final: nothing
 * changes).
 */
FANOUT_API int fanout_pending_add_cost(struct fanout_pending *p, double x);

/**
 * fanout_set_skip_hook() - be told when a task of @fn will never run.
 * @fn:   a task function (fanout_task.fn).
 * @hook: called with the task's arg for every child whose fn is @fn that
 *        the library reports never started (its delegation interrupted
 *        before it started: a cancel, its deadline, its join policy,
 *        fanout_shutdown(), the cancel tree); NULL removes @fn's hook.
 *
 * For a library whose tasks own their arg (e.g. fanout_nats_task()): a
 * child that runs frees it, and one that never runs is handed to @hook,
 * so it can be freed as soon as the library knows it will not run, not
 * held until the library that made it is closed.  Process-wide, for
 * every engine; registering @fn again replaces its hook.  @hook runs
 * once per such child, on whichever thread skips it (the canceller, the
 * deadline's timer thread, a worker, fanout_shutdown()), before the
 * delegation's event is published; it must not block and must not call
 * into the engine.  Costs nothing on the path of a child that runs.
 * A hook cannot be unregistered by a library being unloaded while
 * delegations may still skip its tasks.
 * Return: 0; -EINVAL (NULL @fn); -ENOSPC (FANOUT_MAX_SKIP_HOOKS functions
 * already have a hook; nothing changes).
 */
#define FANOUT_MAX_SKIP_HOOKS 8
FANOUT_API int fanout_set_skip_hook(fanout_fn fn, void (*hook)(void *arg));

/** fanout_pending_index() - the child's task index (0 for NULL). */
FANOUT_API unsigned fanout_pending_index(const struct fanout_pending *p);

/** fanout_pending_id() - the child's delegation (0 for NULL). */
FANOUT_API fanout_id fanout_pending_id(const struct fanout_pending *p);

/* ------------------------------------------------------------------ sinks */

/**
 * fanout_sink_create() - a new event queue with its own eventfd.
 * Return: 0; -EINVAL (NULL); -ENOMEM; -EMFILE/-ENFILE (no eventfd);
 * -ESHUTDOWN; -EOWNERDEAD (@e crossed a fork()).
 */
FANOUT_API int fanout_sink_create(struct fanout_engine *e,
				  struct fanout_sink **out);

/**
 * fanout_sink_destroy() - free a sink and any events still queued in it.
 *
 * The sink is gone for the caller at once; its memory and its eventfd
 * are released after an RCU grace period (a publisher may still be
 * finishing), so the fd number stays taken for a moment.  Do not close
 * the fd yourself.
 * Events queued and not taken yet are allowed: they are freed here, as
 * fanout_event_free() would (their records are then pruned like any
 * other's, see fanout_lookup()).  Cost: a walk over the queued events (to
 * tell queued from still to publish) and the frees.
 * Return: 0; -EINVAL (NULL, or the engine's default sink, which
 * fanout_destroy() frees); -EBUSY when accepted delegations will still
 * publish to it (wait for or cancel them first; nothing is freed);
 * -EOWNERDEAD for a sink created before a fork() (fanout_destroy() of its
 * engine frees it).
 */
FANOUT_API int fanout_sink_destroy(struct fanout_sink *s);

/** fanout_default_sink() - the engine's own sink (NULL for NULL @e). */
FANOUT_API struct fanout_sink *fanout_default_sink(struct fanout_engine *e);

/**
 * fanout_poll() - take the oldest waiting event without blocking.
 * @s:  the sink.
 * @ev: receives the event; free it with fanout_event_free().
 *
 * Taking an event gives its delegation's place on the sink back
 * (fanout_config.max_pending).
 * Memory ordering: acquire; pairs with the release that published it.
 * Return: 0; -EAGAIN when empty; -EINVAL (NULL); -EBUSY when another thread
 * is inside fanout_poll/fanout_wait on this sink; -EOWNERDEAD for a sink
 * created before a fork(), even if events wait in it (they are the
 * parent's; taking them in the child would deliver them twice).
 */
FANOUT_API int fanout_poll(struct fanout_sink *s, struct fanout_event **ev);

/**
 * fanout_wait() - take the oldest event, sleeping up to @timeout_ms for one.
 * @timeout_ms: < 0 waits forever; 0 is fanout_poll().
 *
 * Spins up to the engine's spin_ns, then sleeps on a futex.
 *
 * With FANOUT_WAIT_HELPS (fanout_config.flags), a caller that is not a
 * worker and not inside a child runs queued children of ANY delegation of
 * the engine while its sink is empty, the way a oneTBB or OpenMP wait
 * helps: no hand-off to another thread, and the CPU a waiter would spin on
 * does the work.  It runs a delegation's children a chunk at a time (the
 * first at most 256 children, about 1/8 of a runner's share; chunks of
 * quick children then grow as a worker's do) and looks at its own sink and
 * the timeout between chunks: while the sink is empty it goes on with the
 * same delegation, and once an event is there (or the timeout passed) it
 * puts the rest back for the workers and takes the event.  Two cases
 * take longer: when the ring has no room to put the rest back (every
 * credit taken by concurrent dispatches), it runs the rest of that
 * delegation itself; and a delegation whose children defer is run until
 * its children are started or wait for a max_children place.  Use it when
 * the waiting thread has nothing better to do and holds no lock a child
 * might take.  The timeout is checked between chunks, so a wait may overrun
 * it by the time one chunk takes; while it runs a child, the sink stays
 * busy (a second consumer still gets -EBUSY); and fanout_lookup() counts
 * the children a waiter helped with in @ndone only once it leaves their
 * delegation.
 *
 * Inside a child it never helps: a child that waits with @timeout_ms < 0
 * for an event of a delegation that has not finished needs another thread
 * to run it - on a one-worker engine, a top-level helping wait - or it
 * waits forever (see "Children waiting for events" at the top).
 * Return: 0; -ETIMEDOUT; -EINVAL; -EBUSY, -EOWNERDEAD (as fanout_poll,
 * at once, whatever @timeout_ms).
 */
FANOUT_API int fanout_wait(struct fanout_sink *s, struct fanout_event **ev,
			   int timeout_ms);

/**
 * fanout_sink_fd() - an eventfd, written only when the sink goes from empty
 * to non-empty: on EVERY wakeup, call fanout_poll() until it returns -EAGAIN.
 *
 * "Empty" is what the consumer last saw: a fanout_poll() (or a fanout_wait()
 * that timed out) that found no event clears the fd; the next event
 * published writes it once, and later events do not write it again until a
 * poll has found the sink empty again.  So with EPOLLET, a loop that stops
 * polling before -EAGAIN gets no new edge and may wait forever on events
 * already queued (level-triggered poll/epoll just reports it readable
 * again).  The fd may be readable while the sink is empty (after the last
 * event was taken: the next poll returns -EAGAIN and clears it), but it is
 * never unreadable while an event waits and no poll is in progress.  The
 * fd is kept up from the first fanout_sink_fd() call on (readable at once
 * if events already wait).  Do not read() it yourself.  Owned by the sink.
 * See examples/epoll_server.c.
 * Return: the fd; -EINVAL for NULL; -EOWNERDEAD for a sink created before
 * a fork() (the eventfd is shared with the parent: reading it in the
 * child would take the parent's wakeups).
 */
FANOUT_API int fanout_sink_fd(struct fanout_sink *s);

/**
 * fanout_event_free() - release an event received from poll/wait/run/
 * delegate.  NULL is a no-op.  Each event is freed exactly once.
 */
FANOUT_API void fanout_event_free(struct fanout_event *ev);

/* ------------------------------------------------------------- formatting */

/**
 * fanout_format() - the consolidated text block of an event.
 *
 * A header line with the id and overall status, optional context and
 * session lines, then per child "TASK i/n: goal (status=..., 12.3ms)"
 * followed by its summary or error, indented.  i counts from 1.  Every
 * line after the first of any string (an error, the context, the session
 * key, a goal) is indented too, so none passes for a line of its own.
 *
 * The text is valid UTF-8 whatever bytes the children and the batch set
 * (each string is read up to its first NUL): well-formed characters pass
 * through, and each maximal ill-formed subsequence (a stray continuation
 * byte, a byte that starts no sequence, an overlong form, a surrogate
 * U+D800..U+DFFF, a code point above U+10FFFF, a sequence cut short)
 * becomes U+FFFD.  Control characters other than \n and \t become U+FFFD
 * too - C0, DEL and C1 (U+0080..U+009F) - except the \r of a \r\n, which
 * is dropped; so the text never carries a terminal escape sequence.
 *
 * Return: as snprintf: the length the whole text needs (excluding the NUL);
 * @buf gets as much as fits, always NUL-terminated when @len > 0 (a
 * truncated text may end inside a multi-byte character).
 * -EINVAL for NULL @ev, or NULL @buf with @len > 0.
 * -EOVERFLOW if the text would be longer than INT_MAX bytes; @buf then
 * holds an empty string (when @len > 0).
 */
FANOUT_API int fanout_format(const struct fanout_event *ev, char *buf,
			     size_t len);

/**
 * fanout_event_json() - the same event as one JSON object (RFC 8259, no
 * trailing newline).
 *
 * Always valid UTF-8 and valid JSON, whatever bytes the children and the
 * batch set (goal, summary, error, context, session_key; each read up to
 * its first NUL): ill-formed UTF-8 becomes U+FFFD as in fanout_format();
 * '"', '\\' and every control character U+0000..U+001F are escaped
 * (\b \f \n \r \t, else \u00XX; DEL too, as \u007f).  Every well-formed
 * character is kept, so for valid UTF-8 input a JSON parser gives back the
 * exact bytes.
 *
 * Return: as fanout_format(), -EOVERFLOW included.
 */
FANOUT_API int fanout_event_json(const struct fanout_event *ev, char *buf,
				 size_t len);

/**
 * fanout_strerror() - what an error from this library means and what to
 * do about it.  Accepts negative (or positive) errno values; never NULL;
 * static storage.
 */
FANOUT_API const char *fanout_strerror(int err);

/**
 * fanout_describe_error() - fanout_strerror() with the engine's figures,
 * e.g. for -EBUSY how many delegations run and which limit to raise, and
 * which sinks (the default one, how many created ones) are at max_pending
 * because nobody drains them - the figures as they are now.
 * Return: as snprintf; -EINVAL for NULL @e, or NULL @buf with @len > 0.
 */
FANOUT_API int fanout_describe_error(struct fanout_engine *e, int err,
				     char *buf, size_t len);

/** fanout_now_ns() - CLOCK_MONOTONIC in ns, the clock of all timestamps
 * (a direct reading; the events' times are extrapolated from such readings
 * and never fall below one this thread made, see struct fanout_event). */
FANOUT_API uint64_t fanout_now_ns(void);

#ifdef __cplusplus
}
#endif
#endif /* FANOUT_H */
