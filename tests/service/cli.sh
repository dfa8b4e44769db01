#!/bin/sh
# cli.sh WEXD WEXCTL PRODUCER CONSUMER - proves the operator commands on a
# live daemon: status/models/clients/plans tables and --json (valid JSON with
# the expected fields), watch refreshing, metrics accepted by promtool with
# sync counters from real syncs, config get/set (refusing a field that is
# not modifiable, naming it; an unknown field in wexd's words), typos and bad
# values refused with exit 2, the event-loop backend reported, and, with no
# wexd running, a wexctl error that says what to do.
WEXD=$1 WEXCTL=$2 PRODUCER=$3 CONSUMER=$4
. "$(dirname "$0")/lib.sh"
PY=/usr/bin/python3; [ -x $PY ] || PY=python3
# Before wexd runs: wexctl says what to do, not only what failed.
if WEX_SOCKET="$TMP/wexd.sock" "$WEXCTL" status 2>"$TMP/nowexd.err"; then fail "status without wexd exited 0"; fi
grep -q "is wexd running" "$TMP/nowexd.err" || fail "no hint without wexd: $(cat "$TMP/nowexd.err")"
"$WEXD" --help | grep -q "|trace" || fail "wexd --help does not list log level trace"
"$WEXCTL" plan 2>&1 | grep -q megatron_grouped || fail "plan's usage does not list megatron_grouped"
# The exit statuses, as README gives them, are in the usage too.
"$WEXCTL" --help >"$TMP/help.out" 2>/dev/null || fail "wexctl --help exited $?"
grep -q "^Exit status: 0 done; 1 wexd cannot be reached" "$TMP/help.out" &&
	grep -q "2 a bad command, option or value" "$TMP/help.out" ||
	fail "wexctl --help does not give the exit statuses: $(cat "$TMP/help.out")"
# --help is an answer, not an error: on stdout, exit 0 (README: `wexctl plan
# --help` gives the layout syntax).
for cmd in plan convert; do
	"$WEXCTL" $cmd --help >"$TMP/help.out" 2>/dev/null || fail "wexctl $cmd --help exited $?"
	grep -q "LAYOUT: ENGINE" "$TMP/help.out" || fail "wexctl $cmd --help: no layout syntax on stdout"
done
# A typo or a bad value is refused (exit 2, naming it), never taken as the
# default: checked before wexd runs, so nothing is asked of it.
for args in "status --jsn" "models x" "watch -n 0" "watch -n 1e-9" "watch -n 0.009" "watch -n abc" "watch --count 0" "watch -n" "config get a b" "--json watch" "watch --json" \
	"config reload extra" "config bogus"; do
	# shellcheck disable=SC2086
	WEX_SOCKET="$TMP/wexd.sock" "$WEXCTL" $args >/dev/null 2>"$TMP/arg.err"
	rc=$?
	[ $rc = 2 ] || fail "wexctl $args exited $rc, not 2"
	[ -s "$TMP/arg.err" ] || fail "wexctl $args did not say why"
done
WEX_SOCKET="$TMP/wexd.sock" "$WEXCTL" status --jsn 2>&1 | grep -q "unexpected argument '--jsn'" || fail "typo not named"
WEX_SOCKET="$TMP/wexd.sock" "$WEXCTL" watch -n 0 2>&1 | grep -q "bad -n '0'" || fail "bad interval not named"
# (It polled wexd with no pause: a core's worth of wexd's loop.)
WEX_SOCKET="$TMP/wexd.sock" "$WEXCTL" watch -n 1e-9 2>&1 | grep -q "bad -n '1e-9' (seconds, 0.01 to 86400)" ||
	fail "an interval under 10 ms not refused naming the range"
for args in "config reload extra:unexpected argument 'extra'" "config get a b:unexpected argument 'b'" \
	"config bogus:unknown subcommand 'bogus'" "config reload x y z:unexpected argument 'x'" \
	"config get a b c d:unexpected argument 'b'" "config bogus a b c:unknown subcommand 'bogus'" \
	"config set a b c:unexpected argument 'c'"; do
	# shellcheck disable=SC2086
	WEX_SOCKET="$TMP/wexd.sock" "$WEXCTL" ${args%%:*} 2>&1 | grep -q "${args#*:}" ||
		fail "wexctl ${args%%:*} does not name the argument"
