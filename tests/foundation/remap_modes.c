/* SPDX-License-Identifier: MIT */
/*
 * remap_modes - proves the three sync modes on host memory, one producer
 * and one consumer:
 *  - REMAP_FIXED replaces the consumer's reserved buffer in place: pointers
 *    taken before the sync now read the producer's bytes, at the same
 *    addresses (/proc/self/maps shows the producer's memfd there);
 *  - REMAP_VIEW hands out other addresses that read the producer's bytes;
 *  - COPY writes the consumer's own buffer (private memory again), and a
 *    later producer version does not change it (no aliasing);
 *  - REMAP_FIXED with a layout that differs (a tensor at another offset)
 *    fails with -WEX_ELAYOUT naming that tensor;
 *  - a failed sync gives its new lease back even when the consumer
 *    served an older version, and reports its own cause;
 *  - COPY right after REMAP_VIEW of the same version (a mode switch that
 *    keeps the lease), and COPY into newly attached buffers, write the
 *    consumer's buffers although that version is already served; a COPY
 *    of the version already copied copies nothing and reports 0 bytes
 *    and 0 ops;
 *  - wex_reserve of a size within a page of 2^64 fails with -ENOMEM;
 *  - a REMAP_FIXED sync that fails after its fetch gave the region its
 *    own memory back (the producer moved a tensor: -WEX_ELAYOUT) leaves
 *    the new version in the region and the old one outside it: the
 *    weights are dirty (they were called clean), until a COPY sync.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "fixture.h"

#define MODEL "modes"

/* The /proc/self/maps line of the mapping that starts at addr. */
static void map_of(void *addr, char *out, size_t len)
{
	FILE *f = fopen("/proc/self/maps", "r");
	char line[512];
	unsigned long a = (unsigned long)addr;

	out[0] = '\0';
	T_ASSERT(f, "open /proc/self/maps");
	while (fgets(line, sizeof(line), f)) {
		unsigned long lo, hi;

		if (sscanf(line, "%lx-%lx", &lo, &hi) == 2 && lo <= a && a < hi) {
			snprintf(out, len, "%s", line);
			break;
		}
	}
	fclose(f);
}

#define SZ 4096

/* Tensor A in a same-address region over the first `reserve` bytes of
 * the producer's segment of `seg_bytes`, B in the engine's own buffer
 * bbuf: v1 published, copied, then served same-address; the rollout's
 * lease released. */
struct mixed {
	wex_client_t *p, *c;
	struct wex_tensor t[2];
	unsigned char *base, *region;
	uint32_t seg;
};

static void mixed_open(struct mixed *m, const char *model, uint64_t seg_bytes, uint64_t reserve,
		       unsigned char *bbuf)
{
	struct wex_tensor l[2];
	struct wex_sync_result r;

	m->p = t_open(WEX_ROLE_PRODUCER, model, NULL, 0, 1);
	T_WEX(m->p, wex_segment_alloc(m->p, WEX_SEG_HOST, 0, seg_bytes, &m->seg, (void **)&m->base));
	t_u8_tensor(&m->t[0], "A", SZ, m->seg, 0);
	t_u8_tensor(&m->t[1], "B", SZ, m->seg, SZ);
	T_WEX(m->p, wex_register_tensors(m->p, m->t, 2));
	T_WEX(m->p, wex_begin_write(m->p, 1, 5000));
	memset(m->base, 1, seg_bytes);
	T_WEX(m->p, wex_publish(m->p, 1));
	m->c = t_open(WEX_ROLE_CONSUMER, model, NULL, 0, 1);
	T_WEX(m->c, wex_reserve(m->c, 0, m->seg, reserve, (void **)&m->region));
	l[0] = m->t[0];
	l[0].ptr = m->region;
	l[1] = m->t[1];
	l[1].ptr = bbuf;
	T_WEX(m->c, wex_attach(m->c, l, 2));
	T_WEX(m->c, wex_sync(m->c, WEX_SYNC_COPY, 1, 5000, &r));
	T_WEX(m->c, wex_sync(m->c, WEX_SYNC_REMAP_FIXED, 1, 5000, &r));
	T_ASSERT(m->region[0] == 1 && bbuf[0] == 1 && wex_is_dirty(m->c) == 0, "v1 served, clean");
	T_WEX(m->c, wex_release(m->c)); /* the rollout ends */
}

