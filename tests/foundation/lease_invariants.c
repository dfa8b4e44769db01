/* SPDX-License-Identifier: MIT */
/*
 * lease_invariants - a seeded random walk over the version and lease state
 * machine (DESIGN 4.1, 4.2, 4.6): two producer ranks and two consumer
 * groups (of 2 ranks and of 1) over raw connections, every wait given
 * timeout 0 so that each request is answered before the next is sent.
 * Steps: connect, begin_write, publish, re-register other tensors, die;
 * acquire (copy or view, min_version 0 or the lease held), release, fetch,
 * die.  After every step wexd's `models` listing must show:
 *  - leases == consumer ranks holding one + groups with an open round;
 *  - no lease while a producer rank writes (no torn reads), and no round;
 *  - no lease on a version past the published one;
 *  - within a group, ranks holding leases granted since the producer's
 *    memory last changed hold the same version (group atomicity);
 * every request gets exactly one reply, and at the end, with everyone
 * gone, wexd holds no model and the fds it started with.
 * WEX_FUZZ_ITERS (default 5000 steps) and WEX_FUZZ_SEED make a longer run,
 * or a failing one, reproducible.
 */
#include <poll.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "helpers.h"
#include "proto.h"
#include "wex.h"

#define MODEL "walk"

struct prod {
	int fd;
	uint64_t writing; /* as the test believes */
	int shift;        /* tensor offset, changed by re-registration */
	uint64_t pend_v;  /* a deferred begin_write of this version, unanswered */
};

struct cons {
	int fd;
	const char *group;
	int rank, world;
	uint64_t lease; /* version held, 0 none */
	uint64_t lease_epoch;
	int pending;         /* a deferred acquire, unanswered */
	uint64_t pend_epoch; /* epoch when it was sent */
};

static struct prod P[2];
static struct cons C[3] = {
	{ .fd = -1, .group = "pair", .rank = 0, .world = 2 },
	{ .fd = -1, .group = "pair", .rank = 1, .world = 2 },
	{ .fd = -1, .group = "solo", .rank = 0, .world = 1 },
};
static uint64_t next_v = 1, epoch = 1, steps;
/* What the walk reached: visible publishes, granted syncs, ESTALE refusals. */
static uint64_t n_visible, n_synced, n_stale;
static const char *sock;
static int ctl;

static uint64_t rnd_state;
static uint32_t rnd(uint32_t n)
{
	return t_rand(&rnd_state, n);
}

/* Exactly one reply: the next one, then nothing more waiting. */
static json_t *rpc(int fd, const char *req, const int *fds, int nfds)
{
	json_t *r = t_raw_rpc(fd, req, fds, nfds);
	struct pollfd p = { .fd = fd, .events = POLLIN };

	T_ASSERT(poll(&p, 1, 0) == 0, "step %llu: a second reply (or a close) after '%s'",
		 (unsigned long long)steps, req);
	return r;
}

static void must(int fd, const char *req, const int *fds, int nfds)
{
	json_t *r = rpc(fd, req, fds, nfds);

	T_ASSERT(!strcmp(t_code(r), "OK"), "step %llu: %s: %s: %s", (unsigned long long)steps, req,
		 t_code(r), t_msg(r));
	json_decref(r);
}

/* The reply to a request sent earlier, and nothing after it. */
static json_t *collect(int fd, const char *what)
{
	json_t *r = t_raw_recv(fd);
	struct pollfd p = { .fd = fd, .events = POLLIN };

	T_ASSERT(poll(&p, 1, 0) == 0, "step %llu: a second reply (or a close) after the deferred %s",
		 (unsigned long long)steps, what);
	return r;
}

/* Sends a request that may wait in wexd, and a ping behind it: the ping's
 * "already in flight" refusal says wexd holds the request deferred (1);
 * otherwise *now is its reply (0).  Either way wexd has taken it in. */
static int deferred(int fd, const char *req, json_t **now)
{
	static const char ping[] = "{\"v\":1,\"op\":\"ping\"}";
	json_t *r;

	t_raw_send(fd, req, strlen(req), NULL, 0);
	t_raw_send(fd, ping, sizeof(ping) - 1, NULL, 0);
	r = t_raw_recv(fd);
	if (!strcmp(t_code(r), "EBUSY") && strstr(t_msg(r), "already in flight")) {
		json_decref(r);
		return 1;
	}
	*now = r;
	r = collect(fd, "ping");
	T_ASSERT(!strcmp(t_code(r), "OK"), "step %llu: ping behind '%s': %s",
		 (unsigned long long)steps, req, t_code(r));
	json_decref(r);
	return 0;
}

