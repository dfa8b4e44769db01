/* SPDX-License-Identifier: MIT */
/*
 * host_transpose.c - the host copy executor (wex_mem_host_copy, behind
 * every host COPY sync) on copies into transposed tensors: a [R, C]
 * tensor into a [C, R] one (row-major both), elements of 1, 2, 4 and 8
 * bytes, one thread.  Such ops are rows of one element each.
 *
 * Baselines, measured in the same run on the same buffers:
 *  - memcpy of the same bytes (the copy no transpose can beat: its
 *    ratio says what share of the memory bandwidth a transpose gets);
 *  - the element loop (each element its own row: a memcpy of the
 *    element size found at run time, with the destination walked in
 *    order), which is what wex did before copy_small: its ratio says
 *    what the tiles gained.
 * Each figure is the median of RUNS runs (3; 5 with WEX_BENCH_RUNS).  The
 * result is checked against the source byte for byte.
 * Sizes: [4096, 8192] (64 MiB at 2 bytes); WEX_BENCH_SMALL=1: [512,
 * 1024].  Last line: one JSON object ("error" null, or why it failed).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tests/bench/bench_util.h"
#include "vmm/backend.h"

/* The element loop: dst[c][r] = src[r][c], one memcpy of e bytes each
 * (e known at run time, as an op's row length is). */
static void element_loop(char *dst, const char *src, uint64_t r, uint64_t c, volatile uint64_t *e)
{
	uint64_t len = *e;

	for (uint64_t j = 0; j < c; j++)
		for (uint64_t i = 0; i < r; i++)
			memcpy(dst + (j * r + i) * len, src + (i * c + j) * len, len);
}

static int fail(const char *why)
{
	fprintf(stderr, "host_transpose: %s\n", why);
	printf("{\"bench\":\"host_transpose\",\"error\":\"%s\"}\n", why);
	return 1;
}

int main(void)
{
	static const uint64_t elems[] = { 1, 2, 4, 8 };
	enum { NE = sizeof(elems) / sizeof(elems[0]) };
	const char *small = getenv("WEX_BENCH_SMALL"), *runs_env = getenv("WEX_BENCH_RUNS");
	uint64_t r = small && *small == '1' ? 512 : 4096, c = small && *small == '1' ? 1024 : 8192;
	int runs = runs_env && atoi(runs_env) > 0 ? atoi(runs_env) : 3;
	double gbs[NE], memcpy_gbs[NE], loop_gbs[NE], vs_memcpy[NE], vs_loop[NE];
	char *src, *dst;
	size_t cap = (size_t)(r * c * elems[NE - 1]);
	char json[2048];
	size_t n = 0;

	if (runs > 99)
		runs = 99;
	src = malloc(cap);
	dst = malloc(cap);
	if (!src || !dst)
		return fail("out of memory");
	for (size_t i = 0; i < cap; i++)
		src[i] = (char)(i * 2654435761u >> 13);
	memset(dst, 0, cap);
	printf("host_transpose: [%llu, %llu] into [%llu, %llu], one thread, median of %d runs\n",
	       (unsigned long long)r, (unsigned long long)c, (unsigned long long)c,
	       (unsigned long long)r, runs);
	printf("%6s %12s %12s %12s %10s %10s\n", "elem", "wex GB/s", "memcpy GB/s", "loop GB/s",
	       "vs memcpy", "vs loop");
	for (int k = 0; k < NE; k++) {
		uint64_t e = elems[k], bytes = r * c * e;
		volatile uint64_t ev = e;
		struct wex_copy_op op = { .src = (uint64_t)(uintptr_t)src,
					  .dst = (uint64_t)(uintptr_t)dst,
					  .len = e,
					  .nouter = 2,
					  .count = { r, c },
					  .src_stride = { (int64_t)(c * e), (int64_t)e },
					  .dst_stride = { (int64_t)e, (int64_t)(r * e) } };
		double t[99], m[99], l[99];

		for (int i = 0; i < runs; i++) {
			double t0 = now_ms();

			if (wex_mem_host_copy(&op, 1, 1))
				return fail("wex_mem_host_copy failed");
			t[i] = (now_ms() - t0) / 1e3;
			t0 = now_ms();
			memcpy(dst, src, bytes);
			m[i] = (now_ms() - t0) / 1e3;
			t0 = now_ms();
			element_loop(dst, src, r, c, &ev);
			l[i] = (now_ms() - t0) / 1e3;
		}
		/* The last copy in dst is the loop's: wex's once more, checked. */
		memset(dst, 0, bytes);
		if (wex_mem_host_copy(&op, 1, 1))
			return fail("wex_mem_host_copy failed");
		for (uint64_t i = 0; i < r; i++)
			for (uint64_t j = 0; j < c; j++)
				if (memcmp(dst + (j * r + i) * e, src + (i * c + j) * e, e))
					return fail("the transposed bytes are wrong");
		gbs[k] = (double)bytes / bench_median(t, runs) / 1e9;
		memcpy_gbs[k] = (double)bytes / bench_median(m, runs) / 1e9;
		loop_gbs[k] = (double)bytes / bench_median(l, runs) / 1e9;
		vs_memcpy[k] = gbs[k] / memcpy_gbs[k];
		vs_loop[k] = gbs[k] / loop_gbs[k];
		printf("%6llu %12.2f %12.2f %12.2f %10.3f %10.2f\n", (unsigned long long)e, gbs[k],
		       memcpy_gbs[k], loop_gbs[k], vs_memcpy[k], vs_loop[k]);
	}
	n += (size_t)snprintf(json + n, sizeof(json) - n,
			      "{\"bench\":\"host_transpose\",\"error\":null,\"rows\":%llu,\"cols\":%llu,"
			      "\"runs\":%d,\"elem_bytes\":[1,2,4,8],",
			      (unsigned long long)r, (unsigned long long)c, runs);
	bench_json_list(json, sizeof(json), &n, "gbs", gbs, NE);
	n += (size_t)snprintf(json + n, sizeof(json) - n, ",\"baselines\":{");
	bench_json_list(json, sizeof(json), &n, "memcpy_gbs", memcpy_gbs, NE);
	n += (size_t)snprintf(json + n, sizeof(json) - n, ",");
	bench_json_list(json, sizeof(json), &n, "element_loop_gbs", loop_gbs, NE);
	n += (size_t)snprintf(json + n, sizeof(json) - n, "},\"ratios\":{");
	bench_json_list(json, sizeof(json), &n, "vs_memcpy", vs_memcpy, NE);
	n += (size_t)snprintf(json + n, sizeof(json) - n, ",");
	bench_json_list(json, sizeof(json), &n, "vs_element_loop", vs_loop, NE);
	snprintf(json + n, sizeof(json) - n, "}}");
	printf("%s\n", json);
	free(src);
	free(dst);
	return 0;
}
