/* SPDX-License-Identifier: MIT */
/*
 * group_churn - a consumer group whose last rank leaves is forgotten, so
 * that no client can make wexd keep rank slots of groups that are gone:
 * while one consumer keeps the model alive, 200 connections each say
 * hello as rank 0 of a new group of 65536 ranks and hang up.  Afterwards
 * wexd lists only the live group, its fd count is back where it was, and
 * a rank that comes back to a forgotten group gets it again, with the
 * world it says.  (Before, each such group stayed with 65536 empty
 * slots: memory grew with every hello, every disconnect walked them
 * all, and a `models` request over 40 of them took seconds and GBs.)
 */
#include <string.h>
#include <unistd.h>

#include "helpers.h"

#define MODEL "churn"
#define GROUPS 200

static void ok(int fd, const char *req, const char *what)
{
	json_t *r = t_raw_rpc(fd, req, NULL, 0);

	T_ASSERT(!strcmp(t_code(r), "OK"), "%s: %s: %s", what, t_code(r), t_msg(r));
	json_decref(r);
}

/* The groups wexd lists for MODEL. */
static json_t *groups(int ctl)
{
	json_t *r = t_raw_rpc(ctl, "{\"v\":1,\"op\":\"models\"}", NULL, 0), *m, *g = NULL;
	size_t i;

	T_ASSERT(!strcmp(t_code(r), "OK"), "models: %s", t_msg(r));
	json_array_foreach(json_object_get(r, "models"), i, m)
		if (!strcmp(json_string_value(json_object_get(m, "name")) ?: "", MODEL))
			g = json_incref(json_object_get(m, "groups"));
	json_decref(r);
	T_ASSERT(g, "model '%s' listed", MODEL);
	return g;
}

int main(void)
{
	struct t_wexd d;
	int ctl, keep, before, after, fd;
	char req[256];
	json_t *g;

	t_wexd_start(&d);
	t_check_backend(d.sock);
	ctl = t_raw_connect(d.sock);
	keep = t_raw_connect(d.sock);
	ok(keep, "{\"v\":1,\"op\":\"hello\",\"role\":\"consumer\",\"model\":\"" MODEL
		 "\",\"group\":\"keep\"}", "the consumer that stays");
	before = t_wexd_fds_settle(&d, -1);
	for (int i = 0; i < GROUPS; i++) {
		fd = t_raw_connect(d.sock);
		snprintf(req, sizeof(req),
			 "{\"v\":1,\"op\":\"hello\",\"role\":\"consumer\",\"model\":\"" MODEL
			 "\",\"group\":\"g%d\",\"rank\":0,\"world\":65536}", i);
		ok(fd, req, "hello as rank 0 of 65536 of a new group");
		close(fd);
	}
	after = t_wexd_fds_settle(&d, before);
	g = groups(ctl);
	printf("after %d groups of 65536 ranks came and went: %zu group(s) listed, wexd fds %d -> %d\n",
	       GROUPS, json_array_size(g), before, after);
	T_ASSERT(json_array_size(g) == 1 &&
		 !strcmp(json_string_value(json_object_get(json_array_get(g, 0), "name")) ?: "", "keep"),
		 "%zu groups listed, not only 'keep': groups whose ranks all left are kept",
		 json_array_size(g));
	T_ASSERT(after == before, "wexd fds %d -> %d", before, after);
	json_decref(g);

	/* A rank back to a forgotten group gets it again, with its world. */
	fd = t_raw_connect(d.sock);
	ok(fd, "{\"v\":1,\"op\":\"hello\",\"role\":\"consumer\",\"model\":\"" MODEL
	       "\",\"group\":\"g7\",\"rank\":1,\"world\":2}", "rank 1 of 2 of group g7 again");
	g = groups(ctl);
	T_ASSERT(json_array_size(g) == 2, "%zu groups listed with g7 back", json_array_size(g));
	for (size_t i = 0; i < json_array_size(g); i++) {
		json_t *e = json_array_get(g, i);

		if (!strcmp(json_string_value(json_object_get(e, "name")) ?: "", "g7"))
			T_ASSERT(json_integer_value(json_object_get(e, "world")) == 2,
				 "g7 came back with world %lld, not 2",
				 (long long)json_integer_value(json_object_get(e, "world")));
	}
	json_decref(g);
	printf("a rank back to a forgotten group gets it again, with the world it says\n");
	close(fd);
	close(keep);
	close(ctl);
	t_wexd_stop(&d);
	printf("group_churn: PASS\n");
	return T_EXIT_PASS;
}
