/* SPDX-License-Identifier: MIT */
/*
 * kat_dp_attention.c - known answer: SGLang with --enable-dp-attention
 * (sglang:...,dp_attention=1) runs tp ranks in all, not tp*dp: the
 * attention tensors are split over the attention-TP group of tp/dp ranks
 * (attn_tp_rank = tp_rank % (tp/dp)) and so repeated dp times, while the
 * MoE experts, shared experts and dense MLPs stay split over all tp ranks
 * and lm_head too unless dp_lm_head=1 (--enable-dp-lm-head); the
 * embedding is vocab-parallel over the attention-TP group; dense_tp=1
 * (--moe-dense-tp-size 1) keeps DeepSeek's dense MLPs whole.  a2a=1
 * (--moe-a2a-backend deepep or mooncake) keeps DeepSeek's shared experts
 * whole on every rank, with ep = tp (whole routed experts); embed_rep=1
 * (SGLang before PR #17403, or SGLANG_ENABLE_EMBED_REPLICATION=1) keeps the
 * embedding whole (padded to 192 rows) on every rank.
 *
 * Worked by hand for a small DeepSeek-V3 (4 heads, q_lora 12, kv_lora 8,
 * nope 4, rope 2, v 4: q_b_proj 24x12, kv_b_proj 32x8, o_proj 16x16;
 * dense layer 0 with 24-row gate/up; 8 experts of 8 rows; vocabulary 129
 * padded to 192) at tp=4, dp=2 (attention TP 2), and a small Qwen3-MoE
 * (4 heads, 2 KV heads, head_dim 4; 4 experts; vocabulary 101 padded to
 * 128) at tp=8, dp=2, ep=4: attention TP 4 > 2 KV heads, so each KV head
 * is on 2 attention ranks; experts: moe_tp = 8/4 = 2.  Combinations that
 * SGLang refuses or wex does not describe are refused, naming them.
 */
#include "kat_common.h"

#define DSV3 "{\"model_type\":\"deepseek_v3\",\"hidden_size\":16,\"num_hidden_layers\":2," \
	"\"num_attention_heads\":4,\"intermediate_size\":24,\"moe_intermediate_size\":8," \
	"\"n_routed_experts\":8,\"n_shared_experts\":1,\"first_k_dense_replace\":1," \
	"\"q_lora_rank\":12,\"kv_lora_rank\":8,\"qk_nope_head_dim\":4,\"qk_rope_head_dim\":2," \
	"\"v_head_dim\":4,\"vocab_size\":129,\"torch_dtype\":\"bfloat16\"}"
#define QWEN3_MOE "{\"model_type\":\"qwen3_moe\",\"hidden_size\":16,\"num_hidden_layers\":2," \
	"\"num_attention_heads\":4,\"num_key_value_heads\":2,\"head_dim\":4," \
	"\"intermediate_size\":24,\"moe_intermediate_size\":8,\"num_experts\":4," \
	"\"vocab_size\":101,\"torch_dtype\":\"bfloat16\"}"
#define QWEN3 "{\"model_type\":\"qwen3\",\"hidden_size\":16,\"num_hidden_layers\":2," \
	"\"num_attention_heads\":4,\"num_key_value_heads\":2,\"head_dim\":4," \
	"\"intermediate_size\":24,\"vocab_size\":101,\"tie_word_embeddings\":false," \
	"\"torch_dtype\":\"bfloat16\"}"

static uint32_t world(const struct wex_model *m, const char *layout)
{
	struct wex_layout_spec s;
	uint32_t w = 0;
	char err[512];

	CHECK(wex__layout_parse(layout, &s, err, sizeof(err)) == 0, "%s", err);
	CHECK(wex__layout_world(m, &s, &w, err, sizeof(err)) == 0, "%s: %s", layout, err);
	return w;
}

