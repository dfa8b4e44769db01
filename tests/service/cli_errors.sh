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
#  - a --rank past the destination's ranks, an unknown engine (it exited
#    1), a --rank strtol took but the examples refuse (+1, " 1": taken) and
#    an --adapters that is no adapters directory (it named a family file
#    with jansson's "(line -1)") are bad values (exit 2), named; a
#    $WEX_ADAPTERS without families says so, without "(line -1)";
#  - a socket path longer than a UNIX socket's may be is said to be (it
#    was "Invalid argument" or "File name too long"): --socket's exits 2;
#  - wexctl --help names every option of convert (--progress was left out);
#  - an option of verify, watch or wexctl given twice (verify --group a
#    --group b verified group b alone) and a watch --count with a sign or
#    blanks are refused, as plan's are;
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
#    naming each, before they connect; and they exit 1 naming the failed
#    call when wexd is killed during a --wait-group wait or between a
#    consumer's sync and its release (see the last section); a consumer
#    --quiet whose bytes are wrong says so (it exited 1 silently);
#  - quickstart.sh fails when a producer rank exits before the end, and
#    stops its build when a SIGTERM stops it there.
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
# An option given twice (two commands pasted together) is refused, as
# plan's are, not taken from the last: verify --group a --group b asked
# group b alone and exited 0 on its answer, as if a had been verified too.
expect 2 "verify: --group given twice ('a' and 'b')" verify m --group a --group b
expect 2 "verify: --timeout given twice" verify m --timeout 1 --timeout 2
expect 2 "watch: -n given twice" watch -n 1 -n 2
expect 2 "watch: --count given twice" watch --count 1 --count 2
expect 2 "--socket given twice ('$TMP/a' and '$TMP/b')" --socket "$TMP/a" --socket "$TMP/b" status
# --count in digits, as plan's --rank: strtol's sign and blanks were taken.
expect 2 "watch: bad --count '+2'" watch --count +2
expect 2 "watch: bad --count ' 2'" watch --count " 2"
# Past its bound, the bound is named (it said "1 or more" of 2000000000).
expect 2 "watch: bad --count '2000000000' (a whole number, 1 to 1000000000)" watch --count 2000000000
expect 2 "config get: unknown option '--jsn'" config get --jsn
expect 2 "plan: --config needs a value" plan --config
expect 2 "plan: bad --rank 'x'" plan --config "$CFG" --from hf --to vllm:tp=2 --rank x
expect 2 "plan: missing --to" plan --config "$CFG" --from hf
expect 2 "plan: --to: bad engine \"../families/llama\"" plan --config "$CFG" --from hf --to ../families/llama
expect 2 "plan: --from: bad layout parameter \"tp=\"" plan --config "$CFG" --from megatron:tp= --to hf
expect 2 "convert: --to: bad layout parameter \"pp=x\"" convert --config "$CFG" --from hf --to vllm:pp=x a b
expect 2 "plan: --to: layout parameter tp given twice" plan --config "$CFG" --from hf --to vllm:tp=2,tp=4
expect 2 "plan: --to: layout parameter tp must be at least 1 in \"vllm:tp=0\"" plan --config "$CFG" --from hf --to vllm:tp=0
expect 2 "convert: --from: layout parameter fsdp must be at least 1" convert --config "$CFG" --from fsdp:fsdp=0 --to hf a b
# An option given twice (two commands pasted together) is refused, not
# taken from the last: plan would have read the second config silently.
expect 2 "plan: --config given twice ('$CFG' and '$TMP/none')" plan --config "$CFG" --config "$TMP/none" --from hf --to hf
expect 2 "plan: --from given twice" plan --config "$CFG" --from hf --from vllm:tp=2 --to hf
expect 2 "plan: --rank given twice" plan --config "$CFG" --from hf --to vllm:tp=2 --rank 0 --rank 1
expect 2 "convert: --progress given twice" convert --config "$CFG" --from hf --to hf --progress never --progress always a b
expect 2 "convert: --max-shard-size given twice" convert --config "$CFG" --from hf --to hf --max-shard-size 1GB --max-shard-size 2GB a b
expect 2 "plan: unexpected argument 'extra'" plan --config "$CFG" --from hf --to hf extra
expect 2 "convert: missing IN OUTDIR" convert --config "$CFG" --from hf --to hf "$TMP/in"
expect 2 "convert: unexpected argument 'more'" convert --config "$CFG" --from hf --to hf a b more
expect 2 "plan: bad --rank 5: the destination (--to vllm:tp=2) has 2 ranks, 0 to 1" plan --config "$CFG" --from megatron:tp=2 --to vllm:tp=2 --rank 5
expect 2 "plan: bad --rank '+1'" plan --config "$CFG" --from megatron:tp=2 --to vllm:tp=2 --rank +1
expect 2 "plan: bad --rank ' 1'" plan --config "$CFG" --from megatron:tp=2 --to vllm:tp=2 --rank " 1"
expect 2 "plan: --from: unknown engine \"nope\"" plan --config "$CFG" --from nope --to vllm:tp=2
expect 2 "plan: --to: unknown engine \"nope\"" plan --config "$CFG" --from hf --to nope:tp=2
expect 2 "plan: --adapters $TMP/none: No such file or directory" plan --config "$CFG" --from hf --to hf --adapters "$TMP/none"
expect 2 "plan: --adapters $TMP: not an adapters directory (it has no families/)" plan --config "$CFG" --from hf --to hf --adapters "$TMP"
expect 2 "convert: --adapters $TMP/none: No such file" convert --config "$CFG" --from hf --to hf --adapters "$TMP/none" a b
WEX_ADAPTERS="$TMP/none" "$WEXCTL" plan --config "$CFG" --from hf --to hf >/dev/null 2>"$TMP/err" && fail "plan with \$WEX_ADAPTERS a missing directory exited 0"
grep -q "line -1" "$TMP/err" && fail "jansson's (line -1) in the message: $(cat "$TMP/err")"
grep -qF "unable to open $TMP/none/families/" "$TMP/err" && grep -qF 'the adapters directory $WEX_ADAPTERS names' "$TMP/err" ||
	fail "\$WEX_ADAPTERS a missing directory: unclear error: $(cat "$TMP/err")"
