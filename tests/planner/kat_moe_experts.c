/* SPDX-License-Identifier: MIT */
/*
 * kat_moe_experts.c - known answer for expert layouts (Qwen3-MoE, 8 experts,
 * moe_intermediate 4, hidden 8; worked out by hand):
 *  - vLLM's FusedMoE flattens tp*dp (FusedMoEParallelConfig.make):
 *    tp=2, dp=2 without expert parallelism splits every expert over the 4
 *    ranks: rank 2 (tp rank 0, dp rank 1) is flattened rank 2, so
 *    w13_weight is [8 experts, 2, 8] with row 2 of gate_proj at row 0 and
 *    row 2 of up_proj at row 1; w2_weight [8, 8, 1] holds column 2.
 *  - vLLM tp=2, dp=2 with enable_expert_parallel: ep = tp*dp = 4, experts
 *    whole, rank 3 (ep rank 1*2+1 = 3) holds experts 6 and 7 contiguously:
 *    w13_weight [2, 8, 8], slot s = [gate_proj (4 rows); up_proj (4 rows)]
 *    of expert 6+s.  vLLM has no other ep size: tp=4, ep=2 cannot exist.
 *  - Megatron tp=2, dp=2, ep=4, etp=1: experts spread over the 4 tp*dp
 *    ranks; rank 3 holds experts 6 and 7 as local_experts.0 and .1, each
 *    linear_fc1 = [gate; up] whole.
 *  - Megatron with --moe-grouped-gemm (TEGroupedMLP): the same experts as
 *    mlp.experts.linear_fc1.weight0 / weight1.
 *  - vLLM with 6 experts over ep=4: 2, 2, 1, 1 experts a rank (vLLM's
 *    determine_expert_map), refused by Megatron and SGLang.
 *  - Mixtral names: block_sparse_moe.experts.E.w1/w3/w2 in HF, vLLM's
 *    block_sparse_moe.experts.w13_weight.
 *  - Megatron with context parallelism (tp=1, cp=2, dp=2, ep=2, etp=1):
 *    its expert RankGenerator has no cp (order tp-cp-ep-dp-pp with
 *    tp=etp, cp=1), so global rank g = cp_rank + 2*dp_rank is ep rank
 *    g % 2: experts 0-3 on ranks 0 and 2 (cp rank 0), 4-7 on 1 and 3 (cp
 *    rank 1).  megatron:dp=4,ep=2,etp=1 at the global rank says so; the
 *    README's earlier rule (cp rank 0 registers alone, dp=2, rank
 *    tp_rank + dp_rank) put global rank 2 (cp 0, dp 1) at layout rank 1,
 *    experts 4-7, where Megatron keeps 0-3.
 */
#include "kat_common.h"

#define CFG(T) "{\"model_type\":\"" T "\",\"hidden_size\":8,\"num_hidden_layers\":1," \
	       "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"head_dim\":2," \
	       "\"intermediate_size\":16,\"moe_intermediate_size\":4,\"num_experts\":8," \
	       "\"num_local_experts\":8,\"vocab_size\":64,\"torch_dtype\":\"bfloat16\"}"

static void piece(const struct wex_rank_layout *l, const struct wex_layout_tensor *t, size_t k,
		  const char *cname, uint32_t dim, uint64_t s0, uint64_t n, uint64_t off_elems)
{
	CHECK(k < t->npieces, "%s: piece %zu missing", t->name, k);
	const struct wex_tensor *p = &l->p[t->first + k];

	CHECK(!strcmp(p->name, cname), "%s piece %zu is %s, wanted %s", t->name, k, p->name, cname);
	CHECK(p->start[dim] == s0 && p->extent[dim] == n, "%s piece %zu: dim %u [%llu,+%llu)", t->name,
	      k, dim, (unsigned long long)p->start[dim], (unsigned long long)p->extent[dim]);
	CHECK(p->offset == off_elems * 2, "%s piece %zu at byte %llu, wanted element %llu", t->name, k,
	      (unsigned long long)p->offset, (unsigned long long)off_elems);
}

