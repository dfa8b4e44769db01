#!/bin/sh
# systemd_verify.sh UNIT_DIR WEXD_BIN
#
# Proves that systemd/wexd.service and systemd/wexd.socket load without
# errors or warnings under `systemd-analyze verify`.  The shipped service
# runs /usr/local/bin/wexd, which is not installed on a build machine, so
# the units are verified from a temporary copy whose ExecStart= and
# ExecReload= point at the wexd and wexctl just built; nothing else is
# changed.  Also checks that the
# service hides no device: no PrivateDevices=yes, DeviceAllow=, restrictive
# DevicePolicy= or ProtectClock=yes (which implies DeviceAllow=char-rtc r,
# turning the default policy into "listed devices only": /dev/nvidia* and
# /dev/infiniband/* would be denied), and that it starts after the user
# database (nss-user-lookup.target).  Exit 0 pass, 1 fail, 77 skip.
set -u
unit_dir=$1
# systemd wants an absolute path in ExecStart=.
wexd=$(readlink -f "$2")

if ! command -v systemd-analyze >/dev/null 2>&1; then
	echo "SKIP: systemd-analyze not found (Debian package: systemd)"
	exit 77
fi
if [ ! -x "$wexd" ]; then
	echo "FAIL: built wexd not found at $wexd"
	exit 1
fi
if ! grep -q '^ExecStart=/usr/local/bin/wexd ' "$unit_dir/wexd.service"; then
	echo "FAIL: wexd.service no longer starts /usr/local/bin/wexd; update this test"
	exit 1
fi
# The reload asks wexd through the wexctl built beside it.
wexctl=$(dirname "$wexd")/wexctl
if ! grep -q '^ExecReload=/usr/local/bin/wexctl ' "$unit_dir/wexd.service"; then
	echo "FAIL: wexd.service no longer reloads through /usr/local/bin/wexctl; update this test"
	exit 1
fi

if grep -Eq '^(PrivateDevices=(yes|true|1)|DeviceAllow=|DevicePolicy=(strict|closed)|ProtectClock=(yes|true|1))' \
	"$unit_dir/wexd.service"; then
	echo "FAIL: wexd.service restricts device access (GPUs, RDMA):"
	grep -En '^(PrivateDevices|DeviceAllow|DevicePolicy|ProtectClock)=' "$unit_dir/wexd.service"
	exit 1
fi

# wexd resolves the user and group names of its file ("models",
# socket_group) at start, and one it cannot resolve is exit 2, which
# RestartPreventExitStatus=2 never restarts: started at boot before an
# NSS provider (sssd, LDAP) is up, wexd stayed failed.  The unit must be
# ordered after the user database (systemd.special(7)).
if ! grep -Eq '^After=.*nss-user-lookup\.target' "$unit_dir/wexd.service"; then
	echo "FAIL: wexd.service is not ordered After=nss-user-lookup.target"
	exit 1
fi

tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
sed -e "s|^ExecStart=/usr/local/bin/wexd |ExecStart=$wexd |" \
	-e "s|^ExecReload=/usr/local/bin/wexctl |ExecReload=$wexctl |" "$unit_dir/wexd.service" >"$tmp/wexd.service"
cp "$unit_dir/wexd.socket" "$tmp/wexd.socket"

# --man=no: the units name no man pages to check.  Any output is a finding
# (verify prints warnings without failing), so both the status and the
# output must be clean.
out=$(cd "$tmp" && systemd-analyze verify --man=no "$tmp/wexd.socket" "$tmp/wexd.service" 2>&1)
rc=$?
if [ $rc -ne 0 ] || [ -n "$out" ]; then
	echo "FAIL: systemd-analyze verify (status $rc):"
	echo "$out"
	exit 1
fi
echo "PASS: wexd.service and wexd.socket verify cleanly (ExecStart=$wexd)"
exit 0
