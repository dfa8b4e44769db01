/* SPDX-License-Identifier: MIT */
/*
 * kat_qkv_interleave.c - known answer: Megatron's linear_qkv holds, per
 * query group, [the group's query heads; its key head; its value head].
 * With 4 heads, 2 KV heads, head_dim 2 (worked out by hand):
 *   tp=1: rows 0-3 q heads 0,1 | 4-5 k head 0 | 6-7 v head 0 |
 *         8-11 q heads 2,3 | 12-13 k head 1 | 14-15 v head 1
 *   tp=2, rank 1: rows 0-3 q heads 2,3 (q_proj rows 4-7) | 4-5 k head 1 |
 *         6-7 v head 1; the bias follows the same order.
 * Then moves real bytes hf -> megatron tp=1 and checks row 8 of linear_qkv
 * equals row 4 of q_proj.
 */
#include "kat_common.h"

#define CFG "{\"model_type\":\"qwen2\",\"hidden_size\":8,\"num_hidden_layers\":1," \
	    "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"intermediate_size\":8," \
	    "\"vocab_size\":16,\"torch_dtype\":\"float32\"}"

int main(void)
{
	struct wex_model *m = kat_model(CFG);
	struct wex_rank_layout l;
	const struct wex_layout_tensor *t;
	const char *q = "model.layers.0.self_attn.q_proj.weight";
	const char *k = "model.layers.0.self_attn.k_proj.weight";
	const char *v = "model.layers.0.self_attn.v_proj.weight";

	kat_rank(m, "megatron:tp=1", 0, &l);
	t = kat_find(&l, "decoder.layers.0.self_attention.linear_qkv.weight");
	CHECK(t->shape[0] == 16 && t->shape[1] == 8, "shape %llux%llu", (unsigned long long)t->shape[0],
	      (unsigned long long)t->shape[1]);
	kat_piece(&l, t, 0, q, 0, 4, 0);
	kat_piece(&l, t, 1, k, 0, 2, 4);
	kat_piece(&l, t, 2, v, 0, 2, 6);
	kat_piece(&l, t, 3, q, 4, 4, 8);
	kat_piece(&l, t, 4, k, 2, 2, 12);
	kat_piece(&l, t, 5, v, 2, 2, 14);
	wex__rank_layout_free(&l);

	kat_rank(m, "megatron:tp=2", 1, &l);
	t = kat_find(&l, "decoder.layers.0.self_attention.linear_qkv.weight");
	CHECK(t->shape[0] == 8 && t->npieces == 3, "tp=2 shape %llu pieces %zu",
	      (unsigned long long)t->shape[0], t->npieces);
	kat_piece(&l, t, 0, q, 4, 4, 0);
	kat_piece(&l, t, 1, k, 2, 2, 4);
	kat_piece(&l, t, 2, v, 2, 2, 6);
	t = kat_find(&l, "decoder.layers.0.self_attention.linear_qkv.bias");
	kat_piece(&l, t, 0, "model.layers.0.self_attn.q_proj.bias", 4, 4, 0);
	kat_piece(&l, t, 1, "model.layers.0.self_attn.k_proj.bias", 2, 2, 4);
	wex__rank_layout_free(&l);

	/* Real bytes: hf -> megatron tp=1. */
	struct wex_layout_spec hs, ms;
	struct pt_rank src = { 0 }, dst = { 0 };
	struct wex_plan *p;
	char err[256];

	CHECK(wex__layout_parse("hf", &hs, err, sizeof(err)) == 0, "%s", err);
	CHECK(wex__layout_parse("megatron:tp=1", &ms, err, sizeof(err)) == 0, "%s", err);
	CHECK(pt_rank_make(m, &hs, 0, 1, &src, err, sizeof(err)) == 0, "%s", err);
	CHECK(pt_rank_make(m, &ms, 0, 0, &dst, err, sizeof(err)) == 0, "%s", err);
	struct wex_plan_src ps = { 0, src.pieces, src.l.np };
	CHECK(wex__plan_build(&ps, 1, dst.pieces, dst.l.np, 0, 1, &p, err, sizeof(err)) == 0, "%s", err);
	struct pt_srcs s = { &src, 1 };
	pt_run(p, &s, &dst);
	CHECK(pt_verify(&dst) == 0, "data check");
	const struct wex_layout_tensor *qkv = NULL, *qp = NULL;
	size_t qi = 0, qpi = 0;
	for (size_t i = 0; i < dst.l.nt; i++)
		if (!strcmp(dst.l.t[i].name, "decoder.layers.0.self_attention.linear_qkv.weight"))
			qkv = &dst.l.t[i], qi = i;
	for (size_t i = 0; i < src.l.nt; i++)
		if (!strcmp(src.l.t[i].name, q))
			qp = &src.l.t[i], qpi = i;
	CHECK(qkv && qp, "tensors present");
	CHECK(!memcmp(dst.buf + dst.toff[qi] + 8 * 8 * 4, src.buf + src.toff[qpi] + 4 * 8 * 4, 8 * 4),
	      "linear_qkv row 8 differs from q_proj row 4");
	wex__plan_free(p);
	pt_rank_free(&src);
	pt_rank_free(&dst);
	wex__model_free(m);
	printf("megatron qkv interleave matches the hand-worked layout\n");
	return T_PASS;
}
