/* SPDX-License-Identifier: MIT */
/*
 * verify.c - compares what a plan's copies wrote with where they read it
 * (verify.h).  Each op is cut into units: boxes of its rows of at most
 * unit_max bytes (a row longer than that is cut by bytes), so that
 * threads share large ops and a gathered unit fits its host buffer.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"
#include "verify.h"
#include "vmm/backend.h"
#include "wex.h"

#define MAX_THREADS 64

/* Bytes of one side of a unit; the gather buffers' size. */
static uint64_t unit_max = 64ull << 20;

/* Whether an address is GPU memory (the gather path copies only those
 * sides through the backend). */
static int (*gpu_of)(uint64_t addr) = wex_mem_ptr_on_gpu;

void wex__verify_where(int (*fn)(uint64_t addr))
{
	gpu_of = fn ? fn : wex_mem_ptr_on_gpu;
}

uint64_t wex__verify_unit(uint64_t bytes)
{
	uint64_t was = unit_max;

	unit_max = bytes ? bytes : was;
	return was;
}

struct unit {
	struct wex_copy_op u; /* absolute addresses, as the op's */
	size_t op;
};

struct units {
	struct unit *v;
	size_t n, cap;
};

uint64_t wex__ops_bytes(const struct wex_copy_op *ops, size_t n)
{
	uint64_t total = 0;

	for (size_t i = 0; i < n; i++) {
		uint64_t rows = 1;

		for (uint32_t k = 0; k < ops[i].nouter && k < 3; k++)
			rows *= ops[i].count[k];
		total += rows * ops[i].len;
	}
	return total;
}

static int push(struct units *v, const struct wex_copy_op *u, size_t op)
{
	if (v->n == v->cap) {
		size_t cap = v->cap ? v->cap * 2 : 64;
		struct unit *nv = realloc(v->v, cap * sizeof(*nv));

		if (!nv)
			return -ENOMEM;
		v->v = nv;
		v->cap = cap;
	}
	v->v[v->n].u = *u;
	v->v[v->n].op = op;
	v->n++;
	return 0;
}

/* Cuts op (already folded) into units of at most max bytes: dims below d
 * whole, dim d in runs of m, the dims above one index at a time; a row
 * longer than max in pieces of max bytes. */
static int cut(struct units *v, const struct wex_copy_op *op, size_t idx, uint64_t max)
{
	uint32_t nd = op->nouter > 3 ? 3 : op->nouter, d = 0;
	uint64_t c[3] = { 1, 1, 1 }, inner = op->len, outer = 1, m;
	int ret;

	for (uint32_t k = 0; k < nd; k++)
		c[k] = op->count[k];
	if (!op->len || !c[0] || !c[1] || !c[2])
		return 0;
	while (d < nd && inner <= max && c[d] <= max / inner)
		inner *= c[d++];
	if (d == nd && inner <= max)
		return push(v, op, idx);
	/* The units walk dims d+1.. one index at a time (all dims when a row
	 * is longer than max: then d is 0 and dim 0 too is walked). */
	int rowcut = inner > max;
	uint32_t from = rowcut ? 0 : d + 1;

	for (uint32_t k = from; k < nd; k++)
		outer *= c[k];
	m = rowcut ? 0 : max / inner;
	for (uint64_t o = 0; o < outer; o++) {
		struct wex_copy_op u = *op;
		uint64_t rest = o;

		for (uint32_t k = from; k < nd; k++) {
			uint64_t i = rest % c[k];

			rest /= c[k];
			u.src += (uint64_t)((int64_t)i * op->src_stride[k]);
			u.dst += (uint64_t)((int64_t)i * op->dst_stride[k]);
		}
		if (rowcut) {
			u.nouter = 0;
			for (uint64_t b = 0; b < op->len; b += max) {
				struct wex_copy_op p = u;

				p.src += b;
				p.dst += b;
				p.len = op->len - b < max ? op->len - b : max;
				if ((ret = push(v, &p, idx)) < 0)
					return ret;
			}
			continue;
		}
		u.nouter = d + 1;
		for (uint64_t a = 0; a < c[d]; a += m) {
			struct wex_copy_op p = u;

			p.src += (uint64_t)((int64_t)a * op->src_stride[d]);
			p.dst += (uint64_t)((int64_t)a * op->dst_stride[d]);
			p.count[d] = c[d] - a < m ? c[d] - a : m;
			if ((ret = push(v, &p, idx)) < 0)
				return ret;
		}
	}
	return 0;
}

