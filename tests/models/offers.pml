/*
 * offers.pml - work-first offers (queue/fq.c, argument 7; lib/deleg.c,
 * help_offer): a fanout_run caller (the owner) offers N tokens of its
 * batch to spinning workers instead of the ring, then runs a child that
 * can only finish once some OTHER thread ran a token of the batch (a
 * child waiting for its sibling).  Workers spin (and may take a token of
 * an open offer, "old enough" being a nondeterministic choice), stop
 * spinning, look at the ring, look at the offers once more, and park
 * until a ring submit wakes them (the eventcount of argument 2, reduced
 * here to "the ring is not empty").
 *
 * Checked: every token is taken exactly once, by a worker's CAS or the
 * owner's closing exchange (assert at the end); nothing hangs - an offer
 * the owner keeps open is taken by someone (spin's invalid end states:
 * the owner blocked on its child while every worker sleeps).
 *
 * Atomicity mirrors the C code: every RMW is one atomic block; the owner's
 * opening exchange, its load of `spinning`, a worker's decrement of
 * `spinning` and its loads of the offer are seq_cst in fq.c, which spin's
 * interleavings (sequential consistency) give.
 *
 * Seeded bugs (spin -DBUG=n must find them):
 *   1: the worker parks without the last look at the offers;
 *   2: the owner keeps the offer open without checking for a spinner;
 *   3: the owner reads `spinning` BEFORE it opens the offer.
 */
#ifndef W
#define W 2 /* workers */
#endif
#define N W /* tokens offered: one per worker */

byte spinning = W; /* workers in the spin phase (all start spinning) */
byte avail = 0;	   /* the offer's tokens left (low half of `word`) */
bool open = false; /* the offer's bit in offers_open */
byte ring = 0;	   /* tokens in the ring */
byte taken = 0;	   /* tokens workers took from the offer */
byte ran = 0;	   /* tokens run by workers (offer or ring) */
byte returned = 0; /* tokens the owner's close got back */
bool done = false; /* the owner finished */

inline run_token()
{
	ran++
}

proctype owner()
{
	byte saw, left;
#if BUG == 3
	saw = spinning;
#endif
	atomic { open = true; avail = N }; /* fq_offer_open: seq_cst exchange */
#if BUG != 3
	saw = spinning;			   /* fq_spinners: seq_cst load */
#endif
#if BUG == 2
	saw = 1;
#endif
	if
	:: saw == 0 ->
		atomic { left = avail; avail = 0; open = false }; /* close */
		returned = returned + left;
		ring = ring + left /* fq_submit: wakes parked workers */
	:: else -> skip
	fi;
	/* The caller's child waits for a sibling run by another thread. */
	(ran > 0);
	if
	:: open ->
		atomic { left = avail; avail = 0; open = false };
		returned = returned + left
	:: else -> skip
	fi;
	done = true
}

proctype worker()
{
	bool spin = true;
again:
	if
	:: spin ->
		/* spin_for_work: may take an old-enough offer, or time out */
		if
		:: atomic { open && avail > 0 -> avail--; taken++ };
			atomic { spinning--; spin = false };
			run_token();
			goto again
		:: atomic { spinning--; spin = false }
		fi
	:: else -> skip
	fi;
	/* after the spin: the ring, then the offers (any age), then park */
	if
	:: atomic { ring > 0 -> ring-- }; run_token(); goto again
	:: else -> skip
	fi;
#if BUG != 1
	if
	:: atomic { open && avail > 0 -> avail--; taken++ }; run_token();
		goto again
	:: else -> skip
	fi;
#endif
	/* park until the ring has a token (argument 2), or until the
	 * owner is done and nothing is left (the end of the run) */
	if
	:: atomic { ring > 0 -> ring-- }; run_token(); goto again
	:: done && ring == 0 -> skip
	fi
}

init
{
	byte i;
	atomic {
		run owner();
		for (i : 1 .. W) { run worker() }
	};
	(done && _nr_pr == 1);
	assert(taken + returned == N);
	assert(ran == taken + (returned - ring) || ring == 0);
}
