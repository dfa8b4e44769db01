/* SPDX-License-Identifier: MIT */
/*
 * random_strided.c - differential test of planner + host executor against
 * a naive element-by-element reference: random canonical tensors (0-4
 * dims, some of extent 0, element sizes 1/2/4/8 and FP8), cut into a random
 * grid of producer pieces over 1-4 ranks (some replicated), each stored at
 * an arbitrary (unaligned) byte offset with C-order or padded, permuted
 * strides; random consumer boxes with their own strides and offsets.  Some
 * tensors are large enough (256 KiB and more per row) for the streaming
 * copies and the threads.  Every consumer element must hold its canonical
 * value and every other byte of the consumer buffer must be untouched.
 * Then some of those bytes are flipped and wex__verify_ops (in place, and
 * through the gather path with every address taken for GPU memory, units
 * of random small sizes, 1-4 threads) must report the first difference in
 * op order and the count of different bytes exactly as a byte loop finds.
 * Usage: planner_random_strided [iterations] [seed]
 */
#include "ptest.h"
#include "verify.h"

static uint64_t rs;

static uint64_t rnd(uint64_t n)
{
	rs = rs * 6364136223846793005ull + 1442695040888963407ull;
	return n ? (rs >> 17) % n : 0;
}

#define MAXR 4
#define ND 4

struct tens {
	uint32_t nd;
	uint64_t shape[ND];
	int dtype;
	size_t esz;
	uint64_t nh;
};

/* A piece of tensor t ("w"): its dtype and whole shape, the rest 0. */
static void piece_init(struct wex_tensor *p, const struct tens *t)
{
	memset(p, 0, sizeof(*p));
	snprintf(p->name, sizeof(p->name), "w");
	p->dtype = t->dtype;
	p->ndim = t->nd;
	for (uint32_t d = 0; d < t->nd; d++)
		p->shape[d] = t->shape[d];
}

static uint64_t cidx_of(const struct tens *t, const uint64_t *i)
{
	uint64_t x = 0;

	for (uint32_t d = 0; d < t->nd; d++)
		x = x * t->shape[d] + i[d];
	return x;
}

/* Random strides for a box of `ext` (0: C order), nested in a random dim
 * order with random padding; returns the span in elements. */
static uint64_t pick_strides(uint32_t nd, const uint64_t *ext, int64_t *st)
{
	uint32_t order[ND];
	uint64_t acc = 1, n = 1;

	for (uint32_t d = 0; d < nd; d++)
		n *= ext[d];
	if (nd == 0 || rnd(3) == 0) {
		memset(st, 0, sizeof(int64_t) * ND);
		return n;
	}
	for (uint32_t d = 0; d < nd; d++)
		order[d] = d;
	if (rnd(2))
		for (uint32_t d = nd - 1; d > 0; d--) {
			uint32_t k = (uint32_t)rnd(d + 1), x = order[d];

			order[d] = order[k];
			order[k] = x;
		}
	/* order[nd - 1] is the innermost. */
	for (int k = (int)nd - 1; k >= 0; k--) {
		uint32_t d = order[k];

		st[d] = (int64_t)acc;
		acc *= ext[d] + (rnd(3) == 0 ? rnd(3) : 0);
	}
	if (n == 0)
		return 0;
	/* Highest offset + 1. */
	uint64_t last = 0;
	for (uint32_t d = 0; d < nd; d++)
		last += (ext[d] - 1) * (uint64_t)st[d];
	return last + 1;
}

/* Calls fn for every element of piece p: its box index and its byte
 * offset from the piece's first byte. */
static void walk(const struct wex_tensor *p, void (*fn)(void *, const uint64_t *, uint64_t),
		 void *arg)
{
	int64_t st[ND];
	uint64_t i[ND] = { 0 }, n = 1;
	size_t esz = wex_dtype_size(p->dtype);

	wex__tensor_strides(p, st);
	for (uint32_t d = 0; d < p->ndim; d++)
		n *= p->extent[d];
	for (uint64_t e = 0; e < n; e++) {
		uint64_t off = 0, g[ND];
		uint64_t r = e;

		for (int d = (int)p->ndim - 1; d >= 0; d--) {
			i[d] = r % p->extent[d];
			r /= p->extent[d];
		}
		for (uint32_t d = 0; d < p->ndim; d++) {
			off += i[d] * (uint64_t)st[d] * esz;
			g[d] = p->start[d] + i[d];
		}
		fn(arg, g, off);
	}
}

