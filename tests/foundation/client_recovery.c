/* SPDX-License-Identifier: MIT */
/*
 * client_recovery - libwex keeps its state true to wexd's when a call
 * fails half-way:
 *  - wexd restarted during a copy sync (or killed, and not yet back when
 *    the copy ends): the lease went with it and the producer wrote meanwhile, so the sync reports -WEX_EDIRTY (weights
 *    marked dirty), or, when the copy was over before the restart (or the
 *    restart came during the fetch and the sync acquired again), 0 with
 *    every byte of the version it reports, or, when the restart came before the
 *    copy, an error with nothing written; never mixed weights called
 *    clean.  The next sync copies the new version whole;
 *  - a wait with no limit (UINT32_MAX ms) waits, not 5 s (no wrap);
 *  - a wexd that stops answering: the call times out and drops the
 *    connection, so the next request does not read the stale reply;
 *  - a REMAP_FIXED sync refused for one region maps none of them;
 *  - a tensor table wexd refused is not kept: after a wexd restart the
 *    producer re-registers the table wexd last accepted and writes on;
 *  - a fetch that failed is retried by the next sync, not taken as done;
 *  - wex_reserve waits for the producer to register (up to the client's
 *    timeout, then -ETIMEDOUT naming the model) and refuses a producer
 *    rank or segment that does not exist: it never guesses a host region;
 *  - an acquire wexd refuses (it is shutting down) leaves the previous
 *    lease held: the consumer can still release it, and wexd's drain ends;
 *    one wexd had taken on (waiting when the drain began) has dropped it,
 *    and the client does not claim it;
 *  - a reply wexd cannot send (a client that does not read its fetch
 *    replies) drops that connection at once instead of leaving the client
 *    waiting for a reply that never comes;
 *  - a consumer out of file descriptors (the kernel drops the fds of the
 *    fetch reply) gets -EMFILE naming its limit, not "malformed reply", and
 *    the next sync, with fds to spare, succeeds.
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "helpers.h"
#include "ipc/sock.h"
#include "wex.h"

#define BIG (256ull << 20)
#define ZERO16 "00000000000000000000000000000000"
/* A legacy IPC handle's 64 bytes, in hex. */
#define ZERO64 ZERO16 ZERO16 ZERO16 ZERO16

static wex_client_t *opn(int role, const char *model, uint32_t timeout_ms)
{
	struct wex_client_params p = {
		.field_mask = WEX_CLIENT_FIELD_ROLE | WEX_CLIENT_FIELD_MODEL | WEX_CLIENT_FIELD_RANK |
			      WEX_CLIENT_FIELD_TIMEOUT | WEX_CLIENT_FIELD_COPY_THREADS,
		.role = role, .model = model, .rank = 0, .world_size = 1, .timeout_ms = timeout_ms,
		.copy_threads = 1,
	};
	wex_client_t *c = NULL;
	int ret = wex_client_open(&p, &c);

	T_ASSERT(ret == 0, "wex_client_open(%s): %s", model, wex_strerror(ret));
	return c;
}

/* (Up to 60 s for the write: it may wait for a consumer's copy of BIG
 * bytes on one thread, which took over 5 s under ASan beside the suite's
 * heaviest tests.) */
static void write_v(wex_client_t *p, void *base, uint64_t n, uint64_t v)
{
	T_WEX(p, wex_begin_write(p, v, 60000));
	memset(base, (int)v, n);
	T_WEX(p, wex_publish(p, v));
}

static uint64_t count_not(const unsigned char *b, uint64_t n, unsigned char v)
{
	uint64_t bad = 0;

	for (uint64_t i = 0; i < n; i++)
		bad += b[i] != v;
	return bad;
}

struct job {
	wex_client_t *c;
	int mode;
	uint64_t min;
	uint32_t wait;
	int ret;
	struct wex_sync_result r;
};

static void *syncer(void *a)
{
	struct job *j = a;

	j->ret = wex_sync(j->c, j->mode, j->min, j->wait, &j->r);
	return NULL;
}

/* A producer of model `model` that published v1 of one BIG-byte tensor
 * (its segment at base), a consumer that attached a zeroed buffer (buf)
 * for it, and that consumer's copy sync of v1 (j) running in thread th. */
