/* SPDX-License-Identifier: MIT */
/*
 * fanout_nats.h - remote children over NATS JetStream (libfanout-nats).
 *
 * A remote child is a deferred child (see fanout.h, "children that finish
 * later") whose work runs in another process, usually on another machine.
 * The join and the one event stay in the dispatching process; NATS
 * JetStream carries the children and their outcomes durably.
 *
 * WIRE
 *
 *   fanout.work.<kind>      stream FANOUT_<KIND> (work queue, file storage);
 *                           one message per child, Nats-Msg-Id the
 *                           child's key (below) so a republished child is
 *                           stored once.  Consumed by the durable pull
 *                           consumer "fanout-worker-<kind>" that every
 *                           worker of the kind shares (explicit ack,
 *                           AckWait, MaxDeliver).
 *   fanout.result.<disp>    stream FANOUT_RESULTS (work queue); one
 *                           message per outcome, Nats-Msg-Id "r.<key>",
 *                           consumed by the dispatcher's durable pull
 *                           consumer, so outcomes published while it is
 *                           disconnected are delivered when it is back.
 *                           An outcome whose key is not one of this
 *                           handle's (e.g. an earlier run's with the same
 *                           id) finishes nothing.
 *   fanout.cancel.<kind>    core NATS; body "<key>": the
 *                           dispatcher's cancel notice for one child.  A
 *                           worker running it interrupts it (the handler
 *                           sees fanout_interrupted()); a worker that
 *                           pulls it later, or holds it (busy), reports
 *                           it -ECANCELED unrun, also when it stops.
 *                           Best effort: a worker that was not subscribed
 *                           when the notice went out runs the child.
 *   $JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.>
 *                           captured by stream FANOUT_ADVISORIES and read
 *                           by the dispatcher's durable consumer: a child
 *                           that exhausted MaxDeliver is finished as
 *                           FANOUT_ERROR, code -EHOSTDOWN, error "remote
 *                           child exhausted MaxDeliver=N deliveries".
 *
 * A kind is 1..48 characters of [a-z0-9_-].
 *
 * A child's key is "<disp>.<nonce>.<seq>": <disp> the dispatcher id,
 * <nonce> 16 lowercase hex digits drawn at random by each
 * fanout_nats_open(), <seq> a decimal counter from 1 that starts again in
 * every process.  The key travels in the Fanout-Key header of the work
 * and result messages.  The nonce makes keys unique across runs: a
 * dispatcher restarted with the same id within JetStream's duplicate
 * window (2 minutes by default) would otherwise reuse the last run's
 * Nats-Msg-Ids, and its children would be dropped as duplicates or
 * matched to the last run's messages and outcomes.  At most 70
 * characters.
 *
 * EXACTLY ONCE.  A child may RUN more than once (a worker killed after it
 * started, a result published but not acked); its OUTCOME is counted once:
 * the first outcome for a child finishes it, later ones are dropped
 * (counted in fanout_nats_stats.duplicates).  Handlers with side effects
 * should be idempotent, keyed by fanout_nats_job.key.
 *
 * THREADS.  Every call is thread-safe except fanout_nats_close(), which
 * must not race any other call on the same handle.  The dispatcher runs
 * one thread of its own (results, advisories, publish retries); libnats
 * runs its own.  Unlike lib/, this library takes a mutex (one per
 * process, around the table of children in flight): every operation it
 * guards also does network I/O costing far more.
 */
#ifndef FANOUT_NATS_H
#define FANOUT_NATS_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include <fanout.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FANOUT_NATS_MAX_KIND 48

struct fanout_nats;

/**
 * struct fanout_nats_opts - dispatcher options; zero = default.
 * @kinds:          the child kinds this dispatcher may send (@nkinds of
 *                  them); fanout_nats_task() refuses any other (-ENOENT).
 *                  Their streams are created if missing.
 * @nkinds:         number of @kinds (at least 1, at most 64).
 * @id:             dispatcher id, 1..32 characters of [A-Za-z0-9_-];
 *                  NULL = random.  Names the result subject and the
 *                  durable consumers; two live dispatchers must not share
 *                  it.  A restart may reuse it at once: children's keys
 *                  carry a nonce of their own (WIRE above).
 * @connect_timeout_ms: first connection (default 2000).
 * @publish_window: children published and not yet acknowledged by
 *                  JetStream (default 4096): a child's fn blocks at most
 *                  200 ms while the window is full, then the child is
 *                  retried by the dispatcher's thread.
 * @publish_retry_ms: how long a child whose publish keeps failing (server
 *                  down, the kind's stream gone) is retried before it is
 *                  finished as FANOUT_ERROR (default 60000): sent again
 *                  100 ms after the first failure, the wait doubled after
 *                  each, at most 2 s; so it ends up to 2 s later.
 */
