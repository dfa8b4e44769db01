/* SPDX-License-Identifier: MIT */
/*
 * bad_layout.c - proves layouts that cannot exist are refused with
 * -WEX_ELAYOUT and a message naming the number that does not fit, using the
 * real Qwen2-0.5B config (14 heads, 2 KV heads, 24 layers): vLLM tp=4 (14
 * heads), Megatron tp=4 (2 query groups), pp=5 (24 layers), uneven stages
 * that do not divide evenly, ep on a dense model, SGLang's dp-attention
 * (described for its MoE models only), SGLang's DeepEP layout (a2a:
 * DeepSeek only, ep = tp, no fuse_shared; on DeepSeek-V3's own config) and
 * replicated embedding (embed_rep: under dp_attention only), Megatron's virtual pipeline (24
 * layers in pp*vpp = 16 chunks, vpp without pp, a first/last stage whose
 * layers do not divide into vpp chunks,
 * vpp on vLLM); that tp, pp, dp, fsdp or vpp of 0 is refused when the spec is
 * read; and that unknown engines,
 * unknown parameters and configs of unknown families are refused; and that
 * config values that are not sizes (4.9 heads, negative, a string, past
 * 2^40, a tensor past 2^48 bytes, expressions that overflow) are refused
 * naming the key or the tensor, never truncated or left to wrap; that 0
 * heads is named as the reason head_dim cannot be derived; that the fsdp
 * engine (FSDP2) refuses the keys it does not take (tp, pp, ep, etp,
 * stages), and engines other than fsdp refuse fsdp=; that layer
 * or expert counts giving millions of tensors are refused at load; and that
 * checkpoints of a family's model_type whose tensors it does not describe
 * (AWQ and other non-fp8 quantization, Llama's mlp_bias, a reward head or
 * EAGLE draft architecture, DeepSeek's moe_layer_freq 2) are refused by name.
 */
#include <errno.h>

#include "ptest.h"

static struct wex_model *m;

static void bad(const char *lay, const char *needle)
{
	struct wex_layout_spec s;
	uint32_t w;
	char err[512] = "";
	int ret;

	CHECK(wex__layout_parse(lay, &s, err, sizeof(err)) == 0, "%s", err);
	ret = wex__layout_world(m, &s, &w, err, sizeof(err));
	CHECK(ret == -WEX_ELAYOUT, "%s: got %d (%s)", lay, ret, err);
	CHECK(strstr(err, needle) != NULL, "%s: message \"%s\" lacks \"%s\"", lay, err, needle);
	printf("%-40s %s\n", lay, err);
}

/* A small llama config with the members in `extra` (hidden_size and
 * vocab_size get defaults unless extra names them) must be refused with a
 * message containing needle. */
static void bad_cfg(const char *extra, const char *needle)
{
	char cfg[512], err[512] = "";
	struct wex_model *mm = NULL;
	int ret;

	snprintf(cfg, sizeof(cfg), "{\"model_type\":\"llama\",%s,\"num_hidden_layers\":1,"
		 "\"num_key_value_heads\":4,\"intermediate_size\":8%s%s}", extra,
		 strstr(extra, "hidden_size") ? "" : ",\"hidden_size\":8",
		 strstr(extra, "vocab_size") ? "" : ",\"vocab_size\":64");
	ret = wex__model_from_text(cfg, NULL, &mm, err, sizeof(err));
	CHECK(ret < 0, "%s accepted", extra);
	CHECK(strstr(err, needle) != NULL, "%s: message \"%s\" lacks \"%s\"", extra, err, needle);
	printf("%-40.40s %s\n", extra, err);
}

