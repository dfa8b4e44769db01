/* SPDX-License-Identifier: MIT */
/*
 * layout_api.c - the model adaptation layer in libwex's public API
 * (wex_layout_*): an engine or trainer asks which physical tensors a rank
 * of a layout holds and which canonical boxes each holds, and attaches or
 * registers its own parameters with those pieces.  The same interpreter
 * as wexctl plan and convert (layout.c).
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layout.h"
#include "wex.h"

struct wex_layout {
	struct wex_model *m;
	struct wex_layout_spec spec;
	uint32_t world;
	struct wex_rank_layout rank; /* the last rank asked for */
	int have_rank;
	char err[1024];
};

static int fail(char **err, int ret, const char *msg)
{
	if (err)
		*err = strdup(msg && *msg ? msg : wex_strerror(ret));
	return ret;
}

WEX_API int wex_layout_open(const char *config, const char *spec, const char *adapters,
			    wex_layout_t **out, uint32_t *world, char **err)
{
	struct wex_layout *l;
	char msg[1024] = "";
	int ret;

	if (err)
		*err = NULL;
	if (out)
		*out = NULL;
	if (!config || !spec || !out)
		return fail(err, -EINVAL, "wex_layout_open: config, spec and out must not be NULL");
	l = calloc(1, sizeof(*l));
	if (!l)
		return fail(err, -ENOMEM, NULL);
	ret = wex__model_load(config, adapters, &l->m, msg, sizeof(msg));
	if (ret == 0)
		ret = wex__layout_parse(spec, &l->spec, msg, sizeof(msg));
	/* Read once: its ranks lay out what was opened (pure computation). */
	if (ret == 0)
		ret = wex__model_pin_engine(l->m, l->spec.engine, msg, sizeof(msg));
	if (ret == 0)
		ret = wex__layout_world(l->m, &l->spec, &l->world, msg, sizeof(msg));
	if (ret < 0) {
		wex_layout_close(l);
		return fail(err, ret, msg);
	}
	if (world)
		*world = l->world;
	*out = l;
	return 0;
}

WEX_API int wex_layout_rank(wex_layout_t *l, uint32_t rank, const struct wex_layout_tensor **phys,
			    size_t *nphys, const struct wex_tensor **pieces, size_t *npieces)
{
	struct wex_rank_layout r;

	if (!l)
		return -EINVAL;
	l->err[0] = 0;
	if (!phys || !nphys || !pieces || !npieces) {
		snprintf(l->err, sizeof(l->err), "wex_layout_rank: phys, nphys, pieces and npieces must not be NULL");
		return -EINVAL;
	}
	if (rank >= l->world) {
		snprintf(l->err, sizeof(l->err), "rank %u: the layout has %u ranks", rank, l->world);
		return -EINVAL;
	}
	int ret = wex__layout_rank(l->m, &l->spec, rank, &r, l->err, sizeof(l->err));

	if (ret < 0)
		return ret;
	if (l->have_rank)
		wex__rank_layout_free(&l->rank);
	l->rank = r;
	l->have_rank = 1;
	*phys = r.t;
	*nphys = r.nt;
	*pieces = r.p;
	*npieces = r.np;
	return 0;
}

WEX_API const char *wex_layout_error(wex_layout_t *l)
{
	return l ? l->err : "";
}

WEX_API void wex_layout_close(wex_layout_t *l)
{
	if (!l)
		return;
	if (l->have_rank)
		wex__rank_layout_free(&l->rank);
	wex__model_free(l->m);
	free(l);
}
