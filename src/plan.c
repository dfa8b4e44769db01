/* SPDX-License-Identifier: MIT */
/*
 * plan.c - the resharding planner (DESIGN section 5).
 *
 * Producer pieces are indexed once: canonical names are interned, entries
 * sorted by (name, first coordinate).  For each consumer piece the sources
 * that intersect it are found by binary search and a short sweep (never all
 * pairs).  Their box boundaries cut the consumer box into a grid of cells;
 * every cell lies wholly inside each source that touches it, so choosing one
 * source per cell writes every element exactly once (zero redundancy).
 * Cells held by several producer ranks (data-parallel replicas, replicated
 * norms) are cut into chunks when large and given to the least loaded
 * holder, exclusive cells first and large ones first; ties rotate with the
 * consumer rank so that ranks planned by separate planners still spread.
 * Holders on the consumer's own device (near), where a cell has any, are
 * its only candidates.
 * Cells become strided copies; contiguous dims are merged, up to three outer
 * dims kept (innermost first), the rest split, and neighbouring ops fused.
 */
#include <assert.h>
#include <errno.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <time.h>

#include "plan.h"
#include "vmm/backend.h"

#define MAXD WEX_MAX_DIMS
/* Smallest chunk a rank planned alone cuts a replicated cell into. */
#define SPLIT_MIN (1u << 20)
/* The most steps one plan may take cutting its consumer pieces into cells
 * (producer entries scanned, boundaries found, and for each cell the
 * producer pieces over its dim-0 slab checked).  A producer's table of
 * many overlapping pieces of one tensor made that cubic in its size: 3600
 * pieces of a [901, 901] tensor held wexd's event loop (no other client
 * served) for 6 s, 6400 pieces past 10 s.  Real layouts stay far below
 * it: the largest measured, a whole Qwen2 from FSDP over 8192 ranks x dp
 * 4 (1.5M producer pieces), 9.4M steps; a DeepSeek-V3 rank from Megatron
 * tp 8, pp 16, dp 8, ep 64 (plan_scale), 3.3M (review h105). */
#define PLAN_STEPS_MAX (1ull << 30)
/* The most cells one plan may cut its consumer pieces into, past those
 * its producer pieces account for.  Steps do not bound them: a producer's
 * table of one row piece and one diagonal piece per row of a [K, K]
 * tensor cuts it into K^2 cells in about 4 K^2 steps, and wexd keeps its
 * scratch arrays (about 300 bytes a cell with the ops made from them):
 * K = 2048 took 2.2 s and 1.2 GB, K = 8192 would have taken 20 GB.  Real
 * layouts make about a cell per producer piece over a consumer piece
 * (their cuts line up), and may have millions: a vLLM tp 8 rank of
 * DeepSeek-V3 from FSDP2 over 256 ranks has 4.9M (each of its 15k expert
 * tensors cut in 256 chunks, review h118), past 2^22 alone.  So the bound
 * is 2^22 and PLAN_CELLS_PER_HIT a producer piece over a consumer piece:
 * such layouts stay under it whatever their size, a table cutting each
 * consumer piece into far more cells than it has pieces over it does not. */
#define PLAN_CELLS_MAX (1ull << 22)
#define PLAN_CELLS_PER_HIT 16

struct src_entry {
	uint32_t name;     /* interned name id */
	uint32_t src;      /* index into srcs[] */
	uint64_t start0, end0;
	uint64_t start1, end1; /* dim 1 (0, 1 when absent): most pieces are 2-D,
				* so the sweep rarely needs to touch *t */
	const struct wex_tensor *t;
};

struct name_info {
	const char *name;
	uint64_t hash;
	size_t lo, hi;     /* entries [lo, hi) */
	uint64_t maxext0;
};

/* Demand per set of producer ranks able to serve it (for the lower bound). */
struct hset {
	uint64_t hash;
	uint32_t off, n;   /* members in pl->hmem[off..off+n) */
	uint64_t demand;
};

struct wex_planner {
	const struct wex_plan_src *srcs;
	size_t nsrc;
	struct src_entry *ent;
	size_t nent;
	struct name_info *names;
	size_t nnames;
	uint64_t *ntab;    /* open addressing: the name hash's high 32 bits
			    * over name id + 1 (a probe that does not match
			    * reads nothing else); 0 empty */
	size_t ntab_mask;
	uint64_t key[2];   /* name_hash's key, random per planner */
	uint64_t *load;    /* bytes read from srcs[i] over all plans */
	uint64_t *stamp;   /* per source: last cell that listed it */
	uint64_t serial;
	int any_near;      /* some source can be near: cells filter candidates */
	/* holder sets */
	struct hset *hs;
	size_t nhs, caphs;
	uint32_t *htab;    /* index + 1 */
	size_t htab_mask;
	uint32_t *hmem;
	size_t nhmem, caphmem;
	uint32_t *hsingle; /* per source: index + 1 of the set of it alone */
	/* totals */
	uint64_t needed, moved, ops;
	struct work *w;    /* scratch kept between calls */
};

struct work;

struct cand {
	uint32_t src;      /* index into srcs[] */
	const struct wex_tensor *t;
};

struct cell {
	uint32_t dst;
	uint32_t ndim;
	uint32_t cand_off, ncand;
	uint32_t plan;     /* which output plan (group) */
	int32_t chosen;    /* index into candidates, -1 none yet */
	uint64_t bytes;
	uint64_t nh;       /* name_tie(the tensor name) */
	uint64_t start[MAXD], ext[MAXD];
};

struct work {
	struct cell *cells;
	size_t ncells, capcells;
	struct cand *cands;
	size_t ncands, capcands;
	const struct src_entry **hits;
	size_t caphits;
	uint64_t *bp;
	size_t capbp;
	struct cell **order;
	size_t caporder;
	uint64_t steps;    /* this plan's work so far (PLAN_STEPS_MAX) */
	uint64_t ncells_plan; /* this plan's cells so far (PLAN_CELLS_MAX) */
	uint64_t nhits_plan; /* its producer pieces over its consumer pieces so far */
	size_t *act;       /* cut_piece: the hits over the current dim-0 slab */
	size_t capact;
};

#include "log.h"

#define seterr wex__seterr

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
	const unsigned char *c = p;

	for (size_t i = 0; i < n; i++) {
		h ^= c[i];
		h *= 1099511628211ull;
	}
	return h;
}

#define FNV0 1469598103934665603ull

static uint64_t mix64(uint64_t x)
{
	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdull;
	x ^= x >> 33;
	x *= 0xc4ceb9fe1a85ec53ull;
	x ^= x >> 33;
	return x;
}

static int grow_slow(void **p, size_t *cap, size_t need, size_t elem)
{
	size_t c = *cap ? *cap : 64;
	void *n;

	while (c < need)
		c *= 2;
	n = realloc(*p, c * elem);
	if (!n)
		return -ENOMEM;
	*p = n;
	*cap = c;
	return 0;
}

/* Called once per cell, candidate and op: the check that almost always
 * passes is inlined, the realloc is not. */
static inline int grow(void **p, size_t *cap, size_t need, size_t elem)
{
	if (need <= *cap)
		return 0;
	return grow_slow(p, cap, need, elem);
}

/* Elements of a piece's box; a 0-dim tensor is one element. */
static uint64_t box_elems(const struct wex_tensor *t)
{
	uint64_t n = 1;

	for (uint32_t i = 0; i < t->ndim; i++)
		n *= t->extent[i];
	return n;
}

/* Inlined where cells are emitted (two calls per cell). */
static inline void tensor_strides(const struct wex_tensor *t, int64_t *s)
{
	int zero = 1;

	for (uint32_t i = 0; i < t->ndim; i++)
		if (t->strides[i])
			zero = 0;
	if (!zero) {
		for (uint32_t i = 0; i < t->ndim; i++)
			s[i] = t->strides[i];
		return;
	}
	int64_t acc = 1;
	for (int i = (int)t->ndim - 1; i >= 0; i--) {
		s[i] = acc;
		acc *= (int64_t)t->extent[i];
	}
}

void wex__tensor_strides(const struct wex_tensor *t, int64_t *s)
{
	tensor_strides(t, s);
}

static inline uint64_t rotl64(uint64_t x, int b)
{
	return (x << b) | (x >> (64 - b));
}

#define SIPROUND                                                                  \
	do {                                                                      \
		v0 += v1, v1 = rotl64(v1, 13), v1 ^= v0, v0 = rotl64(v0, 32);    \
		v2 += v3, v3 = rotl64(v3, 16), v3 ^= v2;                          \
		v0 += v3, v3 = rotl64(v3, 21), v3 ^= v0;                          \
		v2 += v1, v1 = rotl64(v1, 17), v1 ^= v2, v2 = rotl64(v2, 32);    \
	} while (0)

/*
 * SipHash-1-3 of the name under the planner's random key.  Names are the
 * clients' (a producer's table, a consumer's layout): under an unkeyed
 * hash (an invertible multiply-xorshift per 8 bytes) names made to share
 * a slot cost each lookup the whole run of them, 20000 such names took
 * wexd's planner 0.9 s instead of 0.06, 100000 over 20 s, while wexd
 * answered no one.  Only lookups use the hash: plans do not depend on it.
 */
