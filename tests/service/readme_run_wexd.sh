#!/bin/sh
# tests/service/readme_run_wexd.sh - README's "Run wexd by hand" block, run
# as written (its paths pointed at this build and a private socket): it
# must print wexctl's status and leave wexd running.  The wexd it starts
# takes 0.5 s to listen here (a shim that sleeps, then runs it), as on a
# loaded machine: the block as it was (`build/wexd &` then `build/wexctl
# status` at once) printed "cannot reach wexd" and exited 1 there, and 4
# times in 5 on the development machine under a build.
#
#   readme_run_wexd.sh README WEXD WEXCTL
set -eu
README=$1 WEXD=$2 WEXCTL=$3
. "$(dirname "$0")/lib.sh"

# The block: the first ```sh fence after the heading, to its closing fence.
awk '/^### Run wexd by hand/ { h = 1; next }
     h && !b && /^```sh$/ { b = 1; next }
     b && /^```$/ { exit }
     b { print }' "$README" >"$TMP/block.sh"
[ -s "$TMP/block.sh" ] || fail "no sh block under '### Run wexd by hand' in $README"
grep -q '^export WEX_SOCKET=/tmp/wex/wexd.sock' "$TMP/block.sh" ||
	fail "the block no longer sets WEX_SOCKET=/tmp/wex/wexd.sock: update this test"
grep -q 'build/wexd &' "$TMP/block.sh" || fail "the block no longer starts build/wexd: update this test"

mkdir "$TMP/build"
printf '#!/bin/sh\necho $$ >"%s"\nsleep 0.5\nexec "%s" "$@"\n' "$TMP/wexd.pid" "$WEXD" \
	>"$TMP/build/wexd"
ln -s "$WEXCTL" "$TMP/build/wexctl"
chmod +x "$TMP/build/wexd"
sed "s|/tmp/wex/wexd.sock|$TMP/wex/wexd.sock|" "$TMP/block.sh" >"$TMP/run.sh"
cleanup_extra() {
	# The block leaves wexd running (the shim's pid, which it execs;
	# written as the shim starts, which may come after a failed block).
	i=0
	while [ ! -s "$TMP/wexd.pid" ] && [ $i -lt 20 ]; do
		sleep 0.1
		i=$((i + 1))
	done
	pid=$(cat "$TMP/wexd.pid" 2>/dev/null || true)
	[ -n "$pid" ] && kill -TERM "$pid" 2>/dev/null
	i=0
	while [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && [ $i -lt 100 ]; do
		sleep 0.1
		i=$((i + 1))
	done
}
rc=0
(cd "$TMP" && sh -e ./run.sh) >"$TMP/out" 2>"$TMP/err" || rc=$?
cat "$TMP/out"
[ $rc -eq 0 ] || fail "the block exited $rc: $(cat "$TMP/err")"
grep -q "^wexd pid .* socket $TMP/wex/wexd.sock" "$TMP/out" ||
	fail "the block did not print wexctl status: $(cat "$TMP/err")"
"$WEXCTL" --socket "$TMP/wex/wexd.sock" status >/dev/null ||
	fail "wexd does not run after the block"
echo "ok: README's 'Run wexd by hand' block starts wexd and prints its status"
