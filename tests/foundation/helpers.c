/* SPDX-License-Identifier: MIT */
/* helpers.c - see helpers.h. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <linux/io_uring.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ipc/sock.h"
#include "helpers.h"
#include "wex.h"

static pid_t owner_pid;
static void settle_close(void);
static struct t_wexd *cur_wexd;
static pid_t children[64];
static int nchildren;

double t_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

unsigned long long t_seed(const char *prefix, double *secs)
{
	char var[64];
	const char *e;
	unsigned long long seed;

	snprintf(var, sizeof(var), "%s_SEED", prefix);
	e = getenv(var);
	seed = e && *e ? strtoull(e, NULL, 0) : (unsigned long long)(t_now() * 1000003.0);
	snprintf(var, sizeof(var), "%s_SECS", prefix);
	e = getenv(var);
	if (e && *e)
		*secs = strtod(e, NULL);
	printf("seed %llu (%s_SEED=%llu replays it), %.1f s\n", seed, prefix, seed, *secs);
	fflush(stdout);
	return seed;
}

void t_track_child(pid_t pid)
{
	/* A slot freed by t_wait first: a test that restarts its children
	 * again and again keeps them all tracked. */
	for (int i = 0; i < nchildren; i++)
		if (children[i] == 0) {
			children[i] = pid;
			return;
		}
	if (nchildren < 64)
		children[nchildren++] = pid;
}

void t_untrack_child(pid_t pid)
{
	for (int i = 0; i < nchildren; i++)
		if (children[i] == pid)
			children[i] = 0;
}

pid_t t_fork(void)
{
	pid_t pid;

	fflush(stdout);
	fflush(stderr);
	if (!owner_pid)
		owner_pid = getpid();
	pid = fork();
	if (pid < 0)
		T_FAIL("fork: %s", strerror(errno));
	if (pid > 0)
		t_track_child(pid);
	else
		nchildren = 0;
	return pid;
}

