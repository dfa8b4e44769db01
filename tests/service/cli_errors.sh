#!/bin/sh
# cli_errors.sh WEXD WEXCTL - proves that wexctl, given bad input or a wexd
# it cannot use, exits nonzero with an error that names the problem
# (README: "An argument a command does not take, or a bad value, exits 2
# naming it"; "When wexd cannot be reached, wexctl exits 1 and says what to
# check"), and that COMMAND --help is an answer (stdout, exit 0):
#  - an option without its value (--socket, --socket '', watch -n, plan
#    --config) is named as such, not as an unknown option ("unknown option
#    '--socket'"), an unexpected argument, or "File name too long";
#  - plan/convert name a bad --rank, a missing required option, a missing
#    IN OUTDIR and an extra argument (they printed only the usage), and a
#    LAYOUT that does not parse (an engine that is a path, an empty or
#    non-numeric value: it exited 1, or was taken as the default);
#  - config get --jsn is refused as an option (exit 2), not sent to wexd as
#    a field name (exit 1);
#  - a socket path that is a directory or a plain file is called "not a
#    socket" (it was "Connection refused" with "is wexd running?");
#  - a wexd that closes the connection at once (max_clients reached, or a
#    drain) is named as the likely cause (it was a bare "Broken pipe" or
#    "Connection reset by peer");
#  - the example trainer and engine (wex-producer, wex-consumer) answer
#    --help with their usage and refuse a bad number (it was taken as 0), a
#    rank not below the world size, an extra argument and an empty --modes,
#    naming each, before they connect.
WEXD=$1 WEXCTL=$2 PRODUCER=$3 CONSUMER=$4
. "$(dirname "$0")/lib.sh"
PY=/usr/bin/python3; [ -x $PY ] || PY=python3
CFG="$(cd "$(dirname "$0")/../data" && pwd)/qwen2-0.5b-config.json"
export WEX_SOCKET="$TMP/wexd.sock"

# expect RC WANT ARGS...: wexctl ARGS exits RC and the first line of its
# stderr contains WANT.
expect() {
	want_rc=$1 want=$2; shift 2
	"$WEXCTL" "$@" >"$TMP/out" 2>"$TMP/err"
	rc=$?
	[ $rc = "$want_rc" ] || fail "wexctl $*: exit $rc, not $want_rc: $(cat "$TMP/err")"
	head -n 1 "$TMP/err" | grep -qF -- "$want" ||
		fail "wexctl $*: first error line does not say \"$want\": $(head -n 1 "$TMP/err")"
}
expect 2 "--socket needs a PATH" --socket
expect 2 "--socket needs a PATH" --socket "" status
expect 2 "watch: -n needs a value" watch -n
expect 2 "watch: --count needs a value" watch --count
expect 2 "config get: unknown option '--jsn'" config get --jsn
expect 2 "plan: --config needs a value" plan --config
expect 2 "plan: bad --rank 'x'" plan --config "$CFG" --from hf --to vllm:tp=2 --rank x
expect 2 "plan: missing --to" plan --config "$CFG" --from hf
expect 2 "plan: --to: bad engine \"../families/llama\"" plan --config "$CFG" --from hf --to ../families/llama
expect 2 "plan: --from: bad layout parameter \"tp=\"" plan --config "$CFG" --from megatron:tp= --to hf
expect 2 "convert: --to: bad layout parameter \"pp=x\"" convert --config "$CFG" --from hf --to vllm:pp=x a b
expect 2 "plan: unexpected argument 'extra'" plan --config "$CFG" --from hf --to hf extra
expect 2 "convert: missing IN OUTDIR" convert --config "$CFG" --from hf --to hf "$TMP/in"
expect 2 "convert: unexpected argument 'more'" convert --config "$CFG" --from hf --to hf a b more
# --help on any command: its usage on stdout, exit 0.
for cmd in status models clients plans metrics watch config; do
	"$WEXCTL" $cmd --help >"$TMP/out" 2>"$TMP/err" || fail "wexctl $cmd --help exited $?: $(cat "$TMP/err")"
	grep -q "^usage: wexctl" "$TMP/out" || fail "wexctl $cmd --help: no usage on stdout"
done

# A path that is there but is no socket.
mkdir "$TMP/dir"; : >"$TMP/file"
expect 1 "$TMP/dir: not a socket" --socket "$TMP/dir" status
expect 1 "$TMP/file: not a socket" --socket "$TMP/file" status
WEX_SOCKET="$TMP/file" "$WEXCTL" metrics 2>"$TMP/err" && fail "metrics through a plain file exited 0"
grep -q "$TMP/file: not a socket" "$TMP/err" || fail "\$WEX_SOCKET a plain file: $(cat "$TMP/err")"
grep -q "is wexd running" "$TMP/err" && fail "a file that is not a socket is blamed on wexd not running: $(cat "$TMP/err")"

