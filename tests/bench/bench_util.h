/* SPDX-License-Identifier: MIT */
/* bench_util.h - small helpers the GPU benchmarks share. */
#ifndef WEX_TESTS_BENCH_UTIL_H
#define WEX_TESTS_BENCH_UTIL_H

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

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

/*
 * SIGTERM/SIGINT before a benchmark's last line: what bench_term_kill
 * names is SIGKILLed (a pid, or minus a process group; 0: nothing), and
 * the line bench_term_arm preformatted is written, so that the last line
 * is still the JSON object; then the signal ends the process as it would
 * have.  Only kill() and write() run in the handler.
 */
static char bench_term_line[8192];
static size_t bench_term_len;
static volatile sig_atomic_t bench_term_kill;

static inline void bench_on_term(int sig)
{
	if (bench_term_kill)
		kill((pid_t)bench_term_kill, SIGKILL);
	if (write(1, bench_term_line, bench_term_len) < 0) {
		/* nothing more to do */
	}
	signal(sig, SIG_DFL);
	raise(sig);
}

/* Formats the line a signal leaves, print(f, arg), after a newline (the
 * signal may cut a line in the middle), and installs bench_on_term for
 * SIGTERM and SIGINT. */
static inline void bench_term_arm(void (*print)(FILE *f, void *arg), void *arg)
{
	FILE *f = fmemopen(bench_term_line, sizeof(bench_term_line), "w");

	if (f) {
		setvbuf(f, NULL, _IONBF, 0);
		fputc('\n', f);
		print(f, arg);
		bench_term_len = (size_t)ftell(f);
		fclose(f);
	}
	signal(SIGTERM, bench_on_term);
	signal(SIGINT, bench_on_term);
}

#endif