struct fanout_nats_opts {
	const char *const *kinds;
	unsigned nkinds;
	const char *id;
	int connect_timeout_ms;
	unsigned publish_window;
	int publish_retry_ms;
};

/**
 * fanout_nats_open() - connect a dispatcher to a NATS server.
 * @url:  e.g. "nats://127.0.0.1:4222" (NULL = that one).
 * @o:    options; @o->kinds is required.
 * @out:  receives the handle.
 *
 * Connects, creates the streams of @o->kinds, FANOUT_RESULTS and
 * FANOUT_ADVISORIES if missing, creates this dispatcher's durable result
 * and advisory consumers and starts its thread.  Once open, a lost
 * connection is re-established for ever (every 100 ms), and in-flight
 * children resume.
 *
 * Context: blocks up to @o->connect_timeout_ms plus a few JetStream
 * requests.
 * Return: 0; -EINVAL (NULL @o or @out, no kinds, a bad kind or id, a
 * negative @o->connect_timeout_ms or @o->publish_retry_ms, a @url that
 * is empty, blank or cannot be parsed, e.g. a port that is not a number);
 * -ECONNREFUSED (no server at @url); -EPROTO (JetStream refused a stream
 * or consumer, e.g. the server was not started with -js); -ENOMEM.
 * Nothing is left behind on error.
 */
FANOUT_API int fanout_nats_open(const char *url,
				const struct fanout_nats_opts *o,
				struct fanout_nats **out);

/**
 * fanout_nats_task() - make a remote child.
 * @n:       the dispatcher.
 * @kind:    one of the kinds it was opened with.
 * @payload: bytes handed to the worker (copied); may be NULL when @len 0.
 * @len:     at most the server's max_payload less 512 bytes of headers.
 * @goal:    copied into @out->goal's storage (NULL = @kind).
 * @out:     receives fn, arg and goal for one entry of a batch.
 *
 * The task's fn defers the child, publishes it and returns -EINPROGRESS;
 * the child finishes with the outcome the worker reports (its handler's
 * return value, summary, error and cost), or FANOUT_ERROR when the
 * publish keeps failing for publish_retry_ms or the child exhausts
 * MaxDeliver.  A cancel with FANOUT_CANCEL_INTERRUPT, a deadline or a
 * join policy sends a cancel notice to the worker; a child JetStream has
 * not stored yet (its publish failing, retried) is not published any
 * more, and ends -ECANCELED if the library still waits for it.
 *
 * A remote child waiting for its outcome counts against the engine's
 * max_children (default 64) like any deferred child: raise it to keep
 * more of one delegation's children at the workers at once.
 *
 * Everything that can be checked before the batch is dispatched is
 * checked here, so a bad child refuses the batch rather than failing
 * later.  @out->arg is owned by the child: freed when it finishes.  If
 * the batch is never dispatched (fanout_dispatch() failed, or you
 * changed your mind) release it with fanout_nats_task_discard(); one
 * whose delegation was interrupted before the child started (a cancel,
 * a deadline, a join policy, fanout_shutdown()) is freed then, by the
 * engine's skip hook (fanout_set_skip_hook(), which fanout_nats_open()
 * registers), not held until fanout_nats_close().
 *
 * Context: never blocks.
 * Return: 0; -EINVAL (NULL @n or @out, NULL @payload with @len > 0);
 * -ENOENT (kind not configured); -EMSGSIZE (payload too big for the
 * server); -ENOTCONN (the connection is down now: nothing would be
 * delivered until it is back); -ENOMEM.  On error @out is untouched.
 */
FANOUT_API int fanout_nats_task(struct fanout_nats *n, const char *kind,
				const void *payload, size_t len,
				const char *goal, struct fanout_task *out);

/**
 * fanout_nats_task_discard() - release a task fanout_nats_task() made
 * that was never dispatched.  NULL or a task not made by it: no-op.
 * Not after fanout_nats_close() of the dispatcher that made it: close
 * frees the tasks still made and undispatched, so a discard then frees
 * freed memory.
 */