done
start_wexd
"$PRODUCER" --rank 0 --world 1 --preset tiny --versions 2 --wait-group engine --hold >"$TMP/p.log" 2>&1 &
P=$!
"$CONSUMER" --rank 0 --world 1 --preset tiny --versions 2 --modes view,copy --hold >"$TMP/c.log" 2>&1 &
C=$!
cleanup_extra() { kill "$P" "$C" 2>/dev/null; wait "$P" "$C" 2>/dev/null; }
# Wait (polling, bounded) until the consumer finished its syncs and holds.
i=0; until grep -q "done, holding" "$TMP/c.log" 2>/dev/null; do
	kill -0 $C 2>/dev/null || fail "consumer: $(cat "$TMP/c.log")"
	i=$((i+1)); [ $i -lt 600 ] || fail "consumer did not finish"; sleep 0.05
done
grep -q MISMATCH "$TMP/c.log" && fail "consumer saw wrong bytes"
"$WEXCTL" status >"$TMP/status.txt" || fail "status"
grep -q "event loop" "$TMP/status.txt" || fail "status lacks the event loop"
grep -q "policy" "$TMP/status.txt" || fail "status lacks the model"
# The group line: its size in words, and no "open round v0" when the
# consumer took the round (it holds no lease after its copy sync).
grep -q "^policy consumer group 'engine' (1 rank, no open round):" "$TMP/status.txt" ||
	fail "status group line: $(grep 'consumer group' "$TMP/status.txt")"
for cmd in status models clients plans; do
	"$WEXCTL" $cmd --json >"$TMP/$cmd.json" || fail "$cmd --json"
	$PY -c "import json,sys; json.load(open(sys.argv[1]))" "$TMP/$cmd.json" || fail "$cmd --json is not JSON"
done
$PY - "$TMP/status.json" <<'PYEOF' || fail "status --json content"
import json, sys
s = json.load(open(sys.argv[1]))
assert s["daemon"]["io"] in ("io_uring", "epoll"), s["daemon"]
m = [x for x in s["models"] if x["name"] == "policy"][0]
assert m["published"] == 2 and m["producers"][0]["tensors"] == 26, m
assert any(c["role"] == "producer" for c in s["clients"])
PYEOF
"$WEXCTL" plans | grep -q "policy" || fail "plans lists no plan"
# The clients table says whether each client's exit is watched: the
# WATCHED column agrees with clients --json's exit_watched for every
# client (read from the line's end: a long uid shifts the columns; it is
# "no" everywhere where a seccomp filter blocks pidfds).
"$WEXCTL" clients >"$TMP/clients.txt" || fail "clients"
"$WEXCTL" clients --json >"$TMP/clients-w.json" || fail "clients --json"
$PY - "$TMP/clients.txt" "$TMP/clients-w.json" <<'PYEOF' || fail "clients table: $(cat "$TMP/clients.txt")"
import json, re, sys
lines = [l.rstrip() for l in open(sys.argv[1]) if l.strip()]
assert lines[0].split()[-2:] == ["WATCHED", "WAITING"], lines[0]
clients = json.load(open(sys.argv[2]))["clients"]
want = {c["id"]: ("yes" if c["exit_watched"] else "no") for c in clients}
got = {}
for l in lines[1:]:
    m = re.match(r"(\d+)\s.*\s(yes|no|-)(\s+\S+)?$", l)
    assert m, l
    got[int(m.group(1))] = m.group(2)
# Each wexctl call is an admin client of its own: compare the others.
ids = {c["id"] for c in clients if c["role"] != "admin"}
assert len(ids) == 2 and ids <= set(got), (ids, got)
assert all(got[i] == want[i] for i in set(got) & set(want)), (got, want)
PYEOF
# Tables line up on characters, not bytes: a model named in Cyrillic and
# Chinese (two columns each) leaves the columns after it where the header
# has them (they were left short by the name's extra bytes).
# So do names holding combining marks, which take no column of their own:
# "café-й-ガ" decomposed (e and U+0301, и and U+0306, カ and U+3099), as
# macOS writes file names (each mark was counted as a column, the row left
# short by one; the kana voiced mark, in the wide block, as two), and a
# Hebrew point, an Arabic fatha and a Thai vowel mark (U+05B8, U+064E,
# U+0E31: each counted a column).
NFD=$(printf 'cafe\314\201-\320\270\314\206-\343\202\253\343\202\231-\327\251\326\270\330\250\331\216\340\270\201\340\270\261')
"$PRODUCER" --rank 0 --world 1 --model "модель-模型" --preset tiny --versions 1 --hold >"$TMP/pu.log" 2>&1 &
PU=$!
"$PRODUCER" --rank 0 --world 1 --model "$NFD" --preset tiny --versions 1 --hold >"$TMP/pd.log" 2>&1 &
PD=$!
cleanup_extra() { kill "$P" "$C" "$PU" "$PD" 2>/dev/null; wait "$P" "$C" "$PU" "$PD" 2>/dev/null; }
i=0; until "$WEXCTL" models | grep -q "^модель-模型  *published " && "$WEXCTL" models | grep -q "^$NFD  *published "; do
	kill -0 $PU 2>/dev/null || fail "producer: $(cat "$TMP/pu.log")"
	kill -0 $PD 2>/dev/null || fail "producer: $(cat "$TMP/pd.log")"
	i=$((i+1)); [ $i -lt 400 ] || fail "model модель-模型 or $NFD never published"; sleep 0.05
