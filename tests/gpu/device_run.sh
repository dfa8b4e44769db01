#!/bin/sh
# tests/gpu/device_run.sh - every GPU check of the CUDA backend in one go,
# for the lent GPU machine (../shared/gpu/README.md), which has CUDA,
# PyTorch and compute-sanitizer but no liburing/jansson: those come from
# .deps (prepared on the development machine by ../shared/gpu/prepare-deps.sh
# and carried along).  From the repository root:
#
#   tests/gpu/device_run.sh [OUTDIR]        (default $OUT, else /tmp/wex-gpu-out)
#
# Steps, in this order (the most wanted results first), each logged to
# OUTDIR/logs/<step>.log (packed into OUTDIR/logs.tar.gz when the call
# ends) and summed up in OUTDIR/summary.txt (which starts with the machine:
# GPU, driver, kernel, python3 and torch):
#   build     Release build against .deps (Ninja where there is one)
#   gpu       ctest -L gpu but the PyTorch checks (cuda_facts, the CUDA
#             tests, gpu_sync_smoke, host_staging_smoke,
#             released_check_smoke); cuda_facts' JSON goes to
#             OUTDIR/cuda_facts.json, the smoke benchmarks' JSON lines
#             to summary.txt, ctest's whole output to logs/gpu-ctest.log
#   bench     WEX_BENCH_GB=${WEX_BENCH_GB:-16} gpu_sync with the PyTorch
#             baselines; its JSON line goes to OUTDIR/gpu_sync.json
#   torch     the PyTorch checks (torch_mempool, torch_expandable, then
#             torch_fsdp)
#   staging   WEX_STAGING_GB=${WEX_STAGING_GB:-4} host_staging (pinned
#             against pageable host staging through wexd); its JSON line
#             goes to OUTDIR/host_staging.json
#   memcheck  compute-sanitizer --tool memcheck over the C gpu tests (with
#             WEX_UNDER_SANITIZER=1: no fd counts or fault probes, a tenth
#             of the leak cycles)
# The JSON files get a "machine" key (nvidia-smi's name, driver, memory).
# At most 5 files come back (the device tool returns 8).
# WEX_DEVICE_STEPS selects steps.  A task lent a GPU has 15 minutes of
# device time in all, the machine's start (a minute or more) included, and
# a machine stays warm only 30 s after a call; so the set is two calls, the
# second at once on the warm machine, whose build directory is still there:
#   WEX_DEVICE_STEPS="build gpu bench torch" tests/gpu/device_run.sh   (timeout_s 480)
#   WEX_DEVICE_STEPS="build staging memcheck" WEX_DEVICE_BUDGET_S=200 tests/gpu/device_run.sh   (timeout_s 240)
# Time: the call keeps within WEX_DEVICE_BUDGET_S (440) seconds.  Every
# step runs under `timeout` in a process group of its own (killed whole
# afterwards, so nothing it left holds GPU memory for the next step), for
# WEX_STEP_TIMEOUT s where set, else its own default (build 120, gpu 180,
# bench 150, torch 200, staging 60, memcheck what is left), never past the
# budget; a step with under 30 s left is not run and says so.  ctest runs
# with --stop-time at the step's end, so a slow test is reported as a
# timeout and the step still prints its summary; gpu_sync and memcheck
# divide what is left themselves.  summary.txt is written as steps start
# and end: a call cut short still says how far it got.
# Exits non-zero if any step failed or was not run.  A step whose tests
# skipped is not a pass: it fails (exit 3) where a GPU is visible
# (nvidia-smi or /dev/nvidia*), else exits 77 ("no GPU"); the skip reasons
# are copied into its log and the summary.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUTDIR=${WEX_DEVICE_OUTDIR:-${1:-${OUT:-/tmp/wex-gpu-out}}}
mkdir -p "$OUTDIR" && OUTDIR=$(cd "$OUTDIR" && pwd) # steps cd into the build
STEPS=${WEX_DEVICE_STEPS:-build gpu bench torch staging memcheck}
BUDGET=${WEX_DEVICE_BUDGET_S:-440}
B=${WEX_DEVICE_BUILD:-/tmp/wex-gpu-build}
DEPS="$ROOT/.deps/root/usr"
SUM="$OUTDIR/summary.txt"
# The steps' logs, packed into OUTDIR/logs.tar.gz when the call ends (the
# device tool brings back at most 8 files).
LOGDIR="$OUTDIR/logs"
mkdir -p "$LOGDIR"
export LD_LIBRARY_PATH="$DEPS/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# Python's output as it happens (a killed step keeps what was printed).
export PYTHONUNBUFFERED=1