FANOUT_API void fanout_nats_task_discard(struct fanout_task *t);

/**
 * struct fanout_nats_stats - dispatcher counters since open.
 * @published:   children stored by JetStream (first publish acked).
 * @republished: publish attempts retried (server down, ack lost).
 * @results:     outcomes that finished a child.
 * @duplicates:  outcomes dropped because the child was already finished
 *               (a second run's outcome, or one after a deadline), or
 *               is not this handle's (an earlier run's with the same id).
 * @redelivered: outcomes that came from a delivery after the first (the
 *               worker that had the child died or stopped).
 * @exhausted:   children finished as ERROR after MaxDeliver deliveries.
 * @cancels:     cancel notices sent.
 * @publish_failed: children finished as ERROR because publishing failed
 *               for publish_retry_ms.
 * @in_flight:   children published (or publishing) and not finished.
 * @unstarted:   tasks made by fanout_nats_task() and held (payload and
 *               all): not started, not discarded, and not yet reported by
 *               the engine as never to start.  New at the end of the
 *               struct.
 */
struct fanout_nats_stats {
	uint64_t published;
	uint64_t republished;
	uint64_t results;
	uint64_t duplicates;
	uint64_t redelivered;
	uint64_t exhausted;
	uint64_t cancels;
	uint64_t publish_failed;
	uint64_t in_flight;
	uint64_t unstarted;
};

/** fanout_nats_stats() - read the counters.  Return: 0; -EINVAL. */
FANOUT_API int fanout_nats_stats(struct fanout_nats *n,
				 struct fanout_nats_stats *st);

/**
 * fanout_nats_close() - stop the dispatcher and free it.
 * @n: the handle, or NULL (no-op).
 *
 * Call it after the engines that ran its children were shut down (or
 * their delegations finished).  Children still waiting for an outcome
 * are finished as FANOUT_ERROR, code -ECONNABORTED; their durable
 * consumers are deleted (outcomes still to come are dropped by the
 * results stream's 24 h age limit).
 */
FANOUT_API void fanout_nats_close(struct fanout_nats *n);

/* ------------------------------------------------------------ worker side */

/**
 * struct fanout_nats_job - one child as a worker's handler sees it; the
 * handler's arg.  Valid until the handler returns.
 * @payload, @len: the bytes given to fanout_nats_task().
 * @kind:     the kind served.
 * @key:      "<dispatcher>.<nonce>.<seq>" (WIRE above), unique per
 *            child, also across dispatcher restarts: key side effects on
 *            it to make them idempotent across redeliveries.
 * @delivery: 1 for the first delivery, 2 after one redelivery, ...
 * @user:     fanout_nats_serve_opts.handler_arg.
 */
struct fanout_nats_job {
	const void *payload;
	size_t len;
	const char *kind;
	const char *key;
	unsigned delivery;
	void *user;
};

/**
 * struct fanout_nats_serve_stats - a worker's counters, see
 * fanout_nats_serve_opts.stats.
 * @outcome_publishes: outcome publish attempts, retries included.
 * @outcome_retries:   of them, those after a failed one (each waited its
 *                     backoff: fanout_nats_serve()).
 * @outcomes_unsettled: outcomes sent or waiting to be sent again whose
 *                     child is not acked yet (JetStream has not stored
 *                     them); a stop waits, at most 3 s, until it is 0.
 */
struct fanout_nats_serve_stats {
	uint64_t outcome_publishes;
	uint64_t outcome_retries;
	uint64_t outcomes_unsettled;
};

