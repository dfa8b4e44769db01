#!/bin/sh
# tests/run_sh_verdict.sh SRC - tests/run.sh's last line never counts a
# skipped test as passed: CTest prints "100% tests passed" and exits 0
# when tests skip (exit 77), so run.sh must say how many skipped itself.
# run.sh runs in a scratch tree with cmake, ctest and dpkg-query replaced by fakes:
# each build's ctest reports one test passed and two skipped.
set -eu
SRC=$1
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
mkdir -p "$T/tests" "$T/bin"
cp "$SRC/tests/run.sh" "$SRC/tests/deps.sh" "$T/tests/"
cat >"$T/bin/dpkg-query" <<'S'
#!/bin/sh
printf 'install ok installed'
S
cat >"$T/bin/cmake" <<'S'
#!/bin/sh
exit 0
S
cat >"$T/bin/ctest" <<'S'
#!/bin/sh
cat <<'O'
1/3 Test #1: a ..........   Passed    0.01 sec
2/3 Test #2: gpu_b ......***Skipped   0.00 sec
3/3 Test #3: gpu_c ......***Skipped   0.00 sec

100% tests passed, 0 tests failed out of 3

The following tests did not run:
	  2 - gpu_b (Skipped)
	  3 - gpu_c (Skipped)
O
S
chmod +x "$T/bin/"*
out=$(PATH="$T/bin:$PATH" WEX_JOBS=1 sh "$T/tests/run.sh" 2>&1) || {
	echo "FAIL: run.sh exited non-zero:"; echo "$out"; exit 1; }
last=$(printf '%s\n' "$out" | tail -n 1)
echo "run.sh's last line: $last"
case $last in
*"4 tests skipped"*) echo "PASS: the skips are counted and said" ;;
*) echo "FAIL: the last line does not say that 4 tests skipped"; exit 1 ;;
esac
