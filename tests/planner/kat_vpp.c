/* SPDX-License-Identifier: MIT */
/*
 * kat_vpp.c - proves megatron:...,vpp=V lays out Megatron-Core's virtual
 * pipeline (the interleaved 1F1B schedule, --num-virtual-stages-per-
 * pipeline-rank V): every pp rank holds V model chunks, chunk v of pp rank
 * p the L/(P*V) layers from v*(L/V) + p*(L/(P*V)) on (get_num_layers_to_
 * build and the layer offset in megatron/core/transformer/transformer_
 * block.py and transformer_layer.py; the comment there: 8 layers, 2
 * stages, 2 virtual stages -> stage 0 [0,1] [4,5], stage 1 [2,3] [6,7];
 * 4 virtual stages -> [0] [2] [4] [6] and [1] [3] [5] [7]).  Checked on
 * the layer names and pieces of every rank:
 *
 * - each chunk's names carry the prefix model{v}. (legacy checkpoints
 *   store chunk v as state_dict['model%d' % v]), layers numbered from 0
 *   within the chunk, each holding exactly its global layers;
 * - the embedding sits in chunk 0 of pp rank 0 only, the final norm and
 *   output layer (tied: the embedding's copy) in chunk V-1 of the last pp
 *   rank only (is_pipeline_first_stage / is_pipeline_last_stage without
 *   ignore_virtual);
 * - MoE experts stay inside their chunk (SequentialMLP and grouped names);
 * - the world size is still tp*dp*pp; vpp=1 is the layout without it,
 *   byte for byte (no prefix);
 * - refused, naming the numbers: vpp>1 with pp=1 (Megatron-Core:
 *   "pipeline-model-parallel size should be greater than 1 with
 *   interleaved schedule"), layers that do not divide into pp*vpp chunks,
 *   a stage whose first/last layers do not divide into vpp chunks, first
 *   and last both on pp=2 (Megatron-Core's offset divides by the middle
 *   stages, none: ZeroDivisionError), vpp=0, and vpp given to an
 *   engine without it (vllm, sglang, hf);
 * - first/last under vpp (first, last or both) as get_transformer_layer_
 *   offset places them with vp_stage (last alone: middle_pipeline_rank).
 */
#include <errno.h>

#include "kat_common.h"

#define CFG(N) "{\"model_type\":\"llama\",\"hidden_size\":8,\"num_hidden_layers\":" #N "," \
	       "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"intermediate_size\":8," \
	       "\"vocab_size\":64,\"torch_dtype\":\"bfloat16\"}"
#define TIED "{\"model_type\":\"qwen2\",\"hidden_size\":8,\"num_hidden_layers\":4," \
	     "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"intermediate_size\":8," \
	     "\"vocab_size\":64,\"tie_word_embeddings\":true,\"torch_dtype\":\"bfloat16\"}"
#define MOE "{\"model_type\":\"qwen3_moe\",\"hidden_size\":8,\"num_hidden_layers\":4," \
	    "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"head_dim\":2," \
	    "\"intermediate_size\":16,\"moe_intermediate_size\":4,\"num_experts\":4," \
	    "\"vocab_size\":64,\"torch_dtype\":\"bfloat16\"}"

#define MAXC 64

/* Layer of canonical name "model.layers.L....", -1 for the others. */
static int canon_layer(const char *name)
{
	int L, n = 0;

	if (sscanf(name, "model.layers.%d.%n", &L, &n) == 1 && n > 0)
		return L;
	return -1;
}

/* Every rank of `layout` (tp ranks, dp=1, pp stages, vpp chunks) must hold
 * chunk v of pp rank p as the n layers from start[p*vpp + v], named
 * model{v}.decoder.layers.{0..n-1} (no prefix when vpp is 1), each with
 * the same number of physical tensors; the embedding in chunk 0 of pp rank
 * 0 only, final norm and output layer in chunk vpp-1 of the last. */
