/* SPDX-License-Identifier: MIT */
/* sock.c - AF_UNIX SOCK_SEQPACKET control socket with fd passing. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "ipc/sock.h"

static int fill_addr(struct sockaddr_un *sa, const char *path)
{
	memset(sa, 0, sizeof(*sa));
	sa->sun_family = AF_UNIX;
	if (!path || !*path || strlen(path) >= sizeof(sa->sun_path))
		return -ENAMETOOLONG;
	strcpy(sa->sun_path, path);
	return 0;
}

static int mkdir_parent(const char *path)
{
	char dir[PATH_MAX];
	char *slash;

	if (strlen(path) >= sizeof(dir))
		return -ENAMETOOLONG;
	strcpy(dir, path);
	slash = strrchr(dir, '/');
	if (!slash || slash == dir)
		return 0;
	*slash = '\0';
	for (char *p = dir + 1; *p; p++) {
		if (*p != '/')
			continue;
		*p = '\0';
		if (mkdir(dir, 0755) < 0 && errno != EEXIST)
			return -errno;
		*p = '/';
	}
	if (mkdir(dir, 0755) < 0 && errno != EEXIST)
		return -errno;
	return 0;
}

/*
 * A connect can succeed although the daemon is dead: the kernel tears a
 * killed process's io_uring down asynchronously, and until then a pending
 * multishot accept keeps its socket listening (a wexd restarted right after
 * a SIGKILL failed with EADDRINUSE, and a client reconnecting then waited
 * for a reply that never came).  SO_PEERCRED of a connected socket names
 * the process that called listen(): if it no longer exists, the listener
 * is stale.  (A peer in another pid namespace reads as pid 0: assumed
 * alive.)
 */
static int listener_gone(int fd)
{
	pid_t pid = 0;
	uid_t uid;
	gid_t gid;

	if (wex_sock_peercred(fd, &pid, &uid, &gid) < 0 || pid <= 0)
		return 0;
	return kill(pid, 0) < 0 && errno == ESRCH;
}

/* Removes a socket file left at path; anything else there (a regular file
 * named by a typo in the configuration) is left alone: -EEXIST.  connect()
 * answers ECONNREFUSED for both. */
static int unlink_stale(const char *path)
{
	struct stat st;

	if (lstat(path, &st) < 0)
		return errno == ENOENT ? 0 : -errno;
	if (!S_ISSOCK(st.st_mode))
		return -EEXIST;
	/* (Another user's, in a sticky directory such as /tmp: EPERM.) */
	return unlink(path) < 0 ? -errno : 0;
}

int wex_sock_lock(const char *path, pid_t *holder, const char **step)
{
	char lock[PATH_MAX], buf[32];
	const char *unused;
	struct stat st;
	ssize_t n, w;
	int fd, ret;

	if (!step)
		step = &unused;
	*holder = 0;
	*step = "path";
	if ((size_t)snprintf(lock, sizeof(lock), "%s.lock", path) >= sizeof(lock))
		return -ENAMETOOLONG;
	*step = "mkdir of its directory";
	ret = mkdir_parent(path);
	if (ret < 0)
		return ret;
	*step = "open its lock file";
	fd = open(lock, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0) {
		ret = -errno;
		/* Another user's file (sticky /tmp) reads as EACCES, as does
		 * a directory this user may not write: told apart. */
		if (ret == -EACCES && lstat(lock, &st) == 0 && st.st_uid != geteuid())
			ret = -EPERM;
		return ret;
	}
	/* A lock file anyone may write lets anyone hold wexd off. */
	*step = "check its lock file";
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid()) {
		close(fd);
		return -EPERM;
	}
	*step = "lock its lock file";
	if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
		ret = -errno;
		if (ret == -EWOULDBLOCK) {
			/* The holder writes its pid right after it locks: a
			 * holder caught before that reads as 0. */
			n = pread(fd, buf, sizeof(buf) - 1, 0);
			if (n > 0) {
				buf[n] = '\0';
				*holder = (pid_t)strtol(buf, NULL, 10);
			}
			*step = "check for a running daemon";
			ret = -EADDRINUSE;
		}
		close(fd);
		return ret;
	}
	n = snprintf(buf, sizeof(buf), "%d\n", (int)getpid());
	ret = ftruncate(fd, 0) < 0 ? -errno : 0;
	if (!ret && (w = pwrite(fd, buf, (size_t)n, 0)) != n)
		ret = w < 0 ? -errno : -EIO; /* (a short write sets no errno) */
	if (ret) {
		*step = "write its pid into its lock file";
		close(fd);
		return ret;
	}
	return fd;
}