int t_wait(pid_t pid)
{
	int st;

	while (waitpid(pid, &st, 0) < 0)
		if (errno != EINTR)
			T_FAIL("waitpid %d: %s", (int)pid, strerror(errno));
	t_untrack_child(pid);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

int t_journal_wipe(struct t_wexd *d)
{
	char path[sizeof(d->sock) + 16];
	struct dirent *e;
	DIR *dir;
	int n = 0;

	snprintf(path, sizeof(path), "%s.leases", d->sock);
	dir = opendir(path);
	if (!dir)
		return 0;
	while ((e = readdir(dir)))
		if (e->d_name[0] != '.')
			n += unlinkat(dirfd(dir), e->d_name, 0) == 0;
	closedir(dir);
	rmdir(path);
	return n;
}

static void rm_dir(struct t_wexd *d)
{
	char lock[sizeof(d->sock) + 8];

	unlink(d->sock);
	/* wexd keeps its lock file (<sock>.lock) on exit, by design. */
	snprintf(lock, sizeof(lock), "%s.lock", d->sock);
	unlink(lock);
	t_journal_wipe(d);
	rmdir(d->dir);
}

void t_exit(int code)
{
	fflush(stdout);
	if (getpid() != owner_pid) {
		/* A forked child: leave the daemon to the parent; no atexit
		 * handlers of the parent's libraries. */
		fflush(stderr);
		_exit(code);
	}
	for (int i = 0; i < nchildren; i++)
		if (children[i] > 0) {
			kill(children[i], SIGKILL);
			waitpid(children[i], NULL, 0);
		}
	if (cur_wexd) {
		if (cur_wexd->pid > 0) {
			kill(cur_wexd->pid, SIGKILL);
			waitpid(cur_wexd->pid, NULL, 0);
		}
		rm_dir(cur_wexd);
	}
	exit(code);
}

/* Skips the test when WEX_IO=io_uring is asked for on a machine whose
 * kernel (or seccomp profile: containers often block it) refuses
 * io_uring_setup; anywhere else the backend is required. */
static void io_uring_or_skip(void)
{
	const char *want = getenv("WEX_IO");
	struct io_uring_params p;
	long fd;

	if (!want || strcmp(want, "io_uring"))
		return;
	memset(&p, 0, sizeof(p));
	fd = syscall(__NR_io_uring_setup, 4, &p);
	if (fd < 0)
		T_SKIP("WEX_IO=io_uring but io_uring_setup fails here: %s", strerror(errno));
	close((int)fd);
}

static void spawn(struct t_wexd *d)
{
	const char *bin = getenv("WEXD_BIN");
	int pfd[2], ret;
	char buf[16] = "", num[16];
	struct pollfd p;
	pid_t parent;
	ssize_t n;

	if (!bin || !*bin)
		T_SKIP("WEXD_BIN not set (run through ctest)");
	io_uring_or_skip();
	if (pipe2(pfd, O_CLOEXEC) < 0)
		T_FAIL("pipe: %s", strerror(errno));
	fflush(stdout);
	fflush(stderr);
	parent = getpid();
	d->pid = fork();
	if (d->pid < 0)
		T_FAIL("fork: %s", strerror(errno));
	if (d->pid == 0) {
		/* wexd must not outlive a crashed test (nor one killed before
		 * the request took). */
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent)
			_exit(127);
		close(pfd[0]);
		/* wexd gets no fd of the test's or of whatever ran the test
		 * (ctest's LastTest.log, a CI runner's pipes): its fd counts
		 * and its room under max_open_files must not depend on them. */
		if (syscall(SYS_close_range, 3u, ~0u, 4u /* CLOSE_RANGE_CLOEXEC */) < 0)
			for (int fd = 3; fd < 4096; fd++)
				(void)fcntl(fd, F_SETFD, FD_CLOEXEC);
		/* The ready fd must survive exec: dup it without CLOEXEC. */
		int wfd = dup(pfd[1]);

		snprintf(num, sizeof(num), "%d", wfd);
		setenv("WEXD_READY_FD", num, 1);
		setenv("WEX_SOCKET", d->sock, 1);
		execl(bin, bin, (char *)NULL);
		fprintf(stderr, "exec %s: %s\n", bin, strerror(errno));
		_exit(127);
	}
	close(pfd[1]);
	p.fd = pfd[0];
	p.events = POLLIN;
	do
		ret = poll(&p, 1, 20000);
	while (ret < 0 && errno == EINTR);
	if (ret <= 0)
		T_FAIL("wexd did not become ready within 20 s");
	n = read(pfd[0], buf, sizeof(buf) - 1);
	close(pfd[0]);
	if (n != 6 || strcmp(buf, "ready\n"))
		T_FAIL("wexd did not say ready (got %zd bytes: '%s'; did it exit?)", n, buf);
}

void t_wexd_start(struct t_wexd *d)
{
	const char *tmp = getenv("TMPDIR");

	if (!owner_pid)
		owner_pid = getpid();
	memset(d, 0, sizeof(*d));
	snprintf(d->dir, sizeof(d->dir), "%s/wex-test-XXXXXX", tmp && *tmp ? tmp : "/tmp");
	if (!mkdtemp(d->dir))
		T_FAIL("mkdtemp %s: %s", d->dir, strerror(errno));
	snprintf(d->sock, sizeof(d->sock), "%s/wexd.sock", d->dir);
	setenv("WEX_SOCKET", d->sock, 1);
	cur_wexd = d;
	spawn(d);
}

void t_wexd_restart(struct t_wexd *d)
{
	spawn(d);
}

void t_wexd_kill(struct t_wexd *d)
{
	settle_close();
	kill(d->pid, SIGKILL);
	waitpid(d->pid, NULL, 0);
	d->pid = 0;
}

