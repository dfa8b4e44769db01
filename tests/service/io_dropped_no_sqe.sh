#!/bin/sh
# io_dropped_no_sqe.sh WEXD WEXCTL - proves that after io_uring dropped
# completions (EBADR) at a time its ring had no room to queue a request,
# the probe of the listener (the cancel that finds out whether its accept's
# completion was among those lost) is retried rather than skipped: skipped,
# a listener whose completion was lost was never armed again and wexd
# accepted no client for good (each one waited in the backlog).  Acted with
# WEX_URING_SQE_FAIL=2 (one request in two wexd queues finds no room)
# and WEX_URING_DROPPED=2 (a watch's completion lost every second wait),
# while rounds of clients ask for status.  Fifteen rounds: the listener's
# completion is lost and probed about six times a round (330 times in 60
# rounds on the dev VM on 2026-12-02), one probe in two finding no room;
# 60 rounds took 85 CPU-seconds under the sanitizers.
WEXD=$1 WEXCTL=$2
. "$(dirname "$0")/lib.sh"
WEX_IO=io_uring WEX_URING_SQE_FAIL=2 WEX_URING_DROPPED=2 start_wexd
round=0
while [ $round -lt 15 ]; do
	pids=""
	i=0
	while [ $i -lt 8 ]; do
		ASAN_OPTIONS=$CLIENT_ASAN_OPTIONS timeout 10 "$WEXCTL" status >/dev/null 2>&1 &
		pids="$pids $!"
		i=$((i+1))
	done
	for p in $pids; do
		wait "$p"; rc=$?
		[ $rc = 124 ] && fail "status hung in round $round (the listener lost: its probe skipped for want of room?): wexd: $(grep -v re-armed "$TMP/wexd.log" | tail -5)"
		[ $rc = 0 ] || fail "status exited $rc in round $round: wexd: $(tail -5 "$TMP/wexd.log")"
	done
	round=$((round+1))
done
grep -q "the listener's accept: its completion was among those io_uring dropped: re-armed" "$TMP/wexd.log" ||
	fail "no listener's completion lost and re-armed: the test acted nothing: $(tail -5 "$TMP/wexd.log")"
stop_wexd "(its signal watch lost?)"
rc=$WEXD_RC
[ $rc = 0 ] || fail "wexd exit code $rc"
echo "PASS: dropped completions while the ring had no room: the listener probed and re-armed, every client served"
