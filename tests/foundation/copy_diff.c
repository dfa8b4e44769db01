/* SPDX-License-Identifier: MIT */
/*
 * copy_diff - differential test of the host copy executor
 * (wex_mem_host_copy) and of the verify comparison (wex__verify_ops) over
 * the same ops, against a naive element-by-element reference.  Random
 * ops of 0-3 outer dims listed in any order, counts of 0, 1, odd and
 * large; destination strides of either sign (rows never overlap there),
 * source strides of either sign, zero (one row read many times) or
 * smaller than a row (rows read overlapping): the executor's contract
 * takes int64 strides, though wexd refuses negative tensor strides today;
 * element sizes 1/2/4/8/16 and addresses off any alignment; rows just
 * below, at and above the streaming-store threshold (256 KiB) and totals
 * above the threading threshold (8 MiB), copied with 1, 2, 3, 7 and 64
 * threads.  Every byte of the destination buffer is compared, those no
 * op writes too.
 * Then verify: the copies compare equal, in place and gathered (the host
 * backend standing in for a GPU one), with the unit at 64 MiB and at odd
 * small sizes (ops cut along a dim, a row cut in pieces); and a single
 * byte changed in a destination is found, with its op, its offsets from
 * the op's dst and src and a count of one: every byte of the small cases
 * (up to 600 bytes), and elsewhere each op's first and last byte, a byte
 * in a row's tail shorter than a vector and a random one.
 * Usage: copy_diff [seed] (another seed: other cases, for longer runs).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "helpers.h"
#include "verify.h"
#include "vmm/backend.h"

static uint64_t rng = 0x9E3779B97F4A7C15ull;

/* helpers.h's xorshift64, modulo a 64-bit n. */
static uint64_t rnd(uint64_t n)
{
	(void)t_rand(&rng, 1);
	return n ? rng % n : 0;
}

#define MAXOPS 64

struct tcase {
	struct wex_copy_op ops[MAXOPS];
	size_t n;
	uint64_t esize;
	/* The destination of op i is [dlo[i], dhi[i]) of the buffer. */
	uint64_t dlo[MAXOPS], dhi[MAXOPS];
	uint64_t dused; /* bytes of the buffer compared: past every op */
};

static unsigned char *src, *dst, *ref;
static uint64_t scap, dcap;

static uint64_t op_rows(const struct wex_copy_op *op)
{
	uint64_t r = 1;

	for (uint32_t k = 0; k < op->nouter; k++)
		r *= op->count[k];
	return r;
}

/* Offsets of row r (count[0] fastest) from the op's src and dst. */
static void row_off(const struct wex_copy_op *op, uint64_t r, int64_t *so, int64_t *dof)
{
	*so = *dof = 0;
	for (uint32_t k = 0; k < op->nouter; k++) {
		uint64_t i = r % op->count[k];

		r /= op->count[k];
		*so += (int64_t)i * op->src_stride[k];
		*dof += (int64_t)i * op->dst_stride[k];
	}
}

/* The reference: element by element, in the nesting the op lists. */
static void ref_copy(const struct wex_copy_op *op, unsigned char *to, uint64_t esize)
{
	uint64_t rows = op_rows(op);

	for (uint64_t r = 0; r < rows; r++) {
		int64_t so, dof;

		row_off(op, r, &so, &dof);
		const unsigned char *s = (const unsigned char *)(uintptr_t)(op->src + (uint64_t)so);
		unsigned char *d = to + ((op->dst + (uint64_t)dof) - (uint64_t)(uintptr_t)dst);

		for (uint64_t e = 0; e < op->len; e += esize)
			for (uint64_t b = 0; b < esize; b++)
				d[e + b] = s[e + b];
	}
}

/*
 * Adds an op of `nd` outer dims, rows of `elems` elements, counts cnt[]
 * (innermost first in memory, listed in a random order): destination
 * rows packed with gaps, each dim's sign random; source strides random
 * (zero, negative, overlapping rows).  Returns 0 when it does not fit.
 */
