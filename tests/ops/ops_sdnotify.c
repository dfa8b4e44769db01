/* SPDX-License-Identifier: MIT */
/*
 * ops_sdnotify: proves the systemd wrappers speak the protocol: READY=1,
 * RELOADING=1 with MONOTONIC_USEC= (the clock now), WATCHDOG=1, STOPPING=1 and STATUS= arrive on $NOTIFY_SOCKET;
 * the watchdog interval is read from $WATCHDOG_USEC; a listening AF_UNIX
 * SOCK_SEQPACKET socket passed in LISTEN_FDS is returned (and a passed fd of
 * another kind is closed), only wrong kinds give -ENOTSOCK, not "none", and
 * the variables are cleared.  Without
 * $NOTIFY_SOCKET the calls are no-ops.  Skips when built without libsystemd.
 */
#include <errno.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>

#include "ops_test.h"
#include "sdnotify.h"

#ifndef WEX_HAVE_SYSTEMD
int main(void)
{
	CHECK(wex__sd_ready() == 0 && wex__sd_listen_fd() == -1);
	printf("SKIP: built without libsystemd (Debian package: libsystemd-dev); the "
	       "wrappers are no-ops\n");
	return T_EXIT_SKIP;
}
#else

static void expect_msg(int fd, const char *want)
{
	char buf[256];
	ssize_t n = recv(fd, buf, sizeof(buf) - 1, MSG_DONTWAIT);

	CHECK(n > 0);
	buf[n] = '\0';
	if (strcmp(buf, want)) {
		fprintf(stderr, "notify: got \"%s\", want \"%s\"\n", buf, want);
		exit(T_EXIT_FAIL);
	}
}

static int unix_socket(int type, const char *path, int do_listen)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd = socket(AF_UNIX, type, 0);

	CHECK(fd >= 0);
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	unlink(path);
	CHECK(bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0);
	if (do_listen)
		CHECK(listen(fd, 4) == 0);
	return fd;
}

/* Moves fd to exactly target (the LISTEN_FDS numbering starts at 3). */
static void move_fd(int fd, int target)
{
	int tmp = fcntl(fd, F_DUPFD, 100);

	CHECK(tmp >= 0);
	close(fd);
	CHECK(dup2(tmp, target) == target);
	close(tmp);
}

int main(void)
{
	char dir[] = "/tmp/wex-sd-XXXXXX", path[256], pid[32];
	struct timespec t0, t1;
	int nfd, lfd, sfd;

	CHECK(mkdtemp(dir) != NULL);

	/* Socket activation first, while fds 3 and 4 are ours to place. */
	snprintf(path, sizeof(path), "%s/listen.sock", dir);
	lfd = unix_socket(SOCK_SEQPACKET, path, 1);
	snprintf(path, sizeof(path), "%s/stream.sock", dir);
	sfd = unix_socket(SOCK_STREAM, path, 1);
	move_fd(lfd, 3);
	move_fd(sfd, 4);
	snprintf(pid, sizeof(pid), "%d", (int)getpid());
	setenv("LISTEN_PID", pid, 1);
	setenv("LISTEN_FDS", "2", 1);
	CHECK(wex__sd_listen_fd() == 3);
	CHECK(fcntl(4, F_GETFD) == -1 && errno == EBADF);
	CHECK(getenv("LISTEN_FDS") == NULL && getenv("LISTEN_PID") == NULL);
	/* Nothing passed now. */
	CHECK(wex__sd_listen_fd() == -1);
	/* Only a socket of the wrong kind: an error, not "none", and closed. */
	snprintf(path, sizeof(path), "%s/stream.sock", dir);
	sfd = unix_socket(SOCK_STREAM, path, 1);
	move_fd(sfd, 4);
	CHECK(dup2(4, 3) == 3);
	close(4);
	setenv("LISTEN_PID", pid, 1);
	setenv("LISTEN_FDS", "1", 1);
	CHECK(wex__sd_listen_fd() == -ENOTSOCK);
	CHECK(fcntl(3, F_GETFD) == -1 && errno == EBADF);
	/* Passed to another process (LISTEN_PID differs): not ours. */
	setenv("LISTEN_PID", "1", 1);
	setenv("LISTEN_FDS", "1", 1);
	CHECK(wex__sd_listen_fd() == -1);

	/* Outside systemd: no-ops. */
	unsetenv("NOTIFY_SOCKET");
	CHECK(wex__sd_ready() == 0);
	unsetenv("WATCHDOG_USEC");
	CHECK(wex__sd_watchdog_usec() == 0);

	snprintf(path, sizeof(path), "%s/notify.sock", dir);
	nfd = unix_socket(SOCK_DGRAM, path, 0);
	setenv("NOTIFY_SOCKET", path, 1);
	CHECK(wex__sd_ready() > 0);
	expect_msg(nfd, "READY=1");
	/* RELOADING=1 carries MONOTONIC_USEC= (CLOCK_MONOTONIC, now). */
	clock_gettime(CLOCK_MONOTONIC, &t0);
	CHECK(wex__sd_reloading() > 0);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	{
		char buf[256];
		ssize_t n = recv(nfd, buf, sizeof(buf) - 1, MSG_DONTWAIT);
		unsigned long long us;
		int end = 0;

		CHECK(n > 0);
		buf[n] = '\0';
		if (sscanf(buf, "RELOADING=1\nMONOTONIC_USEC=%llu%n", &us, &end) != 1 || buf[end]) {
			fprintf(stderr, "notify: got \"%s\", want RELOADING=1 and MONOTONIC_USEC=\n", buf);
			exit(T_EXIT_FAIL);
		}
		CHECK(us >= (unsigned long long)t0.tv_sec * 1000000 + t0.tv_nsec / 1000);
		CHECK(us <= (unsigned long long)t1.tv_sec * 1000000 + t1.tv_nsec / 1000);
	}
	CHECK(wex__sd_watchdog() > 0);
	expect_msg(nfd, "WATCHDOG=1");
	CHECK(wex__sd_status("3 clients, 2 models") > 0);
	expect_msg(nfd, "STATUS=3 clients, 2 models");
	CHECK(wex__sd_stopping() > 0);
	expect_msg(nfd, "STOPPING=1");

	setenv("WATCHDOG_USEC", "2000000", 1);
	setenv("WATCHDOG_PID", pid, 1);
	CHECK(wex__sd_watchdog_usec() == 2000000);
	setenv("WATCHDOG_PID", "1", 1);
	CHECK(wex__sd_watchdog_usec() == 0);

	close(nfd);
	unlink(path);
	snprintf(path, sizeof(path), "%s/listen.sock", dir);
	unlink(path);
	snprintf(path, sizeof(path), "%s/stream.sock", dir);
	unlink(path);
	rmdir(dir);
	printf("PASS\n");
	return T_EXIT_PASS;
}
#endif
