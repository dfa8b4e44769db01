/* SPDX-License-Identifier: MIT */
/*
 * plan_bound.c - proves that the planner's bound on its work (2^30 steps)
 * is each plan's, as its comment, its message and wex.h say.  960K
 * producer ranks each hold a whole 8-d tensor (one of them near, so that
 * each cell keeps one candidate): a consumer rank wanting it takes about
 * 17M steps, 1.6% of the bound.  64 such ranks planned as one group, as
 * `wexctl plan` plans 64 consumer ranks at a time, are planned (before,
 * the group's steps were summed and the 63rd rank's tensor refused,
 * "no real layout comes near that").  (A plan over the bound alone is
 * still refused: bad_input.)
 */
#include "ptest.h"

enum { R = 960000, NDST = 64 };

int main(void)
{
	static struct wex_tensor piece, whole[NDST];
	struct wex_plan_src *srcs = calloc(R, sizeof(*srcs));
	struct wex_plan_dst *dsts = calloc(NDST, sizeof(*dsts));
	struct wex_plan **plans = calloc(NDST, sizeof(*plans));
	struct wex_planner *pl;
	char err[512];
	int ret;

	CHECK(srcs && dsts && plans, "calloc");
	snprintf(piece.name, sizeof(piece.name), "w");
	piece.dtype = WEX_DT_F32;
	piece.ndim = 8;
	for (int k = 0; k < 8; k++)
		piece.shape[k] = piece.extent[k] = 2;
	for (uint32_t r = 0; r < R; r++)
		srcs[r] = (struct wex_plan_src){ r, &piece, 1, r == 0 };
	for (uint32_t r = 0; r < NDST; r++) {
		whole[r] = piece;
		dsts[r] = (struct wex_plan_dst){ r, &whole[r], 1 };
	}

	/* The 64 as one group: each plan well under the bound. */
	CHECK(wex__planner_new(srcs, R, &pl, err, sizeof(err)) == 0, "%s", err);
	err[0] = 0;
	ret = wex__planner_plan_group(pl, dsts, NDST, NDST, plans, err, sizeof(err));
	CHECK(ret == 0, "64 ranks as a group: %d (%s)", ret, err);
	for (int i = 0; i < NDST; i++) {
		CHECK(plans[i]->nops == 1 && plans[i]->ops[0].src_rank == 0 &&
			      plans[i]->stats.bytes_moved == 256 * 4,
		      "rank %d: %zu ops from rank %u, %llu bytes", i, plans[i]->nops,
		      plans[i]->nops ? plans[i]->ops[0].src_rank : 0,
		      (unsigned long long)plans[i]->stats.bytes_moved);
		wex__plan_free(plans[i]);
	}
	printf("64 ranks as a group: planned\n");
	wex__planner_free(pl);

	free(srcs);
	free(dsts);
	free(plans);
	return T_PASS;
}
