/* SPDX-License-Identifier: MIT */
/*
 * plan_cache - proves that wexd's plan cache holds only plans a connected
 * consumer can still use, so that no client can make wexd keep one plan
 * memfd per layout it ever showed:
 *  - a consumer that attaches 40 different layouts on one connection,
 *    fetching after each, leaves wexd with one plan for it (the last),
 *    and wexd's fd count grows by at most that plan;
 *  - after the producer registers another segment (the model's layout
 *    generation moves on), the consumer's next fetch leaves no plan of
 *    the older generation behind;
 *  - consumers of 40 other group sizes that attach the same layout, fetch
 *    and leave take their plans with them (a plan is keyed by rank and
 *    world too, and only a rank it was made for keeps it).
 *
 * Found by review: plans were forgotten only when a consumer disconnected
 * or a producer re-registered its tensors, so attach + fetch in a loop
 * grew wexd's fds (one sealed memfd per plan) until it ran out of them.
 */
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "helpers.h"
#include "ipc/sock.h"
#include "proto.h"
#include "wex.h"

#define MODEL "plans"
#define LAYOUTS 40

static void ok(int fd, const char *req, const int *fds, int nfds, const char *what)
{
	json_t *r = t_raw_rpc(fd, req, fds, nfds);

	T_ASSERT(!strcmp(t_code(r), "OK"), "%s: %s: %s", what, t_code(r), t_msg(r));
	json_decref(r);
}

/* A sealed table of one 1 KiB u8 tensor "w" at `off` of segment `seg`. */
static int table(uint32_t seg, uint64_t off)
{
	struct wex_tensor t;
	int fd;

	t_u8_tensor(&t, "w", 1024, seg, off);
	fd = wex__table_pack(&t, NULL, 1);
	T_ASSERT(fd >= 0, "pack a table");
	return fd;
}

/* Plans of MODEL in wexd's `plans` listing: all, and of an older layout
 * generation (stale). */
static void count_plans(int ctl, int *all, int *stale)
{
	json_t *r = t_raw_rpc(ctl, "{\"v\":1,\"op\":\"plans\"}", NULL, 0), *p;
	size_t i;

	T_ASSERT(!strcmp(t_code(r), "OK"), "plans: %s", t_msg(r));
	*all = *stale = 0;
	json_array_foreach(json_object_get(r, "plans"), i, p) {
		if (strcmp(json_string_value(json_object_get(p, "model")) ?: "", MODEL))
			continue;
		(*all)++;
		/* A JSON boolean, as every yes/no of wexd's listings: the
		 * string "no" is true to jq and to Python. */
		T_ASSERT(json_is_boolean(json_object_get(p, "stale")),
			 "plans: 'stale' is not a JSON boolean");
		*stale += json_is_true(json_object_get(p, "stale"));
	}
	json_decref(r);
}

static int memfd(size_t size)
{
	int fd = memfd_create("t-plan-seg", MFD_CLOEXEC);

	T_ASSERT(fd >= 0 && ftruncate(fd, (off_t)size) == 0, "memfd");
	return fd;
}

