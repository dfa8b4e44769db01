/* SPDX-License-Identifier: MIT */
/*
 * round_repeat - a rank that syncs again the version its whole group
 * already holds does not hold the producer until its idle peers take that
 * version again (they never would: they wait for the next one, which the
 * producer cannot write).  Both ranks of a group copy v1; then:
 *   1. rank 0 copies v1 again (a repeated request: the same connection);
 *   2. rank 0's engine restarts (a new connection) and copies v1;
 * and after each, with rank 1 doing nothing, the producers' begin_write of
 * the next version is granted at once and both ranks get it.  Then, in a
 * group of 4 whose ranks 2 and 3 left after taking a version:
 *   3. rank 0 syncs it again (a round that waits for the empty slots) and
 *      rank 1, passed when that round opened, syncs it again too: it gets
 *      it at once instead of waiting for its peers; ranks 2 and 3 come
 *      back, take it, and the producers write the next version.
 *   4. a rank whose sync failed (its release says so) is not taken for
 *      holding that version: a round its peer opens on it again waits
 *      for it (begin_write EBUSY), until it syncs again.
 *   5. a rank that took an open round and died: its restarted process
 *      takes the round's version at once (its peer idle), and the round
 *      still waits for the peer;
 *   6. a rank that took an open round and said its sync failed: the round
 *      waits for it again (its peer's take does not close it), and its
 *      retry takes the version at once;
 *   7. a rank that took an open round and syncs its version again (its
 *      peer idle) gets it at once, nothing to copy;
 *   8. a rank that views an open round's version (its lease held),
 *      attaches new buffers and copies that version into them (the lease
 *      kept): the round counts it again, and once its peer took the
 *      version the producers write the next (before: the round waited
 *      for it for good, begin_write EBUSY, every sync of the next
 *      version ETIMEDOUT).
 * Rank 1
 * passes the round its peer opens because it holds v1 from this wexd in
 * this epoch; a rank that never took v1 would still be waited for (the
 * group atomicity tests).  Before, each begin_write ended in EBUSY
 * ("group ... waits for 1 of 2 ranks to take v1").
 */
#include <errno.h>
#include <string.h>
#include <unistd.h>

#include "fixture.h"

#define MODEL "repeat"
#define PRESET "tiny"

static struct t_prod P[2];
static struct t_cons C[2], W[4];

static void copy_into(struct t_cons *k, const char *who, uint32_t r, uint64_t v)
{
	struct wex_sync_result res;
	int ret = wex_sync(k->c, WEX_SYNC_COPY, v, 5000, &res);

	T_ASSERT(ret == 0, "%s rank %u: copy sync of v%llu: %s (%s)", who, r, (unsigned long long)v,
		 wex_strerror(ret), wex_last_error(k->c));
	T_ASSERT(res.version == v, "%s rank %u got v%llu, not v%llu", who, r,
		 (unsigned long long)res.version, (unsigned long long)v);
	T_ASSERT(ex_check(NULL, k->t, (size_t)k->n, v, 1) == 0, "%s rank %u: v%llu copied wrong", who,
		 r, (unsigned long long)v);
}

static void copy_version(uint32_t r, uint64_t v)
{
	copy_into(&C[r], "engine", r, v);
}

/* With rank 1 idle, begin_write of v must be granted (3 s at most: the
 * old behaviour waited out the timeout), then v published and copied by
 * both ranks, every byte checked. */
static void next_version(uint64_t v, const char *after)
{
	for (uint32_t r = 0; r < 2; r++) {
		int ret = wex_begin_write(P[r].c, v, 3000);

		T_ASSERT(ret == 0, "after %s: begin_write v%llu on producer rank %u: %s (%s)", after,
			 (unsigned long long)v, r, wex_strerror(ret), wex_last_error(P[r].c));
	}
	for (uint32_t r = 0; r < 2; r++) {
		ex_fill(P[r].base, P[r].t, (size_t)P[r].n, v, 1);
		T_WEX(P[r].c, wex_publish(P[r].c, v));
	}
	for (uint32_t r = 0; r < 2; r++) {
		copy_version(r, v);
		T_ASSERT(ex_check(NULL, C[r].t, (size_t)C[r].n, v, 1) == 0,
			 "after %s: rank %u's copy of v%llu is wrong", after, r, (unsigned long long)v);
	}
}

