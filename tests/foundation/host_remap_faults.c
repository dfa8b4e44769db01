/* SPDX-License-Identifier: MIT */
/*
 * host_remap_faults - same-address remap on host memory when the kernel
 * call that swaps the pages fails.  POSIX lets a failed mmap(MAP_FIXED)
 * leave the target range partly unmapped (older Linux kernels removed the
 * old mapping before the file's mmap hook could fail), and mremap with
 * MREMAP_FIXED unmaps its target before moving.  This program interposes
 * mmap and mremap (fault injection: it defines them, calls the real ones
 * through dlsym(RTLD_NEXT) and fails the armed call) and checks the
 * backend's contract (vmm/backend.h) in every case:
 *  - map_fixed failing with the range intact returns the errno and leaves
 *    the region as it was (its own bytes, or the segment it showed);
 *  - map_fixed failing after unmapping the range returns -WEX_EDIRTY with
 *    fresh writable private memory there (no hole, fixed = 0), also when
 *    the region showed another segment; the next map_fixed works;
 *  - unmap_fixed whose mremap fails with the range intact returns the
 *    errno, still showing the producer (fixed = 1);
 *  - unmap_fixed whose mremap leaves a hole refills it: 0, fixed = 0, the
 *    bytes the region showed, private (a write does not reach the
 *    producer); when even the refill fails: -WEX_EDIRTY, nothing mapped,
 *    lost = 1; unmap_fixed of a lost region tries again (the error, or
 *    -WEX_EDIRTY with fresh memory), map_fixed can still map there, and
 *    unreserve still works;
 * and through libwex and wexd: a REMAP_FIXED sync whose swap loses the
 * region's bytes fails with -WEX_EDIRTY and says so, a COPY sync repairs
 * the weights, and a later REMAP_FIXED sync works; one that leaves nothing
 * mapped says that, a COPY sync that cannot map memory there either fails
 * with a clear error instead of faulting, and the next one repairs it;
 * with two regions, a failure on one still restores (copy sync) or undoes
 * (fixed sync, the region already shown included, one still showing
 * an older mapping, and one after the failing region that still shows the
 * producer since a failed restore) the other, so no region
 * shows the producer once the failed sync has given its lease back; and
 * when wexd restarted, and the trainer began its next version there,
 * before that undo copied what the region showed (the failed swap waits
 * for both here), the sync's release finds its lease gone, so the copy
 * may be a mix and the weights are dirty (they were called clean); and
 * when a fixed sync from copies of one version swaps one region, fails on
 * the other and undoes the first, which then holds the new version, the
 * weights are dirty too.  A region whose refill fails keeps its addresses
 * with no access (no other mapping lands there); where even that fails it
 * gives them up (lost = 2), and neither unmap_fixed, map_fixed nor
 * unreserve touches what the process maps there afterwards.  A reserve
 * of a size within a page or a huge page of 2^64 fails with -ENOMEM
 * (the sizes wrapped: it "succeeded" with next to nothing mapped).
 */
#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fixture.h"
#include "vmm/backend.h"

#define MODEL "remap-faults"

/* ---------------------------------------------------------------------- */
/* Fault injection.                                                        */

/* Fail leaving the range; unmap it, then fail; unmap its first half only. */
enum { F_NONE, F_KEEP, F_HOLE, F_HALF };

static int arm_fixed_file;  /* next mmap(MAP_FIXED) of a file */
static int skip_fixed_file; /* mmaps of a file to let through before arm_fixed_file fires */
static void (*on_fire)(void); /* run once by the next fault, before it fails the call */
static int arm_remap;       /* next mremap(MREMAP_FIXED) */
static int skip_remap;      /* mremaps to let through before arm_remap fires */
static int arm_refill;      /* next anonymous mmap at a fixed address: F_KEEP fails it */
static int refill_fails;    /* and this many more after it (ENOMEM) */
static int hits_fixed_file, hits_remap, hits_refill;

typedef void *(*mmap_fn)(void *, size_t, int, int, int, off_t);
typedef void *(*mremap_fn)(void *, size_t, size_t, int, ...);
static mmap_fn real_mmap;
static mremap_fn real_mremap;

/* Default visibility (the build hides symbols) and exported by the
 * executable (tests.cmake), so that libwex.so's calls land here too. */
#define INTERPOSE __attribute__((visibility("default")))

/* Fires the fault armed in *arm (counting it in *hits): runs on_fire,
 * then F_HOLE first unmaps [addr, addr+len), as a kernel may before
 * failing, F_HALF the first half of it. */
