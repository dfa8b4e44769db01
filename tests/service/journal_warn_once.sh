#!/bin/sh
# journal_warn_once.sh WEXD PRODUCER LIBWEX - a lease the journal cannot
# write down is said in the log, also after wexd warned about a client
# whose lease it cannot write for another reason: wexd runs in a pid
# namespace of its own (its consumer in it too); an engine outside it
# (pid 0 to wexd: "a client whose pid wexd cannot see") takes a remap
# lease first; then, the journal's file system full (a 4 KiB tmpfs), the
# engine inside takes one: wexd must warn that it could not write that
# lease down (No space left on device).  Before, both went to one counter
# that warned at its first and each 1000th count: the second (the one a
# restart would lose on a full disk) was never said, only counted in
# status.
WEXD=$1 PRODUCER=$2 LIBWEX=$3
. "$(dirname "$0")/lib.sh"
PY=/usr/bin/python3; [ -x $PY ] || PY=python3
command -v $PY >/dev/null || skip "python3 missing"
command -v unshare >/dev/null || skip "unshare missing"
export WEX_SOCKET="$TMP/wexd.sock"
J="$TMP/wexd.sock.leases"
mkdir -m 700 "$J"
mount -t tmpfs -o size=4k,mode=700 none "$J" 2>/dev/null || skip "cannot mount a tmpfs (needs root)"
U=
cleanup_extra() {
	[ -n "$E" ] && kill -9 "$E" 2>/dev/null
	[ -n "$U" ] && kill -9 "$U" 2>/dev/null && wait "$U" 2>/dev/null
	umount "$J" 2>/dev/null
}
# (A name starting with '.': no record, left alone.)
dd if=/dev/zero of="$J/.fill" bs=4096 count=4 2>/dev/null
: >"$J/probe" && dd if=/dev/zero of="$J/probe" bs=4096 count=1 2>/dev/null &&
	skip "the 4 KiB tmpfs is not full"
rm -f "$J/probe"
mkfifo "$TMP/ready"
ENGINE='import sys, time, wex
c = wex.Client(wex.ROLE_CONSUMER, "policy", group=sys.argv[1])
r = c.sync(wex.SYNC_REMAP_VIEW, min_version=1, timeout_ms=20000)
print("synced v%d" % r.version, flush=True)
time.sleep(600)'
export WEXD PRODUCER LIBWEX TMP PY ENGINE
export PYTHONPATH="$(dirname "$0")/../../adapters/python" WEX_LIB=$LIBWEX ASAN_OPTIONS=detect_leaks=0
unshare -p -f --kill-child --mount-proc sh -c '
	WEXD_READY_FD=3 "$WEXD" 3>"$TMP/ready" 2>>"$TMP/wexd.log" &
	W=$!
	until [ -e "$TMP/up" ]; do sleep 0.05; done
	"$PRODUCER" --rank 0 --world 1 --preset tiny --versions 1 --hold >"$TMP/p.log" 2>&1 &
	until [ -e "$TMP/go" ]; do sleep 0.05; done
	LD_PRELOAD=${WEX_PY_PRELOAD:-} $PY -c "$ENGINE" inner >"$TMP/in.log" 2>&1 &
	wait $W' 2>"$TMP/unshare.log" &
U=$!
read -r _ <"$TMP/ready" || fail "wexd did not start: $(cat "$TMP/wexd.log" "$TMP/unshare.log")"
touch "$TMP/up"
LD_PRELOAD=${WEX_PY_PRELOAD:-} $PY -c "$ENGINE" outer >"$TMP/out.log" 2>&1 &
E=$!
# synced: wait_for FILE WHAT
synced() {
	i=0; until grep -q "synced v1" "$1" 2>/dev/null; do
		i=$((i+1)); [ $i -lt 400 ] || fail "$2 did not sync: $(tail -1 "$1"); wexd: $(tail -3 "$TMP/wexd.log"); producer: $(tail -3 "$TMP/p.log"); $(cat "$TMP/unshare.log")"
		sleep 0.05; done
}
synced "$TMP/out.log" "the engine outside wexd's pid namespace"
grep -q "cannot write down the remap-view lease of a client whose pid wexd cannot see" "$TMP/wexd.log" ||
	skip "wexd sees the outside engine's pid: $(tail -3 "$TMP/wexd.log")"
touch "$TMP/go"
synced "$TMP/in.log" "the engine inside"
grep -q "cannot write down the remap-view lease of pid [0-9]* on model 'policy' v1 in $J: No space left on device" "$TMP/wexd.log" ||
	fail "the lease the full journal could not write is not said: $(grep journal "$TMP/wexd.log")"
echo "PASS: a lease the journal cannot write is said after another client's warning"