static uint64_t unit_rows(const struct wex_copy_op *u)
{
	uint64_t r = 1;

	for (uint32_t k = 0; k < u->nouter; k++)
		r *= u->count[k];
	return r;
}

/* Byte offsets of row r of u from u.src and u.dst. */
static void row_at(const struct wex_copy_op *u, uint64_t r, int64_t *so, int64_t *dso)
{
	*so = *dso = 0;
	for (uint32_t k = 0; k < u->nouter; k++) {
		uint64_t i = r % u->count[k];

		r /= u->count[k];
		*so += (int64_t)i * u->src_stride[k];
		*dso += (int64_t)i * u->dst_stride[k];
	}
}

struct job {
	const struct units *units;
	const struct wex_copy_op *ops;
	uint64_t next; /* atomic: the next unit to compare */
	pthread_mutex_t lock;
	int found;
	int unpinned; /* a gather buffer could not be pinned */
	struct wex_verify_diff diff;
};

/* Notes `cnt` different bytes, the first of them at byte `col` of row r of
 * unit `un`. */
static void note(struct job *j, const struct unit *un, uint64_t r, uint64_t col, uint64_t cnt)
{
	const struct wex_copy_op *op = &j->ops[un->op];
	int64_t so, dso;
	uint64_t dst_off, src_off;

	row_at(&un->u, r, &so, &dso);
	dst_off = un->u.dst + (uint64_t)dso + col - op->dst;
	src_off = un->u.src + (uint64_t)so + col - op->src;
	pthread_mutex_lock(&j->lock);
	if (!j->found || un->op < j->diff.op ||
	    (un->op == j->diff.op && dst_off < j->diff.dst_off)) {
		j->diff.op = un->op;
		j->diff.dst_off = dst_off;
		j->diff.src_off = src_off;
	}
	j->found = 1;
	j->diff.bytes += cnt;
	pthread_mutex_unlock(&j->lock);
}

/* Bytes [col, col + len) of row r of a unit hold different bytes at a and
 * b: counts them and notes where the first is. */
static void row_differs(struct job *j, const struct unit *un, uint64_t r, uint64_t col,
			const unsigned char *a, const unsigned char *b, uint64_t len)
{
	uint64_t first = len, cnt = 0;

	for (uint64_t i = 0; i < len; i++) {
		if (a[i] == b[i])
			continue;
		if (first == len)
			first = i;
		cnt++;
	}
	if (cnt)
		note(j, un, r, col + first, cnt);
}

/*
 * Rows of SMALL_ELEM_MAX bytes at most (ops into transposed tensors: one
 * element a row) were a row_at (divisions) and a memcmp call each: 0.07
 * to 0.58 GB/s for 1- to 8-byte elements of a [4096, 8192] transpose on
 * the dev VM, against 18 to 21 GB/s of memcmp; 1.2 to 5.0 GB/s since
 * (tests/bench/verify_transpose).  As the host copy executor does
 * (vmm/host.c, copy_small), the rows are walked without dividing, up to
 * PANEL whole runs of count[0] rows at a time, a 32 x 32 block of
 * elements (16 x 16 for 16-byte elements) after another: each side's
 * block is read into a buffer along that side's contiguous dim, the
 * element at (k, b) of the block at the same place in both buffers, and
 * the buffers are compared a block row at a time.
 * Only a block row that differs is walked element by element (to note
 * each different row, as compare_unit does).
 */
#define SMALL_ELEM_MAX 16
#define PANEL 256

/*
 * CMP_LOOPS(N, TILE), for N-byte elements in TILE x TILE blocks:
 * tile_in_N: reads an na x nb block of N-byte elements, element (k, b)
 * at p + k * p0 + b * p1, into buf[k][b] (rows of TILE elements).
 * compare_tiles_N: compares n1 runs of n0 rows (run b's row k at s + b *
 * s1 + k * s0, and d + ...), which are rows `row` + b * n0 + k of unit un.
 * (Constant sizes: each element a load and a store.)
 */
