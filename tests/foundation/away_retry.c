/* SPDX-License-Identifier: MIT */
/*
 * away_retry - a begin_write or sync that finds no wexd (killed, the next
 * one not started) tries again until its timeout; meanwhile it ends as
 * every wait for wexd does:
 *  1. a signal whose handler runs (WEX_CLIENT_EINTR) ends it with -EINTR,
 *     well before its timeout (the retry's nap slept through signals, so
 *     Python's Ctrl-C waited out the whole timeout);
 *  2. wex_cancel from another thread ends it with -ECANCELED.
 * A publish while wexd is away is sent again to the next wexd, started
 * 300 ms later (it failed at once), and the consumer gets that version;
 * its tries end on a signal (-EINTR) or wex_cancel (-ECANCELED) too.
 * A wexd that takes connections but never answers (hung) holds a reconnect
 * in its hello, and one whose queue of connections is full holds it in
 * its connect: one signal, or one wex_cancel, ends a begin_write or sync
 * there too, well before the client's timeout (30 s; the wait for hello's
 * answer was 35 s, signals unseen), also while the producer's watch was
 * the one reconnecting (it gives its attempt up to the call); without
 * either, the call ends at its own timeout, not the client's.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "fixture.h"

static void on_usr1(int sig)
{
	(void)sig;
}

struct kick {
	pthread_t target;
	wex_client_t *cancel; /* NULL: signal the target instead */
	int once;             /* one kick only */
	atomic_int stop;
};

/* From 300 ms on, every 100 ms (one may come between two naps, where it
 * ends no wait): a signal to the target thread, or a wex_cancel. */
static void *kick_main(void *arg)
{
	struct kick *k = arg;

	usleep(300000);
	while (!atomic_load(&k->stop)) {
		if (k->cancel)
			wex_cancel(k->cancel);
		else
			pthread_kill(k->target, SIGUSR1);
		if (k->once)
			break;
		usleep(100000);
	}
	return NULL;
}

struct pub {
	struct t_prod *p;
	int ret;
};

static void *publish_main(void *arg)
{
	struct pub *u = arg;

	u->ret = wex_publish(u->p->c, 2);
	return NULL;
}

/* Op 0 begin_write, 1 sync, 2 publish of v2 while wexd is away, kicked
 * as kick_main does: ends with -EINTR (signals) or -ECANCELED (cancel),
 * well before its timeout (5 s of 8 s, 30 s for publish: room for a
 * loaded machine), not at it. */
static void kicked_n(wex_client_t *c, wex_client_t *cancel, int sync, int once)
{
	struct kick kk = { .target = pthread_self(), .cancel = cancel, .once = once };
	struct wex_sync_result r;
	pthread_t th;
	double t0 = t_now(), el;
	int ret, want = cancel ? -ECANCELED : -EINTR;

	T_ASSERT(pthread_create(&th, NULL, kick_main, &kk) == 0, "thread");
	ret = sync == 2 ? wex_publish(c, 2) :
	      sync	  ? wex_sync(c, WEX_SYNC_COPY, 2, 8000, &r) :
			    wex_begin_write(c, 2, 8000);
	el = t_now() - t0;
	atomic_store(&kk.stop, 1);
	pthread_join(th, NULL);
	printf("%s while wexd is away, %s: %s after %.2f s: %s\n",
	       sync == 2 ? "publish" : sync ? "sync" : "begin_write",
	       cancel ? (once ? "one wex_cancel" : "wex_cancel") : once ? "one signal" : "signals",
	       wex_strerror(ret), el, wex_last_error(c));
	T_ASSERT(ret == want && el < 5.0, "%s: %s after %.2f s, not %s at once",
		 sync == 2 ? "publish" : sync ? "sync" : "begin_write", wex_strerror(ret), el,
		 wex_strerror(want));
}

static void kicked(wex_client_t *c, wex_client_t *cancel, int sync)
{
	kicked_n(c, cancel, sync, 0);
}

/* A begin_write or sync (timeout 1.5 s) whose reconnect wexd does not
 * answer (want: -ETIMEDOUT), or whose connect finds no room in its queue
 * (-EAGAIN): ends at its own timeout, not the client's (30 s). */
static void timed_out(wex_client_t *c, int sync, int want)
{
	struct wex_sync_result r;
	double t0 = t_now(), el;
	int ret = sync ? wex_sync(c, WEX_SYNC_COPY, 2, 1500, &r) : wex_begin_write(c, 2, 1500);

	el = t_now() - t0;
	printf("%s while wexd is hung, timeout 1.5 s: %s after %.2f s: %s\n",
	       sync ? "sync" : "begin_write", wex_strerror(ret), el, wex_last_error(c));
	T_ASSERT(ret == want && el >= 1.4 && el < 5.0, "%s: %s after %.2f s, not %s at 1.5 s",
		 sync ? "sync" : "begin_write", wex_strerror(ret), el, wex_strerror(want));
}