static void chunks(const char *cfg, const char *layout, uint32_t tp, int pp, int vpp,
		   const int *start, int n)
{
	struct wex_model *m = kat_model(cfg);
	struct wex_layout_spec sp;
	char err[512] = "";
	uint32_t w;
	int per_layer = -1;

	CHECK(pp * vpp * n == wex__model_sym(m, "layers") && vpp * n <= MAXC, "test error: %s", layout);
	CHECK(wex__layout_parse(layout, &sp, err, sizeof(err)) == 0, "%s", err);
	CHECK(wex__layout_world(m, &sp, &w, err, sizeof(err)) == 0, "%s: %s", layout, err);
	CHECK(w == tp * (uint32_t)pp, "%s: %u ranks, wanted tp*pp = %u", layout, w, tp * (uint32_t)pp);
	for (uint32_t rank = 0; rank < w; rank++) {
		struct wex_rank_layout l;
		int p = (int)(rank / tp), held[MAXC] = { 0 }, embed = 0, norm = 0, out = 0;

		kat_rank(m, layout, rank, &l);
		for (size_t i = 0; i < l.nt; i++) {
			const struct wex_layout_tensor *t = &l.t[i];
			const char *rest = t->name;
			int v = 0, k = 0, loc;

			for (size_t j = 0; j < i; j++)
				CHECK(strcmp(l.t[j].name, t->name), "%s rank %u: %s twice", layout, rank,
				      t->name);
			if (vpp > 1) {
				CHECK(sscanf(t->name, "model%d.%n", &v, &k) == 1 && k > 0 && v >= 0 &&
					      v < vpp,
				      "%s rank %u: %s lacks a chunk prefix model0..model%d", layout, rank,
				      t->name, vpp - 1);
				rest += k;
			} else {
				CHECK(strncmp(t->name, "model", 5), "%s rank %u: %s has a chunk prefix",
				      layout, rank, t->name);
			}
			if (!strcmp(rest, "embedding.word_embeddings.weight")) {
				CHECK(p == 0 && v == 0, "%s rank %u: embedding in chunk %d of pp rank %d",
				      layout, rank, v, p);
				embed++;
				continue;
			}
			if (!strcmp(rest, "decoder.final_layernorm.weight") ||
			    !strcmp(rest, "output_layer.weight")) {
				CHECK(p == pp - 1 && v == vpp - 1, "%s rank %u: %s in chunk %d of pp rank %d",
				      layout, rank, rest, v, p);
				*(rest[0] == 'o' ? &out : &norm) += 1;
				continue;
			}
			k = 0;
			CHECK(sscanf(rest, "decoder.layers.%d.%n", &loc, &k) == 1 && k > 0 && loc >= 0 &&
				      loc < n,
			      "%s rank %u: %s is not a layer 0..%d of its chunk", layout, rank, t->name,
			      n - 1);
			for (size_t j = 0; j < t->npieces; j++) {
				int L = canon_layer(l.p[t->first + j].name);

				CHECK(L == start[p * vpp + v] + loc,
				      "%s rank %u: %s holds %s, wanted layer %d (chunk %d of pp rank %d)",
				      layout, rank, t->name, l.p[t->first + j].name, start[p * vpp + v] + loc,
				      v, p);
			}
			held[v * n + loc]++;
		}
		for (int c = 0; c < vpp * n; c++) {
			if (per_layer < 0)
				per_layer = held[c];
			CHECK(held[c] > 0 && held[c] == per_layer,
			      "%s rank %u: layer %d of chunk %d has %d tensors, others %d", layout, rank,
			      c % n, c / n, held[c], per_layer);
		}
		CHECK(embed == (p == 0), "%s rank %u: %d embeddings", layout, rank, embed);
		CHECK(norm == (p == pp - 1) && out == (p == pp - 1),
		      "%s rank %u: %d final norms, %d output layers", layout, rank, norm, out);
		wex__rank_layout_free(&l);
	}
	printf("%-44s", layout);
	for (int p = 0; p < pp; p++)
		for (int v = 0; v < vpp; v++)
			printf("%s[%d-%d]", v ? " " : p ? " | " : " ", start[p * vpp + v],
			       start[p * vpp + v] + n - 1);
	printf("\n");
	wex__model_free(m);
}

#define CHUNKS(cfg, layout, tp, pp, vpp, n, ...) \
	chunks(cfg, layout, tp, pp, vpp, (const int[]){ __VA_ARGS__ }, n)

