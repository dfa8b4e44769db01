#!/bin/sh
# access_control.sh WEXD PRODUCER - proves SO_PEERCRED access control:
# with a config whose "policy" model admits only user wex-allowed as a
# producer, wex-allowed registers and publishes while wex-denied is refused
# with EACCES (counted in metrics and logged once); the socket is created
# with the configured mode and group, so a user outside the group cannot
# even connect; a reload that removes an admitted producer from the list
# disconnects it (one that keeps it does not); a model open to a group
# admits a process holding it (SO_PEERGROUPS), whatever its user's entry in
# the group database, and refuses one that dropped it.  Needs root (useradd,
# setpriv); skips with the reason otherwise.
WEXD=$1 PRODUCER=$2 WEXCTL=$3
. "$(dirname "$0")/lib.sh"
[ "$(id -u)" = 0 ] || skip "needs root to create test users"
command -v useradd >/dev/null || skip "useradd missing (package passwd)"
command -v runuser >/dev/null || skip "runuser missing (package util-linux)"
command -v setpriv >/dev/null || skip "setpriv missing (package util-linux)"
getent group wextest >/dev/null || groupadd --system wextest || fail "groupadd"
# (svc_unit_caps creates wex-allowed too, in no group: the membership is
# made sure of whoever created the user.)
for u in wex-allowed wex-denied; do
	id "$u" >/dev/null 2>&1 || useradd --system --no-create-home -G wextest "$u" || fail "useradd $u"
	id -nG "$u" | grep -qw wextest || usermod -aG wextest "$u" || fail "usermod $u"
done
id wex-outsider >/dev/null 2>&1 || useradd --system --no-create-home wex-outsider || fail "useradd"
# The binaries must be reachable by the test users.  A build under a
# directory they cannot enter (a clone in /root, mode 700 on a fresh
# Debian) is copied, with the libwex it links against, into $TMP (755).
for f in "$WEXD" "$PRODUCER" "$WEXCTL"; do
	runuser -u wex-allowed -- test -x "$f" && continue
	mkdir -p "$TMP/bin"
	for b in "$WEXD" "$PRODUCER" "$WEXCTL" "$(dirname "$PRODUCER")"/libwex.so*; do
		cp -P "$b" "$TMP/bin/" || fail "copy $b for the test users"
	done
	chmod 755 "$TMP/bin"
	export LD_LIBRARY_PATH="$TMP/bin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
	WEXD=$TMP/bin/$(basename "$WEXD") PRODUCER=$TMP/bin/$(basename "$PRODUCER")
	WEXCTL=$TMP/bin/$(basename "$WEXCTL")
	for g in "$WEXD" "$PRODUCER" "$WEXCTL"; do
		runuser -u wex-allowed -- test -x "$g" || fail "$g (a copy of $f) not executable by other users"
	done
	echo "note: $f is out of the test users' reach: copies in $TMP/bin run instead"
	break
done
cat >"$TMP/wexd.json" <<JSON
{ "socket_mode": "0660", "socket_group": "wextest",
  "models": { "policy": { "producers": { "uids": ["wex-allowed"] } } } }
JSON
start_wexd --config "$TMP/wexd.json"
mode=$(stat -c %a "$WEX_SOCKET"); grp=$(stat -c %G "$WEX_SOCKET")
[ "$mode" = 660 ] || fail "socket mode $mode, expected 660"
[ "$grp" = wextest ] || fail "socket group $grp, expected wextest"

runuser -u wex-allowed -- env WEX_SOCKET="$WEX_SOCKET" "$PRODUCER" --preset tiny --versions 1 \
	>"$TMP/allowed.log" 2>&1 || fail "allowed user refused: $(cat "$TMP/allowed.log")"
grep -q "published v1" "$TMP/allowed.log" || fail "allowed user did not publish"

if runuser -u wex-denied -- env WEX_SOCKET="$WEX_SOCKET" "$PRODUCER" --preset tiny --versions 1 \
	>"$TMP/denied.log" 2>&1; then fail "denied user was admitted"; fi
grep -q "Permission denied" "$TMP/denied.log" || fail "denied user got no EACCES: $(cat "$TMP/denied.log")"
# Consuming is not restricted for "policy": a denied producer may still consume
# (checked through the refusal counter staying at one below).
if runuser -u wex-outsider -- env WEX_SOCKET="$WEX_SOCKET" "$PRODUCER" --preset tiny --versions 1 \
	>"$TMP/outsider.log" 2>&1; then fail "user outside the socket group connected"; fi
