/* SPDX-License-Identifier: MIT */
/*
 * begin_write_timeout - proves that begin_write waits for leases with a
 * timeout and fails loudly: while a consumer process holds a REMAP_VIEW
 * lease, the producer's begin_write with a 200 ms timeout fails with -EBUSY
 * after about 200 ms, and the message names the holder (model, group, rank
 * and pid); once the consumer calls wex_release, begin_write succeeds at
 * once and status shows no lease.  A raw "release" sent with wex_request
 * under the lease is refused (it ended the lease behind libwex's back, and
 * the producer then overwrote what the views showed).
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "fixture.h"

#define MODEL "bwt"

int main(void)
{
	struct t_wexd d;
	struct t_prod p;
	struct wex_sync_result r;
	int to_child[2], to_parent[2], ret;
	char ch, want[128];
	double t0, el;
	pid_t pid;

	t_wexd_start(&d);
	t_check_backend(d.sock);
	t_prod_open(&p, MODEL, "tiny", 0, 1);
	t_prod_write(&p, 1);
	T_ASSERT(pipe(to_child) == 0 && pipe(to_parent) == 0, "pipe");
	pid = t_fork();
	if (pid == 0) {
		/* The consumer, in its own process so that its pid differs. */
		struct t_cons k;

		t_cons_open(&k, MODEL, "rollout", "tiny", 0, 1);
		T_WEX(k.c, wex_sync(k.c, WEX_SYNC_REMAP_VIEW, 1, 5000, &r));
		T_ASSERT(t_view_bad(&k, 0, 1) == 0, "consumer reads v1");
		/* A raw request may not end the lease behind libwex's back
		 * (the producer's begin_write below then waits on it). */
		{
			char *s = NULL;

			ret = wex_request(k.c, "release", NULL, &s);
			T_ASSERT(ret == -EINVAL && strstr(wex_last_error(k.c), "behind libwex's back"),
				 "a raw release under a view lease: %s: %s", wex_strerror(ret),
				 wex_last_error(k.c));
			wex_free(s);
		}
		T_ASSERT(write(to_parent[1], "l", 1) == 1, "tell");
		T_ASSERT(read(to_child[0], &ch, 1) == 1, "wait");
		T_WEX(k.c, wex_release(k.c));
		T_ASSERT(write(to_parent[1], "r", 1) == 1, "tell");
		T_ASSERT(read(to_child[0], &ch, 1) == 1, "wait");
		t_cons_close(&k);
		t_exit(T_EXIT_PASS);
	}
	T_ASSERT(read(to_parent[0], &ch, 1) == 1 && ch == 'l', "consumer took its lease");
	T_ASSERT(t_leases(d.sock, MODEL) > 0, "status shows the lease");

	t0 = t_now();
	ret = wex_begin_write(p.c, 2, 200);
	el = t_now() - t0;
	T_ASSERT(ret == -EBUSY, "begin_write under a lease: expected -EBUSY, got %s", wex_strerror(ret));
	T_ASSERT(el >= 0.19 && el < 3.0, "EBUSY after about 200 ms (took %.3f s)", el);
	printf("EBUSY message: %s\n", wex_last_error(p.c));
	snprintf(want, sizeof(want), "group 'rollout' rank 0 (pid %d) holds v1", (int)pid);
	T_ASSERT(strstr(wex_last_error(p.c), want), "the message names the holder ('%s'): %s", want,
		 wex_last_error(p.c));
	T_ASSERT(strstr(wex_last_error(p.c), MODEL), "the message names the model: %s",
		 wex_last_error(p.c));

	T_ASSERT(write(to_child[1], "x", 1) == 1, "tell");
	T_ASSERT(read(to_parent[0], &ch, 1) == 1 && ch == 'r', "consumer released");
	T_ASSERT(t_leases(d.sock, MODEL) == 0, "status shows no lease after release");
	t0 = t_now();
	ret = wex_begin_write(p.c, 2, 5000);
	T_ASSERT(ret == 0, "begin_write after release: %s: %s", wex_strerror(ret), wex_last_error(p.c));
	T_ASSERT(t_now() - t0 < 1.0, "begin_write after release did not wait for its 5 s timeout (%.3f s)",
		 t_now() - t0);
	ex_fill(p.base, p.t, (size_t)p.n, 2, 1);
	T_WEX(p.c, wex_publish(p.c, 2));

	T_ASSERT(write(to_child[1], "x", 1) == 1, "tell");
	T_ASSERT(t_wait(pid) == 0, "consumer exited cleanly");
	t_prod_close(&p);
	t_wexd_stop(&d);
	return T_EXIT_PASS;
}
