/* SPDX-License-Identifier: MIT */
/* sdnotify.c - thin wrappers over libsystemd's sd-daemon; no-ops without
 * it.  See sdnotify.h. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "sdnotify.h"

#ifdef WEX_HAVE_SYSTEMD
#include <systemd/sd-daemon.h>

static int notify(const char *state)
{
	/* unset_environment=0: the notify socket is needed for every later
	 * message (watchdog pings, STOPPING). */
	return sd_notify(0, state);
}

int wex__sd_ready(void)
{
	return notify("READY=1");
}

/* MONOTONIC_USEC= must come with RELOADING=1 (systemd.service(5)): a manager
 * running the unit as Type=notify-reload (systemd 253) ignores a
 * RELOADING=1 without a timestamp later than its own SIGHUP, and the
 * reload hangs until TimeoutStartSec=. */
int wex__sd_reloading(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return sd_notifyf(0, "RELOADING=1\nMONOTONIC_USEC=%" PRIu64,
			  (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u);
}

int wex__sd_watchdog(void)
{
	return notify("WATCHDOG=1");
}

uint64_t wex__sd_watchdog_usec(void)
{
	uint64_t usec = 0;

	if (sd_watchdog_enabled(0, &usec) <= 0)
		return 0;
	return usec;
}

int wex__sd_stopping(void)
{
	return notify("STOPPING=1");
}

int wex__sd_status(const char *text)
{
	return sd_notifyf(0, "STATUS=%s", text ? text : "");
}

int wex__sd_listen_fd(void)
{
	int n, fd = -1;

	n = sd_listen_fds(1);
	if (n < 0) {
		wex_error("sd", "cannot read the sockets systemd passed: %s", strerror(-n));
		return n == -1 ? -EINVAL : n;
	}
	for (int i = 0; i < n; i++) {
		int cur = SD_LISTEN_FDS_START + i;

		/* listening=1: wexd.socket passes the listening socket, not
		 * Accept=yes connections. */
		if (fd < 0 && sd_is_socket_unix(cur, SOCK_SEQPACKET, 1, NULL, 0) > 0) {
			fd = cur;
			continue;
		}
		wex_warn("sd", "ignoring passed fd %d: not a listening AF_UNIX SOCK_SEQPACKET "
			 "socket", cur);
		close(cur);
	}
	/* Passed sockets but none usable: binding our own would unlink the
	 * path systemd listens on, so the caller must stop instead. */
	if (n > 0 && fd < 0) {
		wex_error("sd", "systemd passed %d fds but no listening AF_UNIX SOCK_SEQPACKET "
			  "socket: check ListenSequentialPacket= in wexd.socket", n);
		return -ENOTSOCK;
	}
	return fd;
}

#else /* !WEX_HAVE_SYSTEMD */

int wex__sd_ready(void)
{
	return 0;
}

int wex__sd_reloading(void)
{
	return 0;
}

int wex__sd_watchdog(void)
{
	return 0;
}

uint64_t wex__sd_watchdog_usec(void)
{
	return 0;
}

int wex__sd_stopping(void)
{
	return 0;
}

int wex__sd_status(const char *text)
{
	return 0;
}

int wex__sd_listen_fd(void)
{
	return -1;
}

#endif
