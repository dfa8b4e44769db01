/* SPDX-License-Identifier: MIT */
/*
 * ops_block.c - a planner call whose ops take 2 MiB or more puts every
 * plan's ops in one shared block (of huge pages, where the kernel gives
 * them); smaller calls (here each rank planned alone by wex__plan_build,
 * 1.2 and 1.5 MiB) give each plan an array of its own.
 * Proves that the block changes nothing a caller sees:
 *   - a group of two consumer ranks (12000 small tensors each, 1000 6-D
 *     boxes more on rank 0 whose outer dims split into 4 ops per cell, so
 *     that rank 0 outgrows its share of the block and moves to an array of
 *     its own) gives exactly the ops and hashes of each rank planned alone;
 *   - both plans copy every element exactly, through the host executor;
 *   - the plans are freed in either order (the ASan build checks that the
 *     block is released once, by the last plan, and nothing leaks);
 *   - a group under 2 MiB of ops uses no block.
 */
#include <stdint.h>

#include "ptest.h"

#define NSMALL 12000 /* 1-D tensors per consumer rank */
#define NBOX 1000    /* 6-D tensors, rank 0 only */
#define SMALL 16     /* F32 elements each */
#define BOXD 6
#define BOXN 729     /* 3^6 elements; rank 0 takes [0,2) in every dim: 64 */
#define SEG 3
#define PRANK 5

struct prod {
	unsigned char *buf;
	uint64_t len;
};

static uint64_t base(void *arg, uint32_t rank, uint32_t seg)
{
	struct prod *p = arg;

	return rank == PRANK && seg == SEG ? (uint64_t)(uintptr_t)p->buf : 0;
}

static void tensor(struct wex_tensor *t, const char *name, uint32_t ndim, uint64_t dim)
{
	memset(t, 0, sizeof(*t));
	snprintf(t->name, sizeof(t->name), "%s", name);
	t->dtype = WEX_DT_F32;
	t->ndim = ndim;
	for (uint32_t d = 0; d < ndim; d++) {
		t->shape[d] = dim;
		t->extent[d] = dim;
	}
}

/* Every element of consumer piece d (C order over its box) is the
 * producer's value of that canonical element. */
static uint64_t check_piece(const struct wex_tensor *d)
{
	uint64_t nh = pt_name_hash(d->name), n = 1, bad = 0;

	for (uint32_t k = 0; k < d->ndim; k++)
		n *= d->extent[k];
	for (uint64_t e = 0; e < n; e++) {
		uint64_t rem = e, idx = 0, mul = 1;
		unsigned char want[4];

		/* Canonical index of box element e (innermost dim last). */
		for (int k = (int)d->ndim - 1; k >= 0; k--) {
			idx += (d->start[k] + rem % d->extent[k]) * mul;
			rem /= d->extent[k];
			mul *= d->shape[k];
		}
		pt_value(nh, idx, 4, want);
		bad += memcmp((unsigned char *)d->ptr + e * 4, want, 4) != 0;
	}
	return bad;
}

static void same_plan(const struct wex_plan *a, const struct wex_plan *b, const char *what)
{
	CHECK(a->nops == b->nops, "%s: %zu ops vs %zu alone", what, a->nops, b->nops);
	CHECK(a->hash == b->hash, "%s: hash %016llx vs %016llx alone", what,
	      (unsigned long long)a->hash, (unsigned long long)b->hash);
	CHECK(memcmp(a->ops, b->ops, a->nops * sizeof(*a->ops)) == 0, "%s: ops differ", what);
}

