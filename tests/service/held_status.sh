#!/bin/sh
# held_status.sh WEXD WEXCTL PRODUCER LIBWEX - proves that a remap lease read
# back from the lease journal after a restart of wexd leaves status, metrics
# and systemd's status line once its process exits, also while no producer
# calls begin_write: an engine (the Python glue) holds a remap-view lease
# of v1, wexd restarts (the lease shown under held[]), the engine is killed
# (SIGKILL), and within 3 s `wexctl status --json` lists no held lease and
# wex_leases is 0.  Before, the lease of the dead process stayed in held[]
# and in wex_leases (and "1 lease" in systemctl status) until a trainer's
# next begin_write looked: a stuck lease to an operator, forever on an idle
# node.
WEXD=$1 WEXCTL=$2 PRODUCER=$3 LIBWEX=$4
. "$(dirname "$0")/lib.sh"
PY=/usr/bin/python3; [ -x $PY ] || PY=python3
command -v $PY >/dev/null || skip "python3 missing"
start_wexd
cleanup_extra() { kill -9 "$E" 2>/dev/null; kill "$P" 2>/dev/null; wait "$P" "$E" 2>/dev/null; }
E=
view_engine
stop_wexd
start_wexd
"$WEXCTL" status --json >"$TMP/s.json" || fail "status"
grep -q "\"pid\": $E," "$TMP/s.json" || fail "the engine's lease is not shown after the restart: $(cat "$TMP/s.json")"
kill -9 $E; wait $E 2>/dev/null
i=0
until "$WEXCTL" status --json | tr -d ' \n' | grep -q '"held":\[\]' &&
	"$WEXCTL" metrics | grep -qx 'wex_leases 0'; do
	i=$((i+1))
	[ $i -lt 30 ] || fail "3 s after its process died, the held lease is still shown: $("$WEXCTL" status | grep -A2 'held from before'); $("$WEXCTL" metrics | grep '^wex_leases')"
	sleep 0.1
done
grep -q "ended: its process exited" "$TMP/wexd.log" || fail "the end of the held lease is not logged"
stop_wexd
[ "$WEXD_RC" = 0 ] || fail "wexd exit code $WEXD_RC"
echo "PASS: a held lease leaves status and metrics when its process exits"
