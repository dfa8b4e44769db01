/* SPDX-License-Identifier: MIT */
/*
 * write_versions - proves that the producer ranks of a model always write
 * one version together and can always go on to the next:
 *  - while a consumer lease defers rank 0's begin_write(5), rank 1's
 *    begin_write(6) is refused at once (-EINVAL naming rank 0 and v5);
 *    once the lease goes both write and publish v5, and v6 follows;
 *  - wexd restarted while rank 0 had published v2 and rank 1 was still
 *    writing it: rank 1's publish of v2 goes through (libwex replays its
 *    begin_write), but v2 can never complete; the next begin_write(3) of
 *    either rank abandons it (logged) and the group publishes v3, which a
 *    consumer then syncs, every byte checked;
 *  - versions over 2^63-1 are refused by libwex (-EINVAL) before they
 *    reach wexd as negative JSON integers.
 */
#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <unistd.h>

#include "fixture.h"

struct bw {
	wex_client_t *c;
	uint64_t v;
	int ret;
};

static void *bw_run(void *a)
{
	struct bw *b = a;

	b->ret = wex_begin_write(b->c, b->v, 10000);
	return NULL;
}

static void fill_publish(struct t_prod *p, uint64_t v)
{
	ex_fill(p->base, p->t, (size_t)p->n, v, 1);
	T_WEX(p->c, wex_publish(p->c, v));
}

static void deferred_mismatch(void)
{
	struct t_prod p0, p1;
	struct t_cons k;
	struct wex_sync_result r;
	struct bw b0;
	pthread_t t0;
	int ret;

	t_prod_open(&p0, "wedge", "tiny", 0, 2);
	t_prod_open(&p1, "wedge", "tiny", 1, 2);
	t_prod_write(&p0, 1);
	t_prod_write(&p1, 1);
	t_cons_open(&k, "wedge", "g", "tiny", 0, 1);
	/* Versions over 2^63-1 (JSON's integers are signed): refused by
	 * libwex, naming the limit, before anything is sent. */
	ret = wex_begin_write(p0.c, (uint64_t)INT64_MAX + 1, 1000);
	T_ASSERT(ret == -EINVAL && strstr(wex_last_error(p0.c), "2^63-1"),
		 "begin_write(2^63): -EINVAL naming the limit, got %s (%s)", wex_strerror(ret),
		 wex_last_error(p0.c));
	ret = wex_sync(k.c, WEX_SYNC_COPY, UINT64_MAX, 1000, &r);
	T_ASSERT(ret == -EINVAL && strstr(wex_last_error(k.c), "2^63-1"),
		 "sync(min_version 2^64-1): -EINVAL naming the limit, got %s (%s)", wex_strerror(ret),
		 wex_last_error(k.c));
	T_WEX(k.c, wex_sync(k.c, WEX_SYNC_REMAP_VIEW, 1, 5000, &r));
	b0 = (struct bw){ p0.c, 5, 1 };
	T_ASSERT(pthread_create(&t0, NULL, bw_run, &b0) == 0, "thread");
	/* Rank 0's request waits for the lease: wait until wexd has it (30 s
	 * at most: a loaded machine). */
	for (double t1 = t_now();;) {
		json_t *st = t_status(getenv("WEX_SOCKET"));
		json_t *m = t_status_model(st, "wedge");
		json_int_t pend = json_integer_value(json_object_get(m, "write_pending"));

		json_decref(st);
		if (pend > 0)
			break;
		T_ASSERT(t_now() - t1 < 30.0, "rank 0's begin_write(5) never waited at wexd");
		usleep(10000);
	}
	ret = wex_begin_write(p1.c, 6, 300);
	T_ASSERT(ret == -EINVAL, "rank 1's begin_write(6) while rank 0 waits for v5: -EINVAL, got %s",
		 wex_strerror(ret));
	T_ASSERT(strstr(wex_last_error(p1.c), "rank 0 waits to write v5"),
		 "the refusal names rank 0 and v5: %s", wex_last_error(p1.c));
	printf("refused: %s\n", wex_last_error(p1.c));
	T_WEX(k.c, wex_release(k.c));
	pthread_join(t0, NULL);
	T_ASSERT(b0.ret == 0, "rank 0 writes v5 once the lease went: %s", wex_strerror(b0.ret));
	T_WEX(p1.c, wex_begin_write(p1.c, 5, 5000));
	fill_publish(&p0, 5);
	fill_publish(&p1, 5);
	t_prod_write(&p0, 6);
	t_prod_write(&p1, 6);
	T_WEX(k.c, wex_sync(k.c, WEX_SYNC_COPY, 6, 5000, &r));
	T_ASSERT(r.version == 6 && t_own_bad(&k, 6) == 0, "consumer syncs v6");
	t_cons_close(&k);
	t_prod_close(&p0);
	t_prod_close(&p1);
}

static void restart_mid_publish(struct t_wexd *d)
{
	struct t_prod p0, p1;
	struct t_cons k;
	struct wex_sync_result r;

	t_prod_open(&p0, "rwedge", "tiny", 0, 2);
	t_prod_open(&p1, "rwedge", "tiny", 1, 2);
	t_prod_write(&p0, 1);
	t_prod_write(&p1, 1);
	t_cons_open(&k, "rwedge", "g", "tiny", 0, 1);
	T_WEX(k.c, wex_sync(k.c, WEX_SYNC_COPY, 1, 5000, &r));
	t_prod_write(&p0, 2);                        /* rank 0 published v2 */
	T_WEX(p1.c, wex_begin_write(p1.c, 2, 5000)); /* rank 1 still writes it */
	t_wexd_kill(d);
	t_wexd_restart(d);
	fill_publish(&p1, 2);
	T_WEX(p0.c, wex_begin_write(p0.c, 3, 2000));
	T_WEX(p1.c, wex_begin_write(p1.c, 3, 2000));
	fill_publish(&p0, 3);
	fill_publish(&p1, 3);
	T_WEX(k.c, wex_sync(k.c, WEX_SYNC_COPY, 3, 5000, &r));
	T_ASSERT(r.version == 3 && t_own_bad(&k, 3) == 0, "consumer syncs v3 after the restart");
	t_cons_close(&k);
	t_prod_close(&p0);
	t_prod_close(&p1);
}

int main(void)
{
	struct t_wexd d;

	t_wexd_start(&d);
	t_check_backend(d.sock);
	deferred_mismatch();
	restart_mid_publish(&d);
	t_wexd_stop(&d);
	printf("write_versions: PASS\n");
	t_exit(T_EXIT_PASS);
}
