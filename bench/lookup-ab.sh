#!/bin/sh
# lookup-ab.sh - two (or more) builds' record lookups, alternating in one
# script (bench/PROFILE.txt phase 7).  Each argument is a directory holding
# a fanout-bench and a lookup-lines built against one library; per round,
# each build in turn runs `fanout-bench --only records` (short: lookup ns
# at 1k, 100k, 1M and bar 7's list(100) of 1000) and `lookup-lines
# 1000000 2000000`, with the load average beside it.  The
# figures of every round are printed; take the medians.
#   sh bench/lookup-ab.sh OLD_DIR NEW_DIR [ROUNDS]
set -eu
rounds=5
dirs=""
for a in "$@"; do
	case $a in
	*[!0-9]*) dirs="$dirs $a" ;;
	*) rounds=$a ;;
	esac
done
r=1
while [ "$r" -le "$rounds" ]; do
	for d in $dirs; do
		load=$(cut -d' ' -f1-3 /proc/loadavg)
		rec=$("$d/fanout-bench" --only records --rounds 3 --scale 0.3 \
			--no-plots --no-results 2>&1 |
			awk '/^ +(1000|100000|1000000) +[0-9.]+ /{printf "%s:%s ", $1, $2}
			/^ +1000 +[0-9.]+ /{l = $5} END {printf "list(100) of 1000 %s us ", l}')
		ll=$("$d/lookup-lines" 1000000 2000000 |
			sed 's/.*lookups, \([0-9.]*\) ns.*AnonHugePages \([0-9]*\).*/\1 ns (huge \2 MiB)/')
		echo "round $r $d load $load | bench lookup ns $rec| lookup-lines 1M $ll"
	done
	r=$((r + 1))
done
