/* SPDX-License-Identifier: MIT */
/* bench_util.h - small helpers the benchmarks share. */
#ifndef WEX_TESTS_BENCH_UTIL_H
#define WEX_TESTS_BENCH_UTIL_H

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
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

static inline int bench_dbl_cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

/* The median of v[0..n), n >= 1 (v sorted in place; of an even count,
 * the mean of the middle two). */
static inline double bench_median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof(*v), bench_dbl_cmp);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* Appends "key":[v0,...] (3 decimals) at json + *n, cap bytes in all. */
static inline void bench_json_list(char *json, size_t cap, size_t *n, const char *key,
				   const double *v, int nv)
{
	*n += (size_t)snprintf(json + *n, cap - *n, "\"%s\":[", key);
	for (int k = 0; k < nv; k++)
		*n += (size_t)snprintf(json + *n, cap - *n, "%s%.3f", k ? "," : "", v[k]);
	*n += (size_t)snprintf(json + *n, cap - *n, "]");
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

/*
 * Forks the process that runs the benchmark, with a pipe for its figures.
 * Parent: returns the child's pid, named in bench_term_kill, with the
 * pipe's read end in *fd.  Child: returns 0 with the write end in *fd,
 * SIGTERM and SIGINT at their default (one JSON line, from the parent)
 * and killed with the parent.  -1 (errno set) when pipe or fork fails.
 */
static inline pid_t bench_fork_run(int *fd)
{
	pid_t pid, parent = getpid();
	int p[2];

	if (pipe2(p, O_CLOEXEC) < 0)
		return -1;
	pid = fork();
	if (pid < 0) {
		close(p[0]);
		close(p[1]);
		return -1;
	}
	if (pid == 0) {
		signal(SIGTERM, SIG_DFL);
		signal(SIGINT, SIG_DFL);
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent)
			_exit(1);
		close(p[0]);
		*fd = p[1];
		return 0;
	}
	bench_term_kill = pid;
	close(p[1]);
	*fd = p[0];
	return pid;
}

#endif
