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

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include "wex.h"

struct wex_copy_op; /* vmm/backend.h */

/* One copy, in relative terms: from producer rank `src_rank`'s segment
 * `src_seg` at byte `src_off` to consumer piece `dst_piece` at byte
 * `dst_off` from that piece's ptr.  `len` contiguous bytes repeated over
 * up to 3 outer dims (byte strides), innermost first. */
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
	int near;                    /* 1: its memory is on the consumer's device:
				      * an element it holds is read from it (or
				      * from another near rank), never from a
				      * replica on another device */
	const uint8_t *near_seg;     /* when set, per segment id instead of
				      * `near`: near_seg[t.segment] for
				      * t.segment < nnear_seg, else not near */
	uint32_t nnear_seg;
};

/* For a plan built alone (wex__plan_build) the busiest source and bound are
 * this plan's; for plans built by one planner call they are that call's
 * busiest source and the planner's running bound; wex__planner_stats gives
 * the totals over every call. */
struct wex_plan_stats {
	uint64_t bytes_needed;   /* bytes the consumer's pieces span */
	uint64_t bytes_moved;    /* bytes the ops copy (== needed: zero redundancy) */
	uint64_t ops;            /* after coalescing */
	uint64_t busiest_src_bytes; /* bytes read from the most loaded producer rank */
	uint32_t busiest_src;
	uint64_t src_bound_bytes;   /* lower bound for the busiest source */
};

struct wex_ops_block; /* plan.c */

struct wex_plan {
	struct wex_plan_op *ops;
	size_t nops;
	struct wex_ops_block *block; /* private: when set, ops lie in a block
				      * shared by the plans of one group call
				      * (released by the last wex__plan_free) */
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

/* fn(arg) is called now and then while the calling thread builds or packs
 * a plan or tables (every 16K cells or ops, every 64K comparisons of a
 * sort, at each consumer piece): wexd's loop pings its watchdog from it.
 * Set per thread; NULL: none (the default). */
void wex__plan_tick_set(void (*fn)(void *arg), void *arg);
/* *flag, set by another thread, stops the plan the calling thread builds:
 * wex__plan_build and wex__planner_plan return -ECANCELED soon after (at
 * the next consumer piece).  Set per thread; NULL: none (the default). */
void wex__plan_cancel_set(const atomic_int *flag);
/* Calls the hook now, if one is set: for long steps around a plan (its
 * sealed memfd, the producer tables' one). */
void wex__plan_tick(void);

/* ---------------------------------------------------------------------- */
/* Additions: a reusable source index, group planning, aggregate stats.    */

/*
 * A planner holds an index over the producers' pieces (sorted by canonical
 * tensor and first coordinate) so that many consumer ranks can be planned
 * against it, and the load each producer rank carries so far, summed over
 * every plan built with it.  It keeps pointers into `srcs` (the caller keeps
 * them alive).  Pure computation.
 */
struct wex_planner;

int wex__planner_new(const struct wex_plan_src *srcs, size_t nsrc, struct wex_planner **out,
		     char *err, size_t errlen);
void wex__planner_free(struct wex_planner *pl);
/* The hash pl's name table files `name` under (keyed per planner: for
 * tests that names made to collide do not). */
uint64_t wex__planner_name_hash(const struct wex_planner *pl, const char *name);

/* Plans one consumer rank on its own: replicas are chosen by rotating with
 * crank (and split when there are more replicas than consumer ranks), so
 * that independently built plans spread evenly.  Same contract as
 * wex__plan_build. */
int wex__planner_plan(struct wex_planner *pl, const struct wex_tensor *dst, size_t ndst,
		      uint32_t crank, uint32_t cworld, struct wex_plan **out, char *err,
		      size_t errlen);

/* The pieces of one consumer rank of a group. */
struct wex_plan_dst {
	uint32_t crank;
	const struct wex_tensor *t;
	size_t n;
};

/*
 * Plans all consumer ranks of a group together: every element is taken from
 * the least loaded producer rank holding it (load carried over from earlier
 * calls on the same planner), exclusive sources first and large pieces
 * first, so the busiest source ends near its lower bound.  out[i] receives
 * the plan of dsts[i] (out must have ndst slots; all or none are set).
 */
int wex__planner_plan_group(struct wex_planner *pl, const struct wex_plan_dst *dsts, size_t ndst,
			    uint32_t cworld, struct wex_plan **out, char *err, size_t errlen);

/* Totals over every plan built with the planner: bytes, ops, the busiest
 * producer rank and the lower bound for it (demand that only a set of
 * ranks can serve, spread evenly over that set). */
void wex__planner_stats(const struct wex_planner *pl, struct wex_plan_stats *st);

/* Element strides of the first t->ndim dims: the tensor's own, or C order
 * over its extent when all are 0. */
void wex__tensor_strides(const struct wex_tensor *t, int64_t *s);

/* Deterministic 64-bit hash of a piece table (names, dtypes, shapes, boxes,
 * strides, segments and offsets; not pointers): the plan-cache key part for
 * one side's layout. */
uint64_t wex__pieces_hash(const struct wex_tensor *t, size_t n);

/*
 * Executor (plan_exec.c).  Resolves a plan's relative ops into absolute
 * copies: src = src_base(arg, rank, seg) + src_off, dst = dst[piece].ptr +
 * dst_off.  *out is a new array of p->nops ops (free()).  Errors: -EINVAL
 * when src_base returns 0 or a dst piece has no ptr, -ENOMEM.
 */
int wex__plan_resolve(const struct wex_plan *p,
		      uint64_t (*src_base)(void *arg, uint32_t rank, uint32_t seg), void *arg,
		      const struct wex_tensor *dst, struct wex_copy_op **out);

/* Resolves and runs a plan with the host backend's copy executor.  Blocks
 * until the copies are done. */
int wex__plan_exec_host(const struct wex_plan *p,
			uint64_t (*src_base)(void *arg, uint32_t rank, uint32_t seg), void *arg,
			const struct wex_tensor *dst, int threads);

#endif
