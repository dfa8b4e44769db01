/* SPDX-License-Identifier: MIT */
/*
 * round_repeat - a rank that syncs again the version its whole group
 * already holds does not hold the producer until its idle peers take that
 * version again (they never would: they wait for the next one, which the
 * producer cannot write).  Both ranks of a group copy v1; then:
 *   1. rank 0 copies v1 again (a repeated request: the same connection);
 *   2. rank 0's engine restarts (a new connection) and copies v1;
 * and after each, with rank 1 doing nothing, the producers' begin_write of
 * the next version is granted at once and both ranks get it.  Rank 1
 * passes the round its peer opens because it holds v1 from this wexd in
 * this epoch; a rank that never took v1 would still be waited for (the
 * group atomicity tests).  Before, each begin_write ended in EBUSY
 * ("group ... waits for 1 of 2 ranks to take v1").
 */
#include <errno.h>
#include <string.h>

#include "fixture.h"

#define MODEL "repeat"
#define PRESET "tiny"

static struct t_prod P[2];
static struct t_cons C[2];

static void copy_version(uint32_t r, uint64_t v)
{
	struct wex_sync_result res;

	T_WEX(C[r].c, wex_sync(C[r].c, WEX_SYNC_COPY, v, 5000, &res));
	T_ASSERT(res.version == v, "rank %u got v%llu, not v%llu", r, (unsigned long long)res.version,
		 (unsigned long long)v);
}

/* With rank 1 idle, begin_write of v must be granted (3 s at most: the
 * old behaviour waited out the timeout), then v published and copied by
 * both ranks, every byte checked. */
static void next_version(uint64_t v, const char *after)
{
	for (uint32_t r = 0; r < 2; r++) {
		int ret = wex_begin_write(P[r].c, v, 3000);

		T_ASSERT(ret == 0, "after %s: begin_write v%llu on producer rank %u: %s (%s)", after,
			 (unsigned long long)v, r, wex_strerror(ret), wex_last_error(P[r].c));
	}
	for (uint32_t r = 0; r < 2; r++) {
		ex_fill(P[r].base, P[r].t, (size_t)P[r].n, v, 1);
		T_WEX(P[r].c, wex_publish(P[r].c, v));
	}
	for (uint32_t r = 0; r < 2; r++) {
		copy_version(r, v);
		T_ASSERT(ex_check(NULL, C[r].t, (size_t)C[r].n, v, 1) == 0,
			 "after %s: rank %u's copy of v%llu is wrong", after, r, (unsigned long long)v);
	}
}

int main(void)
{
	struct t_wexd d;

	t_wexd_start(&d);
	for (uint32_t r = 0; r < 2; r++)
		t_prod_open(&P[r], MODEL, PRESET, r, 2);
	for (uint32_t r = 0; r < 2; r++)
		t_cons_open(&C[r], MODEL, "engine", PRESET, r, 2);
	t_prod_write(&P[0], 1);
	t_prod_write(&P[1], 1);
	for (uint32_t r = 0; r < 2; r++)
		copy_version(r, 1);

	/* 1. The same connection syncs v1 again. */
	copy_version(0, 1);
	next_version(2, "rank 0 synced v1 again");

	/* 2. Rank 0's engine restarts and copies v2, which rank 1 holds. */
	t_cons_close(&C[0]);
	t_cons_open(&C[0], MODEL, "engine", PRESET, 0, 2);
	copy_version(0, 2);
	T_ASSERT(ex_check(NULL, C[0].t, (size_t)C[0].n, 2, 1) == 0, "the restarted rank's v2 is wrong");
	next_version(3, "rank 0 restarted and took v2");

	printf("round_repeat: a repeated sync and a restarted rank each took the version their "
	       "group held; begin_write of the next granted with the peer idle, both ranks got it\n");
	for (uint32_t r = 0; r < 2; r++) {
		t_cons_close(&C[r]);
		t_prod_close(&P[r]);
	}
	t_wexd_stop(&d);
	printf("round_repeat: PASS\n");
	return 0;
}
