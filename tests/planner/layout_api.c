/* SPDX-License-Identifier: MIT */
/*
 * layout_api.c - the adaptation layer through libwex's public API
 * (wex_layout_open / wex_layout_rank / wex_layout_close), on the real
 * Qwen2-0.5B config (14 heads, 2 KV heads of 64, hidden 896):
 *  - vllm:tp=2 has 2 ranks; rank 1's qkv_proj is [9*64, 896] bf16 and
 *    holds three pieces: rows [448, 896) of q_proj at byte 0, rows
 *    [64, 128) of k_proj after them, then v_proj's, each with the
 *    physical tensor's index as segment, ptr NULL; the pieces of every
 *    physical tensor lie inside it and name canonical tensors of the hf
 *    layout;
 *  - asking another rank replaces the arrays (ASan checks nothing leaks);
 *  - refused, each saying why: a rank past the world (wex_layout_error),
 *    tp=3 (-WEX_ELAYOUT: "tensor parallel size 3 does not divide ..."), an unknown engine, a
 *    config that does not exist, NULL arguments;
 *  - an engine file that exists but is not JSON is refused with -EINVAL
 *    naming the file and the parse error (it was "unknown engine ... (no
 *    FILE)", naming the file that is there); one that is a directory
 *    says so (it was "'[' or '{' expected near end of file");
 *  - a layout opened with a relative adapters directory lays out its
 *    ranks after the process changed directory, and after its engine
 *    file is gone (wex_layout_rank read it again each call: -ENOENT
 *    "unknown engine").
 */
#include <errno.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ptest.h"
#include "wex.h"

static const struct wex_layout_tensor *find(const struct wex_layout_tensor *t, size_t n,
					    const char *name)
{
	for (size_t i = 0; i < n; i++)
		if (!strcmp(t[i].name, name))
			return &t[i];
	CHECK(0, "no physical tensor %s", name);
	return NULL;
}

static int refused(const char *config, const char *spec, int want, const char *says)
{
	wex_layout_t *l = (wex_layout_t *)1;
	char *err = NULL;
	int ret = wex_layout_open(config, spec, NULL, &l, NULL, &err);

	CHECK(ret == want && err && strstr(err, says), "%s on %s: %d (want %d), '%s' (want '%s')",
	      spec, config, ret, want, err ? err : "(null)", says);
	printf("refused: %s: %s\n", spec, err);
	wex_free(err);
	return 0;
}

