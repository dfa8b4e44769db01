# tests/service/lib.sh - shared helpers for the service tests (sourced).
# Exit codes: 0 pass, 1 fail, 77 skip (reason printed).
fail() { echo "FAIL: $*" >&2; exit 1; }
skip() { echo "SKIP: $*" >&2; exit 77; }
TMP=$(mktemp -d /tmp/wex-svc.XXXXXX)
chmod 755 "$TMP"
WEXD_PID=""
cleanup_extra() { :; }
cleanup() {
	cleanup_extra
	[ -n "$WEXD_PID" ] && kill -TERM "$WEXD_PID" 2>/dev/null && wait "$WEXD_PID" 2>/dev/null
	rm -rf "$TMP"
}
trap cleanup EXIT
# start_wexd [args...]: starts wexd on $TMP/wexd.sock and waits until it listens.
start_wexd() {
	export WEX_SOCKET="$TMP/wexd.sock"
	mkfifo "$TMP/ready"
	WEXD_READY_FD=3 "$WEXD" "$@" 3>"$TMP/ready" 2>>"$TMP/wexd.log" &
	WEXD_PID=$!
	read -r _ <"$TMP/ready" || fail "wexd did not start: $(cat "$TMP/wexd.log")"
	rm -f "$TMP/ready"
}
