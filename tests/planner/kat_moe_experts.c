/* SPDX-License-Identifier: MIT */
/*
 * kat_moe_experts.c - known answer for expert layouts (Qwen3-MoE, 8 experts,
 * moe_intermediate 4, hidden 8; worked out by hand):
 *  - vLLM tp=4, ep=2 (so expert tp 2): rank 3 is expert-parallel rank 1,
 *    expert-tp rank 1: w13_weight is [4 local experts, 4, 8]; slot s holds
 *    rows 2-3 of gate_proj of expert 4+s at rows 0-1 and rows 2-3 of its
 *    up_proj at rows 2-3; w2_weight [4, 8, 2] holds columns 2-3 of
 *    down_proj.
 *  - Megatron tp=2, dp=2, ep=4, etp=1: experts spread over the 4 tp*dp
 *    ranks; rank 3 holds experts 6 and 7 as local_experts.0 and .1, each
 *    linear_fc1 = [gate; up] whole.
 *  - Mixtral names: block_sparse_moe.experts.E.w1/w3/w2 in HF, vLLM's
 *    block_sparse_moe.experts.w13_weight.
 */
#include "kat_common.h"

#define CFG(T) "{\"model_type\":\"" T "\",\"hidden_size\":8,\"num_hidden_layers\":1," \
	       "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"head_dim\":2," \
	       "\"intermediate_size\":16,\"moe_intermediate_size\":4,\"num_experts\":8," \
	       "\"num_local_experts\":8,\"vocab_size\":64,\"torch_dtype\":\"bfloat16\"}"

static void piece(const struct wex_rank_layout *l, const struct wex_phys *t, size_t k,
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
	const struct wex_phys *t;
	char a[128], b[128];

	kat_rank(m, "vllm:tp=4,ep=2", 3, &l);
	t = kat_find(&l, "model.layers.0.mlp.experts.w13_weight");
	CHECK(t->ndim == 3 && t->shape[0] == 4 && t->shape[1] == 4 && t->shape[2] == 8, "w13 shape");
	for (int s = 0; s < 4; s++) {
		snprintf(a, sizeof(a), "model.layers.0.mlp.experts.%d.gate_proj.weight", 4 + s);
		snprintf(b, sizeof(b), "model.layers.0.mlp.experts.%d.up_proj.weight", 4 + s);
		piece(&l, t, 2 * (size_t)s, a, 0, 2, 2, (uint64_t)s * 32);
		piece(&l, t, 2 * (size_t)s + 1, b, 0, 2, 2, (uint64_t)s * 32 + 16);
	}
	t = kat_find(&l, "model.layers.0.mlp.experts.w2_weight");
	CHECK(t->ndim == 3 && t->shape[1] == 8 && t->shape[2] == 2, "w2 shape");
	piece(&l, t, 1, "model.layers.0.mlp.experts.5.down_proj.weight", 1, 2, 2, 16);
	wex__rank_layout_free(&l);

	kat_rank(m, "megatron:tp=2,dp=2,ep=4,etp=1", 3, &l);
	for (int e = 0; e < 2; e++) {
		snprintf(a, sizeof(a), "decoder.layers.0.mlp.experts.local_experts.%d.linear_fc1.weight", e);
		t = kat_find(&l, a);
		CHECK(t->shape[0] == 8 && t->shape[1] == 8, "fc1 shape");
		snprintf(a, sizeof(a), "model.layers.0.mlp.experts.%d.gate_proj.weight", 6 + e);
		snprintf(b, sizeof(b), "model.layers.0.mlp.experts.%d.up_proj.weight", 6 + e);
		piece(&l, t, 0, a, 0, 0, 4, 0);
		piece(&l, t, 1, b, 0, 0, 4, 32);
	}
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
