#!/bin/sh
# notify_stuck.sh WEXD WEXCTL - proves that a service manager that stops
# reading its notify socket cannot stall wexd's loop: with $NOTIFY_SOCKET's
# queue full from before wexd starts (and WATCHDOG_USEC asking for pings),
# wexd still starts and answers every status request and a SIGHUP reload
# (each waited for generously); once the manager reads again, the held-back
# READY=1, RELOADING=1, READY=1 arrive in that order, and STATUS= follows.
WEXD=$1 WEXCTL=$2
. "$(dirname "$0")/lib.sh"
PY=/usr/bin/python3; [ -x $PY ] || PY=python3
command -v $PY >/dev/null || skip "python3 missing"
# The manager: binds the socket, fills its queue (fresh senders until one
# cannot send even its first datagram), then reads nothing until told to.
$PY - "$TMP/notify.sock" "$TMP/notify.log" "$TMP/drain" <<'PYEOF' &
import os, socket, sys, time
path, log, drain = sys.argv[1:4]
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(path)
senders = []
while True:
    w = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    w.setblocking(False)
    senders.append(w)
    n = 0
    try:
        while True:
            w.sendto(b"filler", path)
            n += 1
    except BlockingIOError:
        pass
    if n == 0:
        break
with open(log, "a", buffering=1) as f:
    f.write("full\n")
    end = time.monotonic() + 300
    while not os.path.exists(drain) and time.monotonic() < end:
        time.sleep(0.05)
    s.settimeout(20)
    try:
        while True:
            m = s.recv(4096).decode().replace("\n", " ")
            if m != "filler":
                f.write("%s\n" % m)
    except socket.timeout:
        pass
PYEOF
LISTENER=$!
cleanup_extra() { kill "$LISTENER" 2>/dev/null; wait "$LISTENER" 2>/dev/null; }
i=0; until grep -q full "$TMP/notify.log" 2>/dev/null; do i=$((i+1)); [ $i -lt 400 ] || fail "manager socket never full"; sleep 0.05; done
# start_wexd, with a bound on the wait for its ready line.
export WEX_SOCKET="$TMP/wexd.sock"
mkfifo "$TMP/ready"
NOTIFY_SOCKET="$TMP/notify.sock" WATCHDOG_USEC=200000 WEXD_READY_FD=3 "$WEXD" 3>"$TMP/ready" 2>>"$TMP/wexd.log" &
WEXD_PID=$!
timeout 60 sh -c 'read -r _ <"$1"' _ "$TMP/ready" || fail "wexd not ready within 60 s under a full notify socket: $(tail -5 "$TMP/wexd.log")"
# Each request changes STATUS= (one client more, then less) while the
# watchdog pings every 100 ms: none of it may hold the loop.
for n in 1 2 3 4 5 6 7 8 9 10; do
	timeout 30 "$WEXCTL" status >/dev/null || fail "status $n not answered within 30 s under a full notify socket"
done
kill -HUP "$WEXD_PID"
i=0; until grep -q "reloaded" "$TMP/wexd.log"; do i=$((i+1)); [ $i -lt 600 ] || fail "SIGHUP reload not done within 30 s: $(tail -5 "$TMP/wexd.log")"; sleep 0.05; done
timeout 30 "$WEXCTL" status >/dev/null || fail "status after the reload not answered within 30 s"
grep -q "notify socket is full" "$TMP/wexd.log" || fail "wexd did not say the notify socket is full: $(tail -5 "$TMP/wexd.log")"
# The manager reads again: what was held back arrives, in order.
touch "$TMP/drain"
i=0; until grep -q "^STATUS=" "$TMP/notify.log"; do i=$((i+1)); [ $i -lt 600 ] || fail "no STATUS= after the queue drained: $(cat "$TMP/notify.log")"; sleep 0.05; done
order=$(grep -E '^(READY|RELOADING)=' "$TMP/notify.log" | cut -d' ' -f1 | tr '\n' ' ')
[ "$order" = "READY=1 RELOADING=1 READY=1 " ] || fail "held-back notifications: got '$order', want 'READY=1 RELOADING=1 READY=1'"
echo "PASS: a full notify socket held nothing; held-back notifications arrived in order"