int wex_sock_listen(const char *path, int mode, gid_t gid, const char **step)
{
	struct sockaddr_un sa;
	const char *unused;
	int fd, ret;

	if (!step)
		step = &unused;
	*step = "path";
	ret = fill_addr(&sa, path);
	if (ret < 0)
		return ret;
	*step = "mkdir of its directory";
	ret = mkdir_parent(path);
	if (ret < 0)
		return ret;
	*step = "socket";
	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	/* A socket file left by a dead daemon refuses connections; replace it,
	 * but never steal the path from a live one. */
	ret = 0;
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0) {
		if (!listener_gone(fd)) {
			close(fd);
			*step = "check for a running daemon";
			return -EADDRINUSE;
		}
		ret = unlink_stale(path);
	} else if (errno == EAGAIN) {
		/* A daemon listens there, its queue of connections full. */
		close(fd);
		*step = "check for a running daemon";
		return -EADDRINUSE;
	} else if (errno == ECONNREFUSED || errno == ENOENT) {
		/* (ENOENT: a dangling symlink, refused below as no socket.) */
		ret = unlink_stale(path);
	} else {
		/* EACCES: a socket file this user may not write, whether or
		 * not a daemon listens there; bind would say "in use". */
		ret = -errno;
		close(fd);
		*step = "connect to the socket file already there";
		return ret;
	}
	close(fd);
	if (ret == -EEXIST) {
		*step = "check for a stale socket";
		return ret;
	}
	if (ret < 0) {
		*step = "remove a stale socket";
		return ret;
	}
	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	*step = "bind";
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		ret = -errno;
		goto err_close;
	}
	*step = "chmod";
	if (chmod(path, (mode_t)mode) < 0) {
		ret = -errno;
		goto err_unlink;
	}
	*step = "chown";
	if (gid != (gid_t)-1 && chown(path, (uid_t)-1, gid) < 0) {
		ret = -errno;
		goto err_unlink;
	}
	*step = "listen";
	if (listen(fd, 128) < 0) {
		ret = -errno;
		goto err_unlink;
	}
	return fd;
err_unlink:
	unlink(path);
err_close:
	close(fd);
	return ret;
}

int wex_sock_new(void)
{
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);

	return fd < 0 ? -errno : fd;
}

int wex_sock_fd_readonly(int fd)
{
	char path[64];
	int fl = fcntl(fd, F_GETFL), ro;

	if (fl < 0)
		return -errno;
	if ((fl & O_ACCMODE) == O_RDONLY || fcntl(fd, F_GET_SEALS) < 0)
		return -EALREADY;
	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	ro = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
	return ro < 0 ? -errno : ro;
}

