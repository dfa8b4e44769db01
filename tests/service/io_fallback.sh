#!/bin/sh
# io_fallback.sh WEXD WEXCTL - proves that wexd does not run its io_uring
# loop on a kernel without IORING_FEAT_EXT_ARG (before 5.11: liburing then
# times its waits with a timeout request of its own, whose completion the
# loop took for one of its requests and crashed on), acted here with
# WEX_URING_NO_EXT_ARG=1: by default it falls back to epoll, saying why in
# the log and in status, and serves; with io_uring forced it does not start,
# saying why.
WEXD=$1 WEXCTL=$2
. "$(dirname "$0")/lib.sh"
PY=/usr/bin/python3; [ -x $PY ] || PY=python3
command -v $PY >/dev/null || skip "python3 missing"
WEX_IO=auto WEX_URING_NO_EXT_ARG=1 start_wexd
grep -q "io_uring unavailable (kernel lacks IORING_FEAT_EXT_ARG (before 5.11) (acted: WEX_URING_NO_EXT_ARG=1)): using epoll" "$TMP/wexd.log" ||
	fail "no fallback logged: $(cat "$TMP/wexd.log")"
"$WEXCTL" status --json >"$TMP/status.json" || fail "status"
$PY - "$TMP/status.json" <<'PYEOF' || fail "status does not show the fallback: $(cat "$TMP/status.json")"
import json, sys
d = json.load(open(sys.argv[1]))["daemon"]
assert d["io"] == "epoll", d
assert "IORING_FEAT_EXT_ARG" in d.get("io_fallback_reason", ""), d
PYEOF
kill -TERM "$WEXD_PID"; wait "$WEXD_PID"; rc=$?; WEXD_PID=""
[ $rc = 0 ] || fail "wexd exit code $rc"
WEX_IO=io_uring WEX_URING_NO_EXT_ARG=1 WEX_SOCKET="$TMP/forced.sock" timeout 10 "$WEXD" 2>"$TMP/forced.log"
rc=$?
# 2: the unit does not restart it (RestartPreventExitStatus=2); it would
# fail the same way at every start.
if [ $rc != 2 ]; then
	fail "wexd with io_uring forced without IORING_FEAT_EXT_ARG exited $rc, not 2"
fi
grep -q "io_uring forced but unavailable: kernel lacks IORING_FEAT_EXT_ARG" "$TMP/forced.log" ||
	fail "unclear error with io_uring forced: $(cat "$TMP/forced.log")"
echo "PASS: without IORING_FEAT_EXT_ARG wexd falls back to epoll, saying why, or with io_uring forced does not start"