# wexd closes new connections at once: max_clients reached.
WEX_MAX_CLIENTS=1 start_wexd
$PY - "$WEX_SOCKET" "$TMP/held" <<'PYEOF' &
import json, os, socket, sys, time
c = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
c.connect(sys.argv[1])
c.send(json.dumps(dict(v=1, op="ping")).encode())
c.settimeout(10)
json.loads(c.recv(65536).decode())
open(sys.argv[2], "w").close()
while os.path.exists(sys.argv[2]):
    time.sleep(0.05)
PYEOF
HOLD=$!
cleanup_extra() { rm -f "$TMP/held"; wait "$HOLD" 2>/dev/null; }
i=0; until [ -e "$TMP/held" ]; do i=$((i+1)); [ $i -lt 200 ] || fail "holder did not connect"; sleep 0.05; done
for cmd in status metrics; do
	"$WEXCTL" $cmd >/dev/null 2>"$TMP/err" && fail "wexctl $cmd served beyond max_clients 1"
	grep -q "max_clients" "$TMP/err" || fail "wexctl $cmd: a connection closed by wexd does not name the cause: $(cat "$TMP/err")"
done
rm -f "$TMP/held"; wait "$HOLD"
# wexd frees the holder's slot when its event loop sees the hang-up, which
# may come a moment after the holder's exit on a busy machine (10 s at most).
i=0; until "$WEXCTL" status >/dev/null 2>"$TMP/err"; do
	i=$((i+1)); [ $i -lt 200 ] || fail "status once the holder left: $(cat "$TMP/err")"; sleep 0.05
done
# The checks below connect one after the other: under max_clients 1 each
# could find the last one's slot not yet freed.  A wexd without the limit.
kill -TERM "$WEXD_PID"; wait "$WEXD_PID" || fail "wexd (max_clients 1) exited $? on SIGTERM"
start_wexd
# Output that cannot be written fails the command (a metrics file left
# empty must not look written); a name that is not UTF-8 is refused, not
# sent as no name (which listed every field).
"$WEXCTL" metrics >/dev/full 2>"$TMP/err" && fail "wexctl metrics > /dev/full exited 0"
grep -q "writing the output" "$TMP/err" || fail "metrics > /dev/full: unclear error: $(cat "$TMP/err")"
expect 2 "NAME and VALUE must be UTF-8" config get "$(printf 'log_level\377')"
# The examples: no wexd is needed for any of these (nothing connects).
# xexpect PROG RC WANT ARGS...: PROG ARGS exits RC, its stderr contains WANT.
xexpect() {
	prog=$1 want_rc=$2 want=$3; shift 3
	WEX_SOCKET="$TMP/none.sock" "$prog" "$@" >"$TMP/out" 2>"$TMP/err"
	rc=$?
	[ $rc = "$want_rc" ] || fail "$(basename "$prog") $*: exit $rc, not $want_rc: $(cat "$TMP/err")"
	grep -qF -- "$want" "$TMP/err" ||
		fail "$(basename "$prog") $*: stderr does not say \"$want\": $(cat "$TMP/err")"
}
for prog in "$PRODUCER" "$CONSUMER"; do
	"$prog" --help >"$TMP/out" 2>"$TMP/err" || fail "$(basename "$prog") --help exited $?"
	grep -q "^usage: $(basename "$prog") --rank" "$TMP/out" || fail "$(basename "$prog") --help: no usage on stdout"
	name=${prog##*wex-}
	xexpect "$prog" 2 "$name: bad --rank 'x': a whole number" --rank x
	xexpect "$prog" 2 "$name: bad --world '0'" --world 0
	xexpect "$prog" 2 "$name: bad --threads '2x'" --threads 2x
	xexpect "$prog" 2 "$name: bad --versions '-1'" --versions -1
	xexpect "$prog" 2 "$name: --rank 2 must be below --world 2" --rank 2 --world 2
	xexpect "$prog" 2 "$name: unexpected argument 'extra'" extra
	xexpect "$prog" 2 "usage: $(basename "$prog")" --bogus
done
xexpect "$CONSUMER" 2 "consumer: --modes names no mode" --modes ,
xexpect "$CONSUMER" 2 "too long" --modes "view,fixed,copy$(printf '%064d' 0 | tr 0 ,)bogus"
xexpect "$CONSUMER" 2 "consumer: bad --rank '+1'" --rank +1
# --threads 0 is libwex's default, not a bad number: it gets as far as
# connecting (to no wexd: exit 1).
xexpect "$CONSUMER" 1 "consumer: connect:" --threads 0 --preset tiny
xexpect "$CONSUMER" 2 "consumer: mode 'viwe' unknown" --modes viwe
xexpect "$CONSUMER" 2 "consumer: bad --timeout-ms '5s'" --timeout-ms 5s
xexpect "$PRODUCER" 2 "producer: bad --first '0'" --first 0
xexpect "$PRODUCER" 2 "producer: unknown preset 'huge'" --preset huge
echo "PASS: missing values, bad values, extra arguments and --help; a path that is no socket; a connection wexd closes at once; the examples' options"