#define CMP_LOOPS(N, TILE)                                                                      \
	static void tile_in_##N(unsigned char *buf, const unsigned char *p, int64_t p0,         \
				int64_t p1, uint64_t na, uint64_t nb)                           \
	{                                                                                       \
		if (p1 == N) { /* contiguous along the runs */                                  \
			for (uint64_t k = 0; k < na; k++)                                       \
				if (nb == TILE)                                                 \
					memcpy(buf + k * TILE * N, p + (int64_t)k * p0, TILE * N); \
				else                                                            \
					memcpy(buf + k * TILE * N, p + (int64_t)k * p0, nb * N); \
			return;                                                                 \
		}                                                                               \
		for (uint64_t b = 0; b < nb; b++)                                               \
			for (uint64_t k = 0; k < na; k++)                                       \
				memcpy(buf + (k * TILE + b) * N,                                \
				       p + (int64_t)b * p1 + (int64_t)k * p0, N);               \
	}                                                                                       \
                                                                                                \
	static void compare_tiles_##N(struct job *j, const struct unit *un,                     \
				      const unsigned char *s, const unsigned char *d, int64_t s0, \
				      int64_t s1, int64_t d0, int64_t d1, uint64_t n0,          \
				      uint64_t n1, uint64_t row)                                \
	{                                                                                       \
		unsigned char a[TILE * TILE * N], b[TILE * TILE * N];                           \
                                                                                                \
		for (uint64_t k0 = 0; k0 < n0; k0 += TILE)                                      \
			for (uint64_t b0 = 0; b0 < n1; b0 += TILE) {                            \
				uint64_t na = n0 - k0 < TILE ? n0 - k0 : TILE;                  \
				uint64_t nb = n1 - b0 < TILE ? n1 - b0 : TILE;                  \
                                                                                                \
				tile_in_##N(a, s + (int64_t)k0 * s0 + (int64_t)b0 * s1, s0, s1, \
					    na, nb);                                            \
				tile_in_##N(b, d + (int64_t)k0 * d0 + (int64_t)b0 * d1, d0, d1, \
					    na, nb);                                            \
				for (uint64_t k = 0; k < na; k++) {                             \
					const unsigned char *ak = a + k * TILE * N;             \
					const unsigned char *bk = b + k * TILE * N;             \
                                                                                                \
					if (nb == TILE ? !memcmp(ak, bk, TILE * N)              \
						       : !memcmp(ak, bk, nb * N))               \
						continue;                                       \
					for (uint64_t e = 0; e < nb; e++)                       \
						if (memcmp(ak + e * N, bk + e * N, N))          \
							row_differs(j, un,                      \
								    row + (b0 + e) * n0 + k0 + k, \
								    0, ak + e * N, bk + e * N, N); \
				}                                                               \
			}                                                                       \
	}
/* (16-byte elements in 16 x 16 blocks: the two buffers on the calling
 * thread's stack stay at 16 KiB at most, whatever thread compares.) */
CMP_LOOPS(1, 32)
CMP_LOOPS(2, 32)
CMP_LOOPS(4, 32)
CMP_LOOPS(8, 32)
CMP_LOOPS(16, 16)

static void compare_tiles(struct job *j, const struct unit *un, const unsigned char *s,
			  const unsigned char *d, int64_t s0, int64_t s1, int64_t d0, int64_t d1,
			  uint64_t n0, uint64_t n1, uint64_t row)
{
	uint64_t len = un->u.len;

	switch (len) {
	case 1:
		compare_tiles_1(j, un, s, d, s0, s1, d0, d1, n0, n1, row);
		return;
	case 2:
		compare_tiles_2(j, un, s, d, s0, s1, d0, d1, n0, n1, row);
		return;
	case 4:
		compare_tiles_4(j, un, s, d, s0, s1, d0, d1, n0, n1, row);
		return;
	case 8:
		compare_tiles_8(j, un, s, d, s0, s1, d0, d1, n0, n1, row);
		return;
	case 16:
		compare_tiles_16(j, un, s, d, s0, s1, d0, d1, n0, n1, row);
		return;
	}
	for (uint64_t b = 0; b < n1; b++)
		for (uint64_t k = 0; k < n0; k++) {
			const unsigned char *sp = s + (int64_t)b * s1 + (int64_t)k * s0;
			const unsigned char *dp = d + (int64_t)b * d1 + (int64_t)k * d0;

			if (memcmp(sp, dp, len))
				row_differs(j, un, row + b * n0 + k, 0, sp, dp, len);
		}
}

/* Compares every row of a unit: rows of small elements through tiles
 * (above), longer ones with a memcmp each, walked without dividing. */
