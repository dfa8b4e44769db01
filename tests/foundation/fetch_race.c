/* SPDX-License-Identifier: MIT */
/*
 * fetch_race - proves that a consumer's fetch that spans several pages
 * ends with every producer segment mapped exactly once even when a
 * producer registers another segment between two pages: rank 0 has 30
 * host segments, rank 1 has 50 (80 fds: two pages of at most 60); this
 * test interposes sendmsg, and when the consumer asks for its second page
 * rank 0 first registers a 31st segment.  wexd numbers segments across
 * ranks, so that second page starts one entry earlier in rank 1's list.
 * The consumer's sync of v1 must still see every tensor exact, and
 * /proc/self/maps must show each of the 81 segments mapped twice: once
 * by its producer, once by the consumer.
 *
 * Found by review: the client ignored the layout generation that each
 * later page carries, so it mapped rank 1's segment 29 twice (the spare
 * mapping lived until the next fetch) and missed rank 0's new one.
 *
 * Then wexd restarts between two pages of a wex_reserve's fetch (no sync,
 * so no acquire to start over), and rank 0 registers one more segment at
 * the new daemon, whose layout generation is made to equal the old one's:
 * the pages differ only in the daemon that sent them.  Found by review:
 * the client took the new daemon's second page after the old one's first,
 * mapping one of rank 1's segments twice and rank 0's new one not at all.
 */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fixture.h"

#define MODEL "race"
#define N0 30
#define N1 50
#define ELEMS 1024 /* bf16 elements per tensor */

typedef ssize_t (*sendmsg_fn)(int, const struct msghdr *, int);
static sendmsg_fn real_sendmsg;
static wex_client_t *racer; /* rank 0, registers a segment when armed */
static int armed, fired, inside;
/* Phase 2: restarts wexd when armed, then both ranks register again,
 * rank 1 first. */
static struct t_wexd *daemon_;
static wex_client_t *first_again, *second_again;
static const struct wex_tensor *again_t; /* second_again's tensors */
static int again_n, restart_armed;

static uint64_t layout_gen(void)
{
	json_t *st = t_status(daemon_->sock), *m = t_status_model(st, MODEL);
	uint64_t gen = m ? (uint64_t)json_integer_value(json_object_get(m, "layout_gen")) : 0;

	json_decref(st);
	return gen;
}

/* Any call: the producer reconnects and registers everything again. */
static void register_again(wex_client_t *p)
{
	char *js = NULL;

	T_WEX(p, wex_request(p, "status", NULL, &js));
	free(js);
}

#define INTERPOSE __attribute__((visibility("default")))

/* Whether buf is a fetch request for a page after the first. */
static int later_page(const void *buf, size_t len)
{
	json_t *j = json_loadb(buf, len, 0, NULL);
	const char *op = NULL;
	json_int_t start = 0;
	int hit;

	if (!j)
		return 0;
	json_unpack(j, "{s?s, s?I}", "op", &op, "start", &start);
	hit = op && !strcmp(op, "fetch") && start > 0;
	json_decref(j);
	return hit;
}

INTERPOSE ssize_t sendmsg(int fd, const struct msghdr *msg, int flags)
{
	if (!real_sendmsg)
		real_sendmsg = (sendmsg_fn)(uintptr_t)dlsym(RTLD_NEXT, "sendmsg");
	if (armed && !inside && msg->msg_iovlen == 1 &&
	    later_page(msg->msg_iov[0].iov_base, msg->msg_iov[0].iov_len)) {
		uint32_t id;
		void *base;
		int ret;

		armed = 0;
		inside = 1;
		ret = wex_segment_alloc(racer, WEX_SEG_HOST, 0, 4096, &id, &base);
		inside = 0;
		T_ASSERT(ret == 0, "rank 0's extra segment between pages: %s", wex_strerror(ret));
		fired++;
	}
	if (restart_armed && !inside && msg->msg_iovlen == 1 &&
	    later_page(msg->msg_iov[0].iov_base, msg->msg_iov[0].iov_len)) {
		uint64_t was = layout_gen(), now;

		restart_armed = 0;
		inside = 1;
		t_wexd_kill(daemon_);
		t_wexd_restart(daemon_);
		register_again(first_again);
		register_again(second_again);
		/* Rank 0 has one segment more there, which moves the second
		 * page's start back into rank 1's list... */
		{
			uint32_t id;
			void *base;

			T_WEX(second_again, wex_segment_alloc(second_again, WEX_SEG_HOST, 0, 4096,
							      &id, &base));
		}
		/* ...under the same generation as the page before (registering
		 * the same tensors again counts one more), so that only the
		 * daemon tells the pages apart. */
		while ((now = layout_gen()) < was)
			T_WEX(second_again,
			      wex_register_tensors(second_again, again_t, (size_t)again_n));
		T_ASSERT(now == was, "layout generation %llu after the restart, %llu before",
			 (unsigned long long)now, (unsigned long long)was);
		inside = 0;
		fired++;
	}
	return real_sendmsg(fd, msg, flags);
}

/* Maps of each wex-seg memfd, by inode: fills ino/count, returns how many
 * inodes were seen. */
