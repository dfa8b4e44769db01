#!/bin/sh
# tests/gpu/device_run.sh - every GPU check of the CUDA backend in one go,
# for the lent GPU machine (../shared/gpu/README.md), which has CUDA,
# PyTorch and compute-sanitizer but no liburing/jansson: those come from
# .deps (prepared on the development machine by ../shared/gpu/prepare-deps.sh
# and carried along).  From the repository root:
#
#   tests/gpu/device_run.sh [OUTDIR]        (default $OUT, else /tmp/wex-gpu-out)
#
# Steps, each logged to OUTDIR/<step>.log and summed up in OUTDIR/summary.txt:
#   build     Release build against .deps
#   gpu       ctest -L gpu (the CUDA tests, gpu_sync_smoke, torch_mempool,
#             torch_expandable)
#   memcheck  compute-sanitizer --tool memcheck over the C gpu tests
#   bench     WEX_BENCH_GB=${WEX_BENCH_GB:-16} gpu_sync with the PyTorch
#             baselines; its JSON line goes to OUTDIR/gpu_sync.json
# WEX_DEVICE_STEPS="build gpu" runs a subset.  Exits non-zero if any step failed.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUTDIR=${1:-${OUT:-/tmp/wex-gpu-out}}
STEPS=${WEX_DEVICE_STEPS:-build gpu memcheck bench}
B=${WEX_DEVICE_BUILD:-/tmp/wex-gpu-build}
DEPS="$ROOT/.deps/root/usr"
mkdir -p "$OUTDIR"
SUM="$OUTDIR/summary.txt"
: >"$SUM"
status=0

note() { echo "$*" | tee -a "$SUM"; }
step() { # name command...
	name=$1; shift
	t0=$(date +%s)
	"$@" >"$OUTDIR/$name.log" 2>&1
	rc=$?
	note "$name: exit $rc in $(($(date +%s) - t0)) s"
	[ $rc -eq 0 ] || status=1
	return $rc
}

note "wex device run $(date -u +%FT%TZ) on $(hostname)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tee -a "$SUM"
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' 2>&1 | tee -a "$SUM"
export LD_LIBRARY_PATH="$DEPS/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

build() {
	cmake -S "$ROOT" -B "$B" -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$DEPS" &&
		cmake --build "$B" -j "$(nproc)"
}

gpu() {
	cd "$B" && ctest -L gpu --output-on-failure --timeout 600
}

memcheck() {
	# The C tests fork and exec wexd and producer children: follow them.
	rc=0
	for t in cuda_vmm cuda_remap cuda_copy cuda_ipc cuda_staging cuda_e2e cuda_chunks; do
		echo "== memcheck $t"
		(cd "$B" && WEXD_BIN="$B/wexd" WEXCTL_BIN="$B/wexctl" WEX_SRC="$ROOT" compute-sanitizer --tool memcheck \
			--target-processes all --error-exitcode 99 "./$t") || rc=1
	done
	return $rc
}

bench() {
	(cd "$B" && WEX_SRC="$ROOT" WEX_BENCH_GB=${WEX_BENCH_GB:-16} ./gpu_sync) || return 1
	tail -n 1 "$OUTDIR/bench.log" >"$OUTDIR/gpu_sync.json"
}

for s in $STEPS; do
	case $s in
	build) step build build || break ;;
	gpu) step gpu gpu; grep -E "tests passed|Passed|Failed|Skipped|\*\*\*" "$OUTDIR/gpu.log" >>"$SUM" ;;
	memcheck) step memcheck memcheck; grep -E "ERROR SUMMARY|== memcheck" "$OUTDIR/memcheck.log" >>"$SUM" ;;
	bench) step bench bench; tail -n 1 "$OUTDIR/bench.log" >>"$SUM" ;;
	*) note "unknown step $s"; status=1 ;;
	esac
done
exit $status
