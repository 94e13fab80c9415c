/*
 * pending_finish.pml - the finish race of a deferred ("pending") child.
 *
 * What it models (lib/pending.c: fanout_defer, fanout_complete,
 * fanout_pending_on_cancel, fanout__pendings_cancel; lib/join.c:
 * fanout__cancel_rec, run_child, runner_done; include/fanout.h "children
 * that finish later"; see tests/models/README.md).  One delegation record
 * with NS synchronous and ND deferred children, all claimed by one runner
 * (the claim itself is join_cancel.pml's business).  Each deferred child i
 * has a pending object p[i] with
 *   st[i]     the atomic state word: DONE (finished by someone), CB (an
 *             on_cancel callback is registered), RUN (someone claimed
 *             running the callback)
 *   prefs[i]  its reference count, 2 at fanout_defer: the library's
 *             (dropped when the record is freed) and the completer's
 *             (dropped by fanout_complete, whatever it returns).
 * The record has `remaining` (NS + ND), the cancel word (PENDING,
 * INTERRUPT, ABANDON, FINAL) and the pending list (a Treiber stack: the
 * push is one seq_cst CAS, entries are never removed before the record is
 * freed, so a walk sees exactly what was pushed before its head load).
 *
 * finish(i) (try_finish + finish_tail, every finisher): CAS(st, s,
 * s|DONE) only if !(s & DONE); the winner writes result slot i and does
 * fetch_sub(remaining, 1) (acq_rel); the one that takes remaining to 0
 * finalises (publishes THE event; its fetch_or of FINAL closes the cancel
 * word).  A loser changes nothing.
 *
 * Runner (a worker; holds a record reference, its ring token, throughout):
 *   per sync child:     run it or skip it (cancelled); done++
 *   per deferred child: if (cancel & PENDING) skip (done++), else fn runs:
 *       fanout_defer: push p (seq_cst CAS on the list head), then
 *           re-check: c = load(cancel) (seq_cst);
 *           if ((c & ABANDON) && !(c & FINAL)) finish(i)
 *       [REG=1] fanout_pending_on_cancel(p) from inside fn
 *       fn returns -EINPROGRESS (run_child: not counted by the runner)
 *   runner_done: fetch_sub(remaining, done) (finalise on zero); put(rec).
 * Completer i (any thread; holds p's completer reference):
 *   mode "races": fanout_complete(p) at any moment: an acquire load that
 *       finds DONE returns -EALREADY at once; else finish(i) -> 0 if it
 *       won, -EALREADY if not; then drop its reference to p.
 *   mode "waits for the cancel": [REG=2 registers the callback first]
 *       the operation only ends through its on_cancel callback (or when
 *       registration said -EALREADY: the child is already finished);
 *       then fanout_complete as above.  If the protocol ever leaves the
 *       callback un-run although registration said 0 and an interrupt
 *       came, this completer waits forever: an invalid end state.
 * fanout_pending_on_cancel(p, fn) (one registrant; PEND_CBW not modelled):
 *   old = fetch_or(st, CB) (seq_cst); if (old & DONE) return -EALREADY;
 *   if (load(cancel) & INTERRUPT)                     (seq_cst)
 *       CAS st: set RUN only if !RUN && !DONE -> call fn;
 *       a CAS loop that ends on DONE without RUN (an abandon slipped in
 *       after the fetch_or): return -EALREADY, fn will not run (FIX=1,
 *       the default, lib/pending.c since c8f028a; -DFIX=0 returns 0
 *       there, as lib/pending.c did at 3e7e328, and spin finds the caller waiting for a callback that
 *       never comes).
 *   return 0.
 * Abandoner (fanout__cancel_rec with INTERRUPT [| ABANDON]: fanout_cancel,
 * the deadline, a join policy, shutdown, the cancel tree; A of them, each
 * picks with or without ABANDON; holds a record reference, the RCU read
 * section of the lookup):
 *   if (remaining == 0) return -EALREADY;
 *   old = fetch_or(cancel, PENDING|INTERRUPT[|ABANDON])   (seq_cst)
 *   if (old & FINAL) return -EALREADY;
 *   for p in load(list head) (seq_cst):            fanout__pendings_cancel
 *       maybe_run_cb: s = load(st) (seq_cst); if (CB && !RUN && !DONE)
 *           CAS set RUN -> call fn;
 *       if ABANDON: finish(i)                                      abandon
 * put(rec): the runner, every abandoner and the finaliser each hold one
 * reference; the last put frees the record, which drops the library's
 * reference of every pending object; the last reference frees p.
 *
 * Store buffering.  Two pairs rely on seq_cst on both sides (spin
 * explores SC interleavings only; in C11 both sides must be seq_cst RMWs
 * or loads, or a seq_cst fence must separate them):
 *   push p ; load(cancel)      vs  fetch_or(cancel) ; load(list head)
 *   fetch_or CB ; load(cancel) vs  fetch_or(cancel) ; load(p->state)
 * In each pair at least one side sees the other's write, so an abandoner
 * that misses p is seen by fanout_defer's re-check, and an interrupter
 * that misses CB is seen by the registrant.
 *
 * Properties (safety; no end labels: anything stuck at the end, e.g. the
 * waiting completer above, is an invalid end state):
 *   - one DONE winner per pending child; a completer gets -EALREADY only
 *     if the library (an abandoner, fanout_defer's re-check) finished it;
 *   - remaining never below zero, reaches zero once: exactly one event,
 *     and then every result slot was written exactly once;
 *   - the callback runs at most once, never on a freed p, never for a
 *     child whose DONE was set before its RUN was claimed (the CAS), and
 *     exactly once when registration returned 0 and an interrupt came
 *     (the waiting completer);
 *   - the push/abandon race: once an abandoner with ABANDON and the
 *     runner have both returned, every deferred child is finished (its
 *     DONE is set: the join waits for no completer that has not begun);
 *   - the record is freed once, never touched after; each p is freed
 *     exactly once, never touched after (a completer that lost the DONE
 *     CAS touches only p, never the record).
 *
 * Non-vacuity (spin -DREACH=n: an assertion that path n is never taken,
 * which spin must refute): 1 fn runs on the abandoner; 2 fn runs on the
 * registrant (the interrupt came first); 3 fanout_complete returns
 * -EALREADY; 4 fanout_defer's re-check finishes a child the abandoner's
 * walk missed; 5 on_cancel's RUN claim finds the child abandoned after
 * its fetch_or of CB (the FIX=1 -EALREADY).
 *
 * Sizes: NS sync children (1), ND deferred (1), A abandoners (1), REG
 * who registers the callback (1 the child's fn, 2 the completer).
 *
 * Variants (spin -DBUG=n -a pending_finish.pml):
 *   (none)  the protocol above: must verify with errors: 0.
 *   BUG=1   fanout_complete tests DONE with a plain load and then stores
 *           DONE (no CAS): it and an abandoner both "win", the slot is
 *           written twice and remaining decremented twice.
 *   BUG=2   fanout_defer skips the re-check of ABANDON after the push: an
 *           abandoner whose head load came before the push never finishes
 *           p, and the join waits for a completer that may never come.
 *   BUG=3   on_cancel does not re-check the cancel word after setting CB:
 *           an interrupt whose walk came before CB never runs the
 *           callback, and the completer waiting for it hangs.
 *   BUG=4   the interrupter claims RUN with a plain load + store (no
 *           CAS): the callback runs twice.
 *   LATE=1  the re-check is made by the runner after fn returned (the
 *           first sketch of the protocol), i.e. after fn registered its
 *           callback, and abandons without the callback step: an fn
 *           registered before the interrupt (registration saw no INTERRUPT
 *           and returned 0) never runs when the re-check's DONE beats the
 *           abandoner's walk to p.  LATE=2, a late re-check that first
 *           runs the callback step as the abandoner does, verifies; the
 *           code re-checks inside fanout_defer, before p can have a
 *           callback, and needs no callback step there.
 *   FIX=0   on_cancel as lib/pending.c had it at 3e7e328: returns 0 when
 *           its RUN claim finds the child abandoned (see above).
 */