grep -q "Permission denied" "$TMP/outsider.log" || fail "outsider: $(cat "$TMP/outsider.log")"
# wexctl tells such a user what to do about it.
if runuser -u wex-outsider -- env WEX_SOCKET="$WEX_SOCKET" "$WEXCTL" status \
	>/dev/null 2>"$TMP/outsider-ctl.err"; then fail "outsider's wexctl connected"; fi
grep -q "usermod -aG" "$TMP/outsider-ctl.err" || fail "outsider's wexctl: no hint: $(cat "$TMP/outsider-ctl.err")"
# config set is for root and wexd's own user: a user who may connect reads
# the configuration but cannot change it (exit 1, wexd's reason).
runuser -u wex-allowed -- env WEX_SOCKET="$WEX_SOCKET" "$WEXCTL" config get log_level \
	>/dev/null 2>"$TMP/get.err" || fail "member's config get: $(cat "$TMP/get.err")"
runuser -u wex-allowed -- env WEX_SOCKET="$WEX_SOCKET" "$WEXCTL" config set log_level debug \
	>/dev/null 2>"$TMP/set.err"
rc=$?
[ $rc = 1 ] || fail "member's config set exited $rc, not 1"
grep -q "may not change wexd's configuration" "$TMP/set.err" || fail "member's config set: $(cat "$TMP/set.err")"
"$WEXCTL" config get log_level --json | grep -q '"info"' || fail "a refused config set changed log_level"
runuser -u wex-allowed -- env WEX_SOCKET="$WEX_SOCKET" "$WEXCTL" config reload >/dev/null 2>"$TMP/reload.err"
rc=$?
[ $rc = 1 ] || fail "member's config reload exited $rc, not 1"
grep -q "config reload: uid [0-9]* may not change wexd's configuration" "$TMP/reload.err" ||
	fail "member's config reload: $(cat "$TMP/reload.err")"
grep -q "reloading configuration, asked by" "$TMP/wexd.log" && fail "a member's config reload was carried out"
# So is asking engines to verify: refused as such (exit 1, counted), not
# sent off to attach an engine first (model 'policy' has no group yet).
runuser -u wex-allowed -- env WEX_SOCKET="$WEX_SOCKET" "$WEXCTL" verify policy --no-wait \
	>/dev/null 2>"$TMP/verify.err"
rc=$?
[ $rc = 1 ] || fail "member's verify exited $rc, not 1"
grep -q "verify: uid [0-9]* may not ask engines to verify" "$TMP/verify.err" ||
	fail "member's verify: $(cat "$TMP/verify.err")"
"$WEXCTL" metrics | grep -q 'wex_refused_connections_total{reason="verify"} 1' ||
	fail "member's verify not counted as refused"

"$WEXCTL" metrics >"$TMP/metrics" || fail "wexctl metrics"
grep -q 'wex_refused_connections_total{reason="access"} 1' "$TMP/metrics" ||
	fail "refusal not counted once: $(grep refused "$TMP/metrics")"
n=$(grep -c "refused uid" "$TMP/wexd.log")
[ "$n" = 1 ] || fail "refusal logged $n times, expected once"
# A reload that takes access away disconnects a producer admitted before
# (logged, counted); one that still may stays.
runuser -u wex-allowed -- env WEX_SOCKET="$WEX_SOCKET" "$PRODUCER" --preset tiny --versions 1 \
	--hold >"$TMP/held.log" 2>&1 &
H=$!
cleanup_extra() { kill "$H" 2>/dev/null; wait "$H" 2>/dev/null; }
i=0; until grep -q "published v1" "$TMP/held.log"; do
	kill -0 $H 2>/dev/null || fail "held producer: $(cat "$TMP/held.log")"
	i=$((i+1)); [ $i -lt 400 ] || fail "held producer did not publish"; sleep 0.05; done
producers() { "$WEXCTL" clients --json | /usr/bin/python3 -c \
	"import json,sys; print(sum(c['role'] == 'producer' for c in json.load(sys.stdin)['clients']))"; }
[ "$(producers)" = 1 ] || fail "the held producer is not listed"
cat >"$TMP/wexd.json" <<JSON
{ "socket_mode": "0660", "socket_group": "wextest",
  "models": { "policy": { "producers": { "uids": ["wex-allowed"] } } }, "log_level": "debug" }
JSON
kill -HUP "$WEXD_PID"
i=0; until grep -q "config info: reloaded" "$TMP/wexd.log"; do
	i=$((i+1)); [ $i -lt 200 ] || fail "reload not logged"; sleep 0.05; done
[ "$(producers)" = 1 ] || fail "a reload that keeps access disconnected the producer"
cat >"$TMP/wexd.json" <<JSON
{ "socket_mode": "0660", "socket_group": "wextest",
  "models": { "policy": { "producers": { "uids": ["wex-denied"] } } } }
