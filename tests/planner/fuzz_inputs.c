/* SPDX-License-Identifier: MIT */
/*
 * fuzz_inputs.c - mutational fuzzing of the planner's untrusted inputs
 * (deterministic seed, bounded time): config.json values set to edge
 * values (0, 1, odd, huge, absent, not numbers) under random layouts,
 * safetensors headers with bytes flipped, digits changed and cut short,
 * and family/engine JSON with expressions and numbers mutated.  Every
 * input must either be refused with an error message or give layouts
 * whose plans write every destination element exactly once with the right
 * value and never touch padding (ptest.h); never a crash, a sanitizer
 * report or a hang.
 * Usage: planner_fuzz_inputs [seconds] [seed]
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ptest.h"
#include "safetensors.h"

static uint64_t rs;
static unsigned rnd(unsigned n)
{
	rs = rs * 6364136223846793005ull + 1442695040888963407ull;
	return (unsigned)((rs >> 33) % n);
}

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Bytes a layout may materialise per rank before the case is skipped. */
#define RANK_LIMIT (8ull << 20)

/* ---- configs ---- */

static const char *const bases[] = {
	"{\"model_type\":\"qwen2\",\"hidden_size\":16,\"num_hidden_layers\":3,"
	"\"num_attention_heads\":4,\"num_key_value_heads\":2,\"head_dim\":4,"
	"\"intermediate_size\":24,\"vocab_size\":101,\"tie_word_embeddings\":false,"
	"\"attention_bias\":true}",
	"{\"model_type\":\"qwen3_moe\",\"hidden_size\":16,\"num_hidden_layers\":3,"
	"\"num_attention_heads\":4,\"num_key_value_heads\":2,\"head_dim\":4,"
	"\"intermediate_size\":24,\"moe_intermediate_size\":8,\"num_experts\":4,"
	"\"vocab_size\":101,\"tie_word_embeddings\":false}",
	"{\"model_type\":\"deepseek_v3\",\"hidden_size\":16,\"num_hidden_layers\":3,"
	"\"num_attention_heads\":4,\"intermediate_size\":24,\"moe_intermediate_size\":8,"
	"\"n_routed_experts\":4,\"n_shared_experts\":1,\"first_k_dense_replace\":1,"
	"\"q_lora_rank\":12,\"kv_lora_rank\":8,\"qk_nope_head_dim\":4,\"qk_rope_head_dim\":2,"
	"\"v_head_dim\":4,\"vocab_size\":101,\"tie_word_embeddings\":false}",
};

static const char *const edge[] = { "0",     "1",    "2",     "3",    "5",     "7",
				     "9",     "16",   "17",    "null", "-1",    "2.5",
				     "true",  "\"4\"", "1099511627776", "1099511627777",
				     "4611686018427387904", "64" };

/* Replaces the value of one "key":value pair (numbers, literals) of cfg. */
static void mutate_config(char *cfg, size_t len)
{
	char out[2048];
	size_t n = 0;
	int keys = 0, pick;

	for (const char *p = cfg; *p; p++)
		if (p[0] == ':' )
			keys++;
	pick = (int)rnd((unsigned)keys);
	keys = 0;
	for (const char *p = cfg; *p && n + 64 < sizeof(out);) {
		out[n++] = *p;
		if (*p == ':' && keys++ == pick && p[1] != '"') {
			const char *e = edge[rnd(sizeof(edge) / sizeof(edge[0]))];

			p++;
			while (*p && *p != ',' && *p != '}')
				p++;
			n += (size_t)snprintf(out + n, sizeof(out) - n, "%s", e);
			continue;
		}
		p++;
	}
	out[n] = 0;
	snprintf(cfg, len, "%s", out);
}

static void make_layout(char *buf, size_t len)
{
	static const char *const eng[] = { "hf", "megatron", "megatron_grouped", "vllm", "sglang" };
	static const char *const keys[] = { "tp", "pp", "dp", "ep", "etp", "first", "last",
					    "fuse_shared" };
	int n = snprintf(buf, len, "%s", eng[rnd(5)]);
	unsigned k = rnd(4);

	for (unsigned i = 0; i < k; i++)
		n += snprintf(buf + n, len - (size_t)n, "%c%s=%u", i ? ',' : ':', keys[rnd(8)],
			      rnd(6) == 0 ? rnd(20) : rnd(5));
}

static uint64_t layout_bytes(const struct wex_model *m, const struct wex_layout_spec *s,
			     uint32_t world)
{
	uint64_t most = 0;

	for (uint32_t r = 0; r < world; r++) {
		struct wex_rank_layout l;
		char err[512];

		if (wex__layout_rank(m, s, r, &l, err, sizeof(err)) < 0)
			return UINT64_MAX;
		if (l.total_bytes > most)
			most = l.total_bytes;
		wex__rank_layout_free(&l);
	}
	return most;
}