void t_wexd_stop(struct t_wexd *d)
{
	int st;
	pid_t pid = d->pid;

	settle_close();
	if (kill(pid, SIGTERM) < 0)
		T_FAIL("kill wexd: %s", strerror(errno));
	while (waitpid(pid, &st, 0) < 0)
		if (errno != EINTR)
			T_FAIL("waitpid wexd: %s", strerror(errno));
	d->pid = 0;
	rm_dir(d);
	cur_wexd = NULL;
	if (!WIFEXITED(st))
		T_FAIL("wexd died of signal %d on SIGTERM", WTERMSIG(st));
	if (WEXITSTATUS(st) != 0)
		T_FAIL("wexd exited with %d on SIGTERM, not 0", WEXITSTATUS(st));
}

int t_fd_count(pid_t pid)
{
	int n = wex_fd_count(pid);

	if (n < 0)
		T_FAIL("fd count of pid %d: %s", (int)pid, strerror(-n));
	return n;
}

void t_nofile_at_least(unsigned n)
{
	struct rlimit rl;

	T_ASSERT(getrlimit(RLIMIT_NOFILE, &rl) == 0, "getrlimit: %s", strerror(errno));
	if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur >= n)
		return;
	if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < n)
		T_SKIP("RLIMIT_NOFILE hard limit %llu < %u, the fds this test holds",
		       (unsigned long long)rl.rlim_max, n);
	rl.rlim_cur = n;
	T_ASSERT(setrlimit(RLIMIT_NOFILE, &rl) == 0, "setrlimit(RLIMIT_NOFILE, %u): %s", n,
		 strerror(errno));
}

/* A connection kept open for fd counting, so that the count does not
 * depend on whether wexd has yet seen a status connection close. */
static int settle_fd = -1;

static void settle_close(void)
{
	if (settle_fd >= 0)
		close(settle_fd);
	settle_fd = -1;
}

int t_wexd_fds_settle(struct t_wexd *d, int want)
{
	int n = -1;

	if (settle_fd < 0)
		settle_fd = t_raw_connect(d->sock);
	for (double t0 = t_now(); t_now() - t0 < 5.0;) {
		json_t *r = t_raw_rpc(settle_fd, "{\"v\":1,\"op\":\"ping\"}", NULL, 0);

		json_decref(r);
		n = t_fd_count(d->pid);
		if (want < 0 || n == want)
			break;
	}
	return n;
}

int t_raw_connect(const char *sock)
{
	int fd = wex_sock_connect(sock);

	if (fd < 0)
		T_FAIL("connect %s: %s", sock, strerror(-fd));
	return fd;
}

int t_raw_producer(const char *sock, const char *model, unsigned world)
{
	int fd = t_raw_connect(sock);
	char req[256];
	json_t *r;

	snprintf(req, sizeof(req),
		 "{\"v\":1,\"op\":\"hello\",\"role\":\"producer\",\"model\":\"%s\",\"world\":%u}",
		 model, world);
	r = t_raw_rpc(fd, req, NULL, 0);
	T_ASSERT(!strcmp(t_code(r), "OK"), "hello of a producer of %s with world %u: %s", model,
		 world, t_msg(r));
	json_decref(r);
	return fd;
}

void t_raw_send(int fd, const void *buf, size_t len, const int *fds, int nfds)
{
	ssize_t n = wex_sock_send(fd, buf, len, fds, nfds, 0);

	if (n < 0)
		T_FAIL("send %zu bytes with %d fds: %s", len, nfds, strerror((int)-n));
}

int t_stand_in_request(int fd, atomic_int *stop, atomic_int *drop, char *op, size_t oplen)
{
	struct pollfd pc = { .fd = fd, .events = POLLIN };
	int fds[WEX_SOCK_MAX_FDS], nfds = 0, mflags = 0;
	static __thread char buf[65536];
	json_t *j;
	ssize_t n;

	for (;;) {
		if (atomic_load(stop) || (drop && atomic_exchange(drop, 0)))
			return -1;
		if (poll(&pc, 1, 20) > 0)
			break;
	}
	n = wex_sock_recv(fd, buf, sizeof(buf), fds, WEX_SOCK_MAX_FDS, &nfds, &mflags, 0);
	wex_sock_close_fds(fds, nfds);
	if (n <= 0)
		return -1;
	j = json_loadb(buf, (size_t)n, 0, NULL);
	snprintf(op, oplen, "%s", json_string_value(json_object_get(j, "op")) ?: "");
	json_decref(j);
	return 1;
}

