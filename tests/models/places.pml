/*
 * places.pml - max_children places, parked tokens and handed-back ranges.
 *
 * What it models (lib/join.c: run_token, run_chunk, take_place, park,
 * fanout__give_place, hand_back, take_leftover, leftovers_left; lib/
 * pending.c: fanout_defer's place and the completer's finish_tail; see
 * tests/models/README.md).  A delegation of N children, claimed in chunks
 * of CH by W runners (ring tokens); children 0..ND-1 defer, and a
 * completer finishes them one by one later, each giving its place back.
 * Once a child deferred (`deferring`), every start takes a place first
 * (at most MAXC held).  A runner with no place parks: it becomes a parked
 * token (`parked`) and leaves; give_place takes one parked token and
 * resubmits it (a new runner) while indices are unclaimed or ranges wait
 * in `leftovers`, else releases it.  A runner that claimed a chunk before
 * it saw `deferring` and finds no place for its next child hands the rest
 * of the chunk back (a range pushed on `leftovers`) and parks.  A runner
 * with a place takes a range with take_leftover: it takes the whole list
 * (one exchange), keeps the first range and pushes the rest back (a
 * second step).  A runner that took a range looks at the list again
 * before it leaves (leftovers_left) and goes back for what is there.
 *
 * Workers take tokens from a ring (a channel); W tokens start there.
 * Property (safety; init checks it once nothing can move any more - the
 * workers waiting for tokens, the completer done): exactly one finalise,
 * and every child ran exactly once.  A range left with no runner and no
 * parked token ends the run without a finalise.
 *
 * Variants:
 *   (none)  lib/join.c as it is: must verify with errors: 0.
 *   BUG=1   a runner that took a range leaves at the batch's end without
 *           looking at the list again (the code before 3b1f245): a
 *           give_place between a taker's exchange and its push-back sees
 *           every index claimed and no range, and releases the parked
 *           token those ranges counted on.
 *   BUG=2   give_place releases its parked token without looking at the
 *           ranges: handed-back children with every index claimed have no
 *           runner.
 *
 * Spin explores sequentially consistent interleavings.  The C code's
 * places/parked pair is seq_cst (the "Places" argument in join.c); the
 * list is one pointer changed only by exchange and CAS, and a runner
 * reads what it pushed itself; `claim` and `remaining` are RMWs.
 */

#ifndef N
#define N 5	/* children */
#endif
#ifndef CH
#define CH 3	/* the first chunk */
#endif
#ifndef W
#define W 2	/* runners (ring tokens) at the start */
#endif
#ifndef ND
#define ND 2	/* children 0..ND-1 defer */
#endif
#ifndef MAXC
#define MAXC 2	/* max_children */
#endif
#ifndef BUG
#define BUG 0
#endif
#define LMAX 4	/* ranges the list can hold in these sizes */

byte claim = 0;
byte remaining = N;
byte places = 0;
byte parked = 0;
bool deferring = false;
byte deferred = 0;	/* children that deferred so far */
byte finalised = 0;
byte ran[N];
byte nl = 0;		/* leftovers: a stack of ranges [llo, lhi) */
byte llo[LMAX];
byte lhi[LMAX];
chan ring = [8] of { bit };	/* ring tokens of the delegation */

/* fanout__give_place: places--, then take one parked token: resubmit it
 * if anything is left to claim or a range waits, else release it. */
inline give_place()
{
	places--;
	atomic {
		if
		:: parked > 0 -> parked--; owned = true
		:: else -> owned = false
		fi
	}
	if
	:: owned ->
		lc = claim;	/* two relaxed looks, one after the other */
		ln = nl;
		if
		:: (lc < N || (BUG != 2 && ln > 0)) -> ring ! 1
		:: else -> skip	/* released: credit and reference back */
		fi
	:: else -> skip
	fi
}

/* take_place: fetch_add, undone with a give_place at MAXC. */
inline take_place()
{
	atomic { old = places; places++ }
	if
	:: old < MAXC -> placed = true
	:: else -> placed = false; give_place()
	fi
}

/* park: 1 parked (leave), 0 a place came free and we took our token
 * back (try again).  Credits never run out here. */