int main(void)
{
	struct t_wexd d;
	int ctl, prod, cons, fd, all, stale, before, after;

	t_wexd_start(&d);
	t_check_backend(d.sock);
	ctl = t_raw_connect(d.sock);

	prod = t_raw_connect(d.sock);
	ok(prod, "{\"v\":1,\"op\":\"hello\",\"role\":\"producer\",\"model\":\"" MODEL "\"}", NULL, 0,
	   "producer hello");
	fd = memfd(4096);
	ok(prod, "{\"v\":1,\"op\":\"register_segment\",\"kind\":\"host\",\"size\":4096}", &fd, 1,
	   "segment 0");
	close(fd);
	fd = table(0, 0);
	ok(prod, "{\"v\":1,\"op\":\"register_tensors\"}", &fd, 1, "tensors");
	close(fd);
	ok(prod, "{\"v\":1,\"op\":\"begin_write\",\"version\":1}", NULL, 0, "begin_write v1");
	ok(prod, "{\"v\":1,\"op\":\"publish\",\"version\":1}", NULL, 0, "publish v1");

	cons = t_raw_connect(d.sock);
	ok(cons, "{\"v\":1,\"op\":\"hello\",\"role\":\"consumer\",\"model\":\"" MODEL "\"}", NULL, 0,
	   "consumer hello");
	/* One layout and its plan (and the model's cached tables) first. */
	fd = table(0, 0);
	ok(cons, "{\"v\":1,\"op\":\"attach\"}", &fd, 1, "attach layout 0");
	close(fd);
	ok(cons, "{\"v\":1,\"op\":\"fetch\"}", NULL, 0, "fetch with layout 0");
	before = t_wexd_fds_settle(&d, -1);

	/* The same tensor at another offset of the consumer's own memory: a
	 * different layout (another plan-cache key), as valid as the first. */
	for (int i = 1; i < LAYOUTS; i++) {
		fd = table(0, (uint64_t)i * 1024);
		ok(cons, "{\"v\":1,\"op\":\"attach\"}", &fd, 1, "attach another layout");
		close(fd);
		ok(cons, "{\"v\":1,\"op\":\"fetch\"}", NULL, 0, "fetch with another layout");
	}
	count_plans(ctl, &all, &stale);
	after = t_wexd_fds_settle(&d, -1);
	printf("after %d layouts on one connection: %d plan(s) cached, wexd fds %d -> %d\n",
	       LAYOUTS, all, before, after);
	T_ASSERT(all == 1, "wexd caches %d plans for one consumer that showed %d layouts in turn: "
		 "only its current layout's plan can be used", all, LAYOUTS);
	T_ASSERT(after <= before + 1, "wexd's fds grew from %d to %d over %d attach+fetch rounds",
		 before, after, LAYOUTS);

	/* The producer registers more memory: the layout generation moves on
	 * and the consumer's next fetch plans against the new one. */
	fd = memfd(4096);
	ok(prod, "{\"v\":1,\"op\":\"register_segment\",\"kind\":\"host\",\"size\":4096}", &fd, 1,
	   "segment 1");
	close(fd);
	ok(cons, "{\"v\":1,\"op\":\"fetch\"}", NULL, 0, "fetch after the new segment");
	count_plans(ctl, &all, &stale);
	printf("after a new producer segment and a fetch: %d plan(s), %d stale\n", all, stale);
	T_ASSERT(stale == 0 && all == 1,
		 "%d plan(s) of an older layout generation kept (%d in all) after the consumer "
		 "fetched against the new one", stale, all);

	/* Consumers of other worlds with the same layout, each gone after
	 * its fetch, while this one stays: their plans (keyed by rank and
	 * world too) go with them, not kept alive by the layout alone. */
	before = t_wexd_fds_settle(&d, -1);
	for (int w = 2; w < 2 + LAYOUTS; w++) {
		char hello[256];
		int other = t_raw_connect(d.sock);

		snprintf(hello, sizeof(hello),
			 "{\"v\":1,\"op\":\"hello\",\"role\":\"consumer\",\"model\":\"" MODEL
			 "\",\"group\":\"x\",\"rank\":0,\"world\":%d}", w);
		ok(other, hello, NULL, 0, "hello of a consumer of another world");
		fd = table(0, (uint64_t)(LAYOUTS - 1) * 1024); /* cons's current layout */
		ok(other, "{\"v\":1,\"op\":\"attach\"}", &fd, 1, "attach the same layout");
		close(fd);
		ok(other, "{\"v\":1,\"op\":\"fetch\"}", NULL, 0, "fetch for another world");
		close(other);
	}
	after = t_wexd_fds_settle(&d, before); /* (the last hang-up seen) */
	count_plans(ctl, &all, &stale);
	printf("after %d consumers of other worlds with the same layout came and went: %d plan(s), "
	       "wexd fds %d -> %d\n", LAYOUTS, all, before, after);
	T_ASSERT(all == 1 && after <= before,
		 "%d plan(s) kept (wexd fds %d -> %d) for consumers that left: a plan of another "
		 "rank or world was kept alive by a remaining consumer's layout", all, before, after);

	close(cons);
	close(prod);
	close(ctl);
	t_wexd_stop(&d);
	return T_EXIT_PASS;
}
