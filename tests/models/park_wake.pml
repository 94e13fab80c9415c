/*
 * park_wake.pml - idle worker spin / park / wake handshake: no worker
 * sleeps while a token waits that no awake worker will take.
 *
 * What it models (queue/fq.c: kick, fq_submit, stop_spinning,
 * took_while_spinning, worker_main, fq_ec_prepare / fq_ec_wait /
 * fq_ec_done; "WHY IT IS CORRECT", arguments 2 and 3; `nidle` here is the
 * eventcount's `waiters`; see tests/models/README.md):
 *
 * kick(n) (fq_submit's tail, and a spinner's hand-on):
 *     fence;                        seq_cst fence (SC here: implicit)
 *     s = spinning;                 seq_cst load
 *     if (n > s && nidle > 0) {     seq_cst load  P3
 *         seq++;                    seq_cst RMW   P2
 *         wake(n - s);
 *     }
 * (when the spinners cover the tokens, or nobody is parked, seq is not
 * touched at all; -DP2FIRST models the older order, seq++ before the
 * load of nidle, which verifies too)
 * wake(m) (fq.c's wake(); only a producer has a CPU to prefer, a hand-on
 * passes cpu = -1 and goes straight to the plain wake):
 *     k = FUTEX_WAKE_BITSET(&seq, 1, bit of the worker on the caller's CPU)
 *         if that worker's `asleep` hint is set, else k = 0;
 *     if (k < m) futex_wake(&seq, m - k);
 * The targeted wake and the plain one are two system calls: anything may
 * happen between them.  Which worker is preferred, and whether the hint
 * is stale (set while the worker is not queued yet, or already woken), is
 * chosen nondeterministically.
 * Producer, per fq_submit(n): enqueue n tokens (P1); kick(n).
 * Worker (FIX=0: worker_main BEFORE the fix; FIX=1, the default, is the
 * code as it is now - see below):
 *     for (;;) {
 *         if (take()) { run; continue; }
 *         spinning++;               seq_cst RMW   S1
 *         spin until the ring is non-empty or the deadline passes
 *         if (take()) { took_while_spinning(); run; continue; }
 *         nidle++;                  seq_cst RMW   W1
 *         v = seq;                  seq_cst load  W2
 *         if (take()) { nidle--; took_while_spinning(); run; continue; }  W3
 *         spinning--;               seq_cst RMW   S2 (stop_spinning)
 *         futex_wait(&seq, v);      sleeps only while seq == v           W4
 *         nidle--;
 *     }
 *     took_while_spinning(): spinning--; hand_on();
 *     hand_on():             left = ring size; if (left) kick(left);
 * (fq_stop and the `stopping` exits are not modelled: the queue is never
 * stopped here; shutdown_drain.pml covers the stop ordering.)
 *
 * FIX=0 FAILS (this is the bug spin found in fq.c, now fixed): a worker between W3 and S2 is still counted, so two
 * fq_submit(1) calls can both skip the wake on its account; its W4 then
 * returns EAGAIN (seq moved), and its next take is the plain one at the
 * top of the loop - it takes ONE token, hands nothing on, and if that
 * token blocks, the other waits while a second worker sleeps. Candidate
 * fixes (both verify; FIX=1 is what fq.c now does, and the default):
 *   FIX=1   stop_spinning BEFORE fq_ec_prepare (S2 before W1), and a take
 *           at the re-check W3 hands on: nidle--; hand_on() (no second
 *           decrement). Every token a producer left to the spinner was
 *           enqueued before S2 < W2, so the re-check sees it (W2 reads seq
 *           from P2 or later and acquires it) and hands on what it leaves.
 *   FIX=2   keep the order, but after S2 take once more; if that take
 *           succeeds: nidle--; hand_on().
 *
 * futex_wait/futex_wake are modelled as the kernel does them: wait checks
 * the word and queues the caller as a waiter in one atomic step (the hash
 * bucket lock), then sleeps until a wake dequeues it; wake(n) releases up
 * to n queued waiters - any of them, chosen nondeterministically - and is a
 * no-op when none is queued. The spin loop only reads the ring size and
 * may end at any moment (its deadline), with or without a token in sight;
 * it is modelled as the window between S1 and the next take, in which
 * every other process may move any number of steps (a spin that "sees" a
 * token is that take succeeding, a spin that times out is it failing).
 *
 * A running token may block: at most one token, chosen
 * nondeterministically when it starts to run, is a child that waits for
 * its siblings - it finishes only after every other token has finished
 * (done == K - 1). Its worker is then busy "forever": the spinner a
 * producer counted on takes a DIFFERENT token and blocks on it.
 *
 * Property 1 (safety, gcc -DSAFETY): no lost wakeup. The producers make K
 * tokens and stop; workers loop forever. Sleeping in futex_wait is a valid
 * end state (end label); a blocked child is not, and neither is anything
 * else stuck. When the whole system can no longer move (spin's timeout:
 * every worker asleep or blocked, the producers done) every token must
 * have run to the end (watchdog assertion): a token left in the ring with
 * its potential takers asleep fails it, and so does the blocked child that
 * such a token's sibling then never releases.
 *
 * Property 2 (gcc -DNP, pan -l): no execution runs forever. There are no
 * progress labels, so any cycle at all is reported: a worker that keeps
 * looping without ever sleeping (invariant 5: no thread burns CPU when
 * there is no work), or a livelock of kicks and EAGAIN returns that keeps
 * the system from coming to rest, which property 1 alone could not see.
 * Every execution ends, so property 1's end-of-run check covers them all.
 * (pan -DNP still checks the assertion and end states along the way.)
 *
 * Sizes: W workers (2 or 3), K tokens (2 or 3). The producer calls
 * fq_submit K times with one token each; -DBATCH makes it one fq_submit
 * of K tokens (a batch dispatch; FIX=0 verifies in this form: one kick
 * never counts the same spinner twice); -DP=2 runs two producers, each
 * calling fq_submit K/2 times with one token (racing dispatchers).
 *
 * Seeded bugs (spin -DBUG=n; models.mk runs them on the FIX=1 base, which
 * verifies - on FIX=0 they would be "caught" by the real bug):
 *   BUG=1   check-then-publish: the producer reads nidle BEFORE enqueueing
 *           and bumping seq; a worker that parks in between sleeps on the
 *           new seq value, never woken, with a token queued.
 *   BUG=2   the worker reads v = seq only AFTER its re-check: a token
 *           enqueued (and a kick that found no waiter) between the two is
 *           missed, the worker parks on the new seq.
 *   BUG=3   an idle worker never parks, it just retries (busy-waits): no
 *           token is lost, so the safety run passes, but the non-progress
 *           run (gcc -DNP, pan -l) finds the idle cycle. It shows that a
 *           -DNP run that finds no cycle at all is not vacuous.
 *   BUG=4   took_while_spinning does not kick (a plain stop_spinning after
 *           the spin's take): the producer counted the spinner for token 2
 *           and skipped the wake, the spinner took token 1 and blocks on
 *           it, token 2 waits with the other worker asleep (what
 *           test_dispatch's dispatch_idle_worker_not_left_asleep found).
 *   BUG=6   wake() makes the plain wake only when no targeted wake was
 *           tried (counting a tried one as a success): a batch of two
 *           tokens wakes the preferred worker alone, or nobody when the
 *           preferred one was not queued; the other token waits with a
 *           worker asleep.
 *   BUG=7   the producer reads `spinning` BEFORE it enqueues (what kick()
 *           would allow on a CPU with a store buffer without its fence,
 *           and a worker without the fence after its decrement): it counts
 *           a spinner that has already left, skips the wake, and the
 *           token waits with every worker asleep.
 *   BUG=5   the worker stops counting as a spinner BEFORE it announces
 *           itself and re-checks, and a take at the re-check is then a
 *           plain take (it no longer counts as a spinner: nothing handed
 *           on): tokens left to it while it was counted are stranded. The
 *           early decrement alone is FIX=1; what BUG=5 drops is its
 *           hand-on.
 *
 * Spin explores sequentially consistent interleavings only. The handshakes
 * are store-buffering (Dekker) patterns - producer "enqueue; fence; read
 * spinning" against worker "write spinning; fence; read the ring", and
 * producer "write seq; read nidle" against worker "write nidle; read seq /
 * the ring" - and it is the seq_cst order on S1, S2, W1, W2, P2, kick's
 * fence and loads and stop_spinning's fence (fq.c, arguments 2 and 3) that
 * rules out the outcomes where both reads are stale, which no SC
 * interleaving has. The enqueue (P1), takes and ring-size reads are not
 * seq_cst: a take or size read sequenced after W2 still sees P1 when W2
 * reads P2's value or a later one (P2 heads a release sequence of seq
 * RMWs that W2 acquires); a take or size read after S2 (stop_spinning's
 * decrement and fence) sees every P1 whose producer's load of spinning,
 * after its fence, counted the spinner (the C11 fence-fence rule). BUG=7
 * is what is left without those fences: the load of spinning done before
 * the enqueue.
 */

