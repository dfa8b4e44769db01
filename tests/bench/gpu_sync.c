/* SPDX-License-Identifier: MIT */
/*
 * gpu_sync.c - colocated ("common card") sync on one GPU: remap latency and
 * in-place copy bandwidth of the cuda_vmm backend against the device's
 * device-to-device copy limit measured in the same run, and against
 * PyTorch CUDA IPC (tests/bench/gpu_sync_torch.py, SGLang's
 * update_weights_from_tensor path) when torch with CUDA is available.
 *
 * It drives the backend ops directly across two processes (fork +
 * socketpair with SCM_RIGHTS), not through wexd: the daemon never touches
 * weight bytes, so what is measured is exactly what a consumer's wex_sync
 * executes.
 *
 *   producer  allocates the weights (WEX_BENCH_GB of bf16 in
 *             WEX_BENCH_TENSORS tensors of varied sizes, packed into
 *             cuda_vmm segments of up to WEX_BENCH_SEG_MB), fills every
 *             tensor with its own byte and exports them;
 *   consumer  imports them (import_ms: the remap "view" mode), reserves
 *             same-address regions laid out like the segments (its own
 *             weights), then measures, each from the first call to the
 *             end of the GPU's work (wall clock, after a synchronisation):
 *               d2d      one cuMemcpyAsync per segment, imported -> own
 *                        (the limit: same bytes, fewest calls);
 *               copy     the copy slot with one op per tensor (wex's
 *                        in-place copy), in cuMemcpyBatchAsync
 *                        batches where the driver has them;
 *               copy_unbatched  the same with batching off (what
 *                        WEX_CUDA_BATCH=0 does: one cuMemcpyAsync per
 *                        op), so that one run tells which is faster;
 *               verify   every byte the copy wrote compared with the
 *                        producer's (WEX_SYNC_VERIFY's comparison, both
 *                        sides brought to the host by the copy slot,
 *                        compared there over verify_threads threads:
 *                        libwex's default, the processors up to 8, or
 *                        WEX_BENCH_VERIFY_THREADS); it must find them
 *                        equal;
 *               remap    map_fixed of every region (same-address remap:
 *                        the producer's memory under the engine's
 *                        addresses; remap_ms) and unmap_fixed back
 *                        (unmap_fixed_ms, copies the bytes).
 * Each phase runs WEX_BENCH_REPS (3) + 1 times: the first (warm-up) is
 * reported as *_first_ms, the figure is the best of the others.  Before
 * each run the consumer's buffers are zeroed, after it the first, middle
 * and last 64 bytes of every tensor are checked ("check"; both untimed).  remap_cold_ms
 * (import + first remap) is what the first remap sync of a layout waits
 * for; wexd's request round trip (~0.1 ms) is in neither.
 * The last line is one JSON object, with every key, whatever happened
 * (without a GPU, after a failed process, when terminated: the figures
 * null, "error" saying why; "emulated" true where the driver is the
 * emulated one, tests/gpu/emul_cuda.c, whose figures are the CPU's (the
 * text says so too and judges no target on them), null where nothing ran; "torch_check" only where the torch helper
 * reported one, "error" only where something went wrong); ratios: copy_vs_d2d = copy GB/s / d2d
 * GB/s; *_vs_torch_* = torch sync time / wex time (above 1: wex is
 * faster).  The torch figures include what a torch sync does every time
 * (reduce_tensor, cudaIpcOpenMemHandle), the wex copy and remap figures
 * not the import, done once per layout (import_ms, remap_cold_ms).
 * "torch_baseline" says whether the PyTorch figures were measured
 * (partial: per tensor only, the bucket phase failed); when not (skipped:
 * WEX_BENCH_TORCH=0; unavailable: no python3, torch or CUDA in torch;
 * failed; not run: the run was skipped or failed before its turn), they
 * and their ratios are null and "torch_reason" says why.
 * The torch baseline runs even when the wex part failed.  Exit status 1
 * when a check failed, a process failed or the torch baseline failed (or
 * was unavailable, with WEX_BENCH_TORCH_REQUIRED=1); the whole run keeps
 * within WEX_BENCH_BUDGET_S (240) seconds, the torch helper being told
 * its share (WEX_BENCH_TORCH_S) and killed (reported failed) past it.
 * Without a GPU it prints the reason and exits 77.
 */
#include <math.h>
#include <poll.h>
#include <time.h>

#include "tests/gpu/gpu_util.h"
#include "tests/bench/bench_util.h"
#include "src/verify.h"

#ifndef WEX_SOURCE_DIR
#define WEX_SOURCE_DIR "."
#endif

enum { OP_SEG = 1, OP_DONE };

struct layout {
	size_t n, nseg;
	uint64_t *off;   /* tensor offset in its segment */
	uint64_t *bytes; /* tensor size */
	uint32_t *seg;   /* its segment */
	uint64_t *segsz; /* used bytes per segment */
	uint64_t total;
};