int main(void)
{
	size_t nsrc = 2 * NSMALL + NBOX, n0 = NSMALL + NBOX, n1 = NSMALL;
	struct wex_tensor *src = calloc(nsrc, sizeof(*src));
	struct wex_tensor *dst[2] = { calloc(n0, sizeof(struct wex_tensor)),
				      calloc(n1, sizeof(struct wex_tensor)) };
	struct prod prod = { 0 };
	char name[32], err[512];

	CHECK(src && dst[0] && dst[1], "oom");
	/* Producer: every tensor whole, one after another in one segment. */
	prod.len = (uint64_t)2 * NSMALL * SMALL * 4 + (uint64_t)NBOX * BOXN * 4;
	prod.buf = malloc(prod.len);
	CHECK(prod.buf, "oom");
	uint64_t off = 0;
	for (size_t i = 0; i < nsrc; i++) {
		int box = i >= 2 * NSMALL;
		uint64_t n = box ? BOXN : SMALL;

		if (box)
			snprintf(name, sizeof(name), "box%04zu", i - 2 * NSMALL);
		else
			snprintf(name, sizeof(name), "t%05zu", i);
		tensor(&src[i], name, box ? BOXD : 1, box ? 3 : SMALL);
		src[i].segment = SEG;
		src[i].offset = off;
		for (uint64_t e = 0; e < n; e++)
			pt_value(pt_name_hash(name), e, 4, prod.buf + off + e * 4);
		off += n * 4;
	}
	/* Consumers: rank 0 the first NSMALL tensors and [0,2)^6 of every box,
	 * rank 1 the other NSMALL tensors, each in a buffer of its own. */
	for (size_t i = 0; i < n0; i++) {
		int box = i >= NSMALL;

		dst[0][i] = src[box ? 2 * NSMALL + (i - NSMALL) : i];
		if (box)
			for (int d = 0; d < BOXD; d++)
				dst[0][i].extent[d] = 2;
	}
	for (size_t i = 0; i < n1; i++)
		dst[1][i] = src[NSMALL + i];
	for (int r = 0; r < 2; r++)
		for (size_t i = 0; i < (r ? n1 : n0); i++) {
			dst[r][i].segment = 0;
			dst[r][i].offset = 0;
			dst[r][i].ptr = calloc(1, wex_tensor_nbytes(&dst[r][i]));
			CHECK(dst[r][i].ptr, "oom");
		}

	struct wex_plan_src ps = { PRANK, src, nsrc, 0, NULL, 0 };
	struct wex_plan_dst pd[2] = { { 0, dst[0], n0 }, { 1, dst[1], n1 } };
	struct wex_plan *alone[2];
	struct wex_planner *pl;

	for (int r = 0; r < 2; r++) {
		CHECK(wex__plan_build(&ps, 1, dst[r], r ? n1 : n0, (uint32_t)r, 2, &alone[r], err,
				      sizeof(err)) == 0,
		      "rank %d alone: %s", r, err);
		CHECK(!alone[r]->block, "rank %d alone: a plan under 2 MiB of ops is in a block", r);
	}
	CHECK(alone[0]->nops == NSMALL + 4 * NBOX, "rank 0: %zu ops, expected %d (4 per box)",
	      alone[0]->nops, NSMALL + 4 * NBOX);
	CHECK(wex__planner_new(&ps, 1, &pl, err, sizeof(err)) == 0, "%s", err);
	for (int round = 0; round < 2; round++) {
		struct wex_plan *g[2];

		CHECK(wex__planner_plan_group(pl, pd, 2, 2, g, err, sizeof(err)) == 0, "%s", err);
		/* Rank 1 stays in the block; rank 0 outgrew its share. */
		CHECK(g[1]->block, "round %d: rank 1's ops are not in a block", round);
		CHECK(!g[0]->block, "round %d: rank 0 did not move out of the block", round);
		same_plan(g[0], alone[0], "rank 0");
		same_plan(g[1], alone[1], "rank 1");
		for (int r = 0; r < 2; r++) {
			uint64_t bad = 0;

			CHECK(wex__plan_exec_host(g[r], base, &prod, dst[r], 2) == 0, "rank %d: copy", r);
			for (size_t i = 0; i < (r ? n1 : n0); i++) {
				bad += check_piece(&dst[r][i]);
				memset(dst[r][i].ptr, 0, wex_tensor_nbytes(&dst[r][i]));
			}
			CHECK(bad == 0, "round %d rank %d: %llu elements wrong", round, r,
			      (unsigned long long)bad);
		}
		/* Either order: the block goes with the last plan in it. */
		wex__plan_free(g[round ? 0 : 1]);
		wex__plan_free(g[round ? 1 : 0]);
	}
	/* Both ranks in the block, freed the other way round. */
	{
		struct wex_plan_dst both[2] = { { 0, dst[1], n1 }, { 1, dst[1], n1 } };
		struct wex_plan *g[2];

		CHECK(wex__planner_plan_group(pl, both, 2, 2, g, err, sizeof(err)) == 0, "%s", err);
		CHECK(g[0]->block && g[0]->block == g[1]->block, "two ranks of small tensors: not one block");
		CHECK(g[0]->ops != g[1]->ops, "two plans share ops");
		wex__plan_free(g[1]);
		uint64_t bad = 0;
		CHECK(wex__plan_exec_host(g[0], base, &prod, dst[1], 1) == 0, "copy after the other plan went");
		for (size_t i = 0; i < n1; i++)
			bad += check_piece(&dst[1][i]);
		CHECK(bad == 0, "%llu elements wrong", (unsigned long long)bad);
		wex__plan_free(g[0]);
	}
	/* Under 2 MiB of ops: arrays of their own. */
	{
		struct wex_plan_dst few[2] = { { 0, dst[0], 100 }, { 1, dst[1], 100 } };
		struct wex_plan *g[2];

		CHECK(wex__planner_plan_group(pl, few, 2, 2, g, err, sizeof(err)) == 0, "%s", err);
		CHECK(!g[0]->block && !g[1]->block, "a small group's ops are in a block");
		CHECK(g[0]->nops == 100 && g[1]->nops == 100, "%zu and %zu ops", g[0]->nops, g[1]->nops);
		wex__plan_free(g[0]);
		wex__plan_free(g[1]);
	}
	printf("group of 2 ranks: %zu + %zu ops (%.2f MiB); rank 0 moved out of the block, rank 1 in it; "
	       "ops and hashes equal to each rank planned alone; every element copied exactly\n",
	       alone[0]->nops, alone[1]->nops,
	       (double)(alone[0]->nops + alone[1]->nops) * sizeof(struct wex_plan_op) / 1048576.0);
	wex__plan_free(alone[0]);
	wex__plan_free(alone[1]);
	wex__planner_free(pl);
	for (int r = 0; r < 2; r++) {
		for (size_t i = 0; i < (r ? n1 : n0); i++)
			free(dst[r][i].ptr);
		free(dst[r]);
	}
	free(src);
	free(prod.buf);
	return T_PASS;
}