static void prod_tensors(struct prod *p)
{
	struct wex_tensor t[2];
	int fd;

	t_u8_tensor(&t[0], "a", 1024, 0, (uint64_t)p->shift);
	t_u8_tensor(&t[1], "b", 1024, 0, 2048);
	fd = wex__table_pack(t, NULL, 2);
	T_ASSERT(fd >= 0, "pack");
	must(p->fd, "{\"v\":1,\"op\":\"register_tensors\"}", &fd, 1);
	close(fd);
}

static void prod_connect(int r)
{
	struct prod *p = &P[r];
	char req[160];
	int fd;

	p->fd = t_raw_connect(sock);
	snprintf(req, sizeof(req),
		 "{\"v\":1,\"op\":\"hello\",\"role\":\"producer\",\"model\":\"" MODEL "\",\"rank\":%d,"
		 "\"world\":2}", r);
	must(p->fd, req, NULL, 0);
	fd = memfd_create("t-walk", MFD_CLOEXEC);
	T_ASSERT(fd >= 0 && ftruncate(fd, 4096) == 0, "memfd");
	must(p->fd, "{\"v\":1,\"op\":\"register_segment\",\"kind\":\"host\",\"size\":4096}", &fd, 1);
	close(fd);
	p->writing = 0;
	p->shift = 0;
	prod_tensors(p);
}

static void cons_connect(struct cons *k)
{
	char req[200];

	k->fd = t_raw_connect(sock);
	snprintf(req, sizeof(req),
		 "{\"v\":1,\"op\":\"hello\",\"role\":\"consumer\",\"model\":\"" MODEL "\","
		 "\"group\":\"%s\",\"rank\":%d,\"world\":%d}",
		 k->group, k->rank, k->world);
	must(k->fd, req, NULL, 0);
	k->lease = 0;
}

static void memory_changed(void)
{
	epoch++;
}

static void begin_write_reply(struct prod *p, uint64_t v, json_t *rep)
{
	if (!strcmp(t_code(rep), "OK")) {
		p->writing = v;
		if (v == next_v)
			next_v++;
	}
	json_decref(rep);
}

static void prod_step(int r)
{
	struct prod *p = &P[r];
	char req[160];
	json_t *rep;

	if (p->fd < 0) {
		prod_connect(r);
		memory_changed();
		return;
	}
	if (p->pend_v) {
		begin_write_reply(p, p->pend_v, collect(p->fd, "begin_write"));
		p->pend_v = 0;
		return;
	}
	/* Mostly writes; now and then other memory, or death. */
	switch (rnd(20)) {
	case 0 ... 8: {
		/* begin_write: the version the other rank writes, or a new one;
		 * answered at once, or left waiting while others move. */
		uint64_t v = P[!r].writing ? P[!r].writing : P[!r].pend_v ? P[!r].pend_v : next_v;
		int wait = rnd(2);

		snprintf(req, sizeof(req),
			 "{\"v\":1,\"op\":\"begin_write\",\"version\":%llu,\"timeout_ms\":%d}",
			 (unsigned long long)v, wait ? 20 : 0);
		if (!wait)
			begin_write_reply(p, v, rpc(p->fd, req, NULL, 0));
		else if (deferred(p->fd, req, &rep))
			p->pend_v = v;
		else
			begin_write_reply(p, v, rep);
		break;
	}
	case 9 ... 17:
		if (!p->writing)
			break;
		snprintf(req, sizeof(req), "{\"v\":1,\"op\":\"publish\",\"version\":%llu}",
			 (unsigned long long)p->writing);
		rep = rpc(p->fd, req, NULL, 0);
		T_ASSERT(!strcmp(t_code(rep), "OK"), "step %llu: %s: %s: %s",
			 (unsigned long long)steps, req, t_code(rep), t_msg(rep));
		n_visible += json_is_true(json_object_get(rep, "visible"));
		json_decref(rep);
		p->writing = 0;
		break;
	case 18:
		p->shift = p->shift ? 0 : 1024;
		prod_tensors(p);
		memory_changed();
		break;
	default:
		close(p->fd);
		p->fd = -1;
		p->writing = 0;
		p->pend_v = 0;
		memory_changed();
		break;
	}
}

