/* SPDX-License-Identifier: MIT */
/*
 * convert.c - proves `wexctl convert` (wexctl_cmd_convert, called directly
 * until wexctl dispatches it) turns a generated tiny Qwen2-like checkpoint
 * in Hugging Face sharded form (two files + model.safetensors.index.json)
 * into megatron tp=2,pp=2 rank files, those into vllm tp=2 rank files, and
 * those back into an hf checkpoint equal byte for byte to the original
 * (and the same from a single .safetensors file through sglang tp=2), an
 * hf target with model.safetensors.index.json and config.json beside it,
 * in model-0000K-of-0000N.safetensors shards under --max-shard-size, read
 * back through its index with a stray file beside it;
 * that `wexctl plan --json` runs on the same config; and that a source
 * missing a tensor is refused.
 * Also a helper for tests/planner/convert_test.sh:
 *   planner_convert gen DIR          writes DIR/config.json and DIR/hf/
 *   planner_convert compare DIR PATH checks PATH (a file, or an hf directory
 *                                    through its index) holds DIR's tensors
 */
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>

#include "ptest.h"
#include "safetensors.h"
#include "wexctl_plan.h"

#define QWEN2 "{\"model_type\":\"qwen2\",\"hidden_size\":32,\"num_hidden_layers\":4," \
	    "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"intermediate_size\":48," \
	    "\"vocab_size\":211,\"tie_word_embeddings\":true,\"torch_dtype\":\"bfloat16\"}"
/* Two dtypes in one model: the router's score-correction bias is F32 in a
 * bf16 DeepSeek-V3 (HF, vLLM, SGLang and Megatron all keep it so). */
#define DSV3 "{\"model_type\":\"deepseek_v3\",\"hidden_size\":16,\"num_hidden_layers\":4," \
	    "\"num_attention_heads\":4,\"intermediate_size\":24,\"moe_intermediate_size\":8," \
	    "\"n_routed_experts\":4,\"n_shared_experts\":1,\"first_k_dense_replace\":1," \
	    "\"q_lora_rank\":12,\"kv_lora_rank\":8,\"qk_nope_head_dim\":4,\"qk_rope_head_dim\":2," \
	    "\"v_head_dim\":4,\"vocab_size\":130,\"torch_dtype\":\"bfloat16\"}"
/* 121 MB of bf16: more than convert may hold in memory (below). */
#define BIG "{\"model_type\":\"qwen2\",\"hidden_size\":1024,\"num_hidden_layers\":4," \
	    "\"num_attention_heads\":8,\"num_key_value_heads\":2,\"intermediate_size\":2816," \
	    "\"vocab_size\":8192,\"tie_word_embeddings\":false,\"torch_dtype\":\"bfloat16\"}"

/* 770 tensors of at most 256 bytes: an index larger than any shard. */
#define MANY "{\"model_type\":\"qwen2\",\"hidden_size\":8,\"num_hidden_layers\":64," \
	     "\"num_attention_heads\":2,\"num_key_value_heads\":1,\"intermediate_size\":8," \
	     "\"vocab_size\":16,\"tie_word_embeddings\":true,\"torch_dtype\":\"bfloat16\"}"

/* The model gen() writes and compare() checks. */
static const char *model_cfg = QWEN2;

static void canon(struct wex_model **m, struct wex_tensor **t, size_t *n)
{
	char err[256];

	CHECK(wex__model_from_text(model_cfg, NULL, m, err, sizeof(err)) == 0, "%s", err);
	CHECK(wex__model_canonical(*m, t, n) == 0, "canonical");
}

static void *values(const struct wex_tensor *t)
{
	uint64_t nb = wex_tensor_nbytes(t);
	unsigned char *b = malloc(nb ? nb : 1);
	struct pt_fill f = { b, pt_name_hash(t->name), wex_dtype_size(t->dtype) };

	CHECK(b, "oom");
	pt_walk(t, pt_fill_one, &f);
	return b;
}

static void gen(const char *dir)
{
	struct wex_model *m;
	struct wex_tensor *t;
	size_t n;
	char path[512], err[256];
	FILE *f;

	canon(&m, &t, &n);
	mkdir(dir, 0755);
	snprintf(path, sizeof(path), "%s/config.json", dir);
	f = fopen(path, "w");
	CHECK(f, "%s", path);
	fprintf(f, "%s\n", model_cfg);
	fclose(f);
	snprintf(path, sizeof(path), "%s/hf", dir);
	mkdir(path, 0755);
	struct wex_st_tensor *st = calloc(n, sizeof(*st));
	for (size_t i = 0; i < n; i++) {
		snprintf(st[i].name, sizeof(st[i].name), "%s", t[i].name);
		st[i].dtype = t[i].dtype;
		st[i].ndim = t[i].ndim;
		memcpy(st[i].shape, t[i].shape, sizeof(st[i].shape));
		st[i].data = values(&t[i]);
	}
	size_t half = n / 2;
	snprintf(path, sizeof(path), "%s/hf/model-00001-of-00002.safetensors", dir);
	CHECK(wex__st_write(path, st, half, err, sizeof(err)) == 0, "%s", err);
	snprintf(path, sizeof(path), "%s/hf/model-00002-of-00002.safetensors", dir);
	CHECK(wex__st_write(path, st + half, n - half, err, sizeof(err)) == 0, "%s", err);
	snprintf(path, sizeof(path), "%s/hf/model.safetensors.index.json", dir);
	f = fopen(path, "w");
	CHECK(f, "%s", path);
	fprintf(f, "{\"metadata\":{},\"weight_map\":{");
	for (size_t i = 0; i < n; i++)
		fprintf(f, "%s\"%s\":\"model-0000%d-of-00002.safetensors\"", i ? "," : "", t[i].name,
			i < half ? 1 : 2);
	fprintf(f, "}}\n");
	fclose(f);
	for (size_t i = 0; i < n; i++)
		free((void *)(uintptr_t)st[i].data);
	free(st);
	free(t);
	wex__model_free(m);
}

