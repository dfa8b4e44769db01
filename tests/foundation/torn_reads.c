/* SPDX-License-Identifier: MIT */
/*
 * torn_reads - proves guarantee 4.1 (no torn reads) in single-buffer mode:
 * a producer process publishes new versions in a tight loop (begin_write,
 * fill every byte from the version number, publish) while this process, a
 * consumer, syncs again and again, rotating REMAP_VIEW (reading the
 * producer's live memory while its lease holds), COPY (its own buffer) and
 * REMAP_FIXED (its own pointers onto the producer's memory, while leased),
 * and checks every byte of every tensor against the version it was given.
 * A single element from another version fails the test.  It also checks
 * that the two really ran concurrently (several versions were seen).
 */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include "fixture.h"

#define MODEL "torn"
#define PRESET "small"

/* The producer: writes versions until the parent closes `stop_fd`'s peer. */
static void producer(int stop_fd, int ready_fd)
{
	struct t_prod p;
	struct pollfd pf = { .fd = stop_fd, .events = POLLIN };
	uint64_t v = 0;

	t_prod_open(&p, MODEL, PRESET, 0, 1);
	t_prod_write(&p, ++v);
	T_ASSERT(write(ready_fd, "r", 1) == 1, "ready");
	while (poll(&pf, 1, 0) == 0) {
		int ret = wex_begin_write(p.c, ++v, 20000);

		if (ret < 0)
			T_FAIL("producer: begin_write v%llu: %s: %s", (unsigned long long)v,
			       wex_strerror(ret), wex_last_error(p.c));
		ex_fill(p.base, p.t, (size_t)p.n, v, 1);
		T_WEX(p.c, wex_publish(p.c, v));
	}
	printf("producer: published %llu versions\n", (unsigned long long)v);
	t_prod_close(&p);
	t_exit(T_EXIT_PASS);
}

int main(void)
{
	struct t_wexd d;
	struct t_cons k;
	int stop[2], ready[2], syncs = 0, views = 0, copies = 0, fixed = 0, distinct = 0;
	uint64_t last = 0;
	double t0;
	char ch;
	pid_t pid;

	t_wexd_start(&d);
	t_check_backend(d.sock);
	T_ASSERT(pipe(stop) == 0 && pipe(ready) == 0, "pipe");
	pid = t_fork();
	if (pid == 0) {
		close(stop[1]);
		close(ready[0]);
		producer(stop[0], ready[1]);
	}
	close(stop[0]);
	close(ready[1]);
	T_ASSERT(read(ready[0], &ch, 1) == 1, "producer ready");
	t_cons_open(&k, MODEL, "g", PRESET, 0, 1);

	/*
	 * Read for 3 s, and on a loaded machine (the sanitizer build beside
	 * other tests) on until 3 versions and all three modes were seen, for
	 * 30 s at most: a producer that never publishes during reads still
	 * fails below.
	 */
	t0 = t_now();
	while (syncs < 200 && t_now() - t0 < 30.0 &&
	       (t_now() - t0 < 3.0 || distinct < 3 || !views || !copies || !fixed)) {
		static const int modes[3] = { WEX_SYNC_REMAP_VIEW, WEX_SYNC_COPY,
					      WEX_SYNC_REMAP_FIXED };
		int mode = modes[syncs % 3];
		struct wex_sync_result r;
		uint64_t bad;

		T_WEX(k.c, wex_sync(k.c, mode, 0, 10000, &r));
		if (mode == WEX_SYNC_REMAP_VIEW) {
			/* The lease holds until release: the producer waits. */
			bad = t_view_bad(&k, 0, r.version);
			T_WEX(k.c, wex_release(k.c));
			views++;
		} else if (mode == WEX_SYNC_REMAP_FIXED) {
			/* The consumer's own pointers show the producer's memory. */
			bad = t_own_bad(&k, r.version);
			T_WEX(k.c, wex_release(k.c));
			fixed++;
		} else {
			bad = t_own_bad(&k, r.version);
			copies++;
		}
		T_ASSERT(bad == 0, "sync %d (%s) of v%llu: %llu elements from another version", syncs,
			 mode == WEX_SYNC_COPY ? "copy" : mode == WEX_SYNC_REMAP_VIEW ? "remap-view" : "remap-fixed", (unsigned long long)r.version,
			 (unsigned long long)bad);
		T_ASSERT(r.version >= last, "versions never go back (%llu after %llu)",
			 (unsigned long long)r.version, (unsigned long long)last);
		distinct += r.version != last;
		last = r.version;
		syncs++;
	}
	close(stop[1]);
	T_ASSERT(t_wait(pid) == 0, "producer exited cleanly");
	printf("%d syncs (%d view, %d copy, %d fixed), %d distinct versions, last v%llu\n", syncs,
	       views, copies, fixed, distinct, (unsigned long long)last);
	T_ASSERT(distinct >= 3, "the producer published while the consumer read (%d versions seen)",
		 distinct);
	T_ASSERT(views > 0 && copies > 0 && fixed > 0, "all three modes ran");
	t_cons_close(&k);
	t_wexd_stop(&d);
	return T_EXIT_PASS;
}
