/* SPDX-License-Identifier: MIT */
/*
 * group_atomicity - proves guarantee 4.2 with 2 producer ranks and a
 * consumer group of 2 ranks:
 *  - a version is not visible until both producer ranks published it (an
 *    acquire after rank 0 alone published times out with ETIMEDOUT, and
 *    succeeds once rank 1 published too);
 *  - both consumer ranks get the same version even when the producer wants
 *    to publish between their syncs: after consumer rank 0 took v1 (and
 *    even released it), begin_write v2 cannot start (EBUSY, naming the
 *    group's open round) until consumer rank 1 took v1 too; a begin_write
 *    that waits meanwhile is let in only after rank 1 got v1, not v2.
 */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "fixture.h"

#define MODEL "grp"
#define PRESET "tiny"

static struct t_prod P[2];
static struct t_cons C[2];

static void sync_expect(int r, uint64_t v)
{
	struct wex_sync_result res;

	T_WEX(C[r].c, wex_sync(C[r].c, WEX_SYNC_REMAP_VIEW, 0, 3000, &res));
	T_ASSERT(res.version == v, "consumer rank %d got v%llu, expected v%llu", r,
		 (unsigned long long)res.version, (unsigned long long)v);
	for (uint32_t pr = 0; pr < 2; pr++)
		T_ASSERT(t_view_bad(&C[r], pr, v) == 0,
			 "consumer rank %d reads producer rank %u's bytes of v%llu", r, pr,
			 (unsigned long long)v);
}

static void expect_busy(int pr, uint64_t v, const char *why)
{
	int ret = wex_begin_write(P[pr].c, v, 150);

	T_ASSERT(ret == -EBUSY, "begin_write v%llu on rank %d %s: expected EBUSY, got %s",
		 (unsigned long long)v, pr, why, wex_strerror(ret));
}

struct bw {
	uint64_t v;
	int ret;
	char err[512];
};

static void *bw_thread(void *arg)
{
	struct bw *b = arg;

	b->ret = wex_begin_write(P[0].c, b->v, 10000);
	snprintf(b->err, sizeof(b->err), "%s", wex_last_error(P[0].c));
	return NULL;
}

/* Polls status (a condition, not a timed sleep) until producer rank 0's
 * connection waits in begin_write. */
static void wait_for_writer(const char *sock)
{
	double t0 = t_now();

	while (t_now() - t0 < 10.0) {
		json_t *s = t_status(sock), *c;
		size_t i;
		int found = 0;

		json_array_foreach(json_object_get(s, "clients"), i, c) {
			const char *role = json_string_value(json_object_get(c, "role"));
			const char *w = json_string_value(json_object_get(c, "waiting"));

			if (!strcmp(role, "producer") && w && !strcmp(w, "begin_write"))
				found = 1;
		}
		json_decref(s);
		if (found)
			return;
		sched_yield();
	}
	T_FAIL("producer's begin_write never reached wexd");
}

int main(void)
{
	struct t_wexd d;
	struct wex_sync_result res;
	pthread_t th;
	struct bw b = { .v = 3 };
	int ret;

	t_wexd_start(&d);
	t_check_backend(d.sock);
	for (uint32_t r = 0; r < 2; r++)
		t_prod_open(&P[r], MODEL, PRESET, r, 2);
	for (uint32_t r = 0; r < 2; r++)
		t_cons_open(&C[r], MODEL, "engine", PRESET, r, 2);

	/* Not visible until both producer ranks published. */
	t_prod_write(&P[0], 1);
	ret = wex_sync(C[0].c, WEX_SYNC_REMAP_VIEW, 0, 200, &res);
	T_ASSERT(ret == -ETIMEDOUT, "v1 published by rank 0 only: acquire must time out, got %s",
		 wex_strerror(ret));
	ret = wex_sync(C[1].c, WEX_SYNC_COPY, 1, 200, &res);
	T_ASSERT(ret == -ETIMEDOUT, "copy sync of v1 published by rank 0 only: ETIMEDOUT, got %s",
		 wex_strerror(ret));
	t_prod_write(&P[1], 1);
	sync_expect(0, 1);

	/* The round holds v1 for rank 1: the producer may not write v2. */
	expect_busy(0, 2, "while consumer rank 0 holds v1");
	T_ASSERT(strstr(wex_last_error(P[0].c), "engine"), "EBUSY names the group: %s",
		 wex_last_error(P[0].c));
	T_WEX(C[0].c, wex_release(C[0].c));
	expect_busy(0, 2, "while the group round waits for consumer rank 1");
	T_ASSERT(strstr(wex_last_error(P[0].c), "waits for 1 of 2 ranks"),
		 "EBUSY names the open round: %s", wex_last_error(P[0].c));
	expect_busy(1, 2, "while the group round waits for consumer rank 1");
	sync_expect(1, 1);
	T_WEX(C[1].c, wex_release(C[1].c));

	/* v2, by both ranks; rank 0 of the consumers takes it. */
	t_prod_write(&P[0], 2);
	ret = wex_sync(C[0].c, WEX_SYNC_REMAP_VIEW, 2, 200, &res);
	T_ASSERT(ret == -ETIMEDOUT, "v2 published by rank 0 only: ETIMEDOUT, got %s",
		 wex_strerror(ret));
	t_prod_write(&P[1], 2);
	sync_expect(0, 2);
	T_WEX(C[0].c, wex_release(C[0].c));

	/* A writer waiting for v3 while the round is open: consumer rank 1
	 * still gets v2, and the writer gets in only after that. */
	T_ASSERT(pthread_create(&th, NULL, bw_thread, &b) == 0, "thread");
	wait_for_writer(d.sock);
	sync_expect(1, 2);
	T_WEX(C[1].c, wex_release(C[1].c));
	pthread_join(th, NULL);
	T_ASSERT(b.ret == 0, "the waiting begin_write v3 is let in after rank 1 took v2: %s: %s",
		 wex_strerror(b.ret), b.err);
	ex_fill(P[0].base, P[0].t, (size_t)P[0].n, 3, 1);
	T_WEX(P[0].c, wex_publish(P[0].c, 3));
	t_prod_write(&P[1], 3);
	sync_expect(1, 3);
	sync_expect(0, 3);

	for (int r = 0; r < 2; r++) {
		t_cons_close(&C[r]);
		t_prod_close(&P[r]);
	}
	t_wexd_stop(&d);
	return T_EXIT_PASS;
}