/* vpp=1 must be the layout without vpp on every rank, byte for byte. */
static void same(const char *cfg, const char *a, const char *b)
{
	struct wex_model *m = kat_model(cfg);
	struct wex_layout_spec sp;
	char err[512] = "";
	uint32_t w, w2;

	CHECK(wex__layout_parse(a, &sp, err, sizeof(err)) == 0, "%s", err);
	CHECK(wex__layout_world(m, &sp, &w, err, sizeof(err)) == 0, "%s: %s", a, err);
	CHECK(wex__layout_parse(b, &sp, err, sizeof(err)) == 0, "%s", err);
	CHECK(wex__layout_world(m, &sp, &w2, err, sizeof(err)) == 0, "%s: %s", b, err);
	CHECK(w == w2, "%s has %u ranks, %s %u", a, w, b, w2);
	for (uint32_t r = 0; r < w; r++) {
		struct wex_rank_layout x, y;

		kat_rank(m, a, r, &x);
		kat_rank(m, b, r, &y);
		CHECK(x.nt == y.nt && x.np == y.np && x.total_bytes == y.total_bytes &&
			      !memcmp(x.t, y.t, x.nt * sizeof(*x.t)) &&
			      !memcmp(x.p, y.p, x.np * sizeof(*x.p)),
		      "rank %u of %s and %s differ", r, a, b);
		wex__rank_layout_free(&x);
		wex__rank_layout_free(&y);
	}
	printf("%-44s = %s (%u ranks)\n", a, b, w);
	wex__model_free(m);
}

static void refused(const char *cfg, const char *layout, const char *a, const char *b)
{
	struct wex_model *m = kat_model(cfg);

	kat_refused(m, layout, a, b);
	wex__model_free(m);
}

/* Physical tensor `name` of rank `rank` must hold exactly the canonical
 * tensors named in `want`, in order. */
static void holds(const char *cfg, const char *layout, uint32_t rank, const char *name,
		  const char *const *want, size_t n)
{
	struct wex_model *m = kat_model(cfg);
	struct wex_rank_layout l;
	const struct wex_layout_tensor *t;

	kat_rank(m, layout, rank, &l);
	t = kat_find(&l, name);
	CHECK(t->npieces == n, "%s rank %u: %s has %zu pieces, wanted %zu", layout, rank, name,
	      t->npieces, n);
	for (size_t i = 0; i < n; i++)
		CHECK(!strcmp(l.p[t->first + i].name, want[i]), "%s rank %u: %s piece %zu is %s, wanted %s",
		      layout, rank, name, i, l.p[t->first + i].name, want[i]);
	printf("%-44s rank %u %s <- %s%s\n", layout, rank, name, want[0], n > 1 ? ", ..." : "");
	wex__rank_layout_free(&l);
	wex__model_free(m);
}

/* Chunk v of rank `rank` must hold exactly the layers `want`, in order
 * (its linear_qkv weights, model{v}.decoder.layers.{0..n-1}). */
static void layers(const char *cfg, const char *layout, uint32_t rank, int v, const int *want,
		   size_t n)
{
	struct wex_model *m = kat_model(cfg);
	struct wex_rank_layout l;
	char pre[64];
	size_t got = 0;
	int k;

	kat_rank(m, layout, rank, &l);
	snprintf(pre, sizeof(pre), "model%d.decoder.layers.", v);
	for (size_t i = 0; i < l.nt; i++) {
		const struct wex_layout_tensor *t = &l.t[i];
		int loc, nn = 0;

		if (strncmp(t->name, pre, strlen(pre)) ||
		    sscanf(t->name + strlen(pre), "%d.self_attention.linear_qkv.weight%n", &loc, &nn) != 1 ||
		    t->name[strlen(pre) + (size_t)nn] != '\0' || !nn)
			continue;
		CHECK((size_t)loc < n, "%s rank %u: %s, chunk %d holds %zu layers", layout, rank, t->name,
		      v, n);
		k = canon_layer(l.p[t->first].name);
		CHECK(k == want[loc], "%s rank %u: %s holds layer %d, wanted %d", layout, rank, t->name,
		      k, want[loc]);
		got++;
	}
	CHECK(got == n, "%s rank %u: chunk %d holds %zu layers, wanted %zu", layout, rank, v, got, n);
	printf("%-44s rank %u chunk %d: %zu layers from %d\n", layout, rank, v, n, want[0]);
	wex__rank_layout_free(&l);
	wex__model_free(m);
}

#define LAYERS(cfg, layout, rank, v, ...)                                                     \
	layers(cfg, layout, rank, v, (const int[]){ __VA_ARGS__ },                            \
	       sizeof((const int[]){ __VA_ARGS__ }) / sizeof(int))

#define HOLDS(cfg, layout, rank, name, ...)                                                   \
	holds(cfg, layout, rank, name, (const char *const[]){ __VA_ARGS__ },                  \
	      sizeof((const char *const[]){ __VA_ARGS__ }) / sizeof(const char *))