static void compare_unit(struct job *j, const struct unit *un)
{
	const struct wex_copy_op *u = &un->u;
	const unsigned char *s = (const unsigned char *)(uintptr_t)u->src;
	const unsigned char *d = (const unsigned char *)(uintptr_t)u->dst;
	uint64_t c0 = u->nouter > 0 ? u->count[0] : 1, c1 = u->nouter > 1 ? u->count[1] : 1;
	uint64_t c2 = u->nouter > 2 ? u->count[2] : 1, row = 0; /* the next long row's */
	int64_t s0 = u->nouter > 0 ? u->src_stride[0] : 0, d0 = u->nouter > 0 ? u->dst_stride[0] : 0;
	int64_t s1 = u->nouter > 1 ? u->src_stride[1] : 0, d1 = u->nouter > 1 ? u->dst_stride[1] : 0;
	int64_t s2 = u->nouter > 2 ? u->src_stride[2] : 0, d2 = u->nouter > 2 ? u->dst_stride[2] : 0;

	for (uint64_t i2 = 0; i2 < c2; i2++) {
		const unsigned char *s2p = s + (int64_t)i2 * s2, *d2p = d + (int64_t)i2 * d2;

		if (u->len <= SMALL_ELEM_MAX) {
			for (uint64_t i1 = 0; i1 < c1; i1 += PANEL) {
				uint64_t n1 = c1 - i1 < PANEL ? c1 - i1 : PANEL;

				compare_tiles(j, un, s2p + (int64_t)i1 * s1, d2p + (int64_t)i1 * d1,
					      s0, s1, d0, d1, c0, n1, (i2 * c1 + i1) * c0);
			}
			continue;
		}
		for (uint64_t i1 = 0; i1 < c1; i1++)
			for (uint64_t i0 = 0; i0 < c0; i0++, row++) {
				const unsigned char *sp = s2p + (int64_t)i1 * s1 + (int64_t)i0 * s0;
				const unsigned char *dp = d2p + (int64_t)i1 * d1 + (int64_t)i0 * d0;

				if (memcmp(dp, sp, u->len))
					row_differs(j, un, row, 0, sp, dp, u->len);
			}
	}
}

static void *worker(void *arg)
{
	struct job *j = arg;
	uint64_t k;

	while ((k = __atomic_fetch_add(&j->next, 1, __ATOMIC_RELAXED)) < j->units->n)
		compare_unit(j, &j->units->v[k]);
	return NULL;
}

static int compare_host(struct job *j, int threads)
{
	pthread_t tid[MAX_THREADS];
	int started = 0;

	if (threads < 1)
		threads = 1;
	if (threads > MAX_THREADS)
		threads = MAX_THREADS;
	if ((uint64_t)threads > j->units->n)
		threads = (int)j->units->n;
	for (int t = 1; t < threads; t++) {
		if (pthread_create(&tid[started], NULL, worker, j) != 0)
			break;
		started++;
	}
	worker(j);
	for (int t = 0; t < started; t++)
		pthread_join(tid[t], NULL);
	return 0;
}

/* The copy that gathers one side of a unit (its src side, or its dst side
 * read as a source) into buf, rows packed. */
static void gather_op(const struct wex_copy_op *u, int dst_side, unsigned char *buf,
		      struct wex_copy_op *g)
{
	int64_t packed = (int64_t)u->len;

	*g = *u;
	g->src = dst_side ? u->dst : u->src;
	g->dst = (uint64_t)(uintptr_t)buf;
	for (uint32_t k = 0; k < u->nouter; k++) {
		g->src_stride[k] = dst_side ? u->dst_stride[k] : u->src_stride[k];
		g->dst_stride[k] = packed;
		packed *= (int64_t)u->count[k];
	}
}

/* Bytes [s, e) of a run of units [lo, hi) gathered into a (sources) and b
 * (destinations), the units' rows packed one after another: compares
 * them, row by row (or the part of a row in the slice) where they differ. */
static void compare_slice(struct job *j, size_t lo, size_t hi, const unsigned char *a,
			  const unsigned char *b, uint64_t s, uint64_t e)
{
	uint64_t pos = 0;

	for (size_t k = lo; k < hi && pos < e; k++) {
		const struct unit *un = &j->units->v[k];
		uint64_t len = un->u.len, bytes = unit_rows(&un->u) * len;
		uint64_t us = s > pos ? s : pos, ue = e < pos + bytes ? e : pos + bytes;

		if (us < ue && memcmp(a + us, b + us, ue - us)) {
			for (uint64_t r = (us - pos) / len; pos + r * len < ue; r++) {
				uint64_t row = pos + r * len;
				uint64_t rs = us > row ? us : row;
				uint64_t re = ue < row + len ? ue : row + len;

				if (memcmp(a + rs, b + rs, re - rs))
					row_differs(j, un, r, rs - row, a + rs, b + rs, re - rs);
			}
		}
		pos += bytes;
	}
}