json_t *t_raw_recv(int fd)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };
	static char buf[1 << 17];
	int fds[WEX_SOCK_MAX_FDS], nfds = 0, mflags = 0, ret;
	json_error_t je;
	json_t *j;
	ssize_t n;

	do
		ret = poll(&p, 1, 10000);
	while (ret < 0 && errno == EINTR);
	if (ret <= 0)
		T_FAIL("no reply from wexd within 10 s");
	n = wex_sock_recv(fd, buf, sizeof(buf), fds, WEX_SOCK_MAX_FDS, &nfds, &mflags, 0);
	wex_sock_close_fds(fds, nfds);
	if (n <= 0)
		T_FAIL("receive: %s", n == 0 ? "wexd closed the connection" : strerror((int)-n));
	j = json_loadb(buf, (size_t)n, 0, &je);
	if (!j)
		T_FAIL("reply is not JSON: %s", je.text);
	return j;
}

void t_wexctl(const char *args, char *out, size_t len)
{
	const char *bin = getenv("WEXCTL_BIN");
	char cmd[600];
	size_t n;
	FILE *f;

	if (!bin)
		T_FAIL("WEXCTL_BIN not set (run through ctest)");
	snprintf(cmd, sizeof(cmd), "'%s' %s", bin, args);
	f = popen(cmd, "r");
	T_ASSERT(f, "popen %s", cmd);
	n = fread(out, 1, len - 1, f);
	out[n] = '\0';
	T_ASSERT(pclose(f) == 0, "wexctl %s: %s", args, out);
}

json_t *t_raw_rpc(int fd, const char *json, const int *fds, int nfds)
{
	t_raw_send(fd, json, strlen(json), fds, nfds);
	return t_raw_recv(fd);
}

const char *t_code(json_t *reply)
{
	const char *code = "EUNKNOWN";

	if (json_is_true(json_object_get(reply, "ok")))
		return "OK";
	json_unpack(reply, "{s:{s:s}}", "error", "code", &code);
	return code;
}

const char *t_msg(json_t *reply)
{
	const char *msg = "";

	json_unpack(reply, "{s:{s:s}}", "error", "message", &msg);
	return msg;
}

json_t *t_status(const char *sock)
{
	int fd = t_raw_connect(sock);
	json_t *j = t_raw_rpc(fd, "{\"v\":1,\"op\":\"status\"}", NULL, 0);

	close(fd);
	if (strcmp(t_code(j), "OK"))
		T_FAIL("status: %s: %s", t_code(j), t_msg(j));
	return j;
}

void t_check_backend(const char *sock)
{
	const char *want = getenv("WEX_IO"), *io = "";
	json_t *j = t_status(sock);

	json_unpack(j, "{s:{s:s}}", "daemon", "io", &io);
	if (want && *want && strcmp(want, "auto") && strcmp(io, want)) {
		const char *why = "";

		json_unpack(j, "{s:{s?s}}", "daemon", "io_fallback_reason", &why);
		fprintf(stderr, "FAIL: WEX_IO=%s but wexd uses '%s' (%s)\n", want, io, why);
		json_decref(j);
		t_exit(T_EXIT_FAIL);
	}
	printf("event loop: %s\n", io);
	json_decref(j);
}

json_t *t_status_model(json_t *status, const char *model)
{
	size_t i;
	json_t *m;

	json_array_foreach(json_object_get(status, "models"), i, m) {
		const char *name = json_string_value(json_object_get(m, "name"));

		if (name && !strcmp(name, model))
			return m;
	}
	return NULL;
}

int t_leases(const char *sock, const char *model)
{
	json_t *s = t_status(sock), *m = t_status_model(s, model);
	int n = m ? (int)json_integer_value(json_object_get(m, "leases")) : 0;

	json_decref(s);
	return n;
}

