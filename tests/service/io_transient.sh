#!/bin/sh
# io_transient.sh WEXD WEXCTL PRODUCER CONSUMER - proves that a transient
# io_uring_enter failure does not end wexd: EAGAIN (the kernel short of
# memory for a submission) and EBUSY (the completion queue overflowed) are
# retried, logged once with their count and counted in
# wex_event_loop_retries_total, while a producer and a consumer
# sync through it and pings are answered.  Acted with WEX_URING_TRANSIENT=2
# (every second wait fails so, EAGAIN and EBUSY in turn).
WEXD=$1 WEXCTL=$2 PRODUCER=$3 CONSUMER=$4
. "$(dirname "$0")/lib.sh"
WEX_IO=io_uring WEX_URING_TRANSIENT=2 start_wexd
"$PRODUCER" --rank 0 --world 1 --preset tiny --versions 3 --wait-group engine --hold >"$TMP/p.log" 2>&1 &
P=$!
"$CONSUMER" --rank 0 --world 1 --preset tiny --versions 3 --modes view,copy >"$TMP/c.log" 2>&1 &
C=$!
cleanup_extra() { kill "$P" "$C" 2>/dev/null; wait "$P" "$C" 2>/dev/null; }
wait $C || fail "consumer exited $?: $(tail -5 "$TMP/c.log"); wexd: $(tail -5 "$TMP/wexd.log")"
kill -0 $P || fail "producer: $(tail -5 "$TMP/p.log")"
grep -q MISMATCH "$TMP/c.log" && fail "consumer saw wrong bytes"
i=0
while [ $i -lt 20 ]; do
	"$WEXCTL" status >/dev/null || fail "status $i: wexd: $(tail -5 "$TMP/wexd.log")"
	i=$((i+1))
done
kill -0 "$WEXD_PID" || fail "wexd ended: $(tail -5 "$TMP/wexd.log")"
grep -q "error: event loop:" "$TMP/wexd.log" && fail "wexd took a transient failure for an error: $(grep "error: event loop:" "$TMP/wexd.log")"
n=$(grep -c "io_uring_enter: .* time(s) so far).*retried" "$TMP/wexd.log")
[ "$n" = 1 ] || fail "$n log lines of transient failures, not one (once a minute at most): $(cat "$TMP/wexd.log")"
"$WEXCTL" metrics >"$TMP/metrics" || fail "wexctl metrics"
for e in EAGAIN EBUSY; do
	grep -Eq "^wex_event_loop_retries_total\{error=\"$e\"\} [1-9]" "$TMP/metrics" ||
		fail "$e retries not counted: $(grep retries "$TMP/metrics")"
done
kill -TERM "$WEXD_PID"; wait "$WEXD_PID"; rc=$?; WEXD_PID=""
[ $rc = 0 ] || fail "wexd exit code $rc after transient failures"
echo "PASS: transient io_uring_enter failures (EAGAIN, EBUSY) retried, logged once; syncs and pings served"
