/* SPDX-License-Identifier: MIT */
/*
 * host_copy - unit test of wex_mem_host_copy (vmm/backend.h), the host
 * copy executor behind COPY syncs: strided ops with 0-3 outer dims
 * (positive strides, in any nesting), single long rows split across
 * threads, many small ops, 1 to 16 threads, totals below and above the
 * threading threshold.  Every destination byte is compared with a naive
 * reference copy, including the bytes no op should touch.
 * Last, the order rows are walked in: an op whose outer dims are listed
 * outermost first is folded to walk the innermost fastest.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "helpers.h"
#include "vmm/backend.h"

static uint64_t rng = 88172645463325252ull;

static uint64_t rnd(uint64_t n)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return n ? rng % n : 0;
}

/* Reference: the obvious nested loops. */
static void ref_copy(const struct wex_copy_op *op)
{
	uint64_t c[3] = { 1, 1, 1 };

	for (uint32_t k = 0; k < op->nouter; k++)
		c[k] = op->count[k];
	for (uint64_t a = 0; a < c[0]; a++)
		for (uint64_t b = 0; b < c[1]; b++)
			for (uint64_t e = 0; e < c[2]; e++) {
				int64_t so = 0, dof = 0;
				uint64_t idx[3] = { a, b, e };

				for (uint32_t k = 0; k < op->nouter; k++) {
					so += (int64_t)idx[k] * op->src_stride[k];
					dof += (int64_t)idx[k] * op->dst_stride[k];
				}
				memcpy((char *)(uintptr_t)(op->dst + (uint64_t)dof),
				       (const char *)(uintptr_t)(op->src + (uint64_t)so), op->len);
			}
}

/* Builds one non-overlapping op: rows of `len` bytes, outer dims packed
 * after each other (dst) or with gaps (src), placed at *soff / *doff. */
static struct wex_copy_op make_op(char *src, char *dst, uint64_t *soff, uint64_t *doff,
				  uint32_t nouter, uint64_t len, const uint64_t *count, int gap)
{
	struct wex_copy_op op;
	int64_t ss = (int64_t)len + gap, ds = (int64_t)len + (gap ? 3 : 0);
	uint64_t sspan = (uint64_t)ss, dspan = (uint64_t)ds;

	memset(&op, 0, sizeof(op));
	op.len = len;
	op.nouter = nouter;
	/* Innermost listed dim (the last) has the smallest stride. */
	for (int k = (int)nouter - 1; k >= 0; k--) {
		op.count[k] = count[k];
		op.src_stride[k] = (int64_t)sspan;
		op.dst_stride[k] = (int64_t)dspan;
		sspan *= count[k];
		dspan *= count[k];
	}
	if (nouter == 0) {
		sspan = len;
		dspan = len;
	}
	op.src = (uint64_t)(uintptr_t)(src + *soff);
	op.dst = (uint64_t)(uintptr_t)(dst + *doff);
	*soff += sspan + 64;
	*doff += dspan + 64;
	return op;
}

static void run_case(const char *what, struct wex_copy_op *ops, size_t n, char *dst, char *ref,
		     size_t dlen, int threads, char *src)
{
	int ret;

	for (size_t i = 0; i < dlen; i++)
		dst[i] = (char)0xEE;
	memcpy(ref, dst, dlen);
	/* The reference writes into `ref`: rebase each op's dst. */
	for (size_t i = 0; i < n; i++) {
		struct wex_copy_op r = ops[i];

		r.dst = r.dst - (uint64_t)(uintptr_t)dst + (uint64_t)(uintptr_t)ref;
		ref_copy(&r);
	}
	ret = wex_mem_host_copy(ops, n, threads);
	T_ASSERT(ret == 0, "%s, %d threads: returned %d", what, threads, ret);
	for (size_t i = 0; i < dlen; i++)
		if (dst[i] != ref[i])
			T_FAIL("%s, %d threads: byte %zu is %#x, expected %#x", what, threads, i,
			       (unsigned char)dst[i], (unsigned char)ref[i]);
	(void)src;
}

/* Transposes and gathers of small elements (1 to 16 bytes: copy_small's
 * tiles, through a buffer), of sizes that are and are not multiples of
 * its 32 x 32 tiles and 256-run panels, the rows of an op split over
 * threads anywhere: [R, C] to [C, R] (the transpose path), to [C, R] with
 * gaps in both (the general path), and a 3-D [2, R, C] to [2, C, R];
 * on 1 and 8 threads, and one over the threading threshold on 2 to 16. */