/* t (one piece) must hold columns [c0, c0+n) of canonical `cname`, all rows. */
static void cols(const struct wex_rank_layout *l, const struct wex_layout_tensor *t, const char *cname,
		 uint64_t c0, uint64_t n)
{
	const struct wex_tensor *p = &l->p[t->first];

	CHECK(t->npieces == 1 && !strcmp(p->name, cname), "%s: %zu pieces, first %s", t->name,
	      t->npieces, p->name);
	CHECK(p->start[0] == 0 && p->extent[0] == p->shape[0] && p->start[1] == c0 &&
		      p->extent[1] == n && t->shape[1] == n,
	      "%s holds columns [%llu,+%llu) of %s, wanted [%llu,+%llu)", t->name,
	      (unsigned long long)p->start[1], (unsigned long long)p->extent[1], cname,
	      (unsigned long long)c0, (unsigned long long)n);
}

/* Piece k of stacked-experts tensor t ([slots, rows, cols]) must hold rows
 * [r0, r0+n) of `cname` at row `prow` of slot 0. */
static void stack_piece(const struct wex_rank_layout *l, const struct wex_layout_tensor *t, size_t k,
			const char *cname, uint64_t r0, uint64_t n, uint64_t prow)
{
	const struct wex_tensor *p = &l->p[t->first + k];

	CHECK(t->ndim == 3 && k < t->npieces && !strcmp(p->name, cname), "%s piece %zu is %s",
	      t->name, k, k < t->npieces ? p->name : "missing");
	CHECK(p->start[0] == r0 && p->extent[0] == n &&
		      p->offset == prow * t->shape[2] * wex_dtype_size(t->dtype),
	      "%s piece %zu rows [%llu,+%llu) at byte %llu", t->name, k,
	      (unsigned long long)p->start[0], (unsigned long long)p->extent[0],
	      (unsigned long long)p->offset);
}

