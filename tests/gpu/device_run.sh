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
#   gpu       ctest -L gpu but the PyTorch checks (cuda_facts, the CUDA
#             tests, gpu_sync_smoke); cuda_facts' JSON goes to
#             OUTDIR/cuda_facts.json
#   torch     the PyTorch checks (torch_mempool, torch_expandable)
#   bench     WEX_BENCH_GB=${WEX_BENCH_GB:-16} gpu_sync with the PyTorch
#             baselines; its JSON line goes to OUTDIR/gpu_sync.json
#   staging   WEX_STAGING_GB=${WEX_STAGING_GB:-16} host_staging (pinned
#             against pageable host staging through wexd); its JSON line
#             goes to OUTDIR/host_staging.json
#   memcheck  compute-sanitizer --tool memcheck over the C gpu tests
# WEX_DEVICE_STEPS selects steps.  One call of the device tool may run 10
# minutes and the machine is not kept between calls, so the whole set is
# two calls, each with its own build:
#   WEX_DEVICE_STEPS="build gpu torch staging" WEX_STEP_TIMEOUT=240 tests/gpu/device_run.sh
#   WEX_DEVICE_STEPS="build bench memcheck" tests/gpu/device_run.sh
# Every step runs under `timeout` (WEX_STEP_TIMEOUT s, default 270), so a
# hang costs one step, not the call, and what was logged comes back.
# Exits non-zero if any step failed.  Where nvidia-smi sees a GPU, a test
# that skips fails the gpu or torch step (exit 3): it is not a result.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUTDIR=${WEX_DEVICE_OUTDIR:-${1:-${OUT:-/tmp/wex-gpu-out}}}
mkdir -p "$OUTDIR" && OUTDIR=$(cd "$OUTDIR" && pwd) # steps cd into the build
STEPS=${WEX_DEVICE_STEPS:-build gpu torch staging bench memcheck}
STEP_TIMEOUT=${WEX_STEP_TIMEOUT:-270}
B=${WEX_DEVICE_BUILD:-/tmp/wex-gpu-build}
DEPS="$ROOT/.deps/root/usr"
SUM="$OUTDIR/summary.txt"
export LD_LIBRARY_PATH="$DEPS/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

build() {
	cmake -S "$ROOT" -B "$B" -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$DEPS" &&
		cmake --build "$B" -j "$(nproc)"
}

# On a machine with a GPU a skipped test is not a result: it fails the
# step (the reason is in the step's log), so a summary never reads as a
# pass when the driver, a device or PyTorch's CUDA was not found.
no_skips_on_gpu() {
	nvidia-smi -L >/dev/null 2>&1 || return 0
	grep -q '\*\*\*Skipped' "$OUTDIR/$1.log" || return 0
	echo "== $1: tests skipped on a machine with a GPU: counted as a failure"
	return 1
}

gpu() {
	(cd "$B" && WEX_FACTS_OUT="$OUTDIR/cuda_facts.json" ctest -L gpu -E '^torch_' --output-on-failure)
	rc=$?
	no_skips_on_gpu gpu || [ $rc -ne 0 ] || rc=3
	return $rc
}

torch() {
	(cd "$B" && ctest -R '^torch_' --output-on-failure)
	rc=$?
	no_skips_on_gpu torch || [ $rc -ne 0 ] || rc=3
	return $rc
}

bench() {
	# gpu_sync keeps within WEX_BENCH_BUDGET_S (it cuts its torch baseline
	# short), so that it prints its JSON line before the step's timeout.
	# Its status is the step's (77: no GPU); the JSON is kept either way.
	(cd "$B" && WEX_SRC="$ROOT" WEX_BENCH_GB=${WEX_BENCH_GB:-16} \
		WEX_BENCH_BUDGET_S=$((STEP_TIMEOUT - 20)) ./gpu_sync)
	rc=$?
	line=$(tail -n 1 "$OUTDIR/bench.log")
	case $line in "{"*) printf "%s\n" "$line" >"$OUTDIR/gpu_sync.json" ;; esac
	return $rc
}