static void acquire_reply(struct cons *k, json_t *rep, uint64_t grant_epoch)
{
	if (!strcmp(t_code(rep), "OK")) {
		uint64_t v = (uint64_t)json_integer_value(json_object_get(rep, "version"));

		if (!json_is_true(json_object_get(rep, "kept")) || v != k->lease)
			k->lease_epoch = grant_epoch;
		k->lease = v;
		n_synced++;
	} else if (!json_is_true(json_object_get(rep, "lease_kept"))) {
		k->lease = 0;
	}
	n_stale += !strcmp(t_code(rep), "ESTALE");
	json_decref(rep);
}

static void cons_step(struct cons *k)
{
	char req[200];
	json_t *rep;

	if (k->fd < 0) {
		cons_connect(k);
		return;
	}
	if (k->pending) {
		/* Granted while it waited: fresh only if the memory did not
		 * change meanwhile (when exactly is unknown). */
		acquire_reply(k, collect(k->fd, "acquire"), k->pend_epoch == epoch ? epoch : 0);
		k->pending = 0;
		return;
	}
	switch (rnd(12)) {
	case 0 ... 3:
		snprintf(req, sizeof(req),
			 "{\"v\":1,\"op\":\"acquire\",\"mode\":%u,\"min_version\":%llu,\"timeout_ms\":0}",
			 1 + rnd(2), (unsigned long long)(rnd(3) == 0 ? k->lease : 0));
		acquire_reply(k, rpc(k->fd, req, NULL, 0), epoch);
		break;
	case 4 ... 5:
		/* Left waiting (min_version 0: the held lease is dropped
		 * first) while the others move. */
		snprintf(req, sizeof(req),
			 "{\"v\":1,\"op\":\"acquire\",\"mode\":%u,\"timeout_ms\":20}", 1 + rnd(2));
		if (deferred(k->fd, req, &rep)) {
			k->pending = 1;
			k->pend_epoch = epoch;
			k->lease = 0;
		} else {
			acquire_reply(k, rep, epoch);
		}
		break;
	case 6 ... 8:
		rep = rpc(k->fd, "{\"v\":1,\"op\":\"release\"}", NULL, 0);
		k->lease = 0;
		json_decref(rep);
		break;
	case 9 ... 10:
		json_decref(rpc(k->fd, "{\"v\":1,\"op\":\"fetch\"}", NULL, 0));
		break;
	default:
		close(k->fd);
		k->fd = -1;
		k->lease = 0;
		k->pending = 0;
		break;
	}
}

/* The model in wexd's `models` listing once the last step's disconnects
 * are processed (connections are not ordered with one another: polls
 * until the connected ranks match the live connections); NULL when the
 * model is gone with its last client. */
static json_t *model_view(void)
{
	for (double t0 = t_now(); t_now() - t0 < 5.0;) {
		json_t *r = rpc(ctl, "{\"v\":1,\"op\":\"models\"}", NULL, 0), *m, *g, *x;
		size_t i, j, q;
		int want = 0, have = 0;

		for (int p = 0; p < 2; p++)
			want += P[p].fd >= 0;
		for (int c = 0; c < 3; c++)
			want += C[c].fd >= 0;
		json_array_foreach(json_object_get(r, "models"), i, m) {
			if (strcmp(json_string_value(json_object_get(m, "name")) ?: "", MODEL))
				continue;
			json_array_foreach(json_object_get(m, "producers"), j, x)
				have += json_integer_value(json_object_get(x, "pid")) != 0;
			json_array_foreach(json_object_get(m, "groups"), j, g)
				json_array_foreach(json_object_get(g, "ranks"), q, x)
					have += json_integer_value(json_object_get(x, "pid")) != 0;
			if (have == want) {
				json_t *keep = json_incref(m);

				json_decref(r);
				return keep;
			}
		}
		if (!want && !json_array_size(json_object_get(r, "models"))) {
			json_decref(r);
			return NULL;
		}
		json_decref(r);
	}
	T_FAIL("step %llu: wexd's listing never matched the live connections",
	       (unsigned long long)steps);
}