long=$(printf '%0300d' 0 | tr 0 a)
expect 2 "--socket: the path is 300 bytes long, over the 107" --socket "$long" status
WEX_SOCKET="$TMP/$(printf '%0150d' 0 | tr 0 a)" "$WEXCTL" status >/dev/null 2>"$TMP/err"
rc=$?
[ $rc = 1 ] && grep -q "bytes long, over the 107 a UNIX socket's path may have" "$TMP/err" ||
	fail "\$WEX_SOCKET too long: exit $rc: $(cat "$TMP/err")"
# The default path from an $XDG_RUNTIME_DIR too long for a socket (a user
# other than root) is named whole: libwex cut it at 255 bytes.
if [ "$(id -u)" = 0 ] && command -v setpriv >/dev/null &&
	setpriv --reuid=65534 --regid=65534 --clear-groups test -x "$WEXCTL"; then
	xdg="/tmp/$(printf '%0300d' 0 | tr 0 x)"
	env -u WEX_SOCKET XDG_RUNTIME_DIR="$xdg" setpriv --reuid=65534 --regid=65534 --clear-groups \
		"$WEXCTL" status >/dev/null 2>"$TMP/err"
	rc=$?
	[ $rc = 1 ] && grep -qF "$xdg/wex/wexd.sock: the path is 319 bytes long" "$TMP/err" ||
		fail "\$XDG_RUNTIME_DIR too long: exit $rc: $(cat "$TMP/err")"
else
	echo "note: not root, or wexctl out of uid 65534's reach: the long \$XDG_RUNTIME_DIR not tried"
fi
"$WEXCTL" --help | grep -A1 "^  convert " | grep -qF -- "--progress auto|always|never" ||
	fail "wexctl --help: convert's --progress is not named: $("$WEXCTL" --help | grep -A2 "^  convert ")"
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

