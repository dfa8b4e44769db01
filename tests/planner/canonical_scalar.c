/* SPDX-License-Identifier: MIT */
/*
 * canonical_scalar.c - proves a 0-dim canonical tensor (a family entry
 * with "shape": [], one element, as plan.c counts it) is held whole by the
 * canonical engine: one piece on every hf rank, so hf -> hf:dp=2 plans and
 * copies it (the dim-0 chunking of FSDP2 left hf's scalars without a
 * piece: "no producer holds s").  The fsdp engine refuses the layout
 * naming the tensor, as FSDP2 does ("Shard dim 0 is invalid for 0D
 * tensor").  Uses a
 * family and engines of its own in a temporary adapters directory.
 */
#include <sys/stat.h>
#include <unistd.h>

#include "ptest.h"

static const char family[] =
	"{\"family\":\"t\",\"model_types\":[\"scalartest\"],\"symbols\":["
	"[\"layers\",\"layers\"],[\"hidden\",\"hidden\"]],"
	"\"tensors\":[{\"role\":\"s\",\"name\":\"s\",\"shape\":[]},"
	"{\"role\":\"w\",\"name\":\"w\",\"shape\":[\"hidden\",\"hidden\"]}]}";

static char dir[] = "/tmp/wex-scalar.XXXXXX";

static void put(const char *rel, const char *text)
{
	char path[256];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", dir, rel);
	f = fopen(path, "w");
	CHECK(f && fputs(text, f) >= 0 && fclose(f) == 0, "write %s", path);
}

static const struct wex_layout_tensor *find(const struct wex_rank_layout *l, const char *name)
{
	for (size_t i = 0; i < l->nt; i++)
		if (!strcmp(l->t[i].name, name))
			return &l->t[i];
	CHECK(0, "no physical tensor %s", name);
	return NULL;
}

/* Plans from -> to over every rank and checks every consumer byte. */
static void plan_all(const struct wex_model *m, const char *from, const char *to)
{
	struct wex_layout_spec fs, ts;
	struct pt_rank pr[2], cr[2];
	struct wex_plan_src srcs[2];
	struct wex_planner *pl = NULL;
	uint32_t pw, cw;
	char err[512] = "";

	CHECK(wex__layout_parse(from, &fs, err, sizeof(err)) == 0, "%s", err);
	CHECK(wex__layout_parse(to, &ts, err, sizeof(err)) == 0, "%s", err);
	CHECK(wex__layout_world(m, &fs, &pw, err, sizeof(err)) == 0 && pw <= 2, "%s: %s", from, err);
	CHECK(wex__layout_world(m, &ts, &cw, err, sizeof(err)) == 0 && cw <= 2, "%s: %s", to, err);
	for (uint32_t r = 0; r < pw; r++) {
		CHECK(pt_rank_make(m, &fs, r, 1, &pr[r], err, sizeof(err)) == 0, "%s", err);
		srcs[r] = (struct wex_plan_src){ r, pr[r].pieces, pr[r].l.np };
	}
	CHECK(wex__planner_new(srcs, pw, &pl, err, sizeof(err)) == 0, "%s", err);
	for (uint32_t r = 0; r < cw; r++) {
		struct pt_srcs ps = { pr, pw };
		struct wex_plan *p = NULL;

		CHECK(pt_rank_make(m, &ts, r, 0, &cr[r], err, sizeof(err)) == 0, "%s", err);
		CHECK(wex__planner_plan(pl, cr[r].pieces, cr[r].l.np, r, cw, &p, err, sizeof(err)) == 0,
		      "%s -> %s rank %u: %s", from, to, r, err);
		pt_run(p, &ps, &cr[r]);
		CHECK(pt_verify(&cr[r]) == 0, "%s -> %s rank %u: wrong bytes", from, to, r);
		wex__plan_free(p);
		pt_rank_free(&cr[r]);
	}
	wex__planner_free(pl);
	for (uint32_t r = 0; r < pw; r++)
		pt_rank_free(&pr[r]);
	printf("%-12s -> %-12s planned and copied\n", from, to);
}

