/* SPDX-License-Identifier: MIT */
/*
 * kat_fsdp.c - known answer: the fsdp engine (PyTorch FSDP2 fully_shard,
 * and HSDP) holds every canonical tensor under its canonical name, cut
 * along dim 0 as torch.chunk cuts it and FSDP2's _chunk_with_empty pads
 * the list: chunk c = ceil(d0 / N), rank r holds rows [min(r*c, d0),
 * min((r+1)*c, d0)), an empty [0, ...] tensor past the end (d0 = 5 over 4
 * ranks: 2,2,1,0 rows; 6 over 4: 2,2,2,0; 5 over 8: 1,1,1,1,1,0,0,0).
 * Norms (1-D) are cut as well.  HSDP (dp=M replicas of the N-way shard):
 * rank = shard_rank + N * replica_rank, DeviceMesh's row-major order of a
 * (replicate, shard) mesh.  Tied embeddings are one tensor, as in hf; FP8
 * weights and their weight_scale_inv are chunked each on its own (separate
 * parameters to FSDP).
 */
#include "kat_common.h"

/* hidden 5 (one 5-dim head), intermediate 6, vocabulary 7. */
#define CFG(EXTRA)                                                                           \
	"{\"model_type\":\"llama\",\"hidden_size\":5,\"num_hidden_layers\":1,"                \
	"\"num_attention_heads\":1,\"num_key_value_heads\":1,\"intermediate_size\":6,"          \
	"\"vocab_size\":7,\"torch_dtype\":\"bfloat16\"" EXTRA "}"

/* The rows of dim 0 that rank r of an n-way FSDP2 shard holds. */
static void rows(uint64_t d0, uint64_t n, uint64_t r, uint64_t *r0, uint64_t *nr)
{
	uint64_t c = (d0 + n - 1) / n;
	uint64_t a = r * c < d0 ? r * c : d0, b = (r + 1) * c < d0 ? (r + 1) * c : d0;

	*r0 = a;
	*nr = b - a;
}

/* Tensor `name` on `lay` rank `rank` holds rows [r0, r0+n) of itself. */
static void want(const struct wex_model *m, const char *lay, uint32_t rank, const char *name,
		 uint64_t r0, uint64_t n)
{
	struct wex_rank_layout l;
	const struct wex_layout_tensor *t;

	kat_rank(m, lay, rank, &l);
	t = kat_find(&l, name);
	CHECK(t->shape[0] == n, "%s rank %u: %s has %llu rows, wanted %llu", lay, rank, name,
	      (unsigned long long)t->shape[0], (unsigned long long)n);
	if (n)
		kat_piece(&l, t, 0, name, r0, n, 0);
	else
		CHECK(t->npieces == 0 && t->nbytes == 0, "%s rank %u: empty %s has %zu pieces", lay,
		      rank, name, t->npieces);
	wex__rank_layout_free(&l);
}

/* Every tensor of every rank of `lay` against the formula, against the
 * whole canonical tensor (hf), and every row held once per replica. */
static void formula(const struct wex_model *m, const char *lay, uint32_t n, uint32_t dp)
{
	struct wex_layout_spec s;
	struct wex_rank_layout h, l;
	uint32_t w;
	char err[256];

	CHECK(wex__layout_parse(lay, &s, err, sizeof(err)) == 0, "%s", err);
	CHECK(wex__layout_world(m, &s, &w, err, sizeof(err)) == 0, "%s: %s", lay, err);
	CHECK(w == n * dp, "%s: %u ranks, wanted %u", lay, w, n * dp);
	kat_rank(m, "hf", 0, &h);
	for (uint32_t r = 0; r < w; r++) {
		kat_rank(m, lay, r, &l);
		CHECK(l.nt == h.nt, "%s rank %u: %zu tensors, hf has %zu", lay, r, l.nt, h.nt);
		for (size_t i = 0; i < h.nt; i++) {
			const struct wex_layout_tensor *c = &h.t[i], *t = &l.t[i];
			uint64_t r0, nr, rowbytes = wex_dtype_size(c->dtype);

			rows(c->shape[0], n, r % n, &r0, &nr);
			for (uint32_t d = 1; d < c->ndim; d++)
				rowbytes *= c->shape[d];
			CHECK(!strcmp(t->name, c->name) && t->dtype == c->dtype && t->ndim == c->ndim,
			      "%s rank %u: tensor %zu is %s, hf has %s", lay, r, i, t->name, c->name);
			CHECK(t->shape[0] == nr && t->nbytes == nr * rowbytes,
			      "%s rank %u: %s has %llu rows, wanted %llu", lay, r, t->name,
			      (unsigned long long)t->shape[0], (unsigned long long)nr);
			for (uint32_t d = 1; d < c->ndim; d++)
				CHECK(t->shape[d] == c->shape[d], "%s: %s dim %u cut", lay, t->name, d);
			CHECK(t->npieces == (nr ? 1u : 0u), "%s rank %u: %s has %zu pieces", lay, r,
			      t->name, t->npieces);
			if (!nr)
				continue;
			const struct wex_tensor *p = &l.p[t->first];
			CHECK(p->ndim == c->ndim && p->offset == 0 && p->start[0] == r0 &&
				      p->extent[0] == nr && p->shape[0] == c->shape[0],
			      "%s rank %u: %s box rows [%llu,+%llu), wanted [%llu,+%llu)", lay, r,
			      t->name, (unsigned long long)p->start[0], (unsigned long long)p->extent[0],
			      (unsigned long long)r0, (unsigned long long)nr);
			for (uint32_t d = 1; d < c->ndim; d++)
				CHECK(p->start[d] == 0 && p->extent[d] == c->shape[d] &&
					      p->shape[d] == c->shape[d],
				      "%s: %s box cut on dim %u", lay, t->name, d);
		}
		wex__rank_layout_free(&l);
	}
	wex__rank_layout_free(&h);
}

