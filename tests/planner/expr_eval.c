/* SPDX-License-Identifier: MIT */
/*
 * expr_eval.c - the adapter families' symbol expressions evaluate as in C:
 * * and / before + and -, == loosest (a+b==c+d is (a+b)==(c+d), not
 * ((a+b)==c)+d), parentheses first.  Uses a family of its own in a
 * temporary adapters directory.  Expressions that cannot be evaluated
 * (INT64_MIN / -1, parentheses nested 100,000 deep, division by zero) are
 * refused with a message, never a crash; so are tensor names with an
 * unknown {key}.
 */
#include <errno.h>
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
	/* Expressions that cannot be evaluated are refused, never a crash:
	 * INT64_MIN / -1 (traps on x86), parentheses nested deeper than the
	 * parser recurses, division by zero. */
	{
		static const char *const bad[] = { "(0-9223372036854775807-1)/(0-1)", NULL, "a/(b-b)" };
		char *deep = malloc(200001 + 16);

		CHECK(deep, "oom");
		memset(deep, '(', 100000);
		strcpy(deep + 100000, "a");
		memset(deep + 100001, ')', 100000);
		deep[200001] = 0;
		for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
			const char *e = bad[i] ? bad[i] : deep;
			size_t n = strlen(e) + 512;
			char *fam = malloc(n);

			CHECK(fam, "oom");
			snprintf(fam, n,
				 "{\"family\":\"t\",\"model_types\":[\"exprtest\"],\"symbols\":["
				 "[\"a\",\"a\"],[\"b\",\"b\"]],"
				 "\"tensors\":[{\"role\":\"embed\",\"name\":\"w\",\"shape\":[\"%s\"]}]}",
				 e);
			f = fopen(path, "w");
			CHECK(f && fputs(fam, f) >= 0 && fclose(f) == 0, "write %s", path);
			err[0] = 0;
			CHECK(wex__model_from_text("{\"model_type\":\"exprtest\",\"a\":2,\"b\":3}", dir,
						   &m, err, sizeof(err)) == -EINVAL,
			      "shape %.40s accepted", e);
			CHECK(strstr(err, "cannot evaluate shape of w"), "%.40s: %s", e, err);
			printf("%.40s: %s\n", e, err);
			free(fam);
		}
		free(deep);
	}
	/* Names past 31 bytes: a symbol is refused at load, and a name in an
	 * expression is none known (both were cut short to 31 bytes, and
	 * could match a shorter symbol). */
	{
		static const char *const fams[] = {
			"{\"family\":\"t\",\"model_types\":[\"exprtest\"],\"symbols\":"
			"[[\"a\",\"a\"],[\"abcdefghijklmnopqrstuvwxyz01234\",\"\",\"a\"]],"
			"\"tensors\":[{\"role\":\"embed\",\"name\":\"w\","
			"\"shape\":[\"abcdefghijklmnopqrstuvwxyz01234extra\"]}]}",
			"{\"family\":\"t\",\"model_types\":[\"exprtest\"],\"symbols\":"
			"[[\"a\",\"a\"],[\"abcdefghijklmnopqrstuvwxyz0123456789\",\"\",\"a\"]],"
			"\"tensors\":[{\"role\":\"embed\",\"name\":\"w\",\"shape\":[\"a\"]}]}",
		};
		static const char *const want[] = { "cannot evaluate shape of w", "is longer than 31 bytes" };

		for (int i = 0; i < 2; i++) {
			f = fopen(path, "w");
			CHECK(f && fputs(fams[i], f) >= 0 && fclose(f) == 0, "write %s", path);
			err[0] = 0;
			CHECK(wex__model_from_text("{\"model_type\":\"exprtest\",\"a\":2}", dir, &m, err,
						   sizeof(err)) == -EINVAL,
			      "a name past 31 bytes accepted (case %d)", i);
			CHECK(strstr(err, want[i]), "case %d: %s", i, err);
			printf("long name: %s\n", err);
		}
	}
	/* A name template with an unknown {key}: refused at load, naming the
	 * tensor (it used to load and fail every whole-tensor layout with a
	 * bare "Invalid argument"). */
	f = fopen(path, "w");
	CHECK(f && fputs("{\"family\":\"t\",\"model_types\":[\"exprtest\"],\"symbols\":"
			 "[[\"a\",\"a\"]],\"tensors\":[{\"role\":\"embed\",\"name\":"
			 "\"w.{nosuch}\",\"shape\":[\"a\"]}]}",
			 f) >= 0 && fclose(f) == 0,
	      "write %s", path);
	err[0] = 0;
	CHECK(wex__model_from_text("{\"model_type\":\"exprtest\",\"a\":2}", dir, &m, err,
				   sizeof(err)) == -EINVAL,
	      "name w.{nosuch} accepted");
	CHECK(strstr(err, "w.{nosuch}"), "%s", err);
	printf("%s\n", err);
	unlink(path);
	snprintf(path, sizeof(path), "%s/families", dir);
	rmdir(path);
	rmdir(dir);
	printf("expressions evaluate with C precedence\n");
	return T_PASS;
}
