/* SPDX-License-Identifier: MIT */
/*
 * plan_basic.c - proves the planner's bookkeeping on a small Llama-like
 * model: (1) hf -> hf is one op per tensor (contiguous copies coalesced);
 * (2) a row-parallel tensor gathered from tp=2 is two strided ops, not one
 * per row; (3) plan hashes are deterministic and piece-table hashes change
 * when a piece changes; (4) with data-parallel replicas (megatron dp=4 ->
 * 8 vLLM instances) bytes moved equal bytes needed and the busiest source
 * stays within 1.1x its lower bound, planned as a group, rank by rank on
 * one planner, and rank by rank on separate planners (wex__plan_build, as
 * wexd does: only crank/cworld spread the load), and with 4 replicas read
 * by 4 ranks planned apart each rank gets the same plan every time and each
 * replica serves exactly a quarter (4c);
 * (5) an element no producer holds is refused with -WEX_ELAYOUT;
 * (6) producer ranks marked near (memory on the consumer's device) serve
 * every element they hold, and several near ranks share it, while without
 * near ranks every replica serves a part; marked per segment, a rank is
 * near only for pieces in its near segments; (7) a rank planned alone against
 * 16 replicas cuts cells into chunks of at least 1 MiB (before, a 2 MiB
 * cell became 16 ops of 128 KiB), and still spreads over several replicas;
 * (8) an engine on the GPU of one trainer rank of 8 (that rank near) reads
 * nothing from the others with tp=1 replicas, and about half the bytes
 * from them with tp=2 (README: no traffic between GPUs only in the first
 * case).
 */
#include "ptest.h"

#define CFG_BIG "{\"model_type\":\"llama\",\"hidden_size\":1024,\"num_hidden_layers\":1," \
		"\"num_attention_heads\":16,\"num_key_value_heads\":4,\"intermediate_size\":1024," \
		"\"vocab_size\":1024,\"torch_dtype\":\"bfloat16\"}"

#define CFG "{\"model_type\":\"llama\",\"hidden_size\":64,\"num_hidden_layers\":4," \
	    "\"num_attention_heads\":8,\"num_key_value_heads\":4,\"intermediate_size\":128," \
	    "\"vocab_size\":1000,\"torch_dtype\":\"bfloat16\"}"

struct setup {
	struct pt_rank *pr, *cr;
	uint32_t pw, cw;
	struct wex_plan_src *srcs;
};

/* Adds the bytes each op of p reads to load[its source rank]. */
static void add_load(const struct wex_plan *p, uint64_t *load)
{
	for (size_t i = 0; i < p->nops; i++) {
		uint64_t b = p->ops[i].len;

		for (uint32_t k = 0; k < p->ops[i].nouter; k++)
			b *= p->ops[i].count[k];
		load[p->ops[i].src_rank] += b;
	}
}

/* 0: producer pieces are laid out but not filled (plan shape only). */
static int mk_fill = 1;

static void mk(const struct wex_model *m, const char *from, const char *to, struct setup *s)
{
	struct wex_layout_spec fs, ts;
	char err[256];

	CHECK(wex__layout_parse(from, &fs, err, sizeof(err)) == 0, "%s", err);
	CHECK(wex__layout_parse(to, &ts, err, sizeof(err)) == 0, "%s", err);
	CHECK(wex__layout_world(m, &fs, &s->pw, err, sizeof(err)) == 0, "%s", err);
	CHECK(wex__layout_world(m, &ts, &s->cw, err, sizeof(err)) == 0, "%s", err);
	s->pr = calloc(s->pw, sizeof(*s->pr));
	s->cr = calloc(s->cw, sizeof(*s->cr));
	s->srcs = calloc(s->pw, sizeof(*s->srcs));
	for (uint32_t r = 0; r < s->pw; r++) {
		CHECK(pt_rank_make(m, &fs, r, mk_fill, &s->pr[r], err, sizeof(err)) == 0, "%s", err);
		s->srcs[r] = (struct wex_plan_src){ r, s->pr[r].pieces, s->pr[r].l.np };
	}
	for (uint32_t r = 0; r < s->cw; r++)
		CHECK(pt_rank_make(m, &ts, r, 0, &s->cr[r], err, sizeof(err)) == 0, "%s", err);
}

