/* SPDX-License-Identifier: MIT */
/*
 * publish_answer - a publish that wexd carried out but whose answer the
 * producer never had is found published when the producer reconnects,
 * not lost.  The producer talks to wexd through a relay (t_relay: threads
 * that pass every message and fd both ways) that swallows wexd's answer
 * to one publish: the call waits, a signal (WEX_CLIENT_EINTR) or a
 * wex_cancel gives wexd 3 s more, then the connection is dropped and the
 * call ends (-EINTR, -ECANCELED).  wexd published the version and, with
 * the producer's connection gone, serves it to nobody.  Called again, the
 * publish reconnects, finds the version published (hello's answer), the
 * rank says it holds it, and the call succeeds: both engine groups (which
 * keep the model in wexd throughout) then copy the version whole; a
 * begin_write of it again (a trainer retrying the step) says it is
 * published already (-EALREADY), not wexd's "must exceed".  Before,
 * the reconnect began the write again, wexd refused it ("must exceed
 * published v2"), the publish failed ("wexd restarted during the write of
 * v2 and refused to let it go on"), and no engine got v2.
 */
#include <errno.h>
#include <string.h>

#include "fixture.h"

/* Publishes v with wexd's answer swallowed and one kick at 0.3 s: the call
 * must end 3 s after it (want), then succeed when called again (or, with
 * rewrite, a begin_write of v again says v is published already); both
 * groups then copy v whole. */
static void lost_answer(struct t_relay *r, struct t_prod *p, struct t_cons *k, int nk, uint64_t v,
			int cancel, int rewrite)
{
	struct t_kick kk;
	int want = cancel ? -ECANCELED : -EINTR, ret, before = atomic_load(&r->swallowed);
	struct wex_sync_result res;
	double t0, el;

	T_WEX(p->c, wex_begin_write(p->c, v, 5000));
	ex_fill(p->base, p->t, (size_t)p->n, v, 1);
	atomic_store(&r->swallow, 1);
	t_kick_start(&kk, 300000, cancel ? p->c : NULL, NULL, NULL);
	t0 = t_now();
	ret = wex_publish(p->c, v);
	el = t_now() - t0;
	t_kick_join(&kk, 0);
	printf("publish v%llu, its answer swallowed, one %s at 0.3 s: %s after %.2f s: %s\n",
	       (unsigned long long)v, cancel ? "wex_cancel" : "signal", wex_strerror(ret), el,
	       wex_last_error(p->c));
	T_ASSERT(atomic_load(&r->swallowed) == before + 1, "the relay swallowed no answer");
	T_ASSERT(ret == want && el >= 3.2 && el < 8.0, "publish v%llu: %s after %.2f s, not %s 3.2 to 8 s after its start",
		 (unsigned long long)v, wex_strerror(ret), el, wex_strerror(want));

	/* wexd published it: the producer's connection went, and with it the
	 * memory wexd could serve. */
	t0 = t_now();
	ret = rewrite ? wex_begin_write(p->c, v, 5000) : wex_publish(p->c, v);
	printf("%s v%llu again: %s after %.2f s%s%s\n", rewrite ? "begin_write" : "publish",
	       (unsigned long long)v, wex_strerror(ret), t_now() - t0, ret ? ": " : "",
	       ret ? wex_last_error(p->c) : "");
	T_ASSERT(ret == (rewrite ? -EALREADY : 0), "%s v%llu again: %s: %s",
		 rewrite ? "begin_write" : "publish", (unsigned long long)v, wex_strerror(ret),
		 wex_last_error(p->c));
	T_ASSERT(!rewrite || strstr(wex_last_error(p->c), "is published already"),
		 "begin_write v%llu again does not say it is published: %s", (unsigned long long)v,
		 wex_last_error(p->c));
	for (int i = 0; i < nk; i++) {
		T_WEX(k[i].c, wex_sync(k[i].c, WEX_SYNC_COPY, v, 5000, &res));
		T_ASSERT(res.version == v && t_own_bad(&k[i], v) == 0,
			 "group %d: v%llu copied whole (got v%llu)", i, (unsigned long long)v,
			 (unsigned long long)res.version);
	}
	printf("v%llu copied whole by both groups\n", (unsigned long long)v);
}

int main(void)
{
	struct wex_sync_result res;
	struct t_cons k[2];
	struct t_relay r;
	struct t_wexd d;
	struct t_prod p;

	t_usr1_noop();
	t_client_flags = WEX_CLIENT_EINTR;
	t_relay_wexd(&d, &r);
	t_prod_open_relayed(&p, &d, &r, "answer", WEX_CLIENT_EINTR);
	t_cons_open(&k[0], "answer", "g", "tiny", 0, 1);
	t_cons_open(&k[1], "answer", "g2", "tiny", 0, 1);
	t_prod_write(&p, 1);
	for (int i = 0; i < 2; i++)
		T_WEX(k[i].c, wex_sync(k[i].c, WEX_SYNC_COPY, 1, 5000, &res));

	lost_answer(&r, &p, k, 2, 2, 0, 0);
	lost_answer(&r, &p, k, 2, 3, 1, 1);
	/* And the next step goes as usual. */
	t_prod_write(&p, 4);
	for (int i = 0; i < 2; i++) {
		T_WEX(k[i].c, wex_sync(k[i].c, WEX_SYNC_COPY, 4, 5000, &res));
		T_ASSERT(res.version == 4 && t_own_bad(&k[i], 4) == 0, "v4 copied whole");
	}
	/* A write of v4 again (a caller whose runtime raised as a publish
	 * that succeeded returned: Python's Ctrl-C) says it is published. */
	T_ASSERT(wex_begin_write(p.c, 4, 5000) == -EALREADY &&
			 strstr(wex_last_error(p.c), "this rank's last publish was of it"),
		 "begin_write v4 after publishing it: %s", wex_last_error(p.c));
	printf("begin_write v4 after publishing it: %s\n", wex_last_error(p.c));
	t_cons_close(&k[1]);
	t_cons_close(&k[0]);
	t_prod_close(&p);
	t_relay_stop(&r);
	t_wexd_stop(&d);
	return T_EXIT_PASS;
}
