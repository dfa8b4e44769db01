/* SPDX-License-Identifier: MIT */
/*
 * sync_stress - a seeded, randomized run of two models on one wexd (host
 * segments), with what chaos does not do: a consumer group of three ranks,
 * syncs that wait for a newer version (min_version), wex_cancel of waits,
 * and a second model whose versions must never show in the first's.
 *  - model "sa": 2 producer ranks; model "sb": 1 producer rank; each writes
 *    increasing versions ("sb"'s from 1<<24, so a crossed model shows);
 *  - group "g3" (3 ranks) of "sa" and group "solo" (1 rank) of "sb" sync
 *    in random modes (COPY, REMAP_VIEW, REMAP_FIXED) with min_version 0
 *    (newest), the held version (kept), or one above the last (a wait,
 *    sometimes ended by wex_cancel from another thread);
 *  - producers and consumers are SIGKILLed at random moments (mid-write,
 *    under a lease, in a wait) and started again.
 * Asserted on every successful sync: every element of every tensor holds
 * exactly that version's bytes of that model, and still does just before a
 * remap lease ends; a slot's versions never go backwards and are at least
 * the min_version asked; a rank of g3 never skips a round a peer took (no
 * version a peer was served lies strictly between two of its successive
 * syncs, with no process killed in between); a begin_write never succeeds
 * while a consumer of the same model marks a lease; errors are the ones
 * wex.h documents (ETIMEDOUT for a wait, ECANCELED after wex_cancel,
 * EBUSY, ESTALE/EINVAL only after a kill); no call hangs (each child
 * exits within 60 s of the end); wexd never dies and ends with no lease.
 * WEX_STRESS_SECS (default 8) lengthens the run, WEX_STRESS_SEED replays a
 * schedule (not its timing).
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fixture.h"

#define NMODEL 2
#define NCONS 4
#define MAXPROD 2
#define MAXV 65536 /* versions of "sa" tracked for the round check */
#define WAIT_MS 1500
#define VBASE(m) ((m) ? (1ull << 24) : 0)

static const char *const model_name[NMODEL] = { "sa", "sb" };
static const uint32_t model_world[NMODEL] = { 2, 1 };
static const struct {
	int model;
	const char *group;
	uint32_t rank, world;
} slots[NCONS] = { { 0, "g3", 0, 3 }, { 0, "g3", 1, 3 }, { 0, "g3", 2, 3 }, { 1, "solo", 0, 1 } };

struct shared {
	_Atomic uint64_t cur[NMODEL];           /* version being written */
	_Atomic uint64_t pub[NMODEL][MAXPROD]; /* last published by each rank */
	_Atomic uint64_t kills;                 /* any process killed (counted before) */
	/* Producer kills per model: counted before the kill (pkills), and
	 * again once wexd shows it let the rank go (pdone). */
	_Atomic uint64_t pkills[NMODEL], pdone[NMODEL];
	_Atomic uint64_t hold[NCONS];           /* marked remap lease: pdone << 32 | version */
	_Atomic uint64_t last[NCONS];
	_Atomic uint8_t served[MAXV];           /* g3: versions some rank was served */
	_Atomic int stop, stop_cons;
	char dbg[NCONS][200]; /* each slot's last remap sync, for messages */
	_Atomic uint64_t n_pub[NMODEL], n_sync[NMODEL], n_cancel, n_timeout, n_busy, n_stale;
};

static struct shared *S;
static unsigned long long seed;
static char who[160];
static uint64_t rnd_state;

#define CF(...)                                                                       \
	do {                                                                          \
		char m_[600];                                                         \
		snprintf(m_, sizeof(m_), __VA_ARGS__);                                \
		T_FAIL("seed %llu: %s: %s", seed, who, m_);                           \
	} while (0)

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

static void nap(uint32_t max_us)
{
	usleep(100 + rnd(max_us));
}

