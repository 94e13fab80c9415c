#!/bin/sh
# Install the Python package the way a user does (pip install ./python,
# offline) into a throwaway venv, and run its suite, then
# examples/orchestrator.py (which asserts its own results) against it.
# Usage: scripts/python-test.sh [PYTHON]
#
# The interpreter: $1, else $PYTHON, else the first of `python3` on PATH and
# /usr/bin/python3 that has cffi and can make a venv (Debian:
# python3-cffi python3-venv).  The venv sees the interpreter's own
# site-packages (--system-site-packages), so cffi comes from there and pip
# never needs an index.
set -u
here=$(cd "$(dirname "$0")/.." && pwd)
out=$here/build/python
pick() {
	for py in "$@"; do
		[ -n "$py" ] || continue
		command -v "$py" >/dev/null 2>&1 || continue
		if "$py" -c 'import cffi, venv, ensurepip' >/dev/null 2>&1; then
			echo "$py"
			return 0
		fi
	done
	return 1
}
py=$(pick "${1:-}" "${PYTHON:-}" python3 /usr/bin/python3) || {
	echo "python-test: no python3 with cffi and venv; run:" >&2
	echo "  sudo apt-get install -y python3-cffi python3-venv python3-dev" >&2
	echo "python: 0 passed, 1 failed"
	mkdir -p "$out" && echo "0 1" > "$out/test-counts"
	exit 1
}
echo "python-test: $py ($("$py" -c 'import sys, cffi; print(sys.version.split()[0], "cffi", cffi.__version__)'))"
rm -rf "$out/venv"
mkdir -p "$out"
"$py" -m venv --system-site-packages "$out/venv" || exit 1
# The one command the README gives, with --no-index to prove it is offline.
"$out/venv/bin/python" -m pip install -q --no-index "$here/python" || {
	echo "python: 0 passed, 1 failed (pip install ./python failed)"
	echo "0 1" > "$out/test-counts"
	exit 1
}
cd "$out" || exit 1
timeout -k 5 600 "$out/venv/bin/python" "$here/python/tests/run.py" \
	"$out/test-counts"
rc=$?
# The orchestrator example against the installed package: it asserts what
# it prints and exits non-zero when any check fails; counted as one test.
if timeout -k 5 120 "$out/venv/bin/python" "$here/examples/orchestrator.py" \
	>"$out/orchestrator.out" 2>&1; then
	echo "python: examples/orchestrator.py ok"
	read -r p f <"$out/test-counts" && echo "$((p + 1)) $f" >"$out/test-counts"
else
	cat "$out/orchestrator.out"
	echo "python: examples/orchestrator.py FAILED"
	read -r p f <"$out/test-counts" && echo "$p $((f + 1))" >"$out/test-counts"
	rc=1
fi
exit $rc