/* Consumer -> parent.  *_first_ms: the warm-up; the others: best of reps. */
struct result {
	double import_ms, copy_ms, d2d_ms, remap_ms, unmap_fixed_ms, copy_unbatched_ms;
	double copy_first_ms, d2d_first_ms, remap_first_ms, unmap_fixed_first_ms;
	double copy_unbatched_first_ms, verify_ms, verify_first_ms;
	uint64_t bytes;
	size_t bad; /* tensor checks that failed */
	int emulated; /* the emulated driver: the figures are the CPU's */
	char device[WEX_UUID_LEN];
};

/* Tensor sizes vary between 0.25x and 1.75x the mean (gpu_sync_torch.py
 * uses the same generator). */
static void make_layout(struct layout *L, double gb, size_t n, uint64_t segmax)
{
	uint64_t avg = (uint64_t)(gb * (double)(1ull << 30)) / 2 / n, cur = 0;

	L->n = n;
	L->off = calloc(n, sizeof(uint64_t));
	L->bytes = calloc(n, sizeof(uint64_t));
	L->seg = calloc(n, sizeof(uint32_t));
	L->segsz = calloc(n + 1, sizeof(uint64_t));
	CHECK(L->off && L->bytes && L->seg && L->segsz);
	L->nseg = 0;
	for (size_t i = 0; i < n; i++) {
		uint32_t frac = (uint32_t)((uint64_t)i * 2654435761u) % 1000;
		uint64_t e = avg * (500 + 3 * (uint64_t)frac) / 2000 & ~(uint64_t)127;

		if (e < 128)
			e = 128;
		L->bytes[i] = e * 2;
		if (cur && cur + L->bytes[i] > segmax) {
			L->segsz[L->nseg++] = cur;
			cur = 0;
		}
		L->off[i] = cur;
		L->seg[i] = (uint32_t)L->nseg;
		cur += (L->bytes[i] + 255) & ~(uint64_t)255;
		L->total += L->bytes[i];
	}
	L->segsz[L->nseg++] = cur;
}

static struct layout L;
static int reps;
/* Threads of the verify phase's comparison: libwex's default copy_threads
 * (the processors, at most 8), or WEX_BENCH_VERIFY_THREADS. */
static int vthreads = 1;

/* The byte tensor i holds: never 0 (the consumer's buffers are zeroed
 * before each phase), neighbours differ (a copy to the wrong place shows). */
static unsigned char tval(size_t i)
{
	return (unsigned char)(1 + i % 251);
}

/* Child side of fork(): dies with the parent, so that a killed benchmark
 * leaves no process holding GPU memory. */
static void child_init(pid_t parent)
{
	/* Not the parent's handler: one JSON line, from the parent. */
	signal(SIGTERM, SIG_DFL);
	signal(SIGINT, SIG_DFL);
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	if (getppid() != parent)
		_exit(T_EXIT_FAIL);
}

static void producer(int sock)
{
	const struct wex_mem_ops *vmm = wex_mem_backend(WEX_MEM_CUDA_VMM);
	struct wex_mem_seg *s = calloc(L.nseg, sizeof(*s));

	CHECK(s);
	CHECK_OK(wex__cuda_use_device(0));
	/* The weights twice (ours and the consumer's), 1 GiB to spare. */
	if (mem_free() < 2 * L.total + (1ull << 30)) {
		fprintf(stderr, "gpu_sync: %.1f GiB of device memory free, the run needs %.1f GiB "
			"(lower WEX_BENCH_GB)\n", (double)mem_free() / (1ull << 30),
			(double)(2 * L.total + (1ull << 30)) / (1ull << 30));
		exit(T_EXIT_FAIL);
	}
	for (size_t k = 0; k < L.nseg; k++)
		CHECK_OK(vmm->alloc(L.segsz[k], 0, &s[k]));
	for (size_t i = 0; i < L.n; i++)
		CU_OK(wex__cu.cuMemsetD8Async((CUdeviceptr)(uintptr_t)s[L.seg[i]].ptr + L.off[i],
					      tval(i), L.bytes[i], NULL));
	CU_OK(wex__cu.cuCtxSynchronize());
	for (size_t k = 0; k < L.nseg; k++)
		tsend(sock, OP_SEG, &s[k].desc, k, s[k].fd);
	trecv(sock, OP_DONE, NULL);
	for (size_t k = 0; k < L.nseg; k++)
		CHECK_OK(vmm->release(&s[k]));
	free(s);
}

/*
 * Checks the first, middle and last 64 bytes of every tensor, segment k
 * being at base[k]: the number of tensors without their producer's bytes
 * (the first is named).  Untimed.
 */
