/* SPDX-License-Identifier: MIT */
/* bench_util.h - small helpers the GPU benchmarks share. */
#ifndef WEX_TESTS_BENCH_UTIL_H
#define WEX_TESTS_BENCH_UTIL_H

#include <stdlib.h>
#include <time.h>

/* Monotonic wall clock in milliseconds. */
static inline double now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* $name as a number, or def when unset or empty. */
static inline double env_num(const char *name, double def)
{
	const char *v = getenv(name);

	return v && *v ? atof(v) : def;
}

#endif
