/* SPDX-License-Identifier: MIT */
/*
 * chaos - a seeded, randomized run of everything at once against one wexd:
 *  - 2 producer ranks of one model (host segments, the "tiny" model's
 *    shards) begin_write, fill and publish increasing versions; now and
 *    then one is SIGKILLed between begin_write and publish and started
 *    again (it registers fresh memory and writes a newer version);
 *  - 3 consumer processes in two groups ("solo" of 1 rank, "pair" of 2)
 *    sync in random modes (COPY into their attached buffers, REMAP_VIEW,
 *    REMAP_FIXED over regions from wex_reserve), hold their leases for
 *    random short times, switch mode under a held lease, and are now and
 *    then SIGKILLed (often while holding a lease) or asked to close
 *    cleanly, and started again;
 *  - wexd itself is SIGKILLed and restarted while they run (at least once
 *    per run): the clients reconnect by themselves;
 *  - raw connections send junk, half a request, or ask for a lease and
 *    hang up without reading the reply.
 * The schedule is random; what is asserted is not:
 *  - a successful sync of v shows exactly v's bytes in every tensor, and
 *    still does just before the lease ends, also when wexd restarted
 *    under the lease (its lease journal holds the producers off); a
 *    release says -WEX_EDAEMON only across a restart; a failed copy sync
 *    marks the weights dirty or leaves them as they were;
 *  - a consumer slot never sees a version lower than one it synced before
 *    (the producers' version numbers only grow, across wexd restarts too);
 *  - a producer's begin_write never succeeds while a consumer holds a
 *    lease granted by the same wexd (shared memory marks, besides the
 *    consumers' byte checks);
 *  - every error is one wex.h documents for the situation (EBUSY, ETIMEDOUT,
 *    ESTALE after a producer death, and for a consumer only one that its
 *    last successful sync had not seen done; connection errors and
 *    WEX_EDAEMON/EDIRTY
 *    only across a wexd restart, EINVAL for ranks that must agree on a new
 *    version after a death or restart); wexd never dies;
 *  - at the end, with every client gone: no lease, wexd's fds back to
 *    their count before the run, status answers, SIGTERM exits 0.
 * WEX_CHAOS_SECS (default 4) lengthens the run, WEX_CHAOS_SEED replays
 * one (the schedule, not the timing).  No timing is asserted: waits are
 * generous, and a slow machine only does fewer steps.
 */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fixture.h"
#include "ipc/sock.h"

#define MODEL "chaos"
#define PRESET "tiny"
#define NPROD 2
#define NCONS 3
#define WAIT_MS 2000 /* begin_write and sync waits: EBUSY/ETIMEDOUT are fine */

/* Mark of a lease a consumer holds: the wexd generation that granted it
 * (high half) and the version (low half); 0 none. */
#define MARK(gen, v) (((uint64_t)(gen) << 32) | (uint32_t)(v))

struct shared {
	/* Even: wexd N/2 is up; odd: being restarted. */
	_Atomic uint64_t gen;
	/* The version the producer ranks write now, and what each rank's
	 * current process last published. */
	_Atomic uint64_t cur;
	_Atomic uint64_t pub[NPROD];
	_Atomic uint64_t writing[NPROD]; /* begun and not yet published */
	/* Producer ranks killed so far: counted before the kill, and again
	 * (deaths_done) once wexd shows it has seen the rank leave.  A check
	 * that a death excuses asks whether one began (prod_deaths) that was
	 * not yet done when the call it checks began. */
	_Atomic uint64_t prod_deaths;
	_Atomic uint64_t deaths_done;
	_Atomic uint64_t hold[NCONS];    /* lease marks */
	_Atomic uint64_t last[NCONS];    /* highest version each slot synced */
	_Atomic int close_req[NCONS];
	_Atomic int stop;      /* the end, for producers */
	_Atomic int stop_cons; /* the end, for consumers (first) */
	/* What the run reached. */
	_Atomic uint64_t n_publish, n_begin, n_busy, n_sync[4], n_timeout, n_stale, n_restart_err,
		n_lost_lease, n_unreturned, n_einval;
};

static struct shared *S;
static unsigned long long seed;
static char who[128];

#define CF(...)                                                                       \
	do {                                                                          \
		char m_[512];                                                         \
		snprintf(m_, sizeof(m_), __VA_ARGS__);                                \
		T_FAIL("seed %llu: %s: %s", seed, who, m_);                           \
	} while (0)

static uint64_t rnd_state;
static uint32_t rnd(uint32_t n)
{
	return t_rand(&rnd_state, n);
}

