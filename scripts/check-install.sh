#!/bin/sh
# Install into a scratch DESTDIR and link a program against it through
# `pkg-config --cflags --libs --static fanout`, then run it.
set -eu
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
make --no-print-directory install DESTDIR="$tmp/root" PREFIX=/usr/local >/dev/null
export PKG_CONFIG_PATH="$tmp/root/usr/local/lib/pkgconfig"
export PKG_CONFIG_SYSROOT_DIR="$tmp/root"
cat > "$tmp/app.c" <<'APP'
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fanout.h>
#include <stdio.h>
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
	if (fanout_create(NULL, &e) || fanout_run(e, &b, &ev))
		return 1;
	int ok = ev->status == FANOUT_COMPLETED && ev->nresults == 3;
	/* The archive's jemalloc is private: the program's malloc is libc's. */
	Dl_info di;
	if (!dladdr(dlsym(RTLD_DEFAULT, "malloc"), &di) ||
	    !strstr(di.dli_fname, "libc.so")) {
		puts("linking libfanout.a replaced the program's malloc");
		ok = 0;
	}
	fanout_event_free(ev);
	fanout_destroy(e);
	puts(ok ? "installed fanout links and runs" : "wrong event");
	return !ok;
}
APP
cc "$tmp/app.c" -o "$tmp/app" $(pkg-config --cflags --libs --static fanout) -ldl
if ldd "$tmp/app" | grep -q libfanout; then
	echo "check-install: the program linked the shared library, not libfanout.a" >&2
	exit 1
fi
"$tmp/app"
# The shared library, by its soname, for bindings.
test -e "$tmp/root/usr/local/lib/libfanout.so.0"
nm -D --defined-only "$tmp/root/usr/local/lib/libfanout.so.0" | awk '$2 == "T" {print $3}' |
	grep -v '^fanout_' && { echo "check-install: non-fanout_ export" >&2; exit 1; }
echo "check-install: static link via pkg-config --static, shared library exports only fanout_*"
