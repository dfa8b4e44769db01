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
#include <string.h>

#include "fixture.h"

/* The relay lets the requests it held through. */
static void let_through(void *arg)
{
	atomic_store(&((struct t_relay *)arg)->stall, 0);
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

/* One call (begin_write v, or publish v) with one kick at 0.3 s (a signal,
 * or a wex_cancel), a relay held at most 8 s (then let through: a call
 * that waits for the watch, or for the answers held, ends then); it must
 * end with -EINTR or -ECANCELED min_s to max_s after its start. */
static void kicked(struct t_relay *r, struct t_prod *p, int publish, uint64_t v, int cancel,
		   double min_s, double max_s)
{
	int want = cancel ? -ECANCELED : -EINTR, ret;
	struct t_kick kk, lift;
	double t0 = t_now(), el;

	t_kick_start(&kk, 300000, cancel ? p->c : NULL, NULL, NULL);
	t_kick_start(&lift, 8000000, NULL, let_through, r);
	ret = publish ? wex_publish(p->c, v) : wex_begin_write(p->c, v, 20000);
	el = t_now() - t0;
	t_kick_join(&kk, 0);
	t_kick_join(&lift, 1);
	printf("%s v%llu, re-registering held, one %s at 0.3 s: %s after %.2f s: %s\n",
	       publish ? "publish" : "begin_write", (unsigned long long)v,
	       cancel ? "wex_cancel" : "signal", wex_strerror(ret), el, wex_last_error(p->c));
	T_ASSERT(ret == want && el >= min_s && el < max_s,
		 "%s: %s after %.2f s, not %s %.1f to %.1f s after its start",
		 publish ? "publish" : "begin_write", wex_strerror(ret), el, wex_strerror(want),
		 min_s, max_s);
}

int main(void)
{
	struct wex_sync_result res;
	struct t_relay r;
	struct t_wexd d;
	struct t_prod p, q;
	struct t_cons k, kq;
	struct t_kick lift;
	double el, t0;

	t_usr1_noop();
	t_client_flags = WEX_CLIENT_EINTR;
	t_relay_wexd(&d, &r);
	t_prod_open_relayed(&p, &d, &r, "watchlock", WEX_CLIENT_EINTR);
	t_cons_open(&k, "watchlock", "g", "tiny", 0, 1);
	t_prod_write(&p, 1);
	T_WEX(k.c, wex_sync(k.c, WEX_SYNC_COPY, 1, 5000, &res));

	/* begin_write: a signal, then a wex_cancel. */
	for (int cancel = 0; cancel < 2; cancel++) {
		stall_watch(&r);
		kicked(&r, &p, 0, 2, cancel, 0.3, 3.0);
	}

	/* Unkicked, it waits for the watch (let through at 1 s) and goes on. */
	stall_watch(&r);
	t_kick_start(&lift, 1000000, NULL, let_through, &r);
	t0 = t_now();
	T_WEX(p.c, wex_begin_write(p.c, 2, 20000));
	el = t_now() - t0;
	t_kick_join(&lift, 0);
	printf("begin_write v2, the watch held re-registering for 1 s: success after %.2f s\n", el);
	T_ASSERT(el >= 0.9, "begin_write v2 did not wait for the watch (%.2f s)", el);
	ex_fill(p.base, p.t, (size_t)p.n, 2, 1);

	/* publish: a signal, then a wex_cancel; then as asked. */
	for (int cancel = 0; cancel < 2; cancel++) {
		stall_watch(&r);
		kicked(&r, &p, 1, 2, cancel, 0.3, 3.0);
	}
	T_WEX(p.c, wex_publish(p.c, 2));
	T_WEX(k.c, wex_sync(k.c, WEX_SYNC_COPY, 2, 5000, &res));
	T_ASSERT(res.version == 2 && t_own_bad(&k, 2) == 0, "v2 copied whole (got v%llu)",
		 (unsigned long long)res.version);
	printf("v2 published and copied whole\n");

	/* Without a watch: the call reconnects, and its registration is held. */
	t_prod_open_relayed(&q, &d, &r, "watchlock2", WEX_CLIENT_EINTR | WEX_CLIENT_NO_WATCH);
	t_cons_open(&kq, "watchlock2", "g", "tiny", 0, 1);
	t_prod_write(&q, 1);
	for (int cancel = 0; cancel < 2; cancel++) {
		int pairs = atomic_load(&r.pairs);

		atomic_store(&r.stall, 1);
		atomic_fetch_add(&r.cut, 1);
		for (int i = 0; i < 500 && atomic_load(&r.pairs) >= pairs; i++)
			usleep(10000);
		kicked(&r, &q, 0, 2, cancel, 3.2, 7.0);
		T_ASSERT(atomic_load(&r.stalled), "the relay held nothing");
	}
	t_prod_write(&q, 2);
	T_WEX(kq.c, wex_sync(kq.c, WEX_SYNC_COPY, 2, 5000, &res));
	T_ASSERT(res.version == 2 && t_own_bad(&kq, 2) == 0, "v2 copied whole (got v%llu)",
		 (unsigned long long)res.version);
	printf("without a watch: v2 written after reconnecting in full, copied whole\n");
	t_cons_close(&kq);
	t_prod_close(&q);

	t_cons_close(&k);
	t_prod_close(&p);
	t_relay_stop(&r);
	t_wexd_stop(&d);
	return T_EXIT_PASS;
}