done
"$WEXCTL" models >"$TMP/models-u.txt" || fail "models"
"$WEXCTL" clients >"$TMP/clients-u.txt" || fail "clients"
$PY - "$TMP/models-u.txt" "$TMP/clients-u.txt" "$NFD" <<'PYEOF' || fail "tables misaligned: $(cat "$TMP/models-u.txt" "$TMP/clients-u.txt")"
import sys, unicodedata
# Each row as display columns: a wide character takes two, a combining
# mark none (Thai's U+0E31 is a mark of combining class 0).
cols = lambda s: "".join("" if unicodedata.category(ch) in ("Mn", "Me") else
                         ch + ("\0" if unicodedata.east_asian_width(ch) in "WF" else "") for ch in s)
for name in ("модель-模型", sys.argv[3]):
    for path, col, want in ((sys.argv[1], "STATE", "published"), (sys.argv[2], "RANK", "   0")):
        lines = [l.rstrip("\n") for l in open(path, encoding="utf-8") if l.strip()]
        at = lines[0].index(col)
        row = cols([l for l in lines if l.startswith(name) or (" %s " % name) in l][0])
        assert row[at:at + len(want)] == want, (name, path, col, at, row)
PYEOF
kill "$PU" "$PD"; wait "$PU" "$PD" 2>/dev/null
cleanup_extra() { kill "$P" "$C" 2>/dev/null; wait "$P" "$C" 2>/dev/null; }
"$WEXCTL" watch -n 0.1 --count 2 >"$TMP/watch.txt" || fail "watch"
[ "$(grep -c '^wexd pid' "$TMP/watch.txt")" = 2 ] || fail "watch did not refresh twice"
"$WEXCTL" metrics >"$TMP/metrics.txt" || fail "metrics"
grep -q 'wex_syncs_total{mode="copy"} 2' "$TMP/metrics.txt" || fail "copy syncs not counted: $(grep syncs "$TMP/metrics.txt")"
grep -q 'wex_sync_bytes_total{mode="copy",backend="host"}' "$TMP/metrics.txt" || fail "sync bytes not counted"
if command -v promtool >/dev/null; then
	promtool check metrics <"$TMP/metrics.txt" || fail "promtool rejects the metrics"
else
	echo "note: promtool missing: exposition format checked by ops_metrics_render only"
fi
"$WEXCTL" config set begin_write_timeout_ms 1234 >/dev/null || fail "config set modifiable field"
"$WEXCTL" config get begin_write_timeout_ms --json | grep -q 1234 || fail "config get after set"
# The table says how each field changes, as README's does: config set
# (yes), a reload (reload), a restart (no); it said "no" for a reload's.
"$WEXCTL" config get max_clients >"$TMP/get.txt" || fail "config get max_clients"
grep -q "^NAME .* RUNTIME " "$TMP/get.txt" || fail "config get header: $(cat "$TMP/get.txt")"
grep -Eq "^max_clients +[0-9]+ +[a-z]+ +reload " "$TMP/get.txt" ||
	fail "config get max_clients not shown reloadable: $(cat "$TMP/get.txt")"
"$WEXCTL" config get begin_write_timeout_ms | grep -Eq "^begin_write_timeout_ms +1234 +[a-z]+ +yes " ||
	fail "config get: modifiable field not shown yes"