/* Plans from -> to over model m and checks every consumer byte. */
static void check_plans(const struct wex_model *m, const struct wex_layout_spec *fs,
			const struct wex_layout_spec *ts, uint32_t pw, uint32_t cw, int group,
			int lenient, const char *what)
{
	struct pt_rank *pr = calloc(pw, sizeof(*pr)), *cr = calloc(cw, sizeof(*cr));
	struct wex_plan_src *srcs = calloc(pw, sizeof(*srcs));
	struct wex_plan_dst *dsts = calloc(cw, sizeof(*dsts));
	struct wex_plan **plans = calloc(cw, sizeof(*plans));
	struct wex_planner *pl;
	char err[512];
	int ret;

	CHECK(pr && cr && srcs && dsts && plans, "oom");
	for (uint32_t r = 0; r < pw; r++) {
		ret = pt_rank_make(m, fs, r, 1, &pr[r], err, sizeof(err));
		CHECK(ret == 0, "producer rank %u: %s (%s)", r, err, what);
		srcs[r] = (struct wex_plan_src){ r, pr[r].pieces, pr[r].l.np };
	}
	for (uint32_t r = 0; r < cw; r++) {
		ret = pt_rank_make(m, ts, r, 0, &cr[r], err, sizeof(err));
		CHECK(ret == 0, "consumer rank %u: %s (%s)", r, err, what);
		dsts[r] = (struct wex_plan_dst){ r, cr[r].pieces, cr[r].l.np };
	}
	pl = NULL;
	err[0] = 0;
	ret = wex__planner_new(srcs, pw, &pl, err, sizeof(err));
	if (ret == 0 && group) {
		ret = wex__planner_plan_group(pl, dsts, cw, cw, plans, err, sizeof(err));
	} else {
		for (uint32_t r = 0; ret == 0 && r < cw; r++)
			ret = wex__planner_plan(pl, cr[r].pieces, cr[r].l.np, r, cw, &plans[r], err,
						sizeof(err));
	}
	/* Layouts from the tree's adapters always plan; mutated engines may
	 * leave tensors unheld, which must be said. */
	CHECK(ret == 0 || (lenient && ret == -WEX_ELAYOUT && err[0]), "plan: %d %s (%s)", ret, err,
	      what);
	struct pt_srcs ps = { pr, pw };
	for (uint32_t r = 0; ret == 0 && r < cw; r++) {
		pt_run(plans[r], &ps, &cr[r]);
		uint64_t bad = pt_verify(&cr[r]);
		CHECK(bad == 0, "rank %u: %llu problems (%s)", r, (unsigned long long)bad, what);
	}
	for (uint32_t r = 0; r < cw; r++)
		wex__plan_free(plans[r]);
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
}

/* One config case against the adapters in `dir` (NULL: the tree's). */
static int config_case(const char *cfg, const char *dir, int *checked)
{
	struct wex_model *m = NULL;
	struct wex_layout_spec fs, ts;
	uint32_t pw, cw;
	char err[512] = "", from[128], to[128], what[3000];
	int ret;

	ret = wex__model_from_text(cfg, dir, &m, err, sizeof(err));
	if (ret < 0) {
		CHECK(err[0], "model refused (%d) without a message: %s", ret, cfg);
		return 0;
	}
	make_layout(from, sizeof(from));
	make_layout(to, sizeof(to));
	snprintf(what, sizeof(what), "%s -> %s, %s", from, to, cfg);
	if (wex__layout_parse(from, &fs, err, sizeof(err)) < 0 ||
	    wex__layout_parse(to, &ts, err, sizeof(err)) < 0) {
		wex__model_free(m);
		return 0;
	}
	err[0] = 0;
	ret = wex__layout_world(m, &fs, &pw, err, sizeof(err));
	if (ret == 0)
		ret = wex__layout_world(m, &ts, &cw, err, sizeof(err));
	if (ret < 0) {
		CHECK(err[0], "layout refused (%d) without a message: %s", ret, what);
		wex__model_free(m);
		return 0;
	}
	if (pw * (uint64_t)cw > 256 || layout_bytes(m, &fs, pw) > RANK_LIMIT ||
	    layout_bytes(m, &ts, cw) > RANK_LIMIT) {
		wex__model_free(m);
		return 0;
	}
	check_plans(m, &fs, &ts, pw, cw, (int)rnd(2), dir != NULL, what);
	wex__model_free(m);
	(*checked)++;
	return 1;
}