int main(void)
{
	struct wex_model *m = kat_model(CFG(""));
	const char *q = "model.layers.0.self_attn.q_proj.weight";
	const char *gate = "model.layers.0.mlp.gate_proj.weight";
	const char *norm = "model.layers.0.input_layernorm.weight";
	const char *embed = "model.embed_tokens.weight";

	/* 5 rows over 4: chunks of 2, torch.chunk gives 3, the 4th empty. */
	want(m, "fsdp:fsdp=4", 0, q, 0, 2);
	want(m, "fsdp:fsdp=4", 1, q, 2, 2);
	want(m, "fsdp:fsdp=4", 2, q, 4, 1);
	want(m, "fsdp:fsdp=4", 3, q, 5, 0);
	/* A 1-D norm of 5 is cut the same way. */
	want(m, "fsdp:fsdp=4", 2, norm, 4, 1);
	want(m, "fsdp:fsdp=4", 3, norm, 5, 0);
	/* 6 over 4: 2,2,2,0 (not 2,2,1,1). */
	want(m, "fsdp:fsdp=4", 2, gate, 4, 2);
	want(m, "fsdp:fsdp=4", 3, gate, 6, 0);
	/* 7 over 4: 2,2,2,1. */
	want(m, "fsdp:fsdp=4", 3, embed, 6, 1);
	/* Fewer rows than ranks: 5 over 8, one row each, then empty. */
	want(m, "fsdp:fsdp=8", 4, q, 4, 1);
	want(m, "fsdp:fsdp=8", 5, q, 5, 0);
	want(m, "fsdp:fsdp=8", 7, norm, 5, 0);
	/* HSDP 2 shards x 3 replicas: rank 5 is shard 1 of replica 2. */
	want(m, "fsdp:fsdp=2,dp=3", 5, q, 3, 2);
	want(m, "fsdp:fsdp=2,dp=3", 4, q, 0, 3);
	/* One shard: whole tensors, as hf. */
	want(m, "fsdp", 0, q, 0, 5);
	for (uint32_t n = 1; n <= 9; n++)
		for (uint32_t dp = 1; dp <= 2; dp++) {
			char lay[64];

			snprintf(lay, sizeof(lay), "fsdp:fsdp=%u,dp=%u", n, dp);
			formula(m, lay, n, dp);
		}
	wex__model_free(m);

	/* Tied embeddings: one tensor (no lm_head), as hf. */
	m = kat_model(CFG(",\"tie_word_embeddings\":true"));
	{
		struct wex_rank_layout l;

		kat_rank(m, "fsdp:fsdp=4", 1, &l);
		for (size_t i = 0; i < l.nt; i++)
			CHECK(strcmp(l.t[i].name, "lm_head.weight"), "tied model has an lm_head");
		wex__rank_layout_free(&l);
		formula(m, "fsdp:fsdp=3,dp=2", 3, 2);
	}
	wex__model_free(m);

	/* FP8 with 4x4 blocks: q is 8x8 F8_E4M3 (2 rows a rank over 4), its
	 * scale 2x2 F32 chunked on its own (1,1,0,0), not with the weight. */
	m = kat_model("{\"model_type\":\"llama\",\"hidden_size\":8,\"num_hidden_layers\":1,"
		      "\"num_attention_heads\":2,\"num_key_value_heads\":2,\"intermediate_size\":8,"
		      "\"vocab_size\":16,\"torch_dtype\":\"bfloat16\",\"quantization_config\":"
		      "{\"quant_method\":\"fp8\",\"weight_block_size\":[4,4]}}");
	want(m, "fsdp:fsdp=4", 1, q, 2, 2);
	want(m, "fsdp:fsdp=4", 1, "model.layers.0.self_attn.q_proj.weight_scale_inv", 1, 1);
	want(m, "fsdp:fsdp=4", 2, "model.layers.0.self_attn.q_proj.weight_scale_inv", 2, 0);
	{
		struct wex_rank_layout l;

		kat_rank(m, "fsdp:fsdp=4", 0, &l);
		CHECK(kat_find(&l, q)->dtype == WEX_DT_F8_E4M3, "FP8 weight not F8_E4M3");
		CHECK(kat_find(&l, "model.layers.0.self_attn.q_proj.weight_scale_inv")->dtype ==
			      WEX_DT_F32,
		      "scale not F32");
		wex__rank_layout_free(&l);
	}
	formula(m, "fsdp:fsdp=3,dp=2", 3, 2);
	wex__model_free(m);
	printf("fsdp: every tensor cut along dim 0 as torch.chunk, empty past the end, HSDP replicas\n");
	return T_PASS;
}