static void check(void)
{
	json_t *m = model_view(), *x, *g, *k;
	json_int_t leases, published, held = 0, rounds = 0, writing = 0;
	size_t i, j;
	char *s;

	if (!m)
		return;
	leases = json_integer_value(json_object_get(m, "leases"));
	published = json_integer_value(json_object_get(m, "published"));
	json_array_foreach(json_object_get(m, "producers"), i, x)
		writing |= json_integer_value(json_object_get(x, "writing"));
	json_array_foreach(json_object_get(m, "groups"), i, g) {
		json_int_t fresh = 0;

		rounds += json_integer_value(json_object_get(g, "round")) != 0;
		json_array_foreach(json_object_get(g, "ranks"), j, k) {
			json_int_t l = json_integer_value(json_object_get(k, "lease"));
			struct cons *c = NULL;

			if (!l)
				continue;
			held++;
			T_ASSERT(l <= published, "step %llu: a lease on v%lld past the published v%lld",
				 (unsigned long long)steps, (long long)l, (long long)published);
			for (int q = 0; q < 3; q++)
				if (!strcmp(C[q].group, json_string_value(json_object_get(g, "name"))) &&
				    C[q].rank == (int)j)
					c = &C[q];
			T_ASSERT(c && (c->pending || c->lease == (uint64_t)l), "step %llu: wexd says "
				 "group %s rank %zu holds v%lld, the client believes v%llu",
				 (unsigned long long)steps, json_string_value(json_object_get(g, "name")),
				 j, (long long)l, c ? (unsigned long long)c->lease : 0ull);
			if (c->pending ? c->pend_epoch != epoch : c->lease_epoch != epoch)
				continue;
			T_ASSERT(!fresh || fresh == l, "step %llu: group %s holds v%lld and v%lld "
				 "(both granted since the memory last changed)",
				 (unsigned long long)steps,
				 json_string_value(json_object_get(g, "name")), (long long)fresh,
				 (long long)l);
			fresh = l;
		}
	}
	s = json_dumps(m, JSON_COMPACT);
	T_ASSERT(leases == held + rounds, "step %llu: leases %lld != %lld held + %lld open rounds: %s",
		 (unsigned long long)steps, (long long)leases, (long long)held, (long long)rounds, s);
	T_ASSERT(!writing || (!held && !rounds), "step %llu: a producer rank writes v%lld while %lld "
		 "lease(s) / %lld round(s) are held: %s", (unsigned long long)steps,
		 (long long)writing, (long long)held, (long long)rounds, s);
	free(s);
	json_decref(m);
}

int main(void)
{
	struct t_wexd d;
	const char *e;
	uint64_t iters = 5000, seed;
	int before, after;

	e = getenv("WEX_FUZZ_SEED");
	seed = e && *e ? strtoull(e, NULL, 0) : (uint64_t)t_now() * 1000003u;
	e = getenv("WEX_FUZZ_ITERS");
	if (e && *e)
		iters = strtoull(e, NULL, 0);
	printf("seed %llu, %llu steps\n", (unsigned long long)seed, (unsigned long long)iters);
	rnd_state = seed * 2 + 1;
	t_wexd_start(&d);
	t_check_backend(d.sock);
	sock = d.sock;
	ctl = t_raw_connect(d.sock);
	before = t_wexd_fds_settle(&d, -1);
	P[0].fd = P[1].fd = -1;
	for (steps = 0; steps < iters; steps++) {
		uint32_t who = rnd(5);

		if (who < 2)
			prod_step((int)who);
		else
			cons_step(&C[who - 2]);
		check();
	}
	for (int i = 0; i < 2; i++)
		if (P[i].fd >= 0)
			close(P[i].fd), P[i].fd = -1;
	for (int i = 0; i < 3; i++)
		if (C[i].fd >= 0)
			close(C[i].fd), C[i].fd = -1;
	printf("%llu versions made visible, %llu syncs granted, %llu refused as stale\n",
	       (unsigned long long)n_visible, (unsigned long long)n_synced,
	       (unsigned long long)n_stale);
	T_ASSERT(n_visible > 0 && n_synced > 0, "the walk never published or synced");
	T_ASSERT(model_view() == NULL, "the model is gone with its clients");
	after = t_wexd_fds_settle(&d, before);
	T_ASSERT(after == before, "wexd holds %d fds, %d before the walk", after, before);
	close(ctl);
	t_wexd_stop(&d);
	return T_EXIT_PASS;
}