static void deepseek(void)
{
	struct wex_model *m = kat_model(DSV3);
	const char *qb = "model.layers.0.self_attn.q_b_proj.weight";
	const char *kvb = "model.layers.1.self_attn.kv_b_proj.weight";
	const char *emb = "model.embed_tokens.weight";
	struct wex_rank_layout l, l1;
	const struct wex_layout_tensor *t;

	/* tp ranks in all: dp does not multiply them. */
	CHECK(world(m, "sglang:tp=4,dp=2,dp_attention=1") == 4, "dp_attention=1: not tp ranks");
	CHECK(world(m, "sglang:tp=4,dp=2") == 8, "dp replicas: not tp*dp ranks");

	/* Rank 3: tp_rank 3, attention-TP rank 1 of 2 (heads 2 and 3). */
	kat_rank(m, "sglang:tp=4,dp=2,dp_attention=1", 3, &l);
	t = kat_find(&l, qb);
	CHECK(t->shape[0] == 12 && t->shape[1] == 12 && t->npieces == 1, "q_b_proj shape");
	kat_piece(&l, t, 0, qb, 12, 12, 0);
	t = kat_find(&l, kvb);
	CHECK(t->shape[0] == 16 && t->npieces == 1, "kv_b_proj shape");
	kat_piece(&l, t, 0, kvb, 16, 16, 0);
	cols(&l, kat_find(&l, "model.layers.1.self_attn.o_proj.weight"),
	     "model.layers.1.self_attn.o_proj.weight", 8, 8);
	/* fused_qkv_a_proj_with_mqa whole: q_a (12 rows) then kv_a (8+2). */
	t = kat_find(&l, "model.layers.0.self_attn.fused_qkv_a_proj_with_mqa.weight");
	CHECK(t->shape[0] == 22 && t->npieces == 2, "fused_qkv_a_proj_with_mqa shape");
	kat_piece(&l, t, 0, "model.layers.0.self_attn.q_a_proj.weight", 0, 12, 0);
	kat_piece(&l, t, 1, "model.layers.0.self_attn.kv_a_proj_with_mqa.weight", 0, 10, 12);
	/* Embedding over the attention-TP group: 192 / 2 = 96 rows a rank,
	 * rank 1 of the group holds vocabulary rows 96..128 (33). */
	t = kat_find(&l, emb);
	CHECK(t->shape[0] == 96 && t->npieces == 1, "embed_tokens: %llu rows",
	      (unsigned long long)t->shape[0]);
	kat_piece(&l, t, 0, emb, 96, 33, 0);
	/* lm_head over all 4 ranks: 48 rows each; rank 3's rows 144.. are
	 * all padding. */
	t = kat_find(&l, "lm_head.weight");
	CHECK(t->shape[0] == 48 && t->npieces == 0, "lm_head rank 3: %llu rows, %zu pieces",
	      (unsigned long long)t->shape[0], t->npieces);
	/* Dense MLP (layer 0) over all 4 ranks: 6 of 24 rows of gate and up. */
	t = kat_find(&l, "model.layers.0.mlp.gate_up_proj.weight");
	CHECK(t->shape[0] == 12, "dense gate_up_proj: %llu rows", (unsigned long long)t->shape[0]);
	kat_piece(&l, t, 0, "model.layers.0.mlp.gate_proj.weight", 18, 6, 0);
	kat_piece(&l, t, 1, "model.layers.0.mlp.up_proj.weight", 18, 6, 6);
	/* Experts over all 4 ranks (ep=1: moe_tp 4): rows 6..7 of each. */
	t = kat_find(&l, "model.layers.1.mlp.experts.w13_weight");
	CHECK(t->ndim == 3 && t->shape[0] == 8 && t->shape[1] == 4, "w13_weight shape");
	stack_piece(&l, t, 0, "model.layers.1.mlp.experts.0.gate_proj.weight", 6, 2, 0);
	stack_piece(&l, t, 1, "model.layers.1.mlp.experts.0.up_proj.weight", 6, 2, 2);
	/* Shared experts over all 4 ranks: rows 6..7 of 8. */
	t = kat_find(&l, "model.layers.1.mlp.shared_experts.gate_up_proj.weight");
	kat_piece(&l, t, 0, "model.layers.1.mlp.shared_experts.gate_proj.weight", 6, 2, 0);
	/* Rank 1 is attention-TP rank 1 too: the same attention slices. */
	kat_rank(m, "sglang:tp=4,dp=2,dp_attention=1", 1, &l1);
	kat_piece(&l1, kat_find(&l1, qb), 0, qb, 12, 12, 0);
	kat_piece(&l1, kat_find(&l1, emb), 0, emb, 96, 33, 0);
	/* but its own quarter of the experts and of lm_head (rows 48..95). */
	stack_piece(&l1, kat_find(&l1, "model.layers.1.mlp.experts.w13_weight"), 0,
		    "model.layers.1.mlp.experts.0.gate_proj.weight", 2, 2, 0);
	kat_piece(&l1, kat_find(&l1, "lm_head.weight"), 0, "lm_head.weight", 48, 48, 0);
	wex__rank_layout_free(&l1);
	wex__rank_layout_free(&l);

	/* dp_lm_head=1: lm_head like the embedding; dense_tp=1: dense MLP whole. */
	kat_rank(m, "sglang:tp=4,dp=2,dp_attention=1,dp_lm_head=1,dense_tp=1", 3, &l);
	t = kat_find(&l, "lm_head.weight");
	CHECK(t->shape[0] == 96 && t->npieces == 1, "dp_lm_head: %llu rows",
	      (unsigned long long)t->shape[0]);
	kat_piece(&l, t, 0, "lm_head.weight", 96, 33, 0);
	t = kat_find(&l, "model.layers.0.mlp.gate_up_proj.weight");
	CHECK(t->shape[0] == 48, "dense_tp=1 gate_up_proj: %llu rows",
	      (unsigned long long)t->shape[0]);
	kat_piece(&l, t, 0, "model.layers.0.mlp.gate_proj.weight", 0, 24, 0);
	kat_piece(&l, t, 1, "model.layers.0.mlp.up_proj.weight", 0, 24, 24);
	t = kat_find(&l, "model.layers.0.mlp.down_proj.weight");
	CHECK(t->shape[1] == 24 && l.p[t->first].extent[1] == 24, "dense_tp=1 down_proj");
	/* The shared experts are not dense layers: still over all 4 ranks. */
	t = kat_find(&l, "model.layers.1.mlp.shared_experts.gate_up_proj.weight");
	kat_piece(&l, t, 0, "model.layers.1.mlp.shared_experts.gate_proj.weight", 6, 2, 0);
	wex__rank_layout_free(&l);

	/* tp=8, dp=8, ep=8: attention whole on every rank, one expert each. */
	CHECK(world(m, "sglang:tp=8,dp=8,dp_attention=1,ep=8") == 8, "tp=8 dp=8 ep=8");
	kat_rank(m, "sglang:tp=8,dp=8,dp_attention=1,ep=8", 5, &l);
	kat_piece(&l, kat_find(&l, qb), 0, qb, 0, 24, 0);
	t = kat_find(&l, "model.layers.1.mlp.experts.w13_weight");
	CHECK(t->shape[0] == 1 && t->shape[1] == 16, "ep=8: one whole expert");
	stack_piece(&l, t, 0, "model.layers.1.mlp.experts.5.gate_proj.weight", 0, 8, 0);
	wex__rank_layout_free(&l);

	/* Refused, naming what does not fit. */
	kat_refused(m, "sglang:tp=4,dp=3,dp_attention=1", "dp=3", "tp=4");
	kat_refused(m, "sglang:tp=8,dp_attention=1", "attention tensor parallel size (tp/dp) 8",
		    "nh=4");
	kat_refused(m, "sglang:tp=4,dp=2,dp_attention=2", "dp_attention", "2");
	kat_refused(m, "sglang:tp=4,dp=2,dp_lm_head=1", "dp_lm_head", "dp_attention");
	kat_refused(m, "sglang:tp=4,dp=2,dp_attention=1,dp_lm_head=2", "dp_lm_head", "2");
	kat_refused(m, "sglang:tp=4,dense_tp=2", "dense_tp=2", "tp (4)");
	kat_refused(m, "vllm:tp=4,dp=2,dp_attention=1", "engine vllm", "dp_attention");
	kat_refused(m, "megatron:tp=4,dp_attention=1", "engine megatron", "dp_attention");
	kat_refused(m, "hf:dp_attention=1", "engine hf", "dp_attention");
	kat_refused(m, "vllm:tp=4,dense_tp=1", "engine vllm", "dense_tp");
	/* dense_tp=tp is SGLang's default spelled out. */
	CHECK(world(m, "sglang:tp=4,dense_tp=4") == 4, "dense_tp=tp refused");
	wex__model_free(m);
	printf("deepseek_v3 tp=4 dp=2 dp_attention=1: the hand-worked boxes\n");
}

