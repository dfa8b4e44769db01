/* SPDX-License-Identifier: MIT */
/* kat_common.h - small helpers for the known-answer tests. */
#ifndef WEX_KAT_COMMON_H
#define WEX_KAT_COMMON_H

#include "ptest.h"

static inline struct wex_model *kat_model(const char *cfg)
{
	struct wex_model *m;
	char err[256];

	CHECK(wex__model_from_text(cfg, NULL, &m, err, sizeof(err)) == 0, "%s", err);
	return m;
}

static inline void kat_rank(const struct wex_model *m, const char *layout, uint32_t rank,
			    struct wex_rank_layout *l)
{
	struct wex_layout_spec s;
	char err[256];

	CHECK(wex__layout_parse(layout, &s, err, sizeof(err)) == 0, "%s", err);
	CHECK(wex__layout_rank(m, &s, rank, l, err, sizeof(err)) == 0, "%s rank %u: %s", layout, rank,
	      err);
}

static inline const struct wex_layout_tensor *kat_find(const struct wex_rank_layout *l, const char *name)
{
	for (size_t i = 0; i < l->nt; i++)
		if (!strcmp(l->t[i].name, name))
			return &l->t[i];
	CHECK(0, "no physical tensor %s", name);
	return NULL;
}

/* Piece k of t must hold rows [r0, r0+n) of canonical `cname` (whole
 * columns) starting at physical row `prow`. */
static inline void kat_piece(const struct wex_rank_layout *l, const struct wex_layout_tensor *t, size_t k,
			     const char *cname, uint64_t r0, uint64_t n, uint64_t prow)
{
	CHECK(k < t->npieces, "%s has %zu pieces, wanted piece %zu", t->name, t->npieces, k);
	const struct wex_tensor *p = &l->p[t->first + k];
	uint64_t rowbytes = wex_dtype_size(t->dtype);

	for (uint32_t d = 1; d < t->ndim; d++)
		rowbytes *= t->shape[d];
	CHECK(!strcmp(p->name, cname), "%s piece %zu is %s, wanted %s", t->name, k, p->name, cname);
	CHECK(p->start[0] == r0 && p->extent[0] == n, "%s piece %zu rows [%llu,+%llu), wanted [%llu,+%llu)",
	      t->name, k, (unsigned long long)p->start[0], (unsigned long long)p->extent[0],
	      (unsigned long long)r0, (unsigned long long)n);
	CHECK(p->offset == prow * rowbytes, "%s piece %zu at byte %llu, wanted row %llu", t->name, k,
	      (unsigned long long)p->offset, (unsigned long long)prow);
}

/* Canonical tensor `name` of l must be `dtype` of shape [d0, d1], or [d0]
 * where d1 is 0. */
static inline const struct wex_tensor *kat_canon(const struct wex_rank_layout *l, const char *name,
						 int dtype, uint64_t d0, uint64_t d1)
{
	for (size_t i = 0; i < l->np; i++) {
		const struct wex_tensor *t = &l->p[i];

		if (strcmp(t->name, name))
			continue;
		CHECK(t->dtype == dtype, "%s is %s, wanted %s", name, wex_dtype_name(t->dtype),
		      wex_dtype_name(dtype));
		CHECK(t->ndim == (d1 ? 2u : 1u) && t->shape[0] == d0 && (!d1 || t->shape[1] == d1),
		      "%s is %uD %llux%llu, wanted %llux%llu", name, t->ndim,
		      (unsigned long long)t->shape[0],
		      (unsigned long long)(t->ndim > 1 ? t->shape[1] : 0), (unsigned long long)d0,
		      (unsigned long long)d1);
		return t;
	}
	CHECK(0, "no canonical tensor %s", name);
	return NULL;
}

/* `layout` of m must be refused (-WEX_ELAYOUT) with an error naming both
 * `a` and `b`. */
static inline void kat_refused(const struct wex_model *m, const char *layout, const char *a,
			       const char *b)
{
	struct wex_layout_spec sp;
	uint32_t w;
	char err[512] = "";

	CHECK(wex__layout_parse(layout, &sp, err, sizeof(err)) == 0, "%s", err);
	CHECK(wex__layout_world(m, &sp, &w, err, sizeof(err)) == -WEX_ELAYOUT, "%s accepted", layout);
	CHECK(strstr(err, a) && strstr(err, b), "%s: error does not name %s and %s: %s", layout, a, b,
	      err);
	printf("%-44s %s\n", layout, err);
}

#endif