static void unmk(struct setup *s)
{
	for (uint32_t r = 0; r < s->pw; r++)
		pt_rank_free(&s->pr[r]);
	for (uint32_t r = 0; r < s->cw; r++)
		pt_rank_free(&s->cr[r]);
	free(s->pr);
	free(s->cr);
	free(s->srcs);
}

int main(void)
{
	struct wex_model *m;
	struct setup s;
	struct wex_plan *p, *p2;
	char err[256];

	CHECK(wex__model_from_text(CFG, NULL, &m, err, sizeof(err)) == 0, "%s", err);

	/* (1) */
	mk(m, "hf", "hf", &s);
	CHECK(wex__plan_build(s.srcs, 1, s.cr[0].pieces, s.cr[0].l.np, 0, 1, &p, err, sizeof(err)) == 0, "%s", err);
	CHECK(p->nops == s.cr[0].l.nt, "hf->hf: %zu ops for %zu tensors", p->nops, s.cr[0].l.nt);
	CHECK(p->stats.bytes_moved == p->stats.bytes_needed, "moved != needed");
	/* (3) determinism */
	CHECK(wex__plan_build(s.srcs, 1, s.cr[0].pieces, s.cr[0].l.np, 0, 1, &p2, err, sizeof(err)) == 0, "%s", err);
	CHECK(p->hash == p2->hash && p->nops == p2->nops, "plan hash not deterministic");
	uint64_t h1 = wex__pieces_hash(s.cr[0].pieces, s.cr[0].l.np);
	CHECK(h1 == wex__pieces_hash(s.cr[0].pieces, s.cr[0].l.np), "pieces hash not deterministic");
	s.cr[0].pieces[3].offset += 2;
	CHECK(h1 != wex__pieces_hash(s.cr[0].pieces, s.cr[0].l.np), "pieces hash ignores offsets");
	s.cr[0].pieces[3].offset -= 2;
	wex__plan_free(p);
	wex__plan_free(p2);
	/* (4b) a consumer whose only piece is empty (a 0-row FSDP shard): a
	 * plan of no ops (it passed NULL to qsort, an abort under UBSan) */
	{
		struct wex_tensor t = s.cr[0].pieces[0];

		t.extent[0] = 0;
		CHECK(wex__plan_build(s.srcs, 1, &t, 1, 0, 1, &p, err, sizeof(err)) == 0, "%s", err);
		CHECK(p->nops == 0, "an empty piece planned %zu ops", p->nops);
		wex__plan_free(p);
	}
	/* (5) a consumer piece naming a tensor nobody holds */
	{
		struct wex_tensor t = s.cr[0].pieces[0];

		snprintf(t.name, sizeof(t.name), "model.layers.99.nothing.weight");
		CHECK(wex__plan_build(s.srcs, 1, &t, 1, 0, 1, &p, err, sizeof(err)) == -WEX_ELAYOUT, "missing source accepted");
		printf("missing source: %s\n", err);
		t = s.cr[0].pieces[0];
		t.shape[0] += 1;
		CHECK(wex__plan_build(s.srcs, 1, &t, 1, 0, 1, &p, err, sizeof(err)) == -WEX_ELAYOUT, "shape mismatch accepted");
		printf("shape mismatch: %s\n", err);
		/* The error says what each side has, so the user sees which. */
		{
			char want[64];

			snprintf(want, sizeof(want), "consumer has BF16 [%llu, ",
				 (unsigned long long)t.shape[0]);
			CHECK(strstr(err, want), "shape mismatch: no \"%s\" in \"%s\"", want, err);
			snprintf(want, sizeof(want), "producer BF16 [%llu, ",
				 (unsigned long long)t.shape[0] - 1);
			CHECK(strstr(err, want), "shape mismatch: no \"%s\" in \"%s\"", want, err);
		}
		t = s.cr[0].pieces[0];
		t.dtype = WEX_DT_F16;
		CHECK(wex__plan_build(s.srcs, 1, &t, 1, 0, 1, &p, err, sizeof(err)) == -WEX_ELAYOUT, "dtype mismatch accepted");
		printf("dtype mismatch: %s\n", err);
		CHECK(strstr(err, "consumer has F16 [") && strstr(err, "producer BF16 ["),
		      "dtype mismatch: both element types not named: \"%s\"", err);
	}
	unmk(&s);

	/* (2) o_proj [64, 64] gathered from two row-parallel halves. */
	mk(m, "vllm:tp=2", "hf", &s);
	{
		struct wex_tensor *o = NULL;
		size_t oi = 0;

		for (size_t i = 0; i < s.cr[0].l.np; i++)
			if (!strcmp(s.cr[0].pieces[i].name, "model.layers.1.self_attn.o_proj.weight"))
				o = &s.cr[0].pieces[i], oi = i;
		CHECK(o, "o_proj");
		CHECK(wex__plan_build(s.srcs, s.pw, o, 1, 0, 1, &p, err, sizeof(err)) == 0, "%s", err);
		CHECK(p->nops == 2 && p->ops[0].nouter == 1 && p->ops[0].count[0] == 64 &&
			      p->ops[0].len == 32 * 2,
		      "o_proj: %zu ops, nouter %u count %llu len %llu", p->nops, p->ops[0].nouter,
		      (unsigned long long)p->ops[0].count[0], (unsigned long long)p->ops[0].len);
		(void)oi;
		wex__plan_free(p);
	}
	unmk(&s);

	/* (4) replicas: 4 DP replicas of megatron tp=2, 8 vLLM tp=2 instances. */
	mk(m, "megatron:tp=2,dp=4", "vllm:tp=2,dp=8", &s);
	uint64_t bound = 0;
	for (int group = 0; group < 2; group++) {
		struct wex_planner *pl;
		struct wex_plan **plans = calloc(s.cw, sizeof(*plans));
		struct wex_plan_dst *d = calloc(s.cw, sizeof(*d));
		struct wex_plan_stats st;
		struct pt_srcs ps = { s.pr, s.pw };

		CHECK(wex__planner_new(s.srcs, s.pw, &pl, err, sizeof(err)) == 0, "%s", err);
		for (uint32_t r = 0; r < s.cw; r++)
			d[r] = (struct wex_plan_dst){ r, s.cr[r].pieces, s.cr[r].l.np };
		if (group) {
			CHECK(wex__planner_plan_group(pl, d, s.cw, s.cw, plans, err, sizeof(err)) == 0, "%s", err);
		} else {
			for (uint32_t r = 0; r < s.cw; r++)
				CHECK(wex__planner_plan(pl, d[r].t, d[r].n, r, s.cw, &plans[r], err, sizeof(err)) == 0, "%s", err);
		}
		wex__planner_stats(pl, &st);
		printf("%s: needed %llu moved %llu ops %llu busiest %llu bound %llu (%.3fx)\n",
		       group ? "group" : "per-rank", (unsigned long long)st.bytes_needed,
		       (unsigned long long)st.bytes_moved, (unsigned long long)st.ops,
		       (unsigned long long)st.busiest_src_bytes, (unsigned long long)st.src_bound_bytes,
		       (double)st.busiest_src_bytes / (double)st.src_bound_bytes);
		CHECK(st.bytes_needed == st.bytes_moved, "moved != needed");
		bound = st.src_bound_bytes;
		CHECK(st.busiest_src_bytes * 10 <= st.src_bound_bytes * 11, "busiest source above 1.1x bound");
		for (uint32_t r = 0; r < s.cw; r++) {
			memset(s.cr[r].count, 0, s.cr[r].size);
			memset(s.cr[r].buf, 0xA5, s.cr[r].size);
			pt_run(plans[r], &ps, &s.cr[r]);
			CHECK(pt_verify(&s.cr[r]) == 0, "rank %u data", r);
			wex__plan_free(plans[r]);
		}
		free(plans);
		free(d);
		wex__planner_free(pl);
	}
	{
		uint64_t *load = calloc(s.pw, sizeof(uint64_t)), busiest = 0;

		for (uint32_t r = 0; r < s.cw; r++) {
			CHECK(wex__plan_build(s.srcs, s.pw, s.cr[r].pieces, s.cr[r].l.np, r, s.cw, &p, err,
					      sizeof(err)) == 0, "%s", err);
			add_load(p, load);
			wex__plan_free(p);
		}
		for (uint32_t i = 0; i < s.pw; i++)
			busiest = load[i] > busiest ? load[i] : busiest;
		printf("independent: busiest %llu bound %llu (%.3fx)\n", (unsigned long long)busiest,
		       (unsigned long long)bound, (double)busiest / (double)bound);
		CHECK(busiest * 10 <= bound * 11, "independent plans: busiest source above 1.1x bound");
		free(load);
	}
	unmk(&s);

	/* (4c) 4 full replicas, 4 consumer ranks each wanting every tensor
	 * whole, each planned on a planner of its own (as wexd does): the
	 * same plan for the same rank every time, and crank alone spreads
	 * the ranks over the replicas, each replica read once per tensor.
	 * Before, the tie rotation took the name hash under each planner's
	 * random key: another plan (and plan hash, as `wexctl plan` printed)
	 * each time, and ranks piling onto the same replica. */
	mk(m, "megatron:tp=1,dp=4", "vllm:tp=1,dp=4", &s);
	{
		uint64_t load[4] = { 0 }, h0[4] = { 0 }, need = 0, busiest = 0;

		CHECK(s.pw == 4 && s.cw == 4, "4 x 4 ranks: %u, %u", s.pw, s.cw);
		for (int round = 0; round < 8; round++)
			for (uint32_t r = 0; r < s.cw; r++) {
				CHECK(wex__plan_build(s.srcs, s.pw, s.cr[r].pieces, s.cr[r].l.np, r, s.cw, &p,
						      err, sizeof(err)) == 0, "%s", err);
				if (!round) {
					h0[r] = p->hash;
					add_load(p, load);
					need += p->stats.bytes_needed;
				}
				CHECK(p->hash == h0[r], "rank %u: plan hash %016llx, then %016llx on another planner",
				      r, (unsigned long long)h0[r], (unsigned long long)p->hash);
				wex__plan_free(p);
			}
		for (uint32_t i = 0; i < s.pw; i++)
			busiest = load[i] > busiest ? load[i] : busiest;
		printf("apart, 4 replicas to 4 ranks: busiest %llu of %llu (%.3fx a quarter)\n",
		       (unsigned long long)busiest, (unsigned long long)need, 4.0 * (double)busiest / (double)need);
		CHECK(busiest * 4 == need, "ranks planned apart: busiest replica serves %llu of %llu bytes",
		      (unsigned long long)busiest, (unsigned long long)need);
	}
	unmk(&s);

	/* (6) near ranks: 4 full replicas (megatron tp=1, dp=4), one engine. */
	mk(m, "megatron:tp=1,dp=4", "vllm:tp=1", &s);
	for (int round = 0; round < 5; round++) {
		/* round 0: none near; 1: rank 2 near; 2: ranks 1 and 3 near;
		 * per segment: 3: rank 2's segment 0 near (its pieces are
		 * there), 4: rank 2 near as a whole but not its segment 0 */
		static const uint8_t seg_near[] = { 1 }, seg_far[] = { 0 };
		uint64_t load[4] = { 0 };
		struct pt_srcs ps = { s.pr, s.pw };

		for (uint32_t r = 0; r < s.pw; r++) {
			s.srcs[r].near = (round == 1 && r == 2) || (round == 2 && (r & 1)) ||
					 (round == 4 && r == 2);
			s.srcs[r].near_seg = round == 3 && r == 2 ? seg_near :
					     round == 4 && r == 2 ? seg_far : NULL;
			s.srcs[r].nnear_seg = s.srcs[r].near_seg ? 1 : 0;
		}
		CHECK(wex__plan_build(s.srcs, s.pw, s.cr[0].pieces, s.cr[0].l.np, 0, 1, &p, err,
				      sizeof(err)) == 0, "%s", err);
		add_load(p, load);
		printf("near round %d: %zu ops, load %llu %llu %llu %llu\n", round, p->nops,
		       (unsigned long long)load[0], (unsigned long long)load[1],
		       (unsigned long long)load[2], (unsigned long long)load[3]);
		CHECK(p->stats.bytes_moved == p->stats.bytes_needed, "near: moved != needed");
		for (uint32_t r = 0; r < 4; r++) {
			if (round == 0 || round == 4)
				CHECK(load[r] > 0, "round %d: no near segment: replica %u serves nothing",
				      round, r);
			else
				CHECK(!load[r] == !(round == 3 ? r == 2 : s.srcs[r].near),
				      "round %d: rank %u (near %d) serves %llu bytes", round, r,
				      s.srcs[r].near, (unsigned long long)load[r]);
		}
		memset(s.cr[0].count, 0, s.cr[0].size);
		memset(s.cr[0].buf, 0xA5, s.cr[0].size);
		pt_run(p, &ps, &s.cr[0]);
		CHECK(pt_verify(&s.cr[0]) == 0, "near round %d data", round);
		wex__plan_free(p);
	}
	unmk(&s);
	wex__model_free(m);

	/* (7) chunks of a rank planned alone: 16 replicas against one. */
	CHECK(wex__model_from_text(CFG_BIG, NULL, &m, err, sizeof(err)) == 0, "%s", err);
	{
		size_t nops1;
		uint32_t used = 0;
		uint8_t seen[16] = { 0 };
		mk_fill = 0; /* op sizes only: the bytes are checked above */
		mk(m, "megatron:tp=1", "vllm:tp=1", &s);
		CHECK(wex__plan_build(s.srcs, s.pw, s.cr[0].pieces, s.cr[0].l.np, 0, 1, &p, err,
				      sizeof(err)) == 0, "%s", err);
		nops1 = p->nops;
		wex__plan_free(p);
		unmk(&s);
		mk(m, "megatron:tp=1,dp=16", "vllm:tp=1", &s);
		CHECK(wex__plan_build(s.srcs, s.pw, s.cr[0].pieces, s.cr[0].l.np, 0, 1, &p, err,
				      sizeof(err)) == 0, "%s", err);
		for (size_t i = 0; i < p->nops; i++)
			if (!seen[p->ops[i].src_rank]++)
				used++;
		printf("16 replicas: %zu ops (one replica: %zu) over %u replicas, %llu bytes\n",
		       p->nops, nops1, used, (unsigned long long)p->stats.bytes_needed);
		CHECK(p->nops <= 2 * nops1 + p->stats.bytes_needed / (1u << 20),
		      "16 replicas: %zu ops, one replica %zu: cells cut below 1 MiB", p->nops, nops1);
		CHECK(used >= 4, "16 replicas: only %u serve", used);
		CHECK(p->stats.bytes_moved == p->stats.bytes_needed, "16 replicas: moved != needed");
		wex__plan_free(p);
		unmk(&s);
	}

	/* (8) an engine (vllm tp=1) on the GPU of one trainer rank of 8: it
	 * reads nothing across GPUs only where that rank holds all it needs
	 * (tp=1 replicas); a tp=2 rank holds half of each sharded tensor, so
	 * the other half comes from the other shard's ranks (other GPUs). */
	for (int tp = 1; tp <= 2; tp++) {
		char from[64];
		uint64_t far = 0, load8[8];

		snprintf(from, sizeof(from), "megatron:tp=%d,dp=%d", tp, 8 / tp);
		mk(m, from, "vllm:tp=1", &s);
		for (uint32_t r = 0; r < s.pw; r++)
			s.srcs[r].near = r == 0;
		CHECK(wex__plan_build(s.srcs, s.pw, s.cr[0].pieces, s.cr[0].l.np, 0, 1, &p, err,
				      sizeof(err)) == 0, "%s", err);
		memset(load8, 0, sizeof(load8));
		add_load(p, load8);
		for (uint32_t r = 1; r < 8; r++)
			far += load8[r];
		printf("%s, rank 0 near: %llu of %llu bytes from other ranks\n", from,
		       (unsigned long long)far, (unsigned long long)p->stats.bytes_needed);
		if (tp == 1)
			CHECK(far == 0, "tp=1: %llu bytes from other GPUs", (unsigned long long)far);
		else
			CHECK(far > p->stats.bytes_needed / 4 && far <= p->stats.bytes_needed / 2,
			      "tp=2: %llu of %llu bytes from other GPUs", (unsigned long long)far,
			      (unsigned long long)p->stats.bytes_needed);
		wex__plan_free(p);
		unmk(&s);
	}
	wex__model_free(m);
	return T_PASS;
}