JSON
kill -HUP "$WEXD_PID"
i=0; until grep -q "may no longer be a producer of model 'policy': disconnected" "$TMP/wexd.log"; do
	i=$((i+1)); [ $i -lt 200 ] || fail "revoked producer not disconnected: $(tail -3 "$TMP/wexd.log")"; sleep 0.05; done
i=0; until [ "$(producers)" = 0 ]; do
	i=$((i+1)); [ $i -lt 200 ] || fail "the revoked producer is still listed"; sleep 0.05; done
# Counted: the revocation (2), then the producer's watch reconnecting at
# once (3), refused; it then waits for the producer's next call instead of
# asking again and again.
refused() { "$WEXCTL" metrics | sed -n 's/^wex_refused_connections_total{reason="access"} //p'; }
i=0; until [ "$(refused)" = 3 ]; do
	i=$((i+1)); [ $i -lt 200 ] || fail "revocation and the one retry not counted: $("$WEXCTL" metrics | grep refused)"; sleep 0.05; done
grep -q "wexd refused producer rank 0 of model 'policy' (.*): it reconnects at its next call" "$TMP/held.log" ||
	fail "the producer's watch did not say it was refused: $(tail -3 "$TMP/held.log")"
sleep 1.5
[ "$(refused)" = 3 ] || fail "the revoked producer kept asking: $("$WEXCTL" metrics | grep refused)"
# Start-up errors name the setting behind the failing step: a group the user
# may not give the socket, and a path where a wexd already listens.
mkdir -m 1777 "$TMP/g"
runuser -u wex-outsider -- env WEX_SOCKET="$TMP/g/w.sock" WEX_SOCKET_GROUP=root "$WEXD" 2>"$TMP/group.log"
rc=$?
# 2, a configuration error: the unit does not restart it in a loop.
[ $rc = 2 ] || fail "wexd with a socket group its user may not give exited $rc, not 2"
grep -q "cannot listen on $TMP/g/w.sock: chown to group root (gid 0; socket_group from env): Operation not permitted" \
	"$TMP/group.log" || fail "unclear socket_group error: $(cat "$TMP/group.log")"
[ -e "$TMP/g/w.sock" ] && fail "the refused wexd left its socket behind"
if "$WEXD" 2>"$TMP/twice.log"; then fail "a second wexd started on the same socket"; fi
grep -q "cannot listen on $WEX_SOCKET: another wexd (pid $WEXD_PID) holds $WEX_SOCKET.lock" \
	"$TMP/twice.log" || fail "unclear error for a socket in use: $(cat "$TMP/twice.log")"
# Group access goes by the groups the process holds (SO_PEERGROUPS), not
# the group database: a member that dropped the group is refused, a user
# outside it whose process was given it is admitted.
getent group wexgid >/dev/null || groupadd --system wexgid || fail "groupadd wexgid"
id -nG wex-allowed | grep -qw wexgid || usermod -aG wexgid wex-allowed || fail "usermod"
cat >"$TMP/wexd.json" <<JSON
{ "socket_mode": "0660", "socket_group": "wextest",
  "models": { "bygroup": { "producers": { "gids": ["wexgid"] } } } }
JSON
n=$(grep -c "config info: reloaded" "$TMP/wexd.log")
kill -HUP "$WEXD_PID"
i=0; until [ "$(grep -c "config info: reloaded" "$TMP/wexd.log")" -gt "$n" ]; do
	i=$((i+1)); [ $i -lt 200 ] || fail "reload not logged"; sleep 0.05; done
bygroup() { # USER GROUPS
	setpriv --reuid="$1" --regid="$1" --groups="$2" -- env WEX_SOCKET="$WEX_SOCKET" \
		"$PRODUCER" --model bygroup --preset tiny --versions 1 >"$TMP/bygroup.log" 2>&1
}
bygroup wex-allowed wextest,wexgid || fail "a member holding wexgid refused: $(cat "$TMP/bygroup.log")"
if bygroup wex-allowed wextest; then fail "a member whose process dropped wexgid was admitted"; fi
grep -q "Permission denied" "$TMP/bygroup.log" || fail "dropped group: $(cat "$TMP/bygroup.log")"
bygroup wex-outsider wextest,wexgid ||
	fail "a process given wexgid (its user outside it) refused: $(cat "$TMP/bygroup.log")"
echo "PASS: allowed producer served, denied producer refused with EACCES, outsider cannot connect, a reload revoking access disconnects, socket errors name the setting, groups go by what the process holds"