static wex_client_t *open_client(int role, int m, const char *group, uint32_t rank,
				 uint32_t world)
{
	struct wex_client_params p = {
		.field_mask = WEX_CLIENT_FIELD_ROLE | WEX_CLIENT_FIELD_MODEL | WEX_CLIENT_FIELD_RANK |
			      WEX_CLIENT_FIELD_COPY_THREADS | (group ? WEX_CLIENT_FIELD_GROUP : 0),
		.role = role, .model = model_name[m], .group = group, .rank = rank,
		.world_size = world, .copy_threads = 1,
	};
	wex_client_t *c = NULL;
	int ret = wex_client_open(&p, &c);

	if (ret < 0)
		CF("wex_client_open: %s: %s", wex_strerror(ret), wex_last_error(NULL));
	return c;
}

/* ---------------------------------------------------------------------- */

static void producer(int m, uint32_t r, int inc)
{
	struct ex_cfg cfg;
	struct wex_tensor *t;
	uint64_t bytes, mine = 0;
	void *base;
	uint32_t seg;
	wex_client_t *c;
	int n, ret;
	double stuck = t_now();

	snprintf(who, sizeof(who), "producer %s rank %u (pid %d, start %d)", model_name[m], r,
		 (int)getpid(), inc);
	rnd_seed(seed ^ (0x1000u * (r + 1)) ^ ((uint64_t)m << 20) ^ ((uint64_t)inc << 40));
	atomic_store(&S->pub[m][r], 0);
	ex_cfg_preset(&cfg, "tiny");
	n = ex_shards(&cfg, r, model_world[m], &t, &bytes);
	T_ASSERT(n > 0, "shards");
	c = open_client(WEX_ROLE_PRODUCER, m, NULL, r, model_world[m]);
	ret = wex_segment_alloc(c, WEX_SEG_HOST, 0, bytes, &seg, &base);
	if (ret < 0)
		CF("segment_alloc: %s: %s", wex_strerror(ret), wex_last_error(c));
	for (int i = 0; i < n; i++)
		t[i].segment = seg;
	ret = wex_register_tensors(c, t, (size_t)n);
	if (ret < 0)
		CF("register_tensors: %s: %s", wex_strerror(ret), wex_last_error(c));
	if (inc) /* fresh memory: a version newer than any begun before */
		atomic_fetch_add(&S->cur[m], 1);
	while (!atomic_load(&S->stop)) {
		uint64_t v = atomic_load(&S->cur[m]), k0 = atomic_load(&S->pkills[m]);
		int all = 1;

		if (v <= mine) {
			usleep(200);
			continue;
		}
		if (t_now() - stuck > 30)
			CF("no write of v%llu went through in 30 s: %s", (unsigned long long)v,
			   wex_last_error(c));
		ret = wex_begin_write(c, v, WAIT_MS);
		if (ret == -EBUSY) {
			atomic_fetch_add(&S->n_busy, 1);
			continue;
		}
		if (ret == -EINVAL && strstr(wex_last_error(c), "all ranks write the same version") &&
		    atomic_load(&S->pkills[m])) {
			nap(1000);
			continue;
		}
		if (ret < 0)
			CF("begin_write v%llu: %s: %s", (unsigned long long)v, wex_strerror(ret),
			   wex_last_error(c));
		for (int i = 0; i < NCONS; i++) {
			uint64_t h = atomic_load(&S->hold[i]);

			/* A lease on memory a producer death took is stale
			 * (its next sync gives it up): one the death had not
			 * been done for when the sync began. */
			if (slots[i].model == m && h && h >> 32 == atomic_load(&S->pkills[m]))
				CF("begin_write v%llu granted while consumer slot %d marks a lease on "
				   "v%llu (its %s; now %.6f)", (unsigned long long)v, i,
				   (unsigned long long)(uint32_t)h, S->dbg[i], t_now());
		}
		/* Written in pieces, with naps: a wide window for torn reads
		 * and for a kill mid-write. */
		for (int i = 0; i < n; i++) {
			ex_fill(base, t + i, 1, v, 1);
			if (rnd(8) == 0)
				nap(500);
		}
		ret = wex_publish(c, v);
		if (ret == -EINVAL && atomic_load(&S->pkills[m]) != k0)
			continue;
		if (ret < 0)
			CF("publish v%llu: %s: %s", (unsigned long long)v, wex_strerror(ret),
			   wex_last_error(c));
		atomic_fetch_add(&S->n_pub[m], 1);
		mine = v;
		stuck = t_now();
		atomic_store(&S->pub[m][r], v);
		for (uint32_t q = 0; q < model_world[m]; q++)
			if (atomic_load(&S->pub[m][q]) < v)
				all = 0;
		if (all)
			atomic_compare_exchange_strong(&S->cur[m], &v, v + 1);
	}
	wex_client_close(c);
	free(t);
	t_exit(T_EXIT_PASS);
}

