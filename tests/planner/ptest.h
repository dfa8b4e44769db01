/* SPDX-License-Identifier: MIT */
/*
 * ptest.h - shared helpers of the planner tests: layouts materialised in
 * host buffers filled with a value derived from (canonical tensor, element
 * index), plans run through the host executor, and every destination byte
 * checked (value and a coverage count of exactly one).
 */
#ifndef WEX_PTEST_H
#define WEX_PTEST_H

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layout.h"
#include "plan.h"
#include "vmm/backend.h"

#define T_PASS 0
#define T_FAIL 1
#define T_SKIP 77

#define CHECK(cond, ...)                                                                   \
	do {                                                                               \
		if (!(cond)) {                                                             \
			fprintf(stderr, "%s:%d: check failed: %s: ", __FILE__, __LINE__,   \
				#cond);                                                    \
			fprintf(stderr, __VA_ARGS__);                                      \
			fprintf(stderr, "\n");                                             \
			exit(T_FAIL);                                                      \
		}                                                                          \
	} while (0)

static inline uint64_t pt_mix(uint64_t x)
{
	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdull;
	x ^= x >> 33;
	x *= 0xc4ceb9fe1a85ec53ull;
	x ^= x >> 33;
	return x;
}

static inline uint64_t pt_name_hash(const char *s)
{
	uint64_t h = 1469598103934665603ull;

	for (; *s; s++)
		h = (h ^ (unsigned char)*s) * 1099511628211ull;
	return h;
}

/* The value of canonical element `idx` of tensor `name`, as esz bytes. */
static inline void pt_value(uint64_t nh, uint64_t idx, size_t esz, unsigned char *out)
{
	uint64_t v = pt_mix(nh ^ (idx * 0x9e3779b97f4a7c15ull));

	memcpy(out, &v, esz < 8 ? esz : 8);
}

/* Visits each element of piece p: canonical flat index and byte offset
 * from the piece's location. */
typedef void (*pt_visit_fn)(void *arg, uint64_t cidx, uint64_t off);

static inline void pt_walk(const struct wex_tensor *p, pt_visit_fn fn, void *arg)
{
	size_t esz = wex_dtype_size(p->dtype);
	uint64_t idx[WEX_MAX_DIMS] = { 0 }, n = 1;
	int64_t st[WEX_MAX_DIMS];
	int zero = 1;

	for (uint32_t d = 0; d < p->ndim; d++) {
		n *= p->extent[d];
		if (p->strides[d])
			zero = 0;
	}
	if (n == 0)
		return;
	int64_t acc = 1;
	for (int d = (int)p->ndim - 1; d >= 0; d--) {
		st[d] = zero ? acc : p->strides[d];
		acc *= (int64_t)p->extent[d];
	}
	for (uint64_t e = 0; e < n; e++) {
		uint64_t cidx = 0, off = 0;

		for (uint32_t d = 0; d < p->ndim; d++) {
			cidx = cidx * p->shape[d] + p->start[d] + idx[d];
			off += idx[d] * (uint64_t)st[d] * esz;
		}
		fn(arg, cidx, off);
		for (int d = (int)p->ndim - 1; d >= 0; d--) {
			if (++idx[d] < p->extent[d])
				break;
			idx[d] = 0;
		}
	}
}

/* One rank materialised: all physical tensors back to back in `buf`. */
struct pt_rank {
	struct wex_rank_layout l;
	unsigned char *buf;
	uint64_t size;
	uint64_t *toff;     /* byte offset of each physical tensor in buf */
	struct wex_tensor *pieces; /* copies with segment 0 / offset / ptr set */
	unsigned char *count; /* coverage per byte (consumers) */
};

struct pt_fill {
	unsigned char *base;
	uint64_t nh;
	size_t esz;
};

static inline void pt_fill_one(void *arg, uint64_t cidx, uint64_t off)
{
	struct pt_fill *f = arg;

	pt_value(f->nh, cidx, f->esz, f->base + off);
}

static inline int pt_rank_make(const struct wex_model *m, const struct wex_layout_spec *s,
			       uint32_t rank, int fill, struct pt_rank *r, char *err, size_t errlen)
{
	int ret = wex__layout_rank(m, s, rank, &r->l, err, errlen);

	if (ret < 0)
		return ret;
	r->toff = calloc(r->l.nt + 1, sizeof(uint64_t));
	r->pieces = calloc(r->l.np + 1, sizeof(*r->pieces));
	uint64_t off = 0;
	for (size_t i = 0; i < r->l.nt; i++) {
		r->toff[i] = off;
		off += (r->l.t[i].nbytes + 63) & ~63ull;
	}
	r->size = off;
	r->buf = calloc(1, off + 64);
	r->count = calloc(1, off + 64);
	CHECK(r->toff && r->pieces && r->buf && r->count, "out of memory");
	/* Padding holds a marker so that a stray write shows. */
	memset(r->buf, 0xA5, off);
	for (size_t i = 0; i < r->l.np; i++) {
		struct wex_tensor *p = &r->pieces[i];

		*p = r->l.p[i];
		p->offset = r->toff[r->l.p[i].segment] + r->l.p[i].offset;
		p->segment = 0;
		p->ptr = r->buf + p->offset;
		if (fill) {
			struct pt_fill f = { r->buf + p->offset, pt_name_hash(p->name),
					     wex_dtype_size(p->dtype) };

			pt_walk(p, pt_fill_one, &f);
		}
	}
	return 0;
}

static inline void pt_rank_free(struct pt_rank *r)
{
	wex__rank_layout_free(&r->l);
	free(r->buf);
	free(r->count);
	free(r->toff);
	free(r->pieces);
	memset(r, 0, sizeof(*r));
}

struct pt_srcs {
	struct pt_rank *r;
	uint32_t n;
};

static inline uint64_t pt_src_base(void *arg, uint32_t rank, uint32_t seg)
{
	struct pt_srcs *s = arg;

	if (rank >= s->n || seg != 0)
		return 0;
	return (uint64_t)(uintptr_t)s->r[rank].buf;
}

/* Runs plan p into consumer rank c, counting the bytes each op writes. */
static inline void pt_run(const struct wex_plan *p, struct pt_srcs *srcs, struct pt_rank *c)
{
	struct wex_copy_op *ops;
	int ret = wex__plan_resolve(p, pt_src_base, srcs, c->pieces, &ops);

	CHECK(ret == 0, "resolve: %d", ret);
	for (size_t i = 0; i < p->nops; i++) {
		const struct wex_copy_op *o = &ops[i];
		uint64_t c0 = o->nouter > 0 ? o->count[0] : 1, c1 = o->nouter > 1 ? o->count[1] : 1,
			 c2 = o->nouter > 2 ? o->count[2] : 1;

		for (uint64_t a = 0; a < c0; a++)
			for (uint64_t b = 0; b < c1; b++)
				for (uint64_t d = 0; d < c2; d++) {
					int64_t so = 0, dof = 0;

					if (o->nouter > 0)
						so += (int64_t)a * o->src_stride[0], dof += (int64_t)a * o->dst_stride[0];
					if (o->nouter > 1)
						so += (int64_t)b * o->src_stride[1], dof += (int64_t)b * o->dst_stride[1];
					if (o->nouter > 2)
						so += (int64_t)d * o->src_stride[2], dof += (int64_t)d * o->dst_stride[2];
					uint64_t dst = o->dst + (uint64_t)dof;

					CHECK(dst >= (uint64_t)(uintptr_t)c->buf &&
						      dst + o->len <= (uint64_t)(uintptr_t)c->buf + c->size,
					      "op %zu writes outside the consumer buffer", i);
					for (uint64_t k = 0; k < o->len; k++)
						c->count[dst - (uint64_t)(uintptr_t)c->buf + k]++;
				}
	}
	CHECK(wex_mem_host_copy(ops, p->nops, 2) == 0, "host copy failed");
	free(ops);
}

struct pt_check {
	struct pt_rank *c;
	unsigned char *base;
	uint64_t nh;
	size_t esz;
	const char *name;
	uint64_t bad;
};

static inline void pt_check_one(void *arg, uint64_t cidx, uint64_t off)
{
	struct pt_check *k = arg;
	unsigned char want[8];
	uint64_t at = (uint64_t)(k->base - k->c->buf) + off;

	pt_value(k->nh, cidx, k->esz, want);
	if (memcmp(k->base + off, want, k->esz) != 0) {
		if (k->bad++ < 5)
			fprintf(stderr, "%s: element %llu has the wrong value\n", k->name,
				(unsigned long long)cidx);
	}
	/* Every byte of every destination element written exactly once. */
	for (size_t b = 0; b < k->esz; b++)
		if (k->c->count[at + b] != 1) {
			if (k->bad++ < 5)
				fprintf(stderr, "%s: element %llu byte %zu written %u times\n", k->name,
					(unsigned long long)cidx, b, k->c->count[at + b]);
		}
	/* Mark as checked: the padding scan skips it. */
	for (size_t b = 0; b < k->esz; b++)
		k->c->count[at + b] = 0xEE;
}

/* Checks a consumer rank after pt_run: values, exactly-once coverage, and
 * padding bytes untouched.  Returns the number of problems. */
static inline uint64_t pt_verify(struct pt_rank *c)
{
	uint64_t bad = 0;

	for (size_t i = 0; i < c->l.np; i++) {
		struct wex_tensor *p = &c->pieces[i];
		struct pt_check k = { c, (unsigned char *)p->ptr, pt_name_hash(p->name),
				      wex_dtype_size(p->dtype), p->name, 0 };

		pt_walk(p, pt_check_one, &k);
		bad += k.bad;
	}
	for (uint64_t b = 0; b < c->size; b++)
		if (c->count[b] != 0xEE && (c->count[b] != 0 || c->buf[b] != 0xA5)) {
			if (bad++ < 5)
				fprintf(stderr, "padding byte %llu was written\n", (unsigned long long)b);
		}
	return bad;
}

/* A u8 [rows, cols] tensor "g" held by a producer in rows row pieces
 * (src[i]: row i, column-major in its segment, at offset i) and by a
 * consumer in cols column pieces (dst[j], at offset j * rows): every
 * consumer piece is cut by every producer piece, rows x cols cells of one
 * byte (plan_cells, plan_ticks, plan_cancel). */
static inline void pt_rows_cols(struct wex_tensor *src, struct wex_tensor *dst, uint32_t rows,
				uint32_t cols)
{
	struct wex_tensor whole;

	memset(&whole, 0, sizeof(whole));
	snprintf(whole.name, sizeof(whole.name), "g");
	whole.dtype = WEX_DT_U8;
	whole.ndim = 2;
	whole.shape[0] = whole.extent[0] = rows;
	whole.shape[1] = whole.extent[1] = cols;
	for (uint32_t i = 0; i < rows; i++) {
		src[i] = whole;
		src[i].start[0] = i;
		src[i].extent[0] = 1;
		src[i].strides[0] = 1; /* column-major: each column's copy one op */
		src[i].strides[1] = rows;
		src[i].offset = i;
	}
	for (uint32_t j = 0; j < cols; j++) {
		dst[j] = whole;
		dst[j].start[1] = j;
		dst[j].extent[1] = 1;
		dst[j].offset = (uint64_t)j * rows;
	}
}

#endif
