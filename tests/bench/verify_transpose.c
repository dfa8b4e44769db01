/* SPDX-License-Identifier: MIT */
/*
 * verify_transpose.c - the host comparison behind `wexctl verify` and
 * WEX_SYNC_VERIFY (wex__verify_ops, src/verify.h, both sides in host
 * memory) on ops into transposed tensors: a [R, C] tensor copied into a
 * [C, R] one (row-major both), elements of 1, 2, 4 and 8 bytes, one
 * thread.  Such ops are rows of one element each.
 *
 * Baselines, measured in the same run:
 *  - memcmp of the same bytes laid out alike in two buffers (what no
 *    comparison of a transpose can beat: its ratio says what share of the
 *    memory bandwidth the comparison gets);
 *  - the element loop (each element its own row: a memcmp of the element
 *    size found at run time, the destination walked in order), the way
 *    wex compared such ops before compare_small: its ratio says what the
 *    tiles gained.
 * Each figure is the median of RUNS runs (3; up to 99 with
 * WEX_BENCH_RUNS).  Every comparison must find the sides equal, and one
 * byte flipped must then be found, where it is.  Sizes: [4096, 8192]
 * (64 MiB at 2 bytes); WEX_BENCH_SMALL=1: [512, 1024].  Last line: one
 * JSON object ("error" null, or why it failed).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tests/bench/bench_util.h"
#include "verify.h"
#include "vmm/backend.h"

/* The element loop: dst[c][r] against src[r][c], one memcmp of e bytes
 * each (e known at run time, as an op's row length is); the number of
 * elements that differ. */
static uint64_t element_loop(const char *dst, const char *src, uint64_t r, uint64_t c,
			     volatile uint64_t *e)
{
	uint64_t len = *e, bad = 0;

	for (uint64_t j = 0; j < c; j++)
		for (uint64_t i = 0; i < r; i++)
			bad += memcmp(dst + (j * r + i) * len, src + (i * c + j) * len, len) != 0;
	return bad;
}

static int fail(const char *why)
{
	fprintf(stderr, "verify_transpose: %s\n", why);
	printf("{\"bench\":\"verify_transpose\",\"error\":\"%s\"}\n", why);
	return 1;
}

int main(void)
{
	static const uint64_t elems[] = { 1, 2, 4, 8 };
	enum { NE = sizeof(elems) / sizeof(elems[0]) };
	const char *small = getenv("WEX_BENCH_SMALL"), *runs_env = getenv("WEX_BENCH_RUNS");
	uint64_t r = small && *small == '1' ? 512 : 4096, c = small && *small == '1' ? 1024 : 8192;
	int runs = runs_env && atoi(runs_env) > 0 ? atoi(runs_env) : 3;
	double gbs[NE], memcmp_gbs[NE], loop_gbs[NE], vs_memcmp[NE], vs_loop[NE];
	char *src, *dst, *twin;
	size_t cap = (size_t)(r * c * elems[NE - 1]);
	char json[2048];
	size_t n = 0;

	if (runs > 99)
		runs = 99;
	src = malloc(cap);
	dst = malloc(cap);
	twin = malloc(cap);
	if (!src || !dst || !twin)
		return fail("out of memory");
	for (size_t i = 0; i < cap; i++)
		src[i] = (char)(i * 2654435761u >> 13);
	memcpy(twin, src, cap);
	printf("verify_transpose: [%llu, %llu] against [%llu, %llu], one thread, median of %d runs\n",
	       (unsigned long long)r, (unsigned long long)c, (unsigned long long)c,
	       (unsigned long long)r, runs);
	printf("%6s %12s %12s %12s %10s %10s\n", "elem", "wex GB/s", "memcmp GB/s", "loop GB/s",
	       "vs memcmp", "vs loop");
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
		struct wex_verify_diff diff;
		double t[99], m[99], l[99];
		/* The flipped byte: element (i, j) of the source, its last byte. */
		uint64_t i = r / 3, j = c / 5, at = (j * r + i) * e + e - 1;

		if (wex_mem_host_copy(&op, 1, 1))
			return fail("wex_mem_host_copy failed");
		for (int x = 0; x < runs; x++) {
			double t0 = now_ms();
			int ret = wex__verify_ops(&op, 1, NULL, 1, &diff);

			t[x] = (now_ms() - t0) / 1e3;
			if (ret != 0)
				return fail("the comparison found equal sides different");
			t0 = now_ms();
			ret = memcmp(twin, src, bytes);
			m[x] = (now_ms() - t0) / 1e3;
			if (ret)
				return fail("memcmp found equal buffers different");
			t0 = now_ms();
			if (element_loop(dst, src, r, c, &ev))
				return fail("the element loop found equal sides different");
			l[x] = (now_ms() - t0) / 1e3;
		}
		dst[at] ^= 0x5a;
		if (wex__verify_ops(&op, 1, NULL, 1, &diff) != 1 || diff.op != 0 ||
		    diff.dst_off != at || diff.src_off != (i * c + j) * e + e - 1 || diff.bytes != 1)
			return fail("the comparison did not find the one flipped byte where it is");
		dst[at] ^= 0x5a;
		gbs[k] = (double)bytes / bench_median(t, runs) / 1e9;
		memcmp_gbs[k] = (double)bytes / bench_median(m, runs) / 1e9;
		loop_gbs[k] = (double)bytes / bench_median(l, runs) / 1e9;
		vs_memcmp[k] = gbs[k] / memcmp_gbs[k];
		vs_loop[k] = gbs[k] / loop_gbs[k];
		printf("%6llu %12.2f %12.2f %12.2f %10.3f %10.2f\n", (unsigned long long)e, gbs[k],
		       memcmp_gbs[k], loop_gbs[k], vs_memcmp[k], vs_loop[k]);
	}
	n += (size_t)snprintf(json + n, sizeof(json) - n,
			      "{\"bench\":\"verify_transpose\",\"error\":null,\"rows\":%llu,\"cols\":%llu,"
			      "\"runs\":%d,\"elem_bytes\":[1,2,4,8],",
			      (unsigned long long)r, (unsigned long long)c, runs);
	bench_json_list(json, sizeof(json), &n, "gbs", gbs, NE);
	n += (size_t)snprintf(json + n, sizeof(json) - n, ",\"baselines\":{");
	bench_json_list(json, sizeof(json), &n, "memcmp_gbs", memcmp_gbs, NE);
	n += (size_t)snprintf(json + n, sizeof(json) - n, ",");
	bench_json_list(json, sizeof(json), &n, "element_loop_gbs", loop_gbs, NE);
	n += (size_t)snprintf(json + n, sizeof(json) - n, "},\"ratios\":{");
	bench_json_list(json, sizeof(json), &n, "vs_memcmp", vs_memcmp, NE);
	n += (size_t)snprintf(json + n, sizeof(json) - n, ",");
	bench_json_list(json, sizeof(json), &n, "vs_element_loop", vs_loop, NE);
	snprintf(json + n, sizeof(json) - n, "}}");
	printf("%s\n", json);
	free(src);
	free(dst);
	free(twin);
	return 0;
}
