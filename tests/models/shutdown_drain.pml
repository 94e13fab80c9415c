/*
 * shutdown_drain.pml - fanout_shutdown() delivers every accepted event.
 *
 * What it models (lib/deleg.c: enter, fanout_dispatch, recheck_shutdown,
 * fanout__active_put, fanout__finalise, fanout__cancel_rec; and the
 * fanout_shutdown protocol described in deleg.c "Shutdown"; see
 * tests/models/README.md).  `active` is two counters (record.c): e->
 * active_in is `ain` here, which calls add to when they enter and
 * subtract from when they drop a unit, and e->active_out is `aout`,
 * which finalisers add a background record's unit to.
 *
 * Dispatcher (fanout_dispatch, one per delegation, any thread):
 *     active_in += 2;               seq_cst RMW: the call + its record
 *     if (shutting) { put(2); return -ESHUTDOWN; }
 *     insert the record into the table;
 *     fq_submit(record);            the workers may run it from now on
 *     fence; if (shutting) cancel(record);          the re-check
 *     put(1);                       the call's unit, after its last
 *                                   touch of the queue
 * The record: its children are claimed either by a worker (after submit)
 * or by a canceller (the join/cancel claim, reduced here to one claim
 * word; join_cancel.pml checks the claim itself). Whoever claims them
 * finalises. A worker's children either finish by themselves or run
 * "forever", i.e. until they see the interrupt. A canceller that claims
 * finalises at once (children reported interrupted).
 *     finalise: publish the ONE event; then out_put() (the record's unit)
 *     put(n):    active_in -= n;  if (shutting) signal(drained)
 *     out_put(): active_out += 1; if (shutting) signal(drained)
 * fanout_shutdown():
 *     shutting = 1;                 store + full barrier
 *     for each record in the table: cancel(record);
 *     wait until drained            eventcount: prepare; re-check; sleep
 *                                   (re-check: o = active_out, then
 *                                   i = active_in, drained if i == o)
 *     stop the queue;
 *     (every accepted delegation must have published its event by now)
 * The drained eventcount is the same protocol as park_wake.pml: prepare
 * (waiters++, v = seq), re-check, futex_wait(seq, v); signal is
 * seq++ then wake if waiters.
 *
 * Properties (safety; nothing has an end label, so any process stuck at
 * the end - shutdown asleep, a record running because nobody interrupted
 * it - is an invalid end state):
 *   - fanout_shutdown always returns: no hang;
 *   - when it returns, every accepted delegation has published its event,
 *     exactly once, and a refused one never publishes;
 *   - the queue is never stopped under a submit (no fq_submit after it).
 *
 * Sizes: D delegations (2) race one fanout_shutdown; -DD=3 is valid but
 * needs more than 3 GB of pan memory (over 21 million states), so `make
 * models` checks D=2: every pair of dispatches against the one shutdown.
 *
 * Variants (spin -DBUG=n -a shutdown_drain.pml):
 *   (none)  the protocol above: must verify with errors: 0.
 *   BUG=1   the dispatcher does not re-check `shutting` after inserting:
 *           if shutdown's scan runs before the insert, the record is never
 *           interrupted, runs forever, and shutdown hangs (invalid end
 *           state).
 *   BUG=2   the finaliser drops its unit BEFORE publishing the event:
 *           shutdown can return while an accepted event is unpublished.
 *   BUG=3   shutdown reads `active` before announcing itself as a waiter
 *           (check-then-prepare): the last put's signal finds no waiter,
 *           shutdown then sleeps on the new seq forever.
 *   BUG=4   the dispatcher drops the call's unit before fq_submit: the
 *           scan's cancel can finalise the record, active reaches 0 and
 *           shutdown stops the queue under the submit.
 *
 * Spin explores sequentially consistent interleavings only. Three races
 * here are the store-buffering (Dekker) pattern, and for each the C code
 * must forbid the outcome "both reads stale", which no SC interleaving has:
 *   - enter "active += 2; read shutting" vs shutdown "write shutting;
 *     fence; read active": seq_cst RMW + seq_cst load on the dispatch side,
 *     seq_cst exchange + seq_cst fence on the shutdown side;
 *   - "insert; fence; read shutting" vs "write shutting; fence; scan":
 *     a seq_cst fence on each side;
 *   - put / done "RMW a counter; read shutting" vs the same shutdown
 *     sequence: C11 only guarantees that shutdown's reads of the counters
 *     (after its seq_cst fence) see the RMW if the RMW is itself seq_cst
 *     (C11 7.17.3, the seq_cst fence rule, speaks of the last seq_cst
 *     modification before the fence); acq_rel is enough on x86, ARMv8,
 *     POWER and RISC-V, but not by the letter of C11.
 * And the re-check's two loads are two steps here, so spin interleaves
 * puts between them.
 * The drained eventcount needs nothing more: if a put's signal finds no
 * waiter, shutdown's v = seq reads the bumped seq and acquires the
 * put through it.
 */

