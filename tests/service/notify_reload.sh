#!/bin/sh
# notify_reload.sh WEXD WEXCTL - proves, on a live wexd:
#  - sd_notify: READY=1 once listening, WATCHDOG=1 pings when WATCHDOG_USEC
#    asks for them, RELOADING=1 then READY=1 around a SIGHUP, STOPPING=1 on
#    SIGTERM (read from a real NOTIFY_SOCKET);
#  - SIGHUP reloads the --config file: a changed log_level is applied and
#    reported with the file as its source; an invalid file is refused and
#    the running configuration kept (and logged).
WEXD=$1 WEXCTL=$2
. "$(dirname "$0")/lib.sh"
PY=/usr/bin/python3; [ -x $PY ] || PY=python3
command -v $PY >/dev/null || skip "python3 missing"
$PY - "$TMP/notify.sock" "$TMP/notify.log" <<'PYEOF' &
import socket, sys, time
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(sys.argv[1])
s.settimeout(20)
with open(sys.argv[2], "a", buffering=1) as f:
    f.write("listening\n")
    try:
        while True:
            f.write(s.recv(4096).decode().replace("\n", " ") + "\n")
    except socket.timeout:
        pass
PYEOF
LISTENER=$!
cleanup_extra() { kill "$LISTENER" 2>/dev/null; wait "$LISTENER" 2>/dev/null; }
i=0; until grep -q listening "$TMP/notify.log" 2>/dev/null; do i=$((i+1)); [ $i -lt 200 ] || fail "listener"; sleep 0.05; done
cat >"$TMP/wexd.json" <<JSON
{ "log_level": "info", "begin_write_timeout_ms": 5000 }
JSON
NOTIFY_SOCKET="$TMP/notify.sock" WATCHDOG_USEC=200000 start_wexd --config "$TMP/wexd.json"
wait_for() { i=0; until grep -q "$1" "$TMP/notify.log"; do i=$((i+1)); [ $i -lt 200 ] || fail "no '$1' from sd_notify: $(cat "$TMP/notify.log")"; sleep 0.05; done; }
wait_for "READY=1"
wait_for "WATCHDOG=1"
"$WEXCTL" config get log_level --json | grep -q '"info"' || fail "log_level not info at start"
echo '{ "log_level": "debug", "begin_write_timeout_ms": 5000 }' >"$TMP/wexd.json"
kill -HUP "$WEXD_PID"
wait_for "RELOADING=1"
i=0; until "$WEXCTL" config get log_level --json | grep -q '"debug"'; do
	i=$((i+1)); [ $i -lt 200 ] || fail "reload did not apply log_level"; sleep 0.05; done
"$WEXCTL" config get log_level --json | grep -q '"file"' || fail "source of log_level is not the file"
echo '{ "log_level": "loud" }' >"$TMP/wexd.json"
kill -HUP "$WEXD_PID"
i=0; until grep -q "reload refused" "$TMP/wexd.log"; do i=$((i+1)); [ $i -lt 200 ] || fail "invalid file not refused: $(tail -3 "$TMP/wexd.log")"; sleep 0.05; done
grep "reload refused" "$TMP/wexd.log" | grep -q "log_level" || fail "refusal does not name the field"
"$WEXCTL" config get log_level --json | grep -q '"debug"' || fail "running config not kept after an invalid reload"
kill -TERM "$WEXD_PID"; wait "$WEXD_PID"; rc=$?; WEXD_PID=""
[ $rc = 0 ] || fail "wexd exit code $rc"
wait_for "STOPPING=1"
echo "PASS: READY, WATCHDOG, RELOADING, STOPPING sent; SIGHUP reload applied and an invalid file refused"