/* The producer moves A in its next version, so the same-address sync of
 * that version fails its layout check after the fetch gave the region
 * its memory back. */
static void fixed_fail_dirty(void)
{
	static unsigned char bbuf[SZ];
	struct wex_sync_result r;
	struct mixed m;
	int ret;

	mixed_open(&m, MODEL "-mixed", 4 * SZ, 4 * SZ, bbuf);
	/* v2: A at 2 * SZ; offset 0 holds something else. */
	T_WEX(m.p, wex_begin_write(m.p, 2, 5000));
	m.t[0].offset = 2 * SZ;
	T_WEX(m.p, wex_register_tensors(m.p, m.t, 2));
	memset(m.base, 0x77, 4 * SZ);
	memset(m.base + SZ, 2, SZ);
	memset(m.base + 2 * SZ, 2, SZ);
	T_WEX(m.p, wex_publish(m.p, 2));

	ret = wex_sync(m.c, WEX_SYNC_REMAP_FIXED, 0, 5000, &r);
	T_ASSERT(ret == -WEX_ELAYOUT, "same-address sync of the moved tensor: %s, not ELAYOUT",
		 wex_strerror(ret));
	T_ASSERT(m.region[0] == 0x77 && bbuf[0] == 1,
		 "the region holds the producer's new bytes (%#x), B still v1 (%d)", m.region[0],
		 bbuf[0]);
	T_ASSERT(wex_is_dirty(m.c) == 1, "mixed weights after the failed sync are dirty, got %d",
		 wex_is_dirty(m.c));
	printf("failed same-address sync after its fetch restored the region: dirty (%s)\n",
	       wex_last_error(m.c));
	/* A copy repairs them. */
	T_WEX(m.c, wex_sync(m.c, WEX_SYNC_COPY, 2, 5000, &r));
	T_ASSERT(m.region[0] == 2 && bbuf[0] == 2 && wex_is_dirty(m.c) == 0, "copy of v2: clean");
	wex_client_close(m.c);
	wex_client_close(m.p);
}

/* The same with a view sync that succeeds: its fetch gives the region
 * its own memory back holding v2 (the producer re-registered its table),
 * B holds v1: the engine's own weights are mixed, dirty until a copy. */
static void view_after_fixed_dirty(void)
{
	static unsigned char bbuf[SZ];
	struct wex_sync_result r;
	struct mixed m;

	mixed_open(&m, MODEL "-viewmix", 2 * SZ, SZ, bbuf);
	T_WEX(m.p, wex_begin_write(m.p, 2, 5000));
	T_WEX(m.p, wex_register_tensors(m.p, m.t, 2)); /* a new table: the engine fetches again */
	memset(m.base, 2, 2 * SZ);
	T_WEX(m.p, wex_publish(m.p, 2));
	T_WEX(m.c, wex_sync(m.c, WEX_SYNC_REMAP_VIEW, 2, 5000, &r));
	T_ASSERT(r.version == 2 && m.region[0] == 2 && bbuf[0] == 1,
		 "view of v2: the region holds v2 (%d), B v1 (%d)", m.region[0], bbuf[0]);
	T_ASSERT(wex_is_dirty(m.c) == 1, "the engine's own weights are mixed after the view sync "
		 "restored its region: dirty, got %d", wex_is_dirty(m.c));
	T_WEX(m.c, wex_release(m.c));
	T_WEX(m.c, wex_sync(m.c, WEX_SYNC_COPY, 2, 5000, &r));
	T_ASSERT(r.changed && m.region[0] == 2 && bbuf[0] == 2 && wex_is_dirty(m.c) == 0,
		 "copy of v2 after it: every byte copied, clean");
	wex_client_close(m.c);
	wex_client_close(m.p);
}