int main(void)
{
	struct wex_model *m = kat_model(CFG("qwen3_moe"));
	struct wex_rank_layout l;
	const struct wex_layout_tensor *t;
	char a[128], b[128];

	/* vLLM dp=2 without EP: experts split over the 4 flattened ranks. */
	kat_rank(m, "vllm:tp=2,dp=2", 2, &l);
	t = kat_find(&l, "model.layers.0.mlp.experts.w13_weight");
	CHECK(t->ndim == 3 && t->shape[0] == 8 && t->shape[1] == 2 && t->shape[2] == 8,
	      "vllm tp=2,dp=2 w13 shape %llux%llux%llu, wanted 8x2x8",
	      (unsigned long long)t->shape[0], (unsigned long long)t->shape[1],
	      (unsigned long long)t->shape[2]);
	for (int s = 0; s < 8; s++) {
		snprintf(a, sizeof(a), "model.layers.0.mlp.experts.%d.gate_proj.weight", s);
		snprintf(b, sizeof(b), "model.layers.0.mlp.experts.%d.up_proj.weight", s);
		piece(&l, t, 2 * (size_t)s, a, 0, 2, 1, (uint64_t)s * 16);
		piece(&l, t, 2 * (size_t)s + 1, b, 0, 2, 1, (uint64_t)s * 16 + 8);
	}
	t = kat_find(&l, "model.layers.0.mlp.experts.w2_weight");
	CHECK(t->ndim == 3 && t->shape[1] == 8 && t->shape[2] == 1, "w2 shape");
	piece(&l, t, 1, "model.layers.0.mlp.experts.1.down_proj.weight", 1, 2, 1, 8);
	wex__rank_layout_free(&l);

	/* vLLM dp=2 with expert parallelism: ep = tp*dp = 4, experts whole. */
	kat_rank(m, "vllm:tp=2,dp=2,ep=4", 3, &l);
	t = kat_find(&l, "model.layers.0.mlp.experts.w13_weight");
	CHECK(t->ndim == 3 && t->shape[0] == 2 && t->shape[1] == 8 && t->shape[2] == 8, "w13 shape");
	for (int s = 0; s < 2; s++) {
		snprintf(a, sizeof(a), "model.layers.0.mlp.experts.%d.gate_proj.weight", 6 + s);
		snprintf(b, sizeof(b), "model.layers.0.mlp.experts.%d.up_proj.weight", 6 + s);
		piece(&l, t, 2 * (size_t)s, a, 0, 0, 4, (uint64_t)s * 64);
		piece(&l, t, 2 * (size_t)s + 1, b, 0, 0, 4, (uint64_t)s * 64 + 32);
	}
	t = kat_find(&l, "model.layers.0.mlp.experts.w2_weight");
	CHECK(t->ndim == 3 && t->shape[0] == 2 && t->shape[1] == 8 && t->shape[2] == 4, "w2 shape");
	piece(&l, t, 1, "model.layers.0.mlp.experts.7.down_proj.weight", 1, 0, 4, 32);
	wex__rank_layout_free(&l);
	{
		struct wex_layout_spec sp;
		uint32_t w;
		char err[256];

		CHECK(wex__layout_parse("vllm:tp=4,ep=2", &sp, err, sizeof(err)) == 0, "%s", err);
		CHECK(wex__layout_world(m, &sp, &w, err, sizeof(err)) == -WEX_ELAYOUT,
		      "vllm tp=4,ep=2 accepted: vLLM's ep is all tp*dp ranks or none");
		CHECK(strstr(err, "ep must be 1 or 4") != NULL, "error: %s", err);
	}

	/* Megatron's SequentialMLP and TEGroupedMLP (--moe-grouped-gemm): the
	 * same experts under other names (fc1 [gate; up] whole, fc2 whole). */
	for (int k = 0; k < 2; k++) {
		kat_rank(m, k ? "megatron_grouped:tp=2,dp=2,ep=4,etp=1" : "megatron:tp=2,dp=2,ep=4,etp=1",
			 3, &l);
		for (int e = 0; e < 2; e++) {
			if (k)
				snprintf(a, sizeof(a), "decoder.layers.0.mlp.experts.linear_fc1.weight%d", e);
			else
				snprintf(a, sizeof(a), "decoder.layers.0.mlp.experts.local_experts.%d.linear_fc1.weight", e);
			t = kat_find(&l, a);
			CHECK(t->shape[0] == 8 && t->shape[1] == 8, "%s shape", a);
			snprintf(a, sizeof(a), "model.layers.0.mlp.experts.%d.gate_proj.weight", 6 + e);
			snprintf(b, sizeof(b), "model.layers.0.mlp.experts.%d.up_proj.weight", 6 + e);
			piece(&l, t, 0, a, 0, 0, 4, 0);
			piece(&l, t, 1, b, 0, 0, 4, 32);
			if (k)
				snprintf(a, sizeof(a), "decoder.layers.0.mlp.experts.linear_fc2.weight%d", e);
			else
				snprintf(a, sizeof(a), "decoder.layers.0.mlp.experts.local_experts.%d.linear_fc2.weight", e);
			t = kat_find(&l, a);
			snprintf(b, sizeof(b), "model.layers.0.mlp.experts.%d.down_proj.weight", 6 + e);
			piece(&l, t, 0, b, 1, 0, 4, 0);
		}
		wex__rank_layout_free(&l);
	}
	wex__model_free(m);

	/* Experts that do not divide by ep (Qwen1.5-MoE's 60 over 8 ranks):
	 * vLLM's determine_expert_map ('linear') gives the 6 % 4 left over
	 * one each to the first ranks: 2, 2, 1, 1 experts from 0, 2, 4, 5.
	 * Megatron-Core and SGLang need ep to divide the experts. */
	m = kat_model("{\"model_type\":\"qwen3_moe\",\"hidden_size\":8,\"num_hidden_layers\":1,"
		      "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"head_dim\":2,"
		      "\"intermediate_size\":16,\"moe_intermediate_size\":4,\"num_experts\":6,"
		      "\"vocab_size\":64,\"torch_dtype\":\"bfloat16\"}");
	{
		static const int first[4] = { 0, 2, 4, 5 }, count[4] = { 2, 2, 1, 1 };

		for (uint32_t r = 0; r < 4; r++) {
			kat_rank(m, "vllm:tp=2,dp=2,ep=4", r, &l);
			t = kat_find(&l, "model.layers.0.mlp.experts.w13_weight");
			CHECK(t->ndim == 3 && t->shape[0] == (uint64_t)count[r] && t->shape[1] == 8,
			      "vllm ep=4 of 6 experts: rank %u w13 has %llu experts, wanted %d", r,
			      (unsigned long long)t->shape[0], count[r]);
			for (int s = 0; s < count[r]; s++) {
				snprintf(a, sizeof(a), "model.layers.0.mlp.experts.%d.gate_proj.weight",
					 first[r] + s);
				snprintf(b, sizeof(b), "model.layers.0.mlp.experts.%d.up_proj.weight",
					 first[r] + s);
				piece(&l, t, 2 * (size_t)s, a, 0, 0, 4, (uint64_t)s * 64);
				piece(&l, t, 2 * (size_t)s + 1, b, 0, 0, 4, (uint64_t)s * 64 + 32);
			}
			t = kat_find(&l, "model.layers.0.mlp.experts.w2_weight");
			CHECK(t->shape[0] == (uint64_t)count[r], "w2 experts");
			snprintf(a, sizeof(a), "model.layers.0.mlp.experts.%d.down_proj.weight",
				 first[r] + count[r] - 1);
			piece(&l, t, (size_t)count[r] - 1, a, 1, 0, 4, (uint64_t)(count[r] - 1) * 32);
			wex__rank_layout_free(&l);
		}
	}
	kat_refused(m, "sglang:tp=4,ep=4", "expert parallel size 4", "6 experts");
	kat_refused(m, "megatron:tp=2,dp=2,ep=4,etp=1", "expert parallel size 4", "6 experts");
	kat_refused(m, "vllm:tp=2,dp=4,ep=8", "expert parallel size 8", "6 experts");
	wex__model_free(m);

	/* Megatron tp=1, cp=2, dp=2, ep=2, etp=1: ep rank = global rank % 2. */
	m = kat_model(CFG("qwen3_moe"));
	for (uint32_t g = 0; g < 4; g++) {
		int first_e = 4 * (int)(g % 2);

		kat_rank(m, "megatron:dp=4,ep=2,etp=1", g, &l);
		t = kat_find(&l, "decoder.layers.0.mlp.experts.local_experts.0.linear_fc1.weight");
		snprintf(a, sizeof(a), "model.layers.0.mlp.experts.%d.gate_proj.weight", first_e);
		piece(&l, t, 0, a, 0, 0, 4, 0);
		wex__rank_layout_free(&l);
	}
	/* The rule that left cp out: global rank 2 (cp 0, dp 1) as rank 1 of
	 * dp=2 would be given experts 4-7; Megatron's rank 2 holds 0-3. */
	kat_rank(m, "megatron:dp=2,ep=2,etp=1", 1, &l);
	t = kat_find(&l, "decoder.layers.0.mlp.experts.local_experts.0.linear_fc1.weight");
	CHECK(strcmp(l.p[t->first].name, "model.layers.0.mlp.experts.0.gate_proj.weight"),
	      "dp=2 rank 1 holds expert 0: the cp-less rule would be right");
	wex__rank_layout_free(&l);
	wex__model_free(m);

	m = kat_model(CFG("mixtral"));
	kat_rank(m, "hf", 0, &l);
	kat_find(&l, "model.layers.0.block_sparse_moe.experts.7.w3.weight");
	kat_find(&l, "model.layers.0.block_sparse_moe.gate.weight");
	wex__rank_layout_free(&l);
	kat_rank(m, "vllm:tp=2", 1, &l);
	t = kat_find(&l, "model.layers.0.block_sparse_moe.experts.w13_weight");
	/* No ep: every rank holds all 8 experts, split over tp. */
	CHECK(t->shape[0] == 8 && t->shape[1] == 4, "mixtral w13 shape");
	piece(&l, t, 1, "model.layers.0.block_sparse_moe.experts.0.w3.weight", 0, 2, 2, 16);
	wex__rank_layout_free(&l);
	wex__model_free(m);
	printf("expert layouts match the hand-worked answers\n");
	return T_PASS;
}
