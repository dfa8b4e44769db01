# tests/service/lib.sh - shared helpers for the service tests (sourced).
# Exit codes: 0 pass, 1 fail, 77 skip (reason printed).
fail() { echo "FAIL: $*" >&2; exit 1; }
skip() { echo "SKIP: $*" >&2; exit 77; }
TMP=$(mktemp -d /tmp/wex-svc.XXXXXX)
chmod 755 "$TMP"
WEXD_PID=""
cleanup_extra() { :; }
RO_MOUNT=""
cleanup() {
	cleanup_extra
	[ -n "$WEXD_PID" ] && kill -TERM "$WEXD_PID" 2>/dev/null && wait "$WEXD_PID" 2>/dev/null
	# (After wexd, which holds the directory open.)
	[ -n "$RO_MOUNT" ] && umount "$RO_MOUNT" 2>/dev/null
	rm -rf "$TMP"
}
trap cleanup EXIT
# ro_bind SRC DIR: DIR becomes a read-only bind mount of SRC, unmounted at
# the end once wexd has stopped; skips where that cannot be done (needs
# root) or the mount is still writable.
ro_bind() {
	mount --bind "$1" "$2" 2>/dev/null && mount -o remount,bind,ro "$2" 2>/dev/null ||
		{ umount "$2" 2>/dev/null; skip "cannot bind-mount a read-only directory (needs root)"; }
	RO_MOUNT=$2
	touch "$2/x" 2>/dev/null && skip "the read-only bind mount is writable"
}
# ASAN_OPTIONS for the clients a test runs by the hundred only to load
# wexd: LeakSanitizer's check at each exit costs 50 ms of CPU a process in
# the sanitizer build (a third of such a test's time); wexctl's own tests
# keep it.
CLIENT_ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
# start_wexd [args...]: starts wexd on $TMP/wexd.sock and waits until it listens.
start_wexd() {
	export WEX_SOCKET="$TMP/wexd.sock"
	mkfifo "$TMP/ready"
	WEXD_READY_FD=3 "$WEXD" "$@" 3>"$TMP/ready" 2>>"$TMP/wexd.log" &
	WEXD_PID=$!
	read -r _ <"$TMP/ready" || fail "wexd did not start: $(cat "$TMP/wexd.log")"
	rm -f "$TMP/ready"
}
# stop_wexd [WHAT]: SIGTERM, then at most 10 s for wexd to end (else fail,
# naming WHAT); its exit code in $WEXD_RC.
stop_wexd() {
	kill -TERM "$WEXD_PID"
	_i=0
	while kill -0 "$WEXD_PID" 2>/dev/null && [ $_i -lt 100 ]; do sleep 0.1; _i=$((_i+1)); done
	kill -0 "$WEXD_PID" 2>/dev/null && fail "wexd did not stop on SIGTERM${1:+ $1}"
	wait "$WEXD_PID"; WEXD_RC=$?; WEXD_PID=""
}
# status_each N: N `wexctl status` in turn, each answered within 10 s.
status_each() {
	_i=0
	while [ $_i -lt "$1" ]; do
		timeout 10 "$WEXCTL" status >/dev/null 2>"$TMP/ctl.log"; _rc=$?
		[ $_rc = 124 ] && fail "status $_i hung: wexd: $(tail -5 "$TMP/wexd.log")"
		[ $_rc = 0 ] || fail "status $_i: $(cat "$TMP/ctl.log"); wexd: $(tail -5 "$TMP/wexd.log")"
		_i=$((_i+1))
	done
}
# sync_pair: $PRODUCER (held after its 3 tiny versions) and $CONSUMER
# (view and copy syncs of them) through wexd; the consumer must end within
# 30 s with every byte right, the producer still running.
sync_pair() {
	"$PRODUCER" --rank 0 --world 1 --preset tiny --versions 3 --wait-group engine --hold >"$TMP/p.log" 2>&1 &
	P=$!
	timeout 30 "$CONSUMER" --rank 0 --world 1 --preset tiny --versions 3 --modes view,copy >"$TMP/c.log" 2>&1 &
	C=$!
	cleanup_extra() { kill "$P" "$C" 2>/dev/null; wait "$P" "$C" 2>/dev/null; }
	wait $C; _rc=$?
	[ $_rc = 124 ] && fail "consumer hung (a request never answered): $(tail -3 "$TMP/c.log"); wexd: $(tail -5 "$TMP/wexd.log")"
	[ $_rc = 0 ] || fail "consumer exited $_rc: $(tail -5 "$TMP/c.log"); wexd: $(tail -5 "$TMP/wexd.log")"
	kill -0 $P || fail "producer: $(tail -5 "$TMP/p.log")"
	grep -q MISMATCH "$TMP/c.log" && fail "consumer saw wrong bytes"
	return 0
}
# view_engine: $PRODUCER holding v1 of model "policy" ($P, log $TMP/p.log)
# and a Python engine ($E, log $TMP/e.log, through the binding and
# $LIBWEX) holding a remap-view lease on it, once it synced.  The caller
# sets $PY and a cleanup_extra that kills $E and $P.
view_engine() {
	"$PRODUCER" --rank 0 --world 1 --preset tiny --versions 1 --hold >"$TMP/p.log" 2>&1 &
	P=$!
	LD_PRELOAD=${WEX_PY_PRELOAD:-} ASAN_OPTIONS=detect_leaks=0 WEX_LIB=$LIBWEX \
	PYTHONPATH="$(dirname "$0")/../../adapters/python" $PY - >"$TMP/e.log" 2>&1 <<'PYEOF' &
import time, wex
c = wex.Client(wex.ROLE_CONSUMER, "policy", group="engine")
r = c.sync(wex.SYNC_REMAP_VIEW, min_version=1, timeout_ms=20000)
print("synced v%d" % r.version, flush=True)
time.sleep(600)
PYEOF
	E=$!
	_i=0; until grep -q "synced v1" "$TMP/e.log"; do
		_i=$((_i+1)); [ $_i -lt 400 ] || fail "the engine did not sync: $(tail -3 "$TMP/e.log")"
		kill -0 $E 2>/dev/null || fail "the engine exited: $(tail -3 "$TMP/e.log")"; sleep 0.05; done
}