#ifndef W
#define W 2            /* worker threads (2 or 3) */
#endif
#ifndef K
#define K 2            /* tokens the producers submit */
#endif
#ifndef P
#define P 1            /* producers (1, or 2 with K even) */
#endif
#ifndef FIX
#define FIX 1          /* 1: fq.c as it is (fixed); 0: the code before the fix; 2: an alternative fix */
#endif

byte items = 0;        /* tokens in the ring */
byte done = 0;         /* tokens run to the end */
bool blocker = 0;      /* some token was chosen to block on its siblings */
byte seq = 0;          /* the futex word */
byte nidle = 0;        /* eventcount waiters: between W1 and nidle-- */
byte spinning = 0;     /* workers counted as spinners: S1 .. S2 */
bool waiting[W];       /* futex wait queue on &seq: worker i is queued */
byte nw = 0;           /* scratch for futex_wake, inside atomic only */

/* futex_wake(&seq, n): release up to n queued waiters, any of them (the
 * choice is nondeterministic: atomic, not d_step), in one kernel step */
inline futex_wake(n)
{
	atomic {
		nw = n;
		do
		:: nw > 0 && waiting[0] -> waiting[0] = 0; nw--
		:: nw > 0 && waiting[1] -> waiting[1] = 0; nw--
		:: nw > 0 && W > 2 && waiting[2] -> waiting[2] = 0; nw--
		:: else -> break        /* n woken, or nobody left queued */
		od;
		nw = 0
	}
}