static uint64_t name_hash(const struct wex_planner *pl, const char *s)
{
	size_t n = strlen(s), i = 0;
	uint64_t v0 = pl->key[0] ^ 0x736f6d6570736575ull, v1 = pl->key[1] ^ 0x646f72616e646f6dull;
	uint64_t v2 = pl->key[0] ^ 0x6c7967656e657261ull, v3 = pl->key[1] ^ 0x7465646279746573ull;
	uint64_t b = (uint64_t)n << 56;

	for (; i + 8 <= n; i += 8) {
		uint64_t w;

		memcpy(&w, s + i, 8);
		v3 ^= w;
		SIPROUND;
		v0 ^= w;
	}
	for (size_t j = 0; i + j < n; j++)
		b |= (uint64_t)(unsigned char)s[i + j] << (8 * j);
	v3 ^= b;
	SIPROUND;
	v0 ^= b;
	v2 ^= 0xff;
	SIPROUND;
	SIPROUND;
	SIPROUND;
	return v0 ^ v1 ^ v2 ^ v3;
}

/* The name's part of a cell's tie rotation (cell_hash): the same in every
 * planner, unlike name_hash, whose key is random per planner.  Under that
 * key the holder a cell went to among equally loaded ones changed from
 * planner to planner: `wexctl plan` gave another plan (and plan hash) each
 * run, and consumer ranks planned apart (wexd plans each on a planner of
 * its own) no longer spread over the replicas by crank, several reading
 * the same one.  Not a lookup: names made to collide cost nothing here. */
static uint64_t name_tie(const char *s)
{
	size_t n = strnlen(s, WEX_NAME_MAX), i = 0;
	uint64_t h = FNV0 ^ n;

	for (; i + 8 <= n; i += 8) {
		uint64_t w;

		memcpy(&w, s + i, 8);
		h = (h ^ w) * 0x9e3779b97f4a7c15ull;
		h ^= h >> 29;
	}
	return fnv(h, s + i, n - i);
}

uint64_t wex__planner_name_hash(const struct wex_planner *pl, const char *name)
{
	return name_hash(pl, name);
}

/* A key no client can guess (getrandom; the clock and an address where
 * it fails, as in a seccomp jail that refuses it). */
