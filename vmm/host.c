/* SPDX-License-Identifier: MIT */
/*
 * host.c - the host shared-memory backend: memfd segments, exported as fds,
 * imported with mmap, same-address remap with MAP_FIXED, copies with memcpy
 * split over threads.  Every CPU-only test runs on it.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

#include "wex.h"
#include "src/log.h"
#include "vmm/backend.h"

static int host_probe(char *why, size_t len)
{
	return 0;
}

static int host_alloc(uint64_t size, int device, struct wex_mem_seg *seg)
{
	int fd, ret;
	void *p;

	if (size == 0)
		return -EINVAL;
	fd = memfd_create("wex-seg", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		return -errno;
	if (ftruncate(fd, (off_t)size) < 0) {
		ret = -errno;
		goto err_close;
	}
	/* The size is fixed from now on: an importer may trust it. */
	if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) < 0) {
		ret = -errno;
		goto err_close;
	}
	p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED) {
		ret = -errno;
		goto err_close;
	}
	/* Consumers get this memfd read-only (wexd opens it again O_RDONLY),
	 * but /proc/self/fd/N opens it again with whatever its mode (0777)
	 * allows, O_RDWR too: from now on it is written only through the
	 * mapping just made (ours), never by write(), a hole punched or a new
	 * writable mapping, whoever asks.  (Kernels before 5.1 lack the seal:
	 * EINVAL, the memfd as before.) */
	if (fcntl(fd, F_ADD_SEALS, F_SEAL_FUTURE_WRITE) < 0 && errno != EINVAL) {
		ret = -errno;
		munmap(p, size);
		goto err_close;
	}
	memset(seg, 0, sizeof(*seg));
	seg->ops = &wex_mem_host_ops;
	seg->desc.kind = WEX_MEM_HOST;
	seg->desc.size = size;
	seg->desc.alloc_size = size;
	seg->ptr = p;
	seg->fd = fd;
	seg->owner = 1;
	return 0;
err_close:
	close(fd);
	return ret;
}

/* Wraps a caller's fd: wex keeps a duplicate; the caller keeps its own. */
static int host_wrap(void *ptr, uint64_t size, int fd, struct wex_mem_seg *seg)
{
	struct stat st;
	int dfd, seals;

	if (fd < 0 || size == 0)
		return -EINVAL;
	if (fstat(fd, &st) < 0)
		return -errno;
	if ((uint64_t)st.st_size < size)
		return -EINVAL;
	dfd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
	if (dfd < 0)
		return -errno;
	memset(seg, 0, sizeof(*seg));
	seg->ops = &wex_mem_host_ops;
	seg->desc.kind = WEX_MEM_HOST;
	seg->desc.size = size;
	/* Bytes past `size` are offered to same-address consumers only when
	 * the file cannot shrink under them (F_SEAL_SHRINK): a mapping past
	 * its end would SIGBUS the engine. */
	seals = fcntl(fd, F_GET_SEALS);
	seg->desc.alloc_size = seals >= 0 && (seals & F_SEAL_SHRINK) ? (uint64_t)st.st_size : size;
	seg->ptr = ptr;
	seg->fd = dfd;
	seg->owner = 0; /* the mapping is the caller's */
	return 0;
}

/* access_dev: host memory is reached by every device (nothing to grant). */
static int host_import(const struct wex_mem_desc *desc, int fd, int access_dev,
		       struct wex_mem_seg *seg)
{
	struct stat st;
	uint64_t pg;
	void *p;
	int ret;

	if (desc->kind != WEX_MEM_HOST || desc->size == 0) {
		ret = -EINVAL;
		goto err_close;
	}
	if (fstat(fd, &st) < 0) {
		ret = -errno;
		goto err_close;
	}
	/* A short file would SIGBUS the reader: refuse it up front. */
	if ((uint64_t)st.st_size < desc->size) {
		ret = -EINVAL;
		goto err_close;
	}
	p = mmap(NULL, desc->size, PROT_READ, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED) {
		ret = -errno;
		goto err_close;
	}
	memset(seg, 0, sizeof(*seg));
	seg->ops = &wex_mem_host_ops;
	seg->desc = *desc;
	/* Never more than the file holds now. */
	if (seg->desc.alloc_size > (uint64_t)st.st_size)
		seg->desc.alloc_size = (uint64_t)st.st_size;
	/* But whole pages: a region, always whole pages, of the segment's own
	 * size (5000 bytes: 8192 reserved) must fit.  The page holding its
	 * last byte is mapped whole whatever the file's size beyond it (bytes
	 * past the file's end read as zeros), so this never reaches a page
	 * past the end, also where the producer registered part of a larger
	 * file it may later shrink (never below its segment). */
	pg = (uint64_t)sysconf(_SC_PAGESIZE);
	seg->desc.alloc_size = (seg->desc.alloc_size + pg - 1) & ~(pg - 1);
	seg->ptr = p;
	seg->fd = fd;
	seg->owner = 2; /* importer: the mapping is ours */
	return 0;
err_close:
	close(fd);
	return ret;
}