int main(void)
{
	/* Megatron-Core's own examples (transformer_block.py). */
	CHUNKS(CFG(8), "megatron:pp=2,vpp=2", 1, 2, 2, 2, 0, 4, 2, 6);
	CHUNKS(CFG(8), "megatron:pp=2,vpp=4", 1, 2, 4, 1, 0, 2, 4, 6, 1, 3, 5, 7);
	/* tp and dp do not change the chunks; the world stays tp*dp*pp. */
	CHUNKS(CFG(8), "megatron:tp=2,pp=2,vpp=2", 2, 2, 2, 2, 0, 4, 2, 6);
	CHUNKS(CFG(16), "megatron_grouped:tp=2,pp=4,vpp=2", 2, 4, 2, 2, 0, 8, 2, 10, 4, 12, 6, 14);
	CHUNKS(CFG(12), "megatron:pp=3,vpp=2", 1, 3, 2, 2, 0, 6, 2, 8, 4, 10);
	/* vpp=1 is today's layout: no prefix, the stage's layers. */
	CHUNKS(CFG(8), "megatron:pp=2,vpp=1", 1, 2, 1, 4, 0, 4);
	same(CFG(8), "megatron:tp=2,pp=2,dp=2", "megatron:tp=2,pp=2,dp=2,vpp=1");
	same(CFG(7), "megatron:tp=2,pp=3,first=3", "megatron:tp=2,pp=3,first=3,vpp=1");
	same(MOE, "megatron_grouped:tp=2,pp=2,ep=2,etp=1", "megatron_grouped:tp=2,pp=2,ep=2,etp=1,vpp=1");
	{
		struct wex_model *m = kat_model(CFG(8));
		struct wex_layout_spec sp;
		uint32_t w;
		char err[512] = "";

		CHECK(wex__layout_parse("megatron:tp=2,pp=2,dp=2,vpp=2", &sp, err, sizeof(err)) == 0,
		      "%s", err);
		CHECK(wex__layout_world(m, &sp, &w, err, sizeof(err)) == 0 && w == 8,
		      "tp=2,pp=2,dp=2,vpp=2: %u ranks (%s), wanted 8", w, err);
		wex__model_free(m);
	}
	/* Tied embeddings: the output layer's copy of the embedding in the
	 * last chunk of the last pp rank. */
	CHUNKS(TIED, "megatron:pp=2,vpp=2", 1, 2, 2, 1, 0, 2, 1, 3);
	HOLDS(TIED, "megatron:pp=2,vpp=2", 1, "model1.output_layer.weight", "model.embed_tokens.weight");
	HOLDS(TIED, "megatron:pp=2,vpp=2", 0, "model0.embedding.word_embeddings.weight",
	      "model.embed_tokens.weight");
	HOLDS(TIED, "megatron:pp=2,vpp=2", 1, "model1.decoder.final_layernorm.weight",
	      "model.norm.weight");
	/* MoE: experts inside their chunk; ep rank 1 (tp rank 1) holds
	 * experts 2 and 3 as local experts 0 and 1.  Chunk 1 of pp rank 0 is
	 * layer 2, chunk 0 of pp rank 1 layer 1. */
	CHUNKS(MOE, "megatron:tp=2,pp=2,vpp=2,ep=2,etp=1", 2, 2, 2, 1, 0, 2, 1, 3);
	CHUNKS(MOE, "megatron_grouped:tp=2,pp=2,vpp=2,ep=2,etp=1", 2, 2, 2, 1, 0, 2, 1, 3);
	HOLDS(MOE, "megatron:tp=2,pp=2,vpp=2,ep=2,etp=1", 1,
	      "model1.decoder.layers.0.mlp.experts.local_experts.1.linear_fc1.weight",
	      "model.layers.2.mlp.experts.3.gate_proj.weight",
	      "model.layers.2.mlp.experts.3.up_proj.weight");
	HOLDS(MOE, "megatron_grouped:tp=2,pp=2,vpp=2,ep=2,etp=1", 2,
	      "model0.decoder.layers.0.mlp.experts.linear_fc2.weight0",
	      "model.layers.1.mlp.experts.0.down_proj.weight");
	HOLDS(MOE, "megatron_grouped:tp=2,pp=2,vpp=2,ep=2,etp=1", 3,
	      "model1.decoder.layers.0.mlp.router.weight", "model.layers.3.mlp.gate.weight");

	/* Uneven first/last stages under vpp (Megatron-Core's offset with
	 * num_layers_in_first/last_pipeline_stage and vp_stage): 10 layers,
	 * pp=3, vpp=2, first=2, last=2: a round of 5 layers, stage 0 one
	 * layer a chunk, stage 1 three, stage 2 one: [0] [5] | [1-3] [6-8] |
	 * [4] [9].  first=2 alone: [0] [5] | [1-2] [6-7] | [3-4] [8-9]. */
	LAYERS(CFG(10), "megatron:pp=3,vpp=2,first=2,last=2", 0, 0, 0);
	LAYERS(CFG(10), "megatron:pp=3,vpp=2,first=2,last=2", 0, 1, 5);
	LAYERS(CFG(10), "megatron:pp=3,vpp=2,first=2,last=2", 1, 0, 1, 2, 3);
	LAYERS(CFG(10), "megatron:pp=3,vpp=2,first=2,last=2", 1, 1, 6, 7, 8);
	LAYERS(CFG(10), "megatron:pp=3,vpp=2,first=2,last=2", 2, 0, 4);
	LAYERS(CFG(10), "megatron:pp=3,vpp=2,first=2,last=2", 2, 1, 9);
	HOLDS(CFG(10), "megatron:pp=3,vpp=2,first=2,last=2", 2, "model1.decoder.final_layernorm.weight",
	      "model.norm.weight");
	HOLDS(CFG(10), "megatron:pp=3,vpp=2,first=2,last=2", 0,
	      "model0.embedding.word_embeddings.weight", "model.embed_tokens.weight");
	LAYERS(CFG(10), "megatron:pp=3,vpp=2,first=2", 1, 0, 1, 2);
	LAYERS(CFG(10), "megatron:pp=3,vpp=2,first=2", 1, 1, 6, 7);
	LAYERS(CFG(10), "megatron:pp=3,vpp=2,first=2", 2, 0, 3, 4);
	LAYERS(CFG(10), "megatron:pp=3,vpp=2,first=2", 2, 1, 8, 9);
	/* last=2 alone (get_transformer_layer_offset's middle_pipeline_rank:
	 * the middle stages from pp rank 0): 4, 4 and 2 layers, [0-1] [5-6]
	 * | [2-3] [7-8] | [4] [9]. */
	LAYERS(CFG(10), "megatron:pp=3,vpp=2,last=2", 0, 0, 0, 1);
	LAYERS(CFG(10), "megatron:pp=3,vpp=2,last=2", 0, 1, 5, 6);
	LAYERS(CFG(10), "megatron:pp=3,vpp=2,last=2", 1, 0, 2, 3);
	LAYERS(CFG(10), "megatron:pp=3,vpp=2,last=2", 1, 1, 7, 8);
	LAYERS(CFG(10), "megatron:pp=3,vpp=2,last=2", 2, 0, 4);
	LAYERS(CFG(10), "megatron:pp=3,vpp=2,last=2", 2, 1, 9);

	/* What Megatron-Core refuses, or what is not described here. */
	refused(CFG(8), "megatron:vpp=2", "vpp=2", "pp=1");
	refused(CFG(8), "megatron:tp=2,pp=1,vpp=4", "vpp=4", "pp=1");
	refused(CFG(8), "megatron:pp=2,vpp=3", "8 layers", "6 model chunks");
	refused(CFG(8), "megatron_grouped:pp=2,vpp=8", "8 layers", "16 model chunks");
	refused(CFG(12), "megatron:pp=3,vpp=2,first=2", "vpp=2", "first=2");
	refused(CFG(11), "megatron:pp=3,vpp=2,last=3", "vpp=2", "last=3");
	/* Both on pp=2: get_transformer_layer_offset's vp branch divides by
	 * the middle stages, 0, for pp rank 1 (ZeroDivisionError). */
	refused(CFG(10), "megatron:pp=2,vpp=2,first=4,last=6", "first=4 and last=6 on pp=2",
		"ZeroDivisionError");
	{
		/* vpp=0 is refused when the spec is read, as tp=0 is. */
		struct wex_layout_spec sp;
		char err[256] = "";

		CHECK(wex__layout_parse("megatron:pp=2,vpp=0", &sp, err, sizeof(err)) == -EINVAL &&
			      strstr(err, "vpp must be at least 1"),
		      "vpp=0: %s", err);
	}
	refused(CFG(8), "vllm:pp=2,vpp=2", "vllm", "no parameter vpp");
	refused(CFG(8), "sglang:vpp=1", "sglang", "no parameter vpp");
	refused(CFG(8), "hf:vpp=1", "hf", "no parameter vpp");
	printf("kat_vpp: ok\n");
	return 0;
}
