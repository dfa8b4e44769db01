/* SPDX-License-Identifier: MIT */
/*
 * producer_resize - a trainer restarted with another world size is served:
 * 2 producer ranks publish v1 to a consumer that stays connected; both
 * leave; a 1-rank producer of the same model then registers (no EINVAL about
 * the old world size), publishes v2, and the consumer copies v2 exactly
 * through a new plan.
 */
#include <string.h>

#include "fixture.h"

#define MODEL "resize"

int main(void)
{
	struct t_wexd d;
	struct t_prod p0, p1, q;
	struct t_cons k;
	struct wex_sync_result r;

	t_wexd_start(&d);
	t_prod_open(&p0, MODEL, "tiny", 0, 2);
	t_prod_open(&p1, MODEL, "tiny", 1, 2);
	t_prod_write(&p0, 1);
	t_prod_write(&p1, 1);
	t_cons_open(&k, MODEL, "g", "tiny", 0, 1); /* the whole model */
	T_WEX(k.c, wex_sync(k.c, WEX_SYNC_COPY, 1, 5000, &r));
	T_ASSERT(r.version == 1 && t_own_bad(&k, 1) == 0, "v1 from 2 ranks");
	t_prod_close(&p0);
	t_prod_close(&p1);

	t_prod_open(&q, MODEL, "tiny", 0, 1);
	t_prod_write(&q, 2);
	T_WEX(k.c, wex_sync(k.c, WEX_SYNC_COPY, 2, 5000, &r));
	T_ASSERT(r.version == 2, "got v%llu", (unsigned long long)r.version);
	T_ASSERT(t_own_bad(&k, 2) == 0, "v2 bytes wrong after the resize");
	t_cons_close(&k);
	t_prod_close(&q);
	t_wexd_stop(&d);
	printf("PASS: producer world size 2 -> 1 with a consumer attached throughout\n");
	t_exit(T_EXIT_PASS);
}
