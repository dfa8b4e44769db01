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
 *  - split: with no restart, a rank that holds nothing does not pass its
 *    group's round on v1 by asking for v2: the trainer's begin_write of
 *    v2 stays refused (EBUSY), the group stays on one version;
 *  - lost: a rank that passed a round is not counted among the ranks
 *    holding it when the producer's memory goes (only a rank that took it
 *    is): once those sync again, the others are served, not refused
 *    (ESTALE) for the passer waiting on;
 *  - hung: wexd replaced by a listener that never answers: fork() and
 *    wex_client_close return at once while the watch waits on it;
 *  - flapping: a daemon that takes the whole reconnect and then hangs up
 *    at once is not reconnected to in a loop (the waits grow); one that
 *    hangs up at the re-begin of a write leaves the write going on, so
 *    the publish works at the real wexd after;
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
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fixture.h"
#include "ipc/sock.h"

#define MODEL "watch"
/* A sync that waits for the producer's watch to bring its version back to
 * a restarted wexd: the watch retries at least once a second and its
 * reconnect is a few round trips, but a loaded machine (the sanitizer
 * build beside other tests) may take seconds; without the watch the sync
 * times out however long it waits. */
#define RESTORE_MS 20000

static struct t_wexd d;

/* The threads of this process not in old[0..nold) (tids), counted; with
 * out, the tids of all of them, at most WEX_T_TIDS.  Told by id: a thread
 * joined before may still be listed a moment after pthread_join returns
 * (the kernel wakes the joiner on its way out; later still on a loaded
 * machine), and must count neither way. */
#define WEX_T_TIDS 64

static int tasks_new(const int *old, int nold, int *out)
{
	DIR *dir = opendir("/proc/self/task");
	struct dirent *e;
	int n = 0;

	T_ASSERT(dir != NULL, "opendir /proc/self/task: %s", strerror(errno));
	while ((e = readdir(dir))) {
		int tid = atoi(e->d_name), i;

		if (e->d_name[0] == '.')
			continue;
		for (i = 0; i < nold && old[i] != tid; i++)
			;
		if (i < nold)
			continue;
		if (out && n < WEX_T_TIDS)
			out[n] = tid;
		n++;
	}
	closedir(dir);
	return n;
}