static int add_op(struct tcase *tc, uint64_t *dpos, uint32_t nd, uint64_t elems,
		  const uint64_t *cnt, int wild_src)
{
	struct wex_copy_op op = { 0 };
	uint64_t es = tc->esize, len = elems * es, span = len + es * rnd(3);
	int64_t ds[3], ss[3];
	int64_t dmin = 0, dmax = 0, smin = 0, smax = 0;
	uint32_t perm[3] = { 0, 1, 2 };

	if (tc->n == MAXOPS)
		return 0;
	for (uint32_t k = 0; k < nd; k++) {
		int64_t sign = rnd(3) == 0 ? -1 : 1;

		ds[k] = sign * (int64_t)span;
		span = span * cnt[k] + es * rnd(4);
		switch (wild_src ? rnd(5) : 4) {
		case 0:
			ss[k] = 0;
			break;
		case 1: /* rows read overlapping */
			ss[k] = (int64_t)(es * (1 + rnd(elems)));
			break;
		case 2:
			ss[k] = -(int64_t)(es * (1 + rnd(2 * elems + 8)));
			break;
		case 3:
			ss[k] = (int64_t)(es * rnd(3 * elems + 8));
			break;
		default: /* the destination's stride: folds */
			ss[k] = ds[k];
			break;
		}
	}
	/* A random order of the dims in the op. */
	for (uint32_t k = nd; k > 1; k--) {
		uint32_t j = (uint32_t)rnd(k), t = perm[k - 1];

		perm[k - 1] = perm[j];
		perm[j] = t;
	}
	op.len = len;
	op.nouter = nd;
	for (uint32_t k = 0; k < nd; k++) {
		uint32_t p = perm[k];

		op.count[k] = cnt[p];
		op.dst_stride[k] = ds[p];
		op.src_stride[k] = ss[p];
	}
	for (uint32_t k = 0; k < nd; k++) {
		if (!op.count[k])
			continue;
		int64_t d = (int64_t)(op.count[k] - 1) * op.dst_stride[k];
		int64_t s = (int64_t)(op.count[k] - 1) * op.src_stride[k];

		dmin += d < 0 ? d : 0;
		dmax += d > 0 ? d : 0;
		smin += s < 0 ? s : 0;
		smax += s > 0 ? s : 0;
	}
	uint64_t dspan = (uint64_t)(dmax - dmin) + len, sspan = (uint64_t)(smax - smin) + len;
	uint64_t dstart = *dpos + rnd(64);

	if (dstart + dspan + 64 > dcap || sspan + 64 > scap)
		return 0;
	uint64_t sstart = rnd(scap - sspan - 63);

	op.dst = (uint64_t)(uintptr_t)dst + dstart - (uint64_t)dmin;
	op.src = (uint64_t)(uintptr_t)src + sstart - (uint64_t)smin;
	tc->dlo[tc->n] = dstart;
	tc->dhi[tc->n] = dstart + dspan;
	tc->ops[tc->n++] = op;
	*dpos = dstart + dspan;
	tc->dused = *dpos + 64;
	return 1;
}

static void make_ref(const struct tcase *tc)
{
	memset(ref, 0xEE, tc->dused);
	for (size_t i = 0; i < tc->n; i++)
		ref_copy(&tc->ops[i], ref, tc->esize);
}

static void run_copy(const char *what, const struct tcase *tc, int threads)
{
	int ret;

	memset(dst, 0xEE, tc->dused);
	ret = wex_mem_host_copy(tc->ops, tc->n, threads);
	T_ASSERT(ret == 0, "%s, %d threads: returned %d", what, threads, ret);
	if (memcmp(dst, ref, tc->dused))
		for (uint64_t i = 0; i < tc->dused; i++)
			if (dst[i] != ref[i]) {
				size_t o = 0;

				while (o < tc->n && !(i >= tc->dlo[o] && i < tc->dhi[o]))
					o++;
				T_FAIL("%s, %d threads, esize %llu: byte %llu (op %zu) is %#x, "
				       "expected %#x", what, threads, (unsigned long long)tc->esize,
				       (unsigned long long)i, o, dst[i], ref[i]);
			}
}

