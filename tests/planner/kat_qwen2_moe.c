/* SPDX-License-Identifier: MIT */
/*
 * kat_qwen2_moe.c - known answers for Qwen2-MoE (model_type qwen2_moe:
 * Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B), worked out from transformers'
 * Qwen2MoeSparseMoeBlock and the vLLM, SGLang and Megatron-Core modules:
 *  - hf: every layer has q/k/v biases (no o bias); a sparse layer holds the
 *    router mlp.gate.weight [num_experts, hidden], the routed experts
 *    mlp.experts.E.{gate,up,down}_proj of moe_intermediate_size, one shared
 *    expert mlp.shared_expert.{gate,up,down}_proj of
 *    shared_expert_intermediate_size and mlp.shared_expert_gate.weight
 *    [1, hidden]; a layer in mlp_only_layers a plain MLP of
 *    intermediate_size (exactly that tensor set, nothing else);
 *  - vllm tp=2 rank 1: mlp.shared_expert.gate_up_proj.weight = [gate rows
 *    6..11; up rows 6..11], down_proj its columns 6..11,
 *    shared_expert_gate whole, experts.w13_weight/w2_weight, qkv_proj.bias;
 *  - sglang: the same names; fuse_shared=1 is refused naming
 *    shared_expert_gate (the sigmoid-gated shared expert is no routed one);
 *  - megatron tp=2: mlp.shared_experts.linear_fc1/linear_fc2 and the
 *    replicated mlp.shared_experts.gate_weight [1, hidden].
 * roundtrip.c carries the same model hf -> vllm -> sglang -> hf and
 * hf -> megatron -> vllm -> hf byte for byte.
 */
#include "kat_common.h"

#define CFG(EXTRA) "{\"model_type\":\"qwen2_moe\",\"hidden_size\":16,\"num_hidden_layers\":3," \
	"\"num_attention_heads\":4,\"num_key_value_heads\":2,\"intermediate_size\":24," \
	"\"moe_intermediate_size\":8,\"shared_expert_intermediate_size\":12," \
	"\"num_experts\":4,\"decoder_sparse_step\":1,\"mlp_only_layers\":[1]," \
	"\"vocab_size\":101,\"torch_dtype\":\"bfloat16\"" EXTRA "}"

static void canon(const struct wex_rank_layout *l, const char *name, uint64_t d0, uint64_t d1)
{
	for (size_t i = 0; i < l->np; i++) {
		const struct wex_tensor *t = &l->p[i];

		if (strcmp(t->name, name))
			continue;
		CHECK(t->ndim == (d1 ? 2u : 1u) && t->shape[0] == d0 && (!d1 || t->shape[1] == d1),
		      "%s is %llux%llu, wanted %llux%llu", name, (unsigned long long)t->shape[0],
		      (unsigned long long)(t->ndim > 1 ? t->shape[1] : 0), (unsigned long long)d0,
		      (unsigned long long)d1);
		return;
	}
	CHECK(0, "no canonical tensor %s", name);
}

static void shape2(const struct wex_layout_tensor *t, uint64_t d0, uint64_t d1)
{
	CHECK(t->ndim == 2 && t->shape[0] == d0 && t->shape[1] == d1, "%s is %llux%llu, wanted %llux%llu",
	      t->name, (unsigned long long)t->shape[0], (unsigned long long)t->shape[1],
	      (unsigned long long)d0, (unsigned long long)d1);
}

static int phys_has(const struct wex_rank_layout *l, const char *prefix)
{
	for (size_t i = 0; i < l->nt; i++)
		if (!strncmp(l->t[i].name, prefix, strlen(prefix)))
			return 1;
	return 0;
}