static int host_release(struct wex_mem_seg *seg)
{
	/* Pinned pages must be unregistered while still mapped. */
	int ret = wex_mem_host_unpin(seg);

	if (seg->ptr && seg->owner != 0 && munmap(seg->ptr, seg->desc.size) < 0 && !ret)
		ret = -errno;
	if (seg->fd >= 0 && close(seg->fd) < 0 && !ret)
		ret = -errno;
	seg->ptr = NULL;
	seg->fd = -1;
	return ret;
}

/* Host segments are whole files mapped from offset 0 (their handle_offset
 * is 0): a lead has no meaning here. */
static int host_reserve(uint64_t size, uint64_t lead, int device, struct wex_mem_region *r)
{
	long pg = sysconf(_SC_PAGESIZE);
	void *p;

	if (size == 0)
		return -EINVAL;
	if (lead)
		return -EINVAL;
	/* (Rounded up past 2^64 it would wrap to a size of 0.) */
	if (size > UINT64_MAX - ((uint64_t)pg - 1))
		return -ENOMEM;
	size = (size + (uint64_t)pg - 1) & ~((uint64_t)pg - 1);
	p = wex_mem_map_anon(size, 0);
	if (p == MAP_FAILED)
		return -errno;
	memset(r, 0, sizeof(*r));
	r->ops = &wex_mem_host_ops;
	r->addr = p;
	r->size = size;
	r->device = -1;
	return 0;
}

/* 1 when every page of [addr, addr+size) is mapped: msync answers ENOMEM
 * for a range with a hole and, with MS_ASYNC, writes nothing back. */
static int range_mapped(void *addr, uint64_t size)
{
	return msync(addr, size, MS_ASYNC) == 0 || errno != ENOMEM;
}

/* Fresh private memory (prot, extra mmap flags) at r->addr after a failed
 * call left a hole there.  NOREPLACE first, so that nothing another thread
 * mapped into the hole is clobbered.  Where part of the range is still
 * mapped (EEXIST) that part is normally the region's own, and MAP_FIXED
 * replaces the whole range (never for addresses given up, lost = 2); a
 * mapping another thread made in the hole meanwhile would be replaced too
 * (the reservation is the region's, as with the MAP_FIXED swap itself).
 * NULL when even that fails: nothing is mapped there. */
static void *map_at(struct wex_mem_region *r, int prot, int flags)
{
	void *p;

	p = mmap(r->addr, r->size, prot, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE | flags,
		 -1, 0);
	if (p == r->addr)
		return p;
	/* Kernels before 4.17 take NOREPLACE as a hint: p is elsewhere. */
	if (p != MAP_FAILED) {
		munmap(p, r->size);
		errno = EEXIST;
		return NULL;
	}
	if (errno != EEXIST || r->lost == 2)
		return NULL;
	p = mmap(r->addr, r->size, prot, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | flags, -1, 0);
	return p == MAP_FAILED ? NULL : p;
}

static void *refill(struct wex_mem_region *r)
{
	return map_at(r, PROT_READ | PROT_WRITE, 0);
}

/* refill(), with r->lost set and logged when it fails (errno kept).  The
 * addresses are then held with no access and no memory behind them, so
 * that nothing else the process maps lands there (and is later unmapped
 * or overwritten as the region's); where even that fails they are given
 * up (lost = 2): unreserve leaves them, and the region maps there again
 * only where nothing else was mapped meanwhile. */