/* A consumer of group `group` that speaks the protocol itself (to say
 * that its sync failed): the connected fd, hello answered. */
static int raw_consumer(const char *sock, const char *group, uint32_t rank)
{
	int fd = t_raw_connect(sock);
	char req[256];
	json_t *rep;

	snprintf(req, sizeof(req),
		 "{\"v\":1,\"op\":\"hello\",\"role\":\"consumer\",\"model\":\"%s\","
		 "\"group\":\"%s\",\"rank\":%u,\"world\":2}", MODEL, group, rank);
	rep = t_raw_rpc(fd, req, NULL, 0);
	T_ASSERT(!strcmp(t_code(rep), "OK"), "%s rank %u: hello: %s", group, rank, t_msg(rep));
	json_decref(rep);
	return fd;
}

/* The raw rank's acquire of v (a copy lease), granted within timeout_ms. */
static void raw_acquire(int fd, const char *who, uint64_t v, int timeout_ms)
{
	char req[160];
	json_t *rep;

	snprintf(req, sizeof(req), "{\"v\":1,\"op\":\"acquire\",\"min_version\":%llu,"
		 "\"mode\":1,\"timeout_ms\":%d}", (unsigned long long)v, timeout_ms);
	rep = t_raw_rpc(fd, req, NULL, 0);
	T_ASSERT(!strcmp(t_code(rep), "OK"), "%s: acquire v%llu within %d ms: %s", who,
		 (unsigned long long)v, timeout_ms, t_msg(rep));
	T_ASSERT((uint64_t)json_integer_value(json_object_get(rep, "version")) == v,
		 "%s: got v%lld, not v%llu", who,
		 (long long)json_integer_value(json_object_get(rep, "version")),
		 (unsigned long long)v);
	json_decref(rep);
}

/* Its release of v, saying whether the sync under it failed. */
static void raw_release(int fd, const char *who, uint64_t v, int failed)
{
	char req[128];
	json_t *rep;

	snprintf(req, sizeof(req), "{\"v\":1,\"op\":\"release\",\"version\":%llu%s}",
		 (unsigned long long)v, failed ? ",\"failed\":true" : "");
	rep = t_raw_rpc(fd, req, NULL, 0);
	T_ASSERT(!strcmp(t_code(rep), "OK"), "%s: release v%llu: %s", who, (unsigned long long)v,
		 t_msg(rep));
	json_decref(rep);
}

/* begin_write of v must be refused (EBUSY) within ms: a round waits. */
static void write_refused(uint64_t v, int ms, const char *why)
{
	int ret = wex_begin_write(P[0].c, v, ms);

	T_ASSERT(ret == -EBUSY, "begin_write v%llu while %s: %s, expected EBUSY",
		 (unsigned long long)v, why, wex_strerror(ret));
}

