#!/bin/sh
# journal_off_fixed_readonly.sh WEXD WEXCTL - a lease journal directory
# refused at start (mode 0755) on a read-only bind mount, holding 3 records
# an earlier wexd left, is set right (chmod 0700 of the directory under the
# mount) while wexd runs: wexd takes it up and would remove the records,
# which it cannot.  It must not say they were removed (before: "3 record(s)
# ... removed" and one "its record ... removed" line each, all of them
# still there for the next wexd to read and hold the trainer off with).
WEXD=$1 WEXCTL=$2
. "$(dirname "$0")/lib.sh"
J="$TMP/wexd.sock.leases"
mkdir -m 700 "$J" "$TMP/src"
chmod 755 "$TMP/src"
for i in 0 1 2; do
	printf '{"wex_lease":1,"model":"m","group":"g","rank":0,"world":1,"version":1,"mode":"remap-view","pid":%d,"uid":0,"start":1}' \
		$((5000000 + i)) >"$TMP/src/l-1-$i"
done
ro_bind "$TMP/src" "$J"
start_wexd
grep -q "lease journal off" "$TMP/wexd.log" ||
	fail "the journal was not refused at start: $(cat "$TMP/wexd.log")"
chmod 700 "$TMP/src"
i=0
while ! grep -q "can be used again" "$TMP/wexd.log" && [ $i -lt 50 ]; do sleep 0.1; i=$((i+1)); done
grep -q "can be used again" "$TMP/wexd.log" ||
	fail "wexd did not take the journal up: $(tail -5 "$TMP/wexd.log")"
n=$(ls "$TMP/src" | wc -l)
[ "$n" = 3 ] || skip "$n records left under the read-only mount, not 3"
grep -v "could not be removed" "$TMP/wexd.log" | grep -q "removed" &&
	fail "wexd says records it could not remove were removed: $(grep removed "$TMP/wexd.log")"
grep -q "3 record(s) of leases an earlier wexd granted.*could not be removed" "$TMP/wexd.log" ||
	fail "wexd does not say the records could not be removed: $(tail -5 "$TMP/wexd.log")"
stop_wexd
[ "$WEXD_RC" = 0 ] || fail "wexd exit code $WEXD_RC"
echo "PASS: records a taken-up read-only journal keeps are not said removed"
