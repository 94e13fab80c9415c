/*
 * epoch.pml - when a retired record block may be reused (lib/epoch.c,
 * lib/record.c "Limbo").
 *
 * Readers (fanout__read_lock sections: lookups, lists, cancels) load the
 * slot of a record and use the record until they leave.  The retirer
 * unlinks the record (the slot's exchange), tags it with the epoch, and
 * reuses the block once the epoch reached tag + 2, moving the epoch on
 * itself (advance: every reader inside a section announced the current
 * epoch, then CAS).  A second advancer stands for other threads' limbo
 * takes.  Each reader runs R sections.
 *
 * Checked: no reader touches the block after it was reused (assert at each
 * use); nothing hangs (spin's invalid end states).
 *
 * Atomicity mirrors the C code under sequential consistency, which the
 * seq_cst fences F_r, F_w, F_a of epoch.c give the orders used here: a
 * reader's load of the epoch, its announcement and its load of the slot
 * are three steps; the tagger's unlink, then its load of the epoch; an
 * advancer's load of the epoch, then one step per reader slot, then the
 * CAS.
 *
 * Seeded bugs (spin -DBUG=n must find them):
 *   1: reuse at tag + 1;
 *   2: the tag is read before the unlink;
 *   3: the advance skips readers that announced an older epoch;
 *   4: the reader loads the slot before it announces itself.
 */
#ifndef R
#define R 2 /* sections per reader */
#endif
#define NR 2 /* readers */

byte epoch = 1;
bool slot = true;   /* the table still points to the record */
bool reused = false;
bool inside[NR];
byte ann[NR];	    /* announced epoch, valid while inside */

/* Locals g, i, ok are declared by each caller (Promela inlines share
 * their caller's scope). */
inline advance()
{
	ok = true;
	g = epoch;
	i = 0;
	do
	:: i < NR ->
#if BUG == 3
		skip;
#else
		if
		:: inside[i] && ann[i] != g -> ok = false
		:: else -> skip
		fi;
#endif
		i++
	:: else -> break
	od;
	if
	:: ok -> atomic { if :: epoch == g -> epoch = g + 1 :: else -> skip fi }
	:: else -> skip
	fi
}

proctype reader(byte me)
{
	byte k = 0, e;
	bool hold;
	do
	:: k < R ->
#if BUG == 4
		hold = slot;
#endif
		e = epoch;
		atomic { ann[me] = e; inside[me] = true };
#if BUG != 4
		hold = slot;
#endif
		if
		:: hold -> assert(!reused); /* first use */
			   assert(!reused)  /* a later one */
		:: else -> skip
		fi;
		inside[me] = false;
		hold = false;
		k++
	:: else -> break
	od
}

proctype retirer()
{
	byte tag, need, g, i;
	bool ok;
#if BUG == 2
	tag = epoch;
	slot = false;
#else
	slot = false;
	tag = epoch;
#endif
#if BUG == 1
	need = tag + 1;
#else
	need = tag + 2;
#endif
	do
	:: epoch >= need -> break
	:: else -> advance()
	od;
	reused = true
}

proctype advancer()
{
	byte n = 0, g, i;
	bool ok;
	do
	:: n < 3 -> advance(); n++
	:: else -> break
	od
}

init {
	atomic {
		run reader(0);
		run reader(1);
		run retirer();
		run advancer()
	}
}
