#!/bin/sh
# tests/deps.sh - installs the Debian packages wex builds and tests with,
# if any is missing.  Sourced by tests/run.sh and examples/quickstart.sh.
# WEX_PACKAGES, what the build needs (all the quickstart installs): cmake,
# gcc, make, pkg-config, liburing-dev, libjansson-dev, libsystemd-dev.
# tests/run.sh adds WEX_TEST_PACKAGES: prometheus (promtool), systemd
# (systemd-analyze, systemd-socket-activate), passwd (useradd), procps,
# python3 and Debian's CPU PyTorch for the Python glue's tests
# (tests/python), strace (bench_host_sync_term_after_error holds a wait
# open with it).  Not for the quickstart: Debian's prometheus package also
# starts a Prometheus server (port 9090) on a machine run by systemd.
WEX_PACKAGES="cmake gcc make pkg-config liburing-dev libjansson-dev libsystemd-dev"
WEX_TEST_PACKAGES="prometheus systemd passwd procps python3 python3-torch strace"

wex_install_deps() {
	missing=""
	for p in $WEX_PACKAGES; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
			missing="$missing $p"
	done
	[ -z "$missing" ] && return 0
	echo "wex: installing missing Debian packages:$missing"
	if [ "$(id -u)" != 0 ]; then
		if command -v sudo >/dev/null 2>&1; then SUDO=sudo; else
			echo "wex: not root and no sudo: install these packages:$missing" >&2
			return 1
		fi
	fi
	export DEBIAN_FRONTEND=noninteractive
	${SUDO:-} apt-get update -qq || return 1
	${SUDO:-} apt-get install -y -qq --no-install-recommends $missing >/dev/null || return 1
}
