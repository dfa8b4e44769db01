/* SPDX-License-Identifier: MIT */
/*
 * released_check.c - what libwex's released-memory check costs on this
 * GPU: the walk a copy sync (or wex_attach, or wex_released) makes over
 * the engine's weights before it acquires anything, asking the driver
 * about each mapping (CU_POINTER_ATTRIBUTE_MAPPED and
 * cuMemGetAddressRange), against the device-to-device copy of the same
 * bytes (the copy that check precedes) measured in the same run.
 *
 *   memory    WEX_BENCH_MAPPINGS (2048) allocations of the device's
 *             granularity mapped back to back in one reservation: the
 *             most mappings per byte a layout can have (PyTorch's
 *             expandable segments map weights in pages of 20 MiB, ten
 *             granules at 2 MiB: a tenth of the mappings per byte);
 *   check     wex_released over the whole range: every mapping walked,
 *             nothing released (it must answer 0); best of
 *             WEX_BENCH_REPS (5) after a warm-up: check_ms and
 *             check_us_per_mapping;
 *   d2d       one cuMemcpyAsync of the range into a cuMemAlloc buffer,
 *             synchronised: d2d_ms (best of as many);
 *   ratio     check_vs_d2d = check_ms / d2d_ms: the share a copy sync of
 *             that memory adds by checking (the lower, the better);
 *   proof     the middle mapping unmapped afterwards (and mapped again):
 *             the walk must answer 1 at its first address ("check").
 * Emulated (tests/gpu/emul_cuda.c) the figures are the CPU's, and
 * queries_per_mapping (the driver calls the walk makes, counted) must be
 * 2; on a GPU it is null.
 * The run is a child process; this one prints the last line, one JSON
 * object with every key whatever happened (figures null and "error"
 * saying why: "skipped: ..." without a GPU, the run's failure, a
 * terminating signal).  Exit status 1 when the run or a check failed, 77
 * without a GPU.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>

#include "tests/gpu/gpu_util.h"
#include "tests/bench/bench_util.h"

struct outcome {
	uint64_t mapping_bytes;
	double check_ms, d2d_ms, qpm; /* NAN: not measured */
	int emulated, check;
	char error[200]; /* when !check */
};

static int nmap, reps;

static void json_num(FILE *f, const char *key, double x, const char *fmt)
{
	fprintf(f, ",\"%s\":", key);
	if (isfinite(x))
		fprintf(f, fmt, x);
	else
		fputs("null", f);
}

/* The last line: o NULL when nothing was measured; error NULL for none
 * (quotes, backslashes and control characters become spaces). */
static void print_json(FILE *f, const struct outcome *o, const char *error)
{
	double check_ms = o ? o->check_ms : NAN, d2d_ms = o ? o->d2d_ms : NAN;

	fprintf(f, "{\"bench\":\"released_check\",\"mappings\":%d,\"reps\":%d", nmap, reps);
	json_num(f, "mapping_bytes", o ? (double)o->mapping_bytes : NAN, "%.0f");
	json_num(f, "bytes", o ? (double)o->mapping_bytes * nmap : NAN, "%.0f");
	json_num(f, "check_ms", check_ms, "%.4f");
	json_num(f, "check_us_per_mapping", check_ms * 1e3 / nmap, "%.4f");
	json_num(f, "queries_per_mapping", o ? o->qpm : NAN, "%.3f");
	json_num(f, "d2d_ms", d2d_ms, "%.4f");
	json_num(f, "check_vs_d2d", check_ms / d2d_ms, "%.5f");
	fprintf(f, ",\"emulated\":%s,\"check\":%s", !o ? "null" : o->emulated ? "true" : "false",
		!o ? "null" : o->check ? "true" : "false");
	if (error) {
		fputs(",\"error\":\"", f);
		for (const char *c = error; *c; c++)
			fputc(*c == '"' || *c == '\\' || (unsigned char)*c < 0x20 ? ' ' : *c, f);
		fputc('"', f);
	}
	fputs("}\n", f);
	fflush(f);
}

static unsigned long queries(void)
{
	return emul_calls("cuPointerGetAttribute") + emul_calls("cuMemGetAddressRange");
}

