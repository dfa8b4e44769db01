/* SPDX-License-Identifier: MIT */
/*
 * stopped_wexd - a wexd that stops answering on a live connection
 * (SIGSTOP here; a deadlock alike) does not hold a caller past a signal
 * or a wex_cancel by more than 3 s (HUNG_GRACE_MS) where dropping the
 * connection loses nothing asked: one wex_cancel ends a sync's wait
 * (-ECANCELED) 3 s after it (wexd never answers the cancel it is sent),
 * and so does one signal (-EINTR, WEX_CLIENT_EINTR: it sends the same
 * cancel); one signal ends a request that must reconnect
 * first 3 s after it (-EINTR: its hello queued, unanswered), and a sync
 * that must reconnect first at the signal itself (its hello is a wait
 * the call gives up).  Before, each waited for its request's timeout
 * plus 5 s, signals unseen (Ctrl-C in Python did nothing for that long).
 * A publish ends so too, 3 s after a signal (-EINTR), and one that must
 * reconnect first at a wex_cancel (-ECANCELED); wexd runs no request of a client that hung up, so once it
 * goes on (SIGCONT at 5 s) the publish called again succeeds and every
 * engine group gets the version, every byte, though a third group kept
 * the model in wexd throughout.  (A review found the version lost there
 * when wexd ran the abandoned publish: "wexd restarted during the write
 * of v2 and refused"; publish_answer covers a publish wexd ran.)  So is
 * an admin request sent just before its client hung up: not run.
 */
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fixture.h"

/* wexd (its pid) goes on. */
static void cont(void *arg)
{
	kill(*(pid_t *)arg, SIGCONT);
}

enum { SYNC, PUBLISH, PUBLISH_CONT, REQUEST };

static const char *op_name(int op)
{
	return op == SYNC ? "sync" : op == PUBLISH ? "publish" :
	       op == PUBLISH_CONT ? "publish (wexd going on at 5 s)" :
				    "status request (reconnecting)";
}

/* One kick at 0.3 s (a signal to this thread, or a wex_cancel); for
 * PUBLISH_CONT, wexd going on at 5 s.  min_s: when the call may end at the
 * earliest (3 s after the kick, or at the kick). */
static void kicked(struct t_prod *p, struct t_cons *k, pid_t wexd, int op, int cancel,
		   double min_s)
{
	wex_client_t *c = op == PUBLISH || op == PUBLISH_CONT ? p->c : k->c;
	struct wex_sync_result r;
	struct t_kick kk, kc;
	char *out = NULL;
	double t0 = t_now(), el;
	int ret, want = cancel ? -ECANCELED : -EINTR;

	t_kick_start(&kk, 300000, cancel ? c : NULL, NULL, NULL);
	if (op == PUBLISH_CONT)
		t_kick_start(&kc, 5000000, NULL, cont, &wexd);
	ret = op == SYNC			     ? wex_sync(c, WEX_SYNC_COPY, 2, 20000, &r) :
	      op == PUBLISH || op == PUBLISH_CONT ? wex_publish(c, 2) :
						    wex_request(c, "status", NULL, &out);
	wex_free(out);
	el = t_now() - t0;
	t_kick_join(&kk, 0);
	if (op == PUBLISH_CONT)
		t_kick_join(&kc, 0); /* (wexd going on) */
	printf("%s, wexd stopped, one %s at 0.3 s: %s after %.2f s: %s\n", op_name(op),
	       cancel ? "wex_cancel" : "signal", wex_strerror(ret), el, wex_last_error(c));
	T_ASSERT(ret == want && el >= min_s && el < (op == PUBLISH_CONT ? 5.0 : 8.0),
		 "%s: %s after %.2f s, not %s %.1f to %d s after its start", op_name(op),
		 wex_strerror(ret), el, wex_strerror(want), min_s, op == PUBLISH_CONT ? 5 : 8);
}

/* wexd's sync_timeout_ms, as config get says. */
static long sync_timeout_ms(void)
{
	char out[4096];
	const char *v;

	t_wexctl("config get sync_timeout_ms", out, sizeof(out));
	v = strstr(out, "sync_timeout_ms");
	T_ASSERT(v != NULL, "config get sync_timeout_ms said: %s", out);
	v += strcspn(v, "0123456789");
	return strtol(v, NULL, 10);
}

