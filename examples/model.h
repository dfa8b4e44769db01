/* SPDX-License-Identifier: MIT */
/*
 * model.h - a synthetic model for the examples, tests and benchmarks: the
 * tensor set of a Qwen2-like decoder (Qwen2-0.5B by default: 290 tensors,
 * ~1 GB of bf16), every tensor sharded along dim 0 over `world` ranks (real
 * tensor parallelism splits row-parallel weights along dim 1 and
 * replicates norms; the resharding planner's tests cover those), with
 * bytes derived from (version, tensor, element) so
 * that any reader can check every byte it got.
 */
#ifndef WEX_EXAMPLE_MODEL_H
#define WEX_EXAMPLE_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "wex.h"

struct ex_cfg {
	uint64_t hidden, inter, kv_dim, vocab;
	uint32_t layers;
};

/* Qwen2-0.5B: hidden 896, intermediate 4864, 2 KV heads of 64, vocab 151936,
 * 24 layers.  "tiny": hidden 64, intermediate 256, kv 32, vocab 1000, 2
 * layers.  Returns 0, or -1 for an unknown preset. */
int ex_cfg_preset(struct ex_cfg *cfg, const char *name);

/* Parses option `opt`'s value `s` as a whole number in [min, max] into
 * *out; else says so on stderr, naming the program and option, and
 * returns -1. */
int ex_num(const char *prog, const char *opt, const char *s, uint64_t min, uint64_t max,
	   uint64_t *out);

/* The shards of `rank` of `world`: tensors with name, dtype BF16, global
 * shape and box; packed into one segment (offset, 256-byte aligned; segment
 * 0).  *out is malloc'd; *seg_bytes receives the segment size (page
 * multiple).  Returns the count, or -1 if a dim 0 is not divisible. */
int ex_shards(const struct ex_cfg *cfg, uint32_t rank, uint32_t world, struct wex_tensor **out,
	      uint64_t *seg_bytes);

/* Fills/checks a shard's bytes for `version`; `base` is where t->offset is
 * counted from (or, with t->ptr set, pass NULL to use t->ptr).  tid is the
 * tensor's index in the full model (same on every rank). Multi-threaded. */
void ex_fill(void *base, const struct wex_tensor *t, size_t n, uint64_t version, int threads);
/* Returns the number of mismatching elements (0: every byte as expected). */
uint64_t ex_check(const void *base, const struct wex_tensor *t, size_t n, uint64_t version,
		  int threads);
/* The expected value of element `e` of tensor `tid`. */
static inline uint16_t ex_value(uint64_t version, uint32_t tid, uint64_t e)
{
	uint32_t x = (uint32_t)(e * 2654435761u) ^ (tid * 40503u) ^ (uint32_t)(version * 0x9E3779B1u);

	return (uint16_t)(x ^ (x >> 16));
}
/* Index of the tensor named `name` in the full model (its tid). */
uint32_t ex_tid(const char *name);

double ex_now(void);

#endif
