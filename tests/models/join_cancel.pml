/*
 * join_cancel.pml - the batch join and its race with fanout_cancel().
 *
 * What it models (lib/join.c: fanout__run_token, run_child, claim_rest,
 * fanout__cancel_rec; see tests/models/README.md):
 * a delegation of N children carries two counters,
 *   claim      next unclaimed child index (0..N; may run past N)
 *   remaining  children not yet finished (starts at N)
 * Every runner - a worker thread holding a ring token, or the caller of
 * fanout_run() helping with its own batch - loops
 *     if (cancel) stop;                 relaxed hint: may or may not see it
 *     i = fetch_add(claim, 1); if (i >= N) stop;
 *     run child i; write result[i];
 *     if (fetch_sub(remaining, 1) == 1) finalise();
 * A canceller (fanout_cancel, fanout_shutdown's scan, or dispatch's own
 * re-check; C of them race) does
 *     fetch_or(cancel, bits);
 *     old = exchange(claim, N);
 *     if (old < N) { mark children old..N-1 interrupted (write their slots);
 *                    k = N - old;
 *                    if (fetch_sub(remaining, k) == k) finalise(); }
 * finalise() publishes the one completion event.
 *
 * Properties (safety; every process terminates, so pan also reports any
 * invalid end state):
 *   - finalise happens exactly once (never twice, and at the end: once);
 *   - when it happens every result slot has been written exactly once;
 *   - every child index is either run or interrupted, exactly once, never
 *     both; remaining never goes below zero.
 *
 * Sizes: N (3), W (3), C (1) can be overridden with spin -DN=4 etc.
 *
 * Variants (spin -DBUG=n -a join_cancel.pml):
 *   (none)  the algorithm above: must verify with errors: 0.
 *   BUG=1   the canceller claims the tail with a plain load + store instead
 *           of exchange: a worker's fetch_add can land between the two, so a
 *           child is both run and interrupted and remaining underflows.
 *   BUG=2   the join decrement is split into "remaining--" and a separate
 *           "remaining == 0" test: two threads can both see zero and
 *           finalise twice.
 *
 * Spin explores sequentially consistent interleavings only. That is sound
 * for what is checked here: the claim argument needs only the atomicity of
 * the RMWs on `claim` and their single modification order, which C11 gives
 * even to the relaxed fetch_add/exchange the code uses; the slot contents
 * are ordered by the acq_rel fetch_sub on `remaining` (release by every
 * owner, acquire by the finaliser), which is what makes the finaliser's
 * reads below see every write, as they do in an SC interleaving.
 */

#ifndef N
#define N 3            /* children in the delegation */
#endif
#ifndef W
#define W 3            /* 2 worker threads + the helping fanout_run caller */
#endif
#ifndef C
#define C 1            /* concurrent cancellers (user cancel, shutdown, the
                          dispatcher's own re-check): 1 or 2 */
#endif

byte claim = 0;        /* next unclaimed child index */
short remaining = N;   /* signed on purpose: underflow must be visible */

byte ran[N];           /* times child i was run */
byte intr[N];          /* times child i was marked interrupted */
byte result[N];        /* times result slot i was written */
byte finalised = 0;    /* times the event was published */
bool cancel = 0;       /* rec->cancel: the hint workers read first */
byte chk = 0;          /* loop scratch, used inside d_step only */

/* every slot written exactly once, every child run xor interrupted */
inline check_slots()
{
	chk = 0;
	do
	:: chk < N ->
		assert(result[chk] == 1);
		assert(ran[chk] + intr[chk] == 1);
		chk++
	:: else -> break
	od;
	chk = 0                 /* scratch: keep it out of the state */
}

inline finalise()
{
	d_step {
		assert(finalised == 0);
		finalised++;
		check_slots()
	}
}

proctype worker()
{
	byte i;
	short old;

	do
	:: cancel -> break                              /* relaxed hint only */
	:: d_step { i = claim; claim++ };               /* fetch_add(claim, 1) */
	   if
	   :: i >= N -> break
	   :: else
	   fi;
	   ran[i]++;                                    /* run child i */
	   result[i]++;                                 /* write its slot */
#if BUG == 2
	   remaining--;                                 /* plain RMW ...   */
	   old = remaining + 1;                         /* ... then re-read */
#else
	   d_step { old = remaining; remaining-- };     /* fetch_sub(remaining, 1) */
#endif
	   assert(remaining >= 0);
	   if
	   :: old == 1 -> finalise()
	   :: else
	   fi
	od
}

proctype canceller()
{
	byte old, j;
	short k, prev;

	cancel = 1;                                     /* fetch_or(cancel) */
#if BUG == 1
	old = claim;                                    /* load ...          */
	claim = N;                                      /* ... then store: a */
	                                                /* fetch_add can land */
	                                                /* in between         */
#else
	d_step { old = claim; claim = N };              /* exchange(claim, N) */
#endif
	if
	:: old < N ->
		j = old;
		do
		:: j < N -> intr[j]++; result[j]++; j++   /* mark interrupted */
		:: else -> break
		od;
		k = N - old;
		d_step { prev = remaining; remaining = remaining - k };
		assert(remaining >= 0);
		if
		:: prev == k -> finalise()
		:: else
		fi
	:: else                                         /* nothing left to claim */
	fi
}

init
{
	byte p;

	atomic {
		p = 0;
		do
		:: p < W -> run worker(); p++
		:: else -> break
		od;
		p = 0;
		do
		:: p < C -> run canceller(); p++
		:: else -> break
		od
	};
	/* everyone has terminated: the event was published, once */
	(_nr_pr == 1);
	assert(finalised == 1);
	d_step { check_slots() };
	assert(remaining == 0)
}