static size_t check_tensors(const uint64_t *base, const char *what)
{
	unsigned char b[64];
	size_t bad = 0;

	for (size_t i = 0; i < L.n; i++) {
		uint64_t at[3] = { 0, L.bytes[i] / 2 & ~(uint64_t)63, L.bytes[i] - sizeof(b) };
		int ok = 1;

		for (int j = 0; j < 3; j++) {
			uint64_t a = base[L.seg[i]] + L.off[i] + at[j];

			CU_OK(wex__cu.cuMemcpyDtoH(b, (CUdeviceptr)a, sizeof(b)));
			for (size_t k = 0; k < sizeof(b); k++)
				ok &= b[k] == tval(i);
		}
		if (!ok && !bad++)
			fprintf(stderr, "%s: tensor %zu (segment %u, offset %llu) lacks its bytes (%#x)\n",
				what, i, L.seg[i], (unsigned long long)L.off[i], tval(i));
	}
	return bad;
}

/* The consumer's own memory under every region to 0 (untimed). */
static void zero_regions(const struct wex_mem_region *r, CUstream st)
{
	for (size_t k = 0; k < L.nseg; k++)
		CU_OK(wex__cu.cuMemsetD8Async((CUdeviceptr)(uintptr_t)r[k].addr, 0, r[k].size, st));
	CU_OK(wex__cu.cuStreamSynchronize(st));
}

/* Iteration i of a phase took ms: the first (warm-up) apart, the best of
 * the others. */
static void note(double *first, double *best, int i, double ms)
{
	if (i == 0)
		*first = ms;
	else
		*best = fmin(*best, ms);
}

static void consumer(int sock, int out)
{
	const struct wex_mem_ops *vmm = wex_mem_backend(WEX_MEM_CUDA_VMM);
	struct wex_mem_seg *s = calloc(L.nseg, sizeof(*s));
	struct wex_mem_region *r = calloc(L.nseg, sizeof(*r));
	struct wex_copy_op *ops = calloc(L.n, sizeof(*ops));
	uint64_t *src = calloc(L.nseg, sizeof(*src)), *dst = calloc(L.nseg, sizeof(*dst));
	struct result res = { .bytes = L.total };
	CUstream st;
	double t;
	int batched;

	CHECK(s && r && ops && src && dst);
	res.import_ms = 0;
	for (size_t k = 0; k < L.nseg; k++) {
		int fd;
		struct tmsg m = trecv(sock, OP_SEG, &fd);

		CHECK(m.a < L.nseg);
		t = now_ms();
		CHECK_OK(vmm->import(&m.desc, fd, -1, &s[m.a]));
		res.import_ms += now_ms() - t;
	}
	memcpy(res.device, s[0].desc.device, sizeof(res.device));
	res.emulated = emulated();
	for (size_t k = 0; k < L.nseg; k++) {
		CHECK_OK(vmm->reserve(s[k].desc.alloc_size, 0, 0, &r[k]));
		src[k] = (uint64_t)(uintptr_t)s[k].ptr;
		dst[k] = (uint64_t)(uintptr_t)r[k].addr;
	}
	CU_OK(wex__cu.cuStreamCreate(&st, CU_STREAM_NON_BLOCKING));
	res.bad += check_tensors(src, "imported");

	/* The limit: the same bytes in one copy per segment.  Every run's
	 * bytes are checked (untimed), as in each phase below: a run that
	 * moved nothing must not post the best time. */
	res.d2d_ms = INFINITY;
	for (int i = 0; i <= reps; i++) {
		zero_regions(r, st);
		t = now_ms();
		for (size_t k = 0; k < L.nseg; k++)
			CU_OK(wex__cu.cuMemcpyAsync((CUdeviceptr)dst[k], (CUdeviceptr)src[k],
						    L.segsz[k], st));
		CU_OK(wex__cu.cuStreamSynchronize(st));
		note(&res.d2d_first_ms, &res.d2d_ms, i, now_ms() - t);
		res.bad += check_tensors(dst, "d2d");
	}

	/* wex in-place copy: one op per tensor, into the engine's buffers;
	 * the copy slot returns once the GPU has finished. */
	for (size_t i = 0; i < L.n; i++)
		ops[i] = (struct wex_copy_op){
			.src = src[L.seg[i]] + L.off[i],
			.dst = dst[L.seg[i]] + L.off[i],
			.len = L.bytes[i],
		};
	res.copy_ms = INFINITY;
	for (int i = 0; i <= reps; i++) {
		zero_regions(r, st);
		t = now_ms();
		CHECK_OK(vmm->copy(ops, L.n, 1));
		note(&res.copy_first_ms, &res.copy_ms, i, now_ms() - t);
		res.bad += check_tensors(dst, "copy");
	}
	batched = wex__cuda_copy_batch(0);
	res.copy_unbatched_ms = INFINITY;
	for (int i = 0; i <= reps; i++) {
		zero_regions(r, st);
		t = now_ms();
		CHECK_OK(vmm->copy(ops, L.n, 1));
		note(&res.copy_unbatched_first_ms, &res.copy_unbatched_ms, i, now_ms() - t);
		res.bad += check_tensors(dst, "copy_unbatched");
	}
	wex__cuda_copy_batch(batched); /* as WEX_CUDA_BATCH set it */

	/* Verification of what the last copy wrote (untimed zeroing would
	 * undo it: the buffers hold the copy). */
	res.verify_ms = INFINITY;
	for (int i = 0; i <= reps; i++) {
		struct wex_verify_diff diff;
		int vr;

		t = now_ms();
		vr = wex__verify_ops(ops, L.n, vmm, vthreads, &diff);
		note(&res.verify_first_ms, &res.verify_ms, i, now_ms() - t);
		if (vr != 0) {
			fprintf(stderr, "gpu_sync: verify found %s (%d: op %zu, byte %llu, %llu bytes)\n",
				vr < 0 ? "an error" : "a difference", vr, diff.op,
				(unsigned long long)diff.dst_off, (unsigned long long)diff.bytes);
			res.bad++;
		}
	}

	/* Same-address remap of every region, and back; the regions' own
	 * memory is zeroed first, so each check tells which one shows. */
	res.remap_ms = res.unmap_fixed_ms = INFINITY;
	for (int i = 0; i <= reps; i++) {
		zero_regions(r, st);
		t = now_ms();
		for (size_t k = 0; k < L.nseg; k++)
			CHECK_OK(vmm->map_fixed(&r[k], &s[k], 0));
		note(&res.remap_first_ms, &res.remap_ms, i, now_ms() - t);
		res.bad += check_tensors(dst, "remap");
		t = now_ms();
		for (size_t k = 0; k < L.nseg; k++)
			CHECK_OK(vmm->unmap_fixed(&r[k]));
		note(&res.unmap_fixed_first_ms, &res.unmap_fixed_ms, i, now_ms() - t);
		res.bad += check_tensors(dst, "unmap_fixed");
	}
	for (size_t k = 0; k < L.nseg; k++) {
		CHECK_OK(vmm->unreserve(&r[k]));
		CHECK_OK(vmm->release(&s[k]));
	}
	CU_OK(wex__cu.cuStreamDestroy(st));
	tsend(sock, OP_DONE, NULL, 0, -1);
	CHECK(write(out, &res, sizeof(res)) == (ssize_t)sizeof(res));
	free(s);
	free(r);
	free(ops);
	free(src);
	free(dst);
}