/* tasks_new(old, nold), once it is 0 or after 10 s. */
static int tasks_gone(const int *old, int nold)
{
	int n = tasks_new(old, nold, NULL);

	for (double t0 = t_now(); n && t_now() - t0 < 10.0;) {
		usleep(10000);
		n = tasks_new(old, nold, NULL);
	}
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

/* A producer rank with v1 published and consumer group "g" of `world`
 * ranks, all reading producer rank 0; the first `take` ranks took v1. */
static void group_open(struct t_prod *p, struct t_cons *k, uint32_t world, uint32_t take)
{
	t_prod_open(p, MODEL, "tiny", 0, 1);
	for (uint32_t r = 0; r < world; r++)
		t_cons_open_from(&k[r], MODEL, "g", "tiny", r, world, 0);
	t_prod_write(p, 1);
	for (uint32_t r = 0; r < take; r++)
		T_ASSERT(sync_copy(&k[r], 1, 5000) == 0, "rank %u takes v1: %s", r,
			 wex_last_error(k[r].c));
}

static void group_close(struct t_prod *p, struct t_cons *k, uint32_t world)
{
	for (uint32_t r = 0; r < world; r++)
		t_cons_close(&k[r]);
	t_prod_close(p);
}

/* The model's "restored" in wexd's status (-1: no such model). */
static int restored(void)
{
	json_t *st = t_status(d.sock), *m = t_status_model(st, MODEL);
	int r = m ? json_is_true(json_object_get(m, "restored")) : -1;

	json_decref(st);
	return r;
}

static void idle(uint32_t flags)
{
	struct t_prod p;
	struct t_cons k;
	double t0;
	int ret;

	t_client_flags = flags;
	t_prod_open(&p, MODEL, "tiny", 0, 1);
	t_client_flags = 0;
	t_prod_write(&p, 1);
	t_cons_open(&k, MODEL, "g", "tiny", 0, 1); /* attached, not synced */
	restart();
	t0 = t_now();
	ret = sync_copy(&k, 1, flags ? 1000 : RESTORE_MS);
	if (!flags) {
		T_ASSERT(ret == 0, "with the watch, v1 not served after a restart with the trainer idle: %s (%s)",
			 wex_strerror(ret), wex_last_error(k.c));
		printf("idle: the engine's sync of v1 returned %.1f ms after the new wexd was ready\n",
		       (t_now() - t0) * 1000);
		T_ASSERT(restored() == 1, "status does not say v1 was restored");
		/* The trainer's next step goes on as if nothing happened. */
		t_prod_write(&p, 2);
		T_ASSERT(sync_copy(&k, 2, 5000) == 0, "v2 after the restart: %s", wex_last_error(k.c));
		T_ASSERT(restored() == 0, "status says v2, published anew, was restored");
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
	T_ASSERT(sync_copy(&k, 1, RESTORE_MS) == 0, "v1 of two idle producer ranks after a restart: %s",
		 wex_last_error(k.c));
	printf("ranks: v1 of two idle producer ranks served after a restart\n");
	t_cons_close(&k);
	for (uint32_t r = 0; r < 2; r++)
		t_prod_close(&p[r]);
}

struct later {
	struct t_cons *k;
	uint64_t v;
	uint32_t timeout_ms; /* 0: 30 s */
	int ret;
	pthread_t th;
};

static void *sync_later_main(void *arg)
{
	struct later *l = arg;

	l->ret = sync_copy(l->k, l->v, l->timeout_ms ? l->timeout_ms : 30000);
	return NULL;
}

static void sync_later(struct later *l)
{
	T_ASSERT(pthread_create(&l->th, NULL, sync_later_main, l) == 0, "pthread_create");
}

/* Until n consumers wait in acquire at wexd (wexctl clients), for 30 s at
 * most. */
static void until_waiting(int n)
{
	wex_client_t *a = t_open(WEX_ROLE_ADMIN, NULL, NULL, 0, 1);

	for (double t0 = t_now();;) {
		char *js = NULL;
		json_t *j, *cl;
		size_t k;
		int w = 0;

		T_WEX(a, wex_request(a, "clients", NULL, &js));
		j = json_loads(js, 0, NULL);
		free(js);
		json_array_foreach(json_object_get(j, "clients"), k, cl)
			w += !strcmp(json_string_value(json_object_get(cl, "waiting")) ?: "", "acquire");
		json_decref(j);
		if (w >= n)
			break;
		T_ASSERT(t_now() - t0 < 30.0, "%d consumer(s) wait in acquire, not %d", w, n);
		usleep(10000);
	}
	wex_client_close(a);
}

static void round_(void)
{
	struct t_prod p;
	struct t_cons k[2];
	struct later l;
	double t0;

	group_open(&p, k, 2, 1);
	restart();
	T_ASSERT(sync_copy(&k[1], 1, RESTORE_MS) == 0, "rank 1 takes v1 from the new wexd: %s",
		 wex_last_error(k[1].c));
	l = (struct later){ .k = &k[0], .v = 2 };
	sync_later(&l);
	until_waiting(1); /* rank 0's sync of v2 waits at wexd */
	t0 = t_now();
	T_WEX(p.c, wex_begin_write(p.c, 2, 3000));
	ex_fill(p.base, p.t, (size_t)p.n, 2, 1);
	T_WEX(p.c, wex_publish(p.c, 2));
	T_ASSERT(sync_copy(&k[1], 2, 5000) == 0, "rank 1 takes v2: %s", wex_last_error(k[1].c));
	pthread_join(l.th, NULL);
	T_ASSERT(l.ret == 0, "rank 0's sync of v2: %s (%s)", wex_strerror(l.ret),
		 wex_last_error(k[0].c));
	printf("round: rank 0 passed the new wexd's round on v1; the trainer began v2 after %.0f ms; both ranks got v2\n",
	       (t_now() - t0) * 1000);
	group_close(&p, k, 2);
}

static void split(void)
{
	struct t_prod p;
	struct t_cons k[2];
	struct later l;
	int ret;

	group_open(&p, k, 2, 1);
	/* Rank 1's sync must still wait when until_waiting looks and when
	 * the trainer asks: 5 s, for a loaded machine. */
	l = (struct later){ .k = &k[1], .v = 2, .timeout_ms = 5000 };
	sync_later(&l);
	until_waiting(1);
	ret = wex_begin_write(p.c, 2, 300);
	T_ASSERT(ret == -EBUSY, "a rank holding nothing passed its group's round on v1: begin_write v2 %s (%s)",
		 wex_strerror(ret), wex_last_error(p.c));
	pthread_join(l.th, NULL);
	T_ASSERT(l.ret == -ETIMEDOUT, "rank 1's sync of v2 with v1 open to it: %s",
		 wex_strerror(l.ret));
	printf("split: a rank holding nothing does not pass the round (begin_write v2: EBUSY)\n");
	group_close(&p, k, 2);
}

/* Rank 0 passes the new wexd's round on the restored v1 (rank 1 took it
 * there) and waits for v2; the trainer restarts (its memory goes, the
 * round with it): rank 1 holds v1 of the lost round, rank 0 nothing of
 * it.  Once rank 1 syncs again, ranks 2 and 3 are not refused (ESTALE)
 * on rank 0's account, and all get v2. */
static void lost(void)
{
	struct t_prod p;
	struct t_cons k[4];
	struct later l[4];

	group_open(&p, k, 4, 4);
	restart();
	T_ASSERT(sync_copy(&k[1], 1, RESTORE_MS) == 0, "rank 1 takes the restored v1: %s",
		 wex_last_error(k[1].c));
	l[0] = (struct later){ .k = &k[0], .v = 2 };
	sync_later(&l[0]);
	until_waiting(1);
	t_prod_close(&p);
	l[1] = (struct later){ .k = &k[1], .v = 2 };
	sync_later(&l[1]); /* rank 1 moves on from the lost round */
	until_waiting(2);
	for (uint32_t r = 2; r < 4; r++) {
		l[r] = (struct later){ .k = &k[r], .v = 2 };
		sync_later(&l[r]);
	}
	until_waiting(4);
	t_prod_open(&p, MODEL, "tiny", 0, 1);
	t_prod_write(&p, 2);
	for (uint32_t r = 0; r < 4; r++) {
		pthread_join(l[r].th, NULL);
		T_ASSERT(l[r].ret == 0, "rank %u's sync of v2: %s (%s)", r, wex_strerror(l[r].ret),
			 wex_last_error(k[r].c));
	}
	printf("lost: the rank that passed the lost round is not held against its peers\n");
	group_close(&p, k, 4);
}

/* Rank 0 took v1 and waits for v2 (its peer has not taken v1) when the
 * trainer restarts: it holds v1 of a lost round until its wait gets v2,
 * and then no more: rank 1 is served v2, not refused on its account. */
static void lost_grant(void)
{
	struct t_prod p;
	struct t_cons k[2];
	struct later l;

	group_open(&p, k, 2, 1);
	l = (struct later){ .k = &k[0], .v = 2 };
	sync_later(&l);
	until_waiting(1);
	t_prod_close(&p);
	t_prod_open(&p, MODEL, "tiny", 0, 1);
	t_prod_write(&p, 2);
	pthread_join(l.th, NULL);
	T_ASSERT(l.ret == 0, "rank 0's sync of v2: %s (%s)", wex_strerror(l.ret),
		 wex_last_error(k[0].c));
	T_ASSERT(sync_copy(&k[1], 2, 5000) == 0, "rank 1 refused for rank 0, which holds v2 now: %s",
		 wex_last_error(k[1].c));
	printf("lost_grant: a rank of a lost round that got a newer version while waiting is not held against its peers\n");
	group_close(&p, k, 2);
}

/* A stand-in for wexd on its socket, on a thread: `answer` 0 never reads
 * (connections wait in its backlog; -1: a backlog already full); else it
 * answers every request "ok"
 * and hangs up after answering an op named `hang_after`, or instead of
 * answering one named `hang_at`.  Counts connections, and hang-ups at
 * `hang_at`. */
static struct fake {
	int lfd, answer;
	const char *hang_after, *hang_at;
	atomic_int stop, conns, hung_at;
	pthread_t th;
} fk;

static void *fake_main(void *arg)
{
	(void)arg;
	while (!atomic_load(&fk.stop)) {
		struct pollfd pl = { .fd = fk.lfd, .events = POLLIN };
		int fd;

		if (poll(&pl, 1, 50) <= 0)
			continue;
		fd = accept4(fk.lfd, NULL, NULL, SOCK_CLOEXEC);
		if (fd < 0)
			continue;
		atomic_fetch_add(&fk.conns, 1);
		for (;;) {
			char op[64];

			if (t_stand_in_request(fd, &fk.stop, NULL, op, sizeof(op)) < 0)
				break;
			if (fk.hang_at && !strcmp(op, fk.hang_at)) {
				atomic_fetch_add(&fk.hung_at, 1);
				break;
			}
			wex_sock_send(fd, "{\"ok\": true}", 12, NULL, 0, 0);
			if (fk.hang_after && !strcmp(op, fk.hang_after))
				break;
		}
		close(fd);
	}
	return NULL;
}

static void fake_start(int answer, const char *hang_after, const char *hang_at)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };

	unlink(d.sock);
	fk = (struct fake){ .answer = answer, .hang_after = hang_after, .hang_at = hang_at };
	atomic_init(&fk.stop, 0);
	atomic_init(&fk.conns, 0);
	atomic_init(&fk.hung_at, 0);
	T_ASSERT(strlen(d.sock) < sizeof(sa.sun_path), "socket path too long: %s", d.sock);
	memcpy(sa.sun_path, d.sock, strlen(d.sock) + 1);
	fk.lfd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	T_ASSERT(fk.lfd >= 0 && bind(fk.lfd, (struct sockaddr *)&sa, sizeof(sa)) == 0 &&
		 listen(fk.lfd, answer < 0 ? 0 : 16) == 0, "fake listener on %s: %s", d.sock,
		 strerror(errno));
	if (answer > 0)
		T_ASSERT(pthread_create(&fk.th, NULL, fake_main, NULL) == 0, "pthread_create");
}

