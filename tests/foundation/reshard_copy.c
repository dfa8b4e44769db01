/* SPDX-License-Identifier: MIT */
/*
 * reshard_copy - proves COPY syncs across different parallel layouts on
 * host memory: 2 producer ranks (tensors split along dim 0) feed a
 * consumer group of 1 rank holding whole tensors, and a consumer group of
 * 4 ranks holding quarters; every element of every consumer buffer holds
 * the producer's value for its global position.
 */
#include <string.h>

#include "fixture.h"

#define MODEL "reshard"

static void consume(const char *group, uint32_t world, uint64_t v)
{
	struct t_cons k[4];
	struct wex_sync_result r;

	/* Buffers of the producers' kind (2 producer ranks). */
	for (uint32_t i = 0; i < world; i++)
		t_cons_open_from(&k[i], MODEL, group, "tiny", i, world, i % 2);
	for (uint32_t i = 0; i < world; i++) {
		T_WEX(k[i].c, wex_sync(k[i].c, WEX_SYNC_COPY, v, 5000, &r));
		T_ASSERT(r.version == v, "group %s rank %u got v%llu", group, i,
			 (unsigned long long)r.version);
		T_ASSERT(t_own_bad(&k[i], v) == 0, "group %s rank %u/%u holds v%llu exactly", group, i,
			 world, (unsigned long long)v);
	}
	for (uint32_t i = 0; i < world; i++)
		t_cons_close(&k[i]);
}

int main(void)
{
	struct t_wexd d;
	struct t_prod p[2];

	t_wexd_start(&d);
	t_check_backend(d.sock);
	for (uint32_t i = 0; i < 2; i++)
		t_prod_open(&p[i], MODEL, "tiny", i, 2);
	for (uint32_t i = 0; i < 2; i++)
		t_prod_write(&p[i], 1);
	consume("whole", 1, 1);
	consume("quarters", 4, 1);
	for (uint32_t i = 0; i < 2; i++)
		t_prod_close(&p[i]);
	t_wexd_stop(&d);
	return T_EXIT_PASS;
}
