/*
 * park_wake.pml - idle worker park / wake handshake: no lost wakeup.
 *
 * What it models (queue/fq.c: the worker loop's park path, fq_ec_prepare,
 * fq_ec_wait, fq_ec_done, fq_ec_signal, fq_submit; `nidle` here is the
 * eventcount's `waiters`; see tests/models/README.md):
 * Producer (fq_submit), per item:
 *     enqueue(item);                             P1
 *     seq++;                       seq_cst RMW   P2
 *     if (nidle > 0) futex_wake(&seq, 1);        P3 (seq_cst load)
 * Worker:
 *     for (;;) {
 *         if (dequeue()) { run; continue; }
 *         nidle++;                 seq_cst RMW   W1
 *         v = seq;                 seq_cst load  W2
 *         if (dequeue()) { nidle--; run; continue; }          W3
 *         futex_wait(&seq, v);     sleeps only while seq == v  W4
 *         nidle--;
 *     }
 * futex_wait/futex_wake are modelled as the kernel does them: wait checks
 * the word and queues the caller as a waiter in one atomic step (the hash
 * bucket lock), then sleeps until a wake dequeues it; wake(n) releases up
 * to n queued waiters - any of them, chosen nondeterministically - and is a
 * no-op when none is queued. The spin phase before parking is left out: it
 * only delays the park and changes no outcome. With -DBATCH the producer
 * is fq_submit() proper: it enqueues all K tokens, bumps seq once and wakes
 * up to K sleepers with one call.
 *
 * Property 1 (safety, gcc -DSAFETY): no lost wakeup. The producer makes
 * K items and stops; workers loop forever. When the whole system can no
 * longer move (spin's timeout: every worker asleep in futex_wait, the
 * producer done), every item must have been consumed (assertion in the
 * watchdog). Sleeping in futex_wait is a valid end state (end label);
 * anything else stuck is an invalid one.
 *
 * Property 2 (gcc -DNP, pan -l): no execution runs forever. There are no
 * progress labels, so any cycle at all is reported: a worker that keeps
 * looping without ever sleeping (invariant 5: no thread burns CPU when
 * there is no work) or a livelock that keeps an item queued without the
 * system ever coming to rest, which property 1 alone could not see. Every
 * execution ends, so property 1's end-of-run check covers them all.
 *
 * Sizes: W workers (2 or 3), K items (2); spin -DW=3 -DK=3 widens it.
 *
 * Variants (spin -DBUG=n -a park_wake.pml):
 *   (none)  the protocol above: must verify with errors: 0 (also with
 *           -DBATCH).
 *   BUG=1   check-then-publish: the producer reads nidle BEFORE enqueueing
 *           and bumping seq; a worker that goes idle in between parks on the
 *           new seq value and is never woken, with an item queued.
 *   BUG=2   the worker reads v = seq only AFTER its second dequeue attempt:
 *           an item enqueued (and a wake that found no waiter) between the
 *           two is missed, the worker parks on the new seq.
 *   BUG=3   an idle worker never parks, it just retries (busy-waits):
 *           no item is lost, so the safety run passes, but the non-progress
 *           run (gcc -DNP, pan -l) finds the idle cycle. It shows that the
 *           -DNP run of the correct variant, which finds no cycle at all, is
 *           not vacuous: there an idle system always comes to rest.
 *
 * Spin explores sequentially consistent interleavings only. The handshake
 * is the store-buffering (Dekker) pattern - producer "write seq; read
 * nidle" against worker "write nidle; read seq" - and it is the seq_cst
 * order on W1, W2, P2, P3 (fq.c, argument 2) that rules out the outcome
 * where both reads are stale, which no SC interleaving has. The enqueue
 * itself (P1) is not seq_cst; the worker's W3 still sees it because W2
 * reads P2's value (or a later one), and P2 is a release that W2 acquires
 * with P1 sequenced before it. A weaker P2/P3/W1/W2 (e.g. acq_rel RMW plus
 * a relaxed/acquire load, without a seq_cst fence) would be outside what
 * this model checks.
 */

#ifndef W
#define W 2            /* worker threads (2 or 3) */
#endif
#ifndef K
#define K 2            /* items the producer makes */
#endif

byte items = 0;        /* queued, not yet dequeued */
byte consumed = 0;     /* items run by some worker */
byte seq = 0;          /* the futex word */
byte nidle = 0;        /* workers between "nidle++" and "nidle--" */
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

inline try_dequeue(got)
{
	d_step {
		if
		:: items > 0 -> items--; got = 1
		:: else -> got = 0
		fi
	}
}

proctype producer()
{
	byte n = 0;
	byte idle;

	do
	:: n < K ->
#if BATCH
		/* fq_submit(): enqueue all K tokens, one signal waking K */
		items = K; n = K;
		seq++;                          /* atomic, full barrier */
		if
		:: nidle > 0 -> futex_wake(K)
		:: else
		fi
#elif BUG == 1
		idle = nidle;                   /* checked too early */
		items++;                        /* enqueue */
		seq++;                          /* publish */
		if
		:: idle > 0 -> futex_wake(1)
		:: else
		fi;
		n++
#else
		items++;                        /* enqueue */
		seq++;                          /* atomic, full barrier */
		if
		:: nidle > 0 -> futex_wake(1)
		:: else
		fi;
		n++
#endif
	:: else -> break
	od
}

proctype worker(byte me)
{
	bool got;
	byte v;

loop:
	try_dequeue(got);
	if
	:: got -> goto ran
	:: else
	fi;
	nidle++;                                /* atomic, full barrier */
#if BUG == 2
	try_dequeue(got);
	v = seq;                                /* read too late */
#else
	v = seq;
	try_dequeue(got);
#endif
	if
	:: got -> nidle--; goto ran
	:: else
	fi;
#if BUG == 3
	skip;                                   /* never parks: retries */
#else
	/* futex_wait(&seq, v): check and queue atomically, then sleep */
	d_step {
		if
		:: seq == v -> waiting[me] = 1
		:: else -> skip                 /* EAGAIN: word changed */
		fi
	};
end_sleep:
	!waiting[me];                           /* until a wake dequeues us */
#endif
	nidle--;
	goto loop;
ran:
	consumed++;
	goto loop
}

/* Fires only when no other process can move: every worker is asleep in
 * futex_wait and the producer has finished. Then nothing may be left. */
proctype watchdog()
{
	timeout -> assert(items == 0 && consumed == K)
}

init
{
	atomic {
		run producer();
		run worker(0);
		run worker(1);
#if W > 2
		run worker(2);
#endif
		run watchdog()
	}
}
