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
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#include "fixture.h"

static void on_usr1(int sig)
{
	(void)sig;
}

struct kick {
	pthread_t target;
	wex_client_t *cancel; /* NULL: signal the target instead */
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
static void kicked(wex_client_t *c, wex_client_t *cancel, int sync)
{
	struct kick kk = { .target = pthread_self(), .cancel = cancel };
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
	       sync == 2 ? "publish" : sync ? "sync" : "begin_write", cancel ? "wex_cancel" : "signals",
	       wex_strerror(ret), el, wex_last_error(c));
	T_ASSERT(ret == want && el < 5.0, "%s: %s after %.2f s, not %s at once",
		 sync == 2 ? "publish" : sync ? "sync" : "begin_write", wex_strerror(ret), el,
		 wex_strerror(want));
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