static int all_gpu(uint64_t addr)
{
	(void)addr;
	return 0;
}

/* Path 0: in place; 1: gathered through the host backend. */
static int verify(const struct tcase *tc, int path, int threads, struct wex_verify_diff *d)
{
	int ret;

	wex__verify_where(path ? all_gpu : NULL);
	ret = wex__verify_ops(tc->ops, tc->n, path ? &wex_mem_host_ops : NULL, threads, d);
	wex__verify_where(NULL);
	return ret;
}

/* Changes the destination byte of op o, row r, column col: verify must
 * report exactly it. */
static void flip_check(const char *what, const struct tcase *tc, size_t o, uint64_t r,
		       uint64_t col, int path, int threads)
{
	const struct wex_copy_op *op = &tc->ops[o];
	struct wex_verify_diff d;
	int64_t so, dof;
	unsigned char *p;
	int ret;

	row_off(op, r, &so, &dof);
	p = (unsigned char *)(uintptr_t)(op->dst + (uint64_t)dof + col);
	*p ^= 0x5A;
	ret = verify(tc, path, threads, &d);
	*p ^= 0x5A;
	T_ASSERT(ret == 1 && d.op == o && d.dst_off == (uint64_t)dof + col &&
			 d.src_off == (uint64_t)so + col && d.bytes == 1,
		 "%s, path %d, %d threads: byte %llu of row %llu of op %zu (len %llu, nouter %u) "
		 "changed: verify returned %d, op %zu, dst_off %lld, src_off %lld, %llu bytes "
		 "(expected dst_off %lld, src_off %lld)",
		 what, path, threads, (unsigned long long)col, (unsigned long long)r, o,
		 (unsigned long long)op->len, op->nouter, ret, d.op, (long long)d.dst_off,
		 (long long)d.src_off, (unsigned long long)d.bytes, (long long)(dof + (int64_t)col),
		 (long long)(so + (int64_t)col));
}

static void verify_case(const char *what, const struct tcase *tc, int threads, int exhaustive,
			const uint64_t *units, size_t nunits)
{
	struct wex_verify_diff d;

	for (size_t ui = 0; ui < nunits; ui++) {
		uint64_t was = wex__verify_unit(units[ui]);

		for (int path = 0; path < 2; path++) {
			/* Gathered, a run of tiny units is a thread handshake
			 * each: at most some hundred runs. */
			if (path && units[ui] * 256 < wex__ops_bytes(tc->ops, tc->n))
				continue;
			int ret = verify(tc, path, threads, &d);

			T_ASSERT(ret == 0, "%s, unit %llu, path %d, %d threads: equal copies compare "
				 "%d (op %zu, dst_off %llu, %llu bytes)", what,
				 (unsigned long long)units[ui], path, threads, ret, d.op,
				 (unsigned long long)d.dst_off, (unsigned long long)d.bytes);
			for (size_t o = 0; o < tc->n; o++) {
				const struct wex_copy_op *op = &tc->ops[o];
				uint64_t rows = op_rows(op), len = op->len;

				if (!rows || !len)
					continue;
				/* Every byte: in place at full and tiny units,
				 * gathered (a comparison thread started for each
				 * call) at full units where the ops are few bytes. */
				if (exhaustive &&
				    ((!path && ui != 1) ||
				     (path && ui == 0 && wex__ops_bytes(tc->ops, tc->n) <= 256))) {
					for (uint64_t r = 0; r < rows; r++)
						for (uint64_t c = 0; c < len; c++)
							flip_check(what, tc, o, r, c, path, threads);
					continue;
				}
				flip_check(what, tc, o, 0, 0, path, threads);
				flip_check(what, tc, o, rows - 1, len - 1, path, threads);
				/* In a tail shorter than a vector (the row's last len % 32). */
				flip_check(what, tc, o, rnd(rows), len - 1 - rnd(len % 32 ? len % 32 : 1),
					   path, threads);
				flip_check(what, tc, o, rnd(rows), rnd(len), path, threads);
			}
		}
		wex__verify_unit(was);
	}
}