/* ---------------------------------------------------------------------- */

struct cons {
	wex_client_t *c;
	struct wex_tensor *t;
	int n, m;
	void *region[MAXPROD];
};

static void cons_setup(struct cons *k, int slot)
{
	struct ex_cfg cfg;
	struct wex_tensor *part[MAXPROD];
	uint64_t bytes[MAXPROD];
	int np[MAXPROD], m = slots[slot].model, ret = 0;
	uint32_t w = model_world[m];

	k->m = m;
	ex_cfg_preset(&cfg, "tiny");
	k->n = 0;
	for (uint32_t r = 0; r < w; r++) {
		np[r] = ex_shards(&cfg, r, w, &part[r], &bytes[r]);
		T_ASSERT(np[r] > 0, "shards");
		k->n += np[r];
	}
	k->t = calloc((size_t)k->n, sizeof(*k->t));
	T_ASSERT(k->t, "calloc");
	for (;;) {
		uint64_t k0 = atomic_load(&S->kills);

		k->c = open_client(WEX_ROLE_CONSUMER, m, slots[slot].group, slots[slot].rank,
				   slots[slot].world);
		for (uint32_t r = 0; r < w && ret == 0; r++)
			ret = wex_reserve(k->c, r, 0, bytes[r], &k->region[r]);
		if (ret == 0) {
			int at = 0;

			for (uint32_t r = 0; r < w; r++)
				for (int i = 0; i < np[r]; i++, at++) {
					k->t[at] = part[r][i];
					k->t[at].ptr = (char *)k->region[r] + part[r][i].offset;
				}
			ret = wex_attach(k->c, k->t, (size_t)k->n);
			if (ret == 0)
				break;
		}
		if (ret != -ETIMEDOUT && !(ret == -ESTALE && atomic_load(&S->kills) != k0))
			CF("consumer set-up: %s: %s", wex_strerror(ret), wex_last_error(k->c));
		wex_client_close(k->c);
		ret = 0;
		if (atomic_load(&S->stop_cons))
			t_exit(T_EXIT_PASS);
		nap(5000);
	}
	for (uint32_t r = 0; r < w; r++)
		free(part[r]);
}

static uint64_t bad_bytes(struct cons *k, int mode, uint64_t v)
{
	uint64_t bad = 0;

	if (mode != WEX_SYNC_REMAP_VIEW)
		return ex_check(NULL, k->t, (size_t)k->n, v, 1);
	for (uint32_t r = 0; r < model_world[k->m]; r++) {
		const struct wex_tensor *pt;
		size_t n = 0;
		int ret = wex_producer_tensors(k->c, r, &pt, &n);

		if (ret < 0)
			CF("producer_tensors(%u): %s", r, wex_last_error(k->c));
		for (size_t i = 0; i < n; i++) {
			struct wex_tensor d;
			void *ptr;

			ret = wex_view(k->c, r, pt[i].name, &ptr, &d);
			if (ret < 0)
				CF("view %s: %s", pt[i].name, wex_last_error(k->c));
			bad += ex_check(NULL, &d, 1, v, 1);
		}
	}
	return bad;
}

struct canceller {
	pthread_t th;
	wex_client_t *c;
	useconds_t at;
	_Atomic int fired;
};

static void *cancel_main(void *arg)
{
	struct canceller *x = arg;

	usleep(x->at);
	if (wex_cancel(x->c) == 1)
		atomic_store(&x->fired, 1);
	return NULL;
}

static const char *mode_name(int mode)
{
	return mode == WEX_SYNC_COPY ? "copy" : mode == WEX_SYNC_REMAP_VIEW ? "view" : "fixed";
}

