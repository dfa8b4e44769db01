/* SPDX-License-Identifier: MIT */
/*
 * kat_fp8_blocks.c - known answers for FP8 block-quantized checkpoints
 * (DeepSeek-V3's quantization_config: quant_method fp8, fmt e4m3,
 * weight_block_size; here [4, 4] on a small model, worked out by hand):
 *  - safetensors writes and reads F8_E4M3, F8_E5M2 and F8_E8M0 as 1-byte
 *    types;
 *  - the deepseek_v3 family makes every Linear weight F8_E4M3 (fmt e5m2:
 *    F8_E5M2) followed by its F32 weight_scale_inv of ceil(rows/4) x
 *    ceil(cols/4); norms, embeddings, lm_head and the router stay BF16;
 *  - vLLM tp=2 rank 1: kv_b_proj (32 rows, split 16/16) carries scale rows
 *    [4, 8) of 8; w13_weight_scale_inv stacks per expert [gate block 1;
 *    up block 1] (8 rows per expert split over etp=2 -> 4 rows = 1 block);
 *  - a shard that cuts a block (vllm tp=4: q_b's 24 rows in 6) is refused
 *    naming the scales and the blocks; an engine with no FP8 layout
 *    (megatron) is refused naming the tensor (the llama and moe families'
 *    FP8 models: kat_fp8_qwen.c);
 *  - a fused part that ends inside a block short of the last part
 *    (q_lora_rank 10: q_a's 10 rows, then kv_a, in fused_qkv_a_proj) is
 *    refused naming the part: vLLM places kv_a's scales at row ceil(10/4)
 *    = 3 of ceil(20/4) = 5, not after q_a's 3 rows, and refuses such a
 *    model (validate_fp8_block_shape); a shard error names the layer it
 *    is at (the first MoE layer, 1), not layer 0;
 *  - activation_scheme static (per-tensor input_scale tensors the families
 *    do not describe, and vLLM refuses with block scales) is refused
 *    naming the key; dynamic is accepted.
 * roundtrip.c carries the same model hf -> vllm -> sglang (fused shared
 * expert) -> hf byte for byte.
 */
#include <unistd.h>

#include "kat_common.h"
#include "safetensors.h"

#define DSV3(FMT) "{\"model_type\":\"deepseek_v3\",\"hidden_size\":16,\"num_hidden_layers\":2," \
	"\"num_attention_heads\":4,\"intermediate_size\":24,\"moe_intermediate_size\":8," \
	"\"n_routed_experts\":4,\"n_shared_experts\":1,\"first_k_dense_replace\":1," \
	"\"q_lora_rank\":12,\"kv_lora_rank\":8,\"qk_nope_head_dim\":4,\"qk_rope_head_dim\":2," \
	"\"v_head_dim\":4,\"vocab_size\":64,\"torch_dtype\":\"bfloat16\"," \
	"\"quantization_config\":{\"quant_method\":\"fp8\"," FMT "\"weight_block_size\":[4,4]}}"

static int has(const struct wex_rank_layout *l, const char *name)
{
	for (size_t i = 0; i < l->np; i++)
		if (!strcmp(l->p[i].name, name))
			return 1;
	return 0;
}

static void st_types(void)
{
	char path[] = "/tmp/wex-fp8-XXXXXX", err[256];
	unsigned char bytes[3][4] = { { 1, 2, 3, 4 }, { 5, 6, 7, 8 }, { 9, 10, 11, 12 } };
	static const char *const names[] = { "F8_E4M3", "F8_E5M2", "F8_E8M0" };
	struct wex_st_tensor t[3];
	struct wex_st_file f;
	int fd = mkstemp(path);

	CHECK(fd >= 0, "mkstemp");
	close(fd);
	memset(t, 0, sizeof(t));
	for (int i = 0; i < 3; i++) {
		snprintf(t[i].name, sizeof(t[i].name), "t%d", i);
		t[i].dtype = wex_dtype_from_name(names[i]);
		CHECK(t[i].dtype && wex_dtype_size(t[i].dtype) == 1, "%s is not a 1-byte type", names[i]);
		t[i].ndim = 2;
		t[i].shape[0] = t[i].shape[1] = 2;
		t[i].data = bytes[i];
	}
	CHECK(wex__st_write(path, t, 3, err, sizeof(err)) == 0, "%s", err);
	CHECK(wex__st_open(path, &f, err, sizeof(err)) == 0, "%s", err);
	for (int i = 0; i < 3; i++) {
		const struct wex_st_tensor *x = wex__st_find(&f, t[i].name);

		CHECK(x && x->dtype == t[i].dtype && !strcmp(wex_dtype_name(x->dtype), names[i]) &&
		      !memcmp(x->data, bytes[i], 4), "%s did not read back", names[i]);
	}
	wex__st_close(&f);
	unlink(path);
}

