/* SPDX-License-Identifier: MIT */
/*
 * ops_sdnotify: proves the systemd wrappers speak the protocol: READY=1,
 * RELOADING=1 with MONOTONIC_USEC= (the clock now), WATCHDOG=1, STOPPING=1
 * and STATUS= (long text whole) arrive on $NOTIFY_SOCKET, a path or an
 * abstract '@' name; the watchdog interval is read from $WATCHDOG_USEC
 * (for this process only: WATCHDOG_PID); a listening AF_UNIX SOCK_SEQPACKET
 * socket passed in LISTEN_FDS is returned (and a passed fd of another kind
 * is closed), only wrong kinds give -ENOTSOCK, not "none", and the
 * variables are cleared.  Without $NOTIFY_SOCKET the calls are no-ops.
 * Built with libsystemd (ops_sdnotify) and without it (ops_sdnotify_native,
 * or ops_sdnotify itself where libsystemd is absent): the same checks, and
 * in both a manager that reads nothing does not hold the caller: sends fail
 * at once with -EAGAIN, changes of state (READY=1, STOPPING=1) are held
 * back and sent in order by wex__sd_flush once it reads, pings skipped.
 */
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>

#include "ops_test.h"
#include "sdnotify.h"

static void expect_msg(int fd, const char *want)
{
	char buf[4096];
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
	/* A long STATUS= goes whole. */
	{
		char text[2000], want[2100];

		memset(text, 'x', sizeof(text) - 1);
		text[sizeof(text) - 1] = '\0';
		snprintf(want, sizeof(want), "STATUS=%s", text);
		CHECK(wex__sd_status(text) > 0);
		expect_msg(nfd, want);
	}

	/* An abstract socket, written with a leading '@'. */
	{
		struct sockaddr_un sa = { .sun_family = AF_UNIX };
		char name[64];
		int afd = socket(AF_UNIX, SOCK_DGRAM, 0);

		CHECK(afd >= 0);
		snprintf(name, sizeof(name), "@wex-sd-test-%d", (int)getpid());
		memcpy(sa.sun_path + 1, name + 1, strlen(name) - 1);
		CHECK(bind(afd, (struct sockaddr *)&sa,
			   (socklen_t)(offsetof(struct sockaddr_un, sun_path) + strlen(name))) == 0);
		setenv("NOTIFY_SOCKET", name, 1);
		CHECK(wex__sd_watchdog() > 0);
		expect_msg(afd, "WATCHDOG=1");
		close(afd);
		setenv("NOTIFY_SOCKET", path, 1);
	}
	/* A manager that reads nothing: its queue fills, and each send then
	 * fails at once instead of holding wexd's loop (libsystemd's would
	 * wait for good; a second each was once the bound here: 100 of them
	 * must not take 20 s).  Changes of state are held back, in order,
	 * until it reads again; a ping is skipped. */
	{
		struct timespec a, b;
		char scratch[16];
		int ret = 1;

		for (int i = 0; i < 100000 && ret > 0; i++)
			ret = wex__sd_watchdog();
		CHECK(ret == -EAGAIN);
		clock_gettime(CLOCK_MONOTONIC, &a);
		for (int i = 0; i < 100; i++) {
			CHECK(wex__sd_watchdog() == -EAGAIN);
			clock_gettime(CLOCK_MONOTONIC, &b);
			CHECK(b.tv_sec - a.tv_sec < 20);
		}
		CHECK(wex__sd_ready() == -EAGAIN);
		CHECK(wex__sd_stopping() == -EAGAIN);
		CHECK(wex__sd_status("held") == -EAGAIN);
		CHECK(wex__sd_flush() == 2);
		while (recv(nfd, scratch, sizeof(scratch), MSG_DONTWAIT) > 0)
			;
		CHECK(wex__sd_flush() == 0);
		expect_msg(nfd, "READY=1");
		expect_msg(nfd, "STOPPING=1");
		CHECK(recv(nfd, scratch, sizeof(scratch), MSG_DONTWAIT) < 0 && errno == EAGAIN);
		CHECK(wex__sd_watchdog() > 0);
		expect_msg(nfd, "WATCHDOG=1");
	}

	setenv("WATCHDOG_USEC", "2000000", 1);
	setenv("WATCHDOG_PID", pid, 1);
	CHECK(wex__sd_watchdog_usec() == 2000000);
	setenv("WATCHDOG_PID", "1", 1);
	CHECK(wex__sd_watchdog_usec() == 0);
	unsetenv("WATCHDOG_PID");
	CHECK(wex__sd_watchdog_usec() == 2000000);
	setenv("WATCHDOG_USEC", "0", 1);
	CHECK(wex__sd_watchdog_usec() == 0);

	close(nfd);
	unlink(path);
	snprintf(path, sizeof(path), "%s/listen.sock", dir);
	unlink(path);
	snprintf(path, sizeof(path), "%s/stream.sock", dir);
	unlink(path);
	rmdir(dir);
	printf("PASS (%s)\n",
#ifdef WEX_HAVE_SYSTEMD
	       "libsystemd"
#else
	       "wexd's own protocol code"
#endif
	);
	return T_EXIT_PASS;
}