int main(void)
{
	struct wex_sync_result r;
	struct t_wexd d;
	struct t_prod p;
	struct t_cons k, k2, k3;
	long timeout0;
	double t0;
	int admin;

	t_usr1_noop();
	t_client_flags = WEX_CLIENT_EINTR;
	t_tiny_v1(&d, &p, &k, "stopped");
	T_WEX(k.c, wex_sync(k.c, WEX_SYNC_COPY, 1, 5000, &r));
	t_cons_open(&k2, "stopped", "g2", "tiny", 0, 1);
	T_WEX(k2.c, wex_sync(k2.c, WEX_SYNC_COPY, 1, 5000, &r));
	/* Not kicked: it keeps the model in wexd throughout. */
	t_cons_open(&k3, "stopped", "g3", "tiny", 0, 1);
	T_WEX(k3.c, wex_sync(k3.c, WEX_SYNC_COPY, 1, 5000, &r));
	timeout0 = sync_timeout_ms();
	T_ASSERT(timeout0 != 4321, "sync_timeout_ms is 4321 already");
	admin = t_raw_connect(d.sock);
	json_decref(t_raw_rpc(admin, "{\"v\":1,\"op\":\"hello\",\"role\":\"admin\"}", NULL, 0));
	T_WEX(p.c, wex_begin_write(p.c, 2, 5000));
	ex_fill(p.base, p.t, (size_t)p.n, 2, 1);
	T_ASSERT(kill(d.pid, SIGSTOP) == 0, "SIGSTOP wexd: %s", strerror(errno));

	kicked(&p, &k2, d.pid, SYNC, 0, 3.3);
	kicked(&p, &k, d.pid, SYNC, 1, 3.3);
	kicked(&p, &k, d.pid, SYNC, 0, 0.3);	   /* its connection went with the last */
	kicked(&p, &k2, d.pid, REQUEST, 0, 3.3);  /* likewise */
	kicked(&p, &k, d.pid, PUBLISH, 0, 3.3);
	/* A request whose client hung up before wexd read it (its first
	 * since the stop: the answer to a second never goes). */
	{
		const char *set = "{\"v\":1,\"op\":\"config_set\",\"name\":\"sync_timeout_ms\","
				  "\"value\":\"4321\"}";

		t_raw_send(admin, set, strlen(set), NULL, 0);
	}
	close(admin);
	/* (It must reconnect: a wait for hello's answer, given up at once.) */
	kicked(&p, &k, d.pid, PUBLISH_CONT, 1, 0.3); /* SIGCONTs wexd at 5 s */

	t0 = t_now();
	T_WEX(p.c, wex_publish(p.c, 2));
	printf("publish v2 again once wexd went on: success after %.2f s\n", t_now() - t0);
	t0 = t_now();
	T_WEX(k.c, wex_sync(k.c, WEX_SYNC_COPY, 2, 5000, &r));
	T_ASSERT(r.version == 2 && t_own_bad(&k, 2) == 0, "v2 copied whole after wexd went on");
	T_WEX(k2.c, wex_sync(k2.c, WEX_SYNC_COPY, 2, 5000, &r));
	T_ASSERT(r.version == 2 && t_own_bad(&k2, 2) == 0, "v2 copied whole by group g2");
	T_WEX(k3.c, wex_sync(k3.c, WEX_SYNC_COPY, 2, 5000, &r));
	T_ASSERT(r.version == 2 && t_own_bad(&k3, 2) == 0, "v2 copied whole by group g3");
	printf("wexd went on: v2 copied by the three groups in %.2f s\n", t_now() - t0);
	T_ASSERT(sync_timeout_ms() == timeout0,
		 "wexd ran the config set of a client that hung up before it was read: sync_timeout_ms %ld, was %ld",
		 sync_timeout_ms(), timeout0);
	t_cons_close(&k3);
	t_cons_close(&k2);
	t_cons_close(&k);
	t_prod_close(&p);
	t_wexd_stop(&d);
	return T_EXIT_PASS;
}
