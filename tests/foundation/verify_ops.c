/* SPDX-License-Identifier: MIT */
/*
 * verify_ops - unit test of wex__verify_ops (src/verify.h), the byte
 * comparison behind WEX_SYNC_VERIFY and wexctl verify, in both of its
 * paths: in place over threads (host memory), and gathered into host
 * buffers through a backend's copy slot (a stand-in backend here: the host
 * backend's copies, with pinning that records what it pinned; it runs the
 * same gather code the GPU path runs: every address taken for GPU memory,
 * or only those in odd pages, so that host and GPU sides mix in one run).
 * Ops of 0-3 outer dims,
 * with the unit (the gather buffers' size) set to 64 KiB: a row longer
 * than a unit, ops cut along their first and second outer dims.  Equal copies must compare equal; then single bytes flipped at
 * random places (in the destination, then in the source) must be found:
 * the first one in op order, its offsets from the op's dst and src, and
 * the count of different bytes.  Bytes outside every op may differ
 * freely and must not be reported.  Every byte of an op different (the
 * long row, the 3000 rows): all counted, the first at the op's start,
 * with 1, 2 and 7 threads (a run's bytes are compared in slices over
 * threads; a byte lost at a slice's edge shows in the count).
 * After every gathered comparison: the backend's copies wrote only into
 * pinned memory, at most two buffer pairs were pinned, none larger than
 * two units, and every one was unpinned before the call returned.
 * Several runs (the gather of one overlaps the comparison of the one
 * before): a byte in the first run and one in the last, two in late runs,
 * counted and the first reported exactly.  The first, second, a middle
 * or the last copy call of the gather failing: its error returned (not a
 * difference found before it), no copy after it, everything unpinned.  Pinning refused
 * for the first or the second pair: the same results through pageable
 * memory, the other pair unpinned.  An unpin that fails: its error
 * returned, the other pair unpinned still.
 * Then rows under two outer dims listed outermost first: compared
 * equal, and a flipped byte found.  Last, ops into transposed tensors
 * (transposes, below).
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "helpers.h"
#include "src/verify.h"
#include "vmm/backend.h"

static uint64_t rng = 0x9E3779B97F4A7C15ull;

static uint64_t rnd(uint64_t n)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return n ? rng % n : 0;
}

/* An op of rows of `len` bytes over `nouter` dims (count[0] innermost),
 * with gaps of `gap` bytes between rows in the source, none in the
 * destination, placed at *so / *dof (then advanced past it). */
static struct wex_copy_op make_op(char *src, char *dst, uint64_t *so, uint64_t *dof,
				  uint32_t nouter, uint64_t len, const uint64_t *count, int gap)
{
	struct wex_copy_op op;
	uint64_t ss = len + (uint64_t)gap, ds = len;

	memset(&op, 0, sizeof(op));
	op.len = len;
	op.nouter = nouter;
	for (uint32_t k = 0; k < nouter; k++) {
		op.count[k] = count[k];
		op.src_stride[k] = (int64_t)ss;
		op.dst_stride[k] = (int64_t)ds;
		ss *= count[k];
		ds *= count[k];
	}
	op.src = (uint64_t)(uintptr_t)(src + *so);
	op.dst = (uint64_t)(uintptr_t)(dst + *dof);
	*so += ss + 128;
	*dof += ds + 128;
	return op;
}

static uint64_t rows_of(const struct wex_copy_op *op)
{
	uint64_t r = 1;

	for (uint32_t k = 0; k < op->nouter; k++)
		r *= op->count[k];
	return r;
}

/* Byte offsets (from src and dst) of byte b of row r of op. */
static void at(const struct wex_copy_op *op, uint64_t r, uint64_t b, uint64_t *s, uint64_t *d)
{
	int64_t so = 0, dso = 0;

	for (uint32_t k = 0; k < op->nouter; k++) {
		uint64_t i = r % op->count[k];

		r /= op->count[k];
		so += (int64_t)i * op->src_stride[k];
		dso += (int64_t)i * op->dst_stride[k];
	}
	*s = (uint64_t)so + b;
	*d = (uint64_t)dso + b;
}

/* Copies every op (the reference: byte loops). */
static void fill(const struct wex_copy_op *ops, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		for (uint64_t r = 0; r < rows_of(&ops[i]); r++) {
			uint64_t s, d;

			at(&ops[i], r, 0, &s, &d);
			memcpy((char *)(uintptr_t)(ops[i].dst + d),
			       (const char *)(uintptr_t)(ops[i].src + s), ops[i].len);
		}
	}
}