/* Qwen3's attention (MoE and dense alike) at sglang:tp=8,dp=2,
 * dp_attention=1, rank 6: attention-TP rank 2 of 4, q head 2, KV head 1
 * (2 q heads per KV head); o_proj columns 8..11. */
static void attn_rank6(const struct wex_rank_layout *l)
{
	const struct wex_layout_tensor *t = kat_find(l, "model.layers.1.self_attn.qkv_proj.weight");

	CHECK(t->shape[0] == 12 && t->npieces == 3, "qkv_proj: %llu rows",
	      (unsigned long long)t->shape[0]);
	kat_piece(l, t, 0, "model.layers.1.self_attn.q_proj.weight", 8, 4, 0);
	kat_piece(l, t, 1, "model.layers.1.self_attn.k_proj.weight", 4, 4, 4);
	kat_piece(l, t, 2, "model.layers.1.self_attn.v_proj.weight", 4, 4, 8);
	cols(l, kat_find(l, "model.layers.1.self_attn.o_proj.weight"),
	     "model.layers.1.self_attn.o_proj.weight", 8, 4);
}

static void qwen3_moe(void)
{
	struct wex_model *m = kat_model(QWEN3_MOE);
	const char *lay = "sglang:tp=8,dp=2,dp_attention=1,ep=4";
	const char *q = "model.layers.1.self_attn.q_proj.weight";
	const char *k = "model.layers.1.self_attn.k_proj.weight";
	struct wex_rank_layout l;
	const struct wex_layout_tensor *t;

	CHECK(world(m, lay) == 8, "%s: not 8 ranks", lay);
	/* Rank 6: attention-TP rank 2 of 4: q head 2, KV head 1 (2 per head). */
	kat_rank(m, lay, 6, &l);
	attn_rank6(&l);
	kat_find(&l, "model.layers.1.self_attn.q_norm.weight");
	/* Experts over all 8 ranks, ep=4, moe_tp=2: rank 6 is expert 3,
	 * rows 0..3 of gate and of up. */
	t = kat_find(&l, "model.layers.1.mlp.experts.w13_weight");
	CHECK(t->ndim == 3 && t->shape[0] == 1 && t->shape[1] == 8, "w13_weight shape");
	stack_piece(&l, t, 0, "model.layers.1.mlp.experts.3.gate_proj.weight", 0, 4, 0);
	stack_piece(&l, t, 1, "model.layers.1.mlp.experts.3.up_proj.weight", 0, 4, 4);
	/* Embedding over 4 attention ranks (32 rows each): rows 64..95;
	 * lm_head over 8 (16 each): rows 96..100. */
	t = kat_find(&l, "model.embed_tokens.weight");
	CHECK(t->shape[0] == 32, "embed rows");
	kat_piece(&l, t, 0, "model.embed_tokens.weight", 64, 32, 0);
	t = kat_find(&l, "lm_head.weight");
	CHECK(t->shape[0] == 16, "lm_head rows");
	kat_piece(&l, t, 0, "lm_head.weight", 96, 5, 0);
	wex__rank_layout_free(&l);
	/* Rank 2 holds rank 6's attention slices. */
	kat_rank(m, lay, 2, &l);
	t = kat_find(&l, "model.layers.1.self_attn.qkv_proj.weight");
	kat_piece(&l, t, 0, q, 8, 4, 0);
	kat_piece(&l, t, 1, k, 4, 4, 4);
	wex__rank_layout_free(&l);
	/* DeepSeek's --moe-dense-tp-size only: Qwen3-MoE has no such MLP. */
	kat_refused(m, "sglang:tp=8,dense_tp=1", "dense_tp", "qwen3_moe");
	wex__model_free(m);
	printf("qwen3_moe tp=8 dp=2 dp_attention=1 ep=4: the hand-worked boxes\n");
}

