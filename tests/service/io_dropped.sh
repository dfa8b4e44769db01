#!/bin/sh
# io_dropped.sh WEXD WEXCTL PRODUCER CONSUMER - proves that io_uring
# reporting dropped completions (EBADR: the completion queue overflowed and
# the kernel had no memory to hold the overflow) does not end wexd and every
# client with it: logged as an error once a minute at most, counted in
# wex_event_loop_retries_total{error="EBADR"}, and the loop carries on while
# a producer and a consumer sync and pings are answered.  A listener or
# signal watch whose completion was among those lost is re-armed: wexd
# still accepts clients and stops on SIGTERM.  Acted with
# WEX_URING_DROPPED=3 (at every third wait wexd loses the last
# completion of the listener's accept or of the signalfd's poll, in turn, and
# the next wait reports EBADR).
WEXD=$1 WEXCTL=$2 PRODUCER=$3 CONSUMER=$4
. "$(dirname "$0")/lib.sh"
WEX_IO=io_uring WEX_URING_DROPPED=3 start_wexd
sync_pair
status_each 20
kill -0 "$WEXD_PID" || fail "wexd ended: $(tail -5 "$TMP/wexd.log")"
grep -q "error: event loop:" "$TMP/wexd.log" && fail "wexd ended its loop: $(grep "error: event loop:" "$TMP/wexd.log")"
n=$(grep -c "io_uring dropped completions (EBADR, .* time(s) so far).*carrying on" "$TMP/wexd.log")
[ "$n" = 1 ] || fail "$n log lines of dropped completions, not one: $(tail -5 "$TMP/wexd.log")"
timeout 10 "$WEXCTL" metrics >"$TMP/metrics" || fail "wexctl metrics"
grep -Eq '^wex_event_loop_retries_total\{error="EBADR"\} [1-9]' "$TMP/metrics" ||
	fail "dropped completions not counted: $(grep retries "$TMP/metrics")"
for w in "the listener's accept" "a watch's poll"; do
	grep -q "$w: its completion was among those io_uring dropped: re-armed" "$TMP/wexd.log" ||
		fail "$w not re-armed: $(tail -5 "$TMP/wexd.log")"
done
stop_wexd "(its signal watch lost?)"
rc=$WEXD_RC
[ $rc = 0 ] || fail "wexd exit code $rc after dropped completions"
echo "PASS: io_uring dropped completions (EBADR) logged and counted; wexd carried on"
