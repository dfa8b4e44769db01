/* SPDX-License-Identifier: MIT */
/* sdnotify.c - readiness, watchdog and socket activation.  Notifications
 * are always sent by the protocol itself (a datagram to $NOTIFY_SOCKET),
 * without waiting: libsystemd's sd_notify blocks for as long as the
 * manager's queue is full, and wexd's loop must not.  Socket activation and
 * the watchdog interval go through libsystemd's sd-daemon where wexd is
 * built with it, else by the protocol too (fds from 3 named by LISTEN_PID
 * and LISTEN_FDS), which systemd documents as stable for exactly this use.
 * The unit files are installed either way, so a wexd built without
 * libsystemd-dev must still speak to them.  See sdnotify.h. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "sdnotify.h"

/* One datagram to $NOTIFY_SOCKET: a path, or an abstract name written with
 * a leading '@'.  Never waits: a manager whose queue is full gets nothing
 * (-EAGAIN).  Returns 1 sent, 0 not under systemd, or a negative errno. */
static int send_notify(const char *state)
{
	const char *e = getenv("NOTIFY_SOCKET");
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	size_t len;
	int fd, ret = 1;

	if (!e || !*e)
		return 0;
	len = strlen(e);
	if (e[0] != '/' && e[0] != '@')
		return -EAFNOSUPPORT;
	/* A path needs its NUL inside sun_path; an abstract name does not. */
	if (len > sizeof(sa.sun_path) - (e[0] == '/'))
		return -ENAMETOOLONG;
	memcpy(sa.sun_path, e, len);
	if (e[0] == '@')
		sa.sun_path[0] = '\0';
	fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0)
		return -errno;
	if (sendto(fd, state, strlen(state), MSG_NOSIGNAL | MSG_DONTWAIT, (struct sockaddr *)&sa,
		   (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len + (e[0] == '/'))) < 0)
		ret = -errno;
	close(fd);
	if (ret == -EWOULDBLOCK)
		ret = -EAGAIN;
	return ret;
}

/* Changes of state (READY=1, RELOADING=1, STOPPING=1) the manager's full
 * queue held back, oldest first; the manager needs each of them, in order,
 * whereas a later WATCHDOG=1 or STATUS= stands for a lost one. */
#define HELD_MAX 4
static char held[HELD_MAX][64];
static int nheld;
static int queue_full; /* the last send found the queue full (logged once) */

static int notify_result(int ret)
{
	if (ret == -EAGAIN && !queue_full)
		wex_warn("sd", "the service manager's notify socket is full: state changes wait, "
			 "status and watchdog pings are skipped, until it reads again");
	else if (ret > 0 && queue_full)
		wex_info("sd", "the service manager reads its notify socket again");
	if (ret == -EAGAIN || ret > 0)
		queue_full = ret == -EAGAIN;
	return ret;
}

int wex__sd_flush(void)
{
	while (nheld) {
		int ret = notify_result(send_notify(held[0]));

		if (ret == -EAGAIN)
			break;
		if (ret < 0)
			wex_warn("sd", "notify '%.16s': %s", held[0], strerror(-ret));
		memmove(held[0], held[1], (size_t)(--nheld) * sizeof(held[0]));
	}
	return nheld;
}

/* A change of state: sent after those held back, or held back itself. */
static int notify_state(const char *state)
{
	int ret = wex__sd_flush() ? -EAGAIN : notify_result(send_notify(state));

	if (ret != -EAGAIN)
		return ret;
	if (nheld == HELD_MAX) {
		wex_warn("sd", "notify '%.16s' dropped: the manager's queue has been full for %d "
			 "state changes", held[0], HELD_MAX);
		memmove(held[0], held[1], (size_t)(--nheld) * sizeof(held[0]));
	}
	snprintf(held[nheld++], sizeof(held[0]), "%s", state);
	return ret;
}

/* WATCHDOG=1, STATUS=: after those held back, else skipped. */
static int notify(const char *state)
{
	return wex__sd_flush() ? -EAGAIN : notify_result(send_notify(state));
}

/* The first passed fd (SD_LISTEN_FDS_START). */
#define LISTEN_FDS_START 3

#ifdef WEX_HAVE_SYSTEMD
#include <systemd/sd-daemon.h>

static uint64_t watchdog_usec(void)
{
	uint64_t usec = 0;

	if (sd_watchdog_enabled(0, &usec) <= 0)
		return 0;
	return usec;
}

