#!/bin/sh
# io_retry_stress.sh WEXD WEXCTL - io_uring requests the ring had no room
# for, queued to retry, while their connections close: many clients that
# connect, ask and hang up (or are killed mid-request) with one in two
# requests wexd queues finding no room (WEX_URING_SQE_FAIL=2), so that
# receives, pidfd polls and their cancels wait on the retry queue while
# their connection goes; then SIGTERM with clients still connected.  wexd
# must serve every status, not crash (a retry left queued after its
# connection was freed: a use-after-free under the sanitizers), and stop
# with exit code 0.
WEXD=$1 WEXCTL=$2
. "$(dirname "$0")/lib.sh"
for fail_every in 2 3; do
	: >"$TMP/wexd.log"
	WEX_IO=io_uring WEX_URING_SQE_FAIL=$fail_every start_wexd
	round=0
	while [ $round -lt 4 ]; do
		pids=""
		i=0
		while [ $i -lt 12 ]; do
			ASAN_OPTIONS=$CLIENT_ASAN_OPTIONS timeout 10 "$WEXCTL" status >/dev/null 2>&1 &
			pids="$pids $!"
			i=$((i+1))
		done
		# Killed mid-request: their connections close while wexd
		# works on them.
		j=0
		while [ $j -lt 4 ]; do
			ASAN_OPTIONS=$CLIENT_ASAN_OPTIONS "$WEXCTL" status >/dev/null 2>&1 &
			kill -KILL $! 2>/dev/null
			j=$((j+1))
		done
		for p in $pids; do
			wait "$p"; rc=$?
			[ $rc = 0 ] || fail "status exited $rc (SQE_FAIL=$fail_every, round $round): wexd: $(tail -5 "$TMP/wexd.log")"
		done
		kill -0 "$WEXD_PID" || fail "wexd ended: $(tail -20 "$TMP/wexd.log")"
		round=$((round+1))
	done
	# Stopped with clients connected (their receives queued or in flight).
	i=0; pids=""
	while [ $i -lt 6 ]; do
		"$WEXCTL" status >/dev/null 2>&1 &
		pids="$pids $!"
		i=$((i+1))
	done
	stop_wexd
	rc=$WEXD_RC
	for p in $pids; do wait "$p"; done
	grep -q "ERROR: [A-Za-z]*Sanitizer\|runtime error:" "$TMP/wexd.log" &&
		fail "sanitizer (SQE_FAIL=$fail_every): $(grep -A12 "ERROR: [A-Za-z]*Sanitizer\|runtime error:" "$TMP/wexd.log" | head -30)"
	[ $rc = 0 ] || fail "wexd exit code $rc (SQE_FAIL=$fail_every): $(tail -20 "$TMP/wexd.log")"
	grep -q "no room to queue" "$TMP/wexd.log" || fail "no request found no room (SQE_FAIL=$fail_every)"
	rm -f "$TMP/wexd.sock"
done
# Every receive but a connection's first finds no room: clients that got
# their answer and left (seen through their pidfd, their receive queued),
# and held ones still waiting when wexd stops.
: >"$TMP/wexd.log"
WEX_IO=io_uring WEX_URING_SQE_FAIL=recv start_wexd
timeout 20 /usr/bin/python3 - "$TMP/wexd.sock" >"$TMP/once.log" 2>&1 <<'PY' || fail "one-request clients under SQE_FAIL=recv: $(tail -3 "$TMP/once.log"); wexd: $(tail -5 "$TMP/wexd.log")"
import socket, sys
for _ in range(20):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.connect(sys.argv[1])
    s.send(b'{"v":1,"op":"ping"}')
    assert s.recv(4096)
    s.close()
PY
/usr/bin/python3 - "$TMP/wexd.sock" >"$TMP/held.log" 2>&1 <<'PY' &
import socket, sys, time
held = []
for _ in range(5):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.connect(sys.argv[1])
    s.send(b'{"v":1,"op":"ping"}')
    s.recv(4096)
    held.append(s)
print("held", flush=True)
time.sleep(5)
PY
H=$!
cleanup_extra() { kill "$H" 2>/dev/null; wait "$H" 2>/dev/null; }
i=0
while ! grep -q held "$TMP/held.log" && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done
grep -q held "$TMP/held.log" || fail "held clients: $(cat "$TMP/held.log")"
stop_wexd "with receives queued"
rc=$WEXD_RC
grep -q "ERROR: [A-Za-z]*Sanitizer\|runtime error:" "$TMP/wexd.log" &&
	fail "sanitizer (SQE_FAIL=recv): $(grep -A12 "ERROR: [A-Za-z]*Sanitizer\|runtime error:" "$TMP/wexd.log" | head -30)"
[ $rc = 0 ] || fail "wexd exit code $rc with receives queued: $(tail -20 "$TMP/wexd.log")"
echo "PASS: requests queued for room while their connections closed and wexd stopped: no crash, all served"
