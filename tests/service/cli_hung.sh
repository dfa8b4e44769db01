#!/bin/sh
# cli_hung.sh WEXD WEXCTL - wexctl against a wexd that takes connections
# but answers nothing (stopped here; hung or overloaded alike) exits 1
# within about 10 s saying so and what to look at, not after the 35 s a
# client waits by default with only "Connection timed out"; once wexd
# goes on, wexctl status works again.
WEXD=$1 WEXCTL=$2
. "$(dirname "$0")/lib.sh"
start_wexd
kill -STOP "$WEXD_PID" || fail "SIGSTOP wexd"
t0=$(date +%s)
"$WEXCTL" status >"$TMP/out" 2>"$TMP/err"
rc=$?
took=$(($(date +%s) - t0))
kill -CONT "$WEXD_PID"
[ $rc = 1 ] || fail "wexctl status against a stopped wexd: exit $rc, not 1: $(cat "$TMP/err")"
[ $took -le 20 ] || fail "wexctl status against a stopped wexd took ${took} s, not about 10"
grep -q "answered nothing for 10 s.*hung, stopped or overloaded" "$TMP/err" ||
	fail "wexctl does not say wexd is hung: $(cat "$TMP/err")"
"$WEXCTL" status >"$TMP/out" 2>&1 || fail "wexctl status once wexd went on: $(cat "$TMP/out")"
echo "wexctl against a stopped wexd: exit 1 after ${took} s: $(head -c 300 "$TMP/err")"
echo "PASS: a stopped wexd is reported as hung within about 10 s, and served again once it goes on"
