/* SPDX-License-Identifier: MIT */
/*
 * kat_o_bias.c - known answer: attention_bias gives o_proj a bias too.
 * In Hugging Face Llama and Qwen3 (and Qwen3-MoE) attention_bias puts a
 * bias on q, k, v and o; Qwen2 has q/k/v biases always and never an o
 * bias; Mistral and Mixtral configs have no attention_bias.  The o bias
 * (hidden = 8 elements) is row-parallel: whole on every tensor-parallel
 * rank (vLLM and SGLang o_proj.bias, Megatron linear_proj.bias).
 */
#include "kat_common.h"

#define CFG(TYPE, EXTRA)                                                                     \
	"{\"model_type\":\"" TYPE "\",\"hidden_size\":8,\"num_hidden_layers\":1,"             \
	"\"num_attention_heads\":4,\"num_key_value_heads\":2,\"intermediate_size\":8,"          \
	"\"vocab_size\":128,\"torch_dtype\":\"bfloat16\"" EXTRA "}"

static const char *const o_bias = "model.layers.0.self_attn.o_proj.bias";

static int has(const struct wex_rank_layout *l, const char *name)
{
	for (size_t i = 0; i < l->nt; i++)
		if (!strcmp(l->t[i].name, name))
			return 1;
	return 0;
}

/* On `lay` rank `rank`, `name` holds the whole o bias, or is absent. */
static void check(const char *cfg, const char *lay, uint32_t rank, const char *name, int want)
{
	struct wex_model *m = kat_model(cfg);
	struct wex_rank_layout l;

	kat_rank(m, lay, rank, &l);
	CHECK(has(&l, name) == want, "%s rank %u: %s %s", lay, rank, name,
	      want ? "missing" : "present though the model has no o bias");
	if (want) {
		const struct wex_layout_tensor *t = kat_find(&l, name);

		CHECK(t->ndim == 1 && t->shape[0] == 8, "%s: shape [%llu]", name,
		      (unsigned long long)t->shape[0]);
		kat_piece(&l, t, 0, o_bias, 0, 8, 0);
	}
	wex__rank_layout_free(&l);
	wex__model_free(m);
}

int main(void)
{
	const char *llama_b = CFG("llama", ",\"attention_bias\":true");
	const char *qwen3_b = CFG("qwen3", ",\"attention_bias\":true,\"head_dim\":2");

	check(llama_b, "hf", 0, o_bias, 1);
	check(llama_b, "vllm:tp=2", 1, o_bias, 1);
	check(llama_b, "sglang:tp=2", 0, o_bias, 1);
	check(llama_b, "megatron:tp=2", 1, "decoder.layers.0.self_attention.linear_proj.bias", 1);
	check(qwen3_b, "vllm:tp=2", 0, o_bias, 1);
	check(CFG("llama", ",\"attention_bias\":false"), "hf", 0, o_bias, 0);
	check(CFG("mistral", ""), "hf", 0, o_bias, 0);
	/* Qwen2: q/k/v biases, no o bias. */
	check(CFG("qwen2", ""), "hf", 0, o_bias, 0);
	{
		struct wex_model *m = kat_model(CFG("qwen2", ""));
		struct wex_rank_layout l;

		kat_rank(m, "hf", 0, &l);
		CHECK(has(&l, "model.layers.0.self_attn.q_proj.bias"), "qwen2 lost its q bias");
		wex__rank_layout_free(&l);
		wex__model_free(m);
	}
	printf("o_proj bias follows attention_bias in every engine\n");
	return T_PASS;
}
