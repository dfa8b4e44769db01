/* SPDX-License-Identifier: MIT */
/*
 * round_rejoin - a consumer rank that restarts rejoins its group without
 * stalling the producer: both ranks of a group took v1; rank 0's process
 * restarts and syncs v1 again, which opens a new round on v1; rank 1,
 * which holds v1, asks for v2 (as engines ask for the version after the
 * last they served).  It passed that round (it took v1 from this wexd,
 * in this epoch: since round_repeat's change, already when rank 0 opened
 * it) instead of holding it open: the producers' begin_write of v2 is
 * granted, and rank 1's sync gets v2.  (Before, the round waited for rank
 * 1 for good: begin_write EBUSY, rank 1 ETIMEDOUT, every retry the same.)
 */
#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <unistd.h>

#include "fixture.h"

#define MODEL "rejoin"
#define PRESET "tiny"

static struct t_prod P[2];
static struct t_cons C[2];

struct waiter {
	int ret;
	uint64_t got;
};

static void *rank1_waits_v2(void *arg)
{
	struct waiter *w = arg;
	struct wex_sync_result res;

	w->ret = wex_sync(C[1].c, WEX_SYNC_REMAP_VIEW, 2, 10000, &res);
	w->got = w->ret == 0 ? res.version : 0;
	return NULL;
}

/* Polls status (a condition, not a timed sleep; 30 s at most) until a
 * consumer of MODEL waits in acquire at wexd. */
static void await_acquire(const char *sock)
{
	for (double t0 = t_now();;) {
		json_t *s = t_status(sock), *c;
		size_t i;
		int n = 0;

		json_array_foreach(json_object_get(s, "clients"), i, c)
			n += !strcmp(json_string_value(json_object_get(c, "model")) ?: "", MODEL) &&
			     !strcmp(json_string_value(json_object_get(c, "waiting")) ?: "", "acquire");
		json_decref(s);
		if (n)
			return;
		T_ASSERT(t_now() - t0 < 30.0, "rank 1's sync of v2 never waited at wexd");
		usleep(10000);
	}
}

int main(void)
{
	struct t_wexd d;
	struct wex_sync_result res;
	struct waiter w = { 0 };
	pthread_t th;
	int ret;

	t_wexd_start(&d);
	for (uint32_t r = 0; r < 2; r++)
		t_prod_open(&P[r], MODEL, PRESET, r, 2);
	for (uint32_t r = 0; r < 2; r++)
		t_cons_open(&C[r], MODEL, "engine", PRESET, r, 2);
	t_prod_write(&P[0], 1);
	t_prod_write(&P[1], 1);
	for (uint32_t r = 0; r < 2; r++) {
		T_WEX(C[r].c, wex_sync(C[r].c, WEX_SYNC_REMAP_VIEW, 1, 5000, &res));
		T_WEX(C[r].c, wex_release(C[r].c));
	}
	/* Rank 0's engine restarts and takes v1 again: a new round on v1. */
	t_cons_close(&C[0]);
	t_cons_open(&C[0], MODEL, "engine", PRESET, 0, 2);
	T_WEX(C[0].c, wex_sync(C[0].c, WEX_SYNC_REMAP_VIEW, 1, 5000, &res));
	T_ASSERT(res.version == 1, "the restarted rank got v%llu, not v1",
		 (unsigned long long)res.version);
	T_WEX(C[0].c, wex_release(C[0].c));
	/* Rank 1 holds v1 and waits for v2. */
	T_ASSERT(pthread_create(&th, NULL, rank1_waits_v2, &w) == 0, "pthread_create");
	await_acquire(d.sock);
	ret = wex_begin_write(P[0].c, 2, 3000);
	T_ASSERT(ret == 0, "begin_write v2 while rank 1 waits for it: %s (%s)", wex_strerror(ret),
		 wex_last_error(P[0].c));
	T_WEX(P[1].c, wex_begin_write(P[1].c, 2, 3000));
	for (uint32_t r = 0; r < 2; r++) {
		ex_fill(P[r].base, P[r].t, (size_t)P[r].n, 2, 1);
		T_WEX(P[r].c, wex_publish(P[r].c, 2));
	}
	pthread_join(th, NULL);
	T_ASSERT(w.ret == 0 && w.got == 2, "rank 1's sync for v2: %s, v%llu", wex_strerror(w.ret),
		 (unsigned long long)w.got);
	printf("round_rejoin: rank 1 passed the round its restarted peer opened on v1; "
	       "begin_write v2 granted, rank 1 got v2\n");
	/* Rank 0, which never took v2, asks for v3: the round rank 1 opened
	 * on v2 waits for it, and holds the producers off v3, so the wait
	 * cannot end.  Its ETIMEDOUT says so (it said only "no version >= 3
	 * available (published v2)", which points at the trainer), and the
	 * trainer's EBUSY names the round. */
	ret = wex_sync(C[0].c, WEX_SYNC_REMAP_VIEW, 3, 300, &res);
	T_ASSERT(ret == -ETIMEDOUT, "rank 0's sync for v3 while its group's round on v2 waits for "
		 "it: %s", wex_strerror(ret));
	T_ASSERT(strstr(wex_last_error(C[0].c), "round open on v2") &&
		 strstr(wex_last_error(C[0].c), "min_version 2"),
		 "rank 0's ETIMEDOUT does not say that its group's round on v2 waits for it: %s",
		 wex_last_error(C[0].c));
	ret = wex_begin_write(P[0].c, 3, 300);
	T_ASSERT(ret == -EBUSY, "begin_write v3 while the round on v2 is open: %s",
		 wex_strerror(ret));
	printf("round_rejoin: %s\n", wex_last_error(C[0].c));
	printf("round_rejoin: trainer: %s\n", wex_last_error(P[0].c));
	T_WEX(C[0].c, wex_sync(C[0].c, WEX_SYNC_REMAP_VIEW, 2, 5000, &res));
	T_ASSERT(res.version == 2, "rank 0 got v%llu, not v2", (unsigned long long)res.version);
	T_WEX(C[0].c, wex_release(C[0].c));
	T_WEX(C[1].c, wex_release(C[1].c));
	T_WEX(P[0].c, wex_begin_write(P[0].c, 3, 3000)); /* the round closed */
	for (uint32_t r = 0; r < 2; r++) {
		t_cons_close(&C[r]);
		t_prod_close(&P[r]);
	}
	t_wexd_stop(&d);
	printf("round_rejoin: PASS\n");
	return 0;
}