/*
 * Waits up to `secs` for the producer and the consumer; when one fails or
 * time runs out, the other is killed.  0 when both exited 0.
 */
static int wait_pair(pid_t pp, pid_t pc, double secs)
{
	const char *name[2] = { "producer", "consumer" };
	pid_t pid[2] = { pp, pc };
	double end = now_ms() + secs * 1e3;
	int left = 2, ret = 0;

	while (left) {
		int progress = 0;

		for (int k = 0; k < 2; k++) {
			pid_t w;
			int st = 0;

			if (pid[k] <= 0)
				continue;
			w = waitpid(pid[k], &st, WNOHANG);
			if (w == 0 || (w < 0 && errno == EINTR))
				continue;
			if (w < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
				if (w > 0)
					fprintf(stderr, "%s: %s %d\n", name[k],
						WIFEXITED(st) ? "exit" : "signal",
						WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
				if (pid[!k] > 0)
					kill(pid[!k], SIGKILL);
				ret = -1;
			}
			pid[k] = 0;
			left--;
			progress = 1;
		}
		if (left && !progress && now_ms() > end && !ret) {
			fprintf(stderr, "gpu_sync: producer and consumer still running after %.0f s: killed\n",
				secs);
			for (int k = 0; k < 2; k++)
				if (pid[k] > 0)
					kill(pid[k], SIGKILL);
			ret = -1;
		}
		if (left && !progress)
			usleep(10000);
	}
	return ret;
}

/* ---------------------------------------------------------------------- */
/* The PyTorch baseline: tests/bench/gpu_sync_torch.py, run once the C     */
/* processes have exited (their GPU memory is free again).                */

enum { TORCH_MEASURED, TORCH_PARTIAL, TORCH_SKIPPED, TORCH_UNAVAILABLE, TORCH_FAILED,
       TORCH_NOT_RUN };
/* partial: the per-tensor figures were measured, the bucket ones not;
 * not run: the run ended (skipped, failed) before the baseline's turn. */
static const char *const torch_state[] = { "measured", "partial", "skipped", "unavailable",
					   "failed", "not run" };

struct torch {
	double per_tensor, bucket, per_tensor_first, bucket_first; /* NAN: none */
	int check; /* torch_check: -1 absent, 0 false, 1 true */
	int state;
	char reason[512];
};


/* Position just after `"key":` in a one-line JSON object, or NULL. */
static const char *json_at(const char *line, const char *key)
{
	char pat[96];
	const char *p;

	snprintf(pat, sizeof(pat), "\"%s\"", key);
	if (!(p = strstr(line, pat)))
		return NULL;
	p += strlen(pat);
	p += strspn(p, " \t");
	if (*p++ != ':')
		return NULL;
	return p + strspn(p, " \t");
}

/* A finite number (true: 1, false: 0) for key, else NAN (null, absent). */
static double json_num_of(const char *line, const char *key)
{
	const char *p = json_at(line, key);
	char *end;
	double v;

	if (!p)
		return NAN;
	if (!strncmp(p, "true", 4))
		return 1;
	if (!strncmp(p, "false", 5))
		return 0;
	v = strtod(p, &end);
	return end != p && isfinite(v) ? v : NAN;
}

/* The string value of key, escapes and quotes made spaces (it goes into
 * our own JSON as it is); "" when absent. */
static void json_str_of(const char *line, const char *key, char *out, size_t len)
{
	const char *p = json_at(line, key);
	size_t k = 0;

	if (p && *p == '"')
		for (p++; *p && *p != '"' && k + 1 < len; p++) {
			int esc = *p == '\\' && p[1];

			p += esc;
			out[k++] = esc || *p == '\\' || (unsigned char)*p < 0x20 ? ' ' : *p;
		}
	out[k] = '\0';
}

/* A line of the helper's output: the last JSON object is kept, the rest
 * goes to stderr. */
static void torch_line(const char *line, char *last, size_t len)
{
	if (line[0] == '{')
		snprintf(last, len, "%s", line);
	else
		fprintf(stderr, "torch: %s\n", line);
}

/*
 * Runs the helper in a process group of its own (its spawn producer
 * included), killed whole when `secs` run out or we are terminated, and
 * fills *T from its JSON line.
 */
static void run_torch(struct torch *T, double secs)
{
	const char *src = getenv("WEX_SRC");
	char script[1024], buf[16384], last[16384] = "";
	double end = now_ms() + secs * 1e3;
	int p[2], st = 0, eof = 0, timed_out = 0;
	size_t len = 0;
	pid_t pid, parent = getpid();

	*T = (struct torch){ .per_tensor = NAN, .bucket = NAN, .per_tensor_first = NAN,
			     .bucket_first = NAN, .check = -1, .state = TORCH_FAILED };
	if (env_num("WEX_BENCH_TORCH", 1) == 0) {
		T->state = TORCH_SKIPPED;
		snprintf(T->reason, sizeof(T->reason), "WEX_BENCH_TORCH=0");
		return;
	}
	if (secs < 30) {
		snprintf(T->reason, sizeof(T->reason),
			 "not run: %.0f s left of WEX_BENCH_BUDGET_S", secs);
		return;
	}
	snprintf(script, sizeof(script), "%s/tests/bench/gpu_sync_torch.py",
		 src && *src ? src : WEX_SOURCE_DIR);
	printf("torch baseline: python3 %s (up to %.0f s)\n", script, secs);
	fflush(stdout);
	CHECK(pipe(p) == 0);
	pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		char lim[32];

		setpgid(0, 0);
		child_init(parent);
		/* Its own limit, inside ours: it reports what it measured
		 * before we would have to kill it. */
		snprintf(lim, sizeof(lim), "%.0f", secs - 10);
		setenv("WEX_BENCH_TORCH_S", lim, 1);
		dup2(p[1], 1);
		dup2(p[1], 2);
		close(p[0]);
		close(p[1]);
		execlp("python3", "python3", "-u", script, (char *)NULL);
		fprintf(stderr, "cannot run python3: %s\n", strerror(errno));
		_exit(127);
	}
	setpgid(pid, pid);
	bench_term_kill = -pid; /* the python process group, killed with us */
	close(p[1]);
	while (!eof) {
		struct pollfd pf = { .fd = p[0], .events = POLLIN };
		double left = end - now_ms();
		char *nl;
		ssize_t n;

		if (left <= 0) {
			timed_out = 1;
			break;
		}
		if (poll(&pf, 1, left > 1000 ? 1000 : (int)left + 1) <= 0)
			continue;
		n = read(p[0], buf + len, sizeof(buf) - 1 - len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			eof = 1;
		else
			len += (size_t)n;
		while ((nl = memchr(buf, '\n', len))) {
			*nl = '\0';
			torch_line(buf, last, sizeof(last));
			len -= (size_t)(nl + 1 - buf);
			memmove(buf, nl + 1, len);
		}
		if (len == sizeof(buf) - 1 || (eof && len)) {
			buf[len] = '\0';
			torch_line(buf, last, sizeof(last));
			len = 0;
		}
	}
	close(p[0]);
	/* Its output is closed: give it until the deadline to exit.  It is
	 * left unreaped (WNOWAIT) so that its group id cannot be reused
	 * before the kill below. */
	while (!timed_out) {
		siginfo_t si = { 0 };

		if (waitid(P_PID, (id_t)pid, &si, WEXITED | WNOHANG | WNOWAIT) == 0 && si.si_pid == pid)
			break;
		if (now_ms() > end)
			timed_out = 1;
		else
			usleep(10000);
	}
	/* The group goes whole: after a timeout everything, else whatever
	 * the helper left behind. */
	kill(-pid, SIGKILL);
	while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
		;
	bench_term_kill = 0;

	if (timed_out) {
		snprintf(T->reason, sizeof(T->reason),
			 "gpu_sync_torch.py still running after %.0f s: killed", secs);
		return;
	}
	if (!last[0]) {
		if (WIFEXITED(st) && WEXITSTATUS(st) == 127)
			T->state = TORCH_UNAVAILABLE;
		snprintf(T->reason, sizeof(T->reason), "gpu_sync_torch.py printed no result (%s %d)",
			 WIFEXITED(st) ? "exit" : "signal",
			 WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
		return;
	}
	T->per_tensor = json_num_of(last, "torch_ipc_per_tensor_ms");
	T->bucket = json_num_of(last, "torch_ipc_bucket_ms");
	T->per_tensor_first = json_num_of(last, "torch_ipc_per_tensor_first_ms");
	T->bucket_first = json_num_of(last, "torch_ipc_bucket_first_ms");
	if (!isnan(json_num_of(last, "torch_check")))
		T->check = json_num_of(last, "torch_check") != 0;
	json_str_of(last, "torch_reason", T->reason, sizeof(T->reason));
	/* The helper checks every sync and reports a phase's figures only
	 * when all its syncs delivered (torch_check false: one did not, and
	 * torch_reason says which). */
	if (!isnan(T->per_tensor) && !isnan(T->bucket) && T->check != 0) {
		T->state = TORCH_MEASURED;
	} else if (!isnan(T->per_tensor)) {
		T->state = TORCH_PARTIAL;
	} else if (!json_at(last, "torch_version")) {
		/* No torch, or torch without CUDA: the helper stopped before
		 * naming its version. */
		T->state = TORCH_UNAVAILABLE;
	}
	if (T->state != TORCH_MEASURED && !T->reason[0])
		snprintf(T->reason, sizeof(T->reason), "gpu_sync_torch.py gave no figure");
}

static void json_num(FILE *f, const char *key, double v, int comma)
{
	if (isnan(v) || isinf(v))
		fprintf(f, "\"%s\":null%s", key, comma ? "," : "");
	else
		fprintf(f, "\"%s\":%.4f%s", key, v, comma ? "," : "");
}

/* "yes"/"no" for a target, "n/a" when a figure is missing. */
static const char *met(double v, double limit, int above)
{
	if (!isfinite(v))
		return "n/a";
	return (above ? v >= limit : v < limit) ? "yes" : "no";
}

/*
 * The last line: one JSON object with every key, whatever happened, to f
 * (stdout; bench_on_term's line is made by it too).  res is NULL when the wex
 * part gave no figures (its keys are null then), T when the torch
 * baseline was not tried; error, when not NULL, says what went wrong.
 */
static void print_json(FILE *f, const struct result *res, const struct torch *T,
		       const char *error)
{
	static const struct result none = {
		.import_ms = NAN, .copy_ms = NAN, .d2d_ms = NAN, .remap_ms = NAN,
		.unmap_fixed_ms = NAN, .copy_first_ms = NAN, .d2d_first_ms = NAN,
		.remap_first_ms = NAN, .unmap_fixed_first_ms = NAN, .copy_unbatched_ms = NAN,
		.copy_unbatched_first_ms = NAN, .verify_ms = NAN, .verify_first_ms = NAN,
	};
	const struct torch no_torch = { .per_tensor = NAN, .bucket = NAN, .per_tensor_first = NAN,
					.bucket_first = NAN, .check = -1, .state = TORCH_NOT_RUN,
					.reason = "not run" };
	const struct result *r = res ? res : &none;
	double gbs = (double)L.total / 1e9;

	if (!T)
		T = &no_torch;
	fprintf(f, "{\"bench\":\"gpu_sync\",\"path\":\"cuda_vmm backend ops, 2 processes, fork+socketpair\","
	       "\"device\":\"%s\",\"emulated\":%s,\"bytes\":%llu,\"tensors\":%zu,\"segments\":%zu,"
	       "\"reps\":%d,\"check\":%s,",
	       res ? res->device : "", !res ? "null" : res->emulated ? "true" : "false",
	       (unsigned long long)L.total, L.n, L.nseg, reps,
	       !res ? "null" : res->bad ? "false" : "true");
	if (error)
		fprintf(f, "\"error\":\"%s\",", error);
	json_num(f, "import_ms", r->import_ms, 1);
	json_num(f, "remap_ms", r->remap_ms, 1);
	json_num(f, "remap_first_ms", r->remap_first_ms, 1);
	json_num(f, "remap_cold_ms", r->import_ms + r->remap_first_ms, 1);
	json_num(f, "unmap_fixed_ms", r->unmap_fixed_ms, 1);
	json_num(f, "unmap_fixed_first_ms", r->unmap_fixed_first_ms, 1);
	json_num(f, "copy_ms", r->copy_ms, 1);
	json_num(f, "copy_first_ms", r->copy_first_ms, 1);
	json_num(f, "d2d_ms", r->d2d_ms, 1);
	json_num(f, "d2d_first_ms", r->d2d_first_ms, 1);
	json_num(f, "copy_gbps", gbs / (r->copy_ms / 1e3), 1);
	json_num(f, "d2d_gbps", gbs / (r->d2d_ms / 1e3), 1);
	json_num(f, "copy_vs_d2d", r->d2d_ms / r->copy_ms, 1);
	json_num(f, "copy_unbatched_ms", r->copy_unbatched_ms, 1);
	json_num(f, "copy_unbatched_first_ms", r->copy_unbatched_first_ms, 1);
	json_num(f, "copy_unbatched_vs_d2d", r->d2d_ms / r->copy_unbatched_ms, 1);
	json_num(f, "verify_ms", r->verify_ms, 1);
	json_num(f, "verify_first_ms", r->verify_first_ms, 1);
	json_num(f, "verify_gbps", gbs / (r->verify_ms / 1e3), 1);
	json_num(f, "verify_vs_d2d", r->d2d_ms / r->verify_ms, 1);
	fprintf(f, "\"verify_threads\":%d,", vthreads);
	fprintf(f, "\"torch_baseline\":\"%s\",", torch_state[T->state]);
	json_num(f, "torch_ipc_per_tensor_ms", T->per_tensor, 1);
	json_num(f, "torch_ipc_per_tensor_first_ms", T->per_tensor_first, 1);
	json_num(f, "torch_ipc_bucket_ms", T->bucket, 1);
	json_num(f, "torch_ipc_bucket_first_ms", T->bucket_first, 1);
	if (T->check >= 0)
		fprintf(f, "\"torch_check\":%s,", T->check ? "true" : "false");
	json_num(f, "copy_vs_torch_ipc_per_tensor", T->per_tensor / r->copy_ms, 1);
	json_num(f, "remap_vs_torch_ipc_per_tensor", T->per_tensor / r->remap_ms, 1);
	json_num(f, "copy_vs_torch_ipc_bucket", T->bucket / r->copy_ms, 1);
	json_num(f, "remap_vs_torch_ipc_bucket", T->bucket / r->remap_ms, T->reason[0] != '\0');
	if (T->reason[0])
		fprintf(f, "\"torch_reason\":\"%s\"", T->reason);
	fprintf(f, "}\n");
	fflush(f);
}

/* The line a SIGTERM/SIGINT (a step's timeout) leaves (bench_term_arm):
 * the python group goes too, and the figures are null. */
static void print_term(FILE *f, void *arg)
{
	const struct torch none = { .per_tensor = NAN, .bucket = NAN, .per_tensor_first = NAN,
				    .bucket_first = NAN, .check = -1, .state = TORCH_FAILED,
				    .reason = "not finished: terminated by a signal" };

	(void)arg;
	print_json(f, NULL, &none, "terminated by a signal before the end");
}

/* The last line, once: a signal from here on waits until it is out, then
 * ends us as it would have (bench_on_term's line would be a second one). */
static void last_line(const struct result *res, const struct torch *T, const char *error)
{
	sigset_t term;

	bench_hold_term(&term);
	print_json(stdout, res, T, error);
	sigprocmask(SIG_UNBLOCK, &term, NULL);
}

int main(void)
{
	double t0 = now_ms(), budget = env_num("WEX_BENCH_BUDGET_S", 240), gb, gbs, cvd;
	size_t n = (size_t)env_num("WEX_BENCH_TENSORS", 300);
	uint64_t segmax = (uint64_t)env_num("WEX_BENCH_SEG_MB", 1024) << 20;
	struct result res;
	struct torch T;
	char why[512], err[640];
	int sv[2], pf[2], ret = 0, fail;
	pid_t pp, pc, self = getpid();

	/* Line by line: what was printed before a kill is in the log. */
	setvbuf(stdout, NULL, _IOLBF, 0);
	gb = env_num("WEX_BENCH_GB", 16);
	reps = (int)env_num("WEX_BENCH_REPS", 3);
	{
		long cpus = sysconf(_SC_NPROCESSORS_ONLN);

		vthreads = (int)env_num("WEX_BENCH_VERIFY_THREADS",
					cpus > 8 ? 8 : cpus < 1 ? 1 : (double)cpus);
		if (vthreads < 1)
			vthreads = 1;
	}
	if (reps < 1)
		reps = 1;
	if (n == 0 || gb <= 0 || segmax == 0) {
		fprintf(stderr, "bad WEX_BENCH_GB / WEX_BENCH_TENSORS / WEX_BENCH_SEG_MB\n");
		print_json(stdout, NULL, NULL, "bad WEX_BENCH_GB / WEX_BENCH_TENSORS / WEX_BENCH_SEG_MB");
		return T_EXIT_FAIL;
	}
	make_layout(&L, gb, n, segmax);
	if (gpu_probe(why, sizeof(why))) {
		printf("SKIP: %s\n", why);
		snprintf(err, sizeof(err), "skipped: %s", why);
		for (char *c = err; *c; c++)
			if (*c == '"' || *c == '\\' || (unsigned char)*c < 0x20)
				*c = ' ';
		print_json(stdout, NULL, NULL, err);
		return T_EXIT_SKIP;
	}
	bench_term_arm(print_term, NULL);
	printf("gpu_sync: %.2f GiB in %zu bf16 tensors, %zu segments, %d reps + 1 warm-up; "
	       "budget %.0f s\n", (double)L.total / (1u << 30), L.n, L.nseg, reps, budget);
	pair(sv);
	CHECK(pipe(pf) == 0);
	pp = fork();
	CHECK(pp >= 0);
	if (pp == 0) {
		child_init(self);
		close(sv[1]);
		producer(sv[0]);
		_exit(0);
	}
	pc = fork();
	CHECK(pc >= 0);
	if (pc == 0) {
		child_init(self);
		close(sv[0]);
		consumer(sv[1], pf[1]);
		_exit(0);
	}
	close(sv[0]);
	close(sv[1]);
	close(pf[1]);
	/* The C part takes seconds; what is left of the budget after it goes
	 * to the torch baseline (run even when the C part failed: its
	 * figures are the baseline of the next run). */
	ret = wait_pair(pp, pc, budget - 30 > 30 ? budget - 30 : 30);
	if (!ret && read(pf[0], &res, sizeof(res)) != (ssize_t)sizeof(res))
		ret = -1;
	run_torch(&T, budget - (now_ms() - t0) / 1e3);
	if (T.state == TORCH_MEASURED || T.state == TORCH_PARTIAL)
		printf("torch CUDA IPC: per tensor %.2f ms (first %.2f), bucket %.2f ms (first %.2f)%s%s\n",
		       T.per_tensor, T.per_tensor_first, T.bucket, T.bucket_first,
		       T.reason[0] ? ": " : "", T.reason);
	else
		printf("torch CUDA IPC: %s: %s\n", torch_state[T.state], T.reason);
	if (ret) {
		last_line(NULL, &T, "a benchmark process failed (see above)");
		return T_EXIT_FAIL;
	}
	gbs = (double)res.bytes / 1e9;
	cvd = res.d2d_ms / res.copy_ms;
	if (res.emulated)
		printf("gpu_sync: emulated driver (tests/gpu/emul_cuda.c): the figures below are the "
		       "CPU's, not a GPU's\n");
	printf("import %.2f ms; remap %.2f ms (first %.2f); unmap_fixed %.2f ms (first %.2f)\n",
	       res.import_ms, res.remap_ms, res.remap_first_ms, res.unmap_fixed_ms,
	       res.unmap_fixed_first_ms);
	printf("copy %.2f ms (%.1f GB/s, first %.2f ms); d2d %.2f ms (%.1f GB/s, first %.2f ms)\n",
	       res.copy_ms, gbs / (res.copy_ms / 1e3), res.copy_first_ms, res.d2d_ms,
	       gbs / (res.d2d_ms / 1e3), res.d2d_first_ms);
	printf("copy unbatched (WEX_CUDA_BATCH=0) %.2f ms (%.1f GB/s, first %.2f ms, %.3f of d2d)\n",
	       res.copy_unbatched_ms, gbs / (res.copy_unbatched_ms / 1e3),
	       res.copy_unbatched_first_ms, res.d2d_ms / res.copy_unbatched_ms);
	printf("verify (every byte compared, via host, %d threads) %.2f ms (%.1f GB/s of weights, first %.2f ms, %.3f of d2d)\n",
	       vthreads, res.verify_ms, gbs / (res.verify_ms / 1e3), res.verify_first_ms,
	       res.d2d_ms / res.verify_ms);
	/* The emulated driver's figures are the CPU's: no target is judged
	 * on them (a log read for the targets line would take them for the
	 * GPU's). */
	if (res.emulated)
		printf("targets: not judged: the driver is the emulated one (tests/gpu/emul_cuda.c, "
		       "WEX_CUDA_LIB=%s), these are CPU figures; check %s\n",
		       getenv("WEX_CUDA_LIB") ? getenv("WEX_CUDA_LIB") : "", res.bad ? "FAILED" : "ok");
	else
		printf("targets: copy/d2d %.3f >= 0.85 %s; remap %.2f ms < 50 %s; vs torch per tensor: "
		       "copy %.1fx >= 10 %s, remap %.1fx >= 10 %s; check %s\n",
		       cvd, met(cvd, 0.85, 1), res.remap_ms, met(res.remap_ms, 50, 0),
		       T.per_tensor / res.copy_ms, met(T.per_tensor / res.copy_ms, 10, 1),
		       T.per_tensor / res.remap_ms, met(T.per_tensor / res.remap_ms, 10, 1),
		       res.bad ? "FAILED" : "ok");
	fail = res.bad || T.state == TORCH_FAILED || T.state == TORCH_PARTIAL ||
	       (T.state == TORCH_UNAVAILABLE && env_num("WEX_BENCH_TORCH_REQUIRED", 0) != 0);
	last_line(&res, &T, !fail ? NULL : res.bad ? "tensors lacked their bytes after a phase" :
			    T.state == TORCH_PARTIAL ? "the torch bucket baseline failed" :
			    T.state == TORCH_UNAVAILABLE ? "the torch baseline is unavailable here" :
							   "the torch baseline failed");
	return fail ? T_EXIT_FAIL : T_EXIT_PASS;
}
