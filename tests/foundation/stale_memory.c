/* SPDX-License-Identifier: MIT */
/*
 * stale_memory - proves that a sync never labels other memory with a
 * version: when the memory behind a published version goes (the producer
 * dies and a successor registers fresh memory, or the producer registers
 * other tensors after publishing),
 *  - a held view lease re-synced on that version is not kept: the sync
 *    waits for a new version (times out while none is published), and a
 *    copy sync does the same; once the successor publishes v2 they get v2;
 *  - a consumer group caught mid-round (rank 0 took v1, rank 1 had not)
 *    does not split: rank 1 is refused with -ESTALE naming the lost v1
 *    until rank 0 syncs again; then both get v2, every byte checked;
 *  - the same after a re-registration of other tensors (no crash), and
 *    wexd logs it.
 */
#include <errno.h>
#include <string.h>

#include "fixture.h"

/* A producer of `model` that published v1, a viewer holding it, and a
 * two-rank group whose rank 0 copied it while rank 1 has not synced. */
static void v1_held(struct t_prod *p, struct t_cons *v, struct t_cons *k0, struct t_cons *k1,
		    const char *model, struct wex_sync_result *r, struct wex_sync_result *r0)
{
	t_prod_open(p, model, "tiny", 0, 1);
	t_prod_write(p, 1);
	t_cons_open(v, model, "viewer", "tiny", 0, 1);
	t_cons_open_from(k0, model, "g", "tiny", 0, 2, 0);
	t_cons_open_from(k1, model, "g", "tiny", 1, 2, 0);
	T_WEX(v->c, wex_sync(v->c, WEX_SYNC_REMAP_VIEW, 1, 5000, r));
	T_ASSERT(r->version == 1 && t_view_bad(v, 0, 1) == 0, "viewer holds v1");
	T_WEX(k0->c, wex_sync(k0->c, WEX_SYNC_COPY, 1, 5000, r0));
	T_ASSERT(r0->version == 1 && t_own_bad(k0, 1) == 0, "group rank 0 copied v1");
}

static void producer_dies(struct t_wexd *d)
{
	struct t_prod p, q;
	struct t_cons v, k0, k1;
	struct wex_sync_result r, r0, r1;
	int ret;

	v1_held(&p, &v, &k0, &k1, "dies", &r, &r0);

	t_prod_close(&p); /* the trainer dies; its successor loads other bytes */
	t_prod_open(&q, "dies", "tiny", 0, 1);
	ex_fill(q.base, q.t, (size_t)q.n, 7, 1);
	ret = wex_sync(v.c, WEX_SYNC_REMAP_VIEW, 1, 300, &r);
	T_ASSERT(ret == -ETIMEDOUT, "re-sync of v1 after its memory went: -ETIMEDOUT, got %s (v%llu)",
		 wex_strerror(ret), (unsigned long long)r.version);
	ret = wex_sync(v.c, WEX_SYNC_COPY, 1, 300, &r);
	T_ASSERT(ret == -ETIMEDOUT, "copy sync of v1 after its memory went: -ETIMEDOUT, got %s",
		 wex_strerror(ret));
	t_prod_write(&q, 2);
	ret = wex_sync(k1.c, WEX_SYNC_COPY, 1, 2000, &r1);
	T_ASSERT(ret == -ESTALE, "group rank 1 while rank 0 holds the lost v1: -ESTALE, got %s",
		 wex_strerror(ret));
	T_ASSERT(strstr(wex_last_error(k1.c), "v1"), "the refusal names v1: %s", wex_last_error(k1.c));
	printf("rank 1 refused: %s\n", wex_last_error(k1.c));
	T_WEX(k0.c, wex_sync(k0.c, WEX_SYNC_COPY, 1, 5000, &r0));
	T_WEX(k1.c, wex_sync(k1.c, WEX_SYNC_COPY, 1, 5000, &r1));
	T_ASSERT(r0.version == 2 && r1.version == 2, "the group moves on together: v%llu and v%llu",
		 (unsigned long long)r0.version, (unsigned long long)r1.version);
	T_ASSERT(t_own_bad(&k0, 2) == 0 && t_own_bad(&k1, 2) == 0, "both ranks hold v2");
	T_WEX(v.c, wex_sync(v.c, WEX_SYNC_REMAP_VIEW, 1, 5000, &r));
	T_ASSERT(r.version == 2 && t_view_bad(&v, 0, 2) == 0, "viewer now reads v2");
	t_cons_close(&v);
	t_cons_close(&k0);
	t_cons_close(&k1);
	t_prod_close(&q);
}

static void producer_reregisters(struct t_wexd *d)
{
	struct t_prod p;
	struct t_cons v, k0, k1;
	struct wex_sync_result r, r0, r1;
	uint32_t seg;
	void *base;
	int ret;

	v1_held(&p, &v, &k0, &k1, "rereg", &r, &r0);
	/* The trainer moves its weights to a new segment, already holding
	 * other values, and registers them there. */
	T_WEX(p.c, wex_segment_alloc(p.c, WEX_SEG_HOST, 0, p.seg_bytes, &seg, &base));
	for (int i = 0; i < p.n; i++)
		p.t[i].segment = seg;
	ex_fill(base, p.t, (size_t)p.n, 5, 1);
	T_WEX(p.c, wex_register_tensors(p.c, p.t, (size_t)p.n));
	p.base = base;
	ret = wex_sync(k1.c, WEX_SYNC_COPY, 1, 300, &r1);
	T_ASSERT(ret == -ESTALE, "group rank 1 after the re-registration: -ESTALE, got %s (v%llu)",
		 wex_strerror(ret), (unsigned long long)r1.version);
	ret = wex_sync(v.c, WEX_SYNC_REMAP_VIEW, 1, 300, &r);
	T_ASSERT(ret == -ETIMEDOUT, "viewer's re-sync of v1: -ETIMEDOUT, got %s", wex_strerror(ret));
	t_prod_write(&p, 2);
	T_WEX(k0.c, wex_sync(k0.c, WEX_SYNC_COPY, 1, 5000, &r0));
	T_WEX(k1.c, wex_sync(k1.c, WEX_SYNC_COPY, 1, 5000, &r1));
	T_ASSERT(r0.version == 2 && r1.version == 2 && t_own_bad(&k0, 2) == 0 &&
			 t_own_bad(&k1, 2) == 0,
		 "the group holds v2 from the new segment");
	T_WEX(v.c, wex_sync(v.c, WEX_SYNC_REMAP_VIEW, 1, 5000, &r));
	T_ASSERT(r.version == 2 && t_view_bad(&v, 0, 2) == 0, "viewer reads v2");
	t_cons_close(&v);
	t_cons_close(&k0);
	t_cons_close(&k1);
	t_prod_close(&p);
}

int main(void)
{
	struct t_wexd d;

	t_wexd_start(&d);
	t_check_backend(d.sock);
	producer_dies(&d);
	producer_reregisters(&d);
	t_wexd_stop(&d);
	printf("stale_memory: PASS\n");
	t_exit(T_EXIT_PASS);
}