# A wexd of another protocol version (an upgrade installed while the old
# wexd runs: systemctl reload runs the new wexctl) refuses the hello: wexd's
# reason, naming both versions, and what to do (it was a bare "peer speaks
# another wex protocol version", with nothing to check).
$PY - "$TMP/other.sock" "$TMP/other.ready" <<'PYEOF' &
import json, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
s.bind(sys.argv[1]); s.listen(4)
open(sys.argv[2], "w").close()
s.settimeout(20)
try:
    while True:
        c, _ = s.accept()
        v = json.loads(c.recv(65536).decode()).get("v")
        c.send(json.dumps({"ok": False, "error": {"code": "WEX_EPROTO_VERSION",
            "message": "protocol version %s not supported (this wexd speaks 99)" % v}}).encode())
        c.close()
except socket.timeout:
    pass
PYEOF
OTHER=$!
i=0; until [ -e "$TMP/other.ready" ]; do i=$((i+1)); [ $i -lt 200 ] || fail "fake wexd did not listen"; sleep 0.05; done
expect 1 "not supported (this wexd speaks 99)" --socket "$TMP/other.sock" status
grep -q "different releases.*systemctl restart wexd" "$TMP/err" ||
	fail "a wexd of another protocol version: no hint: $(cat "$TMP/err")"
expect 1 "not supported (this wexd speaks 99)" --socket "$TMP/other.sock" config reload
kill "$OTHER" 2>/dev/null; wait "$OTHER" 2>/dev/null

# wexd closes new connections at once: max_clients reached (and the 4
# more that wexd's own user, this test's, may hold past it).
WEX_MAX_CLIENTS=1 start_wexd
$PY - "$WEX_SOCKET" "$TMP/held" <<'PYEOF' &
import json, os, socket, sys, time
held = []
for _ in range(1 + 4):
    c = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    c.connect(sys.argv[1])
    c.send(json.dumps(dict(v=1, op="ping")).encode())
    c.settimeout(10)
    json.loads(c.recv(65536).decode())
    held.append(c)
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
# --timeout-ms bounds the first reserve's wait for a producer too (it
# waited libwex's 30 s, the timeout below ending it with 124).
timeout 20 "$CONSUMER" --model nobody-publishes --preset tiny --timeout-ms 300 \
	>"$TMP/out" 2>"$TMP/err"
rc=$?
[ $rc = 1 ] && grep -q "consumer: reserve:" "$TMP/err" ||
	fail "wex-consumer --timeout-ms 300, no producer: exit $rc, not 1: $(cat "$TMP/err")"
xexpect "$PRODUCER" 2 "producer: bad --first '0'" --first 0
xexpect "$PRODUCER" 2 "producer: unknown preset 'huge'" --preset huge

# A producer waiting for its --wait-group to serve a version, whose
# group's ranks all leave (engines that ran their last rollout; wexd then
# forgets the group) goes on, saying so: it polled wexd every 2 ms for a
# group that no longer exists, forever, and never exited (the quickstart's
# producers after the consumers finished, when their last poll came after
# the consumers' last sync; README "examples/producer.c").
"$PRODUCER" --model leaving --preset tiny --versions 1 --wait-group engine \
	>"$TMP/leave.out" 2>"$TMP/leave.err" &
LEAVER=$!
LD_PRELOAD=${WEX_PY_PRELOAD:-} ASAN_OPTIONS=detect_leaks=0 WEX_LIB="$(dirname "$PRODUCER")/libwex.so" \
PYTHONPATH="$(dirname "$0")/../../adapters/python" $PY - "$TMP/leave.out" >"$TMP/leave.py" 2>&1 <<'PYEOF' &
import sys, time, wex
c = wex.Client(wex.ROLE_CONSUMER, "leaving", group="engine")
for _ in range(400):
    if "published v1" in open(sys.argv[1]).read():
        break
    time.sleep(0.05)
time.sleep(0.5)  # the producer's polls see the group
c.close()
PYEOF
ENG=$!
cleanup_extra() { kill -TERM "$LEAVER" "$ENG" 2>/dev/null; wait "$LEAVER" "$ENG" 2>/dev/null; }
wait "$ENG" || fail "the engine that leaves: $(cat "$TMP/leave.py")"
i=0; while kill -0 "$LEAVER" 2>/dev/null; do
	i=$((i+1)); [ $i -lt 200 ] || fail "producer --wait-group still waits 10 s after its group left: $(cat "$TMP/leave.out" "$TMP/leave.err")"
	sleep 0.05