static void *fire(int *arm, int *hits, void *addr, size_t len)
{
	void (*f)(void) = on_fire;
	int how = *arm;

	*arm = F_NONE; /* disarmed first: on_fire's own calls go through */
	on_fire = NULL;
	if (f)
		f();
	if (how == F_HOLE)
		munmap(addr, len);
	else if (how == F_HALF)
		munmap(addr, len / 2);
	(*hits)++;
	errno = ENOMEM;
	return MAP_FAILED;
}

INTERPOSE void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
	if (!real_mmap)
		real_mmap = (mmap_fn)(uintptr_t)dlsym(RTLD_NEXT, "mmap");
	if ((flags & MAP_FIXED) && fd >= 0 && arm_fixed_file && skip_fixed_file > 0)
		skip_fixed_file--;
	else if ((flags & MAP_FIXED) && fd >= 0 && arm_fixed_file)
		return fire(&arm_fixed_file, &hits_fixed_file, addr, len);
	if ((flags & (MAP_FIXED | MAP_FIXED_NOREPLACE)) && (flags & MAP_ANONYMOUS) && arm_refill)
		return fire(&arm_refill, &hits_refill, addr, len);
	if ((flags & (MAP_FIXED | MAP_FIXED_NOREPLACE)) && (flags & MAP_ANONYMOUS) && refill_fails) {
		refill_fails--;
		errno = ENOMEM;
		return MAP_FAILED;
	}
	return real_mmap(addr, len, prot, flags, fd, off);
}

INTERPOSE void *mremap(void *old, size_t old_len, size_t new_len, int flags, ...)
{
	void *new_addr;
	va_list ap;

	if (!real_mremap)
		real_mremap = (mremap_fn)(uintptr_t)dlsym(RTLD_NEXT, "mremap");
	if (!(flags & MREMAP_FIXED))
		return real_mremap(old, old_len, new_len, flags);
	va_start(ap, flags);
	new_addr = va_arg(ap, void *);
	va_end(ap);
	if (arm_remap && skip_remap > 0)
		skip_remap--;
	else if (arm_remap)
		return fire(&arm_remap, &hits_remap, new_addr, new_len);
	return real_mremap(old, old_len, new_len, flags, new_addr);
}

/* ---------------------------------------------------------------------- */

/* The /proc/self/maps line covering addr into line; 0 when none does. */
static int map_line(const void *addr, char *out, size_t len)
{
	FILE *f = fopen("/proc/self/maps", "r");
	char line[512];
	unsigned long a = (unsigned long)addr;
	int hit = 0;

	T_ASSERT(f, "open /proc/self/maps");
	while (!hit && fgets(line, sizeof(line), f)) {
		unsigned long lo, hi;

		if (sscanf(line, "%lx-%lx", &lo, &hi) == 2 && lo <= a && a < hi) {
			snprintf(out, len, "%s", line);
			hit = 1;
		}
	}
	fclose(f);
	return hit;
}

/* Every page of [addr, addr+len) is mapped (checked page by page against
 * /proc/self/maps, independently of the msync test the backend uses). */
static int mapped(void *addr, size_t len)
{
	long pg = sysconf(_SC_PAGESIZE);
	char line[512];

	for (size_t o = 0; o < len; o += (size_t)pg)
		if (!map_line((char *)addr + o, line, sizeof(line)))
			return 0;
	return 1;
}

/* No page of [addr, addr+len) is mapped. */
/* Every page of [addr, addr+len) mapped with no access: the addresses a
 * lost region keeps (nothing else the process maps can land there). */
static int held(void *addr, size_t len)
{
	long pg = sysconf(_SC_PAGESIZE);
	char line[512];

	for (size_t o = 0; o < len; o += (size_t)pg)
		if (!map_line((char *)addr + o, line, sizeof(line)) || !strstr(line, " ---p "))
			return 0;
	return 1;
}

static int unmapped(void *addr, size_t len)
{
	long pg = sysconf(_SC_PAGESIZE);
	char line[512];

	for (size_t o = 0; o < len; o += (size_t)pg)
		if (map_line((char *)addr + o, line, sizeof(line)))
			return 0;
	return 1;
}

/* The mapping covering addr mentions `what` (e.g. "memfd:"). */
static int maps_has(void *addr, const char *what)
{
	char line[512];

	return map_line(addr, line, sizeof(line)) && strstr(line, what);
}

static int all_bytes(const void *p, size_t len, unsigned char v)
{
	const unsigned char *b = p;

	for (size_t i = 0; i < len; i++)
		if (b[i] != v)
			return 0;
	return 1;
}