static int lose_or_refill(struct wex_mem_region *r)
{
	int err, held;

	if (refill(r)) {
		r->lost = 0;
		return 0;
	}
	err = errno;
	held = !!map_at(r, PROT_NONE, MAP_NORESERVE);
	r->lost = held ? 1 : 2;
	wex_error("host", "remap: no memory to refill %p (%llu bytes): %s; %s until a copy sync "
		  "maps fresh memory", r->addr, (unsigned long long)r->size, strerror(err),
		  held ? "its addresses are held with no access (reads fault)" :
			 "nothing is mapped there and the region no longer holds its addresses");
	errno = err;
	return -err;
}

static int host_map_fixed(struct wex_mem_region *r, struct wex_mem_seg *seg, uint64_t off)
{
	long pg = sysconf(_SC_PAGESIZE);
	void *p;
	int ret;

	struct stat st;

	/* off must be the region's lead, 0 for host memory. */
	if (off != r->lead || seg->fd < 0 || off % (uint64_t)pg ||
	    off + r->size > seg->desc.alloc_size)
		return -EINVAL;
	/* Pages past the file's end (a producer that shrank an unsealed file)
	 * would SIGBUS the engine on its next read: refuse them. */
	if (fstat(seg->fd, &st) < 0)
		return -errno;
	if (off + r->size > (((uint64_t)st.st_size + (uint64_t)pg - 1) & ~((uint64_t)pg - 1)))
		return -EINVAL;
	/* MAP_FIXED replaces the consumer's pages atomically: every pointer into
	 * the region now reads the producer's bytes.  Read-only, so a stray
	 * write by the engine faults instead of corrupting the trainer. */
	/* (A region whose addresses were given up maps only where nothing
	 * else was mapped meanwhile.) */
	p = mmap(r->addr, r->size, PROT_READ,
		 MAP_SHARED | (r->lost == 2 ? MAP_FIXED_NOREPLACE : MAP_FIXED), seg->fd, (off_t)off);
	if (p != MAP_FAILED && p != r->addr) {
		munmap(p, r->size); /* NOREPLACE taken as a hint (before 4.17) */
		return -EEXIST;
	}
	if (p != MAP_FAILED) {
		r->fixed = 1;
		r->lost = 0;
		return 0;
	}
	ret = -errno;
	if (r->lost == 2)
		return ret; /* nothing of the region's there to lose */
	/* POSIX lets a failed MAP_FIXED request leave the range partly
	 * unmapped (older Linux kernels removed the old mapping before the
	 * file's mmap hook could fail).  Intact: the region is as it was.
	 * Otherwise its bytes are gone: fresh memory keeps the reservation. */
	if (range_mapped(r->addr, r->size))
		return ret;
	wex_warn("host", "remap: mmap(MAP_FIXED) failed (%s) and left a hole at %p: "
		 "the region gets fresh memory, its bytes are lost", strerror(-ret), r->addr);
	r->fixed = 0;
	lose_or_refill(r);
	return -WEX_EDIRTY;
}

static int host_unmap_fixed(struct wex_mem_region *r)
{
	void *tmp;
	int ret;

	if (!r->fixed) {
		/* Lost in an earlier failure: fresh memory, bytes undefined. */
		if (!r->lost)
			return 0;
		ret = lose_or_refill(r);
		return ret ? ret : -WEX_EDIRTY;
	}
	/* Give the region private memory holding what it showed, swapped in
	 * with one mremap so that no reader sees a hole. */
	tmp = wex_mem_map_anon(r->size, 0);
	if (tmp == MAP_FAILED)
		return -errno;
	/* In huge pages where the kernel gives them, faulted in bulk: much
	 * faster than a fault per 4 KiB page during the copy.  A kernel
	 * without MADV_POPULATE_WRITE gets MAP_POPULATE (4 KiB pages). */
	if (wex_mem_populate(tmp, r->size, 1) < 0) {
		munmap(tmp, r->size);
		tmp = wex_mem_map_anon(r->size, MAP_POPULATE);
		if (tmp == MAP_FAILED)
			return -errno;
	}
	/* The producer's pages the region shows, faulted in with one call
	 * too (a mapping made by a same-address sync is new to this
	 * process, and the copy reads all of it). */
	(void)wex_mem_populate(r->addr, r->size, 0);
	ret = wex_mem_host_copy(&(struct wex_copy_op){ .src = (uint64_t)(uintptr_t)r->addr,
							 .dst = (uint64_t)(uintptr_t)tmp,
							 .len = r->size },
				1, 4);
	if (ret < 0) {
		munmap(tmp, r->size);
		return ret; /* still showing the producer's memory, unchanged */
	}
	if (mremap(tmp, r->size, r->size, MREMAP_MAYMOVE | MREMAP_FIXED, r->addr) != MAP_FAILED) {
		r->fixed = 0;
		return 0;
	}
	ret = -errno;
	/* mremap unmaps the target before moving: a move that fails after
	 * that leaves a hole.  tmp still holds the bytes: copy them into
	 * fresh memory there (a reader may have faulted in between). */
	if (range_mapped(r->addr, r->size)) {
		munmap(tmp, r->size);
		return ret; /* still showing the producer's memory */
	}
	wex_warn("host", "remap: mremap failed (%s) and left a hole at %p: refilling it by copy",
		 strerror(-ret), r->addr);
	r->fixed = 0;
	if (lose_or_refill(r)) {
		munmap(tmp, r->size);
		return -WEX_EDIRTY;
	}
	ret = wex_mem_host_copy(&(struct wex_copy_op){ .src = (uint64_t)(uintptr_t)tmp,
							 .dst = (uint64_t)(uintptr_t)r->addr,
							 .len = r->size },
				1, 4);
	munmap(tmp, r->size);
	return ret < 0 ? -WEX_EDIRTY : 0; /* fresh memory without the bytes */
}