/* The run, in the child: its outcome written to fd. */
static void run(int fd)
{
	struct outcome o = { .check_ms = NAN, .d2d_ms = NAN, .qpm = NAN, .check = 1 };
	CUmemGenericAllocationHandle *h = calloc((size_t)nmap, sizeof(*h));
	CUmemAccessDesc acc = gpu_rw_access();
	CUdeviceptr va, dst, mid;
	uint64_t g, bytes, at = 0;
	int ret;

	CHECK(h != NULL);
	CHECK_OK(wex__cuda_use_device(0));
	o.emulated = emulated();
	g = o.mapping_bytes = gpu_granularity();
	bytes = (uint64_t)nmap * g;
	va = gpu_expandable(nmap, g, h);
	mid = va + (uint64_t)(nmap / 2) * g;
	printf("released_check: %d mappings of %llu bytes (%.2f GiB), best of %d%s\n", nmap,
	       (unsigned long long)g, (double)bytes / (1 << 30), reps,
	       o.emulated ? " (emulated driver: CPU figures, not a GPU's)" : "");

	for (int r = 0; r <= reps && o.check; r++) {
		unsigned long q0 = queries();
		double t0 = now_ms(), t;

		ret = wex_released((void *)(uintptr_t)va, bytes, &at);
		t = now_ms() - t0;
		if (ret != 0) {
			snprintf(o.error, sizeof(o.error),
				 "wex_released answered %d over memory all mapped", ret);
			o.check = 0;
		}
		if (o.emulated)
			o.qpm = (double)(queries() - q0) / nmap;
		if (r && !(t >= o.check_ms))
			o.check_ms = t;
	}
	if (o.check && o.emulated && o.qpm != 2) {
		snprintf(o.error, sizeof(o.error), "%.3f driver queries per mapping, not 2", o.qpm);
		o.check = 0;
	}

	/* The baseline: the same bytes copied on the device. */
	CU_OK(wex__cu.cuMemAlloc(&dst, bytes));
	for (int r = 0; r <= reps && o.check; r++) {
		double t0 = now_ms(), t;

		CU_OK(wex__cu.cuMemcpyAsync(dst, va, bytes, 0));
		CU_OK(wex__cu.cuStreamSynchronize(0));
		t = now_ms() - t0;
		if (r && !(t >= o.d2d_ms))
			o.d2d_ms = t;
	}
	CU_OK(wex__cu.cuMemFree(dst));

	/* The walk really walks: the middle mapping unmapped is found. */
	if (o.check) {
		CU_OK(wex__cu.cuMemUnmap(mid, g));
		at = 0;
		ret = wex_released((void *)(uintptr_t)va, bytes, &at);
		if (ret != 1 || at != mid) {
			snprintf(o.error, sizeof(o.error),
				 "the middle mapping unmapped: wex_released answered %d (at %#llx, the mapping at %#llx)",
				 ret, (unsigned long long)at, (unsigned long long)mid);
			o.check = 0;
		}
		CU_OK(wex__cu.cuMemMap(mid, g, 0, h[nmap / 2], 0));
		CU_OK(wex__cu.cuMemSetAccess(mid, g, &acc, 1));
	}
	gpu_expandable_free(va, nmap, g, h);
	free(h);
	if (o.check)
		printf("check: %.3f ms over %d mappings (%.3f us each)%s; d2d copy of the same "
		       "bytes: %.3f ms; check_vs_d2d %.5f\n", o.check_ms, nmap,
		       o.check_ms * 1e3 / nmap, o.emulated ? " (emulated driver: CPU figures)" : "",
		       o.d2d_ms, o.check_ms / o.d2d_ms);
	fflush(stdout);
	CHECK(write(fd, &o, sizeof(o)) == (ssize_t)sizeof(o));
}

/* The line a SIGTERM/SIGINT leaves (bench_term_arm): the run goes. */
static void print_term(FILE *f, void *arg)
{
	(void)arg;
	print_json(f, NULL, "terminated by a signal before the end");
}

int main(void)
{
	struct outcome o;
	char why[512], err[640];
	pid_t pid;
	int fd, st = 0, got = 0;
	sigset_t term;

	setvbuf(stdout, NULL, _IOLBF, 0);
	nmap = (int)env_num("WEX_BENCH_MAPPINGS", 2048);
	reps = (int)env_num("WEX_BENCH_REPS", 5);
	if (nmap < 3 || nmap > 65536 || reps < 1 || reps > 1000000) {
		fprintf(stderr, "released_check: WEX_BENCH_MAPPINGS 3..65536, WEX_BENCH_REPS 1..1000000\n");
		print_json(stdout, NULL, "WEX_BENCH_MAPPINGS must be 3..65536 and WEX_BENCH_REPS 1..1000000");
		return T_EXIT_FAIL;
	}
	if (gpu_probe(why, sizeof(why))) {
		printf("SKIP: %s\n", why);
		snprintf(err, sizeof(err), "skipped: %s", why);
		print_json(stdout, NULL, err);
		return T_EXIT_SKIP;
	}
	bench_term_arm(print_term, NULL);
	pid = bench_fork_run(&fd);
	if (pid < 0) {
		fprintf(stderr, "released_check: %m\n");
		print_json(stdout, NULL, "cannot start the run (pipe or fork failed)");
		return T_EXIT_FAIL;
	}
	if (pid == 0) {
		run(fd);
		_exit(0);
	}
	while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
		;
	if (WIFEXITED(st) && WEXITSTATUS(st) == 0)
		got = read(fd, &o, sizeof(o)) == (ssize_t)sizeof(o);
	close(fd);
	if (!got)
		snprintf(err, sizeof(err), "the run failed (%s %d, see above)",
			 WIFEXITED(st) ? "exit" : "signal",
			 WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
	/* Exactly one JSON line: a signal from here on waits until it is
	 * out, and then ends us as it would have (no second line). */
	bench_hold_term(&term);
	print_json(stdout, got ? &o : NULL, !got ? err : o.check ? NULL : o.error);
	sigprocmask(SIG_UNBLOCK, &term, NULL);
	return got && o.check ? T_EXIT_PASS : T_EXIT_FAIL;
}
