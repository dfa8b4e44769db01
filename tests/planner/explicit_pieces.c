/* SPDX-License-Identifier: MIT */
/*
 * explicit_pieces.c - proves the pluggable path: pieces a client registers
 * by hand (no layout data) with their own strides are planned and copied
 * exactly.  A 5-D canonical tensor [3,4,5,6,7] (F32) is held by two
 * producers as halves along dim 2, stored with padded strides; the consumer
 * wants the box start [1,1,1,1,1] extent [2,3,4,5,6] in a buffer with
 * other padded strides, so no dims merge: ops must keep 3 outer dims, listed
 * innermost first, and split the 4th.  Every element is checked and
 * written exactly once; the padding is never touched.
 */
#include "ptest.h"

static const uint64_t shape[5] = { 3, 4, 5, 6, 7 };

static uint64_t cidx(const uint64_t *i)
{
	uint64_t x = 0;

	for (int d = 0; d < 5; d++)
		x = x * shape[d] + i[d];
	return x;
}

struct srcs {
	float *buf[2];
};

static uint64_t base(void *arg, uint32_t rank, uint32_t seg)
{
	struct srcs *s = arg;

	return rank < 2 && seg == 7 ? (uint64_t)(uintptr_t)s->buf[rank] : 0;
}

int main(void)
{
	/* Producer pieces: dims 2 split [0,3) and [3,5), padded strides. */
	const uint64_t ps[5] = { 4 * 4 * 7 * 9, 4 * 7 * 9, 7 * 9, 9, 1 }; /* room for [.,.,4,7,9] */
	struct wex_tensor src[2];
	struct srcs s;
	uint64_t nh = pt_name_hash("w");

	for (int r = 0; r < 2; r++) {
		memset(&src[r], 0, sizeof(src[r]));
		snprintf(src[r].name, sizeof(src[r].name), "w");
		src[r].dtype = WEX_DT_F32;
		src[r].ndim = 5;
		for (int d = 0; d < 5; d++) {
			src[r].shape[d] = shape[d];
			src[r].extent[d] = shape[d];
			src[r].strides[d] = (int64_t)ps[d];
		}
		src[r].start[2] = r ? 3 : 0;
		src[r].extent[2] = r ? 2 : 3;
		src[r].segment = 7;
		src[r].offset = 16; /* bytes into the segment */
		s.buf[r] = calloc(3 * ps[0] + 64, sizeof(float));
		CHECK(s.buf[r], "oom");
		uint64_t i[5];
		for (i[0] = 0; i[0] < 3; i[0]++)
			for (i[1] = 0; i[1] < 4; i[1]++)
				for (i[2] = src[r].start[2]; i[2] < src[r].start[2] + src[r].extent[2]; i[2]++)
					for (i[3] = 0; i[3] < 6; i[3]++)
						for (i[4] = 0; i[4] < 7; i[4]++) {
							uint64_t off = 16;

							for (int d = 0; d < 5; d++)
								off += (i[d] - src[r].start[d]) * ps[d] * 4;
							pt_value(nh, cidx(i), 4, (unsigned char *)s.buf[r] + off);
						}
	}
	/* Consumer piece with strides that merge nothing. */
	const uint64_t ds[5] = { 5 * 6 * 8 * 7, 6 * 8 * 7, 8 * 7, 7, 1 };
	uint64_t dbytes = 2 * ds[0] * 4;
	unsigned char *dbuf = malloc(dbytes), *count = calloc(1, dbytes);
	struct wex_tensor dst;
	memset(&dst, 0, sizeof(dst));
	snprintf(dst.name, sizeof(dst.name), "w");
	dst.dtype = WEX_DT_F32;
	dst.ndim = 5;
	for (int d = 0; d < 5; d++) {
		dst.shape[d] = shape[d];
		dst.start[d] = 1;
		dst.extent[d] = shape[d] - 1; /* 2 3 4 5 6 */
		dst.strides[d] = (int64_t)ds[d];
	}
	dst.ptr = dbuf;
	memset(dbuf, 0xA5, dbytes);

	struct wex_plan_src ps2[2] = { { 10, &src[0], 1 }, { 11, &src[1], 1 } };
	struct wex_plan *p;
	char err[256];
	CHECK(wex__plan_build(ps2, 2, &dst, 1, 0, 1, &p, err, sizeof(err)) == 0, "%s", err);
	for (size_t i = 0; i < p->nops; i++) {
		CHECK(p->ops[i].nouter <= 3, "op %zu has %u outer dims", i, p->ops[i].nouter);
		/* Innermost first: count[0] is what executors walk fastest
		 * (and the CUDA one's 2D/3D copies take as the pitch). */
		for (uint32_t k = 1; k < p->ops[i].nouter; k++)
			CHECK(p->ops[i].dst_stride[k - 1] < p->ops[i].dst_stride[k] &&
				      p->ops[i].src_stride[k - 1] < p->ops[i].src_stride[k],
			      "op %zu lists its outer dims outermost first (dst strides %lld, %lld)", i,
			      (long long)p->ops[i].dst_stride[k - 1], (long long)p->ops[i].dst_stride[k]);
		CHECK(p->ops[i].src_rank == 10 || p->ops[i].src_rank == 11, "rank %u", p->ops[i].src_rank);
		p->ops[i].src_rank -= 10; /* the executor's table is indexed 0, 1 */
	}
	printf("%zu ops (4 non-mergeable outer dims split into 3-dim ops)\n", p->nops);
	CHECK(p->nops > 1, "expected the 4th outer dim to be split");
	CHECK(p->stats.bytes_needed == 2 * 3 * 4 * 5 * 6 * 4 && p->stats.bytes_moved == p->stats.bytes_needed,
	      "needed %llu moved %llu", (unsigned long long)p->stats.bytes_needed,
	      (unsigned long long)p->stats.bytes_moved);
	struct wex_copy_op *ops;
	CHECK(wex__plan_resolve(p, base, &s, &dst, &ops) == 0, "resolve");
	for (size_t i = 0; i < p->nops; i++) {
		const struct wex_copy_op *o = &ops[i];
		uint64_t c0 = o->nouter > 0 ? o->count[0] : 1, c1 = o->nouter > 1 ? o->count[1] : 1,
			 c2 = o->nouter > 2 ? o->count[2] : 1;

		for (uint64_t a = 0; a < c0; a++)
			for (uint64_t b = 0; b < c1; b++)
				for (uint64_t c = 0; c < c2; c++) {
					int64_t dof = (int64_t)a * (o->nouter > 0 ? o->dst_stride[0] : 0) +
						      (int64_t)b * (o->nouter > 1 ? o->dst_stride[1] : 0) +
						      (int64_t)c * (o->nouter > 2 ? o->dst_stride[2] : 0);
					uint64_t at = o->dst + (uint64_t)dof - (uint64_t)(uintptr_t)dbuf;

					CHECK(at + o->len <= dbytes, "op %zu writes outside", i);
					for (uint64_t k = 0; k < o->len; k++)
						count[at + k]++;
				}
	}
	CHECK(wex_mem_host_copy(ops, p->nops, 1) == 0, "copy");
	uint64_t i[5], bad = 0, elems = 0;
	for (i[0] = 1; i[0] < 3; i[0]++)
		for (i[1] = 1; i[1] < 4; i[1]++)
			for (i[2] = 1; i[2] < 5; i[2]++)
				for (i[3] = 1; i[3] < 6; i[3]++)
					for (i[4] = 1; i[4] < 7; i[4]++) {
						uint64_t off = 0;
						unsigned char want[4];

						for (int d = 0; d < 5; d++)
							off += (i[d] - 1) * ds[d] * 4;
						pt_value(nh, cidx(i), 4, want);
						bad += memcmp(dbuf + off, want, 4) != 0;
						for (int k = 0; k < 4; k++) {
							bad += count[off + k] != 1;
							count[off + k] = 0xEE;
						}
						elems++;
					}
	for (uint64_t b = 0; b < dbytes; b++)
		if (count[b] != 0xEE)
			bad += count[b] != 0 || dbuf[b] != 0xA5;
	CHECK(bad == 0, "%llu bad bytes or elements", (unsigned long long)bad);
	printf("%llu elements copied exactly once\n", (unsigned long long)elems);
	free(ops);
	wex__plan_free(p);
	free(dbuf);
	free(count);
	free(s.buf[0]);
	free(s.buf[1]);
	return T_PASS;
}