/* ---- adapters: family and engine JSON ---- */

static const char *const afiles[] = { "families/llama", "families/moe", "families/deepseek_v3",
				      "engines/hf", "engines/megatron", "engines/megatron_grouped",
				      "engines/vllm", "engines/sglang" };
#define NAF (sizeof(afiles) / sizeof(afiles[0]))
static char *atext[NAF];
static char adir[64];

static const char *const apool[] = {
	"0", "-1", "2", "3", "64", "1e3", "99999999999999999999", "4611686018427387904", "true",
	"null", "[]", "{}", "\"\"", "\"(\"", "\"hidden/0\"", "\"hidden/(nh-nh)\"",
	"\"9223372036854775807+1\"", "\"(0-9223372036854775807-1)/(0-1)\"",
	"\"(0-9223372036854775807-1)*(0-1)\"", "\"0-hidden\"", "\"hidden-1\"", "\"hidden+1\"",
	"\"nh*hd+1\"", "\"nkv*hd-1\"", "\"vocab+3\"", "\"layers==3\"", "\"col\"", "\"row\"",
	"\"rep\"", "\"vocab\"", "\"qkv_cat\"", "\"qkv_group\"", "\"q\"", "\"k\"", "\"v\"",
	"\"embed\"", "\"o\"", "\"gate\"", "\"down\"", "\"stack\"", "\"local\"", "\"etp\"",
	"\"first\"", "\"last\"", "\"dense\"", "\"moe\"", "\"tp_dp\"", "\"tp/ep\"", "\"tp_dp/ep\"",
	"\"{L}\"", "\"{e}\"", "\"{E}.{l}\"", "\"{nosuch}\"", "\"{\"", "[\"q\",\"k\",\"v\"]",
	"[\"hidden\"]", "[\"hidden\",\"hidden\",\"hidden\",\"hidden\",\"hidden\",\"hidden\",\"hidden\",\"hidden\",\"hidden\"]",
	"\"((((((((((((((((((((((((((((((((hidden))))))))))))))))))))))))))))))))\"",
};

/* Replaces one string or number token of text (not keys, mostly). */
static char *mutate_json(const char *text)
{
	size_t len = strlen(text), ntok = 0, pick = 0, i = 0, a = 0, b = 0;

	for (int pass = 0; pass < 2; pass++) {
		size_t k = 0;

		for (i = 0; i < len; i++) {
			size_t s = i;

			if (text[i] == '"') {
				for (i++; i < len && text[i] != '"'; i++)
					;
			} else if ((text[i] >= '0' && text[i] <= '9') || text[i] == '-') {
				while (i + 1 < len && ((text[i + 1] >= '0' && text[i + 1] <= '9') ||
						       text[i + 1] == '.'))
					i++;
			} else {
				continue;
			}
			if (pass == 1 && k == pick) {
				a = s;
				b = i + 1;
			}
			k++;
		}
		ntok = k;
		if (pass == 0)
			pick = rnd((unsigned)ntok);
	}
	const char *r = apool[rnd(sizeof(apool) / sizeof(apool[0]))];
	char *out = malloc(len + strlen(r) + 1);

	CHECK(out, "oom");
	memcpy(out, text, a);
	strcpy(out + a, r);
	strcat(out + a, text + b);
	return out;
}

static void write_file(const char *name, const char *text)
{
	char path[256];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s.json", adir, name);
	f = fopen(path, "w");
	CHECK(f && fputs(text, f) >= 0 && fclose(f) == 0, "write %s", path);
}

static void adapters_setup(void)
{
	const char *src = getenv("WEX_SRC");
	char path[600];

	snprintf(adir, sizeof(adir), "/tmp/wex-fuzz.XXXXXX");
	CHECK(mkdtemp(adir) != NULL, "mkdtemp");
	snprintf(path, sizeof(path), "%s/families", adir);
	CHECK(mkdir(path, 0755) == 0, "mkdir");
	snprintf(path, sizeof(path), "%s/engines", adir);
	CHECK(mkdir(path, 0755) == 0, "mkdir");
	for (size_t i = 0; i < NAF; i++) {
		FILE *f;
		long n;

		snprintf(path, sizeof(path), "%s/adapters/%s.json", src ? src : "..", afiles[i]);
		f = fopen(path, "rb");
		CHECK(f && fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) > 0, "read %s", path);
		rewind(f);
		atext[i] = calloc(1, (size_t)n + 1);
		CHECK(atext[i] && fread(atext[i], 1, (size_t)n, f) == (size_t)n, "read %s", path);
		fclose(f);
		write_file(afiles[i], atext[i]);
	}
}