static int host_unreserve(struct wex_mem_region *r)
{
	/* Given up addresses (lost = 2) may be another mapping's by now. */
	if (r->addr && r->lost != 2 && munmap(r->addr, r->size) < 0)
		return -errno;
	r->addr = NULL;
	return 0;
}

/* ---------------------------------------------------------------------- */
/* Copy executor.                                                          */

/*
 * Large copies use non-temporal (streaming) stores: they skip the read for
 * ownership of the destination and keep the cache for others.  glibc's
 * memcpy does the same only above a threshold of several MiB per call, and
 * the executor's calls are chunks of one tensor, below it.
 */
#define NT_MIN (256u << 10)

#if defined(__x86_64__)
#include <immintrin.h>

/* AVX2 variant: 128 bytes an iteration.  Chosen at run time, so the
 * binary still runs on CPUs without AVX2.  (Measured on the development
 * machine: a software prefetch or a 256-byte body made it slower.) */
__attribute__((target("avx2"))) static inline void nt128(char *dst, const char *src)
{
	__m256i a = _mm256_loadu_si256((const __m256i *)src);
	__m256i b = _mm256_loadu_si256((const __m256i *)(src + 32));
	__m256i c = _mm256_loadu_si256((const __m256i *)(src + 64));
	__m256i d = _mm256_loadu_si256((const __m256i *)(src + 96));

	_mm256_stream_si256((__m256i *)dst, a);
	_mm256_stream_si256((__m256i *)(dst + 32), b);
	_mm256_stream_si256((__m256i *)(dst + 64), c);
	_mm256_stream_si256((__m256i *)(dst + 96), d);
}

__attribute__((target("avx2"))) static void copy_nt_avx2(char *dst, const char *src, uint64_t len)
{
	/* Four pages in lockstep, as glibc's large copies do: four streams of
	 * write-combining buffers fill in parallel. */
	for (; len >= 4 * 4096; len -= 4 * 4096, dst += 4 * 4096, src += 4 * 4096)
		for (int off = 0; off < 4096; off += 128) {
			nt128(dst + off, src + off);
			nt128(dst + 4096 + off, src + 4096 + off);
			nt128(dst + 8192 + off, src + 8192 + off);
			nt128(dst + 12288 + off, src + 12288 + off);
		}
	for (; len >= 128; len -= 128, dst += 128, src += 128)
		nt128(dst, src);
	_mm_sfence();
	memcpy(dst, src, len);
}
#endif

#ifdef __SSE2__
static void copy_nt_sse2(char *dst, const char *src, uint64_t len)
{
	for (; len >= 64; len -= 64, dst += 64, src += 64) {
		__m128i a = _mm_loadu_si128((const __m128i *)src);
		__m128i b = _mm_loadu_si128((const __m128i *)(src + 16));
		__m128i c = _mm_loadu_si128((const __m128i *)(src + 32));
		__m128i d = _mm_loadu_si128((const __m128i *)(src + 48));

		_mm_stream_si128((__m128i *)dst, a);
		_mm_stream_si128((__m128i *)(dst + 16), b);
		_mm_stream_si128((__m128i *)(dst + 32), c);
		_mm_stream_si128((__m128i *)(dst + 48), d);
	}
	_mm_sfence();
	memcpy(dst, src, len);
}
#endif