struct copy_case {
	wex_client_t *p, *k;
	unsigned char *buf;
	void *base;
	struct job j;
	pthread_t th;
};

/* Sets the case up and starts the copy sync, returning once wexd holds its
 * lease.  `fetched`: a view sync fetched the plan before, so the copy sync
 * is acquire, copy, release. */
static void copy_case_start(struct t_wexd *d, struct copy_case *cc, const char *model,
			    int fetched)
{
	struct wex_tensor t;
	uint32_t seg;

	memset(cc, 0, sizeof(*cc));
	cc->p = opn(WEX_ROLE_PRODUCER, model, 5000);
	cc->k = opn(WEX_ROLE_CONSUMER, model, 5000);
	cc->buf = malloc(BIG);
	T_ASSERT(cc->buf, "malloc");
	T_WEX(cc->p, wex_segment_alloc(cc->p, WEX_SEG_HOST, 0, BIG, &seg, &cc->base));
	t_u8_tensor(&t, "w", BIG, seg, 0);
	T_WEX(cc->p, wex_register_tensors(cc->p, &t, 1));
	write_v(cc->p, cc->base, BIG, 1);
	memset(cc->buf, 0, BIG);
	t.ptr = cc->buf;
	T_WEX(cc->k, wex_attach(cc->k, &t, 1));
	if (fetched) {
		T_WEX(cc->k, wex_sync(cc->k, WEX_SYNC_REMAP_VIEW, 1, 5000, &cc->j.r));
		T_WEX(cc->k, wex_release(cc->k));
	}
	cc->j = (struct job){ .c = cc->k, .mode = WEX_SYNC_COPY, .min = 1, .wait = 5000 };
	T_ASSERT(pthread_create(&cc->th, NULL, syncer, &cc->j) == 0, "thread");
	while (t_leases(d->sock, model) == 0)
		usleep(100);
}

/* Once v2 is being written or written: the next copy sync holds v2 whole,
 * however the one in the thread ended. */
static void copy_case_end(struct copy_case *cc)
{
	T_WEX(cc->k, wex_sync(cc->k, WEX_SYNC_COPY, 2, 5000, &cc->j.r));
	T_ASSERT(cc->j.r.version == 2 && count_not(cc->buf, BIG, 2) == 0 && !wex_is_dirty(cc->k),
		 "the next copy sync holds v2 whole");
	wex_client_close(cc->k);
	wex_client_close(cc->p);
	free(cc->buf);
}

static void restart_during_copy(struct t_wexd *d)
{
	struct copy_case cc;
	struct job *j = &cc.j;

	copy_case_start(d, &cc, "rc-copy", 0);
	t_wexd_kill(d);
	t_wexd_restart(d);
	write_v(cc.p, cc.base, BIG, 2); /* the new daemon knows no lease */
	pthread_join(cc.th, NULL);
	if (j->ret == 0) {
		/* Over before the restart (v1), or the restart came during the
		 * fetch and the sync acquired again from the new daemon (v1,
		 * or v2 once the producer's write was done): whole either way. */
		T_ASSERT((j->r.version == 1 || j->r.version == 2) &&
				 count_not(cc.buf, BIG, (unsigned char)j->r.version) == 0 &&
				 !wex_is_dirty(cc.k),
			 "a copy sync that succeeded holds its version (v%llu) whole",
			 (unsigned long long)j->r.version);
		printf("restart during copy: the sync succeeded with v%llu whole\n",
		       (unsigned long long)j->r.version);
	} else if (j->ret != -WEX_EDIRTY) {
		/* The restart came before the copy (during the fetch, or the
		 * reconnect found the new daemon not yet up). */
		T_ASSERT(!wex_is_dirty(cc.k) && count_not(cc.buf, BIG, 0) == 0,
			 "a sync that failed before copying (%s) wrote nothing", wex_strerror(j->ret));
		printf("restart during copy: failed before copying: %s\n", wex_last_error(cc.k));
	} else {
		T_ASSERT(wex_is_dirty(cc.k), "and the weights are marked dirty");
		printf("restart during copy: %s (%llu bytes not v1)\n", wex_last_error(cc.k),
		       (unsigned long long)count_not(cc.buf, BIG, 1));
	}
	copy_case_end(&cc);
}