/* wake(m) with a preferred worker.  First FUTEX_WAKE_BITSET(&seq, 1, bit
 * of the preferred worker), one kernel step: it dequeues that worker if it
 * is queued (any of them may be the preferred one), else wakes nobody (a
 * stale hint); or it is not tried at all (the hint was unset).  k = how
 * many it woke, 2 if not tried.  Then, as a separate kernel call, the
 * plain wake for the rest of the count.  `k` is the caller's scratch. */
inline wake_pref(m, k)
{
	atomic {
		if
		:: waiting[0] -> waiting[0] = 0; k = 1
		:: waiting[1] -> waiting[1] = 0; k = 1
		:: W > 2 && waiting[2] -> waiting[2] = 0; k = 1
		:: k = 0                        /* preferred one not queued */
		:: k = 2                        /* hint unset: not tried */
		fi
	};
	atomic {
		if
		:: k == 2 -> futex_wake(m)
#if BUG == 6
		:: else                         /* tried: counted as a success */
#else
		:: k != 2 && k < m -> futex_wake(m - k)
		:: else
#endif
		fi;
		k = 0
	}
}

/* kick(q, n, cpu): the load of spinning (after kick's fence), then only if
 * the spinners do not cover the tokens P2 and P3 (the load of nidle), then
 * wake(); `pref`: a producer's kick (it prefers the worker on
 * its CPU), else a hand-on's (cpu = -1: the plain wake alone). `s` and `k`
 * are the caller's scratch locals, cleared in the step after. */
inline kick(n, s, k, pref)
{
	s = spinning;                           /* after the fence */
	if
	:: n > s ->
#if P2FIRST
		seq++;                          /* P2: atomic, full barrier */
#endif
		if
		:: nidle > 0 ->                 /* P3 */
#if !P2FIRST
			seq++;                  /* P2, only for a sleeper */
#endif
			if
			:: pref -> s = n - s; wake_pref(s, k); s = 0
			:: else -> atomic { futex_wake(n - s); s = 0 }
			fi
		:: else -> s = 0
		fi
	:: else -> s = 0
	fi
}

/* take(): ck_ring_dequeue_mpmc, one atomic step */
inline take(got)
{
	d_step {
		if
		:: items > 0 -> items--; got = 1
		:: else -> got = 0
		fi
	}
}

