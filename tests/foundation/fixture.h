/* SPDX-License-Identifier: MIT */
/*
 * fixture.h - producer and consumer set-ups over libwex and the synthetic
 * model of examples/model.h, shared by the foundation tests that need
 * them.  Header-only (static functions) so a test takes what it uses.
 */
#ifndef WEX_TEST_FIXTURE_H
#define WEX_TEST_FIXTURE_H

#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "examples/model.h"
#include "helpers.h"
#include "wex.h"

struct t_prod {
	wex_client_t *c;
	struct wex_tensor *t;
	int n;
	void *base;
	uint64_t seg_bytes;
};

struct t_cons {
	wex_client_t *c;
	struct wex_tensor *t; /* this rank's layout, ptr into region */
	int n;
	void *region;
	uint64_t seg_bytes;
	uint32_t rank;
};

/* Flags (WEX_CLIENT_*) of the clients t_open opens from then on. */
static uint32_t t_client_flags __attribute__((unused));

static inline wex_client_t *t_open(int role, const char *model, const char *group, uint32_t rank,
				   uint32_t world)
{
	struct wex_client_params p = {
		.field_mask = WEX_CLIENT_FIELD_ROLE | WEX_CLIENT_FIELD_RANK |
			      WEX_CLIENT_FIELD_COPY_THREADS | WEX_CLIENT_FIELD_FLAGS |
			      (model ? WEX_CLIENT_FIELD_MODEL : 0) | (group ? WEX_CLIENT_FIELD_GROUP : 0),
		.role = role, .model = model, .group = group, .rank = rank, .world_size = world,
		.copy_threads = 2, .flags = t_client_flags,
	};
	wex_client_t *c = NULL;
	int ret = wex_client_open(&p, &c);

	if (ret < 0)
		T_FAIL("wex_client_open(role %d, model %s, rank %u/%u): %s: %s", role,
		       model ? model : "-", rank, world, wex_strerror(ret), wex_last_error(NULL));
	return c;
}

/* A producer rank with its shard of `preset` in one host segment. */
static inline void t_prod_open(struct t_prod *p, const char *model, const char *preset,
			       uint32_t rank, uint32_t world)
{
	struct ex_cfg cfg;
	uint32_t seg;

	memset(p, 0, sizeof(*p));
	if (ex_cfg_preset(&cfg, preset) < 0)
		T_FAIL("preset %s", preset);
	p->n = ex_shards(&cfg, rank, world, &p->t, &p->seg_bytes);
	T_ASSERT(p->n > 0, "ex_shards(%s, %u/%u)", preset, rank, world);
	p->c = t_open(WEX_ROLE_PRODUCER, model, NULL, rank, world);
	T_WEX(p->c, wex_segment_alloc(p->c, WEX_SEG_HOST, 0, p->seg_bytes, &seg, &p->base));
	for (int i = 0; i < p->n; i++)
		p->t[i].segment = seg;
	T_WEX(p->c, wex_register_tensors(p->c, p->t, (size_t)p->n));
}

/* begin_write (must succeed), fill every byte for v, publish. */
static inline void t_prod_write(struct t_prod *p, uint64_t v)
{
	T_WEX(p->c, wex_begin_write(p->c, v, 10000));
	ex_fill(p->base, p->t, (size_t)p->n, v, 1);
	T_WEX(p->c, wex_publish(p->c, v));
}

static inline void t_prod_close(struct t_prod *p)
{
	wex_client_close(p->c);
	free(p->t);
	p->c = NULL;
	p->t = NULL;
}

/* A consumer rank of `world` holding its shard of `preset`, its weights in
 * a region reserved against producer rank `prank`'s segment 0 (of that
 * segment's kind, usable for same-address remap when the layouts match),
 * its layout attached. */
static inline void t_cons_open_from(struct t_cons *k, const char *model, const char *group,
				    const char *preset, uint32_t rank, uint32_t world,
				    uint32_t prank)
{
	struct ex_cfg cfg;

	memset(k, 0, sizeof(*k));
	if (ex_cfg_preset(&cfg, preset) < 0)
		T_FAIL("preset %s", preset);
	k->n = ex_shards(&cfg, rank, world, &k->t, &k->seg_bytes);
	T_ASSERT(k->n > 0, "ex_shards(%s, %u/%u)", preset, rank, world);
	k->rank = rank;
	k->c = t_open(WEX_ROLE_CONSUMER, model, group, rank, world);
	T_WEX(k->c, wex_reserve(k->c, prank, 0, k->seg_bytes, &k->region));
	for (int i = 0; i < k->n; i++)
		k->t[i].ptr = (char *)k->region + k->t[i].offset;
	T_WEX(k->c, wex_attach(k->c, k->t, (size_t)k->n));
}

/* A consumer rank mirroring producer rank `rank`'s shard. */
static inline void t_cons_open(struct t_cons *k, const char *model, const char *group,
			       const char *preset, uint32_t rank, uint32_t world)
{
	t_cons_open_from(k, model, group, preset, rank, world, rank);
}