done
wait "$LEAVER" || fail "producer --wait-group, group left: exit $?: $(cat "$TMP/leave.err")"
grep -q "group 'engine' left (no rank connected) before it was seen serving v1" "$TMP/leave.err" ||
	fail "producer --wait-group, group left: not said: $(cat "$TMP/leave.err")"
cleanup_extra() { :; }

# wex-consumer --quiet whose checks find bytes other than the version's
# (a producer that wrote zeros) says so on stderr and exits 1 (it exited 1
# saying nothing: --quiet dropped the report line, the only word of it).
LD_PRELOAD=${WEX_PY_PRELOAD:-} ASAN_OPTIONS=detect_leaks=0 WEX_LIB="$(dirname "$PRODUCER")/libwex.so" \
PYTHONPATH="$(dirname "$0")/../../adapters/python" $PY - "$TMP/zeros.done" >"$TMP/zeros.py" 2>&1 <<'PYEOF' &
# The tiny preset's rank 0 of 1 as examples/model.c lays it out, never filled.
import os, sys, time, wex
h, i, kv, vocab = 64, 256, 32, 1000
shapes = [("model.embed_tokens.weight", (vocab, h))]
for l in range(2):
    p = "model.layers.%d." % l
    shapes += [(p + "self_attn.q_proj.weight", (h, h)), (p + "self_attn.q_proj.bias", (h,)),
               (p + "self_attn.k_proj.weight", (kv, h)), (p + "self_attn.k_proj.bias", (kv,)),
               (p + "self_attn.v_proj.weight", (kv, h)), (p + "self_attn.v_proj.bias", (kv,)),
               (p + "self_attn.o_proj.weight", (h, h)), (p + "mlp.gate_proj.weight", (i, h)),
               (p + "mlp.up_proj.weight", (i, h)), (p + "mlp.down_proj.weight", (h, i)),
               (p + "input_layernorm.weight", (h,)), (p + "post_attention_layernorm.weight", (h,))]
shapes.append(("model.norm.weight", (h,)))
offs, off = [], 0
for _, s in shapes:
    offs.append(off)
    n = 2
    for d in s:
        n *= d
    off += (n + 255) & ~255
c = wex.Client(wex.ROLE_PRODUCER, "zeros", rank=0, world_size=1)
seg, base = c.segment_alloc(wex.SEG_HOST, (off + 4095) & ~4095)
c.register_tensors([wex.tensor(n, "BF16", s, segment=seg, offset=o)
                    for (n, s), o in zip(shapes, offs)])
c.begin_write(1)
c.publish(1)
for _ in range(600):
    if os.path.exists(sys.argv[1]):
        break
    time.sleep(0.05)
c.close()
PYEOF
ZEROS=$!
cleanup_extra() { kill -TERM "$ZEROS" 2>/dev/null; wait "$ZEROS" 2>/dev/null; }
"$CONSUMER" --model zeros --preset tiny --modes copy --versions 1 --quiet --timeout-ms 10000 \
	>"$TMP/zeros.out" 2>"$TMP/zeros.err"
rc=$?
touch "$TMP/zeros.done"
wait "$ZEROS" || fail "the producer of zeros: $(cat "$TMP/zeros.py")"
[ $rc = 1 ] || fail "wex-consumer --quiet, bytes wrong: exit $rc, not 1: $(cat "$TMP/zeros.out" "$TMP/zeros.err")"
grep -q "consumer rank 0: v1 copy: [1-9][0-9]* elements differ from the version's" "$TMP/zeros.err" ||
	fail "wex-consumer --quiet, bytes wrong: not said: '$(cat "$TMP/zeros.out" "$TMP/zeros.err")'"
cleanup_extra() { :; }

