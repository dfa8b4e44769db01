#!/bin/sh
# socket_path.sh WEXD WEXCTL - proves what wexd does with what it finds at
# its socket path: a file that is not a socket (a mistyped --socket or
# WEX_SOCKET) is left alone, byte for byte, and wexd exits 1 saying why
# (connect() reports ECONNREFUSED for a regular file just as for a stale
# socket, and wexd once deleted it); a stale socket left by a dead daemon is
# replaced and served; a live wexd's socket is not taken by a second wexd,
# and the first one still serves, nor is a stale one by a wexd that does
# not hold the lock on the path (two started at once: exactly one serves);
# at exit wexd removes its socket file only
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
# A live one: a second wexd is refused, naming the first, which holds
# <socket>.lock, and the first keeps its socket.
if timeout 10 "$WEXD" 2>"$TMP/twice.log"; then fail "a second wexd started on the same socket"; fi
grep -q "another wexd (pid $WEXD_PID) holds $WEX_SOCKET.lock" "$TMP/twice.log" ||
	fail "unclear error: $(cat "$TMP/twice.log")"
[ -S "$WEX_SOCKET" ] || fail "the second wexd removed the first one's socket"
"$WEXCTL" status >/dev/null || fail "the first wexd no longer serves after a second one tried its socket"
kill -TERM "$WEXD_PID"; wait "$WEXD_PID"; rc=$?; WEXD_PID=""
[ $rc = 0 ] || fail "wexd exit code $rc"
[ -e "$WEX_SOCKET" ] && fail "wexd left its socket behind"
# Whoever holds the lock, the stale socket it guards is not touched: two
# wexd started at once over one stale socket both found it stale, and the
# later could remove the socket the earlier had just bound.
$PY -c "import socket,sys; s=socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET); s.bind(sys.argv[1])" \
	"$WEX_SOCKET" || fail "cannot make a stale socket"
stale_ino=$(stat -c %i "$WEX_SOCKET")
mkfifo "$TMP/held"
$PY -c "import fcntl,os,sys,time; f=open(sys.argv[1],'a+'); fcntl.flock(f, fcntl.LOCK_EX); f.truncate(0); f.write('%d\\n' % os.getpid()); f.flush(); open(sys.argv[2],'w').write('held\\n'); time.sleep(60)" \
	"$WEX_SOCKET.lock" "$TMP/held" &
HOLDER=$!
read -r _ <"$TMP/held" || fail "the lock holder did not start"
if timeout 10 "$WEXD" 2>"$TMP/held.log"; then fail "wexd started while another process held its lock"; fi
grep -q "another wexd (pid $HOLDER) holds $WEX_SOCKET.lock" "$TMP/held.log" ||
	fail "unclear error while the lock is held: $(cat "$TMP/held.log")"
[ "$(stat -c %i "$WEX_SOCKET")" = "$stale_ino" ] || fail "wexd replaced the socket though it did not hold the lock"
kill "$HOLDER"; wait "$HOLDER" 2>/dev/null
# A socket some process listens on (a wexd that systemd started holds no
# lock): not taken either.
$PY -c "import socket,sys,time; s=socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET); s.bind(sys.argv[1]); s.listen(); open(sys.argv[2],'w').write('held\\n'); time.sleep(60)" \
	"$WEX_SOCKET.2" "$TMP/held" &
HOLDER=$!
read -r _ <"$TMP/held" || fail "the listener did not start"
if WEX_SOCKET="$WEX_SOCKET.2" timeout 10 "$WEXD" 2>"$TMP/listened.log"; then fail "wexd started on a socket another process listens on"; fi
grep -q "cannot listen on $WEX_SOCKET.2: check for a running daemon: another wexd listens there" "$TMP/listened.log" ||
	fail "unclear error for a socket in use: $(cat "$TMP/listened.log")"
