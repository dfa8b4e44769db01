/* SPDX-License-Identifier: MIT */
/*
 * ops_config_access: proves the per-model access lists: a listed uid, a
 * listed primary gid and a listed supplementary group are admitted, others
 * refused; a model without an entry falls back to "*", and with neither any
 * user is admitted; an absent role admits anyone, a present empty role only
 * root; root is always admitted; user and group names resolve.  The
 * supplementary-group path is checked with a stand-in lookup, and with the
 * real getgrouplist when this machine has a user with a supplementary group;
 * the groups a client's process holds (SO_PEERGROUPS), when given, decide
 * instead of the group database.
 */
#include <errno.h>
#include <grp.h>
#include <pwd.h>

#include "config.h"
#include "ops_test.h"

#define P WEX_ROLE_PRODUCER
#define C WEX_ROLE_CONSUMER

/* uid 1002 is also in group 3000; everyone else only in their primary. */
static int fake_groups(uid_t uid, gid_t gid, gid_t *groups, int *n)
{
	int want = uid == 1002 ? 2 : 1;

	if (*n < want) {
		*n = want;
		return -ERANGE;
	}
	groups[0] = gid;
	if (uid == 1002)
		groups[1] = 3000;
	*n = want;
	return 0;
}

static void real_supplementary(void)
{
	struct passwd *pw;
	struct wex_config cfg;
	char err[512], text[256], *path;

	setpwent();
	while ((pw = getpwent())) {
		gid_t groups[256];
		int n = 256;

		if (pw->pw_uid == 0 || getgrouplist(pw->pw_name, pw->pw_gid, groups, &n) < 0)
			continue;
		for (int i = 0; i < n; i++) {
			if (groups[i] == pw->pw_gid)
				continue;
			snprintf(text, sizeof(text),
				 "{\"models\": {\"m\": {\"consumers\": {\"gids\": [%u]}}}}",
				 (unsigned)groups[i]);
			path = t_write_tmp(text);
			CHECK(wex__config_load(&cfg, path, 1, err, sizeof(err)) == 0);
			CHECK(wex__config_allowed(&cfg, "m", C, pw->pw_uid, pw->pw_gid, NULL, -1));
			printf("real getgrouplist: %s admitted through supplementary gid %u\n",
			       pw->pw_name, (unsigned)groups[i]);
			wex__config_free(&cfg);
			unlink(path);
			free(path);
			endpwent();
			return;
		}
	}
	endpwent();
	printf("note: no user here has a supplementary group; real lookup not exercised\n");
}