/* The gather path's test of where memory is: every address "on a GPU",
 * or those in odd 4 KiB pages only (sides of each kind in one run). */
static int all_gpu(uint64_t addr)
{
	(void)addr;
	return 0;
}

static int odd_pages_gpu(uint64_t addr)
{
	return (addr >> 12) & 1 ? 0 : -1;
}

static const char *const path_name[] = { "in place", "gathered", "gathered, mixed" };

/*
 * The gather backend: the host backend's table with its own pinning and
 * copy slot.  host_pin records the ranges (never two overlapping), the
 * copy slot counts the ops that write outside every pinned range, and
 * each can be made to fail at its nth call.  verify.c calls them from the
 * caller's thread only (its comparison thread touches no backend).
 */
static struct wex_mem_ops fake;
static struct {
	void *p;
	uint64_t size;
} pinned[8];
static int npinned;
static unsigned long pin_calls, unpin_calls, copy_calls, unpinned_copies;
static unsigned long fail_pin_at, fail_copy_at, fail_unpin_at; /* call numbers; 0: none */
static uint64_t pin_max;

static int fake_pin(void *p, uint64_t size, int device, int readonly)
{
	uint64_t a = (uint64_t)(uintptr_t)p;

	if (++pin_calls == fail_pin_at)
		return -ENOMEM;
	T_ASSERT(npinned < 8 && size > 0 && !readonly && device >= 0, "pin %d %llu %d %d", npinned,
		 (unsigned long long)size, device, readonly);
	for (int i = 0; i < npinned; i++) {
		uint64_t b = (uint64_t)(uintptr_t)pinned[i].p;

		T_ASSERT(a + size <= b || b + pinned[i].size <= a, "a page pinned twice");
	}
	pinned[npinned].p = p;
	pinned[npinned].size = size;
	npinned++;
	pin_max = size > pin_max ? size : pin_max;
	return 0;
}

static int fake_unpin(void *p, int device)
{
	int i = 0;

	unpin_calls++;
	while (i < npinned && pinned[i].p != p)
		i++;
	T_ASSERT(i < npinned, "unpin of %p, which is not pinned", p);
	pinned[i] = pinned[--npinned];
	return unpin_calls == fail_unpin_at ? -EBUSY : 0;
}

static int in_pinned(uint64_t a, uint64_t n)
{
	for (int i = 0; i < npinned; i++) {
		uint64_t b = (uint64_t)(uintptr_t)pinned[i].p;

		if (a >= b && a + n <= b + pinned[i].size)
			return 1;
	}
	return 0;
}

static int fake_copy(const struct wex_copy_op *ops, size_t n, int threads)
{
	if (++copy_calls == fail_copy_at)
		return -EIO;
	/* The gather packs rows: an op's destination is one range. */
	for (size_t i = 0; i < n; i++)
		if (!in_pinned(ops[i].dst, wex__ops_bytes(&ops[i], 1)))
			unpinned_copies++;
	return wex_mem_host_copy(ops, n, threads);
}

/* What the backend counted, to compare before and after a call. */
struct counts {
	unsigned long pins, unpins, copies, unpinned;
};

static struct counts counts(void)
{
	return (struct counts){ pin_calls, unpin_calls, copy_calls, unpinned_copies };
}

/* After a gathered call: nothing left pinned, at most two pairs of at
 * most two units each, and (unless a pin was refused: `refused`) no copy
 * into memory that was not pinned. */
static void check_pins(const char *what, struct counts was, int refused)
{
	long ps = sysconf(_SC_PAGESIZE);
	uint64_t page = ps > 0 ? (uint64_t)ps : 4096;
	uint64_t unit = wex__verify_unit(0);

	T_ASSERT(npinned == 0, "%s: %d buffers left pinned", what, npinned);
	T_ASSERT(pin_calls - was.pins <= 2, "%s: %lu pins", what, pin_calls - was.pins);
	T_ASSERT(unpin_calls - was.unpins == pin_calls - was.pins - (unsigned long)refused,
		 "%s: %lu pins (%d refused), %lu unpins", what, pin_calls - was.pins, refused,
		 unpin_calls - was.unpins);
	T_ASSERT(pin_max <= 2 * ((unit + page - 1) / page * page), "%s: %llu bytes pinned at once",
		 what, (unsigned long long)pin_max);
	if (!refused)
		T_ASSERT(unpinned_copies == was.unpinned, "%s: %lu copies into pageable memory", what,
			 unpinned_copies - was.unpinned);
}

