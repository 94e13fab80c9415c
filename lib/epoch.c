/* SPDX-License-Identifier: MIT */
/*
 * epoch.c - when may a retired record block be used again?
 *
 * liburcu's call_rcu thread frees a batch about every 10 ms (it sleeps
 * that long between batches), so at two million delegations per second
 * ~20k blocks, 15 MB, wait for it: each dispatch touches a block no cache
 * holds, the heap grows page by page while the load lasts (a page fault
 * every few dozen delegations, 10-40 us each in a guest), and freeing the
 * batch keeps a CPU busy for milliseconds.  Instead, every read-side
 * section (fanout__read_lock) also announces itself here, and a thread
 * that retired a small record keeps its block and hands it to its own
 * next dispatch as soon as no reader can still hold it (record.c,
 * "Limbo"): a block comes back to the thread that last touched it.
 *
 * WHY IT IS CORRECT
 *
 * Readers.  A thread owns a slot in `readers` (a push-only list; a slot
 * whose thread exited is taken over by the next new one).  Entering the
 * outermost section it loads `epoch` (seq_cst), stores `epoch << 1 | 1`
 * in its slot (release) and issues a seq_cst fence F_r; leaving, it
 * stores 0 (release).  A thread without a slot (allocation failed) counts
 * in `anon` instead (then F_r), which holds the epoch still while it is
 * not 0.
 *
 * Retire.  A record becomes unreachable (out of the table, no reference)
 * before it is tagged: the tagger issues a seq_cst fence F_w, then loads
 * `epoch` = T.  The block may be used again once `epoch` >= T + 2.
 *
 * Advance.  An advancer loads `epoch` = G, issues a seq_cst fence F_a,
 * loads every slot (acquire) and `anon`, and CASes G -> G + 1 (acq_rel)
 * only if every reader in a section announced G and `anon` is 0.
 *
 * Claim: once `epoch` >= T + 2, no reader can still touch a record
 * tagged T.  S is the single order of seq_cst operations and fences.
 * - Let B1 be the advance T -> T + 1.  The tagger's load of T is
 *   coherence-ordered before every load of `epoch` that reads B1 or
 *   later; F_w happens before the former, and each of the latter before
 *   the fence that follows it; so F_w precedes that fence in S (the
 *   fence rule of C17 7.17.3, C++20 [atomics.order] 4.4).  A reader
 *   whose load of `epoch` read B1 or later thus has F_w before its F_r,
 *   so its loads after F_r see the record unlinked: it cannot reach it.
 * - Let A be the advancer of T + 1 -> T + 2 and R any reader section.
 *   A's load read B1 or later before F_a, so F_w precedes F_a.  If F_a
 *   precedes R's F_r, so does F_w: R cannot reach the record.  If F_r
 *   precedes F_a, A's scan sees R's announcement (fence-fence) or a later
 *   store: the announcement of an epoch <= T makes A refuse, so it stays
 *   refused while R is inside; R's exit (0) or next announcement are
 *   release stores, so R's section happens before A's scan, before A's
 *   CAS, before the user of the block, who acquires `epoch`.
 * TSan sees that chain: every access here is a C11 atomic.
 *
 * Nesting: only the outermost enter and exit touch the slot.  Fork: the
 * child has one thread, so every other slot is released there.
 */
#include "internal.h"

#include <pthread.h>

struct reader {
	_Atomic uint64_t state;	 /* A: 0, or announced epoch << 1 | 1 */
	_Atomic uint32_t in_use; /* A: 1 while a thread owns the slot */
	uint32_t nest;		 /* W: the owner's section depth */
	struct reader *next;	 /* I once pushed */
} __attribute__((aligned(CACHELINE)));

static _Atomic uint64_t epoch __attribute__((aligned(CACHELINE))) = 1;
static _Atomic(struct reader *) readers __attribute__((aligned(CACHELINE)));
static _Atomic uint64_t anon; /* A: sections of threads without a slot */
static FQ_TLS struct reader *tls_reader;
static FQ_TLS bool tls_anon; /* in an anonymous outermost section */
static FQ_TLS uint32_t tls_anon_nest;

static pthread_key_t exit_key;
static pthread_once_t key_once = PTHREAD_ONCE_INIT;
static bool key_ok; /* written once under key_once */

/* A thread that read-locked exits: its limbo goes to RCU, its slot to the
 * next new thread. */
static void on_thread_exit(void *arg)
{
	struct reader *r = arg;

	fanout__limbo_drain();
	tls_reader = NULL;
	/* release: our last section's accesses before the next owner's. */
	atomic_store_explicit(&r->in_use, 0, memory_order_release);
}

static void make_key(void)
{
	key_ok = pthread_key_create(&exit_key, on_thread_exit) == 0;
}

/* The library is unloaded (dlclose): no destructor may run after. */
__attribute__((destructor)) static void unload(void)
{
	if (key_ok)
		pthread_key_delete(exit_key);
}

static struct reader *get_reader(void)
{
	struct reader *r;
	uint32_t zero = 0;

