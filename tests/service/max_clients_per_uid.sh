#!/bin/sh
# max_clients_per_uid.sh WEXD WEXCTL - proves that max_clients_per_uid
# caps one user's connections, so that one user cannot take every
# max_clients slot: with the cap at 2, user wex-allowed holds 2 and its
# third is refused (EBUSY, naming its uid and the cap, in the one message
# wexd sends before closing), as is its wexctl (exit 1, wexd's reason);
# another user (wex-denied) and root still connect (root: 5, uncapped);
# the refusals are counted under reason "max_clients_per_uid" and logged
# once; a closed connection frees its slot; a reload that raises the cap
# admits one more.  Before, only max_clients bounded connections, all
# users' together (README's known limits).  Needs root (useradd, and
# connecting as other users through seteuid); skips with the reason
# otherwise.
WEXD=$1 WEXCTL=$2
. "$(dirname "$0")/lib.sh"
[ "$(id -u)" = 0 ] || skip "needs root to create test users"
command -v useradd >/dev/null || skip "useradd missing (package passwd)"
command -v runuser >/dev/null || skip "runuser missing (package util-linux)"
PY=/usr/bin/python3; [ -x $PY ] || PY=python3
command -v $PY >/dev/null || skip "python3 missing"
getent group wextest >/dev/null || groupadd --system wextest || fail "groupadd"
for u in wex-allowed wex-denied; do
	id "$u" >/dev/null 2>&1 || useradd --system --no-create-home -G wextest "$u" || fail "useradd $u"
	id -nG "$u" | grep -qw wextest || usermod -aG wextest "$u" || fail "usermod $u"
done
# wexctl must be reachable by wex-allowed (a build under /root is not):
# copied with the libwex it links against, as access_control.sh does.
if ! runuser -u wex-allowed -- test -x "$WEXCTL"; then
	mkdir -p "$TMP/bin"
	cp -P "$WEXCTL" "$(dirname "$WEXCTL")"/libwex.so* "$TMP/bin/" 2>/dev/null ||
		cp -P "$WEXCTL" "$TMP/bin/" || fail "copy wexctl for the test users"
	chmod 755 "$TMP/bin"
	export LD_LIBRARY_PATH="$TMP/bin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
	UWEXCTL=$TMP/bin/$(basename "$WEXCTL")
	runuser -u wex-allowed -- test -x "$UWEXCTL" || fail "$UWEXCTL not executable by wex-allowed"
else
	UWEXCTL=$WEXCTL
fi
cat >"$TMP/wexd.json" <<JSON
{ "socket_mode": "0660", "socket_group": "wextest", "max_clients_per_uid": 2 }
JSON
start_wexd --config "$TMP/wexd.json"
$PY - "$WEX_SOCKET" "$WEXCTL" "$UWEXCTL" "$TMP/wexd.json" <<'PYEOF' || fail "see above"
import grp, json, os, pwd, socket, subprocess, sys, time
path, wexctl, uwexctl, cfg = sys.argv[1:5]
gid = grp.getgrnam("wextest").gr_gid
def conn(user=None):
    """Connects as user (SO_PEERCRED reports the effective ids at connect)."""
    if user:
        os.setegid(gid)
        os.seteuid(pwd.getpwnam(user).pw_uid)
    try:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        s.connect(path)
    finally:
        if user:
            os.seteuid(0)
            os.setegid(0)
    return s
def rpc(s, msg):
    s.send(json.dumps(dict(v=1, **msg)).encode())
    s.settimeout(10)
    return json.loads(s.recv(1 << 20).decode())
def served(s):
    return rpc(s, dict(op="ping")).get("ok") is True
def refused(s):
    s.settimeout(10)
    r = json.loads(s.recv(4096).decode())
    return r if r.get("ok") is False else None
def ctl(*args, user=None):
    cmd = [uwexctl if user else wexctl] + list(args)
    if user:
        cmd = ["runuser", "-u", user, "--", "env", "WEX_SOCKET=" + path] + cmd
    return subprocess.run(cmd, capture_output=True, text=True, timeout=30,
                          env=dict(os.environ, WEX_SOCKET=path))
uid = pwd.getpwnam("wex-allowed").pw_uid
mine = [conn("wex-allowed"), conn("wex-allowed")]
if not all(served(s) for s in mine):
    sys.exit("FAIL: wex-allowed's two connections within the cap are not served")
r = refused(conn("wex-allowed"))
if not r or r["error"]["code"] != "EBUSY" or "max_clients_per_uid 2" not in r["error"]["message"] \
        or "uid %d" % uid not in r["error"]["message"]:
    sys.exit("FAIL: wex-allowed's third connection was told %r" % r)
print("third connection: " + r["error"]["message"])
p = ctl("status", user="wex-allowed")
if p.returncode != 1 or "max_clients_per_uid" not in p.stderr:
    sys.exit("FAIL: wex-allowed's wexctl at the cap: exit %d: %s%s" %
             (p.returncode, p.stdout, p.stderr))
print("wexctl at the cap: " + p.stderr.strip().splitlines()[0])
others = [conn("wex-denied"), conn("wex-denied")] + [conn() for _ in range(5)]
if not all(served(s) for s in others):
    sys.exit("FAIL: another user's or root's connections are not served")
p = ctl("metrics")
want = 'wex_refused_connections_total{reason="max_clients_per_uid"} 2'
if p.returncode != 0 or want not in p.stdout:
    sys.exit("FAIL: metrics lack %s: %s" % (want, [l for l in p.stdout.splitlines()
                                                   if "refused" in l]))
# A closed connection frees its slot (once wexd has read its hang-up).
mine.pop().close()
end = time.monotonic() + 10
while True:
    s = conn("wex-allowed")
    s.settimeout(10)
    try:
        if served(s):
            mine.append(s)
            break
    except (ConnectionError, OSError, ValueError):
        pass
    if time.monotonic() > end:
        sys.exit("FAIL: a closed connection's slot is still taken after 10 s")
    time.sleep(0.05)
# A reload that raises the cap admits a third.
with open(cfg, "w") as f:
    f.write('{ "socket_mode": "0660", "socket_group": "wextest", "max_clients_per_uid": 3 }\n')
p = ctl("config", "reload")
if p.returncode != 0 or "max_clients_per_uid" not in p.stdout:
    sys.exit("FAIL: config reload: exit %d: %s%s" % (p.returncode, p.stdout, p.stderr))
mine.append(conn("wex-allowed"))
if not served(mine[-1]):
    sys.exit("FAIL: a third connection after the cap was raised to 3 is not served")
r = refused(conn("wex-allowed"))
if not r or "max_clients_per_uid 3" not in r["error"]["message"]:
    sys.exit("FAIL: a fourth connection at the raised cap was told %r" % r)
print("after the reload: 3 served, the fourth refused")
PYEOF
n=$(grep -c "refusing a client of uid" "$TMP/wexd.log")
[ "$n" = 1 ] || fail "the refusals were logged $n times, not once (once per 1000)"
kill -TERM "$WEXD_PID"; wait "$WEXD_PID"; rc=$?; WEXD_PID=""
[ $rc = 0 ] || fail "wexd exit code $rc"
echo "PASS: max_clients_per_uid caps one user's connections; others, root and a raised cap are served"