/* Bytes in the run of units [lo, hi). */
static uint64_t run_bytes(const struct job *j, size_t lo, size_t hi)
{
	uint64_t total = 0;

	for (size_t k = lo; k < hi; k++)
		total += unit_rows(&j->units->v[k].u) * j->units->v[k].u.len;
	return total;
}

/* Brings one side of a run of units into its buffer: the sides in GPU
 * memory through the gather backend, those in host memory with memcpy
 * (the backend would run a host-to-host copy in some GPU's context,
 * making one where the process has none). */
static int gather_side(const struct wex_mem_ops *gather, struct wex_copy_op *g, size_t n,
		       const uint8_t *on_gpu, int threads)
{
	size_t k = 0;
	int ret;

	/* GPU sides first, then the host ones (order does not matter: each
	 * op fills its own part of the buffer). */
	for (size_t i = 0; i < n; i++)
		if (on_gpu[i]) {
			struct wex_copy_op t = g[k];

			g[k++] = g[i];
			g[i] = t;
		}
	ret = k ? gather->copy(g, k, threads) : 0;
	if (!ret && k < n)
		ret = wex_mem_host_copy(g + k, n - k, threads);
	return ret;
}

/* Units in one run, at most: bounds the op arrays for plans of millions
 * of ops. */
#define RUN_MAX 16384

/*
 * The gather path keeps two pairs of buffers: while the caller gathers run
 * k+1 into one, up to `threads` threads compare run k in the other, each
 * a slice of its bytes.  The result cannot depend on that overlap or on
 * the slicing: every byte is compared once, note() keeps the smallest
 * (op, dst_off) whatever order they come in and adds up the count.  The
 * comparison threads only read memory: every backend call
 * (copies, pinning) stays on the caller's thread, whose device binding and
 * stream-capture mode the public call set (wex_mem_thread_save).
 */
struct pair {
	unsigned char *a, *b; /* sources, destinations: one allocation at a */
	uint64_t bytes;       /* of the allocation, whole pages */
	int pin;              /* 1 + the device it was pinned with; 0 not */
	int tried;            /* pinning was tried (once per pair) */
};

/* Page-aligned and whole pages, so that no other allocation shares a page
 * the driver pins (it refuses to register a page twice). */
static int pair_alloc(struct pair *p, uint64_t cap)
{
	long ps = sysconf(_SC_PAGESIZE);
	uint64_t page = ps > 0 ? (uint64_t)ps : 4096, half = (cap + page - 1) / page * page;

	p->a = aligned_alloc(page, 2 * half);
	if (!p->a)
		return -ENOMEM;
	p->b = p->a + half;
	p->bytes = 2 * half;
	return 0;
}

static int pin_warned;

/*
 * Pins a pair for the backend's copies before its first gather, with
 * `dev` (a device the run reads) current; the pinning serves every device
 * (CUDA: PORTABLE), so later runs reading others use it too.
 * Device-to-host copies into pageable memory go through the driver's
 * bounce buffers at a fraction of the link's speed.  Pinning changes how
 * fast the bytes arrive, never which: where the backend refuses (its kind
 * has no pinning, the driver is out of memory it may lock, ...) the
 * comparison goes on through the pageable buffer, with the same result,
 * and says so once per process (wex_warn) rather than fail a check of the
 * weights for being slow.
 */
static void pair_pin(const struct wex_mem_ops *gather, struct pair *p, int dev)
{
	int ret;

	if (p->tried)
		return;
	p->tried = 1;
	ret = gather->host_pin(p->a, p->bytes, dev, 0);
	if (!ret) {
		p->pin = dev + 1;
		return;
	}
	if (!__atomic_exchange_n(&pin_warned, 1, __ATOMIC_RELAXED))
		wex_warn("verify", "the %s backend did not pin %llu bytes of gather buffers (%s): "
			 "verification reads GPU memory through pageable host memory, slower "
			 "(said once per process)", gather->name, (unsigned long long)p->bytes,
			 wex_strerror(ret));
}

