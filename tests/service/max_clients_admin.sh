#!/bin/sh
# max_clients_admin.sh WEXD WEXCTL - proves that max_clients reached does
# not lock out the one way to raise it: with max_clients 2 (from the file)
# and two connections held, root or wexd's own user still reaches wexd
# (a reserve of 4 connections past the limit): `wexctl status` answers and
# `wexctl config reload` (systemd's ExecReload) applies the file's new
# max_clients.  It was refused like any client ("max_clients 2 are
# connected (raise max_clients ...)"), so `systemctl reload wexd` failed
# exactly when the limit had to be raised.  The reserve is bounded: past
# the limit and the reserve, wexd's own user is refused too.
WEXD=$1 WEXCTL=$2
. "$(dirname "$0")/lib.sh"
PY=/usr/bin/python3; [ -x $PY ] || PY=python3
command -v $PY >/dev/null || skip "python3 missing"
echo '{ "max_clients": 2 }' >"$TMP/wexd.json"
start_wexd --config "$TMP/wexd.json"
$PY - "$WEX_SOCKET" "$WEXCTL" "$TMP/wexd.json" <<'PYEOF' || fail "see above"
import json, os, socket, subprocess, sys
path, wexctl, cfg = sys.argv[1:4]
def conn():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.connect(path)
    return s
def rpc(s, msg):
    s.send(json.dumps(dict(v=1, **msg)).encode())
    s.settimeout(10)
    return json.loads(s.recv(1 << 20).decode())
def ctl(*args):
    return subprocess.run([wexctl] + list(args), capture_output=True, text=True, timeout=30,
                          env=dict(os.environ, WEX_SOCKET=path))
held = [conn(), conn()]
for s in held:
    if not rpc(s, dict(op="ping")).get("ok"):
        sys.exit("FAIL: the two allowed connections are not served")
p = ctl("status")
if p.returncode != 0:
    sys.exit("FAIL: wexctl status at max_clients: exit %d: %s" % (p.returncode, p.stderr))
with open(cfg, "w") as f:
    f.write('{ "max_clients": 8 }\n')
p = ctl("config", "reload")
if p.returncode != 0 or "max_clients" not in p.stdout:
    sys.exit("FAIL: wexctl config reload at max_clients: exit %d: %s%s" %
             (p.returncode, p.stdout, p.stderr))
print("at the limit: " + p.stdout.strip())
p = ctl("config", "get", "max_clients", "--json")
if p.returncode != 0 or json.loads(p.stdout)["fields"][0]["value"] != 8:
    sys.exit("FAIL: max_clients after the reload: %s%s" % (p.stdout, p.stderr))
# wexd counts a wexctl connection until it reads its hang-up, which may
# come after the connects below: wait until only the two held are left.
import time
end = time.monotonic() + 10
while rpc(held[0], dict(op="status"))["daemon"]["clients"] != 2:
    if time.monotonic() > end:
        sys.exit("FAIL: wexctl's connections are still counted after 10 s")
    time.sleep(0.01)
# The reserve is bounded: 8 + 4 held, the next one is refused.
held += [conn() for _ in range(10)]
for s in held:
    if not rpc(s, dict(op="ping")).get("ok"):
        sys.exit("FAIL: a connection within the limit and the reserve is not served")
s = conn()
s.settimeout(10)
r = json.loads(s.recv(4096).decode())
if r.get("ok") is not False or r["error"]["code"] != "EBUSY":
    sys.exit("FAIL: a connection past the limit and the reserve was told %r" % r)
print("past the limit and the reserve: " + r["error"]["message"])
PYEOF
kill -TERM "$WEXD_PID"; wait "$WEXD_PID"; rc=$?; WEXD_PID=""
[ $rc = 0 ] || fail "wexd exit code $rc"
echo "PASS: at max_clients, wexd's own user still gets status and a reload that raises it"
