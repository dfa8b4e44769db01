#!/bin/sh
# journal_faults.sh WEXD WEXCTL PRODUCER LIBWEX - the lease journal under
# what an operator may do to its directory while wexd runs: an engine (the
# Python glue) holds a remap-view lease of v1; its journal directory
# (`<socket>.leases`) is removed (`rm -rf`, a cleanup script), then
# replaced by another (a `mv` and a `mkdir`), then by one of another mode
# that wexd refuses until the operator's chmod.  Each time wexd must notice,
# say so, and write its records down again in the directory its next start
# reads: a wexd restarted then still lists the lease under held[] (the
# trainer waits).  Before, wexd went on writing into the removed directory
# (a rewrite of an open record "succeeded" into a file no one would read,
# no write error counted): the restarted wexd found no record, held
# nothing, and the trainer wrote under the engine.
WEXD=$1 WEXCTL=$2 PRODUCER=$3 LIBWEX=$4
. "$(dirname "$0")/lib.sh"
PY=/usr/bin/python3; [ -x $PY ] || PY=python3
command -v $PY >/dev/null || skip "python3 missing"
start_wexd
J="$TMP/wexd.sock.leases"
cleanup_extra() { kill -9 "$E" 2>/dev/null; kill "$P" 2>/dev/null; wait "$P" "$E" 2>/dev/null; }
E=
view_engine
[ "$(ls "$J" | wc -l)" = 1 ] || fail "no record of the engine's lease in $J: $(ls -la "$J")"

# restarted_holds WHAT: wexd restarted lists the engine's lease.
restarted_holds() {
	# (wexd looks at least once a second: 10 s is plenty, not a threshold.)
	i=0; until [ "$(ls "$J" 2>/dev/null | wc -l)" = 1 ] && grep -q "journal.*$J.*$1" "$TMP/wexd.log"; do
		i=$((i+1)); [ $i -lt 100 ] || fail "$1: wexd did not write the record again in $J, or did not say so: $(ls -la "$J" 2>&1); wexd: $(tail -3 "$TMP/wexd.log")"
		sleep 0.1; done
	stop_wexd
	start_wexd
	"$WEXCTL" status --json >"$TMP/s.json" || fail "status"
	tr -d ' \n' <"$TMP/s.json" | grep -q "\"held\":\[{[^]]*\"pid\":$E," ||
		fail "$1, then a restart: the engine's lease is not held: $(cat "$TMP/s.json"); wexd: $(tail -5 "$TMP/wexd.log")"
	# The engine's next call takes it back (the record is the connection's).
	"$WEXCTL" status >/dev/null
}
rm -rf "$J"
restarted_holds "removed"
mv "$J" "$TMP/old.leases"; mkdir -m 700 "$J"
restarted_holds "replaced"
# Replaced by a directory wexd refuses (another mode: not wexd's own): the
# journal is off, said so; the operator's chmod makes it usable again, and
# wexd must use it then (before, it stayed off until a restart, which is
# what loses the leases held).
mv "$J" "$TMP/old2.leases"; mkdir -m 755 "$J"
i=0; until grep -q "lease journal $J was replaced while wexd ran, and cannot be made again" "$TMP/wexd.log"; do
	i=$((i+1)); [ $i -lt 100 ] || fail "wexd did not say the journal is off: $(tail -3 "$TMP/wexd.log")"
	sleep 0.1; done
"$WEXCTL" status --json | tr -d ' \n' | grep -q '"lease_journal":{"dir":null,"off":' ||
	fail "status does not say the journal is off: $("$WEXCTL" status --json)"
chmod 700 "$J"
restarted_holds "can be used again"
stop_wexd
[ "$WEXD_RC" = 0 ] || fail "wexd exit code $WEXD_RC"
echo "PASS: a journal directory removed or replaced while wexd runs is written again"
