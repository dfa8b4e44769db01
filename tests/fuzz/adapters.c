/* SPDX-License-Identifier: MIT */
/*
 * adapters.c - fuzzes the adapter files `wexctl plan` and `wexctl convert`
 * read (adapters/families/NAME.json and adapters/engines/NAME.json: a user's
 * --adapters or $WEX_ADAPTERS directory, or a damaged install), with the
 * expressions, templates and rules in them.  A copy of the source tree's
 * adapters/ is made once; for each input one of its files is replaced:
 *
 *  byte 0: the file (mod 9: the engines, then the families);
 *  byte 1: the engine of the layout (mod 6; the file's own when it is an
 *          engine) and, divided by 6, the model (mod 3: a small qwen2,
 *          qwen3_moe or deepseek_v3 config.json);
 *  then the layout's parameters ("tp=2,pp=1") up to a newline, and the
 *  file's new text after it.
 *
 * A refusal must say why.  A rank layout accepted must hold together as
 * model_config.c checks (pieces within their physical tensor's bytes and
 * passing wex__tensor_check, sizes that are shape times dtype size, a
 * total that is their sum); the canonical tensors must be too.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fuzz_layout.h"

#define WORLD_LIMIT 4096
#define TENSOR_LIMIT 4096

static const char *const files[] = {
	"engines/fsdp", "engines/hf", "engines/megatron", "engines/megatron_grouped",
	"engines/sglang", "engines/vllm", "families/llama", "families/moe", "families/deepseek_v3",
};
#define NFILES (sizeof(files) / sizeof(files[0]))
#define NENGINES 6

static const char *const configs[] = {
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

static char dir[] = "/tmp/wex-fuzz-adapters-XXXXXX";
static char *orig[NFILES];
static size_t orig_len[NFILES];

static void put(size_t f, const void *data, size_t size)
{
	char path[128];
	int fd;

	snprintf(path, sizeof(path), "%s/%s.json", dir, files[f]);
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	FZ_ASSERT(fd >= 0, "%s: %s", path, strerror(errno));
	FZ_ASSERT(write(fd, data, size) == (ssize_t)size, "%s: write", path);
	close(fd);
}

static void cleanup(void)
{
	char path[128];

	for (size_t f = 0; f < NFILES; f++) {
		snprintf(path, sizeof(path), "%s/%s.json", dir, files[f]);
		unlink(path);
		free(orig[f]);
	}
	snprintf(path, sizeof(path), "%s/engines", dir);
	rmdir(path);
	snprintf(path, sizeof(path), "%s/families", dir);
	rmdir(path);
	rmdir(dir);
}

/* The source tree's adapters, copied to dir. */
static void setup(void)
{
	char path[4200];

	FZ_ASSERT(mkdtemp(dir), "mkdtemp: %s", strerror(errno));
	snprintf(path, sizeof(path), "%s/engines", dir);
	FZ_ASSERT(mkdir(path, 0700) == 0, "%s: %s", path, strerror(errno));
	snprintf(path, sizeof(path), "%s/families", dir);
	FZ_ASSERT(mkdir(path, 0700) == 0, "%s: %s", path, strerror(errno));
	atexit(cleanup);
	for (size_t f = 0; f < NFILES; f++) {
		FILE *in;
		long n;

		snprintf(path, sizeof(path), "%s/%s.json", WEX_FUZZ_ADAPTERS, files[f]);
		in = fopen(path, "rb");
		FZ_ASSERT(in, "%s: %s", path, strerror(errno));
		FZ_ASSERT(fseek(in, 0, SEEK_END) == 0 && (n = ftell(in)) >= 0 &&
				  fseek(in, 0, SEEK_SET) == 0,
			  "%s: cannot size it", path);
		orig[f] = malloc((size_t)n + 1);
		FZ_ASSERT(orig[f] && fread(orig[f], 1, (size_t)n, in) == (size_t)n, "%s: read", path);
		orig_len[f] = (size_t)n;
		fclose(in);
		put(f, orig[f], orig_len[f]);
	}
}

static void check_rank(const struct wex_model *m, const struct wex_layout_spec *spec,
		       uint32_t rank)
{
	struct wex_rank_layout l;
	char err[512] = "";
	uint64_t total = 0;
	int ret;

	ret = wex__layout_rank(m, spec, rank, &l, err, sizeof(err));
	if (ret < 0) {
		FZ_ASSERT(err[0], "rank %u refused without a reason (%d)", rank, ret);
		return;
	}
	for (size_t i = 0; i < l.nt; i++)
		fz_check_layout_tensor(&l, i, &total);
	FZ_ASSERT(total == l.total_bytes, "total_bytes %llu, tensors hold %llu",
		  (unsigned long long)l.total_bytes, (unsigned long long)total);
	wex__rank_layout_free(&l);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static int init;
	struct wex_layout_spec spec;
	struct wex_model *m = NULL;
	struct wex_tensor *ct = NULL;
	char *s, *nl, layout[300], err[512] = "";
	size_t f, n = 0;
	uint32_t world = 0;
	int64_t layers, nexp;
	int ret;

	if (!init) {
		setup();
		init = 1;
	}
	if (size < 2)
		return 0;
	s = fz_strdup(data + 2, size - 2);
	nl = strchr(s, '\n');
	if (!nl)
		goto out;
	*nl = '\0';
	f = data[0] % NFILES;
	put(f, nl + 1, size - 2 - (size_t)(nl + 1 - s));
	ret = wex__model_from_text(configs[data[1] / NENGINES % 3], dir, &m, err, sizeof(err));
	if (ret < 0) {
		FZ_ASSERT(err[0], "model refused without a reason (%d)", ret);
		goto restore;
	}
	layers = wex__model_sym(m, "layers");
	nexp = wex__model_sym(m, "nexp");
	if ((layers > 0 ? layers : 1) * (nexp > 0 ? nexp + 1 : 1) > TENSOR_LIMIT)
		goto restore;
	ret = wex__model_canonical(m, &ct, &n);
	FZ_ASSERT(ret == 0 || ret == -ENOMEM, "canonical tensors: %d", ret);
	for (size_t i = 0; ret == 0 && i < n; i++)
		FZ_ASSERT(wex__tensor_check(&ct[i], err, sizeof(err)) == 0, "canonical %zu: %s", i,
			  err);
	free(ct);
	snprintf(layout, sizeof(layout), "%s%s%s",
		 files[f < NENGINES ? f : data[1] % NENGINES] + strlen("engines/"), *s ? ":" : "",
		 s);
	if (wex__layout_parse(layout, &spec, err, sizeof(err)) < 0)
		goto restore;
	err[0] = '\0';
	ret = wex__layout_world(m, &spec, &world, err, sizeof(err));
	if (ret < 0) {
		FZ_ASSERT(err[0], "layout %s refused without a reason (%d)", layout, ret);
		goto restore;
	}
	FZ_ASSERT(world >= 1, "layout %s has %u ranks", layout, world);
	if (world > WORLD_LIMIT)
		goto restore;
	check_rank(m, &spec, 0);
	if (world > 1)
		check_rank(m, &spec, world - 1);
restore:
	put(f, orig[f], orig_len[f]);
out:
	wex__model_free(m);
	free(s);
	return 0;
}
