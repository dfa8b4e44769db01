/* SPDX-License-Identifier: MIT */
/*
 * watch_lock - a producer's begin_write or publish that waits for the lock
 * its watch holds while re-registering with a wexd that stalls after
 * answering the watch's hello ends at a signal (WEX_CLIENT_EINTR: -EINTR)
 * or a wex_cancel (-ECANCELED), at once, instead of after the watch's
 * whole reconnect (each of its requests waits up to the client's timeout
 * plus 5 s: Python's Ctrl-C did nothing for 26 s in a review's test).  The
 * producer talks to wexd through a relay (t_relay) that cuts its
 * connection, then holds the requests the watch sends after its new
 * hello.  A call neither cancelled nor signalled waits for the watch, and
 * goes on once it is done (the relay lets the requests through at 1 s);
 * the engine then copies the version whole.  A producer without a watch
 * reconnects in its call: a signal or wex_cancel while that reconnect
 * registers again with a wexd that stalled after hello ends the call 3 s
 * later (HUNG_GRACE_MS; before, each request waited the client's timeout
 * plus 5 s), and the next call reconnects in full.
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
	wex_client_t *cancel; /* NULL: signal the target */
	struct t_relay *r;    /* non-NULL: let the stalled requests through */
	useconds_t at;
	atomic_int done;      /* (a lift: at once) */
};

static void *kick_main(void *arg)
{
	struct kick *k = arg;

	for (useconds_t t = 0; t < k->at && !atomic_load(&k->done); t += 10000)
		usleep(10000);
	if (k->r)
		atomic_store(&k->r->stall, 0);
	else if (k->cancel)
		wex_cancel(k->cancel);
	else
		pthread_kill(k->target, SIGUSR1);
	return NULL;
}

/* Cuts the producer's connection and waits until the watch reconnected
 * and is held after its hello. */
static void stall_watch(struct t_relay *r)
{
	atomic_store(&r->stalled, 0);
	atomic_store(&r->stall, 1);
	atomic_fetch_add(&r->cut, 1);
	for (int i = 0; i < 1000 && !atomic_load(&r->stalled); i++)
		usleep(10000);
	T_ASSERT(atomic_load(&r->stalled), "the watch did not reconnect within 10 s");
	usleep(50000); /* (its first registration sent, and held) */
}

/* One call (begin_write v, or publish v) with one kick at 0.3 s; a relay
 * held at most 8 s (then let through: a call that waits for the watch, or
 * for the answers held, ends then, and the test says so). */
static int kicked(struct t_relay *r, struct t_prod *p, int publish, uint64_t v, int cancel,
		  double *el)
{
	struct kick kk = { .target = pthread_self(), .cancel = cancel ? p->c : NULL, .at = 300000 };
	struct kick lift = { .r = r, .at = 8000000 };
	pthread_t th, tl;
	double t0 = t_now();
	int ret;

	T_ASSERT(pthread_create(&th, NULL, kick_main, &kk) == 0, "kick thread");
	T_ASSERT(pthread_create(&tl, NULL, kick_main, &lift) == 0, "lift thread");
	ret = publish ? wex_publish(p->c, v) : wex_begin_write(p->c, v, 20000);
	*el = t_now() - t0;
	pthread_join(th, NULL);
	atomic_store(&lift.done, 1);
	printf("%s v%llu, re-registering held, one %s at 0.3 s: %s after %.2f s: %s\n",
	       publish ? "publish" : "begin_write", (unsigned long long)v,
	       cancel ? "wex_cancel" : "signal", wex_strerror(ret), *el, wex_last_error(p->c));
	pthread_join(tl, NULL);
	return ret;
}

