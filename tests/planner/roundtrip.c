/* SPDX-License-Identifier: MIT */
/*
 * roundtrip.c - proves hf -> megatron (tp=2, pp=3 with an uneven first
 * stage, dp=2) -> vllm (tp=4, KV heads replicated) -> hf gives back the
 * original bytes of every canonical tensor, for a small Qwen2-like model
 * (qkv bias, tied embeddings, odd vocabulary) and for a small Qwen3-MoE
 * model (megatron ep=2 -> vllm ep=2), one with decoder_sparse_step=2 and
 * mlp_only_layers=[0] (dense MLPs on layers 0 and 2, experts on 1 and 3;
 * megatron pp=2 -> vllm tp=2) and a small DeepSeek-V3 model (MLA,
 * a dense first layer, shared experts; megatron tp=2,pp=2,ep=4,etp=1 with
 * an uneven first stage -> sglang tp=4,ep=2), and that DeepSeek-V3 FP8
 * block-quantized (F8_E4M3 weights and F32 weight_scale_inv; vllm tp=2,ep=2
 * -> sglang with the shared expert fused), and a small Qwen2-MoE (qkv
 * biases, a sigmoid-gated shared expert, a dense layer from mlp_only_layers:
 * vllm tp=2 -> sglang tp=2,ep=2 and megatron tp=2,pp=3,ep=2,etp=1 -> vllm
 * tp=2,ep=2), and Qwen3 and that Qwen2-MoE block-quantized FP8 (vllm ->
 * sglang).  And pipeline splits whose layers do not divide by pp: vLLM's
 * (the remainder before the last stage: 5 layers pp=3 -> 2/2/1) to
 * SGLang's (to the last stages: pp=2 -> 2/3), an explicit stages=1/3/1 to
 * Megatron's first=2, and the DeepSeek-V3 model (3 layers) vllm pp=2
 * (2/1) -> sglang pp=2 (1/2).  And SGLang's dp-attention (dp_attention=1:
 * attention split over tp/dp ranks and repeated dp times): DeepSeek-V3
 * sglang tp=4,dp=2,ep=2 with dense_tp=1 -> tp=4,dp=4,pp=2 with
 * dp_lm_head=1 and the shared expert fused, and Qwen3-MoE megatron ->
 * sglang tp=8,dp=2,ep=4 (4 attention ranks for 2 KV heads); DeepSeek-V3
 * under DeepEP (a2a=1, shared experts whole, ep = tp) and with the
 * embedding whole (embed_rep=1) hf -> sglang tp=4,dp=4 -> hf, both with
 * pp=2 and dp_lm_head=1, and Qwen3-MoE embed_rep=1 -> vllm.  And FSDP2
 * dim-0 shards, whose rows do not divide (16 over 6 ranks: 3,3,3,3,3,1;
 * 5 over 4 ranks: 2,2,1,0 with an empty last shard): hf -> fsdp=4 -> hf,
 * fsdp -> vllm tp=2 -> fsdp, HSDP fsdp=3,dp=2 -> megatron -> fsdp=6, and
 * the FP8 DeepSeek-V3 model fsdp=3 -> vllm tp=2,ep=2 -> fsdp=5,dp=2.  And
 * Megatron's virtual pipeline (vpp: model chunks interleaved over the pp
 * ranks): an 8-layer Qwen2 (tied) megatron tp=2,pp=2,vpp=2 -> vllm tp=2 and
 * tp=2,pp=2,dp=2,vpp=4 -> pp=4,vpp=2; the sparse Qwen3-MoE
 * megatron_grouped tp=2,pp=2,vpp=2,ep=2,etp=1 -> vllm tp=2,ep=2; a 4-layer
 * DeepSeek-V3 megatron tp=2,pp=2,dp=2,ep=4,etp=1,vpp=2 -> sglang tp=4,ep=2.
 * Each hop plans every destination rank against all ranks of the previous
 * layout.
 */
#include "ptest.h"

