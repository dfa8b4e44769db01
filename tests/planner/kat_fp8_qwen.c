/* SPDX-License-Identifier: MIT */
/*
 * kat_fp8_qwen.c - known answers for block-quantized FP8 checkpoints of the
 * llama and moe families (Qwen3-8B-FP8, Qwen3-30B-A3B-FP8: quant_method
 * fp8, weight_block_size; here [4, 4] on small models, worked out by hand):
 *  - hf: q/k/v/o_proj and the MLP's gate/up/down_proj (routed and shared
 *    experts alike) are F8_E4M3, each followed by an F32 weight_scale_inv
 *    of ceil(rows/4) x ceil(cols/4); embeddings, norms, q/k norms, biases,
 *    lm_head, the router mlp.gate and Qwen2-MoE's shared_expert_gate stay
 *    BF16 without scales;
 *  - vllm tp=2 rank 1: qkv_proj.weight_scale_inv = [q scale rows 2..3;
 *    k row 1; v row 1] (4 x 4), gate_up_proj.weight_scale_inv = [gate rows
 *    3..5; up rows 3..5], o_proj's scale columns 2..3; w13_weight_scale_inv
 *    [4 experts, gate block 1 + up block 1, 4], the shared expert's
 *    gate_up_proj scales likewise (rows 2..3 of each of its 4-block
 *    parts), no scales for the router, shared_expert_gate or biases;
 *  - a shard that cuts a block (vllm tp=4: gate_proj's 24 rows in 6, an
 *    expert's 8 in 2 with tp=2,dp=2) is refused naming the weight and its scales; modules_to_not_convert
 *    naming a module the family quantizes (mixed FP8/BF16 Linear weights)
 *    is refused naming the entry, one naming lm_head is accepted; entries
 *    match anywhere in a module name (transformers' test), also where one
 *    entry's partial match runs into another's, and Qwen3-235B-A22B-FP8's
 *    real list (every layer's norms and router) is accepted.
 * roundtrip.c carries both models hf -> vllm -> sglang -> hf byte for byte.
 */
#include "kat_common.h"

#define QCFG(EXTRA) "\"quantization_config\":{\"quant_method\":\"fp8\",\"fmt\":\"e4m3\"," \
	"\"activation_scheme\":\"dynamic\",\"weight_block_size\":[4,4]" EXTRA "}}"
#define QWEN3(EXTRA) "{\"model_type\":\"qwen3\",\"hidden_size\":16,\"num_hidden_layers\":2," \
	"\"num_attention_heads\":4,\"num_key_value_heads\":2,\"head_dim\":4," \
	"\"intermediate_size\":24,\"vocab_size\":64,\"torch_dtype\":\"bfloat16\"," QCFG(EXTRA)
#define QWEN2MOE_Q(EXTRA) "{\"model_type\":\"qwen2_moe\",\"hidden_size\":16,\"num_hidden_layers\":2," \
	"\"num_attention_heads\":4,\"num_key_value_heads\":2,\"intermediate_size\":24," \
	"\"moe_intermediate_size\":8,\"shared_expert_intermediate_size\":16,\"num_experts\":4," \
	"\"mlp_only_layers\":[1],\"vocab_size\":64,\"torch_dtype\":\"bfloat16\"," QCFG(EXTRA)
#define QWEN2MOE QWEN2MOE_Q("")

/* No tensor, canonical or physical, named with a scale suffix after `stem`. */
static void no_scales(const struct wex_rank_layout *l, const char *stem)
{
	char nm[160];

	snprintf(nm, sizeof(nm), "%s_scale_inv", stem);
	for (size_t i = 0; i < l->np; i++)
		CHECK(strcmp(l->p[i].name, nm), "an unquantized tensor got scales: %s", nm);
	for (size_t i = 0; i < l->nt; i++)
		CHECK(strcmp(l->t[i].name, nm), "an unquantized tensor got scales: %s", nm);
}

