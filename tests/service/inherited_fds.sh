#!/bin/sh
# inherited_fds.sh WEXD WEXCTL - wexd closes the file descriptors it
# inherits beyond its standard streams (a launcher's pipe, a file it left
# open), keeping only WEXD_READY_FD's and a socket systemd passed
# (svc_socket_activate): a pipe's reader sees its end once the launcher
# closes its own end, not only when wexd exits, and wexd holds no
# inherited file.  The log names what it closed.
WEXD=$1 WEXCTL=$2
. "$(dirname "$0")/lib.sh"
[ -d /proc/self/fd ] || skip "no /proc/self/fd"
mkfifo "$TMP/pipe"
cat "$TMP/pipe" >"$TMP/piped" &
CAT=$!
cleanup_extra() { kill "$CAT" 2>/dev/null; }
exec 5>"$TMP/pipe"
echo held >"$TMP/held.file"
exec 6<"$TMP/held.file"
echo "from the launcher" >&5
start_wexd
exec 5>&- 6<&-
# The reader ends once every writer closed: wexd's inherited copy too.
i=0
while kill -0 "$CAT" 2>/dev/null; do
	i=$((i + 1))
	[ $i -le 50 ] || fail "the pipe's reader saw no end in 5 s: wexd still holds the launcher's pipe ($(ls -l /proc/$WEXD_PID/fd | grep -c pipe) pipes open in wexd)"
	sleep 0.1
done
wait "$CAT" 2>/dev/null
grep -qx "from the launcher" "$TMP/piped" || fail "the pipe's data was lost: $(cat "$TMP/piped")"
for f in /proc/$WEXD_PID/fd/*; do
	case $(readlink "$f") in
	*held.file* | *"$TMP/pipe"*) fail "wexd still holds $(readlink "$f") as fd ${f##*/}" ;;
	esac
done
grep -q "wexd info: closed [0-9]* file descriptors\{0,1\} it inherited: .*5 ($TMP/pipe)" "$TMP/wexd.log" ||
	fail "the log does not name the pipe it closed: $(grep inherited "$TMP/wexd.log")"
grep -q "it inherited: .*6 ($TMP/held.file)" "$TMP/wexd.log" ||
	fail "the log does not name the file it closed: $(grep inherited "$TMP/wexd.log")"
"$WEXCTL" status >"$TMP/status" 2>&1 || fail "wexctl status: $(cat "$TMP/status")"
grep inherited "$TMP/wexd.log"
# A WEXD_READY_FD naming no open fd (left for another wexd) is ignored,
# said, and nothing of wexd's own under that number gets "ready".
mkdir "$TMP/stale"
for n in 3 4 5 6 7 8 9; do
	eval "exec $n>&-"
	WEX_SOCKET="$TMP/stale/wexd.sock" WEXD_READY_FD=$n "$WEXD" 2>"$TMP/stale.log" &
	pid=$!
	i=0
	until WEX_SOCKET="$TMP/stale/wexd.sock" "$WEXCTL" status >/dev/null 2>&1; do
		i=$((i + 1))
		[ $i -le 100 ] || fail "wexd with a stale WEXD_READY_FD=$n does not serve: $(cat "$TMP/stale.log")"
		sleep 0.05
	done
	kill -TERM $pid
	wait $pid || fail "wexd with a stale WEXD_READY_FD=$n exited $?"
	grep -q "WEXD_READY_FD=$n names no open file descriptor: ignored" "$TMP/stale.log" ||
		fail "no warning for a stale WEXD_READY_FD=$n: $(cat "$TMP/stale.log")"
	! grep -q ready "$TMP/stale/wexd.sock.lock" 2>/dev/null || fail "wexd wrote \"ready\" into its own lock file (WEXD_READY_FD=$n)"
done
echo "a stale WEXD_READY_FD (3 to 9) was ignored with a warning"
# Started with stdin, stdout and stderr closed (a launcher's >&-): they are
# /dev/null, and the log does not go into the lock file (its first free
# number), over the pid there.
mkdir "$TMP/closed"
WEX_SOCKET="$TMP/closed/wexd.sock" "$WEXD" <&- >&- 2>&- &
CL=$!
i=0; until [ -S "$TMP/closed/wexd.sock" ]; do
	kill -0 $CL 2>/dev/null || fail "wexd started with closed stdio exited"
	i=$((i+1)); [ $i -lt 200 ] || fail "wexd started with closed stdio does not listen"; sleep 0.05; done
for fd in 0 1 2; do
	[ "$(readlink /proc/$CL/fd/$fd)" = /dev/null ] || { kill $CL; fail "fd $fd of wexd started with closed stdio is $(readlink /proc/$CL/fd/$fd)"; }