static void check(const char *what, const struct wex_copy_op *ops, size_t n, int threads,
		  int want, size_t op, uint64_t dst_off, uint64_t src_off, uint64_t bytes)
{
	for (int path = 0; path < 3; path++) {
		const struct wex_mem_ops *g = path ? &fake : NULL;
		struct wex_verify_diff diff;
		struct counts was = counts();
		int ret;

		wex__verify_where(path == 1 ? all_gpu : path == 2 ? odd_pages_gpu : NULL);
		ret = wex__verify_ops(ops, n, g, threads, &diff);
		wex__verify_where(NULL);
		if (path)
			check_pins(what, was, 0);

		T_ASSERT(ret == want, "%s (%s, %d threads): returned %d, expected %d", what,
			 path_name[path], threads, ret, want);
		if (!want)
			continue;
		T_ASSERT(diff.op == op && diff.dst_off == dst_off && diff.src_off == src_off &&
				 diff.bytes == bytes,
			 "%s (%s, %d threads): first difference at op %zu dst+%llu src+%llu, %llu bytes; expected op %zu dst+%llu src+%llu, %llu bytes",
			 what, path_name[path], threads, diff.op,
			 (unsigned long long)diff.dst_off, (unsigned long long)diff.src_off,
			 (unsigned long long)diff.bytes, op, (unsigned long long)dst_off,
			 (unsigned long long)src_off, (unsigned long long)bytes);
	}
}

/* Flips `k` distinct random bytes inside the ops (in dst, or in src when
 * in_src) and checks that the first and the count are found; then flips
 * them back. */
static void flip_case(const char *what, const struct wex_copy_op *ops, size_t n, int threads,
		      int k, int in_src)
{
	size_t fo[8];
	uint64_t fs[8], fd[8];
	size_t best = 0;

	for (int i = 0; i < k; i++) {
		size_t o;
		uint64_t r, b;
		int dup;

		do {
			o = (size_t)rnd(n);
			r = rnd(rows_of(&ops[o]));
			b = rnd(ops[o].len);
			at(&ops[o], r, b, &fs[i], &fd[i]);
			fo[i] = o;
			dup = 0;
			for (int j = 0; j < i; j++)
				dup |= fo[j] == o && fd[j] == fd[i];
		} while (dup);
		*(char *)(uintptr_t)((in_src ? ops[o].src + fs[i] : ops[o].dst + fd[i])) ^= 0x5A;
		if (i && (fo[i] < fo[best] || (fo[i] == fo[best] && fd[i] < fd[best])))
			best = (size_t)i;
	}
	check(what, ops, n, threads, 1, fo[best], fd[best], fs[best], (uint64_t)k);
	for (int i = 0; i < k; i++)
		*(char *)(uintptr_t)((in_src ? ops[fo[i]].src + fs[i] : ops[fo[i]].dst + fd[i])) ^=
			0x5A;
	check(what, ops, n, threads, 0, 0, 0, 0, 0);
}

/* Every byte of ops[o]'s destination differs (the other ops equal): each
 * must be counted, the first at the op's start, however the comparison is
 * cut (units, runs, and the slices that threads compare of a run: a byte
 * lost at a slice's edge shows in the count). */
static void whole_op_case(const struct wex_copy_op *ops, size_t n, size_t o, int threads)
{
	uint64_t rows = rows_of(&ops[o]), s, d;

	for (int pass = 0; pass < 2; pass++) {
		for (uint64_t r = 0; r < rows; r++) {
			at(&ops[o], r, 0, &s, &d);
			for (uint64_t b = 0; b < ops[o].len; b++)
				((char *)(uintptr_t)ops[o].dst)[d + b] ^= 0x5A;
		}
		if (pass == 0)
			check("every byte of an op differs", ops, n, threads, 1, o, 0, 0,
			      rows * ops[o].len);
	}
	check("every byte of an op equal again", ops, n, threads, 0, 0, 0, 0, 0);
}

/* Runs one gathered comparison (path 1 or 2) and checks its answer. */
static int gathered(const struct wex_copy_op *ops, size_t n, int path, int threads,
		    struct wex_verify_diff *diff)
{
	int ret;