# Seconds left to the step (WEX_STEP_END, set by step() below).
left() {
	echo $((${WEX_STEP_END:-$(($(date +%s) + 270))} - $(date +%s)))
}

have_gpu() {
	nvidia-smi -L 2>/dev/null | grep -q '^GPU' || ls /dev/nvidia[0-9]* >/dev/null 2>&1
}

build() {
	gen=
	# A build directory configured from another source directory (the
	# tree copied to another path between two calls on the warm machine)
	# makes cmake refuse its cache and the call build nothing: start anew.
	if [ -f "$B/CMakeCache.txt" ] &&
		! grep -qxF "CMAKE_HOME_DIRECTORY:INTERNAL=$ROOT" "$B/CMakeCache.txt"; then
		echo "build: $B was configured for $(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$B/CMakeCache.txt"), not $ROOT: removed"
		rm -rf "$B"
	fi
	# The GPU machine has ninja but maybe no make; an existing build
	# directory keeps its generator.
	[ ! -f "$B/CMakeCache.txt" ] && command -v ninja >/dev/null 2>&1 && gen="-G Ninja"
	[ -f "$DEPS/include/liburing.h" ] ||
		echo "build: no $DEPS/include/liburing.h: was .deps carried? (../shared/gpu/prepare-deps.sh here, carry .deps)"
	# The torch checks run with the python3 this call chose (the one
	# gpu_sync's torch baseline and summary.txt's header use), also in a
	# build directory configured earlier with another.
	cmake -S "$ROOT" -B "$B" $gen -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$DEPS" \
		${WEX_PY:+-DWEX_TORCH_PYTHON="$WEX_PY"} || return 1
	# Without cuda.h the gpu tests would not exist and ctest would find
	# nothing to run: not a result.
	grep -q '^CUDA_DRIVER_INCLUDE_DIR:PATH=/' "$B/CMakeCache.txt" || {
		echo "build: cuda.h not found (CUDA_HOME, /usr/local/cuda/include): no CUDA backend, no gpu tests"
		return 1
	}
	# A cuda.h older than 13.0 is found but not used (CMake says so).
	grep -rqs 'cudawrap\.c' "$B/build.ninja" "$B/CMakeFiles" || {
		echo "build: the CUDA backends are off (cuda.h older than CUDA 13.0?): no gpu tests"
		return 1
	}
	cmake --build "$B" -j "$(nproc)"
}

