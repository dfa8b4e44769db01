#!/bin/sh
# journal_unwritable_later.sh WEXD WEXCTL PRODUCER LIBWEX - status's
# lease_journal.unwritable
# follows the directory while wexd runs, not only as it was at start: a
# journal whose filesystem turns read-only under a running wexd (ext4's
# errors=remount-ro after a disk error; here a read-only remount of a bind
# mount) is shown unwritable, and one made writable again (the operator's
# remount after the start-up warning) is no longer, and the remap lease an
# engine took meanwhile (its write failed) is written down then: the
# engine may not call again for a whole rollout.  Before, the flag was set
# once at start: status said a writable journal could not be written
# (until a restart), said nothing while every lease write failed, and the
# lease stayed unwritten until the engine's next sync (a restart before it
# held nothing: the trainer wrote under the engine).
WEXD=$1 WEXCTL=$2 PRODUCER=$3 LIBWEX=$4
. "$(dirname "$0")/lib.sh"
J="$TMP/wexd.sock.leases"
mkdir -m 700 "$J" "$TMP/src"
chmod 700 "$TMP/src"
ro_bind "$TMP/src" "$J"
PY=/usr/bin/python3; [ -x $PY ] || PY=python3
command -v $PY >/dev/null || skip "python3 missing"
P= E=
cleanup_extra() { kill -9 $E 2>/dev/null; kill $P 2>/dev/null; wait $P $E 2>/dev/null; }
start_wexd
# unwritable_within WANT: status shows unwritable (1) or not (0) within 5 s
# (wexd looks every 200 ms: 5 s is plenty, not a threshold).
unwritable_within() {
	_i=0
	while :; do
		"$WEXCTL" status --json | tr -d ' \n' | grep -q '"unwritable":' && _u=1 || _u=0
		[ $_u = "$1" ] && return 0
		_i=$((_i+1)); [ $_i -lt 50 ] || return 1
		sleep 0.1
	done
}
unwritable_within 1 || fail "a read-only journal at start is not shown unwritable: $("$WEXCTL" status --json)"
view_engine
[ -z "$(ls "$J")" ] || fail "a record written in a read-only directory: $(ls -la "$J")"
mount -o remount,bind,rw "$J" || skip "cannot remount the bind mount read-write"
unwritable_within 0 ||
	fail "the journal made writable again is still shown unwritable: $("$WEXCTL" status --json | tr -d ' \n' | grep -o '"lease_journal":{[^}]*}')"
i=0; until [ "$(ls "$J" | wc -l)" = 1 ]; do
	i=$((i+1)); [ $i -lt 50 ] || fail "the engine's lease is not written down once the journal can be written: $(ls -la "$J"); wexd: $(tail -3 "$TMP/wexd.log")"
	sleep 0.1; done
# (A mount with a file open for writing cannot turn read-only: the
# engine leaves, its record goes with it.)
kill -9 $E; wait $E 2>/dev/null; E=
i=0; until [ -z "$(ls "$J")" ]; do
	i=$((i+1)); [ $i -lt 50 ] || fail "the engine's record stays after it left: $(ls -la "$J")"
	sleep 0.1; done
mount -o remount,bind,ro "$J" || skip "cannot remount the bind mount read-only"
unwritable_within 1 ||
	fail "the journal turned read-only under wexd is not shown unwritable: $("$WEXCTL" status --json | tr -d ' \n' | grep -o '"lease_journal":{[^}]*}')"
grep -q "lease journal $J cannot be written any more (Read-only file system)" "$TMP/wexd.log" ||
	fail "no warning when the journal turned read-only: $(tail -3 "$TMP/wexd.log")"
stop_wexd
[ "$WEXD_RC" = 0 ] || fail "wexd exit code $WEXD_RC"
echo "PASS: lease_journal.unwritable follows the directory while wexd runs"
