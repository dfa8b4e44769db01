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
"$PRODUCER" --rank 0 --world 1 --preset tiny --versions 1 --hold >"$TMP/p.log" 2>&1 &
P=$!
cleanup_extra() { kill -9 "$E" 2>/dev/null; kill "$P" 2>/dev/null; wait "$P" "$E" 2>/dev/null; }
E=
LD_PRELOAD=${WEX_PY_PRELOAD:-} ASAN_OPTIONS=detect_leaks=0 WEX_LIB=$LIBWEX \
PYTHONPATH="$(dirname "$0")/../../adapters/python" $PY - >"$TMP/e.log" 2>&1 <<'PYEOF' &
import time, wex
c = wex.Client(wex.ROLE_CONSUMER, "policy", group="engine")
r = c.sync(wex.SYNC_REMAP_VIEW, min_version=1, timeout_ms=20000)
print("synced v%d" % r.version, flush=True)
time.sleep(600)
PYEOF
E=$!
i=0; until grep -q "synced v1" "$TMP/e.log"; do
	i=$((i+1)); [ $i -lt 400 ] || fail "the engine did not sync: $(tail -3 "$TMP/e.log")"
	kill -0 $E 2>/dev/null || fail "the engine exited: $(tail -3 "$TMP/e.log")"; sleep 0.05; done
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