int main(void)
{
	const char *src = getenv("WEX_SRC");
	char cfg[512];
	wex_layout_t *l = NULL, *hf = NULL;
	const struct wex_layout_tensor *phys, *hphys, *qkv;
	const struct wex_tensor *pc, *hpc;
	size_t nphys, npc, nh, nhp;
	uint32_t world = 0;
	char *err = NULL;
	int ret;

	CHECK(src, "WEX_SRC unset");
	{
		/* wex_tensor_nbytes saturates (it wrapped: 2^62 x 8 bf16 is
		 * 2^66 bytes, read as 0); an empty box is 0 whatever else. */
		struct wex_tensor t = { .dtype = WEX_DT_BF16, .ndim = 2,
					.extent = { 1ull << 62, 8 } };

		CHECK(wex_tensor_nbytes(&t) == UINT64_MAX, "nbytes %llu",
		      (unsigned long long)wex_tensor_nbytes(&t));
		t.extent[1] = 0;
		CHECK(wex_tensor_nbytes(&t) == 0, "empty box");
		t.extent[0] = 3;
		t.extent[1] = 5;
		CHECK(wex_tensor_nbytes(&t) == 30, "3x5 bf16");
	}
	snprintf(cfg, sizeof(cfg), "%s/tests/data/qwen2-0.5b-config.json", src);
	ret = wex_layout_open(cfg, "vllm:tp=2", NULL, &l, &world, &err);
	CHECK(ret == 0 && world == 2 && !err, "open: %d %s", ret, err ? err : "");
	CHECK(wex_layout_open(cfg, "hf", NULL, &hf, NULL, NULL) == 0, "open hf");
	CHECK(wex_layout_rank(hf, 0, &hphys, &nh, &hpc, &nhp) == 0, "hf rank 0");

	CHECK(wex_layout_rank(l, 0, &phys, &nphys, &pc, &npc) == 0, "rank 0");
	CHECK(wex_layout_rank(l, 1, &phys, &nphys, &pc, &npc) == 0, "rank 1");
	qkv = find(phys, nphys, "model.layers.0.self_attn.qkv_proj.weight");
	CHECK(qkv->dtype == WEX_DT_BF16 && qkv->ndim == 2 && qkv->shape[0] == 9 * 64 &&
		      qkv->shape[1] == 896 && qkv->nbytes == 9 * 64 * 896 * 2 && qkv->npieces == 3,
	      "qkv_proj: dtype %d, [%llu, %llu], %llu bytes, %zu pieces", qkv->dtype,
	      (unsigned long long)qkv->shape[0], (unsigned long long)qkv->shape[1],
	      (unsigned long long)qkv->nbytes, qkv->npieces);
	{
		static const struct { const char *name; uint64_t start, rows, off; } want[3] = {
			{ "model.layers.0.self_attn.q_proj.weight", 448, 448, 0 },
			{ "model.layers.0.self_attn.k_proj.weight", 64, 64, 448ull * 896 * 2 },
			{ "model.layers.0.self_attn.v_proj.weight", 64, 64, 512ull * 896 * 2 },
		};

		for (int i = 0; i < 3; i++) {
			const struct wex_tensor *p = &pc[qkv->first + (size_t)i];

			CHECK(!strcmp(p->name, want[i].name) && p->start[0] == want[i].start &&
				      p->extent[0] == want[i].rows && p->start[1] == 0 &&
				      p->extent[1] == 896 && p->offset == want[i].off &&
				      p->segment == (uint32_t)(qkv - phys) && !p->ptr,
			      "piece %d: %s rows [%llu, +%llu) at byte %llu, segment %u", i, p->name,
			      (unsigned long long)p->start[0], (unsigned long long)p->extent[0],
			      (unsigned long long)p->offset, p->segment);
		}
	}
	for (size_t i = 0; i < nphys; i++)
		for (size_t k = phys[i].first; k < phys[i].first + phys[i].npieces; k++) {
			const struct wex_tensor *p = &pc[k];
			const struct wex_layout_tensor *c = find(hphys, nh, p->name);

			CHECK(k < npc && p->segment == i && p->dtype == phys[i].dtype &&
				      p->offset + wex_tensor_nbytes(p) <= phys[i].nbytes &&
				      p->ndim == c->ndim && p->shape[0] == c->shape[0],
			      "piece %zu of %s (%s) lies outside it or matches no canonical tensor", k,
			      phys[i].name, p->name);
		}

	CHECK(wex_layout_rank(l, 2, &phys, &nphys, &pc, &npc) == -EINVAL &&
		      strstr(wex_layout_error(l), "2 ranks"),
	      "rank 2: '%s'", wex_layout_error(l));
	CHECK(wex_layout_rank(l, 0, NULL, &nphys, &pc, &npc) == -EINVAL &&
		      strstr(wex_layout_error(l), "must not be NULL"),
	      "NULL phys: '%s' (not the previous error)", wex_layout_error(l));
	{
		wex_layout_t *bad = (wex_layout_t *)1;

		CHECK(wex_layout_open("/nonexistent", "hf", NULL, &bad, NULL, NULL) < 0 && !bad,
		      "a failed open leaves *out NULL");
	}
	refused(cfg, "vllm:tp=3", -WEX_ELAYOUT, "tensor parallel size 3");
	refused(cfg, "nosuchengine:tp=2", -ENOENT, "nosuchengine");
	refused("/nonexistent/config.json", "hf", -ENOENT, "/nonexistent/config.json");
	{
		wex_layout_t *none;

		CHECK(wex_layout_open(NULL, "hf", NULL, &none, NULL, NULL) == -EINVAL && !none,
		      "NULL config");
	}
	{
		/* A temporary adapters directory: the real families, engines of
		 * its own (a copy of vllm.json and one that is not JSON). */
		char dir[] = "/tmp/wex-layout-api.XXXXXX", path[700], cwd[4096], *txt;
		wex_layout_t *rel = NULL, *broken = (wex_layout_t *)1;
		FILE *f;
		long n;

		CHECK(mkdtemp(dir) && getcwd(cwd, sizeof(cwd)), "mkdtemp");
		snprintf(path, sizeof(path), "%s/adapters", dir);
		CHECK(mkdir(path, 0700) == 0, "mkdir %s", path);
		snprintf(path, sizeof(path), "%s/adapters/engines", dir);
		CHECK(mkdir(path, 0700) == 0, "mkdir %s", path);
		snprintf(path, sizeof(path), "%s/adapters/families", src);
		{
			char link[700];

			snprintf(link, sizeof(link), "%s/adapters/families", dir);
			CHECK(symlink(path, link) == 0, "symlink %s", link);
		}
		snprintf(path, sizeof(path), "%s/adapters/engines/vllm.json", src);
		f = fopen(path, "rb");
		CHECK(f && fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) > 0 &&
			      fseek(f, 0, SEEK_SET) == 0 && (txt = malloc((size_t)n)) &&
			      fread(txt, 1, (size_t)n, f) == (size_t)n,
		      "read %s", path);
		fclose(f);
		snprintf(path, sizeof(path), "%s/adapters/engines/vllm.json", dir);
		f = fopen(path, "wb");
		CHECK(f && fwrite(txt, 1, (size_t)n, f) == (size_t)n && fclose(f) == 0, "write %s",
		      path);
		free(txt);
		snprintf(path, sizeof(path), "%s/adapters/engines/broken.json", dir);
		f = fopen(path, "wb");
		CHECK(f && fputs("{\"engine\": \"broken\", \"params\": {\"tp\": 1,}\n", f) >= 0 &&
			      fclose(f) == 0, "write %s", path);
		snprintf(path, sizeof(path), "%s/adapters", dir);
		ret = wex_layout_open(cfg, "broken:tp=1", path, &broken, NULL, &err);
		CHECK(ret == -EINVAL && !broken && err && strstr(err, "broken.json") &&
			      strstr(err, "line 1") && !strstr(err, "unknown engine"),
		      "an engine file that is not JSON: %d '%s'", ret, err ? err : "(null)");
		printf("refused: broken: %s\n", err);
		wex_free(err);
		err = NULL;
		/* ... and one that is a directory is named as one (it was
		 * "'[' or '{' expected near end of file (line 1, column 0)"). */
		snprintf(path, sizeof(path), "%s/adapters/engines/adir.json", dir);
		CHECK(mkdir(path, 0700) == 0, "mkdir %s", path);
		snprintf(path, sizeof(path), "%s/adapters", dir);
		broken = (wex_layout_t *)1;
		ret = wex_layout_open(cfg, "adir:tp=1", path, &broken, NULL, &err);
		CHECK(ret == -EINVAL && !broken && err && strstr(err, "adir.json: Is a directory"),
		      "an engine file that is a directory: %d '%s'", ret, err ? err : "(null)");
		printf("refused: adir: %s\n", err);
		wex_free(err);
		err = NULL;
		snprintf(path, sizeof(path), "%s/adapters/engines/adir.json", dir);
		rmdir(path);

		CHECK(chdir(dir) == 0, "chdir %s", dir);
		ret = wex_layout_open(cfg, "vllm:tp=2", "adapters", &rel, &world, &err);
		CHECK(chdir(cwd) == 0, "chdir %s", cwd);
		CHECK(ret == 0 && world == 2, "open with adapters/ relative: %d %s", ret,
		      err ? err : "");
		CHECK(wex_layout_rank(rel, 1, &phys, &nphys, &pc, &npc) == 0,
		      "rank 1 after a chdir: '%s'", wex_layout_error(rel));
		qkv = find(phys, nphys, "model.layers.0.self_attn.qkv_proj.weight");
		CHECK(qkv->shape[0] == 9 * 64 && pc[qkv->first].start[0] == 448, "rank 1's qkv_proj");
		snprintf(path, sizeof(path), "%s/adapters/engines/vllm.json", dir);
		CHECK(unlink(path) == 0, "unlink %s", path);
		CHECK(wex_layout_rank(rel, 0, &phys, &nphys, &pc, &npc) == 0,
		      "rank 0 after the engine file is gone: '%s'", wex_layout_error(rel));
		wex_layout_close(rel);
		snprintf(path, sizeof(path), "%s/adapters/engines/broken.json", dir);
		unlink(path);
		snprintf(path, sizeof(path), "%s/adapters/families", dir);
		unlink(path);
		snprintf(path, sizeof(path), "%s/adapters/engines", dir);
		rmdir(path);
		snprintf(path, sizeof(path), "%s/adapters", dir);
		rmdir(path);
		rmdir(dir);
	}
	wex_layout_close(l);
	wex_layout_close(hf);
	wex_layout_close(NULL);
	printf("PASS: wex_layout_* on Qwen2-0.5B vllm:tp=2\n");
	return T_PASS;
}