static void rnd_seed(uint64_t s)
{
	rnd_state = s * 0x9E3779B97F4A7C15ull + 1;
	for (int i = 0; i < 4; i++)
		rnd(2);
}

static uint64_t gen(void)
{
	return atomic_load(&S->gen);
}

/* A restart of wexd overlapped [g0, now]. */
static int restarted_since(uint64_t g0)
{
	return (g0 & 1) || gen() != g0;
}

/* What a call sees while wexd is down or just came back (wex.h:
 * -ENOENT/-ECONNREFUSED from a connect, -WEX_EDAEMON, a reset). */
static int conn_err(int ret)
{
	return ret == -ECONNREFUSED || ret == -ENOENT || ret == -WEX_EDAEMON ||
	       ret == -ECONNRESET || ret == -EPIPE || ret == -ENOTCONN;
}

static void nap(uint32_t max_us)
{
	usleep(100 + rnd(max_us));
}

static wex_client_t *open_client(int role, const char *group, uint32_t rank, uint32_t world)
{
	struct wex_client_params p = {
		.field_mask = WEX_CLIENT_FIELD_ROLE | WEX_CLIENT_FIELD_MODEL | WEX_CLIENT_FIELD_RANK |
			      WEX_CLIENT_FIELD_COPY_THREADS | (group ? WEX_CLIENT_FIELD_GROUP : 0),
		.role = role, .model = MODEL, .group = group, .rank = rank, .world_size = world,
		.copy_threads = 1,
	};
	wex_client_t *c = NULL;

	for (;;) {
		uint64_t g0 = gen();
		int ret = wex_client_open(&p, &c);

		if (ret == 0)
			return c;
		if (!conn_err(ret) || !restarted_since(g0))
			CF("wex_client_open: %s", wex_strerror(ret));
		if (atomic_load(role == WEX_ROLE_PRODUCER ? &S->stop : &S->stop_cons))
			t_exit(T_EXIT_PASS);
		nap(5000);
	}
}

/* ---------------------------------------------------------------------- */
/* Producers.                                                             */

struct prod {
	wex_client_t *c;
	struct wex_tensor *t;
	int n;
	void *base;
	uint64_t bytes;
};

/* Open, a segment, the tensors; any step cut by a wexd restart starts
 * over. */
static void prod_setup(struct prod *p, uint32_t r)
{
	struct ex_cfg cfg;

	ex_cfg_preset(&cfg, PRESET);
	p->n = ex_shards(&cfg, r, NPROD, &p->t, &p->bytes);
	T_ASSERT(p->n > 0, "shards");
	for (;;) {
		uint64_t g0 = gen();
		uint32_t seg;
		int ret;

		p->c = open_client(WEX_ROLE_PRODUCER, NULL, r, NPROD);
		ret = wex_segment_alloc(p->c, WEX_SEG_HOST, 0, p->bytes, &seg, &p->base);
		if (ret == 0) {
			for (int i = 0; i < p->n; i++)
				p->t[i].segment = seg;
			ret = wex_register_tensors(p->c, p->t, (size_t)p->n);
			if (ret == 0)
				return;
		}
		if (!conn_err(ret) || !restarted_since(g0))
			CF("producer set-up: %s: %s", wex_strerror(ret), wex_last_error(p->c));
		wex_client_close(p->c);
		if (atomic_load(&S->stop))
			t_exit(T_EXIT_PASS);
		nap(5000);
	}
}

/* No consumer may hold a lease granted by the wexd that just let this
 * rank write (both in generation g). */
static void check_no_lease(uint64_t g, uint64_t v)
{
	for (int i = 0; i < NCONS; i++) {
		uint64_t m = atomic_load(&S->hold[i]);

		if (m && m >> 32 == g)
			CF("begin_write v%llu was granted while consumer slot %d holds a lease on v%llu "
			   "(granted by the same wexd)", (unsigned long long)v, i,
			   (unsigned long long)(uint32_t)m);
	}
}

