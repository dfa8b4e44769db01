/* SPDX-License-Identifier: MIT */
/*
 * group_resize - proves that an engine may come back with another world
 * size: a 2-rank consumer group whose ranks all left is re-formed with 1
 * rank (and then 3) while the model lives on (its producer stays), and
 * syncs every byte; a group with a rank still connected keeps its size
 * (a different world size is refused, naming the group's).
 */
#include <errno.h>
#include <string.h>

#include "fixture.h"

#define MODEL "gresize"

static wex_client_t *open_rank(uint32_t rank, uint32_t world, int *ret)
{
	struct wex_client_params cp = {
		.field_mask = WEX_CLIENT_FIELD_ROLE | WEX_CLIENT_FIELD_RANK | WEX_CLIENT_FIELD_MODEL |
			      WEX_CLIENT_FIELD_GROUP,
		.role = WEX_ROLE_CONSUMER, .model = MODEL, .group = "g", .rank = rank,
		.world_size = world,
	};
	wex_client_t *c = NULL;

	*ret = wex_client_open(&cp, &c);
	return c;
}

int main(void)
{
	struct t_wexd d;
	struct t_prod p;
	struct t_cons k;
	struct wex_sync_result r;
	wex_client_t *a, *b;
	int ret;

	t_wexd_start(&d);
	t_check_backend(d.sock);
	t_prod_open(&p, MODEL, "tiny", 0, 1);
	t_prod_write(&p, 1);
	a = open_rank(0, 2, &ret);
	T_ASSERT(ret == 0, "2-rank group, rank 0: %s", wex_strerror(ret));
	b = open_rank(1, 1, &ret);
	T_ASSERT(ret == -EINVAL, "a 1-rank hello while the 2-rank group has a rank: -EINVAL, got %s",
		 wex_strerror(ret));
	wex_client_close(b);
	wex_client_close(a); /* the 2-rank engine exits */
	t_cons_open(&k, MODEL, "g", "tiny", 0, 1); /* restarted with 1 rank */
	T_WEX(k.c, wex_sync(k.c, WEX_SYNC_COPY, 1, 5000, &r));
	T_ASSERT(r.version == 1 && t_own_bad(&k, 1) == 0, "the 1-rank group syncs v1");
	t_cons_close(&k);
	a = open_rank(2, 3, &ret); /* and again with 3 */
	T_ASSERT(ret == 0, "3-rank group after the 1-rank one left: %s", wex_strerror(ret));
	wex_client_close(a);
	t_prod_close(&p);
	t_wexd_stop(&d);
	printf("group_resize: PASS\n");
	t_exit(T_EXIT_PASS);
}