struct fillc {
	const struct tens *t;
	unsigned char *base;
	unsigned char *mark; /* consumer: bytes that belong to elements */
	uint64_t bad;
	unsigned char *buf;  /* the consumer buffer mark mirrors */
};

static void fill_one(void *arg, const uint64_t *g, uint64_t off)
{
	struct fillc *f = arg;

	pt_value(f->t->nh, cidx_of(f->t, g), f->t->esz, f->base + off);
}

static void check_one(void *arg, const uint64_t *g, uint64_t off)
{
	struct fillc *f = arg;
	unsigned char want[8];

	pt_value(f->t->nh, cidx_of(f->t, g), f->t->esz, want);
	if (memcmp(f->base + off, want, f->t->esz) && f->bad++ < 5)
		fprintf(stderr, "element %llu (byte %llu of its piece) is wrong\n",
			(unsigned long long)cidx_of(f->t, g), (unsigned long long)off);
	memset(f->mark + (f->base - f->buf) + off, 1, f->t->esz);
}

struct bases {
	unsigned char *buf[MAXR];
};

static uint64_t base_of(void *arg, uint32_t rank, uint32_t seg)
{
	struct bases *b = arg;

	return rank < MAXR && seg == 3 ? (uint64_t)(uintptr_t)b->buf[rank] : 0;
}

static int all_gpu(uint64_t addr)
{
	(void)addr;
	return 0;
}

/* Flips a few element bytes of the consumer buffer and checks what
 * wex__verify_ops reports against a byte loop over the ops. */
static uint64_t verify_check(const struct wex_copy_op *ops, size_t n, unsigned char *dbuf,
			     const unsigned char *mark, uint64_t dsize, int it)
{
	uint64_t nel = 0, bad = 0;

	for (uint64_t i = 0; i < dsize; i++)
		nel += mark[i];
	if (!nel)
		return 0;
	for (uint64_t f = rnd(6); f > 0; f--) {
		uint64_t k = rnd(nel), i = 0;

		for (;; i++)
			if (mark[i] && k-- == 0)
				break;
		dbuf[i] ^= (unsigned char)(1 + rnd(255));
	}
	/* The byte loop: ops in order, rows as a copy walks them. */
	struct wex_verify_diff want = { 0 }, got;
	int found = 0;
	for (size_t o = 0; o < n; o++) {
		const struct wex_copy_op *op = &ops[o];
		uint64_t c[3] = { 1, 1, 1 };

		for (uint32_t k = 0; k < op->nouter; k++)
			c[k] = op->count[k];
		for (uint64_t a = 0; a < c[0]; a++)
			for (uint64_t b2 = 0; b2 < c[1]; b2++)
				for (uint64_t e = 0; e < c[2]; e++) {
					uint64_t idx[3] = { a, b2, e };
					int64_t so = 0, dof = 0;

					for (uint32_t k = 0; k < op->nouter; k++) {
						so += (int64_t)idx[k] * op->src_stride[k];
						dof += (int64_t)idx[k] * op->dst_stride[k];
					}
					for (uint64_t x = 0; x < op->len; x++) {
						const unsigned char *sp = (const unsigned char *)(uintptr_t)(op->src + (uint64_t)so + x);
						const unsigned char *dp = (const unsigned char *)(uintptr_t)(op->dst + (uint64_t)dof + x);

						if (*sp == *dp)
							continue;
						want.bytes++;
						if (!found || (o == want.op && (uint64_t)dof + x < want.dst_off)) {
							want.op = o;
							want.dst_off = (uint64_t)dof + x;
							want.src_off = (uint64_t)so + x;
						}
						found = 1;
					}
				}
	}
	for (int path = 0; path < 2; path++) {
		int threads = 1 + (int)rnd(4);
		uint64_t was = wex__verify_unit(rnd(2) ? 1 + rnd(4096) : 0);
		int ret;

		if (path)
			wex__verify_where(all_gpu);
		ret = wex__verify_ops(ops, n, path ? &wex_mem_host_ops : NULL, threads, &got);
		wex__verify_where(NULL);
		wex__verify_unit(was);
		if (ret != found || (found && (got.op != want.op || got.dst_off != want.dst_off ||
					       got.src_off != want.src_off || got.bytes != want.bytes))) {
			fprintf(stderr, "iteration %d: verify (%s, %d threads) returned %d: op %zu "
				"dst_off %llu src_off %llu bytes %llu; expected %d: op %zu dst_off %llu "
				"src_off %llu bytes %llu\n", it, path ? "gathered" : "in place",
				threads, ret, got.op, (unsigned long long)got.dst_off,
				(unsigned long long)got.src_off, (unsigned long long)got.bytes, found,
				want.op, (unsigned long long)want.dst_off,
				(unsigned long long)want.src_off, (unsigned long long)want.bytes);
			bad++;
		}
	}
	return bad;
}

