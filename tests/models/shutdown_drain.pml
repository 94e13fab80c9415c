/*
 * shutdown_drain.pml - fanout_shutdown() delivers every accepted event.
 *
 * What it models (lib/ dispatch + shutdown, see tests/models/README.md):
 * Dispatcher (fanout_dispatch, one per delegation, on any thread):
 *     inflight++;                          atomic RMW, full barrier
 *     if (stopping) { inflight--; return -ESHUTDOWN; }
 *     insert the record into the table;
 *     if (stopping) cancel(record);        the re-check
 *     ... the delegation runs; it finishes on its own or, once cancelled,
 *     promptly; its finaliser publishes the event, THEN inflight--.
 * fanout_shutdown():
 *     stopping = 1;                        store + full barrier
 *     for each record in the table: cancel(record);
 *     wait until inflight == 0;
 *     (now every accepted delegation must have published its event)
 *
 * A delegation's children are abstracted into one choice made when it
 * starts running: either it finishes by itself, or it runs "forever" - it
 * stops only when cancelled. So a record that nobody cancels during
 * shutdown keeps inflight above zero and shutdown waits forever: pan reports
 * that as an invalid end state (nothing here has an end label). cancel() is
 * idempotent (an atomic flag; the join/cancel race itself is
 * join_cancel.pml).
 *
 * Properties (safety):
 *   - shutdown always returns (no invalid end state: nobody hangs);
 *   - when it returns, every delegation that was accepted has published
 *     its event, exactly once; a refused one never publishes;
 *   - at the very end every accepted delegation published exactly once.
 *
 * Variants (spin -DBUG=n -a shutdown_drain.pml):
 *   (none)  the protocol above: must verify with errors: 0.
 *   BUG=1   the dispatcher does not re-check stopping after inserting: if
 *           shutdown's scan runs before the insert, the record is never
 *           cancelled, runs forever, and shutdown hangs.
 *   BUG=2   the finaliser does inflight-- BEFORE publishing the event:
 *           shutdown can return while an accepted event is unpublished.
 *
 * Spin explores sequentially consistent interleavings only. The two full
 * barriers are the store-buffering (Dekker) pair: dispatcher "store
 * inflight; load stopping" against shutdown "store stopping; load
 * table/inflight"; and the insert + re-check against the scan is the same
 * pattern once more (insert; load stopping vs. store stopping; scan).
 */

#ifndef D
#define D 2            /* delegations dispatched concurrently with shutdown */
#endif

byte inflight = 0;
bool stopping = 0;

bool in_table[D];      /* record inserted (stays visible after finishing) */
bool cancelled[D];     /* cancel flag seen by the record's children */
bool accepted[D];      /* dispatch returned 0 */
bool refused[D];       /* dispatch returned -ESHUTDOWN */
byte published[D];     /* events published for it */

inline cancel(r)
{
	cancelled[r] = 1
}

inline all_accepted_published()
{
	d_step {
		r = 0;
		do
		:: r < D ->
			assert(!accepted[r] || published[r] == 1);
			assert(!refused[r] || published[r] == 0);
			r++
		:: else -> break
		od
	}
}

proctype delegation(byte id)
{
	/* --- fanout_dispatch --- */
	inflight++;                             /* atomic, full barrier */
	if
	:: stopping ->
		inflight--;
		refused[id] = 1;
		goto done
	:: else
	fi;
	accepted[id] = 1;
	in_table[id] = 1;                       /* insert into the table */
#if BUG != 1
	if
	:: stopping -> cancel(id)               /* the re-check */
	:: else
	fi;
#endif

	/* --- the children run --- */
	if
	:: true                                 /* all finish by themselves */
	:: true -> cancelled[id]                /* run until interrupted */
	fi;

	/* --- the finaliser --- */
#if BUG == 2
	inflight--;
	published[id]++;
#else
	published[id]++;                        /* publish the one event */
	inflight--;                             /* only then */
#endif
done:
	skip
}

proctype shutdown()
{
	byte r;

	stopping = 1;                           /* full barrier */
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
	(inflight == 0);                        /* wait for the drain */
	all_accepted_published()
}

init
{
	byte r;

	atomic {
		r = 0;
		do
		:: r < D -> run delegation(r); r++
		:: else -> break
		od;
		run shutdown()
	};
	(_nr_pr == 1);
	all_accepted_published()
}
