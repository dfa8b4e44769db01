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
 * dtype size, and total_bytes is their sum.  Within a physical tensor the
 * pieces' bytes do not overlap; physical names are unique within a rank.
 * Every piece is a box of a canonical tensor (wex__model_canonical) of
 * the same name, shape and dtype.  When the layout is small enough to lay
 * out every rank, each canonical tensor's every element is held by some
 * rank and by no rank twice (replication is across ranks: tp, dp, KV heads).
 * An FP8 model accepted has no modules_to_not_convert or ignored_layers
 * entry inside the name of a module it quantizes.
 */
#include <errno.h>
#include <jansson.h>
#include <string.h>

#include "fuzz_layout.h"

/* Canonical tensors (per layer and expert) past which a layout is not
 * computed: a real model's full layout takes too long for a fuzz input. */
#define TENSOR_LIMIT 4096
#define WORLD_LIMIT 4096
/* Every rank is laid out and its pieces checked against the canonical
 * tensors for layouts of at most COVER_RANKS ranks when ranks x canonical
 * tensors stay below COVER_LIMIT; a tensor cut into more than CELL_LIMIT
 * cells is not checked. */
#define COVER_RANKS 32
#define COVER_LIMIT 16384
#define CELL_LIMIT (1u << 20)
/* Entries of modules_to_not_convert x canonical tensors compared, at most. */
#define NOT_CONVERT_LIMIT (1u << 18)

/* The canonical tensors sorted by name, with the boxes the ranks hold. */
struct box {
	uint32_t rank;
	uint64_t start[WEX_MAX_DIMS], ext[WEX_MAX_DIMS];
};

struct canon {
	const struct wex_tensor *t;
	struct box *b;
	size_t nb, cap;
};

struct cover {
	struct wex_tensor *ct;
	struct canon *c;
	size_t n;
};

static int canon_cmp(const void *a, const void *b)
{
	return strcmp(((const struct canon *)a)->t->name, ((const struct canon *)b)->t->name);
}

static void cover_add(struct cover *cv, const struct wex_tensor *p, uint32_t rank)
{
	struct canon key = { .t = p }, *c;

	c = bsearch(&key, cv->c, cv->n, sizeof(*cv->c), canon_cmp);
	FZ_ASSERT(c, "piece %s is no canonical tensor", p->name);
	FZ_ASSERT(c->t->dtype == p->dtype && c->t->ndim == p->ndim &&
			  !memcmp(c->t->shape, p->shape, p->ndim * sizeof(p->shape[0])),
		  "piece %s: dtype %d ndim %u, canonical dtype %d ndim %u (or shapes differ)",
		  p->name, p->dtype, p->ndim, c->t->dtype, c->t->ndim);
	if (c->nb == c->cap) {
		c->cap = c->cap ? 2 * c->cap : 4;
		c->b = realloc(c->b, c->cap * sizeof(*c->b));
		FZ_ASSERT(c->b, "out of memory");
	}
	c->b[c->nb].rank = rank;
	memcpy(c->b[c->nb].start, p->start, sizeof(p->start));
	memcpy(c->b[c->nb].ext, p->extent, sizeof(p->extent));
	c->nb++;
}