/* wexd killed during a copy sync and not yet back when the copy ends: the
 * lease went with it, so the sync returns -WEX_EDIRTY with the weights
 * marked dirty (it returned the failed release's -ECONNREFUSED with the
 * copied weights called clean); or 0 with v1 whole when the copy was over
 * before the kill; or an error with nothing written when the kill came
 * before the copy. */
static void wexd_gone_during_copy(struct t_wexd *d)
{
	struct copy_case cc;
	struct job *j = &cc.j;

	copy_case_start(d, &cc, "rc-gone", 1);
	t_wexd_kill(d);
	pthread_join(cc.th, NULL);
	if (j->ret == 0) {
		T_ASSERT(j->r.version == 1 && count_not(cc.buf, BIG, 1) == 0 && !wex_is_dirty(cc.k),
			 "a copy sync that succeeded holds v1 whole");
		printf("wexd gone during copy: the copy was over before the kill\n");
	} else if (j->ret == -WEX_EDIRTY) {
		T_ASSERT(wex_is_dirty(cc.k), "-WEX_EDIRTY, and the weights are marked dirty");
		printf("wexd gone during copy: %s\n", wex_last_error(cc.k));
	} else {
		T_ASSERT(!wex_is_dirty(cc.k) && count_not(cc.buf, BIG, 0) == 0,
			 "a copy sync that failed (%s: %s) and left the weights clean wrote nothing "
			 "(%llu bytes written)", wex_strerror(j->ret), wex_last_error(cc.k),
			 (unsigned long long)count_not(cc.buf, BIG, 0));
		printf("wexd gone during copy: failed before copying: %s\n", wex_last_error(cc.k));
	}
	t_wexd_restart(d);
	write_v(cc.p, cc.base, BIG, 2);
	copy_case_end(&cc);
}

static void waits_and_timeouts(struct t_wexd *d)
{
	wex_client_t *p = opn(WEX_ROLE_PRODUCER, "rc-wait", 5000);
	wex_client_t *k = opn(WEX_ROLE_CONSUMER, "rc-wait", 5000);
	struct job j = { .c = k, .mode = WEX_SYNC_REMAP_VIEW, .min = 2, .wait = UINT32_MAX };
	struct wex_tensor t;
	pthread_t th;
	uint32_t seg;
	void *base;
	char *json = NULL;
	double t0;
	int ret;

	T_WEX(p, wex_segment_alloc(p, WEX_SEG_HOST, 0, 4096, &seg, &base));
	t_u8_tensor(&t, "w", 4096, seg, 0);
	T_WEX(p, wex_register_tensors(p, &t, 1));
	write_v(p, base, 4096, 1);
	/* No limit means no limit: still waiting after 6 s, served by v2. */
	T_ASSERT(pthread_create(&th, NULL, syncer, &j) == 0, "thread");
	sleep(6);
	write_v(p, base, 4096, 2);
	pthread_join(th, NULL);
	T_ASSERT(j.ret == 0 && j.r.version == 2, "a wait with no limit is served by v2: %s",
		 wex_strerror(j.ret));
	T_WEX(k, wex_release(k));

	/* wexd stops answering: the call times out and drops the connection. */
	T_ASSERT(kill(d->pid, SIGSTOP) == 0, "SIGSTOP wexd");
	t0 = t_now();
	ret = wex_sync(k, WEX_SYNC_REMAP_VIEW, 3, 100, &j.r);
	T_ASSERT(ret == -ETIMEDOUT, "a silent wexd: -ETIMEDOUT, got %s", wex_strerror(ret));
	T_ASSERT(t_now() - t0 < 30, "in about 5 s");
	T_ASSERT(kill(d->pid, SIGCONT) == 0, "SIGCONT wexd");
	write_v(p, base, 4096, 3);
	T_WEX(k, wex_request(k, "ping", NULL, &json));
	T_ASSERT(!strstr(json, "version"), "the ping gets its own reply, not the stale acquire's: %s",
		 json);
	wex_free(json);
	T_WEX(k, wex_sync(k, WEX_SYNC_REMAP_VIEW, 3, 5000, &j.r));
	T_ASSERT(j.r.version == 3, "and syncs go on");
	T_WEX(k, wex_release(k));
	wex_client_close(k);
	wex_client_close(p);
}