static void hop(const struct wex_model *m, const char *from, struct pt_rank *pr, uint32_t pw,
		const char *to, struct pt_rank **out, uint32_t *ow)
{
	struct wex_layout_spec ts;
	char err[512];
	uint32_t cw;

	CHECK(wex__layout_parse(to, &ts, err, sizeof(err)) == 0, "%s", err);
	CHECK(wex__layout_world(m, &ts, &cw, err, sizeof(err)) == 0, "%s: %s", to, err);
	struct pt_rank *cr = calloc(cw, sizeof(*cr));
	struct wex_plan_src *srcs = calloc(pw, sizeof(*srcs));
	CHECK(cr && srcs, "oom");
	for (uint32_t r = 0; r < pw; r++)
		srcs[r] = (struct wex_plan_src){ r, pr[r].pieces, pr[r].l.np };
	struct wex_planner *pl;
	CHECK(wex__planner_new(srcs, pw, &pl, err, sizeof(err)) == 0, "%s", err);
	struct pt_srcs ps = { pr, pw };
	for (uint32_t r = 0; r < cw; r++) {
		struct wex_plan *p;

		CHECK(pt_rank_make(m, &ts, r, 0, &cr[r], err, sizeof(err)) == 0, "%s", err);
		CHECK(wex__planner_plan(pl, cr[r].pieces, cr[r].l.np, r, cw, &p, err, sizeof(err)) == 0,
		      "%s -> %s rank %u: %s", from, to, r, err);
		pt_run(p, &ps, &cr[r]);
		wex__plan_free(p);
	}
	wex__planner_free(pl);
	free(srcs);
	*out = cr;
	*ow = cw;
}

/* hf -> lays[0] -> lays[1] -> ... -> hf (lays NULL-terminated). */
static void tripv(const char *cfg, const char *const *lays)
{
	struct wex_model *m;
	struct wex_layout_spec hs;
	struct pt_rank *h0 = calloc(1, sizeof(*h0)), *x = h0, *y, *h1;
	uint32_t nx = 1, ny, nh;
	const char *from = "hf";
	char err[512], path[512];
	size_t n = (size_t)snprintf(path, sizeof(path), "hf");

	CHECK(wex__model_from_text(cfg, NULL, &m, err, sizeof(err)) == 0, "%s", err);
	CHECK(wex__layout_parse("hf", &hs, err, sizeof(err)) == 0, "%s", err);
	CHECK(pt_rank_make(m, &hs, 0, 1, h0, err, sizeof(err)) == 0, "%s", err);
	/* Random bytes, not the pattern: the round trip must keep any data. */
	for (uint64_t i = 0; i < h0->size; i++)
		h0->buf[i] = (unsigned char)(pt_mix(i + 77) & 0xff);
	for (const char *const *l = lays; *l; l++) {
		hop(m, from, x, nx, *l, &y, &ny);
		if (x != h0) {
			for (uint32_t r = 0; r < nx; r++)
				pt_rank_free(&x[r]);
			free(x);
		}
		x = y;
		nx = ny;
		from = *l;
		n += (size_t)snprintf(path + n, n < sizeof(path) ? sizeof(path) - n : 0, " -> %s", *l);
	}
	hop(m, from, x, nx, "hf", &h1, &nh);
	CHECK(nh == 1 && h1->size == h0->size, "hf sizes differ");
	for (size_t i = 0; i < h0->l.nt; i++) {
		uint64_t off = h0->toff[i];

		CHECK(!memcmp(h0->buf + off, h1->buf + off, h0->l.t[i].nbytes),
		      "%s differs after %s -> hf", h0->l.t[i].name, path);
	}
	printf("%s -> hf: %zu tensors, %llu bytes identical\n", path, h0->l.nt,
	       (unsigned long long)h0->l.total_bytes);
	if (x != h0) {
		for (uint32_t r = 0; r < nx; r++)
			pt_rank_free(&x[r]);
		free(x);
	}
	pt_rank_free(h0);
	pt_rank_free(h1);
	free(h0);
	free(h1);
	wex__model_free(m);
}

static void trip(const char *cfg, const char *a, const char *b)
{
	const char *const lays[] = { a, b, NULL };

	tripv(cfg, lays);
}