#define SZ (1u << 20)

static void backend_cases(void)
{
	const struct wex_mem_ops *ops = &wex_mem_host_ops;
	struct wex_mem_seg a, b;
	struct wex_mem_region r;
	int ret;

	/* Sizes no address space holds: refused, not wrapped to small
	 * mappings (rounding up to a page, adding a huge page to align). */
	{
		static const uint64_t huge[] = { UINT64_MAX, UINT64_MAX - 4095,
						 UINT64_MAX - (1u << 20), UINT64_MAX - (2u << 20) };

		for (size_t i = 0; i < sizeof(huge) / sizeof(huge[0]); i++) {
			ret = ops->reserve(huge[i], 0, -1, &r);
			T_ASSERT(ret == -ENOMEM, "reserve of %#llx bytes: %s, not ENOMEM",
				 (unsigned long long)huge[i], wex_strerror(ret));
		}
		errno = 0;
		T_ASSERT(wex_mem_map_anon(UINT64_MAX - 4095, 0) == MAP_FAILED && errno == ENOMEM,
			 "wex_mem_map_anon of 2^64 - 4096 bytes: MAP_FAILED, ENOMEM (%s)",
			 strerror(errno));
	}
	T_ASSERT(ops->alloc(SZ, 0, &a) == 0 && ops->alloc(SZ, 0, &b) == 0, "two host segments");
	memset(a.ptr, 0xaa, SZ);
	memset(b.ptr, 0xbb, SZ);
	T_ASSERT(ops->reserve(SZ, 0, -1, &r) == 0, "reserve");
	memset(r.addr, 0x11, SZ);

	/* map_fixed fails, range intact: as it was. */
	arm_fixed_file = F_KEEP;
	ret = ops->map_fixed(&r, &a, 0);
	T_ASSERT(hits_fixed_file == 1, "the injected mmap failure was hit");
	T_ASSERT(ret == -ENOMEM, "map_fixed, range intact: -ENOMEM, got %s", wex_strerror(ret));
	T_ASSERT(!r.fixed && all_bytes(r.addr, SZ, 0x11), "the region keeps its own bytes");

	/* map_fixed fails after unmapping: fresh private memory, -WEX_EDIRTY. */
	arm_fixed_file = F_HOLE;
	ret = ops->map_fixed(&r, &a, 0);
	T_ASSERT(hits_fixed_file == 2, "the injected hole was hit");
	T_ASSERT(ret == -WEX_EDIRTY, "map_fixed, hole: -WEX_EDIRTY, got %s", wex_strerror(ret));
	T_ASSERT(!r.fixed, "fixed = 0 after a lost swap");
	T_ASSERT(mapped(r.addr, SZ), "no hole is left at the region");
	T_ASSERT(!maps_has(r.addr, "memfd:"), "the region is private memory again");
	memset(r.addr, 0x22, SZ); /* writable: no fault */
	T_ASSERT(all_bytes(a.ptr, SZ, 0xaa), "the producer's segment is untouched");

	/* The next swap works. */
	T_ASSERT(ops->map_fixed(&r, &a, 0) == 0 && r.fixed, "map_fixed after the repair");
	T_ASSERT(all_bytes(r.addr, SZ, 0xaa), "the region shows segment a");

	/* Switching to another segment fails, intact: still shows a. */
	arm_fixed_file = F_KEEP;
	ret = ops->map_fixed(&r, &b, 0);
	T_ASSERT(ret == -ENOMEM && r.fixed && all_bytes(r.addr, SZ, 0xaa),
		 "map_fixed of b, intact: -ENOMEM and still a (got %s)", wex_strerror(ret));

	/* Switching fails with a hole: fresh memory, fixed = 0. */
	arm_fixed_file = F_HOLE;
	ret = ops->map_fixed(&r, &b, 0);
	T_ASSERT(ret == -WEX_EDIRTY && !r.fixed && mapped(r.addr, SZ) &&
		 !maps_has(r.addr, "memfd:"),
		 "map_fixed of b, hole: -WEX_EDIRTY with private memory (got %s)", wex_strerror(ret));

	/* Half a hole (the rest still shows a): the whole region gets fresh
	 * private memory, the part still mapped included. */
	T_ASSERT(ops->map_fixed(&r, &a, 0) == 0, "map a");
	arm_fixed_file = F_HALF;
	ret = ops->map_fixed(&r, &b, 0);
	T_ASSERT(ret == -WEX_EDIRTY && !r.fixed && !r.lost && mapped(r.addr, SZ) &&
		 !maps_has(r.addr, "memfd:") && !maps_has((char *)r.addr + SZ / 2, "memfd:"),
		 "map_fixed of b, half a hole: -WEX_EDIRTY, all private (got %s)", wex_strerror(ret));
	memset(r.addr, 0x55, SZ); /* writable, both halves */
	T_ASSERT(all_bytes(a.ptr, SZ, 0xaa), "the producer's segment is untouched");

	/* unmap_fixed whose mremap fails, intact: still the producer's. */
	T_ASSERT(ops->map_fixed(&r, &a, 0) == 0, "map a again");
	arm_remap = F_KEEP;
	ret = ops->unmap_fixed(&r);
	T_ASSERT(hits_remap == 1, "the injected mremap failure was hit");
	T_ASSERT(ret == -ENOMEM && r.fixed && maps_has(r.addr, "memfd:wex-seg"),
		 "unmap_fixed, intact: -ENOMEM, still showing the producer (got %s)",
		 wex_strerror(ret));

	/* unmap_fixed whose mremap leaves a hole: refilled with the bytes. */
	arm_remap = F_HOLE;
	ret = ops->unmap_fixed(&r);
	T_ASSERT(hits_remap == 2, "the injected mremap hole was hit");
	T_ASSERT(ret == 0, "unmap_fixed, hole: refilled (0), got %s", wex_strerror(ret));
	T_ASSERT(!r.fixed && mapped(r.addr, SZ) && !maps_has(r.addr, "memfd:"),
		 "private memory at the region");
	T_ASSERT(all_bytes(r.addr, SZ, 0xaa), "holding the bytes it showed");
	memset(r.addr, 0x33, SZ);
	T_ASSERT(all_bytes(a.ptr, SZ, 0xaa), "a write to the region does not reach the producer");

	/* ... and when even the refill fails: -WEX_EDIRTY, nothing mapped. */
	T_ASSERT(ops->map_fixed(&r, &a, 0) == 0, "map a once more");
	arm_remap = F_HOLE;
	arm_refill = F_KEEP;
	ret = ops->unmap_fixed(&r);
	T_ASSERT(hits_refill == 1, "the injected refill failure was hit");
	T_ASSERT(ret == -WEX_EDIRTY && !r.fixed && r.lost == 1 && held(r.addr, SZ),
		 "unmap_fixed, hole and no memory: -WEX_EDIRTY, lost, addresses held with no access (got %s)",
		 wex_strerror(ret));
	/* A lost region: unmap_fixed tries again; the error while it can't. */
	arm_refill = F_KEEP;
	ret = ops->unmap_fixed(&r);
	T_ASSERT(hits_refill == 2 && ret == -ENOMEM && r.lost == 1 && held(r.addr, SZ),
		 "unmap_fixed of a lost region, still no memory: -ENOMEM, lost (got %s)",
		 wex_strerror(ret));
	ret = ops->unmap_fixed(&r);
	T_ASSERT(ret == -WEX_EDIRTY && !r.lost && !r.fixed && mapped(r.addr, SZ),
		 "unmap_fixed of a lost region: fresh memory, -WEX_EDIRTY (got %s)", wex_strerror(ret));
	memset(r.addr, 0x44, SZ); /* writable */
	T_ASSERT(ops->unmap_fixed(&r) == 0, "unmap_fixed of a repaired region: nothing to do");
	T_ASSERT(ops->unreserve(&r) == 0, "unreserve after a repaired region");

	/* map_fixed with a hole and no memory for the refill: same. */
	T_ASSERT(ops->reserve(SZ, 0, -1, &r) == 0, "reserve again");
	arm_fixed_file = F_HOLE;
	arm_refill = F_KEEP;
	ret = ops->map_fixed(&r, &a, 0);
	T_ASSERT(hits_refill == 3 && ret == -WEX_EDIRTY && !r.fixed && r.lost == 1 &&
		 held(r.addr, SZ),
		 "map_fixed, hole and no memory: -WEX_EDIRTY, lost, addresses held (got %s)",
		 wex_strerror(ret));
	/* A producer's memory can still be mapped there. */
	T_ASSERT(ops->map_fixed(&r, &a, 0) == 0 && r.fixed && !r.lost &&
		 all_bytes(r.addr, SZ, 0xaa), "map_fixed into a lost region");
	T_ASSERT(ops->unreserve(&r) == 0, "unreserve");

	/* ... and when not even the addresses can be held (lost = 2): what
	 * the process maps there later is never unmapped or replaced as the
	 * region's. */
	T_ASSERT(ops->reserve(SZ, 0, -1, &r) == 0, "reserve once more");
	arm_fixed_file = F_HOLE;
	arm_refill = F_KEEP;
	refill_fails = 1; /* the hold too */
	ret = ops->map_fixed(&r, &a, 0);
	T_ASSERT(ret == -WEX_EDIRTY && r.lost == 2 && unmapped(r.addr, SZ) && refill_fails == 0,
		 "map_fixed, hole, no memory, no hold: -WEX_EDIRTY, lost = 2, nothing there (got %s)",
		 wex_strerror(ret));
	{
		unsigned char *other = mmap(r.addr, SZ, PROT_READ | PROT_WRITE,
					    MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);

		T_ASSERT(other == r.addr, "another mapping lands on the given-up addresses");
		memset(other, 0x77, SZ);
		ret = ops->unmap_fixed(&r);
		T_ASSERT(ret < 0 && r.lost == 2 && all_bytes(other, SZ, 0x77),
			 "unmap_fixed leaves the other mapping alone (got %s)", wex_strerror(ret));
		ret = ops->map_fixed(&r, &a, 0);
		T_ASSERT(ret == -EEXIST && !r.fixed && all_bytes(other, SZ, 0x77),
			 "map_fixed does not replace it: -EEXIST (got %s)", wex_strerror(ret));
		T_ASSERT(ops->unreserve(&r) == 0 && all_bytes(other, SZ, 0x77),
			 "unreserve does not unmap it");
		munmap(other, SZ);
	}
	T_ASSERT(arm_fixed_file == F_NONE && arm_remap == F_NONE && arm_refill == F_NONE,
		 "every armed fault fired");
	T_ASSERT(ops->release(&a) == 0 && ops->release(&b) == 0, "release the segments");
}

