#!/bin/sh
# drain_timeout.sh WEXD PRODUCER - proves that a SIGTERM drain that runs
# out of drain_timeout_ms says so: a producer publishes, a raw consumer
# takes a copy lease and never releases it; after SIGTERM wexd keeps
# serving until drain_timeout_ms (3 s here), then exits and logs a
# warning naming the cause and the copy lease it cut (it once exited with
# only "stopping: N client(s) told by disconnect", so an operator could not
# tell a cut drain from a clean one).  A drain whose lease is released in
# time logs no such warning (svc_activation_drain).  A SIGHUP during the
# drain reloads nothing, and says so: the drain must outlast this test's
# reaction to "draining" on a loaded machine (300 ms did not, now and
# then: the SIGHUP found wexd gone).
WEXD=$1 PRODUCER=$2
. "$(dirname "$0")/lib.sh"
PY=/usr/bin/python3; [ -x $PY ] || PY=python3
command -v $PY >/dev/null || skip "python3 missing"
WEX_DRAIN_TIMEOUT_MS=3000 start_wexd
"$PRODUCER" --preset tiny --versions 1 --hold >"$TMP/p.log" 2>&1 &
P=$!
cleanup_extra() { kill "$P" 2>/dev/null; wait "$P" 2>/dev/null; }
i=0; until grep -q "published v1" "$TMP/p.log" 2>/dev/null; do
	kill -0 $P 2>/dev/null || fail "producer: $(cat "$TMP/p.log")"
	i=$((i+1)); [ $i -lt 400 ] || fail "producer did not publish"; sleep 0.05
done
$PY - "$WEX_SOCKET" "$WEXD_PID" "$TMP/wexd.log" <<'PYEOF' || fail "see above"
import json, os, socket, sys, time
path, pid, log = sys.argv[1], int(sys.argv[2]), sys.argv[3]
def rpc(c, msg):
    c.send(json.dumps(dict(v=1, **msg)).encode())
    c.settimeout(10)
    return json.loads(c.recv(65536).decode())
c = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
c.connect(path)
r = rpc(c, dict(op="hello", role="consumer", model="policy"))
if not r.get("ok"):
    sys.exit("FAIL: consumer hello: %r" % r)
r = rpc(c, dict(op="acquire", min_version=1, mode=1, timeout_ms=10000))
if not r.get("ok"):
    sys.exit("FAIL: consumer acquire: %r" % r)
os.kill(pid, 15)
end = time.time() + 10
while "draining" not in open(log).read():
    if time.time() > end:
        sys.exit("FAIL: no drain logged")
    time.sleep(0.02)
# A SIGHUP now reloads nothing: wexd is stopping (systemd ignores the
# RELOADING= it would send).
os.kill(pid, 1)
end = time.time() + 10
while "SIGHUP while draining: configuration not reloaded" not in open(log).read():
    if time.time() > end:
        sys.exit("FAIL: a SIGHUP while draining was not answered: %s" % open(log).read()[-400:])
    time.sleep(0.02)
if "reloading configuration" in open(log).read():
    sys.exit("FAIL: a SIGHUP while draining reloaded the configuration")
# The lease is never released: wexd must end the drain by itself.
end = time.time() + 20
while True:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        break
    if "stopping:" in open(log).read():
        break
    if time.time() > end:
        sys.exit("FAIL: wexd still draining 20 s after SIGTERM with drain_timeout_ms 3000")
    time.sleep(0.02)
c.close()
PYEOF
wait "$WEXD_PID"; rc=$?; WEXD_PID=""
[ $rc = 0 ] || fail "wexd exit code $rc"
grep -q "drain cut short (drain_timeout_ms expired): 1 copy lease(s) still held" "$TMP/wexd.log" ||
	fail "a drain cut by drain_timeout_ms was not reported: $(tail -3 "$TMP/wexd.log")"
echo "PASS: a drain cut by drain_timeout_ms is logged with the copy lease it cut"