static void random_case(struct tcase *tc, int big, int wild_src)
{
	static const uint64_t esizes[] = { 1, 2, 4, 8, 16 };
	uint64_t dpos = 0;
	size_t want = big ? 1 + rnd(6) : 1 + rnd(8);

	memset(tc, 0, sizeof(*tc));
	tc->esize = esizes[rnd(5)];
	for (size_t tries = 0; tc->n < want && tries < 50; tries++) {
		uint32_t nd = (uint32_t)rnd(4);
		uint64_t cnt[3], elems;

		for (uint32_t k = 0; k < 3; k++) {
			uint64_t pick = rnd(10);

			cnt[k] = pick == 0 ? 0 : pick < 3 ? 1 : pick < 6 ? 1 + 2 * rnd(4) : 1 + rnd(7);
		}
		if (rnd(12) == 0)
			cnt[0] = 0; /* a dim of no index: nothing */
		if (big) {
			/* Rows around the streaming threshold, or many rows. */
			uint64_t nt = (256u << 10) / tc->esize;

			switch (rnd(4)) {
			case 0:
				elems = nt - 1 + rnd(3);
				break;
			case 1:
				elems = nt + rnd(nt);
				break;
			case 2:
				elems = (9u << 20) / tc->esize + rnd(1000); /* one long row */
				nd = 0;
				break;
			default:
				elems = 1 + rnd(200);
				cnt[0] = 1000 + rnd(3000);
				break;
			}
			if (elems > 1000)
				for (uint32_t k = 0; k < 3; k++)
					cnt[k] = cnt[k] > 3 ? 3 : cnt[k];
		} else {
			elems = 1 + rnd(rnd(4) == 0 ? 40 : 9);
		}
		add_op(tc, &dpos, nd, elems, cnt, wild_src);
	}
}

int main(int argc, char **argv)
{
	static const int threads[] = { 1, 2, 3, 7, 64 };
	static const uint64_t small_units[] = { 64u << 20, 1000, 97, 5 };
	static const uint64_t large_units[] = { 64u << 20, (1u << 20) + 13 };
	static struct tcase tc;
	char what[64];

	if (argc > 1)
		rng ^= strtoull(argv[1], NULL, 0) * 0xD1342543DE82EF95ull;
	if (!rng)
		rng = 1;
	scap = 12u << 20;
	dcap = 40u << 20;
	src = malloc(scap);
	dst = malloc(dcap);
	ref = malloc(dcap);
	T_ASSERT(src && dst && ref, "malloc");
	for (uint64_t i = 0; i < scap; i++)
		src[i] = (unsigned char)(i * 131 + (i >> 9) + 7);

	/* Small cases: every byte of every op flipped, found. */
	for (int it = 0; it < 24; it++) {
		int th = threads[(it + it / 4) % 4]; /* 64 only for the large ones */

		random_case(&tc, 0, it % 4 != 0);
		snprintf(what, sizeof(what), "small case %d", it);
		make_ref(&tc);
		run_copy(what, &tc, th);
		/* Every byte flipped where the case is small enough. */
		uint64_t bytes = wex__ops_bytes(tc.ops, tc.n);

		verify_case(what, &tc, bytes <= 600 ? 1 : th, bytes <= 600,
			    small_units, 4);
	}
	/* Large cases: streaming stores, threads. */
	for (int it = 0; it < 12; it++) {
		random_case(&tc, 1, it % 3 != 0);
		snprintf(what, sizeof(what), "large case %d", it);
		make_ref(&tc);
		printf("%s: %zu ops, %llu bytes, esize %llu\n", what, tc.n,
		       (unsigned long long)wex__ops_bytes(tc.ops, tc.n), (unsigned long long)tc.esize);
		for (size_t ti = 0; ti < sizeof(threads) / sizeof(threads[0]); ti++)
			run_copy(what, &tc, threads[ti]);
		if (it < 4)
			verify_case(what, &tc, threads[it % 5], 0, large_units, 2);
	}
	free(src);
	free(dst);
	free(ref);
	return T_EXIT_PASS;
}