# ctest in the build with the step's stop time; then the reasons of the
# tests that skipped (ctest prints no output for them).  On a machine with
# a GPU a skipped test is not a result: it fails the step, so a summary
# never reads as a pass when the driver, a device or PyTorch's CUDA was
# not found; without a GPU the step says "skipped" (77).
run_ctest() {
	# A time of day (ctest takes one in the past as tomorrow's): at
	# least 10 s ahead.
	secs=$(($(left) - 5))
	[ "$secs" -lt 10 ] && secs=10
	stop=$(date -d "@$(($(date +%s) + secs))" '+%H:%M:%S')
	(cd "$B" && ctest --no-tests=error --output-on-failure --stop-time "$stop" "$@")
	rc=$?
	# Past the stop time ctest starts no more tests and lists none of
	# them (and may exit 0): name them, and fail the step.
	if grep -q 'stop time has been passed' "$LOGDIR/$STEP.log"; then
		ran=$(sed -n 's/^ *[0-9]*\/[0-9]* *Test *#[0-9]*: \([^ ]*\) .*/\1/p' "$LOGDIR/$STEP.log")
		echo "== stop time reached; not run: $( (cd "$B" && ctest -N "$@") |
			sed -n 's/^ *Test *#[0-9]*: //p' | grep -vxF "${ran:-.}" | tr '\n' ' ')"
		[ $rc -eq 0 ] && rc=8
	fi
	# ctest's own word for a skip (exit 77), in this step's log.
	grep -q '\*\*\*Skipped' "$LOGDIR/$STEP.log" || return $rc
	echo "== skip reasons:"
	grep -hE '^(SKIP: |torch_check .*: skipped: )' "$B/Testing/Temporary/LastTest.log" | sort | uniq -c
	[ $rc -ne 0 ] && return $rc
	if have_gpu; then
		echo "== tests skipped on a machine with a GPU: counted as a failure"
		return 3
	fi
	echo "== no GPU here: tests skipped"
	return 77
}

gpu() {
	export WEX_FACTS_OUT="$OUTDIR/cuda_facts.json"
	run_ctest -L gpu -E '^torch_'
}

torch() {
	# One after the other: side by side, one's allocations would move the
	# free device memory the others check around their remaps.  Three
	# checks of at most 60 s each (WEX_TORCH_CHECK_S) fit the step's 200 s.
	export WEX_TORCH_CHECK_S="${WEX_TORCH_CHECK_S:-60}"
	run_ctest -R '^torch_'
}

bench() {
	# gpu_sync keeps within WEX_BENCH_BUDGET_S (its torch baseline is cut
	# short), so that it prints its JSON line before the step ends.  Its
	# status is the step's (77: no GPU); its last line is JSON either way.
	# The torch baseline is half the point: missing, it fails the step.
	(cd "$B" && WEX_SRC="$ROOT" WEX_BENCH_GB=${WEX_BENCH_GB:-16} WEX_BENCH_TORCH_REQUIRED=1 \
		WEX_BENCH_BUDGET_S=$(($(left) - 15)) ./gpu_sync)
}

staging() {
	# host_staging too keeps within WEX_BENCH_BUDGET_S (its run is killed
	# past it) and its last line is JSON either way (77: no GPU).
	(cd "$B" && WEXD_BIN="$B/wexd" WEX_BENCH_GB=${WEX_STAGING_GB:-4} \
		WEX_BENCH_BUDGET_S=$(($(left) - 15)) ./host_staging)
}

# Runs "$@" under timeout $1 in a process group of its own, and kills
# whatever of that group is left afterwards.
grouped() {
	secs=$1
	shift
	timeout -k 5 "$secs" "$@" &
	gpid=$!
	wait $gpid
	grc=$?
	kill -KILL "-$gpid" 2>/dev/null
	return $grc
}

memcheck() {
	# The C tests fork and exec wexd and producer children: follow them.
	# wex makes failing driver calls on purpose (a pointer query on host
	# memory, fabric handles where there is no IMEX, refusals the tests
	# check): only memory errors count, not API errors.
	command -v compute-sanitizer >/dev/null || PATH=/usr/local/cuda/bin:$PATH
	command -v compute-sanitizer >/dev/null || { echo "memcheck: no compute-sanitizer"; return 1; }
	case $(uname -r) in 4.4.0*) echo "memcheck: SKIP: gVisor kernel, compute-sanitizer refuses it"; return 77 ;; esac
	have_gpu || { echo "memcheck: SKIP: no GPU"; return 77; }
	# The tests leave out their fd counts and fault probes and run a
	# tenth of their leak cycles (gpu_util.h under_sanitizer()).
	export WEX_UNDER_SANITIZER=1
	rc=0
	# Cheapest first, cuda_vmm (1000-cycle leak checks) last: a test cut
	# short by the step's time costs the fewest results.
	set -- cuda_facts cuda_copy cuda_ipc cuda_staging cuda_remap cuda_e2e cuda_near cuda_order cuda_chunks cuda_vmm
	while [ $# -gt 0 ]; do
		t=$1
		shift
		secs=$(left)
		if [ "$secs" -lt 20 ]; then
			echo "== memcheck: not run for lack of time: $t $*"
			rc=1
			break
		fi
		[ "$secs" -gt 150 ] && secs=150
		echo "== memcheck $t (up to $secs s)"
		(cd "$B" && export WEXD_BIN="$B/wexd" WEXCTL_BIN="$B/wexctl" WEX_SRC="$ROOT" &&
			grouped "$secs" compute-sanitizer --tool memcheck --report-api-errors no \
			--target-processes all --error-exitcode 99 "./$t")
		trc=$?
		case $trc in
		0) echo "== $t: ok" ;;
		77) echo "== $t: skipped (not a pass)"; rc=1 ;;
		99) echo "== $t: MEMORY ERRORS (exit 99)"; rc=1 ;;
		124 | 137) echo "== $t: killed after $secs s"; rc=1 ;;
		*) echo "== $t: exit $trc"; rc=1 ;;
		esac
	done
	return $rc
}

