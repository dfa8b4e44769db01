/* SPDX-License-Identifier: MIT */
/*
 * producer_watch - a published version outlives a restart of wexd, with
 * the trainer making no call.
 *
 * Between publishing and its next step's begin_write a trainer calls
 * nothing (it waits for the rollouts), so a wexd that restarted in that
 * time learnt of the trainer's memory only at its next call, and an
 * engine that syncs the version before the rollout waited in vain (the
 * trainer's next step waits for that rollout).  A producer's watch (a
 * thread of libwex) reconnects as soon as wexd is back and tells it the
 * version its memory still holds.  Cases:
 *
 *  - idle: wexd SIGKILLed and restarted after v1 is published; a consumer
 *    that never had v1 syncs it (copy) with every byte, the producer
 *    idle throughout.  The same with WEX_CLIENT_NO_WATCH times out (the
 *    gap the watch closes);
 *  - writing: a write begun (half written) when wexd restarts goes on:
 *    the new wexd serves no version (the memory is neither v1 nor v2)
 *    until the producer publishes v2, which it accepts;
 *  - ranks: two producer ranks, both idle: the new wexd serves v1 once
 *    both are back, from both;
 *  - round: consumer group of two ranks; rank 0 took v1 before the
 *    restart, rank 1 takes it after, from the new wexd, which did not see
 *    rank 0 take it.  Rank 0 then syncs v2: it passes the new wexd's
 *    round on v1 (it will never take it), so the trainer may write v2
 *    (before: the round's hold kept the trainer out until rank 0's sync
 *    timed out), and both ranks get v2;
 *  - down: wexd stays down: the watch retries without spinning (CPU time
 *    of the process under 0.2 s in 1.5 s), never overwrites the caller's
 *    last error, and wex_client_close ends it at once (threads and fds as
 *    before the client);
 *  - fork: a child forked from a process with a watch holds no socket
 *    (neither the connection nor the watch's dup of it), and the parent
 *    goes on publishing.
 */
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fixture.h"

#define MODEL "watch"

static struct t_wexd d;

static int tasks(void)
{
	DIR *dir = opendir("/proc/self/task");
	struct dirent *e;
	int n = 0;

	T_ASSERT(dir != NULL, "opendir /proc/self/task: %s", strerror(errno));
	while ((e = readdir(dir)))
		n += e->d_name[0] != '.';
	closedir(dir);
	return n;
}

static int sockets(void)
{
	DIR *dir = opendir("/proc/self/fd");
	struct dirent *e;
	char path[300], link[64];
	int n = 0;

	T_ASSERT(dir != NULL, "opendir /proc/self/fd: %s", strerror(errno));
	while ((e = readdir(dir))) {
		ssize_t len;

		if (e->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "/proc/self/fd/%s", e->d_name);
		len = readlink(path, link, sizeof(link) - 1);
		if (len > 0) {
			link[len] = '\0';
			n += !strncmp(link, "socket:", 7);
		}
	}
	closedir(dir);
	return n;
}

static double cpu_s(void)
{
	struct rusage ru;

	getrusage(RUSAGE_SELF, &ru);
	return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + (double)ru.ru_stime.tv_sec +
	       ru.ru_stime.tv_usec / 1e6;
}

static void restart(void)
{
	t_wexd_kill(&d);
	t_wexd_restart(&d);
}

/* A copy sync of at least v into k: its result, its bytes checked. */
static int sync_copy(struct t_cons *k, uint64_t v, uint32_t timeout_ms)
{
	struct wex_sync_result r;
	int ret = wex_sync(k->c, WEX_SYNC_COPY, v, timeout_ms, &r);

	if (ret == 0) {
		T_ASSERT(r.version == v, "synced v%llu, not v%llu", (unsigned long long)r.version,
			 (unsigned long long)v);
		T_ASSERT(t_own_bad(k, v) == 0, "v%llu copied with wrong bytes", (unsigned long long)v);
	}
	return ret;
}