#ifndef NS
#define NS 1           /* synchronous children */
#endif
#ifndef ND
#define ND 1           /* deferred children: 1 or 2 */
#endif
#ifndef A
#define A 1            /* abandoners: fanout_cancel, deadline, policy,
                          shutdown; 1 or 2 */
#endif
#ifndef REG
#define REG 1          /* 1: fn registers on_cancel; 2: the completer */
#endif
#ifndef BUG
#define BUG 0
#endif
#ifndef LATE
#define LATE 0         /* 1, 2: the re-check after fn returns (see above) */
#endif
#ifndef FIX
#define FIX 1          /* on_cancel: -EALREADY when its RUN claim finds the
                          child abandoned; 0 = lib/pending.c before c8f028a */
#endif
#ifndef REACH
#define REACH 0        /* non-vacuity: -DREACH=n asserts that path n is
                          never taken; spin must find it taken */
#endif
#define reached(n) assert(REACH != n)

#define NT (NS + ND)

/* p->state */
#define DONE 1
#define CB 2
#define RUN 4
/* rec->cancel */
#define PEND 1
#define INTR 2
#define ABAN 4
#define FINAL 8
/* on_cancel's result, as the waiting completer sees it */
#define R_NONE 0
#define R_OK 1
#define R_ALREADY 2