	pthread_once(&key_once, make_key);
	if (!key_ok)
		return NULL;
	/* acquire: the slots pushed before (their `next`). */
	for (r = atomic_load_explicit(&readers, memory_order_acquire); r;
	     r = r->next) {
		/* relaxed: a look, the CAS decides; its acquire pairs with
		 * the release store of the slot's last owner at its exit. */
		if (!atomic_load_explicit(&r->in_use, memory_order_relaxed) &&
		    atomic_compare_exchange_strong_explicit(
			    &r->in_use, &zero, 1, memory_order_acquire,
			    memory_order_relaxed))
			goto own;
		zero = 0;
	}
	r = fanout__alloc_unchecked(sizeof(*r));
	if (!r)
		return NULL;
	atomic_init(&r->state, 0);
	atomic_init(&r->in_use, 1);
	/* relaxed: a first guess; the CAS below re-reads it. */
	r->next = atomic_load_explicit(&readers, memory_order_relaxed);
	/* release: publishes the slot's initialisation and `next`. */
	while (!atomic_compare_exchange_weak_explicit(&readers, &r->next, r,
						      memory_order_release,
						      memory_order_relaxed))
		;
own:
	r->nest = 0;
	if (pthread_setspecific(exit_key, r)) {
		/* release: as at a thread's exit (on_thread_exit). */
		atomic_store_explicit(&r->in_use, 0, memory_order_release);
		return NULL;
	}
	return r;
}

void fanout__epoch_enter(void)
{
	struct reader *r = tls_reader;
	uint64_t g;

	if (!r && !tls_anon_nest)
		r = tls_reader = get_reader();
	if (!r) {
		if (tls_anon_nest++ == 0) {
			tls_anon = true;
			/* relaxed: F_r below orders it. */
			atomic_fetch_add_explicit(&anon, 1,
						  memory_order_relaxed);
			/* F_r of an anonymous reader. */
			atomic_thread_fence(memory_order_seq_cst);
		}
		return;
	}
	if (r->nest++)
		return;
	/* seq_cst: the load the claim's fence order needs (see above). */
	g = atomic_load_explicit(&epoch, memory_order_seq_cst);
	/* release: our previous sections happen before an advancer that
	 * reads this announcement. */
	atomic_store_explicit(&r->state, g << 1 | 1, memory_order_release);
	/* F_r: pairs with F_w (retire) and F_a (advance). */
	atomic_thread_fence(memory_order_seq_cst);
}

bool fanout__epoch_hooked(void)
{
	if (!tls_reader && !tls_anon_nest)
		tls_reader = get_reader();
	return tls_reader != NULL;
}

void fanout__epoch_exit(void)
{
	struct reader *r = tls_reader;

	if (tls_anon_nest) {
		if (--tls_anon_nest == 0) {
			tls_anon = false;
			/* release: our section's accesses before an advance
			 * that reads 0. */
			atomic_fetch_sub_explicit(&anon, 1,
						  memory_order_release);
		}
		return;
	}
	if (--r->nest)
		return;
	/* release: our section's accesses happen before the advancer's
	 * acquire load of the slot. */
	atomic_store_explicit(&r->state, 0, memory_order_release);
}

uint64_t fanout__epoch_tag(void)
{
	/* F_w: after the unlinks of what is being tagged; pairs with F_r. */
	atomic_thread_fence(memory_order_seq_cst);
	/* relaxed: F_w above orders it after the unlinks. */
	return atomic_load_explicit(&epoch, memory_order_relaxed);
}

/* Try once to move the epoch on; its value after. */
static uint64_t advance(void)
{
	/* acquire: a CAS by another advancer, and what it saw. */
	uint64_t g = atomic_load_explicit(&epoch, memory_order_acquire);
	struct reader *r;

	/* F_a: pairs with the readers' F_r. */
	atomic_thread_fence(memory_order_seq_cst);
	/* acquire: pairs with an anonymous reader's release decrement. */
	if (atomic_load_explicit(&anon, memory_order_acquire))
		return g;
	/* acquire: the slots' initialisation (get_reader's release). */
	for (r = atomic_load_explicit(&readers, memory_order_acquire); r;
	     r = r->next) {
		/* acquire: pairs with a reader's release store at exit, or
		 * orders after its next F_r. */
		uint64_t s =
			atomic_load_explicit(&r->state, memory_order_acquire);

		if ((s & 1) && s >> 1 != g)
			return g;
	}
	/* acq_rel: publishes the scan's acquires to whoever reads G + 1. */
	if (atomic_compare_exchange_strong_explicit(&epoch, &g, g + 1,
						    memory_order_acq_rel,
						    memory_order_acquire))
		return g + 1;
	return g; /* moved meanwhile: g holds the newer value */
}

bool fanout__epoch_safe(uint64_t tag, bool try_advance)
{
	/* acquire: the advancer's CAS, and every reader exit it saw. */
	uint64_t g = atomic_load_explicit(&epoch, memory_order_acquire);

	if (g >= tag + 2)
		return true;
	return try_advance && advance() >= tag + 2;
}

void fanout__epoch_fork_child(void)
{
	struct reader *r;

	/* relaxed, here and below: the child has one thread. */
	atomic_store_explicit(&anon, tls_anon ? 1 : 0, memory_order_relaxed);
	for (r = atomic_load_explicit(&readers, memory_order_relaxed); r;
	     r = r->next) {
		if (r == tls_reader)
			continue;
		atomic_store_explicit(&r->state, 0, memory_order_relaxed);
		atomic_store_explicit(&r->in_use, 0, memory_order_relaxed);
	}
}