static void adapters_teardown(void)
{
	char path[600];

	for (size_t i = 0; i < NAF; i++) {
		snprintf(path, sizeof(path), "%s/%s.json", adir, afiles[i]);
		unlink(path);
		free(atext[i]);
	}
	snprintf(path, sizeof(path), "%s/families", adir);
	rmdir(path);
	snprintf(path, sizeof(path), "%s/engines", adir);
	rmdir(path);
	rmdir(adir);
}

/* One config case against a family or engine file with a few mutations. */
static void adapters_case(int *checked)
{
	size_t f = rnd(NAF);
	char *t = strdup(atext[f]);

	CHECK(t, "oom");
	for (unsigned i = 1 + rnd(3); i > 0; i--) {
		char *x = mutate_json(t);

		free(t);
		t = x;
	}
	write_file(afiles[f], t);
	if (getenv("PT_VERBOSE"))
		fprintf(stderr, "adapters %s: %s\n", afiles[f], t);
	config_case(bases[rnd(3)], adir, checked);
	write_file(afiles[f], atext[f]);
	free(t);
}

/* ---- safetensors headers ---- */

static void st_case(void)
{
	char hdr[1024], mut[1100];
	int n = snprintf(hdr, sizeof(hdr),
			 "{\"__metadata__\":{\"format\":\"pt\"},"
			 "\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
			 "\"b\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[24,32]},"
			 "\"c\":{\"dtype\":\"I8\",\"shape\":[0,5],\"data_offsets\":[32,32]},"
			 "\"d\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[32,33]}}");
	size_t len = (size_t)n;
	uint64_t data = 33;
	unsigned k = 1 + rnd(4);

	memcpy(mut, hdr, len);
	for (unsigned i = 0; i < k; i++) {
		unsigned at = len ? rnd((unsigned)len) : 0, op = rnd(6);
		static const char digits[] = "0123456789";

		if (!len) {
			break;
		} else if (op == 0) {
			mut[at] = (char)rnd(256);
		} else if (op == 1 && mut[at] >= '0' && mut[at] <= '9') {
			mut[at] = digits[rnd(10)];
		} else if (op == 2 && len + 20 < sizeof(mut)) {
			/* Grow a number. */
			const char *big[] = { "9", "99999999999", "18446744073709551615",
					      "4294967296" };
			const char *b = big[rnd(4)];
			size_t bl = strlen(b);

			memmove(mut + at + bl, mut + at, len - at);
			memcpy(mut + at, b, bl);
			len += bl;
		} else if (op == 3) {
			len = at;
		} else if (op == 4) {
			data = rnd(3) ? data + rnd(9) - 4 : rnd(100);
		} else {
			mut[at] = "[]{},:\"-0"[rnd(9)];
		}
	}
	struct wex_st_tensor *t = NULL;
	size_t nt = 0;
	char err[512] = "";
	int ret = wex__st_parse_header(mut, len, data, &t, &nt, err, sizeof(err));

	if (ret < 0) {
		CHECK(err[0], "header refused without a message: %.*s", (int)len, mut);
		return;
	}
	for (size_t i = 0; i < nt; i++) {
		uint64_t b = wex_dtype_size(t[i].dtype);

		for (uint32_t d = 0; d < t[i].ndim; d++)
			b *= t[i].shape[d];
		CHECK(t[i].begin <= t[i].end && t[i].end <= data && t[i].end - t[i].begin == b,
		      "accepted tensor %s [%llu,%llu) of %llu bytes in %llu: %.*s", t[i].name,
		      (unsigned long long)t[i].begin, (unsigned long long)t[i].end,
		      (unsigned long long)b, (unsigned long long)data, (int)len, mut);
	}
	free(t);
}

int main(int argc, char **argv)
{
	double secs = argc > 1 ? atof(argv[1]) : 3.0, t0 = now();
	int checked = 0, cases = 0, st = 0;

	rs = argc > 2 ? strtoull(argv[2], NULL, 0) : 20240601;
	adapters_setup();
	while (now() - t0 < secs) {
		char cfg[2048];

		snprintf(cfg, sizeof(cfg), "%s", bases[rnd(3)]);
		for (unsigned i = rnd(3); i > 0; i--)
			mutate_config(cfg, sizeof(cfg));
		if (getenv("PT_VERBOSE"))
			fprintf(stderr, "config %s\n", cfg);
		config_case(cfg, NULL, &checked);
		adapters_case(&checked);
		cases += 2;
		for (int i = 0; i < 50; i++, st++)
			st_case();
	}
	adapters_teardown();
	printf("%d config cases (%d planned and verified), %d safetensors headers\n", cases, checked,
	       st);
	return T_PASS;
}
