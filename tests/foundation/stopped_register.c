/* SPDX-License-Identifier: MIT */
/*
 * stopped_register - a registration call of its own (wex_register_tensors,
 * wex_segment_alloc, wex_attach) to a wexd that stops answering on a live
 * connection (SIGSTOP here; a deadlock alike) ends 3 s (HUNG_GRACE_MS)
 * after a signal (-EINTR, WEX_CLIENT_EINTR) or a wex_cancel (-ECANCELED,
 * which answers 1 for it), nothing of it kept; before, each waited for
 * the client's timeout plus 5 s (35 s), signal or not.  The connection is
 * dropped, as at that timeout, and wexd forgets what was registered on
 * it.  A consumer that held a same-address lease when its attach was
 * given up is told the lease went with the connection, and its regions
 * got private memory back holding what they showed (weights dirty): the
 * producer's next write does not reach them.  Once wexd goes on
 * (SIGCONT), each call made again succeeds
 * (reconnecting first: the client's segments, tensor table and layout
 * registered again), a segment allocated then gets the id the given-up
 * one would have had, and the engines copy the next versions whole,
 * from a tensor table in that new segment too.
 */
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fixture.h"

enum { TENSORS, SEGMENT, ATTACH };

static const char *op_name(int op)
{
	return op == TENSORS ? "register_tensors" : op == SEGMENT ? "segment_alloc" : "attach";
}

/* The call op on c; *id, *base: the segment's. */
static int call(int op, wex_client_t *c, struct t_prod *p, struct t_cons *k, uint32_t *id,
		void **base)
{
	return op == TENSORS ? wex_register_tensors(c, p->t, (size_t)p->n) :
	       op == SEGMENT ? wex_segment_alloc(c, WEX_SEG_HOST, 0, p->seg_bytes, id, base) :
			       wex_attach(c, k->t, (size_t)k->n);
}

/* One kick at 0.3 s: a signal to this thread, or a wex_cancel.  The call
 * must end 3 s after it, with -EINTR or -ECANCELED. */
static void kicked(int op, wex_client_t *c, struct t_prod *p, struct t_cons *k, int cancel)
{
	struct t_kick kk;
	uint32_t id = 77;
	void *base = NULL;
	double t0 = t_now(), el;
	int ret, want = cancel ? -ECANCELED : -EINTR;

	t_kick_start(&kk, 300000, cancel ? c : NULL, NULL, NULL);
	ret = call(op, c, p, k, &id, &base);
	el = t_now() - t0;
	t_kick_join(&kk, 0);
	printf("%s, wexd stopped, one %s at 0.3 s: %s after %.2f s: %s\n", op_name(op),
	       cancel ? "wex_cancel" : "signal", wex_strerror(ret), el, wex_last_error(c));
	T_ASSERT(ret == want && el >= 3.3 && el < 8.0,
		 "%s: %s after %.2f s, not %s 3.3 to 8 s after its start", op_name(op),
		 wex_strerror(ret), el, wex_strerror(want));
	T_ASSERT(strstr(wex_last_error(c), op == SEGMENT ? "register_segment" : op_name(op)) &&
			 strstr(wex_last_error(c), "call it again"),
		 "%s: the error names the request and says to call again: %s", op_name(op),
		 wex_last_error(c));
	T_ASSERT(id == 77 && base == NULL, "%s: nothing given back", op_name(op));
}

/* wex_cancel from another thread during a registration answers 1 (it
 * ends the call here, nothing asked of wexd). */
static void cancel_answer(void *arg)
{
	int ret = wex_cancel(arg);

	if (ret != 1)
		T_FAIL("wex_cancel during a registration answered %d, not 1", ret);
}