static void transposes(char *src, char *dst, char *ref, size_t cap)
{
	static const uint64_t lens[] = { 1, 2, 3, 4, 8, 16 };
	static const uint64_t dims[][2] = { { 300, 517 }, { 512, 1024 }, { 33, 2 }, { 1, 700 } };
	static const int threads[] = { 1, 8 };

	for (size_t li = 0; li < sizeof(lens) / sizeof(lens[0]); li++)
		for (size_t di = 0; di < sizeof(dims) / sizeof(dims[0]); di++)
			for (int kind = 0; kind < 3; kind++) {
				uint64_t e = lens[li], r = dims[di][0], c = dims[di][1];
				uint64_t m = kind == 2 ? 2 : 1, g = kind == 1 ? 2 : 1;
				struct wex_copy_op op = {
					.src = (uint64_t)(uintptr_t)src,
					.dst = (uint64_t)(uintptr_t)dst,
					.len = e,
					.nouter = kind == 2 ? 3 : 2,
					.count = { r, c, m },
					.src_stride = { (int64_t)(c * e * g), (int64_t)(e * g),
							(int64_t)(r * c * e * g) },
					.dst_stride = { (int64_t)(e * g), (int64_t)(r * e * g),
							(int64_t)(r * c * e * g) },
				};
				size_t span = (size_t)(m * r * c * e * g);
				char what[96];

				/* (The power-of-two one for the common sizes.) */
				if (span > cap || (e > 4 && r * c > 300000))
					continue;
				for (size_t ti = 0; ti < sizeof(threads) / sizeof(threads[0]); ti++) {
					snprintf(what, sizeof(what), "%s of %llu x %llu elements of %llu bytes",
						 kind == 0 ? "transpose" : kind == 1 ? "transpose with gaps" :
						 "3-D transpose", (unsigned long long)r, (unsigned long long)c,
						 (unsigned long long)e);
					run_case(what, &op, 1, dst, ref, span, threads[ti], src);
				}
			}
	/* Over the threading threshold (8 MiB): the rows of one op split
	 * into chunks that start and end inside runs. */
	{
		uint64_t e = 2, r = 2048, c = 2500;
		struct wex_copy_op op = { .src = (uint64_t)(uintptr_t)src,
					  .dst = (uint64_t)(uintptr_t)dst,
					  .len = e,
					  .nouter = 2,
					  .count = { r, c },
					  .src_stride = { (int64_t)(c * e), (int64_t)e },
					  .dst_stride = { (int64_t)e, (int64_t)(r * e) } };

		T_ASSERT(r * c * e <= cap && r * c * e > (8u << 20),
			 "the large transpose fits and passes 8 MiB");
		for (int th = 2; th <= 16; th *= 2)
			run_case("large transpose", &op, 1, dst, ref, r * c * e, th, src);
	}
}

/* Rows of 64 bytes, 128 apart in the source and packed in the
 * destination, under two outer dims listed outermost first: the right
 * bytes, and folded for the walk innermost first (count[0] the dim of the
 * smallest strides, walked fastest), as the same rows under one dim are;
 * walked outermost first, each row a page from the one before, such rows
 * copied 4.4x slower (measured by the review that found it, 2026-12-01). */
static void row_order(char *src, char *dst, char *ref)
{
	const uint64_t len = 64, inner = 512, outer = 640;
	struct wex_copy_op two = { .src = (uint64_t)(uintptr_t)src, .dst = (uint64_t)(uintptr_t)dst,
				   .len = len, .nouter = 2,
				   .count = { outer, inner },
				   .src_stride = { (int64_t)(2 * len * inner), (int64_t)(2 * len) },
				   .dst_stride = { (int64_t)(len * inner), (int64_t)len } };
	struct wex_copy_op f = two;

	memset(dst, 0, len * inner * outer);
	T_ASSERT(wex_mem_host_copy(&two, 1, 1) == 0, "two outer dims");
	for (uint64_t r = 0; r < inner * outer; r++)
		memcpy(ref + r * len, src + 2 * len * r, len);
	T_ASSERT(!memcmp(dst, ref, len * inner * outer), "two outer dims: wrong bytes");
	wex_mem_fold_op(&f);
	T_ASSERT(f.len == len && f.nouter == 2 && f.count[0] == inner && f.count[1] == outer &&
			 f.src_stride[0] == (int64_t)(2 * len) && f.dst_stride[0] == (int64_t)len &&
			 f.src_stride[1] == (int64_t)(2 * len * inner) &&
			 f.dst_stride[1] == (int64_t)(len * inner),
		 "folded op walks %llu rows of stride %lld/%lld fastest, not the innermost %llu "
		 "(rows out of memory order)", (unsigned long long)f.count[0],
		 (long long)f.src_stride[0], (long long)f.dst_stride[0], (unsigned long long)inner);
	/* Dims of one index are dropped; one of none leaves the op as it is. */
	f = two;
	f.nouter = 3, f.count[0] = 1, f.count[1] = inner, f.count[2] = outer;
	f.src_stride[1] = 2 * len * inner, f.dst_stride[1] = len * inner;
	f.src_stride[2] = 2 * len, f.dst_stride[2] = len;
	wex_mem_fold_op(&f);
	T_ASSERT(f.nouter == 2 && f.count[0] == outer && f.src_stride[0] == (int64_t)(2 * len),
		 "a dim of one index not dropped, or dims not put innermost first");
}

