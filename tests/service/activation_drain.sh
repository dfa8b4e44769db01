#!/bin/sh
# activation_drain.sh WEXD PRODUCER - proves that under socket activation a
# draining wexd leaves new clients to the next instance: this script holds
# the listening socket as systemd does (LISTEN_FDS), starts wexd on it, a
# producer publishes and a raw consumer takes a copy lease (so the SIGTERM
# drain lasts); a client that connects during the drain and sends a ping
# is neither answered nor reset by the draining wexd; once that one exits,
# a second wexd started on the same socket answers the ping that waited in
# the backlog.  The producer, idle all along, is back at the second wexd
# with its v1 (status: published 1, restored) by itself: its watch's
# reconnect waited in the backlog too, with no retry.  Without socket activation (wexd owns the socket) a client
# connecting during a drain is refused at once (counted as "draining"):
# checked by the foundation tests.
WEXD=$1 PRODUCER=$2
. "$(dirname "$0")/lib.sh"
PY=/usr/bin/python3; [ -x $PY ] || PY=python3
command -v $PY >/dev/null || skip "python3 missing"
$PY - "$WEXD" "$PRODUCER" "$TMP" <<'PYEOF' || fail "see above"
import json, os, signal, socket, subprocess, sys, time

wexd, producer, tmp = sys.argv[1:4]
path = os.path.join(tmp, "act.sock")
L = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
L.bind(path)
L.listen(64)
procs = []


def fail(msg):
    print("FAIL:", msg)
    for tag in ("w1", "w2"):
        p = os.path.join(tmp, tag + ".log")
        if os.path.exists(p):
            print("--", tag, "log tail:\n" + open(p).read()[-1500:])
    for p in procs:
        p.kill()
    sys.exit(1)


def start_wexd(tag):
    # The drain must outlast the checks below on a loaded machine; it ends
    # when the lease goes (checked: within 10 s, and not "cut short").
    env = dict(os.environ, LISTEN_FDS="1", WEX_SOCKET=path, WEX_DRAIN_TIMEOUT_MS="30000")
    p = subprocess.Popen(["sh", "-c", "exec 3>&%d; LISTEN_PID=$$ exec \"$0\"" % L.fileno(), wexd],
                         env=env, pass_fds=(L.fileno(),),
                         stderr=open(os.path.join(tmp, tag + ".log"), "w"))
    procs.append(p)
    return p


def wait_log(tag, text, secs=10):
    end = time.time() + secs
    while time.time() < end:
        if text in open(os.path.join(tmp, tag + ".log")).read():
            return
        time.sleep(0.05)
    fail("%s never logged %r" % (tag, text))


def rpc(c, msg, t=10):
    c.send(json.dumps(dict(v=1, **msg)).encode())
    c.settimeout(t)
    return json.loads(c.recv(65536).decode())


w1 = start_wexd("w1")
wait_log("w1", "using the socket passed by systemd")
plog = open(os.path.join(tmp, "p.log"), "w")
prod = subprocess.Popen([producer, "--preset", "tiny", "--versions", "1", "--hold"],
                        env=dict(os.environ, WEX_SOCKET=path), stdout=plog, stderr=plog)
procs.append(prod)
end = time.time() + 20
while "published v1" not in open(os.path.join(tmp, "p.log")).read():
    if time.time() > end or prod.poll() is not None:
        fail("producer did not publish: " + open(os.path.join(tmp, "p.log")).read())
    time.sleep(0.05)
cons = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
cons.connect(path)
r = rpc(cons, dict(op="hello", role="consumer", model="policy"))
if not r.get("ok"):
    fail("consumer hello: %r" % r)
r = rpc(cons, dict(op="acquire", min_version=1, mode=1, timeout_ms=10000))
if not r.get("ok"):
    fail("consumer acquire: %r" % r)

w1.send_signal(signal.SIGTERM)
wait_log("w1", "draining")
late = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
late.connect(path)
late.send(json.dumps(dict(v=1, op="ping")).encode())
late.settimeout(1.0)
try:
    got = late.recv(65536)
    fail("the draining wexd answered a new client: %r (expected it to wait for the next wexd)" % got)
except socket.timeout:
    pass
except OSError as e:
    fail("the draining wexd reset a new client: %r" % e)
if w1.poll() is not None:
    fail("wexd ended its drain while a copy lease was held")
cons.close()  # the lease goes: the drain ends
try:
    rc = w1.wait(timeout=10)
except subprocess.TimeoutExpired:
    fail("wexd did not stop after the lease went")
if rc != 0:
    fail("wexd exit code %d" % rc)
if "drain cut short" in open(os.path.join(tmp, "w1.log")).read():
    fail("a drain that ended with its last lease released was reported as cut short")

t2 = time.time()
w2 = start_wexd("w2")
late.settimeout(10)
try:
    r = json.loads(late.recv(65536).decode())
except Exception as e:  # noqa: BLE001
    fail("the next wexd did not answer the waiting client: %r" % e)
if not r.get("ok"):
    fail("ping answered with %r" % r)
adm = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
adm.connect(path)
if not rpc(adm, dict(op="hello", role="admin")).get("ok"):
    fail("admin hello")
end = time.time() + 10
while True:
    ms = [m for m in rpc(adm, dict(op="status"))["models"] if m["name"] == "policy"]
    if ms and ms[0]["published"] == 1 and ms[0]["restored"]:
        break
    if time.time() > end:
        fail("the idle producer's v1 is not back at the next wexd: %r" % ms)
    time.sleep(0.05)
print("the idle producer's v1 was back %.0f ms after the next wexd was started" % ((time.time() - t2) * 1000))
adm.close()
# The watch logs its reconnection after the restore wexd already shows.
end = time.time() + 5
while True:
    plog_text = open(os.path.join(tmp, "p.log")).read()
    if "reconnected to wexd (it holds its version again)" in plog_text:
        break
    if time.time() > end:
        fail("the producer did not say it reconnected: " + plog_text[-800:])
    time.sleep(0.05)
if "cannot reconnect yet" in plog_text:
    fail("the producer's watch retried instead of waiting in the backlog: " + plog_text[-800:])
prod.kill()
prod.wait()
w2.send_signal(signal.SIGTERM)
if w2.wait(timeout=10) != 0:
    fail("second wexd exit code")
print("PASS: a client connecting during the drain waits in the backlog and the next wexd serves it; "
      "the idle producer's v1 is back there by itself, its reconnect having waited in the backlog")
PYEOF