	wex__verify_where(path == 1 ? all_gpu : odd_pages_gpu);
	ret = wex__verify_ops(ops, n, &fake, threads, diff);
	wex__verify_where(NULL);
	return ret;
}

/* Byte b of row r of op o, flipped in its destination or source. */
struct flip {
	size_t o;
	uint64_t s, d;
	int in_src;
};

static struct flip flip_at(const struct wex_copy_op *ops, size_t o, uint64_t r, uint64_t b,
			   int in_src)
{
	struct flip f = { .o = o, .in_src = in_src };

	at(&ops[o], r, b, &f.s, &f.d);
	return f;
}

static void flip(const struct wex_copy_op *ops, const struct flip *f)
{
	*(char *)(uintptr_t)(f->in_src ? ops[f->o].src + f->s : ops[f->o].dst + f->d) ^= 0x5A;
}

/*
 * Several runs, compared while the next is gathered: differences in the
 * first run and the last, or in two late runs, both counted and the first
 * in op order reported, on both gathered paths.  Then failures: the
 * first, second, a middle and the last copy slot call failing (the call
 * returns -EIO even though differences were there to find, and unpins
 * everything); pinning refused for either pair (the same answer); an
 * unpin failing (its error, the other pair still unpinned).
 */
static void runs_case(const struct wex_copy_op *ops, size_t n)
{
	size_t last = n - 1;
	struct flip early = flip_at(ops, 0, 0, 3, 0);
	struct flip late = flip_at(ops, last, rows_of(&ops[last]) - 1, ops[last].len - 1, 1);
	struct flip later = flip_at(ops, last - 1, 0, 0, 0);
	struct wex_verify_diff d;

	for (int path = 1; path <= 2; path++) {
		for (int th = 1; th <= 4; th += 3) {
			struct counts was = counts();

			T_ASSERT(gathered(ops, n, path, th, &d) == 0, "equal, %s", path_name[path]);
			check_pins("several runs", was, 0);
			/* Dozens of runs (path 1: two copy calls each). */
			T_ASSERT(pin_calls - was.pins == 2 && copy_calls - was.copies >= 8,
				 "%s: %lu pins, %lu copy calls", path_name[path],
				 pin_calls - was.pins, copy_calls - was.copies);

			flip(ops, &early);
			flip(ops, &late);
			was = counts();
			T_ASSERT(gathered(ops, n, path, th, &d) == 1 && d.op == 0 &&
					 d.dst_off == early.d && d.src_off == early.s && d.bytes == 2,
				 "first and last run (%s, %d threads): op %zu dst+%llu, %llu bytes",
				 path_name[path], th, d.op, (unsigned long long)d.dst_off,
				 (unsigned long long)d.bytes);
			check_pins("first and last run", was, 0);
			flip(ops, &early);

			flip(ops, &later);
			T_ASSERT(gathered(ops, n, path, th, &d) == 1 && d.op == last - 1 &&
					 d.dst_off == later.d && d.src_off == later.s && d.bytes == 2,
				 "two late runs (%s, %d threads): op %zu dst+%llu, %llu bytes",
				 path_name[path], th, d.op, (unsigned long long)d.dst_off,
				 (unsigned long long)d.bytes);
			flip(ops, &later);
			flip(ops, &late);
		}
	}

	/* A failing copy, with differences before and after it. */
	flip(ops, &early);
	flip(ops, &late);
	for (int path = 1; path <= 2; path++) {
		unsigned long calls = copy_calls, at_call[4];

		T_ASSERT(gathered(ops, n, path, 2, &d) == 1, "before the failures");
		calls = copy_calls - calls;
		at_call[0] = 1;
		at_call[1] = 2;
		at_call[2] = calls / 2;
		at_call[3] = calls;
		for (int i = 0; i < 4; i++) {
			struct counts was = counts();
			int ret;

			fail_copy_at = copy_calls + at_call[i];
			ret = gathered(ops, n, path, 2, &d);
			fail_copy_at = 0;
			T_ASSERT(ret == -EIO, "copy call %lu of %lu failing (%s): returned %d",
				 at_call[i], calls, path_name[path], ret);
			T_ASSERT(copy_calls - was.copies == at_call[i], "stopped at the failure");
			check_pins("a failing copy", was, 0);
		}
		/* Pinning refused for the first pair, then the second. */
		for (unsigned long nth = 1; nth <= 2; nth++) {
			struct counts was = counts();

			fail_pin_at = pin_calls + nth;
			T_ASSERT(gathered(ops, n, path, 2, &d) == 1 && d.op == 0 &&
					 d.dst_off == early.d && d.bytes == 2,
				 "pin %lu refused (%s)", nth, path_name[path]);
			/* What the sync reports (unpinned_verify). */
			T_ASSERT(d.unpinned == 1, "pin %lu refused (%s): unpinned %d", nth,
				 path_name[path], d.unpinned);
			fail_pin_at = 0;
			check_pins("pinning refused", was, 1);
			T_ASSERT(unpinned_copies > was.unpinned, "pageable copies counted");
		}
		/* The first unpin fails: its error; the second pair unpinned. */
		{
			struct counts was = counts();
			int ret;

			fail_unpin_at = unpin_calls + 1;
			ret = gathered(ops, n, path, 2, &d);
			fail_unpin_at = 0;
			T_ASSERT(ret == -EBUSY, "a failed unpin (%s): returned %d", path_name[path],
				 ret);
			T_ASSERT(d.unpinned == 0, "every buffer pinned (%s): unpinned %d",
				 path_name[path], d.unpinned);
			check_pins("a failed unpin", was, 0);
		}
	}
	flip(ops, &early);
	flip(ops, &late);
}