static void fake_stop(void)
{
	if (fk.answer > 0) {
		atomic_store(&fk.stop, 1);
		pthread_join(fk.th, NULL);
	}
	close(fk.lfd);
	unlink(d.sock);
}

static void hung(void)
{
	struct t_prod p;
	double t0, took;
	pid_t pid;

	t_prod_open(&p, MODEL, "tiny", 0, 1);
	t_prod_write(&p, 1);
	t_wexd_kill(&d);
	fake_start(0, NULL, NULL);
	{
		/* The watch connects and waits for hello's answer. */
		struct pollfd pl = { .fd = fk.lfd, .events = POLLIN };

		T_ASSERT(poll(&pl, 1, 5000) == 1, "the watch never connected to the hung stand-in");
		usleep(50000);
	}
	t0 = t_now();
	pid = t_fork();
	if (pid == 0)
		_exit(0);
	took = t_now() - t0;
	T_ASSERT(t_wait(pid) == 0, "child");
	/* Waiting for the watch would take its hello's 35 s (the client's
	 * 30 s timeout and the reply margin): 5 s leaves a loaded machine
	 * room for fork() and close themselves. */
	T_ASSERT(took < 5.0, "fork() waited %.2f s for the watch's hello to a hung wexd", took);
	t0 = t_now();
	t_prod_close(&p);
	T_ASSERT(t_now() - t0 < 5.0, "wex_client_close waited %.2f s for a hung wexd", t_now() - t0);
	printf("hung: fork() in %.3f s and close in %.3f s while the watch waits on a hung wexd\n",
	       took, t_now() - t0);
	fake_stop();
	t_wexd_restart(&d);

	/* A hung wexd whose queue is full: the watch never waits for room
	 * (close could not stop it there). */
	t_prod_open(&p, MODEL, "tiny", 0, 1);
	t_prod_write(&p, 1);
	t_wexd_kill(&d);
	fake_start(-1, NULL, NULL);
	{
		int filler = wex_sock_connect(d.sock);

		T_ASSERT(filler >= 0, "filling the stand-in's queue: %s", strerror(-filler));
		usleep(300000); /* the watch tries, and finds no room */
		t0 = t_now();
		t_prod_close(&p);
		took = t_now() - t0;
		close(filler);
	}
	/* (Waiting for room would be for ever.) */
	T_ASSERT(took < 5.0, "wex_client_close waited %.2f s for room in a hung wexd's queue", took);
	printf("hung: close in %.3f s while a hung wexd's queue is full\n", took);
	fake_stop();
	t_wexd_restart(&d);
}

