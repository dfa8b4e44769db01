/* SPDX-License-Identifier: MIT */
/*
 * kat_mla.c - known answer for DeepSeek-V3 MLA and dense/MoE layers (4
 * heads, q_lora 12, kv_lora 8, nope 4, rope 2, v 4, hidden 16, first layer
 * dense; worked out by hand):
 *  - vLLM tp=2 rank 1: fused_qkv_a_proj = [q_a_proj (12 rows); kv_a_proj_
 *    with_mqa (10 rows)] whole; q_b_proj holds heads 2,3 = rows 12-23 of
 *    q_b_proj (6 rows per head); kv_b_proj rows 16-31 (8 per head); o_proj
 *    columns 8-15; layer 0 has mlp.gate_up_proj, layer 1 mlp.experts and
 *    mlp.shared_experts.gate_up_proj instead.
 *  - SGLang names the fused projection fused_qkv_a_proj_with_mqa, and with
 *    fuse_shared=1 stacks the shared expert after the routed ones.
 *  - vLLM with MLA off (no_mla=1): q_a_proj and kv_a_proj_with_mqa
 *    apart; with sequence-parallel MoE (sp_moe=1) the shared experts whole.
 *  - Megatron tp=2 rank 1: linear_q_up_proj / linear_kv_up_proj the same
 *    rows; the layer norms ride on linear_*_up_proj.layer_norm_weight.
 *  - The router's score-correction bias is F32 in a bf16 model everywhere:
 *    HF (_keep_in_fp32_modules_strict), vLLM/SGLang (nn.Parameter of
 *    torch.float32), Megatron (expert_bias buffer): 4 experts = 16 bytes.
 */
#include "kat_common.h"

#define CFG "{\"model_type\":\"deepseek_v3\",\"hidden_size\":16,\"num_hidden_layers\":2," \
	    "\"num_attention_heads\":4,\"intermediate_size\":24,\"moe_intermediate_size\":8," \
	    "\"n_routed_experts\":4,\"n_shared_experts\":1,\"first_k_dense_replace\":1," \
	    "\"q_lora_rank\":12,\"kv_lora_rank\":8,\"qk_nope_head_dim\":4,\"qk_rope_head_dim\":2," \
	    "\"v_head_dim\":4,\"vocab_size\":128}"

