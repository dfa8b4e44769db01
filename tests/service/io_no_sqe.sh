#!/bin/sh
# io_no_sqe.sh WEXD WEXCTL PRODUCER CONSUMER - proves that an io_uring
# request the ring had no room for (the submission queue full and
# io_uring_submit failing: EAGAIN under memory pressure, EBUSY on a
# completion queue overflow) is retried rather than lost: no connection
# is left without its receive (its next request never answered), no client
# refused, while a producer and a consumer sync through wexd and pings are
# answered.  Counted in wex_event_loop_retries_total{error="no_sqe"} and
# logged once.  Acted with WEX_URING_SQE_FAIL=4 (every fourth request wexd
# queues finds no room).
WEXD=$1 WEXCTL=$2 PRODUCER=$3 CONSUMER=$4
. "$(dirname "$0")/lib.sh"
WEX_IO=io_uring WEX_URING_SQE_FAIL=4 start_wexd
"$PRODUCER" --rank 0 --world 1 --preset tiny --versions 3 --wait-group engine --hold >"$TMP/p.log" 2>&1 &
P=$!
timeout 30 "$CONSUMER" --rank 0 --world 1 --preset tiny --versions 3 --modes view,copy >"$TMP/c.log" 2>&1 &
C=$!
cleanup_extra() { kill "$P" "$C" 2>/dev/null; wait "$P" "$C" 2>/dev/null; }
wait $C; rc=$?
[ $rc = 124 ] && fail "consumer hung (a request never answered): $(tail -3 "$TMP/c.log"); wexd: $(tail -5 "$TMP/wexd.log")"
[ $rc = 0 ] || fail "consumer exited $rc: $(tail -5 "$TMP/c.log"); wexd: $(tail -5 "$TMP/wexd.log")"
kill -0 $P || fail "producer: $(tail -5 "$TMP/p.log")"
grep -q MISMATCH "$TMP/c.log" && fail "consumer saw wrong bytes"
i=0
while [ $i -lt 20 ]; do
	timeout 10 "$WEXCTL" status >/dev/null 2>"$TMP/ctl.log"; rc=$?
	[ $rc = 124 ] && fail "status $i hung: wexd: $(tail -5 "$TMP/wexd.log")"
	[ $rc = 0 ] || fail "status $i: $(cat "$TMP/ctl.log"); wexd: $(tail -5 "$TMP/wexd.log")"
	i=$((i+1))
done
kill -0 "$WEXD_PID" || fail "wexd ended: $(tail -5 "$TMP/wexd.log")"
n=$(grep -c "io_uring: no room to queue a request .* time(s) so far).*retried" "$TMP/wexd.log")
[ "$n" = 1 ] || fail "$n log lines of requests without room, not one (once a minute at most): $(tail -5 "$TMP/wexd.log")"
timeout 10 "$WEXCTL" metrics >"$TMP/metrics" || fail "wexctl metrics"
grep -Eq '^wex_event_loop_retries_total\{error="no_sqe"\} [1-9]' "$TMP/metrics" ||
	fail "requests without room not counted: $(grep retries "$TMP/metrics")"
kill -TERM "$WEXD_PID"
i=0
while kill -0 "$WEXD_PID" 2>/dev/null && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done
kill -0 "$WEXD_PID" 2>/dev/null && fail "wexd did not stop on SIGTERM (its signal watch lost?)"
wait "$WEXD_PID"; rc=$?; WEXD_PID=""
[ $rc = 0 ] || fail "wexd exit code $rc"
echo "PASS: io_uring requests without room retried: syncs and pings served, none hung"