/* Qwen3 (dense): SGLang's Qwen3Attention builds qkv_proj and o_proj with
 * attn_tp_rank/attn_tp_size (models/qwen3.py), the embedding is Qwen2Model's
 * (use_attn_tp_group=is_dp_attention_enabled(), or enable_tp=not
 * is_dp_attention_enabled() before PR #17403) and the MLP (Qwen2MLP) is
 * over all tp ranks: the same dp-attention layout as Qwen3-MoE's. */
static void qwen3_dense(void)
{
	struct wex_model *m = kat_model(QWEN3);
	const char *lay = "sglang:tp=8,dp=2,dp_attention=1";
	struct wex_rank_layout l;
	const struct wex_layout_tensor *t;

	CHECK(world(m, lay) == 8, "%s: not 8 ranks", lay);
	/* Rank 6: attention-TP rank 2 of 4: q head 2, KV head 1. */
	kat_rank(m, lay, 6, &l);
	attn_rank6(&l);
	kat_find(&l, "model.layers.1.self_attn.k_norm.weight");
	/* MLP over all 8 ranks: 3 of 24 rows of gate and up, rows 18..20. */
	t = kat_find(&l, "model.layers.1.mlp.gate_up_proj.weight");
	CHECK(t->shape[0] == 6, "gate_up_proj: %llu rows", (unsigned long long)t->shape[0]);
	kat_piece(&l, t, 0, "model.layers.1.mlp.gate_proj.weight", 18, 3, 0);
	kat_piece(&l, t, 1, "model.layers.1.mlp.up_proj.weight", 18, 3, 3);
	/* Embedding over 4 attention ranks: rows 64..95; lm_head over 8. */
	kat_piece(&l, kat_find(&l, "model.embed_tokens.weight"), 0, "model.embed_tokens.weight",
		  64, 32, 0);
	kat_piece(&l, kat_find(&l, "lm_head.weight"), 0, "lm_head.weight", 96, 5, 0);
	wex__rank_layout_free(&l);
	/* SGLang before PR #17403: the embedding whole on every rank. */
	kat_rank(m, "sglang:tp=8,dp=2,dp_attention=1,embed_rep=1,dp_lm_head=1", 6, &l);
	kat_piece(&l, kat_find(&l, "model.embed_tokens.weight"), 0, "model.embed_tokens.weight",
		  0, 101, 0);
	kat_piece(&l, kat_find(&l, "lm_head.weight"), 0, "lm_head.weight", 64, 32, 0);
	wex__rank_layout_free(&l);
	wex__model_free(m);
	printf("qwen3 tp=8 dp=2 dp_attention=1: the hand-worked boxes\n");
}

