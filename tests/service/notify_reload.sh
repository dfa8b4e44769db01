#!/bin/sh
# notify_reload.sh WEXD WEXCTL PRODUCER - proves, on a live wexd:
#  - sd_notify: READY=1 once listening, WATCHDOG=1 pings when WATCHDOG_USEC
#    asks for them (at least 4 a second for 200 ms: half the interval), RELOADING=1 then READY=1 around a SIGHUP, STOPPING=1 on
#    SIGTERM, STATUS= (clients, models, leases, draining) when it changes (read from a real NOTIFY_SOCKET),
#    valid UTF-8 without noncharacters where a model's name is cut inside a character or holds one
#    (systemd drops a line that is not);
#  - SIGHUP reloads the --config file: a changed log_level is applied and
#    reported with the file as its source; an invalid file is refused and
#    the running configuration kept (and logged);
#  - watchdog false while WATCHDOG_USEC asks for pings is refused at start
#    with a message naming both, and at a reload (wexd would not start again).
WEXD=$1 WEXCTL=$2 PRODUCER=$3
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
            raw = s.recv(4096)
            try:
                m = raw.decode()
            except UnicodeDecodeError:
                m = "NOT-UTF-8 " + raw.decode(errors="replace")
            # (Noncharacters: valid UTF-8 to Python, refused by systemd.)
            if any(0xfdd0 <= ord(ch) <= 0xfdef or ord(ch) & 0xfffe == 0xfffe for ch in m):
                m = "NOT-UTF-8 (a noncharacter) " + m
            m = m.replace("\n", " ")
            f.write("%.3f %s\n" % (time.monotonic(), m))
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
# STATUS= for systemctl status, sent when it changes: a wexctl call is a
# client while it runs.
wait_for "STATUS=0 clients, 0 models, 0 leases"
"$WEXCTL" status >/dev/null || fail "wexctl status"
wait_for "STATUS=1 client, 0 models, 0 leases"
i=0; until [ "$(grep STATUS= "$TMP/notify.log" | tail -1 | cut -d' ' -f2-)" = "STATUS=0 clients, 0 models, 0 leases" ]; do
	i=$((i+1)); [ $i -lt 200 ] || fail "STATUS not back to 0 clients: $(grep STATUS= "$TMP/notify.log" | tail -3)"; sleep 0.05; done
# Pings at half of WATCHDOG_USEC (200 ms): at least 4 in a second of the
# idle wexd, from 1 s after the first ping on (the idle loop once slept 1 s
# between them, and systemd would have killed wexd).  A loaded machine may
# stall wexd for a while: the log is read again until such a second is
# there, for 20 s at most.
$PY - "$TMP/notify.log" <<'PYEOF' || fail "watchdog pings too rare: $(grep WATCHDOG "$TMP/notify.log" | tail -5)"
import sys, time
end = time.monotonic() + 20
while True:
    t = [float(l.split()[0]) for l in open(sys.argv[1]) if "WATCHDOG=1" in l]
    idle = [x for x in t if x >= t[0] + 1.0]
    best = max((sum(1 for y in idle[i:] if y - x <= 1.0) for i, x in enumerate(idle)), default=0)
    if best >= 4 or time.monotonic() > end:
        break
    time.sleep(0.1)
print("WATCHDOG=1 pings: %d within one second of the idle wexd (%d in all, largest gap %.3f s)" %
      (best, len(t), max(b - a for a, b in zip(t, t[1:])) if len(t) > 1 else 0))
sys.exit(0 if best >= 4 else 1)
PYEOF
# A model name of 63 bytes of ASCII then a 2-byte character, cut at 64
# bytes in STATUS=, and one holding a noncharacter (U+FFFE): what is sent
# is UTF-8 that systemd takes.  (The names' bytes written whatever the
# locale.)
LONG=$($PY -c 'import sys; sys.stdout.buffer.write(("a" * 63 + "\u00e9").encode())')
NONCHAR=$($PY -c 'import sys; sys.stdout.buffer.write("n\ufffex".encode())')
"$PRODUCER" --rank 0 --world 1 --preset tiny --model "$LONG" --versions 1 --hold >"$TMP/p.log" 2>&1 &
P=$!
wait_for "STATUS=.*model 'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
kill "$P"; wait "$P" 2>/dev/null
"$PRODUCER" --rank 0 --world 1 --preset tiny --model "$NONCHAR" --versions 1 --hold >"$TMP/p2.log" 2>&1 &
P=$!
wait_for "STATUS=.*model 'n"
kill "$P"; wait "$P" 2>/dev/null
grep -q "NOT-UTF-8" "$TMP/notify.log" && fail "STATUS= not UTF-8: $(grep NOT-UTF-8 "$TMP/notify.log")"
"$WEXCTL" config get log_level --json | grep -q '"info"' || fail "log_level not info at start"
echo '{ "log_level": "debug", "begin_write_timeout_ms": 5000 }' >"$TMP/wexd.json"
kill -HUP "$WEXD_PID"
wait_for "RELOADING=1 MONOTONIC_USEC=[0-9]"
i=0; until "$WEXCTL" config get log_level --json | grep -q '"debug"'; do
	i=$((i+1)); [ $i -lt 200 ] || fail "reload did not apply log_level"; sleep 0.05; done
