/* SPDX-License-Identifier: MIT */
/*
 * bad_engine.c - proves engine layout files (adapters/engines/NAME.json,
 * which users write for their own engines) with numbers no engine has are
 * refused with -WEX_ELAYOUT and a message naming the engine and the value:
 * a vocab_pad whose product with tp wraps to 0 (was a division by zero)
 * or that would pad the vocabulary to terabytes, and parameter defaults
 * outside the limits given values obey (tp*dp wrapped to a world of 0
 * ranks), a pp_remainder other than before_last or last, and a
 * default for stages other than [] (none), a tensor entry with an axis
 * other than etp, attn or none or an "if" naming no layout parameter (both
 * were taken as the plain tp split / ignored), an "unless" list with a
 * member that is not a parameter's name, param_model_types that is not a
 * list or does not list the model's type, chunk_dim0 (FSDP2's dim-0
 * chunks of canonical tensors) on an engine that is not canonical, and an
 * fsdp parameter above 1 on an engine without chunk_dim0.  The same engine
 * with sane numbers lays out, axis none holds the padded vocabulary whole
 * on every rank, and an "unless" list drops the entry when any of its
 * parameters is set.  Uses a family and
 * engines of its own in a temporary adapters directory, also when
 * $WEX_ADAPTERS names it (a directory named there is used as given, with
 * no hf.json of its own; it was skipped for the source tree's copy).
 */
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kat_common.h"

static const char family[] =
	"{\"family\":\"t\",\"model_types\":[\"enginetest\"],\"symbols\":["
	"[\"layers\",\"layers\"],[\"vocab\",\"vocab\"],[\"hidden\",\"hidden\"]],"
	"\"tensors\":[{\"role\":\"embed\",\"name\":\"w\",\"shape\":[\"vocab\",\"hidden\"]}]}";

static char dir[] = "/tmp/wex-engine.XXXXXX";

/* An engine of one vocab-parallel tensor entry ("e"), with `extra`
 * members in the entry; times_tp: vocab_pad_times_tp. */
static void put_engine(const char *name, const char *params, const char *pad, int times_tp,
		       const char *extra)
{
	char path[256];
	FILE *f;

	snprintf(path, sizeof(path), "%s/engines/%s.json", dir, name);
	f = fopen(path, "w");
	CHECK(f, "open %s", path);
	fprintf(f,
		"{\"engine\":\"%s\",\"params\":%s,\"vocab_pad\":%s,%s\"tensors\":[{\"name\":\"e\","
		"\"kind\":\"vocab\",\"roles\":[\"embed\"],\"stage\":\"first\"%s}]}",
		name, params, pad, times_tp ? "\"vocab_pad_times_tp\":true," : "", extra);
	CHECK(fclose(f) == 0, "write %s", path);
}

static void put(const char *name, const char *params, const char *pad)
{
	put_engine(name, params, pad, 1, "");
}

/* An engine "ok"-like but with `extra` members in its one tensor entry. */
static void put_entry(const char *name, const char *params, const char *extra)
{
	put_engine(name, params, "64", 0, extra);
}

static int world(const struct wex_model *m, const char *lay, uint32_t *w, char *err, size_t len)
{
	struct wex_layout_spec s;

	CHECK(wex__layout_parse(lay, &s, err, len) == 0, "%s", err);
	err[0] = 0;
	return wex__layout_world(m, &s, w, err, len);
}