static void producer(uint32_t r, int incarnation)
{
	struct prod p;
	uint64_t mine = 0;
	double stuck = t_now();

	snprintf(who, sizeof(who), "producer rank %u (pid %d, start %d)", r, (int)getpid(),
		 incarnation);
	rnd_seed(seed ^ (0x1000u * (r + 1)) ^ ((uint64_t)incarnation << 40));
	atomic_store(&S->pub[r], 0);
	prod_setup(&p, r);
	/* Fresh memory holds no version: write a newer one than any this
	 * rank may have begun before it died. */
	if (incarnation)
		atomic_fetch_add(&S->cur, 1);
	while (!atomic_load(&S->stop)) {
		uint64_t v = atomic_load(&S->cur), g0, g1;
		int ret;

		if (v <= mine) {
			usleep(200); /* the other rank has not published v yet */
			continue;
		}
		if (t_now() - stuck > 30)
			CF("no write of v%llu went through in 30 s: %s", (unsigned long long)v,
			   wex_last_error(p.c));
		g0 = gen();
		ret = wex_begin_write(p.c, v, WAIT_MS);
		g1 = gen();
		if (ret == -EBUSY) {
			atomic_fetch_add(&S->n_busy, 1);
			continue;
		}
		if (ret == -EINVAL && strstr(wex_last_error(p.c), "all ranks write the same version") &&
		    (atomic_load(&S->prod_deaths) || g1 > 2)) {
			/* The other rank still writes the version this one
			 * skipped after a death or a restart. */
			atomic_fetch_add(&S->n_einval, 1);
			nap(1000);
			continue;
		}
		if (ret < 0 && conn_err(ret) && restarted_since(g0)) {
			atomic_fetch_add(&S->n_restart_err, 1);
			nap(2000);
			continue;
		}
		if (ret < 0)
			CF("begin_write v%llu: %s: %s", (unsigned long long)v, wex_strerror(ret),
			   wex_last_error(p.c));
		atomic_fetch_add(&S->n_begin, 1);
		if (g0 == g1 && !(g0 & 1))
			check_no_lease(g0, v);
		atomic_store(&S->writing[r], v);
		ex_fill(p.base, p.t, (size_t)p.n, v, 1);
		if (rnd(2))
			nap(3000); /* a wider window for a kill mid-write */
		for (;;) {
			uint64_t g2 = gen();

			ret = wex_publish(p.c, v);
			if (ret == 0 || !conn_err(ret) || !restarted_since(g2))
				break;
			atomic_fetch_add(&S->n_restart_err, 1);
			nap(2000);
		}
		atomic_store(&S->writing[r], 0);
		if (ret == -EINVAL && restarted_since(g0)) {
			/* The new wexd refused to go on with a write begun on
			 * the old one (another rank writes a newer version):
			 * this rank writes that one. */
			atomic_fetch_add(&S->n_einval, 1);
			continue;
		}
		if (ret < 0)
			CF("publish v%llu: %s: %s", (unsigned long long)v, wex_strerror(ret),
			   wex_last_error(p.c));
		atomic_fetch_add(&S->n_publish, 1);
		mine = v;
		stuck = t_now();
		atomic_store(&S->pub[r], v);
		/* The last rank to publish v moves both on to v + 1. */
		if (atomic_load(&S->pub[!r]) >= v)
			atomic_compare_exchange_strong(&S->cur, &v, v + 1);
	}
	wex_client_close(p.c);
	free(p.t);
	t_exit(T_EXIT_PASS);
}

/* ---------------------------------------------------------------------- */
/* Consumers.                                                             */

static const struct {
	const char *group;
	uint32_t rank, world;
} slots[NCONS] = { { "solo", 0, 1 }, { "pair", 0, 2 }, { "pair", 1, 2 } };

struct cons {
	wex_client_t *c;
	struct wex_tensor *t; /* both producer ranks' shards, in the regions */
	int n;
	void *region[NPROD];
};

/* Regions over both producer ranks' segments, and a layout of both
 * ranks' shards placed as the producers place them: every mode works. */
static void cons_setup(struct cons *k, int slot)
{
	struct ex_cfg cfg;
	struct wex_tensor *part[NPROD];
	uint64_t bytes[NPROD];
	int np[NPROD];

	ex_cfg_preset(&cfg, PRESET);
	for (uint32_t r = 0; r < NPROD; r++) {
		np[r] = ex_shards(&cfg, r, NPROD, &part[r], &bytes[r]);
		T_ASSERT(np[r] > 0, "shards");
	}
	k->n = np[0] + np[1];
	k->t = calloc((size_t)k->n, sizeof(*k->t));
	T_ASSERT(k->t, "calloc");
	memcpy(k->t, part[0], sizeof(*k->t) * (size_t)np[0]);
	memcpy(k->t + np[0], part[1], sizeof(*k->t) * (size_t)np[1]);
	for (;;) {
		uint64_t g0 = gen(), deaths = atomic_load(&S->deaths_done);
		int ret = 0;

		k->c = open_client(WEX_ROLE_CONSUMER, slots[slot].group, slots[slot].rank,
				   slots[slot].world);
		for (uint32_t r = 0; r < NPROD && ret == 0; r++)
			ret = wex_reserve(k->c, r, 0, bytes[r], &k->region[r]);
		if (ret == 0) {
			for (int i = 0; i < k->n; i++)
				k->t[i].ptr = (char *)k->region[i >= np[0]] + k->t[i].offset;
			ret = wex_attach(k->c, k->t, (size_t)k->n);
			if (ret == 0)
				break;
		}
		/* A producer rank being restarted registers within ms; one
		 * that died under the fetch makes it stale. */
		if (!(conn_err(ret) && restarted_since(g0)) &&
		    !(ret == -ESTALE && atomic_load(&S->prod_deaths) != deaths) &&
		    ret != -ETIMEDOUT)
			CF("consumer set-up: %s: %s", wex_strerror(ret), wex_last_error(k->c));
		wex_client_close(k->c);
		if (atomic_load(&S->stop_cons))
			t_exit(T_EXIT_PASS);
		nap(5000);
	}
	free(part[0]);
	free(part[1]);
}

