/* SPDX-License-Identifier: MIT */
/*
 * client_errors - libwex's errors name what the caller did (review,
 * helper 116):
 *  1. wex_sync with an unknown mode says the mode it was given: -1 was
 *     reported as "sync mode -257 unknown" (what was left once
 *     WEX_SYNC_VERIFY was masked off);
 *  2. wex_request("fetch") on a consumer with no lease was sent, and
 *     wexd's well-formed reply, which passes the producers' memory as
 *     fds, came back as -EBADMSG "malformed reply from wexd"; it is
 *     refused up front (-EINVAL, saying why), nothing sent, no fd left
 *     open, and the client goes on syncing;
 *  3. wex_view of a producer rank that does not exist said "(sync first)"
 *     right after a sync.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "tests/foundation/fixture.h"

int main(void)
{
	struct wex_sync_result r;
	struct t_wexd d;
	struct t_prod p;
	struct t_cons k;
	char *json = NULL;
	void *ptr;
	int ret, fds;

	t_wexd_start(&d);
	t_prod_open(&p, "errs", "tiny", 0, 1);
	t_prod_write(&p, 1);
	t_cons_open(&k, "errs", "g", "tiny", 0, 1);

	ret = wex_sync(k.c, -1, 1, 1000, &r);
	printf("wex_sync(mode -1): %s: %s\n", wex_strerror(ret), wex_last_error(k.c));
	T_ASSERT(ret == -EINVAL && strstr(wex_last_error(k.c), "sync mode -1 unknown"),
		 "wex_sync(mode -1): %s: '%s', expected EINVAL naming mode -1", wex_strerror(ret),
		 wex_last_error(k.c));

	fds = t_fd_count(getpid());
	ret = wex_request(k.c, "fetch", NULL, &json);
	printf("wex_request(fetch): %s: %s\n", wex_strerror(ret), wex_last_error(k.c));
	T_ASSERT(ret == -EINVAL && strstr(wex_last_error(k.c), "fetch") &&
			 !strstr(wex_last_error(k.c), "malformed"),
		 "wex_request(fetch): %s: '%s', expected EINVAL saying why", wex_strerror(ret),
		 wex_last_error(k.c));
	T_ASSERT(t_fd_count(getpid()) == fds, "fds %d before the raw fetch, %d after", fds,
		 t_fd_count(getpid()));
	T_WEX(k.c, wex_sync(k.c, WEX_SYNC_COPY, 1, 5000, &r));
	T_ASSERT(r.version == 1 && !wex_is_dirty(k.c), "synced v%llu", (unsigned long long)r.version);

	/* 3. A producer rank that does not exist, after a sync: "sync first"
	 *    would send the caller to do what it did. */
	T_WEX(k.c, wex_sync(k.c, WEX_SYNC_REMAP_VIEW, 1, 5000, &r));
	ret = wex_view(k.c, 7, k.t[0].name, &ptr, NULL);
	printf("wex_view(prank 7) after a sync: %s: %s\n", wex_strerror(ret), wex_last_error(k.c));
	T_ASSERT(ret == -ENOENT && strstr(wex_last_error(k.c), "no producer rank 7") &&
			 !strstr(wex_last_error(k.c), "sync first"),
		 "wex_view(prank 7) after a sync: %s: '%s', expected ENOENT without 'sync first'",
		 wex_strerror(ret), wex_last_error(k.c));
	T_WEX(k.c, wex_view(k.c, 0, k.t[0].name, &ptr, NULL));
	T_WEX(k.c, wex_release(k.c));

	t_cons_close(&k);
	t_prod_close(&p);
	t_wexd_stop(&d);
	return T_EXIT_PASS;
}
