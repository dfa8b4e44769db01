/* SPDX-License-Identifier: MIT */
/*
 * kat_sparse_step.c - proves the MoE family places experts on the layers
 * transformers does (Qwen2MoeDecoderLayer, Qwen3MoeDecoderLayer): layer i
 * is sparse iff i is not in mlp_only_layers, num_experts > 0 and
 * (i + 1) % decoder_sparse_step == 0; the other layers hold a plain MLP
 * (mlp.gate_proj/up_proj/down_proj of intermediate_size) and no router or
 * experts.  Checked on the canonical (hf) tensor set of a 4-layer Qwen3-MoE
 * with decoder_sparse_step=2 and mlp_only_layers=[0] (layers 1 and 3
 * sparse), one with mlp_only_layers=[2] (all but layer 2 sparse), one with
 * num_experts 0 (all dense), on Megatron's names (a dense layer's norm is
 * fused into linear_fc1) and by planning hf -> megatron -> vllm -> hf with
 * every byte back.  A decoder_sparse_step of 0 (a modulo by zero in
 * transformers) or a mlp_only_layers that is not a list of layer numbers
 * is refused naming the key.  The whole-model tensor limit counts sparse
 * layers by the same rule: exactly 2^22 tensors pass, more do not, and 2^40
 * layers are refused without a pass over them.
 */
#include "kat_common.h"

#define CFGN(NEXP, EXTRA) "{\"model_type\":\"qwen3_moe\",\"hidden_size\":8," \
	"\"num_hidden_layers\":4,\"num_attention_heads\":4,\"num_key_value_heads\":2," \
	"\"head_dim\":2,\"intermediate_size\":24,\"moe_intermediate_size\":4," \
	"\"num_experts\":" NEXP ",\"vocab_size\":64,\"torch_dtype\":\"bfloat16\"" EXTRA "}"
#define CFG(EXTRA) CFGN("4", EXTRA)

static const struct wex_tensor *canon_find(const struct wex_rank_layout *l, const char *name)
{
	for (size_t i = 0; i < l->np; i++)
		if (!strcmp(l->p[i].name, name))
			return &l->p[i];
	return NULL;
}

/* sparse[L]: whether layer L must hold the router and experts. */
static void check_layers(const char *cfg, const int *sparse, int nlayers)
{
	struct wex_model *m = kat_model(cfg);
	struct wex_rank_layout l;
	char name[128];
	size_t want = 3; /* embed, final norm, lm_head */

	kat_rank(m, "hf", 0, &l);
	for (int L = 0; L < nlayers; L++) {
		const struct wex_tensor *t;
		static const char *const dense[] = { "gate_proj", "up_proj", "down_proj" };

		want += 8; /* 2 norms, q k v o, q_norm k_norm */
		for (int k = 0; k < 3; k++) {
			snprintf(name, sizeof(name), "model.layers.%d.mlp.%s.weight", L, dense[k]);
			t = canon_find(&l, name);
			CHECK(!!t == !sparse[L], "layer %d (%s): %s %s", L, sparse[L] ? "sparse" : "dense",
			      name, t ? "present" : "missing");
			if (t)
				CHECK(t->shape[k == 2 ? 1 : 0] == 24 && t->shape[k == 2 ? 0 : 1] == 8,
				      "%s is %llux%llu, wanted intermediate_size 24 by hidden 8", name,
				      (unsigned long long)t->shape[0], (unsigned long long)t->shape[1]);
		}
		snprintf(name, sizeof(name), "model.layers.%d.mlp.gate.weight", L);
		t = canon_find(&l, name);
		CHECK(!!t == sparse[L], "layer %d (%s): router %s", L, sparse[L] ? "sparse" : "dense",
		      t ? "present" : "missing");
		for (int e = 0; e < 4; e++) {
			snprintf(name, sizeof(name), "model.layers.%d.mlp.experts.%d.down_proj.weight", L, e);
			t = canon_find(&l, name);
			CHECK(!!t == sparse[L], "layer %d: %s %s", L, name, t ? "present" : "missing");
			if (t)
				CHECK(t->shape[0] == 8 && t->shape[1] == 4, "%s: not moe_intermediate_size", name);
		}
		want += sparse[L] ? 1 + 4 * 3 : 3;
	}
	CHECK(l.np == want, "%zu canonical tensors, wanted %zu", l.np, want);
	wex__rank_layout_free(&l);

	/* Megatron: a dense layer's post-attention norm is linear_fc1's. */
	kat_rank(m, "megatron:tp=2", 0, &l);
	for (int L = 0; L < nlayers; L++) {
		int found = 0;

		snprintf(name, sizeof(name), "decoder.layers.%d.mlp.linear_fc1.layer_norm_weight", L);
		for (size_t i = 0; i < l.nt; i++)
			found |= !strcmp(l.t[i].name, name);
		CHECK(found == !sparse[L], "megatron layer %d: %s %s", L, name, found ? "present" : "missing");
	}
	wex__rank_layout_free(&l);
	wex__model_free(m);
}

