#!/bin/sh
# metrics_restore.sh WEXD WEXCTL PRODUCER - proves that
# wex_publish_to_visible_seconds counts publishes only: after a restart of
# wexd, producer ranks that reconnect and say they hold their version again
# (restored, no begin_write, no publish) make it visible again without an
# observation (each restart counted a publish that never happened, as long
# as the ranks' reconnects were apart), and the next real publish is
# observed.
WEXD=$1 WEXCTL=$2 PRODUCER=$3
. "$(dirname "$0")/lib.sh"
count() { "$WEXCTL" metrics | sed -n 's/^wex_publish_to_visible_seconds_count //p'; }
wait_log() { i=0; until [ "$(grep -c "$1" "$2" 2>/dev/null)" -ge "$3" ]; do i=$((i+1)); [ $i -lt 400 ] || fail "no $3 x '$1' in $2: $(tail -5 "$2")"; sleep 0.05; done; }
start_wexd
# Two ranks publish v1 and hold it.
"$PRODUCER" --rank 0 --world 2 --preset tiny --versions 1 --hold >"$TMP/p0.log" 2>&1 &
P0=$!
"$PRODUCER" --rank 1 --world 2 --preset tiny --versions 1 --hold >"$TMP/p1.log" 2>&1 &
P1=$!
cleanup_extra() { kill "$P0" "$P1" 2>/dev/null; wait "$P0" "$P1" 2>/dev/null; }
i=0; until [ "$(count)" = 1 ]; do i=$((i+1)); [ $i -lt 400 ] || fail "v1 never visible: $(tail -3 "$TMP/p1.log")"; sleep 0.05; done
kill -TERM "$WEXD_PID"; wait "$WEXD_PID"; WEXD_PID=""
start_wexd
wait_log "holds v1 again" "$TMP/wexd.log" 2
c=$(count)
[ "$c" = 0 ] || fail "restored ranks counted as a publish: wex_publish_to_visible_seconds_count $c"
# A real publish after the restart is counted: a model of its own.
"$PRODUCER" --rank 0 --world 1 --model other --preset tiny --versions 1 --hold >"$TMP/p2.log" 2>&1 &
P2=$!
cleanup_extra() { kill "$P0" "$P1" "$P2" 2>/dev/null; wait "$P0" "$P1" "$P2" 2>/dev/null; }
i=0; until [ "$(count)" = 1 ]; do i=$((i+1)); [ $i -lt 400 ] || fail "a real publish not counted: $(count)"; sleep 0.05; done
echo "PASS: restored ranks are not a publish; a real publish is observed"