inline park()
{
	parked++;
	if
	:: remaining == 0 ->
		atomic { if :: parked > 0 -> parked-- :: else fi }
		pres = 1
	:: else ->
		if
		:: places < MAXC ->
			atomic {
				if
				:: parked > 0 -> parked--; pres = 0
				:: else -> pres = 1
				fi
			}
		:: else -> pres = 1
		fi
	fi
}

/* A worker: runs each token it takes from the ring (run_token). */
proctype Worker()
{
	byte i, end, j, chunk, done, old, lc, ln, pres, k, tn;
	byte tlo[LMAX], thi[LMAX];
	bool placed, took, recheck, owned, hb, tok;

end_token:	/* a worker waiting for a token is a valid end */
	ring ? tok;
	chunk = CH;
	done = 0;
	took = false;
	recheck = false;
	do
	:: true ->
		placed = false;
		if
		:: (recheck || deferring) ->
			recheck = false;
			chunk = 1;
			take_place();
			if
			:: !placed ->
				park();
				if
				:: pres == 1 -> goto out
				:: else -> goto next
				fi
			:: else -> skip
			fi;
			/* take_leftover: the whole list, then the rest back */
			atomic {
				tn = nl;
				k = 0;
				do
				:: k < nl -> tlo[k] = llo[k]; thi[k] = lhi[k]; k++
				:: else -> break
				od;
				nl = 0
			}
			if
			:: tn > 0 ->
				/* keep the top (the last pushed) ... */
				i = tlo[tn - 1];
				end = thi[tn - 1];
				took = true;
				/* ... and push the rest back */
				atomic {
					k = 0;
					do
					:: k < tn - 1 ->
						llo[nl] = tlo[k];
						lhi[nl] = thi[k];
						nl++;
						k++
					:: else -> break
					od
				}
				goto runchunk
			:: else -> skip
			fi
		:: else -> skip
		fi;
		atomic { i = claim; claim = claim + chunk }
		if
		:: i >= N ->
			if
			:: placed -> give_place()
			:: else -> skip
			fi;
			if
			:: (BUG != 1 && took && nl > 0) -> recheck = true; goto next
			:: else -> goto out
			fi
		:: else -> skip
		fi;
		if
		:: N - i < chunk -> end = N
		:: else -> end = i + chunk
		fi;
runchunk:
		/* run_chunk */
		hb = false;
		j = i;
		do
		:: j < end ->
			if
			:: (!placed && deferring) ->
				take_place();
				if
				:: !placed ->
					atomic { llo[nl] = j; lhi[nl] = end; nl++ }
					hb = true;
					break
				:: else -> skip
				fi
			:: else -> skip
			fi;
			ran[j]++;
			if
			:: j < ND ->	/* fanout_defer: keeps (or takes) a place */
				atomic {
					if
					:: !placed -> places++
					:: else -> skip
					fi;
					deferring = true;
					deferred++
				}
			:: else ->
				done++;
				if
				:: placed -> give_place()
				:: else -> skip
				fi
			fi;
			placed = false;
			j++
		:: else -> break
		od;
		if
		:: hb ->
			park();
			if
			:: pres == 1 -> goto out
			:: else -> goto next
			fi
		:: else -> skip
		fi;
		if
		:: end == N ->
			if
			:: (BUG != 1 && took && nl > 0) -> recheck = true; goto next
			:: else -> goto out
			fi
		:: else -> skip
		fi;
next:
		skip
	od;
out:
	/* runner_done: one subtraction of what it finished, if anything */
	atomic {
		if
		:: done > 0 ->
			remaining = remaining - done;
			if
			:: remaining == 0 -> finalised++
			:: else -> skip
			fi
		:: else -> skip
		fi
	}
	goto end_token
}

/* Finishes the deferred children in order (finish_tail: the place back,
 * then the join). */
proctype Completer()
{
	byte k = 0, lc, ln;
	bool owned;

	do
	:: k < ND ->
		(deferred > k);
		give_place();
		atomic {
			remaining--;
			if
			:: remaining == 0 -> finalised++
			:: else -> skip
			fi
		}
		k++
	:: else -> break
	od
}

init {
	byte j;

	atomic {
		j = 0;
		do
		:: j < W -> ring ! 1; run Worker(); j++
		:: else -> break
		od;
		run Completer()
	}
	timeout;	/* nothing can move: the workers wait for tokens */
	assert(finalised == 1);
	j = 0;
	do
	:: j < N -> assert(ran[j] == 1); j++
	:: else -> break
	od
}