static void client_cases(void)
{
	struct t_wexd d;
	struct t_prod p;
	struct t_cons k;
	struct wex_sync_result res;
	int ret, hits = hits_fixed_file, rhits;

	t_wexd_start(&d);
	t_prod_open(&p, MODEL, "tiny", 0, 1);
	t_cons_open(&k, MODEL, "g", "tiny", 0, 1);
	t_prod_write(&p, 1);

	/* The swap loses the region's bytes: the sync says so. */
	arm_fixed_file = F_HOLE;
	ret = wex_sync(k.c, WEX_SYNC_REMAP_FIXED, 1, 5000, &res);
	T_ASSERT(hits_fixed_file == hits + 1, "the consumer's swap hit the injected hole");
	T_ASSERT(ret == -WEX_EDIRTY, "REMAP_FIXED sync with a lost swap: -WEX_EDIRTY, got %s (%s)",
		 wex_strerror(ret), wex_last_error(k.c));
	T_ASSERT(strstr(wex_last_error(k.c), "bytes were lost"), "the error says the bytes are lost: %s",
		 wex_last_error(k.c));
	T_ASSERT(t_leases(d.sock, MODEL) == 0, "the failed sync holds no lease");
	T_ASSERT(!maps_has(k.region, "memfd:"), "the region is private memory");

	/* A copy sync repairs the weights in the region. */
	T_WEX(k.c, wex_sync(k.c, WEX_SYNC_COPY, 1, 5000, &res));
	T_ASSERT(t_own_bad(&k, 1) == 0, "the copy rewrote every weight");

	/* A lost swap with no memory to refill: the region has nothing
	 * mapped; a copy sync that cannot map memory there either fails with
	 * a clear error (no fault), the next one repairs it. */
	arm_fixed_file = F_HOLE;
	arm_refill = F_KEEP;
	ret = wex_sync(k.c, WEX_SYNC_REMAP_FIXED, 1, 5000, &res);
	T_ASSERT(ret == -WEX_EDIRTY && strstr(wex_last_error(k.c), "no memory could be mapped"),
		 "REMAP_FIXED sync leaving nothing mapped: -WEX_EDIRTY, says so (got %s: %s)",
		 wex_strerror(ret), wex_last_error(k.c));
	T_ASSERT(held(k.region, k.seg_bytes) && wex_is_dirty(k.c), "nothing usable mapped, dirty");
	arm_refill = F_KEEP;
	ret = wex_sync(k.c, WEX_SYNC_COPY, 1, 5000, &res);
	T_ASSERT(ret == -ENOMEM && strstr(wex_last_error(k.c), "has no memory of its own"),
		 "COPY sync into a lost region that stays lost: -ENOMEM, says so (got %s: %s)",
		 wex_strerror(ret), wex_last_error(k.c));
	T_ASSERT(arm_refill == F_NONE && wex_is_dirty(k.c), "the refill was tried; still dirty");
	T_ASSERT(t_leases(d.sock, MODEL) == 0, "the failed copy sync holds no lease");
	T_WEX(k.c, wex_sync(k.c, WEX_SYNC_COPY, 1, 5000, &res));
	T_ASSERT(!wex_is_dirty(k.c) && t_own_bad(&k, 1) == 0, "the next copy sync repairs the weights");

	/* Same-address remap works again (v2). */
	t_prod_write(&p, 2);
	T_WEX(k.c, wex_sync(k.c, WEX_SYNC_REMAP_FIXED, 2, 5000, &res));
	T_ASSERT(res.version == 2 && t_own_bad(&k, 2) == 0, "REMAP_FIXED after the repair reads v2");
	T_ASSERT(maps_has(k.region, "memfd:wex-seg"), "the region shows the producer's memfd");

	/* Back to copy mode with a hole in the mremap: the bytes stay. */
	rhits = hits_remap;
	arm_remap = F_HOLE;
	T_WEX(k.c, wex_sync(k.c, WEX_SYNC_COPY, 2, 5000, &res));
	T_ASSERT(hits_remap == rhits + 1, "the consumer's restore hit the hole");
	T_ASSERT(!maps_has(k.region, "memfd:") && t_own_bad(&k, 2) == 0,
		 "private memory holding v2 after the refill");
	T_ASSERT(t_leases(d.sock, MODEL) == 0, "no lease is left");

	t_cons_close(&k);
	t_prod_close(&p);
	t_wexd_stop(&d);
}