int main(void)
{
	struct t_wexd d;

	t_wexd_start(&d);
	for (uint32_t r = 0; r < 2; r++)
		t_prod_open(&P[r], MODEL, PRESET, r, 2);
	for (uint32_t r = 0; r < 2; r++)
		t_cons_open(&C[r], MODEL, "engine", PRESET, r, 2);
	t_prod_write(&P[0], 1);
	t_prod_write(&P[1], 1);
	for (uint32_t r = 0; r < 2; r++)
		copy_version(r, 1);

	/* 1. The same connection syncs v1 again. */
	copy_version(0, 1);
	next_version(2, "rank 0 synced v1 again");

	/* 2. Rank 0's engine restarts and copies v2, which rank 1 holds. */
	t_cons_close(&C[0]);
	t_cons_open(&C[0], MODEL, "engine", PRESET, 0, 2);
	copy_version(0, 2);
	T_ASSERT(ex_check(NULL, C[0].t, (size_t)C[0].n, 2, 1) == 0, "the restarted rank's v2 is wrong");
	next_version(3, "rank 0 restarted and took v2");

	/* 3. A group of 4 (reserved against producer ranks 0, 1, 0, 1). */
	for (uint32_t r = 0; r < 4; r++)
		t_cons_open_from(&W[r], MODEL, "wide", PRESET, r, 4, r % 2);
	for (uint32_t r = 0; r < 4; r++)
		copy_into(&W[r], "wide", r, 3);
	t_cons_close(&W[2]);
	t_cons_close(&W[3]);
	copy_into(&W[0], "wide", 0, 3);
	copy_into(&W[1], "wide", 1, 3);
	for (uint32_t r = 2; r < 4; r++) {
		t_cons_open_from(&W[r], MODEL, "wide", PRESET, r, 4, r % 2);
		copy_into(&W[r], "wide", r, 3);
	}
	next_version(4, "a group of 4 took v3 again");
	for (uint32_t r = 0; r < 4; r++) {
		copy_into(&W[r], "wide", r, 4);
		t_cons_close(&W[r]);
	}

	/* 4. Rank 1 of group "raw" speaks the protocol itself, to say that
	 * its sync of v4 failed. */
	{
		int fd = raw_consumer(d.sock, "raw", 1);

		t_cons_open_from(&W[0], MODEL, "raw", PRESET, 0, 2, 0);
		copy_into(&W[0], "raw", 0, 4);
		raw_acquire(fd, "raw rank 1", 4, 5000);
		raw_release(fd, "raw rank 1", 4, 1);
		copy_into(&W[0], "raw", 0, 4);
		write_refused(5, 500, "the round on v4 waits for a rank whose sync of v4 failed");
		raw_acquire(fd, "raw rank 1, again", 4, 5000);
		raw_release(fd, "raw rank 1", 4, 0);
		next_version(5, "the rank whose sync failed took v4");
		close(fd);
		t_cons_close(&W[0]);
	}

	/* 5. Rank 0 of group "mid" takes v5 (the round waits for rank 1)
	 * and its engine dies; the restarted rank 0 syncs v5: it gets it at
	 * once, not after rank 1 closes the round (before: ETIMEDOUT, since
	 * rank 1 is idle).  Rank 1 then takes v5 and the producers go on. */
	for (uint32_t r = 0; r < 2; r++)
		t_cons_open_from(&W[r], MODEL, "mid", PRESET, r, 2, r);
	copy_into(&W[0], "mid", 0, 5);
	t_cons_close(&W[0]);
	t_cons_open_from(&W[0], MODEL, "mid", PRESET, 0, 2, 0);
	{
		struct wex_sync_result res;
		int ret = wex_sync(W[0].c, WEX_SYNC_COPY, 5, 1500, &res);

		T_ASSERT(ret == 0, "mid rank 0, restarted after taking the open round on v5: copy "
			 "sync of v5: %s (%s), expected it at once", wex_strerror(ret),
			 wex_last_error(W[0].c));
		T_ASSERT(res.version == 5 && ex_check(NULL, W[0].t, (size_t)W[0].n, 5, 1) == 0,
			 "mid rank 0, restarted: v%llu copied, or copied wrong",
			 (unsigned long long)res.version);
	}
	write_refused(6, 300, "group mid's round on v5 waits for rank 1");
	copy_into(&W[1], "mid", 1, 5);
	next_version(6, "a restarted rank took its group's open round");
	for (uint32_t r = 0; r < 2; r++)
		t_cons_close(&W[r]);

	/* 6. Rank 0 of group "fail" (raw protocol) takes v6, the round
	 * waiting for rank 1, and says its sync failed: the round waits for
	 * rank 0 again after rank 1 took v6, and rank 0's retry takes v6 at
	 * once. */
	{
		int fd = raw_consumer(d.sock, "fail", 0);

		t_cons_open_from(&W[1], MODEL, "fail", PRESET, 1, 2, 1);
		raw_acquire(fd, "fail rank 0", 6, 5000);
		raw_release(fd, "fail rank 0", 6, 1);
		/* Rank 1 takes v6: the round still waits for rank 0, which
		 * holds no good copy (before: it closed, and the producer
		 * could write v7 while rank 0 had none of v6). */
		copy_into(&W[1], "fail", 1, 6);
		write_refused(7, 300, "group fail's round on v6 waits for rank 0, whose sync of v6 "
			      "failed");
		raw_acquire(fd, "fail rank 0, again after a failed sync (at once)", 6, 1500);
		raw_release(fd, "fail rank 0", 6, 0);
		next_version(7, "a rank whose sync failed took its group's round again");
		close(fd);
		t_cons_close(&W[1]);
	}

	/* 7. Rank 0 of group "again" copies v7, the round waiting for rank
	 * 1, and syncs v7 again (a repeated request while its peer has not
	 * synced, or never will): it gets v7 at once, nothing to copy
	 * (before: it waited for rank 1, ETIMEDOUT); the round still waits
	 * for rank 1. */
	for (uint32_t r = 0; r < 2; r++)
		t_cons_open_from(&W[r], MODEL, "again", PRESET, r, 2, r);
	copy_into(&W[0], "again", 0, 7);
	{
		struct wex_sync_result res;
		int ret = wex_sync(W[0].c, WEX_SYNC_COPY, 7, 1500, &res);

		T_ASSERT(ret == 0, "again rank 0: v7 again while its group's round waits for rank "
			 "1: %s (%s), expected it at once", wex_strerror(ret), wex_last_error(W[0].c));
		T_ASSERT(res.version == 7 && res.changed == 0,
			 "again rank 0: v%llu again, %d changed: expected v7, nothing copied",
			 (unsigned long long)res.version, (int)res.changed);
		write_refused(8, 300, "group again's round on v7 waits for rank 1");
	}
	copy_into(&W[1], "again", 1, 7);
	next_version(8, "a rank synced its group's open round again");
	for (uint32_t r = 0; r < 2; r++)
		t_cons_close(&W[r]);

	/* 8. Rank 0 of group "attach" views v8 (the round waits for rank
	 * 1), attaches its own buffers and copies v8 into them under the
	 * lease it holds. */
	for (uint32_t r = 0; r < 2; r++)
		t_cons_open_from(&W[r], MODEL, "attach", PRESET, r, 2, r);
	{
		struct wex_sync_result res;

		T_WEX(W[0].c, wex_sync(W[0].c, WEX_SYNC_REMAP_VIEW, 8, 5000, &res));
		T_ASSERT(res.version == 8, "attach rank 0 viewed v%llu, not v8",
			 (unsigned long long)res.version);
		T_WEX(W[0].c, wex_attach(W[0].c, W[0].t, (size_t)W[0].n));
		memset(W[0].region, 0, W[0].seg_bytes);
	}
	copy_into(&W[0], "attach (new buffers, lease kept)", 0, 8);
	write_refused(9, 300, "group attach's round on v8 waits for rank 1");
	copy_into(&W[1], "attach", 1, 8);
	next_version(9, "a rank attached new buffers and copied its lease's version into them");
	for (uint32_t r = 0; r < 2; r++)
		t_cons_close(&W[r]);

	printf("round_repeat: a repeated sync and a restarted rank each took the version their "
	       "group held; begin_write of the next granted with the peer idle, both ranks got it; "
	       "a passed rank of a waiting round took its version again at once\n");
	for (uint32_t r = 0; r < 2; r++) {
		t_cons_close(&C[r]);
		t_prod_close(&P[r]);
	}
	t_wexd_stop(&d);
	printf("round_repeat: PASS\n");
	return 0;
}