# The examples when wexd goes away under them (wexd killed):
#  - a producer waiting for its --wait-group to serve the version it
#    published exits 1 naming the failed wait (it took the failed request
#    for "served" and went on to the next version: exit 0 here);
#  - a consumer killed out from under between its sync and its release
#    (its stdout a pipe kept full, so it stops in the write of its report
#    line just before wex_release) exits 1 naming the release's error (it
#    ignored it: exit 0 here, though the producer may have written while
#    it read).
WEXD_SEEN=$WEXD_PID
"$PRODUCER" --model waiter --preset tiny --versions 1 --wait-group nobody \
	>"$TMP/waiter.out" 2>"$TMP/waiter.err" &
WAITER=$!
"$PRODUCER" --preset tiny --versions 1 --hold >"$TMP/holder.out" 2>&1 &
HOLDER=$!
mkfifo "$TMP/fifo"
exec 5<>"$TMP/fifo"
$PY - "$TMP/fifo" <<'PYEOF'
import os, sys
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_NONBLOCK)
try:
    while True:
        os.write(fd, b"x" * 4096)
except BlockingIOError:
    pass
PYEOF
"$CONSUMER" --preset tiny --versions 1 --modes view >"$TMP/fifo" 2>"$TMP/consumer.err" 5<&- &
CPID=$!
cleanup_extra() {
	kill -TERM "$WAITER" "$HOLDER" "$CPID" ${DRAIN:-} 2>/dev/null
	wait "$WAITER" "$HOLDER" "$CPID" ${DRAIN:-} 2>/dev/null
}
i=0; until grep -q "published v1" "$TMP/waiter.out"; do
	i=$((i+1)); [ $i -lt 400 ] || fail "producer --wait-group did not publish: $(cat "$TMP/waiter.err")"; sleep 0.05
done
# The consumer synced and stopped writing its report (the pipe is full):
# the kernel says it waits in a pipe write, or in write(2) (x86-64: 1,
# arm64: 64) on fd 1 where it does not name the function.
blocked() {
	grep -q pipe_write "/proc/$CPID/wchan" 2>/dev/null ||
		grep -Eq '^(1|64) 0x1 ' "/proc/$CPID/syscall" 2>/dev/null
}
i=0; until blocked; do
	i=$((i+1)); [ $i -lt 400 ] || fail "consumer not blocked in its report (wchan $(cat "/proc/$CPID/wchan" 2>&1)): $(cat "$TMP/consumer.err")"
	sleep 0.05
done
kill -KILL "$WEXD_SEEN"; wait "$WEXD_SEEN"; WEXD_PID=""
# Drain the pipe (a reader opened before fd 5, the only one, is closed).
exec 6<"$TMP/fifo"
cat <&6 >/dev/null 5<&- &
DRAIN=$!
exec 5<&- 6<&-
wait "$WAITER"; rc=$?
[ $rc = 1 ] || fail "producer --wait-group, wexd killed: exit $rc, not 1: $(cat "$TMP/waiter.err")"
grep -q "producer rank 0: waiting for group 'nobody' to serve v1: " "$TMP/waiter.err" ||
	fail "producer --wait-group, wexd killed: the failed wait not named: $(cat "$TMP/waiter.err")"
grep -q "published v2" "$TMP/waiter.out" && fail "producer --wait-group published v2 after a failed wait"
wait "$CPID"; rc=$?
[ $rc = 1 ] || fail "consumer, wexd killed before its release: exit $rc, not 1: $(cat "$TMP/consumer.err")"
grep -q "consumer rank 0: release v1: " "$TMP/consumer.err" ||
	fail "consumer, wexd killed before its release: the release's error not named: $(cat "$TMP/consumer.err")"
wait "$DRAIN"
# --hold: SIGTERM ends the wait.
kill -TERM "$HOLDER"; wait "$HOLDER" || fail "producer --hold exited $? on SIGTERM: $(cat "$TMP/holder.out")"