static const char *mode_name(int mode)
{
	return mode == WEX_SYNC_COPY ? "copy" : mode == WEX_SYNC_REMAP_VIEW ? "remap-view" :
									     "remap-fixed";
}

/* Elements of the version-v bytes that the consumer does not see. */
static uint64_t bad_bytes(struct cons *k, int mode, uint64_t v)
{
	uint64_t bad = 0;

	if (mode != WEX_SYNC_REMAP_VIEW)
		return ex_check(NULL, k->t, (size_t)k->n, v, 1);
	for (uint32_t r = 0; r < NPROD; r++) {
		const struct wex_tensor *pt;
		size_t n = 0;
		int ret = wex_producer_tensors(k->c, r, &pt, &n);

		if (ret < 0)
			CF("view of v%llu: producer_tensors(%u): %s", (unsigned long long)v, r,
			   wex_last_error(k->c));
		for (size_t i = 0; i < n; i++) {
			struct wex_tensor d;
			void *ptr;

			ret = wex_view(k->c, r, pt[i].name, &ptr, &d);
			if (ret < 0)
				CF("view of v%llu: %s: %s", (unsigned long long)v, pt[i].name,
				   wex_last_error(k->c));
			bad += ex_check(NULL, &d, 1, v, 1);
		}
	}
	return bad;
}

/* Ends a remap lease (g0: generation when the sync began).  `torn`: the
 * bytes changed under it, and then the release must say that the lease
 * was lost (which only a restart excuses). */
static void cons_release(struct cons *k, int slot, uint64_t g0, uint64_t v, int mode, int torn)
{
	int ret;

	atomic_store(&S->hold[slot], 0);
	ret = wex_release(k->c);
	if (ret == 0 && !torn)
		return;
	if (ret == 0)
		CF("%s lease on v%llu: the producer's bytes changed under it and the release "
		   "returned 0 (wexd generation %llu -> %llu)", mode_name(mode),
		   (unsigned long long)v, (unsigned long long)g0, (unsigned long long)gen());
	/* wex.h: -WEX_EDAEMON, the lease lost with wexd's connection, even
	 * when the new wexd is not up yet. */
	if (ret != -WEX_EDAEMON || !restarted_since(g0))
		CF("release of the %s lease on v%llu: %s: %s", mode_name(mode),
		   (unsigned long long)v, wex_strerror(ret), wex_last_error(k->c));
	/* No wexd to give it back to (the usual case here), or really lost
	 * (a call wexd did not answer dropped the connection). */
	if (strstr(wex_last_error(k->c), "could not be given back"))
		atomic_fetch_add(&S->n_unreturned, 1);
	else
		atomic_fetch_add(&S->n_lost_lease, 1);
}