static void copy_bytes(char *dst, const char *src, uint64_t len)
{
#ifdef __SSE2__
	if (len >= NT_MIN) {
		/* Streaming stores want an aligned destination. */
		uint64_t head = (64 - ((uintptr_t)dst & 63)) & 63;

		memcpy(dst, src, head);
#if defined(__x86_64__)
		/* Copy threads race to fill it in, with the same value. */
		static int have_avx2_cache = -1;
		int have_avx2 = __atomic_load_n(&have_avx2_cache, __ATOMIC_RELAXED);

		if (have_avx2 < 0) {
			have_avx2 = __builtin_cpu_supports("avx2");
			__atomic_store_n(&have_avx2_cache, have_avx2, __ATOMIC_RELAXED);
		}
		if (have_avx2) {
			copy_nt_avx2(dst + head, src + head, len - head);
			return;
		}
#endif
		copy_nt_sse2(dst + head, src + head, len - head);
		return;
	}
#endif
	memcpy(dst, src, len);
}

/*
 * Rows of one small element (a transpose: the destination contiguous along
 * one dim, the source along another) were one copy_bytes call and two
 * divisions each: 0.19 to 0.74 GB/s for 1- to 8-byte elements on the dev
 * VM against 13 to 15 GB/s of memcpy.  Here the rows are walked without
 * dividing, and up to PANEL whole runs of count[0] rows at a time go
 * through a buffer, a TILE x TILE block of elements after another: the
 * block is read along the source's contiguous dim into the buffer and
 * written along the destination's from it, each element a load and a
 * store of its constant size.  Read straight, a block's elements sat on
 * TILE lines a power of two apart (a [4096, 8192] tensor's rows): all in
 * one set of the L1 cache, which holds 8, evicted before their next
 * element was read.  PANEL runs at once (a block after another along
 * them, then the next TILE rows of each): 32 gave 1.7 GB/s for 2-byte
 * elements on the dev VM, 256 3.0, 1024 2.9 (tests/bench/host_transpose).
 */
#define SMALL_ELEM_MAX 16
#define TILE 32
#define PANEL 256

#define ELEM_LOOPS(N)                                                                        \
	static void copy_tile_##N(char *d, const char *s, int64_t d0, int64_t s0, int64_t d1, \
				  int64_t s1, uint64_t n0, uint64_t n1)                      \
	{                                                                                    \
		char buf[TILE][TILE][N];                                                    \
                                                                                             \
		for (uint64_t a = 0; a < n0; a += TILE)                                     \
			for (uint64_t b0 = 0; b0 < n1; b0 += TILE) {                        \
				uint64_t na = n0 - a < TILE ? n0 - a : TILE;                \
				uint64_t nb = n1 - b0 < TILE ? n1 - b0 : TILE;              \
				const char *sa = s + (int64_t)a * s0 + (int64_t)b0 * s1;    \
				char *da = d + (int64_t)a * d0 + (int64_t)b0 * d1;          \
                                                                                             \
				if (s1 == N && d0 == N) { /* a transpose */                 \
					/* (Constant sizes for whole blocks: inlined.) */   \
					for (uint64_t k = 0; k < na; k++)                   \
						if (nb == TILE)                             \
							memcpy(buf[k], sa + (int64_t)k * s0, TILE * N); \
						else                                        \
							memcpy(buf[k], sa + (int64_t)k * s0, nb * N); \
					for (uint64_t b = 0; b < nb; b++) {                 \
						char *db = da + (int64_t)b * d1;            \
                                                                                             \
						if (na == TILE)                             \
							for (uint64_t k = 0; k < TILE; k++) \
								memcpy(db + k * N, buf[k][b], N); \
						else                                        \
							for (uint64_t k = 0; k < na; k++)   \
								memcpy(db + k * N, buf[k][b], N); \
					}                                                   \
					continue;                                           \
				}                                                           \
				for (uint64_t k = 0; k < na; k++)                           \
					for (uint64_t b = 0; b < nb; b++)                   \
						memcpy(buf[k][b], sa + (int64_t)k * s0 + (int64_t)b * s1, N); \
				for (uint64_t b = 0; b < nb; b++)                           \
					for (uint64_t k = 0; k < na; k++)                   \
						memcpy(da + (int64_t)b * d1 + (int64_t)k * d0, buf[k][b], N); \
			}                                                                   \
	}
