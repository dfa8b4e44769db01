#!/bin/sh
# socket_activate.sh WEXD WEXCTL PRODUCER - proves socket activation:
# systemd-socket-activate holds a SOCK_SEQPACKET listener, starts wexd on the
# first connection with LISTEN_FDS, and that first client is served (status
# and a producer publishing); wexd reports it uses the passed socket.  With
# WEX_IO=epoll too: systemd passes the socket blocking, and the epoll
# backend's accept loop once waited in accept4 for good.  wexd's own socket
# settings cannot apply to systemd's socket: status and the log name the
# path it really listens on (not its configured socket), and a configured
# socket or socket_mode that differs from the passed socket is logged as
# not applied, and a reload changing socket_group says it does not apply
# (not that it needs a restart).
WEXD=$1 WEXCTL=$2 PRODUCER=$3
. "$(dirname "$0")/lib.sh"
command -v systemd-socket-activate >/dev/null || skip "systemd-socket-activate missing (package systemd)"
export WEX_SOCKET="$TMP/act.sock"
echo '{}' >"$TMP/wexd.json"
systemd-socket-activate --seqpacket -l "$WEX_SOCKET" -E WEX_SOCKET="$TMP/configured.sock" \
	-E WEX_SOCKET_MODE=0600 -E WEX_IO="${WEX_IO:-auto}" "$WEXD" --config "$TMP/wexd.json" 2>"$TMP/wexd.log" &
ACT=$!
# A wexd stuck in a system call never reads its SIGTERM: KILL after 5 s.
cleanup_extra() {
	kill "$ACT" 2>/dev/null
	i=0; while kill -0 "$ACT" 2>/dev/null && [ $i -lt 100 ]; do i=$((i+1)); sleep 0.05; done
	kill -KILL "$ACT" 2>/dev/null; wait "$ACT" 2>/dev/null
}
i=0; while [ ! -S "$WEX_SOCKET" ] && [ $i -lt 100 ]; do i=$((i+1)); sleep 0.05; done
[ -S "$WEX_SOCKET" ] || fail "socket-activate did not listen"
pgrep -P "$ACT" >/dev/null && fail "wexd started before the first connection"
timeout 20 "$WEXCTL" status --json >"$TMP/status.json" ||
	fail "first client not served: $(cat "$TMP/wexd.log")"
if [ -n "${WEX_IO:-}" ] && [ "$WEX_IO" != auto ]; then
	grep -q "event loop: $WEX_IO" "$TMP/wexd.log" || fail "wexd did not use $WEX_IO: $(cat "$TMP/wexd.log")"
fi
grep -q "using the socket passed by systemd" "$TMP/wexd.log" || fail "wexd did not use LISTEN_FDS: $(cat "$TMP/wexd.log")"
/usr/bin/python3 -c "import json,sys; s=json.load(open(sys.argv[1]))['daemon']['socket']; sys.exit(s != sys.argv[2] and 'status shows socket %s' % s)" \
	"$TMP/status.json" "$WEX_SOCKET" || fail "status does not show the passed socket's path"
grep -q "listening on $WEX_SOCKET " "$TMP/wexd.log" || fail "the log names another socket: $(grep listening "$TMP/wexd.log")"
grep -q "socket $TMP/configured.sock (from env) is not used: systemd passed the socket at $WEX_SOCKET" "$TMP/wexd.log" ||
	fail "a configured socket that cannot apply is not reported: $(cat "$TMP/wexd.log")"
mode=$(stat -c %a "$WEX_SOCKET")
# (systemd-socket-activate leaves the mode to the umask: 0755 as a rule.)
[ "$mode" = 600 ] || grep -q "socket_mode 0600 (from env) is not applied: the socket systemd passed has mode 0$mode" \
	"$TMP/wexd.log" || fail "a socket_mode that cannot apply is not reported: $(cat "$TMP/wexd.log")"
[ -e "$TMP/configured.sock" ] && fail "wexd bound its configured socket under activation"
timeout 60 "$PRODUCER" --preset tiny --versions 2 >"$TMP/p.log" 2>&1 || fail "producer: $(cat "$TMP/p.log")"
grep -q "published v2" "$TMP/p.log" || fail "producer did not publish"
# A reload that changes socket_group under activation: systemd's socket
# stays, also at the next start, so wexd says it does not apply (and
# where to set it) rather than "needing a restart of wexd", which a
# restart would not honour either.
echo "{ \"socket_group\": \"$(id -g)\" }" >"$TMP/wexd.json"
out=$(timeout 20 "$WEXCTL" config reload) || fail "config reload: $out"
case $out in *"needing a restart of wexd: none; not applied, now or after a restart (systemd passes the socket: set them in wexd.socket): socket_group") ;;
	*) fail "config reload under socket activation: $out" ;; esac
grep -q "reload: socket_group changed, but systemd passed wexd its socket (socket activation): it applies neither now nor after a restart; set SocketGroup= in wexd.socket instead" \
	"$TMP/wexd.log" || fail "no warning that socket_group does not apply: $(grep reload "$TMP/wexd.log")"