static void consumer(int slot, int incarnation)
{
	struct cons k;
	struct wex_sync_result res;
	int held = 0, held_mode = 0;
	/* The version the consumer's own buffers hold whole and clean (a copy
	 * sync's), 0 when unknown (dirty, or shown over by a same-address
	 * sync since). */
	uint64_t own_v = 0;
	uint64_t held_v = 0, held_g = 0, held_deaths = 0;
	/* The producer deaths done, and wexd's generation, when this
	 * consumer's last successful sync began: memory lost in a death done
	 * by then was behind no version that sync could get, so only a later
	 * death (or a restart) excuses ESTALE.  Until the first success any
	 * death does: the group may be held at a round a death made stale
	 * before this consumer started. */
	uint64_t ok_deaths = UINT64_MAX, ok_g = 0;

	snprintf(who, sizeof(who), "consumer slot %d (group %s rank %u, pid %d, start %d)", slot,
		 slots[slot].group, slots[slot].rank, (int)getpid(), incarnation);
	rnd_seed(seed ^ (0x100000u * (uint64_t)(slot + 1)) ^ ((uint64_t)incarnation << 44));
	cons_setup(&k, slot);
	while (!atomic_load(&S->stop_cons) && !atomic_load(&S->close_req[slot])) {
		static const int modes[3] = { WEX_SYNC_COPY, WEX_SYNC_REMAP_VIEW,
					      WEX_SYNC_REMAP_FIXED };
		int mode = modes[rnd(3)], ret;
		/* Now and then the held version in another mode (the lease is
		 * kept), else the newest (the held lease is given up first). */
		uint64_t minv = held && rnd(4) == 0 ? held_v : 0, g0, g1, v, bad, last,
			 deaths = atomic_load(&S->deaths_done);

		if (held && !minv && rnd(2)) {
			cons_release(&k, slot, held_g, held_v, held_mode, 0);
			held = 0;
		}
		atomic_store(&S->hold[slot], 0);
		g0 = held ? held_g : gen();
		ret = wex_sync(k.c, mode, minv, WAIT_MS, &res);
		g1 = gen();
		held = 0;
		if (mode == WEX_SYNC_REMAP_FIXED)
			own_v = 0;
		if (ret < 0 && mode == WEX_SYNC_COPY) {
			/* A failed copy either says the weights are dirty or
			 * left them as they were (wex.h, README). */
			if (wex_is_dirty(k.c))
				own_v = 0;
			else if (own_v && (bad = bad_bytes(&k, mode, own_v)))
				CF("copy sync failed (%s: %s), the weights not marked dirty, and %llu "
				   "elements are no longer v%llu", wex_strerror(ret),
				   wex_last_error(k.c), (unsigned long long)bad,
				   (unsigned long long)own_v);
		}
		if (ret == -ETIMEDOUT) {
			atomic_fetch_add(&S->n_timeout, 1);
			continue;
		}
		if (ret == -ESTALE && atomic_load(&S->prod_deaths) &&
		    (ok_deaths == UINT64_MAX || atomic_load(&S->prod_deaths) != ok_deaths ||
		     restarted_since(ok_g))) {
			atomic_fetch_add(&S->n_stale, 1);
			nap(2000);
			continue;
		}
		if (ret < 0 && (conn_err(ret) || ret == -WEX_EDIRTY) && restarted_since(g0)) {
			atomic_fetch_add(&S->n_restart_err, 1);
			nap(2000);
			continue;
		}
		if (ret < 0)
			CF("%s sync (min v%llu): %s: %s (producer deaths: %llu begun now, %llu "
			   "done when the last successful sync began)", mode_name(mode),
			   (unsigned long long)minv, wex_strerror(ret), wex_last_error(k.c),
			   (unsigned long long)atomic_load(&S->prod_deaths),
			   (unsigned long long)ok_deaths);
		v = res.version;
		ok_deaths = deaths;
		ok_g = g0;
		/* The held lease is kept, unless the memory behind it went
		 * since (a producer rank died: a newer version then) or wexd
		 * did (it numbers afresh; ours only grow). */
		if (v < minv || (minv && v != minv && !restarted_since(g0) &&
				 atomic_load(&S->prod_deaths) == held_deaths))
			CF("%s sync keeping the lease on v%llu got v%llu (producer deaths: %llu begun "
			   "now, %llu done when the lease was taken, %llu done now)",
			   mode_name(mode), (unsigned long long)minv, (unsigned long long)v,
			   (unsigned long long)atomic_load(&S->prod_deaths),
			   (unsigned long long)held_deaths,
			   (unsigned long long)atomic_load(&S->deaths_done));
		last = atomic_load(&S->last[slot]);
		if (v < last)
			CF("%s sync got v%llu after this slot had synced v%llu", mode_name(mode),
			   (unsigned long long)v, (unsigned long long)last);
		atomic_store(&S->last[slot], v);
		atomic_fetch_add(&S->n_sync[mode], 1);
		if (mode == WEX_SYNC_COPY) {
			/* The copy is the consumer's own: it holds v whole, whatever
			 * wexd or the producers do afterwards. */
			if (wex_is_dirty(k.c))
				CF("copy sync of v%llu returned 0 with the weights dirty",
				   (unsigned long long)v);
			bad = bad_bytes(&k, mode, v);
			if (bad)
				CF("copy sync of v%llu: %llu elements from another version",
				   (unsigned long long)v, (unsigned long long)bad);
			nap(5000);
			bad = bad_bytes(&k, mode, v);
			if (bad)
				CF("copy of v%llu changed afterwards: %llu elements",
				   (unsigned long long)v, (unsigned long long)bad);
			own_v = v;
			continue;
		}
		/* A remap lease: valid while wexd generation g0 lives. */
		if (g0 == g1 && !(g0 & 1))
			atomic_store(&S->hold[slot], MARK(g0, v));
		/* Across wexd restarts too: the lease journal holds the
		 * producers off until this lease ends. */
		bad = bad_bytes(&k, mode, v);
		if (bad)
			CF("%s sync of v%llu: %llu elements from another version%s", mode_name(mode),
			   (unsigned long long)v, (unsigned long long)bad,
			   restarted_since(g0) ? " (wexd restarted meanwhile)" : "");
		nap(rnd(4) ? 3000 : 15000);
		bad = bad_bytes(&k, mode, v);
		if (bad)
			CF("%s lease on v%llu: %llu elements changed while it was held "
			   "(begin_write went through under a lease%s)", mode_name(mode),
			   (unsigned long long)v, (unsigned long long)bad,
			   restarted_since(g0) ? ", held across a wexd restart" : "");
		if (rnd(3) == 0) {
			cons_release(&k, slot, g0, v, mode, 0);
			continue;
		}
		held = 1;
		held_v = v;
		held_g = g0;
		held_mode = mode;
		held_deaths = deaths;
	}
	/* Asked to close, or the end: a clean close, half the time still
	 * holding the lease (close gives it back). */
	if (held && rnd(2))
		cons_release(&k, slot, held_g, held_v, held_mode, 0);
	atomic_store(&S->hold[slot], 0);
	wex_client_close(k.c);
	free(k.t);
	t_exit(T_EXIT_PASS);
}

