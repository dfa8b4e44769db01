#!/bin/sh
# tests/run.sh - installs what is missing, builds wex with warnings as
# errors, builds it again with AddressSanitizer + UndefinedBehaviorSanitizer,
# runs every CTest test in both builds and prints CTest's summaries.  Tests
# labelled `slow` or `once` run in the first build only: `slow`,
# planner_qwen2_convert (a full-size checkpoint written and converted three
# times, a minute under the sanitizers), whose code the sanitizer build
# runs on small models (planner_convert, planner_convert_fsdp); `once`,
# the tests of the Python glue's own logic, whose calls into libwex the
# sanitizer build runs through py_binding (tests/python/python.cmake).
# A test that needs a GPU or RDMA skips (exit 77, reason printed); a skip is
# never counted as a pass.
set -eu
ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$ROOT/tests/deps.sh"
WEX_PACKAGES="$WEX_PACKAGES $WEX_TEST_PACKAGES"
wex_install_deps
JOBS=${WEX_JOBS:-$(nproc)}
# Most tests wait (on wexd, on timeouts they prove, on child processes):
# CTest runs 4 per core, at most 16.  On the 2-core development machine
# that keeps both cores about 85% busy and takes the tests from 13 min to
# under 5; WEX_TEST_JOBS sets the number.
TEST_JOBS=${WEX_TEST_JOBS:-$((JOBS * 4 > 16 ? 16 : JOBS * 4))}
status=0

run_build() {
	name=$1; ctest_args=$2; shift 2
	dir="$ROOT/build-$name"
	echo "== $name build: $dir"
	rm -f "$dir.ctest.log" # a failed build's count is not an older run's
	cmake -S "$ROOT" -B "$dir" -DWEX_WERROR=ON "$@" >"$dir.configure.log" 2>&1 ||
		{ cat "$dir.configure.log"; return 1; }
	grep '^-- wex:' "$dir.configure.log" || true
	cmake --build "$dir" -j "$JOBS" >"$dir.build.log" 2>&1 ||
		{ grep -E 'error|warning' "$dir.build.log" | head -50; return 1; }
	echo "== $name tests"
	# Shown as it runs and kept: CTest counts a skip (exit 77) in its
	# "100% tests passed" and exits 0, so the verdict below counts them.
	rm -f "$dir/ctest.rc"
	# CTest's timings from an earlier run here would override the COST
	# order of tests/order.cmake (longest first: the CPU-bound tests all
	# at once, past copy_diff's timeout under ASan): every run takes the
	# order a clean clone's CI run takes.
	rm -f "$dir/Testing/Temporary/CTestCostData.txt"
	{ (cd "$dir" && ctest --output-on-failure --timeout 300 -j "$TEST_JOBS" $ctest_args); \
		echo $? >"$dir/ctest.rc"; } | tee "$dir.ctest.log"
	[ "$(cat "$dir/ctest.rc" 2>/dev/null)" = 0 ] || return 1
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
	run_build ci-asan "-LE slow|once" -DCMAKE_BUILD_TYPE=Debug -DWEX_SANITIZE=ON || status=1
# A skip is not a pass: the verdict says how many tests did not run.
skipped=$(cat "$ROOT/build-ci.ctest.log" "$ROOT/build-ci-asan.ctest.log" 2>/dev/null |
	grep -c ' (Skipped)$' || true)
if [ $status -eq 0 ] && [ "$skipped" -eq 0 ]; then
	echo "tests/run.sh: all builds and tests passed"
elif [ $status -eq 0 ]; then
	echo "tests/run.sh: all builds passed and every test that ran passed; $skipped tests skipped (not passed: they need a GPU or RDMA, see \"The following tests did not run\" above)"
else
	echo "tests/run.sh: FAILED ($skipped tests skipped)"
fi
exit $status
