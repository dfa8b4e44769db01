#!/bin/sh
# tests/gpu/no_cuda_build.sh - wex builds and works without the CUDA
# toolkit's headers (issue 4, point 1).  CTest test build_without_cuda:
# configures the source tree again in BUILD_DIR with the directory where
# this build found cuda.h hidden from CMake (CMAKE_IGNORE_PATH, CUDA_HOME
# unset), then checks that
#   - CMake says it builds the host backend only, and the build (with
#     -Werror) of what is shipped (libwex, wexd, wexctl, the examples) and
#     of the tests below succeeds;
#   - libwex.so still exports the allocator entry points (stubs, so
#     CUDAPluggableAllocator finds them) and has no CUDA loader in it;
#   - in that build no_cuda_api (the CUDA calls' errors, a consumer of a
#     GPU producer, the host paths) and the quickstart smoke test pass,
#     neither skipped;
#   - a cuda.h older than CUDA 13.0 is not used either: CMake names its
#     version and builds the host backend only.
# Exits 77 (skip) when another cuda.h is visible to CMake as well.
#
#   no_cuda_build.sh SOURCE_DIR BUILD_DIR CUDA_INCLUDE_DIR BUILD_TYPE SANITIZE [PREFIX_PATH]
set -eu
SRC=$1 B=$2 HIDE=$3 TYPE=$4 SAN=$5 PREFIX=${6:-}
mkdir -p "$B"
unset CUDA_HOME

echo "== configure $B without $HIDE"
if ! cmake -S "$SRC" -B "$B" -DCMAKE_BUILD_TYPE="$TYPE" -DWEX_WERROR=ON -DWEX_SANITIZE="$SAN" \
	-DCMAKE_IGNORE_PATH="$HIDE" ${PREFIX:+-DCMAKE_PREFIX_PATH="$PREFIX"} >"$B.configure.log" 2>&1; then
	cat "$B.configure.log"
	echo "FAIL: configure without cuda.h"
	exit 1
fi
grep '^-- wex:' "$B.configure.log"
if ! grep -q 'wex: cuda.h not found: building with the host backend only' "$B.configure.log"; then
	if grep -q 'wex: CUDA headers in' "$B.configure.log"; then
		echo "SKIP: CMake finds another cuda.h besides $HIDE: $(grep 'wex: CUDA headers in' "$B.configure.log")"
		exit 77
	fi
	echo "FAIL: CMake does not say that it builds the host backend only"
	exit 1
fi

# What is shipped (library, daemon, CLI, examples) and the tests run
# below: the other tests' sources are the same with or without cuda.h
# (those that use CUDA, tests/gpu and the GPU benchmarks, are left out of
# such a build), and building them again took 2 minutes of this 2-core
# machine's CI run.
targets="--target wex wexd wexctl wex-producer wex-consumer no_cuda_api quickstart_smoke"
echo "== build (what is shipped, and the tests below)"
if ! cmake --build "$B" -j "$(nproc)" $targets >"$B.build.log" 2>&1; then
	grep -E 'error|warning' "$B.build.log" | head -40
	echo "FAIL: the build without cuda.h"
	exit 1
fi
syms=$(nm -D --defined-only "$B/libwex.so")
for s in wex_cuda_alloc wex_cuda_free wex_cuda_malloc wex_client_open wex_sync; do
	echo "$syms" | grep -q " T $s\$" || { echo "FAIL: libwex.so does not export $s"; exit 1; }
done
if grep -aq 'libcuda.so.1' "$B/libwex.so" "$B/wexd"; then
	echo "FAIL: a build without cuda.h still carries the CUDA loader"
	exit 1
fi
echo "libwex.so exports wex_cuda_alloc/wex_cuda_free/wex_cuda_malloc (stubs) and loads no CUDA driver"

echo "== tests of that build"
out=$(cd "$B" && ctest --output-on-failure --timeout 120 -R '^(no_cuda_api|quickstart_smoke_uring)$' 2>&1) || {
	echo "$out"
	echo "FAIL: tests of the build without cuda.h"
	exit 1
}
echo "$out"
echo "$out" | grep -q '100% tests passed, 0 tests failed out of 2' ||
	{ echo "FAIL: expected both tests to run"; exit 1; }
if echo "$out" | grep -q 'Skipped\|Not Run'; then
	echo "FAIL: a test of the build without cuda.h did not run"
	exit 1
fi
# A cuda.h older than the backends compile against (CUDA 12.x: the build
# failed at cudawrap.h on the 13.0 cuMemcpyBatchAsync type): the same host
# build, and CMake says why.
echo "== configure with a CUDA 12.4 cuda.h"
mkdir -p "$B-old/include"
printf '#define CUDA_VERSION 12040\n' >"$B-old/include/cuda.h"
if ! cmake -S "$SRC" -B "$B-old/build" -DCMAKE_BUILD_TYPE="$TYPE" -DWEX_WERROR=ON \
	-DWEX_SANITIZE="$SAN" -DCUDA_DRIVER_INCLUDE_DIR="$B-old/include" \
	${PREFIX:+-DCMAKE_PREFIX_PATH="$PREFIX"} >"$B-old.configure.log" 2>&1; then
	cat "$B-old.configure.log"
	echo "FAIL: configure with a CUDA 12.4 cuda.h"
	exit 1
fi
grep '^-- wex:' "$B-old.configure.log"
grep -q "wex: $B-old/include/cuda.h is CUDA 12.4; the CUDA backends need the headers of CUDA 13.0 or later .*: building with the host backend only" \
	"$B-old.configure.log" || { echo "FAIL: CMake does not say that a CUDA 12.4 cuda.h builds the host backend only"; exit 1; }
grep -rqs 'cudawrap\.c' "$B-old/build/CMakeFiles" "$B-old/build/build.ninja" &&
	{ echo "FAIL: the CUDA backends are built with a CUDA 12.4 cuda.h"; exit 1; }
echo "build_without_cuda: PASS"
