/* SPDX-License-Identifier: MIT */
/*
 * fork_child - a process that forks (a data-loader worker, say) and then
 * dies must not have its child keep its wexd connection: the lease it held
 * and the ranks it had go as if it had been alone.  The child's copies of
 * its clients refuse every call (-ECHILD, naming the fork) and free.
 *
 * Process A opens a consumer (holding a lease on v1) and a producer rank,
 * forks B, and exits without closing anything.  B lives on.  wexd must
 * drop the lease and give both ranks to new processes; B's calls on the
 * inherited clients must fail with -ECHILD and close cleanly.
 *
 * A fork by another thread while wex_client_close waits for wexd's answer
 * to its release (wexd stopped, so the wait is certain): the child holds
 * no socket of the client, and once close returns wexd has the
 * connection's end, so this process gets the rank again while the child
 * lives (close used to take the client off fork()'s list first, and the
 * child kept the connection, and the rank, open).
 *
 * A child forked from a process with a producer (its watch's eventfds,
 * the cancel eventfd) holds none of the client's eventfds.
 *
 * Then the same with a child made by the raw clone() system call, which
 * runs no fork handlers: the child keeps the connection's socket open, and
 * wexd must still free the lease and ranks when A exits (it watches each
 * client's process through a pidfd).
 */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fixture.h"

#define MODEL "fork"
#define PMODEL "fork-p"

struct report {
	pid_t child;
	int sync, begin, release, dirty;
	char why[160];
};

/* B: the inherited clients refuse, close, and B stays alive holding
 * nothing of them. */
static void child_b(int wfd, wex_client_t *cons, wex_client_t *prod)
{
	struct wex_sync_result r;
	struct report rep = { .child = getpid() };

	alarm(30); /* never outlives a failed test for long */
	rep.sync = wex_sync(cons, WEX_SYNC_REMAP_VIEW, 0, 1000, &r);
	snprintf(rep.why, sizeof(rep.why), "%s", wex_last_error(cons));
	rep.release = wex_release(cons);
	rep.dirty = wex_is_dirty(cons);
	rep.begin = wex_begin_write(prod, 2, 1000);
	wex_client_close(cons);
	wex_client_close(prod);
	if (write(wfd, &rep, sizeof(rep)) != (ssize_t)sizeof(rep))
		_exit(1);
	for (;;)
		pause();
}

static void process_a(int wfd)
{
	struct wex_sync_result r;
	struct t_cons k;
	wex_client_t *prod;
	pid_t b;

	t_cons_open(&k, MODEL, "g", "tiny", 0, 1);
	T_WEX(k.c, wex_sync(k.c, WEX_SYNC_REMAP_VIEW, 1, 5000, &r));
	prod = t_open(WEX_ROLE_PRODUCER, PMODEL, NULL, 0, 1);
	b = fork();
	T_ASSERT(b >= 0, "fork");
	if (b == 0)
		child_b(wfd, k.c, prod);
	_exit(0); /* dies holding the lease and both ranks */
}

/* A again, with a child made by clone() (no atfork handlers: the child
 * holds the very sockets A's clients use) that only sleeps. */
static void process_a_clone(int wfd)
{
	struct wex_sync_result r;
	struct t_cons k;
	long b;

	t_cons_open(&k, MODEL, "g", "tiny", 0, 1);
	T_WEX(k.c, wex_sync(k.c, WEX_SYNC_REMAP_VIEW, 2, 5000, &r));
	(void)t_open(WEX_ROLE_PRODUCER, PMODEL, NULL, 0, 1);
	b = syscall(SYS_clone, (unsigned long)SIGCHLD, NULL, NULL, NULL, NULL);
	T_ASSERT(b >= 0, "clone: %s", strerror(errno));
	if (b == 0) {
		pid_t me = getpid();

		alarm(30);
		if (write(wfd, &me, sizeof(me)) != (ssize_t)sizeof(me))
			_exit(1);
		for (;;)
			pause();
	}
	_exit(0); /* dies holding the lease and both ranks */
}

/* Opens `role` rank 0 again, retrying while wexd may not yet have seen
 * A's connection go (it has no reason to wait long) unless `at_once`. */