/* Rows of 8 bytes, 16 apart in the source and packed in the destination,
 * under two outer dims listed outermost first: compared equal, and a
 * byte flipped in a row found at its place (the comparison folds the op
 * with wex_mem_fold_op, which host_copy checks walks the innermost dim
 * fastest; walked outermost first, such rows compared 5.6-6.6x slower,
 * measured by the review that found it, 2026-12-01). */
static void row_order(void)
{
	const uint64_t len = 8, inner = 512, outer = 2560, rows = inner * outer;
	char *s = malloc(2 * len * rows), *d = malloc(len * rows);
	struct wex_verify_diff df;

	T_ASSERT(s && d, "malloc");
	for (uint64_t r = 0; r < rows; r++) {
		memset(s + 2 * len * r, (int)(r * 7), len);
		memset(d + len * r, (int)(r * 7), len);
	}
	struct wex_copy_op two = { .src = (uint64_t)(uintptr_t)s, .dst = (uint64_t)(uintptr_t)d,
				   .len = len, .nouter = 2, .count = { outer, inner },
				   .src_stride = { (int64_t)(2 * len * inner), (int64_t)(2 * len) },
				   .dst_stride = { (int64_t)(len * inner), (int64_t)len } };
	uint64_t was = wex__verify_unit(64u << 20);

	T_ASSERT(wex__verify_ops(&two, 1, NULL, 1, &df) == 0, "two outer dims: equal");
	d[len * 1000 + 3] ^= 1; /* row 1000: inner index 488 of outer 1 */
	T_ASSERT(wex__verify_ops(&two, 1, NULL, 1, &df) == 1 && df.bytes == 1 &&
			 df.dst_off == len * 1000 + 3 && df.src_off == 2 * len * 1000 + 3,
		 "two outer dims: the flipped byte at dst %llu, src %llu found at %llu, %llu (%llu bytes)",
		 (unsigned long long)(len * 1000 + 3), (unsigned long long)(2 * len * 1000 + 3),
		 (unsigned long long)df.dst_off, (unsigned long long)df.src_off,
		 (unsigned long long)df.bytes);
	wex__verify_unit(was);
	free(s);
	free(d);
}

/* A [r, c] tensor of e-byte elements (rows pad elements apart, elements
 * `step` elements apart) copied into a [c, r] one (rows pad apart), at
 * *so / *dof (then advanced past it): rows of one element, count[0]
 * along the source's dim 0. */
static struct wex_copy_op transpose_op(char *src, char *dst, uint64_t *so, uint64_t *dof,
				       uint64_t r, uint64_t c, uint64_t e, uint64_t pad,
				       uint64_t step)
{
	struct wex_copy_op op = { .src = (uint64_t)(uintptr_t)(src + *so),
				  .dst = (uint64_t)(uintptr_t)(dst + *dof),
				  .len = e,
				  .nouter = 2,
				  .count = { r, c },
				  .src_stride = { (int64_t)((c * step + pad) * e), (int64_t)(step * e) },
				  .dst_stride = { (int64_t)e, (int64_t)((r + pad) * e) } };

	*so += r * (c * step + pad) * e + 7;
	*dof += c * (r + pad) * e + 5;
	return op;
}

