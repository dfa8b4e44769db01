#!/bin/sh
# journal_log.sh WEXD - proves README's "Logs go to stderr, one line per
# event. Under systemd they carry a <N> priority prefix that journald
# keeps":
#  - with stderr on the journal (JOURNAL_STREAM naming stderr's device and
#    inode, as systemd sets it), every line of wexd's carries a priority,
#    the errors that stop it at start included: a bad configuration file
#    is "<3>" naming the file and the field (it was a bare "wexd: ..."
#    line, which journald files at the default priority, info, so
#    `journalctl -p err -u wexd` did not show why wexd would not start);
#  - with JOURNAL_STREAM inherited but stderr elsewhere (wexd run by hand
#    from a shell a systemd service started, or a test runner), the lines
#    are the timestamped ones meant for a terminal or a file, not "<6>..."
#    (systemd.exec(5): compare JOURNAL_STREAM with stderr's fstat).
WEXD=$1
. "$(dirname "$0")/lib.sh"
export WEX_SOCKET="$TMP/wexd.sock"
unset WEX_LOG_JOURNAL

# stderr is the journal: the file stands for journald's stream.
: >"$TMP/j.log"
echo '{ "drain_timeout_ms": -5 }' >"$TMP/bad.json"
JOURNAL_STREAM=$(stat -c '%d:%i' "$TMP/j.log") "$WEXD" --config "$TMP/bad.json" 2>>"$TMP/j.log"
rc=$?
[ $rc = 2 ] || fail "a bad configuration file: wexd exited $rc, not 2"
grep -q "^<3>.*config $TMP/bad.json: field 'drain_timeout_ms'" "$TMP/j.log" ||
	fail "the start-up error has no error priority for journald: $(cat "$TMP/j.log")"
grep -v '^<[0-7]>' "$TMP/j.log" | grep -q . && fail "lines without a priority: $(grep -v '^<[0-7]>' "$TMP/j.log")"
: >"$TMP/j.log"
JOURNAL_STREAM=$(stat -c '%d:%i' "$TMP/j.log") "$WEXD" --log-level loud 2>>"$TMP/j.log" && fail "--log-level loud accepted"
grep -q "^<3>.*--log-level 'loud'" "$TMP/j.log" || fail "a bad flag has no error priority: $(cat "$TMP/j.log")"
grep -q "^<3>.*--log-level 'loud' unknown (error, warn, info, debug or trace)" "$TMP/j.log" ||
	fail "a bad --log-level does not list the levels: $(cat "$TMP/j.log")"
# getopt's own complaints (an unknown flag, a flag without its value)
# were bare lines too.
for args in --bogus --config; do
	: >"$TMP/j.log"
	JOURNAL_STREAM=$(stat -c '%d:%i' "$TMP/j.log") "$WEXD" $args 2>>"$TMP/j.log"
	rc=$?
	[ $rc = 2 ] || fail "wexd $args: exit $rc, not 2"
	grep -q "^<3>.*$args" "$TMP/j.log" || fail "wexd $args: no error priority: $(cat "$TMP/j.log")"
	grep -v '^<[0-7]>' "$TMP/j.log" | grep -q . && fail "wexd $args: lines without a priority: $(cat "$TMP/j.log")"