static void fixed_all_or_none(struct t_wexd *d)
{
	wex_client_t *p = opn(WEX_ROLE_PRODUCER, "rc-fixed", 5000);
	wex_client_t *k = opn(WEX_ROLE_CONSUMER, "rc-fixed", 5000);
	struct wex_tensor pt[2], ct[2];
	struct wex_sync_result r;
	uint32_t s0, s1;
	void *b0, *b1, *r0, *r1;
	int ret;

	T_WEX(p, wex_segment_alloc(p, WEX_SEG_HOST, 0, 8192, &s0, &b0));
	T_WEX(p, wex_segment_alloc(p, WEX_SEG_HOST, 0, 8192, &s1, &b1));
	t_u8_tensor(&pt[0], "a", 4096, s0, 0);
	t_u8_tensor(&pt[1], "b", 4096, s1, 0);
	T_WEX(p, wex_register_tensors(p, pt, 2));
	T_WEX(p, wex_begin_write(p, 1, 5000));
	memset(b0, 1, 8192);
	memset(b1, 1, 8192);
	T_WEX(p, wex_publish(p, 1));
	T_WEX(k, wex_reserve(k, 0, s0, 8192, &r0));
	T_WEX(k, wex_reserve(k, 0, s1, 8192, &r1));
	memset(r0, 0xEE, 8192);
	memset(r1, 0xEE, 8192);
	ct[0] = pt[0];
	ct[0].ptr = r0;                /* where the producer has it */
	ct[1] = pt[1];
	ct[1].ptr = (char *)r1 + 4096; /* not where the producer has it */
	T_WEX(k, wex_attach(k, ct, 2));
	ret = wex_sync(k, WEX_SYNC_REMAP_FIXED, 1, 2000, &r);
	T_ASSERT(ret == -WEX_ELAYOUT, "fixed sync with tensor b misplaced: -WEX_ELAYOUT, got %s",
		 wex_strerror(ret));
	T_ASSERT(strstr(wex_last_error(k), "'b'"), "naming b: %s", wex_last_error(k));
	T_ASSERT(count_not(r0, 8192, 0xEE) == 0, "region a still holds the consumer's own bytes");
	T_WEX(p, wex_begin_write(p, 2, 2000));
	memset(b0, 2, 8192);
	T_ASSERT(count_not(r0, 8192, 0xEE) == 0, "and the producer's next write does not show there");
	T_WEX(p, wex_publish(p, 2));
	wex_client_close(k);
	wex_client_close(p);
	(void)d;
}

static void refused_table_not_kept(struct t_wexd *d)
{
	wex_client_t *p = opn(WEX_ROLE_PRODUCER, "rc-table", 5000);
	wex_client_t *k;
	struct wex_tensor t, bad;
	struct wex_sync_result r;
	const struct wex_tensor *seen;
	size_t n;
	uint32_t seg;
	void *base;
	int ret;

	T_WEX(p, wex_segment_alloc(p, WEX_SEG_HOST, 0, 4096, &seg, &base));
	t_u8_tensor(&t, "a", 4096, seg, 0);
	T_WEX(p, wex_register_tensors(p, &t, 1));
	write_v(p, base, 4096, 1);
	t_u8_tensor(&bad, "a", 4096, seg, 4096); /* past the segment's end */
	ret = wex_register_tensors(p, &bad, 1);
	T_ASSERT(ret == -EINVAL, "a tensor past its segment: -EINVAL, got %s", wex_strerror(ret));
	t_wexd_kill(d);
	t_wexd_restart(d);
	ret = wex_begin_write(p, 2, 5000);
	T_ASSERT(ret == 0, "after a restart the producer re-registers the accepted table: %s (%s)",
		 wex_strerror(ret), wex_last_error(p));
	memset(base, 2, 4096);
	T_WEX(p, wex_publish(p, 2));
	k = opn(WEX_ROLE_CONSUMER, "rc-table", 5000);
	T_WEX(k, wex_sync(k, WEX_SYNC_REMAP_VIEW, 2, 5000, &r));
	T_WEX(k, wex_producer_tensors(k, 0, &seen, &n));
	T_ASSERT(n == 1 && seen[0].offset == 0, "the new daemon has the accepted table");
	wex_client_close(k);
	wex_client_close(p);
}