static wex_client_t *reopen(int role, const char *model, const char *group, int at_once)
{
	struct wex_client_params p = {
		.field_mask = WEX_CLIENT_FIELD_ROLE | WEX_CLIENT_FIELD_MODEL |
			      WEX_CLIENT_FIELD_RANK | (group ? WEX_CLIENT_FIELD_GROUP : 0),
		.role = role, .model = model, .group = group, .rank = 0, .world_size = 1,
	};
	double t0 = t_now();
	wex_client_t *c = NULL;
	int ret;

	while ((ret = wex_client_open(&p, &c)) == -EADDRINUSE && !at_once && t_now() - t0 < 5)
		usleep(2000);
	T_ASSERT(ret == 0, "%s rank 0 of model '%s' free again %sonce its holder died (its "
		 "child lives on): %s", role == WEX_ROLE_PRODUCER ? "producer" : "consumer",
		 model, at_once ? "at once " : "", wex_strerror(ret));
	return c;
}

#define NFDS 1024

/* Marks in is[] which of fds 0..NFDS-1 are sockets (no allocation: also
 * for a child forked from threads). */
static void sockets_of(char *is)
{
	struct stat st;

	for (int fd = 0; fd < NFDS; fd++)
		is[fd] = fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode);
}

static wex_client_t *closing;
static atomic_int closing_tid;

static void *closer(void *arg)
{
	(void)arg;
	atomic_store(&closing_tid, (int)syscall(SYS_gettid));
	wex_client_close(closing);
	return NULL;
}

/* Whether thread tid waits in a poll system call (close's wait). */
static int in_poll(int tid)
{
	char path[64], buf[64] = "";
	FILE *f;
	long nr;

	snprintf(path, sizeof(path), "/proc/self/task/%d/syscall", tid);
	f = fopen(path, "r");
	T_ASSERT(f, "open %s: %s", path, strerror(errno));
	if (!fgets(buf, sizeof(buf), f))
		buf[0] = '\0';
	fclose(f);
	if (sscanf(buf, "%ld", &nr) != 1)
		return 0; /* "running" */
#ifdef SYS_poll
	if (nr == SYS_poll)
		return 1;
#endif
	return nr == SYS_ppoll;
}

/* Whether process pid is stopped (its SIGSTOP taken: a group stop). */
static int stopped(pid_t pid)
{
	char path[64], buf[512], *e;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	f = fopen(path, "r");
	T_ASSERT(f && fgets(buf, sizeof(buf), f), "read %s", path);
	fclose(f);
	/* The state follows the ") " that ends the command name. */
	e = strrchr(buf, ')');
	return e && e[1] == ' ' && e[2] == 'T';
}

/* A consumer holding a remap lease is closed on a thread while wexd is
 * stopped; the main thread forks once close waits for the release's
 * answer.  The child reports the sockets it holds that this process did
 * not before the client opened, and lives until the parent has reopened
 * the rank. */