static void refused(const char *cfg, const char *what)
{
	struct wex_model *m = NULL;
	char err[256] = "";

	CHECK(wex__model_from_text(cfg, NULL, &m, err, sizeof(err)) < 0, "accepted: %s", cfg);
	CHECK(strstr(err, what) != NULL, "error does not name %s: %s", what, err);
}

/* The whole-model tensor limit (2^22 tensors) counts MoE layers by the
 * same rule, in closed form: a 310691-layer Qwen3-MoE with 4 experts,
 * decoder_sparse_step 4 and mlp_only_layers [3, 3, 5, 7, 310695] (a
 * duplicate, a layer dense by the step anyway, one past the last) has
 * 77670 sparse layers and 3 + 8*310691 + 3*(310691-77670) + 13*77670 =
 * 2^22 tensors: accepted; one more layer (sparse) is 21 tensors over:
 * refused.  So is 2^40 layers, at once (no pass over the layers). */
static void tensor_limit(void)
{
	char cfg[512];
	struct wex_model *m;
	const long layers[] = { 310691, 310692, 1l << 40 };

	for (int i = 0; i < 3; i++) {
		snprintf(cfg, sizeof(cfg),
			 "{\"model_type\":\"qwen3_moe\",\"hidden_size\":8,\"num_hidden_layers\":%ld,"
			 "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"head_dim\":2,"
			 "\"intermediate_size\":24,\"moe_intermediate_size\":4,\"num_experts\":4,"
			 "\"vocab_size\":64,\"decoder_sparse_step\":4,"
			 "\"mlp_only_layers\":[3,3,5,7,310695]}",
			 layers[i]);
		if (i == 0) {
			m = kat_model(cfg);
			CHECK(wex__model_sym(m, "layers") == layers[i], "layers");
			wex__model_free(m);
		} else {
			refused(cfg, "not a model's");
		}
	}
}

int main(void)
{
	const int step2[] = { 0, 1, 0, 1 }, only2[] = { 1, 1, 0, 1 }, none[] = { 0, 0, 0, 0 };

	check_layers(CFG(",\"decoder_sparse_step\":2,\"mlp_only_layers\":[0]"), step2, 4);
	check_layers(CFG(",\"decoder_sparse_step\":1,\"mlp_only_layers\":[2,7]"), only2, 4);
	check_layers(CFGN("0", ""), none, 4);
	/* Mixtral's config has neither key: every layer sparse. */
	check_layers(CFG(",\"mlp_only_layers\":null"), (const int[]){ 1, 1, 1, 1 }, 4);
	refused(CFG(",\"decoder_sparse_step\":0"), "decoder_sparse_step");
	refused(CFG(",\"mlp_only_layers\":[\"1\"]"), "mlp_only_layers");
	refused(CFG(",\"mlp_only_layers\":3"), "mlp_only_layers");
	tensor_limit();
	return T_PASS;
}
