#!/bin/sh
# wait_group_restart.sh WEXD PRODUCER - proves that wex-producer
# --wait-group does not take its group for gone when wexd restarts under
# it: the next wexd has not seen the group yet (its engines, mid-rollout,
# come back at their next call), and the producer waits for the group to
# be listed again, as for one never seen.  Before, the group, listed at the
# first wexd and missing at the second, was "left (no rank connected)",
# and the producer published its next version at once, the engines never
# having served the one before.  This script holds the listening socket as
# systemd does (LISTEN_FDS), so the producer's polls wait in the backlog
# across the restart instead of finding no wexd.
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


def log(name):
    p = os.path.join(tmp, name)
    return open(p).read() if os.path.exists(p) else ""


def fail(msg):
    print("FAIL:", msg)
    for tag in ("w1.log", "w2.log", "p.out", "p.err"):
        print("--", tag, "tail:\n" + log(tag)[-1500:])
    for p in procs:
        p.kill()
    sys.exit(1)


def start_wexd(tag):
    env = dict(os.environ, LISTEN_FDS="1", WEX_SOCKET=path)
    p = subprocess.Popen(["sh", "-c", "exec 3>&%d; LISTEN_PID=$$ exec \"$0\"" % L.fileno(), wexd],
                         env=env, pass_fds=(L.fileno(),),
                         stderr=open(os.path.join(tmp, tag + ".log"), "w"))
    procs.append(p)
    return p


def wait_for(name, text, secs=20):
    end = time.time() + secs
    while text not in log(name):
        if time.time() > end:
            fail("%s never said %r" % (name, text))
        time.sleep(0.05)


w1 = start_wexd("w1")
wait_for("w1.log", "using the socket passed by systemd")
# The engine: a consumer of group 'engine' that says hello and then rolls
# out (no call to wexd for a while).
eng = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
eng.connect(path)
eng.send(json.dumps(dict(v=1, op="hello", role="consumer", model="restarting",
                         group="engine", rank=0, world=1)).encode())
eng.settimeout(10)
if not json.loads(eng.recv(65536).decode()).get("ok"):
    fail("engine hello")
prod = subprocess.Popen([producer, "--model", "restarting", "--preset", "tiny", "--versions", "2",
                         "--wait-group", "engine"], env=dict(os.environ, WEX_SOCKET=path),
                        stdout=open(os.path.join(tmp, "p.out"), "w"),
                        stderr=open(os.path.join(tmp, "p.err"), "w"))
procs.append(prod)
wait_for("p.out", "published v1")
time.sleep(0.3)  # its polls see the group, not yet serving v1
w1.kill()
w1.wait()
w2 = start_wexd("w2")
wait_for("w2.log", "using the socket passed by systemd")
time.sleep(1.5)
if "published v2" in log("p.out") or "left" in log("p.err"):
    fail("the producer took its group for gone at the restarted wexd, which had not seen it yet")
if prod.poll() is not None:
    fail("the producer exited %r across a restart of wexd" % prod.returncode)
prod.send_signal(signal.SIGTERM)
if prod.wait(timeout=10) != 0:
    fail("the producer exited %d on SIGTERM" % prod.returncode)
w2.send_signal(signal.SIGTERM)
w2.wait(timeout=10)
print("the producer still waits for its group across a restart of wexd")
PYEOF
