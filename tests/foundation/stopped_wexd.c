/* SPDX-License-Identifier: MIT */
/*
 * stopped_wexd - a wexd that stops answering on a live connection
 * (SIGSTOP here; a deadlock alike) does not hold a caller past a signal
 * or a wex_cancel by more than 3 s (HUNG_GRACE_MS): one wex_cancel ends
 * a sync's wait (-ECANCELED) 3 s after it (wexd never answers the cancel
 * it is sent); with WEX_CLIENT_EINTR, one signal ends a publish 3 s after
 * it (-EINTR: a request that has no cancel), and a segment allocation
 * that must reconnect first (its hello queued, unanswered; the producer's
 * watch, waiting on its own hello, gives way) likewise; a sync that
 * must reconnect first ends at the signal itself (its hello is a wait
 * the call gives up, away_retry).  Each drops its connection.
 * Before, each waited for its request's timeout plus 5 s, signals unseen
 * (Ctrl-C in Python did nothing for that long).  Once wexd goes on
 * (SIGCONT), the producer publishes the version it had begun and the
 * consumer gets it, every byte.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
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
};

/* One kick at 300 ms: a signal to the target thread, or a wex_cancel. */
static void *kick_main(void *arg)
{
	struct kick *k = arg;

	usleep(300000);
	if (k->cancel)
		wex_cancel(k->cancel);
	else
		pthread_kill(k->target, SIGUSR1);
	return NULL;
}

enum { SYNC, PUBLISH, SEGMENT };

static const char *op_name(int op)
{
	return op == SYNC ? "sync" : op == PUBLISH ? "publish" : "segment_alloc (reconnecting)";
}

/* min_s: when it may end at the earliest (3 s after the kick at 0.3 s,
 * or at the kick). */
static void kicked(struct t_prod *p, struct t_cons *k, int op, int cancel, double min_s)
{
	wex_client_t *c = op == SYNC ? k->c : p->c;
	struct kick kk = { .target = pthread_self(), .cancel = cancel ? c : NULL };
	struct wex_sync_result r;
	void *base;
	uint32_t id;
	pthread_t th;
	double t0 = t_now(), el;
	int ret, want = cancel ? -ECANCELED : -EINTR;

	T_ASSERT(pthread_create(&th, NULL, kick_main, &kk) == 0, "thread");
	ret = op == SYNC    ? wex_sync(c, WEX_SYNC_COPY, 2, 20000, &r) :
	      op == PUBLISH ? wex_publish(c, 2) :
			      wex_segment_alloc(c, WEX_SEG_HOST, 0, 4096, &id, &base);
	el = t_now() - t0;
	pthread_join(th, NULL);
	printf("%s, wexd stopped, one %s at 0.3 s: %s after %.2f s: %s\n", op_name(op),
	       cancel ? "wex_cancel" : "signal", wex_strerror(ret), el, wex_last_error(c));
	T_ASSERT(ret == want && el >= min_s && el < 8.0,
		 "%s: %s after %.2f s, not %s %.1f to 8 s after its start", op_name(op),
		 wex_strerror(ret), el, wex_strerror(want), min_s);
}

int main(void)
{
	struct sigaction sa = { .sa_handler = on_usr1 };
	struct wex_sync_result r;
	struct t_wexd d;
	struct t_prod p;
	struct t_cons k;
	double t0;
	int ret;

	sigemptyset(&sa.sa_mask);
	sigaction(SIGUSR1, &sa, NULL);
	t_client_flags = WEX_CLIENT_EINTR;
	t_tiny_v1(&d, &p, &k, "stopped");
	T_WEX(k.c, wex_sync(k.c, WEX_SYNC_COPY, 1, 5000, &r));
	T_WEX(p.c, wex_begin_write(p.c, 2, 5000));
	ex_fill(p.base, p.t, (size_t)p.n, 2, 1);
	T_ASSERT(kill(d.pid, SIGSTOP) == 0, "SIGSTOP wexd: %s", strerror(errno));

	kicked(&p, &k, SYNC, 1, 3.3);
	kicked(&p, &k, SYNC, 0, 0.3); /* its connection went with the first */
	kicked(&p, &k, PUBLISH, 0, 3.3);
	kicked(&p, &k, SEGMENT, 0, 3.3); /* its connection went with the publish */

	T_ASSERT(kill(d.pid, SIGCONT) == 0, "SIGCONT wexd: %s", strerror(errno));
	t0 = t_now();
	ret = wex_publish(p.c, 2);
	T_ASSERT(ret == 0, "publish v2 once wexd goes on: %s: %s", wex_strerror(ret),
		 wex_last_error(p.c));
	T_WEX(k.c, wex_sync(k.c, WEX_SYNC_COPY, 2, 5000, &r));
	T_ASSERT(r.version == 2 && t_own_bad(&k, 2) == 0, "v2 copied whole after wexd went on");
	printf("wexd went on: v2 published and copied in %.2f s\n", t_now() - t0);
	t_cons_close(&k);
	t_prod_close(&p);
	t_wexd_stop(&d);
	return T_EXIT_PASS;
}