# examples/quickstart.sh, in a copy of the tree whose tests/deps.sh installs
# and builds nothing (cmake is a function doing nothing) and whose build/
# holds this build's programs:
#  - bad arguments exit 2 with the usage before deps.sh is read (--preset
#    without a value failed with "parameter not set"; --preset bogus and
#    --versions abc built, started wexd and failed later);
#  - wexd killed while the consumers run: "quickstart: FAILED (...)" and
#    wexd's log, exit 1 (wexctl status failed and set -e ended the script
#    with neither).
QS="$TMP/qs"
mkdir -p "$QS/examples" "$QS/tests" "$QS/build" "$TMP/nocmake"
cp "$(dirname "$0")/../../examples/quickstart.sh" "$QS/examples/"
# A cmake that does nothing, also on PATH (the build runs under setsid).
printf '#!/bin/sh\n' >"$TMP/nocmake/cmake"
chmod +x "$TMP/nocmake/cmake"
NOCMAKE="cmake() { :; }; PATH=\"$TMP/nocmake:\$PATH\""
cat >"$QS/tests/deps.sh" <<'EOF2'
[ -z "${QS_STOP:-}" ] || { echo "quickstart: past its arguments" >&2; exit 42; }
wex_install_deps() { :; }
EOF2
echo "$NOCMAKE" >>"$QS/tests/deps.sh"
abs() { (cd "$(dirname "$1")" && echo "$PWD/$(basename "$1")"); }
printf '#!/bin/sh\necho $$ >"%s"\nexec "%s" "$@"\n' "$QS/wexd.pid" "$(abs "$WEXD")" >"$QS/build/wexd"
# A consumer that kills wexd first (it then fails to connect).
printf '#!/bin/sh\nkill -KILL "$(cat "%s")"\nexec "%s" "$@"\n' "$QS/wexd.pid" "$(abs "$CONSUMER")" \
	>"$QS/build/wex-consumer"
chmod +x "$QS/build/wexd" "$QS/build/wex-consumer"
ln -s "$(abs "$PRODUCER")" "$QS/build/wex-producer"
ln -s "$(abs "$WEXCTL")" "$QS/build/wexctl"
qsexpect() {
	want=$1; shift
	QS_STOP=1 sh "$QS/examples/quickstart.sh" "$@" >"$TMP/out" 2>"$TMP/err"
	rc=$?
	[ $rc = 2 ] || fail "quickstart.sh $*: exit $rc, not 2: $(cat "$TMP/err")"
	grep -qF -- "$want" "$TMP/err" || fail "quickstart.sh $*: stderr does not say \"$want\": $(cat "$TMP/err")"
	grep -q "^usage: .*quickstart.sh \[--preset" "$TMP/err" || fail "quickstart.sh $*: no usage: $(cat "$TMP/err")"
}
qsexpect "quickstart: --preset needs a value" --preset
qsexpect "quickstart: --versions needs a value" --preset tiny --versions
qsexpect "quickstart: unknown preset 'bogus'" --preset bogus
qsexpect "quickstart: bad --versions 'abc'" --versions abc
qsexpect "quickstart: bad --versions '0'" --versions 0
qsexpect "quickstart: unknown argument 'extra'" extra
sh "$QS/examples/quickstart.sh" --preset tiny --versions 2 >"$TMP/out" 2>"$TMP/err"
rc=$?
[ $rc = 1 ] || fail "quickstart.sh, wexd killed: exit $rc, not 1: $(cat "$TMP/out" "$TMP/err")"
grep -q "^quickstart: FAILED (a consumer reported an error; wexctl status exited 1" "$TMP/out" ||
	fail "quickstart.sh, wexd killed: no FAILED line: $(cat "$TMP/out" "$TMP/err")"
grep -q "wexd info: listening on" "$TMP/out" || fail "quickstart.sh, wexd killed: no wexd log: $(cat "$TMP/out")"
# quickstart.sh stopped by SIGTERM (timeout(1), a cancelled CI job) while
# its consumers run: it exits 143 at once and stops them, and says nothing
# of files it removed (its trap cleaned up, then the script went on, into
# "cat: .../producer0.log: No such file or directory", exit 1, and left the
# consumers running).
QS2="$TMP/qs2"
mkdir -p "$QS2/examples" "$QS2/tests" "$QS2/build"
cp "$QS/examples/quickstart.sh" "$QS2/examples/"
printf 'wex_install_deps() { :; }\n%s\n' "$NOCMAKE" >"$QS2/tests/deps.sh"
ln -s "$(abs "$WEXD")" "$QS2/build/wexd"
ln -s "$(abs "$WEXCTL")" "$QS2/build/wexctl"
# Trainer and engine ranks that only wait; each engine rank writes its pid.
printf '#!/bin/sh\nexec sleep 60\n' >"$QS2/build/wex-producer"
printf '#!/bin/sh\necho $$ >>"%s"\nexec sleep 60\n' "$QS2/consumers" >"$QS2/build/wex-consumer"
chmod +x "$QS2/build/wex-producer" "$QS2/build/wex-consumer"
sh "$QS2/examples/quickstart.sh" --preset tiny >"$TMP/out" 2>"$TMP/err" &
QSPID=$!
i=0; until [ "$(wc -l <"$QS2/consumers" 2>/dev/null)" = 2 ]; do
	i=$((i+1)); [ $i -lt 400 ] || fail "quickstart.sh did not start its consumers: $(cat "$TMP/out" "$TMP/err")"; sleep 0.05