/* `intr`: a signal handled meanwhile ends the wait (-EINTR). */
static int connect_fd(int fd, const char *path, int wait_ms, int intr)
{
	struct sockaddr_un sa;
	struct timeval tv = { .tv_sec = wait_ms / 1000, .tv_usec = wait_ms % 1000 * 1000 };
	static const struct timeval forever;
	struct timespec t0;
	int ret, fl = 0;

	ret = fill_addr(&sa, path);
	if (ret < 0)
		return ret;
	/* (A UNIX socket connects at once or not at all: no EINPROGRESS.  A
	 * blocking connect waits for room in the queue up to SO_SNDTIMEO.) */
	if (wait_ms == 0 &&
	    ((fl = fcntl(fd, F_GETFL)) < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0))
		return -errno;
	if (wait_ms > 0 && setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) < 0)
		return -errno;
	/* A signal handled while connect waits for room in the queue ends
	 * it with EINTR (SA_RESTART or not, once SO_SNDTIMEO is set): tried
	 * again for what is left of wait_ms, or the caller's client would
	 * fail at the first SIGCHLD or profiler tick. */
	clock_gettime(CLOCK_MONOTONIC, &t0);
	while ((ret = connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 ? -errno : 0) == -EINTR &&
	       wait_ms != 0 && !intr) {
		struct timespec now;
		long long left;

		if (wait_ms < 0)
			continue;
		clock_gettime(CLOCK_MONOTONIC, &now);
		left = wait_ms * 1000ll - ((now.tv_sec - t0.tv_sec) * 1000000ll +
					   (now.tv_nsec - t0.tv_nsec) / 1000);
		if (left <= 0) {
			ret = -EAGAIN; /* (what SO_SNDTIMEO's end says) */
			break;
		}
		tv.tv_sec = left / 1000000;
		tv.tv_usec = left % 1000000;
		if (setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) < 0) {
			ret = -errno;
			break;
		}
	}
	if (wait_ms == 0 && fcntl(fd, F_SETFL, fl) < 0 && ret == 0)
		ret = -errno;
	/* Sends block as before. */
	if (wait_ms > 0 && setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &forever, sizeof(forever)) < 0 &&
	    ret == 0)
		ret = -errno;
	if (ret < 0)
		return ret;
	if (listener_gone(fd))
		return -ECONNREFUSED; /* what the socket will say once torn down */
	return 0;
}

int wex_sock_connect_fd(int fd, const char *path, int wait_ms)
{
	return connect_fd(fd, path, wait_ms, 0);
}

int wex_sock_connect_fd_intr(int fd, const char *path, int wait_ms)
{
	return connect_fd(fd, path, wait_ms, 1);
}

int wex_sock_connect(const char *path)
{
	int fd = wex_sock_new(), ret;

	if (fd < 0)
		return fd;
	ret = wex_sock_connect_fd(fd, path, -1);
	if (ret < 0) {
		close(fd);
		return ret;
	}
	return fd;
}

ssize_t wex_sock_send(int fd, const void *buf, size_t len, const int *fds, int nfds, int flags)
{
	union {
		char buf[CMSG_SPACE(sizeof(int) * 253)];
		struct cmsghdr align;
	} u;
	struct iovec iov = { .iov_base = (void *)buf, .iov_len = len };
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };
	ssize_t n;

	if (nfds < 0 || nfds > 253)
		return -EINVAL;
	if (nfds > 0) {
		struct cmsghdr *c;

		memset(&u, 0, sizeof(u));
		msg.msg_control = u.buf;
		msg.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds);
		c = CMSG_FIRSTHDR(&msg);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
		memcpy(CMSG_DATA(c), fds, sizeof(int) * (size_t)nfds);
	}
	do
		n = sendmsg(fd, &msg, MSG_NOSIGNAL | flags);
	while (n < 0 && errno == EINTR);
	return n < 0 ? -errno : n;
}

void wex_sock_close_fds(int *fds, int n)
{
	for (int i = 0; i < n; i++) {
		if (fds[i] >= 0)
			close(fds[i]);
		fds[i] = -1;
	}
}

/* The closer thread's queue (wex_sock_close_nowait). */
static pthread_mutex_t closer_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t closer_cv = PTHREAD_COND_INITIALIZER;
static int *closer_q;
static size_t closer_n, closer_cap;
static int closer_up;

static void *closer(void *arg)
{
	(void)arg;
	pthread_mutex_lock(&closer_mu);
	for (;;) {
		int fd;

		while (!closer_n)
			pthread_cond_wait(&closer_cv, &closer_mu);
		fd = closer_q[--closer_n];
		pthread_mutex_unlock(&closer_mu);
		close(fd);
		pthread_mutex_lock(&closer_mu);
	}
	return NULL;
}

/* Whether closing fd may wait on another process.  Shared memory (memfd,
 * tmpfs, hugetlbfs: it has seals) never does; a FUSE file does (statx
 * without sync reads no attributes from its server; a process other than
 * the mount's owner gets EACCES); so may other regular files (network
 * file systems), and a socket that lingers. */
static int close_may_wait(int fd)
{
	struct linger lg;
	socklen_t len = sizeof(lg);
	struct statx stx;

	if (fcntl(fd, F_GET_SEALS) >= 0)
		return 0;
	if (statx(fd, "", AT_EMPTY_PATH | AT_STATX_DONT_SYNC, STATX_TYPE, &stx) < 0)
		return 1;
	if (S_ISREG(stx.stx_mode))
		return 1;
	if (S_ISSOCK(stx.stx_mode))
		return getsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, &len) == 0 && lg.l_onoff &&
		       lg.l_linger > 0;
	return 0;
}

