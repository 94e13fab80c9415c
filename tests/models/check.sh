#!/bin/sh
# Run one Promela model variant through spin and check the verdict.
# Usage: tests/models/check.sh NAME MODEL.pml EXPECT \
#            'SPIN_FLAGS' 'CC_FLAGS' 'PAN_FLAGS'
#   NAME      scratch dir name under $MODELS_OUT (default build/models)
#   EXPECT    pass  - pan must report errors: 0 and a complete search
#             fail  - pan must report errors > 0 (a seeded bug was caught)
#   SPIN_FLAGS e.g. '-DBUG=1'           (passed to spin -a)
#   CC_FLAGS   e.g. '-DSAFETY' or '-DNP' (passed to gcc building pan)
#   PAN_FLAGS  e.g. '-l' for a non-progress search
# Needs only spin, gcc and a POSIX shell. Exit 0 when the verdict is the
# expected one, 1 otherwise (with pan's output and the replayed trail).
set -u
name=$1 model=$2 expect=$3 spinflags=${4:-} ccflags=${5:-} panflags=${6:-}
out=${MODELS_OUT:-build/models}/$name
SPIN=${SPIN:-spin}
MODEL_CC=${MODEL_CC:-gcc}
# pan's memory cap in MB: a run that needs more stops and counts as
# incomplete instead of swapping the machine to death.
MODELS_MEMLIM=${MODELS_MEMLIM:-2048}

rm -rf "$out" && mkdir -p "$out" || exit 1
cp "$model" "$out/" || exit 1
base=$(basename "$model")
cd "$out" || exit 1

now() { date +%s.%N 2>/dev/null || date +%s; }
t0=$(now)
# shellcheck disable=SC2086
if ! $SPIN $spinflags -a "$base" >spin.log 2>&1; then
	echo "models: $name: spin -a failed:" >&2; cat spin.log >&2; exit 1
fi
# shellcheck disable=SC2086
if ! $MODEL_CC -O2 -w -DMEMLIM="$MODELS_MEMLIM" $ccflags -o pan pan.c \
	>cc.log 2>&1; then
	echo "models: $name: building pan failed:" >&2; cat cc.log >&2; exit 1
fi
# shellcheck disable=SC2086
./pan $panflags >pan.out 2>&1
t1=$(now)

errors=$(sed -n 's/.*errors: \([0-9][0-9]*\).*/\1/p' pan.out | tail -n 1)
states=$(sed -n 's/^ *\([0-9.e+]*\) states, stored.*/\1/p' pan.out | tail -n 1)
pantime=$(sed -n 's/^pan: elapsed time \([0-9.e+-]*\) seconds.*/\1/p' pan.out |
	tail -n 1)
wall=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }')
what=$(grep -m 1 -E '^pan:1: ' pan.out | sed 's/^pan:1: //')
mode="${ccflags#-D}${spinflags:+ $spinflags}${panflags:+ pan $panflags}"

if [ -z "$errors" ]; then
	echo "models: $name: no verdict from pan:" >&2; cat pan.out >&2; exit 1
fi
line=$(printf '%-22s %-42s errors %-2s states %-9s pan %5ss  total %5ss' \
	"$name" "[$mode]" "$errors" "${states:-?}" "${pantime:-?}" "$wall")

bad=""
if [ "$expect" = pass ]; then
	[ "$errors" -eq 0 ] || bad="expected errors: 0"
	# a truncated search proves nothing
	if grep -q -e 'max search depth too small' -e 'out of memory' \
		-e 'MEMLIM bound' pan.out; then
		bad="search incomplete (depth or memory)"
	fi
	[ -z "$bad" ] && echo "$line  ok: verified"
else
	[ "$errors" -gt 0 ] || bad="seeded bug NOT caught (errors: 0)"
	[ -z "$bad" ] && echo "$line  ok: caught: $what"
fi

if [ -n "$bad" ]; then
	echo "$line  FAILED: $bad" >&2
	cat pan.out >&2
	if ls ./*.trail >/dev/null 2>&1; then
		echo "--- counterexample (spin -t -p) ---" >&2
		# shellcheck disable=SC2086
		$SPIN $spinflags -t -p -g -l "$base" 2>&1 | tail -n 80 >&2
	fi
	echo "models: scratch dir: $out" >&2
	exit 1
fi
exit 0