int main(void)
{
	char path[256], err[512] = "";
	struct wex_model *m = NULL;
	struct wex_layout_spec s;
	struct wex_rank_layout l;
	const struct wex_layout_tensor *t;
	uint32_t w = 0;

	CHECK(mkdtemp(dir) != NULL, "mkdtemp");
	snprintf(path, sizeof(path), "%s/families", dir);
	CHECK(mkdir(path, 0755) == 0, "mkdir");
	snprintf(path, sizeof(path), "%s/engines", dir);
	CHECK(mkdir(path, 0755) == 0, "mkdir");
	/* The loader looks for families by file name: llama.json is one. */
	put("families/llama.json", family);
	put("engines/hf.json",
	    "{\"engine\":\"hf\",\"canonical\":true,\"params\":{\"tp\":1,\"pp\":1,\"dp\":1}}");
	put("engines/fsdp.json", "{\"engine\":\"fsdp\",\"canonical\":true,\"chunk_dim0\":true,"
				 "\"params\":{\"fsdp\":1,\"dp\":1}}");
	CHECK(wex__model_from_text("{\"model_type\":\"scalartest\",\"layers\":1,\"hidden\":3,"
				   "\"torch_dtype\":\"bfloat16\"}",
				   dir, &m, err, sizeof(err)) == 0,
	      "%s", err);

	/* hf: the scalar whole on every replica, one 2-byte piece. */
	for (uint32_t r = 0; r < 2; r++) {
		CHECK(wex__layout_parse("hf:dp=2", &s, err, sizeof(err)) == 0, "%s", err);
		CHECK(wex__layout_rank(m, &s, r, &l, err, sizeof(err)) == 0, "%s", err);
		t = find(&l, "s");
		CHECK(t->ndim == 0 && t->nbytes == 2 && t->npieces == 1,
		      "hf:dp=2 rank %u: s has ndim %u, %llu bytes, %zu pieces (wanted 0, 2, 1)", r,
		      t->ndim, (unsigned long long)t->nbytes, t->npieces);
		CHECK(l.p[t->first].ndim == 0 && !strcmp(l.p[t->first].name, "s") &&
			      wex_tensor_nbytes(&l.p[t->first]) == 2,
		      "hf:dp=2 rank %u: s's piece is not the whole scalar", r);
		t = find(&l, "w");
		CHECK(t->npieces == 1 && t->shape[0] == 3 && l.p[t->first].extent[0] == 3,
		      "hf:dp=2 rank %u: w is not whole", r);
		wex__rank_layout_free(&l);
	}
	printf("hf:dp=2      s whole on both ranks\n");
	plan_all(m, "hf", "hf:dp=2");
	plan_all(m, "hf:dp=2", "hf");

	/* fsdp: FSDP2 cannot shard a 0-dim parameter; refused naming it. */
	CHECK(wex__layout_parse("fsdp:fsdp=2", &s, err, sizeof(err)) == 0, "%s", err);
	err[0] = 0;
	CHECK(wex__layout_world(m, &s, &w, err, sizeof(err)) == -WEX_ELAYOUT &&
		      strstr(err, "s is a 0-dim tensor") && strstr(err, "FSDP2"),
	      "fsdp:fsdp=2 over a scalar not refused naming it: %s", err);
	printf("fsdp:fsdp=2  refused: %s\n", err);

	wex__model_free(m);
	const char *names[] = { "engines/hf", "engines/fsdp", "families/llama" };
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		snprintf(path, sizeof(path), "%s/%s.json", dir, names[i]);
		unlink(path);
	}
	snprintf(path, sizeof(path), "%s/engines", dir);
	rmdir(path);
	snprintf(path, sizeof(path), "%s/families", dir);
	rmdir(path);
	rmdir(dir);
	return T_PASS;
}
