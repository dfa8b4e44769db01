#!/bin/sh
# journal_readonly.sh WEXD WEXCTL - a lease journal directory wexd cannot
# write (a read-only bind mount over `<socket>.leases`; as would a mode or
# ACL wexd's user lacks) holding 50 records of leases whose processes are
# long gone: wexd starts, says at start that the journal cannot be written
# (the leases it grants would not outlive it), status says so too
# (lease_journal.unwritable, and wexctl's line), and the records it cannot
# remove are summed up, not one warning each.  Before, wexd said nothing
# until a lease was taken (status showed the journal as fine), and logged
# one "cannot remove" line per stale record at every start (thousands of
# dead processes' records: thousands of lines).
WEXD=$1 WEXCTL=$2
. "$(dirname "$0")/lib.sh"
J="$TMP/wexd.sock.leases"
mkdir -m 700 "$J" "$TMP/src"
chmod 700 "$TMP/src"
i=0
# pids above any pid_max (2^22): no process has them.
while [ $i -lt 50 ]; do
	printf '{"wex_lease":1,"model":"m","group":"g","rank":0,"world":1,"version":1,"mode":"remap-view","pid":%d,"uid":0,"start":1}' \
		$((5000000 + i)) >"$TMP/src/l-1-$i"
	i=$((i+1))
done
ro_bind "$TMP/src" "$J"
start_wexd
grep -q "lease journal $J cannot be written (Read-only file system)" "$TMP/wexd.log" ||
	fail "no warning at start that the journal cannot be written: $(cat "$TMP/wexd.log")"
"$WEXCTL" status --json | tr -d ' \n' | grep -q '"unwritable":"Read-onlyfilesystem"' ||
	fail "status does not say the journal cannot be written: $("$WEXCTL" status --json)"
"$WEXCTL" status | grep -q "lease journal $J  (cannot be written: Read-only file system" ||
	fail "wexctl status: $("$WEXCTL" status | grep journal)"
n=$(grep -c "cannot remove $J/" "$TMP/wexd.log")
[ "$n" -le 3 ] || fail "$n lines, one per record that cannot be removed"
grep -q "50 records of leases that ended could not be removed from $J (the last: Read-only file system)" "$TMP/wexd.log" ||
	fail "the records that cannot be removed are not summed up: $(tail -3 "$TMP/wexd.log")"
stop_wexd
[ "$WEXD_RC" = 0 ] || fail "wexd exit code $WEXD_RC"
echo "PASS: a read-only lease journal is said at start and in status"