int main(void)
{
	struct sigaction sa = { .sa_handler = on_usr1 };
	struct wex_sync_result res;
	struct t_relay r;
	struct t_wexd d;
	struct t_prod p;
	struct t_cons k;
	struct kick lift;
	char path[sizeof(r.path)];
	pthread_t tl;
	double el, t0;
	int ret;

	sigemptyset(&sa.sa_mask);
	sigaction(SIGUSR1, &sa, NULL);
	t_client_flags = WEX_CLIENT_EINTR;
	t_wexd_start(&d);
	t_check_backend(d.sock);
	T_ASSERT(snprintf(path, sizeof(path), "%.*s.relay", (int)(sizeof(path) - 7), d.sock) <
			 (int)sizeof(path),
		 "relay socket path too long");
	t_relay_start(&r, d.sock, path);
	setenv("WEX_SOCKET", path, 1);
	t_prod_open(&p, "watchlock", "tiny", 0, 1);
	setenv("WEX_SOCKET", d.sock, 1);
	t_cons_open(&k, "watchlock", "g", "tiny", 0, 1);
	t_prod_write(&p, 1);
	T_WEX(k.c, wex_sync(k.c, WEX_SYNC_COPY, 1, 5000, &res));

	/* begin_write: a signal, then a wex_cancel. */
	stall_watch(&r);
	ret = kicked(&r, &p, 0, 2, 0, &el);
	T_ASSERT(ret == -EINTR && el >= 0.3 && el < 3.0,
		 "begin_write: %s after %.2f s, not -EINTR 0.3 to 3 s after its start",
		 wex_strerror(ret), el);
	stall_watch(&r);
	ret = kicked(&r, &p, 0, 2, 1, &el);
	T_ASSERT(ret == -ECANCELED && el >= 0.3 && el < 3.0,
		 "begin_write: %s after %.2f s, not -ECANCELED 0.3 to 3 s after its start",
		 wex_strerror(ret), el);

	/* Unkicked, it waits for the watch (let through at 1 s) and goes on. */
	stall_watch(&r);
	lift = (struct kick){ .r = &r, .at = 1000000 };
	T_ASSERT(pthread_create(&tl, NULL, kick_main, &lift) == 0, "lift thread");
	t0 = t_now();
	T_WEX(p.c, wex_begin_write(p.c, 2, 20000));
	el = t_now() - t0;
	pthread_join(tl, NULL);
	printf("begin_write v2, the watch held re-registering for 1 s: success after %.2f s\n", el);
	T_ASSERT(el >= 0.9, "begin_write v2 did not wait for the watch (%.2f s)", el);
	ex_fill(p.base, p.t, (size_t)p.n, 2, 1);

	/* publish: a signal, then a wex_cancel; then as asked. */
	stall_watch(&r);
	ret = kicked(&r, &p, 1, 2, 0, &el);
	T_ASSERT(ret == -EINTR && el >= 0.3 && el < 3.0,
		 "publish: %s after %.2f s, not -EINTR 0.3 to 3 s after its start",
		 wex_strerror(ret), el);
	stall_watch(&r);
	ret = kicked(&r, &p, 1, 2, 1, &el);
	T_ASSERT(ret == -ECANCELED && el >= 0.3 && el < 3.0,
		 "publish: %s after %.2f s, not -ECANCELED 0.3 to 3 s after its start",
		 wex_strerror(ret), el);
	T_WEX(p.c, wex_publish(p.c, 2));
	T_WEX(k.c, wex_sync(k.c, WEX_SYNC_COPY, 2, 5000, &res));
	T_ASSERT(res.version == 2 && t_own_bad(&k, 2) == 0, "v2 copied whole (got v%llu)",
		 (unsigned long long)res.version);
	printf("v2 published and copied whole\n");

	/* Without a watch: the call reconnects, and its registration is held. */
	{
		struct t_prod q;
		struct t_cons kq;

		t_client_flags = WEX_CLIENT_EINTR | WEX_CLIENT_NO_WATCH;
		setenv("WEX_SOCKET", path, 1);
		t_prod_open(&q, "watchlock2", "tiny", 0, 1);
		setenv("WEX_SOCKET", d.sock, 1);
		t_client_flags = WEX_CLIENT_EINTR;
		t_cons_open(&kq, "watchlock2", "g", "tiny", 0, 1);
		t_prod_write(&q, 1);
		for (int cancel = 0; cancel < 2; cancel++) {
			int pairs = atomic_load(&r.pairs);

			atomic_store(&r.stall, 1);
			atomic_fetch_add(&r.cut, 1);
			for (int i = 0; i < 500 && atomic_load(&r.pairs) >= pairs; i++)
				usleep(10000);
			ret = kicked(&r, &q, 0, 2, cancel, &el);
			T_ASSERT(ret == (cancel ? -ECANCELED : -EINTR) && el >= 3.2 && el < 7.0,
				 "begin_write reconnecting: %s after %.2f s, not %s 3.2 to 7 s after its start",
				 wex_strerror(ret), el, wex_strerror(cancel ? -ECANCELED : -EINTR));
			T_ASSERT(atomic_load(&r.stalled), "the relay held nothing");
		}
		t_prod_write(&q, 2);
		T_WEX(kq.c, wex_sync(kq.c, WEX_SYNC_COPY, 2, 5000, &res));
		T_ASSERT(res.version == 2 && t_own_bad(&kq, 2) == 0, "v2 copied whole (got v%llu)",
			 (unsigned long long)res.version);
		printf("without a watch: v2 written after reconnecting in full, copied whole\n");
		t_cons_close(&kq);
		t_prod_close(&q);
	}

	t_cons_close(&k);
	t_prod_close(&p);
	t_relay_stop(&r);
	t_wexd_stop(&d);
	return T_EXIT_PASS;
}
