/* SPDX-License-Identifier: MIT */
/*
 * fuzz_layout.h - what the layout harnesses (model_config.c, adapters.c)
 * assert of each tensor wex__layout_rank lays out.
 */
#ifndef WEX_FUZZ_LAYOUT_H
#define WEX_FUZZ_LAYOUT_H

#include "fuzz.h"
#include "layout.h"
#include "proto.h"

/* Tensor i of l: its dtype and shape give its nbytes, its pieces lie in
 * l's list, each valid, of segment i and within the tensor's bytes; its
 * bytes are added to *total (without overflow). */
static inline void fz_check_layout_tensor(const struct wex_rank_layout *l, size_t i,
					  uint64_t *total)
{
	const struct wex_layout_tensor *t = &l->t[i];
	uint64_t nb = wex_dtype_size(t->dtype);
	char err[512];

	FZ_ASSERT(nb && t->ndim <= WEX_MAX_DIMS, "%s: dtype %d ndim %u", t->name, t->dtype,
		  t->ndim);
	for (uint32_t d = 0; d < t->ndim; d++)
		FZ_ASSERT(!__builtin_mul_overflow(nb, t->shape[d], &nb), "%s: size overflows",
			  t->name);
	FZ_ASSERT(nb == t->nbytes, "%s: %llu bytes for a shape of %llu", t->name,
		  (unsigned long long)t->nbytes, (unsigned long long)nb);
	FZ_ASSERT(t->first <= l->np && t->npieces <= l->np - t->first,
		  "%s: pieces [%zu, +%zu) of %zu", t->name, t->first, t->npieces, l->np);
	FZ_ASSERT(!__builtin_add_overflow(*total, nb, total), "total bytes overflow");
	for (size_t k = t->first; k < t->first + t->npieces; k++) {
		const struct wex_tensor *p = &l->p[k];
		uint64_t span, end;

		FZ_ASSERT(wex__tensor_check(p, err, sizeof(err)) == 0, "%s piece %zu: %s", t->name,
			  k, err);
		FZ_ASSERT(p->segment == i, "%s piece %zu: segment %u", t->name, k, p->segment);
		FZ_ASSERT(wex__tensor_span(p, &span) == 0 &&
				  !__builtin_add_overflow(p->offset, span, &end) && end <= t->nbytes,
			  "%s piece %zu: offset %llu span %llu past %llu bytes", t->name, k,
			  (unsigned long long)p->offset, (unsigned long long)span,
			  (unsigned long long)t->nbytes);
	}
}

#endif