static void shape(const struct wex_layout_tensor *t, int dtype, uint32_t nd, uint64_t d0, uint64_t d1,
		  uint64_t d2)
{
	CHECK(t->dtype == dtype && t->ndim == nd && t->shape[0] == d0 && t->shape[1] == d1 &&
	      (nd < 3 || t->shape[2] == d2), "%s is %s %llux%llux%llu", t->name,
	      wex_dtype_name(t->dtype), (unsigned long long)t->shape[0],
	      (unsigned long long)t->shape[1], (unsigned long long)(nd > 2 ? t->shape[2] : 0));
}

/* The Qwen2-MoE above with modules_to_not_convert LIST: accepted when
 * `entry` is NULL, else refused naming it and the module it lies in. */
static void not_convert(const char *list, const char *entry, const char *module)
{
	char cfg[2048], err[512] = "";
	struct wex_model *m = NULL;

	snprintf(cfg, sizeof(cfg), QWEN2MOE_Q(",\"modules_to_not_convert\":%s"), list);
	if (!entry) {
		wex__model_free(kat_model(cfg));
		return;
	}
	CHECK(wex__model_from_text(cfg, NULL, &m, err, sizeof(err)) < 0, "accepted: %s", list);
	CHECK(strstr(err, entry) && strstr(err, module), "%s: wanted \"%s\" in %s: %s", list, entry,
	      module, err);
}

/* Qwen3-235B-A22B-FP8's modules_to_not_convert: lm_head, then each of its
 * 94 layers' input_layernorm, mlp.gate (the router) and
 * post_attention_layernorm, none of them quantized: accepted, and without
 * comparing each of the 282 entries with each of the 36,472 FP8 weights. */
static void qwen3_235b_list(void)
{
	size_t cap = 65536, n = 0;
	char *cfg = malloc(cap);
	struct wex_model *m;

	CHECK(cfg, "out of memory");
	n += (size_t)snprintf(cfg + n, cap - n,
			      "{\"model_type\":\"qwen3_moe\",\"hidden_size\":4096,"
			      "\"num_hidden_layers\":94,\"num_attention_heads\":64,"
			      "\"num_key_value_heads\":4,\"head_dim\":128,\"intermediate_size\":12288,"
			      "\"moe_intermediate_size\":1536,\"num_experts\":128,\"decoder_sparse_step\":1,"
			      "\"mlp_only_layers\":[],\"vocab_size\":151936,\"torch_dtype\":\"bfloat16\","
			      "\"quantization_config\":{\"activation_scheme\":\"dynamic\",\"fmt\":\"e4m3\","
			      "\"quant_method\":\"fp8\",\"weight_block_size\":[128,128],"
			      "\"modules_to_not_convert\":[\"lm_head\"");
	for (int L = 0; L < 94; L++)
		n += (size_t)snprintf(cfg + n, cap - n,
				      ",\"model.layers.%d.input_layernorm\",\"model.layers.%d.mlp.gate\","
				      "\"model.layers.%d.post_attention_layernorm\"", L, L, L);
	snprintf(cfg + n, cap - n, "]}}");
	CHECK(n < cap - 8, "config too long");
	m = kat_model(cfg);
	wex__model_free(m);
	free(cfg);
}