[ -S "$WEX_SOCKET.2" ] || fail "wexd removed a live listener's socket"
kill "$HOLDER"; wait "$HOLDER" 2>/dev/null
# Pairs started at the same instant: exactly one of each serves.
for i in 1 2 3 4 5 6 7 8; do
	rm -f "$WEX_SOCKET"
	$PY -c "import socket,sys; s=socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET); s.bind(sys.argv[1])" \
		"$WEX_SOCKET" || fail "cannot make a stale socket"
	"$WEXD" 2>"$TMP/pair1.log" & P1=$!
	"$WEXD" 2>"$TMP/pair2.log" & P2=$!
	# The one that lost exits 1 on its own; the other serves.
	n=0
	while kill -0 $P1 2>/dev/null && kill -0 $P2 2>/dev/null && [ $n -lt 100 ]; do sleep 0.05; n=$((n + 1)); done
	if kill -0 $P1 2>/dev/null && kill -0 $P2 2>/dev/null; then
		kill $P1 $P2; wait $P1 $P2
		fail "pair $i: both wexd still run after 5 s: $(cat "$TMP/pair1.log" "$TMP/pair2.log")"
	fi
	if kill -0 $P1 2>/dev/null; then W=$P1 L=$P2 LLOG=pair2; else W=$P2 L=$P1 LLOG=pair1; fi
	wait $L; rc=$?
	if [ $rc != 1 ] || ! kill -0 $W 2>/dev/null; then
		kill $P1 $P2 2>/dev/null
		fail "pair $i: not exactly one wexd running (loser rc $rc): $(cat "$TMP/pair1.log" "$TMP/pair2.log")"
	fi
	grep -q "another wexd" "$TMP/$LLOG.log" || { kill $W; fail "pair $i: unclear error: $(cat "$TMP/$LLOG.log")"; }
	# (The loser may exit before the winner, which took the lock first,
	# listens: asked again for up to 5 s.)
	n=0
	until "$WEXCTL" status >/dev/null 2>"$TMP/pair-status.err"; do
		n=$((n + 1))
		[ $n -lt 100 ] || { kill $W; fail "pair $i: the wexd left running does not serve: $(cat "$TMP/pair-status.err")"; }
		sleep 0.05
	done
	kill -TERM $W; wait $W; rc=$?
	[ $rc = 0 ] || fail "pair $i: wexd exit code $rc"
done
rm -f "$TMP/held"
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
	# Another user's lock file: named, not "in use".
	rm -f "$TMP/sticky/wexd.sock" "$TMP/sticky/wexd.sock.lock"
	: >"$TMP/sticky/wexd.sock.lock"
	chmod 644 "$TMP/sticky/wexd.sock.lock"
	if WEX_SOCKET="$TMP/sticky/wexd.sock" setpriv --reuid=65534 --regid=65534 --clear-groups \
		timeout 10 "$WEXD" 2>"$TMP/sticky.log"; then
		fail "wexd started with another user's lock file"
	fi
	grep -q "open its lock file $TMP/sticky/wexd.sock.lock (not a file of this user's: another user's? .*): Operation not permitted" \
		"$TMP/sticky.log" || fail "another user's lock file: unclear error: $(cat "$TMP/sticky.log")"
	# A directory this user may not write: no lock file to blame.
	mkdir -m 755 "$TMP/closed"
	if WEX_SOCKET="$TMP/closed/wexd.sock" setpriv --reuid=65534 --regid=65534 --clear-groups \
		timeout 10 "$WEXD" 2>"$TMP/closed.log"; then
		fail "wexd started in a directory it may not write"
	fi
	grep -q "open its lock file $TMP/closed/wexd.sock.lock: Permission denied" "$TMP/closed.log" ||
		fail "unwritable directory: unclear error: $(cat "$TMP/closed.log")"
	chmod 700 "$TMP"
else
	echo "(another user's socket not checked: needs root and setpriv)"
fi
# A socket_mode that lets the group read the socket but not write it
# (0640): no member can connect (connect needs write permission), said
# at start; 0660 says nothing.
start_wexd
kill -TERM "$WEXD_PID"; wait "$WEXD_PID"; WEXD_PID=""
grep -q "connecting needs write permission" "$TMP/wexd.log" &&
	fail "a warning for socket_mode 0660: $(cat "$TMP/wexd.log")"
: >"$TMP/wexd.log"
export WEX_SOCKET_MODE=0640
start_wexd
unset WEX_SOCKET_MODE
[ "$(stat -c %a "$WEX_SOCKET")" = 640 ] || fail "socket_mode 0640 not applied"
kill -TERM "$WEXD_PID"; wait "$WEXD_PID"; WEXD_PID=""
grep -q "socket_mode 0640 (from env): connecting needs write permission on the socket, which members of its group lack" \
	"$TMP/wexd.log" || fail "no warning for socket_mode 0640: $(cat "$TMP/wexd.log")"
echo "PASS: a non-socket at the path is kept and refused, a stale socket replaced, a live one not taken, the lock held and named, one of two started at once serving, another's file not removed at exit, another user's stale socket named, a socket_mode no group member can connect with warned of"
