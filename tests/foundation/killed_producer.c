/* SPDX-License-Identifier: MIT */
/*
 * killed_producer - proves guarantee 4.6 for producers: a producer rank
 * SIGKILLed in the middle of a write (after begin_write, before publish)
 * loses its registrations and nothing else: wexd keeps answering, the
 * consumer that copied v1 keeps it, no consumer is handed the dead
 * producer's half-written buffer nor the fresh memory of its successor
 * under v1's name (syncs time out until a new version is published), and
 * a restarted producer rank can register again, begin_write a newer
 * version and publish it, which the consumer then syncs exactly.
 */
#include <errno.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include "fixture.h"

#define MODEL "kprod"

int main(void)
{
	struct t_wexd d;
	struct t_cons k;
	struct t_prod p;
	struct wex_sync_result r;
	int pp[2], go[2], ret, fds, n;
	char ch;
	pid_t pid;

	t_wexd_start(&d);
	t_check_backend(d.sock);
	fds = t_wexd_fds_settle(&d, -1);
	T_ASSERT(pipe(pp) == 0 && pipe(go) == 0, "pipe");
	pid = t_fork();
	if (pid == 0) {
		struct t_prod q;

		t_prod_open(&q, MODEL, "tiny", 0, 1);
		t_prod_write(&q, 1);
		T_ASSERT(write(pp[1], "1", 1) == 1, "tell");
		T_ASSERT(read(go[0], &ch, 1) == 1, "wait");
		T_WEX(q.c, wex_begin_write(q.c, 2, 5000));
		ex_fill(q.base, q.t, (size_t)q.n / 2, 2, 1); /* half of v2 */
		T_ASSERT(write(pp[1], "w", 1) == 1, "tell");
		for (;;)
			pause();
	}
	T_ASSERT(read(pp[0], &ch, 1) == 1, "producer published v1");
	t_cons_open(&k, MODEL, "g", "tiny", 0, 1);
	T_WEX(k.c, wex_sync(k.c, WEX_SYNC_COPY, 1, 5000, &r));
	T_ASSERT(r.version == 1 && t_own_bad(&k, 1) == 0, "consumer copied v1");
	T_ASSERT(write(go[1], "g", 1) == 1, "tell");
	T_ASSERT(read(pp[0], &ch, 1) == 1, "producer is mid-write");
	ret = wex_sync(k.c, WEX_SYNC_COPY, 2, 200, &r);
	T_ASSERT(ret == -ETIMEDOUT, "v2 is not published: ETIMEDOUT, got %s", wex_strerror(ret));
	kill(pid, SIGKILL);
	T_ASSERT(t_wait(pid) == 128 + SIGKILL, "producer killed");
	T_ASSERT(t_own_bad(&k, 1) == 0, "the consumer's copy of v1 is intact");

	/* wexd is healthy and hands out nothing: v1's bytes died with the
	 * producer (its buffer was half v2 anyway). */
	ret = wex_sync(k.c, WEX_SYNC_COPY, 0, 200, &r);
	T_ASSERT(ret == -ETIMEDOUT, "sync with the producer gone: ETIMEDOUT, got %s (v%llu)",
		 wex_strerror(ret), ret == 0 ? (unsigned long long)r.version : 0ull);
	T_ASSERT(t_own_bad(&k, 1) == 0, "the consumer's copy of v1 is still intact");

	/* A new producer process for rank 0: registers and writes v3. */
	t_prod_open(&p, MODEL, "tiny", 0, 1);
	/* Its fresh memory does not hold v1: nothing to sync before it
	 * publishes (the old code handed out v1 here once the stale write
	 * state was cleared). */
	ret = wex_sync(k.c, WEX_SYNC_COPY, 0, 200, &r);
	T_ASSERT(ret == -ETIMEDOUT, "sync before the new producer published: ETIMEDOUT, got %s",
		 wex_strerror(ret));
	ret = wex_begin_write(p.c, 3, 2000);
	T_ASSERT(ret == 0, "the restarted producer's begin_write v3: %s: %s", wex_strerror(ret),
		 wex_last_error(p.c));
	ex_fill(p.base, p.t, (size_t)p.n, 3, 1);
	T_WEX(p.c, wex_publish(p.c, 3));
	T_WEX(k.c, wex_sync(k.c, WEX_SYNC_COPY, 3, 5000, &r));
	T_ASSERT(r.version == 3 && t_own_bad(&k, 3) == 0, "the consumer copies v3 exactly");

	t_cons_close(&k);
	t_prod_close(&p);
	n = t_wexd_fds_settle(&d, fds);
	T_ASSERT(n == fds, "wexd holds %d fds after all clients left, %d before", n, fds);
	t_wexd_stop(&d);
	return T_EXIT_PASS;
}
