#!/bin/sh
# `make run`'s Python part: the package installed as a user would
# (scripts/python-test.sh's venv, made if missing), then the asyncio
# benchmark (bench/python_orch.py) and the orchestrator example.
# Skipped with a note when no python3 with cffi is around.
set -u
here=$(cd "$(dirname "$0")/.." && pwd)
venv=$here/build/python/venv
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import fanout' 2>/dev/null ||
	[ -n "$(find "$here/python" "$here/lib" "$here/queue" "$here/include" \
		-newer "$venv/bin/python" -name '*.[ch]' -o -newer "$venv/bin/python" -name '*.py' | head -1)" ]; then
	py=""
	for c in ${PYTHON:-} python3 /usr/bin/python3; do
		if command -v "$c" >/dev/null 2>&1 &&
			"$c" -c 'import cffi, venv, ensurepip' 2>/dev/null; then
			py=$c
			break
		fi
	done
	if [ -z "$py" ]; then
		echo "python: no python3 with cffi and venv; Python bench skipped" >&2
		exit 0
	fi
	rm -rf "$venv" && mkdir -p "$(dirname "$venv")" &&
		"$py" -m venv --system-site-packages "$venv" &&
		"$venv/bin/python" -m pip install -q --no-index "$here/python" || exit 1
fi
cd "$here/build/python" || exit 1
"$venv/bin/python" "$here/bench/python_orch.py" ${PY_BENCH_ARGS:-} || exit 1
echo
echo "== examples/orchestrator.py (fake LLM calls) =="
"$venv/bin/python" "$here/examples/orchestrator.py"
