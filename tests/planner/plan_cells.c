/* SPDX-License-Identifier: MIT */
/*
 * plan_cells.c - proves that the planner bounds the cells one plan cuts
 * its consumer pieces into (2^22), not only its steps.  A producer table
 * of one row piece and one diagonal element per row of a [K, K] tensor
 * cuts it into K^2 cells in about 3 K^2 steps, far under the step bound:
 * K = 2100 (4.4M cells) was planned, taking 2.3 s and 1.3 GB in wexd
 * (K = 8192 would take 20 GB).  It is refused now, before the cells are
 * made, naming the tensor; K = 512 (262k cells, as many as real plans
 * have) is still planned.  So is a plan of more than 2^22 cells each
 * with a producer piece of its own (review h118: a vLLM tp 8 rank of
 * DeepSeek-V3 from FSDP2 over 256 ranks has 4.9M and was refused, naming
 * an expert): a consumer's 1025 column pieces of a [4096, 1025] tensor
 * whose producer holds it in 4096 row pieces, 4,198,400 cells.
 */
#include "ptest.h"

static int plan_k(uint32_t k, char *err, size_t errlen, size_t *nops)
{
	struct wex_tensor *pieces = calloc(2 * (size_t)k, sizeof(*pieces)), whole;
	struct wex_plan_src src = { 0, pieces, 2 * (size_t)k, 1 };
	struct wex_plan_dst dst = { 0, &whole, 1 };
	struct wex_plan *plan = NULL;
	struct wex_planner *pl;
	int ret;

	CHECK(pieces, "calloc");
	memset(&whole, 0, sizeof(whole));
	snprintf(whole.name, sizeof(whole.name), "w");
	whole.dtype = WEX_DT_F32;
	whole.ndim = 2;
	whole.shape[0] = whole.shape[1] = whole.extent[0] = whole.extent[1] = k;
	for (uint32_t i = 0; i < k; i++) {
		struct wex_tensor *row = &pieces[2 * i], *diag = &pieces[2 * i + 1];

		*row = whole;
		row->start[0] = i;
		row->extent[0] = 1;
		*diag = *row;
		diag->start[1] = i;
		diag->extent[1] = 1;
	}
	CHECK(wex__planner_new(&src, 1, &pl, err, errlen) == 0, "%s", err);
	err[0] = 0;
	ret = wex__planner_plan_group(pl, &dst, 1, 1, &plan, err, errlen);
	*nops = ret == 0 ? plan->nops : 0;
	if (ret == 0)
		wex__plan_free(plan);
	wex__planner_free(pl);
	free(pieces);
	return ret;
}

/* Rows of a [rows, cols] u8 tensor on the producer, its columns on the
 * consumer: a cell a (row, column), each under one producer piece. */
static int plan_grid(uint32_t rows, uint32_t cols, char *err, size_t errlen, size_t *nops)
{
	struct wex_tensor *src = calloc(rows, sizeof(*src)), *dst = calloc(cols, sizeof(*dst));
	struct wex_plan_src s = { 0, src, rows, 1 };
	struct wex_plan_dst d = { 0, dst, cols };
	struct wex_plan *plan = NULL;
	struct wex_planner *pl;
	int ret;

	CHECK(src && dst, "calloc");
	pt_rows_cols(src, dst, rows, cols);
	CHECK(wex__planner_new(&s, 1, &pl, err, errlen) == 0, "%s", err);
	err[0] = 0;
	ret = wex__planner_plan_group(pl, &d, 1, 1, &plan, err, errlen);
	*nops = ret == 0 ? plan->nops : 0;
	if (ret == 0)
		wex__plan_free(plan);
	wex__planner_free(pl);
	free(src);
	free(dst);
	return ret;
}

int main(void)
{
	char err[512];
	size_t nops;
	int ret;

	ret = plan_k(512, err, sizeof(err), &nops);
	CHECK(ret == 0 && nops > 0, "K = 512 (262,144 cells): %d (%s)", ret, err);
	printf("K = 512: planned, %zu ops\n", nops);

	ret = plan_k(2100, err, sizeof(err), &nops);
	CHECK(ret == -WEX_ELAYOUT, "K = 2100 (4,410,000 cells) refused: got %d, %zu ops (%s)", ret,
	      nops, err);
	CHECK(strstr(err, "w: refused") && strstr(err, "4410000 cells") &&
		      strstr(err, "4261504 this plan may have"),
	      "the refusal names the tensor, its cells and the bound: %s", err);
	printf("K = 2100: %s\n", err);

	ret = plan_grid(4096, 1025, err, sizeof(err), &nops);
	CHECK(ret == 0 && nops > 0, "4096 row pieces to 1025 column pieces (4,198,400 cells, "
	      "one producer piece each): %d (%s)", ret, err);
	printf("4096 rows to 1025 columns: planned, %zu ops\n", nops);
	return T_PASS;
}