byte cancel = 0;
short remaining = NT;  /* signed on purpose: underflow must be visible */
byte listed = 0;       /* bit i: p[i] pushed on the pending list */
byte finalised = 0;    /* events published */
byte recrefs = 2 + A;  /* runner, each abandoner, the unfinalised record */
bool recfreed = 0;
bool run_exit = 0;
byte ab_exit = 0;      /* abandoners returned */
bool abandoned = 0;    /* some abandoner set ABANDON */

byte result[NT];       /* times result slot j was written */
byte st[ND];           /* p[i]->state */
bool created[ND];      /* p[i] allocated and pushed */
bool handed[ND];       /* fanout_defer returned p[i]: the completer has it */
byte prefs[ND];
byte pfreed[ND];       /* times p[i] was freed */
byte wins[ND];         /* DONE CAS winners for p[i] */
byte lib_fin[ND];      /* ... of which the library (abandoner, re-check) */
byte cbruns[ND];       /* times p[i]'s callback ran */
bool kick[ND];         /* the callback told the operation to stop */
byte regret[ND];       /* on_cancel's answer (R_*) */
byte chk = 0;          /* loop scratch, used inside d_step only */

inline check_slots()
{
	chk = 0;
	do
	:: chk < NT -> assert(result[chk] == 1); chk++
	:: else -> break
	od;
	chk = 0
}

/* the last reference to the record: free it, and with it the library's
 * reference to every pending object */
inline rec_put()
{
	d_step {
		assert(!recfreed && recrefs > 0);
		recrefs--;
		if
		:: recrefs == 0 ->
			recfreed = 1;
			chk = 0;
			do
			:: chk < ND ->
				if
				:: created[chk] ->
					assert(pfreed[chk] == 0);
					prefs[chk]--;
					if
					:: prefs[chk] == 0 -> pfreed[chk]++
					:: else
					fi
				:: else
				fi;
				chk++
			:: else -> break
			od;
			chk = 0
		:: else
		fi
	}
}

inline finalise()
{
	d_step {
		assert(!recfreed);
		assert(finalised == 0);
		finalised++;
		cancel = cancel | FINAL;        /* fetch_or(cancel, FINAL) */
		check_slots()
	};
	rec_put()
}

/* fetch_sub(remaining, k) (acq_rel); the one reaching zero finalises */
inline join_sub(k, old)
{
	d_step { assert(!recfreed); old = remaining; remaining = remaining - k };
	assert(remaining >= 0);
	if
	:: old == k -> finalise()
	:: else
	fi
}

/* CAS(st, s, s | DONE) if !(s & DONE); the winner writes the slot and
 * counts in the join.  won: 1 if this call won; lib: 0 fanout_complete,
 * 1 an abandoner, 2 fanout_defer's re-check. */