# LISTEN_FDS that cannot be read: wexd stops (exit 2, a bad configuration
# the unit does not restart; it was 1, restarted to the start limit), and the log says
# what was wrong, not that systemd passed sockets of the wrong kind.
WEX_SOCKET="$TMP/bad.sock" sh -c 'LISTEN_PID=$$ LISTEN_FDS=abc exec "$0"' "$WEXD" 2>"$TMP/bad.log"
rc=$?
[ $rc = 2 ] || fail "unreadable LISTEN_FDS: wexd exited $rc, not 2: $(cat "$TMP/bad.log")"
grep -q "cannot read the sockets systemd passed: Invalid argument" "$TMP/bad.log" ||
	fail "unreadable LISTEN_FDS not named: $(cat "$TMP/bad.log")"
grep -q "none is a listening" "$TMP/bad.log" &&
	fail "unreadable LISTEN_FDS reported as sockets of the wrong kind: $(cat "$TMP/bad.log")"
[ -e "$TMP/bad.sock" ] && fail "wexd bound a socket of its own beside systemd's"
# LISTEN_FDS counting more fds than were passed (one listener at fd 3,
# LISTEN_FDS=3): wexd refuses, naming the fds, before it opens any of its
# own (it took its event loop's fds 4 and 5 for passed ones and closed
# them: "event loop: Operation not supported").
WEX_SOCKET="$TMP/more.sock" /usr/bin/python3 -c '
import os, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
s.bind(sys.argv[2]); s.listen()
os.dup2(s.fileno(), 3)
for fd in range(4, 64):
    try: os.close(fd)
    except OSError: pass
os.environ.update(LISTEN_PID=str(os.getpid()), LISTEN_FDS="3")
os.execv(sys.argv[1], [sys.argv[1]])' "$WEXD" "$TMP/passed.sock" 2>"$TMP/more.log"
rc=$?
[ $rc = 2 ] || fail "LISTEN_FDS=3 with one fd passed: wexd exited $rc, not 2: $(cat "$TMP/more.log")"
grep -q "cannot read the sockets systemd passed: Bad file descriptor" "$TMP/more.log" ||
	fail "LISTEN_FDS past the passed fds not named: $(cat "$TMP/more.log")"
grep -q "event loop" "$TMP/more.log" && fail "wexd closed its own fds as passed ones: $(cat "$TMP/more.log")"
# A passed socket of another type (a wexd.socket with ListenStream=):
# exit 2, naming what to check.
WEX_SOCKET="$TMP/stream.sock" /usr/bin/python3 -c '
import os, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(sys.argv[2]); s.listen()
os.dup2(s.fileno(), 3)
os.environ.update(LISTEN_PID=str(os.getpid()), LISTEN_FDS="1")
os.execv(sys.argv[1], [sys.argv[1]])' "$WEXD" "$TMP/stream-passed.sock" 2>"$TMP/stream.log"
rc=$?
[ $rc = 2 ] || fail "a passed SOCK_STREAM listener: wexd exited $rc, not 2: $(cat "$TMP/stream.log")"
grep -q "no listening AF_UNIX SOCK_SEQPACKET socket: check ListenSequentialPacket= in wexd.socket" "$TMP/stream.log" ||
	fail "a passed SOCK_STREAM listener not named: $(cat "$TMP/stream.log")"
[ -e "$TMP/stream.sock" ] && fail "wexd bound a socket of its own beside systemd's stream socket"
# WEXD_READY_FD naming the passed socket (fd 3): ignored, saying so; wexd
# once wrote "ready" into it and closed it, then spun on accept.
cleanup_extra   # (the first socket-activate; ACT is this one's from now on)
systemd-socket-activate --seqpacket -l "$TMP/ready.sock" -E WEXD_READY_FD=3 -E WEX_IO="${WEX_IO:-auto}" \
	"$WEXD" 2>"$TMP/ready.log" &
ACT=$!
i=0; while [ ! -S "$TMP/ready.sock" ] && [ $i -lt 100 ]; do i=$((i+1)); sleep 0.05; done
timeout 20 "$WEXCTL" --socket "$TMP/ready.sock" status >/dev/null ||
	fail "WEXD_READY_FD=3 (the passed socket): first client not served: $(tail -c 2000 "$TMP/ready.log")"
timeout 20 "$WEXCTL" --socket "$TMP/ready.sock" status >/dev/null ||
	fail "WEXD_READY_FD=3 (the passed socket): second client not served: $(tail -c 2000 "$TMP/ready.log")"
grep -q "WEXD_READY_FD=3 names the listening socket systemd passed: ignored" "$TMP/ready.log" ||
	fail "WEXD_READY_FD=3 naming the passed socket not reported: $(tail -c 2000 "$TMP/ready.log")"
echo "PASS: wexd started on the first connection and served it; unreadable LISTEN_FDS or a stream socket stop it (exit 2), named; WEXD_READY_FD naming the passed socket ignored"
