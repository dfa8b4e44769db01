/* SPDX-License-Identifier: MIT */
/*
 * host_staging.c - host staging (GPUs without peer access) through wexd:
 * the trainer copies its GPU weights into a host segment and publishes,
 * the engine's copy sync moves them onto its GPU.  Measured twice in the
 * same run, with a pinned segment (WEX_SEG_HOST_PINNED; the engine pins
 * its read-only mapping on its first sync) and with a pageable one
 * (WEX_SEG_HOST, WEX_HOST_PIN=0 on the engine's side), against the
 * driver's limit measured here too: one cuMemcpyAsync of the same bytes
 * between GPU memory and a private pinned buffer (cuMemHostRegister), in
 * each direction.
 *
 *   producer  WEX_BENCH_GB (4) of bf16 weights on device 0 in
 *             WEX_BENCH_TENSORS (300) tensors; per version v it sets every
 *             byte to v (cuMemsetD8), begins the write, copies the weights
 *             into the host segment with one cuMemcpyAsync and publishes
 *             (publish waits for the copy): d2h_*_ms is that copy plus
 *             publish;
 *   consumer  the same tensors in its own GPU memory (wex_cuda_alloc);
 *             a copy sync per version (copy_*_ms: the wex_sync call), then
 *             the first, middle and last 64 bytes of every tensor are
 *             checked to hold v.
 * Each side runs WEX_BENCH_REPS (3) + 1 versions per segment kind: the
 * first is reported as *_first_ms (the engine's first sync imports and
 * pins), the figure is the best of the others.  After it the engine takes
 * a view of the segment to tell whether its mapping really is pinned
 * ("engine_pinned"; where the device cannot pin read-only memory the
 * "pinned" figures are pageable ones, and the JSON says so), and that the
 * pageable run's is not ("engine_pageable").  The two limits are measured
 * one after the other, each process alone.  The last line is one JSON
 * object; ratios: *_vs_limit = limit ms / wex ms (1: the driver's best),
 * pinned_vs_pageable = pageable ms / pinned ms (above 1: pinning pays).
 * As in gpu_sync, that line comes whatever happens, from the parent alone,
 * which never touches CUDA: the run (wexd, the trainer and the engine)
 * is a child of it that sends it the figures.  Without a GPU, after a
 * failed process, past WEX_BENCH_BUDGET_S (240) seconds (the run is
 * killed) or when terminated by a signal, every key is still there, the
 * figures null and "error" saying why ("skipped: ..." without a GPU).
 * Exit status 1 when a check or a process failed, or the pageable run's
 * mapping was pinned.  Without a GPU it
 * prints the reason and exits 77; with the emulated driver
 * (host_staging_emul) it checks the logic, and its times mean nothing.
 */
#include <math.h>
#include <sys/mman.h>
#include <time.h>

#include "tests/gpu/gpu_util.h"
#include "tests/bench/bench_util.h"

#define COLS 4096 /* bf16 elements a row */

static int nt, reps;
static uint64_t rows, total;

struct figures {
	double limit_ms, ms[2], first_ms[2]; /* [0] pinned, [1] pageable */
	size_t bad;
};

/* The run (a child) -> the parent, which prints the JSON line. */
struct outcome {
	struct figures pf, cf; /* the trainer's, the engine's */
	int pinned[2];         /* the engine's mapping pinned: [0] pinned run, [1] pageable */
	int emulated;
	char dev[WEX_UUID_LEN];
};

static void put(int fd, const void *p, size_t n)
{
	CHECK(write(fd, p, n) == (ssize_t)n);
}

static void get(int fd, void *p, size_t n)
{
	CHECK(read(fd, p, n) == (ssize_t)n);
}

static void note(double *first, double *best, int v, double ms)
{
	if (v == 1)
		*first = ms;
	else if (v == 2 || ms < *best)
		*best = ms;
}

