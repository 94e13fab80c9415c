#!/bin/sh
# Install the Debian packages fanout needs, or say the one line to run.
# Usage: scripts/deps.sh [extra-package ...]
# Exit 0 when everything is present (or was installed), 1 otherwise.
set -u
# systemtap-sdt-dev: <sys/sdt.h> for the USDT probes (lib/probes.h);
# gdb: tests/check-probes.sh fires them in a real run.
# libnats-dev, nats-server: remote/ (libfanout-nats and its tests).
need="liburcu-dev libck-dev libjemalloc-dev libcmocka-dev libjansson-dev pkg-config gcc make libc6-dev systemtap-sdt-dev gdb libnats-dev nats-server"
# The Python package (python/, make python-test): cffi, headers, a venv.
need="$need python3 python3-dev python3-cffi python3-venv python3-pip python3-setuptools"
missing=""
for p in $need "$@"; do
	if ! dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q 'install ok installed'; then
		missing="$missing $p"
	fi
done
[ -z "$missing" ] && exit 0
if [ "$(id -u)" = 0 ]; then
	echo "deps: installing$missing" >&2
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq >&2 || true
	apt-get install -y -qq --no-install-recommends $missing >&2 || {
		echo "deps: apt-get install failed for:$missing" >&2
		exit 1
	}
	exit 0
fi
echo "deps: missing Debian packages; run:" >&2
echo "  sudo apt-get install -y$missing" >&2
exit 1
