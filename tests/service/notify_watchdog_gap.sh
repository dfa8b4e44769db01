#!/bin/sh
# notify_watchdog_gap.sh WEXD - proves that a watchdog ping the service
# manager's full queue refused is sent again at the loop's next tick, not a
# whole half-interval later: with WATCHDOG_USEC=4 s (pings every 2 s), the
# manager stops reading just after one ping and reads again 2.4 s later
# (the next ping, due meanwhile, finds its queue full); the gap between the
# pings it receives must stay well under WATCHDOG_USEC.  Before, the
# refused ping counted as sent, the next came 4 s after the last received
# one, and systemd (WatchdogSec=) would have killed a healthy wexd for one
# short stall of its notify socket.
WEXD=$1
. "$(dirname "$0")/lib.sh"
PY=/usr/bin/python3; [ -x $PY ] || PY=python3
command -v $PY >/dev/null || skip "python3 missing"
$PY - "$TMP/notify.sock" "$TMP/notify.log" <<'PYEOF' &
import socket, sys, time
path, log = sys.argv[1:3]
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(path)
s.settimeout(30)
pings = []
f = open(log, "a", buffering=1)
f.write("listening\n")
def fill():
    # Fresh senders until one cannot send even its first datagram.
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
            return senders
stalled = False
try:
    while len(pings) < 6:
        m = s.recv(4096)
        if m != b"WATCHDOG=1":
            continue
        pings.append(time.monotonic())
        f.write("ping %.3f\n" % pings[-1])
        if len(pings) == 3 and not stalled:
            stalled = True
            senders = fill()
            f.write("stalled\n")
            time.sleep(2.4)
            f.write("reading again\n")
except socket.timeout:
    pass
gap = max(b - a for a, b in zip(pings, pings[1:])) if len(pings) > 1 else 99
f.write("pings %d max gap %.3f\n" % (len(pings), gap))
PYEOF
LISTENER=$!
cleanup_extra() { kill "$LISTENER" 2>/dev/null; wait "$LISTENER" 2>/dev/null; }
i=0; until grep -q listening "$TMP/notify.log" 2>/dev/null; do i=$((i+1)); [ $i -lt 200 ] || fail "listener"; sleep 0.05; done
NOTIFY_SOCKET="$TMP/notify.sock" WATCHDOG_USEC=4000000 start_wexd
i=0; until grep -q "max gap" "$TMP/notify.log"; do i=$((i+1)); [ $i -lt 600 ] || fail "no pings: $(cat "$TMP/notify.log")"; sleep 0.05; done
grep -q stalled "$TMP/notify.log" || fail "the manager never stalled: $(cat "$TMP/notify.log")"
gap=$(sed -n 's/.*max gap //p' "$TMP/notify.log")
$PY -c "import sys; sys.exit(float(sys.argv[1]) >= 3.6)" "$gap" ||
	fail "watchdog pings $gap s apart around a 2.4 s stall of the notify socket (WATCHDOG_USEC 4 s: systemd would kill wexd): $(cat "$TMP/notify.log"); wexd: $(tail -5 "$TMP/wexd.log")"
stop_wexd
[ "$WEXD_RC" = 0 ] || fail "wexd exit code $WEXD_RC"
echo "PASS: a ping refused by a full notify socket is sent again at the next tick (max gap $gap s)"