static void failed_fetch_retried(struct t_wexd *d)
{
	wex_client_t *p = opn(WEX_ROLE_PRODUCER, "rc-fetch", 5000);
	wex_client_t *k = opn(WEX_ROLE_CONSUMER, "rc-fetch", 5000);
	struct wex_tensor pt[2];
	struct wex_sync_result r;
	uint32_t s0, s2;
	void *b0, *b2;
	char *json = NULL;
	int ret;

	T_WEX(p, wex_segment_alloc(p, WEX_SEG_HOST, 0, 4096, &s0, &b0));
	t_u8_tensor(&pt[0], "a", 4096, s0, 0);
	T_WEX(p, wex_register_tensors(p, pt, 1));
	write_v(p, b0, 4096, 1);
	T_WEX(k, wex_sync(k, WEX_SYNC_REMAP_VIEW, 1, 2000, &r));
	T_WEX(k, wex_release(k));
	/* A segment no consumer can import (a legacy IPC handle that opens
	 * nothing), then a host segment with a tensor in it. */
	T_WEX(p, wex_request(p, "register_segment",
			     "{\"kind\":\"cuda_ipc\",\"size\":4096,\"device\":\"GPU-00000000-0000-0000-0000-000000000000\",\"handle\":\"" ZERO64 "\"}",
			     &json));
	wex_free(json);
	T_WEX(p, wex_segment_alloc(p, WEX_SEG_HOST, 0, 4096, &s2, &b2));
	t_u8_tensor(&pt[1], "b", 4096, s2, 0);
	T_WEX(p, wex_register_tensors(p, pt, 2));
	T_WEX(p, wex_begin_write(p, 2, 2000));
	memset(b0, 2, 4096);
	memset(b2, 2, 4096);
	T_WEX(p, wex_publish(p, 2));
	ret = wex_sync(k, WEX_SYNC_REMAP_VIEW, 0, 2000, &r);
	T_ASSERT(ret < 0, "a sync whose fetch cannot import a segment fails");
	ret = wex_sync(k, WEX_SYNC_REMAP_VIEW, 0, 2000, &r);
	T_ASSERT(ret < 0, "and so does the next one (the fetch is retried, not taken as done): %s",
		 ret < 0 ? wex_strerror(ret) : "succeeded");
	printf("failed fetch: %s\n", wex_last_error(k));
	T_ASSERT(t_leases(d->sock, "rc-fetch") == 0, "the failed syncs hold no lease");
	wex_client_close(k);
	wex_client_close(p);
}

struct late {
	wex_client_t *p;
	uint32_t seg;
	void *base;
};

static void *late_producer(void *a)
{
	struct late *l = a;
	struct wex_tensor t;

	usleep(400 * 1000);
	l->p = opn(WEX_ROLE_PRODUCER, "rc-reserve", 5000);
	T_WEX(l->p, wex_segment_alloc(l->p, WEX_SEG_HOST, 0, 8192, &l->seg, &l->base));
	t_u8_tensor(&t, "w", 8192, l->seg, 0);
	T_WEX(l->p, wex_register_tensors(l->p, &t, 1));
	return NULL;
}

