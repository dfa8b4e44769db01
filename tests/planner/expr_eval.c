/* SPDX-License-Identifier: MIT */
/*
 * expr_eval.c - the adapter families' symbol expressions evaluate as in C:
 * * and / before + and -, == loosest (a+b==c+d is (a+b)==(c+d), not
 * ((a+b)==c)+d), parentheses first.  Uses a family of its own in a
 * temporary adapters directory.
 */
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kat_common.h"

static const char family[] =
	"{\"family\":\"t\",\"model_types\":[\"exprtest\"],\"symbols\":["
	"[\"a\",\"a\"],[\"b\",\"b\"],[\"c\",\"c\"],[\"d\",\"d\"],"
	"[\"sum_eq\",\"\",\"a+b==c+d\"],[\"sum_ne\",\"\",\"a+b==c+d+1\"],"
	"[\"mul\",\"\",\"a+b*c-d/2\"],[\"paren\",\"\",\"(a==2)+(b==3)*10\"],"
	"[\"chain\",\"\",\"a*b==6==1\"]],"
	"\"tensors\":[{\"role\":\"embed\",\"name\":\"w\",\"shape\":[\"a\"]}]}";

int main(void)
{
	char dir[] = "/tmp/wex-expr.XXXXXX", path[256], err[256];
	struct { const char *sym; int64_t want; } cases[] = {
		{ "sum_eq", 1 }, { "sum_ne", 0 }, { "mul", 2 + 3 * 1 - 4 / 2 }, { "paren", 11 },
		{ "chain", 1 },
	};
	struct wex_model *m = NULL;
	FILE *f;

	CHECK(mkdtemp(dir) != NULL, "mkdtemp");
	snprintf(path, sizeof(path), "%s/families", dir);
	CHECK(mkdir(path, 0755) == 0, "mkdir");
	/* The loader reads the families by their known names: take the first. */
	snprintf(path, sizeof(path), "%s/families/llama.json", dir);
	f = fopen(path, "w");
	CHECK(f && fputs(family, f) >= 0 && fclose(f) == 0, "write %s", path);
	CHECK(wex__model_from_text("{\"model_type\":\"exprtest\",\"a\":2,\"b\":3,\"c\":1,\"d\":4}", dir,
				   &m, err, sizeof(err)) == 0,
	      "%s", err);
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		int64_t v = wex__model_sym(m, cases[i].sym);

		CHECK(v == cases[i].want, "%s = %lld, wanted %lld", cases[i].sym, (long long)v,
		      (long long)cases[i].want);
	}
	wex__model_free(m);
	unlink(path);
	snprintf(path, sizeof(path), "%s/families", dir);
	rmdir(path);
	rmdir(dir);
	printf("expressions evaluate with C precedence\n");
	return T_PASS;
}