int main(void)
{
	struct wex_model *m = kat_model(CFG(""));
	struct wex_rank_layout l;
	const struct wex_layout_tensor *t;
	struct wex_layout_spec sp;
	uint32_t w;
	char name[128], err[512] = "";

	kat_rank(m, "hf", 0, &l);
	for (int L = 0; L < 3; L++) {
		static const char *const qkv[] = { "q", "k", "v" };

		for (int k = 0; k < 3; k++) {
			snprintf(name, sizeof(name), "model.layers.%d.self_attn.%s_proj.bias", L, qkv[k]);
			canon(&l, name, k ? 8 : 16, 0);
		}
		if (L == 1) {
			canon(&l, "model.layers.1.mlp.gate_proj.weight", 24, 16);
			canon(&l, "model.layers.1.mlp.down_proj.weight", 16, 24);
			continue;
		}
		snprintf(name, sizeof(name), "model.layers.%d.mlp.gate.weight", L);
		canon(&l, name, 4, 16);
		snprintf(name, sizeof(name), "model.layers.%d.mlp.experts.3.up_proj.weight", L);
		canon(&l, name, 8, 16);
		snprintf(name, sizeof(name), "model.layers.%d.mlp.shared_expert.gate_proj.weight", L);
		canon(&l, name, 12, 16);
		snprintf(name, sizeof(name), "model.layers.%d.mlp.shared_expert.up_proj.weight", L);
		canon(&l, name, 12, 16);
		snprintf(name, sizeof(name), "model.layers.%d.mlp.shared_expert.down_proj.weight", L);
		canon(&l, name, 16, 12);
		snprintf(name, sizeof(name), "model.layers.%d.mlp.shared_expert_gate.weight", L);
		canon(&l, name, 1, 16);
	}
	/* embed, norm, lm_head; per layer 2 norms, q k v o, 3 biases; the
	 * dense layer 3 MLP weights, a sparse one router + 4x3 experts + 3
	 * shared + the shared expert's gate. */
	CHECK(l.np == 3 + 3 * 9 + 3 + 2 * (1 + 12 + 3 + 1), "%zu canonical tensors, wanted %d", l.np,
	      3 + 3 * 9 + 3 + 2 * (1 + 12 + 3 + 1));
	wex__rank_layout_free(&l);

	for (int s = 0; s < 2; s++) {
		kat_rank(m, s ? "sglang:tp=2" : "vllm:tp=2", 1, &l);
		t = kat_find(&l, "model.layers.2.mlp.shared_expert.gate_up_proj.weight");
		shape2(t, 12, 16);
		kat_piece(&l, t, 0, "model.layers.2.mlp.shared_expert.gate_proj.weight", 6, 6, 0);
		kat_piece(&l, t, 1, "model.layers.2.mlp.shared_expert.up_proj.weight", 6, 6, 6);
		t = kat_find(&l, "model.layers.2.mlp.shared_expert.down_proj.weight");
		shape2(t, 16, 6);
		CHECK(l.p[t->first].start[1] == 6 && l.p[t->first].extent[1] == 6, "down_proj columns");
		shape2(kat_find(&l, "model.layers.0.mlp.shared_expert_gate.weight"), 1, 16);
		shape2(kat_find(&l, "model.layers.0.mlp.gate.weight"), 4, 16);
		t = kat_find(&l, "model.layers.0.mlp.experts.w13_weight");
		CHECK(t->ndim == 3 && t->shape[0] == 4 && t->shape[1] == 8 && t->shape[2] == 16,
		      "w13_weight shape");
		kat_find(&l, "model.layers.0.mlp.experts.w2_weight");
		kat_find(&l, "model.layers.1.mlp.gate_up_proj.weight");
		t = kat_find(&l, "model.layers.0.self_attn.qkv_proj.bias");
		CHECK(t->ndim == 1 && t->shape[0] == 8 + 4 + 4, "qkv_proj.bias shape");
		CHECK(!phys_has(&l, "model.layers.1.mlp.shared_expert") &&
		      !phys_has(&l, "model.layers.0.mlp.shared_experts."),
		      "a shared expert on the dense layer, or DeepSeek's name");
		wex__rank_layout_free(&l);
	}
	CHECK(wex__layout_parse("sglang:tp=2,fuse_shared=1", &sp, err, sizeof(err)) == 0, "%s", err);
	CHECK(wex__layout_world(m, &sp, &w, err, sizeof(err)) == -WEX_ELAYOUT &&
	      strstr(err, "shared_expert_gate"), "sglang fuse_shared=1 not refused naming shared_expert_gate: %s",
	      err);

	kat_rank(m, "megatron:tp=2", 0, &l);
	shape2(kat_find(&l, "decoder.layers.0.mlp.shared_experts.linear_fc1.weight"), 12, 16);
	shape2(kat_find(&l, "decoder.layers.2.mlp.shared_experts.linear_fc2.weight"), 16, 6);
	shape2(kat_find(&l, "decoder.layers.2.mlp.shared_experts.gate_weight"), 1, 16);
	t = kat_find(&l, "decoder.layers.0.self_attention.linear_qkv.bias");
	CHECK(t->ndim == 1 && t->shape[0] == 8 + 4 + 4, "linear_qkv.bias shape: one query group");
	CHECK(!phys_has(&l, "decoder.layers.1.mlp.shared_experts"), "a shared expert on the dense layer");
	wex__rank_layout_free(&l);
	wex__model_free(m);
	return T_PASS;
}
