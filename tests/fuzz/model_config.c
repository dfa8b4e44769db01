/* SPDX-License-Identifier: MIT */
/*
 * model_config.c - fuzzes what `wexctl plan` and `wexctl convert` read:
 * a Hugging Face config.json (wex__model_from_text, with the source
 * tree's adapters/) and a LAYOUT string (wex__layout_parse), then sizes
 * the layout (wex__layout_world) and lays out its first and last ranks
 * (wex__layout_rank).  Input: the LAYOUT on the first line, config.json
 * after it.
 *
 * A refusal must say why.  A rank layout must hold together: each
 * physical tensor's pieces lie within the piece array, each piece passes
 * wex__tensor_check, names its physical tensor as its segment and stays
 * inside that tensor's bytes, every tensor's bytes are its shape times its
 * dtype size, and total_bytes is their sum.
 */
#include <errno.h>
#include <string.h>

#include "fuzz.h"
#include "layout.h"
#include "proto.h"

/* Canonical tensors (per layer and expert) past which a layout is not
 * computed: a real model's full layout takes too long for a fuzz input. */
#define TENSOR_LIMIT 4096
#define WORLD_LIMIT 4096

static void check_rank(const struct wex_model *m, const struct wex_layout_spec *spec,
		       uint32_t rank)
{
	struct wex_rank_layout l;
	char err[512] = "";
	uint64_t total = 0;
	int ret;

	ret = wex__layout_rank(m, spec, rank, &l, err, sizeof(err));
	if (ret < 0) {
		FZ_ASSERT(err[0], "rank %u refused without a reason (%d)", rank, ret);
		return;
	}
	for (size_t i = 0; i < l.nt; i++) {
		const struct wex_phys *t = &l.t[i];
		uint64_t nb = wex_dtype_size(t->dtype);

		FZ_ASSERT(nb && t->ndim <= WEX_MAX_DIMS, "%s: dtype %d ndim %u", t->name, t->dtype,
			  t->ndim);
		for (uint32_t d = 0; d < t->ndim; d++)
			FZ_ASSERT(!__builtin_mul_overflow(nb, t->shape[d], &nb), "%s: size overflows",
				  t->name);
		FZ_ASSERT(nb == t->nbytes, "%s: %llu bytes for a shape of %llu", t->name,
			  (unsigned long long)t->nbytes, (unsigned long long)nb);
		FZ_ASSERT(t->first <= l.np && t->npieces <= l.np - t->first,
			  "%s: pieces [%zu, +%zu) of %zu", t->name, t->first, t->npieces, l.np);
		FZ_ASSERT(!__builtin_add_overflow(total, nb, &total), "total bytes overflow");
		for (size_t k = t->first; k < t->first + t->npieces; k++) {
			const struct wex_tensor *p = &l.p[k];
			uint64_t span, end;

			FZ_ASSERT(wex__tensor_check(p, err, sizeof(err)) == 0, "%s piece %zu: %s",
				  t->name, k, err);
			FZ_ASSERT(p->segment == i, "%s piece %zu: segment %u", t->name, k, p->segment);
			FZ_ASSERT(wex__tensor_span(p, &span) == 0 &&
					  !__builtin_add_overflow(p->offset, span, &end) &&
					  end <= t->nbytes,
				  "%s piece %zu: offset %llu span %llu past %llu bytes", t->name, k,
				  (unsigned long long)p->offset, (unsigned long long)span,
				  (unsigned long long)t->nbytes);
		}
	}
	FZ_ASSERT(total == l.total_bytes, "total_bytes %llu, tensors hold %llu",
		  (unsigned long long)l.total_bytes, (unsigned long long)total);
	wex__rank_layout_free(&l);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char *s = fz_strdup(data, size), *nl = strchr(s, '\n'), err[512] = "";
	struct wex_layout_spec spec;
	struct wex_model *m = NULL;
	int64_t layers, nexp;
	uint32_t world = 0;
	int ret;

	if (!nl)
		goto out;
	*nl = '\0';
	ret = wex__model_from_text(nl + 1, NULL, &m, err, sizeof(err));
	if (ret < 0) {
		FZ_ASSERT(ret == -EINVAL || ret == -ENOMEM, "model refused with %d: %s", ret, err);
		FZ_ASSERT(err[0], "model refused without a reason");
		goto out;
	}
	FZ_ASSERT(wex_dtype_size(wex__model_dtype(m)), "model dtype %d", wex__model_dtype(m));
	layers = wex__model_sym(m, "layers");
	nexp = wex__model_sym(m, "nexp");
	if ((layers > 0 ? layers : 1) * (nexp > 0 ? nexp + 1 : 1) > TENSOR_LIMIT)
		goto out;
	if (wex__layout_parse(s, &spec, err, sizeof(err)) < 0)
		goto out;
	err[0] = '\0';
	ret = wex__layout_world(m, &spec, &world, err, sizeof(err));
	if (ret < 0) {
		FZ_ASSERT(err[0], "layout %s refused without a reason (%d)", s, ret);
		goto out;
	}
	FZ_ASSERT(world >= 1, "layout %s has %u ranks", s, world);
	if (world > WORLD_LIMIT)
		goto out;
	check_rank(m, &spec, 0);
	if (world > 1)
		check_rank(m, &spec, world - 1);
out:
	wex__model_free(m);
	free(s);
	return 0;
}