ELEM_LOOPS(1)
ELEM_LOOPS(2)
ELEM_LOOPS(4)
ELEM_LOOPS(8)
ELEM_LOOPS(16)

/* n1 runs of n0 elements of len bytes: run b's element k at b * d1 + k *
 * d0 (source: s1, s0). */
static void copy_tile(char *d, const char *s, uint64_t len, int64_t d0, int64_t s0, int64_t d1,
		      int64_t s1, uint64_t n0, uint64_t n1)
{
	switch (len) {
	case 1:
		copy_tile_1(d, s, d0, s0, d1, s1, n0, n1);
		return;
	case 2:
		copy_tile_2(d, s, d0, s0, d1, s1, n0, n1);
		return;
	case 4:
		copy_tile_4(d, s, d0, s0, d1, s1, n0, n1);
		return;
	case 8:
		copy_tile_8(d, s, d0, s0, d1, s1, n0, n1);
		return;
	case 16:
		copy_tile_16(d, s, d0, s0, d1, s1, n0, n1);
		return;
	}
	for (uint64_t b = 0; b < n1; b++)
		for (uint64_t k = 0; k < n0; k++)
			memcpy(d + (int64_t)b * d1 + (int64_t)k * d0, s + (int64_t)b * s1 + (int64_t)k * s0,
			       len);
}

/* copy_one for elements of SMALL_ELEM_MAX bytes at most, nouter >= 1. */
static void copy_small(const struct wex_copy_op *op, uint64_t first, uint64_t last)
{
	uint64_t c0 = op->count[0];
	uint64_t c1 = op->nouter > 1 ? op->count[1] : 1;
	int64_t s1 = op->nouter > 1 ? op->src_stride[1] : 0;
	int64_t d1 = op->nouter > 1 ? op->dst_stride[1] : 0;
	uint64_t row = first;

	while (row < last) {
		uint64_t i0 = row % c0, r1 = row / c0, i1 = r1 % c1, i2 = r1 / c1;
		int64_t so = (int64_t)i1 * s1, d = (int64_t)i1 * d1, n;

		if (op->nouter > 2) {
			so += (int64_t)i2 * op->src_stride[2];
			d += (int64_t)i2 * op->dst_stride[2];
		}
		so += (int64_t)i0 * op->src_stride[0];
		d += (int64_t)i0 * op->dst_stride[0];
		if (i0 == 0 && (n = (int64_t)((last - row) / c0)) > 1) {
			/* Whole runs of count[0] rows, of one i2. */
			uint64_t n1 = (uint64_t)n < c1 - i1 ? (uint64_t)n : c1 - i1;

			n1 = n1 < PANEL ? n1 : PANEL;
			copy_tile((char *)(uintptr_t)(op->dst + (uint64_t)d),
				  (const char *)(uintptr_t)(op->src + (uint64_t)so), op->len,
				  op->dst_stride[0], op->src_stride[0], d1, s1, c0, n1);
			row += n1 * c0;
			continue;
		}
		/* The rest of this run. */
		n = (int64_t)(c0 - i0 < last - row ? c0 - i0 : last - row);
		copy_tile((char *)(uintptr_t)(op->dst + (uint64_t)d),
			  (const char *)(uintptr_t)(op->src + (uint64_t)so), op->len, op->dst_stride[0],
			  op->src_stride[0], 0, 0, (uint64_t)n, 1);
		row += (uint64_t)n;
	}
}

static void copy_one(const struct wex_copy_op *op, uint64_t first, uint64_t last)
{
	/* Rows [first, last) of the op's flattened outer iteration space. */
	if (op->nouter > 0 && op->len <= SMALL_ELEM_MAX) {
		copy_small(op, first, last);
		return;
	}
	uint64_t c0 = op->nouter > 0 ? op->count[0] : 1;
	uint64_t c1 = op->nouter > 1 ? op->count[1] : 1;

	for (uint64_t row = first; row < last; row++) {
		uint64_t i0 = row % c0, r1 = row / c0;
		uint64_t i1 = r1 % c1, i2 = r1 / c1;
		int64_t so = 0, d = 0;

		if (op->nouter > 0) {
			so += (int64_t)i0 * op->src_stride[0];
			d += (int64_t)i0 * op->dst_stride[0];
		}
		if (op->nouter > 1) {
			so += (int64_t)i1 * op->src_stride[1];
			d += (int64_t)i1 * op->dst_stride[1];
		}
		if (op->nouter > 2) {
			so += (int64_t)i2 * op->src_stride[2];
			d += (int64_t)i2 * op->dst_stride[2];
		}
		copy_bytes((char *)(uintptr_t)(op->dst + (uint64_t)d),
			   (const char *)(uintptr_t)(op->src + (uint64_t)so), op->len);
	}
}