static void reserve_waits_for_producer(struct t_wexd *d)
{
	wex_client_t *k = opn(WEX_ROLE_CONSUMER, "rc-reserve", 300);
	struct late l = { 0 };
	pthread_t th;
	void *r;
	double t0;
	int ret;

	/* No producer at all: a timeout that names the model. */
	t0 = t_now();
	ret = wex_reserve(k, 0, 0, 8192, &r);
	T_ASSERT(ret == -ETIMEDOUT, "reserve with no producer: -ETIMEDOUT, got %s",
		 wex_strerror(ret));
	T_ASSERT(t_now() - t0 >= 0.29, "after the client's timeout (waited %.3f s)", t_now() - t0);
	T_ASSERT(strstr(wex_last_error(k), "rc-reserve"), "naming the model: %s",
		 wex_last_error(k));
	wex_client_close(k);

	/* A producer that comes later: reserve waits for it (up to 30 s: the
	 * producer's open and registration on a loaded machine). */
	k = opn(WEX_ROLE_CONSUMER, "rc-reserve", 30000);
	T_ASSERT(pthread_create(&th, NULL, late_producer, &l) == 0, "thread");
	t0 = t_now();
	T_WEX(k, wex_reserve(k, 0, 0, 8192, &r));
	T_ASSERT(t_now() - t0 >= 0.35, "reserve waited for the producer (%.3f s)", t_now() - t0);
	pthread_join(th, NULL);
	ret = wex_reserve(k, 1, 0, 8192, &r);
	T_ASSERT(ret == -EINVAL && strstr(wex_last_error(k), "producer ranks 0..0"),
		 "a producer rank that does not exist: -EINVAL, got %s: %s", wex_strerror(ret),
		 wex_last_error(k));
	ret = wex_reserve(k, 0, l.seg + 7, 8192, &r);
	T_ASSERT(ret == -EINVAL && strstr(wex_last_error(k), "no segment"),
		 "a segment that does not exist: -EINVAL, got %s: %s", wex_strerror(ret),
		 wex_last_error(k));
	ret = wex_reserve(k, 0, l.seg, 0, &r);
	T_ASSERT(ret == -EINVAL, "a reserve of 0 bytes: -EINVAL, got %s", wex_strerror(ret));
	wex_client_close(k);
	wex_client_close(l.p);
	(void)d;
}

static int raw_draining(int fd)
{
	json_t *st = t_raw_rpc(fd, "{\"v\":1,\"op\":\"status\"}", NULL, 0);
	int draining = json_is_true(json_object_get(json_object_get(st, "daemon"), "draining"));

	json_decref(st);
	return draining;
}

static int raw_waiting_acquire(int fd)
{
	json_t *st = t_raw_rpc(fd, "{\"v\":1,\"op\":\"clients\"}", NULL, 0);
	char *s = json_dumps(st, JSON_COMPACT);
	int waiting = s && strstr(s, "\"waiting\":\"acquire\"");

	free(s);
	json_decref(st);
	return waiting;
}

static wex_client_t *opn_group(const char *model, const char *group)
{
	struct wex_client_params p = {
		.field_mask = WEX_CLIENT_FIELD_ROLE | WEX_CLIENT_FIELD_MODEL | WEX_CLIENT_FIELD_GROUP |
			      WEX_CLIENT_FIELD_TIMEOUT,
		.role = WEX_ROLE_CONSUMER, .model = model, .group = group, .timeout_ms = 5000,
	};
	wex_client_t *c = NULL;
	int ret = wex_client_open(&p, &c);

	T_ASSERT(ret == 0, "wex_client_open(%s, group %s): %s", model, group, wex_strerror(ret));
	return c;
}

/* Last: it ends wexd (a drain) and starts a new one.  Two consumers hold
 * v1: one is already waiting for v2 when wexd starts to drain (wexd took
 * that acquire on and dropped its v1 lease: the drain ends the wait, and
 * no lease is left to release), the other asks for v2 during the drain
 * (refused outright: its v1 lease stands and releases). */