done
kill -TERM "$QSPID"
i=0; while kill -0 "$QSPID" 2>/dev/null && [ $i -lt 100 ]; do i=$((i+1)); sleep 0.05; done
if kill -0 "$QSPID" 2>/dev/null; then
	kill $(cat "$QS2/consumers") 2>/dev/null; wait "$QSPID"
	fail "quickstart.sh, SIGTERM: still running 5 s later (waiting for its consumers): $(cat "$TMP/err")"
fi
wait "$QSPID"; rc=$?
[ $rc = 143 ] || fail "quickstart.sh, SIGTERM: exit $rc, not 143: $(cat "$TMP/out" "$TMP/err")"
grep -q "No such file" "$TMP/err" && fail "quickstart.sh, SIGTERM: went on after its cleanup: $(cat "$TMP/err")"
for p in $(cat "$QS2/consumers"); do
	kill -0 "$p" 2>/dev/null && { kill "$p"; fail "quickstart.sh, SIGTERM: consumer $p left running"; }
done
# quickstart.sh stopped by SIGTERM during its build: exit 143 with the
# build stopped (it exited and left make building on, into build/).  A
# cmake on PATH whose build, like the real one, runs its make as a child
# and, on SIGTERM or SIGINT, waits for that make (cmake 3.25 does: the
# quickstart's SIGTERM to cmake alone left the build to run to its end,
# the quickstart waiting for it); the make writes its pid and sleeps.
QSB="$TMP/qsb"
mkdir -p "$QSB/examples" "$QSB/tests" "$QSB/bin"
cp "$QS/examples/quickstart.sh" "$QSB/examples/"
printf 'wex_install_deps() { :; }\n' >"$QSB/tests/deps.sh"
printf '#!/bin/sh\n[ "$1" = --build ] || exit 0\nsleep 60 &\nm=$!\necho $m >"%s"\ntrap %s TERM INT\nwait $m\n' \
	"$QSB/build.pid" "'wait \$m; exit 143'" >"$QSB/bin/cmake"
chmod +x "$QSB/bin/cmake"
PATH="$QSB/bin:$PATH" sh "$QSB/examples/quickstart.sh" --preset tiny >"$TMP/out" 2>"$TMP/err" &
QSPID=$!
i=0; until [ -s "$QSB/build.pid" ]; do
	i=$((i+1)); [ $i -lt 400 ] || fail "quickstart.sh did not start its build: $(cat "$TMP/out" "$TMP/err")"; sleep 0.05
done
sleep 0.2 # (its wait begun)
kill -TERM "$QSPID"
BP=$(cat "$QSB/build.pid")
i=0; while kill -0 "$BP" 2>/dev/null && [ $i -lt 100 ]; do i=$((i+1)); sleep 0.05; done
if kill -0 "$BP" 2>/dev/null; then
	kill "$BP"; wait "$QSPID"
	fail "quickstart.sh, SIGTERM in its build: the build left running"