static uint64_t op_rows(const struct wex_copy_op *op)
{
	uint64_t r = 1;

	for (uint32_t i = 0; i < op->nouter && i < 3; i++)
		r *= op->count[i];
	return r;
}

/* Work is cut into chunks of about `chunk` bytes; each worker takes chunks
 * from a shared counter, so uneven tensors still keep every thread busy. */
struct copy_job {
	const struct wex_copy_op *ops;
	size_t n;
	uint64_t chunk;
	uint64_t total_chunks;
	uint64_t *op_first_chunk; /* prefix sums of chunks per op */
	uint64_t next;            /* atomic */
};

static void run_chunk(struct copy_job *j, uint64_t c)
{
	/* Find the op holding chunk c (binary search over prefix sums). */
	size_t lo = 0, hi = j->n;

	while (hi - lo > 1) {
		size_t mid = (lo + hi) / 2;

		if (j->op_first_chunk[mid] <= c)
			lo = mid;
		else
			hi = mid;
	}
	const struct wex_copy_op *op = &j->ops[lo];
	uint64_t k = c - j->op_first_chunk[lo];
	uint64_t nchunks = j->op_first_chunk[lo + 1] - j->op_first_chunk[lo];
	uint64_t rows = op_rows(op);

	if (rows == 1) {
		/* One long row: split its bytes. */
		uint64_t per = (op->len + nchunks - 1) / nchunks;
		uint64_t b = k * per, e = b + per > op->len ? op->len : b + per;

		if (b < e)
			copy_bytes((char *)(uintptr_t)(op->dst + b),
				   (const char *)(uintptr_t)(op->src + b), e - b);
		return;
	}
	uint64_t per = (rows + nchunks - 1) / nchunks;
	uint64_t b = k * per, e = b + per > rows ? rows : b + per;

	if (b < e)
		copy_one(op, b, e);
}

static void *copy_worker(void *arg)
{
	struct copy_job *j = arg;
	uint64_t c;

	while ((c = __atomic_fetch_add(&j->next, 1, __ATOMIC_RELAXED)) < j->total_chunks)
		run_chunk(j, c);
	return NULL;
}

static int host_copy_run(const struct wex_copy_op *ops, size_t n, int threads);

static uint64_t mag(int64_t x)
{
	return x < 0 ? -(uint64_t)x : (uint64_t)x;
}

void wex_mem_fold_op(struct wex_copy_op *op)
{
	uint32_t nd = op->nouter < 3 ? op->nouter : 3, n = 0;

	/* A dim of no index: no row, nothing to walk. */
	for (uint32_t i = 0; i < nd; i++)
		if (op->count[i] == 0)
			return;
	/* Dims of one index add nothing: dropped. */
	for (uint32_t i = 0; i < nd; i++) {
		if (op->count[i] == 1)
			continue;
		op->count[n] = op->count[i];
		op->src_stride[n] = op->src_stride[i];
		op->dst_stride[n] = op->dst_stride[i];
		n++;
	}
	op->nouter = n;
	/* Innermost (smallest destination stride, then source) first:
	 * count[0] is walked fastest, so rows next to each other in memory
	 * are copied one after another whatever order the op lists its dims
	 * in.  (Walked outermost first, each row a page from the one before,
	 * small rows copied and compared 3-6x slower.) */
	for (uint32_t i = 1; i < n; i++) {
		uint64_t c = op->count[i];
		int64_t ss = op->src_stride[i], ds = op->dst_stride[i];
		uint32_t j = i;

		for (; j > 0 && (mag(op->dst_stride[j - 1]) > mag(ds) ||
				 (mag(op->dst_stride[j - 1]) == mag(ds) &&
				  mag(op->src_stride[j - 1]) > mag(ss))); j--) {
			op->count[j] = op->count[j - 1];
			op->src_stride[j] = op->src_stride[j - 1];
			op->dst_stride[j] = op->dst_stride[j - 1];
		}
		op->count[j] = c;
		op->src_stride[j] = ss;
		op->dst_stride[j] = ds;
	}
	while (op->nouter > 0 && op->src_stride[0] == (int64_t)op->len &&
	       op->dst_stride[0] == (int64_t)op->len) {
		op->len *= op->count[0];
		for (uint32_t i = 1; i < op->nouter; i++) {
			op->count[i - 1] = op->count[i];
			op->src_stride[i - 1] = op->src_stride[i];
			op->dst_stride[i - 1] = op->dst_stride[i];
		}
		op->nouter--;
	}
}