static inline void t_cons_close(struct t_cons *k)
{
	wex_client_close(k->c);
	free(k->t);
	k->c = NULL;
	k->t = NULL;
}

/* Mismatching elements of producer rank `prank`'s tensors read through
 * wex_view (after a REMAP_VIEW sync), expected to hold version v. */
static inline uint64_t t_view_bad(struct t_cons *k, uint32_t prank, uint64_t v)
{
	const struct wex_tensor *pt;
	uint64_t bad = 0;
	size_t n = 0;

	T_WEX(k->c, wex_producer_tensors(k->c, prank, &pt, &n));
	T_ASSERT(n > 0, "producer rank %u has no tensors", prank);
	for (size_t i = 0; i < n; i++) {
		struct wex_tensor d;
		void *ptr;

		T_WEX(k->c, wex_view(k->c, prank, pt[i].name, &ptr, &d));
		bad += ex_check(NULL, &d, 1, v, 1);
	}
	return bad;
}

/* Mismatching elements of the consumer's own buffers (copy, fixed). */
static inline uint64_t t_own_bad(struct t_cons *k, uint64_t v)
{
	return ex_check(NULL, k->t, (size_t)k->n, v, 1);
}

/* The smallest set-up: wexd started, one producer rank of the "tiny"
 * preset that published v1, one consumer rank of group "g". */
static inline void t_tiny_v1(struct t_wexd *d, struct t_prod *p, struct t_cons *k,
			     const char *model)
{
	t_wexd_start(d);
	t_check_backend(d->sock);
	t_prod_open(p, model, "tiny", 0, 1);
	t_cons_open(k, model, "g", "tiny", 0, 1);
	t_prod_write(p, 1);
}

/* SIGUSR1 runs a handler that does nothing: a signal that ends a wait of a
 * client opened with WEX_CLIENT_EINTR, and nothing else. */
static inline void t_usr1_noop_handler(int sig)
{
	(void)sig;
}

static inline void t_usr1_noop(void)
{
	struct sigaction sa = { .sa_handler = t_usr1_noop_handler };

	sigemptyset(&sa.sa_mask);
	sigaction(SIGUSR1, &sa, NULL);
}

/* One kick from a thread of its own, `at` us after t_kick_start (or at
 * once when t_kick_join says so first): fn(arg) when fn is set, else
 * wex_cancel(cancel) when cancel is, else SIGUSR1 to the thread that
 * started it. */
struct t_kick {
	pthread_t th, target;
	wex_client_t *cancel;
	void (*fn)(void *);
	void *arg;
	useconds_t at;
	atomic_int now;
};

static inline void *t_kick_main(void *arg)
{
	struct t_kick *k = arg;

	for (useconds_t t = 0; t < k->at && !atomic_load(&k->now); t += 10000)
		usleep(10000);
	if (k->fn)
		k->fn(k->arg);
	else if (k->cancel)
		wex_cancel(k->cancel);
	else
		pthread_kill(k->target, SIGUSR1);
	return NULL;
}

static inline void t_kick_start(struct t_kick *k, useconds_t at, wex_client_t *cancel,
				void (*fn)(void *), void *arg)
{
	memset(k, 0, sizeof(*k));
	k->target = pthread_self();
	k->cancel = cancel;
	k->fn = fn;
	k->arg = arg;
	k->at = at;
	T_ASSERT(pthread_create(&k->th, NULL, t_kick_main, k) == 0, "kick thread");
}

/* Waits for the kick; early: it acts now if it has not yet. */
static inline void t_kick_join(struct t_kick *k, int early)
{
	if (early)
		atomic_store(&k->now, 1);
	pthread_join(k->th, NULL);
}

/* The smallest set-up behind a relay: wexd started, a t_relay to it at
 * "<its socket>.relay". */
static inline void t_relay_wexd(struct t_wexd *d, struct t_relay *r)
{
	char path[sizeof(r->path)];

	t_wexd_start(d);
	t_check_backend(d->sock);
	T_ASSERT(snprintf(path, sizeof(path), "%.*s.relay", (int)(sizeof(path) - 7), d->sock) <
			 (int)sizeof(path),
		 "relay socket path too long");
	t_relay_start(r, d->sock, path);
}

/* t_prod_open("tiny", rank 0 of 1) through the relay, with client flags
 * `flags` (t_client_flags as it was after). */
static inline void t_prod_open_relayed(struct t_prod *p, struct t_wexd *d, struct t_relay *r,
				       const char *model, uint32_t flags)
{
	uint32_t keep = t_client_flags;

	t_client_flags = flags;
	setenv("WEX_SOCKET", r->path, 1);
	t_prod_open(p, model, "tiny", 0, 1);
	setenv("WEX_SOCKET", d->sock, 1);
	t_client_flags = keep;
}

#endif