static void consumer(int slot, int inc)
{
	static const int modes[3] = { WEX_SYNC_COPY, WEX_SYNC_REMAP_VIEW, WEX_SYNC_REMAP_FIXED };
	struct cons k;
	uint64_t held_v = 0, prev_v = 0, prev_kills = 0;
	int held = 0, have_prev = 0;

	snprintf(who, sizeof(who), "consumer slot %d (%s group %s rank %u, pid %d, start %d)", slot,
		 model_name[slots[slot].model], slots[slot].group, slots[slot].rank, (int)getpid(),
		 inc);
	rnd_seed(seed ^ (0x100000u * (uint64_t)(slot + 1)) ^ ((uint64_t)inc << 44));
	cons_setup(&k, slot);
	while (!atomic_load(&S->stop_cons)) {
		int mode = modes[rnd(3)], ret, pick = (int)rnd(6);
		uint64_t last = atomic_load(&S->last[slot]), minv = 0, v, bad, k0, pk0;
		struct wex_sync_result res;
		struct canceller x = { .c = k.c };
		int cancelling = 0;

		if (held && pick == 0)
			minv = held_v;
		else if (pick <= 2 && last)
			minv = last + 1; /* wait for a newer one */
		if (held && !minv && rnd(2)) {
			atomic_store(&S->hold[slot], 0);
			ret = wex_release(k.c);
			if (ret < 0)
				CF("release of v%llu: %s: %s", (unsigned long long)held_v,
				   wex_strerror(ret), wex_last_error(k.c));
			held = 0;
		}
		/* The mark stays only for a remap sync keeping the lease: a
		 * copy's lease ends with the copy. */
		if (minv != held_v || !held || mode == WEX_SYNC_COPY)
			atomic_store(&S->hold[slot], 0);
		if (minv > last && rnd(3) == 0) {
			x.at = 50 + rnd(WAIT_MS * 1000u / 2);
			T_ASSERT(pthread_create(&x.th, NULL, cancel_main, &x) == 0, "pthread_create");
			cancelling = 1;
		}
		k0 = atomic_load(&S->kills);
		pk0 = atomic_load(&S->pdone[k.m]);
		ret = wex_sync(k.c, mode, minv, WAIT_MS, &res);
		if (cancelling)
			pthread_join(x.th, NULL);
		if (ret < 0) {
			held = 0;
			atomic_store(&S->hold[slot], 0);
			if (ret == -ECANCELED && cancelling && atomic_load(&x.fired)) {
				atomic_fetch_add(&S->n_cancel, 1);
				continue;
			}
			if (ret == -ETIMEDOUT) {
				atomic_fetch_add(&S->n_timeout, 1);
				continue;
			}
			if ((ret == -ESTALE || ret == -WEX_EDIRTY) && atomic_load(&S->kills)) {
				atomic_fetch_add(&S->n_stale, 1);
				have_prev = 0;
				nap(2000);
				continue;
			}
			CF("%s sync (min v%llu): %s: %s", mode_name(mode), (unsigned long long)minv,
			   wex_strerror(ret), wex_last_error(k.c));
		}
		v = res.version;
		if (v < minv)
			CF("%s sync with min_version v%llu got v%llu", mode_name(mode),
			   (unsigned long long)minv, (unsigned long long)v);
		if (v < last)
			CF("%s sync got v%llu after this slot had synced v%llu", mode_name(mode),
			   (unsigned long long)v, (unsigned long long)last);
		if (v >= VBASE(1) ? !k.m : k.m && v < VBASE(1))
			CF("%s sync of model %s got v%llu, a version of the other model",
			   mode_name(mode), model_name[k.m], (unsigned long long)v);
		atomic_store(&S->last[slot], v);
		atomic_fetch_add(&S->n_sync[k.m], 1);
		/* Rounds: no version a peer of g3 was served may lie between
		 * two successive syncs of this rank when nobody died. */
		if (k.m == 0 && v < MAXV) {
			if (have_prev && prev_kills == atomic_load(&S->kills))
				for (uint64_t u = prev_v + 1; u < v; u++)
					if (atomic_load(&S->served[u]))
						CF("%s sync got v%llu after v%llu: it skipped the "
						   "round of v%llu that a peer of group g3 took",
						   mode_name(mode), (unsigned long long)v,
						   (unsigned long long)prev_v, (unsigned long long)u);
			atomic_store(&S->served[v], 1);
			have_prev = 1;
			prev_v = v;
			prev_kills = k0;
		}
		/* A copy that kept the held version ends with no lease that
		 * this test relies on. */
		snprintf(S->dbg[slot], sizeof(S->dbg[slot]),
			 "%s sync, min v%llu, last v%llu, %s v%llu before, at %.6f", mode_name(mode),
			 (unsigned long long)minv, (unsigned long long)last,
			 held ? "held" : "released", (unsigned long long)held_v, t_now());
		atomic_store(&S->hold[slot], mode != WEX_SYNC_COPY ? pk0 << 32 | v : 0);
		bad = bad_bytes(&k, mode, v);
		if (bad)
			CF("%s sync of v%llu: %llu elements from another version", mode_name(mode),
			   (unsigned long long)v, (unsigned long long)bad);
		nap(rnd(4) ? 3000 : 15000);
		bad = bad_bytes(&k, mode, v);
		if (bad)
			CF("%s of v%llu: %llu elements changed%s", mode_name(mode),
			   (unsigned long long)v, (unsigned long long)bad,
			   mode == WEX_SYNC_COPY ? " after the copy" : " while the lease was held");
		held = mode != WEX_SYNC_COPY;
		held_v = v;
		if (held && rnd(3) == 0) {
			atomic_store(&S->hold[slot], 0);
			ret = wex_release(k.c);
			if (ret < 0)
				CF("release of v%llu: %s: %s", (unsigned long long)v, wex_strerror(ret),
				   wex_last_error(k.c));
			held = 0;
		}
	}
	atomic_store(&S->hold[slot], 0);
	wex_client_close(k.c);
	free(k.t);
	t_exit(T_EXIT_PASS);
}

