/* SPDX-License-Identifier: MIT */
/*
 * kat_kv_replication.c - known answer: vLLM's qkv_proj is [Q; K; V] per
 * rank, and with more ranks than KV heads each KV head is replicated over
 * tp/nkv consecutive ranks.  4 heads, 2 KV heads, head_dim 2, tp=4 (by
 * hand): rank r holds q head r (q_proj rows 2r..2r+1) at rows 0-1, and
 * k/v head r/2 (rows 2*(r/2)..+1) at rows 2-3 and 4-5.  tp=2: rank 1 holds
 * q heads 2,3 (rows 4-7) and kv head 1.  tp=3 fails naming the 4 heads.
 */
#include "kat_common.h"

#define CFG "{\"model_type\":\"llama\",\"hidden_size\":8,\"num_hidden_layers\":1," \
	    "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"intermediate_size\":8," \
	    "\"vocab_size\":192,\"torch_dtype\":\"float32\"}"

int main(void)
{
	struct wex_model *m = kat_model(CFG);
	const char *q = "model.layers.0.self_attn.q_proj.weight";
	const char *k = "model.layers.0.self_attn.k_proj.weight";
	const char *v = "model.layers.0.self_attn.v_proj.weight";

	for (uint32_t r = 0; r < 4; r++) {
		struct wex_rank_layout l;
		const struct wex_layout_tensor *t;

		kat_rank(m, "vllm:tp=4", r, &l);
		t = kat_find(&l, "model.layers.0.self_attn.qkv_proj.weight");
		CHECK(t->shape[0] == 6 && t->shape[1] == 8 && t->npieces == 3, "rank %u shape", r);
		kat_piece(&l, t, 0, q, 2 * r, 2, 0);
		kat_piece(&l, t, 1, k, 2 * (r / 2), 2, 2);
		kat_piece(&l, t, 2, v, 2 * (r / 2), 2, 4);
		wex__rank_layout_free(&l);
	}
	{
		struct wex_rank_layout l;
		const struct wex_layout_tensor *t;

		kat_rank(m, "vllm:tp=2", 1, &l);
		t = kat_find(&l, "model.layers.0.self_attn.qkv_proj.weight");
		kat_piece(&l, t, 0, q, 4, 4, 0);
		kat_piece(&l, t, 1, k, 2, 2, 4);
		kat_piece(&l, t, 2, v, 2, 2, 6);
		wex__rank_layout_free(&l);
	}
	/* tp=3 cannot replicate 2 KV heads evenly (nor split 4 heads). */
	{
		struct wex_layout_spec s;
		uint32_t w;
		char err[256];

		CHECK(wex__layout_parse("vllm:tp=3", &s, err, sizeof(err)) == 0, "%s", err);
		CHECK(wex__layout_world(m, &s, &w, err, sizeof(err)) == -WEX_ELAYOUT, "tp=3 accepted");
		CHECK(strstr(err, "num_attention_heads 4") != NULL, "error does not name the heads: %s", err);
		printf("tp=3: %s\n", err);
	}
	wex__model_free(m);
	printf("vllm KV-head replication matches the hand-worked layout\n");
	return T_PASS;
}
