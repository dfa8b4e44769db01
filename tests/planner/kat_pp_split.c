/* SPDX-License-Identifier: MIT */
/*
 * kat_pp_split.c - proves pipeline stages hold the layers each engine
 * gives them when the layer count does not divide by pp, checked on the
 * layer names every rank holds for a small llama of 7 layers (and 61 and
 * 63, DeepSeek-V3's count and one that leaves 3 over):
 *
 * - vLLM (vllm/distributed/utils.py get_pp_indices): L // pp each, the
 *   remainder one layer each to the stages before the last, from the one
 *   before last backwards: 7 layers pp=3 -> 2/3/2, pp=4 -> 2/2/2/1, pp=2
 *   -> 4/3; 61 pp=4 -> 15/15/16/15, pp=2 -> 31/30; 63 pp=4 -> 16/16/16/15.
 * - SGLang (python/sglang/srt/distributed/utils.py get_pp_indices): the
 *   last r stages one layer more: 7 pp=3 -> 2/2/3, pp=4 -> 1/2/2/2; 61
 *   pp=4 -> 15/15/15/16.
 * - stages=N/N/... (VLLM_PP_LAYER_PARTITION, SGLANG_PP_LAYER_PARTITION)
 *   gives the split explicitly.
 * - Megatron keeps even stages or explicit first/last (its
 *   decoder_first/last_pipeline_num_layers): 7 layers pp=3 is refused,
 *   first=3 gives 3/2/2; first/last given to vLLM follow that rule too.
 *   Layers that divide evenly split as before.
 *
 * And that stages= is refused, naming the problem, when it lists a count
 * other than pp, sums to other than the layers, holds a stage of 0 layers
 * or a part that is not digits, comes with first/last, comes without
 * pp > 1, or is given to an engine without it (Megatron).
 */
#include <errno.h>

#include "kat_common.h"

#define CFG(N) "{\"model_type\":\"llama\",\"hidden_size\":8,\"num_hidden_layers\":" #N "," \
	       "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"intermediate_size\":8," \
	       "\"vocab_size\":64,\"torch_dtype\":\"bfloat16\"}"

/* vLLM's and SGLang's names of a llama layer (global layer numbers). */
static const char *const layer_names[] = {
	"input_layernorm.weight", "self_attn.qkv_proj.weight", "self_attn.o_proj.weight",
	"post_attention_layernorm.weight", "mlp.gate_up_proj.weight", "mlp.down_proj.weight",
};

/* Layer of canonical name "model.layers.L....", -1 for the others. */
static int canon_layer(const char *name)
{
	int L, n = 0;

	if (sscanf(name, "model.layers.%d.%n", &L, &n) == 1 && n > 0)
		return L;
	return -1;
}

/* Every tp rank of every stage of `layout` (dp=1) must hold the layers
 * sizes[0], sizes[1], ... in order: its pieces name canonical tensors of
 * exactly those layers; with `names` (vLLM, SGLang), the rank's physical
 * tensors are exactly those layers' and its stage's embed / norm+lm_head. */