/* Checks that `path` holds the original tensors: a .safetensors file, or
 * an hf directory read through its model.safetensors.index.json (every
 * tensor in the file the index names, every file's tensors in the index,
 * total_size their bytes), or without one its model.safetensors, as
 * save_pretrained writes one file. */
static int compare(const char *path)
{
	struct wex_model *m;
	struct wex_tensor *t;
	struct wex_st_file f[64];
	char names[64][128], file[512], err[512];
	json_t *idx = NULL, *map = NULL;
	size_t n, nf = 0, held = 0;
	uint64_t bytes = 0;
	struct stat st;
	int bad = 0;

	canon(&m, &t, &n);
	CHECK(stat(path, &st) == 0, "%s: missing", path);
	if (S_ISDIR(st.st_mode)) {
		json_error_t je;

		snprintf(file, sizeof(file), "%s/model.safetensors.index.json", path);
		if (access(file, F_OK) == 0) {
			idx = json_load_file(file, 0, &je);
			CHECK(idx, "%s: %s", file, je.text);
			map = json_object_get(idx, "weight_map");
			CHECK(json_object_size(map) == n, "%s names %zu tensors, the model has %zu",
			      file, json_object_size(map), n);
		} else {
			snprintf(file, sizeof(file), "%s/model.safetensors", path);
			CHECK(wex__st_open(file, &f[0], err, sizeof(err)) == 0, "%s", err);
			snprintf(names[nf++], sizeof(names[0]), "model.safetensors");
		}
	} else {
		CHECK(wex__st_open(path, &f[0], err, sizeof(err)) == 0, "%s", err);
		snprintf(names[nf++], sizeof(names[0]), "%s", path);
	}
	for (size_t i = 0; i < n; i++) {
		const struct wex_st_tensor *x = NULL;
		void *want = values(&t[i]);
		size_t k = 0;

		if (map) {
			const char *fn = json_string_value(json_object_get(map, t[i].name));

			CHECK(fn && !strchr(fn, '/'), "%s: the index names no file for %s", path, t[i].name);
			while (k < nf && strcmp(names[k], fn))
				k++;
			if (k == nf) {
				CHECK(nf < 64, "too many files");
				snprintf(file, sizeof(file), "%s/%s", path, fn);
				CHECK(wex__st_open(file, &f[nf], err, sizeof(err)) == 0, "%s", err);
				snprintf(names[nf++], sizeof(names[0]), "%s", fn);
			}
		}
		x = wex__st_find(&f[k], t[i].name);
		if (!x || x->dtype != t[i].dtype || x->end - x->begin != wex_tensor_nbytes(&t[i]) ||
		    memcmp(x->data, want, wex_tensor_nbytes(&t[i]))) {
			fprintf(stderr, "%s: %s differs from the original\n", path, t[i].name);
			bad++;
		}
		bytes += wex_tensor_nbytes(&t[i]);
		free(want);
	}
	for (size_t k = 0; k < nf; k++) {
		held += f[k].n;
		wex__st_close(&f[k]);
	}
	CHECK(held == n, "%s: its files hold %zu tensors, the model has %zu", path, held, n);
	if (idx)
		CHECK(json_integer_value(json_object_get(json_object_get(idx, "metadata"), "total_size")) ==
			      (json_int_t)bytes, "%s: index total_size is not the %llu bytes of the tensors",
		      path, (unsigned long long)bytes);
	json_decref(idx);
	free(t);
	wex__model_free(m);
	return bad ? T_FAIL : T_PASS;
}

#if !defined(__SANITIZE_ADDRESS__)
/* VmData of /proc/self/status (the private writable memory RLIMIT_DATA
 * counts), in bytes. */
static uint64_t vm_data(void)
{
	FILE *f = fopen("/proc/self/status", "r");
	char line[256];
	unsigned long long kb = 0;

	CHECK(f, "/proc/self/status");
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "VmData: %llu kB", &kb) == 1)
			break;
	fclose(f);
	CHECK(kb, "no VmData in /proc/self/status");
	return kb << 10;
}
#endif

/* dir/sub gets a generated checkpoint of the model `text` (model_cfg from
 * now on); cfg and in (len bytes each) its config.json and hf directory. */
static void model_dir(const char *dir, const char *sub, const char *text, char *cfg, char *in,
		      size_t len)
{
	char path[300];

	model_cfg = text;
	snprintf(path, sizeof(path), "%s/%s", dir, sub);
	gen(path);
	snprintf(cfg, len, "%s/%s/config.json", dir, sub);
	snprintf(in, len, "%s/%s/hf", dir, sub);
}