static void refused_acquire_keeps_lease(struct t_wexd *d)
{
	wex_client_t *p = opn(WEX_ROLE_PRODUCER, "rc-drain", 5000);
	wex_client_t *k = opn(WEX_ROLE_CONSUMER, "rc-drain", 5000);
	wex_client_t *k2 = opn_group("rc-drain", "waiter");
	struct job j = { .c = k2, .mode = WEX_SYNC_REMAP_VIEW, .min = 2, .wait = 10000 };
	struct wex_sync_result r;
	struct wex_tensor t;
	pthread_t th;
	uint32_t seg;
	void *base;
	json_t *rep;
	int hold, ret, st = -1, draining = 0, waiting = 0;
	pid_t w = 0;

	T_WEX(p, wex_segment_alloc(p, WEX_SEG_HOST, 0, 4096, &seg, &base));
	t_u8_tensor(&t, "w", 4096, seg, 0);
	T_WEX(p, wex_register_tensors(p, &t, 1));
	write_v(p, base, 4096, 1);
	T_WEX(k, wex_sync(k, WEX_SYNC_REMAP_VIEW, 1, 2000, &r));
	T_WEX(k2, wex_sync(k2, WEX_SYNC_REMAP_VIEW, 1, 2000, &r));
	/* Another group's consumer holds a copy lease: wexd's drain waits. */
	hold = t_raw_connect(d->sock);
	rep = t_raw_rpc(hold, "{\"v\":1,\"op\":\"hello\",\"role\":\"consumer\",\"model\":\"rc-drain\",\"group\":\"hold\"}",
			NULL, 0);
	T_ASSERT(!strcmp(t_code(rep), "OK"), "hold: hello: %s", t_msg(rep));
	json_decref(rep);
	rep = t_raw_rpc(hold, "{\"v\":1,\"op\":\"acquire\",\"mode\":1,\"timeout_ms\":2000}", NULL, 0);
	T_ASSERT(!strcmp(t_code(rep), "OK"), "hold: acquire: %s", t_msg(rep));
	json_decref(rep);
	T_ASSERT(pthread_create(&th, NULL, syncer, &j) == 0, "thread");
	for (double t0 = t_now(); !waiting && t_now() - t0 < 5.0;)
		waiting = raw_waiting_acquire(hold);
	T_ASSERT(waiting, "k2 waits for v2 (its v1 lease dropped)");
	T_ASSERT(kill(d->pid, SIGTERM) == 0, "SIGTERM wexd");
	for (double t0 = t_now(); !draining && t_now() - t0 < 5.0;)
		draining = raw_draining(hold);
	T_ASSERT(draining, "wexd drains");
	pthread_join(th, NULL);
	T_ASSERT(j.ret == -ESHUTDOWN, "the waiting acquire ends with -ESHUTDOWN, got %s",
		 wex_strerror(j.ret));
	ret = wex_release(k2);
	T_ASSERT(ret == -ENOENT && !strcmp(wex_last_error(k2), "no lease held"),
		 "and k2 knows it holds no lease (wexd dropped it), without asking wexd: %s (%s)",
		 wex_strerror(ret), wex_last_error(k2));

	ret = wex_sync(k, WEX_SYNC_REMAP_VIEW, 2, 1000, &r);
	T_ASSERT(ret == -ESHUTDOWN, "an acquire while wexd drains: -ESHUTDOWN, got %s",
		 wex_strerror(ret));
	ret = wex_release(k);
	T_ASSERT(ret == 0, "the v1 lease is still held and releases: %s (%s)", wex_strerror(ret),
		 wex_last_error(k));
	close(hold);
	/* (wexd's exit, leak check and all, may take seconds on a loaded
	 * machine: 30 s at most.) */
	for (double t0 = t_now(); w == 0 && t_now() - t0 < 30.0; usleep(10000))
		w = waitpid(d->pid, &st, WNOHANG);
	T_ASSERT(w == d->pid && WIFEXITED(st) && WEXITSTATUS(st) == 0,
		 "the drain ends once the copy lease is gone: wexd exits 0");
	d->pid = 0;
	wex_client_close(k);
	wex_client_close(k2);
	wex_client_close(p);
	t_wexd_restart(d);
}

/* A client that sends fetches and reads none of the replies: once wexd
 * cannot queue one more (its send buffer is full), it drops the
 * connection, and the client reads the replies that went out, then EOF. */