static int u64_cmp(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

/* Index of v in the sorted cuts a[0..n). */
static size_t cut_index(const uint64_t *a, size_t n, uint64_t v)
{
	const uint64_t *x = bsearch(&v, a, n, sizeof(*a), u64_cmp);

	FZ_ASSERT(x, "cut %llu missing", (unsigned long long)v);
	return (size_t)(x - a);
}

/* c's boxes cover it, and no two boxes of one rank meet: the grid of all
 * box boundaries, each cell counted once per rank. */
static void cover_check(const struct canon *c)
{
	const struct wex_tensor *t = c->t;
	uint64_t *cuts[WEX_MAX_DIMS] = { 0 };
	size_t nc[WEX_MAX_DIMS], cells = 1;
	uint32_t *last;

	for (uint32_t d = 0; d < t->ndim; d++)
		if (t->shape[d] == 0)
			return;
	for (uint32_t d = 0; d < t->ndim; d++) {
		size_t k = 0;

		cuts[d] = malloc((2 * c->nb + 2) * sizeof(uint64_t));
		FZ_ASSERT(cuts[d], "out of memory");
		cuts[d][k++] = 0;
		cuts[d][k++] = t->shape[d];
		for (size_t i = 0; i < c->nb; i++) {
			cuts[d][k++] = c->b[i].start[d];
			cuts[d][k++] = c->b[i].start[d] + c->b[i].ext[d];
		}
		qsort(cuts[d], k, sizeof(uint64_t), u64_cmp);
		nc[d] = 0;
		for (size_t i = 0; i < k; i++)
			if (!nc[d] || cuts[d][i] != cuts[d][nc[d] - 1])
				cuts[d][nc[d]++] = cuts[d][i];
		if (__builtin_mul_overflow(cells, nc[d] - 1, &cells) || cells > CELL_LIMIT)
			cells = 0;
	}
	if (!cells) {
		for (uint32_t d = 0; d < t->ndim; d++)
			free(cuts[d]);
		return;
	}
	/* Per cell: 1 + the last rank holding it, 0 none. */
	last = calloc(cells, sizeof(*last));
	FZ_ASSERT(last, "out of memory");
	for (size_t i = 0; i < c->nb; i++) {
		const struct box *b = &c->b[i];
		size_t lo[WEX_MAX_DIMS], hi[WEX_MAX_DIMS], at[WEX_MAX_DIMS];
		int empty = 0;

		for (uint32_t d = 0; d < t->ndim; d++) {
			lo[d] = cut_index(cuts[d], nc[d], b->start[d]);
			hi[d] = cut_index(cuts[d], nc[d], b->start[d] + b->ext[d]);
			at[d] = lo[d];
			empty |= lo[d] == hi[d];
		}
		if (empty)
			continue;
		for (;;) {
			size_t cell = 0;
			uint32_t d;

			for (d = 0; d < t->ndim; d++)
				cell = cell * (nc[d] - 1) + at[d];
			FZ_ASSERT(last[cell] != b->rank + 1, "rank %u holds part of %s twice", b->rank,
				  t->name);
			last[cell] = b->rank + 1;
			for (d = t->ndim; d-- > 0;) {
				if (++at[d] < hi[d])
					break;
				at[d] = lo[d];
			}
			if (d == (uint32_t)-1)
				break;
		}
	}
	for (size_t i = 0; i < cells; i++)
		FZ_ASSERT(last[i], "%s: part of it is held by no rank", t->name);
	free(last);
	for (uint32_t d = 0; d < t->ndim; d++)
		free(cuts[d]);
}

static int piece_cmp(const void *a, const void *b)
{
	const struct wex_tensor *x = *(const struct wex_tensor *const *)a;
	const struct wex_tensor *y = *(const struct wex_tensor *const *)b;

	return x->offset < y->offset ? -1 : x->offset > y->offset;
}

static int phys_cmp(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Lays out `rank`; with cv, adds its pieces to the canonical tensors'
 * boxes.  Returns whether it was laid out. */
static int check_rank(const struct wex_model *m, const struct wex_layout_spec *spec,
		      uint32_t rank, struct cover *cv)
{
	struct wex_rank_layout l;
	char err[512] = "";
	uint64_t total = 0;
	const struct wex_tensor **order;
	const char **names;
	int ret;

	ret = wex__layout_rank(m, spec, rank, &l, err, sizeof(err));
	if (ret < 0) {
		FZ_ASSERT(err[0], "rank %u refused without a reason (%d)", rank, ret);
		return 0;
	}
	order = calloc(l.np + 1, sizeof(*order));
	names = calloc(l.nt + 1, sizeof(*names));
	FZ_ASSERT(order && names, "out of memory");
	for (size_t i = 0; i < l.nt; i++) {
		const struct wex_layout_tensor *t = &l.t[i];

		fz_check_layout_tensor(&l, i, &total);
		for (size_t k = t->first; k < t->first + t->npieces; k++) {
			const struct wex_tensor *p = &l.p[k];

			order[k - t->first] = p;
			if (cv)
				cover_add(cv, p, rank);
		}
		/* Pieces are whole rows of the physical tensor: their byte
		 * ranges, in order, do not meet. */
		qsort(order, t->npieces, sizeof(*order), piece_cmp);
		for (size_t k = 1; k < t->npieces; k++) {
			uint64_t span;

			wex__tensor_span(order[k - 1], &span);
			FZ_ASSERT(order[k - 1]->offset + span <= order[k]->offset,
				  "%s: pieces %s and %s overlap at byte %llu", t->name,
				  order[k - 1]->name, order[k]->name, (unsigned long long)order[k]->offset);
		}
		names[i] = t->name;
	}
	FZ_ASSERT(total == l.total_bytes, "total_bytes %llu, tensors hold %llu",
		  (unsigned long long)l.total_bytes, (unsigned long long)total);
	qsort(names, l.nt, sizeof(*names), phys_cmp);
	for (size_t i = 1; i < l.nt; i++)
		FZ_ASSERT(strcmp(names[i - 1], names[i]), "rank %u: physical tensor %s twice", rank,
			  names[i]);
	free(order);
	free(names);
	wex__rank_layout_free(&l);
	return 1;
}

/* Whether a string of `list` lies inside the module name (the name less
 * ".weight") of an FP8 tensor of ct[0..n); -1 past `budget` comparisons. */
static int not_convert_hits(json_t *list, const struct wex_tensor *ct, size_t n, size_t budget)
{
	size_t i;
	json_t *v;

	if ((uint64_t)json_array_size(list) * n > budget)
		return -1;
	json_array_foreach(list, i, v) {
		const char *e = json_string_value(v);

		for (size_t t = 0; e && *e && t < n; t++) {
			char mod[WEX_NAME_MAX];
			size_t nl = strlen(ct[t].name);

			if (ct[t].dtype != WEX_DT_F8_E4M3 && ct[t].dtype != WEX_DT_F8_E5M2)
				continue;
			FZ_ASSERT(nl > 7 && !strcmp(ct[t].name + nl - 7, ".weight"),
				  "FP8 tensor %s is not a .weight", ct[t].name);
			memcpy(mod, ct[t].name, nl - 7);
			mod[nl - 7] = '\0';
			if (strstr(mod, e))
				return 1;
		}
	}
	return 0;
}

/* quantization_config's modules_to_not_convert, then ignored_layers: an
 * FP8 model is refused naming the first with a string inside the name of
 * a module it quantizes (transformers' test), and accepted when neither
 * has one.  m: the model, or NULL when config text cfg_text was refused
 * with err; then, if for a list, the config without the lists must be
 * accepted and give that list a string inside an FP8 module.  Skipped
 * past NOT_CONVERT_LIMIT comparisons. */
static void check_not_convert(const struct wex_model *m, const char *cfg_text, const char *err)
{
	static const char *const keys[2] = { "modules_to_not_convert", "ignored_layers" };
	json_t *cfg, *q, *lists[2];
	struct wex_model *bare = NULL;
	struct wex_tensor *ct = NULL;
	int64_t layers, nexp;
	int refused = 2;
	size_t n;

	if (!m) {
		char what[64];

		for (refused = 0; refused < 2; refused++) {
			snprintf(what, sizeof(what), "config.json: quantization_config %s lists \"",
				 keys[refused]);
			if (!strncmp(err, what, strlen(what)))
				break;
		}
		if (refused == 2)
			return;
	}
	cfg = json_loads(cfg_text, 0, NULL);
	FZ_ASSERT(cfg, "config read, but jansson refuses it");
	q = json_object_get(cfg, "quantization_config");
	for (int k = 0; k < 2; k++)
		lists[k] = json_incref(json_object_get(q, keys[k]));
	if (!m) {
		char *txt, e2[512] = "";

		json_object_del(q, keys[0]);
		json_object_del(q, keys[1]);
		txt = json_dumps(cfg, 0);
		FZ_ASSERT(txt, "out of memory");
		FZ_ASSERT(wex__model_from_text(txt, NULL, &bare, e2, sizeof(e2)) == 0,
			  "refused for its %s, and without it for: %s", keys[refused], e2);
		free(txt);
		m = bare;
	}
	layers = wex__model_sym(m, "layers");
	nexp = wex__model_sym(m, "nexp");
	if ((layers > 0 ? layers : 1) * (nexp > 0 ? nexp + 1 : 1) <= TENSOR_LIMIT) {
		FZ_ASSERT(wex__model_canonical(m, &ct, &n) == 0, "no canonical tensors");
		for (int k = 0; k < 2 && k <= refused; k++) {
			int h = not_convert_hits(lists[k], ct, n, NOT_CONVERT_LIMIT);

			if (h < 0)
				break;
			FZ_ASSERT(h == (k == refused), "%s%s, but its %s %s a string inside an FP8 module",
				  refused < 2 ? "refused for its " : "accepted", refused < 2 ? keys[refused] : "",
				  keys[k], h ? "has" : "has no");
		}
	}
	free(ct);
	for (int k = 0; k < 2; k++)
		json_decref(lists[k]);
	json_decref(cfg);
	wex__model_free(bare);
}

/* Every rank, each canonical tensor covered and held at most once per
 * rank. */
static void check_cover(const struct wex_model *m, const struct wex_layout_spec *spec,
			uint32_t world)
{
	struct cover cv = { 0 };
	size_t n;

	FZ_ASSERT(wex__model_canonical(m, &cv.ct, &n) == 0, "no canonical tensors");
	if (world > COVER_RANKS || (uint64_t)world * n > COVER_LIMIT) {
		free(cv.ct);
		return;
	}
	cv.c = calloc(n + 1, sizeof(*cv.c));
	FZ_ASSERT(cv.c, "out of memory");
	for (size_t i = 0; i < n; i++)
		cv.c[i].t = &cv.ct[i];
	cv.n = n;
	qsort(cv.c, n, sizeof(*cv.c), canon_cmp);
	for (size_t i = 1; i < n; i++)
		FZ_ASSERT(strcmp(cv.c[i - 1].t->name, cv.c[i].t->name), "canonical tensor %s twice",
			  cv.c[i].t->name);
	for (uint32_t r = 0; r < world; r++)
		FZ_ASSERT(check_rank(m, spec, r, &cv), "rank %u of %u refused after the layout was "
			  "accepted", r, world);
	for (size_t i = 0; i < n; i++) {
		cover_check(&cv.c[i]);
		free(cv.c[i].b);
	}
	free(cv.c);
	free(cv.ct);
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
		check_not_convert(NULL, nl + 1, err);
		goto out;
	}
	FZ_ASSERT(wex_dtype_size(wex__model_dtype(m)), "model dtype %d", wex__model_dtype(m));
	layers = wex__model_sym(m, "layers");
	nexp = wex__model_sym(m, "nexp");
	if ((layers > 0 ? layers : 1) * (nexp > 0 ? nexp + 1 : 1) > TENSOR_LIMIT)
		goto out;
	check_not_convert(m, nl + 1, NULL);
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
	check_rank(m, &spec, 0, NULL);
	if (world > 1)
		check_rank(m, &spec, world - 1, NULL);
	check_cover(m, &spec, world);
out:
	wex__model_free(m);
	free(s);
	return 0;
}
