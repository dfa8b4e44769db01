/* SPDX-License-Identifier: MIT */
/*
 * property.c - proves, over randomized models and layouts (dense GQA with
 * and without bias / q-k norms / tied embeddings, Qwen3-MoE and Mixtral
 * style MoE, DeepSeek-V3 style MLA+MoE; TP 1-8, PP with uneven first/last
 * stages (Megatron), vLLM's and SGLang's own splits of layers that do not
 * divide by PP and explicit stages=, Megatron's virtual pipeline (vpp
 * model chunks per pp rank), DP replicas, EP and expert TP, KV heads fewer than TP, odd
 * vocabulary sizes, SGLang's dp-attention with lm_head over the attention
 * group or all ranks, the embedding whole (embed_rep) and DeepSeek's
 * dense MLPs whole, DeepSeek under DeepEP (a2a: shared experts whole, ep
 * = tp; other ep refused), FSDP2 dim-0 chunks
 * over 1 to 32 ranks with HSDP replicas) that plan + host executor write every destination
 * element exactly once, with the value of the same canonical element, and
 * never touch padding.  Both the per-rank and the group planner are used.
 * Layouts that cannot exist are drawn too; they must fail with
 * -WEX_ELAYOUT, and enough possible ones must be checked.
 * Usage: planner_property [iterations] [seed]
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ptest.h"

static uint64_t rs;
static unsigned rnd(unsigned n)
{
	rs = rs * 6364136223846793005ull + 1442695040888963407ull;
	return (unsigned)((rs >> 33) % n);
}

static const unsigned divisors_pool[] = { 1, 2, 3, 4, 6, 8 };

static void make_config(char *buf, size_t len, int *family)
{
	unsigned kind = rnd(10);
	unsigned nkv = 1u << rnd(4);             /* 1 2 4 8 */
	unsigned qpg = 1 + rnd(3);               /* heads per group */
	unsigned nh = nkv * qpg * (rnd(2) ? 1 : 2);
	unsigned hd = 2u << rnd(2);              /* 2 4 */
	unsigned hidden = 8 + 4 * rnd(5);
	unsigned layers = 2 + rnd(5);
	unsigned vocab = 97 + rnd(300);          /* odd sizes: padding */
	unsigned inter = 8 * (1 + rnd(4)) * (rnd(2) ? 3 : 1);
	int tie = rnd(2);
	const char *dt = rnd(2) ? "float32" : "bfloat16";

	if (kind < 5) {
		const char *mt[] = { "llama", "qwen2", "qwen3", "mistral" };

		*family = 0;
		snprintf(buf, len,
			 "{\"model_type\":\"%s\",\"hidden_size\":%u,\"num_hidden_layers\":%u,"
			 "\"num_attention_heads\":%u,\"num_key_value_heads\":%u,\"head_dim\":%u,"
			 "\"intermediate_size\":%u,\"vocab_size\":%u,\"tie_word_embeddings\":%s,"
			 "\"attention_bias\":%s,\"torch_dtype\":\"%s\"}",
			 mt[rnd(4)], hidden, layers, nh, nkv, hd, inter, vocab, tie ? "true" : "false",
			 rnd(2) ? "true" : "false", dt);
	} else if (kind < 8) {
		unsigned ne = 2u << rnd(3); /* 2 4 8 16 */

		*family = 1;
		snprintf(buf, len,
			 "{\"model_type\":\"%s\",\"hidden_size\":%u,\"num_hidden_layers\":%u,"
			 "\"num_attention_heads\":%u,\"num_key_value_heads\":%u,\"head_dim\":%u,"
			 "\"intermediate_size\":%u,\"moe_intermediate_size\":%u,\"num_experts\":%u,"
			 "\"num_local_experts\":%u,\"vocab_size\":%u,\"tie_word_embeddings\":%s,"
			 "\"torch_dtype\":\"%s\"}",
			 rnd(2) ? "qwen3_moe" : "mixtral", hidden, layers, nh, nkv, hd, inter,
			 8 * (1 + rnd(3)), ne, ne, vocab, tie ? "true" : "false", dt);
	} else {
		unsigned ne = 4u << rnd(2);

		*family = 2;
		snprintf(buf, len,
			 "{\"model_type\":\"deepseek_v3\",\"hidden_size\":%u,\"num_hidden_layers\":%u,"
			 "\"num_attention_heads\":%u,\"intermediate_size\":%u,"
			 "\"moe_intermediate_size\":%u,\"n_routed_experts\":%u,\"n_shared_experts\":1,"
			 "\"first_k_dense_replace\":%u,\"q_lora_rank\":%s,\"kv_lora_rank\":8,"
			 "\"qk_nope_head_dim\":4,\"qk_rope_head_dim\":2,\"v_head_dim\":4,"
			 "\"vocab_size\":%u,\"tie_word_embeddings\":false,\"torch_dtype\":\"%s\"}",
			 hidden, layers, nh, inter, 8 * (1 + rnd(2)), ne, rnd(3), rnd(2) ? "12" : "null",
			 vocab, dt);
	}
}