static void flapping(void)
{
	struct t_prod p;
	int ret;

	/* The whole reconnect taken, then a hang-up, again and again. */
	t_prod_open(&p, MODEL, "tiny", 0, 1);
	t_prod_write(&p, 1);
	t_wexd_kill(&d);
	fake_start(1, "publish", NULL);
	/* At most 12 in 2 s (the waits grow: 20 ms doubling to 1 s; a
	 * loaded machine only makes fewer); at least 2 however long a loaded
	 * machine takes for them (30 s at most). */
	usleep(2000000);
	ret = atomic_load(&fk.conns);
	T_ASSERT(ret <= 12, "%d reconnects in 2 s to a daemon that hangs up after each (the waits do not grow)",
		 ret);
	printf("flapping: %d reconnects in 2 s to a daemon hanging up after each\n", ret);
	for (double t0 = t_now(); atomic_load(&fk.conns) < 2 && t_now() - t0 < 30.0;)
		usleep(10000);
	ret = atomic_load(&fk.conns);
	T_ASSERT(ret >= 2, "%d reconnect(s) to a daemon that hangs up after each (no retry)", ret);
	fake_stop();
	t_wexd_restart(&d);
	t_prod_close(&p);

	/* A hang-up at the re-begin of a write: the write goes on. */
	t_prod_open(&p, MODEL, "tiny", 0, 1);
	t_prod_write(&p, 1);
	T_WEX(p.c, wex_begin_write(p.c, 2, 5000));
	t_wexd_kill(&d);
	fake_start(1, NULL, "begin_write");
	for (double t0 = t_now(); !atomic_load(&fk.hung_at) && t_now() - t0 < 30.0;)
		usleep(10000);
	T_ASSERT(atomic_load(&fk.hung_at) >= 1,
		 "the watch never reached the stand-in's hang-up at begin_write (%d connection(s))",
		 atomic_load(&fk.conns));
	fake_stop();
	t_wexd_restart(&d);
	ex_fill(p.base, p.t, (size_t)p.n, 2, 1);
	ret = wex_publish(p.c, 2);
	T_ASSERT(ret == 0, "publish v2 after a daemon hung up at its re-begin: %s (%s)",
		 wex_strerror(ret), wex_last_error(p.c));
	printf("flapping: a write whose re-begin met a hang-up goes on and publishes\n");
	t_prod_close(&p);
}

static void down(void)
{
	int th0[WEX_T_TIDS], nth0 = tasks_new(NULL, 0, th0), fd0 = t_fd_count(getpid());
	struct t_prod p;
	double c0, t0, took;
	char err[512];
	int ret;

	t_prod_open(&p, MODEL, "tiny", 0, 1);
	T_ASSERT(nth0 <= WEX_T_TIDS, "%d threads before the client", nth0);
	ret = tasks_new(th0, nth0, NULL);
	T_ASSERT(ret == 1, "a producer client runs one thread (%d new)", ret);
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
	ret = tasks_gone(th0, nth0);
	T_ASSERT(ret == 0, "threads after close: %d not there before the client", ret);
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
	split();
	lost();
	lost_grant();
	hung();
	flapping();
	down();
	fork_();
	t_wexd_stop(&d);
	printf("producer_watch: PASS\n");
	return 0;
}