"$WEXCTL" config get log_level --json | grep -q '"file"' || fail "source of log_level is not the file"
echo '{ "log_level": "loud" }' >"$TMP/wexd.json"
kill -HUP "$WEXD_PID"
i=0; until grep -q "reload refused" "$TMP/wexd.log"; do i=$((i+1)); [ $i -lt 200 ] || fail "invalid file not refused: $(tail -3 "$TMP/wexd.log")"; sleep 0.05; done
grep "reload refused" "$TMP/wexd.log" | grep -q "log_level" || fail "refusal does not name the field"
"$WEXCTL" config get log_level --json | grep -q '"debug"' || fail "running config not kept after an invalid reload"
# wexctl config reload (systemd's ExecReload): answered, so that a refused
# file fails the reload (exit 1, wexd's reason) instead of passing unseen.
if "$WEXCTL" config reload >"$TMP/reload.out" 2>"$TMP/reload.err"; then fail "config reload of an invalid file exited 0"; fi
grep -q "^wexctl: reload refused, keeping the running configuration: .*log_level" "$TMP/reload.err" ||
	fail "refused config reload: $(cat "$TMP/reload.err")"
"$WEXCTL" config get log_level --json | grep -q '"debug"' || fail "running config not kept after a refused config reload"
echo '{ "log_level": "info", "begin_write_timeout_ms": 5000 }' >"$TMP/wexd.json"
n=$(grep -c "RELOADING=1" "$TMP/notify.log")
"$WEXCTL" config reload >"$TMP/reload.out" 2>"$TMP/reload.err" || fail "config reload exited $?: $(cat "$TMP/reload.err")"
grep -qx "reloaded $TMP/wexd.json: changed: log_level; needing a restart of wexd: none" "$TMP/reload.out" ||
	fail "config reload said: $(cat "$TMP/reload.out")"
# Applied when it answers: no polling.
"$WEXCTL" config get log_level --json | grep -q '"info"' || fail "config reload did not apply log_level"
"$WEXCTL" config reload --json | $PY -c "import json,sys; d=json.load(sys.stdin); assert d['changed'] == [] and d['file'], d" ||
	fail "config reload --json"
i=0; until [ "$(grep -c "RELOADING=1" "$TMP/notify.log")" -ge $((n+2)) ]; do
	i=$((i+1)); [ $i -lt 200 ] || fail "config reload sent no RELOADING=1: $(tail -5 "$TMP/notify.log")"; sleep 0.05; done
if "$WEXCTL" config reload now 2>"$TMP/reload.err"; then fail "config reload with an argument exited 0"; fi
# Counted for alerts: two SIGHUPs and three config reloads, two refused.
"$WEXCTL" metrics >"$TMP/metrics" || fail "wexctl metrics"
grep -qx 'wex_config_reloads_total{result="ok"} 3' "$TMP/metrics" &&
	grep -qx 'wex_config_reloads_total{result="refused"} 2' "$TMP/metrics" ||
	fail "reloads not counted: $(grep reloads "$TMP/metrics")"
# watchdog false while systemd asks for pings: wexd would refuse to start
# with it, so the reload refuses it now (it answered "needing a restart of
# wexd: watchdog", and that restart then failed with exit 2).
echo '{ "log_level": "info", "begin_write_timeout_ms": 5000, "watchdog": false }' >"$TMP/wexd.json"
if "$WEXCTL" config reload >"$TMP/reload.out" 2>"$TMP/reload.err"; then
	fail "config reload of watchdog false under WatchdogSec= exited 0: $(cat "$TMP/reload.out")"; fi
grep -q "^wexctl: reload refused, keeping the running configuration: config $TMP/wexd.json: field 'watchdog': false, but systemd asks for watchdog pings" "$TMP/reload.err" ||
	fail "watchdog false refused without naming it: $(cat "$TMP/reload.err")"
kill -TERM "$WEXD_PID"; wait "$WEXD_PID"; rc=$?; WEXD_PID=""
[ $rc = 0 ] || fail "wexd exit code $rc"
wait_for "STOPPING=1"
wait_for "STATUS=draining: "
# watchdog false under a unit that asks for pings: refused at start, saying why.
if NOTIFY_SOCKET="$TMP/notify.sock" WATCHDOG_USEC=200000 WEX_WATCHDOG=false WEX_SOCKET="$TMP/w2.sock" \
	"$WEXD" 2>"$TMP/w2.log"; then fail "wexd started with watchdog false under WatchdogSec="; fi
grep -q "watchdog is false (env WEX_WATCHDOG) but systemd asks for watchdog pings every 200 ms" "$TMP/w2.log" ||
	fail "no clear refusal: $(cat "$TMP/w2.log")"
[ -e "$TMP/w2.sock" ] && fail "the refused wexd left its socket behind"
echo "PASS: READY, WATCHDOG (at half the interval), RELOADING, STOPPING, STATUS sent; SIGHUP and wexctl config reload applied and an invalid file refused (config reload exit 1); watchdog false under WatchdogSec= refused"