static unsigned pick_tp(unsigned heads)
{
	unsigned tp;

	/* Mostly sizes that fit the heads; sometimes any, to draw impossible
	 * layouts too. */
	if (rnd(5) == 0)
		return divisors_pool[rnd(6)];
	do
		tp = divisors_pool[rnd(6)];
	while (heads % tp);
	return tp;
}

static void make_layout(char *buf, size_t len, int producer, int family, unsigned layers,
			unsigned nh, unsigned nkv)
{
	unsigned e = rnd(4);
	int meg = e == 1 || (producer && e != 3);
	unsigned tp = pick_tp(meg && family != 2 ? nkv : nh);

	if (e == 0 && rnd(2)) {
		snprintf(buf, len, "hf:dp=%u", 1 + rnd(2));
	} else if (e == 0) {
		/* FSDP2 dim-0 chunks: 1 to 8 ranks, sometimes more than a
		 * tensor's rows (empty shards), HSDP replicas. */
		unsigned n = rnd(4) ? 1 + rnd(8) : 13 + rnd(20);

		snprintf(buf, len, "fsdp:fsdp=%u,dp=%u", n, 1 + rnd(2));
	} else if (meg) {
		unsigned pp = 1 + rnd(layers < 4 ? layers : 4), vpp = 0;
		unsigned dp = 1 + rnd(3);

		/* The virtual pipeline (1 in 3): mostly pp and V > 1 chunks per
		 * rank whose product divides the layers; else V as drawn
		 * (refused when the layers do not divide into pp*V chunks or
		 * pp is 1). */
		if (rnd(3) == 0) {
			int fit = rnd(5) != 0;

			vpp = 2 + rnd(3);
			for (unsigned k = 0; fit && k < 32; k++) {
				unsigned p2 = 2 + rnd(2), v2 = 2 + rnd(2);

				if (layers % (p2 * v2) == 0) {
					pp = p2;
					vpp = v2;
					break;
				}
			}
		}
		int n = snprintf(buf, len, "megatron:tp=%u,pp=%u,dp=%u", tp, pp, dp);

		if (vpp)
			n += snprintf(buf + n, len - (size_t)n, ",vpp=%u", vpp);
		if (!vpp && pp > 2 && rnd(2))
			n += snprintf(buf + n, len - (size_t)n, ",first=%u", 1 + rnd(2));
		if (!vpp && pp > 2 && rnd(2))
			n += snprintf(buf + n, len - (size_t)n, ",last=%u", 1 + rnd(2));
		if (family && rnd(2)) {
			unsigned ep = 1u << rnd(3);

			n += snprintf(buf + n, len - (size_t)n, ",ep=%u,etp=%u", ep, 1u << rnd(2));
		}
	} else {
		unsigned pp = 1 + rnd(layers < 4 ? layers : 4);
		const char *eng = rnd(2) ? "vllm" : "sglang";
		/* SGLang's dp-attention on its MoE models: dp attention groups
		 * carved out of the tp ranks (1, 2 or 4, mostly dividing tp;
		 * one that does not is an impossible layout), lm_head over
		 * them or over all ranks, DeepSeek's dense MLPs whole or split. */
		int dpa = eng[0] == 's' && family && rnd(3);
		unsigned dp = 1 + rnd(2);

		if (dpa)
			do
				dp = 1u << rnd(3);
			while (rnd(5) && tp % dp);
		int n = snprintf(buf, len, "%s:tp=%u,dp=%u,pp=%u", eng, tp, dp, pp);

		if (dpa)
			n += snprintf(buf + n, len - (size_t)n, ",dp_attention=1%s%s",
				      rnd(2) ? ",dp_lm_head=1" : "", rnd(2) ? ",embed_rep=1" : "");
		if (eng[0] == 's' && family == 2 && rnd(3) == 0)
			n += snprintf(buf + n, len - (size_t)n, ",dense_tp=1");
		/* DeepSeek under SGLang's DeepEP (a2a=1): ep is tp, mostly. */
		if (eng[0] == 's' && family == 2 && rnd(3) == 0)
			n += snprintf(buf + n, len - (size_t)n, ",a2a=1,ep=%u",
				      rnd(5) ? tp : 1u << rnd(3));
		else if (family && rnd(2))
			n += snprintf(buf + n, len - (size_t)n, ",ep=%u", 1u << rnd(3));
		/* An explicit split: pp parts of at least one layer. */
		if (pp > 1 && rnd(3) == 0)
			for (unsigned s = 0, left = layers; s < pp; s++) {
				unsigned k = s == pp - 1 ? left : 1 + rnd(left - (pp - 1 - s));

				n += snprintf(buf + n, len - (size_t)n, "%s%u", s ? "/" : ",stages=", k);
				left -= k;
			}
	}
}

