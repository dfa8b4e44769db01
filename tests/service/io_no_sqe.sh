#!/bin/sh
# io_no_sqe.sh WEXD WEXCTL PRODUCER CONSUMER - proves that an io_uring
# request the ring had no room for (the submission queue full and
# io_uring_submit failing: EAGAIN under memory pressure, EBUSY on a
# completion queue overflow) is retried rather than lost: no connection
# is left without its receive (its next request never answered), no client
# refused, while a producer and a consumer sync through wexd and pings are
# answered.  Counted in wex_event_loop_retries_total{error="no_sqe"} and
# logged once.  Acted with WEX_URING_SQE_FAIL=4 (one request in four wexd
# queues finds no room).
WEXD=$1 WEXCTL=$2 PRODUCER=$3 CONSUMER=$4
. "$(dirname "$0")/lib.sh"
WEX_IO=io_uring WEX_URING_SQE_FAIL=4 start_wexd
sync_pair
status_each 20
kill -0 "$WEXD_PID" || fail "wexd ended: $(tail -5 "$TMP/wexd.log")"
n=$(grep -c "io_uring: no room to queue a request .* time(s) so far).*retried" "$TMP/wexd.log")
[ "$n" = 1 ] || fail "$n log lines of requests without room, not one (once a minute at most): $(tail -5 "$TMP/wexd.log")"
timeout 10 "$WEXCTL" metrics >"$TMP/metrics" || fail "wexctl metrics"
grep -Eq '^wex_event_loop_retries_total\{error="no_sqe"\} [1-9]' "$TMP/metrics" ||
	fail "requests without room not counted: $(grep retries "$TMP/metrics")"
stop_wexd "(its signal watch lost?)"
rc=$WEXD_RC
[ $rc = 0 ] || fail "wexd exit code $rc"
echo "PASS: io_uring requests without room retried: syncs and pings served, none hung"