int main(void)
{
	struct wex_model *m;
	struct wex_rank_layout l;
	const struct wex_layout_tensor *t;
	char err[256] = "";

	st_types();

	m = kat_model(DSV3("\"fmt\":\"e4m3\","));
	kat_rank(m, "hf", 0, &l);
	kat_canon(&l, "model.layers.0.self_attn.q_a_proj.weight", WEX_DT_F8_E4M3, 12, 16);
	kat_canon(&l, "model.layers.0.self_attn.q_a_proj.weight_scale_inv", WEX_DT_F32, 3, 4);
	kat_canon(&l, "model.layers.0.self_attn.kv_a_proj_with_mqa.weight_scale_inv", WEX_DT_F32, 3, 4);
	kat_canon(&l, "model.layers.0.mlp.gate_proj.weight_scale_inv", WEX_DT_F32, 6, 4);
	kat_canon(&l, "model.layers.1.mlp.experts.3.down_proj.weight", WEX_DT_F8_E4M3, 16, 8);
	kat_canon(&l, "model.layers.1.mlp.experts.3.down_proj.weight_scale_inv", WEX_DT_F32, 4, 2);
	kat_canon(&l, "model.layers.1.mlp.shared_experts.up_proj.weight_scale_inv", WEX_DT_F32, 2, 4);
	kat_canon(&l, "model.layers.1.mlp.gate.weight", WEX_DT_BF16, 4, 16);
	kat_canon(&l, "model.embed_tokens.weight", WEX_DT_BF16, 64, 16);
	kat_canon(&l, "lm_head.weight", WEX_DT_BF16, 64, 16);
	CHECK(!has(&l, "model.layers.1.mlp.gate.weight_scale_inv") &&
	      !has(&l, "lm_head.weight_scale_inv") && !has(&l, "model.embed_tokens.weight_scale_inv"),
	      "an unquantized tensor got scales");
	wex__rank_layout_free(&l);

	kat_rank(m, "vllm:tp=2", 1, &l);
	t = kat_find(&l, "model.layers.0.self_attn.kv_b_proj.weight");
	CHECK(t->dtype == WEX_DT_F8_E4M3 && t->shape[0] == 16, "vllm kv_b_proj");
	t = kat_find(&l, "model.layers.0.self_attn.kv_b_proj.weight_scale_inv");
	CHECK(t->dtype == WEX_DT_F32 && t->ndim == 2 && t->shape[0] == 4 && t->shape[1] == 2,
	      "kv_b_proj.weight_scale_inv shape");
	kat_piece(&l, t, 0, "model.layers.0.self_attn.kv_b_proj.weight_scale_inv", 4, 4, 0);
	t = kat_find(&l, "model.layers.1.mlp.experts.w13_weight_scale_inv");
	CHECK(t->ndim == 3 && t->shape[0] == 4 && t->shape[1] == 2 && t->shape[2] == 4,
	      "w13_weight_scale_inv is %llux%llux%llu, wanted 4x2x4", (unsigned long long)t->shape[0],
	      (unsigned long long)t->shape[1], (unsigned long long)t->shape[2]);
	for (int k = 0; k < 2; k++) {
		const struct wex_tensor *p = &l.p[t->first + (size_t)k];

		CHECK(!strcmp(p->name, k ? "model.layers.1.mlp.experts.0.up_proj.weight_scale_inv"
					  : "model.layers.1.mlp.experts.0.gate_proj.weight_scale_inv") &&
		      p->start[0] == 1 && p->extent[0] == 1 && p->offset == (uint64_t)k * 4 * 4,
		      "w13_weight_scale_inv piece %d: %s rows [%llu,+%llu) at byte %llu", k, p->name,
		      (unsigned long long)p->start[0], (unsigned long long)p->extent[0],
		      (unsigned long long)p->offset);
	}
	t = kat_find(&l, "model.layers.0.self_attn.fused_qkv_a_proj.weight_scale_inv");
	CHECK(t->shape[0] == 3 + 3 && t->shape[1] == 4, "fused_qkv_a_proj scales: q_a's 3 rows, kv_a's 3");
	wex__rank_layout_free(&l);

	kat_refused(m, "vllm:tp=4", "_scale_inv", "blocks");
	kat_refused(m, "megatron:tp=1", "linear_q_down_proj.weight_scale_inv", "FP8 block scales");
	wex__model_free(m);

	m = kat_model("{\"model_type\":\"deepseek_v3\",\"hidden_size\":16,\"num_hidden_layers\":2,"
		      "\"num_attention_heads\":4,\"intermediate_size\":24,\"moe_intermediate_size\":8,"
		      "\"n_routed_experts\":4,\"n_shared_experts\":1,\"first_k_dense_replace\":1,"
		      "\"q_lora_rank\":10,\"kv_lora_rank\":8,\"qk_nope_head_dim\":4,"
		      "\"qk_rope_head_dim\":2,\"v_head_dim\":4,\"vocab_size\":64,"
		      "\"quantization_config\":{\"quant_method\":\"fp8\",\"weight_block_size\":[4,4]}}");
	kat_refused(m, "vllm:tp=1", "fused_qkv_a_proj.weight: its part model.layers.0.self_attn.q_a_proj.weight",
		"multiple of 4 rows");
	kat_refused(m, "sglang:tp=1", "fused_qkv_a_proj_with_mqa.weight: its part", "q_a_proj");
	wex__model_free(m);

	/* moe_intermediate_size 8 over etp=4: 2 rows of a 4-row block, at layer 1. */
	m = kat_model(DSV3(""));
	kat_refused(m, "vllm:tp=2,dp=2", "model.layers.1.mlp.experts.0.gate_proj.weight",
		"model.layers.1.mlp.experts.0.gate_proj.weight_scale_inv");
	wex__model_free(m);

	/* activation_scheme static: input_scale tensors, not described. */
	m = NULL;
	CHECK(wex__model_from_text(DSV3("\"activation_scheme\":\"static\","), NULL, &m, err,
				   sizeof(err)) < 0 && strstr(err, "activation_scheme"),
	      "activation_scheme static accepted: %s", err);
	m = kat_model(DSV3("\"activation_scheme\":\"dynamic\","));
	wex__model_free(m);

	m = kat_model(DSV3("\"fmt\":\"e5m2\","));
	kat_rank(m, "hf", 0, &l);
	kat_canon(&l, "model.layers.0.self_attn.o_proj.weight", WEX_DT_F8_E5M2, 16, 16);
	wex__rank_layout_free(&l);
	wex__model_free(m);

	return T_PASS;
}