done
# Each is named as what it is: an unknown letter in a group (-xh), not the
# argument before it; a long flag given a value it does not take.
for c in "-xh|unknown option '-x'|--io=epoll -xh" "--help=3|'--help=3': the option takes no value|--help=3"; do
	want=${c#*|}; want=${want%|*}; args=${c##*|}
	# shellcheck disable=SC2086
	"$WEXD" $args 2>"$TMP/flag.err" && fail "wexd $args started"
	grep -qF -- "$want" "$TMP/flag.err" || fail "wexd $args: not \"$want\": $(cat "$TMP/flag.err")"
done

# Starts wexd with JOURNAL_STREAM naming j.log and stderr appended to $1,
# waits until it listens, and stops it.
start_stop() {
	mkfifo "$TMP/ready"
	JOURNAL_STREAM=$(stat -c '%d:%i' "$TMP/j.log") WEXD_READY_FD=3 "$WEXD" 3>"$TMP/ready" 2>>"$1" &
	WEXD_PID=$!
	read -r _ <"$TMP/ready" || fail "wexd did not start: $(cat "$1")"
	rm -f "$TMP/ready"
	kill -TERM "$WEXD_PID"; wait "$WEXD_PID"; WEXD_PID=""
}

# A running wexd under the journal: info lines are "<6>".
: >"$TMP/j.log"
start_stop "$TMP/j.log"
grep -q "^<6>wexd info: listening on $WEX_SOCKET" "$TMP/j.log" || fail "no <6> info line under the journal: $(cat "$TMP/j.log")"

# Lines are UTF-8, also where one is cut: journald keeps a line that is not
# as binary, and journalctl shows "[N blob data]" for it.  A long bad value
# quoted in the error that stops wexd (cut at 64 bytes), and the models of
# a file logged at start (cut at the 1 KiB a line may have), both of
# non-ASCII names, were cut inside a character.
PY=/usr/bin/python3; [ -x $PY ] || PY=python3
utf8_ok() {
	$PY -c 'import sys; open(sys.argv[1], "rb").read().decode("utf-8")' "$1" 2>/dev/null
}
$PY -c 'import json; print(json.dumps({"log_level": "\u00e9" * 40}, ensure_ascii=False))' >"$TMP/u8.json"
: >"$TMP/j.log"
JOURNAL_STREAM=$(stat -c '%d:%i' "$TMP/j.log") "$WEXD" --config "$TMP/u8.json" 2>>"$TMP/j.log"
grep -q "^<3>.*field 'log_level'" "$TMP/j.log" || fail "no error for a long bad log_level: $(cat "$TMP/j.log")"
utf8_ok "$TMP/j.log" || fail "the error quoting a long non-ASCII value is not UTF-8: $(cat -v "$TMP/j.log")"
# Seven names of 53 three-byte characters: every character starts at a
# multiple of 3 bytes into "<6>config info: models = ", and the line is cut
# at 1022 bytes, inside one.
$PY -c 'import json; print(json.dumps({"models": {chr(0x4e00 + k) * 53: {} for k in range(7)}}, ensure_ascii=False))' >"$TMP/u8models.json"
: >"$TMP/j.log"
mkfifo "$TMP/ready"
JOURNAL_STREAM=$(stat -c '%d:%i' "$TMP/j.log") WEXD_READY_FD=3 "$WEXD" --config "$TMP/u8models.json" 3>"$TMP/ready" 2>>"$TMP/j.log" &
WEXD_PID=$!
read -r _ <"$TMP/ready" || fail "wexd did not start: $(cat "$TMP/j.log")"
rm -f "$TMP/ready"
kill -TERM "$WEXD_PID"; wait "$WEXD_PID"; WEXD_PID=""
grep -q "^<6>config info: models = " "$TMP/j.log" || fail "the models are not logged: $(cat "$TMP/j.log")"
utf8_ok "$TMP/j.log" || fail "a log line cut at its limit is not UTF-8: its end: $(grep -a 'models = ' "$TMP/j.log" | tail -c 24 | od -An -tx1)"

# What is no lease record in the lease journal's directory: a file is
# removed, said so; a directory is left, and the log says so (it said
# "removed" at every start).
mkdir -p "$WEX_SOCKET.leases/stray.d"
echo junk >"$WEX_SOCKET.leases/junk"
: >"$TMP/stray.log"
start_stop "$TMP/stray.log"
grep -q "leases/junk is not a lease record (.*): removed" "$TMP/stray.log" ||
	fail "a stray file in the lease journal not reported removed: $(cat "$TMP/stray.log")"
[ -e "$WEX_SOCKET.leases/junk" ] && fail "the stray file was not removed"
grep -q "leases/stray.d is not a lease record (.*), and cannot be removed (.*): left in place" "$TMP/stray.log" ||
	fail "a stray directory not reported left in place: $(cat "$TMP/stray.log")"
grep -q "stray.d .*: removed" "$TMP/stray.log" && fail "a directory reported removed: $(cat "$TMP/stray.log")"
[ -d "$WEX_SOCKET.leases/stray.d" ] || fail "the stray directory went"
rmdir "$WEX_SOCKET.leases/stray.d"

# JOURNAL_STREAM inherited, stderr a file of its own: no journal prefixes.
: >"$TMP/other.log"
JOURNAL_STREAM=$(stat -c '%d:%i' "$TMP/j.log") "$WEXD" --config "$TMP/bad.json" 2>>"$TMP/other.log"
grep -q '^<[0-7]>' "$TMP/other.log" && fail "journal prefixes on a stderr that is not the journal: $(cat "$TMP/other.log")"
grep -q "config $TMP/bad.json: field 'drain_timeout_ms'" "$TMP/other.log" || fail "start-up error lost: $(cat "$TMP/other.log")"
start_stop "$TMP/other.log"
grep -q '^<[0-7]>' "$TMP/other.log" && fail "journal prefixes on a stderr that is not the journal: $(cat "$TMP/other.log")"
grep -Eq '^[0-9]{4}-[0-9]{2}-[0-9]{2}T.* wexd info: listening on' "$TMP/other.log" ||
	fail "no timestamped line: $(cat "$TMP/other.log")"
# WEX_LOG_JOURNAL=1 still forces the prefix (a unit whose stderr is a pipe
# to a journal-aware logger).
: >"$TMP/forced.log"
WEX_LOG_JOURNAL=1 "$WEXD" --config "$TMP/bad.json" 2>>"$TMP/forced.log"
grep -q "^<3>" "$TMP/forced.log" || fail "WEX_LOG_JOURNAL=1 no longer forces the prefix: $(cat "$TMP/forced.log")"
echo "PASS: under the journal every line has a priority (start-up errors <3>); elsewhere lines are timestamped"