/* Runs fn (wexctl's plan or convert) with an option and its value
 * (opt NULL: none); with out NULL, --json instead of IN OUTDIR. */
static int run_opt(int (*fn)(int, char **), const char *a0, const char *cfg, const char *from,
		   const char *to, const char *in, const char *out, const char *opt, const char *val)
{
	char *argv[14];
	int argc = 0;

	argv[argc++] = (char *)a0;
	argv[argc++] = "--config";
	argv[argc++] = (char *)cfg;
	argv[argc++] = "--from";
	argv[argc++] = (char *)from;
	argv[argc++] = "--to";
	argv[argc++] = (char *)to;
	if (opt) {
		argv[argc++] = (char *)opt;
		argv[argc++] = (char *)val;
	}
	if (in)
		argv[argc++] = (char *)in;
	if (out)
		argv[argc++] = (char *)out;
	else
		argv[argc++] = "--json";
	argv[argc] = NULL;
	return fn(argc, argv);
}

static int run(int (*fn)(int, char **), const char *a0, const char *cfg, const char *from,
	       const char *to, const char *in, const char *out)
{
	return run_opt(fn, a0, cfg, from, to, in, out, NULL, NULL);
}

/* Converts hf checkpoint `in` to layout `lay` in `mid` and back to hf in
 * `back`: T_PASS when every byte came back (compare). */
static int there_and_back(const char *cfg, const char *lay, const char *in, const char *mid,
			  const char *back)
{
	if (run(wexctl_cmd_convert, "convert", cfg, "hf", lay, in, mid) != 0 ||
	    run(wexctl_cmd_convert, "convert", cfg, lay, "hf", mid, back) != 0)
		return T_FAIL;
	return compare(back);
}

/* run_opt with stderr captured into buf (NUL-terminated). */
static int run_err(char *buf, size_t len, int (*fn)(int, char **), const char *a0, const char *cfg,
		   const char *from, const char *to, const char *in, const char *out, const char *opt,
		   const char *val)
{
	FILE *tmp = tmpfile();
	int saved, rc;
	size_t n;

	CHECK(tmp, "tmpfile");
	fflush(stderr);
	saved = dup(2);
	CHECK(saved >= 0 && dup2(fileno(tmp), 2) == 2, "dup2");
	rc = run_opt(fn, a0, cfg, from, to, in, out, opt, val);
	fflush(stderr);
	CHECK(dup2(saved, 2) == 2, "dup2 back");
	close(saved);
	rewind(tmp);
	n = fread(buf, 1, len - 1, tmp);
	buf[n] = '\0';
	fclose(tmp);
	fputs(buf, stderr);
	return rc;
}