# One step, run by step() below in a process of its own.
if [ "${1:-}" = "--run-step" ]; then
	STEP=$2
	case $2 in build | gpu | torch | staging | bench | memcheck) "$2"; exit $? ;; esac
	echo "unknown step $2"
	exit 2
fi

T0=$(date +%s)
END=$((T0 + BUDGET))
: >"$SUM"
status=0
skipped=

note() { echo "$*" | tee -a "$SUM"; }

# The step's own limit: WEX_STEP_TIMEOUT, else its default (memcheck
# takes what the others left).
step_limit() {
	if [ -n "${WEX_STEP_TIMEOUT:-}" ]; then
		echo "$WEX_STEP_TIMEOUT"
	else
		case $1 in
		build) echo 120 ;;
		gpu) echo 180 ;;
		bench) echo 150 ;;
		torch) echo 200 ;;
		staging) echo 60 ;;
		*) echo 600 ;;
		esac
	fi
}

# Packs the steps' logs into OUTDIR/logs.tar.gz (also when the call is
# cut short by a signal).
pack_logs() {
	[ -d "$LOGDIR" ] || return 0
	tar czf "$OUTDIR/logs.tar.gz" -C "$OUTDIR" logs && rm -rf "$LOGDIR"
}
# (kill -SIG -PGID, no "--": dash's kill takes none and would kill nothing.)
# A call cut short takes its running step down too (it would hold the GPU
# into the next call on the warm machine).
trap '[ -n "${spid:-}" ] && kill -KILL "-$spid" 2>/dev/null &&
	note "${name:-?}: KILLED: the call got a signal $(($(date +%s) - T0)) s in (its timeout_s?)";
	pack_logs; exit 143' TERM INT
trap pack_logs EXIT

# Runs step `name` under timeout, never past the call's budget, in its own
# process group (timeout signals the whole group: ctest, the tests, their
# wexd and children; what survives is killed after).
step() {
	name=$1
	now=$(date +%s)
	lim=$(step_limit "$name")
	[ $((END - now)) -lt "$lim" ] && lim=$((END - now))
	if [ "$lim" -lt 30 ]; then
		note "$name: NOT RUN: $((END - now)) s left of the call's $BUDGET s (WEX_DEVICE_BUDGET_S)"
		status=1
		return 1
	fi
	note "$name: started at +$((now - T0)) s, up to $lim s"
	WEX_DEVICE_OUTDIR="$OUTDIR" WEX_STEP_END=$((now + lim - 10)) \
		timeout -k 10 "$lim" sh "$0" --run-step "$name" >"$LOGDIR/$name.log" 2>&1 &
	spid=$!
	wait $spid
	rc=$?
	kill -KILL "-$spid" 2>/dev/null
	spid=
	case $rc in 124 | 137) echo "== $name: killed after $lim s" >>"$LOGDIR/$name.log" ;; esac
	note "$name: exit $rc in $(($(date +%s) - now)) s$([ $rc -eq 77 ] && echo ' (skipped: not a pass)')$([ $rc -eq 124 ] || [ $rc -eq 137 ] && echo ' (KILLED: out of time)')"
	[ $rc -eq 0 ] || [ $rc -eq 77 ] || status=1
	[ $rc -eq 77 ] && skipped="$skipped $name"
	return $rc
}