fi
wait "$QSPID"; rc=$?
[ $rc = 143 ] || fail "quickstart.sh, SIGTERM in its build: exit $rc, not 143: $(cat "$TMP/out" "$TMP/err")"
# Two quickstart.sh started at once build into build/ one after the other,
# the second saying it waits (both built at once, into the same files).  A
# cmake whose build logs its start and end, a second apart; a wexd that
# exits at once ends each run after its build (exit 1).
QSL="$TMP/qsl"
mkdir -p "$QSL/examples" "$QSL/tests" "$QSL/bin" "$QSL/build"
cp "$QS/examples/quickstart.sh" "$QSL/examples/"
printf 'wex_install_deps() { :; }\n' >"$QSL/tests/deps.sh"
printf '#!/bin/sh\n[ "$1" = --build ] || exit 0\necho "start $(date +%%s.%%N)" >>"%s"\nsleep 1\necho "end $(date +%%s.%%N)" >>"%s"\n' \
	"$QSL/builds" "$QSL/builds" >"$QSL/bin/cmake"
printf '#!/bin/sh\nexit 1\n' >"$QSL/build/wexd"
chmod +x "$QSL/bin/cmake" "$QSL/build/wexd"
PATH="$QSL/bin:$PATH" sh "$QSL/examples/quickstart.sh" --preset tiny >"$TMP/qsl1.out" 2>&1 &
QSA=$!
PATH="$QSL/bin:$PATH" sh "$QSL/examples/quickstart.sh" --preset tiny >"$TMP/qsl2.out" 2>&1 &
QSB2=$!
wait "$QSA"; wait "$QSB2"
[ "$(grep -c '^start' "$QSL/builds")" = 2 ] || fail "two quickstarts at once: not two builds: $(cat "$QSL/builds" "$TMP/qsl1.out" "$TMP/qsl2.out")"
awk '/^start/ { if (open) bad = 1; open = 1 } /^end/ { open = 0 } END { exit bad }' "$QSL/builds" ||
	fail "two quickstarts at once built into build/ at the same time: $(cat "$QSL/builds")"
cat "$TMP/qsl1.out" "$TMP/qsl2.out" | grep -q "another build into .* runs (a quickstart started before this one): waiting for it" ||
	fail "two quickstarts at once: the second did not say it waits: $(cat "$TMP/qsl1.out" "$TMP/qsl2.out")"
# quickstart.sh whose producer ranks exit 3 (an error, a crash) once they
# started, the consumers' syncs all verified: "quickstart: FAILED (a
# producer exited (status 3))", exit 1 (it printed its success line and
# exited 0: the producers' exits were never looked at).  Each wrapper
# leaves the real producer it started holding, for the consumers.
QS3="$TMP/qs3"
mkdir -p "$QS3/examples" "$QS3/tests" "$QS3/build"
cp "$QS/examples/quickstart.sh" "$QS3/examples/"
printf 'wex_install_deps() { :; }\n%s\n' "$NOCMAKE" >"$QS3/tests/deps.sh"
ln -s "$(abs "$WEXD")" "$QS3/build/wexd"
ln -s "$(abs "$WEXCTL")" "$QS3/build/wexctl"
ln -s "$(abs "$CONSUMER")" "$QS3/build/wex-consumer"
printf '#!/bin/sh\n"%s" "$@" &\necho $! >>"%s"\nexit 3\n' "$(abs "$PRODUCER")" "$QS3/producers" \
	>"$QS3/build/wex-producer"
chmod +x "$QS3/build/wex-producer"
sh "$QS3/examples/quickstart.sh" --preset tiny --versions 2 >"$TMP/out" 2>"$TMP/err"
rc=$?
kill $(cat "$QS3/producers") 2>/dev/null
grep -q "every byte verified" "$TMP/out" || fail "quickstart.sh, producers exit 3: no sync verified: $(cat "$TMP/out" "$TMP/err")"
[ $rc = 1 ] || fail "quickstart.sh, producers exit 3: exit $rc, not 1: $(cat "$TMP/out" "$TMP/err")"
grep -q "^quickstart: FAILED (a producer exited (status 3); a producer exited (status 3))" "$TMP/out" ||
	fail "quickstart.sh, producers exit 3: no FAILED line naming them: $(cat "$TMP/out" "$TMP/err")"
echo "PASS: missing values, bad values, extra arguments and --help; a path that is no socket; a connection wexd closes at once; the examples' options; the examples when wexd is killed; quickstart.sh's arguments, a wexd killed under it and its producers exiting"