/* one producer thread: `subs` calls of fq_submit(q, w, per) */
proctype producer(byte subs; byte per)
{
	byte n = 0;
	byte s = 0;
	byte k = 0;
#if BUG == 1
	byte idle;
#endif

	do
	:: n < subs ->
#if BUG == 1
		idle = nidle;                   /* checked too early */
		items = items + per;            /* P1: enqueue */
		seq++;                          /* P2 */
		s = spinning;
		if
		:: per > s && idle > 0 -> atomic { futex_wake(per - s); s = 0 }
		:: else -> s = 0
		fi;
		idle = 0;
#else
#if BUG == 7
		s = spinning;                   /* read before the enqueue */
		items = items + per;            /* P1 */
		if
		:: per > s ->
			seq++;
			if
			:: nidle > 0 -> s = per - s; wake_pref(s, k); s = 0
			:: else -> s = 0
			fi
		:: else -> s = 0
		fi;
#else
		items = items + per;            /* P1: enqueue `per` tokens */
		kick(per, s, k, 1);
#endif
#endif
		n++
	:: else -> break
	od
}

proctype worker(byte me)
{
	bool got;
	byte v = 0;
	byte s = 0;
	byte k = 0;
	byte left = 0;

loop:
	take(got);
	if
	:: got -> got = 0; goto ran             /* plain take: no hand-on */
	:: else
	fi;
	spinning++;                             /* S1: atomic, full barrier */
	/* the spin: any number of other steps; ends with or without a token */
	take(got);
	if
	:: got -> got = 0; goto took
	:: else
	fi;
#if FIX == 1 || BUG == 5
	spinning--;                             /* S2 before the announcement */
#endif
	nidle++;                                /* W1: atomic, full barrier */
#if BUG == 2
	take(got);
	v = seq;                                /* W2 read too late */
#else
	v = seq;                                /* W2 */
	take(got);                              /* W3: the re-check */
#endif
	if
	:: got ->
		got = 0; v = 0;
		nidle--;                        /* fq_ec_done */
#if BUG == 5
		goto ran                        /* not counted any more: plain */
#elif FIX == 1
		goto handon                     /* was counted until S2 */
#else
		goto took                       /* still counted */
#endif
	:: else
	fi;
#if FIX != 1 && BUG != 5
	spinning--;                             /* S2: stop_spinning */
#endif
#if FIX == 2 && BUG != 5
	take(got);                              /* once more, after S2 */
	if
	:: got -> got = 0; v = 0; nidle--; goto handon
	:: else
	fi;
#endif
#if BUG == 3
	v = 0                                   /* never parks: retries */
#else
	/* futex_wait(&seq, v): check and queue atomically, then sleep */
	d_step {
		if
		:: seq == v -> waiting[me] = 1
		:: else -> skip                 /* EAGAIN: word changed */
		fi;
		v = 0
	};
end_sleep:
	!waiting[me];                           /* until a wake dequeues us */
#endif
	nidle--;                                /* fq_ec_done */
	goto loop;

took:	/* took_while_spinning() */
	spinning--;                             /* stop_spinning: seq_cst */
#if BUG == 4
	goto ran;                               /* no hand-on */
#endif
handon:	/* hand_on(): pass on what producers left to a counted spinner */
	left = items;                           /* ck_ring_size */
	if
	:: left > 0 -> kick(left, s, k, 0); left = 0
	:: else
	fi;
ran:	/* run_item: at most one token blocks until all others are done */
	if
	:: atomic { !blocker -> blocker = 1 };
		done == K - 1;                  /* a child waiting on siblings */
		done++
	:: done++
	fi;
	goto loop
}

/* Fires only when no other process can move: every worker is asleep in
 * futex_wait (or blocked on its child) and the producers have finished.
 * Then every token must have run to the end. */
proctype watchdog()
{
	timeout -> assert(items == 0 && done == K)
}

init
{
	atomic {
#if BATCH
		run producer(1, K);
#elif P == 2
		run producer(K / 2, 1);
		run producer(K / 2, 1);
#else
		run producer(K, 1);
#endif
		run worker(0);
		run worker(1);
#if W > 2
		run worker(2);
#endif
		run watchdog()
	}
}
