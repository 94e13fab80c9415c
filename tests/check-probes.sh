#!/bin/sh
# USDT probes (lib/probes.h) are really in what we ship.
#
# 1. Every probe whose macro is CALLED somewhere in lib/ or queue/ must have
#    its note (readelf -n, .note.stapsdt, provider "fanout") in the test
#    archive, the installed archive and libfanout.so, with as many
#    arguments as its STAP_PROBEn says and a semaphore address.  Probes
#    defined but not called yet are listed, not failed: the call sites of
#    batch__submit, child__start, child__done, batch__done, cancel, defer
#    and complete belong to lib/deleg.c, join.c and record.c, and each is
#    checked here from the moment it is called.
# 2. If gdb works here, the probes placed so far fire with the right
#    arguments in a real run, and worker__wake's semaphore-guarded argument
#    is computed while a tracer (gdb) is attached.
# Usage: tests/check-probes.sh   (after make all)
set -eu
fail() {
	echo "check-probes: $*" >&2
	exit 1
}
hdr=lib/probes.h
bins="build/plain/libfanout.a build/plain/dist/libfanout.a build/plain/libfanout.so"
for b in $bins; do test -f "$b" || fail "$b missing (make all first)"; done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# "MACRO name nargs" for every probe defined in probes.h (continuation
# lines joined first).
sed -e ':a' -e '/\\$/N; s/\\\n//; ta' "$hdr" |
	sed -nE 's/^#define (FANOUT_PROBE_[A-Z_]+)\([^)]*\)[[:space:]]*STAP_PROBE([0-9]+)\(fanout, ([a-z_]+).*/\1 \3 \2/p' \
	> "$tmp/defined"
[ -s "$tmp/defined" ] || fail "no STAP_PROBEn(fanout, ...) in $hdr"

# Called: MACRO( in a .c file of lib/ or queue/.
called=""
pending=""
while read -r macro name nargs; do
	if grep -lE "\\b$macro\\(" lib/*.c queue/*.c >/dev/null 2>&1; then
		called="$called $name:$nargs"
	else
		pending="$pending $name"
	fi
done < "$tmp/defined"

# Does this build have probes at all?
if ! readelf -n build/plain/libfanout.so | grep -q 'Provider: fanout'; then
	[ -z "$called" ] ||
		fail "no fanout probes in libfanout.so: is <sys/sdt.h> (Debian systemtap-sdt-dev) installed?"
fi

for b in $bins; do
	# "name nargs semaphore" per note.
	readelf -n "$b" | awk '
		/Provider: fanout/ { p = 1; next }
		/Provider:/ { p = 0 }
		p && /Name:/ { name = $2 }
		p && /Semaphore:/ { sem = $NF }
		p && /Arguments:/ { print name, NF - 1, sem; p = 0 }
		' | sort -u > "$tmp/notes"
	readelf -rW "$b" | sed -n '/rela\.note\.stapsdt/,/^$/p' > "$tmp/relocs"
	for pn in $called; do
		name=${pn%%:*}
		nargs=${pn##*:}
		line=$(awk -v n="$name" '$1 == n' "$tmp/notes" | head -1)
		[ -n "$line" ] || fail "probe fanout:$name is called but not in $b"
		set -- $line
		[ "$2" = "$nargs" ] ||
			fail "fanout:$name has $2 arguments in $b, STAP_PROBE$nargs in $hdr"
		# The semaphore: an address in the .so, a relocation against
		# fanout_<name>_semaphore in an archive's object.
		case $b in
		*.so)
			case $3 in 0x0000000000000000 | 0)
				fail "fanout:$name has no semaphore in $b" ;;
			esac ;;
		*)
			grep -q " fanout_${name}_semaphore + 0" "$tmp/relocs" ||
				fail "fanout:$name has no semaphore in $b" ;;
		esac
	done
	# Nothing in the binary that probes.h does not define.
	for name in $(awk '{print $1}' "$tmp/notes"); do
		grep -q " $name " "$tmp/defined" || fail "$b has probe fanout:$name, not in $hdr"
	done
done
ncalled=$(echo $called | wc -w)
echo "check-probes: $ncalled probes called and present in $(echo $bins | wc -w) binaries:$(echo "$called" | sed 's/:[0-9]*//g')"
[ -z "$pending" ] || echo "check-probes: defined, not called yet (TODO):$pending"

# 2. A real run under gdb, which sets probe breakpoints and raises their
# semaphores as perf and bpftrace do.
if ! command -v gdb >/dev/null 2>&1; then
	echo "check-probes: gdb not installed; run-time check skipped"
	exit 0