void wex_sock_close_nowait(int fd)
{
	pthread_attr_t attr;
	pthread_t t;
	int *q;

	if (fd < 0)
		return;
	if (!close_may_wait(fd)) {
		close(fd);
		return;
	}
	pthread_mutex_lock(&closer_mu);
	if (!closer_up) {
		/* (Signals stay blocked in it as in its creator: wexd reads
		 * them from a signalfd.) */
		pthread_attr_init(&attr);
		pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
		pthread_attr_setstacksize(&attr, 64 * 1024);
		closer_up = pthread_create(&t, &attr, closer, NULL) == 0;
		pthread_attr_destroy(&attr);
	}
	if (closer_up && closer_n == closer_cap) {
		q = realloc(closer_q, (closer_cap ? closer_cap * 2 : 16) * sizeof(*q));
		if (q) {
			closer_q = q;
			closer_cap = closer_cap ? closer_cap * 2 : 16;
		}
	}
	if (!closer_up || closer_n == closer_cap) {
		/* No thread or no memory: as ever. */
		pthread_mutex_unlock(&closer_mu);
		close(fd);
		return;
	}
	closer_q[closer_n++] = fd;
	pthread_cond_signal(&closer_cv);
	pthread_mutex_unlock(&closer_mu);
}

void wex_sock_close_fds_nowait(int *fds, int n)
{
	for (int i = 0; i < n; i++) {
		wex_sock_close_nowait(fds[i]);
		fds[i] = -1;
	}
}

int wex_sock_take_fds(struct msghdr *msg, int *fds, int maxfds, int *nfds)
{
	int ret = 0;

	*nfds = 0;
	for (struct cmsghdr *c = CMSG_FIRSTHDR(msg); c; c = CMSG_NXTHDR(msg, c)) {
		if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
			continue;
		size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		int *in = (int *)CMSG_DATA(c);

		for (size_t i = 0; i < n; i++) {
			int f;

			memcpy(&f, &in[i], sizeof(f));
			if (*nfds < maxfds) {
				fds[(*nfds)++] = f;
			} else {
				wex_sock_close_nowait(f);
				ret = -EMSGSIZE;
			}
		}
	}
	return ret;
}

ssize_t wex_sock_recv(int fd, void *buf, size_t len, int *fds, int maxfds, int *nfds, int *mflags,
		      int flags)
{
	union {
		char buf[WEX_SOCK_CBUF_LEN];
		struct cmsghdr align;
	} u;
	struct iovec iov = { .iov_base = buf, .iov_len = len };
	struct msghdr msg = {
		.msg_iov = &iov,
		.msg_iovlen = 1,
		.msg_control = u.buf,
		.msg_controllen = sizeof(u.buf),
	};
	ssize_t n;
	int ret;

	*nfds = 0;
	do
		n = recvmsg(fd, &msg, MSG_CMSG_CLOEXEC | flags);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return -errno;
	ret = wex_sock_take_fds(&msg, fds, maxfds, nfds);
	*mflags = msg.msg_flags;
	if (ret < 0)
		*mflags |= MSG_CTRUNC;
	return n;
}

int wex_sock_peercred(int fd, pid_t *pid, uid_t *uid, gid_t *gid)
{
	struct ucred cr;
	socklen_t len = sizeof(cr);

	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &len) < 0)
		return -errno;
	*pid = cr.pid;
	*uid = cr.uid;
	*gid = cr.gid;
	return 0;
}

int wex_sock_peergroups(int fd, gid_t **groups)
{
#ifdef SO_PEERGROUPS
	socklen_t len = 0;
	gid_t *g = NULL;

	*groups = NULL;
	/* Asked with no room first: ERANGE and the size (0: no groups). */
	for (int tries = 0; tries < 3; tries++) {
		if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, g, &len) == 0) {
			if (!len)
				free(g), g = NULL;
			*groups = g;
			return (int)(len / sizeof(gid_t));
		}
		if (errno != ERANGE) {
			free(g);
			return -errno;
		}
		free(g);
		g = malloc(len ? len : sizeof(gid_t));
		if (!g)
			return -ENOMEM;
	}
	free(g);
	return -ERANGE;
