#!/bin/sh
# tests/run.sh - installs what is missing, builds wex with warnings as
# errors, builds it again with AddressSanitizer + UndefinedBehaviorSanitizer,
# runs every CTest test in both builds and prints CTest's summaries.  Tests
# labelled `slow` (planner_qwen2_convert: a full-size checkpoint written and
# converted three times, a minute under the sanitizers) run in the first
# build only; the sanitizer build runs the same code on small models
# (planner_convert, planner_convert_fsdp).
# A test that needs a GPU or RDMA skips (exit 77, reason printed); a skip is
# never counted as a pass.
set -eu
ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$ROOT/tests/deps.sh"
WEX_PACKAGES="$WEX_PACKAGES $WEX_TEST_PACKAGES"
wex_install_deps
JOBS=${WEX_JOBS:-$(nproc)}
status=0

run_build() {
	name=$1; ctest_args=$2; shift 2
	dir="$ROOT/build-$name"
	echo "== $name build: $dir"
	cmake -S "$ROOT" -B "$dir" -DWEX_WERROR=ON "$@" >"$dir.configure.log" 2>&1 ||
		{ cat "$dir.configure.log"; return 1; }
	grep '^-- wex:' "$dir.configure.log" || true
	cmake --build "$dir" -j "$JOBS" >"$dir.build.log" 2>&1 ||
		{ grep -E 'error|warning' "$dir.build.log" | head -50; return 1; }
	echo "== $name tests"
	(cd "$dir" && ctest --output-on-failure --timeout 300 -j "$JOBS" $ctest_args) || return 1
}

# What tests that count fds or raise limits depend on, for reading a
# failure from another machine.
echo "== environment: $(uname -sr), $(nproc) cores, open files soft $(ulimit -Sn) hard $(ulimit -Hn)," \
	"$(ls /proc/$$/fd | wc -l) fds open, uid $(id -u)"
mkdir -p "$ROOT/build-ci" "$ROOT/build-ci-asan"
run_build ci "" -DCMAKE_BUILD_TYPE=RelWithDebInfo || status=1
# Benchmarks shrink their data under the sanitizers (WEX_BENCH_SMALL).
WEX_BENCH_SMALL=1 ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 \
	UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	run_build ci-asan "-LE slow" -DCMAKE_BUILD_TYPE=Debug -DWEX_SANITIZE=ON || status=1
if [ $status -eq 0 ]; then echo "tests/run.sh: all builds and tests passed"; else echo "tests/run.sh: FAILED"; fi
exit $status
