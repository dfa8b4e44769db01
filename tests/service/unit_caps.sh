#!/bin/sh
# unit_caps.sh UNIT WEXD LIBWEX - proves that consumers are not handed a
# writable fd of a producer's host shared memory when wexd runs as root
# with no capability but wexd.service's CapabilityBoundingSet= and the
# memory is another user's /dev/shm file of mode 0600 (shm_open's usual
# mode; PrivateTmp= does not cover /dev/shm).  Root without
# CAP_DAC_READ_SEARCH may not open such a file, so wexd's own read-only
# reopen fails there; before, it then passed the producer's O_RDWR fd on
# (logged at debug level only), under the shipped unit for every such
# file.  libwex now sends the fd already opened again read-only by the
# producer, which may open its own file.  Also checks that the lease
# journal directory is made wexd's own (mode 0700) under those
# capabilities.  Needs root (setpriv, runuser, a test user).
UNIT=$1 WEXD=$2 LIBWEX=$3
. "$(dirname "$0")/lib.sh"
PY=/usr/bin/python3; [ -x $PY ] || PY=python3
[ "$(id -u)" = 0 ] || skip "needs root (setpriv, runuser)"
command -v setpriv >/dev/null || skip "setpriv missing (package util-linux)"
command -v runuser >/dev/null || skip "runuser missing (package util-linux)"
command -v useradd >/dev/null || skip "useradd missing (package passwd)"
command -v $PY >/dev/null || skip "python3 missing"
[ -d /dev/shm ] || skip "no /dev/shm"
id wex-allowed >/dev/null 2>&1 || useradd --system --no-create-home wex-allowed || fail "useradd"
runuser -u wex-allowed -- test -r "$LIBWEX" || skip "$LIBWEX out of the test user's reach"
caps=$(sed -n 's/^CapabilityBoundingSet=//p' "$UNIT")
[ -n "$caps" ] || fail "no CapabilityBoundingSet= in $UNIT"
set=-all
for c in $caps; do
	set="$set,+$(echo "${c#CAP_}" | tr 'A-Z' 'a-z')"
done
export WEX_SOCKET="$TMP/wexd.sock" WEX_SOCKET_MODE=0666
mkfifo "$TMP/ready"
WEXD_READY_FD=3 setpriv --bounding-set "$set" --inh-caps=-all "$WEXD" --log-level debug \
	3>"$TMP/ready" 2>>"$TMP/wexd.log" &
WEXD_PID=$!
read -r _ <"$TMP/ready" || fail "wexd did not start under bounding set $set: $(cat "$TMP/wexd.log")"
rm -f "$TMP/ready"
[ "$(stat -c '%u %a' "$TMP/wexd.sock.leases")" = "0 700" ] ||
	fail "lease journal directory: $(stat -c '%U %a' "$TMP/wexd.sock.leases")"
runuser -u wex-allowed -- env LD_PRELOAD="${WEX_PY_PRELOAD:-}" ASAN_OPTIONS=detect_leaks=0 WEX_LIB="$LIBWEX" WEX_SOCKET="$WEX_SOCKET" \
	PYTHONPATH="$(dirname "$0")/../../adapters/python" $PY - >"$TMP/p.log" 2>&1 <<'PYEOF' ||
import ctypes, mmap, os, wex
p = "/dev/shm/wex-unit-caps-%d" % os.getpid()
fd = os.open(p, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
try:
    os.ftruncate(fd, 1 << 20)
    m = mmap.mmap(fd, 1 << 20)
    c = wex.Client(wex.ROLE_PRODUCER, "shm")
    print("registered", c.register_fd(fd, ctypes.addressof(ctypes.c_char.from_buffer(m)), 1 << 20))
finally:
    os.unlink(p)
PYEOF
	fail "producer: $(cat "$TMP/p.log")"
grep -q registered "$TMP/p.log" || fail "producer: $(cat "$TMP/p.log")"
grep -q "no read-only open of its fd" "$TMP/wexd.log" &&
	fail "under CapabilityBoundingSet=$caps wexd got a writable fd of another user's 0600 /dev/shm segment, could not open it again read-only, and hands consumers the producer's writable fd: $(grep 'no read-only open' "$TMP/wexd.log")"
stop_wexd
[ "$WEXD_RC" = 0 ] || fail "wexd exit code $WEXD_RC"
echo "PASS: under the unit's capabilities a 0600 /dev/shm segment of another user reaches wexd read-only"
