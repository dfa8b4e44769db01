#!/bin/sh
# reload_flags.sh WEXD WEXCTL - proves that wexd's command-line flags keep
# winning after a reload (SIGHUP): started with --log-level debug, --io
# epoll and --socket over a --config file that says otherwise, a reload of
# that file (now also changing sync_timeout_ms) applies the file's change,
# keeps all three flags (config get names their source "flag"), logs no
# "needs a restart" for them but says the file's values they outrank (log
# and wexctl config reload), and debug lines still appear after it; a
# value set at run time then wins over the flag, and the next reload keeps
# it. status names the config file it loaded.
WEXD=$1 WEXCTL=$2
. "$(dirname "$0")/lib.sh"
PY=/usr/bin/python3; [ -x $PY ] || PY=python3
command -v $PY >/dev/null || skip "python3 missing"
cat >"$TMP/wexd.json" <<JSON
{ "log_level": "warn", "io_backend": "io_uring", "socket": "$TMP/other.sock" }
JSON
start_wexd --config "$TMP/wexd.json" --log-level debug --io epoll --socket "$TMP/wexd.sock"
field() { # field NAME KEY: config get NAME --json, the value of KEY
	"$WEXCTL" config get "$1" --json | $PY -c "import json,sys; print(json.load(sys.stdin)['fields'][0]['$2'])"
}
check_flags() {
	[ "$(field log_level value)" = debug ] || fail "$1: log_level is $(field log_level value), not debug"
	[ "$(field log_level source)" = flag ] || fail "$1: log_level's source is $(field log_level source)"
	[ "$(field io_backend value)" = epoll ] || fail "$1: io_backend is $(field io_backend value)"
	[ "$(field io_backend source)" = flag ] || fail "$1: io_backend's source is $(field io_backend source)"
	[ "$(field socket value)" = "$TMP/wexd.sock" ] || fail "$1: socket is $(field socket value)"
	[ "$(field socket source)" = flag ] || fail "$1: socket's source is $(field socket source)"
}
check_flags "at start"
"$WEXCTL" status --json | grep -q "\"config\": *\"$TMP/wexd.json\"" || fail "status does not name the config file"
cat >"$TMP/wexd.json" <<JSON
{ "log_level": "warn", "io_backend": "io_uring", "socket": "$TMP/other.sock", "sync_timeout_ms": 4321 }
JSON
kill -HUP "$WEXD_PID"
i=0; until [ "$(field sync_timeout_ms value)" = 4321 ]; do
	i=$((i+1)); [ $i -lt 200 ] || fail "the reload did not apply sync_timeout_ms"; sleep 0.05; done
check_flags "after a reload"
grep "reload" "$TMP/wexd.log" | grep -q "needs a restart" &&
	fail "a flag was taken for a changed field: $(grep 'needs a restart' "$TMP/wexd.log")"
# The file's values the flags outrank are said, not passed over.
grep -q 'reload: log_level is "warn" in file .*, but --log-level set it to "debug", which outranks it; keeping "debug"' \
	"$TMP/wexd.log" || fail "no warning that --log-level outranks the file's log_level"
out=$("$WEXCTL" config reload) || fail "config reload: $out"
case $out in *"kept over the file (the environment, a flag or config set outranks it): "*log_level*) ;;
	*) fail "config reload does not say the file's log_level was kept out: $out" ;; esac
# Debug lines after the reload: a connection logs one at debug level.
n=$(grep -c 'debug: client .* connected' "$TMP/wexd.log")
"$WEXCTL" status >/dev/null || fail "status"
i=0; until [ "$(grep -c 'debug: client .* connected' "$TMP/wexd.log")" -gt "$n" ]; do
	i=$((i+1)); [ $i -lt 100 ] || fail "no debug lines after the reload"; sleep 0.05; done
# A value set at run time wins over the flag, also after a reload.
"$WEXCTL" config set log_level info >/dev/null || fail "config set log_level"
[ "$(field log_level source)" = runtime ] || fail "config set did not win over the flag"
kill -HUP "$WEXD_PID"
i=0; until [ "$(grep -c 'config info: reloaded' "$TMP/wexd.log")" -ge 3 ]; do
	i=$((i+1)); [ $i -lt 200 ] || fail "second reload not logged"; sleep 0.05; done
[ "$(field log_level value)" = info ] || fail "the runtime value did not survive the reload"
kill -TERM "$WEXD_PID"; wait "$WEXD_PID"; rc=$?; WEXD_PID=""
[ $rc = 0 ] || fail "wexd exit code $rc"
echo "PASS: flags survive a reload (source flag, no restart warning, debug lines go on); config set wins over a flag"
