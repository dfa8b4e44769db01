/* SPDX-License-Identifier: MIT */
/*
 * sync_restart - proves README's "a restart ... during a fetch acquires
 * again" when the new wexd does not know the producers yet: a consumer's
 * sync has its lease and sends the fetch; this test interposes sendmsg and
 * kills and restarts wexd just before that fetch goes out.  libwex
 * reconnects and sends the fetch again, which the new wexd refuses (no
 * producer has reconnected).  The sync must acquire again there:
 *  - when the trainer then publishes (done here as the acquire goes out),
 *    the sync succeeds with every byte of the new daemon's version;
 *  - when nothing is published in time, the sync fails, and a
 *    wex_release after it says no lease is held (-ENOENT): the lease the
 *    restart took was the failed sync's own, never handed to the caller,
 *    so it is not reported as a held lease lost with wexd (-WEX_EDAEMON);
 *  - and it fails within its timeout: the acquire again waits what is left
 *    of it, not a whole new one (found by review: a sync could take twice
 *    its timeout).
 *
 * Found by review: the sync returned the new daemon's refusal of the
 * fetch at once (-WEX_ENOPUBLISHED), and the next wex_release reported
 * the sync's own lease as lost.
 */
#include <dlfcn.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "fixture.h"

#define MODEL "sync-restart"

typedef ssize_t (*sendmsg_fn)(int, const struct msghdr *, int);
static sendmsg_fn real_sendmsg;
static struct t_wexd d;
static struct t_prod p;
static uint64_t publish_v; /* published by the producer at the re-acquire (0: none) */
static int stage, inside;  /* 1: restart at the next fetch; 2: publish at the next acquire */
static useconds_t stall;   /* before the restart: time the sync spends first */

#define INTERPOSE __attribute__((visibility("default")))

static int is_op(const void *buf, size_t len, const char *want)
{
	json_t *j = json_loadb(buf, len, 0, NULL);
	const char *op = NULL;
	int hit;

	if (!j)
		return 0;
	json_unpack(j, "{s?s}", "op", &op);
	hit = op && !strcmp(op, want);
	json_decref(j);
	return hit;
}

INTERPOSE ssize_t sendmsg(int fd, const struct msghdr *msg, int flags)
{
	if (!real_sendmsg)
		real_sendmsg = (sendmsg_fn)(uintptr_t)dlsym(RTLD_NEXT, "sendmsg");
	if (stage && !inside && msg->msg_iovlen == 1) {
		const void *buf = msg->msg_iov[0].iov_base;
		size_t len = msg->msg_iov[0].iov_len;

		if (stage == 1 && is_op(buf, len, "fetch")) {
			inside = 1;
			usleep(stall);
			t_wexd_kill(&d);
			t_wexd_restart(&d);
			inside = 0;
			stage = 2;
		} else if (stage == 2 && is_op(buf, len, "acquire")) {
			stage = 0;
			if (publish_v) {
				/* The trainer reconnects (re-registering) and
				 * publishes on the new daemon. */
				inside = 1;
				t_prod_write(&p, publish_v);
				inside = 0;
			}
		}
	}
	return real_sendmsg(fd, msg, flags);
}

int main(void)
{
	struct wex_sync_result r;
	struct t_cons k;
	int ret;

	t_tiny_v1(&d, &p, &k, MODEL);

	/* The trainer publishes again once the sync acquires again. */
	publish_v = 1;
	stage = 1;
	ret = wex_sync(k.c, WEX_SYNC_REMAP_VIEW, 1, 5000, &r);
	T_ASSERT(ret == 0, "a sync whose fetch met a wexd restart before the producers were back: "
		 "%s (%s)", wex_strerror(ret), wex_last_error(k.c));
	T_ASSERT(stage == 0, "the sync never acquired again after the restart");
	T_ASSERT(r.version == 1 && t_view_bad(&k, 0, 1) == 0, "v%llu of the new daemon seen exact",
		 (unsigned long long)r.version);
	T_WEX(k.c, wex_release(k.c));

	/* Nothing is published in time: the sync fails, and no lease of its
	 * own is reported afterwards. */
	t_prod_write(&p, 2);
	T_WEX(k.c, wex_attach(k.c, k.t, (size_t)k.n)); /* the next sync fetches */
	publish_v = 0;
	stage = 1;
	ret = wex_sync(k.c, WEX_SYNC_REMAP_VIEW, 2, 300, &r);
	T_ASSERT(ret < 0, "the sync succeeded with no version published on the new daemon");
	printf("sync with nothing published after the restart: %s (%s)\n", wex_strerror(ret),
	       wex_last_error(k.c));
	ret = wex_release(k.c);
	T_ASSERT(ret == -ENOENT, "wex_release after the failed sync: %s (%s), not -ENOENT",
		 wex_strerror(ret), wex_last_error(k.c));

	/* 1.5 s of a 2 s timeout gone before the restart: the sync ends
	 * about 2 s after it began, never 1.5 + 2 s (a second of slack for
	 * the restart itself and a loaded machine). */
	t_prod_write(&p, 3); /* at the old daemon only */
	T_WEX(k.c, wex_attach(k.c, k.t, (size_t)k.n));
	stall = 1500000;
	stage = 1;
	{
		double t0 = t_now(), took;

		ret = wex_sync(k.c, WEX_SYNC_REMAP_VIEW, 3, 2000, &r);
		took = t_now() - t0;
		T_ASSERT(ret < 0 && stage == 0, "the sync with v3 nowhere after the restart: %s, stage %d",
			 wex_strerror(ret), stage);
		printf("sync with a 2 s timeout, 1.5 s of it spent before the restart: %s after "
		       "%.2f s\n", wex_strerror(ret), took);
		T_ASSERT(took < 3.0, "the sync took %.2f s of its 2 s timeout", took);
	}

	t_cons_close(&k);
	t_prod_close(&p);
	t_wexd_stop(&d);
	printf("sync_restart: PASS\n");
	t_exit(T_EXIT_PASS);
}
