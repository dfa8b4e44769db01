/* SPDX-License-Identifier: MIT */
/*
 * plan_ticks.c - proves that the planner's tick hook (wexd pings its
 * watchdog from it) is called all through a plan's build and its sealed
 * memfd, not only while cells are cut: a plan of 2M cells each with two
 * holders (a u8 [2048, 1000] tensor two producer ranks hold in 2048 row
 * pieces each, a consumer in 1000 column pieces) had its cells sorted for
 * balance, its ops hashed and copied into a memfd with no tick: 8.4M
 * cells (4096 rows, 2048 columns) held wexd's loop 1.8 s between ticks
 * (the sort of the cells 1.1 s), a producer table of 4M pieces 1.9 s (its
 * sort).  Here the longest stretch between ticks must be under a twelfth
 * of the whole (it was 12 to 14 %, 2.5 % with the ticks, 5 % under ASan,
 * whose realloc copies the cells when they outgrow their array: 1000
 * columns keep that copy to 1M cells); measured in the thread's CPU time,
 * so that a loaded machine taking the CPU away cannot fail it.  Likewise
 * the unpack of a producer table of 512K pieces, as wexd's loop does when
 * a producer registers it (1.2 s here without a tick before).
 */
#include <time.h>
#include <unistd.h>

#include "proto.h"
#include "ptest.h"

/* Under ASan one realloc of the cells (it copies them, and poisons the
 * old block) took 0.9 to 1.3 s of a 7 to 8.6 s build on the dev VM on
 * 2026-12-02 (11 to 15 %: a tick on each side of it showed the stretch
 * was the realloc alone; the first stretch of a table's unpack, its
 * calloc, 7 %); without ASan glibc moves such a block with mremap.  The
 * ASan build allows a sixth; the other build, which catches ticks gone
 * missing (12 to 14 % without them), a twelfth. */
#if defined(__SANITIZE_ADDRESS__)
#define PLAN_SHARE 6
#else
#define PLAN_SHARE 12
#endif

static double last, maxgap;
static unsigned long nticks;

static double cpu_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void tick(void *arg)
{
	double now = cpu_now();

	(void)arg;
	if (now - last > maxgap)
		maxgap = now - last;
	last = now;
	nticks++;
}

int main(void)
{
	enum { ROWS = 2048, COLS = 1000 };
	struct wex_tensor *src = calloc(ROWS, sizeof(*src)), *dst = calloc(COLS, sizeof(*dst));
	struct wex_plan_src s[2] = { { 0, src, ROWS, 0 }, { 1, src, ROWS, 0 } };
	struct wex_plan *plan = NULL;
	char err[512] = "";
	double t0, total;
	int fd;

	CHECK(src && dst, "calloc");
	pt_rows_cols(src, dst, ROWS, COLS);
	wex__plan_tick_set(tick, NULL);
	t0 = last = cpu_now();
	CHECK(wex__plan_build(s, 2, dst, COLS, 0, 1, &plan, err, sizeof(err)) == 0, "%s", err);
	fd = wex__plan_pack(plan);
	CHECK(fd >= 0, "wex__plan_pack: %s", strerror(-fd));
	tick(NULL);
	total = cpu_now() - t0;
	printf("%zu ops, %.2f s of CPU, %lu ticks, longest stretch without one %.3f s\n",
	       plan->nops, total, nticks, maxgap);
	CHECK(plan->nops > (size_t)ROWS * COLS / 2, "%zu ops", plan->nops);
	CHECK(maxgap < total / PLAN_SHARE,
	      "%.3f s without a tick in a %.2f s plan build and pack (wexd's watchdog)", maxgap,
	      total);
	close(fd);
	wex__plan_free(plan);
	free(dst);

	/* A producer table as wexd unpacks it when it registers: 512K pieces
	 * (a table of millions was not ticked).  Packed first (its memfd
	 * ticks, above), then timed alone. */
	{
		enum { PIECES = 512 * 1024 };
		struct wex_tensor *t = calloc(PIECES, sizeof(*t)), *back = NULL;
		size_t n = 0;

		CHECK(t, "calloc");
		for (uint32_t i = 0; i < PIECES; i++) {
			t[i] = src[i % ROWS];
			t[i].start[0] = 0;
			t[i].shape[0] = t[i].extent[0] = 1;
			t[i].strides[1] = 1;
			t[i].offset = (uint64_t)i * COLS;
			snprintf(t[i].name, sizeof(t[i].name), "layers.%u.w", i);
		}
		fd = wex__table_pack(t, NULL, PIECES);
		CHECK(fd >= 0, "wex__table_pack: %s", strerror(-fd));
		nticks = 0;
		maxgap = 0;
		t0 = last = cpu_now();
		CHECK(wex__table_unpack(fd, &back, NULL, &n, err, sizeof(err)) == 0, "%s", err);
		tick(NULL);
		total = cpu_now() - t0;
		printf("a table of %zu pieces unpacked: %.2f s of CPU, %lu ticks, longest stretch without one %.3f s\n",
		       n, total, nticks, maxgap);
		CHECK(n == PIECES, "%zu pieces unpacked", n);
		CHECK(maxgap < total / PLAN_SHARE,
		      "%.3f s without a tick in a %.2f s unpack of a producer table (wexd's watchdog)",
		      maxgap, total);
		close(fd);
		free(back);
		free(t);
	}
	wex__plan_tick_set(NULL, NULL);
	free(src);
	printf("PASS: ticks all through a plan's build and pack, and a table's unpack\n");
	return T_PASS;
}