inline finish(i, won, old, lib)
{
	d_step {
		assert(!pfreed[i]);
		if
		:: !(st[i] & DONE) -> st[i] = st[i] | DONE; won = 1;
			wins[i]++; assert(wins[i] == 1);
			if
			:: lib -> lib_fin[i]++
			:: else
			fi;
			if
			:: lib == 2 -> reached(4)       /* the walk missed p */
			:: else
			fi
		:: else -> won = 0
		fi
	};
	if
	:: won ->
		assert(!recfreed);
		result[NS + i]++;               /* write the result slot */
		join_sub(1, old)
	:: else                                 /* a loser changes nothing */
	fi
}

inline callback(i)
{
	d_step {
		assert(!pfreed[i]);
		cbruns[i]++;
		assert(cbruns[i] == 1);
		kick[i] = 1
	}
}

/* maybe_run_cb, the interrupter's step for one pending child: if a
 * callback is registered, not run and the child not finished, claim RUN
 * (CAS) and run it; an abandoner does it before abandoning, so that an
 * abandoned child's operation is still told to stop. */
inline cb_step(i, claimed, s, who)
{
#if BUG == 4
	s = st[i];                              /* plain load ... */
	if
	:: (s & CB) && !(s & (RUN | DONE)) ->
		st[i] = s | RUN;                /* ... then store */
		callback(i)
	:: else
	fi
#else
	d_step {        /* load; if CB && !RUN && !DONE: CAS set RUN */
		assert(!pfreed[i]);
		claimed = 0;
		if
		:: (st[i] & CB) && !(st[i] & (RUN | DONE)) ->
			st[i] = st[i] | RUN; claimed = 1;
			if
			:: who -> reached(1)    /* fn on the abandoner */
			:: else
			fi
		:: else
		fi
	};
	if
	:: claimed -> callback(i)
	:: else
	fi
#endif
}

/* fanout_pending_on_cancel(p[i], fn) */
inline register(i, r, claimed, held)
{
	/* fetch_or(st, CB), seq_cst, inside an RCU read section: if the
	 * child was not finished at the RMW, the record cannot be freed
	 * before the section ends (modelled as a reference held meanwhile) */
	d_step {
		assert(!pfreed[i]);
		claimed = 0;
		held = 0;
		if
		:: st[i] & DONE -> r = R_ALREADY
		:: else -> r = R_OK; assert(!recfreed); recrefs++; held = 1
		fi;
		st[i] = st[i] | CB
	};
#if BUG != 3
	if
	:: r == R_OK && (cancel & INTR) ->      /* seq_cst load */
		d_step {        /* CAS set RUN while !RUN && !DONE */
			assert(!recfreed);
			claimed = 0;
			if
			:: !(st[i] & (RUN | DONE)) ->
				st[i] = st[i] | RUN; claimed = 1;
				reached(2)      /* fn on the registrant */
			:: (st[i] & DONE) && !(st[i] & RUN) ->
				reached(5);     /* abandoned since the fetch_or */
				if
				:: FIX -> r = R_ALREADY /* fn will not run */
				:: else
				fi
			:: else
			fi
		}
	:: else
	fi;
#endif
	if
	:: held -> rec_put()                   /* rcu_read_unlock */
	:: else
	fi;
	if
	:: claimed -> callback(i)               /* after the unlock */
	:: else
	fi;
	regret[i] = r
}

/* fanout_defer's re-check after the push (seq_cst load of cancel) */
inline recheck(j, won, old)
{
	if
	:: (cancel & ABAN) && !(cancel & FINAL) -> finish(j, won, old, 2)
	:: else
	fi
}

proctype runner()
{
	byte j, done = 0, won, r, claimed, held;
	short old;

	j = 0;
	do
	:: j < NS ->
		/* run it, or skip it if cancelled: the slot is written */
		result[j]++;
		done++;
		j++
	:: else -> break
	od;
	j = 0;
	do
	:: j < ND ->
		if
		:: cancel & PEND ->                     /* skip_child */
			result[NS + j]++;
			done++
		:: else ->
			d_step {                        /* fanout_defer: push */
				assert(!recfreed);
				created[j] = 1;
				prefs[j] = 2;
				listed = listed | (1 << j)
			};
#if BUG != 2 && LATE == 0
			recheck(j, won, old);
#endif
			handed[j] = 1;          /* fanout_defer returned p */
#if REG == 1
			register(j, r, claimed, held);
#endif
			/* fn returns -EINPROGRESS */
#if LATE == 2
			cb_step(j, claimed, r, 0);
#endif
#if LATE != 0
			recheck(j, won, old);
#endif
		fi;
		j++
	:: else -> break
	od;
	if
	:: done > 0 -> join_sub(done, old)         /* runner_done */
	:: else
	fi;
	run_exit = 1;
	rec_put()
}