fi
cat > "$tmp/p.c" <<'PROG'
#include <fanout.h>
#include <errno.h>
#include <time.h>
static int nop(struct fanout_child *c, void *a)
{
	(void)c;
	(void)a;
	return 0;
}
static int until_interrupted(struct fanout_child *c, void *a)
{
	struct timespec ts = {0, 1000000};

	(void)a;
	while (!fanout_interrupted(c))
		nanosleep(&ts, NULL);
	return -ECANCELED;
}
int main(void)
{
	/* one worker that parks at once */
	struct fanout_config cfg = {.workers = 1, .spin_ns = 1,
				    .max_async = 1, .flags = FANOUT_NO_PIN};
	struct fanout_engine *e;
	struct fanout_event *ev;
	struct fanout_task t = {"nop", nop, NULL};
	struct fanout_batch b = {.tasks = &t, .ntasks = 1};
	struct fanout_batch bad = {.tasks = &t, .ntasks = 0};
	struct fanout_task w = {"wait", until_interrupted, NULL};
	struct fanout_batch bw = {.tasks = &w, .ntasks = 1};
	struct fanout_batch bd = {.tasks = &w, .ntasks = 1,
				  .deadline_ns = 1000000};
	fanout_id id;
	struct timespec ts = {0, 20000000};

	if (fanout_create(&cfg, &e))
		return 1;
	nanosleep(&ts, NULL); /* the worker parks */
	if (fanout_dispatch(e, &b, NULL) || /* ... and is woken */
	    fanout_wait(fanout_default_sink(e), &ev, 10000))
		return 1;
	fanout_event_free(ev);
	if (fanout_dispatch(e, &bad, NULL) != -EINVAL) /* reject */
		return 1;
	/* cancel(INTERRUPT, from fanout_cancel), then cancel(INTERRUPT |
	 * ABANDON, from the deadline) */
	/* bw holds the one max_async slot: a delegate at top level runs
	 * inline (not a refusal, so no reject probe) */
	if (fanout_dispatch(e, &bw, &id) ||
	    fanout_delegate(e, &b, NULL, &ev) != FANOUT_INLINE_FULL)
		return 1;
	fanout_event_free(ev);
	if (fanout_cancel(e, id, FANOUT_CANCEL_INTERRUPT) ||
	    fanout_wait(fanout_default_sink(e), &ev, 10000))
		return 1;
	fanout_event_free(ev);
	if (fanout_dispatch(e, &bd, NULL) ||
	    fanout_wait(fanout_default_sink(e), &ev, 10000) || !ev->timed_out)
		return 1;
	fanout_event_free(ev);
	fanout_destroy(e);
	return 0;
}
PROG
cc -g -Iinclude "$tmp/p.c" -o "$tmp/p" build/plain/dist/libfanout.a \
	-lurcu-bp -lurcu-cds -lurcu-common -lck -lpthread -lm
cat > "$tmp/g.gdb" <<'GDB'
set pagination off
set confirm off
break -probe-stap fanout:worker__park
commands
silent
printf "PROBE worker__park %d %d\n", $_probe_arg0, $_probe_arg1
continue
end
break -probe-stap fanout:worker__wake
commands
silent
printf "PROBE worker__wake %d %lu\n", $_probe_arg0, $_probe_arg1
continue
end
break -probe-stap fanout:cancel
commands
silent
printf "PROBE cancel how %d\n", $_probe_arg1
printf "PROBE cancel source %d\n", $_probe_arg2
continue
end
break -probe-stap fanout:reject
commands
silent
printf "PROBE reject %d\n", $_probe_arg0
continue
end
run
GDB
if ! timeout 120 gdb -batch -nx -x "$tmp/g.gdb" "$tmp/p" > "$tmp/out" 2>&1 ||
	! grep -q '^\[Inferior 1 (process [0-9]*) exited normally\]' "$tmp/out"; then
	if grep -qiE 'ptrace|Operation not permitted' "$tmp/out"; then
		echo "check-probes: gdb cannot trace here; run-time check skipped"
		exit 0
	fi
	cat "$tmp/out" >&2
	fail "the probe program failed under gdb"
fi
grep -q '^PROBE worker__park 0 -1$' "$tmp/out" ||
	fail "worker__park(0, -1) did not fire"
# slept_ns > 0 only if the guarded clock read ran: the semaphore was up.
awk '$1 == "PROBE" && $2 == "worker__wake" && $3 == 0 && $4 > 0 {ok = 1}
	END {exit !ok}' "$tmp/out" ||
	fail "worker__wake(0, slept_ns > 0) did not fire (semaphore not raised?)"
grep -q '^PROBE reject -22$' "$tmp/out" || fail "reject(-EINVAL) did not fire"
grep -q '^PROBE reject -16$' "$tmp/out" &&
	fail "reject(-EBUSY) fired for a delegate that ran inline (FANOUT_INLINE_FULL)"
# how: the FANOUT_CANCEL_* bits as asked; source: who asked (README).
grep -q '^PROBE cancel how 2$' "$tmp/out" &&
	grep -q '^PROBE cancel source 16$' "$tmp/out" ||
	fail "cancel(how 2, source 0x10) did not fire for fanout_cancel(INTERRUPT)"
grep -q '^PROBE cancel how 6$' "$tmp/out" &&
	grep -q '^PROBE cancel source 64$' "$tmp/out" ||
	fail "cancel(how 6, source 0x40) did not fire for a deadline"
echo "check-probes: under gdb, worker__park, worker__wake (semaphore-guarded slept_ns), reject and cancel fired with their arguments"