"$WEXCTL" config get socket | grep -Eq "^socket +.* no " || fail "config get: restart-only field not shown no"
if "$WEXCTL" config set socket /tmp/x 2>"$TMP/err"; then fail "socket changed at run time"; fi
grep -q "socket" "$TMP/err" || fail "refusal does not name the field"
# An unknown field: wexd's words, not the code's ("No such file or directory").
if "$WEXCTL" config set nope 3 2>"$TMP/err"; then fail "unknown field set"; fi
grep -q "^wexctl: config set: field 'nope': unknown field" "$TMP/err" || fail "unknown field: $(cat "$TMP/err")"
grep -q "No such file" "$TMP/err" && fail "unknown field reported as a missing file: $(cat "$TMP/err")"
# A reload with no configuration file says so (not the default path's
# name, as if a file had been read there).
if [ ! -e /etc/wex/wexd.json ]; then
	"$WEXCTL" config reload >"$TMP/reload.out" 2>&1 || fail "config reload: $(cat "$TMP/reload.out")"
	grep -q "^reloaded (no file: defaults and environment): " "$TMP/reload.out" ||
		fail "config reload without a file said: $(cat "$TMP/reload.out")"
	"$WEXCTL" config get --json | /usr/bin/python3 -c "import json,sys; f=json.load(sys.stdin)['file']; sys.exit('config get names file %s' % f if f else 0)" ||
		fail "config get --json names a file that was not loaded"
fi
# watch rides through a restart of wexd, as top would: stopped under it,
# it says so once and tries again each interval; the new wexd's view
# follows; ended by --count while wexd answers: exit 0.
OLD=$WEXD_PID
# (Waits are on what watch shows, not on sleeps: a loaded machine may take
# longer than a sleep to start wexctl, and to stop and start wexd; 100
# views leave it 10 s for the restart.)
"$WEXCTL" watch -n 0.1 --count 100 >"$TMP/watch.out" 2>"$TMP/watch.err" &
W=$!
i=0; until grep -q "wexd pid $OLD " "$TMP/watch.out"; do
	kill -0 $W 2>/dev/null || fail "watch ended before its first view: $(cat "$TMP/watch.err")"
	i=$((i+1)); [ $i -lt 200 ] || fail "watch showed no view of the first wexd"; sleep 0.05; done
kill -TERM "$WEXD_PID"; wait "$WEXD_PID"; WEXD_PID=""
i=0; until grep -q "not answering" "$TMP/watch.err"; do
	kill -0 $W 2>/dev/null || fail "watch ended when wexd stopped: $(cat "$TMP/watch.err")"
	i=$((i+1)); [ $i -lt 200 ] || fail "watch did not say wexd stopped answering: $(cat "$TMP/watch.err")"; sleep 0.05; done
# (Some tries while wexd is down, for the check that it says so once.)
sleep 0.7
kill -0 $W 2>/dev/null || fail "watch ended when wexd stopped: $(cat "$TMP/watch.err")"
grep -q "^wexctl: watch: wexd is not answering; trying again every 0.1 s" "$TMP/watch.err" ||
	fail "watch did not say wexd stopped answering: $(cat "$TMP/watch.err")"
[ "$(grep -c "not answering\|cannot reach" "$TMP/watch.err")" -le 2 ] ||
	fail "watch repeats itself while wexd is down: $(cat "$TMP/watch.err")"
start_wexd
wait $W || fail "watch exited $? after wexd came back: $(cat "$TMP/watch.err")"
grep -q "wexd pid $OLD " "$TMP/watch.out" || fail "watch showed no view of the first wexd"
grep -q "wexd pid $WEXD_PID " "$TMP/watch.out" || fail "watch showed no view of the restarted wexd"
grep -q "^wexctl: watch: wexd answers again" "$TMP/watch.err" || fail "watch did not say wexd is back"
# Ended by --count while wexd is gone: exit 1 (the last view is stale).
# (wexd stopped once watch showed a view, with 5 s of views left.)
"$WEXCTL" watch -n 0.05 --count 100 >"$TMP/watch2.out" 2>"$TMP/watch.err" &
W=$!
i=0; until grep -q "wexd pid $WEXD_PID " "$TMP/watch2.out"; do
	kill -0 $W 2>/dev/null || fail "watch ended before its first view: $(cat "$TMP/watch.err")"
	i=$((i+1)); [ $i -lt 200 ] || fail "watch showed no view of wexd"; sleep 0.05; done
kill -TERM "$WEXD_PID"; wait "$WEXD_PID"; WEXD_PID=""
i=0; while kill -0 $W 2>/dev/null; do i=$((i+1)); [ $i -lt 600 ] || fail "watch --count 100 goes on"; sleep 0.05; done
wait $W && fail "watch exited 0 ending while wexd was gone"
[ -s "$TMP/watch.err" ] || fail "watch did not say why"
echo "PASS: status, models, clients, plans, watch, metrics, config"
