/* SPDX-License-Identifier: MIT */
/*
 * plan_cancel.c - proves that a plan whose thread's stop flag is set
 * (wex__plan_cancel_set; wexd sets it when the producers' layout changes
 * or the model goes while a planner thread builds its plan) ends with
 * -ECANCELED at the next consumer piece rather than being built to its
 * end, and that the flag is the calling thread's alone:
 *  - a flag already set: -ECANCELED, err saying so, no plan;
 *  - a flag set from the tick hook after the first ticks: the build stops
 *    within one consumer piece of it (of 256), no plan, nothing leaked
 *    (ASan);
 *  - with the flag cleared (NULL), the same build plans in full;
 *  - a flag set at any tick, the later stages' (holder sets, split, ops)
 *    included, ends the build at the next stage;
 *  - a flag set on one thread does not stop another thread's build;
 *  - a producer table of BIG pieces (its index a sort of BIG entries): a
 *    flag set while the index is sorted, in its runs' insertion or in its
 *    merges, ends the build there (2 ticks at most after it, a tick every
 *    64K comparisons), the error naming the index; with no flag the
 *    same table plans every byte once, from where it is.  Before, the
 *    sort (qsort) ran to its end and the build stopped only at its first
 *    consumer piece.
 */
#include <errno.h>
#include <pthread.h>

#include "ptest.h"

enum { ROWS = 256, COLS = 256, BIG = 150000 };

static struct wex_tensor src[ROWS], dst[COLS], bigdst[1];
static struct wex_tensor *bigsrc;
static atomic_int stop;
static unsigned long nticks, ticks_at_stop, stop_at = 20;
static int pieces_after; /* ticks after the flag was set */

/* Ticks come at each consumer piece's steps (two a piece) and every 16K
 * cells: the stop is set at the 20th, and counted after. */
static void tick(void *arg)
{
	(void)arg;
	if (++nticks == stop_at) {
		atomic_store(&stop, 1);
		ticks_at_stop = nticks;
	} else if (ticks_at_stop) {
		pieces_after++;
	}
}

static int build(struct wex_plan **plan, char *err, size_t errlen)
{
	struct wex_plan_src s = { 0, src, ROWS, 0 };

	*plan = NULL;
	return wex__plan_build(&s, 1, dst, COLS, 0, 1, plan, err, errlen);
}

static void *other_thread(void *arg)
{
	struct wex_plan *plan;
	char err[512] = "";
	int *ret = arg;

	/* No flag set on this thread: the main thread's does not reach it. */
	*ret = build(&plan, err, sizeof(err));
	if (!*ret) {
		if (plan->nops < COLS)
			*ret = -EPROTO;
		wex__plan_free(plan);
	}
	return NULL;
}