#ifndef D
#define D 2            /* delegations dispatched concurrently with shutdown */
#endif

byte ain = 0;          /* e->active_in */
byte aout = 0;         /* e->active_out */
bool shutting = 0;     /* e->shutting */
bool qstopped = 0;     /* fq_stop() has run */

bool in_table[D];      /* record inserted (stays visible after finishing) */
bool cancelled[D];     /* rec->cancel, seen by running children */
bool taken[D];         /* the children's claim word (reduced to one bit) */
bool accepted[D];      /* dispatch returned 0 */
bool refused[D];       /* dispatch returned -ESHUTDOWN */
byte published[D];     /* events published for it */

/* the `drained` eventcount; only fanout_shutdown waits on it */
byte seq = 0;
byte waiters = 0;
bool sleeping = 0;     /* shutdown is queued in futex_wait on &seq */

inline signal_drained()
{
	seq++;                                  /* seq_cst */
	if
	:: waiters > 0 -> sleeping = 0          /* futex_wake */
	:: else
	fi
}

/* a caller drops n units of its own */
inline put(n)
{
	ain = ain - n;                          /* seq_cst RMW */
	if
	:: shutting -> signal_drained()
	:: else
	fi
}

/* a finaliser drops a background record's unit */
inline out_put()
{
	aout = aout + 1;                        /* seq_cst RMW */
	if
	:: shutting -> signal_drained()
	:: else
	fi
}

inline finalise(r)
{
#if BUG == 2
	out_put();
	published[r]++;
#else
	published[r]++;                         /* publish the ONE event */
	out_put();                                 /* then drop the record's unit */
#endif
}

/* fanout__cancel_rec: set the flag, claim what no worker claimed yet */
inline cancel(r)
{
	cancelled[r] = 1;
	d_step {
		mine = !taken[r];
		taken[r] = 1
	};
	if
	:: mine -> mine = 0; finalise(r)        /* all children interrupted */
	:: else
	fi
}

inline check_published()
{
	d_step {
		r = 0;
		do
		:: r < D ->
			assert(!accepted[r] || published[r] == 1);
			assert(!refused[r] || published[r] == 0);
			r++
		:: else -> break
		od;
		r = 0
	}
}

/* a worker running the record's token, from fq_submit on */
proctype runner(byte id)
{
	bool mine;

	d_step {                                /* claim the children */
		mine = !taken[id];
		taken[id] = 1
	};
	if
	:: mine -> mine = 0;
		if
		:: true                         /* they finish by themselves */
		:: true -> cancelled[id]        /* they run until interrupted */
		fi;
		finalise(id)
	:: else                                 /* a canceller claimed them */
	fi
}

proctype dispatcher(byte id)
{
	bool mine;

	ain = ain + 2;                          /* seq_cst RMW */
	if
	:: shutting ->
		put(2);
		refused[id] = 1;
		goto done
	:: else
	fi;
	accepted[id] = 1;
	in_table[id] = 1;                       /* insert into the table */
#if BUG == 4
	put(1);                                 /* call unit dropped too early */
#endif
	assert(!qstopped);                      /* fq_submit on a live queue */
	run runner(id);
#if BUG != 1
	if
	:: shutting -> cancel(id)               /* fence; the re-check */
	:: else
	fi;
#endif
#if BUG != 4
	put(1);                                 /* the call's unit */
#endif
done:
	skip
}

proctype shutdown()
{
	byte r, v, o, i;
	bool mine;

	shutting = 1;                           /* store; seq_cst fence */
	r = 0;
	do                                      /* scan the table */
	:: r < D ->
		if
		:: in_table[r] -> cancel(r)
		:: else
		fi;
		r++
	:: else -> break
	od;
	do                                      /* wait until drained */
	::
#if BUG == 3
		o = aout;                       /* checked before announcing */
		i = ain;
		if
		:: i == o -> o = 0; i = 0; break
		:: else -> o = 0; i = 0
		fi;
		waiters++;
		v = seq;
#else
		waiters++;                      /* fq_ec_prepare: seq_cst */
		v = seq;
		o = aout;                       /* fanout__drained: out, */
		i = ain;                        /* then in */
		if
		:: i == o -> o = 0; i = 0; waiters--; break
		:: else -> o = 0; i = 0
		fi;
#endif
		d_step {                        /* futex_wait(&seq, v) */
			if
			:: seq == v -> sleeping = 1
			:: else
			fi;
			v = 0
		};
		!sleeping;
		waiters--
	od;
	qstopped = 1;                           /* fq_stop() */
	check_published()
}

init
{
	byte r;

	atomic {
		r = 0;
		do
		:: r < D -> run dispatcher(r); r++
		:: else -> break
		od;
		run shutdown()
	};
	(_nr_pr == 1);
	check_published()
}