/* ---------------------------------------------------------------------- */

struct child {
	pid_t pid;
	int starts, is_prod, m, i;
};

/* Producers of sa (0, 1), of sb (2); then the consumer slots. */
#define NPROC (3 + NCONS)
static struct child CH[NPROC];

static void spawn(struct child *ch)
{
	pid_t pid = t_fork();

	if (pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() == 1)
			_exit(1);
		if (ch->is_prod)
			producer(ch->m, (uint32_t)ch->i, ch->starts);
		consumer(ch->i, ch->starts);
	}
	ch->starts++;
	ch->pid = pid;
}

/* The pid wexd's status shows for producer rank r of model m (0: none). */
static pid_t prod_pid(const char *sock, int m, int r)
{
	json_t *st = t_status(sock), *j = t_status_model(st, model_name[m]);
	pid_t pid = 0;

	if (j)
		pid = (pid_t)json_integer_value(json_object_get(
			json_array_get(json_object_get(j, "producers"), (size_t)r), "pid"));
	json_decref(st);
	return pid;
}

static void kill_child(const char *sock, struct child *ch)
{
	int st;

	kill(ch->pid, SIGSTOP);
	while (waitpid(ch->pid, &st, WUNTRACED) < 0 && errno == EINTR)
		;
	if (!WIFSTOPPED(st)) {
		fprintf(stderr, "FAIL seed %llu: %s %d ended before it was killed (status %d)\n", seed,
			ch->is_prod ? "producer" : "consumer", ch->i, st);
		t_exit(T_EXIT_FAIL);
	}
	atomic_fetch_add(&S->kills, 1);
	if (ch->is_prod)
		atomic_fetch_add(&S->pkills[ch->m], 1);
	else
		atomic_store(&S->hold[ch->i], 0);
	kill(ch->pid, SIGKILL);
	t_wait(ch->pid);
	if (ch->is_prod) {
		for (double t0 = t_now(); prod_pid(sock, ch->m, ch->i) == ch->pid; usleep(500))
			if (t_now() - t0 > 30) {
				fprintf(stderr, "FAIL seed %llu: wexd still shows killed producer %s "
					"rank %d after 30 s\n", seed, model_name[ch->m], ch->i);
				t_exit(T_EXIT_FAIL);
			}
		atomic_fetch_add(&S->pdone[ch->m], 1);
	}
	spawn(ch);
}