/* ---------------------------------------------------------------------- */
/* The schedule.                                                          */

struct child {
	pid_t pid;
	int starts;
	int closing; /* asked to close: exit 0 expected */
};

static struct child P[NPROD], C[NCONS];

static pid_t spawn(int is_prod, int i, int incarnation)
{
	pid_t pid = t_fork();

	if (pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() == 1)
			_exit(1);
		if (is_prod)
			producer((uint32_t)i, incarnation);
		consumer(i, incarnation);
	}
	return pid;
}

static void start_prod(int r)
{
	P[r].pid = spawn(1, r, P[r].starts++);
}

static void start_cons(int s)
{
	C[s].closing = 0;
	atomic_store(&S->close_req[s], 0);
	C[s].pid = spawn(0, s, C[s].starts++);
}

/* A child that ended on its own: a failure unless it was asked to close. */
static void reap(const char *what, int i, struct child *ch, int *restart)
{
	int st;
	pid_t w = waitpid(ch->pid, &st, WNOHANG);

	*restart = 0;
	if (w != ch->pid)
		return;
	t_untrack_child(w);
	if (ch->closing && WIFEXITED(st) && WEXITSTATUS(st) == 0) {
		*restart = 1;
		return;
	}
	fprintf(stderr, "FAIL seed %llu: %s %d (pid %d) %s %d\n", seed, what, i, (int)ch->pid,
		WIFEXITED(st) ? "exited with" : "died of signal",
		WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
	ch->pid = 0;
	t_exit(T_EXIT_FAIL);
}

static void kill_wait(pid_t pid)
{
	kill(pid, SIGKILL);
	t_wait(pid);
}

/* The pid wexd's status shows for producer rank r (0: none). */
static int prod_pid(const char *sock, int r)
{
	json_t *st = t_status(sock), *m = t_status_model(st, MODEL);
	int pid = 0;

	if (m)
		pid = (int)json_integer_value(
			json_object_get(json_array_get(json_object_get(m, "producers"), (size_t)r), "pid"));
	json_decref(st);
	return pid;
}

static void kill_producer(const char *sock, int r)
{
	pid_t pid = P[r].pid;
	double t0;

	/* Mid-write when it is writing now.  Counted before the kill: wexd
	 * sees the hang-up, and consumers its ESTALE, before waitpid returns
	 * here; and done only once wexd has let the rank go (it marks the
	 * memory gone then), which may be after waitpid. */
	atomic_fetch_add(&S->prod_deaths, 1);
	kill_wait(pid);
	for (t0 = t_now(); prod_pid(sock, r) == (int)pid; usleep(500))
		if (t_now() - t0 > 30) {
			fprintf(stderr, "FAIL seed %llu: wexd still shows killed producer rank %d "
				"(pid %d) after 30 s\n", seed, r, (int)pid);
			t_exit(T_EXIT_FAIL);
		}
	atomic_fetch_add(&S->deaths_done, 1);
	atomic_store(&S->writing[r], 0);
	start_prod(r);
}

static void kill_consumer(int s)
{
	int st;

	/* Stopped first, so that its lease mark goes before its lease does
	 * (wexd drops the lease once the process is gone). */
	kill(C[s].pid, SIGSTOP);
	while (waitpid(C[s].pid, &st, WUNTRACED) < 0 && errno == EINTR)
		;
	if (!WIFSTOPPED(st)) {
		fprintf(stderr, "FAIL seed %llu: consumer slot %d ended before it was killed (%d)\n",
			seed, s, st);
		t_exit(T_EXIT_FAIL);
	}
	atomic_store(&S->hold[s], 0);
	kill_wait(C[s].pid);
	start_cons(s);
}

static void restart_wexd(struct t_wexd *d)
{
	atomic_fetch_add(&S->gen, 1);
	t_wexd_kill(d);
	if (rnd(2))
		usleep(rnd(20000));
	t_wexd_restart(d);
	atomic_fetch_add(&S->gen, 1);
}

/* A raw connection doing something wrong, never waiting long for wexd. */
static void raw_junk(const char *sock)
{
	static const char *const reqs[] = {
		"{\"v\":1,\"op\":\"hel",
		"{\"v\":1,\"op\":\"hello\",\"role\":\"consumer\",\"model\":\"" MODEL "\",\"group\":\"raw\"}",
		"{\"v\":1,\"op\":\"acquire\",\"mode\":1,\"timeout_ms\":50}",
		"{\"v\":1,\"op\":\"begin_write\",\"version\":1}",
		"{\"v\":1,\"op\":\"no such op\"}",
		"[]",
	};
	char junk[256];
	int fd = wex_sock_connect(sock), n = (int)rnd(4);

	if (fd < 0) {
		fprintf(stderr, "FAIL seed %llu: raw connect to a live wexd: %s\n", seed,
			strerror(-fd));
		t_exit(T_EXIT_FAIL);
	}
	switch (rnd(4)) {
	case 0: /* random bytes */
		for (size_t i = 0; i < sizeof(junk); i++)
			junk[i] = (char)rnd(256);
		wex_sock_send(fd, junk, 1 + rnd(sizeof(junk)), NULL, 0, MSG_DONTWAIT);
		break;
	case 1: /* a consumer that asks for a lease and hangs up unanswered */
		wex_sock_send(fd, reqs[1], strlen(reqs[1]), NULL, 0, MSG_DONTWAIT);
		wex_sock_send(fd, reqs[2], strlen(reqs[2]), NULL, 0, MSG_DONTWAIT);
		if (rnd(2))
			usleep(rnd(2000));
		break;
	case 2: /* requests out of place, or cut */
		for (int i = 0; i <= n; i++) {
			const char *r = reqs[rnd(6)];

			wex_sock_send(fd, r, strlen(r), NULL, 0, MSG_DONTWAIT);
		}
		break;
	default: /* nothing at all */
		break;
	}
	close(fd);
}

static uint64_t ld(_Atomic uint64_t *x)
{
	return atomic_load(x);
}

int main(void)
{
	struct t_wexd d;
	double secs = 4, t0, next_restart;
	int base_fds, fds, restarts = 0, pkills = 0, ckills = 0, closes = 0, raws = 0, leases = -1;

	seed = t_seed("WEX_CHAOS", &secs);
	snprintf(who, sizeof(who), "schedule");
	rnd_seed(seed);
	S = mmap(NULL, sizeof(*S), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	T_ASSERT(S != MAP_FAILED, "mmap");
	memset(S, 0, sizeof(*S));
	atomic_store(&S->gen, 2);
	atomic_store(&S->cur, 1);

	t_wexd_start(&d);
	t_check_backend(d.sock);
	base_fds = t_wexd_fds_settle(&d, -1);
	for (int r = 0; r < NPROD; r++)
		start_prod(r);
	for (int s = 0; s < NCONS; s++)
		start_cons(s);

	t0 = t_now();
	/* At least one wexd restart per run, at a random moment. */
	next_restart = t0 + 0.2 + (double)rnd(1000) / 1000.0 * (secs * 0.6);
	while (t_now() - t0 < secs) {
		int st, again;

		usleep(2000 + rnd(30000));
		if (waitpid(d.pid, &st, WNOHANG) == d.pid) {
			d.pid = 0;
			fprintf(stderr, "FAIL seed %llu: wexd died (%s %d)\n", seed,
				WIFEXITED(st) ? "exit" : "signal",
				WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
			t_exit(T_EXIT_FAIL);
		}
		for (int r = 0; r < NPROD; r++)
			reap("producer rank", r, &P[r], &again);
		for (int s = 0; s < NCONS; s++) {
			reap("consumer slot", s, &C[s], &again);
			if (again)
				start_cons(s);
		}
		if (t_now() >= next_restart) {
			restart_wexd(&d);
			restarts++;
			/* Every 0.5 to 2.5 s: a long run restarts it often too. */
			next_restart = t_now() + 0.5 + (double)rnd(1000) / 500.0;
			continue;
		}
		switch (rnd(20)) {
		case 0 ... 2: { /* a producer rank, mid-write if it is writing */
			int r = (int)rnd(NPROD);

			if (!ld(&S->writing[r]) && !ld(&S->writing[!r]) && rnd(4))
				break;
			if (!ld(&S->writing[r]))
				r = !r;
			kill_producer(d.sock, r);
			pkills++;
			break;
		}
		case 3 ... 5: { /* a consumer, holding a lease when one does */
			int s = (int)rnd(NCONS);

			for (int i = 0; i < NCONS && !ld(&S->hold[s]); i++)
				s = (s + 1) % NCONS;
			if (C[s].closing)
				break;
			kill_consumer(s);
			ckills++;
			break;
		}
		case 6: { /* a consumer closes cleanly */
			int s = (int)rnd(NCONS);

			if (!C[s].closing) {
				C[s].closing = 1;
				atomic_store(&S->close_req[s], 1);
				closes++;
			}
			break;
		}
		case 7 ... 9:
			raw_junk(d.sock);
			raws++;
			break;
		default:
			break;
		}
	}

	/* The end: every client finishes what it does and closes, the
	 * consumers first (the producers may be waiting for their leases). */
	atomic_store(&S->stop_cons, 1);
	for (int j = 0; j < NPROD + NCONS; j++) {
		int i = (j + NPROD) % (NPROD + NCONS);
		struct child *ch = i < NPROD ? &P[i] : &C[i - NPROD];
		int st = 0;
		pid_t w = 0;

		if (i == 0)
			atomic_store(&S->stop, 1);
		for (double t1 = t_now(); w != ch->pid && t_now() - t1 < 60; usleep(1000))
			w = waitpid(ch->pid, &st, WNOHANG);
		if (w == ch->pid)
			t_untrack_child(w);
		if (w != ch->pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
			fprintf(stderr, "FAIL seed %llu: %s %d (pid %d) %s at the end\n", seed,
				i < NPROD ? "producer rank" : "consumer slot",
				i < NPROD ? i : i - NPROD, (int)ch->pid,
				w != ch->pid ? "did not exit within 60 s" : "failed");
			t_exit(T_EXIT_FAIL);
		}
		ch->pid = 0;
	}
	printf("%d wexd restart(s), %d producer kill(s), %d consumer kill(s), %d clean close(s), "
	       "%d raw connection(s)\n", restarts, pkills, ckills, closes, raws);
	printf("%llu begin_write(s) (%llu EBUSY), %llu publish(es), syncs: %llu copy, %llu view, "
	       "%llu fixed; %llu ETIMEDOUT, %llu ESTALE, %llu cut by restarts, %llu releases "
	       "while wexd was down, %llu leases lost, %llu version disagreements\n",
	       (unsigned long long)ld(&S->n_begin), (unsigned long long)ld(&S->n_busy),
	       (unsigned long long)ld(&S->n_publish),
	       (unsigned long long)ld(&S->n_sync[WEX_SYNC_COPY]),
	       (unsigned long long)ld(&S->n_sync[WEX_SYNC_REMAP_VIEW]),
	       (unsigned long long)ld(&S->n_sync[WEX_SYNC_REMAP_FIXED]),
	       (unsigned long long)ld(&S->n_timeout), (unsigned long long)ld(&S->n_stale),
	       (unsigned long long)ld(&S->n_restart_err), (unsigned long long)ld(&S->n_unreturned),
	       (unsigned long long)ld(&S->n_lost_lease),
	       (unsigned long long)ld(&S->n_einval));
	T_ASSERT(ld(&S->n_publish) > 0, "seed %llu: the run published nothing", seed);

	/* Everyone is gone: wexd sees the last disconnects asynchronously. */
	for (double t1 = t_now(); leases != 0 && t_now() - t1 < 10; usleep(1000))
		leases = t_leases(d.sock, MODEL);
	T_ASSERT(leases == 0, "seed %llu: %d lease(s) left with every client gone", seed, leases);
	fds = t_wexd_fds_settle(&d, base_fds);
	T_ASSERT(fds == base_fds, "seed %llu: wexd holds %d fds with every client gone, %d before "
		 "the run", seed, fds, base_fds);
	json_decref(t_status(d.sock));
	t_wexd_stop(&d);
	return T_EXIT_PASS;
}