static void idle(uint32_t flags)
{
	struct t_prod p;
	struct t_cons k;
	int ret;

	t_client_flags = flags;
	t_prod_open(&p, MODEL, "tiny", 0, 1);
	t_client_flags = 0;
	t_prod_write(&p, 1);
	t_cons_open(&k, MODEL, "g", "tiny", 0, 1); /* attached, not synced */
	restart();
	ret = sync_copy(&k, 1, flags ? 1000 : 5000);
	if (!flags) {
		T_ASSERT(ret == 0, "with the watch, v1 not served after a restart with the trainer idle: %s (%s)",
			 wex_strerror(ret), wex_last_error(k.c));
		/* The trainer's next step goes on as if nothing happened. */
		t_prod_write(&p, 2);
		T_ASSERT(sync_copy(&k, 2, 5000) == 0, "v2 after the restart: %s", wex_last_error(k.c));
		printf("idle: v1 served after a restart with the trainer idle, then v2\n");
	} else {
		T_ASSERT(ret == -ETIMEDOUT, "without the watch: %s (%s), not a timeout",
			 wex_strerror(ret), wex_last_error(k.c));
		printf("idle, WEX_CLIENT_NO_WATCH: the sync times out (%s)\n", wex_last_error(k.c));
	}
	t_cons_close(&k);
	t_prod_close(&p);
}

static void writing(void)
{
	struct t_prod p;
	struct t_cons k;
	int ret;

	t_prod_open(&p, MODEL, "tiny", 0, 1);
	t_prod_write(&p, 1);
	T_WEX(p.c, wex_begin_write(p.c, 2, 5000));
	ex_fill(p.base, p.t, (size_t)p.n / 2, 2, 1);
	restart();
	t_cons_open(&k, MODEL, "g", "tiny", 0, 1);
	ret = sync_copy(&k, 1, 500);
	T_ASSERT(ret == -ETIMEDOUT, "a version served from memory half written: %s (%s)",
		 wex_strerror(ret), wex_last_error(k.c));
	ex_fill(p.base, p.t, (size_t)p.n, 2, 1);
	T_WEX(p.c, wex_publish(p.c, 2));
	T_ASSERT(sync_copy(&k, 2, 5000) == 0, "v2 after the write went on: %s", wex_last_error(k.c));
	printf("writing: nothing served while the write goes on, v2 once published\n");
	t_cons_close(&k);
	t_prod_close(&p);
}

static void ranks(void)
{
	struct t_prod p[2];
	struct t_cons k;

	for (uint32_t r = 0; r < 2; r++) {
		t_prod_open(&p[r], MODEL, "tiny", r, 2);
	}
	for (uint32_t r = 0; r < 2; r++)
		T_WEX(p[r].c, wex_begin_write(p[r].c, 1, 5000));
	for (uint32_t r = 0; r < 2; r++) {
		ex_fill(p[r].base, p[r].t, (size_t)p[r].n, 1, 1);
		T_WEX(p[r].c, wex_publish(p[r].c, 1));
	}
	restart();
	t_cons_open_from(&k, MODEL, "g", "tiny", 0, 1, 0);
	T_ASSERT(sync_copy(&k, 1, 5000) == 0, "v1 of two idle producer ranks after a restart: %s",
		 wex_last_error(k.c));
	printf("ranks: v1 of two idle producer ranks served after a restart\n");
	t_cons_close(&k);
	for (uint32_t r = 0; r < 2; r++)
		t_prod_close(&p[r]);
}

struct later {
	struct t_cons *k;
	uint64_t v;
	int ret;
};

static void *sync_later(void *arg)
{
	struct later *l = arg;

	l->ret = sync_copy(l->k, l->v, 8000);
	return NULL;
}