done
[ "$(cat "$TMP/closed/wexd.sock.lock")" = "$CL" ] || { kill $CL; fail "lock file holds: $(head -c 200 "$TMP/closed/wexd.sock.lock")"; }
kill -TERM $CL; wait $CL || fail "wexd started with closed stdio exited $? at SIGTERM"
# WEXD_READY_FD=2 (stderr): "ready" written, then stderr stays open, on
# /dev/null; closed, the next connection took fd 2 and was written the
# log (a client read "malformed reply").
mkdir "$TMP/r2"
WEX_SOCKET="$TMP/r2/wexd.sock" WEXD_READY_FD=2 "$WEXD" 2>"$TMP/r2.log" &
R2=$!
i=0; until grep -q "^ready" "$TMP/r2.log" 2>/dev/null; do
	kill -0 $R2 2>/dev/null || fail "wexd with WEXD_READY_FD=2 exited: $(cat "$TMP/r2.log")"
	i=$((i+1)); [ $i -lt 200 ] || { kill $R2; fail "wexd with WEXD_READY_FD=2 wrote no ready"; }; sleep 0.05; done
WEX_SOCKET="$TMP/r2/wexd.sock" timeout 20 "$WEXCTL" status >/dev/null 2>"$TMP/r2c.err" ||
	{ kill $R2; fail "wexctl against wexd with WEXD_READY_FD=2: $(cat "$TMP/r2c.err")"; }
[ "$(readlink /proc/$R2/fd/2)" = /dev/null ] || { kill $R2; fail "fd 2 of wexd after WEXD_READY_FD=2 is $(readlink /proc/$R2/fd/2)"; }
kill -TERM $R2; wait $R2 || fail "wexd with WEXD_READY_FD=2 exited $? at SIGTERM"
# A limit lowered by max_open_files: the warning names that setting, not
# the hard limit.
if [ "$(ulimit -n)" = unlimited ] || [ "$(ulimit -n)" -gt 64 ]; then
	mkdir "$TMP/lim"
	WEX_MAX_OPEN_FILES=64 WEX_SOCKET="$TMP/lim/wexd.sock" "$WEXD" 2>"$TMP/lim.log" &
	LIM=$!
	i=0; until [ -S "$TMP/lim/wexd.sock" ]; do
		kill -0 $LIM 2>/dev/null || fail "wexd with max_open_files 64 exited: $(cat "$TMP/lim.log")"
		i=$((i+1)); [ $i -lt 200 ] || fail "wexd with max_open_files 64 does not listen"; sleep 0.05; done
	kill -TERM $LIM; wait $LIM
	grep -q "limit 64 (lowered by max_open_files); .*: raise max_open_files (0: the hard limit)" "$TMP/lim.log" ||
		fail "fd-limit warning: $(grep "file descriptors" "$TMP/lim.log")"
fi
# The limit said as it was set: raised from a low soft limit, lowered by
# max_open_files (above 16384, where no warning is due), or kept.
fdlim() { # fdlim NAME SOFT [ENV...]: wexd's "file descriptors" line
	n=$1 soft=$2; shift 2
	mkdir "$TMP/$n"
	(ulimit -Sn "$soft" && exec env "$@" WEX_SOCKET="$TMP/$n/wexd.sock" "$WEXD") 2>"$TMP/$n.log" &
	p=$!
	i=0; until [ -S "$TMP/$n/wexd.sock" ]; do
		kill -0 $p 2>/dev/null || fail "wexd ($n) exited: $(cat "$TMP/$n.log")"
		i=$((i+1)); [ $i -lt 200 ] || fail "wexd ($n) does not listen"; sleep 0.05; done
	kill -TERM $p; wait $p
	grep "file descriptors" "$TMP/$n.log"
}
hard=$(ulimit -Hn)
if [ "$hard" = unlimited ] || [ "$hard" -ge 17000 ]; then
	out=$(fdlim raise 1024 WEX_MAX_OPEN_FILES=17000)
	case $out in *"limit 17000 (raised from the soft limit)"*) ;; *) fail "raised limit said as: $out" ;; esac
	out=$(fdlim lower 17000 WEX_MAX_OPEN_FILES=16500)
	case $out in *"limit 16500 (lowered by max_open_files)"*) ;; *) fail "lowered limit said as: $out" ;; esac
	out=$(fdlim kept 17000 WEX_MAX_OPEN_FILES=17000)
	case $out in *"limit 17000"*"("*) fail "unchanged limit said as: $out" ;; *"limit 17000"*) ;;
		*) fail "kept limit said as: $out" ;; esac
else
	echo "note: hard fd limit $hard < 17000: raised/lowered wording not checked"
fi
echo "PASS: the launcher's pipe ended and its file was let go while wexd runs; wexd serves"
