/* SPDX-License-Identifier: MIT */
/* bench_util.h - small helpers the GPU benchmarks share. */
#ifndef WEX_TESTS_BENCH_UTIL_H
#define WEX_TESTS_BENCH_UTIL_H

#include <signal.h>
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

/* Before a benchmark's last line: SIGTERM and SIGINT are held (put into
 * *held) and set back to their default, so one arriving while the line is
 * written ends the process after it, as it would have, and no handler
 * writes a second line.  Release with sigprocmask(SIG_UNBLOCK, held, NULL). */
static inline void bench_hold_term(sigset_t *held)
{
	sigemptyset(held);
	sigaddset(held, SIGTERM);
	sigaddset(held, SIGINT);
	sigprocmask(SIG_BLOCK, held, NULL);
	signal(SIGTERM, SIG_DFL);
	signal(SIGINT, SIG_DFL);
}

#endif