static int seg_maps(unsigned long *ino, int *count, int max)
{
	FILE *f = fopen("/proc/self/maps", "r");
	char line[512];
	int n = 0;

	T_ASSERT(f, "open /proc/self/maps");
	while (fgets(line, sizeof(line), f)) {
		unsigned long i;
		int k;

		if (!strstr(line, "/memfd:wex-seg") ||
		    sscanf(line, "%*s %*s %*s %*s %lu", &i) != 1)
			continue;
		for (k = 0; k < n && ino[k] != i; k++)
			;
		if (k == n) {
			T_ASSERT(n < max, "more than %d segment inodes mapped", max);
			ino[n] = i;
			count[n++] = 0;
		}
		count[k]++;
	}
	fclose(f);
	return n;
}

static void rank_open(wex_client_t **p, struct wex_tensor *t, uint32_t rank, int nseg)
{
	*p = t_open(WEX_ROLE_PRODUCER, MODEL, NULL, rank, 2);
	memset(t, 0, (size_t)nseg * sizeof(*t));
	for (int i = 0; i < nseg; i++) {
		void *base;
		uint32_t id;

		T_WEX(*p, wex_segment_alloc(*p, WEX_SEG_HOST, 0, 4096, &id, &base));
		snprintf(t[i].name, sizeof(t[i].name), "r%u.s%d.weight", rank, i);
		t[i].dtype = WEX_DT_BF16;
		t[i].ndim = 1;
		t[i].shape[0] = t[i].extent[0] = ELEMS;
		t[i].segment = id;
		t[i].ptr = base;
	}
	T_WEX(*p, wex_register_tensors(*p, t, (size_t)nseg));
}

static void rank_write(wex_client_t *p, struct wex_tensor *t, int nseg)
{
	T_WEX(p, wex_begin_write(p, 1, 5000));
	for (int i = 0; i < nseg; i++)
		ex_fill(t[i].ptr, &t[i], 1, 1, 1);
	T_WEX(p, wex_publish(p, 1));
}

int main(void)
{
	struct t_wexd d;
	struct wex_tensor t0[N0], t1[N1];
	struct wex_sync_result r;
	unsigned long ino[N0 + N1 + 8];
	int count[N0 + N1 + 8], n, odd = 0;
	wex_client_t *p0, *p1, *k;

	t_wexd_start(&d);
	t_check_backend(d.sock);
	rank_open(&p0, t0, 0, N0);
	rank_open(&p1, t1, 1, N1);
	rank_write(p0, t0, N0);
	rank_write(p1, t1, N1);
	racer = p0;

	k = t_open(WEX_ROLE_CONSUMER, MODEL, "g", 0, 1);
	armed = 1;
	T_WEX(k, wex_sync(k, WEX_SYNC_REMAP_VIEW, 1, 5000, &r));
	T_ASSERT(fired == 1, "the consumer's fetch asked for a second page (%d extra segments)",
		 fired);
	T_ASSERT(r.version == 1, "synced v%llu", (unsigned long long)r.version);
	for (int i = 0; i < N0 + N1; i++) {
		const struct wex_tensor *want = i < N0 ? &t0[i] : &t1[i - N0];
		struct wex_tensor v;
		void *ptr;

		T_WEX(k, wex_view(k, i < N0 ? 0 : 1, want->name, &ptr, &v));
		T_ASSERT(ex_check(NULL, &v, 1, 1, 1) == 0, "view of %s is exact", want->name);
	}
	n = seg_maps(ino, count, N0 + N1 + 8);
	for (int i = 0; i < n; i++)
		if (count[i] != 2) {
			printf("segment inode %lu is mapped %d time(s)\n", ino[i], count[i]);
			odd++;
		}
	printf("%d segment inodes mapped, %d not twice\n", n, odd);
	T_ASSERT(n == N0 + N1 + 1, "%d segments mapped in this process, want %d", n, N0 + N1 + 1);
	T_ASSERT(!odd, "%d segments are not mapped exactly once by the consumer", odd);
	wex_client_close(k);

	/* Phase 2: wexd restarted between the pages of a reserve's fetch. */
	daemon_ = &d;
	first_again = p1;
	second_again = p0;
	again_t = t0;
	again_n = N0;
	/* The old daemon's generation ahead of what registering again
	 * reaches at the new one, which then catches up. */
	for (int i = 0; i < 4; i++)
		T_WEX(p0, wex_register_tensors(p0, t0, N0));
	k = t_open(WEX_ROLE_CONSUMER, MODEL, "g", 0, 1);
	fired = 0;
	restart_armed = 1;
	{
		void *region;

		T_WEX(k, wex_reserve(k, 1, t1[0].segment, 4096, &region));
	}
	T_ASSERT(fired == 1, "the reserve's fetch asked for a second page (%d restarts)", fired);
	n = seg_maps(ino, count, N0 + N1 + 8);
	odd = 0;
	for (int i = 0; i < n; i++)
		if (count[i] != 2) {
			printf("after the restart: segment inode %lu is mapped %d time(s)\n", ino[i],
			       count[i]);
			odd++;
		}
	printf("after a restart between pages: %d segment inodes mapped, %d not twice\n", n, odd);
	T_ASSERT(n == N0 + N1 + 2 && !odd,
		 "wexd restarted between pages: %d segments mapped (want %d), %d not exactly once "
		 "by the consumer", n, N0 + N1 + 2, odd);
	wex_client_close(k);
	wex_client_close(p1);
	wex_client_close(p0);
	t_wexd_stop(&d);
	return T_EXIT_PASS;
}
