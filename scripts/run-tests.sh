#!/bin/sh
# Run test binaries of one build variant; fail on the first failure.
# Usage: scripts/run-tests.sh VARIANT TIMEOUT_SECONDS BINARY...
set -u
variant=$1; limit=$2; shift 2
here=$(cd "$(dirname "$0")/.." && pwd)
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:halt_on_error=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$here/tests/tsan.supp"
pass=0; fail=0
for t in "$@"; do
	echo "== [$variant] $t"
	if timeout -k 5 "$limit" "$t"; then
		pass=$((pass + 1))
	else
		rc=$?
		echo "FAILED [$variant] $t (exit $rc)"
		fail=$((fail + 1))
	fi
done
echo "[$variant]: $pass passed, $fail failed"
mkdir -p "build/$variant" && echo "$pass $fail" > "build/$variant/test-counts"
[ "$fail" -eq 0 ]
