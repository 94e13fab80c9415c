#!/bin/sh
# Install into a scratch DESTDIR and build a dispatcher against it through
# `pkg-config --libs fanout-nats` (shared) and with the archives
# (`pkg-config --static`; libnats itself is shared-only on Debian); run
# both against no server (they must say -ECONNREFUSED); check the shared
# library exports only fanout_nats_* and that fanout-worker was installed.
set -eu
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
make --no-print-directory install DESTDIR="$tmp/root" PREFIX=/usr/local >/dev/null
export PKG_CONFIG_PATH="$tmp/root/usr/local/lib/pkgconfig"
export PKG_CONFIG_SYSROOT_DIR="$tmp/root"
cat > "$tmp/app.c" <<'APP'
#include <errno.h>
#include <stdio.h>
#include <fanout_nats.h>
int main(void)
{
	static const char *const kinds[] = { "k" };
	struct fanout_nats_opts o = { .kinds = kinds, .nkinds = 1 };
	struct fanout_nats *n = NULL;
	int err = fanout_nats_open("nats://127.0.0.1:1", &o, &n);
	puts(err == -ECONNREFUSED ? "installed fanout-nats links and runs"
				  : "wrong answer");
	return err != -ECONNREFUSED;
}
APP
lib="$tmp/root/usr/local/lib"
cc "$tmp/app.c" -o "$tmp/app" $(pkg-config --cflags --libs fanout-nats)
LD_LIBRARY_PATH="$lib" "$tmp/app"
cc "$tmp/app.c" -o "$tmp/app-a" $(pkg-config --cflags fanout-nats) \
	"$lib/libfanout-nats.a" "$lib/libfanout.a" \
	$(pkg-config --libs-only-l --static fanout-nats | tr ' ' '\n' |
		grep -v -e '^-lfanout$' -e '^-lfanout-nats$')
if ldd "$tmp/app-a" | grep -q libfanout; then
	echo "check-install-remote: the archive build needs a shared libfanout*" >&2
	exit 1
fi
"$tmp/app-a"
test -x "$tmp/root/usr/local/bin/fanout-worker"
nm -D --defined-only "$tmp/root/usr/local/lib/libfanout-nats.so.0" |
	awk '$2 == "T" {print $3}' | grep -v '^fanout_nats_' &&
	{ echo "check-install-remote: non-fanout_nats_ export" >&2; exit 1; }
echo "check-install-remote: shared and archive links via pkg-config fanout-nats run; shared library exports only fanout_nats_*"
