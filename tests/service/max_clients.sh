#!/bin/sh
# max_clients.sh WEXD - proves that connections past max_clients are refused,
# counted and logged without flooding the log: with max_clients 2 and two
# connections held, 2500 more are each closed by wexd at once; the metric
# wex_refused_connections_total{reason="max_clients"} reaches 2500 while
# the log has at most 3 such lines (once per 1000); a held connection is
# still served.
WEXD=$1
. "$(dirname "$0")/lib.sh"
PY=/usr/bin/python3; [ -x $PY ] || PY=python3
command -v $PY >/dev/null || skip "python3 missing"
WEX_MAX_CLIENTS=2 start_wexd
$PY - "$WEX_SOCKET" <<'PYEOF' || fail "see above"
import json, socket, sys, time
path = sys.argv[1]
def conn():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.connect(path)
    return s
def rpc(s, msg):
    s.send(json.dumps(dict(v=1, **msg)).encode())
    s.settimeout(10)
    return json.loads(s.recv(1 << 20).decode())
held = [conn(), conn()]
if not rpc(held[0], dict(op="ping")).get("ok") or not rpc(held[1], dict(op="ping")).get("ok"):
    sys.exit("FAIL: the two allowed connections are not served")
for _ in range(2500):
    s = conn()
    s.settimeout(10)
    try:
        if s.recv(16) != b"":
            sys.exit("FAIL: a connection past max_clients got data")
    except ConnectionResetError:
        pass
    s.close()
line = 'wex_refused_connections_total{reason="max_clients"} '
n = -1
for _ in range(200):
    text = rpc(held[0], dict(op="metrics"))["text"]
    n = max([float(l[len(line):]) for l in text.splitlines() if l.startswith(line)] or [0])
    if n >= 2500:
        break
    time.sleep(0.05)
if n != 2500:
    sys.exit("FAIL: %s%g, expected 2500" % (line, n))
print("refused and counted: 2500")
PYEOF
n=$(grep -c "refusing a client: max_clients 2 reached" "$TMP/wexd.log")
[ "$n" -ge 1 ] && [ "$n" -le 3 ] || fail "$n log lines for 2500 refusals, expected 1 to 3"
echo "PASS: 2500 connections past max_clients refused and counted, logged $n times"