/* a2a=1: --moe-a2a-backend deepep/mooncake; embed_rep=1: the embedding
 * whole under dp-attention (SGLang before PR #17403). */
static void a2a_embed_rep(void)
{
	struct wex_model *m = kat_model(DSV3), *q = kat_model(QWEN3_MOE);
	const char *lay = "sglang:tp=4,dp=2,dp_attention=1,ep=4,a2a=1";
	const char *sg = "model.layers.1.mlp.shared_experts.gate_proj.weight";
	const char *su = "model.layers.1.mlp.shared_experts.up_proj.weight";
	const char *sd = "model.layers.1.mlp.shared_experts.down_proj.weight";
	const char *qb = "model.layers.0.self_attn.q_b_proj.weight";
	const char *emb = "model.embed_tokens.weight";
	struct wex_rank_layout l;
	const struct wex_layout_tensor *t;

	CHECK(world(m, lay) == 4, "%s: not 4 ranks", lay);
	/* Rank 3: the shared expert whole (gate 8 rows, then up 8 rows;
	 * down_proj all 8 columns), routed experts 6 and 7 whole (ep = tp =
	 * 4: 2 a rank, moe_tp 1), attention as without a2a (heads 2, 3),
	 * the dense MLP still over all 4 ranks. */
	kat_rank(m, lay, 3, &l);
	t = kat_find(&l, "model.layers.1.mlp.shared_experts.gate_up_proj.weight");
	CHECK(t->shape[0] == 16 && t->shape[1] == 16 && t->npieces == 2,
	      "a2a shared gate_up_proj: %llu rows, %zu pieces", (unsigned long long)t->shape[0],
	      t->npieces);
	kat_piece(&l, t, 0, sg, 0, 8, 0);
	kat_piece(&l, t, 1, su, 0, 8, 8);
	cols(&l, kat_find(&l, "model.layers.1.mlp.shared_experts.down_proj.weight"), sd, 0, 8);
	t = kat_find(&l, "model.layers.1.mlp.experts.w13_weight");
	CHECK(t->ndim == 3 && t->shape[0] == 2 && t->shape[1] == 16, "a2a w13_weight shape");
	stack_piece(&l, t, 0, "model.layers.1.mlp.experts.6.gate_proj.weight", 0, 8, 0);
	stack_piece(&l, t, 1, "model.layers.1.mlp.experts.6.up_proj.weight", 0, 8, 8);
	kat_piece(&l, kat_find(&l, qb), 0, qb, 12, 12, 0);
	kat_piece(&l, kat_find(&l, "model.layers.0.mlp.gate_up_proj.weight"), 0,
		  "model.layers.0.mlp.gate_proj.weight", 18, 6, 0);
	kat_piece(&l, kat_find(&l, emb), 0, emb, 96, 33, 0);
	wex__rank_layout_free(&l);
	/* Rank 0 holds the same whole shared expert. */
	kat_rank(m, lay, 0, &l);
	kat_piece(&l, kat_find(&l, "model.layers.1.mlp.shared_experts.gate_up_proj.weight"), 1, su,
		  0, 8, 8);
	wex__rank_layout_free(&l);
	/* DeepEP without dp-attention (attention over all tp ranks). */
	CHECK(world(m, "sglang:tp=4,ep=4,a2a=1") == 4, "a2a without dp_attention");
	kat_rank(m, "sglang:tp=4,ep=4,a2a=1", 2, &l);
	kat_piece(&l, kat_find(&l, "model.layers.1.mlp.shared_experts.gate_up_proj.weight"), 0, sg,
		  0, 8, 0);
	kat_piece(&l, kat_find(&l, qb), 0, qb, 12, 6, 0);
	wex__rank_layout_free(&l);

	/* embed_rep=1: the embedding whole, padded to 192 rows, on every
	 * rank; lm_head unchanged (over all 4 ranks, rows 48..95 on rank 1). */
	kat_rank(m, "sglang:tp=4,dp=2,dp_attention=1,embed_rep=1", 1, &l);
	t = kat_find(&l, emb);
	CHECK(t->shape[0] == 192 && t->shape[1] == 16 && t->npieces == 1,
	      "embed_rep: %llu rows, %zu pieces", (unsigned long long)t->shape[0], t->npieces);
	kat_piece(&l, t, 0, emb, 0, 129, 0);
	t = kat_find(&l, "lm_head.weight");
	CHECK(t->shape[0] == 48, "embed_rep lm_head: %llu rows", (unsigned long long)t->shape[0]);
	kat_piece(&l, t, 0, "lm_head.weight", 48, 48, 0);
	wex__rank_layout_free(&l);
	/* Both, with dp_lm_head=1 (lm_head over the attention group). */
	kat_rank(m, "sglang:tp=4,dp=2,dp_attention=1,ep=4,a2a=1,embed_rep=1,dp_lm_head=1", 3, &l);
	kat_piece(&l, kat_find(&l, emb), 0, emb, 0, 129, 0);
	kat_piece(&l, kat_find(&l, "lm_head.weight"), 0, "lm_head.weight", 96, 33, 0);
	cols(&l, kat_find(&l, "model.layers.1.mlp.shared_experts.down_proj.weight"), sd, 0, 8);
	wex__rank_layout_free(&l);
	/* Qwen3-MoE: 101 rows padded to 128, whole on rank 6. */
	kat_rank(q, "sglang:tp=8,dp=2,dp_attention=1,ep=4,embed_rep=1", 6, &l);
	t = kat_find(&l, emb);
	CHECK(t->shape[0] == 128 && t->npieces == 1, "qwen3_moe embed_rep: %llu rows",
	      (unsigned long long)t->shape[0]);
	kat_piece(&l, t, 0, emb, 0, 101, 0);
	wex__rank_layout_free(&l);

	/* Refused, naming what does not fit. */
	kat_refused(m, "sglang:tp=4,a2a=1", "a2a=1", "ep=4");
	kat_refused(m, "sglang:tp=4,ep=2,a2a=1", "ep=2", "ep=4");
	kat_refused(m, "sglang:tp=1,a2a=1,fuse_shared=1", "fuse_shared=1", "a2a=1");
	kat_refused(m, "sglang:tp=4,ep=4,a2a=2", "a2a", "2");
	kat_refused(m, "vllm:tp=4,ep=4,a2a=1", "engine vllm", "a2a");
	kat_refused(m, "megatron:tp=4,ep=4,a2a=1", "engine megatron", "a2a");
	kat_refused(q, "sglang:tp=8,ep=8,a2a=1", "a2a", "qwen3_moe");
	kat_refused(m, "sglang:tp=4,dp=2,embed_rep=1", "embed_rep=1", "dp_attention=1");
	kat_refused(m, "sglang:tp=4,embed_rep=1", "embed_rep=1", "dp_attention=1");
	kat_refused(m, "sglang:tp=4,dp=2,dp_attention=1,embed_rep=2", "embed_rep", "2");
	kat_refused(m, "vllm:tp=4,embed_rep=1", "engine vllm", "embed_rep");
	kat_refused(m, "hf:embed_rep=1", "engine hf", "embed_rep");
	wex__model_free(q);
	wex__model_free(m);
	printf("deepseek_v3 a2a=1, embed_rep=1; qwen3_moe embed_rep=1: the hand-worked boxes\n");
}

int main(void)
{
	deepseek();
	qwen3_moe();
	qwen3_dense();
	a2a_embed_rep();
	return T_PASS;
}