int main(void)
{
	const char *src = getenv("WEX_SRC");
	char path[600], err[512];
	struct wex_layout_spec s;
	uint32_t w;

	snprintf(path, sizeof(path), "%s/tests/data/qwen2-0.5b-config.json", src ? src : "..");
	CHECK(wex__model_load(path, NULL, &m, err, sizeof(err)) == 0, "%s", err);
	bad("vllm:tp=4", "num_attention_heads 14");
	bad("megatron:tp=4", "num_key_value_heads (query groups) 2");
	bad("megatron:pp=5", "24 layers");
	bad("megatron:pp=4,first=7,last=6", "11 layers");
	bad("vllm:tp=2,ep=2", "2");
	bad("sglang:tp=8", "14");
	/* SGLang's Qwen2 attention is split over all tp ranks: its
	 * dp-attention layout is not described. */
	bad("sglang:tp=2,dp=2,dp_attention=1", "for model types deepseek_v3 deepseek_v2 qwen3_moe "
		"qwen2_moe qwen3 only, not qwen2");
	/* SGLang's DeepEP layout (a2a) is checked for DeepSeek only, the
	 * replicated embedding (embed_rep) for the dp-attention models and
	 * only under dp-attention; other engines have neither. */
	bad("sglang:tp=2,ep=2,a2a=1", "a2a=1 is described for model types deepseek_v3 deepseek_v2 "
		"only, not qwen2");
	bad("sglang:tp=2,dp=2,dp_attention=1,embed_rep=1", "for model types deepseek_v3 deepseek_v2 "
		"qwen3_moe qwen2_moe qwen3 only, not qwen2");
	bad("sglang:tp=2,embed_rep=1", "embed_rep=1");
	bad("vllm:tp=2,a2a=1", "engine vllm has no parameter a2a");
	bad("megatron:tp=2,a2a=1", "engine megatron has no parameter a2a");
	bad("vllm:tp=2,embed_rep=1", "engine vllm has no parameter embed_rep");
	bad("hf:embed_rep=1", "engine hf has no parameter embed_rep");
	{
		struct wex_model *qwen2 = m;

		snprintf(path, sizeof(path), "%s/tests/data/deepseek-v3-config.json", src ? src : "..");
		CHECK(wex__model_load(path, NULL, &m, err, sizeof(err)) == 0, "%s", err);
		bad("sglang:tp=32,dp=32,dp_attention=1,ep=32,a2a=1,fuse_shared=1",
		    "fuse_shared=1 with a2a=1");
		bad("sglang:tp=32,dp=32,dp_attention=1,a2a=1", "a2a=1 with ep=1");
		bad("sglang:tp=32,ep=8,a2a=1", "write ep=32");
		bad("sglang:tp=32,ep=32,embed_rep=1", "it needs dp_attention=1");
		bad("sglang:tp=32,dp=32,dp_attention=1,ep=32,a2a=2", "a2a is 0 or 1, not 2");
		bad("sglang:tp=32,dp=32,dp_attention=1,embed_rep=3", "embed_rep is 0 or 1, not 3");
		CHECK(wex__layout_parse("sglang:tp=32,dp=32,dp_attention=1,ep=32,a2a=1,embed_rep=1", &s,
					err, sizeof(err)) == 0, "%s", err);
		CHECK(wex__layout_world(m, &s, &w, err, sizeof(err)) == 0 && w == 32, "%s", err);
		wex__model_free(m);
		m = qwen2;
	}
	/* FSDP2 shards whole canonical tensors along dim 0 only. */
	bad("fsdp:tp=2", "engine fsdp has no parameter tp");
	bad("fsdp:pp=2", "engine fsdp has no parameter pp");
	bad("fsdp:fsdp=2,ep=2", "engine fsdp has no parameter ep");
	bad("fsdp:etp=2", "engine fsdp has no parameter etp");
	/* A parallel size of 0 is refused when the spec is read (wexctl's
	 * exit 2, with the spec's other slips), not when it is planned. */
	for (const char *const *z = (const char *const[]){ "fsdp:fsdp=0", "vllm:tp=0",
							   "vllm:pp=0", "vllm:tp=2,dp=0",
							   "megatron:pp=2,vpp=0", NULL };
	     *z; z++)
		CHECK(wex__layout_parse(*z, &s, err, sizeof(err)) == -EINVAL &&
			      strstr(err, "must be at least 1") && strstr(err, *z),
		      "%s: %s", *z, err);
	bad("vllm:tp=2,fsdp=2", "engine vllm has no parameter fsdp");
	bad("hf:fsdp=2", "engine hf has no parameter fsdp");
	bad("fsdp:fsdp=8192,dp=4096", "too many ranks");
	CHECK(wex__layout_parse("fsdp:fsdp=4,stages=12/12", &s, err, sizeof(err)) == 0, "%s", err);
	CHECK(wex__layout_world(m, &s, &w, err, sizeof(err)) == -WEX_ELAYOUT &&
		      strstr(err, "engine fsdp has no parameter stages"),
	      "fsdp with stages=: %s", err);
	/* Qwen2-0.5B's 14 heads, 2 KV heads and 24 layers do not matter to
	 * dim-0 chunks. */
	CHECK(wex__layout_parse("fsdp:fsdp=7,dp=3", &s, err, sizeof(err)) == 0, "%s", err);
	CHECK(wex__layout_world(m, &s, &w, err, sizeof(err)) == 0 && w == 21, "%s", err);
	/* Megatron's virtual pipeline: pp*vpp chunks of equal size, pp > 1,
	 * first/last stages of layers that divide into vpp chunks; Megatron
	 * engines only. */
	bad("megatron:tp=2,pp=4,vpp=4", "the 24 layers do not divide into pp*vpp = 4*4 = 16");
	bad("megatron_grouped:tp=2,pp=5,vpp=2", "24 layers");
	bad("megatron:tp=2,vpp=2", "vpp=2 needs pp > 1 (pp=1)");
	bad("megatron:tp=2,pp=4,vpp=2,first=3,last=5", "vpp=2 with first=3, last=5: pipeline stage 0 holds 3 layers");
	bad("vllm:tp=2,pp=2,vpp=2", "engine vllm has no parameter vpp");
	/* And good ones pass. */
	CHECK(wex__layout_parse("vllm:tp=14", &s, err, sizeof(err)) == 0, "%s", err);
	CHECK(wex__layout_world(m, &s, &w, err, sizeof(err)) == -WEX_ELAYOUT, "tp=14: vocab 151936 padded to 64 is not a multiple of 14");
	CHECK(wex__layout_parse("megatron:tp=2,pp=4,dp=2,first=3,last=3", &s, err, sizeof(err)) == 0, "%s", err);
	CHECK(wex__layout_world(m, &s, &w, err, sizeof(err)) == 0 && w == 16, "%s", err);
	CHECK(wex__layout_parse("megatron:tp=2,pp=4,dp=2,vpp=3", &s, err, sizeof(err)) == 0, "%s", err);
	CHECK(wex__layout_world(m, &s, &w, err, sizeof(err)) == 0 && w == 16, "vpp=3: %s", err);
	CHECK(wex__layout_parse("vllm:tp=7", &s, err, sizeof(err)) == 0, "%s", err);
	CHECK(wex__layout_world(m, &s, &w, err, sizeof(err)) == -WEX_ELAYOUT, "vllm tp=7 accepted (2 KV heads)");
	/* Not layouts at all. */
	CHECK(wex__layout_parse("nosuch:tp=2", &s, err, sizeof(err)) == 0, "%s", err);
	CHECK(wex__layout_world(m, &s, &w, err, sizeof(err)) == -ENOENT, "unknown engine accepted");
	CHECK(wex__layout_parse("vllm:tq=2", &s, err, sizeof(err)) == -EINVAL, "unknown key accepted");
	CHECK(wex__layout_parse("vllm:tp=x", &s, err, sizeof(err)) == -EINVAL, "bad value accepted");
	wex__model_free(m);
	CHECK(wex__model_from_text("{\"model_type\":\"gpt2\"}", NULL, &m, err, sizeof(err)) == -EINVAL,
	      "unknown family accepted");
	printf("unknown family: %s\n", err);
	CHECK(wex__model_from_text("{\"model_type\":\"llama\"}", NULL, &m, err, sizeof(err)) == -EINVAL,
	      "config without sizes accepted");
	printf("incomplete config: %s\n", err);
	/* Config values that are not sizes: refused naming the key, never
	 * truncated or left to overflow. */
	bad_cfg("\"num_attention_heads\":4.9", "num_attention_heads is 4.9");
	bad_cfg("\"num_attention_heads\":-4", "num_attention_heads is -4");
	bad_cfg("\"num_attention_heads\":\"4\"", "num_attention_heads is \"4\"");
	bad_cfg("\"num_attention_heads\":2199023255553", "num_attention_heads is 2199023255553");
	bad_cfg("\"num_attention_heads\":4,\"vocab_size\":4294967296,\"hidden_size\":2147483648",
		"larger than 2^48 bytes");
	bad_cfg("\"num_attention_heads\":1099511627776,\"head_dim\":1099511627776",
		"overflow");
	/* head_dim defaults to hidden/nh: with 0 heads, say so (the config
	 * does not lack head_dim as much as it has no heads). */
	bad_cfg("\"num_attention_heads\":0", "default hidden/nh divides by zero");
	/* Checkpoints the families do not describe, though their model_type
	 * is one of theirs: refused naming what is not described, never
	 * planned as plain BF16 tensors under the family's names (the plan
	 * succeeded, leaving the engine's qweight/scales, gate_up_proj.bias,
	 * score.* unwritten and naming an lm_head it lacks). */
	bad_cfg("\"num_attention_heads\":4,\"quantization_config\":{\"quant_method\":\"awq\","
		"\"bits\":4,\"group_size\":128}", "quant_method \"awq\" is not supported");
	bad_cfg("\"num_attention_heads\":4,\"quantization_config\":{\"quant_method\":"
		"\"compressed-tensors\"}", "quant_method \"compressed-tensors\"");
	bad_cfg("\"num_attention_heads\":4,\"quantization_config\":{\"bits\":4}",
		"quant_method (none)");
	bad_cfg("\"num_attention_heads\":4,\"mlp_bias\":true", "mlp_bias is true");
	bad_cfg("\"num_attention_heads\":4,\"architectures\":[\"Qwen2ForRewardModel\"]",
		"architectures lists \"Qwen2ForRewardModel\"");
	bad_cfg("\"num_attention_heads\":4,\"architectures\":[\"LlamaForCausalLMEagle3\"]",
		"LlamaForCausalLMEagle3");
	CHECK(wex__model_from_text("{\"model_type\":\"deepseek_v2\",\"architectures\":"
				   "[\"DeepseekV2ForCausalLM\"],\"hidden_size\":64,\"num_hidden_layers\":4,"
				   "\"num_attention_heads\":4,\"intermediate_size\":64,"
				   "\"moe_intermediate_size\":16,\"n_routed_experts\":4,"
				   "\"first_k_dense_replace\":1,\"moe_layer_freq\":2,\"kv_lora_rank\":16,"
				   "\"qk_nope_head_dim\":8,\"qk_rope_head_dim\":8,\"v_head_dim\":8,"
				   "\"vocab_size\":64}", NULL, &m, err, sizeof(err)) == -EINVAL,
	      "DeepSeek moe_layer_freq 2 accepted");
	CHECK(strstr(err, "moe_layer_freq is not 1") != NULL, "%s", err);
	printf("moe_layer_freq 2: %s\n", err);
	/* ... while a causal LM with those keys off (null, false) loads. */
	CHECK(wex__model_from_text("{\"model_type\":\"llama\",\"architectures\":"
				   "[\"LlamaForCausalLM\"],\"num_attention_heads\":4,\"mlp_bias\":false,"
				   "\"quantization_config\":null,\"hidden_size\":8,\"num_hidden_layers\":1,"
				   "\"intermediate_size\":8,\"vocab_size\":64}",
				   NULL, &m, err, sizeof(err)) == 0,
	      "a plain LlamaForCausalLM refused: %s", err);
	wex__model_free(m);
	/* Layer and expert counts no model has (each tensor small, the model
	 * millions of them): refused at load, not left to exhaust memory when
	 * every tensor is laid out. */
	CHECK(wex__model_from_text("{\"model_type\":\"llama\",\"num_attention_heads\":4,"
				   "\"hidden_size\":8,\"num_hidden_layers\":50000000,"
				   "\"intermediate_size\":8,\"vocab_size\":64}",
				   NULL, &m, err, sizeof(err)) == -EINVAL,
	      "50,000,000 layers accepted");
	CHECK(strstr(err, "50000000 layers") && strstr(err, "not a model's"), "%s", err);
	printf("50,000,000 layers: %s\n", err);
	CHECK(wex__model_from_text("{\"model_type\":\"qwen3_moe\",\"num_attention_heads\":4,"
				   "\"hidden_size\":8,\"num_hidden_layers\":2,\"num_experts\":1099511627776,"
				   "\"moe_intermediate_size\":8,\"vocab_size\":64}",
				   NULL, &m, err, sizeof(err)) == -EINVAL,
	      "2^40 experts accepted");
	CHECK(strstr(err, "1099511627776 experts") && strstr(err, "not a model's"), "%s", err);
	printf("2^40 experts: %s\n", err);
	/* 4.0 is a whole number. */
	CHECK(wex__model_from_text("{\"model_type\":\"llama\",\"num_attention_heads\":4.0,"
				   "\"hidden_size\":8,\"num_hidden_layers\":1,\"num_key_value_heads\":4,"
				   "\"intermediate_size\":8,\"vocab_size\":64}",
				   NULL, &m, err, sizeof(err)) == 0,
	      "4.0 heads refused: %s", err);
	wex__model_free(m);
	return T_PASS;
}