static const int dtypes[] = { WEX_DT_U8, WEX_DT_F8_E4M3, WEX_DT_BF16, WEX_DT_F32, WEX_DT_F64,
			      WEX_DT_I16 };

static int one(int it)
{
	struct tens t = { 0 };
	struct wex_tensor src[192], dst[3];
	size_t nsrc = 0;
	uint32_t nranks = 1 + (uint32_t)rnd(MAXR);
	uint64_t cut[ND][4], ncut[ND];
	uint64_t rsize[MAXR] = { 0 };
	struct bases b = { { 0 } };
	int big = rnd(8) == 0;

	t.nd = (uint32_t)rnd(ND + 1);
	t.dtype = dtypes[rnd(sizeof(dtypes) / sizeof(dtypes[0]))];
	t.esz = wex_dtype_size(t.dtype);
	t.nh = pt_name_hash("w") ^ (uint64_t)it;
	for (uint32_t d = 0; d < t.nd; d++) {
		t.shape[d] = rnd(12) == 0 ? 0 : 1 + rnd(7);
		if (big && d + 1 == t.nd)
			t.shape[d] = (300u << 10) / t.esz + rnd(5000);
	}
	if (big && t.nd == 0)
		big = 0;
	/* Grid of producer boxes: 1-3 cuts per dim. */
	for (uint32_t d = 0; d < t.nd; d++) {
		uint64_t k = t.shape[d] > 1 ? rnd(3) : 0;

		ncut[d] = 0;
		cut[d][ncut[d]++] = 0;
		for (uint64_t j = 0; j < k; j++) {
			uint64_t x = 1 + rnd(t.shape[d] - 1);

			if (x > cut[d][ncut[d] - 1])
				cut[d][ncut[d]++] = x;
		}
		cut[d][ncut[d]++] = t.shape[d];
	}
	uint64_t cell[ND] = { 0 };
	for (;;) {
		int reps = rnd(4) == 0 ? 2 : 1;

		for (int r = 0; r < reps && nsrc < 192; r++) {
			struct wex_tensor *p = &src[nsrc++];
			uint64_t span;

			piece_init(p, &t);
			for (uint32_t d = 0; d < t.nd; d++) {
				p->start[d] = cut[d][cell[d]];
				p->extent[d] = cut[d][cell[d] + 1] - cut[d][cell[d]];
			}
			span = pick_strides(t.nd, p->extent, p->strides);
			p->segment = 3;
			/* Ranks are plan source indices (their own rank field).
			 * Offsets: any byte, not even element-aligned. */
			uint32_t rk = (uint32_t)rnd(nranks);
			p->offset = rsize[rk] + rnd(70);
			p->ptr = (void *)(uintptr_t)rk; /* remembered below */
			rsize[rk] = p->offset + span * t.esz + rnd(9);
		}
		int d = (int)t.nd - 1;
		for (; d >= 0; d--) {
			if (++cell[d] + 1 < ncut[d])
				break;
			cell[d] = 0;
		}
		if (d < 0)
			break;
	}
	struct wex_plan_src ps[MAXR];
	struct wex_tensor *bysrc[MAXR];
	size_t nby[MAXR] = { 0 };
	for (uint32_t r = 0; r < nranks; r++) {
		b.buf[r] = malloc(rsize[r] + 64);
		CHECK(b.buf[r], "oom");
		memset(b.buf[r], 0x5A, rsize[r] + 64);
		bysrc[r] = calloc(192, sizeof(struct wex_tensor));
	}
	for (size_t i = 0; i < nsrc; i++) {
		uint32_t rk = (uint32_t)(uintptr_t)src[i].ptr;
		struct fillc f = { &t, b.buf[rk] + src[i].offset, NULL, 0, NULL };

		src[i].ptr = NULL;
		walk(&src[i], fill_one, &f);
		bysrc[rk][nby[rk]++] = src[i];
	}
	for (uint32_t r = 0; r < nranks; r++)
		ps[r] = (struct wex_plan_src){ .rank = r, .t = bysrc[r], .n = nby[r] };
	/* Consumer: 1-3 random boxes in one buffer. */
	size_t ndst = 1 + (size_t)rnd(3);
	uint64_t dsize = 0;
	for (size_t i = 0; i < ndst; i++) {
		struct wex_tensor *p = &dst[i];
		uint64_t span;

		piece_init(p, &t);
		for (uint32_t d = 0; d < t.nd; d++) {
			if (t.shape[d] == 0)
				continue;
			p->start[d] = rnd(t.shape[d]);
			p->extent[d] = rnd(3) == 0 ? t.shape[d] - p->start[d] :
						      1 + rnd(t.shape[d] - p->start[d]);
			if (rnd(3) == 0) {
				p->start[d] = 0;
				p->extent[d] = t.shape[d];
			}
		}
		span = pick_strides(t.nd, p->extent, p->strides);
		p->offset = dsize + rnd(70); /* temporarily: the byte offset */
		dsize = p->offset + span * t.esz + rnd(9);
	}
	unsigned char *dbuf = malloc(dsize + 64), *mark = calloc(1, dsize + 64);
	CHECK(dbuf && mark, "oom");
	memset(dbuf, 0xC3, dsize + 64);
	for (size_t i = 0; i < ndst; i++) {
		dst[i].ptr = dbuf + dst[i].offset;
		dst[i].offset = 0;
	}
	struct wex_plan *p = NULL;
	char err[256];
	int ret = wex__plan_build(ps, nranks, dst, ndst, 0, 1, &p, err, sizeof(err));

	/* A rank left without pieces holds nothing: fine.  Zero-size
	 * tensors need no producer at all. */
	CHECK(ret == 0, "iteration %d: plan: %d %s", it, ret, err);
	struct wex_copy_op *ops;
	CHECK(wex__plan_resolve(p, base_of, &b, dst, &ops) == 0, "resolve");
	int threads = 1 + (int)rnd(4);
	CHECK(wex_mem_host_copy(ops, p->nops, threads) == 0, "copy");
	uint64_t bad = 0;
	for (size_t i = 0; i < ndst; i++) {
		struct fillc f = { &t, dst[i].ptr, mark, 0, dbuf };

		walk(&dst[i], check_one, &f);
		bad += f.bad;
	}
	for (uint64_t i = 0; i < dsize + 64; i++)
		if (!mark[i] && dbuf[i] != 0xC3 && bad++ < 5)
			fprintf(stderr, "padding byte %llu of the consumer buffer was written\n",
				(unsigned long long)i);
	if (!bad && rnd(2))
		bad += verify_check(ops, p->nops, dbuf, mark, dsize, it);
	if (bad)
		fprintf(stderr, "iteration %d: %u dims, dtype %d, %zu sources, %zu pieces, "
			"%zu ops, %d threads: %llu problems\n", it, t.nd, t.dtype, nsrc, ndst,
			p->nops, threads, (unsigned long long)bad);
	free(ops);
	wex__plan_free(p);
	free(dbuf);
	free(mark);
	for (uint32_t r = 0; r < nranks; r++) {
		free(b.buf[r]);
		free(bysrc[r]);
	}
	return bad ? 1 : 0;
}

int main(int argc, char **argv)
{
	int iters = argc > 1 ? atoi(argv[1]) : 200;
	uint64_t seed = argc > 2 ? strtoull(argv[2], NULL, 0) : 20261201;
	int fails = 0;

	rs = seed;
	for (int i = 0; i < iters && fails < 3; i++)
		fails += one(i);
	if (fails)
		return T_FAIL;
	printf("%d random layouts copied exactly\n", iters);
	return T_PASS;
}