static int run_case(const char *cfg, const char *from, const char *to, int group, int *checked)
{
	struct wex_model *m = NULL;
	struct wex_layout_spec fs, ts;
	uint32_t pw, cw;
	char err[512];
	int ret;

	CHECK(wex__model_from_text(cfg, NULL, &m, err, sizeof(err)) == 0, "model: %s (%s)", err, cfg);
	CHECK(wex__layout_parse(from, &fs, err, sizeof(err)) == 0, "%s", err);
	CHECK(wex__layout_parse(to, &ts, err, sizeof(err)) == 0, "%s", err);
	ret = wex__layout_world(m, &fs, &pw, err, sizeof(err));
	if (ret == 0)
		ret = wex__layout_world(m, &ts, &cw, err, sizeof(err));
	if (ret < 0) {
		/* An impossible layout must say so clearly, with a number. */
		CHECK(ret == -WEX_ELAYOUT, "world: %d %s", ret, err);
		if (getenv("PT_VERBOSE"))
			fprintf(stderr, "  impossible: %s\n", err);
		CHECK(strpbrk(err, "0123456789") != NULL, "error names no number: %s", err);
		wex__model_free(m);
		return 0;
	}
	struct pt_rank *pr = calloc(pw, sizeof(*pr)), *cr = calloc(cw, sizeof(*cr));
	struct wex_plan_src *srcs = calloc(pw, sizeof(*srcs));
	struct wex_plan_dst *dsts = calloc(cw, sizeof(*dsts));
	struct wex_plan **plans = calloc(cw, sizeof(*plans));
	CHECK(pr && cr && srcs && dsts && plans, "oom");
	for (uint32_t r = 0; r < pw; r++) {
		ret = pt_rank_make(m, &fs, r, 1, &pr[r], err, sizeof(err));
		CHECK(ret == 0, "producer rank %u of %s: %s", r, from, err);
		srcs[r] = (struct wex_plan_src){ r, pr[r].pieces, pr[r].l.np };
	}
	for (uint32_t r = 0; r < cw; r++) {
		ret = pt_rank_make(m, &ts, r, 0, &cr[r], err, sizeof(err));
		CHECK(ret == 0, "consumer rank %u of %s: %s", r, to, err);
		dsts[r] = (struct wex_plan_dst){ r, cr[r].pieces, cr[r].l.np };
	}
	struct wex_planner *pl;
	CHECK(wex__planner_new(srcs, pw, &pl, err, sizeof(err)) == 0, "%s", err);
	if (group) {
		ret = wex__planner_plan_group(pl, dsts, cw, cw, plans, err, sizeof(err));
		CHECK(ret == 0, "group plan %s -> %s: %s", from, to, err);
	} else {
		for (uint32_t r = 0; r < cw; r++) {
			ret = wex__planner_plan(pl, cr[r].pieces, cr[r].l.np, r, cw, &plans[r], err,
						sizeof(err));
			CHECK(ret == 0, "plan %s -> %s rank %u: %s", from, to, r, err);
		}
	}
	struct pt_srcs ps = { pr, pw };
	for (uint32_t r = 0; r < cw; r++) {
		pt_run(plans[r], &ps, &cr[r]);
		uint64_t bad = pt_verify(&cr[r]);
		CHECK(bad == 0, "%s -> %s (%s) rank %u: %llu problems; config %s", from, to,
		      group ? "group" : "per-rank", r, (unsigned long long)bad, cfg);
		CHECK(plans[r]->stats.bytes_moved == plans[r]->stats.bytes_needed,
		      "moved %llu != needed %llu", (unsigned long long)plans[r]->stats.bytes_moved,
		      (unsigned long long)plans[r]->stats.bytes_needed);
		wex__plan_free(plans[r]);
	}
	wex__planner_free(pl);
	for (uint32_t r = 0; r < pw; r++)
		pt_rank_free(&pr[r]);
	for (uint32_t r = 0; r < cw; r++)
		pt_rank_free(&cr[r]);
	free(pr);
	free(cr);
	free(srcs);
	free(dsts);
	free(plans);
	wex__model_free(m);
	(*checked)++;
	return 0;
}

int main(int argc, char **argv)
{
	int iters = argc > 1 ? atoi(argv[1]) : 300;
	int checked = 0;
	char cfg[1024], from[128], to[128];

	rs = argc > 2 ? strtoull(argv[2], NULL, 0) : 12345;
	for (int i = 0; i < iters; i++) {
		int family;
		struct wex_model *m;
		char err[256];

		make_config(cfg, sizeof(cfg), &family);
		CHECK(wex__model_from_text(cfg, NULL, &m, err, sizeof(err)) == 0, "%s", err);
		unsigned layers = (unsigned)wex__model_sym(m, "layers");
		unsigned nh = (unsigned)wex__model_sym(m, "nh");
		unsigned nkv = family == 2 ? nh : (unsigned)wex__model_sym(m, "nkv");
		wex__model_free(m);
		make_layout(from, sizeof(from), 1, family, layers, nh, nkv);
		make_layout(to, sizeof(to), 0, family, layers, nh, nkv);
		if (getenv("PT_VERBOSE"))
			fprintf(stderr, "case %d: %s -> %s %s\n", i, from, to, cfg);
		run_case(cfg, from, to, i & 1, &checked);
	}
	printf("%d of %d random cases were possible layouts and passed\n", checked, iters);
	CHECK(checked >= iters / 4, "too few possible layouts drawn (%d)", checked);
	return T_PASS;
}