static void round_(void)
{
	struct t_prod p;
	struct t_cons k[2];
	struct later l;
	pthread_t th;
	double t0;

	t_prod_open(&p, MODEL, "tiny", 0, 1);
	for (uint32_t r = 0; r < 2; r++)
		t_cons_open_from(&k[r], MODEL, "g", "tiny", r, 2, 0);
	t_prod_write(&p, 1);
	T_ASSERT(sync_copy(&k[0], 1, 5000) == 0, "rank 0 takes v1: %s", wex_last_error(k[0].c));
	restart();
	T_ASSERT(sync_copy(&k[1], 1, 5000) == 0, "rank 1 takes v1 from the new wexd: %s",
		 wex_last_error(k[1].c));
	l = (struct later){ .k = &k[0], .v = 2 };
	T_ASSERT(pthread_create(&th, NULL, sync_later, &l) == 0, "pthread_create");
	usleep(100000); /* rank 0's sync of v2 waits at wexd */
	t0 = t_now();
	T_WEX(p.c, wex_begin_write(p.c, 2, 3000));
	ex_fill(p.base, p.t, (size_t)p.n, 2, 1);
	T_WEX(p.c, wex_publish(p.c, 2));
	T_ASSERT(sync_copy(&k[1], 2, 5000) == 0, "rank 1 takes v2: %s", wex_last_error(k[1].c));
	pthread_join(th, NULL);
	T_ASSERT(l.ret == 0, "rank 0's sync of v2: %s (%s)", wex_strerror(l.ret),
		 wex_last_error(k[0].c));
	printf("round: rank 0 passed the new wexd's round on v1; the trainer began v2 after %.0f ms; both ranks got v2\n",
	       (t_now() - t0) * 1000);
	for (uint32_t r = 0; r < 2; r++)
		t_cons_close(&k[r]);
	t_prod_close(&p);
}

static void down(void)
{
	int th0 = tasks(), fd0 = t_fd_count(getpid());
	struct t_prod p;
	double c0, t0, took;
	char err[512];
	int ret;

	t_prod_open(&p, MODEL, "tiny", 0, 1);
	T_ASSERT(tasks() == th0 + 1, "a producer client runs one thread (%d, not %d)", tasks(),
		 th0 + 1);
	t_prod_write(&p, 1);
	ret = wex_publish(p.c, 7); /* the caller's last error */
	T_ASSERT(ret == -EINVAL, "publish of a version not begun: %s", wex_strerror(ret));
	snprintf(err, sizeof(err), "%s", wex_last_error(p.c));
	t_wexd_kill(&d);
	c0 = cpu_s();
	usleep(1500000);
	T_ASSERT(cpu_s() - c0 < 0.2, "the watch spun while wexd was down: %.3f s of CPU in 1.5 s",
		 cpu_s() - c0);
	T_ASSERT(!strcmp(err, wex_last_error(p.c)), "the watch overwrote the caller's last error: '%s', was '%s'",
		 wex_last_error(p.c), err);
	t0 = t_now();
	t_prod_close(&p);
	took = t_now() - t0;
	T_ASSERT(took < 0.5, "wex_client_close took %.2f s with wexd down", took);
	T_ASSERT(tasks() == th0, "threads after close: %d, before the client %d", tasks(), th0);
	T_ASSERT(t_fd_count(getpid()) == fd0, "fds after close: %d, before the client %d",
		 t_fd_count(getpid()), fd0);
	printf("down: no spinning, the caller's error kept, close in %.3f s, no thread or fd left\n",
	       took);
	t_wexd_restart(&d);
}

static void fork_(void)
{
	int s0 = sockets();
	struct t_prod p;
	pid_t pid;

	t_prod_open(&p, MODEL, "tiny", 0, 1);
	t_prod_write(&p, 1);
	T_ASSERT(sockets() == s0 + 2, "a producer with its watch: %d sockets, not %d", sockets(),
		 s0 + 2);
	pid = t_fork();
	if (pid == 0) {
		int n = sockets();

		if (n != s0) {
			fprintf(stderr, "child: %d sockets, not %d\n", n, s0);
			_exit(1);
		}
		if (wex_publish(p.c, 2) != -ECHILD)
			_exit(2);
		wex_client_close(p.c);
		_exit(0);
	}
	T_ASSERT(t_wait(pid) == 0, "the forked child held a socket of the parent's client, or its copy did not refuse");
	t_prod_write(&p, 2);
	printf("fork: the child holds no socket of the producer's; the parent goes on\n");
	t_prod_close(&p);
}

int main(void)
{
	t_wexd_start(&d);
	idle(0);
	idle(WEX_CLIENT_NO_WATCH);
	writing();
	ranks();
	round_();
	down();
	fork_();
	t_wexd_stop(&d);
	printf("producer_watch: PASS\n");
	return 0;
}
