/* SPDX-License-Identifier: MIT */
/*
 * daemon_defaults - proves that wexd's configured waits are the defaults of
 * libwex's blocking calls when the caller names no timeout (neither the
 * call nor the client's timeout_ms):
 *  - wexd started with WEX_BEGIN_WRITE_TIMEOUT_MS=600: a producer's
 *    wex_begin_write(v, 0) while a consumer holds a lease fails with
 *    -EBUSY after about 0.6 s (not libwex's 30 s);
 *  - WEX_SYNC_TIMEOUT_MS=700: wex_sync(min_version never published, 0)
 *    fails with -ETIMEDOUT after about 0.7 s;
 *  - "config set sync_timeout_ms 2500" at run time applies to the next
 *    sync (it waits at least 2.5 s);
 *  - a client opened with timeout_ms 300 keeps its own wait;
 *  - a sync of a misspelt model (no producer connected) times out saying
 *    so and naming the models that have producers;
 *  - a sync of a model whose producers never published times out saying
 *    that, with how many ranks are connected and how many published.
 * Lower bounds are tight (the wait really lasts that long); upper bounds
 * are loose, only far below the libwex default they replace.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fixture.h"

#define MODEL "defaults"

static void timed_sync(wex_client_t *c, double lo, double hi, const char *what)
{
	struct wex_sync_result r;
	double t0 = t_now(), el;
	int ret = wex_sync(c, WEX_SYNC_REMAP_VIEW, 99, 0, &r);

	el = t_now() - t0;
	T_ASSERT(ret == -ETIMEDOUT, "%s: -ETIMEDOUT, got %s", what, wex_strerror(ret));
	T_ASSERT(el >= lo && el < hi, "%s: waited %.3f s, expected %.1f to %.1f s", what, el, lo, hi);
	printf("%s: -ETIMEDOUT after %.3f s (%s)\n", what, el, wex_last_error(c));
}

int main(void)
{
	struct wex_client_params cp = {
		.field_mask = WEX_CLIENT_FIELD_ROLE | WEX_CLIENT_FIELD_MODEL | WEX_CLIENT_FIELD_GROUP |
			      WEX_CLIENT_FIELD_TIMEOUT,
		.role = WEX_ROLE_CONSUMER, .model = MODEL, .group = "own-timeout", .timeout_ms = 300,
	};
	struct t_wexd d;
	struct t_prod p;
	struct t_cons k;
	struct wex_sync_result r;
	wex_client_t *own = NULL;
	double t0, el;
	json_t *rep;
	int admin, ret;

	setenv("WEX_BEGIN_WRITE_TIMEOUT_MS", "600", 1);
	setenv("WEX_SYNC_TIMEOUT_MS", "700", 1);
	t_wexd_start(&d);
	unsetenv("WEX_BEGIN_WRITE_TIMEOUT_MS");
	unsetenv("WEX_SYNC_TIMEOUT_MS");
	t_prod_open(&p, MODEL, "tiny", 0, 1);
	t_cons_open(&k, MODEL, "g", "tiny", 0, 1);
	t_prod_write(&p, 1);

	/* begin_write: wexd's begin_write_timeout_ms. */
	T_WEX(k.c, wex_sync(k.c, WEX_SYNC_REMAP_VIEW, 1, 5000, &r));
	t0 = t_now();
	ret = wex_begin_write(p.c, 2, 0);
	el = t_now() - t0;
	T_ASSERT(ret == -EBUSY, "begin_write under a lease: -EBUSY, got %s", wex_strerror(ret));
	T_ASSERT(el >= 0.55 && el < 10, "begin_write waited %.3f s, expected wexd's 0.6 s", el);
	printf("begin_write: -EBUSY after %.3f s (%s)\n", el, wex_last_error(p.c));
	T_WEX(k.c, wex_release(k.c));

	/* sync: wexd's sync_timeout_ms, then the value set at run time. */
	timed_sync(k.c, 0.65, 10, "sync, wexd's sync_timeout_ms 700");
	admin = t_raw_connect(d.sock);
	rep = t_raw_rpc(admin, "{\"v\":1,\"op\":\"hello\",\"role\":\"admin\"}", NULL, 0);
	T_ASSERT(!strcmp(t_code(rep), "OK"), "admin hello: %s", t_msg(rep));
	json_decref(rep);
	rep = t_raw_rpc(admin,
			"{\"v\":1,\"op\":\"config_set\",\"name\":\"sync_timeout_ms\",\"value\":\"2500\"}",
			NULL, 0);
	T_ASSERT(!strcmp(t_code(rep), "OK"), "config set sync_timeout_ms: %s", t_msg(rep));
	json_decref(rep);
	close(admin);
	timed_sync(k.c, 2.45, 20, "sync, sync_timeout_ms 2500 set at run time");

	/* A client's own timeout_ms stands. */
	T_WEX(NULL, wex_client_open(&cp, &own));
	timed_sync(own, 0.25, 2.4, "sync, the client's timeout_ms 300");
	wex_client_close(own);

	/* A misspelt model: the timeout says that no producer serves it and
	 * names the models that have producers. */
	cp.model = "defualts";
	T_WEX(NULL, wex_client_open(&cp, &own));
	timed_sync(own, 0.25, 2.4, "sync of a misspelt model");
	T_ASSERT(strstr(wex_last_error(own), "no producer of model 'defualts' is connected") &&
		 strstr(wex_last_error(own), "models with producers: '" MODEL "'"),
		 "a sync of a model without producers does not say so: %s", wex_last_error(own));
	wex_client_close(own);
	cp.model = MODEL;
	/* Where the producers are there, the hint is not. */
	T_WEX(NULL, wex_client_open(&cp, &own));
	timed_sync(own, 0.25, 2.4, "sync, the client's timeout_ms 300, again");
	T_ASSERT(!strstr(wex_last_error(own), "no producer"), "hint where producers are: %s",
		 wex_last_error(own));
	wex_client_close(own);

	/* Producers connected (1 of 2 ranks) that never published: the
	 * timeout says so, not only "published v0". */
	{
		wex_client_t *half = t_open(WEX_ROLE_PRODUCER, "unpublished", NULL, 0, 2);

		cp.model = "unpublished";
		T_WEX(NULL, wex_client_open(&cp, &own));
		timed_sync(own, 0.25, 2.4, "sync of a model never published");
		T_ASSERT(strstr(wex_last_error(own), "no version of it is published yet: 1 of 2 "
						     "producer ranks connected, 0 of them published"),
			 "a sync of a model never published does not say so: %s",
			 wex_last_error(own));
		wex_client_close(own);
		wex_client_close(half);
		cp.model = MODEL;
	}

	t_cons_close(&k);
	t_prod_close(&p);
	t_wexd_stop(&d);
	printf("daemon_defaults: PASS\n");
	t_exit(T_EXIT_PASS);
}