/* unset_environment=1: children must not take the fds for theirs. */
static int listen_fds(void)
{
	return sd_listen_fds(1);
}

static int is_listener(int fd)
{
	return sd_is_socket_unix(fd, SOCK_SEQPACKET, 1, NULL, 0) > 0;
}

#else /* !WEX_HAVE_SYSTEMD: the protocol itself (sd_notify(3), sd_listen_fds(3)) */

/* A whole decimal number, or -1. */
static long long parse_num(const char *s)
{
	char *end;
	long long v;

	if (!s || *s < '0' || *s > '9')
		return -1;
	errno = 0;
	v = strtoll(s, &end, 10);
	return errno || *end ? -1 : v;
}

/* $WATCHDOG_USEC, when $WATCHDOG_PID (if set) is this process. */
static uint64_t watchdog_usec(void)
{
	long long usec = parse_num(getenv("WATCHDOG_USEC"));
	const char *pid = getenv("WATCHDOG_PID");

	if (usec <= 0 || (pid && parse_num(pid) != (long long)getpid()))
		return 0;
	return (uint64_t)usec;
}

/* The number of fds passed from LISTEN_FDS_START on, 0 when none is for
 * this process, or a negative errno; the variables go in every case. */
static int listen_fds(void)
{
	const char *pid = getenv("LISTEN_PID"), *fds = getenv("LISTEN_FDS");
	long long p = parse_num(pid), n = parse_num(fds);
	int ret = 0;

	if (!pid || !fds)
		goto out;
	if (p <= 0) {
		ret = -EINVAL;
		goto out;
	}
	if (p != (long long)getpid())
		goto out;
	if (n < 0 || n > INT_MAX - LISTEN_FDS_START) {
		ret = -EINVAL;
		goto out;
	}
	for (int i = 0; i < (int)n; i++) {
		if (fcntl(LISTEN_FDS_START + i, F_SETFD, FD_CLOEXEC) < 0) {
			ret = -errno;
			goto out;
		}
	}
	ret = (int)n;
out:
	unsetenv("LISTEN_PID");
	unsetenv("LISTEN_FDS");
	unsetenv("LISTEN_FDNAMES");
	return ret;
}

static int is_listener(int fd)
{
	struct stat st;
	int v;
	socklen_t len = sizeof(v);

	if (fstat(fd, &st) < 0 || !S_ISSOCK(st.st_mode))
		return 0;
	if (getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &v, &len) < 0 || v != AF_UNIX)
		return 0;
	len = sizeof(v);
	if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &v, &len) < 0 || v != SOCK_SEQPACKET)
		return 0;
	len = sizeof(v);
	return getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &v, &len) == 0 && v;
}

#endif

int wex__sd_ready(void)
{
	return notify_state("READY=1");
}

/* MONOTONIC_USEC= must come with RELOADING=1 (systemd.service(5)): a manager
 * running the unit as Type=notify-reload (systemd 253) ignores a
 * RELOADING=1 without a timestamp later than its own SIGHUP, and the
 * reload hangs until TimeoutStartSec=. */
int wex__sd_reloading(void)
{
	struct timespec ts;
	char msg[64];

	clock_gettime(CLOCK_MONOTONIC, &ts);
	snprintf(msg, sizeof(msg), "RELOADING=1\nMONOTONIC_USEC=%" PRIu64,
		 (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u);
	return notify_state(msg);
}

int wex__sd_watchdog(void)
{
	return notify("WATCHDOG=1");
}

uint64_t wex__sd_watchdog_usec(void)
{
	return watchdog_usec();
}

int wex__sd_stopping(void)
{
	return notify_state("STOPPING=1");
}

int wex__sd_status(const char *text)
{
	size_t len = strlen(text ? text : "") + sizeof("STATUS=");
	char *msg = malloc(len);
	int ret;

	if (!msg)
		return -ENOMEM;
	snprintf(msg, len, "STATUS=%s", text ? text : "");
	ret = notify(msg);
	free(msg);
	return ret;
}

int wex__sd_listen_fd(void)
{
	int n, fd = -1;

	n = listen_fds();
	if (n < 0) {
		wex_error("sd", "cannot read the sockets systemd passed: %s", strerror(-n));
		return n == -1 ? -EINVAL : n;
	}
	for (int i = 0; i < n; i++) {
		int cur = LISTEN_FDS_START + i;

		/* listening: wexd.socket passes the listening socket, not
		 * Accept=yes connections. */
		if (fd < 0 && is_listener(cur)) {
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