int main(void)
{
	struct wex_plan *plan;
	char err[512] = "";
	pthread_t th;
	int ret, other = -1;

	pt_rows_cols(src, dst, ROWS, COLS);

	/* 1. Set before the build. */
	atomic_store(&stop, 1);
	wex__plan_cancel_set(&stop);
	ret = build(&plan, err, sizeof(err));
	CHECK(ret == -ECANCELED, "a build with its stop flag set: %d (%s)", ret, err);
	CHECK(!plan, "a stopped build gave a plan");
	CHECK(strstr(err, "no longer wanted"), "its error: %s", err);

	/* ... and on another thread the flag is not seen. */
	CHECK(!pthread_create(&th, NULL, other_thread, &other), "pthread_create");
	CHECK(!pthread_join(th, NULL), "pthread_join");
	CHECK(other == 0, "another thread's build stopped by this thread's flag: %d", other);

	/* 2. Set while it builds (from the tick hook): it stops within a
	 * consumer piece, far before its 256th. */
	atomic_store(&stop, 0);
	wex__plan_tick_set(tick, NULL);
	err[0] = '\0';
	ret = build(&plan, err, sizeof(err));
	CHECK(ret == -ECANCELED, "a build whose stop flag was set midway: %d (%s)", ret, err);
	CHECK(!plan, "a build stopped midway gave a plan");
	CHECK(ticks_at_stop == 20 && pieces_after <= 2,
	      "%d ticks after the stop flag was set at tick %lu: the build went on", pieces_after,
	      ticks_at_stop);
	printf("stopped %d tick(s) after the flag, at %s\n", pieces_after, err);

	/* 3. No flag: the full plan (an op at least a column), its ticks
	 * counted. */
	wex__plan_cancel_set(NULL);
	nticks = ticks_at_stop = 0;
	stop_at = 0;
	ret = build(&plan, err, sizeof(err));
	CHECK(ret == 0, "a build with no stop flag: %d (%s)", ret, err);
	CHECK(plan->nops >= COLS, "%zu ops, %d at least expected", plan->nops, COLS);
	wex__plan_free(plan);

	/* 4. The flag set at each of the last ticks in turn, the later
	 * stages' included (holder sets, split and balance, the ops: a tick
	 * every 16K of the 64K cells in each of their loops): it stops at the next
	 * stage, 8 ticks at most after the flag (the split and balance's two
	 * loops), or, set in the last stage, ends as built.  Checked only
	 * with each consumer piece, a flag set in the holder sets let the
	 * build run its last 19 ticks. */
	{
		unsigned long total = nticks, worst = 0;

		wex__plan_cancel_set(&stop);
		/* (The last 25: the cut's last pieces and every later stage.
		 * All 537 took 52 s under ASan; case 2 covers the cut.) */
		for (stop_at = total > 25 ? total - 25 : 1; stop_at <= total; stop_at++) {
			atomic_store(&stop, 0);
			nticks = ticks_at_stop = 0;
			pieces_after = 0;
			ret = build(&plan, err, sizeof(err));
			CHECK(ret == 0 || ret == -ECANCELED, "flag at tick %lu: %d (%s)", stop_at, ret,
			      err);
			if (!ret)
				wex__plan_free(plan);
			if ((unsigned long)pieces_after > worst)
				worst = (unsigned long)pieces_after;
			CHECK(pieces_after <= 8,
			      "flag at tick %lu of %lu: %d more ticks after it (ret %d): a stage went on",
			      stop_at, total, pieces_after, ret);
		}
		printf("flag at each of the last 25 of %lu ticks: at most %lu ticks after it\n", total,
		       worst);
	}
	/* 5. The producers' index of BIG pieces, its sort stopped. */
	{
		struct wex_plan_src s = { 0, NULL, BIG, 0 };
		unsigned char *mark = calloc(BIG, 1);
		unsigned long total, first;
		uint64_t bytes = 0;

		bigsrc = calloc(BIG, sizeof(*bigsrc));
		CHECK(bigsrc && mark, "calloc");
		s.t = bigsrc;
		pt_rows_cols(bigsrc, bigdst, BIG, 1);
		/* Listed in a shuffled order, so that the sort has work in
		 * each of its phases (listed in order, its runs' insertion
		 * took a comparison a piece). */
		for (uint64_t i = BIG - 1, x = 12345; i > 0; i--) {
			struct wex_tensor t;
			uint64_t j;

			x = x * 6364136223846793005ull + 1442695040888963407ull;
			j = (x >> 33) % (i + 1);
			t = bigsrc[i];
			bigsrc[i] = bigsrc[j];
			bigsrc[j] = t;
		}
		wex__plan_cancel_set(NULL);
		nticks = ticks_at_stop = 0;
		stop_at = 0;
		ret = wex__plan_build(&s, 1, bigdst, 1, 0, 1, &plan, err, sizeof(err));
		CHECK(ret == 0, "the big table with no stop flag: %d (%s)", ret, err);
		/* Piece i holds byte i, at offset i; the consumer's byte i is
		 * at offset i: every op reads where it writes. */
		for (size_t o = 0; o < plan->nops; o++) {
			const struct wex_plan_op *op = &plan->ops[o];
			uint64_t rows = 1;

			for (uint32_t k = 0; k < op->nouter; k++)
				rows *= op->count[k];
			for (uint64_t r = 0; r < rows; r++) {
				uint64_t rest = r;
				int64_t so = (int64_t)op->src_off, dof = (int64_t)op->dst_off;

				for (uint32_t k = 0; k < op->nouter; k++) {
					so += (int64_t)(rest % op->count[k]) * op->src_stride[k];
					dof += (int64_t)(rest % op->count[k]) * op->dst_stride[k];
					rest /= op->count[k];
				}
				for (uint64_t b = 0; b < op->len; b++) {
					CHECK(so == dof && (uint64_t)dof + b < BIG,
					      "op %zu row %llu reads %lld, writes %lld", o,
					      (unsigned long long)r, (long long)so, (long long)dof);
					mark[dof + (int64_t)b]++;
					bytes++;
				}
			}
		}
		wex__plan_free(plan);
		for (size_t i = 0; i < BIG; i++)
			CHECK(mark[i] == 1, "byte %zu of the big tensor written %d times", i, mark[i]);
		CHECK(bytes == BIG, "%llu bytes planned of %d", (unsigned long long)bytes, BIG);
		/* The first loop over the pieces ticks every 16K of them; the
		 * index's sort after it, every 64K comparisons: some 11 in
		 * the runs' insertion, 32 merging. */
		first = (BIG + 16383) / 16384;
		total = nticks;
		CHECK(total > first + 40, "%lu ticks for the big table: its sort not seen", total);
		wex__plan_cancel_set(&stop);
		for (int k = 0; k < 2; k++) {
			/* In the runs' insertion, then in the merges. */
			stop_at = first + (k ? 25 : 3);
			atomic_store(&stop, 0);
			nticks = ticks_at_stop = 0;
			pieces_after = 0;
			err[0] = '\0';
			ret = wex__plan_build(&s, 1, bigdst, 1, 0, 1, &plan, err, sizeof(err));
			CHECK(ret == -ECANCELED, "flag at tick %lu of the big table's %lu: %d (%s)",
			      stop_at, total, ret, err);
			CHECK(strstr(err, "the producers' index"), "flag at tick %lu: stopped %s",
			      stop_at, err);
			CHECK(pieces_after <= 2, "flag at tick %lu of %lu: %d more ticks after it",
			      stop_at, total, pieces_after);
			printf("big table, flag at tick %lu of %lu: %d tick(s) after it, %s\n", stop_at,
			       total, pieces_after, err);
		}
		free(bigsrc);
		free(mark);
	}
	wex__plan_tick_set(NULL, NULL);
	wex__plan_cancel_set(NULL);
	printf("PASS: a planner thread's stop flag ends its build at the next piece, and only its own\n");
	return 0;
}
