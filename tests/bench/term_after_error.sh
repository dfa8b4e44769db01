#!/bin/sh
# tests/bench/term_after_error.sh HOST_SYNC_LOST_COPY WEXD - a benchmark
# that failed prints its JSON line from its exit handler; a SIGTERM that
# comes while that handler still cleans up (wexd killed and reaped) must
# not add a second JSON line ("terminated") after the one saying why it
# failed.  The handler's waitpid is held 2 s with strace to open the
# window.  77 without a usable strace.
B=$1
WEXD=$2
command -v strace >/dev/null 2>&1 || { echo "SKIP: no strace"; exit 77; }
strace -o /dev/null true 2>/dev/null || { echo "SKIP: strace cannot trace here"; exit 77; }
out=$(mktemp)
trap 'rm -f "$out"' EXIT
WEX_BENCH_SMALL=1 strace -o /dev/null -e trace=wait4 -e inject=wait4:delay_enter=2000000 \
	"$B" "$WEXD" >"$out" 2>/dev/null &
tracer=$!
# (Until the run printed its line, not for 10 s: a run slower than that
# (strace stops it at each syscall; the sanitizers; a loaded machine) was
# sent the SIGTERM before it failed, and its line said "terminated".)
i=0
until grep -q '^{"bench"' "$out"; do
	kill -0 $tracer 2>/dev/null || break
	i=$((i + 1))
	[ $i -lt 1000 ] || { echo "FAIL: no JSON line within 50 s"; kill $tracer; exit 1; }
	sleep 0.05
done
bench=$(pgrep -P $tracer)
[ -n "$bench" ] && kill -TERM $bench
wait $tracer
n=$(grep -c '{"bench"' "$out")
echo "JSON lines: $n; last: $(tail -n 1 "$out")"
[ "$n" -eq 1 ] || { echo "FAIL: $n JSON lines, not one"; exit 1; }
tail -n 1 "$out" | grep -q '"error":"copied bytes are wrong' ||
	{ echo "FAIL: the last line does not say why the run failed"; exit 1; }
echo PASS
