/* SPDX-License-Identifier: MIT */
/*
 * name_flood.c - proves that tensor names chosen to collide cannot stall
 * the planner: 30000 16-byte names made to share the low 32 bits of the
 * planner's former name hash (an unkeyed multiply-xorshift per 8 bytes,
 * inverted here) are spread over the name table's slots by its keyed
 * hash, and plan to the same plan as ordinary names.
 *
 * Found by review: the names are clients' (a producer's tensor table, a
 * consumer's layout) and wexd plans on its event loop; with every name in
 * one run of the name table each lookup walked the run, 100000 such names
 * took one fetch 34 s, during which wexd answered no other client.
 */
#include <time.h>

#include "ptest.h"

#define N 30000

static const uint64_t K = 0x9e3779b97f4a7c15ull;

static uint64_t mix(uint64_t h, uint64_t w)
{
	h = (h ^ w) * K;
	return h ^ (h >> 29);
}

/* The old name_hash's value for a name of 16 bytes w1 w2 is mix(mix(h0,
 * w1), w2): w2 is solved for to give a chosen value. */
static void crafted(char *name, uint32_t i, uint64_t *rng)
{
	uint64_t kinv = K, h1, w2;

	for (int k = 0; k < 6; k++)
		kinv *= 2 - K * kinv;
	snprintf(name, 9, "c%07u", i);
	memcpy(&h1, name, 8);
	h1 = mix(1469598103934665603ull ^ 16, h1);
	for (;;) {
		uint64_t t, z;
		int zero = 0;

		*rng = *rng * 6364136223846793005ull + 1442695040888963407ull;
		t = *rng & 0xffffffff00000000ull; /* low 32 bits 0: one slot */
		z = t ^ (t >> 29) ^ (t >> 58);
		w2 = (z * kinv) ^ h1;
		for (int b = 0; b < 8; b++)
			zero |= ((w2 >> (8 * b)) & 0xff) == 0;
		if (!zero)
			break;
	}
	memcpy(name + 8, &w2, 8);
	name[16] = '\0';
	CHECK(mix(h1, w2) << 32 == 0, "name %u does not collide", i);
}

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Plans N one-byte tensors named by `craft` onto the same layout. */
static double plan_time(int craft, uint64_t *hash)
{
	struct wex_tensor *t = calloc(N, sizeof(*t));
	struct wex_plan_src src = { 0 };
	struct wex_plan *p = NULL;
	uint64_t rng = 42;
	char err[256];
	double t0;

	CHECK(t, "calloc");
	for (uint32_t i = 0; i < N; i++) {
		if (craft)
			crafted(t[i].name, i, &rng);
		else
			snprintf(t[i].name, sizeof(t[i].name), "n%015u", i);
		t[i].dtype = WEX_DT_U8;
		t[i].ndim = 1;
		t[i].shape[0] = t[i].extent[0] = 1;
		t[i].offset = i;
	}
	src.t = t;
	src.n = N;
	t0 = now();
	CHECK(wex__plan_build(&src, 1, t, N, 0, 1, &p, err, sizeof(err)) == 0, "%s", err);
	t0 = now() - t0;
	CHECK(p->nops >= 1 && p->stats.bytes_needed == N, "%zu ops, %llu bytes needed", p->nops,
	      (unsigned long long)p->stats.bytes_needed);
	*hash = p->hash;
	wex__plan_free(p);
	free(t);
	return t0;
}

/* The most crafted names the planner's hash puts in one of 65536 slots
 * (the table's low bits, as name_find probes them). */
static uint32_t worst_slot(void)
{
	struct wex_tensor t = { .dtype = WEX_DT_U8, .ndim = 1, .shape = { 1 }, .extent = { 1 } };
	struct wex_plan_src src = { .t = &t, .n = 1 };
	struct wex_planner *pl = NULL;
	uint16_t *count = calloc(65536, sizeof(*count));
	uint64_t rng = 42;
	uint32_t worst = 0;
	char name[64], err[256];

	CHECK(count, "calloc");
	snprintf(t.name, sizeof(t.name), "x");
	CHECK(wex__planner_new(&src, 1, &pl, err, sizeof(err)) == 0, "%s", err);
	for (uint32_t i = 0; i < N; i++) {
		uint16_t *k;

		crafted(name, i, &rng);
		k = &count[wex__planner_name_hash(pl, name) & 0xffff];
		if (++*k > worst)
			worst = *k;
	}
	wex__planner_free(pl);
	free(count);
	return worst;
}

int main(void)
{
	uint64_t ho, hc;
	double plain = plan_time(0, &ho), bad = plan_time(1, &hc);
	uint32_t worst = worst_slot();

	/* (Times printed, not judged: a loaded machine makes them noisy.) */
	printf("%d ordinary names: %.3f s; %d colliding names: %.3f s; the most in one of 65536 "
	       "slots: %u\n", N, plain, N, bad, worst);
	CHECK(ho == hc, "the names changed the plan");
	/* Spread at random, 30000 names put at most about 8 in one slot;
	 * under the former hash all of them shared one. */
	CHECK(worst < 64,
	      "%u of %d names made to collide share one slot of the planner's name table: each "
	      "lookup probes that whole run", worst, N);
	return T_PASS;
}