static void close_fork(struct t_wexd *d)
{
	struct wex_client_params p = {
		.field_mask = WEX_CLIENT_FIELD_ROLE | WEX_CLIENT_FIELD_MODEL |
			      WEX_CLIENT_FIELD_RANK | WEX_CLIENT_FIELD_GROUP,
		.role = WEX_ROLE_CONSUMER, .model = MODEL, .group = "close", .rank = 0,
		.world_size = 1,
	};
	static char before[NFDS], after[NFDS];
	struct wex_sync_result r;
	int rep[2], go[2], extra = -1, ret, st;
	wex_client_t *c = NULL;
	pthread_t th;
	double t0;
	pid_t b;

	T_ASSERT(pipe(rep) == 0 && pipe(go) == 0, "pipe");
	sockets_of(before);
	T_WEX(NULL, wex_client_open(&p, &closing));
	T_WEX(closing, wex_sync(closing, WEX_SYNC_REMAP_VIEW, 0, 5000, &r));
	T_ASSERT(kill(d->pid, SIGSTOP) == 0, "SIGSTOP wexd");
	while (!stopped(d->pid))
		sched_yield();
	T_ASSERT(pthread_create(&th, NULL, closer, NULL) == 0, "pthread_create");
	/* Close waits up to 1 s for the answer: fork in that wait. */
	while (!atomic_load(&closing_tid) || !in_poll(atomic_load(&closing_tid)))
		sched_yield();
	fflush(stdout);
	b = fork();
	T_ASSERT(b >= 0, "fork");
	if (b == 0) {
		char c1;
		int n = 0;

		alarm(30);
		close(go[1]); /* the parent's exit, even a failed test's, ends it */
		sockets_of(after);
		for (int fd = 0; fd < NFDS; fd++)
			n += after[fd] && !before[fd];
		if (write(rep[1], &n, sizeof(n)) != (ssize_t)sizeof(n))
			_exit(1);
		(void)!read(go[0], &c1, 1);
		_exit(0);
	}
	T_ASSERT(kill(d->pid, SIGCONT) == 0, "SIGCONT wexd");
	T_ASSERT(read(rep[0], &extra, sizeof(extra)) == (ssize_t)sizeof(extra), "the child's report");
	pthread_join(th, NULL);
	/* Closed, with the child alive: the rank is this process's again
	 * (wexd takes in the connection's end on its own time). */
	for (t0 = t_now(); (ret = wex_client_open(&p, &c)) == -EADDRINUSE && t_now() - t0 < 3;)
		usleep(2000);
	if (ret == 0)
		wex_client_close(c);
	T_ASSERT(write(go[1], "x", 1) == 1, "end the child");
	T_ASSERT(waitpid(b, &st, 0) == b && WIFEXITED(st) && WEXITSTATUS(st) == 0,
		 "the child exited (%d)", st);
	T_ASSERT(extra == 0, "a child forked while wex_client_close waited holds %d socket(s) of "
		 "the client (its connection to wexd)", extra);
	T_ASSERT(ret == 0, "consumer rank 0 of group 'close' free again once closed, while a child "
		 "forked during the close lives: %s (%s)", wex_strerror(ret), wex_last_error(NULL));
	close(rep[0]);
	close(rep[1]);
	close(go[0]);
	close(go[1]);
	printf("fork during close: the child held no socket of it, and the rank was free again "
	       "with the child alive\n");
}

/* Runs fn(wfd) in a new process A, reads what A's child reports on wfd
 * into out, and reaps A, which exits once it has made that child. */
static void run_a(void (*fn)(int wfd), void *out, size_t len, const char *child)
{
	int pfd[2], st;
	pid_t a;

	T_ASSERT(pipe(pfd) == 0, "pipe");
	a = fork();
	T_ASSERT(a >= 0, "fork");
	if (a == 0) {
		close(pfd[0]);
		fn(pfd[1]);
	}
	close(pfd[1]);
	T_ASSERT(read(pfd[0], out, len) == (ssize_t)len, "%s's report", child);
	close(pfd[0]);
	T_ASSERT(waitpid(a, &st, 0) == a && WIFEXITED(st) && WEXITSTATUS(st) == 0,
		 "A set up, made %s and exited (%d)", child, st);
}

/* How many eventfds this process holds. */
static int eventfds(void)
{
	char path[64], to[64];
	int n = 0;

	for (int fd = 0; fd < NFDS; fd++) {
		ssize_t m;

		snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
		m = readlink(path, to, sizeof(to) - 1);
		if (m > 0) {
			to[m] = '\0';
			n += !strcmp(to, "anon_inode:[eventfd]");
		}
	}
	return n;
}

/* A producer (with its watch) opened, then a fork: the child holds no
 * eventfd (this process holds none but its clients'). */
static void fork_eventfds(void)
{
	int before = eventfds(), with, st;
	wex_client_t *q = t_open(WEX_ROLE_PRODUCER, "fork-e", NULL, 0, 1);
	pid_t pid;

	with = eventfds();
	T_ASSERT(with > before, "the producer holds eventfds (%d, %d before)", with, before);
	fflush(stdout);
	pid = fork();
	T_ASSERT(pid >= 0, "fork: %s", strerror(errno));
	if (pid == 0)
		_exit(eventfds() > 100 ? 100 : eventfds());
	T_ASSERT(waitpid(pid, &st, 0) == pid && WIFEXITED(st), "the child");
	T_ASSERT(WEXITSTATUS(st) == 0, "the forked child holds %d eventfds (the parent %d, its new producer's %d)",
		 WEXITSTATUS(st), with, with - before);
	printf("forked child: no eventfd (the parent holds %d, its new producer's %d)\n", with,
	       with - before);
	wex_client_close(q);
}