staging() {
	(cd "$B" && WEXD_BIN="$B/wexd" WEX_BENCH_GB=${WEX_STAGING_GB:-16} ./host_staging)
	rc=$?
	line=$(tail -n 1 "$OUTDIR/staging.log")
	case $line in "{"*) printf "%s\n" "$line" >"$OUTDIR/host_staging.json" ;; esac
	return $rc
}

memcheck() {
	# The C tests fork and exec wexd and producer children: follow them.
	# wex makes failing driver calls on purpose (a pointer query on host
	# memory, fabric handles where there is no IMEX, refusals the tests
	# check): only memory errors count, not API errors.
	command -v compute-sanitizer >/dev/null || PATH=/usr/local/cuda/bin:$PATH
	case $(uname -r) in 4.4.0*) echo "memcheck: SKIP: gVisor kernel, compute-sanitizer refuses it"; return 77 ;; esac
	rc=0
	for t in cuda_facts cuda_remap cuda_copy cuda_ipc cuda_staging cuda_e2e cuda_chunks cuda_vmm; do
		echo "== memcheck $t"
		(cd "$B" && WEXD_BIN="$B/wexd" WEXCTL_BIN="$B/wexctl" WEX_SRC="$ROOT" timeout --foreground -k 5 120 \
			compute-sanitizer --tool memcheck --report-api-errors no \
			--target-processes all --error-exitcode 99 "./$t") || { echo "== $t: exit $?"; rc=1; }
	done
	return $rc
}

# One step, run by step() below in a process of its own.
if [ "${1:-}" = "--run-step" ]; then
	case $2 in build | gpu | torch | staging | bench | memcheck) "$2"; exit $? ;; esac
	echo "unknown step $2"
	exit 2
fi

mkdir -p "$OUTDIR"
: >"$SUM"
status=0

note() { echo "$*" | tee -a "$SUM"; }

# Runs step `name` under timeout in its own process group (timeout signals
# the whole group: ctest, the tests, their wexd and children).
step() {
	name=$1
	t0=$(date +%s)
	WEX_DEVICE_OUTDIR="$OUTDIR" timeout -k 10 "$STEP_TIMEOUT" sh "$0" --run-step "$name" \
		>"$OUTDIR/$name.log" 2>&1
	rc=$?
	[ $rc -eq 124 ] && echo "== $name: killed after $STEP_TIMEOUT s" >>"$OUTDIR/$name.log"
	note "$name: exit $rc in $(($(date +%s) - t0)) s$([ $rc -eq 77 ] && echo ' (skipped: not a pass)')"
	[ $rc -eq 0 ] || [ $rc -eq 77 ] || status=1
	return $rc
}

note "wex device run $(date -u +%FT%TZ) on $(hostname), steps: $STEPS"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tee -a "$SUM"
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' 2>&1 | tee -a "$SUM"

for s in $STEPS; do
	case $s in
	build) step build || break ;;
	gpu) step gpu
	     grep -E "tests passed|Passed|Failed|Skipped|Timeout|\*\*\*|^== " "$OUTDIR/gpu.log" >>"$SUM"
	     cat "$OUTDIR/cuda_facts.json" >>"$SUM" 2>/dev/null ;;
	torch) step torch; grep -E "tests passed|Passed|Failed|Skipped|Timeout|\*\*\*|^== " "$OUTDIR/torch.log" >>"$SUM" ;;
	bench) step bench; tail -n 1 "$OUTDIR/bench.log" >>"$SUM" ;;
	staging) step staging; tail -n 4 "$OUTDIR/staging.log" >>"$SUM" ;;
	memcheck) step memcheck; grep -E "ERROR SUMMARY|== " "$OUTDIR/memcheck.log" >>"$SUM" ;;
	*) note "unknown step $s"; status=1 ;;
	esac
done
exit $status