/* Best of reps of one cuMemcpyAsync of `total` bytes on a fresh stream. */
static double limit_ms(CUdeviceptr dst, CUdeviceptr src)
{
	double best = 0;
	CUstream s;

	CU_OK(wex__cu.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
	for (int i = 0; i <= reps; i++) {
		double t0 = now_ms(), ms;

		CU_OK(wex__cu.cuMemcpyAsync(dst, src, (size_t)total, s));
		CU_OK(wex__cu.cuStreamSynchronize(s));
		ms = now_ms() - t0;
		if (i == 1 || (i > 1 && ms < best))
			best = ms;
	}
	CU_OK(wex__cu.cuStreamDestroy(s));
	return best;
}

/* A private pinned host buffer of `total` bytes. */
static void *pinned_buffer(void)
{
	void *p = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	CHECK(p != MAP_FAILED);
	memset(p, 1, total); /* fault every page in before timing */
	CU_OK(wex__cu.cuMemHostRegister(p, (size_t)total, CU_MEMHOSTREGISTER_PORTABLE));
	return p;
}

static void free_pinned(void *p)
{
	CU_OK(wex__cu.cuMemHostUnregister(p));
	munmap(p, total);
}

static void producer(int in, int out)
{
	static const char *const model[2] = { "staging-pinned", "staging-pageable" };
	struct wex_client_params p = { .field_mask = WEX_CLIENT_FIELD_ROLE | WEX_CLIENT_FIELD_MODEL,
				       .role = WEX_ROLE_PRODUCER };
	struct wex_tensor *t = calloc((size_t)nt, sizeof(*t));
	struct figures f = { 0 };
	void *train, *buf;
	CUstream s;

	CHECK(t != NULL);
	gpu_bf16_tensors(t, nt, rows, COLS, 0);
	train = wex_cuda_alloc((ssize_t)total, 0, NULL);
	CHECK(train != NULL);
	CHECK_OK(wex__cuda_use_device(0));
	buf = pinned_buffer();
	f.limit_ms = limit_ms((CUdeviceptr)(uintptr_t)buf, (CUdeviceptr)(uintptr_t)train);
	free_pinned(buf);
	/* The engine measures its limit next, alone on the host. */
	put(out, "L", 1);
	{
		char ch;

		get(in, &ch, 1);
	}
	for (int k = 0; k < 2; k++) {
		wex_client_t *c;
		uint32_t seg;
		void *host;

		p.model = model[k];
		CHECK_OK(wex_client_open(&p, &c));
		CHECK_OK(wex_segment_alloc(c, k == 0 ? WEX_SEG_HOST_PINNED : WEX_SEG_HOST, 0, total,
					   &seg, &host));
		for (int i = 0; i < nt; i++)
			t[i].segment = seg;
		CHECK_OK(wex_register_tensors(c, t, (size_t)nt));
		CHECK_OK(wex__cuda_use_device(0));
		CU_OK(wex__cu.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
		for (int v = 1; v <= reps + 1; v++) {
			double t0;
			char ch;

			/* This step's weights: every byte v. */
			CHECK_OK(wex__cuda_use_device(0));
			CU_OK(wex__cu.cuMemsetD8Async((CUdeviceptr)(uintptr_t)train, (unsigned char)v,
						      (size_t)total, s));
			CU_OK(wex__cu.cuStreamSynchronize(s));
			CHECK_OK(wex_begin_write(c, (uint64_t)v, 60000));
			t0 = now_ms();
			CHECK_OK(wex__cuda_use_device(0));
			CU_OK(wex__cu.cuMemcpyAsync((CUdeviceptr)(uintptr_t)host,
						    (CUdeviceptr)(uintptr_t)train, (size_t)total, s));
			CHECK_OK(wex_publish(c, (uint64_t)v)); /* waits for the copy */
			note(&f.first_ms[k], &f.ms[k], v, now_ms() - t0);
			put(out, "p", 1);
			get(in, &ch, 1); /* the engine copied it */
		}
		CU_OK(wex__cu.cuStreamDestroy(s));
		wex_client_close(c);
	}
	put(out, &f, sizeof(f));
	wex_cuda_free(train, (ssize_t)total, 0, NULL);
	free(t);
	_exit(0);
}

/* First, middle and last 64 bytes of every tensor hold v. */
static size_t check(const void *mine, const struct wex_tensor *t, unsigned char v)
{
	unsigned char b[64];
	size_t bad = 0;

	for (int i = 0; i < nt; i++) {
		uint64_t len = wex_tensor_nbytes(&t[i]);
		uint64_t at[3] = { 0, len / 2 & ~63ull, len - 64 };

		for (int k = 0; k < 3; k++) {
			CU_OK(wex__cu.cuMemcpyDtoH(b, (CUdeviceptr)(uintptr_t)mine + t[i].offset + at[k],
						   64));
			for (int j = 0; j < 64; j++)
				if (b[j] != v) {
					bad++;
					break;
				}
		}
	}
	return bad;
}

static void json_num(FILE *f, const char *key, double v, int comma)
{
	if (isfinite(v))
		fprintf(f, "\"%s\":%.4g%s", key, v, comma ? "," : "");
	else
		fprintf(f, "\"%s\":null%s", key, comma ? "," : "");
}

/*
 * The last line: one JSON object with every key.  o is NULL when the run
 * gave no figures (its keys are null then); error, when not NULL, says
 * what went wrong (quotes, backslashes and control characters become
 * spaces).
 */
static void print_json(FILE *f, const struct outcome *o, const char *error)
{
	static const struct outcome none = {
		.pf = { .limit_ms = NAN, .ms = { NAN, NAN }, .first_ms = { NAN, NAN } },
		.cf = { .limit_ms = NAN, .ms = { NAN, NAN }, .first_ms = { NAN, NAN } },
	};
	const struct outcome *r = o ? o : &none;
	const struct figures *pf = &r->pf, *cf = &r->cf;

	fprintf(f, "{\"bench\":\"host_staging\",\"path\":\"wexd, WEX_SEG_HOST_PINNED vs WEX_SEG_HOST, copy sync into GPU memory\","
		"\"device\":\"%s\",\"emulated\":%s,\"bytes\":%llu,\"tensors\":%d,\"reps\":%d,",
		r->dev, !o ? "null" : o->emulated ? "true" : "false", (unsigned long long)total, nt,
		reps);
	if (error) {
		fputs("\"error\":\"", f);
		for (const char *c = error; *c; c++)
			fputc(*c == '"' || *c == '\\' || (unsigned char)*c < 0x20 ? ' ' : *c, f);
		fputs("\",", f);
	}
	json_num(f, "d2h_limit_ms", pf->limit_ms, 1);
	json_num(f, "d2h_pinned_ms", pf->ms[0], 1);
	json_num(f, "d2h_pageable_ms", pf->ms[1], 1);
	json_num(f, "h2d_limit_ms", cf->limit_ms, 1);
	json_num(f, "copy_pinned_ms", cf->ms[0], 1);
	json_num(f, "copy_pinned_first_ms", cf->first_ms[0], 1);
	json_num(f, "copy_pageable_ms", cf->ms[1], 1);
	json_num(f, "step_pinned_ms", pf->ms[0] + cf->ms[0], 1);
	json_num(f, "step_pageable_ms", pf->ms[1] + cf->ms[1], 1);
	json_num(f, "d2h_pinned_vs_limit", pf->limit_ms / pf->ms[0], 1);
	json_num(f, "copy_pinned_vs_limit", cf->limit_ms / cf->ms[0], 1);
	json_num(f, "d2h_pinned_vs_pageable", pf->ms[1] / pf->ms[0], 1);
	json_num(f, "copy_pinned_vs_pageable", cf->ms[1] / cf->ms[0], 1);
	if (o)
		fprintf(f, "\"engine_pinned\":%s,\"engine_pageable\":%s,\"check\":%s}\n",
			o->pinned[0] ? "true" : "false", o->pinned[1] ? "false" : "true",
			o->cf.bad ? "false" : "true");
	else
		fputs("\"engine_pinned\":null,\"engine_pageable\":null,\"check\":null}\n", f);
	fflush(f);
}

/*
 * The run, in a child of the benchmark: wexd and the trainer (children of
 * its own, which die with it), the engine here.  Prints what it measured
 * and sends the figures to `out`; any failure exits non-zero (CHECK).
 */
static void run(struct wex_tensor *t, int out)
{
	static const char *const model[2] = { "staging-pinned", "staging-pageable" };
	struct wex_client_params p = { .field_mask = WEX_CLIENT_FIELD_ROLE | WEX_CLIENT_FIELD_MODEL,
				       .role = WEX_ROLE_CONSUMER };
	struct outcome o = { .dev = "" };
	struct figures *pf = &o.pf, *cf = &o.cf;
	struct gpu_world w;
	void *mine, *buf;

	gpu_world_start(&w, producer);

	mine = wex_cuda_alloc((ssize_t)total, 0, NULL);
	CHECK(mine != NULL);
	for (int i = 0; i < nt; i++)
		t[i].ptr = (char *)mine + t[i].offset;
	CHECK_OK(wex__cuda_use_device(0));
	CHECK_OK(wex__cuda_device_uuid(0, o.dev, sizeof(o.dev)));
	o.emulated = emulated();
	{
		char ch;

		get(w.from_prod, &ch, 1); /* the trainer measured its limit */
	}
	buf = pinned_buffer();
	cf->limit_ms = limit_ms((CUdeviceptr)(uintptr_t)mine, (CUdeviceptr)(uintptr_t)buf);
	free_pinned(buf);
	put(w.to_prod, "l", 1);
	for (int k = 0; k < 2; k++) {
		struct wex_sync_result r;
		wex_client_t *c;

		/* The pageable run: the engine does not pin either.  The
		 * pinned run allows pageable copies too (a device that cannot
		 * pin the read-only mapping would refuse them): whether it
		 * pinned is checked below and reported. */
		setenv("WEX_HOST_PIN", k == 1 ? "0" : "try", 1);
		p.model = model[k];
		CHECK_OK(wex_client_open(&p, &c));
		for (int v = 1; v <= reps + 1; v++) {
			double t0;
			char ch;

			get(w.from_prod, &ch, 1);
			if (v == 1)
				CHECK_OK(wex_attach(c, t, (size_t)nt));
			t0 = now_ms();
			CHECK_OK(wex_sync(c, WEX_SYNC_COPY, (uint64_t)v, 60000, &r));
			note(&cf->first_ms[k], &cf->ms[k], v, now_ms() - t0);
			CHECK(r.version == (uint64_t)v && r.bytes == total);
			CHECK_OK(wex__cuda_use_device(0));
			cf->bad += check(mine, t, (unsigned char)v);
			if (v == 1) {
				/* Did the engine's mapping get pinned?  A view of the
				 * same version shows where it is. */
				void *hv;

				CHECK_OK(wex_sync(c, WEX_SYNC_REMAP_VIEW, (uint64_t)v, 60000, &r));
				CHECK_OK(wex_view(c, 0, t[0].name, &hv, NULL));
				CHECK_OK(wex__cuda_use_device(0));
				o.pinned[k] = host_registered(hv, NULL);
				CHECK_OK(wex_release(c));
			}
			put(w.to_prod, "c", 1);
		}
		wex_client_close(c);
		unsetenv("WEX_HOST_PIN");
	}
	get(w.from_prod, pf, sizeof(*pf));
	gpu_world_stop(&w);
	wex_cuda_free(mine, (ssize_t)total, 0, NULL);

	if (o.emulated)
		printf("  emulated driver (tests/gpu/emul_cuda.c): the figures below are the CPU's, "
		       "not a GPU's\n");
	printf("  trainer GPU -> host segment + publish:  pinned %.1f ms (%.1f GB/s), pageable %.1f ms; "
	       "limit (one copy into a pinned buffer) %.1f ms (%.1f GB/s): %.2fx of the limit\n",
	       pf->ms[0], total / pf->ms[0] / 1e6, pf->ms[1], pf->limit_ms, total / pf->limit_ms / 1e6,
	       pf->limit_ms / pf->ms[0]);
	printf("  engine copy sync host segment -> GPU:   pinned %.1f ms (%.1f GB/s; first %.1f ms with "
	       "import and pinning), pageable %.1f ms; limit %.1f ms (%.1f GB/s): %.2fx of the limit, "
	       "%.2fx faster than pageable\n",
	       cf->ms[0], total / cf->ms[0] / 1e6, cf->first_ms[0], cf->ms[1], cf->limit_ms,
	       total / cf->limit_ms / 1e6, cf->limit_ms / cf->ms[0], cf->ms[1] / cf->ms[0]);
	printf("  check: %zu of %d tensor samples wrong; the engine's mapping was %s in the pinned "
	       "run and %s in the pageable one\n", cf->bad, nt * 3 * 2 * (reps + 1),
	       o.pinned[0] ? "pinned" : "NOT pinned (see the log: the pinned figures are pageable ones)",
	       o.pinned[1] ? "pinned (WEX_HOST_PIN=0 was ignored)" : "pageable");
	put(out, &o, sizeof(o));
}

/* The line a SIGTERM/SIGINT leaves (bench_term_arm): the run goes, its
 * wexd and trainer with it. */
static void print_term(FILE *f, void *arg)
{
	(void)arg;
	print_json(f, NULL, "terminated by a signal before the end");
}

int main(void)
{
	double gb = env_num("WEX_BENCH_GB", 4), budget = env_num("WEX_BENCH_BUDGET_S", 240), end;
	struct outcome o;
	struct wex_tensor *t;
	char why[512], err[640];
	pid_t pid;
	int fd, st = 0, got = 0, killed = 0;
	sigset_t term;

	/* Line by line: what was printed before a kill is in the log, and
	 * nothing is left in the buffer a child inherits. */
	setvbuf(stdout, NULL, _IOLBF, 0);
	nt = (int)env_num("WEX_BENCH_TENSORS", 300);
	reps = (int)env_num("WEX_BENCH_REPS", 3);
	if (nt < 1 || reps < 1 || !(gb > 0)) {
		fprintf(stderr, "host_staging: WEX_BENCH_GB, WEX_BENCH_TENSORS and WEX_BENCH_REPS must be positive\n");
		print_json(stdout, NULL,
			   "WEX_BENCH_GB, WEX_BENCH_TENSORS and WEX_BENCH_REPS must be positive");
		return T_EXIT_FAIL;
	}
	rows = (uint64_t)(gb * 1e9 / nt / (COLS * 2));
	if (rows == 0)
		rows = 1;
	t = calloc((size_t)nt, sizeof(*t));
	if (!t) {
		print_json(stdout, NULL, "out of memory");
		return T_EXIT_FAIL;
	}
	total = gpu_bf16_tensors(t, nt, rows, COLS, 0);
	if (gpu_probe(why, sizeof(why))) {
		printf("SKIP: %s\n", why);
		snprintf(err, sizeof(err), "skipped: %s", why);
		print_json(stdout, NULL, err);
		free(t);
		return T_EXIT_SKIP;
	}
	bench_term_arm(print_term, NULL);
	printf("host_staging: %.2f GiB in %d bf16 tensors, %d timed versions per segment kind; "
	       "budget %.0f s\n", (double)total / (1ull << 30), nt, reps, budget);
	pid = bench_fork_run(&fd);
	if (pid < 0) {
		fprintf(stderr, "host_staging: %m\n");
		print_json(stdout, NULL, "cannot start the run (pipe or fork failed)");
		free(t);
		return T_EXIT_FAIL;
	}
	if (pid == 0) {
		run(t, fd);
		_exit(0);
	}
	/* The figures (a few hundred bytes: the pipe holds them) come just
	 * before the run exits; past the budget it is killed, and wexd and
	 * the trainer with it (PR_SET_PDEATHSIG). */
	end = now_ms() + budget * 1e3;
	for (;;) {
		pid_t w = waitpid(pid, &st, WNOHANG);

		if (w == pid)
			break;
		if (w < 0 && errno != EINTR) {
			fprintf(stderr, "host_staging: waitpid: %m\n");
			st = 0x7f00; /* "exit 127" */
			break;
		}
		if (now_ms() > end) {
			fprintf(stderr, "host_staging: still running after %.0f s (WEX_BENCH_BUDGET_S): killed\n",
				budget);
			kill(pid, SIGKILL);
			while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
				;
			killed = 1;
			break;
		}
		usleep(10000);
	}
	if (!killed && WIFEXITED(st) && WEXITSTATUS(st) == 0)
		got = read(fd, &o, sizeof(o)) == (ssize_t)sizeof(o);
	close(fd);
	free(t);
	if (!got) {
		if (killed)
			snprintf(err, sizeof(err), "the run was killed after %.0f s (WEX_BENCH_BUDGET_S)",
				 budget);
		else
			snprintf(err, sizeof(err), "the run failed (%s %d, see above)",
				 WIFEXITED(st) ? "exit" : "signal",
				 WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
	}
	/* Exactly one JSON line: a signal from here on waits until it is
	 * out, and then ends us as it would have (no second line). */
	bench_hold_term(&term);
	if (!got)
		print_json(stdout, NULL, err);
	else
		print_json(stdout, &o, o.cf.bad ? "tensors lacked their bytes after a copy sync" :
				       o.pinned[1] ? "the pageable run's mapping was pinned (WEX_HOST_PIN=0 ignored)" :
				       NULL);
	sigprocmask(SIG_UNBLOCK, &term, NULL);
	return !got || o.cf.bad || o.pinned[1] ? T_EXIT_FAIL : T_EXIT_PASS;
}
