/* SPDX-License-Identifier: MIT */
/*
 * killed_consumer - proves guarantee 4.6 (crash safety) for consumers: a
 * consumer process SIGKILLed while it holds a REMAP_VIEW lease loses that
 * lease (the producer's begin_write then succeeds within its timeout), and
 * a consumer killed in the middle of COPY syncs (the kill is aimed at a
 * moment when status shows its copy lease; if it lands elsewhere the test
 * still requires the rest) leaves wexd answering, status showing no lease,
 * and the producer writing and publishing on.
 */
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include "fixture.h"

#define MODEL "kill"
#define PRESET "small"

/* Does status show a lease held by `pid` (in `mode`, or any if NULL)? */
static int holds(const char *sock, pid_t pid, const char *mode)
{
	json_t *s = t_status(sock), *c;
	size_t i;
	int found = 0;

	json_array_foreach(json_object_get(s, "clients"), i, c) {
		if (json_integer_value(json_object_get(c, "pid")) != pid ||
		    json_integer_value(json_object_get(c, "lease")) == 0)
			continue;
		if (!mode || !strcmp(json_string_value(json_object_get(c, "mode")), mode))
			found = 1;
	}
	json_decref(s);
	return found;
}

int main(void)
{
	struct t_wexd d;
	struct t_prod p;
	int pp[2], ret, landed = 0, tries = 0, fds, n;
	uint64_t v = 1;
	char ch;
	pid_t pid;
	double t0;

	t_wexd_start(&d);
	t_check_backend(d.sock);
	t_prod_open(&p, MODEL, PRESET, 0, 1);
	t_prod_write(&p, v);

	/* 1. Killed while holding a remap lease. */
	T_ASSERT(pipe(pp) == 0, "pipe");
	pid = t_fork();
	if (pid == 0) {
		struct t_cons k;
		struct wex_sync_result r;

		t_cons_open(&k, MODEL, "victim", PRESET, 0, 1);
		T_WEX(k.c, wex_sync(k.c, WEX_SYNC_REMAP_VIEW, 1, 5000, &r));
		T_ASSERT(write(pp[1], "l", 1) == 1, "tell");
		for (;;)
			pause();
	}
	close(pp[1]);
	T_ASSERT(read(pp[0], &ch, 1) == 1, "consumer took its lease");
	close(pp[0]);
	T_ASSERT(holds(d.sock, pid, "remap-view"), "status shows the consumer's remap lease");
	ret = wex_begin_write(p.c, ++v, 150);
	T_ASSERT(ret == -EBUSY, "begin_write under the live consumer's lease: EBUSY, got %s",
		 wex_strerror(ret));
	kill(pid, SIGKILL);
	T_ASSERT(t_wait(pid) == 128 + SIGKILL, "consumer killed");
	t0 = t_now();
	ret = wex_begin_write(p.c, v, 5000);
	T_ASSERT(ret == 0, "begin_write after the consumer died: %s: %s", wex_strerror(ret),
		 wex_last_error(p.c));
	printf("begin_write after the kill took %.1f ms\n", (t_now() - t0) * 1e3);
	ex_fill(p.base, p.t, (size_t)p.n, v, 1);
	T_WEX(p.c, wex_publish(p.c, v));
	T_ASSERT(t_leases(d.sock, MODEL) == 0, "no lease left after the kill");
	/* wexd's fds from here on: its model now caches a tensor table and
	 * the plan for this consumer layout (memfds), which later consumers
	 * of the same layout reuse; a killed consumer must leave nothing. */
	fds = t_wexd_fds_settle(&d, -1);

	/* 2. Killed during COPY syncs: the consumer copies every new version;
	 * this process publishes versions and watches status for its copy
	 * lease, then kills it. */
	for (tries = 0; tries < 20 && !landed; tries++) {
		T_ASSERT(pipe(pp) == 0, "pipe");
		pid = t_fork();
		if (pid == 0) {
			struct t_cons k;
			struct wex_sync_result r;

			close(pp[0]);
			t_cons_open(&k, MODEL, "victim", PRESET, 0, 1);
			T_ASSERT(write(pp[1], "o", 1) == 1, "tell");
			for (;;) {
				T_WEX(k.c, wex_sync(k.c, WEX_SYNC_COPY, 0, 10000, &r));
				T_ASSERT(t_own_bad(&k, r.version) == 0, "copy of v%llu intact",
					 (unsigned long long)r.version);
			}
		}
		close(pp[1]);
		T_ASSERT(read(pp[0], &ch, 1) == 1, "consumer attached");
		close(pp[0]);
		t0 = t_now();
		while (!landed && t_now() - t0 < 0.5) {
			t_prod_write(&p, ++v);
			for (int i = 0; i < 200 && !landed; i++)
				if (holds(d.sock, pid, "copy")) {
					kill(pid, SIGKILL);
					landed = 1;
				}
		}
		if (!landed)
			kill(pid, SIGKILL);
		T_ASSERT(t_wait(pid) == 128 + SIGKILL, "consumer killed (not failed on its own)");
		/* Whether or not it died mid-copy: no lease, the producer goes on. */
		for (t0 = t_now(); t_leases(d.sock, MODEL) && t_now() - t0 < 5.0;)
			sched_yield();
		T_ASSERT(t_leases(d.sock, MODEL) == 0, "status shows no lease after the kill");
		ret = wex_begin_write(p.c, ++v, 2000);
		T_ASSERT(ret == 0, "begin_write after a consumer died mid-copy: %s: %s",
			 wex_strerror(ret), wex_last_error(p.c));
		ex_fill(p.base, p.t, (size_t)p.n, v, 1);
		T_WEX(p.c, wex_publish(p.c, v));
	}
	printf("kill landed during a copy lease: %s (after %d tries)\n", landed ? "yes" : "no", tries);

	/* wexd is healthy: a fresh consumer copies the latest version. */
	{
		struct t_cons k;
		struct wex_sync_result r;

		t_cons_open(&k, MODEL, "after", PRESET, 0, 1);
		T_WEX(k.c, wex_sync(k.c, WEX_SYNC_COPY, v, 5000, &r));
		T_ASSERT(r.version == v && t_own_bad(&k, v) == 0, "a new consumer copies v%llu",
			 (unsigned long long)v);
		t_cons_close(&k);
	}
	n = t_wexd_fds_settle(&d, fds);
	T_ASSERT(n == fds, "wexd holds %d fds after the killed consumers, %d before", n, fds);
	t_prod_close(&p);
	t_wexd_stop(&d);
	return T_EXIT_PASS;
}