int main(void)
{
	char path[256], err[512];
	struct wex_model *m = NULL;
	struct wex_rank_layout l;
	uint32_t w = 0;
	FILE *f;
	int ret;

	CHECK(mkdtemp(dir) != NULL, "mkdtemp");
	snprintf(path, sizeof(path), "%s/families", dir);
	CHECK(mkdir(path, 0755) == 0, "mkdir");
	snprintf(path, sizeof(path), "%s/engines", dir);
	CHECK(mkdir(path, 0755) == 0, "mkdir");
	snprintf(path, sizeof(path), "%s/families/llama.json", dir);
	f = fopen(path, "w");
	CHECK(f && fputs(family, f) >= 0 && fclose(f) == 0, "write %s", path);
	put("ok", "{\"tp\":1,\"pp\":1,\"dp\":1}", "64");
	put("wrap", "{\"tp\":1,\"pp\":1,\"dp\":1}", "4611686018427387904");
	put("huge", "{\"tp\":1,\"pp\":1,\"dp\":1}", "1000000000000");
	put("defaults", "{\"tp\":4294967296,\"pp\":1,\"dp\":4294967296}", "64");
	/* Top-level keys after params, through its text. */
	put("rem", "{\"tp\":1,\"pp\":1,\"dp\":1},\"pp_remainder\":\"middle\"", "64");
	put("stages", "{\"tp\":1,\"pp\":1,\"dp\":1,\"stages\":[1,1]}", "64");
	put_entry("axis", "{\"tp\":1,\"pp\":1,\"dp\":1}", ",\"axis\":\"attention\"");
	put_entry("if", "{\"tp\":1,\"pp\":1,\"dp\":1}", ",\"if\":\"dp_attn\"");
	put_entry("iflist", "{\"tp\":1,\"pp\":1,\"dp\":1}", ",\"unless\":[\"dp\",7]");
	put_entry("unlesses", "{\"tp\":1,\"pp\":1,\"dp\":1,\"dense_tp\":0,\"dp_attention\":0}",
		  ",\"unless\":[\"dense_tp\",\"dp_attention\"]");
	put_entry("none", "{\"tp\":1,\"pp\":1,\"dp\":1}", ",\"axis\":\"none\"");
	put_entry("pmt", "{\"tp\":1,\"pp\":1,\"dp\":1,\"dp_attention\":0},"
		  "\"param_model_types\":{\"dp_attention\":\"enginetest\"}", "");
	put_entry("pmt2", "{\"tp\":1,\"pp\":1,\"dp\":1,\"dp_attention\":0},"
		  "\"param_model_types\":{\"dp_attention\":[\"deepseek_v3\"]}",
		  ",\"axis\":\"attn\"");
	put("chunky", "{\"fsdp\":1},\"chunk_dim0\":true", "64");
	put("nochunk", "{\"tp\":1,\"fsdp\":1}", "64");
	CHECK(wex__model_from_text("{\"model_type\":\"enginetest\",\"layers\":2,\"vocab\":100,"
				   "\"hidden\":8}",
				   dir, &m, err, sizeof(err)) == 0,
	      "%s", err);

	/* Sane: 100 rows padded to 64*4 = 256, 64 per rank. */
	ret = world(m, "ok:tp=4", &w, err, sizeof(err));
	CHECK(ret == 0 && w == 4, "ok:tp=4: %d %s", ret, err);
	kat_rank(m, "ok:tp=4", 1, &l);
	CHECK(l.nt == 1 && l.t[0].shape[0] == 64 && l.t[0].npieces == 1 &&
		      l.p[0].start[0] == 64 && l.p[0].extent[0] == 36,
	      "rank 1 holds %llu rows from row %llu", (unsigned long long)l.t[0].shape[0],
	      (unsigned long long)l.p[0].start[0]);
	wex__rank_layout_free(&l);

	/* 2^62 * 4 wraps to 0: refused, not divided by. */
	ret = world(m, "wrap:tp=4", &w, err, sizeof(err));
	CHECK(ret == -WEX_ELAYOUT, "wrap:tp=4: %d %s", ret, err);
	CHECK(strstr(err, "engine wrap") && strstr(err, "vocab_pad 4611686018427387904"), "%s", err);
	printf("wrap:tp=4      %s\n", err);
	/* 10^12 rows of padding: refused. */
	ret = world(m, "huge:tp=2", &w, err, sizeof(err));
	CHECK(ret == -WEX_ELAYOUT, "huge:tp=2: %d %s", ret, err);
	CHECK(strstr(err, "vocab_pad 1000000000000"), "%s", err);
	printf("huge:tp=2      %s\n", err);
	/* Defaults of 2^32 (tp*dp wraps to 0 ranks): refused, named. */
	ret = world(m, "defaults", &w, err, sizeof(err));
	CHECK(ret == -WEX_ELAYOUT, "defaults: %d %s (world %u)", ret, err, w);
	CHECK(strstr(err, "engine defaults") && strstr(err, "tp defaults to 4294967296"), "%s", err);
	printf("defaults       %s\n", err);
	/* Rules no engine has: refused even where the layers divide evenly. */
	ret = world(m, "rem", &w, err, sizeof(err));
	CHECK(ret == -WEX_ELAYOUT, "rem: %d %s", ret, err);
	CHECK(strstr(err, "engine rem") && strstr(err, "pp_remainder is \"middle\""), "%s", err);
	printf("rem            %s\n", err);
	ret = world(m, "stages:pp=2", &w, err, sizeof(err));
	CHECK(ret == -WEX_ELAYOUT, "stages:pp=2: %d %s", ret, err);
	CHECK(strstr(err, "engine stages") && strstr(err, "stages must default to []"), "%s", err);
	printf("stages:pp=2    %s\n", err);
	/* Tensor entries with words no engine has: refused, named. */
	ret = world(m, "axis:tp=2", &w, err, sizeof(err));
	CHECK(ret == -WEX_ELAYOUT && strstr(err, "unknown axis \"attention\""), "axis: %d %s", ret,
	      err);
	printf("axis:tp=2      %s\n", err);
	ret = world(m, "if:tp=2", &w, err, sizeof(err));
	CHECK(ret == -WEX_ELAYOUT && strstr(err, "unknown \"if\" dp_attn"), "if: %d %s", ret, err);
	printf("if:tp=2        %s\n", err);
	ret = world(m, "iflist:tp=2", &w, err, sizeof(err));
	CHECK(ret == -WEX_ELAYOUT && strstr(err, "unknown \"unless\" (not a string)"),
	      "iflist: %d %s", ret, err);
	printf("iflist:tp=2    %s\n", err);
	/* An "unless" list: the entry goes when any of them is set. */
	kat_rank(m, "unlesses:tp=2", 1, &l);
	CHECK(l.nt == 1, "unlesses:tp=2: %zu tensors", l.nt);
	wex__rank_layout_free(&l);
	kat_rank(m, "unlesses:tp=2,dense_tp=1", 1, &l);
	CHECK(l.nt == 0, "unlesses:tp=2,dense_tp=1: %zu tensors", l.nt);
	wex__rank_layout_free(&l);
	kat_rank(m, "unlesses:tp=2,dp=2,dp_attention=1", 1, &l);
	CHECK(l.nt == 0, "unlesses with dp_attention=1: %zu tensors", l.nt);
	wex__rank_layout_free(&l);
	/* axis none: 100 rows padded to 128, whole on every one of 4 ranks. */
	kat_rank(m, "none:tp=4", 3, &l);
	CHECK(l.nt == 1 && l.t[0].shape[0] == 128 && l.t[0].npieces == 1 &&
		      l.p[0].start[0] == 0 && l.p[0].extent[0] == 100,
	      "axis none: rank 3 holds %llu rows", (unsigned long long)l.t[0].shape[0]);
	wex__rank_layout_free(&l);
	/* param_model_types: a list, naming the model types a parameter is
	 * described for; off, the parameter is not checked. */
	ret = world(m, "pmt:tp=2,dp=2,dp_attention=1", &w, err, sizeof(err));
	CHECK(ret == -WEX_ELAYOUT && strstr(err, "param_model_types.dp_attention is not a list"),
	      "pmt: %d %s", ret, err);
	printf("pmt            %s\n", err);
	ret = world(m, "pmt2:tp=2,dp=2,dp_attention=1", &w, err, sizeof(err));
	CHECK(ret == -WEX_ELAYOUT && strstr(err, "deepseek_v3 only, not enginetest"), "pmt2: %d %s",
	      ret, err);
	printf("pmt2           %s\n", err);
	ret = world(m, "pmt2:tp=2,dp=2", &w, err, sizeof(err));
	CHECK(ret == 0 && w == 4, "pmt2:tp=2,dp=2: %d %s", ret, err);
	/* chunk_dim0 cuts canonical tensors; fsdp ranks need it. */
	ret = world(m, "chunky:fsdp=2", &w, err, sizeof(err));
	CHECK(ret == -WEX_ELAYOUT, "chunky:fsdp=2: %d %s", ret, err);
	CHECK(strstr(err, "engine chunky") && strstr(err, "chunk_dim0") && strstr(err, "canonical"),
	      "%s", err);
	printf("chunky:fsdp=2  %s\n", err);
	ret = world(m, "nochunk:fsdp=2", &w, err, sizeof(err));
	CHECK(ret == -WEX_ELAYOUT, "nochunk:fsdp=2: %d %s", ret, err);
	CHECK(strstr(err, "engine nochunk") && strstr(err, "fsdp=2") && strstr(err, "chunk_dim0"),
	      "%s", err);
	printf("nochunk:fsdp=2 %s\n", err);
	/* Without fsdp= it is an engine like any other (fsdp is 1). */
	ret = world(m, "nochunk:tp=2", &w, err, sizeof(err));
	CHECK(ret == 0 && w == 2, "nochunk:tp=2: %d %s", ret, err);
	/* Given values override bad defaults. */
	ret = world(m, "defaults:tp=2,dp=1", &w, err, sizeof(err));
	CHECK(ret == 0 && w == 2, "defaults:tp=2,dp=1: %d %s", ret, err);
	wex__model_free(m);
	m = NULL;

	/* $WEX_ADAPTERS names the directory: its family is found (no
	 * directory given to the call). */
	setenv("WEX_ADAPTERS", dir, 1);
	CHECK(wex__model_from_text("{\"model_type\":\"enginetest\",\"layers\":2,\"vocab\":100,"
				   "\"hidden\":8}",
				   NULL, &m, err, sizeof(err)) == 0,
	      "$WEX_ADAPTERS=%s not used: %s", dir, err);
	wex__model_free(m);
	m = NULL;
	/* One that does not exist fails naming it. */
	setenv("WEX_ADAPTERS", "/nonexistent-wex-adapters", 1);
	CHECK(wex__model_from_text("{\"model_type\":\"llama\"}", NULL, &m, err, sizeof(err)) < 0 &&
		      strstr(err, "/nonexistent-wex-adapters"),
	      "$WEX_ADAPTERS naming no directory: not refused naming it: %s", err);
	printf("WEX_ADAPTERS   %s\n", err);
	unsetenv("WEX_ADAPTERS");
	const char *names[] = { "engines/ok",	  "engines/wrap",   "engines/huge",
				"engines/defaults", "engines/rem",    "engines/stages",
				"engines/axis",	  "engines/if",	    "engines/pmt",
				"engines/iflist", "engines/unlesses", "engines/none",
				"engines/pmt2",	  "engines/chunky", "engines/nochunk",
				"families/llama" };
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		snprintf(path, sizeof(path), "%s/%s.json", dir, names[i]);
		unlink(path);
	}
	snprintf(path, sizeof(path), "%s/engines", dir);
	rmdir(path);
	snprintf(path, sizeof(path), "%s/families", dir);
	rmdir(path);
	rmdir(dir);
	return T_PASS;
}