int main(void)
{
	struct wex_model *m = kat_model(QWEN3(""));
	struct wex_rank_layout l;
	const struct wex_layout_tensor *t;
	char err[512] = "";

	kat_rank(m, "hf", 0, &l);
	kat_canon(&l, "model.layers.1.self_attn.q_proj.weight", WEX_DT_F8_E4M3, 16, 16);
	kat_canon(&l, "model.layers.1.self_attn.q_proj.weight_scale_inv", WEX_DT_F32, 4, 4);
	kat_canon(&l, "model.layers.1.self_attn.k_proj.weight_scale_inv", WEX_DT_F32, 2, 4);
	kat_canon(&l, "model.layers.1.self_attn.o_proj.weight", WEX_DT_F8_E4M3, 16, 16);
	kat_canon(&l, "model.layers.0.mlp.gate_proj.weight_scale_inv", WEX_DT_F32, 6, 4);
	kat_canon(&l, "model.layers.0.mlp.down_proj.weight", WEX_DT_F8_E4M3, 16, 24);
	kat_canon(&l, "model.layers.0.mlp.down_proj.weight_scale_inv", WEX_DT_F32, 4, 6);
	kat_canon(&l, "model.layers.0.self_attn.q_norm.weight", WEX_DT_BF16, 4, 0);
	kat_canon(&l, "model.embed_tokens.weight", WEX_DT_BF16, 64, 16);
	kat_canon(&l, "lm_head.weight", WEX_DT_BF16, 64, 16);
	no_scales(&l, "lm_head.weight");
	no_scales(&l, "model.embed_tokens.weight");
	no_scales(&l, "model.layers.0.self_attn.q_norm.weight");
	/* 3 globals; per layer 2 norms, q/k norms, 7 Linear weights + 7 scales. */
	CHECK(l.np == 3 + 2 * (4 + 14), "%zu canonical tensors, wanted %d", l.np, 3 + 2 * (4 + 14));
	wex__rank_layout_free(&l);

	kat_rank(m, "vllm:tp=2", 1, &l);
	t = kat_find(&l, "model.layers.0.self_attn.qkv_proj.weight");
	shape(t, WEX_DT_F8_E4M3, 2, 16, 16, 0);
	t = kat_find(&l, "model.layers.0.self_attn.qkv_proj.weight_scale_inv");
	shape(t, WEX_DT_F32, 2, 4, 4, 0);
	kat_piece(&l, t, 0, "model.layers.0.self_attn.q_proj.weight_scale_inv", 2, 2, 0);
	kat_piece(&l, t, 1, "model.layers.0.self_attn.k_proj.weight_scale_inv", 1, 1, 2);
	kat_piece(&l, t, 2, "model.layers.0.self_attn.v_proj.weight_scale_inv", 1, 1, 3);
	t = kat_find(&l, "model.layers.1.mlp.gate_up_proj.weight_scale_inv");
	shape(t, WEX_DT_F32, 2, 6, 4, 0);
	kat_piece(&l, t, 0, "model.layers.1.mlp.gate_proj.weight_scale_inv", 3, 3, 0);
	kat_piece(&l, t, 1, "model.layers.1.mlp.up_proj.weight_scale_inv", 3, 3, 3);
	t = kat_find(&l, "model.layers.1.self_attn.o_proj.weight_scale_inv");
	shape(t, WEX_DT_F32, 2, 4, 2, 0);
	CHECK(l.p[t->first].start[1] == 2 && l.p[t->first].extent[1] == 2, "o_proj scale columns");
	shape(kat_find(&l, "model.layers.1.mlp.down_proj.weight_scale_inv"), WEX_DT_F32, 2, 4, 3, 0);
	wex__rank_layout_free(&l);
	kat_refused(m, "vllm:tp=4", "model.layers.0.mlp.gate_proj.weight",
		       "model.layers.0.mlp.gate_proj.weight_scale_inv");
	kat_refused(m, "megatron:tp=2", "FP8 block scales", "linear_qkv.weight_scale_inv");
	wex__model_free(m);

	/* Mixed FP8/BF16 Linear weights are not described: refused. */
	m = NULL;
	CHECK(wex__model_from_text(QWEN3(",\"modules_to_not_convert\":[\"lm_head\",\"layers.1.mlp.down_proj\"]"),
				   NULL, &m, err, sizeof(err)) < 0 &&
	      strstr(err, "layers.1.mlp.down_proj") && strstr(err, "modules_to_not_convert"),
	      "modules_to_not_convert naming a quantized module: %s", err);
	m = kat_model(QWEN3(",\"modules_to_not_convert\":[\"lm_head\"]"));
	wex__model_free(m);

	m = kat_model(QWEN2MOE);
	kat_rank(m, "hf", 0, &l);
	kat_canon(&l, "model.layers.0.self_attn.q_proj.bias", WEX_DT_BF16, 16, 0);
	kat_canon(&l, "model.layers.0.mlp.gate.weight", WEX_DT_BF16, 4, 16);
	kat_canon(&l, "model.layers.0.mlp.shared_expert_gate.weight", WEX_DT_BF16, 1, 16);
	kat_canon(&l, "model.layers.0.mlp.experts.2.down_proj.weight", WEX_DT_F8_E4M3, 16, 8);
	kat_canon(&l, "model.layers.0.mlp.experts.2.down_proj.weight_scale_inv", WEX_DT_F32, 4, 2);
	kat_canon(&l, "model.layers.0.mlp.shared_expert.up_proj.weight_scale_inv", WEX_DT_F32, 4, 4);
	kat_canon(&l, "model.layers.1.mlp.up_proj.weight_scale_inv", WEX_DT_F32, 6, 4);
	no_scales(&l, "model.layers.0.mlp.gate.weight");
	no_scales(&l, "model.layers.0.mlp.shared_expert_gate.weight");
	no_scales(&l, "model.layers.0.self_attn.q_proj.bias");
	wex__rank_layout_free(&l);
	kat_rank(m, "vllm:tp=2", 1, &l);
	t = kat_find(&l, "model.layers.0.mlp.experts.w13_weight_scale_inv");
	shape(t, WEX_DT_F32, 3, 4, 2, 4);
	CHECK(!strcmp(l.p[t->first].name, "model.layers.0.mlp.experts.0.gate_proj.weight_scale_inv") &&
	      l.p[t->first].start[0] == 1 && l.p[t->first].extent[0] == 1, "w13 scale piece 0");
	shape(kat_find(&l, "model.layers.0.mlp.experts.w2_weight_scale_inv"), WEX_DT_F32, 3, 4, 4, 1);
	t = kat_find(&l, "model.layers.0.mlp.shared_expert.gate_up_proj.weight_scale_inv");
	shape(t, WEX_DT_F32, 2, 4, 4, 0);
	kat_piece(&l, t, 1, "model.layers.0.mlp.shared_expert.up_proj.weight_scale_inv", 2, 2, 2);
	no_scales(&l, "model.layers.0.mlp.gate.weight");
	no_scales(&l, "model.layers.0.mlp.shared_expert_gate.weight");
	no_scales(&l, "model.layers.0.self_attn.qkv_proj.bias");
	wex__rank_layout_free(&l);
	/* moe_intermediate_size 8 over etp = tp*dp = 4: 2 rows, half a block. */
	kat_refused(m, "vllm:tp=2,dp=2", "model.layers.0.mlp.experts.0.gate_proj.weight",
		       "model.layers.0.mlp.experts.0.gate_proj.weight_scale_inv");
	wex__model_free(m);

	/* Entries are matched as transformers does, anywhere inside a module
	 * name.  Layer 0 is sparse (no mlp.gate_proj: its router mlp.gate is
	 * unquantized), layer 1 dense. */
	not_convert("[\"lm_head\",\"model.embed_tokens\",\"model.norm\",\"model.layers.0.input_layernorm\","
		    "\"model.layers.0.mlp.gate\",\"model.layers.0.mlp.shared_expert_gate\","
		    "\"model.layers.1.post_attention_layernorm\",7,\"\",null]", NULL, NULL);
	/* After "layers.0.mlp.experts." the first entry wants 9, the module
	 * goes on with 1: the match goes on in the second entry. */
	not_convert("[\"layers.0.mlp.experts.9\",\"0.mlp.experts.1.up_proj\"]",
		    "0.mlp.experts.1.up_proj", "model.layers.0.mlp.experts.1.up_proj");
	/* "mlp.up_proj" ends inside the match of the longer first entry
	 * (layer 1's dense MLP; layer 0 has experts.E.up_proj and
	 * shared_expert.up_proj only). */
	not_convert("[\"1.mlp.up_proj_x\",\"mlp.up_proj\"]", "mlp.up_proj", "model.layers.1.mlp.up_proj");
	not_convert("[\"lm_head\",\"xpert.dow\"]", "xpert.dow", "model.layers.0.mlp.shared_expert.down_proj");
	not_convert("[\"model.layers.1.mlp.gate\"]", "model.layers.1.mlp.gate",
		    "model.layers.1.mlp.gate_proj");
	qwen3_235b_list();
	return T_PASS;
}