/*
 * Ops into transposed tensors (rows of 1 to 16 bytes: compared in tiles
 * of 32 x 32 elements, up to 256 runs at a time): element sizes 1, 2, 3
 * (no tile loop: the element-by-element one), 4, 8 and 16; shapes that
 * are not multiples of a tile, a panel of more than 256 runs, a third
 * outer dim, a source strided along both dims.  Equal copies compare
 * equal; single bytes and groups of three flipped in the destination or
 * the source are found, first and count exact, on every path; every byte
 * of an op different is all counted.
 */
static void transposes(void)
{
	const size_t cap = 4u << 20;
	char *src = malloc(cap), *dst = malloc(cap);
	struct wex_copy_op ops[16];
	static const uint64_t esz[] = { 1, 2, 3, 4, 8, 16 };
	uint64_t so = 0, dof = 0;
	size_t n = 0;

	T_ASSERT(src && dst, "malloc");
	for (size_t i = 0; i < cap; i++) {
		src[i] = (char)(i * 151 + (i >> 7));
		dst[i] = (char)~src[i];
	}
	for (size_t k = 0; k < sizeof(esz) / sizeof(esz[0]); k++)
		ops[n++] = transpose_op(src, dst, &so, &dof, 45, 70, esz[k], k & 1, 1);
	/* More than a panel of runs, and a tile's worth exactly. */
	ops[n++] = transpose_op(src, dst, &so, &dof, 33, 300, 2, 0, 1);
	ops[n++] = transpose_op(src, dst, &so, &dof, 64, 32, 4, 0, 1);
	/* Strided along both dims of the source. */
	ops[n++] = transpose_op(src, dst, &so, &dof, 40, 50, 4, 3, 2);
	/* A third dim: 3 such transposes, one after another. */
	ops[n] = transpose_op(src, dst, &so, &dof, 37, 41, 8, 0, 1);
	ops[n].nouter = 3;
	ops[n].count[2] = 3;
	ops[n].src_stride[2] = (int64_t)(37 * 41 * 8 + 24);
	ops[n].dst_stride[2] = (int64_t)(37 * 41 * 8 + 40);
	so += 2 * (37 * 41 * 8 + 24);
	dof += 2 * (37 * 41 * 8 + 40);
	n++;
	T_ASSERT(so <= cap && dof <= cap, "transposes fit (%llu, %llu of %zu)",
		 (unsigned long long)so, (unsigned long long)dof, cap);
	fill(ops, n);
	for (int th = 1; th <= 2; th++) {
		check("transposes: equal copies", ops, n, th, 0, 0, 0, 0, 0);
		for (int round = 0; round < 10; round++) {
			flip_case("transposes: one byte flipped", ops, n, th, 1, round & 1);
			flip_case("transposes: three bytes flipped", ops, n, th, 3, round & 1);
		}
		/* Each op alone, so that a flip anywhere in it is the first
		 * (the third dim's later transposes among them). */
		for (size_t o = 0; o < n; o++)
			for (int round = 0; round < 4; round++)
				flip_case("transposes: one byte flipped in one op", ops + o, 1, th, 1,
					  round & 1);
		whole_op_case(ops, n, 1, th);
		whole_op_case(ops, n, n - 1, th);
	}
	/* The last byte of the last element of a whole tile's first row
	 * (element (0, 31)), in the source and in the destination, of the
	 * 1-byte op and of the [64, 32] one. */
	for (int in_src = 0; in_src < 2; in_src++) {
		static const size_t which[] = { 0, 7 };

		for (size_t w = 0; w < 2; w++) {
			size_t o = which[w];
			struct flip f = flip_at(ops, o, 31 * ops[o].count[0], ops[o].len - 1, in_src);

			flip(ops, &f);
			check("transposes: the last byte of a tile row", ops, n, 1, 1, o, f.d, f.s, 1);
			flip(ops, &f);
		}
	}
	free(src);
	free(dst);
}

