#!/bin/sh
# examples/quickstart.sh - installs what is missing, builds wex, and runs the
# main job on the host-memory backend: wexd in a temporary directory, two
# trainer ranks (each owning half of a Qwen2-0.5B-like model, ~1 GB of bf16,
# every tensor split along its first dimension) publishing versions, and two
# inference ranks of one engine syncing each version in each mode (remap view, remap at
# the same addresses, copy) and checking every byte.  Prints each sync's
# latency and bandwidth, then `wexctl status` and `wexctl metrics`, and shuts
# everything down cleanly.
#
#   examples/quickstart.sh [--preset qwen2-0.5b|small|tiny] [--versions N]
#
# Bad arguments exit 2 with the usage before anything is installed or
# built.  Any failure once wexd runs (a consumer's error, a producer gone
# before the end, wexd gone) ends with "quickstart: FAILED (why)" and
# wexd's log, exit 1.
set -eu
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PRESET=qwen2-0.5b
VERSIONS=3
USAGE="usage: $0 [--preset qwen2-0.5b|small|tiny] [--versions N]"
usage() {
	echo "quickstart: $1" >&2
	echo "$USAGE" >&2
	exit 2
}
while [ $# -gt 0 ]; do
	case "$1" in
	--preset|--versions) [ $# -ge 2 ] || usage "$1 needs a value" ;;
	esac
	case "$1" in
	--preset)
		case "$2" in
		qwen2-0.5b|small|tiny) PRESET=$2 ;;
		*) usage "unknown preset '$2'" ;;
		esac
		shift 2 ;;
	--versions)
		# A whole number from 1 (the programs take at most 2^32 - 1).
		case "$2" in
		*[!0-9]*|"") usage "bad --versions '$2': a whole number from 1" ;;
		esac
		case "$2" in
		*[1-9]*) ;;
		*) usage "bad --versions '$2': a whole number from 1" ;;
		esac
		[ ${#2} -le 9 ] || usage "bad --versions '$2': at most 999999999"
		VERSIONS=$2; shift 2 ;;
	-h|--help) echo "$USAGE"; exit 0 ;;
	*) usage "unknown argument '$1'" ;;
	esac
done
. "$ROOT/tests/deps.sh"
wex_install_deps
B="$ROOT/build"
TMP=""
WEXD_PID=""
PIDS=""
CPIDS=""
BUILD_PID=""
cleanup() {
	if [ -n "$BUILD_PID" ]; then
		# Its whole group: cmake, on SIGTERM, waits for its make.
		kill -s TERM -- "-$BUILD_PID" 2>/dev/null ||
			kill "$BUILD_PID" 2>/dev/null || true
		wait "$BUILD_PID" 2>/dev/null || true
	fi
	for p in $PIDS $CPIDS; do kill "$p" 2>/dev/null || true; done
	for p in $PIDS $CPIDS; do wait "$p" 2>/dev/null || true; done
	if [ -n "$WEXD_PID" ]; then
		kill -TERM "$WEXD_PID" 2>/dev/null || true
		wait "$WEXD_PID" 2>/dev/null || true
	fi
	[ -z "$TMP" ] || rm -rf "$TMP"
}
# A signal ends the script (cleanup runs at its exit): a trap that only
# cleaned up let it go on, into the logs it had just removed.
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP # (a closed terminal: the build is in a session of its own)
# One build into build/ at a time: a second quickstart started meanwhile
# (another terminal, a script run twice) waits for the first's, instead of
# both making the same files at once.  (The lock goes with fd 9, closed
# once built.)
mkdir -p "$B"
if command -v flock >/dev/null; then
	exec 9>"$B/.quickstart.lock"
	if ! flock -n 9; then
		echo "== another build into $B runs (a quickstart started before this one): waiting for it"
		flock 9
	fi
fi
# A build/ configured already keeps its build type (a Debug build of
# yours is not turned into a Release one); a new one is Release.
if [ -f "$B/CMakeCache.txt" ]; then
	BT=$(sed -n 's/^CMAKE_BUILD_TYPE:[A-Z]*=//p' "$B/CMakeCache.txt")
	echo "== building into $B (configured already: build type ${BT:-none} kept)"
	cmake -S "$ROOT" -B "$B" >/dev/null
