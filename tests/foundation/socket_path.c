/* SPDX-License-Identifier: MIT */
/*
 * socket_path - proves that wexd replaces only a stale socket at its
 * socket path, never another file: started with --socket naming a
 * regular file (a typo in a unit file or a configuration, under root),
 * wexd refuses to start, names the path, and the file keeps its bytes;
 * a socket file left by a dead daemon is still replaced (wexd starts and
 * answers there).
 *
 * Found by review: connect() to a path that is not a socket fails with
 * ECONNREFUSED, which wexd took for a stale socket, and it unlinked the
 * file before binding its own socket in its place.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "helpers.h"

static const char data[] = "precious bytes\n";

/* Runs wexd --socket path: 1 once it says ready (then it is stopped), 0
 * when it exits first (its status in *st). */
static int run(const char *path, int *st)
{
	const char *bin = getenv("WEXD_BIN");
	int pfd[2], ready = 0;
	struct pollfd p;
	char buf[8];
	pid_t pid;

	if (!bin || !*bin)
		T_SKIP("WEXD_BIN not set (run through ctest)");
	T_ASSERT(pipe2(pfd, O_CLOEXEC) == 0, "pipe");
	pid = t_fork();
	if (pid == 0) {
		char num[16];
		int w = dup(pfd[1]); /* without CLOEXEC: it must survive exec */

		snprintf(num, sizeof(num), "%d", w);
		setenv("WEXD_READY_FD", num, 1);
		unsetenv("WEX_SOCKET");
		execl(bin, bin, "--socket", path, "--io", "epoll", (char *)NULL);
		_exit(127);
	}
	close(pfd[1]);
	p = (struct pollfd){ .fd = pfd[0], .events = POLLIN };
	if (poll(&p, 1, 10000) > 0 && read(pfd[0], buf, sizeof(buf)) > 0)
		ready = 1;
	close(pfd[0]);
	if (ready)
		kill(pid, SIGTERM);
	*st = t_wait(pid);
	return ready;
}

int main(void)
{
	char dir[256], path[300], lp[320], buf[64];
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct stat sb;
	int fd, st;
	ssize_t n;

	snprintf(dir, sizeof(dir), "%s/wex-sockpath-XXXXXX",
		 getenv("TMPDIR") && *getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
	T_ASSERT(mkdtemp(dir), "mkdtemp: %s", strerror(errno));
	snprintf(path, sizeof(path), "%s/precious", dir);

	/* 1. A regular file where the socket should go. */
	fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	T_ASSERT(fd >= 0 && write(fd, data, sizeof(data) - 1) == (ssize_t)sizeof(data) - 1,
		 "write %s", path);
	close(fd);
	T_ASSERT(!run(path, &st), "wexd started on %s, a regular file's path", path);
	printf("wexd on a regular file's path: exit %d\n", st);
	T_ASSERT(st != 0, "wexd exited 0 without listening");
	T_ASSERT(lstat(path, &sb) == 0 && S_ISREG(sb.st_mode),
		 "%s is no longer the regular file it was", path);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	n = fd >= 0 ? read(fd, buf, sizeof(buf)) : -1;
	close(fd);
	T_ASSERT(n == (ssize_t)sizeof(data) - 1 && !memcmp(buf, data, (size_t)n),
		 "the file's bytes changed");
	unlink(path);

	/* 2. A socket file nobody listens on (a dead daemon's) is replaced. */
	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	T_ASSERT(strlen(path) < sizeof(sa.sun_path), "path too long for a socket");
	memcpy(sa.sun_path, path, strlen(path) + 1);
	T_ASSERT(fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0, "bind a stale socket");
	close(fd);
	T_ASSERT(run(path, &st), "wexd did not start over a stale socket (exit %d)", st);
	T_ASSERT(st == 0, "wexd exited %d on SIGTERM", st);
	unlink(path);
	/* The lease journal's directory, which wexd keeps. */
	snprintf(lp, sizeof(lp), "%s.leases", path);
	rmdir(lp);
	rmdir(dir);
	return T_EXIT_PASS;
}
