#!/bin/sh
# install_prefix.sh BUILD_DIR
#
# Proves that the installed wexd.service starts the wexd the same install
# put in place: `cmake --install --prefix P` (into a DESTDIR) writes
# ExecStart=P/bin/wexd and ExecReload=P/bin/wexctl, for P = /usr (a distribution's prefix) and
# /usr/local (the default, the source unit's own), the installed wexd is
# there, and every other line of the unit is the source's.  Before, the
# unit always named /usr/local/bin/wexd, so a --prefix /usr install gave
# systemd a unit whose daemon did not exist.  Exit 0 pass, 1 fail.
set -u
build=$1
src=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

for prefix in /usr /usr/local; do
	root=$tmp/root$(echo "$prefix" | tr / _)
	DESTDIR=$root cmake --install "$build" --prefix "$prefix" >"$tmp/log" 2>&1 ||
		{ cat "$tmp/log"; fail "cmake --install --prefix $prefix"; }
	unit=$root$prefix/lib/systemd/system/wexd.service
	[ -f "$unit" ] || fail "no $prefix/lib/systemd/system/wexd.service installed"
	[ -x "$root$prefix/bin/wexd" ] || fail "no $prefix/bin/wexd installed"
	grep -q "^ExecStart=$prefix/bin/wexd --config /etc/wex/wexd.json\$" "$unit" ||
		fail "prefix $prefix: $(grep '^ExecStart=' "$unit")"
	grep -q "^ExecReload=$prefix/bin/wexctl --socket /run/wex/wexd.sock config reload\$" "$unit" ||
		fail "prefix $prefix: $(grep '^ExecReload=' "$unit")"
	[ -x "$root$prefix/bin/wexctl" ] || fail "no $prefix/bin/wexctl installed"
	grep -Ev '^Exec(Start|Reload)=' "$unit" >"$tmp/got"
	grep -Ev '^Exec(Start|Reload)=' "$src/systemd/wexd.service" >"$tmp/want"
	cmp -s "$tmp/got" "$tmp/want" || { diff "$tmp/want" "$tmp/got"; fail "prefix $prefix: other lines changed"; }
	[ -f "$root$prefix/lib/systemd/system/wexd.socket" ] || fail "no wexd.socket under $prefix"
	echo "prefix $prefix: $(grep '^ExecStart=' "$unit")"
done
echo "PASS: the installed wexd.service starts the installed wexd"
exit 0