/**
 * struct fanout_nats_serve_opts - worker options; zero = default.
 * @url:         server (NULL = nats://127.0.0.1:4222).
 * @kind:        the kind to serve (required).
 * @handler:     runs each child as a child of a local delegation, with a
 *               struct fanout_nats_job * as arg: its return value,
 *               fanout_set_summary/set_error/add_cost become the outcome
 *               sent back; it sees fanout_interrupted() when the
 *               dispatcher cancels the child or the worker stops.
 * @handler_arg: fanout_nats_job.user.
 * @engine:      local engine the handlers run on (NULL = one of
 *               @concurrency workers made and destroyed by the call).
 *               While it refuses a child (-EBUSY: its max_async taken by
 *               other delegations) the worker keeps the child, alive,
 *               and takes no other until it has room.
 * @concurrency: children run at once (default 1; with @engine, default
 *               its worker count).
 * @ack_wait_ms: AckWait of the kind's consumer if this call creates it
 *               (default 30000).  A consumer that exists (another worker
 *               made it) is served as it is, whatever this and
 *               @max_deliver say.
 * @max_deliver: MaxDeliver of that consumer (default 5).
 * @progress_ms: how often a running child's message gets InProgress
 *               (default the consumer's AckWait / 3), so AckWait expires
 *               only for a dead worker; must be below that AckWait.
 * @stop:        the call returns soon after *@stop becomes non-zero (set
 *               it from a signal handler, or from another thread with
 *               __atomic_store_n(stop, 1, __ATOMIC_RELAXED): a plain
 *               store there is a data race).  Children running then are
 *               interrupted; each that does not complete (returns
 *               -ECANCELED, or any other error) is handed back (Nak) for
 *               another worker and its outcome is not sent; one that
 *               completes anyway has its outcome sent.  A child the
 *               dispatcher cancelled has its outcome sent either way.
 *               The stop then waits for the outcomes still being
 *               stored and returns as soon as their children are acked.
 *               Meanwhile (a handler slow to stop, an outcome still
 *               being stored) the children stay kept alive, so none is
 *               redelivered to another worker while it is still here.
 *               An outcome not stored 3 s into the stop (the results
 *               stream storing nothing, the server away) is given up:
 *               its child is handed back (Nak) and runs again at once
 *               on another worker, rather than after AckWait.
 *               Children that reached a busy worker (@max_held) are
 *               handed back at once, and so is any that reaches it
 *               during the stop.
 * @max_held:    messages a busy worker keeps (default @concurrency).  A
 *               message can reach a worker whose slots are all running
 *               (one of its pull requests, whose wait had ended here, was
 *               still open at the server); it is kept alive with
 *               InProgress and started first when a slot frees.  Beyond
 *               @max_held each is handed back (Nak with a delay of 250
 *               ms, so that no request of this worker still open at the
 *               server takes it again) for an idle worker to run.  Each
 *               hand-back counts as a delivery against MaxDeliver.
 * @stats:       if set, counters the call keeps while it runs (zeroed
 *               when it starts).  It writes them with relaxed atomic
 *               stores: read them from another thread with
 *               __atomic_load_n(..., __ATOMIC_RELAXED), or plainly
 *               after the call returned.
 */
struct fanout_nats_serve_opts {
	const char *url;
	const char *kind;
	fanout_fn handler;
	void *handler_arg;
	struct fanout_engine *engine;
	unsigned concurrency;
	int ack_wait_ms;
	int max_deliver;
	int progress_ms;
	volatile sig_atomic_t *stop;
	unsigned max_held;
	struct fanout_nats_serve_stats *stats;
};

/**
 * fanout_nats_serve() - run children of one kind until told to stop.
 * @o: options.
 *
 * Pulls with explicit ack; for each child runs the handler, publishes
 * the outcome to the dispatcher's result subject (asynchronously,
 * retried while the server is away or the results stream stores nothing:
 * 100 ms after the first failure, the wait doubled after each, at most
 * 2 s; the child kept alive meanwhile, so it does not run again) and acks
 * the child only once JetStream has stored the outcome, so a worker
 * killed at any point leaves the child to be redelivered.  A
 * child whose dispatcher cancelled it is answered -ECANCELED unrun.  A
 * message on the work subject that no dispatcher sent (no Fanout-Key, or
 * a Fanout-Reply other than fanout.result.<id>) is refused unrun (Term),
 * never redelivered.  An outcome the server would refuse (over its
 * max_payload less 512 bytes of headers, e.g. a large summary) is sent
 * as FANOUT_ERROR, code -EMSGSIZE, with an error that says so.
 *
 * Context: blocks until *@o->stop.
 * Return: 0 after a stop; -EINVAL (NULL @o, no handler, a bad kind, a
 * negative @ack_wait_ms, @max_deliver or @progress_ms, a @progress_ms not
 * below the consumer's AckWait, a @url that is empty, blank or cannot be
 * parsed);
 * -ECONNREFUSED (no server at first); -EPROTO (JetStream refused the
 * stream or consumer); -ENOMEM; or a fanout_create() error.
 */
FANOUT_API int fanout_nats_serve(const struct fanout_nats_serve_opts *o);

#ifdef __cplusplus
}
#endif
#endif /* FANOUT_NATS_H */