int main(int argc, char **argv)
{
	char dir[] = "/tmp/wex-convert-XXXXXX", cfg[256], a[256], b[256], c[256], in[256], file[300];

	if (argc == 3 && !strcmp(argv[1], "gen")) {
		gen(argv[2]);
		return T_PASS;
	}
	if (argc == 4 && !strcmp(argv[1], "compare")) {
		snprintf(file, sizeof(file), "%s", argv[3]);
		return compare(file);
	}
	CHECK(mkdtemp(dir), "mkdtemp");
	gen(dir);
	snprintf(cfg, sizeof(cfg), "%s/config.json", dir);
	snprintf(in, sizeof(in), "%s/hf", dir);
	snprintf(a, sizeof(a), "%s/megatron", dir);
	snprintf(b, sizeof(b), "%s/vllm", dir);
	snprintf(c, sizeof(c), "%s/back", dir);
	CHECK(run(wexctl_cmd_convert, "convert", cfg, "hf", "megatron:tp=2,pp=2", in, a) == 0, "hf -> megatron");
	snprintf(file, sizeof(file), "%s/rank-3.safetensors", a);
	struct wex_st_file f;
	char err[512];
	CHECK(wex__st_open(file, &f, err, sizeof(err)) == 0, "%s", err);
	CHECK(wex__st_find(&f, "decoder.layers.1.self_attention.linear_qkv.weight") &&
		      wex__st_find(&f, "output_layer.weight") && wex__st_find(&f, "decoder.final_layernorm.weight"),
	      "megatron rank 3 lacks its engine names");
	wex__st_close(&f);
	CHECK(run(wexctl_cmd_convert, "convert", cfg, "megatron:tp=2,pp=2", "vllm:tp=2", a, b) == 0, "megatron -> vllm");
	CHECK(run(wexctl_cmd_convert, "convert", cfg, "vllm:tp=2", "hf", b, c) == 0, "vllm -> hf");
	snprintf(file, sizeof(file), "%s/model.safetensors", c);
	CHECK(compare(file) == T_PASS, "round trip through convert changed bytes");
	{
		/* An hf target reads as a Hugging Face checkpoint, as
		 * save_pretrained writes one file: model.safetensors with no
		 * index, and config.json; read back as a directory too. */
		json_error_t je;
		json_t *idx;
		char path[300];

		snprintf(path, sizeof(path), "%s/model.safetensors.index.json", c);
		CHECK(access(path, F_OK) != 0, "%s written beside a single model.safetensors", path);
		CHECK(compare(c) == T_PASS, "%s read as a directory differs from the original", c);
		snprintf(path, sizeof(path), "%s/config.json", c);
		idx = json_load_file(path, 0, &je);
		CHECK(idx && !strcmp(json_string_value(json_object_get(idx, "model_type")), "qwen2"),
		      "%s is not the model's config", path);
		json_decref(idx);
	}
	/* A single-file checkpoint as input (the one just written). */
	snprintf(a, sizeof(a), "%s/single", dir);
	CHECK(there_and_back(cfg, "sglang:tp=2", file, a, c) == T_PASS,
	      "single file -> sglang -> hf changed bytes");
	/* Megatron's virtual pipeline through the CLI: 4 layers, pp=2 with
	 * 2 chunks each, rank 0 (pp rank 0) holds layer 0 as model0's layer 0
	 * and layer 2 as model1's, the embedding in model0 only. */
	{
		struct wex_st_file vf;
		char path[300];

		snprintf(a, sizeof(a), "%s/vpp", dir);
		CHECK(there_and_back(cfg, "megatron:tp=2,pp=2,vpp=2", file, a, c) == T_PASS,
		      "hf -> megatron vpp=2 -> hf changed bytes");
		snprintf(path, sizeof(path), "%s/rank-0.safetensors", a);
		CHECK(wex__st_open(path, &vf, err, sizeof(err)) == 0, "%s", err);
		CHECK(wex__st_find(&vf, "model0.decoder.layers.0.self_attention.linear_qkv.weight") &&
			      wex__st_find(&vf, "model1.decoder.layers.0.self_attention.linear_qkv.weight") &&
			      !wex__st_find(&vf, "model0.decoder.layers.1.self_attention.linear_qkv.weight") &&
			      wex__st_find(&vf, "model0.embedding.word_embeddings.weight") &&
			      !wex__st_find(&vf, "model1.embedding.word_embeddings.weight"),
		      "megatron vpp=2 rank 0: not model0/model1 chunks of one layer each");
		wex__st_close(&vf);
	}
	/* --to hf shards as transformers' save_pretrained does: files
	 * model-0000K-of-0000N.safetensors of at most --max-shard-size bytes
	 * of tensors each (a larger tensor alone in its file), in the
	 * family's order, the index naming each tensor's file. */
	{
		char sh[256], msg[4096], path[1024];
		unsigned nsh = 0;
		DIR *d;
		struct dirent *e;

		snprintf(sh, sizeof(sh), "%s/shards", dir);
		CHECK(run_opt(wexctl_cmd_convert, "convert", cfg, "vllm:tp=2", "hf", b, sh,
			      "--max-shard-size", "8KiB") == 0, "vllm -> hf in 8 KiB shards");
		d = opendir(sh);
		CHECK(d, "%s", sh);
		while ((e = readdir(d))) {
			unsigned k, of;
			char tail[32];

			if (strstr(e->d_name, ".safetensors") &&
			    strcmp(e->d_name, "model.safetensors.index.json")) {
				CHECK(sscanf(e->d_name, "model-%5u-of-%5u%31s", &k, &of, tail) == 3 &&
					      !strcmp(tail, ".safetensors") && k >= 1 && k <= of,
				      "%s: unexpected file %s", sh, e->d_name);
				nsh = of;
			}
		}
		closedir(d);
		CHECK(nsh >= 3, "8 KiB shards of a 100 KB model: %u files", nsh);
		for (unsigned k = 1; k <= nsh; k++) {
			struct wex_st_file sf;
			uint64_t bytes = 0;

			snprintf(path, sizeof(path), "%s/model-%05u-of-%05u.safetensors", sh, k, nsh);
			CHECK(wex__st_open(path, &sf, err, sizeof(err)) == 0, "%s", err);
			for (size_t i = 0; i < sf.n; i++)
				bytes += sf.t[i].end - sf.t[i].begin;
			CHECK(sf.n >= 1 && (bytes <= 8192 || sf.n == 1),
			      "%s: %zu tensors, %llu bytes, over the 8 KiB limit", path, sf.n,
			      (unsigned long long)bytes);
			wex__st_close(&sf);
		}
		CHECK(compare(sh) == T_PASS, "sharded hf checkpoint differs from the original");
		snprintf(path, sizeof(path), "%s/model.safetensors", sh);
		CHECK(access(path, F_OK) != 0, "%s beside the shards", path);
		/* Read back through the index, a stray file beside it (an
		 * earlier conversion's rank-0.safetensors, here a vllm rank's)
		 * ignored, as transformers and vLLM ignore it. */
		snprintf(path, sizeof(path), "cp '%s/rank-1.safetensors' '%s/rank-0.safetensors'", b, sh);
		CHECK(system(path) == 0, "%s", path);
		snprintf(a, sizeof(a), "%s/shards-sglang", dir);
		snprintf(path, sizeof(path), "%s/shards-back", dir);
		CHECK(there_and_back(cfg, "sglang:tp=2", sh, a, path) == T_PASS,
		      "sharded hf with a stray rank-0.safetensors -> sglang -> hf changed bytes");
		/* Converted again into the same OUTDIR as one file: an index
		 * is written then (readers would take the old shards without
		 * one), naming only it; the old shards are left, said. */
		CHECK(run_err(msg, sizeof(msg), wexctl_cmd_convert, "convert", cfg, "sglang:tp=2", "hf", a,
			      sh, NULL, NULL) == 0, "sglang -> hf over the shards");
		CHECK(strstr(msg, "not from this conversion") && strstr(msg, "files not from"),
		      "no warning of the earlier shards and the stray in %s: '%s'", sh, msg);
		CHECK(compare(sh) == T_PASS, "hf over the shards differs from the original");
		snprintf(path, sizeof(path), "%s/model.safetensors.index.json", sh);
		CHECK(access(path, F_OK) == 0, "one file over the shards: no index to leave them out");
		/* Shards asked for beside that model.safetensors: refused
		 * before anything is written (transformers' from_pretrained
		 * takes model.safetensors before the index: the old weights). */
		CHECK(run_err(msg, sizeof(msg), wexctl_cmd_convert, "convert", cfg, "vllm:tp=2", "hf", b, sh,
			      "--max-shard-size", "8KiB") == 1 &&
			      strstr(msg, "from_pretrained would load it, not the shards"),
		      "shards beside a model.safetensors not refused: '%s'", msg);
		CHECK(compare(sh) == T_PASS, "a refused sharded convert changed the checkpoint there");
		snprintf(path, sizeof(path), "%s/model.safetensors", sh);
		CHECK(unlink(path) == 0, "unlink %s", path);
		CHECK(run_opt(wexctl_cmd_convert, "convert", cfg, "vllm:tp=2", "hf", b, sh,
			      "--max-shard-size", "8KiB") == 0, "vllm -> hf in 8 KiB shards again");
		/* A sharded convert that fails at its third file (a directory
		 * where that file's temporary goes) removes the two before it
		 * and leaves the checkpoint there whole. */
		snprintf(path, sizeof(path), "%s/model-00003-of-00011.safetensors.partial.tmp.%d", sh,
			 (int)getpid());
		CHECK(mkdir(path, 0755) == 0, "mkdir %s", path);
		CHECK(run_err(msg, sizeof(msg), wexctl_cmd_convert, "convert", cfg, "vllm:tp=2", "hf", b, sh,
			      "--max-shard-size", "8KiB") == 1 && strstr(msg, "model-00003-of-00011"),
		      "a convert that cannot write its third file did not fail naming it: '%s'", msg);
		CHECK(rmdir(path) == 0, "rmdir %s", path);
		d = opendir(sh);
		CHECK(d, "%s", sh);
		while ((e = readdir(d)))
			CHECK(!strstr(e->d_name, ".partial") && !strstr(e->d_name, ".tmp."),
			      "a failed convert left %s/%s", sh, e->d_name);
		closedir(d);
		CHECK(compare(sh) == T_PASS, "a failed sharded convert changed the checkpoint there");
		/* An earlier index naming these shards' files with another
		 * split (an earlier conversion's) is removed before they are
		 * renamed into place: a convert stopped after the renames
		 * (killed) never leaves it describing the new shards (it was
		 * replaced only after them).  One whose index cannot be
		 * written (a directory where the index's temporary goes) fails
		 * before any shard is renamed: the earlier index and shards
		 * stay as they were. */
		{
			char tmp[1100], *before, *after;
			json_error_t je;
			json_t *idx;
			struct stat st1, st2;

			snprintf(path, sizeof(path), "%s/model.safetensors.index.json", sh);
			idx = json_load_file(path, 0, &je);
			CHECK(idx, "%s: %s", path, je.text);
			CHECK(json_object_set_new(json_object_get(idx, "weight_map"), "model.embed_tokens.weight",
						  json_string("model-00011-of-00011.safetensors")) == 0 &&
				      json_dump_file(idx, path, 0) == 0,
			      "rewriting %s", path);
			json_decref(idx);
			idx = json_load_file(path, 0, &je);
			before = json_dumps(idx, JSON_SORT_KEYS);
			json_decref(idx);
			snprintf(tmp, sizeof(tmp), "%s/model-00001-of-00011.safetensors", sh);
			CHECK(before && stat(tmp, &st1) == 0, "%s", tmp);
			snprintf(tmp, sizeof(tmp), "%s.tmp.%d", path, (int)getpid());
			CHECK(mkdir(tmp, 0755) == 0, "mkdir %s", tmp);
			CHECK(run_err(msg, sizeof(msg), wexctl_cmd_convert, "convert", cfg, "vllm:tp=2", "hf", b,
				      sh, "--max-shard-size", "8KiB") == 1 &&
				      strstr(msg, "model.safetensors.index.json.tmp.") &&
				      strstr(msg, "Is a directory"),
			      "a convert that cannot write its index did not fail naming it: '%s'", msg);
			CHECK(rmdir(tmp) == 0, "rmdir %s", tmp);
			idx = json_load_file(path, 0, &je);
			after = json_dumps(idx, JSON_SORT_KEYS);
			json_decref(idx);
			CHECK(after && !strcmp(before, after),
			      "a convert that failed writing its index changed the earlier one");
			free(before);
			free(after);
			snprintf(tmp, sizeof(tmp), "%s/model-00001-of-00011.safetensors", sh);
			CHECK(stat(tmp, &st2) == 0 && st1.st_ino == st2.st_ino,
			      "a convert that failed writing its index renamed its shards into place");
			d = opendir(sh);
			CHECK(d, "%s", sh);
			while ((e = readdir(d)))
				CHECK(!strstr(e->d_name, ".partial") && !strstr(e->d_name, ".tmp."),
				      "a convert that failed writing its index left %s/%s", sh, e->d_name);
			closedir(d);
			CHECK(run_opt(wexctl_cmd_convert, "convert", cfg, "vllm:tp=2", "hf", b, sh,
				      "--max-shard-size", "8KiB") == 0 && compare(sh) == T_PASS,
			      "vllm -> hf in 8 KiB shards after a failed index");
		}
	}
	/* --max-shard-size: a size, for --to hf, of convert only. */
	{
		static const char *bad[] = { "0", "", "8XB", "-1", "8 KB", "99999999999999999999" };
		char msg[4096];

		for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
			CHECK(run_err(msg, sizeof(msg), wexctl_cmd_convert, "convert", cfg, "vllm:tp=2", "hf",
				      b, c, "--max-shard-size", bad[i]) == 2 &&
				      strstr(msg, "bad --max-shard-size"),
			      "--max-shard-size '%s' not refused: '%s'", bad[i], msg);
		}
		/* A lower-case b after a decimal unit counts bits, as
		 * transformers reads it: 80Kb is 10,000 bytes a file, 80KB
		 * 80,000 (a 100 KB model: one or two files). */
		{
			char d80[256];
			unsigned n80 = 0;
			DIR *dd;
			struct dirent *de;

			snprintf(d80, sizeof(d80), "%s/shards-80Kb", dir);
			CHECK(run_opt(wexctl_cmd_convert, "convert", cfg, "vllm:tp=2", "hf", b, d80,
				      "--max-shard-size", "80Kb") == 0, "vllm -> hf in 80Kb shards");
			dd = opendir(d80);
			CHECK(dd, "%s", d80);
			while ((de = readdir(dd)))
				n80 += !strncmp(de->d_name, "model-", 6);
			closedir(dd);
			CHECK(n80 >= 6, "--max-shard-size 80Kb (10,000 bytes) gave %u files of a 100 KB model",
			      n80);
		}
		CHECK(run_err(msg, sizeof(msg), wexctl_cmd_convert, "convert", cfg, "hf", "vllm:tp=2", in, b,
			      "--max-shard-size", "5GB") == 2 && strstr(msg, "applies to --to hf only"),
		      "--max-shard-size with --to vllm not refused: '%s'", msg);
		CHECK(run_err(msg, sizeof(msg), wexctl_cmd_plan, "plan", cfg, "hf", "vllm:tp=2", NULL, NULL,
			      "--max-shard-size", "5GB") == 2 && strstr(msg, "of wexctl convert only"),
		      "wexctl plan --max-shard-size not refused: '%s'", msg);
		/* --progress always: a line per rank once its files are on
		 * disk; auto (the default) into a file, and never: none. */
		{
			static const char *const quiet[] = { "auto", "never", NULL };
			char pr[300];
			const char *p;
			int lines = 0;

			snprintf(pr, sizeof(pr), "%s/progress", dir);
			CHECK(run_err(msg, sizeof(msg), wexctl_cmd_convert, "convert", cfg, "hf",
				      "vllm:tp=2", in, pr, "--progress", "always") == 0,
			      "--progress always: '%s'", msg);
			for (p = msg; (p = strstr(p, "wexctl convert: rank ")); p++)
				lines++;
			/* Ranks numbered from 0, as their files are. */
			CHECK(strstr(msg, "rank 0 of 2: ") && strstr(msg, "rank 1 of 2: ") &&
				      strstr(msg, "KiB in 1 file on disk") && lines == 2,
			      "--progress always into a file: not one line per rank: '%s'", msg);
			for (int i = 0; quiet[i]; i++) {
				CHECK(run_err(msg, sizeof(msg), wexctl_cmd_convert, "convert", cfg, "hf",
					      "vllm:tp=2", in, pr, quiet[i] == quiet[0] ? NULL : "--progress",
					      quiet[i]) == 0 && !strstr(msg, "wexctl convert: rank"),
				      "--progress %s into a file showed progress: '%s'", quiet[i], msg);
			}
			CHECK(run_err(msg, sizeof(msg), wexctl_cmd_convert, "convert", cfg, "hf",
				      "vllm:tp=2", in, pr, "--progress", "sometimes") == 2 &&
				      strstr(msg, "bad --progress 'sometimes' (auto, always or never)"),
			      "--progress sometimes not refused: '%s'", msg);
			CHECK(run_err(msg, sizeof(msg), wexctl_cmd_plan, "plan", cfg, "hf", "vllm:tp=2",
				      NULL, NULL, "--progress", "always") == 2 &&
				      strstr(msg, "--progress is an option of wexctl convert only"),
			      "wexctl plan --progress not refused: '%s'", msg);
		}
		/* Every shard of a rank is open at once: the soft limit on
		 * open files is raised to what it takes; past the hard limit
		 * the convert is refused before it writes. */
		{
			struct rlimit old_lim, lim;
			char sh[300];
			pid_t pid;
			int st = 0;

			snprintf(sh, sizeof(sh), "%s/shards-nofile", dir);
			CHECK(getrlimit(RLIMIT_NOFILE, &old_lim) == 0, "getrlimit");
			lim = old_lim;
			lim.rlim_cur = 24;
			CHECK(setrlimit(RLIMIT_NOFILE, &lim) == 0, "setrlimit");
			CHECK(run_opt(wexctl_cmd_convert, "convert", cfg, "vllm:tp=2", "hf", b, sh,
				      "--max-shard-size", "8KiB") == 0,
			      "11 shards with a soft limit of 24 open files");
			CHECK(setrlimit(RLIMIT_NOFILE, &old_lim) == 0, "setrlimit");
			CHECK(compare(sh) == T_PASS, "shards written under a raised limit differ");
			fflush(stdout);
			fflush(stderr);
			pid = fork();
			CHECK(pid >= 0, "fork");
			if (pid == 0) {
				lim.rlim_cur = lim.rlim_max = 24;
				CHECK(setrlimit(RLIMIT_NOFILE, &lim) == 0, "setrlimit");
				CHECK(run_err(msg, sizeof(msg), wexctl_cmd_convert, "convert", cfg, "vllm:tp=2",
					      "hf", b, sh, "--max-shard-size", "4KiB") == 1 &&
					      strstr(msg, "ulimit -n"),
				      "shards past a hard limit of 24 open files not refused: '%s'", msg);
				_exit(T_PASS);
			}
			CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == T_PASS,
			      "open-files limit check failed (status %#x)", st);
			CHECK(compare(sh) == T_PASS, "a refused convert changed the shards there");
		}
		CHECK(run_err(msg, sizeof(msg), wexctl_cmd_convert, "convert", cfg, "vllm:tp=2", "hf:dp=2",
			      b, c, NULL, NULL) == 1 && strstr(msg, "one copy of the model"),
		      "--to hf:dp=2 not refused: '%s'", msg);
	}
	CHECK(run(wexctl_cmd_plan, "plan", cfg, "megatron:tp=2,pp=2,dp=2", "vllm:tp=2", NULL, NULL) == 0, "plan");
	/* A convert that fails half way (here: rank 0 fits under the file
	 * size limit, rank 1 does not) leaves an earlier conversion in the
	 * same OUTDIR whole: never its rank 1 beside a new rank 0, which
	 * would look complete and mix two layouts. */
	{
		struct rlimit old_lim, lim;
		char lay[256];

		snprintf(a, sizeof(a), "%s/staged", dir);
		CHECK(run(wexctl_cmd_convert, "convert", cfg, "hf", "megatron:tp=1,pp=2,first=3,last=1", in,
			  a) == 0, "hf -> megatron first=3");
		CHECK(getrlimit(RLIMIT_FSIZE, &old_lim) == 0, "getrlimit");
		lim = old_lim;
		lim.rlim_cur = 48 << 10; /* rank 0 of first=1 is 33 KB, rank 1 66 KB */
		signal(SIGXFSZ, SIG_IGN);
		CHECK(setrlimit(RLIMIT_FSIZE, &lim) == 0, "setrlimit");
		int rc = run(wexctl_cmd_convert, "convert", cfg, "hf", "megatron:tp=1,pp=2,first=1,last=3", in, a);
		CHECK(setrlimit(RLIMIT_FSIZE, &old_lim) == 0, "setrlimit");
		signal(SIGXFSZ, SIG_DFL);
		CHECK(rc != 0, "a convert past the file size limit succeeded");
		snprintf(lay, sizeof(lay), "%s/staged/back", dir);
		CHECK(run(wexctl_cmd_convert, "convert", cfg, "megatron:tp=1,pp=2,first=3,last=1", "hf", a, lay) == 0,
		      "the earlier conversion no longer reads as its layout after a failed convert into it");
		snprintf(file, sizeof(file), "%s/model.safetensors", lay);
		CHECK(compare(file) == T_PASS, "a failed convert changed the earlier conversion's bytes");
		snprintf(file, sizeof(file), "%s/rank-0.safetensors.partial", a);
		CHECK(access(file, F_OK) != 0, "a failed convert left %s", file);
	}
	/* A source that lacks a tensor: vllm rank files read as megatron. */
	CHECK(run(wexctl_cmd_convert, "convert", cfg, "megatron:tp=2", "hf", b, c) != 0, "wrong source accepted");
	/* DeepSeek-V3 with its F32 router bias among bf16 weights, through
	 * Megatron tp=2,pp=2 (ep=2, etp=1) and vLLM tp=2 and back, and through
	 * SGLang tp=2 with the shared expert fused. */
	model_dir(dir, "ds", DSV3, cfg, in, sizeof(cfg));
	snprintf(b, sizeof(b), "%s/ds/megatron", dir);
	snprintf(c, sizeof(c), "%s/ds/vllm", dir);
	CHECK(run(wexctl_cmd_convert, "convert", cfg, "hf", "megatron:tp=2,pp=2,ep=2,etp=1", in, b) == 0,
	      "deepseek hf -> megatron");
	snprintf(file, sizeof(file), "%s/rank-2.safetensors", b);
	CHECK(wex__st_open(file, &f, err, sizeof(err)) == 0, "%s", err);
	{
		const struct wex_st_tensor *x = wex__st_find(&f, "decoder.layers.0.mlp.router.expert_bias");

		CHECK(x && x->dtype == WEX_DT_F32 && x->end - x->begin == 16,
		      "megatron rank 2 expert_bias missing or not 4 F32 values");
	}
	wex__st_close(&f);
	CHECK(run(wexctl_cmd_convert, "convert", cfg, "megatron:tp=2,pp=2,ep=2,etp=1", "vllm:tp=2", b, c) == 0,
	      "deepseek megatron -> vllm");
	snprintf(b, sizeof(b), "%s/ds/back", dir);
	CHECK(run(wexctl_cmd_convert, "convert", cfg, "vllm:tp=2", "hf", c, b) == 0, "deepseek vllm -> hf");
	snprintf(file, sizeof(file), "%s/model.safetensors", b);
	CHECK(compare(file) == T_PASS, "deepseek round trip through convert changed bytes");
	/* SGLang with its shared expert fused into the routed ones. */
	snprintf(c, sizeof(c), "%s/ds/sglang", dir);
	snprintf(b, sizeof(b), "%s/ds/back2", dir);
	CHECK(there_and_back(cfg, "sglang:tp=2,fuse_shared=1", file, c, b) == T_PASS,
	      "deepseek hf -> sglang fuse_shared -> hf changed bytes");
	/* A rank is written straight into its mapped output file, never held
	 * in memory: 121 MB converted there and back with 40 MB of private
	 * memory allowed (RLIMIT_DATA; file mappings do not count).  Under
	 * AddressSanitizer the allocator's own mappings count: not run. */