/* Unpins and frees p (its comparison over); the unpin's error. */
static int pair_free(const struct wex_mem_ops *gather, struct pair *p)
{
	int ret = 0;

	if (p->pin)
		ret = gather->host_unpin(p->a, p->pin - 1);
	free(p->a);
	*p = (struct pair){ 0 };
	return ret;
}

/*
 * The comparison threads and the one run they are handed at a time: its
 * bytes cut into slices (a slice may cut a unit or a row: note() keeps
 * the smallest (op, dst_off) and adds up the counts, so the result is the
 * same however it is cut), each taken by the next thread free.  Slices of
 * less than unit_max / SLICES_PER_UNIT (1 MiB) are not worth a thread.
 */
#define SLICES_PER_UNIT 64

struct cmp {
	pthread_mutex_t lock;
	pthread_cond_t cv;
	pthread_t tid[MAX_THREADS];
	int threads, started, stop;
	int queued;                /* a run is handed over, not all compared */
	int nslices, next, done;   /* its slices: made, taken, compared */
	struct job *j;
	size_t lo, hi;
	const unsigned char *a, *b;
	uint64_t total;
};

static void *cmp_thread(void *arg)
{
	struct cmp *c = arg;

	pthread_mutex_lock(&c->lock);
	for (;;) {
		int t;

		while (!(c->queued && c->next < c->nslices) && !c->stop)
			pthread_cond_wait(&c->cv, &c->lock);
		if (!(c->queued && c->next < c->nslices))
			break; /* stopped, and nothing left to take */
		t = c->next++;
		pthread_mutex_unlock(&c->lock);
		compare_slice(c->j, c->lo, c->hi, c->a, c->b,
			      c->total * (uint64_t)t / (uint64_t)c->nslices,
			      c->total * (uint64_t)(t + 1) / (uint64_t)c->nslices);
		pthread_mutex_lock(&c->lock);
		if (++c->done == c->nslices) {
			c->queued = 0;
			pthread_cond_broadcast(&c->cv);
		}
	}
	pthread_mutex_unlock(&c->lock);
	return NULL;
}

/*
 * Hands units [lo, hi), gathered into a and b, to the threads once they
 * have compared the run before (which read the other pair): so the pair
 * the caller gathers into next is free.  The threads are started with the
 * first run; where none can be, the caller compares (the same result,
 * without the overlap).
 */
static void cmp_post(struct cmp *c, size_t lo, size_t hi, const unsigned char *a,
		     const unsigned char *b)
{
	uint64_t total = run_bytes(c->j, lo, hi);
	uint64_t min = unit_max / SLICES_PER_UNIT ? unit_max / SLICES_PER_UNIT : 1;
	int n = c->threads;

	while (c->started < c->threads && !c->stop) {
		if (pthread_create(&c->tid[c->started], NULL, cmp_thread, c) != 0)
			break;
		c->started++;
	}
	if (!c->started) {
		compare_slice(c->j, lo, hi, a, b, 0, total);
		return;
	}
	if ((uint64_t)n > total / min)
		n = total / min > 1 ? (int)(total / min) : 1;
	pthread_mutex_lock(&c->lock);
	while (c->queued)
		pthread_cond_wait(&c->cv, &c->lock);
	c->lo = lo;
	c->hi = hi;
	c->a = a;
	c->b = b;
	c->total = total;
	c->nslices = n;
	c->next = 0;
	c->done = 0;
	c->queued = 1;
	pthread_cond_broadcast(&c->cv);
	pthread_mutex_unlock(&c->lock);
}

/* Returns once the threads compared what they were handed, and ended. */
static void cmp_stop(struct cmp *c)
{
	pthread_mutex_lock(&c->lock);
	c->stop = 1;
	pthread_cond_broadcast(&c->cv);
	pthread_mutex_unlock(&c->lock);
	for (int t = 0; t < c->started; t++)
		pthread_join(c->tid[t], NULL);
	c->started = 0;
}