int main(void)
{
	struct wex_model *m = kat_model(CFG);
	struct wex_rank_layout l;
	const struct wex_layout_tensor *t;

	kat_rank(m, "vllm:tp=2", 1, &l);
	t = kat_find(&l, "model.layers.0.self_attn.fused_qkv_a_proj.weight");
	CHECK(t->shape[0] == 22 && t->shape[1] == 16, "fused_qkv_a_proj shape");
	kat_piece(&l, t, 0, "model.layers.0.self_attn.q_a_proj.weight", 0, 12, 0);
	kat_piece(&l, t, 1, "model.layers.0.self_attn.kv_a_proj_with_mqa.weight", 0, 10, 12);
	t = kat_find(&l, "model.layers.1.self_attn.q_b_proj.weight");
	kat_piece(&l, t, 0, "model.layers.1.self_attn.q_b_proj.weight", 12, 12, 0);
	t = kat_find(&l, "model.layers.1.self_attn.kv_b_proj.weight");
	kat_piece(&l, t, 0, "model.layers.1.self_attn.kv_b_proj.weight", 16, 16, 0);
	t = kat_find(&l, "model.layers.0.self_attn.o_proj.weight");
	CHECK(t->shape[0] == 16 && t->shape[1] == 8 && l.p[t->first].start[1] == 8, "o_proj columns");
	kat_find(&l, "model.layers.0.mlp.gate_up_proj.weight");
	kat_find(&l, "model.layers.1.mlp.experts.w13_weight");
	kat_find(&l, "model.layers.1.mlp.shared_experts.gate_up_proj.weight");
	t = kat_find(&l, "model.layers.1.mlp.gate.e_score_correction_bias");
	CHECK(t->dtype == WEX_DT_F32 && t->nbytes == 16 && l.p[t->first].dtype == WEX_DT_F32,
	      "vllm e_score_correction_bias is %s, %llu bytes; wanted F32, 16",
	      wex_dtype_name(t->dtype), (unsigned long long)t->nbytes);
	t = kat_find(&l, "model.layers.1.mlp.gate.weight");
	CHECK(t->dtype == WEX_DT_BF16, "router weight is %s", wex_dtype_name(t->dtype));
	for (size_t i = 0; i < l.nt; i++)
		CHECK(strcmp(l.t[i].name, "model.layers.1.mlp.gate_up_proj.weight") &&
			      strcmp(l.t[i].name, "model.layers.0.mlp.experts.w13_weight"),
		      "%s on the wrong kind of layer", l.t[i].name);
	wex__rank_layout_free(&l);

	kat_rank(m, "sglang:tp=2", 0, &l);
	kat_find(&l, "model.layers.0.self_attn.fused_qkv_a_proj_with_mqa.weight");
	wex__rank_layout_free(&l);

	/* SGLang's shared-expert fusion (its default for DeepSeek-V3/R1):
	 * tp=2 rank 1, layer 1: w13_weight [4 routed + 1 shared, 8, 16], the
	 * fifth slot rows 4-7 of shared_experts.gate_proj then of up_proj;
	 * w2_weight [5, 16, 4], the fifth slot columns 4-7 of down_proj; no
	 * mlp.shared_experts tensors. */
	kat_rank(m, "sglang:tp=2,fuse_shared=1", 1, &l);
	t = kat_find(&l, "model.layers.1.mlp.experts.w13_weight");
	CHECK(t->ndim == 3 && t->shape[0] == 5 && t->shape[1] == 8 && t->shape[2] == 16 &&
		      t->npieces == 10 && t->nbytes == 5 * 8 * 16 * 2,
	      "fused w13 is %llux%llux%llu in %zu pieces", (unsigned long long)t->shape[0],
	      (unsigned long long)t->shape[1], (unsigned long long)t->shape[2], t->npieces);
	{
		const struct wex_tensor *g = &l.p[t->first + 8], *u = &l.p[t->first + 9];

		CHECK(!strcmp(g->name, "model.layers.1.mlp.shared_experts.gate_proj.weight") &&
			      g->start[0] == 4 && g->extent[0] == 4 && g->offset == 4 * 8 * 16 * 2,
		      "slot 4 gate piece: %s rows %llu+%llu at %llu", g->name,
		      (unsigned long long)g->start[0], (unsigned long long)g->extent[0],
		      (unsigned long long)g->offset);
		CHECK(!strcmp(u->name, "model.layers.1.mlp.shared_experts.up_proj.weight") &&
			      u->start[0] == 4 && u->extent[0] == 4 && u->offset == (4 * 8 + 4) * 16 * 2,
		      "slot 4 up piece: %s rows %llu+%llu at %llu", u->name,
		      (unsigned long long)u->start[0], (unsigned long long)u->extent[0],
		      (unsigned long long)u->offset);
		g = &l.p[t->first + 2];
		CHECK(!strcmp(g->name, "model.layers.1.mlp.experts.1.gate_proj.weight"),
		      "slot 1 is %s", g->name);
	}
	t = kat_find(&l, "model.layers.1.mlp.experts.w2_weight");
	CHECK(t->shape[0] == 5 && t->shape[1] == 16 && t->shape[2] == 4 && t->npieces == 5, "fused w2 shape");
	{
		const struct wex_tensor *d = &l.p[t->first + 4];

		CHECK(!strcmp(d->name, "model.layers.1.mlp.shared_experts.down_proj.weight") &&
			      d->start[1] == 4 && d->extent[1] == 4 && d->offset == 4 * 16 * 4 * 2,
		      "slot 4 down piece: %s", d->name);
	}
	for (size_t i = 0; i < l.nt; i++)
		CHECK(!strstr(l.t[i].name, "shared_experts"), "%s emitted though fused", l.t[i].name);
	wex__rank_layout_free(&l);
	{
		struct wex_layout_spec sp;
		uint32_t w;
		char err[256];

		CHECK(wex__layout_parse("sglang:tp=2,ep=2,fuse_shared=1", &sp, err, sizeof(err)) == 0, "%s", err);
		CHECK(wex__layout_world(m, &sp, &w, err, sizeof(err)) == -WEX_ELAYOUT &&
			      strstr(err, "without expert parallelism"),
		      "fuse_shared with ep=2: %s", err);
		CHECK(wex__layout_parse("vllm:tp=2,fuse_shared=1", &sp, err, sizeof(err)) == 0, "%s", err);
		CHECK(wex__layout_world(m, &sp, &w, err, sizeof(err)) < 0 && strstr(err, "fuse_shared"),
		      "vllm took fuse_shared: %s", err);
	}

	/* vLLM with MLA off (VLLM_MLA_DISABLE=1, no_mla=1; the wex hook refuses
	 * MLA in vLLM): DeepseekV2Attention keeps q_a_proj [12, 16] and
	 * kv_a_proj_with_mqa [10, 16] whole and apart, no fused_qkv_a_proj;
	 * q_b_proj, kv_b_proj and o_proj split as with MLA. */
	kat_rank(m, "vllm:tp=2,no_mla=1", 1, &l);
	t = kat_find(&l, "model.layers.1.self_attn.q_a_proj.weight");
	CHECK(t->shape[0] == 12 && t->npieces == 1, "no_mla q_a_proj shape");
	kat_piece(&l, t, 0, "model.layers.1.self_attn.q_a_proj.weight", 0, 12, 0);
	t = kat_find(&l, "model.layers.1.self_attn.kv_a_proj_with_mqa.weight");
	CHECK(t->shape[0] == 10 && t->npieces == 1, "no_mla kv_a_proj_with_mqa shape");
	kat_piece(&l, t, 0, "model.layers.1.self_attn.kv_a_proj_with_mqa.weight", 0, 10, 0);
	t = kat_find(&l, "model.layers.1.self_attn.q_b_proj.weight");
	kat_piece(&l, t, 0, "model.layers.1.self_attn.q_b_proj.weight", 12, 12, 0);
	for (size_t i = 0; i < l.nt; i++)
		CHECK(!strstr(l.t[i].name, "fused_qkv_a_proj"), "%s emitted with no_mla=1",
		      l.t[i].name);
	wex__rank_layout_free(&l);
	/* vLLM's sequence-parallel MoE (sp_moe=1: enable_expert_parallel, tp
	 * and dp above 1): DeepseekV2MoE builds the shared experts with
	 * disable_tp, whole on every rank: tp=2,dp=2,ep=4 rank 3 holds
	 * shared_experts.gate_up_proj [gate (8 rows); up (8 rows)] and
	 * down_proj [16, 8]; the routed experts one per rank as without it. */
	kat_rank(m, "vllm:tp=2,dp=2,ep=4,sp_moe=1", 3, &l);
	t = kat_find(&l, "model.layers.1.mlp.shared_experts.gate_up_proj.weight");
	CHECK(t->shape[0] == 16 && t->npieces == 2, "sp_moe shared gate_up_proj: %llu rows",
	      (unsigned long long)t->shape[0]);
	kat_piece(&l, t, 0, "model.layers.1.mlp.shared_experts.gate_proj.weight", 0, 8, 0);
	kat_piece(&l, t, 1, "model.layers.1.mlp.shared_experts.up_proj.weight", 0, 8, 8);
	t = kat_find(&l, "model.layers.1.mlp.shared_experts.down_proj.weight");
	CHECK(t->shape[0] == 16 && t->shape[1] == 8 && l.p[t->first].start[1] == 0 &&
		      l.p[t->first].extent[1] == 8,
	      "sp_moe shared down_proj");
	t = kat_find(&l, "model.layers.1.mlp.experts.w13_weight");
	CHECK(t->shape[0] == 1 && t->shape[1] == 16, "sp_moe routed experts");
	wex__rank_layout_free(&l);
	{
		struct wex_model *q = kat_model("{\"model_type\":\"qwen2_moe\",\"hidden_size\":16,"
						"\"num_hidden_layers\":1,\"num_attention_heads\":4,"
						"\"num_key_value_heads\":4,\"intermediate_size\":8,"
						"\"moe_intermediate_size\":8,\"num_experts\":4,"
						"\"shared_expert_intermediate_size\":8,\"vocab_size\":128}");

		kat_refused(q, "vllm:tp=2,no_mla=1", "no_mla", "deepseek_v3");
		kat_refused(q, "vllm:tp=2,dp=2,ep=4,sp_moe=1", "sp_moe", "qwen2_moe");
		wex__model_free(q);
	}

	kat_rank(m, "megatron:tp=2", 1, &l);
	t = kat_find(&l, "decoder.layers.1.self_attention.linear_q_up_proj.weight");
	kat_piece(&l, t, 0, "model.layers.1.self_attn.q_b_proj.weight", 12, 12, 0);
	t = kat_find(&l, "decoder.layers.1.self_attention.linear_kv_up_proj.weight");
	kat_piece(&l, t, 0, "model.layers.1.self_attn.kv_b_proj.weight", 16, 16, 0);
	kat_find(&l, "decoder.layers.1.self_attention.linear_kv_up_proj.layer_norm_weight");
	kat_find(&l, "decoder.layers.1.pre_mlp_layernorm.weight");
	kat_find(&l, "decoder.layers.0.mlp.linear_fc1.layer_norm_weight");
	t = kat_find(&l, "decoder.layers.1.mlp.router.expert_bias");
	CHECK(t->dtype == WEX_DT_F32 && t->nbytes == 16, "megatron expert_bias is %s",
	      wex_dtype_name(t->dtype));
	wex__rank_layout_free(&l);

	kat_rank(m, "hf", 0, &l);
	t = kat_find(&l, "model.layers.1.mlp.gate.e_score_correction_bias");
	CHECK(t->dtype == WEX_DT_F32 && t->nbytes == 16 && l.p[t->first].dtype == WEX_DT_F32,
	      "hf e_score_correction_bias is %s", wex_dtype_name(t->dtype));
	t = kat_find(&l, "model.layers.1.mlp.gate.weight");
	CHECK(t->dtype == WEX_DT_BF16, "hf router weight is %s", wex_dtype_name(t->dtype));
	wex__rank_layout_free(&l);
	wex__model_free(m);
	printf("MLA layouts match the hand-worked answers\n");
	return T_PASS;
}
