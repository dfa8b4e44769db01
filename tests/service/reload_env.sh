#!/bin/sh
# reload_env.sh WEXD WEXCTL - proves that a reload says when the environment
# outranks the file: wexd started with WEX_DRAIN_TIMEOUT_MS=100 over a file
# setting drain_timeout_ms 5000; the file edited to 7000 and reloaded, the
# running value stays 100 (the environment, read at start, outranks the
# file), and wexctl config reload names the field as overridden (--json and
# the table) and the log says both values.  Before, the answer was
# "changed: none" and the log said nothing: the operator's edit was passed
# over in silence.  A field the file and the environment agree on is not
# named.
WEXD=$1 WEXCTL=$2
. "$(dirname "$0")/lib.sh"
echo '{ "drain_timeout_ms": 5000, "sync_timeout_ms": 4000 }' >"$TMP/wexd.json"
WEX_DRAIN_TIMEOUT_MS=100 WEX_SYNC_TIMEOUT_MS=4000 start_wexd --config "$TMP/wexd.json"
echo '{ "drain_timeout_ms": 7000, "sync_timeout_ms": 4000 }' >"$TMP/wexd.json"
out=$("$WEXCTL" config reload --json) || fail "config reload: $out"
echo "$out" | tr -d ' \n' | grep -q '"overridden":\["drain_timeout_ms"\]' ||
	fail "config reload does not name drain_timeout_ms as kept over the file: $out"
out=$("$WEXCTL" config reload) || fail "config reload: $out"
case $out in *"kept over the file (the environment, a flag or config set outranks it): drain_timeout_ms") ;;
	*) fail "config reload's table does not say the environment outranks the file: $out" ;; esac
grep -q 'reload: drain_timeout_ms is 7000 in file .*, but environment WEX_DRAIN_TIMEOUT_MS set it to 100, which outranks it; keeping 100' \
	"$TMP/wexd.log" || fail "no warning that WEX_DRAIN_TIMEOUT_MS outranks the file: $(grep reload "$TMP/wexd.log")"
"$WEXCTL" config get drain_timeout_ms --json | tr -d ' \n' | grep -q '"value":100,' ||
	fail "drain_timeout_ms is no longer the environment's 100"
stop_wexd
[ "$WEXD_RC" = 0 ] || fail "wexd exit code $WEXD_RC"
echo "PASS: a reload names a file's value that the environment outranks"