int main(void)
{
	/* Units (and gather buffers) of 64 KiB instead of 64 MiB: the ops
	 * below are cut the way a model's are, at a thousandth of the size. */
	const uint64_t unit = 64u << 10;
	const size_t cap = 4u << 20;
	char *src = malloc(cap), *dst = malloc(cap);
	struct wex_copy_op ops[128];
	static const int threads[] = { 1, 2, 7 };
	uint64_t so = 0, dof = 0;
	size_t n = 0;

	T_ASSERT(src && dst, "malloc");
	fake = wex_mem_host_ops;
	fake.name = "stand-in";
	fake.host_pin = fake_pin;
	fake.host_unpin = fake_unpin;
	fake.copy = fake_copy;
	T_ASSERT(wex__verify_unit(unit) == 64u << 20, "the default unit is 64 MiB");
	for (size_t i = 0; i < cap; i++) {
		src[i] = (char)(i * 131 + (i >> 9));
		dst[i] = (char)~src[i]; /* outside every op: all different */
	}
	/* One row longer than a unit: cut by bytes. */
	ops[n++] = make_op(src, dst, &so, &dof, 0, unit + (unit >> 3) + 13, NULL, 0);
	/* 3000 rows of 300 bytes with gaps: cut along dim 0. */
	ops[n++] = make_op(src, dst, &so, &dof, 1, 300, (const uint64_t[]){ 3000 }, 40);
	/* Rows of 100 bytes, 50 x 30 x 3: dim 0 whole in a unit, dim 1 cut,
	 * dim 2 walked. */
	ops[n++] = make_op(src, dst, &so, &dof, 3, 100, (const uint64_t[]){ 50, 30, 3 }, 8);
	/* A small op of each depth. */
	for (uint32_t nd = 0; nd <= 3; nd++) {
		static const uint64_t cnt[3] = { 7, 5, 3 };

		ops[n++] = make_op(src, dst, &so, &dof, nd, 1 + rnd(900), cnt, (int)rnd(33));
	}
	/* Many small ops, rows that abut (folded) and that do not. */
	while (n < 100) {
		uint64_t cnt[3] = { 1 + rnd(9), 1 + rnd(4), 1 + rnd(3) };

		ops[n] = make_op(src, dst, &so, &dof, (uint32_t)rnd(4), 1 + rnd(700), cnt,
				 rnd(2) ? 0 : (int)rnd(50));
		n++;
	}
	T_ASSERT(so <= cap && dof <= cap, "ops fit (%llu, %llu of %zu)", (unsigned long long)so,
		 (unsigned long long)dof, cap);
	fill(ops, n);
	T_ASSERT(wex__ops_bytes(ops, n) > 8 * unit, "ops span %llu bytes",
		 (unsigned long long)wex__ops_bytes(ops, n));
	for (size_t t = 0; t < sizeof(threads) / sizeof(threads[0]); t++) {
		int th = threads[t];

		check("equal copies", ops, n, th, 0, 0, 0, 0, 0);
		for (int round = 0; round < 20; round++) {
			flip_case("one byte flipped in a destination", ops, n, th, 1, 0);
			flip_case("one byte flipped in a source", ops, n, th, 1, 1);
			flip_case("five bytes flipped", ops, n, th, 5, round & 1);
			/* The cut ops alone, where every flip lands in a cut. */
			flip_case("one byte flipped in a cut op", ops, 3, th, 1, round & 1);
			flip_case("three bytes flipped in cut ops", ops, 3, th, 3, 0);
		}
		/* The long row (cut by bytes) and the 3000 rows (cut along dim
		 * 0), all of their bytes different. */
		whole_op_case(ops, n, 0, th);
		whole_op_case(ops, n, 1, th);
		/* The long row's last byte, the last op's first. */
		*(char *)(uintptr_t)(ops[0].dst + ops[0].len - 1) ^= 1;
		check("the long row's last byte", ops, n, th, 1, 0, ops[0].len - 1, ops[0].len - 1, 1);
		*(char *)(uintptr_t)(ops[0].dst + ops[0].len - 1) ^= 1;
		*(char *)(uintptr_t)(ops[n - 1].dst) ^= 1;
		check("the last op's first byte", ops, n, th, 1, n - 1, 0, 0, 1);
		*(char *)(uintptr_t)(ops[n - 1].dst) ^= 1;
	}
	runs_case(ops, n);
	/* Nothing to compare. */
	check("no ops", ops, 0, 2, 0, 0, 0, 0, 0);
	row_order();
	transposes();
	free(src);
	free(dst);
	return T_EXIT_PASS;
}