static void split(const char *cfg, const char *layout, uint32_t tp, const int *sizes, int pp,
		  int names)
{
	struct wex_model *m = kat_model(cfg);
	int64_t layers = wex__model_sym(m, "layers");
	struct wex_layout_spec sp;
	char err[512] = "", name[128];
	uint32_t w;
	int a = 0;

	CHECK(wex__layout_parse(layout, &sp, err, sizeof(err)) == 0, "%s", err);
	CHECK(wex__layout_world(m, &sp, &w, err, sizeof(err)) == 0, "%s: %s", layout, err);
	CHECK(w == tp * (uint32_t)pp, "%s: %u ranks, wanted %u", layout, w, tp * (uint32_t)pp);
	for (int s = 0; s < pp; s++) {
		int b = a + sizes[s];

		for (uint32_t t = 0; t < tp; t++) {
			struct wex_rank_layout l;
			uint32_t rank = (uint32_t)s * tp + t;
			char held[1024] = { 0 };

			kat_rank(m, layout, rank, &l);
			for (size_t i = 0; i < l.np; i++) {
				int L = canon_layer(l.p[i].name);

				CHECK(L < 0 || (L >= a && L < b), "%s rank %u (stage %d, layers %d-%d) holds %s",
				      layout, rank, s, a, b - 1, l.p[i].name);
				if (L >= 0)
					held[L] = 1;
			}
			for (int L = a; L < b; L++)
				CHECK(held[L], "%s rank %u (stage %d) lacks layer %d", layout, rank, s, L);
			if (names) {
				size_t want = 6 * (size_t)(b - a) + (s == 0) + 2 * (s == pp - 1);

				for (int L = a; L < b; L++)
					for (size_t k = 0; k < sizeof(layer_names) / sizeof(*layer_names); k++) {
						snprintf(name, sizeof(name), "model.layers.%d.%s", L,
							 layer_names[k]);
						kat_find(&l, name);
					}
				if (s == 0)
					kat_find(&l, "model.embed_tokens.weight");
				if (s == pp - 1) {
					kat_find(&l, "model.norm.weight");
					kat_find(&l, "lm_head.weight");
				}
				CHECK(l.nt == want, "%s rank %u: %zu physical tensors, wanted %zu", layout,
				      rank, l.nt, want);
			}
			wex__rank_layout_free(&l);
		}
		a = b;
	}
	CHECK(a == layers, "test error: sizes sum to %d, model has %lld", a, (long long)layers);
	printf("%-32s layers", layout);
	for (int s = 0; s < pp; s++)
		printf("%c%d", s ? '/' : ' ', sizes[s]);
	printf("\n");
	wex__model_free(m);
}

#define SPLIT(cfg, layout, tp, names, ...)                                                   \
	split(cfg, layout, tp, (const int[]){ __VA_ARGS__ },                                  \
	      (int)(sizeof((const int[]){ __VA_ARGS__ }) / sizeof(int)), names)

/* `layout` must not parse (-EINVAL), with an error naming a and b. */
static void parse_refused(const char *layout, const char *a, const char *b)
{
	struct wex_layout_spec sp;
	char err[512] = "";

	CHECK(wex__layout_parse(layout, &sp, err, sizeof(err)) == -EINVAL, "%s parsed", layout);
	CHECK(strstr(err, a) && strstr(err, b), "%s: error does not name %s and %s: %s", layout, a,
	      b, err);
	printf("%-32s %s\n", layout, err);
}

static void refused(const char *cfg, const char *layout, const char *a, const char *b)
{
	struct wex_model *m = kat_model(cfg);

	kat_refused(m, layout, a, b);
	wex__model_free(m);
}

