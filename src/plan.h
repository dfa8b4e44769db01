/* SPDX-License-Identifier: MIT */
/*
 * plan.h - the resharding planner (DESIGN section 5).
 *
 * Producer ranks and consumer ranks each describe their weights as pieces
 * (struct wex_tensor): "my bytes at this location hold box B of canonical
 * tensor T".  The planner intersects them in canonical space and emits, for
 * one consumer rank, the copy operations that write every element it needs
 * exactly once.  Plans are data: the client resolves locations to addresses
 * and hands the result to a backend's copy executor.
 */
#ifndef WEX_PLAN_H
#define WEX_PLAN_H

#include <stddef.h>
#include <stdint.h>
#include "wex.h"

/* One copy, in relative terms: from producer rank `src_rank`'s segment
 * `src_seg` at byte `src_off` to consumer piece `dst_piece` at byte
 * `dst_off` from that piece's ptr.  `len` contiguous bytes repeated over
 * up to 3 outer dims (byte strides). */
struct wex_plan_op {
	uint32_t src_rank;
	uint32_t src_seg;
	uint64_t src_off;
	uint32_t dst_piece;
	uint32_t nouter;
	uint64_t dst_off;
	uint64_t len;
	uint64_t count[3];
	int64_t src_stride[3];
	int64_t dst_stride[3];
};

/* The pieces one producer rank registered. */
struct wex_plan_src {
	uint32_t rank;               /* producer rank */
	const struct wex_tensor *t;  /* pieces; t[i].segment/offset locate them */
	size_t n;
};

struct wex_plan_stats {
	uint64_t bytes_needed;   /* bytes the consumer's pieces span */
	uint64_t bytes_moved;    /* bytes the ops copy (== needed: zero redundancy) */
	uint64_t ops;            /* after coalescing */
	uint64_t busiest_src_bytes; /* bytes read from the most loaded producer rank */
	uint32_t busiest_src;
	uint64_t src_bound_bytes;   /* lower bound for the busiest source */
};

struct wex_plan {
	struct wex_plan_op *ops;
	size_t nops;
	uint64_t hash;            /* deterministic over the ops */
	struct wex_plan_stats stats;
};

/*
 * Builds the plan for one consumer rank (`crank` of `cworld`, used to spread
 * load over data-parallel replicas) whose pieces are dst[0..ndst).  Pieces
 * must agree on dtype and global shape with their sources.  On success *out
 * is a new plan (wex__plan_free).  Errors: -WEX_ELAYOUT when an element has
 * no source or dtypes/shapes disagree (message in err, if not NULL),
 * -ENOMEM.  Pure computation: does not block.
 */
int wex__plan_build(const struct wex_plan_src *srcs, size_t nsrc, const struct wex_tensor *dst,
		    size_t ndst, uint32_t crank, uint32_t cworld, struct wex_plan **out, char *err,
		    size_t errlen);

void wex__plan_free(struct wex_plan *p);

#endif