#if defined(__SANITIZE_ADDRESS__)
	printf("memory bound of convert: not checked under AddressSanitizer (its mappings count "
	       "against RLIMIT_DATA)\n");
#else
	model_dir(dir, "big", BIG, cfg, in, sizeof(cfg));
	snprintf(b, sizeof(b), "%s/big/vllm", dir);
	snprintf(c, sizeof(c), "%s/big/back", dir);
	fflush(stdout);
	{
		pid_t pid = fork();
		int st = 0;

		CHECK(pid >= 0, "fork");
		if (pid == 0) {
			struct rlimit lim;
			uint64_t base = vm_data();

			lim.rlim_cur = lim.rlim_max = base + (40u << 20);
			CHECK(setrlimit(RLIMIT_DATA, &lim) == 0, "setrlimit");
			CHECK(run(wexctl_cmd_convert, "convert", cfg, "hf", "vllm:tp=1", in, b) == 0,
			      "121 MB hf -> vllm with %llu MB of private memory",
			      (unsigned long long)(lim.rlim_cur >> 20));
			CHECK(run(wexctl_cmd_convert, "convert", cfg, "vllm:tp=1", "hf", b, c) == 0,
			      "121 MB vllm -> hf under the same limit");
			printf("121 MB converted twice with VmData limited to %llu MB (VmData at the end %llu MB)\n",
			       (unsigned long long)(lim.rlim_cur >> 20),
			       (unsigned long long)(vm_data() >> 20));
			fflush(stdout);
			_exit(T_PASS);
		}
		CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == T_PASS,
		      "convert under a memory limit failed (status %#x)", st);
	}
	snprintf(file, sizeof(file), "%s/model.safetensors", c);
	CHECK(compare(file) == T_PASS, "big round trip under a memory limit changed bytes");