int main(void)
{
	char many[1200];
	int n;

	/* vLLM: the remainder to the stages before the last. */
	SPLIT(CFG(7), "vllm:tp=2,pp=3", 2, 1, 2, 3, 2);
	SPLIT(CFG(7), "vllm:pp=4", 1, 1, 2, 2, 2, 1);
	SPLIT(CFG(7), "vllm:tp=2,pp=2", 2, 1, 4, 3);
	SPLIT(CFG(61), "vllm:pp=4", 1, 1, 15, 15, 16, 15);
	SPLIT(CFG(61), "vllm:pp=2", 1, 1, 31, 30);
	SPLIT(CFG(63), "vllm:pp=4", 1, 1, 16, 16, 16, 15);
	/* SGLang: to the last stages. */
	SPLIT(CFG(7), "sglang:tp=2,pp=3", 2, 1, 2, 2, 3);
	SPLIT(CFG(7), "sglang:pp=4", 1, 1, 1, 2, 2, 2);
	SPLIT(CFG(7), "sglang:tp=2,pp=2", 2, 1, 3, 4);
	SPLIT(CFG(61), "sglang:pp=4", 1, 1, 15, 15, 15, 16);
	SPLIT(CFG(63), "sglang:pp=4", 1, 1, 15, 16, 16, 16);
	/* Explicit splits. */
	SPLIT(CFG(7), "vllm:tp=2,pp=3,stages=1/3/3", 2, 1, 1, 3, 3);
	SPLIT(CFG(7), "sglang:pp=4,stages=3/1/1/2", 1, 1, 3, 1, 1, 2);
	SPLIT(CFG(61), "vllm:tp=2,pp=4,stages=16/15/15/15", 2, 1, 16, 15, 15, 15);
	SPLIT(CFG(8), "sglang:pp=2,stages=5/3", 1, 1, 5, 3);
	/* Even splits and first/last: as before, for every engine. */
	SPLIT(CFG(8), "vllm:tp=2,pp=4", 2, 1, 2, 2, 2, 2);
	SPLIT(CFG(8), "sglang:pp=4", 1, 1, 2, 2, 2, 2);
	SPLIT(CFG(7), "vllm:pp=3,first=3", 1, 1, 3, 2, 2);
	SPLIT(CFG(7), "sglang:pp=4,first=1", 1, 1, 1, 2, 2, 2);
	SPLIT(CFG(7), "megatron:tp=2,pp=3,first=3", 2, 0, 3, 2, 2);
	SPLIT(CFG(7), "megatron:pp=3,last=1", 1, 0, 3, 3, 1);
	SPLIT(CFG(8), "megatron:tp=2,pp=4", 2, 0, 2, 2, 2, 2);
	/* Megatron: uneven stages only as first/last. */
	refused(CFG(7), "megatron:pp=3", "7 layers", "do not divide evenly");
	refused(CFG(7), "megatron_grouped:tp=2,pp=2", "7 layers", "do not divide evenly");
	refused(CFG(7), "megatron:pp=3,stages=3/2/2", "megatron", "no parameter stages");
	/* vLLM with first/last: the rest must divide evenly, as before. */
	refused(CFG(7), "vllm:pp=4,first=2", "5 layers", "do not divide evenly");

	/* stages= that does not fit the layout or the model. */
	refused(CFG(7), "vllm:pp=4,stages=2/2/3", "3 stages", "pp=4");
	refused(CFG(7), "sglang:pp=2,stages=1/2/2/2", "4 stages", "pp=2");
	refused(CFG(7), "vllm:pp=3,stages=2/2/2", "6 layers", "7 layers");
	refused(CFG(7), "sglang:pp=3,stages=3/3/3", "9 layers", "7 layers");
	refused(CFG(7), "vllm:pp=3,first=1,stages=1/3/3", "stages=", "first/last");
	refused(CFG(7), "sglang:pp=3,last=2,stages=3/2/2", "stages=", "first/last");
	refused(CFG(7), "vllm:stages=7", "stages=", "pp > 1");
	refused(CFG(7), "vllm:pp=1,stages=7", "stages=", "pp > 1");
	/* stages= that is not a list of layer counts. */
	parse_refused("vllm:pp=3,stages=2/0/5", "entry 2", "no layers");
	parse_refused("vllm:pp=3,stages=0/2/5", "entry 1", "no layers");
	parse_refused("vllm:pp=3,stages=2/x/4", "entry 2 (\"x\")", "digits");
	parse_refused("vllm:pp=3,stages=2//5", "entry 2 (\"\")", "digits");
	parse_refused("vllm:pp=2,stages=3/", "entry 2 (\"\")", "digits");
	parse_refused("vllm:pp=2,stages=", "entry 1 (\"\")", "digits");
	parse_refused("vllm:pp=2,stages=+3/4", "entry 1 (\"+3\")", "digits");
	parse_refused("vllm:pp=2,stages=3/-4", "entry 2 (\"-4\")", "digits");
	parse_refused("vllm:pp=2,stages=3 /4", "entry 1 (\"3 \")", "digits");
	parse_refused("vllm:pp=2,stages=3,4", "bad layout parameter", "stages=3,4");
	/* A key given twice (a spec pasted together) is refused, not the
	 * last one taken. */
	parse_refused("vllm:pp=2,stages=3/4,stages=4/3", "stages given twice", "vllm:pp=2");
	parse_refused("vllm:tp=2,pp=2,tp=4", "tp given twice", "vllm:tp=2,pp=2,tp=4");
	parse_refused("vllm:pp=2,stages=1048577/1", "entry 1", "1048576");
	n = snprintf(many, sizeof(many), "vllm:pp=257,stages=1");
	for (int i = 1; i < 257; i++)
		n += snprintf(many + n, sizeof(many) - (size_t)n, "/1");
	parse_refused(many, "more than 256", "stages");
	return T_PASS;
}