# keep_json LOG NAME OUT RC: the last line of LOG that is a JSON object of
# bench NAME, to file OUT, with the machine added (a step that skipped,
# RC 77, may have none).
keep_json() {
	line=$(grep "^{\"bench\":\"$2\"" "$1" 2>/dev/null | tail -n 1)
	if [ -z "$line" ]; then
		[ "$4" -eq 77 ] || note "== no JSON line from $2 in $(basename "$1")"
		return 1
	fi
	printf '%s\n' "$line" >"$3"
	tag_json "$3"
	# Its "error", if any, for the recap.
	printf '%s\n' "$line" | sed -n "s/.*\"error\":\"\([^\"]*\)\".*/$2 error: \1/p" >>"$SUM"
}

# Adds "machine" to the JSON object in file $1 (one line).
tag_json() {
	[ -s "$1" ] || return 0
	m=$(printf '%s' "$MACHINE" | tr -d '"\\/&')
	sed -i "1s/^{/{\"machine\":\"$m\",/" "$1"
}

# The driver's tools where the image keeps them, if PATH leads elsewhere.
command -v nvidia-smi >/dev/null 2>&1 || [ ! -x /usr/local/nvidia/bin/nvidia-smi ] ||
	PATH="$PATH:/usr/local/nvidia/bin"
# The python3 with PyTorch: PATH's, else the image's venv (KINDS.md: a
# plain python3 there is /opt/torch/.venv/bin/python3, where PATH may not
# lead in a non-login shell).  Exported: gpu_sync's torch baseline runs
# "python3"; the build gives it to the torch checks (WEX_TORCH_PYTHON).
if ! timeout 30 python3 -c 'import torch' >/dev/null 2>&1; then
	for d in /opt/torch/.venv/bin /opt/conda/bin /usr/local/bin /usr/bin; do
		if [ -x "$d/python3" ] && timeout 30 "$d/python3" -c 'import torch' >/dev/null 2>&1; then
			PATH="$d:$PATH"
			export PATH
			break
		fi
	done
fi
# CMake and ninja may be the venv's pip packages alone.
for t in cmake ctest ninja; do
	command -v $t >/dev/null 2>&1 || [ ! -x /opt/torch/.venv/bin/$t ] ||
		PATH="$PATH:/opt/torch/.venv/bin"
done
export PATH
WEX_PY=$(command -v python3 || true)
export WEX_PY

# The machine, first, so that every figure can name it.
note "wex device run $(date -u +%FT%TZ) on $(hostname), steps: $STEPS; budget $BUDGET s"
MACHINE=$(timeout 30 nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -n 1)
note "gpu: ${MACHINE:-none (nvidia-smi: $(command -v nvidia-smi || echo 'not found'))}"
MACHINE=${MACHINE:-no GPU}
note "kernel $(uname -r), $(nproc) cpus, $(grep -m1 MemTotal /proc/meminfo | tr -s ' ')"
note "python3: $(command -v python3 || echo none): $(timeout 60 python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())' 2>&1 | tail -n 1)"
# wex.torch_util's tensors over device memory go through
# __cuda_array_interface__, which PyTorch reads with NumPy.
note "numpy: $(timeout 60 python3 -c 'import numpy; print(numpy.__version__)' 2>&1 | tail -n 1)"
# PyTorch's expandable segments try fabric handles first: with an IMEX
# channel they may come out fabric-only (imported through IMEX alone).
note "imex channels: $(ls /dev/nvidia-caps-imex-channels 2>/dev/null | tr '\n' ' ' || true)"
note "cmake: $(cmake --version 2>/dev/null | head -n 1); ninja: $(command -v ninja || echo none); compute-sanitizer: $(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || echo none)"