char *t_exit_watch(const char *sock)
{
	json_t *s = t_status(sock);
	const char *w = json_string_value(json_object_get(json_object_get(s, "daemon"),
							  "exit_watch"));
	char *r;

	T_ASSERT(w, "status has daemon.exit_watch");
	r = strdup(w);
	json_decref(s);
	return r;
}

void t_u8_tensor(struct wex_tensor *t, const char *name, uint64_t n, uint32_t seg, uint64_t off)
{
	memset(t, 0, sizeof(*t));
	snprintf(t->name, sizeof(t->name), "%s", name);
	t->dtype = WEX_DT_U8;
	t->ndim = 1;
	t->shape[0] = t->extent[0] = n;
	t->segment = seg;
	t->offset = off;
}

/* ---------------------------------------------------------------------- */
/* t_relay                                                                 */

#define RELAY_BUF (4u << 20)

struct relay_pair {
	struct t_relay *r;
	int down, up, cut;
	char *buf;
};

/* Passes one message from `from` to `to` (not when drop); *op (if op)
 * gets its kind: 1 a publish (not a restore), 2 a hello, 0 another.
 * 0 when `from` hung up. */
static int relay_pass(char *buf, int from, int to, int drop, int *op)
{
	int fds[WEX_SOCK_MAX_FDS], nfds = 0, mflags = 0;
	ssize_t n;

	n = wex_sock_recv(from, buf, RELAY_BUF, fds, WEX_SOCK_MAX_FDS, &nfds, &mflags, 0);
	if (n <= 0) {
		wex_sock_close_fds(fds, nfds);
		return 0;
	}
	if (op) {
		json_t *j = json_loadb(buf, (size_t)n, 0, NULL);
		const char *o = json_string_value(json_object_get(j, "op")) ?: "";

		*op = !strcmp(o, "publish") && !json_is_true(json_object_get(j, "restored")) ? 1 :
		      !strcmp(o, "hello")					     ? 2 :
											       0;
		json_decref(j);
	}
	if (!drop)
		(void)wex_sock_send(to, buf, (size_t)n, fds, nfds, 0);
	wex_sock_close_fds(fds, nfds);
	return 1;
}

static void *relay_pair_main(void *arg)
{
	struct relay_pair *p = arg;
	struct t_relay *r = p->r;
	struct pollfd pf[2] = { { .fd = p->down, .events = POLLIN },
				{ .fd = p->up, .events = POLLIN } };
	int swallow_next = 0, stall = 0, hello = 0, op = 0;

	while (!atomic_load(&r->stop) && atomic_load(&r->cut) == p->cut) {
		/* Stalled: the client's requests wait unread. */
		pf[0].events = stall == 2 && atomic_load(&r->stall) ? 0 : POLLIN;
		if (poll(pf, 2, 20) <= 0)
			continue;
		/* A client that closed its end wants no answer: what it sent
		 * and wexd has not read is not run (as without the relay). */
		if (pf[0].revents & (POLLHUP | POLLERR))
			break;
		if (pf[0].revents) {
			if (!relay_pass(p->buf, p->down, p->up, 0, &op))
				break;
			if (op == 1 && atomic_exchange(&r->swallow, 0))
				swallow_next = 1;
			if (op == 2 && !stall && atomic_load(&r->stall))
				hello = 1;
		}
		if (pf[1].revents) {
			if (!relay_pass(p->buf, p->up, p->down, swallow_next, NULL))
				break;
			if (swallow_next) {
				swallow_next = 0;
				atomic_fetch_add(&r->swallowed, 1);
			}
			if (hello) {
				hello = 0;
				stall = 2;
				atomic_store(&r->stalled, 1);
			}
		}
	}
	/* Either side gone (or cut): so is the other, wexd's first. */
	pthread_mutex_lock(&r->lock);
	for (int i = 0; i < T_RELAY_MAX; i++)
		if (r->open[i] == p)
			r->open[i] = NULL;
	pthread_mutex_unlock(&r->lock);
	close(p->up);
	close(p->down);
	free(p->buf);
	free(p);
	atomic_fetch_sub(&r->pairs, 1);
	return NULL;
}