else
	echo "== building into $B"
	cmake -S "$ROOT" -B "$B" -DCMAKE_BUILD_TYPE=Release >/dev/null
fi
# In the background, waited for, so that a signal's trap stops it (a
# SIGTERM during the build exited 143 and left make building on); in a
# process group of its own, which the trap stops whole (cmake, on SIGTERM,
# only waits for its make and the compilers to finish the build).
setsid -w cmake --build "$B" -j "$(nproc)" >/dev/null &
BUILD_PID=$!
rc=0; wait "$BUILD_PID" || rc=$?
BUILD_PID=""
[ $rc -eq 0 ] || exit $rc
exec 9>&-

TMP=$(mktemp -d /tmp/wex-quickstart.XXXXXX)
export WEX_SOCKET="$TMP/wexd.sock"

echo "== starting wexd on $WEX_SOCKET"
mkfifo "$TMP/ready"
WEXD_READY_FD=3 "$B/wexd" 3>"$TMP/ready" 2>"$TMP/wexd.log" &
WEXD_PID=$!
if ! read -r _ <"$TMP/ready"; then
	# (It exited before it was ready; its log goes with $TMP.)
	echo "quickstart: wexd did not start; its log:" >&2
	cat "$TMP/wexd.log" >&2
	exit 1
fi

echo "== 2 producer ranks (trainer), model 'policy', preset $PRESET, $VERSIONS versions"
for r in 0 1; do
	"$B/wex-producer" --rank $r --world 2 --preset "$PRESET" --versions "$VERSIONS" \
		--wait-group engine --hold >"$TMP/producer$r.log" 2>&1 &
	PIDS="$PIDS $!"
done
echo "== 2 consumer ranks (inference engine 'engine'), modes view, fixed, copy"
for r in 0 1; do
	"$B/wex-consumer" --rank $r --world 2 --preset "$PRESET" --versions "$VERSIONS" \
		--modes view,fixed,copy >"$TMP/consumer$r.log" 2>&1 &
	CPIDS="$CPIDS $!"
done
fail=0
for p in $CPIDS; do wait "$p" || fail=1; done
CPIDS="" # (reaped: cleanup must not signal their numbers)
cat "$TMP/producer0.log" "$TMP/producer1.log"
cat "$TMP/consumer0.log" "$TMP/consumer1.log"
echo
# The diagnostics below may fail (wexd gone): the verdict and wexd's log
# are printed all the same.
echo "== wexctl status (producers still attached)"
status=0
"$B/wexctl" status || status=$?
echo
echo "== wexctl metrics (excerpt)"
"$B/wexctl" metrics 2>&1 | grep -E '^wex_(syncs|sync_bytes|clients|leases|segments|exported)' | head -20 || true
echo
why=""
[ $fail -eq 0 ] || why="a consumer reported an error"
[ $status -eq 0 ] || why="${why:+$why; }wexctl status exited $status"
# The producers hold (--hold) until the cleanup stops them: one gone now
# failed (an error, a crash, the OOM killer), however the consumers fared.
live=""
for p in $PIDS; do
	if kill -0 "$p" 2>/dev/null; then live="$live $p"; continue; fi
	rc=0; wait "$p" || rc=$?
	why="${why:+$why; }a producer exited (status $rc)"
done
PIDS=$live # (the reaped ones: cleanup must not signal their numbers)
if ! kill -0 "$WEXD_PID" 2>/dev/null; then
	rc=0; wait "$WEXD_PID" || rc=$?
	WEXD_PID=""
	why="${why:+$why; }wexd exited (status $rc)"
fi
if [ -n "$why" ]; then
	echo "quickstart: FAILED ($why); wexd log:"
	cat "$TMP/wexd.log" || true
	exit 1
fi
echo "quickstart: every sync of every version in every mode verified byte for byte"