# Without the build step, only a build directory there already will do.
built=1
[ -f "$B/CMakeCache.txt" ] || built=0
for s in $STEPS; do
	case $s in
	build)
		if step build; then
			built=1
			# Which python3 the torch tests run with, where cuda.h was.
			grep -E '^(WEX_TORCH_PYTHON|WEX_PYTHON3|CUDA_DRIVER_INCLUDE_DIR|URING_LIBRARY|JANSSON_LIBRARY):' \
				"$B/CMakeCache.txt" >>"$SUM"
		else
			built=0
			grep -E 'error|Error|not found|NOTFOUND|^build: ' "$LOGDIR/build.log" | head -n 20 |
				sed 's/^/build log: /' >>"$SUM"
		fi ;;
	gpu | torch | bench | staging | memcheck)
		if [ $built -eq 0 ]; then
			note "$s: NOT RUN: the build failed or did not run"
			status=1
			continue
		fi
		step "$s"
		src=$?
		case $s in
		gpu | torch)
			grep -E "Test +#|tests passed|tests failed|^== |^ +[0-9]+ +(SKIP|torch_check)" "$LOGDIR/$s.log" >>"$SUM"
			# ctest shows only failed tests' output: all of it (the
			# smoke benchmarks' JSON lines too) is in LastTest.log.
			cp "$B/Testing/Temporary/LastTest.log" "$LOGDIR/$s-ctest.log" 2>/dev/null
			[ $s = gpu ] && grep -h '^{"bench":"' "$LOGDIR/$s-ctest.log" >>"$SUM" 2>/dev/null
			[ $s = gpu ] && tag_json "$OUTDIR/cuda_facts.json" && cat "$OUTDIR/cuda_facts.json" >>"$SUM" 2>/dev/null ;;
		bench)
			keep_json "$LOGDIR/bench.log" gpu_sync "$OUTDIR/gpu_sync.json" $src
			grep -E "^(gpu_sync|import|copy|torch|targets)" "$LOGDIR/bench.log" >>"$SUM"
			cat "$OUTDIR/gpu_sync.json" >>"$SUM" 2>/dev/null ;;
		staging)
			keep_json "$LOGDIR/staging.log" host_staging "$OUTDIR/host_staging.json" $src
			tail -n 5 "$LOGDIR/staging.log" >>"$SUM" ;;
		memcheck)
			grep -E "ERROR SUMMARY|^== " "$LOGDIR/memcheck.log" >>"$SUM"
			# The tool's other words (a target it could not follow, say).
			grep -E "^========= " "$LOGDIR/memcheck.log" | grep -v "ERROR SUMMARY" |
				head -n 8 >>"$SUM" ;;
		esac ;;
	*) note "unknown step $s"; status=1 ;;
	esac
done
# What went wrong, on stdout too (the device tool shows its last 12,000
# characters; the whole is in summary.txt): failed, timed-out, skipped and
# not-run tests with the reasons, the memcheck verdicts, the benchmarks'
# targets.
echo "== recap (all in summary.txt):"
grep -E '\*\*\*[A-Z]|tests passed|^== |^ +[0-9]+ +(SKIP|torch_check)|NOT RUN|KILLED|no JSON line|^build log: |^[a-z_]+ error: |^targets: |^torch CUDA IPC' "$SUM" |
	grep -v '^== memcheck .*(up to' | cut -c1-200 | tail -n 50
# A skipped step is no pass: 77 when nothing failed but steps skipped.
if [ $status -ne 0 ]; then
	note "device_run: FAILED or incomplete (see above) in $(($(date +%s) - T0)) s"
elif [ -n "$skipped" ]; then
	note "device_run: nothing failed, but skipped (no result):$skipped; $(($(date +%s) - T0)) s"
	status=77
else
	note "device_run: every step passed in $(($(date +%s) - T0)) s"
fi
exit $status