static void *relay_main(void *arg)
{
	struct t_relay *r = arg;
	struct pollfd pl = { .fd = r->lfd, .events = POLLIN };

	while (!atomic_load(&r->stop)) {
		struct relay_pair *p;
		pthread_t th;
		int fd;

		if (poll(&pl, 1, 20) <= 0)
			continue;
		fd = accept4(r->lfd, NULL, NULL, SOCK_CLOEXEC);
		if (fd < 0)
			continue;
		/* Clients gone whose thread has not seen it yet: wexd sees it
		 * now, before this connection's hello. */
		pthread_mutex_lock(&r->lock);
		for (int i = 0; i < T_RELAY_MAX; i++) {
			struct pollfd ph = { .fd = r->open[i] ? r->open[i]->down : -1,
					     .events = POLLRDHUP };

			if (ph.fd >= 0 && poll(&ph, 1, 0) > 0 &&
			    (ph.revents & (POLLHUP | POLLRDHUP | POLLERR)))
				shutdown(r->open[i]->up, SHUT_RDWR);
		}
		pthread_mutex_unlock(&r->lock);
		p = calloc(1, sizeof(*p));
		T_ASSERT(p != NULL && (p->buf = malloc(RELAY_BUF)) != NULL, "relay: out of memory");
		p->r = r;
		p->down = fd;
		p->up = t_raw_connect(r->up);
		p->cut = atomic_load(&r->cut);
		atomic_fetch_add(&r->pairs, 1);
		pthread_mutex_lock(&r->lock);
		for (int i = 0; i < T_RELAY_MAX; i++)
			if (!r->open[i]) {
				r->open[i] = p;
				break;
			}
		pthread_mutex_unlock(&r->lock);
		T_ASSERT(pthread_create(&th, NULL, relay_pair_main, p) == 0, "relay thread");
		pthread_detach(th);
	}
	return NULL;
}

void t_relay_start(struct t_relay *r, const char *up, const char *path)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };

	memset(r, 0, sizeof(*r));
	pthread_mutex_init(&r->lock, NULL);
	r->up = up;
	T_ASSERT(strlen(path) < sizeof(a.sun_path) && strlen(path) < sizeof(r->path),
		 "relay socket path too long: %s", path);
	memcpy(a.sun_path, path, strlen(path) + 1);
	memcpy(r->path, path, strlen(path) + 1);
	r->lfd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	T_ASSERT(r->lfd >= 0 && bind(r->lfd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
			 listen(r->lfd, 16) == 0,
		 "relay socket %s: %s", path, strerror(errno));
	T_ASSERT(pthread_create(&r->th, NULL, relay_main, r) == 0, "relay thread");
}

void t_relay_stop(struct t_relay *r)
{
	atomic_store(&r->stop, 1);
	pthread_join(r->th, NULL);
	for (int i = 0; i < 500 && atomic_load(&r->pairs) > 0; i++)
		usleep(10000);
	close(r->lfd);
	unlink(r->path);
	pthread_mutex_destroy(&r->lock);
}

int t_journal_files(const char *sock, int held)
{
	char path[400], buf[64];
	struct dirent *e;
	DIR *dir;
	int n = 0;

	snprintf(path, sizeof(path), "%s.leases", sock);
	dir = opendir(path);
	if (!dir)
		return -1;
	while ((e = readdir(dir))) {
		int fd = e->d_name[0] != '.' ? openat(dirfd(dir), e->d_name, O_RDONLY) : -1;
		ssize_t got;

		if (fd < 0)
			continue;
		got = read(fd, buf, sizeof(buf) - 1);
		close(fd);
		buf[got > 0 ? got : 0] = '\0';
		n += !held || strncmp(buf, "{\"wex_lease\":1,", 14) == 0;
	}
	closedir(dir);
	return n;
}