#else
	(void)fd;
	*groups = NULL;
	return -ENOPROTOOPT;
#endif
}

int wex_table_seal(const void *data, size_t len, const char *name)
{
	return wex_table_seal_step(data, len, name, NULL);
}

/* Written in steps of this many bytes, step() called between them. */
#define SEAL_STEP ((size_t)8 << 20)

int wex_table_seal_step(const void *data, size_t len, const char *name, void (*step)(void))
{
	int fd, ret;

	fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		return -errno;
	for (size_t off = 0; off < len;) {
		size_t part = step && len - off > SEAL_STEP ? SEAL_STEP : len - off;
		ssize_t n = pwrite(fd, (const char *)data + off, part, (off_t)off);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			ret = -errno;
			goto err_close;
		}
		off += (size_t)n;
		if (step)
			step();
	}
	if (fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL) < 0) {
		ret = -errno;
		goto err_close;
	}
	return fd;
err_close:
	close(fd);
	return ret;
}

int wex_table_map(int fd, size_t max, const void **data, size_t *len)
{
	const int need = F_SEAL_WRITE | F_SEAL_GROW | F_SEAL_SHRINK;
	struct stat st;
	void *p;
	int seals;

	seals = fcntl(fd, F_GET_SEALS);
	if (seals < 0)
		return errno == EINVAL ? -EPERM : -errno;
	if ((seals & need) != need)
		return -EPERM;
	if (fstat(fd, &st) < 0)
		return -errno;
	if ((uint64_t)st.st_size > max)
		return -EMSGSIZE;
	if (st.st_size == 0) {
		*data = NULL;
		*len = 0;
		return 0;
	}
	p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
	if (p == MAP_FAILED)
		return -errno;
	*data = p;
	*len = (size_t)st.st_size;
	return 0;
}

void wex_table_unmap(const void *data, size_t len)
{
	if (data && len)
		munmap((void *)data, len);
}

int wex_fd_exhausted(void)
{
	int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);

	if (fd >= 0) {
		close(fd);
		return 0;
	}
	return errno == EMFILE || errno == ENFILE;
}

int wex_fd_count(pid_t pid)
{
	char path[64];
	struct dirent *e;
	DIR *d;
	int n = 0;

	snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
	d = opendir(path);
	if (!d)
		return -errno;
	while ((e = readdir(d)))
		if (e->d_name[0] != '.')
			n++;
	closedir(d);
	return n - (pid == getpid() ? 1 : 0); /* the DIR's own fd */
}

#ifndef SO_PEERPIDFD
#define SO_PEERPIDFD 77 /* asm-generic/socket.h, Linux 6.5 */
#endif

int wex_sock_peer_pidfd(int fd, pid_t pid, const char **how)
{
	/* Test hook: the path of kernels before 6.5. */
	const char *hook = getenv("WEX_SOCK_NO_PEERPIDFD");
	socklen_t len = sizeof(int);
	int pfd = -1;

	*how = "SO_PEERPIDFD";
	if (!(hook && !strcmp(hook, "1"))) {
		if (getsockopt(fd, SOL_SOCKET, SO_PEERPIDFD, &pfd, &len) == 0 && pfd >= 0)
			return pfd;
		/* Reaped (ESRCH; EINVAL from older kernels): its pid may name
		 * another process by now, so no pidfd_open of it. */
		if (errno == ESRCH || errno == EINVAL)
			return -ESRCH;
		/* Only a kernel without the option (ENOPROTOOPT) or a peer
		 * without a pid (ENODATA) falls back; EMFILE and the rest are
		 * the caller's to see. */
		if (errno != ENOPROTOOPT && errno != ENODATA)
			return -errno;
	}
	*how = "pidfd_open";
	if (pid <= 0)
		return -ENOENT;
#ifdef SYS_pidfd_open
	pfd = (int)syscall(SYS_pidfd_open, pid, 0);
	return pfd >= 0 ? pfd : -errno;
#else
	return -ENOSYS;
#endif
}