static int compare_gather(struct job *j, const struct wex_mem_ops *gather, int threads)
{
	const struct units *v = j->units;
	struct wex_copy_op *ga = NULL, *gb = NULL;
	struct pair pr[2] = { { 0 }, { 0 } };
	struct cmp c = { .j = j, .threads = threads < 1 ? 1 : threads > MAX_THREADS ? MAX_THREADS : threads };
	uint8_t *ka = NULL, *kb = NULL;
	uint64_t cap = 0, total = 0;
	int ret = -ENOMEM, cur = 0;

	if (!v->n)
		return 0;
	for (size_t k = 0; k < v->n; k++) {
		uint64_t bytes = unit_rows(&v->v[k].u) * v->v[k].u.len;

		cap = bytes > cap ? bytes : cap;
		total += bytes;
	}
	/* Runs of units fill buffers of unit_max (a unit is never larger),
	 * or of what there is to compare when that is less; the second pair
	 * is made when a second run comes. */
	if (cap < unit_max)
		cap = total < unit_max ? total : unit_max;
	pthread_mutex_init(&c.lock, NULL);
	pthread_cond_init(&c.cv, NULL);
	ga = malloc(RUN_MAX * sizeof(*ga));
	gb = malloc(RUN_MAX * sizeof(*gb));
	ka = malloc(RUN_MAX);
	kb = malloc(RUN_MAX);
	if (!ga || !gb || !ka || !kb)
		goto out;
	ret = 0;
	for (size_t lo = 0; lo < v->n && !ret;) {
		struct pair *p = &pr[cur];
		size_t hi = lo, m = 0;
		uint64_t pos = 0;
		int dev = -1;

		/* The run p held last was compared before the run of the
		 * other pair was handed over (cmp_post): p is free. */
		if (!p->a && (ret = pair_alloc(p, cap)) < 0)
			break;
		while (hi < v->n && m < RUN_MAX) {
			const struct unit *un = &v->v[hi];
			uint64_t bytes = unit_rows(&un->u) * un->u.len;
			int sg = gpu_of(un->u.src);
			int dg = gpu_of(un->u.dst);

			if (sg < 0 && dg < 0) {
				/* Host memory on both sides: compared where it is
				 * (in order, so the run's units stay together). */
				if (m)
					break;
				compare_unit(j, un);
				hi++;
				lo = hi;
				continue;
			}
			if (pos + bytes > cap)
				break;
			if (dev < 0)
				dev = sg >= 0 ? sg : dg;
			gather_op(&un->u, 0, p->a + pos, &ga[m]);
			gather_op(&un->u, 1, p->b + pos, &gb[m]);
			ka[m] = (uint8_t)(sg >= 0);
			kb[m] = (uint8_t)(dg >= 0);
			m++;
			pos += bytes;
			hi++;
		}
		if (!m)
			continue;
		/* dev >= 0: a gathered unit has a side in GPU memory. */
		pair_pin(gather, p, dev);
		if (!p->pin)
			j->unpinned = 1;
		ret = gather_side(gather, ga, m, ka, threads);
		if (!ret)
			ret = gather_side(gather, gb, m, kb, threads);
		if (ret)
			break;
		cmp_post(&c, lo, hi, p->a, p->b);
		cur = !cur;
		lo = hi;
	}
out:
	/* A run handed over is compared even after an error (bounded, and
	 * the result is dropped): the thread must end before the buffers
	 * go. */
	cmp_stop(&c);
	for (int i = 0; i < 2; i++) {
		int r = pair_free(gather, &pr[i]);

		if (!ret)
			ret = r;
	}
	pthread_cond_destroy(&c.cv);
	pthread_mutex_destroy(&c.lock);
	free(ka);
	free(kb);
	free(ga);
	free(gb);
	return ret;
}

int wex__verify_ops(const struct wex_copy_op *ops, size_t n, const struct wex_mem_ops *gather,
		    int threads, struct wex_verify_diff *diff)
{
	struct units v = { 0 };
	struct job j = { .units = &v, .ops = ops };
	int ret = 0;

	memset(diff, 0, sizeof(*diff));
	for (size_t i = 0; i < n && !ret; i++) {
		struct wex_copy_op f = ops[i];

		wex_mem_fold_op(&f);
		ret = cut(&v, &f, i, unit_max);
	}
	if (ret) {
		free(v.v);
		return ret;
	}
	pthread_mutex_init(&j.lock, NULL);
	ret = gather ? compare_gather(&j, gather, threads) : compare_host(&j, threads);
	pthread_mutex_destroy(&j.lock);
	free(v.v);
	diff->unpinned = j.unpinned;
	if (ret < 0)
		return ret;
	if (!j.found)
		return 0;
	*diff = j.diff;
	diff->unpinned = j.unpinned;
	return 1;
}
