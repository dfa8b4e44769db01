#!/bin/sh
# io_recv_give_up.sh WEXD WEXCTL PRODUCER CONSUMER - proves that a
# connection whose next receive io_uring has no room to queue for good is
# closed after 10 s, with a warning that says why, rather than left waiting
# with its request never answered.  Acted with
# WEX_URING_SQE_FAIL=recv (every receive but a connection's first finds no
# room, retried or not).
WEXD=$1 WEXCTL=$2 PRODUCER=$3 CONSUMER=$4
. "$(dirname "$0")/lib.sh"
WEX_IO=io_uring WEX_URING_SQE_FAIL=recv start_wexd
"$PRODUCER" --rank 0 --world 1 --preset tiny --versions 1 --hold >"$TMP/p.log" 2>&1 &
P=$!
cleanup_extra() { kill "$P" 2>/dev/null; wait "$P" 2>/dev/null; }
start=$(date +%s)
timeout 40 "$CONSUMER" --rank 0 --world 1 --preset tiny --versions 1 --modes copy >"$TMP/c.log" 2>&1; rc=$?
took=$(($(date +%s) - start))
[ $rc = 124 ] && fail "consumer hung (its request never answered, its connection never closed): wexd: $(tail -5 "$TMP/wexd.log")"
[ $rc = 0 ] && fail "consumer passed with every receive after the first failing?: $(tail -3 "$TMP/c.log")"
[ $took -ge 8 ] || fail "consumer ended after $took s, before wexd gave up its receive: $(tail -3 "$TMP/c.log")"
grep -q "no room to queue a client's receive for 10 s .*closing its connection" "$TMP/wexd.log" ||
	fail "no warning for the closed connection: $(tail -5 "$TMP/wexd.log")"
kill -TERM "$WEXD_PID"; wait "$WEXD_PID"; rc=$?; WEXD_PID=""
[ $rc = 0 ] || fail "wexd exit code $rc"
echo "PASS: a receive without room for 10 s closes its connection, with a warning (consumer ended after $took s)"