proctype abandoner()
{
	byte how, snap, i, won, claimed, s;
	short old;

	if
	:: how = PEND | INTR
	:: how = PEND | INTR | ABAN
	fi;
	if
	:: remaining == 0 -> goto out           /* -EALREADY */
	:: else
	fi;
	d_step {
		assert(!recfreed);
		old = cancel; cancel = cancel | how;    /* fetch_or, seq_cst */
		if
		:: how & ABAN -> abandoned = 1
		:: else
		fi
	};
	if
	:: old & FINAL -> goto out              /* -EALREADY */
	:: else
	fi;
	snap = listed;                          /* load list head, seq_cst */
	i = 0;
	do
	:: i < ND ->
		if
		:: snap & (1 << i) ->
			cb_step(i, claimed, s, 1);
			if
			:: how & ABAN ->
				finish(i, won, old, 1)
			:: else
			fi
		:: else
		fi;
		i++
	:: else -> break
	od;
out:
	ab_exit++;
	rec_put()
}

proctype completer(byte i)
{
	byte won, r, claimed, held, s;
	short old;

	if
	:: handed[i]
	:: run_exit && !handed[i] -> goto out   /* child skipped: no p */
	fi;
	if
	:: skip                                 /* races: completes any time */
	:: skip ->                              /* ends only on the cancel */
#if REG == 2
		register(i, r, claimed, held);
#endif
		(kick[i] || regret[i] == R_ALREADY)
	fi;
	/* fanout_complete(p[i]) */
	if
	:: st[i] & DONE -> won = 0; goto put   /* acquire load: -EALREADY */
	:: else
	fi;
#if BUG == 1
	assert(!pfreed[i]);
	s = st[i];                              /* plain load ... */
	if
	:: !(s & DONE) ->
		st[i] = st[i] | DONE;           /* ... then store */
		d_step { wins[i]++; won = 1 };
		assert(!recfreed);
		result[NS + i]++;
		join_sub(1, old)
	:: else -> won = 0
	fi;
#else
	finish(i, won, old, 0);
#endif
put:	skip;
	/* -EALREADY only when the library finished it */
	d_step {                                /* drop the completer's ref */
		assert(won || lib_fin[i] == 1);
		if
		:: !won -> reached(3)          /* fanout_complete: -EALREADY */
		:: else
		fi;
		assert(!pfreed[i] && prefs[i] > 0);
		prefs[i]--;
		if
		:: prefs[i] == 0 -> pfreed[i]++
		:: else
		fi
	};
out:
	skip
}

init
{
	byte k;

	atomic {
		run runner();
		k = 0;
		do
		:: k < A -> run abandoner(); k++
		:: else -> break
		od;
		k = 0;
		do
		:: k < ND -> run completer(k); k++
		:: else -> break
		od
	};
	/* the push/abandon race: once an abandoner with ABANDON and the
	 * runner have returned, no child waits for its completer */
	atomic {
		(run_exit && ab_exit == A) ->
		if
		:: abandoned ->
			k = 0;
			do
			:: k < ND ->
				assert(!created[k] || (st[k] & DONE));
				k++
			:: else -> break
			od
		:: else
		fi
	};
	/* everyone has terminated */
	(_nr_pr == 1);
	assert(finalised == 1);
	assert(remaining == 0);
	assert(recfreed);
	d_step { check_slots() };
	k = 0;
	do
	:: k < ND ->
		assert(cbruns[k] <= 1);
		if
		:: created[k] ->
			assert(wins[k] == 1);
			assert(pfreed[k] == 1)
		:: else
		fi;
		k++
	:: else -> break
	od
}