static void publish(wex_client_t *p, void *b0, void *b1, size_t n, uint64_t v)
{
	T_WEX(p, wex_begin_write(p, v, 5000));
	memset(b0, (int)v, n);
	memset(b1, (int)v, n);
	T_WEX(p, wex_publish(p, v));
}

/* on_fire for the restart case: wexd restarts without its lease journal
 * (as if the lease could not be written down), and the trainer begins v5
 * on the new one (no lease there) and writes the first half of a segment. */
static struct t_wexd *restart_d;
static wex_client_t *restart_p;
static void *restart_b;
static size_t restart_n;

static void restart_writing(void)
{
	t_wexd_kill(restart_d);
	T_ASSERT(t_journal_wipe(restart_d) == 1, "the remap lease was written down");
	t_wexd_restart(restart_d);
	T_WEX(restart_p, wex_begin_write(restart_p, 5, 5000));
	memset(restart_b, 5, restart_n / 2);
}

/* Two same-address regions: a failure on one never leaves the other
 * showing the producer after the lease is given back. */
static void two_regions(struct t_wexd *d)
{
	enum { N = 8192 };
	wex_client_t *p = t_open(WEX_ROLE_PRODUCER, MODEL "-2", NULL, 0, 1);
	wex_client_t *k = t_open(WEX_ROLE_CONSUMER, MODEL "-2", "g", 0, 1);
	struct wex_tensor pt[2], ct[2];
	struct wex_sync_result res;
	uint32_t s0, s1;
	void *b0, *b1, *r0, *r1;
	int ret;

	T_WEX(p, wex_segment_alloc(p, WEX_SEG_HOST, 0, N, &s0, &b0));
	T_WEX(p, wex_segment_alloc(p, WEX_SEG_HOST, 0, N, &s1, &b1));
	t_u8_tensor(&pt[0], "a", N, s0, 0);
	t_u8_tensor(&pt[1], "b", N, s1, 0);
	T_WEX(p, wex_register_tensors(p, pt, 2));
	publish(p, b0, b1, N, 1);
	T_WEX(k, wex_reserve(k, 0, s0, N, &r0));
	T_WEX(k, wex_reserve(k, 0, s1, N, &r1));
	ct[0] = pt[0];
	ct[0].ptr = r0;
	ct[1] = pt[1];
	ct[1].ptr = r1;
	T_WEX(k, wex_attach(k, ct, 2));
	T_WEX(k, wex_sync(k, WEX_SYNC_REMAP_FIXED, 1, 5000, &res));
	T_ASSERT(maps_has(r0, "memfd:") && maps_has(r1, "memfd:"), "both regions show the producer");

	/* A copy sync whose first restore fails (still showing the producer)
	 * still restores the second, then fails. */
	arm_remap = F_KEEP;
	ret = wex_sync(k, WEX_SYNC_COPY, 1, 5000, &res);
	T_ASSERT(ret == -ENOMEM && strstr(wex_last_error(k), "still shows the producer"),
		 "copy sync with a restore failing: -ENOMEM, says so (got %s: %s)", wex_strerror(ret),
		 wex_last_error(k));
	T_ASSERT(maps_has(r0, "memfd:"), "region a still shows the producer (its restore failed)");
	T_ASSERT(!maps_has(r1, "memfd:") && all_bytes(r1, N, 1),
		 "region b was restored all the same, holding v1");
	T_ASSERT(t_leases(d->sock, MODEL "-2") == 0, "the failed sync holds no lease");

	/* A REMAP_FIXED sync in which a is already shown (nothing to map)
	 * and b fails: a is undone too, so nothing shows the producer. */
	publish(p, b0, b1, N, 2);
	arm_fixed_file = F_KEEP;
	ret = wex_sync(k, WEX_SYNC_REMAP_FIXED, 2, 5000, &res);
	T_ASSERT(ret == -ENOMEM, "fixed sync with b's swap failing: -ENOMEM, got %s (%s)",
		 wex_strerror(ret), wex_last_error(k));
	T_ASSERT(!maps_has(r0, "memfd:") && !maps_has(r1, "memfd:"),
		 "after the failed sync neither region shows the producer");
	T_ASSERT(t_leases(d->sock, MODEL "-2") == 0, "and no lease is held");
	T_WEX(k, wex_sync(k, WEX_SYNC_REMAP_FIXED, 2, 5000, &res));
	T_ASSERT(all_bytes(r0, N, 2) && all_bytes(r1, N, 2), "the next fixed sync shows v2 in both");

	/* a lost (hole, no memory for a refill): b is still restored. */
	arm_remap = F_HOLE;
	arm_refill = F_KEEP;
	ret = wex_sync(k, WEX_SYNC_COPY, 2, 5000, &res);
	T_ASSERT(ret == -WEX_EDIRTY && strstr(wex_last_error(k), "has no memory of its own"),
		 "copy sync with a lost: -WEX_EDIRTY, says so (got %s: %s)", wex_strerror(ret),
		 wex_last_error(k));
	T_ASSERT(held(r0, N) && !maps_has(r1, "memfd:"), "a has nothing usable mapped, b is private");
	T_WEX(k, wex_sync(k, WEX_SYNC_COPY, 2, 5000, &res));
	T_ASSERT(!wex_is_dirty(k) && all_bytes(r0, N, 2) && all_bytes(r1, N, 2),
		 "the next copy sync repairs both");

	/* A region still showing an older mapping (its restore failed when a
	 * new table was fetched) whose swap fails too is undone as well. */
	T_WEX(k, wex_sync(k, WEX_SYNC_REMAP_FIXED, 2, 5000, &res));
	T_WEX(k, wex_release(k));
	T_WEX(p, wex_register_tensors(p, pt, 2)); /* a new table: the next sync fetches */
	publish(p, b0, b1, N, 3);
	arm_remap = F_KEEP;
	arm_fixed_file = F_KEEP;
	ret = wex_sync(k, WEX_SYNC_REMAP_FIXED, 3, 5000, &res);
	T_ASSERT(ret == -ENOMEM && arm_remap == F_NONE,
		 "fixed sync with a's restore and swap failing: -ENOMEM, got %s (%s)",
		 wex_strerror(ret), wex_last_error(k));
	T_ASSERT(!maps_has(r0, "memfd:") && !maps_has(r1, "memfd:"),
		 "after that failed sync neither region shows the producer");
	T_ASSERT(t_leases(d->sock, MODEL "-2") == 0, "and no lease is held");
	T_WEX(k, wex_sync(k, WEX_SYNC_REMAP_FIXED, 3, 5000, &res));
	T_ASSERT(all_bytes(r0, N, 3) && all_bytes(r1, N, 3), "the next fixed sync shows v3 in both");

	/* A region still showing the producer after a failed restore, placed
	 * after one whose swap fails: the sync gets no further than the
	 * first, and still undoes the second. */
	arm_remap = F_KEEP;
	skip_remap = 1; /* a's restore works, b's fails */
	ret = wex_sync(k, WEX_SYNC_COPY, 3, 5000, &res);
	T_ASSERT(ret == -ENOMEM && !maps_has(r0, "memfd:") && maps_has(r1, "memfd:"),
		 "copy sync with b's restore failing: a private, b shows the producer (got %s: %s)",
		 wex_strerror(ret), wex_last_error(k));
	publish(p, b0, b1, N, 4);
	arm_fixed_file = F_KEEP;
	ret = wex_sync(k, WEX_SYNC_REMAP_FIXED, 4, 5000, &res);
	T_ASSERT(ret == -ENOMEM, "fixed sync with a's swap failing: -ENOMEM, got %s (%s)",
		 wex_strerror(ret), wex_last_error(k));
	T_ASSERT(!maps_has(r0, "memfd:") && !maps_has(r1, "memfd:"),
		 "after the failed sync b (never reached) no longer shows the producer either");
	T_ASSERT(t_leases(d->sock, MODEL "-2") == 0, "and no lease is held");
	T_WEX(k, wex_sync(k, WEX_SYNC_REMAP_FIXED, 4, 5000, &res));
	T_ASSERT(all_bytes(r0, N, 4) && all_bytes(r1, N, 4), "the next fixed sync shows v4 in both");

	/* Both regions to map again (a copy sync restores them); a's swap
	 * works, b's fails, and just before it fails wexd restarts and the
	 * trainer begins v5 there and writes half of a's segment: undoing a
	 * copies that mix, after the lease went. */
	T_WEX(k, wex_sync(k, WEX_SYNC_COPY, 4, 5000, &res));
	T_ASSERT(!maps_has(r0, "memfd:") && !wex_is_dirty(k), "a copy sync of v4, clean");
	restart_d = d;
	restart_p = p;
	restart_b = b0;
	restart_n = N;
	on_fire = restart_writing;
	arm_fixed_file = F_KEEP;
	skip_fixed_file = 1;
	ret = wex_sync(k, WEX_SYNC_REMAP_FIXED, 4, 5000, &res);
	T_ASSERT(ret == -ENOMEM && !on_fire, "fixed sync with b's swap failing after a restart: "
		 "-ENOMEM, got %s (%s)", wex_strerror(ret), wex_last_error(k));
	T_ASSERT(!maps_has(r0, "memfd:") && !all_bytes(r0, N, 4) && !all_bytes(r0, N, 5),
		 "a was undone holding a mix of v4 and v5 (the race this case stages)");
	T_ASSERT(wex_is_dirty(k) == 1, "a holds what the trainer wrote after the restart took the "
		 "lease, but the weights are not dirty");
	memset(b0, 5, N);
	memset(b1, 5, N);
	T_WEX(p, wex_publish(p, 5));
	T_WEX(k, wex_sync(k, WEX_SYNC_REMAP_FIXED, 5, 5000, &res));
	T_ASSERT(all_bytes(r0, N, 5) && all_bytes(r1, N, 5) && !wex_is_dirty(k),
		 "the next fixed sync shows v5 in both, clean");

	/* From copies of v5, a fixed sync of v6 swaps a, fails on b (which
	 * keeps its own bytes), and undoes a, which then holds v6: two
	 * versions, so the weights are dirty (they were called clean v5). */
	T_WEX(k, wex_sync(k, WEX_SYNC_COPY, 5, 5000, &res));
	T_ASSERT(!wex_is_dirty(k) && all_bytes(r0, N, 5) && all_bytes(r1, N, 5), "copies of v5");
	publish(p, b0, b1, N, 6);
	arm_fixed_file = F_KEEP;
	skip_fixed_file = 1;
	ret = wex_sync(k, WEX_SYNC_REMAP_FIXED, 6, 5000, &res);
	T_ASSERT(ret == -ENOMEM, "fixed sync of v6 with b's swap failing: -ENOMEM, got %s (%s)",
		 wex_strerror(ret), wex_last_error(k));
	T_ASSERT(all_bytes(r0, N, 6) && all_bytes(r1, N, 5) && !maps_has(r0, "memfd:"),
		 "a was undone holding v6, b kept v5 (the mix this case stages)");
	T_ASSERT(wex_is_dirty(k) == 1, "a holds v6 and b v5, but the weights are not dirty");
	T_WEX(k, wex_sync(k, WEX_SYNC_REMAP_FIXED, 6, 5000, &res));
	T_ASSERT(all_bytes(r0, N, 6) && all_bytes(r1, N, 6) && !wex_is_dirty(k),
		 "the next fixed sync shows v6 in both, clean");
	T_WEX(k, wex_release(k));
	T_ASSERT(arm_remap == F_NONE && arm_refill == F_NONE && arm_fixed_file == F_NONE,
		 "every armed fault fired");
	wex_client_close(k);
	wex_client_close(p);
}

int main(void)
{
	struct t_wexd d;

	backend_cases();
	client_cases();
	t_wexd_start(&d);
	two_regions(&d);
	t_wexd_stop(&d);
	printf("host_remap_faults: ok\n");
	return 0;
}
