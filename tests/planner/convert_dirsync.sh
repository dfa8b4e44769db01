#!/bin/sh
# convert_dirsync.sh - proves that `wexctl convert` (the real binary,
# $WEXCTL_BIN) syncs a new OUTDIR's own entry in its parent directory, as
# it syncs its files and their renames in OUTDIR: before, a crash after a
# convert had ended could lose the new directory and every file in it.
# Watched with strace: after mkdir(OUTDIR) the parent is opened and
# fsync'd; into an OUTDIR that already exists, the parent is not.  Skips
# (77) where strace is missing or may not trace.
# Needs: WEXCTL_BIN, PLANNER_CONVERT_BIN (the planner_convert helper).
set -u
: "${WEXCTL_BIN:?}" "${PLANNER_CONVERT_BIN:?}"
command -v strace >/dev/null || { echo "SKIP: strace missing"; exit 77; }
d=$(mktemp -d /tmp/wex-dirsync-XXXXXX) || exit 1
trap 'rm -rf "$d"' EXIT
strace -f -o /dev/null true 2>/dev/null || { echo "SKIP: strace may not trace here"; exit 77; }
"$PLANNER_CONVERT_BIN" gen "$d" || exit 1
mkdir "$d/parent"
# (LeakSanitizer cannot work under ptrace: off for the traced wexctl.)
conv() {
	ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" strace -f -qq -e trace=mkdir,mkdirat,openat,fsync -o "$d/trace" \
		"$WEXCTL_BIN" convert --config "$d/config.json" --from hf --to megatron:tp=2 \
		"$d/hf" "$d/parent/out" >/dev/null 2>"$d/err" ||
		{ echo "FAIL: convert: $(cat "$d/err")"; exit 1; }
}
# The fds opened on the parent directory after OUTDIR was made, and
# whether one of them was fsync'd (strace -f lines: PID call(...) = ret).
parent_synced() {
	awk -v out="\"$d/parent/out\"" -v par="\"$d/parent\"" '
		/mkdir(at)?\(/ && index($0, out) && / = 0$/ { made = 1; next }
		made && /openat\(/ && index($0, par ",") && /O_DIRECTORY/ { fd[$NF] = 1; next }
		made && /fsync\(/ { split($2, a, /[()]/); if (a[2] in fd && / = 0$/) ok = 1 }
		END { exit !ok }' "$d/trace"
}
conv
grep -Eq "mkdir(at)?\(.*\"$d/parent/out\".* = 0$" "$d/trace" ||
	{ echo "FAIL: no mkdir of OUTDIR traced: $(grep mkdir "$d/trace")"; exit 1; }
parent_synced || { echo "FAIL: a new OUTDIR's entry in its parent was not synced:"; \
	grep -E "mkdir|\"$d/parent\"|fsync" "$d/trace" | head -20; exit 1; }
[ -f "$d/parent/out/rank-0.safetensors" ] || { echo "FAIL: no rank-0.safetensors in OUTDIR"; exit 1; }
echo "a new OUTDIR's entry was synced in its parent"
# Into the same OUTDIR again: it exists, its parent is left alone.
conv
grep -Eq "openat\(.*\"$d/parent\", .*O_DIRECTORY" "$d/trace" &&
	{ echo "FAIL: an OUTDIR that existed had its parent synced again"; exit 1; }
echo "PASS: wexctl convert syncs a new OUTDIR's entry in its parent directory"