static void unsendable_reply_drops(struct t_wexd *d)
{
	wex_client_t *p = opn(WEX_ROLE_PRODUCER, "rc-send", 5000);
	const char *fetch = "{\"v\":1,\"op\":\"fetch\"}";
	struct wex_tensor t;
	uint32_t seg;
	void *base;
	json_t *rep;
	int fd, sent, got = 0, eof = 0;

	T_WEX(p, wex_segment_alloc(p, WEX_SEG_HOST, 0, 4096, &seg, &base));
	t_u8_tensor(&t, "w", 4096, seg, 0);
	T_WEX(p, wex_register_tensors(p, &t, 1));
	write_v(p, base, 4096, 1);
	fd = t_raw_connect(d->sock);
	rep = t_raw_rpc(fd, "{\"v\":1,\"op\":\"hello\",\"role\":\"consumer\",\"model\":\"rc-send\"}",
			NULL, 0);
	T_ASSERT(!strcmp(t_code(rep), "OK"), "hello: %s", t_msg(rep));
	json_decref(rep);
	/* Send as wexd takes them; it stops taking them once it has dropped
	 * the connection (or the replies it queued fill its buffer). */
	for (sent = 0; sent < 20000; sent++) {
		struct pollfd pf = { .fd = fd, .events = POLLOUT };

		if (poll(&pf, 1, 1000) <= 0 || !(pf.revents & POLLOUT) ||
		    wex_sock_send(fd, fetch, strlen(fetch), NULL, 0, MSG_DONTWAIT) < 0)
			break;
	}
	for (;;) {
		struct pollfd pf = { .fd = fd, .events = POLLIN };
		char buf[8192];
		int fds[WEX_SOCK_MAX_FDS], nfds = 0, mflags = 0;
		ssize_t n;

		if (poll(&pf, 1, 5000) <= 0)
			break;
		n = wex_sock_recv(fd, buf, sizeof(buf), fds, WEX_SOCK_MAX_FDS, &nfds, &mflags, 0);
		wex_sock_close_fds(fds, nfds);
		if (n <= 0) {
			eof = 1;
			break;
		}
		got++;
	}
	printf("unread fetches: %d sent, %d replies, then %s\n", sent, got,
	       eof ? "EOF" : "nothing for 5 s");
	T_ASSERT(got < sent, "wexd could not send every reply (%d of %d): raise the count", got,
		 sent);
	T_ASSERT(eof, "the connection whose reply could not go out is closed, not left waiting");
	close(fd);
	T_ASSERT(t_leases(d->sock, "rc-send") == 0, "and wexd is healthy");
	wex_client_close(p);
}

static void consumer_out_of_fds(struct t_wexd *d)
{
	wex_client_t *p = opn(WEX_ROLE_PRODUCER, "rc-fds", 5000);
	wex_client_t *k = opn(WEX_ROLE_CONSUMER, "rc-fds", 5000);
	struct wex_tensor pt[8];
	struct wex_sync_result r;
	struct rlimit old, lim;
	uint32_t seg;
	void *base[8];
	int ret;

	(void)d;
	for (int i = 0; i < 8; i++) {
		char name[8];

		T_WEX(p, wex_segment_alloc(p, WEX_SEG_HOST, 0, 4096, &seg, &base[i]));
		snprintf(name, sizeof(name), "t%d", i);
		t_u8_tensor(&pt[i], name, 4096, seg, 0);
	}
	T_WEX(p, wex_register_tensors(p, pt, 8));
	T_WEX(p, wex_begin_write(p, 1, 2000));
	for (int i = 0; i < 8; i++)
		memset(base[i], 1, 4096);
	T_WEX(p, wex_publish(p, 1));
	/* Two fds to spare: the fetch reply carries 8 segments and a table. */
	T_ASSERT(getrlimit(RLIMIT_NOFILE, &old) == 0, "getrlimit");
	lim = old;
	lim.rlim_cur = (rlim_t)t_fd_count(getpid()) + 2;
	T_ASSERT(setrlimit(RLIMIT_NOFILE, &lim) == 0, "setrlimit");
	ret = wex_sync(k, WEX_SYNC_REMAP_VIEW, 1, 2000, &r);
	T_ASSERT(setrlimit(RLIMIT_NOFILE, &old) == 0, "setrlimit");
	T_ASSERT(ret == -EMFILE, "a sync out of fds: %s (%s)", wex_strerror(ret),
		 wex_last_error(k));
	T_ASSERT(strstr(wex_last_error(k), "out of file descriptors (limit"),
		 "the error names the cause: %s", wex_last_error(k));
	printf("out of fds: %s\n", wex_last_error(k));
	T_WEX(k, wex_sync(k, WEX_SYNC_REMAP_VIEW, 1, 2000, &r));
	T_ASSERT(r.version == 1, "then the sync succeeds (v%llu)", (unsigned long long)r.version);
	T_WEX(k, wex_release(k));
	wex_client_close(k);
	wex_client_close(p);
}

int main(void)
{
	struct t_wexd d;

	t_wexd_start(&d);
	fixed_all_or_none(&d);
	failed_fetch_retried(&d);
	waits_and_timeouts(&d);
	refused_table_not_kept(&d);
	restart_during_copy(&d);
	wexd_gone_during_copy(&d);
	reserve_waits_for_producer(&d);
	unsendable_reply_drops(&d);
	refused_acquire_keeps_lease(&d);
	consumer_out_of_fds(&d);
	t_wexd_stop(&d);
	return T_EXIT_PASS;
}