int main(void)
{
	struct t_wexd d;
	struct t_prod p;
	struct t_cons k, k2;
	struct wex_sync_result r;
	char map[512];
	void *before[512], *vp;
	struct wex_tensor vd;
	int ret;

	t_tiny_v1(&d, &p, &k, MODEL);
	T_ASSERT(k.n <= 512, "model size");
	ret = wex_reserve(k.c, 0, p.t[0].segment, UINT64_MAX - 4095, &vp);
	T_ASSERT(ret == -ENOMEM, "reserve of 2^64 - 4096 bytes: %s (%s), not ENOMEM",
		 wex_strerror(ret), wex_last_error(k.c));

	/* REMAP_FIXED: same addresses, producer's bytes. */
	for (int i = 0; i < k.n; i++)
		before[i] = k.t[i].ptr;
	map_of(k.region, map, sizeof(map));
	T_ASSERT(!strstr(map, "memfd:"), "the reserved region starts as private memory: %s", map);
	T_WEX(k.c, wex_sync(k.c, WEX_SYNC_REMAP_FIXED, 1, 5000, &r));
	T_ASSERT(r.version == 1, "fixed sync got v%llu", (unsigned long long)r.version);
	for (int i = 0; i < k.n; i++)
		T_ASSERT(k.t[i].ptr == before[i], "tensor %d's address unchanged", i);
	T_ASSERT(t_own_bad(&k, 1) == 0, "pointers taken before the fixed sync read v1");
	T_ASSERT(memcmp(k.region, p.base, p.seg_bytes) == 0, "the region shows the producer's segment");
	map_of(k.region, map, sizeof(map));
	T_ASSERT(strstr(map, "memfd:wex-seg"), "the region is the producer's memfd now: %s", map);
	T_WEX(k.c, wex_view(k.c, 0, k.t[0].name, &vp, &vd));

	/* REMAP_VIEW: other addresses, the producer's bytes. */
	T_WEX(k.c, wex_sync(k.c, WEX_SYNC_REMAP_VIEW, 1, 5000, &r));
	T_ASSERT(t_view_bad(&k, 0, 1) == 0, "view pointers read v1");
	T_WEX(k.c, wex_view(k.c, 0, k.t[0].name, &vp, &vd));
	T_ASSERT(vp != k.t[0].ptr && vp == vd.ptr, "a view is at its own address");
	T_ASSERT(memcmp(vp, (char *)p.base + p.t[0].offset, wex_tensor_nbytes(&p.t[0])) == 0,
		 "the view reads the producer's bytes");
	T_WEX(k.c, wex_release(k.c));

	/* COPY: the consumer's own memory; no aliasing. */
	t_prod_write(&p, 2);
	T_WEX(k.c, wex_sync(k.c, WEX_SYNC_COPY, 2, 5000, &r));
	T_ASSERT(r.version == 2 && r.changed, "copy sync of v2");
	for (int i = 0; i < k.n; i++)
		T_ASSERT(k.t[i].ptr == before[i], "copy keeps tensor %d's address", i);
	T_ASSERT(t_own_bad(&k, 2) == 0, "the consumer's buffer holds v2");
	map_of(k.region, map, sizeof(map));
	T_ASSERT(!strstr(map, "memfd:"), "after a copy the region is private memory again: %s", map);
	T_ASSERT(t_leases(d.sock, MODEL) == 0, "a copy sync releases its lease");
	t_prod_write(&p, 3);
	T_ASSERT(t_own_bad(&k, 2) == 0, "the consumer's copy still holds v2 after the producer wrote v3");
	T_ASSERT(t_own_bad(&k, 3) != 0, "and does not show v3");
	ret = wex_sync(k.c, WEX_SYNC_REMAP_FIXED, 3, 5000, &r);
	T_ASSERT(ret == 0 && r.version == 3 && t_own_bad(&k, 3) == 0, "fixed again after copy: %s",
		 wex_strerror(ret));
	T_WEX(k.c, wex_release(k.c));

	/* A layout that differs: tensor 2 (q_proj.bias, 128 bytes in a
	 * 256-byte slot) 128 bytes further on, overlapping nothing. */
	t_cons_open(&k2, MODEL, "shifted", "tiny", 0, 1);
	T_ASSERT(wex_tensor_nbytes(&k2.t[2]) == 128, "tensor 2 is 128 bytes");
	k2.t[2].ptr = (char *)k2.t[2].ptr + 128;
	T_WEX(k2.c, wex_attach(k2.c, k2.t, (size_t)k2.n));
	ret = wex_sync(k2.c, WEX_SYNC_REMAP_FIXED, 3, 5000, &r);
	T_ASSERT(ret == -WEX_ELAYOUT, "fixed remap with a shifted tensor: -WEX_ELAYOUT, got %s",
		 wex_strerror(ret));
	T_ASSERT(strstr(wex_last_error(k2.c), k2.t[2].name), "the error names '%s': %s", k2.t[2].name,
		 wex_last_error(k2.c));
	printf("ELAYOUT: %s\n", wex_last_error(k2.c));
	map_of(k2.region, map, sizeof(map));
	T_ASSERT(!strstr(map, "memfd:"), "the refused region stays private: %s", map);
	T_ASSERT(t_leases(d.sock, MODEL) == 0, "a failed sync leaves no lease");
	/* The same consumer can still copy (the plan handles any layout). */
	T_WEX(k2.c, wex_sync(k2.c, WEX_SYNC_COPY, 3, 5000, &r));
	T_ASSERT(t_own_bad(&k2, 3) == 0, "the shifted layout copies v3 exactly");

	/* View, then copy of the same version (a switch of mode that keeps
	 * the lease), into plain buffers (no reserved region): the copy must
	 * write them although that version is already "served". */
	{
		wex_client_t *c3 = t_open(WEX_ROLE_CONSUMER, MODEL, "plain", 0, 1);
		struct wex_tensor *mine = calloc((size_t)k.n, sizeof(*mine));
		char *buf = calloc(1, k.seg_bytes), *buf2 = calloc(1, k.seg_bytes);

		T_ASSERT(mine && buf && buf2, "calloc");
		for (int i = 0; i < k.n; i++) {
			mine[i] = k.t[i];
			mine[i].ptr = buf + k.t[i].offset;
		}
		T_WEX(c3, wex_attach(c3, mine, (size_t)k.n));
		T_WEX(c3, wex_sync(c3, WEX_SYNC_REMAP_VIEW, 3, 5000, &r));
		T_WEX(c3, wex_sync(c3, WEX_SYNC_COPY, 3, 5000, &r));
		T_ASSERT(r.version == 3 && ex_check(NULL, mine, (size_t)k.n, 3, 1) == 0,
			 "a copy sync after a view sync of the same version fills the buffers");
		/* New buffers for the same version: copied again. */
		for (int i = 0; i < k.n; i++)
			mine[i].ptr = buf2 + k.t[i].offset;
		T_WEX(c3, wex_attach(c3, mine, (size_t)k.n));
		T_WEX(c3, wex_sync(c3, WEX_SYNC_COPY, 3, 5000, &r));
		T_ASSERT(ex_check(NULL, mine, (size_t)k.n, 3, 1) == 0,
			 "a copy sync into newly attached buffers fills them");
		T_ASSERT(r.changed && r.bytes > 0 && r.ops > 0, "that copy reports %llu bytes, %llu ops",
			 (unsigned long long)r.bytes, (unsigned long long)r.ops);
		/* Once more: nothing to copy, and no op executed. */
		T_WEX(c3, wex_sync(c3, WEX_SYNC_COPY, 3, 5000, &r));
		T_ASSERT(!r.changed && r.bytes == 0 && r.ops == 0,
			 "a copy sync of the version already copied: changed %d, %llu bytes, %llu ops, "
			 "not 0, 0, 0", r.changed, (unsigned long long)r.bytes,
			 (unsigned long long)r.ops);
		wex_client_close(c3);
		free(mine);
		free(buf);
		free(buf2);
	}

	/* A failed sync of a consumer that already served a version (k2 holds
	 * v3): the new lease (v4) is given back, so the producer writes on,
	 * and the error says why the sync failed, not how the release went. */
	t_prod_write(&p, 4);
	ret = wex_sync(k2.c, WEX_SYNC_REMAP_FIXED, 4, 5000, &r);
	T_ASSERT(ret == -WEX_ELAYOUT, "fixed remap of v4 with a shifted tensor: -WEX_ELAYOUT, got %s",
		 wex_strerror(ret));
	T_ASSERT(strstr(wex_last_error(k2.c), k2.t[2].name), "the v4 error names '%s': %s",
		 k2.t[2].name, wex_last_error(k2.c));
	T_ASSERT(t_leases(d.sock, MODEL) == 0, "the failed v4 sync leaves no lease");
	T_WEX(p.c, wex_begin_write(p.c, 5, 2000));
	ex_fill(p.base, p.t, (size_t)p.n, 5, 1);
	T_WEX(p.c, wex_publish(p.c, 5));

	fixed_fail_dirty();
	view_after_fixed_dirty();

	t_cons_close(&k2);
	t_cons_close(&k);
	t_prod_close(&p);
	t_wexd_stop(&d);
	return T_EXIT_PASS;
}