#endif
	/* --to hf whose index cannot be written (a full disk; here the file
	 * size limit: 770 tensors make a 60 KB index, every shard under 16
	 * KB) fails with nothing of it left in OUTDIR: never its shards
	 * renamed over an earlier conversion's there, with no index. */
	model_dir(dir, "many", MANY, cfg, in, sizeof(cfg));
	snprintf(b, sizeof(b), "%s/many/back", dir);
	CHECK(run_opt(wexctl_cmd_convert, "convert", cfg, "hf", "hf", in, b, "--max-shard-size", "4000") == 0,
	      "many: hf -> hf shards");
	CHECK(compare(b) == T_PASS, "many: hf -> hf shards changed bytes");
	snprintf(c, sizeof(c), "%s/many/new", dir);
	for (int k = 0; k < 2; k++) {
		const char *out = k ? b : c;
		struct rlimit old_lim, lim;
		DIR *d;
		struct dirent *e;
		int rc;

		CHECK(getrlimit(RLIMIT_FSIZE, &old_lim) == 0, "getrlimit");
		lim = old_lim;
		lim.rlim_cur = 32 << 10;
		signal(SIGXFSZ, SIG_IGN);
		CHECK(setrlimit(RLIMIT_FSIZE, &lim) == 0, "setrlimit");
		rc = run_opt(wexctl_cmd_convert, "convert", cfg, "hf", "hf", in, out, "--max-shard-size", "4000");
		CHECK(setrlimit(RLIMIT_FSIZE, &old_lim) == 0, "setrlimit");
		signal(SIGXFSZ, SIG_DFL);
		CHECK(rc == 1, "convert with an index past the file size limit: exit %d, not 1", rc);
		if (k) {
			CHECK(compare(b) == T_PASS, "a convert that failed writing its index changed the "
			      "earlier conversion in its OUTDIR");
			continue;
		}
		d = opendir(out);
		CHECK(d, "%s", out);
		while ((e = readdir(d)))
			CHECK(!strstr(e->d_name, ".safetensors"), "a convert that failed writing its "
			      "index left %s/%s", out, e->d_name);
		closedir(d);
	}
	printf("convert round trip hf -> megatron -> vllm -> hf is byte-identical\n");
	char rm[300];
	snprintf(rm, sizeof(rm), "rm -rf '%s'", dir);
	if (system(rm) != 0)
		fprintf(stderr, "could not remove %s\n", dir);
	return T_PASS;
}
