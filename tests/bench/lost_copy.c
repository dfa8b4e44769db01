/* SPDX-License-Identifier: MIT */
/*
 * lost_copy.c - linked into host_sync_lost_copy: wraps libwex's wex_sync
 * so that a copy sync moves no byte (it is made a remap view sync, which
 * serves the version and returns at once).  The benchmark must then fail
 * its check ("copied bytes are wrong") instead of posting a fast figure.
 * With WEX_BENCH_LOSE=fixed the same-address syncs are the ones made view
 * syncs: "same-address remapped bytes are wrong".
 */
#include <dlfcn.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "wex.h"

typedef int (*sync_fn)(wex_client_t *, int, uint64_t, uint32_t, struct wex_sync_result *);

int wex_sync(wex_client_t *c, int mode, uint64_t min_version, uint32_t timeout_ms,
	     struct wex_sync_result *res)
{
	sync_fn real = (sync_fn)dlsym(RTLD_NEXT, "wex_sync");
	/* WEX_BENCH_LOSE=fixed: the same-address syncs map nothing instead
	 * (the engine's buffer keeps its own memory). */
	const char *lose = getenv("WEX_BENCH_LOSE");
	int lost = lose && !strcmp(lose, "fixed") ? WEX_SYNC_REMAP_FIXED : WEX_SYNC_COPY;

	if (!real)
		return -ENOSYS;
	return real(c, mode == lost ? WEX_SYNC_REMAP_VIEW : mode, min_version, timeout_ms, res);
}
