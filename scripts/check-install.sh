#!/bin/sh
# Install into a scratch DESTDIR, then build the same program three ways, as
# a user would, and run each:
#   1. fully static, through `pkg-config --cflags --libs --static fanout`;
#   2. dynamically, with plain `-I... -L... -lfanout`;
#   3. dynamically, through `pkg-config --cflags --libs fanout`.
# Also checks the installed files: the .so symlinks, that libfanout.so and
# libfanout.a define exactly the FANOUT_API functions of fanout.h (no test
# hooks, nothing internal), the .pc file's relative paths and that no
# library appears twice in `pkg-config --static --libs`.
set -eu
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() {
	echo "check-install: $*" >&2
	exit 1
}
prefix=/usr/local
root=$tmp/root
lib=$root$prefix/lib
make --no-print-directory install DESTDIR="$root" PREFIX=$prefix >/dev/null

# The files and links.
for f in libfanout.a libfanout.so libfanout.so.0 pkgconfig/fanout.pc; do
	test -e "$lib/$f" || fail "$f not installed"
done
test -f "$root$prefix/include/fanout.h" || fail "fanout.h not installed"
test -e "$root$prefix/include/fanout_testing.h" &&
	fail "fanout_testing.h installed (test hooks are not API)"
so=$(readlink "$lib/libfanout.so.0")
case $so in libfanout.so.[0-9]*.[0-9]*.[0-9]*) ;;
*) fail "libfanout.so.0 -> $so, not libfanout.so.MAJOR.MINOR.PATCH" ;;
esac
[ "$(readlink "$lib/libfanout.so")" = "$so" ] ||
	fail "libfanout.so does not point at $so"
readelf -d "$lib/$so" | grep -q 'SONAME.*\[libfanout\.so\.0\]' ||
	fail "$so has no soname libfanout.so.0"
# The version in the file name is the one fanout.h declares.
v=$(for p in MAJOR MINOR PATCH; do
	sed -n "s/^#define FANOUT_VERSION_$p *//p" include/fanout.h
done | paste -sd.)
[ "$so" = "libfanout.so.$v" ] || fail "$so installed, fanout.h says $v"

# Exactly the public API is exported, from the .so and from the archive.
sh scripts/public-symbols.sh include/fanout.h > "$tmp/api"
nm -D --defined-only "$lib/libfanout.so.0" | awk '{print $3}' |
	LC_ALL=C sort -u > "$tmp/so-syms"
diff "$tmp/api" "$tmp/so-syms" > "$tmp/diff" ||
	{ cat "$tmp/diff" >&2; fail "libfanout.so exports differ from fanout.h (< header, > .so)"; }
nm --defined-only "$lib/libfanout.a" | awk 'NF == 3 && $2 ~ /^[A-Z]$/ {print $3}' |
	LC_ALL=C sort -u > "$tmp/a-syms"
diff "$tmp/api" "$tmp/a-syms" > "$tmp/diff" ||
	{ cat "$tmp/diff" >&2; fail "libfanout.a globals differ from fanout.h (< header, > archive)"; }

# The .pc file: paths relative to ${prefix}, so one --define-variable
# relocates it to the scratch root.
export PKG_CONFIG_PATH="$lib/pkgconfig"
[ "$(pkg-config --variable=libdir fanout)" = "$prefix/lib" ] ||
	fail "fanout.pc libdir is not \${prefix}/lib"
pc="pkg-config --define-variable=prefix=$root$prefix"
dups=$($pc --static --libs fanout | tr ' ' '\n' | grep . | LC_ALL=C sort | uniq -d)
[ -z "$dups" ] || fail "listed twice by pkg-config --static --libs: $dups"

cat > "$tmp/app.c" <<'APP'
#include <fanout.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
static int child(struct fanout_child *c, void *arg)
{
	(void)arg;
	return fanout_set_summary(c, "ok", 2);
}
int main(void)
{
	struct fanout_engine *e;
	struct fanout_event *ev;
	struct fanout_task t[3] = { { "a", child, NULL }, { "b", child, NULL },
				    { "c", child, NULL } };
	struct fanout_batch b = { .tasks = t, .ntasks = 3 };
	if (strcmp(fanout_version(), FANOUT_VERSION_STRING)) {
		printf("library %s, header %s\n", fanout_version(),
		       FANOUT_VERSION_STRING);
		return 1;
	}
	if (fanout_create(NULL, &e) || fanout_run(e, &b, &ev))
		return 1;
	int ok = ev->status == FANOUT_COMPLETED && ev->nresults == 3;
	/* Linking fanout leaves the program's malloc alone: glibc's counts
	 * this block (libfanout.a's jemalloc is private to the library). */
	struct mallinfo2 before = mallinfo2();
	void *volatile p = malloc(100000);
	if (!p || mallinfo2().uordblks + mallinfo2().hblkhd <
			  before.uordblks + before.hblkhd + 100000) {
		puts("the program's malloc is not glibc's");
		ok = 0;
	}
	free(p);
	fanout_event_free(ev);
	fanout_destroy(e);
	puts(ok ? "installed fanout links and runs" : "wrong event");
	return !ok;
}
APP

# 1. Static.  -lm: jemalloc (inside libfanout.a) needs it.
cc -static "$tmp/app.c" -o "$tmp/app-static" \
	$($pc --cflags --libs --static fanout) -lm
readelf -d "$tmp/app-static" 2>/dev/null | grep -q NEEDED &&
	fail "the static program needs shared libraries"
"$tmp/app-static" >/dev/null || fail "static program failed"

# 2. Plain -lfanout: the .so symlink is what -lfanout finds.
cc "$tmp/app.c" -o "$tmp/app-l" -I"$root$prefix/include" -L"$lib" -lfanout
readelf -d "$tmp/app-l" | grep -q 'NEEDED.*\[libfanout\.so\.0\]' ||
	fail "-lfanout did not link libfanout.so.0"
LD_LIBRARY_PATH="$lib" "$tmp/app-l" >/dev/null || fail "-lfanout program failed"

# 3. pkg-config --libs (dynamic).
cc "$tmp/app.c" -o "$tmp/app-pc" $($pc --cflags --libs fanout)
readelf -d "$tmp/app-pc" | grep -q 'NEEDED.*\[libfanout\.so\.0\]' ||
	fail "pkg-config --libs did not link libfanout.so.0"
LD_LIBRARY_PATH="$lib" "$tmp/app-pc" >/dev/null || fail "pkg-config program failed"

echo "check-install: $so; static (pkg-config --static), -lfanout and" \
	"pkg-config --libs programs run; .so and .a export the $(wc -l < "$tmp/api") fanout.h functions only"
