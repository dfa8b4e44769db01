#!/bin/sh
# socket_path.sh WEXD WEXCTL - proves what wexd does with what it finds at
# its socket path: a file that is not a socket (a mistyped --socket or
# WEX_SOCKET) is left alone, byte for byte, and wexd exits 1 saying why
# (connect() reports ECONNREFUSED for a regular file just as for a stale
# socket, and wexd once deleted it); a stale socket left by a dead daemon is
# replaced and served; a live wexd's socket is not taken by a second wexd,
# and the first one still serves; at exit wexd removes its socket file only
# if it is still the one it made.
WEXD=$1 WEXCTL=$2
. "$(dirname "$0")/lib.sh"
PY=/usr/bin/python3; [ -x $PY ] || PY=python3
command -v $PY >/dev/null || skip "python3 missing"
# Not a socket: kept, and refused with the reason.
echo '{ "precious": true }' >"$TMP/data.json"
cp "$TMP/data.json" "$TMP/data.orig"
WEX_SOCKET="$TMP/data.json" timeout 10 "$WEXD" 2>"$TMP/file.log"
rc=$?
[ $rc = 1 ] || fail "wexd on a regular file exited $rc, not 1: $(cat "$TMP/file.log")"
cmp -s "$TMP/data.json" "$TMP/data.orig" || fail "wexd removed or changed the file at its socket path"
grep -q "cannot listen on $TMP/data.json: check for a stale socket: something other than a socket is there" \
	"$TMP/file.log" || fail "unclear error for a file at the socket path: $(cat "$TMP/file.log")"
mkdir "$TMP/dir.sock"
if WEX_SOCKET="$TMP/dir.sock" timeout 10 "$WEXD" 2>"$TMP/dir.log"; then fail "wexd started on a directory"; fi
[ -d "$TMP/dir.sock" ] || fail "the directory at the socket path is gone"
# A stale socket (bound, then its owner gone): replaced and served.
$PY -c "import socket,sys; s=socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET); s.bind(sys.argv[1])" \
	"$TMP/wexd.sock" || fail "cannot make a stale socket"
[ -S "$TMP/wexd.sock" ] || fail "no stale socket to start from"
start_wexd
"$WEXCTL" status >/dev/null || fail "wexd did not serve on the socket that replaced a stale one"
# A live one: a second wexd is refused and the first keeps its socket.
if timeout 10 "$WEXD" 2>"$TMP/twice.log"; then fail "a second wexd started on the same socket"; fi
grep -q "another wexd listens there" "$TMP/twice.log" || fail "unclear error: $(cat "$TMP/twice.log")"
[ -S "$WEX_SOCKET" ] || fail "the second wexd removed the first one's socket"
"$WEXCTL" status >/dev/null || fail "the first wexd no longer serves after a second one tried its socket"
kill -TERM "$WEXD_PID"; wait "$WEXD_PID"; rc=$?; WEXD_PID=""
[ $rc = 0 ] || fail "wexd exit code $rc"
[ -e "$WEX_SOCKET" ] && fail "wexd left its socket behind"
# Its socket file replaced by another's while it runs: at exit wexd
# removes only the file it made.
start_wexd
rm -f "$WEX_SOCKET"
$PY -c "import socket,sys; s=socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET); s.bind(sys.argv[1])" \
	"$WEX_SOCKET" || fail "cannot bind the other socket"
kill -TERM "$WEXD_PID"; wait "$WEXD_PID"; rc=$?; WEXD_PID=""
[ $rc = 0 ] || fail "wexd exit code $rc"
[ -S "$WEX_SOCKET" ] || fail "wexd removed a socket file that another made at its path"
rm -f "$WEX_SOCKET"
# A dangling symlink at the path: refused as no socket (bind said "Address
# already in use", as if a daemon listened there).
ln -s "$TMP/nowhere" "$TMP/link.sock"
if WEX_SOCKET="$TMP/link.sock" timeout 10 "$WEXD" 2>"$TMP/link.log"; then fail "wexd started on a dangling symlink"; fi
grep -q "check for a stale socket: something other than a socket is there" "$TMP/link.log" ||
	fail "unclear error for a dangling symlink: $(cat "$TMP/link.log")"
# Another user's stale socket in a sticky directory (/tmp): wexd may not
# remove it, or, at mode 0755, even connect; it says which, not "bind:
# Address already in use".
if [ "$(id -u)" = 0 ] && command -v setpriv >/dev/null; then
	chmod 755 "$TMP"
	mkdir -m 1777 "$TMP/sticky"
	for m in 777 755; do
		rm -f "$TMP/sticky/wexd.sock"
		$PY -c "import os,socket,sys; s=socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET); s.bind(sys.argv[1]); os.chmod(sys.argv[1], 0o$m)" \
			"$TMP/sticky/wexd.sock" || fail "cannot make root's stale socket"
		if WEX_SOCKET="$TMP/sticky/wexd.sock" setpriv --reuid=65534 --regid=65534 --clear-groups \
			timeout 10 "$WEXD" 2>"$TMP/sticky.log"; then
			fail "wexd started over another user's socket"
		fi
		want="remove a stale socket (another user's? .*): Operation not permitted"
		[ $m = 755 ] && want="connect to the socket file already there (another user's? .*): Permission denied"
		grep -q "$want" "$TMP/sticky.log" || fail "mode $m: not \"$want\": $(cat "$TMP/sticky.log")"
		grep -q "Address already in use" "$TMP/sticky.log" && fail "mode $m: reported in use: $(cat "$TMP/sticky.log")"
		[ -S "$TMP/sticky/wexd.sock" ] || fail "mode $m: root's socket went"
	done
	chmod 700 "$TMP"
else
	echo "(another user's socket not checked: needs root and setpriv)"
fi
echo "PASS: a non-socket at the path is kept and refused, a stale socket replaced, a live one not taken, another's file not removed at exit, another user's stale socket named"
