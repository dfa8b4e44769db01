/* SPDX-License-Identifier: MIT */
/*
 * daemon_restart - proves that a daemon restart loses no weights and needs
 * no restart of the clients (DESIGN 2): with a producer and a consumer
 * connected and v1 copied, wexd is SIGKILLed and started again on the same
 * socket.  Meanwhile the consumer's copied weights stay intact.  The
 * producer's watch brings its memory and v1 back to the new wexd by
 * itself.  Then, without reopening either client, the producer's next begin_write and
 * publish work (libwex reconnects and re-registers its segment and
 * tensors), and the consumer's next COPY and REMAP_VIEW syncs get the new
 * version with every byte right.  While wexd is down, calls that wait try
 * again within their timeouts, then fail, and leave the consumer's
 * weights clean; a restart
 * during a same-address rollout keeps the trainer waiting until the engine
 * releases (the lease journal), and one between begin_write and publish
 * (the publish still works) is survived too.
 */
#include <errno.h>
#include <string.h>
#include <unistd.h>

#include "fixture.h"
#include "ipc/sock.h"

#define MODEL "restart"

int main(void)
{
	struct t_wexd d;
	struct t_prod p;
	struct t_cons k;
	struct wex_sync_result r;
	json_t *st, *m;
	pid_t old;
	int ret;

	t_tiny_v1(&d, &p, &k, MODEL);
	T_WEX(k.c, wex_sync(k.c, WEX_SYNC_COPY, 1, 5000, &r));
	T_ASSERT(r.version == 1 && t_own_bad(&k, 1) == 0, "v1 copied");

	old = d.pid;
	t_wexd_kill(&d);
	T_ASSERT(t_own_bad(&k, 1) == 0, "the consumer's weights are intact while wexd is down");
	/* While it is down, the calls that wait (begin_write, sync) try
	 * again within their timeouts (the next wexd may be starting), then
	 * fail saying so: not at once, and not hanging past them (no wait on
	 * a dead listener: with io_uring the killed daemon's socket lingers
	 * for a while; 10 s for both leaves room for a loaded machine). */
	{
		int fd = wex_sock_connect(d.sock);
		double t0 = t_now(), t1;

		T_ASSERT(fd < 0, "connecting to the dead wexd's socket fails (got fd %d)", fd);
		ret = wex_begin_write(p.c, 2, 1000);
		T_ASSERT(ret < 0, "begin_write while wexd is down fails");
		printf("begin_write while wexd is down: %s: %s\n", wex_strerror(ret),
		       wex_last_error(p.c));
		T_ASSERT(strstr(wex_last_error(p.c), "tried again until its timeout"),
			 "begin_write did not try again: %s", wex_last_error(p.c));
		t1 = t_now();
		T_ASSERT(t1 - t0 >= 0.5, "begin_write gave up at once (%.2f s of 1 s)", t1 - t0);
		ret = wex_sync(k.c, WEX_SYNC_COPY, 2, 1000, &r);
		T_ASSERT(ret < 0, "sync while wexd is down fails");
		T_ASSERT(strstr(wex_last_error(k.c), "tried again until its timeout"),
			 "sync did not try again: %s", wex_last_error(k.c));
		T_ASSERT(t_now() - t1 >= 0.5, "sync gave up at once (%.2f s of 1 s)", t_now() - t1);
		T_ASSERT(t_now() - t0 < 10.0, "and both end within their 1 s timeouts (%.2f s)",
			 t_now() - t0);
		T_ASSERT(!wex_is_dirty(k.c) && t_own_bad(&k, 1) == 0,
			 "a failed sync leaves the consumer's v1 clean and intact");
	}
	t_wexd_restart(&d);
	T_ASSERT(d.pid != old, "a new wexd");
	t_check_backend(d.sock);
	/* The new wexd starts empty; the producer's watch brings its memory
	 * back at once, with v1 (the begin_write that failed began
	 * nothing), and the trainer calls nothing for that (30 s at most:
	 * a loaded machine). */
	for (double t0 = t_now();;) {
		json_int_t pub;

		st = t_status(d.sock);
		m = t_status_model(st, MODEL);
		pub = m ? json_integer_value(json_object_get(m, "published")) : -1;
		json_decref(st);
		if (pub == 1)
			break;
		T_ASSERT(t_now() - t0 < 30.0,
			 "the producer's watch did not bring v1 back to the new wexd (published %lld)",
			 (long long)pub);
		usleep(10000);
	}
	T_ASSERT(t_own_bad(&k, 1) == 0, "the consumer's weights are intact after the restart");

	/* The same client handles, no reopen. */
	T_WEX(p.c, wex_begin_write(p.c, 2, 5000));
	ex_fill(p.base, p.t, (size_t)p.n, 2, 1);
	T_WEX(p.c, wex_publish(p.c, 2));
	st = t_status(d.sock);
	m = t_status_model(st, MODEL);
	T_ASSERT(m && json_integer_value(json_object_get(m, "published")) == 2,
		 "the new wexd knows the model, v2 published");
	T_ASSERT(json_integer_value(json_object_get(json_array_get(json_object_get(m, "producers"), 0),
						    "tensors")) == p.n,
		 "the producer re-registered its %d tensors", p.n);
	json_decref(st);

	T_WEX(k.c, wex_sync(k.c, WEX_SYNC_COPY, 2, 5000, &r));
	T_ASSERT(r.version == 2 && t_own_bad(&k, 2) == 0, "consumer copies v2 after the restart");
	T_WEX(k.c, wex_sync(k.c, WEX_SYNC_REMAP_VIEW, 2, 5000, &r));
	T_ASSERT(t_view_bad(&k, 0, 2) == 0, "consumer views v2 after the restart");
	T_WEX(k.c, wex_release(k.c));

	/* And again once more, with the consumer mid-rollout (same-address
	 * lease): the new wexd reads the lease back from the journal, so the
	 * trainer waits until the engine is done with v2. */
	T_WEX(k.c, wex_sync(k.c, WEX_SYNC_REMAP_FIXED, 2, 5000, &r));
	t_wexd_kill(&d);
	T_ASSERT(t_own_bad(&k, 2) == 0, "fixed mapping still reads v2 while wexd is down");
	t_wexd_restart(&d);
	T_ASSERT(t_leases(d.sock, MODEL) == 1, "the new wexd holds the lease of the old");
	ret = wex_begin_write(p.c, 3, 300);
	T_ASSERT(ret == -EBUSY && strstr(wex_last_error(p.c), "from before wexd restarted"),
		 "the trainer waits for the lease held across the restart: %s (%s)",
		 wex_strerror(ret), wex_last_error(p.c));
	T_ASSERT(t_own_bad(&k, 2) == 0, "the engine still reads v2, untouched");
	ret = wex_release(k.c);
	T_ASSERT(ret == 0, "the engine takes its lease back and releases it: %s (%s)",
		 wex_strerror(ret), wex_last_error(k.c));
	T_ASSERT(!wex_is_dirty(k.c), "the restored regions are whole (the lease never lapsed)");
	T_ASSERT(t_leases(d.sock, MODEL) == 0, "and no lease is left");
	t_prod_write(&p, 3);
	T_WEX(k.c, wex_sync(k.c, WEX_SYNC_REMAP_FIXED, 3, 5000, &r));
	T_ASSERT(r.version == 3 && t_own_bad(&k, 3) == 0, "fixed sync of v3 after the second restart");
	T_WEX(k.c, wex_release(k.c));

	/* A restart in the middle of a write (between begin_write and
	 * publish): the publish still works, and the version is exact. */
	T_WEX(p.c, wex_begin_write(p.c, 4, 5000));
	t_wexd_kill(&d);
	t_wexd_restart(&d);
	ex_fill(p.base, p.t, (size_t)p.n, 4, 1);
	ret = wex_publish(p.c, 4);
	T_ASSERT(ret == 0, "publish v4 begun before the restart: %s: %s", wex_strerror(ret),
		 wex_last_error(p.c));
	T_WEX(k.c, wex_sync(k.c, WEX_SYNC_COPY, 4, 5000, &r));
	T_ASSERT(r.version == 4 && t_own_bad(&k, 4) == 0, "consumer copies v4 exactly");

	t_cons_close(&k);
	t_prod_close(&p);
	t_wexd_stop(&d);
	return T_EXIT_PASS;
}
