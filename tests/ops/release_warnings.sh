#!/bin/sh
# tests/ops/release_warnings.sh - the quickstart (examples/quickstart.sh) and
# the install steps in README build with -DCMAKE_BUILD_TYPE=Release (-O3),
# which CI's builds (RelWithDebInfo, Debug) do not: GCC's warnings that
# depend on the optimiser (-Wstringop-overflow, -Warray-bounds, ...) then
# showed in a new user's quickstart output (tests/gpu/emul_cuda.c: "writing
# 1 byte into a region of size 0") and failed a -DWEX_WERROR=ON Release
# build.  CTest test build_release_warnings: compiles the daemon, libwex,
# wexctl, the examples and the CUDA emulator with Release's flags, the
# project's warnings and -Werror (objects thrown away).
#
#   release_warnings.sh SOURCE_DIR CC "RELEASE_FLAGS" "INCLUDE_DIRS" [CUDA_INCLUDE_DIR [SYSTEMD]]
#
# CUDA_INCLUDE_DIR: where the build found cuda.h ("" for none); SYSTEMD 1:
# wexd is built with libsystemd (src/sdnotify.c's other half).
set -eu
SRC=$1 CC=$2 FLAGS=$3 INCS=$4 CUDA=${5:-} SYSTEMD=${6:-0}
cd "$SRC"
set -- -std=c11 -D_GNU_SOURCE -fPIC -fvisibility=hidden -Wall -Wextra -Wshadow \
	-Wno-unused-parameter -Wno-missing-field-initializers -Werror \
	-Isrc/include -Isrc -I. -Ivmm -Iipc
for d in $INCS; do [ "$d" = /usr/include ] || set -- "$@" -I"$d"; done
# (The sources the build compiles: the CUDA backends and the emulator
# where cuda.h was found, the stubs otherwise.)
files="src/*.c vmm/host.c vmm/backend.c ipc/*.c examples/*.c"
if [ -n "$CUDA" ]; then
	set -- "$@" -DWEX_HAVE_CUDA_BACKEND=1 -DWEX_HAVE_CUDA_HEADERS=1 -I"$CUDA"
	files="$files vmm/cudawrap.c vmm/cuda_copy.c vmm/cuda_vmm.c vmm/cuda_ipc.c"
	files="$files vmm/cuda_alloc.c vmm/cuda_staging.c tests/gpu/emul_cuda.c"
else
	files="$files vmm/cuda_stub.c"
fi
fail=0
n=0
for f in $files; do
	n=$((n + 1))
	# shellcheck disable=SC2086 # FLAGS holds several words
	if ! "$CC" $FLAGS "$@" -c "$f" -o /dev/null; then
		echo "FAIL: $f does not compile without warnings at: $CC $FLAGS"
		fail=1
	fi
done
if [ "$SYSTEMD" = 1 ]; then
	n=$((n + 1))
	# shellcheck disable=SC2086
	if ! "$CC" $FLAGS "$@" -DWEX_HAVE_SYSTEMD=1 -c src/sdnotify.c -o /dev/null; then
		echo "FAIL: src/sdnotify.c (WEX_HAVE_SYSTEMD) does not compile without warnings at: $CC $FLAGS"
		fail=1
	fi
fi
[ $fail -eq 0 ] || exit 1
echo "ok: $n files compile at $FLAGS with -Werror"