int main(void)
{
	struct t_wexd d;
	double secs = 8, t0;
	int kills = 0, leases = -1;

	seed = t_seed("WEX_STRESS", &secs);
	snprintf(who, sizeof(who), "schedule");
	rnd_seed(seed);
	S = mmap(NULL, sizeof(*S), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	T_ASSERT(S != MAP_FAILED, "mmap");
	memset(S, 0, sizeof(*S));
	for (int m = 0; m < NMODEL; m++)
		atomic_store(&S->cur[m], VBASE(m) + 1);
	t_wexd_start(&d);
	t_check_backend(d.sock);
	for (int i = 0; i < NPROC; i++) {
		CH[i] = (struct child){ .is_prod = i < 3, .m = i == 2, .i = i < 3 ? (i == 2 ? 0 : i) :
										     i - 3 };
		spawn(&CH[i]);
	}
	t0 = t_now();
	while (t_now() - t0 < secs) {
		int st;

		usleep(20000 + rnd(200000));
		if (waitpid(d.pid, &st, WNOHANG) == d.pid) {
			d.pid = 0;
			fprintf(stderr, "FAIL seed %llu: wexd died\n", seed);
			t_exit(T_EXIT_FAIL);
		}
		for (int i = 0; i < NPROC; i++)
			if (waitpid(CH[i].pid, &st, WNOHANG) == CH[i].pid) {
				t_untrack_child(CH[i].pid);
				fprintf(stderr, "FAIL seed %llu: %s %d (pid %d) %s %d\n", seed,
					CH[i].is_prod ? "producer" : "consumer", CH[i].i, (int)CH[i].pid,
					WIFEXITED(st) ? "exited with" : "died of signal",
					WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
				CH[i].pid = 0;
				t_exit(T_EXIT_FAIL);
			}
		if (rnd(3) == 0) {
			kill_child(d.sock, &CH[rnd(NPROC)]);
			kills++;
		}
	}
	atomic_store(&S->stop_cons, 1);
	for (int j = 0; j < NPROC; j++) {
		struct child *ch = &CH[(j + 3) % NPROC];
		int st = 0;
		pid_t w = 0;

		if (j == NCONS)
			atomic_store(&S->stop, 1);
		for (double t1 = t_now(); w != ch->pid && t_now() - t1 < 60; usleep(1000))
			w = waitpid(ch->pid, &st, WNOHANG);
		if (w == ch->pid)
			t_untrack_child(w);
		if (w != ch->pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
			fprintf(stderr, "FAIL seed %llu: %s %d (pid %d) %s at the end\n", seed,
				ch->is_prod ? "producer" : "consumer", ch->i, (int)ch->pid,
				w != ch->pid ? "did not exit within 60 s (a hang)" : "failed");
			t_exit(T_EXIT_FAIL);
		}
	}
	printf("%d kills; published sa %llu sb %llu; synced sa %llu sb %llu; %llu cancelled, "
	       "%llu timed out, %llu busy, %llu stale\n", kills,
	       (unsigned long long)atomic_load(&S->n_pub[0]), (unsigned long long)atomic_load(&S->n_pub[1]),
	       (unsigned long long)atomic_load(&S->n_sync[0]), (unsigned long long)atomic_load(&S->n_sync[1]),
	       (unsigned long long)atomic_load(&S->n_cancel), (unsigned long long)atomic_load(&S->n_timeout),
	       (unsigned long long)atomic_load(&S->n_busy), (unsigned long long)atomic_load(&S->n_stale));
	T_ASSERT(atomic_load(&S->n_sync[0]) > 0 && atomic_load(&S->n_sync[1]) > 0,
		 "seed %llu: a model was never synced", seed);
	for (int m = 0; m < NMODEL; m++) {
		for (double t1 = t_now(); leases != 0 && t_now() - t1 < 10; usleep(1000))
			leases = t_leases(d.sock, model_name[m]);
		T_ASSERT(leases == 0, "seed %llu: model %s has %d leases with every client gone", seed,
			 model_name[m], leases);
		leases = -1;
	}
	t_wexd_stop(&d);
	t_exit(T_EXIT_PASS);
}
