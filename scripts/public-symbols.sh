#!/bin/sh
# The public API: every function declared FANOUT_API in include/fanout.h,
# one name a line, sorted.  With --map, a linker version script exporting
# exactly those names from libfanout.so (`local: *` hides everything else,
# the test hooks of include/fanout_testing.h included).
# Usage: scripts/public-symbols.sh [--map] [HEADER]
set -eu
map=0
if [ "${1:-}" = --map ]; then
	map=1
	shift
fi
hdr=${1:-include/fanout.h}
# Preprocessor lines out (the #define of FANOUT_API itself), the header
# joined into one line so wrapped prototypes match, then the identifier
# just before the first '(' after each FANOUT_API.
names=$(grep -v '^[[:space:]]*#' "$hdr" | tr '\n' ' ' |
	grep -oE 'FANOUT_API [^;(]*\(' |
	sed -E 's/.*[^A-Za-z0-9_]([A-Za-z_][A-Za-z0-9_]*)[[:space:]]*\($/\1/' |
	LC_ALL=C sort -u)
[ -n "$names" ] || { echo "public-symbols: no FANOUT_API in $hdr" >&2; exit 1; }
if [ $map = 0 ]; then
	printf '%s\n' "$names"
	exit 0
fi
echo "/* Generated from $hdr by scripts/public-symbols.sh. */"
echo "{"
echo "	global:"
printf '%s\n' "$names" | sed 's/.*/		&;/'
echo "	local: *;"
echo "};"