static void name_key(struct wex_planner *pl)
{
	struct timespec ts;

	if (getrandom(pl->key, sizeof(pl->key), GRND_NONBLOCK) == (ssize_t)sizeof(pl->key))
		return;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	pl->key[0] = ((uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec) *
		     0x9e3779b97f4a7c15ull;
	pl->key[1] = (uint64_t)(uintptr_t)pl ^ rotl64(pl->key[0], 31);
}

static long name_find(const struct wex_planner *pl, const char *name, uint64_t h)
{
	for (size_t i = h & pl->ntab_mask;; i = (i + 1) & pl->ntab_mask) {
		uint64_t e = pl->ntab[i];
		uint32_t v = (uint32_t)e;

		if (!v)
			return -1;
		if ((e >> 32) == (h >> 32) && pl->names[v - 1].hash == h &&
		    strcmp(pl->names[v - 1].name, name) == 0)
			return (long)(v - 1);
	}
}

/* Name lookups miss the cache: the table, the name records and the
 * producer pieces they point to are scattered over megabytes.  plan_many
 * looks names up in stages, a few consumer pieces ahead of the one it
 * cuts: stage 0 asks for the table slot, stage 1 (the slot now cached)
 * for the name record, stage 2 for the producer piece that cut_piece
 * compares names, dtype and shape with, and the piece's first entries.
 * Only hints: the lookup itself is name_find's. */
#define NAME_AHEAD 12 /* a multiple of 3 */
#define NAME_RING 16  /* > NAME_AHEAD */

static inline void name_prefetch(const struct wex_planner *pl, uint64_t h, int stage)
{
#if defined(__GNUC__)
	const uint64_t *slot = &pl->ntab[h & pl->ntab_mask];
	uint32_t v;

	if (stage == 0) {
		__builtin_prefetch(slot);
		return;
	}
	v = (uint32_t)*slot;
	if (!v || (*slot >> 32) != (h >> 32))
		return;
	if (stage == 1) {
		__builtin_prefetch(&pl->names[v - 1]);
		return;
	}
	const char *t = pl->names[v - 1].name;

	__builtin_prefetch(t);
	__builtin_prefetch(t + offsetof(struct wex_tensor, dtype));
	__builtin_prefetch(t + offsetof(struct wex_tensor, shape) + 64);
	__builtin_prefetch(&pl->ent[pl->names[v - 1].lo]);
#else
	(void)pl;
	(void)h;
	(void)stage;
#endif
}

static int check_piece(const struct wex_tensor *t, const char *side, char *err, size_t errlen)
{
	if (t->ndim > MAXD || wex_dtype_size(t->dtype) == 0) {
		seterr(err, errlen, "%s piece %.*s: bad ndim %u or dtype %d", side, WEX_NAME_MAX,
		       t->name, t->ndim, t->dtype);
		return -WEX_ELAYOUT;
	}
	for (uint32_t d = 0; d < t->ndim; d++) {
		if (t->start[d] + t->extent[d] > t->shape[d] || t->start[d] + t->extent[d] < t->start[d]) {
			seterr(err, errlen, "%s piece %.*s: box exceeds the shape in dim %u", side,
			       WEX_NAME_MAX, t->name, d);
			return -WEX_ELAYOUT;
		}
	}
	return 0;
}

/* "BF16 [896, 4864]": a tensor's element type and full shape, for errors. */
static const char *dtype_shape(const struct wex_tensor *t, char *buf, size_t len)
{
	const char *dn = wex_dtype_name(t->dtype);
	size_t n = (size_t)snprintf(buf, len, "%s [", dn ? dn : "?");

	for (uint32_t d = 0; d < t->ndim && d < MAXD && n < len; d++)
		n += (size_t)snprintf(buf + n, len - n, "%s%llu", d ? ", " : "",
				      (unsigned long long)t->shape[d]);
	if (n < len)
		snprintf(buf + n, len - n, "]");
	return buf;
}

/* Called every 16K producer pieces, cells and ops, every 64K comparisons
 * of a sort, at each consumer piece and after each POPULATE_STEP of ops
 * faulted in while a plan is built (and from wex__plan_tick, as its memfd
 * is made): wexd pings its watchdog there.  A plan of millions of cells
 * takes seconds; one past WatchdogSec in wexd's loop had systemd kill
 * wexd, and the consumer asked the restarted wexd for the same plan.  The
 * hook is the calling thread's: wexd's loop sets it (the producer tables'
 * memfd), its planner thread has none. */
static _Thread_local void (*tick_fn)(void *arg);
static _Thread_local void *tick_arg;

void wex__plan_tick_set(void (*fn)(void *arg), void *arg)
{
	tick_fn = fn;
	tick_arg = arg;
}

static inline void plan_tick(size_t i)
{
	if (tick_fn && !(i & 0x3fff))
		tick_fn(tick_arg);
}

void wex__plan_tick(void)
{
	if (tick_fn)
		tick_fn(tick_arg);
}

/* The calling thread's stop flag (wex__plan_cancel_set): looked at with
 * each consumer piece's steps (plan_steps), a millisecond apart at most
 * in the largest plans measured, and before each later stage of a plan
 * (holder sets, splitting and balance, emitting the ops). */
static _Thread_local const atomic_int *cancel_flag;

void wex__plan_cancel_set(const atomic_int *flag)
{
	cancel_flag = flag;
}

/* -ECANCELED, with err saying where, once the thread's stop flag is set. */
static int plan_stopped(const char *where, char *err, size_t errlen)
{
	if (!cancel_flag || !atomic_load_explicit(cancel_flag, memory_order_relaxed))
		return 0;
	seterr(err, errlen, "stopped at %s: the plan is no longer wanted", where);
	return -ECANCELED;
}

/* From the comparators of the sorts of millions of entries (a producer
 * table, the cells with several holders, the split cells): one took 1 to
 * 2 s without a tick.  Counted only where the thread set a hook. */
static _Thread_local size_t tick_cmps;

static inline void cmp_tick(void)
{
	if (tick_fn && !(++tick_cmps & 0xffff))
		tick_fn(tick_arg);
}

/*
 * The sorts of millions of entries (a producer table's index, the cells
 * with several holders, the split cells) take 1 to 2 s each, and a plan
 * stopped meanwhile (plan_stopped) ran its sort to the end.  Past
 * SORT_RUN entries plan_sort sorts pointers to them instead: runs of
 * RUN0 by insertion, merged pairwise (a merge sort, as glibc's qsort is
 * for such arrays), the stop flag looked at every SORT_RUN entries merged
 * (every SORT_RUN / 8 in the runs' insertion); then the entries are moved
 * into that order along its cycles, through one spare entry's room (as
 * glibc's qsort does for entries larger than 32 bytes).  Each comparator
 * orders its entries totally (ties broken by address or by keys that are
 * unique), so the order is qsort's.  Stopped, the entries are as they
 * were.  0, or -ECANCELED or -ENOMEM with err set.
 */
#define SORT_RUN 65536
#define RUN0 16

static int plan_sort(void *base, size_t n, size_t size, int (*cmp)(const void *a, const void *b),
		     const char *what, char *err, size_t errlen)
{
	char *b = base, *spare = NULL, **p, **q, **from, **to;
	int ret = -ENOMEM;

	if (n <= SORT_RUN) {
		qsort(base, n, size, cmp);
		return 0;
	}
	p = malloc(n * sizeof(*p));
	q = malloc(n * sizeof(*q));
	spare = malloc(size);
	if (!p || !q || !spare) {
		seterr(err, errlen, "out of memory");
		goto out;
	}
	for (size_t i = 0; i < n; i++)
		p[i] = b + i * size;
	for (size_t lo = 0; lo < n; lo += RUN0) {
		size_t hi = n - lo > RUN0 ? lo + RUN0 : n;

		/* (An entry takes up to RUN0 comparisons here, one merging.) */
		if (!(lo & (SORT_RUN / 8 - 1)) && (ret = plan_stopped(what, err, errlen)) < 0)
			goto out;
		for (size_t i = lo + 1; i < hi; i++) {
			char *x = p[i];
			size_t j = i;

			for (; j > lo && cmp(x, p[j - 1]) < 0; j--)
				p[j] = p[j - 1];
			p[j] = x;
		}
	}
	from = p;
	to = q;
	for (size_t w = RUN0; w < n; w *= 2) {
		for (size_t lo = 0; lo < n; lo += 2 * w) {
			size_t mid = n - lo > w ? lo + w : n;
			size_t hi = n - mid > w ? mid + w : n, i = lo, j = mid, k = lo;

			while (i < mid && j < hi) {
				/* Up to SORT_RUN entries between looks at the flag. */
				size_t end = hi - k > SORT_RUN ? k + SORT_RUN : hi;

				if ((ret = plan_stopped(what, err, errlen)) < 0)
					goto out;
				/* Equal: the earlier run's first (stable). */
				while (i < mid && j < hi && k < end)
					to[k++] = cmp(from[j], from[i]) < 0 ? from[j++] : from[i++];
			}
			while (i < mid)
				to[k++] = from[i++];
			while (j < hi)
				to[k++] = from[j++];
		}
		char **t = from;

		from = to;
		to = t;
	}
	/* Entry i goes where from[i] points: each cycle of that permutation
	 * moved along, its first entry through the spare room. */
	for (size_t i = 0; i < n; i++) {
		char *at = b + i * size, *src = from[i];
		size_t j = i;

		if (src == at)
			continue;
		memcpy(spare, at, size);
		while (src != b + i * size) {
			size_t k = (size_t)(src - b) / size;

			memcpy(b + j * size, src, size);
			from[j] = b + j * size;
			j = k;
			src = from[k];
		}
		memcpy(b + j * size, spare, size);
		from[j] = b + j * size;
	}
	ret = 0;
out:
	free(p);
	free(q);
	free(spare);
	return ret;
}

static int ent_cmp(const void *a, const void *b)
{
	const struct src_entry *x = a, *y = b;

	cmp_tick();
	if (x->name != y->name)
		return x->name < y->name ? -1 : 1;
	if (x->start0 != y->start0)
		return x->start0 < y->start0 ? -1 : 1;
	if (x->src != y->src)
		return x->src < y->src ? -1 : 1;
	return x->t < y->t ? -1 : x->t > y->t;
}

int wex__planner_new(const struct wex_plan_src *srcs, size_t nsrc, struct wex_planner **out,
		     char *err, size_t errlen)
{
	struct wex_planner *pl;
	size_t total = 0, k = 0, tabn = 16;
	int ret = -ENOMEM;

	pl = calloc(1, sizeof(*pl));
	if (!pl)
		return -ENOMEM;
	pl->srcs = srcs;
	pl->nsrc = nsrc;
	name_key(pl);
	for (size_t i = 0; i < nsrc; i++)
		total += srcs[i].n;
	pl->ent = calloc(total ? total : 1, sizeof(*pl->ent));
	pl->load = calloc(nsrc ? nsrc : 1, sizeof(uint64_t));
	pl->stamp = calloc(nsrc ? nsrc : 1, sizeof(uint64_t));
	pl->hsingle = calloc(nsrc ? nsrc : 1, sizeof(uint32_t));
	pl->names = calloc(total ? total : 1, sizeof(*pl->names));
	while (tabn < 2 * total + 16)
		tabn *= 2;
	pl->ntab = calloc(tabn, sizeof(uint64_t));
	pl->ntab_mask = tabn - 1;
	if (!pl->ent || !pl->load || !pl->stamp || !pl->hsingle || !pl->names || !pl->ntab)
		goto err;
	for (size_t i = 0; i < nsrc; i++) {
		if (srcs[i].near_seg) {
			for (uint32_t g = 0; g < srcs[i].nnear_seg; g++)
				if (srcs[i].near_seg[g])
					pl->any_near = 1;
		} else if (srcs[i].near) {
			pl->any_near = 1;
		}
		for (size_t j = 0; j < srcs[i].n; j++) {
			const struct wex_tensor *t = &srcs[i].t[j];
			uint64_t h;
			long id;

			plan_tick(k);
			ret = check_piece(t, "producer", err, errlen);
			if (ret < 0)
				goto err;
			h = name_hash(pl, t->name);
			id = name_find(pl, t->name, h);
			if (id < 0) {
				size_t slot = h & pl->ntab_mask;

				while (pl->ntab[slot])
					slot = (slot + 1) & pl->ntab_mask;
				id = (long)pl->nnames++;
				pl->names[id].name = t->name;
				pl->names[id].hash = h;
				pl->ntab[slot] = (h >> 32) << 32 | ((uint64_t)id + 1);
			}
			pl->ent[k].name = (uint32_t)id;
			pl->ent[k].src = (uint32_t)i;
			pl->ent[k].start0 = t->ndim ? t->start[0] : 0;
			pl->ent[k].end0 = t->ndim ? t->start[0] + t->extent[0] : 1;
			pl->ent[k].start1 = t->ndim > 1 ? t->start[1] : 0;
			pl->ent[k].end1 = t->ndim > 1 ? t->start[1] + t->extent[1] : 1;
			pl->ent[k].t = t;
			k++;
		}
	}
	pl->nent = k;
	ret = plan_sort(pl->ent, k, sizeof(*pl->ent), ent_cmp, "the producers' index", err, errlen);
	if (ret < 0)
		goto err;
	for (size_t i = 0; i < k;) {
		struct name_info *ni = &pl->names[pl->ent[i].name];
		const struct wex_tensor *first = pl->ent[i].t;
		size_t j = i;

		ni->lo = i;
		ni->maxext0 = 0;
		/* The piece cut_piece checks a consumer's dtype and shape
		 * against: the name compared is in the same lines. */
		ni->name = first->name;
		for (; j < k && pl->ent[j].name == pl->ent[i].name; j++) {
			const struct wex_tensor *t = pl->ent[j].t;
			uint64_t e0 = t->ndim ? t->extent[0] : 1;

			plan_tick(j);
			/* All producers must agree on what the canonical tensor is. */
			if (t->dtype != first->dtype || t->ndim != first->ndim ||
			    memcmp(t->shape, first->shape, t->ndim * sizeof(uint64_t))) {
				seterr(err, errlen, "producer pieces of %.*s disagree on dtype or shape",
				       WEX_NAME_MAX, t->name);
				ret = -WEX_ELAYOUT;
				goto err;
			}
			if (e0 > ni->maxext0)
				ni->maxext0 = e0;
		}
		ni->hi = j;
		i = j;
	}
	*out = pl;
	return 0;
err:
	if (ret == -ENOMEM)
		seterr(err, errlen, "out of memory");
	wex__planner_free(pl);
	return ret;
}

void wex__planner_free(struct wex_planner *pl)
{
	if (!pl)
		return;
	free(pl->ent);
	free(pl->names);
	free(pl->ntab);
	free(pl->load);
	free(pl->stamp);
	free(pl->hsingle);
	free(pl->hs);
	free(pl->htab);
	free(pl->hmem);
	if (pl->w) {
		free(pl->w->cells);
		free(pl->w->cands);
		free(pl->w->hits);
		free(pl->w->bp);
		free(pl->w->act);
		free(pl->w->order);
		free(pl->w);
	}
	free(pl);
}

/*
 * The ops of a large planner call (DeepSeek-V3 to 16 vLLM ranks: 6.5 MB)
 * are new memory each call, and a first write to a 4 KiB page is slow in a
 * virtual machine (wex_mem_map_anon says how slow).  A call whose ops take
 * 2 MiB or more (a group, or one plan that large) puts every plan's ops in
 * one block of huge pages; smaller calls, and any call whose block cannot
 * be mapped, malloc an array per plan and prefault it.
 */
#define OPS_BLOCK_MIN (2u << 20)

struct wex_ops_block {
	atomic_uint refs; /* plans whose ops lie here */
	void *map;
	size_t maplen;
};

/* Faulting in a block for millions of ops takes seconds where memory is
 * short: it is done in steps, ticking between them. */
#define POPULATE_STEP ((size_t)8 << 20)

/* A block of at least `len` bytes (len >= OPS_BLOCK_MIN) in huge pages,
 * faulted in, with no references yet.  NULL when out of memory. */
static struct wex_ops_block *ops_block_new(size_t len)
{
	struct wex_ops_block *b = calloc(1, sizeof(*b));
	size_t maplen = (len + OPS_BLOCK_MIN - 1) & ~(size_t)(OPS_BLOCK_MIN - 1);

	if (!b)
		return NULL;
	b->map = wex_mem_map_anon(maplen, 0);
	if (b->map == MAP_FAILED) {
		free(b);
		return NULL;
	}
	for (size_t at = 0; at < maplen; at += POPULATE_STEP) {
		(void)wex_mem_populate((char *)b->map + at,
				       maplen - at < POPULATE_STEP ? maplen - at : POPULATE_STEP, 1);
		plan_tick(0);
	}
	b->maplen = maplen;
	atomic_init(&b->refs, 0);
	return b;
}

static void ops_block_put(struct wex_ops_block *b)
{
	if (b && atomic_fetch_sub(&b->refs, 1) == 1) {
		munmap(b->map, b->maplen);
		free(b);
	}
}

/* Room for one more op in p->ops (capacity *cap).  A plan in a block that
 * outgrows its share (more ops than cells: outer dims split) moves to an
 * array of its own. */
static int ops_grow(struct wex_plan *p, size_t *cap)
{
	struct wex_plan_op *n;
	size_t c;

	if (p->nops + 1 <= *cap)
		return 0;
	if (!p->block)
		return grow_slow((void **)&p->ops, cap, p->nops + 1, sizeof(*p->ops));
	c = *cap * 2 > 64 ? *cap * 2 : 64;
	n = malloc(c * sizeof(*n));
	if (!n)
		return -ENOMEM;
	memcpy(n, p->ops, p->nops * sizeof(*n));
	ops_block_put(p->block);
	p->block = NULL;
	p->ops = n;
	*cap = c;
	return 0;
}

void wex__plan_free(struct wex_plan *p)
{
	if (!p)
		return;
	if (p->block)
		ops_block_put(p->block);
	else
		free(p->ops);
	free(p);
}

#define HSET_NONE UINT32_MAX

/* Adds `bytes` of demand for the set of producer ranks in c[0..n); *set is
 * the set's index in pl->hs, HSET_NONE when it is not tracked. */
static int hset_add(struct wex_planner *pl, const struct cand *c, uint32_t n, uint64_t bytes,
		    uint32_t *set)
{
	uint32_t m[64];
	uint64_t h = FNV0;

	*set = HSET_NONE;
	/* Too many holders to track: not tracked at all (a subset, with the
	 * whole demand spread over fewer ranks, gave a bound above the true
	 * one); the total bound still holds. */
	if (n > 64)
		return 0;
	/* Most cells have one holder: its set is found without hashing. */
	if (n == 1 && pl->hsingle[c[0].src]) {
		*set = pl->hsingle[c[0].src] - 1;
		pl->hs[*set].demand += bytes;
		return 0;
	}
	for (uint32_t i = 0; i < n; i++) {
		uint32_t v = c[i].src, j = i;

		/* Insertion sort: the same set must hash the same. */
		for (; j > 0 && m[j - 1] > v; j--)
			m[j] = m[j - 1];
		m[j] = v;
	}
	for (uint32_t i = 0; i < n; i++) {
		h ^= m[i];
		h *= 0x9e3779b97f4a7c15ull;
		h ^= h >> 29;
	}
	if (pl->nhs * 2 + 2 > pl->htab_mask) {
		size_t nt = pl->htab_mask ? (pl->htab_mask + 1) * 2 : 1024;
		uint32_t *t = calloc(nt, sizeof(uint32_t));

		if (!t)
			return -ENOMEM;
		for (size_t i = 0; i < pl->nhs; i++) {
			size_t s = pl->hs[i].hash & (nt - 1);

			while (t[s])
				s = (s + 1) & (nt - 1);
			t[s] = (uint32_t)i + 1;
		}
		free(pl->htab);
		pl->htab = t;
		pl->htab_mask = nt - 1;
	}
	size_t s = h & pl->htab_mask;
	for (; pl->htab[s]; s = (s + 1) & pl->htab_mask) {
		struct hset *e = &pl->hs[pl->htab[s] - 1];

		if (e->hash == h && e->n == n && !memcmp(&pl->hmem[e->off], m, n * sizeof(uint32_t))) {
			e->demand += bytes;
			*set = pl->htab[s] - 1;
			return 0;
		}
	}
	if (grow((void **)&pl->hs, &pl->caphs, pl->nhs + 1, sizeof(*pl->hs)) ||
	    grow((void **)&pl->hmem, &pl->caphmem, pl->nhmem + n, sizeof(uint32_t)))
		return -ENOMEM;
	memcpy(&pl->hmem[pl->nhmem], m, n * sizeof(uint32_t));
	pl->hs[pl->nhs] = (struct hset){ .hash = h, .off = (uint32_t)pl->nhmem, .n = n, .demand = bytes };
	pl->nhmem += n;
	*set = (uint32_t)pl->nhs;
	if (n == 1)
		pl->hsingle[m[0]] = *set + 1;
	pl->htab[s] = (uint32_t)++pl->nhs;
	return 0;
}

/* Cuts dst piece `di` into cells by the boundaries of the sources touching
 * it and appends them (with their candidates) to w. */
/* Whether a candidate's memory is on the consumer's device. */
static int cand_near(const struct wex_planner *pl, const struct cand *cd)
{
	const struct wex_plan_src *s = &pl->srcs[cd->src];

	if (s->near_seg)
		return cd->t->segment < s->nnear_seg && s->near_seg[cd->t->segment];
	return s->near;
}

/* Whether source entry e holds cell c (whose first coordinates are c0, c1). */
static inline int cell_in(const struct src_entry *e, const struct cell *c, uint64_t c0, uint64_t c1)
{
	const struct wex_tensor *s = e->t;
	int in = c0 >= e->start0 && c0 < e->end0 && c1 >= e->start1 && c1 < e->end1;

	for (uint32_t k = 2; k < c->ndim && in; k++)
		if (c->start[k] < s->start[k] || c->start[k] >= s->start[k] + s->extent[k])
			in = 0;
	return in;
}

static int u64_cmp(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

/* Adds n steps to this plan's work: -WEX_ELAYOUT, with err naming the
 * tensor, past PLAN_STEPS_MAX; -ECANCELED once the thread's stop flag is
 * set. */
static int plan_steps(struct work *w, uint64_t n, const struct wex_tensor *d, size_t nhit,
		      char *err, size_t errlen)
{
	plan_tick(0);
	if (plan_stopped(d->name, err, errlen))
		return -ECANCELED;
	if (n <= PLAN_STEPS_MAX - w->steps) {
		w->steps += n;
		return 0;
	}
	seterr(err, errlen, "%.*s: refused: planning it takes over %llu steps, the most one plan "
	       "may take (its %zu producer pieces overlapping this consumer piece, each checked "
	       "against each cell they cut it into: %llu steps, with %llu taken before); no "
	       "real layout comes near that, and a plan that large would hold up wexd",
	       WEX_NAME_MAX, d->name, (unsigned long long)PLAN_STEPS_MAX, nhit,
	       (unsigned long long)n, (unsigned long long)w->steps);
	return -WEX_ELAYOUT;
}

/* The hits over dim-0 coordinate x (of a walk whose x only grows), in
 * act[0, nact) on entry, on return in act[0, result): those that end
 * past x, then those of hits[*next...] that start by x, in hits' order
 * (hits come by start0). */
static size_t slab_hits(const struct src_entry *const *hits, size_t nhit, size_t *act, size_t nact,
			size_t *next, uint64_t x)
{
	size_t m = 0;

	for (size_t i = 0; i < nact; i++)
		if (hits[act[i]]->end0 > x)
			act[m++] = act[i];
	for (; *next < nhit && hits[*next]->start0 <= x; (*next)++)
		if (hits[*next]->end0 > x)
			act[m++] = *next;
	return m;
}

/* `h` is name_hash(d->name). */
static int cut_piece(struct wex_planner *pl, struct work *w, const struct wex_tensor *d, uint32_t di,
		     uint32_t plan, uint64_t h, uint64_t *nbytes, char *err, size_t errlen)
{
	long id = name_find(pl, d->name, h);
	uint32_t nd = d->ndim;
	uint64_t d0 = nd ? d->start[0] : 0, d1 = nd ? d->start[0] + d->extent[0] : 1;
	size_t esz = wex_dtype_size(d->dtype);
	size_t lo, hi, first_hit;
	uint64_t *bp[MAXD] = { 0 };
	size_t nbp[MAXD] = { 0 };
	size_t nhit = 0;
	const struct src_entry **hits = NULL;
	uint64_t *bpbuf;
	int ret;

	ret = check_piece(d, "consumer", err, errlen);
	if (ret < 0)
		return ret;
	/* wex_tensor_nbytes(d), from the box and dtype already checked. */
	uint64_t nel = box_elems(d);

	*nbytes = nel * esz;
	if (nel == 0)
		return 0;
	if (id < 0) {
		seterr(err, errlen, "no producer holds %.*s", WEX_NAME_MAX, d->name);
		return -WEX_ELAYOUT;
	}
	const struct name_info *ni = &pl->names[id];
	const struct wex_tensor *ref = pl->ent[ni->lo].t;
	if (ref->dtype != d->dtype || ref->ndim != nd ||
	    memcmp(ref->shape, d->shape, nd * sizeof(uint64_t))) {
		char cs[128], ps[128];

		seterr(err, errlen, "%.*s: consumer has %s, producer %s (element type and full shape must match)",
		       WEX_NAME_MAX, d->name, dtype_shape(d, cs, sizeof(cs)),
		       dtype_shape(ref, ps, sizeof(ps)));
		return -WEX_ELAYOUT;
	}
	/* Entries whose start0 <= d0 - maxext0 end before d0: skip them. */
	lo = ni->lo;
	hi = ni->hi;
	{
		uint64_t key = d0 >= ni->maxext0 ? d0 - ni->maxext0 + 1 : 0;
		size_t a = lo, b = hi;

		while (a < b) {
			size_t m = a + (b - a) / 2;

			if (pl->ent[m].start0 < key)
				a = m + 1;
			else
				b = m;
		}
		first_hit = a;
	}
	uint64_t ds1 = nd > 1 ? d->start[1] : 0, de1 = nd > 1 ? d->start[1] + d->extent[1] : 1;
	uint64_t scanned = 0;
	for (size_t i = first_hit; i < hi && pl->ent[i].start0 < d1; i++, scanned++) {
		const struct src_entry *e = &pl->ent[i];
		int ok = e->end0 > d0 && e->start1 < de1 && e->end1 > ds1 && e->end0 > e->start0 &&
			 e->end1 > e->start1;

		for (uint32_t k = 2; k < nd && ok; k++) {
			const struct wex_tensor *s = e->t;

			if (s->start[k] >= d->start[k] + d->extent[k] ||
			    s->start[k] + s->extent[k] <= d->start[k] || s->extent[k] == 0)
				ok = 0;
		}
		if (!ok)
			continue;
		if (grow((void **)&w->hits, &w->caphits, nhit + 1, sizeof(*w->hits))) {
			ret = -ENOMEM;
			goto out;
		}
		w->hits[nhit++] = e;
	}
	hits = w->hits;
	if (nhit == 0) {
		seterr(err, errlen, "no producer holds any element of %.*s", WEX_NAME_MAX, d->name);
		ret = -WEX_ELAYOUT;
		goto out;
	}
	/* Grid boundaries per dim, clipped to the consumer box. */
	if ((ret = plan_steps(w, scanned + (uint64_t)nd * (2 * nhit + 2), d, nhit, err, errlen)) < 0)
		goto out;
	if (grow((void **)&w->bp, &w->capbp, (size_t)nd * (2 * nhit + 2) + 1, sizeof(uint64_t))) {
		ret = -ENOMEM;
		goto out;
	}
	bpbuf = w->bp;
	for (uint32_t k = 0; k < nd; k++) {
		uint64_t a = d->start[k], b = a + d->extent[k];

		bp[k] = bpbuf + (size_t)k * (2 * nhit + 2);
		bp[k][nbp[k]++] = a;
		bp[k][nbp[k]++] = b;
		for (size_t i = 0; i < nhit; i++) {
			const struct src_entry *e = hits[i];
			uint64_t x = k == 0 ? e->start0 : k == 1 ? e->start1 : e->t->start[k];
			uint64_t y = k == 0 ? e->end0 : k == 1 ? e->end1 : x + e->t->extent[k];

			if (x > a && x < b)
				bp[k][nbp[k]++] = x;
			if (y > a && y < b)
				bp[k][nbp[k]++] = y;
		}
		/* Few boundaries: insertion sort (many, from a producer's table
		 * of many pieces of one tensor, took quadratic time). */
		if (nbp[k] > 64)
			qsort(bp[k], nbp[k], sizeof(uint64_t), u64_cmp);
		for (size_t i = 1; i < nbp[k]; i++) {
			uint64_t x = bp[k][i];
			size_t j = i;

			for (; j > 0 && bp[k][j - 1] > x; j--)
				bp[k][j] = bp[k][j - 1];
			bp[k][j] = x;
		}
		size_t u = 1;
		for (size_t i = 1; i < nbp[k]; i++)
			if (bp[k][i] != bp[k][u - 1])
				bp[k][u++] = bp[k][i];
		nbp[k] = u;
	}
	/* No boundary inside the box: one cell, which every hit holds whole. */
	int one = 1;
	uint64_t slab_cells = 1; /* cells per dim-0 slab */
	for (uint32_t k = 0; k < nd; k++) {
		if (nbp[k] != 2)
			one = 0;
		if (k && __builtin_mul_overflow(slab_cells, (uint64_t)(nbp[k] - 1), &slab_cells))
			slab_cells = UINT64_MAX;
	}
	/* The cells of one dim-0 slab check only the hits over it (checking
	 * every hit for every cell, the whole of a tensor over 4096 FSDP
	 * chunks took 4096^2 steps); in hits' order, so a cell's candidates
	 * are the same.  The steps that takes are counted first: a plan past
	 * the bound is refused before its walk. */
	if (grow((void **)&w->act, &w->capact, nhit, sizeof(*w->act))) {
		ret = -ENOMEM;
		goto out;
	}
	size_t *act = w->act, nact = 0, next = 0, nslab = nd ? nbp[0] - 1 : 1;
	uint64_t walk = nslab, slab = 0;
	for (size_t i = 0; i < nslab && walk != UINT64_MAX; i++) {
		uint64_t x;

		nact = slab_hits(hits, nhit, act, nact, &next, nd ? bp[0][i] : 0);
		if (__builtin_mul_overflow(slab_cells, (uint64_t)nact + 1, &x) ||
		    __builtin_add_overflow(walk, x, &walk))
			walk = UINT64_MAX;
	}
	if ((ret = plan_steps(w, walk, d, nhit, err, errlen)) < 0)
		goto out;
	uint64_t ncells;
	if (__builtin_mul_overflow(slab_cells, (uint64_t)nslab, &ncells))
		ncells = UINT64_MAX;
	uint64_t allow = PLAN_CELLS_MAX + PLAN_CELLS_PER_HIT * (w->nhits_plan + nhit);
	if (ncells > allow - w->ncells_plan) {
		seterr(err, errlen, "%.*s: refused: its %zu producer pieces cut it into %s%llu cells, "
		       "past the %llu this plan may have (2^22 and %d a producer piece over "
		       "a consumer piece; %llu taken before); no real layout comes near that, "
		       "and wexd would hold them all in memory",
		       WEX_NAME_MAX, d->name, nhit, ncells == UINT64_MAX ? "over " : "",
		       (unsigned long long)ncells, (unsigned long long)allow, PLAN_CELLS_PER_HIT,
		       (unsigned long long)w->ncells_plan);
		ret = -WEX_ELAYOUT;
		goto out;
	}
	w->ncells_plan += ncells;
	w->nhits_plan += nhit;
	nact = next = 0;
	int in_slab = 0;
	uint64_t tie = name_tie(d->name);
	/* Walk the grid cells in C order. */
	size_t idx[MAXD] = { 0 };
	for (;;) {
		struct cell c = { .dst = di, .ndim = nd, .plan = plan, .chosen = -1, .nh = tie };
		uint64_t elems = 1;

		for (uint32_t k = 0; k < nd; k++) {
			c.start[k] = bp[k][idx[k]];
			c.ext[k] = bp[k][idx[k] + 1] - c.start[k];
			elems *= c.ext[k];
		}
		c.bytes = elems * esz;
		c.cand_off = (uint32_t)w->ncands;
		uint64_t c0 = nd ? c.start[0] : 0, c1 = nd > 1 ? c.start[1] : 0;

		if (!in_slab || c0 != slab) {
			nact = slab_hits(hits, nhit, act, nact, &next, c0);
			slab = c0;
			in_slab = 1;
		}
		pl->serial++;
		for (size_t j = 0; j < nact; j++) {
			const struct src_entry *e = hits[act[j]];
			const struct wex_tensor *s = e->t;
			int in;

			/* One candidate per producer rank (a rank holding an element
			 * twice adds no bandwidth): a rank listed is not checked. */
			if (pl->stamp[e->src] == pl->serial)
				continue;
			in = one || cell_in(e, &c, c0, c1);
			assert(in == cell_in(e, &c, c0, c1));
			if (!in)
				continue;
			pl->stamp[e->src] = pl->serial;
			if (grow((void **)&w->cands, &w->capcands, w->ncands + 1, sizeof(struct cand))) {
				ret = -ENOMEM;
				goto out;
			}
			w->cands[w->ncands++] = (struct cand){ e->src, s };
		}
		c.ncand = (uint32_t)(w->ncands - c.cand_off);
		if (c.ncand > 1 && pl->any_near) {
			/* Holders on the consumer's own device first: a copy
			 * there reads local memory instead of crossing a link. */
			uint32_t nnear = 0;

			for (uint32_t i = 0; i < c.ncand; i++)
				if (cand_near(pl, &w->cands[c.cand_off + i]))
					w->cands[c.cand_off + nnear++] = w->cands[c.cand_off + i];
			if (nnear) {
				c.ncand = nnear;
				w->ncands = c.cand_off + nnear;
			}
		}
		if (c.ncand == 0) {
			char where[256];
			int n = 0;

			for (uint32_t k = 0; k < nd && n < 200; k++)
				n += snprintf(where + n, sizeof(where) - (size_t)n, "%s%llu", k ? "," : "",
					      (unsigned long long)c.start[k]);
			where[n < 256 ? n : 255] = 0;
			seterr(err, errlen, "element [%s] of %.*s has no producer", where, WEX_NAME_MAX,
			       d->name);
			ret = -WEX_ELAYOUT;
			goto out;
		}
		if (grow((void **)&w->cells, &w->capcells, w->ncells + 1, sizeof(struct cell))) {
			ret = -ENOMEM;
			goto out;
		}
		w->cells[w->ncells++] = c;
		plan_tick(w->ncells);
		int k = (int)nd - 1;
		for (; k >= 0; k--) {
			if (++idx[k] + 1 < nbp[k])
				break;
			idx[k] = 0;
		}
		if (k < 0)
			break;
	}
	ret = 0;
out:
	return ret;
}

/* Splits cell ci into k chunks along its outermost dim with extent >= k
 * (appending the extra chunks at the end of w->cells). */
static int split_cell(struct work *w, size_t ci, uint32_t k)
{
	struct cell c = w->cells[ci];
	int dim = -1;

	for (uint32_t i = 0; i < c.ndim; i++)
		if (c.ext[i] >= k) {
			dim = (int)i;
			break;
		}
	if (dim < 0 || k < 2)
		return 0;
	uint64_t e = c.ext[dim], inner = c.bytes / e;
	for (uint32_t j = 0; j < k; j++) {
		uint64_t a = e * j / k, b = e * (j + 1) / k;
		struct cell n = c;

		n.start[dim] = c.start[dim] + a;
		n.ext[dim] = b - a;
		n.bytes = inner * (b - a);
		if (j == 0) {
			w->cells[ci] = n;
			continue;
		}
		if (grow((void **)&w->cells, &w->capcells, w->ncells + 1, sizeof(struct cell)))
			return -ENOMEM;
		w->cells[w->ncells++] = n;
	}
	return 0;
}

struct dimv {
	uint64_t n;
	int64_t ss, ds; /* byte strides */
};

static int push_op(struct wex_plan *p, size_t *cap, const struct wex_plan_op *op)
{
	/* Fuse with the previous op when the two continue each other. */
	if (p->nops) {
		struct wex_plan_op *q = &p->ops[p->nops - 1];

		if (q->src_rank == op->src_rank && q->src_seg == op->src_seg &&
		    q->dst_piece == op->dst_piece && q->nouter == op->nouter) {
			int same = 1;

			for (uint32_t i = 0; i < op->nouter; i++)
				if (q->count[i] != op->count[i] || q->src_stride[i] != op->src_stride[i] ||
				    q->dst_stride[i] != op->dst_stride[i])
					same = 0;
			/* Side by side along the contiguous run (same rows). */
			if (same && q->src_off + q->len == op->src_off &&
			    q->dst_off + q->len == op->dst_off) {
				q->len += op->len;
				return 0;
			}
			/* One after the other along the outermost dim (the
			 * last: ops list them innermost first). */
			if (op->nouter > 0 && q->len == op->len) {
				uint32_t l = op->nouter - 1;
				int inner_same = 1;

				for (uint32_t i = 0; i < l; i++)
					if (q->count[i] != op->count[i] ||
					    q->src_stride[i] != op->src_stride[i] ||
					    q->dst_stride[i] != op->dst_stride[i])
						inner_same = 0;
				if (inner_same && q->src_stride[l] == op->src_stride[l] &&
				    q->dst_stride[l] == op->dst_stride[l] &&
				    q->src_off + q->count[l] * (uint64_t)q->src_stride[l] == op->src_off &&
				    q->dst_off + q->count[l] * (uint64_t)q->dst_stride[l] == op->dst_off) {
					q->count[l] += op->count[l];
					return 0;
				}
			}
		}
	}
	if (ops_grow(p, cap))
		return -ENOMEM;
	p->ops[p->nops++] = *op;
	return 0;
}

/* Emits the copies for one cell taken from source piece s. */
static int emit_cell(struct wex_plan *p, size_t *cap, const struct cell *c, const struct cand *cd,
		     const struct wex_tensor *d)
{
	const struct wex_tensor *s = cd->t;
	int64_t ss[MAXD], ds[MAXD];
	int64_t esz = (int64_t)wex_dtype_size(d->dtype);
	uint64_t soff = s->offset, doff = 0;
	struct dimv v[MAXD];
	int nv = 0;
	uint64_t len = (uint64_t)esz;

	tensor_strides(s, ss);
	tensor_strides(d, ds);
	for (uint32_t k = 0; k < c->ndim; k++) {
		soff += (c->start[k] - s->start[k]) * (uint64_t)ss[k] * (uint64_t)esz;
		doff += (c->start[k] - d->start[k]) * (uint64_t)ds[k] * (uint64_t)esz;
	}
	/* Dims innermost first, dropping extent-1 dims. */
	for (int k = (int)c->ndim - 1; k >= 0; k--)
		if (c->ext[k] > 1)
			v[nv++] = (struct dimv){ c->ext[k], ss[k] * esz, ds[k] * esz };
	/* Absorb dims that are contiguous on both sides into the run. */
	int i = 0;
	while (i < nv && v[i].ss == (int64_t)len && v[i].ds == (int64_t)len) {
		len *= v[i].n;
		i++;
	}
	/* Merge neighbouring outer dims that tile each other. */
	struct dimv o[MAXD];
	int no = 0;
	for (; i < nv; i++) {
		int64_t sx, dx;

		/* (Strides need not grow outward: an inner dim's whole span
		 * may pass int64, a consumer's [2, 2] with strides (1, 2^60)
		 * of 4-byte elements.) */
		if (no && !__builtin_mul_overflow(o[no - 1].ss, (int64_t)o[no - 1].n, &sx) &&
		    !__builtin_mul_overflow(o[no - 1].ds, (int64_t)o[no - 1].n, &dx) &&
		    v[i].ss == sx && v[i].ds == dx) {
			o[no - 1].n *= v[i].n;
			continue;
		}
		o[no++] = v[i];
	}
	/* o[] is innermost first; ops keep up to 3 outer dims, innermost first
	 * too (count[0] is the dim the executors walk fastest and the CUDA
	 * one's 2D/3D copies take as the pitch).  Further dims are split into
	 * separate ops. */
	int keep = no < 3 ? no : 3;
	int extra = no - keep;
	uint64_t it[MAXD] = { 0 };
	for (;;) {
		struct wex_plan_op op = {
			.src_rank = 0, .src_seg = s->segment, .src_off = soff, .dst_piece = c->dst,
			.nouter = (uint32_t)keep, .dst_off = doff, .len = len,
		};
		for (int e = 0; e < extra; e++) {
			op.src_off += it[e] * (uint64_t)o[keep + e].ss;
			op.dst_off += it[e] * (uint64_t)o[keep + e].ds;
		}
		for (int k = 0; k < keep; k++) {
			op.count[k] = o[k].n;
			op.src_stride[k] = o[k].ss;
			op.dst_stride[k] = o[k].ds;
		}
		/* An index into srcs[] until the plan is finished. */
		op.src_rank = (uint32_t)cd->src;
		if (push_op(p, cap, &op))
			return -ENOMEM;
		int e = 0;
		for (; e < extra; e++) {
			if (++it[e] < o[keep + e].n)
				break;
			it[e] = 0;
		}
		if (e == extra)
			break;
	}
	return 0;
}

/* Word-wise hash: plans have millions of ops, byte-wise FNV is too slow. */
static uint64_t hwords(uint64_t h, const uint64_t *w, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		h ^= w[i];
		h *= 0x9e3779b97f4a7c15ull;
		h ^= h >> 29;
	}
	return h;
}

static uint64_t plan_hash(const struct wex_plan *p)
{
	uint64_t h = FNV0;

	/* hwords() over the op's 16 fields, unrolled: no array, no loop. */
#define HW(x) (h ^= (uint64_t)(x), h *= 0x9e3779b97f4a7c15ull, h ^= h >> 29)
	for (size_t i = 0; i < p->nops; i++) {
		const struct wex_plan_op *o = &p->ops[i];

		plan_tick(i);
		HW(o->src_rank);
		HW(o->src_seg);
		HW(o->src_off);
		HW(o->dst_piece);
		HW(o->nouter);
		HW(o->dst_off);
		HW(o->len);
		HW(o->count[0]);
		HW(o->count[1]);
		HW(o->count[2]);
		HW(o->src_stride[0]);
		HW(o->src_stride[1]);
		HW(o->src_stride[2]);
		HW(o->dst_stride[0]);
		HW(o->dst_stride[1]);
		HW(o->dst_stride[2]);
	}
#undef HW
	return h;
}

uint64_t wex__pieces_hash(const struct wex_tensor *t, size_t n)
{
	uint64_t h = FNV0;

	for (size_t i = 0; i < n; i++) {
		uint64_t f[2 + 4 * MAXD + 2];
		size_t k = 0;

		h = fnv(h, t[i].name, strnlen(t[i].name, WEX_NAME_MAX));
		f[k++] = (uint64_t)t[i].dtype;
		f[k++] = t[i].ndim;
		for (uint32_t d = 0; d < t[i].ndim && d < MAXD; d++) {
			f[k++] = t[i].shape[d];
			f[k++] = t[i].start[d];
			f[k++] = t[i].extent[d];
			f[k++] = (uint64_t)t[i].strides[d];
		}
		f[k++] = t[i].segment;
		f[k++] = t[i].offset;
		h = hwords(h, f, k);
	}
	return h;
}

static uint64_t cell_hash(const struct cell *c)
{
	uint64_t h = c->nh;

	for (uint32_t k = 0; k < c->ndim; k++)
		h = mix64(h ^ c->start[k]);
	return h;
}

static int cell_bytes_desc(const void *a, const void *b)
{
	const struct cell *x = *(struct cell *const *)a, *y = *(struct cell *const *)b;

	cmp_tick();
	if (x->bytes != y->bytes)
		return x->bytes > y->bytes ? -1 : 1;
	return x < y ? -1 : x > y;
}

static int cell_order(const void *a, const void *b)
{
	const struct cell *x = a, *y = b;

	cmp_tick();
	if (x->plan != y->plan)
		return x->plan < y->plan ? -1 : 1;
	if (x->dst != y->dst)
		return x->dst < y->dst ? -1 : 1;
	for (uint32_t k = 0; k < x->ndim; k++)
		if (x->start[k] != y->start[k])
			return x->start[k] < y->start[k] ? -1 : 1;
	return 0;
}

/* Shared body: `group` selects least-loaded choice; otherwise rotation. */
static int plan_many(struct wex_planner *pl, const struct wex_plan_dst *dsts, size_t ndst,
		     uint32_t cworld, int group, struct wex_plan **out, char *err, size_t errlen)
{
	struct work w;
	struct wex_plan **plans = calloc(ndst ? ndst : 1, sizeof(*plans));
	size_t *caps = calloc(ndst ? ndst : 1, sizeof(size_t));
	uint64_t *pload = calloc(pl->nsrc ? pl->nsrc : 1, sizeof(uint64_t));
	struct cell **order = NULL;
	size_t n0 = 0; /* cells before splitting */
	int ret = -ENOMEM;

	if (!pl->w)
		pl->w = calloc(1, sizeof(*pl->w));
	if (!pl->w) {
		free(plans);
		free(caps);
		free(pload);
		seterr(err, errlen, "out of memory");
		return -ENOMEM;
	}
	/* Scratch arrays live in the planner: no page faults per call. */
	w = *pl->w;
	w.ncells = w.ncands = 0;
	if (!plans || !caps || !pload)
		goto out;
	for (size_t r = 0; r < ndst; r++) {
		/* The bound is each plan's: summed over a group call (wexctl
		 * plan, 64 consumer ranks at a time), it refused ranks that
		 * each take a fraction of it, naming whichever tensor crossed
		 * it. */
		w.steps = w.ncells_plan = w.nhits_plan = 0;
		plans[r] = calloc(1, sizeof(struct wex_plan));
		if (!plans[r])
			goto out;
		const struct wex_tensor *t = dsts[r].t;
		size_t n = dsts[r].n;
		uint64_t hr[NAME_RING];

		/* Piece j's name is hashed NAME_AHEAD pieces before it is cut,
		 * and each later stage fetches what the next one reads. */
		for (size_t j = 0; j < n + NAME_AHEAD; j++) {
			uint64_t nbytes = 0;
			size_t i;

			if (j < n) {
				hr[j % NAME_RING] = name_hash(pl, t[j].name);
				name_prefetch(pl, hr[j % NAME_RING], 0);
			}
			if (j >= NAME_AHEAD / 3 && j - NAME_AHEAD / 3 < n)
				name_prefetch(pl, hr[(j - NAME_AHEAD / 3) % NAME_RING], 1);
			if (j >= 2 * NAME_AHEAD / 3 && j - 2 * NAME_AHEAD / 3 < n)
				name_prefetch(pl, hr[(j - 2 * NAME_AHEAD / 3) % NAME_RING], 2);
			if (j < NAME_AHEAD)
				continue;
			i = j - NAME_AHEAD;
			ret = cut_piece(pl, &w, &t[i], (uint32_t)i, (uint32_t)r, hr[i % NAME_RING],
					&nbytes, err, errlen);
			if (ret < 0)
				goto out;
			assert(nbytes == wex_tensor_nbytes(&t[i]));
			plans[r]->stats.bytes_needed += nbytes;
		}
	}
	if ((ret = plan_stopped("the holder sets", err, errlen)) < 0)
		goto out;
	/* Demand per holder set, for the lower bound (before splitting). */
	{
		const struct cand *pc = NULL;
		uint32_t pn = 0, pset = HSET_NONE;

		for (size_t i = 0; i < w.ncells; i++) {
			const struct cand *c = &w.cands[w.cells[i].cand_off];
			uint32_t n = w.cells[i].ncand, k = 0;

			plan_tick(i);
			/* Neighbouring cells often have the same holders, in the
			 * same order: the previous cell's set, without hashing. */
			if (n == pn && n > 1)
				while (k < n && c[k].src == pc[k].src)
					k++;
			if (n == pn && n > 1 && k == n) {
				if (pset != HSET_NONE)
					pl->hs[pset].demand += w.cells[i].bytes;
				continue;
			}
			ret = hset_add(pl, c, n, w.cells[i].bytes, &pset);
			if (ret < 0)
				goto out;
			pc = c;
			pn = n;
		}
	}
	/* Cells with several holders may be split so that each holder serves a
	 * part.  A group knows the bound its load must meet: greedy assignment
	 * ends within one chunk of it, so large cells are cut into chunks of
	 * at most 1/16 of the bound (never more chunks than holders).  A rank
	 * planned alone cannot see the others: with more holders than consumer
	 * ranks, its cells are cut so that each holder can serve a part, in
	 * chunks of at least SPLIT_MIN. */
	if ((ret = plan_stopped("the split", err, errlen)) < 0)
		goto out;
	{
		uint32_t ranks = cworld ? cworld : 1;
		uint64_t gran = 0;

		n0 = w.ncells;

		if (group) {
			struct wex_plan_stats bs;
			uint64_t total = 0;

			for (size_t i = 0; i < n0; i++)
				total += w.cells[i].bytes;
			for (size_t i = 0; i < pl->nsrc; i++)
				total += pl->load[i];
			wex__planner_stats(pl, &bs);
			gran = bs.src_bound_bytes;
			if (pl->nsrc && total / pl->nsrc > gran)
				gran = total / pl->nsrc;
			gran /= 16;
		}
		if (gran < 65536)
			gran = 65536;
		for (size_t i = 0; i < n0; i++) {
			uint32_t nc = w.cells[i].ncand;
			uint64_t bytes = w.cells[i].bytes;
			uint32_t k;

			plan_tick(i);
			if (group) {
				uint64_t q = (bytes + gran - 1) / gran;

				k = q < nc ? (uint32_t)q : nc;
			} else {
				k = nc > ranks ? (nc + ranks - 1) / ranks : 1;
				/* Chunks under SPLIT_MIN are not worth their ops (64
				 * replicas cut a 128 KiB cell into 64 ops of 2 KiB);
				 * small cells (norms, biases) stay whole. */
				if (k > bytes / SPLIT_MIN)
					k = (uint32_t)(bytes / SPLIT_MIN);
				if (k < 1)
					k = 1;
			}
			if (k > 1) {
				ret = split_cell(&w, i, k);
				if (ret < 0)
					goto out;
			}
		}
	}
	{
		size_t nmulti = 0;

		if (grow((void **)&w.order, &w.caporder, w.ncells + 1, sizeof(*w.order))) {
			ret = -ENOMEM;
			goto out;
		}
		order = w.order;
		/* Exclusive cells first: they fix part of the load for sure. */
		for (size_t i = 0; i < w.ncells; i++) {
			struct cell *c = &w.cells[i];

			plan_tick(i);
			if (c->ncand == 1) {
				c->chosen = 0;
				pl->load[w.cands[c->cand_off].src] += c->bytes;
			} else {
				order[nmulti++] = c;
			}
		}
		/* Then large cells before small ones (LPT), each to the least
		 * loaded holder.  The load is the planner's, summed over every
		 * plan it built: a group, or ranks planned one by one on one
		 * planner, balance globally.  Ties rotate with the cell hash
		 * and, for ranks planned apart, with crank, so that planners
		 * that cannot see each other still spread. */
		ret = plan_sort(order, nmulti, sizeof(*order), cell_bytes_desc, "the balance", err,
				errlen);
		if (ret < 0)
			goto out;
		for (size_t i = 0; i < nmulti; i++) {
			struct cell *c = order[i];
			uint64_t h = cell_hash(c) +
				     (group ? 0 : dsts[c->plan].crank);
			const struct cand *cc = &w.cands[c->cand_off];
			uint32_t n = c->ncand, best = (uint32_t)(h % n);
			uint64_t bl = pl->load[cc[best].src];

			plan_tick(i);
			if (h <= UINT64_MAX - n) {
				/* Holders in the order (h + q) % n, counted without
				 * a division per holder. */
				for (uint32_t q = 1, j = best; q < n; q++) {
					if (++j == n)
						j = 0;
					if (pl->load[cc[j].src] < bl) {
						best = j;
						bl = pl->load[cc[j].src];
					}
				}
			} else {
				/* h + q wraps around 2^64: keep that order. */
				for (uint32_t q = 1; q < n; q++) {
					uint32_t j = (uint32_t)((q + h) % n);

					if (pl->load[cc[j].src] < bl) {
						best = j;
						bl = pl->load[cc[j].src];
					}
				}
			}
			c->chosen = (int32_t)best;
			pl->load[cc[best].src] += c->bytes;
		}
	}
	if ((ret = plan_stopped("the ops", err, errlen)) < 0)
		goto out;
	/* Emit in a deterministic order: plan, piece, cell position.  Cells
	 * come out of cut_piece in this order; splitting keeps the first chunk
	 * in place and appends the others, so only those are sorted and the
	 * two runs merged (keys are unique: the order is the full sort's). */
	if (w.ncells > n0) { /* (none: w.cells may be NULL) */
		ret = plan_sort(w.cells + n0, w.ncells - n0, sizeof(*w.cells), cell_order, "the ops",
				err, errlen);
		if (ret < 0)
			goto out;
	}
	/* Ops arrays sized once, at one op per cell (fusing makes fewer,
	 * splitting outer dims more), instead of doubling from 64: caps[]
	 * counts each plan's cells first. */
	{
		size_t total = 0;

		for (size_t i = 0; i < w.ncells; i++)
			caps[w.cells[i].plan]++;
		/* A little room per plan for ops that split outer dims. */
		for (size_t r = 0; r < ndst; r++)
			if (caps[r])
				caps[r] += caps[r] / 16 + 8;
		for (size_t r = 0; r < ndst; r++)
			total += caps[r];
		struct wex_ops_block *b = NULL;

		if (total * sizeof(struct wex_plan_op) >= OPS_BLOCK_MIN)
			b = ops_block_new(total * sizeof(struct wex_plan_op));
		if (b) {
			struct wex_plan_op *o = b->map;

			for (size_t r = 0; r < ndst; r++) {
				if (!caps[r])
					continue;
				plans[r]->ops = o;
				plans[r]->block = b;
				atomic_fetch_add(&b->refs, 1);
				o += caps[r];
			}
		} else {
			for (size_t r = 0; r < ndst; r++) {
				size_t n = caps[r];

				caps[r] = 0;
				if (n && grow_slow((void **)&plans[r]->ops, &caps[r], n,
						   sizeof(struct wex_plan_op))) {
					ret = -ENOMEM;
					goto out;
				}
				if (n)
					(void)wex_mem_populate(plans[r]->ops,
							       caps[r] * sizeof(struct wex_plan_op), 1);
			}
		}
	}
#ifndef NDEBUG
	const struct cell *prev = NULL;
#endif
	for (size_t a = 0, b = n0; a < n0 || b < w.ncells;) {
		struct cell *c;

		plan_tick(a + b);
		if (b == w.ncells || (a < n0 && cell_order(&w.cells[a], &w.cells[b]) < 0))
			c = &w.cells[a++];
		else
			c = &w.cells[b++];
#ifndef NDEBUG
		/* Strictly increasing: the order a sort of all cells gives. */
		assert(!prev || cell_order(prev, c) < 0);
		prev = c;
#endif
		struct wex_plan *p = plans[c->plan];
		const struct cand *cd = &w.cands[c->cand_off + (uint32_t)c->chosen];

		ret = emit_cell(p, &caps[c->plan], c, cd, &dsts[c->plan].t[c->dst]);
		if (ret < 0)
			goto out;
		p->stats.bytes_moved += c->bytes;
		pload[cd->src] += c->bytes;
	}
	for (size_t r = 0; r < ndst; r++) {
		struct wex_plan *p = plans[r];

		/* Ops name producer ranks, not indices into srcs[]. */
		for (size_t i = 0; i < p->nops; i++) {
			uint32_t si = p->ops[i].src_rank;

			plan_tick(i);
			p->ops[i].src_rank = pl->srcs[si].rank;
		}
		p->stats.ops = p->nops;
		p->hash = plan_hash(p);
		pl->needed += p->stats.bytes_needed;
		pl->moved += p->stats.bytes_moved;
		pl->ops += p->nops;
	}
	/* Per-plan busiest source (for a single plan this is exact; for a
	 * group each plan reports the group's figures). */
	{
		struct wex_plan_stats st;
		uint64_t best = 0;
		uint32_t bi = 0;

		for (size_t i = 0; i < pl->nsrc; i++)
			if (pload[i] > best) {
				best = pload[i];
				bi = (uint32_t)i;
			}
		wex__planner_stats(pl, &st);
		for (size_t r = 0; r < ndst; r++) {
			plans[r]->stats.busiest_src_bytes = best;
			plans[r]->stats.busiest_src = pl->nsrc ? pl->srcs[bi].rank : 0;
			plans[r]->stats.src_bound_bytes = st.src_bound_bytes;
		}
	}
	for (size_t r = 0; r < ndst; r++)
		out[r] = plans[r];
	free(plans);
	plans = NULL;
	ret = 0;
out:
	if (plans)
		for (size_t r = 0; r < ndst; r++)
			wex__plan_free(plans[r]);
	free(plans);
	free(caps);
	free(pload);
	*pl->w = w;
	if (ret == -ENOMEM)
		seterr(err, errlen, "out of memory");
	return ret;
}

void wex__planner_stats(const struct wex_planner *pl, struct wex_plan_stats *st)
{
	uint64_t bound = 0, total = 0;

	memset(st, 0, sizeof(*st));
	st->bytes_needed = pl->needed;
	st->bytes_moved = pl->moved;
	st->ops = pl->ops;
	for (size_t i = 0; i < pl->nsrc; i++) {
		total += pl->load[i];
		if (pl->load[i] > st->busiest_src_bytes) {
			st->busiest_src_bytes = pl->load[i];
			st->busiest_src = pl->srcs[i].rank;
		}
	}
	/* Lower bounds: the total over all sources; for each holder set S,
	 * the demand that only S can serve (S itself plus the single-member
	 * sets inside it) spread evenly over S. */
	if (pl->nsrc)
		bound = (total + pl->nsrc - 1) / pl->nsrc;
	uint64_t *single = calloc(pl->nsrc ? pl->nsrc : 1, sizeof(uint64_t));
	for (size_t i = 0; i < pl->nhs; i++)
		if (pl->hs[i].n == 1 && single)
			single[pl->hmem[pl->hs[i].off]] += pl->hs[i].demand;
	for (size_t i = 0; i < pl->nhs; i++) {
		const struct hset *h = &pl->hs[i];
		uint64_t d = h->demand;

		if (h->n > 1 && single)
			for (uint32_t k = 0; k < h->n; k++)
				d += single[pl->hmem[h->off + k]];
		d = (d + h->n - 1) / h->n;
		if (d > bound)
			bound = d;
	}
	free(single);
	st->src_bound_bytes = bound;
}

int wex__planner_plan(struct wex_planner *pl, const struct wex_tensor *dst, size_t ndst,
		      uint32_t crank, uint32_t cworld, struct wex_plan **out, char *err,
		      size_t errlen)
{
	struct wex_plan_dst d = { .crank = crank, .t = dst, .n = ndst };

	return plan_many(pl, &d, 1, cworld, 0, out, err, errlen);
}

int wex__planner_plan_group(struct wex_planner *pl, const struct wex_plan_dst *dsts, size_t ndst,
			    uint32_t cworld, struct wex_plan **out, char *err, size_t errlen)
{
	return plan_many(pl, dsts, ndst, cworld, 1, out, err, errlen);
}

int wex__plan_build(const struct wex_plan_src *srcs, size_t nsrc, const struct wex_tensor *dst,
		    size_t ndst, uint32_t crank, uint32_t cworld, struct wex_plan **out, char *err,
		    size_t errlen)
{
	struct wex_planner *pl;
	struct wex_plan *p;
	int ret;

	ret = wex__planner_new(srcs, nsrc, &pl, err, errlen);
	if (ret < 0)
		return ret;
	ret = wex__planner_plan(pl, dst, ndst, crank, cworld, &p, err, errlen);
	if (ret == 0) {
		/* The bound of one rank's plan alone. */
		struct wex_plan_stats st;

		wex__planner_stats(pl, &st);
		p->stats.src_bound_bytes = st.src_bound_bytes;
		*out = p;
	}
	wex__planner_free(pl);
	return ret;
}