int main(void)
{
	struct wex_sync_result r;
	struct t_wexd d;
	struct t_prod p, p2;
	struct t_cons k, k2;
	struct t_kick kk;
	uint32_t id = 0, id0;
	void *base = NULL;
	double t0;

	t_usr1_noop();
	t_client_flags = WEX_CLIENT_EINTR;
	t_tiny_v1(&d, &p, &k, "stopreg");
	/* (A lease held: the producer's memory shown in k's regions.) */
	T_WEX(k.c, wex_sync(k.c, WEX_SYNC_REMAP_FIXED, 1, 5000, &r));
	/* A second model, its producer with one segment so far. */
	t_prod_open(&p2, "stopreg2", "tiny", 0, 1);
	t_cons_open(&k2, "stopreg2", "g", "tiny", 0, 1);
	t_prod_write(&p2, 1);
	T_WEX(k2.c, wex_sync(k2.c, WEX_SYNC_COPY, 1, 5000, &r));
	T_ASSERT(p2.t[0].segment == 0, "p2's tensors are in segment 0");
	T_ASSERT(kill(d.pid, SIGSTOP) == 0, "SIGSTOP wexd: %s", strerror(errno));

	kicked(TENSORS, p.c, &p, &k, 0);
	kicked(ATTACH, k.c, &p, &k, 1);
	T_ASSERT(strstr(wex_last_error(k.c), "the lease on v1 went with the connection") &&
			 wex_is_dirty(k.c) == 1,
		 "k's attach given up under its lease: the lease went, the regions private, dirty: %s",
		 wex_last_error(k.c));
	kicked(SEGMENT, p2.c, &p2, &k2, 0);
	/* (wex_cancel's answer: a kick of its own, at 0.3 s, on k2.) */
	t_kick_start(&kk, 300000, NULL, cancel_answer, k2.c);
	T_ASSERT(wex_attach(k2.c, k2.t, (size_t)k2.n) == -ECANCELED, "k2's attach: %s",
		 wex_last_error(k2.c));
	t_kick_join(&kk, 0);

	T_ASSERT(kill(d.pid, SIGCONT) == 0, "SIGCONT wexd: %s", strerror(errno));
	t0 = t_now();
	T_WEX(p.c, wex_register_tensors(p.c, p.t, (size_t)p.n));
	T_WEX(k.c, wex_attach(k.c, k.t, (size_t)k.n));
	T_WEX(k2.c, wex_attach(k2.c, k2.t, (size_t)k2.n));
	T_WEX(p2.c, wex_segment_alloc(p2.c, WEX_SEG_HOST, 0, p2.seg_bytes, &id, &base));
	id0 = id;
	printf("wexd went on: the four calls made again succeeded in %.2f s (new segment id %u)\n",
	       t_now() - t0, id0);
	T_ASSERT(id0 == 1, "the segment allocated after the given-up one has id %u, not 1", id0);

	/* Every engine gets the next versions whole; p2's from its new
	 * segment. */
	t_prod_write(&p, 2);
	T_ASSERT(t_own_bad(&k, 1) == 0, "k's regions still hold v1 after the producer wrote v2");
	T_WEX(k.c, wex_sync(k.c, WEX_SYNC_COPY, 2, 5000, &r));
	T_ASSERT(r.version == 2 && t_own_bad(&k, 2) == 0, "v2 copied whole");
	for (int i = 0; i < p2.n; i++)
		p2.t[i].segment = id0;
	p2.base = base;
	T_WEX(p2.c, wex_register_tensors(p2.c, p2.t, (size_t)p2.n));
	t_prod_write(&p2, 2);
	T_WEX(k2.c, wex_sync(k2.c, WEX_SYNC_COPY, 2, 5000, &r));
	T_ASSERT(r.version == 2 && t_own_bad(&k2, 2) == 0,
		 "model 2's v2, from the segment allocated after the given-up one, copied whole");
	printf("v2 of both models copied whole\n");

	t_cons_close(&k2);
	t_cons_close(&k);
	t_prod_close(&p2);
	t_prod_close(&p);
	t_wexd_stop(&d);
	return T_EXIT_PASS;
}