int main(int argc, char **argv)
{
	struct t_wexd d;
	struct t_prod p;
	struct report rep;
	wex_client_t *c;
	int leases = -1;
	char *exit_watch;
	double t0;
	pid_t cpid;

	t_wexd_start(&d);
	t_check_backend(d.sock);
	t_prod_open(&p, MODEL, "tiny", 0, 1);
	t_prod_write(&p, 1);

	run_a(process_a, &rep, sizeof(rep), "B (by fork())");

	T_ASSERT(rep.sync == -ECHILD && strstr(rep.why, "fork"),
		 "a sync on a client inherited through fork: -ECHILD naming the fork, got %s (%s)",
		 wex_strerror(rep.sync), rep.why);
	T_ASSERT(rep.release == -ECHILD && rep.begin == -ECHILD && rep.dirty == -ECHILD,
		 "release, is_dirty and begin_write there: -ECHILD (got %d, %d, %d)", rep.release,
		 rep.dirty, rep.begin);
	printf("B's calls: %s\n", rep.why);

	/* A is dead and B alive: the lease goes, and the ranks with it. */
	for (t0 = t_now(); t_now() - t0 < 5 && (leases = t_leases(d.sock, MODEL)) != 0;)
		usleep(2000);
	T_ASSERT(leases == 0, "the dead consumer's lease is dropped while its forked child "
		 "lives (%d held)", leases);
	c = reopen(WEX_ROLE_CONSUMER, MODEL, "g", 0);
	wex_client_close(c);
	c = reopen(WEX_ROLE_PRODUCER, PMODEL, NULL, 0);
	wex_client_close(c);
	/* And the producer may write again at once. */
	t_prod_write(&p, 2);
	printf("lease and ranks freed with B (pid %d) still alive\n", (int)rep.child);

	T_ASSERT(kill(rep.child, 0) == 0, "B still alive at the end");
	kill(rep.child, SIGKILL);

	close_fork(&d);
	fork_eventfds();

	/* The clone() case: wexd must see A go although its socket lives on. */
	exit_watch = t_exit_watch(d.sock);
	if (!strncmp(exit_watch, "none", 4)) {
		printf("fork case PASS; clone case SKIP: wexd cannot watch client processes "
		       "(%s)\n", exit_watch);
		kill(rep.child, SIGKILL);
		t_prod_close(&p);
		t_wexd_stop(&d);
		t_exit(T_EXIT_SKIP);
	}
	/* argv[1]: how wexd must be watching (a test hook forces one). */
	T_ASSERT(argc < 2 || !strcmp(exit_watch, argv[1]), "wexd watches clients' processes "
		 "with %s, got %s", argc < 2 ? "" : argv[1], exit_watch);
	{
		json_t *st = t_status(d.sock), *cl;
		size_t i;

		json_array_foreach(json_object_get(st, "clients"), i, cl)
			T_ASSERT(json_is_true(json_object_get(cl, "exit_watched")),
				 "status: client %lld (pid %lld) not exit_watched",
				 (long long)json_integer_value(json_object_get(cl, "id")),
				 (long long)json_integer_value(json_object_get(cl, "pid")));
		json_decref(st);
	}
	run_a(process_a_clone, &cpid, sizeof(cpid), "C (by clone())");
	/* A is reaped: its rank is free at once, whether or not wexd has yet
	 * taken in its exit (a restarted trainer must not be refused). */
	c = reopen(WEX_ROLE_PRODUCER, PMODEL, NULL, 1);
	wex_client_close(c);
	for (t0 = t_now(); t_now() - t0 < 5 && (leases = t_leases(d.sock, MODEL)) != 0;)
		usleep(2000);
	T_ASSERT(leases == 0, "the dead consumer's lease is dropped while a child made with "
		 "clone() holds its very socket (%d held; exit watch: %s)", leases, exit_watch);
	c = reopen(WEX_ROLE_CONSUMER, MODEL, "g", 0);
	wex_client_close(c);
	t_prod_write(&p, 3);
	T_ASSERT(kill(cpid, 0) == 0, "C still alive at the end");
	kill(cpid, SIGKILL);
	printf("lease and ranks freed with C (pid %d, made by clone()) still alive, exit watch "
	       "%s\n", (int)cpid, exit_watch);
	free(exit_watch);
	t_prod_close(&p);
	t_wexd_stop(&d);
	printf("fork_child: PASS\n");
	t_exit(T_EXIT_PASS);
}