int main(void)
{
#define QWEN2_5L "{\"model_type\":\"qwen2\",\"hidden_size\":16,\"num_hidden_layers\":5," \
	"\"num_attention_heads\":4,\"num_key_value_heads\":2,\"intermediate_size\":24," \
	"\"vocab_size\":203,\"tie_word_embeddings\":true,\"torch_dtype\":\"bfloat16\"}"
	trip(QWEN2_5L, "megatron:tp=2,pp=3,dp=2,first=1", "vllm:tp=4");
	/* Uneven pipeline splits: each engine's own, and stages=. */
	trip(QWEN2_5L, "vllm:tp=2,pp=3", "sglang:tp=2,pp=2,dp=2");
	trip(QWEN2_5L, "sglang:tp=2,pp=3,stages=1/3/1", "megatron:tp=2,pp=2,first=2");
	trip("{\"model_type\":\"qwen3_moe\",\"hidden_size\":16,\"num_hidden_layers\":2,"
	     "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"head_dim\":4,"
	     "\"intermediate_size\":24,\"moe_intermediate_size\":8,\"num_experts\":4,"
	     "\"vocab_size\":101,\"torch_dtype\":\"bfloat16\"}",
	     "megatron:tp=2,dp=2,ep=2,etp=2", "vllm:tp=2,ep=2");
	trip("{\"model_type\":\"qwen3_moe\",\"hidden_size\":16,\"num_hidden_layers\":4,"
	     "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"head_dim\":4,"
	     "\"intermediate_size\":24,\"moe_intermediate_size\":8,\"num_experts\":4,"
	     "\"decoder_sparse_step\":2,\"mlp_only_layers\":[0],"
	     "\"vocab_size\":101,\"torch_dtype\":\"bfloat16\"}",
	     "megatron:tp=2,pp=2,ep=2,etp=1", "vllm:tp=2");
	trip("{\"model_type\":\"deepseek_v3\",\"hidden_size\":16,\"num_hidden_layers\":3,"
	     "\"num_attention_heads\":4,\"intermediate_size\":24,\"moe_intermediate_size\":8,"
	     "\"n_routed_experts\":8,\"n_shared_experts\":1,\"first_k_dense_replace\":1,"
	     "\"q_lora_rank\":12,\"kv_lora_rank\":8,\"qk_nope_head_dim\":4,\"qk_rope_head_dim\":2,"
	     "\"v_head_dim\":4,\"vocab_size\":129,\"torch_dtype\":\"bfloat16\"}",
	     "megatron:tp=2,pp=2,dp=2,ep=4,etp=1,first=1", "sglang:tp=4,ep=2");
	trip("{\"model_type\":\"deepseek_v3\",\"hidden_size\":16,\"num_hidden_layers\":3,"
	     "\"num_attention_heads\":4,\"intermediate_size\":24,\"moe_intermediate_size\":8,"
	     "\"n_routed_experts\":8,\"n_shared_experts\":1,\"first_k_dense_replace\":1,"
	     "\"q_lora_rank\":12,\"kv_lora_rank\":8,\"qk_nope_head_dim\":4,\"qk_rope_head_dim\":2,"
	     "\"v_head_dim\":4,\"vocab_size\":129,\"torch_dtype\":\"bfloat16\"}",
	     "vllm:tp=2,pp=2,ep=2", "sglang:tp=2,pp=2,fuse_shared=1");
	/* FP8 (block 4x4): F8_E4M3 weights with their F32 scales. */
	trip("{\"model_type\":\"deepseek_v3\",\"hidden_size\":16,\"num_hidden_layers\":3,"
	     "\"num_attention_heads\":4,\"intermediate_size\":24,\"moe_intermediate_size\":8,"
	     "\"n_routed_experts\":8,\"n_shared_experts\":1,\"first_k_dense_replace\":1,"
	     "\"q_lora_rank\":12,\"kv_lora_rank\":8,\"qk_nope_head_dim\":4,\"qk_rope_head_dim\":2,"
	     "\"v_head_dim\":4,\"vocab_size\":129,\"torch_dtype\":\"bfloat16\","
	     "\"quantization_config\":{\"quant_method\":\"fp8\",\"weight_block_size\":[4,4]}}",
	     "vllm:tp=2,ep=2", "sglang:tp=2,fuse_shared=1");
#define QWEN2_MOE "{\"model_type\":\"qwen2_moe\",\"hidden_size\":16,\"num_hidden_layers\":3," \
	"\"num_attention_heads\":4,\"num_key_value_heads\":2,\"intermediate_size\":24," \
	"\"moe_intermediate_size\":8,\"shared_expert_intermediate_size\":12,\"num_experts\":4," \
	"\"mlp_only_layers\":[1],\"vocab_size\":101,\"torch_dtype\":\"bfloat16\"}"
	trip(QWEN2_MOE, "vllm:tp=2", "sglang:tp=2,ep=2");
	trip(QWEN2_MOE, "megatron:tp=2,pp=3,ep=2,etp=1", "vllm:tp=2,ep=2");
	/* FP8 (block 4x4) for the llama and moe families. */
	trip("{\"model_type\":\"qwen3\",\"hidden_size\":16,\"num_hidden_layers\":2,"
	     "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"head_dim\":4,"
	     "\"intermediate_size\":24,\"vocab_size\":101,\"torch_dtype\":\"bfloat16\","
	     "\"quantization_config\":{\"quant_method\":\"fp8\",\"weight_block_size\":[4,4]}}",
	     "vllm:tp=2", "sglang:tp=2");
	trip("{\"model_type\":\"qwen2_moe\",\"hidden_size\":16,\"num_hidden_layers\":3,"
	     "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"intermediate_size\":24,"
	     "\"moe_intermediate_size\":8,\"shared_expert_intermediate_size\":16,\"num_experts\":4,"
	     "\"mlp_only_layers\":[1],\"vocab_size\":101,\"torch_dtype\":\"bfloat16\","
	     "\"quantization_config\":{\"quant_method\":\"fp8\",\"weight_block_size\":[4,4]}}",
	     "vllm:tp=2,ep=2", "sglang:tp=2");
	/* SGLang's dp-attention: attention over tp/dp ranks, replicated dp
	 * times; experts, shared experts and lm_head over all tp ranks
	 * (dp_lm_head=1: lm_head over the attention group; dense_tp=1: the
	 * dense MLP whole), and KV heads replicated over the attention group. */
	trip("{\"model_type\":\"deepseek_v3\",\"hidden_size\":16,\"num_hidden_layers\":3,"
	     "\"num_attention_heads\":4,\"intermediate_size\":24,\"moe_intermediate_size\":8,"
	     "\"n_routed_experts\":8,\"n_shared_experts\":1,\"first_k_dense_replace\":1,"
	     "\"q_lora_rank\":12,\"kv_lora_rank\":8,\"qk_nope_head_dim\":4,\"qk_rope_head_dim\":2,"
	     "\"v_head_dim\":4,\"vocab_size\":129,\"torch_dtype\":\"bfloat16\"}",
	     "sglang:tp=4,dp=2,dp_attention=1,ep=2,dense_tp=1",
	     "sglang:tp=4,dp=4,dp_attention=1,pp=2,dp_lm_head=1,fuse_shared=1");
	trip("{\"model_type\":\"qwen3_moe\",\"hidden_size\":16,\"num_hidden_layers\":2,"
	     "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"head_dim\":4,"
	     "\"intermediate_size\":24,\"moe_intermediate_size\":8,\"num_experts\":4,"
	     "\"vocab_size\":101,\"torch_dtype\":\"bfloat16\"}",
	     "megatron:tp=2,dp=2,ep=2,etp=2", "sglang:tp=8,dp=2,dp_attention=1,ep=4,dp_lm_head=1");
	/* DeepEP (a2a=1: the shared experts whole on every rank, ep = tp)
	 * and the embedding whole under dp-attention (embed_rep=1), each on
	 * its own and together with pp and dp_lm_head; Qwen3-MoE embed_rep. */
	{
#define DSV3_3L "{\"model_type\":\"deepseek_v3\",\"hidden_size\":16,\"num_hidden_layers\":3," \
	"\"num_attention_heads\":4,\"intermediate_size\":24,\"moe_intermediate_size\":8," \
	"\"n_routed_experts\":8,\"n_shared_experts\":1,\"first_k_dense_replace\":1," \
	"\"q_lora_rank\":12,\"kv_lora_rank\":8,\"qk_nope_head_dim\":4,\"qk_rope_head_dim\":2," \
	"\"v_head_dim\":4,\"vocab_size\":129,\"torch_dtype\":\"bfloat16\"}"
		const char *const a[] = { "sglang:tp=4,dp=4,dp_attention=1,ep=4,a2a=1", "hf", NULL };
		const char *const b[] = { "sglang:tp=4,dp=4,dp_attention=1,embed_rep=1", "hf", NULL };

		tripv(DSV3_3L, a);
		tripv(DSV3_3L, b);
		trip(DSV3_3L, "sglang:tp=4,ep=4,a2a=1,dense_tp=1",
		     "sglang:tp=4,dp=2,dp_attention=1,pp=2,ep=4,a2a=1,embed_rep=1,dp_lm_head=1");
		trip("{\"model_type\":\"qwen3_moe\",\"hidden_size\":16,\"num_hidden_layers\":2,"
		     "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"head_dim\":4,"
		     "\"intermediate_size\":24,\"moe_intermediate_size\":8,\"num_experts\":4,"
		     "\"vocab_size\":101,\"torch_dtype\":\"bfloat16\"}",
		     "sglang:tp=8,dp=2,dp_attention=1,ep=4,embed_rep=1", "vllm:tp=2");
	}
	/* FSDP2 dim-0 shards (fsdp engine). */
	trip(QWEN2_5L, "fsdp:fsdp=4", "hf");
	{
		const char *const a[] = { "fsdp:fsdp=4", "vllm:tp=2", "fsdp:fsdp=4", NULL };
		const char *const b[] = { "fsdp:fsdp=3,dp=2", "megatron:tp=2,pp=3,first=1", "fsdp:fsdp=6",
					  NULL };

		tripv(QWEN2_5L, a);
		tripv(QWEN2_5L, b);
	}
	trip("{\"model_type\":\"llama\",\"hidden_size\":5,\"num_hidden_layers\":2,"
	     "\"num_attention_heads\":1,\"num_key_value_heads\":1,\"intermediate_size\":6,"
	     "\"vocab_size\":7,\"torch_dtype\":\"bfloat16\"}",
	     "fsdp:fsdp=4", "fsdp:fsdp=8,dp=2");
	{
		const char *const c[] = { "fsdp:fsdp=3", "vllm:tp=2,ep=2", "fsdp:fsdp=5,dp=2", NULL };

		tripv("{\"model_type\":\"deepseek_v3\",\"hidden_size\":16,\"num_hidden_layers\":3,"
		      "\"num_attention_heads\":4,\"intermediate_size\":24,\"moe_intermediate_size\":8,"
		      "\"n_routed_experts\":8,\"n_shared_experts\":1,\"first_k_dense_replace\":1,"
		      "\"q_lora_rank\":12,\"kv_lora_rank\":8,\"qk_nope_head_dim\":4,"
		      "\"qk_rope_head_dim\":2,\"v_head_dim\":4,\"vocab_size\":129,"
		      "\"torch_dtype\":\"bfloat16\",\"quantization_config\":{\"quant_method\":"
		      "\"fp8\",\"weight_block_size\":[4,4]}}",
		      c);
	}
	/* Megatron's virtual pipeline: V model chunks per pp rank, layers
	 * interleaved over the ranks (tied embeddings: the output layer's
	 * copy in the last chunk), chunk to chunk between two vpp sizes. */
#define QWEN2_8L "{\"model_type\":\"qwen2\",\"hidden_size\":16,\"num_hidden_layers\":8," \
	"\"num_attention_heads\":4,\"num_key_value_heads\":2,\"intermediate_size\":24," \
	"\"vocab_size\":203,\"tie_word_embeddings\":true,\"torch_dtype\":\"bfloat16\"}"
	trip(QWEN2_8L, "megatron:tp=2,pp=2,vpp=2", "vllm:tp=2");
	trip(QWEN2_8L, "megatron:tp=2,pp=2,dp=2,vpp=4", "megatron:pp=4,vpp=2");
	/* The three new layouts together: an FSDP2/HSDP trainer's dim-0 chunks
	 * to Megatron model chunks and back. */
	{
		const char *const v[] = { "fsdp:fsdp=3,dp=2", "megatron:tp=2,pp=2,vpp=2", "fsdp:fsdp=5",
					  NULL };

		tripv(QWEN2_8L, v);
	}
	trip("{\"model_type\":\"qwen3_moe\",\"hidden_size\":16,\"num_hidden_layers\":4,"
	     "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"head_dim\":4,"
	     "\"intermediate_size\":24,\"moe_intermediate_size\":8,\"num_experts\":4,"
	     "\"decoder_sparse_step\":2,\"mlp_only_layers\":[0],"
	     "\"vocab_size\":101,\"torch_dtype\":\"bfloat16\"}",
	     "megatron_grouped:tp=2,pp=2,vpp=2,ep=2,etp=1", "vllm:tp=2,ep=2");
	trip("{\"model_type\":\"deepseek_v3\",\"hidden_size\":16,\"num_hidden_layers\":4,"
	     "\"num_attention_heads\":4,\"intermediate_size\":24,\"moe_intermediate_size\":8,"
	     "\"n_routed_experts\":8,\"n_shared_experts\":1,\"first_k_dense_replace\":1,"
	     "\"q_lora_rank\":12,\"kv_lora_rank\":8,\"qk_nope_head_dim\":4,\"qk_rope_head_dim\":2,"
	     "\"v_head_dim\":4,\"vocab_size\":129,\"torch_dtype\":\"bfloat16\"}",
	     "megatron:tp=2,pp=2,dp=2,ep=4,etp=1,vpp=2", "sglang:tp=4,ep=2");
	return T_PASS;
}