int wex_mem_host_copy(const struct wex_copy_op *in, size_t n, int threads)
{
	struct wex_copy_op *ops;
	int ret;

	if (n == 0)
		return 0;
	ops = malloc(n * sizeof(*ops));
	if (!ops)
		return -ENOMEM;
	memcpy(ops, in, n * sizeof(*ops));
	for (size_t i = 0; i < n; i++)
		wex_mem_fold_op(&ops[i]);
	ret = host_copy_run(ops, n, threads);
	free(ops);
	return ret;
}

static int host_copy_run(const struct wex_copy_op *ops, size_t n, int threads)
{
	struct copy_job j = { .ops = ops, .n = n };
	pthread_t tid[64];
	int started = 0;
	uint64_t total = 0, chunk;

	if (n == 0)
		return 0;
	for (size_t i = 0; i < n; i++)
		total += ops[i].len * op_rows(&ops[i]);
	if (threads < 1)
		threads = 1;
	if (threads > 64)
		threads = 64;
	/* About four chunks per thread: few enough that each stream is long
	 * (measured: 64 MiB chunks beat 4 MiB ones by ~5%), enough that
	 * threads finishing early find work. */
	chunk = total / ((uint64_t)threads * 4);
	if (chunk < (4u << 20))
		chunk = 4u << 20;
	if (chunk > (64u << 20))
		chunk = 64u << 20;
	j.chunk = chunk;
	/* Small copies are not worth a thread start. */
	if (threads == 1 || total < (8u << 20)) {
		for (size_t i = 0; i < n; i++)
			copy_one(&ops[i], 0, op_rows(&ops[i]));
		return 0;
	}
	j.op_first_chunk = malloc((n + 1) * sizeof(uint64_t));
	if (!j.op_first_chunk)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++) {
		uint64_t bytes = ops[i].len * op_rows(&ops[i]);
		uint64_t rows = op_rows(&ops[i]);
		uint64_t c = (bytes + chunk - 1) / chunk;

		if (c == 0)
			c = 1;
		if (rows > 1 && c > rows)
			c = rows;
		j.op_first_chunk[i] = j.total_chunks;
		j.total_chunks += c;
	}
	j.op_first_chunk[n] = j.total_chunks;
	for (int t = 1; t < threads; t++) {
		if (pthread_create(&tid[started], NULL, copy_worker, &j) != 0)
			break;
		started++;
	}
	copy_worker(&j);
	for (int t = 0; t < started; t++)
		pthread_join(tid[t], NULL);
	free(j.op_first_chunk);
	return 0;
}

static int host_copy(const struct wex_copy_op *ops, size_t n, int threads)
{
	return wex_mem_host_copy(ops, n, threads);
}

const struct wex_mem_ops wex_mem_host_ops = {
	.name = "host",
	.kind = WEX_MEM_HOST,
	.probe = host_probe,
	.alloc = host_alloc,
	.wrap = host_wrap,
	.import = host_import,
	.release = host_release,
	.reserve = host_reserve,
	.map_fixed = host_map_fixed,
	.unmap_fixed = host_unmap_fixed,
	.unreserve = host_unreserve,
	.copy = host_copy,
	.wrap_chunks = wex_mem_enotsup_wrap_chunks,
	.import_chunks = wex_mem_enotsup_import_chunks,
	.sync_device = wex_mem_nop_sync_device,
	/* Host-to-host copies gain nothing from pinned buffers. */
	.host_pin = wex_mem_enotsup_host_pin,
	.host_unpin = wex_mem_enotsup_host_unpin,
};