int main(void)
{
	const size_t cap = 48u << 20;
	char *src = malloc(cap), *dst = malloc(cap), *ref = malloc(cap);
	static const int threads[] = { 1, 2, 3, 8, 16 };
	struct wex_copy_op ops[400];

	T_ASSERT(src && dst && ref, "malloc");
	for (size_t i = 0; i < cap; i++)
		src[i] = (char)(i * 131 + (i >> 11));

	for (size_t ti = 0; ti < sizeof(threads) / sizeof(threads[0]); ti++) {
		int th = threads[ti];
		uint64_t so, dof;
		size_t n;

		/* 1. One long row (20 MiB): split by bytes over threads. */
		so = 0;
		dof = 0;
		ops[0] = make_op(src, dst, &so, &dof, 0, 20u << 20, NULL, 0);
		run_case("one 20 MiB row", ops, 1, dst, ref, dof, th, src);

		/* 2. Each outer depth 1..3, large (> 8 MiB total, threaded). */
		for (uint32_t nd = 1; nd <= 3; nd++) {
			static const uint64_t cnt[3][3] = { { 4099 }, { 67, 61 }, { 13, 11, 29 } };

			so = 0;
			dof = 0;
			ops[0] = make_op(src, dst, &so, &dof, nd, nd == 1 ? 2600 : nd == 2 ? 2300 : 2100,
					 cnt[nd - 1], 40);
			run_case(nd == 1 ? "1 outer dim, large" : nd == 2 ? "2 outer dims, large" :
					   "3 outer dims, large",
				 ops, 1, dst, ref, dof, th, src);
		}

		/* 3. Small ops of every depth, below the threading threshold. */
		so = 0;
		dof = 0;
		for (n = 0; n < 60; n++) {
			uint64_t cnt[3] = { 1 + rnd(5), 1 + rnd(4), 1 + rnd(3) };

			ops[n] = make_op(src, dst, &so, &dof, (uint32_t)(n % 4), 1 + rnd(300), cnt,
					 (int)rnd(17));
		}
		run_case("60 small mixed ops", ops, n, dst, ref, dof, th, src);

		/* 4. Many mixed ops above the threshold (uneven sizes). */
		so = 0;
		dof = 0;
		for (n = 0; n < 300; n++) {
			uint64_t cnt[3] = { 1 + rnd(40), 1 + rnd(9), 1 + rnd(4) };
			uint32_t nd = (uint32_t)rnd(4);
			uint64_t len = n % 50 == 0 ? 300000 + rnd(100000) : 1 + rnd(700);

			if (nd == 0 && n % 7 == 0)
				len = 1 + rnd(5u << 20); /* a few long single rows */
			if (len > 1000) /* big rows: few of them */
				cnt[0] = 1 + rnd(3), cnt[1] = 1, cnt[2] = 1;
			if (so + (len + 64) * cnt[0] * cnt[1] * cnt[2] + 64 > cap ||
			    dof + (len + 64) * cnt[0] * cnt[1] * cnt[2] + 64 > cap)
				break;
			ops[n] = make_op(src, dst, &so, &dof, nd, len, cnt, (int)rnd(64));
		}
		T_ASSERT(dof > (8u << 20), "case 4 exceeds the threading threshold (%llu bytes)",
			 (unsigned long long)dof);
		if (ti == 0)
			printf("case 4: %zu ops, %llu bytes\n", n, (unsigned long long)dof);
		run_case("many mixed ops, large", ops, n, dst, ref, dof, th, src);

		/* 5. Zero ops and zero-length pieces. */
		T_ASSERT(wex_mem_host_copy(ops, 0, th) == 0, "no ops");
		so = 0;
		dof = 0;
		{
			uint64_t cnt[3] = { 3, 2, 2 };

			ops[0] = make_op(src, dst, &so, &dof, 2, 0, cnt, 5);
			ops[1] = make_op(src, dst, &so, &dof, 0, 7, cnt, 0);
		}
		run_case("zero-length rows", ops, 2, dst, ref, dof, th, src);
	}
	row_order(src, dst, ref);
	transposes(src, dst, ref, cap);
	free(src);
	free(dst);
	free(ref);
	return T_EXIT_PASS;
}