/* A hung wexd at path: a listener that never accepts, with room for
 * `room` connections in its queue (*filler: the one that fills it). */
static int hung_listener(const char *path, int room, int *filler)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int lfd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);

	T_ASSERT(strlen(path) < sizeof(sa.sun_path), "%s: too long a socket path", path);
	memcpy(sa.sun_path, path, strlen(path) + 1);
	unlink(path);
	T_ASSERT(lfd >= 0 && bind(lfd, (struct sockaddr *)&sa, sizeof(sa)) == 0 &&
			 listen(lfd, room ? 16 : 0) == 0,
		 "a hung listener at %s: %s", path, strerror(errno));
	*filler = -1;
	if (!room) {
		*filler = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
		T_ASSERT(*filler >= 0 && connect(*filler, (struct sockaddr *)&sa, sizeof(sa)) == 0,
			 "filling the queue: %s", strerror(errno));
	}
	return lfd;
}

int main(void)
{
	struct sigaction sa = { .sa_handler = on_usr1 };
	struct wex_sync_result r;
	struct t_wexd d;
	struct t_prod p;
	struct t_cons k;

	sigemptyset(&sa.sa_mask);
	sigaction(SIGUSR1, &sa, NULL);
	t_client_flags = WEX_CLIENT_EINTR;
	t_tiny_v1(&d, &p, &k, "away");
	T_WEX(k.c, wex_sync(k.c, WEX_SYNC_COPY, 1, 5000, &r));
	t_wexd_kill(&d);

	kicked(p.c, NULL, 0);
	kicked(k.c, NULL, 1);
	kicked(p.c, p.c, 0);
	kicked(k.c, k.c, 1);
	T_ASSERT(!wex_is_dirty(k.c) && t_own_bad(&k, 1) == 0, "the consumer's v1 intact and clean");
	for (int room = 1; room >= 0; room--) {
		int filler, lfd = hung_listener(d.sock, room, &filler);

		printf("wexd hung, %s:\n", room ? "its hello unanswered" : "its queue full");
		/* One kick each, in hello's wait or the connect's naps (the
		 * producer's watch first holds a reconnect of its own). */
		usleep(1500000);
		kicked_n(p.c, NULL, 0, 1);
		kicked_n(k.c, NULL, 1, 1);
		kicked_n(p.c, p.c, 0, 1);
		kicked_n(k.c, k.c, 1, 1);
		timed_out(p.c, 0, room ? -ETIMEDOUT : -EAGAIN);
		timed_out(k.c, 1, room ? -ETIMEDOUT : -EAGAIN);
		if (filler >= 0)
			close(filler);
		close(lfd);
		unlink(d.sock);
	}
	T_ASSERT(!wex_is_dirty(k.c) && t_own_bad(&k, 1) == 0, "the consumer's v1 intact and clean");
	t_wexd_restart(&d);
	/* A publish while wexd is away is sent again to the next one (it
	 * failed at once with ENOENT or ECONNREFUSED). */
	T_WEX(p.c, wex_begin_write(p.c, 2, 5000));
	ex_fill(p.base, p.t, (size_t)p.n, 2, 1);
	t_wexd_kill(&d);
	/* Its tries (up to the client's timeout, 30 s here) end as a wait's
	 * do: they ran that long, whatever came. */
	kicked(p.c, NULL, 2);
	kicked(p.c, p.c, 2);
	{
		/* (wexd is started by this thread: it dies with the thread
		 * that started it, PR_SET_PDEATHSIG.) */
		struct pub u = { .p = &p, .ret = 1 };
		pthread_t th;

		T_ASSERT(pthread_create(&th, NULL, publish_main, &u) == 0, "thread");
		usleep(300000);
		t_wexd_restart(&d);
		pthread_join(th, NULL);
		T_ASSERT(u.ret == 0, "publish while wexd was away: %s: %s", wex_strerror(u.ret),
			 wex_last_error(p.c));
	}
	T_WEX(k.c, wex_sync(k.c, WEX_SYNC_COPY, 2, 5000, &r));
	T_ASSERT(r.version == 2 && t_own_bad(&k, 2) == 0, "v2 published across the restart, copied");
	t_cons_close(&k);
	t_prod_close(&p);
	t_wexd_stop(&d);
	return T_EXIT_PASS;
}