int main(void)
{
	struct wex_config cfg;
	char err[512], *path;

	t_clear_env();
	wex__config_set_groups_fn(fake_groups);

	/* No lists at all: any local user. */
	CHECK(wex__config_load(&cfg, "/nonexistent/wexd.json", 0, err, sizeof(err)) == 0);
	CHECK(wex__config_allowed(&cfg, "policy", P, 1234, 1234, NULL, -1));
	CHECK(wex__config_allowed(&cfg, "policy", C, 1234, 1234, NULL, -1));
	wex__config_free(&cfg);

	path = t_write_tmp(
		"{\"models\": {\n"
		"  \"policy\": {\"producers\": {\"uids\": [1000], \"gids\": [2000]},\n"
		"              \"consumers\": {\"gids\": [3000]}},\n"
		"  \"open\": {},\n"
		"  \"locked\": {\"consumers\": {}},\n"
		"  \"named\": {\"producers\": {\"uids\": [\"root\"], \"gids\": [\"root\"]}},\n"
		"  \"*\": {\"producers\": {\"uids\": [4242]}}\n"
		"}}");
	if (wex__config_load(&cfg, path, 1, err, sizeof(err)) != 0) {
		fprintf(stderr, "load: %s\n", err);
		return T_EXIT_FAIL;
	}
	CHECK(cfg.models.n == 5);

	/* uid, primary gid, supplementary gid. */
	CHECK(wex__config_allowed(&cfg, "policy", P, 1000, 100, NULL, -1));
	CHECK(wex__config_allowed(&cfg, "policy", P, 1001, 2000, NULL, -1));
	CHECK(!wex__config_allowed(&cfg, "policy", P, 1001, 100, NULL, -1));
	CHECK(wex__config_allowed(&cfg, "policy", C, 1002, 100, NULL, -1));
	CHECK(!wex__config_allowed(&cfg, "policy", P, 1002, 100, NULL, -1));
	CHECK(!wex__config_allowed(&cfg, "policy", C, 1000, 100, NULL, -1));
	CHECK(!wex__config_allowed(&cfg, "policy", C, 1001, 2000, NULL, -1));
	CHECK(!wex__config_allowed(&cfg, "policy", WEX_ROLE_ADMIN, 1000, 100, NULL, -1));

	/* The groups the process holds (SO_PEERGROUPS), where known, decide
	 * instead of the group database: uid 1002 is in 3000 there (the
	 * stand-in lookup) but its process dropped it; uid 1001 is in no
	 * group there but its process holds 2000. */
	{
		static const gid_t held[] = { 17, 2000 }, none[] = { 17 };

		CHECK(wex__config_allowed(&cfg, "policy", P, 1001, 100, held, 2));
		CHECK(!wex__config_allowed(&cfg, "policy", C, 1002, 100, none, 1));
		CHECK(!wex__config_allowed(&cfg, "policy", C, 1002, 100, NULL, 0));
		CHECK(wex__config_allowed(&cfg, "policy", P, 1000, 100, NULL, 0)); /* its uid */
	}

	/* Root, always. */
	CHECK(wex__config_allowed(&cfg, "policy", C, 0, 0, NULL, -1));
	CHECK(wex__config_allowed(&cfg, "locked", C, 0, 0, NULL, -1));

	/* An entry without roles, and an empty role. */
	CHECK(wex__config_allowed(&cfg, "open", P, 5, 5, NULL, -1) && wex__config_allowed(&cfg, "open", C, 5, 5, NULL, -1));
	CHECK(!wex__config_allowed(&cfg, "locked", C, 5, 5, NULL, -1));
	CHECK(!wex__config_allowed(&cfg, "locked", C, 1002, 3000, NULL, -1));
	CHECK(wex__config_allowed(&cfg, "locked", P, 5, 5, NULL, -1));

	/* The wildcard covers models without an entry, not those with one. */
	CHECK(wex__config_allowed(&cfg, "reward", P, 4242, 4242, NULL, -1));
	CHECK(!wex__config_allowed(&cfg, "reward", P, 5, 5, NULL, -1));
	CHECK(wex__config_allowed(&cfg, "reward", C, 5, 5, NULL, -1));
	CHECK(wex__config_allowed(&cfg, "open", P, 5, 5, NULL, -1));
	CHECK(!wex__config_allowed(&cfg, NULL, P, 5, 5, NULL, -1));

	/* Names resolve to ids. */
	for (size_t i = 0; i < cfg.models.n; i++) {
		const struct wex_model_acl *a = &cfg.models.v[i];

		if (strcmp(a->name, "named"))
			continue;
		CHECK(a->producers.uids.n == 1 && a->producers.uids.ids[0] == 0);
		CHECK(a->producers.gids.n == 1 && a->producers.gids.ids[0] == 0);
		CHECK(!a->consumers.present);
	}
	wex__config_free(&cfg);
	unlink(path);
	free(path);

	/* Without the "*" entry an unlisted model is open. */
	path = t_write_tmp("{\"models\": {\"policy\": {\"consumers\": {\"uids\": [1]}}}}");
	CHECK(wex__config_load(&cfg, path, 1, err, sizeof(err)) == 0);
	CHECK(wex__config_allowed(&cfg, "reward", C, 5, 5, NULL, -1));
	CHECK(!wex__config_allowed(&cfg, "policy", C, 5, 5, NULL, -1));
	wex__config_free(&cfg);
	unlink(path);
	free(path);

	wex__config_set_groups_fn(NULL);
	real_supplementary();
	printf("PASS\n");
	return T_EXIT_PASS;
}
